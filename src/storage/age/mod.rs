//! Client-side encryption with age: a wrapper that sees a replica through both its plain
//! (`<min>-<max>.ltx`) and its encrypted (`<min>-<max>.ltx.age`) names.
//!
//! - `put` encrypts the whole encoded segment (to a `<src>.age.tmp` beside it, off the
//!   reactor) when recipients are configured, else stores it plain.
//! - `list` merges both kinds, each marked by [`LtxFileInfo::encrypted`]; `size` is the stored
//!   (ciphertext) size. If one range exists in both kinds, the kind this replica writes wins.
//! - `open` tries the kind this replica writes first and the other one on `NotFound` (one
//!   extra request for files of the other kind, only on replicas that switched). Encrypted
//!   bodies are decrypted as a stream on a blocking thread; an `offset` is read and dropped,
//!   so a ranged read of an encrypted object costs the download of everything before its end.
//!   Restore therefore fetches encrypted files whole instead of in parallel ranges.
//! - `delete` removes each range under both names (missing ones are not an error).
//! - An encrypted file without a usable identity fails with a permanent error that names the
//!   identities tried (or that none was given, and how to give one) and the recipients the
//!   replica notes in `age-recipients.txt`, when the writer left that note.
//!
//! Invariant: nothing is ever written in plain while recipients are configured, and nothing
//! encrypted is ever returned undecrypted.

pub mod keys;

use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio_util::io::SyncIoBridge;

use crate::ltx::{self, TxId};
use crate::storage::age::keys::AgeKeys;
use crate::storage::tmp_names::Swept;
use crate::storage::{
    AnyClient, LtxFileInfo, ObjectReader, ReplicaClient, StorageError, Versioned, WriteIf,
};

/// A replica seen through both names, with the keys to write and read encrypted files.
#[derive(Debug, Clone)]
pub struct AgeClient {
    plain: AnyClient,
    sealed: AnyClient,
    keys: Arc<AgeKeys>,
}

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = Result<T, StorageError>> + Send + 'a>>;

impl AgeClient {
    /// Wraps `inner` (a file or S3 client, possibly behind injected faults); gives it back
    /// if it has no encrypted view (it is already wrapped).
    pub fn new(inner: AnyClient, keys: Arc<AgeKeys>) -> Result<AgeClient, AnyClient> {
        let Some(sealed) = sealed_view(&inner) else {
            return Err(inner);
        };
        Ok(AgeClient {
            plain: inner,
            sealed,
            keys,
        })
    }

    /// The keys.
    pub fn keys(&self) -> &AgeKeys {
        &self.keys
    }

    /// The plain view (the wrapped client).
    pub fn plain(&self) -> &AnyClient {
        &self.plain
    }

    /// The storage client under any fault injection (for the recipients note).
    fn backend(&self) -> &AnyClient {
        let mut c = &self.plain;
        while let AnyClient::Faulty(f) = c {
            c = f.inner();
        }
        c
    }

    /// True if new files are encrypted.
    pub fn encrypts(&self) -> bool {
        self.keys.encrypts()
    }

    fn prefers_sealed(&self) -> bool {
        self.keys.encrypts() || self.keys.has_identities()
    }

