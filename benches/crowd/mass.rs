//! The mass mode of the crowd simulator (`--waiters N`): up to a million
//! waiters, each no more than its cookie jar, share a fixed pool of keep-alive
//! connections to the instances. It measures what a waiting room of that size
//! costs, phase by phase: joins, status polls while holders leave and waiters
//! abandon, a quiet window with nobody polling, and the poll script alone under
//! `redis-benchmark`; Redis's own counters (`INFO commandstats`, `cpu`,
//! `memory`) before and after each, the CPU of the instances, the positions
//! polls displayed against the exact rank, and the line's order and capacity.
//!
//! The instances stand on one Redis or on a local Cluster of three masters
//! (`--cluster`, `masters.rs`), and the route's line may be split into
//! sub-lines (`--shards`, `queuegate::queue::shards`). Redis's counters are
//! then summed over the masters and each master's CPU is shown too: the
//! point of a split is that no one core carries the line. The exact rank
//! of a waiter in a split line counts the waiters with a lower join score
//! in every sub-line, each read on its own master.
//!
//! Each connection worker owns the waiters `i ≡ w (mod sockets)` and makes
//! their requests one at a time, with their cookies; a waiter is its jar and
//! the few numbers the report needs. Holders (admitted visitors) are handed to one leaver task that
//! makes them leave at `--leave-rate`. Capacity and order are judged as in
//! `sim.rs`, from what the waiters saw, so that there are no false alarms.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http::header::{COOKIE, HOST, SET_COOKIE};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::fleet::{self, GateSpec, Origin, Queuegate};
use crate::masters::Masters;
use crate::sim::{self, Flags, Jar};

const ROUTE: &str = "mass";
const PATH: &str = "/event";
const STATUS_PATH: &str = "/__queuegate/status?route=mass";
const LEAVE_PATH: &str = "/__queuegate/leave?route=mass";
/// The poll script exactly as the Redis store builds it (`route_script!` in
/// `src/queue/redis_store.rs`): the shared prelude, a newline, the operation.
const POLL_SCRIPT: &str = concat!(
    include_str!("../../lua/route.lua"),
    "\n",
    include_str!("../../lua/poll.lua")
);
/// The waiters a real line would hold, and how often they would poll: the
/// scale every figure is extrapolated to.
const MILLION: f64 = 1_000_000.0;
const REFERENCE_POLL_S: f64 = 10.0;

/// One request may take this long before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

const NAVIGATE: [(&str, &str); 2] = [
    ("accept", "text/html,application/xhtml+xml"),
    ("sec-fetch-mode", "navigate"),
];
const FETCH: [(&str, &str); 2] = [("accept", "application/json"), ("sec-fetch-mode", "cors")];

/// What the mass run does; every flag also reads `QG_<FLAG>`.
#[derive(Clone, Debug)]
pub struct MassPlan {
    pub waiters: usize,
    pub instances: usize,
    /// Keep-alive connections in all, split over the instances.
    pub sockets: usize,
    pub capacity: u64,
    /// Each waiter polls this often (offered; the machine may serve less).
    pub poll_every: Duration,
    pub poll_for: Duration,
    /// The share of waiters who abandon during the poll phase, half by
    /// going silent (ghosts), half by leaving.
    pub abandon: f64,
    /// Holders made to leave per second during the poll phase.
    pub leave_rate: f64,
    pub abandon_after: Duration,
    pub arrival_grace: Duration,
    pub tick: Duration,
    /// Waiters whose every poll in the poll phase is checked against ZRANK.
    pub samples: usize,
    /// The window with nobody polling, for the fixed cost of the ticks.
    pub quiet: Duration,
    pub evalsha_clients: usize,
    pub evalsha_requests: u64,
    pub seed: u64,
    /// A local Redis Cluster of three masters instead of one Redis.
    pub cluster: bool,
    /// The sub-lines the route's line is split into (`shards`).
    pub shards: u32,
}

impl MassPlan {
    pub fn from_flags(flags: &Flags) -> MassPlan {
        let abandon_after = Duration::from_secs(flags.parse("abandon-after-s", 45));
        let plan = MassPlan {
            waiters: flags.parse("waiters", 100_000),
            instances: flags.parse("instances", 3),
            sockets: flags.parse("sockets", 2_000),
            capacity: flags.parse("capacity", 100),
            poll_every: Duration::from_secs_f64(flags.parse("poll-s", 10.0)),
            poll_for: Duration::from_secs_f64(flags.parse("poll-duration-s", 60.0)),
            abandon: flags.parse("abandon", 0.0),
            leave_rate: flags.parse("leave-rate", 10.0),
            abandon_after,
            arrival_grace: Duration::from_secs(
                flags.parse("arrival-grace-s", abandon_after.as_secs()),
            ),
            tick: Duration::from_millis(flags.parse("tick-ms", 100)),
            samples: flags.parse("samples", 1_000),
            quiet: Duration::from_secs_f64(flags.parse("quiet-s", 5.0)),
            evalsha_clients: flags.parse("evalsha-clients", 50),
            evalsha_requests: flags.parse("evalsha-requests", 200_000),
            seed: flags.parse("seed", 1),
            cluster: flags.parse("cluster", false),
            shards: flags.parse("shards", 1),
        };
        let fail = |what: &str| -> ! {
            eprintln!("crowd --waiters: {what}");
            std::process::exit(2)
        };
        if plan.waiters == 0 || plan.instances == 0 || plan.capacity == 0 {
            fail("--waiters, --instances and --capacity must be above 0");
        }
        if plan.sockets < plan.instances {
            fail("--sockets must be at least --instances");
        }
        if !(0.0..=1.0).contains(&plan.abandon) {
            fail("--abandon is a share between 0 and 1");
        }
        if plan.poll_every.is_zero() || plan.leave_rate <= 0.0 {
            fail("--poll-s and --leave-rate must be above 0");
        }
        if !(1..=16).contains(&plan.shards) {
            fail("--shards is 1 to 16, as a route's `shards`");
        }
        plan
    }
}

/// One waiter: its cookies and the little the report needs.
#[derive(Default)]
struct Waiter {
    jar: Jar,
    /// Join score of the ticket held (0: none yet).
    score: u64,
    /// When the last poll with this ticket that answered "waiting" was sent (µs).
    seen_waiting_us: u64,
    /// When it abandons, as a share of the poll phase (above 1: never).
    abandon_at: f32,
    /// Abandons by leaving (else by going silent).
    leaves: bool,
    sample: bool,
    /// Admitted, abandoned, or ended by an error: no more requests.
    done: bool,
}

