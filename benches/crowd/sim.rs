//! The crowd: virtual visitors, each with its own cookie jar, who arrive at a
//! set rate, join a gated route, poll the waiting room as its answers say,
//! browse while admitted, then leave or vanish; and the report that checks the
//! line was kept: never more admitted at once than the capacity, nobody
//! admitted ahead of an earlier joiner who was still waiting.
//!
//! What a visitor sees is all it knows, so every check is built to have no
//! false alarms. An admission counts from when its answer arrived and ends
//! when the leave request was sent, or, for a visitor who vanished, one
//! `session_ttl` after the last request that renewed its session was sent:
//! each interval lies inside the store's own. An inversion needs proof: a
//! visitor seen admitted (answer received) before an earlier joiner's poll was
//! sent that still answered "waiting".
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{COOKIE, LOCATION, SET_COOKIE};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One request may take this long before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// What the crowd does and where.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Base URLs of the queuegate instances; each request picks one at random.
    pub targets: Vec<String>,
    pub route: String,
    /// The gated path visitors navigate to.
    pub path: String,
    /// The route's capacity, to check against.
    pub capacity: u64,
    /// The route's session_ttl: how long a vanished visitor's slot stays taken.
    pub session_ttl: Duration,
    pub visitors: usize,
    /// Arrivals per second.
    pub rate: f64,
    /// Weights of the three endings: leave, vanish after browsing, vanish
    /// while waiting (a ghost).
    pub leave: f64,
    pub vanish: f64,
    pub ghost: f64,
    /// Requests made while admitted, each after a think time.
    pub browses: u32,
    pub think: Duration,
    /// A visitor not done this long after the start is counted unfinished.
    pub deadline: Duration,
    pub seed: u64,
    /// Retry what a fault explains (a connection error, a 5xx, a poll that
    /// says the store is down) after a second, as a browser's page would,
    /// instead of ending the visit with an error.
    pub patient: bool,
}

/// How a visitor's visit ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Leave,
    Vanish,
    Ghost,
}

/// A client that keeps connections alive and never follows redirects.
#[derive(Clone)]
pub struct Browser {
    client: Client<HttpConnector, Full<Bytes>>,
}

/// The header that marks answers queuegate made itself.
const TAG: &str = "x-queuegate";

/// One answer, body read.
pub struct Answer {
    pub status: StatusCode,
    /// Why queuegate answered itself (`x-queuegate`); `None` from the origin.
    pub tag: Option<String>,
    pub location: Option<String>,
    pub set_cookies: Vec<String>,
    pub body: Bytes,
}

impl Browser {
    pub fn new(pool_per_host: usize) -> Browser {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(pool_per_host)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Browser { client }
    }

    /// Sends a request with the jar's cookies and stores the cookies it sets.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        jar: &mut Jar,
    ) -> Result<Answer, String> {
        let mut req = Request::builder().method(method).uri(url);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(cookies) = jar.header() {
            req = req.header(COOKIE, cookies);
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("bad request {url}: {e}"))?;
        let resp = match tokio::time::timeout(REQUEST_TIMEOUT, self.client.request(req)).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(e)) => return Err(format!("connection: {e}")),
            Err(_) => return Err("timed out".to_owned()),
        };
        let status = resp.status();
        let tag = resp
            .headers()
            .get(TAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let location = resp
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let set_cookies: Vec<String> = resp
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_owned))
            .collect();
        let body = match tokio::time::timeout(REQUEST_TIMEOUT, resp.into_body().collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) => return Err(format!("body: {e}")),
            Err(_) => return Err("body timed out".to_owned()),
        };
        for c in &set_cookies {
            jar.store(c);
        }
        Ok(Answer {
            status,
            tag,
            location,
            set_cookies,
            body,
        })
    }
}

/// One visitor's cookies.
#[derive(Default, Debug, Clone)]
pub struct Jar {
    cookies: Vec<(String, String)>,
}

impl Jar {
    /// The `Cookie` header the jar sends, if it holds any cookie.
    pub fn header(&self) -> Option<String> {
        if self.cookies.is_empty() {
            return None;
        }
        let pairs: Vec<String> = self
            .cookies
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        Some(pairs.join("; "))
    }

