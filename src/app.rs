//! A running queuegate's shared state and the per-request entry point: check
//! the framing, take any invite out of the target, serve queuegate's own
//! paths, let the gate decide, then answer or forward, end the session when
//! the route or the origin says so (DESIGN §8.6), and set a lane cookie when
//! the origin names a lane (DESIGN §8.5).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use futures_util::FutureExt;
use http::header::SET_COOKIE;
use http::{Request, Response};
use hyper::body::Incoming;

use crate::admission::KeyRing;
use crate::admission::VisitorId;
use crate::client_ip::{self, LimitKey};
use crate::clock::Clock;
use crate::config::{AmbiguousPaths, ClientIp, Config, HostPattern};
use crate::cookie::{self, CookieMemo, Credentials, KeptCookies};
use crate::framing::AmbiguousHead;
use crate::gate::{Admitted, Decided, Decision, Gate, Requester};
use crate::lane_grant::{self, Holder, Lane, LANE_COOKIE_TTL};
use crate::metrics::{Metrics, Outcome, SessionEnd, UpstreamFailure};
use crate::proxy::{self, OriginCommand, Peer, Upstream};
use crate::queue::{BreakerConfig, Counted, Guarded, Store};
use crate::response::{self, Body, RequestError};
use crate::route::RouteRt;
use crate::route::Settings;
use crate::waiting::events::Streams;
use crate::waiting::{self, return_to};
use crate::{host, path};

/// Everything a request needs, shared by all connections.
pub struct App {
    pub upstream: Upstream,
    pub gate: Gate,
    /// Replaced whole on a config reload.
    pub settings: Arc<ArcSwap<Settings>>,
    pub metrics: Arc<Metrics>,
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
        let settings = Arc::new(ArcSwap::from_pointee(Settings::new(
            config,
            ring,
            &HashMap::new(),
            &metrics,
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
            ambiguous_paths: config.limits.ambiguous_paths,
            allowed_hosts: config.limits.allowed_hosts.clone(),
            client_ip: config.client_ip.clone(),
            draining: AtomicBool::new(false),
        })
    }

