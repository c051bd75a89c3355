//! Priority lanes (DESIGN §8.5) over HTTP, three queuegate processes sharing
//! one real `redis-server`: while both lanes have waiters, admissions are
//! shared 3 : 1 between `vip` (weight 3) and `main` (weight 1), FIFO within
//! each lane whichever instance a visitor joined on; once one lane is empty
//! the other takes every free slot; the origin never sees more than
//! capacity. An invite's uses are counted once across instances; a bad
//! invite puts nobody in a lane, never shows an error, and a valid one moves
//! a waiter to its lane at its place in time.
//!
//! The order of admissions is read from the store, not from polls. A poll
//! notices an admission some time after the tick that made it, and many
//! polls run at once, so the order polls see is the ticks' order blurred by
//! the polling. Here a sampler reads, in one script (so between two ticks,
//! never in the middle of one), each lane's count and head and the number
//! of live slots, several times per tick. In this test a waiter leaves its
//! lane's sorted set only by being admitted (nobody leaves the line, and
//! everyone is polled well within `abandon_after`), so the members gone
//! between two samples are exactly the admissions of the ticks between
//! them, in their order within each lane. That leaves no tolerance to
//! state: FIFO is checked exactly.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::*;
use futures_util::stream::{self, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use queuegate::admission::KeyRing;
use queuegate::lane_grant::{self, Lane};

const ROUTE: &str = "tickets";

/// The route's lanes, in the configured order: `main` first (weight 1),
/// then `vip` (weight 3).
const LANES: [&str; 2] = ["main", "vip"];
const MAIN: usize = 0;
const VIP: usize = 1;

/// The key `Instance` gives every instance (`QG_SHARED_KEY` is these bytes
/// in base64), so tokens signed here verify there.
const SHARED_KEY: &[u8] = b"shared key for three instances of queuegate";

fn instance_ring() -> KeyRing {
    KeyRing::new(vec![("k1".to_owned(), SHARED_KEY.to_vec())]).unwrap()
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn vip() -> Lane {
    Lane::new("vip").unwrap()
}

/// The route `tickets` with lanes `main` (1) and `vip` (3), a 50 ms tick
/// and no per-client limits (every test visitor is 127.0.0.1); the other
/// settings are the defaults (20 admissions a tick, `abandon_after` and
/// `confirm_within` 30 s, `arrival_grace` 60 s).
fn lanes_config(capacity: usize) -> RouteYaml {
    RouteYaml::tickets(capacity).with(
        "lanes",
        "[{ name: main, weight: 1 }, { name: vip, weight: 3 }]",
    )
}

/// The sorted set of lane `lane` (docs/design.md §3).
fn lane_key(lane: usize) -> String {
    match lane {
        MAIN => format!("qg:{{{ROUTE}}}:waiting"),
        _ => format!("qg:{{{ROUTE}}}:waiting:lane:{}", LANES[lane]),
    }
}

/// The member a visitor who just joined lane `lane` has there: the newest,
/// as long as nobody else joins meanwhile.
fn newest_member(redis: &mut redis::Connection, lane: usize) -> Vec<u8> {
    let newest: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(lane_key(lane))
        .arg(-1)
        .arg(-1)
        .query(redis)
        .unwrap();
    assert_eq!(newest.len(), 1, "lane {} is empty", LANES[lane]);
    newest.into_iter().next().unwrap()
}

/// A holder takes the only place of a capacity-1 route so that everyone
/// after it waits; it comes back once, which confirms its session.
async fn hold_the_place(at: &Instance) -> Visitor {
    let mut holder = Visitor::new();
    for _ in 0..2 {
        let a = holder.navigate(&at.url("/tickets/hold")).await;
        assert!(a.reached_origin(), "{a:?}");
    }
    holder
}

/// Checks `a` is the JSON a waiter gets (never an error) and returns it.
fn waiting_json(a: &Answer, what: &str) -> serde_json::Value {
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{what}: {a:?}");
    assert_eq!(a.headers["x-queuegate"], "waiting", "{what}: {a:?}");
    let json = a.json();
    assert_eq!(json["state"], "waiting", "{what}: {json}");
    json
}

/// A visitor's status on `at`, which must say it waits.
async fn waiting_status(v: &mut Visitor, at: &Instance, what: &str) -> serde_json::Value {
    let a = v.fetch(&at.url("/__queuegate/status?route=tickets")).await;
    assert_eq!(a.status, StatusCode::OK, "{what}: {a:?}");
    let json = a.json();
    assert_eq!(json["state"], "waiting", "{what}: {json}");
    json
}

fn lane_cookie_set(a: &Answer) -> bool {
    a.headers
        .get_all("set-cookie")
        .iter()
        .any(|c| c.to_str().unwrap().starts_with("qg_lane.tickets="))
}

// ---------------------------------------------------------------------------
// Two lanes, 2,000 waiters, three instances.

const CAPACITY: usize = 20;
/// The default `max_admit_per_tick`.
const MOST_PER_TICK: usize = 20;
const PER_LANE: usize = 1_000;
/// Polled every round: the first waiters of each lane not yet known to be
/// admitted. A tick admits at most 20, so under FIFO everyone admitted is
/// among them.
const HEAD: usize = 24;
/// Everyone else is polled once their last poll (or join) is this old:
/// well within `abandon_after` and `confirm_within` (30 s), so nobody is
/// taken for a ghost or an unconfirmed ticket and dropped from the line.
const REFRESH: Duration = Duration::from_secs(8);
/// Polls in flight at once.
const CONCURRENCY: usize = 64;
/// Members of each lane's head the sampler reads: more than the ticks can
/// admit between two samples unless the sampler stalls for six ticks (it
/// says so then).
const SAMPLED_HEAD: usize = 128;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Sends `req` with `v`'s cookies over the shared pooled client (a client
/// per request would use up local ports at this rate) and keeps the
/// cookies set.
async fn send(client: &HttpClient, v: &mut Visitor, mut req: Request<Full<Bytes>>) -> Answer {
    if !v.jar.is_empty() {
        let cookies = v
            .jar
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("; ");
        req.headers_mut().insert("cookie", cookies.parse().unwrap());
    }
    let resp = client.request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    v.store_cookies(&parts.headers);
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

fn api_request(url: &str) -> Request<Full<Bytes>> {
    Request::get(url)
        .header("accept", "application/json")
        .header("sec-fetch-mode", "cors")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn navigation(url: &str) -> Request<Full<Bytes>> {
    Request::get(url)
        .header("accept", "text/html")
        .header("sec-fetch-mode", "navigate")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn leave_request(url: &str) -> Request<Full<Bytes>> {
    Request::post(url).body(Full::new(Bytes::new())).unwrap()
}

/// What the origin saw: requests in flight now and at most, and every
/// path it was asked for, in order.
#[derive(Default)]
struct OriginLog {
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    paths: Mutex<Vec<String>>,
}

/// An origin that takes a little while over each request, so that the
/// sessions of admitted visitors overlap there.
async fn session_origin() -> (Origin, Arc<OriginLog>) {
    let log = Arc::new(OriginLog::default());
    let seen = log.clone();
    let origin = spawn_origin(move |req: Request<Incoming>| {
        let log = seen.clone();
        async move {
            let now = log.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            log.most_in_flight.fetch_max(now, Ordering::SeqCst);
            log.paths.lock().unwrap().push(req.uri().path().to_owned());
            tokio::time::sleep(Duration::from_millis(20)).await;
            log.in_flight.fetch_sub(1, Ordering::SeqCst);
            Response::new(full("origin"))
        }
    })
    .await;
    (origin, log)
}

struct Waiter {
    lane: usize,
    /// Its place in its lane's join order.
    index: usize,
    visitor: Visitor,
    /// When it last polled (or joined).
    polled: Instant,
    /// Its poll said `admitted` (and it has been to the origin and left).
    admitted: bool,
}

impl Waiter {
    fn path(&self) -> String {
        format!("/tickets/{}/{}", LANES[self.lane], self.index)
    }
}

/// Sessions between a visitor's first poll that says `admitted` and its
/// leave, counted by the visitors: it goes up after the store admitted the
/// visitor and down before the visitor frees its slot, so it never counts
/// more than the store's live slots.
#[derive(Default)]
struct Sessions {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// Polls the waiters `which` (at most [`CONCURRENCY`] at once) on the
/// instances in turn; one whose poll says `admitted` goes to the origin at
/// once, then leaves, each on another instance.
async fn poll(
    client: &HttpClient,
    instances: &[Instance],
    waiters: &mut [Waiter],
    which: Vec<usize>,
    round: usize,
    sessions: &Sessions,
) {
    let urls: Vec<String> = instances.iter().map(|i| i.url("")).collect();
    let jobs: Vec<_> = which
        .into_iter()
        .map(|i| {
            let w = &mut waiters[i];
            (i, w.lane, w.path(), std::mem::take(&mut w.visitor))
        })
        .collect();
    let done: Vec<(usize, Visitor, bool)> = stream::iter(jobs)
        .map(|(i, lane, path, mut v)| {
            let client = client.clone();
            let at = |k: usize| urls[(i + round + k) % urls.len()].clone();
            let (status, target, leave) = (at(0), at(1), at(2));
            async move {
                let a = send(
                    &client,
                    &mut v,
                    api_request(&format!("{status}/__queuegate/status?route={ROUTE}")),
                )
                .await;
                assert_eq!(a.status, StatusCode::OK, "{path}: {a:?}");
                let json = a.json();
                match json["state"].as_str() {
                    Some("waiting") => {
                        assert_eq!(json["lane"], LANES[lane], "{path}: {json}");
                        assert_eq!(json["priority"], lane != MAIN, "{path}: {json}");
                        (i, v, false)
                    }
                    Some("admitted") => {
                        let now = sessions.now.fetch_add(1, Ordering::SeqCst) + 1;
                        sessions.most.fetch_max(now, Ordering::SeqCst);
                        let a = send(&client, &mut v, navigation(&format!("{target}{path}"))).await;
                        assert!(a.reached_origin(), "{path}: {a:?}");
                        sessions.now.fetch_sub(1, Ordering::SeqCst);
                        let a = send(
                            &client,
                            &mut v,
                            leave_request(&format!("{leave}/__queuegate/leave?route={ROUTE}")),
                        )
                        .await;
                        assert_eq!(a.json()["state"], "left", "{path}: {a:?}");
                        (i, v, true)
                    }
                    _ => panic!("{path}: {json}"),
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let now = Instant::now();
    for (i, visitor, admitted) in done {
        let w = &mut waiters[i];
        w.visitor = visitor;
        w.polled = now;
        w.admitted = admitted;
    }
}

/// The waiters not admitted whose last poll is older than [`REFRESH`],
/// oldest first, at most `most`, leaving out `except`.
fn stale(waiters: &[Waiter], except: &[usize], most: usize) -> Vec<usize> {
    let mut stale: Vec<usize> = (0..waiters.len())
        .filter(|&i| {
            let w = &waiters[i];
            !w.admitted && w.polled.elapsed() > REFRESH && !except.contains(&i)
        })
        .collect();
    stale.sort_by_key(|&i| waiters[i].polled);
    stale.truncate(most);
    stale
}

/// Between two samples of the store.
struct Window {
    /// Members gone from each lane, in their order there.
    removed: [Vec<Vec<u8>>; 2],
    waiting_before: [usize; 2],
    waiting_after: [usize; 2],
    /// Live slots at the first sample.
    active_before: usize,
    /// Admitter ticks that ran in between, when known to be exactly one.
    one_tick: bool,
}

impl Window {
    fn admitted(&self) -> usize {
        self.removed[MAIN].len() + self.removed[VIP].len()
    }
}

/// What the sampler saw.
#[derive(Default)]
struct Samples {
    windows: Vec<Window>,
    /// Anything the store did that it must not: admitting out of FIFO
    /// order, a lane growing, more live slots than capacity.
    faults: Vec<String>,
    taken: usize,
    most_active: usize,
}

/// Reads, atomically, the tick window of the last tick that ran, the live
/// slots, and each lane's count and first `ARGV[1]` members.
const SAMPLE_SCRIPT: &str = r"
local t = redis.call('TIME')
local now_ms = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
local out = {
  redis.call('HGET', KEYS[4], 'last_tick') or '0',
  redis.call('ZCOUNT', KEYS[3], '(' .. string.format('%d', now_ms), '+inf'),
}
for i = 1, 2 do
  out[#out + 1] = redis.call('ZCARD', KEYS[i])
  out[#out + 1] = redis.call('ZRANGE', KEYS[i], 0, tonumber(ARGV[1]) - 1)
end
return out
";

type Sample = (String, usize, usize, Vec<Vec<u8>>, usize, Vec<Vec<u8>>);

/// Samples the store every few milliseconds on its own thread (so a busy
/// test runtime does not delay it) until `stop`.
fn sample(redis: &RedisServer, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Samples> {
    let mut con = redis.connection();
    let script = redis::Script::new(SAMPLE_SCRIPT);
    let tick_ms = 50;
    std::thread::spawn(move || {
        let read = |con: &mut redis::Connection| -> Sample {
            script
                .key(lane_key(MAIN))
                .key(lane_key(VIP))
                .key(format!("qg:{{{ROUTE}}}:active"))
                .key(format!("qg:{{{ROUTE}}}:stats"))
                .arg(SAMPLED_HEAD)
                .invoke(con)
                .unwrap()
        };
        let mut out = Samples::default();
        let mut before = read(&mut con);
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(3));
            let after = read(&mut con);
            out.taken += 1;
            out.most_active = out.most_active.max(after.1);
            if after.1 > CAPACITY {
                out.faults
                    .push(format!("{} live slots, capacity {CAPACITY}", after.1));
            }
            let tick_before: u64 = before.0.parse().unwrap();
            let tick_after: u64 = after.0.parse().unwrap();
            let heads = [(&before.3, &after.3), (&before.5, &after.5)];
            let counts = [(before.2, after.2), (before.4, after.4)];
            let mut removed = [Vec::new(), Vec::new()];
            for lane in [MAIN, VIP] {
                let ((was, is), (old, new)) = (counts[lane], heads[lane]);
                if is > was {
                    out.faults
                        .push(format!("lane {} grew from {was} to {is}", LANES[lane]));
                    continue;
                }
                let gone = was - is;
                if gone >= SAMPLED_HEAD.min(was) && is > 0 {
                    out.faults.push(format!(
                        "the sampler fell behind: {gone} gone from lane {} between two samples",
                        LANES[lane]
                    ));
                    continue;
                }
                // FIFO: the members gone are the first `gone` of the head
                // read before, and the head now is the rest of it.
                let gone = gone.min(old.len());
                let kept = (old.len() - gone).min(new.len());
                if old[gone..gone + kept] != new[..kept] {
                    out.faults.push(format!(
                        "lane {}: {gone} left it, not from its head",
                        LANES[lane]
                    ));
                }
                removed[lane] = old[..gone].to_vec();
            }
            let ticks = tick_after / tick_ms - tick_before / tick_ms;
            if ticks > 0 || !removed[MAIN].is_empty() || !removed[VIP].is_empty() {
                out.windows.push(Window {
                    removed,
                    waiting_before: [before.2, before.4],
                    waiting_after: [after.2, after.4],
                    active_before: before.1,
                    // At most one tick runs in a tick window (admit_tick.lua).
                    one_tick: ticks == 1,
                });
            }
            before = after;
        }
        out
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lanes_over_three_instances_share_admissions_by_weight_and_keep_fifo_in_each() {
    let redis = RedisServer::start();
    let (origin, origin_log) = session_origin().await;
    let instances = start_instances(&redis, &origin, lanes_config(CAPACITY), 3).await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut con = redis.connection();

    // Holders fill every place, so that all 2,000 wait and nobody is
    // admitted before everyone has joined.
    let mut holders = Vec::new();
    for i in 0..CAPACITY {
        let mut v = Visitor::new();
        for k in 0..2 {
            let url = instances[(i + k) % 3].url(&format!("/tickets/hold/{i}"));
            let a = send(&client, &mut v, navigation(&url)).await;
            assert!(a.reached_origin(), "holder {i}: {a:?}");
        }
        holders.push(v);
    }

    // Joins, one after another, alternating lanes and going round the
    // instances: each lane's join order is its visitors' order here. Each
    // visitor's member in the store is the newest of its lane just after
    // it joined.
    let token = lane_grant::sign_invite(&instance_ring(), ROUTE, &vip(), now_unix() + 3600, 0);
    let mut waiters: Vec<Waiter> = Vec::with_capacity(2 * PER_LANE);
    let mut members: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
    let mut member_of: HashMap<Vec<u8>, usize> = HashMap::new();
    let joining = Instant::now();
    for k in 0..2 * PER_LANE {
        let (lane, index) = (k % 2, k / 2);
        let mut w = Waiter {
            lane,
            index,
            visitor: Visitor::new(),
            polled: Instant::now(),
            admitted: false,
        };
        let mut url = instances[k % 3].url(&w.path());
        if lane == VIP {
            url.push_str(&format!("?qg_invite={token}"));
        }
        let a = send(&client, &mut w.visitor, api_request(&url)).await;
        let json = waiting_json(&a, &w.path());
        assert_eq!(json["lane"], LANES[lane], "{}: {json}", w.path());
        assert_eq!(json["priority"], lane == VIP, "{}: {json}", w.path());
        assert_eq!(json["position"], index + 1, "{}: {json}", w.path());
        let member = newest_member(&mut con, lane);
        assert!(
            member_of.insert(member.clone(), waiters.len()).is_none(),
            "{}: a member already taken",
            w.path()
        );
        members[lane].push(member);
        waiters.push(w);
        // A long join phase would leave the first tickets unpolled too long.
        if k % 200 == 199 {
            let refresh = stale(&waiters, &[], usize::MAX);
            poll(
                &client,
                &instances,
                &mut waiters,
                refresh,
                k,
                &Sessions::default(),
            )
            .await;
        }
    }
    let joined_in = joining.elapsed();
    for lane in [MAIN, VIP] {
        let line: Vec<Vec<u8>> = redis::cmd("ZRANGE")
            .arg(lane_key(lane))
            .arg(0)
            .arg(-1)
            .query(&mut con)
            .unwrap();
        assert!(
            line == members[lane],
            "lane {}: the store's order is not the join order",
            LANES[lane]
        );
    }

    // The holders leave, and the line moves: heads polled every round,
    // everyone else when their last poll grows old.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(&redis, stop.clone());
    for (i, v) in holders.iter_mut().enumerate() {
        let url = instances[i % 3].url(&format!("/__queuegate/leave?route={ROUTE}"));
        let a = send(&client, v, leave_request(&url)).await;
        assert_eq!(a.json()["state"], "left", "holder {i}: {a:?}");
    }
    let sessions = Sessions::default();
    let moving = Instant::now();
    let mut pending: [Vec<usize>; 2] = [
        (0..waiters.len())
            .filter(|&i| waiters[i].lane == MAIN)
            .collect(),
        (0..waiters.len())
            .filter(|&i| waiters[i].lane == VIP)
            .collect(),
    ];
    let mut rounds = 0;
    while pending.iter().any(|p| !p.is_empty()) {
        assert!(
            moving.elapsed() < Duration::from_secs(300),
            "still waiting after 300 s: {} main, {} vip",
            pending[MAIN].len(),
            pending[VIP].len()
        );
        let mut which: Vec<usize> = pending
            .iter()
            .flat_map(|p| p.iter().take(HEAD).copied())
            .collect();
        which.extend(stale(&waiters, &which, CONCURRENCY));
        poll(&client, &instances, &mut waiters, which, rounds, &sessions).await;
        for p in pending.iter_mut() {
            p.retain(|&i| !waiters[i].admitted);
        }
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let moved_in = moving.elapsed();
    // The last admissions are in the store before the polls that saw them:
    // one more sample after them closes the record.
    std::thread::sleep(Duration::from_millis(20));
    stop.store(true, Ordering::SeqCst);
    let samples = sampler.join().unwrap();
    eprintln!(
        "joined 2,000 in {joined_in:?}; all admitted in {moved_in:?}, {rounds} rounds, \
         {} samples, {} windows with a change",
        samples.taken,
        samples.windows.len()
    );

    assert!(samples.faults.is_empty(), "{:#?}", samples.faults);

    // FIFO in each lane, across instances: the members left each lane in
    // exactly the order its visitors joined.
    for lane in [MAIN, VIP] {
        let order: Vec<&Vec<u8>> = samples
            .windows
            .iter()
            .flat_map(|w| w.removed[lane].iter())
            .collect();
        let joined: Vec<&Vec<u8>> = members[lane].iter().collect();
        if order != joined {
            let first = order
                .iter()
                .zip(&joined)
                .position(|(a, b)| a != b)
                .unwrap_or(order.len().min(joined.len()));
            panic!(
                "lane {}: {} admitted, {} joined; first difference at #{first}: \
                 admitted {:?}, joined {:?}",
                LANES[lane],
                order.len(),
                joined.len(),
                order.get(first).map(|m| member_of[*m]),
                joined.get(first).map(|m| member_of[*m]),
            );
        }
    }

    // While both lanes had waiters, vip : main is 3 : 1. A window whose
    // second sample still shows both lanes waiting had both the whole time
    // (nobody joins now). Smooth weighted round robin keeps the running
    // split within one pick of 3 : 1 at every step, across ticks and
    // instances, so every prefix is checked too, not only the total.
    let (mut vip_count, mut main_count) = (0usize, 0usize);
    let mut most_off: f64 = 0.0;
    for w in samples
        .windows
        .iter()
        .filter(|w| w.waiting_after.iter().all(|&n| n > 0))
    {
        vip_count += w.removed[VIP].len();
        main_count += w.removed[MAIN].len();
        let off = (vip_count as f64 - 0.75 * (vip_count + main_count) as f64).abs();
        most_off = most_off.max(off);
        assert!(
            off <= 1.0,
            "after {vip_count} vip and {main_count} main: the split drifted"
        );
    }
    let ratio = vip_count as f64 / main_count as f64;
    assert!(
        (2.85..=3.15).contains(&ratio),
        "vip : main = {vip_count} : {main_count} while both lanes waited"
    );
    assert!(
        main_count >= 300 && vip_count >= 900,
        "{vip_count} : {main_count}"
    );

    // Once vip is empty main gets every admission, and no slot is left
    // free: a window with exactly one tick admitted as many as the free
    // slots (at least those free at its first sample: slots are only freed
    // in between), the tick limit and the line allowed. Checked in both
    // phases, so a lane with nobody left cannot waste the other's turns.
    let mut checked = [0usize; 2];
    for w in &samples.windows {
        let alone = w.waiting_before[VIP] == 0;
        if alone {
            assert!(w.removed[VIP].is_empty());
        }
        assert!(
            w.admitted() <= MOST_PER_TICK || !w.one_tick,
            "{}",
            w.admitted()
        );
        if w.one_tick {
            let free = CAPACITY.saturating_sub(w.active_before);
            let waiting = w.waiting_before[MAIN] + w.waiting_before[VIP];
            let due = free.min(MOST_PER_TICK).min(waiting);
            assert!(
                w.admitted() >= due,
                "a tick admitted {} ({} main, {} vip) with {free} slots free and \
                 {} main, {} vip waiting",
                w.admitted(),
                w.removed[MAIN].len(),
                w.removed[VIP].len(),
                w.waiting_before[MAIN],
                w.waiting_before[VIP],
            );
            checked[usize::from(alone)] += 1;
        }
    }
    assert!(
        checked.iter().all(|&n| n >= 10),
        "too few single-tick windows to check: {checked:?}"
    );
    let alone: usize = samples
        .windows
        .iter()
        .filter(|w| w.waiting_before[VIP] == 0)
        .map(|w| w.removed[MAIN].len())
        .sum();
    assert!(alone >= 600, "main alone took {alone}");

    // Never more than capacity: in the store, at the origin, or in the
    // visitors' own count of their sessions.
    assert!(samples.most_active <= CAPACITY);
    let at_origin = origin_log.most_in_flight.load(Ordering::SeqCst);
    assert!(at_origin <= CAPACITY, "{at_origin} at the origin at once");
    assert!(at_origin > 1, "sessions never overlapped at the origin");
    let most = sessions.most.load(Ordering::SeqCst);
    assert!(most <= CAPACITY, "{most} sessions at once");
    eprintln!(
        "vip : main {vip_count} : {main_count} (off by {most_off} at most), main alone {alone}, \
         single ticks checked {checked:?}, at once: {} in the store, {at_origin} at the origin, \
         {most} sessions",
        samples.most_active
    );

    // Every waiter came to the origin exactly once.
    {
        let paths = origin_log.paths.lock().unwrap();
        let mut came: HashMap<&str, usize> = HashMap::new();
        for p in paths.iter().filter(|p| !p.starts_with("/tickets/hold/")) {
            *came.entry(p.as_str()).or_default() += 1;
        }
        assert_eq!(came.len(), 2 * PER_LANE);
        assert!(came.values().all(|&n| n == 1));
    }

    // Fairness as the instances measured it: each admission from the line
    // counted once (by the instance whose tick made it), in its lane, and
    // nobody admitted ahead of an earlier waiter of the same lane.
    let mut waits = [0.0; 2];
    let mut inversions = 0.0;
    for at in &instances {
        let (_, body) = get(&at.process.admin_url("/metrics")).await;
        let text = String::from_utf8_lossy(&body);
        for (lane, name) in LANES.iter().enumerate() {
            let series =
                format!("queuegate_wait_seconds_count{{route=\"{ROUTE}\",lane=\"{name}\"}}");
            waits[lane] += common::sample(&text, &series);
        }
        inversions += common::sample(
            &text,
            &format!("queuegate_admission_inversions_total{{route=\"{ROUTE}\"}}"),
        );
    }
    assert_eq!(waits, [PER_LANE as f64; 2], "waits counted per lane");
    assert_eq!(inversions, 0.0);
}

// ---------------------------------------------------------------------------
// Invite uses.

#[tokio::test]
async fn invite_uses_are_counted_once_across_instances() {
    let redis = RedisServer::start();
    let (origin, _hits) = counting_origin().await;
    let instances = start_instances(&redis, &origin, lanes_config(1), 3).await;
    let _holder = hold_the_place(&instances[0]).await;
    let token = lane_grant::sign_invite(&instance_ring(), ROUTE, &vip(), now_unix() + 3600, 3);

    // Twenty apps at once, spread over the instances, each with the token
    // on its first request.
    let arrivals = futures_util::future::join_all((0..20).map(|i| {
        let url = instances[i % 3].url(&format!("/tickets/x?qg_invite={token}"));
        async move {
            let mut v = Visitor::new();
            let a = v.fetch(&url).await;
            (v, a)
        }
    }))
    .await;
    let mut crowd = Vec::new();
    for (i, (v, a)) in arrivals.into_iter().enumerate() {
        let json = waiting_json(&a, &format!("visitor {i}"));
        let lane = json["lane"].as_str().unwrap().to_owned();
        assert_eq!(lane_cookie_set(&a), lane == "vip", "visitor {i}: {a:?}");
        crowd.push((v, lane));
    }

    // Their status, each on another instance, says the same.
    let mut positions: HashMap<String, Vec<u64>> = HashMap::new();
    for (i, (v, lane)) in crowd.iter_mut().enumerate() {
        let json = waiting_status(v, &instances[(i + 1) % 3], &format!("visitor {i}")).await;
        assert_eq!(json["lane"], *lane, "visitor {i}: {json}");
        assert_eq!(json["priority"], *lane == "vip", "visitor {i}: {json}");
        positions
            .entry(lane.clone())
            .or_default()
            .push(json["position"].as_u64().unwrap());
    }
    for places in positions.values_mut() {
        places.sort();
    }
    assert_eq!(positions["vip"], vec![1, 2, 3], "{positions:?}");
    assert_eq!(
        positions["main"],
        (1..=17).collect::<Vec<u64>>(),
        "{positions:?}"
    );

    // Used up: a browser following the link now is sent on without a lane.
    let mut late = Visitor::new();
    let a = late
        .navigate(&instances[2].url(&format!("/tickets/x?qg_invite={token}")))
        .await;
    assert_eq!(a.status, StatusCode::FOUND, "{a:?}");
    assert_eq!(a.location(), Some("/tickets/x"));
    assert!(!lane_cookie_set(&a), "{a:?}");
}

// ---------------------------------------------------------------------------
// Bad invites, and a waiter moved by a good one.

#[tokio::test]
async fn a_forged_expired_or_other_route_invite_puts_nobody_in_a_lane() {
    let redis = RedisServer::start();
    let (origin, _hits) = counting_origin().await;
    let instances = start_instances(&redis, &origin, lanes_config(1), 3).await;
    let _holder = hold_the_place(&instances[0]).await;
    let ring = instance_ring();
    let later = now_unix() + 3600;
    let good = lane_grant::sign_invite(&ring, ROUTE, &vip(), later, 0);
    let other_key = KeyRing::new(vec![("k1".to_owned(), vec![7; 32])]).unwrap();
    // The same token with its `uses` field changed, its MAC left as it was.
    let altered = {
        let mut fields: Vec<&str> = good.split('.').collect();
        fields[5] = "9";
        fields.join(".")
    };
    let bad = [
        (
            "signed with another key",
            lane_grant::sign_invite(&other_key, ROUTE, &vip(), later, 0),
        ),
        ("altered", altered),
        (
            "expired",
            lane_grant::sign_invite(&ring, ROUTE, &vip(), now_unix() - 1, 0),
        ),
        (
            "another route's",
            lane_grant::sign_invite(&ring, "merch", &vip(), later, 0),
        ),
        (
            "for a lane the route lacks",
            lane_grant::sign_invite(&ring, ROUTE, &Lane::new("staff").unwrap(), later, 0),
        ),
        ("malformed", "v1.i.tickets.vip.soon".to_owned()),
        ("too long", format!("v1.i.tickets.vip.{}", "9".repeat(300))),
    ];

    // Each bad token, from an app and from a browser: the visitor waits in
    // main, as if the link had had none.
    let mut main_place = 0;
    for (i, (what, token)) in bad.iter().enumerate() {
        let target = format!("/tickets/x?qg_invite={token}");
        let mut app = Visitor::new();
        let a = app.fetch(&instances[i % 3].url(&target)).await;
        let json = waiting_json(&a, what);
        assert!(!lane_cookie_set(&a), "{what}: {a:?}");
        main_place += 1;
        for json in [
            json,
            waiting_status(&mut app, &instances[(i + 1) % 3], what).await,
        ] {
            assert_eq!(json["lane"], "main", "{what}: {json}");
            assert_eq!(json["priority"], false, "{what}: {json}");
            assert_eq!(json["position"], main_place, "{what}: {json}");
        }

        let mut browser = Visitor::new();
        let a = browser.navigate(&instances[i % 3].url(&target)).await;
        assert_eq!(a.status, StatusCode::FOUND, "{what}: {a:?}");
        assert_eq!(a.location(), Some("/tickets/x"), "{what}");
        assert!(!lane_cookie_set(&a), "{what}: {a:?}");
        let a = browser
            .navigate(&instances[(i + 1) % 3].url("/tickets/x"))
            .await;
        assert_eq!(a.status, StatusCode::FOUND, "{what}: {a:?}");
        assert!(
            a.location()
                .unwrap()
                .contains("/__queuegate/waiting?route=tickets"),
            "{what}: {a:?}"
        );
        main_place += 1;
        let json = waiting_status(&mut browser, &instances[(i + 2) % 3], what).await;
        assert_eq!(json["lane"], "main", "{what}: {json}");
        assert_eq!(json["priority"], false, "{what}: {json}");
        assert_eq!(json["position"], main_place, "{what}: {json}");
    }

    // The valid token puts a newcomer in vip at once.
    let mut invited = Visitor::new();
    let a = invited
        .fetch(&instances[1].url(&format!("/tickets/x?qg_invite={good}")))
        .await;
    let json = waiting_json(&a, "valid");
    assert!(lane_cookie_set(&a), "{a:?}");
    assert_eq!(json["lane"], "vip", "{json}");
    assert_eq!(json["priority"], true, "{json}");
    assert_eq!(json["position"], 1, "{json}");

    a_waiter_moves_by_invite(&instances, &redis, &good, main_place, 1, false).await;
}

/// A waiter in main takes the invite `good`, in an app's request or as a
/// browser following the link: it keeps its join score, so in vip it
/// stands behind those who joined vip before it and ahead of those who
/// joined after, and main closes up behind it. `main` and `vip` are the
/// numbers waiting in each lane before.
async fn a_waiter_moves_by_invite(
    instances: &[Instance],
    redis: &RedisServer,
    good: &str,
    main: u64,
    vip: u64,
    browser: bool,
) {
    let mut con = redis.connection();
    let mut mover = Visitor::new();
    assert_eq!(
        mover.navigate(&instances[0].url("/tickets/x")).await.status,
        StatusCode::FOUND
    );
    let json = waiting_status(&mut mover, &instances[1], "mover").await;
    assert_eq!(json["lane"], "main", "{json}");
    assert_eq!(json["position"], main + 1, "{json}");
    let member = newest_member(&mut con, MAIN);
    let score: f64 = redis::cmd("ZSCORE")
        .arg(lane_key(MAIN))
        .arg(&member)
        .query(&mut con)
        .unwrap();
    let mut behind_main = Visitor::new();
    assert_eq!(
        behind_main
            .navigate(&instances[1].url("/tickets/x"))
            .await
            .status,
        StatusCode::FOUND
    );
    let json = waiting_status(&mut behind_main, &instances[2], "behind in main").await;
    assert_eq!(json["position"], main + 2, "{json}");
    let mut behind_vip = Visitor::new();
    let a = behind_vip
        .fetch(&instances[2].url(&format!("/tickets/x?qg_invite={good}")))
        .await;
    assert_eq!(waiting_json(&a, "behind in vip")["position"], vip + 1);

    let link = instances[2].url(&format!("/tickets/x?qg_invite={good}"));
    if browser {
        let a = mover.navigate(&link).await;
        assert_eq!(a.status, StatusCode::FOUND, "{a:?}");
        assert_eq!(a.location(), Some("/tickets/x"));
        assert!(lane_cookie_set(&a), "{a:?}");
        // The browser goes on to the target, and on to the waiting page.
        let a = mover.navigate(&instances[0].url("/tickets/x")).await;
        assert_eq!(a.status, StatusCode::FOUND, "{a:?}");
    } else {
        let a = mover.fetch(&link).await;
        assert!(lane_cookie_set(&a), "{a:?}");
        let json = waiting_json(&a, "moved");
        assert_eq!(json["lane"], "vip", "{json}");
        assert_eq!(json["position"], vip + 1, "{json}");
    }
    let json = waiting_status(&mut mover, &instances[1], "moved").await;
    assert_eq!(json["lane"], "vip", "{json}");
    assert_eq!(json["priority"], true, "{json}");
    assert_eq!(json["position"], vip + 1, "{json}");
    let moved: Option<f64> = redis::cmd("ZSCORE")
        .arg(lane_key(VIP))
        .arg(&member)
        .query(&mut con)
        .unwrap();
    assert_eq!(moved, Some(score), "the join score changed");
    for (v, at, lane, place) in [
        (&mut behind_vip, 0, "vip", vip + 2),
        (&mut behind_main, 2, "main", main + 1),
    ] {
        let json = waiting_status(v, &instances[at], lane).await;
        assert_eq!(json["lane"], lane, "{json}");
        assert_eq!(json["position"], place, "{json}");
    }
}

#[tokio::test]
async fn a_waiter_following_an_invite_link_in_a_browser_moves_to_its_lane() {
    let redis = RedisServer::start();
    let (origin, _hits) = counting_origin().await;
    let instances = start_instances(&redis, &origin, lanes_config(1), 3).await;
    let _holder = hold_the_place(&instances[0]).await;
    let good = lane_grant::sign_invite(&instance_ring(), ROUTE, &vip(), now_unix() + 3600, 0);
    let mut first = Visitor::new();
    let a = first
        .fetch(&instances[1].url(&format!("/tickets/x?qg_invite={good}")))
        .await;
    assert_eq!(waiting_json(&a, "first in vip")["lane"], "vip");
    a_waiter_moves_by_invite(&instances, &redis, &good, 0, 1, true).await;
}

// ---------------------------------------------------------------------------
// A lane cookie copied to another visitor, on any instance.

/// An origin that names lane `vip` in its answer to `/account/vip` (a
/// login, say) and answers everything else plainly.
async fn account_origin() -> Origin {
    spawn_origin(|req: Request<Incoming>| async move {
        let mut resp = Response::new(full("origin"));
        if req.uri().path() == "/account/vip" {
            resp.headers_mut()
                .insert("queuegate-lane", "vip".parse().unwrap());
        }
        resp
    })
    .await
}

/// The lane cookie `v` holds for the route.
fn lane_cookie(v: &Visitor) -> String {
    v.cookie("qg_lane.tickets")
        .unwrap_or_else(|| panic!("no lane cookie: {:?}", v.jar))
        .to_owned()
}

/// A newcomer holding only `copied` as its lane cookie, arriving at `at`:
/// it waits in main, and is given no lane cookie.
async fn a_copy_gives_nothing(copied: &str, at: &Instance, what: &str) {
    let mut copier = Visitor::new();
    copier
        .jar
        .insert("qg_lane.tickets".to_owned(), copied.to_owned());
    let a = copier.fetch(&at.url("/tickets/x")).await;
    let json = waiting_json(&a, what);
    assert_eq!(json["lane"], "main", "{what}: {json}");
    assert!(!lane_cookie_set(&a), "{what}: {a:?}");
}

#[tokio::test]
async fn a_copied_lane_cookie_puts_nobody_in_a_lane_on_any_instance() {
    let redis = RedisServer::start();
    let origin = account_origin().await;
    let instances = start_instances(&redis, &origin, lanes_config(1), 3).await;
    let _holder = hold_the_place(&instances[0]).await;

    // An invite for one, followed in a browser on one instance: the lane
    // cookie is bound to the ticket the visitor got with it.
    let token = lane_grant::sign_invite(&instance_ring(), ROUTE, &vip(), now_unix() + 3600, 1);
    let mut invited = Visitor::new();
    let a = invited
        .navigate(&instances[0].url(&format!("/tickets/x?qg_invite={token}")))
        .await;
    assert_eq!(a.location(), Some("/tickets/x"), "{a:?}");
    assert!(lane_cookie_set(&a), "{a:?}");
    let a = invited.navigate(&instances[1].url("/tickets/x")).await;
    assert_eq!(a.status, StatusCode::FOUND, "{a:?}");
    let json = waiting_status(&mut invited, &instances[2], "invited").await;
    assert_eq!(json["lane"], "vip", "{json}");
    let copied = lane_cookie(&invited);
    for at in &instances {
        a_copy_gives_nothing(&copied, at, "a copy of the invite's").await;
    }

    // A lane the origin names to a visitor who holds nothing on the route
    // is for the first arrival that presents it, counted once in the
    // store: the visitor's, on one instance; a copy taken before, on
    // another, gets nothing.
    let mut anonymous = Visitor::new();
    let a = anonymous.navigate(&instances[0].url("/account/vip")).await;
    assert!(a.reached_origin(), "{a:?}");
    let given = lane_cookie(&anonymous);
    let a = anonymous.fetch(&instances[1].url("/tickets/x")).await;
    assert_eq!(waiting_json(&a, "anonymous")["lane"], "vip");
    a_copy_gives_nothing(&given, &instances[2], "a copy given before").await;
    a_copy_gives_nothing(&lane_cookie(&anonymous), &instances[0], "a copy after").await;
}
