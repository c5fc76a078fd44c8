//! A fault-injecting wrapper around any replica client, for tests and failure drills: fail the
//! first N calls, fail a fraction of calls, add latency, drop GET bodies mid-stream (with an
//! error or without), and list like a store whose listings lag its PUTs.
//!
//! The faults are held behind an `Arc` so a test can change them while a Store runs (e.g. a
//! failure storm, then recovery). Injected failures are [`StorageError::Transient`], the kind a
//! real network or a 5xx produces.

use std::collections::HashMap;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rand::RngExt;
use tokio::io::{AsyncRead, ReadBuf};

use crate::ltx::TxId;
use crate::storage::tmp_names::Swept;
use crate::storage::{
    AnyClient, LtxFileInfo, ObjectReader, ReplicaClient, StorageError, Versioned, WriteIf,
};

/// The faults to inject; every field can change at any time.
#[derive(Debug, Default)]
pub struct Faults {
    fail_first: AtomicU64,
    /// Failure probability in parts per million.
    fail_ppm: AtomicU64,
    latency_ms: AtomicU64,
    /// If non-zero, GET bodies fail after this many bytes.
    cut_body_after: AtomicU64,
    /// How many of the next GET bodies end without an error after `end_early_after` bytes.
    end_early_left: AtomicU64,
    end_early_after: AtomicU64,
    /// If non-zero, listings leave out files put less than this many ms ago.
    listing_lag_ms: AtomicU64,
    /// When each file was put (level, min, max), recorded while listings lag.
    put_at: Mutex<HashMap<(u8, TxId, TxId), Instant>>,
    injected: AtomicU64,
    /// If non-zero, a write of an auxiliary object removes the old one this many ms before
    /// it writes the new one (as SFTP and WebDAV replace).
    aux_gap_ms: AtomicU64,
    /// Such writes in their gap now (as their temporary file would show).
    aux_in_gap: AtomicU64,
    /// A look for a write under way answers only once no write is in its gap (a listing
    /// that reaches the server after the holder's rename).
    aux_look_late: AtomicBool,
}

impl Faults {
    /// No faults.
    pub fn new() -> Arc<Faults> {
        Arc::default()
    }

    /// The next `n` calls fail.
    pub fn fail_next(&self, n: u64) {
        self.fail_first.store(n, Ordering::Relaxed);
    }

    /// Each call fails with probability `p` (0.0..=1.0).
    pub fn set_fail_rate(&self, p: f64) {
        self.fail_ppm
            .store((p.clamp(0.0, 1.0) * 1e6) as u64, Ordering::Relaxed);
    }

    /// Each call first waits this long.
    pub fn set_latency(&self, d: Duration) {
        self.latency_ms
            .store(d.as_millis() as u64, Ordering::Relaxed);
    }

    /// GET bodies error out after `n` bytes (0: never).
    pub fn cut_bodies_after(&self, n: u64) {
        self.cut_body_after.store(n, Ordering::Relaxed);
    }

    /// The next `count` GET bodies end after `n` bytes without an error, as a body whose
    /// connection closed early does to a client that does not check its length.
    pub fn end_next_bodies_after(&self, count: u64, n: u64) {
        self.end_early_after.store(n, Ordering::Relaxed);
        self.end_early_left.store(count, Ordering::Relaxed);
    }

    /// Whether this GET's body ends early, and after how many bytes.
    fn ends_early(&self) -> Option<u64> {
        self.end_early_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .ok()
            .map(|_| self.end_early_after.load(Ordering::Relaxed))
    }

    /// Listings leave out the files put less than `d` ago, as a store whose listings lag its
    /// PUTs does (zero: listings see every file again).
    pub fn set_listing_lag(&self, d: Duration) {
        self.listing_lag_ms
            .store(d.as_millis() as u64, Ordering::Relaxed);
    }

