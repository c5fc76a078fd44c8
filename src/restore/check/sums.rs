//! Whether each index holds exactly its table's rows, by two sequential scans instead of one
//! b-tree seek per row.
//!
//! `PRAGMA integrity_check(T)` looks every row of T up in each of its indexes: a random seek
//! per row and index, most of a checked restore's time (1 GiB, one table and its index: about
//! 5 s of a 6 s check). For an index whose key is plain BINARY columns, the same question is
//! answered by summing a keyed 128-bit hash of (key, rowid) over the table's rows (`NOT
//! INDEXED`) and over the index's entries (`INDEXED BY`, which reads the index alone): equal
//! multisets give equal sums, unequal ones equal sums with a probability of about 2^-128
//! (the key is random per check). The entries' scan also checks that each (key, rowid) is
//! greater than the one before in SQLite's order, which this module reproduces for BINARY
//! (and DESC), and, in a UNIQUE index, that no two adjacent keys are equal and not NULL.
//!
//! What they stand for, in SQLite 3.54's `pragma.c`: per row and index, an entry with the
//! row's key and rowid exists (`OP_Found`, a seek, which only an index in key order answers
//! right; a miss is also reported as an imprecise float or a rowid not at the end of the
//! record: exact values that differ), and in a UNIQUE index the next entry's key differs
//! unless a key column is NULL. The sums answer the first for every row and every entry (the
//! entry counts too), the order pass that the index can be searched, the adjacent-key pass
//! the second.
//!
//! Invariant: the scans never pass a table that SQLite's check of it would fail. Any doubt (a
//! sum that differs, entries out of order, a duplicate key, an integer-valued float too large
//! to compare exactly, a scan SQLite refuses or finds damaged) sends the table to `PRAGMA
//! integrity_check(T)`, whose verdict stands. SQLite's check runs directly where the scans
//! would not read what it compares: a key on an expression, a partial index, a collation
//! other than BINARY, a key column that may be the rowid's alias (the index scan reads the
//! rowid instead of the stored field), a VIRTUAL generated column (computed from the row
//! instead of read from the index), a column repeated in a key (read once), a UTF-16
//! database (its text is read through a lossy conversion), WITHOUT ROWID and virtual tables.
//! Left out, as it takes damage no scan can see: an index record whose last field is not the
//! one after its key (the scan reads the rowid from the end), or a field of serial type 11
//! where the table has NULL.

use std::hash::{BuildHasher, Hasher, RandomState};

use rusqlite::Connection;
use rusqlite::types::ValueRef;

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
    /// Which key columns sort descending.
    pub desc: Vec<bool>,
}

/// What the scans found for one index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Tally {
    /// The sum over the table's rows.
    pub rows: Option<(u64, u64)>,
    /// The sum over the index's entries.
    pub entries: Option<(u64, u64)>,
    /// Entries out of order, two adjacent keys of a UNIQUE index equal, or a value the
    /// scans cannot compare exactly.
    pub doubt: bool,
}

impl Tally {
    /// True when the index holds exactly the table's rows, in order, with distinct keys
    /// where it must.
    pub fn sound(&self) -> bool {
        self.rows.is_some() && self.rows == self.entries && !self.doubt
    }
}

/// The key of the 128-bit hash, random per check: two SipHash outputs of one key, told apart
/// by a leading tag.
pub(super) struct Keys(RandomState);

/// Beyond 2^53 a float no longer holds every integer: SQLite compares such a float with an
/// integer exactly, the values read here may have been rounded.
const EXACT_FLOAT: f64 = 9_007_199_254_740_992.0;

impl Keys {
    pub fn new() -> Keys {
        Keys(RandomState::new())
    }

