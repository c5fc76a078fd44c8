//! S3-only tests beside the suite: request shapes, the in-process server, error classes
//! (missing bucket, bad credentials, outage, injected 500s), an aborted multipart overwrite
//! and a GET resumed after its connection drops.

use super::*;

/// The requests the S3 backend makes: a multipart upload above the part size (parts of at
/// most the part size, completed, none aborted, nothing left behind) and at most 1000 keys
/// per DeleteObjects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_request_shapes() {
    let server = S3Server::start().await;
    if !server.counts_requests() {
        return;
    }
    let dir = TestDir::new("conformance-s3-shapes");
    let env = Env::S3 {
        server: &server,
        scratch: dir.path().to_path_buf(),
    };
    let b = env.backend("shapes");
    let n = |op: &str| server.op_count(op);

    // 12 MiB + a little: 3 parts.
    let src = b.scratch.join("big.ltx");
    let bytes = big_object(12 * MIB + 1, 1, 1, now_ms(), 1);
    std::fs::write(&src, &bytes).unwrap();
    b.client
        .put(3, TxId(1), TxId(1), &src, now_ms())
        .await
        .unwrap();
    assert_eq!(
        (
            n("CreateMultipartUpload"),
            n("UploadPart"),
            n("CompleteMultipartUpload"),
            n("AbortMultipartUpload"),
            n("PutObject")
        ),
        (1, 3, 1, 0, 0),
        "multipart requests: {:?}",
        server.requests_by_op()
    );
    let leftovers: Vec<String> = std::fs::read_dir(&server.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("upload"))
        .collect();
    assert!(leftovers.is_empty(), "multipart leftovers: {leftovers:?}");

    // Exactly the part size: one PutObject.
    let exact = vec![7u8; 5 * MIB];
    std::fs::write(&src, &exact).unwrap();
    b.client
        .put(3, TxId(2), TxId(2), &src, now_ms())
        .await
        .unwrap();
    assert_eq!((n("PutObject"), n("CreateMultipartUpload")), (1, 1));

    // 2500 files (2 real): three DeleteObjects calls.
    let mut files: Vec<LtxFileInfo> = (10..2508).map(|i| info(3, i, i)).collect();
    files.extend(b.client.list(3).await.unwrap());
    server.reset_counts();
    b.client.delete(&files).await.unwrap();
    assert_eq!(n("DeleteObjects"), 3, "{:?}", server.requests_by_op());
    assert_eq!(b.client.list(3).await.unwrap(), vec![]);
}

/// The fixture itself: signed requests work and are counted by operation, the data survives a
/// stop, a stopped server refuses connections, and a restart serves on the same port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_server_fixture_smoke() {
    let mut server = S3Server::start().await;
    let sdk = server.sdk();
    let key = server.key("smoke/hello.txt");
    sdk.put_object()
        .bucket(&server.bucket)
        .key(&key)
        .body(b"hello".to_vec().into())
        .send()
        .await
        .unwrap();
    let got = sdk
        .get_object()
        .bucket(&server.bucket)
        .key(&key)
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes();
    assert_eq!(&got[..], b"hello");
    assert_eq!(server.list_keys("smoke/").await, vec!["smoke/hello.txt"]);
    if server.is_external() {
        return;
    }
    assert_eq!(
        std::fs::read(server.object_path("smoke/hello.txt")).unwrap(),
        b"hello"
    );
    let ops = server.requests_by_op();
    assert_eq!(
        (
            ops.get("PutObject"),
            ops.get("GetObject"),
            ops.get("ListObjectsV2")
        ),
        (Some(&1), Some(&1), Some(&1)),
        "{ops:?}"
    );
    assert_eq!(server.request_count(), 3);

    // Unsigned requests are refused (and counted).
    let url = format!("{}/{}/{}", server.endpoint, server.bucket, key);
    let status = raw_get_status(&url).await;
    assert_eq!(status, Some(403), "unsigned GET");
    assert_eq!(server.request_count(), 4);
    assert_eq!(
        server.op_count("GetObject"),
        2,
        "{:?}",
        server.requests_by_op()
    );

    let port = server.endpoint.rsplit(':').next().unwrap().to_string();
    server.stop().await;
    assert!(!server.is_serving());
    assert_eq!(
        raw_get_status(&url).await,
        None,
        "a stopped server accepted a connection"
    );
    server.restart().await;
    assert!(server.endpoint.ends_with(&port));
    let got = sdk
        .get_object()
        .bucket(&server.bucket)
        .key(&key)
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes();
    assert_eq!(&got[..], b"hello", "data after restart");
    server.reset_counts();
    assert_eq!(
        (server.request_count(), server.requests_by_op().len()),
        (0, 0)
    );
}

