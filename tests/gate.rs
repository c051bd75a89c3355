//! The gate end to end on real sockets: nobody reaches a gated route without
//! a pass the server signed, the line is fair, and the origin never sees more
//! than the route's capacity.

mod common;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine;
use common::*;
use http::StatusCode;
use queuegate::admission::{KeyRing, Kind};
use rand::{Rng, SeedableRng};

#[tokio::test]
async fn capacity_n_then_the_line() {
    let (gate, _origin, hits) = gated(3, |_| {}).await;
    let mut admitted = Vec::new();
    for i in 0..3 {
        let mut v = Visitor::new();
        let a = v.navigate(&gate.url(&format!("/tickets/{i}"))).await;
        assert!(
            a.reached_origin(),
            "visitor {i} should be admitted at once: {a:?}"
        );
        // Admitted at once: a pass not yet confirmed by a return (§8.3).
        assert!(v.cookie("qg_tickets").unwrap().starts_with("v1.n.tickets."));
        admitted.push(v);
    }
    assert_eq!(hits.load(Ordering::SeqCst), 3);

    let mut late = Visitor::new();
    let a = late.navigate(&gate.url("/tickets/seat?n=4&x=%2F")).await;
    assert_eq!(a.status, StatusCode::FOUND);
    let location = a.location().unwrap();
    assert!(
        location.starts_with("/__queuegate/waiting?route=tickets&return="),
        "{location}"
    );
    let query = location.split_once('?').unwrap().1;
    let page = queuegate::waiting::page::WaitingQuery::parse(query);
    assert_eq!(page.return_path, "/tickets/seat?n=4&x=%2F");
    assert!(late
        .cookie("qg_tickets")
        .unwrap()
        .starts_with("v1.w.tickets."));

    let a = late.fetch(&gate.url("/tickets/api")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(a.headers.get("retry-after").is_some());
    let body = a.json();
    assert_eq!(body["state"], "waiting");
    assert_eq!(body["route"], "tickets");
    assert_eq!(body["position"], 1);
    assert_eq!(body["status_url"], "/__queuegate/status?route=tickets");

    let mut poster = Visitor::new();
    let a = poster.post(&gate.url("/tickets/buy"), "{}").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.json()["position"], 2);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        3,
        "nobody past capacity reached the origin"
    );
}

