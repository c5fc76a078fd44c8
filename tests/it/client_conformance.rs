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
//! listing page) listed and deleted.
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
use replicad::storage::{
    AnyClient, LtxFileInfo, PROBE_VERSION, ReplicaClient, StorageError, WriteIf, put_new,
};

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
        let loc = self.level_location(level, name);
        match &self.kind {
            Kind::File { .. } | Kind::Sftp { .. } => {
                let p = Path::new(&loc);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, bytes).unwrap();
            }
            Kind::S3 { server, .. } => {
                server
                    .sdk()
                    .put_object()
                    .bucket(&server.bucket)
                    .key(server.key(&loc))
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
                op.write(&loc, bytes.to_vec())
                    .await
                    .unwrap_or_else(|e| panic!("plant {loc}: {e:?}"));
            }
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
    );
    assert!(
        failed.is_empty(),
        "{} conformance section(s) failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// A level removed behind the client's back (someone emptied the replica) takes new puts
/// again: backends that cache the directories they made make them again.
async fn put_after_the_level_vanished(b: &Backend<'_>) {
    let name = b.name();
    put(b, &Put::new(5, 1, 1, 1, 90)).await.unwrap();
    b.remove_level(5).await;
    assert_eq!(list(b, 5).await, vec![], "{name}: level 5 removed");
    let again = Put::new(5, 2, 2, 1, 91);
    put(b, &again)
        .await
        .unwrap_or_else(|e| panic!("{name}: put after the level vanished: {e}"));
    assert_eq!(ranges(&list(b, 5).await), vec![(5, 2, 2)], "{name}");
    assert_bytes(name, &read_all(b, 5, 2, 2, 0).await, &again.bytes);
}

/// Auxiliary objects (the single-writer lease): missing reads as `None`, a write replaces the
/// whole object, listings never show it, delete tolerates a missing one.
async fn aux_objects_round_trip_beside_the_levels(b: &Backend<'_>) {
    let name = b.name();
    let c = &b.client;
    assert_eq!(
        c.read_aux("replicad.lease").await.unwrap(),
        None,
        "{name}: missing"
    );
    c.write_aux("replicad.lease", b"first, longer value".to_vec())
        .await
        .unwrap();
    c.write_aux("replicad.lease", b"second".to_vec())
        .await
        .unwrap();
    assert_eq!(
        c.read_aux("replicad.lease").await.unwrap().as_deref(),
        Some(&b"second"[..]),
        "{name}: a rewrite replaces the whole object"
    );
    assert_eq!(
        c.list_all().await.unwrap(),
        vec![],
        "{name}: listed an aux object"
    );
    c.delete_aux("replicad.lease").await.unwrap();
    assert_eq!(
        c.read_aux("replicad.lease").await.unwrap(),
        None,
        "{name}: deleted"
    );
    c.delete_aux("replicad.lease").await.unwrap();
}

/// An empty replica: every level lists empty.
async fn empty_replica(b: &Backend<'_>) {
    let name = b.name();
    assert_eq!(
        b.client.list_all().await.unwrap(),
        vec![],
        "{name}: empty replica"
    );
    for level in [0, 1, 9] {
        assert_eq!(list(b, level).await, vec![], "{name}: empty level {level}");
    }
}

/// Puts out of order on three levels: list sorts by (min, max), keeps to its level, has the
/// right sizes and sane times; put returns the same; headers read back.
async fn put_then_list_by_level_sorted(b: &Backend<'_>) {
    let name = b.name();
    let puts = [
        Put::new(0, 5, 9, 3, 1),
        Put::new(0, 2, 4, 2, 2),
        Put::new(0, 5, 5, 1, 3),
        Put::new(0, 1, 1, 4, 4),
        Put::new(1, 1, 9, 1, 5),
        Put::new(9, 1, 9, 6, 6),
    ];
    let before = now_ms();
    for p in &puts {
        let got = put(b, p)
            .await
            .unwrap_or_else(|e| panic!("{name}: put {}: {e}", p.name()));
        let after = now_ms();
        assert_eq!(
            (
                got.level,
                got.min_txid.0,
                got.max_txid.0,
                b.plain_size(&got).await
            ),
            (p.level, p.min, p.max, p.bytes.len() as u64),
            "{name}: put {} returned the wrong info",
            p.name()
        );
        assert_created_sane(
            &format!("{name}: put {} result", p.name()),
            got.created_at,
            p.ts,
            (before, after),
        );
    }
    let after = now_ms();
    assert_eq!(
        ranges(&list(b, 0).await),
        vec![(0, 1, 1), (0, 2, 4), (0, 5, 5), (0, 5, 9)],
        "{name}: level 0 listing"
    );
    assert_eq!(
        ranges(&list(b, 1).await),
        vec![(1, 1, 9)],
        "{name}: level 1 listing"
    );
    assert_eq!(
        ranges(&list(b, 9).await),
        vec![(9, 1, 9)],
        "{name}: level 9 listing"
    );
    for level in [2, 8] {
        assert_eq!(
            list(b, level).await,
            vec![],
            "{name}: level {level} must be empty"
        );
    }
    let all = b.client.list_all().await.unwrap();
    assert_eq!(
        ranges(&all),
        vec![
            (0, 1, 1),
            (0, 2, 4),
            (0, 5, 5),
            (0, 5, 9),
            (1, 1, 9),
            (9, 1, 9)
        ],
        "{name}: list_all"
    );
    for f in &all {
        let p = puts
            .iter()
            .find(|p| (p.level, p.min, p.max) == (f.level, f.min_txid.0, f.max_txid.0))
            .unwrap();
        assert_eq!(
            b.plain_size(f).await,
            p.bytes.len() as u64,
            "{name}: listed size of {}",
            p.name()
        );
        assert_created_sane(
            &format!("{name}: listed {}", p.name()),
            f.created_at,
            p.ts,
            (before, after),
        );
        let h = b
            .client
            .read_header(f)
            .await
            .unwrap_or_else(|e| panic!("{name}: read_header {}: {e}", p.name()));
        assert_eq!(
            (h.min_txid.0, h.max_txid.0, h.timestamp),
            (p.min, p.max, p.ts),
            "{name}: header of {}",
            p.name()
        );
    }
}

/// Reads: whole, and tails from several offsets (ranged GETs on S3).
async fn open_reads_exact_bytes_and_tails(b: &Backend<'_>) {
    let name = b.name();
    let puts = [Put::new(0, 1, 1, 1, 10), Put::new(0, 2, 3, 7, 11)];
    for p in &puts {
        put(b, p).await.unwrap();
    }
    for p in &puts {
        let whole = read_all(b, p.level, p.min, p.max, 0).await;
        assert_bytes(&format!("{name}: read {}", p.name()), &whole, &p.bytes);
        let n = p.bytes.len() as u64;
        for off in [1, 100, n / 2, n - 16, n - 1] {
            let tail = read_all(b, p.level, p.min, p.max, off).await;
            assert_bytes(
                &format!("{name}: read {} from {off}", p.name()),
                &tail,
                &p.bytes[off as usize..],
            );
        }
    }
}

/// "From byte offset to its end" with offset = size is an empty body.
async fn open_at_the_end_is_empty(b: &Backend<'_>) {
    let name = b.name();
    let p = Put::new(0, 1, 1, 2, 20);
    put(b, &p).await.unwrap();
    let n = p.bytes.len() as u64;
    match b.client.open(p.level, TxId(p.min), TxId(p.max), n).await {
        Ok(mut r) => {
            let mut v = Vec::new();
            r.read_to_end(&mut v).await.unwrap();
            assert!(
                v.is_empty(),
                "{name}: read from the end gave {} bytes",
                v.len()
            );
        }
        Err(e) => panic!(
            "{name}: open {} at offset {n} (its size) must give an empty body, got {e:?}",
            p.name()
        ),
    }
}

/// Missing objects are NotFound: in a level that has files, in one that has none, and for
/// read_header.
async fn open_missing_is_not_found(b: &Backend<'_>) {
    let name = b.name();
    assert_not_found(
        &format!("{name}: open on an empty replica"),
        b.client.open(0, TxId(1), TxId(1), 0).await,
    );
    put(b, &Put::new(0, 1, 1, 1, 30)).await.unwrap();
    assert_not_found(
        &format!("{name}: open missing L0"),
        b.client.open(0, TxId(3), TxId(3), 0).await,
    );
    assert_not_found(
        &format!("{name}: open missing L0 at an offset"),
        b.client.open(0, TxId(3), TxId(3), 10).await,
    );
    assert_not_found(
        &format!("{name}: open missing L6"),
        b.client.open(6, TxId(1), TxId(1), 0).await,
    );
    assert_not_found(
        &format!("{name}: read_header of a missing file"),
        b.client.read_header(&info(0, 2, 3)).await,
    );
}

/// A failed put (missing source) is an error, not retryable, and leaves nothing behind.
async fn failed_put_leaves_nothing(b: &Backend<'_>) {
    let name = b.name();
    let missing = b.scratch.join("no-such-source.ltx");
    let r = b.client.put(6, TxId(1), TxId(1), &missing, now_ms()).await;
    match &r {
        Err(e) => assert!(
            !e.is_retryable(),
            "{name}: missing source is retryable: {e:?}"
        ),
        Ok(_) => panic!("{name}: put from a missing source succeeded: {r:?}"),
    }
    assert_eq!(
        list(b, 6).await,
        vec![],
        "{name}: a failed put left an object"
    );
}

/// A put never replaces an object where the backend can check that atomically (a file
/// replica always; S3 once the lease's probe found conditional writes honoured, which
/// s3s-fs, MinIO, R2 and AWS do): a second put of other bytes is a `Conflict` and the first
/// object stays whole, and `put_new` of the very same bytes again (a retry whose first answer
/// was lost) succeeds.
async fn put_never_replaces_an_object(b: &Backend<'_>) {
    let name = b.name();
    // The probe the lease makes at acquire: it turns S3's conditional puts on.
    let _ = b
        .client
        .write_aux_if(
            "replicad.lease",
            b"probe".to_vec(),
            WriteIf::Version(PROBE_VERSION.into()),
        )
        .await;
    let first = Put::new(6, 10, 20, 8, 60);
    put(b, &first).await.unwrap();
    for (i, pages) in [2u32, 12].into_iter().enumerate() {
        let p = Put::new(6, 10, 20, pages, 61 + i as u64);
        let r = put(b, &p).await;
        assert!(
            matches!(r, Err(StorageError::Conflict { .. })),
            "{name}: put {i} over an existing object: {r:?}"
        );
        let l = list(b, 6).await;
        assert_eq!(ranges(&l), vec![(6, 10, 20)], "{name}: listing after {i}");
        assert_eq!(b.plain_size(&l[0]).await, first.bytes.len() as u64);
        let got = read_all(b, 6, 10, 20, 0).await;
        assert_bytes(&format!("{name}: after put {i}"), &got, &first.bytes);
    }
    let src = b.scratch.join("same-again.ltx");
    std::fs::write(&src, &first.bytes).unwrap();
    let again = put_new(&b.client, 6, TxId(10), TxId(20), &src, first.ts).await;
    assert!(again.is_ok(), "{name}: the same bytes again: {again:?}");
    let other = b.scratch.join("other.ltx");
    std::fs::write(&other, Put::new(6, 10, 20, 3, 70).bytes).unwrap();
    let r = put_new(&b.client, 6, TxId(10), TxId(20), &other, first.ts).await;
    assert!(
        matches!(r, Err(StorageError::Conflict { .. })),
        "{name}: put_new of other bytes: {r:?}"
    );
}

/// Deletes: present and missing files in one call (in a level with files and in a level
/// that never had any); an empty call; a repeat; by listed info.
async fn delete_removes_and_tolerates_missing(b: &Backend<'_>) {
    let name = b.name();
    put(b, &Put::new(0, 1, 1, 1, 69)).await.unwrap();
    let l7: Vec<Put> = (1..=4).map(|i| Put::new(7, i, i, 1, 70 + i)).collect();
    for p in &l7 {
        put(b, p).await.unwrap();
    }
    b.client
        .delete(&[info(7, 2, 2), info(7, 9, 9), info(7, 4, 4)])
        .await
        .unwrap_or_else(|e| panic!("{name}: delete of present and missing files: {e:?}"));
    assert_eq!(
        ranges(&list(b, 7).await),
        vec![(7, 1, 1), (7, 3, 3)],
        "{name}: after delete"
    );
    assert_not_found(
        &format!("{name}: open deleted"),
        b.client.open(7, TxId(2), TxId(2), 0).await,
    );
    b.client
        .delete(&[])
        .await
        .unwrap_or_else(|e| panic!("{name}: delete of nothing: {e:?}"));
    b.client
        .delete(&[info(7, 2, 2)])
        .await
        .unwrap_or_else(|e| panic!("{name}: delete of a deleted file: {e:?}"));
    let rest = list(b, 7).await;
    b.client.delete(&rest).await.unwrap();
    assert_eq!(
        list(b, 7).await,
        vec![],
        "{name}: level 7 after deleting all"
    );
    assert_eq!(
        ranges(&list(b, 0).await),
        vec![(0, 1, 1)],
        "{name}: delete touched level 0"
    );
    // A level that never had a file.
    b.client
        .delete(&[info(8, 1, 1)])
        .await
        .unwrap_or_else(|e| panic!("{name}: delete in a level that has no files: {e:?}"));
}

/// 16 concurrent puts all land whole.
async fn concurrent_puts_all_land(b: &Backend<'_>) {
    let name = b.name();
    let conc: Vec<Put> = (0..16u64)
        .map(|i| Put::new(2, i * 10 + 1, i * 10 + 10, 1 + (i as u32 % 5), 200 + i))
        .collect();
    let mut set = tokio::task::JoinSet::new();
    for (i, p) in conc.iter().enumerate() {
        let client = b.client.clone();
        let src = b.scratch.join(format!("conc-{i}"));
        std::fs::write(&src, &p.bytes).unwrap();
        let (level, min, max, ts) = (p.level, p.min, p.max, p.ts);
        set.spawn(async move { client.put(level, TxId(min), TxId(max), &src, ts).await });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap()
            .unwrap_or_else(|e| panic!("{name}: concurrent put: {e}"));
    }
    let l2 = list(b, 2).await;
    assert_eq!(
        ranges(&l2),
        conc.iter().map(|p| (2, p.min, p.max)).collect::<Vec<_>>(),
        "{name}: concurrent puts listing"
    );
    for (f, p) in l2.iter().zip(&conc) {
        assert_eq!(
            b.plain_size(f).await,
            p.bytes.len() as u64,
            "{name}: size of {}",
            p.name()
        );
        let got = read_all(b, 2, p.min, p.max, 0).await;
        assert_bytes(&format!("{name}: concurrent {}", p.name()), &got, &p.bytes);
    }
}

/// A ~12 MiB object (above the 5 MiB part size: a multipart upload on S3) round-trips, whole
/// and from inside its second part.
async fn large_object_round_trips(b: &Backend<'_>) {
    let name = b.name();
    let ts = now_ms();
    let bytes = big_object(12 * MIB + 4321, 100, 200, ts, 300);
    let big = Put {
        level: 3,
        min: 100,
        max: 200,
        bytes,
        ts,
    };
    let got = put(b, &big)
        .await
        .unwrap_or_else(|e| panic!("{name}: put of {} bytes: {e}", big.bytes.len()));
    assert_eq!(
        b.plain_size(&got).await,
        big.bytes.len() as u64,
        "{name}: put result size"
    );
    let l3 = list(b, 3).await;
    assert_eq!(
        ranges(&l3),
        vec![(3, 100, 200)],
        "{name}: large object listing"
    );
    assert_eq!(
        b.plain_size(&l3[0]).await,
        big.bytes.len() as u64,
        "{name}: large object size"
    );
    let got = read_all(b, 3, 100, 200, 0).await;
    assert_bytes(&format!("{name}: large object"), &got, &big.bytes);
    let off = 5 * MIB as u64 + 12_345;
    let got = read_all(b, 3, 100, 200, off).await;
    assert_bytes(
        &format!("{name}: large object from {off}"),
        &got,
        &big.bytes[off as usize..],
    );
    let h = b.client.read_header(&l3[0]).await.unwrap();
    assert_eq!((h.max_txid, h.timestamp), (TxId(200), ts));
}

/// Foreign names in a level are skipped; a replica whose location extends this one's
/// (`.../app.db2`) is a different replica.
async fn foreign_names_are_skipped(b: &Backend<'_>) {
    let name = b.name();
    put(b, &Put::new(4, 1, 2, 1, 400)).await.unwrap();
    let foreign = [
        "notes.txt",
        "0000000000000003-0000000000000004.ltx.tmp",
        "0000000000000003-0000000000000004.ltx.12345.tmp",
        "000000000000000A-000000000000000B.ltx",
        "3-4.ltx",
        "0000000000000003-0000000000000004",
        "0000000000000003_0000000000000004.ltx",
        "sub/0000000000000005-0000000000000006.ltx",
    ];
    for f in foreign {
        b.plant(4, f, b"not an ltx file").await;
    }
    let sibling = b.sibling();
    let src = b.scratch.join("sibling.ltx");
    std::fs::write(&src, ltx_file(7, 8, 1, 4096, now_ms(), 401)).unwrap();
    sibling
        .put(4, TxId(7), TxId(8), &src, now_ms())
        .await
        .unwrap();
    assert_eq!(
        ranges(&list(b, 4).await),
        vec![(4, 1, 2)],
        "{name}: foreign names or a sibling replica listed"
    );
    assert_eq!(
        ranges(&sibling.list(4).await.unwrap()),
        vec![(4, 7, 8)],
        "{name}: sibling listing"
    );
    let all = b.client.list_all().await.unwrap();
    assert_eq!(
        ranges(&all),
        vec![(4, 1, 2)],
        "{name}: list_all with foreign names"
    );
}

/// Listings longer than one S3 page (1000 keys) are complete and sorted; one delete call
/// removes them all.
async fn many_files_list_and_delete(b: &Backend<'_>) {
    let name = b.name();
    let many: Vec<String> = (1..=1100u64)
        .map(|i| ltx::format_filename(TxId(i * 2), TxId(i * 2 + 1)))
        .collect();
    b.plant_many(5, &many).await;
    let l5 = list(b, 5).await;
    assert_eq!(
        l5.len(),
        many.len(),
        "{name}: listing of {} files",
        many.len()
    );
    assert!(
        l5.windows(2).all(|w| w[0].min_txid < w[1].min_txid),
        "{name}: long listing not sorted"
    );
    assert_eq!((l5[0].min_txid, l5[1099].max_txid), (TxId(2), TxId(2201)));
    b.client.delete(&l5).await.unwrap();
    assert_eq!(
        list(b, 5).await,
        vec![],
        "{name}: level 5 after deleting {} files",
        l5.len()
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

/// The requests the S3 backend makes: a multipart upload above the part size (parts of at
/// most the part size, completed, none aborted, nothing left behind) and at most 1000 keys
/// per DeleteObjects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_request_shapes() {
    let server = S3Server::start().await;
    if !server.counts_requests() {
        return;
    }
    let dir = TestDir::new("conformance-s3-shapes");
    let env = Env::S3 {
        server: &server,
        scratch: dir.path().to_path_buf(),
    };
    let b = env.backend("shapes");
    let n = |op: &str| server.op_count(op);

    // 12 MiB + a little: 3 parts.
    let src = b.scratch.join("big.ltx");
    let bytes = big_object(12 * MIB + 1, 1, 1, now_ms(), 1);
    std::fs::write(&src, &bytes).unwrap();
    b.client
        .put(3, TxId(1), TxId(1), &src, now_ms())
        .await
        .unwrap();
    assert_eq!(
        (
            n("CreateMultipartUpload"),
            n("UploadPart"),
            n("CompleteMultipartUpload"),
            n("AbortMultipartUpload"),
            n("PutObject")
        ),
        (1, 3, 1, 0, 0),
        "multipart requests: {:?}",
        server.requests_by_op()
    );
    let leftovers: Vec<String> = std::fs::read_dir(&server.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("upload"))
        .collect();
    assert!(leftovers.is_empty(), "multipart leftovers: {leftovers:?}");

    // Exactly the part size: one PutObject.
    let exact = vec![7u8; 5 * MIB];
    std::fs::write(&src, &exact).unwrap();
    b.client
        .put(3, TxId(2), TxId(2), &src, now_ms())
        .await
        .unwrap();
    assert_eq!((n("PutObject"), n("CreateMultipartUpload")), (1, 1));

    // 2500 files (2 real): three DeleteObjects calls.
    let mut files: Vec<LtxFileInfo> = (10..2508).map(|i| info(3, i, i)).collect();
    files.extend(b.client.list(3).await.unwrap());
    server.reset_counts();
    b.client.delete(&files).await.unwrap();
    assert_eq!(n("DeleteObjects"), 3, "{:?}", server.requests_by_op());
    assert_eq!(b.client.list(3).await.unwrap(), vec![]);
}

/// The fixture itself: signed requests work and are counted by operation, the data survives a
/// stop, a stopped server refuses connections, and a restart serves on the same port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_server_fixture_smoke() {
    let mut server = S3Server::start().await;
    let sdk = server.sdk();
    let key = server.key("smoke/hello.txt");
    sdk.put_object()
        .bucket(&server.bucket)
        .key(&key)
        .body(b"hello".to_vec().into())
        .send()
        .await
        .unwrap();
    let got = sdk
        .get_object()
        .bucket(&server.bucket)
        .key(&key)
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes();
    assert_eq!(&got[..], b"hello");
    assert_eq!(server.list_keys("smoke/").await, vec!["smoke/hello.txt"]);
    if server.is_external() {
        return;
    }
    assert_eq!(
        std::fs::read(server.object_path("smoke/hello.txt")).unwrap(),
        b"hello"
    );
    let ops = server.requests_by_op();
    assert_eq!(
        (
            ops.get("PutObject"),
            ops.get("GetObject"),
            ops.get("ListObjectsV2")
        ),
        (Some(&1), Some(&1), Some(&1)),
        "{ops:?}"
    );
    assert_eq!(server.request_count(), 3);

    // Unsigned requests are refused (and counted).
    let url = format!("{}/{}/{}", server.endpoint, server.bucket, key);
    let status = raw_get_status(&url).await;
    assert_eq!(status, Some(403), "unsigned GET");
    assert_eq!(server.request_count(), 4);
    assert_eq!(
        server.op_count("GetObject"),
        2,
        "{:?}",
        server.requests_by_op()
    );

    let port = server.endpoint.rsplit(':').next().unwrap().to_string();
    server.stop().await;
    assert!(!server.is_serving());
    assert_eq!(
        raw_get_status(&url).await,
        None,
        "a stopped server accepted a connection"
    );
    server.restart().await;
    assert!(server.endpoint.ends_with(&port));
    let got = sdk
        .get_object()
        .bucket(&server.bucket)
        .key(&key)
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes();
    assert_eq!(&got[..], b"hello", "data after restart");
    server.reset_counts();
    assert_eq!(
        (server.request_count(), server.requests_by_op().len()),
        (0, 0)
    );
}

/// A plain HTTP/1.1 GET; the status, or None if the connection is refused.
async fn raw_get_status(url: &str) -> Option<u16> {
    use tokio::io::AsyncWriteExt;
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = tokio::net::TcpStream::connect(host).await.ok()?;
    s.write_all(
        format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace().nth(1)?.parse().ok()
}

/// A server, a client of it with one object at level 0, and an LTX source file.
async fn errors_fixture(name: &str) -> (S3Server, AnyClient, TestDir, PathBuf) {
    let server = S3Server::start().await;
    let client = s3_client(&server, name);
    let dir = TestDir::new(&format!("conformance-{name}"));
    let src = dir.join("a.ltx");
    std::fs::write(&src, ltx_file(1, 1, 1, 4096, now_ms(), 1)).unwrap();
    client
        .put(0, TxId(1), TxId(1), &src, now_ms())
        .await
        .unwrap();
    (server, client, dir, src)
}

/// A client of `server` with a different bucket or secret.
fn s3_client_with(server: &S3Server, prefix: &str, bucket: &str, secret: &str) -> AnyClient {
    let cfg = S3Config::from_url(&server.url(prefix)).unwrap();
    AnyClient::S3(S3Client::new(S3Config {
        bucket: bucket.to_string(),
        access_key_id: Some(server.access_key.clone()),
        secret_access_key: Some(Secret(secret.to_string())),
        part_size: 5 * MIB as u64,
        ..cfg
    }))
}

/// A missing bucket must not look like an empty replica or a missing object: no retry helps,
/// and the error says what is wrong (the bucket, not some key, is missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_missing_bucket_is_permanent() {
    let (server, _client, _dir, src) = errors_fixture("s3-nobucket").await;
    let nob = s3_client_with(
        &server,
        "x",
        &format!("replicad-no-such-bucket-{:08x}", rand::random::<u32>()),
        &server.secret_key,
    );
    let mut wrong = Vec::new();
    for (op, r) in [
        ("list", nob.list(0).await.map(|_| ())),
        ("open", nob.open(0, TxId(1), TxId(1), 0).await.map(|_| ())),
        (
            "put",
            nob.put(0, TxId(1), TxId(1), &src, now_ms())
                .await
                .map(|_| ()),
        ),
        ("delete", nob.delete(&[info(0, 1, 1)]).await),
    ] {
        match r {
            Err(e @ StorageError::Permanent { .. }) if e.to_string().contains("NoSuchBucket") => {
                eprintln!("missing bucket, {op}: {e}")
            }
            other => wrong.push(format!("{op}: {other:?}")),
        }
    }
    assert!(
        wrong.is_empty(),
        "on a missing bucket, expected Permanent errors that say NoSuchBucket, got:\n{}",
        wrong.join("\n")
    );
}

/// Bad credentials are permanent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_bad_credentials_are_permanent() {
    let (server, _client, _dir, src) = errors_fixture("s3-badcreds").await;
    let bad = s3_client_with(&server, "s3-badcreds", &server.bucket, "wrong-secret");
    for (op, r) in [
        ("list", bad.list(0).await.map(|_| ())),
        ("open", bad.open(0, TxId(1), TxId(1), 0).await.map(|_| ())),
        (
            "put",
            bad.put(0, TxId(2), TxId(2), &src, now_ms())
                .await
                .map(|_| ()),
        ),
        ("delete", bad.delete(&[info(0, 1, 1)]).await),
    ] {
        match r {
            Err(e @ StorageError::Permanent { .. }) => {
                let shown = format!("{e} {e:?} {bad:?} {}", bad.location());
                assert!(
                    !shown.contains("wrong-secret"),
                    "{op}: the secret is shown: {shown}"
                );
                eprintln!("wrong secret, {op}: {e}")
            }
            other => panic!("{op} with a wrong secret: expected Permanent, got {other:?}"),
        }
    }
    eprintln!(
        "requests: {} in all, by op {:?}",
        server.request_count(),
        server.requests_by_op()
    );
}

