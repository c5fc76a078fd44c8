//! Failure drills: `REPLICAD_DRILL_FAULTS` makes `replicad replicate` wrap every replica
//! client in a [`FaultyClient`], so that an operator (or the soak test) can watch the daemon
//! ride out storage failures with the real binary.
//!
//! Invariants:
//! - The variable is read once, at startup; unset or empty means no wrapper at all (the
//!   production path is untouched).
//! - A malformed value is a configuration error (exit 2), never silently ignored.
//! - Every start with faults logs a warning, so a drill is never mistaken for an outage.

use std::sync::Arc;
use std::time::Duration;

use crate::daemon::ClientWrapper;
use crate::storage::AnyClient;
use crate::storage::faulty::{Faults, FaultyClient};

/// The environment variable: comma-separated `key=value` pairs, keys `fail-rate` (0.0-1.0:
/// probability that a call fails), `fail-first` (the first N calls fail), `latency` (a Go
/// duration added before every call), `cut-bodies-after` (GET bodies break after N bytes) and
/// `listing-lag` (a Go duration: listings leave out files stored less than that long ago).
/// Example: `REPLICAD_DRILL_FAULTS=fail-rate=0.2,latency=5ms`.
pub const ENV: &str = "REPLICAD_DRILL_FAULTS";

/// The drill's faults, parsed from `spec`.
pub fn parse(spec: &str) -> Result<Arc<Faults>, String> {
    let faults = Faults::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("{ENV}: {part:?} is not key=value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{ENV}: {key}={value:?}: {e}");
        match key.trim() {
            "fail-rate" => {
                let p: f64 = value.trim().parse().map_err(|e| bad(&e))?;
                if !(0.0..=1.0).contains(&p) {
                    return Err(bad(&"must be between 0 and 1"));
                }
                faults.set_fail_rate(p);
            }
            "fail-first" => faults.fail_next(value.trim().parse().map_err(|e| bad(&e))?),
            "latency" => {
                let d: Duration = humantime::parse_duration(value.trim()).map_err(|e| bad(&e))?;
                faults.set_latency(d);
            }
            "cut-bodies-after" => {
                faults.cut_bodies_after(value.trim().parse().map_err(|e| bad(&e))?)
            }
            "listing-lag" => {
                let d: Duration = humantime::parse_duration(value.trim()).map_err(|e| bad(&e))?;
                faults.set_listing_lag(d);
            }
            other => {
                return Err(format!(
                    "{ENV}: unknown key {other:?} (fail-rate, fail-first, latency, cut-bodies-after, listing-lag)"
                ));
            }
        }
    }
    Ok(faults)
}

/// The client wrapper of the drill described by [`ENV`], or `None` when it is unset or empty.
/// Must run inside the Tokio runtime (it starts a task that logs the injected count).
pub fn wrapper_from_env() -> Result<Option<ClientWrapper>, String> {
    let spec = match std::env::var(ENV) {
        Ok(s) if !s.trim().is_empty() => s,
        Ok(_) | Err(std::env::VarError::NotPresent) => return Ok(None),
        Err(e) => return Err(format!("{ENV}: {e}")),
    };
    let faults = parse(&spec)?;
    tracing::warn!(faults = %spec, "failure drill: every replica client injects faults");
    // The count is logged as it grows, so that a drill killed with SIGKILL still tells.
    let counter = faults.clone();
    tokio::spawn(async move {
        let mut logged = 0;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let n = counter.injected();
            if n != logged {
                tracing::info!(injected = n, "failure drill: faults injected so far");
                logged = n;
            }
        }
    });
    let wrap: ClientWrapper = Arc::new(move |_db: &str, _replica: &str, client: AnyClient| {
        AnyClient::Faulty(Box::new(FaultyClient::new(client, faults.clone())))
    });
    Ok(Some(wrap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key_and_refuses_bad_values() {
        let f =
            parse("fail-rate=0.5, fail-first=2,latency=5ms,cut-bodies-after=100,listing-lag=2s")
                .unwrap();
        assert_eq!(f.injected(), 0);
        for bad in [
            "fail-rate=2",
            "fail-rate=x",
            "latency=5",
            "listing-lag=soon",
            "nope=1",
            "fail-first",
        ] {
            let e = parse(bad).err().unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.contains(ENV), "{e}");
        }
        assert!(parse("").is_ok());
    }
}
