//! The HTTP/1 engine: one serving stretch of a client connection, with
//! the connection's own read and write buffers. A request head is read
//! into the read buffer and parsed once (`h1::request::parse_head`), the
//! request made from it with its fields left where they were read (a
//! `Fields` list over the frozen head, no `HeaderMap`); its body
//! is fed to the request from the buffer and the socket only as the request
//! road asks for it (`client_body::Feed`), `100 Continue` written when it
//! is first asked for and no answer has begun; the answer's head is
//! written by hyper's server rules (`h1::answer`) and its body streamed
//! by the framing chosen, flushed whenever the body has nothing more yet.
//! Requests are served one after another; bytes after a head stay in the
//! buffer for the next. A body the answer left unread is drained from what
//! has arrived, else the connection closes (as hyper does).
//!
//! What a connection keeps while an answer streams: the stretch's future
//! (the socket, the answer's body and framing, the request's body feed),
//! not the service's future nor the answer's head, and no buffers while
//! the body has nothing more yet and all is written: the write buffer is
//! let go, and so is the read buffer when it holds nothing; the socket is
//! then watched through a small probe (a close, or pipelined bytes, kept
//! in order for the next head). Between requests, a plain connection makes
//! its read buffer only once bytes of the next request have come.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering;
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use http::{Method, StatusCode, Uri, Version};
use http_body::{Body as HttpBody, Frame};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::{earliest, look, Activity, Http1, Look, Parkable, Socket, WhenWoken};
use crate::client_body::{self, ClientBody, Feed, OnUpgrade, Upgraded, Want};
use crate::client_request::ClientRequest;
use crate::fields::Fields;
use crate::h1::answer::{self, Asked, Sends};
use crate::h1::chunked::{self, Decoder, Step};
use crate::h1::request::{self, Framing, Refused};
use crate::h1::{self, FieldSpans};
use crate::message::Answer;

/// Answer bytes buffered beyond this are written out before more are made.
const WRITE_HIGH: usize = 64 * 1024;
/// The read buffer's first size, and how much room a read asks for.
const READ_ROOM: usize = 8 * 1024;
/// The most a look at the socket reads while an answer streams and the
/// read buffer has no room (see `Engine::poll_probe`).
const PROBE: usize = 64;

/// What a connection's requests are answered by.
pub trait Service {
    type Body: HttpBody<Data = Bytes> + Unpin;
    type Future: Future<Output = Answer<Self::Body>>;
    fn call(&self, req: ClientRequest) -> Self::Future;
}

impl<F, Fut, B> Service for F
where
    F: Fn(ClientRequest) -> Fut,
    Fut: Future<Output = Answer<B>>,
    B: HttpBody<Data = Bytes> + Unpin,
{
    type Body = B;
    type Future = Fut;
    fn call(&self, req: ClientRequest) -> Fut {
        self(req)
    }
}

/// How a serving stretch ended.
pub(super) enum Stretch<S> {
    /// Idle: the socket to park, what was read of it kept to replay.
    Park(Parkable<S>),
    /// The connection is over (closed, or handed to a tunnel).
    Over,
}

/// A connection being served: its socket and buffers.
struct Engine<S> {
    io: Parkable<S>,
    read: BytesMut,
    write: BytesMut,
    /// The server drains: the next answer closes the connection.
    draining: bool,
}

/// A request head read, and what the engine keeps of it.
struct Parsed {
    method: Method,
    uri: Uri,
    version: Version,
    fields: Fields,
    framing: Framing,
    expect_continue: bool,
    keep_alive: bool,
    upgrade: bool,
}

/// What the engine keeps of a request while it is answered.
struct Ask {
    method: Method,
    http10: bool,
    keep_alive: bool,
    /// Where the socket goes if the answer is a `101`.
    upgrade: Option<oneshot::Sender<Upgraded>>,
}

/// An answer whose head is written.
enum Head<B> {
    /// Its body is to be sent.
    Body(B, answer::Written),
    /// A `101`: the connection is handed over.
    Switching,
}

