//! The in-process store: each route's line, active set and numbers kept in
//! memory, with the same semantics as the Redis store (DESIGN §3). It serves
//! one instance; several instances need the Redis store to share a line.
//!
//! Per route, mirroring the Redis keys:
//!
//! - the line (`waiting`, one per lane): id → join score (µs), each lane
//!   ordered by (score, id) in an order-statistics tree so a waiter's place
//!   is found in O(log n), with each lane's weighted round-robin state and
//!   admissions (the `wrr:NAME` and `admitted:NAME` fields of Redis);
//! - `seen`: id → last poll (ms), with an index by time so ghosts are dropped
//!   from the oldest without scanning the line;
//! - `tombstones`: visitors who left and admitted waiters purged for not
//!   showing up, by time buried (ms), kept for `abandon_after` so their young
//!   tickets are not restored as lost writes (the tombstones Redis keeps in
//!   `seen`);
//! - `active`: id → expiry (ms) and kind (arriving, unconfirmed, live), with
//!   an index by expiry; expired sessions are purged at the start of every
//!   operation, so the active count is the number of unexpired expiries,
//!   never a counter;
//! - `uses`: id → forwarded requests counted and when the count is
//!   forgotten (ms), for routes with `max_requests_per_session` (the
//!   `qg:{route}:uses:…` keys of Redis);
//! - `invites`: invite token → uses counted and expiry (the
//!   `qg:{route}:invite:…` keys of Redis);
//! - `clients`: per client key, the ids it brought in with their join time,
//!   forgotten `client_memory` after the client's last contact (the
//!   `qg:{route}:client:…` keys of Redis);
//! - the route's numbers (`stats`): epoch, admissions, admit rate, hold, the
//!   tick window and its admissions.
//!
//! With `store.memory.snapshot` the whole store is written to a file and
//! read back at start (see [`snapshot`]).
//!
//! Each route sits behind its own `std::sync::Mutex`; the map of routes is
//! locked only to find or create a route. No lock is held across an `.await`
//! (the operations do not await at all: they are `async` for the trait).
//!
//! # Admit rate
//!
//! Admissions per second, exponentially weighted with τ = 60 s:
//!
//! ```text
//! on each update at t, with dt = t - t_last and w = exp(-dt / τ):
//!     count   = count * w + admitted_now
//!     elapsed = elapsed * w + τ * (1 - w)        (elapsed starts at 0 at the epoch)
//! rate(t) = count(t) / max(elapsed(t), 1 s), or 0 if nothing was admitted in the last 5 τ
//! ```
//!
//! `elapsed` is the decayed length of the time observed, so a young route
//! reports admissions / age and an old one the average of roughly the last
//! minute or two. The Redis store computes the same in Lua.

mod health;
mod ranked_set;
pub mod snapshot;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use super::record::{self, LaneRecord, LineRecord};
use super::{
    store_id, Arrival, Arriving, ClientKey, Counted, Ended, HealthLook, Heartbeat, InviteUse,
    LaneStats, Limits, Override, PassTimes, Place, Poll, QueueStore, RouteStats, StoreError,
    StoreId, Tick, TicketTimes, VisitorId, WindowCounts, JOIN_WINDOW,
};
use crate::clock::Clock;
use ranked_set::RankedSet;

/// Most ids one `ended_since` answers, as `lua/ended.lua`.
const ENDED_MOST: usize = 10_000;

/// Time constant of the admit rate's exponential decay, seconds.
const RATE_TAU_S: f64 = 60.0;
/// After this long without an admission the admit rate reads zero (5 τ), µs.
const RATE_QUIET_US: u64 = 300_000_000;

/// The in-process store. Clones share the same routes.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Shared>,
}

struct Shared {
    clock: Clock,
    routes: RwLock<HashMap<String, Arc<Mutex<Route>>>>,
    /// Health windows and adaptive capacities (DESIGN §9.1).
    health: health::Healths,
    /// The local line of `on_store_error: local` (see [`MemoryStore::fallback`]).
    fallback: bool,
}

impl MemoryStore {
    /// An empty store reading time from `clock`. Each route's epoch is the
    /// time of the first operation on it.
    pub fn new(clock: Clock) -> MemoryStore {
        MemoryStore::with_role(clock, false)
    }

    /// The local line an instance runs while its shared store cannot answer
    /// (`on_store_error: local`). It differs from the store in two rules:
    /// a poll with a live ticket it does not know (one the shared store
    /// issued) takes the ticket in at its score, whatever its age, so a
    /// waiter keeps its place across the outage (a ticket never polled, only
    /// while the store would keep it unconfirmed); and a renewal restores
    /// nothing, since sessions the shared store granted are already counted
    /// against the local capacity (`RouteRt::local_limits_now`).
    pub fn fallback(clock: Clock) -> MemoryStore {
        MemoryStore::with_role(clock, true)
    }

    fn with_role(clock: Clock, fallback: bool) -> MemoryStore {
        MemoryStore {
            inner: Arc::new(Shared {
                clock,
                routes: RwLock::new(HashMap::new()),
                health: health::Healths::default(),
                fallback,
            }),
        }
    }

    /// Runs `f` on the route's state (created on first use) under its lock,
    /// with the store time read inside the lock so operations on one route
    /// see time move forward in the order they run.
    fn with_route<T>(&self, name: &str, f: impl FnOnce(&mut Route, Now) -> T) -> T {
        let route = self.route(name);
        // A panic inside `f` would poison the lock; every operation leaves the
        // route consistent between statements that can fail, so recovering the
        // guard is safe and keeps the route serving.
        let mut state = route.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Now::read(&self.inner.clock);
        f(&mut state, now)
    }

    fn route(&self, name: &str) -> Arc<Mutex<Route>> {
        let routes = &self.inner.routes;
        if let Some(route) = routes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
        {
            return Arc::clone(route);
        }
        let mut routes = routes.write().unwrap_or_else(PoisonError::into_inner);
        let epoch_us = self.inner.clock.now_us();
        Arc::clone(
            routes
                .entry(name.to_owned())
                .or_insert_with(|| Arc::new(Mutex::new(Route::new(epoch_us, self.inner.fallback)))),
        )
    }
}

/// Store time, read once per operation.
#[derive(Clone, Copy)]
struct Now {
    us: u64,
    ms: u64,
}

impl Now {
    fn read(clock: &Clock) -> Now {
        let us = clock.now_us();
        Now { us, ms: us / 1_000 }
    }
}

/// Whether the route has an opening still to come, by store time: nobody
/// is admitted before it (DESIGN §8.7).
fn before_opening(now: Now, limits: &Limits) -> bool {
    limits
        .opens_at_us
        .is_some_and(|opens_at_us| now.us < opens_at_us)
}

/// How long the session a pass stands for lives past the pass's issue
/// without another renewal: `session_ttl` once confirmed, `confirm_within`
/// for the unconfirmed session of an admit-now pass.
fn session_life(pass: PassTimes, limits: &Limits) -> Duration {
    if pass.confirmed {
        limits.session_ttl
    } else {
        limits.unconfirmed_session()
    }
}

fn as_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn as_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One route's state.
struct Route {
    epoch_us: u64,
    /// The local line of a shared store (see [`MemoryStore::fallback`]).
    fallback: bool,
    line: Line,
    sessions: Sessions,
    tombstones: Tombstones,
    /// id → (requests counted, forgotten at ms): see `count_request`.
    uses: HashMap<VisitorId, (u64, u64)>,
    /// Invite token → (uses counted, expiry unix s): see `take_use`.
    invites: HashMap<Vec<u8>, (u32, u64)>,
    clients: Clients,
    /// The last join score handed out, so scores strictly increase.
    last_score_us: u64,
    /// Nobody new is admitted before this (µs); 0 when no hold was started.
    hold_until_us: u64,
    /// Whether a loss of this epoch's predecessor was already noticed: only
    /// the first notice starts a hold.
    loss_noticed: bool,
    /// The opening (µs) whose pre-queue was shuffled (Redis: `opened`).
    opened_us: Option<u64>,
    /// The tick window the admitter last ran in.
    ticked_window: Option<u64>,
    /// The tick window `window_admitted` counts for.
    window: u64,
    /// Admissions in `window`, by the admitter and admit-now together.
    window_admitted: u64,
    admitted_total: u64,
    rate: AdmitRate,
    /// Ghosts dropped, no-shows purged and unconfirmed entries let go outside
    /// a tick, reported by the next tick that runs.
    pending: Pending,
    /// The route's runtime override (Redis: `qg:{route}:override`).
    overridden: Option<Override>,
}

