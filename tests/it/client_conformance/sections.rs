//! The suite's sections: each runs against a fresh replica of one backend (see the parent
//! module's doc for what each checks).

use super::*;

/// A level removed behind the client's back (someone emptied the replica) takes new puts
/// again: backends that cache the directories they made make them again.
pub(super) async fn put_after_the_level_vanished(b: &Backend<'_>) {
    let name = b.name();
    put(b, &Put::new(5, 1, 1, 1, 90)).await.unwrap();
    b.remove_level(5).await;
    assert_eq!(list(b, 5).await, vec![], "{name}: level 5 removed");
    let again = Put::new(5, 2, 2, 1, 91);
    put(b, &again)
        .await
        .unwrap_or_else(|e| panic!("{name}: put after the level vanished: {e}"));
    assert_eq!(ranges(&list(b, 5).await), vec![(5, 2, 2)], "{name}");
    assert_bytes(name, &read_all(b, 5, 2, 2, 0).await, &again.bytes);
}

/// Auxiliary objects (the single-writer lease): missing reads as `None`, a write replaces the
/// whole object, listings never show it, delete tolerates a missing one.
pub(super) async fn aux_objects_round_trip_beside_the_levels(b: &Backend<'_>) {
    let name = b.name();
    let c = &b.client;
    assert_eq!(
        c.read_aux("replicad.lease").await.unwrap(),
        None,
        "{name}: missing"
    );
    c.write_aux("replicad.lease", b"first, longer value".to_vec())
        .await
        .unwrap();
    c.write_aux("replicad.lease", b"second".to_vec())
        .await
        .unwrap();
    assert_eq!(
        c.read_aux("replicad.lease").await.unwrap().as_deref(),
        Some(&b"second"[..]),
        "{name}: a rewrite replaces the whole object"
    );
    assert_eq!(
        c.list_all().await.unwrap(),
        vec![],
        "{name}: listed an aux object"
    );
    c.delete_aux("replicad.lease").await.unwrap();
    assert_eq!(
        c.read_aux("replicad.lease").await.unwrap(),
        None,
        "{name}: deleted"
    );
    c.delete_aux("replicad.lease").await.unwrap();
}

/// An empty replica: every level lists empty.
pub(super) async fn empty_replica(b: &Backend<'_>) {
    let name = b.name();
    assert_eq!(
        b.client.list_all().await.unwrap(),
        vec![],
        "{name}: empty replica"
    );
    for level in [0, 1, 9] {
        assert_eq!(list(b, level).await, vec![], "{name}: empty level {level}");
    }
}

/// Puts out of order on three levels: list sorts by (min, max), keeps to its level, has the
/// right sizes and sane times; put returns the same; headers read back.
pub(super) async fn put_then_list_by_level_sorted(b: &Backend<'_>) {
    let name = b.name();
    let puts = [
        Put::new(0, 5, 9, 3, 1),
        Put::new(0, 2, 4, 2, 2),
        Put::new(0, 5, 5, 1, 3),
        Put::new(0, 1, 1, 4, 4),
        Put::new(1, 1, 9, 1, 5),
        Put::new(9, 1, 9, 6, 6),
    ];
    let before = now_ms();
    for p in &puts {
        let got = put(b, p)
            .await
            .unwrap_or_else(|e| panic!("{name}: put {}: {e}", p.name()));
        let after = now_ms();
        assert_eq!(
            (
                got.level,
                got.min_txid.0,
                got.max_txid.0,
                b.plain_size(&got).await
            ),
            (p.level, p.min, p.max, p.bytes.len() as u64),
            "{name}: put {} returned the wrong info",
            p.name()
        );
        assert_created_sane(
            &format!("{name}: put {} result", p.name()),
            got.created_at,
            p.ts,
            (before, after),
        );
    }
    let after = now_ms();
    assert_eq!(
        ranges(&list(b, 0).await),
        vec![(0, 1, 1), (0, 2, 4), (0, 5, 5), (0, 5, 9)],
        "{name}: level 0 listing"
    );
    assert_eq!(
        ranges(&list(b, 1).await),
        vec![(1, 1, 9)],
        "{name}: level 1 listing"
    );
    assert_eq!(
        ranges(&list(b, 9).await),
        vec![(9, 1, 9)],
        "{name}: level 9 listing"
    );
    for level in [2, 8] {
        assert_eq!(
            list(b, level).await,
            vec![],
            "{name}: level {level} must be empty"
        );
    }
    let all = b.client.list_all().await.unwrap();
    assert_eq!(
        ranges(&all),
        vec![
            (0, 1, 1),
            (0, 2, 4),
            (0, 5, 5),
            (0, 5, 9),
            (1, 1, 9),
            (9, 1, 9)
        ],
        "{name}: list_all"
    );
    for f in &all {
        let p = puts
            .iter()
            .find(|p| (p.level, p.min, p.max) == (f.level, f.min_txid.0, f.max_txid.0))
            .unwrap();
        assert_eq!(
            b.plain_size(f).await,
            p.bytes.len() as u64,
            "{name}: listed size of {}",
            p.name()
        );
        assert_created_sane(
            &format!("{name}: listed {}", p.name()),
            f.created_at,
            p.ts,
            (before, after),
        );
        let h = b
            .client
            .read_header(f)
            .await
            .unwrap_or_else(|e| panic!("{name}: read_header {}: {e}", p.name()));
        assert_eq!(
            (h.min_txid.0, h.max_txid.0, h.timestamp),
            (p.min, p.max, p.ts),
            "{name}: header of {}",
            p.name()
        );
    }
}

