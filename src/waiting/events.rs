//! `GET <reserved>/events?route=NAME` (DESIGN §8.8): the status JSON pushed
//! as Server-Sent Events, one `data:` line each, from the same code the
//! status endpoint answers with. A waiter's stream sends its place at once,
//! then whenever its state or place changes (looked at no more than about
//! once a second, after the admitter's tick), and at least every 15 s; an
//! answer other than `waiting` is sent and ends the stream, since no cookie
//! can ride an open stream: the page then makes one status request. It
//! does not own the place itself (the gate's `recheck`, answered from the
//! line record or the store as a poll is) nor the heartbeats (queued by the
//! gate, flushed by the admitter). Open streams are capped per route, per
//! visitor and per client address at each instance; one over any cap is a
//! single `poll` event.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::client_request::ClientRequest;
use crate::message::Answer;
use arc_swap::ArcSwap;
use bytes::Bytes;

use rand::Rng;
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use super::{fill_decision, fill_place, status_target, Standing, IDLE_POLL_MS};
use crate::admission::Claims;
use crate::cookie::{CookieMemo, Credentials};
use crate::gate::{Decision, Gate, Requester};
use crate::metrics::StreamCap;
use crate::queue::ClientKey;
use crate::response::{self, Body, Pieces};
use crate::route::{RouteLive, RouteRt, Settings, StreamSlot};

/// A stream that has nothing new sends its state again after this long:
/// the page sees it is alive, and proxies do not cut a silent connection.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// A stream looks at its place at most this often: the pace a waiter near
/// the head polls at, so a stream that the line record cannot answer costs
/// the store no more than a poll would.
const MOST_OFTEN: Duration = Duration::from_secs(1);

/// Event streams one visitor (one ticket) may hold open on a route at an
/// instance: a few tabs. More are refused as the route's cap refuses, so
/// a client cannot take the route's streams (and as many connections) with
/// one cookie.
pub const MAX_PER_VISITOR: usize = 4;

/// What every event stream of a running queuegate shares: the cap on open
/// streams per route (`limits.max_event_streams`; the cap per visitor is
/// [`MAX_PER_VISITOR`]), the cap per client address and the streams each
/// client holds open, the running settings (looked up again at each
/// update, so a reload applies), and the signal that ends them all when the
/// server drains.
///
/// The per-client cap (`limits.max_event_streams_per_client`) counts a
/// client's streams on every route of this instance, under the key its
/// places are counted under (`client_ip::limit_key`: IPv4 address, IPv6
/// /64, behind trusted proxies). It is this instance's own, not the
/// route's `client_limits.places` in the shared store: an open stream is a
/// connection to this instance, which is what a few addresses holding many
/// would use up (`limits.max_event_streams`, `limits.max_connections`), it
/// holds no place, and it ends with the instance, so it needs no store
/// round trip to count nor to give back.
pub struct Streams {
    max_per_route: usize,
    clients: ClientStreams,
    settings: Arc<ArcSwap<Settings>>,
    ending: watch::Sender<bool>,
}

impl Streams {
    pub fn new(
        max_per_route: usize,
        max_per_client: usize,
        settings: Arc<ArcSwap<Settings>>,
    ) -> Streams {
        Streams {
            max_per_route,
            clients: ClientStreams {
                max: max_per_client,
                open: Arc::default(),
            },
            settings,
            ending: watch::channel(false).0,
        }
    }

    /// Ends every open stream (and every stream opened later) at its next
    /// turn: the server is draining.
    pub fn end_all(&self) {
        self.ending.send_replace(true);
    }
}

/// Open streams by client (its limit key) at this instance, on every
/// route; a client's entry goes with its last stream, so there are never
/// more entries than open streams.
type OpenByClient = Arc<Mutex<HashMap<Box<[u8]>, usize>>>;

/// The streams each client holds open at this instance, and how many one
/// may.
struct ClientStreams {
    max: usize,
    open: OpenByClient,
}