    /// Applies one `Set-Cookie`: `Max-Age=0` or an empty value removes it.
    pub fn store(&mut self, set_cookie: &str) {
        let mut parts = set_cookie.split(';');
        let Some((name, value)) = parts.next().and_then(|p| p.split_once('=')) else {
            return;
        };
        let (name, value) = (name.trim(), value.trim());
        let expired = parts.any(|a| a.trim().eq_ignore_ascii_case("max-age=0"));
        self.cookies.retain(|(n, _)| n != name);
        if !expired && !value.is_empty() {
            self.cookies.push((name.to_owned(), value.to_owned()));
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.cookies
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The join score of the waiting ticket held for `route`, if any:
    /// `v1.w.<route>.<id>.<t>[-<seen>].<kid>.<mac>`.
    pub fn ticket_score(&self, route: &str) -> Option<u64> {
        let value = self.get(&format!("qg_{route}"))?;
        let fields: Vec<&str> = value.split('.').collect();
        match fields.as_slice() {
            ["v1", "w", r, _, t, _, _] if *r == route => {
                t.split('-').next().and_then(|t| t.parse().ok())
            }
            _ => None,
        }
    }
}

/// What happened to one visitor, in µs since the start of the run.
#[derive(Debug, Clone)]
pub struct Record {
    pub fate: Fate,
    /// When the first navigation was sent.
    pub arrived_us: u64,
    /// Admitted on the first navigation, without waiting.
    pub at_once: bool,
    /// Tickets received (a ghost-dropped waiter may join again).
    pub joins: u64,
    pub polls: u64,
    pub requests: u64,
    /// From the line: (answer received, join score of the ticket it held).
    pub admitted: Option<(u64, Option<u64>)>,
    /// Per ticket score: when the last poll that answered "waiting" was sent.
    pub seen_waiting: Vec<(u64, u64)>,
    /// End of the admitted interval in the harness view.
    pub released_us: Option<u64>,
    pub errors: Vec<String>,
    pub unfinished: bool,
    /// Requests sent again after a fault explained the failure (`patient`).
    pub retries: u64,
    /// Polls with the same ticket whose position was higher than the last
    /// one: (poll sent, places risen).
    pub rises: Vec<(u64, u64)>,
    /// When the visit ended (the last answer, or the error that ended it).
    pub ended_us: u64,
}

impl Record {
    fn new(fate: Fate) -> Record {
        Record {
            fate,
            arrived_us: 0,
            at_once: false,
            joins: 0,
            polls: 0,
            requests: 0,
            admitted: None,
            seen_waiting: Vec::new(),
            released_us: None,
            errors: Vec::new(),
            unfinished: false,
            retries: 0,
            rises: Vec::new(),
            ended_us: 0,
        }
    }

    fn saw_waiting(&mut self, score: u64, sent_us: u64) {
        match self.seen_waiting.iter_mut().find(|(s, _)| *s == score) {
            Some(entry) => entry.1 = entry.1.max(sent_us),
            None => self.seen_waiting.push((score, sent_us)),
        }
    }
}

struct Ctx {
    plan: Plan,
    browser: Browser,
    start: Instant,
    /// Requests sent so far, for the progress line.
    sent: AtomicU64,
    responses: Mutex<Responses>,
}

/// Every answer the crowd got, by status and `x-queuegate` tag, and when
/// each failure happened.
#[derive(Debug, Clone, Default)]
pub struct Responses {
    /// (status, tag) → count; status 0 is a request that got no answer
    /// (connection error or timeout), tag `-` an answer from the origin.
    pub by_status: BTreeMap<(u16, String), u64>,
    /// Each 5xx or unanswered request: (µs since the start, status, tag).
    pub failures: Vec<(u64, u16, String)>,
}

impl Responses {
    fn count(&mut self, at_us: u64, status: u16, tag: &str) {
        *self.by_status.entry((status, tag.to_owned())).or_default() += 1;
        if status == 0 || status >= 500 {
            self.failures.push((at_us, status, tag.to_owned()));
        }
    }
}

impl Ctx {
    /// Sends one request through the shared browser and counts its answer.
    async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        jar: &mut Jar,
    ) -> Result<Answer, String> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        let result = self.browser.send(method, url, headers, jar).await;
        let at = self.now_us();
        let mut responses = self
            .responses
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match &result {
            Ok(a) => responses.count(at, a.status.as_u16(), a.tag.as_deref().unwrap_or("-")),
            Err(e) if e.contains("timed out") => responses.count(at, 0, "timeout"),
            Err(_) => responses.count(at, 0, "connection"),
        }
        result
    }

