//! End-to-end tests of `replicad replicate`: the real daemon replicates a database that a
//! seeded random writer changes (inserts, updates, deletes, overflow blobs, schema changes,
//! VACUUM, application checkpoints of every mode), is stopped by signals or killed, and the
//! replica must restore to exactly the source's content, with a level-0 TXID chain `1..=N`.
//!
//! Set `REPLICAD_TEST_SEED` to replay a failure (every test prints its seed), and
//! `REPLICAD_TEST_KEEP=1` to keep the temp directories (they are kept anyway on failure).

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, sleep};
use std::time::Duration;

use common::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

mod busy_writer;

/// A test's directory layout: `db/` holds the database, replicas beside it.
struct Setup {
    dir: TestDir,
    db: PathBuf,
    replica: PathBuf,
}

impl Setup {
    fn new(name: &str) -> Setup {
        let dir = TestDir::new(name);
        std::fs::create_dir_all(dir.join("db")).unwrap();
        let db = dir.join("db/app.db");
        let replica = dir.join("replica");
        Setup { dir, db, replica }
    }

    fn spawn(&self, extra: &[&str]) -> Daemon {
        // A busy database ships at every poll, as these tests were written for.
        let mut args = vec![
            s(&self.db),
            s(&self.replica),
            "--monitor-interval",
            "50ms",
            "--min-sync-interval",
            "50ms",
        ];
        args.extend_from_slice(extra);
        spawn_replicate(self.dir.path(), &args)
    }

    /// Restores the latest state and compares it with the source.
    fn check_restore(&self, ctx: &str) {
        let out = self
            .dir
            .join(&format!("restored-{}.db", ctx.replace(' ', "-")));
        restore_ok(s(&self.replica), &out, None);
        assert_same_content(&self.db, &out, ctx);
    }

    fn context(&self) -> String {
        format!("{}\n{}", listing(&self.replica), self.dir.logs())
    }
}

/// The daemon must still be running (it did not crash on what it was given).
fn assert_running(d: &mut Daemon, dir: &TestDir) {
    assert!(
        d.running(),
        "replicad replicate exited early; logs:\n{}",
        dir.logs()
    );
}

