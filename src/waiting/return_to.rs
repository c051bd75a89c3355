//! The `return` path of the waiting page: where a visitor goes once admitted.
//! Owns turning an untrusted value into a relative path on this site, safe to
//! put in a `Location` header and (escaped as usual) in HTML and JSON; anything
//! doubtful becomes `/`. An invite token never rides in it.

use std::borrow::Cow;

use percent_encoding::{percent_decode, percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::{lane_grant, path};

/// Longest `return` accepted, before and after encoding.
pub const MAX_LEN: usize = 2048;

const FALLBACK: &str = "/";

/// How many rounds of percent-decoding are checked: a value encoded twice
/// (`%252F`) must not hide a `//` or a backslash from a server behind that
/// decodes again.
const DECODE_ROUNDS: usize = 3;

/// Returns `raw` if it is a relative path on this site, else `/`.
///
/// Accepted: starts with exactly one `/`; no backslash, control character or
/// whitespace anywhere, whether written out or percent-encoded (`%5C`,
/// `%0D%0A`, `%09`); does not start with `//` once decoded (`/%2F/host`); at
/// most [`MAX_LEN`] bytes. The query string is kept, less any `qg_invite`
/// parameter (`lane_grant::strip_invite`): the gate reads an invite where a
/// visitor arrives, and it goes no further. Characters that may not
/// appear in a URL as they are (non-ASCII, `"`, `<`, `>`, `` ` ``, `'`, `{`,
/// `}`, `|`, `^`, a `%` not starting an escape) are percent-encoded, so the
/// result is printable ASCII.
pub fn sanitize(raw: &str) -> String {
    // The site's root, the page's default: nothing to check or encode.
    if raw == FALLBACK {
        return FALLBACK.to_owned();
    }
    if raw.len() > MAX_LEN || !is_relative_on_site(raw) {
        return FALLBACK.to_owned();
    }
    let encoded = encode(raw.as_bytes());
    if encoded.len() > MAX_LEN {
        return FALLBACK.to_owned();
    }
    match lane_grant::strip_invite(&encoded) {
        Cow::Borrowed(_) => encoded,
        Cow::Owned(stripped) => stripped,
    }
}

fn is_relative_on_site(raw: &str) -> bool {
    if !raw.starts_with('/') {
        return false;
    }
    if raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return false;
    }
    let mut current = raw.as_bytes().to_vec();
    for _ in 0..DECODE_ROUNDS {
        if !decoded_form_is_safe(&current) {
            return false;
        }
        // A `%` without two hex digits is kept as it is.
        let next: Vec<u8> = percent_decode(&current).collect();
        if next == current {
            break;
        }
        current = next;
    }
    decoded_form_is_safe(&current)
}

fn decoded_form_is_safe(bytes: &[u8]) -> bool {
    if bytes.starts_with(b"//") || bytes.contains(&b'\\') || resolves_to_two_slashes(bytes) {
        return false;
    }
    if bytes.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return false;
    }
    // C1 controls (U+0080..U+009F) written as UTF-8.
    !String::from_utf8_lossy(bytes).chars().any(char::is_control)
}

/// Whether the path, once a browser or a later server resolves its dot
/// segments (`/x/..//host` → `//host`), starts with `//`: harmless on the
/// first hop, but a protocol-relative URL to whatever serialises it again.
fn resolves_to_two_slashes(bytes: &[u8]) -> bool {
    let end = bytes
        .iter()
        .position(|&b| b == b'?' || b == b'#')
        .unwrap_or(bytes.len());
    let mut kept: Vec<&[u8]> = Vec::new();
    let mut segments = bytes[..end].split(|&b| b == b'/').skip(1).peekable();
    while let Some(segment) = segments.next() {
        match segment {
            b"." => {}
            b".." => {
                kept.pop();
            }
            other => kept.push(other),
        }
        if segments.peek().is_none() && matches!(segment, b"." | b"..") {
            kept.push(b"");
        }
    }
    kept.len() > 1 && kept[0].is_empty()
}

/// Bytes percent-encoded in a `return` path: everything but RFC 3986
/// `pchar`, `/`, `?` and `#`, and `'` too, which some HTML and JS contexts
/// treat as a delimiter. `%` is in the set: one that starts an escape is
/// kept by [`encode`] itself.
const ENCODED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'!')
    .remove(b'$')
    .remove(b'&')
    .remove(b'(')
    .remove(b')')
    .remove(b'*')
    .remove(b'+')
    .remove(b',')
    .remove(b';')
    .remove(b'=')
    .remove(b':')
    .remove(b'@')
    .remove(b'/')
    .remove(b'?')
    .remove(b'#');

