//! The Redis store against a real standalone `redis-server`: each operation's
//! semantics, script reload, store loss (FLUSHALL), the key layout, and
//! several instances sharing one Redis. What every backend must do is
//! checked by the store contract (tests/store_contract.rs), on Redis too.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use common::store::{long_limits, pass_of_second, polled_place, polled_ticket, waiting};
use common::RedisServer;
use queuegate::queue::{
    store_id, Arrival, Arriving, Heartbeat, Limits, Poll, QueueStore, RedisStore, StoreError, Tick,
    TicketTimes, VisitorId,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TIMEOUT: Duration = Duration::from_secs(2);

/// Ids with bytes that would break a key (braces, colon, NUL, high bytes):
/// they are members only.
fn id(n: u8) -> VisitorId {
    let mut v = *b"{x}:\0\xff\xfe qg:{rt}}";
    v[1] = n;
    v
}

fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.config(TIMEOUT)).expect("config is well formed")
}

/// Runs admit_tick until it runs (a new window), polling in small steps.
async fn tick_that_runs(store: &RedisStore, route: &str, limits: &Limits) -> Tick {
    for _ in 0..1000 {
        let tick = store.admit_tick(route, limits, None).await.expect("tick");
        if tick.ran {
            return tick;
        }
        tokio::time::sleep(limits.tick / 4).await;
    }
    panic!("admit_tick never ran");
}

#[tokio::test]
async fn arrive_admits_at_once_while_free_then_queues_in_order() {
    let server = RedisServer::start();
    let s = store(&server);
    let l = long_limits(2);
    assert_eq!(
        s.arrive("r", &id(1), &[], &l, true, None, 0).await.unwrap(),
        Arrival::Admitted
    );
    assert_eq!(
        s.arrive("r", &id(2), &[], &l, true, None, 0).await.unwrap(),
        Arrival::Admitted
    );
    let c = waiting(s.arrive("r", &id(3), &[], &l, true, None, 0).await.unwrap());
    let d = waiting(s.arrive("r", &id(4), &[], &l, true, None, 0).await.unwrap());
    assert_eq!((c.position, c.waiting_total), (1, 1));
    assert_eq!((d.position, d.waiting_total), (2, 2));
    assert!(c.score_us < d.score_us);

    // Same ids again: the active one stays admitted, the waiter keeps its place.
    assert_eq!(
        s.arrive("r", &id(1), &[], &l, true, None, 0).await.unwrap(),
        Arrival::Admitted
    );
    let c_again = waiting(s.arrive("r", &id(3), &[], &l, true, None, 0).await.unwrap());
    assert_eq!((c_again.score_us, c_again.position), (c.score_us, 1));

    let stats = s.stats("r", &l).await.unwrap();
    assert_eq!(
        (stats.waiting, stats.active, stats.admitted_total),
        (2, 2, 2)
    );
    assert!(stats.admit_rate > 0.0);
    assert!(stats.epoch_us <= c.score_us && c.score_us <= stats.now_us);
    assert_eq!(stats.hold_until_us, 0);
}

#[tokio::test]
async fn admit_now_shares_the_tick_budget_and_stops_when_someone_waits() {
    let server = RedisServer::start();
    let s = store(&server);
    let l = Limits {
        capacity: 10,
        max_admit_per_tick: 1,
        ..long_limits(2)
    };
    assert_eq!(
        s.arrive("r", &id(1), &[], &l, true, None, 0).await.unwrap(),
        Arrival::Admitted
    );
    // Budget of this window spent: queue, although capacity is free.
    assert_eq!(
        waiting(s.arrive("r", &id(2), &[], &l, true, None, 0).await.unwrap()).position,
        1
    );
    // The admitter's tick in the same window has no budget left either.
    let tick = s.admit_tick("r", &l, None).await.unwrap();
    assert!(tick.ran);
    assert!(tick.admitted_scores.is_empty());
    // A bigger budget: still nobody admitted at once while someone waits.
    let roomy = Limits {
        max_admit_per_tick: 100,
        ..l.clone()
    };
    assert_eq!(
        waiting(
            s.arrive("r", &id(3), &[], &roomy, true, None, 0)
                .await
                .unwrap()
        )
        .position,
        2
    );
}

