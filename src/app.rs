//! A running queuegate's shared state and the per-request entry point: check
//! the request, let the gate decide, then answer or forward.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{Request, Response};
use hyper::body::Incoming;

use crate::config::Config;
use crate::proxy::{self, Upstream};
use crate::response::{self, Body};

/// Everything a request needs, shared by all connections.
pub struct App {
    upstream: Upstream,
    draining: AtomicBool,
}

impl App {
    pub fn new(config: &Config) -> anyhow::Result<App> {
        let upstream = Upstream::new(&config.upstream).map_err(anyhow::Error::msg)?;
        Ok(App {
            upstream,
            draining: AtomicBool::new(false),
        })
    }

    /// Marks the process as draining (readiness turns false).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether the process is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Answers one request.
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        remote: SocketAddr,
        tls: bool,
    ) -> Response<Body> {
        if let Err(err) = proxy::check_framing(req.headers()) {
            tracing::debug!(%remote, error = %err, "request rejected");
            return response::from_error(&err);
        }
        match self.upstream.forward(req, remote, tls).await {
            Ok(resp) => resp,
            Err(err) => {
                tracing::warn!(%remote, error = %err, "origin failed");
                response::from_error(&err)
            }
        }
    }
}
