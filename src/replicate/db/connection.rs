//! The SQLite connection a `Db` pins: process-wide memory settings, opening, the read
//! transaction, and the file identity and WAL header checks around it.

#[allow(unused_imports)]
use super::*;

/// Process-wide SQLite memory settings for a daemon that holds one connection per database.
/// Call once, first thing in `main`, before any connection exists.
///
/// Each connection otherwise pre-allocates (and touches) a 20-page bulk page cache and a
/// lookaside buffer (about 150 KiB) per connection, for a connection
/// that reads a handful of pages (pages come from the files directly). Without them SQLite
/// allocates pages and small objects on demand.
#[allow(unsafe_code)]
pub fn configure_sqlite_memory() {
    use std::ffi::{c_int, c_void};
    // SAFETY: sqlite3_config may only be called before SQLite initializes and while no other
    // thread calls SQLite; `main` calls this before any thread or connection exists. Called
    // later, SQLite answers SQLITE_MISUSE and changes nothing: only memory use differs.
    unsafe {
        rusqlite::ffi::sqlite3_config(
            rusqlite::ffi::SQLITE_CONFIG_PAGECACHE,
            std::ptr::null_mut::<c_void>(),
            0 as c_int,
            0 as c_int,
        );
        rusqlite::ffi::sqlite3_config(
            rusqlite::ffi::SQLITE_CONFIG_LOOKASIDE,
            0 as c_int,
            0 as c_int,
        );
    }
}

/// Busy timeout of our connections (the barrier sets its own before it takes the write lock).
pub(super) const PINNED_BUSY_TIMEOUT: Duration = Duration::from_secs(1);

pub(super) fn open_connection(path: &Path) -> Result<Connection, DbError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(PINNED_BUSY_TIMEOUT)?;
    // Our connection closing must never checkpoint or delete the WAL behind the chain.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )?;
    // Our connections never checkpoint on their own: `Db::checkpoint` decides when.
    conn.execute_batch("PRAGMA cache_size=-256; PRAGMA wal_autocheckpoint=0;")?;
    Ok(conn)
}

/// Opens our connection in WAL mode and starts the read transaction. Returns the page size.
pub(super) fn open_pinned(path: &Path) -> Result<(Connection, u32), DbError> {
    let conn = open_connection(path)?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(DbError::Unsupported(format!(
            "{} cannot be switched to WAL mode (journal_mode is {mode})",
            path.display()
        )));
    }
    let page_size: u32 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    begin_read(&conn)?;
    Ok((conn, page_size))
}

/// Starts the long-running read transaction that pins the WAL.
pub(super) fn begin_read(conn: &Connection) -> Result<(), DbError> {
    conn.execute_batch("BEGIN")?;
    let _: i64 = conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
    Ok(())
}

/// Checks, after pages were read from `f` at offsets a scan found under the WAL header with
/// these salts, that they all came from that generation. SQLite writes a new generation's
/// header (new salts; salt-1 only ever increases) before its first frame, so if the header
/// is unchanged now, no frame of another generation can have been read.
pub(super) fn same_generation(f: &File, salts: (u32, u32)) -> Result<(), DbError> {
    match read_wal_header(f)? {
        Some(now) if (now.salt1, now.salt2) == salts => Ok(()),
        _ => Err(DbError::WalRestartedDuringRead),
    }
}

/// (device, inode) of an open file.
pub(super) fn file_id(f: &File, path: &Path) -> Result<(u64, u64), DbError> {
    let m = f.metadata().map_err(io_err("stat", path))?;
    Ok((m.dev(), m.ino()))
}

pub(super) fn read_wal_header(f: &File) -> Result<Option<WalHeader>, DbError> {
    let mut h = [0u8; 32];
    match f.read_exact_at(&mut h, 0) {
        Ok(()) => Ok(WalHeader::parse(&h).ok()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(DbError::Wal(WalError::Io(e))),
    }
}
