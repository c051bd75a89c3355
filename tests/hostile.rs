//! The hostile corpus: requests a client writes by hand to get around the
//! line, sent as raw bytes on a real socket (so a missing or repeated
//! `Host`, a backslash or an odd target reach queuegate as written), each
//! with what the client must get and what the origin must see. `/tickets`
//! has capacity 1 and someone holds it, so any request let through ungated
//! shows at the origin. The store-dependent corpora run against the memory
//! store and a real `redis-server`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use http::{HeaderMap, Request, Response, StatusCode};
use queuegate::admission::{KeyRing, Kind};
use queuegate::config::{
    AmbiguousPaths, Backend, BypassRule, Config, HostPattern, Mode, RouteMatch, StoreConfig,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the origin saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    target: String,
    headers: HeaderMap,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// An origin that answers 200 and keeps the target and headers it saw.
async fn recording_origin() -> (Origin, Log) {
    let seen: Log = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let origin = spawn_origin(move |req: Request<hyper::body::Incoming>| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(Seen {
                target: req.uri().to_string(),
                headers: req.headers().clone(),
            });
            Response::new(full("origin"))
        }
    })
    .await;
    (origin, seen)
}

/// What a raw exchange got back: status and head.
#[derive(Debug)]
struct Raw {
    status: u16,
    head: String,
}

impl Raw {
    /// The `x-queuegate` tag, if queuegate answered.
    fn tag(&self) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("x-queuegate")
                .then_some(value.trim())
        })
    }
}