    /// Whether a failed request is worth another try after a pause, and the
    /// pause taken: only in a patient crowd, for a failure a fault explains,
    /// and not past the deadline.
    async fn retry_after_fault(&self, failed: &Result<Answer, String>) -> bool {
        let transient = match failed {
            Ok(a) => a.status.is_server_error(),
            Err(_) => true,
        };
        if !self.plan.patient || !transient || self.past_deadline() {
            return false;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        true
    }

    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    fn past_deadline(&self) -> bool {
        self.start.elapsed() > self.plan.deadline
    }

    fn url(&self, rng: &mut StdRng, path: &str) -> String {
        let base = &self.plan.targets[rng.random_range(0..self.plan.targets.len())];
        format!("{base}{path}")
    }
}

const NAVIGATE: [(&str, &str); 2] = [
    ("accept", "text/html,application/xhtml+xml"),
    ("sec-fetch-mode", "navigate"),
];
const FETCH: [(&str, &str); 2] = [("accept", "application/json"), ("sec-fetch-mode", "cors")];

async fn visit(ctx: Arc<Ctx>, fate: Fate, mut rng: StdRng) -> Record {
    let mut rec = Record::new(fate);
    let mut jar = Jar::default();
    let plan = &ctx.plan;
    let status_path = format!("/__queuegate/status?route={}", plan.route);

    // Arrive.
    rec.arrived_us = ctx.now_us();
    let answer = loop {
        let url = ctx.url(&mut rng, &plan.path);
        rec.requests += 1;
        let sent = ctx.send(Method::GET, &url, &NAVIGATE, &mut jar).await;
        if !ctx.retry_after_fault(&sent).await {
            break sent;
        }
        rec.retries += 1;
    };
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            rec.errors.push(format!("arrive: {e}"));
            return rec;
        }
    };
    // The last request whose answer (re)started the session in the store.
    let mut session_from_us;
    match answer.status {
        StatusCode::OK => {
            rec.at_once = true;
            rec.admitted = Some((ctx.now_us(), None));
            session_from_us = rec.arrived_us;
        }
        StatusCode::FOUND
            if answer
                .location
                .as_deref()
                .is_some_and(|l| l.contains("/__queuegate/waiting")) =>
        {
            if jar.ticket_score(&plan.route).is_none() {
                rec.errors
                    .push("sent to the waiting page without a ticket".to_owned());
                return rec;
            }
            rec.joins += 1;
            let ghost_polls = rng.random_range(0..3u32);
            let mut polls_made = 0u32;
            let mut wait = Duration::ZERO;
            // The last place seen: (ticket score, position).
            let mut last_place: Option<(u64, u64)> = None;
            loop {
                tokio::time::sleep(wait).await;
                if fate == Fate::Ghost && polls_made >= ghost_polls {
                    return rec;
                }
                if ctx.past_deadline() {
                    rec.unfinished = true;
                    return rec;
                }
                let held = jar.ticket_score(&plan.route);
                let sent = ctx.now_us();
                let url = ctx.url(&mut rng, &status_path);
                rec.polls += 1;
                rec.requests += 1;
                polls_made += 1;
                let answer = ctx.send(Method::GET, &url, &FETCH, &mut jar).await;
                if ctx.retry_after_fault(&answer).await {
                    rec.retries += 1;
                    wait = Duration::ZERO;
                    continue;
                }
                let answer = match answer {
                    Ok(a) => a,
                    Err(e) => {
                        rec.errors.push(format!("poll: {e}"));
                        return rec;
                    }
                };
                if answer.status != StatusCode::OK {
                    rec.errors.push(format!("poll: status {}", answer.status));
                    return rec;
                }
                let body: serde_json::Value = match serde_json::from_slice(&answer.body) {
                    Ok(v) => v,
                    Err(e) => {
                        rec.errors.push(format!("poll: not JSON: {e}"));
                        return rec;
                    }
                };
                match body["state"].as_str() {
                    Some("waiting") => {
                        let Some(score) = jar.ticket_score(&plan.route) else {
                            rec.errors.push("waiting without a ticket".to_owned());
                            return rec;
                        };
                        if Some(score) != held {
                            rec.joins += 1;
                        }
                        rec.saw_waiting(score, sent);
                        if let Some(position) = body["position"].as_u64() {
                            if let Some((last_score, last)) = last_place {
                                if last_score == score && position > last {
                                    rec.rises.push((sent, position - last));
                                }
                            }
                            last_place = Some((score, position));
                        }
                        let after = body["poll_after_ms"].as_u64().unwrap_or(1_000);
                        wait = Duration::from_millis(after);
                    }
                    Some("admitted") => {
                        rec.admitted = Some((ctx.now_us(), held));
                        session_from_us = sent;
                        break;
                    }
                    // The store is down and the route says so: the page
                    // polls again, and so does a patient visitor.
                    Some("store_down") if plan.patient && !ctx.past_deadline() => {
                        rec.retries += 1;
                        wait = Duration::from_secs(1);
                    }
                    other => {
                        rec.errors.push(format!("poll: state {other:?}"));
                        return rec;
                    }
                }
            }
        }
        other => {
            rec.errors.push(format!("arrive: status {other}"));
            return rec;
        }
    }

    // Browse while admitted.
    let pass_cookie = format!("qg_{}=", plan.route);
    for _ in 0..plan.browses {
        let think = plan.think.mul_f64(rng.random_range(0.5..1.5));
        tokio::time::sleep(think).await;
        let (sent, answer) = loop {
            let sent = ctx.now_us();
            let url = ctx.url(&mut rng, &plan.path);
            rec.requests += 1;
            let answer = ctx.send(Method::GET, &url, &NAVIGATE, &mut jar).await;
            if let Ok(a) = &answer {
                if a.set_cookies.iter().any(|c| c.starts_with(&pass_cookie)) {
                    session_from_us = sent;
                }
            }
            if !ctx.retry_after_fault(&answer).await {
                break (sent, answer);
            }
            rec.retries += 1;
        };
        match answer {
            Ok(a) if a.status == StatusCode::OK => {}
            Ok(a) => {
                rec.errors
                    .push(format!("browse while admitted: status {}", a.status));
                rec.released_us = Some(sent);
                return rec;
            }
            Err(e) => {
                rec.errors.push(format!("browse: {e}"));
                rec.released_us = Some(sent);
                return rec;
            }
        }
    }

    // Leave, or vanish and let the session expire.
    if fate == Fate::Leave {
        let url = ctx.url(
            &mut rng,
            &format!("/__queuegate/leave?route={}", plan.route),
        );
        rec.released_us = Some(ctx.now_us());
        let answer = loop {
            rec.requests += 1;
            let answer = ctx.send(Method::POST, &url, &FETCH, &mut jar).await;
            if !ctx.retry_after_fault(&answer).await {
                break answer;
            }
            rec.retries += 1;
        };
        match answer {
            Ok(a) if a.status == StatusCode::OK => {}
            Ok(a) => rec.errors.push(format!("leave: status {}", a.status)),
            Err(e) => rec.errors.push(format!("leave: {e}")),
        }
    } else {
        rec.released_us = Some(session_from_us + plan.session_ttl.as_micros() as u64);
    }
    rec
}

