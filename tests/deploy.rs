//! The deployment files under `deploy/` and the image's `Dockerfile`: the
//! queuegate configs they embed validate, the ports, keys and timeouts they
//! repeat agree with those configs, and the dashboard and alert rules use
//! only metrics queuegate exports.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use queuegate::config::{Backend, Config, KeyFrom, RedisMode};
use serde_json::Value;

/// Every metric queuegate exports (DESIGN §7).
const METRICS: &[&str] = &[
    "queuegate_waiting",
    "queuegate_active",
    "queuegate_capacity",
    "queuegate_admitted_total",
    "queuegate_rejected_total",
    "queuegate_held_total",
    "queuegate_eta_seconds",
    "queuegate_wait_seconds",
    "queuegate_abandoned_total",
    "queuegate_no_shows_total",
    "queuegate_admission_inversions_total",
    "queuegate_store_errors_total",
    "queuegate_store_breaker_state",
    "queuegate_upstream_request_duration_seconds",
    "queuegate_upstream_errors_total",
    "queuegate_config_reloads_total",
    "queuegate_fail_open_total",
    "queuegate_requests_total",
    "queuegate_connections",
    "queuegate_parked_connections",
    "queuegate_parks_total",
    "queuegate_resumes_total",
];

/// The histograms among [`METRICS`]: queried through their series suffixes.
const HISTOGRAMS: &[&str] = &[
    "queuegate_wait_seconds",
    "queuegate_upstream_request_duration_seconds",
];

/// Where the image looks for its config (Dockerfile `CMD`).
const IMAGE_CONFIG_PATH: &str = "/etc/queuegate/queuegate.yaml";

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|err| panic!("cannot read {path}: {err}"))
}

/// YAML 1.2 scalars, as queuegate's own config reader types them: only
/// `true`/`false` are booleans, `007` and `1_000` are text.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
    }
}

fn yaml(path: &str) -> Value {
    yaml_text(path, &read(path))
}

fn yaml_text(source: &str, text: &str) -> Value {
    serde_saphyr::from_str_with_options(text, yaml_options())
        .unwrap_or_else(|err| panic!("{source}: {err}"))
}

/// Every document of a multi-document YAML file.
fn yaml_documents(path: &str) -> Vec<Value> {
    let text = read(path);
    serde_saphyr::from_multiple_with_options::<Value>(&text, yaml_options())
        .unwrap_or_else(|err| panic!("{path}: {err}"))
        .into_iter()
        .filter(|doc| !doc.is_null())
        .collect()
}

/// `value[k1][k2]…`, failing with the path when a step is missing.
fn at<'a>(value: &'a Value, keys: &[&str]) -> &'a Value {
    keys.iter().fold(value, |v, k| {
        v.get(*k)
            .unwrap_or_else(|| panic!("missing {:?} (looking for {})", k, keys.join(".")))
    })
}

fn text<'a>(value: &'a Value, keys: &[&str]) -> &'a str {
    at(value, keys)
        .as_str()
        .unwrap_or_else(|| panic!("{} is not a string", keys.join(".")))
}

fn list<'a>(value: &'a Value, keys: &[&str]) -> &'a Vec<Value> {
    at(value, keys)
        .as_array()
        .unwrap_or_else(|| panic!("{} is not a list", keys.join(".")))
}

/// The list item whose `name` is `name`.
fn named<'a>(items: &'a [Value], name: &str) -> &'a Value {
    items
        .iter()
        .find(|item| item.get("name").and_then(Value::as_str) == Some(name))
        .unwrap_or_else(|| panic!("no item named {name:?}"))
}

fn validate(source: &str, text: &str) -> Config {
    Config::from_yaml(text)
        .unwrap_or_else(|errors| panic!("the queuegate config in {source} is invalid:\n{errors}"))
}

/// The environment variables the config's key ring reads.
fn key_env_vars(config: &Config) -> Vec<&str> {
    assert!(!config.keys.is_empty());
    config
        .keys
        .iter()
        .map(|key| match &key.from {
            KeyFrom::Env(name) => name.as_str(),
            KeyFrom::File(path) => panic!(
                "key {} is read from {}: the deploy files pass keys by environment",
                key.id,
                path.display()
            ),
        })
        .collect()
}

/// A Compose duration such as `40s` or `1m30s`.
fn compose_duration(text: &str) -> Duration {
    let mut total = Duration::ZERO;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: u64 = number
            .parse()
            .unwrap_or_else(|_| panic!("bad duration {text:?}"));
        number.clear();
        total += match c {
            'h' => Duration::from_secs(n * 3600),
            'm' => Duration::from_secs(n * 60),
            's' => Duration::from_secs(n),
            _ => panic!("unit {c:?} in {text:?} is not handled here"),
        };
    }
    assert!(number.is_empty(), "duration {text:?} lacks a unit");
    total
}