impl ClientStreams {
    /// A place for one more stream of `client`, unless it holds as many as
    /// one may. A client of no known address (an empty key) is not counted,
    /// as per-client limits do not apply to it.
    fn open(&self, client: ClientKey<'_>) -> Result<ClientSlot, StreamCap> {
        if client.is_empty() {
            return Ok(ClientSlot(None));
        }
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let held = open.get(client).copied().unwrap_or(0);
        if held >= self.max {
            return Err(StreamCap::Client);
        }
        open.insert(client.into(), held + 1);
        Ok(ClientSlot(Some((self.open.clone(), client.into()))))
    }

    /// Streams open in all, and clients holding them.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        (open.values().sum(), open.len())
    }
}

/// One open stream's place in its client's count, given back when dropped.
struct ClientSlot(Option<(OpenByClient, Box<[u8]>)>);

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let Some((open, client)) = self.0.take() else {
            return;
        };
        let mut open = open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Entry::Occupied(mut held) = open.entry(client) {
            *held.get_mut() -= 1;
            if *held.get() == 0 {
                held.remove();
            }
        }
    }
}

/// `GET /events?route=NAME`: always `200`, `text/event-stream`.
pub fn serve(
    gate: &Gate,
    streams: &Streams,
    s: &Settings,
    req: &ClientRequest,
    who: Requester<'_>,
    cookies: &CookieMemo,
) -> Answer<Body> {
    let (route_name, return_path, index) = status_target(s, req);
    let Some(index) = index else {
        return one_event(&Standing {
            state: "unknown",
            route: Some(route_name),
            return_path: Some(&return_path),
            poll_after_ms: Some(IDLE_POLL_MS),
            ..Standing::default()
        });
    };
    let route = &s.routes[index];
    let creds = s.credentials(index, req.headers(), who.tls, cookies);
    let Some(ticket) = creds.ticket else {
        // Nothing to follow: a pass, or nothing at all. The status
        // endpoint says which (and renews or queues, with a cookie).
        let state = if creds.pass.is_some() {
            "poll"
        } else {
            "unknown"
        };
        return one_event(&Standing {
            state,
            route: Some(route.name()),
            return_path: Some(&return_path),
            poll_after_ms: Some(IDLE_POLL_MS),
            ..Standing::default()
        });
    };
    let slots = route
        .live
        .open_stream(ticket.id, streams.max_per_route, MAX_PER_VISITOR)
        .and_then(|slot| Ok((slot, streams.clients.open(who.client)?)));
    let (slot, client_slot) = match slots {
        Ok(slots) => slots,
        Err(cap) => {
            // Enough streams here, or of this visitor's, or of this
            // client's: this page polls.
            route.metrics.stream_refused(cap);
            return one_event(&Standing {
                state: "poll",
                route: Some(route.name()),
                return_path: Some(&return_path),
                poll_after_ms: Some(super::poll_after_ms(route, 1)),
                ..Standing::default()
            });
        }
    };
    let stream = Stream {
        gate: gate.clone(),
        settings: streams.settings.clone(),
        ticks: route.live.ticks(),
        live: route.live.clone(),
        ending: streams.ending.subscribe(),
        ticket,
        client: who.client.into(),
        tls: who.tls,
        return_path: return_path.into(),
        shown: None,
        sent_at: None,
        checked_at: Instant::now(),
        over: false,
        _slot: slot,
        _client_slot: client_slot,
    };
    let pieces = futures_util::stream::unfold(stream, |mut stream| async move {
        let piece = stream.next().await?;
        Some((piece, stream))
    });
    response::event_stream("events", Pieces::new(pieces))
}

/// A stream of one event, `body`.
fn one_event(body: &Standing<'_>) -> Answer<Body> {
    let piece = event(body);
    response::event_stream(
        "events",
        Pieces::new(futures_util::stream::once(async move { piece })),
    )
}

/// `body` as one Server-Sent Event.
fn event(body: &Standing<'_>) -> Bytes {
    // Serialised JSON has no raw line breaks: one `data:` line holds it.
    Bytes::from(format!("data: {}\n\n", body.to_json()))
}

