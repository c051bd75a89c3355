//! A client's request head, parsed once with `httparse` into a borrowed view
//! over the bytes read ([`Head`]), and the framing of its body decided by
//! RFC 9112's rules as queuegate enforces them: a head two HTTP parsers could
//! frame differently is refused ([`Refused::Ambiguous`]), not resolved.
//!
//! What hyper's server refuses, this refuses too (`tests/h1_differential.rs`
//! feeds both the same generated heads); where hyper resolves an ambiguity
//! silently (Content-Length with Transfer-Encoding, Content-Length repeated),
//! this refuses instead. The request target is checked as a URI by
//! [`Head::uri`], separately, because only the request road needs it.
//!
//! It reads no body and keeps no state between heads: following a body's
//! bytes is the caller's (the HTTP/1 engine of `connection`).

use std::mem::MaybeUninit;

use http::{Method, Uri};

use super::{digits, ends_chunked, lists, MAX_HEADERS};

/// hyper's limit on a request target's length (`414` past it).
pub const MAX_TARGET: usize = (u16::MAX - 1) as usize;

/// How a request's body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// A body of exactly this many bytes (more than 0).
    Length(u64),
    /// A chunked body, its last coding.
    Chunked,
}

/// A complete request head, borrowed from the bytes it was read from.
#[derive(Debug)]
pub struct Head<'b, 'h> {
    pub method: &'b str,
    pub target: &'b str,
    /// The head says `HTTP/1.0` (else `HTTP/1.1`).
    pub http10: bool,
    /// Its header lines, in order, values trimmed.
    pub headers: &'h [httparse::Header<'b>],
    /// The head's length in bytes, its blank line included.
    pub len: usize,
    pub framing: Framing,
    /// `Expect: 100-continue`.
    pub expect_continue: bool,
    /// The connection may serve another request after this one.
    pub keep_alive: bool,
    /// An HTTP/1.1 request with `Upgrade` (or `CONNECT`).
    pub wants_upgrade: bool,
    /// Its framing two parsers could read differently, and why (only from
    /// [`parse_head`]; `framing` is then `Empty`).
    pub ambiguous: Option<&'static str>,
}

/// Why a head is refused; every refusal ends the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not a request head by RFC 9112's grammar as `httparse` reads it.
    #[error("malformed request head: {0}")]
    Malformed(httparse::Error),
    /// More than [`MAX_HEADERS`] header lines, or a name of 64 KiB.
    #[error("request head too large")]
    TooLarge,
    #[error("request target too long")]
    TargetTooLong,
    /// Framing two parsers could read differently (RFC 9112 §6.3).
    #[error("ambiguous framing: {0}")]
    Ambiguous(&'static str),
    /// A Content-Length that is not one decimal number.
    #[error("invalid Content-Length")]
    BadLength,
    /// A Transfer-Encoding whose last coding is not `chunked`, or on HTTP/1.0.
    #[error("invalid Transfer-Encoding")]
    BadCoding,
    /// A target that is not a URI.
    #[error("invalid request target")]
    BadTarget,
}

