//! What may be cached (DESIGN §9.3): which requests a cache may answer
//! ([`Ask`]), which answers it may keep and for how long ([`Keep`]).
//!
//! Requests: `GET`, and `HEAD` answered from a `GET`'s entry; never one
//! with a body, a `Range`, an `Upgrade`; one with `Authorization` is never
//! answered from the cache and its answer kept only when it says `public`;
//! one with `Cache-Control: no-cache` goes to the origin and refreshes.
//!
//! Answers: status 200, 203, 204, 301, 404 or 410, without `Set-Cookie`,
//! without `Cache-Control: private`, `no-store` or `no-cache`, without
//! `Vary: *` or a `Vary` on who the client is, and without any order of
//! the origin's to queuegate (those are for one visitor). Kept for the
//! cache's `ttl`, or the answer's `s-maxage` (else `max-age`) when it is
//! shorter, less the `Age` it came with.

use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderName};
use http::{Method, StatusCode};

use crate::fields::Headers;

/// Statuses kept: the cacheable-by-default ones a micro-cache meets
/// (RFC 9110 §15.1) less `206` (ranges are never cached) and `405`, `414`,
/// `501`, `308`, `300` (rare, and not worth a wrong answer).
const KEPT_STATUSES: [StatusCode; 6] = [
    StatusCode::OK,
    StatusCode::NON_AUTHORITATIVE_INFORMATION,
    StatusCode::NO_CONTENT,
    StatusCode::MOVED_PERMANENTLY,
    StatusCode::NOT_FOUND,
    StatusCode::GONE,
];

/// `Vary` names that say the answer is per client: kept per client, they
/// would fill the cache with pages nobody else asks for.
const PER_CLIENT: [HeaderName; 3] = [
    HeaderName::from_static("x-forwarded-for"),
    HeaderName::from_static("x-real-ip"),
    header::FORWARDED,
];

/// How a request may use a cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// `HEAD`: answered from a `GET`'s entry, or by the origin; it never
    /// fills an entry.
    pub head: bool,
    /// `Cache-Control: no-cache` (or `Pragma: no-cache` without
    /// `Cache-Control`): not answered from an entry; the origin's answer
    /// refreshes it.
    pub refresh: bool,
    /// `Authorization`: never answered from the cache, nor from another
    /// request's fetch; its answer is kept only when it says `public`.
    pub authorized: bool,
}

impl Ask {
    /// How a request of `method` with `headers` may use a cache, its body
    /// `ended` or not; `None` when it may not at all.
    pub fn of(method: &Method, headers: &impl Headers, ended: bool) -> Option<Ask> {
        let head = match *method {
            Method::GET => false,
            Method::HEAD => true,
            _ => return None,
        };
        if headers.has(&header::RANGE)
            || headers.has(&header::UPGRADE)
            || headers.has(&header::IF_RANGE)
            || !ended
        {
            return None;
        }
        let refresh = if headers.has(&header::CACHE_CONTROL) {
            directives(headers).any(|(name, _)| name.eq_ignore_ascii_case("no-cache"))
        } else {
            headers
                .all(&header::PRAGMA)
                .any(|v| v.as_bytes().eq_ignore_ascii_case(b"no-cache"))
        };
        Some(Ask {
            head,
            refresh,
            authorized: headers.has(&header::AUTHORIZATION),
        })
    }

    /// Whether the request may be answered from an entry or another
    /// request's fetch.
    pub fn may_be_served(&self) -> bool {
        !self.refresh && !self.authorized
    }

    /// Whether its answer may fill an entry (its own `GET`, not a `HEAD`).
    pub fn may_fill(&self) -> bool {
        !self.head
    }
}

/// An answer a cache may keep: for how long, and under which `Vary`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keep {
    /// From the moment it was received.
    pub fresh_for: Duration,
    /// The `Age` it came with, in seconds.
    pub age: u64,
    /// The header names its `Vary` lists, lower-case, sorted, each once.
    pub vary: Arc<[HeaderName]>,
}