/// One waiter's open stream: what it follows, and what it last said.
struct Stream {
    gate: Gate,
    settings: Arc<ArcSwap<Settings>>,
    /// The route's live numbers (kept across reloads): the route is found
    /// again by them, and their tick counter wakes the stream.
    live: Arc<RouteLive>,
    ticks: watch::Receiver<u64>,
    ending: watch::Receiver<bool>,
    /// The waiter's ticket as its cookie would read had each of the
    /// stream's answers been able to write it again: `at` is the last
    /// heartbeat the stream sent (see [`Stream::check`]).
    ticket: Claims,
    client: Box<[u8]>,
    tls: bool,
    return_path: Box<str>,
    /// The place the last event showed.
    shown: Option<Shown>,
    /// When the last event was sent; `None` before the first.
    sent_at: Option<Instant>,
    /// When the place was last looked at.
    checked_at: Instant,
    /// The last event was sent: the stream ends.
    over: bool,
    _slot: StreamSlot,
    _client_slot: ClientSlot,
}

/// What an event showed of a place; another event goes out when it moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shown {
    position: u64,
    waiting_total: u64,
    lane: usize,
}

/// Why a stream woke.
enum Wake {
    Ending,
    Keepalive,
    Ticked,
}

impl Stream {
    /// The next event, when it is due; `None`: the stream ends.
    async fn next(&mut self) -> Option<Bytes> {
        if self.over || *self.ending.borrow() {
            return None;
        }
        let Some(sent_at) = self.sent_at else {
            return Some(self.check(true).await);
        };
        loop {
            let look_at = self.checked_at + self.pace();
            match self.wake(sent_at + KEEPALIVE, look_at).await {
                Wake::Ending => return None,
                Wake::Keepalive => return Some(self.check(true).await),
                Wake::Ticked => {
                    // Every tick since is taken in by this look.
                    self.ticks.borrow_and_update();
                    let event = self.check(false).await;
                    if !event.is_empty() {
                        return Some(event);
                    }
                }
            }
        }
    }

    /// Waits for what wakes the stream: the server's drain, the
    /// keepalive, or, from `look_at` on, a tick (the keepalive first when
    /// both are due). One timer at a time, so that an open stream keeps
    /// room for one.
    async fn wake(&mut self, keepalive: Instant, look_at: Instant) -> Wake {
        let (ending, ticks) = (&mut self.ending, &mut self.ticks);
        tokio::select! {
            biased;
            _ = ending.wait_for(|ending| *ending) => return Wake::Ending,
            () = sleep_until(look_at.min(keepalive)) => {}
        }
        if look_at >= keepalive {
            return Wake::Keepalive;
        }
        tokio::select! {
            biased;
            _ = ending.wait_for(|ending| *ending) => Wake::Ending,
            () = sleep_until(keepalive) => Wake::Keepalive,
            ticked = ticks.changed() => match ticked {
                Ok(()) => Wake::Ticked,
                // The route's live numbers are gone with their route.
                Err(_) => Wake::Ending,
            },
        }
    }

    /// How often this stream may look at its place: [`MOST_OFTEN`], or a
    /// quarter of the route's patience (the smaller of `abandon_after` and
    /// `arrival_grace`) when that is shorter, so that heartbeats go out in
    /// time and an admission is noticed before the arrival grace runs out;
    /// with ±20 % jitter, as polls have, so that streams opened together do
    /// not all look (and go to the store) at the same tick.
    fn pace(&self) -> Duration {
        let settings = self.settings.load();
        match self.route_in(&settings) {
            Some(index) => {
                let limits = &settings.routes[index].limits;
                let patience = limits.abandon_after.min(limits.arrival_grace);
                let pace = (patience / 4).clamp(Duration::from_millis(100), MOST_OFTEN);
                pace.mul_f64(rand::rng().random_range(0.8..1.2))
            }
            None => Duration::ZERO,
        }
    }

    /// The index of the stream's route in `s`, if it is still there.
    fn route_in(&self, s: &Settings) -> Option<usize> {
        s.routes
            .iter()
            .position(|r| Arc::ptr_eq(&r.live, &self.live))
    }

