//! The load of the soak: wrk runs on the forwarded path with every answer
//! counted by status and `x-queuegate` tag, WebSocket tunnels opened and
//! closed, slow readers (a large body asked for, then not read), and idle
//! HTTP/2 connections (the preface and SETTINGS, then nothing).

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Result;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use crate::origin::LARGE_LEN;
use crate::wrk::{self, WrkRun};

/// One wrk run and what it was answered.
#[derive(Clone, Debug)]
pub struct Segment {
    /// Since the start of the soak.
    pub from: Duration,
    pub until: Duration,
    pub run: WrkRun,
    /// (status, `x-queuegate` tag or `-`) → count.
    pub statuses: BTreeMap<(u16, String), u64>,
}

/// Writes the wrk script: a pause of `delay_ms` before each request on a
/// connection (so the load is bounded in rate, not only in connections), and
/// each answer counted by status and tag, printed as `soak-status S TAG N`.
pub fn write_script(dir: &Path, delay_ms: u64) -> Result<PathBuf> {
    let path = dir.join("soak.lua");
    fs::write(
        &path,
        format!(
            r#"counts = {{}}
function delay()
  return {delay_ms}
end
function response(status, headers, body)
  local tag = headers["x-queuegate"] or "-"
  local key = status .. " " .. tag
  counts[key] = (counts[key] or 0) + 1
end
local threads = {{}}
function setup(thread)
  table.insert(threads, thread)
end
function done(summary, latency, requests)
  local total = {{}}
  for _, thread in ipairs(threads) do
    for key, n in pairs(thread:get("counts")) do
      total[key] = (total[key] or 0) + n
    end
  end
  for key, n in pairs(total) do
    io.write("soak-status " .. key .. " " .. n .. "\n")
  end
end
"#
        ),
    )?;
    Ok(path)
}

/// One wrk run of `length` on `url`, timed against `start`.
pub fn segment(
    wrk: &Path,
    script: &Path,
    connections: u32,
    length: Duration,
    url: &str,
    start: Instant,
) -> Result<Segment> {
    let from = start.elapsed();
    let (run, output) = wrk::run_with_script(wrk, 2, connections, length, url, None, Some(script))?;
    let mut statuses = BTreeMap::new();
    for line in output.lines() {
        if let ["soak-status", status, tag, count] =
            line.split_whitespace().collect::<Vec<_>>().as_slice()
        {
            if let (Ok(status), Ok(count)) = (status.parse::<u16>(), count.parse::<u64>()) {
                *statuses.entry((status, (*tag).to_owned())).or_default() += count;
            }
        }
    }
    Ok(Segment {
        from,
        until: start.elapsed(),
        run,
        statuses,
    })
}

/// How one tunnel ended, at a time since the start of the soak.
#[derive(Clone, Debug)]
pub enum Tunnel {
    /// Opened, every message echoed, closed by the client.
    Completed,
    /// The upgrade was refused or failed: the status, or 0 without one.
    Refused(u16),
    /// Opened, then broken before the exchange was done.
    Broken,
}

/// Messages per tunnel, and the pause between them.
const TUNNEL_MESSAGES: u32 = 10;
const TUNNEL_PAUSE: Duration = Duration::from_millis(200);
/// One step of a tunnel (the upgrade, one echo) may take this long.
const TUNNEL_STEP: Duration = Duration::from_secs(5);

