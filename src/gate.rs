//! The per-request decision of DESIGN §1 step 4, as a value: the local pass
//! check, renewal, admit now or join the line, and leaving. Its only awaits
//! are store calls; it never touches a socket or a body. Which route a
//! request is for is `route`'s; reading and writing cookies is `cookie`'s.
//! It also ends sessions before they expire (DESIGN §8.6): counting a
//! session's forwarded requests against `max_requests_per_session`, and
//! ending one at the origin's command or on an exit path.
//! Before a route's opening (DESIGN §8.7) it hands out pre-queue tickets
//! and answers their polls itself, with the time left, without a store call.
//! It puts an arrival in the lane an invite or its own lane cookie names
//! (DESIGN §8.5) and binds the lane cookie to the ticket or pass the
//! visitor holds or gets.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::header::HeaderValue;

use crate::admission::{self, Claims, Kind, PassLife, VisitorId};
use crate::clock::Clock;
use crate::config::{Mode, OnStoreError};
use crate::cookie::{self, Credentials, LaneCookie};
use crate::lane_grant::{self, Holder, InviteVerdict, Lane, LANE_COOKIE_TTL};
use crate::metrics::SessionEnd;
use crate::queue::{
    Arrival, Arriving, ClientKey, Counted, Guarded, Heartbeat, InviteUse, MemoryStore, PassTimes,
    Place, Poll, QueueStore, StoreError, TicketTimes,
};

/// Who is asking, as far as the gate cares: whether the request came over
/// TLS (which names the cookie and sets `Secure`), the key the client's
/// places and joins are counted under (empty: unknown, no limit), and the
/// invite token its target carried (DESIGN §8.5), unverified.
#[derive(Clone, Copy, Debug)]
pub struct Requester<'a> {
    pub tls: bool,
    pub client: ClientKey<'a>,
    /// The first `qg_invite` parameter's value, taken out of the target
    /// before anything else read it (`lane_grant::take_invite`).
    pub invite: Option<&'a str>,
    /// The lane an invite this request carried put the visitor in (see
    /// [`Gate::take_invite`]): a newcomer joins it and a held ticket moves
    /// to it. Otherwise a newcomer joins the lane of its own lane cookie,
    /// or the route's first.
    pub invited: Option<LaneGrant>,
}

/// A lane a visitor was given (DESIGN §8.5): by an invite, or by its lane
/// cookie. The lane cookie that keeps the visitor in it ends `until_unix`
/// at the latest: for an invite, its expiry or [`LANE_COOKIE_TTL`] from
/// now, whichever is sooner; for a lane cookie, the cookie's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneGrant {
    /// An index into the route's lanes.
    pub lane: usize,
    /// Unix seconds.
    pub until_unix: u64,
}

/// A decision and the lane cookie to send with it (DESIGN §8.5): the lane
/// an invite gave, bound to the ticket or pass the visitor holds or gets
/// in this answer; or, for a visitor who arrived in the lane of its lane
/// cookie, that cookie bound to the ticket or pass it got.
#[derive(Debug)]
pub struct Decided {
    pub decision: Decision,
    pub lane_cookie: Option<HeaderValue>,
}

impl Decided {
    fn alone(decision: Decision) -> Decided {
        Decided {
            decision,
            lane_cookie: None,
        }
    }
}

use crate::route::{RouteRt, Settings};

/// A ticket cookie outlives any reasonable wait; the place itself is kept by
/// the store and by the score the ticket carries.
const TICKET_COOKIE_MAX_AGE_S: u64 = 7 * 24 * 3600;

/// How a visitor came to be let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// A valid pass in the first half of its life: no store call.
    Pass,
    /// A pass renewed through the store.
    Renewed,
    /// A pass renewed locally because the store could not answer.
    RenewedLocally,
    /// Admitted at once on arrival.
    AtOnce,
    /// Admitted from the line.
    FromLine,
    /// Let through without a pass: the store is down and the route fails open.
    FailOpen,
    /// The route is in `passthrough` mode.
    Passthrough,
}

/// What the gate decided for a request to a gated route.
#[derive(Debug)]
pub enum Decision {
    /// Forward, setting `set_cookie` (a fresh pass) when present.
    /// `session` is the id of the session the request is admitted under
    /// (none for a passthrough route or when failing open).
    Admit {
        how: Admitted,
        set_cookie: Option<HeaderValue>,
        session: Option<VisitorId>,
    },
    /// Send to the waiting room.
    Wait {
        place: Place,
        set_cookie: Option<HeaderValue>,
    },
    /// Before the route's opening (DESIGN §8.7): in the pre-queue, whose
    /// order the opening draws. `opens_in_ms` is by this instance's clock,
    /// so a visitor's wrong clock does not matter.
    PreQueue {
        opens_at_us: u64,
        opens_in_ms: u64,
        /// The visitor's lane (an index into the route's lanes).
        lane: usize,
        set_cookie: Option<HeaderValue>,
    },
    /// The line is full: nobody was queued.
    Full { waiting_total: u64 },
    /// The client holds as many places as it may, or joined too often
    /// (DESIGN §8.3): nobody was queued or admitted.
    TooMany { retry_after: std::time::Duration },
    /// The route is closed.
    Closed,
    /// The store is down and the route's policy is `closed`.
    Unavailable,
}

impl Decision {
    /// The ticket or pass cookie the decision sets, if any.
    pub fn into_set_cookie(self) -> Option<HeaderValue> {
        match self {
            Decision::Admit { set_cookie, .. }
            | Decision::Wait { set_cookie, .. }
            | Decision::PreQueue { set_cookie, .. } => set_cookie,
            _ => None,
        }
    }
}

