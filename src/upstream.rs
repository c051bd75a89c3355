//! The connections to the origin: per worker thread, a pool of HTTP/1.1
//! connections over plain TCP or TLS, each its socket, a read buffer and a
//! write buffer, spoken to with our own codec (`h1`).
//!
//! No task runs per connection or per request: a connection is driven by
//! the request using it, in that request's own task, first while the
//! response head is awaited ([`Pooled::send`], which also streams the
//! request body, with back-pressure, for an origin may answer before it
//! has read it all), then by the response body ([`UpstreamBody`]) as the
//! server streams it to the client. It goes back to its worker's pool only
//! when its response was read to the end, its request written, and the
//! origin keeps it open; idle ones are closed after the pool's idle
//! timeout, or once the origin has closed them.
//!
//! It does not rewrite requests (beyond leaving out of a body's trailers
//! the fields `proxy` names), retry them or make tunnels: `proxy` does.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::client_body::{ClientBody, ReadAhead};
use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderName, Method, Request, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::fields::Fields;
use crate::h1 as codec;
use crate::h1::chunked::{self, Step};
use crate::h1::response::{self, Length};
use crate::h1::write::{self, Encoder};
use crate::message::Answer;

/// Why an exchange with the origin failed: the origin's failure (answered
/// `502`), or the client's body (`ClientBody`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect")]
    Connect(#[source] io::Error),
    #[error("connect timed out")]
    ConnectTimeout,
    #[error("TLS handshake failed")]
    Tls(#[source] io::Error),
    #[error("HTTP exchange failed")]
    Http(#[source] HttpError),
    /// The client's request body could not be read as it was relayed (a
    /// malformed chunk, a body cut short): the client's error, not the
    /// origin's. The connection it was relayed on is closed.
    #[error("the request body could not be read")]
    ClientBody(#[source] crate::client_body::Error),
}

/// How an HTTP/1.1 exchange with the origin failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Closed before any byte of the answer came.
    #[error("the origin closed the connection before answering")]
    Closed,
    /// Closed after the answer began, before it was complete.
    #[error("the origin closed the connection before its answer was complete")]
    Incomplete,
    #[error("the connection to the origin failed")]
    Io {
        #[source]
        source: io::Error,
        /// Some of the answer had come.
        answered: bool,
    },
    #[error("the origin's answer is malformed")]
    Malformed(#[from] codec::Error),
    /// The request body ended short of its `Content-Length`.
    #[error("the request body ended before its length")]
    ShortBody,
}

impl HttpError {
    /// Whether it failed before any byte of the answer came, the way an
    /// exchange fails on a connection the origin had closed while idle:
    /// closed, or reset.
    pub fn unanswered(&self) -> bool {
        match self {
            HttpError::Closed => true,
            HttpError::Io { source, answered } => {
                !answered
                    && matches!(
                        source.kind(),
                        io::ErrorKind::ConnectionReset
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::BrokenPipe
                    )
            }
            _ => false,
        }
    }
}

impl From<HttpError> for Error {
    fn from(err: HttpError) -> Error {
        Error::Http(err)
    }
}

/// Reading the client's request body failed while it was relayed to the
/// origin (see [`Error::ClientBody`]).
#[derive(Debug, thiserror::Error)]
#[error("reading the request body failed")]
pub struct BodyError(#[source] crate::client_body::Error);

/// A request as it is sent to the origin: its fields a list (see
/// [`Fields`]), written straight into the connection's buffer.
#[derive(Debug)]
pub struct OriginRequest {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub fields: Fields,
    pub body: Outgoing,
}

impl From<Request<Outgoing>> for OriginRequest {
    fn from(req: Request<Outgoing>) -> OriginRequest {
        let (parts, body) = req.into_parts();
        OriginRequest {
            method: parts.method,
            uri: parts.uri,
            version: parts.version,
            fields: Fields::from(parts.headers),
            body,
        }
    }
}

/// The body of a request sent to the origin: the client's, streamed, or
/// none (a request sent again after a pooled connection turned out closed).
#[derive(Debug)]
pub enum Outgoing {
    /// The client's body, its trailers without the fields `withheld`.
    Client {
        body: ClientBody,
        withheld: &'static [HeaderName],
    },
    Empty,
}

impl Body for Outgoing {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Outgoing::Client { body, withheld } => Pin::new(body).poll_frame(cx).map(|frame| {
                frame.map(|frame| {
                    let mut frame = frame.map_err(BodyError)?;
                    if let Some(trailers) = frame.trailers_mut() {
                        for name in *withheld {
                            trailers.remove(name);
                        }
                    }
                    Ok(frame)
                })
            }),
            Outgoing::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Outgoing::Client { body, .. } => body.is_end_stream(),
            Outgoing::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Outgoing::Client { body, .. } => body.size_hint(),
            Outgoing::Empty => SizeHint::with_exact(0),
        }
    }
}

/// A socket to the origin, plain or TLS.
#[derive(Debug)]
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Read this much more when the read buffer is short of room.
const READ_SIZE: usize = 16 * 1024;

/// Write the request body into the write buffer while it holds less.
const WRITE_HIGH: usize = 64 * 1024;

/// One connection to the origin: its socket and its buffers.
struct Conn {
    io: Stream,
    read: BytesMut,
    write: BytesMut,
    /// Bytes were written to the socket since it was last flushed (TLS
    /// keeps them until then).
    unflushed: bool,
}

impl Conn {
    fn new(io: Stream) -> Conn {
        Conn {
            io,
            read: BytesMut::new(),
            write: BytesMut::new(),
            unflushed: false,
        }
    }

    /// Reads what the socket has into the read buffer: how many bytes (0
    /// at the end of the stream).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.read.capacity() - self.read.len() < READ_SIZE / 4 {
            self.read.reserve(READ_SIZE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read)
    }

    /// Writes out the write buffer and flushes the socket: ready once all
    /// of it went. `wrote` notes that some of it did.
    fn poll_drain(&mut self, cx: &mut Context<'_>, wrote: &mut bool) -> Poll<io::Result<()>> {
        while !self.write.is_empty() {
            let n = std::task::ready!(Pin::new(&mut self.io).poll_write(cx, &self.write))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *wrote = true;
            self.unflushed = true;
            self.write.advance(n);
        }
        if self.unflushed {
            std::task::ready!(Pin::new(&mut self.io).poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }

    /// Whether an idle connection is still open and silent, polled once
    /// without a task to wake: anything read (data, the end of the stream,
    /// an error) makes it unusable.
    fn open(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        self.read.is_empty() && self.poll_fill(&mut cx).is_pending()
    }
}

/// Where the origin is and how to reach it.
pub struct Origin {
    /// Host name or IP address (no brackets), as the socket is opened.
    pub host: String,
    pub port: u16,
    /// For an https:// origin: the TLS client config and the name its
    /// certificate must carry.
    pub tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    /// How long the TCP connect and TLS handshake may take together.
    pub connect_timeout: Duration,
}

impl Origin {
    /// Opens a connection (and its TLS session, for https://).
    async fn connect(&self) -> Result<Stream, Error> {
        let open = async {
            let tcp = TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(Error::Connect)?;
            // Small requests and answers must not wait for Nagle.
            let _ = tcp.set_nodelay(true);
            match &self.tls {
                None => Ok(Stream::Plain(tcp)),
                Some((config, name)) => tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name.clone(), tcp)
                    .await
                    .map(|tls| Stream::Tls(Box::new(tls)))
                    .map_err(Error::Tls),
            }
        };
        tokio::time::timeout(self.connect_timeout, open)
            .await
            .map_err(|_| Error::ConnectTimeout)?
    }
}

/// The origin's connection pool, one share per worker thread.
pub struct Pool {
    origin: Origin,
    shards: Box<[Arc<Shard>]>,
}

/// One worker's idle connections. Only that worker's thread touches it, so
/// its lock is never contended.
struct Shard {
    idle: Mutex<Vec<Idle>>,
    max_idle: usize,
    idle_timeout: Duration,
    /// Whether a task closing expired connections runs for this shard.
    sweeping: AtomicBool,
}

struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

impl Pool {
    /// A pool for `origin` with `workers` shares, each keeping at most
    /// `max_idle` connections, each idle for at most `idle_timeout`.
    pub fn new(origin: Origin, workers: usize, max_idle: usize, idle_timeout: Duration) -> Pool {
        let shards = (0..workers.max(1))
            .map(|_| {
                Arc::new(Shard {
                    idle: Mutex::new(Vec::with_capacity(max_idle.min(1024))),
                    max_idle,
                    idle_timeout,
                    sweeping: AtomicBool::new(false),
                })
            })
            .collect();
        Pool { origin, shards }
    }

    fn shard(&self, worker: usize) -> &Arc<Shard> {
        &self.shards[worker % self.shards.len()]
    }

    /// An idle connection of `worker`'s share, ready for a request: the
    /// most recently used one that is still open and not expired.
    pub fn checkout(&self, worker: usize) -> Option<Pooled> {
        let shard = self.shard(worker);
        let now = Instant::now();
        loop {
            let mut idle = lock(&shard.idle).pop()?;
            if now >= idle.since + shard.idle_timeout {
                continue;
            }
            if idle.conn.open() {
                return Some(Pooled::new(idle.conn, true, shard.clone()));
            }
        }
    }

    /// A new connection for `worker`'s share.
    pub async fn connect(&self, worker: usize) -> Result<Pooled, Error> {
        let stream = self.origin.connect().await?;
        Ok(Pooled::new(
            Box::new(Conn::new(stream)),
            false,
            self.shard(worker).clone(),
        ))
    }

    /// How many idle connections `worker`'s share holds.
    pub fn idle(&self, worker: usize) -> usize {
        lock(&self.shard(worker).idle).len()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while the lock was held left a valid Vec behind.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shard {
    /// Keeps `conn` for the next request, if there is room.
    fn put(self: &Arc<Self>, conn: Box<Conn>) {
        {
            let mut idle = lock(&self.idle);
            if idle.len() >= self.max_idle {
                return;
            }
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
        if !self.sweeping.swap(true, Ordering::Relaxed) {
            self.start_sweeping();
        }
    }

    /// Starts the task that closes this shard's expired and closed idle
    /// connections, on the runtime of the worker that uses it.
    fn start_sweeping(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sweeping.store(false, Ordering::Relaxed);
            return;
        };
        let shard: Weak<Shard> = Arc::downgrade(self);
        let every = (self.idle_timeout / 2).max(Duration::from_millis(10));
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(shard) = shard.upgrade() else {
                    return;
                };
                shard.sweep(Instant::now());
            }
        });
    }

    /// Closes the idle connections that expired or that the origin closed.
    fn sweep(&self, now: Instant) {
        let mut idle = lock(&self.idle);
        idle.retain_mut(|idle| now < idle.since + self.idle_timeout && idle.conn.open());
    }
}

/// The request body being written, and how. Boxed: most requests have no
/// body, and a connection (with the answer's body that holds it) is moved
/// through every layer of the request road on its way back.
enum Sending {
    /// All written (or nothing to write).
    Done,
    Body(Box<(Outgoing, Encoder)>),
}

/// A connection taken from the pool or just made, for one exchange.
pub struct Pooled {
    /// Boxed once when made, so a request's future and its response body
    /// move a pointer.
    conn: Box<Conn>,
    sending: Sending,
    /// Some bytes of the answer have come.
    answered: bool,
    /// The answer lets the connection serve another exchange.
    keep_alive: bool,
    /// It failed, or was left mid-message: never reused.
    broken: bool,
    /// Writing the request body failed; kept to be told if the answer
    /// then does not come.
    write_failed: Option<io::Error>,
    /// Taken from the pool (rather than just made): the origin may have
    /// closed it meanwhile.
    reused: bool,
    shard: Arc<Shard>,
}

impl std::fmt::Debug for Pooled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pooled")
            .field("broken", &self.broken)
            .field("reused", &self.reused)
            .finish_non_exhaustive()
    }
}