/// Writes `request` on a new connection and reads until queuegate closes
/// it (every request in the corpus asks for that, or is HTTP/1.0).
async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> Raw {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
        .await
        .expect("queuegate answers and closes within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let head = text.split("\r\n\r\n").next().unwrap_or_default().to_owned();
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    Raw { status, head }
}

/// `GET target` on HTTP/1.1 with `Host: gate.test`, `extra` header lines
/// (each ending in CRLF) and `Connection: close`.
fn get(target: &str, extra: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: gate.test\r\n{extra}Connection: close\r\n\r\n")
        .into_bytes()
}

/// What a case must come to.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Held back by the gate: `503` with the waiting answer (the corpus
    /// sends no navigation headers); the origin sees nothing.
    Held,
    /// Refused by queuegate with this status and tag; the origin sees nothing.
    Refused(u16, &'static str),
    /// Forwarded: the origin's answer, and it saw exactly this target.
    Forwarded(&'static str),
}

struct Case {
    name: &'static str,
    request: Vec<u8>,
    expect: Expect,
}

fn case(name: &'static str, request: Vec<u8>, expect: Expect) -> Case {
    Case {
        name,
        request,
        expect,
    }
}

/// A running gate in front of a recording origin, with `/tickets`
/// (capacity 1) held by a confirmed visitor.
struct Held {
    gate: Gate,
    seen: Log,
    _origin: Origin,
    /// The holder's first pass (`n`: admitted at once, not yet confirmed).
    first_pass: String,
    /// The visitor holding the slot, with its confirmed pass.
    holder: Visitor,
}

/// The config of the corpus: `/tickets` (capacity 1), `/elsewhere`, a
/// `queue_all` route for host `shop.example`, and a `/static/` bypass.
fn corpus_config(origin: &str, store: &StoreConfig) -> Config {
    let mut config = proxy_config(origin);
    config.store = store.clone();
    config.routes.push(route("tickets", "/tickets", 1));
    config.routes.push(route("elsewhere", "/elsewhere", 100));
    let mut shop = route("shop", "/", 100);
    shop.matcher = RouteMatch {
        host: Some("shop.example".into()),
        path_prefix: None,
        case_insensitive: false,
    };
    shop.mode = Mode::QueueAll;
    config.routes.push(shop);
    config
        .bypass
        .push(BypassRule::PathPrefix("/static/".into()).into());
    config
}

async fn held(store: &StoreConfig, tweak: impl FnOnce(&mut Config)) -> Held {
    let (origin, seen) = recording_origin().await;
    let mut config = corpus_config(&origin.url(), store);
    tweak(&mut config);
    let gate = spawn_gate_with(config, ring("k1")).await;
    // The holder names a host every corpus allows.
    let mut holder = Visitor::new();
    let visit = || {
        Request::get(gate.url("/tickets"))
            .header("host", "www.shop.example")
            .header("accept", "text/html")
            .header("sec-fetch-mode", "navigate")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    let a = holder.request(visit()).await;
    assert!(a.reached_origin(), "the holder is admitted: {a:?}");
    let first_pass = holder.cookie("qg_tickets").unwrap().to_owned();
    assert!(first_pass.starts_with("v1.n.tickets."), "{first_pass}");
    // Coming back confirms the session: it holds the slot for session_ttl.
    assert!(holder.request(visit()).await.reached_origin());
    seen.lock().unwrap().clear();
    Held {
        gate,
        seen,
        _origin: origin,
        first_pass,
        holder,
    }
}

impl Held {
    /// Runs every case and checks what the client got and the origin saw.
    async fn run(&self, corpus: &str, cases: &[Case]) {
        for c in cases {
            self.seen.lock().unwrap().clear();
            let got = exchange(self.gate.addr, &c.request).await;
            let seen: Vec<String> = self
                .seen
                .lock()
                .unwrap()
                .iter()
                .map(|s| s.target.clone())
                .collect();
            let what = format!("{corpus}: {}: got {got:?}, origin saw {seen:?}", c.name);
            match c.expect {
                Expect::Held => {
                    assert_eq!(got.status, 503, "{what}");
                    assert_eq!(got.tag(), Some("waiting"), "{what}");
                    assert!(seen.is_empty(), "{what}");
                }
                Expect::Refused(status, tag) => {
                    assert_eq!(got.status, status, "{what}");
                    assert_eq!(got.tag(), Some(tag), "{what}");
                    assert!(seen.is_empty(), "{what}");
                }
                Expect::Forwarded(target) => {
                    assert_eq!(got.status, 200, "{what}");
                    assert_eq!(got.tag(), None, "{what}");
                    assert_eq!(seen, [target], "{what}");
                }
            }
        }
    }

    /// The headers the origin saw on the one request `request` sent.
    async fn origin_headers(&self, request: &[u8]) -> HeaderMap {
        self.seen.lock().unwrap().clear();
        let got = exchange(self.gate.addr, request).await;
        assert_eq!(got.status, 200, "{got:?}");
        let seen = self.seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        seen[0].headers.clone()
    }
}

/// Spellings an origin could read as a gated path, and what gets them
/// under `ambiguous_paths: reject` and under `gate`.
fn path_cases(mode: AmbiguousPaths) -> Vec<Case> {
    use Expect::*;
    let ambiguous = match mode {
        AmbiguousPaths::Reject => Refused(400, "ambiguous-path"),
        AmbiguousPaths::Gate => Held,
    };
    let mut cases = vec![
        // Read as `/tickets/index.html` by WSGI.
        ("encoded slash", "/tickets%2Findex.html", ambiguous),
        (
            "lower-case encoded slash",
            "/tickets%2findex.html",
            ambiguous,
        ),
        (
            "bypass then an encoded slash",
            "/static/..%2ftickets/index.html",
            ambiguous,
        ),
        // Read as `/tickets` by Java containers: gated whatever the mode.
        ("matrix parameter", "/tickets;x=1", Held),
        ("matrix parameter below", "/tickets;jsessionid=1/a", Held),
        ("dot-dot with a parameter", "/tickets/..;/tickets", Held),
        ("dot-dot-semicolon", "/x/..;/tickets", Held),
        // Tomcat drops `;params` where a `;` is written, then decodes: a
        // `%3b` stays in a segment's name, a level `..` takes back. Each
        // is `/tickets/1` to Tomcat: gated whatever the mode.
        (
            "an encoded semicolon as a name",
            "/%74ickets;x/%3b/..;/1",
            Held,
        ),
        (
            "parameters dropped before decoding",
            "/%74ickets;x/a/%3b/..;/..;/1",
            Held,
        ),
        (
            "parameters dropped before decoding, encoded dots",
            "/%74ickets;y/a/..;x/%3bx/%2e%2e;/1",
            Held,
        ),
        (
            "parameters dropped before decoding, encoded letters",
            "/%74ickets;x/%61/%3B/%2e.;/..;x/%31",
            Held,
        ),
        // RFC 3986 (and Jetty) keep the empty segment of `//`, and `..`
        // takes it back: `/tickets/seat`.
        (
            "an empty segment dot-dot takes back",
            "/tickets//../seat",
            Held,
        ),
        // Readings in a bypass and a route: refused, or gated.
        (
            "a bypass one reading leaves",
            "/static/..;/tickets",
            ambiguous,
        ),
        // Readings in two routes: no one route can gate it.
        (
            "two routes by two readings",
            "/elsewhere/..;/tickets",
            Refused(400, "ambiguous-path"),
        ),
        // IIS reads `\` as `/`.
        ("backslash", "/tickets\\index.html", ambiguous),
        ("encoded backslash", "/tickets%5cindex.html", ambiguous),
        (
            "upper-case encoded backslash",
            "/tickets%5Cindex.html",
            ambiguous,
        ),
        // Decoded twice on the way: `/tickets`.
        ("double-encoded letter", "/%2574ickets", Held),
        ("encoded letters", "/%74%69%63%6B%65%74%73", Held),
        ("mixed-case hex letters", "/%74%69%63%6b%65%74%73/x", Held),
        ("encoded dot segment", "/x/%2e%2e/tickets", ambiguous),
        ("mixed-case encoded dots", "/x/%2E%2e/tickets", ambiguous),
        (
            "double-encoded dot segment",
            "/x/%252e%252e/tickets",
            ambiguous,
        ),
        // Overlong UTF-8 for `/` (read as a slash by old decoders).
        ("overlong slash", "/x%C0%AF..%C0%AFtickets", ambiguous),
        (
            "overlong slash after the prefix",
            "/tickets%C0%AFx",
            ambiguous,
        ),
        // A NUL ends the path for C-based origins.
        ("NUL", "/tickets%00.css", ambiguous),
        ("NUL after a bypass", "/static/%00/../../tickets", ambiguous),
        // A written dot segment is resolved before matching, like the
        // origin does: gated under either mode.
        ("bypass then dot-dot", "/static/../tickets", Held),
        (
            "bypass then dot then dot-dot",
            "/static/./../tickets/x",
            Held,
        ),
        ("repeated slashes", "//tickets", Held),
        // Controls: passed through untouched, byte for byte.
        (
            "bypassed asset",
            "/static/app.css",
            Forwarded("/static/app.css"),
        ),
        (
            "bypassed asset with a query",
            "/static/app.css?v=%2F..",
            Forwarded("/static/app.css?v=%2F.."),
        ),
        (
            "a name that only starts like the route",
            "/ticketsale",
            Forwarded("/ticketsale"),
        ),
        (
            "an ordinary page",
            "/other/thing",
            Forwarded("/other/thing"),
        ),
    ];
    match mode {
        // An encoded slash is refused wherever it is.
        AmbiguousPaths::Reject => {
            cases.push(("encoded slash elsewhere", "/other%2Fthing", ambiguous));
        }
        // No reading of it matches a route and none is bypassed: forwarded
        // as the client wrote it.
        AmbiguousPaths::Gate => cases.push((
            "encoded slash elsewhere",
            "/other%2Fthing",
            Forwarded("/other%2Fthing"),
        )),
    }
    cases
        .into_iter()
        .map(|(name, target, expect)| case(name, get(target, ""), expect))
        .collect()
}

/// Spellings of the `queue_all` route's host, and malformed hosts.
fn host_cases() -> Vec<Case> {
    use Expect::*;
    let with_host = |host: &str| {
        format!("GET /shop HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into_bytes()
    };
    vec![
        case("the route's host", with_host("shop.example"), Held),
        case("a trailing dot", with_host("shop.example."), Held),
        case("upper case and a port", with_host("SHOP.example:80"), Held),
        case(
            "dot, port and upper case",
            with_host("Shop.Example.:8080"),
            Held,
        ),
        case("two trailing dots", with_host("shop.example.."), Refused(400, "bad-host")),
        case("two ports", with_host("shop.example:80:80"), Refused(400, "bad-host")),
        case("user info", with_host("x@shop.example"), Refused(400, "bad-host")),
        case("empty label", with_host("shop..example"), Refused(400, "bad-host")),
        case(
            "no Host on HTTP/1.1",
            b"GET /shop HTTP/1.1\r\nConnection: close\r\n\r\n".to_vec(),
            Refused(400, "bad-host"),
        ),
        case(
            "two Host headers",
            b"GET /shop HTTP/1.1\r\nHost: other.example\r\nHost: shop.example\r\nConnection: close\r\n\r\n".to_vec(),
            Refused(400, "bad-host"),
        ),
        case(
            "the same Host twice",
            b"GET /shop HTTP/1.1\r\nHost: shop.example\r\nHost: shop.example\r\nConnection: close\r\n\r\n".to_vec(),
            Refused(400, "bad-host"),
        ),
        // The target's authority names the host (RFC 9112 §3.2.2); a Host
        // that says otherwise could be read by the origin instead.
        case(
            "absolute target for the host",
            b"GET http://shop.example/shop HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n".to_vec(),
            Held,
        ),
        case(
            "absolute target for another host, Host the route's",
            b"GET http://other.example/shop HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n".to_vec(),
            Refused(400, "bad-host"),
        ),
        case(
            "absolute target for the route's host, Host another",
            b"GET http://shop.example/shop HTTP/1.1\r\nHost: other.example\r\nConnection: close\r\n\r\n".to_vec(),
            Refused(400, "bad-host"),
        ),
        // Forwarded headers from an untrusted peer name no host.
        case(
            "X-Forwarded-Host of the route",
            b"GET /shop HTTP/1.1\r\nHost: other.example\r\nX-Forwarded-Host: shop.example\r\nConnection: close\r\n\r\n".to_vec(),
            Forwarded("/shop"),
        ),
        // HTTP/1.0 may name no host: no host route matches it.
        case(
            "HTTP/1.0 without Host",
            b"GET /shop HTTP/1.0\r\n\r\n".to_vec(),
            Forwarded("/shop"),
        ),
        case(
            "HTTP/1.0 with the route's host",
            b"GET /shop HTTP/1.0\r\nHost: shop.example.\r\n\r\n".to_vec(),
            Held,
        ),
        case("another host", with_host("other.example"), Forwarded("/shop")),
    ]
}

/// Hosts under `limits.allowed_hosts: [shop.example, "*.shop.example"]`.
fn allowed_host_cases() -> Vec<Case> {
    use Expect::*;
    let at = |host: &str, target: &str| {
        format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into_bytes()
    };
    vec![
        case("an allowed host", at("SHOP.example.:80", "/shop"), Held),
        case("below the allowed", at("www.shop.example", "/page"), Forwarded("/page")),
        case("another host", at("other.example", "/page"), Refused(421, "misdirected")),
        case("a look-alike", at("evilshop.example", "/page"), Refused(421, "misdirected")),
        case("an address", at("127.0.0.1", "/page"), Refused(421, "misdirected")),
        case(
            "another host on a gated path",
            at("other.example", "/tickets"),
            Refused(421, "misdirected"),
        ),
        case(
            "HTTP/1.0 without Host",
            b"GET /page HTTP/1.0\r\n\r\n".to_vec(),
            Refused(421, "misdirected"),
        ),
        case(
            "absolute target for another host",
            b"GET http://other.example/page HTTP/1.1\r\nHost: other.example\r\nConnection: close\r\n\r\n".to_vec(),
            Refused(421, "misdirected"),
        ),
    ]
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Passes a client may replay or forge, on the held route.
async fn cookie_cases(held: &Held) -> Vec<Case> {
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let gate = &held.gate;
    // A genuine pass for another route.
    let mut elsewhere = Visitor::new();
    assert!(elsewhere
        .navigate(&gate.url("/elsewhere"))
        .await
        .reached_origin());
    let other_route = elsewhere.cookie("qg_elsewhere").unwrap().to_owned();
    // A genuine ticket.
    let mut waiter = Visitor::new();
    let a = waiter.navigate(&gate.url("/tickets")).await;
    assert_eq!(a.status, StatusCode::FOUND);
    let ticket = waiter.cookie("qg_tickets").unwrap().to_owned();
    held.seen.lock().unwrap().clear();

    let ring = ring("k1");
    let now = now_ms();
    // Signed with the real key, but expired a second ago: the store never
    // held its session, and it was issued after the line began.
    let expired = ring.sign_at(Kind::Pass, "tickets", &[5u8; 16], now / 1000 - 1, Some(now));
    // The same as an `n` pass.
    let expired_new = ring.sign_at(
        Kind::NewPass,
        "tickets",
        &[6u8; 16],
        now / 1000 - 1,
        Some(now),
    );
    // Another key that calls itself `k1`.
    let impostor = KeyRing::new(vec![("k1".into(), vec![9u8; 32])]).unwrap();
    let forged = impostor.sign_at(
        Kind::Pass,
        "tickets",
        &[7u8; 16],
        now / 1000 + 3600,
        Some(now),
    );
    let zero_mac = format!(
        "v1.a.tickets.{}.{}.k1.{}",
        b64(&[8u8; 16]),
        now / 1000 + 3600,
        b64(&[0u8; 32])
    );
    let relabelled_pass = held.first_pass.replacen("v1.n.", "v1.a.", 1);
    let relabelled_ticket = ticket.replacen("v1.w.", "v1.a.", 1);
    let renamed = other_route.replacen(".elsewhere.", ".tickets.", 1);
    let with_cookie = |cookie: String| get("/tickets/seat", &format!("Cookie: {cookie}\r\n"));
    use Expect::*;
    vec![
        case(
            "forged with another key",
            with_cookie(format!("qg_tickets={forged}")),
            Held,
        ),
        case(
            "forged mac",
            with_cookie(format!("qg_tickets={zero_mac}")),
            Held,
        ),
        case(
            "expired pass",
            with_cookie(format!("qg_tickets={expired}")),
            Held,
        ),
        case(
            "expired n pass",
            with_cookie(format!("qg_tickets={expired_new}")),
            Held,
        ),
        case(
            "another route's pass",
            with_cookie(format!("qg_tickets={other_route}")),
            Held,
        ),
        case(
            "another route's pass renamed",
            with_cookie(format!("qg_tickets={renamed}")),
            Held,
        ),
        case(
            "another route's pass under its own name",
            with_cookie(format!("qg_elsewhere={other_route}")),
            Held,
        ),
        case(
            "n pass relabelled a",
            with_cookie(format!("qg_tickets={relabelled_pass}")),
            Held,
        ),
        case(
            "ticket relabelled a",
            with_cookie(format!("qg_tickets={relabelled_ticket}")),
            Held,
        ),
        case(
            "the waiter's own ticket",
            with_cookie(format!("qg_tickets={ticket}")),
            Held,
        ),
        case(
            "a bad copy before the ticket",
            with_cookie(format!("qg_tickets={zero_mac}; qg_tickets={ticket}")),
            Held,
        ),
    ]
}

/// The holder's pass, kept after it left and someone else took the slot:
/// the instance that took the leave refuses it at once, before the pass is
/// half through its life (on a shared store other instances learn it within
/// a tick; on the memory store nothing else would tell).
async fn given_up_cases(held: &mut Held) -> Vec<Case> {
    let Held {
        gate, seen, holder, ..
    } = held;
    let pass = holder.cookie("qg_tickets").unwrap().to_owned();
    assert!(pass.starts_with("v1.a.tickets."), "{pass}");
    assert_eq!(holder.leave(gate, "tickets").await.status, StatusCode::OK);
    let mut next = Visitor::new();
    assert!(
        next.navigate(&gate.url("/tickets")).await.reached_origin(),
        "the freed slot is taken"
    );
    seen.lock().unwrap().clear();
    vec![case(
        "the pass of a holder who left",
        get("/tickets/seat", &format!("Cookie: qg_tickets={pass}\r\n")),
        Expect::Held,
    )]
}

/// Runs every store-dependent corpus on a gate with `store`; `reset`
/// empties the store between gates.
async fn corpus(store: StoreConfig, reset: impl Fn()) {
    for mode in [AmbiguousPaths::Reject, AmbiguousPaths::Gate] {
        reset();
        let h = held(&store, |c| c.limits.ambiguous_paths = mode).await;
        h.run(&format!("paths ({mode:?})"), &path_cases(mode)).await;
        h.gate.stop().await.unwrap();
    }

    reset();
    let h = held(&store, |_| {}).await;
    h.run("hosts", &host_cases()).await;
    let cases = cookie_cases(&h).await;
    h.run("cookies", &cases).await;
    h.gate.stop().await.unwrap();

    reset();
    let mut h = held(&store, |_| {}).await;
    let cases = given_up_cases(&mut h).await;
    h.run("given up", &cases).await;
    h.gate.stop().await.unwrap();

    reset();
    let h = held(&store, |c| {
        c.limits.allowed_hosts = vec![
            HostPattern::parse("shop.example").unwrap(),
            HostPattern::parse("*.shop.example").unwrap(),
        ];
    })
    .await;
    h.run("allowed hosts", &allowed_host_cases()).await;
    h.gate.stop().await.unwrap();
}

#[tokio::test]
async fn the_corpus_against_the_memory_store() {
    corpus(proxy_config("http://127.0.0.1:1").store, || {}).await;
}

#[tokio::test]
async fn the_corpus_against_redis() {
    let redis = RedisServer::start();
    let store = StoreConfig {
        backend: Backend::Redis,
        redis: redis.config(Duration::from_secs(2)),
        memory: Default::default(),
        expected_instances: 1,
    };
    corpus(store, || {
        let _: () = redis.query(&["FLUSHALL"]);
    })
    .await;
}

/// A client's forwarding headers, from a peer that is not trusted: none
/// reaches the origin as sent.
#[tokio::test]
async fn forwarding_headers_of_an_untrusted_peer_never_reach_the_origin() {
    let h = held(&proxy_config("http://127.0.0.1:1").store, |_| {}).await;
    let lies = "X-Forwarded-Host: evil.example\r\n\
                X-Forwarded-Host: evil2.example\r\n\
                X-Forwarded-Proto: https\r\n\
                X-Forwarded-For: 198.51.100.9\r\n\
                X-Forwarded-For: 203.0.113.1, 198.51.100.10\r\n\
                Forwarded: for=198.51.100.9;host=evil.example;proto=https\r\n\
                X-Real-IP: 198.51.100.9\r\n";
    let at = h.origin_headers(&get("/page", lies)).await;
    assert_eq!(at["x-forwarded-host"], "gate.test");
    assert_eq!(at.get_all("x-forwarded-host").iter().count(), 1);
    assert_eq!(at["x-forwarded-proto"], "http");
    assert_eq!(at["x-forwarded-for"], "127.0.0.1");
    assert_eq!(at.get_all("x-forwarded-for").iter().count(), 1);
    assert_eq!(at["x-real-ip"], "127.0.0.1");
    assert_eq!(at.get_all("x-real-ip").iter().count(), 1);
    assert!(at.get("forwarded").is_none(), "{at:?}");
    assert_eq!(at["host"], "gate.test");

    // HTTP/1.0 without Host: no host of its own, and none it names.
    let at = h
        .origin_headers(
            format!("GET /page HTTP/1.0\r\n{lies}\r\n")
                .replace("\n\n", "\n")
                .as_bytes(),
        )
        .await;
    assert!(at.get("x-forwarded-host").is_none(), "{at:?}");
    assert!(at.get("forwarded").is_none(), "{at:?}");
    assert_eq!(at["x-forwarded-for"], "127.0.0.1");
    assert_eq!(at["x-real-ip"], "127.0.0.1");

    // Naming the route's host in forwarding headers does not gate or
    // ungate anything: the route is chosen by Host alone.
    let at = h
        .origin_headers(&get(
            "/tickets-not",
            "X-Forwarded-Host: shop.example\r\nForwarded: host=shop.example\r\n",
        ))
        .await;
    assert_eq!(at["x-forwarded-host"], "gate.test");
    h.run(
        "forwarded headers",
        &[case(
            "gated path with a trusted-looking X-Forwarded-For",
            get(
                "/tickets",
                "X-Forwarded-For: 127.0.0.1\r\nX-Real-IP: 127.0.0.1\r\n",
            ),
            Expect::Held,
        )],
    )
    .await;
}

/// From a trusted peer the same headers are believed and passed on
/// (docs/design.md §10), `X-Forwarded-For` with the peer appended and
/// `X-Real-IP` set to the client they name.
#[tokio::test]
async fn forwarding_headers_of_a_trusted_peer_reach_the_origin() {
    let h = held(&proxy_config("http://127.0.0.1:1").store, |c| {
        c.client_ip.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    })
    .await;
    let said = "X-Forwarded-Host: shop.example\r\n\
                X-Forwarded-Proto: https\r\n\
                X-Forwarded-For: 203.0.113.1, 198.51.100.10\r\n\
                Forwarded: for=198.51.100.10;host=shop.example;proto=https\r\n\
                X-Real-IP: 203.0.113.1\r\n";
    let at = h.origin_headers(&get("/page", said)).await;
    assert_eq!(at["x-forwarded-host"], "shop.example");
    assert_eq!(at["x-forwarded-proto"], "https");
    assert_eq!(
        at["x-forwarded-for"],
        "203.0.113.1, 198.51.100.10, 127.0.0.1"
    );
    assert_eq!(
        at["forwarded"],
        "for=198.51.100.10;host=shop.example;proto=https"
    );
    // The client is the rightmost untrusted hop, whatever X-Real-IP said.
    assert_eq!(at["x-real-ip"], "198.51.100.10");
    assert_eq!(at.get_all("x-real-ip").iter().count(), 1);
    // What a trusted proxy says passes on, but does not pick the route:
    // `/tickets` is still held.
    h.run(
        "trusted forwarded headers",
        &[case("gated path", get("/tickets", said), Expect::Held)],
    )
    .await;
}

/// `CONNECT` asks for a tunnel to a place of the client's choosing: refused
/// with `405` (naming the methods that are served) over HTTP/1.1 and
/// HTTP/2, and nothing reaches the origin.
#[tokio::test]
async fn connect_is_refused_and_never_forwarded() {
    let h = held(&proxy_config("http://127.0.0.1:1").store, |_| {}).await;
    let refused = Expect::Refused(405, "method-not-allowed");
    h.run(
        "connect",
        &[
            case(
                "authority form",
                b"CONNECT gate.test:443 HTTP/1.1\r\nHost: gate.test:443\r\n\r\n".to_vec(),
                refused,
            ),
            case(
                "the origin's own address, bytes following",
                b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n\
                  GET /tickets HTTP/1.1\r\nHost: gate.test\r\n\r\n"
                    .to_vec(),
                refused,
            ),
            case(
                "a gated path, with a body",
                b"CONNECT /tickets HTTP/1.1\r\nHost: gate.test\r\nContent-Length: 2\r\n\r\nhi"
                    .to_vec(),
                refused,
            ),
        ],
    )
    .await;
    let got = exchange(
        h.gate.addr,
        b"CONNECT gate.test:443 HTTP/1.1\r\nHost: gate.test:443\r\n\r\n",
    )
    .await;
    assert!(
        got.head.to_ascii_lowercase().contains("\r\nallow: get, "),
        "{got:?}"
    );

    // HTTP/2, with prior knowledge: `:method CONNECT` and `:authority` only.
    let stream = tokio::net::TcpStream::connect(h.gate.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let req = Request::builder()
        .method(http::Method::CONNECT)
        .uri("gate.test:443")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED, "{resp:?}");
    assert_eq!(resp.headers()["x-queuegate"], "method-not-allowed");
    assert!(resp.headers().contains_key("allow"), "{resp:?}");
    assert!(
        h.seen.lock().unwrap().is_empty(),
        "the origin saw a CONNECT"
    );
}

/// Blank lines before a pipelined request are CRLF or LF, as httparse (and
/// so hyper) skips them: a lone CR is not one. The bytes after it are
/// refused and never forwarded, so a front proxy that reads them otherwise
/// cannot slip a request past what it saw.
#[tokio::test]
async fn a_lone_cr_before_a_pipelined_request_is_refused_not_forwarded() {
    let (origin, seen) = recording_origin().await;
    let gate = spawn_gate_with(proxy_config(&origin.url()), ring("k1")).await;
    for (gap, forwarded) in [
        (&b"\r"[..], &["/first"][..]),
        (b"\r\n\r\n", &["/first", "/second"]),
        (b"\n", &["/first", "/second"]),
    ] {
        seen.lock().unwrap().clear();
        let request = [
            &b"GET /first HTTP/1.1\r\nHost: gate.test\r\n\r\n"[..],
            gap,
            b"GET /second HTTP/1.1\r\nHost: gate.test\r\nConnection: close\r\n\r\n",
        ]
        .concat();
        let mut stream = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
        stream.write_all(&request).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
            .await
            .expect("queuegate answers and closes within 10 s")
            .unwrap();
        let text = String::from_utf8_lossy(&out);
        let statuses: Vec<&str> = text
            .match_indices("HTTP/1.1 ")
            .map(|(at, _)| &text[at + 9..at + 12])
            .collect();
        let targets: Vec<String> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.target.clone())
            .collect();
        assert_eq!(targets, forwarded, "gap {gap:?}: {text:?}");
        let want = if forwarded.len() == 2 {
            ["200", "200"]
        } else {
            ["200", "400"]
        };
        assert_eq!(statuses, want, "gap {gap:?}: {text:?}");
    }
}
