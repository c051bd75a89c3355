//! Every `Set-Cookie` value queuegate sends, built here and nowhere else:
//! a route's pass, its ticket (a place in the line, or in the pre-queue),
//! its lane cookie, and the value that clears the pass or ticket. All
//! carry `Path=/; HttpOnly; SameSite=Lax`, `Secure` on TLS, and the
//! configured `Domain` if any. When to send one is the gate's; what a
//! value means is `admission`'s and `lane_grant`'s.

use http::header::HeaderValue;

use super::lane_name;
use crate::admission::{KeyRing, Kind, LaneTag, VisitorId};
use crate::lane_grant::{self, Holder, Lane};

/// A ticket cookie outlives any reasonable wait; the place itself is kept by
/// the store and by the score the ticket carries.
const TICKET_MAX_AGE_S: u64 = 7 * 24 * 3600;

/// What signs the cookies and the `Domain` they are set for.
#[derive(Clone, Copy)]
pub struct Jar<'a> {
    ring: &'a KeyRing,
    domain: Option<&'a str>,
}

impl<'a> Jar<'a> {
    pub fn new(ring: &'a KeyRing, domain: Option<&'a str>) -> Jar<'a> {
        Jar { ring, domain }
    }

    /// A fresh pass of `kind` for `id` on `route`, cookie `name`, issued at
    /// `now_us`: it expires `pass_ttl_s` later, and the cookie is kept for
    /// the session's `session_ttl_s` beyond that.
    #[allow(clippy::too_many_arguments)]
    pub fn pass(
        &self,
        name: &str,
        route: &str,
        id: &VisitorId,
        kind: Kind,
        now_us: u64,
        pass_ttl_s: u64,
        session_ttl_s: u64,
        tls: bool,
    ) -> HeaderValue {
        let expiry = now_us / 1_000_000 + pass_ttl_s;
        let value = self
            .ring
            .sign_at(kind, route, id, expiry, Some(now_us / 1_000));
        set_cookie(name, &value, session_ttl_s + pass_ttl_s, tls, self.domain)
    }

    /// A ticket of `kind` (`w`, or `p` before the route's opening) for `id`
    /// on `route`, cookie `name`, at join score `score_us`, last seen at
    /// `seen_us` (none for a new ticket), in the lane `lane` tags.
    #[allow(clippy::too_many_arguments)]
    pub fn place(
        &self,
        name: &str,
        route: &str,
        kind: Kind,
        id: &VisitorId,
        score_us: u64,
        seen_us: Option<u64>,
        lane: Option<&LaneTag>,
        tls: bool,
    ) -> HeaderValue {
        let value = self
            .ring
            .sign_place(kind, route, id, score_us, seen_us, lane);
        set_cookie(name, &value, TICKET_MAX_AGE_S, tls, self.domain)
    }

    /// The lane cookie that puts `holder` in `lane` of `route` until
    /// `expires_unix`: its `Max-Age` ends when its signed expiry does
    /// (DESIGN §8.5).
    pub fn lane(
        &self,
        route: &str,
        lane: &Lane,
        holder: &Holder,
        now_unix: u64,
        expires_unix: u64,
        tls: bool,
    ) -> HeaderValue {
        let value = lane_grant::sign_grant(self.ring, route, lane, expires_unix, holder);
        let name = lane_name(route, tls, self.domain.is_some());
        let max_age = expires_unix.saturating_sub(now_unix);
        set_cookie(&name, &value, max_age, tls, self.domain)
    }

    /// The value that removes cookie `name`.
    pub fn clear(&self, name: &str, tls: bool) -> HeaderValue {
        set_cookie(name, "", 0, tls, self.domain)
    }
}

/// A `Set-Cookie` value: `HttpOnly; SameSite=Lax; Path=/`, `Secure` on TLS.
fn set_cookie(
    name: &str,
    value: &str,
    max_age_s: u64,
    tls: bool,
    domain: Option<&str>,
) -> HeaderValue {
    let mut text = format!("{name}={value}; Path=/; Max-Age={max_age_s}; HttpOnly; SameSite=Lax");
    if tls {
        text.push_str("; Secure");
    }
    if let Some(domain) = domain {
        text.push_str("; Domain=");
        text.push_str(domain);
    }
    // Names, values and the domain are validated ASCII, so this holds.
    HeaderValue::from_str(&text)
        .unwrap_or_else(|_| HeaderValue::from_static("qg_invalid=; Max-Age=0"))
}
