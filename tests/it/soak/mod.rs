//! Randomized soak: concurrent writer processes, `kill -9` of the real daemon, S3 outages,
//! injected storage faults and accelerated compaction, snapshots and retention; after every
//! cycle the latest state and several recorded points in time must restore exactly, from
//! both replicas (a directory and S3).
//!
//! `soak_short` runs 2 cycles in plain `cargo test`. The long run is
//! `tests/soak/run.sh --cycles 200 --seed S` (or, by hand,
//! `SOAK_CYCLES=200 SOAK_SEED=S cargo test --release --test it -- --ignored --exact soak::soak_long --nocapture`).
//! Every run prints its seed and each cycle its own: `SOAK_SEED=S SOAK_FROM=K SOAK_CYCLES=1`
//! replays cycle K alone.
//!
//! A cycle, from its seed: a fresh database and config (random codec, checkpoint thresholds,
//! compaction levels of 1-3 s, snapshots every 2-5 s kept 3 s, level-0 retention 10 min, or
//! 2 s in some cycles), then 3-6 phases. In a phase 1-3 writer processes (this test binary
//! re-executed in writer mode, see [`writer_process`]) write at once: one may change the
//! schema and VACUUM, all insert, update, delete, write big blobs, checkpoint in every mode
//! and set `journal_size_limit`. Meanwhile the daemon is killed with SIGKILL (restarted at
//! once or after the phase), restarted with `REPLICAD_DRILL_FAULTS` (a random failure rate on
//! every replica call), and the S3 server is stopped and restarted on its port. After each
//! phase the writers are quiet: the content hash is recorded with the TXID the daemon reports
//! through its control socket (`replicad sync`) for it. At the end the daemon runs without faults until both replicas hold the last TXID,
//! and is stopped with SIGTERM.
//!
//! Checks: every restore (latest and up to 4 recorded TXIDs, from each replica) equals the
//! recorded content hash and passes `integrity_check` (restore runs it; so does the test);
//! with a codec other than lz4 the restore must report a verified database checksum; a TXID
//! staged for two different contents is a failure; level 0 is one contiguous chain when no
//! level-0 file was due for retention. With the 2 s level-0 retention an old point may have
//! been pruned: its restore must then fail cleanly (exit 1, no output) and is counted as
//! pruned, never as compared.

use crate::common;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::s3::S3Server;
use common::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

mod support;
use support::*;

/// Writer mode: when `SOAK_WRITER_DB` is set (by the soak, which re-executes this binary),
/// run one writer process's steps; otherwise a no-op.
#[test]
fn writer_process() {
    let Ok(db) = std::env::var("SOAK_WRITER_DB") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset"));
    let seed: u64 = var("SOAK_WRITER_SEED").parse().unwrap();
    let steps: usize = var("SOAK_WRITER_STEPS").parse().unwrap();
    let schema = var("SOAK_WRITER_ROLE") == "schema";
    let opts = if schema {
        WriterOpts {
            schema: 0.12,
            vacuum: 0.03,
            checkpoint: 0.08,
            rollback: 0.05,
        }
    } else {
        // Only one process changes the schema: Writer names new objects from what exists,
        // so two schema writers would race for the same names.
        WriterOpts {
            schema: 0.0,
            vacuum: 0.0,
            checkpoint: 0.1,
            rollback: 0.05,
        }
    };
    let mut w = Writer::with_opts(Path::new(&db), seed, opts);
    let limit: i64 = [-1, 0, 4096, 65536, 1 << 20][w.rng.random_range(0..5)];
    w.conn
        .execute_batch(&format!("PRAGMA journal_size_limit={limit}"))
        .unwrap();
    w.run(steps);
    println!(
        "writer done: {} commits, {} checkpoints ({} busy), journal_size_limit {limit}",
        w.commits, w.checkpoints, w.busy_checkpoints
    );
}

#[test]
fn soak_short() {
    let seed = soak_seed("soak_short");
    run_soak(seed, 0, 2);
}

/// The long run; see the module doc.
#[test]
#[ignore]
fn soak_long() {
    let seed = soak_seed("soak_long");
    let from = env_u64("SOAK_FROM").unwrap_or(0);
    let cycles = env_u64("SOAK_CYCLES").unwrap_or(200);
    run_soak(seed, from, cycles);
}

