//! Raw → typed: fills in the documented defaults and checks every value and
//! every rule between values, recording all problems rather than the first,
//! and warnings about a valid config an operator likely did not mean.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::document::Document;
use super::error::{ConfigError, ConfigErrors, ConfigWarning, FieldPath};
use super::locate;
use super::raw::{
    DurationText, RawBypass, RawClientIp, RawConfig, RawKey, RawLane, RawLimits, RawListen,
    RawMatch, RawRedis, RawRoute, RawStore, RawUpstream, RawWorkers,
};
use super::{
    is_key_id, is_lane_name, is_route_name, Admin, Backend, BypassRule, ClientIp, ClientLimits,
    Config, CookieConfig, HostPattern, KeyFrom, KeySource, Lane, Listen, Mode, OnStoreError,
    PageConfig, PageTemplate, Pool, RedisConfig, RedisMode, Route, RouteMatch, ServerLimits,
    StoreConfig, Timestamp, TlsFiles, Upstream, MAX_KEY_ID_LEN, MAX_LANES, MAX_LANE_NAME_LEN,
    MAX_LANE_WEIGHT, MAX_ROUTE_NAME_LEN, MAX_SHARDS,
};

pub(crate) const DEFAULT_ADMIN_ADDR: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9901);
pub(crate) const DEFAULT_RESERVED_PREFIX: &str = "/__queuegate";
pub(crate) const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_HEADER_BYTES: u64 = 16384;
const MAX_HEADER_BYTES_RANGE: std::ops::RangeInclusive<u64> = 1024..=1_048_576;
const MAX_CONNECTIONS: u64 = 10_000;
const MAX_EVENT_STREAMS: u64 = 100_000;
/// As many streams as the places one client may hold on a route by
/// default (`client_limits.places`): a household or an office can follow
/// each of its places.
const MAX_EVENT_STREAMS_PER_CLIENT: u64 = 20;
/// More worker threads than this is a typo, not a machine.
const MAX_WORKERS: u64 = 1024;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
const TUNNEL_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);
const POOL_MAX_IDLE_PER_HOST: u64 = 256;
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
const REDIS_TIMEOUT: Duration = Duration::from_millis(200);
const MAX_ADMIT_PER_TICK: u64 = 20;
const TICK: Duration = Duration::from_millis(100);
const MIN_TICK: Duration = Duration::from_millis(10);
const SESSION_TTL: Duration = Duration::from_secs(600);
const PASS_TTL: Duration = Duration::from_secs(60);
const MIN_PASS_TTL: Duration = Duration::from_secs(2);
const ARRIVAL_GRACE: Duration = Duration::from_secs(60);
const ABANDON_AFTER: Duration = Duration::from_secs(30);
const MAX_WAITING: u64 = 200_000;
const CONFIRM_WITHIN: Duration = Duration::from_secs(30);
const WAITING_STATUS: u16 = 503;

/// Problems found so far, each at its field path; and warnings, which do
/// not stop a config from loading.
#[derive(Debug, Default)]
pub(crate) struct Problems {
    found: Vec<(FieldPath, String)>,
    /// Fields whose value could not be read: anything later said about them
    /// (missing, out of range) is a consequence, not news.
    skipped: Vec<FieldPath>,
    warnings: Vec<(FieldPath, String)>,
}

impl Problems {
    pub(crate) fn report(&mut self, path: FieldPath, message: impl Into<String>) {
        if self.skipped.iter().any(|skipped| path.starts_with(skipped)) {
            return;
        }
        self.found.push((path, message.into()));
    }

    pub(crate) fn skip(&mut self, path: FieldPath) {
        self.skipped.push(path);
    }

