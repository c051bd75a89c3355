//! Proxy overhead harness: the same origin served directly, through nginx, through
//! queuegate as a plain proxy (no route) and through queuegate's admitted path (a
//! gated route and a valid pass), measured with wrk for throughput, latency and
//! server CPU.
//!
//! `cargo bench --bench proxy` builds the release binary (`target/release/queuegate`)
//! and runs everything on 127.0.0.1. Options (environment):
//!
//! - `BENCH_ROUNDS` (3): interleaved rounds; medians are taken over them.
//! - `BENCH_DURATION` (5): seconds per wrk run (`5` or `5s`).
//! - `BENCH_CONNECTIONS` (16,64,256): wrk connection counts.
//! - `BENCH_THREADS` (2): wrk threads.
//! - `BENCH_PATHS` (/small,/large): request paths.
//! - `BENCH_SERVERS` (direct,nginx,plain,queuegate): which servers to measure;
//!   `plain` is queuegate without a route, `queuegate` its admitted path.
//! - `BENCH_WRITE` (unset): `1` writes the results into `benches/README.md`.
//! - `BENCH_NGINX` (/usr/sbin/nginx), `BENCH_WRK` (wrk), `BENCH_QUEUEGATE` (the built binary).

#[path = "proxy/http.rs"]
mod http;
#[path = "proxy/process.rs"]
mod process;
#[path = "proxy/report.rs"]
mod report;
#[path = "proxy/servers.rs"]
mod servers;
#[path = "proxy/wrk.rs"]
mod wrk;

use std::env;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

use report::{Sample, Setup};
use servers::Server;

const ALL_PATHS: [&str; 2] = ["/small", "/large"];
const ALL_SERVERS: [&str; 4] = ["direct", "nginx", "plain", "queuegate"];

struct Options {
    rounds: u32,
    duration: Duration,
    connections: Vec<u32>,
    threads: u32,
    paths: Vec<&'static str>,
    servers: Vec<&'static str>,
    write: bool,
    nginx: PathBuf,
    wrk: PathBuf,
    queuegate: PathBuf,
}

impl Options {
    fn from_env() -> Result<Self> {
        let rounds = process::env_number::<u32>("BENCH_ROUNDS", 3)?;
        let duration_secs: u64 = process::env_number("BENCH_DURATION", 5)?;
        let connections = env::var("BENCH_CONNECTIONS")
            .unwrap_or_else(|_| "16,64,256".to_string())
            .split(',')
            .map(|n| n.trim().parse::<u32>())
            .collect::<Result<Vec<_>, _>>()
            .context("BENCH_CONNECTIONS must be a comma-separated list of numbers")?;
        let threads = process::env_number::<u32>("BENCH_THREADS", 2)?;
        let paths = choose("BENCH_PATHS", &ALL_PATHS)?;
        let servers = choose("BENCH_SERVERS", &ALL_SERVERS)?;
        ensure!(
            rounds > 0 && duration_secs > 0 && threads > 0,
            "rounds, duration and threads must be positive"
        );
        ensure!(
            connections.iter().all(|&c| c >= threads),
            "every connection count must be at least BENCH_THREADS ({threads})"
        );
        Ok(Self {
            rounds,
            duration: Duration::from_secs(duration_secs),
            connections,
            threads,
            paths,
            servers,
            write: env::var("BENCH_WRITE").is_ok_and(|v| v == "1"),
            nginx: env::var_os("BENCH_NGINX")
                .map_or_else(|| "/usr/sbin/nginx".into(), PathBuf::from),
            wrk: env::var_os("BENCH_WRK").map_or_else(|| "wrk".into(), PathBuf::from),
            queuegate: env::var_os("BENCH_QUEUEGATE")
                .map_or_else(|| env!("CARGO_BIN_EXE_queuegate").into(), PathBuf::from),
        })
    }
}

