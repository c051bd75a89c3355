//! The origin's health as the admitted requests of a route see it, and the
//! rule that moves an adaptive route's capacity with it (DESIGN §9.1).
//!
//! Each instance counts its route's forwarded requests in a [`Recorder`]:
//! how many, how many failed (an origin `5xx`, a timeout, a connection
//! that failed), and a histogram of the time to the origin's response head.
//! The admitter takes what was counted ([`Recorder::take`]) every second
//! and adds it to the route's window in the store, so on a shared store the
//! window holds every instance's requests; once per window one instance
//! reads the window that ended and applies [`decide`] to it.
//!
//! A histogram, not a list of samples: counts per bucket add up across
//! instances and windows, and cost the same however many requests there
//! were. The buckets grow by a quarter each, from 1 ms to a minute, so a
//! p95 read from them ([`WindowCounts::p95`]) is within an eighth of the
//! true one.
//!
//! This module does not own when the window ends (the store's clock does),
//! who decides (the store's lease), nor what the capacity is used for (the
//! store admits by it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::Adapt;

/// Upper bounds of the histogram's buckets in microseconds, each an eighth
/// above the one before, from 1 ms to past a minute; a last bucket (not
/// listed) takes anything longer.
pub const BUCKET_BOUNDS_US: [u64; 95] = bucket_bounds();

/// Buckets in a window: one per bound, and one past the last.
pub const BUCKETS: usize = BUCKET_BOUNDS_US.len() + 1;

/// Requests a window needs before it can count as unhealthy: fewer tell too
/// little about the origin to lower anyone's capacity.
pub const MIN_REQUESTS: u64 = 20;

/// The factor an unhealthy window multiplies capacity by.
pub const DECREASE: f64 = 0.7;

/// Share of capacity the active sessions fill when the route is using its
/// room even with nobody waiting.
pub const USING_ROOM: f64 = 0.9;

const fn bucket_bounds() -> [u64; 95] {
    let mut bounds = [0u64; 95];
    let mut bound = 1_000u64;
    let mut i = 0;
    while i < bounds.len() {
        bounds[i] = bound;
        bound += bound / 8;
        i += 1;
    }
    bounds
}

/// The bucket a response time falls in.
fn bucket_of(elapsed: Duration) -> usize {
    let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    BUCKET_BOUNDS_US.partition_point(|&bound| bound < us)
}

/// What one instance counted of a route's requests since it last reported,
/// or a window's total once added up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowCounts {
    /// Requests forwarded and answered or failed.
    pub requests: u64,
    /// Of those, answers `5xx`, timeouts and failed connections.
    pub errors: u64,
    /// Requests per bucket of [`BUCKET_BOUNDS_US`] (then the last bucket).
    pub buckets: [u64; BUCKETS],
}

impl Default for WindowCounts {
    fn default() -> Self {
        WindowCounts {
            requests: 0,
            errors: 0,
            buckets: [0; BUCKETS],
        }
    }
}

impl WindowCounts {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &WindowCounts) {
        self.requests += other.requests;
        self.errors += other.errors;
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *mine += theirs;
        }
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.requests == 0
    }

    /// The share of requests that failed, 0 for none.
    pub fn error_share(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        self.errors as f64 / self.requests as f64
    }

    /// The 95th percentile of the response times, read from the buckets
    /// (linear within the bucket it falls in); `None` without requests.
    /// Requests that failed before any answer count with the time they
    /// took, which a timeout makes long.
    pub fn p95(&self) -> Option<Duration> {
        let counted: u64 = self.buckets.iter().sum();
        if counted == 0 {
            return None;
        }
        // The rank of the 95th percentile, 1-based.
        let rank = (counted * 95).div_ceil(100);
        let mut below = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n > 0 && below + n >= rank {
                let low = if i == 0 { 0 } else { BUCKET_BOUNDS_US[i - 1] };
                let high = BUCKET_BOUNDS_US.get(i).copied().unwrap_or(low + low / 8);
                let into = (rank - below) as f64 / n as f64;
                let us = low as f64 + (high - low) as f64 * into;
                return Some(Duration::from_micros(us.round() as u64));
            }
            below += n;
        }
        None
    }

    /// The non-zero buckets as (index, count), as the store keeps them.
    pub fn nonzero_buckets(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| (i, n))
    }
}

/// Counts one route's requests at this instance, without a lock: a request
/// is counted with three relaxed atomic adds.
#[derive(Debug)]
pub struct Recorder {
    requests: AtomicU64,
    errors: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Recorder {
    /// Counts a request whose answer head came (or which failed) after
    /// `elapsed`; `failed` for a `5xx`, a timeout or a failed connection.
    pub fn record(&self, elapsed: Duration, failed: bool) {
        self.buckets[bucket_of(elapsed)].fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// What was counted since the last take, and starts again from zero. A
    /// request counted during the take lands in this one or the next, never
    /// in neither.
    pub fn take(&self) -> WindowCounts {
        let mut counts = WindowCounts {
            requests: self.requests.swap(0, Ordering::Relaxed),
            errors: self.errors.swap(0, Ordering::Relaxed),
            ..WindowCounts::default()
        };
        for (n, bucket) in counts.buckets.iter_mut().zip(self.buckets.iter()) {
            *n = bucket.swap(0, Ordering::Relaxed);
        }
        counts
    }
}

/// Which way a capacity moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Up,
    Down,
}

impl Direction {
    /// As in `queuegate_capacity_changes_total{direction}`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
        }
    }
}

