use super::*;

/// A listed file; stored at second `max` of the epoch (files ending at the same TXID tie).
pub(super) fn file(level: u8, min: u64, max: u64) -> LtxFileInfo {
    LtxFileInfo {
        level,
        min_txid: TxId(min),
        max_txid: TxId(max),
        size: 1,
        created_at: DateTime::from_timestamp(i64::try_from(max).unwrap_or(i64::MAX), 0)
            .unwrap_or_default(),
        encrypted: false,
    }
}

/// Found by the `restore_plan` fuzz target: a chain reaching TXID u64::MAX overflowed.
#[test]
fn chain_reaching_the_largest_txid_does_not_overflow() {
    let files = [file(0, 1, u64::MAX)];
    let plan = calc_plan(&files, None).unwrap();
    assert_eq!(plan.len(), 1);
    assert_eq!(calc_plan(&files, Some(TxId(u64::MAX))).unwrap().len(), 1);
}

#[test]
fn plan_prefers_the_snapshot_then_the_furthest_reach() {
    let files = [
        file(0, 1, 1),
        file(0, 2, 2),
        file(1, 2, 5),
        file(0, 3, 3),
        file(9, 1, 3),
        file(0, 6, 6),
    ];
    let plan = calc_plan(&files, None).unwrap();
    let got: Vec<(u8, u64, u64)> = plan
        .iter()
        .map(|f| (f.level, f.min_txid.0, f.max_txid.0))
        .collect();
    assert_eq!(got, vec![(9, 1, 3), (1, 2, 5), (0, 6, 6)]);
    assert!(matches!(
        calc_plan(&[file(0, 1, 1), file(0, 3, 3)], None),
        Err(RestoreError::Gap { .. })
    ));
}

