//! Operations: live config reload (file watch, reload requests, SIGHUP), the
//! admin listener's endpoints, metrics that match what happened, and the
//! per-request log line.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use queuegate::config::Mode;
use queuegate::RunOptions;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

/// A config file for a gate in front of `upstream` with route `tickets` of
/// `capacity`, signing with the key in `key_file`. The in-process harness
/// binds the admin listener itself.
fn config_text(upstream: &str, key_file: &Path, capacity: u64) -> String {
    format!(
        "listen: [{{ addr: 127.0.0.1:0 }}]
upstream: {{ url: {upstream} }}
keys: [{{ id: k1, file: {key} }}]
routes:
  - name: tickets
    match: {{ path_prefix: /tickets }}
    capacity: {capacity}
    tick: 20ms
",
        key = key_file.display()
    )
}

// ---- a strict OpenMetrics reader ----

/// One scrape: samples by `name{labels}` (labels sorted), and family types.
struct Scrape {
    samples: HashMap<String, f64>,
}

impl Scrape {
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples.get(&series_key(name, labels)).copied()
    }
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no sample {}", series_key(name, labels)))
    }
}

fn series_key(name: &str, labels: &[(&str, &str)]) -> String {
    let sorted: BTreeMap<_, _> = labels.iter().copied().collect();
    let inner: Vec<String> = sorted.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{name}{{{}}}", inner.join(","))
}

/// Parses the exposition strictly: every line is a `# HELP`/`# TYPE`/`# UNIT`
/// comment, `# EOF` (last), or `name{labels} value` whose family was declared
/// with a type that allows that sample name. Anything else panics.
fn parse_metrics(text: &str) -> Scrape {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = HashMap::new();
    let mut lines = text.lines().peekable();
    let mut saw_eof = false;
    while let Some(line) = lines.next() {
        if line == "# EOF" {
            assert!(lines.peek().is_none(), "# EOF is not last");
            saw_eof = true;
            break;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let kind = parts.next().unwrap();
            let family = parts
                .next()
                .unwrap_or_else(|| panic!("bad comment: {line}"));
            assert!(is_metric_name(family), "bad family name: {line}");
            match kind {
                "TYPE" => {
                    let t = parts.next().unwrap_or_else(|| panic!("no type: {line}"));
                    assert!(
                        ["counter", "gauge", "histogram", "info", "unknown"].contains(&t),
                        "unknown type: {line}"
                    );
                    assert!(
                        types.insert(family.to_owned(), t.to_owned()).is_none(),
                        "family declared twice: {family}"
                    );
                }
                "HELP" | "UNIT" => {}
                _ => panic!("unknown comment: {line}"),
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not `series value`: {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let inner = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels: {line}"));
                (name, parse_labels(inner, line))
            }
            None => (series, Vec::new()),
        };
        assert!(is_metric_name(name), "bad sample name: {line}");
        let declared = types.iter().any(|(family, t)| {
            let suffixes: &[&str] = match t.as_str() {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "info" => &["_info"],
                _ => &[""],
            };
            suffixes.iter().any(|s| name == format!("{family}{s}"))
        });
        assert!(declared, "sample of an undeclared family: {line}");
        let pairs: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let key = series_key(name, &pairs);
        assert!(
            samples.insert(key, value).is_none(),
            "duplicate sample: {line}"
        );
    }
    assert!(saw_eof, "no # EOF");
    Scrape { samples }
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_labels(mut inner: &str, line: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while !inner.is_empty() {
        let (key, rest) = inner
            .split_once("=\"")
            .unwrap_or_else(|| panic!("bad label: {line}"));
        assert!(is_metric_name(key), "bad label name: {line}");
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => panic!("bad escape: {line}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value: {line}"),
            }
        };
        out.push((key.to_owned(), value));
        inner = &rest[end + 1..];
        if let Some(more) = inner.strip_prefix(',') {
            inner = more;
        } else {
            assert!(inner.is_empty(), "junk after label: {line}");
        }
    }
    out
}

