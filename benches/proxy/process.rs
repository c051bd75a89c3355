//! Child servers as guarded processes: free ports, CPU time from `/proc`, stop by PID on drop.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A number from the environment variable `name` (a trailing `s`, as in
/// `5s`, is allowed), `default` when it is unset.
pub fn env_number<T: std::str::FromStr>(name: &str, default: T) -> Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    std::env::var(name)
        .ok()
        .map(|text| text.trim().trim_end_matches('s').parse())
        .transpose()
        .with_context(|| format!("{name} must be a number"))
        .map(|value| value.unwrap_or(default))
}

/// How long a server gets to exit after `SIGTERM` before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A free TCP port on 127.0.0.1: bound to port 0, read back, released.
///
/// Another process could take the port between release and use; on a
/// loopback-only bench machine that is rare, and a server that fails to bind
/// fails the readiness wait with its log.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A server the harness started. Dropping it stops the process (and, for a
/// forking server such as nginx, its workers) by PID.
pub struct Process {
    name: String,
    child: Child,
    /// Log files shown when the server fails to start.
    logs: Vec<PathBuf>,
    /// Worker processes (PID, program name) seen while running, killed on
    /// drop if the master leaves them behind.
    workers: Vec<(u32, String)>,
}

impl Process {
    pub fn new(name: &str, child: Child, logs: Vec<PathBuf>) -> Self {
        Self {
            name: name.to_string(),
            child,
            logs,
            workers: Vec::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails with the server's logs if it has already exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited during start-up ({status}){}",
                self.name,
                self.log_tail()
            );
        }
        Ok(())
    }

    /// The last lines of the server's logs, for error messages.
    pub fn log_tail(&self) -> String {
        let mut out = String::new();
        for log in &self.logs {
            if let Ok(text) = fs::read_to_string(log) {
                let lines: Vec<&str> = text.lines().collect();
                let start = lines.len().saturating_sub(20);
                out.push_str(&format!("\n--- {} ---\n", log.display()));
                out.push_str(&lines[start..].join("\n"));
            }
        }
        out
    }

    /// The process and its direct children (nginx's workers), remembering the
    /// children so they can be stopped even if the master dies first.
    pub fn pids(&mut self) -> Vec<u32> {
        let master = self.pid();
        let mut pids = vec![master];
        for (pid, comm) in children_of(master) {
            if !self.workers.iter().any(|(seen, _)| *seen == pid) {
                self.workers.push((pid, comm));
            }
            pids.push(pid);
        }
        pids
    }

    /// CPU time (in clock ticks) used so far by the process and its
    /// children, all threads included.
    pub fn cpu_ticks(&mut self) -> Result<CpuTicks> {
        let mut total = CpuTicks::default();
        for pid in self.pids() {
            let stat = ProcStat::read(pid)
                .with_context(|| format!("reading CPU time of {} (pid {pid})", self.name))?;
            total.user += stat.utime;
            total.system += stat.stime;
        }
        Ok(total)
    }

    /// Sends a signal (`STOP`, `CONT`, `HUP`, …) to the process itself.
    #[allow(dead_code)] // for the soak's faults
    pub fn signal(&self, name: &str) {
        signal(self.pid(), name);
    }

    /// Kills the process at once (`SIGKILL`) and reaps it.
    #[allow(dead_code)] // for the soak's faults
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stop(&mut self) {
        let pid = self.pid();
        if matches!(self.child.try_wait(), Ok(None)) {
            signal(pid, "TERM");
            let deadline = Instant::now() + STOP_GRACE;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(self.child.try_wait(), Ok(None)) {
                eprintln!("{} (pid {pid}) ignored SIGTERM; killing it", self.name);
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        for (worker, comm) in &self.workers {
            // A worker the master left behind still runs the same program; a
            // PID now running something else was reused and is not ours.
            if ProcStat::read(*worker).is_ok_and(|stat| &stat.comm == comm) {
                signal(*worker, "KILL");
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends a signal with the system `kill` command (the crate forbids `unsafe`,
/// so no direct `kill(2)`).
fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status();
}

/// CPU time in clock ticks: in user space, and in the kernel on the
/// process's behalf (system calls, and the TCP work they do on loopback).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuTicks {
    pub user: u64,
    pub system: u64,
}

impl CpuTicks {
    /// The time used since `before`, in seconds: (user, total).
    pub fn since(self, before: CpuTicks, clock_ticks: f64) -> (f64, f64) {
        let user = self.user.saturating_sub(before.user) as f64 / clock_ticks;
        let system = self.system.saturating_sub(before.system) as f64 / clock_ticks;
        (user, user + system)
    }
}

/// The fields of `/proc/<pid>/stat` the harness uses.
struct ProcStat {
    comm: String,
    ppid: u32,
    utime: u64,
    stime: u64,
}

impl ProcStat {
    fn read(pid: u32) -> Result<Self> {
        let text = fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat"))?;
        Self::parse(&text).with_context(|| format!("unexpected /proc/{pid}/stat: {text:?}"))
    }

    /// `pid (comm) state ppid … utime stime …`; `comm` may hold spaces and
    /// parentheses, so fields are counted from the last `)`.
    fn parse(text: &str) -> Option<Self> {
        let open = text.find('(')?;
        let close = text.rfind(')')?;
        let comm = text.get(open + 1..close)?.to_string();
        let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
        Some(Self {
            comm,
            ppid: rest.get(1)?.parse().ok()?,
            utime: rest.get(11)?.parse().ok()?,
            stime: rest.get(12)?.parse().ok()?,
        })
    }
}

/// Direct children of `parent`, as (PID, program name).
fn children_of(parent: u32) -> Vec<(u32, String)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: Vec<(u32, String)> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = ProcStat::read(pid).ok()?;
            (stat.ppid == parent).then_some((pid, stat.comm))
        })
        .collect();
    children.sort_unstable();
    children
}

/// Clock ticks per second for `/proc` CPU times (`getconf CLK_TCK`, else 100).
pub fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse::<f64>().ok())
        .filter(|&ticks| ticks > 0.0)
        .unwrap_or(100.0)
}
