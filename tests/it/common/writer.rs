//! The seeded random writer of the soak and crash tests: data transactions of every size,
//! schema changes, VACUUMs and the application's own checkpoints, reproducible from a seed.

use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};
use rusqlite::{Connection, ErrorCode, params};

/// What a [`Writer`] may do besides data transactions.
#[derive(Debug, Clone, Copy)]
pub struct WriterOpts {
    /// Per step, probability of a schema change.
    pub schema: f64,
    /// Per step, probability of a VACUUM.
    pub vacuum: f64,
    /// Per step, probability of an application checkpoint of a random mode.
    pub checkpoint: f64,
    /// Per data transaction, probability that it is rolled back instead of committed.
    pub rollback: f64,
}

impl Default for WriterOpts {
    fn default() -> Self {
        WriterOpts {
            schema: 0.08,
            vacuum: 0.01,
            checkpoint: 0.05,
            rollback: 0.04,
        }
    }
}

/// The checkpoint modes an application may run.
pub const CHECKPOINT_MODES: [&str; 4] = ["PASSIVE", "FULL", "RESTART", "TRUNCATE"];

/// An application writing to the database with rusqlite in WAL mode: seeded random
/// transactions of inserts, updates, deletes and large (overflow) blobs, schema changes,
/// VACUUM, and its own checkpoints (a busy checkpoint is not an error).
pub struct Writer {
    pub conn: Connection,
    pub path: PathBuf,
    pub rng: StdRng,
    pub opts: WriterOpts,
    /// Transactions committed so far.
    pub commits: u64,
    /// Checkpoints run and how many of them reported busy.
    pub checkpoints: u64,
    pub busy_checkpoints: u64,
    seq: u64,
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.code == ErrorCode::DatabaseBusy || f.code == ErrorCode::DatabaseLocked)
}

impl Writer {
    /// Opens (creating if needed) the database in WAL mode with a `t0` table.
    pub fn open(path: &Path, seed: u64) -> Writer {
        Writer::with_opts(path, seed, WriterOpts::default())
    }

