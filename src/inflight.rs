//! A route's turns at the origin (DESIGN §9.2): at most `max_inflight` of
//! its requests at the origin at once, per instance, those beyond it waiting
//! for a turn in the order they came (tokio's semaphore is FIFO-fair). A
//! reload resizes the cap in place without losing count of the turns held:
//! a cap raised lets waiters in at once; a cap lowered below the turns held
//! takes the difference back as they end, new requests waiting behind that;
//! no cap lets everyone through. Every turn is counted, capped or not, for
//! `queuegate_inflight`. What a request does while it holds its turn is
//! `request::session`'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Semaphore;

/// The permits of a route with no cap: more turns than can ever be held.
const UNCAPPED: usize = Semaphore::MAX_PERMITS;

/// One route's turns at the origin, kept with its live state across reloads.
#[derive(Debug)]
pub struct Turns {
    /// Free turns. A turn taken forgets its permit and gives one back when
    /// it ends (see [`Turns::give_back`]), so that a lowered cap can keep it.
    permits: Semaphore,
    cap: Mutex<Cap>,
    /// Turns held now.
    held: AtomicU64,
    /// Requests waiting for a turn now.
    waiting: AtomicU64,
}

/// The size of the turns, changed only under the lock.
#[derive(Debug)]
struct Cap {
    /// The cap the permits stand for: `max_inflight`, or [`UNCAPPED`].
    total: usize,
    /// Turns still to be taken back from those held, after a cap was
    /// lowered below the turns held then: each one that ends pays one off
    /// instead of freeing a turn. While anything is owed no turn is free.
    owed: usize,
}

impl Default for Turns {
    fn default() -> Turns {
        Turns {
            permits: Semaphore::new(UNCAPPED),
            cap: Mutex::new(Cap {
                total: UNCAPPED,
                owed: 0,
            }),
            held: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
        }
    }
}

impl Turns {
    /// Sets the cap to `max` turns (`None`: no cap), keeping the turns held.
    pub fn resize(&self, max: Option<u64>) {
        let total = max.map_or(UNCAPPED, |max| {
            usize::try_from(max).map_or(UNCAPPED, |max| max.min(UNCAPPED))
        });
        let mut cap = self.cap.lock().unwrap_or_else(PoisonError::into_inner);
        if total > cap.total {
            let grown = total - cap.total;
            let paid = grown.min(cap.owed);
            cap.owed -= paid;
            self.permits.add_permits(grown - paid);
        } else if total < cap.total {
            let shrunk = cap.total - total;
            let taken = self.permits.forget_permits(shrunk);
            cap.owed += shrunk - taken;
        }
        cap.total = total;
    }

    /// The cap, `None` when there is none.
    pub fn cap(&self) -> Option<u64> {
        let cap = self.cap.lock().unwrap_or_else(PoisonError::into_inner);
        (cap.total < UNCAPPED).then_some(cap.total as u64)
    }

    /// Turns held now: the route's requests at the origin.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Requests waiting for a turn now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// A turn, at once if one is free, or the first free one within `wait`
    /// behind those already waiting; `None` when none came in time. Dropping
    /// the future gives up the place in the line.
    pub async fn take(turns: &Arc<Turns>, wait: Duration) -> Option<Turn> {
        match turns.permits.try_acquire() {
            Ok(permit) => permit.forget(),
            Err(_) if wait.is_zero() => return None,
            Err(_) => {
                let _waiting = Waiting::new(&turns.waiting);
                match tokio::time::timeout(wait, turns.permits.acquire()).await {
                    Ok(Ok(permit)) => permit.forget(),
                    // Never closed; a closed one would free no turn anyway.
                    Ok(Err(_)) | Err(_) => return None,
                }
            }
        }
        turns.held.fetch_add(1, Ordering::Relaxed);
        Some(Turn {
            turns: turns.clone(),
        })
    }

    /// A turn ended: it pays off a turn owed, or frees one for the next.
    fn give_back(&self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
        let mut cap = self.cap.lock().unwrap_or_else(PoisonError::into_inner);
        if cap.owed > 0 {
            cap.owed -= 1;
        } else {
            self.permits.add_permits(1);
        }
    }
}

/// One request counted as waiting for a turn while this lives: until it
/// has one, gave up, or went away.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicU64) -> Waiting<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request's turn at the origin, given back when dropped.
#[must_use = "the turn is held only while it lives"]
#[derive(Debug)]
pub struct Turn {
    turns: Arc<Turns>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.turns.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Duration = Duration::ZERO;

    fn capped(max: u64) -> Arc<Turns> {
        let turns = Arc::new(Turns::default());
        turns.resize(Some(max));
        turns
    }

    #[tokio::test]
    async fn no_more_turns_than_the_cap_and_an_ended_one_frees_one() {
        let turns = capped(2);
        let first = Turns::take(&turns, NOW).await.expect("a free turn");
        let _second = Turns::take(&turns, NOW).await.expect("a free turn");
        assert!(Turns::take(&turns, NOW).await.is_none());
        assert_eq!(turns.held(), 2);
        drop(first);
        assert_eq!(turns.held(), 1);
        assert!(Turns::take(&turns, NOW).await.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gets_the_next_turn_in_time_or_none() {
        let turns = capped(1);
        let held = Turns::take(&turns, NOW).await.expect("a free turn");
        assert!(Turns::take(&turns, Duration::from_secs(1)).await.is_none());
        assert_eq!(turns.waiting(), 0);
        let waiter = tokio::spawn({
            let turns = turns.clone();
            async move { Turns::take(&turns, Duration::from_secs(5)).await.is_some() }
        });
        tokio::task::yield_now().await;
        assert_eq!(turns.waiting(), 1);
        drop(held);
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn a_lowered_cap_is_paid_off_by_turns_that_end() {
        let turns = capped(3);
        let held: Vec<_> = futures_util::future::join_all((0..3).map(|_| Turns::take(&turns, NOW)))
            .await
            .into_iter()
            .map(|t| t.expect("a free turn"))
            .collect();
        turns.resize(Some(1));
        assert_eq!((turns.cap(), turns.held()), (Some(1), 3));
        let mut held = held.into_iter();
        drop(held.next());
        assert!(Turns::take(&turns, NOW).await.is_none(), "one still owed");
        drop(held.next());
        assert!(Turns::take(&turns, NOW).await.is_none(), "the cap is full");
        drop(held.next());
        let one = Turns::take(&turns, NOW).await.expect("the cap's one turn");
        assert!(Turns::take(&turns, NOW).await.is_none());
        drop(one);
        assert_eq!(turns.held(), 0);
    }

    #[tokio::test]
    async fn a_raised_cap_pays_off_what_is_owed_first_and_no_cap_lets_all_in() {
        let turns = capped(2);
        let a = Turns::take(&turns, NOW).await.expect("a free turn");
        let _b = Turns::take(&turns, NOW).await.expect("a free turn");
        turns.resize(Some(0));
        turns.resize(Some(3));
        // 2 held, cap 3: one free.
        let _c = Turns::take(&turns, NOW)
            .await
            .expect("the raised cap's turn");
        assert!(Turns::take(&turns, NOW).await.is_none());
        turns.resize(None);
        assert_eq!(turns.cap(), None);
        let many: Vec<_> =
            futures_util::future::join_all((0..100).map(|_| Turns::take(&turns, NOW))).await;
        assert!(many.iter().all(Option::is_some));
        assert_eq!(turns.held(), 103);
        drop(a);
        drop(many);
        turns.resize(Some(2));
        // 2 still held: none free until one ends.
        assert!(Turns::take(&turns, NOW).await.is_none());
    }
}
