//! The memory store written to a file and read back (`store.memory.snapshot`),
//! so that a restart of a single instance keeps its line: each route's
//! epoch, waiters (lane, join score, last poll, confirmed), sessions (expiry
//! and kind), tombstones, request counts and invite uses, its hold, its
//! numbers and its runtime override. Per-client memories and the tick window are not kept: they
//! start again empty, as after a client's silence.
//!
//! The file is JSON (`serde_json`, already a dependency), one object per
//! route, ids and tokens in base64url; about 65 bytes per waiter and 45 per
//! session, so some 0.7 MB for 10,000 waiters. It is written whole to
//! `<file>.tmp` in the same directory, synced, and renamed over the file
//! (the directory synced after), so a reader finds the old snapshot or the
//! new one, never a part. Written at most once a second and once more on a
//! graceful stop, after the last request was answered: a graceful restart
//! loses nothing, a crash at most the last second (an admission or a leave
//! in it, which the restore rules then treat as after a store loss within
//! the same epoch: a ticket joined in it is restored as a lost write, a
//! session admitted in it is not).

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::sync::watch;

use super::{AdmitRate, MemoryStore, Route, SessionKind};
use crate::clock::Clock;
use crate::queue::{Override, VisitorId};

/// The format written; a file of another version is not read.
const VERSION: u32 = 1;

/// How often the snapshot is written while queuegate runs.
pub const EVERY: Duration = Duration::from_secs(1);

/// Why a snapshot could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("cannot read the snapshot {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the snapshot {} is not one queuegate wrote: {source}", path.display())]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the snapshot {} has format version {found}; this queuegate reads {VERSION}", path.display())]
    Version { path: PathBuf, found: u32 },
    #[error("cannot write the snapshot {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The whole store as written.
#[derive(Serialize, Deserialize)]
pub struct Snapshot {
    version: u32,
    routes: BTreeMap<String, RouteImage>,
}

/// One route as written. Times as the store keeps them: scores, epoch and
/// hold in µs, polls, expiries and tombstones in ms, invite expiries in s.
#[derive(Serialize, Deserialize)]
struct RouteImage {
    epoch_us: u64,
    last_score_us: u64,
    hold_until_us: u64,
    loss_noticed: bool,
    opened_us: Option<u64>,
    admitted_total: u64,
    /// The admit rate's decayed count and elapsed seconds, when they were
    /// last updated (µs), and the last admission (µs).
    rate: (f64, f64, u64, Option<u64>),
    lanes: Vec<LaneImage>,
    /// (id, expiry ms, kind: `a` arriving, `u` unconfirmed, `l` live).
    sessions: Vec<(Id, u64, char)>,
    /// (id, buried at ms).
    tombstones: Vec<(Id, u64)>,
    /// (id, requests counted, forgotten at ms).
    uses: Vec<(Id, u64, u64)>,
    /// (token, uses counted, expiry unix s).
    invites: Vec<(Token, u32, u64)>,
    /// The route's runtime override, if one is set (absent from files
    /// written before overrides: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    overridden: Option<Override>,
}

#[derive(Serialize, Deserialize)]
struct LaneImage {
    name: String,
    current: i64,
    admitted: u64,
    /// (id, join score µs, last poll ms, confirmed).
    waiting: Vec<(Id, u64, u64, bool)>,
}