/// Opens tunnels one after the other until `stop`, each exchanging a few
/// messages with the origin's echo; records how each ended.
pub async fn tunnels(
    addr: SocketAddr,
    start: Instant,
    log: Arc<Mutex<Vec<(Duration, Tunnel)>>>,
    mut stop: watch::Receiver<bool>,
) {
    let url = format!("ws://{addr}/ws");
    while !*stop.borrow() {
        let outcome = tokio::select! {
            outcome = tunnel(&url) => outcome,
            _ = stop.changed() => return,
        };
        let failed = !matches!(outcome, Tunnel::Completed);
        log.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((start.elapsed(), outcome));
        if failed {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

async fn tunnel(url: &str) -> Tunnel {
    let mut ws =
        match tokio::time::timeout(TUNNEL_STEP, tokio_tungstenite::connect_async(url)).await {
            Ok(Ok((ws, _))) => ws,
            Ok(Err(WsError::Http(response))) => return Tunnel::Refused(response.status().as_u16()),
            Ok(Err(_)) | Err(_) => return Tunnel::Refused(0),
        };
    for i in 0..TUNNEL_MESSAGES {
        let text = format!("soak message {i}");
        if ws.send(Message::text(text.clone())).await.is_err() {
            return Tunnel::Broken;
        }
        match tokio::time::timeout(TUNNEL_STEP, ws.next()).await {
            Ok(Some(Ok(Message::Text(echo)))) if echo.as_str() == text => {}
            _ => return Tunnel::Broken,
        }
        tokio::time::sleep(TUNNEL_PAUSE).await;
    }
    let _ = ws.close(None).await;
    Tunnel::Completed
}

/// How one slow reader's connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlowEnd {
    /// queuegate closed it before the body was done.
    Dropped,
    /// Still open after the hold: the rest of the body came when read.
    Served,
    /// Could not start (no `200`, or no connection).
    Failed,
}

/// A slow reader: asks for `/large` on a connection with a small receive
/// buffer, reads the head, then reads nothing for `hold`; then reads on to
/// see whether queuegate dropped it or kept it (recorded with when it
/// started and when that was found out). One after the other until `stop`.
pub async fn slow_readers(
    addr: SocketAddr,
    hold: Duration,
    start: Instant,
    log: Arc<Mutex<Vec<(Duration, Duration, SlowEnd)>>>,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let started = start.elapsed();
        let end = tokio::select! {
            end = slow_reader(addr, hold) => end,
            _ = stop.changed() => return,
        };
        log.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((started, start.elapsed(), end));
        if end == SlowEnd::Failed {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

async fn slow_reader(addr: SocketAddr, hold: Duration) -> SlowEnd {
    let Ok(socket) = TcpSocket::new_v4() else {
        return SlowEnd::Failed;
    };
    let _ = socket.set_recv_buffer_size(16 * 1024);
    let Ok(mut stream) = socket.connect(addr).await else {
        return SlowEnd::Failed;
    };
    let request = format!("GET /large HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return SlowEnd::Failed;
    }
    let mut buf = vec![0u8; 16 * 1024];
    let head = match tokio::time::timeout(TUNNEL_STEP, stream.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => n,
        _ => return SlowEnd::Failed,
    };
    if !buf[..head].starts_with(b"HTTP/1.1 200") {
        return SlowEnd::Failed;
    }
    tokio::time::sleep(hold).await;
    // Read on: the body ends after LARGE_LEN bytes plus the head, or the
    // connection ends first.
    let mut total = head;
    loop {
        match tokio::time::timeout(TUNNEL_STEP, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return SlowEnd::Dropped,
            Ok(Ok(n)) => {
                total += n;
                if total >= LARGE_LEN {
                    return SlowEnd::Served;
                }
            }
            Err(_) => return SlowEnd::Dropped,
        }
    }
}

/// The client preface of HTTP/2 and an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// How one idle HTTP/2 connection ended.
#[derive(Clone, Copy, Debug)]
pub enum IdleEnd {
    /// queuegate closed it after this long.
    Closed(Duration),
    /// Still open when the client gave up waiting (`hold`) or the soak ended.
    Open,
    Failed,
}

/// Opens an HTTP/2 connection, sends the preface and SETTINGS, then nothing;
/// reads (and ignores) what queuegate sends until it closes the connection
/// or `hold` passed. One after the other until `stop`.
pub async fn idle_h2(
    addr: SocketAddr,
    hold: Duration,
    log: Arc<Mutex<Vec<IdleEnd>>>,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let end = tokio::select! {
            end = idle_connection(addr, hold) => end,
            _ = stop.changed() => IdleEnd::Open,
        };
        log.lock().unwrap_or_else(PoisonError::into_inner).push(end);
        if matches!(end, IdleEnd::Failed) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

async fn idle_connection(addr: SocketAddr, hold: Duration) -> IdleEnd {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return IdleEnd::Failed;
    };
    if stream.write_all(H2_PREFACE).await.is_err() {
        return IdleEnd::Failed;
    }
    let opened = Instant::now();
    let mut buf = [0u8; 4096];
    let read_to_end = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return opened.elapsed(),
                Ok(_) => {}
            }
        }
    };
    match tokio::time::timeout(hold, read_to_end).await {
        Ok(after) => IdleEnd::Closed(after),
        Err(_) => IdleEnd::Open,
    }
}
