//! A real OpenSSH server on 127.0.0.1 for the SFTP backend: `sshd` from Debian's
//! `openssh-server` (which `.ci/run` installs), started per test on a free port with a fresh
//! ed25519 host key, key-only login for the current user and `internal-sftp`.
//!
//! Without `sshd` a test prints `SKIPPED` and passes, except under `CI`, where it fails.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use replicad::storage::AnyClient;
use replicad::storage::sftp::{HostKeyCheck, SftpClient, SftpConfig};

/// A running sshd and the keys to reach it.
pub struct Sshd {
    pub port: u16,
    /// The login user (the user the tests run as).
    pub user: String,
    /// The client's private key (its public half is the only authorized key).
    pub key_path: PathBuf,
    /// The server's public host key, as `host-key` takes it (`ssh-ed25519 AAAA...`).
    pub host_key: String,
    /// A known_hosts file naming the server (`[127.0.0.1]:PORT ssh-ed25519 ...`).
    pub known_hosts: PathBuf,
    /// The server's second host key, ECDSA (the server offers both).
    pub host_key_ecdsa: String,
    /// A directory the server's user can write: replicas go under it.
    pub root: PathBuf,
    child: Child,
    dir: super::TestDir,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path) {
    keygen_type(path, "ed25519");
}

fn keygen_type(path: &Path, kind: &str) {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", kind, "-N", "", "-C", "replicad-test", "-f"])
        .arg(path)
        .status()
        .expect("run ssh-keygen");
    assert!(st.success(), "ssh-keygen failed");
}

fn current_user() -> String {
    let out = Command::new("id").arg("-un").output().expect("id -un");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

impl Sshd {
    /// Starts sshd, or returns `None` (after saying SKIPPED) when it is not installed
    /// outside CI.
    pub fn start() -> Option<Sshd> {
        let bin = ["/usr/sbin/sshd", "/usr/bin/sshd"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists());
        let Some(bin) = bin else {
            assert!(
                std::env::var_os("CI").is_none(),
                "sshd is missing (.ci/run installs openssh-server)"
            );
            eprintln!("SKIPPED: sshd is not installed (apt-get install openssh-server)");
            return None;
        };
        // sshd insists on its privilege separation directory when run as root.
        let _ = std::fs::create_dir_all("/run/sshd");
        let dir = super::TestDir::new("sshd");
        let host = dir.join("host_ed25519");
        let key = dir.join("id_ed25519");
        let host_ecdsa = dir.join("host_ecdsa");
        keygen(&host);
        keygen_type(&host_ecdsa, "ecdsa");
        keygen(&key);
        let authorized = dir.join("authorized_keys");
        std::fs::copy(dir.join("id_ed25519.pub"), &authorized).unwrap();
        let public = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .unwrap()
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        };
        let (host_key, host_key_ecdsa) = (public("host_ed25519.pub"), public("host_ecdsa.pub"));
        let port = super::http::free_port();
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {host}\nHostKey {ecdsa}\n\
                 PidFile {pid}\n\
                 AuthorizedKeysFile {authorized}\nStrictModes no\nPubkeyAuthentication yes\n\
                 PasswordAuthentication yes\nKbdInteractiveAuthentication no\nUsePAM no\n\
                 PermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\n\
                 LogLevel VERBOSE\n",
                host = host.display(),
                ecdsa = host_ecdsa.display(),
                pid = dir.join("sshd.pid").display(),
                authorized = authorized.display(),
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("sshd.log")).unwrap();
        let mut child = Command::new(&bin)
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start sshd");
        super::emulators::wait_port(port, &mut child, "sshd");
        let known_hosts = dir.join("known_hosts");
        std::fs::write(&known_hosts, format!("[127.0.0.1]:{port} {host_key}\n")).unwrap();
        let root = dir.join("srv");
        std::fs::create_dir_all(&root).unwrap();
        Some(Sshd {
            port,
            user: current_user(),
            key_path: key,
            host_key,
            known_hosts,
            host_key_ecdsa,
            root,
            child,
            dir,
        })
    }

    /// A user who logs in with a password (created on first use; root only, as in CI) and a
    /// directory it owns: `(user, password, directory)`. `None` (SKIPPED) when not root.
    pub fn password_user(&self) -> Option<(String, String, PathBuf, super::TestDir)> {
        if self.user != "root" {
            assert!(
                std::env::var_os("CI").is_none(),
                "the password test creates a user: CI runs as root"
            );
            eprintln!("SKIPPED: creating a password user needs root");
            return None;
        }
        let user = "replicad-sftp";
        let exists = Command::new("id")
            .arg(user)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !exists {
            let st = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    user,
                ])
                .status()
                .expect("run useradd");
            assert!(st.success(), "useradd {user}");
        }
        let password = "replicad-sftp-test-password";
        let mut chpasswd = Command::new("chpasswd")
            .stdin(Stdio::piped())
            .spawn()
            .expect("run chpasswd");
        std::io::Write::write_all(
            chpasswd.stdin.as_mut().unwrap(),
            format!("{user}:{password}\n").as_bytes(),
        )
        .unwrap();
        assert!(chpasswd.wait().unwrap().success(), "chpasswd");
        // Its own directory tree, which the user can reach (test directories are 0700).
        let dir = super::TestDir::new("sftp-password");
        let mut perms = std::fs::metadata(dir.path()).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(dir.path(), perms).unwrap();
        let own = dir.join("replica");
        std::fs::create_dir_all(&own).unwrap();
        let st = Command::new("chown").arg(user).arg(&own).status().unwrap();
        assert!(st.success(), "chown");
        Some((user.to_string(), password.to_string(), own, dir))
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }

    /// Settings for the replica at `rel` under [`Sshd::root`] (an absolute path on the
    /// server), checking the host key against `host-key`.
    pub fn config(&self, rel: &str) -> SftpConfig {
        let path = format!("{}/{rel}", self.root.display());
        let mut cfg = SftpConfig::new("127.0.0.1", self.port, &self.user, &path);
        cfg.key_path = Some(self.key_path.clone());
        cfg.host_key = HostKeyCheck::Key(self.host_key.clone());
        cfg
    }

    /// A client for the replica at `rel`.
    pub fn client(&self, rel: &str) -> AnyClient {
        AnyClient::Sftp(SftpClient::new(self.config(rel)))
    }

    /// The replica's YAML lines (indented by `indent` spaces) for the replica at `rel`,
    /// reached at `port` (this server's, or a proxy's in front of it).
    pub fn replica_yaml(&self, rel: &str, port: u16, indent: usize) -> String {
        let pad = " ".repeat(indent);
        format!(
            "{pad}type: sftp\n{pad}host: 127.0.0.1:{port}\n{pad}user: {user}\n\
             {pad}path: {root}/{rel}\n{pad}key-path: {key}\n{pad}host-key: {host_key}\n",
            user = self.user,
            root = self.root.display(),
            key = self.key_path.display(),
            host_key = self.host_key,
        )
    }
}
