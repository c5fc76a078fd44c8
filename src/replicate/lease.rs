//! Single writer per replica: a small lease object, `replicad.lease`, at the replica root.
//!
//! Two daemons writing one replica (the same path from two hosts, or two databases pointed at
//! one place) would interleave TXIDs and corrupt the chain. The lease makes that visible on the
//! replica itself, for every backend, through [`ReplicaClient`]'s auxiliary objects: it lies
//! beside the level directories, where neither replicad's nor Litestream's listings look.
//!
//! Protocol (every step is one request):
//! - **Acquire**, before the replica is listed at start: read the lease. If another instance
//!   holds it and refreshed it less than *its* TTL ago by our clock, refuse (the daemon exits
//!   1 with an error naming the holder's host, pid and database). A lease left by a previous
//!   run of the same database on the same host is taken over at once when that run is known
//!   to have ended: it is the instance named by the database's local claim, which this
//!   process now holds (`StagingLock`: a kernel lock, released only when its holder ends), or
//!   its lease says it ran before this host's last boot (on this machine, where both leases
//!   record a machine id), or in our PID namespace under a pid no process has now. A pid
//!   from another boot or another PID namespace is never trusted: after a reboot another
//!   process may have it, and every container with a PID namespace of its own is pid 1. Any
//!   other lease that looks expired is watched for its TTL on our monotonic clock and taken
//!   over only if it did not change (a live holder rewrites it every TTL/2): a clock that
//!   disagrees can delay a takeover, never make one early.
//! - **Mode**, learnt once by a probe at acquire: a write conditional on a version no object
//!   has must be refused where the store honours conditions (AWS S3, MinIO, R2, s3s). Then
//!   every write of the lease is a compare-and-swap (`If-None-Match: *` when absent,
//!   `If-Match: <ETag>` to replace what we read or wrote), so two instances can never both
//!   take it, and the S3 client puts objects with `If-None-Match: *`. Elsewhere (directory
//!   replicas, stores without conditions) a write is followed by a read-back: when two
//!   instances start together, the last writer wins and the other sees it and refuses.
//!   Where a replace removes the old object first (SFTP, WebDAV), a holder's refresh leaves a
//!   moment without a lease, so a missing lease is read again before it counts as free: a
//!   second later while a lease write's temporary file is there (one listing), at once when
//!   it is not (that write ended between the two requests), up to three times.
//! - **Check**, before an upload round: read the lease (one GET) and stop if it is not ours.
//!   In conditional mode a round skips it while a read (or our compare-and-swap) found the
//!   lease ours less than [`Lease::reread_after`] ago (TTL/60, 10 s by default, on the boot
//!   clock, so a host that slept counts its sleep) and no refresh is due. A takeover normally
//!   waits for our lease to stay unchanged for a TTL, and we rewrite it every TTL/2; one that
//!   does not wait (the lease vanished, a predecessor on the same host) is seen at the next
//!   read, and what we write until then is what a paused holder's round can write anyway:
//!   objects put with `If-None-Match: *`, which never replace the new holder's and which it
//!   continues after with a seed (`Replica::diverged`). Without conditional writes a late
//!   write could replace an object, so every round reads the lease (a directory replica's
//!   read is no request). A busy database on S3 so pays one GET per 10 s, not one per
//!   upload. An idle replica sends nothing for this.
//! - **Refresh**, when the lease is older than half its TTL (on the upload path or on an idle
//!   wake-up): check, then rewrite it (conditionally on our last version). So an idle replica
//!   costs two requests per TTL/2 (default 10 min: two requests every 5 min).
//! - **Release** on a clean shutdown: delete it if it is still ours.
//!
//! Invariant: a replica whose lease another instance took makes no further write: its upload
//! task stops, loudly, and `/readyz` reports it. A lease that vanished (the replica wiped, or
//! the lease deleted alone) is taken again after one listing (see [`crate::replicate::replica`]).
//! Residual window without conditional writes: a check and the PUTs of its round are not
//! atomic; an instance paused for longer than the TTL between its check and its PUT can still
//! write one round after a takeover (the next check stops it). With conditional writes that
//! round's objects are refused, since the new holder's objects already hold those TXIDs or
//! will be refused in turn (see `Replica::diverged`).