/// What a request got from the origin: its response head, and the
/// connection that carries the body (see [`UpstreamBody::new`]) or, after a
/// `101`, is handed over (see [`Pooled::upgraded`]).
pub struct Sent {
    pub response: Answer<OriginBody>,
    pub connection: Pooled,
}

/// Why a request got no response head.
pub struct Failed {
    pub error: Error,
    /// The request back, when it was never written to the connection.
    pub request: Option<OriginRequest>,
    /// The connection was taken from the pool: it may have been closed by
    /// the origin while idle.
    pub reused: bool,
}

/// The framing of an origin's response body, and how far it was read.
/// Its bytes are read from the connection that carries it (see
/// [`UpstreamBody`]).
#[derive(Debug)]
pub struct OriginBody {
    state: Decoding,
}

#[derive(Debug)]
enum Decoding {
    /// Read to the end (or there was none).
    Ended,
    /// This many bytes left.
    Length(u64),
    /// Boxed: the decoder's state would set the size of every body,
    /// which is moved through the request road with its answer.
    Chunked(Box<chunked::Decoder>),
    /// Until the origin closes the connection.
    Close,
}

impl OriginBody {
    fn new(length: Length) -> OriginBody {
        let state = match length {
            Length::Empty => Decoding::Ended,
            Length::Known(n) => Decoding::Length(n),
            Length::Chunked => Decoding::Chunked(Box::default()),
            Length::Close => Decoding::Close,
        };
        OriginBody { state }
    }