/// Reads: whole, and tails from several offsets (ranged GETs on S3).
pub(super) async fn open_reads_exact_bytes_and_tails(b: &Backend<'_>) {
    let name = b.name();
    let puts = [Put::new(0, 1, 1, 1, 10), Put::new(0, 2, 3, 7, 11)];
    for p in &puts {
        put(b, p).await.unwrap();
    }
    for p in &puts {
        let whole = read_all(b, p.level, p.min, p.max, 0).await;
        assert_bytes(&format!("{name}: read {}", p.name()), &whole, &p.bytes);
        let n = p.bytes.len() as u64;
        for off in [1, 100, n / 2, n - 16, n - 1] {
            let tail = read_all(b, p.level, p.min, p.max, off).await;
            assert_bytes(
                &format!("{name}: read {} from {off}", p.name()),
                &tail,
                &p.bytes[off as usize..],
            );
        }
    }
}

/// "From byte offset to its end" with offset = size is an empty body.
pub(super) async fn open_at_the_end_is_empty(b: &Backend<'_>) {
    let name = b.name();
    let p = Put::new(0, 1, 1, 2, 20);
    put(b, &p).await.unwrap();
    let n = p.bytes.len() as u64;
    match b.client.open(p.level, TxId(p.min), TxId(p.max), n).await {
        Ok(mut r) => {
            let mut v = Vec::new();
            r.read_to_end(&mut v).await.unwrap();
            assert!(
                v.is_empty(),
                "{name}: read from the end gave {} bytes",
                v.len()
            );
        }
        Err(e) => panic!(
            "{name}: open {} at offset {n} (its size) must give an empty body, got {e:?}",
            p.name()
        ),
    }
}

/// Missing objects are NotFound: in a level that has files, in one that has none, and for
/// read_header.
pub(super) async fn open_missing_is_not_found(b: &Backend<'_>) {
    let name = b.name();
    assert_not_found(
        &format!("{name}: open on an empty replica"),
        b.client.open(0, TxId(1), TxId(1), 0).await,
    );
    put(b, &Put::new(0, 1, 1, 1, 30)).await.unwrap();
    assert_not_found(
        &format!("{name}: open missing L0"),
        b.client.open(0, TxId(3), TxId(3), 0).await,
    );
    assert_not_found(
        &format!("{name}: open missing L0 at an offset"),
        b.client.open(0, TxId(3), TxId(3), 10).await,
    );
    assert_not_found(
        &format!("{name}: open missing L6"),
        b.client.open(6, TxId(1), TxId(1), 0).await,
    );
    assert_not_found(
        &format!("{name}: read_header of a missing file"),
        b.client.read_header(&info(0, 2, 3)).await,
    );
}

