//! Applying a chain: decoding every file into `<to>.tmp`, checking the checksum chain and
//! `PRAGMA integrity_check`.

use super::pages::{BatchError, DecoderGone, Decoders};
use crate::restore::output::AlignedBuf;
use crate::util::stop::{Gate, Stoppable};
use tokio_util::sync::CancellationToken;

/// Most bytes of consecutive pages a direct write carries.
const WRITE_RUN: usize = 1024 * 1024;
#[allow(unused_imports)]
use super::*;

#[allow(clippy::too_many_arguments)]
pub(super) fn apply_blocking(
    client: &AnyClient,
    plan: &[LtxFileInfo],
    opts: &RestoreOptions,
    handle: &tokio::runtime::Handle,
    started: Instant,
    window: Option<&Arc<DownloadWindow>>,
    progress: &Progress,
    gate: &Gate,
) -> Result<RestoreReport, RestoreError> {
    let last = plan
        .last()
        .ok_or_else(|| RestoreError::Inconsistent("empty restore plan".into()))?;
    // Each new directory's entry fsynced in its parent: the restored file's own fsyncs do not
    // keep a directory made for it (a restore onto a new disk) through a power loss.
    if let Some(dir) = opts.to.parent().filter(|d| !d.as_os_str().is_empty()) {
        fsutil::create_dir_all_durable(dir).map_err(RestoreError::io("create directory", dir))?;
    }
    // Claimed until it is placed: another restore to this path is refused, not mixed in.
    let (tmp, claimed) = fsutil::claim_tmp(&opts.to).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock => RestoreError::Busy(opts.to.clone()),
        _ => RestoreError::io("create", &fsutil::tmp_path(&opts.to))(e),
    })?;
    // Around the page cache only when nothing reads the output back right away: the
    // integrity check reads every page, from the cache when the writes went through it.
    let out = OutputFile::new(claimed, &tmp, !opts.integrity_check);
    let applying = Instant::now();
    let threads = opts.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        usize::from,
    );
    let stop = gate.token();
    let written = write_tmp(
        client, plan, &out, &tmp, handle, window, progress, threads, stop,
    );
    opts.phases.record(
        Phase::Apply,
        written.as_ref().map_or(0, |a| a.bytes),
        applying.elapsed(),
    );
    let result = written.and_then(|applied| {
        tracing::debug!(
            ms = applying.elapsed().as_millis(),
            threads = applied.threads,
            "pages written"
        );
        let durable = || out.sync_all().map_err(RestoreError::io("fsync", &tmp));
        if !opts.integrity_check {
            return durable().map(|()| (applied, 0));
        }
        // The check reads the pages from the page cache while they go to disk.
        let checking = Instant::now();
        let connections = std::thread::scope(|s| {
            let Ok(syncing) = std::thread::Builder::new().spawn_scoped(s, durable) else {
                // No thread to spare: one after the other.
                return durable().and_then(|()| integrity_check(&tmp, threads, stop));
            };
            let checked = integrity_check(&tmp, threads, stop);
            if matches!(checked, Err(RestoreError::Cancelled)) {
                // Gone before the fsync ends (seconds for a large file): the stopped restore's
                // owner may not wait that long.
                let _ = fs::remove_file(&tmp);
            }
            let synced = syncing.join().unwrap_or_else(|_| {
                Err(RestoreError::Inconsistent(
                    "the fsync thread panicked".into(),
                ))
            });
            checked.and_then(|n| synced.map(|()| n))
        })?;
        tracing::debug!(
            ms = checking.elapsed().as_millis(),
            connections,
            "integrity check passed, output synced"
        );
        Ok((applied, connections))
    });
    // A stopped restore publishes nothing, whatever step the stop reached.
    let result = result.and_then(|r| {
        let published = gate.unless_stopped(|| place(&tmp, &opts.to, opts.force));
        published
            .unwrap_or(Err(RestoreError::Cancelled))
            .map(|()| r)
    });
    // The claim ends here, once the file is placed or removed.
    let _claim = out;
    let (applied, check_connections) = match result {
        Ok(a) => a,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
    };
    Ok(RestoreReport {
        db_path: opts.to.clone(),
        replica: client.location(),
        txid: last.max_txid.to_string(),
        files: plan.iter().map(PlannedFile::from).collect(),
        bytes: plan.iter().map(|f| f.size).sum(),
        page_size: applied.page_size,
        pages: applied.commit,
        db_checksum: applied.db_checksum.map(|c| format!("{c:016x}")),
        integrity_check: if opts.integrity_check {
            "ok"
        } else {
            "skipped"
        },
        duration_ms: started.elapsed().as_millis(),
        threads: applied.threads,
        check_connections,
    })
}

pub(super) struct Applied {
    pub(super) page_size: u32,
    pub(super) commit: u32,
    pub(super) db_checksum: Option<u64>,
    /// Page bytes written to the output (phase stats).
    pub(super) bytes: u64,
    /// Decoder threads that ran.
    pub(super) threads: usize,
}

