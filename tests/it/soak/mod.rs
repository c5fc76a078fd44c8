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

use std::path::Path;
use std::time::Instant;

use common::s3::S3Server;
use common::*;
use rand::RngExt;

mod cycle;
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
        let st = cycle::cycle(&rt, &mut server, seed, n, cs);
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