use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::replicate::counters::ReplicaCounters;
use crate::storage::{AnyClient, PROBE_VERSION, ReplicaClient, StorageError, WriteIf};
use crate::util::clock::since_boot;

pub use crate::config::{DEFAULT_LEASE_TTL, MIN_LEASE_TTL};
/// Name of the lease object at the replica root.
pub use crate::storage::LEASE_NAME;

/// How long after finding no lease, with a lease write under way, it is read again: where a
/// replace removes the old object first, that moment lasts a round trip, and a lease read in
/// it looked free.
const AUX_GAP: Duration = Duration::from_secs(1);

/// Looks for a lease write under way before a missing lease counts as free: a write whose
/// connection dropped is redone whole, with a new temporary file.
const AUX_GAP_LOOKS: usize = 3;

/// What the lease object holds (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// Random id of the daemon process that holds it.
    pub instance: String,
    /// Host name of that process.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The database it replicates.
    pub db: String,
    /// Its TTL in milliseconds: others judge its liveness by the holder's TTL, not their own.
    pub ttl_ms: u64,
    /// Wall-clock time of the last write, milliseconds since the epoch.
    pub refreshed_ms: i64,
    /// replicad version.
    pub version: String,
    /// The holder's boot (`/proc/sys/kernel/random/boot_id`); empty when written by a
    /// replicad that did not record it.
    #[serde(default)]
    pub boot: String,
    /// The holder's PID namespace (`/proc/self/ns/pid`): its pid means something only there.
    #[serde(default)]
    pub pid_ns: String,
    /// The holder's machine (`/etc/machine-id`); empty where there is none (many containers)
    /// or when written by a replicad that did not record it. Tells another boot of this host
    /// from another host that has our host name.
    #[serde(default)]
    pub machine: String,
}

impl fmt::Display for LeaseRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "host {} pid {} (database {}, instance {})",
            self.host, self.pid, self.db, self.instance
        )
    }
}

/// Why a replica may not be written.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another live instance holds the lease.
    #[error(
        "replica {replica} is in use by another replicad: {holder}, lease refreshed {age_s}s ago \
         (ttl {ttl_s}s); refusing to write to it. Stop that instance, or, if it crashed, wait \
         for its lease to expire"
    )]
    Held {
        /// Replica location.
        replica: String,
        /// The holder.
        holder: Box<LeaseRecord>,
        /// Seconds since its last refresh (negative: in the future).
        age_s: i64,
        /// Its TTL in seconds.
        ttl_s: u64,
    },
    /// Our lease was replaced or removed while we ran.
    #[error(
        "lost the lease of replica {replica}: it is now held by {holder}; this replica stops \
         uploading (restart this daemon once the other instance is gone)"
    )]
    Lost {
        /// Replica location.
        replica: String,
        /// The new holder, or a description when there is none.
        holder: String,
    },
    /// Another instance's lease looks expired: it is taken over only once it stayed unchanged
    /// for its TTL, which a start does not wait for (the replica connects in the background).
    #[error(
        "replica {replica} is held by {holder}, whose lease looks expired: taking it over once \
         it has stayed unchanged for its TTL ({ttl_s}s)"
    )]
    Expired {
        /// Replica location.
        replica: String,
        /// The holder.
        holder: Box<LeaseRecord>,
        /// Its TTL in seconds.
        ttl_s: u64,
    },
    /// Our lease object is gone (the replica was emptied, or the lease deleted alone).
    #[error(
        "the lease of replica {replica} was removed (the replica was emptied, or its lease \
         deleted)"
    )]
    Vanished {
        /// Replica location.
        replica: String,
    },
    /// The lease object exists but is not a replicad lease.
    #[error(
        "replica {replica} has a {LEASE_NAME} that is not a replicad lease ({reason}); remove \
         it if no other replicad writes there"
    )]
    Unreadable {
        /// Replica location.
        replica: String,
        /// Parse error.
        reason: String,
    },
    /// The replica could not be read or written.
    #[error("lease of replica {replica}: {error}")]
    Storage {
        /// Replica location.
        replica: String,
        /// The failure.
        error: StorageError,
    },
}