/// A request body being read from the connection for its request.
struct Reader {
    feed: Feed,
    left: Left,
    expect_continue: bool,
    /// Failed: the connection cannot be read further.
    broken: bool,
}

enum Left {
    Length(u64),
    Chunked(Box<Decoder>),
    Done,
}

/// How answering a request ended.
enum Served {
    /// The connection may serve the next request.
    Again,
    /// Written out: the connection closes.
    Close,
    /// Over without more (broken, or its socket handed over).
    Gone,
    /// A `101` written: the socket is the tunnel's.
    Upgrade(oneshot::Sender<Upgraded>),
}

/// Serves one stretch of an HTTP/1 connection until it ends or goes idle.
///
/// This future is what a connection keeps while it is served (an event
/// stream's, for as long as it streams), so what lives across its waits is
/// kept small: requests are begun and answers' heads written in plain
/// functions, and only the answer's body and framing are held while it
/// streams.
pub(super) fn serve_until_idle<'a, S: Socket, Svc: Service>(
    http1: &'a Http1,
    io: Parkable<S>,
    service: &'a Svc,
    activity: &'a Activity,
    drain: &'a mut watch::Receiver<bool>,
    remote: &'a std::net::SocketAddr,
) -> impl Future<Output = Stretch<S>> + 'a {
    // Made here, so that the socket is kept once, in the engine.
    let mut engine = Engine::new(io, *drain.borrow_and_update());
    async move {
        let requests_before = activity.requests();
        activity.read_lately.store(false, Ordering::Relaxed);
        // One timer for the stretch, for both the look at whether to park and
        // the request head's deadline, polled only when it fires; one wait for
        // the drain. Each on its own receiver, which sees what `drain` had
        // seen.
        let mut waits = Waits {
            timer: None,
            next_look: Instant::now() + http1.parking.after,
            drained: None,
            drain: || {
                let mut drain = drain.clone();
                async move {
                    let _ = drain.changed().await;
                }
            },
        };
        loop {
            activity.between_requests.store(true, Ordering::Relaxed);
            let next = engine
                .next_head(http1, activity, requests_before, &mut waits)
                .await;
            activity.between_requests.store(false, Ordering::Relaxed);
            let (answering, reader, ask) = match next {
                Next::Head(parsed) => engine.begin(*parsed, service),
                Next::Park => return engine.park(),
                Next::Close => {
                    tracing::debug!(%remote, "connection closed or no request head in time");
                    engine.io.close().await;
                    return Stretch::Over;
                }
                Next::Refused(refused) => {
                    tracing::debug!(%remote, error = %refused, "request head refused");
                    engine.refuse(refused.status()).await;
                    return Stretch::Over;
                }
            };
            match engine.serve(answering, reader, ask, &mut waits).await {
                Served::Again => {}
                Served::Close => {
                    engine.io.close().await;
                    return Stretch::Over;
                }
                Served::Gone => return Stretch::Over,
                Served::Upgrade(tx) => {
                    let Engine { io, read, .. } = engine;
                    let _ = tx.send(Upgraded::new(read.freeze(), Box::new(io)));
                    return Stretch::Over;
                }
            }
        }
    }
}

/// What a serving stretch waits on besides its socket. Both waits are
/// made when a head is waited for, and let go while an answer streams
/// (when nothing looks at them).
struct Waits<D, M> {
    timer: Option<WhenWoken<tokio::time::Sleep>>,
    /// When the timer next looks at whether to park.
    next_look: Instant,
    /// The server's drain; not polled again once it has fired.
    drained: Option<WhenWoken<D>>,
    /// Makes the wait for the drain.
    drain: M,
}

impl<D: Future, M: FnMut() -> D> Waits<D, M> {
    /// The timer (made, if it was let go, for the next look or the head's
    /// deadline, whichever is first), the drain's wait, and the next look.
    fn all(
        &mut self,
        http1: &Http1,
        activity: &Activity,
    ) -> (
        &mut WhenWoken<tokio::time::Sleep>,
        &mut WhenWoken<D>,
        &mut Instant,
    ) {
        let next_look = self.next_look;
        let timer = self.timer.get_or_insert_with(|| {
            let at = earliest(next_look, activity.head_due(http1.head_timeout));
            WhenWoken::new(tokio::time::sleep_until(at))
        });
        let drained = drained(&mut self.drained, &mut self.drain);
        (timer, drained, &mut self.next_look)
    }

