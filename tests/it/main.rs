//! The integration tests: one crate, so the AWS SDK and the rest of the crate link once. Each
//! module is one behaviour, tested on real SQLite files, real storage servers on 127.0.0.1
//! (`common::s3`), the real `replicad` binary (`CARGO_BIN_EXE_replicad`) and real signals.
//!
//! One test stays a separate crate because it needs a process of its own:
//! `tests/idle_alloc.rs` installs a counting global allocator.
//!
//! Run one behaviour with `cargo test --test it <module>::`.

mod common;

/// age encryption, end to end: encrypted replicas, identities, mixed plain and sealed files.
mod age;
/// An application's own FULL, RESTART and TRUNCATE checkpoints complete while the daemon
/// runs, beside a concurrent writer, and the chain stays whole.
mod app_checkpoint;
/// The shape of the crate: no import cycle, no file over 800 lines.
mod architecture;
/// Bad input of every kind: a clear error, exit code 2, nothing lost or overwritten.
mod bad_input;
/// Config-driven commands (`restore --config`, `databases`, `status`).
mod cli_config;
/// One conformance suite run against every storage backend.
mod client_conformance;
/// Commit detection by inotify: a commit ships without waiting for a tick; polling when
/// there is no watch.
mod commit_watch;
/// A lone staged segment becomes its level-1 object as it is, verified first.
mod compaction_as_is;
/// Compaction of Litestream's golden replicas, byte-compatible output.
mod compactor;
/// The control socket and `replicad sync`.
mod control;
/// A staged segment damaged before its upload is passed with a seed.
mod damaged_staging;
/// The deployment files (Dockerfile, systemd, Kubernetes) and what they promise.
mod deploy;
/// Directory discovery: databases found, added and removed at run time.
mod discovery;
/// Directory discovery on a hung file system: the rest goes on, what hangs is reported.
mod discovery_hung;
/// Dormancy: idle databases close their connection and wake on change.
mod dormancy;
/// A disk hung under the dormant databases' idle pass.
mod dormant_hang;
/// Page-cache eviction of written ranges.
mod evict_range;
/// `--exec` children, signal forwarding, exit codes, systemd notifications.
mod exec_notify;
/// `restore --follow`: a read replica kept up to date in place.
mod follow;
/// A clean stop right after a heal verifies the replica before it reports.
mod heal_at_stop;
/// The Helm chart, rendered by the real helm.
mod helm;
/// The HTTP endpoints: /metrics, /healthz, /readyz, /status.
mod http;
/// The idle path: no work, no request, no allocation growth while nothing changes.
mod idle;
/// A store whose listings lag its PUTs: no needless seed, a real wipe still found.
mod lagging_listing;
/// Large segments encoded on every core.
mod large_segment;
/// Litestream command lines (Go flag syntax) accepted unchanged.
mod litestream_cli;
/// `litestream.yml` files accepted as Litestream users write them.
mod litestream_yml;
/// A WAL deleted under a running application, until no process can use it.
mod lost_wal;
/// The LTX codec against Litestream's golden files.
mod ltx_codec;
/// Compaction, snapshots and retention on a running daemon.
mod maintenance;
/// The Grafana dashboard and alert rules in deploy/, against promtool and a real Prometheus.
mod monitoring;
/// Never silently unprotected: every failure heals or is reported.
mod never_unprotected;
/// Google Cloud Storage, Azure and WebDAV replicas end to end, against real servers.
mod object_replicate;
/// The periodic verify: a failing replica reported and re-seeded, rechecks, turns.
mod periodic_verify;
/// Per-phase throughput metrics and the /status endpoint.
mod phases_status;
/// README.md's commands, run verbatim.
mod readme;
/// `replicad replicate` end to end, kill -9 and restart included.
mod replicate;
/// Restore failure modes: corrupt, truncated, missing and foreign files.
mod restore_errors;
/// Restores of replicas written by the real Litestream.
mod restore_golden;
/// Calendar retention over a simulated year: `restore --list` and every kept point restoring.
mod retention_calendar;
/// Replication to a real S3 server on loopback, outages included.
mod s3_replicate;
/// Secrets in bad input and at trace: refused or logged without them.
mod secrets;
/// SFTP replicas end to end, against a real sshd.
mod sftp_replicate;
/// One writer per replica: leases, takeovers, and the race between two daemons.
mod single_writer;
/// `replicad snapshot` and `replicad verify`.
mod snapshot_verify;
/// Randomized soak (the long one is `#[ignore]`d; `tests/soak/run.sh` runs it).
mod soak;
/// Databases and replicas that cannot start: not ready, config errors, failed starts.
mod start_failures;
/// Storage errors as one readable line: replica, operation, cause, hint.
mod storage_errors;
/// Twin containers and reused pids: the local claim is a kernel lock, never a pid.
mod twins;
/// Webhooks and the heartbeat ping (`notify`), received by a loopback HTTP server.
mod webhooks;
