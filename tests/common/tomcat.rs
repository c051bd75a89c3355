//! A real Apache Tomcat 10 (Debian's `tomcat10`) serving Debian's example
//! webapp (`tomcat10-examples`) at `/examples`, for tests that need to know
//! how a Java servlet container reads a path. Each server has a private
//! `CATALINA_BASE` in a temp dir (its own `conf/server.xml` with one HTTP
//! connector on 127.0.0.1 and no shutdown port; logs, work and temp in the
//! same dir) and is killed by PID on drop, so also when a test fails.
//!
//! Tomcat binds the port it is given, so a port is picked here (as for
//! Redis, with `free_port`) and can be taken before Tomcat
//! binds it: Tomcat then exits (`EXIT_ON_INIT_FAILURE`) and is started
//! again on another port. It counts as up once the example servlet answers
//! on the port, which no other test's server does.
//!
//! A missing Tomcat, examples webapp or Java is a loud failure naming the
//! Debian packages, never a skip.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis::free_port;

/// Where Debian's `tomcat10` installs Tomcat (`CATALINA_HOME`).
const CATALINA_HOME: &str = "/usr/share/tomcat10";

/// Where Debian's `tomcat10-examples` installs the example webapp.
const EXAMPLES: &str = "/usr/share/tomcat10-examples/examples";

/// The Debian packages a test on Tomcat needs.
pub const PACKAGES: &str = "tomcat10 tomcat10-examples default-jre-headless";

/// The example servlet every `/servlets/servlet/RequestInfoExample/*`
/// path reaches, and what only it writes in its answer.
pub const INFO_SERVLET: &str = "/examples/servlets/servlet/RequestInfoExample";
pub const INFO_MARK: &str = "<title>Request Information Example</title>";

/// How long Tomcat may take to serve the example servlet after start.
const START_DEADLINE: Duration = Duration::from_secs(90);

/// How many ports Tomcat is tried on before giving up.
const PORT_ATTEMPTS: usize = 10;

/// One Tomcat process.
pub struct Tomcat {
    child: Child,
    port: u16,
    base: tempfile::TempDir,
}

/// What one request got: the status and the whole answer, head and body.
pub struct Answer {
    pub status: u16,
    pub text: String,
}

impl Answer {
    /// Whether the example servlet `INFO_SERVLET` answered.
    pub fn is_info_servlet(&self) -> bool {
        self.status == 200 && self.text.contains(INFO_MARK)
    }
}

impl Tomcat {
    /// A Tomcat serving the example webapp on a free loopback port.
    pub fn start() -> Tomcat {
        let java = installed();
        for _ in 0..PORT_ATTEMPTS {
            if let Some(tomcat) = Tomcat::try_start(&java, free_port(false)) {
                return tomcat;
            }
        }
        panic!("Tomcat found every one of {PORT_ATTEMPTS} free ports taken when it bound");
    }

