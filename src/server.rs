//! Accept loops: the connection limit, the TLS handshake on TLS listeners,
//! hyper-util's auto builder (HTTP/1.1, and HTTP/2 by ALPN or prior
//! knowledge), header limits, and the graceful drain.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::app::App;
use crate::config::{Config, ServerLimits};
use crate::framing::Watched;
use crate::proxy::Peer;
use crate::tls;

/// hyper refuses a read buffer smaller than this.
const MIN_BUF_SIZE: usize = 8192;

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
pub async fn serve(
    app: Arc<App>,
    public: Vec<PublicListener>,
    limits: &ServerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let builder = Arc::new(connection_builder(limits));
    let graceful = Arc::new(GracefulShutdown::new());
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);

    let mut loops = JoinSet::new();
    for listener in public {
        loops.spawn(accept_loop(
            listener,
            Connections {
                app: app.clone(),
                builder: builder.clone(),
                h1_buf_size: h1_buf_size(limits),
                handshake_timeout: limits.header_timeout,
            },
            graceful.clone(),
            connections.clone(),
            stop_rx.clone(),
        ));
    }

    shutdown.await;
    app.start_draining();
    tracing::info!(
        in_flight_connections = graceful.count(),
        "shutting down: no longer accepting, draining"
    );
    let _ = stop_tx.send(true);
    while loops.join_next().await.is_some() {}
    // Every accept loop has ended, so this is the last handle.
    let Ok(graceful) = Arc::try_unwrap(graceful) else {
        return;
    };

    match tokio::time::timeout(limits.drain_timeout, graceful.shutdown()).await {
        Ok(()) => tracing::info!("drained: every connection finished"),
        Err(_) => tracing::warn!(
            drain_timeout = ?limits.drain_timeout,
            "drain deadline reached: closing the remaining connections"
        ),
    }
}

/// hyper's HTTP/1 read-buffer cap: a request head must end within it.
fn h1_buf_size(limits: &ServerLimits) -> usize {
    limits.max_header_bytes.max(MIN_BUF_SIZE)
}

fn connection_builder(limits: &ServerLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(h1_buf_size(limits));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    builder
}

/// What every connection of a listener shares.
#[derive(Clone)]
struct Connections {
    app: Arc<App>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    h1_buf_size: usize,
    /// A TLS handshake must finish within this (the request-head timeout).
    handshake_timeout: Duration,
}

impl Connections {
    /// Serves one connection (plain, or already decrypted) until it ends.
    /// `tls` says whether the client reached us over TLS; `watcher` ties
    /// the connection to the graceful drain.
    fn serve<IO>(
        &self,
        stream: IO,
        remote: SocketAddr,
        tls: bool,
        watcher: Watcher,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // hyper resolves ambiguous framing before the service sees the
        // headers; the watch reports it per request from the raw bytes.
        let stream = Watched::new(stream, self.h1_buf_size);
        let framing = stream.watch();
        let app = self.app.clone();
        let peer = Peer::new(remote);
        let service = service_fn(move |mut req: Request<Incoming>| {
            if let Some(head) = framing.next_request() {
                req.extensions_mut().insert(head);
            }
            let app = app.clone();
            let peer = peer.clone();
            async move { Ok::<_, Infallible>(app.handle(req, peer, tls).await) }
        });
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let conn = watcher.watch(conn);
        async move {
            if let Err(err) = conn.await {
                tracing::debug!(%remote, error = %err, "connection ended with an error");
            }
        }
    }
}

async fn accept_loop(
    public: PublicListener,
    shared: Connections,
    graceful: Arc<GracefulShutdown>,
    connections: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) {
    let PublicListener { listener, tls } = public;
    loop {
        // Take a connection slot before accepting: past the limit, new
        // connections wait in the kernel's backlog instead of being served.
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
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
        let watcher = graceful.watcher();
        match &tls {
            None => {
                let conn = shared.serve(stream, remote, false, watcher);
                tokio::spawn(async move {
                    conn.await;
                    drop(permit);
                });
            }
            Some(acceptor) => {
                // The handshake runs in the connection's task, bounded by the
                // head timeout, so a slow client never stalls the accept loop.
                let handshake = acceptor.accept(stream);
                let timeout = shared.handshake_timeout;
                let shared = shared.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(timeout, handshake).await {
                        Ok(Ok(stream)) => shared.serve(stream, remote, true, watcher).await,
                        Ok(Err(err)) => {
                            tracing::debug!(%remote, error = %err, "TLS handshake failed");
                        }
                        Err(_) => {
                            tracing::debug!(%remote, "TLS handshake timed out");
                        }
                    }
                    drop(permit);
                });
            }
        }
    }
}
