//! The cap on requests in flight to the origin (DESIGN §9.2): at most
//! `max_inflight` of a route's requests at the origin, the rest let in in
//! the order they came, a busy answer past `inflight_wait` that costs the
//! visitor nothing, turns given back by clients that hang up, and reloads
//! that resize the cap with requests in flight.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures_util::StreamExt;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use queuegate::config::Route;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

/// An origin that records the paths it was asked for in order and the most
/// requests it had at once. A path with `/hold` is answered once the test
/// adds a permit to `release`; one with `/stream` gets its head at once and
/// a body that never ends.
struct Held {
    origin: Origin,
    seen: Arc<Mutex<Vec<String>>>,
    most: Arc<AtomicUsize>,
    release: Arc<Semaphore>,
}

impl Held {
    async fn start() -> Held {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let release = Arc::new(Semaphore::new(0));
        let origin = spawn_origin({
            let (seen, most, release) = (seen.clone(), most.clone(), release.clone());
            move |req: http::Request<hyper::body::Incoming>| {
                let (seen, now, most, release) =
                    (seen.clone(), now.clone(), most.clone(), release.clone());
                async move {
                    let path = req.uri().path().to_owned();
                    let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(at_once, Ordering::SeqCst);
                    seen.lock().unwrap().push(path.clone());
                    if path.contains("/hold") {
                        release.acquire().await.unwrap().forget();
                    }
                    now.fetch_sub(1, Ordering::SeqCst);
                    if path.contains("/stream") {
                        let first = Ok(Frame::data(Bytes::from_static(b"started\n")));
                        let body = futures_util::stream::once(async { first })
                            .chain(futures_util::stream::pending());
                        return Response::new(BodyExt::boxed(StreamBody::new(body)));
                    }
                    Response::new(full(format!("origin {path}")))
                }
            }
        })
        .await;
        Held {
            origin,
            seen,
            most,
            release,
        }
    }

    fn saw(&self, path: &str) -> bool {
        self.seen.lock().unwrap().iter().any(|p| p == path)
    }

    /// The `/hold` paths asked for, in order.
    fn holds(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|p| p.contains("/hold"))
            .cloned()
            .collect()
    }

    /// A gate with an admin listener in front of this origin, with the route
    /// `tickets` on `/tickets` (capacity 20) that `tune` changes.
    async fn gate(&self, tune: impl FnOnce(&mut Route)) -> Gate {
        let mut config = proxy_config(&self.origin.url());
        let mut r = route("tickets", "/tickets", 20);
        tune(&mut r);
        config.routes.push(r);
        spawn_gate_opts(config, ring("k1"), queuegate::RunOptions::default()).await
    }
}

/// The route `tickets` as `/routes` shows it.
async fn shown(gate: &Gate) -> serde_json::Value {
    let (parts, body) = get(&gate.admin_url("/routes")).await;
    assert_eq!(parts.status, StatusCode::OK);
    let routes: serde_json::Value = serde_json::from_slice(&body).unwrap();
    routes["routes"][0].clone()
}

/// Waits until `/routes` shows `inflight` and `inflight_waiting` for `tickets`.
async fn until_live(gate: &Gate, inflight: u64, waiting: u64) {
    let what = format!("{inflight} in flight and {waiting} waiting");
    eventually_async(&what, || async {
        let r = shown(gate).await;
        r["inflight"] == inflight && r["inflight_waiting"] == waiting
    })
    .await;
}

/// A visitor admitted to `tickets` by a request the origin answered.
async fn admitted(gate: &Gate) -> Visitor {
    let mut v = Visitor::new();
    assert!(v.fetch(&gate.url("/tickets/in")).await.reached_origin());
    v
}

/// `v`'s cookies as a `Cookie` header's value.
fn cookies(v: &Visitor) -> String {
    let pairs: Vec<String> = v.jar.iter().map(|(k, val)| format!("{k}={val}")).collect();
    pairs.join("; ")
}

/// Sends `GET path` with `v`'s cookies on a socket of its own, left open.
async fn raw_get(gate: &Gate, path: &str, v: &Visitor) -> tokio::net::TcpStream {
    let mut socket = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: shop.test\r\nAccept: application/json\r\nCookie: {}\r\n\r\n",
        cookies(v)
    );
    socket.write_all(req.as_bytes()).await.unwrap();
    socket
}