    /// Whether it was read to the end.
    pub fn ended(&self) -> bool {
        matches!(self.state, Decoding::Ended | Decoding::Length(0))
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            Decoding::Ended => SizeHint::with_exact(0),
            Decoding::Length(n) => SizeHint::with_exact(n),
            Decoding::Chunked(_) | Decoding::Close => SizeHint::default(),
        }
    }
}

/// The origin's side of a tunnel: what had been already read past the
/// `101`, then its socket.
pub type Handed = ReadAhead<Stream>;

impl Pooled {
    fn new(conn: Box<Conn>, reused: bool, shard: Arc<Shard>) -> Pooled {
        Pooled {
            conn,
            sending: Sending::Done,
            answered: false,
            keep_alive: true,
            broken: false,
            write_failed: None,
            reused,
            shard,
        }
    }

    /// Whether this connection was taken from the pool.
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Sends `req` and drives the connection, in the caller's task, until
    /// the response head arrives, writing the request body meanwhile.
    pub async fn send(mut self, req: impl Into<OriginRequest>) -> Result<Sent, Failed> {
        let mut req = req.into();
        let size = (!req.body.is_end_stream()).then(|| req.body.size_hint().exact());
        self.conn.write.clear();
        let encoder = write::request(
            &mut self.conn.write,
            &req.method,
            &req.uri,
            req.version,
            &mut req.fields,
            size,
        );
        let mut wrote = false;
        let written = std::future::poll_fn(|cx| self.conn.poll_drain(cx, &mut wrote)).await;
        if let Err(source) = written {
            let error = Error::Http(HttpError::Io {
                source,
                answered: false,
            });
            return Err(Failed {
                request: (!wrote).then_some(req),
                error,
                reused: self.reused,
            });
        }
        let head_request = req.method == Method::HEAD;
        if size.is_some() && encoder != Encoder::Length(0) {
            let body = req.body;
            self.sending = Sending::Body(Box::new((body, encoder)));
        }
        let head = std::future::poll_fn(|cx| {
            if let Err(err) = self.poll_send(cx) {
                return Poll::Ready(Err(err));
            }
            self.poll_head(cx, head_request).map_err(Error::Http)
        })
        .await;
        match head {
            Ok(response) => Ok(Sent {
                response,
                connection: self,
            }),
            Err(error) => Err(Failed {
                request: None,
                error,
                reused: self.reused,
            }),
        }
    }

