//! Parked idle HTTP/1 connections: requests after a park, heads split or
//! pipelined around it, clients closing parked connections, and the drain.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use http::{Request, Response};
use queuegate::clock::Clock;
use queuegate::config::Config;
use queuegate::connection::Parking;
use queuegate::metrics::Metrics;
use queuegate::queue::Store;
use queuegate::request::App;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Quiet this long and a connection is parked.
const PARK_AFTER: Duration = Duration::from_millis(50);

/// queuegate's server run in-process with a short park delay.
struct Parked {
    addr: std::net::SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Parked {
    async fn start(config: Config) -> Parked {
        let clock = Clock::system();
        let store = Store::from_config(&config.store, clock).unwrap();
        let metrics = Arc::new(Metrics::new());
        let app = Arc::new(App::new(&config, ring("k1"), store, clock, metrics.clone()).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let parking = Parking::after(PARK_AFTER);
        let (tx, rx) = oneshot::channel::<()>();
        let limits = config.limits.clone();
        let task = tokio::spawn(async move {
            queuegate::server::serve_parking(
                app,
                vec![listener.into()],
                &limits,
                parking,
                async move {
                    let _ = rx.await;
                },
            )
            .await
            .unwrap();
        });
        Parked {
            addr,
            metrics,
            shutdown: Some(tx),
            task,
        }
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.unwrap()
    }

    /// Waits until connections were parked `n` times in all.
    async fn parked(&self, n: u64) {
        eventually(&format!("{n} parks"), || {
            self.sample("queuegate_parks_total") >= n as f64
        })
        .await;
    }

    /// The value of `series` in the exported metrics.
    fn sample(&self, series: &str) -> f64 {
        self.metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no sample {series}"))
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An origin answering with the request target, recording each one.
async fn echo_origin() -> (Origin, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let origin = spawn_origin(move |req: Request<hyper::body::Incoming>| {
        let log = log.clone();
        async move {
            let target = req.uri().to_string();
            log.lock().unwrap().push(target.clone());
            Response::new(full(format!("origin saw {target}")))
        }
    })
    .await;
    (origin, seen)
}

fn config(origin: &Origin) -> Config {
    let mut config = proxy_config(&origin.url());
    config.limits.workers = Some(1);
    config
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: parked.test\r\n\r\n")
}

/// One response read off the socket: its head (lower-cased) and body.
struct Answer {
    head: String,
    body: String,
}

/// Reads exactly one response with a Content-Length body, leaving whatever
/// follows in `pending`.
async fn read_answer(stream: &mut TcpStream, pending: &mut Vec<u8>) -> Answer {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .expect("a content-length");
            if pending.len() >= end + 4 + length {
                let body = String::from_utf8_lossy(&pending[end + 4..end + 4 + length]).into();
                pending.drain(..end + 4 + length);
                assert!(
                    !head.contains("connection: close"),
                    "a kept-alive answer: {head}"
                );
                return Answer { head, body };
            }
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the connection closed before the answer");
        pending.extend_from_slice(&chunk[..n]);
    }
}

async fn ask(stream: &mut TcpStream, path: &str) -> Answer {
    stream.write_all(get(path).as_bytes()).await.unwrap();
    let mut pending = Vec::new();
    let answer = read_answer(stream, &mut pending).await;
    assert!(pending.is_empty());
    answer
}

#[tokio::test]
async fn a_parked_connection_answers_its_next_requests() {
    let (origin, seen) = echo_origin().await;
    let gate = Parked::start(config(&origin)).await;
    let mut stream = gate.connect().await;

    let first = ask(&mut stream, "/one").await;
    assert!(first.head.starts_with("http/1.1 200"), "{}", first.head);
    assert_eq!(first.body, "origin saw /one");
    for (round, path) in ["/two", "/three"].into_iter().enumerate() {
        gate.parked(round as u64 + 1).await;
        let answer = ask(&mut stream, path).await;
        assert!(answer.head.starts_with("http/1.1 200"), "{}", answer.head);
        assert_eq!(answer.body, format!("origin saw {path}"));
    }
    assert_eq!(gate.sample("queuegate_resumes_total"), 2.0);
    assert_eq!(*seen.lock().unwrap(), ["/one", "/two", "/three"]);
}

#[tokio::test]
async fn a_head_split_around_a_park_is_read_whole() {
    let (origin, seen) = echo_origin().await;
    let gate = Parked::start(config(&origin)).await;
    let mut stream = gate.connect().await;
    ask(&mut stream, "/first").await;

    let head = get("/split?x=1");
    let (front, back) = head.split_at(20);
    stream.write_all(front.as_bytes()).await.unwrap();
    // The half head is parked with the connection, then replayed.
    gate.parked(1).await;
    stream.write_all(back.as_bytes()).await.unwrap();
    let mut pending = Vec::new();
    let answer = read_answer(&mut stream, &mut pending).await;
    assert!(answer.head.starts_with("http/1.1 200"), "{}", answer.head);
    assert_eq!(answer.body, "origin saw /split?x=1");
    assert_eq!(*seen.lock().unwrap(), ["/first", "/split?x=1"]);
}

#[tokio::test]
async fn pipelined_requests_after_a_park_are_answered_in_order() {
    let (origin, seen) = echo_origin().await;
    let gate = Parked::start(config(&origin)).await;
    let mut stream = gate.connect().await;
    ask(&mut stream, "/first").await;
    gate.parked(1).await;

    let both = format!("{}{}", get("/a"), get("/b"));
    stream.write_all(both.as_bytes()).await.unwrap();
    let mut pending = Vec::new();
    let a = read_answer(&mut stream, &mut pending).await;
    let b = read_answer(&mut stream, &mut pending).await;
    assert_eq!(
        (a.body.as_str(), b.body.as_str()),
        ("origin saw /a", "origin saw /b")
    );
    assert!(pending.is_empty());
    assert_eq!(*seen.lock().unwrap(), ["/first", "/a", "/b"]);
}

#[tokio::test]
async fn ambiguous_framing_is_still_reported_after_a_park() {
    let (origin, seen) = echo_origin().await;
    let gate = Parked::start(config(&origin)).await;
    let mut stream = gate.connect().await;
    ask(&mut stream, "/first").await;
    gate.parked(1).await;

    // The second request of the connection: the per-connection count
    // carries across the park, so the report lands on this request.
    // hyper drops the unreadable length; only the raw heads show it.
    let smuggled = "POST /smuggle HTTP/1.1\r\nHost: parked.test\r\nTransfer-Encoding: chunked\r\n\
                    Content-Length: x\r\n\r\n0\r\n\r\n";
    stream.write_all(smuggled.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 400"), "{answer}");
    assert_eq!(*seen.lock().unwrap(), ["/first"]);
}

#[tokio::test]
async fn a_client_closing_a_parked_connection_frees_its_slot() {
    let (origin, seen) = echo_origin().await;
    let mut config = config(&origin);
    config.limits.max_connections = 1;
    let gate = Parked::start(config).await;

    let mut first = gate.connect().await;
    ask(&mut first, "/first").await;
    gate.parked(1).await;
    drop(first);

    // The only slot must come back, or this connection is never served.
    let mut second = gate.connect().await;
    let answer = tokio::time::timeout(Duration::from_secs(10), ask(&mut second, "/second"))
        .await
        .expect("the parked connection's slot was freed");
    assert_eq!(answer.body, "origin saw /second");
    assert_eq!(*seen.lock().unwrap(), ["/first", "/second"]);
}

#[tokio::test]
async fn the_drain_closes_parked_connections_at_once() {
    let (origin, _seen) = echo_origin().await;
    let mut config = config(&origin);
    // Only an ended connection lets the drain finish before this.
    config.limits.drain_timeout = Duration::from_secs(3600);
    let mut gate = Parked::start(config).await;
    let mut stream = gate.connect().await;
    ask(&mut stream, "/first").await;
    gate.parked(1).await;

    let _ = gate.shutdown.take().unwrap().send(());
    let task = &mut gate.task;
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the drain ended with the parked connection")
        .unwrap();
    let mut rest = Vec::new();
    assert_eq!(stream.read_to_end(&mut rest).await.unwrap(), 0);
}
