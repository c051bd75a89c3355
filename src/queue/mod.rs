//! The line and the active set: the `QueueStore` trait, its types, and the
//! memory and Redis backends behind one `Store` handle.
//!
//! Every operation is per route and atomic. Times are store times: the memory
//! store reads its `Clock`, the Redis store reads Redis `TIME`, so instance
//! clocks never matter. Scores are microseconds since the Unix epoch; the
//! active set's expiries and the waiters' last polls are milliseconds.
//!
//! Semantics shared by every backend (checked by the store contract suite):
//!
//! - The active count is counted from expiry scores (`expiry > now`), never kept
//!   as a counter, so it cannot drift when visitors vanish.
//! - A waiter who has not polled for `abandon_after` is a ghost: it is dropped
//!   before anyone behind it is admitted and never takes a slot. (Elsewhere
//!   in a long line, Redis finds ghosts by a scan that covers the line about
//!   once per `abandon_after`, so totals may count a ghost that long again.)
//! - `heartbeats` are polls for many waiters in one call: each one still in
//!   line is treated as `poll` treats it; the rest are reported out of line.
//! - `arrive_batch` answers each arrival as its own `arrive` made right after
//!   the ones before it would be answered.
//! - After a tick has run in the epoch, `line_record` gives the join scores
//!   at the ranks [`record::sample_ranks`] names (see [`record`]), and
//!   `ended_since` the places ended (tombstones) since a store time.
//! - A waiter admitted by the admitter gets `arrival_grace` to show up (poll or
//!   request); showing up turns the slot into a session that lives
//!   `session_ttl` past the last store contact (arrival, renewal).
//! - A new admit-now session and a new ticket are unconfirmed until the
//!   visitor comes back: the session holds its slot `confirm_within` (not
//!   `session_ttl`) unless a renewal confirms it; the ticket leaves the line
//!   `confirm_within` after joining unless a poll confirms it. Ticks report
//!   both apart from ghosts and no-shows. An unconfirmed ticket is never
//!   restored after a wipe; an unconfirmed session is, within its
//!   `confirm_within` (see below).
//! - Per-client limits (a non-empty client key, a limit not 0): `places`
//!   counts the client's ids still in line (no ghost) or holding a live slot,
//!   counted from the line and the active set, never a counter, so it cannot
//!   drift; `joins_per_minute` counts the client's arrivals that joined or
//!   were admitted in the last 60 s. Beyond either, `arrive` answers `TooMany`
//!   and stores nothing. An id already in line or active is no new place.
//!   What the store keeps per client expires `client_memory` after a contact
//!   (an arrival, or a poll or renewal from the same client key).
//! - Each route has an epoch: the time its keys were created. An entry missing
//!   from the store is restored only if the store could have held it at the
//!   loss: a ticket confirmed, with no tombstone, whose holder was seen less
//!   than `abandon_after` ago, and older than the epoch (a wiped store) or
//!   younger than `abandon_after` (a write lost in a failover); a pass with
//!   no tombstone, issued before the epoch (strictly, in ms), whose session
//!   the store would still hold now: issued less than `session_ttl` ago
//!   when confirmed, less than `confirm_within` ago when not (the visitor
//!   admitted at once and still on its first page). The first notice of a loss
//!   (restoring such an entry, or an instance seeing the epoch it remembered
//!   change, on a tick or an arrival) starts a hold of one `pass_ttl` during which nobody new is
//!   admitted, so returning admitted visitors are counted first. Later
//!   notices in the same epoch do not extend the hold: otherwise one visitor
//!   leaving and coming back with an old ticket could stop the line for good.
//! - Every operation creates the route's state (and so its epoch) when missing.
//! - A route's override (DESIGN §9.4) is one value, replaced whole, kept
//!   apart from the line: a loss of the line's state leaves it alone where
//!   the store can (Redis keeps it in its own key).
//! - Expired sessions may be purged by any operation; the admitted waiters
//!   among them that never showed up are reported as `no_shows` by the next
//!   tick that runs, and ghosts dropped outside a tick as `abandoned`.
//! - A no-show and a visitor who left are not restored: once the arrival
//!   grace ran out, or after `leave`, a poll with the ticket answers `Gone`
//!   (and a renewal with the pass `false`) however young it is: the store
//!   keeps a tombstone for `abandon_after`, until the ticket is too old for
//!   the lost-write rule. The visitor joins again at the back.
//! - A session on a route with `max_requests_per_session` counts its
//!   forwarded requests (`count_request`): the call that reaches the limit
//!   ends the session as `leave` does (slot freed, tombstone), and every
//!   later call, or one for a session that left, answers `Exhausted`; an id
//!   with no live session and no tombstone counts nothing (`Gone`). The
//!   count is kept `session_ttl + pass_ttl` past its last request, as long
//!   as any pass of the session can come back.
//! - Admissions in one tick window (`floor(now / tick)`), by the admitter and
//!   by admit-now together, never exceed `max_admit_per_tick`.
//! - A route's line is made of lanes ([`Lanes`], DESIGN §8.5) sharing its
//!   capacity and active set: admission is FIFO by join score within a lane,
//!   and shared by weight between the lanes with waiters (smooth weighted
//!   round robin, its state kept in the store so the split holds across
//!   ticks and instances). Calls name lanes by index into the `Limits` they
//!   are given; an index out of range is the first lane. `max_waiting`
//!   counts every lane; a place's position is within its lane. A lane no
//!   longer in `Limits` is merged into the first lane at its waiters' scores
//!   by the next tick.
//! - A route with an opening (`Limits::opens_at_us`, DESIGN §8.7) admits
//!   nobody, at once or from the line, before it by store time; arrivals
//!   join the line as usual (the pre-queue). The first tick at or after the
//!   opening, on whichever instance, gives every waiter scored before it a
//!   new score just before it, in an order drawn from a CSPRNG seeded by the
//!   OS's, lane by lane; it runs once per opening (the store remembers the
//!   opening it ran for), and a route whose epoch began after the opening
//!   (a store wiped since) shuffles nobody.

