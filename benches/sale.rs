//! A sale against an origin of C workers (DESIGN §9.1): the same crowd,
//! one config after the other, through a sweep of fixed capacities and
//! through the adaptive range, each against a fresh queuegate (the release
//! binary, memory store) and a fresh origin. For each it prints the
//! origin's p95 per window, the share of windows after the warm-up whose
//! p95 is within the target, the goodput (admitted requests answered 200
//! within the target, per second), the time to the first admission, the
//! visitors' mean wait, and the capacity per window as `/routes` on the
//! admin listener showed it; then the targets as pass/miss lines, and
//! exits non-zero on a miss.
//!
//! The origin (`tests/common/sale.rs`) answers in `base × max(1,
//! in_flight / C)`: C requests at once at full speed, the excess sharing
//! the workers. With C = 8 and 20 ms it serves at most 400 requests/s, and
//! holds up to 40 at once within a 100 ms p95.
//!
//! Run (every flag also reads `QG_<FLAG>`, dashes as underscores):
//!
//! ```text
//! cargo bench --bench sale
//! cargo bench --bench sale -- --duration-s 20 --warmup-s 10 --fixed 20,80   # quick look
//! ```
//!
//! Flags: `--workers` C (8), `--base-ms` (20), `--target-p95-ms` (100),
//! `--target-errors-pct` (5), `--visitors` (300), `--requests` per visit
//! (20), `--think-min-ms` (0) / `--think-max-ms` (50), `--ramp-ms` over
//! which the crowd arrives (2000), `--duration-s` per config (60),
//! `--window-s` (1, the route's `adapt_every` and the report's window),
//! `--warmup-s` left out of the p95 share (30), `--fixed` capacities
//! (`10,20,40,80,160`; empty for none), `--adaptive` (true), `--min` (5),
//! `--max` (400), `--start` (200), `--seed` (1).

#[path = "crowd/fleet.rs"]
mod fleet;
#[path = "../tests/common/sale.rs"]
mod sale;
#[path = "crowd/sim.rs"]
mod sim;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use fleet::{AdaptSpec, GateSpec, Queuegate};
use sale::{CrowdLog, CrowdPlan, ModelOrigin, Variation};
use sim::Flags;

/// How often `/routes` is read: several times a window, so a capacity
/// outside the range for part of a window is seen.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The share a target asks for: of windows within the p95 target, and of
/// the best fixed capacity's goodput.
const TARGET_SHARE: f64 = 0.9;

/// One run's settings, from the flags.
#[derive(Clone, Debug)]
struct Settings {
    workers: u64,
    base: Duration,
    target_p95: Duration,
    target_errors_pct: f64,
    visitors: usize,
    requests: usize,
    think_min: Duration,
    think_max: Duration,
    ramp: Duration,
    duration: Duration,
    window: Duration,
    warmup: Duration,
    fixed: Vec<u64>,
    adaptive: bool,
    min: u64,
    max: u64,
    start: u64,
    seed: u64,
}

impl Settings {
    fn from(flags: &Flags) -> Settings {
        let ms = |name: &str, default: u64| Duration::from_millis(flags.parse(name, default));
        let fixed = flags
            .get("fixed")
            .unwrap_or_else(|| "10,20,40,80,160".to_owned());
        let fixed = fixed
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(|c| {
                c.parse()
                    .unwrap_or_else(|_| panic!("--fixed {c}: not a capacity"))
            })
            .collect();
        Settings {
            workers: flags.parse("workers", 8),
            base: ms("base-ms", 20),
            target_p95: ms("target-p95-ms", 100),
            target_errors_pct: flags.parse("target-errors-pct", 5.0),
            visitors: flags.parse("visitors", 300),
            requests: flags.parse("requests", 20),
            think_min: ms("think-min-ms", 0),
            think_max: ms("think-max-ms", 50),
            ramp: ms("ramp-ms", 2_000),
            duration: Duration::from_secs(flags.parse("duration-s", 60)),
            window: Duration::from_secs(flags.parse("window-s", 1)),
            warmup: Duration::from_secs(flags.parse("warmup-s", 30)),
            fixed,
            adaptive: flags.parse("adaptive", true),
            min: flags.parse("min", 5),
            max: flags.parse("max", 400),
            start: flags.parse("start", 200),
            seed: flags.parse("seed", 1),
        }
    }

    fn windows(&self) -> usize {
        (self.duration.as_secs_f64() / self.window.as_secs_f64()).floor() as usize
    }