    /// The key the client of a request is counted under for per-client
    /// limits: its address behind trusted proxies (DESIGN §8.2, §8.3).
    fn limit_key(&self, peer: &Peer, headers: &http::HeaderMap) -> LimitKey {
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

    /// Answers one request. The server marks a request whose raw head was
    /// ambiguous with an [`AmbiguousHead`] extension; the header check
    /// catches what reaches the service some other way.
    pub async fn handle(&self, req: Request<Incoming>, conn: &Conn) -> Response<Body> {
        let started = tracing::enabled!(tracing::Level::DEBUG).then(Instant::now);
        let s = self.settings.load();
        let (route, outcome, resp) = self.answer(&s, req, conn).await;
        self.metrics.request(outcome);
        if let Some(started) = started {
            tracing::debug!(
                route = route.unwrap_or(""),
                decision = outcome.as_str(),
                status = resp.status().as_u16(),
                latency_ms = started.elapsed().as_secs_f64() * 1000.0,
                "request"
            );
        }
        resp
    }

    /// The answer to one request, the route it matched and how it was decided.
    async fn answer<'s>(
        &self,
        s: &'s Settings,
        mut req: Request<Incoming>,
        conn: &Conn,
    ) -> (Option<&'s str>, Outcome, Response<Body>) {
        let peer = &conn.peer;
        let framing = match req.extensions().get::<AmbiguousHead>() {
            Some(head) => Err(RequestError::AmbiguousFraming(head.reason)),
            None => proxy::check_framing(req.headers()),
        };
        if let Err(err) = framing {
            tracing::debug!(remote = %peer.addr, error = %err, "request rejected");
            return (None, Outcome::BadRequest, response::from_error(&err));
        }
        // An invite is the gate's alone (DESIGN §8.5): taken out of the
        // target before anything reads it, so that no request reaches the
        // origin with it, whatever path it takes, and no `return` path
        // carries it.
        let (invite, target) = lane_grant::take_invite(std::mem::take(req.uri_mut()));
        *req.uri_mut() = target;
        let host = match host::request_host(req.version(), req.headers(), req.uri()) {
            Ok(host) => host,
            Err(err) => return refuse(peer, RequestError::BadHost(err)),
        };
        if !self.allowed_hosts.is_empty()
            && !host
                .as_deref()
                .is_some_and(|h| self.allowed_hosts.iter().any(|p| p.matches(h)))
        {
            return refuse(peer, RequestError::HostNotAllowed);
        }
        let path = req.uri().path();
        if s.is_reserved(path) {
            return (
                None,
                Outcome::Reserved,
                // Boxed so the waiting room's larger future does not set the
                // size of every request's future (see `Gate::decide`).
                Box::pin(async {
                    let key = self.limit_key(peer, req.headers());
                    let who = Requester {
                        tls: peer.tls,
                        client: key.as_bytes(),
                        invite: invite.as_deref(),
                        invited: None,
                    };
                    waiting::serve(&self.gate, s, req, who, &conn.cookies, &self.streams).await
                })
                .await,
            );
        }
        // Bypass rules and routes see every reading of the path an origin
        // could make (DESIGN §8.1): bypassed only if every reading is,
        // gated if any reading is. `/static/../tickets` and
        // `/tickets;x=1` are gated like `/tickets`.
        let readings = path::Readings::of(path);
        let ambiguous = readings.is_ambiguous();
        if ambiguous && self.ambiguous_paths == AmbiguousPaths::Reject {
            return refuse(peer, RequestError::AmbiguousPath);
        }
        if !ambiguous && readings.iter().all(|p| s.bypassed(req.method(), p)) {
            drop(readings);
            let lane_host = lane_host(s, host.as_deref());
            return (
                None,
                Outcome::Bypass,
                self.forward_ungated(s, req, peer, lane_host.as_deref())
                    .await,
            );
        }
        let index = readings
            .iter()
            .find_map(|p| s.route_for(host.as_deref(), p));
        let Some(index) = index else {
            drop(readings);
            let lane_host = lane_host(s, host.as_deref());
            return (
                None,
                Outcome::Forwarded,
                self.forward_ungated(s, req, peer, lane_host.as_deref())
                    .await,
            );
        };
        let route = &s.routes[index];
        let exit = route.is_exit(&readings);
        drop(readings);
        let key = self.limit_key(peer, req.headers());
        // On a route that counts requests, a pass is counted before the
        // decision (DESIGN §8.6): its session may have made its requests, or
        // this may be its last, and neither may send the visitor through the
        // line again in the same request (so concurrent requests with one
        // pass let exactly the allowed number through). An invite needs
        // them too.
        let creds = (route.counts_requests() || invite.is_some())
            .then(|| s.credentials(index, req.headers(), peer.tls, &conn.cookies));
        // An invite puts the visitor in its lane (DESIGN §8.5); the gate
        // binds the lane cookie given for it to the visitor's ticket or pass.
        let invited = match (invite.as_deref(), creds.as_ref()) {
            (Some(token), Some(c)) => Box::pin(self.gate.take_invite(s, route, token, c)).await,
            _ => None,
        };
        let who = Requester {
            tls: peer.tls,
            client: key.as_bytes(),
            invite: invite.as_deref(),
            invited,
        };
        if invite.is_some() && waiting::is_navigation(req.method(), req.headers()) {
            let resp = Box::pin(self.follow_invite(s, index, &req, who, creds)).await;
            route.metrics.request(Outcome::Invite);
            return (Some(route.name()), Outcome::Invite, resp);
        }
        let counted = match creds.and_then(|c| c.pass) {
            Some(pass) => {
                let counted = Box::pin(self.gate.count_request(route, &pass.id)).await;
                match counted {
                    Counted::Exhausted => {
                        let resp = self.used_up(s, route, &req, peer.tls);
                        route.metrics.request(Outcome::UsedUp);
                        return (Some(route.name()), Outcome::UsedUp, resp);
                    }
                    Counted::Last => {
                        let resp = Box::pin(self.forward_session(
                            s,
                            route,
                            req,
                            peer,
                            None,
                            pass.id,
                            exit,
                            Counted::Last,
                        ))
                        .await;
                        route.metrics.request(Outcome::Pass);
                        return (Some(route.name()), Outcome::Pass, resp);
                    }
                    Counted::Allowed | Counted::Gone => Some((pass.id, counted)),
                }
            }
            None => None,
        };
        let Decided {
            decision,
            lane_cookie,
        } = self
            .gate
            .decide(s, index, who, || {
                creds
                    .unwrap_or_else(|| s.credentials(index, req.headers(), peer.tls, &conn.cookies))
            })
            .await;
        let mut outcome = outcome_of(&decision);
        let resp = match decision {
            Decision::Admit {
                set_cookie,
                session: Some(id),
                ..
            } if exit || route.counts_requests() => {
                // Counted above if admitted on the pass counted; a session
                // the store did not have, or a new one, is counted now.
                let counted = match counted {
                    Some((counted_id, Counted::Allowed)) if counted_id == id => Counted::Allowed,
                    _ => Box::pin(self.gate.count_request(route, &id)).await,
                };
                if counted == Counted::Exhausted {
                    outcome = Outcome::UsedUp;
                    self.used_up(s, route, &req, peer.tls)
                } else {
                    // Boxed: a store call's future is large (see `Gate::decide`).
                    Box::pin(
                        self.forward_session(s, route, req, peer, set_cookie, id, exit, counted),
                    )
                    .await
                }
            }
            Decision::Admit {
                set_cookie,
                session,
                ..
            } => {
                let mut forwarded = self.forward(req, peer).await;
                self.record_lane(s, &mut forwarded, [(route, session)], peer.tls);
                match (forwarded.command, session) {
                    (Some(OriginCommand::EndSession), Some(id)) => {
                        Box::pin(self.end_session(
                            s,
                            route,
                            forwarded.resp,
                            &id,
                            peer.tls,
                            SessionEnd::Origin,
                        ))
                        .await
                    }
                    _ => with_cookie(forwarded.resp, set_cookie),
                }
            }
            other => waiting::held_back(s, route, &req, other),
        };
        route.metrics.request(outcome);
        (Some(route.name()), outcome, with_cookie(resp, lane_cookie))
    }