/// Counts kept for the next tick (see `Tick`).
#[derive(Default)]
struct Pending {
    abandoned: u64,
    no_shows: u64,
    unconfirmed_sessions: u64,
    unconfirmed_tickets: u64,
}

impl Route {
    fn new(epoch_us: u64, fallback: bool) -> Route {
        Route {
            epoch_us,
            fallback,
            line: Line::default(),
            sessions: Sessions::default(),
            tombstones: Tombstones::default(),
            uses: HashMap::new(),
            invites: HashMap::new(),
            clients: Clients::default(),
            last_score_us: 0,
            hold_until_us: 0,
            loss_noticed: false,
            opened_us: None,
            ticked_window: None,
            window: 0,
            window_admitted: 0,
            admitted_total: 0,
            rate: AdmitRate::new(epoch_us),
            pending: Pending::default(),
            overridden: None,
        }
    }

    /// Purges expired sessions, remembering the no-shows and unconfirmed
    /// sessions among them for the next tick, and the no-shows (unless they
    /// joined the line again) for `poll`.
    fn purge_sessions(&mut self, now: Now) {
        for (expiry_ms, id, kind) in self.sessions.purge(now.ms) {
            match kind {
                SessionKind::Arriving => {
                    self.pending.no_shows += 1;
                    if !self.line.contains(&id) {
                        self.tombstones.bury(id, expiry_ms);
                    }
                }
                SessionKind::Unconfirmed => self.pending.unconfirmed_sessions += 1,
                SessionKind::Live => {}
            }
        }
    }

    /// Drops waiters silent for `abandon_after` and tickets never polled
    /// within `confirm_within` (remembered for the next tick).
    fn drop_ghosts(&mut self, now: Now, limits: &Limits) {
        let silent_since = now.ms.saturating_sub(as_ms(limits.abandon_after));
        let (abandoned, unconfirmed) = self.line.drop_silent_before(silent_since);
        self.pending.abandoned += abandoned;
        self.pending.unconfirmed_tickets += unconfirmed;
    }

    fn held(&self, now: Now) -> bool {
        now.us < self.hold_until_us
    }

    /// A loss was noticed: the first notice per epoch holds admissions for one
    /// `pass_ttl`; later ones do not extend it, so returning visitors cannot
    /// keep the line stopped.
    fn notice_loss(&mut self, now: Now, limits: &Limits) {
        if !self.loss_noticed {
            self.loss_noticed = true;
            self.hold_until_us = now.us.saturating_add(as_us(limits.pass_ttl));
        }
    }

    /// Admissions still allowed in the current tick window.
    fn budget_left(&mut self, now: Now, limits: &Limits) -> u64 {
        let window = now.ms / as_ms(limits.tick).max(1);
        if window != self.window {
            self.window = window;
            self.window_admitted = 0;
        }
        limits
            .max_admit_per_tick
            .saturating_sub(self.window_admitted)
    }

    /// Counts `n` admissions; `budget_left` must have been called at `now`.
    fn count_admitted(&mut self, now: Now, n: u64) {
        self.window_admitted += n;
        self.admitted_total += n;
        self.rate.record(now.us, n);
    }

    #[allow(clippy::too_many_arguments)]
    fn arrive(
        &mut self,
        now: Now,
        id: &VisitorId,
        client: ClientKey<'_>,
        limits: &Limits,
        admit_now: bool,
        known_epoch_us: Option<u64>,
        lane: usize,
    ) -> Arrival {
        if known_epoch_us.is_some_and(|known| known != self.epoch_us) {
            self.notice_loss(now, limits);
        }
        self.purge_sessions(now);
        self.drop_ghosts(now, limits);
        if let Some(kind) = self.sessions.kind_if_active(id, now.ms) {
            // Arriving again is not coming back with a cookie: an unconfirmed
            // session stays unconfirmed.
            if kind != SessionKind::Unconfirmed {
                let session_end = now.ms.saturating_add(as_ms(limits.session_ttl));
                self.sessions.start(*id, session_end, SessionKind::Live);
            }
            return Arrival::Admitted;
        }
        if self.line.is_confirmed(id) {
            if let Some(place) = self.line.heartbeat(id, now.ms, limits) {
                return Arrival::Waiting(place);
            }
        } else if let Some(place) = self.line.place_of(id, limits) {
            return Arrival::Waiting(place);
        }
        let (line, sessions) = (&self.line, &self.sessions);
        let holds = |held: &VisitorId| line.contains(held) || sessions.is_active(held, now.ms);
        if let Some(retry_after) = self.clients.refusal(client, now.ms, limits, holds) {
            return Arrival::TooMany { retry_after };
        }
        if admit_now
            && !self.held(now)
            && !before_opening(now, limits)
            && self.line.len(limits) == 0
            && self.sessions.len() < limits.capacity
            && self.budget_left(now, limits) > 0
        {
            let unconfirmed_end = now.ms.saturating_add(as_ms(limits.unconfirmed_session()));
            self.sessions
                .start(*id, unconfirmed_end, SessionKind::Unconfirmed);
            self.count_admitted(now, 1);
            self.clients.record(client, *id, now.ms, limits);
            return Arrival::Admitted;
        }
        let waiting = self.line.len(limits);
        if waiting >= limits.max_waiting {
            return Arrival::Full {
                waiting_total: waiting,
            };
        }
        let score_us = now.us.max(self.last_score_us.saturating_add(1));
        self.last_score_us = score_us;
        self.tombstones.forget(id);
        self.clients.record(client, *id, now.ms, limits);
        // Recorded as last seen so long ago that the ghost rule drops it
        // `confirm_within` from now unless a poll confirms it first.
        let head_start = as_ms(
            limits
                .abandon_after
                .saturating_sub(limits.unconfirmed_ticket()),
        );
        let seen_ms = now.ms.saturating_sub(head_start);
        let slot = self.line.slot_of(limits, lane);
        Arrival::Waiting(self.line.join(*id, score_us, slot, seen_ms, false, limits))
    }

    fn poll(
        &mut self,
        now: Now,
        id: &VisitorId,
        client: ClientKey<'_>,
        ticket: TicketTimes,
        limits: &Limits,
    ) -> Poll {
        self.purge_sessions(now);
        if let Some(place) = self.line.heartbeat(id, now.ms, limits) {
            self.clients.touch(client, id, now.ms, limits);
            return Poll::Waiting(place);
        }
        if self.sessions.is_active(id, now.ms) {
            let session_end = now.ms.saturating_add(as_ms(limits.session_ttl));
            self.sessions.start(*id, session_end, SessionKind::Live);
            self.clients.touch(client, id, now.ms, limits);
            return Poll::Admitted;
        }
        // Left, or admitted and never came: gone, however young the ticket.
        if self.tombstones.contains(id) {
            return Poll::Gone;
        }
        // Silent so long it would be a ghost by now.
        let alive_until_us = ticket.seen_us.saturating_add(as_us(limits.abandon_after));
        if alive_until_us <= now.us {
            return Poll::Gone;
        }
        let confirmed = ticket.confirmed();
        let age_us = now.us.saturating_sub(ticket.score_us);
        let slot = self.line.slot_of(limits, ticket.lane);
        if self.fallback {
            // A ticket never polled: the shared store keeps it unconfirmed
            // this long, so the local line does too. Its first poll can come
            // just after the store stopped answering the arrival's instance.
            if !confirmed && age_us >= as_us(limits.unconfirmed_ticket()) {
                return Poll::Gone;
            }
            let place = self
                .line
                .join(*id, ticket.score_us, slot, now.ms, true, limits);
            return Poll::Waiting(place);
        }
        let store_lost = confirmed && self.epoch_us > ticket.score_us;
        // A never-polled ticket only while the store would still hold it
        // unconfirmed: one a local line issued during an outage.
        let write_lost = age_us < as_us(limits.abandon_after)
            && (confirmed || age_us < as_us(limits.confirm_within));
        if !(store_lost || write_lost) {
            return Poll::Gone;
        }
        if store_lost {
            self.notice_loss(now, limits);
        }
        Poll::Waiting(
            self.line
                .join(*id, ticket.score_us, slot, now.ms, true, limits),
        )
    }