impl Refused {
    /// The status a server answers it with, as hyper's does.
    pub fn status(self) -> http::StatusCode {
        match self {
            Refused::TooLarge | Refused::Malformed(httparse::Error::TooManyHeaders) => {
                http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            Refused::TargetTooLong => http::StatusCode::URI_TOO_LONG,
            _ => http::StatusCode::BAD_REQUEST,
        }
    }
}

/// Parses the head at the start of `bytes`: `Ok(None)` until it is complete.
/// Blank lines before it are the caller's to skip (as hyper skips them).
pub fn parse<'b, 'h>(
    bytes: &'b [u8],
    headers: &'h mut [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS],
) -> Result<Option<Head<'b, 'h>>, Refused> {
    match parse_head(bytes, headers)? {
        Some(Head {
            ambiguous: Some(reason),
            ..
        }) => Err(Refused::Ambiguous(reason)),
        head => Ok(head),
    }
}

/// [`parse`], except that a head whose framing is ambiguous is given, with
/// [`Head::ambiguous`] saying why, for the server to refuse on the request
/// road (where every refusal of a request queuegate reads is answered).
pub fn parse_head<'b, 'h>(
    bytes: &'b [u8],
    headers: &'h mut [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS],
) -> Result<Option<Head<'b, 'h>>, Refused> {
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(bytes, headers) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Refused::TooLarge),
        Err(err) => return Err(Refused::Malformed(err)),
    };
    // Set once the head is complete.
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(Refused::Malformed(httparse::Error::Version));
    };
    if target.len() > MAX_TARGET {
        return Err(Refused::TargetTooLong);
    }
    let headers = req.headers;
    if headers.iter().any(|h| h.name.len() >= 1 << 16) {
        return Err(Refused::TooLarge);
    }
    let http10 = version == 0;
    let (framing, ambiguous) = match framing(http10, headers) {
        Err(Refused::Ambiguous(reason)) => (Framing::Empty, Some(reason)),
        framing => (framing?, None),
    };
    let mut head = Head {
        method,
        target,
        http10,
        headers,
        len,
        framing,
        expect_continue: false,
        keep_alive: !http10,
        wants_upgrade: method == "CONNECT",
        ambiguous,
    };
    head.read_connection_fields();
    Ok(Some(head))
}