    fn lagging(&self) -> Option<Duration> {
        let ms = self.listing_lag_ms.load(Ordering::Relaxed);
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    fn put_done(&self, f: &LtxFileInfo) {
        if let Some(lag) = self.lagging() {
            let mut at = self.put_at.lock().unwrap_or_else(|e| e.into_inner());
            // Files put longer ago than the lag are listed anyway: forgotten (a drill that
            // runs for days keeps only the last lag's puts).
            at.retain(|_, t| t.elapsed() < lag);
            at.insert((f.level, f.min_txid, f.max_txid), Instant::now());
        }
    }

    /// `files` less those a lagging listing does not show yet.
    fn listed(&self, mut files: Vec<LtxFileInfo>) -> Vec<LtxFileInfo> {
        if let Some(lag) = self.lagging() {
            let at = self.put_at.lock().unwrap_or_else(|e| e.into_inner());
            files.retain(|f| {
                at.get(&(f.level, f.min_txid, f.max_txid))
                    .is_none_or(|t| t.elapsed() >= lag)
            });
        }
        files
    }

    /// Writes of auxiliary objects leave none for `d` before the new one is in place.
    pub fn set_aux_gap(&self, d: Duration) {
        self.aux_gap_ms.store(
            d.as_millis().try_into().unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Looks for an auxiliary write under way answer only once its gap is over.
    pub fn set_aux_look_late(&self, on: bool) {
        self.aux_look_late.store(on, Ordering::SeqCst);
    }

    /// Failures injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    async fn before(&self, op: &'static str) -> Result<(), StorageError> {
        let latency = self.latency_ms.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        let first = self
            .fail_first
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        let ppm = self.fail_ppm.load(Ordering::Relaxed);
        let random = ppm > 0 && rand::rng().random_range(0..1_000_000) < ppm;
        if first || random {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Err(StorageError::Transient {
                op,
                key: "(injected)".into(),
                reason: "injected fault".into(),
            });
        }
        Ok(())
    }
}

/// A client that injects [`Faults`] before delegating to the wrapped one.
#[derive(Debug, Clone)]
pub struct FaultyClient {
    inner: AnyClient,
    faults: Arc<Faults>,
}

impl FaultyClient {
    /// Wraps `inner`.
    pub fn new(inner: AnyClient, faults: Arc<Faults>) -> FaultyClient {
        FaultyClient { inner, faults }
    }

    /// The wrapped client.
    pub fn inner(&self) -> &AnyClient {
        &self.inner
    }

    /// The same faults around another client (the encrypted view of the same replica).
    pub fn with_inner(&self, inner: AnyClient) -> FaultyClient {
        FaultyClient {
            inner,
            faults: self.faults.clone(),
        }
    }
}

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = Result<T, StorageError>> + Send + 'a>>;

impl FaultyClient {
    // The inner calls are boxed: `AnyClient` contains this type, so its futures would
    // otherwise contain themselves.
    fn inner_list(&self, level: u8) -> BoxFut<'_, Vec<LtxFileInfo>> {
        Box::pin(self.inner.list(level))
    }

    fn inner_list_all(&self) -> BoxFut<'_, Vec<LtxFileInfo>> {
        Box::pin(self.inner.list_all())
    }

    fn inner_open(&self, level: u8, min: TxId, max: TxId, offset: u64) -> BoxFut<'_, ObjectReader> {
        Box::pin(self.inner.open(level, min, max, offset))
    }

    fn inner_put<'a>(
        &'a self,
        level: u8,
        min: TxId,
        max: TxId,
        src: &'a Path,
        ts: i64,
    ) -> BoxFut<'a, LtxFileInfo> {
        Box::pin(self.inner.put(level, min, max, src, ts))
    }

    fn inner_delete<'a>(&'a self, files: &'a [LtxFileInfo]) -> BoxFut<'a, ()> {
        Box::pin(self.inner.delete(files))
    }

    fn inner_read_aux<'a>(&'a self, name: &'a str) -> BoxFut<'a, Option<Vec<u8>>> {
        Box::pin(self.inner.read_aux(name))
    }

    fn inner_write_aux<'a>(&'a self, name: &'a str, data: Vec<u8>) -> BoxFut<'a, ()> {
        Box::pin(self.inner.write_aux(name, data))
    }

    fn inner_delete_aux<'a>(&'a self, name: &'a str) -> BoxFut<'a, ()> {
        Box::pin(self.inner.delete_aux(name))
    }

    fn inner_aux_write_in_flight<'a>(&'a self, name: &'a str) -> BoxFut<'a, bool> {
        Box::pin(self.inner.aux_write_in_flight(name))
    }

    fn inner_sweep_tmp(&self, older_than: Duration) -> BoxFut<'_, Swept> {
        Box::pin(self.inner.sweep_tmp(older_than))
    }

    fn inner_read_aux_versioned<'a>(&'a self, name: &'a str) -> BoxFut<'a, Option<Versioned>> {
        Box::pin(self.inner.read_aux_versioned(name))
    }

    fn inner_write_aux_if<'a>(
        &'a self,
        name: &'a str,
        data: Vec<u8>,
        cond: WriteIf,
    ) -> BoxFut<'a, Option<String>> {
        Box::pin(self.inner.write_aux_if(name, data, cond))
    }
}

