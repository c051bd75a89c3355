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
