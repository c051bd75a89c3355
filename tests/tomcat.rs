//! Readings proved against a real Java servlet container (DESIGN §9.6):
//! a real Tomcat 10 serves its example webapp, a seeded generator writes a
//! few thousand spellings of a servlet's path (`;params`, `%3b`, dot
//! segments plain, with parameters and percent-encoded, `//`, encoded
//! letters, mixed), Tomcat is asked directly which of them it serves as
//! that servlet, and queuegate, in front of the same Tomcat with a route
//! gating the servlet's prefix at capacity 1 and the slot held, must
//! forward none of those: each gets `400 ambiguous-path` or the waiting
//! answer (only the waiting answer under `ambiguous_paths: gate`).

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;

use common::tomcat::{Answer, Tomcat, INFO_SERVLET};
use common::*;
use queuegate::config::{AmbiguousPaths, Config};

/// How many distinct spellings are generated, and from which seed.
const SPELLINGS: usize = 2000;
const SEED: u64 = 0x5eed_7063_a7ed_0001;

/// The servlet's path, segment by segment (`INFO_SERVLET`).
const SEGMENTS: [&str; 4] = ["examples", "servlets", "servlet", "RequestInfoExample"];

/// Spellings that reached the servlet through queuegate before its
/// readings applied Tomcat's steps in Tomcat's order: parameters dropped
/// at each written `;`, then `%3b` decoded into a segment's name.
const KNOWN: [&str; 3] = [
    "/examples/servlets/servlet/a/%3b/..;/..;/%52equestInfoExample/1",
    "/examples/servlets/servlet/a/..;x/%3bx/%2e%2e;/RequestInfoExample/1",
    "/examples/servlets/%73ervlet;x/%3b/..;/RequestInfoExample",
];

/// A small seeded generator (splitmix64): the same spellings every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// Segments a detour goes into before coming back: some are a level to
/// Tomcat and none to another reading (`%3b`), or the other way round.
const JUNK: [&str; 12] = [
    "a",
    "x1",
    "%3b",
    "%3bx",
    ";",
    ";x",
    "a;b",
    "%61",
    "..%3b",
    "%2e%2e%3b",
    ".",
    "%2e",
];

/// `..` as a client may write it.
const DOT_DOTS: [&str; 10] = [
    "..", "..;", "..;x", "..;a=b", "%2e%2e", "%2E%2E", "%2e.", ".%2e;x", "%2e%2e;", "..;%3b",
];

/// What may follow a segment: path parameters, or an encoded `;`.
const PARAMS: [&str; 8] = [
    ";",
    ";x",
    ";jsessionid=0123ABC",
    ";a=b;c=d",
    ";%3b",
    ";..",
    "%3b",
    "%3Bx",
];

/// Single segments that go nowhere (to Tomcat), or not.
const STILL: [&str; 6] = ["/", "/.", "/%2e", "/.;x", "/%2E;", "//"];

/// What may follow the servlet's name.
const TAILS: [&str; 9] = [
    "",
    "",
    "/",
    "/1",
    "/a/b",
    "/%31",
    "/a;b/c",
    "/x/..;",
    "/x/%2e%2e",
];

/// `segment` with some letters percent-encoded (either case), rarely
/// encoded twice.
fn spell(rng: &mut Rng, segment: &str, out: &mut String) {
    for b in segment.bytes() {
        if rng.chance(12) {
            if rng.chance(50) {
                out.push_str(&format!("%{b:02X}"));
            } else {
                out.push_str(&format!("%{b:02x}"));
            }
        } else if rng.below(1000) < 3 {
            out.push_str(&format!("%25{b:02X}"));
        } else {
            out.push(char::from(b));
        }
    }
}

/// A way out and back: one to three junk segments, then as many `..`
/// (mostly), with an empty segment between now and then.
fn detour(rng: &mut Rng, out: &mut String) {
    let depth = 1 + rng.below(3);
    for _ in 0..depth {
        out.push('/');
        out.push_str(rng.pick(&JUNK));
    }
    if rng.chance(15) {
        out.push('/');
    }
    let back = match rng.below(10) {
        0 => depth + 1,
        1 => depth - 1,
        _ => depth,
    };
    for _ in 0..back {
        out.push('/');
        out.push_str(rng.pick(&DOT_DOTS));
    }
}

