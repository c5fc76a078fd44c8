//! Stopping blocking work whose async owner was dropped.
//!
//! A future that hands work to `spawn_blocking` cannot stop it by being dropped: the thread
//! runs on, and a tokio runtime's drop waits for it. Such work reads through a [`Stoppable`]
//! and its owner holds the token's `drop_guard()`, so that dropping the owner makes the next
//! read fail and the work end (removing its partial output as after any failure).

use std::io::{self, Read};

use tokio_util::sync::CancellationToken;

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
