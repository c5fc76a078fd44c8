//! An S3-compatible server inside the test process, for tests of the S3 replica backend.
//!
//! [`S3Server::start`] serves an [`s3s_fs`] bucket store (objects are plain files at
//! `root/<bucket>/<key>`) on `127.0.0.1:<random port>`, with SigV4 authentication against the
//! fixed credentials [`ACCESS_KEY`] / [`SECRET_KEY`] and a fresh random bucket. The server runs
//! on its own tokio runtime in a background thread, so it outlives any one `#[tokio::test]`
//! runtime, and it can be stopped and restarted on the same port ([`S3Server::stop`],
//! [`S3Server::restart`]) to test outages. Every request is counted ([`S3Server::request_count`],
//! [`S3Server::requests_by_op`]), which is what "no requests while idle" tests assert on, and
//! server errors can be injected per operation ([`S3Server::fail_next`]), and GETs of LTX files
//! held as behind a stalled network ([`S3Server::hold_ltx`]). Conditional writes
//! (`If-None-Match`, `If-Match`) are decided atomically, as S3 decides them: s3s-fs alone
//! checks the condition before reading the body.
//!
//! # Running the S3 tests against MinIO or a real bucket
//!
//! Set `REPLICAD_TEST_S3_ENDPOINT` and no server is started; the tests use that endpoint:
//!
//! ```text
//! REPLICAD_TEST_S3_ENDPOINT=http://127.0.0.1:9000      # MinIO; or https://s3.eu-west-1.amazonaws.com
//! REPLICAD_TEST_S3_BUCKET=replicad-test                 # must exist; required
//! REPLICAD_TEST_S3_ACCESS_KEY=...                       # else AWS_ACCESS_KEY_ID
//! REPLICAD_TEST_S3_SECRET_KEY=...                       # else AWS_SECRET_ACCESS_KEY
//! REPLICAD_TEST_S3_REGION=eu-west-1                     # optional, default us-east-1
//! ```
//!
//! Each [`S3Server`] then works under a random key prefix `replicad-test-<hex>/` in that bucket
//! (so runs and tests never see each other's objects) and deletes what is under it when
//! dropped. In that mode the server cannot be observed or controlled: [`S3Server::root`] is
//! empty, the request counts are always 0 (check [`S3Server::counts_requests`]), and
//! [`S3Server::stop`], [`S3Server::restart`] and [`S3Server::fail_next`] panic (check
//! [`S3Server::is_external`] and skip such tests). Path-style addressing is always used, which
//! MinIO needs and AWS accepts. Objects of a failing test are kept (as with
//! `REPLICAD_TEST_KEEP`) and their prefix printed.
//!
//! A bare `s3s-fs` binary is not a faithful external endpoint: it creates a missing bucket on
//! PutObject and answers NoSuchKey for objects of a missing bucket, so the missing-bucket test
//! fails against it (the in-process server answers NoSuchBucket, as S3 does).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::SimpleAuth;
use s3s::service::{S3Service, S3ServiceBuilder};
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

/// Access key the in-process server accepts.
pub const ACCESS_KEY: &str = "replicadtest";
/// Secret key the in-process server accepts.
pub const SECRET_KEY: &str = "replicadtestsecret0123";

/// An S3 endpoint for one test: an in-process server, or an external one (see the module doc).
pub struct S3Server {
    /// `http://127.0.0.1:PORT` (or the external endpoint).
    pub endpoint: String,
    /// A bucket that exists and is empty (or, externally, a random empty prefix of one).
    pub bucket: String,
    /// Region to sign for.
    pub region: String,
    pub access_key: String,
    pub secret_key: String,
    /// The s3s-fs data directory: the object `K` of the bucket is the file
    /// `root/<bucket>/<K>`. Empty for an external endpoint.
    pub root: PathBuf,
    /// Prepended to every prefix given to [`S3Server::url`]: empty for the in-process server,
    /// `replicad-test-<hex>/` for an external endpoint.
    pub key_prefix: String,
    local: Option<Local>,
}

/// The in-process server's moving parts.
struct Local {
    _dir: super::TestDir,
    addr: SocketAddr,
    service: S3Service,
    counters: Arc<Counters>,
    /// The server runtime; it lives as long as `thread`.
    handle: Handle,
    /// Ends the server thread.
    exit: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Present while serving.
    serving: Option<Serving>,
}

