//! Wall-clock time read through `tokio::time`, so tests can pause and advance it.
//!
//! Tickets and passes carry wall-clock times (they must survive a restart), yet
//! tests need to move time without sleeping. A `Clock` pins the wall clock once
//! and then advances with `tokio::time::Instant`, which tokio's paused time
//! controls.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// A wall clock that advances with tokio's clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base_unix: Duration,
    base_instant: Instant,
}

impl Clock {
    /// Pins the wall clock to the system time now.
    pub fn system() -> Clock {
        let base_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Clock::starting_at(base_unix)
    }

    /// A clock that reads `unix` (time since the Unix epoch) now.
    pub fn starting_at(unix: Duration) -> Clock {
        Clock {
            base_unix: unix,
            base_instant: Instant::now(),
        }
    }

    /// Time since the Unix epoch.
    pub fn now(&self) -> Duration {
        self.base_unix + self.base_instant.elapsed()
    }

    /// Microseconds since the Unix epoch.
    pub fn now_us(&self) -> u64 {
        self.now().as_micros() as u64
    }

    /// Whole seconds since the Unix epoch.
    pub fn now_s(&self) -> u64 {
        self.now().as_secs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn advances_with_paused_tokio_time() {
        let clock = Clock::starting_at(Duration::from_secs(1_000));
        assert_eq!(clock.now_s(), 1_000);
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert_eq!(clock.now_us(), 1_001_500_000);
    }
}
