//! The admin listener: `/metrics` (Prometheus), `/healthz` (the process
//! runs), `/readyz` (not draining, and the store has answered), `/routes`
//! (each route's config and live numbers as JSON), the live view for the
//! day of the sale (`/`, its figures pushed on `/events`: `page`, `live`)
//! and the route controls (`PUT`/`DELETE /routes/{name}/override`, behind
//! the admin tokens: `controls`, `tokens`). It never serves visitors.

pub mod controls;
pub mod live;
pub mod page;
pub mod tokens;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::message::Answer;
use crate::metrics::CONTENT_TYPE as METRICS_CONTENT_TYPE;
use crate::queue::QueueStore;
use crate::request::App;
use crate::response::{self, Body};
use crate::route::RouteRt;

use controls::{BadField, Controls};
use live::LiveView;
use tokens::Tokens;

/// What the admin listener answers with: the app, the store's readiness,
/// the admin tokens and the live view's rings.
pub struct Admin {
    pub app: Arc<App>,
    pub readiness: Arc<Readiness>,
    pub tokens: Tokens,
    pub live: Arc<LiveView>,
}

/// How often the store is asked while it has not answered yet (or stopped).
const RECHECK_UNREADY: Duration = Duration::from_secs(1);
/// How often the store is asked once it answers, so a long outage shows.
const RECHECK_READY: Duration = Duration::from_secs(5);
/// A readiness probe that takes longer than this counts as a failure.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// An admin request head must arrive within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the store answered its last readiness probe.
#[derive(Debug, Default)]
pub struct Readiness {
    store_ok: AtomicBool,
}

impl Readiness {
    pub fn store_ok(&self) -> bool {
        self.store_ok.load(Ordering::SeqCst)
    }
}

/// Probes the store (`QueueStore::ready`) until `stop` changes: every second
/// until it answers, then every few seconds, so an outage turns readiness
/// off and the store's return turns it back on.
pub async fn probe_store(
    app: Arc<App>,
    readiness: Arc<Readiness>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let answered = tokio::time::timeout(PROBE_TIMEOUT, app.gate.store().ready()).await;
        let ok = matches!(answered, Ok(Ok(())));
        let was_ok = readiness.store_ok.swap(ok, Ordering::SeqCst);
        match (was_ok, ok, answered) {
            (false, true, _) => tracing::info!("store answered: ready"),
            (true, false, Ok(Err(err))) => {
                tracing::warn!(error = %err, "store stopped answering: not ready")
            }
            (true, false, _) => tracing::warn!("store readiness probe timed out: not ready"),
            _ => {}
        }
        let wait = if ok { RECHECK_READY } else { RECHECK_UNREADY };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Serves the admin endpoints on `listener` until `stop` changes, then
/// closes every admin connection.
pub async fn serve(admin: Arc<Admin>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    tracing::warn!(error = %err, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        // Reap finished connections so the set stays small.
        while connections.try_join_next().is_some() {}
        let admin = admin.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let admin = admin.clone();
            async move { Ok::<_, Infallible>(admin.answer(req).await.into_http()) }
        });
        connections.spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(err) = conn.await {
                tracing::debug!(%remote, error = %err, "admin connection ended with an error");
            }
        });
    }
    connections.shutdown().await;
}

impl Admin {
    /// The answer to one admin request.
    pub async fn answer(&self, req: Request<Incoming>) -> Answer<Body> {
        let path = req.uri().path();
        if let Some(name) = path
            .strip_prefix("/routes/")
            .and_then(|rest| rest.strip_suffix("/override"))
        {
            let name = name.to_owned();
            return self.control(req, &name).await;
        }
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return response::plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "405 method not allowed\n",
            );
        }
        match path {
            "/" => page::page(),
            "/live.js" => page::script(),
            "/live.css" => page::style(),
            "/events" => self.live.events(),
            _ => answer(&self.app, &self.readiness, &req),
        }
    }

    /// `PUT` or `DELETE /routes/{name}/override`: refused (401) without a
    /// valid token before anything else is read, then applied.
    async fn control(&self, req: Request<Incoming>, name: &str) -> Answer<Body> {
        let method = req.method().clone();
        if method != Method::PUT && method != Method::DELETE {
            return response::plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "405 method not allowed: PUT or DELETE\n",
            );
        }
        let Some(who) = self.tokens.who(req.headers()).map(str::to_owned) else {
            tracing::warn!(route = name, "override refused: no valid admin token");
            let mut resp = controls::refused(
                StatusCode::UNAUTHORIZED,
                &BadField {
                    field: "authorization".to_owned(),
                    message: if self.tokens.any() {
                        "a valid admin token is needed: Authorization: Bearer <token>".to_owned()
                    } else {
                        "no admin token is configured (admin.token): changes are refused".to_owned()
                    },
                },
            );
            resp.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
            return resp;
        };
        let body = match Limited::new(req.into_body(), controls::MAX_BODY)
            .collect()
            .await
        {
            Ok(body) => body.to_bytes(),
            Err(_) => {
                return controls::refused(
                    StatusCode::BAD_REQUEST,
                    &BadField {
                        field: "body".to_owned(),
                        message: format!("unreadable, or over {} bytes", controls::MAX_BODY),
                    },
                )
            }
        };
        let app = &self.app;
        let controls = Controls {
            store: app.gate.store(),
            settings: &app.settings,
            metrics: &app.metrics,
            clock: app.gate.clock(),
        };
        controls.answer(&method, name, &who, &body).await
    }
}

