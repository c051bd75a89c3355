//! The store contract: one suite of checks that every `QueueStore` backend
//! must pass, written against a `Harness` so each backend runs the very same
//! checks (the memory store on tokio's paused clock, the Redis store on real
//! time against a real `redis-server`, standalone and Cluster).
//!
//! Durations are short (see `limits`) so real-time runs stay quick, and the
//! checks compare orders and counts, never exact times. Seen and active times
//! may be kept in milliseconds and join scores in microseconds.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::store::polled_ticket;
use common::{RedisCluster, RedisServer};
use queuegate::clock::Clock;
use queuegate::config::Mode;
use queuegate::queue::{
    store_id, Arrival, Arriving, Counted, Ended, Heartbeat, Held, InviteUse, Lane, Lanes, Limits,
    LineRecord, MemoryStore, Override, PassTimes, Place, Poll, QueueStore, RedisStore, RouteStats,
    Tick, TicketTimes, VisitorId,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What a backend provides to run the contract checks.
trait Harness {
    type S: QueueStore;
    /// The store under test.
    fn store(&self) -> &Self::S;
    /// Lets `d` of store time pass.
    async fn advance(&self, d: Duration);
    /// A route no other check uses.
    fn fresh_route(&mut self) -> String;
    /// Loses everything the store held (as a restart of the store would),
    /// while time goes on.
    async fn restart(&mut self);
    /// Another client of the same store, as a second instance has.
    fn second_client(&self) -> Self::S;
}

/// The memory store on tokio's paused clock.
struct Memory {
    clock: Clock,
    store: MemoryStore,
    routes: u32,
}

impl Memory {
    fn new() -> Memory {
        let clock = Clock::system();
        Memory {
            clock,
            store: MemoryStore::new(clock),
            routes: 0,
        }
    }
}

impl Harness for Memory {
    type S = MemoryStore;

    fn store(&self) -> &MemoryStore {
        &self.store
    }

    async fn advance(&self, d: Duration) {
        tokio::time::advance(d).await;
    }

    fn fresh_route(&mut self) -> String {
        self.routes += 1;
        format!("route{}", self.routes)
    }

    async fn restart(&mut self) {
        self.store = MemoryStore::new(self.clock);
    }

    /// A clone shares the routes: in one process, that is a second client.
    fn second_client(&self) -> MemoryStore {
        self.store.clone()
    }
}

/// The Redis store on real `redis-server` processes, on real time.
struct Redis {
    store: RedisStore,
    config: queuegate::config::RedisConfig,
    /// Every node holding data: one standalone server, or the Cluster's masters.
    nodes: Vec<RedisServer>,
    routes: u32,
}

impl Redis {
    fn standalone() -> Redis {
        let server = RedisServer::start();
        let config = server.config(Duration::from_secs(2));
        let store = RedisStore::connect(&config).expect("config is well formed");
        Redis {
            store,
            config,
            nodes: vec![server],
            routes: 0,
        }
    }

    fn cluster() -> Redis {
        let cluster = RedisCluster::start();
        let config = cluster.config(Duration::from_secs(2));
        let store = RedisStore::connect(&config).expect("config is well formed");
        Redis {
            store,
            config,
            nodes: cluster.nodes,
            routes: 0,
        }
    }
}

impl Harness for Redis {
    type S = RedisStore;

    fn store(&self) -> &RedisStore {
        &self.store
    }

    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    fn fresh_route(&mut self) -> String {
        self.routes += 1;
        format!("route{}", self.routes)
    }

    /// Empties every node, scripts included, as a restart without
    /// persistence would; the connections stay up.
    async fn restart(&mut self) {
        for node in &self.nodes {
            let _: () = node.query(&["FLUSHALL"]);
            let _: () = node.query(&["SCRIPT", "FLUSH"]);
        }
    }

    /// A connection of its own, as another instance has.
    fn second_client(&self) -> RedisStore {
        RedisStore::connect(&self.config).expect("config is well formed")
    }
}

/// Limits short enough for real-time runs; checks override what they need.
fn limits() -> Limits {
    Limits {
        capacity: 5,
        max_admit_per_tick: 100,
        tick: Duration::from_millis(50),
        session_ttl: Duration::from_secs(3),
        pass_ttl: Duration::from_secs(2),
        arrival_grace: Duration::from_millis(300),
        abandon_after: Duration::from_millis(300),
        max_waiting: 1_000,
        // Not shorter than the lives above: checks of confirmation set their own.
        confirm_within: Duration::from_secs(3),
        client_places: 0,
        client_joins_per_minute: 0,
        lanes: Lanes::default(),
        opens_at_us: None,
        shards: 1,
    }
}

fn visitor(n: u32) -> VisitorId {
    let mut id = [0x5a; 16];
    id[..4].copy_from_slice(&n.to_be_bytes());
    id
}

/// Client keys: an IPv4 address, an IPv6 /64.
const CLIENT_A: &[u8] = &[192, 0, 2, 1];
const CLIENT_B: &[u8] = &[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 7];

async fn arrive<H: Harness>(h: &H, route: &str, n: u32, limits: &Limits, now: bool) -> Arrival {
    arrive_from(h, route, n, &[], limits, now).await
}

async fn arrive_from<H: Harness>(
    h: &H,
    route: &str,
    n: u32,
    client: &[u8],
    limits: &Limits,
    now: bool,
) -> Arrival {
    h.store()
        .arrive(route, &visitor(n), client, limits, now, None, 0)
        .await
        .expect("arrive")
}

/// Joins the line (no admit-now) and returns the place.
async fn join<H: Harness>(h: &H, route: &str, n: u32, limits: &Limits) -> Place {
    match arrive(h, route, n, limits, false).await {
        Arrival::Waiting(place) => place,
        other => panic!("visitor {n} should wait, got {other:?}"),
    }
}

/// Polls with a ticket polled once right after it was issued.
async fn poll<H: Harness>(h: &H, route: &str, n: u32, score_us: u64, limits: &Limits) -> Poll {
    poll_with(h, route, n, polled_ticket(score_us), limits).await
}

async fn poll_with<H: Harness>(
    h: &H,
    route: &str,
    n: u32,
    ticket: TicketTimes,
    limits: &Limits,
) -> Poll {
    h.store()
        .poll(route, &visitor(n), &[], ticket, limits)
        .await
        .expect("poll")
}

async fn renew<H: Harness>(h: &H, route: &str, n: u32, pass: PassTimes, limits: &Limits) -> bool {
    h.store()
        .renew(route, &visitor(n), &[], pass, limits)
        .await
        .expect("renew")
}

/// A ticket last seen at the store's time now.
async fn seen_now<H: Harness>(h: &H, route: &str, score_us: u64, limits: &Limits) -> TicketTimes {
    TicketTimes {
        score_us,
        seen_us: stats(h, route, limits).await.now_us,
        lane: 0,
    }
}

async fn leave<H: Harness>(h: &H, route: &str, n: u32) {
    h.store()
        .leave(route, &visitor(n), &limits())
        .await
        .expect("leave");
}

async fn stats<H: Harness>(h: &H, route: &str, limits: &Limits) -> RouteStats {
    h.store().stats(route, limits).await.expect("stats")
}

/// A tick's answer, checked for fairness (DESIGN §9.4): nobody admitted
/// while someone in the same lane who joined earlier still waits.
fn fair(tick: Tick) -> Tick {
    assert_eq!(tick.inversions(), 0, "an admission inversion: {tick:?}");
    tick
}

async fn tick<H: Harness>(h: &H, route: &str, limits: &Limits) -> Vec<u64> {
    full_tick(h, route, limits).await.admitted_scores
}

async fn full_tick<H: Harness>(h: &H, route: &str, limits: &Limits) -> Tick {
    let tick = h
        .store()
        .admit_tick(route, limits, None)
        .await
        .map(fair)
        .expect("tick");
    assert!(tick.ran, "a tick in a new window runs");
    tick
}

/// Advances `total` in steps, polling the given waiters after each step so
/// they stay in line.
async fn wait_polling<H: Harness>(
    h: &H,
    route: &str,
    total: Duration,
    waiters: &[(u32, u64)],
    limits: &Limits,
) {
    let step = Duration::from_millis(100);
    let mut passed = Duration::ZERO;
    while passed < total {
        h.advance(step).await;
        passed += step;
        for &(n, score) in waiters {
            poll(h, route, n, score, limits).await;
        }
    }
}

fn tick_window(now_us: u64, limits: &Limits) -> u128 {
    u128::from(now_us) / limits.tick.as_micros()
}

/// Creates the route's state and lets more than two seconds pass, so that a
/// pass issued from now on is clearly younger than the route's epoch.
async fn settled_route<H: Harness>(h: &mut H, limits: &Limits) -> String {
    let route = h.fresh_route();
    join(h, &route, 9_999, limits).await;
    leave(h, &route, 9_999).await;
    h.advance(Duration::from_millis(2_100)).await;
    route
}

/// A pass issued now (store time); `confirmed` once a renewal issued it.
async fn pass_issued<H: Harness>(
    h: &H,
    route: &str,
    confirmed: bool,
    limits: &Limits,
) -> PassTimes {
    PassTimes {
        issued_ms: stats(h, route, limits).await.now_us / 1_000,
        confirmed,
        granted_locally: false,
    }
}

async fn admit_now_when_free<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 2,
        ..limits()
    };
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    assert_eq!(arrive(h, &route, 2, &limits, true).await, Arrival::Admitted);
    let place = join(h, &route, 3, &limits).await;
    assert_eq!((place.position, place.waiting_total), (1, 1));
    let s = stats(h, &route, &limits).await;
    assert_eq!((s.active, s.waiting, s.admitted_total), (2, 1, 2));

    // Without admit-now a visitor joins the line even when there is room.
    let other = h.fresh_route();
    let place = join(h, &other, 1, &limits).await;
    assert_eq!(place.position, 1);
    assert_eq!(stats(h, &other, &limits).await.active, 0);
}

async fn joins_when_full<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 1,
        ..limits()
    };
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    let Arrival::Waiting(b) = arrive(h, &route, 2, &limits, true).await else {
        panic!("the second visitor should wait");
    };
    let Arrival::Waiting(c) = arrive(h, &route, 3, &limits, true).await else {
        panic!("the third visitor should wait");
    };
    assert_eq!((b.position, c.position, c.waiting_total), (1, 2, 2));
    assert!(b.score_us < c.score_us);

    // A slot frees up, but people are in line: a newcomer joins behind them.
    leave(h, &route, 1).await;
    let Arrival::Waiting(d) = arrive(h, &route, 4, &limits, true).await else {
        panic!("a newcomer must not pass the line");
    };
    assert_eq!((d.position, d.waiting_total), (3, 3));
    assert_eq!(stats(h, &route, &limits).await.active, 0);
}

async fn fifo_admission_order<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 1,
        abandon_after: Duration::from_secs(30),
        ..limits()
    };
    let mut by_score = HashMap::new();
    let mut scores = Vec::new();
    for n in 0..20 {
        let place = join(h, &route, n, &limits).await;
        assert_eq!(place.position, u64::from(n) + 1);
        by_score.insert(place.score_us, n);
        scores.push(place.score_us);
    }
    assert!(
        scores.windows(2).all(|w| w[0] < w[1]),
        "join scores strictly increase"
    );

    let mut order = Vec::new();
    while order.len() < 20 {
        h.advance(limits.tick).await;
        let admitted = tick(h, &route, &limits).await;
        assert_eq!(admitted.len(), 1, "capacity 1 admits one at a time");
        let n = by_score[&admitted[0]];
        assert_eq!(
            poll(h, &route, n, admitted[0], &limits).await,
            Poll::Admitted
        );
        leave(h, &route, n).await;
        order.push(n);
    }
    assert_eq!(order, (0..20).collect::<Vec<_>>());
}

