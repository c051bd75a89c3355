//! A running queuegate's shared state and the per-request entry point: check
//! the framing, take any invite out of the target, serve queuegate's own
//! paths, let the gate decide, then answer or forward, end the session when
//! the route or the origin says so (DESIGN §8.6), and set a lane cookie when
//! the origin names a lane (DESIGN §8.5).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use arc_swap::ArcSwap;
use futures_util::FutureExt;
use http::header::SET_COOKIE;
use http::{Request, Response};
use hyper::body::Incoming;

use crate::admission::{KeyRing, VisitorId};
use crate::client_ip::{self, LimitKey};
use crate::clock::Clock;
use crate::config::{AmbiguousPaths, ClientIp, Config, HostPattern};
use crate::cookie::{self, CookieMemo, Credentials, KeptCookies};
use crate::framing::AmbiguousHead;
use crate::gate::{Admitted, Decided, Decision, Gate, Requester};
use crate::lane_grant::{self, Holder, Lane, LANE_COOKIE_TTL};
use crate::metrics::{Metrics, Outcome, RouteMetrics, SessionEnd, UpstreamFailure};
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
        let unanswered = Unanswered::request(&self.metrics);
        let (route, mut outcome, resp) = self.answer(&s, req, conn).await;
        unanswered.answered();
        // Refused only once forwarding began (a body that could not be
        // read): the client's error, whatever the gate had decided.
        if resp.extensions().get::<response::ClientError>().is_some() {
            outcome = Outcome::BadRequest;
        }
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
        s: &'s Arc<Settings>,
        mut req: Request<Incoming>,
        conn: &Conn,
    ) -> (Option<&'s str>, Outcome, Response<Body>) {
        let peer = &conn.peer;
        let framing = match req.extensions().get::<AmbiguousHead>() {
            Some(head) => Err(RequestError::AmbiguousFraming(head.reason)),
            None => proxy::check_request(&req),
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
            // Boxed so the waiting room's larger future does not set the
            // size of every request's future (see `Gate::decide`).
            let resp = Box::pin(self.reserved(s, req, conn, invite.as_deref())).await;
            return (None, Outcome::Reserved, resp);
        }
        // Bypass rules and routes see every reading of the path an origin
        // could make (DESIGN §8.1): bypassed only if every reading is,
        // gated if any reading is. `/static/../tickets` and
        // `/tickets;x=1` are gated like `/tickets`. Readings in two places
        // make the path ambiguous (§9.6); in two routes, no one route can
        // gate it.
        let readings = path::Readings::of(path);
        let placing = s.place(req.method(), host.as_deref(), &readings);
        let ambiguous = readings.is_ambiguous() || placing.disputed;
        if placing.split || (ambiguous && self.ambiguous_paths == AmbiguousPaths::Reject) {
            return refuse(peer, RequestError::AmbiguousPath);
        }
        if !ambiguous && placing.bypassed {
            drop(readings);
            let lane_host = lane_host(s, host.as_deref());
            return (
                None,
                Outcome::Bypass,
                self.forward_ungated(s, req, peer, lane_host.as_deref())
                    .await,
            );
        }
        let Some(index) = placing.route else {
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
        let unanswered = Unanswered::on_route(&route.metrics);
        let (outcome, resp) = self.gated(s, index, req, conn, invite, exit).await;
        unanswered.answered();
        route.metrics.request(outcome);
        (Some(route.name()), outcome, resp)
    }

    /// A request for one of queuegate's own paths (the waiting room).
    async fn reserved(
        &self,
        s: &Settings,
        req: Request<Incoming>,
        conn: &Conn,
        invite: Option<&str>,
    ) -> Response<Body> {
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
    /// the route's exit paths: takes its invite, then decides and answers.
    async fn gated(
        &self,
        s: &Arc<Settings>,
        index: usize,
        req: Request<Incoming>,
        conn: &Conn,
        invite: Option<String>,
        exit: bool,
    ) -> (Outcome, Response<Body>) {
        let (route, peer) = (&s.routes[index], &conn.peer);
        let key = self.limit_key(peer, req.headers());
        // A route that counts requests needs the credentials before the
        // decision (see `counted`); an invite needs them too.
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
                    .admit_or_hold(s, index, req, conn, decision, exit, None)
                    .await;
                (outcome, with_cookie(resp, lane_cookie))
            }
        }
    }

    /// A request to a route that counts requests (DESIGN §8.6). Its pass is
    /// counted before the decision: the session may have made its requests
    /// (answered, never forwarded nor admitted anew in this request), or
    /// this may be its last (forwarded, no decision needed), so concurrent
    /// requests with one pass let exactly the allowed number through. The
    /// decision then admits nobody anew on a used-up credential (see
    /// [`Gate::decide_counted`]).
    #[allow(clippy::too_many_arguments)]
    async fn counted(
        &self,
        s: &Arc<Settings>,
        index: usize,
        req: Request<Incoming>,
        conn: &Conn,
        who: Requester<'_>,
        creds: Credentials,
        exit: bool,
    ) -> (Outcome, Response<Body>) {
        let route = &s.routes[index];
        let counted = match creds.pass {
            Some(pass) => match self.gate.count_request(route, &pass.id).await {
                Counted::Exhausted => {
                    return (Outcome::UsedUp, self.used_up(s, route, &req, who.tls));
                }
                Counted::Last => {
                    let session = (pass.id, Counted::Last);
                    let resp = self.forward_session(s, index, req, conn, None, session, exit);
                    return (Outcome::Pass, resp.await);
                }
                counted => Some((pass.id, counted)),
            },
            None => None,
        };
        let decided = self
            .gate
            .decide_counted(s, index, who, &creds, counted.map(|(_, c)| c))
            .await;
        match decided {
            Some(Decided {
                decision,
                lane_cookie,
            }) => {
                let (outcome, resp) = self
                    .admit_or_hold(s, index, req, conn, decision, exit, counted)
                    .await;
                (outcome, with_cookie(resp, lane_cookie))
            }
            None => (Outcome::UsedUp, self.used_up(s, route, &req, who.tls)),
        }
    }

    /// Answers the gate's `decision` on a request to route `index`: an
    /// admitted one is forwarded (under its session, counted first where
    /// the route counts requests unless `counted` already counted it), any
    /// other is held back.
    #[allow(clippy::too_many_arguments)]
    async fn admit_or_hold(
        &self,
        s: &Arc<Settings>,
        index: usize,
        req: Request<Incoming>,
        conn: &Conn,
        decision: Decision,
        exit: bool,
        counted: Option<(VisitorId, Counted)>,
    ) -> (Outcome, Response<Body>) {
        let route = &s.routes[index];
        let outcome = outcome_of(&decision);
        match decision {
            Decision::Admit {
                set_cookie,
                session: Some(id),
                ..
            } => {
                // Counted already if admitted on the pass counted; a session
                // the store did not have, or a new one, is counted now.
                let counted = match counted {
                    Some((counted_id, Counted::Allowed)) if counted_id == id => Counted::Allowed,
                    _ if route.counts_requests() => {
                        Box::pin(self.gate.count_request(route, &id)).await
                    }
                    _ => Counted::Allowed,
                };
                if counted == Counted::Exhausted {
                    let resp = self.used_up(s, route, &req, conn.peer.tls);
                    return (Outcome::UsedUp, resp);
                }
                let session = (id, counted);
                let resp = self.forward_session(s, index, req, conn, set_cookie, session, exit);
                (outcome, resp.await)
            }
            Decision::Admit { session: None, .. } => {
                // Passthrough or failing open: no session for an origin
                // command to end.
                let mut forwarded = self.forward(req, &conn.peer).await;
                self.record_lane(s, &mut forwarded, [(route, None)], conn.peer.tls);
                (outcome, forwarded.resp)
            }
            other => (outcome, waiting::held_back(s, route, &req, other)),
        }
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

    /// Forwards an admitted request of session `session` (its id, and how
    /// this request was counted against `max_requests_per_session`:
    /// `Allowed` on a route that does not count), setting `set_cookie` on
    /// the answer. The session ends with the origin's answer when this was
    /// its last request (the store ended it as it counted), when the request
    /// is for an exit path, or when the origin says so (DESIGN §8.6), and the
    /// pass cookie is cleared instead. A lane the origin names is recorded.
    ///
    /// The exchange with the origin and the end it may bring go on to the
    /// origin's answer even when the client goes away first: see
    /// [`Detached`]. `conn.app` is this app.
    #[allow(clippy::too_many_arguments)]
    fn forward_session<'a>(
        &'a self,
        s: &'a Arc<Settings>,
        index: usize,
        req: Request<Incoming>,
        conn: &'a Conn,
        set_cookie: Option<http::HeaderValue>,
        session: (VisitorId, Counted),
        exit: bool,
    ) -> impl Future<Output = Response<Body>> + Send + 'a {
        let (id, counted) = session;
        let step = SessionStep {
            s: s.clone(),
            index,
            id,
            counted,
            exit,
        };
        let exchange = Detached::new(step.exchange(conn.app.clone(), req, conn.peer.clone()));
        async move {
            let (mut forwarded, ended) = exchange.await;
            let (route, tls) = (&s.routes[index], conn.peer.tls);
            self.record_lane(s, &mut forwarded, [(route, Some(id))], tls);
            let cookie = match ended {
                true => Some(s.clear_cookie(route, tls)),
                false => set_cookie,
            };
            with_cookie(forwarded.resp, cookie)
        }
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
        let jar = s.jar();
        for (route, visitor) in routes {
            let holder = visitor.map_or_else(Holder::first, Holder::Visitor);
            let set = jar.lane(route.name(), &lane, &holder, now, until, tls);
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
        let started = Instant::now();
        let remote = peer.addr;
        // A combinator, not an async block: the block would hold the
        // upstream's future twice (captured, then pinned while awaited),
        // and every request's future is moved whole several times.
        let exchange = self.upstream.forward(req, peer, &OWN_FIELDS);
        exchange.map(move |forwarded| {
            let seconds = started.elapsed().as_secs_f64();
            let from_origin = forwarded.is_ok();
            let mut resp = match forwarded {
                Ok(resp) => {
                    self.metrics.upstream(seconds, None);
                    resp
                }
                Err(err @ RequestError::BadBody(_)) => {
                    // The client's error, not the origin's.
                    tracing::debug!(remote = %remote, error = %err, "request rejected");
                    response::from_error(&err)
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

/// queuegate's own fields: a command or a lane is the origin's to give
/// (DESIGN §8.5, §8.6); one in a request, in its headers or its trailers,
/// is nobody's and is not forwarded.
static OWN_FIELDS: [http::HeaderName; 2] = [proxy::QUEUEGATE_COMMAND, lane_grant::QUEUEGATE_LANE];

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

/// A session's request on its way to the origin, with what decides whether
/// the answer ends the session (see [`App::forward_session`]).
struct SessionStep {
    s: Arc<Settings>,
    /// The route's index in `s`.
    index: usize,
    id: VisitorId,
    counted: Counted,
    /// The request is for one of the route's exit paths.
    exit: bool,
}

impl SessionStep {
    /// Forwards `req` through `app` and ends the session if the answer says
    /// so: the answer, and whether the session ended with it. Owns all it
    /// uses, so that it can finish on its own (see [`Detached`]).
    async fn exchange(
        self,
        app: Arc<App>,
        req: Request<Incoming>,
        peer: Peer,
    ) -> (Forwarded, bool) {
        let forwarded = app.forward(req, &peer).await;
        let route = &self.s.routes[self.index];
        let reason = if forwarded.command == Some(OriginCommand::EndSession) {
            Some(SessionEnd::Origin)
        } else if self.exit && forwarded.from_origin {
            // Only once the origin answered: a request queuegate could not
            // deliver did not leave the site.
            Some(SessionEnd::ExitPath)
        } else {
            None
        };
        let ended = match (self.counted, reason) {
            (Counted::Last, _) => true,
            (_, Some(reason)) => {
                app.gate.end_session(route, &self.id, reason).await;
                true
            }
            (_, None) => false,
        };
        (forwarded, ended)
    }
}

/// A future that runs to its end even when dropped before. hyper drops a
/// request's future when the client goes away; the part of a request that
/// must outlive that (a session's exchange with the origin, whose answer may
/// end the session) is boxed in one of these, and when dropped unfinished it
/// is spawned on the worker's runtime (where its origin connection lives)
/// to finish there, its output dropped. It costs the admitted request one
/// allocation, and a client gone costs the origin connection until the
/// answer's head (at most `upstream.timeout`), as it costs the origin, and
/// the client connection's slot (the exchange holds the client's `Peer`,
/// whose lease a tunnel holds too), so the drain waits for it.
struct Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fut: Option<Pin<Box<F>>>,
}

impl<F> Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn new(fut: F) -> Detached<F> {
        Detached {
            fut: Some(Box::pin(fut)),
        }
    }
}

impl<F> Future for Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(fut) = self.fut.as_mut() else {
            // Polled again after it finished: nothing more comes.
            return Poll::Pending;
        };
        let out = std::task::ready!(fut.as_mut().poll(cx));
        self.fut = None;
        Poll::Ready(out)
    }
}

impl<F> Drop for Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let Some(fut) = self.fut.take() else {
            return;
        };
        // Outside a runtime (it is shutting down) there is nowhere to finish.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                drop(fut.await);
            });
        }
    }
}

/// Counts a request dropped before it was answered (hyper drops a request's
/// future when its client goes away) as `client_gone`: in
/// `queuegate_requests_total`, or for one route.
struct Unanswered<'a> {
    metrics: Option<&'a Metrics>,
    route: Option<&'a RouteMetrics>,
    answered: bool,
}

impl<'a> Unanswered<'a> {
    fn request(metrics: &'a Metrics) -> Unanswered<'a> {
        Unanswered {
            metrics: Some(metrics),
            route: None,
            answered: false,
        }
    }

    fn on_route(route: &'a RouteMetrics) -> Unanswered<'a> {
        Unanswered {
            metrics: None,
            route: Some(route),
            answered: false,
        }
    }

    fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        if let Some(metrics) = self.metrics {
            metrics.request(Outcome::ClientGone);
        }
        if let Some(route) = self.route {
            route.client_gone();
        }
    }
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
