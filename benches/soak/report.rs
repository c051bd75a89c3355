//! What the soak measured, as Markdown, and its section of `benches/README.md`.
//!
//! Every 5xx and every failed tunnel is put next to the faults: a `502` or
//! `504` while the origin was down (or within a few seconds after it came
//! back) is explained, anything else is not.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::fs;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::fleet;
use crate::load::{IdleEnd, Segment, SlowEnd, Tunnel};
use crate::proxy_report::{command_line, today};
use crate::sim::{self, Crowd};
use crate::Phases;

/// Marks around the generated part of `benches/README.md`.
const BEGIN: &str = "<!-- soak-results:begin -->";
const END: &str = "<!-- soak-results:end -->";

/// After the origin is back, pooled connections to the old process and
/// requests sent just before may still fail for this long.
const ORIGIN_SLACK: Duration = Duration::from_secs(3);
/// After Redis is back, the breaker closes and locally admitted visitors'
/// sessions run out within this long.
const STORE_SLACK: Duration = Duration::from_secs(15);
/// After the capacity is lowered, visitors already admitted keep their
/// slots until they leave or their session ends (3 browses of up to 1.5 s,
/// `session_ttl` 5 s).
const DECREASE_GRACE: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    OriginKilled,
    RedisPaused,
    RedisKilled,
    CapacityUp,
    CapacityDown,
    KeyRotated,
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultKind::OriginKilled => "origin killed",
            FaultKind::RedisPaused => "Redis paused",
            FaultKind::RedisKilled => "Redis killed",
            FaultKind::CapacityUp => "capacity up",
            FaultKind::CapacityDown => "capacity down",
            FaultKind::KeyRotated => "key rotated",
        })
    }
}

/// One fault, since the start of the soak.
#[derive(Clone, Debug)]
pub struct Fault {
    pub kind: FaultKind,
    pub from: Duration,
    pub until: Duration,
    /// The capacity in force once it was done.
    pub capacity: u64,
    pub note: String,
}

/// queuegate's resident memory and open descriptors at one moment.
#[derive(Clone, Debug)]
pub struct Memory {
    pub label: &'static str,
    pub rss_kb: u64,
    pub fds: usize,
}

impl Memory {
    pub fn read(label: &'static str, pid: u32) -> Self {
        Self {
            label,
            rss_kb: fleet::rss_kb(pid),
            fds: fleet::open_fds(pid),
        }
    }
}

/// Everything one soak run saw.
pub struct Soak {
    pub minutes: f64,
    pub connections: u32,
    pub delay_ms: u64,
    pub rate: f64,
    pub visitors: usize,
    pub capacity: u64,
    pub phases: Phases,
    pub connection_limits: bool,
    /// `release`, or a warning that the numbers are not comparable.
    pub build: &'static str,
    pub redis_version: String,
    /// When the crowd's clock started, since the start of the soak.
    pub crowd_offset: Duration,
    pub crowd: Crowd,
    pub faults: Vec<Fault>,
    pub segments: Vec<Segment>,
    pub tunnels: Vec<(Duration, Tunnel)>,
    /// (started, found out, how it ended).
    pub slow: Vec<(Duration, Duration, SlowEnd)>,
    pub idle: Vec<IdleEnd>,
    pub memory: Vec<Memory>,
    /// queuegate's store errors so far, sampled every second.
    pub store_errors: Vec<(Duration, u64)>,
}

/// 5xx (and requests without an answer) by where they came from.
#[derive(Default)]
struct Failures {
    /// 502/504 from queuegate while the origin was down: expected.
    explained: BTreeMap<(u16, String), u64>,
    /// Anything else.
    unexplained: BTreeMap<(u16, String), u64>,
}

impl Failures {
    fn total(map: &BTreeMap<(u16, String), u64>) -> u64 {
        map.values().sum()
    }
}

impl Soak {
    /// Windows in which the origin was down, with slack after.
    fn origin_down(&self) -> Vec<(Duration, Duration)> {
        self.windows(&[FaultKind::OriginKilled], ORIGIN_SLACK)
    }