pub mod breaker;
pub mod joins;
pub mod memory;
pub mod overrides;
pub mod record;
pub mod redis_store;
pub mod shards;

use std::future::Future;
use std::time::Duration;

pub use breaker::{Breaker, BreakerConfig, BreakerState, Guarded, Operation};
pub use memory::MemoryStore;
pub use overrides::{Held, Override};
pub use record::{LaneRecord, LineRecord};
pub use redis_store::RedisStore;

use crate::clock::Clock;
use crate::config::{Backend, StoreConfig};
pub use crate::health::WindowCounts;

/// A visitor's id: 128 random bits, decoded from the cookie. Never part of a key.
pub type VisitorId = [u8; 16];

/// The per-route numbers the store needs; taken from the live config on every
/// call, so a capacity change applies from the next tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Concurrent admitted sessions.
    pub capacity: u64,
    /// Admissions per tick window, admitter and admit-now together.
    pub max_admit_per_tick: u64,
    /// Length of a tick window.
    pub tick: Duration,
    /// Idle time before an admitted session's slot is freed.
    pub session_ttl: Duration,
    /// Lifetime of a pass; also the length of the hold after a store loss.
    pub pass_ttl: Duration,
    /// Time an admitted waiter has to show up.
    pub arrival_grace: Duration,
    /// A waiter silent this long loses the place.
    pub abandon_after: Duration,
    /// Line length beyond which nobody new is queued.
    pub max_waiting: u64,
    /// How long an unconfirmed admit-now session holds its slot (at most
    /// `session_ttl`) and an unconfirmed ticket its place (at most
    /// `abandon_after`) before the visitor comes back.
    pub confirm_within: Duration,
    /// Places (tickets in line plus active sessions) one client key may hold;
    /// 0 turns the limit off.
    pub client_places: u64,
    /// Arrivals that joined the line or were admitted, per client key over the
    /// last minute; 0 turns the limit off.
    pub client_joins_per_minute: u64,
    /// The route's lanes, the first where newcomers go; one lane `main` of
    /// weight 1 unless configured.
    pub lanes: Lanes,
    /// When the route opens (unix µs, compared with the store's clock):
    /// before it nobody is admitted, and the first tick at or after it
    /// shuffles the pre-queue (DESIGN §8.7). `None`: open.
    pub opens_at_us: Option<u64>,
    /// Sub-lines the Redis store splits the line and the capacity into, each
    /// under its own hash tag (see `shards`); 1: one line. The memory store
    /// keeps one line whatever it says: in one process a split buys nothing.
    pub shards: u32,
}

/// The name of the lane of a route without lanes configured; its waiters
/// keep the route's waiting key, so a line from before lanes keeps every
/// place.
pub use crate::config::defaults::LANE as MAIN_LANE;
pub use crate::config::{is_lane_name, Lane, Lanes, MAX_LANES, MAX_LANE_WEIGHT};

/// 32 bytes from the OS's CSPRNG: the key that orders a pre-queue at its
/// opening (DESIGN §8.7). Drawn by the instance that runs the opening and
/// never stored, so nobody can compute the order ahead. Should the OS
/// source fail, the thread's CSPRNG (seeded from it) stands in.
pub(crate) fn shuffle_seed() -> [u8; 32] {
    use rand::{RngCore as _, TryRngCore as _};
    let mut seed = [0u8; 32];
    if rand::rngs::OsRng.try_fill_bytes(&mut seed).is_err() {
        rand::rng().fill_bytes(&mut seed);
    }
    seed
}

/// The length of the window `client_joins_per_minute` counts in.
pub const JOIN_WINDOW: Duration = Duration::from_secs(60);

