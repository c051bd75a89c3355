//! The waiting path through one queuegate instance on Redis, next to Redis
//! alone doing the same work: status polls/s through queuegate (wrk, rotating
//! the ticket cookies of 1,000 real waiters) against the poll script run by
//! EVALSHA through `redis-benchmark` at the same client count, with a real
//! waiter's id and score; then a join storm of 100,000 distinct visitors
//! through one instance, on Redis and on the memory store, with zero errors.
//!
//! Run: `cargo bench --bench waiting_path` (needs `redis-server`,
//! `redis-benchmark` and `wrk` on PATH). Flags (or `QG_<FLAG>`):
//! `--clients` (50), `--poll-seconds` (10), `--waiters` (1000),
//! `--joins` (100000), `--evalsha-requests` (300000).

#[path = "crowd/fleet.rs"]
mod fleet;
#[path = "crowd/sim.rs"]
mod sim;

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use fleet::{GateSpec, Origin, Queuegate, RedisServer, StoreSpec};
use http::{Method, StatusCode};
use sim::{Browser, Flags, Jar};

const ROUTE: &str = "bench";
const PATH: &str = "/event";
const WRK_THREADS: usize = 2;

/// The poll script exactly as the Redis store builds it: the shared prelude,
/// a newline, the operation's file (`route_script!` in `src/queue/redis_store.rs`).
const POLL_SCRIPT: &str = concat!(
    include_str!("../lua/route.lua"),
    "\n",
    include_str!("../lua/poll.lua")
);

fn main() {
    let flags = Flags::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(bench(&flags));
}

/// A route that stays full: one visitor holds the only slot for ten minutes
/// and nobody in line turns into a ghost during the run.
fn full_route(store: StoreSpec) -> GateSpec {
    let mut spec = GateSpec::quick(ROUTE, PATH, 1);
    spec.max_admit_per_tick = 1;
    spec.tick = Duration::from_millis(100);
    spec.pass_ttl = Duration::from_secs(60);
    spec.session_ttl = Duration::from_secs(600);
    spec.arrival_grace = Duration::from_secs(600);
    spec.abandon_after = Duration::from_secs(600);
    spec.max_waiting = 10_000_000;
    spec.store = store;
    spec
}

const NAVIGATE: [(&str, &str); 2] = [("accept", "text/html"), ("sec-fetch-mode", "navigate")];

/// Fills the route: one admitted holder, then `n` waiters, each polled once
/// as the waiting page does; returns the waiters' ticket cookie values in
/// join order.
async fn fill(gate: &Queuegate, n: usize) -> Vec<String> {
    let browser = Browser::new(64);
    let url = format!("{}{PATH}", gate.url());
    let mut holder = Jar::default();
    let a = browser
        .send(Method::GET, &url, &NAVIGATE, &mut holder)
        .await
        .expect("the holder's request");
    assert_eq!(a.status, StatusCode::OK, "the first visitor is admitted");
    let mut tickets = Vec::with_capacity(n);
    for _ in 0..n {
        let mut jar = Jar::default();
        let a = browser
            .send(Method::GET, &url, &NAVIGATE, &mut jar)
            .await
            .expect("a waiter's request");
        assert_eq!(a.status, StatusCode::FOUND, "a newcomer waits");
        // The waiting page's first poll confirms the ticket, as in a
        // browser; the ticket it sets is the one polled from then on.
        let status = format!("{}/__queuegate/status?route={ROUTE}", gate.url());
        let polled = browser
            .send(Method::GET, &status, &[], &mut jar)
            .await
            .expect("a waiter's first poll");
        assert_eq!(polled.status, StatusCode::OK);
        let cookie = jar
            .get(&format!("qg_{ROUTE}"))
            .expect("a ticket cookie")
            .to_owned();
        tickets.push(cookie);
    }
    tickets
}

/// What the wrk scripts print from `done()`.
#[derive(Debug, Default)]
struct WrkRun {
    requests: u64,
    seconds: f64,
    socket_errors: u64,
    good: u64,
    bad: u64,
}

