//! replicad: continuous replication of SQLite databases to directories and S3-compatible
//! object storage, with point-in-time restore.
//!
//! Layout: one folder per layer; each layer uses only those below it (checked by
//! `tests/it/architecture.rs`, with no cycle inside a layer either). `docs/architecture.md`
//! follows one commit through them.
//!
//! ```text
//! cli        one file per subcommand, exit codes (anyhow only here and in main.rs)
//! ops        metrics, HTTP endpoints, control socket, systemd notifications
//! daemon     the Store: tasks, shutdown, the monitor task, registry, directory discovery
//! replicate  db (the SQLite side), replica (upload task), lease, staging, maintenance, health
//! restore    plan, apply, download, output, follow
//! config     the model, loading, replica URLs, the YAML reader by section
//! storage    the ReplicaClient trait; file, s3, age (encryption), faulty (drills)
//! sqlite     the WAL reader            ltx   the LTX v3 codec
//! util       fsutil, retry, clock, phase totals
//! ```
//!
//! Invariants kept across the crate (each is restated in the module that keeps it):
//! 1. A segment is immutable once renamed into place; its name is its TXID range.
//! 2. Positions advance in order, without gaps.
//! 3. A frame is never checkpointed out of the WAL before it is durable in a local segment.
//! 4. Restore writes to `<to>.tmp`, verifies, fsyncs, then renames; it never replaces an
//!    existing database unless forced.
//! 5. Every replica converges: one whose chain cannot be continued from staging is re-seeded
//!    with a snapshot of the live database ([`replicate::replica`],
//!    [`replicate::db::SeedSnapshot`]).
//! 6. No silent states: a database or replica that is not protected is healing (retry,
//!    reopen, re-seed) or reported ([`replicate::health`]: `/readyz`, `/status`, metrics, the
//!    log, systemd STATUS, and a non-zero exit when shutdown leaves anything not uploaded).
//! 7. No process-wide mutable state: counters, budgets and connection pools belong to a
//!    Store (or to one restore). What remains process-wide is write-once (the tick grid's
//!    epoch, this process's lease identity), thread-local codec caches, and SQLite's own
//!    memory settings ([`replicate::db::configure_sqlite_memory`]).
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod cli;
pub mod config;
pub mod daemon;
pub mod ltx;
pub mod ops;
pub mod replicate;
pub mod restore;
pub mod sqlite;
pub mod storage;
pub mod util;