#[tokio::test]
async fn admit_tick_admits_from_the_head_up_to_capacity_once_per_window() {
    let server = RedisServer::start();
    let s = store(&server);
    let l = Limits {
        capacity: 3,
        ..long_limits(2)
    };
    let mut scores = Vec::new();
    for n in 1..=5 {
        scores.push(
            waiting(
                s.arrive("r", &id(n), &[], &l, false, None, 0)
                    .await
                    .unwrap(),
            )
            .score_us,
        );
    }
    let tick = s.admit_tick("r", &l, None).await.unwrap();
    assert!(tick.ran);
    assert_eq!(tick.admitted_scores, scores[..3]);
    assert_eq!((tick.abandoned, tick.no_shows), (0, 0));
    // Same window: another call (any instance) does not run.
    let again = s.admit_tick("r", &l, Some(tick.epoch_us)).await.unwrap();
    assert!(!again.ran);
    assert!(again.admitted_scores.is_empty());

    assert_eq!(
        s.poll("r", &id(1), &[], polled_ticket(scores[0]), &l)
            .await
            .unwrap(),
        Poll::Admitted
    );
    let fourth = polled_place(
        s.poll("r", &id(4), &[], polled_ticket(scores[3]), &l)
            .await
            .unwrap(),
    );
    assert_eq!(
        (fourth.position, fourth.waiting_total, fourth.score_us),
        (1, 2, scores[3])
    );
    let stats = s.stats("r", &l).await.unwrap();
    assert_eq!(
        (stats.active, stats.waiting, stats.admitted_total),
        (3, 2, 3)
    );
}

#[tokio::test]
async fn admit_tick_admits_at_most_max_admit_per_tick() {
    let server = RedisServer::start();
    let s = store(&server);
    let l = Limits {
        capacity: 100,
        max_admit_per_tick: 2,
        tick: Duration::from_millis(100),
        ..long_limits(2)
    };
    let mut scores = Vec::new();
    for n in 1..=5 {
        scores.push(
            waiting(
                s.arrive("r", &id(n), &[], &l, false, None, 0)
                    .await
                    .unwrap(),
            )
            .score_us,
        );
    }
    let first = tick_that_runs(&s, "r", &l).await;
    assert_eq!(first.admitted_scores, scores[..2]);
    let second = tick_that_runs(&s, "r", &l).await;
    assert_eq!(second.admitted_scores, scores[2..4]);
}

#[tokio::test]
async fn missing_entries_come_back_only_under_the_epoch_rules() {
    let server = RedisServer::start();
    let s = store(&server);
    let l = Limits {
        abandon_after: Duration::from_millis(200),
        capacity: 0,
        ..long_limits(2)
    };
    let stats = s.stats("r", &l).await.unwrap();
    // Younger than abandon_after: restored, no hold (not a store loss).
    let young = polled_place(
        s.poll("r", &id(1), &[], polled_ticket(stats.now_us), &l)
            .await
            .unwrap(),
    );
    assert_eq!(young.score_us, stats.now_us);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Newer than the epoch but older than abandon_after: dropped on purpose.
    assert_eq!(
        s.poll("r", &id(2), &[], polled_ticket(stats.epoch_us + 1), &l)
            .await
            .unwrap(),
        Poll::Gone
    );
    assert_eq!(s.stats("r", &l).await.unwrap().hold_until_us, 0);
    // Older than the epoch and seen just now: the store lost it; restored,
    // and a hold starts.
    let seen_us = s.stats("r", &l).await.unwrap().now_us;
    let lost = |score_us| TicketTimes {
        score_us,
        seen_us,
        lane: 0,
    };
    let old = polled_place(
        s.poll("r", &id(3), &[], lost(stats.epoch_us - 1), &l)
            .await
            .unwrap(),
    );
    assert_eq!(old.score_us, stats.epoch_us - 1);
    let hold = s.stats("r", &l).await.unwrap().hold_until_us;
    assert!(hold > 0);
    // Later notices in the same epoch do not extend the hold.
    polled_place(
        s.poll("r", &id(4), &[], lost(stats.epoch_us - 2), &l)
            .await
            .unwrap(),
    );
    s.admit_tick("r", &l, Some(stats.epoch_us + 1))
        .await
        .unwrap();
    assert_eq!(s.stats("r", &l).await.unwrap().hold_until_us, hold);
}

