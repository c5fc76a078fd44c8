//! Operating a running daemon: Prometheus metrics, the HTTP endpoints, the control socket of
//! `replicad sync`, and systemd notifications.

pub mod control;
pub mod http;
pub mod metrics;
pub mod notify;