#[tokio::test]
async fn no_more_than_max_inflight_reach_the_origin_and_the_rest_go_in_arrival_order() {
    let held = Held::start().await;
    let gate = held
        .gate(|r| {
            r.max_inflight = Some(2);
            r.inflight_wait = Duration::from_secs(30);
        })
        .await;
    let mut visitors = Vec::new();
    for _ in 0..6 {
        visitors.push(admitted(&gate).await);
    }

    // Sent one after another: each is at the origin or waiting for a turn
    // before the next is sent.
    let mut answers = Vec::new();
    for (i, v) in visitors.iter().enumerate() {
        let (mut v, url) = (v.clone(), gate.url(&format!("/tickets/hold/{i}")));
        answers.push(tokio::spawn(async move { v.fetch(&url).await }));
        let (inflight, waiting) = if i < 2 { (i + 1, 0) } else { (2, i - 1) };
        until_live(&gate, inflight as u64, waiting as u64).await;
    }
    assert_eq!(held.holds().len(), 2);
    let metrics = gate.metrics().await;
    assert_eq!(
        sample(&metrics, "queuegate_inflight{route=\"tickets\"}"),
        2.0
    );

    // One answered at a time: the first in line takes the turn it frees.
    for i in 2..6 {
        held.release.add_permits(1);
        let path = format!("/tickets/hold/{i}");
        eventually(&format!("the origin has {path}"), || held.saw(&path)).await;
    }
    held.release.add_permits(2);
    for answer in answers {
        let answer = answer.await.unwrap();
        assert!(answer.reached_origin(), "{answer:?}");
    }
    let order: Vec<String> = (0..6).map(|i| format!("/tickets/hold/{i}")).collect();
    assert_eq!(held.holds(), order);
    assert_eq!(held.most.load(Ordering::SeqCst), 2);
    until_live(&gate, 0, 0).await;
    let r = shown(&gate).await;
    assert_eq!(r["max_inflight"], 2);
}

#[tokio::test]
async fn past_inflight_wait_a_request_is_answered_busy_and_its_session_loses_nothing() {
    let held = Held::start().await;
    let gate = held
        .gate(|r| {
            r.max_inflight = Some(2);
            r.inflight_wait = Duration::from_millis(200);
            r.max_requests_per_session = Some(2);
        })
        .await;
    // Each visitor's first request of two.
    let mut visitors = Vec::new();
    for _ in 0..6 {
        visitors.push(admitted(&gate).await);
    }
    let mut rest = visitors.split_off(2);
    let holding: Vec<_> = visitors
        .into_iter()
        .enumerate()
        .map(|(i, mut v)| {
            let url = gate.url(&format!("/tickets/hold/{i}"));
            tokio::spawn(async move { v.fetch(&url).await })
        })
        .collect();
    until_live(&gate, 2, 0).await;

    let busy = futures_util::future::join_all(rest.iter().map(|v| {
        let (mut v, url) = (v.clone(), gate.url("/tickets/busy"));
        async move { v.fetch(&url).await }
    }))
    .await;
    for answer in &busy {
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
        assert_eq!(answer.headers["retry-after"], "1");
        assert_eq!(answer.headers["x-queuegate"], "busy");
    }
    assert!(!held.saw("/tickets/busy"));
    let metrics = gate.metrics().await;
    let count = |series: &str| sample(&metrics, series);
    assert_eq!(
        count("queuegate_inflight_refused_total{route=\"tickets\"}"),
        4.0
    );
    assert_eq!(count("queuegate_requests_total{decision=\"busy\"}"), 4.0);
    assert_eq!(count("queuegate_inflight{route=\"tickets\"}"), 2.0);

    held.release.add_permits(2);
    for answer in holding {
        assert!(answer.await.unwrap().reached_origin());
    }
    // The busy answer used up none of their two requests: the second is
    // forwarded, and it is the session's last (its pass is cleared).
    for v in &mut rest {
        let answer = v.fetch(&gate.url("/tickets/again")).await;
        assert!(answer.reached_origin(), "{answer:?}");
        assert_eq!(v.cookie("qg_tickets"), None, "{answer:?}");
    }
    assert_eq!(
        admin_sample(&gate, "queuegate_inflight{route=\"tickets\"}").await,
        0.0
    );
}