impl Limits {
    /// How long an unconfirmed admit-now session holds its slot.
    pub fn unconfirmed_session(&self) -> Duration {
        self.confirm_within.min(self.session_ttl)
    }

    /// How long an unconfirmed ticket keeps its place.
    pub fn unconfirmed_ticket(&self) -> Duration {
        self.confirm_within.min(self.abandon_after)
    }

    /// Whether arrivals from `client` are counted: a known client and a limit on.
    pub fn limits_client(&self, client: ClientKey<'_>) -> bool {
        !client.is_empty() && (self.client_places > 0 || self.client_joins_per_minute > 0)
    }

    /// How long an instance remembers a place that ended (see
    /// `RouteLive::end`): as long as one of its cookies could come back and
    /// be admitted or restored. A pass is restored only within `session_ttl`
    /// of its issue, and admits on its own for `pass_ttl`; a ticket is
    /// restored only within `abandon_after` of its holder's last poll. None
    /// of those times is after the end, which the instance learns of at or
    /// after it: a second more covers the rounding to whole seconds.
    pub fn end_memory(&self) -> Duration {
        self.session_ttl
            .max(self.abandon_after)
            .max(self.pass_ttl)
            .saturating_add(Duration::from_secs(1))
    }

    /// How long after its last contact a client's arrivals are remembered: at
    /// least the join window, and long enough that no place it holds can
    /// outlive it without a poll or renewal touching it again (a ticket silent
    /// `abandon_after`, then admitted and given `arrival_grace`; a session
    /// `session_ttl` after its last renewal).
    pub fn client_memory(&self) -> Duration {
        self.session_ttl
            .max(self.abandon_after.saturating_add(self.arrival_grace))
            .max(self.confirm_within)
            .max(JOIN_WINDOW)
    }
}

/// Who is arriving, as far as per-client limits go: opaque bytes the gate
/// derives from the client address (an IPv4 address, an IPv6 /64). Empty
/// means the client is unknown, and no per-client limit applies.
pub type ClientKey<'a> = &'a [u8];

/// How the stores name a visitor: the first 12 bytes of its id. They are
/// 96 random bits, unique among any number of visitors a line can hold (two
/// alike among ten million: about one chance in 10¹⁵), and as a Redis member
/// they take 16 bytes of memory where the whole id takes 24, in each of a
/// waiter's two entries.
pub type StoreId = [u8; 12];

/// The name the stores know visitor `id` by.
pub fn store_id(id: &VisitorId) -> StoreId {
    let mut short = [0; 12];
    short.copy_from_slice(&id[..12]);
    short
}

/// Places that ended since a time (see [`QueueStore::ended_since`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ended {
    pub ids: Vec<StoreId>,
    /// The store's time of the answer (ms): the next call's `since_ms`.
    pub now_ms: u64,
}

/// One visitor of a batch of arrivals (see [`QueueStore::arrive_batch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arriving {
    pub id: VisitorId,
    /// The client it came from (empty: unknown), as for `arrive`.
    pub client: Vec<u8>,
    pub admit_now: bool,
    /// The lane it joins, as for `arrive`.
    pub lane: usize,
}

/// A waiter an instance answered from the line record (a poll without a
/// store call): the store counts it as polled at the instance's next flush.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub id: VisitorId,
    /// The client the poll came from (empty: unknown), as for `poll`.
    pub client: Vec<u8>,
}

/// What a waiter's ticket says, for `poll`: when it joined and when it was
/// last known alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TicketTimes {
    /// The join score, µs (store time): the place the ticket stands for.
    pub score_us: u64,
    /// The last poll answered for this ticket, µs; the join score itself when
    /// it was never polled. A ticket whose `seen_us` is not after its score is
    /// unconfirmed: it is never restored.
    pub seen_us: u64,
    /// The lane the ticket was issued in (index into the call's lanes; out
    /// of range: the first): where a restore puts it back. A waiter still
    /// in line is found in whichever lane holds it.
    pub lane: usize,
}

impl TicketTimes {
    /// A ticket of the first lane as issued on joining, never polled since.
    pub fn new(score_us: u64) -> TicketTimes {
        TicketTimes {
            score_us,
            seen_us: score_us,
            lane: 0,
        }
    }

    /// Whether a poll was answered for this ticket: the visitor came back.
    pub fn confirmed(&self) -> bool {
        self.seen_us > self.score_us
    }
}

/// What a pass says, for `renew`: when it was issued and whether its session
/// was confirmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassTimes {
    /// When the pass was issued, ms since the Unix epoch.
    pub issued_ms: u64,
    /// False for the pass admit-now issued, until its first return renews it:
    /// a session never confirmed is restored after a loss only within its
    /// `confirm_within`.
    pub confirmed: bool,
    /// The pass was granted or renewed by an instance on its own while this
    /// store could not answer (`l` in the cookie): the store may not know
    /// the session, and takes it back (see [`QueueStore::renew`]).
    pub granted_locally: bool,
}

