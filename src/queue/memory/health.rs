//! The memory store's health windows and adaptive capacity (DESIGN §9.1):
//! what `lua/adapt.lua` and `lua/coord.lua` keep in Redis, for one process.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::health::WindowCounts;
use crate::queue::HealthLook;

/// Every route's windows, by name.
#[derive(Debug, Default)]
pub(super) struct Healths {
    routes: Mutex<HashMap<String, Health>>,
}

/// One route's windows and capacity.
#[derive(Debug, Default)]
struct Health {
    /// The window being counted, and its counts.
    window: u64,
    counted: WindowCounts,
    /// The window before it.
    ended: WindowCounts,
    capacity: Option<u64>,
    why: String,
    /// The window the last lease was taken in, and the lease (rising).
    leased_window: Option<u64>,
    lease: u64,
}

impl Healths {
    fn with<T>(&self, route: &str, f: impl FnOnce(&mut Health) -> T) -> T {
        let mut routes = self
            .routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(routes.entry(route.to_owned()).or_default())
    }

    pub(super) fn report(
        &self,
        route: &str,
        counts: &WindowCounts,
        every: Duration,
        now_ms: u64,
    ) -> HealthLook {
        let window = now_ms / (every.as_millis() as u64).max(1);
        self.with(route, |h| {
            if h.window != window {
                let counted = std::mem::take(&mut h.counted);
                h.ended = if h.window + 1 == window {
                    counted
                } else {
                    WindowCounts::default()
                };
                h.window = window;
            }
            h.counted.add(counts);
            HealthLook {
                capacity: h.capacity,
                why: h.why.clone(),
                window,
                ended: h.ended.clone(),
            }
        })
    }

    pub(super) fn take_lease(&self, route: &str, every: Duration, now_ms: u64) -> Option<u64> {
        let window = now_ms / (every.as_millis() as u64).max(1);
        self.with(route, |h| {
            if h.leased_window == Some(window) {
                return None;
            }
            h.leased_window = Some(window);
            h.lease += 1;
            Some(h.lease)
        })
    }

    pub(super) fn set_capacity(&self, route: &str, lease: u64, capacity: u64, why: &str) -> bool {
        self.with(route, |h| {
            if h.lease != lease {
                return false;
            }
            h.capacity = Some(capacity);
            h.why = why.to_owned();
            true
        })
    }
}
