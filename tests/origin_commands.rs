//! The origin ends sessions (DESIGN §8.6): its `Queuegate-Command:
//! end-session` response header, a route's `exit_paths`, and
//! `max_requests_per_session`. The freed slot goes to the next waiter, the
//! pass stops admitting, the header never reaches the client, and a client
//! cannot send the command itself. Each runs on the memory store; the
//! counting runs on Redis too, in-process and as three instances on one
//! Redis.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use queuegate::config::{AmbiguousPaths, Backend, Route};

/// An origin that counts its requests, says whether a request carried a
/// `Queuegate-Command` header, and answers paths ending in `/end` with
/// `end-session`, `/END` with the header name and value in upper case,
/// `/unknown` with a command it does not know, and `/list` with a list.
/// A request whose query is `slow` is answered 300 ms after it came.
async fn commanding_origin() -> (Origin, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let origin = spawn_origin(move |req: Request<Incoming>| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            if req.uri().query() == Some("slow") {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let saw = req.headers().contains_key("queuegate-command");
            let mut resp = Response::new(full(format!("origin {}", req.uri().path())));
            let h = resp.headers_mut();
            h.insert(
                "x-saw-command",
                if saw { "yes" } else { "no" }.parse().unwrap(),
            );
            let path = req.uri().path();
            if path.ends_with("/end") {
                h.insert("queuegate-command", "end-session".parse().unwrap());
            } else if path.ends_with("/END") {
                h.insert("QUEUEGATE-COMMAND", " END-SESSION ".parse().unwrap());
            } else if path.ends_with("/unknown") {
                h.insert("Queuegate-Command", "launch-rockets".parse().unwrap());
            } else if path.ends_with("/list") {
                h.append("queuegate-command", "launch-rockets".parse().unwrap());
                h.append("queuegate-command", "later, end-session".parse().unwrap());
            }
            resp
        }
    })
    .await;
    (origin, hits)
}

/// queuegate with its admin listener in front of [`commanding_origin`],
/// `r` its one route, on `redis` when given, else on the memory store.
async fn commanded_gate(r: Route, redis: Option<&RedisServer>) -> (Gate, Origin, Arc<AtomicUsize>) {
    let (origin, hits) = commanding_origin().await;
    let mut config = proxy_config(&origin.url());
    if let Some(redis) = redis {
        config.store.backend = Backend::Redis;
        config.store.redis = redis.config(Duration::from_secs(2));
    }
    config.routes.push(r);
    let gate = spawn_gate_opts(config, ring("k1"), queuegate::RunOptions::default()).await;
    (gate, origin, hits)
}

/// Whether `a` clears the route's pass cookie.
fn clears_pass(a: &Answer) -> bool {
    a.headers.get_all("set-cookie").iter().any(|v| {
        let v = v.to_str().unwrap();
        v.starts_with("qg_tickets=;") && v.contains("Max-Age=0")
    })
}

/// A visitor holding `pass`, as a client replaying it would.
fn holding(pass: &str) -> Visitor {
    Visitor::holding("qg_tickets", pass)
}

/// A visitor admitted at once, whose session is confirmed (its second
/// request renewed the admit-now pass).
async fn inside(gate: &Gate) -> Visitor {
    let mut v = Visitor::new();
    assert!(v.navigate(&gate.url("/tickets/a")).await.reached_origin());
    assert!(v.navigate(&gate.url("/tickets/b")).await.reached_origin());
    v
}