async fn admit_never_exceeds_capacity<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 5,
        max_admit_per_tick: 3,
        session_ttl: Duration::from_secs(1),
        ..limits()
    };
    let mut rng = StdRng::seed_from_u64(0x9e37_79b9);
    let mut tickets: HashMap<u32, u64> = HashMap::new();
    let mut most_active = 0;
    for step in 0..300 {
        let n = rng.random_range(0..30);
        match rng.random_range(0..10) {
            0..=2 => {
                if let Arrival::Waiting(place) =
                    arrive(h, &route, n, &limits, rng.random_bool(0.5)).await
                {
                    tickets.insert(n, place.score_us);
                }
            }
            3..=4 => {
                if let Some(&score) = tickets.get(&n) {
                    poll(h, &route, n, score, &limits).await;
                }
            }
            5 => leave(h, &route, n).await,
            6..=7 => {
                let tick = h
                    .store()
                    .admit_tick(&route, &limits, None)
                    .await
                    .map(fair)
                    .expect("tick");
                assert!(tick.admitted_scores.len() as u64 <= limits.max_admit_per_tick);
            }
            _ => {
                h.advance(Duration::from_millis(rng.random_range(0..=100)))
                    .await
            }
        }
        let s = stats(h, &route, &limits).await;
        assert!(
            s.active <= limits.capacity,
            "step {step}: {} active over capacity {}",
            s.active,
            limits.capacity
        );
        most_active = most_active.max(s.active);
    }
    assert_eq!(
        most_active, limits.capacity,
        "the sequence filled the route"
    );
}

async fn per_tick_budget_shared_by_admit_now_and_tick<H: Harness>(h: &mut H) {
    let limits = Limits {
        capacity: 100,
        max_admit_per_tick: 3,
        tick: Duration::from_secs(1),
        abandon_after: Duration::from_secs(10),
        ..limits()
    };
    // Each part must run inside one tick window; on real time a part that
    // straddles a window boundary is run again on a fresh route.
    for attempt in 0..5 {
        let route = h.fresh_route();
        let start = stats(h, &route, &limits).await.now_us;
        let mut arrivals = Vec::new();
        for n in 0..5 {
            arrivals.push(arrive(h, &route, n, &limits, true).await);
        }
        let first = h
            .store()
            .admit_tick(&route, &limits, None)
            .await
            .map(fair)
            .expect("tick");
        let end = stats(h, &route, &limits).await.now_us;
        if tick_window(start, &limits) != tick_window(end, &limits) {
            assert!(attempt < 4, "never ran inside one tick window");
            continue;
        }
        let admitted = arrivals.iter().filter(|a| **a == Arrival::Admitted).count();
        assert_eq!(admitted, 3, "admit-now stops at the tick budget");
        assert!(matches!(arrivals[3], Arrival::Waiting(p) if p.position == 1));
        assert!(matches!(arrivals[4], Arrival::Waiting(p) if p.position == 2));
        assert!(first.admitted_scores.is_empty(), "budget already spent");

        // Next window: the admitter takes two, admit-now gets the last one.
        h.advance(limits.tick).await;
        let start = stats(h, &route, &limits).await.now_us;
        let second = tick(h, &route, &limits).await;
        let late = [
            arrive(h, &route, 5, &limits, true).await,
            arrive(h, &route, 6, &limits, true).await,
        ];
        let end = stats(h, &route, &limits).await.now_us;
        if tick_window(start, &limits) != tick_window(end, &limits) {
            assert!(attempt < 4, "never ran inside one tick window");
            continue;
        }
        assert_eq!(second.len(), 2);
        assert_eq!(late[0], Arrival::Admitted);
        assert!(matches!(late[1], Arrival::Waiting(p) if p.position == 1));
        let s = stats(h, &route, &limits).await;
        assert_eq!((s.admitted_total, s.active), (6, 6));
        return;
    }
}

async fn ghosts_dropped_not_admitted<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 1,
        ..limits()
    };
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    let b = join(h, &route, 2, &limits).await;
    let c = join(h, &route, 3, &limits).await;
    let d = join(h, &route, 4, &limits).await;
    // Everyone polls once (a ticket never polled is unconfirmed, not a ghost),
    // then only visitor 3 keeps polling.
    for (n, score) in [(2, b.score_us), (3, c.score_us), (4, d.score_us)] {
        poll(h, &route, n, score, &limits).await;
    }
    wait_polling(
        h,
        &route,
        Duration::from_millis(500),
        &[(3, c.score_us)],
        &limits,
    )
    .await;
    leave(h, &route, 1).await;
    let tick = h
        .store()
        .admit_tick(&route, &limits, None)
        .await
        .map(fair)
        .expect("tick");
    assert_eq!(tick.abandoned, 2);
    assert_eq!(tick.admitted_scores, vec![c.score_us]);
    assert_eq!(poll(h, &route, 2, b.score_us, &limits).await, Poll::Gone);
    let s = stats(h, &route, &limits).await;
    assert_eq!((s.waiting, s.active), (0, 1));
}

async fn no_show_frees_slot_after_arrival_grace<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 1,
        ..limits()
    };
    let b = join(h, &route, 2, &limits).await;
    let c = join(h, &route, 3, &limits).await;
    assert_eq!(tick(h, &route, &limits).await, vec![b.score_us]);
    assert_eq!(stats(h, &route, &limits).await.active, 1);
    // Visitor 2 never shows up; visitor 3 keeps polling.
    wait_polling(
        h,
        &route,
        Duration::from_millis(500),
        &[(3, c.score_us)],
        &limits,
    )
    .await;
    let tick = h
        .store()
        .admit_tick(&route, &limits, None)
        .await
        .map(fair)
        .expect("tick");
    assert_eq!(tick.no_shows, 1);
    assert_eq!(tick.admitted_scores, vec![c.score_us]);
    assert_eq!(poll(h, &route, 2, b.score_us, &limits).await, Poll::Gone);
    assert_eq!(stats(h, &route, &limits).await.active, 1);
}

async fn purged_no_show_rejoins_at_the_back<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    // A no-show's ticket is still younger than `abandon_after` when it polls
    // again: only the purge can tell it from a write lost in a failover.
    let limits = Limits {
        capacity: 1,
        abandon_after: Duration::from_secs(30),
        ..limits()
    };
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    let b = join(h, &route, 2, &limits).await;
    leave(h, &route, 1).await;
    assert_eq!(tick(h, &route, &limits).await, vec![b.score_us]);
    // Visitor 2 never shows up within the arrival grace.
    h.advance(limits.arrival_grace + Duration::from_millis(200))
        .await;
    assert_eq!(
        poll(h, &route, 2, b.score_us, &limits).await,
        Poll::Gone,
        "a no-show past its grace is gone, purged or not"
    );
    let purge = h
        .store()
        .admit_tick(&route, &limits, None)
        .await
        .map(fair)
        .expect("tick");
    assert_eq!((purge.no_shows, purge.abandoned), (1, 0));
    assert_eq!(stats(h, &route, &limits).await.active, 0);

    let c = join(h, &route, 3, &limits).await;
    assert_eq!(c.position, 1);
    assert_eq!(
        poll(h, &route, 2, b.score_us, &limits).await,
        Poll::Gone,
        "a purged no-show is not restored at its old score"
    );
    let b_again = join(h, &route, 2, &limits).await;
    assert!(b_again.score_us > c.score_us);
    assert_eq!((b_again.position, b_again.waiting_total), (2, 2));
    let Poll::Waiting(c_now) = poll(h, &route, 3, c.score_us, &limits).await else {
        panic!("visitor 3 should still wait");
    };
    assert_eq!(c_now.position, 1);
    let Poll::Waiting(b_now) = poll(h, &route, 2, b_again.score_us, &limits).await else {
        panic!("visitor 2 waits again with its new ticket");
    };
    assert_eq!(b_now, b_again);
    h.advance(limits.tick).await;
    assert_eq!(tick(h, &route, &limits).await, vec![c.score_us]);
}

async fn poll_after_admission_extends_session<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 1,
        // Well past the 600 ms step below, so a slow real-time run (Redis on
        // a busy machine) still polls within the session.
        session_ttl: Duration::from_secs(2),
        ..limits()
    };
    let b = join(h, &route, 2, &limits).await;
    assert_eq!(tick(h, &route, &limits).await, vec![b.score_us]);
    assert_eq!(
        poll(h, &route, 2, b.score_us, &limits).await,
        Poll::Admitted
    );
    // Past the arrival grace, within the session: still active, no no-show.
    h.advance(Duration::from_millis(600)).await;
    let tick = h
        .store()
        .admit_tick(&route, &limits, None)
        .await
        .map(fair)
        .expect("tick");
    assert_eq!(tick.no_shows, 0);
    assert_eq!(stats(h, &route, &limits).await.active, 1);
    assert_eq!(
        poll(h, &route, 2, b.score_us, &limits).await,
        Poll::Admitted
    );
    // Silent past the session: the slot frees, and it was no no-show.
    h.advance(Duration::from_millis(2_200)).await;
    assert_eq!(stats(h, &route, &limits).await.active, 0);
    let tick = h
        .store()
        .admit_tick(&route, &limits, None)
        .await
        .map(fair)
        .expect("tick");
    assert_eq!(tick.no_shows, 0);
}

async fn same_id_keeps_one_place<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 1,
        ..limits()
    };
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    let b = join(h, &route, 2, &limits).await;
    join(h, &route, 3, &limits).await;
    let again = join(h, &route, 2, &limits).await;
    assert_eq!(again, b.with_total(2));
    // Two tabs polling with the same ticket see the same place.
    for _ in 0..2 {
        assert_eq!(
            poll(h, &route, 2, b.score_us, &limits).await,
            Poll::Waiting(b.with_total(2))
        );
    }
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    let s = stats(h, &route, &limits).await;
    assert_eq!((s.waiting, s.active, s.admitted_total), (2, 1, 1));
}

trait PlaceExt {
    fn with_total(self, waiting_total: u64) -> Place;
}

impl PlaceExt for Place {
    fn with_total(self, waiting_total: u64) -> Place {
        Place {
            waiting_total,
            ..self
        }
    }
}

async fn leave_frees_slot_and_place<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 1,
        ..limits()
    };
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    join(h, &route, 2, &limits).await;
    let c = join(h, &route, 3, &limits).await;
    let d = join(h, &route, 4, &limits).await;
    leave(h, &route, 2).await;
    let Poll::Waiting(c_now) = poll(h, &route, 3, c.score_us, &limits).await else {
        panic!("visitor 3 should still wait");
    };
    let Poll::Waiting(d_now) = poll(h, &route, 4, d.score_us, &limits).await else {
        panic!("visitor 4 should still wait");
    };
    assert_eq!(
        (c_now.position, d_now.position, d_now.waiting_total),
        (1, 2, 2)
    );

    leave(h, &route, 1).await;
    assert_eq!(stats(h, &route, &limits).await.active, 0);
    assert_eq!(tick(h, &route, &limits).await, vec![c.score_us]);
    // Leaving unknown ids is fine.
    leave(h, &route, 77).await;
    let s = stats(h, &route, &limits).await;
    assert_eq!((s.waiting, s.active), (1, 1));
}

async fn renew_extends_and_reports_gone<H: Harness>(h: &mut H) {
    let limits = Limits {
        capacity: 2,
        session_ttl: Duration::from_secs(1),
        ..limits()
    };
    let route = settled_route(h, &limits).await;
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    let issued = pass_issued(h, &route, false, &limits).await;
    h.advance(Duration::from_millis(600)).await;
    assert!(renew(h, &route, 1, issued, &limits).await);
    // 1.2 s after arriving with a 1 s session: alive only thanks to the renewal.
    h.advance(Duration::from_millis(600)).await;
    assert!(renew(h, &route, 1, issued, &limits).await);
    assert_eq!(stats(h, &route, &limits).await.active, 1);

    leave(h, &route, 1).await;
    assert!(
        !renew(h, &route, 1, issued, &limits).await,
        "a session given up stays gone"
    );
    assert_eq!(stats(h, &route, &limits).await.active, 0);

    assert_eq!(arrive(h, &route, 2, &limits, true).await, Arrival::Admitted);
    let issued = pass_issued(h, &route, true, &limits).await;
    h.advance(Duration::from_millis(1_200)).await;
    assert!(
        !renew(h, &route, 2, issued, &limits).await,
        "an expired session is gone"
    );
    assert_eq!(stats(h, &route, &limits).await.active, 0);
}

