//! The Redis backend of `QueueStore`: one Lua script per operation (`lua/`),
//! run by SHA over a standalone, Cluster or Sentinel connection, each call
//! bounded by the configured timeout.
//!
//! Every route lives in six keys under one hash tag (`qg:{route}:…`, see
//! DESIGN §3), plus one waiting key per lane other than `main`
//! (`qg:{route}:waiting:lane:NAME`; `main` keeps `qg:{route}:waiting`), one
//! key per client that the per-client limits count (`qg:{route}:client:<hex>`,
//! expiring by itself) and one per invite token counted
//! (`qg:{route}:invite:<hex>`), all passed through `KEYS` so Cluster routes
//! the call to the slot that holds them. The lanes a route no longer
//! configures are merged by the admitter's tick, which is given their keys:
//! each store remembers per route the lane names the store listed at its
//! last look (`lanes.lua`, then every tick's answer). Visitors are
//! named by the raw first 12 bytes of their ids (`store_id`), members only,
//! never part of a key.
//! All times come from Redis `TIME` inside the scripts, so instance clocks
//! never matter.
//!
//! It does not decide what to do when Redis is down: errors come back as
//! `StoreError` and the gate applies the route's `on_store_error`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::Sentinel;
use redis::{ErrorKind, FromRedisValue, RedisError, Script, ScriptInvocation, ServerErrorKind};
use tokio::sync::{watch, Notify};

use super::{
    store_id, Arrival, Arriving, ClientKey, Counted, Ended, HealthLook, Heartbeat, InviteUse,
    LaneStats, Limits, LineRecord, Override, PassTimes, Place, Poll, QueueStore, RouteStats,
    StoreError, StoreId, Tick, TicketTimes, VisitorId, WindowCounts, JOIN_WINDOW, MAIN_LANE,
};
use crate::clock::Clock;
use crate::config::{RedisConfig, RedisMode};

mod health;
mod split;

/// Builds a script from the shared prelude and one operation's file.
macro_rules! route_script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("../../lua/route.lua"),
            "\n",
            include_str!(concat!("../../lua/", $file))
        ))
    };
}

/// The scripts, each hashed once; `Script` runs EVALSHA and loads the script
/// again when Redis answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).
struct Scripts {
    arrive: Script,
    poll: Script,
    renew: Script,
    leave: Script,
    count_request: Script,
    admit_tick: Script,
    heartbeats: Script,
    ended: Script,
    line_record: Script,
    hold: Script,
    stats: Script,
    ready: Script,
    move_lane: Script,
    take_use: Script,
    lanes: Script,
    shares: Script,
    coord: Script,
    ahead: Script,
    adapt: Script,
    overrides: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            arrive: route_script!("arrive.lua"),
            poll: route_script!("poll.lua"),
            renew: route_script!("renew.lua"),
            leave: route_script!("leave.lua"),
            count_request: route_script!("count_request.lua"),
            admit_tick: route_script!("admit_tick.lua"),
            heartbeats: route_script!("heartbeats.lua"),
            ended: route_script!("ended.lua"),
            line_record: route_script!("line_record.lua"),
            hold: route_script!("hold.lua"),
            stats: route_script!("stats.lua"),
            ready: Script::new(include_str!("../../lua/ready.lua")),
            move_lane: route_script!("move_lane.lua"),
            take_use: route_script!("take_use.lua"),
            lanes: route_script!("lanes.lua"),
            shares: route_script!("shares.lua"),
            coord: Script::new(include_str!("../../lua/coord.lua")),
            adapt: Script::new(include_str!("../../lua/adapt.lua")),
            ahead: Script::new(include_str!("../../lua/ahead.lua")),
            overrides: Script::new(include_str!("../../lua/override.lua")),
        }
    }
}

/// How often the Sentinel follower asks for the master when nothing failed.
const SENTINEL_RECHECK: Duration = Duration::from_secs(1);
/// Least time between two Sentinel look-ups, so a burst of failing calls does
/// not hammer the sentinels.
const SENTINEL_MIN_GAP: Duration = Duration::from_millis(100);
/// Bound on one Sentinel look-up (sentinel plus master role check).
const SENTINEL_LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// The connection to Redis, by deployment mode. All variants are cheap to
/// clone and reconnect by themselves.
#[derive(Clone)]
enum Link {
    /// Multiplexed; reconnects after a Redis restart.
    Standalone(ConnectionManager),
    /// Routes each script by its keys' slot; follows MOVED and failovers.
    Cluster(ClusterConnection),
    /// The master Sentinel names now, kept current by a background follower.
    Sentinel {
        master: watch::Receiver<Option<ConnectionManager>>,
        /// Wakes the follower to look the master up again.
        stale: Arc<Notify>,
    },
}

