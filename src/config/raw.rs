//! Serde structs that mirror the YAML file of DESIGN §5 field for field.
//!
//! Unknown fields are rejected everywhere. Every field is optional here, so
//! a missing field is reported by validation (with the others) rather than
//! stopping deserialization; defaults are filled in there too. Values whose
//! syntax is checked while reading (durations, addresses) have their own
//! types so a bad one is reported at its own field.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::{AmbiguousPaths, Backend, Mode, OnStoreError};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub listen: Option<Vec<RawListen>>,
    pub admin: Option<RawAdmin>,
    pub limits: Option<RawLimits>,
    pub client_ip: Option<RawClientIp>,
    pub upstream: Option<RawUpstream>,
    pub store: Option<RawStore>,
    pub keys: Option<Vec<RawKey>>,
    pub cookie: Option<RawCookie>,
    pub reserved_prefix: Option<String>,
    pub bypass: Option<Vec<RawBypass>>,
    pub routes: Option<Vec<RawRoute>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListen {
    pub addr: Option<Addr>,
    pub tls: Option<RawTls>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub addr: Option<Addr>,
    /// One token, named `admin`: `{ env: NAME }` or `{ file: PATH }`.
    pub token: Option<RawKey>,
    /// Named tokens, like keys: `[{ id: ops, env: NAME }]`.
    pub tokens: Option<Vec<RawKey>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub header_timeout: Option<DurationText>,
    pub max_header_bytes: Option<u64>,
    pub max_connections: Option<u64>,
    pub drain_timeout: Option<DurationText>,
    pub idle_timeout: Option<DurationText>,
    pub send_timeout: Option<DurationText>,
    pub tunnel_idle_timeout: Option<DurationText>,
    pub workers: Option<RawWorkers>,
    pub ambiguous_paths: Option<AmbiguousPaths>,
    pub allowed_hosts: Option<Vec<String>>,
    pub max_event_streams: Option<u64>,
    pub max_event_streams_per_client: Option<u64>,
    pub cache_bytes: Option<ByteSize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClientIp {
    pub trusted_proxies: Option<Vec<String>>,
}

/// `limits.workers`: `auto` or a number of threads.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawWorkers {
    Count(u64),
    Word(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstream {
    pub url: Option<String>,
    pub connect_timeout: Option<DurationText>,
    pub timeout: Option<DurationText>,
    pub pool: Option<RawPool>,
    pub host: Option<String>,
    pub origin_reads_forwarded_host: Option<bool>,
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPool {
    pub max_idle_per_host: Option<u64>,
    pub idle_timeout: Option<DurationText>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStore {
    pub backend: Option<Backend>,
    pub redis: Option<RawRedis>,
    pub memory: Option<RawMemory>,
    pub expected_instances: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMemory {
    pub snapshot: Option<PathBuf>,
}

/// Exactly one of `url`, `cluster`, `sentinel` (checked by validation).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedis {
    pub url: Option<String>,
    pub cluster: Option<Vec<String>>,
    pub sentinel: Option<RawSentinel>,
    pub timeout: Option<DurationText>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSentinel {
    pub master: Option<String>,
    pub nodes: Option<Vec<String>>,
}

/// Exactly one of `env`, `file` (checked by validation).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKey {
    pub id: Option<String>,
    pub env: Option<String>,
    pub file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCookie {
    pub domain: Option<String>,
}

/// Exactly one of `path_prefix`, `path`, `method` (checked by validation).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBypass {
    pub path_prefix: Option<String>,
    pub path: Option<String>,
    pub method: Option<String>,
    pub cache: Option<RawCache>,
}

/// `cache` of a route or a bypass rule (DESIGN §9.3).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCache {
    pub ttl: Option<DurationText>,
    pub max_entries: Option<u64>,
    pub max_body: Option<ByteSize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub name: Option<String>,
    #[serde(rename = "match")]
    pub matcher: Option<RawMatch>,
    pub capacity: Option<RawCapacity>,
    pub adapt_every: Option<DurationText>,
    pub max_admit_per_tick: Option<u64>,
    pub tick: Option<DurationText>,
    pub session_ttl: Option<DurationText>,
    pub pass_ttl: Option<DurationText>,
    pub arrival_grace: Option<DurationText>,
    pub abandon_after: Option<DurationText>,
    pub max_waiting: Option<u64>,
    pub confirm_within: Option<DurationText>,
    pub client_limits: Option<RawClientLimits>,
    pub waiting_status: Option<u16>,
    pub mode: Option<Mode>,
    pub on_store_error: Option<OnStoreError>,
    pub exit_paths: Option<Vec<String>>,
    pub max_requests_per_session: Option<u64>,
    pub lanes: Option<Vec<RawLane>>,
    pub opens_at: Option<String>,
    pub closes_at: Option<String>,
    pub shards: Option<u32>,
    pub max_inflight: Option<u64>,
    pub inflight_wait: Option<DurationText>,
    pub page: Option<RawPage>,
    pub cache: Option<RawCache>,
}

/// A route's `capacity`: a number (fixed) or a range it adapts within
/// (DESIGN §9.1).
#[derive(Debug)]
pub(crate) enum RawCapacity {
    Fixed(u64),
    Range(RawCapacityRange),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCapacityRange {
    pub min: Option<u64>,
    pub max: Option<u64>,
    pub start: Option<u64>,
    pub target: Option<RawTarget>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTarget {
    pub p95: Option<DurationText>,
    pub errors: Option<ShareText>,
}

impl<'de> Deserialize<'de> for RawCapacity {
    /// By hand rather than `untagged`: a mistake inside the range is then
    /// reported at its own field, not as "no variant matched".
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CapacityVisitor;

        impl<'de> Visitor<'de> for CapacityVisitor {
            type Value = RawCapacity;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number, or a range { min, max, start, target: { p95, errors } }")
            }

            fn visit_u64<E: de::Error>(self, n: u64) -> Result<RawCapacity, E> {
                Ok(RawCapacity::Fixed(n))
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> Result<RawCapacity, E> {
                u64::try_from(n)
                    .map(RawCapacity::Fixed)
                    .map_err(|_| E::custom(format!("{n}: must be at least 1")))
            }

            fn visit_map<M: de::MapAccess<'de>>(self, map: M) -> Result<RawCapacity, M::Error> {
                RawCapacityRange::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawCapacity::Range)
            }
        }

        deserializer.deserialize_any(CapacityVisitor)
    }
}

/// A share written as a percentage, `2%` or `0.5%`, or as a fraction from 0
/// to 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ShareText(pub f64);

impl ShareText {
    pub(crate) fn parse(text: &str) -> Result<f64, String> {
        let invalid = || format!("invalid share {text:?}: write a percentage such as 2% or 0.5%");
        let number = text.trim().strip_suffix('%').ok_or_else(invalid)?;
        let percent: f64 = number.trim().parse().map_err(|_| invalid())?;
        if !(0.0..=100.0).contains(&percent) {
            return Err(format!("{text:?}: must be from 0% to 100%"));
        }
        Ok(percent / 100.0)
    }
}

impl<'de> Deserialize<'de> for ShareText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ShareVisitor;

        impl Visitor<'_> for ShareVisitor {
            type Value = ShareText;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a percentage such as 2%")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<ShareText, E> {
                ShareText::parse(text).map(ShareText).map_err(E::custom)
            }

            fn visit_f64<E: de::Error>(self, n: f64) -> Result<ShareText, E> {
                if (0.0..=1.0).contains(&n) {
                    Ok(ShareText(n))
                } else {
                    Err(E::custom(format!("{n}: write a percentage such as 2%")))
                }
            }

            fn visit_u64<E: de::Error>(self, n: u64) -> Result<ShareText, E> {
                self.visit_f64(n as f64)
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> Result<ShareText, E> {
                self.visit_f64(n as f64)
            }
        }

        deserializer.deserialize_any(ShareVisitor)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLane {
    pub name: Option<String>,
    pub weight: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClientLimits {
    pub places: Option<u64>,
    pub joins_per_minute: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMatch {
    pub host: Option<String>,
    pub path_prefix: Option<String>,
    pub case_insensitive: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPage {
    pub title: Option<String>,
    pub message: Option<String>,
    pub template: Option<PathBuf>,
}

/// A duration written with its unit: `250us`, `100ms`, `10s`, `5m`, `1h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DurationText(pub Duration);

impl DurationText {
    pub(crate) fn parse(text: &str) -> Result<Duration, String> {
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let invalid = |why: &str| format!("invalid duration {text:?}: {why}");
        if number.is_empty() {
            return Err(invalid(
                "expected a whole number followed by a unit (us, ms, s, m, h), e.g. 10s",
            ));
        }
        let value: u64 = number
            .parse()
            .map_err(|_| invalid("the number is too large"))?;
        let duration = match unit {
            "us" | "µs" => Some(Duration::from_micros(value)),
            "ms" => Some(Duration::from_millis(value)),
            "s" => Some(Duration::from_secs(value)),
            "m" => value.checked_mul(60).map(Duration::from_secs),
            "h" => value.checked_mul(3600).map(Duration::from_secs),
            "" => return Err("durations need a unit, e.g. 10s".to_owned()),
            _ => {
                return Err(invalid(
                    "expected a whole number followed by a unit (us, ms, s, m, h), e.g. 10s",
                ))
            }
        };
        duration.ok_or_else(|| invalid("the number is too large"))
    }
}

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurationVisitor;

        impl Visitor<'_> for DurationVisitor {
            type Value = DurationText;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 100ms, 10s, 5m")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<DurationText, E> {
                DurationText::parse(text)
                    .map(DurationText)
                    .map_err(E::custom)
            }

            fn visit_u64<E: de::Error>(self, _: u64) -> Result<DurationText, E> {
                Err(E::custom("durations need a unit, e.g. 10s"))
            }

            fn visit_i64<E: de::Error>(self, _: i64) -> Result<DurationText, E> {
                Err(E::custom("durations need a unit, e.g. 10s"))
            }

            fn visit_f64<E: de::Error>(self, _: f64) -> Result<DurationText, E> {
                Err(E::custom(
                    "durations need a unit and a whole number, e.g. 1500ms",
                ))
            }
        }

        deserializer.deserialize_any(DurationVisitor)
    }
}

