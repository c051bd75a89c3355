//! Replays after a store loss, a Redis FLUSHALL and a restart of a gate on
//! the memory store (same key ring): what the store could not have held at
//! the loss (a session idle past `session_ttl`, a ticket silent past
//! `abandon_after`, a pass whose holder left, a pass issued at or after the
//! new epoch) never gets a slot nor a place ahead of those in line; a live
//! session and a live ticket are restored, and so is the unconfirmed pass of
//! a visitor admitted at once just before the loss. Places given up in any
//! way (left, ended by the origin or an exit path, requests used up) and a
//! used-up invite stay given up after a `FLUSHALL` seen by another instance
//! and across a restart of a memory store kept in a snapshot.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use http::StatusCode;
use queuegate::admission::Kind;
use queuegate::config::{Backend, Config};

/// How the store is lost.
enum Loss {
    /// `FLUSHALL` on the Redis the gate uses.
    Flush(RedisServer),
    /// The gate (memory store) stops and a new one starts with the same
    /// config and key ring.
    Restart,
}

/// A gate on `/tickets` (capacity 1) with short lives, its origin's hit
/// count, and how its store is lost.
struct Room {
    gate: Gate,
    config: Config,
    loss: Loss,
    hits: Arc<AtomicUsize>,
    _origin: Origin,
}

impl Room {
    async fn new(loss: Loss) -> Room {
        Room::tuned(loss, |_| {}).await
    }

    /// [`Room::new`] with its route changed by `tune`.
    async fn tuned(loss: Loss, tune: impl FnOnce(&mut queuegate::config::Route)) -> Room {
        let (origin, hits) = counting_origin().await;
        let mut config = proxy_config(&origin.url());
        if let Loss::Flush(redis) = &loss {
            config.store.backend = Backend::Redis;
            config.store.redis = redis.config(Duration::from_secs(2));
        }
        let mut r = route("tickets", "/tickets", 1);
        r.pass_ttl = Duration::from_secs(2);
        r.session_ttl = Duration::from_secs(3);
        r.abandon_after = Duration::from_secs(3);
        r.confirm_within = Duration::from_secs(1);
        r.arrival_grace = Duration::from_secs(3);
        tune(&mut r);
        config.routes.push(r);
        let gate = spawn_gate_with(config.clone(), ring("k1")).await;
        Room {
            gate,
            config,
            loss,
            hits,
            _origin: origin,
        }
    }

    fn url(&self) -> String {
        self.gate.url("/tickets")
    }

