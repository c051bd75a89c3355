//! The waiting room in a real browser: queuegate runs in-process in front of
//! an HTML origin with a capacity-1 route `/gated`, and scripts in
//! `tests/e2e` drive Debian's Chromium through it with playwright-core
//! (`npm ci` in `tests/e2e`; `./scripts/test` does it): `waiting_room.mjs`
//! waits and survives a network cut, `invite.mjs` follows invite links,
//! `opening.mjs` waits for an opening, `events.mjs` follows the event stream,
//! `live.mjs` watches and closes the route on the admin listener's live view.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use http::{Request, Response};
use hyper::body::Incoming;

/// `tests/e2e`, once playwright-core and Chromium are there.
fn e2e_dir() -> PathBuf {
    let e2e = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e");
    assert!(
        e2e.join("node_modules/playwright-core").is_dir(),
        "playwright-core is not installed: run `npm ci` in tests/e2e (./scripts/test does)"
    );
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "/usr/bin/chromium is missing: apt-get install chromium"
    );
    e2e
}

/// An HTML origin that shows the target it got in `#path`.
async fn html_origin() -> Origin {
    spawn_origin(|req: Request<Incoming>| async move {
        let path = req.uri().to_string();
        let mut resp = Response::new(full(format!(
            "<!doctype html><title>Origin</title><h1>The origin</h1><p id=\"path\">{path}</p>"
        )));
        resp.headers_mut()
            .insert("content-type", "text/html; charset=utf-8".parse().unwrap());
        resp
    })
    .await
}

/// The capacity-1 route `/gated` the scripts drive: long enough an
/// `abandon_after` that a waiter whose network is cut for 10 s keeps its
/// place.
fn gated() -> queuegate::config::Route {
    let mut gated = route("gated", "/gated", 1);
    gated.tick = Duration::from_millis(100);
    gated.abandon_after = Duration::from_secs(60);
    gated
}

/// Runs `node <script> <args>` in `e2e` and checks that it passed and
/// printed each of `checks`, in order.
async fn run_script(e2e: &Path, script: &str, args: Vec<String>, checks: &[&str]) {
    let dir = e2e.to_path_buf();
    let name = script.to_owned();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("node")
            .arg(&name)
            .args(&args)
            .current_dir(&dir)
            .output()
    })
    .await
    .unwrap()
    .expect("node runs (apt-get install nodejs)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "browser test {script} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let mut at = 0;
    for check in checks {
        match lines[at..].iter().position(|l| l == check) {
            Some(i) => at += i + 1,
            None => panic!("missing or out of order: {check:?}\n{stdout}"),
        }
    }
    assert!(!stdout.contains("not ok"), "{stdout}");
}

