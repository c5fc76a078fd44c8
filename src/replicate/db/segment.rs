//! Cutting a segment: headers, incremental and full segments, writing and publishing one into
//! staging, and the position it advances.

use super::connection::same_generation;
use super::encode::{PARALLEL_MIN_PAGES, PageSrc, encode_parallel, encode_workers, full_page_list};
#[allow(unused_imports)]
use super::*;

impl Db {
    /// Writes a segment with the pages of `scan` whose newest frame is at or after `from`
    /// (`changed`), plus pages the database grew by that no frame carries.
    pub(super) fn write_incremental(
        &mut self,
        f: &File,
        scan: &wal::WalScan,
        from: u64,
        changed: impl Fn(u64) -> bool,
    ) -> Result<bool, DbError> {
        let old_commit = self.commit;
        let commit = self.current_commit(Some(scan))?;
        let ps = self.page_size();
        let lock = lock_pgno(ps);
        let mut pages: Vec<(u32, PageSrc)> = scan
            .pages
            .iter()
            .filter(|(_, off)| changed(**off))
            .map(|(p, off)| (*p, PageSrc::wal(*off, ps)))
            .collect();
        if commit > old_commit {
            let growth =
                (old_commit + 1..=commit).filter(|p| *p != lock && !scan.pages.contains_key(p));
            pages.extend(growth.map(|p| (p, PageSrc::DB_FILE)));
            pages.sort_by_key(|(p, _)| *p);
        }
        if pages.is_empty() && commit == self.commit {
            self.mark = Some(WalMark {
                salt1: scan.header.salt1,
                salt2: scan.header.salt2,
                offset: scan.end_offset,
            });
            return Ok(false);
        }
        let header = self.next_header(commit, from, scan.end_offset - from, &scan.header);
        self.write_segment(header, Some(f), &pages, false)?;
        self.mark = Some(WalMark {
            salt1: scan.header.salt1,
            salt2: scan.header.salt2,
            offset: scan.end_offset,
        });
        Ok(true)
    }

    /// Writes a segment holding every page of the database, at the next TXID.
    pub(super) fn write_full(
        &mut self,
        wal_file: Option<&File>,
        header: Option<WalHeader>,
        reason: &str,
    ) -> Result<bool, DbError> {
        let scan = match (wal_file, header) {
            (Some(f), Some(_)) => wal::scan(f, WAL_HEADER_SIZE, u64::MAX)?,
            _ => None,
        };
        let commit = self.current_commit(scan.as_ref())?;
        if commit == 0 {
            return Ok(false);
        }
        tracing::info!(db = %self.path.display(), txid = %TxId(self.pos.0 + 1), reason, pages = commit, "writing a full segment");
        let pages = full_page_list(commit, self.page_size(), scan.as_ref());
        let (wal_off, wal_size, wh) = match &scan {
            Some(s) => (
                WAL_HEADER_SIZE,
                s.end_offset - WAL_HEADER_SIZE,
                Some(s.header),
            ),
            None => (0, 0, None),
        };
        let mut h = match &wh {
            Some(wh) => self.next_header(commit, wal_off, wal_size, wh),
            None => self.next_header_no_wal(commit),
        };
        if h.wal_size == 0 {
            // No frame was copied: record no WAL position (a header rule of the format).
            (h.wal_offset, h.wal_salt1, h.wal_salt2) = (0, 0, 0);
        }
        self.write_segment(h, wal_file, &pages, true)?;
        // Whatever forced a full segment is settled by this one.
        self.remote_tip.full_reason = None;
        self.stats.full_segments.fetch_add(1, Ordering::Relaxed);
        self.mark = scan.as_ref().map(|s| WalMark {
            salt1: s.header.salt1,
            salt2: s.header.salt2,
            offset: s.end_offset,
        });
        self.continuous = true;
        // The mark is the current generation's end: nothing of an earlier one is pending.
        self.after_yield = false;
        self.next_gen_follows = false;
        self.yield_seal_to = None;
        Ok(true)
    }

    pub(super) fn next_header(
        &self,
        commit: u32,
        wal_offset: u64,
        wal_size: u64,
        wh: &WalHeader,
    ) -> Header {
        let mut h = self.next_header_no_wal(commit);
        if wal_size > 0 {
            h.wal_offset = wal_offset as i64;
            h.wal_size = wal_size as i64;
            h.wal_salt1 = wh.salt1;
            h.wal_salt2 = wh.salt2;
        }
        h
    }