    // Boxed: `AnyClient` contains this type, so its futures would otherwise contain themselves.
    fn list_view(&self, sealed: bool, level: u8) -> BoxFut<'_, Vec<LtxFileInfo>> {
        let c = if sealed { &self.sealed } else { &self.plain };
        Box::pin(c.list(level))
    }

    fn plain_read_aux<'a>(&'a self, name: &'a str) -> BoxFut<'a, Option<Vec<u8>>> {
        Box::pin(self.plain.read_aux(name))
    }

    fn plain_write_aux<'a>(&'a self, name: &'a str, data: Vec<u8>) -> BoxFut<'a, ()> {
        Box::pin(self.plain.write_aux(name, data))
    }

    fn plain_aux_write_in_flight<'a>(&'a self, name: &'a str) -> BoxFut<'a, bool> {
        Box::pin(self.plain.aux_write_in_flight(name))
    }

    fn plain_sweep_tmp(&self, older_than: std::time::Duration) -> BoxFut<'_, Swept> {
        Box::pin(self.plain.sweep_tmp(older_than))
    }

    fn plain_delete_aux<'a>(&'a self, name: &'a str) -> BoxFut<'a, ()> {
        Box::pin(self.plain.delete_aux(name))
    }

    fn plain_read_aux_versioned<'a>(&'a self, name: &'a str) -> BoxFut<'a, Option<Versioned>> {
        Box::pin(self.plain.read_aux_versioned(name))
    }

    fn plain_write_aux_if<'a>(
        &'a self,
        name: &'a str,
        data: Vec<u8>,
        cond: WriteIf,
    ) -> BoxFut<'a, Option<String>> {
        Box::pin(self.plain.write_aux_if(name, data, cond))
    }

    fn list_all_view(&self, sealed: bool) -> BoxFut<'_, Vec<LtxFileInfo>> {
        let c = if sealed { &self.sealed } else { &self.plain };
        Box::pin(c.list_all())
    }

    fn open_view(
        &self,
        sealed: bool,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
        len: Option<u64>,
    ) -> BoxFut<'_, ObjectReader> {
        // Plain objects are read with the backend's own ranges; encrypted ones from byte 0.
        match (sealed, len) {
            (true, _) => Box::pin(self.sealed.open(level, min, max, 0)),
            (false, None) => Box::pin(self.plain.open(level, min, max, offset)),
            (false, Some(n)) => Box::pin(self.plain.open_range(level, min, max, offset, n)),
        }
    }

    fn put_view<'a>(
        &'a self,
        sealed: bool,
        level: u8,
        min: TxId,
        max: TxId,
        src: &'a Path,
        ts: i64,
    ) -> BoxFut<'a, LtxFileInfo> {
        let c = if sealed { &self.sealed } else { &self.plain };
        Box::pin(c.put(level, min, max, src, ts))
    }

    fn delete_inner<'a>(&'a self, files: &'a [LtxFileInfo]) -> BoxFut<'a, ()> {
        Box::pin(self.plain.delete(files))
    }

    /// Opens plaintext bytes `offset..offset+len` (to the end without `len`).
    async fn open_plain_or_sealed(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
        len: Option<u64>,
    ) -> Result<ObjectReader, StorageError> {
        let first = self.prefers_sealed();
        let mut last_err = None;
        for sealed in [first, !first] {
            let opened = self.open_view(sealed, level, min, max, offset, len).await;
            match opened {
                Ok(body) if !sealed => return Ok(body),
                Ok(body) => {
                    let label = format!(
                        "{level}/{}{}",
                        ltx::format_filename(min, max),
                        crate::storage::SEALED_SUFFIX
                    );
                    let r = self.decrypt_stream(body, offset, label).await?;
                    return Ok(match len {
                        Some(n) => Box::pin(r.take(n)) as ObjectReader,
                        None => r,
                    });
                }
                Err(StorageError::NotFound(k)) => last_err = Some(StorageError::NotFound(k)),
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| StorageError::NotFound(ltx::format_filename(min, max))))
    }

    /// Decrypts `body` on a blocking thread, streaming plaintext after `offset` through a
    /// bounded channel. Returns once the header is unwrapped, so a missing identity is an
    /// error of this call rather than of the first read.
    async fn decrypt_stream(
        &self,
        body: ObjectReader,
        offset: u64,
        label: String,
    ) -> Result<ObjectReader, StorageError> {
        let (hdr_tx, hdr_rx) = tokio::sync::oneshot::channel::<Result<(), age::DecryptError>>();
        let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(4);
        let keys = self.keys.clone();
        let bridge = SyncIoBridge::new(body);
        tokio::task::spawn_blocking(move || {
            let mut r = match keys.decrypt(BufReader::with_capacity(64 * 1024, bridge)) {
                Ok(r) => r,
                Err(e) => {
                    let _ = hdr_tx.send(Err(e));
                    return;
                }
            };
            let _ = hdr_tx.send(Ok(()));
            if offset > 0
                && let Err(e) = io::copy(&mut (&mut r).take(offset), &mut io::sink())
            {
                let _ = tx.blocking_send(Err(e));
                return;
            }
            loop {
                let mut buf = vec![0u8; 64 * 1024];
                match r.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        buf.truncate(n);
                        if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e));
                        return;
                    }
                }
            }
        });
        match hdr_rx.await {
            Ok(Ok(())) => {}
            Ok(Err(age::DecryptError::Io(e))) => {
                let op = match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => crate::storage::ENDED_EARLY,
                    _ => "get",
                };
                return Err(StorageError::Transient {
                    op,
                    key: label,
                    reason: e.to_string(),
                });
            }
            Ok(Err(age::DecryptError::NoMatchingKeys)) => {
                return Err(StorageError::Permanent {
                    op: "decrypt",
                    key: label,
                    reason: self.missing_identity_message().await,
                });
            }
            Ok(Err(e)) => {
                return Err(StorageError::Permanent {
                    op: crate::storage::DAMAGED,
                    key: label,
                    reason: format!("not a valid age file: {e}"),
                });
            }
            Err(_) => {
                return Err(StorageError::Transient {
                    op: "decrypt",
                    key: label,
                    reason: "decryption task ended early".into(),
                });
            }
        }
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(Box::pin(tokio_util::io::StreamReader::new(stream)))
    }

    /// Names what was tried and what would work (never a secret).
    async fn missing_identity_message(&self) -> String {
        let tried = if self.keys.has_identities() {
            format!(
                "no identity given matches it (tried: {})",
                self.keys.identity_sources().join("; ")
            )
        } else {
            "no age identity was given: pass --age-identity FILE (repeatable) or set \
             age.identities in the replica's config"
                .to_string()
        };
        match self.read_note().await {
            Some(rs) => format!(
                "the file is encrypted with age and {tried}; the replica's files are encrypted \
                 to recipient(s) {rs}: give the identity file of one of them"
            ),
            None => format!("the file is encrypted with age and {tried}"),
        }
    }

    /// The recipients listed in the replica's plaintext note, if any.
    async fn read_note(&self) -> Option<String> {
        let text = match self.backend() {
            AnyClient::File(c) => tokio::fs::read_to_string(note_path(c.root())).await.ok()?,
            AnyClient::S3(c) => String::from_utf8(c.get_small(NOTE_NAME).await.ok()?).ok()?,
            AnyClient::Object(c) => String::from_utf8(c.read_aux(NOTE_NAME).await.ok()??).ok()?,
            AnyClient::Sftp(c) => String::from_utf8(c.read_aux(NOTE_NAME).await.ok()??).ok()?,
            _ => return None,
        };
        let rs: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("age1"))
            .collect();
        (!rs.is_empty()).then(|| rs.join(", "))
    }

    /// Writes the plaintext recipients note (`age-recipients.txt`): public keys only, so a
    /// restore that lacks the identity can say which one it needs.
    pub async fn write_note(&self) -> Result<(), StorageError> {
        if !self.keys.encrypts() {
            return Ok(());
        }
        let text = format!(
            "# Recipients the newest files of this replica are encrypted to (written by replicad).\n{}\n",
            self.keys.recipient_strings().join("\n")
        );
        match self.backend() {
            AnyClient::File(c) => {
                let root = c.root().to_path_buf();
                tokio::task::spawn_blocking(move || {
                    let path = note_path(&root);
                    crate::util::fsutil::create_dir_all_durable(&root)
                        .and_then(|()| crate::util::fsutil::write_durable(&path, text.as_bytes()))
                        .map_err(|e| StorageError::from_io("put", &path, e))
                })
                .await
                .map_err(|e| StorageError::Transient {
                    op: "put",
                    key: NOTE_NAME.into(),
                    reason: e.to_string(),
                })?
            }
            AnyClient::S3(c) => c.put_small(NOTE_NAME, text.into_bytes()).await,
            AnyClient::Object(c) => c.write_aux(NOTE_NAME, text.into_bytes()).await,
            AnyClient::Sftp(c) => c.write_aux(NOTE_NAME, text.into_bytes()).await,
            _ => Ok(()),
        }
    }
}

