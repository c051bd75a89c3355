//! The per-request decision of DESIGN §1, steps 2–5, as a value: bypass rules,
//! route match on the normalised path, the local pass check, renewal, admit
//! now or join the line. Its only awaits are store calls; it never touches a
//! socket or a body.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use http::header::{HeaderMap, HeaderValue, COOKIE, HOST};
use http::Method;

use crate::admission::{self, Claims, KeyRing, Kind, Verdict, VisitorId};
use crate::clock::Clock;
use crate::config::{self, BypassRule, Mode, OnStoreError};
use crate::metrics::RouteMetrics;
use crate::queue::{
    Arrival, Guarded, Limits, MemoryStore, PassTimes, Place, Poll, QueueStore, StoreError,
    TicketTimes,
};

/// The client key passed to the store: none yet, so no per-client limit applies.
const UNKNOWN_CLIENT: &[u8] = &[];
use crate::waiting::page::Template;

/// Cookies queuegate sets are named `qg_<route>` (`__Host-qg_<route>` on TLS).
const COOKIE_PREFIX: &str = "qg_";
const HOST_PREFIX: &str = "__Host-";
/// A ticket cookie outlives any reasonable wait; the place itself is kept by
/// the store and by the score the ticket carries.
const TICKET_COOKIE_MAX_AGE_S: u64 = 7 * 24 * 3600;

/// Numbers one route's admitter keeps fresh for the gate and the waiting room.
#[derive(Debug, Default)]
pub struct RouteLive {
    /// The route's epoch in the store (µs), 0 until first seen.
    pub epoch_us: AtomicU64,
    /// People in line, at the last stats read.
    pub waiting: AtomicU64,
    /// Active sessions, at the last stats read.
    pub active: AtomicU64,
    /// Admissions per second × 1000, at the last stats read.
    pub admit_rate_milli: AtomicU64,
}

impl RouteLive {
    /// Admissions per second measured by the store.
    pub fn admit_rate(&self) -> f64 {
        self.admit_rate_milli.load(Ordering::Relaxed) as f64 / 1000.0
    }
}

/// A route ready for requests: its config, the store limits derived from it,
/// its cookie names and its live numbers.
#[derive(Debug)]
pub struct RouteRt {
    pub cfg: config::Route,
    pub limits: Limits,
    /// Limits of the in-process line used while the store is down (`local`).
    pub local_limits: Limits,
    cookie_plain: String,
    cookie_tls: String,
    prefix_folded: Option<String>,
    pub live: Arc<RouteLive>,
    /// The route's own waiting page template, if it has one.
    pub template: Option<Arc<Template>>,
    /// The route's metric handles.
    pub metrics: RouteMetrics,
}

