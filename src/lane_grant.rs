//! Lane grants (DESIGN §8.5): what puts a visitor in a lane of a route other
//! than its first. Owns the wire form of invite tokens (printed by
//! `queuegate invite`, carried as `?qg_invite=TOKEN` on a link) and of the
//! lane cookie's value; and taking invites out of request targets. The
//! origin's `Queuegate-Lane` response header is read by `origin`.
//!
//! Like `admission`, everything here is a pure function of its arguments
//! (drawing an invite's random nonce aside), and a bad value is a verdict,
//! not an error. Whether a route has the lane a value names, and what being
//! in a lane does, is the gate's to decide; counting an invite's uses is the
//! store's; cookie names and attributes are `cookie`'s.
//!
//! # Invite token
//!
//! `v1.i.<route>.<lane>.<expires>.<uses>.<nonce>.<kid>.<mac>`, ASCII only,
//! at most [`MAX_VALUE_LEN`] characters (checked before anything else):
//!
//! - `route`: the route it admits to (`config::is_route_name`);
//! - `lane`: the lane, `[a-z0-9_-]{1,16}` (`config::is_lane_name`);
//! - `expires`: unix seconds, decimal without sign or leading zeros; the
//!   token is valid while the clock reads less;
//! - `uses`: how many visitors may use it, same form; `0` for unlimited.
//!   The store counts uses under the nonce;
//! - `nonce`: 12 random bytes, base64url without padding (16 characters):
//!   every token printed is distinct, and the nonce names its use counter;
//! - `kid`, `mac`: the signing key's id and HMAC-SHA256 under it, as in
//!   `admission` (base64url, 43 characters, over everything before the
//!   last `.`).
//!
//! An invite is a bearer token: whoever holds the link may use it, until it
//! expires or its uses run out. It is taken out of every request target
//! before the origin sees it ([`take_invite`]), so it reaches neither the
//! origin's logs nor the `return` path of the waiting page.
//!
//! # Lane cookie
//!
//! `v1.<g|o>.<route>.<lane>.<expires>.<holder>.<kid>.<mac>`, fields as
//! above, `holder` 16 bytes in base64url (22 characters): the visitor
//! belongs to `lane` on `route` until `expires`, and only that visitor
//! ([`Holder`]). With `g` the holder is a visitor id, the one in the ticket
//! or pass the cookie was given with: the lane is honoured only alongside
//! a ticket or pass of that id, so a copy of the cookie on its own, or with
//! another visitor's ticket, gives nothing. With `o` it was given to a
//! visitor who held nothing on the route yet: the holder field is a random
//! nonce naming a one-use counter in the store, and the first arrival that
//! presents it takes that use and is bound from then on. queuegate sets it
//! for at most [`LANE_COOKIE_TTL`], and for an invite no later than the
//! invite expires; its `Max-Age` ends with `expires`, and binding it to a
//! new ticket or pass keeps `expires`. Each route has a lane cookie of its
//! own, and one signed for a route is refused for any other. Values of the form signed before lane cookies named their
//! holder (`v1.g.<route>.<lane>.<expires>.<kid>.<mac>`) are malformed:
//! they were bearer grants.
//!
//! The key ring is the one that signs passes; the state letters `i`, `g`
//! and `o` keep invites, lane cookies of either kind and admission values
//! from ever verifying as one another.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use http::uri::{PathAndQuery, Uri};
use percent_encoding::percent_decode;
use rand::RngCore as _;

use crate::admission::{
    decode_fixed, parse_decimal, push_decimal, split_value, KeyRing, Seal, VisitorId,
    MAX_VALUE_LEN, VERSION,
};
use crate::config::{is_lane_name, is_route_name, Config, MAX_LANE_NAME_LEN};

/// The query parameter an invite link carries its token in.
pub const INVITE_PARAM: &str = "qg_invite";

/// How long a lane cookie is valid at most: a day, long enough for a visit
/// that starts at the origin and waits in line, short enough that a lane
/// given once does not stay with a browser for good. One given for an
/// invite ends with the invite when that is sooner.
pub const LANE_COOKIE_TTL: Duration = Duration::from_secs(24 * 3600);

/// Length of an invite's nonce in bytes.
pub const NONCE_LEN: usize = 12;

/// Length of an encoded nonce: 12 bytes, base64url without padding.
const NONCE_CHARS: usize = 16;

/// The state letter of an invite token.
const INVITE: &str = "i";

/// The state letter of a lane cookie's value bound to a visitor id.
const GRANT: &str = "g";

/// The state letter of a lane cookie's value for its first arrival.
const GRANT_ONCE: &str = "o";

/// Length of an encoded holder: 16 bytes, base64url without padding.
const HOLDER_CHARS: usize = 22;

/// A valid lane name ([`is_lane_name`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Lane(String);