    /// Waiters answered from the line record polled: `poll` for each one
    /// still in line.
    fn heartbeats(&mut self, now: Now, beats: &[Heartbeat], limits: &Limits) -> Vec<bool> {
        beats
            .iter()
            .map(|beat| {
                let in_line = self.line.heartbeat(&beat.id, now.ms, limits).is_some();
                if in_line {
                    self.clients.touch(&beat.client, &beat.id, now.ms, limits);
                }
                in_line
            })
            .collect()
    }

    /// The line of `limits`' lanes now, once a tick ran in this store's life.
    fn line_record(&self, limits: &Limits) -> Option<LineRecord> {
        self.ticked_window?;
        let lanes = limits
            .lanes
            .iter()
            .map(|lane| {
                let order = self
                    .line
                    .lanes
                    .iter()
                    .find(|l| l.name == lane.name)
                    .map(|l| &l.order);
                let waiting = order.map_or(0, |o| o.len() as u64);
                let samples = record::sample_ranks(waiting)
                    .filter_map(|rank| {
                        let &(score_us, _) = order?.nth(usize::try_from(rank - 1).ok()?)?;
                        Some((rank, score_us))
                    })
                    .collect();
                LaneRecord {
                    name: lane.name.clone(),
                    waiting,
                    samples,
                }
            })
            .collect();
        Some(LineRecord {
            epoch_us: self.epoch_us,
            lanes,
        })
    }

    /// See [`QueueStore::move_lane`].
    fn move_lane(&mut self, now: Now, id: &VisitorId, to_lane: usize, limits: &Limits) -> bool {
        self.purge_sessions(now);
        let slot = self.line.slot_of(limits, to_lane);
        self.line.move_to(id, slot)
    }

    /// See [`QueueStore::take_use`].
    fn take_use(&mut self, now: Now, token: &[u8], max_uses: u32, expires_unix: u64) -> InviteUse {
        let now_s = now.ms / 1_000;
        if expires_unix <= now_s {
            return InviteUse::Refused;
        }
        let uses = self
            .invites
            .entry(token.to_vec())
            .or_insert((0, expires_unix));
        if uses.1 <= now_s {
            *uses = (0, expires_unix);
        }
        uses.0 = uses.0.saturating_add(1);
        uses.1 = expires_unix;
        match uses.0.cmp(&max_uses) {
            std::cmp::Ordering::Less => InviteUse::Taken,
            std::cmp::Ordering::Equal => InviteUse::Last,
            std::cmp::Ordering::Greater => InviteUse::Refused,
        }
    }

    fn renew(
        &mut self,
        now: Now,
        id: &VisitorId,
        client: ClientKey<'_>,
        pass: PassTimes,
        limits: &Limits,
    ) -> bool {
        self.purge_sessions(now);
        let session_end = now.ms.saturating_add(as_ms(limits.session_ttl));
        if self.sessions.is_active(id, now.ms) {
            self.sessions.start(*id, session_end, SessionKind::Live);
            self.clients.touch(client, id, now.ms, limits);
            return true;
        }
        if self.fallback || self.tombstones.contains(id) {
            return false;
        }
        // Issued before the loss (strictly, in ms), so the store could have
        // held the session, and recently enough that it would hold it still.
        let held = pass
            .issued_ms
            .saturating_add(as_ms(session_life(pass, limits)))
            > now.ms;
        let wiped = pass.issued_ms < self.epoch_us / 1_000 && held;
        // Or granted by an instance while the store could not answer.
        let granted_locally = pass.granted_locally && pass.confirmed && held;
        if !(wiped || granted_locally) {
            return false;
        }
        if wiped {
            self.notice_loss(now, limits);
        }
        // Past the hold, a restore never takes the route over its capacity.
        if !self.held(now) && self.sessions.len() >= limits.capacity {
            return false;
        }
        self.line.remove(id);
        self.sessions.start(*id, session_end, SessionKind::Live);
        true
    }

    fn hold(&mut self, now: Now, limits: &Limits) {
        let until_us = now.us.saturating_add(as_us(limits.pass_ttl));
        self.hold_until_us = self.hold_until_us.max(until_us);
    }

    fn leave(&mut self, now: Now, id: &VisitorId) {
        self.purge_sessions(now);
        self.line.remove(id);
        self.sessions.remove(id);
        self.tombstones.forget(id);
        self.tombstones.bury(*id, now.ms);
    }

    fn count_request(&mut self, now: Now, id: &VisitorId, limit: u64, limits: &Limits) -> Counted {
        self.purge_sessions(now);
        // The count outlives the tombstone: a session that made its
        // requests stays exhausted while any pass of it can come back.
        let used = self
            .uses
            .get(id)
            .filter(|&&(_, forget_ms)| forget_ms > now.ms)
            .map_or(0, |&(count, _)| count);
        if self.tombstones.contains(id) || used >= limit {
            return Counted::Exhausted;
        }
        if !self.fallback && !self.sessions.is_active(id, now.ms) {
            return Counted::Gone;
        }
        let keep_ms = as_ms(limits.session_ttl.saturating_add(limits.pass_ttl));
        let forget_ms = now.ms.saturating_add(keep_ms);
        let uses = self.uses.entry(*id).or_insert((0, forget_ms));
        if uses.1 <= now.ms {
            *uses = (0, forget_ms);
        }
        uses.0 = uses.0.saturating_add(1);
        uses.1 = forget_ms;
        let count = uses.0;
        if count > limit {
            Counted::Exhausted
        } else if count == limit {
            self.leave(now, id);
            Counted::Last
        } else {
            Counted::Allowed
        }
    }

