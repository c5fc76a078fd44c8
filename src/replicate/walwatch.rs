//! Commit detection by inotify: a write to a database's `-wal` file wakes its monitor at
//! once, instead of at its next tick.
//!
//! One inotify instance per process and one watch per directory holding a database, shared by
//! the databases of that directory: a directory watch sees the WAL created again after the
//! application deleted it (a dormant database holds no connection to keep it), which a watch
//! on the file itself would lose. Only `IN_MODIFY`, `IN_CREATE` and `IN_MOVED_TO` are asked
//! for, and only names ending in `-wal` that a database registered wake anyone.
//!
//! Invariants:
//! - An event only brings a tick forward; the monitor's jittered poll stays the safety net. A
//!   missed event (a full queue, a lost watch, a filesystem whose writes inotify does not see,
//!   such as NFS written from another host) costs at most one `monitor-interval` beyond
//!   `min-sync-interval`, which poll ticks keep to as event ticks do.
//! - A queue overflow wakes every registered database; a watch the kernel drops (its
//!   directory removed or unmounted) marks its databases lost, and their monitors ask again.
//! - When inotify is unavailable or its watches run out (`fs.inotify.max_user_watches`), the
//!   databases concerned poll, the log says so once per process, and
//!   `replicad_db_commit_watched` is 0 for them.
//! - The state lock is held only to look up or change the maps (and to add or remove a watch,
//!   one syscall), never across an `.await`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Caps the number of directory watches, as a lower `fs.inotify.max_user_watches` would (tests
/// of the fallback; the kernel's own limit applies regardless).
pub const MAX_WATCHES_ENV: &str = "REPLICAD_TEST_MAX_WAL_WATCHES";

/// The process's commit detector. Cheap to share; [`WalWatcher::run`] reads its events.
pub struct WalWatcher {
    state: Mutex<State>,
    #[cfg(target_os = "linux")]
    stream: Mutex<Option<inotify::EventStream<Vec<u8>>>>,
    /// Said once: some database polls because inotify is unavailable or full.
    warned: AtomicBool,
}

#[derive(Default)]
struct State {
    #[cfg(target_os = "linux")]
    watches: Option<inotify::Watches>,
    #[cfg(target_os = "linux")]
    dirs: HashMap<inotify::WatchDescriptor, Dir>,
    #[cfg(target_os = "linux")]
    by_path: HashMap<PathBuf, inotify::WatchDescriptor>,
    /// Why there is no inotify instance, when there is none.
    unavailable: Option<String>,
    /// Watches allowed by [`MAX_WATCHES_ENV`].
    cap: Option<usize>,
    /// The kernel refused a watch for lack of them: no new directory is tried before this.
    #[cfg(target_os = "linux")]
    full_until: Option<std::time::Instant>,
}

/// How long after an ENOSPC no new directory watch is tried (each try is a path lookup under
/// the lock).
#[cfg(target_os = "linux")]
const FULL_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
struct Dir {
    /// The paths this watch was asked for (one directory may be reached by several, such as
    /// bind mounts: the kernel gives them one watch).
    paths: Vec<PathBuf>,
    /// `-wal` file name -> the wake-ups of the databases registered under it (a database
    /// registered again while its old registration is still held has two).
    wals: HashMap<OsString, Vec<Arc<Wake>>>,
}

/// One database's wake-up: notified on each change of its WAL.
#[derive(Default)]
struct Wake {
    notify: Notify,
    lost: AtomicBool,
}

/// A database's registration: [`WalWatch::changed`] completes after its WAL changed. Dropping
/// it unregisters (and removes the directory's watch with its last database).
pub struct WalWatch {
    watcher: Arc<WalWatcher>,
    dir: PathBuf,
    name: OsString,
    wake: Arc<Wake>,
}

impl WalWatch {
    /// Completes after the WAL changed since the previous call (a change during the sync is
    /// kept: the next call completes at once).
    pub async fn changed(&self) {
        self.wake.notify.notified().await
    }

