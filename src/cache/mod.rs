//! The micro-cache (DESIGN §9.3): a route's (or a bypass rule's) cacheable
//! answers kept in memory for a short time, so that the origin answers each
//! page about once per `ttl` however many admitted visitors ask for it.
//!
//! - [`Caches`]: every cache of the process, by name (the route's, or the
//!   bypass rule's as written), kept across config reloads, and the
//!   process's byte budget (`limits.cache_bytes`) they share.
//! - [`Scope`]: one cache: its entries (a moka cache bounded by
//!   `max_entries`, each entry expiring when its answer stops being fresh,
//!   never later for being read), the `Vary` names last seen per base key,
//!   and the flights in progress (`flight`).
//! - `key`: what an answer is kept under; `rules`: what may be kept and
//!   for how long; `stored`: a kept answer, its share of the budget, and
//!   reading a body for keeping.
//!
//! It does not decide who may see a page: the gate does, before this. It
//! does not talk to the origin either: the request's road does, and hands
//! the answer here.

mod flight;
mod key;
mod rules;
mod stored;

pub use flight::{Follow, Landing, Lead};
pub use key::{Base, Key};
pub use rules::{keep, Ask, Keep};
pub use stored::{read_body, Budget, Read, Stored};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::message::AnswerHead;
use bytes::Bytes;
use http::header::HeaderName;
use moka::sync::Cache;
use moka::Expiry;

use crate::config::CacheConfig;
use crate::fields::Headers;
use crate::metrics::{CacheCounts, CacheResult, Counted, Metrics};

use flight::Flights;

/// Every cache of the process, and the byte budget they share.
pub struct Caches {
    budget: Arc<Budget>,
    scopes: Mutex<HashMap<String, Arc<Scope>>>,
}

impl Caches {
    /// No cache yet; `limit` bytes for all of them (`limits.cache_bytes`),
    /// what they hold exported through `metrics`.
    pub fn new(limit: u64, metrics: &Metrics) -> Caches {
        Caches {
            budget: Budget::new(limit, metrics.cache_bytes()),
            scopes: Mutex::default(),
        }
    }

    /// The cache named `name` set as `cfg` says: the one kept so far, its
    /// entries with it, when its `max_entries` is unchanged (a new `ttl` or
    /// `max_body` applies to answers kept from now on), else a new one.
    pub fn scope(&self, name: &str, cfg: &CacheConfig, metrics: &Metrics) -> Arc<Scope> {
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(scope) = scopes.get(name) {
            if scope.max_entries == cfg.max_entries {
                scope.set(cfg);
                return scope.clone();
            }
            scope.clear();
        }
        let scope = Arc::new(Scope::new(name, cfg, self.budget.clone(), metrics));
        scopes.insert(name.to_owned(), scope.clone());
        scope
    }

    /// Drops every cache not named in `names`, and its entries with it (a
    /// route whose cache was taken out of the config, or that is gone).
    pub fn retain(&self, names: &[&str], metrics: &Metrics) {
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        scopes.retain(|name, scope| {
            let kept = names.contains(&name.as_str());
            if !kept {
                scope.clear();
                metrics.forget_cache(name);
                tracing::info!(cache = %name, "cache removed: its entries are dropped");
            }
            kept
        });
    }

    /// Removes the entries that expired from every cache, handing their
    /// bytes back to the budget (moka otherwise removes them as it is
    /// used, and an idle cache would hold them).
    pub fn sweep(&self) {
        let scopes: Vec<Arc<Scope>> = self
            .scopes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        for scope in scopes {
            scope.entries.run_pending_tasks();
            scope.varies.run_pending_tasks();
            scope.passes.run_pending_tasks();
        }
    }

    /// Bytes the caches hold now.
    pub fn used(&self) -> u64 {
        self.budget.used()
    }
}

/// Sweeps `caches` (see [`Caches::sweep`]) every second until `stop`.
pub async fn sweep_every_second(caches: Arc<Caches>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => caches.sweep(),
            _ = stop.wait_for(|stop| *stop) => return,
        }
    }
}

