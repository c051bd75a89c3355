//! Three queuegate processes sharing one line through one real
//! `redis-server`: capacity and FIFO are global, and a store wiped under
//! running instances (FLUSHALL) loses nobody's place and never lets the origin
//! see more than capacity. The same crowd and line on a three-master Cluster
//! with the route's line split in three (`shards: 3`).

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use rand::{Rng, SeedableRng};

#[tokio::test]
async fn a_random_crowd_over_three_instances_never_exceeds_capacity() {
    let (_redis, _origin, instances) = three(
        RouteYaml::tickets(CAPACITY)
            .with("pass_ttl", "2s")
            .with("max_admit_per_tick", 2),
    )
    .await;
    random_crowd(&instances).await;
}

#[tokio::test]
async fn a_random_crowd_on_a_split_line_over_a_cluster_never_exceeds_capacity() {
    let (_cluster, _origin, instances) = fleet(
        RedisCluster::start(),
        RouteYaml::tickets(CAPACITY)
            .with("pass_ttl", "2s")
            .with("shards", 3)
            .with("max_admit_per_tick", 2),
        3,
    )
    .await;
    random_crowd(&instances).await;
}

const CAPACITY: usize = 5;

async fn random_crowd(instances: &[Instance]) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut crowd: Vec<Visitor> = (0..100).map(|_| Visitor::new()).collect();
    let mut inside: HashSet<usize> = HashSet::new();
    let mut admitted_ever = 0;
    for step in 0..1_200 {
        let i = rng.random_range(0..crowd.len());
        let at = &instances[rng.random_range(0..instances.len())];
        let v = &mut crowd[i];
        if inside.contains(&i) && rng.random_bool(0.3) {
            v.post(&at.url("/__queuegate/leave?route=tickets"), "")
                .await;
            inside.remove(&i);
        } else if v
            .cookie("qg_tickets")
            .is_some_and(|c| c.starts_with("v1.w."))
            && rng.random_bool(0.6)
        {
            status(v, at).await;
        } else if v.navigate(&at.url("/tickets/x")).await.reached_origin() && inside.insert(i) {
            admitted_ever += 1;
        }
        assert!(
            inside.len() <= CAPACITY,
            "step {step}: {} inside at once",
            inside.len()
        );
        if step % 40 == 0 {
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
    }
    assert!(
        admitted_ever > 2 * CAPACITY,
        "the crowd moved: {admitted_ever} got in"
    );
}

#[tokio::test]
async fn sequential_joiners_over_three_instances_are_admitted_in_join_order() {
    let (_redis, _origin, instances) = three(RouteYaml::tickets(1).with("pass_ttl", "2s")).await;
    sequential_joiners(&instances).await;
}

#[tokio::test]
async fn sequential_joiners_on_a_split_line_over_a_cluster_are_admitted_in_join_order() {
    let (_cluster, _origin, instances) = fleet(
        RedisCluster::start(),
        RouteYaml::tickets(1)
            .with("pass_ttl", "2s")
            .with("shards", 3),
        3,
    )
    .await;
    sequential_joiners(&instances).await;
}

