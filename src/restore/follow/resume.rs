//! A resumed follower's check that its database is the replica's state at its TXID (see the
//! invariants of [`super`]): the checksum a clean stop records, compared with the first file
//! that continues the database, or with a file of the replica that ends at that TXID.

use std::fs;
use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

use super::{Follower, file_label, write_sidecar};
use crate::ltx::{self, Decoder, TxId};
use crate::restore::{self, RestoreError, sidecar};
use crate::storage::{LtxFileInfo, ReplicaClient, SNAPSHOT_LEVEL};

/// `<db>-checksum`: `<txid> <post-apply checksum> <replica>` at a follower's last clean stop:
/// the TXID and checksum in hex (`-` when the replica's files carry no checksums), then the
/// replica's location. A record of an older version has no location.
pub fn checksum_path(db: &Path) -> PathBuf {
    sidecar(db, "-checksum")
}

/// What a follower's last clean stop recorded about its database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    /// The post-apply checksum at the TXID, if the replica's files carried one.
    pub(super) post: Option<u64>,
    /// The replica it was followed from.
    pub(super) location: Option<String>,
}

impl Record {
    /// The record of `db` at `txid`, if it is of that TXID: any other (older, unreadable,
    /// absent) says nothing about the database.
    pub(super) fn read(db: &Path, txid: TxId) -> Option<Record> {
        Record::parse(&fs::read_to_string(checksum_path(db)).ok()?, txid)
    }

    fn parse(text: &str, txid: TxId) -> Option<Record> {
        let mut parts = text.trim_end_matches('\n').splitn(3, ' ');
        let at: TxId = parts.next()?.parse().ok()?;
        let post = match parts.next()? {
            "-" => None,
            hex => Some(u64::from_str_radix(hex, 16).ok()?),
        };
        let location = parts.next().filter(|l| !l.is_empty()).map(str::to_string);
        (at == txid).then_some(Record { post, location })
    }

    fn format(txid: TxId, post: Option<u64>, location: &str) -> String {
        match post {
            Some(post) => format!("{txid} {post:016x} {location}\n"),
            None => format!("{txid} - {location}\n"),
        }
    }
}

/// The checksum a restore proved its output to hold, if its files carried one.
pub(super) fn restored_checksum(report: Option<&restore::RestoreReport>) -> Option<u64> {
    u64::from_str_radix(report?.db_checksum.as_deref()?, 16).ok()
}

