//! Every Prometheus metric queuegate exports: one `Metrics` struct, passed by
//! `Arc`, no globals. Per-route handles (`RouteMetrics`) are resolved once when
//! the settings are built, so a request only bumps an atomic; the server's
//! connection handles (`ConnectionMetrics`) likewise, once at start.
//!
//! The names are a contract: the Grafana dashboard and the alert rules in
//! `deploy/` query them. Counters are registered without `_total`; the encoder
//! adds it.

use crate::health::Direction;
use crate::queue::breaker::{Breaker, Operation};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};
use std::sync::atomic::AtomicU64;

use crate::queue::{Lanes, Tick};

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Wait in line, join → admitted: seconds to hours.
const WAIT_BUCKETS: [f64; 14] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0,
    28800.0,
];

/// Origin response head: milliseconds to a minute.
const UPSTREAM_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LaneLabels {
    route: String,
    lane: String,
}

/// The per-lane series, and which exist (so a route's can be dropped).
#[derive(Debug)]
struct LaneFamilies {
    waiting: Family<LaneLabels, Gauge>,
    admitted: Family<LaneLabels, Counter>,
    wait: Family<LaneLabels, Histogram, fn() -> Histogram>,
    made: std::sync::Mutex<std::collections::HashSet<LaneLabels>>,
}

impl Default for LaneFamilies {
    fn default() -> Self {
        LaneFamilies {
            waiting: Family::default(),
            admitted: Family::default(),
            wait: Family::new_with_constructor(wait_histogram),
            made: std::sync::Mutex::default(),
        }
    }
}

impl LaneFamilies {
    fn labels(&self, route: &str, lane: &str) -> LaneLabels {
        let labels = LaneLabels {
            route: route.to_owned(),
            lane: lane.to_owned(),
        };
        self.made
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(labels.clone());
        labels
    }