/// A comma-separated subset of `all`, in the order of `all`.
fn choose(name: &str, all: &[&'static str]) -> Result<Vec<&'static str>> {
    let Ok(text) = env::var(name) else {
        return Ok(all.to_vec());
    };
    let wanted: Vec<&str> = text.split(',').map(str::trim).collect();
    if let Some(unknown) = wanted.iter().find(|w| !all.contains(w)) {
        bail!("{name}: unknown {unknown:?}; choose from {}", all.join(","));
    }
    Ok(all.iter().copied().filter(|a| wanted.contains(a)).collect())
}

/// A server under test and the header wrk must send to it.
struct Target<'a> {
    name: &'static str,
    server: &'a mut Server,
    header: Option<String>,
}

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; this harness takes no arguments.
    let options = Options::from_env()?;
    let clock_ticks = process::clock_ticks_per_second();
    let root = tempfile::Builder::new()
        .prefix("queuegate-bench-")
        .tempdir()
        .context("creating a temp dir")?;

    let mut origin = servers::start_origin(&options.nginx, root.path())?;
    let mut nginx = if options.servers.contains(&"nginx") {
        Some(servers::start_nginx_proxy(
            &options.nginx,
            root.path(),
            origin.addr,
        )?)
    } else {
        None
    };
    let start_queuegate = |name, gated| -> Result<_> {
        if !options.servers.contains(&name) {
            return Ok(None);
        }
        let (server, cookie) =
            servers::start_queuegate(&options.queuegate, root.path(), origin.addr, gated)?;
        Ok(Some((server, cookie)))
    };
    let mut plain = start_queuegate("plain", false)?;
    let mut queuegate = start_queuegate("queuegate", true)?;
    let addr = |server: Option<&Server>| server.map_or("-".to_string(), |s| s.addr.to_string());
    eprintln!(
        "origin {}, nginx {}, queuegate plain {}, gated {}; temp dir {}",
        origin.addr,
        addr(nginx.as_ref()),
        addr(plain.as_ref().map(|(s, _)| s)),
        addr(queuegate.as_ref().map(|(s, _)| s)),
        root.path().display()
    );

    let mut targets: Vec<Target> = Vec::new();
    if options.servers.contains(&"direct") {
        targets.push(Target {
            name: "direct",
            server: &mut origin,
            header: None,
        });
    }
    if let Some(server) = nginx.as_mut() {
        targets.push(Target {
            name: "nginx",
            server,
            header: None,
        });
    }
    for (name, started) in [("plain", &mut plain), ("queuegate", &mut queuegate)] {
        if let Some((server, cookie)) = started.as_mut() {
            targets.push(Target {
                name,
                server,
                header: cookie.as_ref().map(|c| format!("Cookie: {c}")),
            });
        }
    }

    let mut samples = Vec::new();
    for round in 1..=options.rounds {
        for &path in &options.paths {
            for &connections in &options.connections {
                for target in &mut targets {
                    let sample = measure(&options, clock_ticks, round, path, connections, target)?;
                    eprintln!(
                        "round {round} {path} c={connections} {:9}: {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms  {:>6.1} µs CPU/req  {} errors",
                        target.name,
                        sample.run.requests_per_second,
                        sample.run.p50_us / 1000.0,
                        sample.run.p99_us / 1000.0,
                        sample.cpu_us_per_request,
                        sample.run.errors,
                    );
                    samples.push(sample);
                }
            }
        }
    }
    drop(targets);

    let runs = report::runs_table(&samples);
    let summary = report::summary(
        &samples,
        &options.paths,
        &options.connections,
        &options.servers,
    );
    println!("## Runs\n\n{runs}\n## Medians\n\n{summary}");
    let errors: u64 = samples.iter().map(|s| s.run.errors).sum();
    if errors > 0 {
        eprintln!(
            "warning: {errors} failed responses or socket errors in total (see the runs table)"
        );
    }

    if options.write {
        let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/README.md");
        let setup = Setup {
            rounds: options.rounds,
            duration_secs: options.duration.as_secs(),
            threads: options.threads,
            connections: options.connections.clone(),
            clock_ticks,
        };
        report::write_readme(&readme, &setup, &summary, &runs)?;
        eprintln!("wrote {}", readme.display());
    }
    Ok(())
}

/// One wrk run against one server, with the server's CPU time around it.
fn measure(
    options: &Options,
    clock_ticks: f64,
    round: u32,
    path: &'static str,
    connections: u32,
    target: &mut Target,
) -> Result<Sample> {
    let url = format!("http://{}{path}", target.server.addr);
    let before = target.server.process.cpu_ticks()?;
    let run = wrk::run(
        &options.wrk,
        options.threads,
        connections,
        options.duration,
        &url,
        target.header.as_deref(),
    )?;
    let after = target.server.process.cpu_ticks()?;
    target.server.process.ensure_running()?;
    let (user_seconds, cpu_seconds) = after.since(before, clock_ticks);
    Ok(Sample {
        round,
        path,
        connections,
        target: target.name,
        cpu_us_per_request: cpu_seconds * 1e6 / run.requests as f64,
        user_us_per_request: user_seconds * 1e6 / run.requests as f64,
        run,
    })
}