    pub(super) fn next_header_no_wal(&self, commit: u32) -> Header {
        let txid = TxId(self.pos.0 + 1);
        let pre = match (self.checksums, txid.0) {
            (false, _) | (_, 1) => 0,
            // An unknown predecessor (a Litestream-written tip) still needs a flagged value.
            (true, _) if self.post == 0 => CHECKSUM_FLAG,
            (true, _) => self.post,
        };
        Header {
            flags: if self.checksums {
                0
            } else {
                HEADER_FLAG_NO_CHECKSUM
            },
            page_size: self.page_size(),
            commit,
            min_txid: txid,
            max_txid: txid,
            timestamp: now_ms(),
            pre_apply_checksum: pre,
            ..Header::default()
        }
    }

    /// Encodes `pages` into a staged segment (tmp -> fsync -> rename -> fsync dir), updates
    /// the checksum table, and publishes the new position.
    pub(super) fn write_segment(
        &mut self,
        header: Header,
        wal_file: Option<&File>,
        pages: &[(u32, PageSrc)],
        full: bool,
    ) -> Result<(), DbError> {
        let staging = self
            .staging
            .as_ref()
            .ok_or_else(|| DbError::Unsupported("staging not open".into()))?;
        let dest = staging.path(header.max_txid);
        let tmp = fsutil::tmp_path(&dest);
        let file = File::create(&tmp).map_err(io_err("create", &tmp))?;
        let built = Instant::now();
        let announced = (full
            && self.feed.followed()
            && pages.len() as u64 * u64::from(header.page_size) >= STREAM_MIN_BYTES)
            .then(|| File::open(&tmp).ok())
            .flatten()
            .map(|r| {
                self.feed
                    .announce(GrowingSegment::new(header.max_txid, header.timestamp, r))
            });
        let tap = Tap::new(file, announced.as_ref().map(|a| a.segment().clone()));
        let mut enc = Encoder::new(tap, header, self.codec)?;
        let commit = header.commit;
        // The checksum table changes only once the segment is published: a failed write
        // (ENOSPC, EIO) must leave it exactly as it was, or the next segment's post-apply
        // checksum would be computed from a table missing pages.
        let mut sum = if full {
            DbChecksum::default()
        } else {
            self.sum
        };
        if self.checksums && !full {
            for p in (commit as usize + 1)..=self.table.len() {
                sum.toggle(self.table[p - 1]);
            }
        }
        let mut updates: Vec<(u32, u64)> =
            Vec::with_capacity(if self.checksums { pages.len() } else { 0 });
        let mut buf = std::mem::take(&mut self.page_buf);
        // Phase stats (three clock reads a page, no shared writes until the segment is done):
        // wal_read = read_page, compress = encode_page, encode = the rest of the build.
        let (mut read_nanos, mut compress_nanos) = (0u64, 0u64);
        let mut page_bytes = 0u64;
        let checksums = self.checksums;
        let table = &self.table;
        // Pages of one segment are distinct, so the old value is the table's.
        let mut account = |pgno: u32, c: u64| {
            let old = if full || pgno > commit {
                0
            } else {
                table.get(pgno as usize - 1).copied().unwrap_or(0)
            };
            if old != 0 {
                sum.toggle(old);
            }
            sum.toggle(c);
            updates.push((pgno, c));
        };
        let workers = encode_workers();
        let encoded = (|| {
            if pages.len() >= PARALLEL_MIN_PAGES && workers > 1 {
                let reader = self.page_reader(wal_file)?;
                let (r, c) = encode_parallel(
                    reader,
                    self.codec,
                    checksums,
                    pages,
                    workers,
                    |pgno, data, comp, c| {
                        enc.encode_compressed_page(pgno, comp, data)?;
                        page_bytes += data.len() as u64;
                        if checksums {
                            account(pgno, c);
                        }
                        Ok(())
                    },
                )?;
                read_nanos += r;
                compress_nanos += c;
            } else {
                for &(pgno, src) in pages {
                    let t0 = Instant::now();
                    self.read_page(wal_file, src, pgno, &mut buf)?;
                    let t1 = Instant::now();
                    enc.encode_page(pgno, &buf)?;
                    let t2 = Instant::now();
                    read_nanos += duration_nanos(t1 - t0);
                    compress_nanos += duration_nanos(t2 - t1);
                    page_bytes += buf.len() as u64;
                    if checksums {
                        account(pgno, page_checksum(pgno, &buf));
                    }
                }
            }
            Ok::<_, DbError>(())
        })();
        let from_wal = pages.iter().any(|(_, s)| s.in_wal());
        let result = encoded.and_then(|()| {
            if let (true, Some(f)) = (from_wal, wal_file) {
                same_generation(f, (header.wal_salt1, header.wal_salt2))?;
            }
            let post = if checksums { sum.value() } else { 0 };
            let (tap, _) = enc.finish(post)?;
            Ok::<_, DbError>((tap.into_inner(), post))
        });
        self.page_buf = buf;
        let build_nanos = duration_nanos(built.elapsed());
        self.phases
            .record_nanos(Phase::WalRead, page_bytes, read_nanos);
        self.phases
            .record_nanos(Phase::Compress, page_bytes, compress_nanos);
        let (file, post) = match result {
            Ok(v) => v,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let segment_bytes = file.metadata().map_or(0, |m| m.len());
        self.phases.record_nanos(
            Phase::Encode,
            segment_bytes,
            build_nanos.saturating_sub(read_nanos + compress_nanos),
        );
        let staged = Instant::now();
        if let Err(e) = file.sync_all().and_then(|()| fsutil::publish(&tmp, &dest)) {
            self.poisoned = Some(format!("fsync {}: {e}", dest.display()));
            return Err(io_err("publish", &dest)(e));
        }
        let stage_elapsed = staged.elapsed();
        self.phases
            .record(Phase::StageWrite, segment_bytes, stage_elapsed);
        if full {
            tracing::debug!(
                txid = %header.max_txid,
                bytes = segment_bytes,
                build_ms = build_nanos / 1_000_000,
                read_ms = read_nanos / 1_000_000,
                compress_ms = compress_nanos / 1_000_000,
                durable_ms = stage_elapsed.as_millis() as u64,
                "full segment staged"
            );
        }
        if self.checksums {
            let mut table = if full {
                Vec::new()
            } else {
                std::mem::take(&mut self.table)
            };
            table.resize(commit as usize, 0);
            for (pgno, c) in updates {
                table[pgno as usize - 1] = c;
            }
            self.table = table;
        }
        self.sum = sum;
        self.commit = commit;
        self.pos = header.max_txid;
        self.post = post;
        self.dirty_since_checkpoint = true;
        self.stats.segments.fetch_add(1, Ordering::Relaxed);
        if let Ok(meta) = std::fs::metadata(&dest) {
            self.stats
                .staging_bytes
                .fetch_add(meta.len(), Ordering::Relaxed);
        }
        self.publish(header.timestamp);
        if let Some(a) = announced {
            a.published(segment_bytes);
        }
        Ok(())
    }

    pub(super) fn publish(&self, timestamp_ms: i64) {
        self.stats.txid.store(self.pos.0, Ordering::Relaxed);
        self.pos_tx.send_replace(DbPos {
            txid: self.pos,
            timestamp_ms,
            steady_ms: crate::util::clock::steady_of(timestamp_ms),
        });
    }

    pub(super) fn refresh_fast_cache(&mut self) {
        let len = match std::fs::metadata(&self.wal_path) {
            Ok(meta) => Some(meta.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(0),
            Err(_) => None,
        };
        self.fast_tail = None;
        self.fast = match (self.mark, len) {
            (Some(m), Some(len)) if len == m.offset => Some((m.offset, m.salt1, m.salt2)),
            // Longer than our position: whatever lies past it is a stale tail as long as the
            // frame there is not of the current generation (see `unchanged_since_sync`).
            (Some(m), Some(len)) if len > m.offset && m.offset >= WAL_HEADER_SIZE => {
                self.fast_tail = Some(m.offset);
                Some((len, m.salt1, m.salt2))
            }
            // An empty or missing WAL while we hold the read transaction: any commit makes it
            // grow, so size 0 is a sound idle marker.
            (None, Some(0)) if self.continuous => Some((0, 0, 0)),
            _ => None,
        };
    }
}
