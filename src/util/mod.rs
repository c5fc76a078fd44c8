//! The bottom layer: file-system durability, retries, the clock, the phase totals and stopping
//! blocking work. Depends on nothing else in the crate.

pub mod clock;
pub mod fsutil;
pub mod malloc;
pub mod phase;
pub mod retry;
pub mod stop;
pub mod test_gate;
