//! Building one output of a compaction or a snapshot: the inputs merged into a local
//! temporary file (or the lone staged segment that is the output already, linked and decoded
//! whole), fsynced, then stored whole. See the invariants of [`super`].

use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use tokio_util::io::SyncIoBridge;

use super::Maintenance;
use super::compactor::{self, CompactOptions};
use crate::ltx::{self, Decoder, TxId};
use crate::replicate::counters::ReplicaCounters;
use crate::replicate::staging::Staging;
use crate::storage::{AnyClient, LtxFileInfo, ReplicaClient, StorageError};
use crate::util::fsutil;
use crate::util::stop::{Gate, Stoppable};

/// One input of a compaction.
type Input = Box<dyn Read + Send>;

/// Local builds (merge, compress, fsync) running at once, across every replica of a Store.
/// Databases started together reach their first compaction together, and each build holds a
/// blocking thread whose stack and allocator arena stay in memory. The uploads that follow
/// are not bounded by it.
pub const MAX_BUILDS: usize = 8;

/// Local staging as the source of the level-0 inputs it stands for: the segments this run
/// stored, above `above` ([`super::Work::Compact::staged_above`]).
#[derive(Clone)]
pub(super) struct Staged {
    staging: Staging,
    above: TxId,
}

impl Staged {
    pub(super) fn new(staging: &Staging, above: TxId) -> Staged {
        Staged {
            staging: staging.clone(),
            above,
        }
    }

    /// Runs `f` on the blocking pool ([`Staging::off_reactor`]).
    async fn off_reactor<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Staged) -> T + Send + 'static,
    ) -> T {
        let me = self.clone();
        self.staging.off_reactor(move |_| f(&me)).await
    }

    /// The TXID of the staged segment that may stand for the replica's file `f`: a level-0
    /// segment this run stored.
    fn txid_for(&self, f: &LtxFileInfo) -> Option<TxId> {
        (f.level == 0 && f.min_txid == f.max_txid && f.min_txid > self.above).then_some(f.min_txid)
    }

    /// The staged segment that would be the output unchanged: the lone input `f`, when the
    /// output starts at its TXID. The compactor would copy its page blocks and zero its WAL
    /// fields, which no reader uses (Litestream's restore and compactor included). Blocking.
    fn lone(&self, f: &LtxFileInfo, min_override: Option<TxId>) -> Option<PathBuf> {
        self.txid_for(f)
            .filter(|&txid| min_override.is_none_or(|t| t == txid))
            .map(|txid| self.staging.path(txid))
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| is_the_object(&m, f)))
    }

    /// Opens the staged segment that stands for `f`, if any. Blocking.
    fn open(&self, f: &LtxFileInfo) -> Option<std::fs::File> {
        let txid = self.txid_for(f)?;
        std::fs::File::open(self.staging.path(txid))
            .ok()
            .filter(|file| file.metadata().is_ok_and(|m| is_the_object(&m, f)))
    }
}

/// A second guard on a staged segment that stands for `f`, which costs nothing: the bytes
/// stored, so the same size (an encrypted file's is its ciphertext's, which says nothing).
fn is_the_object(meta: &std::fs::Metadata, f: &LtxFileInfo) -> bool {
    f.encrypted || meta.len() == f.size
}

/// Merges `inputs` into one file of `level` and uploads it.
pub(super) async fn build(
    m: &Maintenance,
    client: &AnyClient,
    staged: Staged,
    inputs: &[LtxFileInfo],
    min_override: Option<TxId>,
    level: u8,
    counters: &ReplicaCounters,
) -> Result<LtxFileInfo, StorageError> {
    // Taken before the inputs are opened, so that no remote body waits idle for a turn.
    let turn = m
        .turns
        .builds
        .acquire()
        .await
        .expect("the build semaphore is never closed");
    let min = min_override.unwrap_or(inputs[0].min_txid);
    let max = inputs[inputs.len() - 1].max_txid;
    let name = format!("{level}-{}", ltx::format_filename(min, max));
    let tmp = fsutil::unique_tmp_path(&m.tmp_dir.join(name));
    // Dropping this job stops the build at its next read, then removes the output (the
    // guards drop in reverse order: the stop first). A build past its reads hands its output
    // over only under the gate, so an output created after the removal goes too.
    let remove = fsutil::RemoveOnDrop(tmp.clone());
    let gate = Gate::default();
    let stop = gate.stop_on_drop();
    let started = Instant::now();
    let built: Result<LtxFileInfo, StorageError> = async {
        let failed = |reason: String| StorageError::Permanent {
            op: "compact",
            key: format!("level {level}"),
            reason,
        };
        let lone = match inputs {
            [f] => {
                let f = f.clone();
                staged.off_reactor(move |s| s.lone(&f, min_override)).await
            }
            _ => None,
        };
        let as_is = match lone {
            Some(segment) => link_verified(m, segment, tmp.clone(), gate.clone())
                .await
                .map_err(failed)?,
            None => None,
        };
        let mut from_replica = 0;
        let timestamp = match as_is {
            Some(timestamp) => timestamp,
            None => {
                let readers = open_inputs(client, &staged, inputs, counters).await?;
                from_replica = readers.iter().filter(|r| r.remote).count();
                let readers = readers.into_iter().map(|r| r.read).collect();
                merge(m, readers, min_override, &tmp, gate.clone())
                    .await
                    .map_err(failed)?
            }
        };
        drop(turn);
        let put_started = Instant::now();
        let put = crate::storage::put_new(client, level, min, max, &tmp, timestamp).await;
        counters.observe(0, put_started, &put);
        if let Ok(info) = &put {
            counters.bytes[0].inc_by(info.size);
        }
        let info = put?;
        tracing::info!(level, min = %min, max = %max, inputs = inputs.len(), from_replica, bytes = info.size, as_is = as_is.is_some(), elapsed = ?started.elapsed(), "compacted");
        Ok(info)
    }
    .await;
    // A build that ended removes its output before it returns: nothing is left for a later
    // look at the build directory.
    drop(stop);
    remove.remove().await;
    built
}

