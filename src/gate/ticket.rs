//! A ticket's poll: answered before the opening with the time left, from
//! the line record behind the head of the line, or by the store (the
//! local line while it cannot); an invite moving a held ticket to its
//! lane. The ticket cookie, from the cookie jar.

use std::time::Duration;

use http::header::HeaderValue;

use super::lines::falls_back;
use super::{Admitted, By, Decision, Gate, Requester};
use crate::admission::{Claims, Kind, VisitorId};
use crate::queue::{Heartbeat, Place, Poll, QueueStore, TicketTimes};
use crate::route::{RouteRt, Settings};

impl Gate {
    /// A ticket: poll the line (a heartbeat; the first one confirms the
    /// ticket). `None` means the place is gone.
    pub async fn check_ticket(
        &self,
        s: &Settings,
        route: &RouteRt,
        ticket: &Claims,
        who: Requester<'_>,
    ) -> Option<Decision> {
        let mut times = TicketTimes {
            score_us: ticket.t,
            seen_us: ticket.at.unwrap_or(ticket.t),
            lane: route.lane_index(ticket.lane.as_ref()),
        };
        // An invite moves a held ticket to its lane, keeping its place in
        // time (DESIGN §8.5); the ticket is written again to say so.
        let mut moved = false;
        if let Some(to) = who.invited.map(|i| i.lane).filter(|&to| to != times.lane) {
            if self.move_ticket(route, ticket, to).await {
                times.lane = to;
                moved = true;
            }
        }
        let now_us = self.clock.now_us();
        let opening = route.opening_ahead(now_us);
        if let (Kind::PreTicket, Some(opens_at_us)) = (ticket.kind, opening) {
            // Before the opening a pre-queue ticket is answered here, unless
            // a flush found it out of the store's line: the store then
            // restores it or lets it go (and it joins again, losing nothing
            // before a shuffle).
            if !route.live.is_out_of_line(&ticket.id) {
                return Some(self.before_opening(s, route, ticket, times, opens_at_us, moved, who));
            }
        }
        if moved {
            // The record may not know the move yet: the store answers.
        } else if ticket.kind == Kind::PreTicket {
            // Its score is the arrival's, not the place the opening drew:
            // the store answers, and the ticket is written again with it.
        } else if let Some(decision) = self.answer_from_record(s, route, ticket, times, who) {
            route.metrics.poll(true);
            return Some(decision);
        }
        // A place that ended is not restored by a store that lost its
        // tombstone, nor taken in by the local line.
        if route.live.has_ended(&ticket.id, now_us / 1_000_000) {
            return None;
        }
        route.metrics.poll(false);
        route.live.polled_in_store(&ticket.id);
        self.poll_line(s, route, ticket, times, now_us, who).await
    }

    /// A ticket's poll the store answers (or the local line, while the
    /// store cannot and the route falls back to it): its place, or a pass
    /// when its turn came.
    async fn poll_line(
        &self,
        s: &Settings,
        route: &RouteRt,
        ticket: &Claims,
        times: TicketTimes,
        now_us: u64,
        who: Requester<'_>,
    ) -> Option<Decision> {
        let polled = self.lines.poll(route, &ticket.id, who.client, times).await;
        let (polled, granted) = match polled {
            Ok((p, By::Shared)) => (p, Kind::Pass),
            Ok((p, By::Local)) => {
                if self.lines.shared.is_shared() && matches!(p, Poll::Waiting(_)) {
                    // The ticket's own record of the poll moves on; the
                    // store hears of it with the flush once it answers
                    // again, so that the polls the record answers next
                    // (which send no heartbeat while the ticket's is
                    // fresh) find the waiter alive in the store.
                    route.live.heartbeat(Heartbeat {
                        id: ticket.id,
                        client: who.client.to_vec(),
                    });
                }
                (p, Kind::LocalPass)
            }
            // The local line could not answer either: the place is gone.
            Err(_) if falls_back(route) => return None,
            Err(err) => return Some(self.store_failed(route, &err)),
        };
        match polled {
            Poll::Waiting(place) => Some(self.waiting(s, route, ticket, times, place, now_us, who)),
            Poll::Admitted => {
                if granted == Kind::LocalPass {
                    route.live.note_granted_locally();
                }
                Some(Decision::Admit {
                    how: Admitted::FromLine,
                    set_cookie: Some(self.pass_cookie(s, route, &ticket.id, granted, who.tls)),
                    session: Some(ticket.id),
                })
            }
            Poll::Gone => None,
        }
    }

