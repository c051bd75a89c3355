//! The host a request is for (DESIGN §8.2): read from `Host` or the
//! HTTP/2 `:authority`, refused when missing, repeated, malformed or
//! disagreeing, and compared in one canonical spelling: lower case, without
//! the port and without one trailing dot. Routes, `limits.allowed_hosts`
//! and the config's host names all go through [`canonical`], so
//! `Shop.Example.:443` and `shop.example` are the same host everywhere.

use std::borrow::Cow;
use std::net::Ipv6Addr;

use http::header::HOST;

use crate::fields::Headers;
use http::{Uri, Version};

/// Longest host name accepted (RFC 1035), without a trailing dot.
const MAX_NAME_LEN: usize = 253;
/// Longest label accepted (RFC 1035).
const MAX_LABEL_LEN: usize = 63;

/// Why a request's host was refused (answered `400`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("HTTP/1.1 request without Host")]
    Missing,
    #[error("more than one Host header")]
    Repeated,
    #[error("Host is not name[:port] or IP[:port]")]
    Malformed,
    #[error("the target's authority and Host disagree")]
    Disagrees,
}

/// The canonical host of a request: `Ok(None)` for an HTTP/1.0 request
/// that names none (allowed by RFC 9112 §3.2), an error for anything a
/// reader could take for another host.
pub fn request_host<'a>(
    version: Version,
    headers: &'a impl Headers,
    uri: &'a Uri,
) -> Result<Option<Cow<'a, str>>, HostError> {
    let mut values = headers.all(&HOST);
    let header = match (values.next(), values.next()) {
        (Some(_), Some(_)) => return Err(HostError::Repeated),
        (Some(value), None) => Some(value.to_str().map_err(|_| HostError::Malformed)?),
        (None, _) => None,
    };
    let authority = uri.authority().map(|a| a.as_str());
    let host = match (header, authority) {
        // HTTP/2 with both, or an absolute-form target on HTTP/1.1 with a
        // Host: RFC 9112 §3.2.2 has the target's authority win, but the
        // origin gets the Host header, so the two must name one host.
        (Some(h), Some(a)) => {
            let (h, a) = (canonical(h)?, canonical(a)?);
            if h != a {
                return Err(HostError::Disagrees);
            }
            return Ok(Some(h));
        }
        (None, Some(a)) => a,
        (Some(h), None) => h,
        (None, None) if version == Version::HTTP_10 => return Ok(None),
        (None, None) => return Err(HostError::Missing),
    };
    canonical(host).map(Some)
}

/// `host[:port]` in its canonical spelling: lower case, port and one
/// trailing dot removed, an IPv6 literal without its brackets. A name is
/// labels of letters, digits, `-` and `_`, none empty, at most 63 bytes each
/// and 253 in all; a port is 1 to 5 digits.
pub fn canonical(raw: &str) -> Result<Cow<'_, str>, HostError> {
    if let Some(rest) = raw.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or(HostError::Malformed)?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return Err(HostError::Malformed);
        }
        inside
            .parse::<Ipv6Addr>()
            .map_err(|_| HostError::Malformed)?;
        return Ok(lower(inside));
    }
    let name = match raw.split_once(':') {
        Some((name, port)) if is_port(port) => name,
        Some(_) => return Err(HostError::Malformed),
        None => raw,
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(HostError::Malformed);
    }
    // Every dot-separated label non-empty, of letters, digits, `-` and `_`
    // and at most MAX_LABEL_LEN long: one pass over the bytes, as every
    // request's host is read.
    let mut label = 0;
    for b in name.bytes() {
        match b {
            b'.' if label > 0 => label = 0,
            b'.' => return Err(HostError::Malformed),
            b if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' => label += 1,
            _ => return Err(HostError::Malformed),
        }
        if label > MAX_LABEL_LEN {
            return Err(HostError::Malformed);
        }
    }
    if label == 0 {
        return Err(HostError::Malformed);
    }
    Ok(lower(name))
}

fn is_port(text: &str) -> bool {
    (1..=5).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit())
}

fn lower(text: &str) -> Cow<'_, str> {
    if text.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(text.to_ascii_lowercase())
    } else {
        Cow::Borrowed(text)
    }
}

/// One entry of `limits.allowed_hosts`: a host, or `*.name` for every host
/// below `name` (not `name` itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostPattern {
    Exact(String),
    Below(String),
}

impl HostPattern {
    /// Reads `shop.example` or `*.shop.example` (canonicalised).
    pub fn parse(text: &str) -> Result<HostPattern, HostError> {
        match text.strip_prefix("*.") {
            Some(parent) => Ok(HostPattern::Below(canonical(parent)?.into_owned())),
            None => Ok(HostPattern::Exact(canonical(text)?.into_owned())),
        }
    }

