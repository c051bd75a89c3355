//! Redis memory per waiting visitor: fills one route's line with N waiters
//! (default 1,000,000; `QG_BENCH_WAITERS` overrides) through the real
//! `arrive` script, with the per-client limits on (the defaults: 20 places,
//! 120 joins a minute) and every waiter from its own client key, the worst
//! case for memory: one client key per waiter; `QG_BENCH_CLIENT_LIMITS=0`
//! turns the limits off (no client keys). Tickets are never polled in the
//! bench, so `confirm_within` is set as long as `abandon_after`. Prints `used_memory` growth,
//! the route keys' `MEMORY USAGE` and a sample of client keys', each per
//! waiter. A measurement, not a test: it checks only that every arrival
//! queued.
//!
//! Run: `cargo bench --bench redis_memory` (needs `redis-server` on PATH).
//!
//! Results are in benches/README.md.

#[path = "../tests/common/redis.rs"]
mod redis_harness;

use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use queuegate::queue::{Arrival, Lanes, Limits, QueueStore, RedisStore};
use redis_harness::RedisServer;

const ROUTE: &str = "bench";
const IN_FLIGHT: usize = 128;
/// Client keys sampled for their `MEMORY USAGE`.
const CLIENT_SAMPLE: u64 = 1_000;

/// The client key of waiter `n`: an IPv4 address of its own.
fn client_of(n: u64) -> [u8; 4] {
    (n as u32).to_be_bytes()
}

/// The average `MEMORY USAGE` of a sample of client keys.
fn client_key_bytes(server: &RedisServer, waiters: u64) -> f64 {
    let sample = CLIENT_SAMPLE.min(waiters).max(1);
    let step = (waiters / sample).max(1);
    let total: u64 = (0..sample)
        .map(|i| {
            let hex: String = client_of(i * step)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let key = format!("qg:{{{ROUTE}}}:client:{hex}");
            let bytes: Option<u64> = server.query(&["MEMORY", "USAGE", &key, "SAMPLES", "0"]);
            bytes.expect("every waiter's client key exists")
        })
        .sum();
    total as f64 / sample as f64
}

fn used_memory(server: &RedisServer) -> u64 {
    let info: String = server.query(&["INFO", "memory"]);
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory reports used_memory")
}

fn route_key_bytes(server: &RedisServer) -> Vec<(String, u64)> {
    ["waiting", "seen", "active", "tick", "stats", "beat"]
        .iter()
        .map(|k| {
            let key = format!("qg:{{{ROUTE}}}:{k}");
            let bytes: Option<u64> = server.query(&["MEMORY", "USAGE", &key, "SAMPLES", "0"]);
            (key, bytes.unwrap_or(0))
        })
        .collect()
}

fn main() {
    let waiters: u64 = std::env::var("QG_BENCH_WAITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let client_limits = std::env::var("QG_BENCH_CLIENT_LIMITS").map_or(true, |v| v != "0");
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let limits = Limits {
        capacity: 0,
        max_admit_per_tick: 20,
        tick: Duration::from_millis(100),
        session_ttl: Duration::from_secs(600),
        pass_ttl: Duration::from_secs(60),
        arrival_grace: Duration::from_secs(60),
        abandon_after: Duration::from_secs(3600),
        max_waiting: waiters + 1,
        confirm_within: Duration::from_secs(3600),
        client_places: if client_limits { 20 } else { 0 },
        client_joins_per_minute: if client_limits { 120 } else { 0 },
        lanes: Lanes::default(),
        opens_at_us: None,
        shards: 1,
    };

    runtime.block_on(async {
        let store = RedisStore::connect(&server.config(Duration::from_secs(5)))
            .expect("config is well formed");
        // Create the route (its stats hash) before measuring.
        store.stats(ROUTE, &limits).await.expect("stats");
        let before = used_memory(&server);
        let started = Instant::now();
        let joined = stream::iter(0..waiters)
            .map(|n| {
                let store = &store;
                let limits = &limits;
                async move {
                    let mut id = [0u8; 16];
                    // Spread the bytes as random ids would.
                    let mixed = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    id[..8].copy_from_slice(&mixed.to_le_bytes());
                    id[8..].copy_from_slice(&n.to_le_bytes());
                    store
                        .arrive(ROUTE, &id, &client_of(n), limits, false, None, 0)
                        .await
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .fold(0u64, |joined, arrival| async move {
                match arrival {
                    Ok(Arrival::Waiting(_)) => joined + 1,
                    other => panic!("arrive failed: {other:?}"),
                }
            })
            .await;
        let elapsed = started.elapsed();
        let after = used_memory(&server);
        let stats = store.stats(ROUTE, &limits).await.expect("stats");
        assert_eq!(stats.waiting, joined);

        println!("waiting visitors:        {joined}");
        println!(
            "arrive calls:            {:.0}/s ({IN_FLIGHT} in flight)",
            joined as f64 / elapsed.as_secs_f64()
        );
        println!(
            "used_memory growth:      {} bytes = {:.1} bytes per waiting visitor",
            after - before,
            (after - before) as f64 / joined as f64
        );
        let keys = route_key_bytes(&server);
        let total: u64 = keys.iter().map(|(_, b)| b).sum();
        for (key, bytes) in &keys {
            println!("  MEMORY USAGE {key}: {bytes}");
        }
        println!(
            "route keys total:        {total} bytes = {:.1} bytes per waiting visitor",
            total as f64 / joined as f64
        );
        if client_limits {
            println!(
                "client keys:             {:.1} bytes each (MEMORY USAGE, {CLIENT_SAMPLE} sampled), one per waiter",
                client_key_bytes(&server, joined)
            );
        }
    });
}