/// The answer to a `GET` or `HEAD` of one of the plain admin endpoints.
fn answer(app: &App, readiness: &Readiness, req: &Request<Incoming>) -> Answer<Body> {
    match req.uri().path() {
        "/metrics" => {
            app.metrics.observe_store(app.gate.store().breaker());
            for route in &app.settings.load().routes {
                route.metrics.event_streams(route.live.event_streams());
                route.metrics.inflight(route.live.turns().held());
            }
            let mut resp = Answer::new(Body::full(app.metrics.encode()));
            resp.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(METRICS_CONTENT_TYPE));
            resp
        }
        "/healthz" => response::plain(StatusCode::OK, "healthz", "ok\n"),
        "/readyz" => {
            if app.is_draining() {
                response::plain(StatusCode::SERVICE_UNAVAILABLE, "readyz", "draining\n")
            } else if !readiness.store_ok() {
                response::plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "readyz",
                    "store not answering\n",
                )
            } else {
                response::plain(StatusCode::OK, "readyz", "ready\n")
            }
        }
        "/routes" => {
            let s = app.settings.load();
            let routes: Vec<_> = s.routes.iter().map(route_json).collect();
            response::json(
                StatusCode::OK,
                "routes",
                json!({ "routes": routes }).to_string(),
            )
        }
        _ => response::plain(StatusCode::NOT_FOUND, "not-found", "404 not found\n"),
    }
}

/// One route's config and live numbers: the live view's figures (see
/// [`live::figures`]) and the rest of its config.
fn route_json(route: &RouteRt) -> serde_json::Value {
    let cfg = &route.cfg;
    let live = &route.live;
    let mut out = live::figures(route);
    let config = json!({
        "match": {
            "host": cfg.matcher.host,
            "path_prefix": cfg.matcher.path_prefix,
            "case_insensitive": cfg.matcher.case_insensitive,
        },
        "on_store_error": cfg.on_store_error.as_str(),
        "adapt": cfg.adapt.as_ref().map(|a| json!({
            "min": a.min,
            "max": a.max,
            "start": cfg.capacity,
            "target": {
                "p95_ms": a.target_p95.as_millis() as u64,
                "errors": a.target_errors,
            },
            "every_ms": a.every.as_millis() as u64,
            "last_change": live.capacity_why(),
            "last_window": live.last_window().map(|w| json!({
                "requests": w.requests,
                "p95_ms": w.p95_ms,
                "errors": w.errors,
            })),
        })),
        "max_admit_per_tick": cfg.max_admit_per_tick,
        "tick_ms": cfg.tick.as_millis() as u64,
        "session_ttl_s": cfg.session_ttl.as_secs(),
        "pass_ttl_s": cfg.pass_ttl.as_secs(),
        "arrival_grace_s": cfg.arrival_grace.as_secs(),
        "abandon_after_s": cfg.abandon_after.as_secs(),
        "max_waiting": cfg.max_waiting,
        "waiting_status": cfg.waiting_status.as_u16(),
        "max_inflight": cfg.max_inflight,
        "inflight_wait_ms": cfg.inflight_wait.as_millis() as u64,
        "inflight": live.turns().held(),
        "inflight_waiting": live.turns().waiting(),
    });
    if let (Some(out), serde_json::Value::Object(config)) = (out.as_object_mut(), config) {
        out.extend(config);
    }
    out
}
