//! Configuration: the YAML file of DESIGN §5 parsed into serde structs that
//! mirror it (`raw`), then validated into the typed `Config` below. Every
//! problem is reported at once, each with its field path (and line where the
//! YAML parser gives one). A valid config may come with warnings, written
//! the same way, about what an operator likely did not mean.
//!
//! - `node`: YAML text → a node tree with positions (`serde-saphyr`, chosen
//!   there for being maintained and for its spans), read back through serde.
//! - `raw`: serde structs mirroring the YAML, unknown fields rejected.
//! - `document`: node tree → raw structs, every unreadable field recorded.
//! - `validate`: raw → `Config`, defaults filled in, every rule checked;
//!   one file a section of the file (`validate/`).
//! - `defaults`: every default, written once, as a named constant.
//! - `problems`: the problems and warnings found so far, each at its field
//!   path, written out in file order.
//! - `locate`: the line of a field path, from the tree's positions.
//! - `error`: `ConfigError` / `ConfigErrors`, one problem per line;
//!   `ConfigWarning`.
//! - `names`: the names of the config's enums (`Mode`, ...), as serde reads
//!   them, so each name is written once, in the enum's `rename_all`.

pub mod defaults;
mod document;
mod error;
mod locate;
mod names;
mod node;
mod problems;
mod raw;
mod validate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::host::HostPattern;
use serde::Deserialize;

pub use error::{ConfigError, ConfigErrors, ConfigWarning};

impl Config {
    /// Parses and validates a YAML config. A syntax error is reported alone,
    /// with its line; otherwise every problem in the file is reported.
    /// Warnings are dropped: see [`Config::from_yaml_with_warnings`].
    pub fn from_yaml(text: &str) -> Result<Config, ConfigErrors> {
        Config::from_yaml_with_warnings(text).map(|loaded| loaded.config)
    }

    /// [`Config::from_yaml`], keeping the warnings about the valid config
    /// (for `check` to show and `run` to log), in file order.
    pub fn from_yaml_with_warnings(text: &str) -> Result<Loaded, ConfigErrors> {
        let mut problems = problems::Problems::default();
        let document = document::Document::parse(text)?;
        let config = document
            .read(&mut problems)
            .and_then(|raw| validate::validate(raw, &mut problems));
        match config {
            Some(config) if problems.is_empty() => Ok(Loaded {
                config,
                warnings: problems.into_warnings(|path| document.line_of(path)),
            }),
            Some(_) | None => {
                let errors = problems.into_errors(|path| document.line_of(path));
                if errors.errors.is_empty() {
                    // Every path that rejects a config records why; this
                    // only guards against one that forgot to.
                    return Err(ConfigErrors::whole_file(None, "invalid config".to_owned()));
                }
                Err(errors)
            }
        }
    }

    /// Reads `path` and parses it with [`Config::from_yaml`]. A file that
    /// cannot be read is a `ConfigErrors` too.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        Config::load_with_warnings(path).map(|loaded| loaded.config)
    }

    /// [`Config::load`], keeping the warnings as
    /// [`Config::from_yaml_with_warnings`] does.
    pub fn load_with_warnings(path: &Path) -> Result<Loaded, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|err| {
            ConfigErrors::whole_file(None, format!("cannot read {}: {err}", path.display()))
        })?;
        Config::from_yaml_with_warnings(&text)
    }
}

/// The most sub-lines a route's line may be split into (`shards`): each is
/// one store call per admitter tick.
pub const MAX_SHARDS: u32 = 16;

/// A config that validates, with the warnings about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Loaded {
    pub config: Config,
    /// In file order; empty when there is nothing to point out.
    pub warnings: Vec<ConfigWarning>,
}

/// Longest route name, in characters.
pub const MAX_ROUTE_NAME_LEN: usize = 32;

/// Longest key id, in characters.
pub const MAX_KEY_ID_LEN: usize = 16;