/// One keep-alive HTTP/1 connection to an instance, opened again when the
/// server closed it.
struct Conn {
    addr: String,
    sender: Option<SendRequest<Full<Bytes>>>,
}

/// One answer, body read (cookies already in the jar).
struct Reply {
    status: StatusCode,
    body: Bytes,
}

impl Conn {
    fn new(addr: String) -> Conn {
        Conn { addr, sender: None }
    }

    async fn ready(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, String> {
        let alive = match &mut self.sender {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if !alive {
            self.sender = None;
            let stream = tokio::time::timeout(
                Duration::from_secs(5),
                tokio::net::TcpStream::connect(&self.addr),
            )
            .await
            .map_err(|_| "connect timed out".to_owned())?
            .map_err(|e| format!("connect: {e}"))?;
            let _ = stream.set_nodelay(true);
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.sender = Some(sender);
        }
        self.sender
            .as_mut()
            .ok_or_else(|| "no connection".to_owned())
    }

    /// Sends one request with the jar's cookies and stores those it sets.
    async fn send(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        jar: &mut Jar,
    ) -> Result<Reply, String> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, &self.addr);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(cookies) = jar.header() {
            req = req.header(COOKIE, cookies);
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("bad request {path}: {e}"))?;
        let sender = self.ready().await?;
        let exchange = async {
            let resp = sender.send_request(req).await?;
            let (parts, body) = resp.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, hyper::Error>((parts, body))
        };
        let (parts, body) = match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                self.sender = None;
                return Err(format!("connection: {e}"));
            }
            Err(_) => {
                self.sender = None;
                return Err("timed out".to_owned());
            }
        };
        for c in parts.headers.get_all(SET_COOKIE) {
            if let Ok(c) = c.to_str() {
                jar.store(c);
            }
        }
        Ok(Reply {
            status: parts.status,
            body,
        })
    }
}

/// The fields of a status answer the run reads.
#[derive(serde::Deserialize)]
struct Status<'a> {
    #[serde(borrow)]
    state: &'a str,
    position: Option<u64>,
}

/// An admitted visitor who holds a slot until the leaver makes it leave.
struct Holder {
    jar: Jar,
    /// When the answer that admitted it arrived (µs).
    from_us: u64,
}

/// A poll checked against the exact rank: ZRANK + 1 answered right before
/// the poll was sent and right after its answer arrived.
#[derive(Clone, Copy, Debug)]
struct Sample {
    before: u64,
    shown: u64,
    after: u64,
}

impl Sample {
    /// Places shown outside `[after, before]`, and that relative to the
    /// nearest exact position: a one-tick race is no error.
    fn error(self) -> (u64, f64) {
        let (lo, hi) = (self.after.min(self.before), self.after.max(self.before));
        if self.shown < lo {
            (lo - self.shown, (lo - self.shown) as f64 / lo as f64)
        } else if self.shown > hi {
            (self.shown - hi, (self.shown - hi) as f64 / hi.max(1) as f64)
        } else {
            (0, 0.0)
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Phase {
    Join,
    Poll,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Join => "join",
            Phase::Poll => "poll",
        }
    }
}

/// What every worker shares.
struct Shared {
    plan: MassPlan,
    start: Instant,
    /// A connection to each master.
    redis: Vec<redis::aio::MultiplexedConnection>,
    /// The route's sub-lines (one when it is not split).
    lines: Vec<SubLine>,
    requests: AtomicU64,
    /// Status answers (200) received in the poll phase.
    polls: AtomicU64,
    /// Calls the run made itself to read ranks, taken out of Redis's counts.
    own_calls: OwnCalls,
    /// Live waiters given a new ticket: sent to the back.
    sent_back: AtomicU64,
    ghosts: AtomicU64,
    left_waiting: AtomicU64,
    holders_left: AtomicU64,
    /// (phase, what) → count.
    errors: Mutex<BTreeMap<(Phase, String), u64>>,
    holders: Mutex<VecDeque<Holder>>,
    /// Holding intervals (µs) ended by a leave request.
    released: Mutex<Vec<(u64, u64)>>,
    /// (answer received, join score) of each admission from the line.
    admitted: Mutex<Vec<(u64, u64)>>,
    /// Admitted at once, on arrival.
    at_once: AtomicU64,
    samples: Mutex<Vec<Sample>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    fn error(&self, phase: Phase, what: String) {
        *locked(&self.errors).entry((phase, what)).or_default() += 1;
    }

    /// One request; a failure to get an answer is counted and is `None`.
    async fn send(
        &self,
        conn: &mut Conn,
        phase: Phase,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        jar: &mut Jar,
    ) -> Option<Reply> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        match conn.send(method, path, headers, jar).await {
            Ok(reply) => Some(reply),
            Err(e) => {
                let kind = e.split(':').next().unwrap_or("connection").to_owned();
                self.error(phase, kind);
                None
            }
        }
    }

    /// The waiter's exact place now, if it is in line: ZRANK + 1 in one
    /// line; in a split one, the waiters with a lower join score in every
    /// sub-line (ZCOUNT), + 1, as the store counts a place (same lane:
    /// there is only `main` here). Each read goes to the master holding
    /// the key.
    async fn place(&self, jar: &Jar) -> Option<u64> {
        let raw = raw_id(jar)?;
        let id = &raw[..12];
        if self.lines.len() == 1 {
            let line = &self.lines[0];
            self.own_calls.zrank.fetch_add(1, Ordering::Relaxed);
            let mut con = self.redis[line.master].clone();
            let rank: Option<u64> = redis::cmd("ZRANK")
                .arg(&line.waiting)
                .arg(id)
                .query_async(&mut con)
                .await
                .ok()?;
            return rank.map(|r| r + 1);
        }
        let own = &self.lines[queuegate::queue::shards::shard_of(&raw, self.lines.len() as u32)];
        self.own_calls.zscore.fetch_add(1, Ordering::Relaxed);
        let mut con = self.redis[own.master].clone();
        // The score as Redis prints it, so that `(score` excludes exactly it.
        let score: Option<String> = redis::cmd("ZSCORE")
            .arg(&own.waiting)
            .arg(id)
            .query_async(&mut con)
            .await
            .ok()?;
        let below = format!("({}", score?);
        let mut ahead = 0;
        for line in &self.lines {
            self.own_calls.zcount.fetch_add(1, Ordering::Relaxed);
            let mut con = self.redis[line.master].clone();
            let count: u64 = redis::cmd("ZCOUNT")
                .arg(&line.waiting)
                .arg("-inf")
                .arg(&below)
                .query_async(&mut con)
                .await
                .ok()?;
            ahead += count;
        }
        Some(ahead + 1)
    }

