//! The soak's origin: this bench binary run again as a child process with
//! `SOAK_ORIGIN=<addr>`, so the harness can kill it and start it again on the
//! same port. It answers `/large` with a 16 MiB body sent in 64 KiB chunks
//! (for slow readers), echoes WebSocket messages on `/ws`, and answers every
//! other path `200 ok`.

use std::convert::Infallible;
use std::fs::File;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{header, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;

use crate::http as probe;
use crate::process::Process;

/// The environment variable that turns this binary into the origin.
pub const ENV: &str = "SOAK_ORIGIN";
/// The `/large` body: 256 chunks of 64 KiB.
pub const LARGE_LEN: usize = 256 * CHUNK;
const CHUNK: usize = 64 * 1024;

type Body = BoxBody<Bytes, Infallible>;

/// Serves as the origin on `addr` until killed (the child's whole life).
pub fn serve(addr: &str) -> Result<()> {
    let addr: SocketAddr = addr.parse().with_context(|| format!("{ENV}={addr:?}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("the origin's runtime")?;
    runtime.block_on(async move {
        // tokio sets SO_REUSEADDR, so a restart binds while old sockets
        // of the killed process linger in TIME_WAIT.
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the origin to {addr}"))?;
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(answer))
                    .with_upgrades()
                    .await;
            });
        }
    })
}

async fn answer(mut req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let response = match req.uri().path() {
        "/ws" => match req.headers().get(header::SEC_WEBSOCKET_KEY) {
            Some(key) => {
                let accept = derive_accept_key(key.as_bytes());
                let upgrade = hyper::upgrade::on(&mut req);
                tokio::spawn(async move {
                    if let Ok(upgraded) = upgrade.await {
                        echo(TokioIo::new(upgraded)).await;
                    }
                });
                Response::builder()
                    .status(StatusCode::SWITCHING_PROTOCOLS)
                    .header(header::CONNECTION, "upgrade")
                    .header(header::UPGRADE, "websocket")
                    .header(header::SEC_WEBSOCKET_ACCEPT, accept)
                    .body(empty())
            }
            None => Response::builder()
                .status(StatusCode::BAD_REQUEST)
                .body(full("a WebSocket upgrade is expected here\n")),
        },
        "/large" => {
            let chunk = Bytes::from(vec![b'x'; CHUNK]);
            let frames = futures_util::stream::iter(
                (0..LARGE_LEN / CHUNK).map(move |_| Ok(Frame::data(chunk.clone()))),
            );
            Response::builder()
                .header(header::CONTENT_LENGTH, LARGE_LEN)
                .body(BodyExt::boxed(StreamBody::new(frames)))
        }
        _ => Response::builder().body(full("ok\n")),
    };
    // The builders above are given only valid parts.
    Ok(response.unwrap_or_else(|_| Response::new(empty())))
}

/// Echoes text and binary messages until the peer closes or goes away.
async fn echo<S>(io: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut ws = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
    while let Some(Ok(message)) = ws.next().await {
        if message.is_text() || message.is_binary() {
            if ws.send(message).await.is_err() {
                return;
            }
        } else if message.is_close() {
            return;
        }
    }
}

fn full(text: &'static str) -> Body {
    Full::new(Bytes::from_static(text.as_bytes())).boxed()
}

fn empty() -> Body {
    full("")
}

/// The origin child process, killed and started again on the same port.
pub struct Origin {
    pub addr: SocketAddr,
    log: std::path::PathBuf,
    process: Option<Process>,
}

impl Origin {
    /// Starts the origin on `addr` and waits until it answers.
    pub fn start(addr: SocketAddr, dir: &Path) -> Result<Self> {
        let mut origin = Self {
            addr,
            log: dir.join("origin.log"),
            process: None,
        };
        origin.spawn()?;
        Ok(origin)
    }

    fn spawn(&mut self) -> Result<()> {
        let exe = std::env::current_exe().context("the bench's own path")?;
        let child = Command::new(exe)
            .env(ENV, self.addr.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&self.log)?)
            .spawn()
            .context("starting the origin")?;
        let mut process = Process::new("origin", child, vec![self.log.clone()]);
        probe::wait_ready(&mut process, self.addr, "/")?;
        self.process = Some(process);
        Ok(())
    }

    /// `SIGKILL`, `down` without an origin, then the same port again.
    pub fn kill_and_restart(&mut self, down: Duration) -> Result<()> {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
        std::thread::sleep(down);
        self.spawn()
    }
}
