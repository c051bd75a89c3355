//! The gate's decisions on a real memory store (and a Redis store nobody
//! listens for), with the clock paused where time matters. Store calls
//! are counted by the breaker, as `queuegate_store_calls_total` exports
//! them.

use std::collections::HashMap;
use std::time::Duration;

use http::header::{HeaderMap, HeaderValue, COOKIE};

use super::*;
use crate::admission::KeyRing;
use crate::config::Config;
use crate::cookie::CookieMemo;
use crate::metrics::Metrics;
use crate::queue::{BreakerConfig, Operation, Store};

/// 2026-01-01T00:00:00Z.
const NEW_YEAR_S: u64 = 1_767_225_600;

/// A config with one route `tickets` of `route` (extra fields of its
/// entry) on store `store`.
fn config(store: &str, route: &str) -> Config {
    let yaml = format!(
        "listen: [{{ addr: 127.0.0.1:8080 }}]\n\
         upstream: {{ url: http://127.0.0.1:3000 }}\n\
         keys: [{{ id: k1, env: QUEUEGATE_KEY_K1 }}]\n\
         store: {store}\n\
         routes:\n\
         \x20 - {{ name: tickets, match: {{ path_prefix: /tickets }}, capacity: 1{route} }}\n"
    );
    match Config::from_yaml(&yaml) {
        Ok(config) => config,
        Err(err) => panic!("{err}\n{yaml}"),
    }
}

/// The settings and a gate on the store `config` names, by `clock`.
fn gate(config: &Config, clock: Clock) -> (Settings, Gate) {
    let ring = KeyRing::new(vec![("k1".into(), vec![7; 32])]).expect("a key ring");
    let metrics = Metrics::new();
    let caches = Arc::new(crate::cache::Caches::new(
        config.limits.cache_bytes,
        &metrics,
    ));
    let s = Settings::new(
        config,
        ring,
        &HashMap::new(),
        &metrics,
        &caches,
        &HashMap::new(),
    );
    let store = Store::from_config(&config.store, clock).expect("a store");
    let store = Guarded::new(store, BreakerConfig::for_store(&config.store));
    (s, Gate::new(store, clock))
}

fn clock_at_new_year() -> Clock {
    Clock::starting_at(Duration::from_secs(NEW_YEAR_S))
}

fn anyone() -> Requester<'static> {
    Requester {
        tls: false,
        client: b"",
        invite: None,
        invited: None,
    }
}

/// Every store call made so far.
fn store_calls(gate: &Gate) -> u64 {
    let breaker = gate.store().breaker();
    Operation::ALL.iter().map(|&op| breaker.calls(op)).sum()
}

/// The credentials of a request sending back the cookie `set` sets.
fn sending(s: &Settings, set: &HeaderValue) -> Credentials {
    let text = set.to_str().expect("an ASCII cookie");
    let pair = text.split(';').next().unwrap_or_default();
    let mut headers = HeaderMap::new();
    headers.insert(COOKIE, HeaderValue::from_str(pair).expect("a cookie"));
    s.credentials(0, &headers, false, &CookieMemo::default())
}

async fn decide(gate: &Gate, s: &Settings, creds: Credentials) -> Decision {
    gate.decide(s, 0, anyone(), || creds).await.decision
}

fn cookie_of(decision: Decision) -> HeaderValue {
    match decision.into_set_cookie() {
        Some(cookie) => cookie,
        None => panic!("no cookie set"),
    }
}

/// Fails unless `decision` admits, as `how`.
fn assert_admitted(decision: &Decision, how: Admitted) {
    assert!(
        matches!(decision, Decision::Admit { how: h, .. } if *h == how),
        "not admitted {how:?}: {decision:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fresh_confirmed_pass_admits_without_a_store_call() {
    let (s, gate) = gate(&config("{ backend: memory }", ""), clock_at_new_year());
    let first = decide(&gate, &s, Credentials::default()).await;
    assert_admitted(&first, Admitted::AtOnce);
    // Its first return confirms the session: a store call.
    let unconfirmed = sending(&s, &cookie_of(first));
    let back = decide(&gate, &s, unconfirmed).await;
    assert_admitted(&back, Admitted::Renewed);
    let confirmed = sending(&s, &cookie_of(back));
    let calls = store_calls(&gate);
    assert!(calls >= 2, "{calls}");
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(1)).await;
        let again = decide(&gate, &s, confirmed).await;
        assert!(
            matches!(
                again,
                Decision::Admit {
                    how: Admitted::Pass,
                    set_cookie: None,
                    ..
                }
            ),
            "{again:?}"
        );
    }
    assert_eq!(store_calls(&gate), calls);
}