/// Runs the crowd to the end (or the deadline) and reports.
pub async fn run(plan: Plan) -> Report {
    run_crowd(plan).await.report
}

/// A finished run: the report, what each visitor saw, and the answers.
pub struct Crowd {
    pub report: Report,
    pub records: Vec<Record>,
    /// The instant every `_us` time of the records counts from.
    pub start: Instant,
    pub responses: Responses,
}

/// Runs the crowd to the end (or the deadline) and keeps the records.
pub async fn run_crowd(plan: Plan) -> Crowd {
    let pool = 512;
    let ctx = Arc::new(Ctx {
        browser: Browser::new(pool),
        start: Instant::now(),
        sent: AtomicU64::new(0),
        plan: plan.clone(),
        responses: Mutex::new(Responses::default()),
    });
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let total = plan.leave + plan.vanish + plan.ghost;
    let interval = Duration::from_secs_f64(1.0 / plan.rate.max(0.001));
    let mut tasks = Vec::with_capacity(plan.visitors);
    let progress = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let sent = ctx.sent.load(Ordering::Relaxed);
                eprintln!(
                    "  {:>5.0} s: {} requests ({:.0}/s)",
                    ctx.start.elapsed().as_secs_f64(),
                    sent,
                    (sent - last) as f64 / 10.0
                );
                last = sent;
            }
        })
    };
    for i in 0..plan.visitors {
        let due = ctx.start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        let draw = rng.random_range(0.0..total.max(f64::MIN_POSITIVE));
        let fate = if draw < plan.ghost {
            Fate::Ghost
        } else if draw < plan.ghost + plan.vanish {
            Fate::Vanish
        } else {
            Fate::Leave
        };
        let visitor_rng = StdRng::seed_from_u64(plan.seed ^ (i as u64 + 1).wrapping_mul(0x9E37));
        let visitor = ctx.clone();
        tasks.push(tokio::spawn(async move {
            let mut rec = visit(visitor.clone(), fate, visitor_rng).await;
            rec.ended_us = visitor.now_us();
            rec
        }));
    }
    let mut records = Vec::with_capacity(tasks.len());
    for t in tasks {
        match t.await {
            Ok(r) => records.push(r),
            Err(e) => {
                let mut r = Record::new(Fate::Leave);
                r.errors.push(format!("visitor task failed: {e}"));
                records.push(r);
            }
        }
    }
    progress.abort();
    let responses = ctx
        .responses
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    Crowd {
        report: Report::from_records(&plan, &records, ctx.start.elapsed()),
        records,
        start: ctx.start,
        responses,
    }
}