/// A stopped server is a retryable error for every operation; after a restart on the same
/// port the same client works again (its pooled connections are dead by then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_outage_is_transient_and_recovers() {
    let (mut server, client, _dir, src) = errors_fixture("s3-outage").await;
    if server.is_external() {
        return;
    }
    server.stop().await;
    let t0 = std::time::Instant::now();
    // Concurrently: each call spends the SDK's retries (about 2 s) before it gives up.
    let gone = [info(0, 1, 1)];
    let (l, o, p, d) = tokio::join!(
        client.list(0),
        client.open(0, TxId(1), TxId(1), 0),
        client.put(0, TxId(2), TxId(2), &src, now_ms()),
        client.delete(&gone),
    );
    for (op, r) in [
        ("list", l.map(|_| ())),
        ("open", o.map(|_| ())),
        ("put", p.map(|_| ())),
        ("delete", d),
    ] {
        match r {
            Err(e) if e.is_retryable() => eprintln!("server down, {op}: {e}"),
            other => panic!("{op} with the server down: expected a retryable error, got {other:?}"),
        }
    }
    eprintln!("4 calls against a stopped server took {:?}", t0.elapsed());
    server.restart().await;
    assert_eq!(
        ranges(&client.list(0).await.unwrap()),
        vec![(0, 1, 1)],
        "list after restart"
    );
    assert_eq!(
        read_all_client(&client, 0, 1, 1).await.len() as u64,
        std::fs::metadata(&src).unwrap().len()
    );
}

