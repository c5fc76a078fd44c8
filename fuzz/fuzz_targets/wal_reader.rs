//! Arbitrary bytes as a SQLite WAL file through `wal::scan`: errors or `None`, never a panic.
//!
//! The bytes go to one scratch file per process (under /dev/shm when it exists, else /tmp),
//! rewritten in place for each input. Besides "no panic" the target checks what `scan`
//! promises: frame-aligned offsets inside the file, page numbers within the commit, pages
//! readable with `read_page`, and that continuing a scan from a commit boundary it reported
//! reaches the same end as one scan from the start.
#![no_main]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use replicad::sqlite::wal::{self, WAL_FRAME_HEADER_SIZE, WAL_HEADER_SIZE, WalError, WalScan};

fn scratch() -> &'static File {
    static FILE: OnceLock<File> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let path = dir.join(format!("replicad-fuzz-wal-{}.wal", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("create scratch WAL");
        // The open descriptor is all the target needs; nothing is left behind on exit.
        let _ = std::fs::remove_file(&path);
        file
    })
}

fn check(scan: &WalScan, file: &File, len: u64) {
    let frame = scan.header.frame_size();
    let page = u64::from(scan.header.page_size);
    assert!(scan.end_offset >= scan.start_offset);
    // A start past the end of the file is refused with PrevFrameMismatch (it once was not:
    // fuzz/regressions/wal_reader/scan-past-eof-after-partial-frame.wal).
    assert!(
        scan.start_offset <= len,
        "scan accepted a start offset past the end of the file"
    );
    assert!(scan.end_offset <= len, "scan ends past the end of the file");
    assert_eq!((scan.end_offset - WAL_HEADER_SIZE) % frame, 0);
    if scan.commit == 0 {
        assert!(scan.pages.is_empty());
        assert_eq!(scan.end_offset, scan.start_offset);
    }
    let mut buf = vec![0u8; scan.header.page_size as usize];
    for (&pgno, &off) in &scan.pages {
        assert!(
            pgno >= 1 && pgno <= scan.commit,
            "page {pgno} past commit {}",
            scan.commit
        );
        assert!(off >= scan.start_offset + WAL_FRAME_HEADER_SIZE);
        assert_eq!((off - WAL_HEADER_SIZE - WAL_FRAME_HEADER_SIZE) % frame, 0);
        assert!(off + page <= scan.end_offset);
        wal::read_page(file, off, &mut buf).expect("read a page the scan listed");
    }
}

fuzz_target!(|data: &[u8]| {
    let file = scratch();
    file.set_len(0).expect("truncate scratch WAL");
    file.write_all_at(data, 0).expect("write scratch WAL");
    let len = data.len() as u64;

    for bad in [0, 1, 31] {
        assert!(matches!(
            wal::scan(file, bad, u64::MAX),
            Err(WalError::Misaligned { .. })
        ));
    }
    let full = match wal::scan(file, WAL_HEADER_SIZE, u64::MAX) {
        Ok(Some(s)) => s,
        Ok(None) | Err(_) => return,
    };
    assert!(!full.limited);
    check(&full, file, len);
    let frame = full.header.frame_size();

    // Continuing from where a complete scan ended finds no further commit.
    if let Ok(Some(rest)) = wal::scan(file, full.end_offset, u64::MAX) {
        check(&rest, file, len);
        assert_eq!(
            rest.end_offset, full.end_offset,
            "commits found past the end of a full scan"
        );
        assert_eq!(rest.header, full.header);
    } else if full.end_offset > WAL_HEADER_SIZE {
        panic!("cannot continue a scan from the boundary it reported");
    }

    // Stop at the first commit, then continue: same end and commit as one full scan.
    if let Ok(Some(first)) = wal::scan(file, WAL_HEADER_SIZE, 0) {
        check(&first, file, len);
        assert!(first.end_offset <= full.end_offset);
        if first.end_offset > WAL_HEADER_SIZE {
            let rest = wal::scan(file, first.end_offset, u64::MAX)
                .expect("continue after the first commit")
                .expect("header still valid");
            check(&rest, file, len);
            assert_eq!(rest.end_offset, full.end_offset);
            if rest.end_offset > first.end_offset {
                assert_eq!(rest.commit, full.commit);
            }
        }
    }

    // A few more frame-aligned starting points, including past the end of the file.
    let frames = (len.saturating_sub(WAL_HEADER_SIZE)) / frame;
    for k in [1, 2, 3, frames / 2, frames, frames + 1] {
        let start = WAL_HEADER_SIZE + k * frame;
        match wal::scan(file, start, u64::MAX) {
            Ok(Some(s)) => check(&s, file, len),
            Ok(None) => panic!("header vanished"),
            Err(WalError::PrevFrameMismatch { .. }) => {}
            Err(e) => panic!("unexpected error from aligned offset {start}: {e}"),
        }
        // Misaligned by one byte is always refused once the header is known.
        assert!(matches!(
            wal::scan(file, start + 1, u64::MAX),
            Err(WalError::Misaligned { .. })
        ));
    }
});
