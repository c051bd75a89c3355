//! The host a request is for, as routes match it.

use http::header::{HeaderMap, HOST};

/// The host a request is for, without the port and without one trailing dot.
pub fn request_host<'a>(headers: &'a HeaderMap, uri: &'a http::Uri) -> Option<&'a str> {
    let raw = match headers.get(HOST).and_then(|h| h.to_str().ok()) {
        Some(h) => h,
        None => uri.host()?,
    };
    if raw.starts_with('[') {
        return Some(
            raw.split_once(']')
                .map_or(raw, |(h, _)| h)
                .trim_start_matches('['),
        );
    }
    let host = raw.rsplit_once(':').map_or(raw, |(h, _)| h);
    // `shop.example.` names the same host as `shop.example`.
    Some(host.strip_suffix('.').unwrap_or(host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn host_without_port() {
        let uri: http::Uri = "/".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert(HOST, HeaderValue::from_static("Shop.example:8080"));
        assert_eq!(request_host(&h, &uri), Some("Shop.example"));
        h.insert(HOST, HeaderValue::from_static("shop.example.:8080"));
        assert_eq!(request_host(&h, &uri), Some("shop.example"));
        h.insert(HOST, HeaderValue::from_static("[::1]:8080"));
        assert_eq!(request_host(&h, &uri), Some("::1"));
    }
}
