//! The first phase of a request: what it is for. Its framing is checked,
//! any invite is taken out of its target, its host is checked, and every
//! reading of its path is placed: queuegate's own paths, bypassed, ungated
//! or a gated route, or refused (DESIGN §8.1, §9.6).

use crate::client_request::ClientRequest;

use crate::config::AmbiguousPaths;
use crate::proxy;
use crate::response::RequestError;
use crate::route::Settings;
use crate::{host, lane_grant, path};

use super::App;

/// Where a screened request goes.
pub(super) enum Target {
    /// Refused before anything else reads it.
    Refused(RequestError),
    /// One of queuegate's own paths, with the invite the target carried.
    Reserved { invite: Option<String> },
    /// Bypassed, for `host` (see [`lane_host`]).
    Bypass { host: Option<String> },
    /// For no route, for `host` (see [`lane_host`]).
    Ungated { host: Option<String> },
    /// For gated route `index`, `exit` when for one of the route's exit
    /// paths, with the invite the target carried.
    Gated {
        index: usize,
        exit: bool,
        invite: Option<String>,
    },
}

impl App {
    /// Where `req` goes under settings `s`. A head whose framing is
    /// ambiguous reaches here with its fields as sent, for the header check
    /// to refuse. Any invite is taken out of `req`'s target, whatever the
    /// target turns out to be.
    pub(super) fn screen(&self, s: &Settings, req: &mut ClientRequest) -> Target {
        if let Err(err) = proxy::check_request(req) {
            return Target::Refused(err);
        }
        // An invite is the gate's alone (DESIGN §8.5): taken out of the
        // target before anything reads it, so that no request reaches the
        // origin with it, whatever path it takes, and no `return` path
        // carries it.
        let (invite, target) = lane_grant::take_invite(std::mem::take(req.uri_mut()));
        *req.uri_mut() = target;
        let host = match host::request_host(req.version(), req.headers(), req.uri()) {
            Ok(host) => host,
            Err(err) => return Target::Refused(RequestError::BadHost(err)),
        };
        if !self.allowed_hosts.is_empty()
            && !host
                .as_deref()
                .is_some_and(|h| self.allowed_hosts.iter().any(|p| p.matches(h)))
        {
            return Target::Refused(RequestError::HostNotAllowed);
        }
        let path = req.uri().path();
        if s.is_reserved(path) {
            return Target::Reserved { invite };
        }
        // Bypass rules and routes see every reading of the path an origin
        // could make (DESIGN §8.1): bypassed only if every reading is,
        // gated if any reading is. `/static/../tickets` and
        // `/tickets;x=1` are gated like `/tickets`. Readings in two places
        // make the path ambiguous (§9.6); in two routes, no one route can
        // gate it.
        let readings = path::Readings::of(path);
        let placing = s.place(req.method(), host.as_deref(), &readings);
        let ambiguous = readings.is_ambiguous() || placing.disputed;
        if placing.split || (ambiguous && self.ambiguous_paths == AmbiguousPaths::Reject) {
            return Target::Refused(RequestError::AmbiguousPath);
        }
        if !ambiguous && placing.bypassed {
            let host = lane_host(s, host.as_deref());
            return Target::Bypass { host };
        }
        let Some(index) = placing.route else {
            let host = lane_host(s, host.as_deref());
            return Target::Ungated { host };
        };
        let exit = s.routes[index].is_exit(&readings);
        Target::Gated {
            index,
            exit,
            invite,
        }
    }
}

/// The host a lane named on an ungated answer is recorded under: `None`
/// when no route has a host rule (every route then fits, and nothing is
/// copied), else the request's.
fn lane_host(s: &Settings, host: Option<&str>) -> Option<String> {
    s.routes
        .iter()
        .any(|r| r.cfg.matcher.host.is_some())
        .then(|| host.map(str::to_owned))
        .flatten()
}