pub(super) fn file_label(f: &LtxFileInfo) -> String {
    format!(
        "{}/{}",
        f.level,
        ltx::format_filename(f.min_txid, f.max_txid)
    )
}

/// Writes the database into `tmp`, newest file first, each page once; verifies everything
/// that can be verified without SQLite. Pages are decoded on `threads` threads
/// ([`Decoders`]) into `out`, the file at `tmp`, which is left unsynced.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_tmp(
    client: &AnyClient,
    plan: &[LtxFileInfo],
    out: &OutputFile,
    tmp: &Path,
    handle: &tokio::runtime::Handle,
    window: Option<&Arc<DownloadWindow>>,
    progress: &Progress,
    threads: usize,
    stop: &CancellationToken,
) -> Result<Applied, RestoreError> {
    // Decoder threads copy pages into the page cache in parallel; direct writes go out from
    // here in runs of `WRITE_RUN`, as several threads' smaller direct writes were slower.
    let threads_write = !out.is_direct();
    std::thread::scope(|scope| {
        let mut decoders = Decoders::spawn(scope, threads_write.then_some(out), threads)
            .map_err(RestoreError::io("start a decoder thread for", tmp))?;
        let mut w = Claims::default();
        let mut runs = Runs::default();
        let mut sum = DbChecksum::default();
        let mut track_sum = false;
        // (header, post-apply checksum) per plan position, to check the checksum chain afterwards.
        let mut seen: Vec<Option<(Header, u64)>> = vec![None; plan.len()];
        for (i, info) in plan.iter().enumerate().rev() {
            let label = file_label(info);
            let ltx_err = |source| RestoreError::Ltx {
                file: label.clone(),
                source,
            };
            let reader: Box<dyn std::io::Read + Send> = match window {
                Some(w) if !info.encrypted => Box::new(w.reader(i, info.size)),
                _ => {
                    let body = handle.block_on(client.open(
                        info.level,
                        info.min_txid,
                        info.max_txid,
                        0,
                    ))?;
                    Box::new(SyncIoBridge::new_with_handle(body, handle.clone()))
                }
            };
            let reader = Stoppable::new(reader, stop.clone());
            let mut dec = Decoder::new(reader).map_err(ltx_err)?;
            let h = *dec.header();
            if (h.min_txid, h.max_txid) != (info.min_txid, info.max_txid) {
                return Err(RestoreError::Inconsistent(format!(
                    "replica file {label} holds TXIDs {}-{} (renamed or misplaced file)",
                    h.min_txid, h.max_txid
                )));
            }
            if i == plan.len() - 1 {
                w.start(&h);
                if !threads_write {
                    runs.start(h.page_size);
                }
                out.set_len(u64::from(h.commit) * u64::from(h.page_size))
                    .map_err(RestoreError::io("size", tmp))?;
                // Only the newest file's checksum is compared (below): without one, skip the sums.
                track_sum = h.has_checksums();
            } else if h.page_size != w.page_size {
                return Err(RestoreError::Inconsistent(format!(
                    "replica file {label} has {}-byte pages, the rest of the chain {}-byte pages \
                     (files from another database?)",
                    h.page_size, w.page_size
                )));
            }
            let mut read_all = false;
            loop {
                if !read_all {
                    read_all = send_batches(&mut decoders, &mut dec, &mut w, track_sum, &ltx_err)?;
                }
                if decoders.in_flight() == 0 {
                    break;
                }
                let mut batch = decoders.recv().map_err(gone)?;
                batch.take_result().map_err(|e| match e {
                    BatchError::Decode(source) => ltx_err(source),
                    BatchError::Write(e) => RestoreError::io("write", tmp)(e),
                })?;
                for (frame, page, keep, page_sum) in batch.pages() {
                    dec.fold(frame, page);
                    if keep && track_sum {
                        sum.toggle(page_sum);
                    }
                    if keep && !threads_write {
                        runs.page(out, frame.pgno(), page)
                            .map_err(RestoreError::io("write", tmp))?;
                    }
                }
                decoders.recycle(batch);
            }
            runs.flush(out).map_err(RestoreError::io("write", tmp))?;
            let trailer = dec.finish().map_err(ltx_err)?;
            progress.add(info.size);
            seen[i] = Some((h, trailer.post_apply_checksum));
        }
        let (page_size, final_commit, bytes) = (w.page_size, w.final_commit, w.bytes);
        let lock = lock_pgno(page_size);
        if let Some(missing) = (1..=final_commit)
            .find(|&p| p != lock && w.written[(p / 64) as usize] & (1u64 << (p % 64)) == 0)
        {
            return Err(RestoreError::Inconsistent(format!(
                "page {missing} of {final_commit} is in no file of the chain (the chain does not start with a full snapshot)"
            )));
        }
        verify_checksum_chain(plan, &seen)?;
        let (last_header, last_post) = seen
            .last()
            .copied()
            .flatten()
            .ok_or_else(|| RestoreError::Inconsistent("empty plan".into()))?;
        let db_checksum = if last_header.has_checksums() {
            if sum.value() != last_post {
                return Err(RestoreError::Inconsistent(format!(
                    "rebuilt database checksum {:016x} differs from the source's {last_post:016x} at TXID {}",
                    sum.value(),
                    last_header.max_txid
                )));
            }
            Some(last_post)
        } else {
            None
        };
        Ok(Applied {
            page_size,
            commit: final_commit,
            db_checksum,
            bytes,
            threads: decoders.threads(),
        })
    })
}

