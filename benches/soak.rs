//! Soak under faults: one queuegate on Redis with a crowd of visitors, a wrk
//! load, WebSocket tunnels, slow readers and idle HTTP/2 connections, while
//! the origin and Redis are killed, Redis is paused, the capacity is edited
//! and keys are rotated, about once a minute in rotation. It prints what was
//! served, every status with its cause, places lost, the most admitted at
//! once against the capacity, queuegate's memory and descriptors, and the
//! latency of the forwarded path with and without faults.
//!
//! `cargo bench --bench soak` builds the release binary and runs everything
//! on 127.0.0.1. Options (environment):
//!
//! - `SOAK_MINUTES` (10): the whole run; `1` for a quick look.
//! - `SOAK_CONNECTIONS` (32): wrk connections; `SOAK_WRK_DELAY_MS` (10):
//!   each connection's pause between requests.
//! - `SOAK_RATE` (4): visitors arriving per second; `SOAK_CAPACITY` (16):
//!   the gated route's capacity before it is raised by half and put back.
//! - `BENCH_WRITE` (unset): `1` writes the results into `benches/README.md`.
//! - `SOAK_DEBUG` (unset): `1` prints each order inversion and each visitor
//!   sent to the back, with its history, to stderr.
//! - `BENCH_WRK` (wrk), `BENCH_QUEUEGATE` (the built binary).

#[path = "crowd/fleet.rs"]
mod fleet;
#[path = "proxy/http.rs"]
mod http;
#[path = "soak/load.rs"]
mod load;
#[path = "soak/origin.rs"]
mod origin;
#[path = "proxy/process.rs"]
#[allow(dead_code)]
mod process;
#[path = "proxy/report.rs"]
#[allow(dead_code)]
mod proxy_report;
#[path = "soak/report.rs"]
mod report;
#[path = "crowd/sim.rs"]
mod sim;
#[path = "soak/stack.rs"]
mod stack;
#[path = "proxy/wrk.rs"]
#[allow(dead_code)]
mod wrk;

use std::env;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use tokio::sync::watch;

use report::{Fault, FaultKind, Memory, Soak};
use stack::{Gate, Redis, GATED_PATH, LOAD_PATH, ROUTE};

/// The faults, in the order they come round.
const ROTATION: [FaultKind; 6] = [
    FaultKind::OriginKilled,
    FaultKind::RedisPaused,
    FaultKind::CapacityUp,
    FaultKind::RedisKilled,
    FaultKind::KeyRotated,
    FaultKind::CapacityDown,
];
/// How long the origin and a killed Redis stay down; how long Redis is paused.
const ORIGIN_DOWN: Duration = Duration::from_secs(3);
const REDIS_DOWN: Duration = Duration::from_secs(3);
const REDIS_PAUSE: Duration = Duration::from_secs(5);
/// Concurrent tunnels, slow readers and idle HTTP/2 connections.
const TUNNELS: usize = 4;
const SLOW_READERS: usize = 4;
const IDLE_H2: usize = 16;

pub struct Options {
    pub total: Duration,
    pub connections: u32,
    pub delay_ms: u64,
    pub rate: f64,
    pub capacity: u64,
    write: bool,
    wrk: PathBuf,
    queuegate: PathBuf,
}

impl Options {
    fn from_env() -> Result<Self> {
        let minutes: f64 = parse("SOAK_MINUTES", 10.0)?;
        let options = Self {
            total: Duration::from_secs_f64(minutes * 60.0),
            connections: parse("SOAK_CONNECTIONS", 32)?,
            delay_ms: parse("SOAK_WRK_DELAY_MS", 10)?,
            rate: parse("SOAK_RATE", 4.0)?,
            capacity: parse("SOAK_CAPACITY", 16)?,
            write: env::var("BENCH_WRITE").is_ok_and(|v| v == "1"),
            wrk: env::var_os("BENCH_WRK").map_or_else(|| "wrk".into(), PathBuf::from),
            queuegate: env::var_os("BENCH_QUEUEGATE")
                .map_or_else(|| env!("CARGO_BIN_EXE_queuegate").into(), PathBuf::from),
        };
        ensure!(minutes >= 1.0, "SOAK_MINUTES must be at least 1");
        ensure!(
            options.connections >= 2 && options.rate > 0.0 && options.capacity >= 2,
            "SOAK_CONNECTIONS must be at least 2 (wrk's threads), SOAK_RATE positive, \
             SOAK_CAPACITY at least 2"
        );
        Ok(options)
    }
}

