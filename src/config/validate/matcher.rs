//! A route's `match`: the host and path prefix it fits, normalised as the
//! gate compares them, and whether an earlier route hides it.

use crate::config::defaults;
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::RawMatch;
use crate::config::RouteMatch;

/// `routes[i].match`: required, with a host and/or a path prefix.
pub(super) fn matcher(
    raw: Option<&RawMatch>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<RouteMatch> {
    match raw {
        Some(raw) => route_match(raw, &at.key("match"), problems),
        None => {
            problems.report(
                at.key("match"),
                "required: give host and/or path_prefix, e.g. `match: { path_prefix: /tickets }`",
            );
            None
        }
    }
}

fn route_match(raw: &RawMatch, at: &FieldPath, problems: &mut Problems) -> Option<RouteMatch> {
    if raw.host.is_none() && raw.path_prefix.is_none() {
        problems.report(at.clone(), "give host and/or path_prefix");
        return None;
    }
    let host = match &raw.host {
        None => Some(None),
        Some(host) => route_host(host, &at.key("host"), problems).map(Some),
    };
    let path_prefix = match &raw.path_prefix {
        None => Some(None),
        Some(prefix) => match normalise_prefix(prefix) {
            Ok(prefix) => Some(Some(prefix)),
            Err(why) => {
                problems.report(
                    at.key("path_prefix"),
                    format!("invalid path_prefix {prefix:?}: {why}"),
                );
                None
            }
        },
    };
    Some(RouteMatch {
        host: host?,
        path_prefix: path_prefix?,
        case_insensitive: raw.case_insensitive.unwrap_or(defaults::CASE_INSENSITIVE),
    })
}

fn route_host(host: &str, at: &FieldPath, problems: &mut Problems) -> Option<String> {
    if host.contains(':') && !host.starts_with('[') {
        problems.report(
            at.clone(),
            format!(
                "invalid host {host:?}: hosts are matched without the port, write the name alone"
            ),
        );
        return None;
    }
    match crate::host::canonical(host) {
        Ok(host) => Some(host.into_owned()),
        Err(_) => {
            problems.report(
                at.clone(),
                format!("invalid host {host:?}: expected a name such as shop.example.com"),
            );
            None
        }
    }
}

/// The path prefix as the gate compares it: percent-encoded unreserved
/// characters decoded, other escapes upper-cased, dot segments resolved,
/// repeated slashes collapsed, no trailing slash except for `/` itself.
pub(super) fn normalise_prefix(prefix: &str) -> Result<String, String> {
    if !prefix.starts_with('/') {
        return Err("must start with `/`".to_owned());
    }
    if prefix
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '?' || c == '#')
    {
        return Err("no spaces, `?` or `#` (paths are matched without the query)".to_owned());
    }
    let well_formed = prefix
        .match_indices('%')
        .all(|(at, _)| crate::path::starts_with_escape(&prefix.as_bytes()[at..]));
    if !well_formed {
        return Err("`%` must be followed by two hex digits".to_owned());
    }
    // Normalised exactly as request paths are, so the two always compare.
    let normalized = crate::path::normalize(prefix);
    let trimmed = normalized.trim_end_matches('/');
    Ok(if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.to_owned()
    })
}

/// Whether every request `later` matches is matched by `earlier` already.
pub(super) fn covers(earlier: &RouteMatch, later: &RouteMatch) -> bool {
    let host_covered = match (&earlier.host, &later.host) {
        (None, _) => true,
        (Some(a), Some(b)) => a == b,
        (Some(_), None) => false,
    };
    let path_covered = match (&earlier.path_prefix, &later.path_prefix) {
        (None, _) => true,
        // `/` matches every path.
        (Some(a), None) => a == "/",
        (Some(a), Some(_)) if a == "/" => true,
        // The later route also takes case variants the earlier one lets by.
        (Some(_), Some(_)) if later.case_insensitive && !earlier.case_insensitive => false,
        (Some(a), Some(b)) => {
            let (a, b) = if earlier.case_insensitive {
                (a.to_ascii_lowercase(), b.to_ascii_lowercase())
            } else {
                (a.clone(), b.clone())
            };
            crate::path::prefix_matches(&b, &a)
        }
    };
    host_covered && path_covered
}

