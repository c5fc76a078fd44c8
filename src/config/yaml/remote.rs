//! The keys of SFTP and WebDAV replicas (Litestream's names, and replicad's host key keys),
//! as read from one replica map, and the SFTP settings built from them.

use crate::storage::s3::Secret;
use crate::storage::sftp::{HostKeyCheck, SftpConfig, split_host_port};

/// The SFTP and WebDAV keys of one replica map, as read.
#[derive(Default)]
pub(crate) struct RawOther {
    pub(crate) text: Vec<(&'static str, String)>,
    pub(crate) flags: Vec<(&'static str, bool)>,
    pub(crate) password: Option<Secret>,
    pub(crate) webdav_password: Option<Secret>,
}

impl RawOther {
    pub(crate) fn text(&self, key: &str) -> Option<&str> {
        self.text
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> Option<bool> {
        self.flags.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    /// The SFTP settings: from the URL (and `user`), or from `host` (`HOST[:PORT]`), `user`
    /// and `path`, then the authentication and host key keys.
    pub(crate) fn sftp(
        &self,
        from_url: Option<SftpConfig>,
        path: Option<&str>,
        seen: &[&str],
    ) -> Result<SftpConfig, String> {
        let mut cfg = match from_url {
            Some(mut cfg) => {
                // As Litestream: `user` completes or overrides the URL's; `host` and `path`
                // would contradict it.
                for k in ["path", "host"] {
                    if seen.contains(&k) {
                        return Err(format!("keys `url` and `{k}` are mutually exclusive"));
                    }
                }
                if let Some(user) = self.text("user") {
                    cfg.user = user.to_string();
                }
                cfg
            }
            None => {
                let (host, port) = split_host_port(self.text("host").unwrap_or_default())?;
                SftpConfig::new(
                    host,
                    port,
                    self.text("user").unwrap_or_default(),
                    path.unwrap_or_default(),
                )
            }
        };
        cfg.password = self.password.clone();
        cfg.key_path = self.text("key-path").map(|p| expand_tilde(p).into());
        if let Some(c) = self.flag("concurrent-writes") {
            cfg.concurrent_writes = c;
        }
        let skip = self.flag("insecure-skip-host-key-check").unwrap_or(false);
        cfg.host_key = match (self.text("host-key"), self.text("known-hosts-path"), skip) {
            (Some(_), Some(_), _) => {
                return Err("keys `host-key` and `known-hosts-path` are mutually exclusive".into());
            }
            (Some(_), _, true) | (_, Some(_), true) => {
                return Err(
                    "`insecure-skip-host-key-check: true` turns off the host key check \
                            that `host-key` or `known-hosts-path` configures: keep one"
                        .into(),
                );
            }
            (Some(k), None, false) => HostKeyCheck::Key(k.to_string()),
            (None, Some(p), false) => HostKeyCheck::KnownHosts(Some(expand_tilde(p).into())),
            (None, None, false) => HostKeyCheck::KnownHosts(None),
            (None, None, true) => HostKeyCheck::Skip,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// `~/x` as `$HOME/x`, as Litestream reads its key paths.
fn expand_tilde(p: &str) -> String {
    match (p.strip_prefix("~/"), std::env::var("HOME")) {
        (Some(rest), Ok(home)) if !home.is_empty() => format!("{home}/{rest}"),
        _ => p.to_string(),
    }
}
