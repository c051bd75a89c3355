//! Request paths as the gate reads them: the normalised path (DESIGN §1
//! step 3), the other readings an origin may make of the same bytes
//! (§8.1), whether they disagree in a way that could change the route, and
//! the segment-boundary prefix match. Every reading of a path the gate makes
//! is written here, once.
//!
//! The origin is not ours, and origins disagree: WSGI servers decode `%2F`
//! to `/`, Java containers drop `;params` from segments (and read `..;` as
//! `..`), IIS reads `\` as `/`, and a proxy or framework in between may
//! decode once more (`%252F`). The gate cannot know which reading the origin
//! makes, so it takes them all: a request is bypassed only if every reading
//! is, and gated if any reading is.

use std::borrow::Cow;

use percent_encoding::percent_decode;

/// How many rounds of percent-decoding a reading goes through at most: the
/// origin's own, and one more by something in between (`%252F`).
const DECODE_ROUNDS: usize = 2;

/// Every reading of one request path. The first is the normalised path; the
/// others exist only when the path has something an origin could read
/// another way (`%`, `\`, `;`), so an ordinary path costs nothing.
#[derive(Debug)]
pub struct Readings<'a> {
    first: Cow<'a, str>,
    others: Vec<String>,
    ambiguous: bool,
}

impl<'a> Readings<'a> {
    /// The readings of the path of a request-target (no query).
    pub fn of(raw: &'a str) -> Readings<'a> {
        let first = normalize(raw);
        let mut readings = Readings {
            first,
            others: Vec::new(),
            ambiguous: false,
        };
        if !raw.bytes().any(|b| matches!(b, b'%' | b'\\' | b';')) {
            return readings;
        }
        readings.ambiguous = raw.contains('\\');
        let written_dots = has_dot_segment(raw);
        let mut current: Vec<u8> = raw.as_bytes().to_vec();
        for round in 0..=DECODE_ROUNDS {
            if round > 0 {
                let next: Vec<u8> = percent_decode(&current).collect();
                if next == current {
                    break;
                }
                current = next;
            }
            let Ok(text) = std::str::from_utf8(&current) else {
                // Overlong or invalid UTF-8 (`%C0%AF`): no two origins agree.
                readings.ambiguous = true;
                break;
            };
            if escapes_separator(text) || (!written_dots && has_dot_segment(text)) {
                readings.ambiguous = true;
            }
            for strip in [false, true] {
                readings.add(origin_reading(text, strip));
            }
        }
        readings
    }

    fn add(&mut self, reading: String) {
        if reading != self.first && !self.others.contains(&reading) {
            self.others.push(reading);
        }
    }

    /// The normalised path (DESIGN §1 step 3).
    pub fn normalized(&self) -> &str {
        &self.first
    }

    /// Every reading, the normalised path first.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.first.as_ref()).chain(self.others.iter().map(String::as_str))
    }

    /// Whether the readings disagree in a way that could change the route:
    /// an encoded `/` or `\`, a written `\`, a NUL, invalid UTF-8 once
    /// decoded, or a dot segment that only decoding brings out.
    pub fn is_ambiguous(&self) -> bool {
        self.ambiguous
    }
}

/// Whether `text` holds a NUL, a control character or an escape that
/// decodes to a separator or a NUL (`%2F`, `%5C`, `%00`, either case).
fn escapes_separator(text: &str) -> bool {
    text.chars().any(char::is_control)
        || text.as_bytes().windows(3).any(|w| {
            w[0] == b'%'
                && matches!(
                    (w[1], w[2].to_ascii_uppercase()),
                    (b'2', b'F') | (b'5', b'C') | (b'0', b'0')
                )
        })
}

/// A path as an origin that reads `\` as `/` (and, with `strip`, drops
/// `;params` from each segment) sees it once decoded: dot segments
/// resolved, repeated slashes collapsed.
fn origin_reading(decoded: &str, strip: bool) -> String {
    let slashed = decoded.replace('\\', "/");
    let mut segments: Vec<&str> = Vec::new();
    for segment in slashed.split('/') {
        let segment = if strip {
            segment.split(';').next().unwrap_or("")
        } else {
            segment
        };
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(slashed.len() + 1);
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || (slashed.ends_with('/') && !segments.is_empty()) {
        out.push('/');
    }
    out
}

/// Whether `path` (with `\` read as `/`) has a `.` or `..` segment, also
/// one followed by `;params` (`..;`).
fn has_dot_segment(path: &str) -> bool {
    path.split(['/', '\\'])
        .any(|s| matches!(s.split(';').next(), Some("." | "..")))
}

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
/// `/tickets/…`, not `/ticketsale`; a prefix ending in `/` (`/static/`)
/// matches the paths below it; `/` matches every path.
pub fn prefix_matches(path: &str, prefix: &str) -> bool {
    if prefix.ends_with('/') {
        return path.starts_with(prefix);
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
