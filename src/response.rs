//! The one response body type, and every response queuegate makes itself.
//!
//! Responses made here carry an `x-queuegate` header naming why queuegate
//! answered, so operators can tell the gate's answers from the app's.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use http::header::{HeaderName, HeaderValue, AGE, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::StatusCode;
use http_body::{Frame, SizeHint};

use crate::fields::Fields;
use crate::inflight::Turn;
use crate::message::Answer;
use crate::upstream::{self, UpstreamBody};

/// Header that marks a response as made by queuegate, with the reason.
pub const TAG: HeaderName = HeaderName::from_static("x-queuegate");

/// Tells a proxy in front not to buffer an answer (nginx reads it).
const X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

/// A response body: the origin's, streamed through, or one queuegate made.
#[derive(Debug)]
pub enum Body {
    /// Nothing.
    Empty,
    /// A whole body made here.
    Full(Option<Bytes>),
    /// The origin's body, streamed as it arrives.
    Upstream(UpstreamBody),
    /// The origin's body, holding its request's turn at the origin until
    /// it ends or is dropped (see [`holding_turn`]).
    Turned(UpstreamBody, Option<Turn>),
    /// A body made here piece by piece as things happen (an event stream).
    Pieces(Pieces),
    /// The origin's body, part of it read already (see [`Resumed`]).
    Resumed(Box<Resumed>),
}

/// An origin's body of which the frames `read` were read before it was
/// streamed (the micro-cache reads a body up to its `max_body` before it
/// knows whether it keeps it): those frames first, then the failure met
/// while reading, if any, else the rest of `body`.
#[derive(Debug)]
pub struct Resumed {
    read: VecDeque<Frame<Bytes>>,
    failed: Option<upstream::Error>,
    /// The failure is given after one pending poll (see `poll_frame`).
    flushed: bool,
    rest: Body,
}

impl Resumed {
    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, upstream::Error>>> {
        if let Some(frame) = self.read.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if self.failed.is_some() {
            // As the origin's own body does: one pending poll lets what
            // came before be flushed, so the client sees the answer cut
            // short rather than none.
            if !self.flushed {
                self.flushed = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            return Poll::Ready(self.failed.take().map(Err));
        }
        http_body::Body::poll_frame(Pin::new(&mut self.rest), cx)
    }
}

/// The pieces of a body made here over time; the body ends with them.
pub struct Pieces(Pin<Box<dyn Stream<Item = Bytes> + Send>>);

impl Pieces {
    pub fn new(stream: impl Stream<Item = Bytes> + Send + 'static) -> Pieces {
        Pieces(Box::pin(stream))
    }
}

impl fmt::Debug for Pieces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Pieces")
    }
}

impl Body {
    pub fn full(bytes: impl Into<Bytes>) -> Body {
        Body::Full(Some(bytes.into()))
    }

