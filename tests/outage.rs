//! Store outages on a real `redis-server`: killed (connections refused) and
//! stopped (connections hang). Admitted visitors keep reaching the origin;
//! new visitors get what each route's `on_store_error` promises; nothing waits
//! on the dead store; when Redis is back the line resumes.

mod common;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use http::StatusCode;
use queuegate::config::{Backend, OnStoreError};

/// The store's call timeout in these tests.
const STORE_TIMEOUT: Duration = Duration::from_millis(200);

/// Hang guard: a request must be answered well within this even with the
/// store dead or stopped (the store timeout plus a wide margin). A failure
/// guard, not a timing assertion.
const HANG_GUARD: Duration = Duration::from_secs(3);

async fn answered<T>(what: &str, request: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG_GUARD, request)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {HANG_GUARD:?}: it hung on the store"))
}

fn outage_route(name: &str, capacity: u64, policy: OnStoreError) -> queuegate::config::Route {
    let mut r = route(name, &format!("/{name}"), capacity);
    r.on_store_error = policy;
    // Short passes, so browsing through the outage goes past half a pass's
    // life and has to renew.
    r.pass_ttl = Duration::from_secs(2);
    r
}

fn redis_config(origin: &str, redis: &RedisServer) -> queuegate::config::Config {
    let mut config = proxy_config(origin);
    config.store.backend = Backend::Redis;
    config.store.redis = redis.config(STORE_TIMEOUT);
    config.store.expected_instances = 2;
    config
}

/// The only instance on `redis`, serving `routes`, and its origin.
async fn one_instance(
    redis: &RedisServer,
    routes: Vec<queuegate::config::Route>,
) -> (Gate, common::Origin) {
    let (origin, _hits) = counting_origin().await;
    let mut config = redis_config(&origin.url(), redis);
    config.store.expected_instances = 1;
    config.routes = routes;
    let gate = spawn_gate_opts(config, ring("k1"), queuegate::RunOptions::default()).await;
    (gate, origin)
}

