//! Cost of the smuggling watch (`framing::Watched`) on every read of an
//! HTTP/1 connection: a browser's typical request head, and a chunked
//! upload, each delivered in one read, as hyper reads them. The figure
//! includes the copy of the bytes into the read buffer, which hyper's own
//! read makes anyway.

use std::hint::black_box;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use queuegate::framing::Watched;
use tokio::io::{AsyncRead, ReadBuf};

/// A GET as a browser sends it on a keep-alive connection.
const HEAD: &[u8] = b"GET /tickets/2026/final?seat=a12&lang=en HTTP/1.1\r\n\
Host: tickets.example.com\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n\
Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n\
Accept-Language: en-GB,en;q=0.5\r\n\
Accept-Encoding: gzip, deflate, br, zstd\r\n\
Referer: https://tickets.example.com/tickets/2026\r\n\
Connection: keep-alive\r\n\
Cookie: qg_tickets=v1.a.k1.AbCdEfGhIjKlMnOpQrStUv.1767225660.0123456789abcdef0123456789abcdef; theme=dark\r\n\
Upgrade-Insecure-Requests: 1\r\n\
Sec-Fetch-Dest: document\r\n\
Sec-Fetch-Mode: navigate\r\n\
Sec-Fetch-Site: same-origin\r\n\
Priority: u=0, i\r\n\r\n";

/// The same connection's next read forever: one whole request per read.
struct Repeat(Vec<u8>);

impl AsyncRead for Repeat {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        buf.put_slice(&self.0);
        Poll::Ready(Ok(()))
    }
}

/// A chunked upload: head, three 1 KiB chunks (one with an extension), the
/// last chunk and a trailer.
fn chunked() -> Vec<u8> {
    let mut request = b"POST /upload HTTP/1.1\r\nHost: tickets.example.com\r\n\
Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        .to_vec();
    for ext in ["", ";part=2", ""] {
        request.extend_from_slice(format!("400{ext}\r\n").as_bytes());
        request.extend(std::iter::repeat_n(b'x', 1024));
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\nX-Checksum: 1234\r\n\r\n");
    request
}

/// Reads one request through the watch, as hyper's read would.
fn read_one(watched: &mut Watched<Repeat>, buf: &mut [u8], cx: &mut Context<'_>) -> usize {
    let mut read = ReadBuf::new(buf);
    match Pin::new(watched).poll_read(cx, &mut read) {
        Poll::Ready(Ok(())) => read.filled().len(),
        other => panic!("the bench reader always has bytes: {other:?}"),
    }
}

fn watch(c: &mut Criterion, name: &str, request: Vec<u8>) {
    let len = request.len();
    let mut watched = Watched::new(Repeat(request), 8192);
    let watch = watched.watch();
    let mut buf = vec![0u8; len];
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..3 {
        assert_eq!(read_one(&mut watched, &mut buf, &mut cx), len);
        assert!(
            watched.between_requests(),
            "{name}: the watch must end each read between requests"
        );
        assert_eq!(watch.next_request(), None, "{name}: nothing to report");
    }
    let mut group = c.benchmark_group("framing_watch");
    group.throughput(Throughput::Elements(1));
    group.bench_function(name, |b| {
        b.iter(|| read_one(black_box(&mut watched), &mut buf, &mut cx))
    });
    group.finish();
    assert!(watched.between_requests(), "{name}: still in step");
}

fn framing(c: &mut Criterion) {
    watch(c, "head", HEAD.to_vec());
    watch(c, "chunked_upload", chunked());
}

criterion_group!(benches, framing);
criterion_main!(benches);