    /// An admitted visitor confirms with one gated request, then holds.
    async fn hold(&self, conn: &mut Conn, phase: Phase, mut jar: Jar, from_us: u64) {
        let Some(reply) = self
            .send(conn, phase, Method::GET, PATH, &NAVIGATE, &mut jar)
            .await
        else {
            return;
        };
        if reply.status != StatusCode::OK {
            self.error(
                phase,
                format!("gated request while admitted: {}", reply.status),
            );
        }
        locked(&self.holders).push_back(Holder { jar, from_us });
    }
}

/// The visitor's raw id, from the route's cookie
/// (`v1.<state>.<route>.<id>.<t>.<kid>.<mac>`).
fn raw_id(jar: &Jar) -> Option<queuegate::queue::VisitorId> {
    raw_id_of(jar.get(&format!("qg_{ROUTE}"))?)
}

/// The visitor's raw id (16 bytes, what picks its sub-line), from one
/// cookie value.
fn raw_id_of(cookie: &str) -> Option<queuegate::queue::VisitorId> {
    let id = cookie.split('.').nth(3)?;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(id)
        .ok()?
        .try_into()
        .ok()
}

/// The visitor as Redis names it (the first 12 bytes of the raw id, see
/// `queuegate::queue::store_id`), from one cookie value.
fn visitor_id_of(cookie: &str) -> Option<Vec<u8>> {
    raw_id_of(cookie).map(|id| id[..12].to_vec())
}

/// One sub-line of the route: its line's key (lane `main`) and the master
/// (index into `Masters`) that serves it.
#[derive(Clone, Debug)]
struct SubLine {
    name: String,
    waiting: String,
    master: usize,
}

impl SubLine {
    fn all(masters: &Masters, shards: u32) -> Vec<SubLine> {
        queuegate::queue::shards::sub_routes(ROUTE, shards)
            .into_iter()
            .map(|name| {
                let waiting = format!("qg:{{{name}}}:waiting");
                SubLine {
                    master: masters.master_of(&waiting),
                    name,
                    waiting,
                }
            })
            .collect()
    }
}

/// The run's own reads of ranks, by command.
#[derive(Default)]
struct OwnCalls {
    zrank: AtomicU64,
    zscore: AtomicU64,
    zcount: AtomicU64,
}

impl OwnCalls {
    fn now(&self) -> BTreeMap<&'static str, u64> {
        BTreeMap::from([
            ("zrank", self.zrank.load(Ordering::Relaxed)),
            ("zscore", self.zscore.load(Ordering::Relaxed)),
            ("zcount", self.zcount.load(Ordering::Relaxed)),
        ])
    }

    /// Calls since `before` (an earlier `now`).
    fn since(&self, before: &BTreeMap<&'static str, u64>) -> BTreeMap<&'static str, u64> {
        self.now()
            .into_iter()
            .map(|(name, n)| (name, n - before.get(name).copied().unwrap_or(0)))
            .collect()
    }
}

/// One connection and the waiters it serves.
struct Worker {
    conn: Conn,
    waiters: Vec<Waiter>,
    /// (last "waiting" poll sent, score) of tickets given up when a waiter
    /// was sent to the back.
    old_tickets: Vec<(u64, u64)>,
}

impl Worker {
    async fn join_all(mut self, shared: Arc<Shared>) -> Worker {
        let mut waiters = std::mem::take(&mut self.waiters);
        for w in &mut waiters {
            self.join(&shared, w).await;
        }
        self.waiters = waiters;
        self
    }

    /// A navigation without a cookie, then the waiting page's first poll.
    async fn join(&mut self, shared: &Shared, w: &mut Waiter) {
        let Some(reply) = shared
            .send(
                &mut self.conn,
                Phase::Join,
                Method::GET,
                PATH,
                &NAVIGATE,
                &mut w.jar,
            )
            .await
        else {
            w.done = true;
            return;
        };
        match reply.status {
            StatusCode::OK => {
                w.done = true;
                shared.at_once.fetch_add(1, Ordering::Relaxed);
                let from = shared.now_us();
                let jar = std::mem::take(&mut w.jar);
                shared.hold(&mut self.conn, Phase::Join, jar, from).await;
            }
            StatusCode::FOUND => match w.jar.ticket_score(ROUTE) {
                Some(score) => {
                    w.score = score;
                    self.poll(shared, Phase::Join, w).await;
                }
                None => {
                    w.done = true;
                    shared.error(Phase::Join, "302 without a ticket".to_owned());
                }
            },
            other => {
                w.done = true;
                shared.error(Phase::Join, format!("arrival: {other}"));
            }
        }
    }

    /// One status poll; a sampled waiter's place is read before and after.
    async fn poll(&mut self, shared: &Shared, phase: Phase, w: &mut Waiter) {
        let sampled = w.sample && phase == Phase::Poll;
        let before = if sampled {
            shared.place(&w.jar).await
        } else {
            None
        };
        let sent = shared.now_us();
        let Some(reply) = shared
            .send(
                &mut self.conn,
                phase,
                Method::GET,
                STATUS_PATH,
                &FETCH,
                &mut w.jar,
            )
            .await
        else {
            return;
        };
        if reply.status != StatusCode::OK {
            shared.error(phase, format!("poll: {}", reply.status));
            return;
        }
        if phase == Phase::Poll {
            shared.polls.fetch_add(1, Ordering::Relaxed);
        }
        let Ok(status) = serde_json::from_slice::<Status>(&reply.body) else {
            shared.error(phase, "poll: not the status JSON".to_owned());
            return;
        };
        match status.state {
            "waiting" => {
                let Some(score) = w.jar.ticket_score(ROUTE) else {
                    shared.error(phase, "poll: waiting without a ticket".to_owned());
                    return;
                };
                if score != w.score {
                    if w.seen_waiting_us > 0 {
                        self.old_tickets.push((w.seen_waiting_us, w.score));
                    }
                    shared.sent_back.fetch_add(1, Ordering::Relaxed);
                    w.score = score;
                    w.seen_waiting_us = 0;
                    return;
                }
                w.seen_waiting_us = sent;
                if let (Some(before), Some(shown)) = (before, status.position) {
                    if let Some(after) = shared.place(&w.jar).await {
                        locked(&shared.samples).push(Sample {
                            before,
                            shown,
                            after,
                        });
                    }
                }
            }
            "admitted" => {
                let at = shared.now_us();
                locked(&shared.admitted).push((at, w.score));
                w.done = true;
                let jar = std::mem::take(&mut w.jar);
                shared.hold(&mut self.conn, phase, jar, at).await;
            }
            other => shared.error(phase, format!("poll: state {other}")),
        }
    }

