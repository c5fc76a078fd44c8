//! What replicad knows of SQLite's files: the write-ahead log's layout and how to read it.

pub mod wal;
