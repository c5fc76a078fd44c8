//! A clean stop right after a replica was healed (re-seeded after a failed verify) verifies
//! it before the process ends, so that the stop reports what holds: the replica protected,
//! exit 0, rather than the verdict the seed answered.

use crate::common;
use crate::maintenance::wait_until;
use crate::periodic_verify::{damage, verified_every_300ms};

use std::time::Duration;

use common::{TestDir, assert_same_content, level_ranges};
use replicad::replicate::health::SeedReason;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_right_after_a_heal_reports_the_replica_verified() {
    let dir = TestDir::new("heal-at-stop");
    let (db, replica, mut writer, store) =
        verified_every_300ms(&dir, "heal-at-stop", "1h", "24h").await;
    let stats = store.dbs()[0].replicas[0].1.clone();

    // The heal waits behind an obstacle where its level's directory goes.
    let obstacle = replica.join("ltx/9");
    std::fs::write(&obstacle, b"not a directory").unwrap();
    let (min, max) = level_ranges(&replica, 0)[0];
    damage(&replica.join(format!("ltx/0/{min:016x}-{max:016x}.ltx")));
    writer.commit_txn();
    let reason = || stats.health.problem().map(|p| p.reason).unwrap_or_default();
    wait_until("the failed verify", || reason().contains("re-seeding")).await;

    // Stop as soon as the seed is stored: before the verify that follows it can pass.
    std::fs::remove_file(&obstacle).unwrap();
    let seeds = &stats.counters.reseeds[SeedReason::Unrestorable as usize];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seeds.get() == 0 {
        assert!(std::time::Instant::now() < deadline, "no seed stored");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let left = store.shutdown(std::future::pending()).await;
    assert!(left.is_empty(), "the stop reported {left:?}");
    assert_eq!(
        stats.counters.verify_ok.get(),
        1,
        "the healed replica was verified"
    );
    assert!(stats.health.is_ok(), "{}", reason());
    let out = dir.join("restored.db");
    common::restore_ok(replica.to_str().unwrap(), &out, None);
    assert_same_content(&db, &out, "the replica healed at the stop");
}
