//! Directory discovery: the databases of a `dbs` entry with `dir` ([`DirConfig`]).
//!
//! Invariants:
//! - What is a database is decided by the file's first 16 bytes (`SQLite format 3\0`), never
//!   by its name; the name only has to match `pattern`. A file shorter than that (SQLite has
//!   created it but not yet written page 1) is not a database yet: its next change event, or
//!   the periodic rescan, looks again.
//! - `-wal`, `-shm` and `-journal` files are never candidates, and replicad's own state
//!   directories (`.NAME-replicad`) are never looked into; symbolic links to directories are
//!   not followed (no loops).
//! - Each database is replicated under its path relative to `dir`
//!   ([`DirConfig::db`], [`crate::config::replica_under`]).
//! - Without `watch`, the databases are those present at start. With `watch`, inotify
//!   watches each directory (not the state directories, whose staging writes would wake this
//!   task at every sync). An event only names a path to look at again, so a lost, merged or
//!   reordered event costs a delay, never a wrong state: a rescan every [`RESCAN_INTERVAL`]
//!   (and after an inotify queue overflow) reconciles whatever was missed. Idle, the task
//!   sleeps; the events of WAL writes are dropped on inotify's thread.
//! - A database is removed only when its file no longer exists; the Store then stops that
//!   database alone ([`StoreCore::remove`]). A database that fails to start, at start-up or
//!   later, stops nothing else: it is listed as not protected (a stand-in in the registry)
//!   and, with `watch`, retried at its next change or rescan; so is a start that went on in
//!   the background (`StoreCore::add_patiently`) and failed there (`late.rs`). Only a
//!   configuration error stops the start, and only one found by the start-up scan when it
//!   answers within 10 s: a scan that runs longer goes on in the background, the directory
//!   reported meanwhile, and a configuration error there stops that directory alone.
//! - A database open in this process (ours, or another entry's, under whatever path) never
//!   has its header read again: closing that descriptor would drop every POSIX lock the
//!   process holds on the file, SQLite's included ([`has_sqlite_header`]). Open files are
//!   told by identity ([`crate::replicate::db::is_held`]); a database in the moment between
//!   its connection's opening and its registration there is not.
//! - All file-system work (walks, header reads, inotify calls) runs on the blocking pool.
//! - The follow task is spawned through the Store ([`StoreCore`]), tracked like every other
//!   task, and ends when the Store stops ingesting; only the Store starts database tasks.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use globset::{Glob, GlobMatcher};
use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind, RemoveKind};
use notify::{EventKind, INotifyWatcher, RecursiveMode, Watcher};

use crate::config::DirConfig;
use crate::daemon::{Added, Patient, StoreCore, StoreError};
use crate::replicate::health::SLOW_WORK;
use late::{Late, Pending};

mod follow;
mod late;

/// The first 16 bytes of every SQLite 3 database file.
pub const HEADER: &[u8; 16] = b"SQLite format 3\0";

/// The name, under a directory, that the test gate
/// ([`crate::util::test_gate::SYNC_GATE_ENV`]) is checked against for the directory's scan: it
/// holds the scan as it holds a database there.
const SCAN_GATE: &str = ".scan";

/// How often a watched directory is rescanned in full, in case an event was missed.
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(60);

/// How long events are gathered before they are looked at: SQLite's creation of a database
/// is several events in a row.
const SETTLE: Duration = Duration::from_millis(50);

/// Whether a file name is never a database of its own: SQLite's side files.
pub fn is_side_file(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    ["-wal", "-shm", "-journal"]
        .iter()
        .any(|s| name.ends_with(s))
}

/// Whether a directory name is replicad's state directory of a database (`.NAME-replicad`,
/// [`crate::replicate::db::default_meta_path`]).
pub fn is_state_dir(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with('.') && name.ends_with("-replicad")
}

