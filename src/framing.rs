//! Smuggling watch on accepted connections: follows the HTTP/1 request heads
//! in the bytes read, parsed with the same parser as hyper's (`httparse`,
//! through `h1::request`; chunked bodies are followed the way hyper's
//! decoder takes them), and reports a head whose framing is ambiguous
//! (Content-Length with Transfer-Encoding, or Content-Length repeated). A
//! request that asks for `Upgrade` leaves the watch on until a `101` is said
//! to have switched the protocol. On HTTP/2 it follows the frame headers
//! only, to report since when a header block has been open (its deadline is
//! the server's). It only reports: the stream is never changed or held
//! back, and only a head split across reads is copied aside.
//!
//! The server uses it for HTTP/2: an HTTP/1 connection is served by
//! `connection`'s engine, which parses each head once and refuses ambiguous
//! framing itself, so the server stops following it
//! ([`Watched::stop_following`]) as soon as the connection is known to be
//! HTTP/1.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use memchr::{memchr, memchr2};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::h1::{
    self,
    request::{self, Framing, Refused},
};

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
    /// A `101` (or a `2xx` to `CONNECT`) handed the connection over.
    switched: AtomicBool,
    /// HTTP/2: when the header block being read began, while one is open.
    header_block: Mutex<Option<Instant>>,
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

    /// Call when the protocol was switched (a `101`, or a `2xx` answering
    /// `CONNECT`): what follows is a tunnel, no longer followed. Until then
    /// a request asking for `Upgrade` is just a request.
    pub fn switched(&self) {
        self.0.switched.store(true, Ordering::Relaxed);
    }

    /// HTTP/2: since when a header block (`HEADERS` and its `CONTINUATION`s)
    /// has been open, if one is.
    pub fn header_block_since(&self) -> Option<Instant> {
        *self
            .0
            .header_block
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_header_block(&self, since: Option<Instant>) {
        *self
            .0
            .header_block
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = since;
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

    /// Stops following the stream: an HTTP/1 connection's heads are
    /// parsed by the server's own engine.
    pub fn stop_following(&mut self) {
        self.scan.stop();
    }

    /// The stream underneath.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Whether every byte read so far ends a request (or begins the next
    /// head): false inside a body, on HTTP/2, and once the watch has stopped
    /// (a switched protocol, an ambiguous or unreadable head).
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
                if this.scan.watch.0.switched.load(Ordering::Relaxed) {
                    this.scan.stop();
                } else {
                    this.scan.feed(&buf.filled()[before..]);
                }
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
    /// HTTP/2, after the preface's request line: following frame headers.
    H2(H2Frames),
    /// Not following this connection any more: a switched protocol, a head
    /// that was ambiguous, too large or that hyper will refuse.
    Off,
}

/// Where the scan is in an HTTP/2 frame stream (RFC 9113 §4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct H2Frames {
    /// Bytes of the preface still to skip (its `SM` line).
    preface: u8,
    /// The frame header being read, and how much of it has arrived.
    header: [u8; 9],
    have: u8,
    /// Payload bytes of the current frame still to skip.
    left: u32,
    /// The current frame is the end of a header block (`HEADERS` or
    /// `CONTINUATION` with `END_HEADERS`).
    ends_block: bool,
}

/// HTTP/2 frame types that carry a header block, and the flag ending one.
const H2_HEADERS: u8 = 0x1;
const H2_CONTINUATION: u8 = 0x9;
const H2_END_HEADERS: u8 = 0x4;

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

/// What reading a head at the start of some bytes found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Head {
    /// A complete head of this many bytes, its body's framing set.
    Complete(usize),
    /// No complete head yet.
    Partial,
    /// The watch stopped on it (see [`State::Off`]).
    Stopped,
}