    fn forget_route(&self, route: &str) {
        let mut made = self
            .made
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        made.retain(|labels| {
            if labels.route != route {
                return true;
            }
            self.waiting.remove(labels);
            self.admitted.remove(labels);
            self.wait.remove(labels);
            false
        });
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmittedLabels {
    route: String,
    how: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectedLabels {
    route: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UnconfirmedLabels {
    route: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PollLabels {
    route: String,
    answered_by: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndedLabels {
    route: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    route: String,
    result: &'static str,
}

/// What a micro-cache did for a request (DESIGN §9.3), as labelled in
/// `queuegate_cache_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheResult {
    /// Answered from a kept answer.
    Hit,
    /// Sent to the origin (first of its key, a refresh, released by the
    /// flight it waited for, or a `HEAD` found nothing).
    Miss,
    /// Answered with the answer another request fetched meanwhile.
    Coalesced,
    /// Not for the cache: not a plain `GET` or `HEAD`, a `Range`, an
    /// `Authorization`.
    Bypass,
}

impl CacheResult {
    /// Every result, in label order.
    pub const ALL: [CacheResult; 4] = [
        CacheResult::Hit,
        CacheResult::Miss,
        CacheResult::Coalesced,
        CacheResult::Bypass,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CacheResult::Hit => "hit",
            CacheResult::Miss => "miss",
            CacheResult::Coalesced => "coalesced",
            CacheResult::Bypass => "bypass",
        }
    }
}

/// One cache's handles: its counters, by [`CacheResult`] in the order of
/// [`CacheResult::ALL`], and the requests waiting for another's fetch.
#[derive(Clone, Debug)]
pub struct CacheCounts {
    results: [Counter; 4],
    waiting: Gauge,
}

impl CacheCounts {
    pub fn count(&self, result: CacheResult) {
        self.results[result as usize].inc();
    }

    /// Counts a request waiting for another's fetch until the guard is
    /// dropped.
    pub fn waiting(&self) -> Counted {
        Counted::new(&self.waiting)
    }
}

/// Why a session was ended before it expired (DESIGN §8.6), as labelled in
/// `queuegate_sessions_ended_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// The origin answered with `Queuegate-Command: end-session`.
    Origin,
    /// The request was for one of the route's `exit_paths`.
    ExitPath,
    /// The session made its `max_requests_per_session` forwarded requests.
    MaxRequests,
}

impl SessionEnd {
    /// Every reason, in label order.
    pub const ALL: [SessionEnd; 3] = [
        SessionEnd::Origin,
        SessionEnd::ExitPath,
        SessionEnd::MaxRequests,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SessionEnd::Origin => "origin",
            SessionEnd::ExitPath => "exit_path",
            SessionEnd::MaxRequests => "max_requests",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamRefusedLabels {
    route: String,
    reason: &'static str,
}

/// Which cap an event stream was refused by (DESIGN §8.8), as labelled in
/// `queuegate_event_streams_refused_total`: the page is told to poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamCap {
    /// `limits.max_event_streams` streams are open on the route here.
    Route,
    /// The visitor (the ticket's id) has as many open here as one may.
    Visitor,
    /// The client (its address) has `limits.max_event_streams_per_client`
    /// open here, on any routes.
    Client,
}

impl StreamCap {
    /// Every cap, in label order.
    pub const ALL: [StreamCap; 3] = [StreamCap::Route, StreamCap::Visitor, StreamCap::Client];

    pub fn as_str(self) -> &'static str {
        match self {
            StreamCap::Route => "route",
            StreamCap::Visitor => "visitor",
            StreamCap::Client => "client",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    route: String,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabel {
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabel {
    protocol: &'static str,
}

/// What a client connection speaks: the `protocol` label of
/// `queuegate_connections`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1, parked or not.
    Http1,
    Http2,
    /// An upgraded connection (WebSocket and the like), while its tunnel to
    /// the origin is open.
    Tunnel,
}

impl Protocol {
    const ALL: [Protocol; 3] = [Protocol::Http1, Protocol::Http2, Protocol::Tunnel];

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "h1",
            Protocol::Http2 => "h2",
            Protocol::Tunnel => "tunnel",
        }
    }
}

/// How a request was answered: the `decision` label of
/// `queuegate_requests_total` and of the per-request log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No route matched: forwarded ungated.
    Forwarded,
    /// A bypass rule matched.
    Bypass,
    Pass,
    Renewed,
    RenewedLocally,
    AtOnce,
    FromLine,
    FailOpen,
    Passthrough,
    /// Sent to the waiting room.
    Held,
    Full,
    /// Over the client's limits (DESIGN §8.3).
    TooMany,
    Closed,
    StoreDown,
    /// A pass whose session made its `max_requests_per_session` requests:
    /// not forwarded (DESIGN §8.6).
    UsedUp,
    /// A navigation that carried an invite (DESIGN §8.5): sent to the same
    /// target without it, with the lane cookie when the invite was honoured.
    Invite,
    /// One of queuegate's own paths.
    Reserved,
    /// Admitted, but the route's requests in flight to the origin were at
    /// its `max_inflight` past `inflight_wait`: answered busy (DESIGN §9.2).
    Busy,
    /// The client went away before it was answered (the request's work
    /// stopped there, except an exchange that may end a session, which goes
    /// on to the origin's answer).
    ClientGone,
    /// Refused before any decision: ambiguous framing or path, a missing or
    /// malformed Host, a host not served here; or, whatever the decision, a
    /// body found unreadable while it was relayed to the origin.
    BadRequest,
}

impl Outcome {
    const ALL: [Outcome; 20] = [
        Outcome::Forwarded,
        Outcome::Bypass,
        Outcome::Pass,
        Outcome::Renewed,
        Outcome::RenewedLocally,
        Outcome::AtOnce,
        Outcome::FromLine,
        Outcome::FailOpen,
        Outcome::Passthrough,
        Outcome::Held,
        Outcome::Full,
        Outcome::TooMany,
        Outcome::Closed,
        Outcome::StoreDown,
        Outcome::UsedUp,
        Outcome::Invite,
        Outcome::Reserved,
        Outcome::Busy,
        Outcome::ClientGone,
        Outcome::BadRequest,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Bypass => "bypass",
            Outcome::Pass => "pass",
            Outcome::Renewed => "renewed",
            Outcome::RenewedLocally => "renewed_locally",
            Outcome::AtOnce => "at_once",
            Outcome::FromLine => "from_line",
            Outcome::FailOpen => "fail_open",
            Outcome::Passthrough => "passthrough",
            Outcome::Held => "held",
            Outcome::Full => "full",
            Outcome::TooMany => "too_many",
            Outcome::Closed => "closed",
            Outcome::StoreDown => "store_down",
            Outcome::UsedUp => "used_up",
            Outcome::Invite => "invite",
            Outcome::Reserved => "reserved",
            Outcome::Busy => "busy",
            Outcome::ClientGone => "client_gone",
            Outcome::BadRequest => "bad_request",
        }
    }
}

/// Every metric queuegate exports, with the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    waiting: Family<RouteLabel, Gauge>,
    active: Family<RouteLabel, Gauge>,
    capacity: Family<RouteLabel, Gauge>,
    admitted: Family<AdmittedLabels, Counter>,
    lanes: std::sync::Arc<LaneFamilies>,
    rejected: Family<RejectedLabels, Counter>,
    held: Family<RouteLabel, Counter>,
    eta: Family<RouteLabel, Gauge<f64, AtomicU64>>,
    inversions: Family<RouteLabel, Counter>,
    abandoned: Family<RouteLabel, Counter>,
    no_show: Family<RouteLabel, Counter>,
    unconfirmed: Family<UnconfirmedLabels, Counter>,
    sessions_ended: Family<EndedLabels, Counter>,
    polls: Family<PollLabels, Counter>,
    event_streams: Family<RouteLabel, Gauge>,
    streams_refused: Family<StreamRefusedLabels, Counter>,
    fail_open: Family<RouteLabel, Counter>,
    client_gone: Family<RouteLabel, Counter>,
    origin: OriginMetrics,
    store_calls: Family<OperationLabel, Counter>,
    store_errors: Family<OperationLabel, Counter>,
    breaker_state: Gauge,
    upstream_duration: Histogram,
    upstream_error: Counter,
    upstream_timeout: Counter,
    reload_ok: Counter,
    reload_error: Counter,
    /// One counter per [`Outcome`], in `Outcome::ALL` order.
    requests: Vec<Counter>,
    connections: ConnectionMetrics,
    inflight: InflightMetrics,
    cache: Family<CacheLabels, Counter>,
    cache_waiting: Family<RouteLabel, Gauge>,
    cache_bytes: Gauge<i64, std::sync::atomic::AtomicI64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh set of metrics, every series that a rate query needs to see at
    /// zero already created. They are registered (and so exported) in the
    /// order of the groups here.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let LineMetrics {
            waiting,
            active,
            capacity,
            admitted,
            lanes,
            rejected,
            held,
            eta,
            inversions,
        } = LineMetrics::register(&mut registry);
        let WaiterMetrics {
            abandoned,
            no_show,
            unconfirmed,
            sessions_ended,
            polls,
            event_streams,
            streams_refused,
            client_gone,
        } = WaiterMetrics::register(&mut registry);
        let origin = OriginMetrics::register(&mut registry);
        let BackendMetrics {
            store_calls,
            store_errors,
            breaker_state,
            upstream_duration,
            upstream_errors,
            reloads,
            fail_open,
        } = BackendMetrics::register(&mut registry);
        let (requests, connections) = register_traffic(&mut registry);
        let inflight = InflightMetrics::register(&mut registry);
        let (cache, cache_waiting, cache_bytes) = register_cache(&mut registry);
        Metrics {
            registry,
            waiting,
            active,
            capacity,
            admitted,
            lanes,
            rejected,
            held,
            eta,
            inversions,
            abandoned,
            no_show,
            unconfirmed,
            sessions_ended,
            polls,
            event_streams,
            streams_refused,
            fail_open,
            client_gone,
            origin,
            store_calls,
            store_errors,
            breaker_state,
            upstream_duration,
            upstream_error: upstream_errors.get_or_create_owned(&KindLabel { kind: "error" }),
            upstream_timeout: upstream_errors.get_or_create_owned(&KindLabel { kind: "timeout" }),
            reload_ok: reloads.get_or_create_owned(&ResultLabel { result: "ok" }),
            reload_error: reloads.get_or_create_owned(&ResultLabel { result: "error" }),
            requests,
            connections,
            inflight,
            cache,
            cache_waiting,
            cache_bytes,
        }
    }

    /// The counters of the micro-cache named `name` (a route's, or a
    /// bypass rule's), created at zero when missing.
    pub fn cache(&self, name: &str) -> CacheCounts {
        CacheCounts {
            results: CacheResult::ALL.map(|result| {
                self.cache.get_or_create_owned(&CacheLabels {
                    route: name.to_owned(),
                    result: result.as_str(),
                })
            }),
            waiting: self.cache_waiting.get_or_create_owned(&RouteLabel {
                route: name.to_owned(),
            }),
        }
    }

    /// Drops the series of a cache taken out of the config.
    pub fn forget_cache(&self, name: &str) {
        self.cache_waiting.remove(&RouteLabel {
            route: name.to_owned(),
        });
        for result in CacheResult::ALL {
            self.cache.remove(&CacheLabels {
                route: name.to_owned(),
                result: result.as_str(),
            });
        }
    }

    /// The gauge of the bytes every micro-cache holds together.
    pub fn cache_bytes(&self) -> Gauge<i64, std::sync::atomic::AtomicI64> {
        self.cache_bytes.clone()
    }

    /// The client connections' handles, for the server.
    pub fn connections(&self) -> &ConnectionMetrics {
        &self.connections
    }

    /// The handles of route `name`, created (at zero) when missing.
    pub fn route(&self, name: &str) -> RouteMetrics {
        let route = RouteLabel {
            route: name.to_owned(),
        };
        let admitted = |how| AdmittedLabels {
            route: name.to_owned(),
            how,
        };
        let rejected = |reason| RejectedLabels {
            route: name.to_owned(),
            reason,
        };
        let unconfirmed = |kind| UnconfirmedLabels {
            route: name.to_owned(),
            kind,
        };
        let eta = self.eta.get_or_create_owned(&route);
        eta.set(f64::NAN);
        RouteMetrics {
            route: name.to_owned(),
            lanes: self.lanes.clone(),
            waiting: self.waiting.get_or_create_owned(&route),
            active: self.active.get_or_create_owned(&route),
            capacity: self.capacity.get_or_create_owned(&route),
            admitted_at_once: self.admitted.get_or_create_owned(&admitted("at_once")),
            admitted_from_line: self.admitted.get_or_create_owned(&admitted("from_line")),
            rejected_full: self.rejected.get_or_create_owned(&rejected("full")),
            rejected_too_many: self.rejected.get_or_create_owned(&rejected("too_many")),
            rejected_closed: self.rejected.get_or_create_owned(&rejected("closed")),
            rejected_store_down: self.rejected.get_or_create_owned(&rejected("store_down")),
            held: self.held.get_or_create_owned(&route),
            eta,
            inversions: self.inversions.get_or_create_owned(&route),
            abandoned: self.abandoned.get_or_create_owned(&route),
            no_show: self.no_show.get_or_create_owned(&route),
            unconfirmed_sessions: self
                .unconfirmed
                .get_or_create_owned(&unconfirmed("session")),
            unconfirmed_tickets: self.unconfirmed.get_or_create_owned(&unconfirmed("ticket")),
            fail_open: self.fail_open.get_or_create_owned(&route),
            client_gone: self.client_gone.get_or_create_owned(&route),
            sessions_ended: SessionEnd::ALL.map(|reason| {
                self.sessions_ended.get_or_create_owned(&EndedLabels {
                    route: name.to_owned(),
                    reason: reason.as_str(),
                })
            }),
            polls: ["record", "store"].map(|answered_by| {
                self.polls.get_or_create_owned(&PollLabels {
                    route: name.to_owned(),
                    answered_by,
                })
            }),
            event_streams: self.event_streams.get_or_create_owned(&route),
            origin: self.origin.route(name),
            inflight: self.inflight.inflight.get_or_create_owned(&route),
            inflight_refused: self.inflight.refused.get_or_create_owned(&route),
            streams_refused: StreamCap::ALL.map(|cap| {
                self.streams_refused
                    .get_or_create_owned(&StreamRefusedLabels {
                        route: name.to_owned(),
                        reason: cap.as_str(),
                    })
            }),
        }
    }

    /// Drops every series of a route that left the config.
    pub fn forget_route(&self, name: &str) {
        let route = RouteLabel {
            route: name.to_owned(),
        };
        for family in [&self.waiting, &self.active, &self.capacity] {
            family.remove(&route);
        }
        for family in [
            &self.held,
            &self.inversions,
            &self.abandoned,
            &self.no_show,
            &self.fail_open,
            &self.client_gone,
        ] {
            family.remove(&route);
        }
        self.eta.remove(&route);
        self.event_streams.remove(&route);
        self.inflight.inflight.remove(&route);
        self.inflight.refused.remove(&route);
        for cap in StreamCap::ALL {
            self.streams_refused.remove(&StreamRefusedLabels {
                route: name.to_owned(),
                reason: cap.as_str(),
            });
        }
        self.lanes.forget_route(name);
        self.origin.forget_route(name);
        for how in ["at_once", "from_line"] {
            self.admitted.remove(&AdmittedLabels {
                route: name.to_owned(),
                how,
            });
        }
        for kind in ["session", "ticket"] {
            self.unconfirmed.remove(&UnconfirmedLabels {
                route: name.to_owned(),
                kind,
            });
        }
        for reason in SessionEnd::ALL {
            self.sessions_ended.remove(&EndedLabels {
                route: name.to_owned(),
                reason: reason.as_str(),
            });
        }
        for answered_by in ["record", "store"] {
            self.polls.remove(&PollLabels {
                route: name.to_owned(),
                answered_by,
            });
        }
        for reason in ["full", "too_many", "closed", "store_down"] {
            self.rejected.remove(&RejectedLabels {
                route: name.to_owned(),
                reason,
            });
        }
    }

    /// One request answered.
    pub fn request(&self, outcome: Outcome) {
        // `requests` is built from `Outcome::ALL`, whose order matches the
        // discriminants.
        if let Some(counter) = self.requests.get(outcome as usize) {
            counter.inc();
        }
    }

    /// Copies the store circuit breaker's state and its call and error
    /// counts (every store call goes through it, so it is the one place they
    /// are counted) into the exported metrics; called before each scrape.
    pub fn observe_store(&self, breaker: &Breaker) {
        self.breaker_state.set(breaker.state() as i64);
        for op in Operation::ALL {
            let label = OperationLabel {
                operation: op.label(),
            };
            catch_up(&self.store_calls.get_or_create(&label), breaker.calls(op));
            catch_up(&self.store_errors.get_or_create(&label), breaker.errors(op));
        }
    }

    /// One origin request: how long until its response head, or how it failed.
    pub fn upstream(&self, seconds: f64, failure: Option<UpstreamFailure>) {
        self.upstream_duration.observe(seconds);
        match failure {
            Some(UpstreamFailure::Error) => self.upstream_error.inc(),
            Some(UpstreamFailure::Timeout) => self.upstream_timeout.inc(),
            None => 0,
        };
    }

    /// A config reload was applied (`true`) or rejected.
    pub fn config_reload(&self, ok: bool) {
        if ok {
            self.reload_ok.inc();
        } else {
            self.reload_error.inc();
        }
    }

    /// Everything, in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8192);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Registers `metric` in `registry` under `name` and returns it.
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// The line of each route: who waits, who is in, who was let in or turned
/// away, and how long it takes.
struct LineMetrics {
    waiting: Family<RouteLabel, Gauge>,
    active: Family<RouteLabel, Gauge>,
    capacity: Family<RouteLabel, Gauge>,
    admitted: Family<AdmittedLabels, Counter>,
    lanes: std::sync::Arc<LaneFamilies>,
    rejected: Family<RejectedLabels, Counter>,
    held: Family<RouteLabel, Counter>,
    eta: Family<RouteLabel, Gauge<f64, AtomicU64>>,
    inversions: Family<RouteLabel, Counter>,
}