impl RouteRt {
    pub fn new(
        cfg: config::Route,
        cookie: &config::CookieConfig,
        expected_instances: u64,
        live: Arc<RouteLive>,
        template: Option<Arc<Template>>,
        metrics: RouteMetrics,
    ) -> RouteRt {
        let limits = Limits {
            capacity: cfg.capacity,
            max_admit_per_tick: cfg.max_admit_per_tick,
            tick: cfg.tick,
            session_ttl: cfg.session_ttl,
            pass_ttl: cfg.pass_ttl,
            arrival_grace: cfg.arrival_grace,
            abandon_after: cfg.abandon_after,
            max_waiting: cfg.max_waiting,
            confirm_within: cfg.confirm_within,
            client_places: cfg.client_limits.places,
            client_joins_per_minute: cfg.client_limits.joins_per_minute,
        };
        let mut local_limits = limits.clone();
        local_limits.capacity = (cfg.capacity / expected_instances.max(1)).max(1);
        let cookie_plain = format!("{COOKIE_PREFIX}{}", cfg.name);
        let cookie_tls = if cookie.domain.is_some() {
            cookie_plain.clone()
        } else {
            format!("{HOST_PREFIX}{cookie_plain}")
        };
        let prefix_folded = match (&cfg.matcher.path_prefix, cfg.matcher.case_insensitive) {
            (Some(p), true) => Some(p.to_ascii_lowercase()),
            _ => None,
        };
        RouteRt {
            cfg,
            limits,
            local_limits,
            cookie_plain,
            cookie_tls,
            prefix_folded,
            live,
            template,
            metrics,
        }
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// The cookie name for a request over TLS or not.
    pub fn cookie_name(&self, tls: bool) -> &str {
        if tls {
            &self.cookie_tls
        } else {
            &self.cookie_plain
        }
    }

    fn matches(&self, host: Option<&str>, path: &str) -> bool {
        let m = &self.cfg.matcher;
        if let Some(want) = &m.host {
            match host {
                Some(h) if h.eq_ignore_ascii_case(want) => {}
                _ => return false,
            }
        }
        match &m.path_prefix {
            None => true,
            Some(prefix) => match &self.prefix_folded {
                Some(folded) => prefix_matches(&path.to_ascii_lowercase(), folded),
                None => prefix_matches(path, prefix),
            },
        }
    }
}

/// A prefix matches on a segment boundary: `/tickets` matches `/tickets` and
/// `/tickets/…`, not `/ticketsale`.
fn prefix_matches(path: &str, prefix: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Everything the gate reads per request that a config reload replaces.
pub struct Settings {
    pub routes: Vec<RouteRt>,
    pub bypass: Vec<BypassRule>,
    pub ring: KeyRing,
    pub reserved_prefix: String,
    pub cookie_domain: Option<String>,
    /// Different for every `Settings` the process builds (see
    /// [`Settings::next_generation`]): what a [`CookieMemo`] read under one
    /// key ring is not reused under another.
    pub generation: u64,
}

impl Settings {
    /// A generation number no earlier `Settings` of this process had.
    pub fn next_generation() -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether a bypass rule lets the request through at once.
    pub fn bypassed(&self, method: &Method, path: &str) -> bool {
        self.bypass.iter().any(|rule| match rule {
            BypassRule::Method(m) => m == method,
            BypassRule::Path(p) => p == path,
            BypassRule::PathPrefix(p) => path.starts_with(p.as_str()),
        })
    }

    /// The first route whose match fits, by index.
    pub fn route_for(&self, host: Option<&str>, path: &str) -> Option<usize> {
        self.routes.iter().position(|r| r.matches(host, path))
    }

    /// The route named `name`.
    pub fn route_named(&self, name: &str) -> Option<usize> {
        self.routes.iter().position(|r| r.name() == name)
    }
}

/// How a visitor came to be let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// A valid pass in the first half of its life: no store call.
    Pass,
    /// A pass renewed through the store.
    Renewed,
    /// A pass renewed locally because the store could not answer.
    RenewedLocally,
    /// Admitted at once on arrival.
    AtOnce,
    /// Admitted from the line.
    FromLine,
    /// Let through without a pass: the store is down and the route fails open.
    FailOpen,
    /// The route is in `passthrough` mode.
    Passthrough,
}

/// What the gate decided for a request to a gated route.
#[derive(Debug)]
pub enum Decision {
    /// Forward, setting `set_cookie` (a fresh pass) when present.
    Admit {
        how: Admitted,
        set_cookie: Option<HeaderValue>,
    },
    /// Send to the waiting room.
    Wait {
        place: Place,
        set_cookie: Option<HeaderValue>,
    },
    /// The line is full: nobody was queued.
    Full { waiting_total: u64 },
    /// The route is closed.
    Closed,
    /// The store is down and the route's policy is `closed`.
    Unavailable,
}

/// The gate: the store (behind its circuit breaker), the clock and the
/// in-process line that stands in for the store while it is down.
#[derive(Clone)]
pub struct Gate {
    pub store: Guarded,
    pub local: MemoryStore,
    pub clock: Clock,
}

/// The credentials a request carries for one route.
#[derive(Default, Debug, Clone, Copy)]
pub struct Credentials {
    pub pass: Option<Claims>,
    pub ticket: Option<Claims>,
}

impl Gate {
    pub fn new(store: Guarded, clock: Clock) -> Gate {
        Gate {
            store,
            local: MemoryStore::new(clock),
            clock,
        }
    }

