//! The `queuegate` binary as operators run it: `check`, `keygen`, and `run`
//! draining on SIGTERM.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn sigterm_lets_an_in_flight_request_finish_then_exits_0() {
    let origin = spawn_origin(|_req| async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        Response::new(full("finished"))
    })
    .await;
    let port = free_port();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    write!(
        file,
        "listen: [{{ addr: \"127.0.0.1:{port}\" }}]\nadmin: {{ addr: \"127.0.0.1:0\" }}\n\
         upstream: {{ url: \"{}\" }}\nkeys: [{{ id: k1, env: QG_TEST_KEY }}]\n",
        origin.url()
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "-c"])
        .arg(file.path())
        .env("QG_TEST_KEY", queuegate::admission::keygen())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let mut up = false;
    for _ in 0..500 {
        if tokio::net::TcpStream::connect(&addr).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(up, "queuegate did not start listening");
    let url = format!("http://{addr}/slow");
    let in_flight = tokio::spawn(async move { get(&url).await });
    eventually("the request reaches the origin", || origin.accepted() == 1).await;
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let (parts, body) = in_flight.await.unwrap();
    assert_eq!(parts.status, http::StatusCode::OK);
    assert_eq!(body, "finished");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}