/// The gate: the store (behind its circuit breaker), the clock, the
/// in-process line that stands in for the store while it is down, and the
/// sessions this instance saw confirmed on an admit-now pass.
#[derive(Clone)]
pub struct Gate {
    store: Guarded,
    local: MemoryStore,
    clock: Clock,
    confirmed: Arc<Confirmed>,
}

impl Gate {
    pub fn new(store: Guarded, clock: Clock) -> Gate {
        Gate {
            store,
            local: MemoryStore::fallback(clock),
            clock,
            confirmed: Arc::new(Confirmed::default()),
        }
    }

    /// The shared store, behind its circuit breaker.
    pub fn store(&self) -> &Guarded {
        &self.store
    }

    /// The in-process line that stands in for the store while it is down.
    pub fn local(&self) -> &MemoryStore {
        &self.local
    }

    /// The clock the gate signs passes by.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Leaves the line or frees the slot of every credential in `creds`, in
    /// the store and in the local line (a visitor may be in either while the
    /// store comes and goes). Answers whether there was anything to leave.
    pub async fn leave(&self, route: &RouteRt, creds: &Credentials) -> bool {
        let mut left = false;
        if let Some(ticket) = creds.ticket {
            // A ticket that left is out of line here at once, not only at
            // the next flush, and never restored here after a store loss.
            route
                .live
                .out_of_line([ticket.id], route.limits.abandon_after);
            route
                .live
                .end(&ticket.id, self.clock.now_s(), &route.limits);
        }
        if let Some(pass) = creds.pass {
            // A pass given up is refused here at once, even in the first
            // half of its life, as for a session the origin ended: the slot
            // goes to someone else now. On a shared store the other
            // instances learn it within a tick; on the memory store this is
            // the only instance.
            route.live.end(&pass.id, self.clock.now_s(), &route.limits);
        }
        for claims in [creds.pass, creds.ticket].into_iter().flatten() {
            if let Err(err) = self
                .store
                .leave(route.name(), &claims.id, &route.limits)
                .await
            {
                tracing::warn!(route = route.name(), error = %err, "leave could not reach the store");
            }
            let _ = self
                .local
                .leave(route.name(), &claims.id, &route.limits)
                .await;
            left = true;
        }
        left
    }

    /// Counts one request of session `id` about to be forwarded on a route
    /// with `max_requests_per_session` (DESIGN §8.6): one store call. When
    /// the store cannot answer, the session is counted in the local line
    /// instead, whatever the route's `on_store_error`: admitted visitors do
    /// not depend on the store, and this instance still holds each session
    /// to the limit for the requests it forwards (across instances, an
    /// outage can let a session make up to the limit on each).
    pub async fn count_request(&self, route: &RouteRt, id: &VisitorId) -> Counted {
        let Some(limit) = route.cfg.max_requests_per_session else {
            return Counted::Allowed;
        };
        let counted = match self
            .store
            .count_request(route.name(), id, limit, &route.limits)
            .await
        {
            Ok(counted) => counted,
            Err(err) => {
                tracing::debug!(route = route.name(), error = %err, "request counted locally");
                // The memory store always answers.
                self.local
                    .count_request(route.name(), id, limit, &route.limits)
                    .await
                    .unwrap_or(Counted::Allowed)
            }
        };
        match counted {
            Counted::Allowed | Counted::Gone => {}
            Counted::Last => self.ended(route, id, SessionEnd::MaxRequests),
            Counted::Exhausted => route.live.end(id, self.clock.now_s(), &route.limits),
        }
        counted
    }

    /// Ends session `id` before it expires (DESIGN §8.6), for `reason`: its
    /// slot is freed in the store and the local line, with a tombstone, and
    /// this instance refuses its passes from now on. The caller clears the
    /// pass cookie.
    pub async fn end_session(&self, route: &RouteRt, id: &VisitorId, reason: SessionEnd) {
        if let Err(err) = self.store.leave(route.name(), id, &route.limits).await {
            tracing::warn!(route = route.name(), error = %err, "ending a session could not reach the store");
        }
        let _ = self.local.leave(route.name(), id, &route.limits).await;
        self.ended(route, id, reason);
    }

    /// Notes a session ended for `reason`.
    fn ended(&self, route: &RouteRt, id: &VisitorId, reason: SessionEnd) {
        route.live.end(id, self.clock.now_s(), &route.limits);
        route.metrics.session_ended(reason);
        tracing::debug!(
            route = route.name(),
            reason = reason.as_str(),
            "session ended"
        );
    }

    /// Decides a request to gated route `index` of `s` (DESIGN §1 step 4).
    /// `creds` reads the request's credentials for that route (usually
    /// [`Settings::credentials`], through the connection's cookie memo); it
    /// is not called for a passthrough or closed route, which needs none.
    ///
    /// Every branch that calls the store is boxed: a store call's future is
    /// kilobytes, and unboxed it would be the size of every request's
    /// future, copied on each request and held by each keep-alive
    /// connection while it is idle. The admitted path allocates nothing.
    pub async fn decide(
        &self,
        s: &Settings,
        index: usize,
        who: Requester<'_>,
        creds: impl FnOnce() -> Credentials,
    ) -> Decided {
        let route = &s.routes[index];
        if let Some(decision) = by_mode(route, self.clock) {
            return Decided::alone(decision);
        }
        let creds = creds();
        if let Some(decided) = self.held_decided(s, route, &creds, who).await {
            return decided;
        }
        Box::pin(self.arrive_in_lane(s, route, who, &creds)).await
    }