/// One spelling of the servlet's path.
fn spelling(rng: &mut Rng) -> String {
    let mut out = String::new();
    for segment in SEGMENTS {
        if rng.chance(35) {
            detour(rng, &mut out);
        }
        if rng.chance(10) {
            out.push_str(rng.pick(&STILL));
        }
        out.push('/');
        spell(rng, segment, &mut out);
        if rng.chance(20) {
            out.push_str(rng.pick(&PARAMS));
        }
    }
    out.push_str(rng.pick(&TAILS));
    out
}

/// `SPELLINGS` distinct spellings, `KNOWN` first.
fn spellings() -> Vec<String> {
    let mut rng = Rng(SEED);
    let mut seen = HashSet::new();
    let mut out: Vec<String> = KNOWN.iter().map(|s| s.to_string()).collect();
    seen.extend(out.iter().cloned());
    while out.len() < SPELLINGS {
        let s = spelling(&mut rng);
        if seen.insert(s.clone()) {
            out.push(s);
        }
    }
    out
}

/// `GET target`, byte for byte, on a new connection to `addr`.
fn raw_get(addr: SocketAddr, target: &str) -> Answer {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let request = format!("GET {target} HTTP/1.1\r\nHost: gate.test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line for {target}: {text:?}"));
    Answer { status, text }
}

/// The `x-queuegate` tag of an answer, if queuegate made it.
fn tag(answer: &Answer) -> Option<&str> {
    let head = answer.text.split("\r\n\r\n").next()?;
    head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("x-queuegate")
            .then_some(value.trim())
    })
}

/// A gate in front of `tomcat` with the servlet's prefix gated at
/// capacity 1 and the slot held by a visitor who came back.
async fn held_gate(tomcat: &Tomcat, mode: AmbiguousPaths) -> Gate {
    let mut config: Config = proxy_config(&tomcat.url());
    config.limits.ambiguous_paths = mode;
    config.routes.push(route("info", INFO_SERVLET, 1));
    let gate = spawn_gate_with(config, ring("k1")).await;
    let mut holder = Visitor::new();
    for _ in 0..2 {
        let a = holder.navigate(&gate.url(INFO_SERVLET)).await;
        assert!(a.reached_origin(), "the holder reaches the servlet: {a:?}");
    }
    let mut other = Visitor::new();
    let a = other.fetch(&gate.url(INFO_SERVLET)).await;
    assert_eq!(a.status, 503, "the slot is held: {a:?}");
    gate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_tomcat_serves_as_a_gated_servlet_is_never_forwarded() {
    let tomcat = Tomcat::start();
    let spellings = spellings();
    let served: Vec<String> = spellings
        .iter()
        .filter(|s| {
            tomcat
                .get(s)
                .unwrap_or_else(|| panic!("Tomcat answers {s}:\n{}", tomcat.log()))
                .is_info_servlet()
        })
        .cloned()
        .collect();
    eprintln!(
        "{} spellings, {} served by Tomcat as {INFO_SERVLET}",
        spellings.len(),
        served.len()
    );
    for known in KNOWN {
        assert!(served.iter().any(|s| s == known), "Tomcat serves {known}");
    }
    assert!(
        served.len() >= SPELLINGS / 5,
        "too few spellings reach the servlet to prove anything: {}",
        served.len()
    );

    for mode in [AmbiguousPaths::Reject, AmbiguousPaths::Gate] {
        let gate = held_gate(&tomcat, mode).await;
        let addr = gate.addr;
        let list = served.clone();
        let answers = tokio::task::spawn_blocking(move || {
            list.into_iter()
                .map(|s| {
                    let a = raw_get(addr, &s);
                    (s, a)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        let refused = |a: &Answer| a.status == 400 && tag(a) == Some("ambiguous-path");
        let held = |a: &Answer| a.status == 503 && tag(a) == Some("waiting");
        eprintln!(
            "{mode:?}: {} refused as ambiguous, {} held",
            answers.iter().filter(|(_, a)| refused(a)).count(),
            answers.iter().filter(|(_, a)| held(a)).count(),
        );
        let through: Vec<String> = answers
            .iter()
            .filter(|(_, a)| !(held(a) || (refused(a) && mode == AmbiguousPaths::Reject)))
            .map(|(s, a)| format!("{s} -> {} {:?}", a.status, tag(a)))
            .collect();
        assert!(
            through.is_empty(),
            "{mode:?}: {} of {} spellings Tomcat serves as the gated servlet got through \
             queuegate, e.g.:\n{}",
            through.len(),
            served.len(),
            through[..through.len().min(20)].join("\n")
        );
        gate.stop().await.unwrap();
    }
}
