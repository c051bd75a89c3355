//! A route's line: how many it admits, how long the line may grow, what one
//! client may hold in it, and the sub-lines it is split into.

use super::field::{at_least_one, required};
use crate::config::defaults;
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::RawClientLimits;
use crate::config::{ClientLimits, MAX_SHARDS};

/// `capacity`: required, at least 1; `None` otherwise.
pub(super) fn capacity(raw: Option<u64>, at: &FieldPath, problems: &mut Problems) -> Option<u64> {
    let at = at.key("capacity");
    required(raw, &at, problems)
        .map(|capacity| at_least_one(capacity, &at, problems))
        .filter(|&capacity| capacity > 0)
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
