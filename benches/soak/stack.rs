//! The servers under the soak and the faults done to them: a `redis-server`
//! (paused, killed and started again on its port), and one queuegate on it
//! whose config file is edited while it runs (capacity up and down, a new
//! key put first in the ring).

use std::fmt::Write as _;
use std::fs::{self, File};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::http as probe;
use crate::process::{free_port, Process};

/// The gated route, its path, and so its cookie `qg_soak`.
pub const ROUTE: &str = "soak";
pub const GATED_PATH: &str = "/event";
/// Forwarded without a route: the wrk load, the slow readers and the tunnels.
pub const LOAD_PATH: &str = "/load";

/// How long an effect of a config edit may take to show (file watch, reload).
const RELOAD_DEADLINE: Duration = Duration::from_secs(15);

/// One `redis-server`, persistence off, on a fixed port and dir so that it
/// can be started again where it was (empty: a killed Redis lost its data).
pub struct Redis {
    pub port: u16,
    dir: PathBuf,
    process: Option<Process>,
}

impl Redis {
    pub fn start(root: &Path) -> Result<Self> {
        let dir = root.join("redis");
        fs::create_dir_all(&dir)?;
        let mut redis = Self {
            port: free_port()?,
            dir,
            process: None,
        };
        redis.spawn()?;
        Ok(redis)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> Result<()> {
        let log = self.dir.join("redis.log");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--protected-mode", "no", "--maxclients", "10000"])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(File::create(&log)?)
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server (Debian package `redis-server`)")?;
        let mut process = Process::new("redis-server", child, vec![log]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.ping().is_err() {
            process.ensure_running()?;
            ensure!(
                Instant::now() < deadline,
                "redis-server never answered PING"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.process = Some(process);
        Ok(())
    }

    fn ping(&self) -> redis::RedisResult<String> {
        let client = redis::Client::open(self.url())?;
        let mut con = client.get_connection_with_timeout(Duration::from_millis(500))?;
        redis::cmd("PING").query(&mut con)
    }

    /// `SIGSTOP`, `pause`, `SIGCONT`: Redis hangs without closing anything.
    pub fn pause(&mut self, pause: Duration) -> Result<()> {
        let process = self
            .process
            .as_mut()
            .context("redis-server is not running")?;
        process.signal("STOP");
        // Continued even if this thread panics while it sleeps.
        let _resume = Resume(process);
        std::thread::sleep(pause);
        Ok(())
    }

    /// `SIGKILL`, `down` without Redis, then an empty one on the same port.
    pub fn kill_and_restart(&mut self, down: Duration) -> Result<()> {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
        std::thread::sleep(down);
        self.spawn()
    }

    /// `redis-server --version`'s first line, for the report.
    pub fn version() -> String {
        Command::new("redis-server")
            .arg("--version")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| {
                text.split_whitespace()
                    .find_map(|word| word.strip_prefix("v=").map(str::to_owned))
            })
            .map_or_else(
                || "Redis (version unknown)".to_owned(),
                |v| format!("Redis {v}"),
            )
    }
}

/// Sends `SIGCONT` when dropped.
struct Resume<'a>(&'a Process);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.signal("CONT");
    }
}

/// What the config says now; the file is written again from it on each edit.
struct Settings {
    capacity: u64,
    /// Key ids, the first signs.
    keys: Vec<String>,
}

/// The optional `limits` (DESIGN §8.4) set when the binary knows them: a
/// slow reader is dropped after `send_timeout`, an idle HTTP/2 connection
/// after `idle_timeout`.
pub const CONNECTION_LIMITS: &str =
    "idle_timeout: 20s, send_timeout: 10s, tunnel_idle_timeout: 60s";

/// queuegate on the Redis store, with its config file and key files.
pub struct Gate {
    pub process: Process,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    files: ConfigFiles,
}

/// The config file and key files of one queuegate, written again from
/// `settings` on every edit.
struct ConfigFiles {
    addr: SocketAddr,
    admin: SocketAddr,
    dir: PathBuf,
    config: PathBuf,
    upstream: SocketAddr,
    redis_url: String,
    /// `CONNECTION_LIMITS`, if this build accepts them.
    connection_limits: bool,
    settings: Settings,
}