async fn scrape(gate: &Gate) -> Scrape {
    let (parts, body) = get(&gate.admin_url("/metrics")).await;
    assert_eq!(parts.status, StatusCode::OK);
    let content_type = parts.headers["content-type"].to_str().unwrap();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    parse_metrics(std::str::from_utf8(&body).unwrap())
}

/// Scrapes until `cond` holds on a scrape, failing after 10 s.
async fn scrape_until(gate: &Gate, what: &str, cond: impl Fn(&Scrape) -> bool) -> Scrape {
    for _ in 0..500 {
        let s = scrape(gate).await;
        if cond(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting until {what}");
}

fn reloads(s: &Scrape, result: &str) -> f64 {
    s.value("queuegate_config_reloads_total", &[("result", result)])
}

// ---- live reload ----

#[tokio::test]
async fn raising_capacity_in_the_file_admits_a_waiter_and_a_bad_edit_keeps_the_old_config() {
    let (origin, _hits) = counting_origin().await;
    let dir = ConfigDir::new();
    dir.write(&config_text(&origin.url(), &dir.key(), 1));
    let gate = gate_from_file(&dir, None).await;

    let mut first = Visitor::new();
    assert!(first.navigate(&gate.url("/tickets")).await.reached_origin());
    let mut second = Visitor::new();
    let held = second.navigate(&gate.url("/tickets")).await;
    assert_eq!(held.status, StatusCode::FOUND);
    assert_eq!(second.status(&gate, "tickets").await["state"], "waiting");

    dir.write(&config_text(&origin.url(), &dir.key(), 2));
    let mut admitted = false;
    for _ in 0..500 {
        if second.status(&gate, "tickets").await["state"] == "admitted" {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        admitted,
        "the waiter was not admitted after capacity went up"
    );
    assert!(second
        .navigate(&gate.url("/tickets"))
        .await
        .reached_origin());
    let s = scrape(&gate).await;
    assert_eq!(reloads(&s, "ok"), 1.0);
    assert_eq!(reloads(&s, "error"), 0.0);
    assert_eq!(s.value("queuegate_capacity", &[("route", "tickets")]), 2.0);

    // An invalid edit: rejected, counted, and the old config keeps serving.
    dir.write(&config_text(&origin.url(), &dir.key(), 2).replace("capacity: 2", "capacity: lots"));
    let s = scrape_until(&gate, "the bad edit is counted", |s| {
        reloads(s, "error") == 1.0
    })
    .await;
    assert_eq!(reloads(&s, "ok"), 1.0);
    assert_eq!(s.value("queuegate_capacity", &[("route", "tickets")]), 2.0);
    assert!(first.navigate(&gate.url("/tickets")).await.reached_origin());
    let (_, body) = get(&gate.admin_url("/routes")).await;
    let routes: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(routes["routes"][0]["capacity"], 2);
    let mut third = Visitor::new();
    assert_eq!(
        third.navigate(&gate.url("/tickets")).await.status,
        StatusCode::FOUND
    );
    gate.stop().await.unwrap();
}

#[tokio::test]
async fn a_new_key_ring_applies_to_connections_already_open() {
    let (origin, hits) = counting_origin().await;
    let dir = ConfigDir::new();
    dir.write(&config_text(&origin.url(), &dir.key(), 1));
    let gate = gate_from_file(&dir, None).await;

    // A pass, used twice on one keep-alive connection.
    let mut conn = KeepAlive::connect(gate.addr).await;
    let (status, head) = conn.get("/tickets", "").await;
    assert_eq!(status, StatusCode::OK, "{head}");
    let pass = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no pass: {head}"))
        .to_owned();
    // Admitted at once: the first return confirms the session and brings
    // the confirmed pass, which is used from then on.
    assert!(pass.starts_with("qg_tickets=v1.n."), "{pass}");
    let (status, head) = conn.get("/tickets", &pass).await;
    assert_eq!(status, StatusCode::OK, "{head}");
    let pass = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no confirmed pass: {head}"))
        .to_owned();
    assert!(pass.starts_with("qg_tickets=v1.a."), "{pass}");
    let (status, head) = conn.get("/tickets", &pass).await;
    assert_eq!(status, StatusCode::OK, "{head}");
    assert!(
        !head.contains("set-cookie"),
        "the pass was not taken: {head}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 3);

    // The key `k1` is replaced by a new secret: the pass it signed no longer
    // verifies, on the connection that already used it too. Its holder is
    // a newcomer again, and the one slot is still its old session's.
    let new_key = dir.path().join("k1-new.key");
    std::fs::write(&new_key, queuegate::admission::keygen()).unwrap();
    dir.write(&config_text(&origin.url(), &new_key, 1));
    scrape_until(&gate, "the new key is loaded", |s| reloads(s, "ok") == 1.0).await;
    let (status, head) = conn.get("/tickets", &pass).await;
    // Not a navigation: the API answer, 503 and a ticket for the line.
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the old pass still worked: {head}"
    );
    assert!(head.contains("x-queuegate: waiting"), "{head}");
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    gate.stop().await.unwrap();
}

#[tokio::test]
async fn routes_added_by_a_reload_are_gated_and_removed_ones_are_not() {
    let (origin, _hits) = counting_origin().await;
    let dir = ConfigDir::new();
    let base = config_text(&origin.url(), &dir.key(), 1);
    dir.write(&base);
    let gate = gate_from_file(&dir, None).await;

    let added = format!(
        "{base}  - name: shop\n    match: {{ path_prefix: /shop }}\n    capacity: 5\n    mode: closed\n"
    );
    dir.write(&added);
    scrape_until(&gate, "the route is added", |s| reloads(s, "ok") == 1.0).await;
    let mut v = Visitor::new();
    assert_eq!(v.fetch(&gate.url("/shop")).await.json()["state"], "closed");

    dir.write(&base);
    let s = scrape_until(&gate, "the route is removed", |s| reloads(s, "ok") == 2.0).await;
    assert!(s.get("queuegate_capacity", &[("route", "shop")]).is_none());
    assert!(v.fetch(&gate.url("/shop")).await.reached_origin());
    gate.stop().await.unwrap();
}

#[tokio::test]
async fn a_reload_request_reloads_even_an_unchanged_file() {
    let (origin, _hits) = counting_origin().await;
    let dir = ConfigDir::new();
    dir.write(&config_text(&origin.url(), &dir.key(), 1));
    let (trigger, requests) = queuegate::reload::channel();
    let gate = gate_from_file(&dir, Some(requests)).await;
    let s = scrape(&gate).await;
    assert_eq!(reloads(&s, "ok"), 0.0);
    trigger.reload();
    scrape_until(&gate, "the forced reload is applied", |s| {
        reloads(s, "ok") == 1.0
    })
    .await;
    gate.stop().await.unwrap();
}

// ---- the binary: SIGHUP and logs ----

/// Runs the `queuegate` binary on the config in `dir`, its public and admin
/// listeners on ports it picks, and waits until it is healthy.
async fn run_binary(dir: &ConfigDir, upstream: &str, log_args: &[&str]) -> Process {
    let text = config_text(upstream, &dir.key(), 1).replace(
        "listen: [{ addr: 127.0.0.1:0 }]",
        "listen: [{ addr: 127.0.0.1:0 }]\nadmin: { addr: 127.0.0.1:0 }",
    );
    dir.write(&text);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_queuegate"));
    cmd.args(log_args)
        .args(["run", "-c"])
        .arg(dir.config())
        .env("QUEUEGATE_LOG", "debug")
        .stdout(Stdio::null());
    let child = Process::start(cmd, true).await;
    let client = client::<http_body_util::Full<bytes::Bytes>>();
    for _ in 0..500 {
        let req = http::Request::get(child.admin_url("/healthz"))
            .body(Default::default())
            .unwrap();
        if let Ok(resp) = client.request(req).await {
            if resp.status() == StatusCode::OK {
                return child;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the queuegate binary did not start:\n{}", child.log());
}

async fn child_scrape(child: &Process) -> Scrape {
    let (parts, body) = get(&child.admin_url("/metrics")).await;
    assert_eq!(parts.status, StatusCode::OK);
    parse_metrics(std::str::from_utf8(&body).unwrap())
}

#[tokio::test]
async fn sighup_reloads_the_running_binary() {
    let (origin, _hits) = counting_origin().await;
    let dir = ConfigDir::new();
    let child = run_binary(&dir, &origin.url(), &[]).await;
    assert_eq!(reloads(&child_scrape(&child).await, "ok"), 0.0);
    child.signal("HUP");
    let mut reloaded = false;
    for _ in 0..500 {
        if reloads(&child_scrape(&child).await, "ok") == 1.0 {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reloaded, "SIGHUP did not reload");
    let (code, _) = child.stop();
    assert_eq!(code, 0);
}

#[tokio::test]
async fn json_logs_carry_route_and_decision_and_never_cookies() {
    let (origin, _hits) = counting_origin().await;
    let dir = ConfigDir::new();
    let child = run_binary(&dir, &origin.url(), &["--log-format", "json"]).await;
    let mut v = Visitor::new();
    assert!(v.navigate(&child.url("/tickets")).await.reached_origin());
    let cookie = v.cookie("qg_tickets").unwrap().to_owned();
    // The second request carries the pass in its Cookie header and
    // confirms the session (renewed); the third uses the confirmed pass.
    assert!(v.navigate(&child.url("/tickets/2")).await.reached_origin());
    assert!(v.navigate(&child.url("/tickets/3")).await.reached_origin());
    let (code, logs) = child.stop();
    assert_eq!(code, 0);

    let mut decisions = Vec::new();
    for line in logs.lines() {
        let entry: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if entry["message"] == "request" {
            decisions.push((
                entry["route"].as_str().unwrap().to_owned(),
                entry["decision"].as_str().unwrap().to_owned(),
                entry["status"].as_u64().unwrap(),
            ));
        }
    }
    assert!(
        decisions.contains(&("tickets".into(), "at_once".into(), 200)),
        "{decisions:?}"
    );
    assert!(
        decisions.contains(&("tickets".into(), "renewed".into(), 200)),
        "{decisions:?}"
    );
    assert!(
        decisions.contains(&("tickets".into(), "pass".into(), 200)),
        "{decisions:?}"
    );
    let mac = cookie.rsplit('.').next().unwrap();
    assert!(!logs.contains(&cookie), "a cookie value was logged");
    assert!(!logs.contains(mac), "a cookie's MAC was logged");
    let key = std::fs::read_to_string(dir.key()).unwrap();
    assert!(!logs.contains(key.trim()), "the key was logged");
}

// ---- metrics ----

#[tokio::test]
async fn metrics_count_what_happened() {
    let (origin, _hits) = counting_origin().await;
    let mut config = proxy_config(&origin.url());
    let mut tickets = route("tickets", "/tickets", 1);
    tickets.max_waiting = 2;
    let mut shop = route("shop", "/shop", 5);
    shop.mode = Mode::Closed;
    config.routes = vec![tickets, shop];
    let gate = spawn_gate_opts(config, ring("k1"), RunOptions::default()).await;

    let s = scrape(&gate).await;
    for how in ["at_once", "from_line"] {
        let labels = [("route", "tickets"), ("how", how)];
        assert_eq!(s.value("queuegate_admitted_total", &labels), 0.0);
    }
    assert_eq!(s.value("queuegate_capacity", &[("route", "tickets")]), 1.0);

    let mut first = Visitor::new();
    assert!(first.navigate(&gate.url("/tickets")).await.reached_origin());
    let mut second = Visitor::new();
    assert_eq!(
        second.navigate(&gate.url("/tickets")).await.status,
        StatusCode::FOUND
    );
    let mut third = Visitor::new();
    assert_eq!(
        third.fetch(&gate.url("/tickets")).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let mut fourth = Visitor::new();
    assert_eq!(
        fourth.fetch(&gate.url("/tickets")).await.json()["state"],
        "full"
    );
    let mut fifth = Visitor::new();
    assert_eq!(
        fifth.fetch(&gate.url("/shop")).await.json()["state"],
        "closed"
    );
    assert!(fifth.fetch(&gate.url("/elsewhere")).await.reached_origin());

    let s = scrape_until(&gate, "the line shows in the waiting gauge", |s| {
        s.get("queuegate_waiting", &[("route", "tickets")]) == Some(2.0)
    })
    .await;
    let t = |k: &'static str, v: &'static str| [("route", "tickets"), (k, v)];
    assert_eq!(
        s.value("queuegate_admitted_total", &t("how", "at_once")),
        1.0
    );
    assert_eq!(
        s.value("queuegate_held_total", &[("route", "tickets")]),
        2.0
    );
    assert_eq!(
        s.value("queuegate_rejected_total", &t("reason", "full")),
        1.0
    );
    assert_eq!(
        s.value("queuegate_rejected_total", &t("reason", "closed")),
        0.0
    );
    let shop_closed = [("route", "shop"), ("reason", "closed")];
    assert_eq!(s.value("queuegate_rejected_total", &shop_closed), 1.0);
    assert_eq!(s.value("queuegate_active", &[("route", "tickets")]), 1.0);
    let decision = |d: &str| s.value("queuegate_requests_total", &[("decision", d)]);
    assert_eq!(decision("at_once"), 1.0);
    assert_eq!(decision("held"), 2.0);
    assert_eq!(decision("full"), 1.0);
    assert_eq!(decision("closed"), 1.0);
    assert_eq!(decision("forwarded"), 1.0);
    assert_eq!(
        s.value("queuegate_upstream_request_duration_seconds_count", &[]),
        2.0
    );

    // The admitted visitor leaves: the first waiter is admitted from the line.
    first.leave(&gate, "tickets").await;
    let s = scrape_until(&gate, "a waiter is admitted from the line", |s| {
        s.get("queuegate_admitted_total", &t("how", "from_line")) == Some(1.0)
    })
    .await;
    // One admission from the line, counted once, in its lane; in order.
    let waited = [("route", "tickets"), ("lane", "main")];
    assert_eq!(s.value("queuegate_wait_seconds_count", &waited), 1.0);
    let inversions = [("route", "tickets")];
    assert_eq!(
        s.value("queuegate_admission_inversions_total", &inversions),
        0.0
    );
    assert_eq!(second.status(&gate, "tickets").await["state"], "admitted");
    gate.stop().await.unwrap();
}

/// Open client connections speaking `protocol` (`h1`, `h2`, `tunnel`).
fn open(s: &Scrape, protocol: &str) -> f64 {
    s.value("queuegate_connections", &[("protocol", protocol)])
}

/// Open connections of every protocol, in the order h1, h2, tunnel.
fn open_all(s: &Scrape) -> [f64; 3] {
    ["h1", "h2", "tunnel"].map(|p| open(s, p))
}

#[tokio::test]
async fn open_connections_are_counted_by_protocol_until_they_close() {
    let (origin, _hits) = counting_origin().await;
    let gate = spawn_gate_opts(
        proxy_config(&origin.url()),
        ring("k1"),
        RunOptions::default(),
    )
    .await;
    assert_eq!(open_all(&scrape(&gate).await), [0.0, 0.0, 0.0]);

    let mut h1 = KeepAlive::connect(gate.addr).await;
    assert_eq!(h1.get("/one", "").await.0, StatusCode::OK);
    scrape_until(&gate, "the HTTP/1 connection is counted", |s| {
        open_all(s) == [1.0, 0.0, 0.0]
    })
    .await;

    // HTTP/2 with prior knowledge, on a connection this test owns.
    let stream = TcpStream::connect(gate.addr).await.unwrap();
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let h2_conn = tokio::spawn(conn);
    let resp = h2
        .send_request(
            Request::get(gate.url("/two"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), StatusCode::OK);
    resp.into_body().collect().await.unwrap();
    scrape_until(&gate, "the HTTP/2 connection is counted", |s| {
        open_all(s) == [1.0, 1.0, 0.0]
    })
    .await;

    drop(h1);
    scrape_until(
        &gate,
        "the closed HTTP/1 connection is no longer counted",
        |s| open_all(s) == [0.0, 1.0, 0.0],
    )
    .await;
    // Dropping the connection's task closes its socket.
    h2_conn.abort();
    scrape_until(
        &gate,
        "the closed HTTP/2 connection is no longer counted",
        |s| open_all(s) == [0.0, 0.0, 0.0],
    )
    .await;
    gate.stop().await.unwrap();
}

#[tokio::test]
async fn an_upgraded_connection_is_counted_as_a_tunnel_while_it_is_open() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin_addr = listener.local_addr().unwrap();
    let echo = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                while let Some(Ok(msg)) = ws.next().await {
                    if msg.is_text() && ws.send(msg).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let config = proxy_config(&format!("http://{origin_addr}"));
    let gate = spawn_gate_opts(config, ring("k1"), RunOptions::default()).await;

    let stream = TcpStream::connect(gate.addr).await.unwrap();
    let (mut ws, resp) =
        tokio_tungstenite::client_async(format!("ws://{}/socket", gate.addr), stream)
            .await
            .unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    ws.send(Message::text("ping")).await.unwrap();
    let echoed = ws.next().await.unwrap().unwrap();
    assert_eq!(echoed.into_text().unwrap().as_str(), "ping");
    // Upgraded, the connection is no longer HTTP/1 but a tunnel.
    scrape_until(&gate, "the tunnel is counted", |s| {
        open_all(s) == [0.0, 0.0, 1.0]
    })
    .await;

    ws.close(None).await.unwrap();
    while let Some(Ok(_)) = ws.next().await {}
    drop(ws);
    scrape_until(&gate, "the closed tunnel is no longer counted", |s| {
        open_all(s) == [0.0, 0.0, 0.0]
    })
    .await;
    echo.abort();
    gate.stop().await.unwrap();
}

#[tokio::test]
async fn parks_and_resumes_are_counted() {
    let (origin, _hits) = counting_origin().await;
    let gate = spawn_gate_opts(
        proxy_config(&origin.url()),
        ring("k1"),
        RunOptions::default(),
    )
    .await;
    let parks = |s: &Scrape| s.value("queuegate_parks_total", &[]);
    let resumes = |s: &Scrape| s.value("queuegate_resumes_total", &[]);
    let parked = |s: &Scrape| s.value("queuegate_parked_connections", &[]);
    let s = scrape(&gate).await;
    assert_eq!((parks(&s), resumes(&s), parked(&s)), (0.0, 0.0, 0.0));

    let mut client = KeepAlive::connect(gate.addr).await;
    assert_eq!(client.get("/first", "").await.0, StatusCode::OK);
    // An idle keep-alive connection is parked within two park delays.
    let s = scrape_until(&gate, "the idle connection is parked", |s| parks(s) == 1.0).await;
    assert_eq!((parked(&s), resumes(&s)), (1.0, 0.0));
    assert_eq!(open(&s, "h1"), 1.0, "a parked connection is still open");

    assert_eq!(client.get("/second", "").await.0, StatusCode::OK);
    let s = scrape(&gate).await;
    assert_eq!(resumes(&s), 1.0);
    assert_eq!(parked(&s), parks(&s) - 1.0);

    // Parked again, then closed by the client while parked.
    let s = scrape_until(&gate, "the connection is parked again", |s| parks(s) == 2.0).await;
    assert_eq!(parked(&s), 1.0);
    drop(client);
    let s = scrape_until(&gate, "the closed connection is no longer counted", |s| {
        open(s, "h1") == 0.0
    })
    .await;
    assert_eq!(parked(&s), 0.0);
    assert_eq!(parks(&s), 2.0);
    gate.stop().await.unwrap();
}

#[test]
fn the_strict_reader_rejects_what_is_not_exposition() {
    let ok = "# TYPE a counter\na_total 1\n# EOF\n";
    assert_eq!(parse_metrics(ok).value("a_total", &[]), 1.0);
    for bad in [
        "a_total 1\n# EOF\n",                   // undeclared family
        "# TYPE a counter\na 1\n# EOF\n",       // counter sample without _total
        "# TYPE a gauge\na{x=\"1\" 1\n# EOF\n", // unclosed labels
        "# TYPE a gauge\na one\n# EOF\n",       // not a number
        "# TYPE a gauge\na 1\n",                // no EOF
    ] {
        let caught = std::panic::catch_unwind(|| parse_metrics(bad));
        assert!(caught.is_err(), "accepted: {bad:?}");
    }
}

// ---- health, readiness, routes ----

#[tokio::test]
async fn readiness_turns_off_as_soon_as_the_drain_starts() {
    let release = Arc::new(tokio::sync::Notify::new());
    let arrived = Arc::new(AtomicUsize::new(0));
    let (r, a) = (release.clone(), arrived.clone());
    let origin = spawn_origin(move |_req| {
        let (r, a) = (r.clone(), a.clone());
        async move {
            a.fetch_add(1, Ordering::SeqCst);
            r.notified().await;
            Response::new(full("slow"))
        }
    })
    .await;
    let mut config = proxy_config(&origin.url());
    config.routes = vec![route("tickets", "/tickets", 10)];
    let mut gate = spawn_gate_opts(config, ring("k1"), RunOptions::default()).await;

    assert_eq!(
        get(&gate.admin_url("/healthz")).await.0.status,
        StatusCode::OK
    );
    let mut ready = false;
    for _ in 0..500 {
        if get(&gate.admin_url("/readyz")).await.0.status == StatusCode::OK {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(ready, "never ready");
    let (parts, body) = get(&gate.admin_url("/routes")).await;
    assert_eq!(parts.status, StatusCode::OK);
    let routes: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let route = &routes["routes"][0];
    assert_eq!(route["name"], "tickets");
    assert_eq!(route["capacity"], 10);
    assert_eq!(route["mode"], "gate");
    assert_eq!(route["match"]["path_prefix"], "/tickets");
    assert!(route["waiting"].is_u64() && route["active"].is_u64());
    assert_eq!(
        get(&gate.admin_url("/nothing")).await.0.status,
        StatusCode::NOT_FOUND
    );

    let slow_url = gate.url("/slow");
    let slow = tokio::spawn(async move { get(&slow_url).await.0.status });
    eventually("the slow request reached the origin", || {
        arrived.load(Ordering::SeqCst) == 1
    })
    .await;
    gate.start_drain();
    let mut unready = false;
    for _ in 0..500 {
        if get(&gate.admin_url("/readyz")).await.0.status == StatusCode::SERVICE_UNAVAILABLE {
            unready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(unready, "readiness stayed on during the drain");
    assert!(
        !slow.is_finished(),
        "the slow request finished before the check"
    );
    assert_eq!(
        get(&gate.admin_url("/healthz")).await.0.status,
        StatusCode::OK
    );
    release.notify_waiters();
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    gate.stop().await.unwrap();
}