/// The Redis store. Clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    link: Link,
    timeout: Duration,
    scripts: Arc<Scripts>,
    /// Per route, the lane names (other than main) the store listed as
    /// holding waiters at the last look: the admitter's tick merges those
    /// no longer configured. Missing: look before the next tick.
    lanes_seen: Arc<Mutex<HashMap<String, Vec<String>>>>,
    /// Per split route, what this store saw of its sub-lines (`split.rs`).
    splits: Arc<Mutex<HashMap<String, split::Seen>>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.link {
            Link::Standalone(_) => "standalone",
            Link::Cluster(_) => "cluster",
            Link::Sentinel { .. } => "sentinel",
        };
        f.debug_struct("RedisStore")
            .field("mode", &mode)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RedisStore {
    /// Sets up the connection without waiting for Redis: the first calls
    /// connect (each bounded by `cfg.timeout`), and a lost connection is
    /// re-established on the next call. With Sentinel a background task
    /// follows the master. Fails only on a malformed address, or when called
    /// outside a tokio runtime.
    pub fn connect(cfg: &RedisConfig) -> Result<RedisStore, StoreError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StoreError::Unavailable(RedisError::from((
                ErrorKind::Client,
                "the Redis store needs a tokio runtime",
            ))));
        }
        let timeout = cfg.timeout;
        let link = match &cfg.mode {
            RedisMode::Standalone { url } => {
                let client = redis::Client::open(url.as_str()).map_err(unavailable)?;
                let manager =
                    ConnectionManager::new_lazy_with_config(client, manager_config(timeout))
                        .map_err(unavailable)?;
                Link::Standalone(manager)
            }
            RedisMode::Cluster { nodes } => {
                let client = ClusterClient::builder(nodes.iter().map(String::as_str))
                    .connection_timeout(connect_timeout(timeout))
                    .response_timeout(timeout)
                    .build()
                    .map_err(unavailable)?;
                let config = ClusterConfig::new()
                    .set_connection_timeout(connect_timeout(timeout))
                    .set_response_timeout(timeout);
                Link::Cluster(client.get_pending_async_connection_with_config(config))
            }
            RedisMode::Sentinel { master, nodes } => {
                let sentinel = Sentinel::build(nodes.clone()).map_err(unavailable)?;
                let (tx, rx) = watch::channel(None);
                let stale = Arc::new(Notify::new());
                tokio::spawn(follow_master(
                    sentinel,
                    master.clone(),
                    tx,
                    stale.clone(),
                    manager_config(timeout),
                ));
                Link::Sentinel { master: rx, stale }
            }
        };
        Ok(RedisStore {
            link,
            timeout,
            scripts: Arc::new(Scripts::new()),
            lanes_seen: Arc::new(Mutex::new(HashMap::new())),
            splits: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// Runs one prepared script within the timeout.
    async fn run<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let call = async {
            match &self.link {
                Link::Standalone(manager) => {
                    let mut manager = manager.clone();
                    invocation
                        .invoke_async(&mut manager)
                        .await
                        .map_err(classify)
                }
                Link::Cluster(cluster) => {
                    let mut cluster = cluster.clone();
                    invocation
                        .invoke_async(&mut cluster)
                        .await
                        .map_err(classify)
                }
                Link::Sentinel { master, stale } => {
                    let mut manager = current_master(master).await?;
                    let reply = invocation.invoke_async(&mut manager).await;
                    if let Err(e) = &reply {
                        if master_may_have_moved(e) {
                            stale.notify_one();
                        }
                    }
                    reply.map_err(classify)
                }
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(reply) => reply,
            Err(_) => {
                if let Link::Sentinel { stale, .. } = &self.link {
                    stale.notify_one();
                }
                Err(StoreError::Timeout)
            }
        }
    }
}

/// The route's six keys, in the order every script expects them.
fn route_keys(route: &str) -> [String; 6] {
    ["waiting", "seen", "active", "tick", "stats", "beat"].map(|k| format!("qg:{{{route}}}:{k}"))
}

/// The waiting key of lane `name`: the route's own for `main`, so a line
/// from before lanes keeps every place.
fn lane_key(route: &str, name: &str) -> String {
    if name == MAIN_LANE {
        format!("qg:{{{route}}}:waiting")
    } else {
        format!("qg:{{{route}}}:waiting:lane:{name}")
    }
}

/// A key under the route's hash tag naming `bytes` in hex, so keys stay
/// printable.
fn hex_key(route: &str, kind: &str, bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut key = format!("qg:{{{route}}}:{kind}:");
    for byte in bytes {
        // Writing to a String cannot fail.
        let _ = write!(key, "{byte:02x}");
    }
    key
}

/// The key of one client's arrivals, under the route's hash tag.
fn client_key(route: &str, client: ClientKey<'_>) -> String {
    hex_key(route, "client", client)
}

/// The key counting the uses of one invite token (see take_use.lua).
fn invite_key(route: &str, token: &[u8]) -> String {
    hex_key(route, "invite", token)
}

/// The lane names a `lanes` field (`,name,name,`) lists, main added.
fn listed_lanes(field: &str) -> Vec<String> {
    let mut names: Vec<String> = field
        .split(',')
        .filter(|n| super::is_lane_name(n))
        .map(str::to_owned)
        .collect();
    if !names.iter().any(|n| n == MAIN_LANE) {
        names.push(MAIN_LANE.to_owned());
    }
    names
}

/// The key counting the forwarded requests of session `id` (see
/// count_request.lua), under the route's hash tag.
fn uses_key(route: &str, id: &VisitorId) -> String {
    hex_key(route, "uses", id)
}

/// The route's keys and its lanes', then the client's key when `client` is
/// `Some`.
fn prepare<'a>(
    script: &'a Script,
    route: &str,
    limits: &Limits,
    client: Option<ClientKey<'_>>,
) -> ScriptInvocation<'a> {
    prepare_with(script, route, limits, &[], client)
}

/// [`prepare`], with the keys of `stale` lanes after the configured ones:
/// lanes a reload took out, whose waiters the next tick moves into the
/// first lane. A script that looks for a waiter in every lane finds those
/// in such a lane meanwhile (it reports them in the first lane).
fn prepare_with<'a>(
    script: &'a Script,
    route: &str,
    limits: &Limits,
    stale: &[String],
    client: Option<ClientKey<'_>>,
) -> ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    for key in route_keys(route) {
        invocation.key(key);
    }
    for lane in limits.lanes.iter() {
        invocation.key(lane_key(route, &lane.name));
    }
    for name in stale {
        invocation.key(lane_key(route, name));
    }
    if let Some(client) = client {
        invocation.key(client_key(route, client));
    }
    invocation
}

