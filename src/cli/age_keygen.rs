//! `replicad age-keygen`: a new age identity in age-keygen's file format, so no other tool
//! is needed to set up an encrypted replica.
//!
//! Invariant: an existing file is never overwritten, and the identity file is created with
//! mode 0600 (never readable by others, not even briefly).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;

use super::CliError;
use crate::storage::age::keys::generate_identity;

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
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => CliError::Usage(format!(
                "{} already exists; refusing to overwrite an identity file (choose another path)",
                path.display()
            )),
            _ => CliError::Runtime(anyhow!("create {}: {e}", path.display())),
        })?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| anyhow!("write {}: {e}", path.display()))?;
    crate::util::fsutil::fsync_dir(crate::util::fsutil::parent_dir(&path))
        .map_err(|e| anyhow!("sync the directory of {}: {e}", path.display()))?;
    eprintln!("Public key: {public}");
    Ok(())
}
