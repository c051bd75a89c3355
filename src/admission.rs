//! Admission values: signing and verifying the waiting tickets and admission
//! passes carried in each route's cookie (DESIGN §2), and loading the key ring
//! that signs them.
//!
//! A value reads `v1.<state>.<route>.<id>.<t>.<kid>.<mac>`, ASCII only:
//!
//! - `state`: `w` for a waiting ticket, `p` for a ticket taken before the
//!   route's opening (a pre-queue ticket, DESIGN §8.7: its holder is told the
//!   opening time without a store call), `a` for an admission pass, `n` for
//!   the pass of a visitor admitted at once who has not come back yet (an
//!   unconfirmed session, DESIGN §8.3), `l` for a pass an instance granted or
//!   renewed while the shared store could not answer (DESIGN §8.3: the store
//!   takes it back on the holder's next request);
//! - `route`: the route name, `[A-Za-z0-9_-]{1,32}` (`config::is_route_name`);
//! - `id`: the visitor's 16 random bytes, base64url without padding (22 chars);
//! - `t`: decimal `u64` without sign or leading zeros; a ticket's join score
//!   (store time, µs) or a pass's expiry (unix seconds); optionally followed
//!   by `-` and a second such number, `at`: for a ticket the last time the
//!   line saw its holder (µs), for a pass when it was issued (unix ms). The
//!   store's restore rules need them; values signed without `at` (older
//!   ones) still verify. A ticket (`w` or `p`) then carries the lane it
//!   waits in (DESIGN §8.5) as `_` and the lane's name (`config::is_lane_name`;
//!   digits and `-` never hold a `_`, so the split is unambiguous); a
//!   ticket without it waits in the route's first lane;
//! - `kid`: the id of the key that signed it, `[A-Za-z0-9_-]{1,16}`
//!   (`config::is_key_id`);
//! - `mac`: base64url without padding (43 chars) of HMAC-SHA256 under that key
//!   over everything before the last `.`.
//!
//! The same ring signs lane grants (`lane_grant`, DESIGN §8.5) through
//! `KeyRing::seal` and `KeyRing::open`; their values start `v1.i.` and
//! `v1.g.`, state letters this module never accepts, so no value of one kind
//! verifies as another.
//!
//! Everything here is a pure function of its arguments except loading keys
//! (environment variables and files) and drawing random ids and keys. This
//! module does not know about cookies' names or attributes, nor about the
//! store: it says whether a value is genuine and what it claims.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE_NO_PAD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use rand::RngCore as _;
use sha2::Sha256;

use crate::config::{
    is_key_id, is_lane_name, is_route_name, KeyFrom, KeySource, MAX_KEY_ID_LEN, MAX_LANE_NAME_LEN,
};

pub use crate::queue::VisitorId;

/// Values longer than this are rejected before any other work.
pub const MAX_VALUE_LEN: usize = 256;

/// Keys shorter than this many bytes are refused.
pub const MIN_KEY_LEN: usize = 32;

/// Length of a key made by [`keygen`], in bytes.
const KEYGEN_LEN: usize = 32;

/// Length of an encoded visitor id: 16 bytes, base64url without padding.
const ID_CHARS: usize = 22;

/// Length of an encoded MAC: 32 bytes, base64url without padding.
const MAC_CHARS: usize = 43;

/// Length of a HMAC-SHA256 tag in bytes.
const MAC_LEN: usize = 32;

/// `u64::MAX` has 20 decimal digits.
const MAX_T_DIGITS: usize = 20;

/// The only version this code signs and accepts.
pub(crate) const VERSION: &str = "v1";

/// Decoder for key material: standard or url-safe alphabet, padding optional.
const KEY_STANDARD: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
const KEY_URL_SAFE: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// What a value stands for: its `state` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `w`: a place in the line; `t` is the join score (store time, µs).
    Ticket,
    /// `p`: a place taken before the route's opening (DESIGN §8.7); `t` is
    /// the join score at arrival, which the opening's shuffle replaces in
    /// the store. Read as a ticket wherever a ticket is.
    PreTicket,
    /// `a`: admission; `t` is the pass's expiry (unix seconds).
    Pass,
    /// `n`: admission at once, not confirmed yet: the visitor's first return
    /// renews it through the store (DESIGN §8.3).
    NewPass,
    /// `l`: admission granted or renewed by an instance on its own while the
    /// shared store could not answer; the next request renews it through
    /// the store, which takes the session back (DESIGN §8.3).
    LocalPass,
}

impl Kind {
    /// Whether the value stands for a place in line (`w` or `p`), not a pass.
    pub fn is_ticket(self) -> bool {
        matches!(self, Kind::Ticket | Kind::PreTicket)
    }

    fn state(self) -> &'static str {
        match self {
            Kind::Ticket => "w",
            Kind::PreTicket => "p",
            Kind::Pass => "a",
            Kind::NewPass => "n",
            Kind::LocalPass => "l",
        }
    }

    fn from_state(state: &str) -> Option<Kind> {
        match state {
            "w" => Some(Kind::Ticket),
            "p" => Some(Kind::PreTicket),
            "a" => Some(Kind::Pass),
            "n" => Some(Kind::NewPass),
            "l" => Some(Kind::LocalPass),
            _ => None,
        }
    }
}

/// What a genuine value says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claims {
    pub kind: Kind,
    pub id: VisitorId,
    /// Join score (µs) for a ticket, expiry (unix seconds) for a pass.
    pub t: u64,
    /// Last seen (µs) for a ticket, issue time (unix ms) for a pass; `None`
    /// in a value signed without it.
    pub at: Option<u64>,
    /// Position in the ring of the key that verified it; 0 is the signing key,
    /// so anything else was signed by a key that is being rotated out.
    pub key_index: usize,
    /// The lane a ticket waits in; `None` for the route's first lane (and
    /// for passes).
    pub lane: Option<LaneTag>,
}

/// A lane's name as a value carries it: inline, so [`Claims`] stays `Copy`
/// and reading a cookie allocates nothing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LaneTag {
    len: u8,
    bytes: [u8; MAX_LANE_NAME_LEN],
}

