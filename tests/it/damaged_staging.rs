//! A staged segment damaged before its upload (its header no LTX header: bit rot, a file
//! edited by hand) no longer holds every replica at that TXID for good, retried as if the
//! file system had failed, while staging grew behind it: the replica continues after it from
//! a seed snapshot of the live database, and restores to the source.

use crate::common;
use crate::maintenance::wait_until;
use crate::periodic_verify::stopped_and_restored_equal;

use std::sync::atomic::Ordering;

use common::{TestDir, Writer};
use replicad::config::Config;
use replicad::daemon::Store;
use replicad::ltx::TxId;
use replicad::replicate::staging::Staging;
use replicad::storage::faulty::Faults;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_staged_segment_is_passed_with_a_seed() {
    let dir = TestDir::new("damaged-staging");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let yaml = format!(
        "monitor-interval: 40ms\nmin-sync-interval: 40ms\nheartbeat-interval: 100ms\n\
         levels:\n  - interval: 1h\nsnapshot:\n  interval: 1h\n\
         dbs:\n  - path: {}\n    replica:\n      path: {}\n",
        db.display(),
        replica.display()
    );
    let config = Config::parse(&yaml, "test", false).unwrap();
    let mut writer = Writer::open(&db, common::seed("damaged-staging"));
    writer.commit_txn();
    let faults = Faults::new();
    let store = Store::open_with(&config, Some(common::behind_faults(&faults)))
        .await
        .unwrap();
    let h = store.dbs()[0].clone();
    let stats = h.replicas[0].1.clone();
    let remote = || stats.remote_txid.load(Ordering::Relaxed);
    let local = || h.stats.txid.load(Ordering::Relaxed);
    wait_until("the first upload", || remote() >= 1 && remote() == local()).await;

    // Uploads fail while three commits are staged; the first of them is then damaged.
    faults.set_fail_rate(1.0);
    let held = remote();
    for n in 1..=3 {
        writer.commit_txn();
        wait_until("a segment staged", || local() >= held + n).await;
    }
    let staging = Staging::open(dir.join(".app.db-replicad/ltx/0")).unwrap();
    let damaged = staging.path(TxId(held + 1));
    let mut bytes = std::fs::read(&damaged).unwrap();
    bytes[..4].copy_from_slice(b"XXXX");
    std::fs::write(&damaged, &bytes).unwrap();
    let reseeds = stats.counters.reseeds.iter().map(|c| c.get()).sum::<u64>();
    faults.set_fail_rate(0.0);

    writer.commit_txn();
    wait_until("the replica past the damaged segment", || {
        remote() > held + 1 && remote() == local()
    })
    .await;
    assert!(
        stats.counters.reseeds.iter().map(|c| c.get()).sum::<u64>() > reseeds,
        "passed with a seed"
    );
    // The upload is counted before its round ends and clears the problem.
    wait_until("healthy again", || stats.health.problem().is_none()).await;
    stopped_and_restored_equal(store, &dir, &db, &replica, "past a damaged segment").await;
}