    /// The kernel dropped the directory's watch: ask [`WalWatcher::watch`] again.
    pub fn is_lost(&self) -> bool {
        self.wake.lost.load(Ordering::Relaxed)
    }
}

impl Drop for WalWatch {
    fn drop(&mut self) {
        self.watcher.forget(&self.dir, &self.name, &self.wake);
    }
}

impl WalWatcher {
    /// A watcher with its inotify instance, or without one (every database then polls, and
    /// the first registration says why once). Needs a tokio runtime.
    pub fn new() -> Arc<WalWatcher> {
        let cap = std::env::var(MAX_WATCHES_ENV)
            .ok()
            .and_then(|v| v.parse().ok());
        #[cfg(target_os = "linux")]
        {
            let opened =
                inotify::Inotify::init().and_then(|i| i.into_event_stream(vec![0u8; 64 * 1024]));
            let (stream, watches, unavailable) = match opened {
                Ok(s) => {
                    let w = s.watches();
                    (Some(s), Some(w), None)
                }
                Err(e) => (None, None, Some(format!("inotify is unavailable ({e})"))),
            };
            Arc::new(WalWatcher {
                state: Mutex::new(State {
                    watches,
                    unavailable,
                    cap,
                    ..State::default()
                }),
                stream: Mutex::new(stream),
                warned: AtomicBool::new(false),
            })
        }
        #[cfg(not(target_os = "linux"))]
        Arc::new(WalWatcher {
            state: Mutex::new(State {
                unavailable: Some("inotify exists only on Linux".into()),
                cap,
            }),
            warned: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The maps stay consistent whatever panicked while they were locked: each change is
        // one insert or remove.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the database at `db`, or `None` when its commits must be found by polling
    /// (said once per process at WARN when inotify is unavailable or full).
    pub fn watch(self: &Arc<Self>, db: &Path) -> Option<WalWatch> {
        if self.warned.load(Ordering::Relaxed) && self.lock().unavailable.is_some() {
            // Said once already: no path resolution for a refusal.
            return None;
        }
        // SQLite puts the WAL beside the file a symbolic link points to; one directory reached
        // by two paths must be one entry.
        let db = std::fs::canonicalize(db).unwrap_or_else(|_| db.to_path_buf());
        let dir = match db.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        let mut name = db.file_name()?.to_os_string();
        name.push("-wal");
        let wake = Arc::new(Wake::default());
        match self.add(&dir, &name, &wake) {
            Ok(()) => Some(WalWatch {
                watcher: self.clone(),
                dir,
                name,
                wake,
            }),
            Err(Refused::Quietly) => None,
            Err(Refused::Loudly(why)) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        db = %db.display(),
                        "{why}: commits to this database (and to any other beyond the limit) are \
                         found by polling every monitor-interval instead of at once; \
                         replicad_db_commit_watched says which"
                    );
                }
                None
            }
        }
    }

