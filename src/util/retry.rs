//! Exponential backoff with full jitter: one policy for the monitor, the uploads and clients.

use std::time::Duration;

use rand::RngExt;

/// Delays that double from `min` to `max`, each drawn uniformly from [d/2, d].
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A backoff starting at `min`, capped at `max`.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            current: min,
        }
    }

    /// The next delay (jittered), doubling the base for the following one.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = base / 2;
        half + Duration::from_nanos(rand::rng().random_range(0..=half.as_nanos().max(1) as u64))
    }

    /// Back to the minimum after a success.
    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_within_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let d: Vec<Duration> = (0..6).map(|_| b.next_delay()).collect();
        for (got, base) in d.iter().zip([1u64, 2, 4, 5, 5, 5]) {
            let base = Duration::from_secs(base);
            assert!(
                *got >= base / 2 && *got <= base + Duration::from_nanos(1),
                "{got:?} vs {base:?}"
            );
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_secs(1) + Duration::from_nanos(1));
    }
}