fn admin_port(config: &Config) -> u16 {
    let admin = config.admin.as_ref().expect("an admin listener");
    assert!(
        admin.addr.ip().is_unspecified(),
        "admin listens on {}: probes from outside the container cannot reach it",
        admin.addr
    );
    admin.addr.port()
}

#[test]
fn compose_config_is_valid_and_matches_the_services() {
    let compose = yaml("deploy/docker-compose.yml");
    let config = validate(
        "deploy/docker-compose.yml configs.queuegate",
        text(&compose, &["configs", "queuegate", "content"]),
    );
    let services = at(&compose, &["services"]);
    let service = at(services, &["queuegate"]);

    let mounted = list(service, &["configs"]);
    assert!(
        mounted.iter().any(
            |m| m.get("source").and_then(Value::as_str) == Some("queuegate")
                && m.get("target").and_then(Value::as_str) == Some(IMAGE_CONFIG_PATH)
        ),
        "the queuegate config must be mounted at {IMAGE_CONFIG_PATH}"
    );

    // The origin and the store are services of this file.
    let upstream_host = config.upstream.url.host().expect("upstream host");
    assert!(
        services.get(upstream_host).is_some(),
        "no service {upstream_host}"
    );
    assert_eq!(config.store.backend, Backend::Redis);
    let RedisMode::Standalone { url } = &config.store.redis.mode else {
        panic!("expected a single Redis url");
    };
    let redis_host = url
        .trim_start_matches("redis://")
        .split([':', '/'])
        .next()
        .unwrap_or_default();
    assert!(
        services.get(redis_host).is_some(),
        "no service {redis_host}"
    );

    for var in key_env_vars(&config) {
        let value = text(service, &["environment", var]);
        assert!(
            value.starts_with(&format!("${{{var}:?")),
            "{var} must come from the caller's environment and be required, not {value:?}"
        );
    }

    let ports: Vec<&str> = list(service, &["ports"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let admin = admin_port(&config);
    assert!(ports.contains(&format!("127.0.0.1:{admin}:{admin}").as_str()));
    for listen in &config.listen {
        let port = listen.addr.port();
        assert!(
            ports.iter().any(|p| p.ends_with(&format!(":{port}"))),
            "listen port {port} is not published"
        );
    }

    let grace = compose_duration(text(service, &["stop_grace_period"]));
    assert!(
        grace > config.limits.drain_timeout,
        "stop_grace_period {grace:?} must exceed drain_timeout {:?}",
        config.limits.drain_timeout
    );

    for dependency in ["redis", upstream_host] {
        assert_eq!(
            text(service, &["depends_on", dependency, "condition"]),
            "service_healthy"
        );
    }
}

#[test]
fn kubernetes_config_is_valid_and_matches_the_pod() {
    let path = "deploy/kubernetes/queuegate-sidecar.yaml";
    let docs = yaml_documents(path);
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d.get("kind").and_then(Value::as_str) == Some(k))
            .unwrap_or_else(|| panic!("{path} has no {k}"))
    };
    let config_map = kind("ConfigMap");
    let config = validate(
        &format!("{path} ConfigMap"),
        text(config_map, &["data", "queuegate.yaml"]),
    );
    let secret = kind("Secret");
    let deployment = kind("Deployment");
    let service = kind("Service");

    let pod = at(deployment, &["spec", "template", "spec"]);
    let containers = list(pod, &["containers"]);
    let gate = named(containers, "queuegate");
    let app = named(containers, "app");

    // Upstream is the app container, over the pod's loopback.
    let upstream = &config.upstream.url;
    assert_eq!(upstream.host(), Some("127.0.0.1"));
    let app_port = list(app, &["ports"])[0]["containerPort"].as_u64();
    assert_eq!(upstream.port_u16().map(u64::from), app_port);

    // Container ports are the config's listen and admin ports.
    let ports = list(gate, &["ports"]);
    let port_of = |name: &str| at(named(ports, name), &["containerPort"]).as_u64();
    let admin = admin_port(&config);
    assert_eq!(port_of("admin"), Some(u64::from(admin)));
    assert!(config
        .listen
        .iter()
        .any(|l| Some(u64::from(l.addr.port())) == port_of("http")));

    // Probes: ready from /readyz, alive from /healthz, both on admin.
    for (probe, probe_path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(text(gate, &[probe, "httpGet", "path"]), probe_path);
        assert_eq!(text(gate, &[probe, "httpGet", "port"]), "admin");
    }

    // The key comes from the Secret through the environment.
    let secret_name = text(secret, &["metadata", "name"]);
    let env = list(gate, &["env"]);
    for var in key_env_vars(&config) {
        let from = at(named(env, var), &["valueFrom", "secretKeyRef"]);
        assert_eq!(text(from, &["name"]), secret_name);
        let key = text(from, &["key"]);
        assert!(
            at(secret, &["stringData"]).get(key).is_some(),
            "the Secret has no {key}"
        );
    }

    // The config is mounted as a directory (so edits arrive) at the
    // image's config path.
    let config_map_name = text(config_map, &["metadata", "name"]);
    let volume = list(pod, &["volumes"])
        .iter()
        .find(|v| {
            v.get("configMap")
                .and_then(|c| c.get("name"))
                .and_then(Value::as_str)
                == Some(config_map_name)
        })
        .expect("a volume from the ConfigMap");
    let mount = named(list(gate, &["volumeMounts"]), text(volume, &["name"]));
    assert!(
        mount.get("subPath").is_none(),
        "subPath mounts miss ConfigMap edits"
    );
    assert_eq!(
        Path::new(text(mount, &["mountPath"])).join("queuegate.yaml"),
        Path::new(IMAGE_CONFIG_PATH)
    );

    // Termination leaves room for the preStop pause and the drain.
    let grace = at(pod, &["terminationGracePeriodSeconds"])
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    let pause: u64 = list(gate, &["lifecycle", "preStop", "exec", "command"])
        .iter()
        .filter_map(Value::as_str)
        .filter_map(|arg| arg.parse::<u64>().ok())
        .sum();
    assert!(
        Duration::from_secs(grace) > config.limits.drain_timeout + Duration::from_secs(pause),
        "terminationGracePeriodSeconds {grace} must exceed the preStop pause {pause}s plus drain_timeout {:?}",
        config.limits.drain_timeout
    );

    let security = at(gate, &["securityContext"]);
    assert_eq!(at(security, &["runAsNonRoot"]).as_bool(), Some(true));
    assert_eq!(
        at(security, &["readOnlyRootFilesystem"]).as_bool(),
        Some(true)
    );
    assert_eq!(
        at(security, &["allowPrivilegeEscalation"]).as_bool(),
        Some(false)
    );

    // Several replicas share one line only through Redis.
    let replicas = at(deployment, &["spec", "replicas"]).as_u64().unwrap_or(1);
    if replicas > 1 {
        assert_eq!(config.store.backend, Backend::Redis);
        assert_eq!(config.store.expected_instances, replicas);
    }

    // The Service sends visitors to queuegate, never to the app.
    let service_ports = list(service, &["spec", "ports"]);
    assert!(service_ports
        .iter()
        .all(|p| p.get("targetPort").and_then(Value::as_str) == Some("http")));
}