/// A place in line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// Join score, store time in microseconds; goes into the ticket.
    pub score_us: u64,
    /// 1-based place in the visitor's lane (1 = next to be admitted from it).
    pub position: u64,
    /// Everyone in the visitor's lane, this visitor included.
    pub waiting_total: u64,
    /// The lane that holds the visitor: an index into the lanes of the
    /// `Limits` the call was given.
    pub lane: usize,
}

/// What happened to a visitor arriving without a usable ticket or pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Admitted at once (free capacity, nobody waiting, tick budget left, no
    /// hold), or already active: the session lives `session_ttl` from now.
    Admitted,
    /// In line: newly joined at the back, or already there (same place).
    Waiting(Place),
    /// The line (every lane together) holds `max_waiting` already: nobody
    /// was queued.
    Full { waiting_total: u64 },
    /// The client key holds `client_places` places already, or joined
    /// `client_joins_per_minute` times in the last minute: nobody was queued
    /// or admitted. `retry_after` is when the join window has room again, and
    /// for places the time an unconfirmed ticket keeps its place (how soon a
    /// place nobody uses frees).
    TooMany { retry_after: Duration },
}

/// What counting one forwarded request of a session did (see
/// [`QueueStore::count_request`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// Below the limit: forward the request; the session goes on.
    Allowed,
    /// The session's last request: forward it. The session has ended (its
    /// slot is free, a tombstone written), so its pass admits no more.
    Last,
    /// The session had made its requests already, or left: do not forward.
    Exhausted,
    /// No live session has this id (it expired, or the store never had
    /// it), and no tombstone says it ended: nothing was counted.
    Gone,
}

/// What counting one use of an invite token did (see
/// [`QueueStore::take_use`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InviteUse {
    /// One of its uses, not the last: honour the invite.
    Taken,
    /// Its last use: honour the invite. The token is used up from now on,
    /// which an instance remembers past a loss of the store.
    Last,
    /// Used up already, or expired: do not honour it.
    Refused,
}

impl InviteUse {
    /// Whether the invite is honoured.
    pub fn honoured(self) -> bool {
        matches!(self, InviteUse::Taken | InviteUse::Last)
    }
}

/// The answer to a waiter's poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// Still in line (the poll counted as a heartbeat), possibly just restored
    /// at the ticket's score after a store loss.
    Waiting(Place),
    /// Admitted by the admitter: the visitor has shown up, the session now
    /// lives `session_ttl` from now; the gate issues a pass.
    Admitted,
    /// Not in line, not active and not restorable (dropped as a ghost, left, or
    /// admitted and never came): the visitor joins anew at the back.
    Gone,
}

/// What one admitter tick did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tick {
    /// False when another instance already admitted in this tick window.
    pub ran: bool,
    /// Join scores (µs) of the waiters admitted, in admission order.
    pub admitted_scores: Vec<u64>,
    /// Ghost waiters dropped by this tick.
    pub abandoned: u64,
    /// Admitted waiters whose arrival grace ran out without them showing up.
    pub no_shows: u64,
    /// Admit-now sessions never confirmed within `confirm_within`, freed.
    pub unconfirmed_sessions: u64,
    /// Tickets never polled within `confirm_within`, dropped from the line.
    pub unconfirmed_tickets: u64,
    /// Whether this tick ran the route's opening (DESIGN §8.7), and if so
    /// how many waiters of the pre-queue it shuffled. At most one tick per
    /// opening does, whichever instance runs it.
    pub opened: Option<u64>,
    /// Store time of the tick, µs.
    pub now_us: u64,
    /// The route's epoch, µs.
    pub epoch_us: u64,
    /// Per lane of the tick's `Limits`, in order: how many this tick
    /// admitted from it (empty when the tick did not run).
    pub lane_admitted: Vec<u64>,
    /// Per lane, in order: waiters left in it after the tick (empty when
    /// the tick did not run).
    pub lane_waiting: Vec<u64>,
    /// The lane (index into the tick's `Limits`) each admitted waiter came
    /// from, in the order of `admitted_scores`.
    pub admitted_lanes: Vec<usize>,
    /// Per lane, in order: the lowest join score left in it after the tick
    /// (`None`: the lane is empty; empty when the tick did not run).
    pub lane_heads: Vec<Option<u64>>,
}

impl Tick {
    /// A tick that did nothing (yet): not run, at store time `now_us`, in
    /// epoch `epoch_us`.
    pub fn idle(now_us: u64, epoch_us: u64) -> Tick {
        Tick {
            ran: false,
            admitted_scores: Vec::new(),
            abandoned: 0,
            no_shows: 0,
            unconfirmed_sessions: 0,
            unconfirmed_tickets: 0,
            opened: None,
            now_us,
            epoch_us,
            lane_admitted: Vec::new(),
            lane_waiting: Vec::new(),
            admitted_lanes: Vec::new(),
            lane_heads: Vec::new(),
        }
    }