    /// The drain's wait, made if it was let go.
    fn drained(&mut self) -> &mut WhenWoken<D> {
        drained(&mut self.drained, &mut self.drain)
    }

    /// Lets both go: an answer streams, and nothing looks at them.
    fn shed(&mut self) {
        self.timer = None;
        self.drained = None;
    }
}

/// The drain's wait in `slot`, made by `drain` if it was let go.
fn drained<'a, D: Future>(
    slot: &'a mut Option<WhenWoken<D>>,
    drain: &mut impl FnMut() -> D,
) -> &'a mut WhenWoken<D> {
    slot.get_or_insert_with(|| WhenWoken::new(drain()))
}

/// What waiting for a request head found.
enum Next {
    /// Boxed: this is kept, with the future waiting for it, for as long as
    /// the stretch lasts.
    Head(Box<Parsed>),
    Park,
    Close,
    Refused(Refused),
}

impl<S: Socket> Engine<S> {
    /// The engine for a stretch of `io`, whose replay (what was read of
    /// it before) goes first into the read buffer.
    fn new(mut io: Parkable<S>, draining: bool) -> Engine<S> {
        let replay = std::mem::take(&mut io.replay);
        Engine {
            io,
            read: BytesMut::from(&replay[..]),
            write: BytesMut::new(),
            draining,
        }
    }

    /// Ends the stretch to park: what was read of a next head is kept.
    fn park(self) -> Stretch<S> {
        let Engine { mut io, read, .. } = self;
        io.keep_read(&read);
        Stretch::Park(io)
    }

    /// Reads until a request head is complete (or refused), keeping the
    /// head deadline, parking when idle long enough, closing an idle
    /// connection when the server drains.
    async fn next_head<D: Future>(
        &mut self,
        http1: &Http1,
        activity: &Activity,
        requests_before: u64,
        waits: &mut Waits<D, impl FnMut() -> D>,
    ) -> Next {
        loop {
            // Blank lines before a head are httparse's to skip, as it skips
            // them for hyper: CRLF or LF, never a lone CR.
            if !self.read.is_empty() {
                match self.take_head() {
                    Ok(Some(parsed)) => return Next::Head(Box::new(parsed)),
                    Ok(None) if self.read.len() >= http1.head_limit => {
                        return Next::Refused(Refused::TooLarge)
                    }
                    Ok(None) => {}
                    Err(refused) => return Next::Refused(refused),
                }
            }
            if self.draining && self.read.is_empty() {
                return Next::Close;
            }
            let (timer, drained, next_look) = waits.all(http1, activity);
            tokio::select! {
                read = poll_fn(|cx| self.poll_read_head(cx)) => match read {
                    Ok(0) | Err(_) => return Next::Close,
                    Ok(_) => {}
                },
                _ = drained, if !self.draining => {
                    self.draining = true;
                }
                () = &mut *timer => {
                    match look(http1, activity, requests_before, self.draining, next_look) {
                        Look::HeadLate => return Next::Close,
                        Look::Park if self.write.is_empty() => return Next::Park,
                        Look::Park | Look::Serve => {}
                    }
                    let next = earliest(*next_look, activity.head_due(http1.head_timeout));
                    timer.inner_mut().reset(next);
                }
            }
        }
    }