    /// Writes what the request body has ready, while the write buffer
    /// has room (the back-pressure on the client). A failure to write is
    /// kept (see `write_failed`): the origin may have answered already.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Result<(), Error> {
        loop {
            let mut wrote = false;
            if let Poll::Ready(Err(err)) = self.conn.poll_drain(cx, &mut wrote) {
                self.broken = true;
                self.sending = Sending::Done;
                self.write_failed = Some(err);
                return Ok(());
            }
            if self.conn.write.len() >= WRITE_HIGH {
                return Ok(());
            }
            let Sending::Body(sending) = &mut self.sending else {
                return Ok(());
            };
            let (body, encoder) = &mut **sending;
            let frame = match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending => return Ok(()),
                Poll::Ready(frame) => frame,
            };
            let ended = body.is_end_stream();
            let done = match frame {
                Some(Err(BodyError(err))) => {
                    self.broken = true;
                    self.sending = Sending::Done;
                    return Err(Error::ClientBody(err));
                }
                Some(Ok(frame)) => encode_frame(&mut self.conn.write, encoder, frame, ended),
                None => encode_end(&mut self.conn.write, encoder),
            };
            match done {
                Encoded::More => {}
                Encoded::Done => self.sending = Sending::Done,
                Encoded::Short => {
                    self.broken = true;
                    self.sending = Sending::Done;
                }
                Encoded::Failed(err) => {
                    self.broken = true;
                    self.sending = Sending::Done;
                    return Err(Error::Http(err));
                }
            }
        }
    }

    /// A failure reading the answer: the write's, if writing failed
    /// first (the origin closed the connection on the request), else
    /// `failed`.
    fn failure(&mut self, failed: HttpError) -> HttpError {
        self.broken = true;
        match self.write_failed.take() {
            Some(source) if !self.answered => HttpError::Io {
                source,
                answered: false,
            },
            _ => failed,
        }
    }

    /// Reads until a final response head is in, `1xx` heads (other than
    /// `101`) skipped.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        head_request: bool,
    ) -> Poll<Result<Answer<OriginBody>, HttpError>> {
        loop {
            if !self.conn.read.is_empty() {
                match self.parse_head(head_request) {
                    Ok(Some(response)) => return Poll::Ready(Ok(response)),
                    Ok(None) => {}
                    Err(err) => {
                        self.broken = true;
                        return Poll::Ready(Err(HttpError::Malformed(err)));
                    }
                }
            }
            match std::task::ready!(self.conn.poll_fill(cx)) {
                Ok(0) => {
                    let closed = if self.answered {
                        HttpError::Incomplete
                    } else {
                        HttpError::Closed
                    };
                    return Poll::Ready(Err(self.failure(closed)));
                }
                Ok(_) => self.answered = true,
                Err(source) => {
                    let answered = self.answered;
                    return Poll::Ready(Err(self.failure(HttpError::Io { source, answered })));
                }
            }
        }
    }

    /// The final response head at the start of the read buffer, taken
    /// out of it; `None` while it is incomplete.
    fn parse_head(
        &mut self,
        head_request: bool,
    ) -> Result<Option<Answer<OriginBody>>, codec::Error> {
        loop {
            let mut fields = codec::fields();
            let Some(head) = response::parse(&self.conn.read, &mut fields)? else {
                return Ok(None);
            };
            if head.informational() {
                let len = head.len;
                self.conn.read.advance(len);
                if self.conn.read.is_empty() {
                    return Ok(None);
                }
                continue;
            }
            let framing = head.framing(head_request)?;
            let spans = head.spans(&self.conn.read);
            let len = head.len;
            let bytes = self.conn.read.split_to(len).freeze();
            let head = spans.answer(bytes)?;
            self.keep_alive = framing.keep_alive && framing.length != Length::Close;
            let body = OriginBody::new(framing.length);
            return Ok(Some(Answer::from_parts(head, body)));
        }
    }

    /// Reads the next frame of `body`, the answer's body this connection
    /// carries; `None` at its end.
    fn poll_body(
        &mut self,
        cx: &mut Context<'_>,
        body: &mut OriginBody,
    ) -> Poll<Result<Option<Frame<Bytes>>, HttpError>> {
        loop {
            let read = &mut self.conn.read;
            match &mut body.state {
                Decoding::Ended | Decoding::Length(0) => {
                    body.state = Decoding::Ended;
                    return Poll::Ready(Ok(None));
                }
                Decoding::Length(left) if !read.is_empty() => {
                    let n = usize::try_from(*left).unwrap_or(usize::MAX).min(read.len());
                    *left -= n as u64;
                    return Poll::Ready(Ok(Some(Frame::data(read.split_to(n).freeze()))));
                }
                Decoding::Chunked(decoder) => match decoder.decode(read) {
                    Ok(Step::Data(data)) => return Poll::Ready(Ok(Some(Frame::data(data)))),
                    Ok(Step::Trailers(trailers)) => {
                        body.state = Decoding::Ended;
                        return Poll::Ready(Ok(Some(Frame::trailers(trailers))));
                    }
                    Ok(Step::End) => {
                        body.state = Decoding::Ended;
                        return Poll::Ready(Ok(None));
                    }
                    Ok(Step::More) => {}
                    Err(err) => return Poll::Ready(Err(self.failure(err.into()))),
                },
                Decoding::Close if !read.is_empty() => {
                    return Poll::Ready(Ok(Some(Frame::data(read.split().freeze()))));
                }
                Decoding::Length(_) | Decoding::Close => {}
            }
            match std::task::ready!(self.conn.poll_fill(cx)) {
                Ok(0) if matches!(body.state, Decoding::Close) => {
                    body.state = Decoding::Ended;
                    self.keep_alive = false;
                    return Poll::Ready(Ok(None));
                }
                Ok(0) => return Poll::Ready(Err(self.failure(HttpError::Incomplete))),
                Ok(_) => {}
                Err(source) => {
                    let err = HttpError::Io {
                        source,
                        answered: true,
                    };
                    return Poll::Ready(Err(self.failure(err)));
                }
            }
        }
    }

    /// After a `101`: the socket, with what was read past the head.
    pub async fn upgraded(self) -> Option<Handed> {
        let conn = *self.conn;
        if !conn.write.is_empty() {
            return None;
        }
        Some(ReadAhead::new(conn.read.freeze(), conn.io))
    }

    /// Back to the pool, if the connection is ready for another request:
    /// its response read to the end, its request written, and the origin
    /// keeping it open.
    fn release(self) {
        let reusable = self.keep_alive
            && !self.broken
            && matches!(self.sending, Sending::Done)
            && self.conn.write.is_empty()
            && self.conn.read.is_empty();
        if reusable {
            self.shard.clone().put(self.conn);
        }
    }
}