    /// Admission inversions of this tick (DESIGN §9.4): waiters it admitted
    /// while someone in the same lane who joined earlier still waits, as the
    /// tick left the line. The one count every store's tick is judged by.
    pub fn inversions(&self) -> u64 {
        self.admitted_scores
            .iter()
            .zip(&self.admitted_lanes)
            .filter(|&(&score, &lane)| {
                self.lane_heads
                    .get(lane)
                    .copied()
                    .flatten()
                    .is_some_and(|head| head < score)
            })
            .count() as u64
    }

    /// Each admission's wait (join to this tick, seconds) with its lane.
    pub fn waits(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        self.admitted_scores
            .iter()
            .zip(&self.admitted_lanes)
            .map(|(&score, &lane)| (lane, self.now_us.saturating_sub(score) as f64 / 1e6))
    }
}

/// One lane's numbers (see [`RouteStats::lanes`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaneStats {
    /// People in the lane.
    pub waiting: u64,
    /// Admitted from the lane by the admitter since the epoch.
    pub admitted_total: u64,
}

/// A route's live numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteStats {
    /// People in line (ghosts not yet dropped included).
    pub waiting: u64,
    /// Active sessions (expiry in the future).
    pub active: u64,
    /// Everyone ever admitted since the epoch (at once and from the line).
    pub admitted_total: u64,
    /// Admissions per second measured over the last few minutes; the same for
    /// every instance. Zero when nothing was admitted recently.
    pub admit_rate: f64,
    /// When the route's keys were created, µs.
    pub epoch_us: u64,
    /// End of the current hold (nobody new admitted before it), µs; 0 if none.
    pub hold_until_us: u64,
    /// Store time, µs.
    pub now_us: u64,
    /// Per lane of the call's `Limits`, in order.
    pub lanes: Vec<LaneStats>,
}

impl RouteStats {
    /// Lane `index`'s share of the admissions now (see [`Lanes::share`]).
    pub fn lane_share(&self, limits: &Limits, index: usize) -> f64 {
        let waiting: Vec<u64> = self.lanes.iter().map(|l| l.waiting).collect();
        limits.lanes.share(index, &waiting)
    }
}

/// Why the store could not answer. The gate acts on the route's
/// `on_store_error` either way; the variants tell the breaker and metrics
/// apart what happened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The call took longer than the store's timeout.
    #[error("store did not answer within the timeout")]
    Timeout,
    /// The circuit breaker is open: the store was not called at all.
    #[error("store not called: the circuit breaker is open after repeated failures")]
    CircuitOpen,
    /// The store was called and failed: refused or lost connection, a
    /// server error, or a reply that is not what the script returns.
    #[error("store unavailable: {0}")]
    Unavailable(#[source] redis::RedisError),
}

impl StoreError {
    /// The same error again, for each of the callers one failed call
    /// answers (a batch of arrivals).
    pub fn share(&self) -> StoreError {
        match self {
            StoreError::Timeout => StoreError::Timeout,
            StoreError::CircuitOpen => StoreError::CircuitOpen,
            StoreError::Unavailable(e) => StoreError::Unavailable(redis::RedisError::from((
                e.kind(),
                "store call failed",
                e.to_string(),
            ))),
        }
    }
}

/// The operations the gate and the admitter need. Every call is atomic.
pub trait QueueStore: Send + Sync {
    /// A visitor with no usable ticket or pass arrives from `client` (empty:
    /// unknown). An id already in line keeps its place and an id already
    /// active stays admitted, without counting against the client. Otherwise,
    /// beyond the client's limits the answer is `TooMany` and nothing is
    /// stored; with `admit_now`, admit at once (an unconfirmed session,
    /// `confirm_within`) when there is free capacity, nobody waits, the tick
    /// budget has room and no hold is on; otherwise join the back of the line
    /// (an unconfirmed ticket) unless the line is full. `known_epoch_us` is
    /// the epoch this instance saw last: if the store's differs, the store was
    /// lost and a hold starts (as in [`QueueStore::admit_tick`]) before the
    /// visitor is placed, so nobody is let in at once ahead of the visitors
    /// whose sessions were lost. A new waiter joins the back of `lane` (an
    /// index into `limits.lanes`; out of range: the first lane).
    #[allow(clippy::too_many_arguments)]
    fn arrive(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        limits: &Limits,
        admit_now: bool,
        known_epoch_us: Option<u64>,
        lane: usize,
    ) -> impl Future<Output = Result<Arrival, StoreError>> + Send;

