//! replicad: continuous replication of SQLite databases to directories and S3-compatible
//! object storage, with point-in-time restore.
//!
//! Layer map (each layer only calls the one below it):
//!
//! ```text
//! CLI (cli/) -> Store -> Db (one per database) -> Replica (one per destination) -> ReplicaClient
//!                        monitor task             upload task                      file | s3
//! ```
//!
//! Formats: [`ltx`] is the LTX v3 segment codec (byte-compatible with Litestream v0.5),
//! [`wal`] reads SQLite write-ahead logs, [`restore`] plans and applies a chain of segments.
//!
//! Invariants kept across the crate (each is restated in the module that keeps it):
//! 1. A segment is immutable once renamed into place; its name is its TXID range.
//! 2. Positions advance in order, without gaps.
//! 3. A frame is never checkpointed out of the WAL before it is durable in a local segment.
//! 4. Restore writes to `<to>.tmp`, verifies, fsyncs, then renames; it never replaces an
//!    existing database unless forced.
//! 5. Every replica converges: one whose chain cannot be continued from staging is re-seeded
//!    with a snapshot of the live database ([`replica`], [`db::SeedSnapshot`]).
//! 6. No silent states: a database or replica that is not protected is healing (retry,
//!    reopen, re-seed) or reported ([`health`]: `/readyz`, `/status`, metrics, the log,
//!    systemd STATUS, and a non-zero exit when shutdown leaves anything not uploaded).
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
