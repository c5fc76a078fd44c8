//! One SSH connection with an SFTP session on it: TCP connect, the host key check, then key
//! or password authentication (russh, pure Rust). Failures come back in words with a hint.
//!
//! Invariant: no byte goes to the server before its host key matched `host-key` or the
//! known_hosts file, unless the config says `insecure-skip-host-key-check: true`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use russh::client::{self, AuthResult, Handle};
use russh::keys::{Algorithm, HashAlg, PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate};
use russh_sftp::client::SftpSession;

use super::config::{HostKeyCheck, SftpConfig};

/// Time allowed for TCP connect, handshake and authentication together.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// Time allowed for one SFTP request's answer.
pub(super) const REQUEST_TIMEOUT_SECS: u64 = 30;

/// Why a connection could not be made, as a person reads it.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnectError {
    /// Worth another try later: the server is down, unreachable or slow.
    #[error("{0}")]
    Transient(String),
    /// Needs a change of configuration: host key, credentials, key file.
    #[error("{0}")]
    Permanent(String),
}

/// The handler's error: russh's, or the host key check's own verdict.
#[derive(Debug)]
pub(super) enum HandlerError {
    Ssh(russh::Error),
    HostKey(String),
}

impl From<russh::Error> for HandlerError {
    fn from(e: russh::Error) -> Self {
        HandlerError::Ssh(e)
    }
}

pub(super) struct Checker {
    cfg: Arc<SftpConfig>,
}

impl client::Handler for Checker {
    type Error = HandlerError;

    async fn check_server_key(
        &mut self,
        offered: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let PublicKeyOrCertificate::PublicKey { key, .. } = offered else {
            return Err(HandlerError::HostKey(format!(
                "{} presented a host certificate, which replicad does not check; hint: set \
                 `host-key` to the server's plain public key",
                self.cfg.address()
            )));
        };
        check_host_key(&self.cfg, key).map_err(HandlerError::HostKey)?;
        Ok(true)
    }
}

/// Checks the server's key as configured; `Err` says what is wrong and how to fix it.
fn check_host_key(cfg: &SftpConfig, key: &PublicKey) -> Result<(), String> {
    let shown = format!("{} {}", key.algorithm(), key.fingerprint(HashAlg::Sha256));
    let add_hint = format!(
        "hint: verify the key, then add it with `ssh-keyscan -p {} {} >> ~/.ssh/known_hosts` \
         (or `known-hosts-path`), or set `host-key: {}` in the replica's config; \
         `insecure-skip-host-key-check: true` turns the check off (not recommended)",
        cfg.port,
        cfg.host,
        key.to_openssh().unwrap_or_default()
    );
    match &cfg.host_key {
        HostKeyCheck::Skip => Ok(()),
        HostKeyCheck::Key(expected) => {
            let expected = PublicKey::from_openssh(expected.trim())
                .map_err(|e| format!("host-key is not a public key: {e}"))?;
            if expected.key_data() == key.key_data() {
                Ok(())
            } else {
                Err(format!(
                    "host key of {} does not match `host-key` (the server offered {shown}); \
                     if the server's key really changed, {add_hint}",
                    cfg.address()
                ))
            }
        }
        HostKeyCheck::KnownHosts(path) => {
            let path = match path {
                Some(p) => p.clone(),
                None => default_known_hosts()?,
            };
            match russh::keys::check_known_hosts_path(&cfg.host, cfg.port, key, &path) {
                Ok(true) => Ok(()),
                Ok(false) => Err(format!(
                    "host key of {} is unknown: {shown} is not in {}; {add_hint}",
                    cfg.address(),
                    path.display()
                )),
                Err(russh::keys::Error::KeyChanged { line }) => Err(format!(
                    "HOST KEY CHANGED for {}: it offered {shown}, which differs from line \
                     {line} of {}: someone may be posing as the server; if the key really \
                     changed, remove that line, then {add_hint}",
                    cfg.address(),
                    path.display()
                )),
                Err(e) if !path.exists() => Err(format!(
                    "host key of {} cannot be checked: {} does not exist ({e}); {add_hint}",
                    cfg.address(),
                    path.display()
                )),
                Err(e) => Err(format!("cannot read {}: {e}", path.display())),
            }
        }
    }
}

