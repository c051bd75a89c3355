//! The HTTP/1 codec against hyper's, on generated input (DESIGN §9.5).
//!
//! Origin side (`mod origin`): generated response heads and bodies, valid,
//! borderline and hostile (whitespace, casing, duplicate and conflicting
//! `Content-Length`, `Transfer-Encoding` variants, obs-fold, bare CR and
//! LF, long lines, odd bytes, `1xx` before the final answer, bodies
//! delimited by the connection's close, broken chunks and trailers), each
//! served by a raw origin to hyper's HTTP/1 client (over an in-memory
//! pipe) and to queuegate's `upstream` pool (over a real socket). The test
//! fails wherever queuegate accepts a head hyper refuses, or frames a body
//! differently (other bytes, trailers, or another end). A head queuegate
//! refuses and hyper accepts is counted and printed, not failed.
//!
//! 300 cases per run; a longer run:
//! `PROPTEST_CASES=20000 cargo test --test h1_differential -- --nocapture`.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Version};
use http_body_util::BodyExt;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// How many generated cases a run tries (`PROPTEST_CASES`, else 300).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// What a client made of an answer: refused at the head, or a head and
/// its body, which ended cleanly or with an error.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Refused,
    Answer {
        status: StatusCode,
        version: Version,
        headers: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
        trailers: Option<HeaderMap>,
        clean: bool,
    },
}

fn fields(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}

/// Reads a body to its end or its first error.
async fn drain<B>(mut body: B) -> (Vec<u8>, Option<HeaderMap>, bool)
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    let mut data = Vec::new();
    let mut trailers = None;
    loop {
        match body.frame().await {
            None => return (data, trailers, true),
            Some(Err(_)) => return (data, trailers, false),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(frame) => {
                    if let Ok(t) = frame.into_trailers() {
                        trailers = Some(t);
                    }
                }
            },
        }
    }
}