#[test]
fn random_writes_then_sigterm_restore_equals_source() {
    let seed = seed("random_writes_then_sigterm_restore_equals_source");
    let t = Setup::new("random-writes");
    let mut w = Writer::open(&t.db, seed);
    // Every codec: the restore must not depend on it.
    let codec = ["lz4", "zstd", "gzip", "none"][w.rng.random_range(0..4)];
    println!("compression {codec}");
    let mut d = t.spawn(&["--min-checkpoint-page-count", "64", "--compression", codec]);
    for i in 0..150 {
        w.step();
        w.pause();
        if i == 70 {
            w.vacuum();
        }
        if i == 100 {
            w.schema_change();
        }
    }
    assert_running(&mut d, &t.dir);
    d.stop_ok();
    let n = assert_l0_contiguous(&t.replica);
    assert!(n >= 2, "only {n} TXIDs for {} commits", w.commits);
    t.check_restore("latest");
    // A clean shutdown leaves no half-written files on the replica.
    let strays: Vec<String> = std::fs::read_dir(t.replica.join("ltx/0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| parse_ltx_name(n).is_none())
        .collect();
    assert!(strays.is_empty(), "stray files on the replica: {strays:?}");
}

#[test]
fn app_checkpoints_with_and_without_daemon() {
    let seed = seed("app_checkpoints_with_and_without_daemon");
    let t = Setup::new("app-checkpoints");
    let opts = WriterOpts {
        checkpoint: 0.2,
        ..WriterOpts::default()
    };
    let mut w = Writer::with_opts(&t.db, seed, opts);
    let mut d = t.spawn(&[]);
    w.run(80);
    for mode in CHECKPOINT_MODES {
        w.commit_txn();
        w.checkpoint(mode);
        w.commit_txn();
    }
    println!(
        "{} checkpoints while the daemon ran, {} busy",
        w.checkpoints, w.busy_checkpoints
    );
    assert_running(&mut d, &t.dir);
    d.stop_ok();
    let before = max_replica_txid(&t.replica);

    // The daemon is down: the application writes, truncates the WAL, writes again.
    for _ in 0..15 {
        w.commit_txn();
    }
    let (busy, _, _) = w.checkpoint("TRUNCATE");
    assert_eq!(
        busy, 0,
        "TRUNCATE checkpoint with no daemon running was busy"
    );
    let wal = PathBuf::from(format!("{}-wal", t.db.display()));
    assert_eq!(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0), 0);
    for _ in 0..10 {
        w.commit_txn();
    }

    let d = t.spawn(&[]);
    assert!(
        wait_for_txid(&t.replica, before + 1, WAIT),
        "restarted daemon replicated nothing new; {}",
        t.context()
    );
    w.run(10);
    d.stop_ok();
    let n = assert_l0_contiguous(&t.replica);
    assert!(n > before);
    t.check_restore("after restart");
}

#[test]
fn kill9_at_random_points_then_restart() {
    let seed = seed("kill9_at_random_points_then_restart");
    let t = Setup::new("kill9");
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut w = Writer::open(&t.db, seed);
    w.run(5);

    // The writer runs in bursts on its own thread for the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let burst = w.rng.random_range(1..15);
                for _ in 0..burst {
                    w.step();
                }
                let ms = w.rng.random_range(0..80);
                sleep(Duration::from_millis(ms));
            }
            w
        })
    };

    for round in 0..6 {
        let d = t.spawn(&["--min-checkpoint-page-count", "32"]);
        if round % 2 == 1 {
            // Let this daemon get at least one sync out before it dies.
            let m = max_replica_txid(&t.replica);
            assert!(
                wait_for_txid(&t.replica, m + 1, WAIT),
                "round {round}: no progress; {}",
                t.context()
            );
        }
        sleep(Duration::from_millis(rng.random_range(50..600)));
        d.kill9();
        println!(
            "round {round}: killed; replica max TXID {:x}",
            max_replica_txid(&t.replica)
        );
        if rng.random_bool(0.5) {
            sleep(Duration::from_millis(rng.random_range(0..300)));
        }
    }
    let m = max_replica_txid(&t.replica);
    let mut d = t.spawn(&[]);
    // Started (and past its signal handlers) once the replica moved on.
    assert!(
        wait_for_txid(&t.replica, m + 1, WAIT),
        "the last daemon made no progress; {}",
        t.context()
    );
    stop.store(true, Ordering::Relaxed);
    let w = writer.join().expect("writer thread panicked");
    println!("writer committed {} transactions", w.commits);
    assert_running(&mut d, &t.dir);
    d.stop_ok();

    let ranges = l0_ranges(&t.replica);
    let txids = l0_txids(&t.replica);
    let mut dedup = txids.clone();
    dedup.dedup();
    assert_eq!(txids, dedup, "duplicate TXIDs on the replica: {ranges:x?}");
    assert_l0_contiguous(&t.replica);
    t.check_restore("after kill -9 rounds");
}

/// What a crashed run left half-made beside the database (a segment being written, a seed
/// snapshot, a compaction's partial output) is dropped by the next start, never shipped.
#[test]
fn a_start_drops_what_a_crashed_run_left_half_made() {
    let t = Setup::new("leftovers");
    let mut w = Writer::open(
        &t.db,
        seed("a_start_drops_what_a_crashed_run_left_half_made"),
    );
    w.run(5);
    let d = t.spawn(&[]);
    assert!(wait_for_txid(&t.replica, 1, WAIT), "{}", t.context());
    d.kill9();
    let m = max_replica_txid(&t.replica);
    let meta = t.dir.join("db/.app.db-replicad");
    let planted = [
        meta.join("ltx/0/0000000000000063-0000000000000063.ltx.tmp"),
        meta.join("seed/0000000000000001-0000000000000063.ltx"),
        meta.join("tmp/file/compacting.ltx"),
    ];
    for p in &planted {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"half made").unwrap();
    }
    let d = t.spawn(&[]);
    w.run(5);
    assert!(wait_for_txid(&t.replica, m + 1, WAIT), "{}", t.context());
    d.stop_ok();
    for p in &planted {
        assert!(!p.exists(), "{} is still there", p.display());
    }
    t.check_restore("after the leftovers");
}

