//! Smuggling watch on accepted connections: follows the HTTP/1 request heads
//! in the bytes hyper reads and reports a head whose framing is ambiguous
//! (Content-Length with Transfer-Encoding, or Content-Length repeated), which
//! hyper resolves silently before the service sees the headers. It only
//! reports: the stream is never changed or held back, and only a head split
//! across reads is copied aside.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use memchr::{memchr, memchr2};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A request head that two HTTP parsers could frame differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmbiguousHead {
    /// The request's position on its connection, from 0.
    pub request: u64,
    /// What made it ambiguous.
    pub reason: &'static str,
}

/// One connection's report, shared by its stream and its service.
#[derive(Clone, Debug, Default)]
pub struct FramingWatch(Arc<Report>);

#[derive(Debug, Default)]
struct Report {
    ambiguous: OnceLock<AmbiguousHead>,
    requests: AtomicU64,
}

impl FramingWatch {
    /// Call once for every request hyper hands to the service, in order
    /// (HTTP/1 serves a connection's requests one after another): returns
    /// the ambiguity if this request's head had one.
    pub fn next_request(&self) -> Option<AmbiguousHead> {
        let index = self.0.requests.fetch_add(1, Ordering::Relaxed);
        self.0
            .ambiguous
            .get()
            .filter(|head| head.request == index)
            .copied()
    }

    /// How many requests hyper has handed to the service so far.
    pub fn requests(&self) -> u64 {
        self.0.requests.load(Ordering::Relaxed)
    }
}

/// An accepted stream whose reads are watched; reads and writes go straight
/// through to the inner stream.
pub struct Watched<IO> {
    io: IO,
    scan: Scan,
}

impl<IO> Watched<IO> {
    /// `max_buf_size` is the HTTP/1 read-buffer cap given to hyper: a head
    /// that does not end within it is refused by hyper (431), so the watch
    /// gives up on it. hyper may over-read that cap by one buffer growth
    /// (bytes doubles its allocation), so twice the cap is followed.
    pub fn new(io: IO, max_buf_size: usize) -> Watched<IO> {
        let scan = Scan {
            state: State::Head,
            head: Vec::new(),
            head_limit: max_buf_size.saturating_mul(2),
            heads: 0,
            watch: FramingWatch::default(),
        };
        Watched { io, scan }
    }

    /// The handle the connection's service reads.
    pub fn watch(&self) -> FramingWatch {
        self.scan.watch.clone()
    }

    /// The stream underneath.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Whether every byte read so far ends a request (or begins the next
    /// head): false inside a body, and once the watch has stopped (HTTP/2,
    /// an upgrade, an ambiguous or unreadable head).
    pub fn between_requests(&self) -> bool {
        self.scan.state == State::Head
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if !matches!(this.scan.state, State::Off) {
                this.scan.feed(&buf.filled()[before..]);
            }
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Where the scan is in the connection's byte stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Reading a request head (blank lines before it are skipped, as hyper does).
    Head,
    /// Skipping a Content-Length body: bytes left.
    Length(u64),
    /// Skipping a chunked body.
    Chunked(Chunk),
    /// Not following this connection any more: HTTP/2, an upgrade, a head
    /// that was ambiguous, too large or that hyper will refuse.
    Off,
}

/// The steps of a chunked body, as hyper decodes it (strict CRLF).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    Start,
    Size(u64),
    SizeSpace(u64),
    Extension(u64),
    SizeLf(u64),
    Data(u64),
    DataCr,
    DataLf,
    /// After the last chunk, or after a trailer line: CR ends the body.
    EndCr,
    EndLf,
    Trailer,
    TrailerLf,
}

struct Scan {
    state: State,
    /// A head split across reads; empty when heads arrive whole.
    head: Vec<u8>,
    head_limit: usize,
    heads: u64,
    watch: FramingWatch,
}

