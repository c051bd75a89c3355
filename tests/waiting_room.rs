//! The waiting room through its real endpoints: the page (language, size,
//! per-route text and templates), the answers apps get while held back, the
//! figures the page, the status JSON and the API answer share, and the
//! `return` path that must never lead off the site or into a header.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::Full;

/// A gate with a capacity-1 route `gated` on `/gated`, where `first` has the
/// one slot and `second` waits in line.
async fn full_route(
    tune: impl FnOnce(&mut queuegate::config::Route),
) -> (Gate, Origin, Visitor, Visitor) {
    let (origin, _) = counting_origin().await;
    let mut config = proxy_config(&origin.url());
    let mut r = route("gated", "/gated", 1);
    tune(&mut r);
    config.routes.push(r);
    let gate = spawn_gate(config).await;
    let mut first = Visitor::new();
    let answer = first.navigate(&gate.url("/gated/")).await;
    assert!(
        answer.reached_origin(),
        "first visitor admitted: {answer:?}"
    );
    // The first return confirms the session (and brings the confirmed pass).
    assert!(first.navigate(&gate.url("/gated/")).await.reached_origin());
    let mut second = Visitor::new();
    let answer = second.navigate(&gate.url("/gated/page?x=1")).await;
    assert_eq!(answer.status, StatusCode::FOUND);
    (gate, origin, first, second)
}

/// Percent-encodes every byte but the unreserved ones, as a query value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The `return` value of a waiting page URL, decoded once.
fn return_of(location: &str) -> String {
    let query = location.split_once('?').map_or("", |(_, q)| q);
    let raw = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("return="))
        .unwrap_or("");
    percent_encoding::percent_decode_str(raw)
        .decode_utf8_lossy()
        .into_owned()
}

/// The JSON the page embeds for its script.
fn embedded_state(html: &str) -> serde_json::Value {
    let open = r#"<script type="application/json" id="qg-state">"#;
    let start = html.find(open).map(|i| i + open.len()).unwrap_or(0);
    let end = html[start..].find("</script>").map_or(start, |e| start + e);
    serde_json::from_str(&html[start..end]).unwrap_or(serde_json::Value::Null)
}

