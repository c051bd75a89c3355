//! The circuit breaker around the store: after a run of failures it stops
//! calling the store for a cool-down, so no request waits on a dead or hung
//! store, then lets one probe through and closes again when it succeeds.
//!
//! It owns the breaker state and the per-operation call and error counts
//! that metrics export; what a route does when a call fails (`on_store_error`) is the gate's.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    Arrival, Arriving, ClientKey, Counted, Ended, HealthLook, Heartbeat, InviteUse, Limits,
    LineRecord, Override, PassTimes, Poll, QueueStore, RouteStats, Store, StoreError, Tick,
    TicketTimes, VisitorId, WindowCounts,
};
use crate::config::StoreConfig;

/// When the breaker opens and how long it stays open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures (timeouts included) that open the breaker.
    pub failures_to_open: u32,
    /// The first cool-down after opening.
    pub cool_down: Duration,
    /// Each failed probe doubles the cool-down, up to this.
    pub max_cool_down: Duration,
    /// A probe call gets at most this long.
    pub probe_timeout: Duration,
}

impl BreakerConfig {
    /// The defaults for `store`: 5 failures open it for 2 s, growing to 30 s
    /// while probes fail; a probe gets twice the store's call timeout (room
    /// for reconnecting) but never more than a second.
    pub fn for_store(store: &StoreConfig) -> BreakerConfig {
        BreakerConfig {
            failures_to_open: 5,
            cool_down: Duration::from_secs(2),
            max_cool_down: Duration::from_secs(30),
            probe_timeout: (store.redis.timeout * 2).min(Duration::from_secs(1)),
        }
    }
}

/// The breaker's state, numbered as `queuegate_store_breaker_state` exports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go to the store.
    Closed = 0,
    /// One probe call is testing the store; the others fail at once.
    HalfOpen = 1,
    /// Calls fail at once until the cool-down ends.
    Open = 2,
}

/// The store operations, as labelled in `queuegate_store_calls_total` and
/// `queuegate_store_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Arrive,
    Poll,
    Renew,
    Leave,
    CountRequest,
    AdmitTick,
    Heartbeats,
    Ended,
    LineRecord,
    Hold,
    Stats,
    Ready,
    MoveLane,
    TakeUse,
    Health,
    Override,
}

impl Operation {
    /// Every operation, in label order.
    pub const ALL: [Operation; 16] = [
        Operation::Arrive,
        Operation::Poll,
        Operation::Renew,
        Operation::Leave,
        Operation::CountRequest,
        Operation::AdmitTick,
        Operation::Heartbeats,
        Operation::Ended,
        Operation::LineRecord,
        Operation::Hold,
        Operation::Stats,
        Operation::Ready,
        Operation::MoveLane,
        Operation::TakeUse,
        Operation::Health,
        Operation::Override,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Operation::Arrive => "arrive",
            Operation::Poll => "poll",
            Operation::Renew => "renew",
            Operation::Leave => "leave",
            Operation::CountRequest => "count_request",
            Operation::AdmitTick => "admit_tick",
            Operation::Heartbeats => "heartbeats",
            Operation::Ended => "ended_since",
            Operation::LineRecord => "line_record",
            Operation::Hold => "hold",
            Operation::Stats => "stats",
            Operation::Ready => "ready",
            Operation::MoveLane => "move_lane",
            Operation::TakeUse => "take_use",
            Operation::Health => "health",
            Operation::Override => "override",
        }
    }
}

#[derive(Debug)]
enum Phase {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen,
}

#[derive(Debug)]
struct Inner {
    phase: Phase,
    /// The cool-down the next opening uses.
    cool_down: Duration,
}

/// The breaker itself; shared by every clone of the guarded store.
#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    inner: Mutex<Inner>,
    calls: [AtomicU64; Operation::ALL.len()],
    errors: [AtomicU64; Operation::ALL.len()],
    short_circuited: AtomicU64,
}

/// What a caller may do, decided under the lock.
enum Permit {
    Call,
    Probe,
    Refuse,
}

impl Breaker {
    pub fn new(config: BreakerConfig) -> Breaker {
        Breaker {
            inner: Mutex::new(Inner {
                phase: Phase::Closed { failures: 0 },
                cool_down: config.cool_down,
            }),
            config,
            calls: Default::default(),
            errors: Default::default(),
            short_circuited: AtomicU64::new(0),
        }
    }

    /// The current state (an open breaker past its cool-down still reads
    /// `Open` until the next call probes).
    pub fn state(&self) -> BreakerState {
        match self.lock().phase {
            Phase::Closed { .. } => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen => BreakerState::HalfOpen,
        }
    }

