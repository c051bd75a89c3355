//! queuegate: a virtual waiting room that runs as a reverse-proxy sidecar.
//!
//! # Layout
//!
//! - `config`: the YAML file, parsed and validated into a typed `Config`.
//! - `server`: accept loops, connection limit, HTTP/1.1 and HTTP/2, drain.
//! - `app`: shared state and the per-request entry point.
//! - `proxy`: the pooled upstream client, header rewriting, upgrades.
//! - `response`: the one body type and every response queuegate makes.
//! - `shutdown`: SIGTERM/SIGINT.
//! - `queue`: the `QueueStore` trait and its memory and Redis backends.
//! - `clock`: wall-clock time read through tokio, so tests can pause it.
//! - `demo`: the embedded demo origin behind `queuegate demo`.
//! - `waiting`: the waiting page people see and the `return` path they go back to.
#![forbid(unsafe_code)]

pub mod app;
pub mod clock;
pub mod config;
pub mod demo;
pub mod proxy;
pub mod queue;
pub mod response;
pub mod server;
pub mod shutdown;
pub mod waiting;

use std::future::Future;
use std::sync::Arc;

pub use server::Listeners;

/// Runs queuegate on already-bound listeners until `shutdown` resolves, then
/// drains in-flight requests (at most `limits.drain_timeout`) and returns.
pub async fn run(
    config: config::Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let app = Arc::new(app::App::new(&config)?);
    for (listener, listen) in listeners.public.iter().zip(&config.listen) {
        tracing::info!(addr = %listener.local_addr()?, configured = %listen.addr, "listening");
    }
    tracing::info!(upstream = %config.upstream.url, "forwarding to the origin");
    server::serve(app, listeners.public, &config.limits, shutdown).await;
    Ok(())
}
