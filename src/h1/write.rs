//! Writing a request head straight into a connection's write buffer, with
//! its body's framing chosen as hyper's client chooses it: the fields in
//! their order (names in lower case), a valid
//! `Content-Length` kept, `Transfer-Encoding` made to end in `chunked`, a
//! length set from the body's exact size, else `chunked` (none at all for
//! `GET`, `HEAD` and `CONNECT`).

use bytes::{BufMut, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Uri, Version};

use super::{content_length, field_line};
use crate::fields::Fields;

/// How the body after a written head is framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Encoder {
    /// This many bytes, then the body ends (more are not sent).
    Length(u64),
    /// Chunks; the trailer fields the request declared in `Trailer`, the
    /// only ones sent after the last chunk (none: no trailers sent).
    Chunked(Vec<HeaderName>),
}

/// The body a head is written for: `None` when it has ended already,
/// else its exact size if known.
pub type BodySize = Option<Option<u64>>;

/// Writes the head of a request into `dst`, after setting the framing
/// fields in `fields` as hyper does; the body's encoder. Names are
/// written in lower case, as hyper writes them.
pub fn request(
    dst: &mut BytesMut,
    method: &Method,
    uri: &Uri,
    version: Version,
    fields: &mut Fields,
    body: BodySize,
) -> Encoder {
    let encoder = set_length(method, version, fields, body);
    dst.reserve(32 + fields.len() * 30);
    dst.put_slice(method.as_str().as_bytes());
    dst.put_u8(b' ');
    if uri.scheme().is_none() && uri.authority().is_none() {
        dst.put_slice(uri.path().as_bytes());
        if let Some(query) = uri.query() {
            dst.put_u8(b'?');
            dst.put_slice(query.as_bytes());
        }
    } else {
        dst.put_slice(uri.to_string().as_bytes());
    }
    dst.put_slice(match version {
        Version::HTTP_10 => b" HTTP/1.0\r\n",
        _ => b" HTTP/1.1\r\n",
    });
    for (name, value) in fields.iter() {
        field_line(dst, name, value);
    }
    dst.put_slice(b"\r\n");
    encoder
}

/// hyper's `Client::set_length`: the body's encoder, `fields` changed to
/// say it.
fn set_length(method: &Method, version: Version, fields: &mut Fields, body: BodySize) -> Encoder {
    let Some(size) = body else {
        fields.remove(header::TRANSFER_ENCODING);
        return Encoder::Length(0);
    };
    let existing = content_length(
        fields
            .get_all(header::CONTENT_LENGTH)
            .map(HeaderValue::as_bytes),
    )
    .ok()
    .flatten();
    if version != Version::HTTP_11 {
        fields.remove(header::TRANSFER_ENCODING);
        return match (existing, size) {
            (Some(len), _) => Encoder::Length(len),
            (None, Some(len)) => content_length_set(fields, len),
            (None, None) => Encoder::Length(0),
        };
    }
    let mut remove_length = false;
    let last_coding = fields.get_all(header::TRANSFER_ENCODING).next_back();
    let ends_chunked = last_coding.map(|last| {
        last.to_str()
            .ok()
            .and_then(|s| s.rsplit(',').next())
            .is_some_and(|e| e.trim().eq_ignore_ascii_case("chunked"))
    });
    let encoder = match ends_chunked {
        Some(chunked) => {
            remove_length = true;
            if !chunked {
                fields.update_last(&header::TRANSFER_ENCODING, |last| {
                    let mut value = BytesMut::with_capacity(last.len() + 9);
                    value.put_slice(last.as_bytes());
                    value.put_slice(b", chunked");
                    HeaderValue::from_maybe_shared(value.freeze()).unwrap_or_else(|_| last.clone())
                });
            }
            Some(Encoder::Chunked(Vec::new()))
        }
        None => match (existing, size) {
            (Some(len), _) => Some(Encoder::Length(len)),
            (None, None) if matches!(*method, Method::GET | Method::HEAD | Method::CONNECT) => {
                Some(Encoder::Length(0))
            }
            (None, None) => {
                fields.append(
                    header::TRANSFER_ENCODING,
                    HeaderValue::from_static("chunked"),
                );
                remove_length = true;
                Some(Encoder::Chunked(Vec::new()))
            }
            (None, Some(_)) => None,
        },
    };
    if remove_length {
        fields.remove(header::CONTENT_LENGTH);
    }
    match encoder {
        Some(Encoder::Chunked(_)) => Encoder::Chunked(declared_trailers(fields)),
        Some(encoder) => encoder,
        None => content_length_set(fields, size.unwrap_or(0)),
    }
}

fn content_length_set(fields: &mut Fields, len: u64) -> Encoder {
    fields.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    Encoder::Length(len)
}

/// The field names the request's `Trailer` fields declare.
fn declared_trailers(fields: &Fields) -> Vec<HeaderName> {
    fields
        .get_all(header::TRAILER)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn head(
        method: Method,
        fields: &[(&'static str, &'static str)],
        body: BodySize,
    ) -> (String, Encoder) {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(*name, HeaderValue::from_static(value));
        }
        let mut dst = BytesMut::new();
        let uri = Uri::from_static("/a?b=c");
        let mut fields = Fields::from(headers);
        let encoder = request(&mut dst, &method, &uri, Version::HTTP_11, &mut fields, body);
        (String::from_utf8(dst.to_vec()).unwrap(), encoder)
    }

    #[test]
    fn framing_chosen_as_hyper_chooses_it() {
        let (h, e) = head(Method::GET, &[("host", "a")], None);
        assert_eq!(h, "GET /a?b=c HTTP/1.1\r\nhost: a\r\n\r\n");
        assert_eq!(e, Encoder::Length(0));
        let (h, e) = head(
            Method::POST,
            &[("content-length", "3"), ("host", "a")],
            Some(Some(3)),
        );
        assert_eq!(
            h,
            "POST /a?b=c HTTP/1.1\r\ncontent-length: 3\r\nhost: a\r\n\r\n"
        );
        assert_eq!(e, Encoder::Length(3));
        let (h, e) = head(Method::POST, &[("host", "a")], Some(Some(3)));
        assert_eq!(
            h,
            "POST /a?b=c HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\n\r\n"
        );
        assert_eq!(e, Encoder::Length(3));
        let (h, e) = head(
            Method::POST,
            &[("host", "a"), ("trailer", "x-sum")],
            Some(None),
        );
        assert_eq!(h, "POST /a?b=c HTTP/1.1\r\nhost: a\r\ntrailer: x-sum\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!(e, Encoder::Chunked(vec![HeaderName::from_static("x-sum")]));
        let (_, e) = head(Method::GET, &[("host", "a")], Some(None));
        assert_eq!(e, Encoder::Length(0));
        let (h, _) = head(
            Method::PUT,
            &[("transfer-encoding", "gzip"), ("content-length", "3")],
            Some(None),
        );
        assert_eq!(
            h,
            "PUT /a?b=c HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n"
        );
    }
}
