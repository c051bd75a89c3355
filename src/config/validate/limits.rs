//! `limits` and `client_ip`: what one connection and one request may take,
//! which hosts are served, who the client is behind proxies.

use super::cache::cache_bytes;
use super::field::{at_least_one, duration, positive, to_usize};
use crate::config::defaults;
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::{RawClientIp, RawLimits, RawWorkers};
use crate::config::{ClientIp, HostPattern, ServerLimits};

const MAX_HEADER_BYTES_RANGE: std::ops::RangeInclusive<u64> = 1024..=1_048_576;
/// More worker threads than this is a typo, not a machine.
const MAX_WORKERS: u64 = 1024;

pub(super) fn limits(raw: RawLimits, at: &FieldPath, problems: &mut Problems) -> ServerLimits {
    let header_timeout = positive(
        raw.header_timeout,
        defaults::HEADER_TIMEOUT,
        &at.key("header_timeout"),
        problems,
    );
    let max_header_bytes = raw.max_header_bytes.unwrap_or(defaults::MAX_HEADER_BYTES);
    if !MAX_HEADER_BYTES_RANGE.contains(&max_header_bytes) {
        problems.report(
            at.key("max_header_bytes"),
            format!(
                "{max_header_bytes} is out of range: must be between {} and {}",
                MAX_HEADER_BYTES_RANGE.start(),
                MAX_HEADER_BYTES_RANGE.end()
            ),
        );
    }
    let max_connections = at_least_one(
        raw.max_connections.unwrap_or(defaults::MAX_CONNECTIONS),
        &at.key("max_connections"),
        problems,
    );
    let allowed_hosts = allowed_hosts(raw.allowed_hosts, &at.key("allowed_hosts"), problems);
    let workers = workers(raw.workers, &at.key("workers"), problems);
    let cache_bytes = cache_bytes(raw.cache_bytes, &at.key("cache_bytes"), problems);
    ServerLimits {
        header_timeout,
        max_header_bytes: to_usize(max_header_bytes),
        max_connections: to_usize(max_connections),
        drain_timeout: duration(raw.drain_timeout, defaults::DRAIN_TIMEOUT),
        idle_timeout: positive(
            raw.idle_timeout,
            defaults::IDLE_TIMEOUT,
            &at.key("idle_timeout"),
            problems,
        ),
        send_timeout: positive(
            raw.send_timeout,
            defaults::SEND_TIMEOUT,
            &at.key("send_timeout"),
            problems,
        ),
        tunnel_idle_timeout: positive(
            raw.tunnel_idle_timeout,
            defaults::TUNNEL_IDLE_TIMEOUT,
            &at.key("tunnel_idle_timeout"),
            problems,
        ),
        workers,
        ambiguous_paths: raw.ambiguous_paths.unwrap_or(defaults::AMBIGUOUS_PATHS),
        allowed_hosts,
        max_event_streams: to_usize(raw.max_event_streams.unwrap_or(defaults::MAX_EVENT_STREAMS)),
        max_event_streams_per_client: to_usize(
            raw.max_event_streams_per_client
                .unwrap_or(defaults::MAX_EVENT_STREAMS_PER_CLIENT),
        ),
        cache_bytes,
    }
}

