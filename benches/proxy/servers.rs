//! The three servers under test: the nginx origin, nginx as a reverse proxy, and queuegate.

use std::fs::{self, File};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context, Result};

use crate::http;
use crate::process::{free_port, Process};

/// The `/small` body: 99 bytes, no characters nginx would need escaped.
pub const SMALL_BODY: &str =
    "queuegate benchmark small response: one hundred bytes of plain text, returned by the origin server!";
/// The size of the `/large` static file.
pub const LARGE_LEN: usize = 16 * 1024;
/// The gated route's name, and so its cookie `qg_bench`.
pub const ROUTE: &str = "bench";
const KEY_ENV: &str = "QUEUEGATE_KEY_BENCH";

/// A running server with its address.
pub struct Server {
    pub process: Process,
    pub addr: SocketAddr,
}

/// A directory for one nginx instance (`-p` prefix): config, logs, pid file,
/// temp paths. Readable by nginx's unprivileged workers.
fn nginx_prefix(root: &Path, name: &str) -> Result<PathBuf> {
    let prefix = root.join(name);
    // nginx opens `<prefix>/logs/error.log` before it reads the config.
    fs::create_dir_all(prefix.join("logs"))?;
    fs::set_permissions(&prefix, fs::Permissions::from_mode(0o755))?;
    Ok(prefix)
}

/// An nginx config: `workers` worker processes (`1` or `auto`), its pid
/// file and error log under `prefix`, keep-alive as a browser-facing server
/// keeps it, and `http` inside the `http` block.
fn nginx_config(prefix: &Path, workers: &str, http: &str) -> String {
    format!(
        r#"daemon off;
master_process on;
worker_processes {workers};
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 100000;
    keepalive_timeout 75s;
{http}
}}
"#,
        prefix = prefix.display(),
    )
}

fn spawn_nginx(nginx: &Path, prefix: &Path, name: &str, config: &str) -> Result<Process> {
    let conf = prefix.join(format!("{name}.conf"));
    fs::write(&conf, config)?;
    let stderr = prefix.join("logs/stderr.log");
    let child = Command::new(nginx)
        .arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(prefix)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&stderr)?)
        .spawn()
        .with_context(|| format!("starting {}", nginx.display()))?;
    Ok(Process::new(
        name,
        child,
        vec![stderr, prefix.join("logs/error.log")],
    ))
}

/// The origin: one nginx worker answering `/small` from memory and `/large`
/// from a 16 KiB file.
pub fn start_origin(nginx: &Path, root: &Path) -> Result<Server> {
    // The temp dir itself must be traversable by nginx's workers.
    fs::set_permissions(root, fs::Permissions::from_mode(0o755))?;
    let prefix = nginx_prefix(root, "origin")?;
    let www = prefix.join("www");
    fs::create_dir_all(&www)?;
    let large: Vec<u8> = (0..LARGE_LEN).map(|i| b'a' + (i % 26) as u8).collect();
    fs::write(www.join("large"), large)?;
    let port = free_port()?;
    let http = format!(
        r#"    sendfile on;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        default_type text/plain;
        location /small {{ return 200 "{SMALL_BODY}"; }}
        location = /large {{ root {www}; }}
    }}"#,
        www = www.display(),
    );
    let config = nginx_config(&prefix, "1", &http);
    let process = spawn_nginx(nginx, &prefix, "origin", &config)?;
    let server = ready(process, port)?;
    check_bodies(&server, &[])?;
    Ok(server)
}

/// nginx as a keep-alive reverse proxy to the origin, one worker per CPU.
pub fn start_nginx_proxy(nginx: &Path, root: &Path, origin: SocketAddr) -> Result<Server> {
    let forwarded = "proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Forwarded-Host $host;";
    start_nginx_with(nginx, root, "nginx", origin, "", forwarded)
}

