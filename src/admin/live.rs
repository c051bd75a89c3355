//! The live view's figures (DESIGN §9.4): each route's numbers as JSON (the
//! same for `/routes` and the pushed updates), a sample each second kept in
//! a ring of the last 15 minutes per route (so a page opened late draws the
//! whole chart), and `GET /events`, the Server-Sent Events stream that
//! pushes them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;

use serde_json::{json, Value};
use tokio::sync::watch;

use crate::clock::Clock;
use crate::gate::Gate;
use crate::message::Answer;
use crate::queue::QueueStore;
use crate::response::{self, Body, Pieces};
use crate::route::{self, RouteRt, Settings};

/// How often a sample is taken and pushed.
pub const EVERY: Duration = Duration::from_secs(1);

/// Samples kept per route: 15 minutes at one a second.
pub const KEPT: usize = 900;

/// One second of a route: when (unix ms), the line's length, the capacity
/// and the admissions per second since the sample before.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub at_ms: u64,
    pub waiting: u64,
    pub capacity: u64,
    pub admitted_per_s: f64,
}

impl Sample {
    fn json(&self) -> Value {
        json!([
            self.at_ms,
            self.waiting,
            self.capacity,
            (self.admitted_per_s * 100.0).round() / 100.0
        ])
    }
}

/// One route's ring, and the admissions total at its last sample.
#[derive(Debug, Default)]
struct Ring {
    samples: VecDeque<Sample>,
    admitted_total: Option<u64>,
}

impl Ring {
    fn push(&mut self, sample: Sample) {
        if self.samples.len() == KEPT {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }
}

/// The rings of every route and the last update, shared by the sampler and
/// the event streams.
#[derive(Debug)]
pub struct LiveView {
    rings: Mutex<HashMap<String, Ring>>,
    update: watch::Sender<Arc<String>>,
}

impl Default for LiveView {
    fn default() -> Self {
        LiveView {
            rings: Mutex::new(HashMap::new()),
            update: watch::channel(Arc::new(String::new())).0,
        }
    }
}

impl LiveView {
    /// Takes one sample of every route of `settings` at `at_ms`: appended
    /// to its ring (rings of routes gone are dropped), and pushed to every
    /// open stream as one update.
    pub fn sample(&self, settings: &Settings, at_ms: u64) {
        let mut rings = self.rings.lock().unwrap_or_else(PoisonError::into_inner);
        rings.retain(|name, _| settings.route_named(name).is_some());
        let mut routes = Vec::with_capacity(settings.routes.len());
        for route in &settings.routes {
            let ring = rings.entry(route.name().to_owned()).or_default();
            let total = route.live.admitted_total();
            // A total that went back (a store lost) counts as none.
            let admitted = ring
                .admitted_total
                .map_or(0, |before| total.saturating_sub(before));
            ring.admitted_total = Some(total);
            let sample = Sample {
                at_ms,
                waiting: route.live.waiting(),
                capacity: route.capacity_now(),
                admitted_per_s: admitted as f64 / EVERY.as_secs_f64(),
            };
            ring.push(sample);
            let mut figures = figures(route);
            figures["admitted_per_s"] = json!(sample.admitted_per_s);
            figures["sample"] = sample.json();
            routes.push(figures);
        }
        drop(rings);
        let body = json!({ "at_ms": at_ms, "routes": routes }).to_string();
        self.update.send_replace(Arc::new(body));
    }

    /// Every route's ring, oldest first, as `{name: [[at_ms, waiting,
    /// capacity, admitted_per_s], …]}`.
    pub fn history(&self) -> Value {
        let rings = self.rings.lock().unwrap_or_else(PoisonError::into_inner);
        let routes: serde_json::Map<String, Value> = rings
            .iter()
            .map(|(name, ring)| {
                let samples: Vec<Value> = ring.samples.iter().map(Sample::json).collect();
                (name.clone(), Value::Array(samples))
            })
            .collect();
        json!({ "window_s": KEPT as u64 * EVERY.as_secs(), "routes": routes })
    }