    fn store_down(&self) -> Vec<(Duration, Duration)> {
        self.windows(
            &[FaultKind::RedisPaused, FaultKind::RedisKilled],
            STORE_SLACK,
        )
    }

    fn windows(&self, kinds: &[FaultKind], slack: Duration) -> Vec<(Duration, Duration)> {
        self.faults
            .iter()
            .filter(|f| kinds.contains(&f.kind))
            .map(|f| (f.from, f.until + slack))
            .collect()
    }

    fn fault_windows(&self) -> Vec<(Duration, Duration)> {
        let kinds = [
            FaultKind::OriginKilled,
            FaultKind::RedisPaused,
            FaultKind::RedisKilled,
        ];
        let mut all = self.windows(&kinds, ORIGIN_SLACK);
        all.extend(
            self.faults
                .iter()
                .filter(|f| !kinds.contains(&f.kind))
                .map(|f| (f.from, f.until + ORIGIN_SLACK)),
        );
        all
    }

    /// Whether `status` from `tag` at `from..until` is a 502/504 of the
    /// origin being down.
    fn origin_explains(&self, status: u16, tag: &str, from: Duration, until: Duration) -> bool {
        let upstream = matches!(
            (status, tag),
            (502, "upstream-error") | (504, "upstream-timeout")
        );
        upstream && overlaps(&self.origin_down(), from, until)
    }

    fn failures(&self) -> (Failures, Failures) {
        let mut wrk = Failures::default();
        for segment in &self.segments {
            for ((status, tag), count) in &segment.statuses {
                if *status >= 500 {
                    let side = if self.origin_explains(*status, tag, segment.from, segment.until) {
                        &mut wrk.explained
                    } else {
                        &mut wrk.unexplained
                    };
                    *side.entry((*status, tag.clone())).or_default() += count;
                }
            }
            let socket = segment
                .run
                .errors
                .saturating_sub(non_success(&segment.statuses));
            if socket > 0 {
                let side = if overlaps(&self.origin_down(), segment.from, segment.until) {
                    &mut wrk.explained
                } else {
                    &mut wrk.unexplained
                };
                *side.entry((0, "socket error".to_owned())).or_default() += socket;
            }
        }
        let mut crowd = Failures::default();
        for (at_us, status, tag) in &self.crowd.responses.failures {
            let at = self.crowd_offset + Duration::from_micros(*at_us);
            let explained = self.origin_explains(*status, tag, at, at)
                || (*status == 0 && overlaps(&self.origin_down(), at, at));
            let side = if explained {
                &mut crowd.explained
            } else {
                &mut crowd.unexplained
            };
            *side.entry((*status, tag.clone())).or_default() += 1;
        }
        (wrk, crowd)
    }

    /// Tunnels (completed, failed while the origin was down, failed otherwise).
    fn tunnel_counts(&self) -> (u64, u64, u64) {
        let down = self.origin_down();
        let (mut completed, mut explained, mut unexplained) = (0, 0, 0);
        for (at, outcome) in &self.tunnels {
            match outcome {
                Tunnel::Completed => completed += 1,
                _ if overlaps(&down, *at, *at) => explained += 1,
                Tunnel::Refused(_) | Tunnel::Broken => unexplained += 1,
            }
        }
        (completed, explained, unexplained)
    }

    /// (from, until, capacity in force) in soak time; after a decrease the
    /// old capacity counts for `DECREASE_GRACE`.
    fn capacity_periods(&self) -> Vec<(Duration, Duration, u64)> {
        let mut periods = Vec::new();
        let (mut from, mut capacity) = (Duration::ZERO, self.capacity);
        for fault in &self.faults {
            if fault.capacity == capacity {
                continue;
            }
            let change = if fault.capacity < capacity {
                fault.until + DECREASE_GRACE
            } else {
                // Raised: counted from when the edit was seen in force.
                fault.until
            };
            periods.push((from, change, capacity));
            from = change;
            capacity = fault.capacity;
        }
        periods.push((from, self.phases.end, capacity));
        periods.retain(|(from, until, _)| from < until);
        periods
    }

