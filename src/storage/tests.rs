use std::sync::Arc;

use super::*;
use crate::ltx::{HEADER_FLAG_NO_CHECKSUM, HEADER_SIZE};
use crate::storage::age::keys::AgeKeys;
use crate::storage::faulty::{Faults, FaultyClient};
use crate::storage::file::FileClient;

fn header() -> Header {
    Header {
        flags: HEADER_FLAG_NO_CHECKSUM,
        page_size: 4096,
        commit: 1,
        min_txid: TxId(1),
        max_txid: TxId(1),
        timestamp: 1_767_225_600_000,
        ..Header::default()
    }
}

/// A replica under `dir` holding L0 file 1-1 of `bytes`, through a fault wrapper (sealed by
/// age when `sealed`), and its listing entry.
async fn replica(dir: &Path, bytes: &[u8], sealed: bool) -> (AnyClient, Arc<Faults>, LtxFileInfo) {
    let src = dir.join("src.ltx");
    std::fs::write(&src, bytes).unwrap();
    let mut inner = AnyClient::File(FileClient::new(dir.join("replica")));
    if sealed {
        let (text, public) = crate::storage::age::keys::generate_identity();
        let id = dir.join("id.txt");
        std::fs::write(&id, text).unwrap();
        let keys = AgeKeys::load(&[public], &[id.display().to_string()]).unwrap();
        inner = inner.with_age(Arc::new(keys));
    }
    let info = inner.put(0, TxId(1), TxId(1), &src, 0).await.unwrap();
    let faults = Faults::new();
    let client = AnyClient::Faulty(Box::new(FaultyClient::new(inner, faults.clone())));
    (client, faults, info)
}

fn whole_file() -> Vec<u8> {
    let mut bytes = header().encode().unwrap().to_vec();
    bytes.resize(HEADER_SIZE + 200, 7);
    bytes
}

fn op_of(e: &StorageError) -> Option<&'static str> {
    match e {
        StorageError::Permanent { op, .. } => Some(op),
        _ => None,
    }
}

/// A body a network cut ends early is read again: the header is whole the second time.
#[tokio::test]
async fn a_header_cut_once_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let (client, faults, info) = replica(dir.path(), &whole_file(), false).await;
    faults.end_next_bodies_after(1, 40);
    assert_eq!(client.read_header(&info).await.unwrap(), header());
}

/// A file shorter than a header reads short twice at the same length: damaged.
#[tokio::test]
async fn a_file_shorter_than_its_header_is_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let (client, _, info) = replica(dir.path(), &whole_file()[..50], false).await;
    let e = client.read_header(&info).await.unwrap_err();
    assert_eq!(op_of(&e), Some(DAMAGED), "{e}");
    assert!(e.to_string().contains("ended after 50 bytes"), "{e}");
}

/// Two short reads that disagree say nothing about the file: a passing fault, retried.
#[tokio::test]
async fn short_reads_that_disagree_are_a_passing_fault() {
    let dir = tempfile::tempdir().unwrap();
    let (client, faults, info) = replica(dir.path(), &whole_file()[..50], false).await;
    faults.end_next_bodies_after(1, 40);
    let e = client.read_header(&info).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("after 40 bytes"), "{e}");
}

/// A sealed file whose ciphertext is damaged fails to decrypt on every read: damaged, where a
/// single failed read was taken for a passing fault and the recheck retried without end.
#[tokio::test]
async fn a_sealed_file_that_does_not_decrypt_is_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let (client, _, info) = replica(dir.path(), &whole_file(), true).await;
    let path = dir
        .path()
        .join("replica/ltx/0/0000000000000001-0000000000000001.ltx.age");
    let mut sealed = std::fs::read(&path).unwrap();
    let last = sealed.len() - 1;
    sealed[last] ^= 0xff;
    std::fs::write(&path, sealed).unwrap();
    let e = client.read_header(&info).await.unwrap_err();
    assert_eq!(op_of(&e), Some(DAMAGED), "{e}");
}

/// A sealed file's age header that ends early is a cut body the first time it is read again
/// whole, and damage when it ends early again: a truncated sealed file (its age header
/// incomplete) was taken for a passing fault at every recheck, never seeded over.
#[tokio::test]
async fn a_sealed_header_that_ends_early_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.ltx");
    std::fs::write(&src, whole_file()).unwrap();
    let faults = Faults::new();
    let file = AnyClient::File(FileClient::new(dir.path().join("replica")));
    let faulty = AnyClient::Faulty(Box::new(FaultyClient::new(file, faults.clone())));
    let (text, public) = crate::storage::age::keys::generate_identity();
    let id = dir.path().join("id.txt");
    std::fs::write(&id, text).unwrap();
    let keys = AgeKeys::load(&[public], &[id.display().to_string()]).unwrap();
    let client = faulty.with_age(Arc::new(keys));
    let info = client.put(0, TxId(1), TxId(1), &src, 0).await.unwrap();
    faults.end_next_bodies_after(1, 30);
    assert_eq!(client.read_header(&info).await.unwrap(), header());
    // Truncated within its age header.
    let path = dir
        .path()
        .join("replica/ltx/0/0000000000000001-0000000000000001.ltx.age");
    let sealed = std::fs::read(&path).unwrap();
    std::fs::write(&path, &sealed[..30]).unwrap();
    let e = client.read_header(&info).await.unwrap_err();
    assert_eq!(op_of(&e), Some(DAMAGED), "{e}");
}