async fn max_waiting_full<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 1,
        max_waiting: 3,
        ..limits()
    };
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    for n in 2..=4 {
        join(h, &route, n, &limits).await;
    }
    assert_eq!(
        arrive(h, &route, 5, &limits, true).await,
        Arrival::Full { waiting_total: 3 }
    );
    assert_eq!(stats(h, &route, &limits).await.waiting, 3);
    // Someone already in line is not turned away.
    assert!(matches!(
        arrive(h, &route, 3, &limits, false).await,
        Arrival::Waiting(p) if p.position == 2
    ));
    leave(h, &route, 2).await;
    let place = join(h, &route, 5, &limits).await;
    assert_eq!((place.position, place.waiting_total), (3, 3));
}

async fn restore_after_store_loss<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 5,
        max_admit_per_tick: 10,
        // Room for the calls between the loss and the last ticket's return on
        // a slow real-time run.
        abandon_after: Duration::from_millis(600),
        ..limits()
    };
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    // Visitor 1 comes back: its session is confirmed and its pass re-issued.
    let first = pass_issued(h, &route, false, &limits).await;
    assert!(renew(h, &route, 1, first, &limits).await);
    let issued = pass_issued(h, &route, true, &limits).await;
    let b = join(h, &route, 2, &limits).await;
    let c = join(h, &route, 3, &limits).await;
    let d = join(h, &route, 4, &limits).await;
    let old_epoch = stats(h, &route, &limits).await.epoch_us;
    // The tickets grow older than `abandon_after` while their holders poll, so
    // only the epoch can tell that they were lost rather than given up.
    wait_polling(
        h,
        &route,
        Duration::from_millis(700),
        &[(2, b.score_us), (3, c.score_us), (4, d.score_us)],
        &limits,
    )
    .await;
    // Each ticket, re-issued on its last poll, says when it was last seen.
    let seen_us = stats(h, &route, &limits).await.now_us;
    let back = |score_us| TicketTimes {
        score_us,
        seen_us,
        lane: 0,
    };

    h.restart().await;

    // Visitor 3 comes back first, then 2: restored at their own scores.
    let Poll::Waiting(c_back) = poll_with(h, &route, 3, back(c.score_us), &limits).await else {
        panic!("a ticket from before the loss is restored");
    };
    assert_eq!((c_back.score_us, c_back.position), (c.score_us, 1));
    let s = stats(h, &route, &limits).await;
    assert!(
        s.hold_until_us > s.now_us,
        "a restored ticket starts a hold"
    );
    let Poll::Waiting(b_back) = poll_with(h, &route, 2, back(b.score_us), &limits).await else {
        panic!("a ticket from before the loss is restored");
    };
    assert_eq!((b_back.score_us, b_back.position), (b.score_us, 1));
    // A newcomer meets the hold: nobody new is admitted, even with room.
    let Arrival::Waiting(f) = arrive(h, &route, 6, &limits, true).await else {
        panic!("nobody new is admitted during the hold");
    };
    assert_eq!(f.position, 3);
    // The admitted visitor's pass is still honoured.
    assert!(renew(h, &route, 1, issued, &limits).await);
    // A later-returning ticket still goes ahead of the newcomer.
    let Poll::Waiting(d_back) = poll_with(h, &route, 4, back(d.score_us), &limits).await else {
        panic!("a ticket from before the loss is restored");
    };
    assert_eq!(d_back.position, 3);

    let s = stats(h, &route, &limits).await;
    assert!(s.epoch_us > old_epoch, "the new store has a new epoch");
    assert!(s.hold_until_us > s.now_us, "a hold is on");
    assert_eq!((s.waiting, s.active), (4, 1));
    assert!(tick(h, &route, &limits).await.is_empty(), "held");

    let waiters = [
        (2, b.score_us),
        (3, c.score_us),
        (4, d.score_us),
        (6, f.score_us),
    ];
    wait_polling(
        h,
        &route,
        limits.pass_ttl + Duration::from_millis(200),
        &waiters,
        &limits,
    )
    .await;
    assert_eq!(stats(h, &route, &limits).await.hold_until_us, 0);
    assert_eq!(
        tick(h, &route, &limits).await,
        vec![b.score_us, c.score_us, d.score_us, f.score_us]
    );
    assert_eq!(stats(h, &route, &limits).await.active, 5);
}

async fn lost_write_restored_when_young<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = limits();
    let b = join(h, &route, 2, &limits).await;
    let c = join(h, &route, 3, &limits).await;
    // A young ticket the store never held: its join was lost in a failover.
    // (It ties with visitor 2's score, and comes after it by id.)
    let lost = TicketTimes {
        score_us: b.score_us,
        seen_us: b.score_us + 1,
        lane: 0,
    };
    assert_eq!(
        poll_with(h, &route, 5, lost, &limits).await,
        Poll::Waiting(Place {
            score_us: lost.score_us,
            position: 2,
            waiting_total: 3,
            lane: 0,
        }),
        "a young ticket is restored at its own score"
    );
    assert_eq!(
        stats(h, &route, &limits).await.hold_until_us,
        0,
        "a lost write starts no hold"
    );
    // One never polled yet (a local line issued it during an outage): its
    // first poll, within confirm_within, confirms it where it stands.
    let first = poll_with(h, &route, 6, TicketTimes::new(c.score_us), &limits).await;
    let Poll::Waiting(first) = first else {
        panic!("a young ticket is restored on its first poll: {first:?}");
    };
    assert_eq!((first.score_us, first.position), (c.score_us, 4));
    leave(h, &route, 6).await;

    leave(h, &route, 5).await;
    let d = join(h, &route, 4, &limits).await;
    leave(h, &route, 4).await;
    wait_polling(
        h,
        &route,
        Duration::from_millis(500),
        &[(2, b.score_us), (3, c.score_us)],
        &limits,
    )
    .await;
    assert_eq!(poll(h, &route, 4, d.score_us, &limits).await, Poll::Gone);
    assert_eq!(stats(h, &route, &limits).await.waiting, 2);
}

async fn epoch_change_seen_by_admitter_starts_hold<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = limits();
    let first = h
        .store()
        .admit_tick(&route, &limits, None)
        .await
        .map(fair)
        .expect("tick");
    let epoch = first.epoch_us;
    let b = join(h, &route, 2, &limits).await;
    h.advance(limits.tick).await;
    let tick_same = h
        .store()
        .admit_tick(&route, &limits, Some(epoch))
        .await
        .expect("tick");
    assert_eq!(tick_same.admitted_scores, vec![b.score_us]);
    assert_eq!(stats(h, &route, &limits).await.hold_until_us, 0);

    // An instance that remembers another epoch: the store was lost.
    h.advance(limits.tick).await;
    let tick_other = h
        .store()
        .admit_tick(&route, &limits, Some(epoch + 1))
        .await
        .expect("tick");
    assert!(tick_other.ran);
    assert_eq!(tick_other.epoch_us, epoch);
    let s = stats(h, &route, &limits).await;
    assert!(s.hold_until_us > s.now_us, "a hold is on");
    let Arrival::Waiting(c) = arrive(h, &route, 3, &limits, true).await else {
        panic!("nobody new is admitted during the hold");
    };
    assert_eq!(c.position, 1);
    h.advance(limits.tick).await;
    assert!(tick(h, &route, &limits).await.is_empty(), "held");

    wait_polling(
        h,
        &route,
        limits.pass_ttl + Duration::from_millis(200),
        &[(3, c.score_us)],
        &limits,
    )
    .await;
    assert_eq!(tick(h, &route, &limits).await, vec![c.score_us]);
}

async fn epoch_change_seen_by_an_arrival_starts_hold<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = limits();
    let epoch = stats(h, &route, &limits).await.epoch_us;
    // The same epoch: an arrival with room is let in at once, no hold.
    let same = h
        .store()
        .arrive(&route, &visitor(1), &[], &limits, true, Some(epoch), 0)
        .await
        .expect("arrive");
    assert_eq!(same, Arrival::Admitted);
    assert_eq!(stats(h, &route, &limits).await.hold_until_us, 0);

    // An instance that remembers another epoch and has not ticked since the
    // store was lost: the arrival itself starts the hold and waits.
    h.advance(limits.tick).await;
    let other = h
        .store()
        .arrive(&route, &visitor(2), &[], &limits, true, Some(epoch + 1), 0)
        .await
        .expect("arrive");
    let Arrival::Waiting(place) = other else {
        panic!("an arrival after a store loss is not let in at once: {other:?}");
    };
    assert_eq!(place.position, 1);
    let s = stats(h, &route, &limits).await;
    assert!(s.hold_until_us > s.now_us, "a hold is on");
    // Later notices in the same epoch do not extend it.
    h.advance(limits.tick).await;
    let again = h
        .store()
        .arrive(&route, &visitor(3), &[], &limits, true, Some(epoch + 1), 0)
        .await
        .expect("arrive");
    assert!(matches!(again, Arrival::Waiting(_)), "{again:?}");
    assert_eq!(
        stats(h, &route, &limits).await.hold_until_us,
        s.hold_until_us
    );
}

async fn line_record_samples_the_line_the_tick_left<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 2,
        abandon_after: Duration::from_secs(30),
        ..limits()
    };
    assert_eq!(record(h, &route, &limits).await, None, "no tick yet");
    let mut scores = Vec::new();
    for n in 0..260 {
        scores.push(join(h, &route, n, &limits).await.score_us);
        // Visitor 150 leaves: the rank of everyone behind moves up one.
        if n == 150 {
            leave(h, &route, n).await;
        }
    }
    let tick = full_tick(h, &route, &limits).await;
    assert_eq!(tick.admitted_scores, scores[..2].to_vec());
    let line: Vec<u64> = scores[2..]
        .iter()
        .enumerate()
        .filter(|&(i, _)| i + 2 != 150)
        .map(|(_, &s)| s)
        .collect();
    let record = record(h, &route, &limits)
        .await
        .expect("a record after a tick");
    assert_eq!(record.epoch_us, tick.epoch_us);
    assert_eq!(record.waiting(), line.len() as u64);
    let ranks: Vec<u64> = queuegate::queue::record::sample_ranks(record.waiting()).collect();
    assert_eq!(
        record.lanes[0].samples,
        ranks
            .iter()
            .map(|&r| (r, line[r as usize - 1]))
            .collect::<Vec<_>>()
    );
    for (i, &score) in line.iter().enumerate() {
        let rank = i as u64 + 1;
        match record.position("main", score) {
            None => assert!(rank <= queuegate::queue::record::HEAD),
            Some(shown) => assert!(
                shown.abs_diff(rank) * 50 <= rank,
                "rank {rank} shown as {shown}"
            ),
        }
    }
    // The record is the tick's: joins after it are not in it.
    let late = join(h, &route, 999, &limits).await;
    assert_eq!(record.position("main", late.score_us), None);
}

