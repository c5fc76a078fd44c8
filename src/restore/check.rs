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
    let uri = format!("file:{}?immutable=1", path.display());
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI;
    let mut conn = Connection::open_with_flags(&uri, flags)
        .map_err(|e| RestoreError::Integrity(format!("cannot open: {e}")))?;
    let stop = stop.clone();
    conn.progress_handler(STOP_CHECK_STEPS, Some(move || stop.is_cancelled()))
        .map_err(|e| RestoreError::Integrity(format!("cannot watch for a stop: {e}")))?;
    Ok(conn)
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
mod tests {
    use super::*;

    fn db(dir: &Path, name: &str, sql: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        let c = Connection::open(&p).expect("open");
        c.execute_batch(sql).expect("schema and rows");
        p
    }

    fn pragma(p: &Path, sql: &str) -> Vec<String> {
        let c = open(p, &CancellationToken::new()).expect("open");
        let mut stmt = c.prepare(sql).expect("prepare");
        stmt.query_map([], |r| r.get::<_, String>(0))
            .expect("query")
            .collect::<rusqlite::Result<Vec<_>>>()
            .expect("rows")
    }

    fn two(p: &Path) -> Vec<Connection> {
        vec![
            open(p, &CancellationToken::new()).expect("open"),
            open(p, &CancellationToken::new()).expect("open"),
        ]
    }

    /// The split check itself (no fallback to the whole one): its verdict on `p`, and the
    /// tables its scans left to SQLite's check.
    fn split(p: &Path) -> (Option<Outcome>, Vec<String>) {
        let tasks = plan(&open(p, &CancellationToken::new()).expect("open")).expect("plan");
        parallel(two(p), &tasks)
    }

    /// Damage the quick check misses and SQLite's whole check finds: the scans doubt `table`
    /// alone, and SQLite's check of it, run after them, reports the damage it returns.
    fn found_after_the_scans(p: &Path, table: &str) -> Vec<String> {
        assert_eq!(pragma(p, "PRAGMA quick_check"), ["ok"]);
        assert_ne!(pragma(p, "PRAGMA integrity_check"), ["ok"]);
        let (verdict, again) = split(p);
        assert_eq!(again, [table], "the scans doubt it");
        match verdict {
            Some(Outcome::Damaged(rows)) => rows,
            _ => panic!("no damage reported for {table}"),
        }
    }

    /// The tables `tasks` scan, and those SQLite checks, sorted.
    fn scanned_and_checked(tasks: &[Task]) -> (Vec<String>, Vec<String>) {
        let mut scanned = Vec::new();
        let mut checked = Vec::new();
        for t in tasks {
            match t {
                Task::Rows(ks) => scanned.extend(ks.first().map(|k| k.table.clone())),
                Task::Table(name) => checked.push(name.clone()),
                _ => {}
            }
        }
        scanned.sort();
        checked.sort();
        (scanned, checked)
    }

    /// Edits `sqlite_schema` directly, as a damaged file could have it.
    fn edit_schema(p: &Path, sql: &str) {
        let c = Connection::open(p).expect("open");
        c.execute_batch(&format!("PRAGMA writable_schema=ON; {sql}"))
            .expect("schema edit");
    }