#[tokio::test]
async fn waiting_status_is_configurable() {
    let (gate, _origin, _hits) =
        gated(1, |r| r.waiting_status = StatusCode::TOO_MANY_REQUESTS).await;
    Visitor::new().navigate(&gate.url("/tickets")).await;
    let a = Visitor::new().fetch(&gate.url("/tickets")).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.json()["state"], "waiting");
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[tokio::test]
async fn nothing_without_a_valid_pass_reaches_the_origin() {
    let (gate, _origin, hits) = gated(1, |_| {}).await;
    let mut holder = Visitor::new();
    assert!(holder
        .navigate(&gate.url("/tickets"))
        .await
        .reached_origin());
    let pass = holder.cookie("qg_tickets").unwrap().to_owned();
    let mut other = Visitor::new();
    assert!(other.navigate(&gate.url("/other")).await.reached_origin());
    let other_pass = other.cookie("qg_other").unwrap().to_owned();
    let mut waiter = Visitor::new();
    waiter.navigate(&gate.url("/tickets")).await;
    let ticket = waiter.cookie("qg_tickets").unwrap().to_owned();
    let before = hits.load(Ordering::SeqCst);

    let fields: Vec<&str> = pass.split('.').collect();
    let mut flipped_mac = fields.clone();
    let mac = fields[6];
    let first = if mac.starts_with('A') { "B" } else { "A" };
    let flipped = format!("{first}{}", &mac[1..]);
    flipped_mac[6] = &flipped;
    let mut edited_expiry = fields.clone();
    let later = match fields[4].split_once('-') {
        Some((expiry, at)) => format!("{}-{at}", expiry.parse::<u64>().unwrap() + 3600),
        None => (fields[4].parse::<u64>().unwrap() + 3600).to_string(),
    };
    edited_expiry[4] = &later;
    let relabelled = ticket.replacen("v1.w.", "v1.a.", 1);
    let foreign = KeyRing::new(vec![("k9".into(), vec![7u8; 32])]).unwrap();
    let unknown_kid = foreign.sign(Kind::Pass, "tickets", &[1u8; 16], u64::MAX / 2);
    let random_id = b64(&[3u8; 16]);
    let forged_same_kid = format!("v1.a.tickets.{random_id}.9999999999.k1.{}", b64(&[0u8; 32]));
    let huge = "v1.".to_owned() + &"a".repeat(10 * 1024);
    let cases: Vec<(&str, String)> = vec![
        ("garbage", "qg_tickets=hello".into()),
        (
            "flipped mac",
            format!("qg_tickets={}", flipped_mac.join(".")),
        ),
        (
            "edited expiry",
            format!("qg_tickets={}", edited_expiry.join(".")),
        ),
        ("other route's pass", format!("qg_tickets={other_pass}")),
        (
            "ticket relabelled as pass",
            format!("qg_tickets={relabelled}"),
        ),
        ("unknown kid", format!("qg_tickets={unknown_kid}")),
        ("forged mac", format!("qg_tickets={forged_same_kid}")),
        ("10 KB cookie", format!("qg_tickets={huge}")),
        (
            "two bad copies",
            format!("qg_tickets=x; qg_tickets={}", flipped_mac.join(".")),
        ),
        ("extra field", format!("qg_tickets={pass}.extra")),
        ("empty", "qg_tickets=".into()),
        ("no cookie", String::new()),
    ];
    for (what, cookie) in &cases {
        for nav in [true, false] {
            let mut req = http::Request::get(gate.url("/tickets/secret"));
            if !cookie.is_empty() {
                req = req.header("cookie", cookie.as_str());
            }
            if nav {
                req = req
                    .header("accept", "text/html")
                    .header("sec-fetch-mode", "navigate");
            }
            let req = req
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            let (parts, _) = send(req).await;
            assert!(
                parts.status == StatusCode::FOUND
                    || parts.status == StatusCode::SERVICE_UNAVAILABLE,
                "{what}: got {}",
                parts.status
            );
            assert!(parts.headers.get("x-queuegate").is_some(), "{what}");
        }
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        before,
        "the origin saw a request without a valid pass"
    );
    // The real pass still works.
    assert!(holder
        .navigate(&gate.url("/tickets"))
        .await
        .reached_origin());

    // The same, on one keep-alive connection that sends the real pass
    // between the bad cookies: what it proved once is not lent to them.
    let mut conn = KeepAlive::connect(gate.addr).await;
    let real = format!("qg_tickets={pass}");
    for (what, cookie) in &cases {
        let (status, head) = conn.get("/tickets/secret", &real).await;
        assert_eq!(status, StatusCode::OK, "real pass before {what}: {head}");
        assert!(!head.contains("x-queuegate"), "{what}: {head}");
        let seen = hits.load(Ordering::SeqCst);
        let (status, head) = conn.get("/tickets/secret", cookie).await;
        assert!(
            status == StatusCode::FOUND || status == StatusCode::SERVICE_UNAVAILABLE,
            "{what} after the real pass on one connection: got {status}"
        );
        assert!(head.contains("x-queuegate"), "{what}: {head}");
        assert_eq!(
            hits.load(Ordering::SeqCst),
            seen,
            "{what} reached the origin"
        );
    }
}