async fn heartbeats_count_as_polls_for_those_in_line<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 0,
        abandon_after: Duration::from_secs(30),
        confirm_within: Duration::from_millis(400),
        ..limits()
    };
    let a = join(h, &route, 1, &limits).await;
    join(h, &route, 2, &limits).await;
    join(h, &route, 3, &limits).await;
    leave(h, &route, 3).await;
    let beats: Vec<Heartbeat> = [1, 3, 4]
        .map(|n| Heartbeat {
            id: visitor(n),
            client: CLIENT_A.to_vec(),
        })
        .to_vec();
    let in_line = h
        .store()
        .heartbeats(&route, &beats, &limits)
        .await
        .expect("heartbeats");
    assert_eq!(in_line, vec![true, false, false]);
    assert!(h
        .store()
        .heartbeats(&route, &[], &limits)
        .await
        .expect("no heartbeats")
        .is_empty());
    // Visitor 1's ticket was confirmed by its heartbeat; visitor 2's, never
    // polled, drops after confirm_within.
    h.advance(Duration::from_millis(600)).await;
    let tick = full_tick(h, &route, &limits).await;
    assert_eq!((tick.unconfirmed_tickets, tick.abandoned), (1, 0));
    assert!(matches!(
        poll(h, &route, 1, a.score_us, &limits).await,
        Poll::Waiting(p) if p.position == 1 && p.waiting_total == 1
    ));
    // Nothing came back for the one who left or the stranger.
    assert_eq!(stats(h, &route, &limits).await.waiting, 1);
}

async fn heartbeats_keep_ghosts_from_being_dropped<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 0,
        abandon_after: Duration::from_millis(400),
        ..limits()
    };
    let a = join(h, &route, 1, &limits).await;
    let b = join(h, &route, 2, &limits).await;
    poll(h, &route, 1, a.score_us, &limits).await;
    poll(h, &route, 2, b.score_us, &limits).await;
    let beat = [Heartbeat {
        id: visitor(2),
        client: Vec::new(),
    }];
    for _ in 0..4 {
        h.advance(Duration::from_millis(150)).await;
        h.store()
            .heartbeats(&route, &beat, &limits)
            .await
            .expect("heartbeats");
    }
    let tick = full_tick(h, &route, &limits).await;
    assert_eq!(tick.abandoned, 1, "the silent one is a ghost");
    assert!(matches!(
        poll(h, &route, 2, b.score_us, &limits).await,
        Poll::Waiting(p) if p.position == 1
    ));
}

async fn record<H: Harness>(h: &H, route: &str, limits: &Limits) -> Option<LineRecord> {
    h.store()
        .line_record(route, limits)
        .await
        .expect("line record")
}

async fn a_batch_arrives_as_its_arrivals_would_one_after_another<H: Harness>(h: &mut H) {
    let limits = Limits {
        capacity: 2,
        max_waiting: 5,
        client_places: 2,
        abandon_after: Duration::from_secs(30),
        ..limits()
    };
    let arrivals: Vec<Arriving> = [
        (0, CLIENT_A, true),
        (1, CLIENT_B, false),
        (2, CLIENT_A, true),
        (3, CLIENT_A, true),
        (4, &[][..], true),
        (2, CLIENT_A, true),
        (5, CLIENT_B, true),
        (6, &[][..], true),
        (7, &[][..], true),
        (8, &[][..], true),
    ]
    .map(|(n, client, admit_now)| Arriving {
        id: visitor(n),
        client: client.to_vec(),
        admit_now,
        lane: 0,
    })
    .to_vec();
    let one_by_one = h.fresh_route();
    let mut expected = Vec::new();
    for a in &arrivals {
        expected.push(
            h.store()
                .arrive(&one_by_one, &a.id, &a.client, &limits, a.admit_now, None, 0)
                .await
                .expect("arrive"),
        );
    }
    let batched = h.fresh_route();
    let got = h
        .store()
        .arrive_batch(&batched, &arrivals, &limits, None)
        .await
        .expect("arrive_batch");
    // Join scores differ (they are times); everything else is the same.
    let shape = |a: &Arrival| match a {
        Arrival::Waiting(p) => format!("waiting {} of {}", p.position, p.waiting_total),
        Arrival::TooMany { .. } => "too many".to_owned(),
        other => format!("{other:?}"),
    };
    assert_eq!(
        got.iter().map(shape).collect::<Vec<_>>(),
        expected.iter().map(shape).collect::<Vec<_>>()
    );
    assert_eq!(shape(&got[0]), "Admitted");
    assert_eq!(shape(&got[3]), "too many", "client A holds two places");
    let place = |a: &Arrival| match a {
        Arrival::Waiting(p) => (p.score_us, p.position),
        other => panic!("waiting, got {other:?}"),
    };
    assert_eq!(
        place(&got[2]),
        place(&got[5]),
        "the same id keeps its place in a batch"
    );
    assert!(matches!(got[9], Arrival::Full { waiting_total: 5 }));
    // New places (not the repeated id's) in the batch's order.
    let scores: Vec<u64> = got
        .iter()
        .enumerate()
        .filter_map(|(i, a)| match a {
            Arrival::Waiting(p) if i != 5 => Some(p.score_us),
            _ => None,
        })
        .collect();
    assert!(
        scores.windows(2).all(|w| w[0] <= w[1]),
        "the batch joins in its order: {scores:?}"
    );
    assert!(h
        .store()
        .arrive_batch(&batched, &[], &limits, None)
        .await
        .expect("an empty batch")
        .is_empty());
}

async fn ended_since_lists_the_places_ended_after_a_time<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        abandon_after: Duration::from_secs(30),
        ..limits()
    };
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    join(h, &route, 2, &limits).await;
    let none = ended(h, &route, 0, &limits).await;
    assert!(none.ids.is_empty());
    assert!(none.now_ms > 0);
    leave(h, &route, 1).await;
    let first = ended(h, &route, 0, &limits).await;
    assert_eq!(first.ids, vec![store_id(&visitor(1))]);
    assert!(first.now_ms >= none.now_ms);
    h.advance(Duration::from_millis(50)).await;
    leave(h, &route, 2).await;
    assert_eq!(
        ended(h, &route, first.now_ms + 1, &limits).await.ids,
        vec![store_id(&visitor(2))]
    );
    let all = ended(h, &route, 0, &limits).await;
    assert_eq!(
        all.ids,
        vec![store_id(&visitor(2)), store_id(&visitor(1))],
        "the most recent first"
    );
}

async fn ended<H: Harness>(h: &H, route: &str, since_ms: u64, limits: &Limits) -> Ended {
    h.store()
        .ended_since(route, since_ms, limits)
        .await
        .expect("ended_since")
}

async fn positions_and_totals_are_consistent<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 7,
        ..limits()
    };
    for n in 0..2 {
        assert_eq!(arrive(h, &route, n, &limits, true).await, Arrival::Admitted);
    }
    let mut line = Vec::new();
    for n in 2..52 {
        let place = join(h, &route, n, &limits).await;
        assert_eq!(
            (place.position, place.waiting_total),
            (n as u64 - 1, n as u64 - 1)
        );
        line.push((n, place.score_us));
    }
    // Every third waiter leaves.
    for &(n, _) in line.iter().step_by(3) {
        leave(h, &route, n).await;
    }
    line = line
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, w)| w)
        .collect();

    assert_line(h, &route, &line, &limits).await;

    let admitted = tick(h, &route, &limits).await;
    let head: Vec<u64> = line.iter().take(5).map(|&(_, s)| s).collect();
    assert_eq!(admitted, head, "the free slots go to the head of the line");
    assert_line(h, &route, &line[5..], &limits).await;
    let s = stats(h, &route, &limits).await;
    assert_eq!((s.active, s.admitted_total), (7, 7));
    assert!(s.admit_rate > 0.0);
    assert!(s.epoch_us <= s.now_us);
}

async fn client_places_limit_frees_when_a_place_is_given_up<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 1,
        client_places: 3,
        abandon_after: Duration::from_secs(30),
        ..limits()
    };
    // Client A: one session and two tickets, three places.
    let a = |n| arrive_from(h, &route, n, CLIENT_A, &limits, true);
    assert_eq!(a(1).await, Arrival::Admitted);
    let Arrival::Waiting(second) = a(2).await else {
        panic!("visitor 2 should wait");
    };
    assert!(matches!(a(3).await, Arrival::Waiting(_)));
    let Arrival::TooMany { retry_after } = a(4).await else {
        panic!("a fourth place is too many");
    };
    assert!(retry_after > Duration::ZERO);
    // An id already in line is no new place, and is not refused.
    assert_eq!(a(2).await, Arrival::Waiting(second.with_total(2)));
    // Other clients and unknown ones are not limited by A's places.
    assert!(matches!(
        arrive_from(h, &route, 5, CLIENT_B, &limits, true).await,
        Arrival::Waiting(_)
    ));
    assert!(matches!(
        arrive(h, &route, 6, &limits, true).await,
        Arrival::Waiting(_)
    ));

    // A ticket given up frees its place.
    leave(h, &route, 2).await;
    let Arrival::Waiting(seventh) = a(7).await else {
        panic!("a place given up is free again");
    };
    assert!(matches!(a(8).await, Arrival::TooMany { .. }));
    // An admitted waiter still holds a place; the session given up does not.
    leave(h, &route, 1).await;
    let admitted = tick(h, &route, &limits).await;
    assert_eq!(admitted.len(), 1, "visitor 3 is admitted");
    assert!(matches!(a(9).await, Arrival::Waiting(_)));
    assert!(matches!(a(10).await, Arrival::TooMany { .. }));
    assert_eq!(
        poll(h, &route, 7, seventh.score_us, &limits).await,
        Poll::Waiting(Place {
            position: 3,
            waiting_total: 4,
            ..seventh
        })
    );
}

async fn client_joins_per_minute_limit<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 10,
        client_joins_per_minute: 3,
        abandon_after: Duration::from_secs(30),
        ..limits()
    };
    let a = |n, now| arrive_from(h, &route, n, CLIENT_A, &limits, now);
    assert_eq!(a(1, true).await, Arrival::Admitted);
    let Arrival::Waiting(second) = a(2, false).await else {
        panic!("visitor 2 should wait");
    };
    assert!(matches!(a(3, false).await, Arrival::Waiting(_)));
    // Arriving again with an id in line is no new join.
    assert_eq!(a(2, false).await, Arrival::Waiting(second.with_total(2)));
    // Joins count even once given up.
    for n in 1..=3 {
        leave(h, &route, n).await;
    }
    let Arrival::TooMany { retry_after } = a(4, true).await else {
        panic!("a fourth join within a minute is too many");
    };
    assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(60));
    assert!(matches!(
        arrive_from(h, &route, 5, CLIENT_B, &limits, false).await,
        Arrival::Waiting(_)
    ));
}

async fn empty_client_key_is_unlimited<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 2,
        client_places: 1,
        client_joins_per_minute: 1,
        ..limits()
    };
    for n in 0..8 {
        let arrival = arrive(h, &route, n, &limits, true).await;
        assert!(
            matches!(arrival, Arrival::Admitted | Arrival::Waiting(_)),
            "visitor {n}: {arrival:?}"
        );
    }
    let s = stats(h, &route, &limits).await;
    assert_eq!((s.active, s.waiting), (2, 6));
}

async fn too_many_leaves_nothing_behind<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 5,
        client_places: 1,
        ..limits()
    };
    assert_eq!(
        arrive_from(h, &route, 1, CLIENT_A, &limits, true).await,
        Arrival::Admitted
    );
    let before = stats(h, &route, &limits).await;
    assert!(matches!(
        arrive_from(h, &route, 2, CLIENT_A, &limits, true).await,
        Arrival::TooMany { .. }
    ));
    assert!(matches!(
        arrive_from(h, &route, 3, CLIENT_A, &limits, false).await,
        Arrival::TooMany { .. }
    ));
    let after = stats(h, &route, &limits).await;
    assert_eq!(
        (after.active, after.waiting, after.admitted_total),
        (before.active, before.waiting, before.admitted_total)
    );
    assert!(
        !renew(
            h,
            &route,
            2,
            pass_issued(h, &route, true, &limits).await,
            &limits
        )
        .await
    );
    // The refused visitor was not counted as a join either: once the place
    // is given up, it comes in as anyone would.
    leave(h, &route, 1).await;
    assert_eq!(
        arrive_from(h, &route, 2, CLIENT_A, &limits, true).await,
        Arrival::Admitted
    );
    assert_eq!(stats(h, &route, &limits).await.admitted_total, 2);
}

