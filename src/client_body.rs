//! A client's request body, whichever protocol brought it ([`ClientBody`]):
//! HTTP/2's is hyper's, HTTP/1's is fed by the connection's own engine
//! (`connection`) through a one-frame slot ([`Feed`]), read from the
//! socket only when the body asks for more, so a slow reader holds the
//! client back. Also a socket with the bytes already read from it
//! ([`ReadAhead`]), as a tunnel takes either side of an upgraded
//! connection: the client's, handed over after a `101` ([`Upgraded`],
//! waited for with the request's [`OnUpgrade`]), and the origin's.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// HTTP/2: hyper's reading of the stream failed.
    #[error(transparent)]
    H2(hyper::Error),
    /// HTTP/1: the body's bytes are not what its framing says.
    #[error("invalid request body: {0}")]
    Framing(#[source] crate::h1::Error),
    /// HTTP/1: the client closed or failed before the body's end.
    #[error("request body cut short: {0}")]
    Io(#[source] io::Error),
}

/// The body of a request as the request road sees it.
pub struct ClientBody(Kind);

enum Kind {
    Empty,
    H1 { pipe: Arc<Pipe>, left: Option<u64> },
    H2(hyper::body::Incoming),
}

impl fmt::Debug for ClientBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Kind::Empty => "ClientBody::Empty",
            Kind::H1 { .. } => "ClientBody::H1",
            Kind::H2(_) => "ClientBody::H2",
        })
    }
}

impl ClientBody {
    /// No body.
    pub fn empty() -> ClientBody {
        ClientBody(Kind::Empty)
    }

    /// An HTTP/2 request's body.
    pub fn h2(body: hyper::body::Incoming) -> ClientBody {
        ClientBody(Kind::H2(body))
    }

