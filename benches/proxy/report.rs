//! Markdown tables of the runs and their medians, and the results section of `benches/README.md`.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use crate::wrk::WrkRun;

/// Marks around the generated part of `benches/README.md`.
const BEGIN: &str = "<!-- proxy-results:begin -->";
const END: &str = "<!-- proxy-results:end -->";

/// One measured wrk run against one server.
#[derive(Clone, Debug)]
pub struct Sample {
    pub round: u32,
    pub path: &'static str,
    pub connections: u32,
    pub target: &'static str,
    pub run: WrkRun,
    /// Server CPU time (user + system, all its processes) per completed request.
    pub cpu_us_per_request: f64,
    /// The user-space part of it.
    pub user_us_per_request: f64,
}

/// The medians of one (path, connections, target) cell.
struct Median {
    requests_per_second: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us_per_request: f64,
    user_us_per_request: f64,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn cell(samples: &[Sample], path: &str, connections: u32, target: &str) -> Option<Median> {
    let runs: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.path == path && s.connections == connections && s.target == target)
        .collect();
    if runs.is_empty() {
        return None;
    }
    let of = |field: fn(&Sample) -> f64| median(runs.iter().map(|s| field(s)).collect());
    Some(Median {
        requests_per_second: of(|s| s.run.requests_per_second),
        p50_us: of(|s| s.run.p50_us),
        p99_us: of(|s| s.run.p99_us),
        cpu_us_per_request: of(|s| s.cpu_us_per_request),
        user_us_per_request: of(|s| s.user_us_per_request),
    })
}

fn ms(us: f64) -> String {
    format!("{:.2}", us / 1000.0)
}

/// Every run, in the order it ran.
pub fn runs_table(samples: &[Sample]) -> String {
    let mut out = String::from(
        "| round | path | conns | server | req/s | p50 ms | p99 ms | CPU µs/req | user µs/req | B/resp | errors |\n\
         |---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for s in samples {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} | {} | {} | {:.1} | {:.1} | {:.0} | {} |",
            s.round,
            s.path,
            s.connections,
            s.target,
            s.run.requests_per_second,
            ms(s.run.p50_us),
            ms(s.run.p99_us),
            s.cpu_us_per_request,
            s.user_us_per_request,
            s.run.bytes_per_request,
            s.run.errors,
        );
    }
    out
}

/// Medians per (path, connections, server), then queuegate relative to nginx.
pub fn summary(
    samples: &[Sample],
    paths: &[&'static str],
    connections: &[u32],
    targets: &[&'static str],
) -> String {
    let mut out = String::from(
        "| path | conns | server | req/s | p50 ms | p99 ms | CPU µs/req | user µs/req |\n\
         |---|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for &path in paths {
        for &conns in connections {
            for &target in targets {
                if let Some(m) = cell(samples, path, conns, target) {
                    let _ = writeln!(
                        out,
                        "| {path} | {conns} | {target} | {:.0} | {} | {} | {:.1} | {:.1} |",
                        m.requests_per_second,
                        ms(m.p50_us),
                        ms(m.p99_us),
                        m.cpu_us_per_request,
                        m.user_us_per_request,
                    );
                }
            }
        }
    }
    let ours: Vec<&str> = ["plain", "queuegate"]
        .into_iter()
        .filter(|t| targets.contains(t))
        .collect();
    if !ours.is_empty() && targets.contains(&"nginx") {
        out.push_str(
            "\nqueuegate ÷ nginx (of the medians; req/s above 1 is better, p99 and CPU below 1 are better; \
             `plain` is queuegate without a route, `queuegate` its admitted path):\n\n\
             | path | conns | server | req/s ratio | p99 ratio | CPU ratio | user CPU ratio |\n\
             |---|---:|---|---:|---:|---:|---:|\n",
        );
        for &path in paths {
            for &conns in connections {
                for &target in &ours {
                    let (Some(q), Some(n)) = (
                        cell(samples, path, conns, target),
                        cell(samples, path, conns, "nginx"),
                    ) else {
                        continue;
                    };
                    let _ = writeln!(
                        out,
                        "| {path} | {conns} | {target} | {:.2} | {:.2} | {:.2} | {:.2} |",
                        q.requests_per_second / n.requests_per_second,
                        q.p99_us / n.p99_us,
                        q.cpu_us_per_request / n.cpu_us_per_request,
                        q.user_us_per_request / n.user_us_per_request,
                    );
                }
            }
        }
    }
    out
}

/// The machine and method, for the README.
pub struct Setup {
    pub rounds: u32,
    pub duration_secs: u64,
    pub threads: u32,
    pub connections: Vec<u32>,
    pub clock_ticks: f64,
}

/// Replaces the results section of `readme` (between the markers, or
/// appended if they are missing) with this run's summary and runs.
pub fn write_readme(readme: &Path, setup: &Setup, summary: &str, runs: &str) -> Result<()> {
    let section = results_section(setup, summary, runs);
    let current = fs::read_to_string(readme).unwrap_or_default();
    let updated = match (current.find(BEGIN), current.find(END)) {
        (Some(begin), Some(end)) if begin < end => {
            format!(
                "{}{section}{}",
                &current[..begin],
                &current[end + END.len()..]
            )
        }
        _ => format!("{}\n{section}\n", current.trim_end()),
    };
    fs::write(readme, updated).with_context(|| format!("writing {}", readme.display()))
}

fn results_section(setup: &Setup, summary: &str, runs: &str) -> String {
    let cpu_model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, model)| model.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let nginx = command_line("/usr/sbin/nginx", &["-v"]);
    let wrk = command_line("wrk", &["-v"]);
    let wrk = wrk
        .split(" Copyright")
        .next()
        .unwrap_or_default()
        .to_string();
    let commit = command_line("git", &["rev-parse", "--short", "HEAD"]);
    let connections: Vec<String> = setup.connections.iter().map(u32::to_string).collect();
    format!(
        "{BEGIN}\n\
         ### Results, {date}\n\n\
         Machine: {cpus} CPUs (`nproc`), {cpu_model}; {nginx}; {wrk}; queuegate at {commit}.\n\
         Load generator and servers share these CPUs, so the numbers are relative, not absolute.\n\n\
         Run: {rounds} rounds × {duration} s per wrk run, `-t{threads}`, connections {conns}, \
         CPU from `/proc/<pid>/stat` at {ticks} ticks/s.\n\n\
         Medians:\n\n{summary}\n\
         <details><summary>Every run</summary>\n\n{runs}\n</details>\n\
         {END}",
        date = today(),
        rounds = setup.rounds,
        duration = setup.duration_secs,
        threads = setup.threads,
        conns = connections.join(", "),
        ticks = setup.clock_ticks,
    )
}

/// The first line a command prints (stdout or stderr), or "unknown".
pub fn command_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .and_then(|out| {
            let text = if out.stdout.is_empty() {
                out.stderr
            } else {
                out.stdout
            };
            String::from_utf8(text)
                .ok()?
                .lines()
                .next()
                .map(|line| line.trim().to_string())
        })
        .filter(|line| !line.is_empty())
        .unwrap_or_else(|| format!("{program} unknown"))
}

/// Today's UTC date as `YYYY-MM-DD` (days-to-civil, proleptic Gregorian).
pub fn today() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let days = (secs / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