/// For a call on behalf of many visitors: adds each client's key once to
/// `invocation`, after the route's and its lanes', and returns for each visitor the
/// index of its client's key among them (1-based; 0: no client, or limits
/// that do not count it).
fn client_keys<'a>(
    invocation: &mut ScriptInvocation<'_>,
    route: &str,
    clients: impl Iterator<Item = ClientKey<'a>>,
    limits: &Limits,
) -> Vec<usize> {
    let mut seen: HashMap<ClientKey<'a>, usize> = HashMap::new();
    clients
        .map(|client| {
            if !limits.limits_client(client) {
                return 0;
            }
            let next = seen.len() + 1;
            *seen.entry(client).or_insert_with(|| {
                invocation.key(client_key(route, client));
                next
            })
        })
        .collect()
}

/// The route's opening as a script argument: µs, or empty for none.
/// The capacity a script is given: the route's, or '' on one sub-line of a
/// split route (`shards` 0 in its limits, see `split.rs`), whose scripts
/// read the sub-line's share instead.
fn capacity_arg(limits: &Limits) -> String {
    if limits.shards == 0 {
        String::new()
    } else {
        limits.capacity.to_string()
    }
}

fn opening_arg(limits: &Limits) -> String {
    limits
        .opens_at_us
        .map(|us| us.to_string())
        .unwrap_or_default()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn connect_timeout(call_timeout: Duration) -> Duration {
    call_timeout.max(Duration::from_millis(100))
}

/// Reconnects quickly and gives up on an attempt fast, so a call made while
/// Redis is down fails within its timeout and the next call tries again.
fn manager_config(call_timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout(call_timeout)))
        .set_response_timeout(Some(call_timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(200))
}

fn unavailable(e: RedisError) -> StoreError {
    StoreError::Unavailable(e)
}

fn classify(e: RedisError) -> StoreError {
    if e.is_timeout() {
        StoreError::Timeout
    } else {
        unavailable(e)
    }
}

/// A script reply that is not what the script returns (a script of another
/// version, or a proxy in front of Redis mangling it): reported as redis-rs
/// reports a reply of the wrong type.
fn unexpected_reply(detail: String) -> StoreError {
    unavailable(RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "unexpected script reply",
        detail,
    )))
}

/// Whether an error suggests Sentinel now names another master: the link
/// broke, or the node we talk to was demoted (`READONLY`) or lost its master.
fn master_may_have_moved(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
}

async fn current_master(
    master: &watch::Receiver<Option<ConnectionManager>>,
) -> Result<ConnectionManager, StoreError> {
    let mut master = master.clone();
    let known = master
        .wait_for(Option::is_some)
        .await
        .map_err(|_| {
            unavailable(RedisError::from((
                ErrorKind::Client,
                "sentinel follower stopped",
            )))
        })?
        .clone();
    known.ok_or_else(|| {
        unavailable(RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "no master known yet",
        )))
    })
}

