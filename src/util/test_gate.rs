//! A hook for tests of work that hangs: while the file named by [`SYNC_GATE_ENV`] exists, the
//! file work of the databases beside it waits, standing in for a call blocked on a hung file
//! system or a dying disk ([`crate::replicate::health::SLOW_WORK`]).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// Path of a file; while it exists, the file work of a database in the same directory waits
/// before it starts: each full sync (the final one too), its idle check when on a network file system or in the
/// dormant databases' pass, and its start; and a follower's first database, once placed and
/// before its position is written.
pub const SYNC_GATE_ENV: &str = "REPLICAD_TEST_SYNC_GATE";

/// Waits while the gate exists, if it is beside `path` (tests only: the variable is read once,
/// so otherwise this costs one load).
pub fn wait_at_test_gate(path: &Path) {
    static GATE: OnceLock<Option<PathBuf>> = OnceLock::new();
    if let Some(gate) = GATE.get_or_init(|| std::env::var_os(SYNC_GATE_ENV).map(Into::into))
        && gate.parent() == path.parent()
    {
        while gate.exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
