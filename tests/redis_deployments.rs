//! The Redis store across deployments and failures: a Redis that restarts or
//! hangs, a three-node Cluster, and a Sentinel failover.

mod common;

use std::time::Duration;

use common::store::{long_limits, pass_of_second, polled_place, polled_ticket, waiting};
use common::{free_port, until_ok, RedisCluster, RedisSentinel, RedisServer};
use queuegate::queue::{
    Arrival, Limits, PassTimes, Poll, QueueStore, RedisStore, StoreError, VisitorId,
};

fn id(n: u8) -> VisitorId {
    let mut v = [0xa5; 16];
    v[0] = n;
    v
}

#[tokio::test]
async fn connect_does_not_wait_for_redis_and_ready_fails_while_it_is_down() {
    // The store must be configured for a port before Redis listens there, so
    // the port is picked here; another test may bind it first, and then the
    // whole sequence is tried again on another port.
    for _ in 0..20 {
        let port = free_port(false);
        let cfg = queuegate::config::RedisConfig {
            mode: queuegate::config::RedisMode::Standalone {
                url: format!("redis://127.0.0.1:{port}"),
            },
            timeout: Duration::from_millis(300),
        };
        // Nobody listens yet: connecting still succeeds, calls fail.
        let store = RedisStore::connect(&cfg).expect("connect is lazy");
        assert!(store.ready().await.is_err());
        assert!(store
            .arrive("r", &id(1), &[], &long_limits(1), true, None, 0)
            .await
            .is_err());
        // Redis comes up: the same store starts answering.
        let Some(_server) = RedisServer::try_start(port, None, &[]) else {
            continue;
        };
        until_ok("ready after start", || store.ready()).await;
        assert_eq!(
            store
                .arrive("r", &id(1), &[], &long_limits(1), true, None, 0)
                .await
                .unwrap(),
            Arrival::Admitted
        );
        return;
    }
    panic!("every port picked was taken before redis-server bound it");
}

#[tokio::test]
async fn readiness_fails_when_redis_dies_and_recovers_after_restart() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.config(Duration::from_millis(300))).unwrap();
    store.ready().await.unwrap();
    server.kill();
    assert!(store.ready().await.is_err());
    assert!(store.stats("r", &long_limits(1)).await.is_err());
    server.restart();
    until_ok("ready after restart", || store.ready()).await;
    // Scripts are gone with the old process: they are loaded again.
    let stats = store.stats("r", &long_limits(1)).await.unwrap();
    assert_eq!((stats.waiting, stats.active), (0, 0));
}

#[tokio::test]
async fn calls_time_out_while_redis_is_stopped() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.config(Duration::from_millis(200))).unwrap();
    store.ready().await.unwrap();
    server.pause();
    let arrive = store
        .arrive("r", &id(1), &[], &long_limits(1), true, None, 0)
        .await;
    assert!(
        matches!(arrive, Err(StoreError::Timeout)),
        "expected a timeout, got {arrive:?}"
    );
    assert!(matches!(store.ready().await, Err(StoreError::Timeout)));
    server.resume();
    until_ok("ready after SIGCONT", || store.ready()).await;
    store.stats("r", &long_limits(1)).await.unwrap();
}

#[tokio::test]
async fn cluster_runs_each_route_on_its_slot() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.config(Duration::from_secs(2))).unwrap();
    until_ok("cluster ready", || store.ready()).await;
    let l = long_limits(1);
    let routes = ["tickets", "shop", "news", "login", "api"];
    for route in routes {
        assert_eq!(
            store
                .arrive(route, &id(1), &[], &l, true, None, 0)
                .await
                .unwrap(),
            Arrival::Admitted
        );
        let b = waiting(
            store
                .arrive(route, &id(2), &[], &l, true, None, 0)
                .await
                .unwrap(),
        );
        let c = waiting(
            store
                .arrive(route, &id(3), &[], &l, true, None, 0)
                .await
                .unwrap(),
        );
        assert_eq!((b.position, c.position), (1, 2));
        store.leave(route, &id(1), &long_limits(1)).await.unwrap();
        let tick = store.admit_tick(route, &l, None).await.unwrap();
        assert_eq!(tick.admitted_scores, vec![b.score_us]);
        assert_eq!(
            store
                .poll(route, &id(2), &[], polled_ticket(b.score_us), &l)
                .await
                .unwrap(),
            Poll::Admitted
        );
        // All six keys sit on the node that owns the route's slot.
        let waiting_key = format!("qg:{{{route}}}:waiting");
        let node = cluster.node_for(&waiting_key);
        let mut keys: Vec<String> = node.query(&["KEYS", &format!("qg:{{{route}}}:*")]);
        keys.sort();
        assert_eq!(keys.len(), 6, "{route}: {keys:?}");
    }
    // Routes spread over more than one node.
    let owners: std::collections::HashSet<u16> = routes
        .iter()
        .map(|r| cluster.node_for(&format!("qg:{{{r}}}:waiting")).port())
        .collect();
    assert!(owners.len() > 1);

    // Scripts flushed everywhere: the next calls load them again.
    for node in &cluster.nodes {
        let _: () = node.query(&["SCRIPT", "FLUSH"]);
    }
    for route in routes {
        let stats = store.stats(route, &l).await.unwrap();
        assert_eq!((stats.active, stats.waiting), (1, 1));
    }
}