impl Scan {
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let used = match self.state {
                State::Off => return,
                State::Head => self.head_bytes(bytes),
                State::Length(left) => {
                    let used = left.min(bytes.len() as u64);
                    self.state = if used == left {
                        State::Head
                    } else {
                        State::Length(left - used)
                    };
                    used as usize
                }
                State::Chunked(chunk) => {
                    let (state, used) = chunk_step(chunk, bytes);
                    self.state = state;
                    used
                }
            };
            bytes = &bytes[used..];
        }
    }

    /// Consumes head bytes (at least one) and returns how many.
    fn head_bytes(&mut self, bytes: &[u8]) -> usize {
        if self.head.is_empty() {
            let blank = bytes
                .iter()
                .take_while(|b| matches!(b, b'\r' | b'\n'))
                .count();
            if blank > 0 {
                return blank;
            }
            if let Some(end) = head_end(bytes, 0) {
                self.on_head(&bytes[..end]);
                return end;
            }
            if bytes.len() >= self.head_limit {
                self.stop();
            } else {
                self.head.extend_from_slice(bytes);
            }
            return bytes.len();
        }
        let old = self.head.len();
        let take = bytes.len().min(self.head_limit.saturating_sub(old));
        self.head.extend_from_slice(&bytes[..take]);
        // The blank line may have begun in the previous read.
        if let Some(end) = head_end(&self.head, old.saturating_sub(2)) {
            let head = std::mem::take(&mut self.head);
            self.on_head(&head[..end]);
            if self.state != State::Off {
                self.head = head;
                self.head.clear();
            }
            return end - old;
        }
        if self.head.len() >= self.head_limit {
            self.stop();
        }
        bytes.len()
    }

    /// Reads one complete head and sets the framing of its body.
    fn on_head(&mut self, head: &[u8]) {
        let index = self.heads;
        self.heads += 1;
        let mut lines = head
            .split(|&b| b == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
        let request_line = lines.next().unwrap_or_default();
        let method = request_line
            .split(|&b| b == b' ')
            .next()
            .unwrap_or_default();
        let version = request_line
            .rsplit(|&b| b == b' ')
            .next()
            .unwrap_or_default();
        // Also what ends the watch on HTTP/2: its preface reads `PRI * HTTP/2.0`.
        if version != b"HTTP/1.1" && version != b"HTTP/1.0" {
            return self.stop();
        }
        let mut upgrade = method == b"CONNECT";
        let (mut lengths, mut length, mut chunked) = (0u32, None, None);
        let mut readable = true;
        for line in lines.take_while(|line| !line.is_empty()) {
            let Some(colon) = memchr(b':', line) else {
                return self.stop();
            };
            let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
            if name.eq_ignore_ascii_case(b"content-length") {
                // Counted even when unreadable: hyper ignores one that
                // follows Transfer-Encoding without reading it.
                lengths += 1;
                match digits(value) {
                    Some(n) if length.is_none_or(|first| first == n) => length = Some(n),
                    _ => readable = false,
                }
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                let last = value.rsplit(|&b| b == b',').next().unwrap_or_default();
                chunked = Some(trim(last).eq_ignore_ascii_case(b"chunked"));
            } else if name.eq_ignore_ascii_case(b"upgrade") {
                upgrade = true;
            }
        }
        let reason = match (lengths, chunked) {
            (2.., _) => Some("more than one Content-Length"),
            (1, Some(_)) => Some("both Content-Length and Transfer-Encoding"),
            _ => None,
        };
        if let Some(reason) = reason {
            let _ = self.watch.0.ambiguous.set(AmbiguousHead {
                request: index,
                reason,
            });
            return self.stop();
        }
        self.state = match (chunked, length) {
            _ if upgrade || !readable => State::Off,
            (Some(true), _) => State::Chunked(Chunk::Start),
            // hyper refuses a request whose last coding is not chunked.
            (Some(false), _) => State::Off,
            (None, Some(n)) if n > 0 => State::Length(n),
            (None, _) => State::Head,
        };
    }

    fn stop(&mut self) {
        self.state = State::Off;
        self.head = Vec::new();
    }
}