fn parse<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match env::var(name) {
        Err(_) => Ok(default),
        Ok(text) => text
            .trim()
            .parse()
            .ok()
            .with_context(|| format!("{name}={text:?} is not a valid value")),
    }
}

/// When each phase ends, since the start of the soak.
#[derive(Clone, Copy, Debug)]
pub struct Phases {
    /// Load runs, nothing is measured.
    pub warm_up: Duration,
    /// The reference: the same load, no fault.
    pub reference: Duration,
    /// Faults every `interval`, the first half an interval in.
    pub end: Duration,
    pub interval: Duration,
    /// The length of one wrk run.
    pub segment: Duration,
}

impl Phases {
    fn new(total: Duration) -> Self {
        let clamp = |d: Duration, lo: u64, hi: u64| {
            d.clamp(Duration::from_secs(lo), Duration::from_secs(hi))
        };
        let warm_up = clamp(total.mul_f64(0.05), 5, 20);
        let reference = warm_up + clamp(total.mul_f64(0.15), 15, 90);
        let faults = total.saturating_sub(reference);
        Self {
            warm_up,
            reference,
            end: total,
            interval: (faults / ROTATION.len() as u32).min(Duration::from_secs(60)),
            segment: if total >= Duration::from_secs(300) {
                Duration::from_secs(10)
            } else {
                Duration::from_secs(5)
            },
        }
    }

    fn fault_times(&self) -> Vec<Duration> {
        let mut times = Vec::new();
        let mut at = self.reference + self.interval / 2;
        while at + self.interval / 2 <= self.end {
            times.push(at);
            at += self.interval;
        }
        times
    }
}

fn main() -> Result<()> {
    // The origin is this binary run again as a child process.
    if let Ok(addr) = env::var(origin::ENV) {
        return origin::serve(&addr);
    }
    let options = Options::from_env()?;
    let phases = Phases::new(options.total);
    let root = tempfile::Builder::new()
        .prefix("queuegate-soak-")
        .tempdir()
        .context("creating a temp dir")?;
    let soak = run(&options, phases, root.path())?;
    let markdown = soak.markdown();
    println!("{markdown}");
    if options.write {
        let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/README.md");
        report::write_readme(&readme, &markdown)?;
        eprintln!("wrote {}", readme.display());
    }
    if !soak.passed() {
        eprintln!("soak: FAIL (see the verdict above)");
        std::process::exit(1);
    }
    Ok(())
}

