//! The crowd simulator: N visitors arriving at a set rate, each with its own
//! cookie jar, join a gated route, poll the waiting room as told, browse while
//! admitted, then leave, vanish, or vanish while still waiting. It starts the
//! queuegate instances itself (memory store for one, a private
//! `redis-server` for one or more) or drives running ones (`--targets`), and
//! prints joins/s, polls/s, the most visitors admitted at once against the
//! capacity, order inversions, wait percentiles, no-shows, ghosts and errors.
//! It exits non-zero when capacity was exceeded or anyone was admitted ahead
//! of an earlier joiner still waiting.
//!
//! Run (every flag also reads `QG_<FLAG>`, dashes as underscores):
//!
//! ```text
//! cargo bench --bench crowd -- --visitors 20000 --rate 150 --instances 3 \
//!     --store redis --capacity 400 --think-ms 1000 --abandon-after-ms 30000 \
//!     --arrival-grace-ms 30000 --session-ttl-ms 3000
//! ```
//!
//! Flags: `--visitors` (1000), `--rate` visitors/s (200), `--instances` (1),
//! `--store memory|redis` (memory for one instance, redis for more),
//! `--capacity` (50), `--max-admit-per-tick` (capacity), `--tick-ms` (50),
//! `--session-ttl-ms` (2000), `--abandon-after-ms` (1500), `--arrival-grace-ms`
//! (2000), `--leave` /
//! `--vanish` / `--ghost` weights (0.85 / 0.10 / 0.05), `--browses` (3),
//! `--think-ms` (100), `--deadline-s` (600), `--seed` (1); `--targets
//! URL,URL` with `--route` and `--path` to drive instances already running
//! (then `--capacity` and `--session-ttl-ms` must match their config).
//!
//! `--waiters N` selects the mass mode instead (`crowd/mass.rs`): N waiters,
//! each only its cookie jar, share `--sockets` keep-alive connections to
//! `--instances` instances on one Redis (or a local 3-master Cluster); it
//! times joins and polls, reads Redis's own counters around each phase
//! (summed over the masters, and the busiest one's CPU), and checks
//! displayed positions against the exact rank:
//!
//! ```text
//! cargo bench --bench crowd -- --waiters 100000 --abandon 0.1
//! cargo bench --bench crowd -- --waiters 100000 --cluster --shards 3
//! ```
//!
//! Its flags: `--waiters`, `--instances` (3), `--sockets` (2000),
//! `--capacity` (100), `--poll-s` (10), `--poll-duration-s` (60),
//! `--abandon` (0), `--leave-rate` holders/s (10), `--abandon-after-s` (45),
//! `--arrival-grace-s` (as abandon-after), `--tick-ms` (100), `--samples`
//! (1000), `--quiet-s` (5), `--evalsha-clients` (50), `--evalsha-requests`
//! (200000), `--seed` (1); `--cluster` (off: one Redis) starts three
//! `redis-server` masters on 127.0.0.1 joined by `redis-cli --cluster
//! create` and gives the instances `store.redis.cluster`; `--shards K` (1)
//! writes `shards: K` into the route, splitting its line into K sub-lines
//! (on the Cluster with K = 3, one per master), and the exact rank of a
//! sampled waiter is then the waiters with a lower join score in every
//! sub-line (ZCOUNT on the master holding each), + 1.

#[path = "../tests/common/redis.rs"]
mod cluster;
#[path = "crowd/fleet.rs"]
mod fleet;
#[path = "crowd/mass.rs"]
mod mass;
#[path = "crowd/masters.rs"]
mod masters;
#[path = "crowd/sim.rs"]
mod sim;

use std::time::Duration;

use fleet::{GateSpec, Origin, Queuegate, RedisServer, StoreSpec};
use sim::{Flags, Plan};

fn main() {
    let flags = Flags::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let passed = if flags.get("waiters").is_some() {
        runtime.block_on(mass::run(&flags))
    } else {
        runtime.block_on(crowd(&flags))
    };
    if !passed {
        std::process::exit(1);
    }
}

