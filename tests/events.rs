//! Pushed updates (DESIGN §8.8): `GET /__queuegate/events` streams the
//! status JSON as Server-Sent Events. A waiter hears its place move and its
//! admission, on the memory store and on Redis (behind the head, from the
//! line record without a store call); a waiter who only holds the stream
//! open keeps its place past `abandon_after` and is admitted when due; the
//! streams per route, per visitor and per client address are capped, the
//! open ones and the refused ones counted on the admin metrics, and the
//! drain ends them.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use queuegate::config::{Backend, Config};

/// How long a test waits for an event before failing.
const EVENT_WITHIN: Duration = Duration::from_secs(20);

/// An open event stream, read event by event.
struct Events {
    body: Incoming,
    buffered: String,
}

impl Events {
    /// Opens `route`'s event stream on `gate` with `v`'s cookies, checking
    /// the stream's headers.
    async fn open(gate: &Gate, v: &Visitor, route: &str) -> Events {
        Events::open_from(gate, v, route, None).await
    }

    /// [`Events::open`] through a proxy that names the client in
    /// `X-Forwarded-For` as `from` (`None`: no header, the peer is the
    /// client).
    async fn open_from(gate: &Gate, v: &Visitor, route: &str, from: Option<&str>) -> Events {
        let mut req = Request::get(gate.url(&format!("/__queuegate/events?route={route}")))
            .header("accept", "text/event-stream");
        if let Some(from) = from {
            req = req.header("x-forwarded-for", from);
        }
        let cookies: Vec<String> = v.jar.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if !cookies.is_empty() {
            req = req.header("cookie", cookies.join("; "));
        }
        let resp = client::<Empty<Bytes>>()
            .request(req.body(Empty::new()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), http::StatusCode::OK);
        let headers = resp.headers();
        assert_eq!(headers["content-type"], "text/event-stream");
        assert_eq!(headers["cache-control"], "no-store");
        assert_eq!(headers["x-accel-buffering"], "no");
        assert_eq!(headers["x-queuegate"], "events");
        assert!(headers.get("set-cookie").is_none());
        Events {
            body: resp.into_body(),
            buffered: String::new(),
        }
    }

    /// The next event's JSON; `None` when the stream ended.
    async fn next(&mut self) -> Option<serde_json::Value> {
        loop {
            if let Some(end) = self.buffered.find("\n\n") {
                let event: String = self.buffered.drain(..end + 2).collect();
                let data = event
                    .strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not a data event: {event:?}"))
                    .trim_end();
                return Some(serde_json::from_str(data).expect("an event's data is JSON"));
            }
            let frame = tokio::time::timeout(EVENT_WITHIN, self.body.frame())
                .await
                .expect("an event in time");
            match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffered.push_str(std::str::from_utf8(&data).unwrap());
                    }
                }
                Some(Err(err)) => panic!("stream failed: {err}"),
                None => {
                    assert!(self.buffered.is_empty(), "a cut event: {:?}", self.buffered);
                    return None;
                }
            }
        }
    }

    /// Events until one satisfies `want`; fails if the stream ends first.
    async fn until(
        &mut self,
        what: &str,
        want: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        loop {
            match self.next().await {
                Some(event) if want(&event) => return event,
                Some(_) => {}
                None => panic!("the stream ended before {what}"),
            }
        }
    }
}

fn position(event: &serde_json::Value) -> u64 {
    event["position"]
        .as_u64()
        .unwrap_or_else(|| panic!("no position: {event}"))
}

/// A visitor who took the route's slot (and holds it).
async fn holder(gate: &Gate) -> Visitor {
    let mut v = Visitor::new();
    for _ in 0..2 {
        assert!(v.navigate(&gate.url("/tickets/in")).await.reached_origin());
    }
    v
}

