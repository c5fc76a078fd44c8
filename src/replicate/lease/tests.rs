use super::*;

#[test]
fn own_pid_counts_as_alive_and_a_dead_pid_does_not() {
    assert!(pid_alive(std::process::id()));
    // Beyond pid_max (at most 2^22 on Linux): no such process.
    assert!(!pid_alive(1 << 30));
    assert!(!pid_alive(0));
}

/// Only the instance named by the local claim we hold counts as a previous run that ended:
/// a twin with our host, database and pid (another container, pid 1 in its own PID namespace)
/// does not, nor a dead process whose pid another now has.
#[test]
fn a_predecessor_is_the_claims_previous_instance_not_a_pid() {
    let lease = |predecessor: Option<&str>| local_lease().succeeding(predecessor);
    let other = |instance: &str| LeaseRecord {
        instance: instance.to_string(),
        ..lease(None).me
    };
    let twin = other("twin");
    assert!(!lease(None).is_my_predecessor(&twin));
    assert!(!lease(Some("earlier")).is_my_predecessor(&twin));
    assert!(lease(Some("twin")).is_my_predecessor(&twin));
    let elsewhere = LeaseRecord {
        host: "another-host".into(),
        ..twin.clone()
    };
    assert!(!lease(Some("twin")).is_my_predecessor(&elsewhere));
    let other_db = LeaseRecord {
        db: "/data/b.db".into(),
        ..twin
    };
    assert!(!lease(Some("twin")).is_my_predecessor(&other_db));
}

/// With no claim naming it (local state lost), a lease's process is known to have ended
/// only when it ran before this boot, or in our PID namespace under a pid nobody has now.
#[test]
fn without_a_claim_only_another_boot_or_a_dead_pid_in_our_namespace_has_ended() {
    let lease = local_lease();
    assert!(!lease.me.boot.is_empty() && !lease.me.pid_ns.is_empty());
    let dead = 1 << 30;
    let record = |boot: &str, pid_ns: &str, pid: u32| LeaseRecord {
        instance: "earlier".into(),
        boot: boot.into(),
        pid_ns: pid_ns.into(),
        pid,
        ..lease.me.clone()
    };
    let (boot, ns) = (lease.me.boot.clone(), lease.me.pid_ns.clone());
    assert!(lease.is_my_predecessor(&record("another boot", &ns, std::process::id())));
    assert!(lease.is_my_predecessor(&record(&boot, &ns, dead)));
    assert!(!lease.is_my_predecessor(&record(&boot, &ns, std::process::id())));
    // Another PID namespace of this boot: a twin container, pid 1 like ours may be.
    assert!(!lease.is_my_predecessor(&record(&boot, "pid:[1]", dead)));
    assert!(!lease.is_my_predecessor(&record(&boot, "pid:[1]", 1)));
    // Another boot of another machine of our host name (a rescheduled pod whose old node
    // still runs): not known to have ended. Of this machine, or where either side records
    // no machine, it is this host's earlier boot.
    let machine = |m: &str, me: &str| {
        let mut lease = local_lease();
        lease.me.machine = me.into();
        let other = LeaseRecord {
            machine: m.into(),
            ..record("another boot", &ns, dead)
        };
        lease.is_my_predecessor(&other)
    };
    assert!(!machine("m-other", "m-ours"));
    assert!(machine("m-ours", "m-ours"));
    assert!(machine("", "m-ours") && machine("m-other", ""));
    // A lease that records neither: judged by its pid, as before.
    assert!(lease.is_my_predecessor(&record("", "", dead)));
    assert!(!lease.is_my_predecessor(&record("", "", 1)));
}

/// This process's lease of `/data/a.db` on a directory replica (never written here).
fn local_lease() -> Lease {
    Lease::new(
        AnyClient::from_url("/nonexistent-replica").expect("a plain path is a valid URL"),
        "/data/a.db",
        DEFAULT_LEASE_TTL,
    )
}

#[test]
fn record_round_trips_as_json_and_displays_the_holder() {
    let lease = local_lease();
    let json = serde_json::to_string(&lease.me).expect("serialises");
    let back: LeaseRecord = serde_json::from_str(&json).expect("parses");
    assert_eq!(back, lease.me);
    let shown = back.to_string();
    assert!(
        shown.contains(&format!("pid {}", std::process::id())),
        "{shown}"
    );
    assert!(shown.contains("/data/a.db"), "{shown}");
    assert_eq!(lease.refresh_in(), Duration::ZERO);
}