    #[cfg(target_os = "linux")]
    fn add(&self, dir: &Path, name: &OsString, wake: &Arc<Wake>) -> Result<(), Refused> {
        use inotify::WatchMask;
        let mut st = self.lock();
        if let Some(why) = &st.unavailable {
            return Err(Refused::Loudly(why.clone()));
        }
        if let Some(wd) = st.by_path.get(dir).cloned()
            && let Some(d) = st.dirs.get_mut(&wd)
        {
            d.wals.entry(name.clone()).or_default().push(wake.clone());
            return Ok(());
        }
        if st.cap.is_some_and(|cap| st.dirs.len() >= cap) {
            return Err(Refused::Loudly(format!(
                "{MAX_WATCHES_ENV} allows {} inotify watches",
                st.dirs.len()
            )));
        }
        if st.full_until.is_some_and(|t| std::time::Instant::now() < t) {
            return Err(Refused::Loudly(format!(
                "inotify watches ran out at {} directories",
                st.dirs.len()
            )));
        }
        let Some(watches) = st.watches.as_mut() else {
            return Err(Refused::Quietly);
        };
        let mask = WatchMask::MODIFY | WatchMask::CREATE | WatchMask::MOVED_TO;
        match watches.add(dir, mask) {
            Ok(wd) => {
                st.by_path.insert(dir.to_path_buf(), wd.clone());
                let d = st.dirs.entry(wd).or_insert_with(|| Dir {
                    paths: Vec::new(),
                    wals: HashMap::new(),
                });
                d.paths.push(dir.to_path_buf());
                d.wals.entry(name.clone()).or_default().push(wake.clone());
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                st.full_until = Some(std::time::Instant::now() + FULL_RETRY);
                Err(Refused::Loudly(format!(
                    "inotify watches ran out at {} directories (raise \
                     fs.inotify.max_user_watches, e.g. sysctl -w \
                     fs.inotify.max_user_watches=1048576)",
                    st.dirs.len()
                )))
            }
            // A directory that is not there (yet): the monitor asks again after a sync.
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "no inotify watch");
                Err(Refused::Quietly)
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn add(&self, _dir: &Path, _name: &OsString, _wake: &Arc<Wake>) -> Result<(), Refused> {
        let st = self.lock();
        Err(Refused::Loudly(st.unavailable.clone().unwrap_or_default()))
    }

    /// Unregisters one database; the directory's watch goes with its last one.
    fn forget(&self, dir: &Path, name: &OsString, wake: &Arc<Wake>) {
        #[cfg(target_os = "linux")]
        {
            let mut st = self.lock();
            let Some(wd) = st.by_path.get(dir).cloned() else {
                return;
            };
            let Some(d) = st.dirs.get_mut(&wd) else {
                return;
            };
            if let Some(list) = d.wals.get_mut(name) {
                list.retain(|w| !Arc::ptr_eq(w, wake));
                if list.is_empty() {
                    d.wals.remove(name);
                }
            }
            if d.wals.is_empty() {
                if let Some(d) = st.dirs.remove(&wd) {
                    for p in &d.paths {
                        st.by_path.remove(p);
                    }
                }
                // A watch freed: the kernel may take a new one again.
                st.full_until = None;
                if let Some(w) = st.watches.as_mut() {
                    // Fails only for a watch the kernel already dropped.
                    let _ = w.remove(wd);
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (dir, name, wake);
    }

    /// Directories watched now.
    pub fn watched_dirs(&self) -> usize {
        #[cfg(target_os = "linux")]
        return self.lock().dirs.len();
        #[cfg(not(target_os = "linux"))]
        0
    }

    /// Reads events until `stop`, waking the databases whose WAL changed.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        #[cfg(target_os = "linux")]
        {
            use futures_util::StreamExt;
            let taken = self.stream.lock().unwrap_or_else(|e| e.into_inner()).take();
            let Some(mut stream) = taken else {
                return;
            };
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => return,
                    e = stream.next() => e,
                };
                match event {
                    Some(Ok(e)) => self.deliver(&e),
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "reading inotify events failed; commits are found by polling from now on");
                        self.lock().unavailable = Some(format!("reading inotify failed ({e})"));
                        self.wake_all(true);
                        return;
                    }
                    None => return,
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        stop.cancelled().await
    }

    #[cfg(target_os = "linux")]
    fn deliver(&self, e: &inotify::EventOwned) {
        use inotify::EventMask;
        if e.mask.contains(EventMask::Q_OVERFLOW) {
            tracing::debug!("inotify queue overflowed; waking every database");
            self.wake_all(false);
            return;
        }
        let mut st = self.lock();
        if e.mask.contains(EventMask::IGNORED) {
            // The kernel dropped the watch (directory removed or unmounted).
            if let Some(d) = st.dirs.remove(&e.wd) {
                for p in &d.paths {
                    st.by_path.remove(p);
                }
                for w in d.wals.values().flatten() {
                    w.lost.store(true, Ordering::Relaxed);
                    w.notify.notify_one();
                }
            }
            return;
        }
        if let Some(name) = &e.name
            && let Some(list) = st.dirs.get(&e.wd).and_then(|d| d.wals.get(name))
        {
            for w in list {
                w.notify.notify_one();
            }
        }
    }

    fn wake_all(&self, lost: bool) {
        #[cfg(target_os = "linux")]
        for d in self.lock().dirs.values() {
            for w in d.wals.values().flatten() {
                if lost {
                    w.lost.store(true, Ordering::Relaxed);
                }
                w.notify.notify_one();
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = lost;
    }
}

enum Refused {
    /// Not now (no such directory): the monitor asks again later.
    Quietly,
    /// Unavailable or full: say so once.
    Loudly(String),
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn woken(w: &WalWatch) -> bool {
        tokio::time::timeout(Duration::from_secs(5), w.changed())
            .await
            .is_ok()
    }

    /// Takes the wake-ups left by earlier events, so that the next one is a new event's.
    async fn drain(w: &WalWatch) {
        while tokio::time::timeout(Duration::from_millis(100), w.changed())
            .await
            .is_ok()
        {}
    }

    /// A write to a registered `-wal` wakes its database only; the directory's watch is shared
    /// and removed with its last database; a WAL created again is seen.
    #[tokio::test]
    async fn a_wal_write_wakes_its_database_only() {
        let dir = tempfile::tempdir().expect("temp dir");
        let watcher = WalWatcher::new();
        tokio::spawn(watcher.clone().run(CancellationToken::new()));
        let a = watcher.watch(&dir.path().join("a.db")).expect("watch a");
        let b = watcher.watch(&dir.path().join("b.db")).expect("watch b");
        assert_eq!(watcher.watched_dirs(), 1, "one watch per directory");

        std::fs::write(dir.path().join("a.db-wal"), b"frame").expect("write");
        assert!(woken(&a).await, "a's WAL written: a wakes");
        // Neither the other database's WAL nor the database file itself wakes b.
        drain(&a).await;
        std::fs::write(dir.path().join("b.db"), b"page").expect("write");
        std::fs::write(dir.path().join("a.db-wal"), b"frame2").expect("write");
        assert!(woken(&a).await);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), b.changed())
                .await
                .is_err(),
            "b woke for writes that were not to its WAL"
        );
        // Deleted and created again (an application closing its last connection, then
        // opening again): still seen.
        std::fs::remove_file(dir.path().join("a.db-wal")).expect("remove");
        drain(&a).await;
        std::fs::write(dir.path().join("a.db-wal"), b"new").expect("write");
        assert!(woken(&a).await);

        // Registered again while the first registration is held (a monitor restarting):
        // both are woken.
        let again = watcher
            .watch(&dir.path().join("a.db"))
            .expect("watch a again");
        drain(&a).await;
        std::fs::write(dir.path().join("a.db-wal"), b"more").expect("write");
        assert!(woken(&a).await && woken(&again).await);
        drop(again);
        // The directory through a symbolic link: the same watch, and its writes are seen.
        let other = tempfile::tempdir().expect("temp dir");
        let link = other.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).expect("symlink");
        let c = watcher.watch(&link.join("c.db")).expect("watch c");
        assert_eq!(watcher.watched_dirs(), 1, "one directory, one watch");
        std::fs::write(dir.path().join("c.db-wal"), b"frame").expect("write");
        assert!(woken(&c).await);
        drop(c);

        drop(a);
        assert_eq!(watcher.watched_dirs(), 1, "b still watches the directory");
        drop(b);
        assert_eq!(
            watcher.watched_dirs(),
            0,
            "the last database took the watch"
        );
    }
}
