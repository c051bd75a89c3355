//! The transparent proxy: what reaches the origin and the client, streaming,
//! upgrades, pooling, and the gate's own answers when the origin fails.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the recording origin saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    method: Method,
    version: http::Version,
    target: String,
    headers: HeaderMap,
    body: Bytes,
}

async fn recording_origin() -> (Origin, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let origin = spawn_origin(move |req: Request<hyper::body::Incoming>| {
        let log = log.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            log.lock().unwrap().push(Seen {
                method: parts.method,
                version: parts.version,
                target: parts.uri.to_string(),
                headers: parts.headers,
                body: body.clone(),
            });
            let mut resp = Response::new(full(body));
            resp.headers_mut()
                .insert("connection", "x-origin-private".parse().unwrap());
            resp.headers_mut()
                .insert("x-origin-private", "secret".parse().unwrap());
            resp.headers_mut()
                .insert("keep-alive", "timeout=5".parse().unwrap());
            resp.headers_mut().insert("x-app", "kept".parse().unwrap());
            resp
        }
    })
    .await;
    (origin, seen)
}

#[tokio::test]
async fn every_method_with_a_body_arrives_intact() {
    let (origin, seen) = recording_origin().await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "REPORT"] {
        let body = format!("{method} body \u{1F600}");
        let req = Request::builder()
            .method(method)
            .uri(gate.url("/echo"))
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap();
        let (parts, answer) = send(req).await;
        assert_eq!(parts.status, StatusCode::OK, "{method}");
        assert_eq!(answer, body.as_bytes(), "{method}: body echoed back");
        let last = seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(last.method.as_str(), method);
        assert_eq!(
            last.body,
            body.as_bytes(),
            "{method}: body reached the origin"
        );
    }
}

#[tokio::test]
async fn target_host_and_forwarded_headers_are_kept() {
    let (origin, seen) = recording_origin().await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let target = "/a%20b/%7Euser/c;p=1?x=%2F&y=%E2%82%AC&y=2&empty=";
    let req = Request::get(gate.url(target))
        .header("host", "shop.example:8443")
        .header("x-forwarded-for", "203.0.113.7")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (parts, _) = send(req).await;
    assert_eq!(parts.status, StatusCode::OK);
    let seen = seen.lock().unwrap()[0].clone();
    assert_eq!(
        seen.target, target,
        "request target forwarded byte for byte"
    );
    assert_eq!(seen.headers["host"], "shop.example:8443");
    // The peer is no trusted proxy: what it says of others is not passed on.
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen.headers["x-real-ip"], "127.0.0.1");
    assert_eq!(seen.headers["x-forwarded-host"], "shop.example:8443");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
}

#[tokio::test]
async fn a_trusted_proxy_s_forwarding_headers_are_kept() {
    let (origin, seen) = recording_origin().await;
    let mut config = proxy_config(&origin.url());
    config.client_ip.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
    let gate = spawn_gate(config).await;
    let req = Request::get(gate.url("/"))
        .header("host", "internal:8080")
        .header("x-forwarded-for", "198.51.100.1, 203.0.113.7")
        .header("x-forwarded-host", "shop.example")
        .header("x-forwarded-proto", "https")
        .header("forwarded", "for=203.0.113.7;proto=https")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (parts, _) = send(req).await;
    assert_eq!(parts.status, StatusCode::OK);
    let seen = seen.lock().unwrap()[0].clone();
    assert_eq!(
        seen.headers["x-forwarded-for"],
        "198.51.100.1, 203.0.113.7, 127.0.0.1"
    );
    assert_eq!(seen.headers["x-real-ip"], "203.0.113.7");
    assert_eq!(seen.headers["x-forwarded-host"], "shop.example");
    assert_eq!(seen.headers["x-forwarded-proto"], "https");
    assert_eq!(seen.headers["forwarded"], "for=203.0.113.7;proto=https");
}

#[tokio::test]
async fn hop_by_hop_headers_reach_neither_side() {
    let (origin, seen) = recording_origin().await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let req = Request::get(gate.url("/"))
        .header("connection", "x-client-private, X-Forwarded-For")
        .header("x-client-private", "secret")
        .header("keep-alive", "timeout=5")
        .header("te", "trailers")
        .header("proxy-connection", "keep-alive")
        .header("x-app", "kept")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (parts, _) = send(req).await;
    let at_origin = seen.lock().unwrap()[0].headers.clone();
    for name in ["x-client-private", "keep-alive", "te", "proxy-connection"] {
        assert!(at_origin.get(name).is_none(), "{name} reached the origin");
    }
    assert_eq!(at_origin["x-app"], "kept");
    assert_eq!(
        at_origin["x-forwarded-for"], "127.0.0.1",
        "Connection cannot remove X-Forwarded-For"
    );
    for name in ["x-origin-private", "keep-alive"] {
        assert!(
            parts.headers.get(name).is_none(),
            "{name} reached the client"
        );
    }
    assert_eq!(parts.headers["x-app"], "kept");
}