/// A plain HTTP/1.1 GET; the status, or None if the connection is refused.
async fn raw_get_status(url: &str) -> Option<u16> {
    use tokio::io::AsyncWriteExt;
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = tokio::net::TcpStream::connect(host).await.ok()?;
    s.write_all(
        format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace().nth(1)?.parse().ok()
}

/// A server, a client of it with one object at level 0, and an LTX source file.
async fn errors_fixture(name: &str) -> (S3Server, AnyClient, TestDir, PathBuf) {
    let server = S3Server::start().await;
    let client = s3_client(&server, name);
    let dir = TestDir::new(&format!("conformance-{name}"));
    let src = dir.join("a.ltx");
    std::fs::write(&src, ltx_file(1, 1, 1, 4096, now_ms(), 1)).unwrap();
    client
        .put(0, TxId(1), TxId(1), &src, now_ms())
        .await
        .unwrap();
    (server, client, dir, src)
}

/// A client of `server` with a different bucket or secret.
fn s3_client_with(server: &S3Server, prefix: &str, bucket: &str, secret: &str) -> AnyClient {
    let cfg = S3Config::from_url(&server.url(prefix)).unwrap();
    AnyClient::S3(S3Client::new(S3Config {
        bucket: bucket.to_string(),
        access_key_id: Some(server.access_key.clone()),
        secret_access_key: Some(Secret(secret.to_string())),
        part_size: 5 * MIB as u64,
        ..cfg
    }))
}

/// A missing bucket must not look like an empty replica or a missing object: no retry helps,
/// and the error says what is wrong (the bucket, not some key, is missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_missing_bucket_is_permanent() {
    let (server, _client, _dir, src) = errors_fixture("s3-nobucket").await;
    let nob = s3_client_with(
        &server,
        "x",
        &format!("replicad-no-such-bucket-{:08x}", rand::random::<u32>()),
        &server.secret_key,
    );
    let mut wrong = Vec::new();
    for (op, r) in [
        ("list", nob.list(0).await.map(|_| ())),
        ("open", nob.open(0, TxId(1), TxId(1), 0).await.map(|_| ())),
        (
            "put",
            nob.put(0, TxId(1), TxId(1), &src, now_ms())
                .await
                .map(|_| ()),
        ),
        ("delete", nob.delete(&[info(0, 1, 1)]).await),
    ] {
        match r {
            Err(e @ StorageError::Permanent { .. }) if e.to_string().contains("NoSuchBucket") => {
                eprintln!("missing bucket, {op}: {e}")
            }
            other => wrong.push(format!("{op}: {other:?}")),
        }
    }
    assert!(
        wrong.is_empty(),
        "on a missing bucket, expected Permanent errors that say NoSuchBucket, got:\n{}",
        wrong.join("\n")
    );
}

/// Bad credentials are permanent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_bad_credentials_are_permanent() {
    let (server, _client, _dir, src) = errors_fixture("s3-badcreds").await;
    let bad = s3_client_with(&server, "s3-badcreds", &server.bucket, "wrong-secret");
    for (op, r) in [
        ("list", bad.list(0).await.map(|_| ())),
        ("open", bad.open(0, TxId(1), TxId(1), 0).await.map(|_| ())),
        (
            "put",
            bad.put(0, TxId(2), TxId(2), &src, now_ms())
                .await
                .map(|_| ()),
        ),
        ("delete", bad.delete(&[info(0, 1, 1)]).await),
    ] {
        match r {
            Err(e @ StorageError::Permanent { .. }) => {
                let shown = format!("{e} {e:?} {bad:?} {}", bad.location());
                assert!(
                    !shown.contains("wrong-secret"),
                    "{op}: the secret is shown: {shown}"
                );
                eprintln!("wrong secret, {op}: {e}")
            }
            other => panic!("{op} with a wrong secret: expected Permanent, got {other:?}"),
        }
    }
    eprintln!(
        "requests: {} in all, by op {:?}",
        server.request_count(),
        server.requests_by_op()
    );
}