/// A lease whose TTL makes `reread_after` 100 ms in conditional mode, confirmed `ago` ago and
/// written now.
fn confirmed(mode: Mode, ago: Duration) -> Lease {
    let client = AnyClient::from_url("s3://bucket/prefix?endpoint=http://127.0.0.1:9&region=x")
        .expect("a valid S3 URL");
    let mut lease = Lease::new(client, "/data/a.db", Duration::from_secs(6));
    lease.mode = mode;
    lease.written_at = Some(Instant::now());
    lease.confirmed_at = Some(since_boot().saturating_sub(ago));
    lease
}

#[test]
fn with_conditional_writes_a_recent_check_spares_rounds_until_reread_after() {
    let fresh = confirmed(Mode::Conditional, Duration::ZERO);
    assert_eq!(fresh.reread_after(), Duration::from_millis(100));
    assert!(!fresh.check_due());
    assert!(confirmed(Mode::Conditional, Duration::from_millis(100)).check_due());
    // Never confirmed since the last failure.
    let mut failed = confirmed(Mode::Conditional, Duration::ZERO);
    failed.confirmed_at = None;
    assert!(failed.check_due());
    // A refresh due forces the read (the refresh itself follows it).
    let mut stale = confirmed(Mode::Conditional, Duration::ZERO);
    stale.written_at = Some(
        Instant::now()
            .checked_sub(Duration::from_secs(3))
            .expect("the monotonic clock has run for seconds"),
    );
    assert!(stale.check_due());
}

#[test]
fn without_conditional_writes_every_round_reads_the_lease() {
    let lease = confirmed(Mode::ReadCheck, Duration::ZERO);
    assert_eq!(lease.reread_after(), Duration::ZERO);
    assert!(lease.check_due());
}

#[test]
fn the_boot_clock_counts_like_the_monotonic_one_while_awake() {
    // Each boot-clock read between two monotonic ones: bounds that no preemption can break.
    let (m0, b0, m1) = (Instant::now(), since_boot(), Instant::now());
    std::thread::sleep(Duration::from_millis(20));
    let (m2, b1, m3) = (Instant::now(), since_boot(), Instant::now());
    let boot = b1 - b0;
    assert!(boot >= Duration::from_millis(20), "{boot:?}");
    assert!(boot >= m2 - m1 && boot <= m3 - m0, "{boot:?}");
}

/// Where a replace removes the old lease before the new one is in (SFTP, WebDAV), a second
/// instance that reads in that moment must still find the lease held: it read none, took it
/// and pushed the live holder off at the holder's next check. Both orders: the look for the
/// write's temporary file lands in the gap (wait, read again), or after the rename (read
/// again at once).
#[tokio::test]
async fn a_lease_read_while_its_holder_replaces_it_is_still_held() {
    for look_late in [false, true] {
        newcomer_during_a_refresh(look_late).await;
    }
}

async fn newcomer_during_a_refresh(look_late: bool) {
    use crate::storage::faulty::{Faults, FaultyClient};
    let dir = tempfile::tempdir().expect("a temporary directory");
    let faults = Faults::new();
    let client = AnyClient::Faulty(Box::new(FaultyClient::new(
        AnyClient::from_url(&dir.path().display().to_string()).expect("a plain path"),
        faults.clone(),
    )));
    let counters = test_counters();
    let mut holder = Lease::new(client.clone(), "/data/a.db", DEFAULT_LEASE_TTL);
    holder.acquire(&counters).await.expect("a free replica");
    assert_eq!(holder.mode(), Mode::ReadCheck);
    faults.set_aux_gap(Duration::from_millis(300));
    faults.set_aux_look_late(look_late);
    let refresh = tokio::spawn(async move {
        holder
            .write(&test_counters(), WriteIf::Absent)
            .await
            .map(|()| holder)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut newcomer = Lease::new(client.clone(), "/data/b.db", DEFAULT_LEASE_TTL);
    let r = newcomer.acquire(&counters).await;
    assert!(
        matches!(r, Err(LeaseError::Held { .. })),
        "look late {look_late}: the newcomer took a live lease: {r:?}"
    );
    let mut holder = refresh.await.expect("no panic").expect("the refresh");
    faults.set_aux_gap(Duration::ZERO);
    holder
        .check(&counters)
        .await
        .expect("the holder keeps its lease");
}

/// Counters registered nowhere that matters.
fn test_counters() -> ReplicaCounters {
    crate::replicate::counters::ReplicaMetrics::register(
        &prometheus::Registry::new(),
        std::sync::Arc::default(),
    )
    .replica("/data/a.db", "r", false)
}
