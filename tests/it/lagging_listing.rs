//! A store whose listings lag its PUTs (some S3-compatible servers, a listing cache in front of
//! a bucket) shows the newest files late. The periodic listing must not take such a replica
//! for a wiped one and upload a whole seed snapshot for nothing; a replica that really was
//! emptied is still found, lag or not. The lag is injected by the fault wrapper around a real
//! directory replica: every file put after it is left out of listings.

use crate::common;
use crate::maintenance::wait_until;
use crate::periodic_verify::stopped_and_restored_equal;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{TestDir, Writer};
use replicad::config::Config;
use replicad::daemon::{ClientWrapper, Store};
use replicad::replicate::health::SeedReason;
use replicad::storage::AnyClient;
use replicad::storage::faulty::{Faults, FaultyClient};

const LIST: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_listing_is_not_a_wipe_and_a_real_wipe_still_is() {
    let dir = TestDir::new("lagging-listing");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let yaml = format!(
        "monitor-interval: 40ms\nmin-sync-interval: 40ms\nheartbeat-interval: 100ms\nreplica-check-interval: 300ms\nlevels:\n  - interval: 200ms\nsnapshot:\n  interval: 1h\ndbs:\n  - path: {}\n    replica:\n      path: {}\n",
        db.display(),
        replica.display()
    );
    let config = Config::parse(&yaml, "test", false).unwrap();
    let mut writer = Writer::open(&db, common::seed("lagging_listing"));
    writer.commit_txn();
    let faults = Faults::new();
    let f = faults.clone();
    let wrap: ClientWrapper = Arc::new(move |_db: &str, _name: &str, client: AnyClient| {
        AnyClient::Faulty(Box::new(FaultyClient::new(client, f.clone())))
    });
    let store = Store::open_with(&config, Some(wrap)).await.unwrap();
    let stats = store.dbs()[0].replicas[0].1.clone();
    let c = stats.counters.clone();
    let reseeds = || c.reseeds.iter().map(|r| r.get()).sum::<u64>();
    wait_until("the first upload", || {
        stats.remote_txid.load(Ordering::Relaxed) > 0
    })
    .await;
    // Level 1 every 200 ms: staging keeps no segment below it, so a replica found wiped needs
    // a whole seed snapshot (what a needless one would cost).
    let staged_first = dir.join(".app.db-replicad/ltx/0/0000000000000001-0000000000000001.ltx");
    writer.commit_txn();
    wait_until("staging pruned below level 1", || !staged_first.exists()).await;
    let seeds_before = reseeds();

    // From now on every file stored is missing from listings for a minute, while commits go
    // on and the replica is listed every 300 ms; its position never goes back.
    faults.set_listing_lag(Duration::from_secs(60));
    let lists = c.ops[LIST].get();
    let mut position = stats.remote_txid.load(Ordering::Relaxed);
    let mut commits = 0;
    while commits < 20 || c.ops[LIST].get() < lists + 4 {
        writer.commit_txn();
        commits += 1;
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = stats.remote_txid.load(Ordering::Relaxed);
            assert!(
                now >= position,
                "the position went back from {position} to {now}"
            );
            position = now;
        }
        assert!(commits < 300, "fewer than four listings in 30 s");
    }
    assert_eq!(
        reseeds(),
        seeds_before,
        "a listing that lags is not a wipe: no seed"
    );
    assert!(stats.health.is_ok(), "{:?}", stats.health.problem());

    // Emptied for real (moved away at once), the listing still lagging: found and re-seeded.
    std::fs::rename(replica.join("ltx"), dir.join("moved-ltx")).unwrap();
    let wiped = &c.reseeds[SeedReason::Wiped as usize];
    wait_until("the wipe found and re-seeded", || wiped.get() >= 1).await;
    assert_eq!(reseeds(), seeds_before + 1, "one seed");
    writer.commit_txn();
    faults.set_listing_lag(Duration::ZERO);
    stopped_and_restored_equal(store, &dir, &db, &replica, "after the wipe").await;
}