/// Reads frames of `dec` into batches, claiming their pages, and sends them while the
/// decoders have room; true once the file's last frame was read.
fn send_batches<R: std::io::Read>(
    decoders: &mut Decoders,
    dec: &mut Decoder<R>,
    claims: &mut Claims,
    track_sum: bool,
    ltx_err: &dyn Fn(LtxError) -> RestoreError,
) -> Result<bool, RestoreError> {
    while decoders.has_room() {
        let mut batch = decoders.batch();
        batch.reset(claims.page_size as usize, track_sum);
        let mut read_all = false;
        while let Some(frame) = batch.next_slot() {
            if !dec.read_frame(frame).map_err(ltx_err)? {
                read_all = true;
                break;
            }
            let keep = claims.claim(frame.pgno());
            batch.push(keep);
        }
        if batch.is_empty() {
            decoders.recycle(batch);
        } else {
            decoders.send(batch).map_err(gone)?;
        }
        if read_all {
            return Ok(true);
        }
    }
    Ok(false)
}

fn gone(_: DecoderGone) -> RestoreError {
    RestoreError::Inconsistent("a page decoder thread stopped".into())
}

/// Which pages the apply writes: the first copy read of each page number up to the newest
/// file's commit (files are read newest first).
#[derive(Default)]
struct Claims {
    /// One bit per page number, set when the page's newest copy was claimed.
    written: Vec<u64>,
    final_commit: u32,
    page_size: u32,
    /// Page bytes claimed.
    bytes: u64,
}

impl Claims {
    /// Sizes the claims for the newest file's commit.
    fn start(&mut self, h: &Header) {
        self.page_size = h.page_size;
        self.final_commit = h.commit;
        self.written = vec![0u64; (h.commit as usize).div_ceil(64) + 1];
    }

    /// Whether the page read now is the newest copy of a page in the output, marking it
    /// written.
    fn claim(&mut self, pgno: u32) -> bool {
        if pgno > self.final_commit {
            return false;
        }
        let (word, bit) = ((pgno / 64) as usize, 1u64 << (pgno % 64));
        let fresh = self.written[word] & bit == 0;
        self.written[word] |= bit;
        if fresh {
            self.bytes += u64::from(self.page_size);
        }
        fresh
    }
}

/// Consecutive pages gathered into one aligned buffer, written at once.
#[derive(Default)]
struct Runs {
    buf: AlignedBuf,
    first: u32,
    len: usize,
    page_size: u32,
}

impl Runs {
    fn start(&mut self, page_size: u32) {
        let ps = page_size as usize;
        self.buf = AlignedBuf::new((WRITE_RUN / ps).max(1) * ps);
        self.page_size = page_size;
    }

    /// Adds a page, writing the run out first when the page does not follow it or it is full.
    fn page(&mut self, out: &OutputFile, pgno: u32, page: &[u8]) -> std::io::Result<()> {
        let ps = page.len();
        if self.len > 0
            && (pgno != self.first + (self.len / ps) as u32 || self.len + ps > self.buf.len())
        {
            self.flush(out)?;
        }
        if self.len == 0 {
            self.first = pgno;
        }
        self.buf[self.len..self.len + ps].copy_from_slice(page);
        self.len += ps;
        Ok(())
    }

    fn flush(&mut self, out: &OutputFile) -> std::io::Result<()> {
        if self.len > 0 {
            let at = u64::from(self.first - 1) * u64::from(self.page_size);
            out.write_all_at(&self.buf[..self.len], at)?;
            self.len = 0;
        }
        Ok(())
    }
}

/// Where consecutive files both carry checksums, the later's pre-apply checksum must be the
/// earlier's post-apply checksum.
pub(super) fn verify_checksum_chain(
    plan: &[LtxFileInfo],
    seen: &[Option<(Header, u64)>],
) -> Result<(), RestoreError> {
    for i in 1..plan.len() {
        let (Some((prev, prev_post)), Some((cur, _))) = (seen[i - 1], seen[i]) else {
            continue;
        };
        if prev.has_checksums() && cur.has_checksums() && !cur.is_snapshot()
            // Files overlapping the previous one start from an earlier state.
            && cur.min_txid.0 == prev.max_txid.0 + 1
            && cur.pre_apply_checksum != prev_post
        {
            return Err(RestoreError::Inconsistent(format!(
                "replica file {} does not continue from {}: pre-apply checksum {:016x}, previous post-apply {prev_post:016x}",
                file_label(&plan[i]),
                file_label(&plan[i - 1]),
                cur.pre_apply_checksum
            )));
        }
    }
    Ok(())
}
