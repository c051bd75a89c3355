//! Raw → typed: fills in the documented defaults and checks every value and
//! every rule between values, recording all problems rather than the first,
//! and warnings about a valid config an operator likely did not mean.
//!
//! Each section of the file is read by its own file here, which holds the
//! rules of that section: `listen` (and `admin`), `limits` (and
//! `client_ip`), `upstream`, `store`, `keys` (and `cookie`), `paths`
//! (`reserved_prefix`, `bypass`) and `routes`, a route's parts in `matcher`,
//! `timing`, `line`, `lanes` and `inflight`; the micro-cache of a route or a bypass
//! rule, and the process's budget for them, in `cache`. Reading one field (required, a duration
//! and its bounds) is `field`'s. The rules between sections are below.

mod cache;
mod field;
mod inflight;
mod keys;
mod lanes;
mod limits;
mod line;
mod listen;
mod matcher;
mod paths;
mod routes;
mod store;
mod timing;
mod upstream;

pub(crate) use lanes::lanes_from_code;

use keys::{admin_tokens, cookie, keys};
use limits::{client_ip, limits};
use listen::{admin, admin_is_not_a_listener, admin_off_loopback_needs_a_token, listen};
use paths::{bypass, reserved_prefix};
use routes::routes;
use store::store;
use upstream::upstream;

use super::error::FieldPath;
use super::problems::Problems;
use super::raw::RawConfig;
use super::{Config, Route, ServerLimits, Upstream};

/// Builds the typed config, or records why it cannot (then `None`).
pub(crate) fn validate(raw: RawConfig, problems: &mut Problems) -> Option<Config> {
    let root = FieldPath::root();
    let listen = listen(raw.listen, &root.key("listen"), problems);
    let raw_admin = raw.admin.unwrap_or_default();
    let tokens = admin_tokens(
        raw_admin.token,
        raw_admin.tokens,
        &root.key("admin"),
        problems,
    );
    let admin = admin(raw_admin.addr.map(|a| a.0), tokens.unwrap_or_default());
    if let (Some(listen), Some(admin)) = (&listen, &admin) {
        admin_is_not_a_listener(listen, admin, &root.key("admin").key("addr"), problems);
    }
    if let Some(admin) = &admin {
        admin_off_loopback_needs_a_token(admin, &root.key("admin"), problems);
    }
    let limits = limits(
        raw.limits.unwrap_or_default(),
        &root.key("limits"),
        problems,
    );
    let client_ip = client_ip(
        raw.client_ip.unwrap_or_default(),
        &root.key("client_ip"),
        problems,
    );
    let upstream = upstream(raw.upstream, &root.key("upstream"), problems);
    let store = store(raw.store.unwrap_or_default(), &root.key("store"), problems);
    let keys = keys(raw.keys, &root.key("keys"), problems);
    let cookie = cookie(
        raw.cookie.and_then(|cookie| cookie.domain),
        &root.key("cookie").key("domain"),
        problems,
    );
    let reserved_prefix =
        reserved_prefix(raw.reserved_prefix, &root.key("reserved_prefix"), problems);
    let bypass = bypass(
        raw.bypass.unwrap_or_default(),
        &root.key("bypass"),
        problems,
    );
    let routes = routes(
        raw.routes.unwrap_or_default(),
        reserved_prefix.as_deref(),
        &root.key("routes"),
        problems,
    );

    if let (Some(upstream), Some(routes)) = (&upstream, &routes) {
        host_routes_need_the_client_host(upstream, routes, &root, problems);
    }

    if let Some(routes) = &routes {
        host_routes_need_allowed_hosts(&limits, routes, &root, problems);
    }

    if let (Some(bypass), Some(routes)) = (&bypass, &routes) {
        cache::bodies_fit_the_budget(limits.cache_bytes, bypass, routes, &root, problems);
    }

    if !problems.is_empty() {
        return None;
    }
    Some(Config {
        listen: listen?,
        admin,
        limits,
        client_ip,
        upstream: upstream?,
        store: store?,
        keys: keys?,
        cookie: cookie?,
        reserved_prefix: reserved_prefix?,
        bypass: bypass?,
        routes: routes?,
    })
}