#[tokio::test]
async fn script_flush_reloads_scripts_on_the_next_call() {
    let server = RedisServer::start();
    let s = store(&server);
    let l = long_limits(2);
    s.ready().await.unwrap();
    assert_eq!(
        s.arrive("r", &id(1), &[], &l, true, None, 0).await.unwrap(),
        Arrival::Admitted
    );
    let _: () = server.query(&["SCRIPT", "FLUSH"]);
    assert_eq!(
        s.arrive("r", &id(2), &[], &l, true, None, 0).await.unwrap(),
        Arrival::Admitted
    );
    let _: () = server.query(&["SCRIPT", "FLUSH"]);
    s.ready().await.unwrap();
}

#[tokio::test]
async fn after_flushall_waiters_and_passes_come_back_and_a_hold_blocks_newcomers() {
    let server = RedisServer::start();
    let s = store(&server);
    let l = Limits {
        capacity: 5,
        ..long_limits(2)
    };
    assert_eq!(
        s.arrive("r", &id(1), &[], &l, true, None, 0).await.unwrap(),
        Arrival::Admitted
    );
    let issued_s = s.stats("r", &l).await.unwrap().now_us / 1_000_000;
    let full = Limits {
        capacity: 1,
        ..l.clone()
    };
    let scores: Vec<u64> = {
        let mut v = Vec::new();
        for n in 2..=4 {
            v.push(
                waiting(
                    s.arrive("r", &id(n), &[], &full, true, None, 0)
                        .await
                        .unwrap(),
                )
                .score_us,
            );
        }
        v
    };
    let first = s.admit_tick("r", &full, None).await.unwrap();
    assert!(first.admitted_scores.is_empty());
    let old_epoch = first.epoch_us;

    let _: () = server.query(&["FLUSHALL"]);

    // Polls in a scrambled order: each comes back at its own score.
    let d = polled_place(
        s.poll("r", &id(4), &[], polled_ticket(scores[2]), &l)
            .await
            .unwrap(),
    );
    let b = polled_place(
        s.poll("r", &id(2), &[], polled_ticket(scores[0]), &l)
            .await
            .unwrap(),
    );
    let c = polled_place(
        s.poll("r", &id(3), &[], polled_ticket(scores[1]), &l)
            .await
            .unwrap(),
    );
    assert_eq!(
        (b.score_us, c.score_us, d.score_us),
        (scores[0], scores[1], scores[2])
    );
    let c_again = polled_place(
        s.poll("r", &id(3), &[], polled_ticket(scores[1]), &l)
            .await
            .unwrap(),
    );
    assert_eq!((c_again.position, c_again.waiting_total), (2, 3));

    // The pass comes back as active on renewal.
    assert!(s
        .renew("r", &id(1), &[], pass_of_second(issued_s), &l)
        .await
        .unwrap());

    let stats = s.stats("r", &l).await.unwrap();
    assert!(stats.epoch_us > old_epoch);
    assert!(stats.hold_until_us > stats.now_us);
    assert_eq!((stats.active, stats.waiting), (1, 3));

    // During the hold nobody new is admitted, at once or by the admitter.
    let e = waiting(s.arrive("r", &id(5), &[], &l, true, None, 0).await.unwrap());
    assert_eq!(e.position, 4);
    let tick = s.admit_tick("r", &l, Some(old_epoch)).await.unwrap();
    assert!(tick.ran);
    assert!(tick.admitted_scores.is_empty());
    assert_eq!(tick.epoch_us, stats.epoch_us);
}

#[tokio::test]
async fn an_instance_that_sees_the_epoch_change_starts_a_hold() {
    let server = RedisServer::start();
    let s = store(&server);
    let l = long_limits(2);
    let fresh = s.admit_tick("r", &l, None).await.unwrap();
    assert_eq!(s.stats("r", &l).await.unwrap().hold_until_us, 0);
    let _: () = server.query(&["FLUSHALL"]);
    let after = s.admit_tick("r", &l, Some(fresh.epoch_us)).await.unwrap();
    assert_ne!(after.epoch_us, fresh.epoch_us);
    assert!(s.stats("r", &l).await.unwrap().hold_until_us > 0);
    // Free capacity, nobody waiting: still no admission during the hold.
    assert_eq!(
        waiting(s.arrive("r", &id(1), &[], &l, true, None, 0).await.unwrap()).position,
        1
    );
}