    /// [`Gate::held`], with the lane cookie that binds an invite's lane to
    /// the ticket or pass held.
    async fn held_decided(
        &self,
        s: &Settings,
        route: &RouteRt,
        creds: &Credentials,
        who: Requester<'_>,
    ) -> Option<Decided> {
        let decision = self.held(s, route, creds, who).await?;
        let lane_cookie = who
            .invited
            .zip(creds.visitor())
            .and_then(|(grant, id)| self.lane_cookie(s, route, grant, &id, who.tls));
        Some(Decided {
            decision,
            lane_cookie,
        })
    }

    /// [`Gate::decide`] on a route that counts requests (DESIGN §8.6), once
    /// the pass in `creds`, if any, was counted as `counted` (an exhausted
    /// or last count needs no decision). No request arrives anew on a
    /// credential whose session made its requests, so concurrent requests
    /// with one pass or one ticket let exactly the allowed number through:
    ///
    /// - a pass counted `Allowed` is admitted on its session even when that
    ///   ended meanwhile (a concurrent request was its last): this request
    ///   was counted within the limit;
    /// - a ticket whose place is gone because its session, admitted from
    ///   the line, made its requests (or left) answers `None`: used up.
    pub async fn decide_counted(
        &self,
        s: &Settings,
        index: usize,
        who: Requester<'_>,
        creds: &Credentials,
        counted: Option<Counted>,
    ) -> Option<Decided> {
        let route = &s.routes[index];
        if let Some(decision) = by_mode(route, self.clock) {
            return Some(Decided::alone(decision));
        }
        if let Some(decided) = self.held_decided(s, route, creds, who).await {
            return Some(decided);
        }
        match (creds.pass, creds.ticket, counted) {
            (Some(pass), _, Some(Counted::Allowed)) => {
                return Some(Decided::alone(Decision::Admit {
                    how: Admitted::Pass,
                    set_cookie: None,
                    session: Some(pass.id),
                }));
            }
            (None, Some(ticket), _) if self.made_its_requests(route, &ticket.id).await => {
                return None;
            }
            _ => {}
        }
        Some(Box::pin(self.arrive_in_lane(s, route, who, creds)).await)
    }

    /// Whether session `id`, which holds no place any more, ended by
    /// making its requests or leaving: the store's count answers exhausted.
    /// It counts nothing for an id without a live session, which is what a
    /// place found gone is. A store that cannot answer says no.
    async fn made_its_requests(&self, route: &RouteRt, id: &VisitorId) -> bool {
        let Some(limit) = route.cfg.max_requests_per_session else {
            return false;
        };
        let counted = self
            .store
            .count_request(route.name(), id, limit, &route.limits)
            .await;
        matches!(counted, Ok(Counted::Exhausted))
    }

    /// No usable ticket or pass: arrive in the lane an invite gave, or the
    /// lane of the visitor's own lane cookie, or (the store counting its
    /// one use) of one for its first arrival; else in the route's first.
    /// A lane cookie that put the visitor in its lane is bound to the
    /// ticket or pass it gets, with its expiry kept.
    async fn arrive_in_lane(
        &self,
        s: &Settings,
        route: &RouteRt,
        who: Requester<'_>,
        creds: &Credentials,
    ) -> Decided {
        let grant = match who.invited {
            Some(grant) => Some(grant),
            None => self.granted_lane(route, creds).await,
        };
        let id = admission::new_visitor_id();
        let decision = self
            .arrive(s, route, who, grant.map_or(0, |g| g.lane), id)
            .await;
        // Only a ticket or pass made now carries the id.
        let minted = matches!(
            decision,
            Decision::Admit {
                session: Some(_),
                ..
            } | Decision::Wait { .. }
                | Decision::PreQueue { .. }
        );
        let lane_cookie = grant
            .filter(|_| minted)
            .and_then(|grant| self.lane_cookie(s, route, grant, &id, who.tls));
        Decided {
            decision,
            lane_cookie,
        }
    }

    /// The lane the visitor's lane cookie puts an arrival in: its own
    /// (bound to the ticket or pass it sends), or one for its first arrival
    /// whose one use the store lets this arrival take (when the store
    /// cannot count it, nobody gets the lane). A lane the route does not
    /// have puts nobody anywhere.
    async fn granted_lane(&self, route: &RouteRt, creds: &Credentials) -> Option<LaneGrant> {
        let now = self.clock.now_s();
        let grant = |cookie: &LaneCookie| {
            let lane = route.limits.lanes.index_of(cookie.lane.as_str())?;
            Some(LaneGrant {
                lane,
                until_unix: cookie.expires_unix,
            })
        };
        if let Some(own) = creds.own_lane(now) {
            return grant(own);
        }
        let cookie = creds.unclaimed_lane(now)?;
        let lane = grant(cookie)?;
        let Holder::First(nonce) = cookie.holder else {
            return None;
        };
        // One arrival takes it, as a one-use invite.
        self.take_use(route, &nonce, 1, cookie.expires_unix, now)
            .await
            .then_some(lane)
    }

    /// The `Set-Cookie` value that binds `grant` to visitor `id`. (The
    /// route's lane names are checked with the config; should one not be a
    /// lane name, there is no cookie.)
    fn lane_cookie(
        &self,
        s: &Settings,
        route: &RouteRt,
        grant: LaneGrant,
        id: &VisitorId,
        tls: bool,
    ) -> Option<HeaderValue> {
        let lane = Lane::new(&route.limits.lanes.get(grant.lane).name)?;
        Some(cookie::set_lane(
            &s.ring,
            route.name(),
            &lane,
            &Holder::Visitor(*id),
            self.clock.now_s(),
            grant.until_unix,
            tls,
            s.cookie_domain.as_deref(),
        ))
    }