    /// `arrive` for each of `arrivals`, in order, in one store call: each
    /// answer is what that arrival would get from its own call made right
    /// after the ones before it (so a batch joins the line in its order).
    /// An instance sends the arrivals gathered while its previous call was
    /// in flight (DESIGN §8.9).
    fn arrive_batch(
        &self,
        route: &str,
        arrivals: &[Arriving],
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> impl Future<Output = Result<Vec<Arrival>, StoreError>> + Send;

    /// A waiter polls (a heartbeat, and the confirmation of a new ticket) from
    /// `client`, which keeps the client's count of places alive. An entry
    /// missing from the store is restored at the ticket's score only when its
    /// holder could still be in line now (`seen_us + abandon_after > now`,
    /// so it could at the loss), no tombstone says it left or never showed
    /// up, and either the ticket is confirmed and the route's epoch is newer
    /// than the score (the store was wiped: a hold starts), or the score is
    /// younger than `abandon_after` (a write lost in a failover) and, for a
    /// ticket never polled (one a local line issued during an outage),
    /// younger than `confirm_within` too, so that nothing the store dropped
    /// as unconfirmed comes back. A waiter is looked for in every lane of
    /// `limits`, whatever the ticket says; a restore puts it in the
    /// ticket's lane.
    fn poll(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        ticket: TicketTimes,
        limits: &Limits,
    ) -> impl Future<Output = Result<Poll, StoreError>> + Send;

    /// A pass holder renews from `client`: extends the session to
    /// `session_ttl` from now (confirming an admit-now session) and answers
    /// whether it is still active. A session missing from the store is
    /// restored as active (and confirmed) only when no tombstone says it
    /// left, the store would still hold it now had it kept it (a confirmed
    /// pass issued less than `session_ttl` ago, an unconfirmed one less than
    /// `confirm_within` ago), and either
    ///
    /// - it was issued before the route's epoch (strictly, in ms), so the
    ///   store could have held it at the loss (the first such restore starts
    ///   a hold), or
    /// - it was granted locally (an instance admitted or renewed it while
    ///   this store could not answer), a confirmed pass;
    ///
    /// and, outside a hold, only while the route has room: past the hold, a
    /// restore never takes the route over its capacity.
    fn renew(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        pass: PassTimes,
        limits: &Limits,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Leaves the line or frees the slot, leaving a tombstone for
    /// `abandon_after` so the ticket or pass is not restored as a lost write.
    /// Unknown ids are fine. The visitor is taken out of whichever of
    /// `limits`' lanes holds it.
    fn leave(
        &self,
        route: &str,
        id: &VisitorId,
        limits: &Limits,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Counts one forwarded request of live session `id` against `limit`
    /// (at least 1), atomically: the `limit`-th call answers `Last` and ends
    /// the session as [`QueueStore::leave`] does; later calls, and calls for
    /// an id with a tombstone (it left, or was ended), answer `Exhausted`.
    /// An id with neither a live session nor a tombstone answers `Gone` and
    /// counts nothing, except in the local line of a shared store, which
    /// counts any id (the sessions it stands in for are the store's). The
    /// count is kept `session_ttl + pass_ttl` after the last call. One store
    /// call per request, made only on routes with `max_requests_per_session`.
    fn count_request(
        &self,
        route: &str,
        id: &VisitorId,
        limit: u64,
        limits: &Limits,
    ) -> impl Future<Output = Result<Counted, StoreError>> + Send;

    /// One admitter tick: unless another instance already ran this tick window,
    /// drop expired sessions and ghost waiters, then admit
    /// `min(capacity - active, max_admit_per_tick - admitted this window)` from
    /// the head of the line (none during a hold) with expiry
    /// `now + arrival_grace`. `known_epoch_us` is the epoch this instance saw
    /// last: if the store's differs, the store was lost and a hold starts.
    /// Before `limits.opens_at_us` nobody is admitted; the first tick at or
    /// after it shuffles the pre-queue first (see the module doc).
    fn admit_tick(
        &self,
        route: &str,
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> impl Future<Output = Result<Tick, StoreError>> + Send;

    /// An instance admitted visitors on its own while this store could not
    /// answer (`on_store_error: local`): nobody new is admitted for one
    /// `pass_ttl` from now (an existing longer hold stays), so those
    /// visitors' passes come back and are counted first (see `renew`).
    fn hold(
        &self,
        route: &str,
        limits: &Limits,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The waiters in `beats` polled (answered from the line record since
    /// this instance's last flush): for each one still in line, what `poll`
    /// does to a waiter in line (its last poll is now, the ticket is
    /// confirmed, its client's memory is kept). One call per instance per
    /// tick, however many. Answers, in order, whether each was in line; one
    /// that was not (admitted, left, dropped, or lost with a store) is
    /// answered by the store at its next poll, which restores or admits it
    /// as `poll` does.
    fn heartbeats(
        &self,
        route: &str,
        beats: &[Heartbeat],
        limits: &Limits,
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send;

    /// The ids whose places ended (left, ended by the origin or an exit
    /// path or `max_requests_per_session`, purged as no-shows) at or after
    /// `since_ms` (store time, ms; 0: all still remembered, which is
    /// `abandon_after`), at most 10,000, with the store's time now for the
    /// next call. Each instance asks once per tick, so a session ended
    /// anywhere is refused everywhere within a tick (DESIGN §8.6).
    fn ended_since(
        &self,
        route: &str,
        since_ms: u64,
        limits: &Limits,
    ) -> impl Future<Output = Result<Ended, StoreError>> + Send;

    /// Moves waiter `id` to lane `to_lane` (an index into `limits.lanes`)
    /// keeping its join score, so its place among the lane's waiters is
    /// where its score puts it. False if it is not waiting.
    fn move_lane(
        &self,
        route: &str,
        id: &VisitorId,
        to_lane: usize,
        limits: &Limits,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Counts one use of an invite token (`token_key`: bytes naming the
    /// token) that expires at `expires_unix` (seconds): honoured while its
    /// uses, this one included, are at most `max_uses`, and `Last` for the
    /// `max_uses`-th. Atomic, so `max_uses` concurrent calls and no more
    /// are honoured, and one of them is `Last`. An expired token is
    /// `Refused` and counts nothing. The count is forgotten when the token
    /// expires.
    fn take_use(
        &self,
        route: &str,
        token_key: &[u8],
        max_uses: u32,
        expires_unix: u64,
    ) -> impl Future<Output = Result<InviteUse, StoreError>> + Send;

    /// The line as the last admitter tick left it, or later (see
    /// [`record`]); `None` before the first tick of the epoch.
    fn line_record(
        &self,
        route: &str,
        limits: &Limits,
    ) -> impl Future<Output = Result<Option<LineRecord>, StoreError>> + Send;

    /// The route's runtime override (DESIGN §9.4), if one is set.
    fn override_of(
        &self,
        route: &str,
    ) -> impl Future<Output = Result<Option<Override>, StoreError>> + Send;

    /// Sets the route's override, replacing any; `None` clears it. Every
    /// instance follows it from its next tick.
    fn set_override(
        &self,
        route: &str,
        value: Option<&Override>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The route's live numbers.
    fn stats(
        &self,
        route: &str,
        limits: &Limits,
    ) -> impl Future<Output = Result<RouteStats, StoreError>> + Send;

    /// Whether the store answers a script round trip (readiness).
    fn ready(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Adds `counts`, what this instance counted of the route's requests
    /// since its last report, to the route's window of length `every`
    /// (DESIGN §9.1). The windows follow the store's clock, so on a shared
    /// store every instance adds to the same one. Returns the capacity the
    /// store holds for the route and the window that ended before the one
    /// counted now, with every instance's counts.
    fn report_health(
        &self,
        route: &str,
        counts: &WindowCounts,
        every: Duration,
    ) -> impl Future<Output = Result<HealthLook, StoreError>> + Send;

    /// The right to decide the capacity once for the window `look` was
    /// counting: a lease at most one caller per window gets (the split
    /// line's coordinator lease), or `None`.
    fn take_health_lease(
        &self,
        route: &str,
        every: Duration,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Sets the capacity every instance admits the route by, and why, if
    /// `lease` is still held; whether it was set.
    fn set_capacity(
        &self,
        route: &str,
        lease: u64,
        capacity: u64,
        why: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// What a health report brings back (see [`QueueStore::report_health`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HealthLook {
    /// The capacity the store holds for the route: `None` until one was set
    /// (or since the store was wiped).
    pub capacity: Option<u64>,
    /// Why it was last set.
    pub why: String,
    /// The window counted now (the store's time over the window's length).
    pub window: u64,
    /// The window before, as every instance counted it (empty if nothing
    /// was reported in it).
    pub ended: WindowCounts,
}

/// The configured backend, one concrete type for the gate and the admitter.
#[derive(Clone)]
pub enum Store {
    Memory(MemoryStore),
    Redis(RedisStore),
}

impl Store {
    /// The backend `cfg` names. The memory store reads `clock`; the Redis
    /// store connects lazily and never waits for Redis here (see
    /// `RedisStore::connect`), so this fails only on a malformed Redis address.
    pub fn from_config(cfg: &StoreConfig, clock: Clock) -> Result<Store, StoreError> {
        match cfg.backend {
            Backend::Memory => Ok(Store::Memory(MemoryStore::new(clock))),
            Backend::Redis => Ok(Store::Redis(RedisStore::connect(&cfg.redis)?)),
        }
    }

    /// Whether instances share it (Redis): then status polls from behind
    /// the head of the line are answered from the line record (DESIGN
    /// §8.9). The memory store answers a poll as cheaply as a record would,
    /// and exactly.
    pub fn is_shared(&self) -> bool {
        matches!(self, Store::Redis(_))
    }
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            Store::Memory($s) => $call,
            Store::Redis($s) => $call,
        }
    };
}

impl QueueStore for Store {
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
        dispatch!(self, s => s.arrive(route, id, client, limits, admit_now, known_epoch_us, lane).await)
    }

    async fn arrive_batch(
        &self,
        route: &str,
        arrivals: &[Arriving],
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Vec<Arrival>, StoreError> {
        dispatch!(self, s => s.arrive_batch(route, arrivals, limits, known_epoch_us).await)
    }

    async fn poll(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        ticket: TicketTimes,
        limits: &Limits,
    ) -> Result<Poll, StoreError> {
        dispatch!(self, s => s.poll(route, id, client, ticket, limits).await)
    }

    async fn renew(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        pass: PassTimes,
        limits: &Limits,
    ) -> Result<bool, StoreError> {
        dispatch!(self, s => s.renew(route, id, client, pass, limits).await)
    }

    async fn leave(&self, route: &str, id: &VisitorId, limits: &Limits) -> Result<(), StoreError> {
        dispatch!(self, s => s.leave(route, id, limits).await)
    }

    async fn count_request(
        &self,
        route: &str,
        id: &VisitorId,
        limit: u64,
        limits: &Limits,
    ) -> Result<Counted, StoreError> {
        dispatch!(self, s => s.count_request(route, id, limit, limits).await)
    }

    async fn admit_tick(
        &self,
        route: &str,
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Tick, StoreError> {
        dispatch!(self, s => s.admit_tick(route, limits, known_epoch_us).await)
    }

    async fn hold(&self, route: &str, limits: &Limits) -> Result<(), StoreError> {
        dispatch!(self, s => s.hold(route, limits).await)
    }

    async fn heartbeats(
        &self,
        route: &str,
        beats: &[Heartbeat],
        limits: &Limits,
    ) -> Result<Vec<bool>, StoreError> {
        dispatch!(self, s => s.heartbeats(route, beats, limits).await)
    }

    async fn ended_since(
        &self,
        route: &str,
        since_ms: u64,
        limits: &Limits,
    ) -> Result<Ended, StoreError> {
        dispatch!(self, s => s.ended_since(route, since_ms, limits).await)
    }

    async fn move_lane(
        &self,
        route: &str,
        id: &VisitorId,
        to_lane: usize,
        limits: &Limits,
    ) -> Result<bool, StoreError> {
        dispatch!(self, s => s.move_lane(route, id, to_lane, limits).await)
    }

    async fn take_use(
        &self,
        route: &str,
        token_key: &[u8],
        max_uses: u32,
        expires_unix: u64,
    ) -> Result<InviteUse, StoreError> {
        dispatch!(self, s => s.take_use(route, token_key, max_uses, expires_unix).await)
    }

    async fn line_record(
        &self,
        route: &str,
        limits: &Limits,
    ) -> Result<Option<LineRecord>, StoreError> {
        dispatch!(self, s => s.line_record(route, limits).await)
    }

    async fn override_of(&self, route: &str) -> Result<Option<Override>, StoreError> {
        dispatch!(self, s => s.override_of(route).await)
    }

    async fn set_override(&self, route: &str, value: Option<&Override>) -> Result<(), StoreError> {
        dispatch!(self, s => s.set_override(route, value).await)
    }

    async fn stats(&self, route: &str, limits: &Limits) -> Result<RouteStats, StoreError> {
        dispatch!(self, s => s.stats(route, limits).await)
    }

    async fn ready(&self) -> Result<(), StoreError> {
        dispatch!(self, s => s.ready().await)
    }

    async fn report_health(
        &self,
        route: &str,
        counts: &WindowCounts,
        every: Duration,
    ) -> Result<HealthLook, StoreError> {
        dispatch!(self, s => s.report_health(route, counts, every).await)
    }

    async fn take_health_lease(
        &self,
        route: &str,
        every: Duration,
    ) -> Result<Option<u64>, StoreError> {
        dispatch!(self, s => s.take_health_lease(route, every).await)
    }

    async fn set_capacity(
        &self,
        route: &str,
        lease: u64,
        capacity: u64,
        why: &str,
    ) -> Result<bool, StoreError> {
        dispatch!(self, s => s.set_capacity(route, lease, capacity, why).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(name: &str, weight: u32) -> Lane {
        Lane {
            name: name.to_owned(),
            weight,
        }
    }

    #[test]
    fn a_lane_shares_admissions_with_the_lanes_that_have_waiters() {
        let lanes = Lanes::new(vec![lane("main", 1), lane("vip", 3)]).unwrap();
        assert_eq!(lanes.share(1, &[5, 5]), 0.75);
        assert_eq!(lanes.share(0, &[5, 5]), 0.25);
        assert_eq!(lanes.share(0, &[5, 0]), 1.0, "vip empty: main gets all");
        assert_eq!(lanes.share(1, &[5, 0]), 0.75, "the lane asked about waits");
        assert_eq!(lanes.share(9, &[5, 5]), 0.25, "out of range: the first");
        assert_eq!(lanes.clamp(9), 0);
        assert_eq!(Lanes::default().get(0).name, MAIN_LANE);
    }
}