impl LineMetrics {
    fn register(registry: &mut Registry) -> LineMetrics {
        let r = registry;
        let waiting = register(
            r,
            "queuegate_waiting",
            "People in line, per route",
            Family::default(),
        );
        let active = register(
            r,
            "queuegate_active",
            "Active admitted sessions, per route",
            Family::default(),
        );
        let capacity = register(
            r,
            "queuegate_capacity",
            "Configured concurrent sessions, per route",
            Family::default(),
        );
        let admitted = register(
            r,
            "queuegate_admitted",
            "Visitors admitted, at once on arrival or from the line",
            Family::default(),
        );
        let lanes = std::sync::Arc::new(LaneFamilies::default());
        r.register(
            "queuegate_lane_waiting",
            "People in line, per route and lane",
            lanes.waiting.clone(),
        );
        r.register(
            "queuegate_lane_admitted",
            "Visitors admitted from the line, per route and lane",
            lanes.admitted.clone(),
        );
        r.register(
            "queuegate_wait_seconds",
            "Time in line, join to admission, per route and lane: each admission from the line once",
            lanes.wait.clone(),
        );
        LineMetrics {
            waiting,
            active,
            capacity,
            admitted,
            lanes,
            rejected: register(
                r,
                "queuegate_rejected",
                "Requests turned away: line full, route closed, store down",
                Family::default(),
            ),
            held: register(
                r,
                "queuegate_held",
                "Requests sent to the waiting room",
                Family::default(),
            ),
            eta: register(
                r,
                "queuegate_eta_seconds",
                "Estimated wait for the back of the line (NaN while there is no admission rate)",
                Family::default(),
            ),
            inversions: register(
                r,
                "queuegate_admission_inversions",
                "Waiters admitted while someone in the same lane who joined earlier still waited (0 when the line is fair)",
                Family::default(),
            ),
        }
    }
}