/// A failed put (missing source) is an error, not retryable, and leaves nothing behind.
pub(super) async fn failed_put_leaves_nothing(b: &Backend<'_>) {
    let name = b.name();
    let missing = b.scratch.join("no-such-source.ltx");
    let r = b.client.put(6, TxId(1), TxId(1), &missing, now_ms()).await;
    match &r {
        Err(e) => assert!(
            !e.is_retryable(),
            "{name}: missing source is retryable: {e:?}"
        ),
        Ok(_) => panic!("{name}: put from a missing source succeeded: {r:?}"),
    }
    assert_eq!(
        list(b, 6).await,
        vec![],
        "{name}: a failed put left an object"
    );
}

/// A put never replaces an object where the backend can check that atomically (a file
/// replica always; S3 once the lease's probe found conditional writes honoured, which
/// s3s-fs, MinIO, R2 and AWS do): a second put of other bytes is a `Conflict` and the first
/// object stays whole, and `put_new` of the very same bytes again (a retry whose first answer
/// was lost) succeeds.
pub(super) async fn put_never_replaces_an_object(b: &Backend<'_>) {
    let name = b.name();
    // The probe the lease makes at acquire: it turns S3's conditional puts on.
    let _ = b
        .client
        .write_aux_if(
            "replicad.lease",
            b"probe".to_vec(),
            WriteIf::Version(PROBE_VERSION.into()),
        )
        .await;
    let first = Put::new(6, 10, 20, 8, 60);
    put(b, &first).await.unwrap();
    for (i, pages) in [2u32, 12].into_iter().enumerate() {
        let p = Put::new(6, 10, 20, pages, 61 + i as u64);
        let r = put(b, &p).await;
        assert!(
            matches!(r, Err(StorageError::Conflict { .. })),
            "{name}: put {i} over an existing object: {r:?}"
        );
        let l = list(b, 6).await;
        assert_eq!(ranges(&l), vec![(6, 10, 20)], "{name}: listing after {i}");
        assert_eq!(b.plain_size(&l[0]).await, first.bytes.len() as u64);
        let got = read_all(b, 6, 10, 20, 0).await;
        assert_bytes(&format!("{name}: after put {i}"), &got, &first.bytes);
    }
    let src = b.scratch.join("same-again.ltx");
    std::fs::write(&src, &first.bytes).unwrap();
    let again = put_new(&b.client, 6, TxId(10), TxId(20), &src, first.ts).await;
    assert!(again.is_ok(), "{name}: the same bytes again: {again:?}");
    let other = b.scratch.join("other.ltx");
    std::fs::write(&other, Put::new(6, 10, 20, 3, 70).bytes).unwrap();
    let r = put_new(&b.client, 6, TxId(10), TxId(20), &other, first.ts).await;
    assert!(
        matches!(r, Err(StorageError::Conflict { .. })),
        "{name}: put_new of other bytes: {r:?}"
    );
}

/// Deletes: present and missing files in one call (in a level with files and in a level
/// that never had any); an empty call; a repeat; by listed info.
pub(super) async fn delete_removes_and_tolerates_missing(b: &Backend<'_>) {
    let name = b.name();
    put(b, &Put::new(0, 1, 1, 1, 69)).await.unwrap();
    let l7: Vec<Put> = (1..=4).map(|i| Put::new(7, i, i, 1, 70 + i)).collect();
    for p in &l7 {
        put(b, p).await.unwrap();
    }
    b.client
        .delete(&[info(7, 2, 2), info(7, 9, 9), info(7, 4, 4)])
        .await
        .unwrap_or_else(|e| panic!("{name}: delete of present and missing files: {e:?}"));
    assert_eq!(
        ranges(&list(b, 7).await),
        vec![(7, 1, 1), (7, 3, 3)],
        "{name}: after delete"
    );
    assert_not_found(
        &format!("{name}: open deleted"),
        b.client.open(7, TxId(2), TxId(2), 0).await,
    );
    b.client
        .delete(&[])
        .await
        .unwrap_or_else(|e| panic!("{name}: delete of nothing: {e:?}"));
    b.client
        .delete(&[info(7, 2, 2)])
        .await
        .unwrap_or_else(|e| panic!("{name}: delete of a deleted file: {e:?}"));
    let rest = list(b, 7).await;
    b.client.delete(&rest).await.unwrap();
    assert_eq!(
        list(b, 7).await,
        vec![],
        "{name}: level 7 after deleting all"
    );
    assert_eq!(
        ranges(&list(b, 0).await),
        vec![(0, 1, 1)],
        "{name}: delete touched level 0"
    );
    // A level that never had a file.
    b.client
        .delete(&[info(8, 1, 1)])
        .await
        .unwrap_or_else(|e| panic!("{name}: delete in a level that has no files: {e:?}"));
}

