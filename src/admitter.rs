//! The per-route tick loop: every `tick` it follows the route's runtime
//! override in the store, asks the store to admit from the head of the
//! line, and keeps the route's live numbers (epoch, counts, admission rate,
//! waits, the line record) fresh for the gate and the waiting room, whose
//! open event streams it wakes after each tick.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::config::Mode;
use crate::gate::Gate;
use crate::health;
use crate::metrics::Metrics;
use crate::queue::QueueStore;
use crate::route::{self, RouteRt, Settings};

/// Live numbers are refreshed at most this often.
const STATS_EVERY: Duration = Duration::from_millis(500);

/// How often an adaptive route's counts go to the store (DESIGN §9.1): a
/// window's decision waits at most this long after it ends.
const HEALTH_EVERY: Duration = Duration::from_secs(1);

/// Runs the tick loop of route `name` until it leaves the config or `stop`
/// changes.
pub async fn run(
    gate: Gate,
    settings: Arc<ArcSwap<Settings>>,
    metrics: Arc<Metrics>,
    name: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = match current_tick(&settings, &name) {
        Some(t) => t,
        None => return,
    };
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut health = tokio::time::interval(HEALTH_EVERY);
    health.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_stats: Option<Instant> = None;
    // The store time of the last sessions-ended read (0: none yet).
    let mut ended_read_ms = 0;
    loop {
        let ticked = tokio::select! {
            _ = interval.tick() => true,
            _ = health.tick() => false,
            _ = stop.changed() => return,
        };
        let s = settings.load();
        let Some(index) = s.route_named(&name) else {
            tracing::debug!(route = %name, "route removed: admitter stops");
            return;
        };
        let route = &s.routes[index];
        if !ticked {
            adapt(&gate, route, &name).await;
            continue;
        }
        // An override set here or on another instance applies from the next
        // tick (the settings are swapped; this tick runs on the old ones).
        follow_override(&gate, &settings, &metrics, route).await;
        if route.limits.tick != tick {
            tick = route.limits.tick;
            interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        }
        // Past `closes_at` the route is closed: nobody is admitted.
        if route.cfg.mode == Mode::Gate && !route.closed_at(gate.clock().now_us()) {
            ended_read_ms = admit(&gate, route, &name, ended_read_ms).await;
        }
        // Open event streams look at the record (or the store) again.
        route.live.ticked();
        if last_stats.is_none_or(|at| at.elapsed() >= STATS_EVERY) {
            last_stats = Some(Instant::now());
            refresh_stats(&gate, route, &name).await;
        }
    }
}

/// One tick of an open gate route: admits from the head of the line (and
/// the local line, when it stands in for the store), and, on a shared
/// store, refuses the passes of sessions ended anywhere since
/// `ended_read_ms` and reads the line record. Returns the `ended_read_ms`
/// of the next tick.
async fn admit(gate: &Gate, route: &RouteRt, name: &str, mut ended_read_ms: u64) -> u64 {
    let live = &route.live;
    let known = live.known_epoch_us();
    // Visitors the local line let in come back to the store first.
    if live.granted_locally() && gate.store().hold(name, &route.limits).await.is_ok() {
        live.note_store_holds_local_grants();
        tracing::info!(route = %name, "store back after local admissions: holding admissions for one pass_ttl");
    }
    // Polls answered without the store: from the line record (a
    // shared store) or before the opening (any store).
    flush_heartbeats(gate, route).await;
    match gate
        .store()
        .admit_tick(name, &route.limits_now(), known)
        .await
    {
        Ok(t) => {
            if known.is_some_and(|k| k != t.epoch_us) {
                tracing::warn!(route = %name, "store lost its state: holding admissions for one pass_ttl");
            }
            live.note_store_ticked(t.epoch_us);
            noted(route, &t);
            if t.ran {
                route.metrics.lanes(&route.limits.lanes, &t);
                live.set_lane_waiting(&t.lane_waiting);
            }
            if let Some(shuffled) = t.opened {
                tracing::info!(route = %name, shuffled, "opened: the pre-queue was shuffled");
            }
            if !t.admitted_scores.is_empty() {
                tracing::debug!(route = %name, admitted = t.admitted_scores.len(), "admitted from the line");
            }
        }
        Err(err) => {
            tracing::debug!(route = %name, error = %err, "admit tick failed");
        }
    }
    if gate.store().is_shared() {
        ended_read_ms = refuse_ended(gate, route, ended_read_ms).await;
        match gate.store().line_record(name, &route.limits).await {
            Ok(record) => live.set_record(record),
            Err(err) => {
                tracing::debug!(route = %name, error = %err, "line record not read");
            }
        }
    }
    if let Some(t) = gate.lines().tick_local(route).await {
        noted(route, &t);
    }
    ended_read_ms
}

