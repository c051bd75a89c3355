//! The Redis store's calls for a route split into sub-lines (`shards` > 1;
//! the rules, the naming and the tick's plan are in `queue::shards`).
//!
//! Every call about one visitor goes to its sub-line alone, with the
//! sub-line's limits ([`sub_limits`]: `shards` 0, so the scripts read the
//! sub-line's share as their capacity). Calls about the route go to every
//! sub-line, one after another (K is small; a tick's calls are a few
//! milliseconds on K masters), and their answers are added up. The tick is
//! coordinated by one instance per tick window; the others only look at
//! each sub-line's epoch (noticing a lost one) and line length.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::PoisonError;

use super::{
    field, lane_key, ms, prepare, unexpected_reply, Arrival, Arriving, ClientKey, Ended, Heartbeat,
    LineRecord, Poll, RedisStore, RouteStats, StoreError, Tick, TicketTimes, VisitorId,
};
use crate::queue::record;
use crate::queue::shards::{self, Look};
use crate::queue::Limits;

/// A flag that answers true the first time it is asked only.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Once(bool);

impl Once {
    fn not_yet(&mut self) -> bool {
        !std::mem::replace(&mut self.0, true)
    }
}

/// What this store saw of a split route's sub-lines, by the last tick.
#[derive(Clone, Debug, Default)]
pub(super) struct Seen {
    /// The sub-lines' names (`shards::sub_routes`), computed once.
    names: Vec<String>,
    /// Each sub-line's epoch as last seen: what a call passes as the epoch
    /// it knows, so a sub-line lost since starts its hold.
    epochs: Vec<Option<u64>>,
    /// Waiters in each lane of each sub-line: an arrival's place counts
    /// the other sub-lines' waiters ahead of it.
    lane_waiting: Vec<Vec<u64>>,
    /// A refusal to tick (another split in the store) was logged.
    refusal_logged: Once,
}

/// The limits of one sub-line's calls: capacity is its share (`shards` 0,
/// see `capacity_arg`), and what the route allows in total is split evenly:
/// at-once admissions per tick window, the line's length and the
/// per-client limits, each rounded up.
pub(super) fn sub_limits(limits: &Limits) -> Limits {
    let k = u64::from(limits.shards.max(1));
    let mut sub = limits.clone();
    sub.shards = 0;
    sub.max_admit_per_tick = shards::at_once_budget(limits.max_admit_per_tick, limits.shards);
    sub.max_waiting = limits.max_waiting.div_ceil(k);
    sub.client_places = limits.client_places.div_ceil(k);
    sub.client_joins_per_minute = limits.client_joins_per_minute.div_ceil(k);
    sub
}

/// The longest a coordinator may take, in store time, before another may:
/// a tick window plus six store calls' timeouts (look, give, add and the
/// sub-line's tick, each bounded).
fn lease_ms(store: &RedisStore, limits: &Limits) -> u64 {
    ms(limits.tick).max(1) + 6 * ms(store.timeout)
}

impl RedisStore {
    /// What this store saw of `route` (split in `limits.shards`), created
    /// with its names on first use.
    fn seen(&self, route: &str, limits: &Limits) -> Seen {
        let mut splits = self.splits.lock().unwrap_or_else(PoisonError::into_inner);
        let seen = splits.entry(route.to_owned()).or_default();
        if seen.names.len() != limits.shards as usize {
            *seen = Seen {
                names: shards::sub_routes(route, limits.shards),
                epochs: vec![None; limits.shards as usize],
                lane_waiting: vec![Vec::new(); limits.shards as usize],
                refusal_logged: seen.refusal_logged,
            };
        }
        seen.clone()
    }

    fn remember(&self, route: &str, update: impl FnOnce(&mut Seen)) {
        let mut splits = self.splits.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(seen) = splits.get_mut(route) {
            update(seen);
        }
    }

