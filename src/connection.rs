//! A client connection's stream, and the HTTP/1 driver (`serve_h1`) with
//! its engine (`engine`: heads parsed once, bodies fed as the request road
//! asks, answers written by hyper's server rules).
//!
//! Parking of idle HTTP/1 keep-alive connections: once a connection has
//! nothing in flight and no bytes moved for a while, the engine's serving
//! stretch ends (its read and write buffers and state dropped) without the
//! client seeing anything, only the socket is kept, with what had been read
//! of a next head, and a fresh stretch picks the socket up again when the
//! client sends more. nginx frees a keep-alive connection's request buffers
//! the same way.
//!
//! The connection's stream also keeps its timing: a request head must be
//! complete within `limits.header_timeout` of the connection going idle
//! (one timer per serving stretch, not one per request), an idle connection
//! is closed after `limits.idle_timeout` (parked or not), and a write the
//! client accepts no bytes of for `limits.send_timeout` fails the connection
//! (the watchdog sits on the stream, so it covers HTTP/1, HTTP/2 and
//! tunnels). It counts requests whose answer the client gave up on before
//! it came, so the server can close an HTTP/2 connection that resets
//! streams in a flood.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::task::AtomicWaker;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio::time::{Instant, Sleep};

use crate::client_body::give_kept;
use crate::metrics::ConnectionMetrics;

mod engine;

pub use engine::Service;
use engine::Stretch;

/// How long an HTTP/1 connection stays quiet (nothing in flight, no bytes
/// read or written) before it is parked: between this and twice this.
pub const PARK_AFTER: Duration = Duration::from_secs(1);

/// Requests a client may give up on before their answer, beyond those it
/// let finish, before its connection counts as a reset flood. Browsers
/// cancel a few on every navigation away; the 2023 "rapid reset" attack
/// cancels every stream it opens, thousands a second.
pub const CANCEL_ALLOWANCE: u32 = 100;

/// What a parked connection keeps: its socket, and a way to wait for it.
pub trait Socket: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The TCP socket underneath, whose readiness wakes a parked connection.
    fn tcp(&self) -> &TcpStream;

    /// Ready once a read may find bytes, so that a connection waiting for
    /// its next request makes its read buffer only when they come: a plain
    /// socket's readiness; a TLS stream may hold decrypted bytes already,
    /// so it is always ready.
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

impl Socket for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }

    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_read_ready(cx)
    }
}

