//! Writing a response head into a client connection's write buffer, with
//! its body's framing chosen as hyper's server chooses it (`Server::encode`
//! and the connection's version rules): the fields in their order, names
//! in lower case, all of a name's `Content-Length`, `Date` values written
//! at its first field and its `Connection`, `Transfer-Encoding` and
//! `Trailer` values joined into one line there, a length from the body's
//! exact size, else `chunked` on HTTP/1.1 or the body delimited by the
//! connection's close on HTTP/1.0; no body for `HEAD`, `1xx`, `204`, `304`
//! or a `2xx` to `CONNECT`; `connection: keep-alive` for an HTTP/1.0 client
//! kept, `connection: close` when the connection ends after this answer;
//! a `date` when the answer has none.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{BufMut, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};

use super::{content_length, ends_chunked, field_line, lists};
use crate::fields::Fields;
use crate::message::AnswerHead;

/// What the request being answered asked, as far as the head cares.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub method: &'a Method,
    /// The request said `HTTP/1.0`.
    pub http10: bool,
    /// The connection may serve another request after this one.
    pub keep_alive: bool,
}

/// How the body after a written head is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sends {
    /// Exactly this many bytes (0: no body).
    Length(u64),
    /// Chunks; the trailer fields the answer declared in `Trailer`.
    Chunked(Vec<HeaderName>),
    /// Bytes until the connection closes.
    Close,
}

/// A written head: how its body is sent, and whether the connection
/// closes once it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub sends: Sends,
    pub last: bool,
}

/// The size of the body a head is written for: `None` when it has ended
/// already, else its exact size if known.
pub type BodySize = Option<Option<u64>>;

/// Writes the head of `parts` into `dst` as hyper's server does, `date`
/// (an IMF-fixdate, see [`date`]) added when the answer has none.
pub fn head(
    dst: &mut BytesMut,
    parts: &mut AnswerHead,
    asked: Asked<'_>,
    body: BodySize,
    date: &[u8],
) -> Written {
    let (version, keep_alive) = version_rules(parts, asked);
    let status = parts.status;
    let mut last = !keep_alive || status == StatusCode::SWITCHING_PROTOCOLS;
    let connect_ok = *asked.method == Method::CONNECT && status.is_success();
    last |= connect_ok;
    status_line(dst, parts, version);
    let chunks = version == Version::HTTP_11 && can_have_body(asked.method, status);
    let mut found = Found {
        sends: None,
        trailers: None,
        date: false,
        last,
    };
    found.write(dst, &parts.fields, asked.method, body, chunks, connect_ok);
    let mut sends = match found.sends {
        Some(sends) => sends,
        None => implicit(dst, asked.method, status, body, chunks),
    };
    if !can_have_body(asked.method, status) {
        sends = Sends::Length(0);
    }
    if !found.date {
        dst.put_slice(b"date: ");
        dst.put_slice(date);
        dst.put_slice(b"\r\n");
    }
    dst.put_slice(b"\r\n");
    if let (Sends::Chunked(names), Some(declared)) = (&mut sends, found.trailers) {
        *names = declared;
    }
    let last = found.last || sends == Sends::Close;
    Written { sends, last }
}