impl MemoryStore {
    /// Every route as it is now, each copied under its own lock.
    pub fn snapshot(&self) -> Snapshot {
        let routes: Vec<_> = self
            .inner
            .routes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(name, route)| (name.clone(), route.clone()))
            .collect();
        let routes = routes
            .into_iter()
            .map(|(name, route)| {
                let route = route
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                (name, RouteImage::of(&route))
            })
            .collect();
        Snapshot {
            version: VERSION,
            routes,
        }
    }

    /// A store holding what `snapshot` holds, reading time from `clock`.
    pub fn from_snapshot(clock: Clock, snapshot: Snapshot) -> MemoryStore {
        let store = MemoryStore::new(clock);
        {
            let mut routes = store
                .inner
                .routes
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for (name, image) in snapshot.routes {
                routes.insert(
                    name,
                    std::sync::Arc::new(std::sync::Mutex::new(image.into_route())),
                );
            }
        }
        store
    }

    /// The store `path` holds, or an empty one when there is no such file
    /// (a first start). A file that cannot be read, or that is not a
    /// snapshot of this version, is an error: starting empty would send
    /// everyone in it to the back of the line unnoticed.
    pub fn open_snapshot(clock: Clock, path: &Path) -> Result<MemoryStore, SnapshotError> {
        let text = match std::fs::read(path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Ok(MemoryStore::new(clock));
            }
            Err(source) => {
                return Err(SnapshotError::Read {
                    path: path.to_owned(),
                    source,
                })
            }
        };
        let snapshot = read(&text, path)?;
        Ok(MemoryStore::from_snapshot(clock, snapshot))
    }

    /// Writes the store to `path` now (see the module doc).
    pub fn write_snapshot(&self, path: &Path) -> Result<(), SnapshotError> {
        write(&self.snapshot(), path)
    }
}

fn read(text: &[u8], path: &Path) -> Result<Snapshot, SnapshotError> {
    #[derive(Deserialize)]
    struct Versioned {
        version: u32,
    }
    let corrupt = |source| SnapshotError::Corrupt {
        path: path.to_owned(),
        source,
    };
    let Versioned { version } = serde_json::from_slice(text).map_err(corrupt)?;
    if version != VERSION {
        return Err(SnapshotError::Version {
            path: path.to_owned(),
            found: version,
        });
    }
    serde_json::from_slice(text).map_err(corrupt)
}

/// Writes `snapshot` to `path` through a synced temporary file renamed over it.
fn write(snapshot: &Snapshot, path: &Path) -> Result<(), SnapshotError> {
    let failed = |source| SnapshotError::Write {
        path: path.to_owned(),
        source,
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(failed)?);
    serde_json::to_writer(&mut file, snapshot).map_err(|e| failed(e.into()))?;
    file.flush().map_err(failed)?;
    let file = file.into_inner().map_err(|e| failed(e.into_error()))?;
    file.sync_all().map_err(failed)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(failed)?;
    // The rename itself is made durable by syncing the directory.
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(failed)
}

/// Writes `store` to `path` every [`EVERY`] until `stop` changes. A failed
/// write is logged and tried again at the next one. The last write, once
/// everything else has stopped, is [`write_last`]'s.
pub async fn keep(store: MemoryStore, path: PathBuf, mut stop: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.changed() => return,
        }
        if let Err(err) = write_off_thread(&store, &path).await {
            tracing::warn!(error = %err, "memory store snapshot not written");
        }
    }
}

/// Writes `store` to `path` once more, on a graceful stop.
pub async fn write_last(store: &MemoryStore, path: &Path) {
    match write_off_thread(store, path).await {
        Ok(()) => tracing::info!(path = %path.display(), "memory store written to its snapshot"),
        Err(err) => tracing::error!(error = %err, "memory store snapshot not written at stop"),
    }
}

/// [`MemoryStore::write_snapshot`] on a blocking thread.
async fn write_off_thread(store: &MemoryStore, path: &Path) -> Result<(), SnapshotError> {
    let (store, owned) = (store.clone(), path.to_owned());
    tokio::task::spawn_blocking(move || store.write_snapshot(&owned))
        .await
        .unwrap_or_else(|join| {
            Err(SnapshotError::Write {
                path: path.to_owned(),
                source: std::io::Error::other(join.to_string()),
            })
        })
}

