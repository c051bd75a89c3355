//! The `queuegate` binary as operators run it: `check`, `keygen`, and `run`
//! draining on SIGTERM.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::*;
use http::Response;

const BIN: &str = env!("CARGO_BIN_EXE_queuegate");

#[test]
fn check_accepts_the_example_config() {
    let out = Command::new(BIN)
        .args(["check", "-c", "deploy/queuegate.yaml"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
}

#[test]
fn check_names_every_bad_field_and_exits_64() {
    let out = Command::new(BIN)
        .args(["check", "-c", "tests/fixtures/config/bad/two_problems.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("routes[0].colour"), "{stderr}");
    assert!(stderr.contains("routes[1].capacity"), "{stderr}");
    let missing = Command::new(BIN)
        .args(["check", "-c", "/nonexistent/queuegate.yaml"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(64));
}

/// Runs `queuegate check` on `config` with its key set; returns how it
/// ended, its stdout and its stderr.
fn check(config: &str) -> (std::process::ExitStatus, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queuegate.yaml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(BIN)
        .args(["check", "-c"])
        .arg(&path)
        .env("QG_TEST_KEY", queuegate::admission::keygen())
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_warns_about_a_host_route_without_allowed_hosts_and_exits_0() {
    let base = "listen: [{ addr: \"127.0.0.1:0\" }]\n\
                upstream: { url: \"http://127.0.0.1:9\" }\n\
                keys: [{ id: k1, env: QG_TEST_KEY }]\n";
    let routes = "routes:\n  - name: shop\n    match: { host: shop.example }\n    capacity: 1\n";
    let (status, stdout, stderr) = check(&format!("{base}{routes}"));
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("ok"), "{stdout}");
    let warning = stderr
        .lines()
        .find(|line| line.starts_with("warning: routes[0].match.host (line 6): "))
        .unwrap_or_else(|| panic!("no warning naming the field: {stderr}"));
    assert!(warning.contains("limits.allowed_hosts"), "{warning}");
    assert!(warning.contains("HTTP/1.0"), "{warning}");

    let (status, _, stderr) = check(&format!(
        "{base}limits: {{ allowed_hosts: [shop.example] }}\n{routes}"
    ));
    assert!(status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
}

#[test]
fn keygen_prints_a_fresh_key_each_time() {
    let one = Command::new(BIN).arg("keygen").output().unwrap();
    let two = Command::new(BIN).arg("keygen").output().unwrap();
    let one = String::from_utf8(one.stdout).unwrap();
    let two = String::from_utf8(two.stdout).unwrap();
    assert_eq!(one.trim().len(), 43, "32 bytes, base64url without padding");
    assert_ne!(one, two);
}

#[test]
fn run_refuses_to_start_without_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queuegate.yaml");
    std::fs::write(
        &path,
        "listen: [{ addr: \"127.0.0.1:0\" }]\nadmin: { addr: \"127.0.0.1:0\" }\n\
         upstream: { url: \"http://127.0.0.1:9\" }\nkeys: [{ id: k1, env: QG_TEST_KEY_NOT_SET }]\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["run", "-c"])
        .arg(&path)
        .env_remove("QG_TEST_KEY_NOT_SET")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("QG_TEST_KEY_NOT_SET"), "{stderr}");
}

/// Runs `queuegate run` on `config` (with its key set and logging off) from
/// `sh`, after the shell command `before`, and returns how it ended and its
/// stderr.
fn run_failing(config: &str, before: &str) -> (std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queuegate.yaml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("{before}\nexec \"$0\" run -c \"$1\""))
        .arg(BIN)
        .arg(&path)
        .env("QG_TEST_KEY", queuegate::admission::keygen())
        .env("QUEUEGATE_LOG", "off")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn worker_threads_that_cannot_start_fail_the_run_with_one_line() {
    // With 64 file descriptors, a few of the 1024 workers start (each needs
    // an event loop and its own handle on the listener) and then one
    // cannot.
    let config = "listen: [{ addr: \"127.0.0.1:0\" }]\nadmin: { addr: \"127.0.0.1:0\" }\n\
                  limits: { workers: 1024 }\n\
                  upstream: { url: \"http://127.0.0.1:9\" }\nkeys: [{ id: k1, env: QG_TEST_KEY }]\n";
    let (status, stderr) = run_failing(config, "ulimit -n 64");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: cannot start worker thread "),
        "{stderr}"
    );
    assert!(stderr.contains(" of 1024: "), "{stderr}");
    assert!(
        stderr.contains("(os error 24)"),
        "too many open files: {stderr}"
    );
}

#[test]
fn a_listen_address_in_use_fails_the_run_with_one_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let config = format!(
        "listen: [{{ addr: \"{addr}\" }}]\nadmin: {{ addr: \"127.0.0.1:0\" }}\n\
         upstream: {{ url: \"http://127.0.0.1:9\" }}\nkeys: [{{ id: k1, env: QG_TEST_KEY }}]\n"
    );
    let (status, stderr) = run_failing(&config, "");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: cannot listen on {addr}: ")),
        "{stderr}"
    );
}

#[tokio::test]
async fn sigterm_lets_an_in_flight_request_finish_then_exits_0() {
    // The origin holds the request until the drain has begun.
    let release = Arc::new(tokio::sync::Notify::new());
    let held = release.clone();
    let origin = spawn_origin(move |_req| {
        let held = held.clone();
        async move {
            held.notified().await;
            Response::new(full("finished"))
        }
    })
    .await;
    let mut file = tempfile::NamedTempFile::new().unwrap();
    write!(
        file,
        "listen: [{{ addr: \"127.0.0.1:0\" }}]\nadmin: {{ addr: \"127.0.0.1:0\" }}\n\
         upstream: {{ url: \"{}\" }}\nkeys: [{{ id: k1, env: QG_TEST_KEY }}]\n",
        origin.url()
    )
    .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "-c"])
        .arg(file.path())
        .env("QG_TEST_KEY", queuegate::admission::keygen())
        .stdout(Stdio::null());
    let mut child = Process::start(cmd, true).await;
    let url = child.url("/slow");
    let in_flight = tokio::spawn(async move { get(&url).await });
    eventually("the request reaches the origin", || origin.accepted() == 1).await;
    child.signal("TERM");
    child
        .wait_for_log("the drain starts", "no longer accepting")
        .await;
    assert!(
        !in_flight.is_finished(),
        "the request ended before the drain"
    );
    release.notify_one();
    let (parts, body) = in_flight.await.unwrap();
    assert_eq!(parts.status, http::StatusCode::OK);
    assert_eq!(body, "finished");
    let (status, log) = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "{log}");
}

