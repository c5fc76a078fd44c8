//! Real storage emulators on 127.0.0.1 for the Google Cloud Storage, Azure Blob Storage and
//! WebDAV backends: fake-gcs-server (a Go module), Azurite (an npm package) and
//! `rclone serve webdav` (Debian's `rclone`), each started as a process of its own per test on
//! a free port and killed when dropped.
//!
//! `.ci/run` installs both into `target/test-tools` (`bin/fake-gcs-server`,
//! `azurite/node_modules/.bin/azurite-blob`); `REPLICAD_TEST_TOOLS` names another directory.
//! Without them a test prints `SKIPPED` and passes, except under `CI`, where it fails.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use replicad::storage::AnyClient;
use replicad::storage::object::{ObjectClient, ObjectConfig, Service};
use replicad::storage::s3::Secret;

/// Azurite's well-known development account and key (public, in Microsoft's docs).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

pub fn tools_dir() -> PathBuf {
    std::env::var_os("REPLICAD_TEST_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-tools"))
}

/// The tool at `rel` under the tools directory, or `None` (after saying SKIPPED) when it is
/// missing outside CI.
pub fn tool(rel: &str, what: &str) -> Option<PathBuf> {
    let p = tools_dir().join(rel);
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{what} is missing at {} (.ci/run installs it)",
        p.display()
    );
    eprintln!("SKIPPED: {what} is not installed at {}", p.display());
    None
}