#[test]
fn two_replicas_restore_the_same() {
    let seed = seed("two_replicas_restore_the_same");
    let t = Setup::new("two-replicas");
    let second = t.dir.join("replica2");
    let url2 = format!("file://{}", second.display());
    let mut w = Writer::open(&t.db, seed);
    let d = t.spawn(&[&url2]);
    w.run(60);
    // SIGINT must drain like SIGTERM.
    let st = d.stop_int();
    assert_eq!(
        st.code(),
        Some(0),
        "exit {st} after SIGINT; {}",
        t.context()
    );
    for (i, r) in [&t.replica, &second].into_iter().enumerate() {
        assert_l0_contiguous(r);
        let out = t.dir.join(&format!("restored-{i}.db"));
        restore_ok(s(r), &out, None);
        assert_same_content(&t.db, &out, &format!("replica {i}"));
    }
    assert_eq!(
        max_replica_txid(&t.replica),
        max_replica_txid(&second),
        "the replicas stopped at different TXIDs"
    );
}

#[test]
fn point_in_time_every_recorded_txid() {
    let seed = seed("point_in_time_every_recorded_txid");
    let t = Setup::new("pitr");
    let mut w = Writer::open(&t.db, seed);
    w.commit_txn();
    let d = t.spawn(&[]);
    let quiet = Duration::from_millis(400);
    let mut prev = wait_stable_txid(&t.replica, 1, quiet, WAIT)
        .unwrap_or_else(|| panic!("no initial sync; {}", t.context()));
    let mut recorded = vec![(prev, content_hash(&t.db))];
    for batch in 0..10 {
        // One transaction per batch: every TXID from its sync on has this content.
        if batch % 4 == 3 {
            w.schema_change();
        } else {
            w.commit_txn();
        }
        let txid = wait_stable_txid(&t.replica, prev + 1, quiet, WAIT)
            .unwrap_or_else(|| panic!("batch {batch} not replicated; {}", t.context()));
        recorded.push((txid, content_hash(&t.db)));
        prev = txid;
    }
    d.stop_ok();
    assert_l0_contiguous(&t.replica);
    for (txid, hash) in &recorded {
        let out = t.dir.join(&format!("pitr-{txid:016x}.db"));
        restore_ok(s(&t.replica), &out, Some(*txid));
        assert_eq!(
            &content_hash(&out),
            hash,
            "restore --txid {txid:016x} differs from the source as it was; recorded {recorded:x?}"
        );
        assert!(integrity_ok(&out));
    }
    t.check_restore("latest");
}

#[test]
fn database_created_after_start() {
    let seed = seed("database_created_after_start");
    let t = Setup::new("created-later");
    let mut d = t.spawn(&[]);
    sleep(Duration::from_millis(500));
    assert_running(&mut d, &t.dir);
    assert!(!t.db.exists(), "the daemon created the database itself");

    // Created in rollback-journal mode: the daemon converts it to WAL.
    {
        let c = rusqlite::Connection::open(&t.db).unwrap();
        c.busy_timeout(Duration::from_secs(5)).unwrap();
        c.execute_batch(
            "CREATE TABLE early (id INTEGER PRIMARY KEY, v TEXT);
             INSERT INTO early (v) VALUES ('one'), ('two'), ('three');",
        )
        .unwrap();
    }
    assert!(
        wait_for_txid(&t.replica, 1, WAIT),
        "nothing replicated after the database appeared; {}",
        t.context()
    );
    let mut w = Writer::open(&t.db, seed);
    w.run(40);
    assert_running(&mut d, &t.dir);
    d.stop_ok();
    assert_l0_contiguous(&t.replica);
    t.check_restore("created after start");
}

