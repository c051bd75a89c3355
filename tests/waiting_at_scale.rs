//! The waiting path at scale (DESIGN §8.9), on queuegate processes sharing
//! one real `redis-server`: behind the first 100 places a status poll is
//! answered from the line record without a store call, within 2 % of the
//! real place; the batched heartbeats keep those waiters in line while the
//! silent are dropped; a waiter who left, or went silent, is answered by the
//! store; arrivals made together share store calls and each gets its own
//! place.

mod common;

use std::time::Duration;

use common::*;

/// The first 100 places are always answered by the store.
const HEAD: usize = 100;
const LINE: usize = 260;

/// Polls answered (from the record, by the store) over all instances.
async fn polls(instances: &[Instance]) -> (u64, u64) {
    let mut totals = (0, 0);
    for at in instances {
        let body = Visitor::new()
            .fetch(&at.process.admin_url("/metrics"))
            .await
            .body;
        let text = String::from_utf8_lossy(&body).into_owned();
        let count = |by: &str| {
            let series =
                format!("queuegate_polls_total{{route=\"tickets\",answered_by=\"{by}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&series))
                .map(|n| n.trim().parse::<u64>().expect("a count"))
                .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        };
        totals.0 += count("record");
        totals.1 += count("store");
    }
    totals
}

fn position(s: &serde_json::Value) -> u64 {
    s["position"]
        .as_u64()
        .unwrap_or_else(|| panic!("no position: {s}"))
}

/// A holder takes the one slot (and keeps it), then `LINE` visitors join
/// through the instances in turn, each polling once, as the waiting page
/// does, which confirms its ticket and shows its exact place. With
/// `keep_polling`, those in line poll again every 50 joins, so that none is
/// silent for long while the others join.
async fn hold_and_line_up(instances: &[Instance], keep_polling: bool) -> Vec<Visitor> {
    let mut holder = Visitor::new();
    for _ in 0..2 {
        assert!(holder
            .navigate(&instances[0].url("/tickets"))
            .await
            .reached_origin());
    }
    let mut line = Vec::new();
    for i in 0..LINE {
        let mut v = Visitor::new();
        let at = &instances[i % 3];
        assert_eq!(
            v.navigate(&at.url("/tickets")).await.status,
            http::StatusCode::FOUND
        );
        let s = status(&mut v, at).await;
        assert_eq!(
            (s["state"].as_str(), position(&s)),
            (Some("waiting"), i as u64 + 1)
        );
        line.push(v);
        if keep_polling && i % 50 == 49 {
            for (j, v) in line.iter_mut().enumerate() {
                assert_eq!(status(v, &instances[j % 3]).await["state"], "waiting");
            }
        }
    }
    line
}

#[tokio::test]
async fn polls_behind_the_head_are_answered_from_the_record() {
    let (_redis, _origin, instances) = three(
        RouteYaml::tickets(1)
            .with("abandon_after", "30s")
            .with("arrival_grace", "2s"),
    )
    .await;
    let mut line = hold_and_line_up(&instances, false).await;
    // A tick after the last join leaves a record with everyone in it.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let before = polls(&instances).await;
    for (i, v) in line.iter_mut().enumerate() {
        let s = status(v, &instances[(i + 1) % 3]).await;
        assert_eq!(s["state"], "waiting", "waiter {i}: {s}");
        let rank = i as u64 + 1;
        let shown = position(&s);
        if i < HEAD {
            assert_eq!(shown, rank, "the head is told its exact place");
        } else {
            assert!(
                shown.abs_diff(rank) * 50 <= rank,
                "rank {rank} shown as {shown}"
            );
        }
        assert_eq!(s["waiting_total"], LINE as u64, "{s}");
    }
    let after = polls(&instances).await;
    let (from_record, from_store) = (after.0 - before.0, after.1 - before.1);
    assert_eq!(from_record + from_store, LINE as u64);
    assert!(from_store >= HEAD as u64, "the head asks the store");
    // Behind the head, the record answers (a record older than three ticks
    // on a loaded machine sends a poll to the store instead).
    assert!(
        from_record >= (LINE - HEAD) as u64 * 3 / 4,
        "{from_record} of {} polls from the record",
        LINE - HEAD
    );
}

#[tokio::test]
async fn record_answered_waiters_stay_in_line_and_the_silent_and_the_gone_ask_the_store() {
    let (_redis, _origin, instances) = three(
        RouteYaml::tickets(1)
            .with("abandon_after", "4s")
            .with("arrival_grace", "2s"),
    )
    .await;
    let mut line = hold_and_line_up(&instances, true).await;
    // Waiters 200..210 go silent; everyone else polls, anywhere, for longer
    // than abandon_after (4 s), mostly answered from the record.
    let silent = 200..210;
    let before = polls(&instances).await;
    let started = tokio::time::Instant::now();
    let mut round = 0;
    while started.elapsed() < Duration::from_millis(5_000) {
        round += 1;
        for (i, v) in line.iter_mut().enumerate() {
            if silent.contains(&i) {
                continue;
            }
            let s = status(v, &instances[(i + round) % 3]).await;
            assert_eq!(s["state"], "waiting", "waiter {i} round {round}: {s}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = polls(&instances).await;
    assert!(
        after.0 - before.0 > after.1 - before.1,
        "most polls from the record: {before:?} → {after:?}"
    );
    // A tick after the last heartbeats: the silent were dropped, and no one
    // who kept polling was.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = status(&mut line[250], &instances[0]).await;
    assert_eq!(s["waiting_total"], (LINE - silent.len()) as u64, "{s}");
    let shown = position(&s);
    let rank = 251 - silent.len() as u64;
    assert!(
        shown.abs_diff(rank) * 50 <= rank,
        "rank {rank} shown as {shown}"
    );

    // A silent waiter comes back: the store answers (it was dropped), so it
    // is not told its old place; it joins again at the back.
    let before = polls(&instances).await;
    let s = status(&mut line[205], &instances[1]).await;
    let after = polls(&instances).await;
    assert_eq!(after.1 - before.1, 1, "the store answered the ghost");
    assert!(
        position(&s) > 240,
        "a ghost is not given its old place: {s}"
    );

    // A waiter leaves; its ticket, replayed where it left, is not answered
    // from the record: that instance remembers the leave and refuses the
    // ticket itself, without asking the store.
    let replayed = line[150].jar.clone();
    let left = line[150]
        .post(&instances[2].url("/__queuegate/leave?route=tickets"), "")
        .await;
    assert!(left.status.is_success(), "{left:?}");
    let mut replay = Visitor { jar: replayed };
    let before = polls(&instances).await;
    let s = status(&mut replay, &instances[2]).await;
    let after = polls(&instances).await;
    assert_eq!(after, before, "the record or the store answered the replay");
    assert!(position(&s) > 240, "a ticket that left has no place: {s}");
}

/// The arrive calls Redis has run so far (every script runs as EVALSHA).
fn script_calls(redis: &RedisServer) -> u64 {
    let info: String = redis.query(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map(|n| n.parse().expect("a count"))
        .unwrap_or(0)
}

#[tokio::test]
async fn arrivals_made_together_share_store_calls_and_each_gets_its_place() {
    const CROWD: usize = 300;
    let redis = RedisServer::start();
    let (origin, _hits) = counting_origin().await;
    // Slow ticks, so that the admitter's calls are few beside the joins.
    let route = "routes:\n  - name: tickets\n    match: { path_prefix: /tickets }\n    \
                 capacity: 1\n    tick: 1s\n    \
                 client_limits: { places: 0, joins_per_minute: 0 }\n";
    let at = Instance::start(&redis.url(), &origin.url(), route).await;
    let mut holder = Visitor::new();
    for _ in 0..2 {
        assert!(holder.navigate(&at.url("/tickets")).await.reached_origin());
    }
    let before = script_calls(&redis);
    let url = at.url("/tickets");
    let crowd: Vec<_> = (0..CROWD)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut v = Visitor::new();
                let a = v.navigate(&url).await;
                (a.status, v)
            })
        })
        .collect();
    let mut line = Vec::new();
    for joined in crowd {
        let (status, v) = joined.await.expect("the visitor ran");
        assert_eq!(status, http::StatusCode::FOUND);
        line.push(v);
    }
    let calls = script_calls(&redis) - before;
    assert!(
        calls < CROWD as u64 / 2,
        "{CROWD} arrivals at once took {calls} store calls"
    );
    // Every visitor has a place of its own: the places are 1..=CROWD.
    let mut places = Vec::new();
    for v in line.iter_mut() {
        let s = status(v, &at).await;
        assert_eq!(s["state"], "waiting", "{s}");
        places.push(position(&s));
    }
    places.sort_unstable();
    assert_eq!(places, (1..=CROWD as u64).collect::<Vec<_>>());
}