async fn sequential_joiners(instances: &[Instance]) {
    // The holder takes the one slot: at once, or (on a split line, from a
    // sub-line without a share of it) at the next tick.
    let mut holder = Visitor::new();
    if !holder
        .navigate(&instances[0].url("/tickets"))
        .await
        .reached_origin()
    {
        for _ in 0..100 {
            if status(&mut holder, &instances[0]).await["state"] == "admitted" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(holder
            .navigate(&instances[0].url("/tickets"))
            .await
            .reached_origin());
    }
    let mut line = Vec::new();
    for i in 0..20 {
        let mut v = Visitor::new();
        let a = v.navigate(&instances[i % 3].url("/tickets")).await;
        assert_eq!(a.status, http::StatusCode::FOUND);
        line.push(v);
    }
    holder
        .post(&instances[1].url("/__queuegate/leave?route=tickets"), "")
        .await;
    let mut order = Vec::new();
    for round in 0..3_000 {
        if order.len() == line.len() {
            break;
        }
        for (i, v) in line.iter_mut().enumerate() {
            if order.contains(&i) {
                continue;
            }
            let at = &instances[(i + round) % 3];
            if status(v, at).await["state"] == "admitted" {
                assert!(v.navigate(&at.url("/tickets")).await.reached_origin());
                order.push(i);
                v.post(&at.url("/__queuegate/leave?route=tickets"), "")
                    .await;
            }
        }
    }
    assert_eq!(
        order,
        (0..20).collect::<Vec<_>>(),
        "admitted out of join order"
    );
}

#[tokio::test]
async fn flushall_loses_no_place_and_never_exceeds_capacity() {
    const CAPACITY: usize = 3;
    let (redis, _origin, instances) =
        three(RouteYaml::tickets(CAPACITY).with("pass_ttl", "2s")).await;
    let mut admitted = Vec::new();
    for i in 0..CAPACITY {
        let mut v = Visitor::new();
        assert!(v
            .navigate(&instances[i % 3].url("/tickets"))
            .await
            .reached_origin());
        // A browser comes back at once (the page's own assets): that
        // confirms the session. One never confirmed is not restored.
        assert!(v
            .navigate(&instances[(i + 1) % 3].url("/tickets"))
            .await
            .reached_origin());
        admitted.push(v);
    }
    let mut line = Vec::new();
    for i in 0..10 {
        let mut v = Visitor::new();
        assert_eq!(
            v.navigate(&instances[i % 3].url("/tickets")).await.status,
            http::StatusCode::FOUND
        );
        // The waiting page's first poll confirms the ticket.
        assert_eq!(status(&mut v, &instances[i % 3]).await["state"], "waiting");
        line.push(v);
    }
    let _: () = redis.query(&["FLUSHALL"]);

    // The admitted keep browsing, on any instance.
    for (i, v) in admitted.iter_mut().enumerate() {
        for at in &instances {
            assert!(
                v.navigate(&at.url("/tickets")).await.reached_origin(),
                "admitted visitor {i} lost its pass"
            );
        }
    }
    // A newcomer after the loss waits: the returning visitors are counted first.
    let mut newcomer = Visitor::new();
    assert_eq!(
        newcomer
            .navigate(&instances[0].url("/tickets"))
            .await
            .status,
        http::StatusCode::FOUND
    );
    // The waiters keep their relative order after their next poll.
    let mut positions = Vec::new();
    for (i, v) in line.iter_mut().enumerate() {
        let s = status(v, &instances[i % 3]).await;
        assert_eq!(s["state"], "waiting", "waiter {i}: {s}");
        positions.push(s["position"].as_u64().unwrap());
    }
    let mut sorted = positions.clone();
    sorted.sort();
    assert_eq!(positions, sorted, "waiters changed order: {positions:?}");
    assert!(
        status(&mut newcomer, &instances[1]).await["position"]
            .as_u64()
            .unwrap()
            > positions[9]
    );

    // The admitted leave; the line moves in order and never past capacity.
    let mut inside: HashSet<usize> = HashSet::new();
    for v in admitted.iter_mut() {
        v.post(&instances[2].url("/__queuegate/leave?route=tickets"), "")
            .await;
    }
    let mut order = Vec::new();
    for _ in 0..3_000 {
        if order.len() == line.len() {
            break;
        }
        let mut states = Vec::new();
        for (i, v) in line.iter_mut().enumerate() {
            if !order.contains(&i) {
                states.push((i, status(v, &instances[i % 3]).await["state"] == "admitted"));
            }
        }
        // A tick can admit between two polls: re-read everyone ahead of the
        // last one seen admitted; the store admitted them first.
        if let Some(last) = states.iter().rposition(|(_, a)| *a) {
            for (i, admitted) in states[..last].iter_mut() {
                if !*admitted {
                    *admitted =
                        status(&mut line[*i], &instances[*i % 3]).await["state"] == "admitted";
                }
            }
        }
        let now: Vec<usize> = states.iter().filter(|(_, a)| *a).map(|(i, _)| *i).collect();
        let head: Vec<usize> = states.iter().take(now.len()).map(|(i, _)| *i).collect();
        assert_eq!(now, head, "admitted out of order");
        for i in now {
            assert!(line[i]
                .navigate(&instances[0].url("/tickets"))
                .await
                .reached_origin());
            inside.insert(i);
            assert!(inside.len() <= CAPACITY);
            order.push(i);
        }
        // Those inside leave one at a time, so the line keeps moving.
        if let Some(&i) = inside.iter().next() {
            line[i]
                .post(&instances[1].url("/__queuegate/leave?route=tickets"), "")
                .await;
            inside.remove(&i);
        }
        status(&mut newcomer, &instances[2]).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(order, (0..10).collect::<Vec<_>>());
}
