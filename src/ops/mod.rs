//! Operating a running daemon: Prometheus metrics, the HTTP endpoints, the control socket of
//! `replicad sync`, systemd notifications, and webhooks and the heartbeat ping (`notify`).

pub mod alerts;
pub mod control;
pub mod heartbeat;
pub mod http;
pub mod metrics;
pub mod notify;
pub mod webhook;