fn env_u64(k: &str) -> Option<u64> {
    let v = std::env::var(k).ok()?;
    let v = v.trim();
    Some(
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16),
            None => v.parse(),
        }
        .unwrap_or_else(|e| panic!("{k}={v:?}: {e}")),
    )
}

fn soak_seed(test: &str) -> u64 {
    match env_u64("SOAK_SEED") {
        Some(s) => {
            println!("{test}: SOAK_SEED={s}");
            s
        }
        None => seed(test),
    }
}

/// The seed of cycle `n` of a run (SplitMix64 of the pair).
fn cycle_seed(seed: u64, n: u64) -> u64 {
    let mut z = seed.wrapping_add(n.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn run_soak(seed: u64, from: u64, cycles: u64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut server = rt.block_on(S3Server::start());
    if server.is_external() {
        eprintln!(
            "SKIPPED: the soak stops and restarts the S3 server, which needs the in-process one"
        );
        return;
    }
    let started = Instant::now();
    let mut total = Stats::default();
    for n in from..from + cycles {
        let cs = cycle_seed(seed, n);
        let t = Instant::now();
        let st = cycle(&rt, &mut server, seed, n, cs);
        total += st;
        println!(
            "soak cycle {n} ({}/{cycles}) seed {cs:#x} ok in {:.1}s: {st}",
            n - from + 1,
            t.elapsed().as_secs_f64()
        );
    }
    println!(
        "soak: SOAK_SEED={seed} cycles {from}..{} all ok in {:.0}s: {total}",
        from + cycles,
        started.elapsed().as_secs_f64()
    );
}

/// One cycle's fixed parts.
struct Cycle {
    dir: TestDir,
    db: PathBuf,
    staging: PathBuf,
    config: PathBuf,
    socket: PathBuf,
    file_replica: PathBuf,
    /// A directory replica added half-way through some cycles (seeded when it starts).
    file2_replica: PathBuf,
    s3_url: String,
    s3_dir: PathBuf,
    access_key: String,
    secret_key: String,
}

impl Cycle {
    fn spawn(&self, faults: Option<&str>) -> Daemon {
        let logs = self.dir.join("logs");
        fs::create_dir_all(&logs).unwrap();
        let n = fs::read_dir(&logs).unwrap().count();
        let log = logs.join(format!("replicad-{n:02}.log"));
        let out = File::create(&log).unwrap();
        let mut cmd = Command::new(bin());
        cmd.args(["replicate", "--config", s(&self.config)])
            .env("NO_COLOR", "1")
            .env("AWS_ACCESS_KEY_ID", &self.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &self.secret_key)
            .env_remove(replicad::cli::drill::ENV)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        if let Some(f) = faults {
            cmd.env(replicad::cli::drill::ENV, f);
        }
        Daemon {
            child: cmd.spawn().expect("spawn replicad replicate"),
            log,
        }
    }

    fn context(&self) -> String {
        format!(
            "{}\n{}\n{}\n{}",
            listing(&self.staging),
            listing(&self.file_replica),
            listing(&self.s3_dir),
            self.dir.logs()
        )
    }

    fn restore(&self, replica: &str, out: &Path, txid: Option<u64>) -> Output {
        let txid = txid.map(|t| format!("{t:016x}"));
        let mut cmd = Command::new(bin());
        cmd.args(["restore", "--to", s(out)]);
        if let Some(t) = &txid {
            cmd.args(["--txid", t]);
        }
        cmd.arg(replica)
            .env("AWS_ACCESS_KEY_ID", &self.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &self.secret_key)
            .output()
            .expect("run replicad restore")
    }
}

impl Cycle {
    /// The TXID the daemon holds for the quiet database once a sync that started after this
    /// call has completed: `replicad sync --wait` through the control socket (retried while
    /// the daemon starts). Its wait also covers the replicas, which may lag behind injected
    /// faults or an outage; after `timeout` seconds the answer is a 504 carrying the
    /// database's TXID at that moment, which is final only if no segment was still being
    /// written (a full segment of a large database can take longer than the timeout in a
    /// debug build on a busy machine). So a 504 is accepted only when no segment is in
    /// progress in staging, staging ends at that TXID, and a second answer agrees.
    fn sync_txid(&self, timeout: u64) -> u64 {
        let mut last_504 = None;
        loop {
            let (txid, complete) = self.sync_once(timeout);
            if complete {
                return txid;
            }
            let settled =
                !has_tmp(&self.staging.join("ltx/0")) && max_txid_under(&self.staging) == txid;
            if settled && last_504 == Some(txid) {
                return txid;
            }
            last_504 = settled.then_some(txid);
        }
    }

    /// One `replicad sync --wait`: (TXID, whether it completed rather than timed out).
    fn sync_once(&self, timeout: u64) -> (u64, bool) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let o = Command::new(bin())
                .args(["sync", "--socket", s(&self.socket), "--wait", "--timeout"])
                .arg(timeout.to_string())
                .arg(&self.db)
                .output()
                .expect("run replicad sync");
            let (out, err) = (
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr),
            );
            let json = if o.status.success() {
                Some((out.to_string(), true))
            } else if err.contains("timed out after") {
                err.find('{').map(|i| (err[i..].trim().to_string(), false))
            } else {
                None
            };
            if let Some((json, complete)) = json {
                let v: serde_json::Value = serde_json::from_str(&json)
                    .unwrap_or_else(|e| panic!("replicad sync answered no JSON ({e}): {out}{err}"));
                return (
                    v["txid"].as_u64().expect("txid in the sync answer"),
                    complete,
                );
            }
            assert!(
                Instant::now() < deadline,
                "replicad sync kept failing: {out}{err}\n{}",
                self.context()
            );
            sleep(Duration::from_millis(100));
        }
    }
}

