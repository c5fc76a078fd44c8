//! Wall-clock time as the crate stores it: milliseconds since the Unix epoch.

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Time since boot, suspended time included (`CLOCK_BOOTTIME`): a host or VM that slept
/// counts the sleep, where [`std::time::Instant`] (`CLOCK_MONOTONIC`) does not.
pub fn since_boot() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    std::time::Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}