impl Lane {
    /// `name` as a lane, if it is a valid lane name.
    pub fn new(name: &str) -> Option<Lane> {
        is_lane_name(name).then(|| Lane(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a genuine, unexpired invite token says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invite {
    pub lane: Lane,
    /// Unix seconds; the token is valid before this.
    pub expires_unix: u64,
    /// How many visitors may use it; 0: unlimited.
    pub uses: u64,
    /// The token's random nonce, which names its use counter.
    pub nonce: [u8; NONCE_LEN],
    /// Position in the ring of the key that verified it.
    pub key_index: usize,
}

impl Invite {
    /// The name of the invite's use counter: its nonce, base64url.
    pub fn counter_key(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.nonce)
    }
}

/// What a genuine, unexpired lane cookie says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub lane: Lane,
    /// Unix seconds; the cookie is valid before this.
    pub expires_unix: u64,
    /// Whose lane it is.
    pub holder: Holder,
    /// Position in the ring of the key that verified it.
    pub key_index: usize,
}

/// Whose lane a lane cookie gives: nobody else's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The visitor whose ticket or pass has this id.
    Visitor(VisitorId),
    /// The first arrival that presents the cookie: given to a visitor who
    /// held no ticket or pass for the route, it takes one use counted in
    /// the store under this nonce, and is bound to that arrival's id.
    First([u8; 16]),
}

impl Holder {
    /// A holder for a visitor who holds nothing yet: a fresh random nonce.
    pub fn first() -> Holder {
        let mut nonce = [0u8; 16];
        rand::rng().fill_bytes(&mut nonce);
        Holder::First(nonce)
    }

    fn state(&self) -> &'static str {
        match self {
            Holder::Visitor(_) => GRANT,
            Holder::First(_) => GRANT_ONCE,
        }
    }

    fn bytes(&self) -> &[u8; 16] {
        match self {
            Holder::Visitor(bytes) | Holder::First(bytes) => bytes,
        }
    }
}

/// Why a token or lane cookie was not accepted: [`crate::admission::Reject`].
pub use crate::admission::Reject;

/// The outcome of [`verify_invite`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InviteVerdict {
    Valid(Invite),
    Invalid(Reject),
}

/// The outcome of [`verify_grant`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrantVerdict {
    Valid(Grant),
    Invalid(Reject),
}

/// Signs an invite to `lane` of `route`, valid before `expires_unix`, for
/// `uses` visitors (0: unlimited), with a fresh random nonce. `route` must
/// be a valid route name; a token signed for any other never verifies.
pub fn sign_invite(
    ring: &KeyRing,
    route: &str,
    lane: &Lane,
    expires_unix: u64,
    uses: u64,
) -> String {
    let mut nonce = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut nonce);
    sign_invite_with(ring, route, lane, expires_unix, uses, &nonce)
}

fn sign_invite_with(
    ring: &KeyRing,
    route: &str,
    lane: &Lane,
    expires_unix: u64,
    uses: u64,
    nonce: &[u8; NONCE_LEN],
) -> String {
    let mut out = String::with_capacity(MAX_VALUE_LEN);
    start_value(&mut out, INVITE, route, lane, expires_unix);
    out.push('.');
    push_decimal(&mut out, uses);
    out.push('.');
    URL_SAFE_NO_PAD.encode_string(nonce, &mut out);
    ring.seal(&mut out);
    out
}

/// Signs a lane cookie's value: `holder` belongs to `lane` of `route`
/// until `expires_unix`.
pub fn sign_grant(
    ring: &KeyRing,
    route: &str,
    lane: &Lane,
    expires_unix: u64,
    holder: &Holder,
) -> String {
    let mut out = String::with_capacity(MAX_VALUE_LEN);
    start_value(&mut out, holder.state(), route, lane, expires_unix);
    out.push('.');
    URL_SAFE_NO_PAD.encode_string(holder.bytes(), &mut out);
    ring.seal(&mut out);
    out
}

/// `v1.<state>.<route>.<lane>.<expires>`.
fn start_value(out: &mut String, state: &str, route: &str, lane: &Lane, expires_unix: u64) {
    out.push_str(VERSION);
    out.push('.');
    out.push_str(state);
    out.push('.');
    out.push_str(route);
    out.push('.');
    out.push_str(lane.as_str());
    out.push('.');
    push_decimal(out, expires_unix);
}

/// Checks an invite token presented for `route` at `now_unix`. Never
/// panics; a value longer than [`MAX_VALUE_LEN`] is refused before any other
/// work, and no MAC is computed for a malformed value or another route's.
pub fn verify_invite(ring: &KeyRing, value: &str, route: &str, now_unix: u64) -> InviteVerdict {
    match check_invite(ring, value, route, now_unix) {
        Ok(invite) => InviteVerdict::Valid(invite),
        Err(reject) => InviteVerdict::Invalid(reject),
    }
}