/// The figures of one run.
#[derive(Debug, Clone)]
pub struct Report {
    pub visitors: usize,
    pub instances: usize,
    pub capacity: u64,
    pub elapsed: Duration,
    pub requests: u64,
    pub joins: u64,
    pub polls: u64,
    pub admitted: u64,
    pub at_once: u64,
    pub max_admitted: u64,
    pub inversions: u64,
    pub wait_p50: Duration,
    pub wait_p90: Duration,
    pub wait_p99: Duration,
    pub wait_max: Duration,
    pub left: u64,
    pub no_shows: u64,
    pub ghosts: u64,
    /// Visitors who were to stay (leave or vanish after browsing) and were
    /// never admitted.
    pub never_admitted: u64,
    pub unfinished: u64,
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// Requests sent again after a fault explained the failure (`patient`).
    pub retries: u64,
    /// Visitors given a new ticket while they polled: sent to the back.
    pub sent_back: u64,
    /// Visitors whose position rose between two polls with the same ticket,
    /// how often in all, and the largest rise.
    pub rose_visitors: u64,
    pub rises: u64,
    pub max_rise: u64,
}

impl Report {
    pub fn from_records(plan: &Plan, records: &[Record], elapsed: Duration) -> Report {
        let sum = |f: fn(&Record) -> u64| records.iter().map(f).sum::<u64>();
        let admitted: Vec<&Record> = records.iter().filter(|r| r.admitted.is_some()).collect();
        let mut waits: Vec<u64> = admitted
            .iter()
            .filter(|r| !r.at_once)
            .filter_map(|r| r.admitted.map(|(at, _)| at.saturating_sub(r.arrived_us)))
            .collect();
        waits.sort_unstable();
        let pct = |p: f64| -> Duration {
            if waits.is_empty() {
                return Duration::ZERO;
            }
            let i = ((waits.len() as f64 * p).ceil() as usize).clamp(1, waits.len()) - 1;
            Duration::from_micros(waits[i])
        };
        let mut error_samples: Vec<String> = Vec::new();
        for e in records.iter().flat_map(|r| r.errors.iter()) {
            if error_samples.len() < 5 && !error_samples.contains(e) {
                error_samples.push(e.clone());
            }
        }
        Report {
            visitors: records.len(),
            instances: plan.targets.len(),
            capacity: plan.capacity,
            elapsed,
            requests: sum(|r| r.requests),
            joins: sum(|r| r.joins),
            polls: sum(|r| r.polls),
            admitted: admitted.len() as u64,
            at_once: records.iter().filter(|r| r.at_once).count() as u64,
            max_admitted: max_at_once(records),
            inversions: inversions(records),
            wait_p50: pct(0.50),
            wait_p90: pct(0.90),
            wait_p99: pct(0.99),
            wait_max: pct(1.0),
            left: records
                .iter()
                .filter(|r| r.fate == Fate::Leave && r.admitted.is_some())
                .count() as u64,
            no_shows: records
                .iter()
                .filter(|r| r.fate != Fate::Leave && r.admitted.is_some())
                .count() as u64,
            ghosts: records
                .iter()
                .filter(|r| r.fate == Fate::Ghost && r.admitted.is_none())
                .count() as u64,
            never_admitted: records
                .iter()
                .filter(|r| r.fate != Fate::Ghost && r.admitted.is_none())
                .count() as u64,
            unfinished: records.iter().filter(|r| r.unfinished).count() as u64,
            errors: records.iter().map(|r| r.errors.len() as u64).sum(),
            error_samples,
            retries: sum(|r| r.retries),
            sent_back: records.iter().filter(|r| r.joins > 1).count() as u64,
            rose_visitors: records.iter().filter(|r| !r.rises.is_empty()).count() as u64,
            rises: records.iter().map(|r| r.rises.len() as u64).sum(),
            max_rise: records
                .iter()
                .flat_map(|r| r.rises.iter().map(|&(_, places)| places))
                .max()
                .unwrap_or(0),
        }
    }

