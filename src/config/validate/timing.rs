//! A route's times: how often it admits, how long passes, sessions and
//! places last (each within its bounds and against the others), and when
//! the route opens and closes.

use std::time::Duration;

use super::field::{at_least, duration, positive, show};
use crate::config::defaults;
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::{DurationText, RawRoute};
use crate::config::Timestamp;

const MIN_TICK: Duration = Duration::from_millis(10);
const MIN_PASS_TTL: Duration = Duration::from_secs(2);

/// How long the parts of a route's admission last.
pub(super) struct Timing {
    pub tick: Duration,
    pub pass_ttl: Duration,
    pub session_ttl: Duration,
    pub arrival_grace: Duration,
    pub abandon_after: Duration,
    pub confirm_within: Duration,
}

/// `tick`, `pass_ttl`, `session_ttl` (outliving the pass), `arrival_grace`,
/// `abandon_after` and `confirm_within`, reported in that order.
pub(super) fn timing(raw: &RawRoute, at: &FieldPath, problems: &mut Problems) -> Timing {
    let tick = at_least(
        raw.tick,
        defaults::TICK,
        MIN_TICK,
        &at.key("tick"),
        problems,
    );
    let pass_ttl = at_least(
        raw.pass_ttl,
        defaults::PASS_TTL,
        MIN_PASS_TTL,
        &at.key("pass_ttl"),
        problems,
    );
    let session_ttl = duration(raw.session_ttl, defaults::SESSION_TTL);
    if session_ttl < pass_ttl {
        problems.report(
            at.key("session_ttl"),
            format!(
                "{} is shorter than pass_ttl {}: a session must outlive the pass that stands for it",
                show(session_ttl),
                show(pass_ttl)
            ),
        );
    }
    let arrival_grace = positive(
        raw.arrival_grace,
        defaults::ARRIVAL_GRACE,
        &at.key("arrival_grace"),
        problems,
    );
    let abandon_after = positive(
        raw.abandon_after,
        defaults::ABANDON_AFTER,
        &at.key("abandon_after"),
        problems,
    );
    let confirm_within =
        confirm_within(raw.confirm_within, session_ttl, abandon_after, at, problems);
    Timing {
        tick,
        pass_ttl,
        session_ttl,
        arrival_grace,
        abandon_after,
        confirm_within,
    }
}

/// `confirm_within`: more than 0 and no longer than `session_ttl` or
/// `abandon_after` (an unconfirmed place never outlives a confirmed one). The
/// default, [`defaults::CONFIRM_WITHIN`], shrinks to fit those when they are
/// shorter.
fn confirm_within(
    value: Option<DurationText>,
    session_ttl: Duration,
    abandon_after: Duration,
    at: &FieldPath,
    problems: &mut Problems,
) -> Duration {
    let Some(DurationText(value)) = value else {
        return defaults::CONFIRM_WITHIN.min(session_ttl).min(abandon_after);
    };
    let at = at.key("confirm_within");
    if value.is_zero() {
        problems.report(at, "must be more than 0s");
    } else if value > session_ttl || value > abandon_after {
        let (name, limit) = if value > session_ttl {
            ("session_ttl", session_ttl)
        } else {
            ("abandon_after", abandon_after)
        };
        problems.report(
            at,
            format!(
                "{} is longer than {name} {}: an unconfirmed place must not outlive a confirmed one",
                show(value),
                show(limit)
            ),
        );
    }
    value
}

