//! A kept answer ([`Stored`]): the origin's status, headers and whole body
//! in memory, until when it is fresh, and its share of the process's
//! budget ([`Budget`], `limits.cache_bytes`), given back when the last
//! copy of it is dropped. Reading an origin's body up to `max_body` before
//! keeping it ([`read_body`]).

use std::collections::VecDeque;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::fields::Fields;
use crate::message::AnswerHead;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::StatusCode;
use http_body::Frame;
use http_body_util::BodyExt;
use prometheus_client::metrics::gauge::Gauge;

use super::key::Key;
use super::rules::Keep;
use crate::message::Answer;
use crate::response::{self, Body};

/// What an entry costs beyond its key, head and body: moka's node, the
/// `Arc`s, the header map's table.
const ENTRY_OVERHEAD: u64 = 512;

/// The bytes every cache of the process may hold together, and what they
/// hold now (exported as `queuegate_cache_bytes`).
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    used: Gauge<i64, AtomicI64>,
}

impl Budget {
    pub fn new(limit: u64, used: Gauge<i64, AtomicI64>) -> Arc<Budget> {
        used.set(0);
        Arc::new(Budget { limit, used })
    }

    /// Takes `bytes` of the budget, or nothing when they would go over it.
    fn charge(self: &Arc<Budget>, bytes: u64) -> Option<Charge> {
        let bytes_i = i64::try_from(bytes).ok()?;
        let limit = i64::try_from(self.limit).unwrap_or(i64::MAX);
        let before = self.used.inc_by(bytes_i);
        if before.saturating_add(bytes_i) > limit {
            self.used.dec_by(bytes_i);
            return None;
        }
        Some(Charge {
            budget: self.clone(),
            bytes: bytes_i,
        })
    }

    /// The bytes held now.
    pub fn used(&self) -> u64 {
        u64::try_from(self.used.get()).unwrap_or(0)
    }
}

/// A share of the budget, given back when dropped.
#[derive(Debug)]
struct Charge {
    budget: Arc<Budget>,
    bytes: i64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.used.dec_by(self.bytes);
    }
}

/// One kept answer.
#[derive(Debug)]
pub struct Stored {
    status: StatusCode,
    /// As the origin sent them, without `Age` (set when served) and with
    /// the body's `Content-Length`.
    headers: Fields,
    body: Bytes,
    /// Where it is kept: its base under its own `Vary`.
    pub key: Key,
    /// The header names its `Vary` lists.
    pub vary: Arc<[HeaderName]>,
    received: Instant,
    expires: Instant,
    /// The `Age` it came with.
    age: u64,
    /// Its share of the budget; `None` when it did not fit (then it is
    /// handed to the requests that waited for it, and not kept).
    charge: Option<Charge>,
}

impl Stored {
    /// The answer made of `parts` and `body`, received at `received`, kept
    /// as `keep` says under `key`; charged to `budget` if it fits.
    pub fn new(
        parts: AnswerHead,
        body: Bytes,
        key: Key,
        keep: Keep,
        received: Instant,
        budget: &Arc<Budget>,
    ) -> Stored {
        let mut headers = parts.fields;
        headers.remove(header::AGE);
        let bodiless = parts.status == StatusCode::NO_CONTENT;
        if bodiless {
            headers.remove(header::CONTENT_LENGTH);
        } else {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        let head: usize = headers
            .iter()
            .map(|(name, value)| name.len() + value.len() + 32)
            .sum();
        let weight = ENTRY_OVERHEAD + (head + body.len() + key.len()) as u64;
        Stored {
            status: parts.status,
            headers,
            body,
            key,
            vary: keep.vary,
            received,
            expires: received + keep.fresh_for,
            age: keep.age,
            charge: budget.charge(weight),
        }
    }

    /// Whether it took its share of the budget (and may be kept).
    pub fn is_charged(&self) -> bool {
        self.charge.is_some()
    }

    /// When it stops being served.
    pub fn expires(&self) -> Instant {
        self.expires
    }

    /// Whether it is still served at `now`.
    pub fn is_fresh(&self, now: Instant) -> bool {
        now < self.expires
    }

    /// The answer to serve at `now`, without its body for a `HEAD`, with
    /// `Age` when served from the cache (always, when the origin's answer
    /// came with one).
    pub fn answer(&self, head: bool, now: Instant, from_cache: bool) -> Answer<Body> {
        let age = self.age + now.saturating_duration_since(self.received).as_secs();
        let age = (from_cache || self.age > 0).then_some(age);
        let body = (!head).then(|| self.body.clone());
        response::from_cache(self.status, self.headers.clone(), body, age)
    }

    /// How long it stays fresh after `at`.
    pub fn fresh_after(&self, at: Instant) -> Duration {
        self.expires.saturating_duration_since(at)
    }
}

/// An origin's body read for keeping. When it is not kept, the answer
/// goes on with what was read put back in front of the rest.
pub enum Read {
    /// All of it, within the limit and without trailers.
    Whole(AnswerHead, Bytes),
    /// Over the limit, or with trailers: as it will be next time.
    Unkept(Answer<Body>),
    /// Cut short by the origin.
    Failed(Answer<Body>),
}

/// Reads `resp`'s body while it stays within `max` bytes. A
/// `Content-Length` over `max` is streamed at once, unread.
pub async fn read_body(resp: Answer<Body>, max: u64) -> Read {
    let declared = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max) {
        return Read::Unkept(resp);
    }
    let (parts, mut body) = resp.into_parts();
    let mut read: VecDeque<Frame<Bytes>> = VecDeque::new();
    let mut len: u64 = 0;
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                let data = frame.data_ref().map(|d| d.len() as u64);
                read.push_back(frame);
                match data {
                    Some(n) => {
                        len = len.saturating_add(n);
                        if len > max {
                            let resumed = Body::resumed(read, None, body);
                            return Read::Unkept(Answer::from_parts(parts, resumed));
                        }
                    }
                    // Trailers: kept answers have none.
                    None => {
                        let resumed = Body::resumed(read, None, body);
                        return Read::Unkept(Answer::from_parts(parts, resumed));
                    }
                }
            }
            Some(Err(err)) => {
                let resumed = Body::resumed(read, Some(err), Body::Empty);
                return Read::Failed(Answer::from_parts(parts, resumed));
            }
        }
    }
    let mut chunks = read.into_iter().filter_map(|f| f.into_data().ok());
    let whole = match (chunks.next(), chunks.next()) {
        (None, _) => Bytes::new(),
        (Some(only), None) => only,
        (Some(first), Some(second)) => {
            let mut all = BytesMut::with_capacity(len as usize);
            all.extend_from_slice(&first);
            all.extend_from_slice(&second);
            for chunk in chunks {
                all.extend_from_slice(&chunk);
            }
            all.freeze()
        }
    };
    Read::Whole(parts, whole)
}