/// A capacity change [`decide`] made, and why, in words for `/routes` and
/// the log.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub capacity: u64,
    pub direction: Direction,
    pub reason: String,
}

/// The route's state when a window ended, beside the window's counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    /// The capacity the window was admitted by.
    pub capacity: u64,
    /// Waiters in line.
    pub waiting: u64,
    /// Sessions active.
    pub active: u64,
}

impl Room {
    /// Whether the route is using its room: someone waits, or the active
    /// sessions fill at least [`USING_ROOM`] of the capacity. Only then
    /// does a healthy window raise the capacity; room nobody uses proves
    /// nothing about the origin.
    pub fn in_use(&self) -> bool {
        self.waiting > 0 || self.active as f64 >= self.capacity as f64 * USING_ROOM
    }

    /// Whether a cut has not taken effect yet: more sessions are active
    /// than the capacity allows, since lowering it ends none of them. The
    /// origin still carries the load the cut was for, so the next window
    /// says nothing about the new number; cutting again on it would stack
    /// cuts until the sessions drain, far below what the origin holds (the
    /// `sale` bench showed ten cuts in a row, 200 to 5, for an origin that
    /// holds 40), and raising it would undo the cut before it acted.
    pub fn settling(&self) -> bool {
        self.active > self.capacity
    }
}

/// The capacity after a window (DESIGN §9.1), or `None` to keep it:
///
/// - unhealthy (p95 above the target, or the error share above it) with at
///   least [`MIN_REQUESTS`] requests: × [`DECREASE`], not below `min`;
/// - healthy (at least one request, both within target) while the route
///   uses its room: + max(1, 5 %), not above `max`;
/// - otherwise unchanged; and unchanged while the active sessions are still
///   above the capacity ([`Room::settling`]).
///
/// A capacity outside the range (the range changed) is first brought into
/// it. Lowering capacity ends nobody's session: the store admits nobody
/// until the active count is below the new number.
pub fn decide(adapt: &Adapt, room: Room, window: &WindowCounts) -> Option<Change> {
    let current = room.capacity.clamp(adapt.min, adapt.max);
    let settling = room.settling();
    let p95 = window.p95();
    let errors = window.error_share();
    let slow = p95.is_some_and(|p| p > adapt.target_p95);
    let failing = errors > adapt.target_errors;
    let (capacity, reason) = if settling {
        (current, "the range changed".to_owned())
    } else if window.requests >= MIN_REQUESTS && (slow || failing) {
        let lower = ((current as f64 * DECREASE).floor() as u64).max(adapt.min);
        let why = match (slow, failing) {
            (true, true) => format!(
                "p95 {} ms over {} ms and errors {:.1}% over {:.1}%",
                ms(p95),
                adapt.target_p95.as_millis(),
                errors * 100.0,
                adapt.target_errors * 100.0
            ),
            (true, false) => format!(
                "p95 {} ms over {} ms",
                ms(p95),
                adapt.target_p95.as_millis()
            ),
            _ => format!(
                "errors {:.1}% over {:.1}%",
                errors * 100.0,
                adapt.target_errors * 100.0
            ),
        };
        (lower, why)
    } else if !window.is_empty() && !slow && !failing && room.in_use() {
        let step = (current / 20).max(1);
        let higher = current.saturating_add(step).min(adapt.max);
        let why = format!(
            "healthy (p95 {} ms, errors {:.1}%) and the room in use",
            ms(p95),
            errors * 100.0
        );
        (higher, why)
    } else if current != room.capacity {
        (current, "the range changed".to_owned())
    } else {
        return None;
    };
    if capacity == room.capacity {
        return None;
    }
    let direction = if capacity > room.capacity {
        Direction::Up
    } else {
        Direction::Down
    };
    Some(Change {
        capacity,
        direction,
        reason,
    })
}