    /// A ticket the line holds at `place`: waiting, or in the pre-queue
    /// before the opening.
    #[allow(clippy::too_many_arguments)]
    fn waiting(
        &self,
        s: &Settings,
        route: &RouteRt,
        ticket: &Claims,
        times: TicketTimes,
        place: Place,
        now_us: u64,
        who: Requester<'_>,
    ) -> Decision {
        // Written again when due, when the store holds the ticket in
        // another lane than it names (moved, or its lane removed), or at
        // another score (the opening's shuffle moved it).
        let seen = self.seen_again(route, ticket, times);
        let relaned = route.lane_tag(place.lane) != ticket.lane;
        // A pre-queue ticket stays one until the shuffle gave it its place:
        // while the store still holds it at its arrival score, before the
        // opening.
        let kind = match (ticket.kind, route.limits.opens_at_us) {
            (Kind::PreTicket, Some(opens_at_us))
                if place.score_us == ticket.t && place.score_us < opens_at_us =>
            {
                Kind::PreTicket
            }
            _ => Kind::Ticket,
        };
        let rewritten = kind != ticket.kind || place.score_us != ticket.t;
        let set_cookie = (seen.is_some() || relaned || rewritten).then(|| {
            self.place_cookie(
                s,
                route,
                kind,
                &ticket.id,
                place.score_us,
                seen.or(ticket.at),
                place.lane,
                who.tls,
            )
        });
        if let (Kind::PreTicket, Some(opens_at_us)) = (kind, route.opening_ahead(now_us)) {
            return Decision::PreQueue {
                opens_at_us,
                opens_in_ms: (opens_at_us - now_us).div_ceil(1_000),
                lane: place.lane,
                set_cookie,
            };
        }
        Decision::Wait { place, set_cookie }
    }

    /// The ticket carries when the line last saw its holder, so a restore
    /// after a store loss can tell a live waiter from one that had gone
    /// silent before it (DESIGN §8.3). It is written again on the first poll
    /// and then every quarter of abandon_after, not on every poll: the time
    /// to write (µs), or `None`.
    fn seen_again(&self, route: &RouteRt, ticket: &Claims, times: TicketTimes) -> Option<u64> {
        let now_us = self.clock.now_us().max(ticket.t + 1);
        let refresh_us = route.limits.abandon_after.as_micros() as u64 / 4;
        let stale = !times.confirmed() || now_us.saturating_sub(times.seen_us) > refresh_us;
        stale.then_some(now_us)
    }

    /// A pre-queue ticket's poll before the opening, answered without a
    /// store call: the time left. Its heartbeat goes to the store with the
    /// admitter's next flush at the moments the ticket is written again
    /// (its first poll, then every quarter of `abandon_after`), as for a
    /// poll the line record answers, so a live waiter is not dropped as a
    /// ghost before the opening and a silent one is.
    #[allow(clippy::too_many_arguments)]
    fn before_opening(
        &self,
        s: &Settings,
        route: &RouteRt,
        ticket: &Claims,
        times: TicketTimes,
        opens_at_us: u64,
        moved: bool,
        who: Requester<'_>,
    ) -> Decision {
        let seen = self.seen_again(route, ticket, times);
        if seen.is_some() {
            route.live.heartbeat(Heartbeat {
                id: ticket.id,
                client: who.client.to_vec(),
            });
        }
        let set_cookie = (seen.is_some() || moved).then(|| {
            self.place_cookie(
                s,
                route,
                Kind::PreTicket,
                &ticket.id,
                ticket.t,
                seen.or(ticket.at),
                times.lane,
                who.tls,
            )
        });
        Decision::PreQueue {
            opens_at_us,
            opens_in_ms: opens_at_us
                .saturating_sub(self.clock.now_us())
                .div_ceil(1_000),
            lane: times.lane,
            set_cookie,
        }
    }

