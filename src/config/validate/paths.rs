//! `reserved_prefix` and `bypass`: the paths queuegate serves itself, and
//! the requests it forwards before any route is considered.

use crate::config::defaults;
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::RawBypass;
use crate::config::{Bypass, BypassRule};

use super::cache::cache;

pub(super) fn reserved_prefix(
    raw: Option<String>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<String> {
    let Some(prefix) = raw else {
        return Some(defaults::RESERVED_PREFIX.to_owned());
    };
    let segments_ok = prefix.strip_prefix('/').is_some_and(|rest| {
        rest.split('/').all(|segment| {
            !segment.is_empty()
                && segment != "."
                && segment != ".."
                && segment
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~'))
        })
    });
    if !segments_ok {
        problems.report(
            at.clone(),
            format!(
                "invalid reserved_prefix {prefix:?}: must start with `/`, have no trailing `/`, \
                 and use only A-Z a-z 0-9 - . _ ~ between slashes, e.g. {}",
                defaults::RESERVED_PREFIX
            ),
        );
        return None;
    }
    Some(prefix)
}

pub(super) fn bypass(
    raw: Vec<RawBypass>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<Vec<Bypass>> {
    let mut rules = Vec::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let at = at.index(i);
        let rule = match (raw.path_prefix, raw.path, raw.method) {
            (Some(prefix), None, None) => {
                request_path(&prefix, &at.key("path_prefix"), problems).map(BypassRule::PathPrefix)
            }
            (None, Some(path), None) => {
                request_path(&path, &at.key("path"), problems).map(BypassRule::Path)
            }
            (None, None, Some(method)) => bypass_method(&method, &at.key("method"), problems),
            _ => {
                problems.report(at.clone(), "give exactly one of path_prefix, path, method");
                None
            }
        };
        let cache = cache(raw.cache, &at.key("cache"), problems);
        rules.push(rule.zip(cache).map(|(rule, cache)| Bypass { rule, cache }));
    }
    rules.into_iter().collect()
}

fn bypass_method(method: &str, at: &FieldPath, problems: &mut Problems) -> Option<BypassRule> {
    match http::Method::from_bytes(method.as_bytes()) {
        Ok(parsed) if !method.chars().any(|c| c.is_ascii_lowercase()) => {
            Some(BypassRule::Method(parsed))
        }
        Ok(_) => {
            problems.report(
                at.clone(),
                format!(
                    "methods are case-sensitive: write {:?}",
                    method.to_ascii_uppercase()
                ),
            );
            None
        }
        Err(_) => {
            problems.report(at.clone(), format!("invalid HTTP method {method:?}"));
            None
        }
    }
}

/// A path as written in a request: starts with `/`, no query or fragment.
fn request_path(path: &str, at: &FieldPath, problems: &mut Problems) -> Option<String> {
    if !path.starts_with('/') {
        problems.report(
            at.clone(),
            format!("invalid path {path:?}: must start with `/`"),
        );
        return None;
    }
    if path
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '?' || c == '#')
    {
        problems.report(
            at.clone(),
            format!("invalid path {path:?}: no spaces, `?` or `#` (paths are matched without the query)"),
        );
        return None;
    }
    Some(path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{parse, problem_paths};
    use crate::config::BypassRule;

    #[test]
    fn bypass_rules_take_exactly_one_condition() {
        let config =
            parse("bypass: [{ path_prefix: /static/ }, { path: /healthz }, { method: OPTIONS }]\n")
                .unwrap();
        assert_eq!(
            config.bypass,
            [
                BypassRule::PathPrefix("/static/".to_owned()),
                BypassRule::Path("/healthz".to_owned()),
                BypassRule::Method(http::Method::OPTIONS),
            ]
        );
        let paths = problem_paths(
            "bypass: [{}, { path: healthz }, { method: 'GE T' }, { path_prefix: /a, path: /b }]\n",
        );
        assert_eq!(
            paths,
            [
                "bypass[0]",
                "bypass[1].path",
                "bypass[2].method",
                "bypass[3]"
            ]
        );
    }

    #[test]
    fn reserved_prefix_is_a_clean_path() {
        assert_eq!(
            parse("reserved_prefix: /_q/wait\n")
                .unwrap()
                .reserved_prefix,
            "/_q/wait"
        );
        for bad in ["_q", "/_q/", "/", "//q", "/q/../r", "/q r"] {
            let text = format!("reserved_prefix: '{bad}'\n");
            assert_eq!(problem_paths(&text), ["reserved_prefix"], "{bad}");
        }
    }
}