/// Whether the file at `path` starts with the SQLite header (false for short files and for
/// anything that is not a regular file: a socket, a directory behind a symlink), or is a
/// regular file that cannot be read, or one we cannot even stat (a symlink loop, a directory
/// we may not search): true, since a database we may not read is reported by its failed
/// start, never skipped in silence. Never for a database this process has open: closing the
/// descriptor read here drops every POSIX lock the process holds on the file, SQLite's
/// included, and the application's last connection could then checkpoint past our read mark
/// and delete the WAL.
pub fn has_sqlite_header(path: &Path) -> bool {
    use std::io::ErrorKind;
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return false,
        Ok(_) => {}
        Err(e) => return e.kind() != ErrorKind::NotFound,
    }
    let mut buf = [0u8; 16];
    match std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut buf)) {
        Ok(()) => &buf == HEADER,
        Err(e) => !matches!(e.kind(), ErrorKind::NotFound | ErrorKind::UnexpectedEof),
    }
}

/// Whether a path is a database open in this process
/// ([`crate::replicate::db::is_held`]; [`has_sqlite_header`] says why that matters).
type Held<'a> = &'a dyn Fn(&Path) -> bool;

/// The discovery of one `dir` entry.
pub struct Discovery {
    cfg: DirConfig,
    matcher: GlobMatcher,
}

/// What one look at the directory found, against what is tracked.
#[derive(Debug, Default, PartialEq)]
struct Changes {
    added: Vec<PathBuf>,
    removed: Vec<PathBuf>,
}

/// What starting a discovered database did.
enum Start {
    /// Nothing: outside this entry, or already replicated (configured by `path` as well).
    Skipped,
    /// It is replicated.
    Started,
    /// Still starting in the background, reported not protected meanwhile; how it ended
    /// arrives on this.
    Late(Late),
}

/// What inotify's thread passes on.
enum Signal {
    /// Look at this path again.
    Path(PathBuf),
    /// Events were lost: rescan everything.
    Rescan,
}

/// The inotify watcher and the directories it watches.
struct Watches {
    watcher: Option<INotifyWatcher>,
    watched: HashSet<PathBuf>,
}

impl Watches {
    fn watch(&mut self, dir: &Path, again: bool) {
        let Some(w) = self.watcher.as_mut() else {
            return;
        };
        if !again && self.watched.contains(dir) {
            return;
        }
        match w.watch(dir, RecursiveMode::NonRecursive) {
            Ok(()) => {
                self.watched.insert(dir.to_path_buf());
            }
            Err(e) => tracing::warn!(dir = %dir.display(), error = %e,
                "cannot watch directory; the periodic rescan still finds its databases"),
        }
    }
}

impl Discovery {
    /// The discovery of `cfg`; fails on an invalid pattern.
    pub fn new(cfg: DirConfig) -> Result<Discovery, String> {
        let matcher = Glob::new(&cfg.pattern)
            .map_err(|e| format!("invalid pattern {:?}: {e}", cfg.pattern))?
            .compile_matcher();
        Ok(Discovery { cfg, matcher })
    }

    /// Whether a file with this name may be a database of this entry.
    fn candidate_name(&self, name: &OsStr) -> bool {
        !is_side_file(name) && self.matcher.is_match(name)
    }

    /// Whether `dir` is looked into: the root, or (with `recursive`) a directory below it
    /// that is not a state directory nor inside one.
    fn may_enter(&self, dir: &Path) -> bool {
        let Ok(rel) = dir.strip_prefix(&self.cfg.dir) else {
            return false;
        };
        if rel.as_os_str().is_empty() {
            return true;
        }
        self.cfg.recursive
            && rel
                .components()
                .all(|c| matches!(c, Component::Normal(n) if !is_state_dir(n)))
    }

    /// Whether `path` is a database of this entry now (`held`: one open here, whose header
    /// is not read: see [`has_sqlite_header`]).
    fn is_database(&self, path: &Path, held: Held) -> bool {
        let (Some(name), Some(parent)) = (path.file_name(), path.parent()) else {
            return false;
        };
        self.candidate_name(name)
            && self.may_enter(parent)
            && (held(path) || has_sqlite_header(path))
    }

