//! A sale in miniature (DESIGN §9.1), shared by the adaptive capacity tests
//! and the `sale` bench: an origin modelled as an app with a fixed number
//! of workers, and a crowd of visitors who join the line, browse while
//! admitted and leave through the exit path.
//!
//! Self-contained (only crates), so `benches/sale.rs` can include it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The model's knobs and what it saw.
#[derive(Debug, Default)]
pub struct Model {
    /// C: requests it serves at full speed at once.
    workers: AtomicU64,
    /// Answer time of a request with C or fewer in flight (µs).
    base_us: AtomicU64,
    /// Answers 503 to every request.
    failing: AtomicBool,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    /// When each answer went out, and the time it took.
    answers: Mutex<Vec<(Instant, Duration)>>,
}

impl Model {
    /// The answer time with `in_flight` requests held: `base × max(1,
    /// in_flight / C)`, an app whose workers share out the excess.
    pub fn answer_time(&self, in_flight: u64) -> Duration {
        let workers = self.workers.load(Ordering::Relaxed).max(1);
        let base = self.base_us.load(Ordering::Relaxed);
        let us = base.saturating_mul(in_flight.max(workers)) / workers;
        Duration::from_micros(us)
    }

    pub fn set_workers(&self, workers: u64) {
        self.workers.store(workers, Ordering::Relaxed);
    }

    pub fn set_base(&self, base: Duration) {
        self.base_us
            .store(base.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::Relaxed);
    }

    /// The most requests it held at once.
    pub fn max_in_flight(&self) -> u64 {
        self.max_in_flight.load(Ordering::Relaxed)
    }

    /// The answers sent from `from` on (for `len`), their times.
    pub fn answer_times(&self, from: Instant, len: Duration) -> Vec<Duration> {
        let answers = self.answers.lock().unwrap();
        answers
            .iter()
            .filter(|(at, _)| *at >= from && *at < from + len)
            .map(|(_, took)| *took)
            .collect()
    }

    /// Every answer: when it went out, and the time it took.
    pub fn answers(&self) -> Vec<(Instant, Duration)> {
        self.answers.lock().unwrap().clone()
    }

    async fn serve(&self) -> Response<Full<Bytes>> {
        let held = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(held, Ordering::SeqCst);
        let started = Instant::now();
        tokio::time::sleep(self.answer_time(held)).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.answers
            .lock()
            .unwrap()
            .push((Instant::now(), started.elapsed()));
        let status = if self.failing.load(Ordering::Relaxed) {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        };
        let mut resp = Response::new(Full::new(Bytes::from_static(b"seat map")));
        *resp.status_mut() = status;
        resp
    }
}

/// The modelled origin on a loopback port.
pub struct ModelOrigin {
    pub addr: SocketAddr,
    pub model: Arc<Model>,
    task: JoinHandle<()>,
}

