//! Accept loops: the connection limit, the TLS handshake on TLS listeners,
//! HTTP/1.1 connections on queuegate's own engine (parked when idle, see
//! `connection`) and hyper's HTTP/2 (by ALPN or prior knowledge) connections, header limits, idle and HTTP/2 limits
//! (streams, pings, header blocks, reset floods), and the graceful drain,
//! which ends whatever is left (tunnels included) at its deadline.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client_request::ClientRequest;
use crate::config::{Config, ServerLimits};
use crate::connection::{self, Activity, Http1, Parkable, Parking, Socket, Tracked, WhenWoken};
use crate::h2_watch::{self, HeaderBlocks};
use crate::metrics::Protocol;
use crate::proxy::{Lease, Peer};
use crate::request::{App, Conn};
use crate::tls;

/// The smallest cap on an HTTP/1 request head (hyper's smallest read buffer).
const MIN_BUF_SIZE: usize = 8192;

/// HTTP/2 streams a client may have open at once.
const H2_MAX_STREAMS: u32 = 100;
/// An HTTP/2 client silent this long is pinged, and closed when the ping
/// goes unanswered this long.
const H2_PING_INTERVAL: Duration = Duration::from_secs(20);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// Streams reset by the client before hyper took them, at most (h2's
/// default, written down): beyond, the connection gets `ENHANCE_YOUR_CALM`.
const H2_PENDING_RESETS: usize = 20;
/// Streams h2 may reset for the client's protocol errors (h2's default).
const H2_ERROR_RESETS: usize = 1024;
/// An idle HTTP/2 connection told to go away (GOAWAY) is closed this long
/// after, whether or not the client acknowledged it.
const H2_GOAWAY_GRACE: Duration = Duration::from_secs(1);

/// Sockets already bound, so tests can bind `127.0.0.1:0` and read the port.
pub struct Listeners {
    /// One per `listen` entry, in the same order.
    pub public: Vec<PublicListener>,
    /// The admin listener, when configured.
    pub admin: Option<TcpListener>,
}

/// A public listener, plain or TLS.
pub struct PublicListener {
    pub listener: TcpListener,
    /// The acceptor of a TLS listener; `None` for plain TCP.
    pub tls: Option<tls::Acceptor>,
}

impl From<TcpListener> for PublicListener {
    /// A plain TCP listener.
    fn from(listener: TcpListener) -> PublicListener {
        PublicListener {
            listener,
            tls: None,
        }
    }
}

impl Listeners {
    /// Binds every address the config names and loads the certificates of
    /// TLS listeners (which are then reloaded when their files change).
    pub async fn bind(config: &Config) -> std::io::Result<Listeners> {
        let mut public = Vec::with_capacity(config.listen.len());
        for listen in &config.listen {
            let tls = match &listen.tls {
                Some(files) => Some(tls::Acceptor::load(files).map_err(|err| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("listen {}: {err}", listen.addr),
                    )
                })?),
                None => None,
            };
            public.push(PublicListener {
                listener: bind_one(listen.addr).await?,
                tls,
            });
        }
        let admin = match &config.admin {
            Some(admin) => Some(bind_one(admin.addr).await?),
            None => None,
        };
        Ok(Listeners { public, admin })
    }
}

async fn bind_one(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|err| std::io::Error::new(err.kind(), format!("cannot listen on {addr}: {err}")))
}

/// Serves the public listeners until `shutdown` resolves, then stops
/// accepting and gives in-flight requests `drain_timeout` to finish.
///
/// With more than one worker (`limits.workers`), each worker is a thread
/// with its own single-threaded event loop that accepts from every listener
/// and serves its connections from start to end, the way nginx's worker
/// processes do: no request is ever handed between threads, so there are no
/// cross-thread wake-ups on the request path. With one worker, connections
/// are served on the caller's runtime.
///
/// Fails, without waiting for `shutdown`, when the worker threads cannot
/// be started; the error names what failed.
pub async fn serve(
    app: Arc<App>,
    public: Vec<PublicListener>,
    limits: &ServerLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_parking(app, public, limits, Parking::default(), shutdown).await
}

