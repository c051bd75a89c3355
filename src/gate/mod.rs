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
//!
//! Its files: this one decides (`Gate`, `Decision`); `pass` checks and
//! renews passes; `ticket` answers a ticket's polls; `arrive` admits or
//! queues a newcomer, in the lane it was given; `lines` asks the store, or
//! the local line when the store cannot answer.

mod arrive;
mod lines;
mod pass;
#[cfg(test)]
mod tests;
mod ticket;

use std::sync::Arc;

use http::header::HeaderValue;

use crate::admission::VisitorId;
use crate::clock::Clock;
use crate::config::Mode;
use crate::cookie::Credentials;
use crate::metrics::SessionEnd;
use crate::queue::{ClientKey, Counted, Guarded, MemoryStore, Place, QueueStore};
use crate::route::{RouteRt, Settings};

pub use lines::{By, Lines};
use pass::Confirmed;

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

/// The gate: the store (behind its circuit breaker) and the in-process
/// line that stands in for it while it is down, the clock, and the
/// sessions this instance saw confirmed on an admit-now pass.
#[derive(Clone)]
pub struct Gate {
    lines: Lines,
    clock: Clock,
    confirmed: Arc<Confirmed>,
}

impl Gate {
    pub fn new(store: Guarded, clock: Clock) -> Gate {
        Gate {
            lines: Lines::new(store, clock),
            clock,
            confirmed: Arc::new(Confirmed::default()),
        }
    }

    /// The shared store, behind its circuit breaker.
    pub fn store(&self) -> &Guarded {
        &self.lines.shared
    }

    /// The in-process line that stands in for the store while it is down.
    pub fn local(&self) -> &MemoryStore {
        &self.lines.local
    }

    /// The store and the local line, with the rule of which answers.
    pub fn lines(&self) -> &Lines {
        &self.lines
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
            self.lines.leave(route, &claims.id, "leave").await;
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
        let counted = self.lines.count_request(route, id, limit).await;
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
        self.lines.leave(route, id, "ending a session").await;
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
            .lines
            .shared
            .count_request(route.name(), id, limit, &route.limits)
            .await;
        matches!(counted, Ok(Counted::Exhausted))
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
