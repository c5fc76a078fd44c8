//! One soak cycle: its random choices ([`Params`]), its fixed paths ([`Cycle`]), and what it
//! runs and records ([`Run`]): phases of writers with the daemon disturbed, a settled end, and
//! the restores checked against what was recorded. The random draws happen in one fixed order,
//! so a cycle's seed replays it.

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

use super::support::*;

/// Runs cycle `n` of the run with `seed`, from its own seed `cs`.
pub(super) fn cycle(
    rt: &tokio::runtime::Runtime,
    server: &mut S3Server,
    seed: u64,
    n: u64,
    cs: u64,
) -> Stats {
    let mut rng = StdRng::seed_from_u64(cs);
    let p = Params::draw(&mut rng);
    let c = Cycle::new(server, seed, n);
    write_file(&c.config, &p.config(&c, false));
    println!(
        "cycle {n}: codec {} short-l0-retention {}",
        p.codec, p.short_l0
    );
    // The database exists before the daemon starts, in WAL mode, with t0.
    drop(Writer::open(&c.db, rng.random()));
    let mut run = Run::start(&c, &p, rt, server, rng, n);
    let phases = run.rng.random_range(3..=6);
    for phase in 0..phases {
        run.phase(phase);
    }
    let last = run.settle();
    run.check_restores(&last);
    run.st
}

/// A cycle's random choices of configuration (the integer types are those the draws have
/// always had: another type draws other numbers from the same seed).
struct Params {
    codec: &'static str,
    /// Level-0 files kept 2 s instead of 10 min: old points may be pruned.
    short_l0: bool,
    /// The compaction levels, as config lines.
    levels: Vec<String>,
    monitor_ms: i32,
    checkpoint_ms: i32,
    min_pages: i32,
    verify: &'static str,
    snapshot_ms: i32,
}

impl Params {
    fn draw(rng: &mut StdRng) -> Params {
        let codec = ["lz4", "zstd", "gzip", "none", "zstd:1"][rng.random_range(0..5)];
        let short_l0 = rng.random_bool(0.25);
        let levels = (0..rng.random_range(1..=3))
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
        Params {
            codec,
            short_l0,
            levels,
            monitor_ms,
            checkpoint_ms,
            min_pages,
            verify,
            snapshot_ms,
        }
    }

    /// The daemon's config for `c`, with the second directory replica or not.
    fn config(&self, c: &Cycle, with_file2: bool) -> String {
        let file2 = if with_file2 {
            format!(
                "\x20     - name: file2\n\x20       url: file://{}\n",
                c.file2_replica.display()
            )
        } else {
            String::new()
        };
        format!(
            "monitor-interval: {}ms\n\
             checkpoint-interval: {}ms\n\
             min-checkpoint-page-count: {}\n\
             compression: {}\n\
             verify-interval: {}\n\
             shutdown-sync-timeout: 60s\n\
             levels:\n{}\
             snapshot:\n  interval: {}ms\n  retention: 3s\n\
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
            self.monitor_ms,
            self.checkpoint_ms,
            self.min_pages,
            self.codec,
            self.verify,
            self.levels.concat(),
            self.snapshot_ms,
            if self.short_l0 { "2s" } else { "10m" },
            c.socket.display(),
            c.db.display(),
            c.staging.display(),
            c.file_replica.display(),
            c.s3_url,
        )
    }
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
    fn new(server: &S3Server, seed: u64, n: u64) -> Cycle {
        let dir = TestDir::new(&format!("soak-c{n}"));
        fs::create_dir_all(dir.join("db")).unwrap();
        fs::create_dir_all(dir.join("logs")).unwrap();
        let prefix = format!("soak-{seed:x}/c{n}");
        Cycle {
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
        }
    }

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

