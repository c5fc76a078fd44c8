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
