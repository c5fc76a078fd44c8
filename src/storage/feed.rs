//! Large segments offered to replicas while they are still being staged, so that an S3
//! replica can upload the parts of a snapshot during its encoding instead of after it.
//!
//! The monitor announces a [`GrowingSegment`] on the database's [`SegmentFeed`], writes the
//! staging `.tmp` file through a [`Tap`] that reports how many bytes reached the file, and ends
//! it as published or failed. A replica that follows the feed may upload the bytes written so
//! far as parts of a multipart upload, but completes it only once the segment is published.
//!
//! Invariants:
//! - Bytes below the reported length are final: the LTX encoder only appends, and the `.tmp`
//!   file is renamed, never rewritten.
//! - [`Progress::Published`] is set only after the segment is durable and renamed into place
//!   (the staging invariant), so an object completed from it holds exactly a published segment.
//! - Every other end is [`Progress::Failed`], set by the [`Announcement`] guard when dropped
//!   unpublished (an error, or a panic, of the build): a follower then aborts its upload.
//! - The feed costs nothing without followers: the monitor announces only when a replica
//!   subscribed.
//! - A follower drops each range it uploaded from the page cache
//!   ([`GrowingSegment::release`]): a snapshot's staged copy then holds memory only for bytes
//!   not yet uploaded, instead of the whole segment until the kernel reclaims it. The pages
//!   freed go straight back to whoever writes next (the local S3 server, in the benchmark).

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use crate::ltx::TxId;

/// How far a growing segment got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// This many bytes are in the file and final.
    Writing(u64),
    /// Published (durable and renamed) with this length.
    Published(u64),
    /// The build failed or was abandoned: the bytes must not be used.
    Failed,
}

/// Reports are sent every this many bytes (and at the end), not on every write.
const REPORT_EVERY: u64 = 1024 * 1024;

/// Whether followers can read growing segments here: [`GrowingSegment::reopen_path`] needs
/// `/proc/self/fd` (Linux with procfs mounted, as in any container).
pub fn supported() -> bool {
    std::path::Path::new("/proc/self/fd").is_dir()
}

/// A segment being written to staging.
#[derive(Debug)]
pub struct GrowingSegment {
    /// Its TXID (a full segment: min = max).
    pub txid: TxId,
    /// Its header timestamp, ms since the epoch.
    pub timestamp_ms: i64,
    file: File,
    progress: watch::Sender<Progress>,
}

impl GrowingSegment {
    /// A segment `txid` read through `file`, a descriptor of its `.tmp` file (it stays valid
    /// across the rename).
    pub fn new(txid: TxId, timestamp_ms: i64, file: File) -> Arc<GrowingSegment> {
        Arc::new(GrowingSegment {
            txid,
            timestamp_ms,
            file,
            progress: watch::channel(Progress::Writing(0)).0,
        })
    }

    /// Follows the progress.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// A path that opens the segment's file while this value lives, before and after its
    /// rename: the descriptor's link in `/proc/self/fd` (Linux). Readers that reopen the file
    /// (a retried request body) need a path, and the staged name changes under them.
    pub fn reopen_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// Drops from the page cache the `len` bytes at `offset`, which a follower has uploaded
    /// (blocking: the range is written back first). See [`crate::util::fsutil::evict_range`].
    pub fn release(&self, offset: u64, len: u64) {
        crate::util::fsutil::evict_range(&self.file, offset, len);
    }

    /// Reports `n` bytes written (never moves backwards, never after the end).
    pub fn wrote(&self, n: u64) {
        self.progress.send_if_modified(|p| match p {
            Progress::Writing(old) if *old < n => {
                *old = n;
                true
            }
            _ => false,
        });
    }

    /// Ends the segment as published with `len` bytes.
    pub fn published(&self, len: u64) {
        self.progress.send_replace(Progress::Published(len));
    }

    /// Ends the segment as failed (no effect once published).
    pub fn failed(&self) {
        self.progress.send_if_modified(|p| {
            let writing = matches!(p, Progress::Writing(_));
            if writing {
                *p = Progress::Failed;
            }
            writing
        });
    }
}

/// The announcements of one database (the monitor holds the sender).
#[derive(Debug)]
pub struct SegmentFeed {
    tx: watch::Sender<Option<Arc<GrowingSegment>>>,
}