/// Values a hostile link may put in `return`.
fn hostile_returns() -> Vec<String> {
    let mut values: Vec<String> = [
        "//evil.example",
        "//evil.example/x",
        "https://evil.example",
        "https://evil.example/x",
        "http:evil.example",
        "/\\evil.example",
        "\\/evil.example",
        "\\\\evil.example",
        "/%2Fevil.example",
        "/%2F/evil.example",
        "%2F%2Fevil.example",
        "/%5Cevil.example",
        "/%5C%5Cevil.example",
        "/%252F%252Fevil.example",
        "/%25252F%25252Fevil.example",
        "javascript:alert(document.domain)",
        "JaVaScRiPt:alert(1)",
        " //evil.example",
        "/\t/evil.example",
        "/x\r\nSet-Cookie: stolen=1",
        "/x\rLocation: https://evil.example",
        "/x%0d%0aSet-Cookie:%20stolen=1",
        "/x%0D%0ALocation:%20https://evil.example",
        "/x%250d%250aSet-Cookie:%20stolen=1",
        "evil.example",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    values.push(format!("/{}", "a".repeat(5000)));
    values
}

fn assert_harmless(what: &str, value: &str) {
    assert_eq!(value, "/", "{what}: hostile return kept as {value:?}");
}

#[tokio::test]
async fn hostile_return_never_leaves_the_site_through_any_endpoint() {
    let (gate, _origin, mut admitted, mut waiting) = full_route(|_| {}).await;
    for hostile in hostile_returns() {
        let q = encode(&hostile);
        let what = format!("return={hostile:?}");

        // The page while waiting: the embedded state, the links and the
        // meta refresh all carry `/`.
        let page = waiting
            .navigate(&gate.url(&format!("/__queuegate/waiting?route=gated&return={q}")))
            .await;
        assert_eq!(page.status, StatusCode::OK, "{what}");
        let html = std::str::from_utf8(&page.body).unwrap();
        assert!(!html.contains("evil.example"), "{what}: in the page");
        assert!(!html.contains("stolen"), "{what}: in the page");
        assert!(!html.contains("aaaaaaaaaa"), "{what}: overlong kept");
        assert!(!html.to_ascii_lowercase().contains("javascript:"), "{what}");
        assert_harmless(&what, embedded_state(html)["return"].as_str().unwrap());

        // The page once admitted: a 302 to the return path, and nothing more.
        let page = admitted
            .navigate(&gate.url(&format!("/__queuegate/waiting?route=gated&return={q}")))
            .await;
        assert_eq!(page.status, StatusCode::FOUND, "{what}");
        assert_harmless(&what, page.location().unwrap());
        assert_eq!(
            page.headers.get_all("set-cookie").iter().count(),
            0,
            "{what}"
        );

        // No such route: straight back to the return path.
        let page = waiting
            .navigate(&gate.url(&format!("/__queuegate/waiting?route=nope&return={q}")))
            .await;
        assert_harmless(&what, page.location().unwrap());

        // The status JSON, waiting and admitted.
        for visitor in [&mut waiting, &mut admitted] {
            let answer = visitor
                .fetch(&gate.url(&format!("/__queuegate/status?route=gated&return={q}")))
                .await;
            assert_eq!(answer.status, StatusCode::OK);
            assert_harmless(&what, answer.json()["return"].as_str().unwrap());
            assert!(!String::from_utf8_lossy(&answer.body).contains("evil"));
        }
    }
    // A good return survives all of them.
    let q = encode("/gated/page?x=1&y=%2F");
    let page = admitted
        .navigate(&gate.url(&format!("/__queuegate/waiting?route=gated&return={q}")))
        .await;
    assert_eq!(page.location(), Some("/gated/page?x=1&y=%2F"));
    let answer = waiting
        .fetch(&gate.url(&format!("/__queuegate/status?route=gated&return={q}")))
        .await;
    assert_eq!(answer.json()["return"], "/gated/page?x=1&y=%2F");
}

#[tokio::test]
async fn the_gate_never_builds_an_off_site_return_from_the_request_target() {
    let (origin, _) = counting_origin().await;
    let mut config = proxy_config(&origin.url());
    config.routes.push(route("all", "/", 1));
    let gate = spawn_gate(config).await;
    let mut first = Visitor::new();
    assert!(first.navigate(&gate.url("/")).await.reached_origin());

    let mut waiting = Visitor::new();
    // Encoded slashes, backslashes and line breaks make an ambiguous path:
    // refused before any return is built.
    for target in [
        "/%2F/evil.example",
        "/%2fevil.example",
        "/%5Cevil.example",
        "/%5C%5Cevil.example/",
        "/x%0d%0aSet-Cookie:%20stolen=1",
        "/x%0D%0ALocation:%20https://evil.example",
    ] {
        let answer = waiting.navigate(&gate.url(target)).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{target}");
        assert_eq!(answer.headers["x-queuegate"], "ambiguous-path", "{target}");
        assert!(answer.location().is_none(), "{target}");
    }
    for target in ["//evil.example/x", "//evil.example", "/x/..//evil.example"] {
        let answer = waiting.navigate(&gate.url(target)).await;
        assert_eq!(answer.status, StatusCode::FOUND, "{target}");
        let location = answer.location().unwrap();
        assert!(
            location.starts_with("/__queuegate/waiting?route=all&return="),
            "{target}: {location}"
        );
        assert!(!location.contains("evil"), "{target}: {location}");
        assert_eq!(return_of(location), "/", "{target}");
        assert!(answer
            .headers
            .get_all("set-cookie")
            .iter()
            .all(|c| c.to_str().unwrap().starts_with("qg_all=")));
    }
    // An ordinary target is kept, query and all.
    let answer = waiting.navigate(&gate.url("/shop/item?id=7&x=a%2Fb")).await;
    assert_eq!(
        return_of(answer.location().unwrap()),
        "/shop/item?id=7&x=a%2Fb"
    );
}

/// Each way a request says it is not a browser navigation.
fn api_requests(url: &str) -> Vec<(&'static str, Request<Full<Bytes>>)> {
    let get = || Request::get(url);
    let empty = || Full::new(Bytes::new());
    vec![
        (
            "Accept: application/json",
            get().header("accept", "application/json").body(empty()),
        ),
        (
            "application/json anywhere in Accept",
            get()
                .header("accept", "text/html;q=0.9, application/json")
                .header("sec-fetch-mode", "navigate")
                .body(empty()),
        ),
        (
            "X-Requested-With",
            get()
                .header("accept", "text/html,*/*")
                .header("x-requested-with", "XMLHttpRequest")
                .body(empty()),
        ),
        (
            "Sec-Fetch-Mode: cors",
            get()
                .header("accept", "text/html,*/*")
                .header("sec-fetch-mode", "cors")
                .body(empty()),
        ),
        (
            "Sec-Fetch-Mode: no-cors",
            get()
                .header("accept", "text/html,*/*")
                .header("sec-fetch-mode", "no-cors")
                .body(empty()),
        ),
        (
            "Sec-Fetch-Mode: same-origin",
            get()
                .header("accept", "text/html")
                .header("sec-fetch-mode", "same-origin")
                .body(empty()),
        ),
        (
            "no Accept at all (curl, SDKs)",
            get().header("accept", "*/*").body(empty()),
        ),
        (
            "POST from a form",
            Request::post(url)
                .header("accept", "text/html")
                .header("sec-fetch-mode", "navigate")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Full::new(Bytes::from_static(b"a=1"))),
        ),
        (
            "PUT",
            Request::put(url)
                .header("accept", "text/html")
                .body(Full::new(Bytes::from_static(b"{}"))),
        ),
        (
            "DELETE",
            Request::delete(url)
                .header("accept", "text/html")
                .body(empty()),
        ),
    ]
    .into_iter()
    .map(|(what, req)| (what, req.unwrap()))
    .collect()
}

