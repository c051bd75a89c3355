//! Route overrides (DESIGN §9.4) across instances: two `queuegate`
//! processes on one real Redis. An override made on one is followed by the
//! other; clearing it restores the file's values; a config change to an
//! overridden field drops that field, in the store too.

mod common;

use common::*;
use http::{Method, StatusCode};

/// Waits until `at` shows route `tickets` with `mode` and `capacity`.
async fn shows(at: &Instance, mode: &str, capacity: u64) -> serde_json::Value {
    let routes = at.process.admin_url("/routes");
    let mut last = serde_json::Value::Null;
    for _ in 0..200 {
        last = admin_route(&routes, "tickets").await;
        if last["mode"] == mode && last["capacity"] == capacity {
            return last;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("tickets never showed {mode} / {capacity}: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_on_one_instance_is_followed_by_the_other_until_cleared_or_the_file_changes() {
    let file = RouteYaml::tickets(1);
    let (redis, _origin, instances) = fleet(RedisServer::start(), &file, 2).await;
    let (a, b) = (&instances[0], &instances[1]);
    let control = |at: &Instance| at.process.admin_url("/routes/tickets/override");

    // Closed with a capacity of 5 on A: B follows.
    let (status, json) = admin_call(
        Method::PUT,
        &control(a),
        Some(ADMIN_TOKEN),
        r#"{"mode":"closed","capacity":5}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let route = shows(b, "closed", 5).await;
    assert_eq!(route["override"]["by"], "admin", "{route}");
    assert_eq!(route["file"]["capacity"], 1, "{route}");
    let mut v = Visitor::new();
    let answer = v.fetch(&b.url("/tickets")).await;
    assert_eq!(answer.json()["state"], "closed", "B closes: {answer:?}");
    b.process
        .wait_for_log("B logs the override it follows", "following the override")
        .await;

    // Cleared on B: both are the file's again.
    let (status, json) = admin_call(Method::DELETE, &control(b), Some(ADMIN_TOKEN), "").await;
    assert_eq!(status, StatusCode::OK, "{json}");
    for at in [a, b] {
        let route = shows(at, "gate", 1).await;
        assert_eq!(route["override"], serde_json::Value::Null, "{route}");
    }
    assert!(Visitor::new()
        .navigate(&a.url("/tickets"))
        .await
        .reached_origin());

    // Queue everyone, and room for 5: then the file's capacity changes to 3.
    let (status, json) = admin_call(
        Method::PUT,
        &control(b),
        Some(ADMIN_TOKEN),
        r#"{"mode":"queue_all","capacity":5}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    shows(a, "queue_all", 5).await;
    let changed = file.with("capacity", 3);
    for at in [a, b] {
        at.rewrite(&changed);
    }
    for at in [a, b] {
        // The capacity is the file's again; the mode override still holds.
        let route = shows(at, "queue_all", 3).await;
        assert!(route["override"]["capacity"].is_null(), "{route}");
        assert_eq!(route["override"]["mode"]["value"], "queue_all", "{route}");
    }
    let mut con = redis.connection();
    let mut stored: Option<String> = None;
    for _ in 0..200 {
        stored = redis::cmd("GET")
            .arg("qg:{tickets}:override")
            .query(&mut con)
            .unwrap();
        if stored.as_deref().is_some_and(|s| !s.contains("capacity")) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let stored = stored.expect("the mode override is still in the store");
    assert!(
        !stored.contains("capacity"),
        "dropped in the store: {stored}"
    );
    assert!(stored.contains("queue_all"), "{stored}");
}
