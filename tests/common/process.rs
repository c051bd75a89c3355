//! The `queuegate` binary run as a child process, on ports it binds itself.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::visitor::PublicUrl;

/// The `queuegate` binary as a child process. Its config listens on
/// `127.0.0.1:0`: the child binds its own ports and names them in its
/// start-up log, where they are read, so no port is picked here and then
/// raced for by another test before the child binds it. Everything the child
/// writes to stderr is kept; it is killed on drop.
pub struct Process {
    child: std::process::Child,
    /// The public listener.
    pub addr: SocketAddr,
    /// The admin listener, when the config has one.
    pub admin: Option<SocketAddr>,
    log: Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Process {
    /// Spawns `cmd` (a `queuegate run` whose listeners are on port 0),
    /// taking over its stderr, and waits until it has logged its public
    /// listener and, with `admin`, its admin listener. Logs at `info` unless
    /// `cmd` sets `QUEUEGATE_LOG`.
    pub async fn start(mut cmd: std::process::Command, admin: bool) -> Process {
        use std::io::BufRead;
        if !cmd.get_envs().any(|(name, _)| name == "QUEUEGATE_LOG") {
            cmd.env("QUEUEGATE_LOG", "info");
        }
        let mut child = cmd
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the queuegate binary starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(std::sync::Mutex::new(String::new()));
        let sink = log.clone();
        // Drains the pipe as the child writes, so it never blocks on a full one.
        let reader = std::thread::spawn(move || {
            let mut stderr = std::io::BufReader::new(stderr);
            let mut line = Vec::new();
            while stderr.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&line));
                line.clear();
            }
        });
        let mut process = Process {
            child,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            admin: None,
            log,
            reader: Some(reader),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (public, admin_addr) = listening(&process.log());
            if let Some(public) = public.filter(|_| admin_addr.is_some() || !admin) {
                process.addr = public;
                process.admin = admin_addr;
                return process;
            }
            if let Ok(Some(status)) = process.child.try_wait() {
                let (_, log) = process.wait();
                panic!("queuegate exited ({status}) before it was listening:\n{log}");
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "queuegate did not log its listeners within 20 s:\n{}",
                    process.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A URL on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        let admin = self
            .admin
            .expect("queuegate runs without an admin listener");
        format!("http://{admin}{path}")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends signal `name` (`TERM`, `HUP`) to the child.
    pub fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("the `kill` command runs");
        assert!(status.success(), "kill -{name} failed");
    }

    /// What the child has written to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the child's log contains `needle`, failing after 20 s.
    pub async fn wait_for_log(&self, what: &str, needle: &str) {
        for _ in 0..1000 {
            if self.log.lock().unwrap().contains(needle) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("timed out waiting until {what}:\n{}", self.log());
    }

    /// Waits (blocking) for the child to exit: its exit status and
    /// everything it wrote to stderr.
    pub fn wait(&mut self) -> (std::process::ExitStatus, String) {
        let status = self.child.wait().expect("wait for queuegate");
        if let Some(reader) = self.reader.take() {
            reader.join().expect("the log reader does not panic");
        }
        (status, self.log())
    }

    /// SIGTERM, then the exit code and everything written to stderr.
    pub fn stop(mut self) -> (i32, String) {
        self.signal("TERM");
        let (status, log) = self.wait();
        (status.code().unwrap_or(-1), log)
    }
}

impl PublicUrl for Process {
    fn url(&self, path: &str) -> String {
        Process::url(self, path)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// The public and admin addresses named by the `listening` lines of a
/// queuegate start-up log, in the text or the JSON format.
fn listening(log: &str) -> (Option<SocketAddr>, Option<SocketAddr>) {
    let (mut public, mut admin) = (None, None);
    for line in log.lines() {
        let line = without_ansi(line);
        let (message, addr) = match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(entry) => (
                entry["message"].as_str().unwrap_or_default().to_owned(),
                entry["addr"].as_str().and_then(|a| a.parse().ok()),
            ),
            // `<time>  INFO queuegate: listening addr=127.0.0.1:4000 tls=false`
            Err(_) => {
                let Some((_, event)) = line.split_once(" queuegate: ") else {
                    continue;
                };
                let Some((message, fields)) = event.split_once(" addr=") else {
                    continue;
                };
                let addr = fields.split(' ').next().and_then(|a| a.parse().ok());
                (message.to_owned(), addr)
            }
        };
        if message == "listening" {
            public = public.or(addr);
        } else if message.starts_with("admin listening") {
            admin = admin.or(addr);
        }
    }
    (public, admin)
}

/// `line` without its terminal colour codes.
fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // An escape sequence runs up to its final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