struct Serving {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct Counters {
    /// Every HTTP request received.
    total: AtomicU64,
    /// Requests s3s resolved to an operation, by operation name.
    by_op: Mutex<BTreeMap<String, u64>>,
    /// Injected failures still to serve, by operation name.
    faults: Mutex<BTreeMap<String, u64>>,
    /// Every signed request is refused with AccessDenied, as under a bucket policy that
    /// denies these credentials ([`S3Server::deny_access`]).
    deny: std::sync::atomic::AtomicBool,
    /// Operations on `.ltx` objects that wait in the server while listed
    /// ([`S3Server::hold_ltx`]).
    hold_ltx: Mutex<std::collections::BTreeSet<String>>,
    /// Requests on `.ltx` objects that have waited so far.
    held: AtomicU64,
}

/// Counts operations. s3s calls `check` for every request it routed to an operation (when
/// authentication is on, as here), before the operation runs; the request is then authorised
/// exactly as by s3s's default check (signed requests only).
///
/// It also refuses writes to a bucket that does not exist with `NoSuchBucket`, as S3 does
/// (s3s-fs would create the bucket directory instead), and serves the failures injected with
/// [`S3Server::fail_next`].
struct CountingAccess {
    counters: Arc<Counters>,
    root: PathBuf,
}

#[async_trait::async_trait]
impl S3Access for CountingAccess {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> s3s::S3Result<()> {
        let op = cx.s3_op().name();
        *self
            .counters
            .by_op
            .lock()
            .unwrap()
            .entry(op.to_string())
            .or_default() += 1;
        if cx.credentials().is_none() {
            return Err(s3s::s3_error!(AccessDenied, "Signature is required"));
        }
        if self.counters.deny.load(Ordering::SeqCst) {
            return Err(s3s::s3_error!(AccessDenied, "Access Denied"));
        }
        if let Some(left) = self.counters.faults.lock().unwrap().get_mut(op)
            && *left > 0
        {
            *left -= 1;
            return Err(s3s::s3_error!(InternalError, "injected by the test"));
        }
        let ltx = cx
            .s3_path()
            .as_object()
            .is_some_and(|(_, key)| key.ends_with(".ltx"));
        let held = |c: &Counters| c.hold_ltx.lock().unwrap().contains(op);
        if ltx && held(&self.counters) {
            self.counters.held.fetch_add(1, Ordering::SeqCst);
            while held(&self.counters) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        if let Some(bucket) = cx.s3_path().get_bucket_name()
            && op != "CreateBucket"
            && !self.root.join(bucket).is_dir()
        {
            return Err(s3s::s3_error!(NoSuchBucket));
        }
        Ok(())
    }
}

fn random_hex() -> String {
    format!("{:016x}", rand::random::<u64>())
}

impl S3Server {
    /// Starts a server on `127.0.0.1:0` with a fresh random bucket, or uses the external
    /// endpoint named by `REPLICAD_TEST_S3_ENDPOINT` (see the module doc).
    pub async fn start() -> S3Server {
        if let Some(s) = S3Server::external() {
            return s;
        }
        let dir = super::TestDir::new("s3");
        let root = dir.join("data");
        std::fs::create_dir_all(&root).unwrap();
        let bucket = format!("replicad-test-{}", random_hex());
        // An s3s-fs bucket is a directory under the root.
        std::fs::create_dir(root.join(&bucket)).unwrap();

        let counters = Arc::new(Counters::default());
        let fs = s3s_fs::FileSystem::new(&root).expect("s3s-fs root");
        let service = {
            let mut b = S3ServiceBuilder::new(fs);
            b.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
            b.set_access(CountingAccess {
                counters: counters.clone(),
                root: root.clone(),
            });
            b.build()
        };

        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (exit_tx, exit_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("s3-test-server".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("s3-test-server")
                    .enable_all()
                    .build()
                    .expect("server runtime");
                handle_tx.send(rt.handle().clone()).unwrap();
                rt.block_on(async {
                    let _ = exit_rx.await;
                });
                rt.shutdown_timeout(Duration::from_secs(2));
            })
            .expect("spawn server thread");
        let handle = handle_rx.recv().expect("server runtime handle");

        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let mut local = Local {
            _dir: dir,
            addr,
            service,
            counters,
            handle,
            exit: Some(exit_tx),
            thread: Some(thread),
            serving: None,
        };
        local.serve(listener);
        S3Server {
            endpoint: format!("http://{addr}"),
            bucket,
            region: "us-east-1".into(),
            access_key: ACCESS_KEY.into(),
            secret_key: SECRET_KEY.into(),
            root,
            key_prefix: String::new(),
            local: Some(local),
        }
    }