/// A visitor who joined the line and polled once, as the waiting page does
/// (which confirms the ticket); the answer's place is checked.
async fn waiter(gate: &Gate, place: u64) -> Visitor {
    let mut v = Visitor::new();
    let a = v.navigate(&gate.url("/tickets/x")).await;
    assert_eq!(a.status, http::StatusCode::FOUND, "{a:?}");
    let s = v.status(gate, "tickets").await;
    assert_eq!(
        (s["state"].as_str(), position(&s)),
        (Some("waiting"), place)
    );
    v
}

fn config_for(origin: &Origin, redis: Option<&RedisServer>, abandon_after: Duration) -> Config {
    let mut config = proxy_config(&origin.url());
    if let Some(redis) = redis {
        config.store.backend = Backend::Redis;
        config.store.redis = redis.config(Duration::from_secs(2));
    }
    let mut r = route("tickets", "/tickets", 1);
    r.tick = Duration::from_millis(50);
    r.abandon_after = abandon_after;
    config.routes.push(r);
    config
}

/// The holder leaves, the waiter at the head is admitted, and the stream
/// of the one behind it says it moved up; the first one's stream says it
/// is admitted and ends, and its one status request gets the pass.
async fn place_moves_and_admission_ends_the_stream(redis: Option<&RedisServer>) {
    let (origin, _hits) = counting_origin().await;
    let gate = spawn_gate(config_for(&origin, redis, Duration::from_secs(30))).await;
    let mut first = holder(&gate).await;
    let mut second = waiter(&gate, 1).await;
    let third = waiter(&gate, 2).await;

    let mut second_events = Events::open(&gate, &second, "tickets").await;
    let mut third_events = Events::open(&gate, &third, "tickets").await;
    let at_once = third_events.next().await.expect("an event at once");
    assert_eq!(at_once["state"], "waiting", "{at_once}");
    assert_eq!(position(&at_once), 2);
    assert_eq!(at_once["route"], "tickets");
    assert_eq!(at_once["waiting_total"], 2);
    assert!(at_once["poll_after_ms"].as_u64().is_some());
    assert_eq!(position(&second_events.next().await.unwrap()), 1);

    first.leave(&gate, "tickets").await;
    let admitted = second_events
        .until("second's admission", |e| e["state"] != "waiting")
        .await;
    assert_eq!(admitted["state"], "admitted", "{admitted}");
    assert!(second_events.next().await.is_none(), "the stream ends");
    assert_eq!(second.status(&gate, "tickets").await["state"], "admitted");
    assert!(second.cookie("qg_tickets").unwrap().starts_with("v1.a."));
    let moved = third_events
        .until("third moves up", |e| e["position"] == 1)
        .await;
    assert_eq!(moved["state"], "waiting");
    drop(origin);
}

#[tokio::test]
async fn a_stream_on_the_memory_store_tells_moves_and_admission() {
    place_moves_and_admission_ends_the_stream(None).await;
}

#[tokio::test]
async fn a_stream_on_redis_tells_moves_and_admission() {
    let redis = RedisServer::start();
    place_moves_and_admission_ends_the_stream(Some(&redis)).await;
}

/// The admin metrics of `gate`, read by `sample`.
async fn metrics(gate: &Gate) -> String {
    let body = Visitor::new().fetch(&gate.admin_url("/metrics")).await.body;
    String::from_utf8_lossy(&body).into_owned()
}

/// The value of `series` (name and labels) in `text`; 0 when absent.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0, |n| n.trim().parse::<u64>().expect("a count"))
}

/// Polls of `route` answered (from the record, by the store) at `gate`.
async fn polls(gate: &Gate) -> (u64, u64) {
    let text = metrics(gate).await;
    let count = |by: &str| {
        let series = format!("queuegate_polls_total{{route=\"tickets\",answered_by=\"{by}\"}}");
        sample(&text, &series)
    };
    (count("record"), count("store"))
}

