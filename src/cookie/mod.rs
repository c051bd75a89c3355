//! queuegate's cookies on the wire: their names, the `Set-Cookie` values it
//! sends, reading the credentials a request carries (verified with the key
//! ring), the per-connection memo of the last verified `Cookie` header, and
//! stripping queuegate's cookies before a request reaches the origin. Each
//! route has two cookies: its pass or ticket, and its lane cookie (DESIGN
//! §8.5). What a cookie's value means is `admission`'s and `lane_grant`'s;
//! when to send one is the gate's. The values are built by the [`Jar`]
//! (`jar`).

mod jar;

pub use jar::Jar;

use std::sync::{Mutex, PoisonError};

use http::header::{HeaderValue, COOKIE};

use crate::fields::{Fields, Headers};

use crate::admission::{Claims, KeyRing, Kind, LaneTag, Verdict, VisitorId};
use crate::lane_grant::{self, GrantVerdict, Holder};

/// Cookies queuegate sets are named `qg_<route>` (`__Host-qg_<route>` on TLS).
const COOKIE_PREFIX: &str = "qg_";
const HOST_PREFIX: &str = "__Host-";

/// The names of a route's cookie without TLS and with it: `qg_<route>`, and
/// `__Host-qg_<route>` on TLS unless the cookie names a `Domain` (which
/// `__Host-` cookies may not have).
pub fn names(route: &str, has_domain: bool) -> (String, String) {
    let plain = format!("{COOKIE_PREFIX}{route}");
    let tls = if has_domain {
        plain.clone()
    } else {
        format!("{HOST_PREFIX}{plain}")
    };
    (plain, tls)
}

/// Lane cookies are named `qg_lane.<route>` (`__Host-qg_lane.<route>` on
/// TLS): a route name has no `.`, so no route's pass cookie has this name,
/// and the `qg_` prefix has it stripped before the origin like the others.
const LANE_PREFIX: &str = "qg_lane.";

/// The names of a route's lane cookie without TLS and with it, made as
/// [`names`] makes the pass cookie's.
pub fn lane_names(route: &str, has_domain: bool) -> (String, String) {
    let plain = format!("{LANE_PREFIX}{route}");
    let tls = if has_domain {
        plain.clone()
    } else {
        format!("{HOST_PREFIX}{plain}")
    };
    (plain, tls)
}

/// The lane cookie's name for a request over TLS or not.
pub fn lane_name(route: &str, tls: bool, has_domain: bool) -> String {
    let (plain, secure) = lane_names(route, has_domain);
    if tls {
        secure
    } else {
        plain
    }
}

/// The credentials a request carries for one route.
#[derive(Default, Debug, Clone, Copy)]
pub struct Credentials {
    pub pass: Option<Claims>,
    pub ticket: Option<Claims>,
    /// A genuine lane cookie for the route, whatever its expiry and holder
    /// (both checked where it is used, as a pass's expiry is).
    pub lane: Option<LaneCookie>,
}

impl Credentials {
    /// The lane cookie while it is unexpired at `now_unix` and this
    /// visitor's own: bound to the id of the pass or the ticket the request
    /// carries (expired or not: a visitor whose session or place is gone
    /// arrives again in its lane). A copy sent with no ticket or pass, or
    /// with another visitor's, is nobody's here.
    pub fn own_lane(&self, now_unix: u64) -> Option<&LaneCookie> {
        let lane = self.lane.as_ref().filter(|c| now_unix < c.expires_unix)?;
        let Holder::Visitor(id) = lane.holder else {
            return None;
        };
        self.holds(&id).then_some(lane)
    }

    /// The lane cookie while it is unexpired at `now_unix` and still for its
    /// first arrival ([`Holder::First`]): whoever presents it first takes
    /// its one use.
    pub fn unclaimed_lane(&self, now_unix: u64) -> Option<&LaneCookie> {
        self.lane
            .as_ref()
            .filter(|c| now_unix < c.expires_unix && matches!(c.holder, Holder::First(_)))
    }

    /// The visitor id the request's pass, else its ticket, names: the
    /// visitor as the gate knows it.
    pub fn visitor(&self) -> Option<VisitorId> {
        self.pass.or(self.ticket).map(|c| c.id)
    }