/// What became of waiters and sessions, and how the waiting room's pages
/// keep up with the line.
struct WaiterMetrics {
    abandoned: Family<RouteLabel, Counter>,
    no_show: Family<RouteLabel, Counter>,
    unconfirmed: Family<UnconfirmedLabels, Counter>,
    sessions_ended: Family<EndedLabels, Counter>,
    polls: Family<PollLabels, Counter>,
    event_streams: Family<RouteLabel, Gauge>,
    streams_refused: Family<StreamRefusedLabels, Counter>,
    client_gone: Family<RouteLabel, Counter>,
}

impl WaiterMetrics {
    fn register(registry: &mut Registry) -> WaiterMetrics {
        let r = registry;
        WaiterMetrics {
            abandoned: register(
                r,
                "queuegate_abandoned",
                "Waiters dropped after going silent",
                Family::default(),
            ),
            no_show: register(
                r,
                "queuegate_no_shows",
                "Admitted waiters who never came",
                Family::default(),
            ),
            unconfirmed: register(
                r,
                "queuegate_unconfirmed",
                "Admit-now sessions and tickets whose visitor never came back within confirm_within",
                Family::default(),
            ),
            sessions_ended: register(
                r,
                "queuegate_sessions_ended",
                "Sessions ended before they expired: by the origin's command, an exit path, or max_requests_per_session",
                Family::default(),
            ),
            polls: register(
                r,
                "queuegate_polls",
                "Status polls of waiters, by what answered them: the line record (no store call) or the store",
                Family::default(),
            ),
            event_streams: register(
                r,
                "queuegate_event_streams",
                "Waiting pages' event streams open at this instance, per route",
                Family::default(),
            ),
            streams_refused: register(
                r,
                "queuegate_event_streams_refused",
                "Event streams refused (the page told to poll) for being over the route's cap, the visitor's or the client address's",
                Family::default(),
            ),
            client_gone: register(
                r,
                "queuegate_client_gone",
                "Requests to a route whose client went away before they were answered",
                Family::default(),
            ),
        }
    }
}

