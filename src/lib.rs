//! queuegate: a virtual waiting room that runs as a reverse-proxy sidecar.
//!
//! # Layout
//!
//! Modules are listed from the top down: each imports only modules listed
//! below it, never one above (nor one that imports it back). A module's own
//! files are named with it. The binary, `main.rs`, reads the command line
//! (`cli`), sets up logging and runs the command (`run` through
//! [`run_file`]).
//!
//! - `demo`: the embedded demo origin, with queuegate in front of it.
//! - `server`: accept loops, connection limit, HTTP/1.1 (on `connection`'s
//!   engine) and HTTP/2 (hyper's), drain.
//! - `admin`: the admin listener: /metrics, /healthz, /readyz, /routes, the
//!   live view for the day of the sale (`page`, its figures and their
//!   15-minute rings pushed on /events by `live`) and the route controls
//!   (`controls`, behind the admin `tokens`).
//! - `reload`: live config reload (file watch, SIGHUP).
//! - `connection`: a client connection's stream (its timeouts, send watchdog
//!   and what it has in flight, for every protocol) and the HTTP/1 driver,
//!   which parks idle keep-alive connections down to their socket, with its
//!   engine (`engine`): request heads parsed once, bodies fed as they are
//!   asked for, answers written, upgrades handed over.
//! - `request`: shared state (`App`, `Conn`) and one road for a request
//!   (`App::handle`): screened (`screen`: framing, invite, host, path
//!   readings, bypass, route), an invite redeemed (`invite`), counted,
//!   decided and forwarded under its session or held back (`session`),
//!   forwarded and the origin's lane recorded (`forward`).
//! - `h2_watch`: follows an HTTP/2 connection's frame headers to report
//!   since when a header block has been open.
//! - `admitter`: the per-route tick loop.
//! - `waiting`: the waiting page (rendered by `page`), status JSON, its event
//!   stream (`events`) and leave; the `return` path (`return_to`).
//! - `gate`: the per-request decision (`Decision`), no socket I/O: passes
//!   (`pass`), tickets' polls (`ticket`), newcomers, lanes and invites
//!   (`arrive`), and the store or the local line in its stead (`lines`).
//! - `route`: routes ready for requests (`Settings`, `RouteRt`, `RouteLive`):
//!   matching, live numbers, the ETA, and what an instance remembers of
//!   places that ended and invites used up (`remembered`).
//! - `cache`: the micro-cache of a route or a bypass rule (`Caches`,
//!   `Scope`): what an answer is kept under (`key`), what may be kept and
//!   for how long (`rules`), kept answers and the process's byte budget
//!   (`stored`), one origin fetch for many requests (`flight`).
//! - `cookie`: cookie names, every `Set-Cookie` value (built by `jar`),
//!   reading credentials, the per-connection memo, stripping our cookies
//!   before the origin.
//! - `origin`: what an origin tells queuegate in its answer, read in one
//!   place: `Queuegate-Command` and `Queuegate-Lane`, queuegate's own fields.
//! - `lane_grant`: invite tokens and lane cookies' values (signed with the
//!   key ring), taking `qg_invite` out of request targets.
//! - `admission`: signing and verifying tickets and passes.
//! - `proxy`: forwarding: header rewriting, retries, upgrades and tunnels.
//! - `client_ip`: who the client is behind trusted proxies; its limit key.
//! - `tls`: the TLS listeners' server config and certificate reload.
//! - `file_watch`: notices changed files (config, certificates) by their directories.
//! - `metrics`: every exported Prometheus metric, one `Metrics` struct.
//! - `queue`: the `QueueStore` trait and its memory (`memory`, its line a
//!   `memory::ranked_set`, kept in a file by `memory::snapshot`) and Redis (`redis_store`, and
//!   `redis_store::split` for a route whose line is split into sub-lines)
//!   backends; the circuit breaker around them (`breaker`); the line record
//!   polls are answered from (`record`); arrivals gathered into batches
//!   (`joins`); the rules of a split line: sub-line names, capacity shares,
//!   the coordinated tick's plan (`shards`).
//! - `health`: the origin's health as a route's requests see it (counts and
//!   a response-time histogram per window) and the rule an adaptive capacity
//!   follows.
//! - `config`: the YAML file, parsed and validated into a typed `Config`:
//!   text to a node tree with positions (`node`), serde structs mirroring it
//!   (`raw`, filled by `document`), validation (`validate`) with every
//!   default written once (`defaults`), lines of field paths (`locate`), the
//!   problems (`error`) and those found so far (`problems`), enum names
//!   (`names`).
//! - `template`: the waiting page's template language and phrase table.
//! - `path`: every reading of a request path, and the segment-boundary prefix match.
//! - `response`: the one body type and every response queuegate makes.
//! - `upstream`: the per-worker pools of HTTP/1.1 connections to the origin,
//!   driven by the requests that use them.
//! - `client_request`: a client's request whichever protocol brought it:
//!   method, target, its fields as a `fields::Fields` list, its body, and
//!   an HTTP/1 request's way to its connection after a `101`.
//! - `client_body`: a client's request body whichever protocol brought it
//!   (HTTP/1's fed by `connection`'s engine, HTTP/2's hyper's), and a
//!   socket with the bytes read ahead of it (`ReadAhead`): either end of a
//!   tunnel after a `101`.
//! - `h1`: the HTTP/1.1 codec, byte work only: an origin's response head
//!   read once into a borrowed view and its body's framing (`response`),
//!   the chunked coding (`chunked`), request heads written into a
//!   connection's buffer (`write`), a client's
//!   request head and its framing rules (`request`), answers' heads
//!   written by hyper's server rules (`answer`).
//! - `inflight`: a route's turns at the origin (`Turns`, DESIGN §9.2): the
//!   cap on its requests in flight, resized by reloads, and the `Turn` one
//!   request holds.
//! - `host`: the host a request is for, canonical, and `allowed_hosts` patterns.
//! - `message`: an answer as queuegate makes or relays it (`Answer`),
//!   its fields a `fields::Fields` list; an `http::Response` only for
//!   hyper.
//! - `fields`: a message's header fields as a list over the head they
//!   were read from, no `HeaderMap` (`Fields`), and reading a message's
//!   fields the same for that list and a `HeaderMap` (`Headers`).
//! - `clock`: wall-clock time read through tokio, so tests can pause it.
//! - `shutdown`: SIGTERM/SIGINT.
//! - `cli`: the command line.
#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod admitter;
pub mod cache;
pub mod cli;
pub mod client_body;
pub mod client_ip;
pub mod client_request;
pub mod clock;
pub mod config;
pub mod connection;
pub mod cookie;
pub mod demo;
pub mod fields;
pub mod file_watch;
pub mod gate;
pub mod h1;
pub mod h2_watch;
pub mod health;
pub mod host;
pub mod inflight;
pub mod lane_grant;
pub mod message;
pub mod metrics;
pub mod origin;
pub mod path;
pub mod proxy;
pub mod queue;
pub mod reload;
pub mod request;
pub mod response;
pub mod route;
pub mod server;
pub mod shutdown;
pub mod template;
pub mod tls;
pub mod upstream;
pub mod waiting;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use admission::KeyRing;
use clock::Clock;
use queue::Store;
pub use reload::{ReloadRequests, ReloadTrigger};
pub use server::{Listeners, PublicListener};