    /// Parses the head at the start of the read buffer, once, and takes it
    /// out of the buffer as the request it says.
    fn take_head(&mut self) -> Result<Option<Parsed>, Refused> {
        let mut slots = h1::fields();
        let Some(head) = request::parse_head(&self.read, &mut slots)? else {
            return Ok(None);
        };
        let method = head.method()?;
        let uri = head.uri()?;
        let spans = FieldSpans::of(head.headers, &self.read);
        let version = if head.http10 {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        // An ambiguous head is refused on the request road, which reads
        // its fields; nothing after it is read.
        let ambiguous = head.ambiguous.is_some();
        let (framing, expect_continue) = (head.framing, head.expect_continue);
        let keep_alive = head.keep_alive && !ambiguous;
        let upgrade = head.wants_upgrade && !ambiguous;
        let bytes = self.read.split_to(head.len).freeze();
        let fields = spans
            .into_fields(bytes)
            .map_err(|_| Refused::Malformed(httparse::Error::HeaderValue))?;
        let parsed = Parsed {
            method,
            uri,
            version,
            fields,
            framing,
            expect_continue,
            keep_alive,
            upgrade,
        };
        Ok(Some(parsed))
    }

    /// Answers a refused head as hyper does (no body, `connection:
    /// close`), then closes.
    async fn refuse(&mut self, status: StatusCode) {
        let mut resp = Answer::new(());
        *resp.status_mut() = status;
        let (mut parts, ()) = resp.into_parts();
        let asked = Asked {
            method: &Method::GET,
            http10: false,
            keep_alive: false,
        };
        answer::head(&mut self.write, &mut parts, asked, None, &date());
        if poll_fn(|cx| self.poll_write_out(cx)).await.is_ok() {
            self.io.close().await;
        }
    }

    /// Begins serving a request: its body is fed from the connection (see
    /// `pump`), and `service` is asked for the answer.
    fn begin<Svc: Service>(
        &mut self,
        parsed: Parsed,
        service: &Svc,
    ) -> (Svc::Future, Option<Reader>, Ask) {
        let Parsed {
            method,
            uri,
            version,
            fields,
            framing,
            expect_continue,
            keep_alive,
            upgrade,
        } = parsed;
        let (body, reader) = match framing {
            Framing::Empty => (ClientBody::empty(), None),
            Framing::Length(n) => Reader::new(Some(n), Left::Length(n), expect_continue),
            Framing::Chunked => Reader::new(None, Left::Chunked(Box::default()), expect_continue),
        };
        let http10 = version == Version::HTTP_10;
        let connect = method == Method::CONNECT;
        let mut req = ClientRequest::new(method.clone(), uri, version, fields, body);
        let upgrade = match upgrade && !connect {
            true => {
                let (on, tx) = OnUpgrade::new();
                req = req.with_upgrade(on);
                Some(tx)
            }
            false => None,
        };
        let ask = Ask {
            method,
            http10,
            keep_alive,
            upgrade,
        };
        (service.call(req), reader, ask)
    }

    /// Serves a begun request: waits for the answer, feeding the request's
    /// body, and writes it.
    // Not an `async fn`: its arguments would be kept twice.
    #[allow(clippy::manual_async_fn)]
    fn serve<'a, F, B, D, M>(
        &'a mut self,
        answering: F,
        mut reader: Option<Reader>,
        ask: Ask,
        waits: &'a mut Waits<D, M>,
    ) -> impl Future<Output = Served> + 'a
    where
        F: Future<Output = Answer<B>> + 'a,
        B: HttpBody<Data = Bytes> + Unpin + 'a,
        D: Future + 'a,
        M: FnMut() -> D + 'a,
    {
        async move {
            let Some(resp) = self.answer(answering, &mut reader, waits.drained()).await else {
                return Served::Gone;
            };
            let (mut body, sends, last) = match self.head(resp, &reader, &ask) {
                Head::Body(body, written) => (body, written.sends, written.last),
                Head::Switching => {
                    if poll_fn(|cx| self.poll_write_out(cx)).await.is_err() {
                        return Served::Gone;
                    }
                    return match ask.upgrade {
                        Some(tx) => Served::Upgrade(tx),
                        None => Served::Close,
                    };
                }
            };
            drop(ask);
            let sent = self.send_body(&mut body, &sends, &mut reader, waits).await;
            // Sent: the body's source is let go before the connection goes on.
            drop(body);
            self.finish(sent, last, reader.as_mut()).await
        }
    }

