//! A scheduled opening (DESIGN §8.7) on three queuegate processes sharing one
//! `redis-server`: before it everyone gets a pre-queue ticket and a
//! countdown; at it the pre-queue is shuffled once, whichever instances are
//! up, into an order unrelated to arrival; later arrivals queue behind.

mod common;

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::*;
use futures_util::stream::{self, StreamExt};

const WAITING_KEY: &str = "qg:{tickets}:waiting";
const OPENED_LOG: &str = "opened: the pre-queue was shuffled";

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// `unix_s` as RFC 3339 in UTC.
fn rfc3339(unix_s: u64) -> String {
    queuegate::config::Timestamp::from_unix_s(unix_s)
        .expect("a time after 1970")
        .rfc3339()
}

/// Route `tickets` opening at `opens_at_s`; capacity 1, so the line stays
/// for reading after the opening.
fn opening_at(opens_at_s: u64) -> RouteYaml {
    RouteYaml::tickets(1)
        .with("pass_ttl", "2s")
        .with("max_waiting", 100_000)
        .with("opens_at", format!("\"{}\"", rfc3339(opens_at_s)))
}

/// The store's name for the holder of ticket cookie `value`: the first 12
/// bytes of its id.
fn member_of(value: &str) -> Vec<u8> {
    let id = value.split('.').nth(3).expect("an id field");
    URL_SAFE_NO_PAD.decode(id).expect("base64url")[..12].to_vec()
}

/// The line, head first: (member, score).
fn line(redis: &RedisServer) -> Vec<(Vec<u8>, u64)> {
    redis.query(&["ZRANGE", WAITING_KEY, "0", "-1", "WITHSCORES"])
}

/// Spearman's rank correlation of two rankings of the same n items.
fn spearman(a: &[usize], b: &[usize]) -> f64 {
    let n = a.len() as f64;
    let d2: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

/// Sleeps until `unix_s` (and `extra` more).
async fn until(unix_s: u64, extra: Duration) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let at = Duration::from_secs(unix_s) + extra;
    tokio::time::sleep(at.saturating_sub(now)).await;
}

#[tokio::test]
async fn a_thousand_early_arrivals_are_admitted_in_an_order_unrelated_to_arrival() {
    const EARLY: usize = 1_000;
    const LATE: usize = 30;
    // Whole seconds in the config: at least 4 s to arrive.
    let opens_at_s = now_s() + 7;
    let (redis, _origin, instances) = three(opening_at(opens_at_s)).await;
    assert!(now_s() + 4 <= opens_at_s, "instances started too slowly");

    // A thousand visitors arrive before the opening, over the three
    // instances, and the waiting page polls once (which confirms them).
    let crowd: Vec<Visitor> = stream::iter(0..EARLY)
        .map(|i| {
            let at = &instances[i % 3];
            async move {
                let mut v = Visitor::new();
                let a = v.navigate(&at.url("/tickets/show")).await;
                assert_eq!(a.status, http::StatusCode::FOUND, "visitor {i}");
                let s = status(&mut v, at).await;
                assert_eq!(s["state"], "prequeue", "visitor {i}: {s}");
                v
            }
        })
        .buffer_unordered(24)
        .collect()
        .await;
    assert!(now_s() < opens_at_s, "arrivals took past the opening");
    let mut crowd = crowd;

    // Each holds a pre-queue ticket; refreshing and polling keep it.
    let mut by_member = HashMap::new();
    for (i, v) in crowd.iter().enumerate() {
        let ticket = v.cookie("qg_tickets").expect("a ticket").to_owned();
        assert!(ticket.starts_with("v1.p.tickets."), "{ticket}");
        by_member.insert(member_of(&ticket), i);
    }
    assert_eq!(by_member.len(), EARLY, "one ticket each");
    for (i, v) in crowd.iter_mut().enumerate().take(20) {
        let before = member_of(v.cookie("qg_tickets").unwrap());
        let at = &instances[(i + 1) % 3];
        let a = v.navigate(&at.url("/tickets/show")).await;
        assert_eq!(a.status, http::StatusCode::FOUND);
        let s = status(v, at).await;
        assert_eq!(s["state"], "prequeue");
        assert_eq!(s["opens_at"], rfc3339(opens_at_s));
        let opens_in = s["opens_in_ms"].as_u64().unwrap();
        assert!(opens_in > 0 && opens_in <= 7_000, "{s}");
        let poll = s["poll_after_ms"].as_u64().unwrap();
        assert!(
            poll <= opens_in + 2_000,
            "polls again by 2 s after the opening: {s}"
        );
        assert_eq!(member_of(v.cookie("qg_tickets").unwrap()), before);
    }
    let arrived = line(&redis);
    assert_eq!(
        arrived.len(),
        EARLY,
        "everyone in line, nobody admitted early"
    );
    let arrival_rank: HashMap<Vec<u8>, usize> = arrived
        .iter()
        .enumerate()
        .map(|(rank, (member, _))| (member.clone(), rank))
        .collect();

    // After the opening, latecomers queue behind.
    until(opens_at_s, Duration::from_millis(300)).await;
    let mut late = Vec::new();
    for i in 0..LATE {
        let mut v = Visitor::new();
        let at = &instances[i % 3];
        assert_eq!(
            v.navigate(&at.url("/tickets/show")).await.status,
            http::StatusCode::FOUND
        );
        let ticket = v.cookie("qg_tickets").unwrap().to_owned();
        assert!(ticket.starts_with("v1.w."), "after the opening: {ticket}");
        late.push(member_of(&ticket));
    }

    // The line after the opening: one admitted (capacity 1), the rest in
    // the shuffled order, the latecomers behind them all.
    let after = line(&redis);
    assert_eq!(after.len(), EARLY + LATE - 1);
    let (early_part, late_part) = after.split_at(EARLY - 1);
    assert!(early_part.iter().all(|(m, _)| by_member.contains_key(m)));
    assert_eq!(
        late_part.iter().map(|(m, _)| m.clone()).collect::<Vec<_>>(),
        late,
        "latecomers in their order, behind every early arrival"
    );
    let (before_rank, after_rank): (Vec<usize>, Vec<usize>) = early_part
        .iter()
        .enumerate()
        .map(|(rank, (member, _))| (arrival_rank[member], rank))
        .unzip();
    let rho = spearman(&before_rank, &after_rank);
    println!("Spearman rho between arrival and admission order: {rho:.4}");
    assert!(rho.abs() < 0.1, "order follows arrival: rho {rho}");
    let openings: usize = instances
        .iter()
        .map(|i| i.process.log().matches(OPENED_LOG).count())
        .sum();
    assert_eq!(openings, 1, "one instance ran the opening, once");

    // A pre-queue ticket's next poll finds its drawn place, and the ticket
    // is written again as a place in line.
    let (head, _) = &early_part[0];
    let i = by_member[head];
    let s = status(&mut crowd[i], &instances[0]).await;
    assert_eq!(s["state"], "waiting", "{s}");
    assert_eq!(s["position"], 1);
    assert!(crowd[i].cookie("qg_tickets").unwrap().starts_with("v1.w."));
}