#[tokio::test]
async fn every_kind_of_api_call_gets_json_with_the_configured_status() {
    let abandon_after = Duration::from_secs(6);
    let (gate, _origin, _admitted, mut waiting) = full_route(|r| {
        r.waiting_status = StatusCode::TOO_MANY_REQUESTS;
        r.abandon_after = abandon_after;
    })
    .await;
    let url = gate.url("/gated/api/cart");
    for (what, req) in api_requests(&url) {
        let answer = waiting.request(req).await;
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS, "{what}");
        assert_eq!(
            answer.headers.get("content-type").unwrap(),
            "application/json",
            "{what}"
        );
        let retry: u64 = answer
            .headers
            .get("retry-after")
            .unwrap_or_else(|| panic!("{what}: no Retry-After"))
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let body = answer.json();
        assert_eq!(body["state"], "waiting", "{what}");
        assert_eq!(body["route"], "gated", "{what}");
        assert_eq!(body["position"], 1, "{what}");
        assert_eq!(body["ahead"], 0, "{what}");
        assert_eq!(body["status_url"], "/__queuegate/status?route=gated");
        let poll = body["poll_after_ms"].as_u64().unwrap();
        assert_eq!(retry, poll.div_ceil(1000).max(1), "{what}");
        assert!(
            retry * 1000 <= abandon_after.as_millis() as u64 / 2,
            "{what}: obeying Retry-After {retry}s must keep the place"
        );
    }
    // The control: a navigation is sent to the page, GET or HEAD.
    let answer = waiting.navigate(&url).await;
    assert_eq!(answer.status, StatusCode::FOUND);
    let head = Request::head(&url)
        .header("accept", "text/html")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(waiting.request(head).await.status, StatusCode::FOUND);
    // A newcomer with no cookie gets the same kind of answer and a ticket.
    let mut app = Visitor::new();
    let answer = app.fetch(&url).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.json()["position"], 2);
    assert!(app.cookie("qg_gated").is_some(), "the app keeps a ticket");
    assert_eq!(app.status(&gate, "gated").await["position"], 2);
}

