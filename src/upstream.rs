//! The connections to the origin: per worker thread, a pool of HTTP/1.1
//! connections made with hyper's connection API (`client::conn::http1`),
//! over plain TCP or TLS.
//!
//! No task runs per connection or per request: a connection is driven by
//! the request using it, in that request's own task, first while the
//! response head is awaited ([`Pooled::send`]), then by the response body
//! ([`UpstreamBody`]) as the server streams it to the client. It goes back
//! to its worker's pool only when its response was read to the end and the
//! origin keeps it open; idle ones are closed after the pool's idle timeout,
//! or once the origin has closed them.
//!
//! It does not rewrite requests (beyond leaving out of a body's trailers
//! the fields `proxy` names), retry them or make tunnels: `proxy` does.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

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
    Http(#[source] hyper::Error),
    /// The client's request body could not be read as it was relayed (a
    /// malformed chunk, a body cut short): the client's error, not the
    /// origin's. The connection it was relayed on is closed.
    #[error("the request body could not be read")]
    ClientBody(#[source] hyper::Error),
}

impl Error {
    /// An exchange that failed in hyper: the client's when what failed was
    /// reading its body (hyper gives that error back as the cause).
    fn exchange(err: hyper::Error) -> Error {
        let client = std::error::Error::source(&err).is_some_and(|cause| cause.is::<BodyError>());
        if client {
            Error::ClientBody(err)
        } else {
            Error::Http(err)
        }
    }
}

/// Reading the client's request body failed while it was relayed to the
/// origin. Its own type, so that hyper's failure to send a request can be
/// told to be the client's (see [`Error::ClientBody`]).
#[derive(Debug, thiserror::Error)]
#[error("reading the request body failed")]
pub struct BodyError(#[source] hyper::Error);

/// The body of a request sent to the origin: the client's, streamed, or
/// none (a request sent again after a pooled connection turned out closed).
#[derive(Debug)]
pub enum Outgoing {
    /// The client's body, its trailers without the fields `withheld`.
    Client {
        body: Incoming,
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

type Connection = http1::Connection<TokioIo<Stream>, Outgoing>;
type Sender = http1::SendRequest<Outgoing>;

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
    /// Opens a connection and makes it an HTTP/1.1 client connection.
    async fn connect(&self, builder: &http1::Builder) -> Result<(Sender, Connection), Error> {
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
        let stream = tokio::time::timeout(self.connect_timeout, open)
            .await
            .map_err(|_| Error::ConnectTimeout)??;
        builder
            .handshake(TokioIo::new(stream))
            .await
            .map_err(Error::Http)
    }
}

/// The origin's connection pool, one share per worker thread.
pub struct Pool {
    origin: Origin,
    builder: http1::Builder,
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
    sender: Sender,
    connection: Box<Connection>,
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
        Pool {
            origin,
            builder: http1::Builder::new(),
            shards,
        }
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
            let idle = lock(&shard.idle).pop()?;
            if now >= idle.since + shard.idle_timeout {
                continue;
            }
            let mut pooled = Pooled {
                sender: idle.sender,
                connection: idle.connection,
                ended: false,
                failed: false,
                reused: true,
                shard: shard.clone(),
            };
            if pooled.usable() {
                return Some(pooled);
            }
        }
    }

    /// A new connection for `worker`'s share.
    pub async fn connect(&self, worker: usize) -> Result<Pooled, Error> {
        let (sender, connection) = self.origin.connect(&self.builder).await?;
        Ok(Pooled {
            sender,
            connection: Box::new(connection),
            ended: false,
            failed: false,
            reused: false,
            shard: self.shard(worker).clone(),
        })
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
    /// Keeps `pooled` for the next request, if there is room.
    fn put(self: &Arc<Self>, pooled: Pooled) {
        let Pooled {
            sender, connection, ..
        } = pooled;
        {
            let mut idle = lock(&self.idle);
            if idle.len() >= self.max_idle {
                return;
            }
            idle.push(Idle {
                sender,
                connection,
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
        idle.retain_mut(|idle| {
            now < idle.since + self.idle_timeout && open(&mut idle.sender, &mut idle.connection)
        });
    }
}

/// Drives an idle connection once, without a task to wake: whether it is
/// still open and ready for a request.
fn open(sender: &mut Sender, connection: &mut Connection) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(connection).poll(&mut cx).is_pending() && sender.is_ready()
}

/// A connection taken from the pool or just made, for one exchange.
pub struct Pooled {
    sender: Sender,
    /// Boxed once when made (hyper's connection state is several hundred
    /// bytes), so a request's future and its response body move a pointer.
    connection: Box<Connection>,
    /// The connection future has completed: it is closed, or handed over
    /// after a `101`.
    ended: bool,
    /// It completed with an error.
    failed: bool,
    /// Taken from the pool (rather than just made): the origin may have
    /// closed it meanwhile.
    reused: bool,
    shard: Arc<Shard>,
}

impl std::fmt::Debug for Pooled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pooled")
            .field("ended", &self.ended)
            .field("reused", &self.reused)
            .finish_non_exhaustive()
    }
}

/// What a request got from the origin: its response head, and the
/// connection that carries the body (see [`UpstreamBody::new`]) or, after a
/// `101`, is handed over (see [`Pooled::upgraded`]).
pub struct Sent {
    pub response: Response<Incoming>,
    pub connection: Pooled,
}

/// Why a request got no response head.
pub struct Failed {
    pub error: Error,
    /// The request back, when it was never written to the connection.
    pub request: Option<Request<Outgoing>>,
    /// The connection was taken from the pool: it may have been closed by
    /// the origin while idle.
    pub reused: bool,
}

/// The origin's side of a tunnel: its socket, after what hyper had already
/// read past the `101`.
pub struct Handed {
    read: Bytes,
    io: Stream,
}

impl AsyncRead for Handed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.read.is_empty() {
            let n = this.read.len().min(buf.remaining());
            buf.put_slice(&this.read.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Handed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl Pooled {
    /// Whether the connection is open and ready for a request.
    fn usable(&mut self) -> bool {
        !self.ended && open(&mut self.sender, &mut self.connection)
    }

    /// Whether this connection was taken from the pool.
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Drives the connection once, noting when it has closed.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if self.ended {
            return;
        }
        if let Poll::Ready(ended) = Pin::new(&mut self.connection).poll(cx) {
            self.ended = true;
            if let Err(err) = ended {
                self.failed = true;
                tracing::debug!(error = %err, "origin connection ended with an error");
            }
        }
    }

    /// Sends `req` and drives the connection, in the caller's task, until
    /// the response head arrives.
    pub async fn send(mut self, req: Request<Outgoing>) -> Result<Sent, Failed> {
        let mut response = pin!(self.sender.try_send_request(req));
        let response = std::future::poll_fn(|cx| {
            self.drive(cx);
            response.as_mut().poll(cx)
        })
        .await;
        match response {
            Ok(response) => Ok(Sent {
                response,
                connection: self,
            }),
            Err(mut err) => Err(Failed {
                request: err.take_message(),
                error: Error::exchange(err.into_error()),
                reused: self.reused,
            }),
        }
    }

    /// After a `101`: drives the connection until hyper hands its socket
    /// over. `None` when it failed instead.
    pub async fn upgraded(mut self) -> Option<Handed> {
        std::future::poll_fn(|cx| {
            self.drive(cx);
            if self.ended {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        if self.failed {
            return None;
        }
        let http1::Parts { io, read_buf, .. } = self.connection.into_parts();
        Some(Handed {
            read: read_buf,
            io: io.into_inner(),
        })
    }

    /// Back to the pool, if the connection is ready for another request:
    /// its response read to the end, its request written, and the origin
    /// keeping it open.
    fn release(mut self) {
        if self.usable() {
            let shard = self.shard.clone();
            shard.put(self);
        }
    }
}

/// The origin's response body, streamed; polling it also drives the
/// connection that carries it (reading the response, and writing whatever
/// is left of the request body). Read to the end, the connection goes back
/// to the pool; dropped before, it is closed.
pub struct UpstreamBody {
    body: Incoming,
    connection: Option<Pooled>,
    /// The origin's failure mid-body, held back for one poll (see
    /// [`UpstreamBody::poll_frame`]).
    failed: Option<hyper::Error>,
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
    pub fn new(body: Incoming, connection: Pooled) -> UpstreamBody {
        UpstreamBody {
            body,
            connection: Some(connection),
            failed: None,
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(err) = this.failed.take() {
            return Poll::Ready(Some(Err(err)));
        }
        if let Some(connection) = &mut this.connection {
            connection.drive(cx);
        }
        let frame = std::task::ready!(Pin::new(&mut this.body).poll_frame(cx));
        match frame {
            Some(Err(err)) => {
                // What came before the failure is still in the server's
                // buffer, often with the head: one pending poll lets it be
                // flushed, so the client sees the answer cut short (as
                // nginx shows it) rather than no answer at all.
                this.connection = None;
                this.failed = Some(err);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Some(Ok(_)) if !this.body.is_end_stream() => {}
            _ => {
                if let Some(connection) = this.connection.take() {
                    connection.release();
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
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
            if self.body.is_end_stream() {
                connection.release();
            }
        }
    }
}
