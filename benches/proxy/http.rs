//! A one-shot HTTP/1.1 client over `TcpStream`: readiness polls and response checks.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::process::Process;

/// How long one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a server may take to start answering.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between readiness attempts.
const READY_POLL: Duration = Duration::from_millis(25);

/// A response read to its end.
pub struct Response {
    pub status: u16,
    /// Header lines as (lower-cased name, value).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The value of the first `Set-Cookie` for `name`, without its attributes.
    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .filter(|(header, _)| header == "set-cookie")
            .find_map(|(_, value)| {
                let pair = value.split(';').next()?.trim();
                let (key, cookie) = pair.split_once('=')?;
                (key == name).then_some(cookie)
            })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(header, _)| header == name)
            .map(|(_, value)| value.as_str())
    }
}

/// `GET path` with `Connection: close` and the given extra header lines.
pub fn get(addr: SocketAddr, path: &str, extra_headers: &[String]) -> Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for header in extra_headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse(&raw).with_context(|| format!("GET {path} from {addr}"))
}

/// Polls `GET path` until the server answers at all (any status), failing
/// early with its logs if the process exits.
pub fn wait_ready(server: &mut Process, addr: SocketAddr, path: &str) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        server.ensure_running()?;
        match get(addr, path, &[]) {
            Ok(_) => return Ok(()),
            Err(error) if Instant::now() >= deadline => {
                bail!(
                    "{} did not answer on {addr} within {READY_TIMEOUT:?}: {error:#}{}",
                    server.name(),
                    server.log_tail()
                )
            }
            Err(_) => std::thread::sleep(READY_POLL),
        }
    }
}

fn parse(raw: &[u8]) -> Result<Response> {
    let split = raw
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .context("no end of header section")?;
    let head = std::str::from_utf8(&raw[..split]).context("header section is not UTF-8")?;
    let rest = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let headers = lines
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_ascii_lowercase(), value.trim().to_string()))
        })
        .collect();
    let mut response = Response {
        status,
        headers,
        body: Vec::new(),
    };
    response.body = if response
        .header("transfer-encoding")
        .is_some_and(|coding| coding.eq_ignore_ascii_case("chunked"))
    {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    if let Some(length) = response.header("content-length") {
        let length: usize = length.parse().context("bad content-length")?;
        if length != response.body.len() {
            bail!(
                "content-length {length} but {} body bytes",
                response.body.len()
            );
        }
    }
    Ok(response)
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|window| window == b"\r\n")
            .context("truncated chunk size")?;
        let size_text = std::str::from_utf8(&rest[..line_end])?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).context("bad chunk size")?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = rest.get(..size).context("truncated chunk")?;
        body.extend_from_slice(chunk);
        rest = rest.get(size + 2..).context("truncated chunk")?;
    }
}
