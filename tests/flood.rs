//! A flood from one address over three queuegate processes on one Redis:
//! per-client limits hold it to its few places whichever instance it hits,
//! honest visitors from other addresses keep their order, the flood's
//! unconfirmed places go after `confirm_within`, and behind a trusted proxy
//! each client it names is limited on its own.

mod common;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Places one client may hold.
const PLACES: usize = 5;
const CAPACITY: usize = 200;

/// The flood's route, after the `client_ip` section under test.
fn rest(client_ip: &str) -> String {
    let route = RouteYaml::tickets(CAPACITY)
        .with("max_admit_per_tick", 20)
        .with("session_ttl", "60s")
        .with("confirm_within", "6s")
        .with("abandon_after", "8s")
        .with(
            "client_limits",
            format!("{{ places: {PLACES}, joins_per_minute: 0 }}"),
        );
    format!("{client_ip}{route}")
}

/// What one exchange got back.
#[derive(Debug)]
struct Raw {
    status: u16,
    head: String,
    body: String,
}

impl Raw {
    /// The `name=value` of the ticket or pass cookie set, if any.
    fn set_cookie(&self) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            if !name.eq_ignore_ascii_case("set-cookie") {
                return None;
            }
            let pair = value.trim().split(';').next()?;
            pair.starts_with("qg_tickets=").then(|| pair.to_owned())
        })
    }
}