/// [`serve`], parking idle HTTP/1 connections as `parking` says.
pub async fn serve_parking(
    app: Arc<App>,
    public: Vec<PublicListener>,
    limits: &ServerLimits,
    parking: Parking,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let (drain, _) = watch::channel(false);
    let shared = Shared {
        app: app.clone(),
        http1: Arc::new(Http1 {
            parking,
            head_limit: h1_buf_size(limits),
            head_timeout: limits.header_timeout,
            idle_timeout: limits.idle_timeout,
            connections: app.metrics.connections().clone(),
        }),
        http2: Arc::new(Http2 {
            builder: http2_builder(limits),
            head_timeout: limits.header_timeout,
            idle_timeout: limits.idle_timeout,
        }),
        handshake_timeout: limits.header_timeout,
        send_timeout: limits.send_timeout,
        tunnel_idle_timeout: limits.tunnel_idle_timeout,
        drain: Arc::new(drain),
        closing: Arc::new(watch::channel(false).0),
        slots: Arc::new(Semaphore::new(limits.max_connections)),
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let workers = limits.worker_count();
    let running = if workers <= 1 {
        Running::Here(accept_here(public, &shared, stop_rx))
    } else {
        Running::Workers(Workers::start(workers, public, &shared, stop_rx)?)
    };

    shutdown.await;
    app.start_draining();
    tracing::info!(
        in_flight_connections = shared.drain.receiver_count(),
        "shutting down: no longer accepting, draining"
    );
    let _ = stop_tx.send(true);
    let workers = match running {
        Running::Here(mut loops) => {
            while loops.join_next().await.is_some() {}
            None
        }
        Running::Workers(mut workers) => {
            workers.accepting_stopped().await;
            Some(workers)
        }
    };
    // Every connection holds a receiver until it ends.
    shared.drain.send_replace(true);
    match tokio::time::timeout(limits.drain_timeout, shared.drain.closed()).await {
        Ok(()) => tracing::info!("drained: every connection finished"),
        Err(_) => tracing::warn!(
            drain_timeout = ?limits.drain_timeout,
            "drain deadline reached: closing the remaining connections"
        ),
    }
    shared.closing.send_replace(true);
    if let Some(workers) = workers {
        workers.stop().await;
    }
    Ok(())
}

/// Why the worker threads did not start.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("cannot take the listening sockets to the worker threads: {0}")]
    Sockets(#[source] std::io::Error),
    #[error("cannot start worker thread {worker} of {count}: {source}")]
    Worker {
        worker: usize,
        count: usize,
        #[source]
        source: std::io::Error,
    },
}

impl From<StartError> for std::io::Error {
    /// Keeps the kind of the failure underneath (`Too many open files`, ...).
    fn from(err: StartError) -> std::io::Error {
        let (StartError::Sockets(source) | StartError::Worker { source, .. }) = &err;
        std::io::Error::new(source.kind(), err)
    }
}

/// What the accept loops and connections of every worker share.
#[derive(Clone)]
struct Shared {
    app: Arc<App>,
    http1: Arc<Http1>,
    http2: Arc<Http2>,
    /// A TLS handshake must finish within this (the request-head timeout).
    handshake_timeout: Duration,
    /// `limits.send_timeout`: how long a write to a client may stay blocked.
    send_timeout: Duration,
    /// `limits.tunnel_idle_timeout`, for the tunnels connections become.
    tunnel_idle_timeout: Duration,
    /// Turns true when the server drains; every connection (and tunnel)
    /// holds a receiver.
    drain: Arc<watch::Sender<bool>>,
    /// Turns true at the drain deadline: what is still open closes.
    closing: Arc<watch::Sender<bool>>,
    /// One permit per open client connection or tunnel
    /// (`limits.max_connections`).
    slots: Arc<Semaphore>,
}

/// What every HTTP/2 connection of a server shares.
struct Http2 {
    builder: http2::Builder<TokioExecutor>,
    /// A header block must be complete within this of its first frame.
    head_timeout: Duration,
    /// A connection with no stream in flight is closed after this long.
    idle_timeout: Duration,
}

impl Shared {
    /// What worker thread `worker` serves its connections with.
    fn on_worker(&self, worker: usize) -> Connections {
        Connections {
            shared: self.clone(),
            worker,
        }
    }
}

enum Running {
    /// Accept loops on the caller's runtime.
    Here(JoinSet<()>),
    /// Accept loops on worker threads.
    Workers(Workers),
}

fn accept_here(
    public: Vec<PublicListener>,
    shared: &Shared,
    stop: watch::Receiver<bool>,
) -> JoinSet<()> {
    let mut loops = JoinSet::new();
    for listener in public {
        loops.spawn(accept_loop(listener, shared.on_worker(0), stop.clone()));
    }
    loops
}

/// The worker threads, each running a single-threaded runtime.
struct Workers {
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Closed once every worker's accept loops have ended.
    accepting: mpsc::Receiver<()>,
    /// Tells the workers to drop what is left and end.
    release: watch::Sender<bool>,
}

impl Workers {
    fn start(
        count: usize,
        public: Vec<PublicListener>,
        shared: &Shared,
        stop: watch::Receiver<bool>,
    ) -> std::io::Result<Workers> {
        // Each worker registers its own handle on every listening socket
        // with its own event loop; the kernel gives each connection to one.
        let mut sockets = Vec::with_capacity(public.len());
        for PublicListener { listener, tls } in public {
            sockets.push((listener.into_std().map_err(StartError::Sockets)?, tls));
        }
        let (accepting_tx, accepting) = mpsc::channel::<()>(1);
        let (release, released) = watch::channel(false);
        let mut workers = Workers {
            threads: Vec::with_capacity(count),
            accepting,
            release,
        };
        for worker in 0..count {
            match Workers::spawn(worker, &sockets, shared, &stop, &accepting_tx, &released) {
                Ok(thread) => workers.threads.push(thread),
                Err(source) => {
                    // Those already running end too.
                    let _ = workers.release.send(true);
                    return Err(StartError::Worker {
                        worker,
                        count,
                        source,
                    }
                    .into());
                }
            }
        }
        Ok(workers)
    }

    /// Starts worker thread number `worker`.
    fn spawn(
        worker: usize,
        sockets: &[(std::net::TcpListener, Option<tls::Acceptor>)],
        shared: &Shared,
        stop: &watch::Receiver<bool>,
        accepting_tx: &mpsc::Sender<()>,
        released: &watch::Receiver<bool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let mut mine = Vec::with_capacity(sockets.len());
        for (socket, tls) in sockets {
            mine.push((socket.try_clone()?, tls.clone()));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = shared.clone();
        let stop = stop.clone();
        let accepting_tx = accepting_tx.clone();
        let mut released = released.clone();
        std::thread::Builder::new()
            .name(format!("qg-worker-{worker}"))
            .spawn(move || {
                let serving = async move {
                    let mut loops = JoinSet::new();
                    for (socket, tls) in mine {
                        let listener = match TcpListener::from_std(socket) {
                            Ok(listener) => listener,
                            Err(err) => {
                                tracing::error!(worker, error = %err, "cannot register a listener");
                                continue;
                            }
                        };
                        loops.spawn(accept_loop(
                            PublicListener { listener, tls },
                            shared.on_worker(worker),
                            stop.clone(),
                        ));
                    }
                    drop(shared);
                    while loops.join_next().await.is_some() {}
                    drop(accepting_tx);
                    // Open connections are served here until released.
                    std::future::pending::<()>().await;
                };
                runtime.block_on(async move {
                    tokio::select! {
                        () = serving => {}
                        _ = released.wait_for(|released| *released) => {}
                    }
                });
                // Dropping the runtime closes what is left.
            })
    }

    /// Resolves once every worker has stopped accepting.
    async fn accepting_stopped(&mut self) {
        while self.accepting.recv().await.is_some() {}
    }

    /// Ends the workers (closing any connection still open) and waits for them.
    async fn stop(self) {
        let _ = self.release.send(true);
        let threads = self.threads;
        let joined = tokio::task::spawn_blocking(move || {
            for thread in threads {
                if thread.join().is_err() {
                    tracing::error!("a worker thread panicked");
                }
            }
        });
        let _ = joined.await;
    }
}

/// The HTTP/1 read-buffer cap: a request head must end within it.
fn h1_buf_size(limits: &ServerLimits) -> usize {
    limits.max_header_bytes.max(MIN_BUF_SIZE)
}

fn http2_builder(limits: &ServerLimits) -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(H2_MAX_STREAMS)
        .keep_alive_interval(H2_PING_INTERVAL)
        .keep_alive_timeout(H2_PING_TIMEOUT)
        .max_pending_accept_reset_streams(H2_PENDING_RESETS)
        .max_local_error_reset_streams(H2_ERROR_RESETS);
    builder
}

/// The connections of one worker thread.
#[derive(Clone)]
struct Connections {
    shared: Shared,
    /// The worker thread serving these connections.
    worker: usize,
}

/// An accepted client connection, besides its stream.
struct Client {
    remote: SocketAddr,
    /// The client reached us over TLS.
    tls: bool,
    /// It chose HTTP/2 by ALPN.
    h2: bool,
    /// Turns true when the server drains.
    drain: watch::Receiver<bool>,
    /// What a tunnel made from this connection holds.
    lease: Lease,
    /// Turns true at the drain deadline: the connection is closed.
    closing: watch::Receiver<bool>,
    /// The connection's slot, given back when it ends.
    _slot: Arc<OwnedSemaphorePermit>,
}

impl Connections {
    /// Serves one connection (plain, or already decrypted) until it ends,
    /// or the drain deadline closes it.
    ///
    /// This future is most of what an idle connection keeps, so what it
    /// is given is used in place (an `async` block's captures, fields taken
    /// from `client` and `self`), not moved into locals that would each
    /// take room of their own (as an `async fn`'s arguments are).
    // Not an `async fn`: its arguments would be kept twice.
    #[allow(clippy::manual_async_fn)]
    fn serve<S: Socket>(
        self,
        mut stream: Parkable<S>,
        mut client: Client,
    ) -> impl Future<Output = ()> {
        async move {
            let mut closing = WhenWoken::new(client.closing.wait_for(|closing| *closing));
            let h2 = client.h2 || {
                tokio::select! {
                    sniffed = stream.sniff_h2(self.shared.handshake_timeout) => match sniffed {
                        Some(h2) => h2,
                        None => return,
                    },
                    _ = &mut closing => return,
                }
            };
            // Counted until the connection ends; one upgraded ends here when
            // its socket is handed over, and is counted as a tunnel instead.
            let _open = self.shared.app.metrics.connections().open(if h2 {
                Protocol::Http2
            } else {
                Protocol::Http1
            });
            let activity = stream.activity();
            // The app is reached through the connection's own `Conn`, so a
            // request touches no reference count that other threads write.
            let conn = Arc::new(Conn::new(
                self.shared.app,
                Peer::new(client.remote, client.tls)
                    .on_worker(self.worker)
                    .with_lease(client.lease),
            ));
            let service_activity = activity.clone();
            let answer = move |req: ClientRequest| {
                let in_flight = service_activity.request();
                let answering = service_activity.answering();
                let conn = conn.clone();
                // Boxed: the connection keeps a slot the size of this future
                // only while the request is served, not for its whole life.
                Box::pin(async move {
                    let resp = conn.app.handle(req, &conn).await;
                    answering.answered();
                    resp.map(|body| Tracked::new(body, in_flight))
                })
            };
            if !h2 {
                tokio::select! {
                    () = connection::serve_h1(&self.shared.http1, stream, &answer, client.drain, client.remote) => {}
                    _ = closing => {}
                }
                return;
            }
            let service = service_fn(move |req: Request<Incoming>| {
                let answered = answer(ClientRequest::h2(req));
                async move { Ok::<_, Infallible>(answered.await.into_http()) }
            });
            // Watched from the preface on (replayed when it was sniffed), for
            // the header blocks' deadline.
            let stream = h2_watch::Watched::new(stream);
            let header_blocks = stream.header_blocks();
            let watch = H2Watch {
                activity,
                header_blocks,
                drain: client.drain,
            };
            // Boxed: HTTP/2's connection future is large, and unboxed it would
            // set the size of every HTTP/1 connection's task too.
            let serving = Box::pin(serve_h2(
                &self.shared.http2,
                TokioIo::new(stream),
                service,
                watch,
                client.remote,
            ));
            tokio::select! {
                () = serving => {}
                _ = closing => {}
            }
        }
    }
}

/// What an HTTP/2 connection is watched through besides hyper.
struct H2Watch {
    /// Streams in flight, since when none is, and reset floods.
    activity: Arc<Activity>,
    /// Since when a header block has been open.
    header_blocks: HeaderBlocks,
    /// Turns true when the server drains.
    drain: watch::Receiver<bool>,
}

/// Why an HTTP/2 connection is ended by queuegate rather than by hyper.
#[derive(Debug, PartialEq, Eq)]
enum H2End {
    /// No stream in flight for `idle_timeout`: a graceful end.
    Idle,
    /// A header block open for longer than `head_timeout`.
    SlowHeaders,
}

impl Http2 {
    /// How often a connection's timers are looked at: a connection is
    /// closed within a quarter of its timeout (at most a second) after it.
    fn check_every(&self) -> Duration {
        (self.head_timeout.min(self.idle_timeout) / 4)
            .clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// Whether the connection is over at `now`.
    fn over(&self, watch: &H2Watch, now: Instant) -> Option<H2End> {
        if let Some(since) = watch.header_blocks.header_block_since() {
            if now >= since + self.head_timeout {
                return Some(H2End::SlowHeaders);
            }
        }
        match watch.activity.idle_since() {
            Some(since) if now >= since + self.idle_timeout => Some(H2End::Idle),
            _ => None,
        }
    }
}

/// Serves an HTTP/2 connection until it ends, shutting it down gracefully
/// when the server drains or it has been idle for `idle_timeout`; closing it
/// when a header block stays open past `head_timeout` or the client resets
/// streams in a flood.
async fn serve_h2<S, Svc, B>(
    http2: &Http2,
    stream: S,
    service: Svc,
    watch: H2Watch,
    remote: SocketAddr,
) where
    S: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    Svc: hyper::service::HttpService<Incoming, ResBody = B> + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = http2.builder.serve_connection(stream, service);
    tokio::pin!(conn);
    let mut drain = watch.drain.clone();
    let mut draining = *drain.borrow_and_update();
    if draining {
        conn.as_mut().graceful_shutdown();
    }
    let mut check = tokio::time::interval(http2.check_every());
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let flooded = watch.activity.flooded();
    tokio::pin!(flooded);
    // When an idle connection was told to go away.
    let mut went_idle = None;
    loop {
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(err) = ended {
                    tracing::debug!(%remote, error = %err, "connection ended with an error");
                }
                return;
            }
            _ = WhenWoken::new(drain.changed()), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
            () = &mut flooded => {
                tracing::debug!(%remote, "streams reset in a flood: closing");
                return;
            }
            _ = check.tick() => match http2.over(&watch, Instant::now()) {
                Some(H2End::Idle) => match went_idle {
                    None => {
                        tracing::debug!(%remote, "idle: going away");
                        went_idle = Some(Instant::now());
                        if !draining {
                            draining = true;
                            conn.as_mut().graceful_shutdown();
                        }
                    }
                    Some(at) if at.elapsed() >= H2_GOAWAY_GRACE => {
                        tracing::debug!(%remote, "idle: closing");
                        return;
                    }
                    Some(_) => {}
                },
                Some(H2End::SlowHeaders) => {
                    tracing::debug!(%remote, "header block not complete in time: closing");
                    return;
                }
                _ => {}
            },
        }
    }
}