#[tokio::test]
async fn only_the_six_route_keys_exist_and_no_id_is_in_a_key() {
    let server = RedisServer::start();
    let s = store(&server);
    let l = long_limits(2);
    for n in 1..=6 {
        s.arrive("tickets", &id(n), &[], &l, true, None, 0)
            .await
            .unwrap();
    }
    s.poll("tickets", &id(4), &[], polled_ticket(0), &l)
        .await
        .unwrap();
    s.admit_tick("tickets", &l, None).await.unwrap();
    s.renew("tickets", &id(1), &[], pass_of_second(0), &l)
        .await
        .unwrap();
    s.leave("tickets", &id(2), &long_limits(2)).await.unwrap();
    s.stats("tickets", &l).await.unwrap();
    let mut keys: Vec<String> = server.query(&["KEYS", "*"]);
    keys.sort();
    assert_eq!(
        keys,
        [
            "qg:{tickets}:active",
            "qg:{tickets}:beat",
            "qg:{tickets}:seen",
            "qg:{tickets}:stats",
            "qg:{tickets}:tick",
            "qg:{tickets}:waiting",
        ]
    );
    // Members are the raw first 12 bytes of the ids (`store_id`).
    let members: Vec<Vec<u8>> = server.query(&["ZRANGE", "qg:{tickets}:waiting", "0", "-1"]);
    assert!(!members.is_empty());
    assert!(members
        .iter()
        .all(|m| (3..=6).any(|n| *m == store_id(&id(n)).to_vec())));
}

