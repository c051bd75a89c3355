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
//! Request side (`mod requests`): generated request heads and bodies go to
//! queuegate's request parser and to hyper's server (see the module).
//!
//! 300 cases per run (each side); a longer run:
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
    let (parts, body) = sent.response.into_http().into_parts();
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

/// Request side: generated request heads and bodies, valid, borderline and
/// hostile (request-line spacing, versions, targets, casing and spacing of
/// framing fields, duplicate and conflicting `Content-Length`, codings,
/// obs-fold, bare CR and LF, odd bytes, long lines, broken chunks and
/// trailers), each followed by a pipelined plain request, go to
/// `h1::request` (then the body by its framing, chunked bodies through
/// `h1::chunked`) and to hyper's server over an in-memory stream. The test
/// fails wherever ours reads a request hyper refuses, or frames a body
/// differently: other bytes, or another end, which shows as a different
/// next request. Refusing what hyper accepts is allowed: ours refuses
/// ambiguous framing that hyper resolves silently.
mod requests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper::{Request, Response, StatusCode};
    use hyper_util::rt::TokioIo;
    use proptest::prelude::*;
    use queuegate::h1::chunked::{self, Step};
    use queuegate::h1::request::{self, Framing};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One request as a server read it: its method and its body (`None`
    /// when reading the body failed).
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct Read {
        method: String,
        body: Option<Vec<u8>>,
    }

    /// The read-buffer cap queuegate gives hyper by default.
    const MAX_BUF: usize = 16 * 1024;

    /// What hyper's server reads of `bytes`, in order.
    async fn hyper_reads(bytes: Vec<u8>) -> Vec<Read> {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let reads = Arc::new(Mutex::new(Vec::new()));
        let seen = reads.clone();
        let service = service_fn(move |req: Request<hyper::body::Incoming>| {
            let seen = seen.clone();
            async move {
                let method = req.method().to_string();
                let body = req.into_body().collect().await.ok();
                let body = body.map(|b| b.to_bytes().to_vec());
                seen.lock().unwrap().push(Read { method, body });
                // Not 2xx: a `CONNECT` answered so is no tunnel.
                let mut resp = Response::new(Empty::<Bytes>::new());
                *resp.status_mut() = StatusCode::NOT_FOUND;
                Ok::<_, Infallible>(resp)
            }
        });
        let mut builder = http1::Builder::new();
        // Half-close: the requests pipelined before the end are all served.
        builder.max_buf_size(MAX_BUF).half_close(true);
        let conn = builder.serve_connection(TokioIo::new(server), service);
        let served = tokio::spawn(conn);
        client.write_all(&bytes).await.unwrap();
        client.shutdown().await.unwrap();
        let mut answers = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut answers)).await;
        served.abort();
        let reads = reads.lock().unwrap().clone();
        reads
    }

    /// What queuegate's parser reads of `bytes`, in order.
    fn ours_reads(mut bytes: &[u8]) -> Vec<Read> {
        let mut reads = Vec::new();
        loop {
            // Blank lines before a head are httparse's to skip.
            let mut slots = queuegate::h1::fields();
            let Ok(Some(head)) = request::parse(bytes, &mut slots) else {
                return reads;
            };
            if head.method().is_err() || head.uri().is_err() {
                return reads;
            }
            let method = head.method.to_string();
            let keep_alive = head.keep_alive;
            let rest = &bytes[head.len..];
            let (body, used) = match head.framing {
                Framing::Empty => (Some(Vec::new()), 0),
                Framing::Length(n) => match usize::try_from(n) {
                    Ok(n) if n <= rest.len() => (Some(rest[..n].to_vec()), n),
                    _ => (None, rest.len()),
                },
                Framing::Chunked => match chunked_body(rest) {
                    Some((body, used)) => (Some(body), used),
                    None => (None, rest.len()),
                },
            };
            let failed = body.is_none();
            reads.push(Read { method, body });
            if failed || !keep_alive {
                return reads;
            }
            bytes = &rest[used..];
        }
    }

    /// A chunked body at the start of `bytes`, decoded: its data and the
    /// bytes it took, or `None` when it is malformed or cut short.
    fn chunked_body(bytes: &[u8]) -> Option<(Vec<u8>, usize)> {
        let mut buf = bytes::BytesMut::from(bytes);
        let mut decoder = chunked::Decoder::new();
        let mut body = Vec::new();
        loop {
            match decoder.decode(&mut buf).ok()? {
                Step::Data(data) => body.extend_from_slice(&data),
                Step::Trailers(_) | Step::End => return Some((body, bytes.len() - buf.len())),
                Step::More => return None,
            }
        }
    }

    fn line_end() -> impl Strategy<Value = &'static str> {
        prop_oneof![12 => Just("\r\n"), 1 => Just("\n"), 1 => Just("\r"), 1 => Just("\n\r")]
    }

    fn request_line() -> impl Strategy<Value = String> {
        let method = prop_oneof![
            6 => Just("GET"), 6 => Just("POST"), 2 => Just("PUT"), 1 => Just("get"),
            1 => Just("M-SEARCH"), 1 => Just("CONNECT"), 1 => Just("HEAD"),
            1 => Just("G\u{7f}T"), 1 => Just("GET\t"), 1 => Just(""), 1 => Just("GÉT"),
        ];
        let target = prop_oneof![
            6 => Just("/"), 4 => Just("/a/b?c=d"), 1 => Just("*"), 1 => Just("http://a.example/x"),
            1 => Just("a.example:443"), 1 => Just("/a b"), 1 => Just("/é"), 1 => Just("/a%zz"),
            1 => Just("//x"), 1 => Just("/a#f"), 1 => Just(""), 1 => Just("/a\u{1}b"),
            1 => Just("/{}|^`"),
        ];
        let version = prop_oneof![
            8 => Just("HTTP/1.1"), 3 => Just("HTTP/1.0"), 1 => Just("HTTP/1.2"),
            1 => Just("http/1.1"), 1 => Just("HTTP/2.0"), 1 => Just("HTTP/1.1 "),
            1 => Just("HTTP/1"),
        ];
        let gap = prop_oneof![10 => Just(" "), 1 => Just("  "), 1 => Just("\t")];
        (method, gap.clone(), target, gap, version)
            .prop_map(|(m, g1, t, g2, v)| format!("{m}{g1}{t}{g2}{v}"))
    }

    fn field() -> impl Strategy<Value = String> {
        let length_name = prop_oneof![
            Just("Content-Length"),
            Just("content-length"),
            Just("CONTENT-LENGTH"),
            Just("Content-Length "),
            Just("Content_Length"),
        ];
        let length_value = prop_oneof![
            4 => Just("5"), 2 => Just("0"), 1 => Just("05"), 1 => Just(" 5"), 1 => Just("5 "),
            1 => Just("+5"), 1 => Just("-5"), 1 => Just("5,5"), 1 => Just("5, 5"),
            1 => Just("0x5"), 1 => Just(""), 1 => Just("18446744073709551615"),
            1 => Just("18446744073709551616"), 1 => Just("4"), 1 => Just("6"),
        ];
        let coding_name = prop_oneof![
            Just("Transfer-Encoding"),
            Just("transfer-encoding"),
            Just("Transfer-Encoding "),
            Just("Transfer_Encoding"),
        ];
        let coding_value = prop_oneof![
            6 => Just("chunked"), 1 => Just("Chunked"), 1 => Just("gzip, chunked"),
            1 => Just("chunked, gzip"), 1 => Just("chunked "), 1 => Just("identity"),
            1 => Just("gzip,chunked"), 1 => Just("\u{e9}, chunked"), 1 => Just("chunked;q=1"),
            1 => Just("x-chunked"), 1 => Just(""),
        ];
        prop_oneof![
            4 => Just("Host: a.example".to_string()),
            4 => (length_name, length_value).prop_map(|(n, v)| format!("{n}: {v}")),
            4 => (coding_name, coding_value).prop_map(|(n, v)| format!("{n}: {v}")),
            1 => Just("Connection: close".to_string()),
            1 => Just("Connection: keep-alive".to_string()),
            1 => Just("Connection: Upgrade".to_string()),
            1 => Just("Upgrade: websocket".to_string()),
            1 => Just("Expect: 100-continue".to_string()),
            1 => Just("X-A: b\u{0}c".to_string()),
            1 => Just("X-A: b\u{7f}c".to_string()),
            1 => Just("X-A: \u{80}\u{ff}".to_string()),
            1 => Just("X-A:b".to_string()),
            1 => Just("X-A:   b \t ".to_string()),
            1 => Just(" folded".to_string()),
            1 => Just("\tfolded".to_string()),
            1 => Just("X-A b".to_string()),
            1 => Just(": b".to_string()),
            1 => Just("X-A\t: b".to_string()),
            1 => Just("X\u{1}A: b".to_string()),
            1 => (1usize..3000).prop_map(|n| format!("X-Long: {}", "a".repeat(n))),
        ]
    }

    fn body() -> impl Strategy<Value = Vec<u8>> {
        let fixed: Vec<&'static [u8]> = vec![
            b"",
            b"hello",
            b"hell",
            b"5\r\nhello\r\n0\r\n\r\n",
            b"5;x=y\r\nhello\r\n0\r\n\r\n",
            b"5 ;x\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
            b"0\r\n\r\n",
            b"00000\r\n\r\n",
            b"g\r\nhello\r\n0\r\n\r\n",
            b"10000000000000000\r\nx\r\n0\r\n\r\n",
            b"5\r\nhelloX0\r\n\r\n",
            b"5\nhello\n0\n\n",
            b"5\r\nhello\r\n0\r\n",
            b"5\r\nhel",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0;e\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX-T: 1\n\r\n",
            b"5\r\n\r\nhel\r\n0\r\n\r\n",
        ];
        prop_oneof![
            8 => proptest::sample::select(fixed).prop_map(|b| b.to_vec()),
            1 => proptest::collection::vec(any::<u8>(), 0..40),
        ]
    }

    /// A generated message: blank lines, a request line, header lines, the
    /// blank line, a body; then a plain request to show where it ended.
    fn message() -> impl Strategy<Value = Vec<u8>> {
        (
            prop_oneof![8 => Just(""), 1 => Just("\r\n"), 1 => Just("\n")],
            request_line(),
            proptest::collection::vec((field(), line_end()), 0..6),
            line_end(),
            line_end(),
            body(),
        )
            .prop_map(|(lead, line, fields, first_end, end, body)| {
                let mut bytes = format!("{lead}{line}{first_end}").into_bytes();
                for (field, end) in fields {
                    bytes.extend_from_slice(field.as_bytes());
                    bytes.extend_from_slice(end.as_bytes());
                }
                bytes.extend_from_slice(end.as_bytes());
                bytes.extend_from_slice(&body);
                bytes.extend_from_slice(b"GET /next HTTP/1.1\r\nHost: a.example\r\n\r\n");
                bytes
            })
    }

    /// Where ours and hyper's disagree in a way that matters: a request ours
    /// reads that hyper did not, or read otherwise.
    fn disagreement(ours: &[Read], hypers: &[Read]) -> Option<String> {
        for (i, read) in ours.iter().enumerate() {
            let Some(theirs) = hypers.get(i) else {
                return Some(format!("ours read request {i} ({read:?}), hyper did not"));
            };
            if read.method != theirs.method {
                return Some(format!("request {i}: ours {read:?}, hyper {theirs:?}"));
            }
            if read.body.is_some() && read.body != theirs.body {
                return Some(format!(
                    "request {i}'s body: ours {read:?}, hyper {theirs:?}"
                ));
            }
        }
        None
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: super::cases(), ..ProptestConfig::default() })]

        #[test]
        fn ours_never_reads_a_request_hyper_refuses_nor_frames_one_otherwise(bytes in message()) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let hypers = runtime.block_on(hyper_reads(bytes.clone()));
            let ours = ours_reads(&bytes);
            let found = disagreement(&ours, &hypers);
            prop_assert!(found.is_none(), "{}\nmessage: {:?}", found.unwrap_or_default(),
                String::from_utf8_lossy(&bytes));
        }
    }

    /// The generator reaches every outcome: requests both read whole, bodies
    /// read by length and chunks, heads both refuse, and heads only ours
    /// refuses (ambiguous framing).
    #[test]
    fn known_messages_read_as_expected() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let next = b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n".as_slice();
        let read = |m: &str, b: &[u8]| Read {
            method: m.into(),
            body: Some(b.to_vec()),
        };
        let cases: Vec<(Vec<u8>, Vec<Read>, Vec<Read>)> = vec![
            (
                [b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello".as_slice(), next].concat(),
                vec![read("POST", b"hello"), read("GET", b"")],
                vec![read("POST", b"hello"), read("GET", b"")],
            ),
            (
                [b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\nT: 1\r\n\r\n".as_slice(), next].concat(),
                vec![read("POST", b"hello"), read("GET", b"")],
                vec![read("POST", b"hello"), read("GET", b"")],
            ),
            (
                [b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".as_slice(), next].concat(),
                vec![],
                // hyper takes the chunks, then closes the connection.
                vec![read("POST", b"")],
            ),
            (
                [b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello".as_slice(), next].concat(),
                vec![],
                vec![],
            ),
        ];
        for (bytes, want_ours, want_hyper) in cases {
            let hypers = runtime.block_on(hyper_reads(bytes.clone()));
            assert_eq!(
                ours_reads(&bytes),
                want_ours,
                "{:?}",
                String::from_utf8_lossy(&bytes)
            );
            assert_eq!(hypers, want_hyper, "{:?}", String::from_utf8_lossy(&bytes));
        }
    }
}