/// What encoding a request body frame left to do.
enum Encoded {
    More,
    Done,
    /// The body ended short of its length: the connection cannot be used
    /// again (as hyper then closes it).
    Short,
    Failed(HttpError),
}

/// Encodes `frame` of a request body into `dst`; `ended` when the body
/// says it has ended with it (hyper's rules: data past a length is not
/// sent, empty data is skipped, trailers only after chunks and only the
/// declared ones).
fn encode_frame(
    dst: &mut BytesMut,
    encoder: &mut Encoder,
    frame: Frame<Bytes>,
    ended: bool,
) -> Encoded {
    let data = match frame.into_data() {
        Ok(data) => data,
        Err(frame) => {
            let Ok(trailers) = frame.into_trailers() else {
                return Encoded::More;
            };
            if let Encoder::Chunked(declared) = encoder {
                if !declared.is_empty() && chunked::last_with_trailers(dst, &trailers, declared) {
                    return Encoded::Done;
                }
            }
            return encode_end(dst, encoder);
        }
    };
    if data.is_empty() {
        return if ended {
            encode_end(dst, encoder)
        } else {
            Encoded::More
        };
    }
    match encoder {
        Encoder::Chunked(_) => {
            chunked::chunk(dst, &data);
            if ended {
                dst.extend_from_slice(chunked::LAST);
                return Encoded::Done;
            }
            Encoded::More
        }
        Encoder::Length(left) => {
            let n = usize::try_from(*left).unwrap_or(usize::MAX).min(data.len());
            dst.extend_from_slice(&data[..n]);
            *left -= n as u64;
            match (*left, ended) {
                (0, _) => Encoded::Done,
                (_, true) => Encoded::Short,
                (_, false) => Encoded::More,
            }
        }
    }
}