impl Socket for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }

    fn poll_readable(&self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// When idle connections are parked. How often that happens is counted in
/// the metrics (`queuegate_parks_total` and the like).
#[derive(Clone, Debug)]
pub struct Parking {
    after: Duration,
}

impl Parking {
    /// Parks connections that have been quiet for `after` (up to twice that).
    pub fn after(after: Duration) -> Parking {
        Parking {
            after: after.max(Duration::from_millis(1)),
        }
    }
}

impl Default for Parking {
    fn default() -> Parking {
        Parking::after(PARK_AFTER)
    }
}

/// One connection's activity, seen by its stream and its service.
#[derive(Debug)]
pub struct Activity {
    /// Requests handed to the service whose response body is not yet done.
    in_flight: AtomicU32,
    /// Requests handed to the service.
    requests: AtomicU64,
    /// Bytes were read or written since the last look.
    moved: AtomicBool,
    /// Bytes were read since the current serving stretch began.
    read_lately: AtomicBool,
    /// The last write or flush could not complete.
    write_blocked: AtomicBool,
    /// The engine is between requests (waiting for a head).
    between_requests: AtomicBool,
    /// When the connection last had nothing in flight: the next request
    /// head is due within the head timeout of this.
    idle_since: Mutex<Instant>,
    /// Requests answered, and requests given up on before their answer.
    answered: AtomicU32,
    cancelled: AtomicU32,
    /// Notified once cancelled requests outrun answered ones by more than
    /// [`CANCEL_ALLOWANCE`].
    flood: Notify,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            in_flight: AtomicU32::new(0),
            requests: AtomicU64::new(0),
            moved: AtomicBool::new(false),
            read_lately: AtomicBool::new(false),
            write_blocked: AtomicBool::new(false),
            between_requests: AtomicBool::new(true),
            idle_since: Mutex::new(Instant::now()),
            answered: AtomicU32::new(0),
            cancelled: AtomicU32::new(0),
            flood: Notify::new(),
        }
    }

    /// Call when the service starts answering a request; the guard counts
    /// it as given up on unless [`Answering::answered`] is called.
    pub fn answering(self: &Arc<Self>) -> Answering {
        Answering(Some(self.clone()))
    }

    /// Resolves once the client has given up on too many requests (see
    /// [`CANCEL_ALLOWANCE`]).
    pub async fn flooded(&self) {
        self.flood.notified().await;
    }

    /// Since when nothing has been in flight; `None` while something is.
    pub fn idle_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        Some(self.since())
    }

    fn since(&self) -> Instant {
        match self.idle_since.lock() {
            Ok(since) => *since,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    /// Call when the service is handed a request; the guard ends it.
    pub fn request(self: &Arc<Self>) -> InFlight {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Whether the engine is between requests with everything written, and
    /// nothing moved since the last look (which this look resets).
    ///
    /// An idle connection is parked only once it has answered a request,
    /// or while its serving stretch has read nothing at all (as hyper ended
    /// one silently): `requests_before` is the count when the current
    /// serving stretch began.
    fn may_park(&self, requests_before: u64) -> bool {
        let quiet = !self.moved.swap(false, Ordering::Relaxed);
        let requests = self.requests();
        quiet
            && requests > 0
            && (requests > requests_before || !self.read_lately.load(Ordering::Relaxed))
            && self.in_flight.load(Ordering::Relaxed) == 0
            && self.between_requests.load(Ordering::Relaxed)
            && !self.write_blocked.load(Ordering::Relaxed)
    }

    /// When the next request head is due.
    fn head_deadline(&self, head_timeout: Duration) -> Instant {
        self.since() + head_timeout
    }

    /// When the next request head is due, if one is being waited for:
    /// nothing in flight and nothing left to write. The engine begins
    /// reading a head only then, so this is the deadline a per-request
    /// header timer would keep, without a timer made for every request.
    fn head_due(&self, head_timeout: Duration) -> Option<Instant> {
        if self.write_blocked.load(Ordering::Relaxed) {
            return None;
        }
        self.idle_since().map(|since| since + head_timeout)
    }

    /// Restarts the clock of [`Activity::idle_since`] when nothing is in
    /// flight: the client sent to a parked connection, or the last answer
    /// has just been written out after a blocked write.
    fn restart_idle_clock(&self) {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return;
        }
        if let Ok(mut since) = self.idle_since.lock() {
            *since = Instant::now();
        }
    }

    /// Notes whether the last write or flush was blocked; the head clock
    /// starts again once a blocked answer is written out.
    fn note_blocked(&self, blocked: bool) {
        if self.write_blocked.swap(blocked, Ordering::Relaxed) && !blocked {
            self.restart_idle_clock();
        }
    }
}

/// A request being answered (see [`Activity::answering`]).
#[derive(Debug)]
pub struct Answering(Option<Arc<Activity>>);

impl Answering {
    /// The answer is ready: the client did not give up on this request.
    pub fn answered(mut self) {
        if let Some(activity) = self.0.take() {
            activity.answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        let Some(activity) = self.0.take() else {
            return;
        };
        let cancelled = activity.cancelled.fetch_add(1, Ordering::Relaxed) + 1;
        let answered = activity.answered.load(Ordering::Relaxed);
        if cancelled == answered.saturating_add(CANCEL_ALLOWANCE + 1) {
            activity.flood.notify_one();
        }
    }
}

/// A request in flight: ends when dropped (with the response body).
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            if let Ok(mut since) = self.0.idle_since.lock() {
                *since = Instant::now();
            }
        }
    }
}

/// A response body that keeps its request in flight until it is finished
/// or dropped.
#[derive(Debug)]
pub struct Tracked<B> {
    body: B,
    _in_flight: InFlight,
}

impl<B> Tracked<B> {
    pub fn new(body: B, in_flight: InFlight) -> Tracked<B> {
        Tracked {
            body,
            _in_flight: in_flight,
        }
    }
}

impl<B: HttpBody + Unpin> HttpBody for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// An accepted stream: bytes to replay first (what an earlier serving
/// stretch or the version check had read), then the stream; reads
/// and writes are noted in the connection's activity.
pub struct Parkable<S> {
    replay: Bytes,
    io: S,
    activity: Arc<Activity>,
    send: SendWatch,
}

/// The write-progress watchdog: a write or flush that stays blocked for
/// `timeout` fails.
struct SendWatch {
    timeout: Duration,
    /// Made on the first blocked write, then reused.
    deadline: Option<Pin<Box<Sleep>>>,
    /// The last write or flush could not complete: `deadline` is armed.
    stalled: bool,
}

impl SendWatch {
    /// Notes the outcome of a write, flush or shutdown: a blocked one arms
    /// the deadline (if not yet armed), one that went through disarms it.
    /// A blocked one past the deadline becomes an error.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = false;
            return polled;
        }
        if !self.stalled {
            self.stalled = true;
            let at = Instant::now() + self.timeout;
            match &mut self.deadline {
                Some(sleep) => sleep.as_mut().reset(at),
                None => self.deadline = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        let expired = match &mut self.deadline {
            Some(sleep) => sleep.as_mut().poll(cx).is_ready(),
            None => false,
        };
        if expired {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "send timeout: the client accepted no bytes",
            )));
        }
        Poll::Pending
    }
}

