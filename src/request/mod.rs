//! A running queuegate's shared state and the one road every request takes
//! ([`App::handle`]): screened first (framing, any invite taken out of the
//! target, host, path readings, bypass, route: `screen`), then answered by
//! queuegate's own paths, forwarded ungated, or gated: an invite redeemed
//! (`invite`), the request counted and decided, then forwarded under its
//! session or held back (`session`), the origin's answer read for a command
//! and a lane (`forward`). The session ends when the route or the origin
//! says so (DESIGN §8.6), and a lane cookie is set when the origin names a
//! lane (DESIGN §8.5). Each request is counted once, in [`App::handle`].

mod forward;
mod invite;
mod screen;
mod session;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::client_request::ClientRequest;
use crate::message::Answer;
use arc_swap::ArcSwap;

use crate::admission::KeyRing;
use crate::cache::Caches;
use crate::client_ip::{self, LimitKey};
use crate::clock::Clock;
use crate::config::{AmbiguousPaths, ClientIp, Config, HostPattern};
use crate::cookie::CookieMemo;
use crate::fields::Fields;
use crate::gate::{Admitted, Decided, Decision, Gate, Requester};
use crate::metrics::{Metrics, Outcome};
use crate::proxy::{Peer, Upstream};
use crate::queue::{BreakerConfig, Guarded, Store};
use crate::response::{self, Body};
use crate::route::{RouteRt, Settings};
use crate::waiting;
use crate::waiting::events::Streams;

use forward::with_cookie;
use screen::Target;
use session::Unanswered;

/// Everything a request needs, shared by all connections.
pub struct App {
    pub upstream: Upstream,
    pub gate: Gate,
    /// Replaced whole on a config reload.
    pub settings: Arc<ArcSwap<Settings>>,
    pub metrics: Arc<Metrics>,
    /// Every micro-cache (DESIGN §9.3), kept across reloads.
    pub caches: Arc<Caches>,
    /// `limits.ambiguous_paths` (fixed until a restart, like all limits).
    ambiguous_paths: AmbiguousPaths,
    /// `limits.allowed_hosts`; empty for any host.
    allowed_hosts: Vec<HostPattern>,
    /// Whose forwarding headers name the client (`client_ip`).
    client_ip: ClientIp,
    /// The open event streams' cap and their end at the drain.
    streams: Streams,
    draining: AtomicBool,
}

impl App {
    /// Builds the running state from a validated config, its key ring and the
    /// store, counting into `metrics`.
    pub fn new(
        config: &Config,
        ring: KeyRing,
        store: Store,
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<App> {
        let upstream = Upstream::new(
            &config.upstream,
            &config.client_ip,
            config.limits.worker_count(),
            metrics.connections().clone(),
        )?;
        let caches = Arc::new(Caches::new(config.limits.cache_bytes, &metrics));
        let settings = Arc::new(ArcSwap::from_pointee(Settings::new(
            config,
            ring,
            &HashMap::new(),
            &metrics,
            &caches,
            &HashMap::new(),
        )));
        Ok(App {
            upstream,
            gate: Gate::new(
                Guarded::new(store, BreakerConfig::for_store(&config.store)),
                clock,
            ),
            streams: Streams::new(
                config.limits.max_event_streams,
                config.limits.max_event_streams_per_client,
                settings.clone(),
            ),
            settings,
            metrics,
            caches,
            ambiguous_paths: config.limits.ambiguous_paths,
            allowed_hosts: config.limits.allowed_hosts.clone(),
            client_ip: config.client_ip.clone(),
            draining: AtomicBool::new(false),
        })
    }

    /// The key the client of a request is counted under for per-client
    /// limits: its address behind trusted proxies (DESIGN §8.2, §8.3).
    fn limit_key(&self, peer: &Peer, headers: &Fields) -> LimitKey {
        client_ip::limit_key(client_ip::client_of(
            peer.addr.ip(),
            headers,
            &self.client_ip,
        ))
    }

    /// Marks the process as draining (readiness turns false) and ends the
    /// open event streams, which would otherwise hold their connections
    /// to the drain deadline.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.streams.end_all();
    }

    /// Whether the process is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Answers one request: screens it (see `App::screen`), answers it as
    /// its target says, and counts how it was decided, once, globally and
    /// for the route it matched. A request dropped before it is answered
    /// (its client went away) is counted as `client_gone` instead (see
    /// `Unanswered`).
    pub async fn handle(&self, mut req: ClientRequest, conn: &Conn) -> Answer<Body> {
        let started = tracing::enabled!(tracing::Level::DEBUG).then(Instant::now);
        let s = self.settings.load();
        let mut unanswered = Unanswered::request(&self.metrics);
        let target = self.screen(&s, &mut req);
        let route = match &target {
            Target::Gated { index, .. } => Some(&s.routes[*index]),
            _ => None,
        };
        unanswered.on_route(route.map(|r| &r.metrics));
        let (outcome, resp) = match target {
            Target::Refused(err) => {
                tracing::debug!(remote = %conn.peer.addr, error = %err, "request rejected");
                (Outcome::BadRequest, response::from_error(&err))
            }
            Target::Reserved { invite } => {
                // Boxed so the waiting room's larger future does not set the
                // size of every request's future (see `Gate::decide`).
                let resp = Box::pin(self.reserved(&s, req, conn, invite.as_deref())).await;
                (Outcome::Reserved, resp)
            }
            Target::Bypass { host } => {
                let cache = s.bypass_cache(req.method(), req.uri().path()).cloned();
                let resp = self.forward_ungated(&s, req, &conn.peer, host.as_deref(), cache);
                (Outcome::Bypass, resp.await)
            }
            Target::Ungated { host } => {
                let resp = self.forward_ungated(&s, req, &conn.peer, host.as_deref(), None);
                (Outcome::Forwarded, resp.await)
            }
            Target::Gated {
                index,
                exit,
                invite,
            } => self.gated(&s, index, req, conn, invite, exit).await,
        };
        unanswered.answered();
        let outcome = self.count(route, outcome, &resp);
        if let Some(started) = started {
            tracing::debug!(
                route = route.map_or("", |r| r.name()),
                decision = outcome.as_str(),
                status = resp.status().as_u16(),
                latency_ms = started.elapsed().as_secs_f64() * 1000.0,
                "request"
            );
        }
        resp
    }

