//! Lane grants (DESIGN §8.5) as operators and origins meet them:
//! `queuegate invite` prints a token that verifies and refuses bad input
//! with exit 64; `qg_invite` never reaches the origin nor a `return` path,
//! gated, bypassed or ungated; the origin's `Queuegate-Lane` header becomes
//! a signed lane cookie and never reaches the client, and a client cannot
//! send it.

mod common;

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use queuegate::admission::KeyRing;
use queuegate::config::{BypassRule, Config};
use queuegate::lane_grant::{self, GrantVerdict, InviteVerdict};

const BIN: &str = env!("CARGO_BIN_EXE_queuegate");

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A config file with routes `tickets` and `merch` and key `k1` in a file,
/// in a fresh directory (kept alive by the returned guard).
fn config_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k1.key");
    std::fs::write(&key, format!("{}\n", queuegate::admission::keygen())).unwrap();
    let path = dir.path().join("queuegate.yaml");
    std::fs::write(
        &path,
        format!(
            "listen: [{{ addr: \"127.0.0.1:0\" }}]\n\
             upstream: {{ url: \"http://127.0.0.1:9\" }}\n\
             keys: [{{ id: k1, file: \"{}\" }}]\n\
             routes:\n\
             \x20 - {{ name: tickets, match: {{ path_prefix: /tickets }}, capacity: 10, \
             lanes: [{{ name: main }}, {{ name: vip, weight: 3 }}] }}\n\
             \x20 - {{ name: merch, match: {{ path_prefix: /merch }}, capacity: 10 }}\n",
            key.display()
        ),
    )
    .unwrap();
    (dir, path)
}