/// Serves `answer` on `io` as an origin: reads the request head, writes
/// the answer, closes its side, then reads whatever comes until the end.
async fn serve<S>(mut io: S, answer: Vec<u8>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    if io.write_all(&answer).await.is_err() {
        return;
    }
    let _ = io.shutdown().await;
    while let Ok(n) = io.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

fn request<B>(head: bool, body: B) -> Request<B> {
    let method = if head {
        http::Method::HEAD
    } else {
        http::Method::GET
    };
    Request::builder()
        .method(method)
        .uri("/")
        .header("host", "origin.test")
        .body(body)
        .unwrap_or_else(|_| unreachable!())
}

/// What hyper's HTTP/1 client makes of `answer`.
async fn hyper_reads(answer: Vec<u8>, head: bool) -> Outcome {
    let (client, server) = tokio::io::duplex(1 << 20);
    tokio::spawn(serve(server, answer));
    let io = hyper_util::rt::TokioIo::new(client);
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(io).await else {
        return Outcome::Refused;
    };
    tokio::spawn(conn);
    let req = request(head, http_body_util::Empty::<Bytes>::new());
    let Ok(resp) = sender.send_request(req).await else {
        return Outcome::Refused;
    };
    let (parts, body) = resp.into_parts();
    let (body, trailers, clean) = if parts.status == StatusCode::SWITCHING_PROTOCOLS {
        (Vec::new(), None, true)
    } else {
        drain(body).await
    };
    Outcome::Answer {
        status: parts.status,
        version: parts.version,
        headers: fields(&parts.headers),
        body,
        trailers,
        clean,
    }
}

/// What queuegate's origin connections make of `answer`.
async fn ours_reads(answer: Vec<u8>, head: bool) -> Outcome {
    use queuegate::upstream::{Origin, Outgoing, Pool, UpstreamBody};
    let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else {
        return Outcome::Refused;
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    tokio::spawn(async move {
        if let Ok((stream, _)) = listener.accept().await {
            serve(stream, answer).await;
        }
    });
    let origin = Origin {
        host: "127.0.0.1".into(),
        port,
        tls: None,
        connect_timeout: Duration::from_secs(5),
    };
    let pool = Pool::new(origin, 1, 4, Duration::from_secs(5));
    let Ok(pooled) = pool.connect(0).await else {
        return Outcome::Refused;
    };
    let Ok(sent) = pooled.send(request(head, Outgoing::Empty)).await else {
        return Outcome::Refused;
    };
    let (parts, body) = sent.response.into_parts();
    let (body, trailers, clean) = if parts.status == StatusCode::SWITCHING_PROTOCOLS {
        (Vec::new(), None, true)
    } else {
        drain(UpstreamBody::new(body, sent.connection)).await
    };
    Outcome::Answer {
        status: parts.status,
        version: parts.version,
        headers: fields(&parts.headers),
        body,
        trailers,
        clean,
    }
}

mod origin {
    //! Generators of origins' answers.

    use proptest::prelude::*;

    /// A line end: mostly CRLF, sometimes a bare LF or CR.
    fn eol() -> impl Strategy<Value = &'static str> {
        prop_oneof![80 => Just("\r\n"), 2 => Just("\n"), 1 => Just("\r")]
    }

    fn status_line() -> impl Strategy<Value = String> {
        let version = prop_oneof![
            60 => Just("HTTP/1.1"),
            10 => Just("HTTP/1.0"),
            1 => Just("HTTP/1.2"),
            1 => Just("http/1.1"),
            1 => Just("HTTP/2"),
            1 => Just("HTTP/1.1 "),
        ];
        let code = prop_oneof![
            60 => Just("200"),
            2 => Just("204"),
            2 => Just("304"),
            2 => Just("404"),
            1 => Just("500"),
            1 => Just("099"),
            1 => Just("999"),
            1 => Just("1000"),
            1 => Just("20"),
            1 => Just("2x0"),
        ];
        let reason = prop_oneof![
            30 => Just("OK"),
            2 => Just(""),
            2 => Just("Fine Thanks"),
            1 => Just("Tab\there"),
            1 => Just("caf\u{e9}"),
            1 => Just("nul\u{0}byte"),
            1 => Just("del\u{7f}"),
        ];
        (version, code, reason, eol()).prop_map(|(v, c, r, e)| format!("{v} {c} {r}{e}"))
    }

    fn length_value() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            16 => Just("$LEN"),
            2 => Just(" $LEN "),
            2 => Just("$LEN, $LEN"),
            2 => Just("$LEN,$MORE"),
            2 => Just("$MORE"),
            1 => Just("+$LEN"),
            1 => Just("-1"),
            1 => Just("0x10"),
            1 => Just(""),
            1 => Just("$LEN,"),
            1 => Just("0"),
            1 => Just("18446744073709551615"),
            1 => Just("18446744073709551613"),
            1 => Just("99999999999999999999"),
        ]
    }

    fn coding_value() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            12 => Just("chunked"),
            2 => Just("Chunked"),
            2 => Just("gzip, chunked"),
            2 => Just("chunked, gzip"),
            1 => Just("identity"),
            1 => Just("chunked\t"),
            1 => Just("chunked,"),
            1 => Just(",chunked"),
            1 => Just("\u{e9}chunked"),
            1 => Just("chunked;q=1"),
        ]
    }

    fn connection_value() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            4 => Just("close"),
            4 => Just("keep-alive"),
            1 => Just("Keep-Alive, Close"),
            1 => Just("CLOSE"),
            1 => Just("upgrade"),
        ]
    }

    /// Any value: plain, odd, or hostile.
    fn other_value() -> impl Strategy<Value = String> {
        prop_oneof![
            12 => "[ -~]{0,20}",
            2 => Just("a\r\n folded".to_owned()),
            1 => Just("a\r\n\tfolded".to_owned()),
            1 => Just("bare\rcr".to_owned()),
            1 => Just("bare\nlf".to_owned()),
            1 => Just("nul\u{0}".to_owned()),
            1 => Just("del\u{7f}x".to_owned()),
            1 => Just("obs\u{fe}text".to_owned()),
            1 => Just("tab\tinside\t".to_owned()),
            1 => Just("x".repeat(9000)),
        ]
    }

    fn other_name() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            10 => Just("X-Thing"),
            4 => Just("Set-Cookie"),
            2 => Just("content-type"),
            1 => Just("Content-Length "),
            1 => Just(" X-Lead"),
            1 => Just("Bad Name"),
            1 => Just("X(y)"),
            1 => Just("X-\u{e9}"),
            1 => Just(""),
        ]
    }

    fn field() -> impl Strategy<Value = String> {
        let length = (
            prop_oneof![
                Just("Content-Length"),
                Just("content-length"),
                Just("CONTENT-LENGTH")
            ],
            length_value().prop_map(str::to_owned),
        );
        let coding = (
            prop_oneof![Just("Transfer-Encoding"), Just("transfer-encoding")],
            coding_value().prop_map(str::to_owned),
        );
        let connection = (
            Just("Connection"),
            connection_value().prop_map(str::to_owned),
        );
        let pair = prop_oneof![
            6 => length,
            4 => coding,
            2 => connection,
            6 => (other_name(), other_value()),
        ];
        let sep = prop_oneof![20 => Just(": "), 4 => Just(":"), 1 => Just(" : "), 1 => Just(":\t"), 1 => Just(":  ")];
        (pair, sep, eol()).prop_map(|((n, v), s, e)| format!("{n}{s}{v}{e}"))
    }

    /// One chunk: its size line (right, or mangled) and its data.
    fn chunk() -> impl Strategy<Value = Vec<u8>> {
        let data = proptest::collection::vec(any::<u8>(), 1..40);
        let form = prop_oneof![
            20 => Just(0u8), // right
            2 => Just(1),    // upper-case hex, extension
            1 => Just(2),    // size one too big
            1 => Just(3),    // size one too small
            1 => Just(4),    // no CRLF after the data
            1 => Just(5),    // space before the size
            1 => Just(6),    // LF only after the size
            1 => Just(7),    // 0x prefix
            1 => Just(8),    // whitespace after the size
            1 => Just(9),    // leading zeros
        ];
        (data, form).prop_map(|(data, form)| {
            let n = data.len();
            let line = match form {
                1 => format!("{n:X};name=\"v\"\r\n"),
                2 => format!("{:x}\r\n", n + 1),
                3 => format!("{:x}\r\n", n - 1),
                5 => format!(" {n:x}\r\n"),
                6 => format!("{n:x}\n"),
                7 => format!("0x{n:x}\r\n"),
                8 => format!("{n:x} \t\r\n"),
                9 => format!("0000{n:x}\r\n"),
                _ => format!("{n:x}\r\n"),
            };
            let mut out = line.into_bytes();
            out.extend_from_slice(&data);
            if form != 4 {
                out.extend_from_slice(b"\r\n");
            }
            out
        })
    }

    fn last_chunk() -> impl Strategy<Value = String> {
        prop_oneof![
            10 => Just("0\r\n\r\n".to_owned()),
            3 => Just("0\r\nX-Sum: 1\r\nX-Other: two\r\n\r\n".to_owned()),
            1 => Just("0;ext\r\n\r\n".to_owned()),
            1 => Just("000\r\n\r\n".to_owned()),
            1 => Just("0\r\nBad Trailer: x\r\n\r\n".to_owned()),
            1 => Just("0\r\nX-Sum: 1\n\r\n".to_owned()),
            1 => Just("0\r\nX-Sum: a\r\n folded\r\n\r\n".to_owned()),
            1 => Just("0\r\n\n".to_owned()),
            1 => Just("0\r\n".to_owned()),
            1 => Just("".to_owned()),
        ]
    }

    /// A body: raw bytes, or chunks.
    fn body() -> impl Strategy<Value = (Vec<u8>, bool)> {
        let raw = proptest::collection::vec(any::<u8>(), 0..64).prop_map(|b| (b, false));
        let chunks =
            (proptest::collection::vec(chunk(), 0..4), last_chunk()).prop_map(|(chunks, last)| {
                let mut out: Vec<u8> = chunks.concat();
                out.extend_from_slice(last.as_bytes());
                (out, true)
            });
        prop_oneof![raw, chunks]
    }

    fn informational() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("HTTP/1.1 100 Continue\r\n\r\n"),
            Just("HTTP/1.1 102 Processing\r\n\r\n"),
            Just("HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"),
        ]
    }

    /// A whole answer, and whether it answers a `HEAD`.
    pub fn answer() -> impl Strategy<Value = (Vec<u8>, bool)> {
        (
            proptest::collection::vec(informational(), 0..2),
            status_line(),
            proptest::collection::vec(field(), 0..5),
            prop_oneof![30 => Just(0usize), 1 => Just(101)],
            prop_oneof![20 => Just("\r\n"), 1 => Just("\n")],
            body(),
            proptest::collection::vec(any::<u8>(), 0..8),
            prop_oneof![6 => Just(false), 1 => Just(true)],
        )
            .prop_map(
                |(early, status, fields, many, end, (body, _chunked), extra, head)| {
                    let len = body.len();
                    let mut out = early.concat().into_bytes();
                    out.extend_from_slice(status.as_bytes());
                    for f in &fields {
                        let f = f
                            .replace("$LEN", &len.to_string())
                            .replace("$MORE", &(len + 1).to_string());
                        out.extend_from_slice(f.as_bytes());
                    }
                    for i in 0..many {
                        out.extend_from_slice(format!("X-Many-{i}: {i}\r\n").as_bytes());
                    }
                    out.extend_from_slice(end.as_bytes());
                    out.extend_from_slice(&body);
                    out.extend_from_slice(&extra);
                    (out, head)
                },
            )
    }
}