pub fn wait_port(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("{what} exited at start: {st}");
        }
        assert!(Instant::now() < deadline, "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One HTTP/1.1 request; returns the status and body.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A storage emulator process with one fresh bucket (GCS) or container (Azure).
pub struct Emulator {
    pub service: Service,
    pub port: u16,
    /// `http://127.0.0.1:PORT` (GCS) or `http://127.0.0.1:PORT/devstoreaccount1` (Azure).
    pub endpoint: String,
    /// The bucket or container (empty on WebDAV).
    pub bucket: String,
    /// WebDAV basic-auth user and password, when the server asks for them.
    pub auth: Option<(String, String)>,
    child: Child,
    _dir: super::TestDir,
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn random_name(prefix: &str) -> String {
    format!("{prefix}-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

impl Emulator {
    /// fake-gcs-server with a fresh bucket, or `None` when it is not installed (outside CI).
    pub fn gcs() -> Option<Emulator> {
        let bin = tool("bin/fake-gcs-server", "fake-gcs-server")?;
        let dir = super::TestDir::new("gcs");
        let port = super::http::free_port();
        let log = std::fs::File::create(dir.join("fake-gcs-server.log")).unwrap();
        let mut child = Command::new(bin)
            .args([
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                &port.to_string(),
                "-public-host",
                &format!("127.0.0.1:{port}"),
                "-backend",
                "memory",
                "-log-level",
                "warn",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start fake-gcs-server");
        wait_port(port, &mut child, "fake-gcs-server");
        let bucket = random_name("replicad-test");
        let (status, body) = http(
            port,
            "POST",
            "/storage/v1/b?project=test",
            &[("Content-Type", "application/json".into())],
            format!("{{\"name\":\"{bucket}\"}}").as_bytes(),
        );
        assert_eq!(status, 200, "create bucket: {body}");
        Some(Emulator {
            service: Service::Gcs,
            port,
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket,
            auth: None,
            child,
            _dir: dir,
        })
    }

    /// `rclone serve webdav` over a fresh directory, with basic auth when `auth`, or `None`
    /// when rclone is not installed (outside CI).
    pub fn webdav(auth: bool) -> Option<Emulator> {
        Emulator::webdav_with(auth, &[])
    }

    /// `rclone serve webdav --read-only`: every write is refused with 403 Forbidden.
    pub fn webdav_read_only() -> Option<Emulator> {
        Emulator::webdav_with(false, &["--read-only"])
    }

    fn webdav_with(auth: bool, extra: &[&str]) -> Option<Emulator> {
        let found = Command::new("rclone")
            .arg("version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            assert!(
                std::env::var_os("CI").is_none(),
                "rclone is missing (.ci/run installs it)"
            );
            eprintln!("SKIPPED: rclone is not installed (apt-get install rclone)");
            return None;
        }
        let dir = super::TestDir::new("webdav");
        let data = dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        let port = super::http::free_port();
        let log = std::fs::File::create(dir.join("rclone.log")).unwrap();
        let auth = auth.then(|| ("replicad".to_string(), random_name("pw")));
        let mut cmd = Command::new("rclone");
        cmd.args(["serve", "webdav"])
            .arg(&data)
            .args(["--addr", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env("RCLONE_CONFIG", dir.join("rclone.conf"));
        if let Some((user, pass)) = &auth {
            cmd.args(["--user", user, "--pass", pass]);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start rclone serve webdav");
        wait_port(port, &mut child, "rclone serve webdav");
        Some(Emulator {
            service: Service::Webdav,
            port,
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket: String::new(),
            auth,
            child,
            _dir: dir,
        })
    }

    /// Azurite's blob service with a fresh container, or `None` when it is not installed.
    pub fn azurite() -> Option<Emulator> {
        let bin = tool("azurite/node_modules/.bin/azurite-blob", "Azurite")?;
        let dir = super::TestDir::new("azurite");
        let port = super::http::free_port();
        let log = std::fs::File::create(dir.join("azurite.log")).unwrap();
        let mut child = Command::new(bin)
            .args([
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &port.to_string(),
                "--location",
                &dir.join("data").display().to_string(),
                "--skipApiVersionCheck",
                "--disableTelemetry",
                "--silent",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start azurite");
        wait_port(port, &mut child, "Azurite");
        let container = random_name("replicad-test");
        let path = format!("/{AZURITE_ACCOUNT}/{container}?restype=container");
        let (status, body) = azure_request(port, "PUT", &path, &[("restype", "container")]);
        assert_eq!(status, 201, "create container: {body}");
        Some(Emulator {
            service: Service::Azure,
            port,
            endpoint: format!("http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"),
            bucket: container,
            auth: None,
            child,
            _dir: dir,
        })
    }

    /// The replica URL of `prefix` in this emulator's bucket or container.
    pub fn url(&self, prefix: &str) -> String {
        let prefix = prefix.trim_start_matches('/');
        match self.service {
            Service::Gcs => format!("gs://{}/{prefix}?endpoint={}", self.bucket, self.endpoint),
            Service::Azure => format!(
                "abs://{AZURITE_ACCOUNT}@{}/{prefix}?endpoint={}",
                self.bucket, self.endpoint
            ),
            Service::Webdav => format!("webdav://127.0.0.1:{}/{prefix}", self.port),
        }
    }

    /// Settings for `prefix`, with the credentials the emulator accepts.
    pub fn config(&self, prefix: &str) -> ObjectConfig {
        let mut cfg = ObjectConfig::from_url(&self.url(prefix)).expect("emulator URL");
        if self.service == Service::Azure {
            cfg.account_key = Some(Secret(AZURITE_KEY.into()));
        }
        if let Some((user, pass)) = &self.auth {
            cfg.username = Some(user.clone());
            cfg.password = Some(Secret(pass.clone()));
        }
        cfg
    }

    /// A client for `prefix`.
    pub fn client(&self, prefix: &str) -> AnyClient {
        AnyClient::Object(Box::new(
            ObjectClient::new(self.config(prefix)).expect("emulator client"),
        ))
    }

    /// The environment a replicad process needs to reach this emulator by URL.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        match self.service {
            Service::Gcs | Service::Webdav => vec![],
            Service::Azure => vec![("LITESTREAM_AZURE_ACCOUNT_KEY", AZURITE_KEY.into())],
        }
    }

    /// Scheme name for messages.
    pub fn name(&self) -> &'static str {
        self.service.scheme()
    }
}

/// A SharedKey-signed request to Azurite (container creation: not in object_store's API).
fn azure_request(port: u16, method: &str, path: &str, query: &[(&str, &str)]) -> (u16, String) {
    use hmac::{KeyInit, Mac};
    let date = chrono::Utc::now()
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string();
    let version = "2021-08-06";
    let resource_path = path.split('?').next().unwrap();
    let mut canonical_query = String::new();
    let mut q: Vec<_> = query.to_vec();
    q.sort();
    for (k, v) in q {
        canonical_query.push_str(&format!("\n{k}:{v}"));
    }
    // Verb, then eleven standard headers (all empty here), then x-ms-*, then the resource.
    let to_sign = format!(
        "{method}\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{AZURITE_ACCOUNT}{resource_path}{canonical_query}"
    );
    let key = base64::engine::general_purpose::STANDARD
        .decode(AZURITE_KEY)
        .unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(to_sign.as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    http(
        port,
        method,
        path,
        &[
            ("x-ms-date", date),
            ("x-ms-version", version.into()),
            (
                "Authorization",
                format!("SharedKey {AZURITE_ACCOUNT}:{sig}"),
            ),
        ],
        b"",
    )
}

/// A TCP proxy on 127.0.0.1 in front of an emulator that counts the HTTP requests passing
/// through it (request lines in the client-to-server stream): the emulators keep no request
/// counts of their own.
pub struct CountingProxy {
    pub port: u16,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Bytes in either direction: what counts for an encrypted protocol (SSH).
    bytes: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl CountingProxy {
    /// Starts a proxy to `127.0.0.1:target`; it lives as long as the test process.
    pub fn start(target: u16) -> CountingProxy {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = count.clone();
        let bytes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let byte_counter = bytes.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let (mut c_read, mut s_write) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (mut s_read, mut c_write) = (server, client);
                let counter = counter.clone();
                let (up, down) = (byte_counter.clone(), byte_counter.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = c_read.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        up.fetch_add(n as u64, Ordering::SeqCst);
                        let hits = buf[..n]
                            .windows(11)
                            .filter(|w| w == b" HTTP/1.1\r\n")
                            .count();
                        counter.fetch_add(hits as u64, Ordering::SeqCst);
                        if s_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = s_write.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = s_read.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        down.fetch_add(n as u64, Ordering::SeqCst);
                        if c_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = c_write.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        CountingProxy { port, count, bytes }
    }

    /// Bytes passed so far, both directions together.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Requests seen so far.
    pub fn requests(&self) -> u64 {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Emulator {
    /// The replica URL of `prefix` through `proxy` instead of straight to the emulator.
    pub fn url_via(&self, proxy: &CountingProxy, prefix: &str) -> String {
        self.url(prefix).replace(
            &format!("127.0.0.1:{}", self.port),
            &format!("127.0.0.1:{}", proxy.port),
        )
    }
}
