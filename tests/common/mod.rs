//! The integration-test harness: origins on ephemeral ports, queuegate run
//! in-process on real sockets or as a child process on ports it binds itself,
//! and small clients.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use queuegate::config::*;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub type OriginBody = BoxBody<Bytes, Infallible>;

/// A test origin: its address, how many connections it accepted, and the
/// task serving it (aborted on drop).
pub struct Origin {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Origin {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn accepted(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A whole body for an origin's response.
pub fn full(bytes: impl Into<Bytes>) -> OriginBody {
    Full::new(bytes.into()).boxed()
}

/// Starts an HTTP origin whose every request is answered by `handler`.
pub async fn spawn_origin<F, Fut>(handler: F) -> Origin
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<OriginBody>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let fut = handler(req);
                    async move { Ok::<_, Infallible>(fut.await) }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Origin {
        addr,
        connections,
        task,
    }
}

/// A raw-byte origin: `handler` gets each accepted socket as it is.
pub async fn spawn_raw_origin<F, Fut>(handler: F) -> Origin
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(handler(stream));
        }
    });
    Origin {
        addr,
        connections,
        task,
    }
}

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

/// Runs queuegate with `config` on listeners bound here on 127.0.0.1:0,
/// with a test key ring.
pub async fn spawn_gate(config: Config) -> Gate {
    spawn_gate_with(config, ring("k1")).await
}

/// A plain HTTP client with a body type that can stream.
pub fn client<B>() -> Client<HttpConnector, B>
where
    B: http_body::Body + Send + 'static + Unpin,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends `req` with a whole body and reads the whole answer.
pub async fn send(req: Request<Full<Bytes>>) -> (http::response::Parts, Bytes) {
    let resp = client::<Full<Bytes>>().request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts, bytes)
}

/// `GET url` with no extra headers.
pub async fn get(url: &str) -> (http::response::Parts, Bytes) {
    send(Request::get(url).body(Full::new(Bytes::new())).unwrap()).await
}

/// Waits for `cond` to hold, checking every 10 ms, failing after 10 s.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
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
        lanes: vec![queuegate::config::Lane::main()],
        opens_at: None,
        closes_at: None,
        shards: 1,
        page: PageConfig::default(),
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

/// An origin that answers 200 with the path, counting requests.
pub async fn counting_origin() -> (Origin, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let origin = spawn_origin(move |req: Request<Incoming>| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            let cookies = req
                .headers()
                .get_all("cookie")
                .iter()
                .map(|v| v.to_str().unwrap_or("").to_owned())
                .collect::<Vec<_>>()
                .join("; ");
            let mut resp = Response::new(full(format!("origin {}", req.uri())));
            resp.headers_mut().insert(
                "x-origin-cookies",
                cookies
                    .parse()
                    .unwrap_or(http::HeaderValue::from_static("")),
            );
            resp
        }
    })
    .await;
    (origin, hits)
}

/// One browser (or app): a cookie jar, no redirects followed.
#[derive(Clone, Default)]
pub struct Visitor {
    pub jar: std::collections::BTreeMap<String, String>,
}

/// What a visitor got back.
#[derive(Debug)]
pub struct Answer {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// Whether the origin answered (not queuegate).
    pub fn reached_origin(&self) -> bool {
        self.headers.get("x-queuegate").is_none() && self.status == http::StatusCode::OK
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
    pub fn location(&self) -> Option<&str> {
        self.headers.get("location").and_then(|v| v.to_str().ok())
    }
}

impl Visitor {
    pub fn new() -> Visitor {
        Visitor::default()
    }

    fn cookie_header(&self) -> Option<String> {
        if self.jar.is_empty() {
            return None;
        }
        Some(
            self.jar
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("; "),
        )
    }

