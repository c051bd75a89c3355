//! queuegate: a virtual waiting room that runs as a reverse-proxy sidecar.
//!
//! # Layout
//!
//! - `config`: the YAML file, parsed and validated into a typed `Config`.
//! - `server`: accept loops, connection limit, HTTP/1.1 and HTTP/2, drain.
//! - `app`: shared state and the per-request entry point.
//! - `gate`: the per-request decision (`Decision`), no socket I/O.
//! - `admission`: signing and verifying tickets and passes.
//! - `queue`: the `QueueStore` trait and its memory and Redis backends.
//! - `admitter`: the per-route tick loop.
//! - `waiting`: the waiting page, status JSON and leave.
//! - `framing`: watches raw HTTP/1 heads for ambiguous framing hyper would resolve.
//! - `proxy`: the pooled upstream client, header rewriting, upgrades.
//! - `response`: the one body type and every response queuegate makes.
//! - `shutdown`: SIGTERM/SIGINT.
//! - `tls`: the TLS listeners' server config and certificate reload.
//! - `clock`: wall-clock time read through tokio, so tests can pause it.
//! - `cli`: the command line; `demo`: the embedded demo origin.
#![forbid(unsafe_code)]

pub mod admission;
pub mod admitter;
pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod demo;
pub mod framing;
pub mod gate;
pub mod proxy;
pub mod queue;
pub mod response;
pub mod server;
pub mod shutdown;
pub mod tls;
pub mod waiting;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use admission::KeyRing;
use clock::Clock;
use queue::Store;
pub use server::{Listeners, PublicListener};

/// Runs queuegate on already-bound listeners until `shutdown` resolves, then
/// drains in-flight requests (at most `limits.drain_timeout`) and returns.
/// The key ring is loaded from the environment and files the config names.
pub async fn run(
    config: config::Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let ring = KeyRing::load(&config.keys)?;
    run_with(config, ring, listeners, shutdown).await
}

/// [`run`] with a key ring already in hand.
pub async fn run_with(
    config: config::Config,
    ring: KeyRing,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let clock = Clock::system();
    let store = Store::from_config(&config.store, clock)?;
    let app = Arc::new(app::App::new(&config, ring, store, clock)?);
    for public in &listeners.public {
        let addr = public.listener.local_addr()?;
        tracing::info!(%addr, tls = public.tls.is_some(), "listening");
    }
    tracing::info!(upstream = %config.upstream.url, routes = config.routes.len(), "forwarding to the origin");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut admitters = tokio::task::JoinSet::new();
    for route in &config.routes {
        admitters.spawn(admitter::run(
            app.gate.clone(),
            app.settings.clone(),
            route.name.clone(),
            stop_rx.clone(),
        ));
    }
    server::serve(app, listeners.public, &config.limits, shutdown).await;
    let _ = stop_tx.send(true);
    while admitters.join_next().await.is_some() {}
    Ok(())
}

/// Validates a config file as `queuegate check` does: every problem at once.
/// Returns warnings (such as keys not readable on this machine) on success.
pub fn check(path: &Path) -> Result<Vec<String>, config::ConfigErrors> {
    let config = config::Config::load(path)?;
    let mut warnings = Vec::new();
    if let Err(err) = KeyRing::load(&config.keys) {
        warnings.push(format!("keys: {err} (needed at run time)"));
    }
    Ok(warnings)
}