/// Checks a lane cookie's value presented for `route` at `now_unix`, as
/// [`verify_invite`] checks a token.
pub fn verify_grant(ring: &KeyRing, value: &str, route: &str, now_unix: u64) -> GrantVerdict {
    match check_grant(ring, value, route, now_unix) {
        Ok(grant) => GrantVerdict::Valid(grant),
        Err(reject) => GrantVerdict::Invalid(reject),
    }
}

fn check_invite(ring: &KeyRing, value: &str, route: &str, now_unix: u64) -> Result<Invite, Reject> {
    let [_, _, value_route, lane, expires, uses, nonce, kid, mac] = fields(value, INVITE)?;
    // Syntax of every field first, so a malformed value is always reported
    // as such whatever else is wrong with it.
    let (lane, expires_unix) = read_common(value_route, lane, expires)?;
    let uses = parse_decimal(uses).ok_or(Reject::Malformed)?;
    let nonce = decode_fixed::<NONCE_LEN>(nonce, NONCE_CHARS).ok_or(Reject::Malformed)?;
    let key_index = check_seal(ring, value, value_route, route, kid, mac)?;
    if now_unix >= expires_unix {
        return Err(Reject::Expired);
    }
    Ok(Invite {
        lane,
        expires_unix,
        uses,
        nonce,
        key_index,
    })
}

fn check_grant(ring: &KeyRing, value: &str, route: &str, now_unix: u64) -> Result<Grant, Reject> {
    let [_, state, value_route, lane, expires, holder, kid, mac] = split_value::<8>(value)?;
    let (lane, expires_unix) = read_common(value_route, lane, expires)?;
    let holder = decode_fixed::<16>(holder, HOLDER_CHARS).ok_or(Reject::Malformed)?;
    let holder = match state {
        GRANT => Holder::Visitor(holder),
        GRANT_ONCE => Holder::First(holder),
        _ => return Err(Reject::Malformed),
    };
    let key_index = check_seal(ring, value, value_route, route, kid, mac)?;
    if now_unix >= expires_unix {
        return Err(Reject::Expired);
    }
    Ok(Grant {
        lane,
        expires_unix,
        holder,
        key_index,
    })
}

/// The `N` fields of a value of state `state` ([`split_value`]).
fn fields<'v, const N: usize>(value: &'v str, state: &str) -> Result<[&'v str; N], Reject> {
    let fields = split_value::<N>(value)?;
    if fields.get(1) != Some(&state) {
        return Err(Reject::Malformed);
    }
    Ok(fields)
}

/// The route, lane and expiry fields both kinds of value share.
fn read_common(route: &str, lane: &str, expires: &str) -> Result<(Lane, u64), Reject> {
    if !is_route_name(route) {
        return Err(Reject::Malformed);
    }
    let lane = Lane::new(lane).ok_or(Reject::Malformed)?;
    let expires = parse_decimal(expires).ok_or(Reject::Malformed)?;
    Ok((lane, expires))
}

/// Reads the key id and MAC fields, then (for the route asked about only)
/// checks the MAC. Answers the key's position in the ring.
fn check_seal(
    ring: &KeyRing,
    value: &str,
    value_route: &str,
    route: &str,
    kid: &str,
    mac: &str,
) -> Result<usize, Reject> {
    let seal = Seal::parse(kid, mac).ok_or(Reject::Malformed)?;
    if value_route != route {
        return Err(Reject::WrongRoute);
    }
    let signed = Seal::signed_part(value, mac).map_err(|_| Reject::Malformed)?;
    ring.open(signed, &seal)
}

/// Takes every `qg_invite` parameter out of a request target's query:
/// answers the first one's value (percent-decoded) and the target without
/// them. The name counts however it is spelled in percent-escapes
/// (`qg%5Finvite`), as an origin decoding the query would read it; the
/// other parameters keep their bytes and order, and a `?` left with nothing
/// after it goes. A target without the parameter comes back as it was,
/// without copying.
pub fn take_invite(uri: Uri) -> (Option<String>, Uri) {
    let Some(taken) = uri.query().and_then(take_from_query) else {
        return (None, uri);
    };
    let (token, kept) = taken;
    let path = uri.path();
    let stripped = if kept.is_empty() {
        PathAndQuery::try_from(path)
    } else {
        PathAndQuery::try_from(format!("{path}?{kept}"))
    };
    // The kept bytes are a part of a valid query, so both hold; should they
    // not, the target loses its query rather than keep the invite.
    let stripped = stripped
        .or_else(|_| PathAndQuery::try_from(path))
        .unwrap_or_else(|_| PathAndQuery::from_static("/"));
    let mut parts = uri.into_parts();
    parts.path_and_query = Some(stripped.clone());
    let uri = Uri::from_parts(parts).unwrap_or_else(|_| Uri::from(stripped));
    (token, uri)
}

