//! The age keys of one replica: the recipients new files are encrypted to and the identities
//! that decrypt existing ones, loaded from inline keys or files, plus key generation.
//!
//! Invariants:
//! - Identities (secret keys) never reach a log, an error message or `Debug` output: they are
//!   described by where they came from (file path or "inline identity N") and their public key.
//! - Loading never falls back: a missing or unparsable file is an error, never "no keys".
//! - Only native X25519 keys (`age1...`, `AGE-SECRET-KEY-1...`) are supported; other lines
//!   of a file are refused with their line number (not their content).

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::Arc;

use age::secrecy::ExposeSecret;
use age::x25519;

/// Recipients and identities of a replica. Empty recipients: new files are written in plain.
#[derive(Clone, Default)]
pub struct AgeKeys {
    recipients: Vec<x25519::Recipient>,
    /// (where it came from, its public key, the identity).
    identities: Vec<(String, String, x25519::Identity)>,
    /// Identity sources that were given, for "tried ..." messages (files may hold several).
    sources: Vec<String>,
}

impl fmt::Debug for AgeKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgeKeys")
            .field("recipients", &self.recipient_strings())
            .field("identities", &self.sources)
            .finish()
    }
}

impl PartialEq for AgeKeys {
    fn eq(&self, other: &Self) -> bool {
        self.recipient_strings() == other.recipient_strings()
            && self.public_keys() == other.public_keys()
    }
}

impl Eq for AgeKeys {}

/// An entry that holds an identity in any case (a key, or a whole age-keygen file pasted in),
/// which no message may show, unless it names an existing file.
fn looks_secret(entry: &str) -> bool {
    entry.to_ascii_uppercase().contains("AGE-SECRET-KEY-") && !Path::new(entry).is_file()
}

impl AgeKeys {
    /// Loads the `age:` entries of a replica. Each entry is an inline key or a file path.
    /// Errors name the entry (`recipients[1]`, `identities[0]`) and never hold a secret.
    pub fn load(recipients: &[String], identities: &[String]) -> Result<AgeKeys, String> {
        let mut keys = AgeKeys::default();
        for (i, entry) in recipients.iter().enumerate() {
            let entry = entry.trim();
            let parsed = if entry.starts_with("age1") {
                parse_recipient(entry).map(|r| vec![r])
            } else if looks_secret(entry) {
                Err("this is an identity (secret key), not a recipient: put it under identities, and its public key (replicad age-keygen prints it) under recipients".into())
            } else {
                read_recipients_file(Path::new(entry))
            };
            keys.recipients
                .extend(parsed.map_err(|e| format!("recipients[{i}]: {e}"))?);
        }
        for (i, entry) in identities.iter().enumerate() {
            let entry = entry.trim();
            if looks_secret(entry) {
                // Not shown in any error: an identity written in lower case, or a whole
                // age-keygen file pasted in, is still a secret.
                let Ok(id) = entry.parse::<x25519::Identity>() else {
                    return Err(format!(
                        "identities[{i}]: an inline identity is one line `AGE-SECRET-KEY-1...` \
                         (not shown), and this is not a valid one"
                    ));
                };
                keys.push_identity(format!("inline identity {i}"), id);
            } else if entry.contains(char::is_whitespace) && !Path::new(entry).is_file() {
                return Err(format!(
                    "identities[{i}]: neither an age identity nor a readable identity file \
                     (not shown: it may hold a key)"
                ));
            } else if entry.starts_with("age1") {
                return Err(format!(
                    "identities[{i}]: {entry} is a recipient (public key), not an identity: put it under recipients"
                ));
            } else {
                keys.add_identity_file(Path::new(entry))
                    .map_err(|e| format!("identities[{i}]: {e}"))?;
            }
        }
        Ok(keys)
    }

    /// Identities only (restore's `--age-identity FILE`).
    pub fn from_identity_files(files: &[impl AsRef<Path>]) -> Result<AgeKeys, String> {
        let mut keys = AgeKeys::default();
        for f in files {
            keys.add_identity_file(f.as_ref())?;
        }
        Ok(keys)
    }

    /// Adds the identities of `other` (tried after these).
    pub fn merge_identities(&mut self, other: &AgeKeys) {
        self.identities.extend(other.identities.iter().cloned());
        self.sources.extend(other.sources.iter().cloned());
    }

    fn push_identity(&mut self, source: String, id: x25519::Identity) {
        let public = id.to_public().to_string();
        self.sources.push(format!("{source} ({public})"));
        self.identities.push((source, public, id));
    }

    fn add_identity_file(&mut self, path: &Path) -> Result<(), String> {
        let what = format!("identity file {}", path.display());
        let file = std::fs::File::open(path).map_err(|e| format!("cannot read {what}: {e}"))?;
        let mut found = 0;
        for (n, line) in BufReader::new(file.take(1 << 20)).lines().enumerate() {
            let line = line.map_err(|e| format!("cannot read {what}: {e}"))?;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let id = line.parse::<x25519::Identity>().map_err(|_| {
                format!(
                    "{what} line {}: not an age identity (AGE-SECRET-KEY-1...)",
                    n + 1
                )
            })?;
            let public = id.to_public().to_string();
            self.identities
                .push((path.display().to_string(), public, id));
            found += 1;
        }
        if found == 0 {
            return Err(format!("{what} holds no identity"));
        }
        let publics: Vec<&str> = self.identities[self.identities.len() - found..]
            .iter()
            .map(|(_, p, _)| p.as_str())
            .collect();
        self.sources
            .push(format!("{} ({})", path.display(), publics.join(", ")));
        Ok(())
    }