    /// Collects the databases under `from` (a directory [`Discovery::may_enter`] allows),
    /// calling `on_dir` on each directory before listing it (so that a watch is in place
    /// before the listing: nothing created meanwhile is missed).
    fn walk(
        &self,
        from: &Path,
        on_dir: &mut dyn FnMut(&Path),
        held: Held,
        found: &mut Vec<PathBuf>,
    ) {
        let mut stack = vec![from.to_path_buf()];
        while let Some(dir) = stack.pop() {
            on_dir(&dir);
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot list directory");
                    }
                    continue;
                }
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                if kind.is_dir() {
                    if self.cfg.recursive && !is_state_dir(&entry.file_name()) {
                        stack.push(path);
                    }
                } else if self.candidate_name(&entry.file_name())
                    && (held(&path) || has_sqlite_header(&path))
                {
                    found.push(path);
                }
            }
        }
        found.sort();
    }

    /// The databases under `dir` now.
    pub fn scan(&self, held: Held) -> Vec<PathBuf> {
        let mut found = Vec::new();
        self.walk(&self.cfg.dir, &mut |_| {}, held, &mut found);
        found
    }

    /// The path of `db` relative to `dir`.
    fn rel<'a>(&self, db: &'a Path) -> Option<&'a Path> {
        db.strip_prefix(&self.cfg.dir).ok()
    }

    /// A full rescan: every directory watched, every database found.
    fn rescan(&self, st: &mut Watches, tracked: &HashSet<PathBuf>, held: Held) -> Changes {
        let mut found = Vec::new();
        let mut dirs = HashSet::new();
        self.walk(
            &self.cfg.dir,
            &mut |d| {
                dirs.insert(d.to_path_buf());
                st.watch(d, false);
            },
            held,
            &mut found,
        );
        // inotify drops the watches of deleted directories by itself.
        st.watched.retain(|d| dirs.contains(d));
        changes(found, tracked)
    }

    /// Looks again at the paths events named.
    fn look(
        &self,
        st: &mut Watches,
        paths: &HashSet<PathBuf>,
        tracked: &HashSet<PathBuf>,
        held: Held,
    ) -> Changes {
        let mut found = Vec::new();
        let mut gone = Vec::new();
        for p in paths {
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.is_dir() => {
                    if self.may_enter(p) {
                        // A directory created (or moved in) under a known name: watch anew.
                        st.watch(p, true);
                        self.walk(p, &mut |d| st.watch(d, false), held, &mut found);
                    }
                }
                Ok(_) => {
                    if !tracked.contains(p) && self.is_database(p, held) {
                        found.push(p.clone());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    gone.extend(tracked.iter().filter(|t| t.starts_with(p)).cloned());
                }
                Err(_) => {}
            }
        }
        gone.sort();
        gone.dedup();
        // Only the named paths are looked at: one event costs no stat of every database.
        Changes {
            added: found.into_iter().filter(|p| !tracked.contains(p)).collect(),
            removed: gone,
        }
    }

    /// What inotify's thread passes on for one event: nothing for reads and for the
    /// side files (every WAL write is an event).
    fn signals(&self, res: notify::Result<notify::Event>) -> Vec<Signal> {
        let ev = match res {
            Ok(ev) => ev,
            Err(e) => {
                tracing::debug!(error = %e, "inotify error: rescanning");
                return vec![Signal::Rescan];
            }
        };
        if ev.need_rescan() {
            return vec![Signal::Rescan];
        }
        let structural = matches!(
            ev.kind,
            EventKind::Create(CreateKind::Folder | CreateKind::Any | CreateKind::Other)
                | EventKind::Remove(RemoveKind::Folder | RemoveKind::Any | RemoveKind::Other)
                | EventKind::Modify(ModifyKind::Name(_))
                | EventKind::Any
                | EventKind::Other
        );
        let content = matches!(
            ev.kind,
            EventKind::Create(_)
                | EventKind::Remove(_)
                | EventKind::Modify(_)
                | EventKind::Access(AccessKind::Close(AccessMode::Write))
        );
        ev.paths
            .into_iter()
            .filter(|p| match p.file_name() {
                Some(name) => {
                    !is_side_file(name) && (structural || (content && self.matcher.is_match(name)))
                }
                None => false,
            })
            .map(Signal::Path)
            .collect()
    }

    /// Adds the databases present now to `core`; with `watch`, spawns (through the Store)
    /// the task that follows the directory. A scan still running after [`SLOW_WORK`] (the
    /// directory on a hung mount) goes on in the background, the directory reported not
    /// protected meanwhile, so that the other databases and the endpoints do not wait for it.
    pub(crate) async fn start(self, core: &StoreCore) -> Result<(), StoreError> {
        let me = Arc::new(self);
        let d = me.clone();
        let mut scan = tokio::task::spawn_blocking(move || {
            crate::util::test_gate::wait_at_test_gate(&d.cfg.dir.join(SCAN_GATE));
            d.scan(&crate::replicate::db::is_held)
        });
        let dir = me.cfg.dir.clone();
        let Ok(joined) = tokio::time::timeout(SLOW_WORK, &mut scan).await else {
            let why = format!(
                "not watched: its scan has run for {SLOW_WORK:?} (its file system does not \
                 answer); the databases under it are NOT protected until it answers"
            );
            tracing::error!(dir = %dir.display(), "{why}");
            core.registry().unstarted(&dir, why);
            let (c, ingest) = (core.clone(), core.ingest().clone());
            core.spawn(async move {
                let joined = tokio::select! {
                    joined = scan => joined,
                    _ = ingest.cancelled() => return,
                };
                let started = match joined {
                    Ok(found) => me.start_found(&c, found).await,
                    Err(e) => Err(StoreError::panicked("scan", &dir, e)),
                };
                match started {
                    Ok(()) => tracing::info!(dir = %dir.display(), "scanned after all"),
                    Err(StoreError::ShuttingDown) => {}
                    Err(e) => stopped(&c, &dir, &format!("its start failed: {e}")),
                }
            });
            return Ok(());
        };
        match joined {
            Ok(found) => me.start_found(core, found).await,
            Err(e) => Err(StoreError::panicked("scan", &dir, e)),
        }
    }

    /// Adds the databases `found` by the start-up scan, then follows the directory.
    async fn start_found(
        self: &Arc<Self>,
        core: &StoreCore,
        found: Vec<PathBuf>,
    ) -> Result<(), StoreError> {
        let me = self;
        let mut tracked = HashSet::new();
        // One database that cannot start must not stop the others: it is reported instead.
        let mut failed = HashSet::new();
        // Started as the configured ones are, several at once: one after the other, a thousand
        // databases behind a store 20 ms away took 112 s (7 s so), every one unprotected and
        // the endpoints unserved meanwhile.
        let added: Vec<(PathBuf, Result<Start, StoreError>)> = futures_util::stream::iter(found)
            .map(|path| {
                let me = &me;
                async move {
                    let added = me.add(core, &path).await;
                    (path, added)
                }
            })
            .buffer_unordered(super::OPEN_CONCURRENCY)
            .collect()
            .await;
        let mut pending = Pending::default();
        for (path, added) in added {
            match added {
                Ok(Start::Started) => {
                    tracked.insert(path);
                }
                Ok(Start::Late(late)) => {
                    pending.push(path.clone(), late);
                    tracked.insert(path);
                }
                Ok(Start::Skipped) => {}
                Err(e) if e.is_config() || matches!(e, StoreError::ShuttingDown) => return Err(e),
                Err(e) => {
                    me.unstarted(core, &path, &e);
                    failed.insert(path);
                }
            }
        }
        tracing::info!(dir = %me.cfg.dir.display(), pattern = %me.cfg.pattern,
            recursive = me.cfg.recursive, watch = me.cfg.watch, databases = tracked.len(),
            failed = failed.len(), "directory discovery");
        // Its databases started or reported: the stand-in of a scan that ran long goes (before
        // the follow task, which may put one back if it stops).
        core.remove(&me.cfg.dir).await;
        if me.cfg.watch {
            let (dir, c) = (me.cfg.dir.clone(), core.clone());
            core.spawn(crate::replicate::health::on_panic(
                follow::follow(me.clone(), core.clone(), tracked, failed, pending),
                move |why| stopped(&c, &dir, &format!("it panicked: {why}")),
            ));
        } else if !pending.is_empty() {
            // Not retried, but reported with its cause, not as the start that ran long.
            let (me, c) = (me.clone(), core.clone());
            let stop = core.ingest().clone();
            core.spawn(async move {
                loop {
                    tokio::select! {
                        failed = pending.failure() => match failed {
                            Some((path, e)) => me.unstarted(&c, &path, &e),
                            None => return,
                        },
                        _ = stop.cancelled() => return,
                    }
                }
            });
        }
        Ok(())
    }

    /// Lists the database at `path`, whose start failed with `e`, as not protected: retried
    /// by a watched directory, kept until a restart otherwise.
    fn unstarted(&self, core: &StoreCore, path: &Path, e: &StoreError) {
        let retry = if self.cfg.watch {
            format!(
                "retried when the file changes, or within {} s",
                RESCAN_INTERVAL.as_secs()
            )
        } else {
            "the directory is not watched: restart replicad to retry".to_string()
        };
        tracing::error!(db = %path.display(), error = %e, retry = %retry,
            "cannot start the discovered database");
        core.registry()
            .unstarted(path, format!("not replicated: {e} ({retry})"));
    }

    /// Starts the database at `path`.
    async fn add(&self, core: &StoreCore, path: &Path) -> Result<Start, StoreError> {
        let Some(rel) = self.rel(path) else {
            return Ok(Start::Skipped);
        };
        let dbc = self.cfg.db(rel);
        match core.add_patiently(&dbc).await? {
            Patient::Late(late) => Ok(Start::Late(late)),
            Patient::Done(Added::Started) => {
                let replicas: Vec<&str> = dbc.replicas.iter().map(|r| r.url.as_str()).collect();
                tracing::info!(db = %path.display(), rel = %rel.display(), ?replicas,
                    "database discovered: replicating");
                Ok(Start::Started)
            }
            Patient::Done(Added::AlreadyRunning) => {
                tracing::debug!(db = %path.display(), "discovered database is already replicated");
                Ok(Start::Skipped)
            }
            // Removed while it waited for the path's previous start (two `dir` entries over
            // one path; one entry's adds and removes come one after the other): nothing runs.
            Patient::Done(Added::Removed) => Ok(Start::Skipped),
        }
    }
}