/// An adaptive route's health step (DESIGN §9.1): adds what this instance
/// counted to the store's window and follows the capacity the store holds;
/// the first time it sees a window end, it asks for the lease to decide on
/// that window, and with it applies [`health::decide`]. With the store
/// down, the route keeps the capacity it had (what was counted meanwhile
/// is dropped: the windows it belonged to are gone).
async fn adapt(gate: &Gate, route: &RouteRt, name: &str) {
    let Some(adapt) = &route.cfg.adapt else {
        return;
    };
    let (live, store) = (&route.live, gate.store());
    let counts = live.health().take();
    let look = match store.report_health(name, &counts, adapt.every).await {
        Ok(look) => look,
        Err(err) => {
            tracing::debug!(route = %name, error = %err, "health not reported: capacity kept");
            return;
        }
    };
    if let Some(capacity) = look.capacity {
        let capacity = capacity.clamp(adapt.min, adapt.max);
        if live.note_capacity(capacity, &look.why) {
            route.metrics.origin.capacity(capacity);
            tracing::info!(route = %name, capacity, why = %look.why, "capacity follows the store");
        }
    }
    if !live.first_try_for(look.window) {
        return;
    }
    live.note_window(&look.ended);
    let Ok(Some(lease)) = store.take_health_lease(name, adapt.every).await else {
        return;
    };
    let Ok(stats) = store.stats(name, &route.limits_now()).await else {
        return;
    };
    let room = health::Room {
        capacity: route.capacity_now(),
        waiting: stats.waiting,
        active: stats.active,
    };
    let Some(change) = health::decide(adapt, room, &look.ended) else {
        return;
    };
    if let Ok(true) = store
        .set_capacity(name, lease, change.capacity, &change.reason)
        .await
    {
        live.note_capacity(change.capacity, &change.reason);
        route
            .metrics
            .origin
            .changed(change.direction, change.capacity);
        tracing::info!(
            route = %name,
            from = room.capacity,
            to = change.capacity,
            why = %change.reason,
            "capacity changed"
        );
    }
}

/// Follows the route's override in the store (DESIGN §9.4): the fields that
/// still hold against the config file are laid over the route, as a reload
/// would; a field the file changed since it was overridden is the file's
/// again, and is cleared in the store for every instance. A store that does
/// not answer leaves the route as it runs.
async fn follow_override(
    gate: &Gate,
    settings: &ArcSwap<Settings>,
    metrics: &Metrics,
    route: &RouteRt,
) {
    let name = route.name();
    let stored = match gate.store().override_of(name).await {
        Ok(stored) => stored,
        Err(err) => {
            tracing::debug!(route = name, error = %err, "override not read");
            return;
        }
    };
    let holding = stored
        .as_ref()
        .and_then(|o| o.holding(route.file_mode, route.file_capacity));
    if holding != stored {
        if let Err(err) = gate.store().set_override(name, holding.as_ref()).await {
            tracing::debug!(route = name, error = %err, "override not trimmed");
            return;
        }
        tracing::info!(
            route = name,
            mode = route.file_mode.as_str(),
            capacity = route.file_capacity,
            "override dropped in the store where the config file changed the field"
        );
    }
    if holding == route.overridden {
        return;
    }
    match &holding {
        Some(o) => tracing::info!(
            route = name,
            by = %o.by,
            mode = o.mode.map(|m| m.value.as_str()),
            capacity = o.capacity.map(|c| c.value),
            "following the override"
        ),
        None => tracing::info!(
            route = name,
            "override cleared: the config file's values apply"
        ),
    }
    settings.rcu(|current| Arc::new(current.with_override(name, holding.clone(), metrics)));
}

/// What a tick did, counted in the route's metrics and its recent waits.
fn noted(route: &RouteRt, tick: &crate::queue::Tick) {
    route.metrics.tick(&route.limits.lanes, tick);
    route.live.note_waits(tick);
}

/// Refreshes the route's live numbers (waiting, active, admission rate,
/// ETA) from the store.
async fn refresh_stats(gate: &Gate, route: &RouteRt, name: &str) {
    if let Ok(stats) = gate.store().stats(name, &route.limits).await {
        route.live.note_stats(&stats);
        let eta_s = route::eta_seconds(stats.waiting, stats.admit_rate).map(|s| s as f64);
        route.metrics.live(stats.waiting, stats.active, eta_s);
    }
}