/// One step of a chunked body: the next state and the bytes consumed (≥ 1).
fn chunk_step(chunk: Chunk, bytes: &[u8]) -> (State, usize) {
    use Chunk::*;
    let byte = bytes[0];
    let next = match chunk {
        Data(left) => {
            let used = left.min(bytes.len() as u64);
            let next = if used == left {
                DataCr
            } else {
                Data(left - used)
            };
            return (State::Chunked(next), used as usize);
        }
        Extension(size) => {
            return match memchr2(b'\r', b'\n', bytes) {
                None => (State::Chunked(Extension(size)), bytes.len()),
                Some(at) if bytes[at] == b'\r' => (State::Chunked(SizeLf(size)), at + 1),
                Some(_) => (State::Off, bytes.len()),
            };
        }
        Trailer => {
            return match memchr(b'\r', bytes) {
                None => (State::Chunked(Trailer), bytes.len()),
                Some(at) => (State::Chunked(TrailerLf), at + 1),
            };
        }
        Start => hex(byte).map(|d| Size(u64::from(d))),
        Size(size) => match byte {
            b' ' | b'\t' => Some(SizeSpace(size)),
            b';' => Some(Extension(size)),
            b'\r' => Some(SizeLf(size)),
            _ => hex(byte)
                .and_then(|d| size.checked_mul(16)?.checked_add(u64::from(d)))
                .map(Size),
        },
        SizeSpace(size) => match byte {
            b' ' | b'\t' => Some(SizeSpace(size)),
            b';' => Some(Extension(size)),
            b'\r' => Some(SizeLf(size)),
            _ => None,
        },
        SizeLf(0) => (byte == b'\n').then_some(EndCr),
        SizeLf(size) => (byte == b'\n').then_some(Data(size)),
        DataCr => (byte == b'\r').then_some(DataLf),
        DataLf => (byte == b'\n').then_some(Start),
        EndCr if byte == b'\r' => Some(EndLf),
        EndCr => Some(Trailer),
        TrailerLf => (byte == b'\n').then_some(EndCr),
        EndLf if byte == b'\n' => return (State::Head, 1),
        EndLf => None,
    };
    (next.map_or(State::Off, State::Chunked), 1)
}

/// The index just past the blank line that ends a head, searching for its
/// line feeds from `from`.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(found) = memchr(b'\n', &buf[at..]) {
        let lf = at + found;
        match buf.get(lf + 1) {
            Some(b'\n') => return Some(lf + 2),
            Some(b'\r') if buf.get(lf + 2) == Some(&b'\n') => return Some(lf + 3),
            _ => at = lf + 1,
        }
    }
    None
}

fn trim(value: &[u8]) -> &[u8] {
    let is_space = |b: &u8| matches!(b, b' ' | b'\t');
    let start = value
        .iter()
        .position(|b| !is_space(b))
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !is_space(b))
        .map_or(start, |i| i + 1);
    &value[start..end]
}

fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        let d = b.checked_sub(b'0').filter(|d| *d < 10)?;
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