async fn read_all_client(c: &AnyClient, level: u8, min: u64, max: u64) -> Vec<u8> {
    let mut r = c.open(level, TxId(min), TxId(max), 0).await.unwrap();
    let mut v = Vec::new();
    r.read_to_end(&mut v).await.unwrap();
    v
}

/// A GET whose connection drops mid-body is resumed from the byte reached, and the reader
/// sees every byte exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_read_resumes_after_connection_drop() {
    let mut server = S3Server::start().await;
    if server.is_external() {
        return;
    }
    let client = s3_client(&server, "resume");
    let dir = TestDir::new("conformance-s3-resume");
    let src = dir.join("big.ltx");
    // 32 MiB: more than the socket buffers between client and server hold.
    let bytes = big_object(32 * MIB, 1, 1, now_ms(), 9);
    std::fs::write(&src, &bytes).unwrap();
    client
        .put(3, TxId(1), TxId(1), &src, now_ms())
        .await
        .unwrap();
    server.reset_counts();

    let mut r = client.open(3, TxId(1), TxId(1), 0).await.unwrap();
    let mut got = vec![0u8; MIB];
    r.read_exact(&mut got).await.unwrap();
    server.stop().await;
    server.restart().await;
    r.read_to_end(&mut got)
        .await
        .unwrap_or_else(|e| panic!("read after the drop: {e}"));
    assert_bytes("resumed read", &got, &bytes);
    assert!(
        server.op_count("GetObject") >= 2,
        "the body was never cut (all buffered before the stop?): {:?}",
        server.requests_by_op()
    );
}