/// What a cache holds for a request.
#[derive(Debug)]
pub enum Found {
    /// A fresh answer.
    Hit(Arc<Stored>),
    /// Nothing: the caller asks the origin for everyone.
    Lead(Lead),
    /// Another request is asking the origin: wait for its answer.
    Follow(Follow),
    /// Nothing, and the caller asks the origin for itself only: a `HEAD`,
    /// a request with `Authorization`, or one for a page whose last answer
    /// could not be kept.
    Pass,
}

/// One cache: a route's, or a bypass rule's.
pub struct Scope {
    name: String,
    entries: Cache<Key, Arc<Stored>>,
    /// The `Vary` names of the answers last kept for a base key, while one
    /// of them is fresh.
    varies: Cache<Base, Arc<Varies>>,
    /// Keys whose last answer could not be kept, for the cache's `ttl`
    /// from then: their requests go to the origin each for itself, at
    /// once, rather than one flight after another (Varnish's
    /// "hit-for-pass").
    passes: Cache<Key, Arc<Unkept>>,
    flights: Arc<Flights>,
    ttl_us: AtomicU64,
    max_body: AtomicU64,
    max_entries: u64,
    budget: Arc<Budget>,
    counts: CacheCounts,
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("name", &self.name)
            .field("ttl", &self.ttl())
            .field("max_body", &self.max_body())
            .field("max_entries", &self.max_entries)
            .finish_non_exhaustive()
    }
}

/// The `Vary` names of a base key, until when they hold.
#[derive(Debug)]
struct Varies {
    names: Arc<[HeaderName]>,
    expires: Instant,
}

/// A key whose last answer could not be kept, until when that holds.
#[derive(Debug)]
struct Unkept {
    until: Instant,
}

/// An entry expires when its answer stops being fresh: set when it is
/// written, never moved by reads (DESIGN §9.3).
struct UntilStale;

trait Expires {
    fn expires(&self) -> Instant;
}

impl Expires for Stored {
    fn expires(&self) -> Instant {
        Stored::expires(self)
    }
}

impl Expires for Varies {
    fn expires(&self) -> Instant {
        self.expires
    }
}

impl Expires for Unkept {
    fn expires(&self) -> Instant {
        self.until
    }
}

impl<K, V: Expires> Expiry<K, Arc<V>> for UntilStale {
    fn expire_after_create(&self, _: &K, value: &Arc<V>, created_at: Instant) -> Option<Duration> {
        Some(value.expires().saturating_duration_since(created_at))
    }

    fn expire_after_update(
        &self,
        _: &K,
        value: &Arc<V>,
        updated_at: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.expires().saturating_duration_since(updated_at))
    }
}

impl Scope {
    fn new(name: &str, cfg: &CacheConfig, budget: Arc<Budget>, metrics: &Metrics) -> Scope {
        let scope = Scope {
            name: name.to_owned(),
            entries: Cache::builder()
                .name(name)
                .max_capacity(cfg.max_entries)
                .expire_after(UntilStale)
                .build(),
            varies: Cache::builder()
                .max_capacity(cfg.max_entries)
                .expire_after(UntilStale)
                .build(),
            passes: Cache::builder()
                .max_capacity(cfg.max_entries)
                .expire_after(UntilStale)
                .build(),
            flights: Arc::default(),
            ttl_us: AtomicU64::new(0),
            max_body: AtomicU64::new(0),
            max_entries: cfg.max_entries,
            budget,
            counts: metrics.cache(name),
        };
        scope.set(cfg);
        scope
    }

    fn set(&self, cfg: &CacheConfig) {
        let ttl_us = u64::try_from(cfg.ttl.as_micros()).unwrap_or(u64::MAX);
        self.ttl_us.store(ttl_us, Ordering::Relaxed);
        self.max_body.store(cfg.max_body, Ordering::Relaxed);
    }

