//! One conformance suite for every replica backend: the semantics written down in
//! `src/storage/mod.rs`, checked the same way against the `file` backend (a temp dir), the
//! `s3` backend (the in-process S3 server of `common::s3`, or `REPLICAD_TEST_S3_ENDPOINT`), `gs`
//! and `abs` (fake-gcs-server, Azurite), `webdav` (`rclone serve webdav` with basic auth) and
//! `sftp` (OpenSSH's sshd with `internal-sftp`).
//!
//! [`conformance`] runs every section against a fresh replica of the backend and reports all
//! failed sections at once: empty listings; put then list (sorted by TXID range, one level
//! only, sizes, sane `created_at`, headers); exact reads whole and from offsets (ranged GETs),
//! including from the very end; NotFound for missing objects; failed puts leave nothing;
//! whole overwrites; deletes of present and missing files; 16 concurrent puts; a 12 MiB object
//! (multipart on S3); foreign names and a sibling replica skipped; 1100 files (more than one
//! listing page) listed and deleted; the temporary files of interrupted writes swept once old,
//! and nothing else; encrypted files (the age wrapper over the backend) deleted under their
//! own names.
//!
//! Below it, S3-only tests: request shapes (multipart parts, DeleteObjects batches), error
//! classes (missing bucket, bad credentials, outage, injected 500s), an aborted multipart
//! overwrite leaving the old object whole, and a GET resumed after its connection drops.

use crate::common;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::AsyncReadExt;

use common::TestDir;
use common::emulators::Emulator;
use common::s3::{S3Server, plant_file};
use common::sshd::Sshd;
use replicad::ltx::{self, Codec, Encoder, HEADER_FLAG_NO_CHECKSUM, Header, TxId};
use replicad::storage::file::FileClient;
use replicad::storage::s3::{S3Client, S3Config, Secret};
use replicad::storage::tmp_names::Swept;
use replicad::storage::{
    AnyClient, LtxFileInfo, PROBE_VERSION, ReplicaClient, StorageError, WriteIf, put_new,
};

use sections::*;

const MIB: usize = 1024 * 1024;

/// A backend under test, with what the suite needs beyond the client: a way to plant objects
/// the client did not write, and a sibling replica whose location extends this one's.
struct Backend<'a> {
    client: AnyClient,
    /// The client is the age wrapper (encrypting) around the backend.
    age: bool,
    kind: Kind<'a>,
    /// Scratch space for source files.
    scratch: PathBuf,
}

enum Kind<'a> {
    File {
        root: PathBuf,
    },
    S3 {
        server: &'a S3Server,
        prefix: String,
    },
    /// GCS, Azure or WebDAV, in an emulator.
    Object {
        emu: &'a Emulator,
        prefix: String,
    },
    /// A directory of an sshd on this machine (planted into straight through the file system).
    Sftp {
        sshd: &'a Sshd,
        rel: String,
        root: PathBuf,
    },
}

fn s3_client(server: &S3Server, prefix: &str) -> AnyClient {
    let cfg = S3Config::from_url(&server.url(prefix)).unwrap();
    let cfg = S3Config {
        access_key_id: Some(server.access_key.clone()),
        secret_access_key: Some(Secret(server.secret_key.clone())),
        part_size: 5 * MIB as u64,
        ..cfg
    };
    AnyClient::S3(S3Client::new(cfg))
}