    fn external() -> Option<S3Server> {
        let endpoint = std::env::var("REPLICAD_TEST_S3_ENDPOINT")
            .ok()
            .filter(|s| !s.is_empty())?;
        let var = |name: &str, fallback: &str| {
            std::env::var(name)
                .or_else(|_| std::env::var(fallback))
                .unwrap_or_else(|_| {
                    panic!("REPLICAD_TEST_S3_ENDPOINT is set, so {name} (or {fallback}) must be")
                })
        };
        let bucket = std::env::var("REPLICAD_TEST_S3_BUCKET")
            .expect("REPLICAD_TEST_S3_ENDPOINT is set, so REPLICAD_TEST_S3_BUCKET must be");
        Some(S3Server {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            bucket,
            region: std::env::var("REPLICAD_TEST_S3_REGION").unwrap_or_else(|_| "us-east-1".into()),
            access_key: var("REPLICAD_TEST_S3_ACCESS_KEY", "AWS_ACCESS_KEY_ID"),
            secret_key: var("REPLICAD_TEST_S3_SECRET_KEY", "AWS_SECRET_ACCESS_KEY"),
            root: PathBuf::new(),
            key_prefix: format!("replicad-test-{}/", random_hex()),
            local: None,
        })
    }

    /// True when the tests run against `REPLICAD_TEST_S3_ENDPOINT` rather than the in-process
    /// server: no stop/restart, no request counts, no direct access to the stored files.
    pub fn is_external(&self) -> bool {
        self.local.is_none()
    }

    /// True if [`S3Server::request_count`] and [`S3Server::requests_by_op`] mean anything.
    pub fn counts_requests(&self) -> bool {
        self.local.is_some()
    }

    /// The replica URL for `prefix`:
    /// `s3://{bucket}/{key_prefix}{prefix}?endpoint={endpoint}&region={region}&force-path-style=true`.
    pub fn url(&self, prefix: &str) -> String {
        format!(
            "s3://{}/{}{}?endpoint={}&region={}&force-path-style=true",
            self.bucket,
            self.key_prefix,
            prefix.trim_start_matches('/'),
            self.endpoint,
            self.region
        )
    }

    /// The full object key for `key` (with [`S3Server::key_prefix`]).
    pub fn key(&self, key: &str) -> String {
        format!("{}{}", self.key_prefix, key.trim_start_matches('/'))
    }

    /// The file that holds the object `key` (in-process server only; `key` as in
    /// [`S3Server::key`], without the key prefix, which is empty there).
    pub fn object_path(&self, key: &str) -> PathBuf {
        assert!(
            !self.is_external(),
            "object_path: no files behind an external endpoint"
        );
        self.root.join(&self.bucket).join(key)
    }

    /// Stops serving: the listener is closed (new connections are refused) and open
    /// connections are dropped. The data is kept. A no-op when already stopped.
    ///
    /// Panics for an external endpoint.
    pub async fn stop(&mut self) {
        let local = self.local_mut("stop");
        if let Some(s) = local.serving.take() {
            let _ = s.stop.send(());
            let _ = s.task.await;
        }
    }

    /// Serves the same data on the same port again (stopping first if still serving).
    /// Counts go on from where they were.
    ///
    /// Panics for an external endpoint.
    pub async fn restart(&mut self) {
        self.stop().await;
        let local = self.local_mut("restart");
        // The port was ours a moment ago; another process could take it in between, which
        // is not worth more than a clear failure.
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match std::net::TcpListener::bind(local.addr) {
                Ok(l) => break l,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("S3Server::restart: bind {}: {e}; retrying", local.addr);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("S3Server::restart: cannot bind {} again: {e}", local.addr),
            }
        };
        local.serve(listener);
    }

    /// True while serving (always true for an external endpoint).
    pub fn is_serving(&self) -> bool {
        self.local.as_ref().is_none_or(|l| l.serving.is_some())
    }

    /// HTTP requests received since start (including ones refused by authentication).
    /// Always 0 for an external endpoint.
    pub fn request_count(&self) -> u64 {
        self.local
            .as_ref()
            .map_or(0, |l| l.counters.total.load(Ordering::SeqCst))
    }

    /// Requests since start by S3 operation name ("PutObject", "ListObjectsV2", "GetObject",
    /// "HeadObject", "DeleteObjects", "CreateMultipartUpload", "UploadPart",
    /// "CompleteMultipartUpload", ...). Unsigned requests are counted here (and refused); a
    /// request with a bad signature, or one s3s could not route to an operation, is only in
    /// [`S3Server::request_count`]. Empty for an external endpoint.
    pub fn requests_by_op(&self) -> BTreeMap<String, u64> {
        self.local
            .as_ref()
            .map_or_else(BTreeMap::new, |l| l.counters.by_op.lock().unwrap().clone())
    }