impl LeaseError {
    /// True if retrying later may succeed (storage hiccups only).
    pub fn is_retryable(&self) -> bool {
        matches!(self, LeaseError::Storage { error, .. } if error.is_retryable())
            || matches!(self, LeaseError::Expired { .. })
    }

    /// True if another writer is involved (held, lost or foreign lease), as opposed to a
    /// failure to reach the replica, which is retried like any upload failure.
    pub fn is_conflict(&self) -> bool {
        !matches!(
            self,
            LeaseError::Storage { .. } | LeaseError::Vanished { .. } | LeaseError::Expired { .. }
        )
    }

    /// True when our lease object is gone: the replica may have been wiped.
    pub fn is_vanished(&self) -> bool {
        matches!(self, LeaseError::Vanished { .. })
    }
}

/// Random id of this process, shared by all its leases and local claims.
pub(crate) fn instance_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        use rand::RngExt;
        let bytes: [u8; 16] = rand::rng().random();
        hex::encode(bytes)
    })
}

/// This host's name (`uname -n`).
fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// True unless the process `pid` certainly does not exist in this PID namespace.
fn pid_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    !matches!(
        rustix::process::test_kill_process(pid),
        Err(rustix::io::Errno::SRCH)
    )
}

/// This boot's id, this process's PID namespace and this machine's id (each empty where the
/// system does not say); read once, not at each of thousands of leases.
fn local_ids() -> &'static (String, String, String) {
    static IDS: OnceLock<(String, String, String)> = OnceLock::new();
    IDS.get_or_init(|| {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        let boot = read("/proc/sys/kernel/random/boot_id");
        let ns = std::fs::read_link("/proc/self/ns/pid").unwrap_or_default();
        let machine = Some(read("/etc/machine-id"))
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| read("/var/lib/dbus/machine-id"));
        (boot, ns.to_string_lossy().into_owned(), machine)
    })
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The lease of one replica, as held by this process.
pub struct Lease {
    client: AnyClient,
    me: LeaseRecord,
    ttl: Duration,
    /// When our lease was last written (monotonic).
    written_at: Option<Instant>,
    /// When the last read or compare-and-swap that found the lease ours began, on the boot
    /// clock ([`since_boot`]); `None` until one succeeds after the last failure.
    confirmed_at: Option<Duration>,
    /// The version (ETag) of our last write, where the backend has versions.
    version: Option<String>,
    /// Whether the backend honours conditional writes (learnt by the probe at acquire).
    mode: Mode,
    /// The instance that ran this database here before us and has ended
    /// ([`Lease::succeeding`]).
    predecessor: Option<String>,
}

/// How the lease is kept single: where the store allows it, every write of the lease is
/// conditional (compare-and-swap on its version), so two writers can never both believe they
/// hold it; elsewhere a write is followed by a read-back (last writer wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Not probed yet.
    Unknown,
    /// Conditional writes (`If-None-Match`, `If-Match`) are honoured.
    Conditional,
    /// They are not: write, then read back.
    ReadCheck,
}

impl Mode {
    /// For logs.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Unknown => "unknown",
            Mode::Conditional => "conditional",
            Mode::ReadCheck => "read-check",
        }
    }
}