#[tokio::test]
async fn end_session_from_the_origin_frees_the_slot_and_the_pass() {
    let (gate, _origin, _hits) = gated_origin(commanding_origin().await, 1, |_, _| {}).await;
    let mut a = inside(&gate).await;
    let pass = a.cookie("qg_tickets").unwrap().to_owned();
    let mut b = Visitor::new();
    assert!(!b.navigate(&gate.url("/tickets/x")).await.reached_origin());
    assert_eq!(b.status(&gate, "tickets").await["state"], "waiting");

    let ended = a.navigate(&gate.url("/tickets/end")).await;
    assert!(ended.reached_origin(), "{ended:?}");
    assert!(ended.headers.get("queuegate-command").is_none());
    assert!(clears_pass(&ended), "{ended:?}");
    assert!(a.cookie("qg_tickets").is_none());

    // The slot is the waiter's at the next tick.
    wait_admitted(&mut b, &gate).await;
    assert!(b.navigate(&gate.url("/tickets/x")).await.reached_origin());
    // The old pass admits no more, fresh as it is.
    let replay = holding(&pass).navigate(&gate.url("/tickets/x")).await;
    assert!(!replay.reached_origin(), "{replay:?}");
}

#[tokio::test]
async fn the_command_is_read_in_any_case_and_from_a_list() {
    let (gate, _origin, _hits) = gated_origin(commanding_origin().await, 10, |_, _| {}).await;
    for path in ["/tickets/END", "/tickets/list"] {
        let mut v = inside(&gate).await;
        let ended = v.navigate(&gate.url(path)).await;
        assert!(ended.reached_origin(), "{path}: {ended:?}");
        assert!(ended.headers.get("queuegate-command").is_none(), "{path}");
        assert!(clears_pass(&ended), "{path}: {ended:?}");
    }
}

#[tokio::test]
async fn unknown_commands_are_stripped_and_change_nothing() {
    let (gate, _origin, _hits) = gated_origin(commanding_origin().await, 10, |_, _| {}).await;
    let mut v = inside(&gate).await;
    let a = v.navigate(&gate.url("/tickets/unknown")).await;
    assert!(a.reached_origin());
    assert!(a.headers.get("queuegate-command").is_none());
    assert!(a.headers.get("set-cookie").is_none(), "{a:?}");
    assert!(v.navigate(&gate.url("/tickets/x")).await.reached_origin());
}

#[tokio::test]
async fn a_command_on_an_ungated_path_is_stripped_and_does_nothing() {
    let (gate, _origin, _hits) = gated_origin(commanding_origin().await, 1, |_, _| {}).await;
    let mut v = inside(&gate).await;
    let a = v.navigate(&gate.url("/free/end")).await;
    assert!(a.reached_origin(), "{a:?}");
    assert!(a.headers.get("queuegate-command").is_none());
    assert!(a.headers.get("set-cookie").is_none(), "{a:?}");
    // No session was touched: the visitor is still inside, and the slot
    // still taken.
    assert!(v.navigate(&gate.url("/tickets/x")).await.reached_origin());
    assert!(!Visitor::new()
        .navigate(&gate.url("/tickets/x"))
        .await
        .reached_origin());
}

#[tokio::test]
async fn a_client_sending_the_command_changes_nothing() {
    let (gate, _origin, _hits) = gated_origin(commanding_origin().await, 1, |_, _| {}).await;
    let mut v = inside(&gate).await;
    for name in ["queuegate-command", "QueueGate-Command"] {
        let req = Request::get(gate.url("/tickets/x"))
            .header(name, "end-session")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let a = v.request(req).await;
        assert!(a.reached_origin(), "{a:?}");
        assert_eq!(a.headers["x-saw-command"], "no", "not forwarded either");
        assert!(a.headers.get("set-cookie").is_none(), "{a:?}");
    }
    assert!(v.navigate(&gate.url("/tickets/x")).await.reached_origin());
    assert!(!Visitor::new()
        .navigate(&gate.url("/tickets/x"))
        .await
        .reached_origin());
}