/// Level-0 retention removed the first level-0 files of the level-1 file 4..10 (4 to 6) and
/// kept 7..10: a TXID or a time inside that level-1 file is not a gap in the history. A TXID
/// there names the nearest restorable one below; a time there restores it (3); a real hole
/// is still a gap.
#[test]
fn a_target_inside_a_compaction_whose_first_files_were_retired_is_no_gap() {
    let files = [
        file(9, 1, 3),
        file(1, 4, 10),
        file(0, 7, 7),
        file(0, 8, 8),
        file(0, 9, 9),
        file(0, 10, 10),
    ];
    match calc_plan(&files, Some(TxId(8))) {
        Err(RestoreError::NotAvailable { reason, .. }) => {
            assert!(
                reason.contains("nearest restorable TXID below is 3"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    let ranges = |plan: Vec<LtxFileInfo>| -> Vec<(u64, u64)> {
        plan.iter().map(|f| (f.min_txid.0, f.max_txid.0)).collect()
    };
    assert_eq!(
        ranges(calc_plan(&files, Some(TxId(10))).unwrap()),
        [(1, 3), (4, 10)]
    );
    // A time between the commits of TXIDs 8 and 9.
    let kept = [file(9, 1, 3), file(0, 7, 7), file(0, 8, 8)];
    let later = [file(1, 4, 10), file(0, 9, 9), file(0, 10, 10)];
    assert_eq!(
        ranges(plan::calc_plan_before(&kept, &later).unwrap()),
        [(1, 3)]
    );
    // Nothing bridges 4..6, or only a snapshot does (it says nothing of the TXIDs it
    // merged), or a compaction that starts inside it: a hole.
    let no_bridges = [file(0, 9, 9), file(9, 1, 20), file(1, 5, 10)];
    for later in &no_bridges {
        assert!(
            matches!(
                plan::calc_plan_before(&kept, std::slice::from_ref(later)),
                Err(RestoreError::Gap { .. })
            ),
            "{later:?}"
        );
    }
    for later in no_bridges {
        let files = [file(9, 1, 3), file(0, 7, 7), file(0, 8, 8), later];
        assert!(
            matches!(
                calc_plan(&files, Some(TxId(8))),
                Err(RestoreError::Gap { .. })
            ),
            "{files:?}"
        );
    }
}

/// Without `force`, placing the restored file replaces nothing that appeared at the output
/// while the restore ran (its check at the start is minutes old): neither a database nor a
/// WAL or journal beside it, which SQLite would replay over the output.
#[test]
fn place_without_force_replaces_nothing_that_appeared_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let (staged, to) = (dir.path().join("staged"), dir.path().join("out.db"));
    for (appeared, content) in [
        (to.clone(), &b"a database"[..]),
        (sidecar(&to, "-wal"), b"a wal"),
        (sidecar(&to, "-journal"), b"a journal"),
    ] {
        std::fs::write(&staged, b"restored").unwrap();
        std::fs::write(&appeared, content).unwrap();
        let e = place(&staged, &to, false).unwrap_err();
        assert!(
            matches!(&e, RestoreError::Exists(p) if *p == appeared),
            "{e}"
        );
        assert_eq!(std::fs::read(&appeared).unwrap(), content);
        std::fs::remove_file(&appeared).unwrap();
    }
    std::fs::write(sidecar(&to, "-journal"), b"a journal").unwrap();
    place(&staged, &to, true).unwrap();
    assert_eq!(std::fs::read(&to).unwrap(), b"restored");
    assert!(!sidecar(&to, "-journal").exists());
}

/// With `force`, a database that cannot be replaced (here a directory stands at its name, so
/// the rename fails) keeps its WAL and journal: they hold commits its file lacks.
#[test]
fn place_with_force_that_fails_keeps_the_old_wal_and_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (staged, to) = (dir.path().join("staged"), dir.path().join("out.db"));
    std::fs::write(&staged, b"restored").unwrap();
    std::fs::create_dir(&to).unwrap();
    std::fs::write(to.join("in-the-way"), b"").unwrap();
    let (wal, journal) = (sidecar(&to, "-wal"), sidecar(&to, "-journal"));
    std::fs::write(&wal, b"old commits").unwrap();
    std::fs::write(&journal, b"old journal").unwrap();
    let e = place(&staged, &to, true).unwrap_err();
    assert!(e.to_string().contains("publish"), "{e}");
    assert_eq!(std::fs::read(&wal).unwrap(), b"old commits");
    assert_eq!(std::fs::read(&journal).unwrap(), b"old journal");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 4, "nothing set aside is left: {names:?}");
    // Once it can, the database is replaced and its side files go.
    std::fs::remove_dir_all(&to).unwrap();
    std::fs::write(sidecar(&to, "-shm"), b"index").unwrap();
    place(&staged, &to, true).unwrap();
    assert_eq!(std::fs::read(&to).unwrap(), b"restored");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [std::ffi::OsString::from("out.db")]);
}

/// With `force`, a database a running `restore --follow` holds is not replaced: the follower
/// went on applying to the old file and wrote its `-txid` beside the new one.
#[test]
fn place_with_force_refuses_a_followed_database() {
    let dir = tempfile::tempdir().unwrap();
    let (staged, to) = (dir.path().join("staged"), dir.path().join("out.db"));
    std::fs::write(&staged, b"restored").unwrap();
    std::fs::write(&to, b"followed").unwrap();
    let txid = sidecar(&to, "-txid");
    std::fs::write(&txid, b"0000000000000002\n").unwrap();
    let follower = std::fs::File::open(&to).unwrap();
    follower.lock().unwrap();
    let e = place(&staged, &to, true).unwrap_err();
    assert!(e.to_string().contains("restore --follow"), "{e}");
    assert_eq!(std::fs::read(&to).unwrap(), b"followed");
    assert!(txid.exists(), "the running follower's position was removed");
    drop(follower);
    place(&staged, &to, true).unwrap();
    assert_eq!(std::fs::read(&to).unwrap(), b"restored");
}
