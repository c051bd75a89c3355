//! The micro-cache (DESIGN §9.3) through real sockets: one origin request
//! for many visitors, expiry after write, `Age`, `HEAD` from a `GET`'s
//! entry, `Vary`, the answers and requests never kept, coalesced waiters
//! released together, the gate in front of the cache, memory bounds, and
//! reloads.

mod common;

use std::collections::HashMap;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use queuegate::config::{CacheConfig, Config, Route};
use queuegate::RunOptions;

const ROUTE: &str = "seats";

/// What the origin was asked: per path and query, how many times, and the
/// methods in order.
#[derive(Clone, Default)]
struct Asked(Arc<Mutex<HashMap<String, Vec<String>>>>);

impl Asked {
    fn count(&self, target: &str) -> usize {
        self.0.lock().unwrap().get(target).map_or(0, Vec::len)
    }
    fn methods(&self, target: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .get(target)
            .cloned()
            .unwrap_or_default()
    }
}

/// A seat-map origin. Each answer names its target and how many times the
/// target was asked for (`seats /seats/1 #1`), so two answers with the same
/// body came from one fetch. The query picks the answer's headers:
/// `cc=VALUE` a `Cache-Control`, `cookie=1` a `Set-Cookie`, `vary=1` a
/// `Vary: Accept-Language` (and the language in the body), `size=N` an
/// `N`-byte body. A request with `If-None-Match` is answered `304`.
async fn seat_origin() -> (Origin, Asked) {
    let asked = Asked::default();
    let log = asked.clone();
    let origin = spawn_origin(move |req: Request<hyper::body::Incoming>| {
        let log = log.clone();
        async move {
            let target = req.uri().to_string();
            let n = {
                let mut log = log.0.lock().unwrap();
                let seen = log.entry(target.clone()).or_default();
                seen.push(req.method().to_string());
                seen.len()
            };
            let query: HashMap<String, String> = req
                .uri()
                .query()
                .unwrap_or("")
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.replace("%20", " ")))
                .collect();
            let lang = req
                .headers()
                .get("accept-language")
                .map_or("none".to_owned(), |v| v.to_str().unwrap().to_owned());
            let body = match query.get("size") {
                Some(size) => Bytes::from(vec![b'x'; size.parse().unwrap()]),
                None if query.contains_key("vary") => {
                    format!("seats {target} #{n} lang={lang}").into()
                }
                None => format!("seats {target} #{n}").into(),
            };
            let mut resp = Response::new(full(body));
            if req.headers().contains_key("if-none-match") {
                *resp.status_mut() = StatusCode::NOT_MODIFIED;
                *resp.body_mut() = full("");
            }
            let h = resp.headers_mut();
            if let Some(cc) = query.get("cc") {
                h.insert("cache-control", cc.parse().unwrap());
            }
            if query.contains_key("cookie") {
                h.insert("set-cookie", "app_session=personal".parse().unwrap());
            }
            if query.contains_key("vary") {
                h.insert("vary", "Accept-Language".parse().unwrap());
            }
            resp
        }
    })
    .await;
    (origin, asked)
}

fn seat_cache(ttl: Duration) -> CacheConfig {
    CacheConfig {
        ttl,
        max_entries: 200,
        max_body: 1 << 20,
    }
}

/// queuegate with route `seats` on `/seats` (room for a crowd, its cache
/// `seat_cache(10s)`) in front of `origin`, with an admin listener; `tune`
/// changes the route and the config.
async fn cached_gate(origin: &Origin, tune: impl FnOnce(&mut Config, &mut Route)) -> Gate {
    let mut config = proxy_config(&origin.url());
    let mut r = route(ROUTE, "/seats", 1000);
    r.max_admit_per_tick = 1000;
    r.cache = Some(seat_cache(Duration::from_secs(10)));
    tune(&mut config, &mut r);
    config.routes.push(r);
    spawn_gate_opts(config, ring("k1"), RunOptions::default()).await
}

