//! The settings of an SFTP replica, parsed from Litestream's URL form
//! (`sftp://USER@HOST[:PORT]/PATH`) or its keys (`host`, `user`, `password`, `key-path`,
//! `host-key`, `concurrent-writes`), and checked without contacting the server.

use std::path::PathBuf;

use crate::storage::s3::Secret;

/// The default SSH port.
pub const DEFAULT_PORT: u16 = 22;

/// How the server's host key is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyCheck {
    /// Against `host-key` (an authorized_keys line: `ssh-ed25519 AAAA...`).
    Key(String),
    /// Against a known_hosts file (`known-hosts-path`, else `~/.ssh/known_hosts`).
    KnownHosts(Option<PathBuf>),
    /// Not checked (`insecure-skip-host-key-check: true`): anyone on the path can pose as
    /// the server and read or change the replica.
    Skip,
}

/// Settings of one SFTP replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftpConfig {
    /// Server host name or address.
    pub host: String,
    /// Server port.
    pub port: u16,
    /// Login user.
    pub user: String,
    /// Password authentication (`password`); tried after the key, if any.
    pub password: Option<Secret>,
    /// Private key file (`key-path`, OpenSSH or PEM format, unencrypted).
    pub key_path: Option<PathBuf>,
    /// The host key check.
    pub host_key: HostKeyCheck,
    /// Directory of the replica: relative to the login directory, or absolute with a
    /// leading `/` (the URL form's path is absolute, as in Litestream). No trailing `/`.
    pub path: String,
    /// Several write requests of one file in flight (`concurrent-writes`, default true).
    pub concurrent_writes: bool,
}

impl SftpConfig {
    /// A config for `user@host:port` with the default settings.
    pub fn new(host: &str, port: u16, user: &str, path: &str) -> SftpConfig {
        SftpConfig {
            host: host.to_string(),
            port,
            user: user.to_string(),
            password: None,
            key_path: None,
            host_key: HostKeyCheck::KnownHosts(None),
            path: normalize_path(path),
            concurrent_writes: true,
        }
    }

    /// Parses `sftp://[USER@]HOST[:PORT]/PATH` (`/~/PATH`: relative to the login directory),
    /// percent-decoded as Litestream's Go parser does; the user may come from the `user` key
    /// instead. A password in the URL is refused: URLs end up in logs and process listings.
    pub fn from_url(url: &str) -> Result<SftpConfig, String> {
        let shown = crate::storage::s3::redact_url(url);
        let rest = url
            .strip_prefix("sftp://")
            .ok_or_else(|| format!("not an sftp:// URL: {shown}"))?;
        if rest.contains('?') {
            return Err(format!(
                "an sftp URL takes no parameters; use the replica's keys instead: {shown}"
            ));
        }
        // The user info ends at the last `@` (a password may hold `/` or `@`).
        let (user, rest) = match rest.rfind('@') {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => ("", rest),
        };
        if user.contains(':') || user.contains('/') {
            return Err(format!(
                "credentials in a replica URL are refused: {shown}; hint: set `password` or \
                 `key-path` in the replica's config"
            ));
        }
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (host, port) = split_host_port(hostport)?;
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| format!("{shown}: not UTF-8 once percent-decoded"))
        };
        let path = decode(path)?;
        let path = path.strip_prefix("/~/").unwrap_or(&path);
        let cfg = SftpConfig::new(host, port, &decode(user)?, path);
        if cfg.host.is_empty() {
            return Err(format!(
                "an sftp URL is sftp://USER@HOST[:PORT]/PATH, got {shown}"
            ));
        }
        Ok(cfg)
    }

    /// Checks what can be checked without contacting the server.
    pub fn validate(&self) -> Result<(), String> {
        if self.host.is_empty() {
            return Err("an sftp replica needs `host` (or sftp://USER@HOST/PATH)".into());
        }
        if self.user.is_empty() {
            return Err("an sftp replica needs `user` (or sftp://USER@HOST/PATH)".into());
        }
        if let HostKeyCheck::Key(k) = &self.host_key {
            russh::keys::PublicKey::from_openssh(k.trim()).map_err(|e| {
                format!(
                    "host-key {k:?} is not a public key line (`ssh-ed25519 AAAA...`, as in \
                     known_hosts without the host name): {e}"
                )
            })?;
        }
        Ok(())
    }

    /// `sftp://USER@HOST[:PORT]/PATH`: no secrets.
    pub fn url(&self) -> String {
        let port = if self.port == DEFAULT_PORT {
            String::new()
        } else {
            format!(":{}", self.port)
        };
        let path = if self.path.starts_with('/') || self.path.is_empty() {
            self.path.clone()
        } else {
            format!("/~/{}", self.path)
        };
        format!("sftp://{}@{}{port}{path}", self.user, self.host)
    }

    /// `HOST:PORT`, for messages.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

fn normalize_path(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() && path.starts_with('/') {
        "/".into()
    } else {
        trimmed.to_string()
    }
}

/// Splits `host`, `host:port`, `[v6]` or `[v6]:port`.
pub fn split_host_port(s: &str) -> Result<(&str, u16), String> {
    let bad_port = |p: &str| format!("port {p:?} is not a number from 1 to 65535");
    let parse = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad_port(p))
    };
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("unclosed `[` in host {s:?}"))?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((host, parse(p)?)),
            None if after.is_empty() => Ok((host, DEFAULT_PORT)),
            None => Err(format!("bad host {s:?}")),
        };
    }
    match s.rsplit_once(':') {
        Some((host, p)) if !host.contains(':') => Ok((host, parse(p)?)),
        _ => Ok((s, DEFAULT_PORT)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_as_litestream_spells_them() {
        let c = SftpConfig::from_url("sftp://backup@example.com:2222/srv/db").unwrap();
        assert_eq!(
            (c.user.as_str(), c.host.as_str(), c.port, c.path.as_str()),
            ("backup", "example.com", 2222, "/srv/db")
        );
        assert_eq!(c.url(), "sftp://backup@example.com:2222/srv/db");
        let c = SftpConfig::from_url("sftp://u@h/~/rel/dir/").unwrap();
        assert_eq!((c.port, c.path.as_str()), (22, "rel/dir"));
        assert_eq!(c.url(), "sftp://u@h/~/rel/dir");
        assert_eq!(SftpConfig::from_url(&c.url()).unwrap(), c);
        let c = SftpConfig::from_url("sftp://u@[::1]:23/x").unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.address()),
            ("::1", 23, "[::1]:23".into())
        );
    }

    #[test]
    fn bad_urls_say_why_and_never_echo_a_password() {
        let e = SftpConfig::from_url("sftp://u:hunter2@h/x").unwrap_err();
        assert!(e.contains("refused") && !e.contains("hunter2"), "{e}");
        let e = SftpConfig::from_url("sftp://bob:pa/ss@h/x").unwrap_err();
        assert!(e.contains("refused") && !e.contains("pa/ss"), "{e}");
        let c = SftpConfig::from_url("sftp://h/x%20y").unwrap();
        assert_eq!((c.user.as_str(), c.path.as_str()), ("", "/x y"));
        assert!(c.validate().unwrap_err().contains("needs `user`"));
        let e = SftpConfig::from_url("sftp://u@h:0/x").unwrap_err();
        assert!(e.contains("port"), "{e}");
        let mut c = SftpConfig::new("h", 22, "u", "x");
        c.host_key = HostKeyCheck::Key("not a key".into());
        assert!(c.validate().unwrap_err().contains("host-key"));
    }
}