/// With `upstream.host` set, the origin sees that host, not the client's:
/// a route matching on `match.host` would let any host reach its pages,
/// unless the origin picks the site from `X-Forwarded-Host`.
fn host_routes_need_the_client_host(
    upstream: &Upstream,
    routes: &[Route],
    root: &FieldPath,
    problems: &mut Problems,
) {
    if upstream.host.is_none() || upstream.origin_reads_forwarded_host {
        return;
    }
    for (i, route) in routes.iter().enumerate() {
        if route.matcher.host.is_some() {
            problems.report(
                root.key("routes").index(i).key("match").key("host"),
                "with upstream.host set the origin never sees the client's host, so \
                 any host reaches these pages: remove match.host, or set \
                 upstream.origin_reads_forwarded_host: true if the origin picks the \
                 site from X-Forwarded-Host",
            );
        }
    }
}

/// A route that matches on `match.host` gates that host only: with
/// `limits.allowed_hosts` empty, a request for any other host (or an
/// HTTP/1.0 request naming none, sent on with the upstream's authority as
/// its `Host`) reaches the origin ungated, and an origin whose default site
/// is the gated one serves it. Valid, and sometimes meant, so a warning.
fn host_routes_need_allowed_hosts(
    limits: &ServerLimits,
    routes: &[Route],
    root: &FieldPath,
    problems: &mut Problems,
) {
    if !limits.allowed_hosts.is_empty() {
        return;
    }
    for (i, route) in routes.iter().enumerate() {
        if route.matcher.host.is_some() {
            problems.warn(
                root.key("routes").index(i).key("match").key("host"),
                "limits.allowed_hosts is empty, so requests for any other host (and \
                 HTTP/1.0 requests without Host) reach the origin ungated, and an origin \
                 whose default site is this one serves them: set limits.allowed_hosts to \
                 the hosts served, and the rest are answered 421",
            );
        }
    }
}

