//! Several `queuegate` processes sharing one Redis line: each an
//! `Instance`, their route `tickets` written as YAML by `RouteYaml`, and
//! `three` (or `fleet`, `start_instances`) to start them.

use std::fmt;

use super::origin::{counting_origin, Origin};
use super::process::Process;
use super::redis::{RedisCluster, RedisServer};
use super::visitor::PublicUrl;

/// The route `tickets` on `/tickets` as the `routes:` section of an
/// instance's config. It has a 50 ms tick and no per-client limits (every
/// test visitor is 127.0.0.1); `with` sets any field, and the fields never
/// set keep queuegate's defaults.
#[derive(Clone, Debug)]
pub struct RouteYaml {
    fields: Vec<(&'static str, String)>,
}

impl RouteYaml {
    /// The route with `capacity` slots.
    pub fn tickets(capacity: impl fmt::Display) -> RouteYaml {
        RouteYaml {
            fields: vec![
                ("capacity", capacity.to_string()),
                ("tick", "50ms".to_owned()),
                (
                    "client_limits",
                    "{ places: 0, joins_per_minute: 0 }".to_owned(),
                ),
            ],
        }
    }

    /// Sets `field` to `value` (a YAML flow value), in place of any value
    /// set before.
    pub fn with(mut self, field: &'static str, value: impl fmt::Display) -> RouteYaml {
        let value = value.to_string();
        match self.fields.iter_mut().find(|(name, _)| *name == field) {
            Some(set) => set.1 = value,
            None => self.fields.push((field, value)),
        }
        self
    }
}

impl fmt::Display for RouteYaml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("routes:\n  - name: tickets\n    match: { path_prefix: /tickets }\n")?;
        for (field, value) in &self.fields {
            writeln!(f, "    {field}: {value}")?;
        }
        Ok(())
    }
}

/// A Redis that instances share.
pub trait SharedRedis {
    /// How an instance's config names it: `store.redis` in YAML flow.
    fn store_yaml(&self) -> String;
}

impl SharedRedis for RedisServer {
    fn store_yaml(&self) -> String {
        standalone(&self.url())
    }
}

impl SharedRedis for RedisCluster {
    fn store_yaml(&self) -> String {
        let nodes: Vec<String> = self.urls().iter().map(|u| format!("\"{u}\"")).collect();
        format!("{{ cluster: [{}], timeout: 2s }}", nodes.join(", "))
    }
}

/// `store.redis` for the standalone server at `url`.
fn standalone(url: &str) -> String {
    format!("{{ url: \"{url}\", timeout: 2s }}")
}

/// Three instances on a new `redis-server` in front of a new counting
/// origin, each configured with `rest` (see [`fleet`]).
pub async fn three(rest: impl fmt::Display) -> (RedisServer, Origin, Vec<Instance>) {
    fleet(RedisServer::start(), rest, 3).await
}

/// `count` instances on `redis` in front of a new counting origin, each
/// configured with `rest` (routes, and any other top-level sections): the
/// Redis, the origin and the instances.
pub async fn fleet<R: SharedRedis>(
    redis: R,
    rest: impl fmt::Display,
    count: usize,
) -> (R, Origin, Vec<Instance>) {
    let (origin, _hits) = counting_origin().await;
    let instances = start_instances(&redis, &origin, rest, count).await;
    (redis, origin, instances)
}

/// `count` instances on `redis` in front of `origin`, each configured with
/// `rest`, started together.
pub async fn start_instances(
    redis: &impl SharedRedis,
    origin: &Origin,
    rest: impl fmt::Display,
    count: usize,
) -> Vec<Instance> {
    let (redis, origin, rest) = (redis.store_yaml(), origin.url(), rest.to_string());
    futures_util::future::join_all((0..count).map(|_| Instance::start_on(&redis, &origin, &rest)))
        .await
}

/// The admin token every instance of a fleet shares (`admin.token`, named
/// `admin`).
pub const ADMIN_TOKEN: &str = "the admin token of every instance";

/// One `queuegate run` child process sharing a Redis line with others (or
/// alone on the memory store): its listeners on ports it picks, an admin
/// listener with [`ADMIN_TOKEN`], the key ring `k1` that every instance
/// shares, and `rest` (routes, and any other top-level sections) after
/// that. Killed on drop.
pub struct Instance {
    pub process: Process,
    config: tempfile::NamedTempFile,
    /// The config before `rest`.
    head: String,
}

impl Instance {
    pub async fn start(redis_url: &str, origin: &str, rest: &str) -> Instance {
        Instance::start_on(&standalone(redis_url), origin, rest).await
    }

    /// As `start`, on the Redis `store.redis` describes (YAML flow, e.g.
    /// `{ cluster: [...], timeout: 2s }`).
    pub async fn start_on(redis: &str, origin: &str, rest: &str) -> Instance {
        let store = format!("store: {{ backend: redis, redis: {redis} }}\n");
        Instance::start_with(&store, origin, rest).await
    }

    /// One instance alone, on the memory store.
    pub async fn start_memory(origin: &str, rest: &str) -> Instance {
        Instance::start_with("", origin, rest).await
    }

    /// `store` (a `store:` line, or nothing for the memory store), then
    /// `rest`.
    async fn start_with(store: &str, origin: &str, rest: &str) -> Instance {
        let config = tempfile::NamedTempFile::new().unwrap();
        let head = format!(
            "listen: [{{ addr: \"127.0.0.1:0\" }}]\n\
             admin: {{ addr: \"127.0.0.1:0\", token: {{ env: QG_SHARED_ADMIN_TOKEN }} }}\n\
             upstream: {{ url: \"{origin}\" }}\n\
             {store}\
             keys: [{{ id: k1, env: QG_SHARED_KEY }}]\n"
        );
        std::fs::write(config.path(), format!("{head}{rest}")).unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_queuegate"));
        cmd.args(["run", "-c"])
            .arg(config.path())
            .env(
                "QG_SHARED_KEY",
                "c2hhcmVkIGtleSBmb3IgdGhyZWUgaW5zdGFuY2VzIG9mIHF1ZXVlZ2F0ZQ",
            )
            .env("QG_SHARED_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("QUEUEGATE_LOG", "warn,queuegate=info")
            .stdout(std::process::Stdio::null());
        Instance {
            process: Process::start(cmd, true).await,
            config,
            head,
        }
    }

    /// Writes `rest` in place of the config's routes (and other sections
    /// after the key ring); the instance sees the file change and reloads.
    pub fn rewrite(&self, rest: impl fmt::Display) {
        let text = format!("{}{rest}", self.head);
        let next = self.config.path().with_extension("next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, self.config.path()).unwrap();
    }

    pub fn url(&self, path: &str) -> String {
        self.process.url(path)
    }
}

impl PublicUrl for Instance {
    fn url(&self, path: &str) -> String {
        Instance::url(self, path)
    }
}