    fn admit_tick(&mut self, now: Now, limits: &Limits, known_epoch_us: Option<u64>) -> Tick {
        if known_epoch_us.is_some_and(|known| known != self.epoch_us) {
            self.notice_loss(now, limits);
        }
        let mut tick = Tick::idle(now.us, self.epoch_us);
        let window = now.ms / as_ms(limits.tick).max(1);
        if self.ticked_window == Some(window) {
            return tick;
        }
        self.ticked_window = Some(window);
        tick.ran = true;
        self.tombstones
            .forget_before(now.ms.saturating_sub(as_ms(limits.abandon_after)));
        self.clients.purge(now.ms);
        self.uses
            .retain(|_, &mut (_, forget_ms)| forget_ms > now.ms);
        self.invites
            .retain(|_, &mut (_, expires_s)| expires_s > now.ms / 1_000);
        self.purge_sessions(now);
        self.line.merge_unconfigured(limits);
        self.drop_ghosts(now, limits);
        let pending = std::mem::take(&mut self.pending);
        tick.abandoned = pending.abandoned;
        tick.no_shows = pending.no_shows;
        tick.unconfirmed_sessions = pending.unconfirmed_sessions;
        tick.unconfirmed_tickets = pending.unconfirmed_tickets;
        let slots = self.line.slots(limits);
        tick.lane_admitted = vec![0; slots.len()];
        if let Some(opens_at_us) = limits.opens_at_us {
            if !before_opening(now, limits) && self.opened_us != Some(opens_at_us) {
                // A route created (or wiped) after its opening held no
                // pre-queue: waiters restored at their scores keep them.
                let shuffled = if self.epoch_us < opens_at_us {
                    self.line.shuffle_before(opens_at_us, &slots)
                } else {
                    0
                };
                self.opened_us = Some(opens_at_us);
                tick.opened = Some(shuffled);
            }
        }
        if !self.held(now) && !before_opening(now, limits) {
            let free = limits.capacity.saturating_sub(self.sessions.len());
            let admit = free.min(self.budget_left(now, limits));
            let arrival_end = now.ms.saturating_add(as_ms(limits.arrival_grace));
            while (tick.admitted_scores.len() as u64) < admit {
                let Some(slot) = self.line.pick(&slots, limits) else {
                    break;
                };
                let Some((score_us, id)) = self.line.pop_head(slot) else {
                    break;
                };
                self.line.lanes[slot].admitted += 1;
                let lane = slots.iter().position(|&s| s == slot).unwrap_or(0);
                tick.lane_admitted[lane] += 1;
                self.sessions.start(id, arrival_end, SessionKind::Arriving);
                tick.admitted_scores.push(score_us);
                tick.admitted_lanes.push(lane);
            }
            self.count_admitted(now, tick.admitted_scores.len() as u64);
        }
        tick.lane_waiting = self.line.lane_lens(limits);
        tick.lane_heads = slots
            .iter()
            .map(|&slot| self.line.lanes[slot].order.first().map(|&(score, _)| score))
            .collect();
        tick
    }

    fn stats(&mut self, now: Now, limits: &Limits) -> RouteStats {
        self.purge_sessions(now);
        let lanes = limits
            .lanes
            .iter()
            .map(|lane| {
                self.line
                    .lanes
                    .iter()
                    .find(|l| l.name == lane.name)
                    .map_or_else(LaneStats::default, |l| LaneStats {
                        waiting: l.order.len() as u64,
                        admitted_total: l.admitted,
                    })
            })
            .collect();
        RouteStats {
            lanes,
            waiting: self.line.len(limits),
            active: self.sessions.len(),
            admitted_total: self.admitted_total,
            admit_rate: self.rate.per_second(now.us),
            epoch_us: self.epoch_us,
            hold_until_us: if self.held(now) {
                self.hold_until_us
            } else {
                0
            },
            now_us: now.us,
        }
    }
}

/// The line: each lane's join scores in order, and last polls.
#[derive(Default)]
struct Line {
    /// The lanes the route has used, by slot; a lane keeps its slot (empty
    /// once merged away), so slots never move.
    lanes: Vec<LaneLine>,
    /// id → (join score, slot of its lane).
    scores: HashMap<VisitorId, (u64, usize)>,
    /// id → (last poll ms, confirmed). An unconfirmed ticket's time is set
    /// back so that the ghost rule drops it after `confirm_within`.
    seen: HashMap<VisitorId, (u64, bool)>,
    /// (last poll ms, id), oldest first.
    seen_order: BTreeSet<(u64, VisitorId)>,
}

/// One lane of the line, and its state in the weighted round robin (the
/// `wrr:NAME` and `admitted:NAME` fields of Redis).
struct LaneLine {
    name: String,
    order: RankedSet<(u64, VisitorId)>,
    current: i64,
    admitted: u64,
}

impl Line {
    /// The slot of lane `name`, made when the route never used it.
    fn slot(&mut self, name: &str) -> usize {
        if let Some(slot) = self.lanes.iter().position(|l| l.name == name) {
            return slot;
        }
        self.lanes.push(LaneLine {
            name: name.to_owned(),
            order: RankedSet::default(),
            current: 0,
            admitted: 0,
        });
        self.lanes.len() - 1
    }

    /// The slots of `limits`' lanes, in their order.
    fn slots(&mut self, limits: &Limits) -> Vec<usize> {
        limits.lanes.iter().map(|l| self.slot(&l.name)).collect()
    }

    /// The slot of the lane `index` names in `limits` (out of range: the first).
    fn slot_of(&mut self, limits: &Limits, index: usize) -> usize {
        self.slot(&limits.lanes.get(index).name)
    }

    /// Waiters in `limits`' lanes.
    fn len(&self, limits: &Limits) -> u64 {
        self.lanes
            .iter()
            .filter(|l| limits.lanes.index_of(&l.name).is_some())
            .map(|l| l.order.len() as u64)
            .sum()
    }

    /// Waiters in each of `limits`' lanes, in their order.
    fn lane_lens(&self, limits: &Limits) -> Vec<u64> {
        limits
            .lanes
            .iter()
            .map(|lane| {
                self.lanes
                    .iter()
                    .find(|l| l.name == lane.name)
                    .map_or(0, |l| l.order.len() as u64)
            })
            .collect()
    }

    fn contains(&self, id: &VisitorId) -> bool {
        self.scores.contains_key(id)
    }

    fn is_confirmed(&self, id: &VisitorId) -> bool {
        self.seen.get(id).is_some_and(|&(_, confirmed)| confirmed)
    }

    /// The place of a waiter whose join score is `score_us`, in `slot`.
    fn place_at(&self, id: VisitorId, score_us: u64, slot: usize, limits: &Limits) -> Place {
        let lane = &self.lanes[slot];
        Place {
            score_us,
            position: lane.order.count_below(&(score_us, id)) as u64 + 1,
            waiting_total: lane.order.len() as u64,
            lane: limits.lanes.index_of(&lane.name).unwrap_or(0),
        }
    }

    /// The place of `id`, without counting it as a poll.
    fn place_of(&self, id: &VisitorId, limits: &Limits) -> Option<Place> {
        let &(score_us, slot) = self.scores.get(id)?;
        Some(self.place_at(*id, score_us, slot, limits))
    }

    /// Puts `id` in lane `slot` at `score_us` (moving it there if already in
    /// line), last seen at `seen_ms`.
    fn join(
        &mut self,
        id: VisitorId,
        score_us: u64,
        slot: usize,
        seen_ms: u64,
        confirmed: bool,
        limits: &Limits,
    ) -> Place {
        self.put(id, score_us, slot, seen_ms, confirmed);
        self.place_at(id, score_us, slot, limits)
    }

    /// [`Line::join`] without answering the place.
    fn put(&mut self, id: VisitorId, score_us: u64, slot: usize, seen_ms: u64, confirmed: bool) {
        self.remove(&id);
        self.lanes[slot].order.insert((score_us, id));
        self.scores.insert(id, (score_us, slot));
        self.see(id, seen_ms, confirmed);
    }

    /// Moves waiter `id` to lane `slot` at its score; false if not in line.
    fn move_to(&mut self, id: &VisitorId, slot: usize) -> bool {
        let Some(entry) = self.scores.get_mut(id) else {
            return false;
        };
        let (score_us, from) = *entry;
        entry.1 = slot;
        self.lanes[from].order.remove(&(score_us, *id));
        self.lanes[slot].order.insert((score_us, *id));
        true
    }

    /// Records a poll (confirming the ticket) and answers the place; `None`
    /// if `id` is not in line.
    fn heartbeat(&mut self, id: &VisitorId, now_ms: u64, limits: &Limits) -> Option<Place> {
        let place = self.place_of(id, limits)?;
        self.see(*id, now_ms, true);
        Some(place)
    }

    fn see(&mut self, id: VisitorId, seen_ms: u64, confirmed: bool) {
        if let Some((before, _)) = self.seen.insert(id, (seen_ms, confirmed)) {
            self.seen_order.remove(&(before, id));
        }
        self.seen_order.insert((seen_ms, id));
    }

    fn remove(&mut self, id: &VisitorId) {
        if let Some((score_us, slot)) = self.scores.remove(id) {
            self.lanes[slot].order.remove(&(score_us, *id));
            self.forget_seen(id);
        }
    }

