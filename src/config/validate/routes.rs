//! `routes`: each route read section by section (its `match`, times, line,
//! lanes, opening; what a waiting visitor is answered; when a session ends;
//! its page), and the rules between routes.

use std::collections::HashMap;

use super::cache::cache;
use super::field::{file_path, required};
use super::{inflight, lanes, line, matcher, timing};
use crate::config::defaults;
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::{RawPage, RawRoute};
use crate::config::{is_route_name, PageConfig, PageTemplate, Route, MAX_ROUTE_NAME_LEN};

/// `routes`: each route, then the rules between them: names unique, none
/// hidden by an earlier one, none inside `reserved_prefix`.
pub(super) fn routes(
    raw: Vec<RawRoute>,
    reserved_prefix: Option<&str>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<Vec<Route>> {
    let mut routes: Vec<Option<Route>> = Vec::new();
    let mut names: HashMap<String, usize> = HashMap::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let at = at.index(i);
        let route = route(raw, &at, problems);
        if let Some(route) = &route {
            if let Some(j) = names.insert(route.name.clone(), i) {
                problems.report(
                    at.key("name"),
                    format!("route name {:?} is also routes[{j}].name", route.name),
                );
            }
            if let Some(j) = routes.iter().position(|earlier| {
                earlier
                    .as_ref()
                    .is_some_and(|e| matcher::covers(&e.matcher, &route.matcher))
            }) {
                problems.report(
                    at.key("match"),
                    format!("never used: routes[{j}] matches every request this route matches, and comes first"),
                );
            }
            if let (Some(reserved), Some(prefix)) = (reserved_prefix, &route.matcher.path_prefix) {
                if crate::path::prefix_matches(prefix, reserved) {
                    problems.report(
                        at.key("match").key("path_prefix"),
                        format!("{prefix} is inside reserved_prefix {reserved}, which queuegate serves itself"),
                    );
                }
            }
        }
        routes.push(route);
    }
    routes.into_iter().collect()
}

/// One route, each part read by the file that holds its rules. Problems
/// are found in this order, which is their order on one line (a route
/// written as a flow mapping, `- { name: a, ... }`).
fn route(mut raw: RawRoute, at: &FieldPath, problems: &mut Problems) -> Option<Route> {
    let name = route_name(raw.name.clone(), at, problems);
    let matcher = matcher::matcher(raw.matcher.as_ref(), at, problems);
    let capacity = line::capacity(raw.capacity.take(), raw.adapt_every, at, problems);
    let max_admit_per_tick = line::max_admit_per_tick(raw.max_admit_per_tick, at, problems);
    let timing = timing::timing(&raw, at, problems);
    let max_waiting = raw.max_waiting.unwrap_or(defaults::MAX_WAITING);
    let client_limits = line::client_limits(raw.client_limits, max_waiting, at, problems);
    let waiting_status = waiting_status(raw.waiting_status, at, problems);
    let exit_paths = exit_paths(raw.exit_paths.unwrap_or_default(), at, problems);
    let max_requests_per_session =
        max_requests_per_session(raw.max_requests_per_session, at, problems);
    let lanes = lanes::lanes(raw.lanes, at, problems);
    let opening = timing::opening(raw.opens_at, raw.closes_at, at, problems);
    let shards = line::shards(raw.shards, at, problems);
    let (max_inflight, inflight_wait) =
        inflight::inflight(raw.max_inflight, raw.inflight_wait, at, problems);
    let page = page(raw.page.unwrap_or_default(), at, problems);
    let cache = cache(raw.cache, &at.key("cache"), problems);
    Some(Route {
        name: name?,
        matcher: matcher?,
        capacity: capacity.as_ref()?.0,
        adapt: capacity?.1,
        max_admit_per_tick,
        tick: timing.tick,
        session_ttl: timing.session_ttl,
        pass_ttl: timing.pass_ttl,
        arrival_grace: timing.arrival_grace,
        abandon_after: timing.abandon_after,
        max_waiting,
        confirm_within: timing.confirm_within,
        client_limits,
        waiting_status: waiting_status?,
        mode: raw.mode.unwrap_or(defaults::MODE),
        on_store_error: raw.on_store_error.unwrap_or(defaults::ON_STORE_ERROR),
        exit_paths: exit_paths?,
        max_requests_per_session,
        lanes: lanes?,
        opens_at: opening?.0,
        closes_at: opening?.1,
        shards,
        max_inflight,
        inflight_wait,
        page: page?,
        cache: cache?,
    })
}

/// `name`: required, see [`is_route_name`].
fn route_name(raw: Option<String>, at: &FieldPath, problems: &mut Problems) -> Option<String> {
    required(raw, &at.key("name"), problems).filter(|name| {
        if is_route_name(name) {
            true
        } else {
            problems.report(
                at.key("name"),
                format!(
                    "invalid route name {name:?}: use 1 to {MAX_ROUTE_NAME_LEN} of A-Z a-z 0-9 _ -"
                ),
            );
            false
        }
    })
}