/// One hex digit of a chunk size.
fn hex(byte: u8) -> Option<u8> {
    char::from(byte).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn scan() -> Scan {
        Watched::new((), 8192).scan
    }

    fn fed(pieces: &[&[u8]]) -> Scan {
        let mut scan = scan();
        for piece in pieces {
            scan.feed(piece);
        }
        scan
    }

    fn flagged(scan: &Scan) -> Option<AmbiguousHead> {
        scan.watch.0.ambiguous.get().copied()
    }

    const CHUNKED: &[u8] = b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
        4;name=\"x;y\"\r\nabcd\r\n1A \t;ext\r\n0123456789abcdefghijklmnop\r\n0\r\nX-Sum: 1\r\nX-Other: 2\r\n\r\n";
    const LENGTH: &[u8] = b"PUT /b HTTP/1.1\r\ncontent-LENGTH:  5 \r\n\r\nhello";
    const PLAIN: &[u8] = b"GET /c HTTP/1.1\r\nHost: a\r\n\r\n";
    const AMBIGUOUS: &[u8] =
        b"POST /d HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n";

    #[test]
    fn pipelined_requests_in_one_read_are_followed_through_their_bodies() {
        let stream = [PLAIN, CHUNKED, b"\r\n", LENGTH, PLAIN, CHUNKED, LENGTH].concat();
        let scan = fed(&[&stream]);
        assert_eq!(scan.heads, 6);
        assert_eq!(scan.state, State::Head);
        assert_eq!(flagged(&scan), None);
    }

    #[test]
    fn ambiguous_second_request_is_flagged_with_index_1() {
        for second in [
            AMBIGUOUS,
            b"POST /d HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n",
            b"POST /d HTTP/1.1\r\nContent-Length: 2\r\nCONTENT-LENGTH: 2\r\n\r\nhi",
            b"POST /d HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: x\r\n\r\n",
        ] {
            let scan = fed(&[&[LENGTH, second, PLAIN].concat()]);
            let head = flagged(&scan).expect("flagged");
            assert_eq!(head.request, 1);
            assert_eq!(
                scan.state,
                State::Off,
                "the scan stops after an ambiguous head"
            );
            assert_eq!(scan.heads, 2);
            let watch = scan.watch.clone();
            assert_eq!(watch.next_request(), None);
            assert_eq!(watch.next_request(), Some(head));
            assert_eq!(watch.next_request(), None);
        }
    }

    #[test]
    fn heads_and_bodies_split_at_every_byte_position_scan_the_same() {
        let clean = [CHUNKED, LENGTH, PLAIN].concat();
        let dirty = [CHUNKED, AMBIGUOUS].concat();
        for at in 0..=clean.len() {
            let scan = fed(&[&clean[..at], &clean[at..]]);
            assert_eq!(
                (scan.heads, scan.state, flagged(&scan)),
                (3, State::Head, None),
                "split at {at}"
            );
        }
        for at in 0..=dirty.len() {
            let scan = fed(&[&dirty[..at], &dirty[at..]]);
            assert_eq!(flagged(&scan).map(|h| h.request), Some(1), "split at {at}");
        }
        let mut scan = scan();
        for byte in &dirty {
            scan.feed(std::slice::from_ref(byte));
        }
        assert_eq!(flagged(&scan).map(|h| h.request), Some(1));
    }

    #[test]
    fn a_body_that_looks_like_headers_is_not_taken_for_a_head() {
        let inner = b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let mut stream = format!(
            "POST /x HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            inner.len()
        )
        .into_bytes();
        stream.extend_from_slice(inner);
        stream.extend_from_slice(
            format!(
                "POST /y HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
                inner.len()
            )
            .as_bytes(),
        );
        stream.extend_from_slice(inner);
        stream.extend_from_slice(b"\r\n0\r\n\r\n");
        stream.extend_from_slice(PLAIN);
        let scan = fed(&[&stream]);
        assert_eq!(
            (scan.heads, scan.state, flagged(&scan)),
            (3, State::Head, None)
        );
    }

    #[test]
    fn http2_preface_passes_through_unscanned() {
        let mut stream = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        stream.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        stream.extend_from_slice(AMBIGUOUS);
        let scan = fed(&[&stream[..5], &stream[5..]]);
        assert_eq!((scan.state, flagged(&scan)), (State::Off, None));
    }

    #[test]
    fn upgrades_oversize_heads_and_garbage_end_the_scan() {
        let upgrade = b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n";
        let connect = b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n";
        let bad_chunk = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        let bad_length = b"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n";
        let garbage = b"\x16\x03\x01 not http\r\n\r\n";
        for first in [&upgrade[..], connect, bad_chunk, bad_length, garbage] {
            let scan = fed(&[first, AMBIGUOUS]);
            assert_eq!((scan.state, flagged(&scan)), (State::Off, None));
        }
        let big = format!("GET / HTTP/1.1\r\nx-big: {}", "a".repeat(20_000));
        let scan = fed(&[big.as_bytes()]);
        assert_eq!((scan.state, scan.head.capacity()), (State::Off, 0));
    }

    #[tokio::test]
    async fn reads_through_the_wrapper_are_unchanged_and_watched() {
        let stream = [PLAIN, CHUNKED, AMBIGUOUS].concat();
        let (mut client, server) = tokio::io::duplex(7);
        let mut watched = Watched::new(server, 8192);
        let watch = watched.watch();
        let sent = stream.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.shutdown().await.unwrap();
            client
        });
        let mut got = b"prefix".to_vec();
        while watched.read_buf(&mut got).await.unwrap() > 0 {}
        let mut client = writer.await.unwrap();
        assert_eq!(&got[6..], &stream[..]);
        let found: Vec<_> = (0..3).map(|_| watch.next_request()).collect();
        assert_eq!(found[..2], [None, None]);
        assert_eq!(found[2].map(|head| head.request), Some(2));
        watched.write_all(b"answer").await.unwrap();
        let mut answer = [0; 6];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"answer");
    }
}