impl WrkRun {
    fn per_second(&self) -> f64 {
        self.requests as f64 / self.seconds.max(1e-9)
    }
}

/// Shared tail of both wrk scripts: count good and bad answers per thread,
/// add them up in `done()` and print one line the bench parses.
const WRK_DONE: &str = r#"
local threads = {}
function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end
function done(summary, latency, requests)
  local good, bad = 0, 0
  for _, t in ipairs(threads) do
    good = good + t:get("good")
    bad = bad + t:get("bad")
  end
  local e = summary.errors
  io.write(string.format("QGRESULT %d %d %d %d %d\n", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout, good, bad))
end
"#;

fn wrk(script: &Path, url: &str, clients: usize, seconds: u64) -> WrkRun {
    let out = Command::new("wrk")
        .arg(format!("-t{WRK_THREADS}"))
        .arg(format!("-c{clients}"))
        .arg(format!("-d{seconds}s"))
        .arg("-s")
        .arg(script)
        .arg(url)
        .output()
        .expect("run wrk (apt-get install wrk)");
    wrk_result(&out)
}

/// Reads the line the scripts' `done()` prints.
fn wrk_result(out: &std::process::Output) -> WrkRun {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("QGRESULT "))
        .unwrap_or_else(|| {
            panic!(
                "wrk printed no result:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let f: Vec<f64> = line
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    assert_eq!(f.len(), 5, "wrk result line: {line}");
    WrkRun {
        requests: f[0] as u64,
        seconds: f[1] / 1e6,
        socket_errors: f[2] as u64,
        good: f[3] as u64,
        bad: f[4] as u64,
    }
}

/// Status polls through queuegate, rotating the waiters' tickets; an answer
/// that is not `"state":"waiting"` counts as bad.
fn poll_script(dir: &Path, tickets: &[String]) -> std::path::PathBuf {
    let mut lua = String::from("local cookies = {\n");
    for t in tickets {
        lua.push_str(&format!("  \"{t}\",\n"));
    }
    lua.push_str("}\n");
    lua.push_str(&format!(
        r#"
good, bad = 0, 0
local reqs = {{}}
local i = 0
function init(args)
  for k, c in ipairs(cookies) do
    reqs[k] = wrk.format("GET", "/__queuegate/status?route={ROUTE}",
      {{ ["Cookie"] = "qg_{ROUTE}=" .. c, ["Accept"] = "application/json" }})
  end
  i = (id or 1) * 487
end
function request()
  i = i % #reqs + 1
  return reqs[i]
end
function response(status, headers, body)
  if status == 200 and body:find('"state":"waiting"', 1, true) then
    good = good + 1
  else
    bad = bad + 1
  end
end
"#
    ));
    lua.push_str(WRK_DONE);
    let path = dir.join("poll.lua");
    std::fs::write(&path, lua).expect("write poll.lua");
    path
}

/// Navigations without a cookie to the full route: each one joins the line
/// anew. Each thread stops after its share of `joins` and drops a marker file
/// in `dir`, so the bench can time the storm (wrk itself runs to `-d`).
fn join_script(dir: &Path, joins: u64) -> std::path::PathBuf {
    let per_thread = joins.div_ceil(WRK_THREADS as u64);
    let markers = dir.display();
    let mut lua = format!(
        r#"
good, bad = 0, 0
local req
function init(args)
  req = wrk.format("GET", "{PATH}",
    {{ ["Accept"] = "text/html", ["Sec-Fetch-Mode"] = "navigate" }})
end
function request()
  return req
end
function response(status, headers, body)
  if status == 302 and (headers["set-cookie"] or headers["Set-Cookie"]) then
    good = good + 1
  else
    bad = bad + 1
  end
  if good + bad == {per_thread} then
    local f = io.open("{markers}/joined-" .. id, "w")
    f:write("done")
    f:close()
    wrk.thread:stop()
  end
end
"#
    );
    lua.push_str(WRK_DONE);
    let path = dir.join("join.lua");
    std::fs::write(&path, lua).expect("write join.lua");
    path
}

/// A join storm of `joins` through `url`: runs wrk until every thread has
/// dropped its marker, then stops it with SIGINT (wrk then prints its
/// results). The time is from start to the last marker.
fn join_storm(url: &str, joins: u64, clients: usize) -> WrkRun {
    let dir = tempfile::tempdir().expect("temp dir for the join storm");
    let script = join_script(dir.path(), joins);
    let start = std::time::Instant::now();
    let child = Command::new("wrk")
        .arg(format!("-t{WRK_THREADS}"))
        .arg(format!("-c{clients}"))
        .arg("-d600s")
        .arg("-s")
        .arg(&script)
        .arg(url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run wrk (apt-get install wrk)");
    let markers = || {
        (1..=WRK_THREADS)
            .filter(|i| dir.path().join(format!("joined-{i}")).exists())
            .count()
    };
    while markers() < WRK_THREADS && start.elapsed() < Duration::from_secs(590) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let seconds = start.elapsed().as_secs_f64();
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().expect("wrk's output");
    let mut run = wrk_result(&out);
    run.seconds = seconds;
    run
}

/// `redis-benchmark` running the poll script by EVALSHA for one real waiter.
fn evalsha_per_second(redis: &RedisServer, ticket: &str, clients: usize, requests: u64) -> f64 {
    let sha: String = redis.query(&["SCRIPT", "LOAD", POLL_SCRIPT]);
    let known: Vec<u8> = redis.query(&["SCRIPT", "EXISTS", &sha]);
    assert_eq!(known, [1], "the script loaded");
    // v1.w.<route>.<id>.<t>.<kid>.<mac>
    let fields: Vec<&str> = ticket.split('.').collect();
    let mut id = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(fields[3])
        .expect("the ticket's id is base64url");
    // Redis names the visitor by the id's first 12 bytes (`store_id`).
    id.truncate(12);
    // `t` is the join score, then `-` and when the line last saw the holder.
    let (score, seen) = fields[4].split_once('-').unwrap_or((fields[4], fields[4]));
    let keys: Vec<String> = ["waiting", "seen", "active", "tick", "stats", "beat"]
        .iter()
        .map(|k| format!("qg:{{{ROUTE}}}:{k}"))
        .collect();
    let (session_ttl, abandon_after, pass_ttl, client_memory, confirm_within) =
        ("600000", "600000", "60000", "600000", "600000");

    // The same call once through the client: the waiter is in line.
    let mut con = redis.connection();
    let reply: Vec<u64> = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(6)
        .arg(&keys)
        .arg(&id[..])
        .arg(score)
        .arg(seen)
        .arg(session_ttl)
        .arg(abandon_after)
        .arg(pass_ttl)
        .arg(client_memory)
        .arg(confirm_within)
        .query(&mut con)
        .expect("EVALSHA poll");
    assert_eq!(
        reply.first(),
        Some(&2),
        "the waiter is still in line: {reply:?}"
    );

    let out = Command::new("redis-benchmark")
        .args(["-p", &redis.port().to_string()])
        .args([
            "-c",
            &clients.to_string(),
            "-n",
            &requests.to_string(),
            "-q",
        ])
        .args(["EVALSHA", &sha, "6"])
        .args(&keys)
        .arg(std::ffi::OsStr::from_bytes(&id))
        .args([
            score,
            seen,
            session_ttl,
            abandon_after,
            pass_ttl,
            client_memory,
            confirm_within,
        ])
        .output()
        .expect("run redis-benchmark (apt-get install redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    // "...: 51234.56 requests per second, p50=..."
    let last = text
        .rsplit('\r')
        .flat_map(str::lines)
        .find(|l| l.contains("requests per second"))
        .unwrap_or_else(|| panic!("redis-benchmark printed no rate:\n{text}"));
    last.split_whitespace()
        .zip(last.split_whitespace().skip(1))
        .find(|(_, next)| *next == "requests")
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the rate in {last:?}"))
}

/// A waiter whose raw id has no NUL byte (it goes through argv).
fn argv_safe(tickets: &[String]) -> &str {
    tickets
        .iter()
        .find(|t| {
            let id = t.split('.').nth(3).unwrap_or("");
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(id)
                .is_ok_and(|b| !b.contains(&0))
        })
        .expect("a waiter whose id has no NUL byte")
}

async fn bench(flags: &Flags) {
    let clients: usize = flags.parse("clients", 50);
    let poll_seconds: u64 = flags.parse("poll-seconds", 10);
    let waiters: usize = flags.parse("waiters", 1_000);
    let joins: u64 = flags.parse("joins", 100_000);
    let evalsha_requests: u64 = flags.parse("evalsha-requests", 300_000);
    let dir = tempfile::tempdir().expect("temp dir for the wrk scripts");
    let origin = Origin::start().await;
    let key = fleet::run_key();

    // Polls: queuegate against Redis alone.
    let redis = RedisServer::start();
    let gate = Queuegate::start(
        &full_route(StoreSpec::Redis { url: redis.url() }),
        &origin.url(),
        &key,
    );
    let tickets = fill(&gate, waiters).await;
    let script = poll_script(dir.path(), &tickets);
    let polls = wrk(&script, &gate.url(), clients, poll_seconds);
    assert_eq!(
        (polls.bad, polls.socket_errors),
        (0, 0),
        "every poll answered waiting: {polls:?}\n{}",
        gate.log_tail(10)
    );
    let evalsha = evalsha_per_second(&redis, argv_safe(&tickets), clients, evalsha_requests);
    let ratio = polls.per_second() / evalsha;

    // Join storms.
    let before: u64 = redis.query(&["ZCARD", &format!("qg:{{{ROUTE}}}:waiting")]);
    let redis_joins = join_storm(&gate.url(), joins, clients);
    let after: u64 = redis.query(&["ZCARD", &format!("qg:{{{ROUTE}}}:waiting")]);
    drop(gate);
    let memory_gate = Queuegate::start(&full_route(StoreSpec::Memory), &origin.url(), &key);
    fill(&memory_gate, 1).await;
    let memory_joins = join_storm(&memory_gate.url(), joins, clients);
    drop(memory_gate);

    println!("waiting path, one queuegate instance, {clients} clients, {waiters} waiters in line");
    println!(
        "  status polls via queuegate (wrk, Redis store)  {:>10.0} /s  ({} polls in {:.1} s, all \"waiting\")",
        polls.per_second(),
        polls.requests,
        polls.seconds
    );
    println!("  poll script by EVALSHA (redis-benchmark)      {evalsha:>10.0} /s");
    println!("  ratio queuegate / EVALSHA                     {ratio:>10.2}  (target >= 0.5)");
    for (store, run) in [("Redis", &redis_joins), ("memory", &memory_joins)] {
        println!(
            "  join storm, {store:<6} store: {} joins in {:.1} s ({:.0} /s), {} other answers, {} socket errors",
            run.good,
            run.seconds,
            run.per_second(),
            run.bad,
            run.socket_errors
        );
    }
    println!(
        "  Redis line grew by {} during the storm ({} joins answered)",
        after - before,
        redis_joins.good
    );
    assert_eq!(
        (redis_joins.bad, redis_joins.socket_errors),
        (0, 0),
        "Redis join storm errors"
    );
    assert_eq!(
        (memory_joins.bad, memory_joins.socket_errors),
        (0, 0),
        "memory join storm errors"
    );
    // Requests in flight when wrk stopped joined too, unanswered.
    assert!(
        (redis_joins.good..=redis_joins.good + clients as u64).contains(&(after - before)),
        "every answered join is in line"
    );
    assert!(redis_joins.good >= joins && memory_joins.good >= joins);
}