#[tokio::test]
async fn a_large_download_is_streamed() {
    const TOTAL: usize = 100 * 1024 * 1024;
    const CHUNK: usize = 64 * 1024;
    let (first_seen_tx, first_seen_rx) = tokio::sync::oneshot::channel::<()>();
    let first_seen_rx = Arc::new(Mutex::new(Some(first_seen_rx)));
    let origin = spawn_origin(move |_req| {
        let gate_rx = first_seen_rx.lock().unwrap().take();
        async move {
            let (mut tx, body) =
                http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(4);
            tokio::spawn(async move {
                let chunk = Bytes::from(vec![7u8; CHUNK]);
                tx.send_data(chunk.clone()).await.unwrap();
                // The rest is sent only once the client has the first bytes:
                // a proxy that buffered the whole body would never see them.
                if let Some(rx) = gate_rx {
                    rx.await.unwrap();
                }
                for _ in 1..TOTAL / CHUNK {
                    if tx.send_data(chunk.clone()).await.is_err() {
                        return;
                    }
                }
            });
            Response::new(body.boxed())
        }
    })
    .await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let resp = client::<Full<Bytes>>()
        .get(gate.url("/big").parse().unwrap())
        .await
        .unwrap();
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(20), body.frame())
        .await
        .expect("first bytes must arrive before the origin sends the rest")
        .unwrap()
        .unwrap();
    let mut received = first.into_data().unwrap().len();
    first_seen_tx.send(()).unwrap();
    while let Some(frame) = body.frame().await {
        received += frame.unwrap().into_data().map(|d| d.len()).unwrap_or(0);
    }
    assert_eq!(received, TOTAL);
}

#[tokio::test]
async fn a_large_chunked_upload_is_streamed() {
    const TOTAL: usize = 100 * 1024 * 1024;
    const CHUNK: usize = 64 * 1024;
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    let first_tx = Arc::new(Mutex::new(Some(first_tx)));
    let origin = spawn_origin(move |req: Request<hyper::body::Incoming>| {
        let first_tx = first_tx.clone();
        async move {
            let mut body = req.into_body();
            let mut received = 0usize;
            while let Some(frame) = body.frame().await {
                let n = frame.unwrap().into_data().map(|d| d.len()).unwrap_or(0);
                if received == 0 && n > 0 {
                    if let Some(tx) = first_tx.lock().unwrap().take() {
                        let _ = tx.send(());
                    }
                }
                received += n;
            }
            Response::new(full(received.to_string()))
        }
    })
    .await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let (mut tx, body) =
        http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(4);
    let req = Request::post(gate.url("/upload")).body(body).unwrap();
    let response = tokio::spawn(client().request(req));
    let chunk = Bytes::from(vec![9u8; CHUNK]);
    tx.send_data(chunk.clone()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), first_rx)
        .await
        .expect("the origin must get the first bytes before the rest is sent")
        .unwrap();
    for _ in 1..TOTAL / CHUNK {
        tx.send_data(chunk.clone()).await.unwrap();
    }
    drop(tx);
    let resp = response.await.unwrap().unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, TOTAL.to_string().as_bytes());
}

#[tokio::test]
async fn websocket_echo_passes_through() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin_addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
                while let Some(Ok(msg)) = ws.next().await {
                    if msg.is_text() || msg.is_binary() {
                        ws.send(msg).await.unwrap();
                    }
                }
            });
        }
    });
    let gate = spawn_gate(proxy_config(&format!("http://{origin_addr}"))).await;
    let stream = TcpStream::connect(gate.addr).await.unwrap();
    let (mut ws, resp) =
        tokio_tungstenite::client_async(format!("ws://{}/socket", gate.addr), stream)
            .await
            .unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    for i in 0..5 {
        let text = format!("hello {i}");
        ws.send(tokio_tungstenite::tungstenite::Message::text(text.clone()))
            .await
            .unwrap();
        let echoed = ws.next().await.unwrap().unwrap();
        assert_eq!(echoed.into_text().unwrap().as_str(), text);
    }
    ws.close(None).await.unwrap();
}