    /// Decides a request to gated route `index` of `s` (DESIGN §1 step 4).
    /// `creds` reads the request's credentials for that route (usually
    /// [`CookieMemo::read`]); it is not called for a passthrough or closed
    /// route, which needs none.
    ///
    /// Every branch that calls the store is boxed: a store call's future is
    /// kilobytes, and unboxed it would be the size of every request's
    /// future, copied on each request and held by each keep-alive
    /// connection while it is idle. The admitted path allocates nothing.
    pub async fn decide(
        &self,
        s: &Settings,
        index: usize,
        tls: bool,
        creds: impl FnOnce() -> Credentials,
    ) -> Decision {
        let route = &s.routes[index];
        match route.cfg.mode {
            Mode::Passthrough => {
                return Decision::Admit {
                    how: Admitted::Passthrough,
                    set_cookie: None,
                }
            }
            Mode::Closed => return Decision::Closed,
            Mode::Gate | Mode::QueueAll => {}
        }
        let creds = creds();
        if let Some(pass) = creds.pass {
            if let Some(decision) = self.check_pass(s, route, &pass, tls).await {
                return decision;
            }
        } else if let Some(ticket) = creds.ticket {
            if let Some(decision) = Box::pin(self.check_ticket(s, route, &ticket, tls)).await {
                return decision;
            }
        }
        Box::pin(self.arrive(s, route, tls)).await
    }

    /// A pass: forward while fresh; past half its life renew it through the
    /// store. `None` means the session is gone: treat as no cookie.
    pub async fn check_pass(
        &self,
        s: &Settings,
        route: &RouteRt,
        pass: &Claims,
        tls: bool,
    ) -> Option<Decision> {
        let now_s = self.clock.now_s();
        let ttl_s = route.limits.pass_ttl.as_secs();
        let issued_s = pass.t.saturating_sub(ttl_s);
        let epoch_s = route.live.epoch_us.load(Ordering::Relaxed) / 1_000_000;
        let before_epoch = epoch_s > 0 && issued_s < epoch_s;
        if now_s < issued_s + ttl_s / 2 && !before_epoch {
            return Some(Decision::Admit {
                how: Admitted::Pass,
                set_cookie: None,
            });
        }
        // The pass carries whole seconds and no confirmation yet: as before,
        // a pass is taken as confirmed and issued at the start of its second.
        let times = PassTimes {
            issued_ms: issued_s.saturating_mul(1_000),
            confirmed: true,
        };
        let renewed = Box::pin(self.store.renew(
            route.name(),
            &pass.id,
            UNKNOWN_CLIENT,
            times,
            &route.limits,
        ))
        .await;
        let how = match renewed {
            Ok(true) => Admitted::Renewed,
            Ok(false) => return None,
            Err(err) => {
                // Admitted visitors never depend on the store, but a pass long
                // past its session is not revived.
                if now_s > pass.t + route.limits.session_ttl.as_secs() {
                    return None;
                }
                tracing::debug!(route = route.name(), error = %err, "pass renewed locally");
                Admitted::RenewedLocally
            }
        };
        Some(Decision::Admit {
            how,
            set_cookie: Some(self.pass_cookie(s, route, &pass.id, tls)),
        })
    }

    /// A ticket: poll the line (a heartbeat). `None` means the place is gone.
    pub async fn check_ticket(
        &self,
        s: &Settings,
        route: &RouteRt,
        ticket: &Claims,
        tls: bool,
    ) -> Option<Decision> {
        // The ticket does not carry its last poll yet: taken as seen now,
        // which restores what was restored before.
        let times = TicketTimes {
            score_us: ticket.t,
            seen_us: self.clock.now_us(),
        };
        let polled = match self
            .store
            .poll(
                route.name(),
                &ticket.id,
                UNKNOWN_CLIENT,
                times,
                &route.limits,
            )
            .await
        {
            Ok(p) => p,
            Err(err) => match route.cfg.on_store_error {
                OnStoreError::Local => {
                    tracing::debug!(route = route.name(), error = %err, "polling the local line");
                    self.local
                        .poll(
                            route.name(),
                            &ticket.id,
                            UNKNOWN_CLIENT,
                            times,
                            &route.local_limits,
                        )
                        .await
                        .ok()?
                }
                _ => return Some(self.store_failed(route, &err)),
            },
        };
        match polled {
            Poll::Waiting(place) => Some(Decision::Wait {
                place,
                set_cookie: None,
            }),
            Poll::Admitted => Some(Decision::Admit {
                how: Admitted::FromLine,
                set_cookie: Some(self.pass_cookie(s, route, &ticket.id, tls)),
            }),
            Poll::Gone => None,
        }
    }

