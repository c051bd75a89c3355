//! Where a request's answer is kept: its base (what the origin is asked
//! for: scheme, host and target as received, and the forwarding headers a
//! trusted proxy sent, which reach the origin as they are) and, under the
//! `Vary` of the origin's answer, the values of the headers it names.
//!
//! Each part is written whole, between bytes no header value, host or
//! target may hold (`\0`, `\x01`, `\n`), so two different requests never
//! make the same key.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderName};
use http::Uri;

use crate::fields::Headers;

/// The forwarding headers that reach the origin from a trusted proxy as
/// they came: an origin may build links from them.
const FORWARDED: [HeaderName; 3] = [
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-proto"),
    header::FORWARDED,
];

/// A request's base key: the same for every request the origin is asked
/// the same thing by, before `Vary`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Base(Bytes);

/// The whole key: the base, the header names of the answer's `Vary` and
/// their values in the request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key(Bytes);

impl Base {
    /// The base of a request for `uri` with `headers` (the `Host` as the
    /// client spelled it, or the HTTP/2 authority), over TLS or not, from a
    /// trusted proxy or not.
    pub fn of(uri: &Uri, headers: &impl Headers, tls: bool, trusted: bool) -> Base {
        let mut key = BytesMut::with_capacity(64);
        key.put_slice(if tls { b"https" } else { b"http" });
        key.put_u8(0);
        match headers.first(&header::HOST) {
            Some(host) => key.put_slice(host.as_bytes()),
            None => {
                if let Some(authority) = uri.authority() {
                    key.put_slice(authority.as_str().as_bytes());
                }
            }
        }
        key.put_u8(0);
        key.put_slice(uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes());
        if trusted {
            for name in &FORWARDED {
                key.put_u8(0);
                values(&mut key, headers, name);
            }
        }
        Base(key.freeze())
    }

    /// The key of the request with `headers` under the `Vary` names
    /// `vary`.
    pub fn key(&self, vary: &[HeaderName], headers: &impl Headers) -> Key {
        if vary.is_empty() {
            return Key(self.0.clone());
        }
        let mut key = BytesMut::with_capacity(self.0.len() + 32 * vary.len());
        key.put_slice(&self.0);
        for name in vary {
            key.put_u8(0);
            key.put_u8(0);
            key.put_slice(name.as_str().as_bytes());
            key.put_u8(0);
            values(&mut key, headers, name);
        }
        Key(key.freeze())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Key {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The values of `name` in `headers`, each ended by `\n`; `\x01` when
/// there is none (an absent header differs from an empty one).
fn values(key: &mut BytesMut, headers: &impl Headers, name: &HeaderName) {
    let mut any = false;
    for value in headers.all(name) {
        key.put_slice(value.as_bytes());
        key.put_u8(b'\n');
        any = true;
    }
    if !any {
        key.put_u8(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_static(value));
        }
        h
    }

    fn base(target: &str, pairs: &[(&'static str, &'static str)], tls: bool) -> Base {
        Base::of(&target.parse().unwrap(), &headers(pairs), tls, false)
    }

    #[test]
    fn host_spelling_scheme_and_query_are_apart() {
        let a = base("/seats?s=1", &[("host", "shop.example")], false);
        assert_eq!(a, base("/seats?s=1", &[("host", "shop.example")], false));
        assert_ne!(a, base("/seats?s=2", &[("host", "shop.example")], false));
        assert_ne!(a, base("/seats?s=1", &[("host", "Shop.example")], false));
        assert_ne!(a, base("/seats?s=1", &[("host", "shop.example:80")], false));
        assert_ne!(a, base("/seats?s=1", &[("host", "shop.example")], true));
        assert_ne!(a, base("/seats%3Fs=1", &[("host", "shop.example")], false));
    }

    #[test]
    fn forwarding_headers_count_only_from_a_trusted_proxy() {
        let uri: Uri = "/seats".parse().unwrap();
        let plain = headers(&[("host", "a")]);
        let forwarded = headers(&[("host", "a"), ("x-forwarded-host", "evil")]);
        assert_eq!(
            Base::of(&uri, &plain, false, false),
            Base::of(&uri, &forwarded, false, false)
        );
        assert_ne!(
            Base::of(&uri, &plain, false, true),
            Base::of(&uri, &forwarded, false, true)
        );
    }

    #[test]
    fn vary_values_and_absence_are_apart() {
        let b = base("/seats", &[("host", "a")], false);
        let lang = [HeaderName::from_static("accept-language")];
        let fr = b.key(&lang, &headers(&[("accept-language", "fr")]));
        let en = b.key(&lang, &headers(&[("accept-language", "en")]));
        let empty = b.key(&lang, &headers(&[("accept-language", "")]));
        let none = b.key(&lang, &HeaderMap::new());
        assert_ne!(fr, en);
        assert_ne!(empty, none);
        assert_ne!(none, b.key(&[], &HeaderMap::new()));
        assert_eq!(fr, b.key(&lang, &headers(&[("accept-language", "fr")])));
        let two = b.key(
            &lang,
            &headers(&[("accept-language", "fr"), ("accept-language", "en")]),
        );
        assert_ne!(two, fr);
    }
}