/// A relative target (`/path?query#fragment`, such as the waiting page's
/// `return` path) without its `qg_invite` parameters, as [`take_invite`]
/// takes them out.
pub fn strip_invite(target: &str) -> Cow<'_, str> {
    let (before, fragment) = match target.find('#') {
        Some(at) => target.split_at(at),
        None => (target, ""),
    };
    let Some((path, query)) = before.split_once('?') else {
        return Cow::Borrowed(target);
    };
    let Some((_, kept)) = take_from_query(query) else {
        return Cow::Borrowed(target);
    };
    let mut out = String::with_capacity(target.len());
    out.push_str(path);
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept);
    }
    out.push_str(fragment);
    Cow::Owned(out)
}

/// The first invite's value and the query without any invite; `None` when
/// the query holds none.
fn take_from_query(query: &str) -> Option<(Option<String>, String)> {
    if !query.split('&').any(is_invite_pair) {
        return None;
    }
    let mut token = None;
    let mut kept = String::with_capacity(query.len());
    let mut first = true;
    for pair in query.split('&') {
        if is_invite_pair(pair) {
            if token.is_none() {
                let value = pair.split_once('=').map_or("", |(_, value)| value);
                token = Some(
                    percent_decode(value.as_bytes())
                        .decode_utf8_lossy()
                        .into_owned(),
                );
            }
            continue;
        }
        if !first {
            kept.push('&');
        }
        kept.push_str(pair);
        first = false;
    }
    Some((token, kept))
}

/// Whether a `name=value` query pair is an invite: its name, once
/// percent-decoded, is exactly `qg_invite`.
fn is_invite_pair(pair: &str) -> bool {
    let name = pair.split_once('=').map_or(pair, |(name, _)| name);
    if name == INVITE_PARAM {
        return true;
    }
    // Three bytes an escape at most: anything longer cannot decode to it.
    name.contains('%')
        && name.len() <= INVITE_PARAM.len() * 3
        && percent_decode(name.as_bytes()).eq(INVITE_PARAM.bytes())
}

/// An invite `queuegate invite` is asked to print, checked against the
/// config: its route exists and its lane is a valid lane name. (Routes have
/// no `lanes` setting yet, so any valid name is accepted; a lane its route
/// does not have puts nobody anywhere.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InviteSpec {
    route: String,
    lane: Lane,
    expires_unix: u64,
    uses: u64,
}

/// Why `queuegate invite` cannot print a token: bad input, one line each.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InviteInputError {
    #[error("--route {route:?}: no such route in the config (routes: {known})")]
    UnknownRoute { route: String, known: String },
    #[error("--lane {lane:?}: a lane name is 1 to {MAX_LANE_NAME_LEN} characters of a-z 0-9 _ -")]
    BadLane { lane: String },
    #[error("--lane {lane:?}: route {route:?} has no such lane (lanes: {known})")]
    UnknownLane {
        route: String,
        lane: String,
        known: String,
    },
    #[error("--expires: {0}")]
    BadExpiry(String),
}

