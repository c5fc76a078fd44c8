use super::*;
use crate::storage::file::FileClient;

fn keys(dir: &Path) -> Arc<AgeKeys> {
    let (text, public) = crate::storage::age::keys::generate_identity();
    let id = dir.join("id.txt");
    std::fs::write(&id, text).unwrap();
    Arc::new(AgeKeys::load(&[public], &[id.display().to_string()]).unwrap())
}

async fn read(c: &AnyClient, min: u64, off: u64, len: Option<u64>) -> Vec<u8> {
    let mut r = match len {
        None => c.open(0, TxId(min), TxId(min), off).await.unwrap(),
        Some(n) => c.open_range(0, TxId(min), TxId(min), off, n).await.unwrap(),
    };
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_replica_reads_each_file_by_its_own_kind() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("replica");
    let src = dir.path().join("src.ltx");
    // 200 KiB: several age STREAM chunks, so offsets cross chunk boundaries.
    let body: Vec<u8> = (0..200 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &body).unwrap();
    let plain = AnyClient::File(FileClient::new(root.clone()));
    plain.put(0, TxId(1), TxId(1), &src, 0).await.unwrap();
    let keys = keys(dir.path());
    let age = plain.clone().with_age(keys.clone());
    let put = age.put(0, TxId(2), TxId(2), &src, 0).await.unwrap();
    assert!(put.encrypted && put.size > body.len() as u64);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "sealed temporary files left: {leftovers:?}"
    );
    let stored =
        std::fs::read(root.join("ltx/0/0000000000000002-0000000000000002.ltx.age")).unwrap();
    assert!(stored.starts_with(b"age-encryption.org/v1\n"));
    assert!(!stored.windows(64).any(|w| w == &body[1000..1064]));

    let listed = age.list(0).await.unwrap();
    let kinds: Vec<(u64, bool)> = listed.iter().map(|f| (f.min_txid.0, f.encrypted)).collect();
    assert_eq!(kinds, vec![(1, false), (2, true)]);
    // The plain view alone never sees the encrypted file.
    assert_eq!(plain.list(0).await.unwrap().len(), 1);
    for min in [1, 2] {
        assert_eq!(read(&age, min, 0, None).await, body);
        assert_eq!(read(&age, min, 70_000, None).await, &body[70_000..]);
        assert_eq!(
            read(&age, min, 65_530, Some(20)).await,
            &body[65_530..65_550]
        );
        let f = listed.iter().find(|f| f.min_txid.0 == min).unwrap();
        assert_eq!(
            age.read_tail(f, 16).await.unwrap(),
            &body[body.len() - 16..]
        );
    }
    assert!(matches!(
        age.open(0, TxId(3), TxId(3), 0).await,
        Err(StorageError::NotFound(_))
    ));

    // Without identities: a clear permanent error naming how to give one and the
    // recipient from the note.
    let AnyClient::Age(a) = &age else { panic!() };
    a.write_note().await.unwrap();
    let blind = plain.clone().with_age(Arc::new(AgeKeys::default()));
    let Err(e) = blind.open(0, TxId(2), TxId(2), 0).await else {
        panic!("decrypted without an identity")
    };
    let msg = e.to_string();
    assert!(!e.is_retryable());
    assert!(msg.contains("--age-identity"), "{msg}");
    assert!(msg.contains(&keys.recipient_strings()[0]), "{msg}");

    age.delete(&listed).await.unwrap();
    assert!(age.list(0).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_wrap_both_views_and_encryption_still_applies() {
    use crate::storage::faulty::{Faults, FaultyClient};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("replica");
    let src = dir.path().join("src.ltx");
    std::fs::write(&src, b"segment bytes").unwrap();
    let faults = Faults::new();
    let file = AnyClient::File(FileClient::new(root.clone()));
    let c = AnyClient::Faulty(Box::new(FaultyClient::new(file, faults.clone())))
        .with_age(keys(dir.path()));
    assert!(matches!(c, AnyClient::Age(_)));
    faults.fail_next(1);
    assert!(c.put(0, TxId(1), TxId(1), &src, 0).await.is_err());
    c.put(0, TxId(1), TxId(1), &src, 0).await.unwrap();
    assert!(
        root.join("ltx/0/0000000000000001-0000000000000001.ltx.age")
            .exists()
    );
    assert!(
        !root
            .join("ltx/0/0000000000000001-0000000000000001.ltx")
            .exists()
    );
    assert_eq!(faults.injected(), 1);
}

/// A put dropped while its segment is being encrypted (a maintenance job aborted, a
/// shutdown) leaves no sealed copy behind, where the encryption, which goes on, left one as
/// large as the segment until the next start.
#[test]
fn a_put_dropped_while_encrypting_leaves_no_sealed_copy() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.ltx");
    let body: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&src, &body).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dropped = rt.block_on(async {
        let age =
            AnyClient::File(FileClient::new(dir.path().join("replica"))).with_age(keys(dir.path()));
        let put = age.put(0, TxId(1), TxId(1), &src, 0);
        tokio::time::timeout(std::time::Duration::from_millis(20), put).await
    });
    assert!(dropped.is_err(), "the put ended before it was dropped");
    // Waits for the blocking pool: the encryption has ended when this returns.
    drop(rt);
    let sealed: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".age") && n.ends_with(".tmp"))
        .collect();
    assert!(sealed.is_empty(), "left: {sealed:?}");
}
