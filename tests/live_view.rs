//! The admin listener's live view and route controls (DESIGN §9.4) through
//! real sockets: changes refused without a valid token or with a bad body
//! change nothing; a valid one closes a route for the next visitor and is
//! shown as an override; clearing it restores the file's values; the
//! page, its script and the event stream are served from the binary.

mod common;

use common::*;
use http::{Method, StatusCode};
use queuegate::config::{KeyFrom, KeySource};

/// A gate with the route `tickets` (capacity 1) and an admin listener
/// whose one token, `ops`, is `token`, read from the environment variable
/// `var` (each test names its own).
async fn gate_with_token(var: &str, token: &str) -> (Gate, Origin) {
    std::env::set_var(var, token);
    let (origin, _hits) = counting_origin().await;
    let mut config = proxy_config(&origin.url());
    config.admin = Some(queuegate::config::Admin {
        addr: "127.0.0.1:0".parse().unwrap(),
        tokens: vec![KeySource {
            id: "ops".into(),
            from: KeyFrom::Env(var.into()),
        }],
    });
    config.routes.push(route("tickets", "/tickets", 1));
    let gate = spawn_gate_opts(config, ring("k1"), Default::default()).await;
    (gate, origin)
}

const TOKEN: &str = "a-token-of-the-ops-team-0123456789";

fn unchanged(route: &serde_json::Value) {
    assert_eq!(route["mode"], "gate", "{route}");
    assert_eq!(route["capacity"], 1, "{route}");
    assert_eq!(route["override"], serde_json::Value::Null, "{route}");
}