/// Whether `name` can be a route name: 1 to [`MAX_ROUTE_NAME_LEN`] of
/// `A-Z a-z 0-9 _ -`. The name is a field of the cookie's name and of its
/// dot-separated value, so config validation and cookie parsing both ask
/// this.
pub fn is_route_name(name: &str) -> bool {
    is_token(name, MAX_ROUTE_NAME_LEN)
}

/// Whether `id` can be a key id: 1 to [`MAX_KEY_ID_LEN`] of
/// `A-Z a-z 0-9 _ -` (it is a field of the cookie's value too).
pub fn is_key_id(id: &str) -> bool {
    is_token(id, MAX_KEY_ID_LEN)
}

/// Longest lane name, in characters.
pub const MAX_LANE_NAME_LEN: usize = 16;

/// Whether `name` can be a lane name (DESIGN §8.5): 1 to
/// [`MAX_LANE_NAME_LEN`] of `a-z 0-9 _ -`. It is a field of invite tokens
/// and lane cookies, and the origin's `Queuegate-Lane` header names one.
pub fn is_lane_name(name: &str) -> bool {
    (1..=MAX_LANE_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Reads a duration written as the config file writes one: a whole number
/// and a unit, `250us`, `100ms`, `10s`, `5m`, `1h`. The error says what is
/// wrong in one line.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    raw::DurationText::parse(text)
}

fn is_token(text: &str, max_len: usize) -> bool {
    (1..=max_len).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The validated, typed configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub listen: Vec<Listen>,
    pub admin: Option<Admin>,
    pub limits: ServerLimits,
    pub client_ip: ClientIp,
    pub upstream: Upstream,
    pub store: StoreConfig,
    pub keys: Vec<KeySource>,
    pub cookie: CookieConfig,
    /// Prefix of queuegate's own paths, default
    /// [`RESERVED_PREFIX`](defaults::RESERVED_PREFIX).
    pub reserved_prefix: String,
    pub bypass: Vec<Bypass>,
    pub routes: Vec<Route>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Listen {
    pub addr: SocketAddr,
    pub tls: Option<TlsFiles>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Admin {
    /// Default [`defaults::ADMIN_ADDR`].
    pub addr: SocketAddr,
    /// Bearer tokens that may change routes at run time (DESIGN §9.4),
    /// each named (the log says who made a change) and read from an
    /// environment variable or a file, never the YAML; `admin.token` is
    /// named `admin`. None: the controls refuse every change.
    pub tokens: Vec<KeySource>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServerLimits {
    /// The whole request head must arrive within this (default
    /// [`defaults::HEADER_TIMEOUT`]).
    pub header_timeout: Duration,
    /// Beyond this the request gets 431 (default [`defaults::MAX_HEADER_BYTES`]).
    pub max_header_bytes: usize,
    /// Open client connections at most (default [`defaults::MAX_CONNECTIONS`]).
    pub max_connections: usize,
    /// On SIGTERM, in-flight requests get this long (default
    /// [`defaults::DRAIN_TIMEOUT`]).
    pub drain_timeout: Duration,
    /// A connection with nothing in flight is closed after this long,
    /// HTTP/1 keep-alive and HTTP/2 alike (default [`defaults::IDLE_TIMEOUT`]).
    pub idle_timeout: Duration,
    /// A client that accepts no bytes for this long while queuegate writes
    /// to it is dropped, and the origin connection serving it with it
    /// (default [`defaults::SEND_TIMEOUT`]).
    pub send_timeout: Duration,
    /// An upgraded tunnel (WebSocket) silent in both directions this long is
    /// closed (default [`defaults::TUNNEL_IDLE_TIMEOUT`]).
    pub tunnel_idle_timeout: Duration,
    /// Threads serving client connections, each with its own event loop and
    /// its own share of the upstream pool; `None` (`auto`, the default:
    /// [`defaults::WORKERS`]) is one per CPU the process may use.
    pub workers: Option<usize>,
    /// What a path whose readings disagree gets (DESIGN §8.1; default
    /// [`defaults::AMBIGUOUS_PATHS`]).
    pub ambiguous_paths: AmbiguousPaths,
    /// Hosts served; others get `421` (DESIGN §8.2). Empty: any host.
    pub allowed_hosts: Vec<HostPattern>,
    /// Event streams (DESIGN §8.8) open at once per route on this
    /// instance, at most (default [`defaults::MAX_EVENT_STREAMS`]; `0`: none,
    /// everyone polls).
    /// Beyond, a page is told to poll.
    pub max_event_streams: usize,
    /// Event streams one client (its address as per-client limits count
    /// it: IPv4, IPv6 /64, behind trusted proxies) may hold open at once on
    /// this instance, all routes together (default [`defaults::MAX_EVENT_STREAMS_PER_CLIENT`]; `0`: none). Beyond,
    /// its page is told to poll, so that a few addresses cannot take the
    /// instance's streams and connections.
    pub max_event_streams_per_client: usize,
    /// Bytes every micro-cache of the process may hold together, bodies,
    /// heads and keys (DESIGN §9.3; default [`defaults::CACHE_BYTES`]).
    /// An answer that would go over it is served and not kept.
    pub cache_bytes: u64,
}

/// What a request whose path an origin could read as another route gets
/// (`limits.ambiguous_paths`, DESIGN §8.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AmbiguousPaths {
    /// `400`, tagged `x-queuegate`: browsers never send such paths.
    Reject,
    /// Gated by the first route any reading matches, never bypassed
    /// (readings in two different routes still get `400`).
    Gate,
}

impl Default for AmbiguousPaths {
    /// [`defaults::AMBIGUOUS_PATHS`].
    fn default() -> AmbiguousPaths {
        defaults::AMBIGUOUS_PATHS
    }
}

/// Who the client is behind proxies (`client_ip`, DESIGN §8.2).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientIp {
    /// Peers whose `X-Forwarded-*` and `Forwarded` headers are believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

impl ClientIp {
    /// Whether `ip` is a trusted proxy.
    pub fn trusts(&self, ip: std::net::IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted_proxies.iter().any(|net| net.contains(&ip))
    }
}

impl ServerLimits {
    /// The number of worker threads: `workers`, or one per available CPU.
    pub fn worker_count(&self) -> usize {
        self.workers.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Upstream {
    /// `http://` or `https://` origin, no path beyond `/`.
    pub url: http::Uri,
    /// Default [`defaults::CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
    /// Whole response head must arrive within this (default
    /// [`defaults::UPSTREAM_TIMEOUT`]).
    pub timeout: Duration,
    pub pool: Pool,
    /// Replace the client's `Host` with this (default: keep the client's).
    pub host: Option<String>,
    /// With `host`: the origin picks the site from `X-Forwarded-Host` (the
    /// client's host), so routes may match on the host (default
    /// [`defaults::ORIGIN_READS_FORWARDED_HOST`]).
    pub origin_reads_forwarded_host: bool,
    /// PEM file of private CAs to trust for an `https://` upstream.
    pub ca_file: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// Default [`defaults::POOL_MAX_IDLE_PER_HOST`].
    pub max_idle_per_host: usize,
    /// Default [`defaults::POOL_IDLE_TIMEOUT`].
    pub idle_timeout: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StoreConfig {
    /// Default [`defaults::BACKEND`].
    pub backend: Backend,
    /// Present when `backend` is redis (defaults filled in).
    pub redis: RedisConfig,
    /// Used when `backend` is memory.
    pub memory: MemoryConfig,
    /// For the per-instance limit while the store is down (default
    /// [`defaults::EXPECTED_INSTANCES`]).
    pub expected_instances: u64,
}

/// `store.memory`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryConfig {
    /// `snapshot`: the file the memory store is written to (at most every
    /// second, and on a graceful stop) and read back from at start, so a
    /// restart keeps the line. `None`: a restart starts empty.
    pub snapshot: Option<PathBuf>,
}

/// `store.backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    Memory,
    Redis,
}

impl Backend {
    /// The name written in the config (`memory`, `redis`).
    pub fn as_str(self) -> &'static str {
        names::variant::<Self>(self as usize)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct RedisConfig {
    pub mode: RedisMode,
    /// Per-call timeout (default [`defaults::REDIS_TIMEOUT`]).
    pub timeout: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub enum RedisMode {
    /// `redis: { url: redis://host:port/db }` (default [`defaults::REDIS_URL`]).
    Standalone { url: String },
    /// `redis: { cluster: [redis://a:7000, redis://b:7001] }`.
    Cluster { nodes: Vec<String> },
    /// `redis: { sentinel: { master: mymaster, nodes: [redis://s1:26379] } }`.
    Sentinel { master: String, nodes: Vec<String> },
}

/// Where one key of the key ring comes from. Never the YAML itself.
#[derive(Clone, Debug, PartialEq)]
pub struct KeySource {
    /// Key id: see [`is_key_id`].
    pub id: String,
    pub from: KeyFrom,
}

#[derive(Clone, Debug, PartialEq)]
pub enum KeyFrom {
    Env(String),
    File(PathBuf),
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct CookieConfig {
    /// `Domain=` attribute; when set the `__Host-` prefix is not used.
    pub domain: Option<String>,
}

/// A bypass rule: what it lets through, and its micro-cache if it has one.
#[derive(Clone, Debug, PartialEq)]
pub struct Bypass {
    pub rule: BypassRule,
    /// Answers to the requests it lets through kept this way (DESIGN §9.3).
    pub cache: Option<CacheConfig>,
}

impl From<BypassRule> for Bypass {
    /// The rule, without a cache.
    fn from(rule: BypassRule) -> Bypass {
        Bypass { rule, cache: None }
    }
}

impl PartialEq<BypassRule> for Bypass {
    fn eq(&self, rule: &BypassRule) -> bool {
        self.cache.is_none() && self.rule == *rule
    }
}

impl BypassRule {
    /// The rule as written in the file, `path_prefix=/static/`: how its
    /// cache is named (in metrics and logs).
    pub fn describe(&self) -> String {
        match self {
            BypassRule::PathPrefix(p) => format!("path_prefix={p}"),
            BypassRule::Path(p) => format!("path={p}"),
            BypassRule::Method(m) => format!("method={m}"),
        }
    }
}

/// The micro-cache of a route or a bypass rule (`cache`, DESIGN §9.3): the
/// origin's cacheable answers kept in memory for a short time and served to
/// the admitted requests that ask for them again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// How long an answer is served after it was received, at most; a
    /// shorter `s-maxage` or `max-age` in the answer wins (default
    /// [`defaults::CACHE_TTL`]).
    pub ttl: Duration,
    /// Answers kept at once, at most (default [`defaults::CACHE_MAX_ENTRIES`]).
    pub max_entries: u64,
    /// Larger bodies are streamed through and not kept (default
    /// [`defaults::CACHE_MAX_BODY`]); at most `limits.cache_bytes`.
    pub max_body: u64,
}

impl Default for CacheConfig {
    /// Every field's default.
    fn default() -> CacheConfig {
        CacheConfig {
            ttl: defaults::CACHE_TTL,
            max_entries: defaults::CACHE_MAX_ENTRIES,
            max_body: defaults::CACHE_MAX_BODY,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum BypassRule {
    /// Kept as written (it starts with `/`): `/static/` and `/static` differ.
    PathPrefix(String),
    Path(String),
    Method(http::Method),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// See [`is_route_name`]: it is part of the cookie name and value.
    pub name: String,
    pub matcher: RouteMatch,
    /// Sessions admitted at once: the fixed number, or where an adaptive
    /// route starts (`capacity.start`).
    pub capacity: u64,
    /// How the capacity follows the origin's health (DESIGN §9.1); `None`
    /// for a fixed capacity.
    pub adapt: Option<Adapt>,
    /// Default [`defaults::MAX_ADMIT_PER_TICK`].
    pub max_admit_per_tick: u64,
    /// Default [`defaults::TICK`].
    pub tick: Duration,
    /// Default [`defaults::SESSION_TTL`].
    pub session_ttl: Duration,
    /// Default [`defaults::PASS_TTL`].
    pub pass_ttl: Duration,
    /// Default [`defaults::ARRIVAL_GRACE`].
    pub arrival_grace: Duration,
    /// Default [`defaults::ABANDON_AFTER`].
    pub abandon_after: Duration,
    /// Default [`defaults::MAX_WAITING`].
    pub max_waiting: u64,
    /// Time a new ticket or admit-now session holds its place unconfirmed.
    /// Default [`defaults::CONFIRM_WITHIN`], or `abandon_after` /
    /// `session_ttl` if shorter.
    pub confirm_within: Duration,
    /// Default [`ClientLimits::default`], `places` at most a
    /// [`defaults::CLIENT_PLACES_LINE_DIVISOR`]th of `max_waiting`.
    pub client_limits: ClientLimits,
    /// Default [`defaults::WAITING_STATUS`].
    pub waiting_status: http::StatusCode,
    /// Default [`defaults::MODE`].
    pub mode: Mode,
    /// Default [`defaults::ON_STORE_ERROR`].
    pub on_store_error: OnStoreError,
    /// Paths whose request ends the visitor's session once answered
    /// (DESIGN §8.6), normalised as `match.path_prefix` is and matched the
    /// same way: on a segment boundary, against every reading of the
    /// request path, with the route's `case_insensitive`. Default none.
    pub exit_paths: Vec<String>,
    /// Forwarded requests one session may make before it ends, counted in
    /// the store; `None` (the default) for no limit.
    pub max_requests_per_session: Option<u64>,
    /// The route's lanes (DESIGN §8.5), at least one; the first is where
    /// newcomers go. Default one lane, [`Lane::main`].
    pub lanes: Lanes,
    /// When the route opens (DESIGN §8.7): before it, arrivals wait in a
    /// pre-queue that is shuffled once at the opening. Default none: open.
    pub opens_at: Option<Timestamp>,
    /// From when the route answers as `closed`; after `opens_at`. Default none.
    pub closes_at: Option<Timestamp>,
    /// Sub-lines the Redis store splits the route's line and capacity into,
    /// each in its own Cluster slot (DESIGN §8.9); 1 to [`MAX_SHARDS`].
    /// Fixed while the store holds the route's line. Default
    /// [`defaults::SHARDS`].
    pub shards: u32,
    /// Most requests of the route at the origin at once, per instance
    /// (DESIGN §9.2); `None` (the default) for no cap.
    pub max_inflight: Option<u64>,
    /// How long a request beyond `max_inflight` waits for a turn before it
    /// is answered busy; zero for no wait. Default
    /// [`defaults::INFLIGHT_WAIT`].
    pub inflight_wait: Duration,
    pub page: PageConfig,
    /// The route's micro-cache (DESIGN §9.3); default none.
    pub cache: Option<CacheConfig>,
}

/// An adaptive capacity's range and targets (DESIGN §9.1): `capacity:
/// { min, max, start, target: { p95, errors } }` and `adapt_every`.
#[derive(Clone, Debug, PartialEq)]
pub struct Adapt {
    /// At least 1.
    pub min: u64,
    /// At least `min`.
    pub max: u64,
    /// The origin's time to the response head that 95 % of a window's
    /// requests stay within. Default [`defaults::TARGET_P95`].
    pub target_p95: Duration,
    /// The share (0 to 1) of answers that may be `5xx`, timeouts or failed
    /// connections. Default [`defaults::TARGET_ERRORS`].
    pub target_errors: f64,
    /// The window the origin's health is measured over and capacity decided
    /// once per. Default [`defaults::ADAPT_EVERY`].
    pub every: Duration,
}

/// An instant written in RFC 3339 with its offset, such as
/// `2026-12-24T10:00:00+09:00` (`opens_at`, `closes_at`), at or after 1970.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timestamp(time::OffsetDateTime);

impl Timestamp {
    /// Reads `text`: RFC 3339 with `Z` or a numeric offset, at or after
    /// the Unix epoch.
    pub fn parse(text: &str) -> Result<Timestamp, String> {
        let at = time::OffsetDateTime::parse(
            text.trim(),
            &time::format_description::well_known::Rfc3339,
        )
        .map_err(|err| {
            format!(
                "invalid time {text:?} ({err}): write RFC 3339 with an offset, \
                     e.g. 2026-12-24T10:00:00+09:00"
            )
        })?;
        if at.unix_timestamp() < 0 {
            return Err(format!("{text:?} is before 1970"));
        }
        Ok(Timestamp(at))
    }

    /// The instant `unix_s` seconds after the Unix epoch, in UTC.
    pub fn from_unix_s(unix_s: u64) -> Option<Timestamp> {
        let s = i64::try_from(unix_s).ok()?;
        time::OffsetDateTime::from_unix_timestamp(s)
            .ok()
            .map(Timestamp)
    }

    /// Microseconds since the Unix epoch, the store's scores' unit.
    pub fn unix_us(&self) -> u64 {
        // Not before 1970 (checked when parsed); years end at 9999.
        u64::try_from(self.0.unix_timestamp_nanos() / 1_000).unwrap_or(0)
    }

    /// RFC 3339 with the offset it was written with.
    pub fn rfc3339(&self) -> String {
        self.0
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default()
    }
}

/// A lane of a route: its own line, sharing the route's capacity with the
/// other lanes by weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lane {
    /// See [`is_lane_name`]: it is part of store keys, tokens and cookies.
    pub name: String,
    /// 1 to [`MAX_LANE_WEIGHT`] (default [`defaults::LANE_WEIGHT`]).
    pub weight: u32,
}

impl Lane {
    /// The one lane of a route that names none: [`defaults::LANE`], of
    /// weight [`defaults::LANE_WEIGHT`].
    pub fn main() -> Lane {
        Lane {
            name: defaults::LANE.to_owned(),
            weight: defaults::LANE_WEIGHT,
        }
    }
}

/// A route's lanes, in order; the first is where newcomers go. Built only
/// by validation (the config's `lanes`, or [`Lanes::new`], which runs the
/// same rules), so every name is a valid key part, no name comes twice, every
/// weight counts, and there is at least one and at most [`MAX_LANES`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lanes(std::sync::Arc<[Lane]>);

impl Default for Lanes {
    /// One lane, [`Lane::main`]: a route without lanes configured.
    fn default() -> Lanes {
        Lanes(std::sync::Arc::new([Lane::main()]))
    }
}

impl Lanes {
    /// Checks `lanes` by the rules of a route's `lanes` setting; the
    /// problems are reported at `lanes`, `lanes[i].name`, `lanes[i].weight`.
    pub fn new(lanes: Vec<Lane>) -> Result<Lanes, ConfigErrors> {
        validate::lanes_from_code(lanes)
    }

    /// The lanes in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Lane> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: there is always a first lane.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The lane at `index`; the first for an index out of range.
    pub fn get(&self, index: usize) -> &Lane {
        self.0.get(index).unwrap_or(&self.0[0])
    }

    /// `index` if it names a lane, else 0 (the first lane).
    pub fn clamp(&self, index: usize) -> usize {
        if index < self.0.len() {
            index
        } else {
            0
        }
    }

    /// The index of the lane named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.0.iter().position(|l| l.name == name)
    }

    /// The share of the route's admissions lane `index` gets while the lanes
    /// whose `waiting` count is not zero have waiters: its weight over the
    /// sum of theirs (the lane itself counted as waiting). An ETA in the
    /// lane is the route's admission rate times this share.
    pub fn share(&self, index: usize, waiting: &[u64]) -> f64 {
        let index = self.clamp(index);
        let total: u64 = self
            .0
            .iter()
            .enumerate()
            .filter(|&(i, _)| i == index || waiting.get(i).is_some_and(|&w| w > 0))
            .map(|(_, l)| u64::from(l.weight))
            .sum();
        f64::from(self.0[index].weight) / total.max(1) as f64
    }
}

/// The lanes, compared with a list written out.
impl<const N: usize> PartialEq<[Lane; N]> for Lanes {
    fn eq(&self, other: &[Lane; N]) -> bool {
        *self.0 == other[..]
    }
}

/// The largest lane weight.
pub const MAX_LANE_WEIGHT: u32 = 1000;

/// The most lanes a route may have: every lane is a key each admission
/// tick reads.
pub const MAX_LANES: usize = 8;

/// Per-client limits of a route, counted in the store across instances; 0
/// turns a limit off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientLimits {
    /// Tickets in line plus active sessions one client may hold.
    pub places: u64,
    /// Arrivals that joined or were admitted, per client per minute.
    pub joins_per_minute: u64,
}

impl Default for ClientLimits {
    /// [`defaults::CLIENT_PLACES`] and [`defaults::CLIENT_JOINS_PER_MINUTE`].
    fn default() -> ClientLimits {
        ClientLimits {
            places: defaults::CLIENT_PLACES,
            joins_per_minute: defaults::CLIENT_JOINS_PER_MINUTE,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct RouteMatch {
    /// Exact host (port ignored), lower-cased.
    pub host: Option<String>,
    /// Normalised path prefix, matched on a segment boundary: unreserved
    /// percent-escapes decoded, dot segments resolved, repeated slashes
    /// collapsed, no trailing slash except for `/` itself.
    pub path_prefix: Option<String>,
    /// Default [`defaults::CASE_INSENSITIVE`].
    pub case_insensitive: bool,
}

impl RouteMatch {
    /// Whether a request for `host` (canonical, without port; `None` when
    /// it names none) fits the host rule: any host when there is no rule,
    /// else that host in any case.
    pub fn host_fits(&self, host: Option<&str>) -> bool {
        match &self.host {
            None => true,
            Some(want) => host.is_some_and(|h| h.eq_ignore_ascii_case(want)),
        }
    }
}

/// `routes[N].mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Gate,
    QueueAll,
    Passthrough,
    Closed,
}

impl Mode {
    /// The name written in the config (`gate`, `queue_all`, ...).
    pub fn as_str(self) -> &'static str {
        names::variant::<Self>(self as usize)
    }
}

/// `routes[N].on_store_error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    Open,
    Closed,
    Local,
}

impl OnStoreError {
    /// The name written in the config (`open`, `closed`, `local`).
    pub fn as_str(self) -> &'static str {
        names::variant::<Self>(self as usize)
    }
}

/// Per-route waiting page text and template.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PageConfig {
    pub title: Option<String>,
    pub message: Option<String>,
    /// Template file, read and checked for its placeholders when the config
    /// is validated; a bad one is an error at `routes[N].page.template`.
    pub template: Option<PageTemplate>,
}

/// A route's waiting page template: the file it came from and the parsed
/// text, read once when the config is validated (so `queuegate check`, start-up
/// and reload all judge the same bytes the page is rendered from).
#[derive(Clone, Debug, PartialEq)]
pub struct PageTemplate {
    pub path: PathBuf,
    pub template: std::sync::Arc<crate::template::Template>,
}

impl PageTemplate {
    /// Reads and parses the template at `path`; the error says what is wrong
    /// (unreadable file, unknown or missing placeholder and its line).
    pub fn load(path: &Path) -> Result<PageTemplate, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
        let template = crate::template::Template::parse(&text)
            .map_err(|err| format!("{}: {err}", path.display()))?;
        Ok(PageTemplate {
            path: path.to_owned(),
            template: std::sync::Arc::new(template),
        })
    }
}