    /// What [`Gate::decide`] answers a visitor for what it holds, without
    /// ever joining the line: `None` where `decide` would admit at once or
    /// queue (no credential, or its session or place is gone). An event
    /// stream (DESIGN §8.8) asks this, since it cannot set the cookie a
    /// new ticket or pass would need.
    pub async fn recheck(
        &self,
        s: &Settings,
        index: usize,
        who: Requester<'_>,
        creds: &Credentials,
    ) -> Option<Decision> {
        let route = &s.routes[index];
        if let Some(decision) = by_mode(route, self.clock) {
            return Some(decision);
        }
        self.held(s, route, creds, who).await
    }

    /// The decision for the pass or ticket in `creds`; `None`: there is
    /// neither, or it is no longer good.
    async fn held(
        &self,
        s: &Settings,
        route: &RouteRt,
        creds: &Credentials,
        who: Requester<'_>,
    ) -> Option<Decision> {
        if let Some(pass) = creds.pass {
            self.check_pass(s, route, &pass, who).await
        } else if let Some(ticket) = creds.ticket {
            Box::pin(self.check_ticket(s, route, &ticket, who)).await
        } else {
            None
        }
    }

    /// A pass: forward while fresh; past half its life, or on the first
    /// return of an admit-now pass (which confirms the session, DESIGN §8.3),
    /// or when the store was lost since it was issued, or when it was granted
    /// locally (the store takes that session back), renew it through the
    /// store. An admit-now pass this instance saw confirmed is forwarded
    /// like a confirmed one while fresh (a client that keeps its first cookie
    /// costs no store call per request). `None` means the session is gone:
    /// treat as no cookie.
    pub async fn check_pass(
        &self,
        s: &Settings,
        route: &RouteRt,
        pass: &Claims,
        who: Requester<'_>,
    ) -> Option<Decision> {
        let now_s = self.clock.now_s();
        let times = pass_times(pass, route.limits.pass_ttl.as_secs());
        let epoch_ms = route.live.epoch_us.load(Ordering::Relaxed) / 1_000;
        let before_epoch = epoch_ms > 0 && times.issued_ms < epoch_ms;
        let fresh = pass.pass_life(now_s, route.limits.pass_ttl) == PassLife::Fresh;
        // Only an admit-now pass looks its session up: the confirmed path
        // takes no lock.
        let confirmed = pass.kind == Kind::Pass
            || (pass.kind == Kind::NewPass && self.confirmed.holds(&pass.id, now_s));
        if fresh && confirmed && !before_epoch {
            if route.live.has_ended(&pass.id, now_s) {
                return None;
            }
            return Some(Decision::Admit {
                how: Admitted::Pass,
                set_cookie: None,
                session: Some(pass.id),
            });
        }
        // A session that ended is not renewed, nor restored by a store that
        // lost its tombstone, nor renewed locally while the store is down.
        if route.live.has_ended(&pass.id, now_s) {
            return None;
        }
        let renewed =
            Box::pin(
                self.store
                    .renew(route.name(), &pass.id, who.client, times, &route.limits),
            )
            .await;
        let (how, kind) = match renewed {
            Ok(true) => {
                if fresh && pass.kind == Kind::NewPass {
                    self.confirmed.note(pass.id, pass.t, now_s);
                }
                (Admitted::Renewed, Kind::Pass)
            }
            Ok(false) => return None,
            Err(err) => {
                // Admitted visitors never depend on the store, but a pass long
                // past its session is not revived.
                if now_s > pass.t + route.limits.session_ttl.as_secs() {
                    return None;
                }
                tracing::debug!(route = route.name(), error = %err, "pass renewed locally");
                (
                    Admitted::RenewedLocally,
                    self.renew_locally(route, pass, times, who).await,
                )
            }
        };
        Some(Decision::Admit {
            how,
            set_cookie: Some(self.pass_cookie(s, route, &pass.id, kind, who.tls)),
            session: Some(pass.id),
        })
    }

    /// The kind of pass to give a holder the store could not renew: any
    /// confirmed session gets an `l` pass, which the store takes back once
    /// it answers again; an admit-now pass the store granted stays
    /// unconfirmed (the store has not seen this return). A session the local
    /// line granted is renewed there too, which confirms it on its first
    /// return and keeps it counted against the local capacity.
    async fn renew_locally(
        &self,
        route: &RouteRt,
        pass: &Claims,
        times: PassTimes,
        who: Requester<'_>,
    ) -> Kind {
        if route.cfg.on_store_error == OnStoreError::Local && pass.kind == Kind::LocalPass {
            let limits = route.local_limits_now();
            let _ = self
                .local
                .renew(route.name(), &pass.id, who.client, times, &limits)
                .await;
        }
        if times.confirmed {
            Kind::LocalPass
        } else {
            Kind::NewPass
        }
    }