/// Each route's origin as its admitted requests see it, and the capacity
/// that follows it (DESIGN §9.1).
#[derive(Clone)]
struct OriginMetrics {
    capacity: Family<RouteLabel, Gauge>,
    response: Family<RouteLabel, Histogram>,
    changes: Family<DirectionLabels, Counter>,
}

impl OriginMetrics {
    fn register(registry: &mut Registry) -> OriginMetrics {
        let r = registry;
        OriginMetrics {
            capacity: register(
                r,
                "queuegate_route_capacity",
                "Concurrent sessions the route admits by now: the configured number, or where an adaptive capacity stands",
                Family::default(),
            ),
            response: register(
                r,
                "queuegate_origin_response_seconds",
                "The origin's time to the response head (or to failing) for the route's forwarded requests",
                Family::new_with_constructor(upstream_histogram as fn() -> Histogram),
            ),
            changes: register(
                r,
                "queuegate_capacity_changes",
                "Changes of an adaptive route's capacity, up or down, made by this instance",
                Family::default(),
            ),
        }
    }

    fn route(&self, name: &str) -> RouteOrigin {
        let route = RouteLabel {
            route: name.to_owned(),
        };
        RouteOrigin {
            capacity: self.capacity.get_or_create_owned(&route),
            response: self.response.get_or_create_owned(&route),
            changes: [Direction::Up, Direction::Down].map(|d| {
                self.changes.get_or_create_owned(&DirectionLabels {
                    route: name.to_owned(),
                    direction: d.as_str(),
                })
            }),
        }
    }

    fn forget_route(&self, name: &str) {
        let route = RouteLabel {
            route: name.to_owned(),
        };
        self.capacity.remove(&route);
        self.response.remove(&route);
        for d in [Direction::Up, Direction::Down] {
            self.changes.remove(&DirectionLabels {
                route: name.to_owned(),
                direction: d.as_str(),
            });
        }
    }
}

fn upstream_histogram() -> Histogram {
    Histogram::new(UPSTREAM_BUCKETS)
}

/// A route's handles of [`OriginMetrics`].
#[derive(Clone, Debug)]
pub struct RouteOrigin {
    capacity: Gauge,
    response: Histogram,
    /// Up, then down.
    changes: [Counter; 2],
}

impl RouteOrigin {
    /// A forwarded request's time to the origin's answer head (or failure).
    pub fn response(&self, seconds: f64) {
        self.response.observe(seconds);
    }

    /// The capacity the route admits by now.
    pub fn capacity(&self, capacity: u64) {
        self.capacity
            .set(i64::try_from(capacity).unwrap_or(i64::MAX));
    }

    /// The capacity moved `direction` to `capacity`.
    pub fn changed(&self, direction: Direction, capacity: u64) {
        let i = match direction {
            Direction::Up => 0,
            Direction::Down => 1,
        };
        self.changes[i].inc();
        self.capacity(capacity);
    }
}

/// The store, the origin and config reloads, and the visitors let through
/// while the store was down.
struct BackendMetrics {
    store_calls: Family<OperationLabel, Counter>,
    store_errors: Family<OperationLabel, Counter>,
    breaker_state: Gauge,
    upstream_duration: Histogram,
    upstream_errors: Family<KindLabel, Counter>,
    reloads: Family<ResultLabel, Counter>,
    fail_open: Family<RouteLabel, Counter>,
}

impl BackendMetrics {
    fn register(registry: &mut Registry) -> BackendMetrics {
        let r = registry;
        let store_calls: Family<OperationLabel, Counter> = register(
            r,
            "queuegate_store_calls",
            "Calls made to the store, per operation (those the open breaker refused are not made)",
            Family::default(),
        );
        let store_errors: Family<OperationLabel, Counter> = register(
            r,
            "queuegate_store_errors",
            "Store calls that failed or timed out, per operation",
            Family::default(),
        );
        for op in Operation::ALL {
            let label = OperationLabel {
                operation: op.label(),
            };
            let _ = store_calls.get_or_create_owned(&label);
            let _ = store_errors.get_or_create_owned(&label);
        }
        BackendMetrics {
            store_calls,
            store_errors,
            breaker_state: register(
                r,
                "queuegate_store_breaker_state",
                "Store circuit breaker: 0 closed, 1 half-open, 2 open",
                Gauge::default(),
            ),
            upstream_duration: register(
                r,
                "queuegate_upstream_request_duration_seconds",
                "Time until the origin's response head",
                upstream_histogram(),
            ),
            upstream_errors: register(
                r,
                "queuegate_upstream_errors",
                "Origin requests that failed (error) or timed out (timeout)",
                Family::default(),
            ),
            reloads: register(
                r,
                "queuegate_config_reloads",
                "Config reloads, applied (ok) or rejected (error)",
                Family::default(),
            ),
            fail_open: register(
                r,
                "queuegate_fail_open",
                "New visitors forwarded without a pass because the store was down",
                Family::default(),
            ),
        }
    }
}

/// Each route's requests in flight to the origin and those answered busy
/// for being over its `max_inflight` (DESIGN §9.2).
struct InflightMetrics {
    inflight: Family<RouteLabel, Gauge>,
    refused: Family<RouteLabel, Counter>,
}

impl InflightMetrics {
    fn register(r: &mut Registry) -> InflightMetrics {
        InflightMetrics {
            inflight: register(
                r,
                "queuegate_inflight",
                "Requests of the route at the origin now, at this instance (capped by max_inflight or not)",
                Family::default(),
            ),
            refused: register(
                r,
                "queuegate_inflight_refused",
                "Admitted requests answered busy (503) after waiting inflight_wait for a turn under max_inflight",
                Family::default(),
            ),
        }
    }
}