    const ROWS: &str = "PRAGMA journal_mode=DELETE;
        CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT);
        CREATE INDEX t_a ON t(a);
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500)
        INSERT INTO t(a) SELECT 'row-' || i FROM n;";

    #[test]
    fn every_kind_of_table_that_needs_it_gets_its_own_check_and_a_sound_file_passes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = db(
            dir.path(),
            "kinds.db",
            &format!(
                "{ROWS}
                CREATE TABLE plain(x);
                INSERT INTO plain VALUES (1), (2);
                CREATE TABLE wr(k TEXT PRIMARY KEY, v) WITHOUT ROWID;
                INSERT INTO wr VALUES ('a', 1), ('b', 2);
                CREATE TABLE \"it's\"(x UNIQUE);
                INSERT INTO \"it's\" VALUES (1);
                CREATE TABLE \"100\"(x UNIQUE);
                INSERT INTO \"100\" VALUES (1);
                CREATE VIRTUAL TABLE docs USING fts5(body);
                INSERT INTO docs VALUES ('the quick brown fox');"
            ),
        );
        let tasks = plan(&open(&p, &CancellationToken::new()).expect("open")).expect("plan");
        assert_eq!(tasks[0], Task::Quick);
        let (scanned, checked) = scanned_and_checked(&tasks);
        assert_eq!(scanned, ["100", "it's", "t"], "{tasks:?}");
        // The full-text table and its shadow tables (one WITHOUT ROWID) are SQLite's.
        assert_eq!(
            checked,
            ["docs", "docs_config", "docs_idx", "wr"],
            "{tasks:?}"
        );
        assert_eq!(pragma(&p, "PRAGMA integrity_check"), ["ok"]);
        let (verdict, again) = split(&p);
        assert!(verdict.is_none(), "no task refused or found damage");
        assert!(again.is_empty(), "the scans settled every table: {again:?}");
        integrity_check(&p, 2, &CancellationToken::new())
            .expect("a sound file passes on two connections");
        integrity_check(&p, 1, &CancellationToken::new()).expect("and on one");
    }

    /// An index that misses a row's new value: the quick check passes it, SQLite's whole
    /// check and the split one do not.
    #[test]
    fn a_stale_index_passes_the_quick_check_and_fails_the_split_one() {
        // A wrong `tbl_name` must not hide the index from the check.
        for tbl_name in ["t", "elsewhere"] {
            stale_index(tbl_name);
        }
    }

    /// Runs `update` while index `index` is out of the schema, so the index keeps the old
    /// values, then puts it back under `tbl_name`.
    fn stale(p: &Path, index: &str, tbl_name: &str, update: &str) {
        let c = open(p, &CancellationToken::new()).expect("open");
        let (root, sql): (i64, String) = c
            .query_row(
                "SELECT rootpage, sql FROM sqlite_schema WHERE name = ?1",
                [index],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("the index's row");
        drop(c);
        edit_schema(
            p,
            &format!("DELETE FROM sqlite_schema WHERE name = '{index}';"),
        );
        let c = Connection::open(p).expect("open");
        c.execute(update, []).expect("update without the index");
        drop(c);
        edit_schema(
            p,
            &format!(
                "INSERT INTO sqlite_schema(type, name, tbl_name, rootpage, sql) \
                 VALUES ('index', '{index}', '{tbl_name}', {root}, '{}');",
                sql.replace('\'', "''")
            ),
        );
    }

    fn stale_index(tbl_name: &str) {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = db(dir.path(), "stale.db", ROWS);
        stale(
            &p,
            "t_a",
            tbl_name,
            "UPDATE t SET a = 'changed' WHERE id = 5",
        );
        if tbl_name != "t" {
            // SQLite 3.54 calls such a schema malformed: every check refuses the file.
            let err = integrity_check(&p, 2, &CancellationToken::new())
                .expect_err("a malformed schema")
                .to_string();
            assert!(err.contains("malformed"), "{err}");
            return;
        }
        let rows = found_after_the_scans(&p, "t");
        assert!(
            rows.iter().any(|r| r.contains("t_a")),
            "the table's own check, run after the scans, names it: {rows:?}"
        );
        let err = integrity_check(&p, 2, &CancellationToken::new())
            .expect_err("the stale index is found")
            .to_string();
        assert!(err.contains("t_a"), "{err}");
        assert!(integrity_check(&p, 1, &CancellationToken::new()).is_err());
    }

    /// Pages no table uses: only the quick check (of the whole file) can see them.
    #[test]
    fn pages_no_table_uses_fail_the_split_check() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = db(
            dir.path(),
            "orphans.db",
            &format!(
                "{ROWS}
                CREATE TABLE junk(x);
                INSERT INTO junk SELECT randomblob(3000) FROM t LIMIT 20;"
            ),
        );
        edit_schema(&p, "DELETE FROM sqlite_schema WHERE name = 'junk';");
        assert_eq!(pragma(&p, "PRAGMA integrity_check('t')"), ["ok"]);
        let err = integrity_check(&p, 2, &CancellationToken::new())
            .expect_err("orphan pages are found")
            .to_string();
        assert!(err.contains("never used"), "{err}");
    }

    /// A virtual table whose module this SQLite lacks: SQLite's whole check skips it, and so
    /// does the split one.
    #[test]
    fn a_virtual_table_of_a_missing_module_is_checked_as_sqlite_checks_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = db(dir.path(), "module.db", ROWS);
        edit_schema(
            &p,
            "INSERT INTO sqlite_schema(type, name, tbl_name, rootpage, sql) \
             VALUES ('table', 'v', 'v', 0, 'CREATE VIRTUAL TABLE v USING no_such_module(x)');",
        );
        assert_eq!(pragma(&p, "PRAGMA integrity_check"), ["ok"]);
        integrity_check(&p, 2, &CancellationToken::new()).expect("the check SQLite runs passes");
    }

    /// A task SQLite refuses is reported as refused (the caller then runs the whole check),
    /// unless another task found damage, which is the verdict.
    #[test]
    fn a_refused_task_is_told_apart_from_damage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = db(dir.path(), "refused.db", ROWS);
        let tasks = [Task::Quick, Task::Table("no_such_table".into())];
        let got = parallel(two(&p), &tasks).0;
        assert!(
            matches!(&got, Some(Outcome::Refused(why)) if why.contains("no_such_table")),
            "{}",
            got.is_some()
        );
        edit_schema(
            &p,
            "CREATE TABLE junk(x); DELETE FROM sqlite_schema WHERE name = 'junk';",
        );
        // The quick check runs even when the refusal comes first.
        let got = parallel(two(&p), &tasks).0;
        assert!(matches!(got, Some(Outcome::Damaged(_))));
    }

    /// Every shape of index the scans take, on rows SQLite stores in more than one way: the
    /// scans alone pass the sound file (no table is sent to SQLite's check), and the shapes
    /// they do not take go to SQLite's check.
    #[test]
    fn the_scans_settle_every_index_shape_they_take_and_leave_the_rest_to_sqlite() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = db(
            dir.path(),
            "shapes.db",
            "PRAGMA journal_mode=DELETE;
            CREATE TABLE s(id INTEGER PRIMARY KEY, a TEXT, b REAL, c, d BLOB, \"rowid\" TEXT,
                g INTEGER GENERATED ALWAYS AS (length(a)) STORED, u TEXT UNIQUE);
            CREATE INDEX s_ab ON s(a, b DESC);
            CREATE INDEX s_cd ON s(c DESC, d);
            CREATE INDEX s_rowid ON s(\"rowid\");
            CREATE INDEX s_g ON s(g);
            CREATE UNIQUE INDEX s_bc ON s(b, c);
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400)
            INSERT INTO s(a, b, c, d, \"rowid\", u) SELECT
                CASE WHEN i % 7 = 0 THEN NULL ELSE 'v' || (i % 13) END,
                CASE WHEN i % 3 = 0 THEN i ELSE i + 0.5 END,
                CASE i % 5 WHEN 0 THEN i WHEN 1 THEN i || '' WHEN 2 THEN i * 1.0
                    WHEN 3 THEN randomblob(2) ELSE NULL END,
                CASE WHEN i % 5 = 0 THEN NULL ELSE randomblob(i % 9) END,
                'r' || (i % 3),
                CASE WHEN i % 2 = 0 THEN NULL ELSE 'u' || i END
            FROM n;
            CREATE TABLE partial(x, y);
            CREATE INDEX partial_x ON partial(x) WHERE y > 0;
            CREATE TABLE expr(x TEXT);
            CREATE INDEX expr_x ON expr(lower(x));
            CREATE TABLE folded(x TEXT);
            CREATE UNIQUE INDEX folded_x ON folded(x COLLATE NOCASE);
            CREATE TABLE nocase(x TEXT);
            CREATE INDEX nocase_x ON nocase(x COLLATE NOCASE);
            CREATE TABLE ipk(id INTEGER PRIMARY KEY, c);
            CREATE INDEX ipk_c_id ON ipk(c, id);
            CREATE TABLE virt(j TEXT, n AS (CAST(j AS INTEGER)) VIRTUAL);
            CREATE INDEX virt_n ON virt(n);
            CREATE TABLE twice(a, b);
            CREATE INDEX twice_aba ON twice(a, b, a);
            INSERT INTO partial VALUES (1, 1), (2, 0);
            INSERT INTO expr VALUES ('A'), ('b');
            INSERT INTO folded VALUES ('A'), ('b');
            INSERT INTO nocase VALUES ('A'), ('a');
            INSERT INTO ipk(c) VALUES (1), (2);
            INSERT INTO virt(j) VALUES ('5'), ('x');
            INSERT INTO twice VALUES (1, 2), (2, 1);",
        );
        let tasks = plan(&open(&p, &CancellationToken::new()).expect("open")).expect("plan");
        let (scanned, checked) = scanned_and_checked(&tasks);
        assert_eq!(scanned, ["s"], "{tasks:?}");
        assert_eq!(
            checked,
            [
                "expr", "folded", "ipk", "nocase", "partial", "twice", "virt"
            ],
            "{tasks:?}"
        );
        assert_eq!(pragma(&p, "PRAGMA integrity_check"), ["ok"]);
        let (verdict, again) = split(&p);
        assert!(verdict.is_none());
        assert!(again.is_empty(), "the scans alone passed it: {again:?}");
        integrity_check(&p, 1, &CancellationToken::new()).expect("one connection scans too");
    }

    /// An index whose entries are all there but not in its key order (its schema turned to
    /// DESC): SQLite's seeks miss rows, so the scans must doubt it too.
    #[test]
    fn an_index_out_of_its_key_order_is_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = db(dir.path(), "order.db", ROWS);
        edit_schema(
            &p,
            "UPDATE sqlite_schema SET sql = 'CREATE INDEX t_a ON t(a DESC)' WHERE name = 't_a';",
        );
        found_after_the_scans(&p, "t");
        assert!(integrity_check(&p, 2, &CancellationToken::new()).is_err());
    }

    /// A UTF-16 file: its text reaches the scans through a lossy conversion, so SQLite checks
    /// every table itself.
    #[test]
    fn a_utf16_database_is_left_to_sqlite() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = db(
            dir.path(),
            "utf16.db",
            &format!("PRAGMA encoding = 'UTF-16le'; {ROWS}"),
        );
        let tasks = plan(&open(&p, &CancellationToken::new()).expect("open")).expect("plan");
        assert_eq!(scanned_and_checked(&tasks), (vec![], vec!["t".to_string()]));
        integrity_check(&p, 2, &CancellationToken::new()).expect("a sound file passes");
    }

    /// A UNIQUE index holding one key twice (its schema says UNIQUE, its entries were written
    /// without the constraint): the quick check passes it, the scans see the duplicate and
    /// SQLite's check of the table names it.
    #[test]
    fn a_duplicate_key_in_a_unique_index_is_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = db(
            dir.path(),
            "dup.db",
            "PRAGMA journal_mode=DELETE;
            CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT);
            CREATE INDEX t_a ON t(a);
            INSERT INTO t(a) VALUES ('x'), ('y'), (NULL), (NULL), ('y'), ('z');",
        );
        edit_schema(
            &p,
            "UPDATE sqlite_schema SET sql = 'CREATE UNIQUE INDEX t_a ON t(a)' \
             WHERE name = 't_a';",
        );
        let rows = found_after_the_scans(&p, "t");
        assert!(
            rows.iter().any(|r| r.contains("non-unique")),
            "SQLite's check of the table names the duplicate: {rows:?}"
        );
        assert!(integrity_check(&p, 2, &CancellationToken::new()).is_err());
        // Two NULL keys are not a duplicate: the same file without the second 'y' passes.
        let c = Connection::open(&p).expect("open");
        c.execute("DELETE FROM t WHERE id = 5", []).expect("delete");
        drop(c);
        assert_eq!(pragma(&p, "PRAGMA integrity_check"), ["ok"]);
        assert!(split(&p).1.is_empty());
    }

    /// Damage anywhere in the file, byte by byte: the split check and SQLite's whole check
    /// agree on every copy (ok, or not ok), and the scans never pass an index that the table's
    /// own check fails.
    #[test]
    fn the_split_check_agrees_with_sqlite_on_damaged_copies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = db(
            dir.path(),
            "src.db",
            "PRAGMA journal_mode=DELETE; PRAGMA page_size=1024;
            CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT, b REAL, c UNIQUE);
            CREATE INDEX t_a ON t(a);
            CREATE INDEX t_ba ON t(b, a);
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
            INSERT INTO t(a, b, c) SELECT 'k' || (i * 7919 % 300), i / 3.0, i FROM n;",
        );
        let bytes = std::fs::read(&src).expect("read");
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut damaged, mut scanned_ok) = (0, 0);
        for i in 0..120 {
            let mut copy = bytes.clone();
            // Past page 1 (the header and the schema): a page of the table or of an index.
            let at = 1024 + (next() as usize) % (copy.len() - 1024);
            copy[at] ^= 1 << (next() % 8);
            let p = dir.path().join(format!("copy{i}.db"));
            std::fs::write(&p, &copy).expect("write");
            let sqlite_ok = open(&p, &CancellationToken::new())
                .is_ok_and(|c| run(&c, "PRAGMA integrity_check").is_none());
            let ours_ok = integrity_check(&p, 2, &CancellationToken::new()).is_ok();
            assert_eq!(ours_ok, sqlite_ok, "copy {i}: byte {at} flipped");
            assert_eq!(
                integrity_check(&p, 1, &CancellationToken::new()).is_ok(),
                sqlite_ok,
                "copy {i} on one connection"
            );
            damaged += usize::from(!sqlite_ok);
            scanned_ok += usize::from(ours_ok);
        }
        // Both kinds of copy were met: damage found, and flips in unused bytes passed.
        assert!(
            damaged > 10 && scanned_ok > 10,
            "{damaged} damaged, {scanned_ok} ok"
        );
    }

    /// A stale index on a STORED generated column: its scan must read the index's own values
    /// (not the table's), so the sums differ and SQLite's check names it.
    #[test]
    fn a_stale_index_on_a_stored_generated_column_is_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = db(
            dir.path(),
            "generated.db",
            "PRAGMA journal_mode=DELETE;
            CREATE TABLE g(id INTEGER PRIMARY KEY, a TEXT, n AS (length(a)) STORED);
            CREATE INDEX g_n ON g(n);
            WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 200)
            INSERT INTO g(a) SELECT substr('abcdefghij', 1, i % 10) FROM r;",
        );
        stale(
            &p,
            "g_n",
            "g",
            "UPDATE g SET a = 'a much longer value' WHERE id = 7",
        );
        found_after_the_scans(&p, "g");
    }

    /// A stop ends the check at its next progress callback, not when the check is done: a
    /// stop a tenth of the way in returns `Cancelled` in well under the uninterrupted time.
    #[test]
    fn a_stop_interrupts_the_check() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = db(
            dir.path(),
            "big.db",
            "PRAGMA journal_mode=DELETE;
            CREATE TABLE t(id INTEGER PRIMARY KEY, b TEXT);
            CREATE INDEX t_b ON t(b);
            WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 200000)
            INSERT INTO t(b) SELECT hex(randomblob(16)) FROM r;",
        );
        let started = std::time::Instant::now();
        integrity_check(&p, 1, &CancellationToken::new()).expect("a sound file passes");
        let whole = started.elapsed();

        let stop = CancellationToken::new();
        let stopper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                std::thread::sleep(whole / 10);
                stop.cancel();
            })
        };
        let started = std::time::Instant::now();
        let r = integrity_check(&p, 1, &stop);
        let took = started.elapsed();
        stopper.join().expect("the stopper thread");
        assert!(matches!(r, Err(RestoreError::Cancelled)), "{r:?}");
        assert!(
            took < whole / 2,
            "stopped after {took:?}; the whole check takes {whole:?}"
        );
    }
}