/// nginx as a keep-alive reverse proxy to the origin with a micro-cache:
/// `proxy_cache_valid 1s` for every status it caches, `proxy_cache_lock on`
/// (one request fills an entry while the others wait for it), its files in
/// `cache_dir` (put it on a tmpfs, such as /dev/shm), one worker per CPU.
#[allow(dead_code)] // for the micro-cache bench
pub fn start_nginx_cache(
    nginx: &Path,
    root: &Path,
    origin: SocketAddr,
    cache_dir: &Path,
) -> Result<Server> {
    // nginx's unprivileged workers write the cache files.
    fs::set_permissions(cache_dir, fs::Permissions::from_mode(0o777))?;
    let http = format!(
        "proxy_cache_path {} levels=1:2 keys_zone=micro:10m max_size=64m inactive=10s use_temp_path=off;",
        cache_dir.display()
    );
    let location = "proxy_cache micro;
            proxy_cache_valid 200 301 404 1s;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 5s;";
    start_nginx_with(nginx, root, "nginx-cache", origin, &http, location)
}

/// nginx named `name` proxying to the origin over keep-alive connections,
/// one worker per CPU, with `http` added to its `http` block and `location`
/// to its one location.
fn start_nginx_with(
    nginx: &Path,
    root: &Path,
    name: &str,
    origin: SocketAddr,
    http: &str,
    location: &str,
) -> Result<Server> {
    let prefix = nginx_prefix(root, name)?;
    let port = free_port()?;
    let http = format!(
        r#"    {http}
    upstream origin {{
        server {origin};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            {location}
        }}
    }}"#
    );
    let config = nginx_config(&prefix, "auto", &http);
    let process = spawn_nginx(nginx, &prefix, name, &config)?;
    let server = ready(process, port)?;
    check_bodies(&server, &[])?;
    Ok(server)
}

/// queuegate in front of the origin. `gated`: one gated route over
/// everything, and the admission cookie (`qg_bench=…`) that lets a client
/// through without a store call is returned with it. Not gated: no route, the
/// transparent proxy alone.
pub fn start_queuegate(
    binary: &Path,
    root: &Path,
    origin: SocketAddr,
    gated: bool,
) -> Result<(Server, Option<String>)> {
    start_queuegate_with(binary, root, origin, gated.then_some(""))
}

/// [`start_queuegate`], the gated route (when `route` is given) with the
/// YAML lines `route` adds to it (each indented by four spaces), such as
/// its `cache`.
pub fn start_queuegate_with(
    binary: &Path,
    root: &Path,
    origin: SocketAddr,
    route: Option<&str>,
) -> Result<(Server, Option<String>)> {
    let Some(extra) = route else {
        let server = start_queuegate_config(binary, root, "queuegate-plain", origin, "")?;
        check_bodies(&server, &[])?;
        return Ok((server, None));
    };
    let routes = format!(
        r#"routes:
  - name: {ROUTE}
    match: {{ path_prefix: / }}
    capacity: 100000
    pass_ttl: 1h
    session_ttl: 2h
{extra}"#
    );
    let server = start_queuegate_config(binary, root, "queuegate", origin, &routes)?;
    let cookie_name = format!("qg_{ROUTE}");
    let first = http::get(server.addr, "/small", &[])?;
    let pass = first.cookie(&cookie_name).with_context(|| {
        format!(
            "queuegate answered {} to a first visit without a `{cookie_name}` cookie",
            first.status
        )
    })?;
    ensure!(
        first.status == 200,
        "queuegate answered {} to a first visit with free capacity (expected 200 and a pass)",
        first.status
    );
    // A pass given at once is confirmed by the visitor's first return, which
    // renews it through the store; the confirmed pass is what a browser
    // holds from then on, and what wrk sends.
    let back = http::get(
        server.addr,
        "/small",
        &[format!("Cookie: {cookie_name}={pass}")],
    )?;
    let pass = back.cookie(&cookie_name).with_context(|| {
        format!(
            "queuegate answered {} to a first return without a confirmed `{cookie_name}` pass",
            back.status
        )
    })?;
    ensure!(pass.starts_with("v1.a."), "not a confirmed pass: {pass}");
    let cookie = format!("{cookie_name}={pass}");
    check_bodies(&server, &[format!("Cookie: {cookie}")])?;
    Ok((server, Some(cookie)))
}

