//! Routes ready for requests: each route's config with what is derived from
//! it (store limits, cookie names, metric handles, page template) and the
//! live numbers its admitter keeps fresh, gathered in [`Settings`], the set a
//! config reload replaces whole.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use tokio::sync::watch;

use http::header::HeaderValue;
use http::Method;

use crate::admission::{KeyRing, LaneTag, VisitorId};
use crate::cache::{Caches, Scope};
use crate::config::{self, BypassRule, Config};
use crate::cookie::{self, CookieMemo, Credentials};
use crate::fields::Headers;
use crate::health::{Recorder, WindowCounts};
use crate::inflight::Turns;
use crate::metrics::{Metrics, RouteMetrics, StreamCap};
use crate::path;
use crate::queue::joins::JoinQueue;
use crate::queue::{
    store_id, Heartbeat, Lanes, Limits, LineRecord, Override, RouteStats, StoreId, Tick, MAIN_LANE,
};
use crate::template::Template;

mod remembered;

use remembered::Remembered;

/// Most places one route remembers as ended (see [`RouteLive::end`]):
/// about 50 bytes each, 12 MB at most. Past it the earliest are forgotten
/// first, and logged.
pub const ENDED_KEPT: usize = 250_000;

/// Most used-up invite tokens one route remembers (see
/// [`RouteLive::invite_used_up`]).
pub const USED_UP_INVITES_KEPT: usize = 10_000;

/// The name of a use counter in the store (an invite's 12-byte nonce, a
/// first-arrival lane cookie's 16-byte one), as a key of fixed size: the
/// bytes, zero-padded, and their length, so names of two lengths never meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct UseCounter([u8; 16], u8);

impl UseCounter {
    /// `None` for a name longer than any counter has.
    fn of(nonce: &[u8]) -> Option<UseCounter> {
        let mut bytes = [0; 16];
        bytes.get_mut(..nonce.len())?.copy_from_slice(nonce);
        Some(UseCounter(bytes, nonce.len() as u8))
    }
}

/// Numbers one route's admitter keeps fresh for the gate and the waiting room.
#[derive(Debug, Default)]
pub struct RouteLive {
    /// The route's epoch in the store (µs), 0 until first seen.
    epoch_us: AtomicU64,
    /// People in line, at the last stats read.
    waiting: AtomicU64,
    /// Active sessions, at the last stats read.
    active: AtomicU64,
    /// Admissions per second × 1000, at the last stats read.
    admit_rate_milli: AtomicU64,
    /// Everyone admitted since the epoch, at the last stats read.
    admitted_total: AtomicU64,
    /// The waits (join to admission) of the admissions this instance's
    /// ticks made lately, for the live view's percentiles.
    waits: Mutex<RecentWaits>,
    /// The local line admitted someone since the store last heard of it:
    /// the admitter asks the store for a hold before its next tick.
    granted_locally: AtomicBool,
    /// The local line answered for this route since the admitter last
    /// reached the store: waiters are told to poll again within about a
    /// second, so that once the store is back they are in its line again
    /// (restored at their places) before anyone can be ranked wrongly.
    answered_locally: AtomicBool,
    /// Places this instance has seen end: left here, sessions it ended
    /// (DESIGN §8.6), and every tombstone the store listed since (on a
    /// shared store). Their passes are refused here even in the first half
    /// of their life, when they would otherwise admit without a store call,
    /// and neither their passes nor their tickets are restored after a
    /// store loss, however long the store's own tombstones lasted.
    ended: Mutex<Remembered<StoreId, ENDED_KEPT>>,
    /// Whether `ended` may hold anything: a pass is checked against it
    /// without taking the lock while nothing was ended.
    any_ended: AtomicBool,
    /// Use counters (invites', first-arrival lane cookies') this instance
    /// took the last use of, or was refused: not honoured again until they expire, even by a store that
    /// lost their counts.
    used_up_invites: Mutex<Remembered<UseCounter, USED_UP_INVITES_KEPT>>,
    /// Arrivals waiting for this instance's next arrive call (DESIGN §8.9).
    joins: Arc<JoinQueue>,
    /// The line record the admitter read last, and when (DESIGN §8.9).
    record: ArcSwapOption<ReadRecord>,
    /// Waiters answered from the record since the admitter's last flush.
    heartbeats: Mutex<Vec<Heartbeat>>,
    /// Waiters a flush found out of line, by when: the store answers their
    /// next poll (it admits, restores or lets go of them).
    /// (Read by every poll the record answers while it holds anything.)
    out_of_line: RwLock<OutOfLine>,
    /// Whether `out_of_line` may hold anything.
    any_out_of_line: AtomicBool,
    /// Waiters per lane after the admitter's last tick that ran, for each
    /// lane's share of the admission rate (DESIGN §8.5).
    lane_waiting: RwLock<Vec<u64>>,
    /// Counts the admitter's ticks: it moves on after each one (after the
    /// line record was read), and every open event stream wakes on it
    /// (DESIGN §8.8).
    ticks: watch::Sender<u64>,
    /// Event streams open on this route at this instance.
    event_streams: Arc<Mutex<OpenStreams>>,
    /// An adaptive route's capacity now (DESIGN §9.1), 0 on a fixed one:
    /// kept across reloads, which bring it into a changed range.
    capacity: AtomicU64,
    /// Why the capacity last changed, for `/routes`.
    capacity_why: Mutex<String>,
    /// The health window whose decision this instance last tried for.
    health_window: AtomicU64,
    /// The route's forwarded requests since the admitter last reported.
    health: Recorder,
    /// The last health window that ended, as the store added it up.
    last_window: Mutex<Option<WindowSummary>>,
    /// The route's turns at the origin (DESIGN §9.2), sized by
    /// `max_inflight` whenever settings are built.
    turns: Arc<Turns>,
}

/// A health window in a few numbers, for `/routes`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowSummary {
    pub requests: u64,
    /// 0 without requests.
    pub p95_ms: u64,
    /// The share (0 to 1) of failed requests.
    pub errors: f64,
}

/// The event streams open on a route at this instance: in all, and by
/// visitor. A visitor's entry goes when its last stream closes, so there
/// are never more entries than open streams.
#[derive(Debug, Default)]
struct OpenStreams {
    total: usize,
    by_visitor: HashMap<VisitorId, usize>,
}

