//! Request paths as the gate reads them: the normalised path routes and
//! bypass rules match on (DESIGN §1 step 3) and the segment-boundary prefix
//! match. Every reading of a path the gate makes is written here, once.

use std::borrow::Cow;

use percent_encoding::percent_decode;

/// Normalises a request path for matching (DESIGN §1 step 3): percent-encoded
/// unreserved characters decoded, repeated slashes collapsed, dot segments
/// resolved. The request line itself is forwarded unchanged.
pub fn normalize(raw: &str) -> Cow<'_, str> {
    let needs_work =
        raw.contains('%') || raw.contains("//") || raw.contains("/.") || !raw.starts_with('/');
    if !needs_work {
        return Cow::Borrowed(raw);
    }
    let decoded = decode_unreserved(raw);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || (decoded.ends_with('/') && !segments.is_empty()) {
        out.push('/');
    }
    Cow::Owned(out)
}

/// A prefix matches on a segment boundary: `/tickets` matches `/tickets` and
/// `/tickets/…`, not `/ticketsale`; `/` matches every path.
pub fn prefix_matches(path: &str, prefix: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Decodes the escapes of unreserved characters (RFC 3986 §2.3: they mean
/// the same encoded or not); every other escape stays encoded, in one
/// spelling (upper-case hex).
fn decode_unreserved(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = bytes
            .get(i..i + 3)
            .filter(|e| e[0] == b'%' && e[1].is_ascii_hexdigit() && e[2].is_ascii_hexdigit());
        if let Some(escape) = escape {
            let c = percent_decode(escape).next().unwrap_or(b'%');
            if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                out.push(c as char);
            } else {
                out.push('%');
                out.push(escape[1].to_ascii_uppercase() as char);
                out.push(escape[2].to_ascii_uppercase() as char);
            }
            i += 3;
            continue;
        }
        // Copy one UTF-8 character (the path is a valid &str).
        let ch_len = raw[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&raw[i..i + ch_len]);
        i += ch_len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_for_matching() {
        assert_eq!(normalize("/tickets"), "/tickets");
        assert_eq!(normalize("/x/../tickets"), "/tickets");
        assert_eq!(normalize("//tickets"), "/tickets");
        assert_eq!(normalize("/%74ickets/a"), "/tickets/a");
        assert_eq!(normalize("/./tickets/./b/"), "/tickets/b/");
        assert_eq!(normalize("/../../tickets"), "/tickets");
        assert_eq!(normalize("/a%2Fb"), "/a%2Fb");
        assert_eq!(normalize("/a%2fb"), "/a%2Fb");
        assert_eq!(normalize("/.."), "/");
        assert_eq!(normalize("/%"), "/%");
        assert_eq!(normalize("/%7"), "/%7");
    }

    #[test]
    fn prefixes_match_on_segment_boundaries() {
        assert!(prefix_matches("/tickets", "/tickets"));
        assert!(prefix_matches("/tickets/1", "/tickets"));
        assert!(!prefix_matches("/ticketsale", "/tickets"));
        assert!(prefix_matches("/anything", "/"));
    }
}
