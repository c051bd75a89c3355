//! Event streams against polling (DESIGN §8.8), one queuegate instance on
//! Redis: N waiters (default 10,000) hold `GET /__queuegate/events` open,
//! then, on a fresh instance and Redis, the same N waiters poll
//! `/__queuegate/status` as the page does. For each crowd: queuegate's
//! resident memory before and after the crowd is in place, each waiter on
//! a connection of its own (per waiter: a stream and its connection, or a
//! polling keep-alive connection, parked between polls), its
//! CPU time over the measured window per update it sent (event or poll
//! answer), and the delay from each admission in the store (seen by a
//! watcher reading the route's `active` set every 5 ms) to the client
//! reading `admitted` (p50/p99).
//!
//! Run: `cargo bench --bench events` (flags `--waiters N`, `--seconds S`
//! for the measured window of each crowd, default 30). This process needs
//! N + a few hundred open files (`ulimit -n`).

#[path = "crowd/fleet.rs"]
mod fleet;
#[path = "crowd/sim.rs"]
mod sim;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use fleet::{GateSpec, Origin, Queuegate, RedisServer, StoreSpec};
use sim::Flags;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ROUTE: &str = "bench";
/// Slots: admissions flow as admitted waiters fail to show up (streams) or
/// their sessions expire (polls), both after 4 s: about 5 a second.
const CAPACITY: u64 = 20;
/// Clients set up at the same time.
const OPENING: usize = 200;