/// 16 concurrent puts all land whole.
pub(super) async fn concurrent_puts_all_land(b: &Backend<'_>) {
    let name = b.name();
    let conc: Vec<Put> = (0..16u64)
        .map(|i| Put::new(2, i * 10 + 1, i * 10 + 10, 1 + (i as u32 % 5), 200 + i))
        .collect();
    let mut set = tokio::task::JoinSet::new();
    for (i, p) in conc.iter().enumerate() {
        let client = b.client.clone();
        let src = b.scratch.join(format!("conc-{i}"));
        std::fs::write(&src, &p.bytes).unwrap();
        let (level, min, max, ts) = (p.level, p.min, p.max, p.ts);
        set.spawn(async move { client.put(level, TxId(min), TxId(max), &src, ts).await });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap()
            .unwrap_or_else(|e| panic!("{name}: concurrent put: {e}"));
    }
    let l2 = list(b, 2).await;
    assert_eq!(
        ranges(&l2),
        conc.iter().map(|p| (2, p.min, p.max)).collect::<Vec<_>>(),
        "{name}: concurrent puts listing"
    );
    for (f, p) in l2.iter().zip(&conc) {
        assert_eq!(
            b.plain_size(f).await,
            p.bytes.len() as u64,
            "{name}: size of {}",
            p.name()
        );
        let got = read_all(b, 2, p.min, p.max, 0).await;
        assert_bytes(&format!("{name}: concurrent {}", p.name()), &got, &p.bytes);
    }
}

/// A ~12 MiB object (above the 5 MiB part size: a multipart upload on S3) round-trips, whole
/// and from inside its second part.
pub(super) async fn large_object_round_trips(b: &Backend<'_>) {
    let name = b.name();
    let ts = now_ms();
    let bytes = big_object(12 * MIB + 4321, 100, 200, ts, 300);
    let big = Put {
        level: 3,
        min: 100,
        max: 200,
        bytes,
        ts,
    };
    let got = put(b, &big)
        .await
        .unwrap_or_else(|e| panic!("{name}: put of {} bytes: {e}", big.bytes.len()));
    assert_eq!(
        b.plain_size(&got).await,
        big.bytes.len() as u64,
        "{name}: put result size"
    );
    let l3 = list(b, 3).await;
    assert_eq!(
        ranges(&l3),
        vec![(3, 100, 200)],
        "{name}: large object listing"
    );
    assert_eq!(
        b.plain_size(&l3[0]).await,
        big.bytes.len() as u64,
        "{name}: large object size"
    );
    let got = read_all(b, 3, 100, 200, 0).await;
    assert_bytes(&format!("{name}: large object"), &got, &big.bytes);
    let off = 5 * MIB as u64 + 12_345;
    let got = read_all(b, 3, 100, 200, off).await;
    assert_bytes(
        &format!("{name}: large object from {off}"),
        &got,
        &big.bytes[off as usize..],
    );
    let h = b.client.read_header(&l3[0]).await.unwrap();
    assert_eq!((h.max_txid, h.timestamp), (TxId(200), ts));
}

/// Foreign names in a level are skipped; a replica whose location extends this one's
/// (`.../app.db2`) is a different replica.
pub(super) async fn foreign_names_are_skipped(b: &Backend<'_>) {
    let name = b.name();
    put(b, &Put::new(4, 1, 2, 1, 400)).await.unwrap();
    let foreign = [
        "notes.txt",
        "0000000000000003-0000000000000004.ltx.tmp",
        "0000000000000003-0000000000000004.ltx.12345.tmp",
        "000000000000000A-000000000000000B.ltx",
        "3-4.ltx",
        "0000000000000003-0000000000000004",
        "0000000000000003_0000000000000004.ltx",
        "sub/0000000000000005-0000000000000006.ltx",
    ];
    for f in foreign {
        b.plant(4, f, b"not an ltx file").await;
    }
    let sibling = b.sibling();
    let src = b.scratch.join("sibling.ltx");
    std::fs::write(&src, ltx_file(7, 8, 1, 4096, now_ms(), 401)).unwrap();
    sibling
        .put(4, TxId(7), TxId(8), &src, now_ms())
        .await
        .unwrap();
    assert_eq!(
        ranges(&list(b, 4).await),
        vec![(4, 1, 2)],
        "{name}: foreign names or a sibling replica listed"
    );
    assert_eq!(
        ranges(&sibling.list(4).await.unwrap()),
        vec![(4, 7, 8)],
        "{name}: sibling listing"
    );
    let all = b.client.list_all().await.unwrap();
    assert_eq!(
        ranges(&all),
        vec![(4, 1, 2)],
        "{name}: list_all with foreign names"
    );
}