    /// Writes the answer's head: its body to send, and how.
    fn head<B: HttpBody>(
        &mut self,
        resp: Answer<B>,
        reader: &Option<Reader>,
        ask: &Ask,
    ) -> Head<B> {
        let broken = reader.as_ref().is_some_and(|r| r.broken);
        let asked = Asked {
            method: &ask.method,
            http10: ask.http10,
            keep_alive: ask.keep_alive && !self.draining && !broken,
        };
        let (mut parts, body) = resp.into_parts();
        let size = if body.is_end_stream() {
            None
        } else {
            Some(body.size_hint().exact())
        };
        let written = answer::head(&mut self.write, &mut parts, asked, size, &date());
        if parts.status == StatusCode::SWITCHING_PROTOCOLS {
            return Head::Switching;
        }
        Head::Body(body, written)
    }

    /// Waits for the service's answer, feeding the request's body and
    /// noticing the client's close meanwhile: `None` when the connection is
    /// over. The service's future is dropped as soon as it has answered,
    /// so a long answer (an event stream) does not keep it.
    async fn answer<R>(
        &mut self,
        answering: impl Future<Output = R>,
        reader: &mut Option<Reader>,
        drained: &mut WhenWoken<impl Future>,
    ) -> Option<R> {
        let mut answering = pin!(answering);
        poll_fn(|cx| {
            if !self.draining && drained.poll_unpin(cx).is_ready() {
                self.draining = true;
            }
            // The answer first: one ready at once needs no look at the
            // socket (as hyper looks only while the service is pending).
            if let Poll::Ready(resp) = answering.as_mut().poll(cx) {
                return Poll::Ready(Some(resp));
            }
            if self.pump(cx, reader, true).is_err() {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await
    }

    /// After the answer: written out, and the request's body drained from
    /// what has arrived (else the connection closes).
    async fn finish(
        &mut self,
        sent: Result<(), ()>,
        last: bool,
        reader: Option<&mut Reader>,
    ) -> Served {
        if sent.is_err() || poll_fn(|cx| self.poll_write_out(cx)).await.is_err() {
            return Served::Gone;
        }
        let mut drained = true;
        if let Some(reader) = reader {
            drained = reader.drain(&mut self.read).is_ok_and(|done| done);
            if !drained && !reader.broken {
                // One look at what the socket has, as hyper takes.
                self.read.reserve(READ_ROOM);
                if let Some(Ok(n)) = self.io.read_buf(&mut self.read).now_or_never() {
                    drained = n > 0 && reader.drain(&mut self.read).is_ok_and(|done| done);
                }
            }
        }
        if last || !drained {
            return Served::Close;
        }
        // Nothing of a next request yet: no buffer is kept for it until its
        // bytes come (see `poll_read_head`).
        if self.read.is_empty() {
            self.read = BytesMut::new();
        }
        Served::Again
    }

    /// Streams the answer's body by its framing.
    async fn send_body<B: HttpBody<Data = Bytes> + Unpin, D: Future>(
        &mut self,
        body: &mut B,
        sends: &Sends,
        reader: &mut Option<Reader>,
        waits: &mut Waits<D, impl FnMut() -> D>,
    ) -> Result<(), ()> {
        let mut left = match *sends {
            Sends::Length(0) => return Ok(()),
            Sends::Length(n) => Some(n),
            Sends::Chunked(_) | Sends::Close => None,
        };
        // The request's body is fed, and the client's close noticed,
        // whenever the answer waits.
        poll_fn(|cx| loop {
            if self.write.len() >= WRITE_HIGH {
                match self.poll_write_out(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(())) => return Poll::Ready(Err(())),
                    Poll::Pending => {
                        return match self.pump(cx, reader, false) {
                            Ok(()) => Poll::Pending,
                            Err(()) => Poll::Ready(Err(())),
                        }
                    }
                }
            }
            let frame = match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending => {
                    if self.pump(cx, reader, false).is_err() {
                        return Poll::Ready(Err(()));
                    }
                    // Nothing more yet: what is made goes out (an event
                    // stream's pieces each as it comes).
                    ready!(self.poll_write_out(cx))?;
                    self.shed(reader);
                    waits.shed();
                    return Poll::Pending;
                }
                Poll::Ready(frame) => frame,
            };
            match frame {
                Some(Ok(frame)) => {
                    if encode(&mut self.write, sends, &mut left, frame) {
                        return Poll::Ready(Ok(()));
                    }
                }
                Some(Err(_)) => return Poll::Ready(Err(())),
                None => {
                    if let Sends::Chunked(_) = sends {
                        self.write.extend_from_slice(chunked::LAST);
                    }
                    // A body shorter than its length breaks the message.
                    return Poll::Ready(if left.is_some_and(|l| l > 0) {
                        Err(())
                    } else {
                        Ok(())
                    });
                }
            }
        })
        .await
    }

    /// Feeds the request's body what it asks for, writes what is buffered
    /// (a `100 Continue`), and while nothing is being read notices the
    /// client closing; an error when the connection is over. `waiting`:
    /// no answer has begun.
    fn pump(
        &mut self,
        cx: &mut Context<'_>,
        reader: &mut Option<Reader>,
        waiting: bool,
    ) -> Result<(), ()> {
        if let Some(r) = reader.as_mut().filter(|r| !r.done()) {
            while r.feed.want(cx) == Want::Frame {
                if r.expect_continue {
                    r.expect_continue = false;
                    if waiting {
                        self.write
                            .extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                    }
                }
                if r.step(&mut self.read) {
                    continue;
                }
                self.read.reserve(READ_ROOM);
                match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read) {
                    Poll::Pending => break,
                    Poll::Ready(Ok(0)) => {
                        r.fail(client_body::Error::Io(io::ErrorKind::UnexpectedEof.into()))
                    }
                    Poll::Ready(Ok(_)) => {}
                    Poll::Ready(Err(err)) => r.fail(client_body::Error::Io(err)),
                }
            }
        } else if self.read.is_empty() && reader.as_ref().is_none_or(|r| !r.broken) {
            // hyper's `mid_message_detect_eof`.
            match self.poll_probe(cx) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Err(()),
                Poll::Ready(Ok(_)) | Poll::Pending => {}
            }
        }
        if waiting && !self.write.is_empty() {
            if let Poll::Ready(Err(())) = self.poll_write_out(cx) {
                return Err(());
            }
        }
        Ok(())
    }

    /// Reads more of a request head. A connection between requests, with
    /// no read buffer, makes one only once the socket has bytes for it.
    fn poll_read_head(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.read.capacity() == 0 && self.io.replay.is_empty() {
            ready!(self.io.io.poll_readable(cx))?;
        }
        self.read.reserve(READ_ROOM);
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read)
    }

    /// Looks at the socket while no body is being read: the client's
    /// close, or bytes it sent ahead (a pipelined request), which are added
    /// to the read buffer in order for the next head. They are read into
    /// the room the buffer has; a buffer with none gets only what arrived,
    /// by way of a small probe, so an answer that streams for long keeps no
    /// read buffer while nothing comes.
    fn poll_probe(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.read.capacity() > self.read.len() {
            return tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read);
        }
        let mut probe = [0; PROBE];
        let mut buf = ReadBuf::new(&mut probe);
        ready!(Pin::new(&mut self.io).poll_read(cx, &mut buf))?;
        self.read.extend_from_slice(buf.filled());
        Poll::Ready(Ok(buf.filled().len()))
    }

    /// Gives back the buffers while the answer waits for its body with
    /// everything written: the write buffer, and the read buffer when it
    /// holds nothing and no request body is being read from it. An answer
    /// that streams for long (an event stream) keeps neither while it
    /// waits; each is made again when something comes.
    fn shed(&mut self, reader: &Option<Reader>) {
        self.write = BytesMut::new();
        if self.read.is_empty() && reader.as_ref().is_none_or(Reader::done) {
            self.read = BytesMut::new();
        }
    }

    /// Writes out the write buffer and flushes.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        while !self.write.is_empty() {
            match ready!(Pin::new(&mut self.io).poll_write(cx, &self.write)) {
                Ok(0) | Err(_) => return Poll::Ready(Err(())),
                Ok(n) => self.write.advance(n),
            }
        }
        self.write.clear();
        Poll::Ready(ready!(Pin::new(&mut self.io).poll_flush(cx)).map_err(|_| ()))
    }
}

