//! The line record: the line of a route as the last admitter tick left it,
//! which every instance reads once per tick so that a status poll from behind
//! the head of the line is answered without a store call (DESIGN §8.9).
//!
//! # What it holds
//!
//! The route's epoch and, for each lane, its name, the number waiting in it,
//! and the join scores found at a fixed set of ranks (1-based places in the
//! lane), the *samples*:
//!
//! ```text
//! r₀ = HEAD (100), r₁ = r₀ + max(1, ⌊r₀ / 50⌋), …, every rᵢ < waiting, then waiting
//! ```
//!
//! so consecutive sampled ranks are at most 2 % apart and the number of
//! samples grows with the logarithm of the line: about 500 for a million
//! waiting, 600 for ten million. The memory store and `lua/admit_tick.lua`
//! take the same ranks.
//!
//! # What a poll is answered
//!
//! A waiter (in a lane the record has) whose join score lies strictly after
//! the lane's sample at `HEAD` and at or before its last sample is ranked by interpolating between the two
//! samples around its score. Ranks follow join scores, so its real rank when
//! the record was taken lies between those two sampled ranks: the answer is
//! within 2 % of it whatever the pattern of leaving ahead, and exact at a
//! sample. Everyone else (the first `HEAD` places, where admission is close
//! and positions are small, a ticket newer than the record or older than the
//! epoch) is answered by the store as before ([`LineRecord::position`]
//! returns `None`).
//!
//! # Wire format (the stats hash's `record` field in Redis)
//!
//! `epoch_us;lane;lane;…`, each lane `name,waiting,r₀,s₀,r₁,s₁,…` (decimal
//! integers joined by `,`). A record without `;` is one written before
//! lanes, `epoch_us,waiting,r₀,s₀,…`, read as the lane `main`. A record
//! that does not parse is no record ([`LineRecord::parse`] answers `None`);
//! polls then go to the store. A lane's share of the admission rate (for
//! its ETA) follows from the lanes' counts and the configured weights
//! ([`super::Lanes::share`]).

/// Places at the head of the line answered by the store, never estimated.
pub const HEAD: u64 = 100;

/// The ranks sampled in a line of `waiting` (ascending; empty when the line
/// is no longer than [`HEAD`] − 1).
pub fn sample_ranks(waiting: u64) -> impl Iterator<Item = u64> {
    let mut next = HEAD;
    let mut done = waiting < HEAD;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        if next < waiting {
            let rank = next;
            next += (next / 50).max(1);
            Some(rank)
        } else {
            done = true;
            Some(waiting)
        }
    })
}

/// A line as one tick left it: each lane's count and samples.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LineRecord {
    /// The route's epoch (µs) when the record was taken.
    pub epoch_us: u64,
    /// The route's lanes as the tick knew them, in its order.
    pub lanes: Vec<LaneRecord>,
}

/// One lane of a [`LineRecord`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaneRecord {
    /// The lane's name.
    pub name: String,
    /// People in the lane then.
    pub waiting: u64,
    /// (rank within the lane, join score µs) at each of
    /// [`sample_ranks`]`(waiting)`, in order; both ascend.
    pub samples: Vec<(u64, u64)>,
}

impl LaneRecord {
    /// The estimated place in this lane of a waiter who joined at
    /// `score_us`, or `None` when the store must answer: within the first
    /// [`HEAD`] places (or admitted, or gone), or newer than the record.
    fn position(&self, score_us: u64) -> Option<u64> {
        let &(_, head_score) = self.samples.first()?;
        let &(_, last_score) = self.samples.last()?;
        if score_us <= head_score || score_us > last_score {
            return None;
        }
        // The first sample at or after the score; the one before it is
        // strictly before (the head's score is).
        let after = self.samples.partition_point(|&(_, s)| s < score_us);
        let (r_hi, s_hi) = self.samples[after];
        if s_hi == score_us {
            return Some(r_hi);
        }
        let (r_lo, s_lo) = self.samples[after - 1];
        let gap = r_hi - r_lo;
        if gap < 2 {
            // No rank between two neighbours: the score is not in line (it
            // left since). The lower bound of where it would be.
            return Some(r_hi);
        }
        let fraction = (score_us - s_lo) as f64 / (s_hi - s_lo) as f64;
        let inside = (fraction * gap as f64).round() as u64;
        Some(r_lo + inside.clamp(1, gap - 1))
    }

    fn encode_into(&self, out: &mut String) {
        out.push_str(&format!("{},{}", self.name, self.waiting));
        for (rank, score) in &self.samples {
            out.push_str(&format!(",{rank},{score}"));
        }
    }