impl RouteImage {
    fn of(route: &Route) -> RouteImage {
        let line = &route.line;
        let mut lanes: Vec<LaneImage> = line
            .lanes
            .iter()
            .map(|lane| LaneImage {
                name: lane.name.clone(),
                current: lane.current,
                admitted: lane.admitted,
                waiting: Vec::with_capacity(lane.order.len()),
            })
            .collect();
        for (id, &(score_us, slot)) in &line.scores {
            let (seen_ms, confirmed) = line.seen.get(id).copied().unwrap_or((0, false));
            if let Some(lane) = lanes.get_mut(slot) {
                lane.waiting.push((Id(*id), score_us, seen_ms, confirmed));
            }
        }
        let sessions = route
            .sessions
            .by_id
            .iter()
            .map(|(id, s)| (Id(*id), s.expiry_ms, s.kind.letter()))
            .collect();
        let rate = &route.rate;
        RouteImage {
            epoch_us: route.epoch_us,
            last_score_us: route.last_score_us,
            hold_until_us: route.hold_until_us,
            loss_noticed: route.loss_noticed,
            opened_us: route.opened_us,
            admitted_total: route.admitted_total,
            rate: (rate.count, rate.elapsed_s, rate.at_us, rate.last_admit_us),
            lanes,
            sessions,
            tombstones: (route.tombstones.by_id.iter())
                .map(|(id, &at)| (Id(*id), at))
                .collect(),
            uses: (route.uses.iter())
                .map(|(id, &(count, forget))| (Id(*id), count, forget))
                .collect(),
            invites: (route.invites.iter())
                .map(|(token, &(count, expires))| (Token(token.clone()), count, expires))
                .collect(),
            overridden: route.overridden.clone(),
        }
    }

    fn into_route(self) -> Route {
        let mut route = Route::new(self.epoch_us, false);
        route.last_score_us = self.last_score_us;
        route.hold_until_us = self.hold_until_us;
        route.loss_noticed = self.loss_noticed;
        route.opened_us = self.opened_us;
        route.admitted_total = self.admitted_total;
        let (count, elapsed_s, at_us, last_admit_us) = self.rate;
        route.rate = AdmitRate {
            count,
            elapsed_s,
            at_us,
            last_admit_us,
        };
        for lane in self.lanes {
            let slot = route.line.slot(&lane.name);
            route.line.lanes[slot].current = lane.current;
            route.line.lanes[slot].admitted = lane.admitted;
            for (Id(id), score_us, seen_ms, confirmed) in lane.waiting {
                route.line.put(id, score_us, slot, seen_ms, confirmed);
            }
        }
        for (Id(id), expiry_ms, kind) in self.sessions {
            route
                .sessions
                .start(id, expiry_ms, SessionKind::from_letter(kind));
        }
        for (Id(id), at_ms) in self.tombstones {
            route.tombstones.bury(id, at_ms);
        }
        route.uses = (self.uses.into_iter())
            .map(|(Id(id), count, forget)| (id, (count, forget)))
            .collect();
        route.invites = (self.invites.into_iter())
            .map(|(Token(token), count, expires)| (token, (count, expires)))
            .collect();
        route.overridden = self.overridden;
        route
    }
}

impl SessionKind {
    fn letter(self) -> char {
        match self {
            SessionKind::Arriving => 'a',
            SessionKind::Unconfirmed => 'u',
            SessionKind::Live => 'l',
        }
    }

    /// The kind `letter` names; an unknown one is taken as arriving, the
    /// kind that asks the most of the visitor (show up, or lose the slot).
    fn from_letter(letter: char) -> SessionKind {
        match letter {
            'u' => SessionKind::Unconfirmed,
            'l' => SessionKind::Live,
            _ => SessionKind::Arriving,
        }
    }
}

/// A visitor id, written as base64url.
struct Id(VisitorId);

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&URL_SAFE_NO_PAD.encode(self.0))
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Id, D::Error> {
        let Token(bytes) = Token::deserialize(d)?;
        let id = VisitorId::try_from(bytes.as_slice())
            .map_err(|_| D::Error::custom(format!("an id of {} bytes, not 16", bytes.len())))?;
        Ok(Id(id))
    }
}

