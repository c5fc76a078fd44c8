//! `replicad age-keygen`: a new age identity in age-keygen's file format, so no other tool
//! is needed to set up an encrypted replica.
//!
//! Invariants: an existing file is never overwritten; the identity file is created with
//! mode 0600 (never readable by others, not even briefly); and it appears whole or not at
//! all (written under a temporary name, fsynced, then linked to its name): a key cut short
//! by a full disk would look like a key, and a second run would refuse to replace it.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;

use super::CliError;
use crate::storage::age::keys::generate_identity;
use crate::util::fsutil;

/// Arguments of `replicad age-keygen`.
#[derive(Debug, Args)]
pub struct AgeKeygenArgs {
    /// Write the identity to FILE (mode 0600; an existing file is refused) instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs `replicad age-keygen`.
pub async fn run(args: AgeKeygenArgs) -> Result<(), CliError> {
    let (text, public) = generate_identity();
    let Some(path) = args.output else {
        std::io::stdout()
            .write_all(text.as_bytes())
            .map_err(|e| anyhow!("write the identity to stdout: {e}"))?;
        return Ok(());
    };
    let exists = || {
        CliError::Usage(format!(
            "{} already exists; refusing to overwrite an identity file (choose another path)",
            path.display()
        ))
    };
    // A dangling symlink counts: the key would be written where it points.
    if path.symlink_metadata().is_ok() {
        return Err(exists());
    }
    let tmp = fsutil::unique_tmp_path(&path);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut file| {
            file.write_all(text.as_bytes())?;
            file.sync_all()
        })
        .and_then(|()| fsutil::publish_new(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(match e.kind() {
            std::io::ErrorKind::AlreadyExists => exists(),
            _ => CliError::Runtime(anyhow!("write {}: {e}", path.display())),
        });
    }
    eprintln!("Public key: {public}");
    Ok(())
}
