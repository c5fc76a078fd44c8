//! Tests of the split integrity check against SQLite's own.

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

/// A stop ends each statement of the check at its next progress callback, not when the
/// statement is done. On connections whose stop is already cancelled, on files every part of
/// the check passes: SQLite's whole check, the quick check and a table's scans each fail as
/// interrupted (without the progress handler each would run to the end and pass), and the
/// check as a whole returns `Cancelled`, with no fallback to the whole check. Counted in
/// statements, not timed.
#[test]
fn a_stop_interrupts_the_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Far more than STOP_CHECK_STEPS for every statement below.
    let rows = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 20000)
        INSERT INTO t(b) SELECT hex(randomblob(16)) FROM r;";
    let split = db(
        dir.path(),
        "split.db",
        &format!(
            "PRAGMA journal_mode=DELETE; CREATE TABLE t(id INTEGER PRIMARY KEY, b TEXT);
             CREATE INDEX t_b ON t(b); {rows}"
        ),
    );
    let whole = db(
        dir.path(),
        "whole.db",
        &format!(
            "PRAGMA journal_mode=DELETE; CREATE TABLE t(id INTEGER PRIMARY KEY, b TEXT); {rows}"
        ),
    );
    let stopped = CancellationToken::new();
    stopped.cancel();
    let interrupted = |o: Option<Outcome>, what: &str| match o {
        Some(Outcome::Refused(why)) if why.contains("interrupt") => {}
        Some(Outcome::Refused(why)) => panic!("{what} refused on a stopped connection: {why}"),
        Some(Outcome::Damaged(rows)) => panic!("{what} found damage: {rows:?}"),
        None => panic!("{what} ran to the end after a stop"),
    };
    for p in [&split, &whole] {
        assert_eq!(pragma(p, "PRAGMA integrity_check"), ["ok"]);
        let conn = open(p, &stopped).expect("open");
        interrupted(run(&conn, "PRAGMA integrity_check"), "the whole check");
        interrupted(run(&conn, "PRAGMA quick_check"), "the quick check");
        assert!(
            matches!(
                integrity_check(p, 2, &stopped),
                Err(RestoreError::Cancelled)
            ),
            "{}",
            p.display()
        );
    }

    let tasks = plan(&open(&split, &CancellationToken::new()).expect("open")).expect("plan");
    let keys = sums::Keys::new();
    let fresh = open(&split, &CancellationToken::new()).expect("open");
    let conn = open(&split, &stopped).expect("open");
    let mut scans = 0;
    for task in &tasks {
        match task {
            Task::Rows(keyed) => {
                sums::rows(&fresh, keyed, &keys).expect("the table's scan passes unstopped");
                let r = sums::rows(&conn, keyed, &keys);
                assert!(r.is_err(), "the table's scan ran to the end after a stop");
            }
            Task::Entries(k) => {
                sums::entries(&fresh, k, &keys).expect("the index's scan passes unstopped");
                let r = sums::entries(&conn, k, &keys);
                assert!(r.is_err(), "the index's scan ran to the end after a stop");
            }
            _ => continue,
        }
        scans += 1;
    }
    assert_eq!(
        scans, 2,
        "the indexed table and its index are scanned: {tasks:?}"
    );
}

/// A path whose names hold `?`, `#`, `%` and a space is checked at that path, not at the
/// part before the `?` or `#` (which SQLite took for the end of the path) nor at a decoded one.
#[test]
fn a_path_with_uri_characters_is_checked_where_it_is() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let odd = dir.path().join("app#2 ?x=%41");
    std::fs::create_dir(&odd).expect("the odd directory");
    let p = db(
        &odd,
        "data.db",
        "CREATE TABLE t(a); INSERT INTO t VALUES (1);",
    );
    assert!(immutable_uri(&p).ends_with("/app%232%20%3Fx%3D%2541/data.db?immutable=1"));
    let stop = CancellationToken::new();
    integrity_check(&p, 2, &stop).expect("the database at that path checks");
    assert_eq!(pragma(&p, "SELECT count(*) || '' FROM t"), ["1"]);
}
