//! A restore's download window: ranged GETs held in memory until the apply has read them.
//!
//! A restore fetches each remote LTX file in chunks with ranged GETs, several at a time, and
//! applies the files at the same time, reading each front to back through a
//! [`WindowReader`]. Chunks live in memory only between their download and their read: no
//! local copy of the compressed files is written and read back.
//!
//! Invariants:
//! - At most `slots` chunks are downloading or waiting to be read at once, so memory stays
//!   `slots x chunk size` whatever the size of the restore.
//! - Slots are taken in read order ([`DownloadWindow::reserve`] is awaited chunk after chunk),
//!   so the chunk a reader waits for always holds one or is about to: the window cannot fill
//!   up with later chunks while the next one to read waits for room.
//! - A reader returns only its own file's bytes, in order, and reports the end only at the
//!   file's known size; a chunk the reader will never ask for (a reader dropped early) gives
//!   its slot back at once.
//! - A failed download ([`DownloadWindow::fail`]) wakes every waiting reader with its reason;
//!   no reader waits forever on a download that stopped.

use std::collections::{BTreeMap, HashSet};
use std::io::{self, Read};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Room for one chunk in the window, held from before its download until it has been read.
pub struct Slot {
    /// Gives the room back when dropped.
    _permit: OwnedSemaphorePermit,
}

/// Chunks downloaded and not yet read, shared by the downloader and the apply's readers.
pub struct DownloadWindow {
    slots: Arc<Semaphore>,
    state: Mutex<State>,
    arrived: Condvar,
}

#[derive(Default)]
struct State {
    /// (file, offset) -> chunk.
    chunks: BTreeMap<(usize, u64), (Vec<u8>, Slot)>,
    /// Files whose reader is gone: their chunks are dropped on arrival.
    abandoned: HashSet<usize>,
    /// Buffers of chunks already read, reused so that a restore touches fresh memory only
    /// for its first `slots` chunks.
    spare: Vec<Vec<u8>>,
    failed: Option<String>,
}

impl DownloadWindow {
    /// A window of `slots` chunks (at least one).
    pub fn new(slots: usize) -> Arc<DownloadWindow> {
        Arc::new(DownloadWindow {
            slots: Arc::new(Semaphore::new(slots.max(1))),
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
        })
    }

    /// Waits for room for the next chunk in read order.
    pub async fn reserve(&self) -> Slot {
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the window never closes its semaphore");
        Slot { _permit: permit }
    }

    /// A buffer for a chunk's bytes (a spare one when there is one).
    pub fn buffer(&self) -> Vec<u8> {
        self.lock().spare.pop().unwrap_or_default()
    }

    /// Bytes `[at, at + data.len())` of `file` have arrived.
    pub fn arrive(&self, file: usize, at: u64, data: Vec<u8>, slot: Slot) {
        let mut s = self.lock();
        if s.abandoned.contains(&file) {
            s.spare.push(data);
            return;
        }
        s.chunks.insert((file, at), (data, slot));
        drop(s);
        self.arrived.notify_all();
    }

    /// The download failed: readers get `reason` instead of waiting.
    pub fn fail(&self, reason: &str) {
        self.lock().failed.get_or_insert_with(|| reason.to_string());
        self.arrived.notify_all();
    }