#[test]
fn check_names_a_snapshot_it_cannot_write() {
    let base = "listen: [{ addr: \"127.0.0.1:0\" }]\n\
                upstream: { url: \"http://127.0.0.1:9\" }\n\
                keys: [{ id: k1, env: QG_TEST_KEY }]\n";
    let (status, _, stderr) = check(&format!(
        "{base}store: {{ memory: {{ snapshot: /nonexistent/queuegate/line.json }} }}\n"
    ));
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("store.memory.snapshot"), "{stderr}");
    assert!(
        stderr.contains("directory /nonexistent/queuegate does not exist"),
        "{stderr}"
    );
    let (status, _, stderr) = check(&format!(
        "{base}store: {{ backend: redis, memory: {{ snapshot: /tmp/line.json }} }}\n"
    ));
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("store.memory.snapshot"), "{stderr}");
    assert!(
        stderr.contains("only used with backend: memory"),
        "{stderr}"
    );
    let (status, _, stderr) = check(&format!(
        "{base}store: {{ memory: {{ snapshot: /tmp/queuegate-line.json }} }}\n"
    ));
    assert!(status.success(), "{stderr}");
}

#[test]
fn a_snapshot_that_is_not_one_fails_the_run_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("line.json");
    std::fs::write(&snapshot, "{\"version\": 1, \"routes\": 7}").unwrap();
    let config = format!(
        "listen: [{{ addr: \"127.0.0.1:0\" }}]\nadmin: {{ addr: \"127.0.0.1:0\" }}\n\
         upstream: {{ url: \"http://127.0.0.1:9\" }}\nkeys: [{{ id: k1, env: QG_TEST_KEY }}]\n\
         store: {{ memory: {{ snapshot: \"{}\" }} }}\n",
        snapshot.display()
    );
    let (status, stderr) = run_failing(&config, "");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: store.memory.snapshot: the snapshot "),
        "{stderr}"
    );
    assert!(stderr.contains("move the file aside"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&snapshot).unwrap(),
        "{\"version\": 1, \"routes\": 7}",
        "the file is left as it was"
    );
}

const STATUS: &str = "/__queuegate/status?route=tickets";

#[tokio::test]
async fn a_restart_on_a_snapshot_keeps_the_line() {
    let (origin, hits) = counting_origin().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("queuegate.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: [{{ addr: \"127.0.0.1:0\" }}]\nadmin: {{ addr: \"127.0.0.1:0\" }}\n\
             upstream: {{ url: \"{}\" }}\nkeys: [{{ id: k1, env: QG_TEST_KEY }}]\n\
             store: {{ memory: {{ snapshot: \"{}\" }} }}\n\
             routes: [{{ name: tickets, match: {{ path_prefix: /tickets }}, capacity: 1 }}]\n",
            origin.url(),
            dir.path().join("line.json").display()
        ),
    )
    .unwrap();
    let key = queuegate::admission::keygen();
    let start = || {
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "-c"])
            .arg(&config)
            .env("QG_TEST_KEY", &key)
            .stdout(Stdio::null());
        Process::start(cmd, true)
    };
    let child = start().await;
    let mut inside = Visitor::new();
    assert!(inside
        .navigate(&child.url("/tickets"))
        .await
        .reached_origin());
    assert!(inside
        .navigate(&child.url("/tickets"))
        .await
        .reached_origin());
    let mut waiting = [Visitor::new(), Visitor::new()];
    for (i, w) in waiting.iter_mut().enumerate() {
        let a = w.navigate(&child.url("/tickets")).await;
        assert_eq!(a.status, http::StatusCode::FOUND, "{a:?}");
        let status = w.fetch(&child.url(STATUS)).await.json();
        assert_eq!(status["position"], i + 1, "{status}");
    }
    let (code, log) = tokio::task::spawn_blocking(move || child.stop())
        .await
        .unwrap();
    assert_eq!(code, 0, "{log}");
    assert!(
        log.contains("memory store written to its snapshot"),
        "{log}"
    );

    // A newcomer first: the restarted gate knows the room is full and who
    // waits ahead.
    let child = start().await;
    let mut late = Visitor::new();
    assert_eq!(
        late.navigate(&child.url("/tickets")).await.status,
        http::StatusCode::FOUND
    );
    let status = late.fetch(&child.url(STATUS)).await.json();
    assert_eq!(status["position"], 3, "a newcomer joins behind: {status}");
    let before = hits.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        inside
            .navigate(&child.url("/tickets"))
            .await
            .reached_origin(),
        "the session was kept"
    );
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), before + 1);
    for (i, w) in waiting.iter_mut().enumerate() {
        let status = w.fetch(&child.url(STATUS)).await.json();
        assert_eq!(status["state"], "waiting", "{status}");
        assert_eq!(status["position"], i + 1, "the place was kept: {status}");
    }
}
