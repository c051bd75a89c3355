//! A route's line split into sub-lines (`shards: K`, DESIGN §8.9): what the
//! Redis store does with it, in pure functions (the calls are in
//! `redis_store/split.rs`).
//!
//! One Redis slot holds an unsplit route, so one core serves its line. A
//! split route keeps K *sub-lines*, each a whole route's keys (line, active
//! set, stats, tombstones, heartbeats) under its own hash tag, so each lives
//! in its own slot and, on a Cluster, on its own master.
//!
//! # Where a visitor is
//!
//! Sub-line 0 is the route's own keys (`qg:{route}:…`); sub-line k > 0 is
//! `qg:{route#k.n}:…`, where n is the smallest number that puts the tag's
//! slot in the k-th of the K equal ranges of the 16,384 slots that sub-line
//! 0's slot does not fall in. A Cluster made with `redis-cli --cluster
//! create` gives each master one such range, so on K masters every sub-line
//! has its own ([`sub_routes`]). A visitor's sub-line follows from its
//! random id ([`shard_of`]), so every call about a visitor finds it with no
//! cookie field, and a line splits evenly.
//!
//! K is fixed while the store holds the route: a sub-line records the split
//! it belongs to, and the tick refuses to run on another (a line from before
//! a split counts as a split of one) rather than lose places.
//!
//! # Capacity: shares
//!
//! Each sub-line admits (at once, from its line, or by restoring a session
//! after a loss) only within its *share* of the capacity, kept in its stats
//! hash, exactly as an unsplit route admits within its capacity. So the
//! route never holds more sessions than the shares' sum, and the shares
//! never sum to more than the capacity:
//!
//! - one instance per tick window coordinates (`coord.lua`: a lease and a
//!   generation that only rises); it looks at every sub-line, stamping it
//!   with its generation, then gives and adds capacity, each stamped write
//!   refused once a later coordinator has looked there. So on each sub-line
//!   the writes of successive coordinators never interleave, and each
//!   coordinator sees the last accepted writes of the one before;
//! - a coordinator only takes back *free* share (share − active), and adds
//!   at most what it took back plus what its looks showed no sub-line held
//!   (capacity − Σ shares). By induction the sum stays within capacity;
//!   when capacity is lowered it gives back free share and adds nothing;
//! - a sub-line lost with its store has no share: the capacity it held is
//!   what no sub-line holds, and goes back to it (to the lost ones, evenly).
//!   Its sessions come back during its hold as on an unsplit route; they
//!   held slots counted in that share.
//!
//! # Order
//!
//! Join scores are store time (µs), so they compare across sub-lines as
//! far as the masters' clocks agree (NTP keeps them within milliseconds).
//! Each tick the coordinator merges the heads of every sub-line by score
//! and moves free capacity to the sub-lines holding the first of them
//! ([`plan`]); each sub-line's own tick then admits those from its line,
//! FIFO within it (lanes shared by weight within it). While nobody waits
//! anywhere, what capacity the heads do not need is spread evenly and the
//! sub-lines may admit arrivals at once within their shares (the tick tells
//! them, `open` in their stats); once anyone waits, nobody is admitted at
//! once until the line is empty again, and the free capacity goes to the
//! heads. So an arrival is let in ahead of an earlier one only within one
//! tick (the earlier one reached a sub-line without free share while the
//! route looked open).
//!
//! # What differs from an unsplit route
//!
//! - A tick is about four store calls per sub-line (look, give or add, the
//!   sub-line's tick, and the record), on K slots instead of one.
//! - At-once admissions: only while the route's line was empty at the last
//!   tick, each sub-line within its share and at most ⌈max_admit_per_tick /
//!   K⌉ per tick window; so a window admits at most `max_admit_per_tick` +
//!   K − 1 (the line's heads take what the window has left). An arrival on a
//!   sub-line whose share is used up waits for the next tick even when
//!   another has room.
//! - Positions: the store answers a poll with the visitor's place in its
//!   sub-line plus the waiters of the same lane ahead of it in the others
//!   (a count each); an arrival's first place counts the others' lines as
//!   the last tick left them. Polls behind the head are answered from the
//!   records of every sub-line merged ([`super::record::merge`]).

