//! Request paths as the gate reads them: the normalised path (DESIGN §1
//! step 3), the other readings an origin may make of the same bytes
//! (§8.1, §9.6), whether they disagree in a way that could change the
//! route, the segment-boundary prefix match, and what counts as a percent
//! escape. Every reading of a path the gate makes is written here, once.
//!
//! The origin is not ours, and origins disagree: WSGI servers decode `%2F`
//! to `/`, Java containers drop `;params` from segments (and read `..;` as
//! `..`), IIS reads `\` as `/`, a proxy or framework in between may decode
//! once more (`%252F`), a lenient UTF-8 decoder reads the overlong `%C0%AF`
//! as `/`, and an origin written in C stops at a NUL. They also take their
//! steps in different orders, and the order changes the path: Tomcat drops
//! `;params` at each written `;` *before* it decodes, so `%3b` becomes a
//! `;` inside a segment's name, a level that `..` takes back; RFC 3986
//! (and Jetty, and WHATWG URL parsers) keep the empty segment `//` makes
//! when resolving `..`, where Tomcat and nginx merge the slashes first.
//! The gate cannot know which reading the origin makes, so it takes them
//! all: a request is bypassed only if every reading is, and gated if any
//! reading is.

use std::borrow::Cow;

use percent_encoding::percent_decode;

/// How many rounds of percent-decoding a reading goes through at most: the
/// origin's own, and one more by something in between (`%252F`).
const DECODE_ROUNDS: usize = 2;

/// Every reading of one request path. The first is the normalised path; the
/// others exist only when the path has something an origin could read
/// another way (`%`, `\`, `;`, or `//` before a dot segment), so an
/// ordinary path costs nothing.
#[derive(Debug)]
pub struct Readings<'a> {
    first: Cow<'a, str>,
    others: Vec<String>,
    ambiguous: bool,
}

