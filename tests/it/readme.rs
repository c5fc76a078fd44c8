//! The README's commands, verbatim: every shell block marked `<!-- readme-test -->` runs, in
//! order, as one bash script in a scratch directory with the built binary first on `PATH`,
//! and the restores it makes must hold what the session wrote. The configuration block marked
//! `<!-- readme-test: config -->` must load. So the front door cannot drift from the binary.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::TestDir;

const README: &str = include_str!("../../README.md");

/// The fenced blocks that follow a line `<!-- MARKER -->`, in order.
fn marked_blocks(marker: &str) -> Vec<String> {
    let tag = format!("<!-- {marker} -->");
    let mut blocks = Vec::new();
    let mut lines = README.lines();
    while let Some(line) = lines.next() {
        if line.trim() != tag {
            continue;
        }
        let fence = lines.next().expect("a fenced block follows the marker");
        assert!(fence.starts_with("```"), "a fence after {tag}: {fence}");
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        blocks.push(body.join("\n"));
    }
    blocks
}

fn have_sqlite3() -> bool {
    Command::new("sqlite3")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn notes(db: &Path) -> Vec<String> {
    common::strings(db, "SELECT body FROM notes ORDER BY rowid")
}

#[test]
fn the_readme_session_runs_verbatim_and_its_restores_hold_what_it_wrote() {
    if !have_sqlite3() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the sqlite3 shell is missing (.ci/run installs it)"
        );
        eprintln!("SKIPPED: no sqlite3 shell");
        return;
    }
    let blocks = marked_blocks("readme-test");
    assert!(
        blocks.len() >= 2,
        "README marks the session and the restores"
    );
    let dir = TestDir::new("readme");
    let script = format!("set -euo pipefail\n{}\n", blocks.join("\n"));
    std::fs::write(dir.join("readme.sh"), &script).unwrap();
    let bin_dir = Path::new(common::bin()).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The session waits on files with `until` loops: a broken build must fail, not hang.
    let o = Command::new("timeout")
        .args(["-k", "10", "300", "bash", "readme.sh"])
        .current_dir(dir.path())
        .env("PATH", path)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let out = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "the README's commands failed:\n{out}");

    let source = dir.join("app.db");
    let written = vec!["first".to_string(), "second".to_string()];
    assert_eq!(notes(&source), written);
    for latest in ["restored.db", "as-of-now.db", "follower.db"] {
        let db = dir.join(latest);
        assert!(common::integrity_ok(&db), "{latest}");
        assert_eq!(notes(&db), written, "{latest}:\n{out}");
    }
    let at_1 = dir.join("as-of-txid-1.db");
    assert!(common::integrity_ok(&at_1));
    assert_eq!(notes(&at_1), vec!["first".to_string()], "{out}");
    // The follower's count was printed by the session itself.
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("\n2\n"));
}

#[test]
fn the_readme_minimal_config_loads() {
    let blocks = marked_blocks("readme-test: config");
    assert_eq!(blocks.len(), 1);
    let text = &blocks[0];
    assert!(
        text.lines().count() <= 10,
        "the minimal config stays minimal"
    );
    let dir = TestDir::new("readme-config");
    let cfg = dir.join("replicad.yml");
    std::fs::write(&cfg, text).unwrap();
    let o = Command::new(common::bin())
        .args(["databases", "--config", common::s(&cfg)])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for want in [
        "/var/lib/app/app.db",
        "/var/backups/app",
        "s3://my-bucket/app",
    ] {
        assert!(stdout.contains(want), "{want} in:\n{stdout}");
    }
}