    /// Whether the request's pass or ticket has id `id`.
    fn holds(&self, id: &VisitorId) -> bool {
        [self.pass, self.ticket]
            .iter()
            .flatten()
            .any(|claims| claims.id == *id)
    }
}

/// What a genuine lane cookie says (DESIGN §8.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneCookie {
    pub lane: LaneTag,
    /// Unix seconds; the cookie puts its holder in the lane before this.
    pub expires_unix: u64,
    /// Whose lane it is.
    pub holder: Holder,
}

/// Every `name=value` pair in the request's `Cookie` headers.
fn cookie_pairs(headers: &impl Headers) -> impl Iterator<Item = (&str, &str)> {
    headers
        .all(&COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            Some((name.trim(), value.trim()))
        })
}

/// The first valid pass and the first valid ticket the request carries for
/// `route` under cookie `name`, and the first genuine lane cookie under
/// `lane_name`. Invalid copies are ignored.
pub fn credentials(
    headers: &impl Headers,
    name: &str,
    lane_name: &str,
    ring: &KeyRing,
    route: &str,
) -> Credentials {
    let mut found = Credentials::default();
    for (n, value) in cookie_pairs(headers) {
        if n == lane_name && found.lane.is_none() {
            // Expiry is checked where the lane is used: the memo keeps this.
            if let GrantVerdict::Valid(grant) = lane_grant::verify_grant(ring, value, route, 0) {
                found.lane = LaneTag::new(grant.lane.as_str()).map(|lane| LaneCookie {
                    lane,
                    expires_unix: grant.expires_unix,
                    holder: grant.holder,
                });
            }
            continue;
        }
        if n != name {
            continue;
        }
        if let Verdict::Valid(claims) = ring.verify(value, route) {
            match claims.kind {
                Kind::Pass | Kind::NewPass | Kind::LocalPass if found.pass.is_none() => {
                    found.pass = Some(claims)
                }
                Kind::Ticket | Kind::PreTicket if found.ticket.is_none() => {
                    found.ticket = Some(claims)
                }
                _ => {}
            }
        }
    }
    found
}

/// A connection's last `Cookie` header and the credentials read from it for
/// one route. A browser sends the same cookies with every request on a
/// keep-alive connection (and on every HTTP/2 stream), so their MACs are
/// checked when the header changes instead of on every request. The key is
/// the header's exact bytes, the route, TLS (which picks the cookie name) and
/// the settings generation (a reload may bring another key ring), so a
/// remembered answer is the one checking again would give. Expiry and the
/// store are still consulted per request. A header longer than
/// [`CookieMemo::MAX_KEPT`] is checked every time rather than kept on an idle
/// connection.
#[derive(Default)]
pub struct CookieMemo(Mutex<Option<Memo>>);

struct Memo {
    generation: u64,
    route: usize,
    tls: bool,
    cookie: Vec<u8>,
    found: Credentials,
}

impl CookieMemo {
    /// The longest `Cookie` header remembered, in bytes.
    pub const MAX_KEPT: usize = 2048;

    /// `verify()` (which reads `headers` for route `route` of settings
    /// `generation`), remembered for the next request whose single `Cookie`
    /// header is the same under the same key.
    pub fn read(
        &self,
        generation: u64,
        route: usize,
        tls: bool,
        headers: &impl Headers,
        verify: impl FnOnce() -> Credentials,
    ) -> Credentials {
        let mut values = headers.all(&COOKIE);
        let (Some(cookie), None) = (values.next(), values.next()) else {
            // No cookies: nothing to check. Several headers: rare, not kept.
            return verify();
        };
        if cookie.len() > Self::MAX_KEPT {
            return verify();
        }
        let cookie = cookie.as_bytes();
        let mut memo = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = memo.as_ref() {
            if m.generation == generation && m.route == route && m.tls == tls && m.cookie == cookie
            {
                return m.found;
            }
        }
        let found = verify();
        match memo.as_mut() {
            Some(m) => {
                m.generation = generation;
                m.route = route;
                m.tls = tls;
                m.cookie.clear();
                m.cookie.extend_from_slice(cookie);
                m.found = found;
            }
            None => {
                *memo = Some(Memo {
                    generation,
                    route,
                    tls,
                    cookie: cookie.to_vec(),
                    found,
                })
            }
        }
        found
    }
}