impl Backend<'_> {
    fn name(&self) -> &'static str {
        match self.kind {
            Kind::File { .. } if self.age => "file+age",
            Kind::File { .. } => "file",
            Kind::S3 { .. } => "s3",
            Kind::Object { emu, .. } => emu.name(),
            Kind::Sftp { .. } => "sftp",
        }
    }

    /// The plaintext size of a file as listed or put: its size, or through the age wrapper
    /// (whose sizes are the ciphertext's, larger) the length of its decrypted body.
    async fn plain_size(&self, f: &LtxFileInfo) -> u64 {
        if !self.age {
            assert!(!f.encrypted, "plain backend marked a file encrypted");
            return f.size;
        }
        let plain = read_all(self, f.level, f.min_txid.0, f.max_txid.0, 0)
            .await
            .len() as u64;
        assert!(
            f.encrypted && f.size > plain,
            "age: size {} of {plain} plaintext bytes",
            f.size
        );
        plain
    }

    /// The object key (S3, without the server's key prefix) or path (file) of `name` in `level`.
    fn level_location(&self, level: u8, name: &str) -> String {
        match &self.kind {
            Kind::File { root } | Kind::Sftp { root, .. } => root
                .join("ltx")
                .join(level.to_string())
                .join(name)
                .display()
                .to_string(),
            Kind::S3 { server, .. } => {
                let AnyClient::S3(c) = &self.client else {
                    unreachable!()
                };
                let key = c.key(level, TxId(1), TxId(1));
                let dir = key.rsplit_once('/').map_or("", |(d, _)| d);
                let full = format!("{dir}/{name}");
                full.strip_prefix(&server.key_prefix)
                    .unwrap_or(&full)
                    .to_string()
            }
            Kind::Object { prefix, .. } => format!("{prefix}/ltx/{level}/{name}"),
        }
    }

    /// Stores `bytes` under `name` in `level` without going through the client.
    async fn plant(&self, level: u8, name: &str, bytes: &[u8]) {
        self.plant_at(&self.level_location(level, name), bytes)
            .await;
    }

    /// Stores `bytes` at `loc` (a path, or a key without the server's prefix) without the
    /// client.
    async fn plant_at(&self, loc: &str, bytes: &[u8]) {
        match &self.kind {
            Kind::File { .. } | Kind::Sftp { .. } => {
                let p = Path::new(loc);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, bytes).unwrap();
            }
            Kind::S3 { server, .. } => {
                server
                    .sdk()
                    .put_object()
                    .bucket(&server.bucket)
                    .key(server.key(loc))
                    .body(bytes.to_vec().into())
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("plant {loc}: {e:?}"));
            }
            Kind::Object { emu, prefix } => {
                let op = emu.config(prefix).build().unwrap();
                if let Some((dir, _)) = loc.rsplit_once('/') {
                    // WebDAV: the client makes collections itself, not OpenDAL's writer.
                    op.create_dir(&format!("{dir}/")).await.unwrap();
                }
                op.write(loc, bytes.to_vec())
                    .await
                    .unwrap_or_else(|e| panic!("plant {loc}: {e:?}"));
            }
        }
    }

    /// The path (file, SFTP) or key (WebDAV) of `name` in `level`, or at the root (`None`).
    /// Not for S3, GCS or Azure, which keep no temporary files.
    fn tmp_location(&self, level: Option<u8>, name: &str) -> String {
        match (level, &self.kind) {
            (Some(l), _) => self.level_location(l, name),
            (None, Kind::File { root } | Kind::Sftp { root, .. }) => {
                root.join(name).display().to_string()
            }
            (None, Kind::Object { prefix, .. }) => format!("{prefix}/{name}"),
            (None, Kind::S3 { .. }) => unreachable!("S3 keeps no temporary files"),
        }
    }

    /// Stores a file named `name` in `level` or at the root, without the client.
    async fn plant_tmp(&self, level: Option<u8>, name: &str) {
        self.plant_at(&self.tmp_location(level, name), name.as_bytes())
            .await;
    }

    /// Whether `name` is still in `level` or at the root.
    async fn tmp_exists(&self, level: Option<u8>, name: &str) -> bool {
        let loc = self.tmp_location(level, name);
        match &self.kind {
            Kind::Object { emu, prefix } => emu
                .config(prefix)
                .build()
                .unwrap()
                .exists(&loc)
                .await
                .unwrap(),
            _ => Path::new(&loc).exists(),
        }
    }

    /// Plants many small objects quickly: straight into the in-process server's files, or 32
    /// requests at a time to an external endpoint.
    async fn plant_many(&self, level: u8, names: &[String]) {
        match &self.kind {
            Kind::S3 { server, .. } if !server.is_external() => {
                for n in names {
                    plant_file(server, &self.level_location(level, n), n.as_bytes());
                }
            }
            Kind::S3 { server, .. } => {
                let sdk = server.sdk();
                for chunk in names.chunks(32) {
                    let mut set = tokio::task::JoinSet::new();
                    for n in chunk {
                        let req = sdk
                            .put_object()
                            .bucket(&server.bucket)
                            .key(server.key(&self.level_location(level, n)))
                            .body(n.as_bytes().to_vec().into());
                        set.spawn(req.send());
                    }
                    while let Some(r) = set.join_next().await {
                        r.unwrap().expect("plant");
                    }
                }
            }
            Kind::File { .. } | Kind::Sftp { .. } => {
                for n in names {
                    self.plant(level, n, n.as_bytes()).await;
                }
            }
            Kind::Object { emu, prefix } => {
                let op = emu.config(prefix).build().unwrap();
                let loc = self.level_location(level, "x");
                if let Some((dir, _)) = loc.rsplit_once('/') {
                    op.create_dir(&format!("{dir}/")).await.unwrap();
                }
                for chunk in names.chunks(32) {
                    let mut set = tokio::task::JoinSet::new();
                    for n in chunk {
                        let (op, loc) = (op.clone(), self.level_location(level, n));
                        let body = n.as_bytes().to_vec();
                        set.spawn(async move { op.write(&loc, body).await });
                    }
                    while let Some(r) = set.join_next().await {
                        r.unwrap().expect("plant");
                    }
                }
            }
        }
    }

    /// Removes level `level` behind the client's back: its directory or collection with
    /// everything in it, or (S3, GCS, Azure: no directories) its objects.
    async fn remove_level(&self, level: u8) {
        let loc = self.level_location(level, "x");
        let dir = loc.rsplit_once('/').map_or("", |(d, _)| d).to_string();
        match &self.kind {
            Kind::File { .. } | Kind::Sftp { .. } => std::fs::remove_dir_all(&dir).unwrap(),
            Kind::Object { emu, prefix } => {
                let op = emu.config(prefix).build().unwrap();
                op.delete_with(&format!("{dir}/"))
                    .recursive(true)
                    .await
                    .unwrap();
            }
            Kind::S3 { .. } => {
                let files = self.client.list(level).await.unwrap();
                self.client.delete(&files).await.unwrap();
            }
        }
    }

    /// A client for the replica at this one's location with "2" appended (`/x` -> `/x2`).
    fn sibling(&self) -> AnyClient {
        match &self.kind {
            Kind::File { root } => {
                let mut s = root.as_os_str().to_owned();
                s.push("2");
                AnyClient::File(FileClient::new(PathBuf::from(s)))
            }
            Kind::S3 { server, prefix } => s3_client(server, &format!("{prefix}2")),
            Kind::Object { emu, prefix } => emu.client(&format!("{prefix}2")),
            Kind::Sftp { sshd, rel, .. } => sshd.client(&format!("{rel}2")),
        }
    }
}