    /// A poll answered from the line record, without a store call, when the
    /// store is shared, the ticket was confirmed, and the record places it
    /// behind the head of the line (DESIGN §8.9). The poll's heartbeat goes
    /// to the store with the next flush, at the same moments the ticket's
    /// own record of it is written again, so the store's last poll of a
    /// waiter lags the ticket's by one tick at most.
    fn answer_from_record(
        &self,
        s: &Settings,
        route: &RouteRt,
        ticket: &Claims,
        times: TicketTimes,
        who: Requester<'_>,
    ) -> Option<Decision> {
        if !self.lines.shared.is_shared() || !times.confirmed() {
            return None;
        }
        // Silent for abandon_after: dropped as a ghost, or about to be; the
        // store says which (a live waiter's ticket is written again every
        // quarter of it).
        let silent_us = self.clock.now_us().saturating_sub(times.seen_us);
        if silent_us >= route.limits.abandon_after.as_micros() as u64 {
            return None;
        }
        // Three ticks without a record: the admitter is not reaching the
        // store, and the store (or the local line) answers.
        let fresh_for = route.limits.tick * 3 + Duration::from_millis(500);
        let lane = route.limits.lanes.clamp(times.lane);
        let placed = route.live.place_from_record(
            &ticket.id,
            &route.limits.lanes.get(lane).name,
            ticket.t,
            fresh_for,
            &route.limits.lanes,
        )?;
        let set_cookie = self.seen_again(route, ticket, times).map(|now_us| {
            route.live.heartbeat(Heartbeat {
                id: ticket.id,
                client: who.client.to_vec(),
            });
            self.ticket_cookie(s, route, &ticket.id, ticket.t, Some(now_us), lane, who.tls)
        });
        let place = Place {
            score_us: ticket.t,
            position: placed.position,
            waiting_total: placed.waiting_total,
            lane,
        };
        Some(Decision::Wait { place, set_cookie })
    }

    /// Moves the waiter holding `ticket` to lane `to`, keeping its join
    /// score (DESIGN §8.5): whether it was waiting and moved.
    pub async fn move_ticket(&self, route: &RouteRt, ticket: &Claims, to: usize) -> bool {
        match self
            .lines
            .shared
            .move_lane(route.name(), &ticket.id, to, &route.limits)
            .await
        {
            Ok(moved) => moved,
            Err(err) => {
                tracing::debug!(route = route.name(), error = %err, "ticket not moved to the invite's lane");
                false
            }
        }
    }

    /// A ticket for `id` at join score `score_us`, last seen at `seen_us`
    /// (none for a new ticket), waiting in lane `lane`, as a `Set-Cookie`
    /// value.
    #[allow(clippy::too_many_arguments)]
    pub fn ticket_cookie(
        &self,
        s: &Settings,
        route: &RouteRt,
        id: &VisitorId,
        score_us: u64,
        seen_us: Option<u64>,
        lane: usize,
        tls: bool,
    ) -> HeaderValue {
        self.place_cookie(s, route, Kind::Ticket, id, score_us, seen_us, lane, tls)
    }

    /// [`Gate::ticket_cookie`] for a ticket of `kind`: `w`, or `p` before
    /// the route's opening.
    #[allow(clippy::too_many_arguments)]
    pub fn place_cookie(
        &self,
        s: &Settings,
        route: &RouteRt,
        kind: Kind,
        id: &VisitorId,
        score_us: u64,
        seen_us: Option<u64>,
        lane: usize,
        tls: bool,
    ) -> HeaderValue {
        s.jar().place(
            route.cookie_name(tls),
            route.name(),
            kind,
            id,
            score_us,
            seen_us,
            route.lane_tag(lane).as_ref(),
            tls,
        )
    }
}
