//! systemd service notifications (`sd_notify(3)`), without libsystemd.
//!
//! When `NOTIFY_SOCKET` is set (systemd does for `Type=notify` units), the daemon sends
//! datagrams of `KEY=VALUE` lines to that socket — a path, or an abstract socket when it
//! starts with `@`:
//!
//! - `READY=1` (with `STATUS=replicating N databases`) once **every database has completed
//!   its first sync** (a tick without error), not merely once they are open: until then
//!   `systemctl start` waits and `STATUS=` says how many are done. A database that never
//!   syncs keeps the unit starting until systemd's `TimeoutStartSec`.
//! - `WATCHDOG=1` every `WATCHDOG_USEC / 2` when `WATCHDOG_USEC` is set (and `WATCHDOG_PID`,
//!   if set, is our pid). It is sent from the async runtime, so a wedged runtime stops it and
//!   systemd restarts the service after `WatchdogSec`. It keeps going during the shutdown drain.
//! - `STATUS=replicating N databases, max replica lag K TXIDs` whenever it changes (checked
//!   every second); the lag is the largest `db TXID - replica remote TXID` over all replicas.
//!   While a database or replica is not protected, the line starts with `NOT PROTECTED:`
//!   and the first reason.
//! - `STOPPING=1` when shutdown starts.
//!
//! Sending is best effort: a failed send is logged once at debug level and otherwise ignored.
//! The child of `exec` does not see `NOTIFY_SOCKET` or the watchdog variables
//! ([`CHILD_ENV_REMOVE`]): with `NotifyAccess=main` its messages would be dropped anyway.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::daemon::DbHandle;
use crate::daemon::registry::DbRegistry;

/// Environment variables removed from the environment of the `exec` child.
pub const CHILD_ENV_REMOVE: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// How often readiness is checked before `READY=1`.
const READY_POLL: Duration = Duration::from_millis(50);
/// How often the status line is recomputed after `READY=1`.
const STATUS_POLL: Duration = Duration::from_secs(1);

/// A connection to the service manager's notification socket.
#[derive(Debug)]
pub struct Notifier {
    sock: UnixDatagram,
    addr: SocketAddr,
}

impl Notifier {
    /// The notifier of `NOTIFY_SOCKET`, or `None` when it is unset or empty.
    pub fn from_env() -> io::Result<Option<Notifier>> {
        match std::env::var_os("NOTIFY_SOCKET") {
            Some(v) if !v.is_empty() => Notifier::new(&v.to_string_lossy()).map(Some),
            _ => Ok(None),
        }
    }

    /// A notifier sending to `socket`: a file system path, or `@name` for an abstract socket.
    pub fn new(socket: &str) -> io::Result<Notifier> {
        let addr = match socket.strip_prefix('@') {
            Some(name) => abstract_addr(name.as_bytes())?,
            None => SocketAddr::from_pathname(socket)?,
        };
        Ok(Notifier {
            sock: UnixDatagram::unbound()?,
            addr,
        })
    }

    /// Sends one datagram of `KEY=VALUE` lines.
    pub fn send(&self, message: &str) -> io::Result<()> {
        self.sock
            .send_to_addr(message.as_bytes(), &self.addr)
            .map(|_| ())
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn abstract_addr(name: &[u8]) -> io::Result<SocketAddr> {
    #[cfg(target_os = "android")]
    use std::os::android::net::SocketAddrExt;
    #[cfg(target_os = "linux")]
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn abstract_addr(_: &[u8]) -> io::Result<SocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract sockets exist on Linux only",
    ))
}

/// The watchdog period (`WATCHDOG_USEC / 2`), when the watchdog is on and meant for us.
pub fn watchdog_interval() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    watchdog_interval_of(usec.as_deref(), pid.as_deref(), std::process::id())
}