    /// No usable cookie: admit at once or join the line.
    pub async fn arrive(&self, s: &Settings, route: &RouteRt, tls: bool) -> Decision {
        let id = admission::new_visitor_id();
        let admit_now = route.cfg.mode == Mode::Gate;
        let arrival = match self
            .store
            .arrive(route.name(), &id, UNKNOWN_CLIENT, &route.limits, admit_now)
            .await
        {
            Ok(a) => a,
            Err(err) => match route.cfg.on_store_error {
                OnStoreError::Local => match self
                    .local
                    .arrive(
                        route.name(),
                        &id,
                        UNKNOWN_CLIENT,
                        &route.local_limits,
                        admit_now,
                    )
                    .await
                {
                    Ok(a) => a,
                    Err(local_err) => return self.store_failed(route, &local_err),
                },
                _ => return self.store_failed(route, &err),
            },
        };
        match arrival {
            Arrival::Admitted => Decision::Admit {
                how: Admitted::AtOnce,
                set_cookie: Some(self.pass_cookie(s, route, &id, tls)),
            },
            Arrival::Waiting(place) => Decision::Wait {
                place,
                set_cookie: Some(self.ticket_cookie(s, route, &id, place.score_us, tls)),
            },
            Arrival::Full { waiting_total } => Decision::Full { waiting_total },
            // Only a known client can be over its limits, and the gate names
            // none yet; like a full line, nobody was queued.
            Arrival::TooMany { .. } => Decision::Full { waiting_total: 0 },
        }
    }

    fn store_failed(&self, route: &RouteRt, err: &StoreError) -> Decision {
        tracing::warn!(route = route.name(), error = %err, policy = ?route.cfg.on_store_error, "store unavailable");
        match route.cfg.on_store_error {
            OnStoreError::Open => Decision::Admit {
                how: Admitted::FailOpen,
                set_cookie: None,
            },
            OnStoreError::Closed | OnStoreError::Local => Decision::Unavailable,
        }
    }

    /// A fresh pass for `id`, as a `Set-Cookie` value.
    pub fn pass_cookie(
        &self,
        s: &Settings,
        route: &RouteRt,
        id: &VisitorId,
        tls: bool,
    ) -> HeaderValue {
        let expiry = self.clock.now_s() + route.limits.pass_ttl.as_secs();
        let value = s.ring.sign(Kind::Pass, route.name(), id, expiry);
        let max_age = route.limits.session_ttl.as_secs() + route.limits.pass_ttl.as_secs();
        set_cookie(
            route.cookie_name(tls),
            &value,
            max_age,
            tls,
            s.cookie_domain.as_deref(),
        )
    }

    /// A ticket for `id` at join score `score_us`, as a `Set-Cookie` value.
    pub fn ticket_cookie(
        &self,
        s: &Settings,
        route: &RouteRt,
        id: &VisitorId,
        score_us: u64,
        tls: bool,
    ) -> HeaderValue {
        let value = s.ring.sign(Kind::Ticket, route.name(), id, score_us);
        set_cookie(
            route.cookie_name(tls),
            &value,
            TICKET_COOKIE_MAX_AGE_S,
            tls,
            s.cookie_domain.as_deref(),
        )
    }
}

/// A `Set-Cookie` value that removes the route's cookie.
pub fn clear_cookie(s: &Settings, route: &RouteRt, tls: bool) -> HeaderValue {
    set_cookie(
        route.cookie_name(tls),
        "",
        0,
        tls,
        s.cookie_domain.as_deref(),
    )
}

fn set_cookie(
    name: &str,
    value: &str,
    max_age_s: u64,
    tls: bool,
    domain: Option<&str>,
) -> HeaderValue {
    let mut text = format!("{name}={value}; Path=/; Max-Age={max_age_s}; HttpOnly; SameSite=Lax");
    if tls {
        text.push_str("; Secure");
    }
    if let Some(domain) = domain {
        text.push_str("; Domain=");
        text.push_str(domain);
    }
    // Names, values and the domain are validated ASCII, so this holds.
    HeaderValue::from_str(&text)
        .unwrap_or_else(|_| HeaderValue::from_static("qg_invalid=; Max-Age=0"))
}

/// Every `name=value` pair in the request's `Cookie` headers.
fn cookie_pairs(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            Some((name.trim(), value.trim()))
        })
}

