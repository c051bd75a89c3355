//! An origin's response head, parsed once with `httparse` into a borrowed
//! view ([`Head`]), the framing of the body that follows it (RFC 9112
//! §6.3, as hyper's client reads it: [`Head::framing`]), and the
//! answer's head made from it, its fields left where they were read
//! ([`Spans::answer`]).

use std::mem::MaybeUninit;

use bytes::Bytes;
use http::{StatusCode, Version};

use crate::message::{self, AnswerHead};

use super::{content_length, cut, ends_chunked, lists, span, Error, FieldSpans, MAX_HEAD};

/// A complete response head, borrowed from the read buffer.
pub struct Head<'h, 'b> {
    /// How many bytes of the buffer it takes.
    pub len: usize,
    pub status: StatusCode,
    pub version: Version,
    pub reason: &'b str,
    pub fields: &'h [httparse::Header<'b>],
}

/// How the body after a head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    /// No body (HEAD, 1xx, 204, 304, `Content-Length: 0`).
    Empty,
    /// `Content-Length`.
    Known(u64),
    /// `Transfer-Encoding` ending in `chunked`.
    Chunked,
    /// Until the origin closes the connection.
    Close,
}

/// What a head says about its body and its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    pub length: Length,
    /// The connection may carry another exchange after this one.
    pub keep_alive: bool,
    /// A `101`: the connection is the origin's to hand over.
    pub upgrade: bool,
}

/// Parses the head at the start of `buf` into `fields`: `None` while it
/// is incomplete.
pub fn parse<'h, 'b>(
    buf: &'b [u8],
    fields: &'h mut [MaybeUninit<httparse::Header<'b>>],
) -> Result<Option<Head<'h, 'b>>, Error> {
    let mut res = httparse::Response::new(&mut []);
    let config = httparse::ParserConfig::default();
    let len = match config.parse_response_with_uninit_headers(&mut res, buf, fields) {
        Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => len,
        Ok(httparse::Status::Complete(_)) => return Err(Error::TooLarge),
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Err(Error::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(err) => return Err(Error::Head(err)),
    };
    let code = res.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| Error::Status)?;
    let version = match res.version {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    };
    Ok(Some(Head {
        len,
        status,
        version,
        reason: res.reason.unwrap_or(""),
        fields: res.headers,
    }))
}

impl Head<'_, '_> {
    /// A `1xx` other than `101`: skipped, the final answer follows.
    pub fn informational(&self) -> bool {
        matches!(self.status.as_u16(), 100 | 102..=199)
    }

