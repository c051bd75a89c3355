//! `store`: the backend, how to reach Redis (one of a URL, a Cluster,
//! Sentinels) and where the memory store keeps its snapshot. A Redis URL is
//! never shown with its password.

use super::field::{at_least_one, positive, required};
use crate::config::defaults;
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::{RawMemory, RawRedis, RawStore};
use crate::config::{Backend, MemoryConfig, RedisConfig, RedisMode, StoreConfig};

pub(super) fn store(raw: RawStore, at: &FieldPath, problems: &mut Problems) -> Option<StoreConfig> {
    let backend = raw.backend.unwrap_or(defaults::BACKEND);
    let redis = redis(raw.redis.unwrap_or_default(), &at.key("redis"), problems);
    let expected_instances = at_least_one(
        raw.expected_instances
            .unwrap_or(defaults::EXPECTED_INSTANCES),
        &at.key("expected_instances"),
        problems,
    );
    let memory = memory(
        raw.memory.unwrap_or_default(),
        backend,
        &at.key("memory"),
        problems,
    );
    Some(StoreConfig {
        backend,
        redis: redis?,
        memory,
        expected_instances,
    })
}

/// `store.memory`: a snapshot file needs the memory backend and a
/// directory that exists (the snapshot is written next to it and renamed
/// over it); the file itself may be missing (a first start).
fn memory(
    raw: RawMemory,
    backend: Backend,
    at: &FieldPath,
    problems: &mut Problems,
) -> MemoryConfig {
    let Some(path) = raw.snapshot else {
        return MemoryConfig::default();
    };
    let at = at.key("snapshot");
    if backend != Backend::Memory {
        problems.report(at, "only used with backend: memory");
        return MemoryConfig::default();
    }
    if path.as_os_str().is_empty() || path.file_name().is_none() {
        problems.report(at, "must name a file, e.g. /var/lib/queuegate/line.json");
        return MemoryConfig::default();
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => std::path::Path::new("."),
    };
    if path.is_dir() {
        problems.report(
            at,
            format!("{} is a directory: name a file in it", path.display()),
        );
    } else if !dir.is_dir() {
        problems.report(
            at,
            format!(
                "directory {} does not exist (create it, writable by queuegate)",
                dir.display()
            ),
        );
    }
    MemoryConfig {
        snapshot: Some(path),
    }
}

fn redis(raw: RawRedis, at: &FieldPath, problems: &mut Problems) -> Option<RedisConfig> {
    let timeout = positive(
        raw.timeout,
        defaults::REDIS_TIMEOUT,
        &at.key("timeout"),
        problems,
    );
    let given: Vec<&str> = [
        raw.url.as_ref().map(|_| "url"),
        raw.cluster.as_ref().map(|_| "cluster"),
        raw.sentinel.as_ref().map(|_| "sentinel"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if given.len() > 1 {
        problems.report(
            at.clone(),
            format!(
                "give exactly one of url, cluster, sentinel (found {})",
                given.join(" and ")
            ),
        );
        return None;
    }
    let mode = if let Some(nodes) = raw.cluster {
        let at = at.key("cluster");
        if nodes.is_empty() {
            problems.report(
                at.clone(),
                "list at least one node, e.g. [redis://10.0.0.1:7000]",
            );
        }
        let valid = redis_urls(&nodes, &at, problems);
        valid.then_some(RedisMode::Cluster { nodes })
    } else if let Some(sentinel) = raw.sentinel {
        let at = at.key("sentinel");
        let master = required(sentinel.master, &at.key("master"), problems);
        if master.as_deref().is_some_and(str::is_empty) {
            problems.report(at.key("master"), "must not be empty");
        }
        let nodes = required(sentinel.nodes, &at.key("nodes"), problems);
        if nodes.as_ref().is_some_and(Vec::is_empty) {
            problems.report(
                at.key("nodes"),
                "list at least one sentinel, e.g. [redis://10.0.0.1:26379]",
            );
        }
        let valid = nodes
            .as_ref()
            .is_some_and(|nodes| redis_urls(nodes, &at.key("nodes"), problems));
        match (master, nodes) {
            (Some(master), Some(nodes)) if valid => Some(RedisMode::Sentinel { master, nodes }),
            _ => None,
        }
    } else {
        let url = raw.url.unwrap_or_else(|| defaults::REDIS_URL.to_owned());
        redis_url(&url, &at.key("url"), problems).then_some(RedisMode::Standalone { url })
    };
    Some(RedisConfig {
        mode: mode?,
        timeout,
    })
}

fn redis_urls(urls: &[String], at: &FieldPath, problems: &mut Problems) -> bool {
    let mut valid = true;
    for (i, url) in urls.iter().enumerate() {
        valid &= redis_url(url, &at.index(i), problems);
    }
    valid
}

/// Checks a Redis URL. Messages show it redacted ([`redact_url`]): a
/// config error ends up in reload logs.
fn redis_url(url: &str, at: &FieldPath, problems: &mut Problems) -> bool {
    let shown = redact_url(url);
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        problems.report(
            at.clone(),
            format!(
                "invalid redis url {shown:?}: expected redis://host:port or rediss://host:port"
            ),
        );
        return false;
    }
    match redis::IntoConnectionInfo::into_connection_info(url) {
        Ok(_) => true,
        Err(err) => {
            let why = redact_secrets_in(&err.to_string(), url);
            problems.report(at.clone(), format!("invalid redis url {shown:?}: {why}"));
            false
        }
    }
}

/// `url` with its password (the userinfo after `:`, or a `password=`
/// query value) replaced by `***`, fit for logs and errors.
fn redact_url(url: &str) -> String {
    let mut out = url.to_owned();
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    if let Some(at) = url[start..end].rfind('@') {
        let userinfo = &url[start..start + at];
        let kept = match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***"),
            None => "***".to_owned(),
        };
        out = format!("{}{}{}", &url[..start], kept, &url[start + at..]);
    }
    if let Some(i) = out.find("password=") {
        let value_start = i + "password=".len();
        let value_end = out[value_start..]
            .find(['&', '#'])
            .map_or(out.len(), |j| value_start + j);
        out.replace_range(value_start..value_end, "***");
    }
    out
}

