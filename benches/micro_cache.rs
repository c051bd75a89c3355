//! The micro-cache against nginx's (DESIGN §9.3): the same 1 s cache in
//! nginx (`proxy_cache_valid 1s`, `proxy_cache_lock on`, its cache files on
//! /dev/shm) and in queuegate (a gated route with `cache: { ttl: 1s }`,
//! wrk holding a pass), side by side in one run, in front of one origin
//! that takes 50 ms to build each seat map. wrk's keep-alive clients ask
//! for one hot URL, then for 200 URLs at random.
//!
//! Reported per server and workload: requests per second, p99, the
//! server's CPU per request (`utime + stime` of its processes from
//! `/proc`), and the origin requests per key per second (the cache's
//! purpose: at most about 1 with a 1 s cache), with queuegate's figures as
//! ratios of nginx's.
//!
//! Run: `cargo bench --bench micro_cache` (needs nginx and wrk). Options
//! (environment): `BENCH_DURATION` (5 s a run), `BENCH_CONNECTIONS` (1000),
//! `BENCH_THREADS` (2), `BENCH_ROUNDS` (1), `BENCH_NGINX`, `BENCH_WRK`,
//! `BENCH_QUEUEGATE` as for the proxy harness.

#[path = "proxy/http.rs"]
#[allow(dead_code)]
mod http;
#[path = "proxy/process.rs"]
#[allow(dead_code)]
mod process;
#[path = "proxy/servers.rs"]
#[allow(dead_code)]
mod servers;
#[path = "proxy/wrk.rs"]
#[allow(dead_code)]
mod wrk;

use std::collections::HashMap;
use std::env;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};

use servers::{Server, LARGE_LEN, SMALL_BODY};

/// How long the origin takes to build a seat map.
const BUILD: Duration = Duration::from_millis(50);
/// The seat maps of the many-URL workload.
const KEYS: usize = 200;
/// A seat map's size.
const SEAT_MAP_LEN: usize = 4096;

/// Origin requests for seat maps, by path.
type Asked = Arc<Mutex<HashMap<String, u64>>>;

fn main() -> Result<()> {
    let duration = Duration::from_secs(process::env_number::<u64>("BENCH_DURATION", 5)?);
    let connections = process::env_number::<u32>("BENCH_CONNECTIONS", 1000)?;
    let threads = process::env_number::<u32>("BENCH_THREADS", 2)?;
    let rounds = process::env_number("BENCH_ROUNDS", 1)?;
    let nginx = env::var_os("BENCH_NGINX").map_or_else(|| "/usr/sbin/nginx".into(), PathBuf::from);
    let wrk = env::var_os("BENCH_WRK").map_or_else(|| "wrk".into(), PathBuf::from);
    let queuegate = env::var_os("BENCH_QUEUEGATE")
        .map_or_else(|| env!("CARGO_BIN_EXE_queuegate").into(), PathBuf::from);
    let clock_ticks = process::clock_ticks_per_second();

    let root = tempfile::Builder::new()
        .prefix("queuegate-bench-cache-")
        .tempdir()
        .context("creating a temp dir")?;
    let shm = tempfile::Builder::new()
        .prefix("queuegate-bench-nginx-cache-")
        .tempdir_in("/dev/shm")
        .context("creating nginx's cache dir on /dev/shm")?;
    let (origin, asked) = start_origin()?;
    let mut nginx = servers::start_nginx_cache(&nginx, root.path(), origin, shm.path())?;
    let route = "    cache: { ttl: 1s, max_entries: 1000, max_body: 1MiB }\n";
    let (mut qg, cookie) =
        servers::start_queuegate_with(&queuegate, root.path(), origin, Some(route))?;
    let header = cookie.map(|c| format!("Cookie: {c}"));
    // Each server asks under its own prefix, so the origin's counts say
    // whose requests they were.
    let script = |prefix: &str| -> Result<PathBuf> {
        let path = root
            .path()
            .join(format!("many{}.lua", prefix.replace('/', "_")));
        std::fs::write(
            &path,
            format!(
                "request = function()\n  return wrk.format(nil, \"{prefix}/seats/\" .. math.random(0, {}))\nend\n",
                KEYS - 1
            ),
        )?;
        Ok(path)
    };
    let scripts = [script("/n")?, script("/q")?];
    eprintln!(
        "origin {origin}, nginx {}, queuegate {}; {connections} connections, {threads} wrk threads, {} s a run",
        nginx.addr,
        qg.addr,
        duration.as_secs()
    );

    let mut rows = Vec::new();
    for round in 1..=rounds {
        for many in [false, true] {
            for (name, server, header, prefix, script) in [
                ("nginx", &mut nginx, None, "/n", &scripts[0]),
                ("queuegate", &mut qg, header.as_deref(), "/q", &scripts[1]),
            ] {
                let run = Run {
                    wrk: &wrk,
                    threads,
                    connections,
                    duration,
                    prefix,
                    script: many.then_some(script.as_path()),
                    header,
                };
                let workload = if many { "200 URLs" } else { "one hot URL" };
                // What the last run left in flight ends first.
                std::thread::sleep(Duration::from_secs(1));
                let row = measure(&run, server, &asked, clock_ticks, workload, name)?;
                eprintln!("round {round} {}", row.line());
                rows.push(row);
            }
        }
    }
    println!("{}", table(&rows));
    Ok(())
}

