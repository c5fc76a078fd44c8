//! Single writer per replica: a second `replicad replicate` pointed at a
//! replica another live daemon writes is refused loudly (exit 1, naming the holder) instead of
//! interleaving TXIDs; a clean stop hands the replica over at once, a kill -9 after the lease
//! TTL, and a restart of the same database on the same host at once. Run against a file
//! replica and against the in-process S3 server. Also: two databases of one config pointed at
//! one replica path are a config error (exit 2).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::s3::S3Server;
use common::{
    Daemon, TestDir, WAIT, Writer, assert_same_content, parse_ltx_name, s, spawn_replicate,
    wait_timeout,
};

/// Where the two daemons replicate to.
enum Target {
    File(PathBuf),
    S3 {
        server: Box<S3Server>,
        prefix: String,
    },
}

impl Target {
    fn file(dir: &TestDir) -> Target {
        Target::File(dir.join("replica"))
    }

    async fn s3() -> Option<Target> {
        let server = S3Server::start().await;
        if server.is_external() {
            // The checks below read the stored objects directly.
            eprintln!("skipped: needs the in-process S3 server");
            return None;
        }
        Some(Target::S3 {
            server: Box::new(server),
            prefix: "shared/app.db".into(),
        })
    }

    /// The `replica:` map of a config file.
    fn replica_yaml(&self) -> String {
        match self {
            Target::File(p) => format!("      url: {}\n", p.display()),
            Target::S3 { server, prefix } => format!(
                "      url: \"{}\"\n      access-key-id: {}\n      secret-access-key: {}\n",
                server.url(prefix),
                server.access_key,
                server.secret_key
            ),
        }
    }

    /// The location replicad names in its messages.
    fn location(&self) -> String {
        match self {
            Target::File(p) => format!("file://{}", p.display()),
            Target::S3 { server, prefix } => {
                let url = server.url(prefix);
                url.split('?').next().unwrap().to_string()
            }
        }
    }

    fn level0_dir(&self) -> PathBuf {
        match self {
            Target::File(p) => p.join("ltx").join("0"),
            Target::S3 { server, prefix } => server.object_path(&format!("{prefix}/0000")),
        }
    }

    fn lease_path(&self) -> PathBuf {
        match self {
            Target::File(p) => p.join("replicad.lease"),
            Target::S3 { server, prefix } => {
                server.object_path(&format!("{prefix}/replicad.lease"))
            }
        }
    }

    /// `(min, max)` of every level-0 file, sorted.
    fn l0_ranges(&self) -> Vec<(u64, u64)> {
        let Ok(rd) = std::fs::read_dir(self.level0_dir()) else {
            return Vec::new();
        };
        let mut v: Vec<(u64, u64)> = rd
            .filter_map(|e| parse_ltx_name(e.ok()?.file_name().to_str()?))
            .collect();
        v.sort();
        v
    }

    /// The highest TXID of any file, any level.
    fn max_txid(&self) -> u64 {
        let root = match self {
            Target::File(p) => p.join("ltx"),
            Target::S3 { server, prefix } => server.object_path(prefix),
        };
        objects(&root)
            .keys()
            .filter_map(|p| parse_ltx_name(&p.file_name()?.to_string_lossy()))
            .map(|(_, max)| max)
            .max()
            .unwrap_or(0)
    }

    /// Level 0 is one chain 1..=N with no gap, overlap or duplicate; returns N.
    fn assert_contiguous(&self) -> u64 {
        let ranges = self.l0_ranges();
        assert!(!ranges.is_empty(), "no level-0 files");
        let mut next = 1;
        for &(min, max) in &ranges {
            assert!(
                min == next && max >= min,
                "level-0 chain broken at {min:x}-{max:x}: {ranges:x?}"
            );
            next = max + 1;
        }
        next - 1
    }