#[tokio::test]
async fn the_opening_runs_once_when_the_instance_that_would_run_it_is_killed() {
    let opens_at_s = now_s() + 5;
    let (redis, origin, mut instances) = three(opening_at(opens_at_s)).await;
    let mut crowd = Vec::new();
    for i in 0..60 {
        let mut v = Visitor::new();
        let at = &instances[i % 3];
        assert_eq!(
            v.navigate(&at.url("/tickets")).await.status,
            http::StatusCode::FOUND
        );
        assert_eq!(status(&mut v, at).await["state"], "prequeue");
        crowd.push(v);
    }
    let arrived: Vec<Vec<u8>> = line(&redis).into_iter().map(|(m, _)| m).collect();
    // Just before the opening, one instance dies (before it could run the
    // opening: a tick 20 ms after it might have); whichever of the others
    // ticks first runs the opening.
    until(opens_at_s - 1, Duration::from_millis(950)).await;
    let killed = instances.remove(0);
    drop(killed);
    until(opens_at_s, Duration::ZERO).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let openings: usize = instances
        .iter()
        .map(|i| i.process.log().matches(OPENED_LOG).count())
        .sum();
    assert_eq!(openings, 1, "a survivor ran the opening, once");
    let shuffled: Vec<Vec<u8>> = line(&redis).into_iter().map(|(m, _)| m).collect();
    assert_eq!(shuffled.len(), 59, "one admitted");
    assert_ne!(shuffled, arrived[1..].to_vec(), "the line was shuffled");

    // An instance started after the opening (a restart) does not run it again.
    let route = format!(
        "routes:\n  - name: tickets\n    match: {{ path_prefix: /tickets }}\n    capacity: 1\n    \
         tick: 50ms\n    pass_ttl: 2s\n    \
         client_limits: {{ places: 0, joins_per_minute: 0 }}\n    \
         opens_at: \"{}\"\n",
        rfc3339(opens_at_s)
    );
    let restarted = Instance::start(&redis.url(), &origin.url(), &route).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!restarted.process.log().contains(OPENED_LOG));
    let still: Vec<Vec<u8>> = line(&redis).into_iter().map(|(m, _)| m).collect();
    assert_eq!(still, shuffled, "the order stays as drawn");
}
