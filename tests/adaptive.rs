//! Capacity that follows the origin's health (DESIGN §9.1), end to end: the
//! real binary in front of an origin modelled as an app with C workers
//! (`common::sale`), a crowd browsing through it, and the capacity read from
//! `/routes` as it moves.

mod common;

#[path = "common/sale.rs"]
mod sale;

use std::time::{Duration, Instant};

use common::*;
use sale::{crowd, CrowdPlan, ModelOrigin};

/// An adaptive route `shop` at `/shop` whose exit path is `/shop/done`.
fn shop(range: &str) -> String {
    format!(
        "routes:\n\
         \x20 - name: shop\n\
         \x20   match: {{ path_prefix: /shop }}\n\
         \x20   capacity: {range}\n\
         \x20   adapt_every: 1s\n\
         \x20   tick: 50ms\n\
         \x20   max_admit_per_tick: 100\n\
         \x20   exit_paths: [/shop/done]\n\
         \x20   client_limits: {{ places: 0, joins_per_minute: 0 }}\n"
    )
}

/// A crowd of `visitors` at `at`, each making `requests` while admitted,
/// `think` apart, all arriving within `ramp`.
fn plan(at: &Process, visitors: usize, requests: usize, think: u64, ramp: u64) -> CrowdPlan {
    CrowdPlan {
        gate: format!("http://{}", at.addr),
        route: "shop".into(),
        prefix: "/shop".into(),
        visitors,
        requests,
        think: Duration::from_millis(think),
        ramp: Duration::from_millis(ramp),
    }
}

/// The route `shop` as `/routes` shows it at `at`.
async fn shop_now(at: &Process) -> serde_json::Value {
    let (_, body) = get(&at.admin_url("/routes")).await;
    let all: serde_json::Value = serde_json::from_slice(&body).unwrap();
    all["routes"][0].clone()
}

/// The capacity `/routes` shows at `at`.
async fn capacity(at: &Process) -> u64 {
    shop_now(at).await["capacity"].as_u64().unwrap()
}