/// Requests by how they were answered (one counter per [`Outcome`], in
/// `Outcome::ALL` order), and the client connections.
fn register_traffic(r: &mut Registry) -> (Vec<Counter>, ConnectionMetrics) {
    let requests_family: Family<DecisionLabel, Counter> = register(
        r,
        "queuegate_requests",
        "Requests by how they were answered",
        Family::default(),
    );
    let open_connections: Family<ProtocolLabel, Gauge> = register(
        r,
        "queuegate_connections",
        "Open client connections by protocol: h1, h2, or tunnel (upgraded, such as WebSocket)",
        Family::default(),
    );
    let parked = register(
        r,
        "queuegate_parked_connections",
        "Idle HTTP/1 connections parked down to their socket (counted in h1 too)",
        Gauge::default(),
    );
    let parks = register(
        r,
        "queuegate_parks",
        "Idle HTTP/1 connections parked",
        Counter::default(),
    );
    let resumes = register(
        r,
        "queuegate_resumes",
        "Parked connections picked up again when their socket turned readable",
        Counter::default(),
    );
    let requests = Outcome::ALL
        .iter()
        .map(|o| {
            requests_family.get_or_create_owned(&DecisionLabel {
                decision: o.as_str(),
            })
        })
        .collect();
    let [h1, h2, tunnel] = Protocol::ALL.map(|protocol| {
        open_connections.get_or_create_owned(&ProtocolLabel {
            protocol: protocol.as_str(),
        })
    });
    let connections = ConnectionMetrics {
        h1,
        h2,
        tunnel,
        parked,
        parks,
        resumes,
    };
    (requests, connections)
}

/// The micro-caches: what each did per request, and the bytes they hold.
fn register_cache(
    r: &mut Registry,
) -> (
    Family<CacheLabels, Counter>,
    Family<RouteLabel, Gauge>,
    Gauge<i64, std::sync::atomic::AtomicI64>,
) {
    let counts = register(
        r,
        "queuegate_cache",
        "Requests to a route's (or bypass rule's) micro-cache: hit, miss (to the origin), coalesced (given another request's fetch), bypass (not for the cache)",
        Family::default(),
    );
    let waiting = register(
        r,
        "queuegate_cache_waiting",
        "Requests waiting for another request's fetch of the same page from the origin",
        Family::default(),
    );
    let bytes = register(
        r,
        "queuegate_cache_bytes",
        "Bytes the micro-caches hold, bodies, heads and keys (at most limits.cache_bytes)",
        Gauge::default(),
    );
    (counts, waiting, bytes)
}

fn wait_histogram() -> Histogram {
    Histogram::new(WAIT_BUCKETS)
}

/// How an origin request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamFailure {
    Error,
    Timeout,
}

/// The handles the server counts its client connections with: an atomic
/// bumped when a connection opens, parks, resumes or ends, never a lock.
#[derive(Clone, Debug)]
pub struct ConnectionMetrics {
    h1: Gauge,
    h2: Gauge,
    tunnel: Gauge,
    parked: Gauge,
    parks: Counter,
    resumes: Counter,
}

impl ConnectionMetrics {
    /// Counts a connection speaking `protocol` until the guard is dropped.
    pub fn open(&self, protocol: Protocol) -> Counted {
        let gauge = match protocol {
            Protocol::Http1 => &self.h1,
            Protocol::Http2 => &self.h2,
            Protocol::Tunnel => &self.tunnel,
        };
        Counted::new(gauge)
    }

    /// Counts one park, and the connection as parked until the guard is
    /// dropped.
    pub fn park(&self) -> Counted {
        self.parks.inc();
        Counted::new(&self.parked)
    }

    /// A parked connection was picked up again.
    pub fn resumed(&self) {
        self.resumes.inc();
    }
}

/// One connection in a gauge: taken out again when dropped, which a
/// connection's task does on every way it ends, cancelled included.
#[must_use = "the connection is counted only while the guard lives"]
#[derive(Debug)]
pub struct Counted(Gauge);