/// One open event stream's place in its route's count and its visitor's,
/// given back when dropped.
#[derive(Debug)]
pub struct StreamSlot {
    open: Arc<Mutex<OpenStreams>>,
    visitor: VisitorId,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.total = open.total.saturating_sub(1);
        if let Entry::Occupied(mut mine) = open.by_visitor.entry(self.visitor) {
            *mine.get_mut() -= 1;
            if *mine.get() == 0 {
                mine.remove();
            }
        }
    }
}

/// Waiters out of the store's line, by when that was found, and when
/// entries older than `forget_after` were last dropped (at most once a
/// second, so marking many stays cheap).
#[derive(Debug, Default)]
struct OutOfLine {
    ids: HashMap<VisitorId, Instant>,
    pruned: Option<Instant>,
}

/// Waits of recent admissions, oldest first: at most [`RecentWaits::KEPT`],
/// none older than [`RecentWaits::WINDOW`].
#[derive(Debug, Default)]
struct RecentWaits {
    waits: std::collections::VecDeque<(Instant, f64)>,
}

impl RecentWaits {
    const KEPT: usize = 4096;
    const WINDOW: Duration = Duration::from_secs(300);

    fn note(&mut self, now: Instant, waited_s: f64) {
        if self.waits.len() == Self::KEPT {
            self.waits.pop_front();
        }
        self.waits.push_back((now, waited_s));
    }

    /// The median and 95th percentile of the waits within the window.
    fn percentiles(&mut self, now: Instant) -> Option<(f64, f64)> {
        while self
            .waits
            .front()
            .is_some_and(|&(at, _)| now.duration_since(at) > Self::WINDOW)
        {
            self.waits.pop_front();
        }
        let mut sorted: Vec<f64> = self.waits.iter().map(|&(_, w)| w).collect();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        (!sorted.is_empty()).then(|| (at(0.5), at(0.95)))
    }
}

/// A line record and when it was read.
#[derive(Debug)]
struct ReadRecord {
    record: LineRecord,
    at: Instant,
}

/// A place answered from the line record.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecordedPlace {
    /// Within the lane.
    pub position: u64,
    /// The lane's waiters.
    pub waiting_total: u64,
    /// The lane's share of the route's admission rate when the record was
    /// taken (see [`crate::queue::Lanes::share`]): its ETA is
    /// `eta_seconds(position, admit_rate * lane_share)`.
    pub lane_share: f64,
}

impl RouteLive {
    /// What this instance counts of the origin's answers to the route.
    pub fn health(&self) -> &Recorder {
        &self.health
    }

    /// Notes the health window that ended last (see [`WindowSummary`]).
    pub fn note_window(&self, window: &WindowCounts) {
        let summary = WindowSummary {
            requests: window.requests,
            p95_ms: window.p95().map_or(0, |p| p.as_millis() as u64),
            errors: window.error_share(),
        };
        *self
            .last_window
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(summary);
    }

