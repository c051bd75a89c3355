//! The config file as an operator meets it: the shipped example passes,
//! defaults are filled in, and bad files name every bad field with its line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use queuegate::config::{
    Backend, BypassRule, Config, ConfigErrors, KeyFrom, Mode, OnStoreError, RedisMode,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config")
        .join(name)
}

fn load_bad(name: &str) -> ConfigErrors {
    match Config::load(&fixture(name)) {
        Ok(config) => panic!("{name} should be rejected, got {config:?}"),
        Err(errors) => errors,
    }
}

/// `(path, line)` of every problem, in the order reported.
fn places(errors: &ConfigErrors) -> Vec<(&str, Option<usize>)> {
    errors
        .errors
        .iter()
        .map(|error| (error.path.as_str(), error.line))
        .collect()
}

#[test]
fn the_example_config_passes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/queuegate.yaml");
    let config = Config::load(&path).unwrap_or_else(|errors| panic!("{errors}"));
    assert_eq!(config.store.backend, Backend::Memory);
    assert_eq!(config.keys.len(), 1);
    assert_eq!(config.keys[0].id, "k1");
    assert_eq!(
        config.keys[0].from,
        KeyFrom::Env("QUEUEGATE_KEY_K1".to_owned())
    );
    assert_eq!(
        config.bypass,
        [BypassRule::PathPrefix("/static/".to_owned())]
    );
    assert_eq!(config.routes.len(), 1);
    let route = &config.routes[0];
    assert_eq!(route.name, "tickets");
    assert_eq!(route.matcher.path_prefix.as_deref(), Some("/tickets"));
    assert_eq!(route.mode, Mode::Gate);
}

