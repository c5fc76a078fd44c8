//! A store whose listings lag its PUTs (some S3-compatible servers, a listing cache in front of
//! a bucket) shows the newest files late. The periodic listing must not take such a replica
//! for a wiped one and upload a whole seed snapshot for nothing; a replica that really was
//! emptied is still found, lag or not. The lag is injected by the fault wrapper around a real
//! directory replica: every file put after it is left out of listings.

use crate::common;
use crate::maintenance::wait_until;
use crate::periodic_verify::stopped_and_restored_equal;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{TestDir, Writer};
use replicad::config::Config;
use replicad::daemon::Store;
use replicad::replicate::health::SeedReason;
use replicad::replicate::replica::ReplicaStats;
use replicad::storage::faulty::Faults;

const LIST: usize = 2;

/// A database replicated through the fault wrapper to a directory, listed every 300 ms,
/// staging pruned below level 1 (a replica found wiped needs a whole seed snapshot: what a
/// needless one would cost).
struct Lagging {
    dir: TestDir,
    db: std::path::PathBuf,
    replica: std::path::PathBuf,
    writer: Writer,
    faults: Arc<Faults>,
    store: Store,
    stats: ReplicaStats,
    /// The age identity of a sealed replica.
    identity: Option<std::path::PathBuf>,
}

impl Lagging {
    /// The replica sealed with age if `sealed`.
    async fn new(name: &str, sealed: bool) -> Lagging {
        let dir = TestDir::new(name);
        let db = dir.join("app.db");
        let replica = dir.join("replica");
        let identity = sealed.then(|| dir.join("key.txt"));
        let age = match &identity {
            Some(key) => format!(
                "      age:\n        recipients: [{}]\n        identities: [{}]\n",
                common::age_keygen(key),
                key.display()
            ),
            None => String::new(),
        };
        let yaml = format!(
            "monitor-interval: 40ms\nmin-sync-interval: 40ms\nheartbeat-interval: 100ms\nreplica-check-interval: 300ms\nlevels:\n  - interval: 200ms\nsnapshot:\n  interval: 1h\ndbs:\n  - path: {}\n    replica:\n      path: {}\n{age}",
            db.display(),
            replica.display()
        );
        let config = Config::parse(&yaml, "test", false).unwrap();
        let mut writer = Writer::open(&db, common::seed(name));
        writer.commit_txn();
        let faults = Faults::new();
        let store = Store::open_with(&config, Some(common::behind_faults(&faults)))
            .await
            .unwrap();
        let stats = store.dbs()[0].replicas[0].1.clone();
        wait_until("the first upload", || {
            stats.remote_txid.load(Ordering::Relaxed) > 0
        })
        .await;
        let staged_first = dir.join(".app.db-replicad/ltx/0/0000000000000001-0000000000000001.ltx");
        writer.commit_txn();
        wait_until("staging pruned below level 1", || !staged_first.exists()).await;
        Lagging {
            dir,
            db,
            replica,
            writer,
            faults,
            store,
            stats,
            identity,
        }
    }
}

impl Lagging {
    /// Stops the Store and restores the replica equal to the database (`what`: the moment).
    async fn stopped_and_restored_equal(self, what: &str) {
        let Some(key) = &self.identity else {
            return stopped_and_restored_equal(
                self.store,
                &self.dir,
                &self.db,
                &self.replica,
                what,
            )
            .await;
        };
        self.store.shutdown(std::future::pending()).await;
        let out = self.dir.join("restored.db");
        let o = std::process::Command::new(common::bin())
            .args([
                "restore",
                "--age-identity",
                common::s(key),
                "--to",
                common::s(&out),
            ])
            .arg(&self.replica)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        common::assert_same_content(&self.db, &out, what);
    }
}

/// Seeds of the replica so far, for any reason.
fn reseeds(stats: &ReplicaStats) -> u64 {
    stats.counters.reseeds.iter().map(|r| r.get()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_listing_is_not_a_wipe_and_a_real_wipe_still_is() {
    let mut l = Lagging::new("lagging_listing", false).await;
    let (stats, faults) = (l.stats.clone(), l.faults.clone());
    let c = stats.counters.clone();
    let seeds_before = reseeds(&stats);

    // From now on every file stored is missing from listings for a minute, while commits go
    // on and the replica is listed every 300 ms; its position never goes back.
    faults.set_listing_lag(Duration::from_secs(60));
    let lists = c.ops[LIST].get();
    let mut position = stats.remote_txid.load(Ordering::Relaxed);
    let mut commits = 0;
    while commits < 20 || c.ops[LIST].get() < lists + 4 {
        l.writer.commit_txn();
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
        reseeds(&stats),
        seeds_before,
        "a listing that lags is not a wipe: no seed"
    );
    assert!(stats.health.is_ok(), "{:?}", stats.health.problem());

    // Emptied for real (moved away at once), the listing still lagging: found and re-seeded.
    std::fs::rename(l.replica.join("ltx"), l.dir.join("moved-ltx")).unwrap();
    let wiped = &c.reseeds[SeedReason::Wiped as usize];
    wait_until("the wipe found and re-seeded", || wiped.get() >= 1).await;
    assert_eq!(reseeds(&stats), seeds_before + 1, "one seed");
    l.writer.commit_txn();
    faults.set_listing_lag(Duration::ZERO);
    l.stopped_and_restored_equal("after the wipe").await;
}

/// A file the lagging listing lacks that is there but damaged (shorter than its header) is
/// not a lag: the replica does not restore, and it is seeded again. The short read was taken
/// for a passing fault: the recheck was retried without end, and nothing seeded over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_file_behind_a_lagging_listing_is_seeded_over() {
    damaged_file_seeded_over("lagging_listing_damaged", false).await;
}

/// The same with the replica sealed by age: the damaged file is not an age file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_sealed_file_behind_a_lagging_listing_is_seeded_over() {
    damaged_file_seeded_over("lagging_listing_damaged_sealed", true).await;
}

async fn damaged_file_seeded_over(name: &str, sealed: bool) {
    let mut l = Lagging::new(name, sealed).await;
    let (stats, faults) = (l.stats.clone(), l.faults.clone());
    let seeds_before = reseeds(&stats);
    faults.set_listing_lag(Duration::from_secs(60));
    let level1 = l.replica.join("ltx/1");
    let before: HashSet<_> = names(&level1);
    let mut made = Vec::new();
    while made.len() < 2 {
        l.writer.commit_txn();
        tokio::time::sleep(Duration::from_millis(50)).await;
        made = names(&level1).difference(&before).cloned().collect();
    }
    // A level-1 file stays in the restore plan until the next snapshot (in an hour).
    made.sort();
    assert_eq!(made[0].ends_with(".age"), sealed, "{made:?}");
    std::fs::write(level1.join(&made[0]), b"LTX").unwrap();
    let wiped = &stats.counters.reseeds[SeedReason::Wiped as usize];
    wait_until("the damage found and seeded over", || wiped.get() >= 1).await;
    assert_eq!(reseeds(&stats), seeds_before + 1, "one seed");
    l.writer.commit_txn();
    faults.set_listing_lag(Duration::ZERO);
    l.stopped_and_restored_equal("after the seed").await;
}

/// The names of the files in `dir`.
fn names(dir: &std::path::Path) -> HashSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}