    /// A ticket: poll the line (a heartbeat; the first one confirms the
    /// ticket). `None` means the place is gone.
    pub async fn check_ticket(
        &self,
        s: &Settings,
        route: &RouteRt,
        ticket: &Claims,
        who: Requester<'_>,
    ) -> Option<Decision> {
        let mut times = TicketTimes {
            score_us: ticket.t,
            seen_us: ticket.at.unwrap_or(ticket.t),
            lane: route.lane_index(ticket.lane.as_ref()),
        };
        // An invite moves a held ticket to its lane, keeping its place in
        // time (DESIGN §8.5); the ticket is written again to say so.
        let mut moved = false;
        if let Some(to) = who.invited.map(|i| i.lane).filter(|&to| to != times.lane) {
            if self.move_ticket(route, ticket, to).await {
                times.lane = to;
                moved = true;
            }
        }
        let now_us = self.clock.now_us();
        let opening = route.opening_ahead(now_us);
        if let (Kind::PreTicket, Some(opens_at_us)) = (ticket.kind, opening) {
            // Before the opening a pre-queue ticket is answered here, unless
            // a flush found it out of the store's line: the store then
            // restores it or lets it go (and it joins again, losing nothing
            // before a shuffle).
            if !route.live.is_out_of_line(&ticket.id) {
                return Some(self.before_opening(s, route, ticket, times, opens_at_us, moved, who));
            }
        }
        if moved {
            // The record may not know the move yet: the store answers.
        } else if ticket.kind == Kind::PreTicket {
            // Its score is the arrival's, not the place the opening drew:
            // the store answers, and the ticket is written again with it.
        } else if let Some(decision) = self.answer_from_record(s, route, ticket, times, who) {
            route.metrics.poll(true);
            return Some(decision);
        }
        // A place that ended is not restored by a store that lost its
        // tombstone, nor taken in by the local line.
        if route.live.has_ended(&ticket.id, now_us / 1_000_000) {
            return None;
        }
        route.metrics.poll(false);
        route.live.polled_in_store(&ticket.id);
        let (polled, granted) = match self
            .store
            .poll(route.name(), &ticket.id, who.client, times, &route.limits)
            .await
        {
            Ok(p) => (p, Kind::Pass),
            Err(err) => match route.cfg.on_store_error {
                OnStoreError::Local => {
                    tracing::debug!(route = route.name(), error = %err, "polling the local line");
                    route.live.answered_locally.store(true, Ordering::Relaxed);
                    let polled = self
                        .local
                        .poll(
                            route.name(),
                            &ticket.id,
                            who.client,
                            times,
                            &route.local_limits_now(),
                        )
                        .await
                        .ok()?;
                    if self.store.is_shared() && matches!(polled, Poll::Waiting(_)) {
                        // The ticket's own record of the poll moves on; the
                        // store hears of it with the flush once it answers
                        // again, so that the polls the record answers next
                        // (which send no heartbeat while the ticket's is
                        // fresh) find the waiter alive in the store.
                        route.live.heartbeat(Heartbeat {
                            id: ticket.id,
                            client: who.client.to_vec(),
                        });
                    }
                    (polled, Kind::LocalPass)
                }
                _ => return Some(self.store_failed(route, &err)),
            },
        };
        match polled {
            Poll::Waiting(place) => {
                // Written again when due, when the store holds the ticket in
                // another lane than it names (moved, or its lane removed),
                // or at another score (the opening's shuffle moved it).
                let seen = self.seen_again(route, ticket, times);
                let relaned = route.lane_tag(place.lane) != ticket.lane;
                // A pre-queue ticket stays one until the shuffle gave it its
                // place: while the store still holds it at its arrival
                // score, before the opening.
                let kind = match (ticket.kind, route.limits.opens_at_us) {
                    (Kind::PreTicket, Some(opens_at_us))
                        if place.score_us == ticket.t && place.score_us < opens_at_us =>
                    {
                        Kind::PreTicket
                    }
                    _ => Kind::Ticket,
                };
                let rewritten = kind != ticket.kind || place.score_us != ticket.t;
                let set_cookie = (seen.is_some() || relaned || rewritten).then(|| {
                    self.place_cookie(
                        s,
                        route,
                        kind,
                        &ticket.id,
                        place.score_us,
                        seen.or(ticket.at),
                        place.lane,
                        who.tls,
                    )
                });
                if let (Kind::PreTicket, Some(opens_at_us)) = (kind, opening) {
                    return Some(Decision::PreQueue {
                        opens_at_us,
                        opens_in_ms: (opens_at_us - now_us).div_ceil(1_000),
                        lane: place.lane,
                        set_cookie,
                    });
                }
                Some(Decision::Wait { place, set_cookie })
            }
            Poll::Admitted => {
                if granted == Kind::LocalPass {
                    route.live.granted_locally.store(true, Ordering::Relaxed);
                }
                Some(Decision::Admit {
                    how: Admitted::FromLine,
                    set_cookie: Some(self.pass_cookie(s, route, &ticket.id, granted, who.tls)),
                    session: Some(ticket.id),
                })
            }
            Poll::Gone => None,
        }
    }

    /// The ticket carries when the line last saw its holder, so a restore
    /// after a store loss can tell a live waiter from one that had gone
    /// silent before it (DESIGN §8.3). It is written again on the first poll
    /// and then every quarter of abandon_after, not on every poll: the time
    /// to write (µs), or `None`.
    fn seen_again(&self, route: &RouteRt, ticket: &Claims, times: TicketTimes) -> Option<u64> {
        let now_us = self.clock.now_us().max(ticket.t + 1);
        let refresh_us = route.limits.abandon_after.as_micros() as u64 / 4;
        let stale = !times.confirmed() || now_us.saturating_sub(times.seen_us) > refresh_us;
        stale.then_some(now_us)
    }

