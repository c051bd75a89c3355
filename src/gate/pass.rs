//! A pass: forwarded while fresh, renewed through the store past half its
//! life (or locally while the store is down), and the admit-now sessions
//! this instance saw confirmed. The pass cookie, from the cookie jar.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use http::header::HeaderValue;

use super::{Admitted, Decision, Gate, Requester};
use crate::admission::{Claims, Kind, PassLife, VisitorId};
use crate::queue::{PassTimes, QueueStore};
use crate::route::{RouteRt, Settings};

impl Gate {
    /// A pass: forward while fresh; past half its life, or on the first
    /// return of an admit-now pass (which confirms the session, DESIGN §8.3),
    /// or when the store was lost since it was issued, or when it was granted
    /// locally (the store takes that session back), renew it through the
    /// store. An admit-now pass this instance saw confirmed is forwarded
    /// like a confirmed one while fresh (a client that keeps its first cookie
    /// costs no store call per request). `None` means the session is gone:
    /// treat as no cookie.
    pub async fn check_pass(
        &self,
        s: &Settings,
        route: &RouteRt,
        pass: &Claims,
        who: Requester<'_>,
    ) -> Option<Decision> {
        let now_s = self.clock.now_s();
        let times = pass_times(pass, route.limits.pass_ttl.as_secs());
        let epoch_ms = route.live.epoch_us() / 1_000;
        let before_epoch = epoch_ms > 0 && times.issued_ms < epoch_ms;
        let fresh = pass.pass_life(now_s, route.limits.pass_ttl) == PassLife::Fresh;
        // Only an admit-now pass looks its session up: the confirmed path
        // takes no lock.
        let confirmed = pass.kind == Kind::Pass
            || (pass.kind == Kind::NewPass && self.confirmed.holds(&pass.id, now_s));
        if fresh && confirmed && !before_epoch {
            if route.live.has_ended(&pass.id, now_s) {
                return None;
            }
            return Some(Decision::Admit {
                how: Admitted::Pass,
                set_cookie: None,
                session: Some(pass.id),
            });
        }
        // A session that ended is not renewed, nor restored by a store that
        // lost its tombstone, nor renewed locally while the store is down.
        if route.live.has_ended(&pass.id, now_s) {
            return None;
        }
        let renewed = Box::pin(self.lines.shared.renew(
            route.name(),
            &pass.id,
            who.client,
            times,
            &route.limits_now(),
        ))
        .await;
        let (how, kind) = match renewed {
            Ok(true) => {
                if fresh && pass.kind == Kind::NewPass {
                    self.confirmed.note(pass.id, pass.t, now_s);
                }
                (Admitted::Renewed, Kind::Pass)
            }
            Ok(false) => return None,
            Err(err) => {
                // Admitted visitors never depend on the store, but a pass long
                // past its session is not revived.
                if now_s > pass.t + route.limits.session_ttl.as_secs() {
                    return None;
                }
                tracing::debug!(route = route.name(), error = %err, "pass renewed locally");
                (
                    Admitted::RenewedLocally,
                    self.renew_locally(route, pass, times, who).await,
                )
            }
        };
        Some(Decision::Admit {
            how,
            set_cookie: Some(self.pass_cookie(s, route, &pass.id, kind, who.tls)),
            session: Some(pass.id),
        })
    }

    /// The kind of pass to give a holder the store could not renew: any
    /// confirmed session gets an `l` pass, which the store takes back once
    /// it answers again; an admit-now pass the store granted stays
    /// unconfirmed (the store has not seen this return). A session the local
    /// line granted is renewed there too, which confirms it on its first
    /// return and keeps it counted against the local capacity.
    async fn renew_locally(
        &self,
        route: &RouteRt,
        pass: &Claims,
        times: PassTimes,
        who: Requester<'_>,
    ) -> Kind {
        if pass.kind == Kind::LocalPass {
            self.lines
                .renew_local(route, &pass.id, who.client, times)
                .await;
        }
        if times.confirmed {
            Kind::LocalPass
        } else {
            Kind::NewPass
        }
    }

