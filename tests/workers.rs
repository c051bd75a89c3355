//! Worker threads: each serves its connections start to end, and they all
//! end with the server. The only test in its binary, so the threads it
//! counts are its own gate's.

mod common;

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};

/// The names of this process's threads that serve connections.
fn worker_threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .filter(|name| name.starts_with("qg-worker-"))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn worker_threads_serve_concurrent_connections_and_end_with_the_server() {
    let origin = spawn_origin(|req: Request<hyper::body::Incoming>| async move {
        Response::new(full(req.uri().path().to_string()))
    })
    .await;
    let mut config = proxy_config(&origin.url());
    config.limits.workers = Some(3);
    let gate = spawn_gate(config).await;
    eventually("three worker threads", || worker_threads().len() == 3).await;
    assert_eq!(
        worker_threads(),
        ["qg-worker-0", "qg-worker-1", "qg-worker-2"]
    );

    // 24 clients, each on its own keep-alive connection, 10 requests each.
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..24 {
        let url = gate.url("");
        clients.spawn(async move {
            let client = client::<Full<Bytes>>();
            for r in 0..10 {
                let path = format!("/c{c}/r{r}");
                let resp = client
                    .get(format!("{url}{path}").parse().unwrap())
                    .await
                    .unwrap();
                assert_eq!(resp.status(), StatusCode::OK);
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(body, path.as_bytes());
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done.unwrap();
    }

    gate.stop().await.unwrap();
    assert!(
        worker_threads().is_empty(),
        "worker threads left after the server returned: {:?}",
        worker_threads()
    );
}