#[test]
fn origin_answers_are_read_as_hyper_reads_them() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let stricter = std::sync::Mutex::new(Vec::new());
    // Both refused, both read an answer cleanly, both cut its body short.
    let tally = std::sync::Mutex::new([0u32; 3]);
    let result = runner.run(&origin::answer(), |(answer, head)| {
        let (theirs, ours) = runtime.block_on(async {
            let limit = Duration::from_secs(10);
            let theirs = tokio::time::timeout(limit, hyper_reads(answer.clone(), head)).await;
            let ours = tokio::time::timeout(limit, ours_reads(answer.clone(), head)).await;
            (theirs, ours)
        });
        let shown = String::from_utf8_lossy(&answer[..answer.len().min(600)]).into_owned();
        let (Ok(theirs), Ok(ours)) = (theirs, ours) else {
            return Err(TestCaseError::fail(format!("a reader hung on {shown:?}")));
        };
        if theirs == ours {
            let mut tally = tally.lock().unwrap_or_else(|e| e.into_inner());
            match &ours {
                Outcome::Refused => tally[0] += 1,
                Outcome::Answer { clean: true, .. } => tally[1] += 1,
                Outcome::Answer { clean: false, .. } => tally[2] += 1,
            }
        }
        match (&theirs, &ours) {
            (Outcome::Refused, Outcome::Refused) => Ok(()),
            (Outcome::Answer { .. }, Outcome::Refused) => {
                stricter
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(shown);
                Ok(())
            }
            _ if theirs == ours => Ok(()),
            _ => Err(TestCaseError::fail(format!(
                "{shown:?} (HEAD: {head})\nhyper: {theirs:?}\nours:  {ours:?}"
            ))),
        }
    });
    let stricter = stricter.into_inner().unwrap_or_else(|e| e.into_inner());
    let [refused, clean, cut] = tally.into_inner().unwrap_or_else(|e| e.into_inner());
    println!("agreed: {refused} refused, {clean} read whole, {cut} cut short");
    println!("{} answers refused here that hyper accepts", stricter.len());
    for shown in &stricter {
        println!("  refused here only: {shown:?}");
    }
    if let Err(err) = result {
        panic!("{err}");
    }
}

#[test]
fn too_many_fields_are_refused_by_both_and_too_long_heads_here() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let mut many = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n".to_vec();
    for i in 0..100 {
        many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let (theirs, ours) = runtime.block_on(async {
        (
            hyper_reads(many.clone(), false).await,
            ours_reads(many, false).await,
        )
    });
    assert!(theirs == Outcome::Refused, "hyper took 101 fields");
    assert!(ours == Outcome::Refused, "101 fields taken");
    // hyper refuses a head still incomplete once it has buffered 400 KiB,
    // but takes a longer one that came whole in one read; here any head
    // longer than that is refused, however it came.
    let long = format!(
        "HTTP/1.1 200 OK\r\nX-Long: {}\r\nContent-Length: 0\r\n\r\n",
        "a".repeat(420_000)
    );
    let ours = runtime.block_on(ours_reads(long.into_bytes(), false));
    assert!(ours == Outcome::Refused, "a head over 400 KiB taken");
}