    /// A pre-queue ticket's poll before the opening, answered without a
    /// store call: the time left. Its heartbeat goes to the store with the
    /// admitter's next flush at the moments the ticket is written again
    /// (its first poll, then every quarter of `abandon_after`), as for a
    /// poll the line record answers, so a live waiter is not dropped as a
    /// ghost before the opening and a silent one is.
    #[allow(clippy::too_many_arguments)]
    fn before_opening(
        &self,
        s: &Settings,
        route: &RouteRt,
        ticket: &Claims,
        times: TicketTimes,
        opens_at_us: u64,
        moved: bool,
        who: Requester<'_>,
    ) -> Decision {
        let seen = self.seen_again(route, ticket, times);
        if seen.is_some() {
            route.live.heartbeat(Heartbeat {
                id: ticket.id,
                client: who.client.to_vec(),
            });
        }
        let set_cookie = (seen.is_some() || moved).then(|| {
            self.place_cookie(
                s,
                route,
                Kind::PreTicket,
                &ticket.id,
                ticket.t,
                seen.or(ticket.at),
                times.lane,
                who.tls,
            )
        });
        Decision::PreQueue {
            opens_at_us,
            opens_in_ms: opens_at_us
                .saturating_sub(self.clock.now_us())
                .div_ceil(1_000),
            lane: times.lane,
            set_cookie,
        }
    }

    /// A poll answered from the line record, without a store call, when the
    /// store is shared, the ticket was confirmed, and the record places it
    /// behind the head of the line (DESIGN §8.9). The poll's heartbeat goes
    /// to the store with the next flush, at the same moments the ticket's
    /// own record of it is written again, so the store's last poll of a
    /// waiter lags the ticket's by one tick at most.
    fn answer_from_record(
        &self,
        s: &Settings,
        route: &RouteRt,
        ticket: &Claims,
        times: TicketTimes,
        who: Requester<'_>,
    ) -> Option<Decision> {
        if !self.store.is_shared() || !times.confirmed() {
            return None;
        }
        // Silent for abandon_after: dropped as a ghost, or about to be; the
        // store says which (a live waiter's ticket is written again every
        // quarter of it).
        let silent_us = self.clock.now_us().saturating_sub(times.seen_us);
        if silent_us >= route.limits.abandon_after.as_micros() as u64 {
            return None;
        }
        // Three ticks without a record: the admitter is not reaching the
        // store, and the store (or the local line) answers.
        let fresh_for = route.limits.tick * 3 + Duration::from_millis(500);
        let lane = route.limits.lanes.clamp(times.lane);
        let placed = route.live.place_from_record(
            &ticket.id,
            &route.limits.lanes.get(lane).name,
            ticket.t,
            fresh_for,
            &route.limits.lanes,
        )?;
        let set_cookie = self.seen_again(route, ticket, times).map(|now_us| {
            route.live.heartbeat(Heartbeat {
                id: ticket.id,
                client: who.client.to_vec(),
            });
            self.ticket_cookie(s, route, &ticket.id, ticket.t, Some(now_us), lane, who.tls)
        });
        let place = Place {
            score_us: ticket.t,
            position: placed.position,
            waiting_total: placed.waiting_total,
            lane,
        };
        Some(Decision::Wait { place, set_cookie })
    }

    /// No usable cookie: admit at once or join the line, in lane `lane`, as
    /// visitor `id` (fresh).
    pub async fn arrive(
        &self,
        s: &Settings,
        route: &RouteRt,
        who: Requester<'_>,
        lane: usize,
        id: VisitorId,
    ) -> Decision {
        // Before the opening nobody is let in at once (the store checks it
        // too, by its own clock), and a place is a pre-queue ticket.
        let opening = route.opening_ahead(self.clock.now_us());
        let admit_now = route.cfg.mode == Mode::Gate && opening.is_none();
        // The store's epoch as this instance knows it: a store lost since
        // the last tick is noticed here too, before anyone is let in at once.
        let known_epoch_us = route.live.known_epoch_us();
        // A shared store takes this instance's arrivals in batches.
        let arrived = if self.store.is_shared() {
            let arriving = Arriving {
                id,
                client: who.client.to_vec(),
                admit_now,
                lane,
            };
            route
                .live
                .joins
                .arrive(
                    &self.store,
                    route.name(),
                    arriving,
                    &route.limits,
                    known_epoch_us,
                )
                .await
        } else {
            self.store
                .arrive(
                    route.name(),
                    &id,
                    who.client,
                    &route.limits,
                    admit_now,
                    known_epoch_us,
                    lane,
                )
                .await
        };
        let (arrival, granted) = match arrived {
            // Unconfirmed until the visitor comes back with the pass.
            Ok(a) => (a, Kind::NewPass),
            Err(err) => match route.cfg.on_store_error {
                OnStoreError::Local => {
                    route.live.answered_locally.store(true, Ordering::Relaxed);
                    // Just after an opening the store may be busy with the
                    // shuffle: the local line lets nobody in at once.
                    let admit_now = admit_now && !route.just_opened(self.clock.now_us());
                    let local = self
                        .local
                        .arrive(
                            route.name(),
                            &id,
                            who.client,
                            &route.local_limits_now(),
                            admit_now,
                            None,
                            lane,
                        )
                        .await;
                    match local {
                        // The local line confirms it on the visitor's return,
                        // and the store takes it back once it answers again.
                        Ok(a) => (a, Kind::LocalPass),
                        Err(local_err) => return self.store_failed(route, &local_err),
                    }
                }
                _ => return self.store_failed(route, &err),
            },
        };
        match arrival {
            Arrival::Admitted => {
                if granted == Kind::LocalPass {
                    route.live.granted_locally.store(true, Ordering::Relaxed);
                }
                Decision::Admit {
                    how: Admitted::AtOnce,
                    set_cookie: Some(self.pass_cookie(s, route, &id, granted, who.tls)),
                    session: Some(id),
                }
            }
            Arrival::Waiting(place) => {
                let kind = match opening {
                    Some(_) => Kind::PreTicket,
                    None => Kind::Ticket,
                };
                let set_cookie = Some(self.place_cookie(
                    s,
                    route,
                    kind,
                    &id,
                    place.score_us,
                    None,
                    place.lane,
                    who.tls,
                ));
                match opening {
                    Some(opens_at_us) => Decision::PreQueue {
                        opens_at_us,
                        opens_in_ms: opens_at_us
                            .saturating_sub(self.clock.now_us())
                            .div_ceil(1_000),
                        lane: place.lane,
                        set_cookie,
                    },
                    None => Decision::Wait { place, set_cookie },
                }
            }
            Arrival::Full { waiting_total } => Decision::Full { waiting_total },
            Arrival::TooMany { retry_after } => Decision::TooMany { retry_after },
        }
    }