    /// Looks at the waiter's place as a poll would, without a cookie to
    /// write: the event to send, or nothing when the place is as last shown
    /// and `always` is false. An answer other than `waiting` ends the
    /// stream.
    ///
    /// The gate would write the ticket again now and then, recording the
    /// heartbeat (its `at`); the stream cannot, so it keeps the ticket as
    /// rewritten itself and the next poll it makes reads that. A waiter
    /// who only holds the stream open therefore looks to the store (and the
    /// line record) exactly like one who polls: never silent for
    /// `abandon_after`, and restored at its place after a store loss.
    async fn check(&mut self, always: bool) -> Bytes {
        self.checked_at = Instant::now();
        let settings = self.settings.load_full();
        let Some(index) = self.route_in(&settings) else {
            self.over = true;
            return self.sent(event(&Standing {
                state: "unknown",
                return_path: Some(&self.return_path),
                poll_after_ms: Some(IDLE_POLL_MS),
                ..Standing::default()
            }));
        };
        let route = &settings.routes[index];
        let who = Requester {
            tls: self.tls,
            client: &self.client,
            invite: None,
            invited: None,
        };
        let creds = Credentials {
            ticket: Some(self.ticket),
            ..Credentials::default()
        };
        // Boxed: the store call's future is large, and only lives while it runs.
        let decision = Box::pin(self.gate.recheck(&settings, index, who, &creds)).await;
        let mut body = Standing {
            route: Some(route.name()),
            ..Standing::default()
        };
        match decision {
            Some(Decision::Wait { place, set_cookie }) => {
                if set_cookie.is_some() {
                    self.rewrite_ticket(route, place.lane);
                }
                let shown = Shown {
                    position: place.position,
                    waiting_total: place.waiting_total,
                    lane: place.lane,
                };
                if !always && self.shown == Some(shown) {
                    return Bytes::new();
                }
                self.shown = Some(shown);
                fill_place(&mut body, route, &place);
            }
            Some(decision) => {
                fill_decision(&mut body, route, &decision);
                self.over = true;
            }
            None => {
                // The place is gone: the status endpoint puts the visitor
                // back in line, with the cookie a stream cannot set.
                body.state = "poll";
                self.over = true;
            }
        }
        body.poll_after_ms.get_or_insert(IDLE_POLL_MS);
        body.return_path = Some(&self.return_path);
        self.sent(event(&body))
    }

    /// The ticket as the cookie the gate just wrote would hold it: seen
    /// now, in lane `lane`.
    fn rewrite_ticket(&mut self, route: &RouteRt, lane: usize) {
        let now_us = self.gate.clock().now_us().max(self.ticket.t + 1);
        self.ticket.at = Some(now_us);
        self.ticket.lane = route.lane_tag(lane);
    }

    /// `piece`, noting when it was sent.
    fn sent(&mut self, piece: Bytes) -> Bytes {
        self.sent_at = Some(Instant::now());
        piece
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clients_streams_stop_at_its_cap_and_give_their_places_back() {
        let clients = ClientStreams {
            max: 2,
            open: Arc::default(),
        };
        let (me, other): (&[u8], &[u8]) = (&[203, 0, 113, 9], &[198, 51, 100, 7]);
        let mine = [clients.open(me), clients.open(me)];
        assert!(mine.iter().all(Result::is_ok));
        assert_eq!(clients.open(me).err(), Some(StreamCap::Client));
        let theirs = clients.open(other).expect("another client");
        assert_eq!(clients.counts(), (3, 2));
        drop(mine);
        assert_eq!(clients.counts(), (1, 1));
        let again = clients.open(me).expect("places given back");
        drop((theirs, again));
        assert_eq!(clients.counts(), (0, 0));
        // No known address: not counted, never refused.
        let unknown: Vec<_> = (0..5).map(|_| clients.open(&[])).collect();
        assert!(unknown.iter().all(Result::is_ok));
        assert_eq!(clients.counts(), (0, 0));
        let none = ClientStreams {
            max: 0,
            open: Arc::default(),
        };
        assert_eq!(none.open(me).err(), Some(StreamCap::Client));
    }
}