    /// The health window that ended last, once one was reported.
    pub fn last_window(&self) -> Option<WindowSummary> {
        *self
            .last_window
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// An adaptive route's capacity now; 0 on a fixed one.
    pub fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Why an adaptive route's capacity last changed (empty: it did not).
    pub fn capacity_why(&self) -> String {
        self.capacity_why
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The adaptive capacity is now `capacity`, for `why` (empty: keep the
    /// reason known). Whether it changed.
    pub fn note_capacity(&self, capacity: u64, why: &str) -> bool {
        let before = self.capacity.swap(capacity, Ordering::Relaxed);
        if !why.is_empty() {
            let mut kept = self
                .capacity_why
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *kept != why {
                why.clone_into(&mut kept);
            }
        }
        before != capacity
    }

    /// Whether this instance has not yet tried to decide for health window
    /// `window`; notes that it has now.
    pub fn first_try_for(&self, window: u64) -> bool {
        self.health_window.swap(window, Ordering::Relaxed) != window
    }

    /// The route's turns at the origin (DESIGN §9.2).
    pub fn turns(&self) -> &Arc<Turns> {
        &self.turns
    }

    /// Remembers that the place (session or ticket) `id` ended at `now_s`,
    /// for as long as any of its cookies could be admitted or restored
    /// ([`Limits::end_memory`]).
    pub fn end(&self, id: &VisitorId, now_s: u64, limits: &Limits) {
        self.end_stored(&store_id(id), now_s, limits);
    }

    /// [`RouteLive::end`] for the id as the store names it.
    pub fn end_stored(&self, id: &StoreId, now_s: u64, limits: &Limits) {
        let until = now_s.saturating_add(limits.end_memory().as_secs());
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        let early = ended.forgotten_early;
        ended.remember(*id, now_s, until);
        if early == 0 && ended.forgotten_early > 0 {
            tracing::warn!(
                kept = ENDED_KEPT,
                "more places ended than an instance remembers: the earliest are forgotten first, \
                 and could be restored after a loss of the store"
            );
        }
        self.any_ended.store(true, Ordering::Release);
    }

    /// Whether the place `id` ended (as far as this instance knows) and its
    /// cookies may still be presented at `now_s`.
    pub fn has_ended(&self, id: &VisitorId, now_s: u64) -> bool {
        if !self.any_ended.load(Ordering::Acquire) {
            return false;
        }
        let ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        ended.contains(&store_id(id), now_s)
    }

    /// Remembers that the use counter `nonce` names (an invite's, or a
    /// lane cookie's for its first arrival) is used up, until it expires at
    /// `expires_s` (unix seconds).
    pub fn invite_used_up(&self, nonce: &[u8], now_s: u64, expires_s: u64) {
        if let Some(counter) = UseCounter::of(nonce) {
            self.used_up_invites
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remember(counter, now_s, expires_s);
        }
    }

    /// Whether the use counter `nonce` names was used up, as far as this
    /// instance knows.
    pub fn is_invite_used_up(&self, nonce: &[u8], now_s: u64) -> bool {
        UseCounter::of(nonce).is_some_and(|counter| {
            self.used_up_invites
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(&counter, now_s)
        })
    }

    /// The store's epoch (µs) as this instance last saw it; 0 before it saw
    /// any.
    pub fn epoch_us(&self) -> u64 {
        self.epoch_us.load(Ordering::Relaxed)
    }

    /// Notes the epoch the store answered a tick with: the store answered,
    /// so the local line no longer answers for it.
    pub fn note_store_ticked(&self, epoch_us: u64) {
        self.answered_locally.store(false, Ordering::Relaxed);
        self.epoch_us.store(epoch_us, Ordering::Relaxed);
    }

    /// Notes the numbers of a stats read. Only a tick moves a known epoch
    /// (it is what notices a loss): the stats' epoch is kept only while
    /// none was seen.
    pub fn note_stats(&self, stats: &RouteStats) {
        let _ =
            self.epoch_us
                .compare_exchange(0, stats.epoch_us, Ordering::Relaxed, Ordering::Relaxed);
        self.waiting.store(stats.waiting, Ordering::Relaxed);
        self.active.store(stats.active, Ordering::Relaxed);
        self.admit_rate_milli
            .store((stats.admit_rate * 1000.0) as u64, Ordering::Relaxed);
        self.admitted_total
            .store(stats.admitted_total, Ordering::Relaxed);
    }

    /// Everyone admitted since the epoch, at the last stats read (on a
    /// shared store, by every instance).
    pub fn admitted_total(&self) -> u64 {
        self.admitted_total.load(Ordering::Relaxed)
    }

    /// Notes the waits of a tick's admissions (see [`Tick::waits`]).
    pub fn note_waits(&self, tick: &Tick) {
        if tick.admitted_scores.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut waits = self.waits.lock().unwrap_or_else(PoisonError::into_inner);
        for (_, waited_s) in tick.waits() {
            waits.note(now, waited_s);
        }
    }

    /// The median and 95th percentile wait (seconds) of the admissions
    /// this instance's ticks made in the last five minutes; `None` without
    /// any.
    pub fn wait_percentiles(&self) -> Option<(f64, f64)> {
        self.waits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .percentiles(Instant::now())
    }

    /// People in line, at the last stats read.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Active sessions, at the last stats read.
    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    /// Notes that the local line admitted someone the store has not heard of.
    pub fn note_granted_locally(&self) {
        self.granted_locally.store(true, Ordering::Relaxed);
    }

    /// Whether the local line admitted someone since the store last heard
    /// of it.
    pub fn granted_locally(&self) -> bool {
        self.granted_locally.load(Ordering::Relaxed)
    }

    /// Notes that the store heard of the local line's admissions (it holds
    /// admissions for them).
    pub fn note_store_holds_local_grants(&self) {
        self.granted_locally.store(false, Ordering::Relaxed);
    }

    /// Notes that the local line answered for the store on this route.
    pub fn note_answered_locally(&self) {
        self.answered_locally.store(true, Ordering::Relaxed);
    }

    /// Whether the local line answered for this route since the admitter
    /// last reached the store.
    pub fn answered_locally(&self) -> bool {
        self.answered_locally.load(Ordering::Relaxed)
    }

    /// Arrivals waiting for this instance's next arrive call.
    pub fn joins(&self) -> &Arc<JoinQueue> {
        &self.joins
    }

    /// The store's epoch as this instance last saw it; `None` before it saw
    /// any. Passed with ticks and arrivals, so a changed epoch is noticed as a
    /// lost store.
    pub fn known_epoch_us(&self) -> Option<u64> {
        match self.epoch_us.load(Ordering::Relaxed) {
            0 => None,
            e => Some(e),
        }
    }

    /// Keeps the line record the admitter just read; `None`: the store has
    /// none (a new epoch), so every poll goes to the store.
    pub fn set_record(&self, record: Option<LineRecord>) {
        self.record.store(record.map(|record| {
            Arc::new(ReadRecord {
                record,
                at: Instant::now(),
            })
        }));
    }

    /// The place of waiter `id` who joined lane `lane` at `score_us`, from
    /// a line record read less than `fresh_for` ago; `None` when the store
    /// must answer (no fresh record, a lane the record lacks, a place at the
    /// head of the lane, a ticket the record cannot place, or a waiter a
    /// flush found out of line). The lane's share of admissions is reckoned
    /// with the weights of `lanes`.
    pub fn place_from_record(
        &self,
        id: &VisitorId,
        lane: &str,
        score_us: u64,
        fresh_for: Duration,
        lanes: &Lanes,
    ) -> Option<RecordedPlace> {
        let read = self.record.load();
        let read = read.as_ref()?;
        if read.at.elapsed() > fresh_for {
            return None;
        }
        let position = read.record.position(lane, score_us)?;
        if self.is_out_of_line(id) {
            return None;
        }
        let waiting: Vec<u64> = lanes
            .iter()
            .map(|l| read.record.lane(&l.name).map_or(0, |r| r.waiting))
            .collect();
        let share = lanes.share(lanes.index_of(lane).unwrap_or(0), &waiting);
        Some(RecordedPlace {
            position,
            waiting_total: read.record.lane(lane).map_or(0, |r| r.waiting),
            lane_share: share,
        })
    }

    /// A waiter answered from the record is to count as polled in the
    /// store at the next flush.
    pub fn heartbeat(&self, beat: Heartbeat) {
        self.heartbeats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(beat);
    }

    /// The heartbeats gathered since the last call.
    pub fn take_heartbeats(&self) -> Vec<Heartbeat> {
        std::mem::take(
            &mut *self
                .heartbeats
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// `ids` are not in the store's line (a flush said so, or they left
    /// here): until the store answers one of their polls, or `forget_after`
    /// passes, the record does not answer for them.
    pub fn out_of_line(&self, ids: impl IntoIterator<Item = VisitorId>, forget_after: Duration) {
        let mut out = self
            .out_of_line
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if out
            .pruned
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
        {
            out.pruned = Some(now);
            out.ids
                .retain(|_, at| now.duration_since(*at) < forget_after);
        }
        out.ids.extend(ids.into_iter().map(|id| (id, now)));
        self.any_out_of_line
            .store(!out.ids.is_empty(), Ordering::Release);
    }

    /// Whether a flush found `id` out of the store's line (see
    /// [`RouteLive::out_of_line`]) and the store has not answered it since.
    pub fn is_out_of_line(&self, id: &VisitorId) -> bool {
        self.any_out_of_line.load(Ordering::Acquire)
            && self
                .out_of_line
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .ids
                .contains_key(id)
    }

    /// The store answered a poll of `id`: the record may answer for it
    /// again.
    pub fn polled_in_store(&self, id: &VisitorId) {
        if self.any_out_of_line.load(Ordering::Acquire)
            && self
                .out_of_line
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .ids
                .contains_key(id)
        {
            self.out_of_line
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .ids
                .remove(id);
        }
    }

    /// The admitter finished a tick (and read the line record, on a
    /// shared store): open event streams look again.
    pub fn ticked(&self) {
        self.ticks.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// What an event stream waits on for the next tick.
    pub fn ticks(&self) -> watch::Receiver<u64> {
        self.ticks.subscribe()
    }

    /// A place for one more event stream of `visitor`, unless `max` are
    /// open on the route already, or `max_per_visitor` of the visitor's;
    /// the error names the cap that was reached (the route's when both
    /// were).
    pub fn open_stream(
        &self,
        visitor: VisitorId,
        max: usize,
        max_per_visitor: usize,
    ) -> Result<StreamSlot, StreamCap> {
        let mut open = self
            .event_streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if open.total >= max {
            return Err(StreamCap::Route);
        }
        let mine = open.by_visitor.get(&visitor).copied().unwrap_or(0);
        if mine >= max_per_visitor {
            return Err(StreamCap::Visitor);
        }
        open.total += 1;
        open.by_visitor.insert(visitor, mine + 1);
        Ok(StreamSlot {
            open: self.event_streams.clone(),
            visitor,
        })
    }

    /// Event streams open on this route at this instance.
    pub fn event_streams(&self) -> usize {
        self.event_streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }

    /// Visitors with an event stream open on this route at this instance.
    pub fn event_stream_visitors(&self) -> usize {
        self.event_streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_visitor
            .len()
    }

    /// Waiters per lane after the last tick that ran (empty before one).
    pub fn lane_waiting(&self) -> Vec<u64> {
        self.lane_waiting
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records the waiters per lane a tick left.
    pub fn set_lane_waiting(&self, waiting: &[u64]) {
        let mut kept = self
            .lane_waiting
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        kept.clear();
        kept.extend_from_slice(waiting);
    }

    /// Admissions per second measured by the store.
    pub fn admit_rate(&self) -> f64 {
        self.admit_rate_milli.load(Ordering::Relaxed) as f64 / 1000.0
    }

    /// Estimated seconds until `position` is admitted at the measured rate
    /// (see [`eta_seconds`]).
    pub fn eta_seconds(&self, position: u64) -> Option<u64> {
        eta_seconds(position, self.admit_rate())
    }
}

/// Estimated seconds until the waiter at 1-based `position` is admitted, at
/// `admit_rate` admissions per second: `None` while there is no rate to go
/// by, `0` for nobody (position 0).
pub fn eta_seconds(position: u64, admit_rate: f64) -> Option<u64> {
    if position == 0 {
        return Some(0);
    }
    (admit_rate > 0.0).then(|| (position as f64 / admit_rate).ceil() as u64)
}

/// How long after a route's opening an instance's local line admits nobody
/// at once: the store may be busy shuffling the pre-queue (a second for
/// 100,000 waiters), and a local line that cannot see the pre-queue would
/// let a latecomer in ahead of it. Latecomers wait in the local line
/// instead, behind the pre-queue waiters whose polls it takes in at their
/// drawn scores.
pub const OPENING_SETTLE: Duration = Duration::from_secs(60);

/// A route ready for requests: its config, the store limits derived from it,
/// its cookie names and its live numbers.
#[derive(Clone, Debug)]
pub struct RouteRt {
    /// The route as it runs: the file's, with any runtime override laid over
    /// it (see [`RouteRt::overridden`]).
    pub cfg: config::Route,
    /// The runtime override laid over the file's mode and capacity (DESIGN
    /// §9.4), the fields that still hold against the file.
    pub overridden: Option<Override>,
    /// What the config file says of the fields an override may change.
    pub file_mode: config::Mode,
    pub file_capacity: u64,
    pub limits: Limits,
    /// Limits of the in-process line used while the store is down
    /// (`local`): this instance's share of the capacity. See
    /// [`RouteRt::local_limits_now`].
    pub local_limits: Limits,
    cookie_plain: String,
    cookie_tls: String,
    lane_cookie_plain: String,
    lane_cookie_tls: String,
    /// `match.path_prefix` and `exit_paths` as request paths are compared
    /// with them: lower-cased on a `case_insensitive` route (see
    /// [`RouteRt::compared`]).
    prefix: Option<String>,
    exit_prefixes: Vec<String>,
    pub live: Arc<RouteLive>,
    /// `store.expected_instances`, at least 1: the local line's share.
    expected_instances: u64,
    /// The route's own waiting page template, if it has one.
    pub template: Option<Arc<Template>>,
    /// The route's metric handles.
    pub metrics: RouteMetrics,
    /// The route's micro-cache, if it has one (DESIGN §9.3).
    pub cache: Option<Arc<Scope>>,
}

impl RouteRt {
    pub fn new(
        file: config::Route,
        overridden: Option<&Override>,
        cookie: &config::CookieConfig,
        expected_instances: u64,
        live: Arc<RouteLive>,
        template: Option<Arc<Template>>,
        metrics: RouteMetrics,
    ) -> RouteRt {
        let overridden = overridden.and_then(|o| o.holding(file.mode, file.capacity));
        let (file_mode, file_capacity) = (file.mode, file.capacity);
        let mut cfg = file;
        if let Some(o) = &overridden {
            // As if the file said it: the same road a reload takes.
            cfg.mode = o.mode.map_or(cfg.mode, |held| held.value);
            if let Some(held) = o.capacity {
                // A plain number: adapting is off while it holds (§9.1).
                cfg.capacity = held.value;
                cfg.adapt = None;
            }
        }
        let limits = Limits {
            capacity: cfg.capacity,
            max_admit_per_tick: cfg.max_admit_per_tick,
            tick: cfg.tick,
            session_ttl: cfg.session_ttl,
            pass_ttl: cfg.pass_ttl,
            arrival_grace: cfg.arrival_grace,
            abandon_after: cfg.abandon_after,
            max_waiting: cfg.max_waiting,
            confirm_within: cfg.confirm_within,
            client_places: cfg.client_limits.places,
            client_joins_per_minute: cfg.client_limits.joins_per_minute,
            lanes: cfg.lanes.clone(),
            opens_at_us: cfg.opens_at.map(|t| t.unix_us()),
            shards: cfg.shards,
        };
        let mut limits = limits;
        if let Some(adapt) = &cfg.adapt {
            // Where the route stood, brought into the range (DESIGN §9.1:
            // a reload keeps a number that lies inside); else `start`.
            let now = match live.capacity() {
                0 => cfg.capacity,
                kept => kept.clamp(adapt.min, adapt.max),
            };
            live.note_capacity(now, "");
            limits.capacity = now;
        } else {
            live.note_capacity(0, "");
        }
        let mut local_limits = limits.clone();
        local_limits.capacity = (cfg.capacity / expected_instances.max(1)).max(1);
        let expected_instances = expected_instances.max(1);
        let (cookie_plain, cookie_tls) = cookie::names(&cfg.name, cookie.domain.is_some());
        let (lane_cookie_plain, lane_cookie_tls) =
            cookie::lane_names(&cfg.name, cookie.domain.is_some());
        let fold = |p: &String| {
            if cfg.matcher.case_insensitive {
                p.to_ascii_lowercase()
            } else {
                p.clone()
            }
        };
        let prefix = cfg.matcher.path_prefix.as_ref().map(fold);
        let exit_prefixes = cfg.exit_paths.iter().map(fold).collect();
        RouteRt {
            cfg,
            overridden,
            file_mode,
            file_capacity,
            limits,
            local_limits,
            cookie_plain,
            cookie_tls,
            lane_cookie_plain,
            lane_cookie_tls,
            prefix,
            exit_prefixes,
            live,
            expected_instances,
            template,
            metrics,
            cache: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// The route's opening (unix µs) while it is still ahead at `now_us`
    /// (DESIGN §8.7): arrivals until then get pre-queue tickets.
    pub fn opening_ahead(&self, now_us: u64) -> Option<u64> {
        self.limits
            .opens_at_us
            .filter(|&opens_at_us| now_us < opens_at_us)
    }

    /// Whether the route opened less than [`OPENING_SETTLE`] before `now_us`:
    /// the local line then lets nobody in at once (see `Gate::arrive`).
    pub fn just_opened(&self, now_us: u64) -> bool {
        self.limits.opens_at_us.is_some_and(|opens_at_us| {
            (opens_at_us..opens_at_us + OPENING_SETTLE.as_micros() as u64).contains(&now_us)
        })
    }

    /// Whether the route's `closes_at` has come at `now_us`: from then on it
    /// answers as a `closed` route does.
    pub fn closed_at(&self, now_us: u64) -> bool {
        self.cfg
            .closes_at
            .is_some_and(|closes_at| now_us >= closes_at.unix_us())
    }

    /// The limits of the in-process line right now: this instance's share
    /// of the capacity, less its share of the sessions the store had
    /// admitted at its last stats read. Those visitors keep their passes
    /// while the store is down (they are renewed locally), so counting them
    /// keeps the origin within capacity during an outage instead of letting
    /// a full room's worth in again.
    pub fn local_limits_now(&self) -> Limits {
        let active = self.live.active();
        let capacity = self.capacity_now();
        let mine = (capacity / self.expected_instances).max(1);
        let share = active.saturating_mul(mine) / capacity.max(1);
        Limits {
            capacity: mine.saturating_sub(share),
            ..self.local_limits.clone()
        }
    }

    /// The capacity the route admits by now: the configured one (or an
    /// override's, DESIGN §9.4), or where an adaptive one stands (DESIGN
    /// §9.1). The one figure the admin listener shows as capacity.
    pub fn capacity_now(&self) -> u64 {
        match self.cfg.adapt {
            Some(_) => self.live.capacity().max(1),
            None => self.limits.capacity,
        }
    }

    /// The route's limits with the capacity it admits by now: for the store
    /// calls capacity matters to (arrivals, renewals, ticks). Borrowed on a
    /// fixed route.
    pub fn limits_now(&self) -> Cow<'_, Limits> {
        let capacity = self.capacity_now();
        if capacity == self.limits.capacity {
            return Cow::Borrowed(&self.limits);
        }
        Cow::Owned(Limits {
            capacity,
            ..self.limits.clone()
        })
    }

    /// The cookie name for a request over TLS or not.
    pub fn cookie_name(&self, tls: bool) -> &str {
        if tls {
            &self.cookie_tls
        } else {
            &self.cookie_plain
        }
    }

    /// The lane cookie's name for a request over TLS or not (DESIGN §8.5).
    pub fn lane_cookie_name(&self, tls: bool) -> &str {
        if tls {
            &self.lane_cookie_tls
        } else {
            &self.lane_cookie_plain
        }
    }

    /// The index of the lane a ticket or cookie names: a lane the route no
    /// longer has is merged into its first (DESIGN §8.5), and a ticket that
    /// names none waits in `main` when the route has it, else in the first.
    pub fn lane_index(&self, lane: Option<&LaneTag>) -> usize {
        let lanes = &self.limits.lanes;
        let name = lane.map_or(MAIN_LANE, LaneTag::as_str);
        lanes.index_of(name).unwrap_or(0)
    }

    /// The lane at `index` as a ticket carries it: `None` on a route with
    /// one lane, whose tickets stay as they were before lanes.
    pub fn lane_tag(&self, index: usize) -> Option<LaneTag> {
        let lanes = &self.limits.lanes;
        (lanes.len() > 1).then(|| LaneTag::new(&lanes.get(index).name))?
    }

    /// Estimated seconds until `position` in lane `lane` is admitted: the
    /// route's measured rate times the lane's share of it (its weight over
    /// those of the lanes that had waiters at the last tick).
    pub fn eta_in_lane(&self, position: u64, lane: usize) -> Option<u64> {
        let lanes = &self.limits.lanes;
        if lanes.len() == 1 {
            return self.live.eta_seconds(position);
        }
        let waiting = self.live.lane_waiting();
        let share = lanes.share(lane, &waiting);
        eta_seconds(position, self.live.admit_rate() * share)
    }

    /// Whether the route counts each session's forwarded requests
    /// (`max_requests_per_session`, on a route that admits by passes).
    pub fn counts_requests(&self) -> bool {
        self.cfg.max_requests_per_session.is_some()
            && matches!(self.cfg.mode, config::Mode::Gate | config::Mode::QueueAll)
    }

    /// Whether a request to this route for any of `readings` is for one of
    /// its `exit_paths` (DESIGN §8.6): matched as the route's own prefix
    /// is, on a segment boundary and with its `case_insensitive`, against
    /// every reading of the path an origin could make.
    pub fn is_exit(&self, readings: &path::Readings<'_>) -> bool {
        if self.exit_prefixes.is_empty() {
            return false;
        }
        readings.iter().any(|p| {
            let p = self.compared(p);
            self.exit_prefixes
                .iter()
                .any(|exit| path::prefix_matches(&p, exit))
        })
    }

    /// `path` as this route's prefixes are compared with it.
    fn compared<'a>(&self, path: &'a str) -> Cow<'a, str> {
        if self.cfg.matcher.case_insensitive {
            Cow::Owned(path.to_ascii_lowercase())
        } else {
            Cow::Borrowed(path)
        }
    }

    fn matches(&self, host: Option<&str>, path: &str) -> bool {
        let m = &self.cfg.matcher;
        if let Some(want) = &m.host {
            match host {
                Some(h) if h.eq_ignore_ascii_case(want) => {}
                _ => return false,
            }
        }
        match &self.prefix {
            None => true,
            Some(prefix) => path::prefix_matches(&self.compared(path), prefix),
        }
    }
}

/// Where the readings of a request's path take it ([`Settings::place`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placing {
    /// Every reading is bypassed.
    pub bypassed: bool,
    /// The first route a reading matches.
    pub route: Option<usize>,
    /// Two readings are in different places, each a bypass or a route: the
    /// readings disagree about where the path is. A reading in neither
    /// disagrees with none (`/tickets;x=1` is `/tickets` to Java, nowhere
    /// to others: gated, not disputed).
    pub disputed: bool,
    /// Two readings are in two different routes: no one route's pass can
    /// stand for both.
    pub split: bool,
}

/// Where one reading is, when it is somewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Bypass,
    Route(usize),
}

/// Everything the gate reads per request that a config reload replaces.
pub struct Settings {
    /// The config file these settings were built from (before overrides).
    pub file: Arc<Config>,
    /// Every micro-cache of the process, for settings built from these.
    caches: Arc<Caches>,
    pub routes: Vec<RouteRt>,
    pub bypass: Vec<BypassRule>,
    /// The micro-cache of each bypass rule (DESIGN §9.3), by the rule's
    /// index; empty when no rule has one.
    bypass_caches: Vec<Option<Arc<Scope>>>,
    pub ring: KeyRing,
    pub reserved_prefix: String,
    pub cookie_domain: Option<String>,
    /// Different for every `Settings` the process builds (see
    /// [`Settings::next_generation`]): what a [`CookieMemo`] read under one
    /// key ring is not reused under another.
    pub generation: u64,
}

impl Settings {
    /// Compiles the config into request-time settings, keeping each
    /// surviving route's live numbers from `lives` and each surviving
    /// micro-cache from `caches` (which drops the caches the config no
    /// longer has), and laying each route's override in `overrides` over
    /// it (the fields that still hold against the file, see
    /// [`Override::holding`]).
    pub fn new(
        config: &Config,
        ring: KeyRing,
        lives: &HashMap<String, Arc<RouteLive>>,
        metrics: &Metrics,
        caches: &Arc<Caches>,
        overrides: &HashMap<String, Override>,
    ) -> Settings {
        let mut routes = Vec::with_capacity(config.routes.len());
        let mut cached: Vec<String> = Vec::new();
        for r in &config.routes {
            let live: Arc<RouteLive> = lives.get(&r.name).cloned().unwrap_or_default();
            live.turns().resize(r.max_inflight);
            let template = r.page.template.as_ref().map(|t| t.template.clone());
            let route_metrics = metrics.route(&r.name);
            route_metrics.lanes_at_zero(&r.lanes);
            let mut route = RouteRt::new(
                r.clone(),
                overrides.get(&r.name),
                &config.cookie,
                config.store.expected_instances,
                live,
                template,
                route_metrics,
            );
            route
                .metrics
                .capacity(route.cfg.capacity, route.limits.capacity);
            route.cache = r.cache.map(|cfg| caches.scope(&r.name, &cfg, metrics));
            cached.extend(r.cache.map(|_| r.name.clone()));
            routes.push(route);
        }
        let mut bypass_caches: Vec<Option<Arc<Scope>>> = config
            .bypass
            .iter()
            .map(|b| {
                let name = format!("bypass:{}", b.rule.describe());
                let scope = b.cache.map(|cfg| caches.scope(&name, &cfg, metrics));
                cached.extend(scope.is_some().then_some(name));
                scope
            })
            .collect();
        if bypass_caches.iter().all(Option::is_none) {
            bypass_caches.clear();
        }
        caches.retain(
            &cached.iter().map(String::as_str).collect::<Vec<_>>(),
            metrics,
        );
        Settings {
            file: Arc::new(config.clone()),
            caches: caches.clone(),
            generation: Settings::next_generation(),
            routes,
            bypass: config.bypass.iter().map(|b| b.rule.clone()).collect(),
            bypass_caches,
            ring,
            reserved_prefix: config.reserved_prefix.clone(),
            cookie_domain: config.cookie.domain.clone(),
        }
    }

    /// The overrides laid over the routes, by route name.
    pub fn overrides(&self) -> HashMap<String, Override> {
        self.routes
            .iter()
            .filter_map(|r| Some((r.name().to_owned(), r.overridden.clone()?)))
            .collect()
    }

    /// These settings with route `name`'s override replaced by `value`
    /// (`None`: the file's word alone), built as a reload builds them.
    pub fn with_override(
        &self,
        name: &str,
        value: Option<Override>,
        metrics: &Metrics,
    ) -> Settings {
        let lives: HashMap<_, _> = self
            .routes
            .iter()
            .map(|r| (r.name().to_owned(), r.live.clone()))
            .collect();
        let mut overrides = self.overrides();
        match value {
            Some(value) => overrides.insert(name.to_owned(), value),
            None => overrides.remove(name),
        };
        Settings::new(
            &self.file,
            self.ring.clone(),
            &lives,
            metrics,
            &self.caches,
            &overrides,
        )
    }

    /// A generation number no earlier `Settings` of this process had.
    pub fn next_generation() -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether a bypass rule lets the request through at once.
    pub fn bypassed(&self, method: &Method, path: &str) -> bool {
        self.bypass_rule(method, path).is_some()
    }

    /// The first bypass rule that lets the request through, by index.
    fn bypass_rule(&self, method: &Method, path: &str) -> Option<usize> {
        self.bypass.iter().position(|rule| match rule {
            BypassRule::Method(m) => m == method,
            BypassRule::Path(p) => p == path,
            BypassRule::PathPrefix(p) => path::prefix_matches(path, p),
        })
    }

    /// The micro-cache of the bypass rule that lets a request for `path`
    /// through (the first that does), if it has one.
    pub fn bypass_cache(&self, method: &Method, path: &str) -> Option<&Arc<Scope>> {
        if self.bypass_caches.is_empty() {
            return None;
        }
        let rule = self.bypass_rule(method, path)?;
        self.bypass_caches.get(rule)?.as_ref()
    }

    /// The first route whose match fits, by index.
    pub fn route_for(&self, host: Option<&str>, path: &str) -> Option<usize> {
        self.routes.iter().position(|r| r.matches(host, path))
    }

    /// Where the readings of a request's path take it (DESIGN §1 steps
    /// 2–3, §8.1, §9.6): bypassed if every reading is, otherwise the
    /// first route any reading matches, and whether the readings disagree.
    pub fn place(
        &self,
        method: &Method,
        host: Option<&str>,
        readings: &path::Readings<'_>,
    ) -> Placing {
        let mut placing = Placing {
            bypassed: true,
            route: None,
            disputed: false,
            split: false,
        };
        // The place of the first reading that is somewhere, and the first
        // route a reading that is not bypassed is in.
        let mut first: Option<Place> = None;
        let mut gated: Option<usize> = None;
        for p in readings.iter() {
            let bypassed = self.bypassed(method, p);
            placing.bypassed &= bypassed;
            if bypassed && readings.is_single() && !readings.is_ambiguous() {
                // An ordinary bypassed path: no route to look for.
                return placing;
            }
            let route = self.route_for(host, p);
            placing.route = placing.route.or(route);
            let place = match (bypassed, route) {
                (true, _) => Place::Bypass,
                (false, Some(index)) => Place::Route(index),
                (false, None) => continue,
            };
            placing.disputed |= first.is_some_and(|first| first != place);
            first = first.or(Some(place));
            if let Place::Route(index) = place {
                placing.split |= gated.is_some_and(|gated| gated != index);
                gated = gated.or(Some(index));
            }
        }
        placing
    }

    /// The route named `name`.
    pub fn route_named(&self, name: &str) -> Option<usize> {
        self.routes.iter().position(|r| r.name() == name)
    }

    /// Whether `path` is one of queuegate's own (the reserved prefix or below).
    pub fn is_reserved(&self, path: &str) -> bool {
        path::prefix_matches(path, &self.reserved_prefix)
    }

    /// The credentials a request carries for route `index`, remembered in
    /// the connection's `memo` (see [`CookieMemo`]).
    pub fn credentials(
        &self,
        index: usize,
        headers: &impl Headers,
        tls: bool,
        memo: &CookieMemo,
    ) -> Credentials {
        let route = &self.routes[index];
        memo.read(self.generation, index, tls, headers, || {
            cookie::credentials(
                headers,
                route.cookie_name(tls),
                route.lane_cookie_name(tls),
                &self.ring,
                route.name(),
            )
        })
    }

    /// What builds `Set-Cookie` values: the key ring and the cookie domain.
    pub fn jar(&self) -> cookie::Jar<'_> {
        cookie::Jar::new(&self.ring, self.cookie_domain.as_deref())
    }

    /// A `Set-Cookie` value that removes `route`'s cookie.
    pub fn clear_cookie(&self, route: &RouteRt, tls: bool) -> HeaderValue {
        self.jar().clear(route.cookie_name(tls), tls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settings with `/tickets` and `/elsewhere` gated and `/static/`
    /// bypassed.
    fn placing_settings() -> Settings {
        let config = Config::from_yaml(
            "listen: [{ addr: 127.0.0.1:8080 }]\n\
             upstream: { url: http://127.0.0.1:3000 }\n\
             keys: [{ id: k1, env: QUEUEGATE_KEY_K1 }]\n\
             bypass: [{ path_prefix: /static/ }]\n\
             routes:\n\
             \x20 - { name: tickets, match: { path_prefix: /tickets }, capacity: 1 }\n\
             \x20 - { name: elsewhere, match: { path_prefix: /elsewhere }, capacity: 1 }\n",
        )
        .expect("a valid config");
        let ring = KeyRing::new(vec![("k1".into(), vec![7; 32])]).expect("a key ring");
        let metrics = Metrics::new();
        let caches = Arc::new(Caches::new(config.limits.cache_bytes, &metrics));
        Settings::new(
            &config,
            ring,
            &HashMap::new(),
            &metrics,
            &caches,
            &HashMap::new(),
        )
    }

    /// Settings for one route `tickets` of `capacity` (YAML), keeping the
    /// live numbers in `lives`.
    fn capacity_settings(capacity: &str, lives: &HashMap<String, Arc<RouteLive>>) -> Settings {
        let config = Config::from_yaml(&format!(
            "listen: [{{ addr: 127.0.0.1:8080 }}]\n\
             upstream: {{ url: http://127.0.0.1:3000 }}\n\
             keys: [{{ id: k1, env: QUEUEGATE_KEY_K1 }}]\n\
             routes:\n\
             \x20 - {{ name: tickets, match: {{ path_prefix: /tickets }}, capacity: {capacity} }}\n"
        ))
        .expect("a valid config");
        let ring = KeyRing::new(vec![("k1".into(), vec![7; 32])]).expect("a key ring");
        let metrics = Metrics::new();
        let caches = Arc::new(Caches::new(config.limits.cache_bytes, &metrics));
        Settings::new(&config, ring, lives, &metrics, &caches, &HashMap::new())
    }

    #[test]
    fn a_reload_keeps_an_adaptive_capacity_inside_the_new_range_and_a_number_turns_it_off() {
        let first = capacity_settings("{ min: 10, max: 100, start: 50 }", &HashMap::new());
        let route = &first.routes[0];
        assert_eq!(
            (route.capacity_now(), route.limits_now().capacity),
            (50, 50)
        );
        route.live.note_capacity(30, "p95 over");
        assert_eq!(route.limits_now().capacity, 30);
        assert_eq!(route.local_limits_now().capacity, 30);
        let lives = HashMap::from([("tickets".to_owned(), route.live.clone())]);

        // 30 lies inside the new range: kept.
        let inside = capacity_settings("{ min: 20, max: 200, start: 150 }", &lives);
        assert_eq!(inside.routes[0].capacity_now(), 30);
        // Outside: brought to the nearest end.
        let above = capacity_settings("{ min: 40, max: 200, start: 150 }", &lives);
        assert_eq!(above.routes[0].capacity_now(), 40);
        // A number: fixed again, and adapting off.
        let fixed = capacity_settings("70", &lives);
        assert_eq!(fixed.routes[0].capacity_now(), 70);
        assert_eq!(fixed.routes[0].live.capacity(), 0);
        // A range after that starts again at its start.
        let again = capacity_settings("{ min: 20, max: 200, start: 150 }", &lives);
        assert_eq!(again.routes[0].capacity_now(), 150);
    }

    #[test]
    fn an_override_is_laid_over_the_file_and_a_capacity_turns_adapting_off() {
        use crate::queue::Held;
        let config = Config::from_yaml(
            "listen: [{ addr: 127.0.0.1:8080 }]\n\
             upstream: { url: http://127.0.0.1:3000 }\n\
             keys: [{ id: k1, env: QUEUEGATE_KEY_K1 }]\n\
             routes:\n\
             \x20 - name: tickets\n\
             \x20   match: { path_prefix: /tickets }\n\
             \x20   capacity: { min: 2, max: 50, start: 10, target: { p95: 800ms, errors: 2% } }\n",
        )
        .expect("a valid config");
        let ring = KeyRing::new(vec![("k1".into(), vec![7; 32])]).expect("a key ring");
        let metrics = Metrics::new();
        let caches = Arc::new(Caches::new(config.limits.cache_bytes, &metrics));
        let s = Settings::new(
            &config,
            ring,
            &HashMap::new(),
            &metrics,
            &caches,
            &HashMap::new(),
        );
        assert!(s.routes[0].cfg.adapt.is_some());
        assert_eq!(s.routes[0].capacity_now(), 10);
        let closed = Override {
            mode: Some(Held {
                value: config::Mode::Closed,
                file: config::Mode::Gate,
            }),
            capacity: None,
            by: "ops".into(),
            at_ms: 1,
        };
        let s = s.with_override("tickets", Some(closed.clone()), &metrics);
        let route = &s.routes[0];
        assert_eq!(route.cfg.mode, config::Mode::Closed);
        assert!(
            route.cfg.adapt.is_some(),
            "a mode override leaves adapting on"
        );
        let fixed = Override {
            capacity: Some(Held {
                value: 40,
                file: 10,
            }),
            ..closed
        };
        let s = s.with_override("tickets", Some(fixed), &metrics);
        let route = &s.routes[0];
        assert_eq!(
            (route.capacity_now(), route.cfg.adapt.is_none()),
            (40, true)
        );
        assert_eq!(
            (route.file_mode, route.file_capacity),
            (config::Mode::Gate, 10)
        );
        let s = s.with_override("tickets", None, &metrics);
        assert_eq!(s.routes[0].cfg.mode, config::Mode::Gate);
        assert!(s.routes[0].cfg.adapt.is_some() && s.routes[0].overridden.is_none());
    }

    #[test]
    fn readings_in_two_places_are_disputed_and_in_two_routes_split() {
        let s = placing_settings();
        let place = |raw: &str| s.place(&Method::GET, None, &path::Readings::of(raw));
        let p = place("/static/app.css");
        assert!(p.bypassed && !p.disputed, "{p:?}");
        // `/tickets` to Java, no route to others: gated, not disputed.
        let p = place("/tickets;x=1");
        assert_eq!((p.route, p.disputed), (Some(0), false), "{p:?}");
        // A bypass to one reading, `/tickets` to another.
        let p = place("/static/..;/tickets");
        assert!(!p.bypassed && p.disputed && !p.split, "{p:?}");
        assert_eq!(p.route, Some(0));
        // `/elsewhere` to one reading, `/tickets` to another.
        let p = place("/elsewhere/..;/tickets");
        assert!(p.disputed && p.split, "{p:?}");
        // A bypass first, then two routes: `..%3b` is a name to one
        // reading (`/elsewhere/..%3b/tickets`), `..` to another.
        let p = place("/static/..;/elsewhere/..%3b/tickets");
        assert!(p.disputed && p.split, "{p:?}");
    }

    #[test]
    fn event_streams_stop_at_the_cap_and_give_their_places_back() {
        let live = RouteLive::default();
        let first = live.open_stream([1; 16], 2, 4).expect("room for one");
        let second = live.open_stream([2; 16], 2, 4).expect("room for two");
        assert_eq!(
            live.open_stream([3; 16], 2, 4).err(),
            Some(StreamCap::Route)
        );
        assert_eq!(live.event_streams(), 2);
        drop(first);
        assert_eq!(live.event_streams(), 1);
        let third = live.open_stream([3; 16], 2, 4).expect("a place given back");
        assert_eq!(
            live.open_stream([4; 16], 0, 4).err(),
            Some(StreamCap::Route)
        );
        drop((second, third));
        assert_eq!(live.event_streams(), 0);
    }

    #[test]
    fn a_visitor_stops_at_its_cap_and_leaves_no_entry_behind() {
        let live = RouteLive::default();
        let (me, other) = ([7; 16], [8; 16]);
        let mut mine: Vec<_> = (0..3)
            .map(|_| live.open_stream(me, 10, 3).expect("under the cap"))
            .collect();
        assert_eq!(live.open_stream(me, 10, 3).err(), Some(StreamCap::Visitor));
        let theirs = live.open_stream(other, 10, 3).expect("another visitor");
        assert_eq!((live.event_streams(), live.event_stream_visitors()), (4, 2));

        mine.pop();
        mine.push(live.open_stream(me, 10, 3).expect("a place given back"));
        // Both caps reached: the route's is named.
        assert_eq!(live.open_stream(me, 4, 3).err(), Some(StreamCap::Route));

        drop(mine);
        assert_eq!((live.event_streams(), live.event_stream_visitors()), (1, 1));
        drop(theirs);
        assert_eq!((live.event_streams(), live.event_stream_visitors()), (0, 0));
        // Refused opens leave nothing either.
        assert!(live.open_stream(me, 10, 0).is_err());
        assert_eq!(live.event_stream_visitors(), 0);
    }

    #[test]
    fn a_tick_wakes_those_waiting_on_it() {
        let live = RouteLive::default();
        let mut ticks = live.ticks();
        assert!(!ticks.has_changed().unwrap());
        live.ticked();
        live.ticked();
        assert!(ticks.has_changed().unwrap());
        ticks.borrow_and_update();
        assert!(!ticks.has_changed().unwrap());
    }

    #[test]
    fn eta_is_whole_seconds_at_the_measured_rate() {
        assert_eq!(eta_seconds(0, 0.0), Some(0));
        assert_eq!(eta_seconds(5, 0.0), None);
        assert_eq!(eta_seconds(5, 2.0), Some(3));
        assert_eq!(eta_seconds(4, 2.0), Some(2));
    }
}