/// The request line and blank line that begin HTTP/2's connection preface
/// (RFC 9113 §3.4); `SM` and a blank line follow.
const H2_PREFACE_HEAD: &[u8] = b"PRI * HTTP/2.0\r\n\r\n";

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
                State::H2(frames) => self.h2_bytes(frames, bytes),
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
            // Most heads arrive whole: read in place, nothing copied.
            match self.parse_head(bytes) {
                Head::Complete(len) => return len,
                Head::Stopped => return bytes.len(),
                Head::Partial => {}
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
        // Parsed again only once the blank line is there (which may have
        // begun in the previous read), so a head sent a byte at a time
        // costs one parse, not one per byte.
        if let Some(end) = head_end(&self.head, old.saturating_sub(2)) {
            let head = std::mem::take(&mut self.head);
            match self.parse_head(&head[..end]) {
                Head::Complete(len) if len == end => {}
                Head::Stopped => return bytes.len(),
                // A head the blank line does not end is not one hyper reads.
                Head::Complete(_) | Head::Partial => {
                    self.stop();
                    return bytes.len();
                }
            }
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

    /// Reads the head at the start of `bytes` with hyper's parser
    /// (`httparse`, with hyper's defaults) and sets the framing of its body.
    fn parse_head(&mut self, bytes: &[u8]) -> Head {
        // HTTP/2's preface reads `PRI * HTTP/2.0`, a blank line, then `SM`;
        // frames follow.
        if self.heads == 0 {
            if bytes.starts_with(H2_PREFACE_HEAD) {
                self.heads += 1;
                self.state = State::H2(H2Frames {
                    preface: 6,
                    header: [0; 9],
                    have: 0,
                    left: 0,
                    ends_block: false,
                });
                return Head::Complete(H2_PREFACE_HEAD.len());
            }
            if H2_PREFACE_HEAD.starts_with(bytes) {
                return Head::Partial;
            }
        }
        let index = self.heads;
        let mut slots = h1::fields();
        match request::parse(bytes, &mut slots) {
            Ok(Some(head)) => {
                self.heads += 1;
                // An `Upgrade` request or `CONNECT` is followed like any
                // other: only the server knows whether the protocol switched
                // (`switched`).
                self.state = match head.framing {
                    Framing::Empty => State::Head,
                    Framing::Length(n) => State::Length(n),
                    Framing::Chunked => State::Chunked(Chunk::Start),
                };
                Head::Complete(head.len)
            }
            Ok(None) => Head::Partial,
            Err(Refused::Ambiguous(reason)) => {
                self.heads += 1;
                let _ = self.watch.0.ambiguous.set(AmbiguousHead {
                    request: index,
                    reason,
                });
                self.stop();
                Head::Stopped
            }
            // hyper answers it 400, 414 or 431 and closes the connection.
            Err(_) => {
                self.stop();
                Head::Stopped
            }
        }
    }

    /// Consumes HTTP/2 bytes (at least one), noting header blocks.
    fn h2_bytes(&mut self, mut frames: H2Frames, bytes: &[u8]) -> usize {
        let used;
        if frames.preface > 0 {
            used = bytes.len().min(usize::from(frames.preface));
            frames.preface -= used as u8;
        } else if frames.left > 0 {
            used = bytes.len().min(frames.left as usize);
            frames.left -= used as u32;
            if frames.left == 0 {
                self.h2_frame_done(&mut frames);
            }
        } else {
            let have = usize::from(frames.have);
            used = bytes.len().min(9 - have);
            frames.header[have..have + used].copy_from_slice(&bytes[..used]);
            frames.have += used as u8;
            if frames.have == 9 {
                let [l0, l1, l2, kind, flags, ..] = frames.header;
                frames.have = 0;
                frames.left = u32::from_be_bytes([0, l0, l1, l2]);
                let block = kind == H2_HEADERS || kind == H2_CONTINUATION;
                frames.ends_block = block && flags & H2_END_HEADERS != 0;
                if block && self.watch.header_block_since().is_none() {
                    self.watch.set_header_block(Some(Instant::now()));
                }
                if frames.left == 0 {
                    self.h2_frame_done(&mut frames);
                }
            }
        }
        self.state = State::H2(frames);
        used
    }

    fn h2_frame_done(&mut self, frames: &mut H2Frames) {
        if std::mem::take(&mut frames.ends_block) {
            self.watch.set_header_block(None);
        }
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
    fn http2_frames_are_followed_but_never_read_as_heads() {
        let mut stream = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        stream.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        stream.extend_from_slice(AMBIGUOUS);
        let scan = fed(&[&stream[..5], &stream[5..]]);
        assert!(matches!(scan.state, State::H2(_)), "{:?}", scan.state);
        assert_eq!(flagged(&scan), None);
    }

    /// An HTTP/2 frame header: length, type, flags, stream 1.
    fn frame(len: u32, kind: u8, flags: u8) -> Vec<u8> {
        let [_, l0, l1, l2] = len.to_be_bytes();
        vec![l0, l1, l2, kind, flags, 0, 0, 0, 1]
    }

    #[test]
    fn an_open_http2_header_block_is_reported_until_it_ends() {
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        let settings = frame(0, 0x4, 0);
        // HEADERS without END_HEADERS, then CONTINUATION with it.
        let headers = [frame(3, H2_HEADERS, 0), b"abc".to_vec()].concat();
        let continuation = [frame(2, H2_CONTINUATION, H2_END_HEADERS), b"de".to_vec()].concat();
        let data = [frame(4, 0x0, 0x1), b"body".to_vec()].concat();
        let stream = [preface, settings, headers, continuation.clone(), data].concat();
        let end_of_block = stream.len() - 13;
        for at in 0..=stream.len() {
            let mut scan = scan();
            scan.feed(&stream[..at]);
            let open_from = stream.len() - 13 - continuation.len() - 12 + 9;
            let open = (open_from..end_of_block).contains(&at);
            assert_eq!(
                scan.watch.header_block_since().is_some(),
                open,
                "split at {at}"
            );
            scan.feed(&stream[at..]);
            assert_eq!(scan.watch.header_block_since(), None, "split at {at}");
            assert!(matches!(scan.state, State::H2(_)));
        }
    }

    #[test]
    fn an_upgrade_without_a_switch_keeps_the_watch_on() {
        let upgrade = b"GET /ws HTTP/1.1\r\nUpgrade: foo\r\nConnection: upgrade\r\n\r\n";
        let connect = b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n";
        for first in [&upgrade[..], connect] {
            let scan = fed(&[first, AMBIGUOUS]);
            assert_eq!(flagged(&scan).map(|h| h.request), Some(1));
        }
    }

    #[test]
    fn heads_hyper_refuses_end_the_watch() {
        let http10_chunked = b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        let bad_name = b"GET / HTTP/1.1\r\nBad Name: 1\r\n\r\n";
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "X-A: 1\r\n".repeat(h1::MAX_HEADERS + 1)
        );
        for first in [&http10_chunked[..], bad_name, many.as_bytes()] {
            let scan = fed(&[first, AMBIGUOUS]);
            assert_eq!((scan.state, flagged(&scan)), (State::Off, None));
        }
        // At the limit, hyper reads it: so does the watch.
        let most = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "X-A: 1\r\n".repeat(h1::MAX_HEADERS)
        );
        let scan = fed(&[most.as_bytes(), AMBIGUOUS]);
        assert_eq!(flagged(&scan).map(|h| h.request), Some(1));
    }

    #[tokio::test]
    async fn a_switched_protocol_ends_the_watch() {
        let (mut client, server) = tokio::io::duplex(1024);
        let mut watched = Watched::new(server, 8192);
        let watch = watched.watch();
        let upgrade = b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n";
        client.write_all(upgrade).await.unwrap();
        let mut got = vec![0; upgrade.len()];
        watched.read_exact(&mut got).await.unwrap();
        assert_eq!(watch.next_request(), None);
        watch.switched();
        client.write_all(AMBIGUOUS).await.unwrap();
        let mut tunnel = vec![0; AMBIGUOUS.len()];
        watched.read_exact(&mut tunnel).await.unwrap();
        assert_eq!(watched.scan.state, State::Off);
        assert_eq!(flagged(&watched.scan), None);
    }

    #[test]
    fn oversize_heads_and_garbage_end_the_scan() {
        let bad_chunk = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        let bad_length = b"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n";
        let garbage = b"\x16\x03\x01 not http\r\n\r\n";
        for first in [&bad_chunk[..], bad_length, garbage] {
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