    /// Whether canonical `host` is this one or below it.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(name) => host == name,
            HostPattern::Below(parent) => host
                .strip_suffix(parent.as_str())
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn host_of(
        version: Version,
        hosts: &[&'static str],
        target: &str,
    ) -> Result<Option<String>, HostError> {
        let uri: Uri = target.parse().unwrap();
        let mut h = HeaderMap::new();
        for host in hosts {
            h.append(HOST, HeaderValue::from_static(host));
        }
        request_host(version, &h, &uri).map(|h| h.map(Cow::into_owned))
    }

    #[test]
    fn host_is_canonical() {
        let one = |h| host_of(Version::HTTP_11, &[h], "/");
        assert_eq!(one("Shop.example:8080"), Ok(Some("shop.example".into())));
        assert_eq!(one("shop.example.:8080"), Ok(Some("shop.example".into())));
        assert_eq!(one("shop.example."), Ok(Some("shop.example".into())));
        assert_eq!(one("[::1]:8080"), Ok(Some("::1".into())));
        assert_eq!(one("127.0.0.1"), Ok(Some("127.0.0.1".into())));
    }

    #[test]
    fn a_label_may_be_63_bytes_long_and_no_longer() {
        let one = |h| host_of(Version::HTTP_11, &[h], "/");
        let label = |n| -> &'static str { format!("{}.example", "a".repeat(n)).leak() };
        assert!(one(label(63)).is_ok());
        assert_eq!(one(label(64)), Err(HostError::Malformed));
    }

    #[test]
    fn host_fields_sent_in_two_cases_are_one_host_repeated() {
        let fields = crate::fields::testing::sent(&[("Host", "a.example"), ("HOST", "b.example")]);
        let uri: Uri = "/".parse().unwrap();
        let host = request_host(Version::HTTP_11, &fields, &uri);
        assert_eq!(host, Err(HostError::Repeated));
    }

    #[test]
    fn spellings_that_could_name_another_host_are_refused() {
        let one = |h| host_of(Version::HTTP_11, &[h], "/");
        for bad in [
            "shop.example..",
            "shop.example:80:80",
            "shop..example",
            ".shop.example",
            "shop.example:",
            "shop.example:123456",
            "user@shop.example",
            "shop example",
            "[::1",
            "[::1]x",
            "[zz::1]",
            "",
            ".",
        ] {
            assert_eq!(one(bad), Err(HostError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn missing_repeated_and_disagreeing_hosts_are_refused() {
        assert_eq!(host_of(Version::HTTP_11, &[], "/"), Err(HostError::Missing));
        assert_eq!(host_of(Version::HTTP_10, &[], "/"), Ok(None));
        assert_eq!(
            host_of(Version::HTTP_11, &["a.example", "b.example"], "/"),
            Err(HostError::Repeated)
        );
        assert_eq!(
            host_of(Version::HTTP_2, &["a.example"], "https://b.example/"),
            Err(HostError::Disagrees)
        );
        assert_eq!(
            host_of(Version::HTTP_2, &["A.example:443"], "https://a.example/"),
            Ok(Some("a.example".into()))
        );
        assert_eq!(
            host_of(Version::HTTP_2, &[], "https://a.example/"),
            Ok(Some("a.example".into()))
        );
        // An absolute-form target on HTTP/1.1: the origin reads Host.
        assert_eq!(
            host_of(Version::HTTP_11, &["b.example"], "http://a.example/"),
            Err(HostError::Disagrees)
        );
        assert_eq!(
            host_of(Version::HTTP_11, &["A.example:80"], "http://a.example/"),
            Ok(Some("a.example".into()))
        );
        assert_eq!(
            host_of(Version::HTTP_11, &[], "http://a.example/"),
            Ok(Some("a.example".into()))
        );
    }

    #[test]
    fn patterns_match_a_host_or_the_hosts_below() {
        let exact = HostPattern::parse("Shop.Example").unwrap();
        assert!(exact.matches("shop.example"));
        assert!(!exact.matches("www.shop.example"));
        let below = HostPattern::parse("*.shop.example").unwrap();
        assert!(below.matches("www.shop.example"));
        assert!(below.matches("a.b.shop.example"));
        assert!(!below.matches("shop.example"));
        assert!(!below.matches("evilshop.example"));
        assert!(HostPattern::parse("*.").is_err());
    }

    proptest! {
        /// Every spelling of a host that canonicalises at all gives the
        /// same host: case, port and one trailing dot never matter.
        #[test]
        fn spellings_of_one_host_agree(
            labels in prop::collection::vec("[a-z0-9][a-z0-9-]{0,10}", 1..4),
            upper in prop::collection::vec(any::<bool>(), 0..40),
            port in prop::option::of(1u32..65536),
            dot in any::<bool>(),
        ) {
            let name = labels.join(".");
            let mut spelled: String = name
                .chars()
                .zip(upper.iter().chain(std::iter::repeat(&false)))
                .map(|(c, &u)| if u { c.to_ascii_uppercase() } else { c })
                .collect();
            if dot {
                spelled.push('.');
            }
            if let Some(port) = port {
                spelled.push_str(&format!(":{port}"));
            }
            let host = canonical(&spelled).unwrap();
            prop_assert_eq!(host.as_ref(), name.as_str());
        }

        /// Whatever the bytes, canonicalisation never panics, and what it
        /// accepts is already canonical.
        #[test]
        fn canonical_is_idempotent(raw in "[ -~]{0,40}") {
            if let Ok(host) = canonical(&raw) {
                let again = canonical(&host);
                // An IPv6 literal comes back without brackets, which is not
                // itself a Host spelling; names must round-trip.
                if !raw.starts_with('[') {
                    let again = again.unwrap();
                    prop_assert_eq!(again.as_ref(), host.as_ref());
                }
            }
        }
    }
}