/// What the tests of every section share: a config made of a base and the
/// section under test, and the problems or warnings it gives.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::defaults::ADMIN_ADDR as DEFAULT_ADMIN_ADDR;
    use crate::config::{Admin, ConfigErrors, ConfigWarning};

    const BASE: &str = "\
listen: [{ addr: 127.0.0.1:8080 }]
upstream: { url: http://127.0.0.1:3000 }
keys: [{ id: k1, env: QUEUEGATE_KEY_K1 }]
";

    pub(super) fn parse(extra: &str) -> Result<Config, ConfigErrors> {
        Config::from_yaml(&format!("{BASE}{extra}"))
    }

    /// The paths of the problems `extra` causes, in file order.
    pub(super) fn problem_paths(extra: &str) -> Vec<String> {
        match parse(extra) {
            Ok(config) => panic!("expected problems, got {config:?}"),
            Err(errors) => errors.errors.into_iter().map(|e| e.path).collect(),
        }
    }

    /// The warnings about the valid config `extra` makes.
    pub(super) fn warnings(extra: &str) -> Vec<ConfigWarning> {
        match Config::from_yaml_with_warnings(&format!("{BASE}{extra}")) {
            Ok(loaded) => loaded.warnings,
            Err(errors) => panic!("expected a valid config: {errors}"),
        }
    }

    pub(super) fn message_at(extra: &str, path: &str) -> String {
        let errors = parse(extra).expect_err("expected problems");
        match errors.at(path) {
            Some(error) => error.message.clone(),
            None => panic!("no problem at {path}: {errors}"),
        }
    }

    #[test]
    fn at_least_one_key_and_one_listener_are_required() {
        let errors =
            Config::from_yaml("listen: []\nupstream: { url: http://a:1 }\nkeys: []\n").unwrap_err();
        let paths: Vec<&str> = errors.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["listen", "keys"]);
    }

    #[test]
    fn admin_defaults_to_loopback_and_must_not_share_a_listener() {
        assert_eq!(
            parse("").unwrap().admin,
            Some(Admin {
                addr: DEFAULT_ADMIN_ADDR,
                tokens: Vec::new(),
            })
        );
        assert_eq!(
            parse("admin: {}\n").unwrap().admin,
            Some(Admin {
                addr: DEFAULT_ADMIN_ADDR,
                tokens: Vec::new(),
            })
        );
        assert_eq!(
            problem_paths("admin: { addr: 127.0.0.1:8080 }\n"),
            ["admin.addr"]
        );
    }

    #[test]
    fn admin_tokens_are_named_and_read_like_keys() {
        let admin = parse(
            "admin:\n  token: { env: QG_ADMIN }\n  tokens:\n    - { id: ops, file: /run/ops }\n",
        )
        .unwrap()
        .admin
        .unwrap();
        let names: Vec<&str> = admin.tokens.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(names, ["admin", "ops"]);
        assert_eq!(
            admin.tokens[0].from,
            crate::config::KeyFrom::Env("QG_ADMIN".into())
        );
        assert_eq!(
            problem_paths(
                "admin:\n  token: { id: x, env: A }\n  tokens:\n    - { id: admin, env: B }\n    - { env: C }\n    - { id: d, env: D, file: /d }\n"
            ),
            [
                "admin.token.id",
                "admin.tokens[0].id",
                "admin.tokens[1].id",
                "admin.tokens[2]"
            ]
        );
    }

    #[test]
    fn an_admin_listener_off_loopback_without_a_token_is_warned_about() {
        let found = warnings("admin: { addr: 0.0.0.0:9901 }\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, "admin.addr");
        assert!(found[0].message.contains("admin.token"), "{found:?}");
        assert!(warnings("admin: { addr: 0.0.0.0:9901, token: { env: T } }\n").is_empty());
        assert!(warnings("admin: { addr: \"[::1]:9901\" }\n").is_empty());
    }

    #[test]
    fn a_host_route_without_allowed_hosts_is_warned_about() {
        let found = warnings(
            "routes:\n  - { name: a, match: { path_prefix: /a }, capacity: 1 }\n  - name: b\n    match: { host: shop.example, path_prefix: /b }\n    capacity: 1\n",
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, "routes[1].match.host");
        assert_eq!(found[0].line, Some(7));
        for words in [
            "other host",
            "HTTP/1.0",
            "ungated",
            "limits.allowed_hosts",
            "421",
        ] {
            assert!(found[0].message.contains(words), "{words}: {}", found[0]);
        }
    }

    #[test]
    fn every_host_route_is_warned_about_in_file_order() {
        let found = warnings(
            "routes:\n  - { name: a, match: { host: a.example }, capacity: 1 }\n  - { name: b, match: { host: b.example }, capacity: 1 }\n",
        );
        let paths: Vec<&str> = found.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(paths, ["routes[0].match.host", "routes[1].match.host"]);
    }

    #[test]
    fn allowed_hosts_silence_the_host_route_warning() {
        let found = warnings(
            "limits: { allowed_hosts: [shop.example] }\nroutes: [{ name: a, match: { host: shop.example }, capacity: 1 }]\n",
        );
        assert_eq!(found, []);
    }

    #[test]
    fn routes_without_a_host_are_not_warned_about() {
        assert_eq!(warnings(""), []);
        let found =
            warnings("routes: [{ name: a, match: { path_prefix: /tickets }, capacity: 1 }]\n");
        assert_eq!(found, []);
    }

    #[test]
    fn an_invalid_config_reports_errors_not_warnings() {
        let errors = parse("routes: [{ name: a, match: { host: shop.example }, capacity: 0 }]\n")
            .expect_err("capacity 0 is invalid");
        assert!(errors.at("routes[0].match.host").is_none(), "{errors}");
    }
}