    /// Empties it; nothing is kept in it any more once it is dropped.
    fn clear(&self) {
        self.entries.invalidate_all();
        self.varies.invalidate_all();
        self.passes.invalidate_all();
    }

    /// Its name: the route's, or `bypass:` and the bypass rule.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `ttl` answers are kept for from now on.
    pub fn ttl(&self) -> Duration {
        Duration::from_micros(self.ttl_us.load(Ordering::Relaxed))
    }

    /// The largest body kept from now on.
    pub fn max_body(&self) -> u64 {
        self.max_body.load(Ordering::Relaxed)
    }

    /// Counts a request in `queuegate_cache_total`.
    pub fn count(&self, result: CacheResult) {
        self.counts.count(result);
    }

    /// What it holds for a request that asks `ask` of base key `base` with
    /// `headers` (as the origin would get them) at `now`, and the key it
    /// looked under (the `Vary` names last seen for the base).
    pub fn lookup(&self, ask: &Ask, base: &Base, headers: &impl Headers, now: Instant) -> Found {
        let key = match self.varies.get(base) {
            Some(varies) => base.key(&varies.names, headers),
            None => base.key(&[], headers),
        };
        let served = ask.may_be_served();
        if served {
            if let Some(hit) = self.fresh(&key, now) {
                return Found::Hit(hit);
            }
        }
        if ask.authorized
            || self
                .passes
                .get(&key)
                .is_some_and(|unkept| now < unkept.until)
        {
            return Found::Pass;
        }
        let lead = || ask.may_fill() && (ask.refresh || self.fresh(&key, now).is_none());
        match self.flights.join(&key, lead) {
            Some(Ok(lead)) => Found::Lead(lead),
            Some(Err(follow)) => Found::Follow(follow),
            None => match self.fresh(&key, now).filter(|_| served) {
                Some(hit) => Found::Hit(hit),
                None => Found::Pass,
            },
        }
    }

    fn fresh(&self, key: &Key, now: Instant) -> Option<Arc<Stored>> {
        self.entries.get(key).filter(|s| s.is_fresh(now))
    }

    /// Keeps the answer made of `parts` and `body`, received at `received`
    /// for a request of base key `base` with `headers`, as `keep` says: the
    /// answer to serve, kept if it fits the budget and is fresh yet.
    pub fn keep(
        &self,
        base: &Base,
        headers: &impl Headers,
        (parts, body): (AnswerHead, Bytes),
        keep: Keep,
        received: Instant,
    ) -> Arc<Stored> {
        let key = base.key(&keep.vary, headers);
        let stored = Arc::new(Stored::new(
            parts,
            body,
            key.clone(),
            keep,
            received,
            &self.budget,
        ));
        if !stored.is_charged() {
            tracing::debug!(cache = %self.name, "cache full: an answer is served, not kept");
            return stored;
        }
        if !stored.is_fresh(Instant::now()) {
            return stored;
        }
        let varies = (!stored.vary.is_empty()).then(|| Varies {
            names: stored.vary.clone(),
            expires: stored.expires(),
        });
        match varies {
            Some(varies) => self.varies.insert(base.clone(), Arc::new(varies)),
            None if self.varies.contains_key(base) => self.varies.invalidate(base),
            None => {}
        }
        if self.passes.contains_key(&key) {
            self.passes.invalidate(&key);
        }
        self.entries.insert(key, stored.clone());
        stored
    }

    /// Remembers that the answer fetched for `key` could not be kept (see
    /// `passes`), for the cache's `ttl`.
    pub fn unkept(&self, key: &Key) {
        let until = Instant::now() + self.ttl();
        self.passes.insert(key.clone(), Arc::new(Unkept { until }));
    }

    /// Counts a request waiting for another's fetch until the guard is
    /// dropped (`queuegate_cache_waiting`).
    pub fn waiting(&self) -> Counted {
        self.counts.waiting()
    }

    /// Entries held, once moka has caught up with what was written.
    pub fn len(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.entry_count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Flights open now.
    pub fn flights(&self) -> usize {
        self.flights.open()
    }
}