impl LaneTag {
    /// `name` if it is a lane's name ([`is_lane_name`]).
    pub fn new(name: &str) -> Option<LaneTag> {
        if !is_lane_name(name) {
            return None;
        }
        let mut bytes = [0; MAX_LANE_NAME_LEN];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        Some(LaneTag {
            len: name.len() as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        // Only ever built from a checked ASCII name.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl fmt::Debug for LaneTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Where a pass stands in its life; see [`Claims::pass_life`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassLife {
    /// In the first half of its life: forward without asking the store.
    Fresh,
    /// Past half its life but not expired: renew through the store.
    Aging,
    /// At or past its expiry: renew through the store.
    Expired,
}

impl Claims {
    /// Where a pass expiring at `self.t` stands at `now_unix` (seconds), for a
    /// route whose passes live `pass_ttl`. A pass with more than half of
    /// `pass_ttl` left is fresh. Meaningful for passes only; a ticket's `t` is
    /// not an expiry.
    pub fn pass_life(&self, now_unix: u64, pass_ttl: Duration) -> PassLife {
        if now_unix >= self.t {
            return PassLife::Expired;
        }
        let remaining_ms = u128::from(self.t - now_unix) * 1000;
        if remaining_ms * 2 > pass_ttl.as_millis() {
            PassLife::Fresh
        } else {
            PassLife::Aging
        }
    }
}

/// Why a value was not accepted. Only for tests and debugging: every reason is
/// treated as "no value". The lane values (`lane_grant`) share it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    /// Longer than [`MAX_VALUE_LEN`]; nothing else was looked at.
    Oversize,
    /// Not of the value's form (`v1.<state>.<route>.<id>.<t>.<kid>.<mac>`
    /// for a ticket or pass), or another kind of value.
    Malformed,
    /// A version other than `v1` (`v` followed by digits).
    WrongVersion,
    /// Well formed, but issued for another route.
    WrongRoute,
    /// Signed with a key id that is not in the ring.
    UnknownKid,
    /// The MAC does not match: forged or altered.
    BadMac,
    /// Genuine, but its time is up: only for values whose verification
    /// checks their expiry (invites and lane cookies; a pass's life is
    /// read apart, [`Claims::pass_life`]).
    Expired,
}

/// The outcome of [`KeyRing::verify`]. An invalid value is a verdict, not an
/// error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Valid(Claims),
    Invalid(Reject),
}

/// Why a key ring could not be built. Every message names the key id and,
/// when loading, the environment variable or file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("no keys configured: the key ring needs at least one key")]
    NoKeys,
    #[error("key id {id:?} is invalid: use 1 to {MAX_KEY_ID_LEN} characters of A-Z a-z 0-9 _ -")]
    InvalidId { id: String },
    #[error("key id {id:?} is listed more than once")]
    DuplicateId { id: String },
    #[error("key {id:?} is {len} bytes long; at least {MIN_KEY_LEN} are required")]
    TooShort { id: String, len: usize },
    #[error("key {id:?}: {} {problem}", Origin(.from))]
    Source {
        id: String,
        from: KeyFrom,
        problem: KeyProblem,
    },
}

/// What is wrong with a key's environment variable or file.
#[derive(Debug, thiserror::Error)]
pub enum KeyProblem {
    #[error("is not set")]
    NotSet,
    #[error("is not valid UTF-8")]
    NotUnicode,
    #[error("cannot be read: {0}")]
    Unreadable(#[source] std::io::Error),
    #[error("is empty")]
    Empty,
    #[error("is not base64 (standard or url-safe; `queuegate keygen` makes a key)")]
    NotBase64,
    #[error(
        "holds a {0}-byte key; at least {MIN_KEY_LEN} bytes are required (`queuegate keygen` makes one)"
    )]
    TooShort(usize),
}

/// Names where a key comes from, for messages.
struct Origin<'a>(&'a KeyFrom);

impl fmt::Display for Origin<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            KeyFrom::Env(var) => write!(f, "environment variable {var}"),
            KeyFrom::File(path) => write!(f, "file {}", path.display()),
        }
    }
}

/// One key of the ring, keyed once: signing and verifying clone the keyed
/// state instead of hashing the key again.
#[derive(Clone)]
struct RingKey {
    id: String,
    mac: Hmac<Sha256>,
}