/// A stopped server is a retryable error for every operation; after a restart on the same
/// port the same client works again (its pooled connections are dead by then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_outage_is_transient_and_recovers() {
    let (mut server, client, _dir, src) = errors_fixture("s3-outage").await;
    if server.is_external() {
        return;
    }
    server.stop().await;
    let t0 = std::time::Instant::now();
    // Concurrently: each call spends the SDK's retries (about 2 s) before it gives up.
    let gone = [info(0, 1, 1)];
    let (l, o, p, d) = tokio::join!(
        client.list(0),
        client.open(0, TxId(1), TxId(1), 0),
        client.put(0, TxId(2), TxId(2), &src, now_ms()),
        client.delete(&gone),
    );
    for (op, r) in [
        ("list", l.map(|_| ())),
        ("open", o.map(|_| ())),
        ("put", p.map(|_| ())),
        ("delete", d),
    ] {
        match r {
            Err(e) if e.is_retryable() => eprintln!("server down, {op}: {e}"),
            other => panic!("{op} with the server down: expected a retryable error, got {other:?}"),
        }
    }
    eprintln!("4 calls against a stopped server took {:?}", t0.elapsed());
    server.restart().await;
    assert_eq!(
        ranges(&client.list(0).await.unwrap()),
        vec![(0, 1, 1)],
        "list after restart"
    );
    assert_eq!(
        read_all_client(&client, 0, 1, 1).await.len() as u64,
        std::fs::metadata(&src).unwrap().len()
    );
}

async fn read_all_client(c: &AnyClient, level: u8, min: u64, max: u64) -> Vec<u8> {
    let mut r = c.open(level, TxId(min), TxId(max), 0).await.unwrap();
    let mut v = Vec::new();
    r.read_to_end(&mut v).await.unwrap();
    v
}

/// A GET whose connection drops mid-body is resumed from the byte reached, and the reader
/// sees every byte exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_read_resumes_after_connection_drop() {
    let mut server = S3Server::start().await;
    if server.is_external() {
        return;
    }
    let client = s3_client(&server, "resume");
    let dir = TestDir::new("conformance-s3-resume");
    let src = dir.join("big.ltx");
    // 32 MiB: more than the socket buffers between client and server hold.
    let bytes = big_object(32 * MIB, 1, 1, now_ms(), 9);
    std::fs::write(&src, &bytes).unwrap();
    client
        .put(3, TxId(1), TxId(1), &src, now_ms())
        .await
        .unwrap();
    server.reset_counts();

    let mut r = client.open(3, TxId(1), TxId(1), 0).await.unwrap();
    let mut got = vec![0u8; MIB];
    r.read_exact(&mut got).await.unwrap();
    server.stop().await;
    server.restart().await;
    r.read_to_end(&mut got)
        .await
        .unwrap_or_else(|e| panic!("read after the drop: {e}"));
    assert_bytes("resumed read", &got, &bytes);
    assert!(
        server.op_count("GetObject") >= 2,
        "the body was never cut (all buffered before the stop?): {:?}",
        server.requests_by_op()
    );
}