/// Event streams open on `tickets` at `gate`, and those refused there for
/// the route's cap and for the visitor's, as its admin metrics read.
async fn stream_counts(gate: &Gate) -> (u64, u64, u64) {
    let text = metrics(gate).await;
    let refused = |reason: &str| {
        let series = format!(
            "queuegate_event_streams_refused_total{{route=\"tickets\",reason=\"{reason}\"}}"
        );
        sample(&text, &series)
    };
    (
        sample(&text, r#"queuegate_event_streams{route="tickets"}"#),
        refused("route"),
        refused("visitor"),
    )
}

/// Behind the first 100 places on Redis, a stream's updates come from the
/// line record each tick leaves, with no store call: waiters ahead leave,
/// and the stream tells the new place.
#[tokio::test]
async fn behind_the_head_a_stream_follows_the_record_without_store_calls() {
    let redis = RedisServer::start();
    let (origin, _hits) = counting_origin().await;
    let config = config_for(&origin, Some(&redis), Duration::from_secs(30));
    let gate = spawn_gate_opts(config, ring("k1"), Default::default()).await;
    let _first = holder(&gate).await;
    let mut line = Vec::new();
    for place in 1..=130 {
        line.push(waiter(&gate, place).await);
    }
    let last = line.pop().unwrap();
    // A tick after the last join leaves a record with everyone in it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut events = Events::open(&gate, &last, "tickets").await;
    let at_once = events.next().await.unwrap();
    assert_eq!(position(&at_once), 130, "{at_once}");
    let before = polls(&gate).await;

    for v in line.iter_mut().take(20) {
        v.leave(&gate, "tickets").await;
    }
    let moved = events
        .until("the place moves", |e| position(e) <= 115)
        .await;
    // Within 2 % of the real place (DESIGN §8.9).
    assert!(position(&moved).abs_diff(110) <= 3, "{moved}");
    let after = polls(&gate).await;
    assert!(
        after.0 > before.0,
        "answered from the record: {before:?} {after:?}"
    );
    assert_eq!(
        after.1, before.1,
        "no store call for the stream: {before:?} {after:?}"
    );
    drop(origin);
}

/// With `abandon_after` 2 s on Redis, waiters who only hold their streams
/// open (no polls, no cookie written again) keep their places for three
/// times that, those behind the head as well as at it; the one at the head
/// is admitted when the slot frees, and its one status request, with the
/// ticket it had when the stream opened, gets the pass.
#[tokio::test]
async fn a_waiter_holding_only_the_stream_keeps_its_place_past_abandon_after() {
    let redis = RedisServer::start();
    let (origin, _hits) = counting_origin().await;
    let config = config_for(&origin, Some(&redis), Duration::from_secs(2));
    let gate = spawn_gate(config).await;
    let mut first = holder(&gate).await;
    let mut line = Vec::new();
    for place in 1..=110 {
        line.push(waiter(&gate, place).await);
    }
    let mut streams = Vec::new();
    for v in &line {
        let mut events = Events::open(&gate, v, "tickets").await;
        assert_eq!(events.next().await.unwrap()["state"], "waiting");
        streams.push(events);
    }
    // Three times abandon_after with nothing but the streams; a ghost would
    // be dropped after one. The keepalive comes every 15 s, so the streams
    // are read only at the end.
    tokio::time::sleep(Duration::from_secs(6)).await;
    // Waiters who never polled since, behind the head and at it: still at
    // their places, with the tickets they joined with (a waiter dropped
    // would have joined anew, under another id).
    for place in [110, 50, 1] {
        let mut probe = line[place - 1].clone();
        let s = probe.status(&gate, "tickets").await;
        assert_eq!(
            (s["state"].as_str(), position(&s)),
            (Some("waiting"), place as u64),
            "{s}"
        );
        assert_eq!(s["waiting_total"], 110, "nobody was dropped: {s}");
        assert_eq!(
            ticket_id(&probe),
            ticket_id(&line[place - 1]),
            "the same ticket"
        );
    }

    first.leave(&gate, "tickets").await;
    let head = &mut streams[0];
    let admitted = head
        .until("the head's admission", |e| e["state"] != "waiting")
        .await;
    assert_eq!(admitted["state"], "admitted", "{admitted}");
    let mut at_head = line[0].clone();
    assert_eq!(at_head.status(&gate, "tickets").await["state"], "admitted");
    assert!(at_head.cookie("qg_tickets").unwrap().starts_with("v1.a."));
    drop(origin);
}

/// The stream's polls carry the last heartbeat it sent, as the ticket the
/// page cannot be given would: when Redis loses everything while waiters
/// have held only their streams for longer than `abandon_after`, their next
/// polls restore them at their places (with the joining time in their
/// tickets) instead of sending them to the back.
#[tokio::test]
async fn a_stream_held_past_abandon_after_is_restored_after_a_store_loss() {
    let redis = RedisServer::start();
    let (origin, _hits) = counting_origin().await;
    let config = config_for(&origin, Some(&redis), Duration::from_secs(2));
    let gate = spawn_gate(config).await;
    let _first = holder(&gate).await;
    let line = [waiter(&gate, 1).await, waiter(&gate, 2).await];
    let mut streams = Vec::new();
    for v in &line {
        let mut events = Events::open(&gate, v, "tickets").await;
        assert_eq!(events.next().await.unwrap()["state"], "waiting");
        streams.push(events);
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    redis.query::<()>(&["FLUSHALL"]);
    // Each stream polls the store within a second: both are back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (i, v) in line.iter().enumerate() {
        let mut probe = v.clone();
        let s = probe.status(&gate, "tickets").await;
        assert_eq!(
            (s["state"].as_str(), position(&s)),
            (Some("waiting"), i as u64 + 1),
            "{s}"
        );
        assert_eq!(ticket_id(&probe), ticket_id(v), "the same ticket");
    }
    drop(streams);
    drop(origin);
}

/// The id in `v`'s ticket cookie.
fn ticket_id(v: &Visitor) -> String {
    let value = v.cookie("qg_tickets").expect("a ticket");
    value.split('.').nth(3).expect("an id").to_owned()
}

/// Without a ticket, or for a route that does not exist, the stream is one
/// event with the status JSON, and ends.
#[tokio::test]
async fn without_a_ticket_the_stream_is_one_event() {
    let (origin, _hits) = counting_origin().await;
    let gate = spawn_gate(config_for(&origin, None, Duration::from_secs(30))).await;
    let nobody = Visitor::new();
    let mut events = Events::open(&gate, &nobody, "tickets").await;
    let only = events.next().await.unwrap();
    assert_eq!(
        (only["state"].as_str(), only["route"].as_str()),
        (Some("unknown"), Some("tickets"))
    );
    assert!(events.next().await.is_none());

    let mut events = Events::open(&gate, &nobody, "nope%0d%0a").await;
    assert_eq!(events.next().await.unwrap()["state"], "unknown");
    assert!(events.next().await.is_none());

    // A pass is the status endpoint's to renew: the page asks it.
    let admitted = holder(&gate).await;
    let mut events = Events::open(&gate, &admitted, "tickets").await;
    assert_eq!(events.next().await.unwrap()["state"], "poll");
    assert!(events.next().await.is_none());

    let (parts, _) = send(
        Request::post(gate.url("/__queuegate/events?route=tickets"))
            .body(http_body_util::Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(parts.status, http::StatusCode::METHOD_NOT_ALLOWED);
    drop(origin);
}

/// Streams `v` opens on `tickets` until one is a waiter's stream (its
/// first event `waiting`), each refused one ending after its one event;
/// the server notices a closed stream when it next writes to it (the
/// keepalive, at the latest), so this waits for that.
async fn open_when_allowed(gate: &Gate, v: &Visitor) -> Option<Events> {
    for _ in 0..400 {
        let mut events = Events::open(gate, v, "tickets").await;
        if events.next().await.unwrap()["state"] == "waiting" {
            return Some(events);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Beyond `limits.max_event_streams` open on a route, a stream is one
/// event telling the page to poll; a closed stream frees its place.
#[tokio::test]
async fn streams_beyond_the_cap_tell_the_page_to_poll() {
    let (origin, _hits) = counting_origin().await;
    let mut config = config_for(&origin, None, Duration::from_secs(30));
    config.limits.max_event_streams = 1;
    let gate = spawn_gate_opts(config, ring("k1"), Default::default()).await;
    let _first = holder(&gate).await;
    let one = waiter(&gate, 1).await;
    let two = waiter(&gate, 2).await;
    let mut open = Events::open(&gate, &one, "tickets").await;
    assert_eq!(open.next().await.unwrap()["state"], "waiting");
    let mut refused = Events::open(&gate, &two, "tickets").await;
    let only = refused.next().await.unwrap();
    assert_eq!(only["state"], "poll", "{only}");
    assert!(only["poll_after_ms"].as_u64().is_some());
    assert!(refused.next().await.is_none());

    drop(open);
    let again = open_when_allowed(&gate, &two).await;
    assert!(again.is_some(), "the closed stream's place was given back");
    let (open, over_route, over_visitor) = stream_counts(&gate).await;
    assert_eq!((open, over_visitor), (1, 0));
    assert!(over_route >= 1, "the refusal is counted: {over_route}");
    drop(origin);
}

/// One visitor (one ticket, one cookie) holds at most four streams at an
/// instance: a fifth is one event telling the page to poll, counted as
/// over the visitor's cap, while another visitor's stream still opens; a
/// closed one of the four frees a place for the visitor's next. The open
/// streams read right on the admin metrics throughout.
#[tokio::test]
async fn a_visitor_holds_at_most_four_streams() {
    let (origin, _hits) = counting_origin().await;
    let config = config_for(&origin, None, Duration::from_secs(30));
    let gate = spawn_gate_opts(config, ring("k1"), Default::default()).await;
    let _first = holder(&gate).await;
    let one = waiter(&gate, 1).await;
    let two = waiter(&gate, 2).await;
    let mut tabs = Vec::new();
    for _ in 0..4 {
        let mut events = Events::open(&gate, &one, "tickets").await;
        let first = events.next().await.unwrap();
        assert_eq!(
            (first["state"].as_str(), position(&first)),
            (Some("waiting"), 1)
        );
        tabs.push(events);
    }
    assert_eq!(stream_counts(&gate).await, (4, 0, 0));

    let mut refused = Events::open(&gate, &one, "tickets").await;
    let only = refused.next().await.unwrap();
    assert_eq!(only["state"], "poll", "{only}");
    assert_eq!(only["route"], "tickets");
    assert!(only["poll_after_ms"].as_u64().is_some());
    assert!(refused.next().await.is_none());
    assert_eq!(stream_counts(&gate).await, (4, 0, 1));

    let mut other = Events::open(&gate, &two, "tickets").await;
    let first = other.next().await.unwrap();
    assert_eq!(
        (first["state"].as_str(), position(&first)),
        (Some("waiting"), 2)
    );
    assert_eq!(stream_counts(&gate).await.0, 5);

    drop(tabs.pop());
    let again = open_when_allowed(&gate, &one).await;
    assert!(again.is_some(), "the closed stream's place was given back");
    tabs.extend(again);
    let (open, over_route, _) = stream_counts(&gate).await;
    assert_eq!((open, over_route), (5, 0));
    drop(origin);
}

/// The drain ends open streams at once, rather than at its deadline.
#[tokio::test]
async fn the_drain_ends_open_streams() {
    let (origin, _hits) = counting_origin().await;
    let mut config = config_for(&origin, None, Duration::from_secs(30));
    config.limits.drain_timeout = Duration::from_secs(600);
    let mut gate = spawn_gate(config).await;
    let _first = holder(&gate).await;
    let v = waiter(&gate, 1).await;
    let mut events = Events::open(&gate, &v, "tickets").await;
    assert_eq!(events.next().await.unwrap()["state"], "waiting");
    gate.start_drain();
    // Well before the keepalive, let alone the drain deadline.
    let ended = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("the stream ends at the drain");
    assert!(ended.is_none(), "{ended:?}");
    gate.stop().await.unwrap();
    drop(origin);
}

/// Event streams one client address may hold open at an instance here
/// (`limits.max_event_streams_per_client`).
const PER_CLIENT: usize = 3;

/// Refusals of `tickets` streams at `gate` over the client's cap.
async fn refused_for_client(gate: &Gate) -> u64 {
    let text = metrics(gate).await;
    sample(
        &text,
        r#"queuegate_event_streams_refused_total{route="tickets",reason="client"}"#,
    )
}

/// Waits (for at most 30 s: a closed stream is noticed when it is next
/// written to, the keepalive at the latest) until `gate` counts `open`
/// streams open on `tickets`.
async fn until_open_streams(gate: &Gate, open: u64) {
    for _ in 0..300 {
        if stream_counts(gate).await.0 == open {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the open streams never came to {open}: {:?}",
        stream_counts(gate).await
    );
}

/// Many visitors behind one client address (an IPv6 /64, as the trusted
/// proxy in front names them) open streams: past the per-client cap a
/// stream is one event telling the page to poll, counted as over the
/// client's cap, while another address still opens one. Once the
/// address's streams close, the open streams read right again and the
/// address opens streams anew.
#[tokio::test]
async fn streams_from_one_address_stop_at_its_cap_and_another_address_still_opens_one() {
    let (origin, _hits) = counting_origin().await;
    let mut config = config_for(&origin, None, Duration::from_secs(30));
    config.client_ip.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
    config.limits.max_event_streams_per_client = PER_CLIENT;
    let gate = spawn_gate_opts(config, ring("k1"), Default::default()).await;
    let _first = holder(&gate).await;
    let mut waiters = Vec::new();
    for place in 1..=PER_CLIENT as u64 + 2 {
        waiters.push(waiter(&gate, place).await);
    }
    let same_net = |i: usize| format!("2001:db8:7:7::{:x}", i + 1);
    let mut crowd = Vec::new();
    for (i, v) in waiters.iter().take(PER_CLIENT).enumerate() {
        let mut events = Events::open_from(&gate, v, "tickets", Some(&same_net(i))).await;
        let first = events.next().await.unwrap();
        assert_eq!(first["state"], "waiting", "visitor {i}: {first}");
        crowd.push(events);
    }
    assert_eq!(stream_counts(&gate).await, (PER_CLIENT as u64, 0, 0));

    // One more from the same /64, another visitor: told to poll.
    let late = &waiters[PER_CLIENT];
    let mut refused = Events::open_from(&gate, late, "tickets", Some("2001:db8:7:7::ffff")).await;
    let only = refused.next().await.unwrap();
    assert_eq!(only["state"], "poll", "{only}");
    assert!(only["poll_after_ms"].as_u64().is_some(), "{only}");
    assert!(refused.next().await.is_none());
    assert_eq!(refused_for_client(&gate).await, 1);

    // Another address still opens one.
    let other = &waiters[PER_CLIENT + 1];
    let mut elsewhere = Events::open_from(&gate, other, "tickets", Some("203.0.113.9")).await;
    assert_eq!(elsewhere.next().await.unwrap()["state"], "waiting");
    assert_eq!(stream_counts(&gate).await.0, PER_CLIENT as u64 + 1);

    // The address's streams close: the gauge comes back down to the one
    // left, and the address opens streams again.
    drop(crowd);
    until_open_streams(&gate, 1).await;
    let mut again = Events::open_from(&gate, late, "tickets", Some("2001:db8:7:7::ffff")).await;
    assert_eq!(again.next().await.unwrap()["state"], "waiting");
    assert_eq!(stream_counts(&gate).await.0, 2);
    assert_eq!(refused_for_client(&gate).await, 1);
    drop(origin);
}