/// Listings longer than one S3 page (1000 keys) are complete and sorted; one delete call
/// removes them all.
pub(super) async fn many_files_list_and_delete(b: &Backend<'_>) {
    let name = b.name();
    let many: Vec<String> = (1..=1100u64)
        .map(|i| ltx::format_filename(TxId(i * 2), TxId(i * 2 + 1)))
        .collect();
    b.plant_many(5, &many).await;
    let l5 = list(b, 5).await;
    assert_eq!(
        l5.len(),
        many.len(),
        "{name}: listing of {} files",
        many.len()
    );
    assert!(
        l5.windows(2).all(|w| w[0].min_txid < w[1].min_txid),
        "{name}: long listing not sorted"
    );
    assert_eq!((l5[0].min_txid, l5[1099].max_txid), (TxId(2), TxId(2201)));
    b.client.delete(&l5).await.unwrap();
    assert_eq!(
        list(b, 5).await,
        vec![],
        "{name}: level 5 after deleting {} files",
        l5.len()
    );
}

/// The temporary files of interrupted writes (a put's in a level, Litestream's `<name>.tmp`, a
/// lease write's at the root) are removed once older than the sweep's age, and nothing else:
/// not a fresh one, not a foreign name, not an object. A put's file whose modification time
/// is old but which was made now (SFTP sets the LTX timestamp before publishing; a directory
/// replica hard-links a staged segment) is kept. S3, GCS and Azure keep none.
pub(super) async fn leftover_tmp_files_are_swept(b: &Backend<'_>) {
    let name = b.name();
    put(b, &Put::new(6, 1, 2, 1, 600)).await.unwrap();
    let keeps_tmp = match &b.kind {
        Kind::File { .. } | Kind::Sftp { .. } => true,
        Kind::Object { emu, .. } => emu.name() == "webdav",
        Kind::S3 { .. } => false,
    };
    if !keeps_tmp {
        let n = b.client.sweep_tmp(Duration::ZERO).await.unwrap();
        assert_eq!(
            n,
            Swept::default(),
            "{name}: swept (or said it listed) where no write leaves a temporary file"
        );
        return;
    }
    let l = Some(6);
    let old = [
        (
            l,
            "0000000000000003-0000000000000004.ltx.4242.1700000000000000000.tmp",
        ),
        (l, "0000000000000005-0000000000000006.ltx.tmp"),
        (
            l,
            "0000000000000007-0000000000000008.ltx.4242-0123456789abcdef.tmp",
        ),
        (None, "replicad.lease.4242-0123456789abcdef.tmp"),
    ];
    let foreign = [
        (l, "notes.tmp"),
        (l, "3-4.ltx.tmp"),
        (None, "notes.tmp"),
        (None, "replicad.lease.tmp"),
        (None, "app.db.4242-0123456789abcdef"),
        (None, "backup.2024-0123456789abcdef.tmp"),
        // A directory (a collection on WebDAV, listed recursively) under an LTX-like name.
        (l, "0000000000000011-0000000000000011.ltx.d/x.tmp"),
    ];
    for (level, n) in old.iter().chain(&foreign) {
        b.plant_tmp(*level, n).await;
    }
    // Modification times have a resolution of a second on SFTP and WebDAV: the old files are
    // at least 4 s old at the sweep, the fresh ones less than 3 s unless planting them and
    // sweeping takes 2 s.
    tokio::time::sleep(Duration::from_millis(4200)).await;
    let now_ns = Utc::now().timestamp_nanos_opt().unwrap();
    let made_now = format!("0000000000000009-000000000000000a.ltx.4242.{now_ns}.tmp");
    let fresh = [
        (l, made_now.clone()),
        (None, "replicad.lease.4242-fedcba9876543210.tmp".to_string()),
    ];
    for (level, n) in &fresh {
        b.plant_tmp(*level, n).await;
    }
    if !matches!(b.kind, Kind::Object { .. }) {
        // Old by its modification time, made now by its name (SFTP) or inode change (file).
        let f = std::fs::File::options()
            .write(true)
            .open(b.tmp_location(l, &made_now))
            .unwrap();
        f.set_modified(std::time::SystemTime::now() - Duration::from_secs(2 * 86_400))
            .unwrap();
    }
    let swept = b.client.sweep_tmp(Duration::from_secs(3)).await.unwrap();
    for (level, n) in &old {
        assert!(!b.tmp_exists(*level, n).await, "{name}: {n} left");
    }
    for (level, n) in foreign
        .iter()
        .map(|(l, n)| (*l, n.to_string()))
        .chain(fresh)
    {
        assert!(b.tmp_exists(level, &n).await, "{name}: {n} removed");
    }
    let want = Swept {
        removed: old.len(),
        young: 2,
        listed: true,
    };
    assert_eq!(swept, want, "{name}: what the sweep said");
    assert_eq!(ranges(&list(b, 6).await), vec![(6, 1, 2)], "{name}");
    let again = b.client.sweep_tmp(Duration::from_secs(3)).await.unwrap();
    assert_eq!(again.removed, 0, "{name}: a second sweep");
}