/// The host key types to ask the server for: those of the configured key, or of the server's
/// known_hosts lines (as OpenSSH orders them), so a server with several host keys presents
/// one that can be checked. `None`: russh's defaults.
fn host_key_algorithms(cfg: &SftpConfig) -> Option<Vec<Algorithm>> {
    let keys: Vec<PublicKey> = match &cfg.host_key {
        HostKeyCheck::Skip => return None,
        HostKeyCheck::Key(k) => PublicKey::from_openssh(k.trim()).ok().into_iter().collect(),
        HostKeyCheck::KnownHosts(path) => {
            let path = match path {
                Some(p) => p.clone(),
                None => default_known_hosts().ok()?,
            };
            russh::keys::known_hosts::known_host_keys_path(&cfg.host, cfg.port, path)
                .ok()?
                .into_iter()
                .map(|(_, k)| k)
                .collect()
        }
    };
    let mut out: Vec<Algorithm> = Vec::new();
    for k in keys {
        let algs = match k.algorithm() {
            // An RSA key signs with SHA-2 on any server of the last decade.
            Algorithm::Rsa { .. } => vec![
                Algorithm::Rsa {
                    hash: Some(HashAlg::Sha512),
                },
                Algorithm::Rsa {
                    hash: Some(HashAlg::Sha256),
                },
            ],
            a => vec![a],
        };
        for a in algs {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

fn default_known_hosts() -> Result<PathBuf, String> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| Path::new(&h).join(".ssh/known_hosts"))
        .ok_or_else(|| {
            "HOME is not set, so ~/.ssh/known_hosts cannot be found; hint: set \
             `known-hosts-path` or `host-key`"
                .to_string()
        })
}

/// An authenticated connection and its SFTP session.
pub(super) struct Conn {
    pub(super) handle: Handle<Checker>,
    pub(super) sftp: SftpSession,
}

impl Conn {
    /// True once the server or the network closed the connection.
    pub(super) fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }
}

