//! The names of the temporary files that writes to a replica make before they publish, and
//! how a sweep tells the ones a write cut short left behind
//! ([`crate::storage::ReplicaClient::sweep_tmp`]): a name is only ever removed when one of
//! these functions says a write of ours (or Litestream's) made it.

use chrono::Utc;

use crate::ltx;

/// What a sweep found on a replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Leftovers removed.
    pub removed: usize,
    /// Temporary files of ours kept as not old enough: a write under way, or the leftover of
    /// a recent crash, which a later sweep removes.
    pub young: usize,
    /// The sweep listed the replica: false on the backends that never write a temporary
    /// file (S3, GCS, Azure), which make no request for it.
    pub listed: bool,
}

/// Whether `name` is a temporary file a write of a replica left: in a level directory
/// (`in_level`), an LTX file's name followed by anything and `.tmp` (replicad's puts, and
/// Litestream's `<name>.tmp`); at the root, the name of the lease or of the age recipients
/// note followed by [`crate::util::fsutil::unique_tmp_suffix`] (their writes). Anything else
/// is not ours to remove.
pub fn is_leftover_tmp(name: &str, in_level: bool) -> bool {
    if name.contains('/') {
        return false;
    }
    if in_level {
        const LTX_NAME_LEN: usize = "0000000000000001-0000000000000001.ltx".len();
        name.len() > LTX_NAME_LEN
            && name.ends_with(".tmp")
            && name
                .get(..LTX_NAME_LEN)
                .and_then(ltx::parse_filename)
                .is_some()
    } else {
        let aux = crate::util::fsutil::strip_unique_tmp_suffix(name);
        aux == Some(crate::storage::LEASE_NAME) || aux == Some(crate::storage::AGE_NOTE_NAME)
    }
}

impl Swept {
    /// The start of a sweep that lists the replica (directory, SFTP, WebDAV).
    pub fn listing() -> Swept {
        Swept {
            listed: true,
            ..Swept::default()
        }
    }

    /// Judges the entry `name` of a sweep (`in_level`: of a level directory; `changed_s`:
    /// its last change in seconds, `None` when the store does not say): true when it is a
    /// leftover to remove now. One of ours too young is counted in [`Swept::young`]; one
    /// without a time is kept and not counted (it would keep an idle replica swept for good).
    pub fn judge(
        &mut self,
        name: &str,
        in_level: bool,
        changed_s: Option<i64>,
        now_s: i64,
        older_s: i64,
    ) -> bool {
        let Some(changed) = changed_s.filter(|_| is_leftover_tmp(name, in_level)) else {
            return false;
        };
        let stale = old_enough(name, changed, now_s, older_s);
        // A name made `older_s` or more ahead of our clock (a clock stepped back since, or
        // another host's ahead) is kept, as a put under way may carry it, but not counted:
        // it would keep an idle replica swept hourly until that time.
        let ahead = tmp_name_made_s(name).is_some_and(|t| t.saturating_sub(now_s) >= older_s);
        self.young += usize::from(!stale && !ahead);
        stale
    }
}

/// Whether the temporary file `name`, last changed at `changed_s` (seconds; the store's
/// clock), is at least `older_s` old at `now_s` (this host's clock), by its change and by
/// the time in its name when it carries one ([`put_tmp_name`]): a put under way may carry an
/// old modification time (SFTP and a directory replica set the LTX timestamp before
/// publishing), never an old name.
pub fn old_enough(name: &str, changed_s: i64, now_s: i64, older_s: i64) -> bool {
    let old = |t: i64| now_s.saturating_sub(t) >= older_s;
    old(changed_s) && tmp_name_made_s(name).is_none_or(old)
}

/// The temporary name a put writes before it publishes `name`:
/// `<name>.<pid>.<nanoseconds>.tmp`, which says when it was made ([`tmp_name_made_s`]).
pub fn put_tmp_name(name: &str) -> String {
    use std::sync::atomic::{AtomicI64, Ordering};
    // Never the same twice in this process, also within one tick of the clock or after it
    // stepped back: two puts of one name (a seed and a snapshot of the same range) must not
    // share a file.
    static LAST: AtomicI64 = AtomicI64::new(0);
    let now = Utc::now().timestamp_nanos_opt().unwrap_or_default();
    let prev = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(now.max(last + 1))
        })
        .unwrap_or_else(|last| last);
    format!("{name}.{}.{}.tmp", std::process::id(), now.max(prev + 1))
}

/// When a put's temporary name `<name>.<pid>.<nanoseconds>.tmp` was made, in
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
        let other = format!("{ltx}{}", crate::util::fsutil::unique_tmp_suffix());
        assert!(is_leftover_tmp(&other, true), "{other}");
        assert_eq!(tmp_name_made_s(&other), None);
        // A put under way: its file changed long ago (an old LTX timestamp), its name now.
        let now = Utc::now().timestamp();
        assert!(!old_enough(&put, now - 86_400, now, 3600));
        assert!(old_enough(&other, now - 86_400, now, 3600));
        assert!(!old_enough(&other, now - 60, now, 3600));
        // Made by a clock ahead of ours (ours stepped back since a put began, or another
        // host's): kept, and counted young only when less than the age ahead.
        let ahead = |s: i64| format!("{ltx}.4242.{}.tmp", (now + s) * 1_000_000_000);
        let mut swept = Swept::default();
        assert!(!swept.judge(&ahead(600), true, Some(now - 86_400), now, 3600));
        assert_eq!(swept.young, 1);
        assert!(!swept.judge(&ahead(2 * 86_400), true, Some(now - 86_400), now, 3600));
        assert_eq!(swept.young, 1, "a name two days ahead is not counted young");
        let sealed_put = put_tmp_name(&format!("{ltx}{}", crate::storage::SEALED_SUFFIX));
        assert!(is_leftover_tmp(&sealed_put, true), "{sealed_put}");
        let lease = format!("replicad.lease{}", crate::util::fsutil::unique_tmp_suffix());
        assert!(is_leftover_tmp(&lease, false), "{lease}");
        // Never the same name twice, however fast.
        let names: std::collections::HashSet<String> =
            (0..1000).map(|_| put_tmp_name(ltx)).collect();
        assert_eq!(names.len(), 1000);
        // Not ours: at the root only a lease write's suffix counts; in a level, an LTX name first.
        for (name, in_level) in [
            (put.as_str(), false),
            ("replicad.lease.tmp", false),
            ("notes.1-0123456789abcdef.tmp", true),
            ("a/b.1-0123456789abcdef.tmp", false),
            ("backup.2024-0123456789abcdef.tmp", false),
            (&format!("{ltx}/x.tmp"), true),
            (ltx, true),
            ("0000000000000001-00000000000000FF.ltx.tmp", true),
        ] {
            assert!(!is_leftover_tmp(name, in_level), "{name} ({in_level})");
        }
    }
}