    fn parse(text: &str, name: Option<&str>) -> Option<LaneRecord> {
        let mut parts = text.split(',');
        let name = match name {
            Some(name) => name.to_owned(),
            None => parts.next()?.to_owned(),
        };
        if !super::is_lane_name(&name) {
            return None;
        }
        let mut numbers = parts.map(|n| n.parse::<u64>().ok());
        let waiting = numbers.next()??;
        let mut samples = Vec::new();
        let mut ranks = sample_ranks(waiting);
        let mut last_score = None;
        while let Some(rank) = numbers.next() {
            let rank = rank?;
            let score = numbers.next()??;
            if ranks.next() != Some(rank) || last_score.is_some_and(|s| s >= score) {
                return None;
            }
            last_score = Some(score);
            samples.push((rank, score));
        }
        if ranks.next().is_some() {
            return None;
        }
        Some(LaneRecord {
            name,
            waiting,
            samples,
        })
    }
}

impl LineRecord {
    /// The lane named `name`.
    pub fn lane(&self, name: &str) -> Option<&LaneRecord> {
        self.lanes.iter().find(|l| l.name == name)
    }

    /// People in line then, every lane together.
    pub fn waiting(&self) -> u64 {
        self.lanes.iter().map(|l| l.waiting).sum()
    }

    /// The estimated place in lane `lane` of a waiter who joined at
    /// `score_us`, or `None` when the store must answer: within the first
    /// [`HEAD`] places of the lane (or admitted, or gone), newer than the
    /// record, from before the epoch, or in a lane the record lacks.
    pub fn position(&self, lane: &str, score_us: u64) -> Option<u64> {
        if score_us < self.epoch_us {
            return None;
        }
        self.lane(lane)?.position(score_us)
    }

    /// The record's wire form (see the module doc).
    pub fn encode(&self) -> String {
        let mut out = self.epoch_us.to_string();
        for lane in &self.lanes {
            out.push(';');
            lane.encode_into(&mut out);
        }
        out
    }

    /// Reads the wire form; `None` for anything malformed: samples not
    /// ascending, not at the ranks the rule gives, a lane named twice or
    /// badly, or not a number. A record without lanes (`epoch,waiting,…`,
    /// as written before lanes) is the lane `main`.
    pub fn parse(text: &str) -> Option<LineRecord> {
        let Some((epoch, lanes)) = text.split_once(';') else {
            let (epoch, rest) = text.split_once(',')?;
            return Some(LineRecord {
                epoch_us: epoch.parse().ok()?,
                lanes: vec![LaneRecord::parse(rest, Some(super::MAIN_LANE))?],
            });
        };
        let epoch_us = epoch.parse().ok()?;
        let mut parsed: Vec<LaneRecord> = Vec::new();
        for lane in lanes.split(';') {
            let lane = LaneRecord::parse(lane, None)?;
            if parsed.iter().any(|l| l.name == lane.name) {
                return None;
            }
            parsed.push(lane);
        }
        Some(LineRecord {
            epoch_us,
            lanes: parsed,
        })
    }
}

/// The records of a split route's sub-lines (`shards`) read as one line:
/// per lane, the ranks of every sub-line summed at each sample score of any
/// of them, from the first score behind every sub-line's head on. Each
/// sub-line's rank at another's sample is interpolated as
/// [`LineRecord::position`] does, so the sum is within 2 % of the real rank
/// too, and the head of the merged line (at least [`HEAD`] places of every
/// sub-line) is answered by the store. A lane some sub-line lacks, or holds
/// waiters in without samples (fewer than [`HEAD`]), keeps its count but no
/// samples: its polls go to the store. The epoch is the latest: a ticket
/// from before any sub-line's epoch goes to the store.
pub fn merge(records: &[LineRecord]) -> LineRecord {
    let mut merged = LineRecord {
        epoch_us: records.iter().map(|r| r.epoch_us).max().unwrap_or(0),
        lanes: Vec::new(),
    };
    let Some(first) = records.first() else {
        return merged;
    };
    for lane in &first.lanes {
        let parts: Vec<&LaneRecord> = records.iter().filter_map(|r| r.lane(&lane.name)).collect();
        // Where some sub-line cannot be placed in, nobody can: the lane
        // keeps its count and no samples.
        let placeable = parts.len() == records.len()
            && parts
                .iter()
                .all(|p| p.waiting == 0 || !p.samples.is_empty());
        let sampled: Vec<&LaneRecord> = parts
            .iter()
            .copied()
            .filter(|p| !p.samples.is_empty())
            .collect();
        let waiting = parts.iter().map(|p| p.waiting).sum();
        let mut samples = Vec::new();
        let start = sampled.iter().map(|p| p.samples[0].1).max();
        if let Some(start) = start.filter(|_| placeable) {
            let mut scores: Vec<u64> = sampled
                .iter()
                .flat_map(|p| p.samples.iter().map(|&(_, s)| s))
                .filter(|&s| s >= start)
                .collect();
            scores.sort_unstable();
            scores.dedup();
            for score in scores {
                let rank: u64 = sampled.iter().map(|p| p.rank_at(score)).sum();
                if samples.last().is_none_or(|&(r, _)| rank > r) {
                    samples.push((rank, score));
                }
            }
        }
        merged.lanes.push(LaneRecord {
            name: lane.name.clone(),
            waiting,
            samples,
        });
    }
    merged
}