#[tokio::test]
async fn a_client_that_hangs_up_gives_back_its_turn_or_its_place_in_line() {
    let held = Held::start().await;
    let gate = held
        .gate(|r| {
            r.max_inflight = Some(1);
            r.inflight_wait = Duration::from_secs(30);
        })
        .await;
    let (a, mut b, mut c) = (
        admitted(&gate).await,
        admitted(&gate).await,
        admitted(&gate).await,
    );

    // Holding a turn: the origin is still sending when the client goes.
    let mut socket = raw_get(&gate, "/tickets/stream", &a).await;
    let mut head = Vec::new();
    while !String::from_utf8_lossy(&head).contains("started") {
        let mut chunk = [0u8; 1024];
        let n = socket.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the body began");
        head.extend_from_slice(&chunk[..n]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"));
    until_live(&gate, 1, 0).await;
    drop(socket);
    let next = tokio::time::timeout(Duration::from_secs(10), b.fetch(&gate.url("/tickets/next")))
        .await
        .expect("the turn is given back");
    assert!(next.reached_origin(), "{next:?}");
    until_live(&gate, 0, 0).await;

    // Waiting for a turn: the place in line goes with the client.
    let a_holds = {
        let (mut a, url) = (a.clone(), gate.url("/tickets/hold/a"));
        tokio::spawn(async move { a.fetch(&url).await })
    };
    until_live(&gate, 1, 0).await;
    let socket = raw_get(&gate, "/tickets/hold/b", &b).await;
    until_live(&gate, 1, 1).await;
    drop(socket);
    until_live(&gate, 1, 0).await;
    held.release.add_permits(1);
    assert!(a_holds.await.unwrap().reached_origin());
    let after = tokio::time::timeout(
        Duration::from_secs(10),
        c.fetch(&gate.url("/tickets/after")),
    )
    .await
    .expect("nobody holds the turn");
    assert!(after.reached_origin(), "{after:?}");
    assert!(!held.saw("/tickets/hold/b"));
    until_live(&gate, 0, 0).await;
}

/// A config file for a gate in front of `upstream` whose route `tickets`
/// lets everyone through (`passthrough`: turns are taken without passes),
/// with `max_inflight` when given.
fn passthrough_config(dir: &ConfigDir, upstream: &str, max_inflight: Option<u64>) -> String {
    let cap = max_inflight.map_or(String::new(), |n| format!("    max_inflight: {n}\n"));
    format!(
        "listen: [{{ addr: 127.0.0.1:0 }}]
upstream: {{ url: {upstream} }}
keys: [{{ id: k1, file: {key} }}]
routes:
  - name: tickets
    match: {{ path_prefix: /tickets }}
    capacity: 100
    mode: passthrough
    inflight_wait: 30s
{cap}",
        key = dir.key().display()
    )
}

#[tokio::test]
async fn a_reload_resizes_the_cap_without_losing_the_requests_in_flight() {
    let held = Held::start().await;
    let dir = ConfigDir::new();
    let url = held.origin.url();
    dir.write(&passthrough_config(&dir, &url, Some(3)));
    let (trigger, requests) = queuegate::reload::channel();
    let gate = gate_from_file(&dir, Some(requests)).await;
    let reload = |max: Option<u64>| {
        dir.write(&passthrough_config(&dir, &url, max));
        trigger.reload();
        let gate = &gate;
        async move {
            let want = max.map_or(serde_json::Value::Null, serde_json::Value::from);
            eventually_async("the reload is applied", || async {
                shown(gate).await["max_inflight"] == want
            })
            .await;
        }
    };
    let send = |path: &str| {
        let url = gate.url(path);
        tokio::spawn(async move { get(&url).await.0.status })
    };

    let mut answers = Vec::new();
    for i in 0..3u64 {
        answers.push(send(&format!("/tickets/hold/{i}")));
        until_live(&gate, i + 1, 0).await;
    }

    // Lowered to 1 with 3 in flight: the new cap holds once they finish.
    reload(Some(1)).await;
    for i in 3..5u64 {
        answers.push(send(&format!("/tickets/hold/{i}")));
        until_live(&gate, 3, i - 2).await;
    }
    held.release.add_permits(1);
    until_live(&gate, 2, 2).await;
    held.release.add_permits(1);
    until_live(&gate, 1, 2).await;
    assert_eq!(held.holds().len(), 3);
    held.release.add_permits(1);
    eventually("the first waiter is let in", || held.saw("/tickets/hold/3")).await;
    until_live(&gate, 1, 1).await;
    held.release.add_permits(1);
    eventually("the second waiter is let in", || {
        held.saw("/tickets/hold/4")
    })
    .await;
    until_live(&gate, 1, 0).await;

    // Raised to 4 with 3 waiting: they are let in at once.
    for i in 5..8u64 {
        answers.push(send(&format!("/tickets/hold/{i}")));
        until_live(&gate, 1, i - 4).await;
    }
    reload(Some(4)).await;
    until_live(&gate, 4, 0).await;
    assert_eq!(held.holds().len(), 8);

    // Turned off with one waiting: it is let in.
    answers.push(send("/tickets/hold/8"));
    until_live(&gate, 4, 1).await;
    reload(None).await;
    until_live(&gate, 5, 0).await;

    held.release.add_permits(5);
    for answer in answers {
        assert_eq!(answer.await.unwrap(), StatusCode::OK);
    }
    // Those let in one at a time came in order; those let in together by
    // the raised cap, in any order.
    let mut holds = held.holds();
    let order: Vec<String> = (0..5).map(|i| format!("/tickets/hold/{i}")).collect();
    assert_eq!(holds[..5], order);
    holds[5..8].sort();
    assert_eq!(
        holds[5..],
        [
            "/tickets/hold/5",
            "/tickets/hold/6",
            "/tickets/hold/7",
            "/tickets/hold/8"
        ]
    );
    until_live(&gate, 0, 0).await;
}