/// hyper's `enforce_version`: the version the head is written with, and
/// whether the connection is kept, `Connection` fixed to say so.
fn version_rules(parts: &mut AnswerHead, asked: Asked<'_>) -> (Version, bool) {
    let says = |token| {
        parts
            .fields
            .get_all(header::CONNECTION)
            .any(|v| lists(v.as_bytes(), token))
    };
    let mut keep_alive = asked.keep_alive;
    if asked.http10 {
        if !says("keep-alive") {
            if parts.version == Version::HTTP_10 {
                keep_alive = false;
            } else if keep_alive {
                parts
                    .fields
                    .append(header::CONNECTION, HeaderValue::from_static("keep-alive"));
            }
        }
        return (Version::HTTP_10, keep_alive);
    }
    if !keep_alive && !says("close") {
        parts
            .fields
            .append(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let version = match parts.version {
        Version::HTTP_10 => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    (version, keep_alive)
}

fn status_line(dst: &mut BytesMut, parts: &AnswerHead, version: Version) {
    let reason = parts.reason.as_ref();
    dst.reserve(64 + parts.fields.len() * 32);
    if version == Version::HTTP_11 && parts.status == StatusCode::OK && reason.is_none() {
        dst.put_slice(b"HTTP/1.1 200 OK\r\n");
        return;
    }
    dst.put_slice(match version {
        Version::HTTP_10 => b"HTTP/1.0 ",
        _ => b"HTTP/1.1 ",
    });
    dst.put_slice(parts.status.as_str().as_bytes());
    dst.put_u8(b' ');
    match reason {
        Some(reason) => dst.put_slice(reason.as_bytes()),
        None => dst.put_slice(
            parts
                .status
                .canonical_reason()
                .unwrap_or("<none>")
                .as_bytes(),
        ),
    }
    dst.put_slice(b"\r\n");
}

/// The fields hyper's server writes by a rule of their own, all of a
/// name's values at its first field.
#[derive(Clone, Copy)]
enum Ruled {
    ContentLength,
    TransferEncoding,
    Connection,
    Trailer,
    Date,
}

impl Ruled {
    /// Which one a field named `name` (in any case) is, if any.
    fn of(name: &[u8]) -> Option<Ruled> {
        let is = |ruled: &HeaderName| ruled.as_str().as_bytes().eq_ignore_ascii_case(name);
        match name.len() {
            14 if is(&header::CONTENT_LENGTH) => Some(Ruled::ContentLength),
            17 if is(&header::TRANSFER_ENCODING) => Some(Ruled::TransferEncoding),
            10 if is(&header::CONNECTION) => Some(Ruled::Connection),
            7 if is(&header::TRAILER) => Some(Ruled::Trailer),
            4 if is(&header::DATE) => Some(Ruled::Date),
            _ => None,
        }
    }

    fn name(self) -> HeaderName {
        match self {
            Ruled::ContentLength => header::CONTENT_LENGTH,
            Ruled::TransferEncoding => header::TRANSFER_ENCODING,
            Ruled::Connection => header::CONNECTION,
            Ruled::Trailer => header::TRAILER,
            Ruled::Date => header::DATE,
        }
    }
}

/// What writing the fields found.
struct Found {
    /// The framing a field set (`Content-Length`, `Transfer-Encoding`).
    sends: Option<Sends>,
    /// The names the `Trailer` fields declare.
    trailers: Option<Vec<HeaderName>>,
    date: bool,
    last: bool,
}

impl Found {
    /// Writes `fields` in their order, names in lower case, those with a
    /// rule of their own (see [`Ruled`]) by it, each name once.
    fn write(
        &mut self,
        dst: &mut BytesMut,
        fields: &Fields,
        method: &Method,
        body: BodySize,
        chunks: bool,
        connect_ok: bool,
    ) {
        let mut done = 0u8;
        for (name, value) in fields.iter() {
            let Some(ruled) = Ruled::of(name) else {
                field_line(dst, name, value);
                continue;
            };
            let bit = 1 << ruled as u8;
            if done & bit != 0 {
                continue;
            }
            done |= bit;
            let values = fields.get_all(ruled.name());
            match ruled {
                Ruled::ContentLength if connect_ok => {}
                Ruled::ContentLength => self.length(dst, fields, method, body),
                Ruled::TransferEncoding if !chunks || connect_ok => {}
                Ruled::TransferEncoding => {
                    let values: Vec<&HeaderValue> = values.collect();
                    let chunked = values.last().is_some_and(|v| ends_chunked(v.as_bytes()));
                    joined(dst, "transfer-encoding: ", values.into_iter());
                    if !chunked {
                        dst.truncate(dst.len() - 2);
                        dst.put_slice(b", chunked\r\n");
                    }
                    self.sends = Some(Sends::Chunked(Vec::new()));
                }
                Ruled::Connection => {
                    let values: Vec<&HeaderValue> = values.collect();
                    self.last |= values.iter().any(|v| lists(v.as_bytes(), "close"));
                    joined(dst, "connection: ", values.into_iter());
                }
                Ruled::Trailer if !chunks => {}
                Ruled::Trailer => {
                    let values: Vec<&HeaderValue> = values.collect();
                    let names = self.trailers.get_or_insert_with(Vec::new);
                    names.extend(
                        values
                            .iter()
                            .filter_map(|v| v.to_str().ok())
                            .flat_map(|s| s.split(','))
                            .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok()),
                    );
                    joined(dst, "trailer: ", values.into_iter());
                }
                Ruled::Date => {
                    self.date = true;
                    for value in values {
                        field(dst, "date", value);
                    }
                }
            }
        }
    }

    /// `Content-Length` fields: the first written (with a body of known
    /// size, or of unknown size when it is readable), none for an empty
    /// body except in answer to `HEAD`.
    fn length(&mut self, dst: &mut BytesMut, fields: &Fields, method: &Method, body: BodySize) {
        let mut values = fields.get_all(header::CONTENT_LENGTH);
        match body {
            Some(Some(known)) => {
                if let Some(first) = values.next() {
                    field(dst, "content-length", first);
                    self.sends = Some(Sends::Length(known));
                }
            }
            Some(None) => {
                let all = fields.get_all(header::CONTENT_LENGTH);
                let said = content_length(all.map(HeaderValue::as_bytes));
                if let (Ok(Some(len)), Some(first)) = (said, values.next()) {
                    field(dst, "content-length", first);
                    self.sends = Some(Sends::Length(len));
                }
            }
            None if *method == Method::HEAD => {
                for value in values {
                    field(dst, "content-length", value);
                }
                self.sends = Some(Sends::Length(0));
            }
            None => {}
        }
    }
}

/// The framing of a head none of whose fields set it.
fn implicit(
    dst: &mut BytesMut,
    method: &Method,
    status: StatusCode,
    body: BodySize,
    chunks: bool,
) -> Sends {
    let may_length = !(status.is_informational()
        || (*method == Method::CONNECT && status.is_success())
        || matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED));
    match body {
        Some(None) if chunks => {
            dst.put_slice(b"transfer-encoding: chunked\r\n");
            Sends::Chunked(Vec::new())
        }
        // HTTP/1.0, or no body at all (then sent as none).
        Some(None) => Sends::Close,
        None | Some(Some(0)) => {
            if may_length && *method != Method::HEAD {
                dst.put_slice(b"content-length: 0\r\n");
            }
            Sends::Length(0)
        }
        Some(Some(len)) if may_length => {
            dst.put_slice(b"content-length: ");
            dst.put_slice(len.to_string().as_bytes());
            dst.put_slice(b"\r\n");
            Sends::Length(len)
        }
        Some(Some(_)) => Sends::Length(0),
    }
}

/// hyper's `Server::can_chunked` (and `can_have_body`).
fn can_have_body(method: &Method, status: StatusCode) -> bool {
    !(*method == Method::HEAD
        || (*method == Method::CONNECT && status.is_success())
        || status.is_informational()
        || matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED))
}