/// Links the staged `segment` at `tmp` (which keeps it if staging drops it meanwhile) and
/// decodes it whole, so that only a segment that still verifies is stored again. Returns its
/// timestamp, or `None` when it cannot be the output as it is: gone from staging, on another
/// file system, or written with another codec than outputs use.
async fn link_verified(
    m: &Maintenance,
    segment: PathBuf,
    tmp: PathBuf,
    gate: Gate,
) -> Result<Option<i64>, String> {
    let tmp_dir = m.tmp_dir.clone();
    let codec = m.codec;
    tokio::task::spawn_blocking(move || -> Result<_, String> {
        fsutil::create_dir_all_durable(&tmp_dir).map_err(|e| e.to_string())?;
        if std::fs::hard_link(&segment, &tmp).is_err() {
            return Ok(None);
        }
        let verified = (|| -> Result<_, ltx::LtxError> {
            let file = std::fs::File::open(&tmp)?;
            let dec = Decoder::new(Stoppable::new(file, gate.token().clone()))?;
            let header = *dec.header();
            // By family: the level of zstd or gzip blocks does not matter to a reader.
            if header.flags & ltx::HEADER_FLAG_CODEC_MASK != codec.flag_bits() {
                return Ok(None);
            }
            dec.verify_to_end()?;
            Ok(Some(header.timestamp))
        })();
        let kept = match verified {
            Ok(Some(timestamp)) => gate
                .unless_stopped(|| Some(timestamp))
                .ok_or_else(|| "the build was stopped".to_string()),
            Ok(None) => Ok(None),
            Err(e) => Err(format!("staged segment {}: {e}", segment.display())),
        };
        if !matches!(kept, Ok(Some(_))) {
            let _ = std::fs::remove_file(&tmp);
        }
        kept
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
}

/// An opened input, and whether it is read from the replica (a GET).
struct Opened {
    read: Input,
    remote: bool,
}

/// Opens every input: a level-0 segment from local staging when it stands for the replica's
/// file, any other file from the replica.
async fn open_inputs(
    client: &AnyClient,
    staged: &Staged,
    inputs: &[LtxFileInfo],
    counters: &ReplicaCounters,
) -> Result<Vec<Opened>, StorageError> {
    let handle = tokio::runtime::Handle::current();
    let mut readers = Vec::with_capacity(inputs.len());
    for f in inputs {
        let local = match staged.txid_for(f) {
            Some(_) => {
                let f = f.clone();
                staged.off_reactor(move |s| s.open(&f)).await
            }
            None => None,
        };
        readers.push(match local {
            Some(file) => Opened {
                read: Box::new(file),
                remote: false,
            },
            None => {
                let opened = Instant::now();
                let body = client.open(f.level, f.min_txid, f.max_txid, 0).await;
                counters.observe(1, opened, &body);
                Opened {
                    read: Box::new(SyncIoBridge::new_with_handle(body?, handle.clone())),
                    remote: true,
                }
            }
        });
    }
    Ok(readers)
}

/// Merges `readers` into `tmp`, fsynced; returns the output's timestamp.
async fn merge(
    m: &Maintenance,
    readers: Vec<Input>,
    min_override: Option<TxId>,
    tmp: &std::path::Path,
    gate: Gate,
) -> Result<i64, String> {
    let tmp_dir = m.tmp_dir.clone();
    let codec = m.codec;
    let out_path = tmp.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<_, String> {
        fsutil::create_dir_all_durable(&tmp_dir).map_err(|e| e.to_string())?;
        let decoders = readers
            .into_iter()
            .map(|r| Decoder::new(Stoppable::new(r, gate.token().clone())))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let file = fsutil::create_fresh(&out_path).map_err(|e| e.to_string())?;
        let opts = CompactOptions {
            codec,
            min_txid: min_override,
            timestamp: None,
        };
        let result = compactor::compact(decoders, file, opts).map_err(|e| e.to_string());
        let summary = match result {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(&out_path);
                return Err(e);
            }
        };
        std::fs::File::open(&out_path)
            .and_then(|f| f.sync_all())
            .map_err(|e| e.to_string())?;
        gate.unless_stopped(|| summary.header.timestamp)
            .ok_or_else(|| {
                let _ = std::fs::remove_file(&out_path);
                "the build was stopped".to_string()
            })
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
}