    fn store_failed(&self, route: &RouteRt, err: &StoreError) -> Decision {
        tracing::warn!(route = route.name(), error = %err, policy = ?route.cfg.on_store_error, "store unavailable");
        match route.cfg.on_store_error {
            OnStoreError::Open => Decision::Admit {
                how: Admitted::FailOpen,
                set_cookie: None,
                session: None,
            },
            OnStoreError::Closed | OnStoreError::Local => Decision::Unavailable,
        }
    }

    /// Moves the waiter holding `ticket` to lane `to`, keeping its join
    /// score (DESIGN §8.5): whether it was waiting and moved.
    pub async fn move_ticket(&self, route: &RouteRt, ticket: &Claims, to: usize) -> bool {
        match self
            .store
            .move_lane(route.name(), &ticket.id, to, &route.limits)
            .await
        {
            Ok(moved) => moved,
            Err(err) => {
                tracing::debug!(route = route.name(), error = %err, "ticket not moved to the invite's lane");
                false
            }
        }
    }

    /// An invite token a request to `route` carried (DESIGN §8.5): when it
    /// is genuine, unexpired, for this route and one of its lanes, and (with
    /// `--uses`) one of its uses is left, the lane it puts the visitor in.
    /// Anything else is no invite: never an error page. The lane cookie
    /// given for it (by [`Gate::decide`], bound to the visitor's ticket or
    /// pass) ends with the invite at the latest. A visitor whose own lane
    /// cookie already names the lane does not use the token up again; when
    /// the store cannot count a use, the invite is not honoured (one more
    /// visitor in the lane than the token allows would be).
    pub async fn take_invite(
        &self,
        s: &Settings,
        route: &RouteRt,
        token: &str,
        creds: &Credentials,
    ) -> Option<LaneGrant> {
        let now = self.clock.now_s();
        let invite = match lane_grant::verify_invite(&s.ring, token, route.name(), now) {
            InviteVerdict::Valid(invite) => invite,
            InviteVerdict::Invalid(reject) => {
                tracing::debug!(route = route.name(), ?reject, "invite ignored");
                return None;
            }
        };
        let lane = route.limits.lanes.index_of(invite.lane.as_str())?;
        let held = creds
            .own_lane(now)
            .is_some_and(|c| c.lane.as_str() == invite.lane.as_str());
        let uses = u32::try_from(invite.uses).unwrap_or(u32::MAX);
        if invite.uses > 0
            && !held
            && !self
                .take_use(route, &invite.nonce, uses, invite.expires_unix, now)
                .await
        {
            return None;
        }
        let until_unix = invite
            .expires_unix
            .min(now.saturating_add(LANE_COOKIE_TTL.as_secs()));
        Some(LaneGrant { lane, until_unix })
    }

    /// Takes one of the `uses` of the invite (or first-arrival lane cookie)
    /// `nonce`, valid until `expires_unix`, in the store: whether it is
    /// honoured. One this instance saw used up is refused without asking
    /// (it stays used up past a loss of the store), and its last use is
    /// remembered so. A store that cannot count it honours nothing.
    async fn take_use(
        &self,
        route: &RouteRt,
        nonce: &[u8],
        uses: u32,
        expires_unix: u64,
        now_s: u64,
    ) -> bool {
        if route.live.is_invite_used_up(nonce, now_s) {
            tracing::debug!(route = route.name(), "invite used up");
            return false;
        }
        let taken = self
            .store
            .take_use(route.name(), nonce, uses, expires_unix)
            .await;
        match taken {
            Ok(taken) => {
                if taken != InviteUse::Taken {
                    route.live.invite_used_up(nonce, now_s, expires_unix);
                }
                if !taken.honoured() {
                    tracing::debug!(route = route.name(), "invite used up");
                }
                taken.honoured()
            }
            Err(err) => {
                tracing::debug!(route = route.name(), error = %err, "invite use not counted");
                false
            }
        }
    }

    /// A fresh pass of `kind` for `id`, as a `Set-Cookie` value: confirmed
    /// (`a`), the `n` pass of an admit-now session the visitor has not come
    /// back to, or the `l` pass of a session granted without the store.
    pub fn pass_cookie(
        &self,
        s: &Settings,
        route: &RouteRt,
        id: &VisitorId,
        kind: Kind,
        tls: bool,
    ) -> HeaderValue {
        let now_us = self.clock.now_us();
        let expiry = now_us / 1_000_000 + route.limits.pass_ttl.as_secs();
        let value = s
            .ring
            .sign_at(kind, route.name(), id, expiry, Some(now_us / 1_000));
        let max_age = route.limits.session_ttl.as_secs() + route.limits.pass_ttl.as_secs();
        cookie::set_cookie(
            route.cookie_name(tls),
            &value,
            max_age,
            tls,
            s.cookie_domain.as_deref(),
        )
    }

    /// A ticket for `id` at join score `score_us`, last seen at `seen_us`
    /// (none for a new ticket), waiting in lane `lane`, as a `Set-Cookie`
    /// value.
    #[allow(clippy::too_many_arguments)]
    pub fn ticket_cookie(
        &self,
        s: &Settings,
        route: &RouteRt,
        id: &VisitorId,
        score_us: u64,
        seen_us: Option<u64>,
        lane: usize,
        tls: bool,
    ) -> HeaderValue {
        self.place_cookie(s, route, Kind::Ticket, id, score_us, seen_us, lane, tls)
    }

