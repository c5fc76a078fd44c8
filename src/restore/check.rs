//! The integrity check of a restored database, on several connections: `PRAGMA quick_check` beside,
//! for each table whose full check does more than the quick one, two sequential scans per
//! index ([`sums`]) or `PRAGMA integrity_check(T)`. SQLite's own check runs on one core, seeks
//! once per row and index, and was most of a checked restore's time.
//!
//! Invariant: the union of these checks is what `PRAGMA integrity_check` checks. In SQLite's
//! `pragma.c` (3.54), the quick check leaves out only each row's index entries (and UNIQUE
//! keys), the key order of WITHOUT ROWID tables and the full check of virtual tables; the
//! check of one table leaves out only what concerns the whole file (the freelist, pages no
//! b-tree uses, the auto-vacuum root and pointer-map checks), which the quick check does. So a
//! table gets its own check when SQLite's parsed schema gives it an index (a WITHOUT ROWID
//! table's key is one) or it is virtual: the list comes from `pragma_index_list`, not from
//! the columns of `sqlite_schema`. A check that SQLite refuses to run (a module it lacks,
//! say), or a second connection that cannot be opened, falls back to the plain
//! `PRAGMA integrity_check`, which skips what it cannot check, as before. What the scans of
//! [`sums`] check for a table is what its `integrity_check(T)` adds to the quick check (each
//! row's index entries, UNIQUE keys), and a table they have any doubt about gets
//! `integrity_check(T)` after them, whose verdict stands.

mod sums;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use rusqlite::{Connection, OpenFlags};
use tokio_util::sync::CancellationToken;

use super::RestoreError;

/// Connections checking at once, at most: each holds its own page cache.
const MAX_WORKERS: usize = 8;

/// The tables whose `integrity_check(T)` checks more than `quick_check` does (see the module
/// doc), in schema order.
const FULL_CHECK_TABLES: &str = "SELECT l.name, l.type = 'table' AND NOT l.wr FROM pragma_table_list l \
     WHERE l.schema = 'main' AND (l.type = 'virtual' OR l.wr \
     OR EXISTS (SELECT 1 FROM pragma_index_list(l.name, l.schema)))";

/// One part of the check.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Task {
    /// `PRAGMA quick_check`.
    Quick,
    /// `PRAGMA integrity_check(T)`.
    Table(String),
    /// One scan of a table, summing the key of each of its indexes ([`sums::rows`]).
    Rows(Vec<sums::Keyed>),
    /// One scan of an index ([`sums::entries`]).
    Entries(sums::Keyed),
}

impl Task {
    /// The statement of a pragma task; what a scan reads, for messages.
    fn sql(&self) -> String {
        match self {
            Task::Quick => "PRAGMA quick_check".into(),
            // A string argument is a table name (an unquoted number would be an error limit).
            Task::Table(t) => format!("PRAGMA integrity_check('{}')", t.replace('\'', "''")),
            Task::Rows(ks) => format!("rows of {:?}", ks.first().map(|k| &k.table)),
            Task::Entries(k) => format!("index {}", k.index),
        }
    }
}

/// Why a check did not say `ok`: SQLite refused the statement, or ran it and found damage.
enum Outcome {
    Refused(String),
    Damaged(Vec<String>),
}

impl From<Outcome> for RestoreError {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Refused(why) => RestoreError::Integrity(why),
            Outcome::Damaged(rows) => RestoreError::Integrity(rows.join("; ")),
        }
    }
}

/// SQLite virtual-machine steps between two looks at the stop token: about a millisecond.
const STOP_CHECK_STEPS: i32 = 10_000;