/// A valid LTX file covering `min..=max` with `pages` random (incompressible) pages of
/// `page_size` bytes, written at `timestamp_ms`.
fn ltx_file(
    min: u64,
    max: u64,
    pages: u32,
    page_size: u32,
    timestamp_ms: i64,
    seed: u64,
) -> Vec<u8> {
    let h = Header {
        flags: HEADER_FLAG_NO_CHECKSUM,
        page_size,
        commit: pages,
        min_txid: TxId(min),
        max_txid: TxId(max),
        timestamp: timestamp_ms,
        ..Header::default()
    };
    let mut enc = Encoder::new(Vec::new(), h, Codec::Lz4).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut page = vec![0u8; page_size as usize];
    for pgno in 1..=pages {
        if pgno == ltx::lock_pgno(page_size) {
            continue;
        }
        rng.fill_bytes(&mut page);
        enc.encode_page(pgno, &page).unwrap();
    }
    enc.finish(0).unwrap().0
}

/// `len` bytes that start with a valid LTX header for `min..=max` at `timestamp_ms` (all that
/// `read_header` looks at) and go on with pseudo-random noise: a large object that is quick
/// to make in a debug build.
fn big_object(len: usize, min: u64, max: u64, timestamp_ms: i64, seed: u64) -> Vec<u8> {
    let h = Header {
        flags: HEADER_FLAG_NO_CHECKSUM,
        page_size: 4096,
        commit: 1,
        min_txid: TxId(min),
        max_txid: TxId(max),
        timestamp: timestamp_ms,
        ..Header::default()
    };
    let mut out = Vec::with_capacity(len + 8);
    out.extend_from_slice(&h.encode().unwrap());
    let mut x = seed | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// What a put of one file is expected to look like.
struct Put {
    level: u8,
    min: u64,
    max: u64,
    bytes: Vec<u8>,
    ts: i64,
}

impl Put {
    fn new(level: u8, min: u64, max: u64, pages: u32, seed: u64) -> Put {
        let ts = now_ms() - 3_600_000 + seed as i64;
        let bytes = ltx_file(min, max, pages, 4096, ts, seed);
        Put {
            level,
            min,
            max,
            bytes,
            ts,
        }
    }

    fn name(&self) -> String {
        format!(
            "L{}/{}",
            self.level,
            ltx::format_filename(TxId(self.min), TxId(self.max))
        )
    }
}

/// Writes `p` to a scratch file and puts it; returns the client's answer.
async fn put(b: &Backend<'_>, p: &Put) -> Result<LtxFileInfo, StorageError> {
    let src = b.scratch.join(format!(
        "src-{}-{}-{}-{}",
        p.level,
        p.min,
        p.max,
        rand::random::<u64>()
    ));
    std::fs::write(&src, &p.bytes).unwrap();
    let r = b
        .client
        .put(p.level, TxId(p.min), TxId(p.max), &src, p.ts)
        .await;
    std::fs::remove_file(&src).unwrap();
    r
}

/// `created_at` is sane if it is either the LTX header timestamp (file mtime) or the time
/// the object was written (S3 LastModified, whole seconds).
fn assert_created_sane(what: &str, got: DateTime<Utc>, ts: i64, written: (i64, i64)) {
    let g = got.timestamp_millis();
    let is_header = (g - ts).abs() <= 1_000;
    let is_write_time = g >= written.0 - 2_000 && g <= written.1 + 2_000;
    assert!(
        is_header || is_write_time,
        "{what}: created_at {got} is neither the header timestamp {} nor the write time \
         ({} .. {})",
        DateTime::<Utc>::from_timestamp_millis(ts).unwrap(),
        DateTime::<Utc>::from_timestamp_millis(written.0).unwrap(),
        DateTime::<Utc>::from_timestamp_millis(written.1).unwrap(),
    );
}

async fn read_all(b: &Backend<'_>, level: u8, min: u64, max: u64, offset: u64) -> Vec<u8> {
    let mut r = b
        .client
        .open(level, TxId(min), TxId(max), offset)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{}: open L{level}/{min:016x}-{max:016x} at {offset}: {e}",
                b.name()
            )
        });
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap_or_else(|e| {
        panic!(
            "{}: read L{level}/{min:016x}-{max:016x} from {offset}: {e}",
            b.name()
        )
    });
    out
}

