//! The names of the temporary files that writes to a replica make before they publish, and
//! how a sweep tells the ones a write cut short left behind
//! ([`crate::storage::ReplicaClient::sweep_tmp`]): a name is only ever removed when one of
//! these functions says a write of ours (or Litestream's) made it.

use chrono::Utc;

use crate::ltx;

/// Whether `name` is a temporary file a write of a replica left: in a level directory
/// (`in_level`), an LTX file's name followed by anything and `.tmp` (replicad's puts, and
/// Litestream's `<name>.tmp`); at the root, an auxiliary object's name followed by
/// [`crate::util::fsutil::unique_tmp_suffix`] (the lease's writes). Anything else is not ours
/// to remove.
pub fn is_leftover_tmp(name: &str, in_level: bool) -> bool {
    if in_level {
        const LTX_NAME_LEN: usize = "0000000000000001-0000000000000001.ltx".len();
        name.len() > LTX_NAME_LEN
            && name.ends_with(".tmp")
            && name
                .get(..LTX_NAME_LEN)
                .and_then(ltx::parse_filename)
                .is_some()
    } else {
        crate::util::fsutil::strip_unique_tmp_suffix(name)
            .is_some_and(|aux| crate::storage::check_aux_name(aux).is_ok())
    }
}

/// The temporary name an SFTP or WebDAV put writes before it publishes `name`:
/// `<name>.<pid>.<nanoseconds>.tmp`, which says when it was made ([`tmp_name_made_s`]).
pub fn put_tmp_name(name: &str) -> String {
    format!(
        "{name}.{}.{}.tmp",
        std::process::id(),
        Utc::now().timestamp_nanos_opt().unwrap_or_default()
    )
}

/// When a put's temporary name `<name>.<pid>.<nanoseconds>.tmp` (SFTP, WebDAV) was made, in
/// seconds by the writer's clock. A live upload's file may carry an old modification time
/// (SFTP sets the LTX timestamp before publishing): its name says it is new.
pub fn tmp_name_made_s(name: &str) -> Option<i64> {
    let (rest, ns) = name.strip_suffix(".tmp")?.rsplit_once('.')?;
    let (_, pid) = rest.rsplit_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(pid) && digits(ns))
        .then(|| ns.parse::<i64>().ok())
        .flatten()
        .map(|ns| ns / 1_000_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names a write makes are the names the sweep takes for leftovers, and say when they
    /// were made: a change of either format would leave every crash's file for good.
    #[test]
    fn temporary_names_are_recognised_as_leftovers() {
        let ltx = "0000000000000001-00000000000000ff.ltx";
        let put = put_tmp_name(ltx);
        assert!(is_leftover_tmp(&put, true), "{put}");
        let made = tmp_name_made_s(&put).expect("a put's name says when it was made");
        assert!((made - Utc::now().timestamp()).abs() <= 5, "{put}: {made}");
        let file_put = format!("{ltx}{}", crate::util::fsutil::unique_tmp_suffix());
        assert!(is_leftover_tmp(&file_put, true), "{file_put}");
        assert_eq!(tmp_name_made_s(&file_put), None);
        let sealed_put = put_tmp_name(&format!("{ltx}{}", crate::storage::SEALED_SUFFIX));
        assert!(is_leftover_tmp(&sealed_put, true), "{sealed_put}");
        let lease = format!("replicad.lease{}", crate::util::fsutil::unique_tmp_suffix());
        assert!(is_leftover_tmp(&lease, false), "{lease}");
        // Not ours: at the root only a lease write's suffix counts; in a level, an LTX name first.
        for (name, in_level) in [
            (put.as_str(), false),
            ("replicad.lease.tmp", false),
            ("notes.1-0123456789abcdef.tmp", true),
            ("a/b.1-0123456789abcdef.tmp", false),
            (ltx, true),
            ("0000000000000001-00000000000000FF.ltx.tmp", true),
        ] {
            assert!(!is_leftover_tmp(name, in_level), "{name} ({in_level})");
        }
    }
}