impl Lease {
    /// The lease this process would hold on `client` for database `db`.
    pub fn new(client: AnyClient, db: &str, ttl: Duration) -> Lease {
        let (boot, pid_ns, machine) = local_ids();
        Lease {
            client,
            me: LeaseRecord {
                instance: instance_id().to_string(),
                host: host_name(),
                pid: std::process::id(),
                db: db.to_string(),
                ttl_ms: ttl.as_millis() as u64,
                refreshed_ms: 0,
                version: env!("CARGO_PKG_VERSION").to_string(),
                boot: boot.clone(),
                pid_ns: pid_ns.clone(),
                machine: machine.clone(),
            },
            ttl,
            written_at: None,
            confirmed_at: None,
            version: None,
            mode: Mode::Unknown,
            predecessor: None,
        }
    }

    /// Names the instance that ran this database on this host before this process and is
    /// known to have ended (`StagingLock::predecessor`): a lease it left is taken over at
    /// once.
    pub fn succeeding(mut self, predecessor: Option<&str>) -> Lease {
        self.predecessor = predecessor.map(str::to_string);
        self
    }

    /// How this lease is kept single (known once acquired).
    pub fn mode(&self) -> Mode {
        self.mode
    }

    fn storage(&self, error: StorageError) -> LeaseError {
        LeaseError::Storage {
            replica: self.client.location(),
            error,
        }
    }

    async fn read(&self, counters: &ReplicaCounters) -> Result<Option<LeaseRecord>, LeaseError> {
        Ok(self.read_versioned(counters).await?.map(|(r, _)| r))
    }

    /// The lease object and its version (S3: ETag), when it exists.
    async fn read_versioned(
        &self,
        counters: &ReplicaCounters,
    ) -> Result<Option<(LeaseRecord, Option<String>)>, LeaseError> {
        let started = Instant::now();
        let r = self.client.read_aux_versioned(LEASE_NAME).await;
        counters.observe(1, started, &r);
        match r.map_err(|e| self.storage(e))? {
            None => Ok(None),
            Some((bytes, version)) => serde_json::from_slice(&bytes)
                .map(|rec| Some((rec, version)))
                .map_err(|e| LeaseError::Unreadable {
                    replica: self.client.location(),
                    reason: e.to_string(),
                }),
        }
    }

    /// Writes our record. In conditional mode only if `cond` holds (a conflict means another
    /// writer got there first); otherwise unconditionally.
    async fn write(&mut self, counters: &ReplicaCounters, cond: WriteIf) -> Result<(), LeaseError> {
        let at = Instant::now();
        self.me.refreshed_ms = now_ms();
        let body = serde_json::to_vec(&self.me).expect("a lease record always serialises");
        let r = match self.mode {
            Mode::ReadCheck => self.client.write_aux(LEASE_NAME, body).await.map(|()| None),
            _ => self.client.write_aux_if(LEASE_NAME, body, cond).await,
        };
        counters.observe(0, at, &r);
        self.version = r.map_err(|e| self.storage(e))?;
        self.written_at = Some(at);
        Ok(())
    }

    /// The condition under which our next write replaces `version` (absent: none exists).
    fn replacing(version: Option<String>) -> WriteIf {
        version.map_or(WriteIf::Absent, WriteIf::Version)
    }

    /// Learns whether the backend honours conditions: a write conditional on a version no
    /// object has must fail. Where it does not fail, it wrote our record again (harmless).
    async fn probe(&mut self, counters: &ReplicaCounters) -> Result<(), LeaseError> {
        let body = serde_json::to_vec(&self.me).expect("a lease record always serialises");
        let at = Instant::now();
        let r = self
            .client
            .write_aux_if(LEASE_NAME, body, WriteIf::Version(PROBE_VERSION.into()))
            .await;
        counters.observe(0, at, &r);
        self.mode = match r {
            // Refused, without writing: 412, or 404 where the lease does not exist (AWS).
            Err(StorageError::Conflict { .. } | StorageError::NotFound(_)) => Mode::Conditional,
            Ok(_) => Mode::ReadCheck,
            // A store that rejects the header itself (400, 501) has no conditional writes.
            Err(e @ StorageError::Permanent { .. }) => {
                tracing::info!(replica = %self.client.location(), error = %e, "conditional writes refused; keeping the lease with read-backs");
                Mode::ReadCheck
            }
            Err(e) => return Err(self.storage(e)),
        };
        Ok(())
    }

