//! One bounded `wrk --latency` run and the numbers read from its output.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Time a run may take beyond its duration before wrk is killed.
const OVERRUN: Duration = Duration::from_secs(30);

/// What one wrk run measured.
#[derive(Clone, Debug)]
pub struct WrkRun {
    pub requests: u64,
    pub requests_per_second: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Bytes read (status line, headers and body) per request.
    pub bytes_per_request: f64,
    /// Responses with status ≥ 400 plus socket errors (connect, read, write, timeout).
    pub errors: u64,
}

/// Runs `wrk -t<threads> -c<connections> -d<duration>s --latency url`, with
/// an optional extra header, and kills it if it overruns.
pub fn run(
    wrk: &Path,
    threads: u32,
    connections: u32,
    duration: Duration,
    url: &str,
    header: Option<&str>,
) -> Result<WrkRun> {
    run_with_script(wrk, threads, connections, duration, url, header, None).map(|(run, _)| run)
}

/// [`run`] with an optional Lua script (`-s`); returns wrk's whole output
/// too, for what the script prints.
pub fn run_with_script(
    wrk: &Path,
    threads: u32,
    connections: u32,
    duration: Duration,
    url: &str,
    header: Option<&str>,
    script: Option<&Path>,
) -> Result<(WrkRun, String)> {
    let mut command = Command::new(wrk);
    command
        .arg(format!("-t{threads}"))
        .arg(format!("-c{connections}"))
        .arg(format!("-d{}s", duration.as_secs().max(1)))
        .arg("--latency");
    if let Some(header) = header {
        command.arg("-H").arg(header);
    }
    if let Some(script) = script {
        command.arg("-s").arg(script);
    }
    let mut child = command
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", wrk.display()))?;
    let mut stdout = child.stdout.take().context("wrk stdout")?;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let deadline = Instant::now() + duration + OVERRUN;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("wrk overran {duration:?} by more than {OVERRUN:?} on {url}; killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = match reader.join() {
        Ok(read) => read.context("reading wrk output")?,
        Err(_) => bail!("wrk output reader panicked"),
    };
    if !status.success() {
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        bail!("wrk failed ({status}) on {url}: {stderr}{output}");
    }
    let run = parse(&output).with_context(|| format!("unexpected wrk output:\n{output}"))?;
    Ok((run, output))
}

/// Reads the summary wrk 4 prints with `--latency`.
fn parse(output: &str) -> Result<WrkRun> {
    let mut requests = None;
    let mut bytes = None;
    let mut requests_per_second = None;
    let mut p50_us = None;
    let mut p99_us = None;
    let mut errors = 0;
    for line in output.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            // "123456 requests in 5.00s, 12.34MB read"
            [count, "requests", "in", _, size, "read"] => {
                requests = Some(count.parse::<u64>()?);
                bytes = Some(parse_bytes(size)?);
            }
            ["Requests/sec:", rate] => requests_per_second = Some(rate.parse::<f64>()?),
            ["50%", latency] => p50_us = Some(parse_micros(latency)?),
            ["99%", latency] => p99_us = Some(parse_micros(latency)?),
            ["Non-2xx", "or", "3xx", "responses:", count] => errors += count.parse::<u64>()?,
            // "Socket errors: connect 0, read 0, write 0, timeout 0"
            ["Socket", "errors:", rest @ ..] => {
                for count in rest.iter().skip(1).step_by(2) {
                    errors += count.trim_end_matches(',').parse::<u64>()?;
                }
            }
            _ => {}
        }
    }
    let requests = requests.context("no request count")?;
    if requests == 0 {
        bail!("wrk completed no requests");
    }
    Ok(WrkRun {
        requests,
        requests_per_second: requests_per_second.context("no Requests/sec")?,
        p50_us: p50_us.context("no 50% latency")?,
        p99_us: p99_us.context("no 99% latency")?,
        bytes_per_request: bytes.context("no bytes read")? / requests as f64,
        errors,
    })
}

/// wrk's latencies: `812.00us`, `1.23ms`, `2.00s`, `1.00m`.
fn parse_micros(text: &str) -> Result<f64> {
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .with_context(|| format!("latency without unit: {text}"))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse()?;
    let scale = match unit {
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" => 60e6,
        "h" => 3600e6,
        _ => bail!("unknown latency unit in {text}"),
    };
    Ok(number * scale)
}

/// wrk's byte counts: `512.00B`, `1.23KB`, `12.34MB`, `1.01GB` (powers of 1024).
fn parse_bytes(text: &str) -> Result<f64> {
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .with_context(|| format!("size without unit: {text}"))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse()?;
    let scale = match unit {
        "B" => 1.0,
        "KB" => 1024.0,
        "MB" => 1024.0 * 1024.0,
        "GB" => 1024.0 * 1024.0 * 1024.0,
        "TB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => bail!("unknown size unit in {text}"),
    };
    Ok(number * scale)
}