/// Sends `request` (which asks for `Connection: close`) from local address
/// `from` (anything in 127/8 is routed to lo on Linux) and reads the answer.
async fn exchange_from(from: Ipv4Addr, to: SocketAddr, request: &str) -> Raw {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    let mut stream = socket.connect(to).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
        .await
        .expect("answered within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Raw {
        status: head[9..12].parse().unwrap(),
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

fn request(method: &str, target: &str, extra: &str) -> String {
    format!(
        "{method} {target} HTTP/1.1\r\nHost: shop.test\r\nAccept: application/json\r\n{extra}Connection: close\r\n\r\n"
    )
}

/// `(waiting, active)` of the route as one instance's admin listener
/// reports it.
async fn counts(at: &Instance) -> (u64, u64) {
    let (_, body) = get(&at.process.admin_url("/routes")).await;
    let routes: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let route = &routes["routes"][0];
    (
        route["waiting"].as_u64().unwrap(),
        route["active"].as_u64().unwrap(),
    )
}

/// Waits until the admin listener of `at` reports `(waiting, active)`,
/// running `meanwhile` between reads; fails after 30 s.
async fn until_counts(at: &Instance, want: (u64, u64), mut meanwhile: impl AsyncFnMut()) {
    let mut last = (0, 0);
    for _ in 0..150 {
        last = counts(at).await;
        if last == want {
            return;
        }
        meanwhile().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the route never reported {want:?} (waiting, active); last {last:?}");
}

/// `n` HEAD requests without a cookie from `from`, spread over the
/// instances, a few at a time; the status of each.
async fn flood(instances: &[Instance], from: Ipv4Addr, n: usize, extra: &str) -> Vec<u16> {
    const WORKERS: usize = 12;
    let addrs: Vec<SocketAddr> = instances.iter().map(|i| i.process.addr).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let addrs = addrs.clone();
        let req = request("HEAD", "/tickets/seat", extra);
        tasks.spawn(async move {
            let mut statuses = Vec::new();
            for i in (w..n).step_by(WORKERS) {
                statuses.push(
                    exchange_from(from, addrs[i % addrs.len()], &req)
                        .await
                        .status,
                );
            }
            statuses
        });
    }
    let mut all = Vec::new();
    while let Some(statuses) = tasks.join_next().await {
        all.extend(statuses.unwrap());
    }
    all
}

/// One honest visitor: its own address and its ticket.
struct Honest {
    from: Ipv4Addr,
    cookie: String,
}

impl Honest {
    /// Polls the status endpoint on `at`: state and position.
    async fn poll(&mut self, at: &Instance) -> (String, u64) {
        let a = exchange_from(
            self.from,
            at.process.addr,
            &request(
                "GET",
                "/__queuegate/status?route=tickets",
                &format!("Cookie: {}\r\n", self.cookie),
            ),
        )
        .await;
        assert_eq!(a.status, 200, "{a:?}");
        if let Some(cookie) = a.set_cookie() {
            self.cookie = cookie;
        }
        let body: serde_json::Value = serde_json::from_str(&a.body).unwrap();
        (
            body["state"].as_str().unwrap().to_owned(),
            body["position"].as_u64().unwrap_or(0),
        )
    }
}

#[tokio::test]
async fn a_flood_from_one_address_holds_its_few_places_and_honest_visitors_keep_their_order() {
    let (_redis, _origin, instances) = three(rest("")).await;

    // The room is filled by 40 households of 5 (127.0.1.1-40), each back
    // once so their sessions are confirmed and hold their slots.
    for h in 1..=(CAPACITY / PLACES) as u8 {
        let from = Ipv4Addr::new(127, 0, 1, h);
        for v in 0..PLACES {
            let at = instances[v % 3].process.addr;
            let a = exchange_from(from, at, &request("GET", "/tickets", "")).await;
            let mut cookie = a.set_cookie().expect("a pass or a ticket");
            // Admissions in a tick window are limited (20 per 50 ms, admit-now
            // included): an arrival past the window's budget waits a tick in
            // line, as the only one there, and is admitted from it.
            if a.status != 200 {
                assert_eq!(a.status, 503, "household {h} visitor {v}: {a:?}");
                let mut admitted = false;
                for _ in 0..100 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let polled = exchange_from(
                        from,
                        at,
                        &request(
                            "GET",
                            "/__queuegate/status?route=tickets",
                            &format!("Cookie: {cookie}\r\n"),
                        ),
                    )
                    .await;
                    if let Some(c) = polled.set_cookie() {
                        cookie = c;
                    }
                    if polled.body.contains("\"state\":\"admitted\"") {
                        admitted = true;
                        break;
                    }
                }
                assert!(admitted, "household {h} visitor {v} never admitted");
            }
            let a = exchange_from(
                from,
                instances[(v + 1) % 3].process.addr,
                &request("GET", "/tickets", &format!("Cookie: {cookie}\r\n")),
            )
            .await;
            assert_eq!(a.status, 200, "household {h} visitor {v} returns: {a:?}");
        }
    }

    // The flood: 1,000 cookie-less requests from 127.0.0.1.
    let statuses = flood(&instances, Ipv4Addr::LOCALHOST, 1_000, "").await;
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for s in &statuses {
        *by_status.entry(*s).or_default() += 1;
    }
    let placed = statuses.iter().filter(|&&s| s != 429).count();
    assert_eq!(statuses.len(), 1_000);
    assert!(
        by_status.keys().all(|s| [200, 302, 503, 429].contains(s)),
        "{by_status:?}"
    );
    assert_eq!(
        placed, PLACES,
        "the flood's answers that were not 429: {by_status:?}"
    );
    // The room is full: the flood waits, it holds no slot.
    assert_eq!(by_status.get(&200), None, "{by_status:?}");
    until_counts(&instances[0], (placed as u64, CAPACITY as u64), async || {}).await;

    // Honest visitors from their own addresses join behind the flood.
    let mut honest = Vec::new();
    for i in 0..10u8 {
        let from = Ipv4Addr::new(127, 0, 0, 2 + i);
        let at = instances[usize::from(i) % 3].process.addr;
        let a = exchange_from(from, at, &request("GET", "/tickets/seat", "")).await;
        assert_eq!(a.status, 503, "honest visitor {i}: {a:?}");
        let mut v = Honest {
            from,
            cookie: a.set_cookie().expect("a ticket"),
        };
        let (state, position) = v.poll(&instances[(usize::from(i) + 1) % 3]).await;
        assert_eq!(state, "waiting");
        assert_eq!(position, (placed + 1 + usize::from(i)) as u64);
        honest.push(v);
    }

    // The flood never came back: its tickets leave after confirm_within.
    // The honest keep polling, on any instance, and move up in their order.
    // (Waiting for the admin's counts instead could stop early: a count
    // read while the honest were joining, five of the flood's and five
    // honest, is 10 too.)
    let mut positions = Vec::new();
    for round in 0..150 {
        positions.clear();
        for (i, v) in honest.iter_mut().enumerate() {
            let (state, position) = v.poll(&instances[(i + round) % 3]).await;
            assert_eq!(state, "waiting");
            positions.push(position);
        }
        if positions.iter().copied().eq(1..=10) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        positions.iter().copied().eq(1..=10),
        "the honest moved up in order once the flood left: {positions:?}"
    );
    until_counts(&instances[1], (10, CAPACITY as u64), async || {}).await;
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_forwarded_client_is_limited_on_its_own() {
    let (_redis, _origin, instances) =
        three(rest("client_ip: { trusted_proxies: [\"127.0.0.1/32\"] }\n")).await;
    for n in 1..=4 {
        let statuses = flood(
            &instances,
            Ipv4Addr::LOCALHOST,
            20,
            &format!("X-Forwarded-For: 198.51.100.{n}\r\n"),
        )
        .await;
        assert_eq!(placed(&statuses), PLACES, "198.51.100.{n}: {statuses:?}");
    }
    // The proxy's own requests are one more client.
    let statuses = flood(&instances, Ipv4Addr::LOCALHOST, 20, "").await;
    assert_eq!(placed(&statuses), PLACES, "{statuses:?}");

    // A peer that is not trusted names no one: whatever it puts in
    // X-Forwarded-For, it is one client.
    let from = Ipv4Addr::new(127, 0, 0, 2);
    let mut statuses = Vec::new();
    for n in 0..20 {
        let extra = format!("X-Forwarded-For: 203.0.113.{n}\r\n");
        let at = instances[n % 3].process.addr;
        statuses.push(
            exchange_from(from, at, &request("HEAD", "/tickets/seat", &extra))
                .await
                .status,
        );
    }
    assert_eq!(placed(&statuses), PLACES, "{statuses:?}");
}

/// How many of a client's 20 arrivals got a place: `PLACES`, and the others
/// `429`. A place is a slot at once (`200`) or, once the route's admissions
/// for the tick window are used up (20 per 50 ms, which a fast machine
/// reaches with these sequential arrivals), a place in line (`503`).
fn placed(statuses: &[u16]) -> usize {
    assert!(
        statuses.iter().all(|s| [200, 503, 429].contains(s)),
        "{statuses:?}"
    );
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!(refused, statuses.len() - PLACES, "{statuses:?}");
    statuses.len() - refused
}