/// Runs the equivalent of `PRAGMA integrity_check` on a database file, without creating a WAL
/// or SHM beside it, on up to `cores` connections at once (one thread each). Returns how many
/// it checked on. Once `stop` is cancelled, every statement ends within about a millisecond
/// and the check fails with [`RestoreError::Cancelled`].
pub fn integrity_check(
    path: &Path,
    cores: usize,
    stop: &CancellationToken,
) -> Result<usize, RestoreError> {
    let connect = || open(path, stop);
    let cancelled = |r: Result<usize, RestoreError>| match stop.is_cancelled() {
        true => Err(RestoreError::Cancelled),
        false => r,
    };
    let conn = connect()?;
    let mut tasks = plan(&conn).unwrap_or_default();
    let scans = tasks.iter().any(|t| matches!(t, Task::Rows(_)));
    if cores < 2 && !scans {
        // One core and nothing to scan: SQLite's whole check does the same work, once.
        tasks.clear();
    }
    let workers = cores.max(1).min(tasks.len()).min(MAX_WORKERS);
    let mut conns = vec![conn];
    // Too many open files, say: as many as open, and the whole check on one if that is all.
    while conns.len() < workers {
        match connect() {
            Ok(c) => conns.push(c),
            Err(_) => break,
        }
    }
    if tasks.is_empty() || (conns.len() < 2 && !scans) {
        return cancelled(full(&conns[0]).map(|()| 1));
    }
    let connections = conns.len();
    let (verdict, again) = parallel(conns, &tasks);
    if !again.is_empty() {
        tracing::debug!(tables = ?again, "the index scans left doubt; SQLite checked these tables");
    }
    match verdict {
        // An interrupted statement is a refusal too: no whole check after a stop.
        _ if stop.is_cancelled() => Err(RestoreError::Cancelled),
        Some(Outcome::Refused(why)) => {
            tracing::debug!(reason = %why, "a split integrity check was refused; running the whole check on one connection");
            cancelled(full(&connect()?).map(|()| 1))
        }
        verdict => verdict.map_or(Ok(connections), |o| Err(o.into())),
    }
}

/// A read-only connection to the file whose statements are interrupted once `stop` is
/// cancelled.
fn open(path: &Path, stop: &CancellationToken) -> Result<Connection, RestoreError> {
    let uri = immutable_uri(path);
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI;
    let mut conn = Connection::open_with_flags(&uri, flags)
        .map_err(|e| RestoreError::Integrity(format!("cannot open: {e}")))?;
    let stop = stop.clone();
    conn.progress_handler(STOP_CHECK_STEPS, Some(move || stop.is_cancelled()))
        .map_err(|e| RestoreError::Integrity(format!("cannot watch for a stop: {e}")))?;
    Ok(conn)
}

/// SQLite's URI of `path`, opened immutable. Its bytes are percent-encoded but for the
/// unreserved ones and `/`: a `?` or `#` in a directory's name ended the path SQLite opened,
/// and a `%` changed it.
fn immutable_uri(path: &Path) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
    use std::os::unix::ffi::OsStrExt;
    const KEPT: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'/')
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    let bytes = path.as_os_str().as_bytes();
    let encoded: String = percent_encoding::percent_encode(bytes, KEPT).collect();
    format!("file:{encoded}?immutable=1")
}

/// SQLite's whole check on one connection.
fn full(conn: &Connection) -> Result<(), RestoreError> {
    run(conn, "PRAGMA integrity_check").map_or(Ok(()), |o| Err(o.into()))
}

/// The quick check first, then the tables' scans, the tables SQLite checks, and the indexes'
/// scans (the longest first, roughly); none when the database has no table that needs more
/// than the quick check (the whole check is then no more than it, on one core).
fn plan(conn: &Connection) -> rusqlite::Result<Vec<Task>> {
    let mut stmt = conn.prepare(FULL_CHECK_TABLES)?;
    let tables = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    if tables.is_empty() {
        return Ok(Vec::new());
    }
    // A UTF-16 file's text is read through a lossy conversion: SQLite compares its bytes.
    let utf8: bool = conn.query_row("SELECT encoding = 'UTF-8' FROM pragma_encoding", [], |r| {
        r.get(0)
    })?;
    let (mut rows, mut checked, mut entries) = (Vec::new(), Vec::new(), Vec::new());
    for (table, rowid) in tables {
        match (rowid && utf8)
            .then(|| sums::keyed_indexes(conn, &table))
            .transpose()?
        {
            Some(Some(keyed)) if !keyed.is_empty() => {
                entries.extend(keyed.iter().cloned().map(Task::Entries));
                rows.push(Task::Rows(keyed));
            }
            _ => checked.push(Task::Table(table)),
        }
    }
    Ok(std::iter::once(Task::Quick)
        .chain(rows)
        .chain(checked)
        .chain(entries)
        .collect())
}

/// Runs `sql` to the end: `None` when it says `ok`.
fn run(conn: &Connection, sql: &str) -> Option<Outcome> {
    let rows = conn.prepare(sql).and_then(|mut stmt| {
        stmt.query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<String>>>()
    });
    match rows {
        Err(e) => Some(Outcome::Refused(e.to_string())),
        Ok(rows) if rows == ["ok"] => None,
        Ok(rows) => Some(Outcome::Damaged(rows)),
    }
}