async fn unconfirmed_session_frees_its_slot_after_confirm_within<H: Harness>(h: &mut H) {
    let limits = Limits {
        capacity: 1,
        confirm_within: Duration::from_millis(400),
        ..limits()
    };
    let route = settled_route(h, &limits).await;
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    let pass = pass_issued(h, &route, false, &limits).await;
    assert!(matches!(
        arrive(h, &route, 2, &limits, true).await,
        Arrival::Waiting(_)
    ));
    leave(h, &route, 2).await;
    h.advance(Duration::from_millis(600)).await;
    assert_eq!(stats(h, &route, &limits).await.active, 0);
    let freed = full_tick(h, &route, &limits).await;
    assert_eq!((freed.unconfirmed_sessions, freed.no_shows), (1, 0));
    assert_eq!(arrive(h, &route, 3, &limits, true).await, Arrival::Admitted);
    assert!(
        !renew(h, &route, 1, pass, &limits).await,
        "an unconfirmed session past confirm_within is gone"
    );
}

async fn renew_confirms_a_session<H: Harness>(h: &mut H) {
    let limits = Limits {
        capacity: 1,
        confirm_within: Duration::from_millis(400),
        ..limits()
    };
    let route = settled_route(h, &limits).await;
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    let pass = pass_issued(h, &route, false, &limits).await;
    h.advance(Duration::from_millis(200)).await;
    assert!(renew(h, &route, 1, pass, &limits).await);
    // Past confirm_within, well within session_ttl: still active.
    h.advance(Duration::from_millis(600)).await;
    let tick = full_tick(h, &route, &limits).await;
    assert_eq!(tick.unconfirmed_sessions, 0);
    assert_eq!(stats(h, &route, &limits).await.active, 1);
    assert!(matches!(
        arrive(h, &route, 2, &limits, true).await,
        Arrival::Waiting(_)
    ));
}

async fn unconfirmed_ticket_drops_after_confirm_within_and_first_poll_confirms<H: Harness>(
    h: &mut H,
) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 0,
        abandon_after: Duration::from_secs(30),
        confirm_within: Duration::from_millis(400),
        ..limits()
    };
    let b = join(h, &route, 2, &limits).await;
    let c = join(h, &route, 3, &limits).await;
    h.advance(Duration::from_millis(200)).await;
    // Only visitor 3 comes back: its first poll confirms its ticket.
    assert!(matches!(
        poll(h, &route, 3, c.score_us, &limits).await,
        Poll::Waiting(p) if p.position == 2
    ));
    h.advance(Duration::from_millis(400)).await;
    let tick = full_tick(h, &route, &limits).await;
    assert_eq!((tick.unconfirmed_tickets, tick.abandoned), (1, 0));
    assert!(tick.admitted_scores.is_empty());
    assert_eq!(stats(h, &route, &limits).await.waiting, 1);
    assert_eq!(
        poll_with(h, &route, 2, TicketTimes::new(b.score_us), &limits).await,
        Poll::Gone,
        "a ticket never confirmed is not restored"
    );
    assert!(matches!(
        poll(h, &route, 3, c.score_us, &limits).await,
        Poll::Waiting(p) if p.position == 1
    ));
}

async fn leave_tombstone_blocks_lost_write_restore<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        abandon_after: Duration::from_secs(30),
        ..limits()
    };
    let b = join(h, &route, 2, &limits).await;
    assert!(matches!(
        poll(h, &route, 2, b.score_us, &limits).await,
        Poll::Waiting(_)
    ));
    let ticket = seen_now(h, &route, b.score_us, &limits).await;
    leave(h, &route, 2).await;
    assert_eq!(
        poll_with(h, &route, 2, ticket, &limits).await,
        Poll::Gone,
        "a ticket given up does not come back as a lost write"
    );
    assert_eq!(stats(h, &route, &limits).await.waiting, 0);

    // A session given up does not either, whatever its pass says.
    assert_eq!(arrive(h, &route, 3, &limits, true).await, Arrival::Admitted);
    leave(h, &route, 3).await;
    let old_pass = PassTimes {
        issued_ms: stats(h, &route, &limits).await.epoch_us / 1_000 - 1,
        confirmed: true,
        granted_locally: false,
    };
    assert!(!renew(h, &route, 3, old_pass, &limits).await);
    assert_eq!(stats(h, &route, &limits).await.active, 0);
}

async fn count<H: Harness>(h: &H, route: &str, n: u32, limit: u64, limits: &Limits) -> Counted {
    h.store()
        .count_request(route, &visitor(n), limit, limits)
        .await
        .expect("count_request")
}

async fn count_request_ends_the_session_at_the_limit<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 1,
        ..limits()
    };
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    let waiter = join(h, &route, 2, &limits).await;
    assert_eq!(waiter.position, 1);
    assert_eq!(count(h, &route, 1, 3, &limits).await, Counted::Allowed);
    assert_eq!(count(h, &route, 1, 3, &limits).await, Counted::Allowed);
    assert_eq!(stats(h, &route, &limits).await.active, 1);
    assert_eq!(count(h, &route, 1, 3, &limits).await, Counted::Last);
    assert_eq!(
        stats(h, &route, &limits).await.active,
        0,
        "the last request frees the slot at once"
    );
    assert_eq!(count(h, &route, 1, 3, &limits).await, Counted::Exhausted);
    let pass = PassTimes {
        issued_ms: stats(h, &route, &limits).await.now_us / 1_000,
        confirmed: true,
        granted_locally: false,
    };
    assert!(
        !renew(h, &route, 1, pass, &limits).await,
        "a session that made its requests is not renewed"
    );
    // The next waiter gets the slot at the next tick.
    assert!(matches!(
        poll(h, &route, 2, waiter.score_us, &limits).await,
        Poll::Waiting(_)
    ));
    h.advance(limits.tick).await;
    assert_eq!(tick(h, &route, &limits).await, vec![waiter.score_us]);
}

async fn count_request_after_leave_is_exhausted<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = limits();
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    leave(h, &route, 1).await;
    assert_eq!(count(h, &route, 1, 5, &limits).await, Counted::Exhausted);
    // One request per session: the first is the last.
    assert_eq!(arrive(h, &route, 2, &limits, true).await, Arrival::Admitted);
    assert_eq!(count(h, &route, 2, 1, &limits).await, Counted::Last);
    assert_eq!(count(h, &route, 2, 1, &limits).await, Counted::Exhausted);
    // An id with no session counts nothing.
    assert_eq!(count(h, &route, 9, 1, &limits).await, Counted::Gone);
    assert_eq!(count(h, &route, 9, 1, &limits).await, Counted::Gone);
    // Others are counted apart.
    assert_eq!(arrive(h, &route, 3, &limits, true).await, Arrival::Admitted);
    assert_eq!(count(h, &route, 3, 2, &limits).await, Counted::Allowed);
    assert_eq!(stats(h, &route, &limits).await.active, 1);
}

async fn count_request_outlives_the_tombstone<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = limits();
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    assert_eq!(count(h, &route, 1, 1, &limits).await, Counted::Last);
    // Past abandon_after a tick forgets the tombstone; the count is kept
    // session_ttl + pass_ttl, as long as a pass may come back.
    h.advance(limits.abandon_after * 2).await;
    full_tick(h, &route, &limits).await;
    assert_eq!(count(h, &route, 1, 1, &limits).await, Counted::Exhausted);
}

async fn restore_bounds_for_poll_after_a_wipe<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        abandon_after: Duration::from_millis(600),
        ..limits()
    };
    let b = join(h, &route, 2, &limits).await;
    let c = join(h, &route, 3, &limits).await;
    let d = join(h, &route, 4, &limits).await;
    // Visitor 4 polls once and falls silent; 2 keeps polling; 3 never polls.
    poll(h, &route, 4, d.score_us, &limits).await;
    let d_ticket = seen_now(h, &route, d.score_us, &limits).await;
    wait_polling(
        h,
        &route,
        Duration::from_millis(700),
        &[(2, b.score_us)],
        &limits,
    )
    .await;
    let b_ticket = seen_now(h, &route, b.score_us, &limits).await;

    h.restart().await;

    assert_eq!(
        poll_with(h, &route, 4, d_ticket, &limits).await,
        Poll::Gone,
        "silent for abandon_after: it would have been a ghost"
    );
    assert_eq!(
        poll_with(h, &route, 3, TicketTimes::new(c.score_us), &limits).await,
        Poll::Gone,
        "never confirmed: never restored"
    );
    let Poll::Waiting(b_back) = poll_with(h, &route, 2, b_ticket, &limits).await else {
        panic!("a live ticket lost with the store is restored");
    };
    assert_eq!((b_back.score_us, b_back.position), (b.score_us, 1));
    assert_eq!(stats(h, &route, &limits).await.waiting, 1);
}

async fn restore_bounds_for_renew_after_a_wipe<H: Harness>(h: &mut H) {
    let limits = Limits {
        capacity: 10,
        session_ttl: Duration::from_secs(1),
        ..limits()
    };
    let route = settled_route(h, &limits).await;
    // Visitor 1 renews as it browses; visitor 2 renewed once and went idle;
    // visitor 3 never came back after being admitted.
    for n in 1..=3 {
        assert_eq!(arrive(h, &route, n, &limits, true).await, Arrival::Admitted);
    }
    let unconfirmed = pass_issued(h, &route, false, &limits).await;
    assert!(renew(h, &route, 1, unconfirmed, &limits).await);
    assert!(renew(h, &route, 2, unconfirmed, &limits).await);
    let idle = pass_issued(h, &route, true, &limits).await;
    let mut browsing = idle;
    for _ in 0..3 {
        h.advance(Duration::from_millis(400)).await;
        assert!(renew(h, &route, 1, browsing, &limits).await);
        browsing = pass_issued(h, &route, true, &limits).await;
    }

    h.restart().await;
    h.advance(Duration::from_millis(50)).await;

    assert!(
        renew(h, &route, 1, browsing, &limits).await,
        "a session active at the loss is restored"
    );
    let epoch_ms = stats(h, &route, &limits).await.epoch_us / 1_000;
    assert!(
        !renew(h, &route, 2, idle, &limits).await,
        "idle for session_ttl before the loss: not restored"
    );
    assert!(
        !renew(h, &route, 3, unconfirmed, &limits).await,
        "never confirmed: not restored"
    );
    let at_epoch = PassTimes {
        issued_ms: epoch_ms,
        confirmed: true,
        granted_locally: false,
    };
    assert!(
        !renew(h, &route, 4, at_epoch, &limits).await,
        "a pass issued at the epoch is not from before the loss"
    );
    let just_before = PassTimes {
        issued_ms: epoch_ms - 1,
        ..at_epoch
    };
    assert!(renew(h, &route, 5, just_before, &limits).await);
    assert_eq!(stats(h, &route, &limits).await.active, 2);
}

async fn an_unconfirmed_session_is_restored_within_confirm_within<H: Harness>(h: &mut H) {
    let limits = Limits {
        capacity: 10,
        confirm_within: Duration::from_millis(800),
        ..limits()
    };
    let route = settled_route(h, &limits).await;
    // Visitor 1 is admitted at once, visitor 2 half a second later; neither
    // comes back before the loss.
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    let first = pass_issued(h, &route, false, &limits).await;
    h.advance(Duration::from_millis(500)).await;
    assert_eq!(arrive(h, &route, 2, &limits, true).await, Arrival::Admitted);
    let second = pass_issued(h, &route, false, &limits).await;

    h.restart().await;
    h.advance(Duration::from_millis(400)).await;

    assert!(
        !renew(h, &route, 1, first, &limits).await,
        "past confirm_within the store would have let it go"
    );
    assert!(
        renew(h, &route, 2, second, &limits).await,
        "within confirm_within the store held it: restored"
    );
    let epoch_ms = stats(h, &route, &limits).await.epoch_us / 1_000;
    let at_epoch = PassTimes {
        issued_ms: epoch_ms,
        ..second
    };
    assert!(
        !renew(h, &route, 3, at_epoch, &limits).await,
        "an unconfirmed pass issued at the epoch is not from before the loss"
    );
    // The restore confirmed the session: it lives session_ttl, past
    // confirm_within.
    h.advance(Duration::from_millis(900)).await;
    assert_eq!(stats(h, &route, &limits).await.active, 1);
}