/// The framing of a body from its head's header lines (`http10`: the head
/// is HTTP/1.0). Content-Length lines are counted even when unreadable: one
/// beside Transfer-Encoding is ambiguous whatever it says.
pub fn framing(http10: bool, headers: &[httparse::Header<'_>]) -> Result<Framing, Refused> {
    let (mut lengths, mut length, mut readable) = (0u32, None, true);
    // The last Transfer-Encoding line's last coding: whether it is chunked.
    let mut chunked = None;
    for header in headers {
        let (name, value) = (header.name.as_bytes(), header.value);
        if name.eq_ignore_ascii_case(b"content-length") {
            lengths += 1;
            match std::str::from_utf8(value).ok().and_then(digits) {
                Some(n) if length.is_none_or(|first| first == n) => length = Some(n),
                _ => readable = false,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = Some(ends_chunked(value));
        }
    }
    match (lengths, chunked) {
        (2.., _) => return Err(Refused::Ambiguous("more than one Content-Length")),
        (1, Some(_)) => {
            return Err(Refused::Ambiguous(
                "both Content-Length and Transfer-Encoding",
            ))
        }
        _ => {}
    }
    match (chunked, length) {
        _ if !readable => Err(Refused::BadLength),
        (Some(_), _) if http10 => Err(Refused::BadCoding),
        (Some(true), _) => Ok(Framing::Chunked),
        (Some(false), _) => Err(Refused::BadCoding),
        // hyper's largest body length (its two highest are markers).
        (None, Some(n)) if n > u64::MAX - 2 => Err(Refused::BadLength),
        (None, Some(n)) if n > 0 => Ok(Framing::Length(n)),
        (None, _) => Ok(Framing::Empty),
    }
}

impl Head<'_, '_> {
    /// Reads `Connection`, `Expect` and `Upgrade` as hyper's server does.
    fn read_connection_fields(&mut self) {
        let mut closed = false;
        for header in self.headers {
            let name = header.name.as_bytes();
            if name.eq_ignore_ascii_case(b"connection") {
                // Once one line asks to close, a later `keep-alive` does not
                // undo it.
                if closed || lists(header.value, "close") {
                    closed = true;
                    self.keep_alive = false;
                } else if !self.keep_alive {
                    self.keep_alive = lists(header.value, "keep-alive");
                }
            } else if name.eq_ignore_ascii_case(b"expect") {
                self.expect_continue = header.value.eq_ignore_ascii_case(b"100-continue");
            } else if name.eq_ignore_ascii_case(b"upgrade") {
                self.wants_upgrade = !self.http10;
            }
        }
    }

    /// The method, as `http` reads it.
    pub fn method(&self) -> Result<Method, Refused> {
        Method::from_bytes(self.method.as_bytes())
            .map_err(|_| Refused::Malformed(httparse::Error::Token))
    }

    /// The request target as a URI, as hyper reads it; a target that is not
    /// one is refused (`400`).
    pub fn uri(&self) -> Result<Uri, Refused> {
        Uri::try_from(self.target).map_err(|_| Refused::BadTarget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(head: &[u8]) -> Result<Option<Framing>, Refused> {
        let mut s = crate::h1::fields();
        parse(head, &mut s).map(|head| head.map(|h| h.framing))
    }

    #[test]
    fn framing_follows_the_last_coding_and_a_single_length() {
        type Case = (&'static [u8], Result<Option<Framing>, Refused>);
        let cases: &[Case] = &[
            (
                b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
                Ok(Some(Framing::Empty)),
            ),
            (b"GET / HTTP/1.1\r\nHost: a\r\n", Ok(None)),
            (
                b"PUT / HTTP/1.1\r\ncontent-LENGTH:  5 \r\n\r\n",
                Ok(Some(Framing::Length(5))),
            ),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
                Ok(Some(Framing::Empty)),
            ),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                Ok(Some(Framing::Chunked)),
            ),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                Err(Refused::BadCoding),
            ),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n",
                Err(Refused::BadCoding),
            ),
            (
                b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                Err(Refused::BadCoding),
            ),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: \xe9, chunked\r\n\r\n",
                Err(Refused::BadCoding),
            ),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
                Err(Refused::BadLength),
            ),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
                Err(Refused::BadLength),
            ),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n",
                Err(Refused::Ambiguous("more than one Content-Length")),
            ),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                Err(Refused::Ambiguous(
                    "both Content-Length and Transfer-Encoding",
                )),
            ),
        ];
        for (head, want) in cases {
            assert_eq!(&framed(head), want, "{}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn connection_fields_are_read_as_hyper_reads_them() {
        let mut s = crate::h1::fields();
        let head = parse(
            b"GET / HTTP/1.0\r\nConnection: foo, Keep-Alive\r\nExpect: 100-Continue\r\nUpgrade: websocket\r\n\r\n",
            &mut s,
        )
        .unwrap()
        .unwrap();
        assert!(head.keep_alive && head.expect_continue && head.http10);
        assert!(!head.wants_upgrade, "no upgrade on HTTP/1.0");
        let mut s = crate::h1::fields();
        let head = parse(
            b"GET / HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\nUpgrade: websocket\r\n\r\n",
            &mut s,
        )
        .unwrap()
        .unwrap();
        assert!(!head.keep_alive && head.wants_upgrade);
    }

    #[test]
    fn limits_and_grammar_are_refused_with_hyper_statuses() {
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "A: b\r\n".repeat(MAX_HEADERS + 1)
        );
        let mut s = crate::h1::fields();
        let refused = parse(many.as_bytes(), &mut s).unwrap_err();
        assert_eq!(
            refused.status(),
            http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_TARGET));
        let mut s = crate::h1::fields();
        let refused = parse(long.as_bytes(), &mut s).unwrap_err();
        assert_eq!(refused.status(), http::StatusCode::URI_TOO_LONG);
        for bad in [
            &b"GET / HTTP/1.1\r\nA : b\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n",
            b"GET / HTTP/1.1\r\nA: b\rc\r\n\r\n",
            b"GET  / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.2\r\n\r\n",
        ] {
            let mut s = crate::h1::fields();
            let refused = parse(bad, &mut s).unwrap_err();
            assert_eq!(refused.status(), http::StatusCode::BAD_REQUEST);
        }
    }
}