impl<S: Socket> Parkable<S> {
    /// `send_timeout`: how long a write may stay blocked (see [`SendWatch`]).
    pub fn new(io: S, send_timeout: Duration) -> Parkable<S> {
        let activity = Arc::new(Activity::new());
        Parkable {
            replay: Bytes::new(),
            io,
            activity,
            send: SendWatch {
                timeout: send_timeout,
                deadline: None,
                stalled: false,
            },
        }
    }

    /// The connection's activity, for its service.
    pub fn activity(&self) -> Arc<Activity> {
        self.activity.clone()
    }

    /// Reads the first bytes to tell an HTTP/2 prior-knowledge preface from
    /// HTTP/1, within `timeout`; they are replayed to whichever serves it. `None` when the
    /// client closed, failed or said nothing in time.
    pub async fn sniff_h2(&mut self, timeout: Duration) -> Option<bool> {
        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let mut first = BytesMut::with_capacity(PREFACE.len());
        let read = async {
            while first.len() < PREFACE.len() {
                match self.read_buf(&mut first).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) if !PREFACE.starts_with(&first) => return Some(false),
                    Ok(_) => {}
                }
            }
            Some(true)
        };
        let h2 = tokio::time::timeout(timeout, read).await.ok().flatten();
        self.replay = first.freeze();
        h2
    }

    /// Keeps `read` (what the engine had read of a next head) to be read
    /// again before what is unread of the replay: copied out, as the
    /// engine's buffer would keep its whole allocation.
    fn keep_read(&mut self, read: &[u8]) {
        if !read.is_empty() {
            self.replay = [read, &self.replay[..]].concat().into();
        }
    }

    /// Shuts the socket down, as a server does when it ends a connection.
    async fn close(&mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.shutdown()).await;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Parkable<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if give_kept(&mut this.replay, buf) {
            this.activity.read_lately.store(true, Ordering::Relaxed);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if buf.filled().len() > before {
                this.activity.moved.store(true, Ordering::Relaxed);
                this.activity.read_lately.store(true, Ordering::Relaxed);
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> Parkable<S> {
    fn note_write<T>(&self, polled: &Poll<io::Result<T>>) {
        let blocked = polled.is_pending();
        self.activity.note_blocked(blocked);
        if !blocked {
            self.activity.moved.store(true, Ordering::Relaxed);
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Parkable<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.note_write(&polled);
        this.send.check(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.note_write(&polled);
        this.send.check(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.activity.note_blocked(polled.is_pending());
        this.send.check(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        this.send.check(cx, polled)
    }
}

/// What every HTTP/1 connection of a server shares.
#[derive(Clone, Debug)]
pub struct Http1 {
    pub parking: Parking,
    /// A request head must end within this many bytes (`431` past it).
    pub head_limit: usize,
    /// A request head must arrive within this of the connection going
    /// idle (parked or not).
    pub head_timeout: Duration,
    /// A connection with nothing in flight is closed after this long.
    pub idle_timeout: Duration,
    /// Where parks and resumes are counted.
    pub connections: ConnectionMetrics,
}

/// Serves an HTTP/1 connection until it ends, parking it whenever it is
/// idle; `drain` turns true when the server drains. (An `async` block, so
/// that its arguments are kept once, where they were captured.)
// Not an `async fn`: its arguments would be kept twice.
#[allow(clippy::manual_async_fn)]
pub fn serve_h1<'a, S: Socket, Svc: Service>(
    http1: &'a Http1,
    mut io: Parkable<S>,
    service: &'a Svc,
    mut drain: watch::Receiver<bool>,
    remote: SocketAddr,
) -> impl Future<Output = ()> + 'a {
    async move {
        let activity = io.activity();
        loop {
            // Boxed: parked, the connection's task keeps only a pointer's worth.
            let stretch = Box::pin(engine::serve_until_idle(
                http1, io, service, &activity, &mut drain, &remote,
            ));
            io = match stretch.await {
                Stretch::Park(parked) => parked,
                Stretch::Over => return,
            };
            if !park(http1, &mut io, &activity, &mut drain, &remote).await {
                io.close().await;
                return;
            }
        }
    }
}

/// What a serving stretch's timer found.
enum Look {
    /// The request head is past its deadline: the connection is closed.
    HeadLate,
    /// Idle long enough: the connection is parked.
    Park,
    /// Neither: serving goes on.
    Serve,
}

/// Looks, when a serving stretch's timer fires, at whether the request head
/// is late and, every `parking.after` (`next_look`), whether the connection
/// may park (never while the server drains).
fn look(
    http1: &Http1,
    activity: &Activity,
    requests_before: u64,
    draining: bool,
    next_look: &mut Instant,
) -> Look {
    let now = Instant::now();
    if activity
        .head_due(http1.head_timeout)
        .is_some_and(|due| now >= due)
    {
        return Look::HeadLate;
    }
    if now >= *next_look {
        *next_look = now + http1.parking.after;
        if !draining && activity.may_park(requests_before) {
            return Look::Park;
        }
    }
    Look::Serve
}

/// Parks an idle HTTP/1 connection down to its socket (with what the
/// engine had read of a next head, to replay) until the client sends more
/// (`true`), or the server drains or the connection's deadline passes
/// (`false`: it is to be closed). Waits on the socket's readiness in place,
/// with no future of its own: a parked connection keeps little more than
/// its task.
async fn park<S: Socket>(
    http1: &Http1,
    io: &mut Parkable<S>,
    activity: &Activity,
    drain: &mut watch::Receiver<bool>,
    remote: &SocketAddr,
) -> bool {
    let parked = http1.connections.park();
    tracing::trace!(%remote, "connection parked");
    // Parked with part of a head: it is due as if never parked.
    // Parked with nothing: the connection may stay idle so long.
    let begun = !io.replay.is_empty();
    let deadline = if begun {
        activity.head_deadline(http1.head_timeout)
    } else {
        activity.since() + http1.idle_timeout
    };
    let tcp = io.io.tcp();
    let woken = tokio::select! {
        ready = std::future::poll_fn(|cx| tcp.poll_read_ready(cx)) => ready.is_ok(),
        _ = drain.changed() => false,
        () = tokio::time::sleep_until(deadline) => false,
    };
    drop(parked);
    if !woken {
        return false;
    }
    http1.connections.resumed();
    tracing::trace!(%remote, "connection resumed");
    // A head begun before the park stays due when it was; one begun
    // now is due within the head timeout from now.
    if !begun {
        activity.restart_idle_clock();
    }
    true
}

/// The earlier of `at` and `due`, if there is a `due`.
fn earliest(at: Instant, due: Option<Instant>) -> Instant {
    due.map_or(at, |due| due.min(at))
}

/// A future polled only when it asked to be: on its first poll, and after its
/// own waker fired. A connection's `select!` polls every branch each time the
/// connection is woken, for every read and write; the drain's `changed()`
/// takes, on each of those polls, a lock that all the server's connections
/// share. Wrapped, a poll in between is a flag check on the connection's own
/// memory.
pub struct WhenWoken<F> {
    inner: Pin<Box<F>>,
    signal: Arc<Signal>,
}

struct Signal {
    woken: AtomicBool,
    outer: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.outer.wake();
    }
}

impl<F: Future> WhenWoken<F> {
    pub fn new(inner: F) -> WhenWoken<F> {
        WhenWoken {
            inner: Box::pin(inner),
            signal: Arc::new(Signal {
                woken: AtomicBool::new(true),
                outer: AtomicWaker::new(),
            }),
        }
    }

    /// The wrapped future, to change it (a timer reset): it is polled on
    /// the next poll whether or not it was woken.
    pub fn inner_mut(&mut self) -> Pin<&mut F> {
        self.signal.woken.store(true, Ordering::Release);
        self.inner.as_mut()
    }
}

impl<F: Future> Future for WhenWoken<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Registered before the flag is read, so a wake in between is seen.
        self.signal.outer.register(cx.waker());
        if !self.signal.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let waker = Waker::from(self.signal.clone());
        self.inner.as_mut().poll(&mut Context::from_waker(&waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A waker that counts its wakes.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_wrapped_future_is_polled_only_after_its_own_wake() {
        let (tx, mut rx) = tokio::sync::oneshot::channel::<u8>();
        let polls = AtomicUsize::new(0);
        let inner = std::future::poll_fn(|cx| {
            polls.fetch_add(1, Ordering::SeqCst);
            Pin::new(&mut rx).poll(cx)
        });
        let mut wrapped = WhenWoken::new(inner);
        let outer = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(outer.clone());
        let mut cx = Context::from_waker(&waker);

        assert!(Pin::new(&mut wrapped).poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1, "the first poll reaches it");
        for _ in 0..5 {
            assert!(Pin::new(&mut wrapped).poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1, "no wake, no poll");
        assert_eq!(outer.0.load(Ordering::SeqCst), 0);

        tx.send(7).unwrap();
        assert_eq!(outer.0.load(Ordering::SeqCst), 1, "its wake wakes the task");
        assert_eq!(Pin::new(&mut wrapped).poll(&mut cx), Poll::Ready(Ok(7)));
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }
}
