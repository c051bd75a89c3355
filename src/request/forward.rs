//! Forwarding to the origin: an admitted or ungated request handed to the
//! upstream, or to the micro-cache in its stead where the route (or bypass
//! rule) has one (DESIGN §9.3), the origin's answer read for a command and
//! a lane, and the lane it names recorded in lane cookies (DESIGN §8.5).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client_request::ClientRequest;
use crate::message::Answer;
use futures_util::future::Either;
use futures_util::FutureExt;
use http::header::SET_COOKIE;

use crate::admission::VisitorId;
use crate::cache::{self, Ask, Base, Found, Landing, Lead, Read, Scope, Stored};
use crate::cookie::{self, KeptCookies};
use crate::lane_grant::{Holder, Lane, LANE_COOKIE_TTL};
use crate::metrics::{CacheResult, RouteOrigin, UpstreamFailure};
use crate::origin::{self, OriginCommand, Said};
use crate::proxy::{self, Peer};
use crate::response::{self, Body, RequestError};
use crate::route::{RouteLive, RouteRt, Settings};

use super::App;

impl App {
    /// Forwards a request no route gates, for `host` (see [`lane_host`]),
    /// through `cache` when its bypass rule has one. An origin command in
    /// the answer does nothing, as there is no session to act on; it is
    /// removed all the same. A lane the origin names is recorded for every
    /// route the host fits (DESIGN §8.5), bound to the visitor's ticket or
    /// pass for the route: the request's own cookies are kept past
    /// forwarding for that.
    pub(super) async fn forward_ungated(
        &self,
        s: &Settings,
        req: ClientRequest,
        peer: &Peer,
        host: Option<&str>,
        cache: Option<Arc<Scope>>,
    ) -> Answer<Body> {
        let kept = KeptCookies::of(req.headers());
        let mut forwarded = self.fetch(req, peer, cache.as_ref(), None).await;
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
    pub(super) fn record_lane<'r>(
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

    /// Forwards an admitted or bypassed request through `cache` when there
    /// is one (DESIGN §9.3): answered from it, given the answer another
    /// request is fetching, or sent to the origin and its answer kept;
    /// straight to the origin otherwise (see [`App::forward`]).
    pub(super) fn fetch<'a>(
        &'a self,
        req: ClientRequest,
        peer: &Peer,
        cache: Option<&Arc<Scope>>,
        tap: Option<HealthTap>,
    ) -> impl Future<Output = Forwarded> + Send + 'a {
        match cache {
            None => Either::Left(self.forward(req, peer, tap)),
            // Boxed: only cached routes carry the cache's larger future.
            Some(scope) => Either::Right(Box::pin(self.through_cache(
                req,
                peer.clone(),
                scope.clone(),
                tap,
            ))),
        }
    }

    /// A request to a route (or bypass rule) with a cache, `scope`. The
    /// cache is looked up under the request as the origin would get it:
    /// without queuegate's cookies, and without hop-by-hop headers (a
    /// header named in `Connection` never reaches the origin, so a `Vary`
    /// on it must not tell two requests apart). A request that followed
    /// another's fetch whose answer was kept under a `Vary` it differs in
    /// looks again, once, under the names now known. Only a request that
    /// goes to the origin is counted in `tap`.
    async fn through_cache(
        &self,
        mut req: ClientRequest,
        peer: Peer,
        scope: Arc<Scope>,
        tap: Option<HealthTap>,
    ) -> Forwarded {
        let ended = http_body::Body::is_end_stream(req.body());
        let Some(ask) = Ask::of(req.method(), req.headers(), ended) else {
            scope.count(CacheResult::Bypass);
            return self.forward(req, &peer, tap).await;
        };
        cookie::strip_own_cookies(req.headers_mut());
        proxy::strip_hop_by_hop(req.headers_mut());
        let trusted =
            !self.client_ip.trusted_proxies.is_empty() && self.client_ip.trusts(peer.addr.ip());
        let base = Base::of(req.uri(), req.headers(), peer.tls, trusted);
        for again in [false, true] {
            let found = scope.lookup(&ask, &base, req.headers(), Instant::now());
            let landing = match found {
                Found::Hit(stored) => return served(&scope, CacheResult::Hit, &stored, ask.head),
                Found::Lead(lead) => {
                    let lead = (Some(lead), tap);
                    return self.lead(req, &peer, &scope, &base, ask, lead).await;
                }
                Found::Pass => return self.lead(req, &peer, &scope, &base, ask, (None, tap)).await,
                Found::Follow(follow) => {
                    let _waiting = scope.waiting();
                    follow.landing(self.upstream.timeout()).await
                }
            };
            match landing {
                Landing::Stored(stored) if stored.key == base.key(&stored.vary, req.headers()) => {
                    return served(&scope, CacheResult::Coalesced, &stored, ask.head);
                }
                Landing::Stored(_) if !again => {}
                _ => break,
            }
        }
        // Released by the flight it waited for: to the origin at once.
        scope.count(CacheResult::Miss);
        self.forward(req, &peer, tap).await
    }

    /// Sends `req` to the origin for cache `scope` and keeps the answer if
    /// it may: then the answer is served from the kept bytes, and `flight`,
    /// if this request leads one, lands with them. Otherwise the answer goes
    /// on as it came (its body streamed, what was read of it first) and the
    /// flight's followers are released at once, before it is streamed; an
    /// answer the origin gave (not a failure, not a `5xx`) that could not be
    /// kept sends the page's next requests straight to the origin for a
    /// `ttl` (see [`Scope::unkept`]). A flight's fetch drops the request's
    /// `If-None-Match` and `If-Modified-Since`. A `HEAD` never fills an
    /// entry; an authorized request's answer fills one only when it says
    /// `public`.
    async fn lead(
        &self,
        req: ClientRequest,
        peer: &Peer,
        scope: &Scope,
        base: &Base,
        ask: Ask,
        (flight, tap): (Option<Lead>, Option<HealthTap>),
    ) -> Forwarded {
        let result = match ask.authorized {
            true => CacheResult::Bypass,
            false => CacheResult::Miss,
        };
        scope.count(result);
        if !ask.may_fill() {
            return self.forward(req, peer, tap).await;
        }
        let mut req = req;
        if flight.is_some() {
            // The fetch is for everyone: the whole page, not a `304` only
            // this client could use (as nginx fills its cache).
            let asked = req.headers_mut();
            asked.remove(http::header::IF_NONE_MATCH);
            asked.remove(http::header::IF_MODIFIED_SINCE);
        }
        let headers = req.headers().clone();
        let mut forwarded = self.forward(req, peer, tap).await;
        let received = Instant::now();
        // An origin's order to queuegate is for one visitor's session.
        let ordered = forwarded.command.is_some() || forwarded.lane.is_some();
        let resp = &forwarded.resp;
        let keep = (forwarded.from_origin && !ordered)
            .then(|| cache::keep(resp.status(), resp.headers(), &ask, scope.ttl()))
            .flatten();
        // What the origin will answer again, not a passing failure.
        let unkept = |flight: Option<Lead>| {
            if let Some(flight) = flight.filter(|_| forwarded.from_origin) {
                scope.unkept(flight.key());
            }
        };
        let Some(keep) = keep else {
            if !resp.status().is_server_error() {
                unkept(flight);
            }
            return forwarded;
        };
        let resp = std::mem::replace(&mut forwarded.resp, Answer::new(Body::Empty));
        forwarded.resp = match cache::read_body(resp, scope.max_body()).await {
            Read::Whole(parts, body) => {
                let stored = scope.keep(base, &headers, (parts, body), keep, received);
                let resp = stored.answer(false, Instant::now(), false);
                if let Some(flight) = flight {
                    flight.land(stored);
                }
                resp
            }
            Read::Unkept(resp) => {
                unkept(flight);
                resp
            }
            Read::Failed(resp) => resp,
        };
        forwarded
    }

    /// Forwards an admitted or ungated request, taking any origin command
    /// and lane out of the answer; a route's request without a body is
    /// counted in `tap` (see [`HealthTap`]). The request is handed to the
    /// upstream before this returns (see [`Upstream::forward`]).
    pub(super) fn forward(
        &self,
        mut req: ClientRequest,
        peer: &Peer,
        tap: Option<HealthTap>,
    ) -> impl Future<Output = Forwarded> + Send + '_ {
        let tap = tap.filter(|_| http_body::Body::is_end_stream(req.body()));
        cookie::strip_own_cookies(req.headers_mut());
        let started = Instant::now();
        let remote = peer.addr;
        // A combinator, not an async block: the block would hold the
        // upstream's future twice (captured, then pinned while awaited),
        // and every request's future is moved whole several times.
        let exchange = self.upstream.forward(req, peer, &origin::OWN_FIELDS);
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
            if let Some(tap) = tap {
                tap.record(seconds, from_origin, &resp);
            }
            let Said { command, lane } = origin::take(resp.headers_mut());
            Forwarded {
                resp,
                from_origin,
                command,
                lane,
            }
        })
    }
}

