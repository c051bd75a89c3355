//! Connections end when they should: idle HTTP/1 and HTTP/2 connections,
//! HTTP/2 header blocks left open and reset floods, clients that stop
//! reading, framing checks after an `Upgrade` that got no `101`, and tunnels
//! (their connection slot, their idle timeout, the drain deadline).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use queuegate::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

/// Bounds every wait for something that must happen.
const PATIENCE: Duration = Duration::from_secs(15);

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// An HTTP/2 frame: length, type, flags, stream, payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let [_, l0, l1, l2] = (payload.len() as u32).to_be_bytes();
    let mut out = vec![l0, l1, l2, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

const SETTINGS: u8 = 0x4;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// `GET /` for authority `a`, in HPACK: static-table method, scheme and
/// path, and a literal authority not indexed.
const GET_BLOCK: &[u8] = &[0x82, 0x86, 0x84, 0x01, 0x01, b'a'];

/// Reads and discards until the server closes the connection; fails when
/// it is still open after [`PATIENCE`].
async fn closed_by_server(stream: &mut TcpStream, what: &str) {
    let mut buf = vec![0u8; 64 * 1024];
    let read_to_end = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(PATIENCE, read_to_end)
        .await
        .unwrap_or_else(|_| panic!("{what}: the connection is still open"));
}

fn config_for(origin: &Origin) -> Config {
    let mut config = proxy_config(&origin.url());
    config.limits.workers = Some(1);
    config
}

async fn ok_origin() -> Origin {
    spawn_origin(|_req| async { Response::new(full("ok")) }).await
}

#[tokio::test]
async fn an_idle_http2_connection_is_closed_after_idle_timeout() {
    let origin = ok_origin().await;
    let mut config = config_for(&origin);
    config.limits.idle_timeout = Duration::from_secs(1);
    config.limits.header_timeout = Duration::from_secs(60);
    let gate = spawn_gate(config).await;
    let mut stream = TcpStream::connect(gate.addr).await.unwrap();
    stream.write_all(PREFACE).await.unwrap();
    stream.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    closed_by_server(&mut stream, "an idle HTTP/2 connection").await;
}

#[tokio::test]
async fn an_idle_http1_connection_is_closed_after_idle_timeout() {
    let origin = ok_origin().await;
    let mut config = config_for(&origin);
    config.limits.idle_timeout = Duration::from_secs(1);
    config.limits.header_timeout = Duration::from_secs(60);
    let gate = spawn_gate(config).await;
    let mut keep = KeepAlive::connect(gate.addr).await;
    let (status, _) = keep.get("/one", "").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = keep.get("/two", "").await;
    assert_eq!(status, StatusCode::OK, "served again while not idle long");
    let mut stream = TcpStream::connect(gate.addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    // The answer, then the close once the connection (parked by then) idled.
    closed_by_server(&mut stream, "an idle keep-alive connection").await;
}

#[tokio::test]
async fn an_http1_head_left_unfinished_is_closed_after_header_timeout() {
    let origin = ok_origin().await;
    let mut config = config_for(&origin);
    config.limits.idle_timeout = Duration::from_secs(3600);
    config.limits.header_timeout = Duration::from_secs(1);
    let gate = spawn_gate(config).await;
    let mut stream = TcpStream::connect(gate.addr).await.unwrap();
    // No blank line: the head never ends (and a connection that has not
    // had a request answered is never parked).
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n")
        .await
        .unwrap();
    closed_by_server(&mut stream, "an unfinished request head").await;
    assert_eq!(origin.accepted(), 0);
}

#[tokio::test]
async fn an_http2_header_block_left_open_is_closed_after_header_timeout() {
    let origin = ok_origin().await;
    let mut config = config_for(&origin);
    config.limits.idle_timeout = Duration::from_secs(3600);
    config.limits.header_timeout = Duration::from_secs(1);
    let gate = spawn_gate(config).await;
    let mut stream = TcpStream::connect(gate.addr).await.unwrap();
    stream.write_all(PREFACE).await.unwrap();
    stream.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    // HEADERS without END_HEADERS: its CONTINUATION never comes.
    stream
        .write_all(&frame(HEADERS, END_STREAM, 1, GET_BLOCK))
        .await
        .unwrap();
    closed_by_server(&mut stream, "an open header block").await;
}

#[tokio::test]
async fn a_stream_reset_flood_is_disconnected() {
    let origin = ok_origin().await;
    let gate = spawn_gate(config_for(&origin)).await;
    let mut stream = TcpStream::connect(gate.addr).await.unwrap();
    let mut flood = PREFACE.to_vec();
    flood.extend(frame(SETTINGS, 0, 0, &[]));
    for n in 0..5000u32 {
        let id = 2 * n + 1;
        flood.extend(frame(HEADERS, END_STREAM | END_HEADERS, id, GET_BLOCK));
        // CANCEL.
        flood.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    // The server may close before it has read it all.
    let _ = stream.write_all(&flood).await;
    closed_by_server(&mut stream, "a reset flood").await;
    assert!(
        origin.accepted() <= 200,
        "the flood reached the origin {} times over",
        origin.accepted()
    );
}

#[tokio::test]
async fn a_client_that_stops_reading_is_dropped_and_its_origin_connection_freed() {
    let released = Arc::new(AtomicBool::new(false));
    let flag = released.clone();
    let origin = spawn_origin(move |req: Request<hyper::body::Incoming>| {
        let flag = flag.clone();
        async move {
            if req.uri().path() != "/big" {
                return Response::new(full("small"));
            }
            let (mut tx, body) =
                http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(4);
            tokio::spawn(async move {
                let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
                // At most 1 GiB: the test fails long before this is sent.
                for _ in 0..16 * 1024 {
                    if tx.send_data(chunk.clone()).await.is_err() {
                        flag.store(true, Ordering::SeqCst);
                        return;
                    }
                }
            });
            Response::new(body.boxed())
        }
    })
    .await;
    let mut config = config_for(&origin);
    config.limits.send_timeout = Duration::from_secs(1);
    let gate = spawn_gate(config).await;

    let mut reader = TcpStream::connect(gate.addr).await.unwrap();
    reader
        .write_all(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    // Reads nothing: the gate's writes block once the socket buffers fill.
    eventually("the origin's body is dropped", || {
        released.load(Ordering::SeqCst)
    })
    .await;
    closed_by_server(&mut reader, "a client that reads nothing").await;
    assert_eq!(origin.accepted(), 1);

    // The released connection is not pooled; the next ones are, and reused.
    for _ in 0..2 {
        let (parts, body) = get(&gate.url("/small")).await;
        assert_eq!(parts.status, StatusCode::OK);
        assert_eq!(body, "small");
    }
    assert_eq!(origin.accepted(), 2);
}

#[tokio::test]
async fn framing_checks_stay_on_after_an_upgrade_without_101() {
    let origin = ok_origin().await;
    let gate = spawn_gate(config_for(&origin)).await;
    let smuggled: [&[u8]; 2] = [
        b"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd",
        b"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
    ];
    for second in smuggled {
        let mut stream = TcpStream::connect(gate.addr).await.unwrap();
        let mut both =
            b"GET /a HTTP/1.1\r\nHost: a\r\nUpgrade: foo\r\nConnection: upgrade\r\n\r\n".to_vec();
        both.extend_from_slice(second);
        stream.write_all(&both).await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        let heads: Vec<&str> = answer
            .match_indices("HTTP/1.1 ")
            .map(|(at, _)| &answer[at..at + 12])
            .collect();
        assert_eq!(heads, ["HTTP/1.1 200", "HTTP/1.1 400"], "{answer}");
    }
    assert_eq!(origin.accepted(), 1, "only the GETs reached the origin");
}

/// A WebSocket origin that echoes text and binary messages.
async fn websocket_origin() -> Origin {
    spawn_raw_origin(|stream| async move {
        let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
            return;
        };
        while let Some(Ok(msg)) = ws.next().await {
            if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                return;
            }
        }
    })
    .await
}

type Ws = tokio_tungstenite::WebSocketStream<TcpStream>;

/// A WebSocket through the gate at `addr`, one message echoed.
async fn tunnel(addr: std::net::SocketAddr) -> Ws {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(format!("ws://{addr}/socket"), stream)
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    ws.send(Message::text("ping")).await.unwrap();
    let echoed = ws.next().await.unwrap().unwrap();
    assert_eq!(echoed.into_text().unwrap().as_str(), "ping");
    ws
}

/// Waits until the gate ends the tunnel.
async fn tunnel_ended(ws: &mut Ws, what: &str) {
    let ended = async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            }
        }
    };
    tokio::time::timeout(PATIENCE, ended)
        .await
        .unwrap_or_else(|_| panic!("{what}: the tunnel is still open"));
}

