//! A route's cap on requests in flight to the origin (DESIGN §9.2):
//! `max_inflight` and how long a request beyond it waits, `inflight_wait`.

use std::time::Duration;

use super::field::duration;
use crate::config::defaults;
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::DurationText;

/// `max_inflight`: at least 1, or left out for no cap; and `inflight_wait`,
/// any duration (`0s`: no wait), default [`defaults::INFLIGHT_WAIT`]. A
/// wait given without a cap is valid (the cap may be off for a while) but
/// does nothing: a warning.
pub(super) fn inflight(
    max_inflight: Option<u64>,
    inflight_wait: Option<DurationText>,
    at: &FieldPath,
    problems: &mut Problems,
) -> (Option<u64>, Duration) {
    if max_inflight == Some(0) {
        problems.report(
            at.key("max_inflight"),
            "must be at least 1 (1 lets one request of the route reach the origin at a time); \
             leave it out for no cap",
        );
    }
    if max_inflight.is_none() && inflight_wait.is_some() {
        problems.warn(
            at.key("inflight_wait"),
            "does nothing without max_inflight: no request waits for a turn",
        );
    }
    (
        max_inflight.filter(|&n| n > 0),
        duration(inflight_wait, defaults::INFLIGHT_WAIT),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{parse, problem_paths, warnings};

    fn route(extra: &str) -> String {
        format!("routes: [{{ name: a, match: {{ path_prefix: /a }}, capacity: 1{extra} }}]\n")
    }

    #[test]
    fn max_inflight_is_off_by_default_and_at_least_one_when_given() {
        let config = parse(&route("")).unwrap();
        assert_eq!(config.routes[0].max_inflight, None);
        assert_eq!(config.routes[0].inflight_wait, Duration::from_secs(2));
        let config = parse(&route(", max_inflight: 64, inflight_wait: 0s")).unwrap();
        assert_eq!(config.routes[0].max_inflight, Some(64));
        assert_eq!(config.routes[0].inflight_wait, Duration::ZERO);
        let config = parse(&route(", max_inflight: 1, inflight_wait: 250ms")).unwrap();
        assert_eq!(config.routes[0].inflight_wait, Duration::from_millis(250));
        assert_eq!(
            problem_paths(&route(", max_inflight: 0")),
            ["routes[0].max_inflight"]
        );
        for bad in [", max_inflight: -1", ", max_inflight: many"] {
            let errors = parse(&route(bad)).unwrap_err();
            assert!(errors.to_string().contains("max_inflight"), "{errors}");
        }
        for bad in [
            ", max_inflight: 2, inflight_wait: 2",
            ", inflight_wait: -1s",
        ] {
            let errors = parse(&route(bad)).unwrap_err();
            assert!(errors.to_string().contains("inflight_wait"), "{errors}");
        }
    }

    #[test]
    fn a_wait_without_a_cap_is_warned_about() {
        let found = warnings(&route(", inflight_wait: 5s"));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, "routes[0].inflight_wait");
        assert!(warnings(&route(", max_inflight: 3, inflight_wait: 5s")).is_empty());
    }
}