    /// The first window after the warm-up.
    fn first_counted(&self) -> usize {
        (self.warmup.as_secs_f64() / self.window.as_secs_f64()).ceil() as usize
    }
}

/// A capacity to run the sale with.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Config {
    Fixed(u64),
    Adaptive { min: u64, max: u64, start: u64 },
}

impl Config {
    fn label(&self) -> String {
        match self {
            Config::Fixed(c) => format!("fixed {c}"),
            Config::Adaptive { min, max, start } => format!("adaptive {min}–{max} from {start}"),
        }
    }
}

/// One reading of the route on `/routes`.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    capacity: u64,
    active: u64,
    /// The p95 of the last window the rule was given (adaptive only).
    rule_p95_ms: Option<u64>,
}

/// What one config's sale showed.
struct Outcome {
    config: Config,
    /// The origin's p95 per window (`None`: no answer in it).
    origin_p95: Vec<Option<Duration>>,
    /// The capacity `/routes` showed at the end of each window, the
    /// active sessions, and the p95 of the last window the rule was given.
    capacity: Vec<Option<u64>>,
    active: Vec<Option<u64>>,
    rule_p95: Vec<Option<u64>>,
    /// Every capacity `/routes` showed.
    samples: Vec<u64>,
    /// Admitted requests, those answered 200, those within the target.
    requests: usize,
    ok: usize,
    good: usize,
    /// Good ones after the warm-up.
    good_after_warmup: usize,
    first_admission: Option<Duration>,
    admissions: usize,
    mean_wait: Option<Duration>,
    in_line_at_end: Vec<Duration>,
    other: u64,
    origin_answers: usize,
    max_in_flight: u64,
    /// `queuegate_capacity_changes_total` up and down.
    changes: (u64, u64),
}

impl Outcome {
    fn goodput(&self, s: &Settings) -> f64 {
        self.good as f64 / s.duration.as_secs_f64()
    }

    fn goodput_after_warmup(&self, s: &Settings) -> f64 {
        let len = s.duration.saturating_sub(s.warmup).as_secs_f64();
        if len <= 0.0 {
            return 0.0;
        }
        self.good_after_warmup as f64 / len
    }

    /// Windows after the warm-up with answers, and those within the target.
    fn within(&self, s: &Settings) -> (usize, usize) {
        let counted: Vec<Duration> = self
            .origin_p95
            .iter()
            .skip(s.first_counted())
            .flatten()
            .copied()
            .collect();
        let within = counted.iter().filter(|p| **p <= s.target_p95).count();
        (counted.len(), within)
    }
}

fn main() {
    let flags = Flags::from_env();
    let settings = Settings::from(&flags);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut configs: Vec<Config> = settings.fixed.iter().map(|&c| Config::Fixed(c)).collect();
    if settings.adaptive {
        configs.push(Config::Adaptive {
            min: settings.min,
            max: settings.max,
            start: settings.start,
        });
    }
    println!(
        "sale: origin of {} workers at {:?} (at most {:.0} answers/s; {} at once within {:?}), \
         target p95 {:?} and errors {}%; {} visitors arriving over {:?}, {} requests a visit, \
         think {:?}–{:?}; {:?} per config, windows of {:?}, warm-up {:?}; load average {}",
        settings.workers,
        settings.base,
        settings.workers as f64 / settings.base.as_secs_f64(),
        (settings.workers as f64 * settings.target_p95.as_secs_f64() / settings.base.as_secs_f64())
            as u64,
        settings.target_p95,
        settings.target_p95,
        settings.target_errors_pct,
        settings.visitors,
        settings.ramp,
        settings.requests,
        settings.think_min,
        settings.think_max,
        settings.duration,
        settings.window,
        settings.warmup,
        load_average(),
    );
    let mut outcomes = Vec::new();
    for config in configs {
        let outcome = runtime.block_on(run(&settings, config));
        print!("{}", detail(&settings, &outcome));
        outcomes.push(outcome);
    }
    print!("{}", summary(&settings, &outcomes));
    let (text, passed) = targets(&settings, &outcomes);
    print!("{text}");
    println!("load average after: {}", load_average());
    if !passed {
        std::process::exit(1);
    }
}