/// The encrypted-names view of a client, if it has one.
fn sealed_view(c: &AnyClient) -> Option<AnyClient> {
    match c {
        AnyClient::File(c) => Some(AnyClient::File(c.sealed_view())),
        AnyClient::S3(c) => Some(AnyClient::S3(c.sealed_view())),
        AnyClient::Object(c) => Some(AnyClient::Object(Box::new(c.sealed_view()))),
        AnyClient::Sftp(c) => Some(AnyClient::Sftp(c.sealed_view())),
        AnyClient::Faulty(f) => Some(AnyClient::Faulty(Box::new(
            f.with_inner(sealed_view(f.inner())?),
        ))),
        AnyClient::Age(_) => None,
    }
}

/// Name of the plaintext recipients note at the replica's root.
pub const NOTE_NAME: &str = crate::storage::AGE_NOTE_NAME;

fn note_path(root: &Path) -> PathBuf {
    root.join(NOTE_NAME)
}

impl ReplicaClient for AgeClient {
    fn kind(&self) -> &'static str {
        self.plain.kind()
    }

    fn location(&self) -> String {
        self.plain.location()
    }

    fn replaces_aux_in_two_steps(&self) -> bool {
        self.plain.replaces_aux_in_two_steps()
    }

    async fn aux_write_in_flight(&self, name: &str) -> Result<bool, StorageError> {
        self.plain_aux_write_in_flight(name).await
    }

    /// The sealed view shares the plain one's root and level directories.
    async fn sweep_tmp(&self, older_than: std::time::Duration) -> Result<Swept, StorageError> {
        self.plain_sweep_tmp(older_than).await
    }

    async fn list(&self, level: u8) -> Result<Vec<LtxFileInfo>, StorageError> {
        let (plain, sealed) =
            tokio::join!(self.list_view(false, level), self.list_view(true, level));
        let preferred = self.prefers_sealed();
        let mut all = plain?;
        all.extend(sealed?);
        all.sort_by_key(|f| (f.min_txid, f.max_txid, f.encrypted != preferred));
        all.dedup_by_key(|f| (f.min_txid, f.max_txid));
        Ok(all)
    }

    /// Auxiliary objects (the single-writer lease) are plain, whatever the replica's files.
    async fn read_aux(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.plain_read_aux(name).await
    }

    async fn write_aux(&self, name: &str, data: Vec<u8>) -> Result<(), StorageError> {
        self.plain_write_aux(name, data).await
    }

    async fn delete_aux(&self, name: &str) -> Result<(), StorageError> {
        self.plain_delete_aux(name).await
    }

    async fn read_aux_versioned(&self, name: &str) -> Result<Option<Versioned>, StorageError> {
        self.plain_read_aux_versioned(name).await
    }

    async fn write_aux_if(
        &self,
        name: &str,
        data: Vec<u8>,
        cond: WriteIf,
    ) -> Result<Option<String>, StorageError> {
        self.plain_write_aux_if(name, data, cond).await
    }

    async fn list_all(&self) -> Result<Vec<LtxFileInfo>, StorageError> {
        // One listing of the whole replica per view (S3: two requests, not twenty).
        let (plain, sealed) = tokio::join!(self.list_all_view(false), self.list_all_view(true));
        let preferred = self.prefers_sealed();
        let mut all = plain?;
        all.extend(sealed?);
        all.sort_by_key(|f| (f.level, f.min_txid, f.max_txid, f.encrypted != preferred));
        all.dedup_by_key(|f| (f.level, f.min_txid, f.max_txid));
        Ok(all)
    }

    async fn open(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
    ) -> Result<ObjectReader, StorageError> {
        self.open_plain_or_sealed(level, min, max, offset, None)
            .await
    }

    async fn open_range(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
        len: u64,
    ) -> Result<ObjectReader, StorageError> {
        self.open_plain_or_sealed(level, min, max, offset, Some(len))
            .await
    }

    async fn put(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        src: &Path,
        timestamp_ms: i64,
    ) -> Result<LtxFileInfo, StorageError> {
        if !self.keys.encrypts() {
            return self
                .put_view(false, level, min, max, src, timestamp_ms)
                .await;
        }
        // Its own name per put: two encrypted replicas of one database seal the same
        // segment at once.
        let mut sealed = src.as_os_str().to_owned();
        sealed.push(".age");
        let tmp = crate::util::fsutil::unique_tmp_path(Path::new(&sealed));
        let keys = self.keys.clone();
        let (from, to) = (src.to_path_buf(), tmp.clone());
        let started = std::time::Instant::now();
        // A put dropped mid-way (a job aborted, a shutdown) leaves no sealed copy as large as
        // the segment: the guard removes it, or the encryption once it ends.
        let guard = Sealing::new(tmp.clone());
        let abandoned = guard.abandoned.clone();
        let sealed = tokio::task::spawn_blocking(move || {
            let r = keys.encrypt_file(&from, &to);
            if abandoned.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = std::fs::remove_file(&to);
            }
            r
        })
        .await
        .map_err(|e| StorageError::Transient {
            op: "encrypt",
            key: src.display().to_string(),
            reason: e.to_string(),
        })
        .and_then(|r| r.map_err(|e| StorageError::from_io("encrypt", src, e)));
        if let Err(e) = sealed {
            // Each attempt has its own name: a failed one must not stay behind.
            guard.remove().await;
            return Err(e);
        }
        tracing::trace!(elapsed = ?started.elapsed(), "encrypted segment");
        let put = self
            .put_view(true, level, min, max, &tmp, timestamp_ms)
            .await;
        guard.remove().await;
        put
    }

    async fn delete(&self, files: &[LtxFileInfo]) -> Result<(), StorageError> {
        // The backends delete each file under the name its `encrypted` flag gives; a range is
        // deleted under both names, so a caller's own `LtxFileInfo` (flag unset) cannot leave
        // the encrypted object behind. The missing name costs nothing (missing is not an error).
        let both: Vec<LtxFileInfo> = files
            .iter()
            .flat_map(|f| {
                let mut other = f.clone();
                other.encrypted = !f.encrypted;
                [f.clone(), other]
            })
            .collect();
        self.delete_inner(&both).await
    }
}

/// The sealed copy a put makes on the blocking pool. Dropped before [`Sealing::remove`], it
/// marks the put abandoned, then removes the file: the encryption, which goes on, removes it
/// too once it ends, should it have created the file after this removal.
struct Sealing {
    abandoned: Arc<std::sync::atomic::AtomicBool>,
    file: Option<crate::util::fsutil::RemoveOnDrop>,
}

impl Sealing {
    fn new(path: PathBuf) -> Sealing {
        Sealing {
            abandoned: Arc::default(),
            file: Some(crate::util::fsutil::RemoveOnDrop(path)),
        }
    }

    /// Removes the file now and waits for it (a put that ran to its end).
    async fn remove(mut self) {
        if let Some(f) = self.file.take() {
            f.remove().await;
        }
    }
}

impl Drop for Sealing {
    fn drop(&mut self) {
        // Before the file's removal (the field drops after this): see the type's doc.
        self.abandoned
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests;