/// The `Cookie` headers of a request forwarded ungated, kept past
/// forwarding (which strips queuegate's own): who the visitor is on each
/// route, should the origin's answer name a lane (DESIGN §8.5). Only headers
/// that may hold one of queuegate's cookies are kept, and kept by reference
/// to the request's bytes: nothing is allocated unless the request split its
/// cookies over several headers (HTTP/2), or until the origin names a lane.
#[derive(Default)]
pub struct KeptCookies {
    first: Option<HeaderValue>,
    rest: Vec<HeaderValue>,
}

impl KeptCookies {
    pub fn of(headers: &impl Headers) -> KeptCookies {
        let mut kept = KeptCookies::default();
        if carries_own(headers) {
            let mut values = headers.all(&COOKIE).cloned();
            kept.first = values.next();
            kept.rest.extend(values);
        }
        kept
    }

    /// The visitor id of the pass, else the ticket, the request carried
    /// for `route` under cookie `name` (its lane cookie is `lane_name`),
    /// verified with `ring`.
    pub fn visitor(
        &self,
        name: &str,
        lane_name: &str,
        ring: &KeyRing,
        route: &str,
    ) -> Option<VisitorId> {
        let first = self.first.as_ref()?;
        let mut headers = Fields::new();
        for value in std::iter::once(first).chain(&self.rest) {
            headers.append(COOKIE, value.clone());
        }
        credentials(&headers, name, lane_name, ring, route).visitor()
    }
}

/// Whether any `Cookie` header may hold one of queuegate's cookies.
fn carries_own(headers: &impl Headers) -> bool {
    headers
        .all(&COOKIE)
        .any(|v| memchr::memmem::find(v.as_bytes(), COOKIE_PREFIX.as_bytes()).is_some())
}

/// Removes queuegate's own cookies from the `Cookie` headers, so the origin
/// never sees them.
pub fn strip_own_cookies(headers: &mut impl Headers) {
    if !carries_own(headers) {
        return;
    }
    // One string for what is kept; nothing is allocated when only our own
    // cookies were sent.
    let mut kept = String::new();
    let pairs = headers
        .all(&COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim);
    for pair in pairs {
        let name = pair.split_once('=').map_or(pair, |(n, _)| n).trim();
        if pair.is_empty() || is_own_cookie(name) {
            continue;
        }
        if !kept.is_empty() {
            kept.push_str("; ");
        }
        kept.push_str(pair);
    }
    headers.take_out(&COOKIE);
    if !kept.is_empty() {
        if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(kept)) {
            headers.put(COOKIE, v);
        }
    }
}