    /// [`Lease::read_versioned`], where a replace removes the old lease first: a holder
    /// refreshing its lease there is not a free lease. A lease found missing while a write of
    /// it is under way ([`ReplicaClient::aux_write_in_flight`]) is read again after
    /// [`AUX_GAP`]; found missing after that write ended (its rename came before the look),
    /// it is read again at once. Elsewhere one read.
    async fn read_settled(
        &self,
        counters: &ReplicaCounters,
    ) -> Result<Option<(LeaseRecord, Option<String>)>, LeaseError> {
        let found = self.read_versioned(counters).await?;
        if found.is_some() || !self.client.replaces_aux_in_two_steps() {
            return Ok(found);
        }
        for _ in 0..AUX_GAP_LOOKS {
            let at = Instant::now();
            let in_flight = self.client.aux_write_in_flight(LEASE_NAME).await;
            counters.observe(2, at, &in_flight);
            if in_flight.map_err(|e| self.storage(e))? {
                tokio::time::sleep(AUX_GAP).await;
            }
            let found = self.read_versioned(counters).await?;
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    fn is_mine(&self, other: &LeaseRecord) -> bool {
        other.instance == self.me.instance && other.db == self.me.db
    }

    /// A previous run of this database on this host that has ended: safe to take over at once.
    fn is_my_predecessor(&self, other: &LeaseRecord) -> bool {
        other.host == self.me.host
            && other.db == self.me.db
            && (self.predecessor.as_deref() == Some(other.instance.as_str())
                || self.has_ended(other))
    }

    /// Whether `other`'s process has certainly ended, as seen from here: it ran before this
    /// host's last boot, or in our PID namespace under a pid no process has now. Unknown (so
    /// false) in another PID namespace of this boot: a twin container is pid 1 too, and that
    /// is where the local claim decides ([`Lease::succeeding`]). Unknown too for another boot
    /// of another machine (both record one): a host that has our name, such as a pod
    /// rescheduled while the old node still reaches the store. Without machine ids (many
    /// containers) another boot still counts as this host's earlier one.
    fn has_ended(&self, other: &LeaseRecord) -> bool {
        let me = &self.me;
        if [&other.boot, &other.pid_ns, &me.boot, &me.pid_ns]
            .iter()
            .any(|s| s.is_empty())
        {
            // Written by a replicad that did not record them: judged by the pid, as it did.
            return other.pid == me.pid || !pid_alive(other.pid);
        }
        if other.boot != me.boot {
            return other.machine.is_empty()
                || me.machine.is_empty()
                || other.machine == me.machine;
        }
        other.pid_ns == me.pid_ns && !pid_alive(other.pid)
    }

    /// Takes the lease (see the module docs), or says who holds it.
    pub async fn acquire(&mut self, counters: &ReplicaCounters) -> Result<(), LeaseError> {
        self.acquire_inner(counters, true).await
    }

    /// [`Lease::acquire`]; without `watch`, a lease that looks expired is
    /// [`LeaseError::Expired`] instead of being watched for its TTL.
    async fn acquire_inner(
        &mut self,
        counters: &ReplicaCounters,
        watch: bool,
    ) -> Result<(), LeaseError> {
        let replica = self.client.location();
        self.confirmed_at = None;
        let mut version = None;
        if let Some((held, v)) = self.read_settled(counters).await? {
            version = v;
            let age_ms = now_ms() - held.refreshed_ms;
            if self.is_mine(&held) {
                // Our own (a retried acquire): just refresh it.
            } else if self.is_my_predecessor(&held) {
                tracing::info!(%replica, previous = %held, "taking over the lease of a previous run of this database on this host");
            } else if age_ms < 0 || (age_ms as u64) < held.ttl_ms {
                return Err(LeaseError::Held {
                    replica,
                    age_s: age_ms / 1000,
                    ttl_s: held.ttl_ms / 1000,
                    holder: Box::new(held),
                });
            } else if !watch {
                return Err(LeaseError::Expired {
                    replica,
                    ttl_s: held.ttl_ms / 1000,
                    holder: Box::new(held),
                });
            } else {
                // Old by our clock, but clocks may disagree: the holder is gone only if the
                // lease stays unchanged for its TTL, as measured here.
                version = self.watch_expire(counters, held, version).await?;
            }
        }
        if self.mode == Mode::Unknown {
            self.probe(counters).await?;
        }
        let cond = Self::replacing(version);
        let wrote_at = since_boot();
        let written = match self.write(counters, cond).await {
            // Another writer got there between our read and our write: the read-back says who.
            Err(LeaseError::Storage {
                error: StorageError::Conflict { .. },
                ..
            }) => false,
            r => r.map(|()| true)?,
        };
        if self.mode == Mode::Conditional && written {
            // The compare-and-swap went through: nobody else can have written since.
            self.confirmed_at = Some(wrote_at);
            tracing::info!(replica = %replica, ttl = ?self.ttl, mode = self.mode.label(), "single-writer lease acquired");
            return Ok(());
        }
        let read_at = since_boot();
        match self.read_versioned(counters).await? {
            Some((held, v)) if self.is_mine(&held) => {
                self.version = v;
                self.confirmed_at = Some(read_at);
                tracing::info!(replica = %replica, ttl = ?self.ttl, mode = self.mode.label(), "single-writer lease acquired");
                Ok(())
            }
            Some((held, _)) => Err(LeaseError::Held {
                replica,
                age_s: (now_ms() - held.refreshed_ms) / 1000,
                ttl_s: held.ttl_ms / 1000,
                holder: Box::new(held),
            }),
            None => Err(LeaseError::Lost {
                replica,
                holder: "nobody (the lease vanished right after it was written)".into(),
            }),
        }
    }

    /// Watches another instance's lease, which looks expired by our clock, for its TTL on our
    /// monotonic clock: a live holder rewrites it within half its TTL. Returns the version to
    /// replace once it stayed unchanged; [`LeaseError::Held`] when it changed.
    async fn watch_expire(
        &self,
        counters: &ReplicaCounters,
        held: LeaseRecord,
        version: Option<String>,
    ) -> Result<Option<String>, LeaseError> {
        let replica = self.client.location();
        let ttl = Duration::from_millis(held.ttl_ms);
        tracing::warn!(%replica, previous = %held, ttl = ?ttl, "the lease looks expired; taking it over if it stays unchanged for its TTL");
        let until = Instant::now() + ttl;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(%replica, previous = %held, "taking over an expired lease");
                return Ok(version);
            }
            tokio::time::sleep(left.min(ttl / 4).max(Duration::from_millis(50))).await;
            match self.read_settled(counters).await? {
                Some((now, v)) if now == held && v == version => {}
                // Gone meanwhile: nobody holds it any more.
                None => return Ok(None),
                Some((now, _)) => {
                    return Err(LeaseError::Held {
                        replica,
                        age_s: (now_ms() - now.refreshed_ms) / 1000,
                        ttl_s: now.ttl_ms / 1000,
                        holder: Box::new(now),
                    });
                }
            }
        }
    }

