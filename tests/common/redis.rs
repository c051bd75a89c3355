//! Real `redis-server` processes for tests: a standalone server, a
//! three-node Cluster and a master/replica/sentinel trio, each on free
//! loopback ports in a temp dir with persistence off, killed by PID on drop.
//!
//! `redis-server` binds the port it is given, so a port is picked here: it
//! can be taken by another test before the server binds it. A server that
//! fails to bind is started again on another port, and a server counts as
//! up only once the one answering on the port reports the child's PID.
//!
//! A missing `redis-server` binary is a loud failure that names the Debian
//! package, never a skip. Start-up waits by polling the server, not by
//! sleeping a fixed time.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use queuegate::config::{RedisConfig, RedisMode};

/// How long a server may take to answer after start.
const START_DEADLINE: Duration = Duration::from_secs(20);

/// How many ports a server is tried on before giving up.
const PORT_ATTEMPTS: usize = 20;

fn redis_binary(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    match found {
        Some(path) => path,
        None => panic!(
            "`{name}` not found on PATH: the Redis store tests need a real Redis. \
             Install it with `apt-get install redis-server` (Debian/Ubuntu)."
        ),
    }
}

/// A loopback port nobody listens on now (and, with `bus`, port + 10000 too,
/// for a Cluster node's bus). Someone may bind it before the caller does:
/// see [`RedisServer::try_start`].
pub fn free_port(bus: bool) -> u16 {
    for _ in 0..200 {
        let Ok(listener) = TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(addr) = listener.local_addr() else {
            continue;
        };
        let port = addr.port();
        if !bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port found");
}

/// Sends one command in RESP and returns the raw reply, or None if the server
/// does not answer (yet).
fn raw_command(port: u16, args: &[&str]) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    let mut request = format!("*{}\r\n", args.len());
    for a in args {
        request.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    stream.write_all(request.as_bytes()).ok()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    // Read until the reply looks complete: a line-type reply ends at its
    // first CRLF; a bulk reply once its announced length has arrived.
    loop {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
        if reply_complete(&reply) {
            break;
        }
    }
    String::from_utf8(reply).ok()
}

fn reply_complete(reply: &[u8]) -> bool {
    let Some(first_crlf) = reply.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    match reply.first() {
        Some(b'$') => {
            let len: i64 = std::str::from_utf8(&reply[1..first_crlf])
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            len < 0 || reply.len() >= first_crlf + 2 + len as usize + 2
        }
        _ => true,
    }
}

fn wait_until(what: &str, deadline: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        if start.elapsed() > deadline {
            panic!("timed out waiting until {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("the `kill` command runs");
    assert!(status.success(), "kill {sig} {pid} failed");
}

/// One `redis-server` process.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    /// A config file (first argument, as redis-server wants), if any.
    conf: Option<PathBuf>,
    extra: Vec<String>,
    paused: bool,
    /// While killed: the port, bound and not listening, so connecting is
    /// refused as at a dead server and no server another test starts
    /// meanwhile takes the address a client of this one still remembers
    /// (a client that reconnected to a stranger would see an empty store).
    held: Option<tokio::net::TcpSocket>,
}

/// `port` bound without listening (see `RedisServer::held`); `None` if
/// something else took it first.
fn hold_port(port: u16) -> Option<tokio::net::TcpSocket> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind(([127, 0, 0, 1], port).into()).ok()?;
    Some(socket)
}

/// How a launch ended.
enum Launch {
    /// The child answers on its port.
    Up,
    /// The child could not bind its port: someone else holds it.
    PortTaken,
}

impl RedisServer {
    /// A standalone server on a free port, persistence off.
    pub fn start() -> RedisServer {
        RedisServer::start_anywhere(None, &[], false)
    }

    /// A server on a free port (with `bus`, its Cluster bus port free too)
    /// that first reads `conf`, then `extra`; tried on other ports while the
    /// one picked turns out to be taken.
    pub fn start_anywhere(conf: Option<&str>, extra: &[&str], bus: bool) -> RedisServer {
        for _ in 0..PORT_ATTEMPTS {
            if let Some(server) = RedisServer::try_start(free_port(bus), conf, extra) {
                return server;
            }
        }
        panic!("redis-server found every one of {PORT_ATTEMPTS} free ports taken when it bound");
    }

    /// A server on `port` that first reads `conf` (written to its temp dir,
    /// where it may rewrite it, as Sentinel does), then `extra`; `None` if
    /// the port (or its Cluster bus port) was taken.
    pub fn try_start(port: u16, conf: Option<&str>, extra: &[&str]) -> Option<RedisServer> {
        let dir = tempfile::tempdir().expect("temp dir for redis-server");
        let conf = conf.map(|text| {
            let path = dir.path().join("redis.conf");
            std::fs::write(&path, text).expect("write redis.conf");
            path
        });
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            conf,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            paused: false,
            held: None,
        };
        match server.launch() {
            Launch::Up => Some(server),
            Launch::PortTaken => None,
        }
    }

    fn launch(&mut self) -> Launch {
        self.held = None;
        let log = self.dir.path().join("redis.log");
        let mut cmd = Command::new(redis_binary("redis-server"));
        if let Some(conf) = &self.conf {
            cmd.arg(conf);
        }
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start redis-server ({e}); install it with `apt-get install redis-server`"
            )
        });
        let port = self.port;
        // Another server may answer on a port this one failed to bind: only
        // our child's PID counts.
        let ours = format!("process_id:{}\r\n", child.id());
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                if log.contains("Address already in use") {
                    return Launch::PortTaken;
                }
                panic!("redis-server on {port} exited ({status}):\n{log}");
            }
            if raw_command(port, &["INFO", "server"]).is_some_and(|r| r.contains(&ours)) {
                self.child = Some(child);
                return Launch::Up;
            }
            if start.elapsed() > START_DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!("timed out waiting until redis-server on {port} answers");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .map(Child::id)
            .expect("server is running")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A store config for this server.
    pub fn config(&self, timeout: Duration) -> RedisConfig {
        RedisConfig {
            mode: RedisMode::Standalone { url: self.url() },
            timeout,
        }
    }

    /// A synchronous client connection, for setting up and inspecting.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("connect to the test redis-server")
    }

    /// Runs one command and decodes the reply.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.try_query(args)
            .unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
    }

    /// Runs one command; an error (server down, wrong type) is returned.
    pub fn try_query<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let client = redis::Client::open(self.url())?;
        let mut con = client.get_connection_with_timeout(Duration::from_secs(2))?;
        con.set_read_timeout(Some(Duration::from_secs(5)))?;
        cmd.query(&mut con)
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.paused {
                signal(child.id(), "-CONT");
                self.paused = false;
            }
            let _ = child.kill();
            let _ = child.wait();
            self.held = hold_port(self.port);
        }
    }

    /// Starts it again on the same port, empty (persistence is off). The
    /// port must stay the same, so here a port taken meanwhile is a failure.
    pub fn restart(&mut self) {
        self.kill();
        if let Launch::PortTaken = self.launch() {
            panic!("port {} was taken while redis-server was down", self.port);
        }
    }

    /// SIGSTOP: the socket stays open, nothing answers.
    pub fn pause(&mut self) {
        signal(self.pid(), "-STOP");
        self.paused = true;
    }

    /// SIGCONT after `pause`.
    pub fn resume(&mut self) {
        signal(self.pid(), "-CONT");
        self.paused = false;
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three Cluster masters, no replicas, all slots assigned.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(RedisServer::start_anywhere(
                None,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ],
                true,
            ));
        }
        let mut create = Command::new(redis_binary("redis-cli"));
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for n in &nodes {
            let port = n.port();
            wait_until(
                &format!("node {port} says the cluster is ok"),
                START_DEADLINE,
                || {
                    n.try_query::<String>(&["CLUSTER", "INFO"])
                        .is_ok_and(|r| r.contains("cluster_state:ok"))
                },
            );
        }
        RedisCluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    pub fn config(&self, timeout: Duration) -> RedisConfig {
        RedisConfig {
            mode: RedisMode::Cluster { nodes: self.urls() },
            timeout,
        }
    }

    /// The node that serves `key`'s slot.
    pub fn node_for(&self, key: &str) -> &RedisServer {
        let slot: i64 = self.nodes[0].query(&["CLUSTER", "KEYSLOT", key]);
        let shards: redis::Value = self.nodes[0].query(&["CLUSTER", "SLOTS"]);
        let redis::Value::Array(ranges) = shards else {
            panic!("CLUSTER SLOTS is not an array");
        };
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(lo)),
                Some(redis::Value::Int(hi)),
                Some(redis::Value::Array(master)),
            ) = (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            if (*lo..=*hi).contains(&slot) {
                if let Some(redis::Value::Int(port)) = master.get(1) {
                    if let Some(node) = self.nodes.iter().find(|n| i64::from(n.port()) == *port) {
                        return node;
                    }
                }
            }
        }
        panic!("no node serves slot {slot}");
    }
}