fn run(options: &Options, phases: Phases, root: &Path) -> Result<Soak> {
    let mut redis = Redis::start(root)?;
    let origin_addr = SocketAddr::from(([127, 0, 0, 1], process::free_port()?));
    let mut origin = origin::Origin::start(origin_addr, root)?;
    let mut gate = Gate::start(
        &options.queuegate,
        root,
        origin_addr,
        &redis.url(),
        options.capacity,
    )?;
    let script = load::write_script(root, options.delay_ms)?;
    eprintln!(
        "soak: {:?} in all (warm-up until {:?}, reference until {:?}, a fault every {:?}); \
         queuegate {} (pid {}), origin {origin_addr}, redis port {}, temp dir {}",
        phases.end,
        phases.warm_up,
        phases.reference,
        phases.interval,
        gate.addr,
        gate.process.pid(),
        redis.port,
        root.display()
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("the soak's runtime")?;
    let start = Instant::now();
    let (stop_tx, stop_rx) = watch::channel(false);
    let tunnels = Arc::new(Mutex::new(Vec::new()));
    let slow = Arc::new(Mutex::new(Vec::new()));
    let idle = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // Held longer than the send timeout and the idle timeout set when known.
    let hold = |secs: u64| Duration::from_secs(secs).min(phases.end / 4);
    for _ in 0..TUNNELS {
        tasks.push(runtime.spawn(load::tunnels(
            gate.addr,
            start,
            tunnels.clone(),
            stop_rx.clone(),
        )));
    }
    for _ in 0..SLOW_READERS {
        tasks.push(runtime.spawn(load::slow_readers(
            gate.addr,
            hold(30),
            start,
            slow.clone(),
            stop_rx.clone(),
        )));
    }
    for _ in 0..IDLE_H2 {
        tasks.push(runtime.spawn(load::idle_h2(
            gate.addr,
            hold(90),
            idle.clone(),
            stop_rx.clone(),
        )));
    }
    let plan = sim::Plan {
        targets: vec![format!("http://{}", gate.addr)],
        route: ROUTE.to_owned(),
        path: GATED_PATH.to_owned(),
        capacity: options.capacity,
        session_ttl: Duration::from_secs(5),
        // Arrivals end 20 s before the soak does.
        visitors: (options.rate
            * phases
                .end
                .saturating_sub(Duration::from_secs(20))
                .as_secs_f64())
        .max(1.0) as usize,
        rate: options.rate,
        leave: 0.85,
        vanish: 0.10,
        ghost: 0.05,
        browses: 3,
        think: Duration::from_secs(1),
        deadline: phases.end,
        seed: 1,
        patient: true,
    };
    let visitors = plan.visitors;
    let crowd = runtime.spawn(sim::run_crowd(plan));
    let store_errors = {
        let admin = gate.admin;
        let stop = stop_rx.clone();
        std::thread::spawn(move || sample_store_errors(admin, start, &stop))
    };

    let wrk_thread = {
        let wrk = options.wrk.clone();
        let url = format!("http://{}{LOAD_PATH}", gate.addr);
        let connections = options.connections;
        std::thread::spawn(move || -> Result<Vec<load::Segment>> {
            let mut segments = Vec::new();
            sleep_until(start, phases.warm_up);
            loop {
                let now = start.elapsed();
                let boundary = if now < phases.reference {
                    phases.reference
                } else {
                    phases.end
                };
                let length =
                    Duration::from_secs(phases.segment.min(boundary.saturating_sub(now)).as_secs());
                if length.is_zero() {
                    if boundary >= phases.end {
                        return Ok(segments);
                    }
                    sleep_until(start, boundary);
                    continue;
                }
                let segment = load::segment(&wrk, &script, connections, length, &url, start)?;
                eprintln!(
                    "  {:>5.0} s: wrk {:.0} req/s, p99 {:.2} ms, {} errors",
                    segment.until.as_secs_f64(),
                    segment.run.requests_per_second,
                    segment.run.p99_us / 1000.0,
                    segment.run.errors
                );
                segments.push(segment);
            }
        })
    };

    sleep_until(start, phases.warm_up);
    let mut memory = vec![Memory::read("after warm-up", gate.process.pid())];
    let mut faults = Vec::new();
    let mut capacity_up = options.capacity + options.capacity / 2;
    capacity_up = capacity_up.max(options.capacity + 1);
    for (i, at) in phases.fault_times().into_iter().enumerate() {
        sleep_until(start, at);
        let kind = ROTATION[i % ROTATION.len()];
        let from = start.elapsed();
        let note = match kind {
            FaultKind::OriginKilled => {
                origin.kill_and_restart(ORIGIN_DOWN)?;
                format!("SIGKILL, down {ORIGIN_DOWN:?}, started again on its port")
            }
            FaultKind::RedisPaused => {
                redis.pause(REDIS_PAUSE)?;
                format!("SIGSTOP, SIGCONT after {REDIS_PAUSE:?}")
            }
            FaultKind::RedisKilled => {
                redis.kill_and_restart(REDIS_DOWN)?;
                format!("SIGKILL, down {REDIS_DOWN:?}, started again empty")
            }
            FaultKind::CapacityUp | FaultKind::CapacityDown => {
                let (old, new) = if kind == FaultKind::CapacityUp {
                    (options.capacity, capacity_up)
                } else {
                    (capacity_up, options.capacity)
                };
                let took = gate.set_capacity(new)?;
                format!(
                    "capacity {old} → {new} in the watched file; in `/routes` after {:.1} s",
                    took.as_secs_f64()
                )
            }
            FaultKind::KeyRotated => {
                let (id, took) = gate.rotate_key()?;
                format!(
                    "key `{id}` put first (new key file, config edit, SIGHUP); \
                     signing new cookies after {:.1} s",
                    took.as_secs_f64()
                )
            }
        };
        eprintln!("  {:>5.0} s: {kind}: {note}", from.as_secs_f64());
        faults.push(Fault {
            kind,
            from,
            until: start.elapsed(),
            capacity: gate.capacity(),
            note,
        });
        gate.process.ensure_running()?;
    }
    sleep_until(start, phases.end);
    memory.push(Memory::read("end, load running", gate.process.pid()));

    let segments = match wrk_thread.join() {
        Ok(segments) => segments?,
        Err(_) => anyhow::bail!("the wrk thread panicked"),
    };
    let _ = stop_tx.send(true);
    let store_errors = match store_errors.join() {
        Ok(samples) => samples,
        Err(_) => anyhow::bail!("the metrics sampler panicked"),
    };
    let crowd = runtime.block_on(async {
        for task in tasks {
            let _ = task.await;
        }
        crowd.await
    });
    let crowd = crowd.context("the crowd task failed")?;
    // Closed connections' memory and descriptors are given back by now.
    std::thread::sleep(Duration::from_secs(3));
    memory.push(Memory::read("after the clients closed", gate.process.pid()));
    gate.process.ensure_running()?;

    Ok(Soak {
        minutes: options.total.as_secs_f64() / 60.0,
        connections: options.connections,
        delay_ms: options.delay_ms,
        rate: options.rate,
        visitors,
        capacity: options.capacity,
        phases,
        connection_limits: gate.connection_limits(),
        build: if options
            .queuegate
            .components()
            .any(|c| c.as_os_str() == "release")
        {
            "release"
        } else {
            "not a release build"
        },
        redis_version: Redis::version(),
        crowd_offset: crowd.start.saturating_duration_since(start),
        crowd,
        faults,
        segments,
        tunnels: drain(&tunnels),
        slow: drain(&slow),
        idle: drain(&idle),
        memory,
        store_errors,
    })
}

/// Every second until `stop`: queuegate's `queuegate_store_errors_total`
/// (all operations) from its admin listener, with the time.
fn sample_store_errors(
    admin: SocketAddr,
    start: Instant,
    stop: &watch::Receiver<bool>,
) -> Vec<(Duration, u64)> {
    let mut samples = Vec::new();
    while !*stop.borrow() {
        if let Ok(metrics) = http::get(admin, "/metrics", &[]) {
            let total = String::from_utf8_lossy(&metrics.body)
                .lines()
                .filter(|line| line.starts_with("queuegate_store_errors_total"))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
            samples.push((start.elapsed(), total as u64));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    samples
}

fn sleep_until(start: Instant, at: Duration) {
    let now = start.elapsed();
    if at > now {
        std::thread::sleep(at - now);
    }
}

fn drain<T>(log: &Mutex<Vec<T>>) -> Vec<T> {
    std::mem::take(&mut *log.lock().unwrap_or_else(PoisonError::into_inner))
}