    /// Capacity kept and no inversion.
    pub fn passed(&self) -> bool {
        self.max_admitted <= self.capacity && self.inversions == 0
    }

    pub fn table(&self) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
        let rows: Vec<(&str, String)> = vec![
            ("visitors", self.visitors.to_string()),
            ("instances", self.instances.to_string()),
            ("elapsed", format!("{secs:.1} s")),
            (
                "requests",
                format!("{} ({:.0}/s)", self.requests, self.requests as f64 / secs),
            ),
            (
                "joins",
                format!("{} ({:.1}/s)", self.joins, self.joins as f64 / secs),
            ),
            (
                "polls",
                format!("{} ({:.1}/s)", self.polls, self.polls as f64 / secs),
            ),
            (
                "admitted",
                format!("{} ({} at once)", self.admitted, self.at_once),
            ),
            (
                "max admitted at once",
                format!("{} (capacity {})", self.max_admitted, self.capacity),
            ),
            ("order inversions", self.inversions.to_string()),
            (
                "wait p50 / p90 / p99",
                format!(
                    "{} / {} / {}",
                    ms(self.wait_p50),
                    ms(self.wait_p90),
                    ms(self.wait_p99)
                ),
            ),
            ("wait max", ms(self.wait_max)),
            ("left", self.left.to_string()),
            ("no-shows (admitted, vanished)", self.no_shows.to_string()),
            ("ghosts (vanished waiting)", self.ghosts.to_string()),
            ("never admitted (stayed)", self.never_admitted.to_string()),
            ("unfinished at deadline", self.unfinished.to_string()),
            ("errors", self.errors.to_string()),
        ];
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, v) in rows {
            let _ = writeln!(out, "  {k:<width$}  {v}");
        }
        for e in &self.error_samples {
            let _ = writeln!(out, "  error: {e}");
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

/// The most visitors admitted at the same time, from each admitted visitor's
/// interval in the harness view. At equal times a release is counted first.
pub fn max_at_once(records: &[Record]) -> u64 {
    max_at_once_within(records, 0, u64::MAX)
}

/// The most visitors admitted at the same time at any moment in
/// `[from_us, until_us)`, counting those admitted before `from_us` who still
/// held their slot.
pub fn max_at_once_within(records: &[Record], from_us: u64, until_us: u64) -> u64 {
    let held = records.iter().filter_map(|r| {
        r.admitted
            .map(|(from, _)| (from, r.released_us.unwrap_or(u64::MAX)))
    });
    max_overlap_within(held, from_us, until_us)
}

/// The most of the `(from, until)` intervals open at once at any moment in
/// `[from_us, until_us)`; an empty interval counts for nothing, and at equal
/// times a release is counted first.
pub fn max_overlap_within(
    intervals: impl IntoIterator<Item = (u64, u64)>,
    from_us: u64,
    until_us: u64,
) -> u64 {
    let mut events: Vec<(u64, i64)> = Vec::new();
    for (from, until) in intervals {
        if until > from {
            events.push((from, 1));
            events.push((until, -1));
        }
    }
    events.sort_unstable();
    let (mut now, mut max) = (0i64, 0i64);
    let mut opened = false;
    for (at, d) in events {
        if at >= until_us {
            break;
        }
        if !opened && at >= from_us {
            // Those still holding a slot when the window opened.
            opened = true;
            max = max.max(now);
        }
        now += d;
        if at >= from_us {
            max = max.max(now);
        }
    }
    if !opened {
        max = max.max(now);
    }
    max as u64
}

/// (answer received, ticket score) of each admission from the line.
fn admissions_from_line(records: &[Record]) -> Vec<(u64, u64)> {
    records
        .iter()
        .filter_map(|r| match r.admitted {
            Some((at, Some(score))) => Some((at, score)),
            _ => None,
        })
        .collect()
}

/// (poll sent, ticket score) of each last poll per ticket that answered "waiting".
fn seen_waiting(records: &[Record]) -> Vec<(u64, u64)> {
    records
        .iter()
        .flat_map(|r| r.seen_waiting.iter().map(|&(score, sent)| (sent, score)))
        .collect()
}

/// Each inversion of [`inversions`] as (B seen admitted, A's poll sent),
/// for telling when they happened.
pub fn inversion_pairs(records: &[Record]) -> Vec<(u64, u64)> {
    let admitted = admissions_from_line(records);
    let mut waiting = seen_waiting(records);
    waiting.sort_unstable();
    let mut pairs = Vec::new();
    for (at, later) in admitted {
        let first = waiting.partition_point(|&(sent, _)| sent <= at);
        pairs.extend(
            waiting[first..]
                .iter()
                .filter(|&&(_, earlier)| earlier < later)
                .map(|&(sent, _)| (at, sent)),
        );
    }
    pairs
}

/// Pairs (A, B) where B joined later (higher ticket score) yet was seen
/// admitted before a poll of A was sent that still answered "waiting".
pub fn inversions(records: &[Record]) -> u64 {
    count_inversions(admissions_from_line(records), seen_waiting(records))
}

/// The count of [`inversions`] from its two lists: `admitted` holds (answer
/// received, ticket score) of each admission from the line, `waiting` (poll
/// sent, ticket score) of each ticket's last poll that answered "waiting".
pub fn count_inversions(mut admitted: Vec<(u64, u64)>, mut waiting: Vec<(u64, u64)>) -> u64 {
    admitted.sort_unstable();
    waiting.sort_unstable();
    let mut scores: Vec<u64> = admitted.iter().map(|&(_, s)| s).collect();
    scores.sort_unstable();
    scores.dedup();
    // Fenwick tree over score ranks of the admissions seen so far.
    let mut tree = vec![0u64; scores.len() + 1];
    let mut inserted = 0u64;
    let mut next = 0;
    let mut count = 0;
    for (sent, score) in waiting {
        while next < admitted.len() && admitted[next].0 < sent {
            let mut i = scores.partition_point(|&s| s < admitted[next].1) + 1;
            while i < tree.len() {
                tree[i] += 1;
                i += i & i.wrapping_neg();
            }
            inserted += 1;
            next += 1;
        }
        // Admissions so far with a score at most `score`.
        let mut i = scores.partition_point(|&s| s <= score);
        let mut at_most = 0;
        while i > 0 {
            at_most += tree[i];
            i -= i & i.wrapping_neg();
        }
        count += inserted - at_most;
    }
    count
}

/// Reads `--name value` flags (after `cargo bench --bench x --`), falling back
/// to `QG_<NAME>` environment variables; `--bench`, which cargo adds, is
/// ignored.
pub struct Flags {
    pairs: HashMap<String, String>,
}

impl Flags {
    pub fn from_env() -> Flags {
        let mut pairs = HashMap::new();
        let mut args = std::env::args().skip(1).peekable();
        while let Some(arg) = args.next() {
            let Some(name) = arg.strip_prefix("--") else {
                continue;
            };
            if name == "bench" {
                continue;
            }
            if let Some((n, v)) = name.split_once('=') {
                pairs.insert(n.to_owned(), v.to_owned());
            } else if let Some(v) = args.next_if(|a| !a.starts_with("--")) {
                pairs.insert(name.to_owned(), v);
            } else {
                pairs.insert(name.to_owned(), "true".to_owned());
            }
        }
        Flags { pairs }
    }

    pub fn get(&self, name: &str) -> Option<String> {
        self.pairs.get(name).cloned().or_else(|| {
            let var = format!("QG_{}", name.to_ascii_uppercase().replace('-', "_"));
            std::env::var(var).ok()
        })
    }

    /// A flag's value parsed, or `default`; a value that does not parse stops the run.
    pub fn parse<T: std::str::FromStr>(&self, name: &str, default: T) -> T {
        match self.get(name) {
            None => default,
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| panic!("--{name} {v}: not a valid value")),
        }
    }
}

