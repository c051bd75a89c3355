//! A route's line: how many it admits, how long the line may grow, what one
//! client may hold in it, and the sub-lines it is split into.

use std::time::Duration;

use super::field::{at_least, at_least_one, duration, required};
use crate::config::defaults;
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::{DurationText, RawCapacity, RawCapacityRange, RawClientLimits};
use crate::config::{Adapt, ClientLimits, MAX_SHARDS};

/// The shortest `adapt_every`: a window needs requests to say anything.
const MIN_ADAPT_EVERY: Duration = Duration::from_secs(1);

/// `capacity` (required) and `adapt_every`: a number of at least 1, fixed;
/// or a range (DESIGN §9.1), `min` ≤ `start` ≤ `max`, all at least 1,
/// `start` by default `min`, targets above zero. Returns the capacity the
/// route starts with and how it adapts, or `None` when it is not valid.
pub(super) fn capacity(
    raw: Option<RawCapacity>,
    adapt_every: Option<DurationText>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<(u64, Option<Adapt>)> {
    let every_at = at.key("adapt_every");
    let at = at.key("capacity");
    match required(raw, &at, problems)? {
        RawCapacity::Fixed(capacity) => {
            if adapt_every.is_some() {
                problems.report(
                    every_at,
                    "only for a capacity range: `capacity: { min, max, ... }`",
                );
            }
            Some((at_least_one(capacity, &at, problems), None)).filter(|(c, _)| *c > 0)
        }
        RawCapacity::Range(range) => {
            let every = at_least(
                adapt_every,
                defaults::ADAPT_EVERY,
                MIN_ADAPT_EVERY,
                &every_at,
                problems,
            );
            capacity_range(range, every, &at, problems)
        }
    }
}

/// The range of an adaptive `capacity` (see [`capacity`]).
fn capacity_range(
    range: RawCapacityRange,
    every: Duration,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<(u64, Option<Adapt>)> {
    let min = required(range.min, &at.key("min"), problems)
        .map(|n| at_least_one(n, &at.key("min"), problems));
    let max = required(range.max, &at.key("max"), problems)
        .map(|n| at_least_one(n, &at.key("max"), problems));
    let target = range.target.unwrap_or_default();
    let target_p95 = duration(target.p95, defaults::TARGET_P95);
    if target_p95.is_zero() {
        problems.report(at.key("target").key("p95"), "must be more than 0s");
    }
    let target_errors = target.errors.map_or(defaults::TARGET_ERRORS, |e| e.0);
    if target_errors <= 0.0 {
        problems.report(at.key("target").key("errors"), "must be more than 0%");
    }
    let (min, max) = (min?, max?);
    if max < min {
        problems.report(at.key("max"), format!("{max} is below min {min}"));
    }
    let start = range.start.unwrap_or(min);
    if max >= min && !(min..=max).contains(&start) {
        problems.report(
            at.key("start"),
            format!("{start} is outside the range: must be from min {min} to max {max}"),
        );
    }
    let valid = min > 0 && max >= min && (min..=max).contains(&start);
    let valid = valid && !target_p95.is_zero() && target_errors > 0.0;
    valid.then_some((
        start,
        Some(Adapt {
            min,
            max,
            target_p95,
            target_errors,
            every,
        }),
    ))
}

/// `max_admit_per_tick`: at least 1.
pub(super) fn max_admit_per_tick(raw: Option<u64>, at: &FieldPath, problems: &mut Problems) -> u64 {
    at_least_one(
        raw.unwrap_or(defaults::MAX_ADMIT_PER_TICK),
        &at.key("max_admit_per_tick"),
        problems,
    )
}

/// `client_limits`: by default [`ClientLimits::default`], with `places` at
/// most a [`defaults::CLIENT_PLACES_LINE_DIVISOR`]th of `max_waiting` (at
/// least 1); `places` may not let one address fill the line.
pub(super) fn client_limits(
    raw: Option<RawClientLimits>,
    max_waiting: u64,
    at: &FieldPath,
    problems: &mut Problems,
) -> ClientLimits {
    let default = ClientLimits::default();
    let default_places = default
        .places
        .min((max_waiting / defaults::CLIENT_PLACES_LINE_DIVISOR).max(1));
    let client_limits = match raw {
        None => ClientLimits {
            places: default_places,
            ..default
        },
        Some(raw) => ClientLimits {
            places: raw.places.unwrap_or(default_places),
            joins_per_minute: raw.joins_per_minute.unwrap_or(default.joins_per_minute),
        },
    };
    if client_limits.places > 0 && client_limits.places >= max_waiting {
        problems.report(
            at.key("client_limits").key("places"),
            format!(
                "{} would let one address fill the whole line (max_waiting {max_waiting}): \
                 give fewer, or 0 to turn the limit off",
                client_limits.places
            ),
        );
    }
    client_limits
}

/// `shards`: 1 to [`MAX_SHARDS`] sub-lines.
pub(super) fn shards(raw: Option<u32>, at: &FieldPath, problems: &mut Problems) -> u32 {
    let shards = raw.unwrap_or(defaults::SHARDS);
    if !(1..=MAX_SHARDS).contains(&shards) {
        problems.report(
            at.key("shards"),
            format!(
                "{shards} sub-lines: use 1 to {MAX_SHARDS} ({}, the default, keeps one line)",
                defaults::SHARDS
            ),
        );
    }
    shards
}

#[cfg(test)]
mod tests {
    use super::super::tests::{message_at, parse, problem_paths};
    use std::time::Duration;

    fn with_capacity(capacity: &str, extra: &str) -> String {
        format!(
            "routes: [{{ name: a, match: {{ path_prefix: /a }}, capacity: {capacity}{extra} }}]\n"
        )
    }

    #[test]
    fn a_capacity_range_reads_with_its_defaults() {
        let config = parse(&with_capacity("{ min: 10, max: 500 }", "")).unwrap();
        let route = &config.routes[0];
        assert_eq!(route.capacity, 10, "start defaults to min");
        let adapt = route.adapt.as_ref().unwrap();
        assert_eq!((adapt.min, adapt.max), (10, 500));
        assert_eq!(adapt.target_p95, Duration::from_secs(1));
        assert_eq!(adapt.target_errors, 0.02);
        assert_eq!(adapt.every, Duration::from_secs(5));
        let range = "{ min: 50, max: 5000, start: 500, target: { p95: 800ms, errors: 0.5% } }";
        let config = parse(&with_capacity(range, ", adapt_every: 2s")).unwrap();
        let route = &config.routes[0];
        let adapt = route.adapt.as_ref().unwrap();
        assert_eq!(route.capacity, 500);
        assert_eq!(adapt.target_p95, Duration::from_millis(800));
        assert!((adapt.target_errors - 0.005).abs() < 1e-12);
        assert_eq!(adapt.every, Duration::from_secs(2));
        let fixed = parse(&with_capacity("7", "")).unwrap();
        assert_eq!(
            (fixed.routes[0].capacity, fixed.routes[0].adapt.is_none()),
            (7, true)
        );
    }

    #[test]
    fn a_capacity_range_is_checked_field_by_field() {
        let paths = |capacity: &str, extra: &str| problem_paths(&with_capacity(capacity, extra));
        assert_eq!(paths("{ max: 5 }", ""), ["routes[0].capacity.min"]);
        assert_eq!(paths("{ min: 0, max: 5 }", ""), ["routes[0].capacity.min"]);
        assert_eq!(paths("{ min: 6, max: 5 }", ""), ["routes[0].capacity.max"]);
        assert_eq!(
            paths("{ min: 1, max: 5, start: 9 }", ""),
            ["routes[0].capacity.start"]
        );
        assert_eq!(
            paths("{ min: 1, max: 5, target: { p95: 0s, errors: 0% } }", ""),
            [
                "routes[0].capacity.target.p95",
                "routes[0].capacity.target.errors"
            ]
        );
        assert_eq!(
            paths("{ min: 1, max: 5, target: { errors: 2 } }", ""),
            ["routes[0].capacity.target.errors"]
        );
        assert_eq!(
            paths("{ min: 1, max: 5, target: { p95: fast } }", ""),
            ["routes[0].capacity.target.p95"]
        );
        assert_eq!(
            paths("{ min: 1, most: 5 }", ""),
            ["routes[0].capacity.most", "routes[0].capacity.max"]
        );
        assert_eq!(
            paths("{ min: 1, max: 5 }", ", adapt_every: 500ms"),
            ["routes[0].adapt_every"]
        );
        assert_eq!(paths("5", ", adapt_every: 5s"), ["routes[0].adapt_every"]);
        assert_eq!(paths("lots", ""), ["routes[0].capacity"]);
        let message = message_at(
            &with_capacity("{ min: 1, max: 5, start: 9 }", ""),
            "routes[0].capacity.start",
        );
        assert!(message.contains("from min 1 to max 5"), "{message}");
    }

    #[test]
    fn shards_default_to_one_and_are_checked() {
        let route = |extra: &str| {
            format!("routes: [{{ name: a, match: {{ path_prefix: /a }}, capacity: 1{extra} }}]\n")
        };
        let config = parse(&route("")).unwrap();
        assert_eq!(config.routes[0].shards, 1);
        let config = parse(&route(", shards: 3")).unwrap();
        assert_eq!(config.routes[0].shards, 3);
        for bad in [", shards: 0", ", shards: 17"] {
            assert_eq!(problem_paths(&route(bad)), ["routes[0].shards"], "{bad}");
        }
    }

    #[test]
    fn one_address_cannot_fill_a_short_line() {
        let route = |extra: &str| {
            format!(
                "routes:\n  - {{ name: r, match: {{ path_prefix: /r }}, capacity: 1{extra} }}\n"
            )
        };
        let config = parse(&route(", max_waiting: 5")).unwrap();
        assert_eq!(config.routes[0].client_limits.places, 1);
        let config = parse(&route(", max_waiting: 1000")).unwrap();
        assert_eq!(config.routes[0].client_limits.places, 20);
        let message = message_at(
            &route(", max_waiting: 5, client_limits: { places: 5 }"),
            "routes[0].client_limits.places",
        );
        assert!(message.contains("whole line"), "{message}");
        let config = parse(&route(", max_waiting: 5, client_limits: { places: 0 }")).unwrap();
        assert_eq!(config.routes[0].client_limits.places, 0);
    }
}