/// Three instances on one Redis, each ticking and taking arrivals in a random
/// order: per tick window exactly one instance runs, admissions stay within
/// the budget, capacity is never exceeded, and the line is served FIFO.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_line() {
    let server = RedisServer::start();
    let stores: Vec<RedisStore> = (0..3).map(|_| store(&server)).collect();
    let l = Limits {
        capacity: 12,
        max_admit_per_tick: 3,
        tick: Duration::from_millis(50),
        ..long_limits(2)
    };
    let tick_us = 50_000;
    let mut rng = StdRng::seed_from_u64(7);
    let mut next_id: u32 = 0;
    let mut admitted_ids: Vec<VisitorId> = Vec::new();
    let mut ran_windows: BTreeMap<u64, usize> = BTreeMap::new();
    let mut admitted_by_window: BTreeMap<u64, u64> = BTreeMap::new();
    let mut admitted_scores: Vec<(u64, u64)> = Vec::new();

    let mut handles = Vec::new();
    for (i, st) in stores.iter().enumerate() {
        let st = st.clone();
        let l = l.clone();
        handles.push(tokio::spawn(async move {
            let mut ticks = Vec::new();
            for _ in 0..60 {
                ticks.push(st.admit_tick("shared", &l, None).await.expect("tick"));
                tokio::time::sleep(Duration::from_millis(10 + 7 * i as u64)).await;
            }
            ticks
        }));
    }
    // Meanwhile arrivals (some admitted at once), leaves and capacity checks.
    for _ in 0..300 {
        let st = &stores[rng.random_range(0..3)];
        match rng.random_range(0..10) {
            0..=6 => {
                next_id += 1;
                let mut v = [0u8; 16];
                v[..4].copy_from_slice(&next_id.to_be_bytes());
                if st
                    .arrive("shared", &v, &[], &l, true, None, 0)
                    .await
                    .unwrap()
                    == Arrival::Admitted
                {
                    admitted_ids.push(v);
                }
            }
            7 if !admitted_ids.is_empty() => {
                let gone = admitted_ids.swap_remove(rng.random_range(0..admitted_ids.len()));
                st.leave("shared", &gone, &long_limits(2)).await.unwrap();
            }
            _ => {}
        }
        let stats = st.stats("shared", &l).await.unwrap();
        assert!(
            stats.active <= l.capacity,
            "active {} > capacity",
            stats.active
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for h in handles {
        for t in h.await.unwrap() {
            let window = t.now_us / tick_us;
            if t.ran {
                *ran_windows.entry(window).or_default() += 1;
                *admitted_by_window.entry(window).or_default() += t.admitted_scores.len() as u64;
                admitted_scores.extend(t.admitted_scores.iter().map(|s| (window, *s)));
            }
        }
    }
    assert!(!ran_windows.is_empty());
    assert!(
        ran_windows.values().all(|&n| n == 1),
        "some window ran more than once: {ran_windows:?}"
    );
    assert!(admitted_by_window
        .values()
        .all(|&n| n <= l.max_admit_per_tick));
    // FIFO across instances: in window order, join scores only grow.
    admitted_scores.sort_by_key(|(w, _)| *w);
    let in_order: Vec<u64> = admitted_scores.iter().map(|(_, s)| *s).collect();
    assert!(
        in_order.windows(2).all(|p| p[0] < p[1]),
        "not FIFO: {in_order:?}"
    );
    assert!(!in_order.is_empty(), "nobody was admitted from the line");
    let distinct: HashSet<u64> = in_order.iter().copied().collect();
    assert_eq!(distinct.len(), in_order.len());
    let stats = stores[0].stats("shared", &l).await.unwrap();
    assert!(stats.active <= l.capacity);
}

#[tokio::test]
async fn ghosts_dropped_by_an_arrival_are_counted_by_the_next_tick() {
    let server = RedisServer::start();
    let s = store(&server);
    let l = Limits {
        capacity: 0,
        abandon_after: Duration::from_millis(300),
        ..long_limits(2)
    };
    let a = waiting(
        s.arrive("r", &id(1), &[], &l, false, None, 0)
            .await
            .unwrap(),
    );
    // a polls once (a ticket never polled is unconfirmed, not a ghost).
    polled_place(
        s.poll("r", &id(1), &[], polled_ticket(a.score_us), &l)
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = waiting(
        s.arrive("r", &id(2), &[], &l, false, None, 0)
            .await
            .unwrap(),
    );
    assert_eq!((b.position, b.waiting_total), (1, 1));
    let tick = s.admit_tick("r", &l, None).await.unwrap();
    assert_eq!(tick.abandoned, 1);
    // The ghost comes back at the back of the line, not at its old place.
    let back = waiting(
        s.arrive("r", &id(1), &[], &l, false, None, 0)
            .await
            .unwrap(),
    );
    assert!(back.score_us > a.score_us);
}

#[tokio::test]
async fn purged_no_shows_leave_tombstones_in_seen_until_abandon_after() {
    let server = RedisServer::start();
    let s = store(&server);
    let l = Limits {
        capacity: 2,
        tick: Duration::from_millis(100),
        arrival_grace: Duration::from_millis(200),
        abandon_after: Duration::from_millis(1_500),
        ..long_limits(2)
    };
    let seen_key = "qg:{r}:seen";
    let a = waiting(
        s.arrive("r", &id(1), &[], &l, false, None, 0)
            .await
            .unwrap(),
    );
    let b = waiting(
        s.arrive("r", &id(2), &[], &l, false, None, 0)
            .await
            .unwrap(),
    );
    let first = tick_that_runs(&s, "r", &l).await;
    assert_eq!(first.admitted_scores, vec![a.score_us, b.score_us]);
    let mut no_shows = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while no_shows < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no no-show counted");
        let tick = tick_that_runs(&s, "r", &l).await;
        assert_eq!(tick.abandoned, 0, "a tombstone is no ghost");
        no_shows += tick.no_shows;
    }
    assert_eq!(no_shows, 2);
    // From here on nobody is admitted, so visitor 2 stays in line.
    let l = Limits { capacity: 0, ..l };

    // One tombstone per no-show: the raw id, scored by its negated expiry.
    let buried: Vec<(Vec<u8>, f64)> = server.query(&["ZRANGE", seen_key, "0", "-1", "WITHSCORES"]);
    assert_eq!(buried.len(), 2);
    assert!(buried
        .iter()
        .all(|(m, score)| m.len() == 12 && *score < 0.0));
    assert_eq!(
        s.poll("r", &id(1), &[], polled_ticket(a.score_us), &l)
            .await
            .unwrap(),
        Poll::Gone
    );
    // Joining again replaces the tombstone with a poll time (in beat).
    let again = waiting(
        s.arrive("r", &id(2), &[], &l, false, None, 0)
            .await
            .unwrap(),
    );
    assert!(again.score_us > b.score_us);
    let still_buried: Vec<Vec<u8>> = server.query(&["ZRANGE", seen_key, "0", "-1"]);
    assert_eq!(still_buried, vec![store_id(&id(1)).to_vec()]);
    let beats: Vec<Vec<u8>> = server.query(&["HKEYS", "qg:{r}:beat"]);
    assert_eq!(beats, vec![store_id(&id(2)).to_vec()]);

    // Past abandon_after the tick forgets the remaining tombstone.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        polled_place(
            s.poll("r", &id(2), &[], polled_ticket(again.score_us), &l)
                .await
                .unwrap(),
        );
        tick_that_runs(&s, "r", &l).await;
        let left: u64 = server.query(&["ZCOUNT", seen_key, "-inf", "(0"]);
        if left == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "tombstone kept");
    }
    let seen: u64 = server.query(&["ZCARD", seen_key]);
    assert_eq!(seen, 0, "no tombstone is kept past abandon_after");
    let beats: u64 = server.query(&["HLEN", "qg:{r}:beat"]);
    assert_eq!(beats, 1, "the waiter's own poll time stays");
}