#[cfg(test)]
mod checks {
    use super::*;

    fn rec(admitted: Option<(u64, Option<u64>)>, released: Option<u64>) -> Record {
        let mut r = Record::new(Fate::Leave);
        r.admitted = admitted;
        r.released_us = released;
        r
    }

    #[test]
    fn a_later_joiner_admitted_before_a_waiting_earlier_one_is_an_inversion() {
        let mut early = rec(None, None);
        early.saw_waiting(100, 50);
        let late = rec(Some((40, Some(200))), Some(60));
        assert_eq!(inversions(&[early.clone(), late.clone()]), 1);
        assert_eq!(
            inversion_pairs(&[early.clone(), late.clone()]),
            vec![(40, 50)]
        );
        // Seen admitted only after the earlier joiner's poll was sent: no proof.
        let late_after = rec(Some((60, Some(200))), Some(70));
        assert_eq!(inversions(&[early.clone(), late_after.clone()]), 0);
        assert!(inversion_pairs(&[early, late_after]).is_empty());
    }

    #[test]
    fn admissions_in_join_order_are_no_inversion() {
        let mut later = rec(Some((90, Some(200))), None);
        later.saw_waiting(200, 30);
        let earlier = rec(Some((20, Some(100))), None);
        assert_eq!(inversions(&[later, earlier]), 0);
    }