    /// True if new files are encrypted (some recipient is configured).
    pub fn encrypts(&self) -> bool {
        !self.recipients.is_empty()
    }

    /// True if some identity can be tried on encrypted files.
    pub fn has_identities(&self) -> bool {
        !self.identities.is_empty()
    }

    /// The recipients' public keys (`age1...`).
    pub fn recipient_strings(&self) -> Vec<String> {
        self.recipients.iter().map(|r| r.to_string()).collect()
    }

    /// The identities' public keys.
    pub fn public_keys(&self) -> Vec<String> {
        self.identities.iter().map(|(_, p, _)| p.clone()).collect()
    }

    /// What was given as identities, with public keys (never the secrets), for messages.
    pub fn identity_sources(&self) -> &[String] {
        &self.sources
    }

    /// Encrypts `src` into `dst` (a new file: an old one of that name is unlinked, never
    /// truncated). Blocking: call off the reactor.
    pub fn encrypt_file(&self, src: &Path, dst: &Path) -> io::Result<u64> {
        let encryptor = age::Encryptor::with_recipients(
            self.recipients.iter().map(|r| r as &dyn age::Recipient),
        )
        .map_err(|e| io::Error::other(format!("age: {e}")))?;
        let mut input = std::fs::File::open(src)?;
        let out = crate::util::fsutil::create_fresh(dst)?;
        let mut w = encryptor.wrap_output(io::BufWriter::new(out))?;
        io::copy(&mut input, &mut w)?;
        let mut out = w.finish()?;
        out.flush()?;
        Ok(std::fs::metadata(dst)?.len())
    }

    /// Opens an age stream for reading with these identities. Blocking: call off the reactor.
    pub fn decrypt<R: BufRead>(
        &self,
        input: R,
    ) -> Result<age::stream::StreamReader<R>, age::DecryptError> {
        let decryptor = age::Decryptor::new_buffered(input)?;
        decryptor.decrypt(
            self.identities
                .iter()
                .map(|(_, _, id)| id as &dyn age::Identity),
        )
    }
}

/// Shared keys, as held by clients and configs.
pub type SharedAgeKeys = Arc<AgeKeys>;

fn parse_recipient(s: &str) -> Result<x25519::Recipient, String> {
    s.parse::<x25519::Recipient>()
        .map_err(|e| format!("{s:?} is not an age recipient: {e}"))
}

/// Reads an age recipients file: one `age1...` per line, `#` comments and blank lines skipped.
fn read_recipients_file(path: &Path) -> Result<Vec<x25519::Recipient>, String> {
    let what = format!("recipients file {}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {what}: {e}"))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with("AGE-SECRET-KEY-") {
            return Err(format!(
                "{what} line {}: holds an identity (secret key), not a recipient",
                n + 1
            ));
        }
        out.push(
            line.parse::<x25519::Recipient>()
                .map_err(|_| format!("{what} line {}: not an age recipient (age1...)", n + 1))?,
        );
    }
    if out.is_empty() {
        return Err(format!("{what} holds no recipient"));
    }
    Ok(out)
}

/// A new identity in age-keygen's file format, and its public key.
pub fn generate_identity() -> (String, String) {
    let id = x25519::Identity::generate();
    let public = id.to_public().to_string();
    let created = chrono::Local::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let text = format!(
        "# created: {created}\n# public key: {public}\n{}\n",
        id.to_string().expose_secret()
    );
    (text, public)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_identity_round_trips_and_secrets_stay_out_of_debug() {
        let dir = tempfile::tempdir().unwrap();
        let (text, public) = generate_identity();
        let idf = dir.path().join("key.txt");
        std::fs::write(&idf, &text).unwrap();
        let keys =
            AgeKeys::load(std::slice::from_ref(&public), &[idf.display().to_string()]).unwrap();
        assert!(keys.encrypts() && keys.has_identities());
        let secret = text.lines().last().unwrap();
        assert!(!format!("{keys:?}").contains(secret));
        let src = dir.path().join("plain");
        let enc = dir.path().join("enc");
        std::fs::write(&src, b"hello age").unwrap();
        keys.encrypt_file(&src, &enc).unwrap();
        let mut out = Vec::new();
        keys.decrypt(BufReader::new(std::fs::File::open(&enc).unwrap()))
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"hello age");
        let other = AgeKeys::from_identity_files(&[&idf]).unwrap();
        assert_eq!(other.public_keys(), vec![public]);
    }

    #[test]
    fn bad_entries_name_the_entry_and_line_without_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.txt").display().to_string();
        let e = AgeKeys::load(std::slice::from_ref(&missing), &[]).unwrap_err();
        assert!(
            e.starts_with("recipients[0]: cannot read recipients file"),
            "{e}"
        );
        let bad = dir.path().join("bad.txt");
        std::fs::write(&bad, "# c\nAGE-SECRET-KEY-1NOTVALIDSECRET\n").unwrap();
        let e = AgeKeys::load(&[], &[bad.display().to_string()]).unwrap_err();
        assert!(e.contains("line 2") && !e.contains("NOTVALID"), "{e}");
    }
}