    /// `GET /events`: the history as one `history` event, then each
    /// update as it is taken (the latest at once, when there is one).
    pub fn events(&self) -> Answer<Body> {
        let history = Bytes::from(format!("event: history\ndata: {}\n\n", self.history()));
        let updates = self.update.subscribe();
        let first = futures_util::stream::once(async move { history });
        let rest = futures_util::stream::unfold(updates, |mut updates| async move {
            let body = updates.borrow_and_update().clone();
            let piece = if body.is_empty() {
                Bytes::from_static(b": waiting for the first sample\n\n")
            } else {
                Bytes::from(format!("data: {body}\n\n"))
            };
            updates.changed().await.ok()?;
            Some((piece, updates))
        });
        let pieces = futures_util::StreamExt::chain(first, rest);
        response::event_stream("admin-events", Pieces::new(pieces))
    }
}

/// Samples every [`EVERY`] until `stop` changes. Each route's live numbers
/// are read from the store first: the admitter's last read may be half a
/// second old, and a sample a second apart should show the line as it is.
pub async fn keep(
    view: Arc<LiveView>,
    settings: Arc<ArcSwap<Settings>>,
    gate: Gate,
    clock: Clock,
    mut stop: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.changed() => return,
        }
        let settings = settings.load();
        for route in &settings.routes {
            if let Ok(stats) = gate.store().stats(route.name(), &route.limits).await {
                route.live.note_stats(&stats);
            }
        }
        view.sample(&settings, clock.now_us() / 1_000);
    }
}

/// One route's figures as the live view and `/routes` show them: the mode
/// and capacity it runs with, the file's and any override; the line, the
/// active sessions, the admission rate and the ETA at the back; the waits
/// of recent admissions; the lanes.
pub fn figures(route: &RouteRt) -> Value {
    let live = &route.live;
    let waiting = live.waiting();
    let rate = live.admit_rate();
    let lane_waiting = live.lane_waiting();
    let lanes: Vec<Value> = route
        .limits
        .lanes
        .iter()
        .enumerate()
        .map(|(i, lane)| {
            json!({
                "name": lane.name,
                "weight": lane.weight,
                "waiting": lane_waiting.get(i).copied().unwrap_or(if i == 0 { waiting } else { 0 }),
            })
        })
        .collect();
    let wait = live
        .wait_percentiles()
        .map(|(p50, p95)| json!({ "p50_s": p50, "p95_s": p95 }));
    let mut figures = json!({
        "name": route.name(),
        "mode": route.cfg.mode.as_str(),
        "capacity": route.capacity_now(),
        "file": { "mode": route.file_mode.as_str(), "capacity": route.file_capacity },
        "override": route.overridden,
        "waiting": waiting,
        "active": live.active(),
        "admit_rate": rate,
        "eta_seconds": route::eta_seconds(waiting, rate),
        "wait": wait,
        "lanes": lanes,
    });
    // An adaptive route (DESIGN §9.1): its range, and the origin's health
    // in the last window measured; absent on a fixed route.
    if let Some(adapt) = &route.cfg.adapt {
        figures["capacity_range"] = json!({ "min": adapt.min, "max": adapt.max });
        if let Some(window) = live.last_window() {
            figures["origin"] = json!({ "p95_ms": window.p95_ms, "errors": window.errors });
        }
    }
    figures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_fifteen_minutes() {
        let mut ring = Ring::default();
        for n in 0..(KEPT as u64 + 10) {
            ring.push(Sample {
                at_ms: n,
                waiting: n,
                capacity: 1,
                admitted_per_s: 0.0,
            });
        }
        assert_eq!(ring.samples.len(), KEPT);
        assert_eq!(ring.samples.front().map(|s| s.at_ms), Some(10));
    }
}
