//! The processes a load run needs, each on a free loopback port and stopped
//! by PID when dropped (also on panic): `redis-server` with persistence off,
//! queuegate binaries started from a generated config, and an in-process
//! origin that counts the requests it serves.
#![allow(dead_code)]

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

/// The queuegate binary this target was built with (release under `cargo bench`).
pub const QUEUEGATE: &str = env!("CARGO_BIN_EXE_queuegate");

/// How long a started process may take to accept connections.
const START_DEADLINE: Duration = Duration::from_secs(20);

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    for _ in 0..100 {
        if let Ok(port) = StdListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
            return port.port();
        }
    }
    panic!("no free loopback port");
}

/// Polls until `port` accepts a connection, or the child has exited.
fn wait_for_port(child: &mut Child, port: u16, what: &str, log: Option<&Path>) {
    let start = Instant::now();
    loop {
        if StdStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = log
                .and_then(|p| std::fs::read_to_string(p).ok())
                .unwrap_or_default();
            panic!("{what} exited with {status} before listening on {port}\n{log}");
        }
        if start.elapsed() > START_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not listen on {port} within {START_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Resident memory of a process in kB, from `/proc/<pid>/status`.
pub fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Open file descriptors of a process.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// One `redis-server`, persistence off, in its own temp dir.
pub struct RedisServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir for redis-server");
        let port = free_port();
        let mut child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--protected-mode", "no", "--maxclients", "20000"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): `apt-get install redis-server`")
            });
        wait_for_port(&mut child, port, "redis-server", None);
        let server = RedisServer {
            child,
            port,
            _dir: dir,
        };
        // Listening is not answering: wait for PING (it loads nothing, so fast).
        let start = Instant::now();
        while server.try_query::<String>(&["PING"]).is_err() {
            assert!(
                start.elapsed() < START_DEADLINE,
                "redis-server never answered PING"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("connect to the bench redis-server")
    }

    pub fn try_query<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let client = redis::Client::open(self.url())?;
        let mut con = client.get_connection_with_timeout(Duration::from_secs(2))?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut con)
    }

    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.try_query(args)
            .unwrap_or_else(|e| panic!("redis {args:?}: {e}"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Which store the queuegate instances share.
#[derive(Clone, Debug)]
pub enum StoreSpec {
    Memory,
    Redis {
        url: String,
    },
    /// A Redis Cluster, by the URLs of its masters.
    Cluster {
        nodes: Vec<String>,
    },
}

/// The one gated route the instances serve, and the server limits.
#[derive(Clone, Debug)]
pub struct GateSpec {
    pub route: String,
    pub path: String,
    pub capacity: u64,
    pub max_admit_per_tick: u64,
    pub tick: Duration,
    pub pass_ttl: Duration,
    pub session_ttl: Duration,
    pub arrival_grace: Duration,
    pub abandon_after: Duration,
    pub max_waiting: u64,
    pub max_connections: u64,
    pub header_timeout: Duration,
    pub store: StoreSpec,
    pub instances_expected: u64,
    /// `max_requests_per_session`, when set.
    pub max_requests_per_session: Option<u64>,
    /// The sub-lines the route's line is split into (1: one line).
    pub shards: u32,
    /// A capacity that adapts (DESIGN §9.1); `capacity` is then its start.
    pub adapt: Option<AdaptSpec>,
    /// The route's `exit_paths`.
    pub exit_paths: Vec<String>,
}

/// The range an adaptive capacity moves in, its target and its window.
#[derive(Clone, Debug)]
pub struct AdaptSpec {
    pub min: u64,
    pub max: u64,
    pub target_p95: Duration,
    /// The error share's target in percent.
    pub target_errors_pct: f64,
    pub every: Duration,
}

impl GateSpec {
    /// A route that fills fast and moves fast, for short runs.
    pub fn quick(route: &str, path: &str, capacity: u64) -> GateSpec {
        GateSpec {
            route: route.to_owned(),
            path: path.to_owned(),
            capacity,
            max_admit_per_tick: capacity.max(1),
            tick: Duration::from_millis(50),
            pass_ttl: Duration::from_secs(2),
            session_ttl: Duration::from_secs(2),
            arrival_grace: Duration::from_secs(2),
            abandon_after: Duration::from_millis(1500),
            max_waiting: 1_000_000,
            max_connections: 10_000,
            header_timeout: Duration::from_secs(10),
            store: StoreSpec::Memory,
            instances_expected: 1,
            max_requests_per_session: None,
            shards: 1,
            adapt: None,
            exit_paths: Vec::new(),
        }
    }

    /// The YAML for one instance listening on `port` (its admin listener on
    /// `admin_port`), forwarding to `origin`. A store error closes the route
    /// (`on_store_error: closed`) so that it shows up as an error in the run
    /// instead of a local admission.
    pub fn yaml(&self, port: u16, admin_port: u16, origin: &str) -> String {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let mut y = String::new();
        let _ = writeln!(y, "listen: [{{ addr: \"127.0.0.1:{port}\" }}]");
        let _ = writeln!(y, "admin: {{ addr: \"127.0.0.1:{admin_port}\" }}");
        // The whole crowd comes from 127.0.0.1: as many event streams from
        // it as connections.
        let _ = writeln!(
            y,
            "limits: {{ max_connections: {0}, max_event_streams_per_client: {0}, header_timeout: {1} }}",
            self.max_connections,
            ms(self.header_timeout)
        );
        let _ = writeln!(
            y,
            "upstream: {{ url: \"{origin}\", pool: {{ max_idle_per_host: 256 }} }}"
        );
        match &self.store {
            StoreSpec::Memory => {
                let _ = writeln!(y, "store: {{ backend: memory }}");
            }
            StoreSpec::Redis { url } => {
                let _ = writeln!(
                    y,
                    "store: {{ backend: redis, redis: {{ url: \"{url}\", timeout: 2s }}, \
                     expected_instances: {} }}",
                    self.instances_expected
                );
            }
            StoreSpec::Cluster { nodes } => {
                let nodes: Vec<String> = nodes.iter().map(|n| format!("\"{n}\"")).collect();
                let _ = writeln!(
                    y,
                    "store: {{ backend: redis, redis: {{ cluster: [{}], timeout: 2s }}, \
                     expected_instances: {} }}",
                    nodes.join(", "),
                    self.instances_expected
                );
            }
        }
        let _ = writeln!(y, "keys: [{{ id: k1, env: QG_BENCH_KEY }}]");
        let _ = writeln!(y, "routes:");
        let _ = writeln!(y, "  - name: {}", self.route);
        let _ = writeln!(y, "    match: {{ path_prefix: {} }}", self.path);
        match &self.adapt {
            None => {
                let _ = writeln!(y, "    capacity: {}", self.capacity);
            }
            Some(a) => {
                let _ = writeln!(
                    y,
                    "    capacity: {{ min: {}, max: {}, start: {}, \
                     target: {{ p95: {}, errors: {}% }} }}",
                    a.min,
                    a.max,
                    self.capacity,
                    ms(a.target_p95),
                    a.target_errors_pct
                );
                let _ = writeln!(y, "    adapt_every: {}", ms(a.every));
            }
        }
        if !self.exit_paths.is_empty() {
            let _ = writeln!(y, "    exit_paths: [{}]", self.exit_paths.join(", "));
        }
        let _ = writeln!(y, "    max_admit_per_tick: {}", self.max_admit_per_tick);
        let _ = writeln!(y, "    tick: {}", ms(self.tick));
        let _ = writeln!(y, "    pass_ttl: {}", ms(self.pass_ttl));
        let _ = writeln!(y, "    session_ttl: {}", ms(self.session_ttl));
        let _ = writeln!(y, "    arrival_grace: {}", ms(self.arrival_grace));
        let _ = writeln!(y, "    abandon_after: {}", ms(self.abandon_after));
        let _ = writeln!(y, "    max_waiting: {}", self.max_waiting);
        let _ = writeln!(y, "    on_store_error: closed");
        if let Some(n) = self.max_requests_per_session {
            let _ = writeln!(y, "    max_requests_per_session: {n}");
        }
        if self.shards != 1 {
            let _ = writeln!(y, "    shards: {}", self.shards);
        }
        // Every simulated visitor comes from 127.0.0.1: one client as far as
        // the per-client limits go, so they are off here.
        let _ = writeln!(y, "    client_limits: {{ places: 0, joins_per_minute: 0 }}");
        y
    }
}

/// One queuegate process.
pub struct Queuegate {
    child: Child,
    port: u16,
    admin_port: u16,
    dir: tempfile::TempDir,
}

impl Queuegate {
    /// Starts `queuegate run -c <config>` and waits until it listens. Every
    /// instance of a run gets the same `key` so passes verify on any of them.
    /// The open-files limit is raised to the hard limit through the shell.
    pub fn start(spec: &GateSpec, origin: &str, key: &str) -> Queuegate {
        let dir = tempfile::tempdir().expect("temp dir for queuegate");
        let (port, admin_port) = (free_port(), free_port());
        let config = dir.path().join("queuegate.yaml");
        std::fs::write(&config, spec.yaml(port, admin_port, origin)).expect("write the config");
        let log_path = dir.path().join("queuegate.log");
        let log = std::fs::File::create(&log_path).expect("create the log file");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg("ulimit -n \"$(ulimit -Hn)\"; exec \"$0\" run -c \"$1\"")
            .arg(QUEUEGATE)
            .arg(&config)
            .env("QG_BENCH_KEY", key)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {QUEUEGATE}: {e}"));
        wait_for_port(&mut child, port, "queuegate", Some(&log_path));
        Queuegate {
            child,
            port,
            admin_port,
            dir,
        }
    }

    /// Its Prometheus metrics, read from the admin listener.
    pub fn metrics(&self) -> String {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.admin_port))
            .expect("the admin listener answers");
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
            .expect("write the request");
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        text
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its admin listener's base URL.
    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin_port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("queuegate.log")
    }

    /// The last lines of its log, for a failure message.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Queuegate {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// A key for one run's instances.
pub fn run_key() -> String {
    queuegate::admission::keygen()
}

/// The origin: answers every request `200 ok` and counts them.
pub struct Origin {
    addr: SocketAddr,
    pub hits: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Origin {
    pub async fn start() -> Origin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the origin");
        let addr = listener.local_addr().expect("origin address");
        let hits = Arc::new(AtomicU64::new(0));
        let counted = hits.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let hits = counted.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |_req| {
                        hits.fetch_add(1, Ordering::Relaxed);
                        async {
                            Ok::<_, Infallible>(hyper::Response::new(Full::new(
                                Bytes::from_static(b"ok\n"),
                            )))
                        }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Origin { addr, hits, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}
