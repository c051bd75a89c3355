//! The waiting room in a real browser: queuegate runs in-process in front of
//! an HTML origin with a capacity-1 route `/gated`, and
//! `tests/e2e/waiting_room.mjs` drives Debian's Chromium through it with
//! playwright-core (`npm ci` in `tests/e2e`; `./scripts/test` does it).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use http::{Request, Response};
use hyper::body::Incoming;

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
    let e2e = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e");
    assert!(
        e2e.join("node_modules/playwright-core").is_dir(),
        "playwright-core is not installed: run `npm ci` in tests/e2e (./scripts/test does)"
    );
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "/usr/bin/chromium is missing: apt-get install chromium"
    );

    let origin = spawn_origin(|req: Request<Incoming>| async move {
        let path = req.uri().to_string();
        let mut resp = Response::new(full(format!(
            "<!doctype html><title>Origin</title><h1>The origin</h1><p id=\"path\">{path}</p>"
        )));
        resp.headers_mut()
            .insert("content-type", "text/html; charset=utf-8".parse().unwrap());
        resp
    })
    .await;
    let mut config = proxy_config(&origin.url());
    let mut gated = route("gated", "/gated", 1);
    gated.tick = Duration::from_millis(100);
    // Long enough that a waiter whose network is cut for 10 s keeps its place.
    gated.abandon_after = Duration::from_secs(60);
    config.routes.push(gated);
    let gate = spawn_gate(config).await;

    let shots = e2e.join("screenshots-out");
    let base = gate.url("");
    let script_dir = e2e.clone();
    let shots_arg = shots.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("node")
            .arg("waiting_room.mjs")
            .arg(&base)
            .arg(&shots_arg)
            .current_dir(&script_dir)
            .output()
    })
    .await
    .unwrap()
    .expect("node runs (apt-get install nodejs)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "browser test failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let mut at = 0;
    for check in CHECKS {
        match lines[at..].iter().position(|l| l == check) {
            Some(i) => at += i + 1,
            None => panic!("missing or out of order: {check:?}\n{stdout}"),
        }
    }
    assert!(!stdout.contains("not ok"), "{stdout}");
    for name in ["en-desktop", "en-360", "ko-desktop", "ko-360"] {
        let file = shots.join(format!("waiting-{name}.png"));
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            bytes.starts_with(b"\x89PNG"),
            "{} is not a PNG",
            file.display()
        );
    }
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
    let e2e = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e");
    assert!(
        e2e.join("node_modules/playwright-core").is_dir(),
        "playwright-core is not installed: run `npm ci` in tests/e2e (./scripts/test does)"
    );
    let origin = spawn_origin(|req: Request<Incoming>| async move {
        let path = req.uri().to_string();
        let mut resp = Response::new(full(format!(
            "<!doctype html><title>Origin</title><p id=\"path\">{path}</p>"
        )));
        resp.headers_mut()
            .insert("content-type", "text/html; charset=utf-8".parse().unwrap());
        resp
    })
    .await;
    let mut config = proxy_config(&origin.url());
    let mut gated = route("gated", "/gated", 1);
    gated.tick = Duration::from_millis(100);
    gated.abandon_after = Duration::from_secs(60);
    gated.lanes = vec![
        queuegate::config::Lane::main(),
        queuegate::config::Lane {
            name: "vip".to_owned(),
            weight: 3,
        },
    ];
    config.routes.push(gated);
    let gate = spawn_gate(config).await;
    let vip = queuegate::lane_grant::Lane::new("vip").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = queuegate::lane_grant::sign_invite(&ring("k1"), "gated", &vip, now + 3600, 0);

    let shots = e2e.join("screenshots-out");
    let base = gate.url("");
    let shots_arg = shots.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("node")
            .arg("invite.mjs")
            .arg(&base)
            .arg(&token)
            .arg(&shots_arg)
            .current_dir(&e2e)
            .output()
    })
    .await
    .unwrap()
    .expect("node runs (apt-get install nodejs)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "browser test failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let mut at = 0;
    for check in INVITE_CHECKS {
        match lines[at..].iter().position(|l| l == check) {
            Some(i) => at += i + 1,
            None => panic!("missing or out of order: {check:?}\n{stdout}"),
        }
    }
    for name in ["en-desktop", "en-360", "ko-desktop", "ko-360"] {
        let file = shots.join(format!("invite-{name}.png"));
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            bytes.starts_with(b"\x89PNG"),
            "{} is not a PNG",
            file.display()
        );
    }
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
    let e2e = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e");
    assert!(
        e2e.join("node_modules/playwright-core").is_dir(),
        "playwright-core is not installed: run `npm ci` in tests/e2e (./scripts/test does)"
    );
    let origin = spawn_origin(|req: Request<Incoming>| async move {
        let path = req.uri().to_string();
        let mut resp = Response::new(full(format!(
            "<!doctype html><title>Origin</title><p id=\"path\">{path}</p>"
        )));
        resp.headers_mut()
            .insert("content-type", "text/html; charset=utf-8".parse().unwrap());
        resp
    })
    .await;
    let mut config = proxy_config(&origin.url());
    let mut gated = route("gated", "/gated", 1);
    gated.tick = Duration::from_millis(100);
    gated.abandon_after = Duration::from_secs(60);
    config.routes.push(gated);
    let gate = spawn_gate(config).await;

    let base = gate.url("");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("node")
            .arg("events.mjs")
            .arg(&base)
            .current_dir(&e2e)
            .output()
    })
    .await
    .unwrap()
    .expect("node runs (apt-get install nodejs)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "browser test failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let mut at = 0;
    for check in EVENTS_CHECKS {
        match lines[at..].iter().position(|l| l == check) {
            Some(i) => at += i + 1,
            None => panic!("missing or out of order: {check:?}\n{stdout}"),
        }
    }
    gate.stop().await.unwrap();
}