    /// The answer to a browser following an invite link (DESIGN §8.5): sent
    /// on to the same target without it, so the token leaves the address
    /// bar (and later `Referer`s) at once. A valid invite is decided on
    /// first, so that the lane cookie is bound to the ticket or pass this
    /// answer leaves the visitor with: a ticket held moves to the lane,
    /// keeping its place in time, and a visitor who holds none joins the
    /// lane (or is let in) now.
    async fn follow_invite(
        &self,
        s: &Settings,
        index: usize,
        req: &Request<Incoming>,
        who: Requester<'_>,
        creds: Option<Credentials>,
    ) -> Response<Body> {
        let target = req.uri().path_and_query().map_or("/", |t| t.as_str());
        let mut resp = response::redirect("invite", &return_to::sanitize(target));
        if who.invited.is_some() {
            let decided = self
                .gate
                .decide(s, index, who, || creds.unwrap_or_default())
                .await;
            let cookies = decided.decision.into_set_cookie();
            for cookie in cookies.into_iter().chain(decided.lane_cookie) {
                resp.headers_mut().append(SET_COOKIE, cookie);
            }
        }
        resp
    }

    /// The answer to a request whose session made its requests: not
    /// forwarded, and the pass cookie cleared.
    fn used_up(
        &self,
        s: &Settings,
        route: &RouteRt,
        req: &Request<Incoming>,
        tls: bool,
    ) -> Response<Body> {
        with_cookie(
            waiting::used_up(s, route, req),
            Some(s.clear_cookie(route, tls)),
        )
    }