    /// The frames `read` of an origin's body, then `failed` if reading it
    /// failed, else the rest of it, `rest` (see [`Resumed`]).
    pub fn resumed(
        read: VecDeque<Frame<Bytes>>,
        failed: Option<upstream::Error>,
        rest: Body,
    ) -> Body {
        Body::Resumed(Box::new(Resumed {
            read,
            failed,
            flushed: false,
            rest,
        }))
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = upstream::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, upstream::Error>>> {
        match self.get_mut() {
            Body::Empty => Poll::Ready(None),
            Body::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Body::Upstream(incoming) => Pin::new(incoming).poll_frame(cx),
            Body::Turned(incoming, turn) => {
                let frame = std::task::ready!(Pin::new(&mut *incoming).poll_frame(cx));
                if !matches!(frame, Some(Ok(_))) || incoming.is_end_stream() {
                    // The origin is done with the request: the turn is free.
                    turn.take();
                }
                Poll::Ready(frame)
            }
            Body::Pieces(Pieces(stream)) => stream
                .as_mut()
                .poll_next(cx)
                .map(|piece| piece.map(|b| Ok(Frame::data(b)))),
            Body::Resumed(resumed) => resumed.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Empty => true,
            Body::Full(bytes) => bytes.is_none(),
            Body::Upstream(incoming) | Body::Turned(incoming, _) => incoming.is_end_stream(),
            Body::Pieces(_) => false,
            Body::Resumed(resumed) => {
                resumed.read.is_empty() && resumed.failed.is_none() && resumed.rest.is_end_stream()
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Empty => SizeHint::with_exact(0),
            Body::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Upstream(incoming) | Body::Turned(incoming, _) => incoming.size_hint(),
            Body::Pieces(_) => SizeHint::default(),
            Body::Resumed(resumed) => {
                let read: u64 = resumed
                    .read
                    .iter()
                    .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
                    .sum();
                let rest = resumed.rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(read));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint
            }
        }
    }
}

/// Why queuegate answered a request itself instead of the origin.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The request's framing is ambiguous (RFC 9112 §6.3); never forwarded.
    #[error("ambiguous message framing: {0}")]
    AmbiguousFraming(&'static str),
    /// The path reads as different routes to different origins (DESIGN
    /// §8.1, §9.6) and `limits.ambiguous_paths` is `reject`, or its
    /// readings land in two different routes.
    #[error("ambiguous path")]
    AmbiguousPath,
    /// `CONNECT`: never forwarded, whatever its target.
    #[error("CONNECT is not served")]
    Connect,
    /// The request's host is missing, repeated or malformed (DESIGN §8.2).
    #[error("bad host: {0}")]
    BadHost(#[from] crate::host::HostError),
    /// The host is not in `limits.allowed_hosts`.
    #[error("host not served here")]
    HostNotAllowed,
    /// The origin refused the connection, reset it or sent garbage. Shown
    /// with its causes (`cannot connect` alone says little), for the log
    /// line.
    #[error("origin unreachable: {}", Causes(.0))]
    Upstream(#[source] upstream::Error),
    /// The request's target could not be combined with the upstream URL:
    /// queuegate's own failure, answered like an unreachable origin.
    #[error("request target could not be rewritten for the origin: {0}")]
    Rewrite(#[source] http::uri::InvalidUriParts),
    /// The origin did not answer within `upstream.timeout`.
    #[error("origin timed out")]
    UpstreamTimeout,
    /// The request's body could not be read (a malformed chunk, a body cut
    /// short), found while it was relayed to the origin: the client's
    /// error, never counted as the origin's.
    #[error("request body unreadable: {}", Causes(.0))]
    BadBody(#[source] crate::client_body::Error),
    /// The origin answered `101` to switch to a protocol queuegate did not
    /// ask it for (only a WebSocket handshake is forwarded as one, DESIGN
    /// §9.5): no tunnel is made, and the origin's connection is closed.
    #[error("origin switched protocols unasked")]
    UnaskedSwitch,
}

impl From<upstream::Error> for RequestError {
    /// A failed exchange with the origin, blamed on whoever failed.
    fn from(err: upstream::Error) -> RequestError {
        match err {
            upstream::Error::ClientBody(err) => RequestError::BadBody(err),
            err => RequestError::Upstream(err),
        }
    }
}

impl RequestError {
    /// The short reason written into the `x-queuegate` header and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            RequestError::AmbiguousFraming(_) | RequestError::BadBody(_) => "bad-request",
            RequestError::AmbiguousPath => "ambiguous-path",
            RequestError::BadHost(_) => "bad-host",
            RequestError::Connect => "method-not-allowed",
            RequestError::HostNotAllowed => "misdirected",
            RequestError::Upstream(_) | RequestError::Rewrite(_) | RequestError::UnaskedSwitch => {
                "upstream-error"
            }
            RequestError::UpstreamTimeout => "upstream-timeout",
        }
    }

    /// The status code answered to the client.
    pub fn status(&self) -> StatusCode {
        match self {
            RequestError::AmbiguousFraming(_)
            | RequestError::AmbiguousPath
            | RequestError::BadHost(_)
            | RequestError::BadBody(_) => StatusCode::BAD_REQUEST,
            RequestError::HostNotAllowed => StatusCode::MISDIRECTED_REQUEST,
            RequestError::Connect => StatusCode::METHOD_NOT_ALLOWED,
            RequestError::Upstream(_) | RequestError::Rewrite(_) | RequestError::UnaskedSwitch => {
                StatusCode::BAD_GATEWAY
            }
            RequestError::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

/// An error and its causes on one line: `error: cause: cause`.
struct Causes<'a>(&'a dyn std::error::Error);

impl std::fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(err) = cause {
            write!(f, ": {err}")?;
            cause = err.source();
        }
        Ok(())
    }
}

/// Maps a request-path error to the response the client gets.
pub fn from_error(err: &RequestError) -> Answer<Body> {
    let text = match err {
        RequestError::AmbiguousFraming(_) => "400 bad request: ambiguous message framing\n",
        RequestError::BadBody(_) => "400 bad request: the request body could not be read\n",
        RequestError::AmbiguousPath => "400 bad request: ambiguous path\n",
        RequestError::BadHost(_) => "400 bad request: missing or malformed host\n",
        RequestError::Connect => "405 method not allowed: CONNECT is not served here\n",
        RequestError::HostNotAllowed => "421 misdirected request: this host is not served here\n",
        RequestError::Upstream(_) | RequestError::Rewrite(_) => {
            "502 bad gateway: the application did not answer\n"
        }
        RequestError::UnaskedSwitch => {
            "502 bad gateway: the application switched to a protocol not asked for\n"
        }
        RequestError::UpstreamTimeout => "504 gateway timeout: the application took too long\n",
    };
    let mut resp = plain(err.status(), err.reason(), text);
    // Where the request ends is unknown, or what follows it is the tunnel
    // the client hoped for: nothing after it is read as a request.
    if matches!(
        err,
        RequestError::AmbiguousFraming(_) | RequestError::BadBody(_) | RequestError::Connect
    ) {
        resp.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    if matches!(err, RequestError::Connect) {
        resp.headers_mut().insert(
            http::header::ALLOW,
            HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
        );
    }
    if err.status().is_client_error() {
        resp.mark_client_error();
    }
    resp
}

/// A short plain-text response tagged with `reason`.
pub fn plain(status: StatusCode, reason: &'static str, text: &'static str) -> Answer<Body> {
    made(
        status,
        reason,
        "text/plain; charset=utf-8",
        Bytes::from_static(text.as_bytes()),
    )
}

/// A JSON response tagged with `reason`, never cached.
pub fn json(status: StatusCode, reason: &'static str, body: String) -> Answer<Body> {
    made(status, reason, "application/json", Bytes::from(body))
}

/// An HTML response tagged with `reason`, never cached.
pub fn html(status: StatusCode, reason: &'static str, body: String) -> Answer<Body> {
    made(
        status,
        reason,
        "text/html; charset=utf-8",
        Bytes::from(body),
    )
}

/// A `200` Server-Sent Events stream tagged with `reason`, its events
/// `pieces`: never cached, and not buffered by a proxy in front
/// (`X-Accel-Buffering: no`), so each event reaches the browser when sent.
pub fn event_stream(reason: &'static str, pieces: Pieces) -> Answer<Body> {
    let mut resp = made(StatusCode::OK, reason, "text/event-stream", Bytes::new());
    *resp.body_mut() = Body::Pieces(pieces);
    resp.headers_mut()
        .insert(X_ACCEL_BUFFERING, HeaderValue::from_static("no"));
    resp
}

/// A `302` to a same-site `location` (already sanitised by the caller).
pub fn redirect(reason: &'static str, location: &str) -> Answer<Body> {
    let mut resp = made(
        StatusCode::FOUND,
        reason,
        "text/plain; charset=utf-8",
        Bytes::new(),
    );
    if let Ok(value) = HeaderValue::from_str(location) {
        resp.headers_mut().insert(http::header::LOCATION, value);
    }
    resp
}

/// `resp` holding `turn`, its request's turn at the origin (DESIGN §9.2),
/// until the origin's body ends or the client stops reading it (the body is
/// dropped): an origin still sending is still busy with the request. An
/// answer with nothing more to come from the origin (no body, or one made
/// here: a 502 or 504, a `101`'s tunnel) gives the turn back at once.
pub fn holding_turn(resp: Answer<Body>, turn: Turn) -> Answer<Body> {
    resp.map(|body| turned(body, turn))
}

/// `body` holding `turn` while the origin's part of it lasts: the rest of
/// a body the micro-cache read part of is still the origin's.
fn turned(body: Body, turn: Turn) -> Body {
    match body {
        Body::Upstream(incoming) if !http_body::Body::is_end_stream(&incoming) => {
            Body::Turned(incoming, Some(turn))
        }
        Body::Resumed(mut resumed) => {
            let rest = std::mem::replace(&mut resumed.rest, Body::Empty);
            resumed.rest = turned(rest, turn);
            Body::Resumed(resumed)
        }
        other => other,
    }
}

/// The answer to an admitted request that found its route's requests at
/// the origin at `max_inflight` and no turn free within `inflight_wait`
/// (DESIGN §9.2): `503`, `Retry-After: 1`. Nothing is ended: the visitor's
/// session, pass and place stay as they were.
pub fn busy() -> Answer<Body> {
    with_retry_after(
        plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            "503 service unavailable: the application is busy, try again in a moment\n",
        ),
        1,
    )
}

/// An origin's answer served again from the micro-cache (DESIGN §9.3):
/// its status and headers as the origin sent them, `age` seconds old (the
/// `Age` header, when given), its body from memory, or none for a `HEAD`.
/// Not tagged `x-queuegate`: it is the origin's answer, as every admitted
/// request's is.
pub fn from_cache(
    status: StatusCode,
    headers: Fields,
    body: Option<Bytes>,
    age: Option<u64>,
) -> Answer<Body> {
    let mut resp = Answer::new(match body {
        Some(body) if !body.is_empty() => Body::full(body),
        _ => Body::Empty,
    });
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    if let Some(age) = age {
        resp.headers_mut().insert(AGE, HeaderValue::from(age));
    }
    resp
}

/// Adds `Retry-After: secs`.
pub fn with_retry_after(mut resp: Answer<Body>, secs: u64) -> Answer<Body> {
    resp.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs));
    resp
}

fn made(
    status: StatusCode,
    reason: &'static str,
    content_type: &'static str,
    body: Bytes,
) -> Answer<Body> {
    let mut resp = Answer::new(if body.is_empty() {
        Body::Empty
    } else {
        Body::full(body)
    });
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(TAG, HeaderValue::from_static(reason));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_tagged_with_their_reason() {
        let resp = from_error(&RequestError::UpstreamTimeout);
        assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(resp.headers().get(TAG).unwrap(), "upstream-timeout");
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(http::uri::Scheme::HTTP);
        let unrewritable = http::Uri::from_parts(parts).map(|_| ()).unwrap_err();
        let resp = from_error(&RequestError::Rewrite(unrewritable));
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(resp.headers().get(TAG).unwrap(), "upstream-error");
    }

    #[test]
    fn connect_is_refused_naming_the_methods_served() {
        let resp = from_error(&RequestError::Connect);
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(resp.headers().get(TAG).unwrap(), "method-not-allowed");
        assert!(resp
            .headers()
            .get(http::header::ALLOW)
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("GET, "));
        assert_eq!(
            resp.headers().get(http::header::CONNECTION).unwrap(),
            "close"
        );
        assert!(resp.is_client_error());
    }

    #[test]
    fn causes_are_written_after_the_error() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(Causes(&Wrapped(inner)).to_string(), "connecting: refused");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("connecting")]
    struct Wrapped(#[source] std::io::Error);

    #[test]
    fn a_bad_location_is_left_out_rather_than_panicking() {
        let resp = redirect("waiting", "/ok\r\nset-cookie: x=1");
        assert!(resp.headers().get(http::header::LOCATION).is_none());
    }
}
