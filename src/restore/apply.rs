//! Applying a chain: decoding every file into `<to>.tmp`, checking the checksum chain and
//! `PRAGMA integrity_check`.

#[allow(unused_imports)]
use super::*;

pub(super) fn apply_blocking(
    client: &AnyClient,
    plan: &[LtxFileInfo],
    opts: &RestoreOptions,
    handle: &tokio::runtime::Handle,
    started: Instant,
    window: Option<&Arc<DownloadWindow>>,
    progress: &Progress,
) -> Result<RestoreReport, RestoreError> {
    let last = plan
        .last()
        .ok_or_else(|| RestoreError::Inconsistent("empty restore plan".into()))?;
    let tmp = fsutil::tmp_path(&opts.to);
    if let Some(dir) = opts.to.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(RestoreError::io("create directory", dir))?;
    }
    let applying = Instant::now();
    // Around the page cache only when nothing reads the output back right away: the
    // integrity check reads every page, from the cache when the writes went through it.
    let direct = !opts.integrity_check;
    let written = write_tmp(client, plan, &tmp, handle, window, progress, direct);
    opts.phases.record(
        Phase::Apply,
        written.as_ref().map_or(0, |a| a.bytes),
        applying.elapsed(),
    );
    let result = written.and_then(|applied| {
        if opts.integrity_check {
            integrity_check(&tmp)?;
        }
        Ok(applied)
    });
    let applied = match result {
        Ok(a) => a,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
    };
    if opts.force {
        remove_wal_files(&opts.to)?;
    }
    fsutil::publish(&tmp, &opts.to).map_err(RestoreError::io("publish", &opts.to))?;
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
    })
}

pub(super) struct Applied {
    pub(super) page_size: u32,
    pub(super) commit: u32,
    pub(super) db_checksum: Option<u64>,
    /// Page bytes written to the output (phase stats).
    pub(super) bytes: u64,
}

pub(super) fn file_label(f: &LtxFileInfo) -> String {
    format!(
        "{}/{}",
        f.level,
        ltx::format_filename(f.min_txid, f.max_txid)
    )
}

/// Writes the database into `tmp`, newest file first, each page once; verifies everything
/// that can be verified without SQLite.
pub(super) fn write_tmp(
    client: &AnyClient,
    plan: &[LtxFileInfo],
    tmp: &Path,
    handle: &tokio::runtime::Handle,
    window: Option<&Arc<DownloadWindow>>,
    progress: &Progress,
    direct: bool,
) -> Result<Applied, RestoreError> {
    let _ = fs::remove_file(tmp);
    let mut out = OutputFile::create_new(tmp, direct).map_err(RestoreError::io("create", tmp))?;
    let mut written: Vec<u64> = Vec::new();
    let mut final_commit = 0u32;
    let mut page_size = 0u32;
    let mut sum = DbChecksum::default();
    let mut track_sum = false;
    let mut run = AlignedBuf::new(0);
    let mut bytes = 0u64;
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
                let body =
                    handle.block_on(client.open(info.level, info.min_txid, info.max_txid, 0))?;
                Box::new(SyncIoBridge::new_with_handle(body, handle.clone()))
            }
        };
        let mut dec = Decoder::new(reader).map_err(ltx_err)?;
        let h = *dec.header();
        if (h.min_txid, h.max_txid) != (info.min_txid, info.max_txid) {
            return Err(RestoreError::Inconsistent(format!(
                "replica file {label} holds TXIDs {}-{} (renamed or misplaced file)",
                h.min_txid, h.max_txid
            )));
        }
        if i == plan.len() - 1 {
            page_size = h.page_size;
            final_commit = h.commit;
            out.set_len(u64::from(final_commit) * u64::from(page_size))
                .map_err(RestoreError::io("size", tmp))?;
            written = vec![0u64; (final_commit as usize).div_ceil(64) + 1];
            let ps = page_size as usize;
            run = AlignedBuf::new((WRITE_RUN / ps).max(1) * ps);
            // Only the newest file's checksum is compared (below): without one, skip the sums.
            track_sum = h.has_checksums();
        } else if h.page_size != page_size {
            return Err(RestoreError::Inconsistent(format!(
                "replica file {label} has {}-byte pages, the rest of the chain {page_size}-byte pages \
                 (files from another database?)",
                h.page_size
            )));
        }
        // Pages are decoded straight into `run`; consecutive page numbers go out in one write.
        let ps = page_size as usize;
        let at = |pgno: u32| u64::from(pgno - 1) * u64::from(page_size);
        let (mut run_first, mut run_len) = (0u32, 0usize);
        loop {
            if run_len + ps > run.len() {
                out.write_all_at(&run[..run_len], at(run_first))
                    .map_err(RestoreError::io("write", tmp))?;
                run_len = 0;
            }
            let Some(pgno) = dec
                .next_page(&mut run[run_len..run_len + ps])
                .map_err(ltx_err)?
            else {
                break;
            };
            if pgno > final_commit {
                continue;
            }
            let (word, bit) = ((pgno / 64) as usize, 1u64 << (pgno % 64));
            if written[word] & bit != 0 {
                continue;
            }
            written[word] |= bit;
            if run_len > 0 && pgno != run_first + (run_len / ps) as u32 {
                out.write_all_at(&run[..run_len], at(run_first))
                    .map_err(RestoreError::io("write", tmp))?;
                run.copy_within(run_len..run_len + ps, 0);
                run_len = 0;
            }
            if run_len == 0 {
                run_first = pgno;
            }
            if track_sum {
                sum.toggle(page_checksum(pgno, &run[run_len..run_len + ps]));
            }
            run_len += ps;
            bytes += ps as u64;
        }
        if run_len > 0 {
            out.write_all_at(&run[..run_len], at(run_first))
                .map_err(RestoreError::io("write", tmp))?;
        }
        let trailer = dec.finish().map_err(ltx_err)?;
        progress.add(info.size);
        seen[i] = Some((h, trailer.post_apply_checksum));
    }
    let lock = lock_pgno(page_size);
    if let Some(missing) = (1..=final_commit)
        .find(|&p| p != lock && written[(p / 64) as usize] & (1u64 << (p % 64)) == 0)
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
    out.sync_all().map_err(RestoreError::io("fsync", tmp))?;
    Ok(Applied {
        page_size,
        commit: final_commit,
        db_checksum,
        bytes,
    })
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