#[tokio::test]
async fn a_change_without_a_valid_token_or_with_a_bad_body_changes_nothing() {
    let (gate, _origin) = gate_with_token("QG_TEST_LIVE_TOKEN_REFUSED", TOKEN).await;
    let url = gate.admin_url("/routes/tickets/override");
    let routes = gate.admin_url("/routes");
    eventually_async("the admin listener answers", || async {
        admin_call(Method::GET, &routes, None, "").await.0 == StatusCode::OK
    })
    .await;
    let closed = r#"{"mode":"closed"}"#;
    for token in [
        None,
        Some("wrong"),
        Some(""),
        Some(&TOKEN[..TOKEN.len() - 1]),
    ] {
        for method in [Method::PUT, Method::DELETE] {
            let (status, json) = admin_call(method.clone(), &url, token, closed).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {token:?}: {json}"
            );
            assert_eq!(json["field"], "authorization", "{json}");
        }
    }
    unchanged(&admin_route(&routes, "tickets").await);

    for (body, field) in [
        (r#"{"mode":"open"}"#, "mode"),
        (r#"{"mode":"closed","capacity":0}"#, "capacity"),
        (r#"{"capacity":-3}"#, "capacity"),
        (r#"{"capacity":1.5}"#, "capacity"),
        (r#"{"mode":"closed","colour":"red"}"#, "colour"),
        ("{}", "body"),
        ("closed", "body"),
    ] {
        let (status, json) = admin_call(Method::PUT, &url, Some(TOKEN), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {json}");
        assert_eq!(json["field"], field, "{body}: {json}");
    }
    let (status, json) = admin_call(
        Method::PUT,
        &gate.admin_url("/routes/nosuch/override"),
        Some(TOKEN),
        closed,
    )
    .await;
    assert_eq!(
        (status, &json["field"]),
        (StatusCode::NOT_FOUND, &"route".into()),
        "{json}"
    );
    unchanged(&admin_route(&routes, "tickets").await);

    // Still the file's route: the first visitor is let in.
    let mut v = Visitor::new();
    assert!(v.navigate(&gate.url("/tickets")).await.reached_origin());
    gate.stop().await.unwrap();
}

#[tokio::test]
async fn a_gate_without_tokens_refuses_every_change() {
    let (origin, _hits) = counting_origin().await;
    let mut config = proxy_config(&origin.url());
    config.routes.push(route("tickets", "/tickets", 1));
    let gate = spawn_gate_opts(config, ring("k1"), Default::default()).await;
    let url = gate.admin_url("/routes/tickets/override");
    let (status, json) = admin_call(Method::PUT, &url, Some(TOKEN), r#"{"mode":"closed"}"#).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{json}");
    unchanged(&admin_route(&gate.admin_url("/routes"), "tickets").await);
    gate.stop().await.unwrap();
}

#[tokio::test]
async fn an_override_closes_the_route_for_the_next_visitor_and_clearing_it_reopens() {
    let (gate, _origin) = gate_with_token("QG_TEST_LIVE_TOKEN_CLOSE", TOKEN).await;
    let url = gate.admin_url("/routes/tickets/override");
    let routes = gate.admin_url("/routes");
    let (status, json) = admin_call(
        Method::PUT,
        &url,
        Some(TOKEN),
        r#"{"mode":"closed","capacity":7}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let route = admin_route(&routes, "tickets").await;
    assert_eq!(
        (&route["mode"], &route["capacity"]),
        (&"closed".into(), &7.into()),
        "{route}"
    );
    assert_eq!(route["override"]["by"], "ops", "{route}");
    assert_eq!(route["override"]["mode"]["file"], "gate", "{route}");
    assert_eq!(route["file"]["capacity"], 1, "{route}");

    let mut v = Visitor::new();
    let answer = v.fetch(&gate.url("/tickets")).await;
    assert!(!answer.reached_origin(), "{answer:?}");
    assert_eq!(answer.json()["state"], "closed", "{answer:?}");

    let (status, json) = admin_call(Method::DELETE, &url, Some(TOKEN), "").await;
    assert_eq!(status, StatusCode::OK, "{json}");
    unchanged(&admin_route(&routes, "tickets").await);
    let mut w = Visitor::new();
    assert!(w.navigate(&gate.url("/tickets")).await.reached_origin());
    gate.stop().await.unwrap();
}

#[tokio::test]
async fn the_page_its_assets_and_the_event_stream_come_from_the_binary() {
    let (gate, _origin) = gate_with_token("QG_TEST_LIVE_TOKEN_PAGE", TOKEN).await;
    let (parts, body) = get(&gate.admin_url("/")).await;
    assert_eq!(parts.status, StatusCode::OK);
    let csp = parts.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    let html = String::from_utf8_lossy(&body);
    assert!(html.contains(r#"<script src="/live.js""#), "{html}");
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no outside assets"
    );
    for (path, kind) in [("/live.js", "javascript"), ("/live.css", "css")] {
        let (parts, body) = get(&gate.admin_url(path)).await;
        assert_eq!(parts.status, StatusCode::OK, "{path}");
        assert!(parts.headers["content-type"]
            .to_str()
            .unwrap()
            .contains(kind));
        let text = String::from_utf8_lossy(&body);
        assert!(
            !text.contains("https://"),
            "{path} loads nothing from elsewhere"
        );
    }
    // The stream: the history first, then an update with the route's figures.
    let req = http::Request::get(gate.admin_url("/events"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = client::<http_body_util::Full<bytes::Bytes>>()
        .request(req)
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let mut text = String::new();
    while !text.contains("\ndata: {\"at_ms\"") {
        use http_body_util::BodyExt as _;
        let frame = body.frame().await.expect("more events").unwrap();
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    assert!(text.starts_with("event: history\ndata: {"), "{text}");
    let update = text
        .split("\ndata: ")
        .find(|event| event.starts_with("{\"at_ms\""))
        .and_then(|event| event.split("\n\n").next())
        .unwrap();
    let update: serde_json::Value = serde_json::from_str(update).unwrap();
    let route = &update["routes"][0];
    assert_eq!(route["name"], "tickets", "{update}");
    assert_eq!(route["capacity"], 1, "{update}");
    assert!(route["sample"].is_array(), "{update}");
    assert!(route.get("capacity_range").is_none() && route.get("origin").is_none());
    gate.stop().await.unwrap();
}