/// A size in bytes: a whole number, alone (bytes) or with a unit: `B`,
/// `KiB`, `MiB`, `GiB` (powers of 1024), as `1MiB` or `64MiB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ByteSize(pub u64);

impl ByteSize {
    pub(crate) fn parse(text: &str) -> Result<u64, String> {
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let invalid = |why: &str| format!("invalid size {text:?}: {why}");
        const HINT: &str =
            "expected a whole number of bytes, or one with a unit (B, KiB, MiB, GiB), e.g. 1MiB";
        if number.is_empty() {
            return Err(invalid(HINT));
        }
        let value: u64 = number
            .parse()
            .map_err(|_| invalid("the number is too large"))?;
        let scale: u64 = match unit.trim_start() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "KB" | "kB" | "MB" | "GB" | "K" | "M" | "G" => {
                return Err(invalid(
                    "write binary units, KiB, MiB or GiB (1MiB is 1048576 bytes)",
                ))
            }
            _ => return Err(invalid(HINT)),
        };
        value
            .checked_mul(scale)
            .ok_or_else(|| invalid("the number is too large"))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;

        impl Visitor<'_> for SizeVisitor {
            type Value = ByteSize;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as 1MiB, 512KiB or 65536")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<ByteSize, E> {
                ByteSize::parse(text).map(ByteSize).map_err(E::custom)
            }

            fn visit_u64<E: de::Error>(self, bytes: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(bytes))
            }

            fn visit_i64<E: de::Error>(self, bytes: i64) -> Result<ByteSize, E> {
                u64::try_from(bytes)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("invalid size {bytes}: must not be negative")))
            }

            fn visit_f64<E: de::Error>(self, _: f64) -> Result<ByteSize, E> {
                Err(E::custom(
                    "sizes are whole numbers, e.g. 1536KiB rather than 1.5MiB",
                ))
            }
        }

        deserializer.deserialize_any(SizeVisitor)
    }
}