#[tokio::test]
async fn sequential_requests_reuse_pooled_connections() {
    let origin = spawn_origin(|_req| async { Response::new(full("ok")) }).await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let client = client::<Full<Bytes>>();
    for _ in 0..200 {
        let resp = client.get(gate.url("/").parse().unwrap()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
    }
    assert!(
        origin.accepted() <= 4,
        "200 sequential requests opened {} upstream connections",
        origin.accepted()
    );
}

#[tokio::test]
async fn origin_down_is_502() {
    // A port bound but never listened on refuses connections, and stays
    // taken while `closed` lives: no other test's listener can get it.
    let closed = tokio::net::TcpSocket::new_v4().unwrap();
    closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = closed.local_addr().unwrap();
    let gate = spawn_gate(proxy_config(&format!("http://{addr}"))).await;
    let (parts, body) = get(&gate.url("/")).await;
    assert_eq!(parts.status, StatusCode::BAD_GATEWAY);
    assert_eq!(parts.headers["x-queuegate"], "upstream-error");
    assert!(!body.is_empty());
}

#[tokio::test]
async fn origin_slower_than_the_timeout_is_504() {
    let origin = spawn_origin(|_req| async {
        std::future::pending::<()>().await;
        Response::new(full("never"))
    })
    .await;
    let mut config = proxy_config(&origin.url());
    config.upstream.timeout = Duration::from_millis(300);
    let gate = spawn_gate(config).await;
    let (parts, _) = get(&gate.url("/slow")).await;
    assert_eq!(parts.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(parts.headers["x-queuegate"], "upstream-timeout");
}

#[tokio::test]
async fn origin_closing_mid_body_aborts_that_response_only() {
    let origin = spawn_raw_origin(|mut stream: TcpStream| async move {
        let mut buf = vec![0u8; 4096];
        let n = stream.read(&mut buf).await.unwrap_or(0);
        let head = String::from_utf8_lossy(&buf[..n]).to_string();
        if head.starts_with("GET /cut") {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\nonly ten..")
                .await;
            // Close without sending the rest.
        } else {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .await;
        }
    })
    .await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let resp = client::<Full<Bytes>>()
        .get(gate.url("/cut").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.into_body().collect().await.is_err(),
        "a cut body must reach the client as an aborted response"
    );
    let (parts, body) = get(&gate.url("/after")).await;
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(body, "ok");
}

async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).to_string()
}

#[tokio::test]
async fn ambiguous_framing_is_400_and_never_forwarded() {
    let (origin, seen) = recording_origin().await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let cases: [&[u8]; 5] = [
        b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
        b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\ncontent-length: 4\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
        b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: x\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
        b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
        b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd",
    ];
    for case in cases {
        let answer = raw_exchange(gate.addr, case).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "got {answer:?}");
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "the origin saw an ambiguous request"
    );

    // Pipelined on one connection: the clean request is served, the
    // ambiguous one behind it is refused and the connection closed.
    let pipelined = b"POST /clean HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok\
        POST /y HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n\
        GET /after HTTP/1.1\r\nHost: a\r\n\r\n";
    let answer = raw_exchange(gate.addr, pipelined).await;
    let heads: Vec<usize> = answer
        .match_indices("HTTP/1.1 ")
        .map(|(at, _)| at)
        .collect();
    assert_eq!(
        heads.len(),
        2,
        "two answers, none after the refusal: {answer:?}"
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "got {answer:?}");
    assert!(
        answer[heads[1]..].starts_with("HTTP/1.1 400"),
        "got {answer:?}"
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "only the clean request reaches the origin");
    assert_eq!(seen[0].target, "/clean");
}