#[tokio::test(start_paused = true)]
async fn an_admit_now_pass_seen_confirmed_costs_no_more_store_calls() {
    let (s, gate) = gate(&config("{ backend: memory }", ""), clock_at_new_year());
    let first = decide(&gate, &s, Credentials::default()).await;
    let kept = sending(&s, &cookie_of(first));
    // A client that keeps its first cookie: confirmed once, then admitted
    // as a confirmed pass would be.
    let back = decide(&gate, &s, kept).await;
    assert!(matches!(
        back,
        Decision::Admit {
            how: Admitted::Renewed,
            ..
        }
    ));
    let calls = store_calls(&gate);
    let again = decide(&gate, &s, kept).await;
    assert_admitted(&again, Admitted::Pass);
    assert_eq!(store_calls(&gate), calls);
}

/// A Redis store on a port nobody listens on: every call fails.
const UNREACHABLE: &str =
    "{ backend: redis, redis: { url: \"redis://127.0.0.1:1\", timeout: 200ms } }";

#[tokio::test]
async fn a_failing_store_queues_in_the_local_line_when_the_route_says_local() {
    let route = ", on_store_error: local";
    let (s, gate) = gate(&config(UNREACHABLE, route), Clock::system());
    let first = decide(&gate, &s, Credentials::default()).await;
    assert_admitted(&first, Admitted::AtOnce);
    let second = decide(&gate, &s, Credentials::default()).await;
    let Decision::Wait { place, set_cookie } = second else {
        panic!("not queued: {second:?}");
    };
    assert_eq!((place.position, place.waiting_total), (1, 1));
    assert!(s.routes[0].live.answered_locally());
    // Its poll is answered by the local line too.
    let waiting = sending(&s, &set_cookie.expect("a ticket"));
    let polled = decide(&gate, &s, waiting).await;
    assert!(matches!(polled, Decision::Wait { .. }), "{polled:?}");
    assert!(store_calls(&gate) >= 3);
}

#[tokio::test]
async fn a_failing_store_refuses_when_the_route_says_closed() {
    let route = ", on_store_error: closed";
    let (s, gate) = gate(&config(UNREACHABLE, route), Clock::system());
    let first = decide(&gate, &s, Credentials::default()).await;
    assert!(matches!(first, Decision::Unavailable), "{first:?}");
    assert!(!s.routes[0].live.answered_locally());
}

#[tokio::test(start_paused = true)]
async fn a_ticket_before_the_opening_is_answered_with_the_time_left() {
    // Opens a day after the clock's start.
    let route = ", opens_at: \"2026-01-02T00:00:00Z\"";
    let (s, gate) = gate(&config("{ backend: memory }", route), clock_at_new_year());
    let arrived = decide(&gate, &s, Credentials::default()).await;
    let Decision::PreQueue {
        opens_in_ms,
        set_cookie,
        ..
    } = arrived
    else {
        panic!("not in the pre-queue: {arrived:?}");
    };
    assert_eq!(opens_in_ms, 24 * 3600 * 1000);
    let ticket = sending(&s, &set_cookie.expect("a pre-queue ticket"));
    let polls = gate.store().breaker().calls(Operation::Poll);
    tokio::time::advance(Duration::from_secs(3600)).await;
    let polled = decide(&gate, &s, ticket).await;
    let Decision::PreQueue { opens_in_ms, .. } = polled else {
        panic!("not in the pre-queue: {polled:?}");
    };
    assert_eq!(opens_in_ms, 23 * 3600 * 1000);
    assert_eq!(gate.store().breaker().calls(Operation::Poll), polls);
}

#[tokio::test(start_paused = true)]
async fn a_pass_given_up_by_leave_is_refused_at_once() {
    let (s, gate) = gate(&config("{ backend: memory }", ""), clock_at_new_year());
    let first = decide(&gate, &s, Credentials::default()).await;
    let back = decide(&gate, &s, sending(&s, &cookie_of(first))).await;
    let confirmed = sending(&s, &cookie_of(back));
    assert!(gate.leave(&s.routes[0], &confirmed).await);
    // Not admitted on it: it arrives anew, and the slot it gave up is free.
    let after = decide(&gate, &s, confirmed).await;
    assert_admitted(&after, Admitted::AtOnce);
}

#[tokio::test]
async fn requests_are_counted_in_the_local_line_whatever_the_policy() {
    let route = ", on_store_error: closed, max_requests_per_session: 2";
    let (s, gate) = gate(&config(UNREACHABLE, route), Clock::system());
    let route = &s.routes[0];
    let id = [5; 16];
    let counts = [
        gate.count_request(route, &id).await,
        gate.count_request(route, &id).await,
        gate.count_request(route, &id).await,
    ];
    assert_eq!(
        counts,
        [Counted::Allowed, Counted::Last, Counted::Exhausted],
        "{counts:?}"
    );
    assert_eq!(gate.store().breaker().calls(Operation::CountRequest), 3);
}
