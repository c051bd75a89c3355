//! queuegate run in-process on real sockets (`Gate`), the test config and
//! routes it is given, `gated`, a gate with one route in front of an
//! origin, and a gate run from a config file that it reloads (`ConfigDir`,
//! `gate_from_file`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use queuegate::config::*;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::origin::{counting_origin, Origin};
use super::visitor::PublicUrl;

/// A config with one plain listener on 127.0.0.1:0 in front of `upstream`,
/// no routes, and short timeouts fit for tests.
pub fn proxy_config(upstream: &str) -> Config {
    Config {
        listen: vec![Listen {
            addr: "127.0.0.1:0".parse().unwrap(),
            tls: None,
        }],
        admin: None,
        limits: ServerLimits {
            header_timeout: Duration::from_secs(10),
            max_header_bytes: 16384,
            max_connections: 10_000,
            drain_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(30),
            tunnel_idle_timeout: Duration::from_secs(600),
            workers: None,
            ambiguous_paths: AmbiguousPaths::Reject,
            allowed_hosts: vec![],
            max_event_streams: 100_000,
            // Every test visitor comes from 127.0.0.1, as for per-client
            // limits: tests that check this cap set it.
            max_event_streams_per_client: 100_000,
            cache_bytes: 64 << 20,
        },
        client_ip: ClientIp::default(),
        upstream: Upstream {
            url: upstream.parse().unwrap(),
            connect_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(60),
            pool: Pool {
                max_idle_per_host: 256,
                idle_timeout: Duration::from_secs(90),
            },
            host: None,
            origin_reads_forwarded_host: false,
            ca_file: None,
        },
        store: StoreConfig {
            backend: Backend::Memory,
            redis: RedisConfig {
                mode: RedisMode::Standalone {
                    url: "redis://127.0.0.1:6379".into(),
                },
                timeout: Duration::from_millis(200),
            },
            memory: Default::default(),
            expected_instances: 1,
        },
        keys: vec![],
        cookie: CookieConfig::default(),
        reserved_prefix: "/__queuegate".into(),
        bypass: vec![],
        routes: vec![],
    }
}

/// queuegate running in-process on real sockets.
pub struct Gate {
    pub addr: SocketAddr,
    /// The admin listener, when the gate was started with one.
    pub admin: Option<SocketAddr>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Gate {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A URL on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        let admin = self.admin.expect("gate started without an admin listener");
        format!("http://{admin}{path}")
    }

    /// The admin listener's metrics, as text.
    pub async fn metrics(&self) -> String {
        let (parts, body) = super::visitor::get(&self.admin_url("/metrics")).await;
        assert_eq!(parts.status, http::StatusCode::OK);
        String::from_utf8_lossy(&body).into_owned()
    }