/// A pass an instance granted on its own while the store could not answer.
async fn pass_granted_locally<H: Harness>(h: &H, route: &str, limits: &Limits) -> PassTimes {
    PassTimes {
        granted_locally: true,
        ..pass_issued(h, route, true, limits).await
    }
}

async fn a_pass_granted_locally_is_taken_back_while_there_is_room<H: Harness>(h: &mut H) {
    let limits = Limits {
        capacity: 2,
        session_ttl: Duration::from_secs(1),
        ..limits()
    };
    let route = settled_route(h, &limits).await;
    assert_eq!(arrive(h, &route, 1, &limits, true).await, Arrival::Admitted);
    // The store never heard of visitors 2, 3 and 4.
    let local = pass_granted_locally(h, &route, &limits).await;
    assert!(
        renew(h, &route, 2, local, &limits).await,
        "granted locally, with room: taken back"
    );
    assert_eq!(stats(h, &route, &limits).await.active, 2);
    assert!(
        !renew(h, &route, 3, local, &limits).await,
        "the route is full: a local grant does not take it over capacity"
    );
    let confirmed = pass_issued(h, &route, true, &limits).await;
    leave(h, &route, 1).await;
    assert!(
        !renew(h, &route, 4, confirmed, &limits).await,
        "a pass the store granted is not restored without a loss"
    );
    assert!(
        !renew(h, &route, 1, local, &limits).await,
        "a session given up stays gone, however its pass was granted"
    );
    let s = stats(h, &route, &limits).await;
    assert_eq!(s.active, 1);
    assert_eq!(s.hold_until_us, 0, "taking a session back starts no hold");
    // A local grant older than session_ttl would have run out by now.
    h.advance(Duration::from_millis(1_100)).await;
    assert!(!renew(h, &route, 3, local, &limits).await);
}

async fn hold_keeps_newcomers_out_for_pass_ttl<H: Harness>(h: &mut H) {
    let limits = Limits {
        capacity: 3,
        ..limits()
    };
    let route = settled_route(h, &limits).await;
    let a = join(h, &route, 1, &limits).await.score_us;
    h.store().hold(&route, &limits).await.expect("hold");
    let s = stats(h, &route, &limits).await;
    assert!(s.hold_until_us > s.now_us, "a hold is on");
    let Arrival::Waiting(b) = arrive(h, &route, 2, &limits, true).await else {
        panic!("nobody new is admitted at once during the hold");
    };
    assert!(tick(h, &route, &limits).await.is_empty(), "held");
    // A local grant comes back during the hold, room or not.
    let local = pass_granted_locally(h, &route, &limits).await;
    assert!(renew(h, &route, 3, local, &limits).await);
    // A second hold does not shorten the first.
    let until = stats(h, &route, &limits).await.hold_until_us;
    h.advance(Duration::from_millis(100)).await;
    h.store().hold(&route, &limits).await.expect("hold");
    assert!(stats(h, &route, &limits).await.hold_until_us >= until);
    wait_polling(
        h,
        &route,
        limits.pass_ttl + Duration::from_millis(200),
        &[(1, a), (2, b.score_us)],
        &limits,
    )
    .await;
    assert_eq!(tick(h, &route, &limits).await, vec![a, b.score_us]);
}

/// Limits with lanes `(name, weight)`, the first where newcomers go, and
/// waiters that stay in line without polling for the length of a check.
fn with_lanes(lanes: &[(&str, u32)], base: Limits) -> Limits {
    Limits {
        lanes: Lanes::new(
            lanes
                .iter()
                .map(|&(name, weight)| Lane {
                    name: name.to_owned(),
                    weight,
                })
                .collect(),
        )
        .expect("valid lanes"),
        abandon_after: Duration::from_secs(60),
        confirm_within: Duration::from_secs(60),
        ..base
    }
}

/// Joins visitor `n` to lane `lane` and returns the place.
async fn join_lane<H: Harness>(h: &H, route: &str, n: u32, lane: usize, limits: &Limits) -> Place {
    match h
        .store()
        .arrive(route, &visitor(n), &[], limits, false, None, lane)
        .await
        .expect("arrive")
    {
        Arrival::Waiting(place) => place,
        other => panic!("visitor {n} should wait, got {other:?}"),
    }
}

async fn lanes_share_admissions_by_weight<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = with_lanes(
        &[("main", 1), ("vip", 3)],
        Limits {
            capacity: 20,
            max_admit_per_tick: 100,
            max_waiting: 10_000,
            ..limits()
        },
    );
    // 400 waiters in each lane, joined alternately in batches.
    let mut who: HashMap<u64, (usize, u32)> = HashMap::new();
    let mut joined: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    for batch in 0..8u32 {
        let arrivals: Vec<Arriving> = (0..100u32)
            .map(|i| Arriving {
                id: visitor(batch * 100 + i),
                client: Vec::new(),
                admit_now: false,
                lane: (i % 2) as usize,
            })
            .collect();
        let answers = h
            .store()
            .arrive_batch(&route, &arrivals, &limits, None)
            .await
            .expect("arrive_batch");
        for (arrival, answer) in arrivals.iter().zip(answers) {
            let Arrival::Waiting(place) = answer else {
                panic!("everyone waits, got {answer:?}");
            };
            assert_eq!(place.lane, arrival.lane);
            let n = u32::from_be_bytes(arrival.id[..4].try_into().unwrap());
            who.insert(place.score_us, (arrival.lane, n));
            joined[arrival.lane].push(place.score_us);
        }
    }
    assert_eq!([joined[0].len(), joined[1].len()], [400, 400]);
    let mut admitted: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    let mut while_both = [0u64; 2];
    let mut after_vip = 0;
    while admitted[0].len() + admitted[1].len() < 800 {
        h.advance(limits.tick).await;
        let tick = full_tick(h, &route, &limits).await;
        let mut this_tick = [0u64; 2];
        for score in &tick.admitted_scores {
            let (lane, n) = who[score];
            this_tick[lane] += 1;
            admitted[lane].push(*score);
            leave_with(h, &route, n, &limits).await;
        }
        assert_eq!(tick.lane_admitted, this_tick.to_vec());
        let left = [
            joined[0].len() - admitted[0].len(),
            joined[1].len() - admitted[1].len(),
        ];
        assert_eq!(tick.lane_waiting, left.map(|l| l as u64).to_vec());
        if left[0] > 0 && left[1] > 0 {
            while_both[0] += this_tick[0];
            while_both[1] += this_tick[1];
        } else if left[1] == 0 && this_tick[1] == 0 {
            assert_eq!(
                this_tick[0],
                tick.admitted_scores.len() as u64,
                "one lane empty: the other gets every admission"
            );
            after_vip += this_tick[0];
        }
        let s = stats(h, &route, &limits).await;
        assert!(s.active <= limits.capacity, "{} active", s.active);
    }
    let ratio = while_both[1] as f64 / while_both[0] as f64;
    assert!(
        (ratio - 3.0).abs() <= 0.15,
        "admitted {while_both:?} while both lanes waited"
    );
    assert!(after_vip > 0, "main went on alone once vip was empty");
    for lane in 0..2 {
        assert_eq!(admitted[lane], joined[lane], "FIFO within lane {lane}");
    }
    let s = stats(h, &route, &limits).await;
    assert_eq!(s.lanes[0].admitted_total, 400);
    assert_eq!(s.lanes[1].admitted_total, 400);
}

/// Leaves with the lanes of `limits`.
async fn leave_with<H: Harness>(h: &H, route: &str, n: u32, limits: &Limits) {
    h.store()
        .leave(route, &visitor(n), limits)
        .await
        .expect("leave");
}

async fn a_place_is_within_its_lane_and_polls_report_the_lane<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = with_lanes(
        &[("main", 1), ("vip", 3)],
        Limits {
            capacity: 0,
            max_waiting: 5,
            ..limits()
        },
    );
    let m1 = join_lane(h, &route, 1, 0, &limits).await;
    let v1 = join_lane(h, &route, 2, 1, &limits).await;
    let m2 = join_lane(h, &route, 3, 0, &limits).await;
    let v2 = join_lane(h, &route, 4, 1, &limits).await;
    // A lane not configured is the first.
    let m3 = join_lane(h, &route, 5, 7, &limits).await;
    assert_eq!((m1.position, m1.lane), (1, 0));
    assert_eq!((v1.position, v1.waiting_total, v1.lane), (1, 1, 1));
    assert_eq!((m2.position, v2.position, v2.lane), (2, 2, 1));
    assert_eq!((m3.position, m3.waiting_total, m3.lane), (3, 3, 0));
    assert_eq!(
        h.store()
            .arrive(&route, &visitor(6), &[], &limits, false, None, 1)
            .await
            .expect("arrive"),
        Arrival::Full { waiting_total: 5 },
        "max_waiting counts every lane"
    );
    // The ticket's lane is not trusted: the waiter is found where it is.
    let Poll::Waiting(place) = poll(h, &route, 4, v2.score_us, &limits).await else {
        panic!("visitor 4 waits");
    };
    assert_eq!((place.position, place.waiting_total, place.lane), (2, 2, 1));
    // Someone leaving one lane moves nobody in the other.
    leave_with(h, &route, 1, &limits).await;
    let Poll::Waiting(place) = poll(h, &route, 2, v1.score_us, &limits).await else {
        panic!("visitor 2 waits");
    };
    assert_eq!((place.position, place.lane), (1, 1));
    let s = stats(h, &route, &limits).await;
    assert_eq!(s.waiting, 4);
    assert_eq!(
        s.lanes.iter().map(|l| l.waiting).collect::<Vec<_>>(),
        vec![2, 2]
    );
    assert_eq!(s.lane_share(&limits, 1), 0.75);
}

async fn move_lane_keeps_the_score<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = with_lanes(
        &[("main", 1), ("vip", 1)],
        Limits {
            capacity: 0,
            ..limits()
        },
    );
    let a = join_lane(h, &route, 1, 0, &limits).await;
    let b = join_lane(h, &route, 2, 0, &limits).await;
    let c = join_lane(h, &route, 3, 1, &limits).await;
    assert!(h
        .store()
        .move_lane(&route, &visitor(2), 1, &limits)
        .await
        .expect("move_lane"));
    let Poll::Waiting(moved) = poll(h, &route, 2, b.score_us, &limits).await else {
        panic!("visitor 2 waits");
    };
    assert_eq!(
        (
            moved.score_us,
            moved.position,
            moved.waiting_total,
            moved.lane
        ),
        (b.score_us, 1, 2, 1),
        "joined before visitor 3: ahead of it in the new lane"
    );
    let Poll::Waiting(behind) = poll(h, &route, 3, c.score_us, &limits).await else {
        panic!("visitor 3 waits");
    };
    assert_eq!(behind.position, 2);
    let Poll::Waiting(alone) = poll(h, &route, 1, a.score_us, &limits).await else {
        panic!("visitor 1 waits");
    };
    assert_eq!((alone.position, alone.waiting_total), (1, 1));
    assert!(!h
        .store()
        .move_lane(&route, &visitor(99), 1, &limits)
        .await
        .expect("move_lane"));
}

