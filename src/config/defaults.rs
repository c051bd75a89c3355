//! Every default of the config file, written once: validation fills in a
//! field left out with the constant named here, and the typed config's doc
//! comments name the constant rather than repeat its value.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use super::{AmbiguousPaths, Backend, Mode, OnStoreError};

/// `admin.addr`: loopback only.
pub const ADMIN_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9901);

/// `limits.header_timeout`.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// `limits.max_header_bytes`.
pub const MAX_HEADER_BYTES: u64 = 16384;
/// `limits.max_connections`.
pub const MAX_CONNECTIONS: u64 = 10_000;
/// `limits.drain_timeout`.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// `limits.idle_timeout`.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// `limits.send_timeout`.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// `limits.tunnel_idle_timeout`.
pub const TUNNEL_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// `limits.workers`: `auto`, one thread per CPU the process may use.
pub const WORKERS: Option<usize> = None;
/// `limits.ambiguous_paths`: browsers never send such paths.
pub const AMBIGUOUS_PATHS: AmbiguousPaths = AmbiguousPaths::Reject;
/// `limits.max_event_streams`, per route and instance.
pub const MAX_EVENT_STREAMS: u64 = 100_000;
/// `limits.max_event_streams_per_client`, per instance, all routes: as many
/// streams as the places one client may hold on a route by default
/// (`client_limits.places`), so a household or an office can follow each
/// of its places.
pub const MAX_EVENT_STREAMS_PER_CLIENT: u64 = 20;
/// `limits.cache_bytes`: every micro-cache of the process together.
pub const CACHE_BYTES: u64 = 64 << 20;

/// `upstream.connect_timeout`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// `upstream.timeout`.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);
/// `upstream.pool.max_idle_per_host`.
pub const POOL_MAX_IDLE_PER_HOST: u64 = 256;
/// `upstream.pool.idle_timeout`.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// `upstream.origin_reads_forwarded_host`.
pub const ORIGIN_READS_FORWARDED_HOST: bool = false;

/// `store.backend`.
pub const BACKEND: Backend = Backend::Memory;
/// `store.redis.url`, when none of `url`, `cluster`, `sentinel` is given.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
/// `store.redis.timeout`, per call.
pub const REDIS_TIMEOUT: Duration = Duration::from_millis(200);
/// `store.expected_instances`.
pub const EXPECTED_INSTANCES: u64 = 1;

/// `reserved_prefix`.
pub const RESERVED_PREFIX: &str = "/__queuegate";

/// `routes[].match.case_insensitive`.
pub const CASE_INSENSITIVE: bool = false;
/// `routes[].max_admit_per_tick`.
pub const MAX_ADMIT_PER_TICK: u64 = 20;
/// `routes[].tick`.
pub const TICK: Duration = Duration::from_millis(100);
/// `routes[].session_ttl`.
pub const SESSION_TTL: Duration = Duration::from_secs(600);
/// `routes[].pass_ttl`.
pub const PASS_TTL: Duration = Duration::from_secs(60);
/// `routes[].arrival_grace`.
pub const ARRIVAL_GRACE: Duration = Duration::from_secs(60);
/// `routes[].abandon_after`.
pub const ABANDON_AFTER: Duration = Duration::from_secs(30);
/// `routes[].max_waiting`.
pub const MAX_WAITING: u64 = 200_000;
/// `routes[].confirm_within`, or `session_ttl` or `abandon_after` if
/// either is shorter.
pub const CONFIRM_WITHIN: Duration = Duration::from_secs(30);
/// `routes[].client_limits.places`, or a [`CLIENT_PLACES_LINE_DIVISOR`]th
/// of `max_waiting` (at least 1) if that is fewer.
pub const CLIENT_PLACES: u64 = 20;
/// By default one address may hold at most this fraction (one over it) of
/// a short line, so a handful of cookie-less requests cannot fill it for
/// everyone else.
pub const CLIENT_PLACES_LINE_DIVISOR: u64 = 5;
/// `routes[].client_limits.joins_per_minute`.
pub const CLIENT_JOINS_PER_MINUTE: u64 = 120;
/// `routes[].waiting_status`.
pub const WAITING_STATUS: u16 = 503;
/// `routes[].mode`.
pub const MODE: Mode = Mode::Gate;
/// `routes[].on_store_error`.
pub const ON_STORE_ERROR: OnStoreError = OnStoreError::Local;
/// The name of the one lane of a route that names none.
pub const LANE: &str = "main";
/// `routes[].lanes[].weight`.
pub const LANE_WEIGHT: u32 = 1;
/// `routes[].shards`: one line.
pub const SHARDS: u32 = 1;

/// `adapt_every`: the window an adaptive capacity is decided over.
pub const ADAPT_EVERY: Duration = Duration::from_secs(5);

/// `capacity.target.p95`.
pub const TARGET_P95: Duration = Duration::from_secs(1);

/// `capacity.target.errors`: 2 %.
pub const TARGET_ERRORS: f64 = 0.02;

/// `routes[].inflight_wait`.
pub const INFLIGHT_WAIT: Duration = Duration::from_secs(2);
/// `routes[].cache.ttl` (and a bypass rule's): the seat map's second.
pub const CACHE_TTL: Duration = Duration::from_secs(1);
/// `routes[].cache.max_entries`.
pub const CACHE_MAX_ENTRIES: u64 = 200;
/// `routes[].cache.max_body`: larger answers are streamed through.
pub const CACHE_MAX_BODY: u64 = 1 << 20;