    /// Requests of one operation since start.
    pub fn op_count(&self, op: &str) -> u64 {
        self.requests_by_op().get(op).copied().unwrap_or(0)
    }

    /// While `deny`, every signed request is refused with `403 AccessDenied`, as a bucket
    /// policy denying these credentials would. Panics for an external endpoint.
    pub fn deny_access(&self, deny: bool) {
        let local = self
            .local
            .as_ref()
            .expect("S3Server::deny_access is not possible with REPLICAD_TEST_S3_ENDPOINT");
        local.counters.deny.store(deny, Ordering::SeqCst);
    }

    /// Makes the next `n` signed requests of operation `op` (a name as in
    /// [`S3Server::requests_by_op`]) fail with `500 InternalError` before they do anything;
    /// `n = 0` clears it. The failed requests are counted. Panics for an external endpoint.
    pub fn fail_next(&self, op: &str, n: u64) {
        let local = self
            .local
            .as_ref()
            .expect("S3Server::fail_next is not possible with REPLICAD_TEST_S3_ENDPOINT");
        local
            .counters
            .faults
            .lock()
            .unwrap()
            .insert(op.to_string(), n);
    }

    /// While `on`, every request `op` (`GetObject`, `PutObject`) on an `.ltx` object waits in
    /// the server before it is served, as behind a stalled network; `false` lets the waiting
    /// ones go on. Panics for an external endpoint.
    pub fn hold_ltx(&self, op: &str, on: bool) {
        let local = self
            .local
            .as_ref()
            .expect("S3Server::hold_ltx is not possible with REPLICAD_TEST_S3_ENDPOINT");
        let mut held = local.counters.hold_ltx.lock().unwrap();
        if on {
            held.insert(op.to_string());
        } else {
            held.remove(op);
        }
    }

    /// Requests on `.ltx` objects that [`S3Server::hold_ltx`] has held so far.
    pub fn held_ltx(&self) -> u64 {
        self.local
            .as_ref()
            .map_or(0, |l| l.counters.held.load(Ordering::SeqCst))
    }

    /// Injected failures of `op` not served yet.
    pub fn failures_left(&self, op: &str) -> u64 {
        self.local.as_ref().map_or(0, |l| {
            l.counters
                .faults
                .lock()
                .unwrap()
                .get(op)
                .copied()
                .unwrap_or(0)
        })
    }

    /// Sets every count back to 0 (injected failures stay).
    pub fn reset_counts(&self) {
        if let Some(l) = &self.local {
            l.counters.total.store(0, Ordering::SeqCst);
            l.counters.by_op.lock().unwrap().clear();
        }
    }

    /// An SDK client for the bucket, to look at or plant objects behind the backend's back.
    /// Its requests are counted like any other.
    pub fn sdk(&self) -> aws_sdk_s3::Client {
        use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
        let conf = aws_sdk_s3::config::Builder::new()
            .behavior_version(BehaviorVersion::latest())
            .credentials_provider(Credentials::new(
                &self.access_key,
                &self.secret_key,
                None,
                None,
                "replicad-test",
            ))
            .region(Region::new(self.region.clone()))
            .endpoint_url(&self.endpoint)
            .force_path_style(true)
            .build();
        aws_sdk_s3::Client::from_conf(conf)
    }

    /// Keys under `prefix` (given without the key prefix, which is stripped from the result
    /// too), sorted, by listing through the SDK.
    pub async fn list_keys(&self, prefix: &str) -> Vec<String> {
        let sdk = self.sdk();
        let mut pages = sdk
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(self.key(prefix))
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.expect("ListObjectsV2");
            for o in page.contents() {
                let k = o.key().unwrap_or_default();
                out.push(k.strip_prefix(&self.key_prefix).unwrap_or(k).to_string());
            }
        }
        out.sort();
        out
    }

    fn local_mut(&mut self, what: &str) -> &mut Local {
        self.local.as_mut().unwrap_or_else(|| {
            panic!("S3Server::{what} is not possible with REPLICAD_TEST_S3_ENDPOINT")
        })
    }
}