    /// An HTTP/1 body fed through the [`Feed`] returned with it, `length`
    /// bytes long if known (else chunked).
    pub fn h1(length: Option<u64>) -> (ClientBody, Feed) {
        let pipe = Arc::new(Pipe(Mutex::new(Slot::default())));
        (
            ClientBody(Kind::H1 {
                pipe: pipe.clone(),
                left: length,
            }),
            Feed(pipe),
        )
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match &mut self.get_mut().0 {
            Kind::Empty => Poll::Ready(None),
            Kind::H2(body) => Pin::new(body).poll_frame(cx).map_err(Error::H2),
            Kind::H1 { pipe, left } => {
                let polled = pipe.take(cx);
                if let (Poll::Ready(Some(Ok(frame))), Some(left)) = (&polled, left) {
                    if let Some(data) = frame.data_ref() {
                        *left = left.saturating_sub(data.len() as u64);
                    }
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Kind::Empty => true,
            Kind::H2(body) => body.is_end_stream(),
            Kind::H1 { pipe, left } => *left == Some(0) || pipe.ended(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::H2(body) => body.size_hint(),
            Kind::H1 { left: Some(n), .. } => SizeHint::with_exact(*n),
            Kind::H1 { left: None, .. } => SizeHint::default(),
        }
    }
}

impl Drop for ClientBody {
    fn drop(&mut self) {
        if let Kind::H1 { pipe, .. } = &self.0 {
            let mut slot = pipe.lock();
            slot.dropped = true;
            if let Some(waker) = slot.feed_waker.take() {
                waker.wake();
            }
        }
    }
}

/// The slot between an HTTP/1 body and the engine feeding it.
struct Pipe(Mutex<Slot>);

#[derive(Default)]
struct Slot {
    /// A frame read, not yet taken.
    frame: Option<Result<Frame<Bytes>, Error>>,
    /// Nothing follows `frame`.
    ended: bool,
    /// The body was polled and found the slot empty.
    wanted: bool,
    /// The body was polled at least once.
    polled: bool,
    dropped: bool,
    body_waker: Option<Waker>,
    feed_waker: Option<Waker>,
}

impl Pipe {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let mut slot = self.lock();
        slot.polled = true;
        if let Some(frame) = slot.frame.take() {
            slot.wanted = false;
            return Poll::Ready(Some(frame));
        }
        if slot.ended {
            return Poll::Ready(None);
        }
        slot.wanted = true;
        slot.body_waker = Some(cx.waker().clone());
        if let Some(waker) = slot.feed_waker.take() {
            waker.wake();
        }
        Poll::Pending
    }

    fn ended(&self) -> bool {
        let slot = self.lock();
        slot.ended && slot.frame.is_none()
    }
}

/// The engine's end of an HTTP/1 body (see [`ClientBody::h1`]).
pub struct Feed(Arc<Pipe>);

/// What the body wants of its feed.
#[derive(Debug, PartialEq, Eq)]
pub enum Want {
    /// Another frame.
    Frame,
    /// Nothing now.
    Nothing,
    /// Nothing ever: the body was dropped.
    Gone,
}

impl Feed {
    /// What the body wants; `Nothing` wakes `cx` when that changes.
    pub fn want(&self, cx: &mut Context<'_>) -> Want {
        let mut slot = self.0.lock();
        if slot.dropped {
            return Want::Gone;
        }
        if slot.wanted && slot.frame.is_none() && !slot.ended {
            return Want::Frame;
        }
        slot.feed_waker = Some(cx.waker().clone());
        Want::Nothing
    }

    /// Whether the body has been asked for its bytes yet.
    pub fn polled(&self) -> bool {
        self.0.lock().polled
    }

    /// Hands the body a frame (`last`: the body ends with it), or its
    /// failure (which ends it).
    pub fn send(&self, frame: Result<Frame<Bytes>, Error>, last: bool) {
        let mut slot = self.0.lock();
        slot.ended = last || frame.is_err();
        slot.frame = Some(frame);
        slot.wanted = false;
        if let Some(waker) = slot.body_waker.take() {
            waker.wake();
        }
    }

    /// The body ends with what it was handed.
    pub fn end(&self) {
        let mut slot = self.0.lock();
        slot.ended = true;
        if let Some(waker) = slot.body_waker.take() {
            waker.wake();
        }
    }
}

/// A connection's socket as a tunnel takes it over.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// A socket and the bytes already read from it past a message: those
/// bytes first, then the socket. A tunnel takes both sides of an upgraded
/// connection this way: the client's after a `101` ([`Upgraded`]), the
/// origin's after its `101` (`upstream::Handed`).
pub struct ReadAhead<IO> {
    read: Bytes,
    io: IO,
}

/// The client's connection after a `101`: the bytes it had already sent
/// past the request, then its socket.
pub type Upgraded = ReadAhead<Box<dyn Io>>;

impl<IO> ReadAhead<IO> {
    pub fn new(read: Bytes, io: IO) -> ReadAhead<IO> {
        ReadAhead { read, io }
    }
}

/// Puts what is left of `kept` (bytes read ahead of their reader) into
/// `buf`; whether it put any. Once all are given, the buffer they were a
/// slice of is let go.
pub fn give_kept(kept: &mut Bytes, buf: &mut ReadBuf<'_>) -> bool {
    if kept.is_empty() || buf.remaining() == 0 {
        return false;
    }
    let n = kept.len().min(buf.remaining());
    buf.put_slice(&kept.split_to(n));
    if kept.is_empty() {
        *kept = Bytes::new();
    }
    true
}

impl<IO: AsyncRead + Unpin> AsyncRead for ReadAhead<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if give_kept(&mut this.read, buf) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for ReadAhead<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// An HTTP/1 request's way to its connection once answered `101`: the
/// engine gives one to every request that asks for `Upgrade`.
#[derive(Debug)]
pub struct OnUpgrade(oneshot::Receiver<Upgraded>);

impl OnUpgrade {
    /// The way, and where the engine hands the connection over.
    pub fn new() -> (OnUpgrade, oneshot::Sender<Upgraded>) {
        let (tx, rx) = oneshot::channel();
        (OnUpgrade(rx), tx)
    }

    /// Waits for the connection; `None` when it was not handed over (no
    /// `101` was written, or the client went away first).
    pub async fn upgraded(self) -> Option<Upgraded> {
        self.0.await.ok()
    }
}

impl<IO> fmt::Debug for ReadAhead<IO> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReadAhead")
    }
}