/// An override is one value per route, seen by every client of the store,
/// replaced whole and cleared; other routes and the line are untouched.
async fn an_override_is_shared_replaced_and_cleared<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let other_route = h.fresh_route();
    let limits = limits();
    let other = h.second_client();
    assert_eq!(h.store().override_of(&route).await.expect("read"), None);
    let a = join(h, &route, 1, &limits).await;
    let closed = Override {
        mode: Some(Held {
            value: Mode::Closed,
            file: Mode::Gate,
        }),
        capacity: None,
        by: "ops".to_owned(),
        at_ms: 1,
    };
    h.store()
        .set_override(&route, Some(&closed))
        .await
        .expect("set");
    assert_eq!(
        other.override_of(&route).await.expect("read"),
        Some(closed.clone()),
        "another instance sees it"
    );
    assert_eq!(other.override_of(&other_route).await.expect("read"), None);
    let capacity = Override {
        mode: None,
        capacity: Some(Held { value: 50, file: 5 }),
        by: "lead".to_owned(),
        at_ms: 2,
    };
    other
        .set_override(&route, Some(&capacity))
        .await
        .expect("set");
    assert_eq!(
        h.store().override_of(&route).await.expect("read"),
        Some(capacity),
        "replaced whole"
    );
    h.store().set_override(&route, None).await.expect("clear");
    assert_eq!(other.override_of(&route).await.expect("read"), None);
    // The line never noticed.
    assert!(
        matches!(poll(h, &route, 1, a.score_us, &limits).await, Poll::Waiting(p) if p.position == 1),
        "the line never noticed"
    );
}

async fn take_use_counts_an_invite_atomically<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let now_s = stats(h, &route, &limits()).await.now_us / 1_000_000;
    let token: &[u8] = b"invite-token-1";
    let store = h.store();
    let uses = futures_util::future::join_all(
        (0..20).map(|_| store.take_use(&route, token, 3, now_s + 3_600)),
    )
    .await;
    let uses: Vec<InviteUse> = uses.into_iter().map(|u| u.expect("take_use")).collect();
    assert_eq!(uses.iter().filter(|u| u.honoured()).count(), 3);
    assert_eq!(
        uses.iter().filter(|&&u| u == InviteUse::Last).count(),
        1,
        "one use is the last: {uses:?}"
    );
    assert_eq!(
        store
            .take_use(&route, b"another", 3, now_s + 3_600)
            .await
            .expect("take_use"),
        InviteUse::Taken,
        "each token counts apart"
    );
    assert_eq!(
        store
            .take_use(&route, b"once", 1, now_s + 3_600)
            .await
            .expect("take_use"),
        InviteUse::Last,
        "a token for one visitor is used up at once"
    );
    assert_eq!(
        store
            .take_use(&route, b"expired", 3, now_s.saturating_sub(1))
            .await
            .expect("take_use"),
        InviteUse::Refused,
        "an expired token is used up"
    );
}

async fn a_lane_removed_is_merged_into_the_first<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let base = Limits {
        capacity: 0,
        ..limits()
    };
    let before = with_lanes(&[("main", 1), ("vip", 2)], base.clone());
    let m1 = join_lane(h, &route, 1, 0, &before).await;
    let v1 = join_lane(h, &route, 2, 1, &before).await;
    let m2 = join_lane(h, &route, 3, 0, &before).await;
    let v2 = join_lane(h, &route, 4, 1, &before).await;
    full_tick(h, &route, &before).await;
    // The reload drops vip and puts gold first.
    let after = with_lanes(&[("gold", 1), ("main", 1)], base);
    // Before the next tick merges vip, its waiters are still found where
    // they are, whatever their tickets say: one whose ticket could not be
    // restored (silent for abandon_after by its own account) keeps its
    // place, reported in the first lane.
    let silent = TicketTimes {
        score_us: v1.score_us,
        seen_us: 1,
        lane: 0,
    };
    let Poll::Waiting(found) = poll_with(h, &route, 2, silent, &after).await else {
        panic!("a waiter of a lane the reload took out is still in line");
    };
    assert_eq!((found.score_us, found.lane), (v1.score_us, 0));
    h.advance(after.tick).await;
    full_tick(h, &route, &after).await;
    // main stays; vip's waiters are in gold, the first lane, at their scores.
    for (n, place, lane, position) in [(1, m1, 1, 1), (3, m2, 1, 2), (2, v1, 0, 1), (4, v2, 0, 2)] {
        let Poll::Waiting(now) = poll(h, &route, n, place.score_us, &after).await else {
            panic!("visitor {n} is still in line");
        };
        assert_eq!(
            (now.score_us, now.lane, now.position),
            (place.score_us, lane, position),
            "visitor {n}"
        );
    }
    let s = stats(h, &route, &after).await;
    assert_eq!(s.waiting, 4, "nobody lost");
    // Back to the lanes of before: gold is merged into main, vip is empty.
    h.advance(after.tick).await;
    full_tick(h, &route, &before).await;
    let s = stats(h, &route, &before).await;
    assert_eq!(
        (s.waiting, s.lanes[0].waiting, s.lanes[1].waiting),
        (4, 4, 0)
    );
}

async fn restore_after_store_loss_goes_into_the_lane_given<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = with_lanes(&[("main", 1), ("vip", 1)], limits());
    let v = join_lane(h, &route, 1, 1, &limits).await;
    let m = join_lane(h, &route, 2, 0, &limits).await;
    poll(h, &route, 1, v.score_us, &limits).await;
    poll(h, &route, 2, m.score_us, &limits).await;
    let seen_us = stats(h, &route, &limits).await.now_us;
    h.advance(Duration::from_millis(10)).await;
    h.restart().await;
    let ticket = |score_us, lane| TicketTimes {
        score_us,
        seen_us,
        lane,
    };
    let Poll::Waiting(back) = poll_with(h, &route, 1, ticket(v.score_us, 1), &limits).await else {
        panic!("visitor 1 is restored");
    };
    assert_eq!(
        (back.score_us, back.lane, back.position),
        (v.score_us, 1, 1)
    );
    // A lane the route does not have: the first.
    let Poll::Waiting(back) = poll_with(h, &route, 2, ticket(m.score_us, 9), &limits).await else {
        panic!("visitor 2 is restored");
    };
    assert_eq!(
        (back.score_us, back.lane, back.position),
        (m.score_us, 0, 1)
    );
    let s = stats(h, &route, &limits).await;
    assert_eq!(
        s.lanes.iter().map(|l| l.waiting).collect::<Vec<_>>(),
        vec![1, 1]
    );
}

/// Polls everyone in `line` (in order) and checks places and the total.
async fn assert_line<H: Harness>(h: &H, route: &str, line: &[(u32, u64)], limits: &Limits) {
    let total = line.len() as u64;
    for (i, &(n, score)) in line.iter().enumerate() {
        let expected = Place {
            score_us: score,
            position: i as u64 + 1,
            waiting_total: total,
            lane: 0,
        };
        assert_eq!(
            poll(h, route, n, score, limits).await,
            Poll::Waiting(expected)
        );
    }
    assert_eq!(stats(h, route, limits).await.waiting, total);
}

/// Limits for the opening checks: the route opens `in_ms` after the
/// store's time now; waiters stay in line without polling meanwhile.
async fn opening_limits<H: Harness>(h: &H, route: &str, in_ms: u64) -> Limits {
    let base = Limits {
        abandon_after: Duration::from_secs(20),
        arrival_grace: Duration::from_secs(20),
        ..limits()
    };
    let now_us = stats(h, route, &base).await.now_us;
    Limits {
        opens_at_us: Some(now_us + in_ms * 1_000),
        ..base
    }
}

/// Joins and confirms visitor `n` in lane `lane`; its place.
async fn join_confirmed<H: Harness>(
    h: &H,
    route: &str,
    n: u32,
    lane: usize,
    limits: &Limits,
) -> Place {
    let place = match h
        .store()
        .arrive(route, &visitor(n), &[], limits, true, None, lane)
        .await
        .expect("arrive")
    {
        Arrival::Waiting(place) => place,
        other => panic!("visitor {n} should wait, got {other:?}"),
    };
    let ticket = TicketTimes {
        score_us: place.score_us,
        seen_us: place.score_us,
        lane,
    };
    assert!(matches!(
        poll_with(h, route, n, ticket, limits).await,
        Poll::Waiting(_)
    ));
    place
}

/// The scores of visitors `0..n`, all still in line.
async fn scores_in_line<H: Harness>(
    h: &H,
    route: &str,
    n: u32,
    limits: &Limits,
) -> HashMap<u32, u64> {
    let mut scores = HashMap::new();
    for v in 0..n {
        match poll(h, route, v, 0, limits).await {
            Poll::Waiting(place) => {
                scores.insert(v, place.score_us);
            }
            other => panic!("visitor {v} should still wait, got {other:?}"),
        }
    }
    scores
}

/// Sleeps (store time) until the opening of `limits` has passed.
async fn until_opened<H: Harness>(h: &H, route: &str, limits: &Limits) {
    let opens_at_us = limits.opens_at_us.expect("an opening");
    let now_us = stats(h, route, limits).await.now_us;
    h.advance(Duration::from_micros(opens_at_us.saturating_sub(now_us)) + limits.tick * 2)
        .await;
}

async fn nothing_is_admitted_before_the_opening<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = opening_limits(h, &route, 1_000).await;
    // Room, nobody waiting, admit-now asked: still a place in line.
    let first = join_confirmed(h, &route, 1, 0, &limits).await;
    assert_eq!(first.position, 1);
    let second = join_confirmed(h, &route, 2, 0, &limits).await;
    let before = full_tick(h, &route, &limits).await;
    assert!(before.admitted_scores.is_empty(), "{before:?}");
    assert_eq!(before.opened, None);
    h.advance(limits.tick * 2).await;
    assert!(tick(h, &route, &limits).await.is_empty());

    until_opened(h, &route, &limits).await;
    let opening = full_tick(h, &route, &limits).await;
    assert_eq!(
        opening.opened,
        Some(2),
        "the pre-queue shuffled at the opening"
    );
    let opens_at_us = limits.opens_at_us.unwrap();
    let mut admitted = opening.admitted_scores.clone();
    admitted.sort_unstable();
    assert_eq!(
        admitted,
        [opens_at_us - 2, opens_at_us - 1],
        "both admitted at their shuffled scores, just before the opening"
    );
    assert!(first.score_us < opens_at_us && second.score_us < opens_at_us);
    // After the opening, a newcomer is admitted at once again.
    assert_eq!(arrive(h, &route, 3, &limits, true).await, Arrival::Admitted);
}

/// A reload that moves the opening before it comes (later, then sooner
/// than at first) keeps the pre-queue: nobody is admitted before the
/// opening in force, and everyone is shuffled and placed at it.
async fn moving_the_opening_before_it_keeps_the_pre_queue<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let first = Limits {
        capacity: 1,
        ..opening_limits(h, &route, 600).await
    };
    for n in 0..4 {
        join_confirmed(h, &route, n, 0, &first).await;
    }
    // Moved later: the first opening passes and nothing happens.
    let later = Limits {
        opens_at_us: first.opens_at_us.map(|at| at + 60_000_000),
        ..first.clone()
    };
    until_opened(h, &route, &first).await;
    let t = full_tick(h, &route, &later).await;
    assert!(t.admitted_scores.is_empty() && t.opened.is_none(), "{t:?}");
    assert_eq!(
        stats(h, &route, &later).await.waiting,
        4,
        "the pre-queue stays"
    );
    // Moved sooner, to now: the whole pre-queue is shuffled and one admitted.
    let now_us = stats(h, &route, &later).await.now_us;
    let sooner = Limits {
        opens_at_us: Some(now_us),
        ..first
    };
    h.advance(sooner.tick * 2).await;
    let t = full_tick(h, &route, &sooner).await;
    assert_eq!(t.opened, Some(4), "{t:?}");
    assert_eq!(t.admitted_scores.len(), 1, "{t:?}");
    let s = stats(h, &route, &sooner).await;
    assert_eq!((s.waiting, s.active), (3, 1), "nobody lost");
}