/// The screenshots `<prefix>-{en,ko}-{desktop,360}.png` in `shots` are PNGs.
fn assert_screenshots(shots: &Path, prefix: &str) {
    for name in ["en-desktop", "en-360", "ko-desktop", "ko-360"] {
        let file = shots.join(format!("{prefix}-{name}.png"));
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            bytes.starts_with(b"\x89PNG"),
            "{} is not a PNG",
            file.display()
        );
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Every check the script reports, in order.
const CHECKS: &[&str] = &[
    "ok - A is admitted and sees the origin",
    "ok - B lands on the waiting page",
    "ok - B's page is in Korean",
    "ok - B is at place 1",
    "ok - B polls from a worker",
    "ok - B keeps place 1 after a reload",
    "ok - the reload kept B's ticket",
    "ok - A leaves",
    "ok - B is back at /gated/page?x=1",
    "ok - B sees the origin's page",
    "ok - C's page says it is reconnecting",
    "ok - C's page did not go ahead while offline",
    "ok - C keeps place 1 after the cut",
    "ok - C reaches the origin after the cut",
    "ok - no Content-Security-Policy violations",
    "waiting room: all checks passed",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_waits_comes_back_by_itself_and_survives_a_network_cut() {
    let e2e = e2e_dir();
    let origin = html_origin().await;
    let mut config = proxy_config(&origin.url());
    config.routes.push(gated());
    let gate = spawn_gate(config).await;
    let shots = e2e.join("screenshots-out");
    let args = vec![gate.url(""), shots.display().to_string()];
    run_script(&e2e, "waiting_room.mjs", args, CHECKS).await;
    assert_screenshots(&shots, "waiting");
    gate.stop().await.unwrap();
}

/// Every check the invite script reports, in order.
const INVITE_CHECKS: &[&str] = &[
    "ok - A is admitted and sees the origin",
    "ok - B's page shows no priority line",
    "ok - C's address bar has no invite",
    "ok - C's page says priority line",
    "ok - C is first in the vip lane",
    "ok - D's page says priority line in Korean",
    "ok - C reaches /gated/c?x=1 without the invite",
    "ok - B still waits",
    "invite: all checks passed",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invite_link_opens_the_waiting_page_in_the_priority_line() {
    let e2e = e2e_dir();
    let origin = html_origin().await;
    let mut config = proxy_config(&origin.url());
    let mut route = gated();
    route.lanes = queuegate::config::Lanes::new(vec![
        queuegate::config::Lane::main(),
        queuegate::config::Lane {
            name: "vip".to_owned(),
            weight: 3,
        },
    ])
    .expect("valid lanes");
    config.routes.push(route);
    let gate = spawn_gate(config).await;
    let vip = queuegate::lane_grant::Lane::new("vip").unwrap();
    let token = queuegate::lane_grant::sign_invite(&ring("k1"), "gated", &vip, now_s() + 3600, 0);
    let shots = e2e.join("screenshots-out");
    let args = vec![gate.url(""), token, shots.display().to_string()];
    run_script(&e2e, "invite.mjs", args, INVITE_CHECKS).await;
    assert_screenshots(&shots, "invite");
    gate.stop().await.unwrap();
}

/// Every check the opening script reports, in order.
const OPENING_CHECKS: &[&str] = &[
    "ok - B sees the countdown page",
    "ok - B's page says it opens soon",
    "ok - B's page shows the time left",
    "ok - B's countdown counts down",
    "ok - K sees the countdown page",
    "ok - K's page is in Korean",
    "ok - at the opening one of them is let in",
    "ok - the other's page turns into the waiting page at place 1",
    "ok - the first one leaves",
    "ok - the other moves on when admitted",
    "opening: all checks passed",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_countdown_page_counts_down_and_turns_into_the_waiting_page_at_the_opening() {
    let e2e = e2e_dir();
    let origin = html_origin().await;
    let mut config = proxy_config(&origin.url());
    let mut route = gated();
    // Whole seconds, at least 8 s ahead: time to open two pages first.
    route.opens_at = queuegate::config::Timestamp::from_unix_s(now_s() + 9);
    config.routes.push(route);
    let gate = spawn_gate(config).await;
    let shots = e2e.join("screenshots-out");
    let args = vec![gate.url(""), shots.display().to_string()];
    run_script(&e2e, "opening.mjs", args, OPENING_CHECKS).await;
    assert_screenshots(&shots, "opening");
    gate.stop().await.unwrap();
}

/// Every check the event stream script reports, in order.
const EVENTS_CHECKS: &[&str] = &[
    "ok - A is admitted and sees the origin",
    "ok - B lands on the waiting page",
    "ok - B opens the event stream",
    "ok - B does not poll while the stream is open",
    "ok - A leaves",
    "ok - B is back at /gated/b?x=1",
    "ok - B asked status once, when admitted",
    "ok - C tried the event stream",
    "ok - C falls back to polling",
    "ok - C reaches the origin by polling",
    "ok - no Content-Security-Policy violations",
    "events: all checks passed",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_follows_the_event_stream_and_polls_when_it_is_blocked() {
    let e2e = e2e_dir();
    let origin = html_origin().await;
    let mut config = proxy_config(&origin.url());
    config.routes.push(gated());
    let gate = spawn_gate(config).await;
    run_script(&e2e, "events.mjs", vec![gate.url("")], EVENTS_CHECKS).await;
    gate.stop().await.unwrap();
}

/// Every check the live view script reports, in order.
const LIVE_CHECKS: &[&str] = &[
    "ok - the route appears",
    "ok - active / capacity show",
    "ok - nobody waits",
    "ok - the mode shows, no override",
    "ok - figures the route does not have are hidden",
    "ok - A is admitted",
    "ok - B waits",
    "ok - the waiting count follows B joining within 2 s",
    "ok - A is counted active",
    "ok - the waiting count follows B leaving within 2 s",
    "ok - the chart draws the line length",
    "ok - the chart draws the capacity",
    "ok - a page opened late draws the earlier samples",
    "ok - the controls ask for the token",
    "ok - no token in the address",
    "ok - a wrong token is refused",
    "ok - the route stays open",
    "ok - the token is kept in this tab only",
    "ok - the route shows as closed by an override",
    "ok - the next visitor gets the closed answer",
    "ok - nothing wider than a phone",
    "ok - no Content-Security-Policy violations",
    "live: all checks passed",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_follows_the_line_and_closes_the_route_with_the_token() {
    let e2e = e2e_dir();
    let origin = html_origin().await;
    let mut config = proxy_config(&origin.url());
    config.routes.push(gated());
    let token = "the-admin-token-of-the-live-view-test";
    std::env::set_var("QG_TEST_BROWSER_ADMIN_TOKEN", token);
    config.admin = Some(queuegate::config::Admin {
        addr: "127.0.0.1:0".parse().unwrap(),
        tokens: vec![queuegate::config::KeySource {
            id: "ops".into(),
            from: queuegate::config::KeyFrom::Env("QG_TEST_BROWSER_ADMIN_TOKEN".into()),
        }],
    });
    let gate = spawn_gate_opts(config, ring("k1"), Default::default()).await;
    let shots = e2e.join("screenshots-out");
    std::fs::create_dir_all(&shots).unwrap();
    let args = vec![
        gate.url(""),
        gate.admin_url(""),
        token.to_owned(),
        shots.display().to_string(),
    ];
    run_script(&e2e, "live.mjs", args, LIVE_CHECKS).await;
    for width in ["1280", "390"] {
        let file = shots.join(format!("live-{width}.png"));
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            bytes.starts_with(b"\x89PNG"),
            "{} is not a PNG",
            file.display()
        );
    }
    gate.stop().await.unwrap();
}
