//! The bottom layer: file-system durability, retries, the clock and the phase totals. Depends
//! on nothing else in the crate.

pub mod clock;
pub mod fsutil;
pub mod malloc;
pub mod phase;
pub mod retry;
