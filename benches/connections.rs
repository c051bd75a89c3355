//! Memory per idle client connection: opens 10,000 keep-alive connections to
//! one queuegate instance (memory store), each making one request (a status
//! poll, answered by queuegate itself), keeps them open and idle, and reads
//! queuegate's resident memory (`VmRSS` in `/proc/<pid>/status`) before and
//! after. Target: 10,000 idle connections in at most 100 MB.
//!
//! Run: `cargo bench --bench connections` (flag `--connections N` or
//! `QG_CONNECTIONS`). queuegate is started with its open-files limit raised to
//! the hard limit and `limits.max_connections` above N; this process needs
//! N + a few hundred open files (`ulimit -n`).

#[path = "crowd/fleet.rs"]
mod fleet;
#[path = "crowd/sim.rs"]
mod sim;

use std::time::{Duration, Instant};

use fleet::{GateSpec, Origin, Queuegate};
use sim::Flags;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const REQUEST: &[u8] =
    b"GET /__queuegate/status?route=idle HTTP/1.1\r\nHost: bench\r\nAccept: application/json\r\n\r\n";
/// Connections opened at the same time.
const OPENING: usize = 200;

fn main() {
    let flags = Flags::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(bench(&flags));
}

/// The open-files soft limit of this process.
fn open_files_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Reads one HTTP/1.1 response with a Content-Length body; returns whether it was a 200.
async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    buf.clear();
    let mut chunk = [0u8; 2048];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if buf.len() >= end + 4 + length {
            return Ok(head.starts_with("http/1.1 200"));
        }
    }
}

async fn open(port: u16) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream.set_nodelay(true)?;
    stream.write_all(REQUEST).await?;
    let mut buf = Vec::with_capacity(1024);
    if !read_response(&mut stream, &mut buf).await? {
        return Err(std::io::Error::other("not a 200"));
    }
    Ok(stream)
}

async fn bench(flags: &Flags) {
    let wanted: usize = flags.parse("connections", 10_000);
    let limit = open_files_limit();
    assert!(
        limit >= wanted as u64 + 200,
        "this process may open {limit} files; raise it (`ulimit -n {}`)",
        wanted + 1_000
    );
    let origin = Origin::start().await;
    let mut spec = GateSpec::quick("idle", "/idle", 100);
    spec.max_connections = wanted as u64 + 1_000;
    // Idle keep-alive connections must outlive the measurement.
    spec.header_timeout = Duration::from_secs(300);
    let gate = Queuegate::start(&spec, &origin.url(), &fleet::run_key());
    let pid = gate.pid();

    // Warm up: one connection, one request, so start-up allocations are in.
    let warm = open(gate.port()).await.expect("a first request");
    drop(warm);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before_kb = fleet::rss_kb(pid);
    let fds_before = fleet::open_fds(pid);

    let started = Instant::now();
    let mut streams = Vec::with_capacity(wanted);
    let mut failed = 0usize;
    let mut first_error = None;
    while streams.len() + failed < wanted {
        let batch = OPENING.min(wanted - streams.len() - failed);
        let opened = futures_util::future::join_all((0..batch).map(|_| open(gate.port()))).await;
        for r in opened {
            match r {
                Ok(s) => streams.push(s),
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e.to_string());
                }
            }
        }
    }
    let opening = started.elapsed();
    // Idle means idle: queuegate parks a keep-alive connection after
    // `connection::PARK_AFTER` to twice that without traffic.
    tokio::time::sleep(queuegate::connection::PARK_AFTER * 2 + Duration::from_secs(2)).await;
    let after_kb = fleet::rss_kb(pid);
    let fds_after = fleet::open_fds(pid);

    // The connections are still alive: a second request on every 100th.
    let mut alive = 0;
    let mut buf = Vec::new();
    for s in streams.iter_mut().step_by(100) {
        if s.write_all(REQUEST).await.is_ok() && read_response(s, &mut buf).await.unwrap_or(false) {
            alive += 1;
        }
    }
    let sampled = streams.len().div_ceil(100);
    let open_now = streams.len();
    drop(streams);
    drop(gate);

    let per_conn = (after_kb.saturating_sub(before_kb)) as f64 * 1024.0 / open_now.max(1) as f64;
    println!("idle keep-alive connections, one queuegate instance");
    println!("  connections open           {open_now} (failed {failed}) in {opening:.1?}");
    if let Some(e) = first_error {
        println!("  first failure              {e}");
    }
    println!("  queuegate open files       {fds_before} -> {fds_after}");
    println!(
        "  RSS before / after         {:.1} MB / {:.1} MB",
        before_kb as f64 / 1024.0,
        after_kb as f64 / 1024.0
    );
    println!("  per connection             {:.1} kB", per_conn / 1024.0);
    println!("  still alive (sampled)      {alive}/{sampled}");
    println!(
        "  verdict                    {} (target: {} connections in <= 100 MB)",
        if failed == 0 && after_kb <= 100 * 1024 && alive == sampled {
            "PASS"
        } else {
            "FAIL"
        },
        wanted
    );
    assert_eq!(failed, 0, "every connection opened");
    assert_eq!(alive, sampled, "idle connections stayed open");
}