use super::VisitorId;

/// Slots in a Redis Cluster.
const SLOTS: u32 = 16_384;

/// The slot of a key as Redis Cluster computes it: CRC16 (XMODEM) of its
/// hash tag (the part between the first `{` and the next `}`, when not
/// empty) or of the whole key, modulo 16,384. Written here because the
/// Redis client keeps its own private.
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = key
        .find('{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    (crc16_xmodem(tagged) as u32 % SLOTS) as u16
}

fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot range (of `shards` equal ones) that `slot` falls in.
fn range_of(slot: u16, shards: u32) -> u32 {
    u32::from(slot) * shards / SLOTS
}

/// The names whose keys hold each of the route's `shards` sub-lines, in
/// order: `route` itself, then `route#k.n` (see the module doc). One name,
/// the route's, for a route not split.
pub fn sub_routes(route: &str, shards: u32) -> Vec<String> {
    let shards = shards.max(1);
    let mut names = vec![route.to_owned()];
    if shards == 1 {
        return names;
    }
    let taken = range_of(key_slot(&format!("{{{route}}}")), shards);
    let ranges = (0..shards).filter(|&r| r != taken);
    for (k, range) in (1..shards).zip(ranges) {
        let name = (0u32..)
            .map(|n| format!("{route}#{k}.{n}"))
            .find(|name| range_of(key_slot(&format!("{{{name}}}")), shards) == range)
            .unwrap_or_else(|| format!("{route}#{k}"));
        names.push(name);
    }
    names
}

/// The sub-line (index into [`sub_routes`]) of visitor `id`: its four
/// 32-bit words folded together, modulo the count. Ids are random, so any
/// bits would do; folding them all spreads ids that differ anywhere.
pub fn shard_of(id: &VisitorId, shards: u32) -> usize {
    let folded = id
        .chunks_exact(4)
        .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
        .fold(0, |acc, w| acc ^ w);
    (folded % shards.max(1)) as usize
}

/// The at-once admissions one sub-line may spend per tick window.
pub fn at_once_budget(max_admit_per_tick: u64, shards: u32) -> u64 {
    max_admit_per_tick.div_ceil(u64::from(shards.max(1)))
}

/// What a coordinator saw of one sub-line (`shares.lua` look).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Look {
    /// Whether the sub-line has a share at all (none: new, or lost with
    /// its store).
    pub has_share: bool,
    pub share: u64,
    /// Live sessions.
    pub active: u64,
    /// In a hold: admits nobody new, so takes no part in the merge.
    pub held: bool,
    /// Admissions already made in its current tick window.
    pub used: u64,
    /// People in its line, every lane together.
    pub waiting: u64,
    /// Join scores of its first waiters, every lane together, ascending.
    pub heads: Vec<u64>,
}

impl Look {
    fn free(&self) -> u64 {
        self.share.saturating_sub(self.active)
    }
}

/// The moves of one coordinated tick.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Free share each sub-line gives back (0: none).
    pub give: Vec<u64>,
    /// Capacity no sub-line holds, added with what the gives bring.
    pub unheld: u64,
    /// Capacity to add, to which sub-line, in the order to add it (first
    /// the sub-lines lost with their store, then by their first head).
    pub add: Vec<(usize, u64)>,
    /// Per sub-line, the admissions its tick window may reach: what it has
    /// spent plus its heads among the merged first.
    pub max_admit: Vec<u64>,
    /// Per sub-line, how many of its heads are among the merged first.
    pub from_line: Vec<u64>,
    /// Nobody waits in any sub-line: arrivals may be admitted at once
    /// (each sub-line within its share) until the next tick.
    pub open: bool,
}