/// How [`run_with_options`] runs beyond the config itself.
#[derive(Debug, Default)]
pub struct RunOptions {
    /// The file the config came from: watched, and read again on reload.
    pub config_path: Option<PathBuf>,
    /// Forced reloads (what `SIGHUP` sends); see [`reload::channel`].
    pub reloads: Option<ReloadRequests>,
}

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

/// [`run`] for the config file at `path`, already loaded as `config`: the
/// file is watched and `SIGHUP` reloads it.
pub async fn run_file(
    path: &Path,
    config: config::Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let ring = KeyRing::load(&config.keys)?;
    let (trigger, reloads) = reload::channel();
    reload::forward_sighup(trigger)?;
    let options = RunOptions {
        config_path: Some(path.to_path_buf()),
        reloads: Some(reloads),
    };
    run_with_options(config, ring, listeners, shutdown, options).await
}

/// [`run`] with a key ring already in hand.
pub async fn run_with(
    config: config::Config,
    ring: KeyRing,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    run_with_options(config, ring, listeners, shutdown, RunOptions::default()).await
}

/// [`run_with`], reloading the config as `options` say. Fails without
/// waiting for `shutdown` when the server cannot start (see [`server::serve`]).
pub async fn run_with_options(
    config: config::Config,
    ring: KeyRing,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
    options: RunOptions,
) -> anyhow::Result<()> {
    let clock = Clock::system();
    // A token that cannot be read stops the start, as a key does.
    let tokens = match &config.admin {
        Some(admin) => admin::tokens::Tokens::load(&admin.tokens)?,
        None => admin::tokens::Tokens::default(),
    };
    let store = open_store(&config.store, clock)?;
    // The memory store's snapshot file, and the store it is written from.
    let snapshot = match (&store, &config.store.memory.snapshot) {
        (Store::Memory(memory), Some(path)) => Some((memory.clone(), path.clone())),
        _ => None,
    };
    let metrics = Arc::new(metrics::Metrics::new());
    let app = Arc::new(request::App::new(&config, ring, store, clock, metrics)?);
    log_start(&config, &listeners)?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let admitters = Arc::new(admitter::Admitters::new(
        app.gate.clone(),
        app.settings.clone(),
        app.metrics.clone(),
        stop_rx.clone(),
    ));
    admitters.start_missing();

    let mut background = tokio::task::JoinSet::new();
    background.spawn(cache::sweep_every_second(
        app.caches.clone(),
        stop_rx.clone(),
    ));
    if let Some((memory, path)) = &snapshot {
        background.spawn(queue::memory::snapshot::keep(
            memory.clone(),
            path.clone(),
            stop_rx.clone(),
        ));
    }
    let readiness = Arc::new(admin::Readiness::default());
    background.spawn(admin::probe_store(
        app.clone(),
        readiness.clone(),
        stop_rx.clone(),
    ));
    let (admin_stop_tx, admin_stop_rx) = tokio::sync::watch::channel(false);
    let admin_task = match listeners.admin {
        Some(listener) => {
            let admin = Arc::new(admin::Admin {
                app: app.clone(),
                readiness,
                tokens,
                live: Arc::new(admin::live::LiveView::default()),
            });
            background.spawn(admin::live::keep(
                admin.live.clone(),
                app.settings.clone(),
                app.gate.clone(),
                clock,
                stop_rx.clone(),
            ));
            Some(tokio::spawn(admin::serve(admin, listener, admin_stop_rx)))
        }
        None => None,
    };
    let mut _watcher = None;
    match (options.config_path, options.reloads) {
        (Some(path), reloads) => {
            let reloads = reloads.unwrap_or_else(|| reload::channel().1);
            let reloader = Arc::new(reload::Reloader::new(
                app.clone(),
                path,
                config.clone(),
                admitters.clone(),
            ));
            match reloader.watch(&reloads) {
                Ok(w) => {
                    tracing::info!(path = %reloader.path().display(), "watching the config file");
                    _watcher = Some(w);
                }
                Err(err) => tracing::warn!(
                    path = %reloader.path().display(),
                    error = %err,
                    "cannot watch the config file: reload with SIGHUP"
                ),
            }
            background.spawn(reloader.serve(reloads, stop_rx.clone()));
        }
        (None, Some(_)) => tracing::warn!("no config file to reload: reload requests are ignored"),
        (None, None) => {}
    }

    // A failed start stops what was started above, then fails the run.
    let served = server::serve(app, listeners.public, &config.limits, shutdown).await;
    let _ = stop_tx.send(true);
    admitters.join().await;
    while background.join_next().await.is_some() {}
    // Written last, when nothing changes the store any more.
    if let Some((memory, path)) = &snapshot {
        queue::memory::snapshot::write_last(memory, path).await;
    }
    // The admin listener answers (readiness 503) until the drain is over.
    let _ = admin_stop_tx.send(true);
    if let Some(task) = admin_task {
        let _ = task.await;
    }
    served?;
    tracing::info!("stopped");
    Ok(())
}