impl Local {
    fn serve(&mut self, listener: std::net::TcpListener) {
        listener.set_nonblocking(true).unwrap();
        let (stop_tx, stop_rx) = oneshot::channel();
        let service = self.service.clone();
        let counters = self.counters.clone();
        let task = self.handle.spawn(async move {
            let listener = TcpListener::from_std(listener).expect("tokio listener");
            serve(listener, service, counters, stop_rx).await;
        });
        self.serving = Some(Serving {
            stop: stop_tx,
            task,
        });
    }
}

/// Accepts connections until `stop` fires, then closes the listener and drops every open
/// connection.
async fn serve(
    listener: TcpListener,
    service: S3Service,
    counters: Arc<Counters>,
    mut stop: oneshot::Receiver<()>,
) {
    let http = ConnBuilder::new(TokioExecutor::new());
    let mut conns = JoinSet::new();
    // Conditional writes are served one at a time, each once its body is whole.
    let atomic = Arc::new(tokio::sync::Mutex::new(()));
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((socket, _)) = accepted else { continue };
                let service = service.clone();
                let counters = counters.clone();
                let atomic = atomic.clone();
                let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    counters.total.fetch_add(1, Ordering::SeqCst);
                    let service = service.clone();
                    let atomic = atomic.clone();
                    async move {
                        let conditional = req.headers().contains_key("if-none-match")
                            || req.headers().contains_key("if-match");
                        if !conditional || req.method() == hyper::Method::GET {
                            return service.call(req.map(s3s::Body::from)).await;
                        }
                        // s3s-fs checks a write's condition before it reads the body: a request
                        // stalled mid-body would pass its check and then overwrite. S3 decides
                        // atomically once the whole request is in; so do we.
                        use http_body_util::BodyExt;
                        let (parts, body) = req.into_parts();
                        let bytes = match body.collect().await {
                            Ok(b) => b.to_bytes(),
                            // The client went away mid-body: nothing is written, as on S3.
                            Err(_) => {
                                let mut r = hyper::Response::new(s3s::Body::from(bytes::Bytes::new()));
                                *r.status_mut() = hyper::StatusCode::BAD_REQUEST;
                                return Ok(r);
                            }
                        };
                        let _one_at_a_time = atomic.lock().await;
                        service
                            .call(hyper::Request::from_parts(parts, s3s::Body::from(bytes)))
                            .await
                    }
                });
                let http = http.clone();
                conns.spawn(async move {
                    let _ = http.serve_connection(TokioIo::new(socket), svc).await;
                });
            }
        }
    }
    drop(listener);
    conns.shutdown().await;
}

impl Drop for S3Server {
    fn drop(&mut self) {
        match self.local.as_mut() {
            Some(local) => {
                // Dropping the runtime ends the serving task and every connection.
                if let Some(exit) = local.exit.take() {
                    let _ = exit.send(());
                }
                if let Some(t) = local.thread.take() {
                    let _ = t.join();
                }
            }
            None => self.delete_external_prefix(),
        }
    }
}

impl S3Server {
    /// Best-effort removal of this test's objects from an external bucket (on a thread of its
    /// own, since `drop` may run inside a runtime).
    fn delete_external_prefix(&self) {
        if std::thread::panicking() || std::env::var_os("REPLICAD_TEST_KEEP").is_some() {
            eprintln!(
                "S3 objects kept under s3://{}/{}",
                self.bucket, self.key_prefix
            );
            return;
        }
        let sdk = self.sdk();
        let bucket = self.bucket.clone();
        let prefix = self.key_prefix.clone();
        let t = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                use aws_sdk_s3::types::{Delete, ObjectIdentifier};
                let mut pages = sdk
                    .list_objects_v2()
                    .bucket(&bucket)
                    .prefix(&prefix)
                    .into_paginator()
                    .send();
                let mut keys = Vec::new();
                while let Some(Ok(page)) = pages.next().await {
                    keys.extend(
                        page.contents()
                            .iter()
                            .filter_map(|o| o.key().map(String::from)),
                    );
                }
                for batch in keys.chunks(1000) {
                    let ids = batch
                        .iter()
                        .filter_map(|k| ObjectIdentifier::builder().key(k).build().ok())
                        .collect();
                    if let Ok(d) = Delete::builder().set_objects(Some(ids)).quiet(true).build() {
                        let _ = sdk.delete_objects().bucket(&bucket).delete(d).send().await;
                    }
                }
            });
        });
        let _ = t.join();
    }
}

/// Writes `bytes` as the object `key` straight into the in-process server's files, without
/// a request (fast, for planting many objects). The object has no stored metadata.
pub fn plant_file(server: &S3Server, key: &str, bytes: &[u8]) {
    let p = server.object_path(key);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, bytes).unwrap();
}
