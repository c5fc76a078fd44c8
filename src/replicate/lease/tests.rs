use super::*;

#[test]
fn own_pid_counts_as_alive_and_a_dead_pid_does_not() {
    assert!(pid_alive(std::process::id()));
    // Beyond pid_max (at most 2^22 on Linux): no such process.
    assert!(!pid_alive(1 << 30));
    assert!(!pid_alive(0));
}

#[test]
fn record_round_trips_as_json_and_displays_the_holder() {
    let lease = Lease::new(
        AnyClient::from_url("/nonexistent-replica").expect("a plain path is a valid URL"),
        "/data/a.db",
        DEFAULT_LEASE_TTL,
    );
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

/// A lease on a remote store whose TTL makes `recheck` 100 ms.
fn remote_lease() -> Lease {
    let client = AnyClient::from_url("s3://bucket/prefix?endpoint=http://127.0.0.1:9&region=x")
        .expect("a valid S3 URL");
    Lease::new(client, "/data/a.db", Duration::from_secs(6))
}

fn ago(d: Duration) -> Instant {
    Instant::now()
        .checked_sub(d)
        .expect("the monotonic clock has run for seconds")
}

#[test]
fn a_recent_check_spares_the_next_rounds_until_recheck_or_a_due_refresh() {
    let mut lease = remote_lease();
    assert_eq!(lease.recheck(), Duration::from_millis(100));
    // Never confirmed: a round must read it.
    assert!(lease.check_due(Instant::now()));
    lease.mode = Mode::Conditional;
    lease.written_at = Some(Instant::now());
    lease.confirmed_at = lease.written_at;
    assert!(!lease.check_due(Instant::now()));
    assert!(lease.check_due(Instant::now() + Duration::from_millis(100)));
    // A refresh due forces the read (the refresh itself follows it).
    lease.written_at = Some(ago(Duration::from_secs(3)));
    assert!(lease.check_due(Instant::now()));
}

#[test]
fn without_conditional_writes_only_a_read_after_the_race_window_spares_rounds() {
    let mut lease = remote_lease();
    lease.mode = Mode::ReadCheck;
    let written = ago(Duration::from_millis(50));
    lease.written_at = Some(written);
    lease.settled_from = Some(written + lease.recheck());
    // The read-back right after our acquiring write: a racer's write may still land.
    lease.confirmed_at = Some(Instant::now());
    assert!(lease.check_due(Instant::now()));
    // A read begun after the window.
    lease.confirmed_at = Some(written + lease.recheck());
    assert!(!lease.check_due(written + lease.recheck()));
}

#[test]
fn a_directory_replica_checks_every_round() {
    let mut lease = Lease::new(
        AnyClient::from_url("/nonexistent-replica").expect("a plain path is a valid URL"),
        "/data/a.db",
        DEFAULT_LEASE_TTL,
    );
    assert_eq!(lease.recheck(), Duration::ZERO);
    lease.mode = Mode::ReadCheck;
    lease.written_at = Some(Instant::now());
    lease.confirmed_at = lease.written_at;
    assert!(lease.check_due(Instant::now()));
}