    /// Records a warning: the config still loads.
    pub(crate) fn warn(&mut self, path: FieldPath, message: impl Into<String>) {
        self.warnings.push((path, message.into()));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// Every problem with its line in `document`, in file order (problems
    /// with no line last).
    pub(crate) fn into_errors(self, document: &Document) -> ConfigErrors {
        let errors = in_file_order(self.found, document)
            .map(|(path, line, message)| ConfigError {
                path,
                line,
                message,
            })
            .collect();
        ConfigErrors { errors }
    }

    /// Every warning with its line in `document`, in file order.
    pub(crate) fn into_warnings(self, document: &Document) -> Vec<ConfigWarning> {
        in_file_order(self.warnings, document)
            .map(|(path, line, message)| ConfigWarning {
                path,
                line,
                message,
            })
            .collect()
    }
}

/// `(path, line, message)` for each of `found`, sorted by line (those with
/// no line last, in the order found).
fn in_file_order(
    found: Vec<(FieldPath, String)>,
    document: &Document,
) -> impl Iterator<Item = (String, Option<usize>, String)> {
    let mut located: Vec<_> = found
        .into_iter()
        .map(|(path, message)| {
            let line = locate::nearest_line(document.root(), &path);
            (path.to_string(), line, message)
        })
        .collect();
    located.sort_by_key(|(_, line, _)| line.unwrap_or(usize::MAX));
    located.into_iter()
}

/// Builds the typed config, or records why it cannot (then `None`).
pub(crate) fn validate(raw: RawConfig, problems: &mut Problems) -> Option<Config> {
    let root = FieldPath::root();
    let listen = listen(raw.listen, &root.key("listen"), problems);
    let admin = admin(raw.admin.and_then(|admin| admin.addr).map(|a| a.0));
    if let (Some(listen), Some(admin)) = (&listen, &admin) {
        // Port 0 asks the system for a free port: never a clash.
        if let Some(i) = listen
            .iter()
            .position(|l| l.addr == admin.addr && admin.addr.port() != 0)
        {
            problems.report(
                root.key("admin").key("addr"),
                format!("{} is also listen[{i}].addr", admin.addr),
            );
        }
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
        if upstream.host.is_some() && !upstream.origin_reads_forwarded_host {
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
    }

    if let Some(routes) = &routes {
        host_routes_need_allowed_hosts(&limits, routes, &root, problems);
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

fn listen(
    raw: Option<Vec<RawListen>>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<Vec<Listen>> {
    let Some(raw) = raw.filter(|raw| !raw.is_empty()) else {
        problems.report(
            at.clone(),
            "at least one listener is required, e.g. `- addr: 0.0.0.0:8080`",
        );
        return None;
    };
    let mut listeners: Vec<Option<Listen>> = Vec::new();
    for (i, item) in raw.into_iter().enumerate() {
        let at = at.index(i);
        let addr = required(item.addr.map(|a| a.0), &at.key("addr"), problems);
        let tls = match item.tls {
            None => Some(None),
            Some(tls) => {
                let cert = required_path(tls.cert, &at.key("tls").key("cert"), problems);
                let key = required_path(tls.key, &at.key("tls").key("key"), problems);
                cert.zip(key)
                    .map(|(cert, key)| Some(TlsFiles { cert, key }))
            }
        };
        if let Some(addr) = addr.filter(|a| a.port() != 0) {
            if let Some(j) = listeners
                .iter()
                .position(|other| other.as_ref().is_some_and(|other| other.addr == addr))
            {
                problems.report(at.key("addr"), format!("{addr} is also listen[{j}].addr"));
            }
        }
        listeners.push(addr.zip(tls).map(|(addr, tls)| Listen { addr, tls }));
    }
    listeners.into_iter().collect()
}

fn admin(addr: Option<SocketAddr>) -> Option<Admin> {
    Some(Admin {
        addr: addr.unwrap_or(DEFAULT_ADMIN_ADDR),
    })
}

fn limits(raw: RawLimits, at: &FieldPath, problems: &mut Problems) -> ServerLimits {
    let header_timeout = duration(raw.header_timeout, HEADER_TIMEOUT);
    if header_timeout.is_zero() {
        problems.report(at.key("header_timeout"), "must be more than 0s");
    }
    let max_header_bytes = raw.max_header_bytes.unwrap_or(MAX_HEADER_BYTES);
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
    let max_connections = raw.max_connections.unwrap_or(MAX_CONNECTIONS);
    if max_connections == 0 {
        problems.report(at.key("max_connections"), "must be at least 1");
    }
    let mut allowed_hosts = Vec::new();
    for (i, text) in raw.allowed_hosts.iter().flatten().enumerate() {
        match HostPattern::parse(text) {
            Ok(pattern) => allowed_hosts.push(pattern),
            Err(_) => problems.report(
                at.key("allowed_hosts").index(i),
                format!(
                    "invalid host {text:?}: expected a name such as shop.example or *.shop.example"
                ),
            ),
        }
    }
    let workers = match raw.workers {
        None => None,
        Some(RawWorkers::Word(word)) if word == "auto" => None,
        Some(RawWorkers::Count(n)) if (1..=MAX_WORKERS).contains(&n) => Some(to_usize(n)),
        Some(RawWorkers::Count(n)) => {
            problems.report(
                at.key("workers"),
                format!("{n} is out of range: must be `auto` or between 1 and {MAX_WORKERS}"),
            );
            None
        }
        Some(RawWorkers::Word(word)) => {
            problems.report(
                at.key("workers"),
                format!("`{word}`: must be `auto` or a number of threads"),
            );
            None
        }
    };
    ServerLimits {
        header_timeout,
        max_header_bytes: to_usize(max_header_bytes),
        max_connections: to_usize(max_connections),
        drain_timeout: duration(raw.drain_timeout, DRAIN_TIMEOUT),
        idle_timeout: positive(
            raw.idle_timeout,
            IDLE_TIMEOUT,
            &at.key("idle_timeout"),
            problems,
        ),
        send_timeout: positive(
            raw.send_timeout,
            SEND_TIMEOUT,
            &at.key("send_timeout"),
            problems,
        ),
        tunnel_idle_timeout: positive(
            raw.tunnel_idle_timeout,
            TUNNEL_IDLE_TIMEOUT,
            &at.key("tunnel_idle_timeout"),
            problems,
        ),
        workers,
        ambiguous_paths: raw.ambiguous_paths.unwrap_or_default(),
        allowed_hosts,
        max_event_streams: to_usize(raw.max_event_streams.unwrap_or(MAX_EVENT_STREAMS)),
        max_event_streams_per_client: to_usize(
            raw.max_event_streams_per_client
                .unwrap_or(MAX_EVENT_STREAMS_PER_CLIENT),
        ),
    }
}

fn client_ip(raw: RawClientIp, at: &FieldPath, problems: &mut Problems) -> ClientIp {
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

fn upstream(raw: Option<RawUpstream>, at: &FieldPath, problems: &mut Problems) -> Option<Upstream> {
    let Some(raw) = raw else {
        problems.report(
            at.clone(),
            "the upstream section is required, e.g. `upstream: { url: http://127.0.0.1:3000 }`",
        );
        return None;
    };
    let url = required(raw.url, &at.key("url"), problems)
        .and_then(|url| upstream_url(&url, &at.key("url"), problems));
    let connect_timeout = positive(
        raw.connect_timeout,
        CONNECT_TIMEOUT,
        &at.key("connect_timeout"),
        problems,
    );
    let timeout = positive(raw.timeout, UPSTREAM_TIMEOUT, &at.key("timeout"), problems);
    let pool = raw.pool.unwrap_or_default();
    let pool = Pool {
        max_idle_per_host: to_usize(pool.max_idle_per_host.unwrap_or(POOL_MAX_IDLE_PER_HOST)),
        idle_timeout: duration(pool.idle_timeout, POOL_IDLE_TIMEOUT),
    };
    let host = match raw.host {
        None => Some(None),
        Some(host) => match host.parse::<http::uri::Authority>() {
            Ok(authority) if !authority.as_str().contains('@') && !authority.host().is_empty() => {
                Some(Some(host))
            }
            _ => {
                problems.report(
                    at.key("host"),
                    format!("invalid host {host:?}: expected a host name, optionally with :port"),
                );
                None
            }
        },
    };
    if let (Some(url), Some(_)) = (&url, &raw.ca_file) {
        if url.scheme_str() != Some("https") {
            problems.report(at.key("ca_file"), "only used with an https:// upstream url");
        }
    }
    let ca_file = match raw.ca_file {
        Some(path) if path.as_os_str().is_empty() => {
            problems.report(at.key("ca_file"), "must not be empty");
            None
        }
        other => Some(other),
    };
    Some(Upstream {
        url: url?,
        connect_timeout,
        timeout,
        pool,
        host: host?,
        origin_reads_forwarded_host: raw.origin_reads_forwarded_host.unwrap_or(false),
        ca_file: ca_file?,
    })
}

fn upstream_url(text: &str, at: &FieldPath, problems: &mut Problems) -> Option<http::Uri> {
    let mut fail = |why: &str| {
        problems.report(at.clone(), format!("invalid upstream url {text:?}: {why}"));
        None
    };
    let uri: http::Uri = match text.parse() {
        Ok(uri) => uri,
        Err(err) => return fail(&err.to_string()),
    };
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(_) => return fail("the scheme must be http or https"),
        None => return fail("expected http://host:port or https://host:port"),
    }
    match uri.authority() {
        Some(authority) if authority.as_str().contains('@') => {
            return fail("credentials in the url are not supported")
        }
        Some(authority) if !authority.host().is_empty() => {}
        _ => return fail("the url needs a host"),
    }
    if !matches!(uri.path(), "" | "/") {
        return fail("a path is not supported: requests are forwarded with their own path");
    }
    if uri.query().is_some() {
        return fail("a query is not supported");
    }
    Some(uri)
}

fn store(raw: RawStore, at: &FieldPath, problems: &mut Problems) -> Option<StoreConfig> {
    let backend = raw.backend.unwrap_or(Backend::Memory);
    let redis = redis(raw.redis.unwrap_or_default(), &at.key("redis"), problems);
    let expected_instances = raw.expected_instances.unwrap_or(1);
    if expected_instances == 0 {
        problems.report(at.key("expected_instances"), "must be at least 1");
    }
    Some(StoreConfig {
        backend,
        redis: redis?,
        expected_instances,
    })
}

fn redis(raw: RawRedis, at: &FieldPath, problems: &mut Problems) -> Option<RedisConfig> {
    let timeout = positive(raw.timeout, REDIS_TIMEOUT, &at.key("timeout"), problems);
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
        let url = raw.url.unwrap_or_else(|| DEFAULT_REDIS_URL.to_owned());
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
pub fn redact_url(url: &str) -> String {
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

fn keys(
    raw: Option<Vec<RawKey>>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<Vec<KeySource>> {
    let Some(raw) = raw.filter(|raw| !raw.is_empty()) else {
        problems.report(
            at.clone(),
            "at least one key is required, e.g. `- { id: k1, env: QUEUEGATE_KEY_K1 }`",
        );
        return None;
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut keys = Vec::new();
    for (i, key) in raw.into_iter().enumerate() {
        let at = at.index(i);
        let id = required(key.id, &at.key("id"), problems).filter(|id| {
            if is_key_id(id) {
                true
            } else {
                problems.report(
                    at.key("id"),
                    format!("invalid key id {id:?}: use 1 to {MAX_KEY_ID_LEN} of A-Z a-z 0-9 _ -"),
                );
                false
            }
        });
        if let Some(id) = &id {
            if let Some(j) = seen.insert(id.clone(), i) {
                problems.report(at.key("id"), format!("key id {id:?} is also keys[{j}].id"));
            }
        }
        let from = match (key.env, key.file) {
            (Some(env), None) => {
                if env.is_empty() || env.contains(['=', '\0']) {
                    problems.report(
                        at.key("env"),
                        format!("invalid environment variable name {env:?}"),
                    );
                    None
                } else {
                    Some(KeyFrom::Env(env))
                }
            }
            (None, Some(file)) => {
                if file.as_os_str().is_empty() {
                    problems.report(at.key("file"), "must not be empty");
                    None
                } else {
                    Some(KeyFrom::File(file))
                }
            }
            (Some(_), Some(_)) => {
                problems.report(at.clone(), "give exactly one of env, file (found both)");
                None
            }
            (None, None) => {
                problems.report(
                    at.clone(),
                    "give exactly one of env, file: keys never live in this file",
                );
                None
            }
        };
        keys.push(id.zip(from).map(|(id, from)| KeySource { id, from }));
    }
    keys.into_iter().collect()
}

fn cookie(domain: Option<String>, at: &FieldPath, problems: &mut Problems) -> Option<CookieConfig> {
    let Some(domain) = domain else {
        return Some(CookieConfig::default());
    };
    let bare = domain.strip_prefix('.').unwrap_or(&domain);
    let valid = !bare.is_empty()
        && bare.len() <= 253
        && bare.split('.').all(|label| {
            !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if !valid {
        problems.report(
            at.clone(),
            format!("invalid cookie domain {domain:?}: expected a domain such as example.com"),
        );
        return None;
    }
    Some(CookieConfig {
        domain: Some(bare.to_ascii_lowercase()),
    })
}

fn reserved_prefix(raw: Option<String>, at: &FieldPath, problems: &mut Problems) -> Option<String> {
    let Some(prefix) = raw else {
        return Some(DEFAULT_RESERVED_PREFIX.to_owned());
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
                 and use only A-Z a-z 0-9 - . _ ~ between slashes, e.g. /__queuegate"
            ),
        );
        return None;
    }
    Some(prefix)
}

fn bypass(raw: Vec<RawBypass>, at: &FieldPath, problems: &mut Problems) -> Option<Vec<BypassRule>> {
    let mut rules = Vec::new();
    for (i, rule) in raw.into_iter().enumerate() {
        let at = at.index(i);
        let rule = match (rule.path_prefix, rule.path, rule.method) {
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
        rules.push(rule);
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

fn routes(
    raw: Vec<RawRoute>,
    reserved_prefix: Option<&str>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<Vec<Route>> {
    let mut routes: Vec<Option<Route>> = Vec::new();
    let mut names: HashMap<String, usize> = HashMap::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let at = at.index(i);
        let route = route(raw, &at, problems);
        if let Some(route) = &route {
            if let Some(j) = names.insert(route.name.clone(), i) {
                problems.report(
                    at.key("name"),
                    format!("route name {:?} is also routes[{j}].name", route.name),
                );
            }
            if let Some(j) = routes.iter().position(|earlier| {
                earlier
                    .as_ref()
                    .is_some_and(|e| covers(&e.matcher, &route.matcher))
            }) {
                problems.report(
                    at.key("match"),
                    format!("never used: routes[{j}] matches every request this route matches, and comes first"),
                );
            }
            if let (Some(reserved), Some(prefix)) = (reserved_prefix, &route.matcher.path_prefix) {
                if crate::path::prefix_matches(prefix, reserved) {
                    problems.report(
                        at.key("match").key("path_prefix"),
                        format!("{prefix} is inside reserved_prefix {reserved}, which queuegate serves itself"),
                    );
                }
            }
        }
        routes.push(route);
    }
    routes.into_iter().collect()
}

/// Whether every request `later` matches is matched by `earlier` already.
fn covers(earlier: &RouteMatch, later: &RouteMatch) -> bool {
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

fn route(raw: RawRoute, at: &FieldPath, problems: &mut Problems) -> Option<Route> {
    let name = required(raw.name, &at.key("name"), problems).filter(|name| {
        if is_route_name(name) {
            true
        } else {
            problems.report(
                at.key("name"),
                format!(
                    "invalid route name {name:?}: use 1 to {MAX_ROUTE_NAME_LEN} of A-Z a-z 0-9 _ -"
                ),
            );
            false
        }
    });
    let matcher = match raw.matcher {
        Some(raw) => route_match(raw, &at.key("match"), problems),
        None => {
            problems.report(
                at.key("match"),
                "required: give host and/or path_prefix, e.g. `match: { path_prefix: /tickets }`",
            );
            None
        }
    };
    let capacity = required(raw.capacity, &at.key("capacity"), problems);
    if capacity == Some(0) {
        problems.report(at.key("capacity"), "must be at least 1");
    }
    let max_admit_per_tick = raw.max_admit_per_tick.unwrap_or(MAX_ADMIT_PER_TICK);
    if max_admit_per_tick == 0 {
        problems.report(at.key("max_admit_per_tick"), "must be at least 1");
    }
    let tick = at_least(raw.tick, TICK, MIN_TICK, "10ms", &at.key("tick"), problems);
    let pass_ttl = at_least(
        raw.pass_ttl,
        PASS_TTL,
        MIN_PASS_TTL,
        "2s",
        &at.key("pass_ttl"),
        problems,
    );
    let session_ttl = duration(raw.session_ttl, SESSION_TTL);
    if session_ttl < pass_ttl {
        problems.report(
            at.key("session_ttl"),
            format!(
                "{} is shorter than pass_ttl {}: a session must outlive the pass that stands for it",
                show(session_ttl),
                show(pass_ttl)
            ),
        );
    }
    let arrival_grace = positive(
        raw.arrival_grace,
        ARRIVAL_GRACE,
        &at.key("arrival_grace"),
        problems,
    );
    let abandon_after = positive(
        raw.abandon_after,
        ABANDON_AFTER,
        &at.key("abandon_after"),
        problems,
    );
    let confirm_within =
        confirm_within(raw.confirm_within, session_ttl, abandon_after, at, problems);
    let max_waiting = raw.max_waiting.unwrap_or(MAX_WAITING);
    // By default one address may hold at most a fifth of a short line, so
    // a handful of cookie-less requests cannot fill it for everyone else.
    let default = ClientLimits::default();
    let default_places = default.places.min((max_waiting / 5).max(1));
    let client_limits = match raw.client_limits {
        None => ClientLimits {
            places: default_places,
            ..default
        },
        Some(raw) => ClientLimits {
            places: raw.places.unwrap_or(default_places),
            joins_per_minute: raw.joins_per_minute.unwrap_or(default.joins_per_minute),
        },
    };
    if client_limits.places > 0 && client_limits.places >= max_waiting {
        problems.report(
            at.key("client_limits").key("places"),
            format!(
                "{} would let one address fill the whole line (max_waiting {max_waiting}): \
                 give fewer, or 0 to turn the limit off",
                client_limits.places
            ),
        );
    }
    let waiting_status = raw.waiting_status.unwrap_or(WAITING_STATUS);
    let waiting_status = match http::StatusCode::from_u16(waiting_status) {
        Ok(status) if (400..=599).contains(&waiting_status) => Some(status),
        _ => {
            problems.report(
                at.key("waiting_status"),
                format!(
                    "{waiting_status} is not an HTTP error status: use 400 to 599, e.g. 503 or 429"
                ),
            );
            None
        }
    };
    let mode = raw.mode.unwrap_or(Mode::Gate);
    let on_store_error = raw.on_store_error.unwrap_or(OnStoreError::Local);
    let exit_paths = exit_paths(raw.exit_paths.unwrap_or_default(), at, problems);
    let max_requests_per_session = raw.max_requests_per_session;
    if max_requests_per_session == Some(0) {
        problems.report(
            at.key("max_requests_per_session"),
            "must be at least 1 (1 lets each session make one request); leave it out for no limit",
        );
    }
    let lanes = lanes(raw.lanes, at, problems);
    let opening = opening(raw.opens_at, raw.closes_at, at, problems);
    let shards = raw.shards.unwrap_or(1);
    if !(1..=MAX_SHARDS).contains(&shards) {
        problems.report(
            at.key("shards"),
            format!("{shards} sub-lines: use 1 to {MAX_SHARDS} (1, the default, keeps one line)"),
        );
    }
    let page = raw.page.unwrap_or_default();
    let template = match &page.template {
        None => Some(None),
        Some(path) if path.as_os_str().is_empty() => {
            problems.report(at.key("page").key("template"), "must not be empty");
            None
        }
        Some(path) => match PageTemplate::load(path) {
            Ok(template) => Some(Some(template)),
            Err(why) => {
                problems.report(at.key("page").key("template"), why);
                None
            }
        },
    };
    Some(Route {
        name: name?,
        matcher: matcher?,
        capacity: capacity.filter(|&c| c > 0)?,
        max_admit_per_tick,
        tick,
        session_ttl,
        pass_ttl,
        arrival_grace,
        abandon_after,
        max_waiting,
        confirm_within,
        client_limits,
        waiting_status: waiting_status?,
        mode,
        on_store_error,
        exit_paths: exit_paths?,
        max_requests_per_session: max_requests_per_session.filter(|&n| n > 0),
        lanes: lanes?,
        opens_at: opening?.0,
        closes_at: opening?.1,
        shards,
        page: PageConfig {
            title: page.title,
            message: page.message,
            template: template?,
        },
    })
}

/// `opens_at` and `closes_at` (DESIGN §8.7): RFC 3339 instants with an
/// offset, `closes_at` after `opens_at`. `None` when either is wrong.
fn opening(
    opens_at: Option<String>,
    closes_at: Option<String>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<(Option<Timestamp>, Option<Timestamp>)> {
    let mut read = |text: Option<String>, field: &str| match text {
        None => Some(None),
        Some(text) => match Timestamp::parse(&text) {
            Ok(t) => Some(Some(t)),
            Err(why) => {
                problems.report(at.key(field), why);
                None
            }
        },
    };
    let opens = read(opens_at, "opens_at");
    let closes = read(closes_at, "closes_at");
    let (opens, closes) = (opens?, closes?);
    if let (Some(opens), Some(closes)) = (opens, closes) {
        if closes.unix_us() <= opens.unix_us() {
            problems.report(
                at.key("closes_at"),
                format!(
                    "{} is not after opens_at {}: the route would never open",
                    closes.rfc3339(),
                    opens.rfc3339()
                ),
            );
            return None;
        }
    }
    Some((opens, closes))
}

/// `confirm_within`: more than 0 and no longer than `session_ttl` or
/// `abandon_after` (an unconfirmed place never outlives a confirmed one). The
/// default 30s shrinks to fit those when they are shorter.
fn confirm_within(
    value: Option<DurationText>,
    session_ttl: Duration,
    abandon_after: Duration,
    at: &FieldPath,
    problems: &mut Problems,
) -> Duration {
    let Some(DurationText(value)) = value else {
        return CONFIRM_WITHIN.min(session_ttl).min(abandon_after);
    };
    let at = at.key("confirm_within");
    if value.is_zero() {
        problems.report(at, "must be more than 0s");
    } else if value > session_ttl || value > abandon_after {
        let (name, limit) = if value > session_ttl {
            ("session_ttl", session_ttl)
        } else {
            ("abandon_after", abandon_after)
        };
        problems.report(
            at,
            format!(
                "{} is longer than {name} {}: an unconfirmed place must not outlive a confirmed one",
                show(value),
                show(limit)
            ),
        );
    }
    value
}

/// `lanes`: one to [`MAX_LANES`], each named once ([`is_lane_name`]) with a
/// weight of 1 to [`MAX_LANE_WEIGHT`] (default 1). Without the setting, one
/// lane, `main`.
fn lanes(raw: Option<Vec<RawLane>>, at: &FieldPath, problems: &mut Problems) -> Option<Vec<Lane>> {
    let Some(raw) = raw else {
        return Some(vec![Lane::main()]);
    };
    let at = at.key("lanes");
    if raw.is_empty() {
        problems.report(
            at,
            "give at least one lane, or leave `lanes` out for one lane, main",
        );
        return None;
    }
    if raw.len() > MAX_LANES {
        problems.report(at, format!("{} lanes: at most {MAX_LANES}", raw.len()));
        return None;
    }
    let mut lanes = Vec::with_capacity(raw.len());
    let mut ok = true;
    for (i, lane) in raw.into_iter().enumerate() {
        let at = at.index(i);
        let name = match lane.name {
            None => {
                problems.report(at.key("name"), "missing: every lane has a name");
                None
            }
            Some(name) if !is_lane_name(&name) => {
                problems.report(
                    at.key("name"),
                    format!(
                        "invalid lane name {name:?}: use 1 to {MAX_LANE_NAME_LEN} of a-z 0-9 _ -"
                    ),
                );
                None
            }
            Some(name) if lanes.iter().any(|l: &Lane| l.name == name) => {
                problems.report(at.key("name"), format!("lane {name:?} is named twice"));
                None
            }
            Some(name) => Some(name),
        };
        let weight = lane.weight.unwrap_or(1);
        if !(1..=MAX_LANE_WEIGHT).contains(&weight) {
            problems.report(
                at.key("weight"),
                format!("{weight} is out of range: use 1 to {MAX_LANE_WEIGHT}"),
            );
            ok = false;
        }
        match name {
            Some(name) => lanes.push(Lane { name, weight }),
            None => ok = false,
        }
    }
    ok.then_some(lanes)
}

/// `exit_paths`: absolute paths, normalised as `match.path_prefix` is so a
/// request path compares with them under the same rule.
fn exit_paths(raw: Vec<String>, at: &FieldPath, problems: &mut Problems) -> Option<Vec<String>> {
    let at = at.key("exit_paths");
    let mut paths = Vec::with_capacity(raw.len());
    for (i, path) in raw.into_iter().enumerate() {
        match normalise_prefix(&path) {
            Ok(path) => paths.push(Some(path)),
            Err(why) => {
                problems.report(at.index(i), format!("invalid exit path {path:?}: {why}"));
                paths.push(None);
            }
        }
    }
    paths.into_iter().collect()
}

fn route_match(raw: RawMatch, at: &FieldPath, problems: &mut Problems) -> Option<RouteMatch> {
    if raw.host.is_none() && raw.path_prefix.is_none() {
        problems.report(at.clone(), "give host and/or path_prefix");
        return None;
    }
    let host = match raw.host {
        None => Some(None),
        Some(host) => route_host(&host, &at.key("host"), problems).map(Some),
    };
    let path_prefix = match raw.path_prefix {
        None => Some(None),
        Some(prefix) => match normalise_prefix(&prefix) {
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
        case_insensitive: raw.case_insensitive.unwrap_or(false),
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
pub(crate) fn normalise_prefix(prefix: &str) -> Result<String, String> {
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

fn required<T>(value: Option<T>, at: &FieldPath, problems: &mut Problems) -> Option<T> {
    if value.is_none() {
        problems.report(at.clone(), "required");
    }
    value
}

fn required_path(
    value: Option<PathBuf>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<PathBuf> {
    match required(value, at, problems) {
        Some(path) if path.as_os_str().is_empty() => {
            problems.report(at.clone(), "must not be empty");
            None
        }
        other => other,
    }
}

fn duration(value: Option<DurationText>, default: Duration) -> Duration {
    value.map_or(default, |d| d.0)
}

fn positive(
    value: Option<DurationText>,
    default: Duration,
    at: &FieldPath,
    problems: &mut Problems,
) -> Duration {
    let value = duration(value, default);
    if value.is_zero() {
        problems.report(at.clone(), "must be more than 0s");
    }
    value
}

fn at_least(
    value: Option<DurationText>,
    default: Duration,
    min: Duration,
    min_text: &str,
    at: &FieldPath,
    problems: &mut Problems,
) -> Duration {
    let value = duration(value, default);
    if value < min {
        problems.report(
            at.clone(),
            format!("{} is too short: must be at least {min_text}", show(value)),
        );
    }
    value
}

/// A duration as an operator would write it.
fn show(duration: Duration) -> String {
    let micros = duration.as_micros();
    if micros.is_multiple_of(3_600_000_000) && micros > 0 {
        format!("{}h", micros / 3_600_000_000)
    } else if micros.is_multiple_of(60_000_000) && micros > 0 {
        format!("{}m", micros / 60_000_000)
    } else if micros.is_multiple_of(1_000_000) {
        format!("{}s", micros / 1_000_000)
    } else if micros.is_multiple_of(1000) {
        format!("{}ms", micros / 1000)
    } else {
        format!("{micros}us")
    }
}

/// Counts in this file are checked against small ranges; on a platform
/// whose `usize` cannot hold one, saturate rather than wrap.
fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "\
listen: [{ addr: 127.0.0.1:8080 }]
upstream: { url: http://127.0.0.1:3000 }
keys: [{ id: k1, env: QUEUEGATE_KEY_K1 }]
";

    fn parse(extra: &str) -> Result<Config, ConfigErrors> {
        Config::from_yaml(&format!("{BASE}{extra}"))
    }

    /// The paths of the problems `extra` causes, in file order.
    fn problem_paths(extra: &str) -> Vec<String> {
        match parse(extra) {
            Ok(config) => panic!("expected problems, got {config:?}"),
            Err(errors) => errors.errors.into_iter().map(|e| e.path).collect(),
        }
    }

    /// The warnings about the valid config `extra` makes.
    fn warnings(extra: &str) -> Vec<ConfigWarning> {
        match Config::from_yaml_with_warnings(&format!("{BASE}{extra}")) {
            Ok(loaded) => loaded.warnings,
            Err(errors) => panic!("expected a valid config: {errors}"),
        }
    }

    fn message_at(extra: &str, path: &str) -> String {
        let errors = parse(extra).expect_err("expected problems");
        match errors.at(path) {
            Some(error) => error.message.clone(),
            None => panic!("no problem at {path}: {errors}"),
        }
    }

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

    #[test]
    fn route_names_are_unique_and_cookie_safe() {
        let paths = problem_paths(
            "routes:\n  - { name: a, match: { path_prefix: /a }, capacity: 1 }\n  - { name: a, match: { path_prefix: /b }, capacity: 1 }\n  - { name: 'c.d', match: { path_prefix: /c }, capacity: 1 }\n  - { name: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, match: { path_prefix: /d }, capacity: 1 }\n",
        );
        assert_eq!(
            paths,
            ["routes[1].name", "routes[2].name", "routes[3].name"]
        );
    }

    #[test]
    fn a_route_inside_the_reserved_prefix_is_rejected() {
        let paths = problem_paths(
            "routes: [{ name: a, match: { path_prefix: /__queuegate/x }, capacity: 1 }]\n",
        );
        assert_eq!(paths, ["routes[0].match.path_prefix"]);
        parse("routes: [{ name: a, match: { path_prefix: /__queuegatex }, capacity: 1 }]\n")
            .unwrap();
    }

    #[test]
    fn route_numbers_and_durations_are_bounded() {
        let paths = problem_paths(
            "routes: [{ name: a, match: { path_prefix: /a }, capacity: 0, max_admit_per_tick: 0, tick: 9ms, pass_ttl: 1999ms, arrival_grace: 0s, abandon_after: 0ms, waiting_status: 600 }]\n",
        );
        assert_eq!(
            paths,
            [
                "routes[0].capacity",
                "routes[0].max_admit_per_tick",
                "routes[0].tick",
                "routes[0].pass_ttl",
                "routes[0].arrival_grace",
                "routes[0].abandon_after",
                "routes[0].waiting_status",
            ]
        );
    }

    #[test]
    fn a_session_must_outlive_its_pass() {
        let message = message_at(
            "routes: [{ name: a, match: { path_prefix: /a }, capacity: 1, session_ttl: 30s, pass_ttl: 1m }]\n",
            "routes[0].session_ttl",
        );
        assert!(
            message.starts_with("30s is shorter than pass_ttl 1m"),
            "{message}"
        );
    }

    #[test]
    fn waiting_status_takes_any_error_status() {
        let config = parse(
            "routes: [{ name: a, match: { path_prefix: /a }, capacity: 1, waiting_status: 428 }]\n",
        )
        .unwrap();
        assert_eq!(
            config.routes[0].waiting_status,
            http::StatusCode::PRECONDITION_REQUIRED
        );
        let paths = problem_paths(
            "routes: [{ name: a, match: { path_prefix: /a }, capacity: 1, waiting_status: 302 }]\n",
        );
        assert_eq!(paths, ["routes[0].waiting_status"]);
    }

    #[test]
    fn upstream_url_is_an_origin_only() {
        for (url, why) in [
            ("ftp://x.com", "scheme"),
            ("127.0.0.1:3000", "http://host:port"),
            ("http://x.com/app", "path"),
            ("http://x.com/?a=1", "query"),
            ("http://user:pw@x.com", "credentials"),
            ("http:///", "invalid upstream url"),
        ] {
            let text = format!(
                "listen: [{{ addr: 127.0.0.1:8080 }}]\nupstream: {{ url: '{url}' }}\nkeys: [{{ id: k1, env: K }}]\n"
            );
            let errors = Config::from_yaml(&text).expect_err(url);
            let message = &errors.at("upstream.url").expect(url).message;
            assert!(message.contains(why), "{url}: {message}");
        }
        let text = "listen: [{ addr: 127.0.0.1:8080 }]\nupstream: { url: 'https://[::1]:8443/' }\nkeys: [{ id: k1, env: K }]\n";
        let config = Config::from_yaml(text).unwrap();
        assert_eq!(config.upstream.url.scheme_str(), Some("https"));
    }

    #[test]
    fn upstream_url_is_required_and_ca_file_needs_https() {
        let text = "listen: [{ addr: 127.0.0.1:8080 }]\nupstream: { timeout: 5s }\nkeys: [{ id: k1, env: K }]\n";
        let errors = Config::from_yaml(text).unwrap_err();
        assert_eq!(errors.errors.len(), 1);
        assert_eq!(errors.errors[0].path, "upstream.url");
        assert_eq!(errors.errors[0].line, Some(2), "{errors}");
        let text = "listen: [{ addr: 127.0.0.1:8080 }]\nupstream: { url: http://a:1, ca_file: /ca.pem }\nkeys: [{ id: k1, env: K }]\n";
        assert!(Config::from_yaml(text)
            .unwrap_err()
            .at("upstream.ca_file")
            .is_some());
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

    #[test]
    fn keys_need_exactly_one_source_and_unique_ids() {
        let text = "listen: [{ addr: 127.0.0.1:8080 }]\nupstream: { url: http://a:1 }\nkeys:\n  - { id: k1 }\n  - { id: k2, env: A, file: /b }\n  - { id: k2, file: /c }\n  - { env: D }\n";
        let errors = Config::from_yaml(text).unwrap_err();
        let paths: Vec<&str> = errors.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["keys[0]", "keys[1]", "keys[2].id", "keys[3].id"]);
    }

    #[test]
    fn confirm_within_and_client_limits_default_and_are_checked() {
        let route = |extra: &str| {
            format!("routes: [{{ name: a, match: {{ path_prefix: /a }}, capacity: 1{extra} }}]\n")
        };
        let config = parse(&route("")).unwrap();
        assert_eq!(config.routes[0].confirm_within, Duration::from_secs(30));
        assert_eq!(config.routes[0].client_limits, ClientLimits::default());
        // The default shrinks to fit a shorter abandon_after.
        let config = parse(&route(", abandon_after: 10s")).unwrap();
        assert_eq!(config.routes[0].confirm_within, Duration::from_secs(10));
        let config = parse(&route(
            ", confirm_within: 5s, client_limits: { places: 0, joins_per_minute: 7 }",
        ))
        .unwrap();
        assert_eq!(config.routes[0].confirm_within, Duration::from_secs(5));
        assert_eq!(
            config.routes[0].client_limits,
            ClientLimits {
                places: 0,
                joins_per_minute: 7
            }
        );
        for bad in [
            ", confirm_within: 0s",
            ", confirm_within: 31s",
            ", confirm_within: 5m, abandon_after: 10m, session_ttl: 4m",
        ] {
            let errors = parse(&route(bad)).unwrap_err();
            let paths: Vec<&str> = errors.errors.iter().map(|e| e.path.as_str()).collect();
            assert_eq!(paths, ["routes[0].confirm_within"], "{bad}");
        }
        let errors = parse(&route(", client_limits: { place: 3 }")).unwrap_err();
        assert!(errors.to_string().contains("place"), "{errors}");
    }

    #[test]
    fn shards_default_to_one_and_are_checked() {
        let route = |extra: &str| {
            format!("routes: [{{ name: a, match: {{ path_prefix: /a }}, capacity: 1{extra} }}]\n")
        };
        let config = parse(&route("")).unwrap();
        assert_eq!(config.routes[0].shards, 1);
        let config = parse(&route(", shards: 3")).unwrap();
        assert_eq!(config.routes[0].shards, 3);
        for bad in [", shards: 0", ", shards: 17"] {
            assert_eq!(problem_paths(&route(bad)), ["routes[0].shards"], "{bad}");
        }
    }

    #[test]
    fn lanes_default_to_main_and_are_checked() {
        let route = |extra: &str| {
            format!("routes: [{{ name: a, match: {{ path_prefix: /a }}, capacity: 1{extra} }}]\n")
        };
        let config = parse(&route("")).unwrap();
        assert_eq!(config.routes[0].lanes, [Lane::main()]);
        let config = parse(&route(
            ", lanes: [{ name: main }, { name: vip, weight: 3 }]",
        ))
        .unwrap();
        assert_eq!(
            config.routes[0].lanes,
            [
                Lane::main(),
                Lane {
                    name: "vip".to_owned(),
                    weight: 3
                }
            ]
        );
        assert_eq!(problem_paths(&route(", lanes: []")), ["routes[0].lanes"]);
        assert_eq!(
            problem_paths(&route(
                ", lanes: [{ name: main }, { name: VIP }, { name: main }, { weight: 2 }, { name: b, weight: 0 }, { name: c, weight: 1001 }]"
            )),
            [
                "routes[0].lanes[1].name",
                "routes[0].lanes[2].name",
                "routes[0].lanes[3].name",
                "routes[0].lanes[4].weight",
                "routes[0].lanes[5].weight"
            ]
        );
        let nine = (0..9)
            .map(|i| format!("{{ name: l{i} }}"))
            .collect::<Vec<_>>()
            .join(", ");
        assert_eq!(
            problem_paths(&route(&format!(", lanes: [{nine}]"))),
            ["routes[0].lanes"]
        );
    }

    #[test]
    fn opening_times_are_rfc3339_with_an_offset_and_close_after_opening() {
        let route = |extra: &str| {
            format!("routes: [{{ name: a, match: {{ path_prefix: /a }}, capacity: 1{extra} }}]\n")
        };
        let config = parse(&route("")).unwrap();
        assert_eq!(config.routes[0].opens_at, None);
        assert_eq!(config.routes[0].closes_at, None);
        let config = parse(&route(
            ", opens_at: 2026-12-24T10:00:00+09:00, closes_at: '2026-12-24T02:00:00Z'",
        ))
        .unwrap();
        let opens = config.routes[0].opens_at.unwrap();
        assert_eq!(opens.unix_us(), 1_798_074_000_000_000);
        assert_eq!(opens.rfc3339(), "2026-12-24T10:00:00+09:00");
        assert_eq!(
            config.routes[0].closes_at.unwrap().unix_us(),
            1_798_077_600_000_000
        );
        for bad in [
            "2026-12-24 10:00",
            "2026-12-24T10:00:00",
            "tomorrow",
            "1969-12-31T23:59:59Z",
        ] {
            assert_eq!(
                problem_paths(&route(&format!(", opens_at: '{bad}'"))),
                ["routes[0].opens_at"],
                "{bad}"
            );
        }
        let message = message_at(
            &route(", opens_at: 2026-12-24T10:00:00+09:00, closes_at: 2026-12-24T01:00:00Z"),
            "routes[0].closes_at",
        );
        assert!(message.contains("not after opens_at"), "{message}");
        assert_eq!(
            problem_paths(&route(", opens_at: 12"))
                .into_iter()
                .filter(|p| p.contains("opens_at"))
                .count(),
            1
        );
    }

    #[test]
    fn exit_paths_and_max_requests_default_and_are_checked() {
        let route = |extra: &str| {
            format!("routes: [{{ name: a, match: {{ path_prefix: /a }}, capacity: 1{extra} }}]\n")
        };
        let config = parse(&route("")).unwrap();
        assert!(config.routes[0].exit_paths.is_empty());
        assert_eq!(config.routes[0].max_requests_per_session, None);
        // Exit paths are normalised as route prefixes are.
        let config = parse(&route(
            ", exit_paths: [/checkout//done/, '/a/%64one', /x/./y], max_requests_per_session: 1",
        ))
        .unwrap();
        assert_eq!(
            config.routes[0].exit_paths,
            ["/checkout/done", "/a/done", "/x/y"]
        );
        assert_eq!(config.routes[0].max_requests_per_session, Some(1));
        assert_eq!(
            problem_paths(&route(", max_requests_per_session: 0")),
            ["routes[0].max_requests_per_session"]
        );
        assert_eq!(
            problem_paths(&route(", exit_paths: [/ok, done, '/a?b', '/c%zz']")),
            [
                "routes[0].exit_paths[1]",
                "routes[0].exit_paths[2]",
                "routes[0].exit_paths[3]"
            ]
        );
        let errors = parse(&route(", max_requests_per_session: -1")).unwrap_err();
        assert!(
            errors.to_string().contains("max_requests_per_session"),
            "{errors}"
        );
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
                addr: DEFAULT_ADMIN_ADDR
            })
        );
        assert_eq!(
            parse("admin: {}\n").unwrap().admin,
            Some(Admin {
                addr: DEFAULT_ADMIN_ADDR
            })
        );
        assert_eq!(
            problem_paths("admin: { addr: 127.0.0.1:8080 }\n"),
            ["admin.addr"]
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

    #[test]
    fn cookie_domain_is_checked_and_lower_cased() {
        let config = parse("cookie: { domain: .Example.com }\n").unwrap();
        assert_eq!(config.cookie.domain.as_deref(), Some("example.com"));
        assert_eq!(
            problem_paths("cookie: { domain: 'a;b' }\n"),
            ["cookie.domain"]
        );
        assert_eq!(
            parse("cookie: {}\n").unwrap().cookie,
            CookieConfig::default()
        );
    }

    #[test]
    fn durations_read_back_as_written() {
        assert_eq!(show(Duration::from_secs(600)), "10m");
        assert_eq!(show(Duration::from_secs(7200)), "2h");
        assert_eq!(show(Duration::from_millis(1500)), "1500ms");
        assert_eq!(show(Duration::from_micros(250)), "250us");
        assert_eq!(show(Duration::ZERO), "0s");
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

    #[test]
    fn one_address_cannot_fill_a_short_line() {
        let route = |extra: &str| {
            format!(
                "routes:\n  - {{ name: r, match: {{ path_prefix: /r }}, capacity: 1{extra} }}\n"
            )
        };
        let config = parse(&route(", max_waiting: 5")).unwrap();
        assert_eq!(config.routes[0].client_limits.places, 1);
        let config = parse(&route(", max_waiting: 1000")).unwrap();
        assert_eq!(config.routes[0].client_limits.places, 20);
        let message = message_at(
            &route(", max_waiting: 5, client_limits: { places: 5 }"),
            "routes[0].client_limits.places",
        );
        assert!(message.contains("whole line"), "{message}");
        let config = parse(&route(", max_waiting: 5, client_limits: { places: 0 }")).unwrap();
        assert_eq!(config.routes[0].client_limits.places, 0);
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