/// Keeps `tx` on a connection to the master Sentinel names: looks it up at
/// start, whenever a call fails in a way that suggests a failover, and every
/// `SENTINEL_RECHECK`. Ends when every store clone is gone.
async fn follow_master(
    mut sentinel: Sentinel,
    master_name: String,
    tx: watch::Sender<Option<ConnectionManager>>,
    stale: Arc<Notify>,
    config: ConnectionManagerConfig,
) {
    let mut current: Option<redis::ConnectionAddr> = None;
    while !tx.is_closed() {
        let lookup = tokio::time::timeout(
            SENTINEL_LOOKUP_TIMEOUT,
            sentinel.async_master_for(&master_name, None),
        )
        .await;
        match lookup {
            Ok(Ok(client)) => {
                let addr = client.get_connection_info().addr().clone();
                if current.as_ref() != Some(&addr) {
                    match ConnectionManager::new_lazy_with_config(client, config.clone()) {
                        Ok(manager) => {
                            tracing::info!(master = %addr, "redis sentinel: following master");
                            current = Some(addr);
                            tx.send_replace(Some(manager));
                        }
                        Err(e) => tracing::warn!(error = %e, "redis sentinel: cannot use master"),
                    }
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "redis sentinel: master lookup failed"),
            Err(_) => tracing::warn!("redis sentinel: master lookup timed out"),
        }
        tokio::time::sleep(SENTINEL_MIN_GAP).await;
        tokio::select! {
            _ = stale.notified() => {}
            _ = tokio::time::sleep(SENTINEL_RECHECK) => {}
        }
    }
}

/// How long after a call's timeout Redis may still run an `arrive` (see
/// [`RedisStore::too_late_ms`]): room for clock skew between the hosts.
const LATE_GRACE: Duration = Duration::from_secs(1);

impl RedisStore {
    /// Lanes of `route` the store listed that `limits` no longer has (see
    /// [`prepare_with`]): empty unless a reload took a lane out.
    fn stale_lanes(&self, route: &str, limits: &Limits) -> Vec<String> {
        let seen = self
            .lanes_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        seen.get(route).map_or_else(Vec::new, |names| {
            names
                .iter()
                .filter(|n| limits.lanes.index_of(n).is_none())
                .cloned()
                .collect()
        })
    }

    /// The lane names route `route` listed at the last look, if any.
    fn lanes_seen(&self, route: &str) -> Option<Vec<String>> {
        self.lanes_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(route)
            .cloned()
    }

    /// Reads the lane names the route's stats hash lists (main always
    /// among them) and remembers them.
    async fn look_up_lanes(&self, route: &str, limits: &Limits) -> Result<Vec<String>, StoreError> {
        let invocation = prepare(&self.scripts.lanes, route, limits, None);
        let field: String = self.run(&invocation).await?;
        let names = listed_lanes(&field);
        self.lanes_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(route.to_owned(), names.clone());
        Ok(names)
    }
    /// When an `arrive` sent now is too late to run, unix ms by this host's
    /// clock. A call that timed out here may still sit in the connection, and
    /// Redis runs it when it next reads (after a SIGSTOP, a long script, a
    /// stalled network): an arrival that ran then would put the visitor,
    /// whom this instance meanwhile gave a ticket from its local line, in
    /// the store's line at a later score than the ticket's. Past this time
    /// the script stores nothing.
    fn too_late_ms(&self) -> u64 {
        ms(Clock::system().now() + self.timeout + LATE_GRACE)
    }

    /// The arrive script's call for `arrivals`: each counted client's key
    /// once after the route's six, named by its index among them.
    fn arrive_invocation<'s>(
        &'s self,
        route: &str,
        arrivals: &[Arriving],
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> ScriptInvocation<'s> {
        let mut invocation = prepare(&self.scripts.arrive, route, limits, None);
        let indexes = client_keys(
            &mut invocation,
            route,
            arrivals.iter().map(|a| a.client.as_slice()),
            limits,
        );
        invocation
            .arg(capacity_arg(limits))
            .arg(limits.max_admit_per_tick)
            .arg(ms(limits.tick).max(1))
            .arg(ms(limits.session_ttl))
            .arg(ms(limits.abandon_after))
            .arg(limits.max_waiting)
            .arg(ms(limits.unconfirmed_session()))
            .arg(ms(limits.unconfirmed_ticket()))
            .arg(limits.client_places)
            .arg(limits.client_joins_per_minute)
            .arg(ms(limits.client_memory()))
            .arg(ms(JOIN_WINDOW))
            .arg(self.too_late_ms())
            .arg(known_epoch_us.map(|e| e.to_string()).unwrap_or_default())
            .arg(ms(limits.pass_ttl))
            .arg(opening_arg(limits));
        for (arrival, index) in arrivals.iter().zip(indexes) {
            invocation
                .arg(&store_id(&arrival.id)[..])
                .arg(u8::from(arrival.admit_now))
                .arg(index)
                .arg(limits.lanes.clamp(arrival.lane) + 1);
        }
        invocation
    }

    /// Runs an arrive call for `count` arrivals and reads their answers.
    async fn run_arrive(
        &self,
        invocation: &ScriptInvocation<'_>,
        count: usize,
    ) -> Result<Vec<Arrival>, StoreError> {
        let reply: Vec<u64> = self.run(invocation).await?;
        if reply.len() != count * 5 {
            return Err(unexpected_reply(format!(
                "arrive: {} numbers for {count} arrivals",
                reply.len()
            )));
        }
        reply
            .chunks_exact(5)
            .map(|answer| match answer[0] {
                // Run after this instance gave up on it (its clock ahead of
                // Redis's by more than the grace): as a timeout.
                5 => Err(StoreError::Timeout),
                1 => Ok(Arrival::Admitted),
                2 => Ok(Arrival::Waiting(place(answer, "arrive")?)),
                3 => Ok(Arrival::Full {
                    waiting_total: answer[1],
                }),
                4 => Ok(Arrival::TooMany {
                    retry_after: Duration::from_millis(answer[1]),
                }),
                other => Err(unexpected_reply(format!("arrive: reply kind {other}"))),
            })
            .collect()
    }
}

/// The client whose places a poll or renewal keeps alive: only a known
/// client, and only while the places limit is on.
fn touched<'a>(client: ClientKey<'a>, limits: &Limits) -> Option<ClientKey<'a>> {
    (!client.is_empty() && limits.client_places > 0).then_some(client)
}

/// Reads a script reply that is an integer array, or says what was wrong.
fn field(reply: &[u64], i: usize, what: &str) -> Result<u64, StoreError> {
    reply
        .get(i)
        .copied()
        .ok_or_else(|| unexpected_reply(format!("{what}: short reply")))
}

fn place(reply: &[u64], what: &str) -> Result<Place, StoreError> {
    Ok(Place {
        score_us: field(reply, 1, what)?,
        position: field(reply, 2, what)?,
        waiting_total: field(reply, 3, what)?,
        lane: usize::try_from(field(reply, 4, what)?)
            .map_err(|_| unexpected_reply(format!("{what}: no lane")))?,
    })
}

impl RedisStore {
    #[allow(clippy::too_many_arguments)]
    async fn arrive_on(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        limits: &Limits,
        admit_now: bool,
        known_epoch_us: Option<u64>,
        lane: usize,
    ) -> Result<Arrival, StoreError> {
        let one = [Arriving {
            id: *id,
            client: client.to_vec(),
            admit_now,
            lane,
        }];
        let invocation = self.arrive_invocation(route, &one, limits, known_epoch_us);
        let mut answers = self.run_arrive(&invocation, 1).await?;
        answers
            .pop()
            .ok_or_else(|| unexpected_reply("arrive: no answer".into()))
    }