    fn pop_head(&mut self, slot: usize) -> Option<(u64, VisitorId)> {
        let (score_us, id) = self.lanes[slot].order.pop_first()?;
        self.scores.remove(&id);
        self.forget_seen(&id);
        Some((score_us, id))
    }

    fn forget_seen(&mut self, id: &VisitorId) {
        if let Some((seen, _)) = self.seen.remove(id) {
            self.seen_order.remove(&(seen, *id));
        }
    }

    /// Moves the waiters of every lane `limits` no longer names into its
    /// first lane at their scores, and forgets those lanes' round-robin state.
    fn merge_unconfigured(&mut self, limits: &Limits) {
        let first = self.slot_of(limits, 0);
        for slot in 0..self.lanes.len() {
            if limits.lanes.index_of(&self.lanes[slot].name).is_some() {
                continue;
            }
            while let Some((score_us, id)) = self.lanes[slot].order.pop_first() {
                self.lanes[first].order.insert((score_us, id));
                self.scores.insert(id, (score_us, first));
            }
            self.lanes[slot].current = 0;
            self.lanes[slot].admitted = 0;
        }
    }

    /// The lane the next admission comes from, among `limits`' lanes with
    /// waiters (`slots` their slots): smooth weighted round robin, each
    /// eligible lane's `current` grows by its weight, the largest is picked
    /// (the first on a tie) and loses the eligible weights' sum. `None` when
    /// every lane is empty.
    fn pick(&mut self, slots: &[usize], limits: &Limits) -> Option<usize> {
        let mut total = 0;
        let mut best: Option<usize> = None;
        for (lane, &slot) in limits.lanes.iter().zip(slots) {
            if self.lanes[slot].order.is_empty() {
                continue;
            }
            let weight = i64::from(lane.weight);
            total += weight;
            self.lanes[slot].current += weight;
            if best.is_none_or(|b| self.lanes[slot].current > self.lanes[b].current) {
                best = Some(slot);
            }
        }
        let best = best?;
        self.lanes[best].current -= total;
        Some(best)
    }

    /// The opening (DESIGN §8.7): every waiter of the lanes in `slots`
    /// whose score is before `opens_at_us` gets a new one just before it,
    /// in an order drawn from a CSPRNG seeded by the OS's, one block per
    /// lane in the lanes' order, so later arrivals stay behind them.
    /// Returns how many.
    fn shuffle_before(&mut self, opens_at_us: u64, slots: &[usize]) -> u64 {
        use rand::seq::SliceRandom as _;
        use rand::SeedableRng as _;
        let mut early: Vec<Vec<VisitorId>> = Vec::with_capacity(slots.len());
        for &slot in slots {
            let order = &mut self.lanes[slot].order;
            let mut ids = Vec::new();
            while order.first().is_some_and(|&(score, _)| score < opens_at_us) {
                if let Some((_, id)) = order.pop_first() {
                    ids.push(id);
                }
            }
            early.push(ids);
        }
        let total: usize = early.iter().map(Vec::len).sum();
        let mut score = opens_at_us.saturating_sub(total as u64);
        let mut rng = rand::rngs::StdRng::from_seed(super::shuffle_seed());
        for (ids, &slot) in early.iter_mut().zip(slots) {
            ids.shuffle(&mut rng);
            for &id in ids.iter() {
                self.lanes[slot].order.insert((score, id));
                self.scores.insert(id, (score, slot));
                score += 1;
            }
        }
        total as u64
    }

    /// Drops waiters whose last poll is before `cutoff_ms`; returns how many
    /// were confirmed (ghosts) and how many never polled.
    fn drop_silent_before(&mut self, cutoff_ms: u64) -> (u64, u64) {
        let (mut ghosts, mut unconfirmed) = (0, 0);
        while let Some(&(seen, id)) = self.seen_order.first() {
            if seen >= cutoff_ms {
                break;
            }
            if self.is_confirmed(&id) {
                ghosts += 1;
            } else {
                unconfirmed += 1;
            }
            self.remove(&id);
        }
        (ghosts, unconfirmed)
    }
}

/// Admitted sessions and admitted waiters still arriving.
#[derive(Default)]
struct Sessions {
    by_id: HashMap<VisitorId, Session>,
    /// (expiry ms, id), soonest first.
    expiries: BTreeSet<(u64, VisitorId)>,
}

struct Session {
    expiry_ms: u64,
    kind: SessionKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SessionKind {
    /// Admitted from the line and not yet shown up: expiring makes it a no-show.
    Arriving,
    /// Admitted at once and not yet renewed: it lives `confirm_within`.
    Unconfirmed,
    /// Shown up or renewed: it lives `session_ttl` past the last contact.
    Live,
}

impl Sessions {
    /// Active sessions; exact once `purge` ran at the current time.
    fn len(&self) -> u64 {
        self.by_id.len() as u64
    }

    fn is_active(&self, id: &VisitorId, now_ms: u64) -> bool {
        self.kind_if_active(id, now_ms).is_some()
    }

    fn kind_if_active(&self, id: &VisitorId, now_ms: u64) -> Option<SessionKind> {
        self.by_id
            .get(id)
            .filter(|s| s.expiry_ms > now_ms)
            .map(|s| s.kind)
    }

    /// Removes sessions whose expiry is not after `now_ms`; returns them with
    /// their expiry and kind.
    fn purge(&mut self, now_ms: u64) -> Vec<(u64, VisitorId, SessionKind)> {
        let mut expired = Vec::new();
        while let Some(&(expiry_ms, id)) = self.expiries.first() {
            if expiry_ms > now_ms {
                break;
            }
            self.expiries.pop_first();
            if let Some(session) = self.by_id.remove(&id) {
                expired.push((expiry_ms, id, session.kind));
            }
        }
        expired
    }

    /// Starts (or restarts) `id`'s session, ending at `expiry_ms`.
    fn start(&mut self, id: VisitorId, expiry_ms: u64, kind: SessionKind) {
        self.remove(&id);
        self.by_id.insert(id, Session { expiry_ms, kind });
        self.expiries.insert((expiry_ms, id));
    }

    fn remove(&mut self, id: &VisitorId) {
        if let Some(session) = self.by_id.remove(id) {
            self.expiries.remove(&(session.expiry_ms, *id));
        }
    }
}

/// Tombstones of visitors who left and of admitted waiters that never showed
/// up: a poll with such a ticket answers `Gone` (and a renewal with such a
/// pass `false`) instead of restoring it as a lost write. Kept until
/// `abandon_after` past the time buried (the leave, or the expiry of the
/// arrival grace), when the lost-write rule no longer applies to any ticket
/// they could meet.
#[derive(Default)]
struct Tombstones {
    by_id: HashMap<VisitorId, u64>,
    /// (time buried ms, id), oldest first.
    by_time: BTreeSet<(u64, VisitorId)>,
}

impl Tombstones {
    /// Records a tombstone; one already there stays (as `ZADD NX` in Redis).
    fn bury(&mut self, id: VisitorId, at_ms: u64) {
        if self.contains(&id) {
            return;
        }
        self.by_id.insert(id, at_ms);
        self.by_time.insert((at_ms, id));
    }

    fn contains(&self, id: &VisitorId) -> bool {
        self.by_id.contains_key(id)
    }

    fn forget(&mut self, id: &VisitorId) {
        if let Some(at_ms) = self.by_id.remove(id) {
            self.by_time.remove(&(at_ms, *id));
        }
    }

    /// Up to `most` ids buried at or after `since_ms`, the most recent
    /// first.
    fn since(&self, since_ms: u64, most: usize) -> Vec<StoreId> {
        self.by_time
            .range((since_ms, [0; 16])..)
            .rev()
            .take(most)
            .map(|(_, id)| store_id(id))
            .collect()
    }

