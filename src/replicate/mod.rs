//! Replication: one monitor per database turns WAL changes into LTX segments in staging
//! ([`db`]), and one upload task per replica ships them ([`replica`]), holding the replica's
//! lease ([`lease`]) and compacting it ([`maintenance`]). [`walwatch`] wakes a monitor
//! when its WAL changes; [`tick`] and [`dormant`] are its timed wake-ups. [`health`] is what
//! each of them says about itself.

pub mod counters;
pub mod db;
pub mod dormant;
pub mod health;
pub mod lease;
pub mod maintenance;
pub mod replica;
pub mod staging;
pub mod tick;
pub mod walwatch;