#[tokio::test]
async fn sentinel_failover_keeps_the_line_going() {
    let mut trio = RedisSentinel::start();
    let store = RedisStore::connect(&trio.config(Duration::from_millis(500))).unwrap();
    until_ok("sentinel ready", || store.ready()).await;
    let l = long_limits(1);
    assert_eq!(
        store
            .arrive("r", &id(1), &[], &l, true, None, 0)
            .await
            .unwrap(),
        Arrival::Admitted
    );
    let stats = store.stats("r", &l).await.unwrap();
    let issued_s = stats.now_us / 1_000_000;
    let mut line = Vec::new();
    for n in 2..=4 {
        line.push(waiting(
            store
                .arrive("r", &id(n), &[], &l, true, None, 0)
                .await
                .unwrap(),
        ));
    }
    // Let the replica catch up, as it usually has by the time a master dies.
    trio.wait_for_replication();

    trio.master.kill();
    trio.wait_for_promotion();

    // Waiters keep their order and scores.
    let mut positions = Vec::new();
    for (i, place) in line.iter().enumerate() {
        let visitor = id(i as u8 + 2);
        let now = polled_place(
            until_ok("poll after failover", || {
                store.poll("r", &visitor, &[], polled_ticket(place.score_us), &l)
            })
            .await,
        );
        assert_eq!(now.score_us, place.score_us);
        positions.push(now.position);
    }
    assert_eq!(positions, vec![1, 2, 3]);
    // New visitors join behind them.
    let newcomer = waiting(
        store
            .arrive("r", &id(9), &[], &l, true, None, 0)
            .await
            .unwrap(),
    );
    assert_eq!(newcomer.position, 4);
    // The admitted visitor's pass still renews.
    assert!(store
        .renew("r", &id(1), &[], pass_of_second(issued_s), &l)
        .await
        .unwrap());
    // And the admitter admits the head once the slot frees. (A tick whose
    // answer came too late ran all the same, and the one after it in the
    // same window does not run: the head is asked.)
    store.leave("r", &id(1), &long_limits(1)).await.unwrap();
    let tick = until_ok("tick after failover", || store.admit_tick("r", &l, None)).await;
    assert!(
        tick.admitted_scores.is_empty() || tick.admitted_scores == vec![line[0].score_us],
        "{tick:?}"
    );
    let first = id(2);
    let head = until_ok("poll the head", || {
        store.poll("r", &first, &[], polled_ticket(line[0].score_us), &l)
    })
    .await;
    assert_eq!(head, Poll::Admitted);
}

/// A planned failover: the old master stays up as a replica and answers
/// writes with READONLY, which sends the store to Sentinel for the new one.
/// (A write that reaches the old master in the moment between the promotion
/// and its demotion is lost: the ticket's young score restores it, as
/// `missing_entries_come_back_only_under_the_epoch_rules` checks.)
#[tokio::test]
async fn sentinel_switchover_moves_writes_to_the_new_master() {
    let trio = RedisSentinel::start();
    let store = RedisStore::connect(&trio.config(Duration::from_millis(500))).unwrap();
    until_ok("sentinel ready", || store.ready()).await;
    let l = long_limits(1);
    assert_eq!(
        store
            .arrive("r", &id(1), &[], &l, true, None, 0)
            .await
            .unwrap(),
        Arrival::Admitted
    );
    let b = waiting(
        store
            .arrive("r", &id(2), &[], &l, true, None, 0)
            .await
            .unwrap(),
    );
    trio.wait_for_replication();

    trio.failover();
    trio.wait_for_promotion();
    trio.wait_for_demotion();

    let c = waiting(
        until_ok("arrive after switchover", || {
            store.arrive("r", &[3; 16], &[], &l, true, None, 0)
        })
        .await,
    );
    assert_eq!((c.position, c.waiting_total), (2, 2));
    assert_eq!(
        polled_place(
            store
                .poll("r", &id(2), &[], polled_ticket(b.score_us), &l)
                .await
                .unwrap()
        )
        .position,
        1
    );
    // The write landed on the promoted replica, not the demoted master.
    let on_new: i64 = trio.replica.query(&["ZCARD", "qg:{r}:waiting"]);
    assert_eq!(on_new, 2);
}