/// [`watchdog_interval`] for given variable values and pid.
pub fn watchdog_interval_of(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    Some(Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

fn synced(db: &DbHandle) -> bool {
    db.sync.synced() > 0
}

/// The largest replica lag in TXIDs: database TXID minus the replica's remote TXID.
pub fn max_lag_txids(dbs: &[DbHandle]) -> u64 {
    dbs.iter()
        .flat_map(|db| {
            let txid = db.stats.txid.load(Ordering::Relaxed);
            db.replicas
                .iter()
                .map(move |(_, r)| txid.saturating_sub(r.remote_txid.load(Ordering::Relaxed)))
        })
        .max()
        .unwrap_or(0)
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// What is not protected now, one line each, by the rule of `/status`: databases and
/// replicas with a problem, replicas whose lease was taken, and replicas past `max_lag`.
pub fn problems(dbs: &[DbHandle], max_lag: Duration, since_ms: i64) -> Vec<String> {
    let mut out = Vec::new();
    for d in dbs {
        if let Some(why) = crate::ops::metrics::db_unprotected(d) {
            out.push(format!("{}: {why}", d.path.display()));
        }
        let pos = *d.pos.borrow();
        for (name, r) in &d.replicas {
            if let Some(why) = crate::ops::metrics::unprotected(pos, r, max_lag, since_ms) {
                out.push(format!("{} replica {name}: {why}", d.path.display()));
            }
        }
    }
    out
}

/// The status line after `READY=1`: what is not protected comes first when anything is not.
fn status_line(dbs: &[DbHandle], max_lag: Duration, since_ms: i64) -> String {
    let n = dbs.len();
    let base = format!(
        "replicating {n} database{}, max replica lag {} TXIDs",
        plural(n),
        max_lag_txids(dbs)
    );
    let problems = problems(dbs, max_lag, since_ms);
    match problems.first() {
        None => format!("STATUS={base}"),
        Some(first) => format!(
            "STATUS=NOT PROTECTED: {first}{}; {base}",
            match problems.len() {
                1 => String::new(),
                k => format!(" (and {} more)", k - 1),
            }
        ),
    }
}

/// The notification task of a running daemon (see the module documentation).
pub struct Notify {
    notifier: Arc<Notifier>,
    stopping: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Notify {
    /// Starts the notifications for `dbs`; `None` when `NOTIFY_SOCKET` is unset (or unusable,
    /// which is logged).
    /// Replicas count as protected by `/status`'s rule: within `max_lag`, counted from no
    /// earlier than `since_ms` (the Store's start).
    pub fn start(dbs: DbRegistry, max_lag: Duration, since_ms: i64) -> Option<Notify> {
        let notifier = match Notifier::from_env() {
            Ok(Some(n)) => Arc::new(n),
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "NOTIFY_SOCKET is unusable: no systemd notifications");
                return None;
            }
        };
        let stopping = CancellationToken::new();
        let task = tokio::spawn(run(
            notifier.clone(),
            dbs,
            watchdog_interval(),
            stopping.clone(),
            (max_lag, since_ms),
        ));
        Some(Notify {
            notifier,
            stopping,
            task,
        })
    }

    /// Sends `STOPPING=1`; the watchdog keeps going until [`Notify::finish`].
    pub fn stopping(&self) {
        self.stopping.cancel();
        send(
            &self.notifier,
            "STOPPING=1\nSTATUS=stopping: final sync and upload",
        );
    }

    /// Stops the task.
    pub fn finish(self) {
        self.task.abort();
    }
}

fn send(notifier: &Notifier, message: &str) {
    if let Err(e) = notifier.send(message) {
        tracing::debug!(error = %e, message, "sd_notify failed");
    }
}

async fn run(
    notifier: Arc<Notifier>,
    registry: DbRegistry,
    watchdog: Option<Duration>,
    stopping: CancellationToken,
    (max_lag, since_ms): (Duration, i64),
) {
    let mut watchdog = watchdog.map(|every| {
        let mut i = tokio::time::interval(every);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    let mut ready = false;
    let mut last_status = String::new();
    let mut poll = tokio::time::interval(READY_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = async {
                match watchdog.as_mut() {
                    Some(w) => w.tick().await,
                    None => std::future::pending().await,
                }
            } => {
                send(&notifier, "WATCHDOG=1");
                continue;
            }
            _ = poll.tick(), if !stopping.is_cancelled() => {}
            _ = stopping.cancelled(), if !stopping.is_cancelled() => continue,
        }
        let dbs = registry.snapshot();
        if !ready {
            // A stand-in for a database whose start failed never syncs: it must not hold the
            // service's start (STATUS names it once ready).
            let started: Vec<&DbHandle> = dbs.iter().filter(|d| !d.unstarted).collect();
            let done = started.iter().filter(|db| synced(db)).count();
            if done < started.len() {
                let status = format!(
                    "STATUS=starting: {done} of {} databases synced",
                    started.len()
                );
                if status != last_status {
                    send(&notifier, &status);
                    last_status = status;
                }
                continue;
            }
            ready = true;
            let n = dbs.len();
            send(
                &notifier,
                &format!("READY=1\nSTATUS=replicating {n} database{}", plural(n)),
            );
            tracing::debug!("sd_notify: READY=1");
            poll = tokio::time::interval(STATUS_POLL);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            poll.tick().await;
            continue;
        }
        let status = status_line(&dbs, max_lag, since_ms);
        if status != last_status {
            send(&notifier, &status);
            last_status = status;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_line_leads_with_what_is_not_protected() {
        let handle = |path: &str| DbHandle {
            path: path.into(),
            stats: Default::default(),
            replicas: Vec::new(),
            pos: tokio::sync::watch::channel(Default::default()).1,
            sync: Default::default(),
            unstarted: false,
        };
        let lag = Duration::from_secs(10);
        let dbs = vec![handle("/a.db"), handle("/b.db")];
        // No sync completed yet (a start waiting its turn sets no problem): not protected.
        dbs[1].sync.done(1);
        assert_eq!(
            status_line(&dbs, lag, 0),
            "STATUS=NOT PROTECTED: /a.db: first sync not completed; replicating 2 databases, \
             max replica lag 0 TXIDs"
        );
        dbs[0].sync.done(1);
        assert_eq!(
            status_line(&dbs, lag, 0),
            "STATUS=replicating 2 databases, max replica lag 0 TXIDs"
        );
        dbs[1].stats.health.fail("not protected: disk full");
        assert_eq!(
            status_line(&dbs, lag, 0),
            "STATUS=NOT PROTECTED: /b.db: not protected: disk full; replicating 2 databases, \
             max replica lag 0 TXIDs"
        );
    }

    #[test]
    fn status_line_names_a_replica_past_max_lag_without_a_problem() {
        let counters = crate::replicate::counters::ReplicaMetrics::register(
            &prometheus::Registry::new(),
            Arc::default(),
        )
        .replica("/a.db", "r", false);
        let r = crate::replicate::replica::ReplicaStats::new(counters, "file:///r");
        // The replica holds TXID 3 of 5; the newest segment was cut a minute ago (an upload
        // that hangs without an error, so no problem is set).
        let now = crate::util::clock::steady_ms();
        r.remote_txid.store(3, Ordering::Relaxed);
        r.remote_steady_ms
            .store((now - 70_000) as u64, Ordering::Relaxed);
        let pos = crate::replicate::db::DbPos {
            txid: crate::ltx::TxId(5),
            timestamp_ms: now - 60_000,
            steady_ms: now - 60_000,
        };
        let dbs = vec![DbHandle {
            path: "/a.db".into(),
            stats: Default::default(),
            replicas: vec![("r".into(), r)],
            pos: tokio::sync::watch::channel(pos).1,
            sync: Default::default(),
            unstarted: false,
        }];
        dbs[0].stats.txid.store(5, Ordering::Relaxed);
        dbs[0].sync.done(1);
        let line = status_line(&dbs, Duration::from_secs(10), 0);
        assert!(
            line.starts_with("STATUS=NOT PROTECTED: /a.db replica r: 2 txids and 6"),
            "{line}"
        );
        assert_eq!(
            status_line(&dbs, Duration::from_secs(3600), 0),
            "STATUS=replicating 1 database, max replica lag 2 TXIDs"
        );
    }

    #[test]
    fn watchdog_variables() {
        assert_eq!(watchdog_interval_of(None, None, 7), None);
        assert_eq!(
            watchdog_interval_of(Some("200000"), None, 7),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            watchdog_interval_of(Some("200000"), Some("7"), 7),
            Some(Duration::from_millis(100))
        );
        assert_eq!(watchdog_interval_of(Some("200000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval_of(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval_of(Some("x"), None, 7), None);
    }

    #[test]
    fn sends_to_a_path_and_an_abstract_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        Notifier::new(path.to_str().unwrap())
            .unwrap()
            .send("READY=1")
            .unwrap();
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            let name = format!("replicad-notify-test-{}", std::process::id());
            let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            let server = UnixDatagram::bind_addr(&addr).unwrap();
            Notifier::new(&format!("@{name}"))
                .unwrap()
                .send("WATCHDOG=1")
                .unwrap();
            let n = server.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"WATCHDOG=1");
        }
    }
}