/// A master, one replica and one sentinel watching them (quorum 1, a master
/// is down after 1 s of silence).
pub struct RedisSentinel {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinel: RedisServer,
}

pub const SENTINEL_MASTER: &str = "mymaster";

impl RedisSentinel {
    pub fn start() -> RedisSentinel {
        let master = RedisServer::start();
        let replica = RedisServer::start_anywhere(
            None,
            &["--replicaof", "127.0.0.1", &master.port().to_string()],
            false,
        );
        let replica_port = replica.port();
        wait_until("the replica is in sync", START_DEADLINE, || {
            replica
                .try_query::<String>(&["INFO", "replication"])
                .is_ok_and(|r| r.contains("master_link_status:up"))
        });

        let conf = format!(
            "sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {} 1\n\
             sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
             sentinel failover-timeout {SENTINEL_MASTER} 5000\n\
             sentinel parallel-syncs {SENTINEL_MASTER} 1\n",
            master.port()
        );
        let sentinel = RedisServer::start_anywhere(Some(&conf), &["--sentinel"], false);
        wait_until("the sentinel sees the replica", START_DEADLINE, || {
            sentinel
                .try_query::<redis::Value>(&["SENTINEL", "REPLICAS", SENTINEL_MASTER])
                .is_ok_and(|r| format!("{r:?}").contains(&replica_port.to_string()))
        });
        RedisSentinel {
            master,
            replica,
            sentinel,
        }
    }