/// Server errors: a single one is retried by the client and the put lands; persistent ones
/// on a multipart upload fail the put with a retryable error, abort the upload, and leave the
/// previous version of the object whole and no parts behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_server_errors_retry_then_abort_cleanly() {
    let server = S3Server::start().await;
    if server.is_external() {
        return;
    }
    let client = s3_client(&server, "faults");
    let dir = TestDir::new("conformance-s3-faults");
    let src = dir.join("src.ltx");

    // One 500 on PutObject: retried, lands.
    let small = ltx_file(1, 5, 3, 4096, now_ms(), 1);
    std::fs::write(&src, &small).unwrap();
    server.fail_next("PutObject", 1);
    client
        .put(3, TxId(1), TxId(5), &src, now_ms())
        .await
        .unwrap_or_else(|e| panic!("put after one server error: {e:?}"));
    assert_eq!(
        (
            server.op_count("PutObject"),
            server.failures_left("PutObject")
        ),
        (2, 0),
        "{:?}",
        server.requests_by_op()
    );

    // UploadPart always fails: the large overwrite fails, retryable, and is aborted.
    let big = big_object(12 * MIB, 1, 5, now_ms(), 2);
    std::fs::write(&src, &big).unwrap();
    server.fail_next("UploadPart", 1_000);
    let r = client.put(3, TxId(1), TxId(5), &src, now_ms()).await;
    server.fail_next("UploadPart", 0);
    match r {
        Err(e) if e.is_retryable() => eprintln!("put with failing parts: {e}"),
        other => panic!("put with failing parts: expected a retryable error, got {other:?}"),
    }
    let ops = server.requests_by_op();
    assert_eq!(
        (
            ops.get("CreateMultipartUpload"),
            ops.get("CompleteMultipartUpload"),
            ops.get("AbortMultipartUpload")
        ),
        (Some(&1), None, Some(&1)),
        "{ops:?}"
    );
    let l = client.list(3).await.unwrap();
    assert_eq!(
        (ranges(&l), l[0].size),
        (vec![(3, 1, 5)], small.len() as u64),
        "the failed overwrite replaced the object"
    );
    assert_bytes(
        "object after a failed overwrite",
        &read_all_client(&client, 3, 1, 5).await,
        &small,
    );
    let leftovers: Vec<String> = std::fs::read_dir(&server.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("upload"))
        .collect();
    assert!(leftovers.is_empty(), "multipart leftovers: {leftovers:?}");

    // And with the server healthy again the same put goes through.
    client
        .put(3, TxId(1), TxId(5), &src, now_ms())
        .await
        .unwrap();
    assert_bytes(
        "object after the retried overwrite",
        &read_all_client(&client, 3, 1, 5).await,
        &big,
    );

    // Persistent errors on list and get: retryable.
    server.fail_next("ListObjectsV2", 1_000);
    server.fail_next("GetObject", 1_000);
    let (l, o) = tokio::join!(client.list(3), client.open(3, TxId(1), TxId(5), 0));
    for (op, r) in [("list", l.map(|_| ())), ("open", o.map(|_| ()))] {
        match r {
            Err(e) if e.is_retryable() => eprintln!("{op} with server errors: {e}"),
            other => panic!("{op} with server errors: expected a retryable error, got {other:?}"),
        }
    }
}