/// `limits.allowed_hosts`: names such as `shop.example` or `*.shop.example`.
fn allowed_hosts(
    raw: Option<Vec<String>>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Vec<HostPattern> {
    let mut allowed_hosts = Vec::new();
    for (i, text) in raw.iter().flatten().enumerate() {
        match HostPattern::parse(text) {
            Ok(pattern) => allowed_hosts.push(pattern),
            Err(_) => problems.report(
                at.index(i),
                format!(
                    "invalid host {text:?}: expected a name such as shop.example or *.shop.example"
                ),
            ),
        }
    }
    allowed_hosts
}

/// `limits.workers`: `auto` (`None`) or 1 to [`MAX_WORKERS`] threads.
fn workers(raw: Option<RawWorkers>, at: &FieldPath, problems: &mut Problems) -> Option<usize> {
    match raw {
        None => defaults::WORKERS,
        Some(RawWorkers::Word(word)) if word == "auto" => None,
        Some(RawWorkers::Count(n)) if (1..=MAX_WORKERS).contains(&n) => Some(to_usize(n)),
        Some(RawWorkers::Count(n)) => {
            problems.report(
                at.clone(),
                format!("{n} is out of range: must be `auto` or between 1 and {MAX_WORKERS}"),
            );
            None
        }
        Some(RawWorkers::Word(word)) => {
            problems.report(
                at.clone(),
                format!("`{word}`: must be `auto` or a number of threads"),
            );
            None
        }
    }
}

pub(super) fn client_ip(raw: RawClientIp, at: &FieldPath, problems: &mut Problems) -> ClientIp {
    let mut trusted_proxies = Vec::new();
    for (i, text) in raw.trusted_proxies.unwrap_or_default().iter().enumerate() {
        let net = text
            .parse::<ipnet::IpNet>()
            .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from));
        match net {
            Ok(net) => trusted_proxies.push(net.trunc()),
            Err(_) => problems.report(
                at.key("trusted_proxies").index(i),
                format!("invalid network {text:?}: expected an address or CIDR such as 10.0.0.0/8"),
            ),
        }
    }
    ClientIp { trusted_proxies }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{parse, problem_paths};

    #[test]
    fn event_stream_caps_read_back_and_are_named_when_bad() {
        let config = parse("limits: {}\n").unwrap();
        assert_eq!(
            (
                config.limits.max_event_streams,
                config.limits.max_event_streams_per_client
            ),
            (100_000, 20)
        );
        let config =
            parse("limits: { max_event_streams: 50, max_event_streams_per_client: 0 }\n").unwrap();
        assert_eq!(
            (
                config.limits.max_event_streams,
                config.limits.max_event_streams_per_client
            ),
            (50, 0)
        );
        for bad in ["-1", "many", "2.5"] {
            assert_eq!(
                problem_paths(&format!(
                    "limits: {{ max_event_streams_per_client: {bad} }}\n"
                )),
                ["limits.max_event_streams_per_client"],
                "{bad}"
            );
        }
    }

    #[test]
    fn limits_are_bounded() {
        let paths = problem_paths(
            "limits: { header_timeout: 0s, max_header_bytes: 1023, max_connections: 0, workers: 0 }\n",
        );
        assert_eq!(
            paths,
            [
                "limits.header_timeout",
                "limits.max_header_bytes",
                "limits.max_connections",
                "limits.workers"
            ]
        );
        assert_eq!(
            problem_paths("limits: { workers: many }\n"),
            ["limits.workers"]
        );
        assert_eq!(
            parse("limits: { workers: auto }\n").unwrap().limits.workers,
            None
        );
        assert_eq!(
            parse("limits: { workers: 3 }\n").unwrap().limits.workers,
            Some(3)
        );
        let config = parse("limits: { max_header_bytes: 1048576, drain_timeout: 0s }\n").unwrap();
        assert_eq!(config.limits.max_header_bytes, 1_048_576);
        assert_eq!(config.limits.drain_timeout, Duration::ZERO);
    }

    #[test]
    fn connection_timeouts_read_back_and_must_be_positive() {
        let config =
            parse("limits: { idle_timeout: 5s, send_timeout: 2s, tunnel_idle_timeout: 1m }\n")
                .unwrap();
        assert_eq!(config.limits.idle_timeout, Duration::from_secs(5));
        assert_eq!(config.limits.send_timeout, Duration::from_secs(2));
        assert_eq!(config.limits.tunnel_idle_timeout, Duration::from_secs(60));
        assert_eq!(
            problem_paths(
                "limits: { idle_timeout: 0s, send_timeout: 0ms, tunnel_idle_timeout: 0s }\n"
            ),
            [
                "limits.idle_timeout",
                "limits.send_timeout",
                "limits.tunnel_idle_timeout"
            ]
        );
    }
}
