//! Stopping blocking work whose async owner was dropped.
//!
//! A future that hands work to `spawn_blocking` cannot stop it by being dropped: the thread
//! runs on, and a tokio runtime's drop waits for it. Such work reads through a [`Stoppable`]
//! and its owner holds a [`StopOnDrop`] of the work's [`Gate`], so that dropping the owner
//! makes the next read fail and the work end (removing its partial output as after any
//! failure). A read already blocked (a network read through
//! `SyncIoBridge`) ends only when it returns.
//!
//! Invariant: the work's last step, publishing its output, runs under [`Gate::unless_stopped`]
//! and a stop takes the same lock, so an output is never published after its owner stopped.

use std::io::{self, Read};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// A stop shared by an async owner and its blocking work.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    token: CancellationToken,
    publishing: Arc<Mutex<()>>,
}

impl Gate {
    /// The token the work checks (and [`Stoppable`] reads watch).
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// True once stopped.
    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Stops the work; waits for a publish under way to end.
    pub fn stop(&self) {
        let _publishing = self.publishing.lock().unwrap_or_else(|e| e.into_inner());
        self.token.cancel();
    }

    /// Runs `publish` unless the work was stopped (then `None`); a stop waits for it to end.
    pub fn unless_stopped<T>(&self, publish: impl FnOnce() -> T) -> Option<T> {
        let _publishing = self.publishing.lock().unwrap_or_else(|e| e.into_inner());
        (!self.token.is_cancelled()).then(publish)
    }

    /// A guard that stops the work when dropped.
    pub fn stop_on_drop(&self) -> StopOnDrop {
        StopOnDrop(self.clone())
    }
}

/// Stops its [`Gate`] when dropped.
#[derive(Debug)]
pub struct StopOnDrop(Gate);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// A reader that fails once `stop` is cancelled.
pub struct Stoppable<R> {
    inner: R,
    stop: CancellationToken,
}

impl<R> Stoppable<R> {
    /// Reads `inner` until `stop` is cancelled.
    pub fn new(inner: R, stop: CancellationToken) -> Stoppable<R> {
        Stoppable { inner, stop }
    }
}

impl<R: Read> Read for Stoppable<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.stop.is_cancelled() {
            return Err(io::Error::other("stopped: its owner was dropped"));
        }
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_published_after_a_stop() {
        let gate = Gate::default();
        assert_eq!(gate.unless_stopped(|| 1), Some(1));
        drop(gate.stop_on_drop());
        assert!(gate.is_stopped());
        assert_eq!(gate.unless_stopped(|| 2), None);
    }

    #[test]
    fn a_stop_waits_for_a_publish_under_way() {
        let gate = Gate::default();
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
        let publisher = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                gate.unless_stopped(|| {
                    entered_tx.send(()).expect("the test waits for this");
                    finish_rx.recv().expect("the test lets it finish");
                    "published"
                })
            })
        };
        entered_rx.recv().expect("the publish started");
        let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
        let stopper = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                gate.stop();
                stopped_tx.send(()).expect("the test waits for this");
            })
        };
        let waited = stopped_rx.recv_timeout(std::time::Duration::from_millis(200));
        assert!(waited.is_err(), "the stop returned while the publish ran");
        finish_tx.send(()).expect("the publisher waits for this");
        assert_eq!(publisher.join().expect("publisher"), Some("published"));
        stopper.join().expect("stopper");
        assert!(gate.is_stopped());
    }

    #[test]
    fn reads_until_stopped() {
        let stop = CancellationToken::new();
        let mut r = Stoppable::new(&b"abcdef"[..], stop.clone());
        let mut buf = [0u8; 3];
        assert_eq!(r.read(&mut buf).unwrap(), 3);
        drop(stop.clone().drop_guard());
        let err = r.read(&mut buf).unwrap_err();
        assert!(err.to_string().contains("stopped"), "{err}");
    }
}