/// Encodes a frame of the answer's body into `dst`; `true` once a body
/// of known length is complete (the rest is not sent).
fn encode(dst: &mut BytesMut, sends: &Sends, left: &mut Option<u64>, frame: Frame<Bytes>) -> bool {
    match frame.into_data() {
        Ok(data) => match (sends, left) {
            (Sends::Chunked(_), _) => {
                if !data.is_empty() {
                    chunked::chunk(dst, &data);
                }
                false
            }
            (_, Some(left)) => {
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(data.len());
                dst.extend_from_slice(&data[..n]);
                *left -= n as u64;
                *left == 0
            }
            (_, None) => {
                dst.extend_from_slice(&data);
                false
            }
        },
        Err(frame) => {
            if let (Sends::Chunked(declared), Ok(trailers)) = (sends, frame.into_trailers()) {
                if !chunked::last_with_trailers(dst, &trailers, declared) {
                    dst.extend_from_slice(chunked::LAST);
                }
                // The body ends with its trailers.
                *left = Some(0);
                return true;
            }
            false
        }
    }
}

impl Reader {
    fn new(length: Option<u64>, left: Left, expect_continue: bool) -> (ClientBody, Option<Reader>) {
        let (body, feed) = ClientBody::h1(length);
        let reader = Reader {
            feed,
            left,
            expect_continue,
            broken: false,
        };
        (body, Some(reader))
    }