impl Follower {
    /// Before the first file after a resume with a recorded checksum: a file that starts
    /// right after the database's TXID and names its predecessor's checksum is checked as it
    /// is applied, and a snapshot replaces the state whole. Otherwise (the replica compacted
    /// its level 0 since the stop, or the file does not name its predecessor) the record is
    /// compared here with a listed file that ends at that TXID (its post-apply checksum); with
    /// none, the resume goes on unchecked, and the log says so. A stop ends it at once.
    pub(super) async fn check_resume(
        &mut self,
        files: &[LtxFileInfo],
        first: &LtxFileInfo,
        stop: &CancellationToken,
    ) -> Result<(), RestoreError> {
        if first.level == SNAPSHOT_LEVEL {
            self.checking_resume = false;
            return Ok(());
        }
        let Some(recorded) = self.last_post else {
            return self.unchecked(
                first,
                "the stop recorded no checksum: its files carried none",
            );
        };
        if first.min_txid.0 == self.txid.0 + 1 {
            let h = self.client.read_header(first).await?;
            if h.has_checksums() && h.pre_apply_checksum != ltx::CHECKSUM_FLAG {
                return Ok(());
            }
        }
        let mut ending: Vec<LtxFileInfo> = files
            .iter()
            .filter(|f| f.max_txid == self.txid)
            .cloned()
            .collect();
        if ending.is_empty() && files.iter().all(|f| f.level == 0) {
            // The listing stopped at level 0 (it extends the database): the others may hold one.
            for level in 1..=SNAPSHOT_LEVEL {
                let listed = self.client.list(level).await?;
                ending.extend(listed.into_iter().filter(|f| f.max_txid == self.txid));
            }
        }
        // A snapshot only when nothing smaller ends there: it may be the whole database.
        let Some(f) = ending
            .into_iter()
            .min_by_key(|f| (f.level == SNAPSHOT_LEVEL, f.size))
        else {
            return self.unchecked(first, "no file of the replica ends at the followed TXID");
        };
        let downloaded = tokio::select! {
            r = self.download(&f) => r,
            _ = stop.cancelled() => Ok(()),
        };
        if stop.is_cancelled() || downloaded.is_err() {
            let _ = tokio::fs::remove_file(&self.incoming).await;
            return downloaded;
        }
        let incoming = self.incoming.clone();
        let read = tokio::task::spawn_blocking(move || {
            let r = fs::File::open(&incoming)
                .map_err(ltx::LtxError::Io)
                .and_then(Decoder::new)
                .and_then(|d| {
                    let has = d.header().has_checksums();
                    d.finish().map(|t| has.then_some(t.post_apply_checksum))
                });
            let _ = fs::remove_file(&incoming);
            r
        })
        .await
        .map_err(|e| RestoreError::Inconsistent(format!("follow task failed: {e}")))?;
        let post = read.map_err(|source| RestoreError::Ltx {
            file: file_label(&f),
            source,
        })?;
        match post {
            Some(post) if post != ltx::CHECKSUM_FLAG && post != recorded => {
                Err(RestoreError::NotFollowed {
                    db: self.to.clone(),
                    txid: self.txid,
                    reason: format!(
                        "replica file {} ends there with checksum {post:016x}, the database's \
                         is {recorded:016x}",
                        file_label(&f)
                    ),
                })
            }
            Some(_) => {
                self.checking_resume = false;
                Ok(())
            }
            None => self.unchecked(
                first,
                "the file that ends at the followed TXID carries no checksums",
            ),
        }
    }

    /// Goes on without checking the resume, and says why; refuses instead when the database
    /// was followed from another replica, whose state this one cannot be shown to continue.
    /// Without a checksum on either side, the same replica is all there is to check.
    fn unchecked(&mut self, first: &LtxFileInfo, why: &str) -> Result<(), RestoreError> {
        if let Some(before) = &self.followed_from {
            return Err(RestoreError::Unproven {
                db: self.to.clone(),
                txid: self.txid,
                before: before.clone(),
                now: self.client.location(),
                why: why.to_string(),
            });
        }
        if self.last_post.is_some() {
            tracing::warn!(db = %self.to.display(), txid = %self.txid, next_file = %file_label(first),
                "{why}: resuming without checking that the database is this replica's state");
        }
        self.checking_resume = false;
        Ok(())
    }

    /// Records the database's checksum (if its files carried one) and the replica at its TXID
    /// for the next run's resume (a clean stop).
    pub(super) async fn record_stop(&self) {
        let (path, text) = (
            checksum_path(&self.to),
            Record::format(self.txid, self.last_post, &self.client.location()),
        );
        let written = tokio::task::spawn_blocking(move || write_sidecar(&path, &text)).await;
        if let Ok(Err(e)) = written {
            tracing::warn!(db = %self.to.display(), error = %e, "could not record the database's checksum: the next run resumes unchecked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_read_back_only_at_its_txid() {
        let at = TxId(0x2a);
        let loc = "file:///srv/a replica";
        let with = Record::format(at, Some(0xfeed), loc);
        let without = Record::format(at, None, loc);
        assert_eq!(
            Record::parse(&with, at),
            Some(Record {
                post: Some(0xfeed),
                location: Some(loc.into())
            })
        );
        assert_eq!(
            Record::parse(&without, at),
            Some(Record {
                post: None,
                location: Some(loc.into())
            })
        );
        assert_eq!(Record::parse(&with, TxId(0x2b)), None, "another TXID");
        // The version before locations: the checksum alone.
        assert_eq!(
            Record::parse("000000000000002a 000000000000feed\n", at),
            Some(Record {
                post: Some(0xfeed),
                location: None
            })
        );
        assert_eq!(Record::parse("000000000000002a zz", at), None);
        assert_eq!(Record::parse("", at), None);
    }
}