impl Default for SegmentFeed {
    fn default() -> Self {
        SegmentFeed {
            tx: watch::channel(None).0,
        }
    }
}

impl SegmentFeed {
    /// A follower's receiver.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<GrowingSegment>>> {
        self.tx.subscribe()
    }

    /// Whether any replica follows the feed.
    pub fn followed(&self) -> bool {
        self.tx.receiver_count() > 0
    }

    /// Announces `seg`; the guard ends it as failed unless [`Announcement::published`] is
    /// called, and withdraws it from the feed either way.
    pub fn announce(&self, seg: Arc<GrowingSegment>) -> Announcement {
        self.tx.send_replace(Some(seg.clone()));
        Announcement {
            tx: self.tx.clone(),
            seg,
        }
    }
}

/// An announced segment; see [`SegmentFeed::announce`].
pub struct Announcement {
    tx: watch::Sender<Option<Arc<GrowingSegment>>>,
    seg: Arc<GrowingSegment>,
}

impl Announcement {
    /// The segment.
    pub fn segment(&self) -> &Arc<GrowingSegment> {
        &self.seg
    }

    /// Ends the segment as published with `len` bytes.
    pub fn published(self, len: u64) {
        self.seg.published(len);
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        self.seg.failed();
        self.tx.send_replace(None);
    }
}

/// A writer that reports to a growing segment how many bytes went through it.
pub struct Tap<W> {
    inner: W,
    seg: Option<Arc<GrowingSegment>>,
    written: u64,
    reported: u64,
}

impl<W> Tap<W> {
    /// Wraps `inner`, reporting to `seg` if any.
    pub fn new(inner: W, seg: Option<Arc<GrowingSegment>>) -> Tap<W> {
        Tap {
            inner,
            seg,
            written: 0,
            reported: 0,
        }
    }

    /// The wrapped writer.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for Tap<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        if let Some(seg) = &self.seg
            && self.written - self.reported >= REPORT_EVERY
        {
            seg.wrote(self.written);
            self.reported = self.written;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()?;
        if let Some(seg) = &self.seg {
            seg.wrote(self.written);
            self.reported = self.written;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tap_reports_final_bytes_and_the_guard_ends_the_segment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg.tmp");
        let file = File::create(&path).unwrap();
        let feed = SegmentFeed::default();
        let mut rx = feed.subscribe();
        assert!(feed.followed());
        let seg = GrowingSegment::new(TxId(1), 5, File::open(&path).unwrap());
        let progress = seg.progress();
        {
            let ann = feed.announce(seg.clone());
            assert!(rx.borrow_and_update().is_some());
            let mut tap = Tap::new(file, Some(ann.segment().clone()));
            tap.write_all(&vec![7u8; REPORT_EVERY as usize + 10])
                .unwrap();
            assert_eq!(*progress.borrow(), Progress::Writing(REPORT_EVERY + 10));
            tap.write_all(b"abc").unwrap();
            // Below the reporting step: not reported until a flush.
            assert_eq!(*progress.borrow(), Progress::Writing(REPORT_EVERY + 10));
            tap.flush().unwrap();
            assert_eq!(*progress.borrow(), Progress::Writing(REPORT_EVERY + 13));
            // The reported bytes are in the file, read through the reopen path, which
            // outlives a rename of the file.
            std::fs::rename(&path, dir.path().join("seg")).unwrap();
            let reopened = std::fs::read(seg.reopen_path()).unwrap();
            assert_eq!(reopened.len() as u64, REPORT_EVERY + 13);
            assert_eq!(&reopened[REPORT_EVERY as usize + 10..], b"abc");
            // Dropped unpublished: failed, and withdrawn.
        }
        assert_eq!(*progress.borrow(), Progress::Failed);
        assert!(rx.borrow_and_update().is_none());

        let seg = GrowingSegment::new(TxId(2), 5, File::open(dir.path().join("seg")).unwrap());
        let progress = seg.progress();
        feed.announce(seg.clone()).published(42);
        assert_eq!(*progress.borrow(), Progress::Published(42));
        // A late failure cannot undo the publication.
        seg.failed();
        assert_eq!(*progress.borrow(), Progress::Published(42));
    }
}