/// The keys that sign and verify values: the first signs, all verify, so a
/// new key can be put first without invalidating values signed by the old one.
#[derive(Clone)]
pub struct KeyRing {
    signer: RingKey,
    verifiers: Vec<RingKey>,
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("key_ids", &self.key_ids().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl KeyRing {
    /// Builds a ring from `(id, key bytes)` pairs, the signing key first.
    /// There must be at least one key, ids must be valid and unique, and each
    /// key at least [`MIN_KEY_LEN`] bytes.
    pub fn new(keys: Vec<(String, Vec<u8>)>) -> Result<KeyRing, KeyError> {
        let mut ring: Vec<RingKey> = Vec::with_capacity(keys.len());
        for (id, bytes) in keys {
            if !is_key_id(&id) {
                return Err(KeyError::InvalidId { id });
            }
            if ring.iter().any(|key| key.id == id) {
                return Err(KeyError::DuplicateId { id });
            }
            if bytes.len() < MIN_KEY_LEN {
                return Err(KeyError::TooShort {
                    id,
                    len: bytes.len(),
                });
            }
            let Ok(mac) = Hmac::<Sha256>::new_from_slice(&bytes) else {
                // HMAC takes keys of any length; kept as an error rather than
                // a panic all the same.
                return Err(KeyError::TooShort {
                    id,
                    len: bytes.len(),
                });
            };
            ring.push(RingKey { id, mac });
        }
        let mut keys = ring.into_iter();
        let signer = keys.next().ok_or(KeyError::NoKeys)?;
        Ok(KeyRing {
            signer,
            verifiers: keys.collect(),
        })
    }

    /// Reads each key from its environment variable or file, in order (the
    /// first signs). Key material is base64, standard or url-safe, padding
    /// optional, surrounding whitespace ignored, of at least [`MIN_KEY_LEN`]
    /// bytes.
    pub fn load(sources: &[KeySource]) -> Result<KeyRing, KeyError> {
        let mut keys = Vec::with_capacity(sources.len());
        for source in sources {
            // Check the id before reading, so a bad id is reported as such.
            if !is_key_id(&source.id) {
                return Err(KeyError::InvalidId {
                    id: source.id.clone(),
                });
            }
            let bytes = read_key(&source.from).map_err(|problem| KeyError::Source {
                id: source.id.clone(),
                from: source.from.clone(),
                problem,
            })?;
            keys.push((source.id.clone(), bytes));
        }
        KeyRing::new(keys)
    }

    /// The ring's key ids, the signing key first.
    pub fn key_ids(&self) -> impl Iterator<Item = &str> {
        self.keys().map(|key| key.id.as_str())
    }

    fn keys(&self) -> impl Iterator<Item = &RingKey> {
        std::iter::once(&self.signer).chain(self.verifiers.iter())
    }

    /// Signs a value of `kind` for `route` with the first key. `route` must be
    /// a valid route name ([`is_route_name`], which config validation
    /// checks); a value signed for any other name never verifies.
    pub fn sign(&self, kind: Kind, route: &str, id: &VisitorId, t: u64) -> String {
        self.sign_at(kind, route, id, t, None)
    }

    /// [`KeyRing::sign`] with the optional `at` field (see the module doc).
    pub fn sign_at(
        &self,
        kind: Kind,
        route: &str,
        id: &VisitorId,
        t: u64,
        at: Option<u64>,
    ) -> String {
        let mut out = String::with_capacity(
            VERSION.len()
                + 3
                + route.len()
                + ID_CHARS
                + 2 * MAX_T_DIGITS
                + 1
                + self.signer.id.len()
                + MAC_CHARS
                + 6,
        );
        self.start_value(&mut out, kind, route, id, t, at);
        self.seal(&mut out);
        out
    }

    /// Signs a ticket of `route`: join score `score_us`, last seen
    /// `seen_us`, waiting in `lane` (`None`: the route's first lane).
    pub fn sign_ticket(
        &self,
        route: &str,
        id: &VisitorId,
        score_us: u64,
        seen_us: Option<u64>,
        lane: Option<&LaneTag>,
    ) -> String {
        self.sign_place(Kind::Ticket, route, id, score_us, seen_us, lane)
    }

    /// [`KeyRing::sign_ticket`] for a ticket of `kind`, `w` or `p` (any
    /// other kind signs a `w`).
    pub fn sign_place(
        &self,
        kind: Kind,
        route: &str,
        id: &VisitorId,
        score_us: u64,
        seen_us: Option<u64>,
        lane: Option<&LaneTag>,
    ) -> String {
        let kind = if kind.is_ticket() { kind } else { Kind::Ticket };
        let Some(lane) = lane else {
            return self.sign_at(kind, route, id, score_us, seen_us);
        };
        let mut out = String::with_capacity(MAX_VALUE_LEN);
        self.start_value(&mut out, kind, route, id, score_us, seen_us);
        out.push('_');
        out.push_str(lane.as_str());
        self.seal(&mut out);
        out
    }

    /// `v1.<state>.<route>.<id>.<t>[-<at>]`, the part of a ticket or pass
    /// before its lane and seal.
    fn start_value(
        &self,
        out: &mut String,
        kind: Kind,
        route: &str,
        id: &VisitorId,
        t: u64,
        at: Option<u64>,
    ) {
        out.push_str(VERSION);
        out.push('.');
        out.push_str(kind.state());
        out.push('.');
        out.push_str(route);
        out.push('.');
        URL_SAFE_NO_PAD.encode_string(id, out);
        out.push('.');
        push_decimal(out, t);
        if let Some(at) = at {
            out.push('-');
            push_decimal(out, at);
        }
    }

    /// Signs `out` in place with the first key: appends `.<kid>.<mac>`,
    /// the MAC covering everything before its own `.` (the key id too).
    /// Every value queuegate signs ends this way; each kind of value starts
    /// with `v1.<state>.` and a state letter of its own, so one kind can
    /// never be read as another.
    pub(crate) fn seal(&self, out: &mut String) {
        let key = &self.signer;
        out.push('.');
        out.push_str(&key.id);
        let mut mac = key.mac.clone();
        mac.update(out.as_bytes());
        let tag = mac.finalize().into_bytes();
        out.push('.');
        URL_SAFE_NO_PAD.encode_string(tag, out);
    }

    /// Checks a value's [`Seal`]: its key is in the ring and its MAC is that
    /// key's over `signed` (everything before the MAC's `.`), compared in
    /// constant time. Answers the key's position in the ring.
    pub(crate) fn open(&self, signed: &str, seal: &Seal<'_>) -> Result<usize, Reject> {
        let (key_index, key) = self
            .keys()
            .enumerate()
            .find(|(_, key)| key.id == seal.kid)
            .ok_or(Reject::UnknownKid)?;
        let mut check = key.mac.clone();
        check.update(signed.as_bytes());
        check.verify_slice(&seal.tag).map_err(|_| Reject::BadMac)?;
        Ok(key_index)
    }

    /// Checks a value presented for `route`. Any key of the ring verifies;
    /// the MAC is compared in constant time. Never panics and does not
    /// allocate. The caller checks the returned kind and, for a pass, its
    /// expiry ([`Claims::pass_life`]).
    pub fn verify(&self, value: &str, route: &str) -> Verdict {
        match self.check(value, route) {
            Ok(claims) => Verdict::Valid(claims),
            Err(reject) => Verdict::Invalid(reject),
        }
    }

    fn check(&self, value: &str, route: &str) -> Result<Claims, Reject> {
        let [_, state, value_route, id, t, kid, mac] = split_value::<7>(value)?;

        // Syntax of every field first, so a malformed value is always
        // reported as such whatever else is wrong with it.
        let kind = Kind::from_state(state).ok_or(Reject::Malformed)?;
        if !is_route_name(value_route) {
            return Err(Reject::Malformed);
        }
        let id = decode_fixed::<16>(id, ID_CHARS).ok_or(Reject::Malformed)?;
        let (t, lane) = match t.split_once('_') {
            Some((t, lane)) if kind.is_ticket() => {
                (t, Some(LaneTag::new(lane).ok_or(Reject::Malformed)?))
            }
            Some(_) => return Err(Reject::Malformed),
            None => (t, None),
        };
        let (t, at) = match t.split_once('-') {
            Some((t, at)) => (t, Some(parse_decimal(at).ok_or(Reject::Malformed)?)),
            None => (t, None),
        };
        let t = parse_decimal(t).ok_or(Reject::Malformed)?;
        let seal = Seal::parse(kid, mac).ok_or(Reject::Malformed)?;

        if value_route != route {
            return Err(Reject::WrongRoute);
        }
        let key_index = self.open(Seal::signed_part(value, mac)?, &seal)?;

        Ok(Claims {
            kind,
            id,
            t,
            at,
            key_index,
            lane,
        })
    }
}

/// The `N` dot-separated fields of a signed value: bounded in length before
/// anything else, ASCII, version `v1`, exactly `N` fields. Every kind of
/// value queuegate signs is read through this (`lane_grant` too).
pub(crate) fn split_value<const N: usize>(value: &str) -> Result<[&str; N], Reject> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Reject::Oversize);
    }
    if !value.is_ascii() {
        return Err(Reject::Malformed);
    }
    let version = value.split_once('.').map_or(value, |(version, _)| version);
    if version != VERSION {
        return Err(if is_version(version) {
            Reject::WrongVersion
        } else {
            Reject::Malformed
        });
    }
    let mut fields = [""; N];
    let mut count = 0;
    for field in value.split('.') {
        let slot = fields.get_mut(count).ok_or(Reject::Malformed)?;
        *slot = field;
        count += 1;
    }
    if count != N {
        return Err(Reject::Malformed);
    }
    Ok(fields)
}

