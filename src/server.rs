//! Accept loops: the connection limit, hyper-util's auto builder (HTTP/1.1
//! and HTTP/2 with prior knowledge), header limits, and the graceful drain.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::app::App;
use crate::config::{Config, ServerLimits};
use crate::framing::Watched;
use crate::proxy::Peer;

/// hyper refuses a read buffer smaller than this.
const MIN_BUF_SIZE: usize = 8192;

/// Sockets already bound, so tests can bind `127.0.0.1:0` and read the port.
pub struct Listeners {
    /// One per `listen` entry, in the same order.
    pub public: Vec<TcpListener>,
    /// The admin listener, when configured.
    pub admin: Option<TcpListener>,
}

impl Listeners {
    /// Binds every address the config names.
    pub async fn bind(config: &Config) -> std::io::Result<Listeners> {
        let mut public = Vec::with_capacity(config.listen.len());
        for listen in &config.listen {
            public.push(bind_one(listen.addr).await?);
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
    public: Vec<TcpListener>,
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
            app.clone(),
            builder.clone(),
            h1_buf_size(limits),
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

async fn accept_loop(
    listener: TcpListener,
    app: Arc<App>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    h1_buf_size: usize,
    graceful: Arc<GracefulShutdown>,
    connections: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) {
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
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        // hyper resolves ambiguous framing before the service sees the
        // headers; the watch reports it per request from the raw bytes.
        let stream = Watched::new(stream, h1_buf_size);
        let framing = stream.watch();
        let app = app.clone();
        let peer = Peer::new(remote);
        let service = service_fn(move |mut req: Request<Incoming>| {
            if let Some(head) = framing.next_request() {
                req.extensions_mut().insert(head);
            }
            let app = app.clone();
            let peer = peer.clone();
            async move { Ok::<_, Infallible>(app.handle(req, peer, false).await) }
        });
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watcher().watch(conn);
        tokio::spawn(async move {
            if let Err(err) = conn.await {
                tracing::debug!(%remote, error = %err, "connection ended with an error");
            }
            drop(permit);
        });
    }
}