/// Whether an answer with `status` and `headers` to a request that asked
/// `ask` may be kept by a cache whose `ttl` is given, and how.
pub fn keep(status: StatusCode, headers: &impl Headers, ask: &Ask, ttl: Duration) -> Option<Keep> {
    if !KEPT_STATUSES.contains(&status) || headers.has(&header::SET_COOKIE) {
        return None;
    }
    let mut public = false;
    let mut s_maxage = None;
    let mut max_age = None;
    for (name, value) in directives(headers) {
        let name = name.to_ascii_lowercase();
        match name.as_str() {
            "private" | "no-store" | "no-cache" => return None,
            "public" => public = true,
            "s-maxage" => s_maxage = Some(seconds(value)?),
            "max-age" => max_age = Some(seconds(value)?),
            _ => {}
        }
    }
    if ask.authorized && !public {
        return None;
    }
    let vary = vary(headers)?;
    let age = headers
        .first(&header::AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let said = s_maxage
        .or(max_age)
        .map_or(ttl, |s| ttl.min(Duration::from_secs(s)));
    let fresh_for = said.saturating_sub(Duration::from_secs(age));
    (!fresh_for.is_zero()).then_some(Keep {
        fresh_for,
        age,
        vary,
    })
}

/// The names an answer's `Vary` lists; `None` for `*` or a name that
/// says the answer is per client.
fn vary(headers: &impl Headers) -> Option<Arc<[HeaderName]>> {
    let mut names: Vec<HeaderName> = Vec::new();
    for value in headers.all(&header::VARY) {
        // A value that is not text names nothing a key could be made of.
        let text = value.to_str().ok()?;
        for token in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if token == "*" {
                return None;
            }
            let name = HeaderName::from_bytes(token.as_bytes()).ok()?;
            if PER_CLIENT.contains(&name) {
                return None;
            }
            names.push(name);
        }
    }
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    Some(names.into())
}

/// Every `Cache-Control` directive in `headers`: its name and its value
/// (unquoted), if any. A value that is not text holds none.
fn directives(headers: &impl Headers) -> impl Iterator<Item = (&str, Option<&str>)> {
    headers
        .all(&header::CACHE_CONTROL)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| match d.split_once('=') {
            Some((name, value)) => (name.trim(), Some(value.trim().trim_matches('"'))),
            None => (d, None),
        })
}

