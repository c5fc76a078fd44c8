//! Reading pages (from a WAL frame or the database file) and encoding them into a segment,
//! in parallel batches for large segments.

#[allow(unused_imports)]
use super::*;
use crate::sqlite::wal::WAL_FRAME_HEADER_SIZE;
use std::num::NonZeroU32;

/// Where a page of a segment comes from: the database file, or the WAL frame with this
/// number (SQLite's, from 1). Four bytes, so that the page list of a full segment costs 8
/// bytes a page (80 MiB less than an offset would at 10 GiB).
#[derive(Clone, Copy)]
pub(super) struct PageSrc(Option<NonZeroU32>);

impl PageSrc {
    /// The database file.
    pub(super) const DB_FILE: PageSrc = PageSrc(None);

    /// The WAL frame whose page starts at `data_offset` (as [`wal::WalScan`] records it).
    pub(super) fn wal(data_offset: u64, page_size: u32) -> PageSrc {
        let frame = WAL_FRAME_HEADER_SIZE + u64::from(page_size);
        let index = (data_offset - WAL_HEADER_SIZE - WAL_FRAME_HEADER_SIZE) / frame;
        debug_assert_eq!(
            (data_offset - WAL_HEADER_SIZE - WAL_FRAME_HEADER_SIZE) % frame,
            0
        );
        let number = u32::try_from(index + 1).ok().and_then(NonZeroU32::new);
        PageSrc(Some(number.expect(
            "SQLite numbers WAL frames with a u32 (mxFrame), from 1",
        )))
    }

    /// Whether the page comes from the WAL.
    pub(super) fn in_wal(self) -> bool {
        self.0.is_some()
    }

    /// The offset of the page's bytes in the WAL, if it comes from there.
    pub(super) fn wal_offset(self, page_size: u32) -> Option<u64> {
        self.0.map(|n| {
            WAL_HEADER_SIZE
                + u64::from(n.get() - 1) * (WAL_FRAME_HEADER_SIZE + u64::from(page_size))
                + WAL_FRAME_HEADER_SIZE
        })
    }
}

/// Every page of a database of `commit` pages but the lock page, each from the WAL when the
/// scan holds it. Sized once: a 10 GiB database has 2.6 million entries, which doubling would
/// copy.
pub(super) fn full_page_list(
    commit: u32,
    page_size: u32,
    scan: Option<&wal::WalScan>,
) -> Vec<(u32, PageSrc)> {
    let lock = lock_pgno(page_size);
    let mut pages = Vec::with_capacity(commit as usize);
    pages.extend((1..=commit).filter(|p| *p != lock).map(|p| {
        let src = scan.and_then(|s| s.pages.get(&p).copied());
        (
            p,
            src.map_or(PageSrc::DB_FILE, |o| PageSrc::wal(o, page_size)),
        )
    }));
    pages
}

/// Reads pages of the current state: from a WAL frame or from the database file.
#[derive(Clone, Copy)]
pub(super) struct PageReader<'a> {
    pub(super) db_file: &'a File,
    pub(super) wal_file: Option<&'a File>,
    pub(super) page_size: u32,
    pub(super) path: &'a Path,
}

impl PageReader<'_> {
    pub(super) fn read(&self, src: PageSrc, pgno: u32, buf: &mut [u8]) -> Result<(), DbError> {
        match (src.wal_offset(self.page_size), self.wal_file) {
            (Some(off), Some(f)) => Ok(wal::read_page(f, off, buf)?),
            _ => self.read_db_pages(pgno, buf),
        }
    }

    /// Reads the database file's pages from `pgno` on into `buf` (whole pages).
    fn read_db_pages(&self, pgno: u32, buf: &mut [u8]) -> Result<(), DbError> {
        let at = u64::from(pgno - 1) * u64::from(self.page_size);
        // Past the end of the file SQLite reads zeros; so do we.
        let mut done = 0;
        while done < buf.len() {
            match self.db_file.read_at(&mut buf[done..], at + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err("read", self.path)(e)),
            }
        }
        buf[done..].fill(0);
        Ok(())
    }

    /// Reads the pages of `chunk` into consecutive page slots of `data`: a run of consecutive
    /// database-file pages in one read (a snapshot is almost all such runs, and a read per
    /// page cost a tenth of its CPU).
    fn read_chunk(&self, chunk: &[(u32, PageSrc)], data: &mut [u8]) -> Result<(), DbError> {
        let ps = self.page_size as usize;
        let mut k = 0;
        while k < chunk.len() {
            let (pgno, src) = chunk[k];
            let mut run = 1;
            if !src.in_wal() {
                while k + run < chunk.len()
                    && !chunk[k + run].1.in_wal()
                    && u64::from(chunk[k + run].0) == u64::from(pgno) + run as u64
                {
                    run += 1;
                }
            }
            let slots = &mut data[k * ps..(k + run) * ps];
            if run == 1 {
                self.read(src, pgno, slots)?;
            } else {
                self.read_db_pages(pgno, slots)?;
            }
            k += run;
        }
        Ok(())
    }
}