    async fn lose(&mut self) {
        match &self.loss {
            Loss::Flush(redis) => {
                let _: () = redis.query(&["FLUSHALL"]);
            }
            Loss::Restart => {
                let fresh = spawn_gate_with(self.config.clone(), ring("k1")).await;
                let old = std::mem::replace(&mut self.gate, fresh);
                old.stop().await.unwrap();
            }
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// The state and position `v` reads on the status endpoint.
    async fn status(&self, v: &mut Visitor) -> (String, u64) {
        let s = v.status(&self.gate, "tickets").await;
        (
            s["state"].as_str().unwrap().to_owned(),
            s["position"].as_u64().unwrap_or(0),
        )
    }

    /// Replays `cookie` as a fresh client: never forwarded, and the ticket
    /// it gets is behind everyone in `line` still waiting, which it joins.
    async fn replay(&self, what: &str, cookie: &str, line: &mut Vec<Visitor>) {
        let mut last = 0;
        for v in line.iter_mut() {
            let (state, position) = self.status(v).await;
            if state == "waiting" {
                last = last.max(position);
            }
        }
        let mut v = Visitor::new();
        v.jar.insert("qg_tickets".into(), cookie.to_owned());
        let before = self.hits();
        let a = v.fetch(&self.url()).await;
        assert_eq!(
            a.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{what}: got {a:?}"
        );
        assert_eq!(self.hits(), before, "{what} reached the origin");
        assert_ne!(v.cookie("qg_tickets"), Some(cookie), "{what}: a new ticket");
        let (state, position) = self.status(&mut v).await;
        assert_eq!(state, "waiting", "{what}");
        assert!(
            position > last,
            "{what} got place {position}, not behind the last in line ({last})"
        );
        line.push(v);
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn replays(loss: Loss) {
    let mut room = Room::new(loss).await;

    // X holds the slot, comes back (confirmed), then goes idle.
    let mut x = Visitor::new();
    assert!(x.navigate(&room.url()).await.reached_origin());
    assert!(x.navigate(&room.url()).await.reached_origin());
    let x_pass = x.cookie("qg_tickets").unwrap().to_owned();
    assert!(x_pass.starts_with("v1.a."), "{x_pass}");

    // H, then W1, W2, W3 line up; each polls once (confirmed).
    let mut line: Vec<Visitor> = Vec::new();
    for i in 0..4 {
        let mut v = Visitor::new();
        assert_eq!(v.navigate(&room.url()).await.status, StatusCode::FOUND);
        assert_eq!(room.status(&mut v).await, ("waiting".into(), i + 1));
        line.push(v);
    }
    let w1 = line.remove(1);
    let w1_ticket = w1.cookie("qg_tickets").unwrap().to_owned();
    let mut h = line.remove(0);

    // X's session expires (nobody renews it): H, at the head, is admitted
    // and comes in. W1 stays silent and is dropped from the line; W2 and
    // W3 keep polling.
    let mut h_in = false;
    for _ in 0..500 {
        if !h_in && room.status(&mut h).await.0 == "admitted" {
            assert!(h.navigate(&room.url()).await.reached_origin());
            h_in = true;
        } else if h_in {
            assert!(h.navigate(&room.url()).await.reached_origin());
        }
        let mut positions = Vec::new();
        for v in line.iter_mut() {
            let (state, position) = room.status(v).await;
            assert_eq!(state, "waiting");
            positions.push(position);
        }
        if h_in && positions == [1, 2] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(h_in, "H was never admitted");
    assert_eq!(room.status(&mut line[0]).await.1, 1, "W1 was never dropped");
    // Keep H's session fresh right before the loss.
    assert!(h.navigate(&room.url()).await.reached_origin());
    let h_pass = h.cookie("qg_tickets").unwrap().to_owned();

    room.lose().await;

    // A live session is restored: H keeps reaching the origin, and its pass
    // is renewed through the store once the gate sees the new epoch (or the
    // pass ages), which brings the session back.
    let mut renewed = false;
    for _ in 0..200 {
        assert!(
            h.navigate(&room.url()).await.reached_origin(),
            "the live session was lost"
        );
        if h.cookie("qg_tickets") != Some(h_pass.as_str()) {
            renewed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(renewed, "H's pass was never renewed after the loss");
    // The store has held the route since before this instant.
    let restored_at = now_ms();
    // Live tickets are restored at their places.
    for (i, v) in line.iter_mut().enumerate() {
        assert_eq!(
            room.status(v).await,
            ("waiting".into(), i as u64 + 1),
            "live ticket {i}"
        );
    }

    // What the store could not have held: never a slot, never ahead.
    room.replay("a pass idle past session_ttl", &x_pass, &mut line)
        .await;
    room.replay("a ticket silent past abandon_after", &w1_ticket, &mut line)
        .await;
    // Passes issued at or after the new epoch, expired so that they go to
    // the store.
    let r = ring("k1");
    let at_epoch = r.sign_at(
        Kind::Pass,
        "tickets",
        &[42u8; 16],
        restored_at / 1000 - 1,
        Some(restored_at),
    );
    room.replay(
        "a pass issued in the epoch's first second",
        &at_epoch,
        &mut line,
    )
    .await;
    if let Loss::Flush(redis) = &room.loss {
        let epoch_us: u64 = redis.query(&["HGET", "qg:{tickets}:stats", "epoch"]);
        let epoch_ms = epoch_us / 1000;
        let exactly = r.sign_at(
            Kind::Pass,
            "tickets",
            &[43u8; 16],
            epoch_ms / 1000 - 1,
            Some(epoch_ms),
        );
        room.replay(
            "a pass issued at the epoch's millisecond",
            &exactly,
            &mut line,
        )
        .await;
        // One millisecond earlier it could have been in the store: a lost
        // session, restored.
        let mut lost = Visitor::new();
        let before = r.sign_at(
            Kind::Pass,
            "tickets",
            &[44u8; 16],
            epoch_ms / 1000 - 1,
            Some(epoch_ms - 1),
        );
        lost.jar.insert("qg_tickets".into(), before);
        assert!(
            lost.fetch(&room.url()).await.reached_origin(),
            "a pass issued a millisecond before the epoch is a lost session"
        );
        lost.leave(&room.gate, "tickets").await;
    }

    // H leaves, and its pass from before the loss is replayed: the
    // tombstone says it left. (Its fresh pass from after the loss works
    // until half its life, like any pass given up: DESIGN §2.)
    assert_eq!(h.leave(&room.gate, "tickets").await.status, StatusCode::OK);
    room.replay(
        "the left holder's pass from before the loss",
        &h_pass,
        &mut line,
    )
    .await;
}

#[tokio::test]
async fn replays_after_a_flushall() {
    replays(Loss::Flush(RedisServer::start())).await;
}

#[tokio::test]
async fn replays_after_a_memory_store_restart() {
    replays(Loss::Restart).await;
}

/// A visitor admitted at once and reading the first page when the store is
/// lost keeps the slot: its unconfirmed pass could have been in the store
/// (issued before the loss, less than `confirm_within` ago). One issued at
/// or after the epoch, or whose `confirm_within` had run out, gets a place
/// at the back.
async fn unconfirmed_passes(loss: Loss) {
    let mut room = Room::tuned(loss, |r| r.confirm_within = Duration::from_secs(3)).await;
    let mut v = Visitor::new();
    assert!(v.navigate(&room.url()).await.reached_origin());
    assert!(v.cookie("qg_tickets").unwrap().starts_with("v1.n."));
    let mut w = Visitor::new();
    assert_eq!(w.navigate(&room.url()).await.status, StatusCode::FOUND);
    assert_eq!(room.status(&mut w).await, ("waiting".into(), 1));

    room.lose().await;

    // The waiter's ticket comes back first: the line is not empty.
    assert_eq!(room.status(&mut w).await, ("waiting".into(), 1));
    let a = v.navigate(&room.url()).await;
    assert!(
        a.reached_origin(),
        "a visitor on its first page was sent back in line: {a:?}"
    );
    assert!(
        v.cookie("qg_tickets").unwrap().starts_with("v1.a."),
        "its return confirms the session"
    );
    assert_eq!(room.status(&mut w).await, ("waiting".into(), 1));

    let r = ring("k1");
    let mut line = vec![w];
    let stale = now_ms() - 4_000;
    let too_late = r.sign_at(
        Kind::NewPass,
        "tickets",
        &[50u8; 16],
        stale / 1000 + 2,
        Some(stale),
    );
    room.replay(
        "an unconfirmed pass past confirm_within",
        &too_late,
        &mut line,
    )
    .await;
    let after = now_ms();
    let new = r.sign_at(
        Kind::NewPass,
        "tickets",
        &[51u8; 16],
        after / 1000 + 2,
        Some(after),
    );
    room.replay("an unconfirmed pass issued after the loss", &new, &mut line)
        .await;
    if let Loss::Flush(redis) = &room.loss {
        let epoch_us: u64 = redis.query(&["HGET", "qg:{tickets}:stats", "epoch"]);
        let epoch_ms = epoch_us / 1000;
        let exactly = r.sign_at(
            Kind::NewPass,
            "tickets",
            &[52u8; 16],
            epoch_ms / 1000 + 2,
            Some(epoch_ms),
        );
        room.replay(
            "an unconfirmed pass issued at the epoch's millisecond",
            &exactly,
            &mut line,
        )
        .await;
    }
}

#[tokio::test]
async fn an_unconfirmed_pass_is_restored_after_a_flushall() {
    unconfirmed_passes(Loss::Flush(RedisServer::start())).await;
}

#[tokio::test]
async fn an_unconfirmed_pass_is_restored_after_a_memory_store_restart() {
    unconfirmed_passes(Loss::Restart).await;
}

/// How [`GivenUp`] loses its store.
enum Wipe {
    /// `FLUSHALL` on the Redis two gates share: most places end on one
    /// and are replayed on the other, which learnt of them tick by tick.
    Flush(RedisServer),
    /// The gate (memory store, written to a snapshot) stops and a new one
    /// starts on the same snapshot file.
    Snapshot(tempfile::TempDir),
}

/// Two full routes where places are given up in every way before a store
/// loss: `tickets` (capacity 1, lanes main and vip, exit path
/// `/tickets/done`, the origin ends sessions on `/tickets/end`) and
/// `metered` (capacity 1, five requests a session).
struct GivenUp {
    config: Config,
    /// Where places are taken, left and replayed (`None` only while a
    /// memory gate restarts).
    gate: Option<Gate>,
    /// Where the sessions of other visitors end (the same gate on the
    /// memory store).
    other: Option<Gate>,
    wipe: Wipe,
    hits: Arc<AtomicUsize>,
    _origin: Origin,
}

/// An origin that counts its requests and ends the session of any request
/// whose path ends in `/end`.
async fn ending_origin() -> (Origin, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let origin = spawn_origin(move |req: http::Request<hyper::body::Incoming>| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            let mut resp = http::Response::new(full("origin"));
            if req.uri().path().ends_with("/end") {
                resp.headers_mut()
                    .insert("queuegate-command", "end-session".parse().unwrap());
            }
            resp
        }
    })
    .await;
    (origin, hits)
}

impl GivenUp {
    async fn new(wipe: Wipe) -> GivenUp {
        let (origin, hits) = ending_origin().await;
        let mut config = proxy_config(&origin.url());
        match &wipe {
            Wipe::Flush(redis) => {
                config.store.backend = Backend::Redis;
                config.store.redis = redis.config(Duration::from_secs(2));
            }
            Wipe::Snapshot(dir) => {
                config.store.memory.snapshot = Some(dir.path().join("line.json"));
            }
        }
        let timed = |mut r: queuegate::config::Route| {
            // The hold after a loss (one pass_ttl) outlasts the replays.
            r.pass_ttl = Duration::from_secs(4);
            r.confirm_within = Duration::from_secs(5);
            r
        };
        let mut tickets = timed(route("tickets", "/tickets", 1));
        tickets.exit_paths = vec!["/tickets/done".into()];
        tickets.lanes = queuegate::config::Lanes::new(vec![
            queuegate::config::Lane::main(),
            queuegate::config::Lane {
                name: "vip".into(),
                weight: 1,
            },
        ])
        .expect("valid lanes");
        let mut metered = timed(route("metered", "/metered", 1));
        metered.max_requests_per_session = Some(5);
        config.routes = vec![tickets, metered];
        let gate = spawn_gate_with(config.clone(), ring("k1")).await;
        let other = match &wipe {
            Wipe::Flush(_) => Some(spawn_gate_with(config.clone(), ring("k1")).await),
            Wipe::Snapshot(_) => None,
        };
        GivenUp {
            config,
            gate: Some(gate),
            other,
            wipe,
            hits,
            _origin: origin,
        }
    }

    fn gate(&self) -> &Gate {
        self.gate.as_ref().expect("the gate runs")
    }

    fn other(&self) -> &Gate {
        self.other.as_ref().unwrap_or(self.gate())
    }

    fn url(&self, path: &str) -> String {
        self.gate().url(path)
    }

    async fn lose(&mut self) {
        match &self.wipe {
            Wipe::Flush(redis) => {
                let _: () = redis.query(&["FLUSHALL"]);
            }
            Wipe::Snapshot(_) => {
                // A graceful stop writes the snapshot the next start reads.
                self.gate.take().unwrap().stop().await.unwrap();
                self.gate = Some(spawn_gate_with(self.config.clone(), ring("k1")).await);
            }
        }
    }

    /// `v`'s state, position and lane on `route`'s status endpoint.
    async fn status(&self, v: &mut Visitor, route: &str) -> (String, u64, String) {
        let s = v.status(self.gate(), route).await;
        (
            s["state"].as_str().unwrap().to_owned(),
            s["position"].as_u64().unwrap_or(0),
            s["lane"].as_str().unwrap_or_default().to_owned(),
        )
    }

    /// A visitor admitted at once to `path` on `gate`, who comes back (a
    /// confirmed pass), and its pass.
    async fn confirmed(&self, gate: &Gate, path: &str, cookie: &str) -> (Visitor, String) {
        let mut v = Visitor::new();
        assert!(v.navigate(&gate.url(path)).await.reached_origin(), "{path}");
        assert!(v.navigate(&gate.url(path)).await.reached_origin(), "{path}");
        let pass = v.cookie(cookie).unwrap().to_owned();
        assert!(pass.starts_with("v1.a."), "{pass}");
        (v, pass)
    }

    /// Replays `cookie` on `path` as a fresh client (the route full): what
    /// went wrong, if it got more than a new place at the back.
    async fn replayed(&self, what: &str, path: &str, name: &str, cookie: &str) -> Option<String> {
        let mut v = Visitor::new();
        v.jar.insert(name.into(), cookie.into());
        let before = self.hits.load(Ordering::SeqCst);
        let a = v.fetch(&self.url(path)).await;
        if a.reached_origin() || self.hits.load(Ordering::SeqCst) != before {
            return Some(format!("{what}: {} and forwarded", a.status));
        }
        if v.cookie(name) == Some(cookie) {
            return Some(format!("{what}: its cookie kept ({})", a.status));
        }
        None
    }
}

/// Waits until `v`, in line on `route`, is admitted, then comes in.
async fn comes_in(room: &GivenUp, v: &mut Visitor, route: &str) {
    for _ in 0..500 {
        if room.status(v, route).await.0 == "admitted" {
            assert!(v
                .navigate(&room.url(&format!("/{route}")))
                .await
                .reached_origin());
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never admitted to {route}");
}

async fn given_up_stays_given_up(wipe: Wipe) {
    let mut room = GivenUp::new(wipe).await;
    let other = room.other();

    // Sessions ended by the origin, by an exit path and by their last
    // allowed request, one after the other in the one slot.
    let (mut e, e_pass) = room.confirmed(other, "/tickets", "qg_tickets").await;
    assert!(e
        .navigate(&other.url("/tickets/end"))
        .await
        .reached_origin());
    let (mut x, x_pass) = room.confirmed(other, "/tickets", "qg_tickets").await;
    assert!(x
        .navigate(&other.url("/tickets/done"))
        .await
        .reached_origin());
    let (mut u, u_pass) = room.confirmed(other, "/metered", "qg_metered").await;
    for _ in 0..3 {
        assert!(u.navigate(&other.url("/metered")).await.reached_origin());
    }
    assert_eq!(
        u.cookie("qg_metered"),
        None,
        "the fifth request was the last"
    );
    // M holds the metered slot through the loss.
    let (mut m, _) = room.confirmed(other, "/metered", "qg_metered").await;

    // A leaves and W, who waited, takes the slot and keeps it.
    let (mut a, a_pass) = room.confirmed(other, "/tickets", "qg_tickets").await;
    let mut w = Visitor::new();
    assert_eq!(
        w.navigate(&room.url("/tickets")).await.status,
        StatusCode::FOUND
    );
    assert_eq!(room.status(&mut w, "tickets").await.1, 1);
    assert_eq!(a.leave(other, "tickets").await.status, StatusCode::OK);
    comes_in(&room, &mut w, "tickets").await;

    // T1 and T2 wait; T1 leaves.
    let mut t1 = Visitor::new();
    let mut t2 = Visitor::new();
    for (i, t) in [&mut t1, &mut t2].into_iter().enumerate() {
        assert_eq!(
            t.navigate(&room.url("/tickets")).await.status,
            StatusCode::FOUND
        );
        assert_eq!(room.status(t, "tickets").await.1, i as u64 + 1);
    }
    let t1_ticket = t1.cookie("qg_tickets").unwrap().to_owned();
    assert_eq!(
        t1.leave(room.gate(), "tickets").await.status,
        StatusCode::OK
    );
    assert_eq!(room.status(&mut t2, "tickets").await.1, 1);

    // An invite for two visitors is used up.
    let vip = queuegate::lane_grant::Lane::new("vip").unwrap();
    let expires = now_ms() / 1000 + 600;
    let token = queuegate::lane_grant::sign_invite(&ring("k1"), "tickets", &vip, expires, 2);
    let invited = format!("/tickets?qg_invite={token}");
    let mut vips = [Visitor::new(), Visitor::new()];
    for (i, v) in vips.iter_mut().enumerate() {
        assert_eq!(
            v.fetch(&room.url(&invited)).await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            room.status(v, "tickets").await,
            ("waiting".into(), i as u64 + 1, "vip".into())
        );
    }

    // Every pass given up is past half its life: it goes to the store.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert!(w.navigate(&room.url("/tickets")).await.reached_origin());
    assert!(m.navigate(&room.url("/metered")).await.reached_origin());

    room.lose().await;

    // Live sessions and waiters keep their places.
    assert!(
        w.navigate(&room.url("/tickets")).await.reached_origin(),
        "W lost its slot"
    );
    assert!(
        m.navigate(&room.url("/metered")).await.reached_origin(),
        "M lost its slot"
    );
    assert_eq!(
        room.status(&mut t2, "tickets").await,
        ("waiting".into(), 1, "main".into())
    );
    for (i, v) in vips.iter_mut().enumerate() {
        assert_eq!(
            room.status(v, "tickets").await,
            ("waiting".into(), i as u64 + 1, "vip".into()),
            "invited {i}"
        );
    }

    // Nothing given up comes back.
    let mut wrong = Vec::new();
    for (what, path, name, cookie) in [
        (
            "the pass of a session that left",
            "/tickets",
            "qg_tickets",
            &a_pass,
        ),
        (
            "the pass of a session the origin ended",
            "/tickets",
            "qg_tickets",
            &e_pass,
        ),
        (
            "the pass of a session ended on an exit path",
            "/tickets",
            "qg_tickets",
            &x_pass,
        ),
        (
            "a pass whose requests were used up",
            "/metered",
            "qg_metered",
            &u_pass,
        ),
    ] {
        wrong.extend(room.replayed(what, path, name, cookie).await);
    }
    let mut back = Visitor::new();
    back.jar.insert("qg_tickets".into(), t1_ticket.clone());
    back.fetch(&room.url("/tickets")).await;
    let (state, position, _) = room.status(&mut back, "tickets").await;
    if back.cookie("qg_tickets") == Some(t1_ticket.as_str()) || position < 2 {
        wrong.push(format!("a ticket that left: {state} at {position}"));
    }
    let mut late = Visitor::new();
    late.fetch(&room.url(&invited)).await;
    let lane = room.status(&mut late, "tickets").await.2;
    if lane != "main" {
        wrong.push(format!(
            "a used-up invite put a third visitor in lane {lane}"
        ));
    }
    assert!(wrong.is_empty(), "given up, yet back: {wrong:#?}");

    // W still holds the slot, T2 is still first.
    assert!(w.navigate(&room.url("/tickets")).await.reached_origin());
    assert_eq!(
        room.status(&mut t2, "tickets").await,
        ("waiting".into(), 1, "main".into())
    );
}

#[tokio::test]
async fn places_given_up_stay_given_up_after_a_flushall() {
    given_up_stays_given_up(Wipe::Flush(RedisServer::start())).await;
}

#[tokio::test]
async fn places_given_up_stay_given_up_across_a_restart_on_a_snapshot() {
    given_up_stays_given_up(Wipe::Snapshot(tempfile::tempdir().unwrap())).await;
}