/// `waiting_status`: an HTTP error status, 400 to 599.
fn waiting_status(
    raw: Option<u16>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<http::StatusCode> {
    let waiting_status = raw.unwrap_or(defaults::WAITING_STATUS);
    match http::StatusCode::from_u16(waiting_status) {
        Ok(status) if (400..=599).contains(&waiting_status) => Some(status),
        _ => {
            problems.report(
                at.key("waiting_status"),
                format!(
                    "{waiting_status} is not an HTTP error status: use 400 to 599, e.g. 503 or 429"
                ),
            );
            None
        }
    }
}

/// `exit_paths`: absolute paths, normalised as `match.path_prefix` is so a
/// request path compares with them under the same rule.
fn exit_paths(raw: Vec<String>, at: &FieldPath, problems: &mut Problems) -> Option<Vec<String>> {
    let at = at.key("exit_paths");
    let mut paths = Vec::with_capacity(raw.len());
    for (i, path) in raw.into_iter().enumerate() {
        match matcher::normalise_prefix(&path) {
            Ok(path) => paths.push(Some(path)),
            Err(why) => {
                problems.report(at.index(i), format!("invalid exit path {path:?}: {why}"));
                paths.push(None);
            }
        }
    }
    paths.into_iter().collect()
}

/// `max_requests_per_session`: at least 1, or left out for no limit.
fn max_requests_per_session(
    raw: Option<u64>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<u64> {
    if raw == Some(0) {
        problems.report(
            at.key("max_requests_per_session"),
            "must be at least 1 (1 lets each session make one request); leave it out for no limit",
        );
    }
    raw.filter(|&n| n > 0)
}

/// `page`: title and message as written; a template file read and checked
/// now (see [`PageTemplate::load`]).
fn page(raw: RawPage, at: &FieldPath, problems: &mut Problems) -> Option<PageConfig> {
    let at = at.key("page").key("template");
    let template = match raw.template {
        None => Some(None),
        Some(path) => {
            file_path(path, &at, problems).and_then(|path| match PageTemplate::load(&path) {
                Ok(template) => Some(Some(template)),
                Err(why) => {
                    problems.report(at.clone(), why);
                    None
                }
            })
        }
    };
    Some(PageConfig {
        title: raw.title,
        message: raw.message,
        template: template?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{parse, problem_paths};

    #[test]
    fn route_names_are_unique_and_cookie_safe() {
        let paths = problem_paths(
            "routes:\n  - { name: a, match: { path_prefix: /a }, capacity: 1 }\n  - { name: a, match: { path_prefix: /b }, capacity: 1 }\n  - { name: 'c.d', match: { path_prefix: /c }, capacity: 1 }\n  - { name: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, match: { path_prefix: /d }, capacity: 1 }\n",
        );
        assert_eq!(
            paths,
            ["routes[1].name", "routes[2].name", "routes[3].name"]
        );
    }

    #[test]
    fn a_route_inside_the_reserved_prefix_is_rejected() {
        let paths = problem_paths(
            "routes: [{ name: a, match: { path_prefix: /__queuegate/x }, capacity: 1 }]\n",
        );
        assert_eq!(paths, ["routes[0].match.path_prefix"]);
        parse("routes: [{ name: a, match: { path_prefix: /__queuegatex }, capacity: 1 }]\n")
            .unwrap();
    }

    #[test]
    fn route_numbers_and_durations_are_bounded() {
        let paths = problem_paths(
            "routes: [{ name: a, match: { path_prefix: /a }, capacity: 0, max_admit_per_tick: 0, tick: 9ms, pass_ttl: 1999ms, arrival_grace: 0s, abandon_after: 0ms, waiting_status: 600 }]\n",
        );
        assert_eq!(
            paths,
            [
                "routes[0].capacity",
                "routes[0].max_admit_per_tick",
                "routes[0].tick",
                "routes[0].pass_ttl",
                "routes[0].arrival_grace",
                "routes[0].abandon_after",
                "routes[0].waiting_status",
            ]
        );
    }

    #[test]
    fn waiting_status_takes_any_error_status() {
        let config = parse(
            "routes: [{ name: a, match: { path_prefix: /a }, capacity: 1, waiting_status: 428 }]\n",
        )
        .unwrap();
        assert_eq!(
            config.routes[0].waiting_status,
            http::StatusCode::PRECONDITION_REQUIRED
        );
        let paths = problem_paths(
            "routes: [{ name: a, match: { path_prefix: /a }, capacity: 1, waiting_status: 302 }]\n",
        );
        assert_eq!(paths, ["routes[0].waiting_status"]);
    }

    #[test]
    fn exit_paths_and_max_requests_default_and_are_checked() {
        let route = |extra: &str| {
            format!("routes: [{{ name: a, match: {{ path_prefix: /a }}, capacity: 1{extra} }}]\n")
        };
        let config = parse(&route("")).unwrap();
        assert!(config.routes[0].exit_paths.is_empty());
        assert_eq!(config.routes[0].max_requests_per_session, None);
        // Exit paths are normalised as route prefixes are.
        let config = parse(&route(
            ", exit_paths: [/checkout//done/, '/a/%64one', /x/./y], max_requests_per_session: 1",
        ))
        .unwrap();
        assert_eq!(
            config.routes[0].exit_paths,
            ["/checkout/done", "/a/done", "/x/y"]
        );
        assert_eq!(config.routes[0].max_requests_per_session, Some(1));
        assert_eq!(
            problem_paths(&route(", max_requests_per_session: 0")),
            ["routes[0].max_requests_per_session"]
        );
        assert_eq!(
            problem_paths(&route(", exit_paths: [/ok, done, '/a?b', '/c%zz']")),
            [
                "routes[0].exit_paths[1]",
                "routes[0].exit_paths[2]",
                "routes[0].exit_paths[3]"
            ]
        );
        let errors = parse(&route(", max_requests_per_session: -1")).unwrap_err();
        assert!(
            errors.to_string().contains("max_requests_per_session"),
            "{errors}"
        );
    }
}
