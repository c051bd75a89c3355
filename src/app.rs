//! A running queuegate's shared state and the per-request entry point: check
//! the framing, serve queuegate's own paths, let the gate decide, then answer
//! or forward.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::header::SET_COOKIE;
use http::{Request, Response};
use hyper::body::Incoming;

use crate::admission::KeyRing;
use crate::clock::Clock;
use crate::config::Config;
use crate::framing::AmbiguousHead;
use crate::gate::{self, Decision, Gate, RouteLive, RouteRt, Settings};
use crate::proxy::{self, Upstream};
use crate::queue::{BreakerConfig, Guarded, Store};
use crate::response::{self, Body, RequestError};
use crate::waiting;

/// Everything a request needs, shared by all connections.
pub struct App {
    pub upstream: Upstream,
    pub gate: Gate,
    /// Replaced whole on a config reload.
    pub settings: Arc<ArcSwap<Settings>>,
    draining: AtomicBool,
}

impl App {
    /// Builds the running state from a validated config, its key ring and the
    /// store.
    pub fn new(config: &Config, ring: KeyRing, store: Store, clock: Clock) -> anyhow::Result<App> {
        let upstream = Upstream::new(&config.upstream).map_err(anyhow::Error::msg)?;
        let settings = settings_from(config, ring, &HashMap::new())?;
        Ok(App {
            upstream,
            gate: Gate::new(
                Guarded::new(store, BreakerConfig::for_store(&config.store)),
                clock,
            ),
            settings: Arc::new(ArcSwap::from_pointee(settings)),
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

    /// Answers one request. The server marks a request whose raw head was
    /// ambiguous with an [`AmbiguousHead`] extension; the header check
    /// catches what reaches the service some other way.
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        remote: SocketAddr,
        tls: bool,
    ) -> Response<Body> {
        let framing = match req.extensions().get::<AmbiguousHead>() {
            Some(head) => Err(RequestError::AmbiguousFraming(head.reason)),
            None => proxy::check_framing(req.headers()),
        };
        if let Err(err) = framing {
            tracing::debug!(%remote, error = %err, "request rejected");
            return response::from_error(&err);
        }
        let s = self.settings.load();
        let path = req.uri().path();
        if is_reserved(path, &s.reserved_prefix) {
            return waiting::serve(self, &s, req, tls).await;
        }
        if s.bypassed(req.method(), path) {
            return self.forward(req, remote, tls, None).await;
        }
        let normalized = gate::normalize_path(path);
        let host = gate::request_host(req.headers(), req.uri());
        let Some(index) = s.route_for(host, &normalized) else {
            return self.forward(req, remote, tls, None).await;
        };
        let route = &s.routes[index];
        let decision = self.gate.decide(&s, route, req.headers(), tls).await;
        tracing::debug!(route = route.name(), ?decision, "gate decision");
        match decision {
            Decision::Admit { set_cookie, .. } => self.forward(req, remote, tls, set_cookie).await,
            other => waiting::held_back(&s, route, &req, other),
        }
    }

    async fn forward(
        &self,
        mut req: Request<Incoming>,
        remote: SocketAddr,
        tls: bool,
        set_cookie: Option<http::HeaderValue>,
    ) -> Response<Body> {
        gate::strip_own_cookies(req.headers_mut());
        let mut resp = match self.upstream.forward(req, remote, tls).await {
            Ok(resp) => resp,
            Err(err) => {
                tracing::warn!(%remote, error = %err, "origin failed");
                response::from_error(&err)
            }
        };
        if let Some(cookie) = set_cookie {
            resp.headers_mut().append(SET_COOKIE, cookie);
        }
        resp
    }
}

/// Whether `path` is one of queuegate's own (`/__queuegate` or below it).
fn is_reserved(path: &str, prefix: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Compiles the config into request-time settings, keeping each surviving
/// route's live numbers from `lives`.
pub fn settings_from(
    config: &Config,
    ring: KeyRing,
    lives: &HashMap<String, Arc<RouteLive>>,
) -> anyhow::Result<Settings> {
    let mut routes = Vec::with_capacity(config.routes.len());
    for r in &config.routes {
        let live = lives.get(&r.name).cloned().unwrap_or_default();
        let template = r.page.template.as_ref().map(|t| t.template.clone());
        routes.push(RouteRt::new(
            r.clone(),
            &config.cookie,
            config.store.expected_instances,
            live,
            template,
        ));
    }
    Ok(Settings {
        routes,
        bypass: config.bypass.clone(),
        ring,
        reserved_prefix: config.reserved_prefix.clone(),
        cookie_domain: config.cookie.domain.clone(),
    })
}
