//! The Redis a mass run stands on: one `redis-server` (`fleet.rs`), or a
//! local Cluster of three masters (`--cluster`, started as the tests start
//! theirs, `tests/common/redis.rs`). It names each master, reads every
//! master's `INFO`, and tells which master serves a key, so that the run's
//! own reads go straight to it.

use std::time::Duration;

use crate::cluster::RedisCluster;
use crate::fleet::{RedisServer, StoreSpec};

/// The server(s), stopped by PID when dropped.
enum Servers {
    One(RedisServer),
    Cluster(RedisCluster),
}

/// One Redis or a Cluster, and its masters' ports in a fixed order.
pub struct Masters {
    servers: Servers,
    ports: Vec<u16>,
    /// (first slot, last slot, master index) of each range the Cluster
    /// serves; empty on one Redis.
    slots: Vec<(u16, u16, usize)>,
}

impl Masters {
    /// Starts one Redis, or with `cluster` three masters joined into a
    /// Cluster by `redis-cli --cluster create`.
    pub fn start(cluster: bool) -> Masters {
        if !cluster {
            let server = RedisServer::start();
            let ports = vec![server.port()];
            return Masters {
                servers: Servers::One(server),
                ports,
                slots: Vec::new(),
            };
        }
        let cluster = RedisCluster::start();
        let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port()).collect();
        let slots = slot_ranges(&cluster.nodes[0].query(&["CLUSTER", "SLOTS"]), &ports);
        Masters {
            servers: Servers::Cluster(cluster),
            ports,
            slots,
        }
    }

    /// How the store is written in the instances' config.
    pub fn store_spec(&self) -> StoreSpec {
        match &self.servers {
            Servers::One(server) => StoreSpec::Redis { url: server.url() },
            Servers::Cluster(cluster) => StoreSpec::Cluster {
                nodes: cluster.urls(),
            },
        }
    }

    /// "one Redis" or "a 3-master Redis Cluster", for the report.
    pub fn describe(&self) -> String {
        match &self.servers {
            Servers::One(_) => "one Redis".to_owned(),
            Servers::Cluster(_) => format!("a {}-master Redis Cluster", self.ports.len()),
        }
    }

    pub fn count(&self) -> usize {
        self.ports.len()
    }

    pub fn port(&self, master: usize) -> u16 {
        self.ports[master]
    }

    pub fn url(&self, master: usize) -> String {
        format!("redis://127.0.0.1:{}", self.ports[master])
    }

    /// The master (index) serving `key`: its slot computed as Redis does,
    /// looked up in the slot map read at start.
    pub fn master_of(&self, key: &str) -> usize {
        if self.slots.is_empty() {
            return 0;
        }
        let slot = queuegate::queue::shards::key_slot(key);
        self.slots
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|(_, _, master)| *master)
            .unwrap_or_else(|| panic!("no master serves slot {slot} of {key}"))
    }

    /// One command on one master.
    pub fn query<T: redis::FromRedisValue>(&self, master: usize, args: &[&str]) -> T {
        let run = || -> redis::RedisResult<T> {
            let client = redis::Client::open(self.url(master))?;
            let mut con = client.get_connection_with_timeout(Duration::from_secs(2))?;
            let mut cmd = redis::cmd(args[0]);
            for a in &args[1..] {
                cmd.arg(*a);
            }
            cmd.query(&mut con)
        };
        run().unwrap_or_else(|e| panic!("redis {args:?} on {}: {e}", self.url(master)))
    }

    /// One command on the master serving `key`, the key its first argument.
    pub fn query_key<T: redis::FromRedisValue>(&self, cmd: &str, key: &str, rest: &[&str]) -> T {
        let mut args = vec![cmd, key];
        args.extend_from_slice(rest);
        self.query(self.master_of(key), &args)
    }

    /// A multiplexed connection to each master, in order.
    pub async fn connections(&self) -> Vec<redis::aio::MultiplexedConnection> {
        let mut connections = Vec::with_capacity(self.count());
        for master in 0..self.count() {
            let client = redis::Client::open(self.url(master)).expect("a bench Redis URL");
            connections.push(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url(master))),
            );
        }
        connections
    }
}

/// The slot ranges of a `CLUSTER SLOTS` answer, each with the index in
/// `ports` of the master serving it.
fn slot_ranges(answer: &redis::Value, ports: &[u16]) -> Vec<(u16, u16, usize)> {
    let redis::Value::Array(ranges) = answer else {
        panic!("CLUSTER SLOTS is not an array: {answer:?}");
    };
    let mut slots = Vec::new();
    for range in ranges {
        let redis::Value::Array(parts) = range else {
            continue;
        };
        let (
            Some(redis::Value::Int(lo)),
            Some(redis::Value::Int(hi)),
            Some(redis::Value::Array(master)),
        ) = (parts.first(), parts.get(1), parts.get(2))
        else {
            continue;
        };
        let Some(redis::Value::Int(port)) = master.get(1) else {
            continue;
        };
        let index = ports
            .iter()
            .position(|p| i64::from(*p) == *port)
            .unwrap_or_else(|| panic!("CLUSTER SLOTS names port {port}, not one started"));
        slots.push((*lo as u16, *hi as u16, index));
    }
    assert!(
        slots
            .iter()
            .map(|(lo, hi, _)| u32::from(hi - lo) + 1)
            .sum::<u32>()
            == 16_384,
        "the Cluster does not serve every slot: {slots:?}"
    );
    slots
}