    fn spawn_writer(&self, seed: u64, steps: usize, schema: bool, tag: &str) -> Child {
        let log = File::create(self.dir.join(&format!("logs/writer-{tag}.log"))).unwrap();
        Command::new(std::env::current_exe().unwrap())
            .args([
                // The test's full name in this crate (a writer that matches no test writes
                // nothing, which the check after the phase catches).
                "soak::writer_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SOAK_WRITER_DB", &self.db)
            .env("SOAK_WRITER_SEED", seed.to_string())
            .env("SOAK_WRITER_STEPS", steps.to_string())
            .env("SOAK_WRITER_ROLE", if schema { "schema" } else { "data" })
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn writer process")
    }
}

/// A cycle under way: the daemon it runs, the points it recorded, what it disturbed.
struct Run<'a> {
    c: &'a Cycle,
    p: &'a Params,
    rt: &'a tokio::runtime::Runtime,
    server: &'a mut S3Server,
    rng: StdRng,
    n: u64,
    st: Stats,
    daemon: Option<Daemon>,
    /// Whether `daemon` runs a failure drill.
    drilled: bool,
    /// (TXID, content hash) of each quiet point.
    recorded: Vec<(u64, String)>,
    /// From which recorded point on each replica (file, s3, file2) holds the history: a wipe
    /// starts a replica anew, and a replica added half-way has nothing from before.
    valid_from: [usize; 3],
    file2_on: bool,
    file_wiped: bool,
    /// A directory where the next staged segment goes: its publish fails until it is removed.
    obstacle: Option<PathBuf>,
}