#[tokio::test]
async fn every_spelling_of_an_exit_path_ends_the_session() {
    let (gate, _origin, _hits) = gated_origin(commanding_origin().await, 1, |config, r| {
        config.limits.ambiguous_paths = AmbiguousPaths::Gate;
        r.exit_paths = vec!["/tickets/done".into()];
    })
    .await;
    for path in [
        "/tickets/done",
        "/tickets//done",
        "/tickets/./done",
        "/tickets/x/../done",
        "/tickets/%64one",
        "/tickets/done/receipt?order=1",
        "/tickets%2Fdone",
        "/tickets/done;jsessionid=1",
    ] {
        let mut a = inside(&gate).await;
        let pass = a.cookie("qg_tickets").unwrap().to_owned();
        let done = a.navigate(&gate.url(path)).await;
        assert!(done.reached_origin(), "{path}: {done:?}");
        assert!(clears_pass(&done), "{path}: {done:?}");
        // The slot is free, so a replay of the old pass comes in as a
        // newcomer would: with a new admit-now pass, not on the old one.
        let mut replayer = holding(&pass);
        let replay = replayer.navigate(&gate.url("/tickets/x")).await;
        assert!(replay.reached_origin(), "{path}: {replay:?}");
        let new_pass = replayer.cookie("qg_tickets").unwrap();
        assert!(new_pass.starts_with("v1.n."), "{path}: {new_pass}");
        // Capacity 1: the next visitor gets in only if this one leaves.
        replayer.leave(&gate, "tickets").await;
    }
    // Not an exit path: a segment boundary is needed.
    let mut v = inside(&gate).await;
    let a = v.navigate(&gate.url("/tickets/done2")).await;
    assert!(a.reached_origin());
    assert!(a.headers.get("set-cookie").is_none(), "{a:?}");
}

#[tokio::test]
async fn a_failed_exit_request_does_not_end_the_session() {
    // An origin that is not there: queuegate answers 502 itself.
    let mut config = proxy_config("http://127.0.0.1:9");
    let mut r = route("tickets", "/tickets", 1);
    r.exit_paths = vec!["/tickets/done".into()];
    config.routes.push(r);
    let gate = spawn_gate_with(config, ring("k1")).await;
    let v = &mut pass_from_the_waiting_page(&gate).await;
    let a = v.navigate(&gate.url("/tickets/done")).await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    assert!(!clears_pass(&a), "{a:?}");
    assert!(v.cookie("qg_tickets").is_some());
}

/// A visitor admitted through the waiting page, which forwards nothing.
async fn pass_from_the_waiting_page(gate: &Gate) -> Visitor {
    let mut v = Visitor::new();
    let a = v
        .navigate(&gate.url("/__queuegate/waiting?route=tickets&return=/tickets/x"))
        .await;
    assert_eq!(a.location(), Some("/tickets/x"), "{a:?}");
    assert!(v.cookie("qg_tickets").is_some());
    v
}

/// `concurrent` requests carrying one pass on a route that allows `limit`
/// per session: how many reached the origin. The pass comes from the
/// waiting page, so getting it forwards nothing.
async fn concurrent_with_one_pass(
    limit: u64,
    concurrent: usize,
    redis: Option<&RedisServer>,
) -> usize {
    let mut r = route("tickets", "/tickets", 5);
    r.max_requests_per_session = Some(limit);
    let (gate, origin, hits) = commanded_gate(r, redis).await;
    let v = pass_from_the_waiting_page(&gate).await;
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    let tasks: Vec<_> = (0..concurrent)
        .map(|_| {
            let mut tab = v.clone();
            let url = gate.url("/tickets/x");
            tokio::spawn(async move { tab.fetch(&url).await })
        })
        .collect();
    let mut reached = 0;
    for task in tasks {
        let a = task.await.unwrap();
        if a.reached_origin() {
            reached += 1;
        } else {
            assert_eq!(a.json()["state"], "used_up", "{a:?}");
            assert!(clears_pass(&a), "{a:?}");
        }
    }
    assert_eq!(hits.load(Ordering::SeqCst), reached);
    drop(origin);
    reached
}

#[tokio::test]
async fn one_request_per_session_lets_one_of_fifty_through() {
    assert_eq!(concurrent_with_one_pass(1, 50, None).await, 1);
}