/// The tick's moves for a route of `capacity` admitting at most `budget`
/// per tick window, given each sub-line's look (see the module doc).
pub fn plan(capacity: u64, budget: u64, looks: &[Look]) -> Plan {
    let n = looks.len();
    let mut plan = Plan {
        give: vec![0; n],
        unheld: 0,
        add: Vec::new(),
        max_admit: looks.iter().map(|l| l.used).collect(),
        from_line: vec![0; n],
        open: false,
    };
    let held_total: u64 = looks.iter().map(|l| l.share).sum();
    if held_total > capacity {
        // Capacity lowered: free share goes back, nothing is added.
        let mut excess = held_total - capacity;
        for (k, look) in looks.iter().enumerate() {
            let give = look.free().min(excess);
            plan.give[k] = give;
            excess -= give;
        }
        return plan;
    }
    let unheld = capacity - held_total;
    plan.unheld = unheld;
    // Sub-lines lost with their store take back what no sub-line holds;
    // on a new route (none has a share) it goes where the heads are.
    let lost: Vec<usize> = (0..n).filter(|&k| !looks[k].has_share).collect();
    let fresh = lost.len() == n && looks.iter().all(|l| !l.held);
    let mut pool = if fresh || lost.is_empty() { unheld } else { 0 };
    if !fresh && !lost.is_empty() {
        let each = unheld / lost.len() as u64;
        let mut rest = unheld % lost.len() as u64;
        for &k in &lost {
            let extra = u64::from(rest > 0);
            rest = rest.saturating_sub(1);
            // Added even when nothing: the sub-line then has a share (0),
            // and takes part in the merge from the next tick on.
            plan.add.push((k, each + extra));
        }
    }
    let pooled: Vec<usize> = (0..n)
        .filter(|&k| !looks[k].held && (fresh || looks[k].has_share))
        .collect();
    for &k in &pooled {
        pool += looks[k].free();
    }
    let used: u64 = looks.iter().map(|l| l.used).sum();
    let take = pool.min(budget.saturating_sub(used));
    plan.from_line = merge_heads(looks, &pooled, take);
    let taken: u64 = plan.from_line.iter().sum();
    let spare = pool - taken;
    // The rest, evenly, for arrivals admitted at once, but only while
    // nobody waits anywhere (`open`): otherwise it is held by no sub-line
    // until the heads need it, so nobody is let in at once ahead of them.
    let mut target: Vec<u64> = plan.from_line.clone();
    plan.open = looks.iter().all(|l| l.waiting == 0);
    if !pooled.is_empty() && plan.open {
        let each = spare / pooled.len() as u64;
        let mut rest = spare % pooled.len() as u64;
        for &k in &pooled {
            target[k] += each + u64::from(rest > 0);
            rest = rest.saturating_sub(1);
        }
    }
    move_to_targets(&mut plan, looks, &pooled, &target);
    // Every sub-line without a share gets one, if only of 0 (see above).
    for k in lost {
        if !plan.add.iter().any(|&(j, _)| j == k) {
            plan.add.push((k, 0));
        }
    }
    plan
}

/// How many of each sub-line's heads are among the first `take` heads of
/// the `pooled` sub-lines, merged by score (the lower index first on a tie).
fn merge_heads(looks: &[Look], pooled: &[usize], take: u64) -> Vec<u64> {
    let mut from_line = vec![0; looks.len()];
    let mut cursor = vec![0usize; looks.len()];
    for _ in 0..take {
        let next = pooled
            .iter()
            .copied()
            .filter_map(|k| looks[k].heads.get(cursor[k]).map(|&s| (s, k)))
            .min();
        let Some((_, k)) = next else { break };
        cursor[k] += 1;
        from_line[k] += 1;
    }
    from_line
}