    /// Counts an answered request decided as `outcome`: for `route` if it
    /// matched one, and globally. A request refused only once forwarding
    /// began (a body that could not be read) is the client's error, whatever
    /// the gate had decided: globally a bad request, for the route what the
    /// gate decided. The outcome counted globally is returned.
    fn count(&self, route: Option<&RouteRt>, outcome: Outcome, resp: &Answer<Body>) -> Outcome {
        if let Some(route) = route {
            route.metrics.request(outcome);
        }
        let outcome = match resp.is_client_error() {
            true => Outcome::BadRequest,
            false => outcome,
        };
        self.metrics.request(outcome);
        outcome
    }

    /// A request for one of queuegate's own paths (the waiting room).
    async fn reserved(
        &self,
        s: &Settings,
        req: ClientRequest,
        conn: &Conn,
        invite: Option<&str>,
    ) -> Answer<Body> {
        let key = self.limit_key(&conn.peer, req.headers());
        let who = Requester {
            tls: conn.peer.tls,
            client: key.as_bytes(),
            invite,
            invited: None,
        };
        waiting::serve(&self.gate, s, req, who, &conn.cookies, &self.streams).await
    }

    /// A request to gated route `index` of `s`, `exit` when it is for one of
    /// the route's exit paths: redeems its invite (a browser following an
    /// invite link is sent on without it), then counts where the route counts
    /// requests, decides, and forwards or holds back.
    async fn gated(
        &self,
        s: &Arc<Settings>,
        index: usize,
        req: ClientRequest,
        conn: &Conn,
        invite: Option<String>,
        exit: bool,
    ) -> (Outcome, Answer<Body>) {
        let (route, peer) = (&s.routes[index], &conn.peer);
        let key = self.limit_key(peer, req.headers());
        // A route that counts requests needs the credentials before the
        // decision (see `counted`); an invite needs them too.
        let creds = (route.counts_requests() || invite.is_some())
            .then(|| s.credentials(index, req.headers(), peer.tls, &conn.cookies));
        let invited = self
            .redeem(s, route, invite.as_deref(), creds.as_ref())
            .await;
        let who = Requester {
            tls: peer.tls,
            client: key.as_bytes(),
            invite: invite.as_deref(),
            invited,
        };
        if invite.is_some() && waiting::is_navigation(req.method(), req.headers()) {
            let resp = Box::pin(self.follow_invite(s, index, &req, who, creds)).await;
            return (Outcome::Invite, resp);
        }
        match creds.filter(|_| route.counts_requests()) {
            // Boxed: store calls' futures are large (see `Gate::decide`).
            Some(creds) => Box::pin(self.counted(s, index, req, conn, who, creds, exit)).await,
            None => {
                let Decided {
                    decision,
                    lane_cookie,
                } = self
                    .gate
                    .decide(s, index, who, || {
                        creds.unwrap_or_else(|| {
                            s.credentials(index, req.headers(), peer.tls, &conn.cookies)
                        })
                    })
                    .await;
                let (outcome, resp) = self
                    .admit_or_hold(s, index, req, conn, decision, exit, None, None)
                    .await;
                (outcome, with_cookie(resp, lane_cookie))
            }
        }
    }
}

/// What the requests of one client connection share: the app, who the
/// client is (its address, whether it came over TLS, the worker serving it)
/// and the cookies it sent last.
pub struct Conn {
    pub app: Arc<App>,
    pub peer: Peer,
    pub cookies: CookieMemo,
}

impl Conn {
    pub fn new(app: Arc<App>, peer: Peer) -> Conn {
        Conn {
            app,
            peer,
            cookies: CookieMemo::default(),
        }
    }
}

/// How a gate decision is counted and logged.
pub fn outcome_of(decision: &Decision) -> Outcome {
    match decision {
        Decision::Admit { how, .. } => match how {
            Admitted::Pass => Outcome::Pass,
            Admitted::Renewed => Outcome::Renewed,
            Admitted::RenewedLocally => Outcome::RenewedLocally,
            Admitted::AtOnce => Outcome::AtOnce,
            Admitted::FromLine => Outcome::FromLine,
            Admitted::FailOpen => Outcome::FailOpen,
            Admitted::Passthrough => Outcome::Passthrough,
        },
        Decision::Wait { .. } | Decision::PreQueue { .. } => Outcome::Held,
        Decision::Full { .. } => Outcome::Full,
        Decision::TooMany { .. } => Outcome::TooMany,
        Decision::Closed => Outcome::Closed,
        Decision::Unavailable => Outcome::StoreDown,
    }
}