fn current_tick(settings: &ArcSwap<Settings>, name: &str) -> Option<Duration> {
    let s = settings.load();
    s.route_named(name).map(|i| s.routes[i].limits.tick)
}

/// The running admitters, one per route, started as routes appear (at start
/// and on reload). A removed route's admitter stops by itself at its next
/// tick; a route re-added before then keeps the admitter it had.
pub struct Admitters {
    gate: Gate,
    settings: Arc<ArcSwap<Settings>>,
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
    running: Mutex<HashMap<String, JoinHandle<()>>>,
}

impl Admitters {
    /// Admitters that all stop when `stop` changes.
    pub fn new(
        gate: Gate,
        settings: Arc<ArcSwap<Settings>>,
        metrics: Arc<Metrics>,
        stop: watch::Receiver<bool>,
    ) -> Admitters {
        Admitters {
            gate,
            settings,
            metrics,
            stop,
            running: Mutex::new(HashMap::new()),
        }
    }

    /// Starts an admitter for every route of the current settings that has
    /// none running.
    pub fn start_missing(&self) {
        let settings = self.settings.load();
        let mut running = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        running.retain(|_, task| !task.is_finished());
        for route in &settings.routes {
            if running.contains_key(route.name()) {
                continue;
            }
            let task = tokio::spawn(run(
                self.gate.clone(),
                self.settings.clone(),
                self.metrics.clone(),
                route.name().to_owned(),
                self.stop.clone(),
            ));
            running.insert(route.name().to_owned(), task);
        }
    }

    /// Waits for every admitter to end (after `stop` changed).
    pub async fn join(&self) {
        let tasks: Vec<_> = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain()
            .map(|(_, task)| task)
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    }
}

/// Reads the sessions ended anywhere since `since_ms` (store time) and
/// refuses their passes here from now on; returns the `since_ms` of the
/// next read. It reaches a little back, so that an end recorded in the
/// same millisecond as the last read is not missed.
async fn refuse_ended(gate: &Gate, route: &RouteRt, since_ms: u64) -> u64 {
    match gate
        .store()
        .ended_since(route.name(), since_ms.saturating_sub(1_000), &route.limits)
        .await
    {
        Ok(ended) => {
            let now_s = gate.clock().now_s();
            for id in &ended.ids {
                route.live.end_stored(id, now_s, &route.limits);
            }
            ended.now_ms
        }
        Err(err) => {
            tracing::debug!(route = route.name(), error = %err, "ended sessions not read");
            since_ms
        }
    }
}

/// Most heartbeats kept for the next flush when one fails: a long outage
/// must not grow them without bound (the waiters' next polls bring them
/// again).
const HEARTBEATS_KEPT: usize = 200_000;

/// Most heartbeats in one store call: bounds how long the script runs (the
/// route's other calls wait meanwhile).
const HEARTBEATS_PER_CALL: usize = 5_000;

/// Sends the polls answered from the line record since the last flush to
/// the store as one call; the waiters it finds out of line are answered by
/// the store at their next poll. A failed flush is tried again at the next
/// tick, so an outage of the store does not make live waiters ghosts.
async fn flush_heartbeats(gate: &Gate, route: &RouteRt) {
    let live = &route.live;
    let mut beats = live.take_heartbeats();
    if beats.is_empty() {
        return;
    }
    // A waiter polled twice since the last flush (or many times through an
    // outage, answered by the local line) is one heartbeat.
    beats.sort_unstable_by_key(|beat| beat.id);
    beats.dedup_by(|a, b| a.id == b.id);
    let mut chunks = beats.chunks(HEARTBEATS_PER_CALL);
    for chunk in chunks.by_ref() {
        match gate
            .store()
            .heartbeats(route.name(), chunk, &route.limits)
            .await
        {
            Ok(in_line) => {
                let out = chunk
                    .iter()
                    .zip(in_line)
                    .filter(|&(_, in_line)| !in_line)
                    .map(|(beat, _)| beat.id);
                live.out_of_line(out, route.limits.abandon_after);
            }
            Err(err) => {
                tracing::debug!(route = route.name(), error = %err, "heartbeats not flushed");
                let unsent = chunk.iter().chain(chunks.flatten());
                for beat in unsent.take(HEARTBEATS_KEPT) {
                    live.heartbeat(beat.clone());
                }
                return;
            }
        }
    }
}