/// How wrk is run.
struct Run<'a> {
    wrk: &'a Path,
    threads: u32,
    connections: u32,
    duration: Duration,
    /// The server's own prefix of the origin's paths.
    prefix: &'a str,
    script: Option<&'a Path>,
    header: Option<&'a str>,
}

/// One server under one workload.
struct Row {
    workload: &'static str,
    server: &'static str,
    rps: f64,
    p99_ms: f64,
    cpu_us: f64,
    /// Origin requests per key per second: mean over the keys asked for,
    /// and the most any key got.
    per_key: f64,
    per_key_max: f64,
    errors: u64,
}

impl Row {
    fn line(&self) -> String {
        format!(
            "{:11} {:9}: {:>8.0} req/s  p99 {:>7.2} ms  {:>6.1} µs CPU/req  origin {:.2} req/key/s (max {:.2})  {} errors",
            self.workload, self.server, self.rps, self.p99_ms, self.cpu_us, self.per_key, self.per_key_max, self.errors
        )
    }
}

fn measure(
    run: &Run,
    server: &mut Server,
    asked: &Asked,
    clock_ticks: f64,
    workload: &'static str,
    name: &'static str,
) -> Result<Row> {
    let url = match run.script {
        Some(_) => format!("http://{}/", server.addr),
        None => format!("http://{}{}/seats/hot", server.addr, run.prefix),
    };
    let before_asked = asked.lock().unwrap().clone();
    let before = server.process.cpu_ticks()?;
    let (result, _) = wrk::run_with_script(
        run.wrk,
        run.threads,
        run.connections,
        run.duration,
        &url,
        run.header,
        run.script,
    )?;
    let after = server.process.cpu_ticks()?;
    server.process.ensure_running()?;
    let (_, cpu_seconds) = after.since(before, clock_ticks);
    let seconds = run.duration.as_secs_f64();
    let deltas: Vec<u64> = asked
        .lock()
        .unwrap()
        .iter()
        .filter(|(path, _)| path.starts_with(run.prefix))
        .map(|(path, n)| n - before_asked.get(path).copied().unwrap_or(0))
        .filter(|&n| n > 0)
        .collect();
    let keys = deltas.len().max(1) as f64;
    Ok(Row {
        workload,
        server: name,
        rps: result.requests_per_second,
        p99_ms: result.p99_us / 1000.0,
        cpu_us: cpu_seconds * 1e6 / result.requests.max(1) as f64,
        per_key: deltas.iter().sum::<u64>() as f64 / keys / seconds,
        per_key_max: deltas.iter().copied().max().unwrap_or(0) as f64 / seconds,
        errors: result.errors,
    })
}

/// The rows as a Markdown table, queuegate's figures also as ratios of
/// nginx's in the same workload (and round).
fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| workload | server | req/s | p99 ms | CPU µs/req | origin req/key/s (max) | errors | req/s ÷ nginx | CPU/req ÷ nginx |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (i, row) in rows.iter().enumerate() {
        let nginx = rows[..=i]
            .iter()
            .rev()
            .find(|r| r.server == "nginx" && r.workload == row.workload);
        let (rps, cpu) = match nginx.filter(|_| row.server != "nginx") {
            Some(n) => (
                format!("{:.2}", row.rps / n.rps),
                format!("{:.2}", row.cpu_us / n.cpu_us),
            ),
            None => ("".into(), "".into()),
        };
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {:.2} ({:.2}) | {} | {rps} | {cpu} |\n",
            row.workload,
            row.server,
            row.rps,
            row.p99_ms,
            row.cpu_us,
            row.per_key,
            row.per_key_max,
            row.errors
        ));
    }
    out
}

/// The origin, in this process on one thread: `/small` and `/large` at
/// once (as the proxy harness's origin, which the servers' start-up
/// checks ask for), every other path a seat map built in [`BUILD`],
/// counted by path.
fn start_origin() -> Result<(SocketAddr, Asked)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let asked: Asked = Arc::default();
    let counts = asked.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the origin");
        runtime.block_on(serve(listener, counts));
    });
    Ok((addr, asked))
}

async fn serve(listener: std::net::TcpListener, asked: Asked) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("the origin's listener");
    let large = bytes::Bytes::from(vec![b'l'; LARGE_LEN]);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (asked, large) = (asked.clone(), large.clone());
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: ::http::Request<hyper::body::Incoming>| {
                    let (asked, large) = (asked.clone(), large.clone());
                    async move {
                        let path = req.uri().path().to_owned();
                        let body = match path.as_str() {
                            "/small" => bytes::Bytes::from_static(SMALL_BODY.as_bytes()),
                            "/large" => large,
                            _ => {
                                let n = {
                                    let mut asked = asked.lock().unwrap();
                                    let n = asked.entry(path.clone()).or_default();
                                    *n += 1;
                                    *n
                                };
                                tokio::time::sleep(BUILD).await;
                                let head =
                                    format!("{{\"seat_map\":\"{path}\",\"build\":{n},\"seats\":\"");
                                let mut map = head.into_bytes();
                                map.resize(SEAT_MAP_LEN - 2, b'o');
                                map.extend_from_slice(b"\"}");
                                bytes::Bytes::from(map)
                            }
                        };
                        let resp = ::http::Response::builder()
                            .header("content-type", "application/json")
                            .body(http_body_util::Full::new(body))
                            .expect("a response");
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}