impl Counted {
    fn new(gauge: &Gauge) -> Counted {
        gauge.inc();
        Counted(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Moves `counter` up to `total`, a count kept elsewhere that only grows.
fn catch_up(counter: &Counter, total: u64) {
    let exported = counter.get();
    if total > exported {
        counter.inc_by(total - exported);
    }
}

/// One route's metric handles, resolved when the settings are built.
#[derive(Clone, Debug)]
pub struct RouteMetrics {
    route: String,
    lanes: std::sync::Arc<LaneFamilies>,
    waiting: Gauge,
    active: Gauge,
    capacity: Gauge,
    admitted_at_once: Counter,
    admitted_from_line: Counter,
    rejected_full: Counter,
    rejected_too_many: Counter,
    rejected_closed: Counter,
    rejected_store_down: Counter,
    held: Counter,
    eta: Gauge<f64, AtomicU64>,
    inversions: Counter,
    abandoned: Counter,
    no_show: Counter,
    unconfirmed_sessions: Counter,
    unconfirmed_tickets: Counter,
    fail_open: Counter,
    client_gone: Counter,
    /// By [`SessionEnd`], in the order of [`SessionEnd::ALL`].
    sessions_ended: [Counter; 3],
    /// Polls answered by the line record, then by the store.
    polls: [Counter; 2],
    event_streams: Gauge,
    /// By [`StreamCap`], in the order of [`StreamCap::ALL`].
    streams_refused: [Counter; 3],
    /// The origin as this route's requests see it, and its capacity.
    pub origin: RouteOrigin,
    inflight: Gauge,
    inflight_refused: Counter,
}

impl RouteMetrics {
    /// Counts one status poll of a waiter (or of an admitted visitor's
    /// ticket), answered from the line record or by the store.
    pub fn poll(&self, from_record: bool) {
        self.polls[usize::from(!from_record)].inc();
    }

    /// The event streams open on the route at this instance; set before
    /// each scrape from the count their cap is kept with.
    pub fn event_streams(&self, open: usize) {
        self.event_streams
            .set(i64::try_from(open).unwrap_or(i64::MAX));
    }

    /// The route's requests at the origin at this instance; set before each
    /// scrape from its turns (see `inflight::Turns`).
    pub fn inflight(&self, held: u64) {
        self.inflight.set(i64::try_from(held).unwrap_or(i64::MAX));
    }

    /// Counts an event stream refused by `cap`.
    pub fn stream_refused(&self, cap: StreamCap) {
        self.streams_refused[cap as usize].inc();
    }

    /// Counts a request to this route whose client went away before it was
    /// answered.
    pub fn client_gone(&self) {
        self.client_gone.inc();
    }

    /// Counts a session ended before it expired.
    pub fn session_ended(&self, reason: SessionEnd) {
        self.sessions_ended[reason as usize].inc();
    }

    /// Counts the outcome of one request to this route.
    pub fn request(&self, outcome: Outcome) {
        match outcome {
            Outcome::AtOnce => {
                self.admitted_at_once.inc();
            }
            Outcome::FailOpen => {
                self.fail_open.inc();
            }
            Outcome::Held => {
                self.held.inc();
            }
            Outcome::Full => {
                self.rejected_full.inc();
            }
            Outcome::TooMany => {
                self.rejected_too_many.inc();
            }
            Outcome::Closed => {
                self.rejected_closed.inc();
            }
            Outcome::StoreDown => {
                self.rejected_store_down.inc();
            }
            Outcome::Busy => {
                self.inflight_refused.inc();
            }
            _ => {}
        }
    }

    /// What one admitter tick did: admissions from the line with their wait
    /// (in the lane of `lanes` each came from), inversions, ghosts dropped,
    /// no-shows.
    pub fn tick(&self, lanes: &Lanes, tick: &Tick) {
        self.admitted_from_line
            .inc_by(tick.admitted_scores.len() as u64);
        for (lane, waited_s) in tick.waits() {
            let labels = self.lanes.labels(&self.route, &lanes.get(lane).name);
            self.lanes.wait.get_or_create(&labels).observe(waited_s);
        }
        self.inversions.inc_by(tick.inversions());
        self.abandoned.inc_by(tick.abandoned);
        self.no_show.inc_by(tick.no_shows);
        self.unconfirmed_sessions.inc_by(tick.unconfirmed_sessions);
        self.unconfirmed_tickets.inc_by(tick.unconfirmed_tickets);
    }

    /// Per lane of `lanes` (in order, as the tick reports them): waiters
    /// left and admissions from the line.
    pub fn lanes(&self, lanes: &Lanes, tick: &Tick) {
        for (i, lane) in lanes.iter().enumerate() {
            let labels = self.lanes.labels(&self.route, &lane.name);
            if let Some(&waiting) = tick.lane_waiting.get(i) {
                self.lanes
                    .waiting
                    .get_or_create(&labels)
                    .set(i64::try_from(waiting).unwrap_or(i64::MAX));
            }
            let admitted = self.lanes.admitted.get_or_create(&labels);
            admitted.inc_by(tick.lane_admitted.get(i).copied().unwrap_or(0));
        }
    }

    /// Creates the series of every lane of `lanes` (at zero when new), so
    /// rate queries see them before the first admission.
    pub fn lanes_at_zero(&self, lanes: &Lanes) {
        for lane in lanes.iter() {
            let labels = self.lanes.labels(&self.route, &lane.name);
            drop(self.lanes.waiting.get_or_create(&labels));
            drop(self.lanes.admitted.get_or_create(&labels));
            drop(self.lanes.wait.get_or_create(&labels));
        }
    }

    /// The route's live numbers; `eta_s` is `None` while there is no rate.
    pub fn live(&self, waiting: u64, active: u64, eta_s: Option<f64>) {
        self.waiting.set(waiting as i64);
        self.active.set(active as i64);
        self.eta.set(eta_s.unwrap_or(f64::NAN));
    }

    /// The configured capacity (an adaptive route's `start`), and the one
    /// it admits by now.
    pub fn capacity(&self, configured: u64, now: u64) {
        self.capacity
            .set(i64::try_from(configured).unwrap_or(i64::MAX));
        self.origin.capacity(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[tokio::test(start_paused = true)]
    async fn store_calls_errors_and_breaker_state_come_from_the_breaker() {
        use crate::queue::{BreakerConfig, StoreError};
        let breaker = Breaker::new(BreakerConfig {
            failures_to_open: 2,
            cool_down: std::time::Duration::from_secs(2),
            max_cool_down: std::time::Duration::from_secs(30),
            probe_timeout: std::time::Duration::from_millis(100),
        });
        let _ = breaker.call(Operation::Poll, async { Ok(()) }).await;
        for _ in 0..3 {
            let _ = breaker
                .call(Operation::Poll, async { Err::<(), _>(StoreError::Timeout) })
                .await;
        }
        let m = Metrics::new();
        m.observe_store(&breaker);
        m.observe_store(&breaker);
        let text = m.encode();
        assert_eq!(
            sample(&text, "queuegate_store_errors_total{operation=\"poll\"}"),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, "queuegate_store_errors_total{operation=\"arrive\"}"),
            Some(0.0)
        );
        // The third failure found the breaker open: refused, not made.
        assert_eq!(
            sample(&text, "queuegate_store_calls_total{operation=\"poll\"}"),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, "queuegate_store_calls_total{operation=\"arrive\"}"),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, "queuegate_store_breaker_state"),
            Some(2.0),
            "open"
        );
    }

    #[test]
    fn rate_series_exist_at_zero() {
        let m = Metrics::new();
        let _ = m.route("tickets");
        let text = m.encode();
        assert_eq!(
            sample(
                &text,
                r#"queuegate_admitted_total{route="tickets",how="from_line"}"#
            ),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, r#"queuegate_config_reloads_total{result="error"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"queuegate_requests_total{decision="renewed_locally"}"#
            ),
            Some(0.0)
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn requests_and_ticks_are_counted_under_their_labels() {
        let m = Metrics::new();
        let r = m.route("tickets");
        m.request(Outcome::Held);
        r.request(Outcome::Held);
        r.request(Outcome::Full);
        let lanes = Lanes::new(vec![
            crate::queue::Lane::main(),
            crate::queue::Lane {
                name: "vip".to_owned(),
                weight: 3,
            },
        ])
        .unwrap();
        r.tick(
            &lanes,
            &Tick {
                ran: true,
                admitted_scores: vec![1_000_000, 2_000_000, 2_000_000],
                admitted_lanes: vec![0, 0, 1],
                abandoned: 3,
                no_shows: 1,
                now_us: 31_000_000,
                lane_admitted: vec![2, 1],
                lane_waiting: vec![0, 0],
                lane_heads: vec![None, None],
                ..Tick::idle(31_000_000, 1)
            },
        );
        let text = m.encode();
        assert_eq!(
            sample(&text, r#"queuegate_requests_total{decision="held"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"queuegate_held_total{route="tickets"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"queuegate_rejected_total{route="tickets",reason="full"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"queuegate_admitted_total{route="tickets",how="from_line"}"#
            ),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, r#"queuegate_abandoned_total{route="tickets"}"#),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, r#"queuegate_no_shows_total{route="tickets"}"#),
            Some(1.0)
        );
        // Waited 30 s and 29 s in main, 29 s in vip: each counted once, in
        // its lane; in the le=30 bucket, none in le=15.
        let bucket = |lane: &str, le: &str| {
            let series = format!(
                "queuegate_wait_seconds_bucket{{le=\"{le}\",route=\"tickets\",lane=\"{lane}\"}}"
            );
            sample(&text, &series)
        };
        assert_eq!(bucket("main", "30.0"), Some(2.0));
        assert_eq!(bucket("main", "15.0"), Some(0.0));
        assert_eq!(bucket("vip", "30.0"), Some(1.0));
        assert_eq!(
            sample(
                &text,
                r#"queuegate_admission_inversions_total{route="tickets"}"#
            ),
            Some(0.0)
        );
    }

    /// An admitter that takes the newest waiter of its lane (a stack, not a
    /// line): every admission but the last leaves someone earlier waiting.
    #[test]
    fn a_broken_admitter_that_admits_the_newest_first_counts_inversions() {
        let lanes = Lanes::default();
        let mut line: Vec<u64> = (1..=5).map(|n| n * 1_000_000).collect();
        let mut tick = Tick {
            ran: true,
            ..Tick::idle(10_000_000, 1)
        };
        for _ in 0..3 {
            let newest = line.pop().expect("a waiter");
            tick.admitted_scores.push(newest);
            tick.admitted_lanes.push(0);
        }
        tick.lane_heads = vec![line.first().copied()];
        assert_eq!(tick.inversions(), 3);

        let m = Metrics::new();
        let r = m.route("tickets");
        r.tick(&lanes, &tick);
        let text = m.encode();
        assert_eq!(
            sample(
                &text,
                r#"queuegate_admission_inversions_total{route="tickets"}"#
            ),
            Some(3.0)
        );
        // The same waiters admitted oldest first: none.
        let mut fair = tick.clone();
        fair.admitted_scores = vec![1_000_000, 2_000_000, 3_000_000];
        fair.lane_heads = vec![Some(4_000_000)];
        assert_eq!(fair.inversions(), 0);
        // Another lane's earlier waiter is no inversion.
        fair.admitted_lanes = vec![1, 1, 1];
        fair.lane_heads = vec![Some(1), None];
        assert_eq!(fair.inversions(), 0);
    }

    #[test]
    fn event_streams_and_their_refusals_are_under_their_labels() {
        let m = Metrics::new();
        let r = m.route("tickets");
        let refused = |text: &str, reason: &str| {
            let series = format!(
                "queuegate_event_streams_refused_total{{route=\"tickets\",reason=\"{reason}\"}}"
            );
            sample(text, &series)
        };
        let text = m.encode();
        assert_eq!(
            sample(&text, r#"queuegate_event_streams{route="tickets"}"#),
            Some(0.0)
        );
        assert_eq!(refused(&text, "route"), Some(0.0));
        assert_eq!(refused(&text, "visitor"), Some(0.0));
        assert_eq!(refused(&text, "client"), Some(0.0));

        r.event_streams(5);
        r.stream_refused(StreamCap::Visitor);
        r.stream_refused(StreamCap::Visitor);
        r.stream_refused(StreamCap::Route);
        for _ in 0..3 {
            r.stream_refused(StreamCap::Client);
        }
        let text = m.encode();
        assert_eq!(
            sample(&text, r#"queuegate_event_streams{route="tickets"}"#),
            Some(5.0)
        );
        assert_eq!(refused(&text, "route"), Some(1.0));
        assert_eq!(refused(&text, "visitor"), Some(2.0));
        assert_eq!(refused(&text, "client"), Some(3.0));
    }

    #[test]
    fn forgotten_routes_leave_no_series() {
        let m = Metrics::new();
        let _ = m.route("old");
        m.forget_route("old");
        assert!(!m.encode().contains("route=\"old\""));
    }

    #[test]
    fn connections_are_counted_while_their_guards_live() {
        let m = Metrics::new();
        let text = m.encode();
        for protocol in ["h1", "h2", "tunnel"] {
            let series = format!("queuegate_connections{{protocol=\"{protocol}\"}}");
            assert_eq!(sample(&text, &series), Some(0.0), "{series}");
        }
        let c = m.connections();
        let h2 = c.open(Protocol::Http2);
        let tunnels = [c.open(Protocol::Tunnel), c.open(Protocol::Tunnel)];
        let parked = c.park();
        c.resumed();
        let text = m.encode();
        assert_eq!(
            sample(&text, r#"queuegate_connections{protocol="h2"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"queuegate_connections{protocol="tunnel"}"#),
            Some(2.0)
        );
        assert_eq!(sample(&text, "queuegate_parked_connections"), Some(1.0));
        assert_eq!(sample(&text, "queuegate_parks_total"), Some(1.0));
        assert_eq!(sample(&text, "queuegate_resumes_total"), Some(1.0));

        drop((h2, tunnels, parked));
        let text = m.encode();
        assert_eq!(
            sample(&text, r#"queuegate_connections{protocol="h2"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, r#"queuegate_connections{protocol="tunnel"}"#),
            Some(0.0)
        );
        assert_eq!(sample(&text, "queuegate_parked_connections"), Some(0.0));
        assert_eq!(sample(&text, "queuegate_parks_total"), Some(1.0));
    }

    #[test]
    fn outcome_order_matches_its_discriminants() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i);
        }
    }
}