/// A visitor admitted to `seats` at `at`: the `Cookie` header it sends.
async fn admitted(at: &impl PublicUrl) -> String {
    let mut v = Visitor::new();
    let answer = v.fetch(&at.url("/seats/admit?cc=no-store")).await;
    assert!(answer.reached_origin(), "{answer:?}");
    cookie_of(&v)
}

fn cookie_of(v: &Visitor) -> String {
    v.jar
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `method path` at `at` with `cookie` and `headers`.
async fn ask(
    at: &impl PublicUrl,
    method: &str,
    path: &str,
    cookie: &str,
    headers: &[(&str, &str)],
) -> (http::response::Parts, Bytes) {
    let mut req = Request::builder()
        .method(method)
        .uri(at.url(path))
        .header("cookie", cookie);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    send(req.body(Full::new(Bytes::new())).unwrap()).await
}

async fn cache_count(gate: &Gate, result: &str) -> f64 {
    admin_sample(
        gate,
        &format!("queuegate_cache_total{{route=\"{ROUTE}\",result=\"{result}\"}}"),
    )
    .await
}

#[tokio::test]
async fn a_hundred_concurrent_gets_by_admitted_visitors_make_one_origin_request() {
    let (origin, asked) = seat_origin().await;
    let gate = cached_gate(&origin, |_, _| {}).await;
    let mut cookies = Vec::new();
    for _ in 0..100 {
        cookies.push(admitted(&gate).await);
    }
    let gets = cookies.iter().map(|cookie| {
        let (url, cookie) = (gate.url("/seats/1"), cookie.clone());
        tokio::spawn(async move {
            let req = Request::get(url).header("cookie", cookie);
            send(req.body(Full::new(Bytes::new())).unwrap()).await
        })
    });
    let answers = futures_util::future::join_all(gets).await;
    for answer in &answers {
        let (parts, body) = answer.as_ref().unwrap();
        assert_eq!(parts.status, StatusCode::OK);
        assert_eq!(body, "seats /seats/1 #1");
    }
    assert_eq!(asked.count("/seats/1"), 1);
    let (hit, coalesced) = (
        cache_count(&gate, "hit").await,
        cache_count(&gate, "coalesced").await,
    );
    assert_eq!(
        cache_count(&gate, "miss").await,
        1.0 + 100.0,
        "one fetch, and each admit"
    );
    assert_eq!(hit + coalesced, 99.0, "hit {hit}, coalesced {coalesced}");
    // Every one of them counted as an admitted request (its pass renewed
    // at its first use, as every pass admitted at once is).
    let passes = admin_sample(&gate, "queuegate_requests_total{decision=\"pass\"}").await
        + admin_sample(&gate, "queuegate_requests_total{decision=\"renewed\"}").await;
    assert_eq!(passes, 100.0);
}

#[tokio::test]
async fn an_answer_expires_a_second_after_it_was_written_however_often_it_is_read() {
    let (origin, asked) = seat_origin().await;
    let gate = cached_gate(&origin, |_, r| {
        r.cache = Some(seat_cache(Duration::from_secs(1)))
    })
    .await;
    let cookie = admitted(&gate).await;
    let (first, body) = ask(&gate, "GET", "/seats/1", &cookie, &[]).await;
    assert_eq!(body, "seats /seats/1 #1");
    assert!(
        first.headers.get("age").is_none(),
        "the origin's own answer"
    );
    let (hit, body) = ask(&gate, "GET", "/seats/1", &cookie, &[]).await;
    assert_eq!(body, "seats /seats/1 #1");
    assert_eq!(hit.headers["age"], "0");
    assert_eq!(asked.count("/seats/1"), 1);
    // Read without pause: reading never keeps it longer. Every answer
    // served from the entry is less than two seconds old.
    let mut served = 1;
    loop {
        let (parts, body) = ask(&gate, "GET", "/seats/1", &cookie, &[]).await;
        if body == "seats /seats/1 #2" {
            break;
        }
        assert_eq!(body, "seats /seats/1 #1");
        let age: u64 = parts.headers["age"].to_str().unwrap().parse().unwrap();
        assert!(age <= 1, "served {age} s after it was written");
        served += 1;
        assert!(served < 10_000, "the entry never expired");
    }
    assert_eq!(asked.count("/seats/1"), 2);
    // The origin's shorter max-age wins over a longer ttl.
    let gate = cached_gate(&origin, |_, r| {
        r.cache = Some(seat_cache(Duration::from_secs(60)))
    })
    .await;
    let cookie = admitted(&gate).await;
    let target = "/seats/2?cc=max-age=1";
    ask(&gate, "GET", target, &cookie, &[]).await;
    eventually_async("the max-age=1 entry expires within a 60 s ttl", || async {
        ask(&gate, "GET", target, &cookie, &[]).await;
        asked.count(target) == 2
    })
    .await;
}

#[tokio::test]
async fn head_is_answered_from_a_get_entry_and_never_fills_one() {
    let (origin, asked) = seat_origin().await;
    let gate = cached_gate(&origin, |_, _| {}).await;
    let cookie = admitted(&gate).await;
    let (head, body) = ask(&gate, "HEAD", "/seats/1", &cookie, &[]).await;
    assert_eq!((head.status, body.len()), (StatusCode::OK, 0));
    let (_, body) = ask(&gate, "GET", "/seats/1", &cookie, &[]).await;
    assert_eq!(body, "seats /seats/1 #2", "the HEAD filled no entry");
    let (head, body) = ask(&gate, "HEAD", "/seats/1", &cookie, &[]).await;
    assert_eq!(head.status, StatusCode::OK);
    assert!(body.is_empty());
    assert_eq!(head.headers["content-length"], "17");
    assert!(head.headers.contains_key("age"));
    assert_eq!(asked.methods("/seats/1"), ["HEAD", "GET"]);
}

#[tokio::test]
async fn vary_keeps_an_entry_per_value_of_what_the_origin_saw() {
    let (origin, asked) = seat_origin().await;
    let gate = cached_gate(&origin, |_, _| {}).await;
    let cookie = admitted(&gate).await;
    let target = "/seats/1?vary=1";
    let lang = |l| [("accept-language", l)];
    let (_, fr) = ask(&gate, "GET", target, &cookie, &lang("fr")).await;
    let (_, en) = ask(&gate, "GET", target, &cookie, &lang("en")).await;
    assert_eq!(fr, "seats /seats/1?vary=1 #1 lang=fr");
    assert_eq!(en, "seats /seats/1?vary=1 #2 lang=en");
    for _ in 0..3 {
        assert_eq!(ask(&gate, "GET", target, &cookie, &lang("fr")).await.1, fr);
        assert_eq!(ask(&gate, "GET", target, &cookie, &lang("en")).await.1, en);
    }
    assert_eq!(asked.count(target), 2);
    // A header the client names in `Connection` never reaches the origin:
    // its answer is kept as one without it, never as the French page.
    let hidden = [("accept-language", "fr"), ("connection", "accept-language")];
    let (_, body) = ask(&gate, "GET", target, &cookie, &hidden).await;
    assert_eq!(body, "seats /seats/1?vary=1 #3 lang=none");
    assert_eq!(ask(&gate, "GET", target, &cookie, &lang("fr")).await.1, fr);
    assert_eq!(asked.count(target), 3);
}

#[tokio::test]
async fn personal_partial_and_private_answers_are_never_kept() {
    let (origin, asked) = seat_origin().await;
    let gate = cached_gate(&origin, |_, _| {}).await;
    let cookie = admitted(&gate).await;
    let never: [(&str, &[(&str, &str)]); 6] = [
        ("/seats/1?cookie=1", &[]),
        ("/seats/2?cc=private", &[]),
        ("/seats/3?cc=no-store", &[]),
        ("/seats/4?cc=no-cache", &[]),
        ("/seats/5", &[("authorization", "Bearer alice")]),
        ("/seats/6", &[("range", "bytes=0-3")]),
    ];
    for (target, headers) in never {
        for _ in 0..3 {
            let (parts, _) = ask(&gate, "GET", target, &cookie, headers).await;
            assert!(
                parts.headers.get("age").is_none(),
                "{target} served from the cache"
            );
        }
        assert_eq!(asked.count(target), 3, "{target}");
    }
    // Nobody else is served the answer that set a cookie.
    let (_, body) = ask(
        &gate,
        "GET",
        "/seats/1?cookie=1",
        &admitted(&gate).await,
        &[],
    )
    .await;
    assert_eq!(body, "seats /seats/1?cookie=1 #4");
    // An answer to an authorized request that says `public` is kept, and
    // served to others; the authorized request itself is never served one.
    let public = "/seats/7?cc=public";
    ask(
        &gate,
        "GET",
        public,
        &cookie,
        &[("authorization", "Bearer alice")],
    )
    .await;
    let (hit, _) = ask(&gate, "GET", public, &cookie, &[]).await;
    assert!(hit.headers.contains_key("age"));
    ask(
        &gate,
        "GET",
        public,
        &cookie,
        &[("authorization", "Bearer bob")],
    )
    .await;
    assert_eq!(asked.count(public), 2);
    // A client's `no-cache` goes to the origin and refreshes the entry.
    let fresh = "/seats/8";
    ask(&gate, "GET", fresh, &cookie, &[]).await;
    let (_, body) = ask(
        &gate,
        "GET",
        fresh,
        &cookie,
        &[("cache-control", "no-cache")],
    )
    .await;
    assert_eq!(body, "seats /seats/8 #2");
    assert_eq!(
        ask(&gate, "GET", fresh, &cookie, &[]).await.1,
        "seats /seats/8 #2"
    );
    assert_eq!(
        cache_count(&gate, "bypass").await,
        3.0 + 5.0,
        "range ×3, authorization ×5"
    );
}

/// An origin whose first request for `/seats/mine` is held until
/// `release` is notified, and whose next `followers` requests for it are
/// each held until all of them are in flight at once: requests sent one
/// after another would never get past it. Those answers are `private`
/// when `private`; every other page is answered at once, `no-store`.
async fn holding_origin(
    followers: usize,
    private: bool,
) -> (Origin, Arc<tokio::sync::Notify>, Arc<AtomicUsize>) {
    let release = Arc::new(tokio::sync::Notify::new());
    let barrier = Arc::new(tokio::sync::Barrier::new(followers.max(1)));
    let seen = Arc::new(AtomicUsize::new(0));
    let (held, count) = (release.clone(), seen.clone());
    let origin = spawn_origin(move |req: Request<hyper::body::Incoming>| {
        let (held, barrier, count) = (held.clone(), barrier.clone(), count.clone());
        async move {
            let mut resp = Response::new(full("mine"));
            let cc = if req.uri().path() != "/seats/mine" {
                "no-store"
            } else {
                if count.fetch_add(1, Ordering::SeqCst) == 0 {
                    held.notified().await;
                } else {
                    barrier.wait().await;
                }
                if private {
                    "private"
                } else {
                    "max-age=60"
                }
            };
            resp.headers_mut()
                .insert("cache-control", cc.parse().unwrap());
            resp
        }
    })
    .await;
    (origin, release, seen)
}

/// `n` visitors admitted to `seats` at `gate`, each asking for
/// `/seats/mine` at once, one task each.
async fn crowd(
    gate: &Gate,
    n: usize,
) -> Vec<tokio::task::JoinHandle<(http::response::Parts, Bytes)>> {
    let mut cookies = Vec::new();
    for _ in 0..n {
        cookies.push(admitted(gate).await);
    }
    cookies
        .into_iter()
        .map(|cookie| {
            let url = gate.url("/seats/mine");
            tokio::spawn(async move {
                let req = Request::get(url).header("cookie", cookie);
                send(req.body(Full::new(Bytes::new())).unwrap()).await
            })
        })
        .collect()
}

async fn waiting(gate: &Gate) -> f64 {
    admin_sample(
        gate,
        &format!("queuegate_cache_waiting{{route=\"{ROUTE}\"}}"),
    )
    .await
}

#[tokio::test]
async fn an_answer_that_cannot_be_kept_releases_every_waiter_to_the_origin_at_once() {
    const FOLLOWERS: usize = 20;
    let (origin, release, seen) = holding_origin(FOLLOWERS, true).await;
    let gate = cached_gate(&origin, |_, _| {}).await;
    let leader = crowd(&gate, 1).await;
    eventually("the leader reaches the origin", || {
        seen.load(Ordering::SeqCst) == 1
    })
    .await;
    let followers = crowd(&gate, FOLLOWERS).await;
    eventually_async("every follower waits for the leader's fetch", || async {
        waiting(&gate).await == FOLLOWERS as f64
    })
    .await;
    assert_eq!(seen.load(Ordering::SeqCst), 1, "nobody but the leader went");
    release.notify_one();
    // The origin holds each follower until all of them are in flight: they
    // get through only if they were let go together.
    let answers = tokio::time::timeout(
        Duration::from_secs(20),
        futures_util::future::join_all(leader.into_iter().chain(followers)),
    )
    .await
    .expect("the waiters reached the origin together, not one after another");
    for answer in answers {
        let (parts, body) = answer.unwrap();
        assert_eq!((parts.status, &body[..]), (StatusCode::OK, &b"mine"[..]));
        assert!(parts.headers.get("age").is_none());
    }
    assert_eq!(seen.load(Ordering::SeqCst), 1 + FOLLOWERS);
    assert_eq!(cache_count(&gate, "coalesced").await, 0.0);
    assert_eq!(waiting(&gate).await, 0.0);
}

#[tokio::test]
async fn waiters_get_the_answer_when_the_client_fetching_it_hangs_up() {
    const FOLLOWERS: usize = 10;
    let (origin, release, seen) = holding_origin(1, false).await;
    let gate = cached_gate(&origin, |_, _| {}).await;
    let cookie = admitted(&gate).await;
    // The leader's client sends its request by hand (for the same host as
    // the others) and hangs up once the origin has it.
    let mut leader = KeepAlive::connect(gate.addr).await;
    let head = format!(
        "GET /seats/mine HTTP/1.1\r\nHost: {}\r\nCookie: {cookie}\r\n\r\n",
        gate.addr
    );
    let sent = tokio::spawn(async move {
        leader.send(head.as_bytes()).await;
    });
    eventually("the leader reaches the origin", || {
        seen.load(Ordering::SeqCst) == 1
    })
    .await;
    sent.abort();
    let _ = sent.await;
    let followers = crowd(&gate, FOLLOWERS).await;
    eventually_async("every follower waits for the fetch", || async {
        waiting(&gate).await == FOLLOWERS as f64
    })
    .await;
    release.notify_one();
    for follower in followers {
        let (parts, body) = follower.await.unwrap();
        assert_eq!((parts.status, &body[..]), (StatusCode::OK, &b"mine"[..]));
    }
    assert_eq!(seen.load(Ordering::SeqCst), 1, "one origin request for all");
    assert_eq!(cache_count(&gate, "coalesced").await, FOLLOWERS as f64);
}

#[tokio::test]
async fn a_waiting_visitor_gets_the_waiting_answer_never_the_cached_page() {
    let (origin, asked) = seat_origin().await;
    let gate = cached_gate(&origin, |_, r| r.capacity = 1).await;
    let cookie = admitted(&gate).await;
    let (_, page) = ask(&gate, "GET", "/seats/1", &cookie, &[]).await;
    assert_eq!(page, "seats /seats/1 #1");
    let mut newcomer = Visitor::new();
    let answer = newcomer.fetch(&gate.url("/seats/1")).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.headers["x-queuegate"], "waiting");
    assert_eq!(answer.json()["state"], "waiting");
    let answer = newcomer.navigate(&gate.url("/seats/1")).await;
    assert_eq!(answer.status, StatusCode::FOUND);
    assert!(answer.location().unwrap().contains("/__queuegate/waiting"));
    assert_ne!(answer.body, page);
    assert_eq!(asked.count("/seats/1"), 1);
    assert_eq!(cache_count(&gate, "hit").await, 0.0);
}