/// The last two fields of a signed value, `<kid>.<mac>`, read but not yet
/// checked (see [`KeyRing::open`]).
pub(crate) struct Seal<'v> {
    kid: &'v str,
    tag: [u8; MAC_LEN],
}

impl<'v> Seal<'v> {
    /// Reads the key id and MAC fields: a valid key id ([`is_key_id`]) and
    /// exactly 43 characters of canonical base64url. `None`: malformed.
    pub(crate) fn parse(kid: &'v str, mac: &str) -> Option<Seal<'v>> {
        if !is_key_id(kid) {
            return None;
        }
        let tag = decode_fixed::<MAC_LEN>(mac, MAC_CHARS)?;
        Some(Seal { kid, tag })
    }

    /// What the MAC of `value`, whose last field is `mac`, covers:
    /// everything before the last `.`.
    pub(crate) fn signed_part<'a>(value: &'a str, mac: &str) -> Result<&'a str, Reject> {
        // The MAC field is ASCII, so this is a character boundary.
        value
            .len()
            .checked_sub(mac.len() + 1)
            .and_then(|end| value.get(..end))
            .ok_or(Reject::Malformed)
    }
}

/// A fresh visitor id: 128 bits from the thread's CSPRNG.
pub fn new_visitor_id() -> VisitorId {
    let mut id = [0u8; 16];
    rand::rng().fill_bytes(&mut id);
    id
}

/// A fresh 32-byte key, base64url without padding, as key files and
/// environment variables hold it.
pub fn keygen() -> String {
    let mut key = [0u8; KEYGEN_LEN];
    rand::rng().fill_bytes(&mut key);
    URL_SAFE_NO_PAD.encode(key)
}