/// One config's sale: a fresh origin and queuegate, the crowd until the
/// end, `/routes` sampled meanwhile.
async fn run(s: &Settings, config: Config) -> Outcome {
    let origin = ModelOrigin::start(s.workers, s.base).await;
    let mut spec = GateSpec::quick("shop", "/shop", 0);
    spec.tick = Duration::from_millis(50);
    spec.max_admit_per_tick = 100;
    spec.pass_ttl = Duration::from_secs(30);
    spec.session_ttl = Duration::from_secs(30);
    spec.arrival_grace = Duration::from_secs(10);
    spec.abandon_after = Duration::from_secs(10);
    spec.exit_paths = vec!["/shop/done".to_owned()];
    match config {
        Config::Fixed(c) => spec.capacity = c,
        Config::Adaptive { min, max, start } => {
            spec.capacity = start;
            spec.adapt = Some(AdaptSpec {
                min,
                max,
                target_p95: s.target_p95,
                target_errors_pct: s.target_errors_pct,
                every: s.window,
            });
        }
    }
    let gate = Queuegate::start(&spec, &origin.url(), &fleet::run_key());
    let admin = gate.admin_url();
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();

    let plan = CrowdPlan {
        gate: gate.url(),
        route: "shop".to_owned(),
        prefix: "/shop".to_owned(),
        visitors: s.visitors,
        requests: s.requests,
        think: s.think_min,
        ramp: s.ramp,
    };
    let variation = Variation {
        think_max: s.think_max,
        seed: s.seed,
    };
    let until = Instant::now() + s.duration;
    let (log, tasks) = sale::crowd_varied(plan, variation, until);
    let t0 = log.started();
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let sampler = tokio::spawn(sample_capacity(
        client.clone(),
        admin.clone(),
        samples.clone(),
        until,
    ));
    // Each visitor ends within a request and a poll of the end; one that
    // has not by a few seconds later is stopped.
    let deadline = tokio::time::Instant::from_std(until + Duration::from_secs(5));
    for task in tasks {
        let abort = task.abort_handle();
        if tokio::time::timeout_at(deadline, task).await.is_err() {
            abort.abort();
        }
    }
    let _ = sampler.await;
    let metrics = gate.metrics();
    let changes = (
        sample_value(&metrics, "up").unwrap_or(0),
        sample_value(&metrics, "down").unwrap_or(0),
    );
    drop(gate);
    let samples = samples.lock().unwrap().clone();
    outcome(s, config, t0, &log, &origin, &samples, changes)
}