#[tokio::test]
async fn the_page_the_status_and_the_api_answer_agree() {
    let (gate, _origin, _admitted, mut waiting) = full_route(|_| {}).await;
    let mut third = Visitor::new();
    third.navigate(&gate.url("/gated/")).await;

    let api = third.fetch(&gate.url("/gated/x")).await.json();
    let status = third.status(&gate, "gated").await;
    let page = third
        .navigate(&gate.url("/__queuegate/waiting?route=gated&return=/gated/x"))
        .await;
    let embedded = embedded_state(std::str::from_utf8(&page.body).unwrap());
    for field in [
        "state",
        "route",
        "position",
        "ahead",
        "waiting_total",
        "eta_seconds",
    ] {
        assert_eq!(api[field], status[field], "{field}: api vs status");
        assert_eq!(embedded[field], status[field], "{field}: page vs status");
    }
    assert_eq!(status["position"], 2);
    assert_eq!(status["waiting_total"], 2);
    assert_eq!(embedded["return"], "/gated/x");
    assert_eq!(status["return"], "/");
    assert_eq!(waiting.status(&gate, "gated").await["position"], 1);
}

#[tokio::test]
async fn korean_page_through_the_endpoint_is_small_and_self_contained() {
    let (gate, _origin, _admitted, mut waiting) = full_route(|_| {}).await;
    let req = Request::get(gate.url("/__queuegate/waiting?route=gated&return=/gated/page"))
        .header("accept", "text/html")
        .header("accept-language", "ko-KR,ko;q=0.9,en-US;q=0.8")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let answer = waiting.request(req).await;
    assert_eq!(answer.status, StatusCode::OK);
    let html = std::str::from_utf8(&answer.body).unwrap();
    assert!(html.len() < 32 * 1024, "{} bytes", html.len());
    assert!(html.contains(r#"<html lang="ko">"#));
    assert!(html.contains("내 대기 순서"));
    assert!(html.contains("대기 중입니다"));
    assert!(!html.contains("http://") && !html.contains("https://"));
    let csp = answer
        .headers
        .get("content-security-policy")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(csp.starts_with("default-src 'none'"));
    assert!(csp.contains("worker-src blob:"));
    assert_eq!(answer.headers.get("x-queuegate").unwrap(), "waiting");

    let english = waiting
        .navigate(&gate.url("/__queuegate/waiting?route=gated"))
        .await;
    let html = std::str::from_utf8(&english.body).unwrap();
    assert!(html.contains(r#"<html lang="en">"#));
    assert!(html.contains("Your place in line"));
    // `?lang=ko` wins over the header.
    let chosen = waiting
        .navigate(&gate.url("/__queuegate/waiting?route=gated&lang=ko"))
        .await;
    assert!(std::str::from_utf8(&chosen.body)
        .unwrap()
        .contains(r#"<html lang="ko">"#));
}

#[tokio::test]
async fn route_title_and_message_are_shown_escaped() {
    let (gate, _origin, _admitted, mut waiting) = full_route(|r| {
        r.page.title = Some("Concert <tickets>".into());
        r.page.message = Some("Doors open at 8 & sales end at 10".into());
    })
    .await;
    let page = waiting
        .navigate(&gate.url("/__queuegate/waiting?route=gated"))
        .await;
    let html = std::str::from_utf8(&page.body).unwrap();
    assert!(html.contains(r#"data-qg="title">Concert &lt;tickets&gt;<"#));
    assert!(html.contains("<title>You&#39;re in line · Concert &lt;tickets&gt;</title>"));
    assert!(html.contains("Doors open at 8 &amp; sales end at 10"));
    assert_eq!(embedded_state(html)["has_title"], true);
}

const CUSTOM: &str = "<!doctype html><html lang=\"{{lang}}\"><title>{{title}}</title>\n\
<h1 id=\"custom\">{{ t:position_label }}: {{position}}</h1>\n{{status_json}}\n{{script}}\n";

fn yaml_with_template(path: &std::path::Path) -> String {
    [
        "listen:",
        "  - addr: 127.0.0.1:8080",
        "upstream:",
        "  url: http://127.0.0.1:3000",
        "keys:",
        "  - { id: k1, env: QUEUEGATE_KEY_K1 }",
        "routes:",
        "  - name: ok",
        "    match: { path_prefix: /ok }",
        "    capacity: 1",
        "  - name: tickets",
        "    match: { path_prefix: /tickets }",
        "    capacity: 1",
        "    page:",
        "      title: Tickets",
        &format!("      template: {}", path.display()),
        "",
    ]
    .join("\n")
}

#[test]
fn a_template_missing_a_placeholder_is_a_config_error_at_its_field() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("page.html");
    std::fs::write(&template, "<html>{{title}}\n{{status_json}}</html>").unwrap();
    let yaml = yaml_with_template(&template);
    let errors = queuegate::config::Config::from_yaml(&yaml).unwrap_err();
    let error = errors.at("routes[1].page.template").unwrap_or_else(|| {
        panic!("no error at routes[1].page.template: {errors}");
    });
    assert!(error.message.contains("{{script}}"), "{}", error.message);
    assert_eq!(error.line, Some(16));

    // `queuegate check` reports the same, through the file.
    let config = dir.path().join("queuegate.yaml");
    std::fs::write(&config, &yaml).unwrap();
    let errors = queuegate::check(&config).unwrap_err();
    assert!(errors.at("routes[1].page.template").is_some(), "{errors}");
    assert!(errors.to_string().contains("routes[1].page.template"));

    // Unknown placeholder and unreadable file are reported there too.
    std::fs::write(&template, "{{status_json}}{{script}}\n{{positon}}").unwrap();
    let errors = queuegate::config::Config::from_yaml(&yaml).unwrap_err();
    let message = &errors.at("routes[1].page.template").unwrap().message;
    assert!(
        message.contains("positon") && message.contains("line 2"),
        "{message}"
    );
    std::fs::remove_file(&template).unwrap();
    let errors = queuegate::config::Config::from_yaml(&yaml).unwrap_err();
    assert!(errors
        .at("routes[1].page.template")
        .unwrap()
        .message
        .contains("cannot read"));

    std::fs::write(&template, CUSTOM).unwrap();
    let config = queuegate::config::Config::from_yaml(&yaml).unwrap();
    assert_eq!(
        config.routes[1].page.template.as_ref().unwrap().path,
        template
    );
}

#[tokio::test]
async fn a_route_template_is_rendered_for_that_route() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("page.html");
    std::fs::write(&path, CUSTOM).unwrap();
    let template = queuegate::config::PageTemplate::load(&path).unwrap();
    let (gate, _origin, _admitted, mut waiting) = full_route(|r| {
        r.page.title = Some("Tickets".into());
        r.page.template = Some(template);
    })
    .await;
    let req = Request::get(gate.url("/__queuegate/waiting?route=gated"))
        .header("accept", "text/html")
        .header("accept-language", "ko")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let page = waiting.request(req).await;
    assert_eq!(page.status, StatusCode::OK);
    let html = std::str::from_utf8(&page.body).unwrap();
    assert!(html.starts_with("<!doctype html><html lang=\"ko\"><title>Tickets</title>"));
    assert!(html.contains("<h1 id=\"custom\">내 대기 순서: 1</h1>"));
    assert_eq!(embedded_state(html)["position"], 1);
    // The template's author may add inline code: no policy for it.
    assert!(page.headers.get("content-security-policy").is_none());
}