/// When no admitter reached the store for a while (Redis paused, or every
/// instance cut off), instances renewed their visitors' sessions on their
/// own: the first tick after the gap does not run those sessions out, while
/// ticks that keep coming purge a session as soon as it ends.
#[tokio::test]
async fn a_gap_in_the_ticks_does_not_run_sessions_out() {
    let server = RedisServer::start();
    let s = store(&server);
    let l = Limits {
        tick: Duration::from_millis(100),
        session_ttl: Duration::from_millis(1_500),
        ..long_limits(2)
    };
    for route in ["gap", "steady"] {
        assert_eq!(
            s.arrive(route, &id(1), &[], &l, true, None, 0)
                .await
                .unwrap(),
            Arrival::Admitted
        );
        let issued_s = s.stats(route, &l).await.unwrap().now_us / 1_000_000;
        // The visitor's first return confirms the session: 1.5 s from now.
        assert!(s
            .renew(route, &id(1), &[], pass_of_second(issued_s), &l)
            .await
            .unwrap());
        assert!(s.admit_tick(route, &l, None).await.unwrap().ran);
    }
    // 2.5 s: the steady route ticks all along, the other not at all.
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(210)).await;
        s.admit_tick("steady", &l, None).await.unwrap();
    }
    assert_eq!(s.stats("steady", &l).await.unwrap().active, 0);
    assert_eq!(
        s.stats("gap", &l).await.unwrap().active,
        0,
        "the session's expiry has passed"
    );
    assert!(s.admit_tick("gap", &l, None).await.unwrap().ran);
    assert_eq!(
        s.stats("gap", &l).await.unwrap().active,
        1,
        "moved on by the gap, not purged"
    );
}