    /// The most admitted at once in `[from, until)` inside and outside the
    /// store's fault windows.
    fn most_admitted(&self, from: Duration, until: Duration) -> (u64, u64) {
        let store = self.store_down();
        let us = |d: Duration| d.saturating_sub(self.crowd_offset).as_micros() as u64;
        let (mut outside, mut inside) = (0, 0);
        let mut cuts = vec![from, until];
        for (a, b) in &store {
            cuts.extend([*a, *b]);
        }
        cuts.retain(|t| *t >= from && *t <= until);
        cuts.sort_unstable();
        cuts.dedup();
        for pair in cuts.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let most = sim::max_at_once_within(&self.crowd.records, us(a), us(b));
            if overlaps(&store, a + (b - a) / 2, a + (b - a) / 2) {
                inside = inside.max(most);
            } else {
                outside = outside.max(most);
            }
        }
        (outside, inside)
    }

    /// `count(from_us, until_us)` in crowd time, summed over the stretches
    /// outside and inside the store's fault windows.
    fn split_by_store(&self, count: impl Fn(u64, u64) -> u64) -> (u64, u64) {
        let us = |d: Duration| d.saturating_sub(self.crowd_offset).as_micros() as u64;
        let mut windows = self.store_down();
        windows.sort_unstable();
        let (mut outside, mut inside, mut at) = (0, 0, 0);
        for (from, until) in windows {
            let (from, until) = (us(from).max(at), us(until).max(at));
            outside += count(at, from);
            inside += count(from, until);
            at = until;
        }
        outside += count(at, u64::MAX);
        (outside, inside)
    }

    /// The store's fault windows in crowd time (µs).
    fn store_down_us(&self) -> Vec<(u64, u64)> {
        let us = |d: Duration| d.saturating_sub(self.crowd_offset).as_micros() as u64;
        self.store_down()
            .iter()
            .map(|&(from, until)| (us(from), us(until)))
            .collect()
    }

    /// Inversions seen while the store was up (B's admission and A's poll
    /// both outside store faults), as (B admitted, A's poll) in crowd time,
    /// and how many others there were.
    fn inversions(&self) -> (Vec<(u64, u64)>, u64) {
        let windows = self.store_down_us();
        let down = |t: u64| {
            windows
                .iter()
                .any(|&(from, until)| (from..until).contains(&t))
        };
        let pairs = sim::inversion_pairs(&self.crowd.records);
        if std::env::var_os("SOAK_DEBUG").is_some() {
            self.debug_inversions(&down);
        }
        let total = pairs.len() as u64;
        let up: Vec<(u64, u64)> = pairs
            .into_iter()
            .filter(|&(at, sent)| !down(at) && !down(sent))
            .collect();
        let faults = total - up.len() as u64;
        (up, faults)
    }

    fn debug_inversions(&self, down: &dyn Fn(u64) -> bool) {
        let t = |us: u64| (self.crowd_offset + Duration::from_micros(us)).as_secs_f64();
        let records = &self.crowd.records;
        for b in records {
            let Some((at, Some(sb))) = b.admitted else {
                continue;
            };
            for a in records {
                for &(sa, sent) in &a.seen_waiting {
                    if sent > at && sa < sb && !down(at) && !down(sent) {
                        eprintln!(
                            "INV B adm {:.1} arr {:.1} joins {} polls {} | A arr {:.1} joins {} polls {} last-wait {:.1} adm {:?} ended {:.1} rises {:?} seen {:?} | sb-sa {:.2}s",
                            t(at), t(b.arrived_us), b.joins, b.polls,
                            t(a.arrived_us), a.joins, a.polls, t(sent),
                            a.admitted.map(|(x, s)| (t(x), s)), t(a.ended_us), a.rises,
                            a.seen_waiting, (sb - sa) as f64 / 1e6
                        );
                    }
                }
            }
        }
        for r in records {
            for &(sent, places) in &r.rises {
                if !down(sent) {
                    eprintln!(
                        "RISE at {:.1} by {places} | arr {:.1} joins {} polls {} adm {:?} seen {:?} rises {:?}",
                        t(sent), t(r.arrived_us), r.joins, r.polls,
                        r.admitted.map(|(x, s)| (t(x), s)), r.seen_waiting, r.rises
                    );
                }
            }
        }
        for r in records.iter().filter(|r| r.joins > 1) {
            eprintln!(
                "BACK arr {:.1} joins {} polls {} adm {:?} seen {:?} rises {:?} errors {:?}",
                t(r.arrived_us),
                r.joins,
                r.polls,
                r.admitted.map(|(x, s)| (t(x), s)),
                r.seen_waiting,
                r.rises,
                r.errors
            );
        }
    }

    /// Position rises (polls, largest) while the store was up and during faults.
    fn rises(&self) -> ((u64, u64), (u64, u64)) {
        let windows = self.store_down_us();
        let (mut up, mut faults) = ((0, 0), (0, 0));
        for &(sent, places) in self.crowd.records.iter().flat_map(|r| r.rises.iter()) {
            let side = if windows
                .iter()
                .any(|&(from, until)| (from..until).contains(&sent))
            {
                &mut faults
            } else {
                &mut up
            };
            side.0 += 1;
            side.1 = side.1.max(places);
        }
        (up, faults)
    }

    /// queuegate's store errors between samples, outside and inside the
    /// store's fault windows.
    fn store_error_split(&self) -> (u64, u64) {
        let windows = self.store_down();
        let (mut up, mut faults) = (0, 0);
        for pair in self.store_errors.windows(2) {
            let ((from, before), (until, after)) = (pair[0], pair[1]);
            let new = after.saturating_sub(before);
            if overlaps(&windows, from, until) {
                faults += new;
            } else {
                up += new;
            }
        }
        (up, faults)
    }

    fn capacity_kept(&self) -> bool {
        self.capacity_periods()
            .iter()
            .all(|&(from, until, capacity)| self.most_admitted(from, until).0 <= capacity)
    }

    /// No unexplained 5xx, no unexplained tunnel failure, capacity kept and
    /// join order kept while the store was up.
    pub fn passed(&self) -> bool {
        let (wrk, crowd) = self.failures();
        Failures::total(&wrk.unexplained) == 0
            && Failures::total(&crowd.unexplained) == 0
            && self.tunnel_counts().2 == 0
            && self.capacity_kept()
            && self.inversions().0.is_empty()
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = self.write_markdown(&mut out);
        out
    }

    fn write_markdown(&self, out: &mut String) -> fmt::Result {
        let r = &self.crowd.report;
        let p = &self.phases;
        let commit = command_line("git", &["rev-parse", "--short", "HEAD"]);
        let wrk_version = command_line("wrk", &["-v"]);
        let wrk_version = wrk_version.split(" Copyright").next().unwrap_or_default();
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        writeln!(out, "### Soak, {}\n", today())?;
        writeln!(
            out,
            "{:.0} minutes on {cpus} shared CPUs; queuegate at {commit} ({}), {}, {wrk_version}. \
             Warm-up {:.0} s, reference (no fault) until {:.0} s, then a fault every {:.0} s. \
             Connection limits (`{}`): {}.\n",
            self.minutes,
            self.build,
            self.redis_version,
            p.warm_up.as_secs_f64(),
            p.reference.as_secs_f64(),
            p.interval.as_secs_f64(),
            crate::stack::CONNECTION_LIMITS,
            if self.connection_limits {
                "set"
            } else {
                "not known to this build, left out"
            },
        )?;

        writeln!(out, "| fault | at | took | what |\n|---|---:|---:|---|")?;
        for f in &self.faults {
            writeln!(
                out,
                "| {} | {:.0} s | {:.1} s | {} |",
                f.kind,
                f.from.as_secs_f64(),
                (f.until - f.from).as_secs_f64(),
                f.note
            )?;
        }

        let wrk_requests: u64 = self.segments.iter().map(|s| s.run.requests).sum();
        let tunnels = self.tunnel_counts();
        writeln!(out, "\n| served | count |\n|---|---:|")?;
        writeln!(
            out,
            "| wrk on `{}` ({} connections, {} ms pause per request) | {} |",
            crate::stack::LOAD_PATH,
            self.connections,
            self.delay_ms,
            wrk_requests
        )?;
        writeln!(
            out,
            "| crowd requests ({} visitors at {}/s, capacity {}) | {} |",
            self.visitors, self.rate, self.capacity, r.requests
        )?;
        let mut refused: BTreeMap<u16, u64> = BTreeMap::new();
        for (_, outcome) in &self.tunnels {
            if let Tunnel::Refused(status) = outcome {
                *refused.entry(*status).or_default() += 1;
            }
        }
        let refused: Vec<String> = refused
            .iter()
            .map(|(status, n)| format!("{status} ×{n}"))
            .collect();
        writeln!(
            out,
            "| WebSocket tunnels completed / failed while the origin was down / failed otherwise | {} / {} / {}{} |",
            tunnels.0,
            tunnels.1,
            tunnels.2,
            if refused.is_empty() {
                String::new()
            } else {
                format!(" (upgrades refused, by status: {})", refused.join(", "))
            }
        )?;
        let down = self.origin_down();
        let slow = |wanted: SlowEnd, origin_killed: bool| {
            self.slow
                .iter()
                .filter(|(from, until, end)| {
                    *end == wanted && overlaps(&down, *from, *until) == origin_killed
                })
                .count()
        };
        writeln!(
            out,
            "| slow readers dropped by queuegate / dropped when the origin was killed / still served after the hold / failed to start | {} / {} / {} / {} |",
            slow(SlowEnd::Dropped, false),
            slow(SlowEnd::Dropped, true),
            slow(SlowEnd::Served, false) + slow(SlowEnd::Served, true),
            slow(SlowEnd::Failed, false) + slow(SlowEnd::Failed, true),
        )?;
        let mut closed: Vec<Duration> = self
            .idle
            .iter()
            .filter_map(|e| match e {
                IdleEnd::Closed(after) => Some(*after),
                _ => None,
            })
            .collect();
        closed.sort_unstable();
        let open = self
            .idle
            .iter()
            .filter(|e| matches!(e, IdleEnd::Open))
            .count();
        let failed = self
            .idle
            .iter()
            .filter(|e| matches!(e, IdleEnd::Failed))
            .count();
        writeln!(
            out,
            "| idle HTTP/2 connections closed by queuegate (median after) / open when given up / failed | {}{} / {open} / {failed} |",
            closed.len(),
            closed
                .get(closed.len() / 2)
                .map_or(String::new(), |d| format!(" ({:.0} s)", d.as_secs_f64())),
        )?;

        let (wrk, crowd) = self.failures();
        writeln!(
            out,
            "\nResponses by status (`-`: from the origin; otherwise queuegate's `x-queuegate` tag; \
             status 0: no answer):\n"
        )?;
        writeln!(
            out,
            "| source | status | tag | count | 5xx cause |\n|---|---:|---|---:|---|"
        )?;
        let mut wrk_statuses: BTreeMap<(u16, String), u64> = BTreeMap::new();
        for s in &self.segments {
            for (key, n) in &s.statuses {
                *wrk_statuses.entry(key.clone()).or_default() += n;
            }
        }
        for (source, statuses, failures) in [
            ("wrk", &wrk_statuses, &wrk),
            ("crowd", &self.crowd.responses.by_status, &crowd),
        ] {
            let mut rows: BTreeMap<(u16, String), u64> = statuses.clone();
            for key in failures.explained.keys().chain(failures.unexplained.keys()) {
                rows.entry(key.clone()).or_insert(0);
            }
            for ((status, tag), count) in &rows {
                let key = (*status, tag.clone());
                let cause = match (failures.explained.get(&key), failures.unexplained.get(&key)) {
                    (None, None) => String::new(),
                    (Some(e), None) => format!("origin down ({e})"),
                    (None, Some(u)) => format!("**unexplained ({u})**"),
                    (Some(e), Some(u)) => format!("origin down ({e}), **unexplained ({u})**"),
                };
                let count = if *count == 0 {
                    failures.explained.get(&key).copied().unwrap_or(0)
                        + failures.unexplained.get(&key).copied().unwrap_or(0)
                } else {
                    *count
                };
                writeln!(out, "| {source} | {status} | {tag} | {count} | {cause} |")?;
            }
        }

        writeln!(out, "\nThe line (the crowd's checks):\n")?;
        writeln!(out, "| measure | value |\n|---|---:|")?;
        writeln!(
            out,
            "| admitted (at once on arrival) / left / no-shows / ghosts | {} ({}) / {} / {} / {} |",
            r.admitted, r.at_once, r.left, r.no_shows, r.ghosts
        )?;
        writeln!(
            out,
            "| still waiting at the end / stayed but never admitted | {} / {} |",
            r.unfinished, r.never_admitted
        )?;
        writeln!(
            out,
            "| **places lost**: sent to the back while polling | {} |",
            r.sent_back
        )?;
        let (rises_up, rises_faults) = self.rises();
        writeln!(
            out,
            "| **places lost**: position rose with the same ticket, store up (polls, most places) / with a store fault | {}, {} / {}, {} |",
            rises_up.0, rises_up.1, rises_faults.0, rises_faults.1
        )?;
        let (errors_up, errors_faults) = self.split_by_store(|from, until| {
            self.crowd
                .records
                .iter()
                .filter(|rec| !rec.errors.is_empty() && (from..until).contains(&rec.ended_us))
                .count() as u64
        });
        writeln!(
            out,
            "| **places lost**: visits ended by an error, store up / in store faults | {errors_up} / {errors_faults} |"
        )?;
        writeln!(out, "| requests retried after a fault | {} |", r.retries)?;
        let (store_up, store_faults) = self.store_error_split();
        writeln!(
            out,
            "| store errors (`queuegate_store_errors_total`), store up / in store faults | {store_up} / {store_faults} |"
        )?;
        let (inversions_up, inversions_faults) = self.inversions();
        writeln!(
            out,
            "| order inversions, seen while the store was up / with a store fault | {} / {inversions_faults} |",
            inversions_up.len()
        )?;
        writeln!(
            out,
            "| wait p50 / p90 / p99 | {:.1} s / {:.1} s / {:.1} s |",
            r.wait_p50.as_secs_f64(),
            r.wait_p90.as_secs_f64(),
            r.wait_p99.as_secs_f64()
        )?;
        for e in &r.error_samples {
            writeln!(out, "\nerror seen: `{e}`")?;
        }
        if !inversions_up.is_empty() {
            // By the second (soak time) the later joiner was seen admitted.
            let mut by_second: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
            for (at, sent) in &inversions_up {
                let second = (self.crowd_offset + Duration::from_micros(*at)).as_secs();
                let entry = by_second.entry(second).or_default();
                entry.0 += 1;
                entry.1 = entry.1.max(sent.saturating_sub(*at));
            }
            let list: Vec<String> = by_second
                .iter()
                .map(|(second, (n, gap))| {
                    format!(
                        "{second} s: {n} (poll up to {:.1} s later)",
                        *gap as f64 / 1e6
                    )
                })
                .collect();
            writeln!(
                out,
                "\nInversions while the store was up, by when the later joiner was admitted: {}",
                list.join("; ")
            )?;
        }

        writeln!(
            out,
            "\nMost admitted at once (harness view, can only undercount), outside and inside \
             Redis faults (+{} s; there `on_store_error: local` admits against a local count):\n",
            STORE_SLACK.as_secs()
        )?;
        writeln!(
            out,
            "| from | until | capacity | most at once, store up | most at once, store faults |\n|---:|---:|---:|---:|---:|"
        )?;
        for (from, until, capacity) in self.capacity_periods() {
            let (outside, inside) = self.most_admitted(from, until);
            let mark = if outside > capacity { " **over**" } else { "" };
            writeln!(
                out,
                "| {:.0} s | {:.0} s | {capacity} | {outside}{mark} | {inside} |",
                from.as_secs_f64(),
                until.as_secs_f64()
            )?;
        }

        writeln!(
            out,
            "\nqueuegate's process (`/proc/<pid>/status` VmRSS, `/proc/<pid>/fd`):\n"
        )?;
        writeln!(out, "| when | RSS | open fds |\n|---|---:|---:|")?;
        for m in &self.memory {
            writeln!(
                out,
                "| {} | {:.1} MB | {} |",
                m.label,
                m.rss_kb as f64 / 1024.0,
                m.fds
            )?;
        }

        writeln!(
            out,
            "\nLatency of `{}` per wrk run ({:.0} s each), from wrk:\n",
            crate::stack::LOAD_PATH,
            p.segment.as_secs_f64()
        )?;
        writeln!(
            out,
            "| runs | count | req/s (mean) | p99 median | p99 max |\n|---|---:|---:|---:|---:|"
        )?;
        let faults = self.fault_windows();
        let groups: [(&str, Vec<&Segment>); 4] = [
            (
                "reference, no fault",
                self.segments
                    .iter()
                    .filter(|s| s.until <= p.reference)
                    .collect(),
            ),
            (
                "fault phase, all",
                self.segments
                    .iter()
                    .filter(|s| s.from >= p.reference)
                    .collect(),
            ),
            (
                "fault phase, with a fault in the run",
                self.segments
                    .iter()
                    .filter(|s| s.from >= p.reference && overlaps(&faults, s.from, s.until))
                    .collect(),
            ),
            (
                "fault phase, between faults",
                self.segments
                    .iter()
                    .filter(|s| s.from >= p.reference && !overlaps(&faults, s.from, s.until))
                    .collect(),
            ),
        ];
        for (name, runs) in groups {
            if runs.is_empty() {
                writeln!(out, "| {name} | 0 | | | |")?;
                continue;
            }
            let mut p99: Vec<f64> = runs.iter().map(|s| s.run.p99_us / 1000.0).collect();
            p99.sort_by(f64::total_cmp);
            let rate =
                runs.iter().map(|s| s.run.requests_per_second).sum::<f64>() / runs.len() as f64;
            writeln!(
                out,
                "| {name} | {} | {rate:.0} | {:.2} ms | {:.2} ms |",
                runs.len(),
                p99[p99.len() / 2],
                p99[p99.len() - 1]
            )?;
        }

        let verdict = if self.passed() {
            "PASS: no unexplained 5xx or tunnel failure; capacity and join order kept while \
             the store was up"
        } else {
            "FAIL: see the rows marked above"
        };
        writeln!(out, "\nVerdict: {verdict}.")
    }
}

/// Non-2xx/3xx answers in a wrk run, as wrk counts them among its errors.
fn non_success(statuses: &BTreeMap<(u16, String), u64>) -> u64 {
    statuses
        .iter()
        .filter(|((status, _), _)| !(200..400).contains(status))
        .map(|(_, n)| n)
        .sum()
}

fn overlaps(windows: &[(Duration, Duration)], from: Duration, until: Duration) -> bool {
    windows.iter().any(|&(a, b)| from <= b && until >= a)
}

/// Replaces the soak section of `readme` (between the markers, or appended
/// if they are missing) with `markdown`.
pub fn write_readme(readme: &Path, markdown: &str) -> Result<()> {
    let section = format!("{BEGIN}\n{}\n{END}", markdown.trim_end());
    let current = fs::read_to_string(readme).unwrap_or_default();
    let updated = match (current.find(BEGIN), current.find(END)) {
        (Some(begin), Some(end)) if begin < end => format!(
            "{}{section}{}",
            &current[..begin],
            &current[end + END.len()..]
        ),
        _ => format!(
            "{}\n\n## Soak under faults\n\n{section}\n",
            current.trim_end()
        ),
    };
    fs::write(readme, updated).with_context(|| format!("writing {}", readme.display()))
}