#[test]
fn config_file_form() {
    let seed = seed("config_file_form");
    let t = TestDir::new("config");
    std::fs::create_dir_all(t.join("dbs")).unwrap();
    let (a, b) = (t.join("dbs/a.db"), t.join("dbs/b.db"));
    let (ra, rb) = (t.join("replica-a"), t.join("replica-b"));
    let config = t.join("replicad.yml");
    write_file(
        &config,
        &format!(
            "dbs:\n\
             \x20 - path: {}\n\
             \x20   monitor-interval: 50ms\n\
             \x20   replicas:\n\
             \x20     - url: file://{}\n\
             \x20 - path: {}\n\
             \x20   monitor-interval: 50ms\n\
             \x20   replicas:\n\
             \x20     - type: file\n\
             \x20       path: {}\n",
            a.display(),
            ra.display(),
            b.display(),
            rb.display()
        ),
    );
    let mut wa = Writer::open(&a, seed);
    let mut wb = Writer::open(&b, seed.wrapping_add(1));
    let mut d = spawn_replicate(t.path(), &["--config", s(&config)]);
    for _ in 0..40 {
        wa.step();
        wb.step();
        wa.pause();
    }
    assert_running(&mut d, &t);
    d.stop_ok();
    for (db, r) in [(&a, &ra), (&b, &rb)] {
        assert_l0_contiguous(r);
        let out = PathBuf::from(format!("{}.restored", r.display()));
        restore_ok(s(r), &out, None);
        assert_same_content(db, &out, &format!("{}", db.display()));
    }
}

#[test]
fn litestream_restores_replicad_replica() {
    let Some(ls) = common::litestream_bin() else {
        if std::env::var_os("CI").is_some() {
            panic!("litestream is not installed, and CI must run the interoperability test");
        }
        println!("SKIPPED: litestream not installed");
        return;
    };
    let seed = seed("litestream_restores_replicad_replica");

    let t = Setup::new("litestream-lz4");
    let mut w = Writer::open(&t.db, seed);
    let d = t.spawn(&["--compression", "lz4"]);
    w.run(60);
    d.stop_ok();
    assert_l0_contiguous(&t.replica);
    let out = t.dir.join("litestream.db");
    let o = litestream_restore(&ls, &t.replica, &out);
    assert!(
        o.status.success(),
        "litestream restore of an lz4 replica failed: {}\n{}{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        listing(&t.replica)
    );
    assert_same_content(&t.db, &out, "litestream restore (lz4)");

    let t = Setup::new("litestream-zstd");
    let mut w = Writer::open(&t.db, seed.wrapping_add(1));
    let d = t.spawn(&["--compression", "zstd"]);
    w.run(20);
    d.stop_ok();
    assert_l0_contiguous(&t.replica);
    // replicad itself restores its zstd replica...
    t.check_restore("replicad restore (zstd)");
    // ...and Litestream refuses it rather than misreading it.
    let out = t.dir.join("litestream.db");
    let o = litestream_restore(&ls, &t.replica, &out);
    assert!(
        !o.status.success(),
        "litestream restored a zstd replica: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!out.exists(), "litestream left {} behind", out.display());
}

/// The codec of the newest level-0 file of a directory replica.
fn newest_l0_codec(replica: &Path) -> &'static str {
    let (min, max) = *l0_ranges(replica)
        .last()
        .expect("the replica holds level-0 files");
    let name = replicad::ltx::format_filename(replicad::ltx::TxId(min), replicad::ltx::TxId(max));
    let f = std::fs::File::open(replica.join("ltx/0").join(name)).unwrap();
    let header = replicad::ltx::decoder::read_header(f).unwrap();
    header.codec().unwrap().name()
}

