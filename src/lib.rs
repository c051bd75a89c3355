//! queuegate: a virtual waiting room that runs as a reverse-proxy sidecar.
//!
//! # Layout
//!
//! - `config`: the YAML file, parsed and validated into a typed `Config`.
//! - `clock`: wall-clock time read through tokio, so tests can pause it.
//! - `queue`: the `QueueStore` trait and its memory and Redis backends.
#![forbid(unsafe_code)]

pub mod clock;
pub mod config;
pub mod queue;