#[test]
fn image_default_config_is_valid_and_matches_the_dockerfile() {
    let config = validate(
        "deploy/docker/queuegate.yaml",
        &read("deploy/docker/queuegate.yaml"),
    );
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains(&format!(
        "COPY deploy/docker/queuegate.yaml {IMAGE_CONFIG_PATH}"
    )));
    assert!(dockerfile.contains(&format!(r#"CMD ["run", "-c", "{IMAGE_CONFIG_PATH}"]"#)));

    let admin = admin_port(&config);
    assert!(
        dockerfile.contains(&format!("/dev/tcp/127.0.0.1/{admin} ")),
        "the HEALTHCHECK must call the admin port {admin}"
    );
    let exposed: BTreeSet<u16> = dockerfile
        .lines()
        .filter_map(|line| line.strip_prefix("EXPOSE "))
        .flat_map(|ports| ports.split_whitespace())
        .map(|port| port.parse().expect("a numeric EXPOSE port"))
        .collect();
    assert!(exposed.contains(&admin));
    for listen in &config.listen {
        assert!(exposed.contains(&listen.addr.port()));
    }
    key_env_vars(&config);
}

/// Metric names (`queuegate_…` identifiers) in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut from = 0;
    while let Some(found) = text[from..].find("queuegate_") {
        let start = from + found;
        let mut end = start;
        while end < bytes.len() && is_ident(bytes[end]) {
            end += 1;
        }
        if start == 0 || !is_ident(bytes[start - 1]) {
            names.insert(text[start..end].to_owned());
        }
        from = end;
    }
    names
}

/// The exported metric a series name belongs to, if any.
fn exported_metric(series: &str) -> Option<&'static str> {
    if let Some(name) = METRICS.iter().find(|m| **m == series) {
        return Some(name);
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = series.strip_suffix(suffix)?;
        HISTOGRAMS.iter().find(|h| **h == base).copied()
    })
}

fn assert_known(source: &str, names: &BTreeSet<String>) {
    let unknown: Vec<&String> = names
        .iter()
        .filter(|n| exported_metric(n).is_none())
        .collect();
    assert!(
        unknown.is_empty(),
        "{source} uses metrics queuegate does not export: {unknown:?}"
    );
}