    fn wait_for_upload(&self, dir: &TestDir) {
        let deadline = Instant::now() + WAIT;
        while self.l0_ranges().is_empty() || !self.lease_path().exists() {
            assert!(
                Instant::now() < deadline,
                "nothing uploaded; logs:\n{}",
                dir.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Restores the latest state to `out`.
    fn restore(&self, out: &Path) {
        let o = restore_output(self, out);
        assert!(
            o.status.success(),
            "restore failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// Writes `<dir>/<name>.yml` replicating `db` to `target`.
fn config(dir: &TestDir, name: &str, db: &Path, target: &Target, ttl: &str) -> PathBuf {
    let path = dir.join(&format!("{name}.yml"));
    std::fs::write(
        &path,
        format!(
            "monitor-interval: 50ms\nmin-sync-interval: 50ms\nlease-ttl: {ttl}\ndbs:\n  - path: {}\n    replica:\n{}",
            db.display(),
            target.replica_yaml()
        ),
    )
    .unwrap();
    path
}

fn start(dir: &TestDir, cfg: &Path) -> Daemon {
    spawn_replicate(dir.path(), &["--config", s(cfg)])
}

/// Starts a daemon that must be refused: exit 1, naming the holder and the replica.
fn assert_refused(dir: &TestDir, cfg: &Path, target: &Target, holder_pid: u32, holder_db: &Path) {
    let mut d = start(dir, cfg);
    let st = wait_timeout(&mut d.child, WAIT)
        .unwrap_or_else(|| panic!("second daemon kept running; logs:\n{}", dir.logs()));
    let log = d.log_text();
    assert_eq!(st.code(), Some(1), "second daemon: {st}; log:\n{log}");
    for want in [
        "in use by another replicad".to_string(),
        format!("pid {holder_pid}"),
        format!("database {}", holder_db.display()),
        target.location(),
    ] {
        assert!(log.contains(&want), "refusal lacks {want:?}:\n{log}");
    }
}

/// Waits until the daemon has taken its lease (true) or exited (false).
fn wait_started(d: &mut Daemon) -> bool {
    let deadline = Instant::now() + WAIT;
    loop {
        if d.log_text().contains("single-writer lease acquired") {
            return true;
        }
        if !d.running() {
            return false;
        }
        assert!(
            Instant::now() < deadline,
            "daemon neither started nor exited:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn second_daemon_is_refused_and_a_clean_stop_hands_over(dir: &TestDir, target: &Target) {
    let seed = common::seed("single_writer");
    let a_db = dir.join("a.db");
    let b_db = dir.join("b.db");
    let mut wa = Writer::open(&a_db, seed);
    wa.run(10);
    let mut wb = Writer::open(&b_db, seed ^ 1);
    wb.run(10);

    let a = start(dir, &config(dir, "a", &a_db, target, "30s"));
    target.wait_for_upload(dir);

    // Another database (another host, or a copy-paste slip) on the same replica.
    let b_cfg = config(dir, "b", &b_db, target, "30s");
    assert_refused(dir, &b_cfg, target, a.pid(), &a_db);
    // A second daemon for the same database on this host, while the first runs: refused by
    // the database's own lock before it touches any replica.
    let mut a2 = start(dir, &config(dir, "a2", &a_db, target, "30s"));
    let st = wait_timeout(&mut a2.child, WAIT)
        .unwrap_or_else(|| panic!("second daemon kept running; logs:\n{}", dir.logs()));
    let log = a2.log_text();
    assert_eq!(st.code(), Some(1), "second daemon: {st}; log:\n{log}");
    for want in [
        format!("database {}", a_db.display()),
        format!(
            "another replicad already replicates this database (pid {}",
            a.pid()
        ),
    ] {
        assert!(log.contains(&want), "refusal lacks {want:?}:\n{log}");
    }

    // The first keeps replicating, alone.
    wa.run(20);
    a.stop_ok();
    assert!(
        !target.lease_path().exists(),
        "a clean stop must release the lease"
    );
    let n = target.assert_contiguous();
    let out = dir.join("restored-a.db");
    target.restore(&out);
    assert_same_content(
        &a_db,
        &out,
        &format!("replica after the first daemon ({n} txids)"),
    );

    // Released: the other database's daemon starts at once and continues the chain.
    let mut b = start(dir, &b_cfg);
    assert!(
        wait_started(&mut b),
        "refused after a clean stop:\n{}",
        b.log_text()
    );
    wb.run(10);
    b.stop_ok();
    let m = target.assert_contiguous();
    assert!(m > n, "the second daemon uploaded nothing ({m} <= {n})");
    let out = dir.join("restored-b.db");
    target.restore(&out);
    assert_same_content(&b_db, &out, "replica after the second daemon");
}

#[test]
fn file_replica_refuses_a_second_daemon_and_a_clean_stop_hands_it_over() {
    let dir = TestDir::new("single-writer-file");
    let target = Target::file(&dir);
    second_daemon_is_refused_and_a_clean_stop_hands_over(&dir, &target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_replica_refuses_a_second_daemon_and_a_clean_stop_hands_it_over() {
    let Some(target) = Target::s3().await else {
        return;
    };
    let dir = TestDir::new("single-writer-s3");
    tokio::task::block_in_place(|| {
        second_daemon_is_refused_and_a_clean_stop_hands_over(&dir, &target)
    });
}

// Long enough that a slow start of the second daemon under load still finds the dead
// holder's lease fresh (it is at most TTL/2 old at the kill).
const TTL: Duration = Duration::from_secs(6);

fn kill9_is_taken_over_after_the_ttl(dir: &TestDir, target: &Target) {
    let seed = common::seed("single_writer_kill9");
    let a_db = dir.join("a.db");
    let b_db = dir.join("b.db");
    let mut wa = Writer::open(&a_db, seed);
    wa.run(10);
    let mut wb = Writer::open(&b_db, seed ^ 1);
    wb.run(10);
    let ttl = format!("{}s", TTL.as_secs());
    let a_cfg = config(dir, "a", &a_db, target, &ttl);
    let b_cfg = config(dir, "b", &b_db, target, &ttl);

    let a = start(dir, &a_cfg);
    target.wait_for_upload(dir);
    let a_pid = a.pid();
    a.kill9();
    let killed = Instant::now();

    // The same database restarted on the same host: its predecessor's process is gone, so
    // it takes the lease over at once, without waiting for the TTL.
    let mut a2 = start(dir, &a_cfg);
    assert!(wait_started(&mut a2), "restart refused:\n{}", a2.log_text());
    assert!(
        a2.log_text()
            .contains("previous run of this database on this host"),
        "{}",
        a2.log_text()
    );
    // The TTL path takes at least 1.5 TTL: the lease looks expired TTL/2 after the kill at
    // the earliest, and is then watched for a whole TTL.
    assert!(killed.elapsed() < TTL, "restart took the TTL path");
    wa.run(10);
    let deadline = Instant::now() + WAIT;
    while target.l0_ranges().len() < 2 {
        assert!(Instant::now() < deadline, "restart uploaded nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    let a2_pid = a2.pid();
    a2.kill9();
    let killed = Instant::now();
    let n = target.assert_contiguous();

    // Another database (as from another host): refused while the dead holder's lease is
    // fresh, accepted once it is older than the TTL.
    let mut refusals = 0;
    let b = loop {
        let mut b = start(dir, &b_cfg);
        if wait_started(&mut b) {
            break b;
        }
        let st = wait_timeout(&mut b.child, WAIT).unwrap();
        assert_eq!(st.code(), Some(1), "{}", b.log_text());
        assert!(
            b.log_text().contains(&format!("pid {a2_pid}")),
            "{}",
            b.log_text()
        );
        refusals += 1;
        assert!(killed.elapsed() < TTL + WAIT, "never taken over");
        std::thread::sleep(Duration::from_millis(250));
    };
    let waited = killed.elapsed();
    assert!(
        refusals > 0,
        "taken over right after a kill -9 of a live lease"
    );
    // The lease was at most TTL/2 old when its holder died.
    assert!(
        waited >= TTL / 2,
        "taken over after {waited:?}, TTL {TTL:?}"
    );
    assert!(
        b.log_text().contains("taking over an expired lease"),
        "{}",
        b.log_text()
    );
    wb.run(10);
    // The takeover happened in the background, after the TTL: the replica, ahead of b's own
    // chain, was seeded past its tip. Wait for it to hold b's database.
    common::wait_restores(dir, &b_db, "the replica after the takeover", |out| {
        restore_quietly(target, out)
    });
    b.stop_ok();
    let m = target.max_txid();
    assert!(m > n, "the new holder uploaded nothing");
    let out = dir.join("restored.db");
    target.restore(&out);
    assert_same_content(&b_db, &out, "replica after the takeover");
    let _ = a_pid;
}

#[test]
fn file_replica_kill9_holder_is_taken_over_after_the_ttl() {
    let dir = TestDir::new("single-writer-kill9-file");
    let target = Target::file(&dir);
    kill9_is_taken_over_after_the_ttl(&dir, &target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_replica_kill9_holder_is_taken_over_after_the_ttl() {
    let Some(target) = Target::s3().await else {
        return;
    };
    let dir = TestDir::new("single-writer-kill9-s3");
    tokio::task::block_in_place(|| kill9_is_taken_over_after_the_ttl(&dir, &target));
}

#[test]
fn two_databases_on_one_replica_path_is_a_config_error() {
    let dir = TestDir::new("single-writer-config");
    for (replica_a, replica_b, named) in [
        (
            "{url: \"file:///backup/shared\"}",
            "{path: /backup/shared/}",
            "replica path /backup/shared",
        ),
        (
            "{url: \"s3://bkt/app?endpoint=http://127.0.0.1:9&region=us-east-1\"}",
            "{type: s3, bucket: bkt, path: /app/, endpoint: \"http://127.0.0.1:9\"}",
            "s3 destination s3://bkt/app at endpoint http://127.0.0.1:9",
        ),
    ] {
        let cfg = dir.join("two.yml");
        std::fs::write(
            &cfg,
            format!(
                "dbs:\n  - path: /data/a.db\n    replica: {replica_a}\n  - path: /data/b.db\n    replica: {replica_b}\n"
            ),
        )
        .unwrap();
        let o = Command::new(common::bin())
            .args(["replicate", "--config", s(&cfg)])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        for want in [
            named,
            "is used by two databases: dbs[0] (/data/a.db) and dbs[1] (/data/b.db)",
        ] {
            assert!(err.contains(want), "missing {want:?} in: {err}");
        }
    }
}

/// A replica whose lease another instance took while this one ran (say, after this host was
/// paused for longer than the TTL) stops uploading at its next round, says so, fails
/// `/readyz`, and leaves the other's lease alone on shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_lease_was_taken_stops_uploading_and_is_not_ready() {
    use replicad::config::{Config, DbSettings};
    use std::sync::atomic::Ordering;

    let dir = TestDir::new("single-writer-lost");
    let db = dir.join("app.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    let target = Target::file(&dir);
    let settings = DbSettings {
        monitor_interval: Duration::from_millis(20),
        heartbeat_interval: Duration::from_millis(50),
        ..DbSettings::default()
    };
    let config =
        Config::single(db.clone(), &[s(&dir.join("replica")).to_string()], settings).unwrap();
    let store = replicad::daemon::Store::open(&config).await.unwrap();
    let h = store.dbs()[0].clone();
    let stats = h.replicas[0].1.clone();
    let deadline = Instant::now() + WAIT;
    while stats.remote_txid.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "nothing uploaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let uploaded = target.l0_ranges();
    assert!(replicad::ops::http::readiness(&store.dbs(), Duration::from_secs(60), 0).is_ok());

    let foreign = common::http::FOREIGN_LEASE;
    std::fs::write(target.lease_path(), foreign).unwrap();
    conn.execute("INSERT INTO t VALUES (2)", []).unwrap();
    let deadline = Instant::now() + WAIT;
    while !stats.lease_lost.load(Ordering::Relaxed) {
        assert!(Instant::now() < deadline, "the lost lease went unnoticed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // More commits: none reaches the replica.
    conn.execute("INSERT INTO t VALUES (3)", []).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        target.l0_ranges(),
        uploaded,
        "uploaded after losing the lease"
    );
    common::http::assert_unready_for_the_lease(&store);
    store.shutdown(std::future::pending()).await;
    assert_eq!(
        std::fs::read_to_string(target.lease_path()).unwrap(),
        foreign,
        "shutdown removed or rewrote another instance's lease"
    );
}

/// A refused start hands back the leases it already took: a database with a free replica
/// and a held one leaves no lease on the free one.
#[test]
fn a_refused_start_releases_the_leases_it_took() {
    let dir = TestDir::new("single-writer-partial");
    let a_db = dir.join("a.db");
    let b_db = dir.join("b.db");
    let mut wa = Writer::open(&a_db, 1);
    wa.run(5);
    let mut wb = Writer::open(&b_db, 2);
    wb.run(5);
    let held = Target::File(dir.join("held"));
    let free = dir.join("free");
    let a = start(&dir, &config(&dir, "a", &a_db, &held, "30s"));
    held.wait_for_upload(&dir);
    let b_cfg = dir.join("b.yml");
    std::fs::write(
        &b_cfg,
        format!(
            "monitor-interval: 50ms\ndbs:\n  - path: {}\n    replicas:\n      - url: {}\n      - url: {}\n",
            b_db.display(),
            free.display(),
            dir.join("held").display()
        ),
    )
    .unwrap();
    assert_refused(&dir, &b_cfg, &held, a.pid(), &a_db);
    assert!(
        !free.join("replicad.lease").exists(),
        "a refused start left its lease on the free replica"
    );
    assert!(
        std::fs::read_dir(&free).map_or(true, |mut d| d.all(|e| {
            let name = e.unwrap().file_name();
            name != "ltx"
        })),
        "a refused start wrote to the free replica"
    );
    a.stop_ok();
}

/// Sends `sig` (`-STOP`, `-CONT`) to a daemon.
fn signal(d: &Daemon, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &d.pid().to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill {sig}");
}

/// Every object under the replica (the lease aside), with a hash of its bytes.
fn objects(root: &Path) -> std::collections::BTreeMap<PathBuf, String> {
    use sha2::{Digest, Sha256};
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if parse_ltx_name(&e.file_name().to_string_lossy()).is_some()
                && let Ok(bytes) = std::fs::read(&p)
            {
                out.insert(p, hex::encode(Sha256::digest(&bytes)));
            }
        }
    }
    out
}

/// Two daemons of two databases take one S3 replica from each other 25 times: each time the
/// holder is frozen (SIGSTOP) at a random moment, the other takes over once the frozen lease
/// has stayed unchanged for its TTL, and the frozen one is woken (SIGCONT) to finish whatever
/// round it was in. With conditional writes, no object is ever replaced, the woken one writes
/// nothing more, and after every takeover the replica restores to the new holder's database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_conditional_writes_keep_one_chain_through_25_takeovers() {
    takeovers("single_writer_race", 25).await;
}

/// The same with another seed: two tests of 25 rounds (about 7 s each, mostly waiting for the
/// TTL) run side by side where one of 50 was the suite's last test to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_conditional_writes_keep_one_chain_through_25_more_takeovers() {
    takeovers("single_writer_race_more", 25).await;
}

async fn takeovers(name: &str, rounds: usize) {
    use rand::{RngExt, SeedableRng};
    let Some(target) = Target::s3().await else {
        return;
    };
    let dir = TestDir::new(&name.replace('_', "-"));
    tokio::task::block_in_place(|| {
        let seed = common::seed(name);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let Target::S3 { server, prefix } = &target else {
            unreachable!("an S3 target")
        };
        let root = server.object_path(prefix);
        let dbs = [dir.join("a.db"), dir.join("b.db")];
        let mut writers = [Writer::open(&dbs[0], seed), Writer::open(&dbs[1], seed ^ 1)];
        let cfgs = [
            config(&dir, "a", &dbs[0], &target, "1s"),
            config(&dir, "b", &dbs[1], &target, "1s"),
        ];
        writers[0].run(5);
        let mut holder = start(&dir, &cfgs[0]);
        let mut h = 0;
        assert!(wait_started(&mut holder), "{}", dir.logs());
        target.wait_for_upload(&dir);
        let mut seen = objects(&root);
        let mut restores = 0;
        for round in 0..rounds {
            for _ in 0..rng.random_range(1..4) {
                writers[h].commit_txn();
                std::thread::sleep(Duration::from_millis(rng.random_range(0..40)));
            }
            std::thread::sleep(Duration::from_millis(rng.random_range(0..80)));
            signal(&holder, "-STOP");
            let c = 1 - h;
            let deadline = Instant::now() + WAIT;
            let mut challenger = loop {
                let mut d = start(&dir, &cfgs[c]);
                if wait_started(&mut d) {
                    break d;
                }
                assert!(
                    Instant::now() < deadline,
                    "round {round}: no takeover\n{}",
                    dir.logs()
                );
                std::thread::sleep(Duration::from_millis(150));
            };
            writers[c].run(rng.random_range(1..4));
            // The replica restores to the new holder's database once it has caught up.
            common::wait_restores(
                &dir,
                &dbs[c],
                &format!("round {round}: the replica (the new holder's database)"),
                |out| restore_quietly(&target, out),
            );
            restores += 1;
            // The frozen one wakes in the middle of whatever it was doing: it must not write.
            signal(&holder, "-CONT");
            std::thread::sleep(Duration::from_millis(300));
            holder.kill9();
            let now = objects(&root);
            for (path, hash) in &seen {
                // Retention may delete compacted files; nothing is ever replaced.
                if let Some(h2) = now.get(path) {
                    assert_eq!(h2, hash, "round {round}: {} was replaced", path.display());
                }
            }
            seen.extend(now);
            let out = dir.join(&format!("round-{round}-woken.db"));
            assert!(
                restore_quietly(&target, &out),
                "round {round}: restore after the wake-up"
            );
            assert_same_content(
                &dbs[c],
                &out,
                &format!("round {round}: after the old holder woke"),
            );
            let _ = challenger.running();
            holder = challenger;
            h = c;
        }
        holder.stop_ok();
        let out = dir.join("final.db");
        target.restore(&out);
        assert_same_content(&dbs[h], &out, "the winner's database");
        assert_eq!(restores, rounds);
    });
}

/// [`Target::restore`], answering whether it worked instead of failing the test.
fn restore_quietly(target: &Target, out: &Path) -> bool {
    restore_output(target, out).status.success()
}

/// `replicad restore --to OUT` of the target's replica.
fn restore_output(target: &Target, out: &Path) -> std::process::Output {
    let mut cmd = Command::new(common::bin());
    cmd.args(["restore", "--to", s(out)]);
    match target {
        Target::File(p) => {
            cmd.arg(p);
        }
        Target::S3 { server, prefix } => {
            cmd.arg(server.url(prefix))
                .env("AWS_ACCESS_KEY_ID", &server.access_key)
                .env("AWS_SECRET_ACCESS_KEY", &server.secret_key);
        }
    }
    cmd.output().expect("run replicad restore")
}