impl InviteSpec {
    /// An invite to `lane` of `route` in `config`, valid for `valid_for`
    /// from `now_unix` (at least a second), for `uses` visitors (0:
    /// unlimited).
    pub fn new(
        config: &Config,
        route: &str,
        lane: &str,
        valid_for: Duration,
        uses: u64,
        now_unix: u64,
    ) -> Result<InviteSpec, InviteInputError> {
        let Some(found) = config.routes.iter().find(|r| r.name == route) else {
            let known: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
            return Err(InviteInputError::UnknownRoute {
                route: route.to_owned(),
                known: if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                },
            });
        };
        let lane = Lane::new(lane).ok_or_else(|| InviteInputError::BadLane {
            lane: lane.to_owned(),
        })?;
        if !found.lanes.iter().any(|l| l.name == lane.as_str()) {
            let known: Vec<&str> = found.lanes.iter().map(|l| l.name.as_str()).collect();
            return Err(InviteInputError::UnknownLane {
                route: route.to_owned(),
                lane: lane.as_str().to_owned(),
                known: known.join(", "),
            });
        }
        if valid_for < Duration::from_secs(1) {
            return Err(InviteInputError::BadExpiry(
                "an invite must be valid for at least 1s".to_owned(),
            ));
        }
        let expires_unix = now_unix
            .checked_add(valid_for.as_secs())
            .ok_or_else(|| InviteInputError::BadExpiry("too far in the future".to_owned()))?;
        Ok(InviteSpec {
            route: route.to_owned(),
            lane,
            expires_unix,
            uses,
        })
    }

    /// The token, signed with the ring's first key.
    pub fn sign(&self, ring: &KeyRing) -> String {
        sign_invite(ring, &self.route, &self.lane, self.expires_unix, self.uses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{self, Kind};
    use proptest::prelude::*;

    const ROUTE: &str = "tickets";
    const NOW: u64 = 1_700_000_000;

    fn ring(ids: &[(&str, u8)]) -> KeyRing {
        let keys = ids
            .iter()
            .map(|&(id, fill)| (id.to_owned(), vec![fill; 32]));
        match KeyRing::new(keys.collect()) {
            Ok(ring) => ring,
            Err(err) => panic!("test ring must build: {err}"),
        }
    }

    fn two_keys() -> KeyRing {
        ring(&[("k2", 2), ("k1", 1)])
    }

    fn lane(name: &str) -> Lane {
        Lane::new(name).unwrap_or_else(|| panic!("{name} is a lane name"))
    }

    fn invite_reject(ring: &KeyRing, value: &str, route: &str, now: u64) -> Option<Reject> {
        match verify_invite(ring, value, route, now) {
            InviteVerdict::Valid(_) => None,
            InviteVerdict::Invalid(reject) => Some(reject),
        }
    }

    fn grant_reject(ring: &KeyRing, value: &str, route: &str, now: u64) -> Option<Reject> {
        match verify_grant(ring, value, route, now) {
            GrantVerdict::Valid(_) => None,
            GrantVerdict::Invalid(reject) => Some(reject),
        }
    }

    #[test]
    fn lane_names_are_short_lower_case_tokens() {
        for good in ["main", "vip", "a", "press_2", "staff-1", "0123456789abcdef"] {
            assert!(is_lane_name(good), "{good}");
        }
        for bad in [
            "",
            "VIP",
            "Main",
            "v.i.p",
            "vip lane",
            "0123456789abcdefg",
            "vïp",
            "a,b",
        ] {
            assert!(!is_lane_name(bad), "{bad}");
        }
    }

    #[test]
    fn invite_round_trips() {
        let ring = two_keys();
        let nonce = [9u8; NONCE_LEN];
        let token = sign_invite_with(&ring, ROUTE, &lane("vip"), NOW + 60, 5, &nonce);
        assert!(
            token.starts_with("v1.i.tickets.vip.1700000060.5."),
            "{token}"
        );
        assert_eq!(token.split('.').count(), 9);
        assert_eq!(
            verify_invite(&ring, &token, ROUTE, NOW),
            InviteVerdict::Valid(Invite {
                lane: lane("vip"),
                expires_unix: NOW + 60,
                uses: 5,
                nonce,
                key_index: 0,
            })
        );
    }

    #[test]
    fn printed_invites_differ_by_their_nonce() {
        let ring = two_keys();
        let one = sign_invite(&ring, ROUTE, &lane("vip"), NOW + 60, 0);
        let two = sign_invite(&ring, ROUTE, &lane("vip"), NOW + 60, 0);
        assert_ne!(one, two);
        let key = |token: &str| match verify_invite(&ring, token, ROUTE, NOW) {
            InviteVerdict::Valid(invite) => invite.counter_key(),
            InviteVerdict::Invalid(reject) => panic!("{reject:?}"),
        };
        assert_ne!(key(&one), key(&two));
        assert_eq!(key(&one).len(), NONCE_CHARS);
        assert!(one.contains(&format!(".{}.", key(&one))));
    }

    /// A visitor id, and the same bytes as a first arrival's nonce.
    const HOLDER: Holder = Holder::Visitor([7; 16]);
    const FIRST: Holder = Holder::First([7; 16]);

    #[test]
    fn grant_round_trips_naming_its_holder() {
        let ring = two_keys();
        for (holder, starts) in [
            (
                HOLDER,
                "v1.g.tickets.vip.1700000060.BwcHBwcHBwcHBwcHBwcHBw.k2.",
            ),
            (
                FIRST,
                "v1.o.tickets.vip.1700000060.BwcHBwcHBwcHBwcHBwcHBw.k2.",
            ),
        ] {
            let value = sign_grant(&ring, ROUTE, &lane("vip"), NOW + 60, &holder);
            assert!(value.starts_with(starts), "{value}");
            assert_eq!(
                verify_grant(&ring, &value, ROUTE, NOW),
                GrantVerdict::Valid(Grant {
                    lane: lane("vip"),
                    expires_unix: NOW + 60,
                    holder,
                    key_index: 0,
                })
            );
        }
        let fresh = [Holder::first(), Holder::first()];
        assert_ne!(fresh[0], fresh[1]);
        assert!(fresh.iter().all(|h| matches!(h, Holder::First(_))));
    }

    #[test]
    fn a_grant_that_names_no_holder_is_malformed() {
        // The form signed before grants named their holder, with a MAC
        // that matches: a bearer grant, refused.
        let ring = two_keys();
        let mut unbound = String::from("v1.g.tickets.vip.1700000060");
        ring.seal(&mut unbound);
        assert_eq!(
            grant_reject(&ring, &unbound, ROUTE, NOW),
            Some(Reject::Malformed)
        );
        let mut lettered = String::from("v1.x.tickets.vip.1700000060.BwcHBwcHBwcHBwcHBwcHBw");
        ring.seal(&mut lettered);
        assert_eq!(
            grant_reject(&ring, &lettered, ROUTE, NOW),
            Some(Reject::Malformed)
        );
    }

    #[test]
    fn a_key_being_rotated_out_still_verifies() {
        let old = ring(&[("k1", 1)]);
        let token = sign_invite(&old, ROUTE, &lane("vip"), NOW + 60, 0);
        let value = sign_grant(&old, ROUTE, &lane("vip"), NOW + 60, &HOLDER);
        let rotated = two_keys();
        assert!(
            matches!(verify_invite(&rotated, &token, ROUTE, NOW), InviteVerdict::Valid(i) if i.key_index == 1)
        );
        assert!(
            matches!(verify_grant(&rotated, &value, ROUTE, NOW), GrantVerdict::Valid(g) if g.key_index == 1)
        );
    }

    #[test]
    fn each_rejection_has_its_reason() {
        let ring = two_keys();
        let token = sign_invite(&ring, ROUTE, &lane("vip"), NOW + 60, 0);
        let value = sign_grant(&ring, ROUTE, &lane("vip"), NOW + 60, &HOLDER);
        let first = sign_grant(&ring, ROUTE, &lane("vip"), NOW + 60, &FIRST);
        let other_ring = ring_with_other_key();
        for (signed, reject) in [
            (
                &token,
                invite_reject as fn(&KeyRing, &str, &str, u64) -> Option<Reject>,
            ),
            (&value, grant_reject),
            (&first, grant_reject),
        ] {
            assert_eq!(reject(&ring, signed, ROUTE, NOW), None);
            assert_eq!(
                reject(&ring, signed, "other", NOW),
                Some(Reject::WrongRoute)
            );
            assert_eq!(
                reject(&ring, signed, ROUTE, NOW + 60),
                Some(Reject::Expired)
            );
            assert_eq!(
                reject(&ring, signed, ROUTE, u64::MAX),
                Some(Reject::Expired)
            );
            assert_eq!(
                reject(&other_ring, signed, ROUTE, NOW),
                Some(Reject::UnknownKid)
            );
            let forged = signed.replacen(".k2.", ".k1.", 1);
            assert_eq!(reject(&ring, &forged, ROUTE, NOW), Some(Reject::BadMac));
            let v2 = signed.replacen("v1.", "v2.", 1);
            assert_eq!(reject(&ring, &v2, ROUTE, NOW), Some(Reject::WrongVersion));
            let long = format!("{signed}{}", "A".repeat(MAX_VALUE_LEN));
            assert_eq!(reject(&ring, &long, ROUTE, NOW), Some(Reject::Oversize));
            for malformed in [
                String::new(),
                ".".repeat(8),
                format!("{signed}."),
                signed.replacen(".vip.", ".VIP.", 1),
                signed.replacen(".vip.", ".vïp.", 1),
                signed.replacen(".1700000060.", ".01700000060.", 1),
                signed.replacen(".k2.", ".k 2.", 1),
            ] {
                assert_eq!(
                    reject(&ring, &malformed, ROUTE, NOW),
                    Some(Reject::Malformed),
                    "{malformed}"
                );
            }
        }
    }

    fn ring_with_other_key() -> KeyRing {
        ring(&[("k9", 9)])
    }

    #[test]
    fn no_kind_of_value_verifies_as_another() {
        let ring = two_keys();
        let token = sign_invite(&ring, ROUTE, &lane("vip"), NOW + 60, 0);
        let value = sign_grant(&ring, ROUTE, &lane("vip"), NOW + 60, &HOLDER);
        let pass = ring.sign(Kind::Pass, ROUTE, &[7; 16], NOW + 60);
        assert_eq!(
            invite_reject(&ring, &value, ROUTE, NOW),
            Some(Reject::Malformed)
        );
        assert_eq!(
            invite_reject(&ring, &pass, ROUTE, NOW),
            Some(Reject::Malformed)
        );
        assert_eq!(
            grant_reject(&ring, &token, ROUTE, NOW),
            Some(Reject::Malformed)
        );
        assert_eq!(
            grant_reject(&ring, &pass, ROUTE, NOW),
            Some(Reject::Malformed)
        );
        for value in [&token, &value] {
            assert!(matches!(
                ring.verify(value, ROUTE),
                admission::Verdict::Invalid(admission::Reject::Malformed)
            ));
        }
        // Relabelled, the MAC no longer matches: not as a pass, nor as a
        // grant for its first arrival (or the other way round).
        let relabelled = value.replacen("v1.g.", "v1.a.", 1);
        assert!(matches!(
            ring.verify(&relabelled, ROUTE),
            admission::Verdict::Invalid(_)
        ));
        let first = sign_grant(&ring, ROUTE, &lane("vip"), NOW + 60, &FIRST);
        assert_eq!(
            grant_reject(&ring, &value.replacen("v1.g.", "v1.o.", 1), ROUTE, NOW),
            Some(Reject::BadMac)
        );
        assert_eq!(
            grant_reject(&ring, &first.replacen("v1.o.", "v1.g.", 1), ROUTE, NOW),
            Some(Reject::BadMac)
        );
    }

    #[test]
    fn take_invite_removes_every_spelling_and_keeps_the_rest() {
        let cases = [
            ("/t?qg_invite=TOK", Some("TOK"), "/t"),
            ("/t?a=1&qg_invite=TOK&b=2", Some("TOK"), "/t?a=1&b=2"),
            (
                "/t?qg_invite=ONE&a=%41+1&qg_invite=TWO",
                Some("ONE"),
                "/t?a=%41+1",
            ),
            ("/t?qg%5Finvite=TOK&a=1", Some("TOK"), "/t?a=1"),
            ("/t?qg%5finvite=TOK", Some("TOK"), "/t"),
            ("/t?%71%67%5F%69%6E%76%69%74%65=TOK&z", Some("TOK"), "/t?z"),
            ("/t?qg_invite=v1.i%2Ex&b", Some("v1.i.x"), "/t?b"),
            ("/t?qg_invite&b=2", Some(""), "/t?b=2"),
            ("/t?b=2&&qg_invite=x&c", Some("x"), "/t?b=2&&c"),
            (
                "/t?qg_invitex=1&xqg_invite=2&QG_INVITE=3",
                None,
                "/t?qg_invitex=1&xqg_invite=2&QG_INVITE=3",
            ),
            ("/t?qg%255Finvite=1", None, "/t?qg%255Finvite=1"),
            ("/t?a=qg_invite", None, "/t?a=qg_invite"),
            ("/t", None, "/t"),
            ("/t?", None, "/t?"),
            ("/qg_invite=1?x=1", None, "/qg_invite=1?x=1"),
        ];
        for (target, token, stripped) in cases {
            let (got, uri) = take_invite(target.parse().unwrap());
            assert_eq!(got.as_deref(), token, "{target}");
            assert_eq!(uri.to_string(), stripped, "{target}");
            assert_eq!(strip_invite(target), stripped, "{target}");
        }
    }

    #[test]
    fn take_invite_keeps_an_absolute_target_absolute() {
        let uri: Uri = "https://shop.example:8443/t?x=1&qg_invite=T"
            .parse()
            .unwrap();
        let (token, uri) = take_invite(uri);
        assert_eq!(token.as_deref(), Some("T"));
        assert_eq!(uri.to_string(), "https://shop.example:8443/t?x=1");
    }

    #[test]
    fn strip_invite_keeps_the_fragment() {
        assert_eq!(strip_invite("/t?qg_invite=T#top"), "/t#top");
        assert_eq!(
            strip_invite("/t?a&qg_invite=T#x?qg_invite=U"),
            "/t?a#x?qg_invite=U"
        );
        assert!(matches!(strip_invite("/t?a=1#f"), Cow::Borrowed(_)));
    }

    fn config_with(routes: &[&str]) -> Config {
        let mut yaml = String::from(
            "listen: [{ addr: \"127.0.0.1:0\" }]\nupstream: { url: \"http://127.0.0.1:9\" }\n\
             keys: [{ id: k1, env: QG_UNUSED }]\nroutes:\n",
        );
        for (n, name) in routes.iter().enumerate() {
            yaml.push_str(&format!(
                "  - {{ name: {name}, match: {{ path_prefix: /p{n} }}, capacity: 1, \
                 lanes: [{{ name: main }}, {{ name: vip, weight: 3 }}] }}\n"
            ));
        }
        Config::from_yaml(&yaml).unwrap_or_else(|err| panic!("{err}"))
    }

    #[test]
    fn invite_spec_checks_route_lane_and_expiry() {
        let config = config_with(&["tickets", "merch"]);
        let day = Duration::from_secs(86_400);
        let spec = InviteSpec::new(&config, ROUTE, "vip", day, 3, NOW).unwrap();
        let ring = two_keys();
        match verify_invite(&ring, &spec.sign(&ring), ROUTE, NOW) {
            InviteVerdict::Valid(invite) => {
                assert_eq!(invite.lane, lane("vip"));
                assert_eq!(invite.expires_unix, NOW + 86_400);
                assert_eq!(invite.uses, 3);
            }
            InviteVerdict::Invalid(reject) => panic!("{reject:?}"),
        }
        let err = InviteSpec::new(&config, "nope", "vip", day, 0, NOW).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--route \"nope\": no such route in the config (routes: tickets, merch)"
        );
        assert!(matches!(
            InviteSpec::new(&config, ROUTE, "VIP", day, 0, NOW),
            Err(InviteInputError::BadLane { .. })
        ));
        assert_eq!(
            InviteSpec::new(&config, ROUTE, "press", day, 0, NOW)
                .unwrap_err()
                .to_string(),
            "--lane \"press\": route \"tickets\" has no such lane (lanes: main, vip)"
        );
        for short in [Duration::ZERO, Duration::from_millis(999)] {
            assert!(matches!(
                InviteSpec::new(&config, ROUTE, "vip", short, 0, NOW),
                Err(InviteInputError::BadExpiry(_))
            ));
        }
        assert!(matches!(
            InviteSpec::new(&config, ROUTE, "vip", Duration::from_secs(u64::MAX), 0, NOW),
            Err(InviteInputError::BadExpiry(_))
        ));
    }

    /// A valid invite or lane cookie for a generated route, lane and times,
    /// with the route and a time at which it is valid.
    fn signed_value() -> impl Strategy<Value = (bool, String, String, u64)> {
        (
            any::<bool>(),
            "[A-Za-z0-9_-]{1,32}",
            "[a-z0-9_-]{1,16}",
            1..u64::MAX,
            any::<u64>(),
            any::<[u8; NONCE_LEN]>(),
            (any::<bool>(), any::<[u8; 16]>()),
        )
            .prop_flat_map(
                |(invite, route, lane_name, expires, uses, nonce, (bound, holder))| {
                    (0..expires).prop_map(move |now| {
                        let ring = two_keys();
                        let lane = lane(&lane_name);
                        let holder = if bound {
                            Holder::Visitor(holder)
                        } else {
                            Holder::First(holder)
                        };
                        let value = if invite {
                            sign_invite_with(&ring, &route, &lane, expires, uses, &nonce)
                        } else {
                            sign_grant(&ring, &route, &lane, expires, &holder)
                        };
                        (invite, value, route.clone(), now)
                    })
                },
            )
    }

    fn verdict(invite: bool, value: &str, route: &str, now: u64) -> Option<Reject> {
        if invite {
            invite_reject(&two_keys(), value, route, now)
        } else {
            grant_reject(&two_keys(), value, route, now)
        }
    }

    proptest! {
        #[test]
        fn sign_then_verify_round_trips((invite, value, route, now) in signed_value()) {
            prop_assert!(value.len() <= MAX_VALUE_LEN);
            prop_assert_eq!(verdict(invite, &value, &route, now), None);
        }

        #[test]
        fn any_single_byte_change_is_rejected(
            (invite, value, route, now) in signed_value(),
            at in any::<proptest::sample::Index>(),
            with in any::<u8>(),
        ) {
            let mut bytes = value.clone().into_bytes();
            let at = at.index(bytes.len());
            prop_assume!(bytes[at] != with);
            bytes[at] = with;
            let changed = String::from_utf8_lossy(&bytes);
            prop_assert!(verdict(invite, &changed, &route, now).is_some(), "{} accepted", changed);
        }

        #[test]
        fn another_route_is_rejected(
            (invite, value, route, now) in signed_value(),
            other in "[A-Za-z0-9_-]{1,32}",
        ) {
            prop_assume!(other != route);
            prop_assert_eq!(verdict(invite, &value, &other, now), Some(Reject::WrongRoute));
        }

        #[test]
        fn at_or_past_expiry_is_rejected(
            (invite, value, route, _now) in signed_value(),
            late in any::<u64>(),
        ) {
            let expires: u64 = value.split('.').nth(4).and_then(|t| t.parse().ok()).unwrap_or(0);
            let now = expires.saturating_add(late % 1_000_000);
            prop_assert_eq!(verdict(invite, &value, &route, now), Some(Reject::Expired));
        }

        #[test]
        fn verify_never_panics_on_arbitrary_input(value in any::<String>(), route in any::<String>(), now in any::<u64>()) {
            let _ = verify_invite(&two_keys(), &value, &route, now);
            let _ = verify_grant(&two_keys(), &value, &route, now);
        }

        #[test]
        fn no_invite_survives_take_invite(
            params in proptest::collection::vec(
                prop_oneof![
                    Just("qg_invite=T".to_owned()),
                    Just("qg%5Finvite=T".to_owned()),
                    Just("qg_invite".to_owned()),
                    "[a-z%0-9_]{0,12}(=[a-zA-Z0-9%._~+-]{0,12})?",
                ],
                0..8,
            ),
        ) {
            let target = format!("/p?{}", params.join("&"));
            let (token, uri) = take_invite(target.parse().unwrap());
            let kept: Vec<&String> = params.iter().filter(|p| !is_invite_pair(p)).collect();
            prop_assert_eq!(token.is_some(), kept.len() < params.len());
            let query = uri.query().unwrap_or("");
            prop_assert!(!query.split('&').any(is_invite_pair), "{}", uri);
            if token.is_some() {
                let expected: Vec<&str> = kept.iter().map(|p| p.as_str()).collect();
                prop_assert_eq!(query, expected.join("&"));
                prop_assert_eq!(uri.query().is_none(), expected.join("&").is_empty());
            } else {
                prop_assert_eq!(uri.to_string(), target);
            }
        }
    }
}