fn spawn_writer(c: &Cycle, seed: u64, steps: usize, schema: bool, tag: &str) -> Child {
    let log = File::create(c.dir.join(&format!("logs/writer-{tag}.log"))).unwrap();
    Command::new(std::env::current_exe().unwrap())
        .args([
            // The test's full name in this crate (a writer that matches no test writes
            // nothing, which the check below catches).
            "soak::writer_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SOAK_WRITER_DB", &c.db)
        .env("SOAK_WRITER_SEED", seed.to_string())
        .env("SOAK_WRITER_STEPS", steps.to_string())
        .env("SOAK_WRITER_ROLE", if schema { "schema" } else { "data" })
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawn writer process")
}

fn cycle(rt: &tokio::runtime::Runtime, server: &mut S3Server, seed: u64, n: u64, cs: u64) -> Stats {
    let mut rng = StdRng::seed_from_u64(cs);
    let mut st = Stats::default();
    let dir = TestDir::new(&format!("soak-c{n}"));
    fs::create_dir_all(dir.join("db")).unwrap();
    fs::create_dir_all(dir.join("logs")).unwrap();
    let codec = ["lz4", "zstd", "gzip", "none", "zstd:1"][rng.random_range(0..5)];
    let short_l0 = rng.random_bool(0.25);
    let prefix = format!("soak-{seed:x}/c{n}");
    let c = Cycle {
        db: dir.join("db/app.db"),
        staging: dir.join("meta"),
        config: dir.join("replicad.yml"),
        socket: dir.join("ctl.sock"),
        file_replica: dir.join("replica"),
        file2_replica: dir.join("replica2"),
        s3_url: server.url(&prefix),
        s3_dir: server.object_path(&prefix),
        access_key: server.access_key.clone(),
        secret_key: server.secret_key.clone(),
        dir,
    };
    let levels: Vec<String> = (0..rng.random_range(1..=3))
        .map(|i| {
            format!(
                "  - interval: {}ms\n",
                1000 * (i + 1) + rng.random_range(0..500)
            )
        })
        .collect();
    let (monitor_ms, checkpoint_ms, min_pages) = (
        rng.random_range(20..120),
        rng.random_range(300..3000),
        [16, 64, 256, 1000][rng.random_range(0..4)],
    );
    let verify = if rng.random_bool(0.3) { "2s" } else { "0s" };
    let snapshot_ms = rng.random_range(2000..5000);
    let config_text = |with_file2: bool| {
        let file2 = if with_file2 {
            format!(
                "\x20     - name: file2\n\x20       url: file://{}\n",
                c.file2_replica.display()
            )
        } else {
            String::new()
        };
        format!(
            "monitor-interval: {monitor_ms}ms\n\
             checkpoint-interval: {checkpoint_ms}ms\n\
             min-checkpoint-page-count: {min_pages}\n\
             compression: {codec}\n\
             verify-interval: {verify}\n\
             shutdown-sync-timeout: 60s\n\
             levels:\n{}\
             snapshot:\n  interval: {snapshot_ms}ms\n  retention: 3s\n\
             l0-retention: {}\n\
             l0-retention-check-interval: 1s\n\
             socket:\n  enabled: true\n  path: {}\n\
             dbs:\n\
             \x20 - path: {}\n\
             \x20   meta-path: {}\n\
             \x20   replicas:\n\
             \x20     - name: file\n\
             \x20       url: file://{}\n\
             \x20     - name: s3\n\
             \x20       url: \"{}\"\n{file2}",
            levels.concat(),
            if short_l0 { "2s" } else { "10m" },
            c.socket.display(),
            c.db.display(),
            c.staging.display(),
            c.file_replica.display(),
            c.s3_url,
        )
    };
    let config = config_text(false);
    write_file(&c.config, &config);
    println!("cycle {n}: codec {codec} short-l0-retention {short_l0}");

    // The database exists before the daemon starts, in WAL mode, with t0.
    drop(Writer::open(&c.db, rng.random()));
    let mut daemon = Some(c.spawn(None));
    // Whether `daemon` runs a failure drill.
    let mut drilled = false;
    let mut prev = c.sync_txid(5);
    let mut recorded: Vec<(u64, String)> = vec![(prev, content_hash(&c.db))];

    // From which recorded point on each replica (file, s3, file2) holds the history: a wipe
    // starts a replica anew, and a replica added half-way has nothing from before.
    let mut valid_from = [0usize; 3];
    let mut file2_on = false;
    let mut file_wiped = false;
    // A directory where the next staged segment goes: its publish fails until it is removed.
    let mut obstacle: Option<PathBuf> = None;

    let phases = rng.random_range(3..=6);
    for phase in 0..phases {
        st.phases += 1;
        if phase > 0 && rng.random_bool(0.1) {
            // Local state lost while the S3 server is down: the daemon restarts without its
            // staging, S3 is unreachable at its start, and once back it continues (re-seeded
            // where staging no longer holds what it needs).
            c.sync_txid(5);
            if let Some(d) = daemon.take() {
                d.kill9();
                st.kills += 1;
            }
            if server.is_serving() {
                rt.block_on(server.stop());
                st.s3_outages += 1;
            }
            fs::remove_dir_all(&c.staging).unwrap();
            st.staging_lost += 1;
            drilled = false;
            daemon = Some(c.spawn(None));
        }
        let k = rng.random_range(1..=3);
        let mut writers: Vec<Child> = (0..k)
            .map(|i| {
                st.writer_procs += 1;
                let steps = rng.random_range(15..=60);
                spawn_writer(&c, rng.random(), steps, i == 0, &format!("{phase}-{i}"))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(120);
        while writers.iter_mut().any(|w| w.try_wait().unwrap().is_none()) {
            assert!(
                Instant::now() < deadline,
                "cycle {n}: writers hung; {}",
                c.context()
            );
            sleep(Duration::from_millis(rng.random_range(50..400)));
            if obstacle.is_some() && rng.random_bool(0.5) {
                let _ = fs::remove_dir_all(obstacle.take().unwrap());
            }
            let x: f64 = rng.random();
            if (0.32..0.36).contains(&x) && daemon.is_some() {
                // A replica's files deleted behind the running daemon.
                let which = rng.random_range(0..2);
                let _ = fs::remove_dir_all(if which == 0 {
                    &c.file_replica
                } else {
                    &c.s3_dir
                });
                file_wiped |= which == 0;
                valid_from[which] = recorded.len();
                st.wipes += 1;
                continue;
            }
            if (0.36..0.40).contains(&x) && obstacle.is_none() {
                let next = max_txid_under(&c.staging.join("ltx/0")) + 1;
                let at = c
                    .staging
                    .join("ltx/0")
                    .join(format!("{next:016x}-{next:016x}.ltx"));
                if fs::create_dir(&at).is_ok() {
                    obstacle = Some(at);
                    st.publish_failures += 1;
                }
                continue;
            }
            if x < 0.2 {
                if let Some(d) = daemon.take() {
                    d.kill9();
                    st.kills += 1;
                }
                if rng.random_bool(0.6) {
                    let faults = rng
                        .random_bool(0.4)
                        .then(|| format!("fail-rate={:.2}", rng.random_range(0.05..0.4)));
                    st.fault_runs += faults.is_some() as u64;
                    drilled = faults.is_some();
                    daemon = Some(c.spawn(faults.as_deref()));
                }
                // Otherwise it stays down until a later kill respawns one or the phase ends.
            } else if x < 0.32 {
                if server.is_serving() {
                    rt.block_on(server.stop());
                    st.s3_outages += 1;
                } else {
                    rt.block_on(server.restart());
                }
            }
        }
        for (i, w) in writers.iter_mut().enumerate() {
            let status = w.wait().unwrap();
            assert!(
                status.success(),
                "cycle {n}: writer {phase}-{i} failed ({status}); {}",
                c.context()
            );
            let log = fs::read_to_string(c.dir.join(&format!("logs/writer-{phase}-{i}.log")))
                .unwrap_or_default();
            assert!(
                log.contains("1 passed"),
                "cycle {n}: writer {phase}-{i} ran no writer test:\n{log}"
            );
        }
        // Outages and obstacles end with the phase: the recorded point needs a daemon that
        // has synced.
        if let Some(at) = obstacle.take() {
            let _ = fs::remove_dir_all(at);
        }
        if !server.is_serving() {
            rt.block_on(server.restart());
        }
        let exited = daemon.as_mut().is_some_and(|d| !d.running());
        if let Some(d) = daemon.as_ref().filter(|_| exited) {
            // Known behaviour: a daemon started while a replica
            // cannot be reached (an outage, or a drill failing most calls) gives up after its
            // startup retries (about 20 s) and exits 1, in taking the lease or in listing.
            // A lease held by another instance ("is in use by") or lost is not that.
            let log = d.log_text();
            assert!(
                log.contains("list replica") || log.contains(": lease of replica "),
                "cycle {n}: the daemon exited; {}",
                c.context()
            );
            st.startup_refusals += 1;
            daemon = None;
        }
        // A drill ends with the phase too: a drilled daemon still in its startup retries
        // could exit while the point is being recorded, leaving no one to answer.
        if drilled {
            if let Some(d) = daemon.take() {
                d.kill9();
                st.kills += 1;
            }
            drilled = false;
        }
        if !file2_on && rng.random_bool(0.15) {
            // A replica added to the config: the restarted daemon seeds it.
            if let Some(d) = daemon.take() {
                d.kill9();
                st.kills += 1;
            }
            write_file(&c.config, &config_text(true));
            file2_on = true;
            valid_from[2] = recorded.len();
            st.added_replicas += 1;
        }
        if rng.random_bool(0.1) {
            // The database file replaced under the daemon (the writers are done): a copy with
            // a few rows fewer renamed over it, its old WAL gone.
            let new = c.dir.join("db/replacement.db");
            let _ = fs::remove_file(&new);
            rusqlite::Connection::open(&c.db)
                .unwrap()
                .execute("VACUUM INTO ?1", [s(&new)])
                .unwrap();
            {
                let n = rusqlite::Connection::open(&new).unwrap();
                n.execute_batch(
                    "PRAGMA journal_mode=WAL; \
                     DELETE FROM t0 WHERE rowid IN (SELECT rowid FROM t0 ORDER BY rowid LIMIT 3);",
                )
                .unwrap();
            }
            for side in ["-wal", "-shm"] {
                let _ = fs::remove_file(format!("{}{side}", c.db.display()));
            }
            fs::rename(&new, &c.db).unwrap();
            st.replaced += 1;
        }
        // Only when none runs: a second daemon beside a live one is refused (one per
        // database), and replacing the live one would kill it after the refusal.
        if daemon.is_none() {
            daemon = Some(c.spawn(None));
        }
        let hash = content_hash(&c.db);
        let txid = c.sync_txid(5);
        let (last_txid, last_hash) = recorded.last().unwrap();
        assert!(
            txid != *last_txid || hash == *last_hash,
            "cycle {n} phase {phase}: the content changed but the staged TXID stayed {txid:#x}; {}",
            c.context()
        );
        recorded.push((txid, hash));
        prev = txid;
    }

    // Settle: S3 back, a daemon without faults, both replicas at the last TXID, SIGTERM.
    if !server.is_serving() {
        rt.block_on(server.restart());
    }
    if let Some(d) = daemon.take() {
        if rng.random_bool(0.5) {
            d.kill9();
            st.kills += 1;
        } else {
            d.stop_ok();
        }
    }
    let d = c.spawn(None);
    let final_hash = content_hash(&c.db);
    let final_txid = c.sync_txid(60);
    assert!(
        final_txid != prev || final_hash == recorded.last().unwrap().1,
        "cycle {n}: content changed without a new TXID; {}",
        c.context()
    );
    recorded.push((final_txid, final_hash.clone()));
    let deadline = Instant::now() + Duration::from_secs(90);
    while max_txid_under(&c.file_replica) < final_txid
        || max_txid_under(&c.s3_dir) < final_txid
        || (file2_on && max_txid_under(&c.file2_replica) < final_txid)
    {
        assert!(
            Instant::now() < deadline,
            "cycle {n}: replicas did not reach {final_txid:#x}; {}",
            c.context()
        );
        sleep(Duration::from_millis(50));
    }
    d.stop_ok();
    st.injected = count_injected(c.dir.path());

    if !short_l0 && !file_wiped {
        assert_l0_contiguous(&c.file_replica);
    }

    // Restores: latest, and up to 4 recorded points (the first always), from each replica.
    let mut points: Vec<(u64, String)> = vec![recorded[0].clone()];
    for _ in 0..3 {
        points.push(recorded[rng.random_range(0..recorded.len())].clone());
    }
    points.sort();
    points.dedup();
    let mut replicas = vec![
        (
            "file",
            s(&c.file_replica).to_string(),
            c.file_replica.clone(),
            valid_from[0],
        ),
        ("s3", c.s3_url.clone(), c.s3_dir.clone(), valid_from[1]),
    ];
    if file2_on {
        replicas.push((
            "file2",
            s(&c.file2_replica).to_string(),
            c.file2_replica.clone(),
            valid_from[2],
        ));
    }
    for (name, replica, files, from) in replicas {
        // A re-seeded replica's chain starts at its seed, a level-9 snapshot: a point before
        // it is not on the replica, and once the 3 s snapshot retention removed the seed, nor
        // is a point before the oldest snapshot left.
        let seeded = seeded_up_to(&c.dir.logs_all(), name);
        let oldest_base = oldest_snapshot(&files.join("ltx").join("9"));
        // Points from before a wipe (or before the replica was added) are not on it.
        let valid: Vec<u64> = recorded[from..].iter().map(|(t, _)| *t).collect();
        let targets = std::iter::once((None, final_hash.clone())).chain(
            points
                .iter()
                .filter(|(t, _)| valid.contains(t))
                .map(|(t, h)| (Some(*t), h.clone())),
        );
        for (txid, hash) in targets {
            let out = c.dir.join(&format!(
                "restored-{name}-{}.db",
                txid.map_or("latest".into(), |t| format!("{t:016x}"))
            ));
            let o = c.restore(&replica, &out, txid);
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            let before_seed = txid.is_some_and(|t| seeded > 0 && (t <= seeded || t < oldest_base));
            if !o.status.success()
                && (short_l0 || before_seed)
                && txid.is_some_and(|t| t < final_txid)
            {
                // Pruned by retention: a clean refusal, nothing written.
                assert_eq!(o.status.code(), Some(1), "cycle {n}: {text}");
                assert!(
                    !out.exists(),
                    "cycle {n}: failed restore left {}",
                    out.display()
                );
                st.pruned += 1;
                continue;
            }
            assert!(
                o.status.success(),
                "cycle {n}: restore {name} txid {txid:x?} failed: {text}\nrecorded {recorded:x?}\n{}",
                c.context()
            );
            assert_eq!(
                content_hash(&out),
                hash,
                "cycle {n}: restore {name} txid {txid:x?} differs from the recorded state; \
                 recorded {recorded:x?}\n{text}\n{}",
                c.context()
            );
            assert!(
                integrity_ok(&out),
                "cycle {n}: integrity_check of {}",
                out.display()
            );
            if codec != "lz4" {
                assert!(
                    text.contains("verified"),
                    "cycle {n}: restore {name} txid {txid:x?} did not verify a checksum with {codec}: {text}"
                );
            }
            st.compared += 1;
        }
    }
    st
}