impl ModelOrigin {
    /// An app with `workers` workers answering in `base` when not overrun.
    pub async fn start(workers: u64, base: Duration) -> ModelOrigin {
        let model = Arc::new(Model::default());
        model.set_workers(workers);
        model.set_base(base);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = model.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let model = serving.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |_req: Request<Incoming>| {
                        let model = model.clone();
                        async move { Ok::<_, Infallible>(model.serve().await) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        ModelOrigin { addr, model, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for ModelOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How the crowd behaves.
#[derive(Clone, Debug)]
pub struct CrowdPlan {
    /// queuegate's public URL, without a trailing slash.
    pub gate: String,
    /// The route's name and path prefix (`/shop`): visitors browse
    /// `{prefix}/item` and leave through `{prefix}/done`, an exit path.
    pub route: String,
    pub prefix: String,
    pub visitors: usize,
    /// Requests a visitor makes while admitted, one after the other.
    pub requests: usize,
    /// Time between them.
    pub think: Duration,
    /// The crowd arrives over this long, evenly.
    pub ramp: Duration,
}

/// What [`crowd_varied`] varies that a [`CrowdPlan`] keeps the same for
/// every request. The default varies nothing: [`crowd`].
#[derive(Clone, Debug, Default)]
pub struct Variation {
    /// When above `plan.think`, each think time is drawn evenly from
    /// `plan.think ..= think_max`.
    pub think_max: Duration,
    /// Seeds the draws: the same seed, the same think times per visitor.
    pub seed: u64,
}

/// What the crowd saw.
#[derive(Debug, Default)]
pub struct CrowdLog {
    started: Mutex<Option<Instant>>,
    /// When each session was admitted, and how long its visitor waited.
    admissions: Mutex<Vec<(Instant, Duration)>>,
    /// Each admitted request: when it was answered, the time, whether 200.
    requests: Mutex<Vec<(Instant, Duration, bool)>>,
    /// Answers that were neither the origin's nor the line's (`busy`, …).
    other: AtomicU64,
    /// Visitors still in line when the sale ended, and how long each had
    /// waited by then.
    in_line_at_end: Mutex<Vec<Duration>>,
}

impl CrowdLog {
    pub fn started(&self) -> Instant {
        self.started.lock().unwrap().unwrap_or_else(Instant::now)
    }

    pub fn admissions(&self) -> Vec<(Instant, Duration)> {
        self.admissions.lock().unwrap().clone()
    }

    pub fn requests(&self) -> Vec<(Instant, Duration, bool)> {
        self.requests.lock().unwrap().clone()
    }

    pub fn other(&self) -> u64 {
        self.other.load(Ordering::Relaxed)
    }

    /// The visitors still in line when the sale ended: how long each had
    /// waited (a wait that never ended in an admission).
    pub fn in_line_at_end(&self) -> Vec<Duration> {
        self.in_line_at_end.lock().unwrap().clone()
    }
}

/// A crowd running `plan` until `until`; the tasks end by themselves.
pub fn crowd(plan: CrowdPlan, until: Instant) -> (Arc<CrowdLog>, Vec<JoinHandle<()>>) {
    crowd_varied(plan, Variation::default(), until)
}

/// [`crowd`], with what `variation` varies.
pub fn crowd_varied(
    plan: CrowdPlan,
    variation: Variation,
    until: Instant,
) -> (Arc<CrowdLog>, Vec<JoinHandle<()>>) {
    let log = Arc::new(CrowdLog::default());
    *log.started.lock().unwrap() = Some(Instant::now());
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let tasks = (0..plan.visitors)
        .map(|i| {
            let delay = plan.ramp.mul_f64(i as f64 / plan.visitors.max(1) as f64);
            let (plan, log, client) = (plan.clone(), log.clone(), client.clone());
            let think_max = variation.think_max.max(plan.think);
            let seed = variation
                .seed
                .wrapping_mul(1_000_003)
                .wrapping_add(i as u64);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let mut visitor = CrowdVisitor {
                    client,
                    jar: HashMap::new(),
                    think: (plan.think, think_max),
                    rng: StdRng::seed_from_u64(seed),
                };
                visitor.run(&plan, &log, until).await;
            })
        })
        .collect();
    (log, tasks)
}

struct CrowdVisitor {
    client: Client<HttpConnector, Empty<Bytes>>,
    jar: HashMap<String, String>,
    /// The think time's bounds: drawn evenly between them.
    think: (Duration, Duration),
    rng: StdRng,
}

impl CrowdVisitor {
    async fn run(&mut self, plan: &CrowdPlan, log: &CrowdLog, until: Instant) {
        let item = format!("{}{}/item", plan.gate, plan.prefix);
        let status = format!("{}/__queuegate/status?route={}", plan.gate, plan.route);
        let mut joined = Instant::now();
        let mut in_line = false;
        while Instant::now() < until {
            let Some((code, own)) = self.get(&item, true).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            // Not queuegate's answer: the origin's, so admitted (an
            // erring origin is browsed all the same).
            if !own {
                let now = Instant::now();
                log.admissions.lock().unwrap().push((now, now - joined));
                in_line = false;
                self.browse(plan, log, until).await;
                joined = Instant::now();
            } else if code.is_redirection() {
                in_line = true;
                self.wait_turn(&status, until).await;
            } else {
                log.other.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        if in_line {
            log.in_line_at_end.lock().unwrap().push(joined.elapsed());
        }
    }

    /// The time before the next request: drawn from the think bounds.
    fn think(&mut self) -> Duration {
        let (low, high) = self.think;
        if high <= low {
            return low;
        }
        low + (high - low).mul_f64(self.rng.random::<f64>())
    }

    /// Makes the plan's requests, then leaves through the exit path.
    async fn browse(&mut self, plan: &CrowdPlan, log: &CrowdLog, until: Instant) {
        let item = format!("{}{}/item", plan.gate, plan.prefix);
        for _ in 1..plan.requests {
            let think = self.think();
            tokio::time::sleep(think).await;
            if Instant::now() >= until {
                return;
            }
            let started = Instant::now();
            let Some((code, own)) = self.get(&item, false).await else {
                continue;
            };
            if own && code != StatusCode::OK {
                // Held back: the session is gone; join again.
                if code.is_redirection() || code == StatusCode::SERVICE_UNAVAILABLE {
                    log.other.fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
            let ok = code == StatusCode::OK;
            log.requests
                .lock()
                .unwrap()
                .push((Instant::now(), started.elapsed(), ok));
        }
        let done = format!("{}{}/done", plan.gate, plan.prefix);
        let _ = self.get(&done, false).await;
    }

    /// Polls the status until admitted (or the sale ends).
    async fn wait_turn(&mut self, status: &str, until: Instant) {
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let Some(body) = self.body(status).await else {
                continue;
            };
            let state: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            if state["state"] == "admitted" {
                return;
            }
        }
    }

    /// A GET with the jar's cookies: its status, and whether queuegate
    /// answered it itself (`x-queuegate`).
    async fn get(&mut self, url: &str, navigate: bool) -> Option<(StatusCode, bool)> {
        let resp = self.send(url, navigate).await?;
        let own = resp.headers().contains_key("x-queuegate");
        let code = resp.status();
        let _ = resp.into_body().collect().await;
        Some((code, own))
    }

    async fn body(&mut self, url: &str) -> Option<Bytes> {
        let resp = self.send(url, false).await?;
        Some(resp.into_body().collect().await.ok()?.to_bytes())
    }

    async fn send(&mut self, url: &str, navigate: bool) -> Option<Response<Incoming>> {
        let mut req = Request::get(url);
        if navigate {
            req = req
                .header("accept", "text/html")
                .header("sec-fetch-mode", "navigate");
        }
        if !self.jar.is_empty() {
            let cookies: Vec<String> = self.jar.iter().map(|(k, v)| format!("{k}={v}")).collect();
            req = req.header("cookie", cookies.join("; "));
        }
        let resp = self
            .client
            .request(req.body(Empty::new()).ok()?)
            .await
            .ok()?;
        for set in resp.headers().get_all("set-cookie") {
            let Ok(text) = set.to_str() else { continue };
            let first = text.split(';').next().unwrap_or_default();
            let Some((name, value)) = first.split_once('=') else {
                continue;
            };
            if text.contains("Max-Age=0") || value.is_empty() {
                self.jar.remove(name);
            } else {
                self.jar.insert(name.to_owned(), value.to_owned());
            }
        }
        Some(resp)
    }
}

/// The 95th percentile of `times` (nearest rank); zero for none.
pub fn p95(times: &mut [Duration]) -> Duration {
    if times.is_empty() {
        return Duration::ZERO;
    }
    times.sort();
    let rank = (times.len() * 95).div_ceil(100);
    times[rank.saturating_sub(1)]
}