    /// Polls each waiter every `poll_every` (the first round spread over one
    /// interval in join order) until `end`; behind schedule it polls as fast
    /// as its connection allows. Abandonment happens at a waiter's turn.
    async fn poll_all(mut self, shared: Arc<Shared>, begin: Instant, end: Instant) -> Worker {
        let mut waiters = std::mem::take(&mut self.waiters);
        let n = waiters.len().max(1);
        let every = shared.plan.poll_every;
        let span = end.saturating_duration_since(begin).as_secs_f64().max(1e-9);
        let mut round = 0u32;
        'rounds: loop {
            let mut live = 0;
            for (j, w) in waiters.iter_mut().enumerate() {
                if w.done {
                    continue;
                }
                live += 1;
                let due = begin + every.mul_f64(j as f64 / n as f64) + every * round;
                if due >= end {
                    break 'rounds;
                }
                tokio::time::sleep_until(due.into()).await;
                let now = Instant::now();
                if now >= end {
                    break 'rounds;
                }
                if now.duration_since(begin).as_secs_f64() / span >= f64::from(w.abandon_at) {
                    w.done = true;
                    if w.leaves {
                        if let Some(reply) = shared
                            .send(
                                &mut self.conn,
                                Phase::Poll,
                                Method::POST,
                                LEAVE_PATH,
                                &FETCH,
                                &mut w.jar,
                            )
                            .await
                        {
                            if reply.status != StatusCode::OK {
                                shared.error(Phase::Poll, format!("leave: {}", reply.status));
                            }
                        }
                        shared.left_waiting.fetch_add(1, Ordering::Relaxed);
                    } else {
                        shared.ghosts.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                self.poll(&shared, Phase::Poll, w).await;
            }
            if live == 0 {
                break;
            }
            round += 1;
        }
        self.waiters = waiters;
        self
    }
}

/// Makes holders leave at the plan's rate, the longest holding first, until `end`.
async fn leaver(shared: Arc<Shared>, mut conns: Vec<Conn>, begin: Instant, end: Instant) {
    let interval = Duration::from_secs_f64(1.0 / shared.plan.leave_rate);
    let mut k = 0u32;
    loop {
        tokio::time::sleep_until((begin + interval * k).into()).await;
        if Instant::now() >= end {
            return;
        }
        let conn = k as usize % conns.len();
        k += 1;
        let Some(mut holder) = locked(&shared.holders).pop_front() else {
            continue;
        };
        let sent = shared.now_us();
        if let Some(reply) = shared
            .send(
                &mut conns[conn],
                Phase::Poll,
                Method::POST,
                LEAVE_PATH,
                &FETCH,
                &mut holder.jar,
            )
            .await
        {
            if reply.status != StatusCode::OK {
                shared.error(Phase::Poll, format!("holder leave: {}", reply.status));
            }
        }
        locked(&shared.released).push((holder.from_us, sent));
        shared.holders_left.fetch_add(1, Ordering::Relaxed);
    }
}

/// Redis's counters and the processes' CPU at one moment.
#[derive(Clone, Debug)]
struct Snapshot {
    at: Instant,
    /// Command → calls (scripts' own calls included, as Redis counts them),
    /// summed over the masters.
    calls: BTreeMap<String, u64>,
    /// Each master's CPU seconds, in order.
    redis_cpu_s: Vec<f64>,
    /// Summed over the masters.
    used_memory: u64,
    gate_cpu_s: f64,
    own_cpu_s: f64,
}

/// One master's `INFO commandstats cpu memory`.
#[derive(Clone, Debug, Default)]
struct MasterInfo {
    calls: BTreeMap<String, u64>,
    cpu_s: f64,
    used_memory: u64,
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// `utime + stime` of a process in seconds, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: &str, ticks: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces: count fields after its `)`.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    (field(11) + field(12)) / ticks
}

fn master_info(masters: &Masters, master: usize) -> MasterInfo {
    let text: String = masters.query(master, &["INFO", "commandstats", "cpu", "memory"]);
    let mut info = MasterInfo::default();
    for line in text.lines() {
        if let Some(stat) = line.strip_prefix("cmdstat_") {
            if let Some((name, fields)) = stat.split_once(':') {
                let n = fields
                    .split(',')
                    .find_map(|f| f.strip_prefix("calls="))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                info.calls.insert(name.to_owned(), n);
            }
        } else if let Some(v) = line
            .strip_prefix("used_cpu_user:")
            .or_else(|| line.strip_prefix("used_cpu_sys:"))
        {
            info.cpu_s += v.trim().parse::<f64>().unwrap_or(0.0);
        } else if let Some(v) = line.strip_prefix("used_memory:") {
            info.used_memory = v.trim().parse().unwrap_or(0);
        }
    }
    info
}

fn snapshot(masters: &Masters, gates: &[u32], ticks: f64) -> Snapshot {
    let mut calls: BTreeMap<String, u64> = BTreeMap::new();
    let mut redis_cpu_s = Vec::with_capacity(masters.count());
    let mut used_memory = 0;
    for master in 0..masters.count() {
        let info = master_info(masters, master);
        for (name, n) in info.calls {
            *calls.entry(name).or_default() += n;
        }
        redis_cpu_s.push(info.cpu_s);
        used_memory += info.used_memory;
    }
    Snapshot {
        at: Instant::now(),
        calls,
        redis_cpu_s,
        used_memory,
        gate_cpu_s: gates
            .iter()
            .map(|p| cpu_seconds(&p.to_string(), ticks))
            .sum(),
        own_cpu_s: cpu_seconds("self", ticks),
    }
}

/// What happened between two snapshots: seconds, calls by command (the run's
/// own INFO calls and rank reads taken out), Redis (all masters, and each),
/// instances' and own CPU seconds.
#[derive(Clone, Debug, Default)]
struct Window {
    seconds: f64,
    calls: BTreeMap<String, u64>,
    redis_cpu_s: f64,
    /// Each master's CPU seconds, in order.
    redis_cpu_by: Vec<f64>,
    gate_cpu_s: f64,
    own_cpu_s: f64,
}

impl Window {
    fn between(a: &Snapshot, b: &Snapshot, own: &BTreeMap<&'static str, u64>) -> Window {
        let mut calls = BTreeMap::new();
        for (name, &n) in &b.calls {
            let mut d = n.saturating_sub(a.calls.get(name).copied().unwrap_or(0));
            d = d.saturating_sub(own.get(name.as_str()).copied().unwrap_or(0));
            if d > 0 && name != "info" {
                calls.insert(name.clone(), d);
            }
        }
        let redis_cpu_by: Vec<f64> = b
            .redis_cpu_s
            .iter()
            .zip(&a.redis_cpu_s)
            .map(|(b, a)| b - a)
            .collect();
        Window {
            seconds: b.at.duration_since(a.at).as_secs_f64().max(1e-9),
            calls,
            redis_cpu_s: redis_cpu_by.iter().sum(),
            redis_cpu_by,
            gate_cpu_s: b.gate_cpu_s - a.gate_cpu_s,
            own_cpu_s: b.own_cpu_s - a.own_cpu_s,
        }
    }

