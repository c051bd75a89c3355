//! Coalescing (DESIGN §9.3): while one request of a key is at the origin
//! (it [`Lead`]s the flight), the others for that key wait for its answer
//! ([`Follow`]) instead of going too. The flight lands with the kept
//! answer, which every follower serves, or is released: the answer could
//! not be kept (or its body is over `max_body` and is streamed), or the
//! leader went away. Released, every follower goes to the origin itself at
//! once, all together: they were waiting on one signal, not in a line
//! behind each other (where nginx's `proxy_cache_lock` lets them go one at
//! a time).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use super::key::Key;
use super::stored::Stored;

/// How a flight ended, as its followers see it.
#[derive(Clone, Debug)]
pub enum Landing {
    /// The answer, kept (or at least read whole: see [`Stored::is_charged`]).
    Stored(Arc<Stored>),
    /// No answer for them: each goes to the origin itself.
    Released,
}

type Signal = watch::Receiver<Option<Landing>>;

/// The flights of one cache, by key.
#[derive(Debug, Default)]
pub struct Flights {
    open: Mutex<HashMap<Key, Signal>>,
}

impl Flights {
    /// Follows the flight of `key` if there is one; otherwise, if `lead`
    /// (it is asked again under the lock, so that a flight that just landed
    /// and was kept is not flown again), opens one for the caller to lead.
    pub fn join(
        self: &Arc<Flights>,
        key: &Key,
        lead: impl FnOnce() -> bool,
    ) -> Option<Result<Lead, Follow>> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(signal) = open.get(key) {
            return Some(Err(Follow {
                signal: signal.clone(),
            }));
        }
        if !lead() {
            return None;
        }
        let (tx, rx) = watch::channel(None);
        open.insert(key.clone(), rx.clone());
        Some(Ok(Lead {
            flights: self.clone(),
            key: key.clone(),
            tx,
            rx,
        }))
    }

    /// Flights open now.
    pub fn open(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// The leader's side of a flight. Dropped without landing (the answer was
/// not kept, or the leader's request was dropped because its client went
/// away), the flight is released.
#[derive(Debug)]
pub struct Lead {
    flights: Arc<Flights>,
    key: Key,
    tx: watch::Sender<Option<Landing>>,
    /// To tell this flight's entry from a later one of the same key.
    rx: Signal,
}

impl Lead {
    /// The key the flight fetches for.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Lands the flight with `stored`: every follower gets it.
    pub fn land(self, stored: Arc<Stored>) {
        self.end(Landing::Stored(stored));
    }

    fn end(&self, landing: Landing) {
        {
            let mut open = self
                .flights
                .open
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // Closed first, so that nobody follows a flight that has landed.
            if open
                .get(&self.key)
                .is_some_and(|signal| self.rx.same_channel(signal))
            {
                open.remove(&self.key);
            }
        }
        self.tx.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some(landing);
            true
        });
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        self.end(Landing::Released);
    }
}

/// A follower's side of a flight.
#[derive(Debug)]
pub struct Follow {
    signal: Signal,
}

impl Follow {
    /// How the flight landed, waiting at most `within` (then, or if the
    /// flight is gone without a word, released).
    pub async fn landing(mut self, within: Duration) -> Landing {
        let landed = tokio::time::timeout(within, self.signal.wait_for(Option::is_some)).await;
        match landed {
            Ok(Ok(landing)) => landing.clone().unwrap_or(Landing::Released),
            _ => Landing::Released,
        }
    }
}