impl Gate {
    pub fn start(
        binary: &Path,
        root: &Path,
        upstream: SocketAddr,
        redis_url: &str,
        capacity: u64,
    ) -> Result<Self> {
        ensure!(
            binary.is_file(),
            "queuegate binary not found at {}; build it with `cargo build --release`",
            binary.display()
        );
        let dir = root.join("queuegate");
        fs::create_dir_all(&dir)?;
        let mut files = ConfigFiles {
            addr: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
            admin: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
            config: dir.join("queuegate.yaml"),
            dir,
            upstream,
            redis_url: redis_url.to_owned(),
            connection_limits: false,
            settings: Settings {
                capacity,
                keys: Vec::new(),
            },
        };
        files.add_key()?;
        files.connection_limits = files.accepts_connection_limits(binary)?;
        files.write()?;
        let log = files.dir.join("queuegate.log");
        let err = files.dir.join("queuegate.err");
        let child = Command::new("sh")
            .arg("-c")
            .arg("ulimit -n \"$(ulimit -Hn)\"; exec \"$0\" run -c \"$1\"")
            .arg(binary)
            .arg(&files.config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(File::create(&log)?)
            .stderr(File::create(&err)?)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut process = Process::new("queuegate", child, vec![log, err]);
        probe::wait_ready(&mut process, files.addr, LOAD_PATH)?;
        Ok(Self {
            process,
            addr: files.addr,
            admin: files.admin,
            files,
        })
    }

    /// Whether the optional connection limits are in the config.
    pub fn connection_limits(&self) -> bool {
        self.files.connection_limits
    }

    pub fn capacity(&self) -> u64 {
        self.files.settings.capacity
    }
    /// Edits the capacity in the watched file; returns how long until the
    /// admin listener's `/routes` showed it.
    pub fn set_capacity(&mut self, capacity: u64) -> Result<Duration> {
        self.files.settings.capacity = capacity;
        self.files.write()?;
        let edited = Instant::now();
        let wanted = serde_json::json!(capacity);
        loop {
            let routes = probe::get(self.admin, "/routes", &[])?;
            ensure!(routes.status == 200, "/routes answered {}", routes.status);
            let body: serde_json::Value =
                serde_json::from_slice(&routes.body).context("/routes is not JSON")?;
            let shown = body["routes"]
                .as_array()
                .and_then(|routes| routes.iter().find(|r| r["name"] == ROUTE))
                .map(|route| route["capacity"].clone());
            if shown.as_ref() == Some(&wanted) {
                return Ok(edited.elapsed());
            }
            if edited.elapsed() > RELOAD_DEADLINE {
                bail!(
                    "capacity {capacity} not in /routes {RELOAD_DEADLINE:?} after the edit{}",
                    self.process.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A new key file, its id put first in the config's ring, then
    /// `SIGHUP`; returns the new id and how long until a new visitor's cookie
    /// was signed with it.
    pub fn rotate_key(&mut self) -> Result<(String, Duration)> {
        let id = self.files.add_key()?;
        self.files.write()?;
        let edited = Instant::now();
        self.process.signal("HUP");
        loop {
            // One visit without cookies: its ticket or pass names the key.
            let answer = probe::get(self.addr, GATED_PATH, &["Accept: text/html".to_owned()])?;
            let kid = answer
                .cookie(&format!("qg_{ROUTE}"))
                .and_then(|value| value.split('.').nth(5).map(str::to_owned));
            if kid.as_deref() == Some(id.as_str()) {
                return Ok((id, edited.elapsed()));
            }
            if edited.elapsed() > RELOAD_DEADLINE {
                bail!(
                    "key {id} not signing {RELOAD_DEADLINE:?} after the edit (saw {kid:?}){}",
                    self.process.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl ConfigFiles {
    /// The config as YAML; `limits` with the optional connection limits.
    fn yaml(&self, connection_limits: bool) -> String {
        let mut y = String::new();
        let _ = writeln!(y, "listen: [{{ addr: \"{}\" }}]", self.addr);
        let _ = writeln!(y, "admin: {{ addr: \"{}\" }}", self.admin);
        let extra = if connection_limits {
            format!(", {CONNECTION_LIMITS}")
        } else {
            String::new()
        };
        let _ = writeln!(
            y,
            "limits: {{ max_connections: 4096, header_timeout: 10s, drain_timeout: 2s{extra} }}"
        );
        let _ = writeln!(
            y,
            "upstream: {{ url: \"http://{}\", connect_timeout: 1s, timeout: 10s, \
             pool: {{ max_idle_per_host: 128 }} }}",
            self.upstream
        );
        let _ = writeln!(
            y,
            "store: {{ backend: redis, redis: {{ url: \"{}\", timeout: 200ms }} }}",
            self.redis_url
        );
        let _ = writeln!(y, "keys:");
        for id in &self.settings.keys {
            let _ = writeln!(
                y,
                "  - {{ id: {id}, file: \"{}\" }}",
                self.key_file(id).display()
            );
        }
        let capacity = self.settings.capacity;
        let _ = writeln!(y, "routes:");
        let _ = writeln!(y, "  - name: {ROUTE}");
        let _ = writeln!(y, "    match: {{ path_prefix: {GATED_PATH} }}");
        let _ = writeln!(y, "    capacity: {capacity}");
        let _ = writeln!(y, "    max_admit_per_tick: {capacity}");
        let _ = writeln!(y, "    tick: 100ms");
        let _ = writeln!(y, "    session_ttl: 5s");
        let _ = writeln!(y, "    pass_ttl: 2s");
        let _ = writeln!(y, "    arrival_grace: 10s");
        let _ = writeln!(y, "    abandon_after: 30s");
        let _ = writeln!(y, "    on_store_error: local");
        // The whole crowd comes from 127.0.0.1, one client as far as the
        // per-client limits go: they are off here, as in the crowd bench.
        let _ = writeln!(y, "    client_limits: {{ places: 0, joins_per_minute: 0 }}");
        y
    }

    fn key_file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.key"))
    }

    /// Writes a new key file and puts its id first in the ring (not yet in
    /// the config file).
    fn add_key(&mut self) -> Result<String> {
        let id = format!("k{}", self.settings.keys.len() + 1);
        fs::write(self.key_file(&id), format!("{}\n", crate::fleet::run_key()))?;
        self.settings.keys.insert(0, id.clone());
        Ok(id)
    }

    /// Whether `queuegate check` accepts the optional connection limits.
    fn accepts_connection_limits(&self, binary: &Path) -> Result<bool> {
        let probe = self.dir.join("probe.yaml");
        fs::write(&probe, self.yaml(true))?;
        let status = Command::new(binary)
            .arg("check")
            .arg("-c")
            .arg(&probe)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("running `queuegate check`")?;
        let _ = fs::remove_file(&probe);
        Ok(status.success())
    }

    /// Writes the config file through a rename, as an editor or a config
    /// manager would, so the watcher never reads half a file.
    fn write(&self) -> Result<()> {
        let next = self.dir.join("queuegate.yaml.next");
        fs::write(&next, self.yaml(self.connection_limits))?;
        fs::rename(&next, &self.config)?;
        Ok(())
    }
}