fn main() {
    let flags = Flags::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(bench(&flags));
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Crowd {
    Streams,
    Polls,
}

/// What one crowd's run measured.
struct Measured {
    crowd: Crowd,
    waiters: usize,
    rss_before_kb: u64,
    rss_after_kb: u64,
    cpu_s: f64,
    updates: u64,
    /// Store admission to `admitted` at the client, ms, sorted.
    delays_ms: Vec<f64>,
    errors: u64,
}

async fn bench(flags: &Flags) {
    let waiters: usize = flags.parse("waiters", 10_000);
    let seconds: u64 = flags.parse("seconds", 30);
    let origin = Origin::start().await;
    let mut results = Vec::new();
    for crowd in [Crowd::Streams, Crowd::Polls] {
        results.push(run(crowd, waiters, Duration::from_secs(seconds), &origin).await);
    }
    println!("event streams against polling, one queuegate instance on Redis");
    println!("  waiters {waiters}, measured window {seconds} s each, capacity {CAPACITY}");
    for m in &results {
        let per_waiter = m.rss_after_kb.saturating_sub(m.rss_before_kb) as f64 / m.waiters as f64;
        println!("  {:?}", m.crowd);
        println!(
            "    RSS before / after        {:.1} MB / {:.1} MB ({:.2} kB per waiter)",
            m.rss_before_kb as f64 / 1024.0,
            m.rss_after_kb as f64 / 1024.0,
            per_waiter
        );
        println!(
            "    CPU in window             {:.2} s for {} updates ({:.1} µs per update; {:.1} % of a core)",
            m.cpu_s,
            m.updates,
            m.cpu_s * 1e6 / m.updates.max(1) as f64,
            m.cpu_s * 100.0 / seconds as f64
        );
        println!(
            "    admitted, delay p50 / p99 {:.0} ms / {:.0} ms over {} admissions",
            percentile(&m.delays_ms, 0.50),
            percentile(&m.delays_ms, 0.99),
            m.delays_ms.len()
        );
        println!("    client errors             {}", m.errors);
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// User plus system CPU seconds of a process so far.
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which ends with the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    (ticks(11) + ticks(12)) as f64 / 100.0
}

async fn run(crowd: Crowd, waiters: usize, window: Duration, origin: &Origin) -> Measured {
    let redis = RedisServer::start();
    let mut spec = GateSpec::quick(ROUTE, "/bench", CAPACITY);
    spec.max_admit_per_tick = 5;
    spec.tick = Duration::from_millis(100);
    spec.arrival_grace = Duration::from_secs(4);
    spec.session_ttl = Duration::from_secs(4);
    spec.pass_ttl = Duration::from_secs(4);
    spec.abandon_after = Duration::from_secs(30);
    spec.max_connections = waiters as u64 + 1_000;
    spec.header_timeout = Duration::from_secs(300);
    spec.store = StoreSpec::Redis { url: redis.url() };
    let gate = Queuegate::start(&spec, &origin.url(), &fleet::run_key());
    let port = gate.port();
    let pid = gate.pid();

    // The slots are taken first, and held (a request a second keeps a
    // session); their holders leave when the window opens.
    let holding = Arc::new(AtomicBool::new(true));
    let mut holders = Vec::new();
    for _ in 0..CAPACITY {
        let c = hold(port).await.expect("a holder gets in");
        let holding = holding.clone();
        holders.push(tokio::spawn(async move {
            let mut c = c;
            while holding.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let _ = c.get("/bench/x").await;
            }
            c
        }));
    }
    // The line: each joins and polls once (which confirms its ticket), then
    // closes its connection; the crowd comes back on new ones.
    let mut line = Vec::with_capacity(waiters);
    let mut errors = 0u64;
    while line.len() + (errors as usize) < waiters {
        let batch = OPENING.min(waiters - line.len() - errors as usize);
        let joined = futures_util::future::join_all((0..batch).map(|_| join(port))).await;
        for j in joined {
            match j {
                Ok(c) => line.push(c),
                Err(_) => errors += 1,
            }
        }
    }
    // The joins' connections are gone; what they left is freed.
    tokio::time::sleep(queuegate::connection::PARK_AFTER * 2 + Duration::from_secs(1)).await;
    let rss_before_kb = fleet::rss_kb(pid);

    let seen = Arc::new(Mutex::new(HashMap::<[u8; 12], Instant>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_admissions(redis.url(), seen.clone(), stop.clone());
    let updates = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(line.len());
    let ready = Arc::new(AtomicU64::new(0));
    for cookie in line {
        let (updates, failures, stop, ready) = (
            updates.clone(),
            failures.clone(),
            stop.clone(),
            ready.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let Ok(mut c) = Client::connect(port).await else {
                failures.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            c.cookie = Some(cookie);
            let id = c.store_id();
            let admitted = match crowd {
                Crowd::Streams => c.stream(&updates, &stop, &ready).await,
                Crowd::Polls => c.poll(&updates, &stop, &ready).await,
            };
            match admitted {
                Ok(at) => at.map(|at| (id, at)),
                Err(_) => {
                    failures.fetch_add(1, Ordering::Relaxed);
                    None
                }
            }
        }));
    }
    while (ready.load(Ordering::Relaxed) as usize) + (failures.load(Ordering::Relaxed) as usize)
        < tasks.len()
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Polling connections park between polls, as they would between a
    // browser's.
    tokio::time::sleep(queuegate::connection::PARK_AFTER * 2 + Duration::from_secs(1)).await;
    let rss_after_kb = fleet::rss_kb(pid);

    // The window: admissions begin as the holders leave.
    let updates_before = updates.load(Ordering::Relaxed);
    let cpu_before = cpu_s(pid);
    holding.store(false, Ordering::Relaxed);
    for h in holders {
        if let Ok(mut c) = h.await {
            let _ = c.post("/__queuegate/leave?route=bench").await;
        }
    }
    tokio::time::sleep(window).await;
    let cpu = cpu_s(pid) - cpu_before;
    let sent = updates.load(Ordering::Relaxed) - updates_before;
    stop.store(true, Ordering::Relaxed);
    let mut admitted = Vec::new();
    for t in tasks {
        if let Ok(Some(a)) = t.await {
            admitted.push(a);
        }
    }
    let _ = watcher.await;
    let seen = seen.lock().unwrap();
    let mut delays_ms: Vec<f64> = admitted
        .iter()
        .filter_map(|(id, at)| {
            let in_store = seen.get(id)?;
            Some(at.saturating_duration_since(*in_store).as_secs_f64() * 1000.0)
        })
        .collect();
    delays_ms.sort_by(f64::total_cmp);
    drop(gate);
    Measured {
        crowd,
        waiters,
        rss_before_kb,
        rss_after_kb,
        cpu_s: cpu,
        updates: sent,
        delays_ms,
        errors: errors + failures.load(Ordering::Relaxed),
    }
}

/// Records when each id first appears in the route's `active` set.
fn watch_admissions(
    url: String,
    seen: Arc<Mutex<HashMap<[u8; 12], Instant>>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || {
        let client = redis::Client::open(url).expect("a redis url");
        let mut con = client.get_connection().expect("the watcher connects");
        let key = format!("qg:{{{ROUTE}}}:active");
        while !stop.load(Ordering::Relaxed) {
            let members: Vec<Vec<u8>> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query(&mut con)
                .unwrap_or_default();
            let now = Instant::now();
            let mut seen = seen.lock().unwrap();
            for m in members {
                if let Ok(id) = <[u8; 12]>::try_from(m.as_slice()) {
                    seen.entry(id).or_insert(now);
                }
            }
            drop(seen);
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

/// A visitor who got in: at once, or through the line.
async fn hold(port: u16) -> std::io::Result<Client> {
    let mut c = Client::connect(port).await?;
    let mut r = c.get("/bench/x").await?;
    while r.status != 200 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        r = c.get("/__queuegate/status?route=bench").await?;
        if r.status == 200 && r.body.windows(10).any(|w| w == b"\"admitted\"") {
            r = c.get("/bench/x").await?;
        }
    }
    Ok(c)
}

/// A waiter who joined and polled once: its ticket.
async fn join(port: u16) -> std::io::Result<String> {
    let mut c = Client::connect(port).await?;
    let r = c.get("/bench/x").await?;
    if r.status != 503 {
        return Err(std::io::Error::other(format!(
            "joining answered {}",
            r.status
        )));
    }
    let r = c.get("/__queuegate/status?route=bench").await?;
    if r.status != 200 || !r.body.windows(9).any(|w| w == b"\"waiting\"") {
        return Err(std::io::Error::other("the first poll did not say waiting"));
    }
    c.cookie.ok_or_else(|| std::io::Error::other("no ticket"))
}

/// One client connection, keep-alive, with the route's cookie.
struct Client {
    stream: TcpStream,
    cookie: Option<String>,
    buf: Vec<u8>,
}

struct Answer {
    status: u16,
    body: Vec<u8>,
}

impl Client {
    async fn connect(port: u16) -> std::io::Result<Client> {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            cookie: None,
            buf: Vec::with_capacity(1024),
        })
    }

    /// The first 12 bytes of the visitor id in the cookie, as the store
    /// names it.
    fn store_id(&self) -> [u8; 12] {
        let id = self
            .cookie
            .as_deref()
            .and_then(|c| c.split('.').nth(3))
            .and_then(|id| {
                base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(id)
                    .ok()
            })
            .unwrap_or_default();
        let mut out = [0u8; 12];
        if id.len() >= 12 {
            out.copy_from_slice(&id[..12]);
        }
        out
    }

    async fn send(&mut self, method: &str, path: &str, accept: &str) -> std::io::Result<()> {
        let cookie = self
            .cookie
            .as_deref()
            .map_or(String::new(), |c| format!("Cookie: qg_{ROUTE}={c}\r\n"));
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: bench\r\nAccept: {accept}\r\n{cookie}Content-Length: 0\r\n\r\n"
        );
        self.stream.write_all(req.as_bytes()).await
    }

    async fn get(&mut self, path: &str) -> std::io::Result<Answer> {
        self.send("GET", path, "application/json").await?;
        self.read_answer().await
    }

    async fn post(&mut self, path: &str) -> std::io::Result<Answer> {
        self.send("POST", path, "application/json").await?;
        self.read_answer().await
    }

    /// The head of an answer: its status; keeps any cookie it sets. What
    /// follows the head stays in `buf`.
    async fn read_head(&mut self) -> std::io::Result<(u16, String)> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 4);
                let status = head
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let prefix = format!("set-cookie: qg_{ROUTE}=");
                for line in head.lines() {
                    if line.to_ascii_lowercase().starts_with(&prefix) {
                        let value = line[prefix.len()..].split(';').next().unwrap_or("");
                        self.cookie = (!value.is_empty()).then(|| value.to_owned());
                    }
                }
                return Ok((status, head.to_ascii_lowercase()));
            }
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn read_answer(&mut self) -> std::io::Result<Answer> {
        let (status, head) = self.read_head().await?;
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut chunk = [0u8; 4096];
        while self.buf.len() < length {
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let body: Vec<u8> = self.buf.drain(..length).collect();
        Ok(Answer { status, body })
    }

    /// Holds the event stream open, counting events, until `admitted` (when
    /// it was read) or `stop`.
    async fn stream(
        mut self,
        updates: &AtomicU64,
        stop: &AtomicBool,
        ready: &AtomicU64,
    ) -> std::io::Result<Option<Instant>> {
        self.send(
            "GET",
            "/__queuegate/events?route=bench",
            "text/event-stream",
        )
        .await?;
        let (status, _) = self.read_head().await?;
        if status != 200 {
            return Err(std::io::Error::other("the stream was refused"));
        }
        let mut counted_ready = false;
        let mut chunk = [0u8; 2048];
        loop {
            while let Some(start) = find(&self.buf, b"data: ") {
                let Some(len) = find(&self.buf[start..], b"\n\n") else {
                    break;
                };
                let event = self.buf[start..start + len].to_vec();
                self.buf.drain(..start + len + 2);
                updates.fetch_add(1, Ordering::Relaxed);
                if !counted_ready {
                    counted_ready = true;
                    ready.fetch_add(1, Ordering::Relaxed);
                }
                if find(&event, b"\"state\":\"waiting\"").is_none() {
                    let now = Instant::now();
                    return Ok(find(&event, b"\"state\":\"admitted\"").map(|_| now));
                }
            }
            let read =
                tokio::time::timeout(Duration::from_millis(500), self.stream.read(&mut chunk));
            match read.await {
                Ok(Ok(0)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => return Err(e),
                Err(_) if stop.load(Ordering::Relaxed) => return Ok(None),
                Err(_) => {}
            }
        }
    }

    /// Polls status as the page does (every `poll_after_ms`), until
    /// `admitted` (when it was read) or `stop`.
    async fn poll(
        mut self,
        updates: &AtomicU64,
        stop: &AtomicBool,
        ready: &AtomicU64,
    ) -> std::io::Result<Option<Instant>> {
        ready.fetch_add(1, Ordering::Relaxed);
        // The first poll was made when joining.
        let mut wait = Duration::from_secs(1);
        loop {
            let until = Instant::now() + wait;
            while Instant::now() < until {
                if stop.load(Ordering::Relaxed) {
                    return Ok(None);
                }
                tokio::time::sleep((until - Instant::now()).min(Duration::from_millis(500))).await;
            }
            let r = self.get("/__queuegate/status?route=bench").await?;
            updates.fetch_add(1, Ordering::Relaxed);
            let s: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            match s["state"].as_str() {
                Some("waiting") => {
                    wait = Duration::from_millis(s["poll_after_ms"].as_u64().unwrap_or(5_000));
                }
                Some("admitted") => return Ok(Some(Instant::now())),
                _ => return Err(std::io::Error::other("neither waiting nor admitted")),
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