/// A socket address written `ip:port` (`[v6]:port` for IPv6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Addr(pub SocketAddr);

impl Addr {
    pub(crate) fn parse(text: &str) -> Result<SocketAddr, String> {
        if let Ok(addr) = text.trim().parse::<SocketAddr>() {
            return Ok(addr);
        }
        let looks_like_host_port = text
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if looks_like_host_port {
            Err(format!(
                "invalid address {text:?}: host names are not resolved here, \
                 write an IP address and port such as 127.0.0.1:8080"
            ))
        } else {
            Err(format!(
                "invalid address {text:?}: expected ip:port such as 0.0.0.0:8080 or [::]:8080"
            ))
        }
    }
}

impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AddrVisitor;

        impl Visitor<'_> for AddrVisitor {
            type Value = Addr;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an address such as 0.0.0.0:8080")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Addr, E> {
                Addr::parse(text).map(Addr).map_err(E::custom)
            }

            fn visit_u64<E: de::Error>(self, port: u64) -> Result<Addr, E> {
                Err(E::custom(format!(
                    "invalid address {port}: expected ip:port such as 0.0.0.0:{port}"
                )))
            }
        }

        deserializer.deserialize_any(AddrVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_each_unit() {
        assert_eq!(DurationText::parse("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(DurationText::parse("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(DurationText::parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(DurationText::parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(DurationText::parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(DurationText::parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn durations_without_unit_are_rejected_with_a_hint() {
        let err = DurationText::parse("10").unwrap_err();
        assert_eq!(err, "durations need a unit, e.g. 10s");
        let err = serde_saphyr::from_str::<DurationText>("10").unwrap_err();
        assert!(err.to_string().contains("durations need a unit"), "{err}");
    }

    #[test]
    fn nonsense_durations_name_the_text() {
        for text in [
            "10 parsecs",
            "ms",
            "1.5s",
            "-3s",
            "10d",
            "99999999999999999999s",
        ] {
            let err = DurationText::parse(text).unwrap_err();
            assert!(
                err.starts_with(&format!("invalid duration {text:?}")),
                "{err}"
            );
        }
        let err = DurationText::parse("18446744073709551615h").unwrap_err();
        assert!(err.contains("too large"), "{err}");
    }

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(ByteSize::parse("65536"), Ok(65536));
        assert_eq!(ByteSize::parse("100B"), Ok(100));
        assert_eq!(ByteSize::parse("512KiB"), Ok(512 * 1024));
        assert_eq!(ByteSize::parse("1MiB"), Ok(1 << 20));
        assert_eq!(ByteSize::parse("64 MiB"), Ok(64 << 20));
        assert_eq!(ByteSize::parse("2GiB"), Ok(2 << 30));
        assert!(ByteSize::parse("1MB").unwrap_err().contains("binary units"));
        for text in ["MiB", "1.5MiB", "-1", "1TiB", "99999999999999999999"] {
            let err = ByteSize::parse(text).unwrap_err();
            assert!(err.starts_with(&format!("invalid size {text:?}")), "{err}");
        }
        assert!(ByteSize::parse("18446744073709551615GiB")
            .unwrap_err()
            .contains("too large"));
        let err = serde_saphyr::from_str::<ByteSize>("1.5").unwrap_err();
        assert!(err.to_string().contains("whole numbers"), "{err}");
    }

    #[test]
    fn addresses_are_ip_and_port() {
        assert_eq!(
            Addr::parse("127.0.0.1:9901"),
            Ok("127.0.0.1:9901".parse().unwrap())
        );
        assert_eq!(Addr::parse("[::1]:80"), Ok("[::1]:80".parse().unwrap()));
        assert!(Addr::parse("localhost:80")
            .unwrap_err()
            .contains("host names are not resolved"));
        assert!(Addr::parse("8080")
            .unwrap_err()
            .contains("expected ip:port"));
        assert!(Addr::parse("1.2.3.4:99999")
            .unwrap_err()
            .contains("expected ip:port"));
    }
}
