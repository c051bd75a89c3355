//! Fixtures for tests that call a `QueueStore` directly.

use std::time::Duration;

use queuegate::queue::{Arrival, Lanes, Limits, PassTimes, Place, Poll, TicketTimes};

/// Limits whose windows outlast a test (a 10-minute tick and session), so
/// that its calls share one tick window and nothing runs out unless it
/// shortens a window: `capacity` slots, up to 100 waiting, 10 admissions a
/// tick, no per-client limits, one lane, one shard. A test changes what it
/// checks: `Limits { tick: ..., ..long_limits(1) }`.
pub fn long_limits(capacity: u64) -> Limits {
    Limits {
        capacity,
        max_admit_per_tick: 10,
        tick: Duration::from_secs(600),
        session_ttl: Duration::from_secs(600),
        pass_ttl: Duration::from_secs(60),
        arrival_grace: Duration::from_secs(60),
        abandon_after: Duration::from_secs(30),
        max_waiting: 100,
        confirm_within: Duration::from_secs(30),
        client_places: 0,
        client_joins_per_minute: 0,
        lanes: Lanes::default(),
        opens_at_us: None,
        shards: 1,
    }
}

/// A ticket polled once right after it was issued.
pub fn polled_ticket(score_us: u64) -> TicketTimes {
    TicketTimes {
        score_us,
        seen_us: score_us + 1,
        lane: 0,
    }
}

/// A confirmed pass issued at the start of second `issued_s`.
pub fn pass_of_second(issued_s: u64) -> PassTimes {
    PassTimes {
        issued_ms: issued_s * 1_000,
        confirmed: true,
        granted_locally: false,
    }
}

/// The place of an arrival that has to wait.
pub fn waiting(arrival: Arrival) -> Place {
    match arrival {
        Arrival::Waiting(place) => place,
        other => panic!("expected to wait, got {other:?}"),
    }
}

/// The place of a poll that is still waiting.
pub fn polled_place(poll: Poll) -> Place {
    match poll {
        Poll::Waiting(place) => place,
        other => panic!("expected to wait, got {other:?}"),
    }
}