#[tokio::test]
async fn oversize_headers_get_431() {
    let (origin, seen) = recording_origin().await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let big = "a".repeat(40_000);
    let request = format!("GET / HTTP/1.1\r\nHost: a\r\nx-big: {big}\r\n\r\n");
    let answer = raw_exchange(gate.addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "got {answer:?}");
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn http2_with_prior_knowledge_is_served() {
    let (origin, seen) = recording_origin().await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let resp = client
        .request(
            Request::post(gate.url("/h2?q=1"))
                .body(Full::new(Bytes::from("over h2")))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "over h2");
    let seen = seen.lock().unwrap()[0].clone();
    assert_eq!(seen.target, "/h2?q=1");
    assert_eq!(seen.headers["host"], gate.addr.to_string());
}

/// A request forwarded reaches the origin as HTTP/1.1 whatever the
/// client spoke: an HTTP/2 body of unknown length goes chunked, whole, and
/// an HTTP/1.0 request's line says HTTP/1.1.
#[tokio::test]
async fn requests_reach_the_origin_as_http11_with_their_whole_body() {
    let (origin, seen) = recording_origin().await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::StreamBody<_>>();
    let pieces = ["streamed ", "over ", "h2"]
        .map(|piece| Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from(piece))));
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(pieces));
    let resp = client
        .request(Request::post(gate.url("/h2-stream")).body(body).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let echoed = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(echoed, "streamed over h2");
    let last = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last.version, http::Version::HTTP_11);
    assert_eq!(last.body, "streamed over h2");
    let answer = raw_exchange(
        gate.addr,
        b"POST /old HTTP/1.0\r\nHost: a\r\nContent-Length: 3\r\n\r\nold",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    let last = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        (last.target.as_str(), last.version),
        ("/old", http::Version::HTTP_11)
    );
    assert_eq!(last.body, "old");
}

#[tokio::test]
async fn drain_lets_an_in_flight_request_finish() {
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
    let mut gate = spawn_gate(proxy_config(&origin.url())).await;
    let url = gate.url("/slow");
    let in_flight = tokio::spawn(async move { get(&url).await });
    eventually("the request reaches the origin", || origin.accepted() == 1).await;
    gate.start_drain();
    // The drain has begun once the listener no longer takes connections.
    let mut closed = false;
    for _ in 0..500 {
        if TcpStream::connect(gate.addr).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(closed, "the gate kept accepting after the drain started");
    assert!(
        !in_flight.is_finished(),
        "the request ended before the drain"
    );
    release.notify_one();
    let (parts, body) = in_flight.await.unwrap();
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(body, "finished");
    gate.stop().await.unwrap();
}

/// When a raw origin closes a keep-alive connection.
#[derive(Clone, Copy, PartialEq)]
enum Close {
    /// Right after its first answer.
    AfterAnswer,
    /// When the second request arrives, unanswered: the race a proxy loses
    /// when the origin's idle timeout ends the connection as it sends.
    OnNextRequest,
    /// Never (the answer may still say `Connection: close`).
    Never,
}

/// A raw origin that answers requests (without bodies) with `answer`,
/// closing connections as `close` says.
async fn answering_origin(answer: &'static [u8], close: Close) -> Origin {
    spawn_raw_origin(move |mut stream: TcpStream| async move {
        let mut buf = vec![0u8; 8192];
        let mut seen = Vec::new();
        let mut answered = 0;
        loop {
            let Ok(n) = stream.read(&mut buf).await else {
                return;
            };
            if n == 0 {
                return;
            }
            seen.extend_from_slice(&buf[..n]);
            while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                seen.drain(..end + 4);
                if answered == 1 && close == Close::OnNextRequest {
                    return;
                }
                if stream.write_all(answer).await.is_err() {
                    return;
                }
                answered += 1;
                if close == Close::AfterAnswer {
                    return;
                }
            }
        }
    })
    .await
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

#[tokio::test]
async fn an_idempotent_request_on_a_connection_the_origin_closed_is_sent_again() {
    let origin = answering_origin(OK, Close::OnNextRequest).await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let mut client = KeepAlive::connect(gate.addr).await;
    for i in 0..10 {
        let (status, head) = client.get(&format!("/{i}"), "").await;
        assert_eq!(status, StatusCode::OK, "request {i}: {head}");
    }
    // Every request after the first was written to a pooled connection,
    // found it closed, and was answered on a new one.
    assert_eq!(origin.accepted(), 10);
}

#[tokio::test]
async fn a_request_with_a_body_is_not_sent_again() {
    let origin = answering_origin(OK, Close::OnNextRequest).await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    // One client connection, so both requests meet the same worker's pool.
    let mut stream = TcpStream::connect(gate.addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut first = Vec::new();
    while !first.ends_with(b"ok") {
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the first answer");
        first.extend_from_slice(&buf[..n]);
    }
    stream
        .write_all(
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nConnection: close\r\n\r\nonce",
        )
        .await
        .unwrap();
    let mut second = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut second))
        .await
        .unwrap()
        .unwrap();
    let second = String::from_utf8_lossy(&second);
    assert!(second.starts_with("HTTP/1.1 502"), "{second}");
    assert_eq!(origin.accepted(), 1);
}