/// Asserts equal bytes without printing megabytes.
#[track_caller]
fn assert_bytes(what: &str, got: &[u8], want: &[u8]) {
    if got != want {
        let first = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{what}: {} bytes read, {} expected; first difference at byte {first}",
            got.len(),
            want.len()
        );
    }
}

fn ranges(files: &[LtxFileInfo]) -> Vec<(u8, u64, u64)> {
    files
        .iter()
        .map(|f| (f.level, f.min_txid.0, f.max_txid.0))
        .collect()
}

async fn list(b: &Backend<'_>, level: u8) -> Vec<LtxFileInfo> {
    b.client
        .list(level)
        .await
        .unwrap_or_else(|e| panic!("{}: list level {level}: {e}", b.name()))
}

fn info(level: u8, min: u64, max: u64) -> LtxFileInfo {
    LtxFileInfo {
        level,
        min_txid: TxId(min),
        max_txid: TxId(max),
        size: 0,
        created_at: DateTime::<Utc>::default(),
        encrypted: false,
    }
}

#[track_caller]
fn assert_not_found<T>(what: &str, r: Result<T, StorageError>) {
    match r {
        Err(StorageError::NotFound(_)) => {}
        Err(e) => panic!("{what}: expected NotFound, got {e:?}"),
        Ok(_) => panic!("{what}: expected NotFound, got Ok"),
    }
}

/// Where the backends under test live: a fresh replica location per section.
enum Env<'a> {
    File {
        dir: PathBuf,
        /// Run through the age wrapper (encrypting to a fresh key).
        age: Option<std::sync::Arc<replicad::storage::age::keys::AgeKeys>>,
    },
    S3 {
        server: &'a S3Server,
        scratch: PathBuf,
    },
    Object {
        emu: &'a Emulator,
        scratch: PathBuf,
    },
    Sftp {
        sshd: &'a Sshd,
        scratch: PathBuf,
    },
}

impl<'a> Env<'a> {
    /// A backend with an empty replica of its own, named after the section.
    fn backend(&self, section: &str) -> Backend<'a> {
        match self {
            Env::File { dir, age } => {
                let root = dir.join(section).join("replica");
                let scratch = dir.join(section).join("scratch");
                std::fs::create_dir_all(&scratch).unwrap();
                let client = AnyClient::File(FileClient::new(root.clone()));
                Backend {
                    age: age.is_some(),
                    client: match age {
                        Some(keys) => client.with_age(keys.clone()),
                        None => client,
                    },
                    kind: Kind::File { root },
                    scratch,
                }
            }
            Env::S3 { server, scratch } => {
                let prefix = format!("{section}/db/app.db");
                let scratch = scratch.join(section);
                std::fs::create_dir_all(&scratch).unwrap();
                Backend {
                    age: false,
                    client: s3_client(server, &prefix),
                    kind: Kind::S3 { server, prefix },
                    scratch,
                }
            }
            Env::Object { emu, scratch } => {
                let prefix = format!("{section}/db/app.db");
                let scratch = scratch.join(section);
                std::fs::create_dir_all(&scratch).unwrap();
                Backend {
                    age: false,
                    client: emu.client(&prefix),
                    kind: Kind::Object { emu, prefix },
                    scratch,
                }
            }
            Env::Sftp { sshd, scratch } => {
                let rel = format!("{section}/db/app.db");
                let scratch = scratch.join(section);
                std::fs::create_dir_all(&scratch).unwrap();
                Backend {
                    age: false,
                    client: sshd.client(&rel),
                    kind: Kind::Sftp {
                        sshd,
                        root: sshd.root.join(&rel),
                        rel,
                    },
                    scratch,
                }
            }
        }
    }
}