    /// Forwards an admitted request of session `id` on a route that may
    /// end it on its own, `counted` against `max_requests_per_session`
    /// already, and ends the session once answered when this was its last
    /// request (the store ended it as it counted), when it is for an exit
    /// path, or when the origin says so.
    #[allow(clippy::too_many_arguments)]
    async fn forward_session(
        &self,
        s: &Settings,
        route: &RouteRt,
        req: Request<Incoming>,
        peer: &Peer,
        set_cookie: Option<http::HeaderValue>,
        id: VisitorId,
        exit: bool,
        counted: Counted,
    ) -> Response<Body> {
        let mut forwarded = self.forward(req, peer).await;
        self.record_lane(s, &mut forwarded, [(route, Some(id))], peer.tls);
        let reason = if forwarded.command == Some(OriginCommand::EndSession) {
            Some(SessionEnd::Origin)
        } else if exit && forwarded.from_origin {
            // Only once the origin answered: a request queuegate could not
            // deliver did not leave the site.
            Some(SessionEnd::ExitPath)
        } else {
            None
        };
        match (counted, reason) {
            (Counted::Last, _) => {
                with_cookie(forwarded.resp, Some(s.clear_cookie(route, peer.tls)))
            }
            (_, Some(reason)) => {
                self.end_session(s, route, forwarded.resp, &id, peer.tls, reason)
                    .await
            }
            (_, None) => with_cookie(forwarded.resp, set_cookie),
        }
    }

    /// Ends session `id` of `route` after `resp` (DESIGN §8.6) and clears
    /// its pass cookie there.
    async fn end_session(
        &self,
        s: &Settings,
        route: &RouteRt,
        resp: Response<Body>,
        id: &VisitorId,
        tls: bool,
        reason: SessionEnd,
    ) -> Response<Body> {
        self.gate.end_session(route, id, reason).await;
        with_cookie(resp, Some(s.clear_cookie(route, tls)))
    }

    /// Forwards a request no route gates, for `host` (see [`lane_host`]).
    /// An origin command in the answer does nothing, as there is no session
    /// to act on; it is removed all the same. A lane the origin names is
    /// recorded for every route the host fits (DESIGN §8.5), bound to the
    /// visitor's ticket or pass for the route: the request's own cookies
    /// are kept past forwarding for that.
    async fn forward_ungated(
        &self,
        s: &Settings,
        req: Request<Incoming>,
        peer: &Peer,
        host: Option<&str>,
    ) -> Response<Body> {
        let kept = KeptCookies::of(req.headers());
        let mut forwarded = self.forward(req, peer).await;
        if forwarded.command.is_some() {
            tracing::debug!("origin command on an ungated path ignored: no session");
        }
        let routes = s
            .routes
            .iter()
            .filter(|r| r.cfg.matcher.host_fits(host))
            .map(|r| {
                let (name, lane_name) = (r.cookie_name(peer.tls), r.lane_cookie_name(peer.tls));
                (r, kept.visitor(name, lane_name, &s.ring, r.name()))
            });
        self.record_lane(s, &mut forwarded, routes, peer.tls);
        forwarded.resp
    }

