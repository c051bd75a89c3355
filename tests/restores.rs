//! Replays after a store loss, a Redis FLUSHALL and a restart of a gate on
//! the memory store (same key ring): what the store could not have held at
//! the loss (a session idle past `session_ttl`, a ticket silent past
//! `abandon_after`, a pass whose holder left, a pass issued at or after the
//! new epoch) never gets a slot nor a place ahead of those in line; a live
//! session and a live ticket are restored.

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
