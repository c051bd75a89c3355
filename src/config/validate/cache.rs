//! `cache` of a route or a bypass rule (DESIGN §9.3), and
//! `limits.cache_bytes`, which every cache of the process shares: each
//! field within its bounds, and every `max_body` within `cache_bytes`.

use std::time::Duration;

use super::field::{duration, show};
use crate::config::defaults;
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::{ByteSize, RawCache};
use crate::config::{Bypass, CacheConfig, Route};

/// A micro-cache keeps answers for seconds; an hour is the most that still
/// is one (a page kept longer wants the origin's own cache headers and a
/// real cache).
const MAX_TTL: Duration = Duration::from_secs(3600);
const MIN_TTL: Duration = Duration::from_millis(1);
/// More entries than memory could hold at any useful `limits.cache_bytes`.
const MAX_ENTRIES: u64 = 1_000_000;
/// `limits.cache_bytes` below this is a typo, not a budget.
const MIN_CACHE_BYTES: u64 = 64 << 10;

/// `cache` at `at` (of a route or a bypass rule), defaults filled in:
/// `Some(None)` when there is none, `None` when it is invalid.
pub(super) fn cache(
    raw: Option<RawCache>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<Option<CacheConfig>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    let mut valid = true;
    let ttl = duration(raw.ttl, defaults::CACHE_TTL);
    if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
        problems.report(
            at.key("ttl"),
            format!(
                "{} is out of range: must be between {} and {} (a micro-cache keeps answers for seconds)",
                show(ttl),
                show(MIN_TTL),
                show(MAX_TTL)
            ),
        );
        valid = false;
    }
    let max_entries = raw.max_entries.unwrap_or(defaults::CACHE_MAX_ENTRIES);
    if !(1..=MAX_ENTRIES).contains(&max_entries) {
        problems.report(
            at.key("max_entries"),
            format!("{max_entries} is out of range: must be between 1 and {MAX_ENTRIES}"),
        );
        valid = false;
    }
    let max_body = raw.max_body.map_or(defaults::CACHE_MAX_BODY, |b| b.0);
    if max_body == 0 {
        problems.report(at.key("max_body"), "must be at least 1 byte");
        valid = false;
    }
    valid.then_some(Some(CacheConfig {
        ttl,
        max_entries,
        max_body,
    }))
}

/// `limits.cache_bytes`: at least [`MIN_CACHE_BYTES`].
pub(super) fn cache_bytes(raw: Option<ByteSize>, at: &FieldPath, problems: &mut Problems) -> u64 {
    let bytes = raw.map_or(defaults::CACHE_BYTES, |b| b.0);
    if bytes < MIN_CACHE_BYTES {
        problems.report(
            at.clone(),
            format!("{bytes} bytes is too small: must be at least {MIN_CACHE_BYTES} (64KiB)"),
        );
    }
    bytes
}