/// Ends a request body: the last chunk, or nothing after a whole length.
fn encode_end(dst: &mut BytesMut, encoder: &Encoder) -> Encoded {
    match encoder {
        Encoder::Chunked(_) => {
            dst.extend_from_slice(chunked::LAST);
            Encoded::Done
        }
        Encoder::Length(0) => Encoded::Done,
        Encoder::Length(_) => Encoded::Failed(HttpError::ShortBody),
    }
}

/// The origin's response body, streamed; polling it also drives the
/// connection that carries it (reading the response, and writing whatever
/// is left of the request body). Read to the end, the connection goes back
/// to the pool; dropped before, it is closed.
pub struct UpstreamBody {
    body: OriginBody,
    connection: Option<Pooled>,
    /// The origin's failure mid-body, held back for one poll (see
    /// [`UpstreamBody::poll_frame`]); boxed, as it is rare.
    failed: Option<Box<Error>>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("body", &self.body)
            .field("connection", &self.connection)
            .field("failed", &self.failed)
            .finish()
    }
}

impl UpstreamBody {
    /// `body`, carried by `connection`.
    pub fn new(body: OriginBody, connection: Pooled) -> UpstreamBody {
        UpstreamBody {
            body,
            connection: Some(connection),
            failed: None,
        }
    }

    /// Holds `err` back for one pending poll: what came before the
    /// failure is still in the server's buffer, often with the head, and
    /// is flushed meanwhile, so the client sees the answer cut short (as
    /// nginx shows it) rather than no answer at all.
    fn fail(
        &mut self,
        cx: &mut Context<'_>,
        err: Error,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.connection = None;
        self.failed = Some(Box::new(err));
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        if let Some(err) = this.failed.take() {
            return Poll::Ready(Some(Err(*err)));
        }
        let Some(connection) = &mut this.connection else {
            return Poll::Ready(None);
        };
        if let Err(err) = connection.poll_send(cx) {
            return this.fail(cx, err);
        }
        let frame = match std::task::ready!(connection.poll_body(cx, &mut this.body)) {
            Ok(frame) => frame,
            Err(err) => return this.fail(cx, Error::Http(err)),
        };
        if frame.is_none() || this.body.ended() {
            if let Some(connection) = this.connection.take() {
                connection.release();
            }
        }
        Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.failed.is_none() && self.body.ended()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // Dropped once read to the end (the server stops polling a body
        // that says it has ended): the connection may serve again.
        if let Some(connection) = self.connection.take() {
            if self.body.ended() {
                connection.release();
            }
        }
    }
}