/// `queuegate_connections{protocol="tunnel"}` on the gate's admin listener.
async fn tunnels_open(gate: &Gate) -> f64 {
    let (_, body) = get(&gate.admin_url("/metrics")).await;
    let text = String::from_utf8_lossy(&body).into_owned();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(r#"queuegate_connections{protocol="tunnel"} "#)?
                .parse()
                .ok()
        })
        .expect("the tunnel gauge is exported")
}

#[tokio::test]
async fn a_silent_tunnel_is_closed_after_tunnel_idle_timeout() {
    let origin = websocket_origin().await;
    let mut config = config_for(&origin);
    config.limits.tunnel_idle_timeout = Duration::from_secs(1);
    let gate = spawn_gate_opts(config, ring("k1"), Default::default()).await;
    let mut ws = tunnel(gate.addr).await;
    assert_eq!(tunnels_open(&gate).await, 1.0);
    tunnel_ended(&mut ws, "a silent tunnel").await;
    for _ in 0..1000 {
        if tunnels_open(&gate).await == 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the tunnel gauge did not go back to 0");
}

#[tokio::test]
async fn tunnels_count_against_max_connections() {
    let origin = websocket_origin().await;
    let mut config = config_for(&origin);
    config.limits.max_connections = 1;
    let gate = spawn_gate(config).await;
    let mut ws = tunnel(gate.addr).await;

    // The kernel completes the handshake; the gate does not serve it.
    let mut waiting = TcpStream::connect(gate.addr).await.unwrap();
    waiting
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(500), waiting.read(&mut byte)).await;
    assert!(early.is_err(), "served while the tunnel held the only slot");

    ws.close(None).await.unwrap();
    drop(ws);
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, waiting.read_to_end(&mut answer))
        .await
        .expect("served once the tunnel closed")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 "), "an answer: {answer:?}");
}

#[tokio::test]
async fn a_tunnel_is_closed_at_the_drain_deadline() {
    let origin = websocket_origin().await;
    let mut config = config_for(&origin);
    config.limits.drain_timeout = Duration::from_secs(1);
    let gate = spawn_gate(config).await;
    let mut ws = tunnel(gate.addr).await;
    tokio::time::timeout(PATIENCE, gate.stop())
        .await
        .expect("the run returned at the drain deadline")
        .unwrap();
    tunnel_ended(&mut ws, "a tunnel past the drain deadline").await;
}