async fn crowd(flags: &Flags) -> bool {
    let capacity: u64 = flags.parse("capacity", 50);
    let session_ttl = Duration::from_millis(flags.parse("session-ttl-ms", 2_000));
    let mut plan = Plan {
        targets: Vec::new(),
        route: flags.get("route").unwrap_or_else(|| "crowd".to_owned()),
        path: flags.get("path").unwrap_or_else(|| "/event".to_owned()),
        capacity,
        session_ttl,
        visitors: flags.parse("visitors", 1_000),
        rate: flags.parse("rate", 200.0),
        leave: flags.parse("leave", 0.85),
        vanish: flags.parse("vanish", 0.10),
        ghost: flags.parse("ghost", 0.05),
        browses: flags.parse("browses", 3),
        think: Duration::from_millis(flags.parse("think-ms", 100)),
        deadline: Duration::from_secs(flags.parse("deadline-s", 600)),
        seed: flags.parse("seed", 1),
        patient: false,
    };

    // Keep what we start alive until the run is over; dropped in reverse.
    let mut _redis = None;
    let mut _origin = None;
    let mut instances: Vec<Queuegate> = Vec::new();
    if let Some(targets) = flags.get("targets") {
        plan.targets = targets.split(',').map(|t| t.trim().to_owned()).collect();
    } else {
        let count: usize = flags.parse("instances", 1);
        let store = flags
            .get("store")
            .unwrap_or_else(|| if count > 1 { "redis" } else { "memory" }.to_owned());
        let mut spec = GateSpec::quick(&plan.route, &plan.path, capacity);
        spec.max_admit_per_tick = flags.parse("max-admit-per-tick", capacity);
        spec.tick = Duration::from_millis(flags.parse("tick-ms", 50));
        spec.session_ttl = session_ttl;
        // The shortest pass the config allows; session_ttl must be at least as long.
        spec.pass_ttl = Duration::from_secs(2);
        spec.abandon_after = Duration::from_millis(flags.parse("abandon-after-ms", 1_500));
        spec.arrival_grace = Duration::from_millis(flags.parse("arrival-grace-ms", 2_000));
        spec.max_connections = 20_000;
        spec.instances_expected = count as u64;
        spec.store = match store.as_str() {
            "memory" if count == 1 => StoreSpec::Memory,
            "memory" => panic!("--store memory serves one instance only; use redis"),
            "redis" => {
                let redis = RedisServer::start();
                let url = redis.url();
                _redis = Some(redis);
                StoreSpec::Redis { url }
            }
            other => panic!("--store {other}: memory or redis"),
        };
        let origin = Origin::start().await;
        let key = fleet::run_key();
        for _ in 0..count {
            instances.push(Queuegate::start(&spec, &origin.url(), &key));
        }
        plan.targets = instances.iter().map(Queuegate::url).collect();
        _origin = Some(origin);
        println!(
            "crowd: {} queuegate instance(s) on the {store} store, capacity {capacity}, \
             tick {:?}, session_ttl {:?}, abandon_after {:?}",
            count, spec.tick, spec.session_ttl, spec.abandon_after
        );
    }
    println!(
        "crowd: {} visitors at {}/s, endings leave {} / vanish {} / ghost {}, {} browses, \
         think {:?}",
        plan.visitors, plan.rate, plan.leave, plan.vanish, plan.ghost, plan.browses, plan.think
    );

    let report = sim::run(plan).await;
    print!("{}", report.table());
    if let Some(origin) = &_origin {
        println!("  origin requests: {}", origin.hits());
    }
    if let Some(redis) = &_redis {
        let route = flags.get("route").unwrap_or_else(|| "crowd".to_owned());
        let waiting: u64 = redis.query(&["ZCARD", &format!("qg:{{{route}}}:waiting")]);
        let active: u64 = redis.query(&["ZCARD", &format!("qg:{{{route}}}:active")]);
        println!("  store after the run: {waiting} waiting, {active} in the active set");
    }
    if report.errors > 0 {
        for q in &instances {
            let tail = q.log_tail(5);
            if !tail.is_empty() {
                println!("  log of {}:\n{tail}", q.url());
            }
        }
    }
    report.passed()
}