/// `text` with every secret of `url` (as [`redact_url`] finds them) removed,
/// for messages a library built from the URL.
fn redact_secrets_in(text: &str, url: &str) -> String {
    let mut out = text.replace(url, &redact_url(url));
    let start = url.find("://").map_or(0, |i| i + 3);
    let authority = url[start..].split(['/', '?', '#']).next().unwrap_or("");
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        if let Some((_, password)) = userinfo.split_once(':') {
            if !password.is_empty() {
                out = out.replace(password, "***");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::{parse, problem_paths};
    use super::*;
    use crate::config::defaults::REDIS_URL as DEFAULT_REDIS_URL;
    use std::time::Duration;

    #[test]
    fn a_snapshot_needs_the_memory_store_and_a_directory_that_exists() {
        assert_eq!(parse("").unwrap().store.memory.snapshot, None);
        let dir = std::env::temp_dir().join("line.json");
        let given = format!("store: {{ memory: {{ snapshot: {} }} }}\n", dir.display());
        assert_eq!(parse(&given).unwrap().store.memory.snapshot, Some(dir));
        for bad in [
            "store: { memory: { snapshot: /nonexistent/queuegate/line.json } }\n",
            "store: { memory: { snapshot: \"\" } }\n",
            "store: { memory: { snapshot: / } }\n",
            "store: { backend: redis, memory: { snapshot: /tmp/line.json } }\n",
        ] {
            assert_eq!(problem_paths(bad), ["store.memory.snapshot"], "{bad}");
        }
        assert_eq!(
            problem_paths("store: { memory: { snapshots: /tmp/line.json } }\n"),
            ["store.memory.snapshots"]
        );
    }

    #[test]
    fn redis_takes_exactly_one_topology() {
        let paths = problem_paths(
            "store: { redis: { url: redis://a:1, sentinel: { master: m, nodes: [redis://b:2] } } }\n",
        );
        assert_eq!(paths, ["store.redis"]);
        let paths = problem_paths("store: { redis: { sentinel: { nodes: [] } } }\n");
        assert_eq!(
            paths,
            ["store.redis.sentinel.master", "store.redis.sentinel.nodes"]
        );
        let paths = problem_paths("store: { redis: { cluster: [redis://a:1, 'http://b:2'] } }\n");
        assert_eq!(paths, ["store.redis.cluster[1]"]);
        let config = parse("store: { backend: redis, redis: { timeout: 50ms } }\n").unwrap();
        assert_eq!(
            config.store.redis,
            RedisConfig {
                mode: RedisMode::Standalone {
                    url: DEFAULT_REDIS_URL.to_owned()
                },
                timeout: Duration::from_millis(50),
            }
        );
    }

    #[test]
    fn redis_passwords_never_reach_an_error() {
        assert_eq!(
            redact_url("redis://user:s3cret@cache:6379/0"),
            "redis://user:***@cache:6379/0"
        );
        assert_eq!(redact_url("rediss://:s3cret@cache"), "rediss://:***@cache");
        assert_eq!(redact_url("redis://cache:6379"), "redis://cache:6379");
        assert_eq!(
            redact_url("redis://cache/?password=s3cret&db=1"),
            "redis://cache/?password=***&db=1"
        );
        for url in [
            "redis://user:s3cret@cache:notaport",
            "http://user:s3cret@cache",
            "redis://:s3cret@[::1",
        ] {
            let config = format!("store: {{ backend: redis, redis: {{ url: \"{url}\" }} }}\n");
            let errors = parse(&config).unwrap_err();
            let text = errors.to_string();
            assert!(text.contains("store.redis.url"), "{text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
    }
}
