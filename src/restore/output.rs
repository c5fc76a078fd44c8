//! A restore's output file: written once in large runs of pages, then fsynced.
//!
//! When nothing reads the output back right away (a restore without its integrity check),
//! writes go around the page cache (`O_DIRECT`) where the file system accepts it: copying
//! every byte into the page cache was most of a 1 GiB restore's CPU time. Where direct
//! writes are refused the file falls back to ordinary buffered writes.
//!
//! Invariants:
//! - A direct write is issued only with a buffer, offset and length aligned to
//!   [`DIRECT_ALIGN`]; anything else goes through the buffered descriptor.
//! - A refused direct write (`EINVAL`, `EOPNOTSUPP`: file system or device) switches the file to
//!   buffered writes for good and repeats the same positional write there, so the fallback
//!   loses nothing.
//! - [`OutputFile::sync_all`] flushes the data of both kinds of write (one inode).

use std::fs::File;
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Alignment of direct writes: buffer address, file offset and length.
pub const DIRECT_ALIGN: usize = 4096;

/// The output of a restore; positional writes from several threads share it.
pub struct OutputFile {
    buffered: File,
    direct: Option<File>,
    /// Set for good by the first direct write the file system refused.
    direct_refused: AtomicBool,
}

impl OutputFile {
    /// The output in `buffered`, open read-write at `path` (claimed by
    /// [`crate::util::fsutil::claim_tmp`]); `direct`: try writing around the page cache.
    pub fn new(buffered: File, path: &Path, direct: bool) -> OutputFile {
        // Some file systems (tmpfs before Linux 6.6, for one) refuse O_DIRECT at open.
        let direct = direct
            .then(|| {
                File::options()
                    .write(true)
                    .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
                    .open(path)
                    .ok()
            })
            .flatten();
        OutputFile {
            buffered,
            direct,
            direct_refused: AtomicBool::new(false),
        }
    }

    /// Whether writes go around the page cache (until one is refused).
    pub fn is_direct(&self) -> bool {
        self.direct.is_some() && !self.direct_refused.load(Ordering::Relaxed)
    }

    /// Sets the file's size.
    pub fn set_len(&self, len: u64) -> io::Result<()> {
        self.buffered.set_len(len)
    }

    /// Writes all of `buf` at `offset`.
    pub fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if let Some(direct) = &self.direct
            && !self.direct_refused.load(Ordering::Relaxed)
            && is_aligned(buf, offset)
        {
            match direct.write_all_at(buf, offset) {
                Ok(()) => return Ok(()),
                Err(e) if refused(&e) => {
                    if !self.direct_refused.swap(true, Ordering::Relaxed) {
                        tracing::debug!(error = %e, "direct writes refused; writing through the page cache");
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.buffered.write_all_at(buf, offset)
    }

    /// Flushes data and metadata to stable storage.
    pub fn sync_all(&self) -> io::Result<()> {
        self.buffered.sync_all()
    }
}

/// A file system or device that does not take this direct write (as opposed to a failing
/// disk, which buffered writes would not fix either).
fn refused(e: &io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::INVAL, Errno::OPNOTSUPP]
        .iter()
        .any(|x| e.raw_os_error() == Some(x.raw_os_error()))
}

fn is_aligned(buf: &[u8], offset: u64) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
        && buf.len().is_multiple_of(DIRECT_ALIGN)
        && offset.is_multiple_of(DIRECT_ALIGN as u64)
}

/// A zeroed byte buffer whose start is aligned to [`DIRECT_ALIGN`].
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes.
    pub fn new(len: usize) -> AlignedBuf {
        let storage = vec![0u8; len + DIRECT_ALIGN];
        let start = storage.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf {
            storage,
            start,
            len,
        }
    }
}

impl Default for AlignedBuf {
    fn default() -> Self {
        AlignedBuf::new(0)
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_unaligned_writes_both_land() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let (path, file) = crate::util::fsutil::claim_tmp(&path).unwrap();
        let f = OutputFile::new(file, &path, true);
        f.set_len(3 * DIRECT_ALIGN as u64).unwrap();
        let mut a = AlignedBuf::new(2 * DIRECT_ALIGN);
        assert_eq!(a.as_ptr() as usize % DIRECT_ALIGN, 0);
        a.fill(7);
        f.write_all_at(&a, DIRECT_ALIGN as u64).unwrap();
        // Unaligned (offset and length): the buffered path.
        f.write_all_at(&[9u8; 100], 10).unwrap();
        f.sync_all().unwrap();
        let data = std::fs::read(&path).unwrap();
        assert_eq!(data.len(), 3 * DIRECT_ALIGN);
        assert!(data[..10].iter().all(|&b| b == 0));
        assert!(data[10..110].iter().all(|&b| b == 9));
        assert!(data[DIRECT_ALIGN..].iter().all(|&b| b == 7));
    }
}
