//! The two lines a route's visitors can be in: the shared store's (behind
//! its circuit breaker) and the in-process one that stands in for it while
//! it is down. The rule of which answers is written here once: the store
//! is asked first; when it cannot answer, a route whose `on_store_error`
//! is `local` is answered by the local line (which then notes it answered
//! for the store), and any other route gets the store's error. Leaving and
//! counting requests go to the local line whatever the policy.

use crate::admission::VisitorId;
use crate::clock::Clock;
use crate::config::OnStoreError;
use crate::queue::{
    Arrival, Arriving, ClientKey, Counted, Guarded, MemoryStore, PassTimes, Poll, QueueStore,
    StoreError, Tick, TicketTimes,
};
use crate::route::RouteRt;

/// The shared store and the local line.
#[derive(Clone)]
pub struct Lines {
    pub shared: Guarded,
    pub local: MemoryStore,
    clock: Clock,
}

/// Which line answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    Shared,
    Local,
}

/// What the store could not answer is answered by the local line: whether
/// `route` falls back to it.
pub fn falls_back(route: &RouteRt) -> bool {
    route.cfg.on_store_error == OnStoreError::Local
}

impl Lines {
    /// The lines of `shared` and a fresh local line, both by `clock`.
    pub fn new(shared: Guarded, clock: Clock) -> Lines {
        Lines {
            shared,
            local: MemoryStore::fallback(clock),
            clock,
        }
    }

    /// Ends the place or session `id` in both lines (a visitor may be in
    /// either while the store comes and goes); `what` names the act in the
    /// warning when the store cannot be reached.
    pub async fn leave(&self, route: &RouteRt, id: &VisitorId, what: &str) {
        if let Err(err) = self.shared.leave(route.name(), id, &route.limits).await {
            tracing::warn!(route = route.name(), error = %err, "{what} could not reach the store");
        }
        let _ = self.local.leave(route.name(), id, &route.limits).await;
    }

    /// Counts one request of session `id` against `limit`: in the store,
    /// else in the local line, whatever the route's `on_store_error`.
    pub async fn count_request(&self, route: &RouteRt, id: &VisitorId, limit: u64) -> Counted {
        let counted = self
            .shared
            .count_request(route.name(), id, limit, &route.limits)
            .await;
        match counted {
            Ok(counted) => counted,
            Err(err) => {
                tracing::debug!(route = route.name(), error = %err, "request counted locally");
                // The memory store always answers.
                self.local
                    .count_request(route.name(), id, limit, &route.limits)
                    .await
                    .unwrap_or(Counted::Allowed)
            }
        }
    }

    /// Ticks the local line of a route that falls back to it, within the
    /// limits it has now (`RouteRt::local_limits_now`); `None` for any
    /// other route (its local line is not ticked).
    pub async fn tick_local(&self, route: &RouteRt) -> Option<Tick> {
        if !falls_back(route) {
            return None;
        }
        self.local
            .admit_tick(route.name(), &route.local_limits_now(), None)
            .await
            .ok()
    }

    /// A store error the local line answers for (noted on the route), or
    /// `Err` with it. `what` says what the local line does, for the log.
    fn fall_back(&self, route: &RouteRt, err: StoreError, what: &str) -> Result<(), StoreError> {
        if !falls_back(route) {
            return Err(err);
        }
        tracing::debug!(route = route.name(), error = %err, "{what}");
        route.live.note_answered_locally();
        Ok(())
    }

    /// Polls ticket `id` in the store, else in the local line.
    pub async fn poll(
        &self,
        route: &RouteRt,
        id: &VisitorId,
        client: ClientKey<'_>,
        times: TicketTimes,
    ) -> Result<(Poll, By), StoreError> {
        let polled = self
            .shared
            .poll(route.name(), id, client, times, &route.limits)
            .await;
        match polled {
            Ok(p) => return Ok((p, By::Shared)),
            Err(err) => self.fall_back(route, err, "polling the local line")?,
        }
        let limits = route.local_limits_now();
        let polled = self
            .local
            .poll(route.name(), id, client, times, &limits)
            .await?;
        Ok((polled, By::Local))
    }

    /// Admits at once or queues visitor `id` in `lane` in the store (a
    /// shared store takes this instance's arrivals in batches, against the
    /// store's epoch as this instance knows it), else in the local line.
    /// Just after an opening the store may be busy with the shuffle: the
    /// local line lets nobody in at once then.
    pub async fn arrive(
        &self,
        route: &RouteRt,
        id: &VisitorId,
        client: ClientKey<'_>,
        admit_now: bool,
        lane: usize,
    ) -> Result<(Arrival, By), StoreError> {
        // A store lost since the last tick is noticed here too, before
        // anyone is let in at once.
        let known_epoch_us = route.live.known_epoch_us();
        let limits_now = route.limits_now();
        let (name, limits) = (route.name(), &*limits_now);
        let arrived = if self.shared.is_shared() {
            let arriving = Arriving {
                id: *id,
                client: client.to_vec(),
                admit_now,
                lane,
            };
            route
                .live
                .joins()
                .arrive(&self.shared, name, arriving, limits, known_epoch_us)
                .await
        } else {
            self.shared
                .arrive(name, id, client, limits, admit_now, known_epoch_us, lane)
                .await
        };
        match arrived {
            Ok(a) => return Ok((a, By::Shared)),
            Err(err) => self.fall_back(route, err, "arriving in the local line")?,
        }
        let admit_now = admit_now && !route.just_opened(self.clock.now_us());
        let limits = route.local_limits_now();
        let arrival = self
            .local
            .arrive(name, id, client, &limits, admit_now, None, lane)
            .await?;
        Ok((arrival, By::Local))
    }

    /// Renews in the local line a session it granted, on a route that falls
    /// back to it (the store could not renew it).
    pub async fn renew_local(
        &self,
        route: &RouteRt,
        id: &VisitorId,
        client: ClientKey<'_>,
        times: PassTimes,
    ) {
        if falls_back(route) {
            let limits = route.local_limits_now();
            let _ = self
                .local
                .renew(route.name(), id, client, times, &limits)
                .await;
        }
    }
}
