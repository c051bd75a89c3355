//! The second phase of a gated request that carries an invite (DESIGN
//! §8.5): the invite redeemed, and a browser following an invite link sent
//! on without it.

use crate::client_request::ClientRequest;
use crate::message::Answer;
use http::header::SET_COOKIE;

use crate::cookie::Credentials;
use crate::gate::{LaneGrant, Requester};
use crate::response::{self, Body};
use crate::route::{RouteRt, Settings};
use crate::waiting::return_to;

use super::App;

impl App {
    /// Redeems the invite `token` a request to `route` carried, if any, for
    /// the visitor `creds` name: the lane it puts the visitor in. The gate
    /// binds the lane cookie given for it to the visitor's ticket or pass.
    pub(super) async fn redeem(
        &self,
        s: &Settings,
        route: &RouteRt,
        token: Option<&str>,
        creds: Option<&Credentials>,
    ) -> Option<LaneGrant> {
        match (token, creds) {
            // Boxed: store calls' futures are large (see `Gate::decide`).
            (Some(token), Some(c)) => Box::pin(self.gate.take_invite(s, route, token, c)).await,
            _ => None,
        }
    }

    /// The answer to a browser following an invite link (DESIGN §8.5): sent
    /// on to the same target without it, so the token leaves the address
    /// bar (and later `Referer`s) at once. A valid invite is decided on
    /// first, so that the lane cookie is bound to the ticket or pass this
    /// answer leaves the visitor with: a ticket held moves to the lane,
    /// keeping its place in time, and a visitor who holds none joins the
    /// lane (or is let in) now.
    pub(super) async fn follow_invite(
        &self,
        s: &Settings,
        index: usize,
        req: &ClientRequest,
        who: Requester<'_>,
        creds: Option<Credentials>,
    ) -> Answer<Body> {
        let target = req.uri().path_and_query().map_or("/", |t| t.as_str());
        let mut resp = response::redirect("invite", &return_to::sanitize(target));
        if who.invited.is_some() {
            let decided = self
                .gate
                .decide(s, index, who, || creds.unwrap_or_default())
                .await;
            let cookies = decided.decision.into_set_cookie();
            for cookie in cookies.into_iter().chain(decided.lane_cookie) {
                resp.headers_mut().append(SET_COOKIE, cookie);
            }
        }
        resp
    }
}