/// A visitor that navigates to `url` and reaches the origin.
async fn admitted(gate: &Gate, path: &str) -> Visitor {
    let mut v = Visitor::new();
    let a = answered("first visit", v.navigate(&gate.url(path))).await;
    assert!(
        a.reached_origin(),
        "{path}: admitted before the outage: {a:?}"
    );
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_store_keeps_admitted_visitors_in_and_each_route_follows_its_policy() {
    let mut redis = RedisServer::start();
    let (origin, hits) = counting_origin().await;
    let mut config = redis_config(&origin.url(), &redis);
    config.routes = vec![
        outage_route("open", 1, OnStoreError::Open),
        outage_route("closed", 1, OnStoreError::Closed),
        // Two instances expected: this one admits at most 4 ÷ 2 on its own.
        outage_route("local", 4, OnStoreError::Local),
    ];
    let gate = spawn_gate(config).await;

    let mut browsing = [
        ("/open", admitted(&gate, "/open").await),
        ("/closed", admitted(&gate, "/closed").await),
        ("/local", admitted(&gate, "/local").await),
    ];
    // The closed route is full: the next visitor waits in line.
    let mut waiter = Visitor::new();
    let a = answered("waiter joins", waiter.navigate(&gate.url("/closed/seat"))).await;
    assert_eq!(a.status, StatusCode::FOUND, "{a:?}");
    assert!(waiter.cookie("qg_closed").is_some());

    redis.kill();

    // Admitted visitors browse through the outage, past half their pass's
    // life: each pass is renewed locally (a new cookie) and keeps working.
    let mut renewed = [false; 3];
    let browse_until = tokio::time::Instant::now() + Duration::from_millis(2_600);
    while tokio::time::Instant::now() < browse_until {
        for (i, (path, v)) in browsing.iter_mut().enumerate() {
            let before = v.cookie(&format!("qg_{}", &path[1..])).map(str::to_owned);
            let a = answered("admitted visitor", v.navigate(&gate.url(path))).await;
            assert!(
                a.reached_origin(),
                "{path}: admitted visitor held back: {a:?}"
            );
            if v.cookie(&format!("qg_{}", &path[1..])).map(str::to_owned) != before {
                renewed[i] = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        renewed, [true; 3],
        "every pass was renewed without the store"
    );

    // open: new visitors are forwarded, without a pass.
    for _ in 0..3 {
        let mut v = Visitor::new();
        let a = answered("new visitor, open", v.navigate(&gate.url("/open/new"))).await;
        assert!(a.reached_origin(), "{a:?}");
        assert!(v.cookie("qg_open").is_none());
    }

    // closed: the waiting page or store_down, nothing forwarded.
    let before = hits.load(Ordering::SeqCst);
    let mut v = Visitor::new();
    let a = answered("new visitor, closed", v.navigate(&gate.url("/closed/new"))).await;
    assert_eq!(a.status, StatusCode::FOUND, "{a:?}");
    assert!(a
        .location()
        .is_some_and(|l| l.starts_with("/__queuegate/waiting")));
    let a = answered("new app call, closed", v.fetch(&gate.url("/closed/api"))).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.json()["state"], "store_down");
    assert!(a.headers.contains_key("retry-after"));
    let status = answered("waiter polls", waiter.status(&gate, "closed")).await;
    assert_eq!(status["state"], "store_down", "{status}");
    assert_eq!(hits.load(Ordering::SeqCst), before, "nothing forwarded");

    // local: at most capacity ÷ expected_instances new visitors get in.
    let mut let_in = 0;
    let mut waiting = 0;
    for _ in 0..5 {
        let mut v = Visitor::new();
        let a = answered("new visitor, local", v.navigate(&gate.url("/local/new"))).await;
        if a.reached_origin() {
            let_in += 1;
        } else {
            assert_eq!(a.status, StatusCode::FOUND, "{a:?}");
            waiting += 1;
        }
    }
    assert_eq!((let_in, waiting), (2, 3));

    // Redis comes back (empty) on the same port: the breaker half-opens and
    // the line resumes. The admitted visitor leaves, freeing the slot; after
    // the hold that follows the store loss, the waiter is admitted.
    redis.restart();
    let (_, holder) = &mut browsing[1];
    answered("leave", holder.leave(&gate, "closed")).await;
    let mut resumed = false;
    for _ in 0..400 {
        let status = answered("waiter polls", waiter.status(&gate, "closed")).await;
        if status["state"] == "admitted" {
            resumed = true;
            break;
        }
        assert_ne!(
            status["state"], "unknown",
            "the waiter kept its place: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(resumed, "the waiter was admitted once Redis was back");
    let a = answered(
        "admitted waiter",
        waiter.navigate(&gate.url("/closed/seat")),
    )
    .await;
    assert!(a.reached_origin(), "{a:?}");
    drop(gate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_store_does_not_make_requests_hang() {
    let mut redis = RedisServer::start();
    let (origin, _hits) = counting_origin().await;
    let mut config = redis_config(&origin.url(), &redis);
    config.routes = vec![
        outage_route("open", 1, OnStoreError::Open),
        outage_route("closed", 1, OnStoreError::Closed),
        outage_route("local", 4, OnStoreError::Local),
    ];
    let gate = spawn_gate(config).await;
    let mut holders = [
        ("/open", admitted(&gate, "/open").await),
        ("/local", admitted(&gate, "/local").await),
    ];

    // SIGSTOP: connections stay open and nothing answers.
    redis.pause();
    for round in 0..10 {
        for (path, v) in holders.iter_mut() {
            let a = answered("admitted visitor", v.navigate(&gate.url(path))).await;
            assert!(a.reached_origin(), "round {round}, {path}: {a:?}");
        }
        let mut v = Visitor::new();
        let a = answered("new visitor, open", v.navigate(&gate.url("/open/x"))).await;
        assert!(a.reached_origin(), "round {round}: {a:?}");
        let mut v = Visitor::new();
        let a = answered("new visitor, closed", v.fetch(&gate.url("/closed/x"))).await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "round {round}");
        assert_eq!(a.json()["state"], "store_down");
        let mut v = Visitor::new();
        let a = answered("new visitor, local", v.navigate(&gate.url("/local/x"))).await;
        assert!(
            a.reached_origin() || a.status == StatusCode::FOUND,
            "round {round}: {a:?}"
        );
        let mut v = Visitor::new();
        answered("status poll", v.status(&gate, "local")).await;
    }

    // SIGCONT: the store answers again and new visitors go through it.
    redis.resume();
    let mut back = false;
    for _ in 0..400 {
        let mut v = Visitor::new();
        let a = answered("new visitor, closed", v.fetch(&gate.url("/closed/y"))).await;
        if a.status != StatusCode::SERVICE_UNAVAILABLE || a.json()["state"] != "store_down" {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "the closed route answers from the store again");
    drop(gate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_room_stays_full_when_the_store_goes_down_under_local() {
    let mut redis = RedisServer::start();
    let (origin, hits) = counting_origin().await;
    let mut config = redis_config(&origin.url(), &redis);
    // Two instances expected: this one's own share is 4 ÷ 2.
    config.routes = vec![outage_route("local", 4, OnStoreError::Local)];
    let gate = spawn_gate_opts(config, ring("k1"), queuegate::RunOptions::default()).await;
    let mut inside = Vec::new();
    for _ in 0..4 {
        inside.push(admitted(&gate, "/local").await);
    }
    // Wait until the admitter has read the room full from the store.
    let mut seen_full = false;
    for _ in 0..200 {
        let (_, body) = get(&gate.admin_url("/routes")).await;
        let routes: serde_json::Value = serde_json::from_slice(&body).unwrap();
        if routes["routes"][0]["active"] == 4 {
            seen_full = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(seen_full, "the store's count never reached the admitter");
    redis.kill();

    // The room was full: the local line counts the visitors the store let
    // in (they keep browsing on their passes), so nobody new gets in.
    let before = hits.load(Ordering::SeqCst);
    for _ in 0..4 {
        let mut v = Visitor::new();
        let a = answered("new visitor, local", v.navigate(&gate.url("/local/new"))).await;
        assert_eq!(a.status, StatusCode::FOUND, "{a:?}");
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        before,
        "nobody new reached the origin"
    );
    // Those inside still browse.
    for v in &mut inside {
        let a = answered("admitted visitor", v.navigate(&gate.url("/local"))).await;
        assert!(a.reached_origin(), "{a:?}");
    }
    gate.stop().await.unwrap();
}

/// The state and visitor id of a `v1.<state>.<route>.<id>....` cookie value.
fn state_and_id(v: &Visitor, route: &str) -> (String, String) {
    let value = v
        .cookie(&format!("qg_{route}"))
        .unwrap_or_else(|| panic!("no cookie for {route}"));
    let fields: Vec<&str> = value.split('.').collect();
    (fields[1].to_owned(), fields[3].to_owned())
}

async fn active_of(gate: &Gate, route: &str) -> u64 {
    let (_, body) = get(&gate.admin_url("/routes")).await;
    let routes: serde_json::Value = serde_json::from_slice(&body).unwrap();
    routes["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == route)
        .and_then(|r| r["active"].as_u64())
        .unwrap_or_else(|| panic!("no active count for {route}: {routes}"))
}

/// Under `local`, a Redis pause costs nobody a place or a session: a waiter
/// whose ticket is older than abandon_after keeps it (the local line takes it
/// in at its score), and a visitor the local line admitted keeps its
/// session when the store is back (its `l` pass is taken back by the store,
/// which then counts it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_local_a_pause_costs_nobody_a_place_or_a_session() {
    let mut redis = RedisServer::start();
    let mut full = outage_route("full", 1, OnStoreError::Local);
    full.abandon_after = Duration::from_secs(2);
    full.confirm_within = Duration::from_secs(1);
    let spare = outage_route("spare", 2, OnStoreError::Local);
    let (gate, _origin) = one_instance(&redis, vec![full, spare]).await;

    let mut holder = admitted(&gate, "/full").await;
    // Its return confirms the session.
    let a = answered("holder", holder.navigate(&gate.url("/full"))).await;
    assert!(a.reached_origin(), "{a:?}");
    let mut waiter = Visitor::new();
    let a = answered("waiter", waiter.navigate(&gate.url("/full"))).await;
    assert_eq!(a.status, StatusCode::FOUND, "{a:?}");
    // The waiter waits longer than abandon_after, polling.
    for _ in 0..14 {
        let status = answered("poll", waiter.status(&gate, "full")).await;
        assert_eq!(status["state"], "waiting", "{status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (kind, ticket_id) = state_and_id(&waiter, "full");
    assert_eq!(kind, "w");
    eventually_async("the admitter reads the room full", || async {
        active_of(&gate, "full").await == 1
    })
    .await;

    redis.pause();
    let mut newcomer = Visitor::new();
    let a = answered("newcomer", newcomer.navigate(&gate.url("/spare"))).await;
    assert!(a.reached_origin(), "the local line admits at once: {a:?}");
    let (kind, newcomer_id) = state_and_id(&newcomer, "spare");
    assert_eq!(kind, "l", "a pass granted without the store");
    for _ in 0..5 {
        let status = answered("poll in the pause", waiter.status(&gate, "full")).await;
        assert_eq!(status["state"], "waiting", "{status}");
        assert_eq!(status["position"], 1, "{status}");
        assert_eq!(
            state_and_id(&waiter, "full").1,
            ticket_id,
            "the waiter keeps its ticket"
        );
        let a = answered("newcomer browses", newcomer.navigate(&gate.url("/spare"))).await;
        assert!(a.reached_origin(), "{a:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    redis.resume();

    // Once the store answers, the newcomer's next request hands its session
    // back: same visitor, now a pass the store granted, and counted.
    let mut handed_back = false;
    for _ in 0..100 {
        let a = answered("newcomer after", newcomer.navigate(&gate.url("/spare"))).await;
        assert!(a.reached_origin(), "never sent to the line: {a:?}");
        let (kind, id) = state_and_id(&newcomer, "spare");
        assert_eq!(id, newcomer_id, "the same session");
        if kind == "a" {
            handed_back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(handed_back, "the store never took the session back");
    eventually_async("the store counts the newcomer", || async {
        active_of(&gate, "spare").await == 1
    })
    .await;
    let status = answered("poll after", waiter.status(&gate, "full")).await;
    assert_eq!(status["state"], "waiting", "{status}");
    assert_eq!(status["position"], 1, "{status}");
    assert_eq!(state_and_id(&waiter, "full").1, ticket_id);
    gate.stop().await.unwrap();
}

/// Under `local`, a ticket the store issued whose first poll meets a pause
/// keeps its place: the local line takes it in at its score, as the store
/// would have kept it unconfirmed, instead of sending its holder to the back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_local_a_ticket_never_polled_before_a_pause_keeps_its_place() {
    let mut redis = RedisServer::start();
    let mut full = outage_route("full", 1, OnStoreError::Local);
    full.abandon_after = Duration::from_secs(30);
    full.confirm_within = Duration::from_secs(10);
    let (gate, _origin) = one_instance(&redis, vec![full]).await;

    let mut holder = admitted(&gate, "/full").await;
    let a = answered("holder", holder.navigate(&gate.url("/full"))).await;
    assert!(a.reached_origin(), "{a:?}");
    eventually_async("the admitter reads the room full", || async {
        active_of(&gate, "full").await == 1
    })
    .await;
    let mut waiter = Visitor::new();
    let a = answered("waiter", waiter.navigate(&gate.url("/full"))).await;
    assert_eq!(a.status, StatusCode::FOUND, "{a:?}");
    let (kind, ticket_id) = state_and_id(&waiter, "full");
    assert_eq!(kind, "w");

    redis.pause();
    for _ in 0..3 {
        let status = answered("poll in the pause", waiter.status(&gate, "full")).await;
        assert_eq!(status["state"], "waiting", "{status}");
        assert_eq!(status["position"], 1, "{status}");
        assert_eq!(
            state_and_id(&waiter, "full").1,
            ticket_id,
            "the waiter keeps its ticket"
        );
    }
    redis.resume();
    let status = answered("poll after", waiter.status(&gate, "full")).await;
    assert_eq!(status["state"], "waiting", "{status}");
    assert_eq!(status["position"], 1, "{status}");
    assert_eq!(state_and_id(&waiter, "full").1, ticket_id);
    gate.stop().await.unwrap();
}

/// Under `local`, a store that stops answering just after a route's
/// opening (busy shuffling a large pre-queue, say) does not let a latecomer
/// in at once ahead of the pre-queue: the local line, which cannot see it,
/// puts latecomers in line instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_local_a_pause_just_after_an_opening_lets_nobody_in_at_once() {
    let mut redis = RedisServer::start();
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut opening = outage_route("opening", 5, OnStoreError::Local);
    opening.opens_at = queuegate::config::Timestamp::from_unix_s(now_s + 1);
    let (gate, _origin) = one_instance(&redis, vec![opening]).await;
    let mut early = Visitor::new();
    let a = answered("early", early.navigate(&gate.url("/opening"))).await;
    assert_eq!(a.status, StatusCode::FOUND, "before the opening: {a:?}");
    let mut opened = false;
    for _ in 0..100 {
        let s = answered("poll", early.status(&gate, "opening")).await;
        if s["state"] == "waiting" || s["state"] == "admitted" {
            opened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(opened, "the route opened");
    redis.pause();
    let mut late = Visitor::new();
    let a = answered("latecomer", late.navigate(&gate.url("/opening"))).await;
    assert_eq!(a.status, StatusCode::FOUND, "not let in at once: {a:?}");
    assert!(!a.reached_origin(), "{a:?}");
    redis.resume();
    gate.stop().await.unwrap();
}

/// While the local line answers for a paused store, waiters are told to poll
/// about every second, so each is back in the store's line (at its place)
/// within a second of the store's return; afterwards the interval grows
/// with the position again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_poll_soon_while_the_local_line_answers() {
    let mut redis = RedisServer::start();
    let (origin, _hits) = counting_origin().await;
    let mut config = redis_config(&origin.url(), &redis);
    config.routes = vec![outage_route("full", 1, OnStoreError::Local)];
    let gate = spawn_gate(config).await;
    let _holder = admitted(&gate, "/full").await;
    let mut waiters = Vec::new();
    for _ in 0..60 {
        let mut v = Visitor::new();
        let a = answered("waiter", v.navigate(&gate.url("/full"))).await;
        assert_eq!(a.status, StatusCode::FOUND, "{a:?}");
        waiters.push(v);
    }
    let last = waiters.last_mut().unwrap();
    let interval = |status: &serde_json::Value| status["poll_after_ms"].as_u64().unwrap();
    let status = answered("poll", last.status(&gate, "full")).await;
    assert_eq!(status["position"], 60, "{status}");
    // About 1 s + 40 ms per place ahead, ±20 %.
    assert!(interval(&status) >= 2_600, "{status}");

    redis.pause();
    let status = answered("poll in the pause", last.status(&gate, "full")).await;
    assert_eq!(status["state"], "waiting", "{status}");
    assert!(interval(&status) <= 1_200, "{status}");
    redis.resume();

    let mut back_to_normal = false;
    for _ in 0..100 {
        let status = answered("poll after", last.status(&gate, "full")).await;
        if status["state"] == "waiting" && interval(&status) >= 2_600 {
            back_to_normal = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        back_to_normal,
        "the interval grows again once the store answers"
    );
    drop(gate);
}