    pub fn with_opts(path: &Path, seed: u64, opts: WriterOpts) -> Writer {
        let conn = Connection::open(path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode.to_lowercase(), "wal");
        let mut rng = StdRng::seed_from_u64(seed);
        // A small page cache makes large transactions spill uncommitted frames into the WAL.
        if rng.random_bool(0.5) {
            conn.execute_batch("PRAGMA cache_size=32").unwrap();
        }
        let mut w = Writer {
            conn,
            path: path.to_path_buf(),
            rng,
            opts,
            commits: 0,
            checkpoints: 0,
            busy_checkpoints: 0,
            seq: 0,
        };
        w.seq = w.max_suffix();
        w.write_txn("create t0", |w| {
            w.conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS t0 (id INTEGER PRIMARY KEY, a INTEGER, b TEXT, c BLOB)",
            )
        });
        w
    }

    fn max_suffix(&self) -> u64 {
        // Names are t<N>, i<N>, x<N>: continue numbering after the largest N in use.
        let mut n = 0;
        let mut st = self.conn.prepare("SELECT name FROM sqlite_master").unwrap();
        let names: Vec<String> = st
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for name in names {
            if let Ok(v) = name[1..].parse::<u64>() {
                n = n.max(v);
            }
        }
        for t in self.tables() {
            for c in self.columns(&t) {
                if let Some(Ok(v)) = c.strip_prefix('x').map(str::parse::<u64>) {
                    n = n.max(v);
                }
            }
        }
        n + 1
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn names(&self, sql: &str) -> Vec<String> {
        super::column0(&self.conn, sql)
    }

    /// User tables (t<N>).
    pub fn tables(&self) -> Vec<String> {
        self.names("SELECT name FROM sqlite_master WHERE type='table' AND name GLOB 't[0-9]*' ORDER BY name")
    }

    fn indexes(&self) -> Vec<String> {
        self.names("SELECT name FROM sqlite_master WHERE type='index' AND name GLOB 'i[0-9]*' ORDER BY name")
    }

    fn columns(&self, table: &str) -> Vec<String> {
        self.names(&format!("SELECT name FROM pragma_table_info('{table}')"))
    }

    fn pick<T: Clone>(&mut self, v: &[T]) -> T {
        v[self.rng.random_range(0..v.len())].clone()
    }

    fn text(&mut self, max: usize) -> String {
        let n = self.rng.random_range(0..=max);
        (0..n)
            .map(|_| (b'a' + self.rng.random_range(0..26u8)) as char)
            .collect()
    }

    fn blob(&mut self, min: usize, max: usize) -> Vec<u8> {
        let mut b = vec![0u8; self.rng.random_range(min..=max)];
        self.rng.fill_bytes(&mut b);
        b
    }

    fn max_id(&self, table: &str) -> i64 {
        self.conn
            .query_row(
                &format!("SELECT coalesce(max(id), 0) FROM {table}"),
                [],
                |r| r.get(0),
            )
            .unwrap()
    }

    /// Runs `f` in `BEGIN IMMEDIATE ... COMMIT`, retrying twice if the database stays busy
    /// beyond the busy timeout.
    fn write_txn(&mut self, what: &str, mut f: impl FnMut(&mut Writer) -> rusqlite::Result<()>) {
        self.txn_inner(what, true, &mut f);
    }

    fn txn_inner(
        &mut self,
        what: &str,
        commit: bool,
        f: &mut dyn FnMut(&mut Writer) -> rusqlite::Result<()>,
    ) {
        for attempt in 0..3 {
            let r = self
                .conn
                .execute_batch("BEGIN IMMEDIATE")
                .and_then(|_| f(self))
                .and_then(|_| {
                    self.conn
                        .execute_batch(if commit { "COMMIT" } else { "ROLLBACK" })
                });
            match r {
                Ok(()) => {
                    if commit {
                        self.commits += 1;
                    }
                    return;
                }
                Err(e) => {
                    if !self.conn.is_autocommit() {
                        let _ = self.conn.execute_batch("ROLLBACK");
                    }
                    if is_busy(&e) && attempt < 2 {
                        eprintln!("writer: {what}: busy beyond the busy timeout, retrying: {e}");
                        continue;
                    }
                    panic!("writer: {what}: {e}");
                }
            }
        }
    }

    /// One random data transaction that is committed; it always inserts at least one row.
    pub fn commit_txn(&mut self) {
        self.data_txn(true);
    }

    fn data_txn(&mut self, commit: bool) {
        let ops = self.rng.random_range(1..=8);
        let op_seed: u64 = self.rng.random();
        let mut f = move |w: &mut Writer| -> rusqlite::Result<()> {
            let mut r = StdRng::seed_from_u64(op_seed);
            let tables = w.tables();
            for i in 0..ops {
                let t = tables[r.random_range(0..tables.len())].clone();
                let kind = if i == 0 { 0 } else { r.random_range(0..10) };
                match kind {
                    // Small inserts.
                    0..=3 => {
                        for _ in 0..r.random_range(1..=20) {
                            let a: i64 = w.rng.random_range(-1_000_000..1_000_000);
                            let b = w.text(200);
                            let c = if w.rng.random_bool(0.3) {
                                Some(w.blob(0, 300))
                            } else {
                                None
                            };
                            w.conn.execute(
                                &format!("INSERT INTO {t} (a, b, c) VALUES (?1, ?2, ?3)"),
                                params![a, b, c],
                            )?;
                        }
                    }
                    // A large blob: overflow pages.
                    4 => {
                        let c = w.blob(10_000, 100_000);
                        let b = w.text(20);
                        w.conn.execute(
                            &format!("INSERT INTO {t} (a, b, c) VALUES (?1, ?2, ?3)"),
                            params![c.len() as i64, b, c],
                        )?;
                    }
                    // Updates of a range of rows, sometimes replacing a large blob.
                    5..=6 => {
                        let max = w.max_id(&t);
                        if max > 0 {
                            let from = w.rng.random_range(1..=max);
                            let to = from + w.rng.random_range(0..10);
                            let b = w.text(100);
                            w.conn.execute(
                                &format!(
                                    "UPDATE {t} SET a = coalesce(a, 0) + 1, b = ?1 WHERE id BETWEEN ?2 AND ?3"
                                ),
                                params![b, from, to],
                            )?;
                            if w.rng.random_bool(0.2) {
                                let c = w.blob(5_000, 60_000);
                                w.conn.execute(
                                    &format!("UPDATE {t} SET c = ?1 WHERE id = ?2"),
                                    params![c, from],
                                )?;
                            }
                        }
                    }
                    // Updates of added columns.
                    7 => {
                        let cols: Vec<String> = w
                            .columns(&t)
                            .into_iter()
                            .filter(|c| c.starts_with('x'))
                            .collect();
                        let max = w.max_id(&t);
                        if !cols.is_empty() && max > 0 {
                            let col = w.pick(&cols);
                            let from = w.rng.random_range(1..=max);
                            let v = w.text(50);
                            w.conn.execute(
                                &format!("UPDATE {t} SET {col} = ?1 WHERE id BETWEEN ?2 AND ?3"),
                                params![v, from, from + 30],
                            )?;
                        }
                    }
                    // Deletes.
                    _ => {
                        let max = w.max_id(&t);
                        if max > 0 {
                            let from = w.rng.random_range(1..=max);
                            let to = from + w.rng.random_range(0..15);
                            w.conn.execute(
                                &format!("DELETE FROM {t} WHERE id BETWEEN ?1 AND ?2"),
                                params![from, to],
                            )?;
                        }
                    }
                }
            }
            Ok(())
        };
        self.txn_inner("data transaction", commit, &mut f);
    }

    /// One random schema change, committed: CREATE TABLE, CREATE INDEX, DROP INDEX,
    /// ALTER TABLE ADD COLUMN, or DROP TABLE (never of `t0`).
    pub fn schema_change(&mut self) {
        let tables = self.tables();
        let indexes = self.indexes();
        let n = self.next_seq();
        let t = self.pick(&tables);
        let sql = match self.rng.random_range(0..10) {
            0..=1 if tables.len() < 6 => format!(
                "CREATE TABLE t{n} (id INTEGER PRIMARY KEY, a INTEGER, b TEXT, c BLOB);\
                 INSERT INTO t{n} (a, b) VALUES ({n}, 'first')"
            ),
            2..=4 => {
                let col = if self.rng.random_bool(0.5) { "a" } else { "b" };
                format!("CREATE INDEX i{n} ON {t} ({col})")
            }
            5..=6 if !indexes.is_empty() => format!("DROP INDEX {}", self.pick(&indexes)),
            7 if tables.len() > 2 && t != "t0" => format!("DROP TABLE {t}"),
            _ => {
                let ty = if self.rng.random_bool(0.5) {
                    "TEXT DEFAULT 'd'"
                } else {
                    "INTEGER"
                };
                format!("ALTER TABLE {t} ADD COLUMN x{n} {ty}")
            }
        };
        self.write_txn(&sql.clone(), |w| w.conn.execute_batch(&sql));
    }

    /// VACUUM (its own transaction).
    pub fn vacuum(&mut self) {
        for attempt in 0..3 {
            match self.conn.execute_batch("VACUUM") {
                Ok(()) => {
                    self.commits += 1;
                    return;
                }
                Err(e) if is_busy(&e) && attempt < 2 => {
                    eprintln!("writer: VACUUM busy, retrying: {e}");
                }
                Err(e) => panic!("writer: VACUUM: {e}"),
            }
        }
    }

    /// `PRAGMA wal_checkpoint(MODE)` with a short busy timeout, now and then 1 s (long enough
    /// for the daemon to step aside: `src/replicate/db/app_checkpoint.rs`); returns `(busy,
    /// log, checkpointed)`. Busy is not an error (another writer or reader may hold it up).
    pub fn checkpoint(&mut self, mode: &str) -> (i64, i64, i64) {
        let wait = if self.rng.random_bool(0.3) {
            1000
        } else {
            self.rng.random_range(0..200)
        };
        self.conn.busy_timeout(Duration::from_millis(wait)).unwrap();
        let r = self
            .conn
            .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            });
        self.conn.busy_timeout(Duration::from_secs(5)).unwrap();
        self.checkpoints += 1;
        match r {
            Ok(res) => {
                if res.0 != 0 {
                    self.busy_checkpoints += 1;
                }
                res
            }
            Err(e) if is_busy(&e) => {
                self.busy_checkpoints += 1;
                (1, -1, -1)
            }
            Err(e) => panic!("writer: wal_checkpoint({mode}): {e}"),
        }
    }

    /// A checkpoint of a random mode.
    pub fn random_checkpoint(&mut self) -> (i64, i64, i64) {
        let mode = self.pick(&CHECKPOINT_MODES);
        self.checkpoint(mode)
    }

    /// One random step: mostly a data transaction (sometimes rolled back), else a schema
    /// change, a VACUUM or a checkpoint, as the options say.
    pub fn step(&mut self) {
        let x: f64 = self.rng.random();
        let o = self.opts;
        if x < o.schema {
            self.schema_change();
        } else if x < o.schema + o.vacuum {
            self.vacuum();
        } else if x < o.schema + o.vacuum + o.checkpoint {
            self.random_checkpoint();
        } else {
            let commit = !self.rng.random_bool(o.rollback);
            self.data_txn(commit);
        }
    }

    /// Sometimes sleeps a little, so that the daemon sees a mix of single and grouped commits.
    pub fn pause(&mut self) {
        if self.rng.random_bool(0.3) {
            sleep(Duration::from_millis(self.rng.random_range(0..40)));
        }
    }

    /// `n` steps with pauses.
    pub fn run(&mut self, n: usize) {
        for _ in 0..n {
            self.step();
            self.pause();
        }
    }
}