    /// Each master's Redis CPU s/s over the window.
    fn cpu_rates(&self) -> Vec<f64> {
        self.redis_cpu_by.iter().map(|c| c / self.seconds).collect()
    }

    /// The busiest master's Redis CPU s/s and its index.
    fn busiest(&self) -> (f64, usize) {
        self.cpu_rates()
            .into_iter()
            .enumerate()
            .map(|(i, c)| (c, i))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap_or((0.0, 0))
    }

    fn total_calls(&self) -> u64 {
        self.calls.values().sum()
    }

    fn calls_line(&self, per: f64, unit: &str) -> String {
        let mut by: Vec<(&String, &u64)> = self.calls.iter().collect();
        by.sort_by(|a, b| b.1.cmp(a.1));
        let parts: Vec<String> = by
            .iter()
            .map(|(name, &n)| format!("{name} {:.2}", n as f64 / per))
            .collect();
        format!("{} {unit}", parts.join(", "))
    }
}

/// The slow poll script alone: `redis-benchmark` running it by EVALSHA for
/// one real waiter, on the master holding its sub-line, with that
/// sub-line's keys; its rate and Redis CPU µs per call (that master's).
fn evalsha_reference(
    masters: &Masters,
    lines: &[SubLine],
    plan: &MassPlan,
    ticket: &str,
) -> (f64, f64) {
    let fields: Vec<&str> = ticket.split('.').collect();
    let raw = raw_id_of(ticket).expect("the ticket's id is base64url");
    let id = &raw[..12];
    let line = &lines[queuegate::queue::shards::shard_of(&raw, lines.len() as u32)];
    let master = line.master;
    let sha: String = masters.query(master, &["SCRIPT", "LOAD", POLL_SCRIPT]);
    // `t` is the join score, then `-` and when the line last saw the holder.
    let (score, seen) = fields[4].split_once('-').unwrap_or((fields[4], fields[4]));
    let keys: Vec<String> = ["waiting", "seen", "active", "tick", "stats", "beat"]
        .iter()
        .map(|k| format!("qg:{{{}}}:{k}", line.name))
        .collect();
    let ms = |d: Duration| d.as_millis().to_string();
    let session_ttl = ms(SESSION_TTL);
    let abandon_after = ms(plan.abandon_after);
    let pass_ttl = ms(PASS_TTL);
    let client_memory = ms(plan.abandon_after);
    let confirm_within = ms(CONFIRM_WITHIN.min(plan.abandon_after));
    let args = [
        score,
        seen,
        &session_ttl,
        &abandon_after,
        &pass_ttl,
        &client_memory,
        &confirm_within,
    ];
    let mut con = redis::Client::open(masters.url(master))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .expect("connect to the master of the reference waiter");
    let reply: Vec<u64> = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(6)
        .arg(&keys)
        .arg(id)
        .arg(&args[..])
        .query(&mut con)
        .expect("EVALSHA poll");
    assert_eq!(reply.first(), Some(&2), "the waiter is in line: {reply:?}");
    let before = master_info(masters, master);
    let out = Command::new("redis-benchmark")
        .args(["-p", &masters.port(master).to_string()])
        .args(["-c", &plan.evalsha_clients.to_string()])
        .args(["-n", &plan.evalsha_requests.to_string(), "-q"])
        .args(["EVALSHA", &sha, "6"])
        .args(&keys)
        .arg(std::ffi::OsStr::from_bytes(id))
        .args(args)
        .output()
        .expect("run redis-benchmark (apt-get install redis-tools)");
    let after = master_info(masters, master);
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text
        .rsplit('\r')
        .flat_map(str::lines)
        .find(|l| l.contains("requests per second"))
        .unwrap_or_else(|| panic!("redis-benchmark printed no rate:\n{text}"));
    let rate = last
        .split_whitespace()
        .zip(last.split_whitespace().skip(1))
        .find(|(_, next)| *next == "requests")
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the rate in {last:?}"));
    let calls = after.calls.get("evalsha").copied().unwrap_or(0)
        - before.calls.get("evalsha").copied().unwrap_or(0);
    let cpu_us = (after.cpu_s - before.cpu_s) * 1e6 / calls.max(1) as f64;
    (rate, cpu_us)
}

/// Long enough that holders keep their slots until they are made to leave.
const SESSION_TTL: Duration = Duration::from_secs(3_600);
const PASS_TTL: Duration = Duration::from_secs(1_800);
/// The route's default `confirm_within`.
const CONFIRM_WITHIN: Duration = Duration::from_secs(30);

/// Runs the mass mode; false on overshoot or an inversion.
pub async fn run(flags: &Flags) -> bool {
    let plan = MassPlan::from_flags(flags);
    let ticks = clock_ticks();
    let redis = Masters::start(plan.cluster);
    let lines = SubLine::all(&redis, plan.shards);
    let origin = Origin::start().await;
    let mut spec = GateSpec::quick(ROUTE, PATH, plan.capacity);
    spec.max_admit_per_tick = plan.capacity;
    spec.tick = plan.tick;
    spec.pass_ttl = PASS_TTL;
    spec.session_ttl = SESSION_TTL;
    spec.abandon_after = plan.abandon_after;
    spec.arrival_grace = plan.arrival_grace;
    spec.max_waiting = (plan.waiters as u64).saturating_mul(2);
    spec.max_connections = plan.sockets as u64 + 1_000;
    spec.header_timeout = Duration::from_secs(30);
    spec.instances_expected = plan.instances as u64;
    spec.store = redis.store_spec();
    spec.shards = plan.shards;
    let key = fleet::run_key();
    let gates: Vec<Queuegate> = (0..plan.instances)
        .map(|_| Queuegate::start(&spec, &origin.url(), &key))
        .collect();
    let pids: Vec<u32> = gates.iter().map(Queuegate::pid).collect();
    let addrs: Vec<String> = gates
        .iter()
        .map(|g| format!("127.0.0.1:{}", g.port()))
        .collect();
    println!(
        "crowd --waiters: {} waiters, {} instances on {}, {} connections, capacity {}, \
         tick {:?}, abandon_after {:?}, arrival_grace {:?}",
        plan.waiters,
        plan.instances,
        redis.describe(),
        plan.sockets,
        plan.capacity,
        plan.tick,
        plan.abandon_after,
        plan.arrival_grace
    );
    println!(
        "  polls every {:?} for {:?}, abandonment {}, holders leave {}/s, {} sampled waiters",
        plan.poll_every, plan.poll_for, plan.abandon, plan.leave_rate, plan.samples
    );
    if lines.len() > 1 || redis.count() > 1 {
        let placed: Vec<String> = lines
            .iter()
            .map(|l| format!("{} on master {}", l.waiting, l.master))
            .collect();
        println!(
            "  the line in {} sub-line(s): {}",
            lines.len(),
            placed.join(", ")
        );
    }

    // The waiters, dealt to the connections; connection w goes to instance w mod instances.
    let stayers = (plan.waiters as f64 * (1.0 - plan.abandon)).max(1.0);
    let sample_share = (plan.samples as f64 / stayers).min(1.0);
    let mut workers: Vec<Worker> = (0..plan.sockets)
        .map(|w| Worker {
            conn: Conn::new(addrs[w % addrs.len()].clone()),
            waiters: Vec::with_capacity(plan.waiters / plan.sockets + 1),
            old_tickets: Vec::new(),
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(plan.seed);
    for i in 0..plan.waiters {
        let abandons = rng.random_bool(plan.abandon);
        workers[i % plan.sockets].waiters.push(Waiter {
            // Spread over the first half of the poll phase.
            abandon_at: if abandons {
                rng.random_range(0.0..0.5)
            } else {
                2.0
            },
            leaves: rng.random_bool(0.5),
            sample: !abandons && rng.random_bool(sample_share),
            ..Waiter::default()
        });
    }

    let shared = Arc::new(Shared {
        plan: plan.clone(),
        start: Instant::now(),
        redis: redis.connections().await,
        lines: lines.clone(),
        requests: AtomicU64::new(0),
        polls: AtomicU64::new(0),
        own_calls: OwnCalls::default(),
        sent_back: AtomicU64::new(0),
        ghosts: AtomicU64::new(0),
        left_waiting: AtomicU64::new(0),
        holders_left: AtomicU64::new(0),
        errors: Mutex::new(BTreeMap::new()),
        holders: Mutex::new(VecDeque::new()),
        released: Mutex::new(Vec::new()),
        admitted: Mutex::new(Vec::new()),
        at_once: AtomicU64::new(0),
        samples: Mutex::new(Vec::new()),
    });
    let progress = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let sent = shared.requests.load(Ordering::Relaxed);
                eprintln!(
                    "  {:>5.0} s: {} requests ({:.0}/s)",
                    shared.start.elapsed().as_secs_f64(),
                    sent,
                    (sent - last) as f64 / 10.0
                );
                last = sent;
            }
        })
    };

    // 1. Join.
    let s0 = snapshot(&redis, &pids, ticks);
    let requests_before = shared.requests.load(Ordering::Relaxed);
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|w| tokio::spawn(w.join_all(shared.clone())))
        .collect();
    let mut workers = Vec::with_capacity(tasks.len());
    for t in tasks {
        workers.push(t.await.expect("a join worker"));
    }
    let s1 = snapshot(&redis, &pids, ticks);
    let join_requests = shared.requests.load(Ordering::Relaxed) - requests_before;
    let join = Window::between(&s0, &s1, &BTreeMap::new());
    let memory_per_waiter = (s1.used_memory as f64 - s0.used_memory as f64) / plan.waiters as f64;
    let in_line = line_length(&redis, &lines);
    eprintln!("  joined: {in_line} in line after {:.1} s", join.seconds);

    // 2. Poll, while holders leave and waiters abandon; at once, so that
    // the first joiners are not silent longer than the join phase.
    let live: usize = workers
        .iter()
        .map(|w| w.waiters.iter().filter(|x| !x.done).count())
        .sum();
    let own_before = shared.own_calls.now();
    let begin = Instant::now();
    let end = begin + plan.poll_for;
    let leave_conns = addrs.iter().map(|a| Conn::new(a.clone())).collect();
    let leave_task = tokio::spawn(leaver(shared.clone(), leave_conns, begin, end));
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|w| tokio::spawn(w.poll_all(shared.clone(), begin, end)))
        .collect();
    let mut workers = Vec::with_capacity(tasks.len());
    for t in tasks {
        workers.push(t.await.expect("a poll worker"));
    }
    leave_task.await.expect("the leaver");
    let s2 = snapshot(&redis, &pids, ticks);
    let poll = Window::between(&s1, &s2, &shared.own_calls.since(&own_before));
    progress.abort();
    let in_line_after = line_length(&redis, &lines);
    let still_polling = workers
        .iter()
        .map(|w| w.waiters.iter().filter(|x| !x.done).count())
        .sum();

    // 3. Quiet: nobody polls, the line still there; what the ticks cost alone.
    tokio::time::sleep(plan.quiet).await;
    let s3 = snapshot(&redis, &pids, ticks);
    let quiet = Window::between(&s2, &s3, &BTreeMap::new());

    // 4. The poll script alone, on the same Redis with the line still there.
    let reference_ticket = workers
        .iter()
        .flat_map(|w| w.waiters.iter())
        .rev()
        .filter(|w| !w.done)
        .filter_map(|w| w.jar.get(&format!("qg_{ROUTE}")))
        .find(|t| visitor_id_of(t).is_some_and(|id| !id.contains(&0)))
        .map(str::to_owned);
    let evalsha = reference_ticket.map(|t| evalsha_reference(&redis, &lines, &plan, &t));

    // The line's order and capacity, from what the waiters saw.
    let mut waiting: Vec<(u64, u64)> = Vec::new();
    for w in &workers {
        waiting.extend(w.old_tickets.iter().copied());
        waiting.extend(
            w.waiters
                .iter()
                .filter(|x| x.seen_waiting_us > 0)
                .map(|x| (x.seen_waiting_us, x.score)),
        );
    }
    let admitted = locked(&shared.admitted).clone();
    let admitted_count = admitted.len() as u64;
    let inversions = sim::count_inversions(admitted, waiting);
    let mut held: Vec<(u64, u64)> = locked(&shared.released).clone();
    held.extend(
        locked(&shared.holders)
            .iter()
            .map(|h| (h.from_us, u64::MAX)),
    );
    let max_at_once = sim::max_overlap_within(held, 0, u64::MAX);

    let report = Report {
        plan: plan.clone(),
        store: redis.describe(),
        join,
        join_requests,
        memory_per_waiter,
        in_line,
        quiet,
        poll,
        live,
        polls: shared.polls.load(Ordering::Relaxed),
        in_line_after,
        still_polling,
        evalsha,
        samples: locked(&shared.samples).clone(),
        errors: locked(&shared.errors).clone(),
        at_once: shared.at_once.load(Ordering::Relaxed),
        admitted: admitted_count,
        holders_left: shared.holders_left.load(Ordering::Relaxed),
        ghosts: shared.ghosts.load(Ordering::Relaxed),
        left_waiting: shared.left_waiting.load(Ordering::Relaxed),
        sent_back: shared.sent_back.load(Ordering::Relaxed),
        max_at_once,
        inversions,
        origin_hits: origin.hits(),
    };
    print!("{}", report.table());
    if report.errors.values().sum::<u64>() > 0 {
        for (g, url) in gates.iter().zip(&addrs) {
            let tail = g.log_tail(5);
            if !tail.is_empty() {
                println!("  log of {url}:\n{tail}");
            }
        }
    }
    report.passed()
}