    /// Calls of `op` made to the store, whatever their outcome; calls
    /// refused by the open breaker are not made and not counted here.
    pub fn calls(&self, op: Operation) -> u64 {
        self.calls[op as usize].load(Ordering::Relaxed)
    }

    /// Store calls of `op` that failed (timeouts included); calls refused by
    /// the open breaker are not store errors and are not counted here.
    pub fn errors(&self, op: Operation) -> u64 {
        self.errors[op as usize].load(Ordering::Relaxed)
    }

    /// Calls refused at once because the breaker was open.
    pub fn short_circuited(&self) -> u64 {
        self.short_circuited.load(Ordering::Relaxed)
    }

    /// Runs `call` unless the breaker is open; records the outcome.
    pub async fn call<T>(
        &self,
        op: Operation,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match self.permit() {
            Permit::Refuse => {
                self.short_circuited.fetch_add(1, Ordering::Relaxed);
                Err(StoreError::CircuitOpen)
            }
            Permit::Call => {
                self.calls[op as usize].fetch_add(1, Ordering::Relaxed);
                let result = call.await;
                self.record(op, result.is_ok());
                result
            }
            Permit::Probe => {
                // Dropped before it finishes (the request went away): the
                // guard reopens with the same cool-down left at zero, so the
                // next call probes instead of the breaker staying half-open.
                self.calls[op as usize].fetch_add(1, Ordering::Relaxed);
                let mut probe = ProbeGuard {
                    breaker: self,
                    done: false,
                };
                let result = match tokio::time::timeout(self.config.probe_timeout, call).await {
                    Ok(result) => result,
                    Err(_) => Err(StoreError::Timeout),
                };
                probe.done = true;
                self.probe_finished(op, result.is_ok());
                result
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The state is a few plain fields updated in one step: still
        // consistent after a panic elsewhere.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn permit(&self) -> Permit {
        let mut inner = self.lock();
        match inner.phase {
            Phase::Closed { .. } => Permit::Call,
            Phase::HalfOpen => Permit::Refuse,
            Phase::Open { until } if Instant::now() >= until => {
                inner.phase = Phase::HalfOpen;
                tracing::info!("store breaker half-open: probing the store");
                Permit::Probe
            }
            Phase::Open { .. } => Permit::Refuse,
        }
    }

    fn record(&self, op: Operation, ok: bool) {
        if !ok {
            self.errors[op as usize].fetch_add(1, Ordering::Relaxed);
        }
        let mut inner = self.lock();
        // Outcomes of calls let through before the breaker opened (or by
        // another probe) do not move an open or half-open breaker.
        let Phase::Closed { failures } = inner.phase else {
            return;
        };
        if ok {
            inner.phase = Phase::Closed { failures: 0 };
            return;
        }
        let failures = failures + 1;
        if failures >= self.config.failures_to_open {
            let cool_down = inner.cool_down;
            inner.phase = Phase::Open {
                until: Instant::now() + cool_down,
            };
            tracing::warn!(
                failures,
                ?cool_down,
                "store breaker open: store calls fail at once"
            );
        } else {
            inner.phase = Phase::Closed { failures };
        }
    }

    fn probe_finished(&self, op: Operation, ok: bool) {
        if !ok {
            self.errors[op as usize].fetch_add(1, Ordering::Relaxed);
        }
        let mut inner = self.lock();
        if ok {
            inner.phase = Phase::Closed { failures: 0 };
            inner.cool_down = self.config.cool_down;
            tracing::info!("store breaker closed: the store answers again");
        } else {
            inner.cool_down = (inner.cool_down * 2).min(self.config.max_cool_down);
            let cool_down = inner.cool_down;
            inner.phase = Phase::Open {
                until: Instant::now() + cool_down,
            };
            tracing::warn!(?cool_down, "store probe failed: breaker stays open");
        }
    }
}

struct ProbeGuard<'a> {
    breaker: &'a Breaker,
    done: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut inner = self.breaker.lock();
        if matches!(inner.phase, Phase::HalfOpen) {
            inner.phase = Phase::Open {
                until: Instant::now(),
            };
        }
    }
}

/// The configured store behind the breaker: what the gate, the waiting room
/// and the admitter call.
#[derive(Clone)]
pub struct Guarded {
    store: Store,
    breaker: Arc<Breaker>,
}

impl Guarded {
    pub fn new(store: Store, config: BreakerConfig) -> Guarded {
        Guarded {
            store,
            breaker: Arc::new(Breaker::new(config)),
        }
    }

    /// The breaker, for metrics and readiness.
    pub fn breaker(&self) -> &Arc<Breaker> {
        &self.breaker
    }