    fn forget_before(&mut self, cutoff_ms: u64) {
        while let Some(&(at_ms, id)) = self.by_time.first() {
            if at_ms >= cutoff_ms {
                break;
            }
            self.by_time.pop_first();
            self.by_id.remove(&id);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_id.len()
    }
}

/// Per-client limits: for each client key, the visitors it brought in (joined
/// or admitted at once) with the time, kept while they may still hold a place
/// or fall in the join window. Places are counted from the line and the
/// active set themselves (an id still in either), never kept as a counter, so
/// the count cannot drift when a place is given up.
#[derive(Default)]
struct Clients {
    by_key: HashMap<Vec<u8>, Client>,
    /// (forget at ms, key), soonest first.
    expiries: BTreeSet<(u64, Vec<u8>)>,
}

struct Client {
    /// (joined ms, id), oldest first.
    joins: Vec<(u64, VisitorId)>,
    /// Forgotten at this time unless touched again.
    forget_at_ms: u64,
}

impl Clients {
    /// Why `client` may not bring in one more visitor now, as the time to
    /// wait; `None` if it may. `holds(id)` tells whether an id still holds a
    /// place. Forgets the client's visitors that matter no more.
    fn refusal(
        &mut self,
        client: ClientKey<'_>,
        now_ms: u64,
        limits: &Limits,
        holds: impl Fn(&VisitorId) -> bool,
    ) -> Option<Duration> {
        if !limits.limits_client(client) {
            return None;
        }
        let entry = self.by_key.get_mut(client)?;
        if entry.forget_at_ms <= now_ms {
            self.remove(client);
            return None;
        }
        let window_start = now_ms.saturating_sub(as_ms(JOIN_WINDOW));
        let in_window = |joined: u64| limits.client_joins_per_minute > 0 && joined > window_start;
        let mut places = 0;
        entry.joins.retain(|&(joined, id)| {
            let holding = limits.client_places > 0 && holds(&id);
            places += u64::from(holding);
            holding || in_window(joined)
        });
        let mut wait = None;
        if limits.client_places > 0 && places >= limits.client_places {
            wait = Some(limits.unconfirmed_ticket());
        }
        let mut recent = entry.joins.iter().filter(|&&(joined, _)| in_window(joined));
        let joins = recent.clone().count() as u64;
        if limits.client_joins_per_minute > 0 && joins >= limits.client_joins_per_minute {
            let oldest = recent.next().map_or(now_ms, |&(joined, _)| joined);
            let room_at = oldest.saturating_add(as_ms(JOIN_WINDOW));
            let until = Duration::from_millis(room_at.saturating_sub(now_ms));
            wait = Some(wait.map_or(until, |w: Duration| w.max(until)));
        }
        wait.map(|w| w.max(Duration::from_millis(1)))
    }

    /// `client` brought `id` in (joined or admitted) at `now_ms`.
    fn record(&mut self, client: ClientKey<'_>, id: VisitorId, now_ms: u64, limits: &Limits) {
        if !limits.limits_client(client) {
            return;
        }
        let forget_at_ms = now_ms.saturating_add(as_ms(limits.client_memory()));
        let entry = self
            .by_key
            .entry(client.to_vec())
            .or_insert_with(|| Client {
                joins: Vec::new(),
                forget_at_ms,
            });
        entry.joins.push((now_ms, id));
        let before = std::mem::replace(&mut entry.forget_at_ms, forget_at_ms);
        self.expiries.remove(&(before, client.to_vec()));
        self.expiries.insert((forget_at_ms, client.to_vec()));
    }

    /// `id`, one of `client`'s visitors, is still holding its place at
    /// `now_ms`: the client is remembered `client_memory` from now.
    fn touch(&mut self, client: ClientKey<'_>, id: &VisitorId, now_ms: u64, limits: &Limits) {
        if client.is_empty() || limits.client_places == 0 {
            return;
        }
        let Some(entry) = self.by_key.get_mut(client) else {
            return;
        };
        if !entry.joins.iter().any(|(_, held)| held == id) {
            return;
        }
        let forget_at_ms = now_ms.saturating_add(as_ms(limits.client_memory()));
        if forget_at_ms > entry.forget_at_ms {
            let before = std::mem::replace(&mut entry.forget_at_ms, forget_at_ms);
            self.expiries.remove(&(before, client.to_vec()));
            self.expiries.insert((forget_at_ms, client.to_vec()));
        }
    }

    fn remove(&mut self, client: ClientKey<'_>) {
        if let Some(entry) = self.by_key.remove(client) {
            self.expiries.remove(&(entry.forget_at_ms, client.to_vec()));
        }
    }

