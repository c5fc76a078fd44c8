//! The tick grid: when monitors tick.
//!
//! Every database ticks once per monitor interval, on one of `TICK_SLOTS` slots of that
//! interval, all slots counted from one epoch per process. Databases that share a slot share
//! the runtime's timer wake-up, and the [`crate::replicate::dormant`] checks a slot's dormant
//! databases at the very times their monitors would have ticked.

use std::time::Duration;

use rand::RngExt;

/// Slots per interval on the tick grid. Each slot costs a timer wake-up of the runtime (a
/// context switch or two, tens of microseconds in a VM) per interval, far more than an idle
/// tick (a few microseconds): at 400 idle databases, 50 slots cost twice the CPU of 10. Ten
/// still spreads busy databases' syncs over the interval.
pub(crate) const TICK_SLOTS: u32 = 10;

/// A database's tick times after the first: `epoch + phase + k * interval`, where `epoch` is
/// shared by every database of the process and `phase` is a random whole slot
/// (`interval / TICK_SLOTS`). Thousands of databases spread over the slots, and the databases
/// of one slot tick on the same timer wake-up: at 400 databases, one `epoll_wait` and one
/// worker wake-up serve 40 ticks. Ticks never drift off the grid, whatever a sync costs.
pub(crate) struct TickGrid {
    epoch: tokio::time::Instant,
    phase: Duration,
    interval: Duration,
}

static TICK_EPOCH: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();

/// Long waits (heartbeats, maintenance, lease refreshes: 10 s and more) end on whole seconds of
/// the tick grid's epoch: the idle wake-ups of hundreds of replica tasks then share the
/// runtime wake-ups of the monitors' first slot instead of each costing its own. A wait grows
/// by less than a second; shorter waits are left exact.
pub(crate) fn coarse_deadline(wait: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    if wait < Duration::from_secs(10) {
        return now + wait;
    }
    let epoch = *TICK_EPOCH.get_or_init(tokio::time::Instant::now);
    let at = (now + wait).duration_since(epoch);
    let whole = Duration::from_secs(at.as_secs() + u64::from(at.subsec_nanos() > 0));
    epoch + whole
}

impl TickGrid {
    /// A grid on a random slot.
    pub(crate) fn new(interval: Duration) -> TickGrid {
        TickGrid::on_slot(interval, rand::rng().random_range(0..TICK_SLOTS))
    }

    /// The grid of slot `slot` (`0..TICK_SLOTS`).
    pub(crate) fn on_slot(interval: Duration, slot: u32) -> TickGrid {
        let interval = interval.max(Duration::from_millis(1));
        TickGrid {
            epoch: *TICK_EPOCH.get_or_init(tokio::time::Instant::now),
            phase: interval / TICK_SLOTS * (slot % TICK_SLOTS),
            interval,
        }
    }

    /// Which slot of the interval this grid ticks on.
    pub(crate) fn slot(&self) -> u32 {
        let slot = (self.interval / TICK_SLOTS).as_nanos().max(1);
        u32::try_from(self.phase.as_nanos() / slot).unwrap_or(0)
    }

    /// The first grid time strictly after `t`.
    pub(crate) fn after(&self, t: tokio::time::Instant) -> tokio::time::Instant {
        let base = self.epoch + self.phase;
        if t < base {
            return base;
        }
        let period = self.interval.as_nanos();
        let ahead = ((t - base).as_nanos() / period + 1) * period;
        base + Duration::from_nanos(u64::try_from(ahead).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tick_grid_times_are_strictly_later_on_the_shared_grid() {
        let interval = Duration::from_millis(1000);
        let slot = interval / TICK_SLOTS;
        let grids: Vec<TickGrid> = (0..200).map(|_| TickGrid::new(interval)).collect();
        let epoch = grids[0].epoch;
        let now = tokio::time::Instant::now();
        let mut phases = std::collections::BTreeSet::new();
        for g in &grids {
            assert_eq!(g.epoch, epoch, "one epoch per process");
            let off = (g.phase.as_nanos() % slot.as_nanos(), g.phase < interval);
            assert_eq!(off, (0, true), "phase {:?} is a whole slot", g.phase);
            phases.insert(g.phase);
            for t in [now, now + Duration::from_millis(1), now + interval * 3] {
                let next = g.after(t);
                assert!(next > t && next <= t + interval, "{next:?} after {t:?}");
                let since = (next - epoch - g.phase).as_nanos();
                assert_eq!(since % interval.as_nanos(), 0, "on the grid");
                assert_eq!(g.after(next - Duration::from_nanos(1)), next);
            }
        }
        // Long waits end on whole seconds of the epoch, less than a second late; short ones
        // are exact.
        for secs in [10.0, 30.0, 59.999, 300.5] {
            let wait = Duration::from_secs_f64(secs);
            let before = tokio::time::Instant::now();
            let d = coarse_deadline(wait);
            assert!(
                d >= before + wait
                    && d < tokio::time::Instant::now() + wait + Duration::from_secs(1)
            );
            assert_eq!((d - epoch).subsec_nanos(), 0, "{secs} s: on a whole second");
        }
        let before = tokio::time::Instant::now();
        let short = coarse_deadline(Duration::from_millis(50));
        assert!(
            short >= before + Duration::from_millis(50)
                && short < before + Duration::from_millis(60)
        );
        // 200 databases over 10 slots: every slot used (a miss has odds of 0.9^200).
        assert_eq!(phases.len(), TICK_SLOTS as usize, "{phases:?}");
    }
}