/// `v` followed by one or more digits: a version field, known or not.
pub(crate) fn is_version(field: &str) -> bool {
    field
        .strip_prefix('v')
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

/// Decodes exactly `chars` characters of canonical base64url without padding
/// into `N` bytes. Non-canonical trailing bits are refused, so each byte
/// string has exactly one encoding.
pub(crate) fn decode_fixed<const N: usize>(field: &str, chars: usize) -> Option<[u8; N]> {
    if field.len() != chars {
        return None;
    }
    let mut out = [0u8; N];
    match URL_SAFE_NO_PAD.decode_slice(field, &mut out) {
        Ok(len) if len == N => Some(out),
        _ => None,
    }
}

/// Parses a decimal `u64` written without sign or leading zeros.
pub(crate) fn parse_decimal(field: &str) -> Option<u64> {
    let bytes = field.as_bytes();
    let first = *bytes.first()?;
    if bytes.len() > MAX_T_DIGITS || (first == b'0' && bytes.len() > 1) {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// Appends `n` in decimal.
pub(crate) fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; MAX_T_DIGITS];
    let mut start = digits.len();
    loop {
        start -= 1;
        // `n % 10` is below 10, so the cast cannot truncate.
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // ASCII digits: one copy, not a character at a time.
    out.push_str(std::str::from_utf8(&digits[start..]).unwrap_or_default());
}

/// Reads and decodes one key's material.
fn read_key(from: &KeyFrom) -> Result<Vec<u8>, KeyProblem> {
    let text = match from {
        KeyFrom::Env(var) => match std::env::var(var) {
            Ok(text) => text,
            Err(std::env::VarError::NotPresent) => return Err(KeyProblem::NotSet),
            Err(std::env::VarError::NotUnicode(_)) => return Err(KeyProblem::NotUnicode),
        },
        KeyFrom::File(path) => read_key_file(path)?,
    };
    decode_key(&text)
}

fn read_key_file(path: &Path) -> Result<String, KeyProblem> {
    let bytes = std::fs::read(path).map_err(KeyProblem::Unreadable)?;
    String::from_utf8(bytes).map_err(|_| KeyProblem::NotUnicode)
}

/// Decodes key material: base64 in either alphabet, padding optional,
/// surrounding whitespace trimmed.
fn decode_key(text: &str) -> Result<Vec<u8>, KeyProblem> {
    let text = text.trim();
    if text.is_empty() {
        return Err(KeyProblem::Empty);
    }
    let bytes = KEY_STANDARD
        .decode(text)
        .or_else(|_| KEY_URL_SAFE.decode(text))
        .map_err(|_| KeyProblem::NotBase64)?;
    if bytes.len() < MIN_KEY_LEN {
        return Err(KeyProblem::TooShort(bytes.len()));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ROUTE: &str = "tickets";

    /// The claims of a verdict, for assertions.
    trait ClaimsOf {
        fn claims(self) -> Option<Claims>;
    }

    impl ClaimsOf for Verdict {
        fn claims(self) -> Option<Claims> {
            match self {
                Verdict::Valid(claims) => Some(claims),
                Verdict::Invalid(_) => None,
            }
        }
    }
    const ID: VisitorId = [
        0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee,
        0xff,
    ];

    fn key(fill: u8) -> Vec<u8> {
        vec![fill; 32]
    }

    fn ring(ids: &[(&str, u8)]) -> KeyRing {
        let keys = ids.iter().map(|&(id, fill)| (id.to_owned(), key(fill)));
        match KeyRing::new(keys.collect()) {
            Ok(ring) => ring,
            Err(err) => panic!("test ring must build: {err}"),
        }
    }

    fn two_keys() -> KeyRing {
        ring(&[("k2", 2), ("k1", 1)])
    }

    /// Splits a value into its seven fields.
    fn fields(value: &str) -> Vec<String> {
        value.split('.').map(str::to_owned).collect()
    }

    /// Re-joins fields, with `at` replaced by `with`.
    fn replace_field(value: &str, at: usize, with: &str) -> String {
        let mut parts = fields(value);
        parts[at] = with.to_owned();
        parts.join(".")
    }

    fn reject(ring: &KeyRing, value: &str, route: &str) -> Option<Reject> {
        match ring.verify(value, route) {
            Verdict::Valid(_) => None,
            Verdict::Invalid(reject) => Some(reject),
        }
    }

    #[test]
    fn pass_round_trips() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1_700_000_060);
        assert_eq!(
            ring.verify(&value, ROUTE),
            Verdict::Valid(Claims {
                kind: Kind::Pass,
                id: ID,
                t: 1_700_000_060,
                at: None,
                key_index: 0,
                lane: None,
            })
        );
    }

    #[test]
    fn ticket_round_trips() {
        let ring = two_keys();
        let value = ring.sign(Kind::Ticket, ROUTE, &ID, 1_700_000_000_123_456);
        assert_eq!(
            ring.verify(&value, ROUTE),
            Verdict::Valid(Claims {
                kind: Kind::Ticket,
                id: ID,
                t: 1_700_000_000_123_456,
                at: None,
                key_index: 0,
                lane: None,
            })
        );
    }

    #[test]
    fn extreme_t_values_round_trip() {
        let ring = two_keys();
        for t in [0, 1, 9, 10, u64::MAX] {
            let value = ring.sign(Kind::Pass, ROUTE, &ID, t);
            assert_eq!(ring.verify(&value, ROUTE).claims().map(|c| c.t), Some(t));
        }
    }

    #[test]
    fn value_has_the_documented_shape() {
        let ring = two_keys();
        let value = ring.sign(Kind::Ticket, "a-b_C9", &ID, 42);
        let parts = fields(&value);
        assert_eq!(parts.len(), 7);
        assert_eq!(parts[0], "v1");
        assert_eq!(parts[1], "w");
        assert_eq!(parts[2], "a-b_C9");
        assert_eq!(parts[3], "ABEiM0RVZneImaq7zN3u_w");
        assert_eq!(parts[4], "42");
        assert_eq!(parts[5], "k2");
        assert_eq!(parts[6].len(), 43);
        // The MAC is HMAC-SHA256 under k2 over everything before the last dot.
        let mut mac = Hmac::<Sha256>::new_from_slice(&key(2)).unwrap_or_else(|_| panic!());
        mac.update(b"v1.w.a-b_C9.ABEiM0RVZneImaq7zN3u_w.42.k2");
        assert_eq!(
            parts[6],
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        );
        assert!(value.is_ascii());
    }

    #[test]
    fn tampered_mac_is_rejected() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1000);
        let other = ring.sign(Kind::Pass, ROUTE, &ID, 1001);
        let forged = replace_field(&value, 6, &fields(&other)[6]);
        assert_eq!(reject(&ring, &forged, ROUTE), Some(Reject::BadMac));
    }

    #[test]
    fn tampered_route_is_rejected() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1000);
        let moved = replace_field(&value, 2, "admin");
        // Presented for the route it now names: the MAC no longer matches.
        assert_eq!(reject(&ring, &moved, "admin"), Some(Reject::BadMac));
        // Presented for the route it was issued for: wrong route.
        assert_eq!(reject(&ring, &moved, ROUTE), Some(Reject::WrongRoute));
    }

    #[test]
    fn pass_for_another_route_is_rejected() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, "concerts", &ID, 1000);
        assert_eq!(reject(&ring, &value, ROUTE), Some(Reject::WrongRoute));
    }

    #[test]
    fn tampered_t_is_rejected() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1000);
        let later = replace_field(&value, 4, "99999999");
        assert_eq!(reject(&ring, &later, ROUTE), Some(Reject::BadMac));
    }

    #[test]
    fn tampered_id_is_rejected() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1000);
        let other_id = URL_SAFE_NO_PAD.encode([7u8; 16]);
        let stolen = replace_field(&value, 3, &other_id);
        assert_eq!(reject(&ring, &stolen, ROUTE), Some(Reject::BadMac));
    }

    #[test]
    fn tampered_kid_is_rejected() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1000);
        let relabelled = replace_field(&value, 5, "k1");
        assert_eq!(reject(&ring, &relabelled, ROUTE), Some(Reject::BadMac));
    }

    #[test]
    fn ticket_relabelled_as_pass_is_rejected() {
        let ring = two_keys();
        let ticket = ring.sign(Kind::Ticket, ROUTE, &ID, 1_700_000_000_000_000);
        let relabelled = replace_field(&ticket, 1, "a");
        assert_eq!(reject(&ring, &relabelled, ROUTE), Some(Reject::BadMac));
    }

    #[test]
    fn ticket_verifies_as_a_ticket_not_a_pass() {
        let ring = two_keys();
        let ticket = ring.sign(Kind::Ticket, ROUTE, &ID, 5);
        let claims = ring.verify(&ticket, ROUTE).claims();
        assert_eq!(claims.map(|c| c.kind), Some(Kind::Ticket));
    }

    #[test]
    fn unknown_kid_is_rejected() {
        let old = ring(&[("k0", 9)]);
        let value = old.sign(Kind::Pass, ROUTE, &ID, 1000);
        assert_eq!(reject(&two_keys(), &value, ROUTE), Some(Reject::UnknownKid));
    }

    #[test]
    fn same_kid_with_another_key_is_rejected() {
        let impostor = ring(&[("k2", 7)]);
        let value = impostor.sign(Kind::Pass, ROUTE, &ID, 1000);
        assert_eq!(reject(&two_keys(), &value, ROUTE), Some(Reject::BadMac));
    }

    #[test]
    fn old_key_still_verifies_after_a_new_key_is_put_first() {
        let before = ring(&[("k1", 1)]);
        let value = before.sign(Kind::Pass, ROUTE, &ID, 1000);
        let after = two_keys();
        assert_eq!(
            after.verify(&value, ROUTE),
            Verdict::Valid(Claims {
                kind: Kind::Pass,
                id: ID,
                t: 1000,
                at: None,
                key_index: 1,
                lane: None,
            })
        );
        // And the new ring signs with the new key.
        let renewed = after.sign(Kind::Pass, ROUTE, &ID, 1060);
        assert_eq!(fields(&renewed)[5], "k2");
        assert_eq!(reject(&before, &renewed, ROUTE), Some(Reject::UnknownKid));
    }

    #[test]
    fn oversize_value_is_rejected() {
        let ring = two_keys();
        let huge = "v1.".repeat(10 * 1024 / 3);
        assert_eq!(reject(&ring, &huge, ROUTE), Some(Reject::Oversize));
        let just_over = "a".repeat(MAX_VALUE_LEN + 1);
        assert_eq!(reject(&ring, &just_over, ROUTE), Some(Reject::Oversize));
    }

    #[test]
    fn longest_names_fit_under_the_size_limit() {
        let ring = ring(&[("k".repeat(16).as_str(), 1)]);
        let route = "r".repeat(32);
        let value = ring.sign(Kind::Ticket, &route, &ID, u64::MAX);
        assert!(value.len() <= MAX_VALUE_LEN);
        assert!(ring.verify(&value, &route).claims().is_some());
    }

    #[test]
    fn extra_field_is_rejected() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1000);
        assert_eq!(
            reject(&ring, &format!("{value}.x"), ROUTE),
            Some(Reject::Malformed)
        );
        assert_eq!(
            reject(&ring, &format!("{value}."), ROUTE),
            Some(Reject::Malformed)
        );
        let inserted = value.replacen(".k2.", ".k2.k2.", 1);
        assert_eq!(reject(&ring, &inserted, ROUTE), Some(Reject::Malformed));
    }

    #[test]
    fn missing_field_is_rejected() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1000);
        let mut parts = fields(&value);
        parts.remove(5);
        assert_eq!(
            reject(&ring, &parts.join("."), ROUTE),
            Some(Reject::Malformed)
        );
    }

    #[test]
    fn empty_parts_are_rejected() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1000);
        for at in 1..7 {
            let emptied = replace_field(&value, at, "");
            assert_eq!(
                reject(&ring, &emptied, ROUTE),
                Some(Reject::Malformed),
                "field {at} empty"
            );
        }
        for odd in ["", ".", "......", "v1......", "v1"] {
            assert_eq!(
                reject(&ring, odd, ROUTE),
                Some(Reject::Malformed),
                "{odd:?}"
            );
        }
    }

    #[test]
    fn other_versions_are_told_apart_from_garbage() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1000);
        let v2 = replace_field(&value, 0, "v2");
        assert_eq!(reject(&ring, &v2, ROUTE), Some(Reject::WrongVersion));
        assert_eq!(
            reject(&ring, "v10.anything", ROUTE),
            Some(Reject::WrongVersion)
        );
        for garbage in ["V1", "v", "x1", "v1a"] {
            let value = replace_field(&value, 0, garbage);
            assert_eq!(reject(&ring, &value, ROUTE), Some(Reject::Malformed));
        }
    }

    #[test]
    fn leading_zeros_and_signs_in_t_are_rejected() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1000);
        for t in [
            "01000",
            "+1000",
            "-1000",
            " 1000",
            "1e3",
            "00",
            "18446744073709551616",
        ] {
            let altered = replace_field(&value, 4, t);
            assert_eq!(
                reject(&ring, &altered, ROUTE),
                Some(Reject::Malformed),
                "{t}"
            );
        }
    }

    #[test]
    fn non_canonical_base64_is_rejected() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1000);
        let parts = fields(&value);
        // The last character of a 22-char id carries 2 data bits and 4 zero
        // bits; of a 43-char MAC, 4 data bits and 2 zero bits. Setting a
        // trailing bit gives another spelling of the same bytes.
        for (at, chars) in [(3, 22), (6, 43)] {
            let field = &parts[at];
            assert_eq!(field.len(), chars);
            let last = field.as_bytes()[chars - 1];
            let index = alphabet::URL_SAFE
                .as_str()
                .bytes()
                .position(|c| c == last)
                .unwrap_or_else(|| panic!("alphabet has {last}"));
            let twin = alphabet::URL_SAFE.as_str().as_bytes()[index | 1];
            let mut spelled = field.clone();
            spelled.pop();
            spelled.push(char::from(twin));
            let altered = replace_field(&value, at, &spelled);
            assert_eq!(reject(&ring, &altered, ROUTE), Some(Reject::Malformed));
        }
        // Padding, the standard alphabet and wrong lengths are not base64url
        // without padding either.
        let padded = replace_field(&value, 3, &format!("{}==", parts[3]));
        assert_eq!(reject(&ring, &padded, ROUTE), Some(Reject::Malformed));
        let standard = replace_field(&value, 3, "ABEiM0RVZneImaq7zN3u/w");
        assert_eq!(reject(&ring, &standard, ROUTE), Some(Reject::Malformed));
        let short = replace_field(&value, 6, &parts[6][..42]);
        assert_eq!(reject(&ring, &short, ROUTE), Some(Reject::Malformed));
    }

    #[test]
    fn non_ascii_value_is_rejected() {
        let ring = two_keys();
        let value = ring.sign(Kind::Pass, ROUTE, &ID, 1000);
        let altered = replace_field(&value, 2, "tickéts");
        assert_eq!(reject(&ring, &altered, "tickéts"), Some(Reject::Malformed));
    }

    #[test]
    fn pass_life_follows_half_of_pass_ttl() {
        let ttl = Duration::from_secs(60);
        let pass = Claims {
            kind: Kind::Pass,
            id: ID,
            t: 1060,
            at: None,
            key_index: 0,
            lane: None,
        };
        assert_eq!(pass.pass_life(1000, ttl), PassLife::Fresh);
        assert_eq!(pass.pass_life(1029, ttl), PassLife::Fresh);
        assert_eq!(pass.pass_life(1030, ttl), PassLife::Aging);
        assert_eq!(pass.pass_life(1059, ttl), PassLife::Aging);
        assert_eq!(pass.pass_life(1060, ttl), PassLife::Expired);
        assert_eq!(pass.pass_life(u64::MAX, ttl), PassLife::Expired);
        // Issued under a longer ttl than today's: still fresh.
        assert_eq!(pass.pass_life(0, ttl), PassLife::Fresh);
    }

    #[test]
    fn new_rejects_bad_key_rings() {
        assert!(matches!(KeyRing::new(vec![]), Err(KeyError::NoKeys)));
        assert!(matches!(
            KeyRing::new(vec![("k.1".into(), key(1))]),
            Err(KeyError::InvalidId { .. })
        ));
        assert!(matches!(
            KeyRing::new(vec![("".into(), key(1))]),
            Err(KeyError::InvalidId { .. })
        ));
        assert!(matches!(
            KeyRing::new(vec![("k".repeat(17), key(1))]),
            Err(KeyError::InvalidId { .. })
        ));
        assert!(matches!(
            KeyRing::new(vec![("k1".into(), key(1)), ("k1".into(), key(2))]),
            Err(KeyError::DuplicateId { id }) if id == "k1"
        ));
        assert!(matches!(
            KeyRing::new(vec![("k1".into(), vec![1; 31])]),
            Err(KeyError::TooShort { len: 31, .. })
        ));
    }

    #[test]
    fn key_ids_list_the_signing_key_first() {
        let ring = ring(&[("new", 1), ("mid", 2), ("old", 3)]);
        assert_eq!(ring.key_ids().collect::<Vec<_>>(), ["new", "mid", "old"]);
    }

    #[test]
    fn debug_does_not_print_key_bytes() {
        let secret = b"0123456789abcdefghijklmnopqrstuvwxyz".to_vec();
        let ring = match KeyRing::new(vec![("k1".into(), secret)]) {
            Ok(ring) => ring,
            Err(err) => panic!("{err}"),
        };
        let shown = format!("{ring:?} {ring:#?}");
        assert!(shown.contains("k1"), "{shown}");
        for needle in ["0123", "abcdef", "[48, 49", "0x30", "MDEy", "3031"] {
            assert!(!shown.contains(needle), "{shown}");
        }
    }

    #[test]
    fn keygen_makes_a_key_that_loads() {
        let made = keygen();
        assert_eq!(made.len(), 43);
        assert_eq!(decode_key(&made).map(|k| k.len()).ok(), Some(32));
        assert_ne!(made, keygen());
    }

    #[test]
    fn visitor_ids_differ() {
        assert_ne!(new_visitor_id(), new_visitor_id());
    }

    #[test]
    fn key_material_accepts_both_alphabets_and_optional_padding() {
        let bytes: Vec<u8> = (0u8..40)
            .map(|b| b.wrapping_mul(37).wrapping_add(250))
            .collect();
        let standard = base64::engine::general_purpose::STANDARD.encode(&bytes);
        assert!(standard.contains('+') || standard.contains('/'));
        let url_safe = base64::engine::general_purpose::URL_SAFE.encode(&bytes);
        for text in [
            standard.clone(),
            standard.trim_end_matches('=').to_owned(),
            url_safe.clone(),
            url_safe.trim_end_matches('=').to_owned(),
            format!("  {standard}\n"),
        ] {
            assert_eq!(decode_key(&text).ok(), Some(bytes.clone()), "{text:?}");
        }
        assert!(matches!(decode_key(" \n"), Err(KeyProblem::Empty)));
        assert!(matches!(
            decode_key("not base64!"),
            Err(KeyProblem::NotBase64)
        ));
        assert!(matches!(
            decode_key(&URL_SAFE_NO_PAD.encode([1u8; 31])),
            Err(KeyProblem::TooShort(31))
        ));
    }

    #[test]
    fn load_reads_keys_from_env_and_file() {
        let env_key = keygen();
        let file_key = keygen();
        let var = "QUEUEGATE_TEST_ADMISSION_LOAD_K2";
        std::env::set_var(var, format!("{env_key}\n"));
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let path = dir.path().join("qg_k1");
        std::fs::write(&path, format!("{file_key}\n")).unwrap_or_else(|err| panic!("{err}"));

        let loaded = KeyRing::load(&[
            KeySource {
                id: "k2".into(),
                from: KeyFrom::Env(var.into()),
            },
            KeySource {
                id: "k1".into(),
                from: KeyFrom::File(path),
            },
        ])
        .unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(loaded.key_ids().collect::<Vec<_>>(), ["k2", "k1"]);

        // The loaded keys are the ones written: values signed with rings
        // built from the same bytes verify, at the matching index.
        let from_env = KeyRing::new(vec![(
            "k2".into(),
            URL_SAFE_NO_PAD.decode(&env_key).unwrap_or_default(),
        )])
        .unwrap_or_else(|err| panic!("{err}"));
        let from_file = KeyRing::new(vec![(
            "k1".into(),
            URL_SAFE_NO_PAD.decode(&file_key).unwrap_or_default(),
        )])
        .unwrap_or_else(|err| panic!("{err}"));
        let signed = from_env.sign(Kind::Pass, ROUTE, &ID, 1);
        assert_eq!(
            loaded.verify(&signed, ROUTE).claims().map(|c| c.key_index),
            Some(0)
        );
        let signed = from_file.sign(Kind::Pass, ROUTE, &ID, 1);
        assert_eq!(
            loaded.verify(&signed, ROUTE).claims().map(|c| c.key_index),
            Some(1)
        );
        std::env::remove_var(var);
    }

    #[test]
    fn missing_env_var_error_names_the_variable_and_key() {
        let var = "QUEUEGATE_TEST_ADMISSION_NEVER_SET";
        std::env::remove_var(var);
        let err = KeyRing::load(&[KeySource {
            id: "k9".into(),
            from: KeyFrom::Env(var.into()),
        }])
        .err()
        .map(|err| err.to_string())
        .unwrap_or_default();
        assert!(err.contains(var), "{err}");
        assert!(err.contains("k9"), "{err}");
        assert!(err.contains("not set"), "{err}");
    }

    #[test]
    fn empty_or_short_env_var_is_an_error_naming_it() {
        let var = "QUEUEGATE_TEST_ADMISSION_SHORT";
        for (text, expect) in [("", "is empty"), ("AAAA", "3-byte key")] {
            std::env::set_var(var, text);
            let err = KeyRing::load(&[KeySource {
                id: "k3".into(),
                from: KeyFrom::Env(var.into()),
            }])
            .err()
            .map(|err| err.to_string())
            .unwrap_or_default();
            assert!(err.contains(var) && err.contains(expect), "{err}");
        }
        std::env::remove_var(var);
    }

    #[test]
    fn missing_file_error_names_the_file_and_key() {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let path = dir.path().join("absent_key");
        let err = KeyRing::load(&[KeySource {
            id: "k4".into(),
            from: KeyFrom::File(path.clone()),
        }])
        .err()
        .map(|err| err.to_string())
        .unwrap_or_default();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("k4"), "{err}");
    }

    #[test]
    fn load_rejects_a_bad_key_id_before_reading() {
        let err = KeyRing::load(&[KeySource {
            id: "bad id".into(),
            from: KeyFrom::Env("QUEUEGATE_TEST_ADMISSION_UNUSED".into()),
        }]);
        assert!(matches!(err, Err(KeyError::InvalidId { .. })));
    }

    /// A valid value of either kind, for a generated route and id, signed by
    /// the two-key ring.
    fn valid_value() -> impl Strategy<Value = (String, String)> {
        (
            any::<bool>(),
            "[A-Za-z0-9_-]{1,32}",
            any::<[u8; 16]>(),
            any::<u64>(),
        )
            .prop_map(|(ticket, route, id, t)| {
                let kind = if ticket { Kind::Ticket } else { Kind::Pass };
                (two_keys().sign(kind, &route, &id, t), route)
            })
    }

    /// Characters a mutation puts in: mostly ones that could appear in a
    /// value, so that mutations reach past the syntax checks.
    fn mutation_char() -> impl Strategy<Value = char> {
        prop_oneof![
            4 => proptest::sample::select(
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.+/=wak"
                    .chars()
                    .collect::<Vec<_>>()
            ),
            1 => any::<char>(),
        ]
    }

    proptest! {
        #[test]
        fn verify_never_panics_on_arbitrary_strings(value in any::<String>(), route in any::<String>()) {
            let _ = two_keys().verify(&value, &route);
        }

        #[test]
        fn verify_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let value = String::from_utf8_lossy(&bytes);
            let _ = two_keys().verify(&value, ROUTE);
        }

        #[test]
        fn verify_rejects_value_shaped_noise(value in "v1\\.[aw.]\\.[A-Za-z0-9_.=-]{0,120}") {
            prop_assert!(two_keys().verify(&value, ROUTE).claims().is_none());
        }

        #[test]
        fn any_single_character_substitution_is_rejected(
            (value, route) in valid_value(),
            at in any::<proptest::sample::Index>(),
            with in mutation_char(),
        ) {
            let ring = two_keys();
            prop_assert!(ring.verify(&value, &route).claims().is_some());
            let mut chars: Vec<char> = value.chars().collect();
            let at = at.index(chars.len());
            prop_assume!(chars[at] != with);
            chars[at] = with;
            let mutated: String = chars.into_iter().collect();
            prop_assert!(
                ring.verify(&mutated, &route).claims().is_none(),
                "{} accepted", mutated
            );
        }

        #[test]
        fn any_single_character_insertion_or_deletion_is_rejected(
            (value, route) in valid_value(),
            at in any::<proptest::sample::Index>(),
            with in mutation_char(),
        ) {
            let ring = two_keys();
            let chars: Vec<char> = value.chars().collect();
            let at = at.index(chars.len());
            let mut inserted = chars.clone();
            inserted.insert(at, with);
            let inserted: String = inserted.into_iter().collect();
            prop_assert!(ring.verify(&inserted, &route).claims().is_none(), "{} accepted", inserted);
            let mut deleted = chars;
            deleted.remove(at);
            let deleted: String = deleted.into_iter().collect();
            prop_assert!(ring.verify(&deleted, &route).claims().is_none(), "{} accepted", deleted);
        }
    }

    #[test]
    fn a_ticket_carries_its_lane_and_only_a_ticket_does() {
        let ring = two_keys();
        let id = [7u8; 16];
        let vip = LaneTag::new("vip_1-a").unwrap();
        for seen in [None, Some(9)] {
            let value = ring.sign_ticket(ROUTE, &id, 5, seen, Some(&vip));
            let claims = ring.verify(&value, ROUTE).claims().unwrap();
            assert_eq!((claims.t, claims.at, claims.lane), (5, seen, Some(vip)));
            assert_eq!(claims.lane.unwrap().as_str(), "vip_1-a");
        }
        let main = ring.sign_ticket(ROUTE, &id, 5, Some(9), None);
        assert_eq!(main, ring.sign_at(Kind::Ticket, ROUTE, &id, 5, Some(9)));
        assert_eq!(ring.verify(&main, ROUTE).claims().unwrap().lane, None);
        // The lane is covered by the MAC and must be a lane's name.
        let value = ring.sign_ticket(ROUTE, &id, 5, Some(9), Some(&vip));
        for (from, to) in [
            ("_vip_1-a", "_vip_1-b"),
            ("_vip_1-a", "_VIP"),
            ("_vip_1-a", "_"),
        ] {
            let forged = value.replacen(from, to, 1);
            assert!(ring.verify(&forged, ROUTE).claims().is_none(), "{forged}");
        }
        assert!(LaneTag::new("Vip").is_none() && LaneTag::new("").is_none());
        assert!(LaneTag::new(&"a".repeat(17)).is_none());
        // A pass never carries one: the same suffix on a pass is malformed.
        let mut pass = String::from("v1.a.tickets.");
        URL_SAFE_NO_PAD.encode_string(id, &mut pass);
        pass.push_str(".5-9_vip");
        ring.seal(&mut pass);
        assert!(matches!(
            ring.verify(&pass, ROUTE),
            Verdict::Invalid(Reject::Malformed)
        ));
    }

    #[test]
    fn a_pre_queue_ticket_is_a_ticket_of_its_own_kind() {
        let ring = two_keys();
        let id = [3u8; 16];
        let vip = LaneTag::new("vip").unwrap();
        for lane in [None, Some(&vip)] {
            let value = ring.sign_place(Kind::PreTicket, ROUTE, &id, 5, Some(9), lane);
            assert!(value.starts_with("v1.p."), "{value}");
            let claims = ring.verify(&value, ROUTE).claims().unwrap();
            assert_eq!(claims.kind, Kind::PreTicket);
            assert!(claims.kind.is_ticket());
            assert_eq!(
                (claims.t, claims.at, claims.lane),
                (5, Some(9), lane.copied())
            );
            // The state letter is covered by the MAC: a `p` never reads as a `w`.
            let forged = value.replacen("v1.p.", "v1.w.", 1);
            assert!(ring.verify(&forged, ROUTE).claims().is_none());
        }
        // Only places are signed as places.
        let value = ring.sign_place(Kind::Pass, ROUTE, &id, 5, None, None);
        assert!(value.starts_with("v1.w."), "{value}");
    }

    #[test]
    fn the_optional_at_field_round_trips_and_is_strict() {
        let ring = two_keys();
        let id = [7u8; 16];
        for kind in [Kind::Ticket, Kind::Pass, Kind::NewPass, Kind::LocalPass] {
            let value = ring.sign_at(kind, ROUTE, &id, 1_700_000_000, Some(1_700_000_000_123));
            let claims = ring.verify(&value, ROUTE).claims().unwrap();
            assert_eq!(claims.kind, kind);
            assert_eq!(claims.t, 1_700_000_000);
            assert_eq!(claims.at, Some(1_700_000_000_123));
        }
        let plain = ring.sign(Kind::Pass, ROUTE, &id, 5);
        assert_eq!(ring.verify(&plain, ROUTE).claims().unwrap().at, None);
        // The `at` field is covered by the MAC, and written one way only.
        let value = ring.sign_at(Kind::Ticket, ROUTE, &id, 5, Some(9));
        for (from, to) in [
            ("5-9", "5-8"),
            ("5-9", "5-09"),
            ("5-9", "5-"),
            ("5-9", "-9"),
            ("5-9", "5-9-9"),
            ("5-9", "5+9"),
        ] {
            let forged = value.replacen(from, to, 1);
            assert!(ring.verify(&forged, ROUTE).claims().is_none(), "{forged}");
        }
        // Promoting an unconfirmed pass to a confirmed one breaks the MAC.
        let new = ring.sign_at(Kind::NewPass, ROUTE, &id, 5, Some(9));
        let promoted = new.replacen(".n.", ".a.", 1);
        assert!(ring.verify(&promoted, ROUTE).claims().is_none());
        // So does passing a confirmed pass off as one granted locally.
        let pass = ring.sign_at(Kind::Pass, ROUTE, &id, 5, Some(9));
        let local = pass.replacen(".a.", ".l.", 1);
        assert!(ring.verify(&local, ROUTE).claims().is_none());
    }
}
