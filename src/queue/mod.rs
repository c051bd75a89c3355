//! The line and the active set: the `QueueStore` trait, its types, and the
//! memory and Redis backends behind one `Store` handle.
//!
//! Every operation is per route and atomic. Times are store times: the memory
//! store reads its `Clock`, the Redis store reads Redis `TIME`, so instance
//! clocks never matter. Scores are microseconds since the Unix epoch; the
//! active set's expiries and the seen set's poll times are milliseconds.
//!
//! Semantics shared by every backend (checked by the store contract suite):
//!
//! - The active count is counted from expiry scores (`expiry > now`), never kept
//!   as a counter, so it cannot drift when visitors vanish.
//! - A waiter who has not polled for `abandon_after` is a ghost: it is dropped
//!   before anyone behind it is admitted and never takes a slot.
//! - A waiter admitted by the admitter gets `arrival_grace` to show up (poll or
//!   request); showing up turns the slot into a session that lives
//!   `session_ttl` past the last store contact (arrival, renewal).
//! - Each route has an epoch: the time its keys were created. Entries missing
//!   from a store whose epoch is newer than the visitor's ticket or pass were
//!   lost with the store, not given up, and are restored; the first notice of
//!   the loss (restoring such an entry, or an instance seeing the epoch it
//!   remembered change) starts a hold of one `pass_ttl` during which nobody
//!   new is admitted, so returning admitted visitors are counted first. Later
//!   notices in the same epoch do not extend the hold: otherwise one visitor
//!   leaving and coming back with an old ticket could stop the line for good.
//! - Every operation creates the route's state (and so its epoch) when missing.
//! - Expired sessions may be purged by any operation; the admitted waiters
//!   among them that never showed up are reported as `no_shows` by the next
//!   tick that runs, and ghosts dropped outside a tick as `abandoned`.
//! - A no-show is not restored: once its arrival grace ran out, a poll with
//!   its ticket answers `Gone` however young the ticket is (the store keeps a
//!   tombstone until the ticket is too old for the lost-write rule), so it
//!   joins again at the back.
//! - Admissions in one tick window (`floor(now / tick)`), by the admitter and
//!   by admit-now together, never exceed `max_admit_per_tick`.

pub mod breaker;
pub mod memory;
pub mod redis_store;

use std::future::Future;
use std::time::Duration;

pub use breaker::{Breaker, BreakerConfig, BreakerState, Guarded, Operation};
pub use memory::MemoryStore;
pub use redis_store::RedisStore;

use crate::clock::Clock;
use crate::config::{Backend, StoreConfig};

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
}

/// A place in line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// Join score, store time in microseconds; goes into the ticket.
    pub score_us: u64,
    /// 1-based place in line (1 = next to be admitted).
    pub position: u64,
    /// Everyone in line, this visitor included.
    pub waiting_total: u64,
}

/// What happened to a visitor arriving without a usable ticket or pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Admitted at once (free capacity, nobody waiting, tick budget left, no
    /// hold), or already active: the session lives `session_ttl` from now.
    Admitted,
    /// In line: newly joined at the back, or already there (same place).
    Waiting(Place),
    /// The line holds `max_waiting` already: nobody was queued.
    Full { waiting_total: u64 },
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
    /// Store time of the tick, µs.
    pub now_us: u64,
    /// The route's epoch, µs.
    pub epoch_us: u64,
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

/// The operations the gate and the admitter need. Every call is atomic.
pub trait QueueStore: Send + Sync {
    /// A visitor with no usable ticket or pass arrives. With `admit_now`, admit
    /// at once when there is free capacity, nobody waits, the tick budget has
    /// room and no hold is on; otherwise join the back of the line (unless the
    /// line is full). An id already in line keeps its place; an id already
    /// active stays admitted.
    fn arrive(
        &self,
        route: &str,
        id: &VisitorId,
        limits: &Limits,
        admit_now: bool,
    ) -> impl Future<Output = Result<Arrival, StoreError>> + Send;

    /// A waiter polls (a heartbeat). `ticket_score_us` is the join score its
    /// ticket carries: an entry missing from the store is restored at it when
    /// the route's epoch is newer than the score (the store was wiped) or the
    /// score is younger than `abandon_after` (a write lost in a failover),
    /// but never for a waiter admitted who did not show up within
    /// `arrival_grace` (a no-show).
    fn poll(
        &self,
        route: &str,
        id: &VisitorId,
        ticket_score_us: u64,
        limits: &Limits,
    ) -> impl Future<Output = Result<Poll, StoreError>> + Send;

    /// A pass holder renews: extends the session to `session_ttl` from now and
    /// answers whether it is still active. A session missing from a store whose
    /// epoch is newer than `pass_issued_s` (less one second for the pass's
    /// resolution) is restored as active and starts a hold.
    fn renew(
        &self,
        route: &str,
        id: &VisitorId,
        pass_issued_s: u64,
        limits: &Limits,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Leaves the line or frees the slot. Unknown ids are fine.
    fn leave(
        &self,
        route: &str,
        id: &VisitorId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// One admitter tick: unless another instance already ran this tick window,
    /// drop expired sessions and ghost waiters, then admit
    /// `min(capacity - active, max_admit_per_tick - admitted this window)` from
    /// the head of the line (none during a hold) with expiry
    /// `now + arrival_grace`. `known_epoch_us` is the epoch this instance saw
    /// last: if the store's differs, the store was lost and a hold starts.
    fn admit_tick(
        &self,
        route: &str,
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> impl Future<Output = Result<Tick, StoreError>> + Send;

    /// The route's live numbers.
    fn stats(
        &self,
        route: &str,
        limits: &Limits,
    ) -> impl Future<Output = Result<RouteStats, StoreError>> + Send;

    /// Whether the store answers a script round trip (readiness).
    fn ready(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
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
        limits: &Limits,
        admit_now: bool,
    ) -> Result<Arrival, StoreError> {
        dispatch!(self, s => s.arrive(route, id, limits, admit_now).await)
    }

    async fn poll(
        &self,
        route: &str,
        id: &VisitorId,
        ticket_score_us: u64,
        limits: &Limits,
    ) -> Result<Poll, StoreError> {
        dispatch!(self, s => s.poll(route, id, ticket_score_us, limits).await)
    }

    async fn renew(
        &self,
        route: &str,
        id: &VisitorId,
        pass_issued_s: u64,
        limits: &Limits,
    ) -> Result<bool, StoreError> {
        dispatch!(self, s => s.renew(route, id, pass_issued_s, limits).await)
    }

    async fn leave(&self, route: &str, id: &VisitorId) -> Result<(), StoreError> {
        dispatch!(self, s => s.leave(route, id).await)
    }

    async fn admit_tick(
        &self,
        route: &str,
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Tick, StoreError> {
        dispatch!(self, s => s.admit_tick(route, limits, known_epoch_us).await)
    }

    async fn stats(&self, route: &str, limits: &Limits) -> Result<RouteStats, StoreError> {
        dispatch!(self, s => s.stats(route, limits).await)
    }

    async fn ready(&self) -> Result<(), StoreError> {
        dispatch!(self, s => s.ready().await)
    }
}