/// A delta-seconds value; `None` (the answer is not kept) when it is
/// missing or not a number.
fn seconds(value: Option<&str>) -> Option<u64> {
    let value = value?;
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Past u64 is "for ever" (RFC 9111 §1.2.2).
    Some(value.parse().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::Fields;
    use http::{HeaderMap, HeaderValue};

    const TTL: Duration = Duration::from_secs(1);
    const GET: Ask = Ask {
        head: false,
        refresh: false,
        authorized: false,
    };

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_static(value));
        }
        h
    }

    fn ask(method: &str, pairs: &[(&'static str, &'static str)]) -> Option<Ask> {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        Ask::of(&method, &Fields::from(headers(pairs)), true)
    }

    #[test]
    fn only_plain_gets_and_heads_ask() {
        assert_eq!(ask("GET", &[]), Some(GET));
        assert_eq!(ask("HEAD", &[]).map(|a| a.head), Some(true));
        for method in ["POST", "PUT", "DELETE", "OPTIONS"] {
            assert_eq!(ask(method, &[]), None, "{method}");
        }
        assert_eq!(ask("GET", &[("range", "bytes=0-10")]), None);
        assert_eq!(ask("GET", &[("upgrade", "websocket")]), None);
        let with_body = Ask::of(&Method::GET, &Fields::new(), false);
        assert_eq!(with_body, None);
    }

    #[test]
    fn no_cache_refreshes_and_authorization_is_never_served() {
        let refresh = ask("GET", &[("cache-control", "max-age=0, No-Cache")]).unwrap();
        assert!(refresh.refresh && !refresh.may_be_served());
        assert!(ask("GET", &[("pragma", "no-cache")]).unwrap().refresh);
        assert!(
            !ask(
                "GET",
                &[("pragma", "no-cache"), ("cache-control", "max-age=5")]
            )
            .unwrap()
            .refresh
        );
        assert!(
            !ask("GET", &[("cache-control", "max-age=0")])
                .unwrap()
                .refresh
        );
        let auth = ask("GET", &[("authorization", "Bearer x")]).unwrap();
        assert!(auth.authorized && !auth.may_be_served() && auth.may_fill());
    }

    #[test]
    fn kept_statuses_and_refusals() {
        for status in [200, 203, 204, 301, 404, 410] {
            let status = StatusCode::from_u16(status).unwrap();
            assert!(
                keep(status, &HeaderMap::new(), &GET, TTL).is_some(),
                "{status}"
            );
        }
        for status in [206, 302, 304, 400, 500, 502, 503] {
            let status = StatusCode::from_u16(status).unwrap();
            assert!(
                keep(status, &HeaderMap::new(), &GET, TTL).is_none(),
                "{status}"
            );
        }
        for refused in [
            headers(&[("set-cookie", "a=1")]),
            headers(&[("cache-control", "private")]),
            headers(&[("cache-control", "public, private=\"x\"")]),
            headers(&[("cache-control", "no-store")]),
            headers(&[
                ("cache-control", "max-age=60"),
                ("cache-control", "no-cache"),
            ]),
            headers(&[("cache-control", "max-age=0")]),
            headers(&[("cache-control", "max-age=banana")]),
            headers(&[("vary", "*")]),
            headers(&[("vary", "Accept-Encoding, X-Forwarded-For")]),
            headers(&[("age", "5"), ("cache-control", "max-age=3")]),
        ] {
            assert!(
                keep(StatusCode::OK, &refused, &GET, TTL).is_none(),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn freshness_is_the_shortest_and_never_longer_than_ttl() {
        let fresh = |pairs| {
            keep(
                StatusCode::OK,
                &headers(pairs),
                &GET,
                Duration::from_secs(10),
            )
        };
        assert_eq!(fresh(&[]).unwrap().fresh_for, Duration::from_secs(10));
        assert_eq!(
            fresh(&[("cache-control", "max-age=3")]).unwrap().fresh_for,
            Duration::from_secs(3)
        );
        assert_eq!(
            fresh(&[("cache-control", "max-age=3, s-maxage=5")])
                .unwrap()
                .fresh_for,
            Duration::from_secs(5)
        );
        assert_eq!(
            fresh(&[("cache-control", "max-age=3600")])
                .unwrap()
                .fresh_for,
            Duration::from_secs(10)
        );
        let aged = fresh(&[("cache-control", "max-age=8"), ("age", "2")]).unwrap();
        assert_eq!((aged.fresh_for, aged.age), (Duration::from_secs(6), 2));
        assert_eq!(
            fresh(&[("cache-control", "max-age=99999999999999999999999")])
                .unwrap()
                .fresh_for,
            Duration::from_secs(10)
        );
    }

    #[test]
    fn an_authorized_request_keeps_only_public_answers() {
        let auth = Ask {
            authorized: true,
            ..GET
        };
        assert!(keep(StatusCode::OK, &HeaderMap::new(), &auth, TTL).is_none());
        let public = headers(&[("cache-control", "public, max-age=60")]);
        assert!(keep(StatusCode::OK, &public, &auth, TTL).is_some());
    }

    #[test]
    fn vary_names_are_lower_case_sorted_once() {
        let kept = keep(
            StatusCode::OK,
            &headers(&[
                ("vary", "Accept-Language, accept-encoding"),
                ("vary", "Accept-Language"),
            ]),
            &GET,
            TTL,
        )
        .unwrap();
        let names: Vec<&str> = kept.vary.iter().map(HeaderName::as_str).collect();
        assert_eq!(names, ["accept-encoding", "accept-language"]);
    }
}