/// A body larger than every cache together could never be kept: each
/// `max_body` is at most `limits.cache_bytes`.
pub(super) fn bodies_fit_the_budget(
    cache_bytes: u64,
    bypass: &[Bypass],
    routes: &[Route],
    root: &FieldPath,
    problems: &mut Problems,
) {
    let caches = bypass
        .iter()
        .enumerate()
        .map(|(i, b)| (root.key("bypass").index(i), b.cache))
        .chain(
            routes
                .iter()
                .enumerate()
                .map(|(i, r)| (root.key("routes").index(i), r.cache)),
        );
    for (at, cache) in caches {
        if let Some(cache) = cache.filter(|c| c.max_body > cache_bytes) {
            problems.report(
                at.key("cache").key("max_body"),
                format!(
                    "{} bytes is more than limits.cache_bytes ({cache_bytes}): no such body could be kept",
                    cache.max_body
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{message_at, parse, problem_paths};
    use crate::config::{BypassRule, CacheConfig};

    const ROUTE: &str =
        "routes:\n  - name: seats\n    match: { path_prefix: /seats }\n    capacity: 10\n";

    #[test]
    fn a_route_cache_reads_back_with_its_defaults() {
        let config = parse(&format!(
            "{ROUTE}    cache: {{ ttl: 1s, max_entries: 200, max_body: 1MiB }}\n"
        ))
        .unwrap();
        assert_eq!(
            config.routes[0].cache,
            Some(CacheConfig {
                ttl: Duration::from_secs(1),
                max_entries: 200,
                max_body: 1 << 20
            })
        );
        let config = parse(&format!("{ROUTE}    cache: {{}}\n")).unwrap();
        assert_eq!(config.routes[0].cache, Some(CacheConfig::default()));
        let config = parse(ROUTE).unwrap();
        assert_eq!(config.routes[0].cache, None);
        assert_eq!(config.limits.cache_bytes, 64 << 20);
    }

    #[test]
    fn a_bypass_rule_may_have_a_cache() {
        let config = parse(
            "bypass:\n  - { path_prefix: /static/, cache: { ttl: 5s, max_body: 64KiB } }\n  - { path: /healthz }\n",
        )
        .unwrap();
        assert_eq!(
            config.bypass[0].rule,
            BypassRule::PathPrefix("/static/".into())
        );
        assert_eq!(
            config.bypass[0].cache,
            Some(CacheConfig {
                ttl: Duration::from_secs(5),
                max_entries: 200,
                max_body: 64 << 10
            })
        );
        assert_eq!(config.bypass[1].cache, None);
        assert_eq!(
            problem_paths("bypass: [{ cache: { ttl: 1s } }]\n"),
            ["bypass[0]"]
        );
    }

    #[test]
    fn bad_cache_fields_are_named() {
        let paths = problem_paths(&format!(
            "{ROUTE}    cache: {{ ttl: 0s, max_entries: 0, max_body: 0 }}\n"
        ));
        assert_eq!(
            paths,
            [
                "routes[0].cache.ttl",
                "routes[0].cache.max_entries",
                "routes[0].cache.max_body"
            ]
        );
        let message = message_at(
            &format!("{ROUTE}    cache: {{ ttl: 2h }}\n"),
            "routes[0].cache.ttl",
        );
        assert!(message.contains("between 1ms and 1h"), "{message}");
        let message = message_at(
            &format!("{ROUTE}    cache: {{ max_body: 1MB }}\n"),
            "routes[0].cache.max_body",
        );
        assert!(message.contains("binary units"), "{message}");
        assert_eq!(
            problem_paths(&format!("{ROUTE}    cache: {{ size: 1 }}\n")),
            ["routes[0].cache.size"]
        );
        assert_eq!(
            problem_paths(&format!("{ROUTE}    cache: {{ ttl: 1 }}\n")),
            ["routes[0].cache.ttl"]
        );
    }

    #[test]
    fn cache_bytes_is_bounded_and_holds_every_body() {
        let config = parse("limits: { cache_bytes: 8MiB }\n").unwrap();
        assert_eq!(config.limits.cache_bytes, 8 << 20);
        assert_eq!(
            problem_paths("limits: { cache_bytes: 1KiB }\n"),
            ["limits.cache_bytes"]
        );
        assert_eq!(
            problem_paths("limits: { cache_bytes: lots }\n"),
            ["limits.cache_bytes"]
        );
        let message = message_at(
            &format!("limits: {{ cache_bytes: 1MiB }}\n{ROUTE}    cache: {{ max_body: 2MiB }}\n"),
            "routes[0].cache.max_body",
        );
        assert!(message.contains("limits.cache_bytes"), "{message}");
        assert_eq!(
            problem_paths(
                "limits: { cache_bytes: 1MiB }\nbypass: [{ path: /a, cache: { max_body: 4MiB } }]\n"
            ),
            ["bypass[0].cache.max_body"]
        );
    }
}
