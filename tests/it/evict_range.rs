//! `fsutil::evict_range` drops a written range from the page cache even while its pages are
//! still dirty (a streamed snapshot releases each part right after uploading it, long before
//! the segment's fsync), and leaves the rest of the file cached and the content whole.
//!
//! Residency is read with util-linux `fincore`. The file lives under the build's target
//! directory, not the system temporary directory, which may be a tmpfs (no page cache to drop).

use std::io::Write;
use std::path::Path;
use std::process::Command;

use replicad::util::fsutil::evict_range;

const MIB: u64 = 1024 * 1024;

/// Resident bytes of `path`, per `fincore`.
fn resident(path: &Path) -> u64 {
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output()
        .expect("fincore (util-linux) runs");
    assert!(out.status.success(), "fincore: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("fincore prints a byte count")
}

#[test]
fn evict_range_drops_dirty_pages_of_the_range_only() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("staged.ltx");
    let mut file = std::fs::File::create(&path).unwrap();
    let data: Vec<u8> = (0..16 * MIB).map(|i| (i % 251) as u8).collect();
    file.write_all(&data).unwrap();
    // Not fsynced: the pages are dirty, as a growing segment's are while it is uploaded.
    assert!(
        resident(&path) >= 15 * MIB,
        "freshly written pages are cached"
    );

    evict_range(&file, 0, 8 * MIB);
    let after = resident(&path);
    assert!(
        after <= 8 * MIB + 256 * 1024,
        "{after} bytes resident: the first 8 MiB were not dropped"
    );
    assert!(
        after >= 7 * MIB,
        "{after} bytes resident: the range past the evicted one went too"
    );
    assert_eq!(std::fs::read(&path).unwrap(), data, "content unchanged");
}