    /// See [`Store::is_shared`].
    pub fn is_shared(&self) -> bool {
        self.store.is_shared()
    }
}

impl QueueStore for Guarded {
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
        self.breaker
            .call(
                Operation::Arrive,
                self.store
                    .arrive(route, id, client, limits, admit_now, known_epoch_us, lane),
            )
            .await
    }

    async fn arrive_batch(
        &self,
        route: &str,
        arrivals: &[Arriving],
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Vec<Arrival>, StoreError> {
        self.breaker
            .call(
                Operation::Arrive,
                self.store
                    .arrive_batch(route, arrivals, limits, known_epoch_us),
            )
            .await
    }

    async fn poll(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        ticket: TicketTimes,
        limits: &Limits,
    ) -> Result<Poll, StoreError> {
        self.breaker
            .call(
                Operation::Poll,
                self.store.poll(route, id, client, ticket, limits),
            )
            .await
    }

    async fn renew(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        pass: PassTimes,
        limits: &Limits,
    ) -> Result<bool, StoreError> {
        self.breaker
            .call(
                Operation::Renew,
                self.store.renew(route, id, client, pass, limits),
            )
            .await
    }

    async fn leave(&self, route: &str, id: &VisitorId, limits: &Limits) -> Result<(), StoreError> {
        self.breaker
            .call(Operation::Leave, self.store.leave(route, id, limits))
            .await
    }

    async fn count_request(
        &self,
        route: &str,
        id: &VisitorId,
        limit: u64,
        limits: &Limits,
    ) -> Result<Counted, StoreError> {
        self.breaker
            .call(
                Operation::CountRequest,
                self.store.count_request(route, id, limit, limits),
            )
            .await
    }

    async fn admit_tick(
        &self,
        route: &str,
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Tick, StoreError> {
        self.breaker
            .call(
                Operation::AdmitTick,
                self.store.admit_tick(route, limits, known_epoch_us),
            )
            .await
    }

    async fn hold(&self, route: &str, limits: &Limits) -> Result<(), StoreError> {
        self.breaker
            .call(Operation::Hold, self.store.hold(route, limits))
            .await
    }

    async fn heartbeats(
        &self,
        route: &str,
        beats: &[Heartbeat],
        limits: &Limits,
    ) -> Result<Vec<bool>, StoreError> {
        self.breaker
            .call(
                Operation::Heartbeats,
                self.store.heartbeats(route, beats, limits),
            )
            .await
    }

    async fn ended_since(
        &self,
        route: &str,
        since_ms: u64,
        limits: &Limits,
    ) -> Result<Ended, StoreError> {
        self.breaker
            .call(
                Operation::Ended,
                self.store.ended_since(route, since_ms, limits),
            )
            .await
    }

    async fn line_record(
        &self,
        route: &str,
        limits: &Limits,
    ) -> Result<Option<LineRecord>, StoreError> {
        self.breaker
            .call(Operation::LineRecord, self.store.line_record(route, limits))
            .await
    }

    async fn move_lane(
        &self,
        route: &str,
        id: &VisitorId,
        to_lane: usize,
        limits: &Limits,
    ) -> Result<bool, StoreError> {
        self.breaker
            .call(
                Operation::MoveLane,
                self.store.move_lane(route, id, to_lane, limits),
            )
            .await
    }

    async fn take_use(
        &self,
        route: &str,
        token_key: &[u8],
        max_uses: u32,
        expires_unix: u64,
    ) -> Result<InviteUse, StoreError> {
        self.breaker
            .call(
                Operation::TakeUse,
                self.store
                    .take_use(route, token_key, max_uses, expires_unix),
            )
            .await
    }

    async fn stats(&self, route: &str, limits: &Limits) -> Result<RouteStats, StoreError> {
        self.breaker
            .call(Operation::Stats, self.store.stats(route, limits))
            .await
    }

    async fn override_of(&self, route: &str) -> Result<Option<Override>, StoreError> {
        self.breaker
            .call(Operation::Override, self.store.override_of(route))
            .await
    }

    async fn set_override(&self, route: &str, value: Option<&Override>) -> Result<(), StoreError> {
        self.breaker
            .call(Operation::Override, self.store.set_override(route, value))
            .await
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.breaker
            .call(Operation::Ready, self.store.ready())
            .await
    }

    async fn report_health(
        &self,
        route: &str,
        counts: &WindowCounts,
        every: Duration,
    ) -> Result<HealthLook, StoreError> {
        let call = self.store.report_health(route, counts, every);
        self.breaker.call(Operation::Health, call).await
    }

    async fn take_health_lease(
        &self,
        route: &str,
        every: Duration,
    ) -> Result<Option<u64>, StoreError> {
        let call = self.store.take_health_lease(route, every);
        self.breaker.call(Operation::Health, call).await
    }

    async fn set_capacity(
        &self,
        route: &str,
        lease: u64,
        capacity: u64,
        why: &str,
    ) -> Result<bool, StoreError> {
        let call = self.store.set_capacity(route, lease, capacity, why);
        self.breaker.call(Operation::Health, call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BreakerConfig {
        BreakerConfig {
            failures_to_open: 3,
            cool_down: Duration::from_secs(2),
            max_cool_down: Duration::from_secs(8),
            probe_timeout: Duration::from_millis(300),
        }
    }

    async fn fail(b: &Breaker) -> Result<(), StoreError> {
        b.call(Operation::Arrive, async {
            Err::<(), _>(StoreError::Unavailable(redis::RedisError::from(
                std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            )))
        })
        .await
    }

    async fn succeed(b: &Breaker) -> Result<(), StoreError> {
        b.call(Operation::Arrive, async { Ok(()) }).await
    }

    fn is_circuit_open(r: &Result<(), StoreError>) -> bool {
        matches!(r, Err(StoreError::CircuitOpen))
    }

    #[tokio::test(start_paused = true)]
    async fn consecutive_failures_open_the_breaker() {
        let b = Breaker::new(config());
        for _ in 0..2 {
            assert!(fail(&b).await.is_err());
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(fail(&b).await.is_err());
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.errors(Operation::Arrive), 3);

        // While open the store is not called at all.
        let called = AtomicU64::new(0);
        let r = b
            .call(Operation::Arrive, async {
                called.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .await;
        assert!(is_circuit_open(&r));
        assert_eq!(called.load(Ordering::Relaxed), 0);
        assert_eq!(b.short_circuited(), 1);
        assert_eq!(b.errors(Operation::Arrive), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_resets_the_failure_run() {
        let b = Breaker::new(config());
        for _ in 0..2 {
            let _ = fail(&b).await;
        }
        assert!(succeed(&b).await.is_ok());
        for _ in 0..2 {
            let _ = fail(&b).await;
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_successful_probe_after_the_cool_down_closes_it() {
        let b = Breaker::new(config());
        for _ in 0..3 {
            let _ = fail(&b).await;
        }
        tokio::time::advance(Duration::from_millis(1_900)).await;
        assert!(is_circuit_open(&succeed(&b).await));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(succeed(&b).await.is_ok());
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_probes_grow_the_cool_down_up_to_the_cap() {
        let b = Breaker::new(config());
        for _ in 0..3 {
            let _ = fail(&b).await;
        }
        // Cool-downs: 2 s, then 4 s, 8 s, 8 s (capped).
        for expected in [2u64, 4, 8, 8] {
            tokio::time::advance(Duration::from_secs(expected) - Duration::from_millis(1)).await;
            assert!(
                is_circuit_open(&fail(&b).await),
                "still open before {expected}s"
            );
            tokio::time::advance(Duration::from_millis(1)).await;
            let r = fail(&b).await;
            assert!(!is_circuit_open(&r), "probed after {expected}s");
            assert_eq!(b.state(), BreakerState::Open);
        }
        // A success resets the cool-down to the first one.
        tokio::time::advance(Duration::from_secs(8)).await;
        assert!(succeed(&b).await.is_ok());
        for _ in 0..3 {
            let _ = fail(&b).await;
        }
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(succeed(&b).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn only_one_probe_at_a_time_and_it_has_its_own_timeout() {
        let b = Arc::new(Breaker::new(config()));
        for _ in 0..3 {
            let _ = fail(&b).await;
        }
        tokio::time::advance(Duration::from_secs(2)).await;
        let hung = {
            let b = b.clone();
            tokio::spawn(async move {
                b.call(Operation::Poll, std::future::pending::<Result<(), _>>())
                    .await
            })
        };
        tokio::task::yield_now().await;
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(is_circuit_open(&succeed(&b).await));
        let probe = hung.await.map_err(|_| "probe task panicked");
        assert!(matches!(probe, Ok(Err(StoreError::Timeout))));
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.errors(Operation::Poll), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_probe_lets_the_next_call_probe() {
        let b = Breaker::new(config());
        for _ in 0..3 {
            let _ = fail(&b).await;
        }
        tokio::time::advance(Duration::from_secs(2)).await;
        let probe = b.call(Operation::Arrive, std::future::pending::<Result<(), _>>());
        let _ = tokio::time::timeout(Duration::from_millis(10), probe).await;
        assert_eq!(b.state(), BreakerState::Open);
        assert!(succeed(&b).await.is_ok());
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
