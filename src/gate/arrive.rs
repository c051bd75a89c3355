//! A newcomer (no usable ticket or pass): the lane it arrives in (an
//! invite's, its lane cookie's, or the route's first), admitted at once or
//! queued there; invites and their uses.

use http::header::HeaderValue;

use super::{Admitted, By, Decided, Decision, Gate, LaneGrant, Requester};
use crate::admission::{self, Kind, VisitorId};
use crate::config::{Mode, OnStoreError};
use crate::cookie::{Credentials, LaneCookie};
use crate::lane_grant::{self, Holder, InviteVerdict, Lane, LANE_COOKIE_TTL};
use crate::queue::{Arrival, InviteUse, QueueStore, StoreError};
use crate::route::{RouteRt, Settings};

impl Gate {
    /// No usable ticket or pass: arrive in the lane an invite gave, or the
    /// lane of the visitor's own lane cookie, or (the store counting its
    /// one use) of one for its first arrival; else in the route's first.
    /// A lane cookie that put the visitor in its lane is bound to the
    /// ticket or pass it gets, with its expiry kept.
    pub(super) async fn arrive_in_lane(
        &self,
        s: &Settings,
        route: &RouteRt,
        who: Requester<'_>,
        creds: &Credentials,
    ) -> Decided {
        let grant = match who.invited {
            Some(grant) => Some(grant),
            None => self.granted_lane(route, creds).await,
        };
        let id = admission::new_visitor_id();
        let decision = self
            .arrive(s, route, who, grant.map_or(0, |g| g.lane), id)
            .await;
        // Only a ticket or pass made now carries the id.
        let minted = matches!(
            decision,
            Decision::Admit {
                session: Some(_),
                ..
            } | Decision::Wait { .. }
                | Decision::PreQueue { .. }
        );
        let lane_cookie = grant
            .filter(|_| minted)
            .and_then(|grant| self.lane_cookie(s, route, grant, &id, who.tls));
        Decided {
            decision,
            lane_cookie,
        }
    }

    /// The lane the visitor's lane cookie puts an arrival in: its own
    /// (bound to the ticket or pass it sends), or one for its first arrival
    /// whose one use the store lets this arrival take (when the store
    /// cannot count it, nobody gets the lane). A lane the route does not
    /// have puts nobody anywhere.
    async fn granted_lane(&self, route: &RouteRt, creds: &Credentials) -> Option<LaneGrant> {
        let now = self.clock.now_s();
        let grant = |cookie: &LaneCookie| {
            let lane = route.limits.lanes.index_of(cookie.lane.as_str())?;
            Some(LaneGrant {
                lane,
                until_unix: cookie.expires_unix,
            })
        };
        if let Some(own) = creds.own_lane(now) {
            return grant(own);
        }
        let cookie = creds.unclaimed_lane(now)?;
        let lane = grant(cookie)?;
        let Holder::First(nonce) = cookie.holder else {
            return None;
        };
        // One arrival takes it, as a one-use invite.
        self.take_use(route, &nonce, 1, cookie.expires_unix, now)
            .await
            .then_some(lane)
    }

    /// The `Set-Cookie` value that binds `grant` to visitor `id`. (The
    /// route's lane names are checked with the config; should one not be a
    /// lane name, there is no cookie.)
    pub(super) fn lane_cookie(
        &self,
        s: &Settings,
        route: &RouteRt,
        grant: LaneGrant,
        id: &VisitorId,
        tls: bool,
    ) -> Option<HeaderValue> {
        let lane = Lane::new(&route.limits.lanes.get(grant.lane).name)?;
        let holder = Holder::Visitor(*id);
        let now = self.clock.now_s();
        Some(
            s.jar()
                .lane(route.name(), &lane, &holder, now, grant.until_unix, tls),
        )
    }