/// The store `cfg` names; the memory store read back from its snapshot
/// when it has one (a missing file: empty). A snapshot that cannot be read
/// stops the start: starting empty would send everyone in it to the back.
fn open_store(cfg: &config::StoreConfig, clock: Clock) -> anyhow::Result<Store> {
    match (cfg.backend, &cfg.memory.snapshot) {
        (config::Backend::Memory, Some(path)) => {
            let memory = queue::MemoryStore::open_snapshot(clock, path).map_err(|err| {
                anyhow::anyhow!(
                    "store.memory.snapshot: {err}; move the file aside to start with an empty line"
                )
            })?;
            Ok(Store::Memory(memory))
        }
        _ => Ok(Store::from_config(cfg, clock)?),
    }
}

/// One start-up line per fact.
fn log_start(config: &config::Config, listeners: &Listeners) -> std::io::Result<()> {
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "queuegate starting");
    for public in &listeners.public {
        let addr = public.listener.local_addr()?;
        tracing::info!(%addr, tls = public.tls.is_some(), "listening");
    }
    match &listeners.admin {
        Some(admin) => {
            tracing::info!(addr = %admin.local_addr()?, "admin listening: / (live view) /events /metrics /healthz /readyz /routes")
        }
        None => tracing::info!("no admin listener"),
    }
    tracing::info!(
        backend = config.store.backend.as_str(),
        expected_instances = config.store.expected_instances,
        "store"
    );
    if let Some(path) = &config.store.memory.snapshot {
        tracing::info!(path = %path.display(), "memory store kept in a snapshot file");
    }
    tracing::info!(upstream = %config.upstream.url, "forwarding to the origin");
    for route in &config.routes {
        tracing::info!(
            route = %route.name,
            path_prefix = route.matcher.path_prefix.as_deref().unwrap_or("/"),
            host = route.matcher.host.as_deref().unwrap_or("*"),
            capacity = route.capacity,
            mode = route.mode.as_str(),
            on_store_error = route.on_store_error.as_str(),
            "route"
        );
    }
    Ok(())
}

/// Validates a config file as `queuegate check` does: every problem at once.
/// Returns warnings on success: the config's own, in file order, then keys
/// not readable on this machine.
pub fn check(path: &Path) -> Result<Vec<String>, config::ConfigErrors> {
    let loaded = config::Config::load_with_warnings(path)?;
    let config = loaded.config;
    let mut warnings: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    if let Err(err) = KeyRing::load(&config.keys) {
        warnings.push(format!("keys: {err} (needed at run time)"));
    }
    if let Some(admin) = &config.admin {
        if let Err(err) = admin::tokens::Tokens::load(&admin.tokens) {
            warnings.push(format!("admin: {err} (needed at run time)"));
        }
    }
    Ok(warnings)
}