/// The gives and adds that bring each `pooled` sub-line's free share to its
/// `target`, and the admissions its tick window may reach.
fn move_to_targets(plan: &mut Plan, looks: &[Look], pooled: &[usize], target: &[u64]) {
    // Adds in the order of each sub-line's first head among those taken.
    let mut adds: Vec<(u64, usize, u64)> = Vec::new();
    for &k in pooled {
        let free = looks[k].free();
        let want = target[k];
        if want < free {
            plan.give[k] = free - want;
        } else if want > free {
            let first = if plan.from_line[k] > 0 {
                looks[k].heads[0]
            } else {
                u64::MAX
            };
            adds.push((first, k, want - free));
        }
        plan.max_admit[k] = looks[k].used + plan.from_line[k];
    }
    adds.sort_unstable();
    plan.add
        .extend(adds.into_iter().map(|(_, k, amount)| (k, amount)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn slots_are_redis_cluster_slots() {
        // Values from `CLUSTER KEYSLOT` (and the CRC16 check value).
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("foo{}{bar}"), key_slot("foo{}{bar}"));
        assert_ne!(key_slot("foo{}{bar}"), key_slot("bar"));
    }

    #[test]
    fn sub_lines_fall_in_distinct_slot_ranges() {
        for route in ["tickets", "a", "route1", "launch-2027"] {
            assert_eq!(sub_routes(route, 1), vec![route.to_owned()]);
            for shards in 2..=16 {
                let names = sub_routes(route, shards);
                assert_eq!(names.len(), shards as usize);
                assert_eq!(names[0], route);
                let mut ranges: Vec<u32> = names
                    .iter()
                    .map(|n| range_of(key_slot(&format!("qg:{{{n}}}:waiting")), shards))
                    .collect();
                ranges.sort_unstable();
                ranges.dedup();
                assert_eq!(ranges.len(), shards as usize, "{route} in {shards}");
                assert!(names[1..]
                    .iter()
                    .all(|n| n.starts_with(&format!("{route}#"))));
            }
        }
    }

    #[test]
    fn visitors_spread_over_the_sub_lines() {
        let mut counts = [0u32; 3];
        for i in 0u32..3000 {
            let mut id = [0u8; 16];
            id[12..].copy_from_slice(&i.wrapping_mul(2_654_435_761).to_be_bytes());
            counts[shard_of(&id, 3)] += 1;
        }
        assert!(counts.iter().all(|&c| c > 900), "{counts:?}");
    }

    fn look(share: u64, active: u64, heads: &[u64]) -> Look {
        Look {
            has_share: true,
            share,
            active,
            held: false,
            used: 0,
            waiting: heads.len() as u64,
            heads: heads.to_vec(),
        }
    }

    #[test]
    fn a_new_route_gives_its_capacity_where_the_first_heads_are() {
        let fresh = |heads: &[u64]| Look {
            has_share: false,
            ..look(0, 0, heads)
        };
        let p = plan(10, 4, &[fresh(&[1, 5]), fresh(&[2, 3, 4]), fresh(&[])]);
        assert_eq!(p.from_line, [1, 3, 0]);
        assert_eq!(p.unheld, 10);
        // People wait: the 6 the heads do not need go to nobody, and every
        // sub-line gets a share, the last one of 0.
        assert!(!p.open);
        assert_eq!(p.add, vec![(0, 1), (1, 3), (2, 0)]);
        assert_eq!(p.max_admit, [1, 3, 0]);
    }

    #[test]
    fn an_empty_route_spreads_its_capacity_for_arrivals_at_once() {
        let fresh = Look {
            has_share: false,
            ..look(0, 0, &[])
        };
        let p = plan(10, 4, &[fresh.clone(), fresh.clone(), fresh]);
        assert!(p.open);
        assert_eq!(p.add, vec![(0, 4), (1, 3), (2, 3)]);
        assert_eq!(p.from_line, [0, 0, 0]);
    }

    #[test]
    fn free_share_moves_to_the_earliest_heads() {
        // 4 free in sub-line 0 with late heads, none in 1 with early ones.
        let p = plan(10, 20, &[look(6, 2, &[50, 60]), look(4, 4, &[10, 20, 30])]);
        assert_eq!(p.from_line, [1, 3]);
        assert_eq!(p.give, [3, 0]);
        assert_eq!(p.add, vec![(1, 3)]);
    }

    #[test]
    fn lowered_capacity_takes_back_free_share_only() {
        let p = plan(5, 20, &[look(6, 5, &[1]), look(4, 1, &[2])]);
        assert_eq!(p.give, [1, 3]);
        assert!(p.add.is_empty());
        assert_eq!(p.from_line, [0, 0]);
    }

    #[test]
    fn a_lost_sub_line_gets_back_what_nobody_holds_and_a_held_one_keeps_its_share() {
        let lost = Look {
            has_share: false,
            held: true,
            ..look(0, 3, &[1])
        };
        let held = Look {
            held: true,
            ..look(3, 3, &[2])
        };
        let p = plan(10, 20, &[look(4, 4, &[9]), lost, held]);
        assert_eq!(p.add, vec![(1, 3)]);
        assert_eq!(p.give, [0, 0, 0]);
        assert_eq!(p.from_line, [0, 0, 0]);
    }

    fn looks() -> impl Strategy<Value = Vec<Look>> {
        prop::collection::vec(
            (
                any::<bool>(),
                0u64..20,
                0u64..20,
                any::<bool>(),
                0u64..5,
                prop::collection::btree_set(0u64..1000, 0..8),
            )
                .prop_map(|(has_share, share, active, held, used, heads)| Look {
                    has_share,
                    share: if has_share { share } else { 0 },
                    active,
                    held,
                    used,
                    waiting: heads.len() as u64,
                    heads: heads.into_iter().collect(),
                }),
            1..6,
        )
    }

    proptest! {
        /// Whatever the looks, and however much less than asked each give
        /// brings back (arrivals admitted at once meanwhile), the shares
        /// never sum over the capacity unless they did before (then they
        /// only shrink), no give takes a share below its active count, and
        /// the heads taken are the first of the merged line.
        #[test]
        fn shares_never_sum_over_the_capacity(
            capacity in 0u64..60,
            budget in 0u64..30,
            looks in looks(),
            shortfall in prop::collection::vec(0u64..3, 6),
        ) {
            let p = plan(capacity, budget, &looks);
            let before: u64 = looks.iter().map(|l| l.share).sum();
            let mut shares: Vec<u64> = looks.iter().map(|l| l.share).collect();
            let mut available = p.unheld;
            for (k, &give) in p.give.iter().enumerate() {
                prop_assert!(give <= looks[k].share.saturating_sub(looks[k].active));
                let given = give.saturating_sub(shortfall[k]);
                shares[k] -= given;
                available += given;
            }
            for &(k, amount) in &p.add {
                let amount = amount.min(available);
                available -= amount;
                shares[k] += amount;
            }
            let after: u64 = shares.iter().sum();
            if before <= capacity {
                prop_assert!(after <= capacity);
            } else {
                prop_assert!(after <= before);
                prop_assert!(p.add.is_empty());
            }
            // Heads taken: a prefix of each pooled sub-line, and none left
            // behind earlier than one taken.
            let taken: u64 = p.from_line.iter().sum();
            let used: u64 = looks.iter().map(|l| l.used).sum();
            prop_assert!(taken <= budget.saturating_sub(used));
            let last_taken = (0..looks.len())
                .filter(|&k| p.from_line[k] > 0)
                .map(|k| looks[k].heads[p.from_line[k] as usize - 1])
                .max();
            let fresh = looks.iter().all(|l| !l.has_share);
            if let Some(last) = last_taken {
                for (k, l) in looks.iter().enumerate() {
                    if l.held || !(fresh || l.has_share) {
                        prop_assert_eq!(p.from_line[k], 0);
                        continue;
                    }
                    if let Some(&next) = l.heads.get(p.from_line[k] as usize) {
                        prop_assert!(next >= last);
                    }
                }
            }
        }
    }
}