/// A key file and a config file in a temp dir, rewritten by reloads.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("k1.key"), queuegate::admission::keygen()).unwrap();
        Files { dir }
    }

    fn config(&self) -> std::path::PathBuf {
        self.dir.path().join("queuegate.yaml")
    }

    /// The config of route `seats` in front of `origin` with `cache`
    /// (none when empty).
    fn write(&self, origin: &Origin, cache: &str) {
        let key = self.dir.path().join("k1.key");
        let text = format!(
            "listen: [{{ addr: 127.0.0.1:0 }}]\nupstream: {{ url: {} }}\nkeys: [{{ id: k1, file: {} }}]\n\
             routes:\n  - name: seats\n    match: {{ path_prefix: /seats }}\n    capacity: 100\n{cache}",
            origin.url(),
            key.display()
        );
        std::fs::write(self.config(), text).unwrap();
    }
}

#[tokio::test]
async fn a_reload_changing_ttl_applies_to_new_entries_and_removing_the_cache_drops_them() {
    let (origin, asked) = seat_origin().await;
    let files = Files::new();
    files.write(&origin, "    cache: { ttl: 60s }\n");
    let config = Config::load(&files.config()).unwrap();
    let ring = queuegate::admission::KeyRing::load(&config.keys).unwrap();
    let (trigger, reloads) = queuegate::reload::channel();
    let options = RunOptions {
        config_path: Some(files.config()),
        reloads: Some(reloads),
    };
    let gate = spawn_gate_opts(config, ring, options).await;
    let cookie = admitted(&gate).await;
    ask(&gate, "GET", "/seats/old", &cookie, &[]).await;
    let reloaded = |n: f64| {
        let gate = &gate;
        async move { admin_sample(gate, "queuegate_config_reloads_total{result=\"ok\"}").await == n }
    };
    files.write(&origin, "    cache: { ttl: 1s }\n");
    trigger.reload();
    eventually_async("the 1 s ttl is applied", || reloaded(1.0)).await;
    ask(&gate, "GET", "/seats/new", &cookie, &[]).await;
    // The entry written after the reload expires within its second; the one
    // written before keeps its minute.
    eventually_async("the new entry expires", || async {
        ask(&gate, "GET", "/seats/new", &cookie, &[]).await;
        asked.count("/seats/new") == 2
    })
    .await;
    let (old, body) = ask(&gate, "GET", "/seats/old", &cookie, &[]).await;
    assert_eq!(body, "seats /seats/old #1");
    assert!(old.headers.contains_key("age"));
    assert_eq!(asked.count("/seats/old"), 1);
    files.write(&origin, "");
    trigger.reload();
    eventually_async("the cache is taken out", || reloaded(2.0)).await;
    let (_, body) = ask(&gate, "GET", "/seats/old", &cookie, &[]).await;
    assert_eq!(body, "seats /seats/old #2");
    assert_eq!(admin_sample(&gate, "queuegate_cache_bytes").await, 0.0);
    // Put back, it starts empty.
    files.write(&origin, "    cache: { ttl: 60s }\n");
    trigger.reload();
    eventually_async("the cache is put back", || reloaded(3.0)).await;
    assert_eq!(
        ask(&gate, "GET", "/seats/old", &cookie, &[]).await.1,
        "seats /seats/old #3"
    );
    gate.stop().await.unwrap();
}