fn field(dst: &mut BytesMut, name: &str, value: &HeaderValue) {
    dst.put_slice(name.as_bytes());
    dst.put_slice(b": ");
    dst.put_slice(value.as_bytes());
    dst.put_slice(b"\r\n");
}

/// One line for all the values of a field, joined with `, `.
fn joined<'a>(dst: &mut BytesMut, name: &str, values: impl Iterator<Item = &'a HeaderValue>) {
    dst.put_slice(name.as_bytes());
    for (i, value) in values.enumerate() {
        if i > 0 {
            dst.put_slice(b", ");
        }
        dst.put_slice(value.as_bytes());
    }
    dst.put_slice(b"\r\n");
}

/// `time` as an HTTP date (IMF-fixdate, RFC 9110 §5.6.7), the form of the
/// `date` field: `Sun, 06 Nov 1994 08:49:37 GMT`. The calendar is the
/// `time` crate's; only the fixed layout is written here.
pub fn date(time: SystemTime) -> [u8; 29] {
    const DAYS: [&[u8; 3]; 7] = [b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun"];
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    // Before 1970 (a clock set wrong) reads as the epoch.
    let time = time.max(UNIX_EPOCH);
    let at = time::OffsetDateTime::from(time);
    let (hour, minute, second) = at.to_hms();
    let mut out = *b"Thu, 01 Jan 1970 00:00:00 GMT";
    let digits = |out: &mut [u8], n: u32| {
        let mut n = n;
        for b in out.iter_mut().rev() {
            *b = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    out[..3].copy_from_slice(DAYS[usize::from(at.weekday().number_days_from_monday())]);
    digits(&mut out[5..7], u32::from(at.day()));
    out[8..11].copy_from_slice(MONTHS[usize::from(u8::from(at.month()) - 1)]);
    digits(&mut out[12..16], at.year().unsigned_abs());
    digits(&mut out[17..19], u32::from(hour));
    digits(&mut out[20..22], u32::from(minute));
    digits(&mut out[23..25], u32::from(second));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Answer;

    const DATE: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";

    fn written(
        status: u16,
        fields: &[(&'static str, &'static str)],
        method: Method,
        http10: bool,
        keep_alive: bool,
        body: BodySize,
    ) -> (String, Written) {
        let mut resp = Answer::new(());
        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
        for (name, value) in fields {
            resp.headers_mut().append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let (mut parts, ()) = resp.into_parts();
        let mut dst = BytesMut::new();
        let asked = Asked {
            method: &method,
            http10,
            keep_alive,
        };
        let w = head(&mut dst, &mut parts, asked, body, DATE);
        (String::from_utf8(dst.to_vec()).unwrap(), w)
    }

    fn sends(w: &Written) -> (&Sends, bool) {
        (&w.sends, w.last)
    }

    #[test]
    fn a_date_is_an_imf_fixdate() {
        let t = UNIX_EPOCH + std::time::Duration::from_secs(784_111_777);
        assert_eq!(&date(t), DATE);
        let t = UNIX_EPOCH + std::time::Duration::from_secs(951_782_400);
        assert_eq!(&date(t), b"Tue, 29 Feb 2000 00:00:00 GMT");
    }

    #[test]
    fn length_from_the_exact_size_else_chunked_on_http11() {
        let (h, w) = written(
            200,
            &[("x-a", "1")],
            Method::GET,
            false,
            true,
            Some(Some(5)),
        );
        assert_eq!(
            h,
            "HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n"
        );
        assert_eq!(sends(&w), (&Sends::Length(5), false));
        let (h, w) = written(200, &[], Method::GET, false, true, Some(None));
        assert!(h.contains("transfer-encoding: chunked\r\n"), "{h}");
        assert_eq!(sends(&w), (&Sends::Chunked(vec![]), false));
        let (h, w) = written(404, &[], Method::GET, false, true, None);
        assert!(
            h.starts_with("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n"),
            "{h}"
        );
        assert_eq!(sends(&w), (&Sends::Length(0), false));
        let (h, w) = written(
            200,
            &[("content-length", "3")],
            Method::GET,
            false,
            true,
            Some(None),
        );
        assert!(
            h.contains("content-length: 3\r\n") && !h.contains("chunked"),
            "{h}"
        );
        assert_eq!(sends(&w), (&Sends::Length(3), false));
        let (h, w) = written(
            200,
            &[("trailer", "x-sum"), ("transfer-encoding", "gzip")],
            Method::POST,
            false,
            true,
            Some(None),
        );
        assert!(h.contains("transfer-encoding: gzip, chunked\r\n"), "{h}");
        assert_eq!(
            w.sends,
            Sends::Chunked(vec![HeaderName::from_static("x-sum")])
        );
    }

    #[test]
    fn no_body_for_head_1xx_204_304_and_connect() {
        let (h, w) = written(200, &[], Method::HEAD, false, true, Some(Some(5)));
        assert!(h.contains("content-length: 5\r\n"), "{h}");
        assert_eq!(sends(&w), (&Sends::Length(0), false));
        let (h, w) = written(
            200,
            &[("content-length", "7")],
            Method::HEAD,
            false,
            true,
            None,
        );
        assert!(h.contains("content-length: 7\r\n"), "{h}");
        assert_eq!(w.sends, Sends::Length(0));
        let (h, w) = written(204, &[], Method::GET, false, true, Some(None));
        assert!(
            !h.contains("content-length") && !h.contains("chunked"),
            "{h}"
        );
        assert_eq!(w.sends, Sends::Length(0));
        let (h, w) = written(304, &[], Method::GET, false, true, Some(Some(9)));
        assert!(!h.contains("content-length"), "{h}");
        assert_eq!(w.sends, Sends::Length(0));
        let (h, w) = written(
            101,
            &[("upgrade", "websocket"), ("connection", "upgrade")],
            Method::GET,
            false,
            true,
            None,
        );
        assert!(h.starts_with("HTTP/1.1 101 Switching Protocols\r\n"), "{h}");
        assert!(!h.contains("content-length"), "{h}");
        assert_eq!(sends(&w), (&Sends::Length(0), true));
        let (h, w) = written(200, &[], Method::CONNECT, false, true, Some(None));
        assert!(
            !h.contains("content-length") && !h.contains("chunked"),
            "{h}"
        );
        assert_eq!(sends(&w), (&Sends::Length(0), true));
    }

    #[test]
    fn http10_clients_get_http10_heads_kept_alive_only_when_asked() {
        let (h, w) = written(200, &[], Method::GET, true, true, Some(Some(2)));
        assert!(
            h.starts_with("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\n"),
            "{h}"
        );
        assert_eq!(sends(&w), (&Sends::Length(2), false));
        let (h, w) = written(200, &[], Method::GET, true, true, Some(None));
        assert!(!h.contains("chunked"), "{h}");
        assert_eq!(sends(&w), (&Sends::Close, true));
        let (h, w) = written(200, &[], Method::GET, true, false, Some(Some(2)));
        assert!(!h.contains("connection"), "{h}");
        assert_eq!(sends(&w), (&Sends::Length(2), true));
    }

    #[test]
    fn a_closing_connection_says_close() {
        let (h, w) = written(200, &[], Method::GET, false, false, Some(Some(2)));
        assert!(h.contains("connection: close\r\n"), "{h}");
        assert!(w.last);
        let (h, w) = written(
            400,
            &[("connection", "close")],
            Method::GET,
            false,
            true,
            None,
        );
        assert_eq!(h.matches("close").count(), 1, "{h}");
        assert!(w.last);
        let (h, w) = written(
            200,
            &[("date", "x"), ("connection", "a"), ("connection", "b")],
            Method::GET,
            false,
            true,
            None,
        );
        assert!(
            h.contains("connection: a, b\r\n") && h.contains("date: x\r\n"),
            "{h}"
        );
        assert_eq!(h.matches("date").count(), 1, "{h}");
        assert!(!w.last);
    }
}