impl<'a> Readings<'a> {
    /// The readings of the path of a request-target (no query).
    ///
    /// Each reading is one server's steps in that server's order (DESIGN
    /// §9.6): the path as written, or what an order of dropping `;params`
    /// and percent-decoding leaves of it (`texts`: Tomcat's is drop, then
    /// decode), then `\` read as `/` or not, `;params` dropped or not, cut
    /// at a NUL or not, and last the dot segments resolved, with `//`
    /// merged first or kept (`resolve`).
    pub fn of(raw: &'a str) -> Readings<'a> {
        let first = normalize(raw);
        let mut readings = Readings {
            first,
            others: Vec::new(),
            ambiguous: false,
        };
        if !raw.bytes().any(|b| matches!(b, b'%' | b'\\' | b';')) {
            // An ordinary path `normalize` borrowed has no `//`: one reading.
            if matches!(readings.first, Cow::Owned(_)) && raw.contains("//") && has_dot_segment(raw)
            {
                readings.add_text(raw);
            }
            return readings;
        }
        readings.ambiguous = raw.contains('\\');
        let written_dots = has_dot_segment(raw);
        for bytes in texts(raw) {
            let Ok(text) = std::str::from_utf8(&bytes) else {
                // Overlong or invalid UTF-8 (`%C0%AF`): no two origins
                // agree. A strict decoder reads it as U+FFFD, a lenient one
                // an overlong ASCII character as that character (`%C0%AF`
                // as `/`): both readings.
                readings.ambiguous = true;
                readings.add_text(&String::from_utf8_lossy(&bytes));
                readings.add_text(&lenient_text(&bytes));
                continue;
            };
            if escapes_separator(text) || (!written_dots && has_dot_segment(text)) {
                readings.ambiguous = true;
            }
            readings.add_text(text);
        }
        readings
    }

    /// Adds how origins read `text` once decoded as far as they decode:
    /// cut at the first NUL (an origin written in C) or not, `\` read as
    /// `/` or not, `;params` dropped from each segment or not, then dot
    /// segments resolved both ways `resolve` knows.
    fn add_text(&mut self, whole: &str) {
        let cut = whole.split('\0').next().unwrap_or(whole);
        let texts = if cut.len() < whole.len() {
            &[whole, cut][..]
        } else {
            &[whole][..]
        };
        for &text in texts {
            let backslashes = text.contains('\\');
            let params = text.contains(';');
            for (backslash, strip) in [(false, false), (true, false), (false, true), (true, true)] {
                if (backslash && !backslashes) || (strip && !params) {
                    continue;
                }
                let (merged, kept) = resolve(text, backslash, strip);
                self.add(merged);
                if let Some(kept) = kept {
                    self.add(kept);
                }
            }
        }
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

    /// Whether the path has no reading but the normalised one.
    pub fn is_single(&self) -> bool {
        self.others.is_empty()
    }

    /// Whether the readings disagree in a way that could change the route
    /// whatever the routes are: an encoded `/` or `\`, a written `\`, a
    /// NUL, invalid UTF-8 once decoded, or a dot segment that only
    /// decoding brings out. Readings that fall in different routes are
    /// the routes' to tell (`route::Settings::place`).
    pub fn is_ambiguous(&self) -> bool {
        self.ambiguous
    }
}

/// The texts origins resolve: the path as written and what each order of
/// dropping `;params` ([`strip_params`]) and percent-decoding (at most
/// [`DECODE_ROUNDS`] times) leaves of it. Tomcat and Jetty drop, then
/// decode (so `%3b` stays in a segment's name); most servers decode, then
/// drop; behind a proxy that decodes, Tomcat decodes, drops and decodes.
fn texts(raw: &str) -> Vec<Vec<u8>> {
    let mut texts: Vec<(Vec<u8>, usize)> = vec![(raw.as_bytes().to_vec(), 0)];
    let mut next = 0;
    while next < texts.len() {
        let (text, decoded) = &texts[next];
        let decoded = *decoded;
        let stripped = text.contains(&b';').then(|| strip_params(text));
        let more = (decoded < DECODE_ROUNDS && text.contains(&b'%'))
            .then(|| percent_decode(text).collect::<Vec<u8>>());
        next += 1;
        for (text, decoded) in [(stripped, decoded), (more, decoded + 1)] {
            if let Some(text) = text {
                if !texts.iter().any(|(t, _)| *t == text) {
                    texts.push((text, decoded));
                }
            }
        }
    }
    texts.into_iter().map(|(text, _)| text).collect()
}

/// `path` without the `;params` of its segments: each written `;` and
/// what follows it up to the next `/`, as Tomcat's `parsePathParameters`
/// drops them.
fn strip_params(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    let mut params = false;
    for &b in path {
        match b {
            b'/' => {
                params = false;
                out.push(b);
            }
            b';' => params = true,
            _ if !params => out.push(b),
            _ => {}
        }
    }
    out
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

/// Bytes that are not UTF-8 as a lenient decoder reads them: an overlong
/// encoding of an ASCII character (`C0 AF`, `E0 80 AF` for `/`) as that
/// character, anything else invalid as U+FFFD.
fn lenient_text(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    let mut rest = bytes;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(valid) => {
                out.push_str(valid);
                break;
            }
            Err(err) => {
                let (valid, after) = rest.split_at(err.valid_up_to());
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                let (c, len) = overlong_ascii(after).unwrap_or((
                    char::REPLACEMENT_CHARACTER,
                    err.error_len().unwrap_or(after.len()),
                ));
                out.push(c);
                rest = &after[len..];
            }
        }
    }
    out
}

/// The ASCII character an overlong two- or three-byte sequence at the
/// start of `bytes` encodes, and the sequence's length.
fn overlong_ascii(bytes: &[u8]) -> Option<(char, usize)> {
    let continues = |b: u8| b & 0xC0 == 0x80;
    match *bytes {
        [lead @ (0xC0 | 0xC1), b1, ..] if continues(b1) => {
            Some((char::from(((lead & 0x01) << 6) | (b1 & 0x3F)), 2))
        }
        [0xE0, b1 @ (0x80 | 0x81), b2, ..] if continues(b2) => {
            Some((char::from(((b1 & 0x01) << 6) | (b2 & 0x3F)), 3))
        }
        _ => None,
    }
}

/// `decoded` as an origin resolves it once its other steps are done: `\`
/// read as `/` when `backslash`, `;params` dropped from each segment when
/// `strip`, then dot segments resolved. The first path merges repeated
/// slashes before resolving (Tomcat, nginx); the second, only when a `..`
/// took back an empty segment, keeps them as empty segments (RFC 3986
/// §5.2.4, Jetty, WHATWG URL parsers): `/a//../b` is `/b` to the first,
/// `/a/b` to the second. A `..` above the root stays there.
fn resolve(decoded: &str, backslash: bool, strip: bool) -> (String, Option<String>) {
    let slashed = if backslash {
        Cow::Owned(decoded.replace('\\', "/"))
    } else {
        Cow::Borrowed(decoded)
    };
    let mut merged: Vec<&str> = Vec::new();
    let mut kept: Vec<&str> = Vec::new();
    let mut empty_taken = false;
    for (at, segment) in slashed.split('/').enumerate() {
        let segment = if strip {
            segment.split(';').next().unwrap_or("")
        } else {
            segment
        };
        match segment {
            "." => {}
            ".." => {
                merged.pop();
                empty_taken |= kept.pop() == Some("");
            }
            // Before the first `/` there is no segment.
            "" if at == 0 => {}
            "" => kept.push(""),
            s => {
                merged.push(s);
                kept.push(s);
            }
        }
    }
    let trailing = slashed.ends_with('/');
    let kept = empty_taken.then(|| joined(&kept, trailing, slashed.len()));
    (joined(&merged, trailing, slashed.len()), kept)
}

/// `segments` as a path, each after a `/`, with a trailing `/` when
/// `trailing`; `/` when there are none.
fn joined(segments: &[&str], trailing: bool, len: usize) -> String {
    let mut out = String::with_capacity(len + 1);
    for s in segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || (trailing && !out.ends_with('/')) {
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

/// Whether `bytes` starts with a percent escape: `%` and two hex digits.
/// A `%` not followed by two is no escape (the `percent-encoding` crate
/// leaves it as it is).
pub fn starts_with_escape(bytes: &[u8]) -> bool {
    matches!(bytes, [b'%', high, low, ..] if high.is_ascii_hexdigit() && low.is_ascii_hexdigit())
}

/// Decodes the escapes of unreserved characters (RFC 3986 §2.3: they mean
/// the same encoded or not); every other escape stays encoded, in one
/// spelling (upper-case hex).
fn decode_unreserved(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = bytes.get(i..i + 3).filter(|e| starts_with_escape(e));
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
    use proptest::prelude::*;

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

    #[test]
    fn an_escape_is_a_percent_and_two_hex_digits() {
        for escape in ["%2F", "%2f", "%00", "%aB/x"] {
            assert!(starts_with_escape(escape.as_bytes()), "{escape}");
        }
        for not in ["", "%", "%2", "%G0", "%0G", "x%20", "%%20"] {
            assert!(!starts_with_escape(not.as_bytes()), "{not}");
        }
    }

    #[test]
    fn the_review_s_spellings_are_gated_or_refused() {
        let gated = |p: &str| prefix_matches(p, "/tickets");
        for raw in [
            "/tickets%2Findex.html",
            "/static/..%2ftickets/index.html",
            "/tickets\\index.html",
            "/tickets%5cindex.html",
            "/x/%252e%252e/tickets",
            "/x%C0%AF../tickets",
        ] {
            let r = Readings::of(raw);
            assert!(r.is_ambiguous(), "{raw} not ambiguous: {r:?}");
        }
        for raw in [
            "/tickets;x=1",
            "/tickets;jsessionid=1/a",
            "/x/..;/tickets",
            "/%2574ickets",
        ] {
            let r = Readings::of(raw);
            assert!(r.iter().any(gated), "{raw} not gated: {r:?}");
        }
        for raw in ["/tickets/a", "/shop/caf%C3%A9", "/100%25", "/a;b"] {
            assert!(!Readings::of(raw).is_ambiguous(), "{raw}");
        }
        // An ordinary path has one reading and allocates nothing.
        let r = Readings::of("/tickets/42");
        assert_eq!(r.iter().count(), 1);
        assert!(matches!(r.first, Cow::Borrowed(_)));
    }

    #[test]
    fn tomcat_drops_params_before_it_decodes() {
        // Tomcat: `;params` dropped at each written `;`, then `%3b` and
        // `%74` decoded, then `//` merged and dot segments resolved.
        for (raw, tomcat) in [
            ("/shop/a/%3b/..;/..;/%74ickets/1", "/shop/tickets/1"),
            ("/shop/a/..;x/%3bx/%2e%2e;/tickets/1", "/shop/tickets/1"),
            ("/shop/%74ickets;x/%3b/..;/1", "/shop/tickets/1"),
            ("/;x/shop/a/%3B;y/..;/..;/tickets", "/shop/tickets"),
        ] {
            let r = Readings::of(raw);
            assert!(r.iter().any(|p| p == tomcat), "{raw}: {r:?}");
        }
        // `..%3b` is a name to Tomcat (`..;`), and `..` to a server that
        // decodes first: both readings.
        let r = Readings::of("/shop/x/..%3b/tickets");
        assert!(r.iter().any(|p| p == "/shop/x/..;/tickets"), "{r:?}");
        assert!(r.iter().any(|p| p == "/shop/tickets"), "{r:?}");
    }

    #[test]
    fn an_empty_segment_is_taken_back_by_dot_dot_in_rfc_3986() {
        // Merged first (Tomcat, nginx): `/seat`; kept (RFC 3986, Jetty):
        // `/tickets/seat`.
        let r = Readings::of("/tickets//../seat");
        assert_eq!(r.normalized(), "/seat");
        assert!(r.iter().any(|p| p == "/tickets/seat"), "{r:?}");
        assert!(!r.is_ambiguous());
        // An empty segment `;params` leave is one too (Jetty drops them).
        let r = Readings::of("/tickets/;x/../seat");
        assert!(r.iter().any(|p| p == "/tickets/seat"), "{r:?}");
        // Repeated slashes with no dot segment to resolve: one reading.
        let r = Readings::of("//tickets//seat");
        assert_eq!(r.iter().collect::<Vec<_>>(), ["/tickets/seat"]);
    }

    /// `;params` dropped from each `/`-separated segment of `bytes`.
    fn model_strip(bytes: &[u8]) -> Vec<u8> {
        bytes
            .split(|&b| b == b'/')
            .map(|seg| seg.split(|&b| b == b';').next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join(&b'/')
    }

    /// RFC 3986 §5.2.4 `remove_dot_segments`, written from the RFC's
    /// steps (input buffer to output buffer), not from the gate's code.
    fn remove_dot_segments(path: &str) -> String {
        let mut input = path.to_owned();
        let mut output = String::new();
        let pop = |output: &mut String| match output.rfind('/') {
            Some(at) => output.truncate(at),
            None => output.clear(),
        };
        while !input.is_empty() {
            if input.starts_with("../") {
                input.drain(..3);
            } else if input.starts_with("./") {
                input.drain(..2);
            } else if input.starts_with("/./") {
                input.replace_range(..3, "/");
            } else if input == "/." {
                input = "/".into();
            } else if input.starts_with("/../") {
                input.replace_range(..4, "/");
                pop(&mut output);
            } else if input == "/.." {
                input = "/".into();
                pop(&mut output);
            } else if input == "." || input == ".." {
                input.clear();
            } else {
                let from = usize::from(input.starts_with('/'));
                let end = input[from..].find('/').map_or(input.len(), |at| at + from);
                output.push_str(&input[..end]);
                input.drain(..end);
            }
        }
        output
    }

    /// How origins read a path, independently of the gate's own code:
    /// each drops `;params` and percent-decodes in its own order (decoding
    /// once or twice; Tomcat drops before it decodes), some read the
    /// overlong `C0 AF`/`E0 80 AF` as `/` and `C0 AE` as `.`, some stop at
    /// a NUL, some read `\` as `/`, some drop `;params` last, then dot
    /// segments are resolved with `//` merged first (Tomcat, nginx) or
    /// kept (RFC 3986).
    fn origin_models(raw: &str) -> Vec<String> {
        let decode = |b: &[u8]| percent_decode(b).collect::<Vec<u8>>();
        let once = decode(raw.as_bytes());
        let twice = decode(&once);
        let tomcat = decode(&model_strip(raw.as_bytes()));
        let tomcat_behind_a_decoder = decode(&model_strip(&once));
        let tomcat_decoding_twice = decode(&decode(&model_strip(raw.as_bytes())));
        let mut texts = Vec::new();
        for bytes in [
            raw.as_bytes().to_vec(),
            once,
            twice,
            tomcat,
            tomcat_behind_a_decoder,
            tomcat_decoding_twice,
        ] {
            let strict = String::from_utf8_lossy(&bytes).into_owned();
            let mut lenient_bytes = Vec::new();
            let mut i = 0;
            while i < bytes.len() {
                if bytes[i..].starts_with(&[0xC0, 0xAF]) {
                    lenient_bytes.push(b'/');
                    i += 2;
                } else if bytes[i..].starts_with(&[0xC0, 0xAE]) {
                    lenient_bytes.push(b'.');
                    i += 2;
                } else if bytes[i..].starts_with(&[0xE0, 0x80, 0xAF]) {
                    lenient_bytes.push(b'/');
                    i += 3;
                } else {
                    lenient_bytes.push(bytes[i]);
                    i += 1;
                }
            }
            let lenient = String::from_utf8_lossy(&lenient_bytes).into_owned();
            for text in [strict, lenient] {
                let cut = text.split('\0').next().unwrap().to_owned();
                texts.push(text);
                texts.push(cut);
            }
        }
        let mut out = Vec::new();
        for text in texts {
            for backslash in [false, true] {
                for strip in [false, true] {
                    let mut t = if backslash {
                        text.replace('\\', "/")
                    } else {
                        text.clone()
                    };
                    if strip {
                        t = String::from_utf8_lossy(&model_strip(t.as_bytes())).into_owned();
                    }
                    let mut merged = t.clone();
                    while merged.contains("//") {
                        merged = merged.replace("//", "/");
                    }
                    out.push(remove_dot_segments(&merged));
                    out.push(remove_dot_segments(&t));
                }
            }
        }
        out
    }

    fn spell() -> impl Strategy<Value = String> {
        // One character of a path as a client may spell it.
        prop_oneof![
            Just("/".to_owned()),
            Just("%2F".to_owned()),
            Just("%2f".to_owned()),
            Just("%252F".to_owned()),
            Just("%5C".to_owned()),
            Just("\\".to_owned()),
            Just("%C0%AF".to_owned()),
            Just("%C0%AE".to_owned()),
            Just("%E0%80%AF".to_owned()),
            Just(".".to_owned()),
            Just("%2e".to_owned()),
            Just("%2E".to_owned()),
            Just("%252e".to_owned()),
            Just(";x=1".to_owned()),
            Just(";".to_owned()),
            Just("%3b".to_owned()),
            Just("%3B".to_owned()),
            Just("%00".to_owned()),
            Just("%25".to_owned()),
            "[a-z]".prop_map(|c| c),
            "[a-z]".prop_map(|c| format!("%{:02X}", c.as_bytes()[0])),
            "[a-z]".prop_map(|c| format!("%{:02x}", c.as_bytes()[0])),
            "[a-z]".prop_map(|c| format!("%25{:02X}", c.as_bytes()[0])),
        ]
    }

    /// `tickets` with each letter written as it is or percent-encoded,
    /// once or twice.
    fn spelled_tickets() -> impl Strategy<Value = String> {
        prop::collection::vec(0u8..4, 7).prop_map(|how| {
            "tickets"
                .bytes()
                .zip(how)
                .map(|(b, how)| match how {
                    0 => char::from(b).to_string(),
                    1 => format!("%{b:02X}"),
                    2 => format!("%{b:02x}"),
                    _ => format!("%25{b:02X}"),
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// Whenever any origin's reading lands under the gated prefix, one
        /// of the gate's readings is gated (what `ambiguous_paths: gate`
        /// relies on), and so is it under `reject` unless the path is
        /// refused: never forwarded ungated. The prefix is `/tickets`, or
        /// `/shop/tickets`, where a reading that resolves one `..` too many
        /// is not saved by the root.
        #[test]
        fn no_spelling_reaches_a_gated_prefix_ungated(
            below_shop in any::<bool>(),
            parts in prop::collection::vec(
                prop_oneof![
                    2 => Just("tickets".to_owned()),
                    2 => spelled_tickets(),
                    1 => Just("static".to_owned()),
                    1 => Just("..".to_owned()),
                    1 => Just("/..;/".to_owned()),
                    1 => Just("/%3b/".to_owned()),
                    1 => Just("/a/".to_owned()),
                    4 => spell(),
                ],
                1..10,
            )
        ) {
            let (raw, prefix) = if below_shop {
                (format!("/shop/{}", parts.concat()), "/shop/tickets")
            } else {
                (format!("/{}", parts.concat()), "/tickets")
            };
            let gated = |p: &str| prefix_matches(p, prefix);
            let origin_gated = origin_models(&raw).iter().any(|p| gated(p));
            let r = Readings::of(&raw);
            if origin_gated {
                prop_assert!(
                    r.iter().any(gated),
                    "{} reaches {} at the origin but is neither refused nor gated: {:?}",
                    raw,
                    prefix,
                    r
                );
            }
        }

        /// Readings never panic, whatever the bytes.
        #[test]
        fn readings_take_any_path(raw in "/[ -~]{0,40}") {
            let r = Readings::of(&raw);
            prop_assert!(r.iter().count() >= 1);
        }
    }
}