#[tokio::test]
async fn three_requests_per_session_let_three_of_fifty_through() {
    assert_eq!(concurrent_with_one_pass(3, 50, None).await, 3);
}

#[tokio::test]
async fn one_and_three_requests_per_session_on_redis() {
    let redis = RedisServer::start();
    assert_eq!(concurrent_with_one_pass(1, 50, Some(&redis)).await, 1);
    assert_eq!(concurrent_with_one_pass(3, 50, Some(&redis)).await, 3);
}

// A request counted within the limit that loses the race to the session's
// last request is still forwarded on its session, not admitted anew.

#[tokio::test]
async fn ten_requests_per_session_let_ten_of_fifty_through() {
    assert_eq!(concurrent_with_one_pass(10, 50, None).await, 10);
}

#[tokio::test]
async fn ten_requests_per_session_let_ten_of_fifty_through_on_redis() {
    let redis = RedisServer::start();
    assert_eq!(concurrent_with_one_pass(10, 50, Some(&redis)).await, 10);
}

/// `concurrent` navigations carrying the ticket of a visitor the line
/// admitted (who has not come for the pass yet), on a route allowing one
/// request per session, with nobody else waiting: how many reached the
/// origin. The session's one request is made by one of them; the others
/// are used up, none is admitted anew.
async fn concurrent_with_an_admitted_ticket(
    concurrent: usize,
    redis: Option<&RedisServer>,
) -> usize {
    let mut r = route("tickets", "/tickets", 1);
    r.max_requests_per_session = Some(1);
    let (gate, _origin, hits) = commanded_gate(r, redis).await;
    let mut holder = pass_from_the_waiting_page(&gate).await;
    let mut v = Visitor::new();
    let a = v
        .navigate(&gate.url("/__queuegate/waiting?route=tickets&return=/tickets/x"))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert!(v.cookie("qg_tickets").unwrap().starts_with("v1.w."));
    holder.leave(&gate, "tickets").await;
    // Admitted by one of the admitter's next ticks; nobody else waits.
    let from_line = "queuegate_admitted_total{route=\"tickets\",how=\"from_line\"}";
    for _ in 0..500 {
        if sample(&gate.metrics().await, from_line) == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sample(&gate.metrics().await, from_line), 1.0);
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    let tasks: Vec<_> = (0..concurrent)
        .map(|_| {
            let mut tab = v.clone();
            let url = gate.url("/tickets/x");
            tokio::spawn(async move { tab.navigate(&url).await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    // And once the session has surely ended, a few more.
    for _ in 0..3 {
        answers.push(v.clone().navigate(&gate.url("/tickets/x")).await);
    }
    let mut reached = 0;
    for a in answers {
        if a.reached_origin() {
            reached += 1;
        } else {
            assert_eq!(a.headers["x-queuegate"], "used-up", "{a:?}");
            assert!(clears_pass(&a), "{a:?}");
        }
    }
    assert_eq!(hits.load(Ordering::SeqCst), reached);
    reached
}

#[tokio::test]
async fn an_admitted_ticket_makes_one_request_of_twenty() {
    assert_eq!(concurrent_with_an_admitted_ticket(20, None).await, 1);
}

#[tokio::test]
async fn an_admitted_ticket_makes_one_request_of_twenty_on_redis() {
    let redis = RedisServer::start();
    assert_eq!(
        concurrent_with_an_admitted_ticket(20, Some(&redis)).await,
        1
    );
}

#[tokio::test]
async fn a_used_up_navigation_goes_back_through_the_line() {
    let (gate, _origin, hits) = gated_origin(commanding_origin().await, 1, |_, r| {
        r.max_requests_per_session = Some(2)
    })
    .await;
    let mut v = Visitor::new();
    assert!(v.navigate(&gate.url("/tickets/a")).await.reached_origin());
    let pass = v.cookie("qg_tickets").unwrap().to_owned();
    let last = v.navigate(&gate.url("/tickets/b")).await;
    assert!(last.reached_origin());
    assert!(
        clears_pass(&last),
        "the last request clears the pass: {last:?}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    // The slot is free at once: a newcomer is admitted.
    let mut next = Visitor::new();
    assert!(next
        .navigate(&gate.url("/tickets/c"))
        .await
        .reached_origin());
    // Replaying the used pass: sent to the waiting page, not the origin.
    let replay = holding(&pass).navigate(&gate.url("/tickets/d")).await;
    assert_eq!(replay.status, StatusCode::FOUND, "{replay:?}");
    assert!(replay
        .location()
        .unwrap()
        .starts_with("/__queuegate/waiting?"));
    assert_eq!(hits.load(Ordering::SeqCst), 3);
}

// Three `queuegate` processes on one Redis (as in tests/multi_instance.rs,
// kept here so their load does not overlap that file's timing-bound tests).

/// Replays `pass` on `at` until it no longer reaches the origin; panics
/// after 5 s (a pass is refused by every instance once it renews, at most
/// half its two-second life after the session ended).
async fn refused_on(pass: &str, at: &Instance) {
    for _ in 0..250 {
        let mut replay = Visitor::new();
        replay.jar.insert("qg_tickets".into(), pass.to_owned());
        if !replay
            .navigate(&at.url("/tickets/x"))
            .await
            .reached_origin()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the ended session's pass still admits");
}

#[tokio::test]
async fn an_ended_session_frees_its_slot_for_a_waiter_on_another_instance() {
    for exit in ["/tickets/done", "/tickets//done"] {
        let (_redis, _origin, instances) = three(
            RouteYaml::tickets(1)
                .with("pass_ttl", "2s")
                .with("exit_paths", "[/tickets/done]"),
        )
        .await;
        let mut a = Visitor::new();
        assert!(a
            .navigate(&instances[0].url("/tickets/x"))
            .await
            .reached_origin());
        // Its return confirms the session.
        assert!(a
            .navigate(&instances[1].url("/tickets/x"))
            .await
            .reached_origin());
        let pass = a.cookie("qg_tickets").unwrap().to_owned();
        let mut b = Visitor::new();
        assert!(!b
            .navigate(&instances[1].url("/tickets/x"))
            .await
            .reached_origin());

        let done = a.navigate(&instances[2].url(exit)).await;
        assert!(done.reached_origin(), "{exit}: {done:?}");
        assert!(a.cookie("qg_tickets").is_none(), "{exit}: pass not cleared");
        // The instance that ended it refuses the pass at once.
        let mut replay = Visitor::new();
        replay.jar.insert("qg_tickets".into(), pass.clone());
        assert!(!replay
            .navigate(&instances[2].url("/tickets/x"))
            .await
            .reached_origin());
        // Every instance refuses it within a few ticks (50 ms), while the
        // pass is still in the first half of its 2 s life, when it would
        // admit without a store call.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for (i, at) in instances.iter().enumerate() {
            let mut replay = Visitor::new();
            replay.jar.insert("qg_tickets".into(), pass.clone());
            assert!(
                !replay
                    .navigate(&at.url("/tickets/x"))
                    .await
                    .reached_origin(),
                "{exit}: instance {i} still admits the ended session's pass"
            );
        }
        // The slot is the waiter's, through another instance.
        wait_admitted(&mut b, &instances[1]).await;
        assert!(b
            .navigate(&instances[0].url("/tickets/x"))
            .await
            .reached_origin());
        for at in &instances {
            refused_on(&pass, at).await;
        }
    }
}

#[tokio::test]
async fn one_pass_over_three_instances_makes_exactly_its_requests() {
    let redis = RedisServer::start();
    for limit in [1, 3] {
        let (origin, hits) = counting_origin().await;
        let route = RouteYaml::tickets(5)
            .with("pass_ttl", "2s")
            .with("max_requests_per_session", limit);
        let instances = start_instances(&redis, &origin, route, 3).await;
        let mut v = Visitor::new();
        let a = v
            .navigate(&instances[0].url("/__queuegate/waiting?route=tickets&return=/tickets/x"))
            .await;
        assert_eq!(a.location(), Some("/tickets/x"), "{a:?}");
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let mut tab = v.clone();
                let url = instances[i % 3].url("/tickets/x");
                tokio::spawn(async move { tab.fetch(&url).await.reached_origin() })
            })
            .collect();
        let mut reached = 0;
        for task in tasks {
            reached += usize::from(task.await.unwrap());
        }
        assert_eq!(reached, limit, "limit {limit}");
        assert_eq!(hits.load(Ordering::SeqCst), limit, "limit {limit}");
    }
}

// The client hangs up before the origin answers.

/// Sends `GET target` with `pass` on a socket of its own, waits until the
/// origin has the request, and closes the socket before the answer.
async fn hang_up_before_the_answer(gate: &Gate, target: &str, pass: &str, hits: &AtomicUsize) {
    use tokio::io::AsyncWriteExt;
    let before = hits.load(Ordering::SeqCst);
    let mut socket = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: shop.test\r\nAccept: text/html\r\n\
         Sec-Fetch-Mode: navigate\r\nCookie: qg_tickets={pass}\r\n\r\n"
    );
    socket.write_all(req.as_bytes()).await.unwrap();
    eventually("the origin has the request", || {
        hits.load(Ordering::SeqCst) > before
    })
    .await;
    drop(socket);
}

/// Whatever way a session ends with the origin's answer (an exit path, the
/// origin's command, the last request `max_requests_per_session` allows),
/// it ends when that answer comes although the client hung up before it:
/// the slot goes to the next waiter, the pass admits no more, and the
/// request is counted as one whose client went away.
async fn a_session_ends_though_its_client_hung_up(on_redis: bool) {
    for (how, target) in [
        ("exit_path", "/tickets/done?slow"),
        ("origin", "/tickets/end?slow"),
        ("max_requests", "/tickets/x?slow"),
    ] {
        let redis = on_redis.then(RedisServer::start);
        let mut r = route("tickets", "/tickets", 1);
        r.exit_paths = vec!["/tickets/done".into()];
        // The visitor's two requests that confirm it, and this one.
        r.max_requests_per_session = (how == "max_requests").then_some(3);
        let (gate, _origin, hits) = commanded_gate(r, redis.as_ref()).await;
        let a = inside(&gate).await;
        let pass = a.cookie("qg_tickets").unwrap().to_owned();
        let mut b = Visitor::new();
        assert!(!b.navigate(&gate.url("/tickets/x")).await.reached_origin());
        assert_eq!(b.status(&gate, "tickets").await["state"], "waiting");

        hang_up_before_the_answer(&gate, target, &pass, &hits).await;
        wait_admitted(&mut b, &gate).await;
        let replay = holding(&pass).navigate(&gate.url("/tickets/x")).await;
        assert!(!replay.reached_origin(), "{how}: {replay:?}");
        let metrics = gate.metrics().await;
        let count = |series: &str| sample(&metrics, series);
        assert_eq!(
            count("queuegate_requests_total{decision=\"client_gone\"}"),
            1.0,
            "{how}"
        );
        assert_eq!(
            count("queuegate_client_gone_total{route=\"tickets\"}"),
            1.0,
            "{how}"
        );
        let ended = format!("queuegate_sessions_ended_total{{route=\"tickets\",reason=\"{how}\"}}");
        assert_eq!(count(&ended), 1.0, "{how}");
    }
}

#[tokio::test]
async fn a_session_ends_though_its_client_hung_up_on_memory() {
    a_session_ends_though_its_client_hung_up(false).await;
}

#[tokio::test]
async fn a_session_ends_though_its_client_hung_up_on_redis() {
    a_session_ends_though_its_client_hung_up(true).await;
}