    #[test]
    fn overlapping_admissions_are_counted_and_touching_ones_are_not() {
        let a = rec(Some((0, None)), Some(10));
        let b = rec(Some((10, None)), Some(20));
        assert_eq!(max_at_once(&[a.clone(), b.clone()]), 1);
        let c = rec(Some((5, None)), Some(15));
        assert_eq!(max_at_once(&[a.clone(), b.clone(), c.clone()]), 2);
        // A window counts who held a slot when it opened, and nothing after it.
        assert_eq!(
            max_at_once_within(&[a.clone(), b.clone(), c.clone()], 12, 30),
            2
        );
        assert_eq!(max_at_once_within(&[a.clone(), c.clone()], 16, 30), 0);
        assert_eq!(max_at_once_within(&[a, b, c], 0, 5), 1);
    }

    #[test]
    fn jar_removes_a_cleared_cookie_and_reads_the_ticket_score() {
        let mut jar = Jar::default();
        jar.store("qg_r=v1.w.r.AAAA.1234.k1.mac; Path=/; Max-Age=604800; HttpOnly");
        assert_eq!(jar.ticket_score("r"), Some(1234));
        jar.store("qg_r=; Path=/; Max-Age=0; HttpOnly");
        assert_eq!(jar.get("qg_r"), None);
    }
}