fn ms(d: Option<Duration>) -> u128 {
    d.map_or(0, |d| d.as_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapt() -> Adapt {
        Adapt {
            min: 10,
            max: 1000,
            target_p95: Duration::from_millis(800),
            target_errors: 0.02,
            every: Duration::from_secs(5),
        }
    }

    fn window(requests: u64, errors: u64, each: Duration) -> WindowCounts {
        let recorder = Recorder::default();
        for i in 0..requests {
            recorder.record(each, i < errors);
        }
        recorder.take()
    }

    fn busy(capacity: u64) -> Room {
        Room {
            capacity,
            waiting: 5,
            active: capacity,
        }
    }

    #[test]
    fn buckets_grow_by_an_eighth_from_a_millisecond_to_a_minute() {
        assert_eq!(BUCKET_BOUNDS_US[0], 1_000);
        assert_eq!(BUCKET_BOUNDS_US[1], 1_125);
        let last = BUCKET_BOUNDS_US[BUCKET_BOUNDS_US.len() - 1];
        assert!((60_000_000..70_000_000).contains(&last), "{last}");
        assert_eq!(bucket_of(Duration::from_micros(1_000)), 0);
        assert_eq!(bucket_of(Duration::from_micros(1_001)), 1);
        assert_eq!(bucket_of(Duration::from_secs(3600)), BUCKETS - 1);
    }

    #[test]
    fn p95_is_read_within_an_eighth() {
        for ms in [3, 40, 120, 800, 2_500, 30_000] {
            let truth = Duration::from_millis(ms);
            let p95 = window(100, 0, truth).p95().unwrap();
            let off = (p95.as_secs_f64() - truth.as_secs_f64()).abs() / truth.as_secs_f64();
            assert!(off <= 0.125, "{ms} ms read as {p95:?}");
        }
        // 94 fast and 6 slow: the 95th is slow.
        let mut mixed = window(94, 0, Duration::from_millis(10));
        mixed.add(&window(6, 0, Duration::from_secs(2)));
        assert!(mixed.p95().unwrap() > Duration::from_secs(1));
        assert_eq!(WindowCounts::default().p95(), None);
    }

    #[test]
    fn a_take_starts_again_from_zero() {
        let recorder = Recorder::default();
        recorder.record(Duration::from_millis(5), true);
        recorder.record(Duration::from_millis(5), false);
        let first = recorder.take();
        assert_eq!((first.requests, first.errors), (2, 1));
        assert_eq!(first.buckets.iter().sum::<u64>(), 2);
        assert!(recorder.take().is_empty());
    }

    #[test]
    fn a_slow_window_lowers_by_a_third_not_below_min() {
        let slow = window(50, 0, Duration::from_secs(2));
        let change = decide(&adapt(), busy(500), &slow).unwrap();
        assert_eq!((change.capacity, change.direction), (350, Direction::Down));
        assert!(change.reason.contains("p95"), "{}", change.reason);
        let change = decide(&adapt(), busy(12), &slow).unwrap();
        assert_eq!(change.capacity, 10);
        assert_eq!(decide(&adapt(), busy(10), &slow), None);
    }

    #[test]
    fn errors_alone_lower_it() {
        let failing = window(100, 10, Duration::from_millis(5));
        let change = decide(&adapt(), busy(100), &failing).unwrap();
        assert_eq!((change.capacity, change.direction), (70, Direction::Down));
        assert!(change.reason.contains("errors"), "{}", change.reason);
    }

    #[test]
    fn too_few_requests_never_lower_it() {
        let slow = window(MIN_REQUESTS - 1, 5, Duration::from_secs(5));
        assert_eq!(decide(&adapt(), busy(100), &slow), None);
    }

    #[test]
    fn a_healthy_window_raises_it_only_while_the_room_is_used() {
        let fast = window(100, 0, Duration::from_millis(50));
        let change = decide(&adapt(), busy(100), &fast).unwrap();
        assert_eq!((change.capacity, change.direction), (105, Direction::Up));
        assert_eq!(decide(&adapt(), busy(10), &fast).unwrap().capacity, 11);
        assert_eq!(decide(&adapt(), busy(999), &fast).unwrap().capacity, 1000);
        assert_eq!(decide(&adapt(), busy(1000), &fast), None);
        let idle = Room {
            capacity: 100,
            waiting: 0,
            active: 89,
        };
        assert_eq!(decide(&adapt(), idle, &fast), None);
        let full = Room { active: 90, ..idle };
        assert_eq!(decide(&adapt(), full, &fast).unwrap().capacity, 105);
        // No requests: no evidence either way.
        assert_eq!(decide(&adapt(), busy(100), &WindowCounts::default()), None);
    }

    #[test]
    fn nothing_changes_until_a_cut_has_taken_effect() {
        let slow = window(50, 0, Duration::from_secs(2));
        let draining = Room {
            capacity: 70,
            waiting: 30,
            active: 100,
        };
        assert!(draining.settling());
        assert_eq!(decide(&adapt(), draining, &slow), None);
        let fast = window(100, 0, Duration::from_millis(50));
        assert_eq!(decide(&adapt(), draining, &fast), None);
        let drained = Room {
            active: 70,
            ..draining
        };
        assert_eq!(decide(&adapt(), drained, &slow).unwrap().capacity, 49);
        // A range that moved applies at once, settling or not.
        let moved = Room {
            capacity: 5000,
            waiting: 0,
            active: 6000,
        };
        assert_eq!(decide(&adapt(), moved, &slow).unwrap().capacity, 1000);
    }

    #[test]
    fn a_capacity_outside_a_new_range_is_brought_into_it() {
        let idle = Room {
            capacity: 5000,
            waiting: 0,
            active: 0,
        };
        let change = decide(&adapt(), idle, &WindowCounts::default()).unwrap();
        assert_eq!((change.capacity, change.direction), (1000, Direction::Down));
    }
}