    /// A Tomcat on `port`; `None` if it exited without serving (the port
    /// was taken).
    fn try_start(java: &Path, port: u16) -> Option<Tomcat> {
        let base = tempfile::tempdir().expect("temp dir for CATALINA_BASE");
        write_base(base.path(), port);
        let out = std::fs::File::create(base.path().join("logs/console.log"))
            .expect("create Tomcat's console log");
        let err = out.try_clone().expect("clone Tomcat's console log");
        let child = Command::new(java)
            .args(["-Xmx128m", "-Xss512k", "-XX:+UseSerialGC"])
            .arg("-XX:TieredStopAtLevel=1")
            .args(["-Djava.awt.headless=true", "-Duser.language=en"])
            .arg("-Dorg.apache.catalina.startup.EXIT_ON_INIT_FAILURE=true")
            .arg(format!("-Dcatalina.home={CATALINA_HOME}"))
            .arg(format!("-Dcatalina.base={}", base.path().display()))
            .arg(format!(
                "-Djava.io.tmpdir={}",
                base.path().join("temp").display()
            ))
            .arg("-cp")
            .arg(format!(
                "{CATALINA_HOME}/bin/bootstrap.jar:{CATALINA_HOME}/bin/tomcat-juli.jar"
            ))
            .args(["org.apache.catalina.startup.Bootstrap", "start"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start Tomcat ({e}); apt-get install {PACKAGES}"));
        let mut tomcat = Tomcat { child, port, base };
        let start = Instant::now();
        loop {
            if let Ok(Some(_)) = tomcat.child.try_wait() {
                // Dropped: the temp dir goes, the child is reaped.
                return None;
            }
            if tomcat
                .get(INFO_SERVLET)
                .is_some_and(|a| a.is_info_servlet())
            {
                return Some(tomcat);
            }
            if start.elapsed() > START_DEADLINE {
                panic!(
                    "Tomcat on {port} did not serve {INFO_SERVLET} within {START_DEADLINE:?}:\n{}",
                    tomcat.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What Tomcat wrote to its console.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.base.path().join("logs/console.log")).unwrap_or_default()
    }

    /// `GET target` written byte for byte on a new connection (`Connection:
    /// close`), and what came back; `None` if nothing did.
    pub fn get(&self, target: &str) -> Option<Answer> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .ok()?;
        let request =
            format!("GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).ok()?;
        let mut out = Vec::new();
        stream.read_to_end(&mut out).ok()?;
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text.get(9..12)?.parse().ok()?;
        Some(Answer { status, text })
    }
}

impl Drop for Tomcat {
    fn drop(&mut self) {
        // SIGKILL to the child's PID; it runs nothing that needs a clean stop.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `java` binary, once Tomcat and the examples are known to be
/// installed; a loud failure naming the packages otherwise.
fn installed() -> PathBuf {
    let missing = |what: &str| -> ! {
        panic!(
            "{what} not found: the Tomcat tests need a real Tomcat 10 and its examples. \
             Install them with `apt-get install {PACKAGES}` (Debian/Ubuntu)."
        )
    };
    for file in [
        format!("{CATALINA_HOME}/bin/bootstrap.jar"),
        format!("{CATALINA_HOME}/etc/web.xml"),
        format!("{EXAMPLES}/WEB-INF/web.xml"),
    ] {
        if !Path::new(&file).is_file() {
            missing(&file);
        }
    }
    let java = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("java"))
            .find(|p| p.is_file())
    });
    java.unwrap_or_else(|| missing("`java` on PATH"))
}

/// A `CATALINA_BASE` in `base`: Debian's default `web.xml`,
/// `catalina.properties` and `context.xml`, and a `server.xml` with one
/// HTTP connector on 127.0.0.1:`port`, no shutdown port, and the example
/// webapp at `/examples` (its jars are symlinks, hence `allowLinking`).
fn write_base(base: &Path, port: u16) {
    for dir in ["conf", "logs", "work", "temp", "webapps"] {
        std::fs::create_dir_all(base.join(dir)).expect("create CATALINA_BASE dirs");
    }
    for file in ["web.xml", "catalina.properties", "context.xml"] {
        std::fs::copy(
            Path::new(CATALINA_HOME).join("etc").join(file),
            base.join("conf").join(file),
        )
        .unwrap_or_else(|e| panic!("copy {file} into CATALINA_BASE: {e}"));
    }
    let server = format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<Server port="-1" shutdown="SHUTDOWN">
  <Service name="Catalina">
    <Connector address="127.0.0.1" port="{port}" protocol="HTTP/1.1"
               connectionTimeout="20000"/>
    <Engine name="Catalina" defaultHost="localhost">
      <Host name="localhost" appBase="webapps" unpackWARs="false"
            autoDeploy="false" deployOnStartup="false">
        <Context path="/examples" docBase="{EXAMPLES}">
          <Resources allowLinking="true"/>
        </Context>
      </Host>
    </Engine>
  </Service>
</Server>
"#
    );
    std::fs::write(base.join("conf/server.xml"), server).expect("write server.xml");
}