    /// A reader of `file`, `size` bytes long.
    pub fn reader(self: &Arc<Self>, file: usize, size: u64) -> WindowReader {
        WindowReader {
            window: self.clone(),
            file,
            size,
            pos: 0,
            current: None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state whole before anything can panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until the chunk of `file` that starts at `at` has arrived, and takes it.
    fn take(&self, file: usize, at: u64) -> io::Result<(Vec<u8>, Slot)> {
        let mut s = self.lock();
        loop {
            if let Some(chunk) = s.chunks.remove(&(file, at)) {
                return Ok(chunk);
            }
            if let Some(why) = &s.failed {
                return Err(io::Error::other(format!("download failed: {why}")));
            }
            s = self.arrived.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Gives a read chunk's buffer back (its slot is freed by the caller dropping it).
    fn recycle(&self, data: Vec<u8>) {
        self.lock().spare.push(data);
    }

    /// `file` will not be read any further: free what it holds, now and on arrival.
    fn abandon(&self, file: usize) {
        let mut s = self.lock();
        s.abandoned.insert(file);
        let keys: Vec<_> = s
            .chunks
            .range((file, 0)..=(file, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some((data, _slot)) = s.chunks.remove(&k) {
                s.spare.push(data);
            }
        }
    }
}

/// Reads one file of the window front to back, blocking until its bytes have arrived.
pub struct WindowReader {
    window: Arc<DownloadWindow>,
    file: usize,
    size: u64,
    /// File offset of the next byte to return.
    pos: u64,
    /// The chunk being read: its bytes, the offset of the next unread one in it, its slot.
    current: Option<(Vec<u8>, usize, Slot)>,
}

impl Read for WindowReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.current.is_none() {
            if self.pos >= self.size {
                return Ok(0);
            }
            let (data, slot) = self.window.take(self.file, self.pos)?;
            if data.is_empty() {
                return Err(io::Error::other(format!(
                    "empty chunk at byte {} of {}",
                    self.pos, self.size
                )));
            }
            self.current = Some((data, 0, slot));
        }
        let (data, used, _) = self
            .current
            .as_mut()
            .expect("a chunk was taken above when none was current");
        let n = buf.len().min(data.len() - *used);
        buf[..n].copy_from_slice(&data[*used..*used + n]);
        *used += n;
        self.pos += n as u64;
        let read_through = *used == data.len();
        if read_through {
            // Read through: its room goes to the next chunk right away.
            self.release();
        }
        Ok(n)
    }
}

impl WindowReader {
    fn release(&mut self) {
        if let Some((data, _, slot)) = self.current.take() {
            drop(slot);
            self.window.recycle(data);
        }
    }
}

impl Drop for WindowReader {
    fn drop(&mut self) {
        self.release();
        if self.pos < self.size {
            self.window.abandon(self.file);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn reader_waits_for_each_chunk_in_order_and_ends_at_the_size() {
        let rt = rt();
        let w = DownloadWindow::new(4);
        let data: Vec<u8> = (0..100u8).collect();
        let r = w.clone();
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            r.reader(0, 100).read_to_end(&mut out).unwrap();
            out
        });
        // Out of order: the second chunk first.
        let (a, b) = rt.block_on(async { (w.reserve().await, w.reserve().await) });
        w.arrive(0, 50, data[50..].to_vec(), b);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!reader.is_finished(), "read past a missing chunk");
        w.arrive(0, 0, data[..50].to_vec(), a);
        assert_eq!(reader.join().unwrap(), data);
        // Both slots came back once read.
        assert_eq!(w.slots.available_permits(), 4);
    }

    #[test]
    fn slots_bound_the_window_until_chunks_are_read() {
        let rt = rt();
        let w = DownloadWindow::new(2);
        let (a, b) = rt.block_on(async { (w.reserve().await, w.reserve().await) });
        let third = rt
            .block_on(async { tokio::time::timeout(Duration::from_millis(50), w.reserve()).await });
        assert!(
            third.is_err(),
            "a third chunk found room in a window of two"
        );
        w.arrive(0, 0, vec![1; 10], a);
        w.arrive(0, 10, vec![2; 10], b);
        let mut r = w.reader(0, 20);
        let mut buf = [0u8; 6];
        r.read_exact(&mut buf).unwrap();
        assert_eq!(
            w.slots.available_permits(),
            0,
            "a chunk half read lost its room"
        );
        r.read_exact(&mut buf[..4]).unwrap();
        assert_eq!(
            w.slots.available_permits(),
            1,
            "a chunk read through kept its room"
        );
        assert!(
            rt.block_on(async {
                tokio::time::timeout(Duration::from_millis(50), w.reserve()).await
            })
            .is_ok()
        );
        r.read_exact(&mut buf[..4]).unwrap();
        assert_eq!(&buf[..4], &[2; 4]);
    }

    #[test]
    fn a_dropped_reader_frees_its_chunks_and_failure_wakes_readers() {
        let rt = rt();
        let w = DownloadWindow::new(2);
        let (a, b) = rt.block_on(async { (w.reserve().await, w.reserve().await) });
        w.arrive(0, 0, vec![1; 10], a);
        drop(w.reader(0, 20));
        assert_eq!(w.slots.available_permits(), 1);
        w.arrive(0, 10, vec![1; 10], b);
        assert_eq!(
            w.slots.available_permits(),
            2,
            "a late chunk of an abandoned file"
        );

        let r = w.clone();
        let waiter = std::thread::spawn(move || r.reader(1, 10).read(&mut [0u8; 4]));
        std::thread::sleep(Duration::from_millis(50));
        w.fail("GET 500");
        let err = waiter.join().unwrap().unwrap_err();
        assert!(err.to_string().contains("GET 500"), "{err}");
    }
}