#[test]
fn check_names_each_bad_cache_field_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queuegate.yaml");
    std::fs::write(
        &path,
        "listen: [{ addr: 127.0.0.1:8080 }]\nupstream: { url: http://127.0.0.1:3000 }\n\
         keys: [{ id: k1, env: QG_TEST_KEY }]\nlimits: { cache_bytes: 1KiB }\n\
         bypass: [{ path_prefix: /static/, cache: { ttl: 0s } }]\n\
         routes:\n  - name: seats\n    match: { path_prefix: /seats }\n    capacity: 10\n\
         \x20   cache: { max_entries: 0, max_body: 1.5MiB }\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_queuegate"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for (field, line) in [
        ("limits.cache_bytes", 4),
        ("bypass[0].cache.ttl", 5),
        ("routes[0].cache.max_entries", 10),
        ("routes[0].cache.max_body", 10),
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains(field) && l.contains(&format!("line {line}"))),
            "{field} at line {line}: {stderr}"
        );
    }
}

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc");
    kb * 1024
}

#[tokio::test]
async fn ten_thousand_distinct_keys_stay_within_max_entries_and_cache_bytes() {
    const KEYS: usize = 10_000;
    const BODY: usize = 32 << 10;
    const CACHE_BYTES: u64 = 16 << 20;
    let origin = spawn_origin(|_req| async { Response::new(full(vec![b's'; BODY])) }).await;
    let mut file = tempfile::NamedTempFile::new().unwrap();
    write!(
        file,
        "listen: [{{ addr: \"127.0.0.1:0\" }}]\nadmin: {{ addr: \"127.0.0.1:0\" }}\n\
         upstream: {{ url: \"{}\" }}\nkeys: [{{ id: k1, env: QG_TEST_KEY }}]\n\
         limits: {{ cache_bytes: 16MiB }}\nroutes:\n\
         \x20 - {{ name: seats, match: {{ path_prefix: /seats }}, capacity: 100, cache: {{ ttl: 60s, max_entries: 100 }} }}\n\
         \x20 - {{ name: maps, match: {{ path_prefix: /maps }}, capacity: 100, cache: {{ ttl: 60s, max_entries: 1000000 }} }}\n",
        origin.url()
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_queuegate"));
    cmd.args(["run", "-c"])
        .arg(file.path())
        .env("QG_TEST_KEY", queuegate::admission::keygen())
        .stdout(Stdio::null());
    let child = Process::start(cmd, true).await;
    let mut v = Visitor::new();
    assert!(v.fetch(&child.url("/seats/0")).await.reached_origin());
    assert!(v.fetch(&child.url("/maps/0")).await.reached_origin());
    let cookie = cookie_of(&v);
    let bytes = || async {
        let (_, body) = get(&child.admin_url("/metrics")).await;
        sample(std::str::from_utf8(&body).unwrap(), "queuegate_cache_bytes")
    };
    let before = rss(child.pid());
    // One pooled client, 16 requests at a time.
    let client = client::<Full<Bytes>>();
    let fill = |prefix: &'static str| {
        let tasks = (0..16).map(|t| {
            let (client, cookie, base) = (client.clone(), cookie.clone(), child.url(prefix));
            tokio::spawn(async move {
                for i in (t..KEYS).step_by(16) {
                    let req = Request::get(format!("{base}{i}?k={i}"))
                        .header("cookie", &cookie)
                        .body(Full::new(Bytes::new()))
                        .unwrap();
                    let resp = client.request(req).await.unwrap();
                    assert_eq!(resp.status(), StatusCode::OK);
                    let body = http_body_util::BodyExt::collect(resp.into_body())
                        .await
                        .unwrap();
                    assert_eq!(body.to_bytes().len(), BODY);
                }
            })
        });
        futures_util::future::join_all(tasks)
    };
    for done in fill("/seats/").await {
        done.unwrap();
    }
    // 100 entries of a 32 KiB page and its head: about 3.4 MB, once moka
    // has evicted what went over (it does as it goes, and the sweep every
    // second finishes).
    let bound = 100.0 * 34.0 * 1024.0;
    eventually_async("the seats cache is down to 100 entries", || async {
        let held = bytes().await;
        held > 0.0 && held <= bound
    })
    .await;
    for done in fill("/maps/").await {
        done.unwrap();
    }
    let held = bytes().await;
    assert!(
        held <= CACHE_BYTES as f64 && held > (CACHE_BYTES / 2) as f64,
        "the caches hold {held} bytes"
    );
    // 20,000 pages of 32 KiB went through: 640 MiB if they were all kept.
    let grown = rss(child.pid()).saturating_sub(before);
    eprintln!("resident memory grew by {} KiB", grown >> 10);
    assert!(
        grown < 64 << 20,
        "resident memory grew by {} MiB",
        grown >> 20
    );
    let (code, log) = child.stop();
    assert_eq!(code, 0, "{log}");
}