fn collect_exprs(panels: &[serde_json::Value], out: &mut Vec<String>) {
    for panel in panels {
        if let Some(targets) = panel.get("targets").and_then(|t| t.as_array()) {
            for target in targets {
                let expr = target["expr"].as_str().expect("every target has an expr");
                out.push(expr.to_owned());
            }
        }
        if let Some(nested) = panel.get("panels").and_then(|p| p.as_array()) {
            collect_exprs(nested, out);
        }
    }
}

#[test]
fn dashboard_parses_and_uses_only_exported_metrics() {
    let path = "deploy/grafana/queuegate-dashboard.json";
    let text = read(path);
    let dashboard: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|err| panic!("{path}: {err}"));

    let inputs = dashboard["__inputs"].as_array().expect("__inputs");
    assert!(inputs
        .iter()
        .any(|i| i["name"] == "DS_PROMETHEUS" && i["pluginId"] == "prometheus"));

    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for panel in panels {
        assert!(
            ids.insert(panel["id"].as_u64().expect("panel id")),
            "duplicate panel id {}",
            panel["id"]
        );
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${DS_PROMETHEUS}",
                "panel {} must use the imported datasource",
                panel["title"]
            );
        }
    }

    let mut exprs = Vec::new();
    collect_exprs(panels, &mut exprs);
    assert!(!exprs.is_empty());
    let used = metric_names(&exprs.join("\n"));
    assert_known(path, &used);
    // Descriptions and variable queries name metrics too.
    assert_known(path, &metric_names(&text));

    let covered: BTreeSet<&str> = used.iter().filter_map(|n| exported_metric(n)).collect();
    let missing: Vec<&&str> = METRICS.iter().filter(|m| !covered.contains(**m)).collect();
    assert!(missing.is_empty(), "{path} shows nothing of {missing:?}");
}

#[test]
fn alert_rules_are_well_formed_and_use_only_exported_metrics() {
    let path = "deploy/prometheus/alerts.yml";
    let rules_file = yaml(path);
    let groups = list(&rules_file, &["groups"]);
    assert!(!groups.is_empty());
    let mut alerts = BTreeSet::new();
    let mut used = BTreeSet::new();
    for group in groups {
        text(group, &["name"]);
        for rule in list(group, &["rules"]) {
            let name = text(rule, &["alert"]);
            assert!(alerts.insert(name.to_owned()), "alert {name} defined twice");
            let expr = text(rule, &["expr"]);
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{name}: expr names no queuegate metric");
            used.extend(names);
            if let Some(wait) = rule.get("for") {
                wait.as_str().expect("`for` is a duration string");
            }
            assert!(
                ["critical", "warning", "info"].contains(&text(rule, &["labels", "severity"])),
                "{name}: severity must be critical, warning or info"
            );
            assert!(!text(rule, &["annotations", "summary"]).is_empty());
            assert!(!text(rule, &["annotations", "description"]).is_empty());
        }
    }
    assert_known(path, &used);

    // The brief's failure modes each have an alert.
    for expected in [
        "QueuegateStoreDown",
        "QueuegateStoreBreakerOpen",
        "QueuegateLineStalled",
        "QueuegateUpstreamErrors",
        "QueuegateConfigReloadFailed",
    ] {
        assert!(alerts.contains(expected), "no alert {expected}");
    }

    // The rule tests exercise real alert names and exported metrics.
    let tests_path = "deploy/prometheus/alerts.test.yml";
    let tests_text = read(tests_path);
    assert_known(tests_path, &metric_names(&tests_text));
    let tests = yaml_text("alerts.test.yml", &tests_text);
    for case in list(&tests, &["tests"]) {
        for check in list(case, &["alert_rule_test"]) {
            let name = text(check, &["alertname"]);
            assert!(
                alerts.contains(name),
                "{tests_path} tests unknown alert {name}"
            );
        }
    }
}

#[test]
fn kubernetes_comments_name_exported_metrics() {
    let path = "deploy/kubernetes/queuegate-sidecar.yaml";
    assert_known(path, &metric_names(&read(path)));
}

#[test]
fn metric_name_scanner_finds_names_and_skips_other_words() {
    let names = metric_names(
        r#"sum(rate(queuegate_held_total{job="queuegate"}[5m])) / queuegate_wait_seconds_bucket x_queuegate_no"#,
    );
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(
        names,
        ["queuegate_held_total", "queuegate_wait_seconds_bucket"]
    );
    assert_eq!(
        exported_metric("queuegate_wait_seconds_bucket"),
        Some("queuegate_wait_seconds")
    );
    assert_eq!(exported_metric("queuegate_held_total_bucket"), None);
    assert_eq!(exported_metric("queuegate_waiting_total"), None);
}