    /// The hash of `values`, and whether one of them is an integral float too large to
    /// compare exactly.
    fn hash<'a>(
        &self,
        values: impl IntoIterator<Item = rusqlite::Result<ValueRef<'a>>>,
    ) -> rusqlite::Result<((u64, u64), bool)> {
        let (mut a, mut b) = (self.0.build_hasher(), self.0.build_hasher());
        a.write_u8(0xa);
        b.write_u8(0xb);
        let mut inexact = false;
        for v in values {
            let v = v?;
            if let ValueRef::Real(f) = v {
                inexact |= f.abs() >= EXACT_FLOAT && f.fract() == 0.0;
            }
            feed(&mut a, v);
            feed(&mut b, v);
        }
        Ok(((a.finish(), b.finish()), inexact))
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
    // (lowercase name, hidden, declared type, pk), in cid order: a column's cid is its index.
    let columns: Vec<(String, i64, String, i64)> = conn
        .prepare("SELECT lower(name), hidden, upper(type), pk FROM pragma_table_xinfo(?1)")?
        .query_map([table], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    // A column may be named rowid: the first of SQLite's three names no column shadows.
    let Some(rowid) = ["rowid", "_rowid_", "oid"]
        .into_iter()
        .find(|n| !columns.iter().any(|c| c.0 == *n))
    else {
        return Ok(None);
    };
    // The rowid's alias, if any: the only primary-key column, declared INTEGER (one declared
    // DESC is not an alias, but treating it as one only costs SQLite's slower check).
    let pks: Vec<usize> = (0..columns.len()).filter(|&i| columns[i].3 > 0).collect();
    let alias = match pks.as_slice() {
        [i] if columns[*i].2 == "INTEGER" => Some(*i),
        _ => None,
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
        let key: Vec<(i64, Option<String>, bool, Option<String>)> = conn
            .prepare(
                "SELECT cid, name, \"desc\", coll FROM pragma_index_xinfo(?1) \
                 WHERE key ORDER BY seqno",
            )?
            .query_map([&index], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut cols = Vec::with_capacity(key.len() + 1);
        let mut desc = Vec::with_capacity(key.len());
        let mut seen = Vec::with_capacity(key.len());
        for (cid, name, descending, coll) in key {
            let Some(i) = usize::try_from(cid).ok().filter(|&i| i < columns.len()) else {
                // The rowid itself (-1) or an expression (-2).
                return Ok(None);
            };
            let binary = coll.is_some_and(|c| c.eq_ignore_ascii_case("BINARY"));
            // hidden 2: a VIRTUAL generated column.
            if !binary || alias == Some(i) || columns[i].1 == 2 || seen.contains(&i) {
                return Ok(None);
            }
            let Some(name) = name else {
                return Ok(None);
            };
            seen.push(i);
            cols.push(quote(&name));
            desc.push(descending);
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
            desc,
        });
    }
    Ok(Some(keyed))
}

/// One scan of the table of `indexes` (all of one table): each index's sum over its rows,
/// in the order of `indexes`.
pub(super) fn rows(
    conn: &Connection,
    indexes: &[Keyed],
    keys: &Keys,
) -> rusqlite::Result<Vec<Tally>> {
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
    let mut doubts = vec![false; indexes.len()];
    while let Some(row) = rows.next()? {
        let mut at = 0;
        for ((k, sum), doubt) in indexes.iter().zip(&mut sums).zip(&mut doubts) {
            let (h, inexact) = keys.hash((at..at + k.cols.len()).map(|i| row.get_ref(i)))?;
            add(sum, h);
            *doubt |= inexact;
            at += k.cols.len();
        }
    }
    Ok(sums
        .into_iter()
        .zip(doubts)
        .map(|(sum, doubt)| Tally {
            rows: Some(sum),
            entries: None,
            doubt,
        })
        .collect())
}

/// One scan of index `k`: the sum of its entries; doubt when an entry is not greater than the
/// one before in the index's order, or two adjacent keys of a UNIQUE index are equal and not
/// NULL.
pub(super) fn entries(conn: &Connection, k: &Keyed, keys: &Keys) -> rusqlite::Result<Tally> {
    let sql = format!(
        "SELECT {} FROM {} INDEXED BY {}",
        k.cols.join(", "),
        quote(&k.table),
        quote(&k.index)
    );
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query([])?;
    let width = k.desc.len();
    let mut sum = (0, 0);
    let mut doubt = false;
    // The entry before and this one, their buffers reused: no allocation per entry.
    let mut prev: Vec<Cell> = vec![Cell::Null; k.cols.len()];
    let mut cur: Vec<Cell> = prev.clone();
    let mut first = true;
    while let Some(row) = rows.next()? {
        // Each value is read once, into `cur`, which both the hash and the order pass use.
        for (i, cell) in cur.iter_mut().enumerate() {
            cell.set(row.get_ref(i)?);
        }
        let (h, inexact) = keys.hash(cur.iter().map(|c| Ok(c.as_value())))?;
        add(&mut sum, h);
        doubt |= inexact;
        if !doubt && !first {
            let mut order = std::cmp::Ordering::Equal;
            let mut key_equal = true;
            for (i, (a, b)) in prev.iter().zip(&cur).enumerate() {
                let c = a.cmp_binary(b);
                if i < width && (c != std::cmp::Ordering::Equal || a.is_null()) {
                    key_equal = false;
                }
                if c != std::cmp::Ordering::Equal {
                    // Descending key columns sort the other way; the rowid (last) ascends.
                    order = if k.desc.get(i).copied().unwrap_or(false) {
                        c.reverse()
                    } else {
                        c
                    };
                    break;
                }
            }
            doubt |= order != std::cmp::Ordering::Less || (k.unique && key_equal);
        }
        first = false;
        std::mem::swap(&mut prev, &mut cur);
    }
    Ok(Tally {
        rows: None,
        entries: Some(sum),
        doubt,
    })
}

/// An owned value of an index entry, compared as SQLite compares with BINARY.
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
    /// Becomes `v`, reusing its buffer when both are text or both blobs.
    fn set(&mut self, v: ValueRef<'_>) {
        match (&mut *self, v) {
            (Cell::Text(buf), ValueRef::Text(b)) | (Cell::Blob(buf), ValueRef::Blob(b)) => {
                buf.clear();
                buf.extend_from_slice(b);
            }
            (me, v) => *me = Cell::from(v),
        }
    }

    /// The value, as SQLite handed it over.
    fn as_value(&self) -> ValueRef<'_> {
        match self {
            Cell::Null => ValueRef::Null,
            Cell::Int(i) => ValueRef::Integer(*i),
            Cell::Real(f) => ValueRef::Real(*f),
            Cell::Text(b) => ValueRef::Text(b),
            Cell::Blob(b) => ValueRef::Blob(b),
        }
    }

    fn is_null(&self) -> bool {
        matches!(self, Cell::Null)
    }

    /// SQLite's order of two values under BINARY (`sqlite3MemCompare`): NULL, then numbers by
    /// value (an integer and a float exactly, as `sqlite3IntFloatCompare`), then text, then
    /// blobs, each by bytes and then by length.
    fn cmp_binary(&self, other: &Cell) -> std::cmp::Ordering {
        use std::cmp::Ordering::Equal;
        fn class(c: &Cell) -> u8 {
            match c {
                Cell::Null => 0,
                Cell::Int(_) | Cell::Real(_) => 1,
                Cell::Text(_) => 2,
                Cell::Blob(_) => 3,
            }
        }
        match (self, other) {
            (Cell::Null, Cell::Null) => Equal,
            (Cell::Int(a), Cell::Int(b)) => a.cmp(b),
            (Cell::Real(a), Cell::Real(b)) => a.partial_cmp(b).unwrap_or(Equal),
            (Cell::Int(i), Cell::Real(r)) => int_float(*i, *r),
            (Cell::Real(r), Cell::Int(i)) => int_float(*i, *r).reverse(),
            (Cell::Text(a), Cell::Text(b)) | (Cell::Blob(a), Cell::Blob(b)) => a.cmp(b),
            _ => class(self).cmp(&class(other)),
        }
    }
}

/// `sqlite3IntFloatCompare` without long double: the order of integer `i` and float `r`.
fn int_float(i: i64, r: f64) -> std::cmp::Ordering {
    use std::cmp::Ordering::{Equal, Greater, Less};
    if r.is_nan() {
        return Greater;
    }
    if r < -9_223_372_036_854_775_808.0 {
        return Greater;
    }
    if r >= 9_223_372_036_854_775_808.0 {
        return Less;
    }
    let y = r as i64;
    match i.cmp(&y) {
        Equal => (i as f64).partial_cmp(&r).unwrap_or(Equal),
        o => o,
    }
}
