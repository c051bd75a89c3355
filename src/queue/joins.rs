//! Batched joins (DESIGN §8.9): per route, an instance has at most one
//! arrive call in flight; the arrivals made meanwhile wait for the next call,
//! which goes as soon as that one returns, carrying all of them (up to
//! [`MOST_PER_CALL`]). When arrivals are few the first goes at once and
//! nothing waits; when they are many, the store sees calls at the rate of its
//! own round trips, not of arrivals, and each call spends its fixed cost
//! (the script's prelude, the route's ghosts) once for the batch.
//!
//! Order: the arrivals of one instance join in the order they came; those of
//! different instances interleave to within one round trip (the batch
//! window), the same as separate calls racing.
//!
//! A task is spawned for each busy period (from the first arrival while
//! nothing is in flight to the call that finds nobody left), not per call:
//! the request that starts it must not wait for batches it does not belong
//! to.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use super::{Arrival, Arriving, Limits, QueueStore, StoreError};

/// Most arrivals in one call: bounds the script's run, during which the
/// route's other calls wait.
pub const MOST_PER_CALL: usize = 500;

type Answer = Result<Arrival, StoreError>;

/// One route's arrivals waiting for a call.
#[derive(Debug, Default)]
pub struct JoinQueue {
    pending: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    arrivals: Vec<(Arriving, oneshot::Sender<Answer>)>,
    /// The route's limits and known epoch as the latest arrival saw them:
    /// the next call sends these.
    limits: Option<Limits>,
    known_epoch_us: Option<u64>,
    /// A call is in flight (or about to be): new arrivals only wait.
    sending: bool,
}

impl JoinQueue {
    /// `arrival` arrives on `route`, in the next call to `store`.
    pub async fn arrive<S>(
        self: &Arc<Self>,
        store: &S,
        route: &str,
        arrival: Arriving,
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Answer
    where
        S: QueueStore + Clone + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            p.arrivals.push((arrival, tx));
            p.limits = Some(limits.clone());
            p.known_epoch_us = known_epoch_us;
            !std::mem::replace(&mut p.sending, true)
        };
        if start {
            let queue = Arc::clone(self);
            let store = store.clone();
            let route = route.to_owned();
            tokio::spawn(async move { queue.send_all(&store, &route).await });
        }
        // The sender is dropped unanswered only if the sending task died
        // (its runtime shutting down): as a store that did not answer.
        rx.await.unwrap_or(Err(StoreError::Timeout))
    }

    /// Sends calls until no arrival is left waiting.
    async fn send_all<S: QueueStore>(&self, store: &S, route: &str) {
        loop {
            let (batch, limits, known_epoch_us) = {
                let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
                if p.arrivals.is_empty() {
                    p.sending = false;
                    return;
                }
                // Set with every arrival, so present while any waits.
                let Some(limits) = p.limits.clone() else {
                    p.sending = false;
                    return;
                };
                let take = p.arrivals.len().min(MOST_PER_CALL);
                let batch: Vec<_> = p.arrivals.drain(..take).collect();
                (batch, limits, p.known_epoch_us)
            };
            let (arrivals, answer_to): (Vec<Arriving>, Vec<_>) = batch.into_iter().unzip();
            match store
                .arrive_batch(route, &arrivals, &limits, known_epoch_us)
                .await
            {
                Ok(answers) => {
                    // One answer per arrival (the stores check it).
                    for (tx, answer) in answer_to.into_iter().zip(answers) {
                        // The request may have gone: its visitor's entry is
                        // an unconfirmed one that lapses by itself.
                        let _ = tx.send(Ok(answer));
                    }
                }
                Err(err) => {
                    for tx in answer_to {
                        let _ = tx.send(Err(err.share()));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::Clock;
    use crate::queue::Lanes;
    use crate::queue::MemoryStore;

    fn limits() -> Limits {
        Limits {
            capacity: 0,
            max_admit_per_tick: 10,
            tick: Duration::from_millis(100),
            session_ttl: Duration::from_secs(60),
            pass_ttl: Duration::from_secs(10),
            arrival_grace: Duration::from_secs(60),
            abandon_after: Duration::from_secs(600),
            max_waiting: 100_000,
            confirm_within: Duration::from_secs(60),
            client_places: 0,
            client_joins_per_minute: 0,
            lanes: Lanes::default(),
            opens_at_us: None,
            shards: 1,
        }
    }

    fn arriving(n: u32) -> Arriving {
        let mut id = [7; 16];
        id[..4].copy_from_slice(&n.to_be_bytes());
        Arriving {
            id,
            client: Vec::new(),
            admit_now: true,
            lane: 0,
        }
    }

    /// Arrivals made at once, more than one call carries, each get their
    /// own answer, and join in the order they came.
    #[tokio::test]
    async fn many_arrivals_at_once_join_in_their_order() {
        let store = MemoryStore::new(Clock::system());
        let queue = Arc::new(JoinQueue::default());
        let limits = limits();
        let count = MOST_PER_CALL * 2 + 37;
        let tasks: Vec<_> = (0..count as u32)
            .map(|n| {
                let (queue, store, limits) = (queue.clone(), store.clone(), limits.clone());
                tokio::spawn(
                    async move { queue.arrive(&store, "r", arriving(n), &limits, None).await },
                )
            })
            .collect();
        for (n, task) in tasks.into_iter().enumerate() {
            match task.await.expect("the task ran") {
                Ok(Arrival::Waiting(place)) => assert_eq!(place.position, n as u64 + 1),
                other => panic!("arrival {n}: {other:?}"),
            }
        }
        let stats = store.stats("r", &limits).await.expect("stats");
        assert_eq!(stats.waiting, count as u64);
        assert!(!queue.pending.lock().unwrap().sending, "the sender stopped");
    }

    /// After a quiet spell the next arrival goes at once, and gets the
    /// latest limits it was sent with.
    #[tokio::test]
    async fn a_lone_arrival_goes_at_once_with_its_own_limits() {
        let store = MemoryStore::new(Clock::system());
        let queue = Arc::new(JoinQueue::default());
        let first = queue
            .arrive(&store, "r", arriving(1), &limits(), None)
            .await;
        assert!(matches!(first, Ok(Arrival::Waiting(_))), "{first:?}");
        let open = Limits {
            capacity: 5,
            max_waiting: 1,
            ..limits()
        };
        // One waits, the line is at max_waiting: the next is refused.
        let second = queue.arrive(&store, "r", arriving(2), &open, None).await;
        assert!(
            matches!(second, Ok(Arrival::Full { waiting_total: 1 })),
            "{second:?}"
        );
    }
}
