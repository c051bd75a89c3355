//! The per-route tick loop: every `tick` it asks the store to admit from the
//! head of the line, and it keeps the route's live numbers (epoch, counts,
//! admission rate) fresh for the gate and the waiting room.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use crate::config::{Mode, OnStoreError};
use crate::gate::{Gate, Settings};
use crate::queue::QueueStore;

/// Live numbers are refreshed at most this often.
const STATS_EVERY: Duration = Duration::from_millis(500);

/// Runs the tick loop of route `name` until it leaves the config or `stop`
/// changes.
pub async fn run(gate: Gate, settings: Arc<ArcSwap<Settings>>, name: String, mut stop: watch::Receiver<bool>) {
    let mut tick = match current_tick(&settings, &name) {
        Some(t) => t,
        None => return,
    };
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_stats: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.changed() => return,
        }
        let s = settings.load();
        let Some(index) = s.route_named(&name) else {
            tracing::debug!(route = %name, "route removed: admitter stops");
            return;
        };
        let route = &s.routes[index];
        if route.limits.tick != tick {
            tick = route.limits.tick;
            interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        }
        let live = &route.live;
        if route.cfg.mode == Mode::Gate {
            let known = match live.epoch_us.load(Ordering::Relaxed) {
                0 => None,
                e => Some(e),
            };
            match gate.store.admit_tick(&name, &route.limits, known).await {
                Ok(t) => {
                    if known.is_some_and(|k| k != t.epoch_us) {
                        tracing::warn!(route = %name, "store lost its state: holding admissions for one pass_ttl");
                    }
                    live.epoch_us.store(t.epoch_us, Ordering::Relaxed);
                    if !t.admitted_scores.is_empty() {
                        tracing::debug!(route = %name, admitted = t.admitted_scores.len(), "admitted from the line");
                    }
                }
                Err(err) => tracing::debug!(route = %name, error = %err, "admit tick failed"),
            }
            if route.cfg.on_store_error == OnStoreError::Local {
                let _ = gate.local.admit_tick(&name, &route.local_limits, None).await;
            }
        }
        if last_stats.is_none_or(|at| at.elapsed() >= STATS_EVERY) {
            last_stats = Some(Instant::now());
            if let Ok(stats) = gate.store.stats(&name, &route.limits).await {
                // Only the tick moves a known epoch: it is what notices a loss.
                let _ = live.epoch_us.compare_exchange(0, stats.epoch_us, Ordering::Relaxed, Ordering::Relaxed);
                live.waiting.store(stats.waiting, Ordering::Relaxed);
                live.active.store(stats.active, Ordering::Relaxed);
                live.admit_rate_milli
                    .store((stats.admit_rate * 1000.0) as u64, Ordering::Relaxed);
            }
        }
    }
}

fn current_tick(settings: &ArcSwap<Settings>, name: &str) -> Option<Duration> {
    let s = settings.load();
    s.route_named(name).map(|i| s.routes[i].limits.tick)
}
