//! Redis memory per waiting visitor: fills one route's line with N waiters
//! (default 1,000,000; `QG_BENCH_WAITERS` overrides) through the real
//! `arrive` script and prints `used_memory` growth and the route keys'
//! `MEMORY USAGE`, each divided by N. A measurement, not a test: it checks
//! only that every arrival queued. Target: at most 256 bytes per waiting visitor.
//!
//! Run: `cargo bench --bench redis_memory` (needs `redis-server` on PATH).
//!
//! Measured with 1,000,000 waiters (Redis 7.0.15, jemalloc, Debian): 251.6
//! bytes of `used_memory` per waiting visitor; `MEMORY USAGE` of the route's
//! keys 235.4 bytes (about 118 each in `waiting` and `seen`: a 16-byte member,
//! a skiplist node and a dict entry per ZSET). Within the 256-byte target.

#[path = "../tests/common/redis.rs"]
mod redis_harness;

use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use queuegate::queue::{Arrival, Limits, QueueStore, RedisStore};
use redis_harness::RedisServer;

const ROUTE: &str = "bench";
const IN_FLIGHT: usize = 128;

fn used_memory(server: &RedisServer) -> u64 {
    let info: String = server.query(&["INFO", "memory"]);
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory reports used_memory")
}

fn route_key_bytes(server: &RedisServer) -> Vec<(String, u64)> {
    ["waiting", "seen", "active", "tick", "stats"]
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
                    store.arrive(ROUTE, &id, limits, false).await
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
    });
}
