//! Whether one database or one replica is protected right now, and if not, why.
//!
//! The task that owns a database (its monitor) or a replica (its upload task) is the only
//! writer of its cell; `/readyz`, `/status`, the metrics, systemd's STATUS and the shutdown
//! report read it. A problem is logged at ERROR by the owner when it starts and at INFO when
//! it ends ([`HealthCell::fail`] and [`HealthCell::recover`] say when).
//!
//! Invariant: a cell is "protected" only while its owner has evidence of it (a completed
//! sync, a completed upload round); any failure it cannot heal on the spot sets a problem
//! first, so no reader ever sees "fine" for a database or replica that is not.

use std::sync::Mutex;

/// Why something is not protected, since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// One line, for people: what is wrong and, where known, what to do.
    pub reason: String,
    /// When it started, ms since the Unix epoch.
    pub since_ms: i64,
}

/// The protection state of one database or replica.
#[derive(Debug, Default)]
pub struct HealthCell {
    problem: Mutex<Option<Problem>>,
}

impl HealthCell {
    /// Records `reason`; returns true when this starts a problem (the owner logs it then).
    pub fn fail(&self, reason: impl Into<String>) -> bool {
        let reason = reason.into();
        let mut p = self.problem.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *p {
            Some(old) => {
                old.reason = reason;
                false
            }
            None => {
                *p = Some(Problem {
                    reason,
                    since_ms: crate::metrics::now_ms(),
                });
                true
            }
        }
    }

    /// Clears the problem; returns it when there was one (the owner logs the recovery).
    pub fn recover(&self) -> Option<Problem> {
        self.problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// The current problem, if any.
    pub fn problem(&self) -> Option<Problem> {
        self.problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// True while no problem is recorded.
    pub fn is_ok(&self) -> bool {
        self.problem().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_starts_once_and_ends_once() {
        let h = HealthCell::default();
        assert!(h.is_ok());
        assert!(h.fail("disk full"));
        assert!(
            !h.fail("still full"),
            "the same streak does not start twice"
        );
        assert_eq!(h.problem().map(|p| p.reason), Some("still full".into()));
        assert_eq!(h.recover().map(|p| p.reason), Some("still full".into()));
        assert!(h.recover().is_none());
        assert!(h.is_ok());
    }
}