/// Samples the capacity every 250 ms for `len`, checking it stays within
/// `[min, max]`; returns the samples.
async fn watch(at: &Process, len: Duration, min: u64, max: u64) -> Vec<u64> {
    let until = Instant::now() + len;
    let mut seen = Vec::new();
    while Instant::now() < until {
        let now = capacity(at).await;
        assert!(
            (min..=max).contains(&now),
            "capacity {now} outside [{min}, {max}]: {seen:?}"
        );
        seen.push(now);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    seen
}

/// The origin's p95 over its answers in the last `len`.
fn recent_p95(origin: &ModelOrigin, len: Duration) -> Duration {
    let mut times = origin
        .model
        .answer_times(Instant::now() - len, len + Duration::from_secs(1));
    sale::p95(&mut times)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overrun_origin_brings_capacity_down_to_its_target_and_a_recovered_one_up() {
    // 4 workers at 20 ms: within the 100 ms target up to 20 requests at
    // once. Capacity starts at 40, twice that.
    let origin = ModelOrigin::start(4, Duration::from_millis(20)).await;
    let range = "{ min: 2, max: 40, start: 40, target: { p95: 100ms, errors: 5% } }";
    let instance = Instance::start_memory(&origin.url(), &shop(range)).await;
    let gate = &instance.process;
    assert_eq!(capacity(gate).await, 40);
    let plan = plan(gate, 60, 10, 0, 500);
    let (_log, tasks) = crowd(plan, Instant::now() + Duration::from_secs(40));

    // Overrun: at 40 in flight the origin answers in 200 ms.
    let seen = watch(gate, Duration::from_secs(14), 2, 40).await;
    let low = *seen.iter().min().unwrap();
    assert!(
        low <= 20,
        "capacity never came down to what the origin holds: {seen:?}"
    );
    let settled = recent_p95(&origin, Duration::from_secs(3));
    assert!(
        settled <= Duration::from_millis(150),
        "origin p95 {settled:?} over the last 3 s, capacity {seen:?}"
    );
    let route = shop_now(gate).await;
    assert!(
        route["adapt"]["last_change"]
            .as_str()
            .unwrap()
            .contains("p95")
            || route["adapt"]["last_change"]
                .as_str()
                .unwrap()
                .contains("healthy"),
        "{route}"
    );
    let metrics = get(&gate.admin_url("/metrics")).await.1;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        sample(
            &metrics,
            "queuegate_capacity_changes_total{route=\"shop\",direction=\"down\"}"
        ) >= 2.0,
        "{metrics}"
    );
    assert!(
        sample(
            &metrics,
            "queuegate_origin_response_seconds_count{route=\"shop\"}"
        ) > 100.0
    );

    // Recovered: a hundred workers, the same 20 ms at any load here.
    origin.model.set_workers(100);
    let before = capacity(gate).await;
    let seen = watch(gate, Duration::from_secs(10), 2, 40).await;
    let high = *seen.iter().max().unwrap();
    assert!(
        high >= before + 3,
        "capacity did not climb back from {before}: {seen:?}"
    );
    for task in tasks {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_answers_alone_bring_capacity_down_to_min_and_no_further() {
    // Fast answers, all 503.
    let origin = ModelOrigin::start(100, Duration::from_millis(2)).await;
    origin.model.set_failing(true);
    let range = "{ min: 5, max: 50, start: 30, target: { p95: 1s, errors: 10% } }";
    let instance = Instance::start_memory(&origin.url(), &shop(range)).await;
    let gate = &instance.process;
    let plan = plan(gate, 20, 30, 20, 0);
    let (_log, tasks) = crowd(plan, Instant::now() + Duration::from_secs(20));
    let seen = watch(gate, Duration::from_secs(14), 5, 50).await;
    assert_eq!(*seen.last().unwrap(), 5, "{seen:?}");
    // 30 → 21 → 14 → 9 → 6 → 5: each an unhealthy window, once the
    // sessions of the cut before have come down to it.
    let route = shop_now(gate).await;
    let why = route["adapt"]["last_change"].as_str().unwrap();
    assert!(why.starts_with("errors"), "{why}");
    assert!(
        route["adapt"]["last_window"]["errors"].as_f64().unwrap() > 0.9,
        "{route}"
    );
    for task in tasks {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_origin_with_room_unused_keeps_the_capacity() {
    let origin = ModelOrigin::start(100, Duration::from_millis(2)).await;
    let range = "{ min: 1, max: 100, start: 20, target: { p95: 1s, errors: 5% } }";
    let instance = Instance::start_memory(&origin.url(), &shop(range)).await;
    let gate = &instance.process;
    // Two visitors browsing: healthy, but the room is not in use.
    let plan = plan(gate, 2, 1000, 10, 0);
    let (log, tasks) = crowd(plan, Instant::now() + Duration::from_secs(8));
    let seen = watch(gate, Duration::from_secs(5), 20, 20).await;
    assert!(seen.iter().all(|&c| c == 20), "{seen:?}");
    assert!(log.requests().len() > 100, "the crowd browsed");
    for task in tasks {
        task.abort();
    }
}

/// Three instances on one Redis admit by the capacity the store holds; the
/// instance deciding a window can die and another decides the next; with
/// Redis gone each keeps the number it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_on_one_redis_admit_by_one_capacity_and_keep_it_through_an_outage() {
    let origin = ModelOrigin::start(100, Duration::from_millis(2)).await;
    origin.model.set_failing(true);
    let range = "{ min: 1, max: 400, start: 300, target: { p95: 1s, errors: 10% } }";
    let redis = RedisServer::start();
    let mut instances = Vec::new();
    for _ in 0..3 {
        let rest = shop(range);
        instances
            .push(Instance::start(&redis.url(), &format!("http://{}", origin.addr), &rest).await);
    }
    // The crowd comes through the first instance; every instance reports.
    let plan = plan(&instances[0].process, 20, 30, 20, 0);
    let (_log, tasks) = crowd(plan, Instant::now() + Duration::from_secs(40));

    // The capacity comes down, and every instance admits by the same number.
    eventually_async("capacity came down everywhere", || async {
        let mut numbers = Vec::new();
        for i in &instances {
            numbers.push(capacity(&i.process).await);
        }
        numbers.iter().all(|&n| n < 300 && n > 1) && numbers.windows(2).all(|w| w[0] == w[1])
    })
    .await;

    // An instance other than the one the crowd comes through decides a
    // window, and is killed: one of the others decides the next.
    let decisions = |i: &Instance| i.process.log().matches("capacity changed").count();
    eventually("a second instance decides", || {
        instances[1..].iter().any(|i| decisions(i) > 0)
    })
    .await;
    let decider = 1 + instances[1..]
        .iter()
        .position(|i| decisions(i) > 0)
        .unwrap();
    let gone = instances.remove(decider);
    let before: Vec<usize> = instances.iter().map(decisions).collect();
    drop(gone);
    eventually("another instance decides after it", || {
        instances
            .iter()
            .zip(&before)
            .any(|(i, b)| decisions(i) > *b)
    })
    .await;

    // Redis gone: each keeps the number it had.
    drop(redis);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let kept: Vec<u64> =
        futures_util::future::join_all(instances.iter().map(|i| capacity(&i.process))).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let later: Vec<u64> =
        futures_util::future::join_all(instances.iter().map(|i| capacity(&i.process))).await;
    assert_eq!(
        kept, later,
        "with the store down the capacity stays where it was"
    );
    assert!(kept.iter().all(|&c| c < 300), "{kept:?}");
    for task in tasks {
        task.abort();
    }
}

/// A request with a body is not counted in the origin's health: a client
/// that sends its body slowly stretches the origin's time to answer, and
/// could talk the capacity down for everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_body_the_client_trickles_is_not_counted_in_the_origins_health() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let origin = ModelOrigin::start(100, Duration::from_millis(2)).await;
    let rest = shop("10").replace("    adapt_every: 1s\n", "") + "    mode: passthrough\n";
    let instance = Instance::start_memory(&origin.url(), &rest).await;
    let gate = &instance.process;
    let counted = || async {
        let metrics = get(&gate.admin_url("/metrics")).await.1;
        let metrics = String::from_utf8_lossy(&metrics).into_owned();
        sample(
            &metrics,
            "queuegate_origin_response_seconds_count{route=\"shop\"}",
        )
    };
    assert_eq!(counted().await, 0.0);

    let mut slow = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
    slow.write_all(b"POST /shop/cart HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 4\r\n\r\nab")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    slow.write_all(b"cd").await.unwrap();
    let mut answer = [0u8; 12];
    slow.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200", "the origin answered the post");
    assert_eq!(counted().await, 0.0, "a request with a body is not counted");

    let (parts, _) = get(&gate.url("/shop/item")).await;
    assert_eq!(parts.status, 200);
    assert_eq!(counted().await, 1.0, "a request without one is");
}