#[cfg(test)]
mod tests {
    use super::super::tests::{message_at, parse, problem_paths};
    use super::*;

    #[test]
    fn path_prefixes_are_normalised() {
        assert_eq!(normalise_prefix("/tickets/").as_deref(), Ok("/tickets"));
        assert_eq!(normalise_prefix("/").as_deref(), Ok("/"));
        assert_eq!(normalise_prefix("//").as_deref(), Ok("/"));
        assert_eq!(normalise_prefix("//a///b/").as_deref(), Ok("/a/b"));
        assert_eq!(normalise_prefix("/a/./b/../c").as_deref(), Ok("/a/c"));
        assert_eq!(normalise_prefix("/../a").as_deref(), Ok("/a"));
        assert_eq!(normalise_prefix("/%7euser/%41").as_deref(), Ok("/~user/A"));
        assert_eq!(normalise_prefix("/a%2fb").as_deref(), Ok("/a%2Fb"));
        assert_eq!(normalise_prefix("/caf\u{e9}").as_deref(), Ok("/caf\u{e9}"));
        assert!(normalise_prefix("tickets").is_err());
        assert!(normalise_prefix("/a?b=1").is_err());
        assert!(normalise_prefix("/a%4").is_err());
        assert!(normalise_prefix("/a%zz").is_err());
    }

    #[test]
    fn route_match_needs_host_or_path_prefix() {
        let paths = problem_paths("routes: [{ name: a, match: {}, capacity: 1 }]\n");
        assert_eq!(paths, ["routes[0].match"]);
        let paths = problem_paths("routes: [{ name: a, capacity: 1 }]\n");
        assert_eq!(paths, ["routes[0].match"]);
    }

    #[test]
    fn route_hosts_are_lower_cased_and_have_no_port() {
        let config =
            parse("routes: [{ name: a, match: { host: Shop.Example.COM }, capacity: 1 }]\n")
                .unwrap();
        assert_eq!(
            config.routes[0].matcher.host.as_deref(),
            Some("shop.example.com")
        );
        let message = message_at(
            "routes: [{ name: a, match: { host: 'a.com:8080' }, capacity: 1 }]\n",
            "routes[0].match.host",
        );
        assert!(message.contains("without the port"), "{message}");
    }

    #[test]
    fn a_route_hidden_by_an_earlier_one_is_rejected() {
        let hidden = "routes:\n  - { name: a, match: { path_prefix: /shop }, capacity: 1 }\n  - { name: b, match: { path_prefix: /shop/sale/ }, capacity: 1 }\n";
        assert_eq!(problem_paths(hidden), ["routes[1].match"]);
        let catch_all_first = "routes:\n  - { name: a, match: { path_prefix: / }, capacity: 1 }\n  - { name: b, match: { host: x.com }, capacity: 1 }\n";
        assert_eq!(problem_paths(catch_all_first), ["routes[1].match"]);
        let any_case_first = "routes:\n  - { name: a, match: { path_prefix: /Shop, case_insensitive: true }, capacity: 1 }\n  - { name: b, match: { path_prefix: /shop/x }, capacity: 1 }\n";
        assert_eq!(problem_paths(any_case_first), ["routes[1].match"]);
    }

    #[test]
    fn routes_that_overlap_only_partly_are_accepted() {
        let config = parse(
            "routes:\n  - { name: a, match: { path_prefix: /shop/sale }, capacity: 1 }\n  - { name: b, match: { path_prefix: /shop }, capacity: 1 }\n  - { name: c, match: { host: x.com, path_prefix: /s }, capacity: 1 }\n  - { name: d, match: { path_prefix: /s }, capacity: 1 }\n  - { name: e, match: { path_prefix: /S, case_insensitive: true }, capacity: 1 }\n",
        )
        .unwrap();
        assert_eq!(config.routes.len(), 5);
    }
}