/// A Litestream user keeps the way back: a replica holding files Litestream can restore
/// (lz4) gets lz4 from a daemon whose codec was not chosen, while an explicit codec
/// Litestream cannot read is honoured with a warning.
#[test]
fn a_replica_litestream_can_restore_stays_lz4_unless_a_codec_is_set() {
    let t = Setup::new("codec-compat");
    let mut w = Writer::open(&t.db, seed("codec-compat"));
    let d = t.spawn(&["--compression", "lz4"]);
    w.run(10);
    d.stop_ok();
    assert_eq!(newest_l0_codec(&t.replica), "lz4");

    // No codec chosen: replicad's default would be zstd, but the replica is Litestream's.
    let d = t.spawn(&[]);
    w.run(10);
    d.stop_ok();
    assert_eq!(newest_l0_codec(&t.replica), "lz4", "{}", t.dir.logs_all());
    assert!(
        t.dir
            .logs_all()
            .contains("writing lz4 so that it still can"),
        "{}",
        t.dir.logs_all()
    );
    assert_l0_contiguous(&t.replica);
    t.check_restore("after the default run");

    // Chosen explicitly: honoured, and said once (at the first upload, which may come only
    // with the final sync: the log is read after the stop).
    let d = t.spawn(&["--compression", "zstd"]);
    w.run(10);
    w.commit_txn();
    let log_path = d.log.clone();
    d.stop_ok();
    let log = std::fs::read_to_string(log_path).unwrap();
    assert_eq!(newest_l0_codec(&t.replica), "zstd", "{log}");
    assert_eq!(
        log.matches("Litestream cannot restore the files written from now on")
            .count(),
        1,
        "{log}"
    );
    t.check_restore("after the zstd run");

    // A replica that holds no Litestream-readable file keeps replicad's default.
    let t = Setup::new("codec-default");
    let mut w = Writer::open(&t.db, seed("codec-default"));
    let d = t.spawn(&[]);
    w.run(10);
    d.stop_ok();
    assert_eq!(newest_l0_codec(&t.replica), "zstd");
}

#[test]
fn usage_errors_exit_2() {
    let t = TestDir::new("usage");
    let db = t.join("x.db");
    let r = t.join("r");
    let bad_yaml = t.join("bad.yml");
    write_file(&bad_yaml, "dbs: [ {path: \n");
    let cases: Vec<Vec<&str>> = vec![
        vec![],
        vec![s(&db), s(&r), "--compression", "brotli"],
        vec![s(&db), s(&r), "--monitor-interval", "soon"],
        vec![s(&db), "ftp://host/path"],
        vec!["--config", s(&bad_yaml)],
    ];
    for args in cases {
        let mut d = spawn_replicate(t.path(), &args);
        let st = wait_timeout(&mut d.child, WAIT);
        let log = d.log_text();
        assert_eq!(
            st.and_then(|s| s.code()),
            Some(2),
            "replicate {args:?}: {st:?}\n{log}"
        );
    }
    assert!(!db.exists() && !r.exists(), "a refused command wrote files");
}

/// The helpers themselves, without the daemon: the writer survives every kind of step and
/// the content hash sees exactly the user's content.
#[test]
fn helpers_self_check() {
    let seed = seed("helpers_self_check");
    let t = TestDir::new("helpers");
    let db = t.join("h.db");
    let opts = WriterOpts {
        schema: 0.15,
        vacuum: 0.03,
        checkpoint: 0.1,
        rollback: 0.1,
    };
    let mut w = Writer::with_opts(&db, seed, opts);
    for _ in 0..200 {
        w.step();
    }
    let h = content_hash(&db);
    assert!(integrity_ok(&db));
    // A copy has the same content; replicad's own tables are left out.
    let copy = t.join("copy.db");
    w.conn
        .execute("VACUUM INTO ?1", [s(&copy)])
        .expect("VACUUM INTO");
    assert_eq!(content_hash(&copy), h);
    w.conn
        .execute_batch("CREATE TABLE _replicad_seq (id INTEGER PRIMARY KEY, seq INTEGER); INSERT INTO _replicad_seq VALUES (1, 1)")
        .unwrap();
    assert_eq!(content_hash(&db), h);
    w.commit_txn();
    assert_ne!(content_hash(&db), h);
    // Reading never wrote: the copy is still byte-identical to a fresh VACUUM INTO of itself.
    let before = std::fs::read(&copy).unwrap();
    content_hash(&copy);
    integrity_ok(&copy);
    assert_eq!(std::fs::read(&copy).unwrap(), before);
    // Ranges of names parse; others do not.
    assert_eq!(
        parse_ltx_name("0000000000000001-00000000000000ff.ltx"),
        Some((1, 255))
    );
    assert_eq!(
        parse_ltx_name("0000000000000001-00000000000000FF.ltx"),
        None
    );
    assert_eq!(
        parse_ltx_name("0000000000000001-0000000000000001.ltx.tmp"),
        None
    );
    println!(
        "{} commits, {} checkpoints ({} busy), tables {}",
        w.commits,
        w.checkpoints,
        w.busy_checkpoints,
        row_counts(&db)
    );
}