/// Reads the route's capacity from `/routes` every [`SAMPLE_EVERY`].
async fn sample_capacity(
    client: Client<HttpConnector, Empty<Bytes>>,
    admin: String,
    into: Arc<Mutex<Vec<Sample>>>,
    until: Instant,
) {
    let url = format!("{admin}/routes");
    while Instant::now() < until {
        if let Some(body) = get_text(&client, &url).await {
            let routes: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let route = &routes["routes"][0];
            if let Some(capacity) = route["capacity"].as_u64() {
                into.lock().unwrap().push(Sample {
                    at: Instant::now(),
                    capacity,
                    active: route["active"].as_u64().unwrap_or(0),
                    rule_p95_ms: route["adapt"]["last_window"]["p95_ms"].as_u64(),
                });
            }
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

async fn get_text(client: &Client<HttpConnector, Empty<Bytes>>, url: &str) -> Option<String> {
    let req = http::Request::get(url).body(Empty::new()).ok()?;
    let resp = client.request(req).await.ok()?;
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// `queuegate_capacity_changes_total` of the route in `direction`.
fn sample_value(metrics: &str, direction: &str) -> Option<u64> {
    let name =
        format!("queuegate_capacity_changes_total{{route=\"shop\",direction=\"{direction}\"}}");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&name))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// The window an instant falls in, counted from `t0`.
fn window_of(s: &Settings, t0: Instant, at: Instant) -> usize {
    (at.saturating_duration_since(t0).as_secs_f64() / s.window.as_secs_f64()) as usize
}

fn outcome(
    s: &Settings,
    config: Config,
    t0: Instant,
    log: &CrowdLog,
    origin: &ModelOrigin,
    samples: &[Sample],
    changes: (u64, u64),
) -> Outcome {
    let windows = s.windows();
    let mut per_window: Vec<Vec<Duration>> = vec![Vec::new(); windows];
    let answers = origin.model.answers();
    for (at, took) in &answers {
        if let Some(w) = per_window.get_mut(window_of(s, t0, *at)) {
            w.push(*took);
        }
    }
    let origin_p95 = per_window
        .iter_mut()
        .map(|w| (!w.is_empty()).then(|| sale::p95(w)))
        .collect();
    let (mut capacity, mut active, mut rule_p95) = (
        vec![None; windows],
        vec![None; windows],
        vec![None; windows],
    );
    for sample in samples {
        let w = window_of(s, t0, sample.at);
        if w < windows {
            capacity[w] = Some(sample.capacity);
            active[w] = Some(sample.active);
            rule_p95[w] = sample.rule_p95_ms;
        }
    }
    let requests = log.requests();
    let warm = t0 + s.warmup;
    let is_good = |took: &Duration, ok: &bool| *ok && *took <= s.target_p95;
    let admissions = log.admissions();
    let waits: Vec<Duration> = admissions.iter().map(|(_, w)| *w).collect();
    Outcome {
        config,
        origin_p95,
        capacity,
        active,
        rule_p95,
        samples: samples.iter().map(|sample| sample.capacity).collect(),
        requests: requests.len(),
        ok: requests.iter().filter(|(_, _, ok)| *ok).count(),
        good: requests.iter().filter(|(_, t, ok)| is_good(t, ok)).count(),
        good_after_warmup: requests
            .iter()
            .filter(|(at, t, ok)| *at >= warm && is_good(t, ok))
            .count(),
        first_admission: admissions.iter().map(|(at, _)| *at - t0).min(),
        admissions: admissions.len(),
        mean_wait: mean(&waits),
        in_line_at_end: log.in_line_at_end(),
        other: log.other(),
        origin_answers: answers.len(),
        max_in_flight: origin.model.max_in_flight(),
        changes,
    }
}

fn mean(times: &[Duration]) -> Option<Duration> {
    if times.is_empty() {
        return None;
    }
    Some(times.iter().sum::<Duration>() / times.len() as u32)
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("–".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// A series, one number a window, twenty to a line after the time it starts.
fn series(s: &Settings, values: &[Option<u64>]) -> String {
    let mut out = String::new();
    for (i, chunk) in values.chunks(20).enumerate() {
        let from = s.window * (i * 20) as u32;
        let cells: Vec<String> = chunk
            .iter()
            .map(|v| v.map_or("–".to_owned(), |v| v.to_string()))
            .collect();
        let _ = writeln!(out, "    {:>4}s: {}", from.as_secs(), cells.join(" "));
    }
    out
}

fn detail(s: &Settings, o: &Outcome) -> String {
    let mut out = String::new();
    let (counted, within) = o.within(s);
    let in_line = &o.in_line_at_end;
    let _ = writeln!(out, "\n{}:", o.config.label());
    let _ = writeln!(
        out,
        "  goodput {:.0}/s ({:.0}/s after the warm-up); {} admitted requests, {} answered 200, \
         {} within {:?}; {} other answers",
        o.goodput(s),
        o.goodput_after_warmup(s),
        o.requests,
        o.ok,
        o.good,
        s.target_p95,
        o.other,
    );
    let _ = writeln!(
        out,
        "  first admission after {}; {} admissions, mean wait {}; {} still in line at the end \
         (mean wait so far {}); origin: {} answers, at most {} at once",
        o.first_admission
            .map_or("–".to_owned(), |d| format!("{} ms", d.as_millis())),
        o.admissions,
        secs(o.mean_wait),
        in_line.len(),
        secs(mean(in_line)),
        o.origin_answers,
        o.max_in_flight,
    );
    let _ = writeln!(
        out,
        "  origin p95 within {:?} in {within} of {counted} windows after {:?} ({:.0} %); \
         p95 ms per {:?} window:",
        s.target_p95,
        s.warmup,
        share(within, counted) * 100.0,
        s.window,
    );
    let p95: Vec<Option<u64>> = o
        .origin_p95
        .iter()
        .map(|p| p.map(|p| p.as_millis() as u64))
        .collect();
    out.push_str(&series(s, &p95));
    if let Config::Adaptive { .. } = o.config {
        let low = o.samples.iter().min();
        let high = o.samples.iter().max();
        let _ = writeln!(
            out,
            "  capacity from /routes: min {}, max {} over {} samples; {} changes up, {} down; \
             per window (at its end):",
            low.map_or("–".to_owned(), u64::to_string),
            high.map_or("–".to_owned(), u64::to_string),
            o.samples.len(),
            o.changes.0,
            o.changes.1,
        );
        out.push_str(&series(s, &o.capacity));
        let _ = writeln!(
            out,
            "  p95 ms of the last window the rule was given, per window:"
        );
        out.push_str(&series(s, &o.rule_p95));
    }
    let _ = writeln!(out, "  active sessions per window (at its end):");
    out.push_str(&series(s, &o.active));
    out
}

fn share(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        return 0.0;
    }
    part as f64 / whole as f64
}

fn summary(s: &Settings, outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| config | goodput /s | after warm-up /s | windows ≤ {} ms after {} s | \
         median window p95 ms | first admission ms | mean wait s | admissions | in line at end |",
        s.target_p95.as_millis(),
        s.warmup.as_secs(),
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for o in outcomes {
        let (counted, within) = o.within(s);
        let mut p95: Vec<Duration> = o.origin_p95.iter().flatten().copied().collect();
        p95.sort();
        let median = p95.get(p95.len() / 2).map_or(0, |p| p.as_millis());
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {within}/{counted} ({:.0} %) | {median} | {} | {} | {} | {} |",
            o.config.label(),
            o.goodput(s),
            o.goodput_after_warmup(s),
            share(within, counted) * 100.0,
            o.first_admission
                .map_or("–".to_owned(), |d| d.as_millis().to_string()),
            o.mean_wait
                .map_or("–".to_owned(), |d| format!("{:.1}", d.as_secs_f64())),
            o.admissions,
            o.in_line_at_end.len(),
        );
    }
    out
}

/// The pass/miss lines, and whether all passed.
fn targets(s: &Settings, outcomes: &[Outcome]) -> (String, bool) {
    let mut out = String::from("\n");
    let mut passed = true;
    let mut line = |ok: bool, text: String| {
        passed &= ok;
        let _ = writeln!(out, "{}: {text}", if ok { "pass" } else { "miss" });
    };
    let Some(adaptive) = outcomes
        .iter()
        .find(|o| matches!(o.config, Config::Adaptive { .. }))
    else {
        return (out, true);
    };
    let best = outcomes
        .iter()
        .filter(|o| matches!(o.config, Config::Fixed(_)))
        .max_by(|a, b| a.goodput(s).total_cmp(&b.goodput(s)));
    if let Some(best) = best {
        let ratio = adaptive.goodput(s) / best.goodput(s).max(f64::MIN_POSITIVE);
        line(
            ratio >= TARGET_SHARE,
            format!(
                "adaptive goodput {:.0}/s is {:.0} % of the best fixed capacity's ({}: {:.0}/s); \
                 target ≥ {:.0} %",
                adaptive.goodput(s),
                ratio * 100.0,
                best.config.label(),
                best.goodput(s),
                TARGET_SHARE * 100.0
            ),
        );
    }
    let (counted, within) = adaptive.within(s);
    let windows_share = share(within, counted);
    let late: Vec<String> = adaptive
        .origin_p95
        .iter()
        .enumerate()
        .skip(s.first_counted())
        .filter(|(_, p)| p.is_some_and(|p| p > s.target_p95))
        .map(|(i, p)| {
            format!(
                "{}s: {} ms at capacity {}",
                (s.window * i as u32).as_secs(),
                p.map_or(0, |p| p.as_millis()),
                adaptive.capacity[i].map_or("–".to_owned(), |c| c.to_string())
            )
        })
        .collect();
    line(
        windows_share >= TARGET_SHARE,
        format!(
            "adaptive origin p95 within {:?} in {within} of {counted} windows after {:?} \
             ({:.0} %); target ≥ {:.0} %{}",
            s.target_p95,
            s.warmup,
            windows_share * 100.0,
            TARGET_SHARE * 100.0,
            if late.is_empty() {
                String::new()
            } else {
                format!("; over it: {}", late.join(", "))
            }
        ),
    );
    let outside = adaptive
        .samples
        .iter()
        .filter(|c| !(s.min..=s.max).contains(*c))
        .count();
    line(
        outside == 0 && !adaptive.samples.is_empty(),
        format!(
            "adaptive capacity within [{}, {}] in every sample ({} of {} outside; seen {}–{})",
            s.min,
            s.max,
            outside,
            adaptive.samples.len(),
            adaptive.samples.iter().min().copied().unwrap_or(0),
            adaptive.samples.iter().max().copied().unwrap_or(0),
        ),
    );
    (out, passed)
}

/// `/proc/loadavg`'s first three fields: how busy the shared machine was.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