/// Runs `tasks` on the connections, one thread each, each taking the next task when it is
/// done, then `integrity_check(T)` of every table its scans left in doubt. Damage found by
/// any task is reported with every other task's; a refusal stops the tables not started yet
/// (the caller then runs the whole check), never the quick check. Also returns the tables
/// checked again after their scans.
fn parallel(conns: Vec<Connection>, tasks: &[Task]) -> (Option<Outcome>, Vec<String>) {
    let next = AtomicUsize::new(0);
    let damage: Mutex<Vec<String>> = Mutex::default();
    let refused: Mutex<Option<String>> = Mutex::default();
    // Per (table, index); a scan SQLite refused or found damaged leaves doubt, and its own
    // check of the table then says which.
    let tallies: Mutex<BTreeMap<(String, String), sums::Tally>> = Mutex::default();
    let keys = sums::Keys::new();
    let pragma = |conn: &Connection, task: &Task| match run(conn, &task.sql()) {
        None => {}
        Some(Outcome::Damaged(rows)) => lock(&damage).extend(rows),
        Some(Outcome::Refused(why)) => {
            lock(&refused).get_or_insert(format!("{}: {why}", task.sql()));
        }
    };
    let work = |conn: Connection| {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(task) = tasks.get(i) else { break };
            if *task != Task::Quick && lock(&refused).is_some() {
                break;
            }
            match task {
                Task::Quick | Task::Table(_) => pragma(&conn, task),
                Task::Rows(keyed) => {
                    let found = sums::rows(&conn, keyed, &keys);
                    let mut t = lock(&tallies);
                    for (i, k) in keyed.iter().enumerate() {
                        let tally = t.entry((k.table.clone(), k.index.clone())).or_default();
                        match found.as_ref().map(|f| f.get(i)) {
                            Ok(Some(f)) => {
                                tally.rows = f.rows;
                                tally.doubt |= f.doubt;
                            }
                            _ => tally.doubt = true,
                        }
                    }
                }
                Task::Entries(k) => {
                    let found = sums::entries(&conn, k, &keys);
                    let mut t = lock(&tallies);
                    let tally = t.entry((k.table.clone(), k.index.clone())).or_default();
                    match found {
                        Ok(f) => {
                            tally.entries = f.entries;
                            tally.doubt |= f.doubt;
                        }
                        Err(_) => tally.doubt = true,
                    }
                }
            }
        }
        conn
    };
    let work = &work;
    let (conns, panicked): (Vec<_>, Vec<_>) = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .into_iter()
            .map(|conn| s.spawn(move || work(conn)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join())
            .partition(Result::is_ok)
    });
    let conns: Vec<Connection> = conns.into_iter().filter_map(Result::ok).collect();
    if !panicked.is_empty() {
        // Its task's verdict is lost: only the whole check can stand for it.
        lock(&refused).get_or_insert("a checking thread panicked".into());
    }
    // A scanned index lacks a side's tally only when that task never ran (a refusal).
    let tallies = tallies.into_inner().unwrap_or_else(|p| p.into_inner());
    let again: Vec<String> = tasks
        .iter()
        .filter_map(|t| match t {
            Task::Entries(k) => Some(k),
            _ => None,
        })
        .filter(|k| {
            !tallies
                .get(&(k.table.clone(), k.index.clone()))
                .is_some_and(sums::Tally::sound)
        })
        .map(|k| k.table.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // Without a refusal every thread came back, with its connection.
    let clear = lock(&refused).is_none();
    if clear && let Some(conn) = conns.first() {
        for table in &again {
            pragma(conn, &Task::Table(table.clone()));
        }
    } else if clear && !again.is_empty() {
        lock(&refused).get_or_insert("no connection was left to check the tables in doubt".into());
    }
    let refused = refused.into_inner().unwrap_or_else(|p| p.into_inner());
    let damage = damage.into_inner().unwrap_or_else(|p| p.into_inner());
    let outcome = match (refused, damage.is_empty()) {
        (_, false) => Some(Outcome::Damaged(damage)),
        (Some(why), true) => Some(Outcome::Refused(why)),
        (None, true) => None,
    };
    (outcome, again)
}

/// Each guarded change is one push or one set, never left half done: a poisoned lock's data
/// is whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