/// Where a route's forwarded request is counted: the route's health window
/// (DESIGN §9.1) and its origin metrics. Only requests without a body are:
/// the origin answers a request once its body has come, so a client that
/// sends its body slowly would stretch the time measured (or run it into a
/// timeout) and, with a few admitted sessions, talk the capacity down for
/// everyone.
pub(super) struct HealthTap {
    live: Arc<RouteLive>,
    origin: RouteOrigin,
}

impl HealthTap {
    pub(super) fn of(route: &RouteRt) -> HealthTap {
        HealthTap {
            live: route.live.clone(),
            origin: route.metrics.origin.clone(),
        }
    }

    /// Counts an answer that took `seconds`: failed when it is a `5xx`,
    /// the origin's or queuegate's own (a timeout, a connection that
    /// failed). A request the client got wrong (a bad body) is not the
    /// origin's doing and is not counted.
    fn record(self, seconds: f64, from_origin: bool, resp: &Answer<Body>) {
        let status = resp.status();
        if !from_origin && !status.is_server_error() {
            return;
        }
        self.live
            .health()
            .record(Duration::from_secs_f64(seconds), status.is_server_error());
        self.origin.response(seconds);
    }
}

/// A forwarded request's answer.
pub(super) struct Forwarded {
    /// Without any `Queuegate-Command` or `Queuegate-Lane` header.
    pub(super) resp: Answer<Body>,
    /// Whether the origin answered (not a 502 or 504 of queuegate's own).
    pub(super) from_origin: bool,
    /// What the origin's `Queuegate-Command` said, if anything known.
    pub(super) command: Option<OriginCommand>,
    /// The lane the origin's `Queuegate-Lane` named, if a valid one.
    pub(super) lane: Option<Lane>,
}

/// A kept answer served for cache `scope`, counted as `result`.
fn served(scope: &Scope, result: CacheResult, stored: &Stored, head: bool) -> Forwarded {
    scope.count(result);
    Forwarded {
        resp: stored.answer(head, Instant::now(), true),
        // The origin's answer, kept: as if it had answered (an exit path
        // served from the cache ends the session all the same).
        from_origin: true,
        command: None,
        lane: None,
    }
}

/// `resp` with `set_cookie` added when there is one.
pub(super) fn with_cookie(
    mut resp: Answer<Body>,
    set_cookie: Option<http::HeaderValue>,
) -> Answer<Body> {
    if let Some(cookie) = set_cookie {
        resp.headers_mut().append(SET_COOKIE, cookie);
    }
    resp
}