/// Pages per batch of the parallel segment encoder.
pub(super) const BATCH_PAGES: usize = 256;

/// Segments with fewer pages are encoded on the calling thread.
pub(super) const PARALLEL_MIN_PAGES: usize = 8 * BATCH_PAGES;

/// Pages read, compressed and checksummed by one encoder worker, in segment order. The
/// writer hands each batch back to its worker for the next chunk: a snapshot then touches a
/// few batches' worth of fresh memory instead of a megabyte per 256 pages.
#[derive(Default)]
pub(super) struct PageBatch {
    pub(super) data: Vec<u8>,
    pub(super) comp: Vec<u8>,
    pub(super) ends: Vec<usize>,
    pub(super) sums: Vec<u64>,
    pub(super) read_nanos: u64,
    pub(super) compress_nanos: u64,
}

/// Fills `b` with the pages of `chunk` (whatever it held before is replaced).
pub(super) fn encode_batch(
    reader: &PageReader<'_>,
    codec: Codec,
    checksums: bool,
    chunk: &[(u32, PageSrc)],
    b: &mut PageBatch,
) -> Result<(), DbError> {
    let ps = reader.page_size as usize;
    // Every page is read over its whole slot, so the old contents need no clearing.
    b.data.resize(chunk.len() * ps, 0);
    b.comp.clear();
    b.ends.clear();
    b.sums.clear();
    let t0 = Instant::now();
    reader.read_chunk(chunk, &mut b.data)?;
    let t1 = Instant::now();
    let mut scratch = Vec::new();
    for (k, &(pgno, _)) in chunk.iter().enumerate() {
        let buf = &b.data[k * ps..(k + 1) * ps];
        codec.compress(buf, &mut scratch)?;
        b.comp.extend_from_slice(&scratch);
        b.ends.push(b.comp.len());
        if checksums {
            b.sums.push(page_checksum(pgno, buf));
        }
    }
    b.read_nanos = duration_nanos(t1 - t0);
    b.compress_nanos = duration_nanos(t1.elapsed());
    Ok(())
}

/// Reads, compresses and checksums `pages` on `workers` threads, and hands each page to `sink`
/// in segment order on the calling thread (which owns the encoder and its file checksum).
/// Memory is bounded: each worker keeps at most three batches in flight. Returns the read and
/// compress nanoseconds summed over the workers.
pub(super) fn encode_parallel(
    reader: PageReader<'_>,
    codec: Codec,
    checksums: bool,
    pages: &[(u32, PageSrc)],
    workers: usize,
    mut sink: impl FnMut(u32, &[u8], &[u8], u64) -> Result<(), DbError>,
) -> Result<(u64, u64), DbError> {
    let ps = reader.page_size as usize;
    let chunks: Vec<&[(u32, PageSrc)]> = pages.chunks(BATCH_PAGES).collect();
    std::thread::scope(|scope| {
        let mut rxs = Vec::with_capacity(workers);
        let mut returns = Vec::with_capacity(workers);
        for w in 0..workers {
            let (tx, rx) = std::sync::mpsc::sync_channel(2);
            // Room for every batch of this worker in flight (2 queued, 1 being written).
            let (back_tx, back_rx) = std::sync::mpsc::sync_channel::<PageBatch>(3);
            rxs.push(rx);
            returns.push(back_tx);
            let chunks = &chunks;
            scope.spawn(move || {
                for chunk in chunks.iter().skip(w).step_by(workers) {
                    let mut b = back_rx.try_recv().unwrap_or_default();
                    let batch = encode_batch(&reader, codec, checksums, chunk, &mut b).map(|()| b);
                    let failed = batch.is_err();
                    // A closed channel means the writer stopped on an error: stop too.
                    if tx.send(batch).is_err() || failed {
                        break;
                    }
                }
            });
        }
        let (mut read_nanos, mut compress_nanos) = (0, 0);
        for (i, chunk) in chunks.iter().enumerate() {
            let batch = rxs[i % workers]
                .recv()
                .map_err(|_| DbError::Unsupported("a segment encoder thread stopped".into()))??;
            read_nanos += batch.read_nanos;
            compress_nanos += batch.compress_nanos;
            let mut start = 0;
            for (k, &(pgno, _)) in chunk.iter().enumerate() {
                let end = batch.ends[k];
                let sum = batch.sums.get(k).copied().unwrap_or(0);
                sink(
                    pgno,
                    &batch.data[k * ps..(k + 1) * ps],
                    &batch.comp[start..end],
                    sum,
                )?;
                start = end;
            }
            // Back to its worker; a full or closed return queue just drops it.
            let _ = returns[i % workers].try_send(batch);
        }
        Ok((read_nanos, compress_nanos))
    })
}

/// Threads for encoding a large segment: every core.
pub(super) fn encode_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