    fn named(&self, name: &'static str) -> impl Iterator<Item = &[u8]> + '_ {
        self.fields
            .iter()
            .filter(move |f| f.name.eq_ignore_ascii_case(name))
            .map(|f| f.value)
    }

    /// Whether the connection stays open after this answer: HTTP/1.1
    /// unless a `Connection` field says `close`; HTTP/1.0 only with
    /// `keep-alive` (and no `close`).
    fn keep_alive(&self) -> bool {
        let mut keep_alive = self.version == Version::HTTP_11;
        let mut closed = false;
        for value in self.named("connection") {
            if closed || lists(value, "close") {
                closed = true;
                keep_alive = false;
            } else if !keep_alive {
                keep_alive = lists(value, "keep-alive");
            }
        }
        keep_alive
    }

    /// The framing of the body after this head, in answer to a `HEAD`
    /// request if `head_request`; an error for a head whose length could
    /// be read two ways or not at all.
    pub fn framing(&self, head_request: bool) -> Result<Framing, Error> {
        let keep_alive = self.keep_alive();
        let framing = |length| Framing {
            length,
            keep_alive,
            upgrade: false,
        };
        match self.status.as_u16() {
            101 => {
                return Ok(Framing {
                    length: Length::Empty,
                    keep_alive: false,
                    upgrade: true,
                })
            }
            100..=199 | 204 | 304 => return Ok(framing(Length::Empty)),
            _ if head_request => return Ok(framing(Length::Empty)),
            _ => {}
        }
        if let Some(last) = self.named("transfer-encoding").last() {
            if self.version == Version::HTTP_10 {
                return Err(Error::TransferEncoding);
            }
            let chunked = ends_chunked(last);
            return Ok(framing(if chunked {
                Length::Chunked
            } else {
                Length::Close
            }));
        }
        let length = content_length(self.named("content-length"))?;
        Ok(framing(match length {
            None => Length::Close,
            Some(0) => Length::Empty,
            Some(n) if n <= u64::MAX - 2 => Length::Known(n),
            Some(_) => return Err(Error::TooLarge),
        }))
    }

    /// Where each field's name and value are in `base`, the buffer this
    /// head was parsed from, to be taken from it once frozen.
    pub fn spans(&self, base: &[u8]) -> Spans {
        let reason = (Some(self.reason) != self.status.canonical_reason())
            .then(|| span(base, self.reason.as_bytes()));
        Spans {
            status: self.status,
            version: self.version,
            reason,
            fields: FieldSpans::of(self.fields, base),
        }
    }
}

/// A parsed head's parts, as offsets into its bytes (see [`Head::spans`]).
pub struct Spans {
    status: StatusCode,
    version: Version,
    reason: Option<(u32, u32)>,
    fields: FieldSpans,
}

impl Spans {
    /// The answer's head that `head` (the bytes it was parsed from) says,
    /// its fields a list over `head`; a reason phrase other than the status
    /// code's own kept as hyper keeps it (and gives it on).
    pub fn answer(&self, head: Bytes) -> Result<AnswerHead, Error> {
        let reason = self.reason.and_then(|(start, len)| {
            cut(&head, start as usize, start.saturating_add(len) as usize).and_then(message::reason)
        });
        Ok(AnswerHead {
            status: self.status,
            version: self.version,
            fields: self.fields.into_fields(head)?,
            reason,
            client_error: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framing(head: &str, head_request: bool) -> Result<Option<Framing>, Error> {
        let mut fields = crate::h1::fields();
        parse(head.as_bytes(), &mut fields)?
            .map(|h| h.framing(head_request))
            .transpose()
    }

    fn length(head: &str) -> Result<Length, Error> {
        Ok(framing(head, false)?
            .map(|f| f.length)
            .unwrap_or(Length::Empty))
    }

    #[test]
    fn lengths_as_rfc_9112_reads_them() {
        assert_eq!(
            length("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
            Ok(Length::Known(5))
        );
        assert_eq!(
            length("HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\nContent-Length: 5\r\n\r\n"),
            Ok(Length::Known(5))
        );
        assert_eq!(
            length("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
            Err(Error::ContentLength)
        );
        assert_eq!(
            length("HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n"),
            Err(Error::ContentLength)
        );
        assert_eq!(
            length("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
            Ok(Length::Empty)
        );
        assert_eq!(
            length(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n"
            ),
            Ok(Length::Chunked)
        );
        assert_eq!(
            length("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
            Ok(Length::Close)
        );
        assert_eq!(
            length("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(Error::TransferEncoding)
        );
        assert_eq!(
            length("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"),
            Ok(Length::Empty)
        );
        assert_eq!(length("HTTP/1.1 200 OK\r\n\r\n"), Ok(Length::Close));
        assert_eq!(
            length("HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n"),
            Err(Error::TooLarge)
        );
        assert_eq!(length("HTTP/1.1 099 Low\r\n\r\n"), Err(Error::Status));
    }

    #[test]
    fn connections_kept_as_hyper_keeps_them() {
        let keep = |head: &str| framing(head, false).ok().flatten().map(|f| f.keep_alive);
        assert_eq!(
            keep("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
            Some(true)
        );
        assert_eq!(
            keep("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"),
            Some(false)
        );
        assert_eq!(
            keep("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"),
            Some(false)
        );
        assert_eq!(
            keep("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n"),
            Some(true)
        );
        assert_eq!(
            keep("HTTP/1.1 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n"),
            Some(false)
        );
    }

    #[test]
    fn values_are_slices_of_the_head() {
        let bytes = Bytes::from_static(b"HTTP/1.1 200 Fine\r\nX-A: one\r\nx-b:  two \r\n\r\nbody");
        let mut fields = crate::h1::fields();
        let head = parse(&bytes, &mut fields).unwrap().unwrap();
        let spans = head.spans(&bytes);
        let answer = spans.answer(bytes.slice(..head.len)).unwrap();
        assert_eq!(answer.fields.get("x-a").unwrap(), "one");
        assert_eq!(answer.fields.get("x-b").unwrap(), "two");
        assert_eq!(answer.reason.unwrap().as_bytes(), b"Fine");
    }
}