impl ReplicaClient for FaultyClient {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    async fn list(&self, level: u8) -> Result<Vec<LtxFileInfo>, StorageError> {
        self.faults.before("list").await?;
        Ok(self.faults.listed(self.inner_list(level).await?))
    }

    /// One call, one fault draw: as a backend that lists a replica in one request.
    async fn list_all(&self) -> Result<Vec<LtxFileInfo>, StorageError> {
        self.faults.before("list").await?;
        Ok(self.faults.listed(self.inner_list_all().await?))
    }

    async fn open(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
    ) -> Result<ObjectReader, StorageError> {
        self.faults.before("get").await?;
        let mut body = self.inner_open(level, min, max, offset).await?;
        if let Some(n) = self.faults.ends_early() {
            body = Box::pin(tokio::io::AsyncReadExt::take(body, n));
        }
        let cut = self.faults.cut_body_after.load(Ordering::Relaxed);
        if cut == 0 {
            return Ok(body);
        }
        Ok(Box::pin(CutReader {
            inner: body,
            left: cut,
        }))
    }

    async fn put(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        src: &Path,
        ts: i64,
    ) -> Result<LtxFileInfo, StorageError> {
        self.faults.before("put").await?;
        let info = self.inner_put(level, min, max, src, ts).await?;
        self.faults.put_done(&info);
        Ok(info)
    }

    async fn delete(&self, files: &[LtxFileInfo]) -> Result<(), StorageError> {
        self.faults.before("delete").await?;
        self.inner_delete(files).await
    }

    async fn read_aux(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.faults.before("get").await?;
        self.inner_read_aux(name).await
    }

    async fn write_aux(&self, name: &str, data: Vec<u8>) -> Result<(), StorageError> {
        self.faults.before("put").await?;
        let gap = self.faults.aux_gap_ms.load(Ordering::Relaxed);
        if gap == 0 {
            return self.inner_write_aux(name, data).await;
        }
        self.faults.aux_in_gap.fetch_add(1, Ordering::SeqCst);
        let written = async {
            self.inner_delete_aux(name).await?;
            tokio::time::sleep(Duration::from_millis(gap)).await;
            self.inner_write_aux(name, data).await
        }
        .await;
        self.faults.aux_in_gap.fetch_sub(1, Ordering::SeqCst);
        written
    }

    fn replaces_aux_in_two_steps(&self) -> bool {
        self.faults.aux_gap_ms.load(Ordering::Relaxed) > 0 || self.inner.replaces_aux_in_two_steps()
    }

    async fn aux_write_in_flight(&self, name: &str) -> Result<bool, StorageError> {
        if self.faults.aux_look_late.load(Ordering::SeqCst) {
            while self.faults.aux_in_gap.load(Ordering::SeqCst) > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        if self.faults.aux_in_gap.load(Ordering::SeqCst) > 0 {
            return Ok(true);
        }
        self.inner_aux_write_in_flight(name).await
    }

    async fn sweep_tmp(&self, older_than: Duration) -> Result<Swept, StorageError> {
        self.faults.before("list").await?;
        self.inner_sweep_tmp(older_than).await
    }

    async fn delete_aux(&self, name: &str) -> Result<(), StorageError> {
        self.faults.before("delete").await?;
        self.inner_delete_aux(name).await
    }

    async fn read_aux_versioned(&self, name: &str) -> Result<Option<Versioned>, StorageError> {
        self.faults.before("get").await?;
        self.inner_read_aux_versioned(name).await
    }

    async fn write_aux_if(
        &self,
        name: &str,
        data: Vec<u8>,
        cond: WriteIf,
    ) -> Result<Option<String>, StorageError> {
        self.faults.before("put").await?;
        self.inner_write_aux_if(name, data, cond).await
    }
}

/// A body that breaks like a dropped connection after `left` bytes.
struct CutReader {
    inner: ObjectReader,
    left: u64,
}

impl AsyncRead for CutReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.left == 0 {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "injected: connection dropped",
            )));
        }
        let room = buf.remaining().min(self.left as usize);
        let mut tmp = vec![0u8; room];
        let mut limited = ReadBuf::new(&mut tmp);
        let poll = self.inner.as_mut().poll_read(cx, &mut limited);
        let n = limited.filled().len();
        buf.put_slice(limited.filled());
        self.left -= n as u64;
        poll
    }
}
