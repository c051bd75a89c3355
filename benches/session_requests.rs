//! What `max_requests_per_session` costs per request: the admitted path of
//! one queuegate instance on Redis with a pass, with and without the limit
//! (which counts every forwarded request in the store, one script call
//! each, DESIGN §8.6), run alternately in the same process tree so the
//! machine's noise hits both: requests per second through wrk, and the CPU
//! queuegate and Redis spend per request (`utime + stime` from
//! `/proc/<pid>/stat`). The difference is the limit's cost.
//!
//! Run: `cargo bench --bench session_requests` (needs `redis-server` and
//! `wrk` on PATH). Flags (or `QG_<FLAG>`): `--clients` (32), `--seconds`
//! (10 per run), `--rounds` (2: plain, counted, plain, counted).

#[path = "crowd/fleet.rs"]
mod fleet;
#[path = "crowd/sim.rs"]
mod sim;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fleet::{GateSpec, Origin, Queuegate, RedisServer, StoreSpec};
use http::{Method, StatusCode};
use sim::{Browser, Flags, Jar};

const ROUTE: &str = "bench";
const PATH: &str = "/shop";

fn main() {
    let flags = Flags::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(bench(&flags));
}

/// A route with room for everyone, long sessions and passes, counting
/// requests when `limit` is set (high enough never to be reached).
fn spec(redis: &RedisServer, limit: Option<u64>) -> GateSpec {
    let mut spec = GateSpec::quick(ROUTE, PATH, 1_000_000);
    spec.pass_ttl = Duration::from_secs(600);
    spec.session_ttl = Duration::from_secs(600);
    spec.arrival_grace = Duration::from_secs(600);
    spec.abandon_after = Duration::from_secs(600);
    spec.store = StoreSpec::Redis { url: redis.url() };
    spec.max_requests_per_session = limit;
    spec
}

/// A confirmed pass: admitted at once, then back once (which confirms it).
async fn pass(gate: &Queuegate) -> String {
    let browser = Browser::new(4);
    let url = format!("{}{PATH}/item", gate.url());
    let mut jar = Jar::default();
    for _ in 0..2 {
        let a = browser
            .send(Method::GET, &url, &[], &mut jar)
            .await
            .expect("a request to the route");
        assert_eq!(a.status, StatusCode::OK, "admitted");
    }
    let pass = jar.get(&format!("qg_{ROUTE}")).expect("a pass").to_owned();
    assert!(pass.starts_with("v1.a."), "a confirmed pass: {pass}");
    pass
}

/// `utime + stime` of `pid`, in clock ticks (100 per second on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After `pid (comm) `: state is field 3; utime, stime are 14 and 15.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

/// A wrk script sending every request with the pass and counting `200`s.
fn script(dir: &Path, pass: &str) -> std::path::PathBuf {
    let lua = format!(
        r#"
wrk.headers["Cookie"] = "qg_{ROUTE}={pass}"
local threads = {{}}
function setup(thread) table.insert(threads, thread) end
function init(args) good, bad = 0, 0 end
function response(status, headers, body)
  if status == 200 then good = good + 1 else bad = bad + 1 end
end
function done(summary, latency, requests)
  local g, b = 0, 0
  for _, t in ipairs(threads) do g = g + t:get("good"); b = b + t:get("bad") end
  io.write(string.format("QGRESULT %d %d %d %d\n", summary.requests, summary.duration, g, b))
end
"#
    );
    let path = dir.join("pass.lua");
    std::fs::write(&path, lua).expect("write the wrk script");
    path
}

struct Run {
    per_second: f64,
    gate_us: f64,
    redis_us: f64,
    bad: u64,
}

fn wrk(script: &Path, url: &str, clients: usize, seconds: u64) -> (u64, f64, u64) {
    let out = Command::new("wrk")
        .args([
            "-t2",
            &format!("-c{clients}"),
            &format!("-d{seconds}s"),
            "-s",
        ])
        .arg(script)
        .arg(url)
        .output()
        .expect("run wrk (apt-get install wrk)");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("QGRESULT "))
        .unwrap_or_else(|| panic!("wrk printed no result:\n{text}"));
    let f: Vec<f64> = line
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    (f[0] as u64, f[1] / 1e6, f[3] as u64)
}

async fn run(redis: &RedisServer, origin: &Origin, limit: Option<u64>, flags: &Flags) -> Run {
    let clients: usize = flags.parse("clients", 32);
    let seconds: u64 = flags.parse("seconds", 10);
    let gate = Queuegate::start(&spec(redis, limit), &origin.url(), &fleet::run_key());
    let pass = pass(&gate).await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let script = script(dir.path(), &pass);
    let url = format!("{}{PATH}/item", gate.url());
    let (gate_before, redis_before) = (cpu_ticks(gate.pid()), cpu_ticks(redis.pid()));
    let (requests, took, bad) =
        tokio::task::spawn_blocking(move || wrk(&script, &url, clients, seconds))
            .await
            .expect("wrk ran");
    let gate_ticks = cpu_ticks(gate.pid()) - gate_before;
    let redis_ticks = cpu_ticks(redis.pid()) - redis_before;
    let per_request_us = |ticks: u64| ticks as f64 * 10_000.0 / requests.max(1) as f64;
    Run {
        per_second: requests as f64 / took.max(1e-9),
        gate_us: per_request_us(gate_ticks),
        redis_us: per_request_us(redis_ticks),
        bad,
    }
}

async fn bench(flags: &Flags) {
    let rounds: usize = flags.parse("rounds", 2);
    let redis = RedisServer::start();
    let origin = Origin::start().await;
    let mut plain = Vec::new();
    let mut counted = Vec::new();
    for _ in 0..rounds {
        plain.push(run(&redis, &origin, None, flags).await);
        counted.push(run(&redis, &origin, Some(1_000_000_000), flags).await);
    }
    let mean =
        |runs: &[Run], f: fn(&Run) -> f64| runs.iter().map(f).sum::<f64>() / runs.len() as f64;
    println!(
        "| admitted path, one pass | req/s | queuegate CPU µs/req | Redis CPU µs/req | not 200 |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (name, runs) in [("plain", &plain), ("max_requests_per_session", &counted)] {
        println!(
            "| {name} | {:.0} | {:.1} | {:.1} | {} |",
            mean(runs, |r| r.per_second),
            mean(runs, |r| r.gate_us),
            mean(runs, |r| r.redis_us),
            runs.iter().map(|r| r.bad).sum::<u64>()
        );
    }
    let ratio = mean(&counted, |r| r.per_second) / mean(&plain, |r| r.per_second);
    let extra_gate = mean(&counted, |r| r.gate_us) - mean(&plain, |r| r.gate_us);
    let extra_redis = mean(&counted, |r| r.redis_us) - mean(&plain, |r| r.redis_us);
    println!(
        "\ncounted / plain req/s: {ratio:.2}×; the count costs {extra_gate:.1} µs of queuegate CPU \
         and {extra_redis:.1} µs of Redis CPU per request"
    );
}