    /// Sends a request built by `build` with the jar's cookies; keeps cookies set.
    pub async fn request(&mut self, mut req: Request<Full<Bytes>>) -> Answer {
        if let Some(c) = self.cookie_header() {
            req.headers_mut().insert("cookie", c.parse().unwrap());
        }
        let resp = client::<Full<Bytes>>().request(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        self.store_cookies(&parts.headers);
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub fn store_cookies(&mut self, headers: &http::HeaderMap) {
        for set in headers.get_all("set-cookie") {
            let text = set.to_str().unwrap();
            let first = text.split(';').next().unwrap();
            let (name, value) = first.split_once('=').unwrap();
            let removed = text.contains("Max-Age=0");
            if removed || value.is_empty() {
                self.jar.remove(name);
            } else {
                self.jar.insert(name.to_owned(), value.to_owned());
            }
        }
    }

    /// A browser navigation to `url`.
    pub async fn navigate(&mut self, url: &str) -> Answer {
        let req = Request::get(url)
            .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
            .header("sec-fetch-mode", "navigate")
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.request(req).await
    }

    /// An XHR/fetch call to `url`.
    pub async fn fetch(&mut self, url: &str) -> Answer {
        let req = Request::get(url)
            .header("accept", "application/json")
            .header("sec-fetch-mode", "cors")
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.request(req).await
    }

    /// A POST with a body.
    pub async fn post(&mut self, url: &str, body: &str) -> Answer {
        let req = Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        self.request(req).await
    }

    /// Polls the status endpoint of `route` on `gate`.
    pub async fn status(&mut self, gate: &Gate, route: &str) -> serde_json::Value {
        let answer = self
            .fetch(&gate.url(&format!("/__queuegate/status?route={route}")))
            .await;
        assert_eq!(answer.status, http::StatusCode::OK);
        answer.json()
    }

    /// Leaves `route`.
    pub async fn leave(&mut self, gate: &Gate, route: &str) -> Answer {
        self.post(&gate.url(&format!("/__queuegate/leave?route={route}")), "")
            .await
    }

    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.jar.get(name).map(String::as_str)
    }
}

/// One client connection kept open, its requests written by hand, so that
/// every request goes over the same socket (a pooled client may open others).
pub struct KeepAlive {
    stream: tokio::net::TcpStream,
    pending: Vec<u8>,
}

impl KeepAlive {
    pub async fn connect(addr: SocketAddr) -> KeepAlive {
        KeepAlive {
            stream: tokio::net::TcpStream::connect(addr).await.unwrap(),
            pending: Vec::new(),
        }
    }