/// Waiters in every sub-line, each counted on its master.
fn line_length(masters: &Masters, lines: &[SubLine]) -> u64 {
    lines
        .iter()
        .map(|l| masters.query_key::<u64>("ZCARD", &l.waiting, &[]))
        .sum()
}

/// The figures of one mass run.
struct Report {
    plan: MassPlan,
    /// What the instances stood on ("one Redis", a Cluster).
    store: String,
    join: Window,
    join_requests: u64,
    memory_per_waiter: f64,
    in_line: u64,
    quiet: Window,
    poll: Window,
    /// Waiters still in line when the poll phase began.
    live: usize,
    polls: u64,
    in_line_after: u64,
    /// Waiters who had not abandoned nor been admitted at the end.
    still_polling: usize,
    /// (EVALSHA/s, Redis CPU µs per EVALSHA) of the poll script alone.
    evalsha: Option<(f64, f64)>,
    samples: Vec<Sample>,
    errors: BTreeMap<(Phase, String), u64>,
    at_once: u64,
    admitted: u64,
    holders_left: u64,
    ghosts: u64,
    left_waiting: u64,
    sent_back: u64,
    max_at_once: u64,
    inversions: u64,
    origin_hits: u64,
}

/// Each master's Redis CPU s/s and the busiest, when there are several.
fn by_master(w: &Window) -> String {
    if w.redis_cpu_by.len() < 2 {
        return String::new();
    }
    let rates: Vec<String> = w.cpu_rates().iter().map(|c| format!("{c:.3}")).collect();
    let (busiest, i) = w.busiest();
    format!(
        "; by master {}, busiest master {i}: {busiest:.3}",
        rates.join(" / ")
    )
}