fn is_own_cookie(name: &str) -> bool {
    let name = name.strip_prefix(HOST_PREFIX).unwrap_or(name);
    name.starts_with(COOKIE_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lane_grant::Lane;
    use http::HeaderMap;

    fn claims(kind: Kind, id: VisitorId) -> Claims {
        Claims {
            kind,
            id,
            t: 1,
            at: None,
            key_index: 0,
            lane: None,
        }
    }

    #[test]
    fn a_lane_cookie_is_its_own_visitors_only_before_it_expires() {
        let (mine, theirs) = ([1; 16], [2; 16]);
        let bound = LaneCookie {
            lane: LaneTag::new("vip").unwrap(),
            expires_unix: 1_000,
            holder: Holder::Visitor(mine),
        };
        let with = |pass: Option<VisitorId>, ticket: Option<VisitorId>, lane| Credentials {
            pass: pass.map(|id| claims(Kind::Pass, id)),
            ticket: ticket.map(|id| claims(Kind::Ticket, id)),
            lane: Some(lane),
        };
        for (pass, ticket) in [
            (Some(mine), None),
            (None, Some(mine)),
            (Some(theirs), Some(mine)),
        ] {
            let creds = with(pass, ticket, bound);
            assert_eq!(creds.own_lane(999), Some(&bound));
            assert_eq!(creds.own_lane(1_000), None);
            assert_eq!(creds.own_lane(u64::MAX), None);
            assert_eq!(creds.unclaimed_lane(999), None);
        }
        for (pass, ticket) in [(None, None), (Some(theirs), None), (None, Some(theirs))] {
            assert_eq!(with(pass, ticket, bound).own_lane(999), None);
        }
        let first = LaneCookie {
            holder: Holder::First(mine),
            ..bound
        };
        for (pass, ticket) in [(None, None), (Some(mine), None), (None, Some(theirs))] {
            let creds = with(pass, ticket, first);
            assert_eq!(creds.own_lane(999), None);
            assert_eq!(creds.unclaimed_lane(999), Some(&first));
            assert_eq!(creds.unclaimed_lane(1_000), None);
        }
        assert_eq!(
            with(Some(theirs), Some(mine), bound).visitor(),
            Some(theirs)
        );
        assert_eq!(with(None, Some(mine), bound).visitor(), Some(mine));
    }

    #[test]
    fn own_cookies_are_stripped_and_others_kept() {
        let mut h = HeaderMap::new();
        h.append(
            COOKIE,
            HeaderValue::from_static("a=1; qg_tickets=v1.x; b=2"),
        );
        h.append(COOKIE, HeaderValue::from_static("__Host-qg_tickets=v1.y"));
        strip_own_cookies(&mut h);
        let all: Vec<_> = h.get_all(COOKIE).iter().collect();
        assert_eq!(all, vec!["a=1; b=2"]);
        let mut h = HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("qg_a=1"));
        strip_own_cookies(&mut h);
        assert!(h.get(COOKIE).is_none());
    }

    #[test]
    fn lane_cookies_are_named_apart_from_every_pass_cookie() {
        assert_eq!(
            lane_names("tickets", false),
            (
                "qg_lane.tickets".to_owned(),
                "__Host-qg_lane.tickets".to_owned()
            )
        );
        assert_eq!(lane_name("tickets", true, true), "qg_lane.tickets");
        // A route called `lane_tickets` has its own pass cookie.
        assert_ne!(
            names("lane_tickets", false).0,
            lane_names("tickets", false).0
        );
        let mut h = HeaderMap::new();
        h.append(
            COOKIE,
            HeaderValue::from_static("a=1; qg_lane.tickets=v1.g; __Host-qg_lane.x=v1.g"),
        );
        strip_own_cookies(&mut h);
        assert_eq!(h[COOKIE], "a=1");
    }

    #[test]
    fn a_lane_cookie_set_reads_back_for_its_route_only() {
        let ring = match KeyRing::new(vec![("k1".into(), vec![1; 32])]) {
            Ok(ring) => ring,
            Err(err) => panic!("{err}"),
        };
        let vip = Lane::new("vip").unwrap_or_else(|| panic!("vip is a lane name"));
        let holder = Holder::Visitor([3; 16]);
        let set = Jar::new(&ring, None).lane("tickets", &vip, &holder, 1_000, 4_600, true);
        let text = set.to_str().unwrap_or_default();
        assert!(
            text.starts_with("__Host-qg_lane.tickets=v1.g.tickets.vip.4600."),
            "{text}"
        );
        for attribute in [
            "; Path=/",
            "; Max-Age=3600",
            "; HttpOnly",
            "; SameSite=Lax",
            "; Secure",
        ] {
            assert!(text.contains(attribute), "{text}");
        }
        let value = text.split(';').next().unwrap_or_default();
        let mut h = HeaderMap::new();
        h.append(
            COOKIE,
            HeaderValue::from_str(&format!("__Host-qg_lane.tickets=junk; {value}"))
                .unwrap_or_else(|err| panic!("{err}")),
        );
        let read = |name: &str, route: &str| credentials(&h, "qg_tickets", name, &ring, route).lane;
        let name = lane_name("tickets", true, false);
        let lane = read(&name, "tickets").unwrap_or_else(|| panic!("read back"));
        assert_eq!(lane.lane.as_str(), "vip");
        assert_eq!((lane.expires_unix, lane.holder), (4_600, holder));
        assert!(read(&name, "other").is_none());
        assert!(read(&lane_name("tickets", false, false), "tickets").is_none());
    }

    #[test]
    fn names_follow_the_host_prefix_rule() {
        assert_eq!(
            names("tickets", false),
            ("qg_tickets".to_owned(), "__Host-qg_tickets".to_owned())
        );
        assert_eq!(
            names("tickets", true),
            ("qg_tickets".to_owned(), "qg_tickets".to_owned())
        );
    }
}