/// Server errors: a single one is retried by the client and the put lands; persistent ones
/// on a multipart upload fail the put with a retryable error, abort the upload, and leave the
/// previous version of the object whole and no parts behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_server_errors_retry_then_abort_cleanly() {
    let server = S3Server::start().await;
    if server.is_external() {
        return;
    }
    let client = s3_client(&server, "faults");
    let dir = TestDir::new("conformance-s3-faults");
    let src = dir.join("src.ltx");

    // One 500 on PutObject: retried, lands.
    let small = ltx_file(1, 5, 3, 4096, now_ms(), 1);
    std::fs::write(&src, &small).unwrap();
    server.fail_next("PutObject", 1);
    client
        .put(3, TxId(1), TxId(5), &src, now_ms())
        .await
        .unwrap_or_else(|e| panic!("put after one server error: {e:?}"));
    assert_eq!(
        (
            server.op_count("PutObject"),
            server.failures_left("PutObject")
        ),
        (2, 0),
        "{:?}",
        server.requests_by_op()
    );

    // UploadPart always fails: the large overwrite fails, retryable, and is aborted.
    let big = big_object(12 * MIB, 1, 5, now_ms(), 2);
    std::fs::write(&src, &big).unwrap();
    server.fail_next("UploadPart", 1_000);
    let r = client.put(3, TxId(1), TxId(5), &src, now_ms()).await;
    server.fail_next("UploadPart", 0);
    match r {
        Err(e) if e.is_retryable() => eprintln!("put with failing parts: {e}"),
        other => panic!("put with failing parts: expected a retryable error, got {other:?}"),
    }
    let ops = server.requests_by_op();
    assert_eq!(
        (
            ops.get("CreateMultipartUpload"),
            ops.get("CompleteMultipartUpload"),
            ops.get("AbortMultipartUpload")
        ),
        (Some(&1), None, Some(&1)),
        "{ops:?}"
    );
    let l = client.list(3).await.unwrap();
    assert_eq!(
        (ranges(&l), l[0].size),
        (vec![(3, 1, 5)], small.len() as u64),
        "the failed overwrite replaced the object"
    );
    assert_bytes(
        "object after a failed overwrite",
        &read_all_client(&client, 3, 1, 5).await,
        &small,
    );
    let leftovers: Vec<String> = std::fs::read_dir(&server.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("upload"))
        .collect();
    assert!(leftovers.is_empty(), "multipart leftovers: {leftovers:?}");

    // And with the server healthy again the same put goes through.
    client
        .put(3, TxId(1), TxId(5), &src, now_ms())
        .await
        .unwrap();
    assert_bytes(
        "object after the retried overwrite",
        &read_all_client(&client, 3, 1, 5).await,
        &big,
    );

    // Persistent errors on list and get: retryable.
    server.fail_next("ListObjectsV2", 1_000);
    server.fail_next("GetObject", 1_000);
    let (l, o) = tokio::join!(client.list(3), client.open(3, TxId(1), TxId(5), 0));
    for (op, r) in [("list", l.map(|_| ())), ("open", o.map(|_| ()))] {
        match r {
            Err(e) if e.is_retryable() => eprintln!("{op} with server errors: {e}"),
            other => panic!("{op} with server errors: expected a retryable error, got {other:?}"),
        }
    }
}