/// `opens_at` and `closes_at` (DESIGN §8.7): RFC 3339 instants with an
/// offset, `closes_at` after `opens_at`. `None` when either is wrong.
pub(super) fn opening(
    opens_at: Option<String>,
    closes_at: Option<String>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<(Option<Timestamp>, Option<Timestamp>)> {
    let mut read = |text: Option<String>, field: &str| match text {
        None => Some(None),
        Some(text) => match Timestamp::parse(&text) {
            Ok(t) => Some(Some(t)),
            Err(why) => {
                problems.report(at.key(field), why);
                None
            }
        },
    };
    let opens = read(opens_at, "opens_at");
    let closes = read(closes_at, "closes_at");
    let (opens, closes) = (opens?, closes?);
    if let (Some(opens), Some(closes)) = (opens, closes) {
        if closes.unix_us() <= opens.unix_us() {
            problems.report(
                at.key("closes_at"),
                format!(
                    "{} is not after opens_at {}: the route would never open",
                    closes.rfc3339(),
                    opens.rfc3339()
                ),
            );
            return None;
        }
    }
    Some((opens, closes))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{message_at, parse, problem_paths};
    use crate::config::ClientLimits;

    #[test]
    fn a_session_must_outlive_its_pass() {
        let message = message_at(
            "routes: [{ name: a, match: { path_prefix: /a }, capacity: 1, session_ttl: 30s, pass_ttl: 1m }]\n",
            "routes[0].session_ttl",
        );
        assert!(
            message.starts_with("30s is shorter than pass_ttl 1m"),
            "{message}"
        );
    }

    #[test]
    fn confirm_within_and_client_limits_default_and_are_checked() {
        let route = |extra: &str| {
            format!("routes: [{{ name: a, match: {{ path_prefix: /a }}, capacity: 1{extra} }}]\n")
        };
        let config = parse(&route("")).unwrap();
        assert_eq!(config.routes[0].confirm_within, Duration::from_secs(30));
        assert_eq!(config.routes[0].client_limits, ClientLimits::default());
        // The default shrinks to fit a shorter abandon_after.
        let config = parse(&route(", abandon_after: 10s")).unwrap();
        assert_eq!(config.routes[0].confirm_within, Duration::from_secs(10));
        let config = parse(&route(
            ", confirm_within: 5s, client_limits: { places: 0, joins_per_minute: 7 }",
        ))
        .unwrap();
        assert_eq!(config.routes[0].confirm_within, Duration::from_secs(5));
        assert_eq!(
            config.routes[0].client_limits,
            ClientLimits {
                places: 0,
                joins_per_minute: 7
            }
        );
        for bad in [
            ", confirm_within: 0s",
            ", confirm_within: 31s",
            ", confirm_within: 5m, abandon_after: 10m, session_ttl: 4m",
        ] {
            let errors = parse(&route(bad)).unwrap_err();
            let paths: Vec<&str> = errors.errors.iter().map(|e| e.path.as_str()).collect();
            assert_eq!(paths, ["routes[0].confirm_within"], "{bad}");
        }
        let errors = parse(&route(", client_limits: { place: 3 }")).unwrap_err();
        assert!(errors.to_string().contains("place"), "{errors}");
    }

    #[test]
    fn opening_times_are_rfc3339_with_an_offset_and_close_after_opening() {
        let route = |extra: &str| {
            format!("routes: [{{ name: a, match: {{ path_prefix: /a }}, capacity: 1{extra} }}]\n")
        };
        let config = parse(&route("")).unwrap();
        assert_eq!(config.routes[0].opens_at, None);
        assert_eq!(config.routes[0].closes_at, None);
        let config = parse(&route(
            ", opens_at: 2026-12-24T10:00:00+09:00, closes_at: '2026-12-24T02:00:00Z'",
        ))
        .unwrap();
        let opens = config.routes[0].opens_at.unwrap();
        assert_eq!(opens.unix_us(), 1_798_074_000_000_000);
        assert_eq!(opens.rfc3339(), "2026-12-24T10:00:00+09:00");
        assert_eq!(
            config.routes[0].closes_at.unwrap().unix_us(),
            1_798_077_600_000_000
        );
        for bad in [
            "2026-12-24 10:00",
            "2026-12-24T10:00:00",
            "tomorrow",
            "1969-12-31T23:59:59Z",
        ] {
            assert_eq!(
                problem_paths(&route(&format!(", opens_at: '{bad}'"))),
                ["routes[0].opens_at"],
                "{bad}"
            );
        }
        let message = message_at(
            &route(", opens_at: 2026-12-24T10:00:00+09:00, closes_at: 2026-12-24T01:00:00Z"),
            "routes[0].closes_at",
        );
        assert!(message.contains("not after opens_at"), "{message}");
        assert_eq!(
            problem_paths(&route(", opens_at: 12"))
                .into_iter()
                .filter(|p| p.contains("opens_at"))
                .count(),
            1
        );
    }
}