#[tokio::test]
async fn a_pooled_connection_the_origin_closed_right_away_is_replaced() {
    // Keep-alive by the headers, closed right after each answer: found
    // closed in the pool, or on sending, and replaced without a 502.
    let origin = answering_origin(OK, Close::AfterAnswer).await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let mut client = KeepAlive::connect(gate.addr).await;
    for i in 0..20 {
        let (status, head) = client.get(&format!("/{i}"), "").await;
        assert_eq!(status, StatusCode::OK, "request {i}: {head}");
    }
    assert_eq!(origin.accepted(), 20, "each request had a fresh connection");
}

#[tokio::test]
async fn a_pooled_connection_closed_while_idle_is_not_used() {
    let origin = answering_origin(OK, Close::AfterAnswer).await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let mut client = KeepAlive::connect(gate.addr).await;
    for i in 0..3 {
        let (status, head) = client.get("/", "").await;
        assert_eq!(status, StatusCode::OK, "request {i}: {head}");
        // The origin's close is seen while the connection sits in the pool.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(origin.accepted(), 3);
}

#[tokio::test]
async fn an_origin_answering_connection_close_is_not_reused() {
    // The origin keeps its socket open: only the header says it is done.
    // Reused, the next request would never be answered.
    let origin = answering_origin(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
        Close::Never,
    )
    .await;
    let mut config = proxy_config(&origin.url());
    config.upstream.timeout = Duration::from_secs(5);
    let gate = spawn_gate(config).await;
    let mut client = KeepAlive::connect(gate.addr).await;
    for i in 0..3 {
        let (status, head) = client.get("/", "").await;
        assert_eq!(status, StatusCode::OK, "request {i}: {head}");
        assert!(!head.contains("connection: close"), "{head}");
    }
    assert_eq!(origin.accepted(), 3);
}

#[tokio::test]
async fn a_body_the_client_abandoned_does_not_return_its_connection() {
    let origin = spawn_origin(|req: Request<hyper::body::Incoming>| async move {
        if req.uri().path() != "/big" {
            return Response::new(full("small"));
        }
        // Announces a megabyte, sends a first piece, then nothing more.
        let (mut tx, body) =
            http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(1);
        tokio::spawn(async move {
            let _ = tx.send_data(Bytes::from(vec![b'x'; 1024])).await;
            std::future::pending::<()>().await;
            drop(tx);
        });
        let mut resp = Response::new(body.boxed());
        resp.headers_mut()
            .insert("content-length", http::HeaderValue::from_static("1048576"));
        resp
    })
    .await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;

    let mut abandoning = TcpStream::connect(gate.addr).await.unwrap();
    abandoning
        .write_all(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 512];
    let n = abandoning.read(&mut first).await.unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"));
    drop(abandoning);

    // A reused connection would be mid-body: the answer would be the rest
    // of the megabyte, or nothing.
    let mut client = KeepAlive::connect(gate.addr).await;
    for _ in 0..3 {
        let (status, _) = client.get("/small", "").await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(
        origin.accepted(),
        2,
        "one for the abandoned body, one pooled"
    );
}

#[tokio::test]
async fn the_pool_never_churns_within_its_size() {
    let origin = spawn_origin(|_req| async { Response::new(full("ok")) }).await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    const CLIENTS: usize = 8;
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let addr = gate.addr;
        clients.spawn(async move {
            let mut client = KeepAlive::connect(addr).await;
            for _ in 0..100 {
                let (status, _) = client.get("/", "").await;
                assert_eq!(status, StatusCode::OK);
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done.unwrap();
    }
    assert!(
        origin.accepted() <= CLIENTS,
        "{CLIENTS} clients opened {} origin connections",
        origin.accepted()
    );
}

/// A raw origin that switches to `h2c` at once: it answers `101` to any
/// request asking for an upgrade (to every request when `always`), `200
/// ok` to the others, and keeps every byte it was sent.
async fn switching_origin(always: bool) -> (Origin, Arc<Mutex<Vec<u8>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let log = got.clone();
    let origin = spawn_raw_origin(move |mut stream: TcpStream| {
        let log = log.clone();
        async move {
            let mut buf = vec![0u8; 8192];
            let mut pending = Vec::new();
            let mut switched = false;
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    return;
                }
                log.lock().unwrap().extend_from_slice(&buf[..n]);
                if switched {
                    continue;
                }
                pending.extend_from_slice(&buf[..n]);
                while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
                    pending.drain(..end + 4);
                    let answer: &[u8] = if always || head.contains("\r\nupgrade:") {
                        switched = true;
                        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
                    } else {
                        OK
                    };
                    if stream.write_all(answer).await.is_err() || switched {
                        break;
                    }
                }
            }
        }
    })
    .await;
    (origin, got)
}

/// `/tickets` gated (capacity 1), `/static/` bypassed.
fn gated_config(origin: &Origin) -> queuegate::config::Config {
    let mut config = proxy_config(&origin.url());
    config.routes.push(route("tickets", "/tickets", 1));
    config
        .bypass
        .push(queuegate::config::BypassRule::PathPrefix("/static/".into()).into());
    config
}

/// The client's preface of HTTP/2 over the connection, then a request for
/// a gated path: what a client sends once an `h2c` upgrade has switched.
const H2_AFTER_SWITCH: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\
    \x00\x00\x00\x04\x00\x00\x00\x00\x00GET /tickets/1 HTTP/1.1\r\nHost: a\r\n\r\n";

/// DESIGN §9.5: only WebSocket upgrades are passed. An `h2c` upgrade is
/// forwarded as the plain request under it, so an origin that would switch
/// never does, and the connection stays queuegate's HTTP/1 (its framing
/// checks still on, DESIGN §8.4).
#[tokio::test]
async fn an_h2c_upgrade_is_forwarded_as_a_plain_request() {
    let (origin, got) = switching_origin(false).await;
    let gate = spawn_gate(gated_config(&origin)).await;
    for asks in [
        "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n",
        "Connection: upgrade\r\nUpgrade: h2c\r\n",
        "Connection: keep-alive, Upgrade\r\nUpgrade: h2c, foo/2\r\n",
    ] {
        got.lock().unwrap().clear();
        let mut client = KeepAlive::connect(gate.addr).await;
        let request = format!(
            "GET /static/x HTTP/1.1\r\nHost: a\r\n{asks}HTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
        );
        let (status, head) = client.send(request.as_bytes()).await;
        assert_eq!(status, StatusCode::OK, "{asks:?}: {head}");
        let seen = String::from_utf8_lossy(&got.lock().unwrap()).to_ascii_lowercase();
        assert!(seen.starts_with("get /static/x http/1.1\r\n"), "{seen}");
        assert!(!seen.contains("upgrade"), "{asks:?}: the origin saw {seen}");
        assert!(!seen.contains("http2-settings"), "{asks:?}: {seen}");
        assert!(!seen.contains("h2c"), "{asks:?}: {seen}");
        // Still HTTP/1 with its framing watched: a smuggling attempt next
        // on the connection is refused, not forwarded.
        let (status, head) = client
            .send(b"POST /static/y HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n")
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{head}");
        assert!(!String::from_utf8_lossy(&got.lock().unwrap()).contains("/static/y"));
    }
}

/// An origin that switches protocols when nobody asked it to (or to
/// anything but the WebSocket handshake queuegate forwarded) gets its
/// client a `502`, not a tunnel: what the client sends next never reaches
/// the origin, and the gated path it names stays gated.
#[tokio::test]
async fn a_switch_the_origin_was_not_asked_for_is_502_and_no_tunnel() {
    let (origin, got) = switching_origin(true).await;
    let gate = spawn_gate(gated_config(&origin)).await;
    for (what, asks) in [
        ("h2c", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"),
        ("nothing", ""),
        (
            "websocket",
            "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
        ),
    ] {
        got.lock().unwrap().clear();
        let mut client = KeepAlive::connect(gate.addr).await;
        let request = format!("GET /static/x HTTP/1.1\r\nHost: a\r\n{asks}\r\n");
        let (status, head) = client.send(request.as_bytes()).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{what}: {head}");
        assert!(head.contains("x-queuegate: upstream-error"), "{what}: {head}");
        let rest = client.finish(H2_AFTER_SWITCH).await;
        let rest = String::from_utf8_lossy(&rest);
        assert!(!rest.contains("HTTP/1.1 101"), "{what}: {rest}");
        let seen = String::from_utf8_lossy(&got.lock().unwrap()).into_owned();
        assert_eq!(
            seen.matches("HTTP/1.1\r\n").count(),
            1,
            "{what}: only the first request reached the origin: {seen:?}"
        );
        assert!(!seen.contains("PRI *"), "{what}: {seen:?}");
        assert!(!seen.contains("/tickets"), "{what}: {seen:?}");
    }
}

/// Chunked bodies hyper cannot read: a size that overflows, a size with a
/// `0x`, bare LF line ends, a quoted CRLF in a chunk extension.
const BAD_BODIES: [&str; 4] = [
    "fffffffffffffffff3\r\nabc\r\n0\r\n\r\n",
    "0x3\r\nabc\r\n0\r\n\r\n",
    "3\nabc\n0\n\n",
    "3;ext=\"a\r\nb\"\r\nabc\r\n0\r\n\r\n",
];

/// A request body that cannot be read is the client's error, found only
/// while the request is relayed to the origin: `400`, counted as a bad
/// request and not as the origin's failure, and the origin connection it
/// was relayed on is closed, never pooled.
#[tokio::test]
async fn a_malformed_request_body_is_the_client_s_400_not_an_upstream_error() {
    let origin = spawn_origin(|req: Request<hyper::body::Incoming>| async move {
        let read = req.into_body().collect().await.is_ok();
        Response::new(full(if read { "ok" } else { "cut" }))
    })
    .await;
    let mut config = gated_config(&origin);
    config.routes[0].capacity = 10;
    // One worker: one share of the pool, so the next request would meet a
    // connection put back.
    config.limits.workers = Some(1);
    let gate = spawn_gate_opts(config, ring("k1"), queuegate::RunOptions::default()).await;
    let mut visitor = Visitor::new();
    assert!(visitor
        .navigate(&gate.url("/tickets"))
        .await
        .reached_origin());
    let pass = format!("qg_tickets={}", visitor.cookie("qg_tickets").unwrap());
    let mut client = KeepAlive::connect(gate.addr).await;
    let mut refused = 0.0;
    for path in ["/static/upload", "/tickets/upload"] {
        for body in BAD_BODIES {
            let what = format!("{path} {body:?}");
            let (status, head) = client.get(path, &pass).await;
            assert_eq!(status, StatusCode::OK, "{what}: {head}");
            let before = origin.accepted();
            let mut bad = KeepAlive::connect(gate.addr).await;
            let request = format!(
                "POST {path} HTTP/1.1\r\nHost: a\r\nCookie: {pass}\r\n\
                 Transfer-Encoding: chunked\r\n\r\n{body}"
            );
            let (status, head) = bad.send(request.as_bytes()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {head}");
            assert!(head.contains("x-queuegate: bad-request"), "{what}: {head}");
            assert!(head.contains("connection: close"), "{what}: {head}");
            refused += 1.0;
            let (status, head) = client.get(path, &pass).await;
            assert_eq!(status, StatusCode::OK, "{what}: {head}");
            assert_eq!(
                origin.accepted(),
                before + 1,
                "{what}: the connection the body broke on was closed, and replaced"
            );
        }
    }
    let errors = r#"queuegate_upstream_errors_total{kind="error"}"#;
    assert_eq!(admin_sample(&gate, errors).await, 0.0);
    let bad = r#"queuegate_requests_total{decision="bad_request"}"#;
    assert_eq!(admin_sample(&gate, bad).await, refused);
}

/// queuegate's own fields are the origin's to give (DESIGN §8.5, §8.6):
/// sent by a client as request trailers they are removed like the headers
/// of those names, and the other trailers pass.
#[tokio::test]
async fn queuegate_s_own_fields_in_request_trailers_never_reach_the_origin() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let origin = spawn_origin(move |req: Request<hyper::body::Incoming>| {
        let log = log.clone();
        async move {
            let collected = req.into_body().collect().await.unwrap();
            let trailers = collected.trailers().cloned().unwrap_or_default();
            log.lock().unwrap().push((collected.to_bytes(), trailers));
            Response::new(full("ok"))
        }
    })
    .await;
    let gate = spawn_gate(gated_config(&origin)).await;
    let mut visitor = Visitor::new();
    assert!(visitor
        .navigate(&gate.url("/tickets"))
        .await
        .reached_origin());
    let pass = format!("qg_tickets={}", visitor.cookie("qg_tickets").unwrap());
    let mut client = KeepAlive::connect(gate.addr).await;
    for path in ["/static/upload", "/tickets/upload"] {
        seen.lock().unwrap().clear();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: a\r\nCookie: {pass}\r\nTransfer-Encoding: chunked\r\n\
             Trailer: Queuegate-Command, Queuegate-Lane, X-Checksum\r\n\r\n\
             3\r\nabc\r\n0\r\nQueuegate-Command: end-session\r\nqueuegate-lane: vip\r\n\
             X-Checksum: 42\r\n\r\n"
        );
        let (status, head) = client.send(request.as_bytes()).await;
        assert_eq!(status, StatusCode::OK, "{path}: {head}");
        let seen = seen.lock().unwrap();
        let (body, trailers) = &seen[0];
        assert_eq!(body, "abc", "{path}");
        assert_eq!(trailers["x-checksum"], "42", "{path}: {trailers:?}");
        assert!(
            !trailers.contains_key("queuegate-command"),
            "{path}: {trailers:?}"
        );
        assert!(
            !trailers.contains_key("queuegate-lane"),
            "{path}: {trailers:?}"
        );
    }
}

/// Reads from `stream` into `got` until `needle` has arrived.
async fn read_until(stream: &mut TcpStream, got: &mut Vec<u8>, needle: &[u8]) {
    let reading = async {
        let mut buf = [0u8; 4096];
        while !got.windows(needle.len()).any(|w| w == needle) {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before {:?}", String::from_utf8_lossy(needle));
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no {:?} in {:?}",
                String::from_utf8_lossy(needle),
                String::from_utf8_lossy(got)
            )
        });
}