async fn the_opening_shuffles_once_when_two_ticks_race<H: Harness>(h: &mut H) {
    const N: u32 = 40;
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 0,
        max_waiting: 10_000,
        ..opening_limits(h, &route, 1_500).await
    };
    let mut arrival_order = Vec::new();
    for n in 0..N {
        arrival_order.push(n);
        join_confirmed(h, &route, n, 0, &limits).await;
    }
    until_opened(h, &route, &limits).await;
    let other = h.second_client();
    let (a, b) = tokio::join!(
        h.store().admit_tick(&route, &limits, None),
        other.admit_tick(&route, &limits, None)
    );
    let (a, b) = (a.map(fair).expect("tick"), b.map(fair).expect("tick"));
    let openings: Vec<u64> = [a.opened, b.opened].into_iter().flatten().collect();
    assert_eq!(openings, [u64::from(N)], "one of the two ran the opening");
    let order = |scores: &HashMap<u32, u64>| {
        let mut by_score: Vec<(u64, u32)> = scores.iter().map(|(&n, &s)| (s, n)).collect();
        by_score.sort_unstable();
        by_score.into_iter().map(|(_, n)| n).collect::<Vec<u32>>()
    };
    let shuffled = scores_in_line(h, &route, N, &limits).await;
    let opens_at_us = limits.opens_at_us.unwrap();
    let mut values: Vec<u64> = shuffled.values().copied().collect();
    values.sort_unstable();
    let expected: Vec<u64> = (opens_at_us - u64::from(N)..opens_at_us).collect();
    assert_eq!(values, expected, "the scores just before the opening");
    assert_ne!(
        order(&shuffled),
        arrival_order,
        "the order is not the order of arrival (1 chance in 40! to fail)"
    );
    // Later ticks, on either client, leave the order alone.
    for store in [h.store(), &other] {
        h.advance(limits.tick * 2).await;
        let later = store
            .admit_tick(&route, &limits, None)
            .await
            .map(fair)
            .expect("tick");
        assert_eq!(later.opened, None);
    }
    assert_eq!(scores_in_line(h, &route, N, &limits).await, shuffled);
}

async fn the_pre_queue_goes_first_in_each_lane_and_is_shuffled_within_it<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let base = opening_limits(h, &route, 1_000).await;
    let limits = Limits {
        capacity: 0,
        ..with_lanes(&[("main", 1), ("vip", 1)], base)
    };
    let opens_at_us = limits.opens_at_us.unwrap();
    // Five early in each lane, then three late in each.
    for n in 0..10 {
        join_confirmed(h, &route, n, (n % 2) as usize, &limits).await;
    }
    until_opened(h, &route, &limits).await;
    for n in 10..16 {
        let late = join_confirmed(h, &route, n, (n % 2) as usize, &limits).await;
        assert!(late.score_us >= opens_at_us);
    }
    let opening = full_tick(h, &route, &limits).await;
    assert_eq!(opening.opened, Some(10));
    let mut main_early = Vec::new();
    for n in 0..16u32 {
        let Poll::Waiting(place) = poll(h, &route, n, 0, &limits).await else {
            panic!("visitor {n} should still wait");
        };
        assert_eq!(
            place.lane,
            (n % 2) as usize,
            "visitor {n} stays in its lane"
        );
        assert_eq!(place.waiting_total, 8);
        if n < 10 {
            assert!(place.position <= 5, "early visitor {n} at {place:?}");
            assert!(place.score_us < opens_at_us);
        } else {
            assert!(place.position > 5, "late visitor {n} at {place:?}");
        }
        if n < 10 && n % 2 == 0 {
            main_early.push(place.position);
        }
    }
    main_early.sort_unstable();
    assert_eq!(main_early, [1, 2, 3, 4, 5]);
}

/// A route split in three sub-lines (`shards`): the Redis store keeps
/// three, each in its own slot; the memory store keeps one line, and the
/// answers must be the same.
fn split_limits() -> Limits {
    Limits {
        shards: 3,
        abandon_after: Duration::from_secs(30),
        ..limits()
    }
}

async fn leave_in<H: Harness>(h: &H, route: &str, n: u32, limits: &Limits) {
    h.store()
        .leave(route, &visitor(n), limits)
        .await
        .expect("leave");
}

/// Places count every sub-line, and admission follows join order across
/// them, within capacity.
async fn a_split_line_is_one_line_in_join_order<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 4,
        ..split_limits()
    };
    // The first tick gives the sub-lines their shares.
    full_tick(h, &route, &limits).await;
    let mut by_score = HashMap::new();
    let mut scores = Vec::new();
    for n in 0..24 {
        let place = join(h, &route, n, &limits).await;
        by_score.insert(place.score_us, n);
        scores.push(place.score_us);
    }
    assert!(
        scores.windows(2).all(|w| w[0] < w[1]),
        "join scores increase across sub-lines"
    );
    for n in 0..24u32 {
        match poll(h, &route, n, scores[n as usize], &limits).await {
            Poll::Waiting(place) => assert_eq!(
                (place.position, place.waiting_total),
                (u64::from(n) + 1, 24),
                "visitor {n}"
            ),
            other => panic!("visitor {n} should wait, got {other:?}"),
        }
    }
    let mut order = Vec::new();
    let mut rounds = 0;
    while order.len() < 24 && rounds < 100 {
        rounds += 1;
        h.advance(limits.tick).await;
        let admitted = tick(h, &route, &limits).await;
        assert!(admitted.len() <= 4, "a tick admits within capacity");
        assert!(stats(h, &route, &limits).await.active <= 4);
        for score in admitted {
            let n = by_score[&score];
            assert_eq!(poll(h, &route, n, score, &limits).await, Poll::Admitted);
            order.push(n);
            leave_in(h, &route, n, &limits).await;
        }
    }
    assert_eq!(order, (0..24).collect::<Vec<_>>());
}

/// Two instances ticking at once, arrivals admitted at once and people
/// leaving, so capacity keeps moving between sub-lines: never more active
/// than the capacity.
async fn split_shares_never_exceed_capacity<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 6,
        ..split_limits()
    };
    let other = h.second_client();
    let mut next = 0u32;
    let mut present: Vec<u32> = Vec::new();
    let mut most = 0;
    for round in 0..40 {
        let (a, b) = tokio::join!(
            h.store().admit_tick(&route, &limits, None),
            other.admit_tick(&route, &limits, None)
        );
        a.map(fair).expect("tick");
        b.map(fair).expect("tick");
        for _ in 0..6 {
            next += 1;
            arrive(h, &route, next, &limits, true).await;
            present.push(next);
        }
        let active = stats(h, &route, &limits).await.active;
        assert!(active <= limits.capacity, "round {round}: {active} active");
        most = most.max(active);
        for n in present.drain(..3) {
            leave_in(h, &route, n, &limits).await;
        }
        h.advance(limits.tick).await;
    }
    assert_eq!(most, limits.capacity, "the capacity was used");
    assert!(stats(h, &route, &limits).await.admitted_total >= 20);
}

/// The line record of a split route places a waiter behind the head
/// within 2 % of its place in the whole line.
async fn a_split_line_record_places_waiters_behind_the_head<H: Harness>(h: &mut H) {
    let route = h.fresh_route();
    let limits = Limits {
        capacity: 1,
        ..split_limits()
    };
    full_tick(h, &route, &limits).await;
    let arrivals: Vec<Arriving> = (0..600)
        .map(|n| Arriving {
            id: visitor(n),
            client: Vec::new(),
            admit_now: false,
            lane: 0,
        })
        .collect();
    // In batches of ten, as arrivals come in: the sub-lines' join times
    // interleave.
    let mut scores = Vec::new();
    for batch in arrivals.chunks(10) {
        let answers = h
            .store()
            .arrive_batch(&route, batch, &limits, None)
            .await
            .expect("arrive");
        scores.extend(answers.into_iter().map(|a| match a {
            Arrival::Waiting(place) => place.score_us,
            other => panic!("should wait, got {other:?}"),
        }));
    }
    // A batch joins each sub-line in one call, so join order across
    // sub-lines is the order of those calls: ranks come from the scores.
    let mut in_order = scores.clone();
    in_order.sort_unstable();
    h.advance(limits.tick).await;
    let admitted = tick(h, &route, &limits).await;
    assert_eq!(admitted, [in_order[0]], "the first in line is admitted");
    let record = h
        .store()
        .line_record(&route, &limits)
        .await
        .expect("record")
        .expect("a record after a tick");
    assert_eq!(record.waiting(), 599);
    for n in [400usize, 500, 599] {
        let rank = n as u64;
        let shown = record
            .position("main", in_order[n])
            .expect("behind the head: answered from the record");
        let error = shown.abs_diff(rank) as f64 / rank as f64;
        assert!(error <= 0.02, "rank {rank} shown {shown}");
    }
}

/// One test per check for a backend: `contract_suite!(module, harness
/// expression, #[test attribute])`.
macro_rules! contract_suite {
    ($module:ident, $harness:expr, #[$test:meta]) => {
        mod $module {
            use super::*;

            contract_suite!(@checks $harness, #[$test],
                admit_now_when_free,
                joins_when_full,
                fifo_admission_order,
                admit_never_exceeds_capacity,
                per_tick_budget_shared_by_admit_now_and_tick,
                ghosts_dropped_not_admitted,
                no_show_frees_slot_after_arrival_grace,
                purged_no_show_rejoins_at_the_back,
                poll_after_admission_extends_session,
                same_id_keeps_one_place,
                leave_frees_slot_and_place,
                renew_extends_and_reports_gone,
                max_waiting_full,
                restore_after_store_loss,
                lost_write_restored_when_young,
                epoch_change_seen_by_admitter_starts_hold,
                epoch_change_seen_by_an_arrival_starts_hold,
                line_record_samples_the_line_the_tick_left,
                ended_since_lists_the_places_ended_after_a_time,
                a_batch_arrives_as_its_arrivals_would_one_after_another,
                heartbeats_count_as_polls_for_those_in_line,
                heartbeats_keep_ghosts_from_being_dropped,
                positions_and_totals_are_consistent,
                client_places_limit_frees_when_a_place_is_given_up,
                client_joins_per_minute_limit,
                empty_client_key_is_unlimited,
                too_many_leaves_nothing_behind,
                unconfirmed_session_frees_its_slot_after_confirm_within,
                renew_confirms_a_session,
                unconfirmed_ticket_drops_after_confirm_within_and_first_poll_confirms,
                leave_tombstone_blocks_lost_write_restore,
                restore_bounds_for_poll_after_a_wipe,
                restore_bounds_for_renew_after_a_wipe,
                an_unconfirmed_session_is_restored_within_confirm_within,
                a_pass_granted_locally_is_taken_back_while_there_is_room,
                hold_keeps_newcomers_out_for_pass_ttl,
                count_request_ends_the_session_at_the_limit,
                count_request_after_leave_is_exhausted,
                count_request_outlives_the_tombstone,
                lanes_share_admissions_by_weight,
                a_place_is_within_its_lane_and_polls_report_the_lane,
                move_lane_keeps_the_score,
                take_use_counts_an_invite_atomically,
                an_override_is_shared_replaced_and_cleared,
                a_lane_removed_is_merged_into_the_first,
                restore_after_store_loss_goes_into_the_lane_given,
                nothing_is_admitted_before_the_opening,
                the_opening_shuffles_once_when_two_ticks_race,
                moving_the_opening_before_it_keeps_the_pre_queue,
                the_pre_queue_goes_first_in_each_lane_and_is_shuffled_within_it,
                a_split_line_is_one_line_in_join_order,
                split_shares_never_exceed_capacity,
                a_split_line_record_places_waiters_behind_the_head
            );
        }
    };
    (@checks $harness:expr, #[$test:meta], $($check:ident),+) => {
        $(
            #[$test]
            async fn $check() {
                let mut harness = $harness;
                super::$check(&mut harness).await;
            }
        )+
    };
}

contract_suite!(memory, Memory::new(), #[tokio::test(start_paused = true)]);
contract_suite!(redis, Redis::standalone(), #[tokio::test]);
contract_suite!(redis_cluster, Redis::cluster(), #[tokio::test]);