impl<'a> Run<'a> {
    /// Starts the daemon and records the first point.
    fn start(
        c: &'a Cycle,
        p: &'a Params,
        rt: &'a tokio::runtime::Runtime,
        server: &'a mut S3Server,
        rng: StdRng,
        n: u64,
    ) -> Run<'a> {
        let daemon = Some(c.spawn(None));
        let first = (c.sync_txid(5), content_hash(&c.db));
        Run {
            c,
            p,
            rt,
            server,
            rng,
            n,
            st: Stats::default(),
            daemon,
            drilled: false,
            recorded: vec![first],
            valid_from: [0; 3],
            file2_on: false,
            file_wiped: false,
            obstacle: None,
        }
    }

    /// SIGKILL to the daemon, if one runs.
    fn kill(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.kill9();
            self.st.kills += 1;
        }
    }

    fn stop_s3(&mut self) {
        self.rt.block_on(self.server.stop());
        self.st.s3_outages += 1;
    }

    /// One phase: writers with the daemon disturbed meanwhile, then a recorded quiet point.
    fn phase(&mut self, phase: i32) {
        self.st.phases += 1;
        if phase > 0 && self.rng.random_bool(0.1) {
            self.lose_local_state();
        }
        let k = self.rng.random_range(1..=3);
        let mut writers: Vec<Child> = (0..k)
            .map(|i| {
                self.st.writer_procs += 1;
                let steps = self.rng.random_range(15..=60);
                let seed = self.rng.random();
                self.c
                    .spawn_writer(seed, steps, i == 0, &format!("{phase}-{i}"))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(120);
        while writers.iter_mut().any(|w| w.try_wait().unwrap().is_none()) {
            assert!(
                Instant::now() < deadline,
                "cycle {}: writers hung; {}",
                self.n,
                self.c.context()
            );
            sleep(Duration::from_millis(self.rng.random_range(50..400)));
            self.disturb();
        }
        for (i, w) in writers.iter_mut().enumerate() {
            let status = w.wait().unwrap();
            let n = self.n;
            assert!(
                status.success(),
                "cycle {n}: writer {phase}-{i} failed ({status}); {}",
                self.c.context()
            );
            let log = fs::read_to_string(self.c.dir.join(&format!("logs/writer-{phase}-{i}.log")))
                .unwrap_or_default();
            assert!(
                log.contains("1 passed"),
                "cycle {n}: writer {phase}-{i} ran no writer test:\n{log}"
            );
        }
        self.end_phase(phase);
    }

    /// Local state lost while the S3 server is down: the daemon restarts without its
    /// staging, S3 is unreachable at its start, and once back it continues (re-seeded where
    /// staging no longer holds what it needs).
    fn lose_local_state(&mut self) {
        self.c.sync_txid(5);
        self.kill();
        if self.server.is_serving() {
            self.stop_s3();
        }
        fs::remove_dir_all(&self.c.staging).unwrap();
        self.st.staging_lost += 1;
        self.drilled = false;
        self.daemon = Some(self.c.spawn(None));
    }

    /// One random disturbance while the writers write, or none.
    fn disturb(&mut self) {
        if self.obstacle.is_some() && self.rng.random_bool(0.5) {
            let _ = fs::remove_dir_all(self.obstacle.take().unwrap());
        }
        let x: f64 = self.rng.random();
        if (0.32..0.36).contains(&x) && self.daemon.is_some() {
            // A replica's files deleted behind the running daemon.
            let which = self.rng.random_range(0..2);
            let _ = fs::remove_dir_all(if which == 0 {
                &self.c.file_replica
            } else {
                &self.c.s3_dir
            });
            self.file_wiped |= which == 0;
            self.valid_from[which] = self.recorded.len();
            self.st.wipes += 1;
        } else if (0.36..0.40).contains(&x) && self.obstacle.is_none() {
            let level0 = self.c.staging.join("ltx/0");
            let next = max_txid_under(&level0) + 1;
            let at = level0.join(format!("{next:016x}-{next:016x}.ltx"));
            if fs::create_dir(&at).is_ok() {
                self.obstacle = Some(at);
                self.st.publish_failures += 1;
            }
        } else if x < 0.2 {
            self.kill();
            if self.rng.random_bool(0.6) {
                let faults = self
                    .rng
                    .random_bool(0.4)
                    .then(|| format!("fail-rate={:.2}", self.rng.random_range(0.05..0.4)));
                self.st.fault_runs += faults.is_some() as u64;
                self.drilled = faults.is_some();
                self.daemon = Some(self.c.spawn(faults.as_deref()));
            }
            // Otherwise it stays down until a later kill respawns one or the phase ends.
        } else if (0.2..0.32).contains(&x) {
            if self.server.is_serving() {
                self.stop_s3();
            } else {
                self.rt.block_on(self.server.restart());
            }
        }
    }

    /// The writers done: disturbances end, the config or the file may change, and a daemon
    /// that has synced gives the point recorded.
    fn end_phase(&mut self, phase: i32) {
        let (c, n) = (self.c, self.n);
        if let Some(at) = self.obstacle.take() {
            let _ = fs::remove_dir_all(at);
        }
        if !self.server.is_serving() {
            self.rt.block_on(self.server.restart());
        }
        let exited = self.daemon.as_mut().is_some_and(|d| !d.running());
        if let Some(d) = self.daemon.as_ref().filter(|_| exited) {
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
            self.st.startup_refusals += 1;
            self.daemon = None;
        }
        // A drill ends with the phase too: a drilled daemon still in its startup retries
        // could exit while the point is being recorded, leaving no one to answer.
        if self.drilled {
            self.kill();
            self.drilled = false;
        }
        if !self.file2_on && self.rng.random_bool(0.15) {
            // A replica added to the config: the restarted daemon seeds it.
            self.kill();
            write_file(&c.config, &self.p.config(c, true));
            self.file2_on = true;
            self.valid_from[2] = self.recorded.len();
            self.st.added_replicas += 1;
        }
        if self.rng.random_bool(0.1) {
            replace_database(c);
            self.st.replaced += 1;
        }
        // Only when none runs: a second daemon beside a live one is refused (one per
        // database), and replacing the live one would kill it after the refusal.
        if self.daemon.is_none() {
            self.daemon = Some(c.spawn(None));
        }
        self.record(5, &format!("phase {phase}"));
    }

    /// Records the quiet database's content hash with the TXID the daemon gives for it
    /// (waiting up to `timeout` s, see [`Cycle::sync_txid`]); `at`: the moment, for a failure.
    fn record(&mut self, timeout: u64, at: &str) -> (u64, String) {
        let (c, n) = (self.c, self.n);
        let hash = content_hash(&c.db);
        let txid = c.sync_txid(timeout);
        let (last_txid, last_hash) = self.recorded.last().unwrap();
        assert!(
            txid != *last_txid || hash == *last_hash,
            "cycle {n} {at}: the content changed but the staged TXID stayed {txid:#x}; {}",
            c.context()
        );
        self.recorded.push((txid, hash.clone()));
        (txid, hash)
    }

    /// S3 back, a daemon without faults, every replica at the last TXID, SIGTERM: the last
    /// point recorded.
    fn settle(&mut self) -> (u64, String) {
        let (c, n) = (self.c, self.n);
        if !self.server.is_serving() {
            self.rt.block_on(self.server.restart());
        }
        if let Some(d) = self.daemon.take() {
            if self.rng.random_bool(0.5) {
                d.kill9();
                self.st.kills += 1;
            } else {
                let log = d.log.clone();
                let status = d.stop();
                if status.code() != Some(0) {
                    // Known behaviour: a replica wiped by the last phase and first noticed in
                    // the final round cannot be seeded once the monitor has stopped; the stop
                    // names it and exits 1, and the next start seeds it.
                    let text = fs::read_to_string(&log).unwrap_or_default();
                    assert!(
                        status.code() == Some(1)
                            && text.contains("re-seeding")
                            && text.contains("the database's monitor has stopped")
                            && text.contains("shutdown left"),
                        "cycle {n}: the daemon exited with {status} after SIGTERM; {}\n{text}",
                        c.context()
                    );
                }
            }
        }
        let d = c.spawn(None);
        let (final_txid, final_hash) = self.record(60, "at the end");
        let deadline = Instant::now() + Duration::from_secs(90);
        while max_txid_under(&c.file_replica) < final_txid
            || max_txid_under(&c.s3_dir) < final_txid
            || (self.file2_on && max_txid_under(&c.file2_replica) < final_txid)
        {
            assert!(
                Instant::now() < deadline,
                "cycle {n}: replicas did not reach {final_txid:#x}; {}",
                c.context()
            );
            sleep(Duration::from_millis(50));
        }
        d.stop_ok();
        self.st.injected = count_injected(c.dir.path());
        if !self.p.short_l0 && !self.file_wiped {
            assert_l0_contiguous(&c.file_replica);
        }
        (final_txid, final_hash)
    }

    /// Restores of the latest state (`last`) and of up to 4 recorded points (the first
    /// always), from each replica, each equal to what was recorded and intact.
    fn check_restores(&mut self, last: &(u64, String)) {
        let c = self.c;
        let mut points: Vec<(u64, String)> = vec![self.recorded[0].clone()];
        for _ in 0..3 {
            points.push(self.recorded[self.rng.random_range(0..self.recorded.len())].clone());
        }
        points.sort();
        points.dedup();
        let mut replicas = vec![
            (
                "file",
                s(&c.file_replica).to_string(),
                c.file_replica.clone(),
                self.valid_from[0],
            ),
            ("s3", c.s3_url.clone(), c.s3_dir.clone(), self.valid_from[1]),
        ];
        if self.file2_on {
            replicas.push((
                "file2",
                s(&c.file2_replica).to_string(),
                c.file2_replica.clone(),
                self.valid_from[2],
            ));
        }
        for (name, replica, files, from) in replicas {
            // A re-seeded replica's chain starts at its seed, a level-9 snapshot: a point
            // before it is not on the replica, and once the 3 s snapshot retention removed
            // the seed, nor is a point before the oldest snapshot left.
            let seeded = seeded_up_to(&c.dir.logs_all(), name);
            let oldest_base = oldest_snapshot(&files.join("ltx").join("9"));
            // Points from before a wipe (or before the replica was added) are not on it.
            let valid: Vec<u64> = self.recorded[from..].iter().map(|(t, _)| *t).collect();
            let targets = std::iter::once((None, last.1.clone())).chain(
                points
                    .iter()
                    .filter(|(t, _)| valid.contains(t))
                    .map(|(t, h)| (Some(*t), h.clone())),
            );
            for (txid, hash) in targets {
                let before_seed =
                    txid.is_some_and(|t| seeded > 0 && (t <= seeded || t < oldest_base));
                let may_be_pruned =
                    (self.p.short_l0 || before_seed) && txid.is_some_and(|t| t < last.0);
                self.check_restore(name, &replica, txid, &hash, may_be_pruned);
            }
        }
    }

    /// The restore of `replica` up to `txid` (the latest: none) equals `hash`, or, if
    /// `may_be_pruned`, fails cleanly.
    fn check_restore(
        &mut self,
        name: &str,
        replica: &str,
        txid: Option<u64>,
        hash: &str,
        may_be_pruned: bool,
    ) {
        let (c, n, codec) = (self.c, self.n, self.p.codec);
        let recorded = &self.recorded;
        let out = c.dir.join(&format!(
            "restored-{name}-{}.db",
            txid.map_or("latest".into(), |t| format!("{t:016x}"))
        ));
        let o = c.restore(replica, &out, txid);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        if !o.status.success() && may_be_pruned {
            // Pruned by retention: a clean refusal, nothing written.
            assert_eq!(o.status.code(), Some(1), "cycle {n}: {text}");
            assert!(
                !out.exists(),
                "cycle {n}: failed restore left {}",
                out.display()
            );
            self.st.pruned += 1;
            return;
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
        self.st.compared += 1;
    }
}

/// The database file replaced under the daemon (the writers are done): a copy with a few rows
/// fewer renamed over it, its old WAL gone.
fn replace_database(c: &Cycle) {
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
}