    /// `GET path` with `cookie` as the `Cookie` header (none when empty):
    /// the status and the head as sent (hyper sends lower-case names). The
    /// answer must keep the connection open and carry a Content-Length.
    pub async fn get(&mut self, path: &str, cookie: &str) -> (http::StatusCode, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let cookie = if cookie.is_empty() {
            String::new()
        } else {
            format!("Cookie: {cookie}\r\n")
        };
        let req = format!("GET {path} HTTP/1.1\r\nHost: keepalive.test\r\n{cookie}\r\n");
        self.stream.write_all(req.as_bytes()).await.unwrap();
        loop {
            if let Some(end) = self.pending.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.pending[..end]).into_owned();
                let length: usize = head
                    .to_ascii_lowercase()
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().unwrap())
                    .unwrap_or_else(|| panic!("no content-length: {head}"));
                if self.pending.len() >= end + 4 + length {
                    self.pending.drain(..end + 4 + length);
                    assert!(!head.contains("connection: close"), "closed: {head}");
                    let status = head[9..12].parse::<u16>().unwrap();
                    return (http::StatusCode::from_u16(status).unwrap(), head);
                }
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the connection closed before the answer");
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }
}

/// The `queuegate` binary as a child process. Its config listens on
/// `127.0.0.1:0`: the child binds its own ports and names them in its
/// start-up log, where they are read, so no port is picked here and then
/// raced for by another test before the child binds it. Everything the child
/// writes to stderr is kept; it is killed on drop.
pub struct Process {
    child: std::process::Child,
    /// The public listener.
    pub addr: SocketAddr,
    /// The admin listener, when the config has one.
    pub admin: Option<SocketAddr>,
    log: Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Process {
    /// Spawns `cmd` (a `queuegate run` whose listeners are on port 0),
    /// taking over its stderr, and waits until it has logged its public
    /// listener and, with `admin`, its admin listener. Logs at `info` unless
    /// `cmd` sets `QUEUEGATE_LOG`.
    pub async fn start(mut cmd: std::process::Command, admin: bool) -> Process {
        use std::io::BufRead;
        if !cmd.get_envs().any(|(name, _)| name == "QUEUEGATE_LOG") {
            cmd.env("QUEUEGATE_LOG", "info");
        }
        let mut child = cmd
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the queuegate binary starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(std::sync::Mutex::new(String::new()));
        let sink = log.clone();
        // Drains the pipe as the child writes, so it never blocks on a full one.
        let reader = std::thread::spawn(move || {
            let mut stderr = std::io::BufReader::new(stderr);
            let mut line = Vec::new();
            while stderr.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&line));
                line.clear();
            }
        });
        let mut process = Process {
            child,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            admin: None,
            log,
            reader: Some(reader),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (public, admin_addr) = listening(&process.log());
            if let Some(public) = public.filter(|_| admin_addr.is_some() || !admin) {
                process.addr = public;
                process.admin = admin_addr;
                return process;
            }
            if let Ok(Some(status)) = process.child.try_wait() {
                let (_, log) = process.wait();
                panic!("queuegate exited ({status}) before it was listening:\n{log}");
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "queuegate did not log its listeners within 20 s:\n{}",
                    process.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A URL on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        let admin = self
            .admin
            .expect("queuegate runs without an admin listener");
        format!("http://{admin}{path}")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends signal `name` (`TERM`, `HUP`) to the child.
    pub fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("the `kill` command runs");
        assert!(status.success(), "kill -{name} failed");
    }

    /// What the child has written to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the child's log contains `needle`, failing after 20 s.
    pub async fn wait_for_log(&self, what: &str, needle: &str) {
        for _ in 0..1000 {
            if self.log.lock().unwrap().contains(needle) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("timed out waiting until {what}:\n{}", self.log());
    }

    /// Waits (blocking) for the child to exit: its exit status and
    /// everything it wrote to stderr.
    pub fn wait(&mut self) -> (std::process::ExitStatus, String) {
        let status = self.child.wait().expect("wait for queuegate");
        if let Some(reader) = self.reader.take() {
            reader.join().expect("the log reader does not panic");
        }
        (status, self.log())
    }

    /// SIGTERM, then the exit code and everything written to stderr.
    pub fn stop(mut self) -> (i32, String) {
        self.signal("TERM");
        let (status, log) = self.wait();
        (status.code().unwrap_or(-1), log)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// The public and admin addresses named by the `listening` lines of a
/// queuegate start-up log, in the text or the JSON format.
fn listening(log: &str) -> (Option<SocketAddr>, Option<SocketAddr>) {
    let (mut public, mut admin) = (None, None);
    for line in log.lines() {
        let line = without_ansi(line);
        let (message, addr) = match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(entry) => (
                entry["message"].as_str().unwrap_or_default().to_owned(),
                entry["addr"].as_str().and_then(|a| a.parse().ok()),
            ),
            // `<time>  INFO queuegate: listening addr=127.0.0.1:4000 tls=false`
            Err(_) => {
                let Some((_, event)) = line.split_once(" queuegate: ") else {
                    continue;
                };
                let Some((message, fields)) = event.split_once(" addr=") else {
                    continue;
                };
                let addr = fields.split(' ').next().and_then(|a| a.parse().ok());
                (message.to_owned(), addr)
            }
        };
        if message == "listening" {
            public = public.or(addr);
        } else if message.starts_with("admin listening") {
            admin = admin.or(addr);
        }
    }
    (public, admin)
}

/// `line` without its terminal colour codes.
fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // An escape sequence runs up to its final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// One `queuegate run` child process sharing a Redis line with others: its
/// listeners on ports it picks, an admin listener, the key ring `k1` that
/// every instance shares, and `rest` (routes, and any other top-level
/// sections) after that. Killed on drop.
pub struct Instance {
    pub process: Process,
    _config: tempfile::NamedTempFile,
}

impl Instance {
    pub async fn start(redis_url: &str, origin: &str, rest: &str) -> Instance {
        Instance::start_on(
            &format!("{{ url: \"{redis_url}\", timeout: 2s }}"),
            origin,
            rest,
        )
        .await
    }

    /// As `start`, on the Redis `store.redis` describes (YAML flow, e.g.
    /// `{ cluster: [...], timeout: 2s }`).
    pub async fn start_on(redis: &str, origin: &str, rest: &str) -> Instance {
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            config.path(),
            format!(
                "listen: [{{ addr: \"127.0.0.1:0\" }}]\n\
                 admin: {{ addr: \"127.0.0.1:0\" }}\n\
                 upstream: {{ url: \"{origin}\" }}\n\
                 store: {{ backend: redis, redis: {redis} }}\n\
                 keys: [{{ id: k1, env: QG_SHARED_KEY }}]\n\
                 {rest}"
            ),
        )
        .unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_queuegate"));
        cmd.args(["run", "-c"])
            .arg(config.path())
            .env(
                "QG_SHARED_KEY",
                "c2hhcmVkIGtleSBmb3IgdGhyZWUgaW5zdGFuY2VzIG9mIHF1ZXVlZ2F0ZQ",
            )
            .env("QUEUEGATE_LOG", "warn,queuegate=info")
            .stdout(std::process::Stdio::null());
        Instance {
            process: Process::start(cmd, true).await,
            _config: config,
        }
    }

    pub fn url(&self, path: &str) -> String {
        self.process.url(path)
    }
}