/// Directory discovery of `dir` stopped (`why`): listed as a stand-in that is not protected,
/// so that `/readyz`, `/status`, the metrics and the exit code say so, not only the log.
fn stopped(core: &StoreCore, dir: &Path, why: &str) {
    tracing::error!(dir = %dir.display(), why = %why,
        "directory discovery stopped; no more databases are added or removed here until replicad restarts");
    core.registry().unstarted(
        dir,
        format!(
            "not watched: directory discovery stopped ({why}); databases created or removed \
             here are not noticed: restart replicad"
        ),
    );
}

/// Whether nothing is at `path` any more.
fn gone(path: &Path) -> bool {
    matches!(std::fs::symlink_metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// Databases in `found` not tracked yet, and tracked ones whose file is gone.
fn changes(found: Vec<PathBuf>, tracked: &HashSet<PathBuf>) -> Changes {
    let mut removed: Vec<PathBuf> = tracked.iter().filter(|t| gone(t)).cloned().collect();
    removed.sort();
    Changes {
        added: found.into_iter().filter(|p| !tracked.contains(p)).collect(),
        removed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DbSettings, ReplicaConfig, replica_under};
    use crate::storage::s3::S3Config;

    fn dir_config(dir: &Path, pattern: &str, recursive: bool) -> DirConfig {
        DirConfig {
            dir: dir.to_path_buf(),
            pattern: pattern.into(),
            recursive,
            watch: false,
            replicas: vec![ReplicaConfig {
                name: "file".into(),
                url: "file:///backup/data".into(),
                s3: None,
                object: None,
                sftp: None,
                age: None,
            }],
            settings: DbSettings::default(),
            codec: crate::config::CodecOrigin::Default,
        }
    }

    fn make_db(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let c = rusqlite::Connection::open(path).unwrap();
        c.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(x);")
            .unwrap();
    }

    #[test]
    fn replica_paths_follow_the_relative_path() {
        let file = ReplicaConfig {
            name: "file".into(),
            url: "file:///backup/data/".into(),
            s3: None,
            object: None,
            sftp: None,
            age: None,
        };
        let r = replica_under(&file, Path::new("sub/app.db"));
        assert_eq!(r.url, "file:///backup/data/sub/app.db");
        assert_eq!(r.name, "file");
        let s3 = |prefix: &str| ReplicaConfig {
            name: "s3".into(),
            url: String::new(),
            s3: Some(S3Config {
                bucket: "b".into(),
                path: prefix.into(),
                ..S3Config::default()
            }),
            object: None,
            sftp: None,
            age: None,
        };
        let r = replica_under(&s3("backups/"), Path::new("sub/app.db"));
        assert_eq!(r.s3.as_ref().unwrap().path, "backups/sub/app.db");
        assert_eq!(r.url, "s3://b/backups/sub/app.db");
        let r = replica_under(&s3(""), Path::new("app.db"));
        assert_eq!(r.s3.as_ref().unwrap().path, "app.db");
        assert_eq!(r.url, "s3://b/app.db");
        let gs = ReplicaConfig {
            name: "gs".into(),
            url: "gs://b/backups".into(),
            s3: None,
            object: Some(crate::storage::object::ObjectConfig::from_url("gs://b/backups").unwrap()),
            sftp: None,
            age: None,
        };
        let r = replica_under(&gs, Path::new("sub/app.db"));
        assert_eq!(r.object.as_ref().unwrap().path, "backups/sub/app.db");
        assert_eq!(r.url, "gs://b/backups/sub/app.db");
        let cfg = dir_config(Path::new("/data"), "*", true);
        let db = cfg.db(Path::new("a/b.db"));
        assert_eq!(db.path, Path::new("/data/a/b.db"));
        assert_eq!(db.replicas[0].url, "file:///backup/data/a/b.db");
        assert_eq!(db.meta_path, None);
    }

    #[test]
    fn scan_checks_headers_names_and_depth() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        make_db(&root.join("a.db"));
        make_db(&root.join("sub/b.db"));
        make_db(&root.join("other.sqlite"));
        std::fs::write(
            root.join("fake.db"),
            b"not a database at all, longer than 16",
        )
        .unwrap();
        std::fs::write(root.join("empty.db"), b"").unwrap();
        // A state directory holding something that looks like a database.
        make_db(&root.join(".a.db-replicad/c.db"));
        // A side file with a header must not count either.
        std::fs::copy(root.join("a.db"), root.join("x.db-journal")).unwrap();
        let flat = Discovery::new(dir_config(root, "*.db", false)).unwrap();
        assert_eq!(flat.scan(&|_| false), vec![root.join("a.db")]);
        let deep = Discovery::new(dir_config(root, "*.db", true)).unwrap();
        assert_eq!(
            deep.scan(&|_| false),
            vec![root.join("a.db"), root.join("sub/b.db")]
        );
        let all = Discovery::new(dir_config(root, "*", true)).unwrap();
        assert_eq!(
            all.scan(&|_| false),
            vec![
                root.join("a.db"),
                root.join("other.sqlite"),
                root.join("sub/b.db")
            ]
        );
        // The empty file becomes a database once SQLite has written its header.
        make_db(&root.join("empty.db"));
        assert!(flat.scan(&|_| false).contains(&root.join("empty.db")));
        // A database open here has its header not read again (closing the descriptor would
        // drop SQLite's locks): a file that is no database shows it was not.
        let fake = root.join("fake.db");
        assert!(flat.scan(&|p| p == fake).contains(&fake));
        assert!(!flat.may_enter(&root.join("sub")));
        assert!(!deep.may_enter(&root.join(".a.db-replicad")));
        assert!(deep.may_enter(&root.join("sub")));
    }

    #[test]
    fn changes_add_new_and_remove_vanished() {
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a.db");
        make_db(&a);
        let gone = tmp.path().join("gone.db");
        let tracked: HashSet<PathBuf> = [a.clone(), gone.clone()].into();
        let b = tmp.path().join("b.db");
        let c = changes(vec![a, b.clone()], &tracked);
        assert_eq!(c.added, vec![b]);
        assert_eq!(c.removed, vec![gone]);
    }
}