/// A segment uploaded while it is staged (`put_streamed`): parts go out as soon as the file
/// holds them, but no object exists until the segment is published; then the object is the
/// file, byte for byte. A segment that fails mid-write leaves no object and no parts; one that
/// ends within a part stores nothing (the plain put takes over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_streamed_upload_completes_only_once_published() {
    use replicad::storage::feed::{GrowingSegment, SegmentFeed};
    use std::io::Write;

    let server = S3Server::start().await;
    if !server.counts_requests() {
        return;
    }
    let client = s3_client(&server, "streamed");
    assert!(client.streaming().is_some(), "a plain S3 client streams");
    let dir = TestDir::new("conformance-s3-streamed");
    let feed = SegmentFeed::default();
    let _follower = feed.subscribe();
    let bytes = big_object(17 * MIB + 3, 1, 1, now_ms(), 7);
    let uploads_left = || -> Vec<String> {
        std::fs::read_dir(&server.root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("upload"))
            .collect()
    };

    // Published: parts before publication, the object only after.
    let (seg, mut tap) = growing(&dir.join("1.tmp"), 1, 1_700_000_000_123);
    let announced = feed.announce(seg.clone());
    let upload = tokio::spawn(s3_streamed_put(client.clone(), seg.clone()));
    tap.write_all(&bytes[..11 * MIB]).unwrap();
    tap.flush().unwrap();
    wait_parts(&server, 2).await;
    assert_eq!(server.op_count("CompleteMultipartUpload"), 0);
    assert_eq!(
        client.list(0).await.unwrap(),
        vec![],
        "an object before publication"
    );
    tap.write_all(&bytes[11 * MIB..]).unwrap();
    tap.flush().unwrap();
    wait_parts(&server, 3).await;
    assert_eq!(server.op_count("CompleteMultipartUpload"), 0);
    announced.published(bytes.len() as u64);
    let info = upload.await.unwrap().unwrap().expect("a stored object");
    assert_eq!(
        (info.level, info.min_txid, info.max_txid, info.size),
        (0, TxId(1), TxId(1), bytes.len() as u64)
    );
    assert_eq!(
        (
            server.op_count("CreateMultipartUpload"),
            server.op_count("UploadPart"),
            server.op_count("CompleteMultipartUpload")
        ),
        (1, 4, 1),
        "{:?}",
        server.requests_by_op()
    );
    assert_bytes(
        "streamed object",
        &read_all_client(&client, 0, 1, 1).await,
        &bytes,
    );
    // s3s-fs keeps user metadata beside the object, in a JSON file (the only object yet).
    let meta: Vec<String> = std::fs::read_dir(&server.root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.ends_with(".metadata.json")
        })
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert!(
        meta.len() == 1 && meta[0].contains("2023-11-14T22:13:20.123"),
        "litestream-timestamp is not the header's: {meta:?}"
    );
    assert!(
        uploads_left().is_empty(),
        "multipart leftovers: {:?}",
        uploads_left()
    );

    // Failed mid-write (the guard dropped unpublished): aborted, nothing stored.
    server.reset_counts();
    let tmp = dir.join("2.tmp");
    let (seg, mut tap) = growing(&tmp, 2, now_ms());
    let announced = feed.announce(seg.clone());
    let upload = tokio::spawn(s3_streamed_put(client.clone(), seg.clone()));
    tap.write_all(&bytes[..11 * MIB]).unwrap();
    tap.flush().unwrap();
    wait_parts(&server, 2).await;
    drop(announced);
    assert_eq!(upload.await.unwrap().unwrap(), None);
    assert_eq!(
        (
            server.op_count("CompleteMultipartUpload"),
            server.op_count("AbortMultipartUpload")
        ),
        (0, 1),
        "{:?}",
        server.requests_by_op()
    );
    assert_eq!(ranges(&client.list(0).await.unwrap()), vec![(0, 1, 1)]);
    assert!(
        uploads_left().is_empty(),
        "multipart leftovers: {:?}",
        uploads_left()
    );

    // Ended within one part: no request at all.
    server.reset_counts();
    let seg = GrowingSegment::new(TxId(3), now_ms(), std::fs::File::open(&tmp).unwrap());
    let announced = feed.announce(seg.clone());
    let upload = {
        let seg = seg.clone();
        tokio::spawn(async move { s3_streamed_put(client, seg).await })
    };
    seg.wrote(MIB as u64);
    announced.published(2 * MIB as u64);
    assert_eq!(upload.await.unwrap().unwrap(), None);
    assert_eq!(server.request_count(), 0, "{:?}", server.requests_by_op());
}

/// A growing segment at `tmp` (created empty) and the tap that writes it.
fn growing(
    tmp: &Path,
    txid: u64,
    timestamp_ms: i64,
) -> (
    std::sync::Arc<replicad::storage::feed::GrowingSegment>,
    replicad::storage::feed::Tap<std::fs::File>,
) {
    let file = std::fs::File::create(tmp).unwrap();
    let seg = replicad::storage::feed::GrowingSegment::new(
        TxId(txid),
        timestamp_ms,
        std::fs::File::open(tmp).unwrap(),
    );
    let tap = replicad::storage::feed::Tap::new(file, Some(seg.clone()));
    (seg, tap)
}

async fn s3_streamed_put(
    client: AnyClient,
    seg: std::sync::Arc<replicad::storage::feed::GrowingSegment>,
) -> Result<Option<LtxFileInfo>, StorageError> {
    client.streaming().unwrap().put_streamed(0, &seg).await
}

async fn wait_parts(server: &S3Server, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while server.op_count("UploadPart") < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} parts never went out: {:?}",
            server.requests_by_op()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