    fn done(&self) -> bool {
        self.broken || matches!(self.left, Left::Done)
    }

    fn fail(&mut self, err: client_body::Error) {
        self.broken = true;
        self.left = Left::Done;
        self.feed.send(Err(err), true);
    }

    /// Hands the body its next frame from `read`: `false` when more bytes
    /// are needed first.
    fn step(&mut self, read: &mut BytesMut) -> bool {
        match self.next(read) {
            Ok(Some((frame, last))) => {
                self.feed.send(Ok(frame), last);
                true
            }
            Ok(None) => self.done(),
            Err(err) => {
                self.fail(client_body::Error::Framing(err));
                true
            }
        }
    }

    /// The next frame in `read`, and whether it is the last.
    fn next(&mut self, read: &mut BytesMut) -> Result<Option<(Frame<Bytes>, bool)>, h1::Error> {
        match &mut self.left {
            Left::Done => Ok(None),
            Left::Length(left) => {
                if read.is_empty() {
                    return Ok(None);
                }
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(read.len());
                *left -= n as u64;
                let last = *left == 0;
                if last {
                    self.left = Left::Done;
                }
                Ok(Some((Frame::data(read.split_to(n).freeze()), last)))
            }
            Left::Chunked(decoder) => match decoder.decode(read)? {
                Step::Data(data) => Ok(Some((Frame::data(data), false))),
                Step::Trailers(trailers) => {
                    self.left = Left::Done;
                    Ok(Some((Frame::trailers(trailers), true)))
                }
                Step::End => {
                    self.left = Left::Done;
                    self.feed.end();
                    Ok(None)
                }
                Step::More => Ok(None),
            },
        }
    }

    /// Reads what is left of the body out of `read`, for nobody: whether
    /// it has ended.
    fn drain(&mut self, read: &mut BytesMut) -> Result<bool, h1::Error> {
        while !self.done() {
            if self.next(read)?.is_none() {
                break;
            }
        }
        Ok(self.done() && !self.broken)
    }
}

thread_local! {
    /// The `date` of answers made in the same second.
    static DATE: Cell<(u64, [u8; 29])> = const { Cell::new((u64::MAX, [0; 29])) };
}

/// The `date` field's value now, formatted once a second per thread.
fn date() -> [u8; 29] {
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    DATE.with(|cached| {
        let (at, value) = cached.get();
        if at == secs {
            return value;
        }
        let value = answer::date(now);
        cached.set((secs, value));
        value
    })
}