/// A request pipelined while an answer streams (the engine then holds no
/// read buffer and looks at the socket through a small probe) is read
/// whole, head and body, longer than the probe, and answered after the
/// streaming answer ends.
#[tokio::test]
async fn a_request_pipelined_while_an_answer_streams_is_answered_after_it_whole() {
    let release = Arc::new(tokio::sync::Notify::new());
    let seen = Arc::new(Mutex::new(Vec::<(String, Bytes)>::new()));
    let (released, log) = (release.clone(), seen.clone());
    let origin = spawn_origin(move |req: Request<hyper::body::Incoming>| {
        let (released, log) = (released.clone(), log.clone());
        async move {
            let target = req.uri().to_string();
            let body = req.into_body().collect().await.unwrap().to_bytes();
            log.lock().unwrap().push((target.clone(), body.clone()));
            if target != "/stream" {
                let echo = format!("echo {}", String::from_utf8_lossy(&body));
                return Response::new(full(echo));
            }
            // One piece, then the second only once the test says so.
            let pieces = futures_util::stream::unfold(0, move |n| {
                let released = released.clone();
                async move {
                    let piece = match n {
                        0 => "one;",
                        1 => {
                            released.notified().await;
                            "two;"
                        }
                        _ => return None,
                    };
                    let frame = hyper::body::Frame::data(Bytes::from(piece));
                    Some((Ok::<_, std::convert::Infallible>(frame), n + 1))
                }
            });
            Response::new(BodyExt::boxed(http_body_util::StreamBody::new(pieces)))
        }
    })
    .await;
    let gate = spawn_gate(proxy_config(&origin.url())).await;
    let mut stream = TcpStream::connect(gate.addr).await.unwrap();
    stream
        .write_all(b"GET /stream HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    read_until(&mut stream, &mut got, b"one;").await;

    // The answer now waits for the origin: the next request arrives then.
    let body = "b".repeat(300);
    let next = format!(
        "POST /after HTTP/1.1\r\nHost: a\r\nX-Padding: {}\r\nContent-Length: {}\r\n\r\n{body}",
        "p".repeat(200),
        body.len()
    );
    stream.write_all(next.as_bytes()).await.unwrap();
    // Unobservable from outside: time for the bytes to be read while the
    // answer still waits.
    tokio::time::sleep(Duration::from_millis(200)).await;
    release.notify_one();
    let echo = format!("echo {body}");
    read_until(&mut stream, &mut got, echo.as_bytes()).await;

    let text = String::from_utf8_lossy(&got);
    let heads: Vec<usize> = text
        .match_indices("HTTP/1.1 200")
        .map(|(at, _)| at)
        .collect();
    assert_eq!(heads.len(), 2, "two answers: {text:?}");
    let two = text
        .find("two;")
        .expect("the streaming answer's second piece");
    assert!(two < heads[1], "the streaming answer ends first: {text:?}");
    let seen = seen.lock().unwrap();
    let targets: Vec<&str> = seen.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(targets, ["/stream", "/after"]);
    assert_eq!(seen[1].1, body.as_bytes(), "the pipelined body, whole");
}
