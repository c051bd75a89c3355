//! A gated request's session: counted before the decision where the route
//! counts requests (DESIGN §8.6), forwarded under its session or held back,
//! and the session ended with the origin's answer when the route or the
//! origin says so. A request forwarded takes a turn at the origin first
//! (DESIGN §9.2), before it is counted, so that a busy answer costs the
//! session none of its requests; the turn is held to the end of the
//! origin's answer (see [`response::holding_turn`]). What must outlive a client that goes away does
//! ([`Detached`]), and a request dropped unanswered is counted
//! ([`Unanswered`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::client_request::ClientRequest;
use crate::message::Answer;

use crate::admission::VisitorId;
use crate::cookie::Credentials;
use crate::gate::{Decided, Decision, Requester};
use crate::inflight::{Turn, Turns};
use crate::metrics::{Metrics, Outcome, RouteMetrics, SessionEnd};
use crate::origin::OriginCommand;
use crate::proxy::Peer;
use crate::queue::Counted;
use crate::response::{self, Body};
use crate::route::{RouteRt, Settings};
use crate::waiting;

use super::forward::{with_cookie, Forwarded, HealthTap};
use super::{outcome_of, App, Conn};

impl App {
    /// A request to a route that counts requests (DESIGN §8.6). Its pass is
    /// counted before the decision: the session may have made its requests
    /// (answered, never forwarded nor admitted anew in this request), or
    /// this may be its last (forwarded, no decision needed), so concurrent
    /// requests with one pass let exactly the allowed number through. The
    /// decision then admits nobody anew on a used-up credential (see
    /// [`Gate::decide_counted`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn counted(
        &self,
        s: &Arc<Settings>,
        index: usize,
        req: ClientRequest,
        conn: &Conn,
        who: Requester<'_>,
        creds: Credentials,
        exit: bool,
    ) -> (Outcome, Answer<Body>) {
        let route = &s.routes[index];
        let (counted, turn) = match creds.pass {
            Some(pass) => {
                // A pass is most likely forwarded: its turn is taken before
                // it is counted, so that a busy answer costs it no request.
                let Some(turn) = take_turn(route).await else {
                    return (Outcome::Busy, response::busy());
                };
                match self.gate.count_request(route, &pass.id).await {
                    Counted::Exhausted => {
                        return (Outcome::UsedUp, self.used_up(s, route, &req, who.tls));
                    }
                    Counted::Last => {
                        let session = (pass.id, Counted::Last);
                        let resp =
                            self.forward_session(s, index, req, conn, None, session, exit, turn);
                        return (Outcome::Pass, resp.await);
                    }
                    counted => (Some((pass.id, counted)), Some(turn)),
                }
            }
            None => (None, None),
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
                    .admit_or_hold(s, index, req, conn, decision, exit, counted, turn)
                    .await;
                (outcome, with_cookie(resp, lane_cookie))
            }
            None => (Outcome::UsedUp, self.used_up(s, route, &req, who.tls)),
        }
    }

    /// Answers the gate's `decision` on a request to route `index`: an
    /// admitted one is forwarded once it has a turn at the origin (`turn`,
    /// if taken already; see [`take_turn`]), under its session, counted
    /// first where the route counts requests unless `counted` already
    /// counted it; any other is held back. An admitted request that gets no
    /// turn is answered busy, with its new pass if it was given one.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn admit_or_hold(
        &self,
        s: &Arc<Settings>,
        index: usize,
        req: ClientRequest,
        conn: &Conn,
        decision: Decision,
        exit: bool,
        counted: Option<(VisitorId, Counted)>,
        turn: Option<Turn>,
    ) -> (Outcome, Answer<Body>) {
        let route = &s.routes[index];
        let outcome = outcome_of(&decision);
        let Decision::Admit {
            set_cookie,
            session,
            ..
        } = decision
        else {
            return (outcome, waiting::held_back(s, route, &req, decision));
        };
        let turn = match turn {
            Some(turn) => turn,
            None => match take_turn(route).await {
                Some(turn) => turn,
                None => return (Outcome::Busy, with_cookie(response::busy(), set_cookie)),
            },
        };
        match session {
            Some(id) => {
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
                let resp =
                    self.forward_session(s, index, req, conn, set_cookie, session, exit, turn);
                (outcome, resp.await)
            }
            None => {
                // Passthrough or failing open: no session for an origin
                // command to end.
                let cache = route.cache.as_ref();
                let tap = Some(HealthTap::of(route));
                let mut forwarded = self.fetch(req, &conn.peer, cache, tap).await;
                self.record_lane(s, &mut forwarded, [(route, None)], conn.peer.tls);
                (outcome, response::holding_turn(forwarded.resp, turn))
            }
        }
    }

    /// The answer to a request whose session made its requests: not
    /// forwarded, and the pass cookie cleared.
    fn used_up(
        &self,
        s: &Settings,
        route: &RouteRt,
        req: &ClientRequest,
        tls: bool,
    ) -> Answer<Body> {
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
    /// [`Detached`]. It holds the request's `turn` at the origin until then,
    /// and the answer's body holds it on to its end. `conn.app` is this app.
    #[allow(clippy::too_many_arguments)]
    fn forward_session<'a>(
        &'a self,
        s: &'a Arc<Settings>,
        index: usize,
        req: ClientRequest,
        conn: &'a Conn,
        set_cookie: Option<http::HeaderValue>,
        session: (VisitorId, Counted),
        exit: bool,
        turn: Turn,
    ) -> impl Future<Output = Answer<Body>> + Send + 'a {
        let (id, counted) = session;
        let step = SessionStep {
            s: s.clone(),
            index,
            id,
            counted,
            exit,
            turn,
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
    /// The request's turn at the origin (DESIGN §9.2).
    turn: Turn,
}

impl SessionStep {
    /// Forwards `req` through `app` and ends the session if the answer says
    /// so: the answer, and whether the session ended with it. Owns all it
    /// uses, so that it can finish on its own (see [`Detached`]).
    async fn exchange(self, app: Arc<App>, req: ClientRequest, peer: Peer) -> (Forwarded, bool) {
        let route = &self.s.routes[self.index];
        let tap = Some(HealthTap::of(route));
        let mut forwarded = app.fetch(req, &peer, route.cache.as_ref(), tap).await;
        forwarded.resp = response::holding_turn(forwarded.resp, self.turn);
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

/// A turn at the origin for a request of `route` (DESIGN §9.2): at once if
/// one is free, else the first within the route's `inflight_wait`, behind
/// the requests already waiting; `None` when none came (the request is
/// answered busy). A request that goes away while it waits gives up its
/// place in the line.
async fn take_turn(route: &RouteRt) -> Option<Turn> {
    Turns::take(route.live.turns(), route.cfg.inflight_wait).await
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
/// `queuegate_requests_total`, and for the route it matched, if one.
pub(super) struct Unanswered<'a> {
    metrics: &'a Metrics,
    route: Option<&'a RouteMetrics>,
    answered: bool,
}

impl<'a> Unanswered<'a> {
    pub(super) fn request(metrics: &'a Metrics) -> Unanswered<'a> {
        Unanswered {
            metrics,
            route: None,
            answered: false,
        }
    }

    /// The request matched a route, counted by `route`, if one.
    pub(super) fn on_route(&mut self, route: Option<&'a RouteMetrics>) {
        self.route = route;
    }

    pub(super) fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.metrics.request(Outcome::ClientGone);
        if let Some(route) = self.route {
            route.client_gone();
        }
    }
}
