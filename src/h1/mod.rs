//! The HTTP/1.1 codec (DESIGN §9.5): pure byte work on buffers, no I/O.
//!
//! It owns reading an origin's response head (parsed once with `httparse`
//! into a borrowed view, `response`), the framing of its body by RFC 9112
//! §6.3 and the chunked coding both ways (`chunked`), and writing a
//! request head into a connection's write buffer (`write`), all by the
//! rules hyper's HTTP/1 client enforces, so that an origin sees the same
//! bytes and a head hyper refuses is refused here too. On the client's
//! side it owns reading a request head once into a borrowed view and the
//! framing rules of its body (`request`): what hyper's server refuses, and
//! what two parsers could frame differently; and writing an answer's head
//! by hyper's server rules (`answer`).
//!
//! It does not own sockets, buffers' refilling, pools, timeouts or what a
//! request or an answer says beyond its framing: `upstream` drives the
//! origin's connections, `connection` the clients', `proxy` rewrites what
//! is forwarded.

use std::mem::MaybeUninit;

use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderValue;

use crate::fields::Fields;

pub mod answer;
pub mod chunked;
pub mod request;
pub mod response;
pub mod write;

/// At most this many header fields in a head, or trailer fields after a
/// chunked body (hyper's default).
pub const MAX_HEADERS: usize = 100;

/// Fields a message may gain between being parsed and being written on.
const ADDED_FIELDS: usize = 8;

/// A head not complete within this many buffered bytes is refused
/// (hyper's default read buffer limit: 8 KiB plus 4 KiB per header).
pub const MAX_HEAD: usize = 8192 + 4096 * 100;

/// Why bytes could not be read as HTTP/1.1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("malformed head: {0}")]
    Head(httparse::Error),
    #[error("head larger than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("status code out of range")]
    Status,
    #[error("invalid header field")]
    Field,
    #[error("Transfer-Encoding in an HTTP/1.0 message")]
    TransferEncoding,
    #[error("invalid or conflicting Content-Length")]
    ContentLength,
    #[error("invalid chunked body: {0}")]
    Chunk(&'static str),
    #[error("invalid trailer fields")]
    Trailers,
}

/// Room for a head's fields, left uninitialised (`httparse` fills what it
/// parses).
pub fn fields<'b>() -> [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS] {
    [MaybeUninit::uninit(); MAX_HEADERS]
}

/// Whether a `Transfer-Encoding` value's last coding is `chunked`, as hyper
/// reads it (a value that is not visible ASCII names no coding).
pub(crate) fn ends_chunked(value: &[u8]) -> bool {
    text(value)
        .and_then(|s| s.rsplit(',').next())
        .is_some_and(|e| e.trim().eq_ignore_ascii_case("chunked"))
}

/// A field value as text, when it is visible ASCII (as
/// `HeaderValue::to_str` reads it).
pub(crate) fn text(value: &[u8]) -> Option<&str> {
    if value.iter().all(|&b| b == b'\t' || (32..127).contains(&b)) {
        std::str::from_utf8(value).ok()
    } else {
        None
    }
}

/// Whether a comma-separated list names `token` (any case).
pub(crate) fn lists(value: &[u8], token: &str) -> bool {
    text(value).is_some_and(|s| s.split(',').any(|v| v.trim().eq_ignore_ascii_case(token)))
}

/// The length the `Content-Length` values say, as hyper reads them: every
/// comma-separated element digits only and all equal. `Ok(None)` when
/// there is none, an error when they are invalid or differ.
pub(crate) fn content_length<'a>(
    values: impl Iterator<Item = &'a [u8]>,
) -> Result<Option<u64>, Error> {
    let mut length: Option<u64> = None;
    for value in values {
        for v in text(value).ok_or(Error::ContentLength)?.split(',') {
            let n = digits(v.trim()).ok_or(Error::ContentLength)?;
            if length.is_some_and(|l| l != n) {
                return Err(Error::ContentLength);
            }
            length = Some(n);
        }
    }
    Ok(length)
}

/// Writes the field line `name: value`, the name as it was sent or set,
/// in lower case (as hyper writes every name).
pub(crate) fn field_line(dst: &mut BytesMut, name: &[u8], value: &HeaderValue) {
    let at = dst.len();
    dst.put_slice(name);
    if let Some(written) = dst.get_mut(at..) {
        written.make_ascii_lowercase();
    }
    dst.put_slice(b": ");
    dst.put_slice(value.as_bytes());
    dst.put_slice(b"\r\n");
}

/// A decimal number, digits only.
pub(crate) fn digits(v: &str) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.bytes().try_fold(0u64, |n, b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Where a slice of a head is in `base`, the buffer it was parsed from:
/// its offset and length (heads are at most [`MAX_HEAD`] bytes, so both
/// fit in a u32).
fn span(base: &[u8], s: &[u8]) -> (u32, u32) {
    let offset = (s.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize);
    (
        u32::try_from(offset).unwrap_or(u32::MAX),
        u32::try_from(s.len()).unwrap_or(0),
    )
}

/// A parsed head's fields, as offsets into its bytes, to be taken from
/// them once frozen without copying their values. A list as long as the
/// head has fields (not an array of [`MAX_HEADERS`], which would be zeroed
/// and moved whole for every message).
pub struct FieldSpans {
    fields: Vec<[u32; 4]>,
}

impl FieldSpans {
    /// Where each of `fields` (parsed from `base`) is in `base`.
    pub fn of(fields: &[httparse::Header<'_>], base: &[u8]) -> FieldSpans {
        let spans = fields.iter().map(|field| {
            let (name, name_len) = span(base, field.name.as_bytes());
            let (value, value_len) = span(base, field.value);
            [
                name,
                name.saturating_add(name_len),
                value,
                value.saturating_add(value_len),
            ]
        });
        FieldSpans {
            fields: spans.collect(),
        }
    }

    /// The fields as a list over `head` (the bytes they were parsed from,
    /// frozen), with room for those queuegate adds on the way.
    pub fn into_fields(&self, head: Bytes) -> Result<Fields, Error> {
        let mut fields = Fields::over(head, self.fields.len() + ADDED_FIELDS);
        for &[ns, ne, vs, ve] in &self.fields {
            fields
                .push_sent((ns, ne), (vs, ve))
                .map_err(|_| Error::Field)?;
        }
        Ok(fields)
    }
}

/// `head[start..end]`, if it is within.
fn cut(head: &Bytes, start: usize, end: usize) -> Option<Bytes> {
    (start <= end && end <= head.len()).then(|| head.slice(start..end))
}