/// Percent-encodes what [`ENCODED`] names, keeping escapes already written.
fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some(at) = memchr::memchr(b'%', rest) {
        out.extend(percent_encode(&rest[..at], ENCODED));
        if path::starts_with_escape(&rest[at..]) {
            out.push('%');
        } else {
            out.push_str("%25");
        }
        rest = &rest[at + 1..];
    }
    out.extend(percent_encode(rest, ENCODED));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_root_passes_the_full_check_unchanged() {
        // What `sanitize` answers for it without looking.
        assert!(is_relative_on_site(FALLBACK));
        assert_eq!(encode(FALLBACK.as_bytes()), FALLBACK);
        assert!(matches!(
            lane_grant::strip_invite(FALLBACK),
            Cow::Borrowed(FALLBACK)
        ));
    }

    #[test]
    fn normal_paths_keep_their_query() {
        assert_eq!(sanitize("/"), "/");
        assert_eq!(sanitize("/tickets"), "/tickets");
        assert_eq!(
            sanitize("/tickets/42?seat=A1&sort=price,asc"),
            "/tickets/42?seat=A1&sort=price,asc"
        );
        assert_eq!(sanitize("/a/b%20c?q=x%2By"), "/a/b%20c?q=x%2By");
        assert_eq!(
            sanitize("/search?next=https://example.com/"),
            "/search?next=https://example.com/"
        );
    }

    #[test]
    fn protocol_relative_urls_are_refused() {
        assert_eq!(sanitize("//evil.example"), "/");
        assert_eq!(sanitize("///evil.example"), "/");
        assert_eq!(sanitize("/%2F/evil.example"), "/");
        assert_eq!(sanitize("/%2fevil.example"), "/");
        assert_eq!(sanitize("%2F%2Fevil.example"), "/");
        assert_eq!(sanitize("/%252F/evil.example"), "/");
        assert_eq!(sanitize("/x/..//evil.example"), "/");
        assert_eq!(sanitize("/./x/.././/evil.example"), "/");
        assert_eq!(sanitize("/x/%2E%2E//evil.example"), "/");
        assert_eq!(
            sanitize("/a/../b"),
            "/a/../b",
            "dot segments alone are fine"
        );
        assert_eq!(sanitize("/a/b/.."), "/a/b/..");
        assert_eq!(sanitize("/a?next=/x/..//y"), "/a?next=/x/..//y");
    }

    #[test]
    fn absolute_urls_and_schemes_are_refused() {
        assert_eq!(sanitize("https://evil.example"), "/");
        assert_eq!(sanitize("http://evil.example/x"), "/");
        assert_eq!(sanitize("javascript:alert(1)"), "/");
        assert_eq!(sanitize("data:text/html,<script>"), "/");
        assert_eq!(sanitize("tickets"), "/");
        assert_eq!(sanitize(""), "/");
    }

    #[test]
    fn backslashes_are_refused_written_or_encoded() {
        assert_eq!(sanitize("/\\evil.example"), "/");
        assert_eq!(sanitize("\\/evil.example"), "/");
        assert_eq!(sanitize("/%5Cevil.example"), "/");
        assert_eq!(sanitize("/%5cevil.example"), "/");
        assert_eq!(sanitize("/ok?path=a\\b"), "/");
        assert_eq!(sanitize("/%255Cevil.example"), "/");
    }

    #[test]
    fn header_injection_is_refused() {
        assert_eq!(sanitize("/x\r\nSet-Cookie: a=b"), "/");
        assert_eq!(sanitize("/x%0D%0ASet-Cookie:%20a=b"), "/");
        assert_eq!(sanitize("/x%0aLocation:%20//evil"), "/");
        assert_eq!(sanitize("/x%00"), "/");
        assert_eq!(sanitize("/x%C2%85y"), "/", "C1 control NEL, encoded");
    }

    #[test]
    fn tabs_and_whitespace_are_refused() {
        assert_eq!(sanitize("/\t/evil.example"), "/");
        assert_eq!(sanitize("/%09/evil.example"), "/");
        assert_eq!(sanitize("/a b"), "/");
        assert_eq!(sanitize(" /a"), "/");
        assert_eq!(sanitize("/a\u{3000}b"), "/");
        assert_eq!(sanitize("/a\u{a0}"), "/");
    }

    #[test]
    fn overlong_values_are_refused() {
        let at_limit = format!("/{}", "a".repeat(MAX_LEN - 1));
        assert_eq!(sanitize(&at_limit), at_limit);
        let over = format!("/{}", "a".repeat(MAX_LEN));
        assert_eq!(sanitize(&over), "/");
        // Short enough written out, too long once encoded.
        let grows = format!("/{}", "한".repeat(600));
        assert!(grows.len() <= MAX_LEN);
        assert_eq!(sanitize(&grows), "/");
    }

    #[test]
    fn unicode_is_percent_encoded_as_utf8() {
        assert_eq!(sanitize("/티켓?q=한"), "/%ED%8B%B0%EC%BC%93?q=%ED%95%9C");
        assert_eq!(sanitize("/caf%C3%A9"), "/caf%C3%A9");
    }

    #[test]
    fn markup_characters_are_encoded() {
        assert_eq!(
            sanitize("/x?a=\"><script>alert('1')</script>"),
            "/x?a=%22%3E%3Cscript%3Ealert(%271%27)%3C/script%3E"
        );
        assert_eq!(sanitize("/50%"), "/50%25");
        assert_eq!(sanitize("/`{|}^"), "/%60%7B%7C%7D%5E");
    }

    #[test]
    fn invites_are_taken_out() {
        assert_eq!(sanitize("/tickets?qg_invite=v1.i.x"), "/tickets");
        assert_eq!(
            sanitize("/tickets?a=1&qg%5Finvite=v1.i.x&b=%E2%82%AC"),
            "/tickets?a=1&b=%E2%82%AC"
        );
        assert_eq!(sanitize("/t?q=한&qg_invite=x"), "/t?q=%ED%95%9C");
        assert_eq!(sanitize("/t?qg_invites=x"), "/t?qg_invites=x");
    }

    proptest! {
        #[test]
        fn result_is_always_a_safe_relative_path(raw in "\\PC{0,64}|/[ -~]{0,64}|/(%[0-9A-Fa-f]{2}|[a-z/\\\\]){0,16}") {
            let out = sanitize(&raw);
            prop_assert!(out.starts_with('/'));
            prop_assert!(!out.starts_with("//"));
            prop_assert!(out.len() <= MAX_LEN);
            prop_assert!(out.bytes().all(|b| b.is_ascii_graphic()));
            prop_assert!(!out.contains(['\\', '"', '<', '>', '\'', '`']));
            prop_assert!(is_relative_on_site(&out));
            prop_assert_eq!(sanitize(&out), out.clone());
        }
    }
}