impl Report {
    fn passed(&self) -> bool {
        self.max_at_once <= self.plan.capacity && self.inversions == 0
    }

    fn errors_in(&self, phase: Phase) -> u64 {
        self.errors
            .iter()
            .filter(|((p, _), _)| *p == phase)
            .map(|(_, n)| n)
            .sum()
    }

    fn table(&self) -> String {
        let p = &self.plan;
        let n = p.waiters as f64;
        let mut rows: Vec<(String, String)> = Vec::new();
        let mut row = |k: &str, v: String| rows.push((k.to_owned(), v));

        row(
            "store",
            format!(
                "{}, the route's line in {} sub-line(s)",
                self.store, p.shards
            ),
        );

        // Join.
        let j = &self.join;
        row(
            "join: waiters",
            format!(
                "{} in {:.1} s: {:.0} joins/s ({} requests, {} in line after, {} admitted at once)",
                p.waiters,
                j.seconds,
                n / j.seconds,
                self.join_requests,
                self.in_line,
                self.at_once
            ),
        );
        row("join: errors", self.errors_in(Phase::Join).to_string());
        row(
            "join: Redis calls per join",
            format!(
                "{:.2} ({})",
                j.total_calls() as f64 / n,
                j.calls_line(n, "")
            ),
        );
        row(
            "join: Redis CPU per join",
            format!(
                "{:.1} µs ({:.2} CPU s/s while joining{}; {:.0} CPU s for 1M joins)",
                j.redis_cpu_s * 1e6 / n,
                j.redis_cpu_s / j.seconds,
                by_master(j),
                j.redis_cpu_s / n * MILLION
            ),
        );
        row(
            "join: queuegate CPU per join",
            format!(
                "{:.1} µs (all instances; simulator {:.1} µs)",
                j.gate_cpu_s * 1e6 / n,
                j.own_cpu_s * 1e6 / n
            ),
        );
        row(
            "Redis memory per waiter",
            format!(
                "{:.0} bytes (used_memory after the joins minus before, / N; target <= 200)",
                self.memory_per_waiter
            ),
        );

        // Quiet.
        let q = &self.quiet;
        row(
            "quiet: nobody polling",
            format!(
                "{:.1} Redis calls/s ({}), {:.4} Redis CPU s/s{}, {:.4} queuegate CPU s/s",
                q.total_calls() as f64 / q.seconds,
                q.calls_line(q.seconds, "/s"),
                q.redis_cpu_s / q.seconds,
                by_master(q),
                q.gate_cpu_s / q.seconds
            ),
        );

        // Poll.
        let w = &self.poll;
        let served = self.polls as f64 / w.seconds;
        // Waiters polling, on average over the phase (its start and end).
        let polling = (self.live + self.still_polling) as f64 / 2.0;
        let offered = polling / p.poll_every.as_secs_f64();
        row(
            "poll: offered / served",
            format!(
                "{offered:.0} / {served:.0} polls/s ({} polls in {:.1} s; a waiter polled \
                 every {:.1} s on average instead of {:.1} s)",
                self.polls,
                w.seconds,
                polling / served.max(1e-9),
                p.poll_every.as_secs_f64()
            ),
        );
        row("poll: errors", self.errors_in(Phase::Poll).to_string());
        row(
            "poll: Redis calls/s",
            format!(
                "{:.0} ({})",
                w.total_calls() as f64 / w.seconds,
                w.calls_line(w.seconds, "/s")
            ),
        );
        let polls = self.polls.max(1) as f64;
        let extra_calls =
            (w.total_calls() as f64 / w.seconds - q.total_calls() as f64 / q.seconds).max(0.0);
        let redis_cpu = w.redis_cpu_s / w.seconds;
        let quiet_cpu = q.redis_cpu_s / q.seconds;
        let per_poll_cpu = ((redis_cpu - quiet_cpu) / served.max(1e-9)).max(0.0);
        let gate_cpu = w.gate_cpu_s / w.seconds;
        let quiet_gate = q.gate_cpu_s / q.seconds;
        let per_poll_gate = ((gate_cpu - quiet_gate) / served.max(1e-9)).max(0.0);
        row(
            "poll: per poll, above quiet",
            format!(
                "{:.2} Redis calls, {:.1} µs Redis CPU, {:.1} µs queuegate CPU \
                 (simulator {:.1} µs)",
                extra_calls / served.max(1e-9),
                per_poll_cpu * 1e6,
                per_poll_gate * 1e6,
                w.own_cpu_s * 1e6 / polls
            ),
        );
        row(
            "poll: Redis CPU s/s",
            format!(
                "{redis_cpu:.3} measured{} (quiet {quiet_cpu:.3}{})",
                by_master(w),
                by_master(q)
            ),
        );
        let target = MILLION / REFERENCE_POLL_S;
        // Each master's quiet rate + its per-poll cost × target; the most.
        let busiest_extrapolated = w
            .cpu_rates()
            .iter()
            .zip(q.cpu_rates())
            .map(|(poll, quiet)| quiet + ((poll - quiet) / served.max(1e-9)).max(0.0) * target)
            .fold(0.0, f64::max);
        row(
            "extrapolated, 1M waiters / 10 s",
            format!(
                "{target:.0} polls/s: {:.0} Redis calls/s, {:.2} Redis CPU s/s (busiest master \
                 {busiest_extrapolated:.2}; one Redis thread does at most 1.0), {:.2} queuegate \
                 CPU s/s (quiet + per poll x {target:.0}; an extrapolation, not measured)",
                q.total_calls() as f64 / q.seconds + extra_calls / served.max(1e-9) * target,
                quiet_cpu + per_poll_cpu * target,
                quiet_gate + per_poll_gate * target
            ),
        );
        if let Some((rate, cpu_us)) = self.evalsha {
            row(
                "reference: poll script alone",
                format!(
                    "{rate:.0} EVALSHA/s by redis-benchmark ({} clients, on the master of one \
                     waiter's sub-line), {cpu_us:.1} µs Redis CPU each; ratios of the run to it: polls/s served {:.2}, Redis CPU per \
                     poll {:.2}",
                    p.evalsha_clients,
                    served / rate.max(1e-9),
                    per_poll_cpu * 1e6 / cpu_us.max(1e-9)
                ),
            );
        }

        // Positions.
        let mut rel: Vec<f64> = self.samples.iter().map(|s| s.error().1).collect();
        rel.sort_by(f64::total_cmp);
        let off = self.samples.iter().filter(|s| s.error().0 > 0).count();
        let max_off = self.samples.iter().map(|s| s.error().0).max().unwrap_or(0);
        let mean = rel.iter().sum::<f64>() / rel.len().max(1) as f64;
        let p99 = if rel.is_empty() {
            0.0
        } else {
            rel[((rel.len() as f64 * 0.99).ceil() as usize).clamp(1, rel.len()) - 1]
        };
        row(
            "position error",
            format!(
                "mean {:.3} %, p99 {:.3} % of the exact place over {} sampled polls \
                 ({off} off, at most {max_off} places)",
                mean * 100.0,
                p99 * 100.0,
                self.samples.len()
            ),
        );

        // The line.
        row(
            "line",
            format!(
                "{} waiting at the poll phase's start; at its end {} in line and {} still \
                 polling (some admitted, not told yet); {} ghosts, {} left while waiting, {} \
                 sent to the back (live waiters dropped as ghosts)",
                self.live,
                self.in_line_after,
                self.still_polling,
                self.ghosts,
                self.left_waiting,
                self.sent_back
            ),
        );
        row(
            "admitted from the line",
            format!(
                "{} ({} holders left; origin saw {} requests)",
                self.admitted, self.holders_left, self.origin_hits
            ),
        );
        row(
            "max admitted at once",
            format!("{} (capacity {})", self.max_at_once, p.capacity),
        );
        row("order inversions", self.inversions.to_string());

        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, v) in &rows {
            let _ = writeln!(out, "  {k:<width$}  {v}");
        }
        for ((phase, what), count) in &self.errors {
            let _ = writeln!(out, "  error ({}): {what} x {count}", phase.name());
        }
        let _ = writeln!(
            out,
            "  verdict: {}",
            if self.passed() {
                "PASS (capacity kept, no inversion)"
            } else {
                "FAIL"
            }
        );
        out
    }
}