    /// A fresh pass of `kind` for `id`, as a `Set-Cookie` value: confirmed
    /// (`a`), the `n` pass of an admit-now session the visitor has not come
    /// back to, or the `l` pass of a session granted without the store.
    pub fn pass_cookie(
        &self,
        s: &Settings,
        route: &RouteRt,
        id: &VisitorId,
        kind: Kind,
        tls: bool,
    ) -> HeaderValue {
        s.jar().pass(
            route.cookie_name(tls),
            route.name(),
            id,
            kind,
            self.clock.now_us(),
            route.limits.pass_ttl.as_secs(),
            route.limits.session_ttl.as_secs(),
            tls,
        )
    }
}

/// The sessions this instance saw confirmed on the return of their
/// admit-now (`n`) pass (DESIGN §8.3), each kept until that pass expires: a
/// client that keeps sending the `n` pass (a script, a load tool) is then
/// answered as one with the confirmed pass would be, without a store call,
/// until the pass's half-life, on any connection. Ending a session is
/// checked as for a confirmed pass (`RouteLive::has_ended`). Kept per
/// instance, not per connection, since such clients open new connections;
/// bounded, since only a confirmation (one store call) adds an entry: when
/// full, a confirmation is not remembered and that pass is renewed through
/// the store as before.
#[derive(Default)]
pub(super) struct Confirmed(Mutex<ConfirmedIds>);

#[derive(Default)]
struct ConfirmedIds {
    /// Session id → the `n` pass's expiry (unix s).
    until: HashMap<VisitorId, u64>,
    /// When expired entries were last dropped (unix s).
    pruned_s: u64,
}

impl Confirmed {
    /// The most sessions remembered (a few megabytes at most).
    const MAX_KEPT: usize = 65_536;

    /// Notes session `id` confirmed on an `n` pass that expires at
    /// `expiry_s`.
    pub(super) fn note(&self, id: VisitorId, expiry_s: u64, now_s: u64) {
        let mut ids = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if ids.until.len() >= Self::MAX_KEPT && ids.pruned_s != now_s {
            // At most once a second, so a full memory stays cheap to add to.
            ids.pruned_s = now_s;
            ids.until.retain(|_, until| *until > now_s);
        }
        if ids.until.len() < Self::MAX_KEPT {
            ids.until.insert(id, expiry_s);
        }
    }

    /// Whether session `id` was confirmed and the `n` pass that confirmed it
    /// has not expired at `now_s`.
    pub(super) fn holds(&self, id: &VisitorId, now_s: u64) -> bool {
        let ids = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        ids.until.get(id).is_some_and(|&until| until > now_s)
    }
}

/// What a pass tells the store's restore rules: when it was issued (ms),
/// whether its session was confirmed, and whether it was granted locally. A pass signed before passes carried
/// their issue time is taken as issued at the last millisecond of its
/// second, so one issued in the same second as a store's epoch is never
/// taken for one issued before it.
fn pass_times(pass: &Claims, pass_ttl_s: u64) -> PassTimes {
    let issued_ms = pass.at.unwrap_or_else(|| {
        pass.t
            .saturating_sub(pass_ttl_s)
            .saturating_add(1)
            .saturating_mul(1_000)
            .saturating_sub(1)
    });
    PassTimes {
        issued_ms,
        confirmed: matches!(pass.kind, Kind::Pass | Kind::LocalPass),
        granted_locally: pass.kind == Kind::LocalPass,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confirmation_is_kept_until_its_pass_expires_and_the_memory_is_bounded() {
        let confirmed = Confirmed::default();
        confirmed.note([1; 16], 100, 50);
        assert!(confirmed.holds(&[1; 16], 99));
        assert!(!confirmed.holds(&[1; 16], 100));
        assert!(!confirmed.holds(&[2; 16], 50));
        // Full of live entries: a new one is not kept, the old ones are.
        for i in 0..Confirmed::MAX_KEPT as u32 {
            let mut id = [0; 16];
            id[..4].copy_from_slice(&i.to_le_bytes());
            id[15] = 9;
            confirmed.note(id, 1_000, 60);
        }
        confirmed.note([3; 16], 1_000, 60);
        assert!(!confirmed.holds(&[3; 16], 60));
        assert!(confirmed.holds(&[1; 16], 60));
        // Once they expire, there is room again.
        confirmed.note([3; 16], 2_000, 1_000);
        assert!(confirmed.holds(&[3; 16], 1_500));
        assert!(!confirmed.holds(&[1; 16], 1_000));
    }
}