/// The first valid pass and the first valid ticket the request carries for
/// `route` under cookie `name`. Invalid copies are ignored.
pub fn credentials(headers: &HeaderMap, name: &str, ring: &KeyRing, route: &str) -> Credentials {
    let mut found = Credentials::default();
    for (n, value) in cookie_pairs(headers) {
        if n != name {
            continue;
        }
        if let Verdict::Valid(claims) = ring.verify(value, route) {
            match claims.kind {
                Kind::Pass if found.pass.is_none() => found.pass = Some(claims),
                Kind::Ticket if found.ticket.is_none() => found.ticket = Some(claims),
                _ => {}
            }
        }
    }
    found
}

/// A connection's last `Cookie` header and the credentials read from it for
/// one route. A browser sends the same cookies with every request on a
/// keep-alive connection (and on every HTTP/2 stream), so their MACs are
/// checked when the header changes instead of on every request. The key is
/// the header's exact bytes, the route and the settings generation (a reload
/// may bring another key ring), so a remembered answer is the one checking
/// again would give. Expiry and the store are still consulted per request.
/// A header longer than [`CookieMemo::MAX_KEPT`] is checked every time
/// rather than kept on an idle connection.
#[derive(Default)]
pub struct CookieMemo(Mutex<Option<Memo>>);

struct Memo {
    generation: u64,
    route: usize,
    tls: bool,
    cookie: Vec<u8>,
    found: Credentials,
}

impl CookieMemo {
    /// The longest `Cookie` header remembered, in bytes.
    pub const MAX_KEPT: usize = 2048;

    /// [`credentials`] for route `index` of `s`, remembered for the next
    /// request whose single `Cookie` header is the same.
    pub fn read(&self, s: &Settings, index: usize, headers: &HeaderMap, tls: bool) -> Credentials {
        let route = &s.routes[index];
        let read = || credentials(headers, route.cookie_name(tls), &s.ring, route.name());
        let mut values = headers.get_all(COOKIE).iter();
        let (Some(cookie), None) = (values.next(), values.next()) else {
            // No cookies: nothing to check. Several headers: rare, not kept.
            return read();
        };
        if cookie.len() > Self::MAX_KEPT {
            return read();
        }
        let cookie = cookie.as_bytes();
        let mut memo = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = memo.as_ref() {
            if m.generation == s.generation
                && m.route == index
                && m.tls == tls
                && m.cookie == cookie
            {
                return m.found;
            }
        }
        let found = read();
        match memo.as_mut() {
            Some(m) => {
                m.generation = s.generation;
                m.route = index;
                m.tls = tls;
                m.cookie.clear();
                m.cookie.extend_from_slice(cookie);
                m.found = found;
            }
            None => {
                *memo = Some(Memo {
                    generation: s.generation,
                    route: index,
                    tls,
                    cookie: cookie.to_vec(),
                    found,
                })
            }
        }
        found
    }
}

/// Removes queuegate's own cookies from the `Cookie` headers, so the origin
/// never sees them.
pub fn strip_own_cookies(headers: &mut HeaderMap) {
    let has_own = headers
        .get_all(COOKIE)
        .iter()
        .any(|v| memchr::memmem::find(v.as_bytes(), COOKIE_PREFIX.as_bytes()).is_some());
    if !has_own {
        return;
    }
    // One string for what is kept; nothing is allocated when only our own
    // cookies were sent.
    let mut kept = String::new();
    let pairs = headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim);
    for pair in pairs {
        let name = pair.split_once('=').map_or(pair, |(n, _)| n).trim();
        if pair.is_empty() || is_own_cookie(name) {
            continue;
        }
        if !kept.is_empty() {
            kept.push_str("; ");
        }
        kept.push_str(pair);
    }
    headers.remove(COOKIE);
    if !kept.is_empty() {
        if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(kept)) {
            headers.insert(COOKIE, v);
        }
    }
}

fn is_own_cookie(name: &str) -> bool {
    let name = name.strip_prefix(HOST_PREFIX).unwrap_or(name);
    name.starts_with(COOKIE_PREFIX)
}