    async fn arrive_batch_on(
        &self,
        route: &str,
        arrivals: &[Arriving],
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Vec<Arrival>, StoreError> {
        let invocation = self.arrive_invocation(route, arrivals, limits, known_epoch_us);
        let count = arrivals.len();
        if count == 0 {
            return Ok(Vec::new());
        }
        self.run_arrive(&invocation, count).await
    }

    async fn poll_on(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        ticket: TicketTimes,
        limits: &Limits,
    ) -> Result<Poll, StoreError> {
        let stale = self.stale_lanes(route, limits);
        let mut invocation = prepare_with(
            &self.scripts.poll,
            route,
            limits,
            &stale,
            touched(client, limits),
        );
        invocation
            .arg(&store_id(id)[..])
            .arg(ticket.score_us)
            .arg(ticket.seen_us)
            .arg(ms(limits.session_ttl))
            .arg(ms(limits.abandon_after))
            .arg(ms(limits.pass_ttl))
            .arg(ms(limits.client_memory()))
            .arg(ms(limits.confirm_within))
            .arg(limits.lanes.clamp(ticket.lane) + 1);
        let lanes = limits.lanes.clone();
        let reply: Vec<u64> = self.run(&invocation).await?;
        match field(&reply, 0, "poll")? {
            0 => Ok(Poll::Gone),
            1 => Ok(Poll::Admitted),
            2 => {
                // A waiter found in a stale lane is reported in the
                // first, where the next tick moves it.
                let mut place = place(&reply, "poll")?;
                place.lane = lanes.clamp(place.lane);
                Ok(Poll::Waiting(place))
            }
            other => Err(unexpected_reply(format!("poll: reply kind {other}"))),
        }
    }

    async fn renew_on(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        pass: PassTimes,
        limits: &Limits,
    ) -> Result<bool, StoreError> {
        let mut invocation = prepare(&self.scripts.renew, route, limits, touched(client, limits));
        invocation
            .arg(&store_id(id)[..])
            .arg(pass.issued_ms)
            .arg(u8::from(pass.confirmed))
            .arg(ms(limits.session_ttl))
            .arg(ms(limits.pass_ttl))
            .arg(ms(limits.client_memory()))
            .arg(u8::from(pass.granted_locally))
            .arg(capacity_arg(limits))
            .arg(ms(limits.unconfirmed_session()));
        let active: i64 = self.run(&invocation).await?;
        Ok(active == 1)
    }

    async fn leave_on(
        &self,
        route: &str,
        id: &VisitorId,
        limits: &Limits,
    ) -> Result<(), StoreError> {
        let stale = self.stale_lanes(route, limits);
        let mut invocation = prepare_with(&self.scripts.leave, route, limits, &stale, None);
        invocation.arg(&store_id(id)[..]);
        let _removed: i64 = self.run(&invocation).await?;
        Ok(())
    }

    async fn count_request_on(
        &self,
        route: &str,
        id: &VisitorId,
        limit: u64,
        limits: &Limits,
    ) -> Result<Counted, StoreError> {
        let mut invocation = prepare(&self.scripts.count_request, route, limits, None);
        invocation
            .key(uses_key(route, id))
            .arg(&store_id(id)[..])
            .arg(limit.max(1))
            .arg(ms(limits.session_ttl.saturating_add(limits.pass_ttl)));
        let counted: i64 = self.run(&invocation).await?;
        match counted {
            1 => Ok(Counted::Allowed),
            2 => Ok(Counted::Last),
            3 => Ok(Counted::Exhausted),
            4 => Ok(Counted::Gone),
            other => Err(unexpected_reply(format!("count_request: reply {other}"))),
        }
    }

    /// One tick in one slot; `open`, on a sub-line of a split route, says
    /// whether it may admit arrivals at once until the next tick.
    async fn admit_tick_on(
        &self,
        route: &str,
        limits: &Limits,
        known_epoch_us: Option<u64>,
        open: Option<bool>,
    ) -> Result<Tick, StoreError> {
        let route = route.to_owned();
        let limits = limits.clone();
        let seen = match self.lanes_seen(&route) {
            Some(seen) => seen,
            None => self.look_up_lanes(&route, &limits).await?,
        };
        let mut invocation = prepare(&self.scripts.admit_tick, &route, &limits, None);
        for stale in seen.iter().filter(|n| limits.lanes.index_of(n).is_none()) {
            invocation.key(lane_key(&route, stale));
        }
        invocation
            .arg(capacity_arg(&limits))
            .arg(limits.max_admit_per_tick)
            .arg(ms(limits.tick).max(1))
            .arg(ms(limits.arrival_grace))
            .arg(ms(limits.abandon_after))
            .arg(ms(limits.pass_ttl))
            .arg(known_epoch_us.map(|e| e.to_string()).unwrap_or_default())
            .arg(limits.lanes.len());
        for lane in limits.lanes.iter() {
            invocation.arg(lane.weight);
        }
        // Only a route with an opening needs the seed of its shuffle.
        let seed = if limits.opens_at_us.is_some() {
            super::shuffle_seed()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        } else {
            String::new()
        };
        invocation
            .arg(opening_arg(&limits))
            .arg(seed)
            .arg(open.map_or("", |o| if o { "1" } else { "0" }));
        let reply: Vec<u64> = self.run(&invocation).await?;
        let ran = field(&reply, 0, "admit_tick")? == 1;
        let opening = field(&reply, 8, "admit_tick")?;
        let lanes = usize::try_from(field(&reply, 9, "admit_tick")?).unwrap_or(usize::MAX);
        let scores_at = lanes
            .checked_mul(3)
            .and_then(|n| n.checked_add(10))
            .filter(|&at| at <= reply.len() && (reply.len() - at).is_multiple_of(2))
            .ok_or_else(|| unexpected_reply("admit_tick: short reply".into()))?;
        if ran {
            // What the store lists now: the configured lanes, and any
            // it named that this tick could not merge (looked up again).
            let mut cache = self
                .lanes_seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if field(&reply, 7, "admit_tick")? == 1 {
                cache.remove(&route);
            } else {
                cache.insert(
                    route.clone(),
                    limits.lanes.iter().map(|l| l.name.clone()).collect(),
                );
            }
        }
        Ok(Tick {
            ran,
            now_us: field(&reply, 1, "admit_tick")?,
            epoch_us: field(&reply, 2, "admit_tick")?,
            abandoned: field(&reply, 3, "admit_tick")?,
            no_shows: field(&reply, 4, "admit_tick")?,
            unconfirmed_sessions: field(&reply, 5, "admit_tick")?,
            unconfirmed_tickets: field(&reply, 6, "admit_tick")?,
            opened: opening.checked_sub(1),
            lane_admitted: reply[10..10 + lanes].to_vec(),
            lane_waiting: reply[10 + lanes..10 + 2 * lanes].to_vec(),
            lane_heads: reply[10 + 2 * lanes..scores_at]
                .iter()
                .map(|&score| (score != 0).then_some(score))
                .collect(),
            admitted_scores: reply[scores_at..].iter().step_by(2).copied().collect(),
            admitted_lanes: reply[scores_at..]
                .iter()
                .skip(1)
                .step_by(2)
                .map(|&lane| usize::try_from(lane.saturating_sub(1)).unwrap_or(0))
                .collect(),
        })
    }

    async fn heartbeats_on(
        &self,
        route: &str,
        beats: &[Heartbeat],
        limits: &Limits,
    ) -> Result<Vec<bool>, StoreError> {
        let stale = self.stale_lanes(route, limits);
        let mut invocation = prepare_with(&self.scripts.heartbeats, route, limits, &stale, None);
        let indexes = client_keys(
            &mut invocation,
            route,
            beats.iter().map(|b| b.client.as_slice()),
            limits,
        );
        invocation.arg(ms(limits.client_memory()));
        for (beat, index) in beats.iter().zip(indexes) {
            invocation.arg(&store_id(&beat.id)[..]).arg(index);
        }
        let empty = beats.is_empty();
        if empty {
            return Ok(Vec::new());
        }
        let reply: Vec<i64> = self.run(&invocation).await?;
        Ok(reply.into_iter().map(|in_line| in_line == 1).collect())
    }

    async fn ended_since_on(
        &self,
        route: &str,
        since_ms: u64,
        limits: &Limits,
    ) -> Result<Ended, StoreError> {
        let mut invocation = prepare(&self.scripts.ended, route, limits, None);
        invocation.arg(since_ms);
        let reply: Vec<Vec<u8>> = self.run(&invocation).await?;
        let (now, ids) = reply
            .split_first()
            .ok_or_else(|| unexpected_reply("ended_since: empty reply".into()))?;
        let now_ms = std::str::from_utf8(now)
            .ok()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| unexpected_reply("ended_since: no time".into()))?;
        let ids = ids
            .iter()
            .map(|id| {
                StoreId::try_from(id.as_slice())
                    .map_err(|_| unexpected_reply("ended_since: not an id".into()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Ended { ids, now_ms })
    }

    async fn move_lane_on(
        &self,
        route: &str,
        id: &VisitorId,
        to_lane: usize,
        limits: &Limits,
    ) -> Result<bool, StoreError> {
        let stale = self.stale_lanes(route, limits);
        let mut invocation = prepare_with(&self.scripts.move_lane, route, limits, &stale, None);
        invocation
            .arg(&store_id(id)[..])
            .arg(limits.lanes.clamp(to_lane) + 1);
        let moved: i64 = self.run(&invocation).await?;
        Ok(moved == 1)
    }

    async fn take_use_on(
        &self,
        route: &str,
        token_key: &[u8],
        max_uses: u32,
        expires_unix: u64,
    ) -> Result<InviteUse, StoreError> {
        let mut invocation = self.scripts.take_use.prepare_invoke();
        for key in route_keys(route) {
            invocation.key(key);
        }
        invocation
            .key(invite_key(route, token_key))
            .arg(max_uses)
            .arg(expires_unix);
        let taken: i64 = self.run(&invocation).await?;
        Ok(match taken {
            2 => InviteUse::Last,
            1 => InviteUse::Taken,
            _ => InviteUse::Refused,
        })
    }

    async fn line_record_on(
        &self,
        route: &str,
        limits: &Limits,
    ) -> Result<Option<LineRecord>, StoreError> {
        let invocation = prepare(&self.scripts.line_record, route, limits, None);
        let reply: Option<String> = self.run(&invocation).await?;
        match reply {
            None => Ok(None),
            Some(text) => LineRecord::parse(&text)
                .map(Some)
                .ok_or_else(|| unexpected_reply(format!("line_record: {text:.60}"))),
        }
    }

    async fn hold_on(&self, route: &str, limits: &Limits) -> Result<(), StoreError> {
        let mut invocation = prepare(&self.scripts.hold, route, limits, None);
        invocation.arg(ms(limits.pass_ttl));
        let _until: i64 = self.run(&invocation).await?;
        Ok(())
    }

    async fn stats_on(&self, route: &str, limits: &Limits) -> Result<RouteStats, StoreError> {
        let invocation = prepare(&self.scripts.stats, route, limits, None);
        let lanes = limits.lanes.len();
        let reply: Vec<String> = self.run(&invocation).await?;
        if reply.len() != 7 + 2 * lanes {
            return Err(unexpected_reply(format!(
                "stats: {} fields for {lanes} lanes",
                reply.len()
            )));
        }
        let number = |i: usize| {
            reply[i]
                .parse::<u64>()
                .map_err(|_| unexpected_reply(format!("stats: field {i} is not a number")))
        };
        let (waiting, active, admitted_total) = (number(0)?, number(1)?, number(2)?);
        let rate = &reply[3];
        let (epoch_us, hold_until_us, now_us) = (number(4)?, number(5)?, number(6)?);
        let admit_rate = rate
            .parse::<f64>()
            .map_err(|_| unexpected_reply(format!("stats: admit rate {rate:?} is not a number")))?;
        let lanes = (0..lanes)
            .map(|l| {
                Ok(LaneStats {
                    waiting: number(7 + 2 * l)?,
                    admitted_total: number(8 + 2 * l)?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(RouteStats {
            lanes,
            waiting,
            active,
            admitted_total,
            admit_rate,
            epoch_us,
            hold_until_us,
            now_us,
        })
    }

    async fn ready_on(&self) -> Result<(), StoreError> {
        let invocation = self.scripts.ready.prepare_invoke();
        let _one: i64 = self.run(&invocation).await?;
        Ok(())
    }
}

/// Each operation on a route split into sub-lines (`shards` > 1) goes to
/// `split.rs`; everything else to the one slot of the route.
impl QueueStore for RedisStore {
    async fn arrive(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        limits: &Limits,
        admit_now: bool,
        known_epoch_us: Option<u64>,
        lane: usize,
    ) -> Result<Arrival, StoreError> {
        if limits.shards > 1 {
            let one = [Arriving {
                id: *id,
                client: client.to_vec(),
                admit_now,
                lane,
            }];
            let mut answers = self
                .split_arrive(route, &one, limits, known_epoch_us)
                .await?;
            return answers
                .pop()
                .ok_or_else(|| unexpected_reply("arrive: no answer".into()));
        }
        self.arrive_on(route, id, client, limits, admit_now, known_epoch_us, lane)
            .await
    }

    async fn arrive_batch(
        &self,
        route: &str,
        arrivals: &[Arriving],
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Vec<Arrival>, StoreError> {
        if limits.shards > 1 {
            return self
                .split_arrive(route, arrivals, limits, known_epoch_us)
                .await;
        }
        self.arrive_batch_on(route, arrivals, limits, known_epoch_us)
            .await
    }

    async fn poll(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        ticket: TicketTimes,
        limits: &Limits,
    ) -> Result<Poll, StoreError> {
        if limits.shards > 1 {
            return self.split_poll(route, id, client, ticket, limits).await;
        }
        self.poll_on(route, id, client, ticket, limits).await
    }

    async fn renew(
        &self,
        route: &str,
        id: &VisitorId,
        client: ClientKey<'_>,
        pass: PassTimes,
        limits: &Limits,
    ) -> Result<bool, StoreError> {
        let (line, line_limits) = self.visitor_line(route, id, limits);
        self.renew_on(&line, id, client, pass, &line_limits).await
    }

    async fn leave(&self, route: &str, id: &VisitorId, limits: &Limits) -> Result<(), StoreError> {
        let (line, line_limits) = self.visitor_line(route, id, limits);
        self.leave_on(&line, id, &line_limits).await
    }

    async fn count_request(
        &self,
        route: &str,
        id: &VisitorId,
        limit: u64,
        limits: &Limits,
    ) -> Result<Counted, StoreError> {
        let (line, line_limits) = self.visitor_line(route, id, limits);
        self.count_request_on(&line, id, limit, &line_limits).await
    }

    async fn admit_tick(
        &self,
        route: &str,
        limits: &Limits,
        known_epoch_us: Option<u64>,
    ) -> Result<Tick, StoreError> {
        if limits.shards > 1 {
            return self.split_tick(route, limits, known_epoch_us).await;
        }
        let tick = self
            .admit_tick_on(route, limits, known_epoch_us, None)
            .await;
        if let Err(StoreError::Unavailable(e)) = &tick {
            if e.code() == Some("SPLIT") {
                let held = e
                    .detail()
                    .and_then(|d| d.split_whitespace().find_map(|w| w.parse().ok()))
                    .unwrap_or(0);
                self.refuse_split(route, held, 1);
            }
        }
        tick
    }

    async fn hold(&self, route: &str, limits: &Limits) -> Result<(), StoreError> {
        if limits.shards > 1 {
            return self.split_hold(route, limits).await;
        }
        self.hold_on(route, limits).await
    }

    async fn heartbeats(
        &self,
        route: &str,
        beats: &[Heartbeat],
        limits: &Limits,
    ) -> Result<Vec<bool>, StoreError> {
        if limits.shards > 1 {
            return self.split_heartbeats(route, beats, limits).await;
        }
        self.heartbeats_on(route, beats, limits).await
    }

    async fn ended_since(
        &self,
        route: &str,
        since_ms: u64,
        limits: &Limits,
    ) -> Result<Ended, StoreError> {
        if limits.shards > 1 {
            return self.split_ended_since(route, since_ms, limits).await;
        }
        self.ended_since_on(route, since_ms, limits).await
    }

    async fn move_lane(
        &self,
        route: &str,
        id: &VisitorId,
        to_lane: usize,
        limits: &Limits,
    ) -> Result<bool, StoreError> {
        let (line, line_limits) = self.visitor_line(route, id, limits);
        self.move_lane_on(&line, id, to_lane, &line_limits).await
    }

    async fn take_use(
        &self,
        route: &str,
        token_key: &[u8],
        max_uses: u32,
        expires_unix: u64,
    ) -> Result<InviteUse, StoreError> {
        self.take_use_on(route, token_key, max_uses, expires_unix)
            .await
    }

    async fn line_record(
        &self,
        route: &str,
        limits: &Limits,
    ) -> Result<Option<LineRecord>, StoreError> {
        if limits.shards > 1 {
            return self.split_line_record(route, limits).await;
        }
        self.line_record_on(route, limits).await
    }

    async fn stats(&self, route: &str, limits: &Limits) -> Result<RouteStats, StoreError> {
        if limits.shards > 1 {
            return self.split_stats(route, limits).await;
        }
        self.stats_on(route, limits).await
    }

    async fn override_of(&self, route: &str) -> Result<Option<Override>, StoreError> {
        let mut invocation = self.scripts.overrides.prepare_invoke();
        invocation.key(override_key(route)).arg("get");
        let text: Option<String> = self.run(&invocation).await?;
        Ok(text.as_deref().and_then(Override::decode))
    }

    async fn set_override(&self, route: &str, value: Option<&Override>) -> Result<(), StoreError> {
        let mut invocation = self.scripts.overrides.prepare_invoke();
        invocation.key(override_key(route));
        match value {
            Some(value) => invocation.arg("set").arg(value.encode()),
            None => invocation.arg("del"),
        };
        let _done: i64 = self.run(&invocation).await?;
        Ok(())
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.ready_on().await
    }

    async fn report_health(
        &self,
        route: &str,
        counts: &WindowCounts,
        every: Duration,
    ) -> Result<HealthLook, StoreError> {
        self.report_health_on(route, counts, every).await
    }

    async fn take_health_lease(
        &self,
        route: &str,
        every: Duration,
    ) -> Result<Option<u64>, StoreError> {
        self.take_health_lease_on(route, every).await
    }

    async fn set_capacity(
        &self,
        route: &str,
        lease: u64,
        capacity: u64,
        why: &str,
    ) -> Result<bool, StoreError> {
        self.set_capacity_on(route, lease, capacity, why).await
    }
}

/// The key of a route's runtime override, under the route's own hash tag
/// (a split route's too: its sub-lines share it).
fn override_key(route: &str) -> String {
    format!("qg:{{{route}}}:override")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_keeps_the_redis_error_as_its_source() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let err = classify(refused);
        let source = std::error::Error::source(&err)
            .and_then(|s| s.downcast_ref::<RedisError>())
            .map(RedisError::kind);
        assert_eq!(source, Some(ErrorKind::Io));
        assert!(err.to_string().starts_with("store unavailable: "), "{err}");
    }

    #[test]
    fn a_short_reply_is_unavailable_and_says_which_operation() {
        let err = place(&[2, 7], "arrive").unwrap_err();
        let StoreError::Unavailable(source) = &err else {
            panic!("expected Unavailable, got {err:?}");
        };
        assert_eq!(source.kind(), ErrorKind::UnexpectedReturnType);
        assert!(err.to_string().contains("arrive: short reply"), "{err}");
    }

    #[test]
    fn route_keys_share_one_hash_tag() {
        let keys = route_keys("tickets");
        assert_eq!(
            keys,
            [
                "qg:{tickets}:waiting",
                "qg:{tickets}:seen",
                "qg:{tickets}:active",
                "qg:{tickets}:tick",
                "qg:{tickets}:stats",
                "qg:{tickets}:beat",
            ]
        );
    }

    #[test]
    fn lane_keys_share_the_route_hash_tag_and_main_keeps_the_waiting_key() {
        assert_eq!(lane_key("tickets", "main"), "qg:{tickets}:waiting");
        assert_eq!(lane_key("tickets", "vip"), "qg:{tickets}:waiting:lane:vip");
        assert_eq!(
            invite_key("tickets", b"\x01\xff"),
            "qg:{tickets}:invite:01ff"
        );
        assert_eq!(listed_lanes(""), vec!["main"]);
        assert_eq!(
            listed_lanes(",vip,Bad Name,gold,"),
            vec!["vip", "gold", "main"]
        );
    }

    #[test]
    fn uses_keys_share_the_route_hash_tag() {
        assert_eq!(
            uses_key("tickets", &[0xab; 16]),
            format!("qg:{{tickets}}:uses:{}", "ab".repeat(16))
        );
    }

    #[test]
    fn client_keys_share_the_route_hash_tag_and_stay_printable() {
        assert_eq!(
            client_key("tickets", &[192, 0, 2, 7]),
            "qg:{tickets}:client:c0000207"
        );
        assert_eq!(client_key("t", b"}{"), "qg:{t}:client:7d7b");
    }

    #[test]
    fn every_route_script_starts_with_the_prelude_and_documents_itself() {
        for file in [
            include_str!("../../lua/arrive.lua"),
            include_str!("../../lua/poll.lua"),
            include_str!("../../lua/renew.lua"),
            include_str!("../../lua/leave.lua"),
            include_str!("../../lua/count_request.lua"),
            include_str!("../../lua/admit_tick.lua"),
            include_str!("../../lua/hold.lua"),
            include_str!("../../lua/stats.lua"),
            include_str!("../../lua/ready.lua"),
            include_str!("../../lua/move_lane.lua"),
            include_str!("../../lua/take_use.lua"),
            include_str!("../../lua/lanes.lua"),
        ] {
            let head: String = file
                .lines()
                .take_while(|line| line.starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n");
            assert!(head.starts_with("-- "), "script must open with a comment");
            for part in ["KEYS", "ARGV", "Returns", "Invariant"] {
                assert!(head.contains(part), "header lacks {part}: {head}");
            }
        }
    }
}