/// An arrival that timed out while Redis was stopped sits in the connection
/// and runs when Redis resumes. By then the instance has given the visitor a
/// ticket from its local line: the late arrival stores nothing, so the
/// visitor is not placed a second time at a later score.
#[tokio::test]
async fn an_arrival_run_after_its_caller_gave_up_stores_nothing() {
    let mut server = RedisServer::start();
    let s = store(&server);
    let l = long_limits(2);
    // The connection is up and the script loaded before Redis stops (a
    // script Redis does not know yet would only be answered NOSCRIPT).
    s.arrive("other", &id(9), &[], &l, false, None, 0)
        .await
        .unwrap();
    server.pause();
    let late = s.arrive("r", &id(1), &[], &l, false, None, 0).await;
    assert!(matches!(late, Err(StoreError::Timeout)), "{late:?}");
    // Past the call's timeout and the grace for clock skew.
    tokio::time::sleep(TIMEOUT + Duration::from_millis(1_300)).await;
    server.resume();
    let mut on_time = None;
    for _ in 0..50 {
        if let Ok(a) = s.arrive("r", &id(2), &[], &l, false, None, 0).await {
            on_time = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let on_time = on_time.expect("Redis answers again");
    assert_eq!(
        waiting(on_time).position,
        1,
        "the late arrival took no place"
    );
    let members: i64 = server.query(&["ZCARD", "qg:{r}:waiting"]);
    assert_eq!(members, 1);
}

/// A long line's poll times are a hash (`beat`), scanned for ghosts a slice
/// per call: every ghost goes within a few ticks once silent past
/// abandon_after, and no waiter who polled goes with them. Poll times an
/// earlier version kept in `seen` are cleared by the tick.
#[tokio::test]
async fn ghosts_in_a_long_line_are_dropped_by_the_scan() {
    const LINE: u32 = 5_000;
    let server = RedisServer::start();
    let s = store(&server);
    let l = Limits {
        capacity: 0,
        tick: Duration::from_millis(50),
        abandon_after: Duration::from_millis(3_000),
        confirm_within: Duration::from_millis(1_000),
        max_waiting: 100_000,
        ..long_limits(2)
    };
    let wide = |n: u32| {
        let mut v = [0x33; 16];
        v[..4].copy_from_slice(&n.to_be_bytes());
        v
    };
    let arrivals: Vec<Arriving> = (0..LINE)
        .map(|n| Arriving {
            id: wide(n),
            client: Vec::new(),
            admit_now: false,
            lane: 0,
        })
        .collect();
    for batch in arrivals.chunks(500) {
        s.arrive_batch("r", batch, &l, None).await.unwrap();
    }
    // A poll time in the layout of an earlier version.
    let _: () = server.query(&["ZADD", "qg:{r}:seen", "12345", "legacy"]);
    // Every waiter but one in ten polls (the others never confirm their
    // tickets), twice, across abandon_after.
    let polled: Vec<Heartbeat> = (0..LINE)
        .filter(|n| n % 10 != 0)
        .map(|n| Heartbeat {
            id: wide(n),
            client: Vec::new(),
        })
        .collect();
    for _ in 0..2 {
        s.heartbeats("r", &polled, &l).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }
    let mut dropped = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while dropped < u64::from(LINE / 10) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{dropped} ghosts dropped"
        );
        let tick = s.admit_tick("r", &l, None).await.unwrap();
        dropped += tick.abandoned + tick.unconfirmed_tickets;
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    assert_eq!(dropped, u64::from(LINE / 10));
    let stats = s.stats("r", &l).await.unwrap();
    assert_eq!(stats.waiting, u64::from(LINE - LINE / 10));
    let beats: u64 = server.query(&["HLEN", "qg:{r}:beat"]);
    assert_eq!(beats, stats.waiting);
    let legacy: u64 = server.query(&["ZCARD", "qg:{r}:seen"]);
    assert_eq!(legacy, 0);
}

/// A route's line is split one way for as long as the store holds it: a
/// tick configured with another split is refused (nobody admitted) rather
/// than look for visitors in the wrong sub-lines, and so is splitting a
/// line that is not empty.
#[tokio::test]
async fn a_split_line_is_not_ticked_as_another_split() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.config(Duration::from_secs(2))).unwrap();
    let three = Limits {
        shards: 3,
        ..long_limits(2)
    };
    let two = Limits {
        shards: 2,
        ..long_limits(2)
    };
    store.admit_tick("split", &three, None).await.unwrap();
    for n in 0..6u8 {
        store
            .arrive("split", &[n; 16], &[], &three, false, None, 0)
            .await
            .unwrap();
    }
    let refused = store.admit_tick("split", &two, None).await.unwrap_err();
    assert!(refused.to_string().contains("3 sub-lines"), "{refused}");
    store.admit_tick("split", &three, None).await.unwrap();

    // Nor as one line.
    let one = long_limits(2);
    let refused = store.admit_tick("split", &one, None).await.unwrap_err();
    assert!(refused.to_string().contains("3 sub-lines"), "{refused}");

    // A line ticked whole is a split of one.
    store
        .arrive("whole", &[7; 16], &[], &one, false, None, 0)
        .await
        .unwrap();
    store.admit_tick("whole", &one, None).await.unwrap();
    let refused = store.admit_tick("whole", &three, None).await.unwrap_err();
    assert!(refused.to_string().contains("1 sub-lines"), "{refused}");
    assert!(store.admit_tick("whole", &one, None).await.is_ok());

    // An empty route takes a new split.
    store.leave("whole", &[7; 16], &one).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.admit_tick("whole", &three, None).await.unwrap();
    let refused = store.admit_tick("whole", &one, None).await;
    assert!(refused.is_ok(), "{refused:?}");
}
