//! Wall-clock time as the crate stores it: milliseconds since the Unix epoch.

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Milliseconds since the Unix epoch on a clock that the wall clock's steps do not move: the
/// wall clock's reading at the first call, advanced by the boot clock since. For how long
/// something has lasted (a problem's grace, how long a replica has been behind), where a
/// backward step of the wall clock (NTP, a restored VM) would otherwise delay a report by
/// the size of the step. Equal to [`now_ms`] unless the wall clock was stepped.
pub fn steady_ms() -> i64 {
    static ANCHOR: std::sync::OnceLock<(i64, std::time::Duration)> = std::sync::OnceLock::new();
    let (wall, boot) = *ANCHOR.get_or_init(|| (now_ms(), since_boot()));
    let elapsed = since_boot().saturating_sub(boot);
    wall.saturating_add(i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
}

/// The [`steady_ms`] reading of the past wall-clock time `wall_ms`, by the two clocks' offset
/// now: exact for a time read recently, unless the wall clock was stepped in between, and
/// never later than now (after a backward step, a time from before it reads as now, not as
/// the future). A time of 0 or less (none) stays 0.
pub fn steady_of(wall_ms: i64) -> i64 {
    if wall_ms <= 0 {
        return 0;
    }
    let now = steady_ms();
    wall_ms
        .saturating_add(now.saturating_sub(now_ms()))
        .clamp(0, now)
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