impl LaneRecord {
    /// The rank in this lane of the last waiter at or before `score_us`
    /// (at or after the first sample): exact at a sample, interpolated
    /// between two, everyone past the last.
    fn rank_at(&self, score_us: u64) -> u64 {
        let after = self.samples.partition_point(|&(_, s)| s < score_us);
        let Some(&(r_hi, s_hi)) = self.samples.get(after) else {
            return self.waiting;
        };
        if s_hi == score_us || after == 0 {
            return r_hi;
        }
        let (r_lo, s_lo) = self.samples[after - 1];
        let fraction = (score_us - s_lo) as f64 / (s_hi - s_lo) as f64;
        r_lo + (fraction * (r_hi - r_lo) as f64).floor() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A line of `scores` (ascending) as a record.
    fn record_of(scores: &[u64]) -> LineRecord {
        let waiting = scores.len() as u64;
        LineRecord {
            epoch_us: 0,
            lanes: vec![LaneRecord {
                name: "main".into(),
                waiting,
                samples: sample_ranks(waiting)
                    .map(|r| (r, scores[r as usize - 1]))
                    .collect(),
            }],
        }
    }

    #[test]
    fn ranks_start_at_the_head_end_at_the_last_and_stay_two_percent_apart() {
        assert_eq!(sample_ranks(99).count(), 0);
        assert_eq!(sample_ranks(100).collect::<Vec<_>>(), vec![100]);
        assert_eq!(sample_ranks(103).collect::<Vec<_>>(), vec![100, 102, 103]);
        let ranks: Vec<u64> = sample_ranks(1_000_000).collect();
        assert_eq!(ranks[0], HEAD);
        assert_eq!(*ranks.last().unwrap(), 1_000_000);
        assert!(ranks.len() < 550, "{} samples", ranks.len());
        for pair in ranks.windows(2) {
            assert!(pair[1] > pair[0]);
            assert!(pair[1] - pair[0] <= (pair[0] / 50).max(1), "{pair:?}");
        }
        assert!(sample_ranks(10_000_000).count() < 700);
    }

    #[test]
    fn the_head_newer_tickets_and_older_epochs_go_to_the_store() {
        let scores: Vec<u64> = (1..=1_000).map(|i| 1_000 + i * 10).collect();
        let record = LineRecord {
            epoch_us: 1_000,
            ..record_of(&scores)
        };
        assert_eq!(record.position("main", scores[0]), None);
        assert_eq!(
            record.position("main", scores[99]),
            None,
            "rank 100 is the head"
        );
        assert_eq!(record.position("main", scores[100]), Some(101));
        assert_eq!(record.position("main", scores[999]), Some(1_000));
        assert_eq!(
            record.position("main", scores[999] + 1),
            None,
            "newer than the record"
        );
        assert_eq!(record.position("main", 999), None, "before the epoch");
        assert_eq!(LineRecord::default().position("main", 5), None);
    }

    #[test]
    fn a_line_nobody_left_is_ranked_exactly_when_joins_are_even() {
        let scores: Vec<u64> = (0..50_000).map(|i| 7 + i * 3).collect();
        let record = record_of(&scores);
        for (i, &s) in scores.iter().enumerate().skip(HEAD as usize) {
            assert_eq!(record.position("main", s), Some(i as u64 + 1));
        }
    }

    proptest! {
        /// A line split into sub-lines (each waiter in one of them, scores
        /// unique), its records merged: every waiter behind the merged head
        /// is placed within 2 % of its rank in the whole line, and every
        /// waiter the merged record leaves to the store is within the first
        /// HEAD places of some sub-line.
        #[test]
        fn merged_records_rank_within_two_percent(
            gaps in proptest::collection::vec((1u64..1_000_000, 0usize..3), 300..6_000),
            picks in proptest::collection::vec(any::<prop::sample::Index>(), 1..50),
        ) {
            let mut all = Vec::with_capacity(gaps.len());
            let mut subs: Vec<Vec<u64>> = vec![Vec::new(); 3];
            let mut at = 0;
            for (g, k) in gaps {
                at += g;
                all.push(at);
                subs[k].push(at);
            }
            let records: Vec<LineRecord> = subs.iter().map(|s| record_of(s)).collect();
            let merged = merge(&records);
            prop_assert_eq!(merged.waiting(), all.len() as u64);
            for pick in picks {
                let i = pick.index(all.len());
                let rank = i as u64 + 1;
                match merged.position("main", all[i]) {
                    None => {
                        let in_head = subs.iter().any(|s| {
                            s.len() < HEAD as usize
                                || s.get(HEAD as usize - 1).is_some_and(|&h| all[i] <= h)
                        });
                        prop_assert!(in_head, "rank {} not placed", rank);
                    }
                    Some(p) => {
                        let error = p.abs_diff(rank) as f64 / rank as f64;
                        prop_assert!(error <= 0.02, "rank {} shown {}", rank, p);
                    }
                }
            }
        }

        /// Whatever the gaps between join times (bursts, pauses, people
        /// leaving), the estimate is within 2 % of the real rank.
        #[test]
        fn the_estimate_is_within_two_percent(
            gaps in proptest::collection::vec(1u64..1_000_000, 150..6_000),
            picks in proptest::collection::vec(any::<prop::sample::Index>(), 1..50),
        ) {
            let mut scores = Vec::with_capacity(gaps.len());
            let mut at = 0;
            for g in gaps {
                at += g;
                scores.push(at);
            }
            let record = record_of(&scores);
            for pick in picks {
                let i = pick.index(scores.len());
                let rank = i as u64 + 1;
                match record.position("main", scores[i]) {
                    None => prop_assert!(rank <= HEAD),
                    Some(p) => {
                        prop_assert!(rank > HEAD);
                        let error = p.abs_diff(rank) as f64 / rank as f64;
                        prop_assert!(error <= 0.02, "rank {} shown {}", rank, p);
                    }
                }
            }
        }

        #[test]
        fn the_wire_form_reads_back(
            waiting in 0u64..5_000,
            epoch_us in any::<u64>(),
            start in 0u64..1_000_000,
        ) {
            let scores: Vec<u64> = (0..waiting).map(|i| start + i * 2).collect();
            let record = LineRecord { epoch_us, ..record_of(&scores) };
            prop_assert_eq!(LineRecord::parse(&record.encode()), Some(record));
        }

        #[test]
        fn garbage_is_no_record(text in ".{0,200}") {
            if let Some(record) = LineRecord::parse(&text) {
                prop_assert_eq!(LineRecord::parse(&record.encode()), Some(record));
            }
        }
    }

    #[test]
    fn lanes_are_ranked_apart_and_a_missing_lane_goes_to_the_store() {
        let main = record_of(&(0..300).map(|i| 10 + i * 2).collect::<Vec<_>>());
        let vip = record_of(&(0..150).map(|i| 11 + i * 2).collect::<Vec<_>>());
        let record = LineRecord {
            epoch_us: 0,
            lanes: vec![
                main.lanes[0].clone(),
                LaneRecord {
                    name: "vip".into(),
                    ..vip.lanes[0].clone()
                },
            ],
        };
        assert_eq!(record.waiting(), 450);
        assert_eq!(record.position("main", 10 + 200 * 2), Some(201));
        assert_eq!(record.position("vip", 11 + 120 * 2), Some(121));
        assert_eq!(record.position("vip", 11 + 20 * 2), None, "the lane's head");
        assert_eq!(record.position("late", 11 + 120 * 2), None);
        let text = record.encode();
        assert!(text.starts_with("0;main,300,100,"), "{text}");
        assert_eq!(LineRecord::parse(&text), Some(record));
    }

    #[test]
    fn a_record_from_before_lanes_is_the_main_lane() {
        let legacy = "7,101,100,50,101,60";
        let record = LineRecord::parse(legacy).unwrap();
        assert_eq!(record.epoch_us, 7);
        assert_eq!(record.lanes.len(), 1);
        assert_eq!(record.lanes[0].name, "main");
        assert_eq!(record.lanes[0].samples, vec![(100, 50), (101, 60)]);
    }

    #[test]
    fn malformed_records_are_refused() {
        let good = record_of(&(0..200).collect::<Vec<_>>()).encode();
        assert!(LineRecord::parse(&good).is_some());
        for bad in [
            "",
            "1",
            "1,x",
            "1,200,100,5",
            "1,200,100,99,102,98",
            "1,50,100,5",
            &format!("{good},1"),
            &good.replacen(",100,", ",101,", 1),
            "1;main,0;main,0",
            "1;Main,0",
            "1;",
        ] {
            assert_eq!(LineRecord::parse(bad), None, "{bad}");
        }
    }
}