    /// Starts the drain without waiting for it.
    pub fn start_drain(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Starts the drain and waits until queuegate has returned.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.start_drain();
        match self.task.take() {
            Some(task) => task.await.unwrap(),
            None => Ok(()),
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl PublicUrl for Gate {
    fn url(&self, path: &str) -> String {
        Gate::url(self, path)
    }
}

/// Runs queuegate with `config` on listeners bound here on 127.0.0.1:0,
/// with a test key ring.
pub async fn spawn_gate(config: Config) -> Gate {
    spawn_gate_with(config, ring("k1")).await
}

/// A test key ring with one key.
pub fn ring(id: &str) -> queuegate::admission::KeyRing {
    queuegate::admission::KeyRing::new(vec![(
        id.to_owned(),
        format!("test key {id} ").repeat(4).into_bytes(),
    )])
    .unwrap()
}

/// A gated route with test-friendly timings.
pub fn route(name: &str, prefix: &str, capacity: u64) -> Route {
    Route {
        name: name.into(),
        matcher: RouteMatch {
            host: None,
            path_prefix: Some(prefix.into()),
            case_insensitive: false,
        },
        capacity,
        adapt: None,
        max_admit_per_tick: 20,
        tick: Duration::from_millis(20),
        session_ttl: Duration::from_secs(600),
        pass_ttl: Duration::from_secs(60),
        arrival_grace: Duration::from_secs(60),
        abandon_after: Duration::from_secs(30),
        max_waiting: 200_000,
        confirm_within: Duration::from_secs(30),
        // Every test visitor comes from 127.0.0.1: crowds in tests would hit
        // the per-client limits, so tests that check them turn them on.
        client_limits: ClientLimits {
            places: 0,
            joins_per_minute: 0,
        },
        waiting_status: http::StatusCode::SERVICE_UNAVAILABLE,
        mode: Mode::Gate,
        on_store_error: OnStoreError::Local,
        exit_paths: Vec::new(),
        max_requests_per_session: None,
        lanes: queuegate::config::Lanes::default(),
        opens_at: None,
        closes_at: None,
        shards: 1,
        max_inflight: None,
        inflight_wait: Duration::from_secs(2),
        page: PageConfig::default(),
        cache: None,
    }
}

/// Runs queuegate with `config` and key ring `ring`.
pub async fn spawn_gate_with(config: Config, ring: queuegate::admission::KeyRing) -> Gate {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listeners = queuegate::Listeners {
        public: vec![listener.into()],
        admin: None,
    };
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(queuegate::run_with(config, ring, listeners, async move {
        let _ = rx.await;
    }));
    Gate {
        addr,
        admin: None,
        shutdown: Some(tx),
        task: Some(task),
    }
}

/// Runs queuegate with `config`, key ring `ring` and `options`, with an
/// admin listener on 127.0.0.1:0 as well.
pub async fn spawn_gate_opts(
    config: Config,
    ring: queuegate::admission::KeyRing,
    options: queuegate::RunOptions,
) -> Gate {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let admin_addr = admin.local_addr().unwrap();
    let listeners = queuegate::Listeners {
        public: vec![listener.into()],
        admin: Some(admin),
    };
    let (tx, rx) = oneshot::channel::<()>();
    let shutdown = async move {
        let _ = rx.await;
    };
    let task = tokio::spawn(queuegate::run_with_options(
        config, ring, listeners, shutdown, options,
    ));
    Gate {
        addr,
        admin: Some(admin_addr),
        shutdown: Some(tx),
        task: Some(task),
    }
}

/// queuegate in front of a counting origin, with the route `tickets` on
/// `/tickets` of `capacity`, which `tune` changes, and the route `other` on
/// `/other` of 100: the gate, the origin and the origin's request count.
pub async fn gated(
    capacity: u64,
    tune: impl FnOnce(&mut Route),
) -> (Gate, Origin, Arc<AtomicUsize>) {
    gated_origin(counting_origin().await, capacity, |config, r| {
        tune(r);
        config.routes.push(route("other", "/other", 100));
    })
    .await
}

/// queuegate in front of `origin`, which counts its requests in `hits`,
/// with the route `tickets` on `/tickets` of `capacity` first; `tune`
/// changes it and the config (and may add routes after it).
pub async fn gated_origin(
    (origin, hits): (Origin, Arc<AtomicUsize>),
    capacity: u64,
    tune: impl FnOnce(&mut Config, &mut Route),
) -> (Gate, Origin, Arc<AtomicUsize>) {
    let mut config = proxy_config(&origin.url());
    let mut r = route("tickets", "/tickets", capacity);
    tune(&mut config, &mut r);
    config.routes.insert(0, r);
    let gate = spawn_gate_with(config, ring("k1")).await;
    (gate, origin, hits)
}

/// The value of `series` (a metric's name and labels, as exported, e.g.
/// `queuegate_requests_total{decision="bad_request"}`) in metrics `text`;
/// 0 when it is absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |n| n.trim().parse().expect("a number"))
}

/// The value of `series` on `gate`'s admin listener (see [`sample`]).
pub async fn admin_sample(gate: &Gate, series: &str) -> f64 {
    sample(&gate.metrics().await, series)
}

/// A temp dir holding a key file and `config.yaml`.
pub struct ConfigDir {
    dir: tempfile::TempDir,
}

impl ConfigDir {
    pub fn new() -> ConfigDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("k1.key"), queuegate::admission::keygen()).unwrap();
        ConfigDir { dir }
    }
    /// The temp dir itself, for other files a test writes there.
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("k1.key")
    }
    pub fn config(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }
    /// Replaces the config as editors do: write a temp file, rename it over.
    pub fn write(&self, text: &str) {
        let tmp = self.dir.path().join(".config.yaml.swp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.config()).unwrap();
    }
}

/// Starts a gate from the file in `dir`, as `queuegate run -c FILE` does.
pub async fn gate_from_file(dir: &ConfigDir, reloads: Option<queuegate::ReloadRequests>) -> Gate {
    let config = Config::load(&dir.config()).unwrap();
    let ring = queuegate::admission::KeyRing::load(&config.keys).unwrap();
    let options = queuegate::RunOptions {
        config_path: Some(dir.config()),
        reloads,
    };
    spawn_gate_opts(config, ring, options).await
}

/// A request to an admin listener at `url` (a route control, `/routes`):
/// `method`, `Authorization: Bearer token` when given, `body` as sent. The
/// status and the answer as JSON (`null` when it is not).
pub async fn admin_call(
    method: http::Method,
    url: &str,
    token: Option<&str>,
    body: &str,
) -> (http::StatusCode, serde_json::Value) {
    let mut req = http::Request::builder().method(method).uri(url);
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let req = req
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_owned(),
        )))
        .unwrap();
    let (parts, bytes) = super::visitor::send(req).await;
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (parts.status, json)
}

/// Route `name` as the admin listener at `routes_url` (`…/routes`) shows it.
pub async fn admin_route(routes_url: &str, name: &str) -> serde_json::Value {
    let (status, json) = admin_call(http::Method::GET, routes_url, None, "").await;
    assert_eq!(status, http::StatusCode::OK, "{json}");
    json["routes"]
        .as_array()
        .and_then(|routes| routes.iter().find(|r| r["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("no route {name} in {json}"))
}