    pub fn config(&self, timeout: Duration) -> RedisConfig {
        RedisConfig {
            mode: RedisMode::Sentinel {
                master: SENTINEL_MASTER.to_string(),
                nodes: vec![self.sentinel.url()],
            },
            timeout,
        }
    }

    /// The port Sentinel names as master now, if it answers.
    pub fn master_port(&self) -> Option<u16> {
        let addr: Vec<String> = self
            .sentinel
            .try_query(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER])
            .ok()?;
        addr.get(1).and_then(|p| p.parse().ok())
    }

    /// Waits until the old master has been turned into a replica.
    pub fn wait_for_demotion(&self) {
        let port = self.master.port();
        wait_until(&format!("{port} is demoted"), START_DEADLINE, || {
            self.master
                .try_query::<String>(&["INFO", "replication"])
                .is_ok_and(|r| r.contains("role:slave"))
        });
    }

    /// Asks Sentinel for a planned failover, retrying while it does not yet
    /// find the replica fit to promote (its view of a new replica lags).
    pub fn failover(&self) {
        wait_until("sentinel accepts a failover", START_DEADLINE, || {
            self.sentinel
                .try_query::<()>(&["SENTINEL", "FAILOVER", SENTINEL_MASTER])
                .is_ok()
        });
    }

    /// Waits until the replica has acknowledged every write the master has
    /// taken so far (`WAIT 1`), as it usually has by the time a master dies.
    /// On a loaded machine the first sync can take longer than one `WAIT`.
    pub fn wait_for_replication(&self) {
        wait_until(
            "the replica acknowledges the writes",
            START_DEADLINE,
            || {
                self.master
                    .try_query::<i64>(&["WAIT", "1", "1000"])
                    .is_ok_and(|acked| acked >= 1)
            },
        );
    }

    /// Waits until Sentinel names the replica as master and it acts as one.
    pub fn wait_for_promotion(&self) {
        let port = self.replica.port();
        wait_until(&format!("sentinel promotes {port}"), START_DEADLINE, || {
            self.master_port() == Some(port)
                && self
                    .replica
                    .try_query::<String>(&["INFO", "replication"])
                    .is_ok_and(|r| r.contains("role:master"))
        });
    }
}