/// Bytes (an invite token's key), written as base64url.
struct Token(Vec<u8>);

impl Serialize for Token {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&URL_SAFE_NO_PAD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Token, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Token;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("base64url without padding")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Token, E> {
                URL_SAFE_NO_PAD.decode(v).map(Token).map_err(E::custom)
            }
        }
        d.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{
        Arrival, Counted, InviteUse, Lane, Lanes, Limits, Poll, QueueStore, TicketTimes,
    };

    fn limits() -> Limits {
        Limits {
            capacity: 2,
            max_admit_per_tick: 10,
            tick: Duration::from_millis(100),
            session_ttl: Duration::from_secs(60),
            pass_ttl: Duration::from_secs(10),
            arrival_grace: Duration::from_secs(60),
            abandon_after: Duration::from_secs(600),
            max_waiting: 100_000,
            confirm_within: Duration::from_secs(60),
            client_places: 0,
            client_joins_per_minute: 0,
            lanes: Lanes::new(vec![
                Lane {
                    name: "main".into(),
                    weight: 1,
                },
                Lane {
                    name: "vip".into(),
                    weight: 2,
                },
            ])
            .unwrap(),
            opens_at_us: None,
            shards: 1,
        }
    }

    fn visitor(n: u32) -> VisitorId {
        let mut id = [7; 16];
        id[..4].copy_from_slice(&n.to_be_bytes());
        id
    }

    /// The store written to JSON and read back, as a restart does.
    fn reread(store: &MemoryStore, clock: Clock) -> (MemoryStore, usize) {
        let text = serde_json::to_vec(&store.snapshot()).unwrap();
        let snapshot = read(&text, Path::new("line.json")).unwrap();
        (MemoryStore::from_snapshot(clock, snapshot), text.len())
    }

    #[tokio::test(start_paused = true)]
    async fn an_override_is_read_back_and_an_old_file_has_none() {
        use crate::queue::{Held, QueueStore as _};
        let clock = Clock::starting_at(Duration::from_secs(1_700_000_000));
        let store = MemoryStore::new(clock);
        let closed = Override {
            mode: Some(Held {
                value: crate::config::Mode::Closed,
                file: crate::config::Mode::Gate,
            }),
            capacity: None,
            by: "ops".to_owned(),
            at_ms: 5,
        };
        store.set_override("r", Some(&closed)).await.unwrap();
        let _ = store.stats("plain", &limits()).await.unwrap();
        let (back, _) = reread(&store, clock);
        assert_eq!(back.override_of("r").await.unwrap(), Some(closed));
        assert_eq!(back.override_of("plain").await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_read_back_holds_what_it_held() {
        let clock = Clock::starting_at(Duration::from_secs(1_700_000_000));
        let (store, l) = (MemoryStore::new(clock), limits());
        let ids: Vec<VisitorId> = (0..7).map(visitor).collect();
        let arrive = |n: usize, lane| store.arrive("r", &ids[n], &[], &l, true, None, lane);
        assert_eq!(arrive(1, 0).await.unwrap(), Arrival::Admitted);
        assert_eq!(arrive(2, 0).await.unwrap(), Arrival::Admitted);
        let mut scores = Vec::new();
        for (n, lane) in [(3, 0), (4, 1), (5, 0), (6, 0)] {
            let Arrival::Waiting(place) = arrive(n, lane).await.unwrap() else {
                panic!("the room is full");
            };
            scores.push((n, place));
        }
        store.leave("r", &visitor(5), &l).await.unwrap();
        assert_eq!(
            store.count_request("r", &visitor(2), 1, &l).await.unwrap(),
            Counted::Last
        );
        assert_eq!(
            store
                .take_use("r", b"token", 1, 1_800_000_000)
                .await
                .unwrap(),
            InviteUse::Last
        );
        let ticket = |place: crate::queue::Place| TicketTimes {
            lane: place.lane,
            ..TicketTimes::new(place.score_us)
        };
        let mut places = Vec::new();
        for &(n, place) in scores.iter().filter(|(n, _)| *n != 5) {
            let polled = store.poll("r", &ids[n], &[], ticket(place), &l).await;
            places.push((n, place, polled.unwrap()));
        }
        let before = store.stats("r", &l).await.unwrap();

        let (back, _) = reread(&store, clock);

        let after = back.stats("r", &l).await.unwrap();
        assert_eq!(
            (
                after.epoch_us,
                after.waiting,
                after.active,
                after.admitted_total
            ),
            (
                before.epoch_us,
                before.waiting,
                before.active,
                before.admitted_total
            )
        );
        for (n, place, was) in places {
            let polled = back.poll("r", &ids[n], &[], ticket(place), &l).await;
            assert_eq!(polled.unwrap(), was, "waiter {n}");
        }
        let left = TicketTimes::new(scores[2].1.score_us);
        assert_eq!(
            back.poll("r", &visitor(5), &[], left, &l).await.unwrap(),
            Poll::Gone,
            "the tombstone was kept"
        );
        assert_eq!(
            back.count_request("r", &visitor(2), 1, &l).await.unwrap(),
            Counted::Exhausted
        );
        assert_eq!(
            back.take_use("r", b"token", 1, 1_800_000_000)
                .await
                .unwrap(),
            InviteUse::Refused
        );
        // Visitor 1 still holds its slot; the next waiter in line gets the
        // one visitor 2 freed.
        tokio::time::advance(l.tick).await;
        let tick = back
            .admit_tick("r", &l, Some(before.epoch_us))
            .await
            .unwrap();
        assert_eq!(tick.admitted_scores.len(), 1);
        assert_eq!(back.stats("r", &l).await.unwrap().active, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn ten_thousand_waiters_take_under_a_megabyte() {
        let clock = Clock::starting_at(Duration::from_secs(1_700_000_000));
        let (store, l) = (MemoryStore::new(clock), limits());
        let mut ids = Vec::new();
        for n in 0..10_002u32 {
            let mut id = [0; 16];
            id[..4].copy_from_slice(&n.to_le_bytes());
            id[4..].copy_from_slice(&rand::random::<[u8; 12]>());
            store
                .arrive("r", &id, &[], &l, true, None, 0)
                .await
                .unwrap();
            ids.push(id);
        }
        let (back, size) = reread(&store, clock);
        assert_eq!(back.stats("r", &l).await.unwrap().waiting, 10_000);
        assert!(size < 1_000_000, "{size} bytes");
    }

    #[test]
    fn a_file_not_written_by_queuegate_is_refused() {
        let at = Path::new("line.json");
        assert!(matches!(read(b"", at), Err(SnapshotError::Corrupt { .. })));
        assert!(matches!(
            read(br#"{"version":1,"routes":{"r":{"epoch_us":-1}}}"#, at),
            Err(SnapshotError::Corrupt { .. })
        ));
        assert!(matches!(
            read(br#"{"version":99,"routes":{}}"#, at),
            Err(SnapshotError::Version { found: 99, .. })
        ));
        let id = r#"{"version":1,"routes":{"r":{"epoch_us":1,"last_score_us":1,"hold_until_us":0,"loss_noticed":false,"opened_us":null,"admitted_total":0,"rate":[0.0,0.0,1,null],"lanes":[],"sessions":[["AAAA",1,"l"]],"tombstones":[],"uses":[],"invites":[]}}}"#;
        assert!(
            matches!(read(id.as_bytes(), at), Err(SnapshotError::Corrupt { .. })),
            "an id of three bytes"
        );
    }
}