#[tokio::test]
async fn queuegate_cookies_never_reach_the_origin() {
    let (gate, _origin, _hits) = gated(5, |_| {}).await;
    let mut v = Visitor::new();
    v.jar.insert("session".into(), "app-cookie".into());
    v.navigate(&gate.url("/tickets")).await;
    let a = v.navigate(&gate.url("/tickets")).await;
    assert!(a.reached_origin());
    assert_eq!(a.headers["x-origin-cookies"], "session=app-cookie");
    let a = v.navigate(&gate.url("/ungated")).await;
    assert_eq!(a.headers["x-origin-cookies"], "session=app-cookie");
}

/// On tokio's paused clock: the gate serves this runtime's connections (one
/// worker) and reads time through tokio, so the passes age while the runtime
/// skips ahead from timer to timer, without waiting in real time.
#[tokio::test(start_paused = true)]
async fn a_pass_renews_and_stops_working_after_leave() {
    // Long enough that no request lands on a whole second's edge by chance:
    // the first half of a pass's life is five seconds.
    const PASS_TTL: Duration = Duration::from_secs(10);
    let (origin, _hits) = counting_origin().await;
    let mut config = proxy_config(&origin.url());
    config.limits.workers = Some(1);
    let mut r = route("tickets", "/tickets", 1);
    r.pass_ttl = PASS_TTL;
    config.routes.push(r);
    let gate = spawn_gate_with(config, ring("k1")).await;
    // A pass issued within a second of the route's creation cannot be told
    // apart from one issued before it (passes have one-second resolution), and
    // would be restored as lost with the store: let the route age first. On
    // the paused clock this sleep returns as soon as the admitter has ticked
    // through it.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let mut a = Visitor::new();
    assert!(a.navigate(&gate.url("/tickets")).await.reached_origin());
    // The first return confirms the session through the store: a
    // confirmed pass replaces the admit-now one.
    assert!(a.cookie("qg_tickets").unwrap().starts_with("v1.n."));
    let confirmed = a.navigate(&gate.url("/tickets")).await;
    assert!(confirmed.reached_origin());
    let first = a.cookie("qg_tickets").unwrap().to_owned();
    assert!(first.starts_with("v1.a."), "{first}");
    // Within the first half of its life, no new pass.
    let again = a.navigate(&gate.url("/tickets")).await;
    assert!(again.reached_origin());
    assert!(again.headers.get("set-cookie").is_none());
    // Past half its life: renewed through the store, with a new pass.
    tokio::time::sleep(PASS_TTL / 2 + Duration::from_millis(500)).await;
    let renewed = a.navigate(&gate.url("/tickets")).await;
    assert!(renewed.reached_origin());
    assert_ne!(a.cookie("qg_tickets").unwrap(), first, "pass renewed");

    // Another visitor waits; the first leaves but replays its old pass.
    let mut b = Visitor::new();
    b.navigate(&gate.url("/tickets")).await;
    let kept_pass = a.cookie("qg_tickets").unwrap().to_owned();
    assert_eq!(a.leave(&gate, "tickets").await.status, StatusCode::OK);
    wait_admitted(&mut b, &gate).await;
    let mut replay = Visitor::new();
    replay.jar.insert("qg_tickets".into(), kept_pass);
    let give_up = tokio::time::Instant::now() + PASS_TTL + Duration::from_secs(1);
    let mut stopped = false;
    while tokio::time::Instant::now() < give_up {
        let mut attempt = replay.clone();
        if !attempt
            .navigate(&gate.url("/tickets"))
            .await
            .reached_origin()
        {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stopped, "a pass given up kept working past pass_ttl");
}

#[tokio::test]
async fn a_pass_signed_with_the_old_key_verifies_after_rotation() {
    let (origin, _hits) = counting_origin().await;
    let mut config = proxy_config(&origin.url());
    config.routes.push(route("tickets", "/tickets", 5));
    let old = ring("k1");
    let gate = spawn_gate_with(config.clone(), old).await;
    let mut v = Visitor::new();
    assert!(v.navigate(&gate.url("/tickets")).await.reached_origin());
    gate.stop().await.unwrap();

    let rotated = KeyRing::new(vec![
        (
            "k2".into(),
            b"a brand new key that is long enough!".to_vec(),
        ),
        ("k1".into(), "test key k1 ".repeat(4).into_bytes()),
    ])
    .unwrap();
    let gate = spawn_gate_with(config, rotated).await;
    let a = v.navigate(&gate.url("/tickets")).await;
    assert!(
        a.reached_origin(),
        "old pass rejected after rotation: {a:?}"
    );
}

#[tokio::test]
async fn fifo_admission_in_join_order() {
    let (gate, _origin, _hits) = gated(1, |_| {}).await;
    let mut holder = Visitor::new();
    assert!(holder
        .navigate(&gate.url("/tickets"))
        .await
        .reached_origin());
    let mut line: Vec<Visitor> = Vec::new();
    for _ in 0..20 {
        let mut v = Visitor::new();
        assert_eq!(
            v.navigate(&gate.url("/tickets")).await.status,
            StatusCode::FOUND
        );
        line.push(v);
    }
    holder.leave(&gate, "tickets").await;
    let mut order = Vec::new();
    let mut done = HashSet::new();
    for _ in 0..2_000 {
        if done.len() == line.len() {
            break;
        }
        for (i, v) in line.iter_mut().enumerate() {
            if done.contains(&i) {
                continue;
            }
            if v.status(&gate, "tickets").await["state"] == "admitted" {
                assert!(v.navigate(&gate.url("/tickets")).await.reached_origin());
                order.push(i);
                done.insert(i);
                v.leave(&gate, "tickets").await;
            }
        }
    }
    assert_eq!(
        order,
        (0..20).collect::<Vec<_>>(),
        "admitted out of join order"
    );
}

#[tokio::test]
async fn random_crowd_never_exceeds_capacity() {
    const CAPACITY: usize = 4;
    let (gate, _origin, _hits) =
        gated(CAPACITY as u64, |r| r.tick = Duration::from_millis(10)).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut crowd: Vec<Visitor> = (0..100).map(|_| Visitor::new()).collect();
    let mut inside: HashSet<usize> = HashSet::new();
    let mut ever_inside = 0;
    for step in 0..1_500 {
        let i = rng.random_range(0..crowd.len());
        let v = &mut crowd[i];
        if inside.contains(&i) && rng.random_bool(0.3) {
            v.leave(&gate, "tickets").await;
            inside.remove(&i);
        } else if v
            .cookie("qg_tickets")
            .is_some_and(|c| c.starts_with("v1.w."))
            && rng.random_bool(0.5)
        {
            v.status(&gate, "tickets").await;
        } else if v
            .navigate(&gate.url("/tickets/page"))
            .await
            .reached_origin()
            && inside.insert(i)
        {
            ever_inside += 1;
        }
        assert!(
            inside.len() <= CAPACITY,
            "step {step}: {} inside",
            inside.len()
        );
        if step % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    }
    assert!(ever_inside > 20, "the crowd moved: {ever_inside} got in");
}

#[tokio::test]
async fn a_silent_waiter_is_dropped_and_never_takes_a_slot() {
    let (gate, _origin, _hits) = gated(1, |r| {
        r.abandon_after = Duration::from_millis(400);
    })
    .await;
    let mut holder = Visitor::new();
    assert!(holder
        .navigate(&gate.url("/tickets"))
        .await
        .reached_origin());
    let mut silent = Visitor::new();
    silent.navigate(&gate.url("/tickets")).await;
    let mut patient = Visitor::new();
    patient.navigate(&gate.url("/tickets")).await;
    assert_eq!(patient.status(&gate, "tickets").await["position"], 2);
    // Keep the patient one polling until the silent one is dropped.
    let mut dropped = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if patient.status(&gate, "tickets").await["position"] == 1 {
            dropped = true;
            break;
        }
    }
    assert!(dropped, "the silent waiter kept its place");
    holder.leave(&gate, "tickets").await;
    wait_admitted(&mut patient, &gate).await;
    // The silent one comes back: it lost its place and joins anew.
    let back = silent.status(&gate, "tickets").await;
    assert_eq!(back["state"], "waiting");
}