/// The host a request is for, without the port.
pub fn request_host<'a>(headers: &'a HeaderMap, uri: &'a http::Uri) -> Option<&'a str> {
    let raw = match headers.get(HOST).and_then(|h| h.to_str().ok()) {
        Some(h) => h,
        None => uri.host()?,
    };
    if raw.starts_with('[') {
        return Some(
            raw.split_once(']')
                .map_or(raw, |(h, _)| h)
                .trim_start_matches('['),
        );
    }
    let host = raw.rsplit_once(':').map_or(raw, |(h, _)| h);
    // `shop.example.` names the same host as `shop.example`.
    Some(host.strip_suffix('.').unwrap_or(host))
}

/// Normalises a request path for matching (DESIGN §1 step 3): percent-encoded
/// unreserved characters decoded, repeated slashes collapsed, dot segments
/// resolved. The request line itself is forwarded unchanged.
pub fn normalize_path(raw: &str) -> Cow<'_, str> {
    let needs_work =
        raw.contains('%') || raw.contains("//") || raw.contains("/.") || !raw.starts_with('/');
    if !needs_work {
        return Cow::Borrowed(raw);
    }
    let decoded = decode_unreserved(raw);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || (decoded.ends_with('/') && !segments.is_empty()) {
        out.push('/');
    }
    Cow::Owned(out)
}

fn decode_unreserved(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                let c = (h * 16 + l) as u8;
                if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                    out.push(c as char);
                } else {
                    // Other escapes stay encoded, in one spelling.
                    out.push('%');
                    out.push(bytes[i + 1].to_ascii_uppercase() as char);
                    out.push(bytes[i + 2].to_ascii_uppercase() as char);
                }
                i += 3;
                continue;
            }
        }
        // Copy one UTF-8 character (the path is a valid &str).
        let ch_len = raw[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&raw[i..i + ch_len]);
        i += ch_len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_for_matching() {
        assert_eq!(normalize_path("/tickets"), "/tickets");
        assert_eq!(normalize_path("/x/../tickets"), "/tickets");
        assert_eq!(normalize_path("//tickets"), "/tickets");
        assert_eq!(normalize_path("/%74ickets/a"), "/tickets/a");
        assert_eq!(normalize_path("/./tickets/./b/"), "/tickets/b/");
        assert_eq!(normalize_path("/../../tickets"), "/tickets");
        assert_eq!(normalize_path("/a%2Fb"), "/a%2Fb");
        assert_eq!(normalize_path("/a%2fb"), "/a%2Fb");
        assert_eq!(normalize_path("/.."), "/");
        assert_eq!(normalize_path("/%"), "/%");
        assert_eq!(normalize_path("/%7"), "/%7");
    }

    #[test]
    fn prefixes_match_on_segment_boundaries() {
        assert!(prefix_matches("/tickets", "/tickets"));
        assert!(prefix_matches("/tickets/1", "/tickets"));
        assert!(!prefix_matches("/ticketsale", "/tickets"));
        assert!(prefix_matches("/anything", "/"));
    }

    #[test]
    fn own_cookies_are_stripped_and_others_kept() {
        let mut h = HeaderMap::new();
        h.append(
            COOKIE,
            HeaderValue::from_static("a=1; qg_tickets=v1.x; b=2"),
        );
        h.append(COOKIE, HeaderValue::from_static("__Host-qg_tickets=v1.y"));
        strip_own_cookies(&mut h);
        let all: Vec<_> = h.get_all(COOKIE).iter().collect();
        assert_eq!(all, vec!["a=1; b=2"]);
        let mut h = HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("qg_a=1"));
        strip_own_cookies(&mut h);
        assert!(h.get(COOKIE).is_none());
    }

    #[test]
    fn host_without_port() {
        let uri: http::Uri = "/".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert(HOST, HeaderValue::from_static("Shop.example:8080"));
        assert_eq!(request_host(&h, &uri), Some("Shop.example"));
        h.insert(HOST, HeaderValue::from_static("shop.example.:8080"));
        assert_eq!(request_host(&h, &uri), Some("shop.example"));
        h.insert(HOST, HeaderValue::from_static("[::1]:8080"));
        assert_eq!(request_host(&h, &uri), Some("::1"));
    }
}