    /// The line holding visitor `id` of route `route`, and the limits of
    /// calls to it: its sub-line on a split route, else the route's line.
    pub(super) fn visitor_line<'a>(
        &self,
        route: &'a str,
        id: &VisitorId,
        limits: &'a Limits,
    ) -> (Cow<'a, str>, Cow<'a, Limits>) {
        if limits.shards <= 1 {
            return (Cow::Borrowed(route), Cow::Borrowed(limits));
        }
        let k = shards::shard_of(id, limits.shards);
        let line = self.sub_name(route, limits, k);
        (Cow::Owned(line), Cow::Owned(sub_limits(limits)))
    }

    /// The name of sub-line `k` of split route `route`, without copying the
    /// rest of what this store saw of it.
    fn sub_name(&self, route: &str, limits: &Limits, k: usize) -> String {
        let splits = self.splits.lock().unwrap_or_else(PoisonError::into_inner);
        match splits.get(route) {
            Some(seen) if seen.names.len() == limits.shards as usize => seen.names[k].clone(),
            _ => {
                drop(splits);
                self.seen(route, limits).names[k].clone()
            }
        }
    }

    /// Arrivals, each in its sub-line (one call per sub-line with any), in
    /// their order within each. A place counts the waiters of the same lane
    /// in the other sub-lines as the last tick saw them.
    pub(super) async fn split_arrive(
        &self,
        route: &str,
        arrivals: &[Arriving],
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Vec<Arrival>, StoreError> {
        let seen = self.seen(route, limits);
        let sub = sub_limits(limits);
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); seen.names.len()];
        for (i, arrival) in arrivals.iter().enumerate() {
            groups[shards::shard_of(&arrival.id, limits.shards)].push(i);
        }
        let mut answers: Vec<Option<Arrival>> = vec![None; arrivals.len()];
        for (k, group) in groups.iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let batch: Vec<Arriving> = group.iter().map(|&i| arrivals[i].clone()).collect();
            let known = known_epoch_us.and(seen.epochs[k]);
            let got = self
                .arrive_batch_on(&seen.names[k], &batch, &sub, known)
                .await?;
            for (&i, answer) in group.iter().zip(got) {
                answers[i] = Some(match answer {
                    Arrival::Waiting(mut place) => {
                        let others = others_waiting(&seen, k, Some(place.lane));
                        place.position += others;
                        place.waiting_total += others;
                        Arrival::Waiting(place)
                    }
                    Arrival::Full { waiting_total } => Arrival::Full {
                        waiting_total: waiting_total + others_waiting(&seen, k, None),
                    },
                    other => other,
                });
            }
        }
        answers
            .into_iter()
            .map(|a| a.ok_or_else(|| unexpected_reply("arrive: an arrival unanswered".into())))
            .collect()
    }

    /// A poll in the visitor's sub-line; a waiter's place then counts,
    /// exactly, those ahead of it in the same lane of every other sub-line.
    pub(super) async fn split_poll(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        ticket: TicketTimes,
        limits: &Limits,
    ) -> Result<Poll, StoreError> {
        let seen = self.seen(route, limits);
        let k = shards::shard_of(id, limits.shards);
        let sub = sub_limits(limits);
        let poll = self
            .poll_on(&seen.names[k], id, client, ticket, &sub)
            .await?;
        let Poll::Waiting(mut place) = poll else {
            return Ok(poll);
        };
        let lane = &limits.lanes.get(limits.lanes.clamp(place.lane)).name;
        for (j, name) in seen.names.iter().enumerate() {
            if j == k {
                continue;
            }
            let mut invocation = self.scripts.ahead.prepare_invoke();
            invocation.key(lane_key(name, lane)).arg(place.score_us);
            let reply: Vec<u64> = self.run(&invocation).await?;
            place.position += field(&reply, 0, "ahead")?;
            place.waiting_total += field(&reply, 1, "ahead")?;
        }
        Ok(Poll::Waiting(place))
    }

    /// One tick of a split route: coordinated by whichever instance takes
    /// the lease for this tick window; the others look at the sub-lines'
    /// epochs and lines only. The answer adds up the sub-lines' ticks; its
    /// epoch is the latest sub-line's, so the loss of any one changes it.
    pub(super) async fn split_tick(
        &self,
        route: &str,
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Tick, StoreError> {
        let seen = self.seen(route, limits);
        let mut invocation = self.scripts.coord.prepare_invoke();
        invocation
            .key(format!("qg:{{{route}}}:coord"))
            .key(format!("qg:{{{route}}}:stats"))
            .arg("take")
            .arg(ms(limits.tick).max(1))
            .arg(lease_ms(self, limits));
        let generation: u64 = self.run(&invocation).await?;
        if generation == 0 {
            return self.split_peek(route, &seen, limits, known_epoch_us).await;
        }
        let tick = self
            .coordinate(route, &seen, limits, known_epoch_us, generation)
            .await;
        let mut release = self.scripts.coord.prepare_invoke();
        release
            .key(format!("qg:{{{route}}}:coord"))
            .key(format!("qg:{{{route}}}:stats"))
            .arg("release")
            .arg(generation);
        // A lease not released ends by itself.
        let _: Result<i64, _> = self.run(&release).await;
        tick
    }

    async fn split_peek(
        &self,
        route: &str,
        seen: &Seen,
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Tick, StoreError> {
        let sub = sub_limits(limits);
        let mut epochs = seen.epochs.clone();
        let mut lane_waiting = seen.lane_waiting.clone();
        let mut now_us = 0;
        let mut failure = None;
        for (k, name) in seen.names.iter().enumerate() {
            let mut invocation = prepare(&self.scripts.shares, name, &sub, None);
            invocation
                .arg("peek")
                .arg(0)
                .arg(epoch_arg(known_epoch_us.and(seen.epochs[k])))
                .arg(ms(limits.pass_ttl))
                .arg(limits.shards);
            match self.run::<Vec<u64>>(&invocation).await {
                Ok(reply) if reply.first() == Some(&2) => {
                    return Err(self.split_refused(route, &reply, limits));
                }
                Ok(reply) if reply.len() == 3 + limits.lanes.len() && reply[0] == 1 => {
                    epochs[k] = Some(reply[1]);
                    now_us = now_us.max(reply[2]);
                    lane_waiting[k] = reply[3..].to_vec();
                }
                Ok(reply) => failure = Some(unexpected_reply(format!("peek: {reply:?}"))),
                Err(e) => failure = Some(e),
            }
        }
        if let Some(e) = failure.filter(|_| now_us == 0) {
            return Err(e);
        }
        self.remember(route, |s| {
            s.epochs.clone_from(&epochs);
            s.lane_waiting.clone_from(&lane_waiting);
        });
        Ok(Tick::idle(
            now_us,
            epochs.iter().flatten().copied().max().unwrap_or(0),
        ))
    }

    /// The coordinated tick (see `queue::shards`): look at every sub-line,
    /// move free capacity where the first heads are (only when every look
    /// answered: a sub-line not seen could hold any share), then run each
    /// sub-line's own tick within its share and its heads.
    async fn coordinate(
        &self,
        route: &str,
        seen: &Seen,
        limits: &Limits,
        known_epoch_us: Option<u64>,
        generation: u64,
    ) -> Result<Tick, StoreError> {
        let sub = sub_limits(limits);
        let Some((looks, mut epochs)) = self
            .look(route, seen, limits, &sub, known_epoch_us, generation)
            .await?
        else {
            return self.split_peek(route, seen, limits, known_epoch_us).await;
        };
        let (max_admit, open) = self
            .move_shares(seen, limits, &sub, generation, &looks)
            .await;
        let mut ticks = Vec::with_capacity(seen.names.len());
        let mut failure = None;
        for (k, name) in seen.names.iter().enumerate() {
            let mut own = sub.clone();
            own.max_admit_per_tick = max_admit[k];
            match self
                .admit_tick_on(name, &own, known_epoch_us.and(seen.epochs[k]), Some(open))
                .await
            {
                Ok(t) => {
                    epochs[k] = Some(t.epoch_us);
                    ticks.push((k, t));
                }
                Err(e) => {
                    tracing::debug!(route, sub_line = %name, error = %e, "split tick: sub-line tick failed");
                    failure = Some(e);
                }
            }
        }
        if ticks.is_empty() {
            return Err(
                failure.unwrap_or_else(|| unexpected_reply("split tick: no sub-line".into()))
            );
        }
        self.remember(route, |s| {
            s.epochs.clone_from(&epochs);
            for (k, t) in &ticks {
                if t.ran {
                    s.lane_waiting[*k].clone_from(&t.lane_waiting);
                }
            }
        });
        let epoch_us = epochs.iter().flatten().copied().max().unwrap_or(0);
        Ok(sum_ticks(&ticks, seen, limits.lanes.len(), epoch_us))
    }

    /// The coordinated tick's first step: looks at every sub-line, and
    /// answers what each look saw (`None` where it failed) with the
    /// sub-lines' epochs; `None` when this coordinator is stale.
    async fn look(
        &self,
        route: &str,
        seen: &Seen,
        limits: &Limits,
        sub: &Limits,
        known_epoch_us: Option<u64>,
        generation: u64,
    ) -> Result<Option<(Vec<Option<Look>>, Vec<Option<u64>>)>, StoreError> {
        let mut looks: Vec<Option<Look>> = vec![None; seen.names.len()];
        let mut epochs = seen.epochs.clone();
        for (k, name) in seen.names.iter().enumerate() {
            let mut invocation = prepare(&self.scripts.shares, name, sub, None);
            invocation
                .arg("look")
                .arg(generation)
                .arg(limits.max_admit_per_tick)
                .arg(limits.shards)
                .arg(ms(limits.tick).max(1))
                .arg(sub.max_admit_per_tick)
                .arg(epoch_arg(known_epoch_us.and(seen.epochs[k])))
                .arg(ms(limits.pass_ttl));
            let reply: Vec<u64> = match self.run(&invocation).await {
                Ok(reply) => reply,
                Err(e) => {
                    tracing::debug!(route, sub_line = %name, error = %e, "split tick: look failed");
                    continue;
                }
            };
            match reply.first() {
                Some(1) if reply.len() >= 9 => {
                    epochs[k] = Some(reply[5]);
                    looks[k] = Some(Look {
                        has_share: reply[1] == 1,
                        share: reply[2],
                        active: reply[3],
                        held: reply[4] == 1,
                        used: reply[7],
                        waiting: reply[8],
                        heads: reply[9..].to_vec(),
                    });
                }
                Some(2) => return Err(self.split_refused(route, &reply, limits)),
                // A later coordinator looked: this one is stale.
                _ => return Ok(None),
            }
        }
        Ok(Some((looks, epochs)))
    }

    /// The coordinated tick's second step: moves capacity between the
    /// sub-lines' shares as `shards::plan` says, and answers each
    /// sub-line's most to admit this tick and whether anyone may be let in
    /// at once.
    async fn move_shares(
        &self,
        seen: &Seen,
        limits: &Limits,
        sub: &Limits,
        generation: u64,
        looks: &[Option<Look>],
    ) -> (Vec<u64>, bool) {
        let mut max_admit: Vec<u64> = looks
            .iter()
            .map(|l| l.as_ref().map_or(0, |l| l.used))
            .collect();
        // Unless every sub-line was seen, nobody is let in at once.
        let mut open = false;
        if let Some(looks) = looks.iter().cloned().collect::<Option<Vec<Look>>>() {
            let plan = shards::plan(limits.capacity, limits.max_admit_per_tick, &looks);
            let mut available = plan.unheld;
            for (k, &give) in plan.give.iter().enumerate() {
                if give > 0 {
                    available += self
                        .move_share(&seen.names[k], sub, generation, "give", give)
                        .await;
                }
            }
            for &(k, amount) in &plan.add {
                let amount = amount.min(available);
                // A sub-line without a share gets one even of 0.
                if amount > 0 || !looks[k].has_share {
                    available -= amount;
                    self.move_share(&seen.names[k], sub, generation, "add", amount)
                        .await;
                }
            }
            max_admit = plan.max_admit;
            open = plan.open;
        }
        (max_admit, open)
    }

    /// Gives (`op` "give") or adds capacity to a sub-line's share, stamped
    /// with `generation`; answers what was given back (0 when refused or
    /// failed: capacity not moved is never counted as moved).
    async fn move_share(
        &self,
        name: &str,
        sub: &Limits,
        generation: u64,
        op: &str,
        amount: u64,
    ) -> u64 {
        let mut invocation = prepare(&self.scripts.shares, name, sub, None);
        invocation.arg(op).arg(generation).arg(amount);
        match self.run::<Vec<u64>>(&invocation).await {
            Ok(reply) if reply.first() == Some(&1) => reply.get(1).copied().unwrap_or(0),
            Ok(_) => 0,
            Err(e) => {
                tracing::debug!(sub_line = %name, op, error = %e, "split tick: share not moved");
                0
            }
        }
    }

    /// The error for a sub-line that answered it belongs to another split
    /// (`{2, held}`), logged once.
    fn split_refused(&self, route: &str, reply: &[u64], limits: &Limits) -> StoreError {
        let held = reply.get(1).copied().unwrap_or(0);
        self.refuse_split(route, held, limits.shards);
        unexpected_reply(format!(
            "route {route} is split in {held} sub-lines in the store, not {}",
            limits.shards
        ))
    }

    /// Logs, once per route, that the store holds the route split another
    /// way than configured (`held` sub-lines, `configured` by `shards`).
    pub(super) fn refuse_split(&self, route: &str, held: u64, configured: u32) {
        let first = self
            .splits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(route.to_owned())
            .or_default()
            .refusal_logged
            .not_yet();
        if first {
            tracing::error!(
                route,
                held,
                configured,
                "the store holds this route's line split in {held} sub-lines, but `shards` \
                 is {configured}: nobody is admitted until they agree (set `shards` back, or \
                 change it only once the route's line and sessions are empty)"
            );
        }
    }

    /// Every sub-line holds (a route's hold).
    pub(super) async fn split_hold(&self, route: &str, limits: &Limits) -> Result<(), StoreError> {
        let seen = self.seen(route, limits);
        let sub = sub_limits(limits);
        let mut failure = None;
        for name in &seen.names {
            if let Err(e) = self.hold_on(name, &sub).await {
                failure = Some(e);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Heartbeats, each sent to its waiter's sub-line.
    pub(super) async fn split_heartbeats(
        &self,
        route: &str,
        beats: &[Heartbeat],
        limits: &Limits,
    ) -> Result<Vec<bool>, StoreError> {
        let seen = self.seen(route, limits);
        let sub = sub_limits(limits);
        let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, beat) in beats.iter().enumerate() {
            groups
                .entry(shards::shard_of(&beat.id, limits.shards))
                .or_default()
                .push(i);
        }
        let mut answers = vec![false; beats.len()];
        for (k, group) in groups {
            let batch: Vec<Heartbeat> = group.iter().map(|&i| beats[i].clone()).collect();
            let got = self.heartbeats_on(&seen.names[k], &batch, &sub).await?;
            for (&i, in_line) in group.iter().zip(got) {
                answers[i] = in_line;
            }
        }
        Ok(answers)
    }

    /// The places ended in every sub-line; the time of the next call is
    /// the earliest sub-line's, so no end is missed between two reads.
    pub(super) async fn split_ended_since(
        &self,
        route: &str,
        since_ms: u64,
        limits: &Limits,
    ) -> Result<Ended, StoreError> {
        let seen = self.seen(route, limits);
        let sub = sub_limits(limits);
        let mut ended = Ended {
            ids: Vec::new(),
            now_ms: u64::MAX,
        };
        for name in &seen.names {
            let part = self.ended_since_on(name, since_ms, &sub).await?;
            ended.ids.extend(part.ids);
            ended.now_ms = ended.now_ms.min(part.now_ms);
        }
        Ok(ended)
    }

    /// The sub-lines' records merged (`record::merge`); none until every
    /// sub-line has one.
    pub(super) async fn split_line_record(
        &self,
        route: &str,
        limits: &Limits,
    ) -> Result<Option<LineRecord>, StoreError> {
        let seen = self.seen(route, limits);
        let sub = sub_limits(limits);
        let mut records = Vec::with_capacity(seen.names.len());
        for name in &seen.names {
            match self.line_record_on(name, &sub).await? {
                Some(record) => records.push(record),
                None => return Ok(None),
            }
        }
        Ok(Some(record::merge(&records)))
    }

    /// The route's numbers: the sub-lines' added up (the admit rate too);
    /// the latest epoch and hold.
    pub(super) async fn split_stats(
        &self,
        route: &str,
        limits: &Limits,
    ) -> Result<RouteStats, StoreError> {
        let seen = self.seen(route, limits);
        let sub = sub_limits(limits);
        let mut total: Option<RouteStats> = None;
        for name in &seen.names {
            let part = self.stats_on(name, &sub).await?;
            let Some(sum) = total.as_mut() else {
                total = Some(part);
                continue;
            };
            sum.waiting += part.waiting;
            sum.active += part.active;
            sum.admitted_total += part.admitted_total;
            sum.admit_rate += part.admit_rate;
            sum.epoch_us = sum.epoch_us.max(part.epoch_us);
            sum.hold_until_us = sum.hold_until_us.max(part.hold_until_us);
            sum.now_us = sum.now_us.max(part.now_us);
            for (lane, more) in sum.lanes.iter_mut().zip(&part.lanes) {
                lane.waiting += more.waiting;
                lane.admitted_total += more.admitted_total;
            }
        }
        total.ok_or_else(|| unexpected_reply("stats: no sub-line".into()))
    }
}

/// The sub-lines' ticks (by sub-line index) as one tick of the route: sums
/// and the latest time, lane waiters as last seen for a sub-line whose tick
/// did not run.
fn sum_ticks(ticks: &[(usize, Tick)], seen: &Seen, lanes: usize, epoch_us: u64) -> Tick {
    let mut tick = Tick {
        lane_admitted: vec![0; lanes],
        lane_waiting: vec![0; lanes],
        lane_heads: vec![None; lanes],
        ..Tick::idle(0, epoch_us)
    };
    // (join score, lane) of every admission, put in join order below.
    let mut admitted: Vec<(u64, usize)> = Vec::new();
    for (k, t) in ticks {
        tick.ran |= t.ran;
        tick.now_us = tick.now_us.max(t.now_us);
        tick.abandoned += t.abandoned;
        tick.no_shows += t.no_shows;
        tick.unconfirmed_sessions += t.unconfirmed_sessions;
        tick.unconfirmed_tickets += t.unconfirmed_tickets;
        if let Some(shuffled) = t.opened {
            tick.opened = Some(tick.opened.unwrap_or(0) + shuffled);
        }
        admitted.extend(
            t.admitted_scores
                .iter()
                .copied()
                .zip(t.admitted_lanes.iter().copied()),
        );
        if t.ran {
            for (head, sub) in tick.lane_heads.iter_mut().zip(&t.lane_heads) {
                *head = match (*head, *sub) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        let waiting = if t.ran {
            &t.lane_waiting
        } else {
            &seen.lane_waiting[*k]
        };
        for (sum, n) in tick.lane_admitted.iter_mut().zip(&t.lane_admitted) {
            *sum += n;
        }
        for (sum, n) in tick.lane_waiting.iter_mut().zip(waiting) {
            *sum += n;
        }
    }
    admitted.sort_unstable();
    (tick.admitted_scores, tick.admitted_lanes) = admitted.into_iter().unzip();
    if !tick.ran {
        tick.lane_admitted.clear();
        tick.lane_waiting.clear();
        tick.lane_heads.clear();
    }
    tick
}

/// Waiters in the other sub-lines than `k`, in `lane` (`None`: every lane),
/// as the last tick saw them.
fn others_waiting(seen: &Seen, k: usize, lane: Option<usize>) -> u64 {
    seen.lane_waiting
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != k)
        .map(|(_, lanes)| match lane {
            Some(l) => lanes.get(l).copied().unwrap_or(0),
            None => lanes.iter().sum(),
        })
        .sum()
}

fn epoch_arg(epoch_us: Option<u64>) -> String {
    epoch_us.map(|e| e.to_string()).unwrap_or_default()
}