    /// [`Gate::ticket_cookie`] for a ticket of `kind`: `w`, or `p` before
    /// the route's opening.
    #[allow(clippy::too_many_arguments)]
    pub fn place_cookie(
        &self,
        s: &Settings,
        route: &RouteRt,
        kind: Kind,
        id: &VisitorId,
        score_us: u64,
        seen_us: Option<u64>,
        lane: usize,
        tls: bool,
    ) -> HeaderValue {
        let value = s.ring.sign_place(
            kind,
            route.name(),
            id,
            score_us,
            seen_us,
            route.lane_tag(lane).as_ref(),
        );
        cookie::set_cookie(
            route.cookie_name(tls),
            &value,
            TICKET_COOKIE_MAX_AGE_S,
            tls,
            s.cookie_domain.as_deref(),
        )
    }
}

/// The sessions this instance saw confirmed on the return of their
/// admit-now (`n`) pass (DESIGN §8.3), each kept until that pass expires: a
/// client that keeps sending the `n` pass (a script, a load tool) is then
/// answered as one with the confirmed pass would be, without a store call,
/// until the pass's half-life, on any connection. Ending a session is
/// checked as for a confirmed pass (`RouteLive::has_ended`). Kept per
/// instance, not per connection, since such clients open new connections;
/// bounded, since only a confirmation (one store call) adds an entry: when
/// full, a confirmation is not remembered and that pass is renewed through
/// the store as before.
#[derive(Default)]
struct Confirmed(Mutex<ConfirmedIds>);

#[derive(Default)]
struct ConfirmedIds {
    /// Session id → the `n` pass's expiry (unix s).
    until: HashMap<VisitorId, u64>,
    /// When expired entries were last dropped (unix s).
    pruned_s: u64,
}

impl Confirmed {
    /// The most sessions remembered (a few megabytes at most).
    const MAX_KEPT: usize = 65_536;

    /// Notes session `id` confirmed on an `n` pass that expires at
    /// `expiry_s`.
    fn note(&self, id: VisitorId, expiry_s: u64, now_s: u64) {
        let mut ids = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if ids.until.len() >= Self::MAX_KEPT && ids.pruned_s != now_s {
            // At most once a second, so a full memory stays cheap to add to.
            ids.pruned_s = now_s;
            ids.until.retain(|_, until| *until > now_s);
        }
        if ids.until.len() < Self::MAX_KEPT {
            ids.until.insert(id, expiry_s);
        }
    }

    /// Whether session `id` was confirmed and the `n` pass that confirmed it
    /// has not expired at `now_s`.
    fn holds(&self, id: &VisitorId, now_s: u64) -> bool {
        let ids = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        ids.until.get(id).is_some_and(|&until| until > now_s)
    }
}

/// The decision a route's mode makes alone: a passthrough route admits and
/// a closed one refuses, whatever the visitor holds.
fn by_mode(route: &RouteRt, clock: Clock) -> Option<Decision> {
    // From `closes_at` on, the route answers as a closed one (DESIGN §8.7);
    // the clock is read only on a route that has one.
    if route.cfg.closes_at.is_some() && route.closed_at(clock.now_us()) {
        return Some(Decision::Closed);
    }
    match route.cfg.mode {
        Mode::Passthrough => Some(Decision::Admit {
            how: Admitted::Passthrough,
            set_cookie: None,
            session: None,
        }),
        Mode::Closed => Some(Decision::Closed),
        Mode::Gate | Mode::QueueAll => None,
    }
}

/// What a pass tells the store's restore rules: when it was issued (ms),
/// whether its session was confirmed, and whether it was granted locally. A pass signed before passes carried
/// their issue time is taken as issued at the last millisecond of its
/// second, so one issued in the same second as a store's epoch is never
/// taken for one issued before it.
fn pass_times(pass: &Claims, pass_ttl_s: u64) -> PassTimes {
    let issued_ms = pass.at.unwrap_or_else(|| {
        pass.t
            .saturating_sub(pass_ttl_s)
            .saturating_add(1)
            .saturating_mul(1_000)
            .saturating_sub(1)
    });
    PassTimes {
        issued_ms,
        confirmed: matches!(pass.kind, Kind::Pass | Kind::LocalPass),
        granted_locally: pass.kind == Kind::LocalPass,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confirmation_is_kept_until_its_pass_expires_and_the_memory_is_bounded() {
        let confirmed = Confirmed::default();
        confirmed.note([1; 16], 100, 50);
        assert!(confirmed.holds(&[1; 16], 99));
        assert!(!confirmed.holds(&[1; 16], 100));
        assert!(!confirmed.holds(&[2; 16], 50));
        // Full of live entries: a new one is not kept, the old ones are.
        for i in 0..Confirmed::MAX_KEPT as u32 {
            let mut id = [0; 16];
            id[..4].copy_from_slice(&i.to_le_bytes());
            id[15] = 9;
            confirmed.note(id, 1_000, 60);
        }
        confirmed.note([3; 16], 1_000, 60);
        assert!(!confirmed.holds(&[3; 16], 60));
        assert!(confirmed.holds(&[1; 16], 60));
        // Once they expire, there is room again.
        confirmed.note([3; 16], 2_000, 1_000);
        assert!(confirmed.holds(&[3; 16], 1_500));
        assert!(!confirmed.holds(&[1; 16], 1_000));
    }
}