/// A route split in three (`shards: 3`) on the three-master Cluster: each
/// master holds one sub-line; wiping one loses its sessions' records and its
/// share, yet the visitors who held slots there come back, nobody new gets
/// in meanwhile, and the route never holds more sessions than its capacity.
#[tokio::test]
async fn a_split_route_lives_on_every_master_and_a_lost_sub_line_stays_within_capacity() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.config(Duration::from_secs(2))).unwrap();
    until_ok("cluster ready", || store.ready()).await;
    let l = Limits {
        capacity: 30,
        max_admit_per_tick: 100,
        tick: Duration::from_millis(50),
        pass_ttl: Duration::from_secs(2),
        shards: 3,
        ..long_limits(1)
    };
    let route = "launch";
    let visitor = |n: u32| {
        let mut v = [0x3c; 16];
        v[..4].copy_from_slice(&n.to_be_bytes());
        v
    };
    // Thirty in line, then admitted by the ticks, in join order.
    for n in 0..30 {
        waiting(
            store
                .arrive(route, &visitor(n), &[], &l, false, None, 0)
                .await
                .unwrap(),
        );
    }
    let mut known = None;
    let mut admitted = Vec::new();
    for _ in 0..100 {
        let tick = store.admit_tick(route, &l, known).await.unwrap();
        known = Some(tick.epoch_us);
        admitted.extend(tick.admitted_scores);
        if admitted.len() == 30 {
            break;
        }
        tokio::time::sleep(l.tick).await;
    }
    assert_eq!(admitted.len(), 30, "everyone admitted from the line");
    assert!(admitted.windows(2).all(|w| w[0] < w[1]));
    // Each confirms its session: a pass from before the loss.
    let issued_ms = store.stats(route, &l).await.unwrap().now_us / 1_000;
    let pass = PassTimes {
        issued_ms,
        confirmed: true,
        granted_locally: false,
    };
    for n in 0..30 {
        assert!(store
            .renew(route, &visitor(n), &[], pass, &l)
            .await
            .unwrap());
    }
    assert_eq!(store.stats(route, &l).await.unwrap().active, 30);
    for node in &cluster.nodes {
        let keys: Vec<String> = node.query(&["KEYS", "qg:{launch*"]);
        assert!(!keys.is_empty(), "node {} holds a sub-line", node.port());
    }

    // One master loses everything.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _: () = cluster.nodes[1].query(&["FLUSHALL"]);
    let after = store.stats(route, &l).await.unwrap();
    assert!(
        after.active < 30,
        "a sub-line's sessions went with the master"
    );
    let tick = store.admit_tick(route, &l, known).await.unwrap();
    assert_ne!(Some(tick.epoch_us), known, "the loss is noticed");
    // Newcomers wait: the other sub-lines are full, the lost one holds.
    for n in 100..110 {
        let arrival = store
            .arrive(route, &visitor(n), &[], &l, true, None, 0)
            .await
            .unwrap();
        assert!(matches!(arrival, Arrival::Waiting(_)), "{n}: {arrival:?}");
    }
    // Everyone who held a slot comes back.
    for n in 0..30 {
        assert!(
            store
                .renew(route, &visitor(n), &[], pass, &l)
                .await
                .unwrap(),
            "visitor {n} restored"
        );
        assert!(store.stats(route, &l).await.unwrap().active <= 30);
    }
    for _ in 0..10 {
        tokio::time::sleep(l.tick).await;
        let tick = store
            .admit_tick(route, &l, Some(tick.epoch_us))
            .await
            .unwrap();
        assert!(tick.admitted_scores.is_empty(), "nobody new while full");
        assert_eq!(store.stats(route, &l).await.unwrap().active, 30);
    }
}