    /// [`Lease::acquire`], retrying transient storage failures with backoff (a replica that
    /// blinks at startup must not stop the daemon); a held lease or a permanent failure
    /// returns at once.
    pub async fn acquire_with_retries(
        &mut self,
        counters: &ReplicaCounters,
        attempts: u32,
    ) -> Result<(), LeaseError> {
        let mut backoff =
            crate::util::retry::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut attempt = 1;
        loop {
            match self.acquire_inner(counters, false).await {
                Err(e @ LeaseError::Expired { .. }) => return Err(e),
                Err(e) if e.is_retryable() && attempt < attempts => {
                    tracing::debug!(attempt, error = %e, "taking the lease failed; retrying");
                    attempt += 1;
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                r => return r,
            }
        }
    }

    /// How long a read that found the lease ours spares upload rounds their own: TTL/60 (10 s
    /// with the default TTL) in conditional mode, far inside the TTL a takeover waits for;
    /// zero otherwise (see the module docs).
    pub fn reread_after(&self) -> Duration {
        match self.mode {
            Mode::Conditional => self.ttl / 60,
            Mode::Unknown | Mode::ReadCheck => Duration::ZERO,
        }
    }

    /// Whether an upload round must read the lease first (see the module docs).
    pub fn check_due(&self) -> bool {
        let Some(confirmed) = self.confirmed_at else {
            return true;
        };
        self.refresh_in().is_zero() || since_boot().saturating_sub(confirmed) >= self.reread_after()
    }

    /// [`Lease::check`] when [`Lease::check_due`]; otherwise sends nothing.
    pub async fn check_if_due(&mut self, counters: &ReplicaCounters) -> Result<(), LeaseError> {
        if self.check_due() {
            self.check(counters).await
        } else {
            Ok(())
        }
    }

    /// Reads the lease: its version when it is ours, else [`LeaseError::Lost`] or, when it is
    /// gone, [`LeaseError::Vanished`].
    async fn read_ours(&self, counters: &ReplicaCounters) -> Result<Option<String>, LeaseError> {
        match self.read_versioned(counters).await? {
            Some((held, v)) if self.is_mine(&held) => Ok(v),
            Some((other, _)) => Err(LeaseError::Lost {
                replica: self.client.location(),
                holder: other.to_string(),
            }),
            None => Err(LeaseError::Vanished {
                replica: self.client.location(),
            }),
        }
    }

    /// Checks that the lease is still ours (one GET), and refreshes it when due.
    pub async fn check(&mut self, counters: &ReplicaCounters) -> Result<(), LeaseError> {
        let read_at = since_boot();
        // Set again only once this check has succeeded: a failed one is repeated next round.
        self.confirmed_at = None;
        let version = self.read_ours(counters).await?;
        // The version just read is ours (a refresh whose answer was lost moved it on).
        if version.is_some() {
            self.version = version;
        }
        if self.refresh_in().is_zero() {
            let cond = Self::replacing(self.version.clone());
            match self.write(counters, cond).await {
                Err(LeaseError::Storage {
                    error: StorageError::Conflict { .. },
                    ..
                }) => {
                    // Changed between our read and our write: ours still (adopt its
                    // version), another instance's, or deleted (a wipe, handled as one).
                    self.version = self.read_ours(counters).await?;
                }
                r => r?,
            }
        }
        self.confirmed_at = Some(read_at);
        Ok(())
    }

    /// Refreshes the lease if half its TTL has passed since it was written (check + write);
    /// otherwise sends nothing.
    pub async fn refresh_if_due(&mut self, counters: &ReplicaCounters) -> Result<(), LeaseError> {
        if self.refresh_in().is_zero() {
            self.check(counters).await
        } else {
            Ok(())
        }
    }

    /// Time until the next refresh is due (zero: now).
    pub fn refresh_in(&self) -> Duration {
        match self.written_at {
            Some(at) => (self.ttl / 2).saturating_sub(at.elapsed()),
            None => Duration::ZERO,
        }
    }

    /// Deletes the lease if it is still ours (clean shutdown); failures are only logged.
    pub async fn release(&mut self, counters: &ReplicaCounters) {
        match self.read(counters).await {
            Ok(Some(held)) if self.is_mine(&held) => {
                let started = Instant::now();
                let r = self.client.delete_aux(LEASE_NAME).await;
                counters.observe(3, started, &r);
                match r {
                    Ok(()) => tracing::debug!(replica = %self.client.location(), "lease released"),
                    Err(e) => {
                        tracing::warn!(replica = %self.client.location(), error = %e, "could not release the lease; the next start on this host takes it over, another host after the TTL")
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not read the lease to release it")
            }
        }
    }
}

#[cfg(test)]
mod tests;