/// A segment uploaded while it is staged (`put_streamed`): parts go out as soon as the file
/// holds them, but no object exists until the segment is published; then the object is the
/// file, byte for byte. A segment that fails mid-write leaves no object and no parts; one that
/// ends within a part stores nothing (the plain put takes over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_streamed_upload_completes_only_once_published() {
    use replicad::storage::feed::{GrowingSegment, SegmentFeed};
    use std::io::Write;

    let server = S3Server::start().await;
    if !server.counts_requests() {
        return;
    }
    let client = s3_client(&server, "streamed");
    assert!(client.streaming().is_some(), "a plain S3 client streams");
    let dir = TestDir::new("conformance-s3-streamed");
    let feed = SegmentFeed::default();
    let _follower = feed.subscribe();
    let bytes = big_object(17 * MIB + 3, 1, 1, now_ms(), 7);
    let uploads_left = || -> Vec<String> {
        std::fs::read_dir(&server.root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("upload"))
            .collect()
    };

    // Published: parts before publication, the object only after.
    let (seg, mut tap) = growing(&dir.join("1.tmp"), 1, 1_700_000_000_123);
    let announced = feed.announce(seg.clone());
    let upload = tokio::spawn(s3_streamed_put(client.clone(), seg.clone()));
    tap.write_all(&bytes[..11 * MIB]).unwrap();
    tap.flush().unwrap();
    wait_parts(&server, 2).await;
    assert_eq!(server.op_count("CompleteMultipartUpload"), 0);
    assert_eq!(
        client.list(0).await.unwrap(),
        vec![],
        "an object before publication"
    );
    tap.write_all(&bytes[11 * MIB..]).unwrap();
    tap.flush().unwrap();
    wait_parts(&server, 3).await;
    assert_eq!(server.op_count("CompleteMultipartUpload"), 0);
    announced.published(bytes.len() as u64);
    let info = upload.await.unwrap().unwrap().expect("a stored object");
    assert_eq!(
        (info.level, info.min_txid, info.max_txid, info.size),
        (0, TxId(1), TxId(1), bytes.len() as u64)
    );
    assert_eq!(
        (
            server.op_count("CreateMultipartUpload"),
            server.op_count("UploadPart"),
            server.op_count("CompleteMultipartUpload")
        ),
        (1, 4, 1),
        "{:?}",
        server.requests_by_op()
    );
    assert_bytes(
        "streamed object",
        &read_all_client(&client, 0, 1, 1).await,
        &bytes,
    );
    // s3s-fs keeps user metadata beside the object, in a JSON file (the only object yet).
    let meta: Vec<String> = std::fs::read_dir(&server.root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.ends_with(".metadata.json")
        })
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert!(
        meta.len() == 1 && meta[0].contains("2023-11-14T22:13:20.123"),
        "litestream-timestamp is not the header's: {meta:?}"
    );
    assert!(
        uploads_left().is_empty(),
        "multipart leftovers: {:?}",
        uploads_left()
    );

    // Failed mid-write (the guard dropped unpublished): aborted, nothing stored.
    server.reset_counts();
    let tmp = dir.join("2.tmp");
    let (seg, mut tap) = growing(&tmp, 2, now_ms());
    let announced = feed.announce(seg.clone());
    let upload = tokio::spawn(s3_streamed_put(client.clone(), seg.clone()));
    tap.write_all(&bytes[..11 * MIB]).unwrap();
    tap.flush().unwrap();
    wait_parts(&server, 2).await;
    drop(announced);
    assert_eq!(upload.await.unwrap().unwrap(), None);
    assert_eq!(
        (
            server.op_count("CompleteMultipartUpload"),
            server.op_count("AbortMultipartUpload")
        ),
        (0, 1),
        "{:?}",
        server.requests_by_op()
    );
    assert_eq!(ranges(&client.list(0).await.unwrap()), vec![(0, 1, 1)]);
    assert!(
        uploads_left().is_empty(),
        "multipart leftovers: {:?}",
        uploads_left()
    );

    // Ended within one part: no request at all.
    server.reset_counts();
    let seg = GrowingSegment::new(TxId(3), now_ms(), std::fs::File::open(&tmp).unwrap());
    let announced = feed.announce(seg.clone());
    let upload = {
        let seg = seg.clone();
        tokio::spawn(async move { s3_streamed_put(client, seg).await })
    };
    seg.wrote(MIB as u64);
    announced.published(2 * MIB as u64);
    assert_eq!(upload.await.unwrap().unwrap(), None);
    assert_eq!(server.request_count(), 0, "{:?}", server.requests_by_op());
}

/// A growing segment at `tmp` (created empty) and the tap that writes it.
fn growing(
    tmp: &Path,
    txid: u64,
    timestamp_ms: i64,
) -> (
    std::sync::Arc<replicad::storage::feed::GrowingSegment>,
    replicad::storage::feed::Tap<std::fs::File>,
) {
    let file = std::fs::File::create(tmp).unwrap();
    let seg = replicad::storage::feed::GrowingSegment::new(
        TxId(txid),
        timestamp_ms,
        std::fs::File::open(tmp).unwrap(),
    );
    let tap = replicad::storage::feed::Tap::new(file, Some(seg.clone()));
    (seg, tap)
}

async fn s3_streamed_put(
    client: AnyClient,
    seg: std::sync::Arc<replicad::storage::feed::GrowingSegment>,
) -> Result<Option<LtxFileInfo>, StorageError> {
    client.streaming().unwrap().put_streamed(0, &seg).await
}

async fn wait_parts(server: &S3Server, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while server.op_count("UploadPart") < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} parts never went out: {:?}",
            server.requests_by_op()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