async fn accept_loop(
    public: PublicListener,
    connections: Connections,
    mut stop: watch::Receiver<bool>,
) {
    let PublicListener { listener, tls } = public;
    let slots = connections.shared.slots.clone();
    let drain = connections.shared.drain.clone();
    let closing = connections.shared.closing.clone();
    let tunnel_idle_timeout = connections.shared.tunnel_idle_timeout;
    loop {
        // Take a connection slot before accepting: past the limit, new
        // connections wait in the kernel's backlog instead of being served.
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
            _ = stop.changed() => return,
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    // Out of file descriptors and the like: back off briefly.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        // Taken here, so the drain also waits for connections still in
        // their TLS handshake.
        let drained = drain.subscribe();
        // Shared with the tunnel the connection may become.
        let permit = Arc::new(permit);
        let lease = Lease::new(
            permit.clone(),
            drained.clone(),
            closing.subscribe(),
            tunnel_idle_timeout,
        );
        let client = Client {
            remote,
            tls: tls.is_some(),
            h2: false,
            drain: drained,
            lease,
            closing: closing.subscribe(),
            _slot: permit,
        };
        match &tls {
            // The connection's task is the connection's future itself.
            None => {
                let stream = Parkable::new(stream, connections.shared.send_timeout);
                drop(tokio::spawn(connections.clone().serve(stream, client)));
            }
            Some(acceptor) => {
                // The handshake runs in the connection's task, bounded by the
                // head timeout, so a slow client never stalls the accept loop.
                let handshake = acceptor.accept(stream);
                let timeout = connections.shared.handshake_timeout;
                let connections = connections.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(timeout, handshake).await {
                        Ok(Ok(stream)) => {
                            let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                            let client = Client { h2, ..client };
                            let stream = Parkable::new(stream, connections.shared.send_timeout);
                            connections.serve(stream, client).await;
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(%remote, error = %err, "TLS handshake failed");
                        }
                        Err(_) => {
                            tracing::debug!(%remote, "TLS handshake timed out");
                        }
                    }
                });
            }
        }
    }
}
