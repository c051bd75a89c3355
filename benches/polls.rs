//! Status polls against a static answer: a waiting visitor's
//! `GET /__queuegate/status?route=…` (answered by queuegate itself from the
//! line record, no store call) against nginx returning the same JSON from
//! memory, with wrk, the servers' CPU read around each run.
//!
//! `cargo bench --bench polls` builds the release binary and runs everything
//! on 127.0.0.1. Options (environment): `BENCH_ROUNDS` (3, interleaved,
//! medians taken), `BENCH_DURATION` (5 s), `BENCH_CONNECTIONS` (64,256),
//! `BENCH_THREADS` (2), `BENCH_NGINX`, `BENCH_WRK`, `BENCH_QUEUEGATE`.

#[path = "proxy/http.rs"]
mod http;
#[path = "proxy/process.rs"]
mod process;
#[path = "proxy/report.rs"]
#[allow(dead_code)]
mod report;
#[path = "proxy/servers.rs"]
#[allow(dead_code)]
mod servers;
#[path = "proxy/wrk.rs"]
#[allow(dead_code)]
mod wrk;

use std::env;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use report::Sample;
use servers::{Server, ROUTE};

const STATUS: &str = "/__queuegate/status";
/// The gated pages (the origin answers them as `/small`); the readiness
/// probe's `/small` is not one of them, so it takes no place.
const GATED: &str = "/small/gated";

/// A route of capacity 1 held by one confirmed pass, and one visitor
/// waiting behind it: the waiter's cookie and the poll's path.
fn waiting_visitor(queuegate: SocketAddr) -> Result<(String, String)> {
    let cookie_name = format!("qg_{ROUTE}");
    let first = http::get(queuegate, GATED, &[])?;
    let pass = first
        .cookie(&cookie_name)
        .context("no pass for the first visitor")?;
    let back = http::get(queuegate, GATED, &[format!("Cookie: {cookie_name}={pass}")])?;
    ensure!(
        back.status == 200,
        "the holder's return got {}",
        back.status
    );
    let waiter = http::get(queuegate, GATED, &[])?;
    let ticket = waiter
        .cookie(&cookie_name)
        .with_context(|| format!("no ticket for the second visitor ({})", waiter.status))?;
    ensure!(
        waiter.status != 200,
        "the second visitor was let in: capacity 1 is not held"
    );
    Ok((
        format!("Cookie: {cookie_name}={ticket}"),
        format!("{STATUS}?route={ROUTE}"),
    ))
}

fn main() -> Result<()> {
    let rounds: u32 = process::env_number("BENCH_ROUNDS", 3)?;
    let duration = Duration::from_secs(process::env_number("BENCH_DURATION", 5)?);
    let threads: u32 = process::env_number("BENCH_THREADS", 2)?;
    let connections: Vec<u32> = env::var("BENCH_CONNECTIONS")
        .unwrap_or_else(|_| "64,256".into())
        .split(',')
        .map(|n| n.trim().parse())
        .collect::<Result<_, _>>()
        .context("BENCH_CONNECTIONS must be a comma-separated list of numbers")?;
    let nginx_bin =
        env::var_os("BENCH_NGINX").map_or_else(|| "/usr/sbin/nginx".into(), PathBuf::from);
    let wrk_bin = env::var_os("BENCH_WRK").map_or_else(|| "wrk".into(), PathBuf::from);
    let binary = env::var_os("BENCH_QUEUEGATE")
        .map_or_else(|| env!("CARGO_BIN_EXE_queuegate").into(), PathBuf::from);
    let clock_ticks = process::clock_ticks_per_second();
    let root = tempfile::Builder::new()
        .prefix("queuegate-polls-")
        .tempdir()?;

    let origin = servers::start_origin(&nginx_bin, root.path())?;
    let routes = format!(
        "routes:\n  - name: {ROUTE}\n    match: {{ path_prefix: {GATED} }}\n    capacity: 1\n    \
         pass_ttl: 1h\n    session_ttl: 2h\n"
    );
    let mut queuegate =
        servers::start_queuegate_config(&binary, root.path(), "queuegate", origin.addr, &routes)?;
    let (cookie, path) = waiting_visitor(queuegate.addr)?;
    let poll = http::get(queuegate.addr, &path, std::slice::from_ref(&cookie))?;
    let body = String::from_utf8(poll.body).context("the status answer is not UTF-8")?;
    ensure!(
        poll.status == 200 && body.contains("\"waiting\""),
        "a waiting visitor's poll got {}: {body}",
        poll.status
    );
    eprintln!("status answer: {body}");
    let mut nginx = servers::start_nginx_static(&nginx_bin, root.path(), STATUS, &body)?;

    let mut samples = Vec::new();
    for round in 1..=rounds {
        for &conns in &connections {
            for (name, server, header) in [
                ("nginx", &mut nginx, None),
                ("queuegate", &mut queuegate, Some(cookie.as_str())),
            ] {
                let sample = measure(
                    &wrk_bin,
                    threads,
                    duration,
                    clock_ticks,
                    round,
                    conns,
                    name,
                    server,
                    &path,
                    header,
                )?;
                eprintln!(
                    "round {round} c={conns} {name:9}: {:>8.0} req/s  p99 {:>7.2} ms  {:>6.1} µs CPU/req  {} errors",
                    sample.run.requests_per_second,
                    sample.run.p99_us / 1000.0,
                    sample.cpu_us_per_request,
                    sample.run.errors,
                );
                samples.push(sample);
            }
        }
    }
    let summary = report::summary(&samples, &[STATUS], &connections, &["nginx", "queuegate"]);
    println!("## Status polls\n\n{summary}");
    Ok(())
}

/// One wrk run against one server, with its CPU time around it.
#[allow(clippy::too_many_arguments)]
fn measure(
    wrk_bin: &std::path::Path,
    threads: u32,
    duration: Duration,
    clock_ticks: f64,
    round: u32,
    connections: u32,
    name: &'static str,
    server: &mut Server,
    path: &str,
    header: Option<&str>,
) -> Result<Sample> {
    let url = format!("http://{}{path}", server.addr);
    let before = server.process.cpu_ticks()?;
    let run = wrk::run(wrk_bin, threads, connections, duration, &url, header)?;
    let after = server.process.cpu_ticks()?;
    server.process.ensure_running()?;
    ensure!(run.errors == 0, "{name}: {} failed answers", run.errors);
    let (user, cpu) = after.since(before, clock_ticks);
    Ok(Sample {
        round,
        path: STATUS,
        connections,
        target: name,
        cpu_us_per_request: cpu * 1e6 / run.requests as f64,
        user_us_per_request: user * 1e6 / run.requests as f64,
        run,
    })
}