    /// Adds a lane cookie for each of `routes` to the answer when the
    /// origin named a lane in it (DESIGN §8.5), for [`LANE_COOKIE_TTL`],
    /// bound to the visitor id given with the route: the session the
    /// request was admitted under, or the ticket or pass an ungated request
    /// carried for the route. A visitor who holds none gets the lane for
    /// its first arrival on the route ([`Holder::First`]), which the store
    /// lets one arrival take. Whether the route has that lane is checked
    /// when the cookie is read, against the config then.
    fn record_lane<'r>(
        &self,
        s: &Settings,
        forwarded: &mut Forwarded,
        routes: impl IntoIterator<Item = (&'r RouteRt, Option<VisitorId>)>,
        tls: bool,
    ) {
        let Some(lane) = forwarded.lane.take() else {
            return;
        };
        let now = self.gate.clock().now_s();
        let until = now.saturating_add(LANE_COOKIE_TTL.as_secs());
        let domain = s.cookie_domain.as_deref();
        for (route, visitor) in routes {
            let holder = visitor.map_or_else(Holder::first, Holder::Visitor);
            let set = cookie::set_lane(
                &s.ring,
                route.name(),
                &lane,
                &holder,
                now,
                until,
                tls,
                domain,
            );
            forwarded.resp.headers_mut().append(SET_COOKIE, set);
        }
    }

    /// Forwards an admitted or ungated request, taking any origin command
    /// and lane out of the answer. The request is handed to the upstream before
    /// this returns (see [`Upstream::forward`]).
    fn forward(
        &self,
        mut req: Request<Incoming>,
        peer: &Peer,
    ) -> impl Future<Output = Forwarded> + Send + '_ {
        cookie::strip_own_cookies(req.headers_mut());
        // A command or a lane is the origin's to give: one in a request is
        // nobody's.
        req.headers_mut().remove(proxy::QUEUEGATE_COMMAND);
        req.headers_mut().remove(lane_grant::QUEUEGATE_LANE);
        let started = Instant::now();
        let remote = peer.addr;
        // A combinator, not an async block: the block would hold the
        // upstream's future twice (captured, then pinned while awaited),
        // and every request's future is moved whole several times.
        self.upstream.forward(req, peer).map(move |forwarded| {
            let seconds = started.elapsed().as_secs_f64();
            let from_origin = forwarded.is_ok();
            let mut resp = match forwarded {
                Ok(resp) => {
                    self.metrics.upstream(seconds, None);
                    resp
                }
                Err(err) => {
                    let failure = match err {
                        RequestError::UpstreamTimeout => UpstreamFailure::Timeout,
                        _ => UpstreamFailure::Error,
                    };
                    self.metrics.upstream(seconds, Some(failure));
                    tracing::warn!(remote = %remote, error = %err, "origin failed");
                    response::from_error(&err)
                }
            };
            let command = proxy::take_command(resp.headers_mut());
            let lane = lane_grant::take_lane(resp.headers_mut());
            Forwarded {
                resp,
                from_origin,
                command,
                lane,
            }
        })
    }
}

/// A forwarded request's answer.
struct Forwarded {
    /// Without any `Queuegate-Command` or `Queuegate-Lane` header.
    resp: Response<Body>,
    /// Whether the origin answered (not a 502 or 504 of queuegate's own).
    from_origin: bool,
    /// What the origin's `Queuegate-Command` said, if anything known.
    command: Option<OriginCommand>,
    /// The lane the origin's `Queuegate-Lane` named, if a valid one.
    lane: Option<Lane>,
}

/// The host a lane named on an ungated answer is recorded under: `None`
/// when no route has a host rule (every route then fits, and nothing is
/// copied), else the request's.
fn lane_host(s: &Settings, host: Option<&str>) -> Option<String> {
    s.routes
        .iter()
        .any(|r| r.cfg.matcher.host.is_some())
        .then(|| host.map(str::to_owned))
        .flatten()
}

/// `resp` with `set_cookie` added when there is one.
fn with_cookie(mut resp: Response<Body>, set_cookie: Option<http::HeaderValue>) -> Response<Body> {
    if let Some(cookie) = set_cookie {
        resp.headers_mut().append(SET_COOKIE, cookie);
    }
    resp
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

/// A request queuegate refuses to forward, answered and counted.
fn refuse<'s>(peer: &Peer, err: RequestError) -> (Option<&'s str>, Outcome, Response<Body>) {
    tracing::debug!(remote = %peer.addr, error = %err, "request rejected");
    (None, Outcome::BadRequest, response::from_error(&err))
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