/// Connects, checks the host key, authenticates and starts SFTP.
pub(super) async fn connect(cfg: Arc<SftpConfig>) -> Result<Conn, ConnectError> {
    let addr = cfg.address();
    match tokio::time::timeout(CONNECT_TIMEOUT, connect_inner(cfg)).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Transient(format!(
            "connecting to {addr} timed out after {}s; hint: check `host` and the port, and \
             that the server is up",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

async fn connect_inner(cfg: Arc<SftpConfig>) -> Result<Conn, ConnectError> {
    let addr = cfg.address();
    let key = match &cfg.key_path {
        Some(p) => Some(load_key(p)?),
        // As ssh does: the user's default key, when no key or password is configured.
        None if cfg.password.is_none() => match default_key() {
            Some(p) => Some(load_key(&p)?),
            None => {
                return Err(ConnectError::Permanent(
                    "an sftp replica needs `key-path` or `password` (no ~/.ssh/id_ed25519, \
                     id_ecdsa or id_rsa either)"
                        .into(),
                ));
            }
        },
        None => None,
    };
    let mut preferred = russh::Preferred::default();
    if let Some(algorithms) = host_key_algorithms(&cfg) {
        preferred.key = algorithms.into();
    }
    let ssh_cfg = Arc::new(client::Config {
        // The server may drop idle connections; replicad reconnects on the next call.
        inactivity_timeout: None,
        preferred,
        ..Default::default()
    });
    let checker = Checker { cfg: cfg.clone() };
    let mut handle = client::connect(ssh_cfg, (cfg.host.as_str(), cfg.port), checker)
        .await
        .map_err(|e| match e {
            HandlerError::HostKey(msg) => ConnectError::Permanent(msg),
            HandlerError::Ssh(russh::Error::IO(io)) => ConnectError::Transient(format!(
                "cannot reach {addr}: {io}; hint: check `host` and the port, and that the \
                 SSH server is up"
            )),
            // No algorithm in common, or a bad signature: retrying will not change it.
            HandlerError::Ssh(
                e @ (russh::Error::NoCommonAlgo { .. }
                | russh::Error::UnknownAlgo
                | russh::Error::WrongServerSig),
            ) => ConnectError::Permanent(format!(
                "SSH handshake with {addr} failed: {e}; hint: the server and replicad share \
                 no key exchange, cipher or host key algorithm (replicad offers only the host \
                 key types recorded for the server, when it has any)"
            )),
            HandlerError::Ssh(e) => {
                ConnectError::Transient(format!("SSH handshake with {addr} failed: {e}"))
            }
        })?;
    let mut refused = Vec::new();
    let mut ok = false;
    if let Some(key) = key {
        let hash = handle
            .best_supported_rsa_hash()
            .await
            .map_err(|e| ConnectError::Transient(format!("SSH with {addr}: {e}")))?
            .flatten();
        let r = handle
            .authenticate_publickey(&cfg.user, PrivateKeyWithHashAlg::new(Arc::new(key), hash))
            .await
            .map_err(|e| ConnectError::Transient(format!("SSH with {addr}: {e}")))?;
        ok = matches!(r, AuthResult::Success);
        if !ok {
            refused.push("the key in `key-path`");
        }
    }
    if !ok && let Some(pw) = &cfg.password {
        let r = handle
            .authenticate_password(&cfg.user, &pw.0)
            .await
            .map_err(|e| ConnectError::Transient(format!("SSH with {addr}: {e}")))?;
        ok = matches!(r, AuthResult::Success);
        if !ok {
            refused.push("the password");
        }
    }
    if !ok {
        return Err(ConnectError::Permanent(format!(
            "{addr} refused {} for user `{}`; hint: check `user`, and that the key's public \
             half is in the user's ~/.ssh/authorized_keys on the server (or the password)",
            refused.join(" and "),
            cfg.user
        )));
    }
    let channel = handle
        .channel_open_session()
        .await
        .map_err(|e| ConnectError::Transient(format!("SSH with {addr}: open a session: {e}")))?;
    channel.request_subsystem(true, "sftp").await.map_err(|e| {
        ConnectError::Permanent(format!(
            "{addr} refused the sftp subsystem: {e}; hint: the server needs `Subsystem sftp` \
             in sshd_config"
        ))
    })?;
    let sftp_cfg = russh_sftp::client::Config {
        max_concurrent_writes: if cfg.concurrent_writes { 16 } else { 1 },
        request_timeout_secs: REQUEST_TIMEOUT_SECS,
        ..Default::default()
    };
    let sftp = SftpSession::new_with_config(channel.into_stream(), sftp_cfg)
        .await
        .map_err(|e| {
            ConnectError::Transient(format!("{addr}: the SFTP session did not start: {e}"))
        })?;
    Ok(Conn { handle, sftp })
}

/// `~/.ssh/id_ed25519`, `id_ecdsa` or `id_rsa`, the first that exists.
fn default_key() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    ["id_ed25519", "id_ecdsa", "id_rsa"]
        .iter()
        .map(|n| Path::new(&home).join(".ssh").join(n))
        .find(|p| p.exists())
}

fn load_key(path: &Path) -> Result<russh::keys::PrivateKey, ConnectError> {
    russh::keys::load_secret_key(path, None).map_err(|e| {
        ConnectError::Permanent(format!(
            "cannot use the private key {}: {e}; hint: `key-path` must name an unencrypted \
             private key (OpenSSH or PEM) readable by the user replicad runs as",
            path.display()
        ))
    })
}