fn invite(path: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("invite")
        .arg("-c")
        .arg(path)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn invite_prints_a_token_that_verifies_for_its_route() {
    let (_dir, path) = config_file();
    let before = now_unix();
    let out = invite(
        &path,
        &[
            "--route",
            "tickets",
            "--lane",
            "vip",
            "--expires",
            "1h",
            "--uses",
            "3",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let token = stdout.trim();

    let config = Config::load(&path).unwrap();
    let ring = KeyRing::load(&config.keys).unwrap();
    match lane_grant::verify_invite(&ring, token, "tickets", now_unix()) {
        InviteVerdict::Valid(invite) => {
            assert_eq!(invite.lane.as_str(), "vip");
            assert_eq!(invite.uses, 3);
            assert!(
                (before + 3600..=now_unix() + 3600).contains(&invite.expires_unix),
                "{}",
                invite.expires_unix
            );
        }
        InviteVerdict::Invalid(reject) => panic!("{reject:?}: {token}"),
    }
    assert!(matches!(
        lane_grant::verify_invite(&ring, token, "merch", now_unix()),
        InviteVerdict::Invalid(lane_grant::Reject::WrongRoute)
    ));
    assert!(matches!(
        lane_grant::verify_invite(&ring, token, "tickets", now_unix() + 3601),
        InviteVerdict::Invalid(lane_grant::Reject::Expired)
    ));

    // Defaults: a day, unlimited; and every token printed is another.
    let one = invite(&path, &["--route", "tickets", "--lane", "vip"]);
    let two = invite(&path, &["--route", "tickets", "--lane", "vip"]);
    assert!(one.status.success() && two.status.success());
    assert_ne!(one.stdout, two.stdout);
    let one = String::from_utf8(one.stdout).unwrap();
    match lane_grant::verify_invite(&ring, one.trim(), "tickets", now_unix()) {
        InviteVerdict::Valid(invite) => {
            assert_eq!(invite.uses, 0);
            assert!(invite.expires_unix >= before + 86_400);
        }
        InviteVerdict::Invalid(reject) => panic!("{reject:?}"),
    }
}

#[test]
fn invite_refuses_bad_input_with_one_line_and_exit_64() {
    let (_dir, path) = config_file();
    for (args, says) in [
        (
            &["--route", "nope", "--lane", "vip"][..],
            "no such route in the config (routes: tickets, merch)",
        ),
        (
            &["--route", "tickets", "--lane", "VIP"][..],
            "--lane \"VIP\"",
        ),
        (
            &["--route", "tickets", "--lane", "a.b"][..],
            "a lane name is 1 to 16 characters",
        ),
        (
            &["--route", "merch", "--lane", "vip"][..],
            "route \"merch\" has no such lane (lanes: main)",
        ),
        (
            &["--route", "tickets", "--lane", "vip", "--expires", "10"][..],
            "durations need a unit",
        ),
        (
            &[
                "--route",
                "tickets",
                "--lane",
                "vip",
                "--expires",
                "tomorrow",
            ][..],
            "invalid duration",
        ),
        (
            &["--route", "tickets", "--lane", "vip", "--expires", "0s"][..],
            "at least 1s",
        ),
    ] {
        let out = invite(&path, args);
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn invite_without_its_key_fails_naming_it() {
    let (dir, path) = config_file();
    std::fs::remove_file(dir.path().join("k1.key")).unwrap();
    let out = invite(&path, &["--route", "tickets", "--lane", "vip"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("k1.key"), "{stderr}");
    // Bad input is still reported as such first.
    let out = invite(&path, &["--route", "nope", "--lane", "vip"]);
    assert_eq!(out.status.code(), Some(64));
}

/// An origin that echoes the target it got and whether a `Queuegate-Lane`
/// header came with the request, and names a lane in its answer by the
/// path's last segment: `vip` names `vip`; `list` repeats the header, in
/// other cases, with an invalid part and `staff` last; `bad` names an
/// invalid lane.
async fn lane_origin() -> Origin {
    spawn_origin(|req: Request<Incoming>| async move {
        let saw_lane = req.headers().contains_key("queuegate-lane");
        let mut resp = Response::new(full(format!("origin {}", req.uri())));
        let h = resp.headers_mut();
        h.insert(
            "x-saw-lane",
            if saw_lane { "yes" } else { "no" }.parse().unwrap(),
        );
        let path = req.uri().path();
        if path.ends_with("/vip") {
            h.insert("queuegate-lane", "vip".parse().unwrap());
        } else if path.ends_with("/list") {
            h.append("QUEUEGATE-LANE", "press".parse().unwrap());
            h.append("Queuegate-Lane", "Not Valid, staff".parse().unwrap());
        } else if path.ends_with("/bad") {
            h.insert("queuegate-lane", "VIP!".parse().unwrap());
        }
        resp
    })
    .await
}

/// queuegate in front of [`lane_origin`]: `tickets` (any host) with room,
/// `shop` only on host `shop.example`, `soldout` with one place, and
/// `/static` bypassed.
async fn lane_gate() -> (Gate, Origin) {
    let origin = lane_origin().await;
    let mut config = proxy_config(&origin.url());
    config
        .bypass
        .push(BypassRule::PathPrefix("/static".into()).into());
    config.routes.push(route("tickets", "/tickets", 100));
    let mut shop = route("shop", "/shop", 100);
    shop.matcher.host = Some("shop.example".into());
    config.routes.push(shop);
    let mut soldout = route("soldout", "/soldout", 1);
    soldout.lanes = queuegate::config::Lanes::new(vec![
        queuegate::config::Lane::main(),
        queuegate::config::Lane {
            name: "vip".to_owned(),
            weight: 3,
        },
    ])
    .expect("valid lanes");
    config.routes.push(soldout);
    (spawn_gate_with(config, ring("k1")).await, origin)
}

/// A visitor holding `soldout`'s one place, so others wait.
async fn fill_soldout(gate: &Gate) -> Visitor {
    let mut first = Visitor::new();
    let a = first.navigate(&gate.url("/soldout/a")).await;
    assert!(a.reached_origin(), "{a:?}");
    first
}

#[tokio::test]
async fn a_lane_the_origin_names_puts_the_visitors_next_ticket_in_it() {
    let (gate, _origin) = lane_gate().await;
    let _holder = fill_soldout(&gate).await;
    let mut plain = Visitor::new();
    plain.fetch(&gate.url("/soldout/x")).await;
    let status = plain.status(&gate, "soldout").await;
    assert_eq!(
        (status["lane"].as_str(), status["priority"].as_bool()),
        (Some("main"), Some(false)),
        "{status}"
    );
    // After an ungated page whose answer names the lane (a login, say),
    // the visitor's ticket is in that lane, first in it.
    let mut vip = Visitor::new();
    let a = vip.navigate(&gate.url("/account/vip")).await;
    assert!(
        a.reached_origin() && a.headers.get("queuegate-lane").is_none(),
        "{a:?}"
    );
    let a = vip.fetch(&gate.url("/soldout/x")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    let status = vip.status(&gate, "soldout").await;
    assert_eq!(status["state"], "waiting", "{status}");
    assert_eq!(
        (status["lane"].as_str(), status["priority"].as_bool()),
        (Some("vip"), Some(true)),
        "{status}"
    );
    assert_eq!(status["position"], 1, "{status}");
    let ticket = vip.cookie("qg_soldout").unwrap();
    assert!(
        ticket.contains("_vip."),
        "the ticket names its lane: {ticket}"
    );
    gate.stop().await.unwrap();
}

#[tokio::test]
async fn invites_put_visitors_in_their_lane_and_bad_ones_are_ignored() {
    let (gate, _origin) = lane_gate().await;
    let _holder = fill_soldout(&gate).await;
    let vip = lane_grant::Lane::new("vip").unwrap();
    let now = now_unix();
    let good = lane_grant::sign_invite(&ring("k1"), "soldout", &vip, now + 600, 0);
    let expired = lane_grant::sign_invite(&ring("k1"), "soldout", &vip, now - 1, 0);
    let other_route = lane_grant::sign_invite(&ring("k1"), "tickets", &vip, now + 600, 0);
    let forged = lane_grant::sign_invite(&ring("k2"), "soldout", &vip, now + 600, 0);
    let no_such_lane = lane_grant::sign_invite(
        &ring("k1"),
        "soldout",
        &lane_grant::Lane::new("press").unwrap(),
        now + 600,
        0,
    );
    let mut tampered = good.clone();
    tampered.replace_range(tampered.len() - 3.., "AAA");
    for bad in [
        &expired,
        &other_route,
        &forged,
        &no_such_lane,
        &tampered,
        &"x".repeat(300),
    ] {
        let mut v = Visitor::new();
        let a = v
            .fetch(&gate.url(&format!("/soldout/x?qg_invite={bad}")))
            .await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{bad}: {a:?}");
        assert!(lane_cookies(&a).is_empty(), "{bad}: {a:?}");
        let status = v.status(&gate, "soldout").await;
        assert_eq!(status["lane"], "main", "{bad}: {status}");
    }
    // A visitor waiting in main follows a good link: same ticket, same join
    // score, now first in vip.
    let mut waiter = Visitor::new();
    waiter.fetch(&gate.url("/soldout/x")).await;
    let before = waiter.cookie("qg_soldout").unwrap().to_owned();
    let score = |t: &str| {
        t.split('.')
            .nth(4)
            .unwrap()
            .split(['-', '_'])
            .next()
            .unwrap()
            .to_owned()
    };
    let a = waiter
        .navigate(&gate.url(&format!("/soldout/y?qg_invite={good}")))
        .await;
    assert_eq!(a.location(), Some("/soldout/y"), "{a:?}");
    assert_eq!(lane_cookies(&a).len(), 1, "{a:?}");
    let status = waiter.status(&gate, "soldout").await;
    assert_eq!(
        (status["lane"].as_str(), status["position"].as_u64()),
        (Some("vip"), Some(1)),
        "{status}"
    );
    let after = waiter.cookie("qg_soldout").unwrap().to_owned();
    assert_eq!(score(&after), score(&before), "{before} -> {after}");
    assert!(after.contains("_vip."), "{after}");
    gate.stop().await.unwrap();
}

#[tokio::test]
async fn an_invite_with_three_uses_puts_exactly_three_of_twenty_in_its_lane() {
    let (gate, _origin) = lane_gate().await;
    let _holder = fill_soldout(&gate).await;
    let vip = lane_grant::Lane::new("vip").unwrap();
    let token = lane_grant::sign_invite(&ring("k1"), "soldout", &vip, now_unix() + 600, 3);
    let url = gate.url(&format!("/soldout/x?qg_invite={token}"));
    let tries = (0..20).map(|_| {
        let url = url.clone();
        async move {
            let mut v = Visitor::new();
            let a = v.fetch(&url).await;
            assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
            v
        }
    });
    let mut visitors = futures_util::future::join_all(tries).await;
    let mut lanes = Vec::new();
    for v in &mut visitors {
        lanes.push(
            v.status(&gate, "soldout").await["lane"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(lanes.iter().filter(|l| *l == "vip").count(), 3, "{lanes:?}");
    assert_eq!(
        lanes.iter().filter(|l| *l == "main").count(),
        17,
        "{lanes:?}"
    );
    // The same visitor following the link again uses nothing up.
    let lucky = visitors
        .iter_mut()
        .zip(&lanes)
        .find(|(_, l)| *l == "vip")
        .map(|(v, _)| v)
        .unwrap();
    let a = lucky.fetch(&url).await;
    assert_eq!(
        lane_cookies(&a).len(),
        1,
        "still honoured for its holder: {a:?}"
    );
    gate.stop().await.unwrap();
}

/// `GET url` as a navigation, with `headers` added.
async fn navigate_with(v: &mut Visitor, url: &str, headers: &[(&str, &str)]) -> Answer {
    let mut req = Request::get(url)
        .header("accept", "text/html")
        .header("sec-fetch-mode", "navigate");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    v.request(req.body(Full::new(Bytes::new())).unwrap()).await
}

fn body(a: &Answer) -> String {
    String::from_utf8_lossy(&a.body).into_owned()
}

/// The lane cookies an answer sets, by name, with their whole `Set-Cookie`.
fn lane_cookies(a: &Answer) -> Vec<(String, String)> {
    a.headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .filter(|v| v.starts_with("qg_lane."))
        .map(|v| (v.split('=').next().unwrap().to_owned(), v))
        .collect()
}

/// The lane a lane cookie's `Set-Cookie` grants on `route`, verified.
fn granted(set_cookie: &str, route: &str) -> Option<String> {
    let value = set_cookie.split(';').next()?.split_once('=')?.1;
    match lane_grant::verify_grant(&ring("k1"), value, route, now_unix()) {
        GrantVerdict::Valid(grant) => Some(grant.lane.as_str().to_owned()),
        GrantVerdict::Invalid(_) => None,
    }
}

#[tokio::test]
async fn the_origin_never_sees_an_invite_on_any_path() {
    let (gate, _origin) = lane_gate().await;
    let mut v = Visitor::new();
    for (target, seen) in [
        // Ungated.
        ("/other?a=1&qg_invite=T&b=%41", "/other?a=1&b=%41"),
        ("/other?qg_invite=T", "/other"),
        // Bypassed, the name percent-encoded.
        ("/static/app.js?qg%5Finvite=T&v=2", "/static/app.js?v=2"),
        // Gated and admitted, the parameter twice.
        (
            "/tickets/x?qg_invite=T&qg_invite=U&seat=1",
            "/tickets/x?seat=1",
        ),
        ("/tickets/x?seat=1&%71g_invite=T", "/tickets/x?seat=1"),
        // Other names are kept as they are.
        (
            "/other?qg_invitee=1&my_qg_invite=2",
            "/other?qg_invitee=1&my_qg_invite=2",
        ),
    ] {
        let mut a = v.navigate(&gate.url(target)).await;
        if target.starts_with("/tickets") {
            // A gated navigation is sent on to its target without the
            // invite first, so the token leaves the address bar.
            assert_eq!(a.status, StatusCode::FOUND, "{target}: {a:?}");
            assert_eq!(a.location(), Some(seen), "{target}");
            a = v.navigate(&gate.url(seen)).await;
        }
        assert!(a.reached_origin(), "{target}: {a:?}");
        assert_eq!(body(&a), format!("origin {seen}"), "{target}");
    }
}

#[tokio::test]
async fn no_return_path_carries_an_invite() {
    let (gate, _origin) = lane_gate().await;
    let mut first = Visitor::new();
    assert!(first
        .navigate(&gate.url("/soldout/a"))
        .await
        .reached_origin());
    // Held back: the waiting page's return path has no invite.
    let mut held = Visitor::new();
    let a = held.navigate(&gate.url("/soldout/x?y=1&qg_invite=T")).await;
    assert_eq!(a.location(), Some("/soldout/x?y=1"), "{a:?}");
    // An app's request is not sent round: held back at once.
    let a = held.fetch(&gate.url("/soldout/x?y=1&qg_invite=T")).await;
    assert!(!body(&a).contains("qg_invite"), "{}", body(&a));
    let a = held.navigate(&gate.url("/soldout/x?y=1")).await;
    let location = a.location().unwrap_or_else(|| panic!("{a:?}")).to_owned();
    assert!(location.contains("/waiting?route=soldout"), "{location}");
    assert!(
        location.contains("&return=/soldout/x%3Fy%3D1&"),
        "{location}"
    );
    assert!(!location.contains("qg_invite"), "{location}");
    assert!(!location.contains("%5Finvite"), "{location}");
    // Nor one written into a waiting page link by hand.
    let page = held
        .navigate(&gate.url(
            "/__queuegate/waiting?route=soldout&return=%2Fsoldout%2Fx%3Fqg_invite%3DT%26y%3D1",
        ))
        .await;
    assert!(body(&page).contains("soldout"), "{page:?}");
    assert!(!body(&page).contains("qg_invite"), "{}", body(&page));
    let status = held
        .fetch(&gate.url("/__queuegate/status?route=soldout&return=%2Fsoldout%3Fqg_invite%3DT"))
        .await;
    assert!(!body(&status).contains("qg_invite"), "{}", body(&status));
}

#[tokio::test]
async fn a_lane_from_the_origin_becomes_the_routes_lane_cookie() {
    let (gate, _origin) = lane_gate().await;
    let mut v = Visitor::new();
    let a = v.navigate(&gate.url("/tickets/vip")).await;
    assert!(a.reached_origin(), "{a:?}");
    assert!(a.headers.get("queuegate-lane").is_none(), "{a:?}");
    let cookies = lane_cookies(&a);
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    let (name, set) = &cookies[0];
    assert_eq!(name, "qg_lane.tickets");
    for attribute in [
        "; Path=/",
        "; Max-Age=86400",
        "; HttpOnly",
        "; SameSite=Lax",
    ] {
        assert!(set.contains(attribute), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    assert_eq!(granted(set, "tickets").as_deref(), Some("vip"));
    assert_eq!(granted(set, "soldout"), None, "for its route only");
    // The origin never sees queuegate's cookie.
    let again = v.navigate(&gate.url("/tickets/plain")).await;
    assert!(again.reached_origin());
    assert!(lane_cookies(&again).is_empty());
}

#[tokio::test]
async fn on_an_ungated_path_the_lane_is_for_every_route_the_host_fits() {
    let (gate, _origin) = lane_gate().await;
    for (path, host, lanes) in [
        ("/other/vip", None, vec!["soldout", "tickets"]),
        ("/static/vip", None, vec!["soldout", "tickets"]),
        (
            "/other/vip",
            Some("shop.example"),
            vec!["shop", "soldout", "tickets"],
        ),
        (
            "/other/vip",
            Some("elsewhere.example"),
            vec!["soldout", "tickets"],
        ),
    ] {
        let mut v = Visitor::new();
        let headers: Vec<(&str, &str)> = host.iter().map(|h| ("host", *h)).collect();
        let a = navigate_with(&mut v, &gate.url(path), &headers).await;
        assert!(a.reached_origin(), "{path} {host:?}: {a:?}");
        assert!(a.headers.get("queuegate-lane").is_none());
        let mut routes: Vec<String> = lane_cookies(&a)
            .into_iter()
            .map(|(name, set)| {
                let route = name.trim_start_matches("qg_lane.").to_owned();
                assert_eq!(granted(&set, &route).as_deref(), Some("vip"), "{set}");
                route
            })
            .collect();
        routes.sort();
        assert_eq!(routes, lanes, "{path} {host:?}");
    }
}

#[tokio::test]
async fn repeated_headers_name_the_last_valid_lane_and_invalid_ones_are_ignored() {
    let (gate, _origin) = lane_gate().await;
    let mut v = Visitor::new();
    let a = v.navigate(&gate.url("/tickets/list")).await;
    assert!(a.reached_origin(), "{a:?}");
    assert!(a.headers.get("queuegate-lane").is_none(), "{a:?}");
    let cookies = lane_cookies(&a);
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    assert_eq!(granted(&cookies[0].1, "tickets").as_deref(), Some("staff"));

    for path in ["/tickets/bad", "/other/bad"] {
        let a = v.navigate(&gate.url(path)).await;
        assert!(a.reached_origin(), "{path}: {a:?}");
        assert!(a.headers.get("queuegate-lane").is_none(), "{path}");
        assert!(lane_cookies(&a).is_empty(), "{path}: {a:?}");
    }
}

#[tokio::test]
async fn a_client_cannot_name_its_own_lane() {
    let (gate, _origin) = lane_gate().await;
    let mut v = Visitor::new();
    for path in ["/tickets/plain", "/other/plain", "/static/plain"] {
        let a = navigate_with(
            &mut v,
            &gate.url(path),
            &[("queuegate-lane", "vip"), ("QUEUEGATE-LANE", "staff")],
        )
        .await;
        assert!(a.reached_origin(), "{path}: {a:?}");
        assert_eq!(a.headers["x-saw-lane"], "no", "{path}");
        assert!(lane_cookies(&a).is_empty(), "{path}: {a:?}");
    }
}

// ---------------------------------------------------------------------------
// A lane cookie is its visitor's: bound to the id of the ticket or pass it
// was given with, never longer-lived than the invite, worth nothing copied.

/// The value of attribute `name` (`Max-Age`, say) in a `Set-Cookie`.
fn attribute<'a>(set_cookie: &'a str, name: &str) -> Option<&'a str> {
    set_cookie
        .split(';')
        .skip(1)
        .filter_map(|a| a.trim().split_once('='))
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
}

/// The cookie value a `Set-Cookie` sets.
fn set_value(set_cookie: &str) -> &str {
    set_cookie
        .split(';')
        .next()
        .and_then(|pair| pair.split_once('='))
        .map_or("", |(_, v)| v)
}

/// The expiry a lane cookie's value is signed with: its fifth field.
fn signed_expiry(value: &str) -> u64 {
    value
        .split('.')
        .nth(4)
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no expiry in {value}"))
}

/// The lane a visitor's status on `route` names, asserting it waits.
async fn waits_in(v: &mut Visitor, gate: &Gate, route: &str) -> String {
    let status = v.status(gate, route).await;
    assert_eq!(status["state"], "waiting", "{status}");
    status["lane"].as_str().unwrap().to_owned()
}

/// A visitor whose ticket for `soldout` names a place that is gone: it
/// joined, left, and still sends the ticket.
async fn with_a_ticket_gone(gate: &Gate) -> Visitor {
    let mut v = Visitor::new();
    let a = v.fetch(&gate.url("/soldout/x")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    let ticket = v.cookie("qg_soldout").unwrap().to_owned();
    v.leave(gate, "soldout").await;
    v.jar.insert("qg_soldout".into(), ticket);
    v
}

/// `v` with `lane_cookie` (a `qg_lane.soldout` value) put in its jar.
fn holding(mut v: Visitor, lane_cookie: &str) -> Visitor {
    v.jar
        .insert("qg_lane.soldout".into(), lane_cookie.to_owned());
    v
}

#[tokio::test]
async fn an_invites_lane_cookie_lasts_no_longer_than_the_invite_and_a_copy_gives_nothing() {
    let (gate, _origin) = lane_gate().await;
    let _holder = fill_soldout(&gate).await;
    let vip = lane_grant::Lane::new("vip").unwrap();
    let expires = now_unix() + 3600;
    let token = lane_grant::sign_invite(&ring("k1"), "soldout", &vip, expires, 1);

    // A browser follows the link: sent on to the target, with a lane
    // cookie that ends with the invite at the latest.
    let mut invited = Visitor::new();
    let a = invited
        .navigate(&gate.url(&format!("/soldout/x?qg_invite={token}")))
        .await;
    assert_eq!(a.location(), Some("/soldout/x"), "{a:?}");
    let cookies = lane_cookies(&a);
    assert_eq!(cookies.len(), 1, "{a:?}");
    let set = &cookies[0].1;
    let max_age: u64 = attribute(set, "Max-Age").unwrap().parse().unwrap();
    assert!(max_age <= 3600, "the invite ends in an hour: {set}");
    assert!(signed_expiry(set_value(set)) <= expires, "{set}");
    let a = invited.navigate(&gate.url("/soldout/x")).await;
    assert_eq!(a.status, StatusCode::FOUND, "{a:?}");
    assert_eq!(waits_in(&mut invited, &gate, "soldout").await, "vip");
    let copied = invited.cookie("qg_lane.soldout").unwrap().to_owned();

    // A copy gives nothing: to a newcomer, nor to a visitor with a ticket
    // of its own (whose place is gone, so it arrives again).
    let mut newcomer = holding(Visitor::new(), &copied);
    let a = newcomer.fetch(&gate.url("/soldout/x")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert!(lane_cookies(&a).is_empty(), "{a:?}");
    assert_eq!(waits_in(&mut newcomer, &gate, "soldout").await, "main");
    let mut returning = holding(with_a_ticket_gone(&gate).await, &copied);
    returning.fetch(&gate.url("/soldout/x")).await;
    assert_eq!(waits_in(&mut returning, &gate, "soldout").await, "main");

    // Its own holder, arriving again after its place went, is back in vip,
    // and the cookie follows it to its new ticket without outliving the
    // invite.
    let ticket = invited.cookie("qg_soldout").unwrap().to_owned();
    invited.leave(&gate, "soldout").await;
    invited.jar.insert("qg_soldout".into(), ticket.clone());
    let a = invited.fetch(&gate.url("/soldout/x")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_ne!(invited.cookie("qg_soldout"), Some(ticket.as_str()));
    assert_eq!(waits_in(&mut invited, &gate, "soldout").await, "vip");
    let rebound = lane_cookies(&a);
    assert_eq!(rebound.len(), 1, "{a:?}");
    assert_eq!(
        signed_expiry(set_value(&rebound[0].1)),
        signed_expiry(&copied)
    );
    assert_ne!(set_value(&rebound[0].1), copied);
    gate.stop().await.unwrap();
}

/// A lane cookie of the form signed before lane cookies named their
/// visitor: `v1.g.<route>.<lane>.<expires>.<kid>.<mac>`, signed with `k1`.
fn unbound_lane_cookie(route: &str, lane: &str, expires: u64) -> String {
    use base64::Engine as _;
    use hmac::Mac as _;
    let signed = format!("v1.g.{route}.{lane}.{expires}.k1");
    let key = "test key k1 ".repeat(4);
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(signed.as_bytes());
    let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{signed}.{tag}")
}

#[tokio::test]
async fn a_lane_cookie_that_names_no_visitor_is_refused() {
    let (gate, _origin) = lane_gate().await;
    let _holder = fill_soldout(&gate).await;
    let unbound = unbound_lane_cookie("soldout", "vip", now_unix() + 3600);
    let mut newcomer = holding(Visitor::new(), &unbound);
    newcomer.fetch(&gate.url("/soldout/x")).await;
    assert_eq!(waits_in(&mut newcomer, &gate, "soldout").await, "main");
    let mut returning = holding(with_a_ticket_gone(&gate).await, &unbound);
    returning.fetch(&gate.url("/soldout/x")).await;
    assert_eq!(waits_in(&mut returning, &gate, "soldout").await, "main");
    gate.stop().await.unwrap();
}

#[tokio::test]
async fn a_lane_the_origin_names_is_bound_to_its_visitor() {
    let (gate, _origin) = lane_gate().await;
    let mut holder = fill_soldout(&gate).await;

    // Admitted: the lane is bound to the holder's pass.
    let a = holder.navigate(&gate.url("/soldout/vip")).await;
    assert!(a.reached_origin(), "{a:?}");
    let cookies = lane_cookies(&a);
    assert_eq!(cookies.len(), 1, "{a:?}");
    let of_the_pass = set_value(&cookies[0].1).to_owned();
    // Waiting, on an ungated page: bound to the ticket.
    let mut waiter = Visitor::new();
    waiter.fetch(&gate.url("/soldout/x")).await;
    let a = waiter.navigate(&gate.url("/account/vip")).await;
    assert!(a.reached_origin(), "{a:?}");
    let of_the_ticket = waiter.cookie("qg_lane.soldout").unwrap().to_owned();
    for copied in [&of_the_pass, &of_the_ticket] {
        let mut newcomer = holding(Visitor::new(), copied);
        newcomer.fetch(&gate.url("/soldout/x")).await;
        assert_eq!(waits_in(&mut newcomer, &gate, "soldout").await, "main");
        let mut returning = holding(with_a_ticket_gone(&gate).await, copied);
        returning.fetch(&gate.url("/soldout/x")).await;
        assert_eq!(waits_in(&mut returning, &gate, "soldout").await, "main");
    }
    // The waiter's own, when its place has gone, puts it back in vip.
    let ticket = waiter.cookie("qg_soldout").unwrap().to_owned();
    waiter.leave(&gate, "soldout").await;
    waiter.jar.insert("qg_soldout".into(), ticket);
    waiter.fetch(&gate.url("/soldout/x")).await;
    assert_eq!(waits_in(&mut waiter, &gate, "soldout").await, "vip");

    // Given to a visitor who holds nothing on the route, the lane is for
    // the first arrival that presents it: the visitor, who arrives, and
    // from then on nobody else.
    let mut anonymous = Visitor::new();
    let a = anonymous.navigate(&gate.url("/account/vip")).await;
    assert!(a.reached_origin(), "{a:?}");
    let given = anonymous.cookie("qg_lane.soldout").unwrap().to_owned();
    let a = anonymous.fetch(&gate.url("/soldout/x")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(waits_in(&mut anonymous, &gate, "soldout").await, "vip");
    let rebound = anonymous.cookie("qg_lane.soldout").unwrap().to_owned();
    for copied in [&given, &rebound] {
        let mut newcomer = holding(Visitor::new(), copied);
        newcomer.fetch(&gate.url("/soldout/x")).await;
        assert_eq!(waits_in(&mut newcomer, &gate, "soldout").await, "main");
    }
    gate.stop().await.unwrap();
}