/// nginx answering `GET path` from memory with `body` as `application/json`
/// (and `Cache-Control: no-store`), one worker per CPU: what an answer
/// queuegate makes itself would cost as a static one.
#[allow(dead_code)] // for the status polls bench
pub fn start_nginx_static(nginx: &Path, root: &Path, path: &str, body: &str) -> Result<Server> {
    ensure!(
        !body.contains('\'') && !body.contains('\\'),
        "the static body must need no escaping in nginx's config: {body}"
    );
    let prefix = nginx_prefix(root, "nginx-static")?;
    let port = free_port()?;
    let http = format!(
        r#"    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location = {path} {{
            default_type application/json;
            add_header Cache-Control "no-store";
            return 200 '{body}';
        }}
        location / {{ return 404; }}
    }}"#
    );
    let config = nginx_config(&prefix, "auto", &http);
    let process = spawn_nginx(nginx, &prefix, "nginx-static", &config)?;
    ready(process, port)
}

/// queuegate in front of the origin, in `root/<name>`, with `routes` (YAML
/// from `routes:` on, or nothing) and the memory store; its route's key is
/// `bench`.
pub fn start_queuegate_config(
    binary: &Path,
    root: &Path,
    name: &str,
    origin: SocketAddr,
    routes: &str,
) -> Result<Server> {
    ensure!(
        binary.is_file(),
        "queuegate binary not found at {}; build it with `cargo build --release`",
        binary.display()
    );
    let dir = root.join(name);
    fs::create_dir_all(&dir)?;
    let keygen = Command::new(binary)
        .arg("keygen")
        .output()
        .context("running `queuegate keygen`")?;
    let key = String::from_utf8(keygen.stdout)?.trim().to_string();
    if !keygen.status.success() || key.is_empty() {
        bail!(
            "`queuegate keygen` failed ({}): {}",
            keygen.status,
            String::from_utf8_lossy(&keygen.stderr)
        );
    }
    let port = free_port()?;
    // Two instances may run side by side: each gets its own admin port.
    let admin_port = free_port()?;
    let config = format!(
        r#"listen:
  - addr: 127.0.0.1:{port}
admin:
  addr: 127.0.0.1:{admin_port}
limits:
  drain_timeout: 1s
upstream:
  url: http://{origin}
  pool: {{ max_idle_per_host: 512 }}
store:
  backend: memory
keys:
  - {{ id: bench, env: {KEY_ENV} }}
{routes}"#
    );
    let conf = dir.join("queuegate.yaml");
    fs::write(&conf, config)?;
    let log = dir.join("queuegate.log");
    let child = Command::new(binary)
        .arg("run")
        .arg("-c")
        .arg(&conf)
        .env(KEY_ENV, &key)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(File::create(&log)?)
        .stderr(File::create(dir.join("queuegate.err"))?)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let process = Process::new("queuegate", child, vec![log, dir.join("queuegate.err")]);
    ready(process, port)
}

fn ready(mut process: Process, port: u16) -> Result<Server> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    http::wait_ready(&mut process, addr, "/small")?;
    Ok(Server { process, addr })
}

/// Both paths answer `200` with the origin's exact bodies (through a proxy
/// too), so every measured request is a full pass through the server.
pub fn check_bodies(server: &Server, headers: &[String]) -> Result<()> {
    for (path, len) in [("/small", SMALL_BODY.len()), ("/large", LARGE_LEN)] {
        let response = http::get(server.addr, path, headers)?;
        ensure!(
            response.status == 200 && response.body.len() == len,
            "{} answered {} with {} bytes to GET {path} (expected 200 with {len}){}",
            server.process.name(),
            response.status,
            response.body.len(),
            server.process.log_tail()
        );
        if path == "/small" {
            ensure!(
                response.body == SMALL_BODY.as_bytes(),
                "{} changed the /small body",
                server.process.name()
            );
        }
        if let Some(renewed) = response
            .headers
            .iter()
            .find(|(name, _)| name == "set-cookie")
        {
            bail!(
                "{} set a cookie on a request that should be plainly forwarded: {}",
                server.process.name(),
                renewed.1.split('=').next().unwrap_or_default()
            );
        }
    }
    Ok(())
}
