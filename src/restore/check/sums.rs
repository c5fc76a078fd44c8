//! Whether each index holds exactly its table's rows, by two sequential scans instead of one
//! b-tree seek per row.
//!
//! `PRAGMA integrity_check(T)` looks every row of T up in each of its indexes: a random seek
//! per row and index, most of a checked restore's time (1 GiB, one table and its index: about
//! 5 s of a 6 s check). For an index whose key is plain columns (no expression, no `WHERE`),
//! the same question is answered by summing a keyed 128-bit hash of (key, rowid) over the
//! table's rows (`NOT INDEXED`) and over the index's entries (`INDEXED BY`, which reads the
//! index alone): equal multisets give equal sums, and unequal ones give equal sums with a
//! probability of about 2^-128 (the keys are random per check). A UNIQUE index is also read
//! for two adjacent entries whose keys are equal and not NULL; it qualifies only when every
//! key column compares with BINARY, which this module reproduces exactly.
//!
//! What they stand for, in SQLite 3.54's `pragma.c`: per row and index, an entry with the
//! row's key and rowid exists (`OP_Found`; a miss is also reported as an imprecise float, a
//! rowid not at the end of the record, or values that differ under a non-BINARY collation,
//! all of them exact values that differ), and in a UNIQUE index the next entry's key differs
//! unless a key column is NULL. The sums answer the first for every row and every entry
//! (the entry counts too), the adjacent-key pass the second.
//!
//! Invariant: the scans never pass a table that SQLite's check of it would fail. Any doubt (a
//! sum that differs, a duplicate key, a scan SQLite refuses or finds damaged) sends the table
//! to `PRAGMA integrity_check(T)`, whose verdict stands. Tables with an index on an
//! expression, a partial index or a UNIQUE index with another collation, WITHOUT ROWID and
//! virtual tables get SQLite's check directly.

use std::hash::{BuildHasher, Hasher, RandomState};

use rusqlite::types::ValueRef;
use rusqlite::{Connection, Row};

/// An index the scans can check, with the SQL that reads its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Keyed {
    /// Its table.
    pub table: String,
    /// The index.
    pub index: String,
    /// Whether its keys must be distinct.
    pub unique: bool,
    /// The key columns in key order (quoted), then the table's rowid.
    pub cols: Vec<String>,
}

/// What one scan found for one index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Tally {
    /// The sum over the table's rows.
    pub rows: Option<(u64, u64)>,
    /// The sum over the index's entries.
    pub entries: Option<(u64, u64)>,
    /// Two adjacent entries of a UNIQUE index with equal keys.
    pub duplicate: bool,
}

impl Tally {
    /// True when the index holds exactly the table's rows, and distinct keys where it must.
    pub fn sound(&self) -> bool {
        self.rows.is_some() && self.rows == self.entries && !self.duplicate
    }
}

/// The two keys of the 128-bit hash, random per check.
pub(super) struct Keys(RandomState, RandomState);

impl Keys {
    pub fn new() -> Keys {
        Keys(RandomState::new(), RandomState::new())
    }

    /// The hash of columns `at..at + n` of `row`.
    fn hash(&self, row: &Row<'_>, at: usize, n: usize) -> rusqlite::Result<(u64, u64)> {
        let (mut a, mut b) = (self.0.build_hasher(), self.1.build_hasher());
        for i in at..at + n {
            let v = row.get_ref(i)?;
            feed(&mut a, v);
            feed(&mut b, v);
        }
        Ok((a.finish(), b.finish()))
    }
}

/// A value with its storage class, so that 1, 1.0 and '1' hash apart.
fn feed(h: &mut impl Hasher, v: ValueRef<'_>) {
    match v {
        ValueRef::Null => h.write_u8(0),
        ValueRef::Integer(i) => {
            h.write_u8(1);
            h.write_i64(i);
        }
        ValueRef::Real(f) => {
            h.write_u8(2);
            h.write_u64(f.to_bits());
        }
        ValueRef::Text(t) => {
            h.write_u8(3);
            h.write_usize(t.len());
            h.write(t);
        }
        ValueRef::Blob(b) => {
            h.write_u8(4);
            h.write_usize(b.len());
            h.write(b);
        }
    }
}

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn add(sum: &mut (u64, u64), h: (u64, u64)) {
    sum.0 = sum.0.wrapping_add(h.0);
    sum.1 = sum.1.wrapping_add(h.1);
}