#[tokio::test]
async fn an_admitted_waiter_who_never_comes_frees_the_slot() {
    let (gate, _origin, _hits) = gated(1, |r| {
        r.arrival_grace = Duration::from_millis(300);
        r.abandon_after = Duration::from_secs(5);
    })
    .await;
    let mut holder = Visitor::new();
    assert!(holder
        .navigate(&gate.url("/tickets"))
        .await
        .reached_origin());
    let mut no_show = Visitor::new();
    no_show.navigate(&gate.url("/tickets")).await;
    let mut next = Visitor::new();
    next.navigate(&gate.url("/tickets")).await;
    holder.leave(&gate, "tickets").await;
    // The no-show never polls again; the next one does and gets in once the
    // arrival grace has run out.
    wait_admitted(&mut next, &gate).await;
    assert!(next.navigate(&gate.url("/tickets")).await.reached_origin());
}

#[tokio::test]
async fn parallel_first_requests_leave_one_place() {
    let (gate, _origin, _hits) = gated(1, |r| r.abandon_after = Duration::from_millis(500)).await;
    let mut holder = Visitor::new();
    assert!(holder
        .navigate(&gate.url("/tickets"))
        .await
        .reached_origin());
    let mut browser = Visitor::new();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut tab = browser.clone();
        let url = gate.url("/tickets");
        tasks.push(tokio::spawn(async move {
            let a = tab.navigate(&url).await;
            a.headers
        }));
    }
    for t in tasks {
        let headers = t.await.unwrap();
        browser.store_cookies(&headers);
    }
    let mut settled = false;
    for _ in 0..100 {
        let s = browser.status(&gate, "tickets").await;
        if s["waiting_total"] == 1 {
            assert_eq!(s["position"], 1);
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(settled, "eight first requests kept more than one place");
}

#[tokio::test]
async fn refresh_and_a_second_tab_keep_one_place() {
    let (gate, _origin, _hits) = gated(1, |_| {}).await;
    Visitor::new().navigate(&gate.url("/tickets")).await;
    let mut first = Visitor::new();
    first.navigate(&gate.url("/tickets")).await;
    let mut v = Visitor::new();
    v.navigate(&gate.url("/tickets")).await;
    let ticket = v.cookie("qg_tickets").unwrap().to_owned();
    let before = v.status(&gate, "tickets").await;
    assert_eq!(before["position"], 2);
    // Refresh the gated page and the waiting page.
    let refresh = v.navigate(&gate.url("/tickets")).await;
    assert_eq!(refresh.status, StatusCode::FOUND);
    assert!(
        refresh.headers.get("set-cookie").is_none(),
        "refresh must not issue a new ticket"
    );
    let page = v
        .navigate(&gate.url("/__queuegate/waiting?route=tickets&return=/tickets"))
        .await;
    assert_eq!(page.status, StatusCode::OK);
    // A second tab with the same cookie.
    let mut tab = v.clone();
    let other = tab.status(&gate, "tickets").await;
    assert_eq!(other["position"], 2);
    assert_eq!(other["waiting_total"], 2);
    // The same place: the same id and join score. The cookie itself is
    // written again once the first poll confirms it (it then carries when
    // the line last saw its holder).
    let place = |c: &str| {
        let f: Vec<&str> = c.split('.').collect();
        (f[3].to_owned(), f[4].split('-').next().unwrap().to_owned())
    };
    assert_eq!(place(v.cookie("qg_tickets").unwrap()), place(&ticket));
}

#[tokio::test]
async fn restart_keeps_the_admitted_and_the_order() {
    const CAPACITY: usize = 2;
    let (origin, _hits) = counting_origin().await;
    let mut config = proxy_config(&origin.url());
    let mut r = route("tickets", "/tickets", CAPACITY as u64);
    // The hold after a restart lasts one pass_ttl.
    r.pass_ttl = Duration::from_secs(2);
    config.routes.push(r);
    let gate = spawn_gate_with(config.clone(), ring("k1")).await;
    let mut admitted: Vec<Visitor> = Vec::new();
    for _ in 0..CAPACITY {
        let mut v = Visitor::new();
        assert!(v.navigate(&gate.url("/tickets")).await.reached_origin());
        admitted.push(v);
    }
    let mut line: Vec<Visitor> = Vec::new();
    for _ in 0..5 {
        let mut v = Visitor::new();
        assert_eq!(
            v.navigate(&gate.url("/tickets")).await.status,
            StatusCode::FOUND
        );
        line.push(v);
    }
    gate.stop().await.unwrap();

    // The restarted process starts with an empty memory store.
    let gate = spawn_gate_with(config, ring("k1")).await;
    for v in admitted.iter_mut() {
        assert!(
            v.navigate(&gate.url("/tickets")).await.reached_origin(),
            "admitted visitor lost its pass"
        );
    }
    for (i, v) in line.iter_mut().enumerate() {
        let s = v.status(&gate, "tickets").await;
        assert_eq!(s["state"], "waiting");
        assert_eq!(s["position"], (i + 1) as u64, "waiter {i} lost its place");
    }
    // A newcomer after the restart goes behind the line.
    let mut newcomer = Visitor::new();
    assert_eq!(
        newcomer.navigate(&gate.url("/tickets")).await.status,
        StatusCode::FOUND
    );
    assert_eq!(newcomer.status(&gate, "tickets").await["position"], 6);

    // The admitted leave; the line moves in order, never past capacity. Each
    // round reads every waiter's state: those admitted must be the head of
    // those still waiting (two can be admitted in one tick).
    let mut order = Vec::new();
    for v in admitted.iter_mut() {
        v.leave(&gate, "tickets").await;
    }
    for _ in 0..3_000 {
        if order.len() == line.len() {
            break;
        }
        let mut states = Vec::new();
        for (i, v) in line.iter_mut().enumerate() {
            if !order.contains(&i) {
                states.push((i, v.status(&gate, "tickets").await["state"] == "admitted"));
            }
        }
        // A tick can admit between two polls: re-read everyone ahead of the
        // last one seen admitted; the store admitted them first.
        if let Some(last) = states.iter().rposition(|(_, a)| *a) {
            for (i, admitted) in states[..last].iter_mut() {
                if !*admitted {
                    *admitted = line[*i].status(&gate, "tickets").await["state"] == "admitted";
                }
            }
        }
        let admitted_now: Vec<usize> = states.iter().filter(|(_, a)| *a).map(|(i, _)| *i).collect();
        let head: Vec<usize> = states
            .iter()
            .take(admitted_now.len())
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(admitted_now, head, "admitted out of order");
        assert!(admitted_now.len() <= CAPACITY);
        for i in admitted_now {
            assert!(line[i]
                .navigate(&gate.url("/tickets"))
                .await
                .reached_origin());
            order.push(i);
            line[i].leave(&gate, "tickets").await;
        }
        newcomer.status(&gate, "tickets").await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(order, (0..5).collect::<Vec<_>>());
}

#[tokio::test]
async fn bypass_rules_cannot_be_used_to_skip_the_line() {
    let (origin, hits) = counting_origin().await;
    let mut config = proxy_config(&origin.url());
    config.routes.push(route("tickets", "/tickets", 1));
    config
        .bypass
        .push(queuegate::config::BypassRule::PathPrefix("/static/".into()).into());
    let gate = spawn_gate_with(config, ring("k1")).await;
    let mut holder = Visitor::new();
    assert!(holder
        .navigate(&gate.url("/tickets"))
        .await
        .reached_origin());
    assert!(Visitor::new()
        .navigate(&gate.url("/static/app.css"))
        .await
        .reached_origin());
    let before = hits.load(Ordering::SeqCst);
    for (sneaky, answer) in [
        ("/static/../tickets", StatusCode::FOUND),
        // A dot segment only decoding brings out: refused outright.
        ("/static/%2e%2e/tickets/x", StatusCode::BAD_REQUEST),
        ("/static/./../tickets", StatusCode::FOUND),
    ] {
        let a = Visitor::new().navigate(&gate.url(sneaky)).await;
        assert_eq!(a.status, answer, "{sneaky} skipped the line");
    }
    assert_eq!(hits.load(Ordering::SeqCst), before);
}

/// The id a pass or ticket value names.
fn id_of(value: &str) -> &str {
    value.split('.').nth(3).unwrap_or_default()
}

/// A client that keeps the admit-now (`n`) pass it got first, whatever
/// passes it is sent later, makes no store call per request once its
/// session is confirmed: the instance answers that pass like a confirmed
/// one until its half-life. A session ended meanwhile (left, or ended on an
/// exit path) is not admitted on it again.
async fn a_kept_admit_now_pass_is_answered_without_the_store(redis: Option<&RedisServer>) {
    let (origin, _hits) = counting_origin().await;
    let mut config = proxy_config(&origin.url());
    if let Some(redis) = redis {
        config.store.backend = queuegate::config::Backend::Redis;
        config.store.redis = redis.config(Duration::from_secs(2));
    }
    let mut r = route("tickets", "/tickets", 10);
    r.exit_paths = vec!["/tickets/done".into()];
    config.routes.push(r);
    let gate = spawn_gate_opts(config, ring("k1"), queuegate::RunOptions::default()).await;
    let renewals = || async {
        sample(
            &gate.metrics().await,
            "queuegate_store_calls_total{operation=\"renew\"}",
        )
    };
    for end in ["leave", "exit path"] {
        let mut v = Visitor::new();
        assert!(v.navigate(&gate.url("/tickets/a")).await.reached_origin());
        let kept = v.cookie("qg_tickets").unwrap().to_owned();
        assert!(kept.starts_with("v1.n."), "{kept}");
        // Its first return confirms the session, through the store.
        assert!(v.navigate(&gate.url("/tickets/b")).await.reached_origin());
        assert!(v.cookie("qg_tickets").unwrap().starts_with("v1.a."));

        let before = renewals().await;
        for _ in 0..50 {
            let a = Visitor::holding("qg_tickets", &kept)
                .navigate(&gate.url("/tickets/x"))
                .await;
            assert!(a.reached_origin(), "{end}: {a:?}");
        }
        let made = renewals().await - before;
        assert!(made <= 2.0, "{end}: {made} renewals for 50 requests");

        if end == "leave" {
            assert_eq!(v.leave(&gate, "tickets").await.status, StatusCode::OK);
        } else {
            assert!(v
                .navigate(&gate.url("/tickets/done"))
                .await
                .reached_origin());
            assert!(v.cookie("qg_tickets").is_none(), "{end}: pass not cleared");
        }
        // Nobody waits, so the kept pass gets its holder in as a newcomer
        // would, on a new session: never on the ended one.
        let mut replay = Visitor::holding("qg_tickets", &kept);
        let a = replay.navigate(&gate.url("/tickets/x")).await;
        let now = replay.cookie("qg_tickets").unwrap_or_default();
        assert_ne!(id_of(now), id_of(&kept), "{end}: {a:?}");
        replay.leave(&gate, "tickets").await;
    }
}

#[tokio::test]
async fn a_kept_admit_now_pass_is_answered_without_the_store_on_memory() {
    a_kept_admit_now_pass_is_answered_without_the_store(None).await;
}

#[tokio::test]
async fn a_kept_admit_now_pass_is_answered_without_the_store_on_redis() {
    let redis = RedisServer::start();
    a_kept_admit_now_pass_is_answered_without_the_store(Some(&redis)).await;
}