/// Encrypted files (`<min>-<max>.ltx.age`, written through the age wrapper) are deleted under
/// their own names: the backend's delete follows each file's `encrypted` flag, and the
/// wrapper's delete (both names of a range) leaves neither. A backend that deleted only the
/// plain name kept every encrypted file for ever, and a failed snapshot could not be replaced.
pub(super) async fn encrypted_files_are_deleted_under_their_own_names(b: &Backend<'_>) {
    let name = b.name();
    if b.age {
        return; // Already the wrapper: its delete is what every other section checks.
    }
    let (identity, public) = replicad::storage::age::keys::generate_identity();
    let id = b.scratch.join("age-identity.txt");
    std::fs::write(&id, identity).unwrap();
    let keys = replicad::storage::age::keys::AgeKeys::load(&[public], &[id.display().to_string()])
        .unwrap();
    let sealed = b.client.clone().with_age(std::sync::Arc::new(keys));
    for i in 1..=3u64 {
        let p = Put::new(6, i, i, 1, 95 + i);
        let src = b.scratch.join(format!("sealed-src-{i}"));
        std::fs::write(&src, &p.bytes).unwrap();
        let got = sealed.put(6, TxId(i), TxId(i), &src, p.ts).await;
        std::fs::remove_file(&src).unwrap();
        assert!(got.unwrap().encrypted, "{name}: an encrypted put");
    }
    // A plain file beside them, which the encrypted ranges' deletes must leave.
    put(b, &Put::new(6, 4, 4, 1, 99)).await.unwrap();
    let listed = sealed.list(6).await.unwrap();
    assert_eq!(
        ranges(&listed).len(),
        4,
        "{name}: listed through the wrapper"
    );
    // The backend itself, given a file marked encrypted, deletes the `.age` name.
    b.client.delete(&listed[..1]).await.unwrap();
    assert_eq!(
        ranges(&sealed.list(6).await.unwrap()),
        vec![(6, 2, 2), (6, 3, 3), (6, 4, 4)],
        "{name}: after the backend's delete of an encrypted file"
    );
    // The wrapper deletes both names of each range, each once.
    sealed
        .delete(&listed[1..3])
        .await
        .unwrap_or_else(|e| panic!("{name}: the wrapper's delete of encrypted files: {e:?}"));
    assert_eq!(
        ranges(&sealed.list(6).await.unwrap()),
        vec![(6, 4, 4)],
        "{name}: encrypted files left after the wrapper's delete"
    );
    assert_eq!(
        ranges(&list(b, 6).await),
        vec![(6, 4, 4)],
        "{name}: plain view"
    );
}