/// The indexes of rowid table `table`, when the scans can check every one of them; `None`
/// sends the table to SQLite's own check (see the module doc).
pub(super) fn keyed_indexes(
    conn: &Connection,
    table: &str,
) -> rusqlite::Result<Option<Vec<Keyed>>> {
    let columns: Vec<String> = conn
        .prepare("SELECT lower(name) FROM pragma_table_xinfo(?1)")?
        .query_map([table], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    // A column may be named rowid: the first of SQLite's three names no column shadows.
    let Some(rowid) = ["rowid", "_rowid_", "oid"]
        .into_iter()
        .find(|n| !columns.iter().any(|c| c == n))
    else {
        return Ok(None);
    };
    let indexes: Vec<(String, bool, bool)> = conn
        .prepare("SELECT name, \"unique\", partial FROM pragma_index_list(?1)")?
        .query_map([table], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut keyed = Vec::with_capacity(indexes.len());
    for (index, unique, partial) in indexes {
        if partial {
            return Ok(None);
        }
        let key: Vec<(i64, Option<String>, Option<String>)> = conn
            .prepare("SELECT cid, name, coll FROM pragma_index_xinfo(?1) WHERE key ORDER BY seqno")?
            .query_map([&index], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut cols = Vec::with_capacity(key.len() + 1);
        for (cid, name, coll) in key {
            if unique && !coll.is_some_and(|c| c.eq_ignore_ascii_case("BINARY")) {
                return Ok(None);
            }
            match (cid, name) {
                (-1, _) => cols.push(rowid.to_string()),
                (0.., Some(name)) => cols.push(quote(&name)),
                // An expression (-2), or a column SQLite cannot name.
                _ => return Ok(None),
            }
        }
        if cols.is_empty() {
            return Ok(None);
        }
        cols.push(rowid.to_string());
        keyed.push(Keyed {
            table: table.to_string(),
            index,
            unique,
            cols,
        });
    }
    Ok(Some(keyed))
}

/// One scan of the table of `indexes` (all of one table), summing each index's key over its
/// rows, in the order of `indexes`.
pub(super) fn rows(
    conn: &Connection,
    indexes: &[Keyed],
    keys: &Keys,
) -> rusqlite::Result<Vec<(u64, u64)>> {
    let Some(first) = indexes.first() else {
        return Ok(Vec::new());
    };
    let cols: Vec<&str> = indexes
        .iter()
        .flat_map(|k| k.cols.iter().map(String::as_str))
        .collect();
    let sql = format!(
        "SELECT {} FROM {} NOT INDEXED",
        cols.join(", "),
        quote(&first.table)
    );
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query([])?;
    let mut sums = vec![(0, 0); indexes.len()];
    while let Some(row) = rows.next()? {
        let mut at = 0;
        for (k, sum) in indexes.iter().zip(&mut sums) {
            add(sum, keys.hash(row, at, k.cols.len())?);
            at += k.cols.len();
        }
    }
    Ok(sums)
}

/// One scan of index `k`: the sum of its entries, and whether two adjacent ones of a UNIQUE
/// index have equal keys (an index is read in key order, so equal keys are adjacent).
pub(super) fn entries(conn: &Connection, k: &Keyed, keys: &Keys) -> rusqlite::Result<Tally> {
    let sql = format!(
        "SELECT {} FROM {} INDEXED BY {}",
        k.cols.join(", "),
        quote(&k.table),
        quote(&k.index)
    );
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query([])?;
    let width = k.cols.len() - 1;
    let mut sum = (0, 0);
    let mut duplicate = false;
    let mut prev: Vec<Cell> = Vec::new();
    while let Some(row) = rows.next()? {
        add(&mut sum, keys.hash(row, 0, k.cols.len())?);
        if k.unique && !duplicate {
            let key = (0..width)
                .map(|i| row.get_ref(i).map(Cell::from))
                .collect::<rusqlite::Result<Vec<_>>>()?;
            duplicate = prev.len() == width && prev.iter().zip(&key).all(|(a, b)| a.same(b));
            prev = key;
        }
    }
    Ok(Tally {
        rows: None,
        entries: Some(sum),
        duplicate,
    })
}

/// An owned key column, compared as SQLite compares with BINARY.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Int(i64),
    Real(f64),
    Text(Vec<u8>),
    Blob(Vec<u8>),
}

impl From<ValueRef<'_>> for Cell {
    fn from(v: ValueRef<'_>) -> Cell {
        match v {
            ValueRef::Null => Cell::Null,
            ValueRef::Integer(i) => Cell::Int(i),
            ValueRef::Real(f) => Cell::Real(f),
            ValueRef::Text(t) => Cell::Text(t.to_vec()),
            ValueRef::Blob(b) => Cell::Blob(b.to_vec()),
        }
    }
}

impl Cell {
    /// Equal for a UNIQUE constraint: NULLs are distinct, numbers compare by value (an
    /// integer the float cannot hold exactly may compare equal here and not in SQLite: a
    /// false alarm, which SQLite's own check then settles).
    fn same(&self, other: &Cell) -> bool {
        match (self, other) {
            (Cell::Null, _) | (_, Cell::Null) => false,
            (Cell::Int(i), Cell::Real(f)) | (Cell::Real(f), Cell::Int(i)) => *i as f64 == *f,
            _ => self == other,
        }
    }
}