    /// Forgets clients not touched within their memory.
    fn purge(&mut self, now_ms: u64) {
        while let Some((forget_at_ms, _)) = self.expiries.first() {
            if *forget_at_ms > now_ms {
                break;
            }
            if let Some((_, key)) = self.expiries.pop_first() {
                self.by_key.remove(&key);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_key.len()
    }
}

/// Admissions per second, exponentially weighted (see the module docs).
struct AdmitRate {
    count: f64,
    elapsed_s: f64,
    at_us: u64,
    last_admit_us: Option<u64>,
}

impl AdmitRate {
    fn new(epoch_us: u64) -> AdmitRate {
        AdmitRate {
            count: 0.0,
            elapsed_s: 0.0,
            at_us: epoch_us,
            last_admit_us: None,
        }
    }

    /// (count, elapsed) decayed to `now_us`.
    fn decayed(&self, now_us: u64) -> (f64, f64) {
        let dt_s = now_us.saturating_sub(self.at_us) as f64 / 1e6;
        let w = (-dt_s / RATE_TAU_S).exp();
        (self.count * w, self.elapsed_s * w + RATE_TAU_S * (1.0 - w))
    }

    fn record(&mut self, now_us: u64, admitted: u64) {
        if admitted == 0 {
            return;
        }
        let (count, elapsed_s) = self.decayed(now_us);
        self.count = count + admitted as f64;
        self.elapsed_s = elapsed_s;
        self.at_us = self.at_us.max(now_us);
        self.last_admit_us = Some(now_us);
    }

    fn per_second(&self, now_us: u64) -> f64 {
        match self.last_admit_us {
            Some(last) if now_us.saturating_sub(last) <= RATE_QUIET_US => {
                let (count, elapsed_s) = self.decayed(now_us);
                count / elapsed_s.max(1.0)
            }
            _ => 0.0,
        }
    }
}

impl QueueStore for MemoryStore {
    async fn arrive(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        limits: &Limits,
        admit_now: bool,
        known_epoch_us: Option<u64>,
        lane: usize,
    ) -> Result<Arrival, StoreError> {
        Ok(self.with_route(route, |r, now| {
            r.arrive(now, id, client, limits, admit_now, known_epoch_us, lane)
        }))
    }

    async fn arrive_batch(
        &self,
        route: &str,
        arrivals: &[Arriving],
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Vec<Arrival>, StoreError> {
        Ok(self.with_route(route, |r, now| {
            arrivals
                .iter()
                .map(|a| {
                    r.arrive(
                        now,
                        &a.id,
                        &a.client,
                        limits,
                        a.admit_now,
                        known_epoch_us,
                        a.lane,
                    )
                })
                .collect()
        }))
    }

    async fn poll(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        ticket: TicketTimes,
        limits: &Limits,
    ) -> Result<Poll, StoreError> {
        Ok(self.with_route(route, |r, now| r.poll(now, id, client, ticket, limits)))
    }

    async fn renew(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        pass: PassTimes,
        limits: &Limits,
    ) -> Result<bool, StoreError> {
        Ok(self.with_route(route, |r, now| r.renew(now, id, client, pass, limits)))
    }

    async fn leave(&self, route: &str, id: &VisitorId, _limits: &Limits) -> Result<(), StoreError> {
        self.with_route(route, |r, now| r.leave(now, id));
        Ok(())
    }

    async fn count_request(
        &self,
        route: &str,
        id: &VisitorId,
        limit: u64,
        limits: &Limits,
    ) -> Result<Counted, StoreError> {
        Ok(self.with_route(route, |r, now| r.count_request(now, id, limit, limits)))
    }

    async fn hold(&self, route: &str, limits: &Limits) -> Result<(), StoreError> {
        self.with_route(route, |r, now| r.hold(now, limits));
        Ok(())
    }

    async fn admit_tick(
        &self,
        route: &str,
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Tick, StoreError> {
        Ok(self.with_route(route, |r, now| r.admit_tick(now, limits, known_epoch_us)))
    }

    async fn heartbeats(
        &self,
        route: &str,
        beats: &[Heartbeat],
        limits: &Limits,
    ) -> Result<Vec<bool>, StoreError> {
        Ok(self.with_route(route, |r, now| r.heartbeats(now, beats, limits)))
    }

    async fn ended_since(
        &self,
        route: &str,
        since_ms: u64,
        _limits: &Limits,
    ) -> Result<Ended, StoreError> {
        Ok(self.with_route(route, |r, now| Ended {
            ids: r.tombstones.since(since_ms, ENDED_MOST),
            now_ms: now.ms,
        }))
    }

    async fn move_lane(
        &self,
        route: &str,
        id: &VisitorId,
        to_lane: usize,
        limits: &Limits,
    ) -> Result<bool, StoreError> {
        Ok(self.with_route(route, |r, now| r.move_lane(now, id, to_lane, limits)))
    }

    async fn take_use(
        &self,
        route: &str,
        token_key: &[u8],
        max_uses: u32,
        expires_unix: u64,
    ) -> Result<InviteUse, StoreError> {
        Ok(self.with_route(route, |r, now| {
            r.take_use(now, token_key, max_uses, expires_unix)
        }))
    }

    async fn line_record(
        &self,
        route: &str,
        limits: &Limits,
    ) -> Result<Option<LineRecord>, StoreError> {
        Ok(self.with_route(route, |r, _| r.line_record(limits)))
    }

    async fn override_of(&self, route: &str) -> Result<Option<Override>, StoreError> {
        Ok(self.with_route(route, |r, _| r.overridden.clone()))
    }

    async fn set_override(&self, route: &str, value: Option<&Override>) -> Result<(), StoreError> {
        self.with_route(route, |r, _| r.overridden = value.cloned());
        Ok(())
    }

    async fn stats(&self, route: &str, limits: &Limits) -> Result<RouteStats, StoreError> {
        Ok(self.with_route(route, |r, now| r.stats(now, limits)))
    }

    async fn ready(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn report_health(
        &self,
        route: &str,
        counts: &WindowCounts,
        every: Duration,
    ) -> Result<HealthLook, StoreError> {
        let now_ms = self.inner.clock.now_us() / 1000;
        Ok(self.inner.health.report(route, counts, every, now_ms))
    }

    async fn take_health_lease(
        &self,
        route: &str,
        every: Duration,
    ) -> Result<Option<u64>, StoreError> {
        let now_ms = self.inner.clock.now_us() / 1000;
        Ok(self.inner.health.take_lease(route, every, now_ms))
    }

    async fn set_capacity(
        &self,
        route: &str,
        lease: u64,
        capacity: u64,
        why: &str,
    ) -> Result<bool, StoreError> {
        Ok(self.inner.health.set_capacity(route, lease, capacity, why))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Lanes;

    fn limits() -> Limits {
        Limits {
            capacity: 10,
            max_admit_per_tick: 10,
            tick: Duration::from_millis(100),
            session_ttl: Duration::from_secs(60),
            pass_ttl: Duration::from_secs(10),
            arrival_grace: Duration::from_secs(60),
            abandon_after: Duration::from_secs(600),
            max_waiting: 1_000,
            confirm_within: Duration::from_secs(60),
            client_places: 0,
            client_joins_per_minute: 0,
            lanes: Lanes::default(),
            opens_at_us: None,
            shards: 1,
        }
    }

    /// A ticket polled since it was issued.
    fn seen(score_us: u64, seen_us: u64) -> TicketTimes {
        TicketTimes {
            score_us,
            seen_us,
            lane: 0,
        }
    }

    fn visitor(n: u32) -> VisitorId {
        let mut id = [0; 16];
        id[..4].copy_from_slice(&n.to_be_bytes());
        id
    }

    fn store() -> MemoryStore {
        MemoryStore::new(Clock::starting_at(Duration::from_secs(1_700_000_000)))
    }

    #[tokio::test(start_paused = true)]
    async fn the_local_line_takes_in_a_live_ticket_of_any_age() {
        let clock = Clock::starting_at(Duration::from_secs(1_700_000_000));
        let l = Limits {
            abandon_after: Duration::from_secs(30),
            ..limits()
        };
        let primary = MemoryStore::new(clock);
        let fallback = MemoryStore::fallback(clock);
        // Both routes exist before the tickets were issued.
        primary.stats("r", &l).await.unwrap();
        fallback.stats("r", &l).await.unwrap();
        let issued_us = clock.now_us();
        tokio::time::advance(Duration::from_secs(600)).await;
        // A ticket from the shared store: joined ten minutes ago, last seen
        // a second ago.
        let old = seen(issued_us, clock.now_us() - 1_000_000);
        assert_eq!(
            primary.poll("r", &visitor(1), &[], old, &l).await.unwrap(),
            Poll::Gone,
            "the store itself restores only young tickets without a loss"
        );
        let Poll::Waiting(place) = fallback.poll("r", &visitor(1), &[], old, &l).await.unwrap()
        else {
            panic!("the local line keeps a waiter's place");
        };
        assert_eq!((place.score_us, place.position), (issued_us, 1));
        assert_eq!(fallback.stats("r", &l).await.unwrap().hold_until_us, 0);
        // Silent for abandon_after, or never polled past confirm_within:
        // not taken in.
        let silent = seen(issued_us, clock.now_us() - 31_000_000);
        let never = seen(issued_us, issued_us);
        for ticket in [silent, never] {
            assert_eq!(
                fallback
                    .poll("r", &visitor(2), &[], ticket, &l)
                    .await
                    .unwrap(),
                Poll::Gone
            );
        }
        // Never polled but younger than the store keeps such a ticket: its
        // holder's first poll came after the store stopped answering.
        let just_issued_us = clock.now_us() - 2_000_000;
        let fresh = seen(just_issued_us, just_issued_us);
        let Poll::Waiting(place) = fallback
            .poll("r", &visitor(4), &[], fresh, &l)
            .await
            .unwrap()
        else {
            panic!("the local line keeps a fresh ticket's place");
        };
        assert_eq!((place.score_us, place.position), (just_issued_us, 2));
        // A pass the shared store granted is not counted by the local line.
        let pass = PassTimes {
            issued_ms: clock.now_us() / 1_000,
            confirmed: true,
            granted_locally: true,
        };
        assert!(!fallback
            .renew("r", &visitor(3), &[], pass, &l)
            .await
            .unwrap());
        assert_eq!(fallback.stats("r", &l).await.unwrap().active, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn young_route_reports_admissions_over_its_age() {
        let store = store();
        let limits = limits();
        for n in 0..10 {
            store
                .arrive("r", &visitor(n), &[], &limits, true, None, 0)
                .await
                .unwrap();
        }
        tokio::time::advance(Duration::from_secs(5)).await;
        let rate = store.stats("r", &limits).await.unwrap().admit_rate;
        // 10 admissions over 5 s of a 60 s time constant: close to 2/s.
        assert!((1.8..2.2).contains(&rate), "rate {rate}");
    }

    #[tokio::test(start_paused = true)]
    async fn old_route_reports_a_recent_average() {
        let store = store();
        let limits = limits();
        // One admission per second for ten minutes, then five per second.
        let mut n = 0;
        for per_second in [1, 5] {
            for _ in 0..600 {
                for _ in 0..per_second {
                    store
                        .arrive("r", &visitor(n), &[], &limits, true, None, 0)
                        .await
                        .unwrap();
                    store.leave("r", &visitor(n), &limits).await.unwrap();
                    n += 1;
                }
                tokio::time::advance(Duration::from_secs(1)).await;
            }
        }
        let rate = store.stats("r", &limits).await.unwrap().admit_rate;
        assert!((4.8..5.2).contains(&rate), "rate {rate}");
    }

    #[tokio::test(start_paused = true)]
    async fn admit_rate_is_zero_when_nothing_was_admitted_recently() {
        let store = store();
        let limits = limits();
        assert_eq!(store.stats("r", &limits).await.unwrap().admit_rate, 0.0);
        store
            .arrive("r", &visitor(1), &[], &limits, true, None, 0)
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(store.stats("r", &limits).await.unwrap().admit_rate > 0.0);
        tokio::time::advance(Duration::from_secs(301)).await;
        assert_eq!(store.stats("r", &limits).await.unwrap().admit_rate, 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn no_show_purged_outside_a_tick_is_reported_by_the_next_tick() {
        let store = store();
        let limits = Limits {
            arrival_grace: Duration::from_secs(1),
            ..limits()
        };
        store
            .arrive("r", &visitor(1), &[], &limits, false, None, 0)
            .await
            .unwrap();
        let tick = store.admit_tick("r", &limits, None).await.unwrap();
        assert_eq!(tick.admitted_scores.len(), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        // Stats purges the expired arrival; the count must not be lost.
        assert_eq!(store.stats("r", &limits).await.unwrap().active, 0);
        let tick = store.admit_tick("r", &limits, None).await.unwrap();
        assert_eq!(tick.no_shows, 1);
        tokio::time::advance(limits.tick).await;
        let tick = store.admit_tick("r", &limits, None).await.unwrap();
        assert_eq!(tick.no_shows, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn no_show_tombstones_are_forgotten_after_abandon_after() {
        let store = store();
        let limits = Limits {
            arrival_grace: Duration::from_secs(1),
            abandon_after: Duration::from_secs(30),
            ..limits()
        };
        let mut tickets = Vec::new();
        for n in 0..3 {
            let Arrival::Waiting(place) = store
                .arrive("r", &visitor(n), &[], &limits, false, None, 0)
                .await
                .unwrap()
            else {
                panic!("visitor {n} should wait");
            };
            tickets.push(place.score_us);
        }
        let tick = store.admit_tick("r", &limits, None).await.unwrap();
        assert_eq!(tick.admitted_scores, tickets);
        tokio::time::advance(Duration::from_secs(2)).await;
        let tick = store.admit_tick("r", &limits, None).await.unwrap();
        assert_eq!(tick.no_shows, 3);
        let tombstones = |store: &MemoryStore| store.route("r").lock().unwrap().tombstones.len();
        assert_eq!(tombstones(&store), 3);
        // Visitor 0 joins again: its tombstone goes with the new ticket.
        store
            .arrive("r", &visitor(0), &[], &limits, false, None, 0)
            .await
            .unwrap();
        assert_eq!(tombstones(&store), 2);
        assert_eq!(
            store
                .poll(
                    "r",
                    &visitor(1),
                    &[],
                    seen(tickets[1], tickets[1] + 1),
                    &limits
                )
                .await
                .unwrap(),
            Poll::Gone
        );
        // 30 s past the expiry the rest are forgotten by the next tick.
        tokio::time::advance(Duration::from_secs(30)).await;
        store.admit_tick("r", &limits, None).await.unwrap();
        assert_eq!(tombstones(&store), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_first_notice_of_a_loss_starts_a_hold() {
        let store = store();
        let limits = limits();
        let tick = store.admit_tick("r", &limits, None).await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        // A ticket older than the epoch comes back: the store was lost.
        store
            .poll(
                "r",
                &visitor(1),
                &[],
                seen(tick.epoch_us - 1, tick.now_us),
                &limits,
            )
            .await
            .unwrap();
        let hold = store.stats("r", &limits).await.unwrap().hold_until_us;
        assert!(hold > 0);
        tokio::time::advance(Duration::from_secs(5)).await;
        store.leave("r", &visitor(1), &limits).await.unwrap();
        store
            .poll(
                "r",
                &visitor(1),
                &[],
                seen(tick.epoch_us - 1, tick.now_us),
                &limits,
            )
            .await
            .unwrap();
        store
            .admit_tick("r", &limits, Some(tick.epoch_us + 1))
            .await
            .unwrap();
        assert_eq!(store.stats("r", &limits).await.unwrap().hold_until_us, hold);
    }

    #[tokio::test(start_paused = true)]
    async fn join_window_slides_and_idle_clients_are_forgotten() {
        let store = store();
        let limits = Limits {
            client_places: 0,
            client_joins_per_minute: 2,
            ..limits()
        };
        let client: &[u8] = &[198, 51, 100, 9];
        let arrive = |n| {
            let id = visitor(n);
            let (store, limits) = (&store, &limits);
            async move {
                store
                    .arrive("r", &id, client, limits, false, None, 0)
                    .await
                    .unwrap()
            }
        };
        assert!(matches!(arrive(1).await, Arrival::Waiting(_)));
        tokio::time::advance(Duration::from_secs(20)).await;
        assert!(matches!(arrive(2).await, Arrival::Waiting(_)));
        let Arrival::TooMany { retry_after } = arrive(3).await else {
            panic!("a third join within a minute is too many");
        };
        // The first join leaves the window 60 s after it was made.
        assert_eq!(retry_after, Duration::from_secs(40));
        tokio::time::advance(retry_after).await;
        assert!(matches!(arrive(3).await, Arrival::Waiting(_)));
        let clients = |store: &MemoryStore| store.route("r").lock().unwrap().clients.len();
        assert_eq!(clients(&store), 1);
        tokio::time::advance(limits.client_memory()).await;
        store.admit_tick("r", &limits, None).await.unwrap();
        assert_eq!(clients(&store), 0, "an idle client is forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_holding_places_is_remembered_while_it_polls() {
        let store = store();
        let limits = Limits {
            capacity: 0,
            client_places: 1,
            client_joins_per_minute: 0,
            abandon_after: Duration::from_secs(600),
            ..limits()
        };
        let client: &[u8] = &[198, 51, 100, 9];
        let Arrival::Waiting(place) = store
            .arrive("r", &visitor(1), client, &limits, false, None, 0)
            .await
            .unwrap()
        else {
            panic!("visitor 1 should wait");
        };
        // Polling for longer than the client's memory keeps it remembered.
        let step = limits.abandon_after / 2;
        let ticket = TicketTimes::new(place.score_us);
        for i in 0..5 {
            if i > 0 {
                tokio::time::advance(step).await;
            }
            let polled = store
                .poll("r", &visitor(1), client, ticket, &limits)
                .await
                .unwrap();
            assert!(matches!(polled, Poll::Waiting(_)));
            store.admit_tick("r", &limits, None).await.unwrap();
        }
        assert!(step * 4 > limits.client_memory());
        assert!(matches!(
            store
                .arrive("r", &visitor(2), client, &limits, false, None, 0)
                .await
                .unwrap(),
            Arrival::TooMany { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_line_answers_places_in_order() {
        let store = store();
        let limits = Limits {
            max_waiting: 200_000,
            ..limits()
        };
        for n in 0..100_000 {
            store
                .arrive("r", &visitor(n), &[], &limits, false, None, 0)
                .await
                .unwrap();
        }
        for n in [0, 1, 49_999, 99_999] {
            let Poll::Waiting(place) = store
                .poll("r", &visitor(n), &[], TicketTimes::new(0), &limits)
                .await
                .unwrap()
            else {
                panic!("visitor {n} is not waiting");
            };
            assert_eq!(place.position, u64::from(n) + 1);
            assert_eq!(place.waiting_total, 100_000);
        }
    }
}