#[test]
fn defaults_are_filled_in() {
    let config = Config::load(&fixture("good/minimal.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        config.admin.map(|admin| admin.addr),
        Some("127.0.0.1:9901".parse().unwrap())
    );
    assert_eq!(config.limits.header_timeout, Duration::from_secs(10));
    assert_eq!(config.limits.max_header_bytes, 16384);
    assert_eq!(config.limits.max_connections, 10_000);
    assert_eq!(config.limits.drain_timeout, Duration::from_secs(30));
    assert_eq!(config.limits.idle_timeout, Duration::from_secs(60));
    assert_eq!(config.limits.send_timeout, Duration::from_secs(30));
    assert_eq!(config.limits.tunnel_idle_timeout, Duration::from_secs(600));
    assert_eq!(config.limits.max_event_streams, 100_000);
    assert_eq!(config.limits.max_event_streams_per_client, 20);
    assert_eq!(config.upstream.connect_timeout, Duration::from_secs(2));
    assert_eq!(config.upstream.timeout, Duration::from_secs(60));
    assert_eq!(config.upstream.pool.max_idle_per_host, 256);
    assert_eq!(config.upstream.pool.idle_timeout, Duration::from_secs(90));
    assert_eq!(config.upstream.host, None);
    assert_eq!(config.store.backend, Backend::Memory);
    assert_eq!(
        config.store.redis.mode,
        RedisMode::Standalone {
            url: "redis://127.0.0.1:6379".to_owned()
        }
    );
    assert_eq!(config.store.redis.timeout, Duration::from_millis(200));
    assert_eq!(config.store.expected_instances, 1);
    assert_eq!(config.cookie.domain, None);
    assert_eq!(config.reserved_prefix, "/__queuegate");
    assert!(config.bypass.is_empty());

    let route = &config.routes[0];
    assert_eq!(route.matcher.path_prefix.as_deref(), Some("/tickets"));
    assert!(!route.matcher.case_insensitive);
    assert_eq!(route.capacity, 100);
    assert_eq!(route.max_admit_per_tick, 20);
    assert_eq!(route.tick, Duration::from_millis(100));
    assert_eq!(route.session_ttl, Duration::from_secs(600));
    assert_eq!(route.pass_ttl, Duration::from_secs(60));
    assert_eq!(route.arrival_grace, Duration::from_secs(60));
    assert_eq!(route.abandon_after, Duration::from_secs(30));
    assert_eq!(route.max_waiting, 200_000);
    assert_eq!(route.waiting_status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(route.mode, Mode::Gate);
    assert_eq!(route.on_store_error, OnStoreError::Local);
    assert_eq!(route.page, Default::default());
}

#[test]
fn a_redis_cluster_section_parses_to_cluster_mode() {
    let config =
        Config::load(&fixture("good/redis_cluster.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.store.backend, Backend::Redis);
    assert_eq!(
        config.store.redis.mode,
        RedisMode::Cluster {
            nodes: vec![
                "redis://10.0.0.1:7000".to_owned(),
                "redis://10.0.0.2:7001".to_owned()
            ]
        }
    );
    assert_eq!(config.store.redis.timeout, Duration::from_millis(150));
    assert_eq!(config.store.expected_instances, 3);
    // The rest of that file: TLS listener, https upstream, both key sources.
    assert!(config.listen[1].tls.is_some());
    assert_eq!(config.upstream.host.as_deref(), Some("shop.example.com"));
    assert_eq!(
        config.keys[1].from,
        KeyFrom::File("/run/secrets/qg_k1".into())
    );
    assert_eq!(config.cookie.domain.as_deref(), Some("example.com"));
    let route = &config.routes[0];
    assert_eq!(route.matcher.host.as_deref(), Some("shop.example.com"));
    assert_eq!(route.matcher.path_prefix.as_deref(), Some("/Sale/~user"));
    assert!(route.matcher.case_insensitive);
    assert_eq!(route.waiting_status, http::StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(route.mode, Mode::QueueAll);
    assert_eq!(route.on_store_error, OnStoreError::Open);
}

#[test]
fn a_redis_sentinel_section_parses_to_sentinel_mode() {
    let config =
        Config::load(&fixture("good/redis_sentinel.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        config.store.redis.mode,
        RedisMode::Sentinel {
            master: "mymaster".to_owned(),
            nodes: vec![
                "redis://10.0.0.1:26379".to_owned(),
                "redis://10.0.0.2:26379".to_owned()
            ]
        }
    );
    assert_eq!(
        config.admin.map(|admin| admin.addr),
        Some("10.1.2.3:9000".parse().unwrap())
    );
    assert_eq!(config.reserved_prefix, "/_wait");
    assert_eq!(config.routes[0].matcher.path_prefix.as_deref(), Some("/"));
}

#[test]
fn anchors_and_merge_keys_read_as_if_written_out() {
    let shared = Config::load(&fixture("good/anchors.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let written_out = Config::from_yaml(
        "listen: [{ addr: 127.0.0.1:8080 }]
upstream: { url: http://127.0.0.1:3000 }
keys: [{ id: k1, env: QUEUEGATE_KEY_K1 }]
routes:
  - { name: tickets, match: { path_prefix: /tickets }, capacity: 100, tick: 2s,
      pass_ttl: 10m, mode: queue_all, client_limits: { places: 4, joins_per_minute: 30 } }
  - { name: merch, match: { path_prefix: /merch }, capacity: 20, tick: 2s,
      pass_ttl: 10m, mode: queue_all, client_limits: { places: 4, joins_per_minute: 30 } }
  - { name: help, match: { path_prefix: /help }, capacity: 5,
      client_limits: { places: 4, joins_per_minute: 30 } }
",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(shared, written_out);
    assert_eq!(shared.routes[1].tick, Duration::from_secs(2));
    assert_eq!(shared.routes[1].mode, Mode::QueueAll);
}

#[test]
fn a_bad_field_shared_by_an_anchor_is_named_where_it_is_used() {
    let errors = Config::from_yaml(
        "listen: [{ addr: 127.0.0.1:8080 }]
upstream: { url: http://127.0.0.1:3000 }
keys: [{ id: k1, env: QUEUEGATE_KEY_K1 }]
routes:
  - &sale
    name: tickets
    match: { path_prefix: /tickets }
    capacity: 100
    tick: 2
  - <<: *sale
    name: merch
    match: { path_prefix: /merch }
",
    )
    .unwrap_err();
    // The first route's line is its own; the second's is where it merges it.
    assert_eq!(
        places(&errors),
        [("routes[0].tick", Some(9)), ("routes[1].tick", Some(10))]
    );
}

#[test]
fn an_unknown_field_is_named_with_its_line() {
    let errors = load_bad("bad/unknown_field.yaml");
    assert_eq!(places(&errors), [("upstream.retries", Some(5))]);
    assert!(errors.errors[0].message.contains("unknown field `retries`"));
}

#[test]
fn bad_durations_are_named_with_their_lines() {
    let errors = load_bad("bad/bad_duration.yaml");
    assert_eq!(
        places(&errors),
        [
            ("routes[1].tick", Some(14)),
            ("routes[1].session_ttl", Some(15))
        ]
    );
    assert_eq!(errors.errors[1].message, "durations need a unit, e.g. 10s");
    let first = errors.to_string();
    assert!(
        first.starts_with("routes[1].tick (line 14): invalid duration \"10 parsecs\": "),
        "{first}"
    );
}

#[test]
fn bad_addresses_are_named_with_their_lines() {
    let errors = load_bad("bad/bad_address.yaml");
    assert_eq!(
        places(&errors),
        [("listen[0].addr", Some(2)), ("admin.addr", Some(3))]
    );
    assert!(errors.errors[0]
        .message
        .contains("host names are not resolved"));
}

#[test]
fn a_missing_upstream_is_reported() {
    let errors = load_bad("bad/missing_upstream.yaml");
    assert_eq!(places(&errors), [("upstream", None)]);
}

#[test]
fn two_problems_in_two_routes_are_both_reported() {
    let errors = load_bad("bad/two_problems.yaml");
    assert_eq!(
        places(&errors),
        [
            ("routes[0].colour", Some(12)),
            ("routes[1].capacity", Some(15))
        ]
    );
    let lines: Vec<String> = errors.to_string().lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[0].starts_with("routes[0].colour (line 12): unknown field `colour`"));
    assert_eq!(lines[1], "routes[1].capacity (line 15): must be at least 1");
}

#[test]
fn every_problem_in_a_file_is_reported_in_file_order() {
    let errors = load_bad("bad/many_problems.yaml");
    assert_eq!(
        places(&errors),
        [
            ("listen[1].addr", Some(3)),
            ("upstream.url", Some(5)),
            ("upstream.timeout", Some(6)),
            ("store.backend", Some(8)),
            ("store.redis", Some(9)),
            ("store.expected_instances", Some(10)),
            ("keys[0]", Some(12)),
            ("keys[1].id", Some(13)),
            ("keys[2].id", Some(14)),
            ("reserved_prefix", Some(15)),
            ("bypass[0]", Some(17)),
            ("bypass[1].method", Some(18)),
            ("routes[0].match.path_prefix", Some(21)),
            ("routes[0].pass_ttl", Some(23)),
            ("routes[0].waiting_status", Some(24)),
            ("routes[1].capacity", Some(25)),
            ("routes[1].match", Some(26)),
            ("routes[1].mode", Some(27)),
            ("routes[1].on_store_error", Some(28)),
            ("routes[2]", Some(29)),
            ("routes[3].tick", Some(33)),
            ("routes[3].page.colour", Some(34)),
        ]
    );
}

#[test]
fn a_syntax_error_is_reported_alone_with_its_line() {
    let errors = load_bad("bad/syntax_error.yaml");
    assert_eq!(places(&errors), [("", Some(5))]);
    assert!(errors.to_string().starts_with("line 5: not valid YAML: "));
}

#[test]
fn an_unreadable_file_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.yaml");
    let errors = Config::load(&missing).unwrap_err();
    assert_eq!(errors.errors.len(), 1);
    assert!(errors.to_string().starts_with("cannot read "), "{errors}");
}

/// `confirm_within`'s default is not a constant: it shrinks to fit a
/// shorter `session_ttl` or `abandon_after` (checked in `config::validate`).
/// What an operator reads about it (the README's table, the commented
/// example) says so.
#[test]
fn confirm_within_default_is_documented_as_it_is_computed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let row = readme
        .lines()
        .find(|line| line.starts_with("| `routes[].confirm_within` |"))
        .expect("the README's settings table has a confirm_within row");
    let example = std::fs::read_to_string(root.join("deploy/queuegate.yaml")).unwrap();
    let start = example
        .find("confirm_within:")
        .expect("the example sets confirm_within");
    let comment: String = example[start..]
        .lines()
        .take_while(|line| !line.trim_start().starts_with("client_limits"))
        .collect();
    for (what, text) in [("README", row), ("deploy/queuegate.yaml", comment.as_str())] {
        for word in ["smallest", "30s", "session_ttl", "abandon_after"] {
            assert!(text.contains(word), "{what} says of confirm_within: {text}");
        }
    }
}