    /// No usable cookie: admit at once or join the line, in lane `lane`, as
    /// visitor `id` (fresh).
    pub async fn arrive(
        &self,
        s: &Settings,
        route: &RouteRt,
        who: Requester<'_>,
        lane: usize,
        id: VisitorId,
    ) -> Decision {
        // Before the opening nobody is let in at once (the store checks it
        // too, by its own clock), and a place is a pre-queue ticket.
        let opening = route.opening_ahead(self.clock.now_us());
        let admit_now = route.cfg.mode == Mode::Gate && opening.is_none();
        let arrived = self
            .lines
            .arrive(route, &id, who.client, admit_now, lane)
            .await;
        let (arrival, granted) = match arrived {
            // Unconfirmed until the visitor comes back with the pass.
            Ok((a, By::Shared)) => (a, Kind::NewPass),
            // The local line confirms it on the visitor's return, and the
            // store takes it back once it answers again.
            Ok((a, By::Local)) => (a, Kind::LocalPass),
            Err(err) => return self.store_failed(route, &err),
        };
        match arrival {
            Arrival::Admitted => {
                if granted == Kind::LocalPass {
                    route.live.note_granted_locally();
                }
                Decision::Admit {
                    how: Admitted::AtOnce,
                    set_cookie: Some(self.pass_cookie(s, route, &id, granted, who.tls)),
                    session: Some(id),
                }
            }
            Arrival::Waiting(place) => {
                let kind = match opening {
                    Some(_) => Kind::PreTicket,
                    None => Kind::Ticket,
                };
                let set_cookie = Some(self.place_cookie(
                    s,
                    route,
                    kind,
                    &id,
                    place.score_us,
                    None,
                    place.lane,
                    who.tls,
                ));
                match opening {
                    Some(opens_at_us) => Decision::PreQueue {
                        opens_at_us,
                        opens_in_ms: opens_at_us
                            .saturating_sub(self.clock.now_us())
                            .div_ceil(1_000),
                        lane: place.lane,
                        set_cookie,
                    },
                    None => Decision::Wait { place, set_cookie },
                }
            }
            Arrival::Full { waiting_total } => Decision::Full { waiting_total },
            Arrival::TooMany { retry_after } => Decision::TooMany { retry_after },
        }
    }

    /// The answer when no line could take a request: by the route's
    /// `on_store_error`, let it through without a pass or refuse it.
    pub(super) fn store_failed(&self, route: &RouteRt, err: &StoreError) -> Decision {
        tracing::warn!(route = route.name(), error = %err, policy = ?route.cfg.on_store_error, "store unavailable");
        match route.cfg.on_store_error {
            OnStoreError::Open => Decision::Admit {
                how: Admitted::FailOpen,
                set_cookie: None,
                session: None,
            },
            OnStoreError::Closed | OnStoreError::Local => Decision::Unavailable,
        }
    }

    /// An invite token a request to `route` carried (DESIGN §8.5): when it
    /// is genuine, unexpired, for this route and one of its lanes, and (with
    /// `--uses`) one of its uses is left, the lane it puts the visitor in.
    /// Anything else is no invite: never an error page. The lane cookie
    /// given for it (by [`Gate::decide`], bound to the visitor's ticket or
    /// pass) ends with the invite at the latest. A visitor whose own lane
    /// cookie already names the lane does not use the token up again; when
    /// the store cannot count a use, the invite is not honoured (one more
    /// visitor in the lane than the token allows would be).
    pub async fn take_invite(
        &self,
        s: &Settings,
        route: &RouteRt,
        token: &str,
        creds: &Credentials,
    ) -> Option<LaneGrant> {
        let now = self.clock.now_s();
        let invite = match lane_grant::verify_invite(&s.ring, token, route.name(), now) {
            InviteVerdict::Valid(invite) => invite,
            InviteVerdict::Invalid(reject) => {
                tracing::debug!(route = route.name(), ?reject, "invite ignored");
                return None;
            }
        };
        let lane = route.limits.lanes.index_of(invite.lane.as_str())?;
        let held = creds
            .own_lane(now)
            .is_some_and(|c| c.lane.as_str() == invite.lane.as_str());
        let uses = u32::try_from(invite.uses).unwrap_or(u32::MAX);
        if invite.uses > 0
            && !held
            && !self
                .take_use(route, &invite.nonce, uses, invite.expires_unix, now)
                .await
        {
            return None;
        }
        let until_unix = invite
            .expires_unix
            .min(now.saturating_add(LANE_COOKIE_TTL.as_secs()));
        Some(LaneGrant { lane, until_unix })
    }

    /// Takes one of the `uses` of the invite (or first-arrival lane cookie)
    /// `nonce`, valid until `expires_unix`, in the store: whether it is
    /// honoured. One this instance saw used up is refused without asking
    /// (it stays used up past a loss of the store), and its last use is
    /// remembered so. A store that cannot count it honours nothing.
    async fn take_use(
        &self,
        route: &RouteRt,
        nonce: &[u8],
        uses: u32,
        expires_unix: u64,
        now_s: u64,
    ) -> bool {
        if route.live.is_invite_used_up(nonce, now_s) {
            tracing::debug!(route = route.name(), "invite used up");
            return false;
        }
        let taken = self
            .lines
            .shared
            .take_use(route.name(), nonce, uses, expires_unix)
            .await;
        match taken {
            Ok(taken) => {
                if taken != InviteUse::Taken {
                    route.live.invite_used_up(nonce, now_s, expires_unix);
                }
                if !taken.honoured() {
                    tracing::debug!(route = route.name(), "invite used up");
                }
                taken.honoured()
            }
            Err(err) => {
                tracing::debug!(route = route.name(), error = %err, "invite use not counted");
                false
            }
        }
    }
}