/// Polls a future, turning a panic inside it into an `Err` with the panic message.
struct CatchUnwind<'a>(Pin<Box<dyn Future<Output = ()> + 'a>>);

impl Future for CatchUnwind<'_> {
    type Output = Result<(), String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let fut = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(())) => Poll::Ready(Ok(())),
            Err(p) => Poll::Ready(Err(p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into()))),
        }
    }
}

/// The suite: every section against a fresh replica of the backend. All sections run; the
/// test fails at the end with every section that failed.
async fn conformance(env: &Env<'_>) {
    let mut failed = Vec::new();
    macro_rules! sections {
        ($($f:ident),* $(,)?) => {$(
            let b = env.backend(stringify!($f));
            if let Err(msg) = CatchUnwind(Box::pin($f(&b))).await {
                failed.push(format!("[{}] {}: {msg}", b.name(), stringify!($f)));
            }
        )*};
    }
    sections!(
        empty_replica,
        put_then_list_by_level_sorted,
        open_reads_exact_bytes_and_tails,
        open_at_the_end_is_empty,
        open_missing_is_not_found,
        failed_put_leaves_nothing,
        put_never_replaces_an_object,
        delete_removes_and_tolerates_missing,
        concurrent_puts_all_land,
        large_object_round_trips,
        foreign_names_are_skipped,
        many_files_list_and_delete,
        aux_objects_round_trip_beside_the_levels,
        put_after_the_level_vanished,
        leftover_tmp_files_are_swept,
        encrypted_files_are_deleted_under_their_own_names,
    );
    assert!(
        failed.is_empty(),
        "{} conformance section(s) failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_backend_conforms() {
    let dir = TestDir::new("conformance-file");
    conformance(&Env::File {
        dir: dir.path().to_path_buf(),
        age: None,
    })
    .await;
}

/// The age wrapper keeps the same semantics over a file backend (its sizes are the
/// ciphertext's; reads, offsets and ranges are of the plaintext).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_wrapped_file_backend_conforms() {
    let dir = TestDir::new("conformance-age");
    let (identity, public) = replicad::storage::age::keys::generate_identity();
    let id = dir.path().join("id.txt");
    std::fs::write(&id, identity).unwrap();
    let keys = replicad::storage::age::keys::AgeKeys::load(&[public], &[id.display().to_string()])
        .unwrap();
    conformance(&Env::File {
        dir: dir.path().to_path_buf(),
        age: Some(std::sync::Arc::new(keys)),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_backend_conforms() {
    let server = S3Server::start().await;
    let dir = TestDir::new("conformance-s3");
    conformance(&Env::S3 {
        server: &server,
        scratch: dir.path().to_path_buf(),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_backend_conforms() {
    let Some(emu) = Emulator::gcs() else { return };
    let dir = TestDir::new("conformance-gcs");
    conformance(&Env::Object {
        emu: &emu,
        scratch: dir.path().to_path_buf(),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_backend_conforms() {
    let Some(emu) = Emulator::azurite() else {
        return;
    };
    let dir = TestDir::new("conformance-azure");
    conformance(&Env::Object {
        emu: &emu,
        scratch: dir.path().to_path_buf(),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webdav_backend_conforms() {
    let Some(emu) = Emulator::webdav(true) else {
        return;
    };
    let dir = TestDir::new("conformance-webdav");
    conformance(&Env::Object {
        emu: &emu,
        scratch: dir.path().to_path_buf(),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sftp_backend_conforms() {
    let Some(sshd) = Sshd::start() else { return };
    let dir = TestDir::new("conformance-sftp");
    conformance(&Env::Sftp {
        sshd: &sshd,
        scratch: dir.path().to_path_buf(),
    })
    .await;
}

mod s3_only;
mod sections;
