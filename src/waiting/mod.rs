//! The waiting room's endpoints under the reserved prefix: the waiting page
//! (a countdown before a route's opening), the status JSON (a poll is a
//! heartbeat), its event stream (`events`) and leave; and the answers a held
//! back request (or one whose session made its `max_requests_per_session`
//! requests) gets: `302` to the page for a navigation, JSON for the rest.

pub mod events;
pub mod page;
pub mod return_to;
mod standing;

use crate::client_request::ClientRequest;
use crate::message::Answer;
use http::header::{self, HeaderName, HeaderValue, ACCEPT, ACCEPT_LANGUAGE, SET_COOKIE};
use http::{Method, StatusCode};
use rand::Rng;

use crate::cookie::CookieMemo;
use crate::fields::Headers;
use crate::gate::{Decided, Decision, Gate, Requester};
use crate::queue::Place;
use crate::response::{self, Body};
use crate::route::{RouteRt, Settings};
use events::Streams;
use page::{Lang, PageState, PageView, WaitingQuery};
use standing::Standing;

/// The poll interval an answer without a place suggests.
const IDLE_POLL_MS: u64 = 5_000;

static X_REQUESTED_WITH: HeaderName = HeaderName::from_static("x-requested-with");
static SEC_FETCH_MODE: HeaderName = HeaderName::from_static("sec-fetch-mode");

/// A navigation gets the waiting page; anything else gets JSON.
pub fn is_navigation(method: &Method, headers: &impl Headers) -> bool {
    if method != Method::GET && method != Method::HEAD {
        return false;
    }
    if headers.has(&X_REQUESTED_WITH) {
        return false;
    }
    let accept = headers
        .first(&ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("application/json") {
        return false;
    }
    match headers.first(&SEC_FETCH_MODE) {
        Some(mode) => mode == "navigate",
        None => accept.contains("text/html"),
    }
}

/// How long a waiter should wait before polling again: about a second near the
/// head, up to eight far back, with ±20 % jitter, and never more than a third
/// of `abandon_after` or of `arrival_grace` (jitter included): a polling
/// waiter, or an app that obeys the `Retry-After` derived from it, is never
/// taken for a ghost, and when the admitter lets it in (which can happen far
/// from the head when many slots free at once) its next poll comes before the
/// arrival grace runs out, so it is not counted a no-show. While the local
/// line answers for the store (and until the admitter reaches it again),
/// everyone polls about every second: once the store is back, each waiter
/// is back in its line within a second, at its place, before positions are
/// read from it again.
pub fn poll_after_ms(route: &RouteRt, position: u64) -> u64 {
    let base = if route.live.answered_locally() {
        1_000
    } else {
        (1_000 + position.saturating_sub(1) * 40).min(8_000)
    };
    let cap = poll_cap_ms(route);
    let jitter = rand::rng().random_range(0.8..1.2);
    (((base as f64) * jitter) as u64).min(cap)
}

/// How long a pre-queue waiter should wait before polling again, the
/// opening `opens_in_ms` away (DESIGN §8.7): until a random 0.1 to 2 s
/// after the opening, so the crowd does not poll in step at the opening
/// and everyone has polled within about 2 s after it; while the opening is
/// further off than [`poll_after_ms`]'s cap, about that cap, so the waiter
/// is never taken for a ghost.
pub fn prequeue_poll_after_ms(route: &RouteRt, opens_in_ms: u64) -> u64 {
    let cap = poll_cap_ms(route);
    let mut rng = rand::rng();
    let after_opening = opens_in_ms.saturating_add(rng.random_range(100..2_000));
    if after_opening <= cap {
        after_opening
    } else {
        ((cap as f64) * rng.random_range(0.8..1.0)) as u64
    }
}

/// The longest a waiter is told to wait before polling: a third of
/// `abandon_after` or `arrival_grace`, whichever is shorter (at least 250 ms).
fn poll_cap_ms(route: &RouteRt) -> u64 {
    let patience = route.limits.abandon_after.min(route.limits.arrival_grace);
    (patience.as_millis() as u64 / 3).max(250)
}

/// The waiting page's query for a request to `route` held back: it brings
/// the visitor back to the page asked for; `start` is the place to show at
/// once, if known.
fn page_query(route: &RouteRt, req: &ClientRequest, start: Option<u64>) -> WaitingQuery {
    WaitingQuery {
        route: route.name().to_owned(),
        return_path: req
            .uri()
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_owned(),
        lang: None,
        start,
    }
}

fn waiting_path(s: &Settings) -> String {
    format!("{}/waiting", s.reserved_prefix)
}

fn status_url(s: &Settings, route: &str) -> String {
    format!("{}/status?route={route}", s.reserved_prefix)
}

/// The answer to a request the gate did not let through.
pub fn held_back(
    s: &Settings,
    route: &RouteRt,
    req: &ClientRequest,
    decision: Decision,
) -> Answer<Body> {
    let set_cookie = match &decision {
        Decision::Wait { set_cookie, .. } | Decision::PreQueue { set_cookie, .. } => {
            set_cookie.clone()
        }
        _ => None,
    };
    let mut resp = if is_navigation(req.method(), req.headers()) {
        let start = match &decision {
            Decision::Wait { place, .. } => Some(place.position),
            _ => None,
        };
        let query = page_query(route, req, start);
        response::redirect("waiting", &query.to_url(&waiting_path(s)))
    } else {
        api_answer(s, route, &decision)
    };
    if let Some(cookie) = set_cookie {
        resp.headers_mut().append(SET_COOKIE, cookie);
    }
    resp
}

/// The answer to a request whose session made its
/// `max_requests_per_session` requests (DESIGN §8.6), which is not
/// forwarded: a navigation goes to the waiting page, where the visitor comes
/// through the line again; an app gets `"state":"used_up"` and the status URL.
/// The caller clears the pass cookie.
pub fn used_up(s: &Settings, route: &RouteRt, req: &ClientRequest) -> Answer<Body> {
    if is_navigation(req.method(), req.headers()) {
        let query = page_query(route, req, None);
        return response::redirect("used-up", &query.to_url(&waiting_path(s)));
    }
    let body = Standing {
        route: Some(route.name()),
        status_url: Some(status_url(s, route.name())),
        state: "used_up",
        poll_after_ms: Some(1_000),
        ..Standing::default()
    };
    response::with_retry_after(
        response::json(route.cfg.waiting_status, "used-up", body.to_json()),
        1,
    )
}

/// The JSON answer for apps (DESIGN §1 step 5).
///
/// `Retry-After` while waiting is the poll interval (`poll_after_ms`, in
/// whole seconds, rounded up), never the estimated wait: the interval is
/// capped at a third of `abandon_after`, so a client that simply obeys
/// `Retry-After` keeps its place, whereas waiting out the ETA would let the
/// line drop it as a ghost. The body carries the same `poll_after_ms` and the
/// ETA the status endpoint and the page show.
fn api_answer(s: &Settings, route: &RouteRt, decision: &Decision) -> Answer<Body> {
    let mut body = Standing {
        route: Some(route.name()),
        status_url: Some(status_url(s, route.name())),
        ..Standing::default()
    };
    let poll = fill_decision(&mut body, route, decision);
    let (status, retry) = match (decision, poll) {
        (Decision::Wait { .. } | Decision::PreQueue { .. }, Some(poll)) => {
            (route.cfg.waiting_status, poll.div_ceil(1000).max(1))
        }
        (Decision::Full { .. }, _) => (StatusCode::SERVICE_UNAVAILABLE, 30),
        (Decision::TooMany { retry_after }, _) => (
            StatusCode::TOO_MANY_REQUESTS,
            retry_after.as_secs_f64().ceil().max(1.0) as u64,
        ),
        (Decision::Closed, _) => (StatusCode::SERVICE_UNAVAILABLE, 60),
        _ => (StatusCode::SERVICE_UNAVAILABLE, 10),
    };
    body.poll_after_ms = Some(poll.unwrap_or(retry * 1000));
    response::with_retry_after(response::json(status, "waiting", body.to_json()), retry)
}

/// Writes what a decision tells an app into `body`: `state`, and where the
/// visitor stands when waiting. Returns the poll interval when there is one.
/// The status endpoint and the answers to held-back requests both use it,
/// so an app reads the same fields from either.
fn fill_decision<'a>(
    body: &mut Standing<'a>,
    route: &'a RouteRt,
    decision: &Decision,
) -> Option<u64> {
    let state = match decision {
        Decision::Admit { .. } => "admitted",
        Decision::Wait { place, .. } => return Some(fill_place(body, route, place)),
        &Decision::PreQueue {
            opens_in_ms, lane, ..
        } => return Some(fill_prequeue(body, route, opens_in_ms, lane)),
        Decision::Full { .. } => "full",
        Decision::TooMany { .. } => "too_many",
        Decision::Closed => "closed",
        Decision::Unavailable => "store_down",
    };
    body.state = state;
    None
}

/// Serves a path under the reserved prefix.
pub async fn serve(
    gate: &Gate,
    s: &Settings,
    req: ClientRequest,
    who: Requester<'_>,
    cookies: &CookieMemo,
    streams: &Streams,
) -> Answer<Body> {
    let rest = &req.uri().path()[s.reserved_prefix.len()..];
    match (rest, req.method()) {
        ("/waiting", &Method::GET | &Method::HEAD) => {
            waiting_page(gate, s, &req, who, cookies).await
        }
        ("/status", &Method::GET) => status(gate, s, &req, who, cookies).await,
        ("/events", &Method::GET) => events::serve(gate, streams, s, &req, who, cookies),
        ("/leave", &Method::POST) => leave(gate, s, &req, who.tls, cookies).await,
        ("/waiting" | "/status" | "/events" | "/leave", _) => response::plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "405 method not allowed\n",
        ),
        _ => response::plain(StatusCode::NOT_FOUND, "not-found", "404 not found\n"),
    }
}

fn query_param<'a>(req: &'a ClientRequest, name: &str) -> Option<&'a str> {
    req.uri()
        .query()?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

async fn waiting_page(
    gate: &Gate,
    s: &Settings,
    req: &ClientRequest,
    who: Requester<'_>,
    cookies: &CookieMemo,
) -> Answer<Body> {
    let query = WaitingQuery::parse(req.uri().query().unwrap_or(""));
    let Some(index) = s.route_named(&query.route) else {
        // No such route (any more): nothing to wait for.
        return response::redirect("not-gated", &query.return_path);
    };
    let route = &s.routes[index];
    let Decided {
        decision,
        lane_cookie,
    } = gate
        .decide(s, index, who, || {
            s.credentials(index, req.headers(), who.tls, cookies)
        })
        .await;
    let shown = match Shown::of(decision) {
        Ok(shown) => shown,
        Err(set_cookie) => {
            let mut resp = response::redirect("admitted", &query.return_path);
            for cookie in set_cookie.into_iter().chain(lane_cookie) {
                resp.headers_mut().append(SET_COOKIE, cookie);
            }
            return resp;
        }
    };
    let html = render_page(gate, s, route, req, &query, &shown);
    let mut resp = page_response(route, shown.state, html);
    for cookie in shown.set_cookie.into_iter().chain(lane_cookie) {
        resp.headers_mut().append(SET_COOKIE, cookie);
    }
    resp
}

/// What the waiting page shows for a decision: its state, the visitor's
/// place in line when waiting, the time left before the opening in the
/// pre-queue, and the cookie the decision sets.
struct Shown {
    state: PageState,
    place: Option<Place>,
    opens_in_ms: Option<u64>,
    set_cookie: Option<HeaderValue>,
}

impl Shown {
    /// What the waiting page shows for `decision`; `Err` with the pass of
    /// an admission (the visitor is sent back).
    fn of(decision: Decision) -> Result<Shown, Option<HeaderValue>> {
        let shown = |state, place, opens_in_ms, set_cookie| Shown {
            state,
            place,
            opens_in_ms,
            set_cookie,
        };
        Ok(match decision {
            Decision::Admit { set_cookie, .. } => return Err(set_cookie),
            Decision::Wait { place, set_cookie } => {
                shown(PageState::Waiting, Some(place), None, set_cookie)
            }
            Decision::PreQueue {
                opens_in_ms,
                set_cookie,
                ..
            } => shown(PageState::PreQueue, None, Some(opens_in_ms), set_cookie),
            Decision::Full { .. } => shown(PageState::Full, None, None, None),
            Decision::TooMany { .. } => shown(PageState::TooMany, None, None, None),
            Decision::Closed => shown(PageState::Closed, None, None, None),
            Decision::Unavailable => shown(PageState::StoreDown, None, None, None),
        })
    }
}

/// The waiting page's HTML for what it shows, in the visitor's language.
fn render_page(
    gate: &Gate,
    s: &Settings,
    route: &RouteRt,
    req: &ClientRequest,
    query: &WaitingQuery,
    shown: &Shown,
) -> String {
    let &Shown {
        state,
        place,
        opens_in_ms,
        ..
    } = shown;
    let lang = page::negotiate(
        req.headers()
            .get(ACCEPT_LANGUAGE)
            .and_then(|v| v.to_str().ok()),
        query.lang.map(Lang::code),
    );
    let status_url = format!(
        "{}&return={}",
        status_url(s, route.name()),
        page_query_value(&query.return_path)
    );
    let leave_url = format!("{}/leave?route={}", s.reserved_prefix, route.name());
    let waiting_path = waiting_path(s);
    let view = PageView {
        route: route.name(),
        lang,
        state,
        position: place.map(|p| p.position),
        ahead: place.map(|p| p.position - 1),
        waiting_total: place.map(|p| p.waiting_total),
        eta_seconds: place.and_then(|p| route.eta_in_lane(p.position, p.lane)),
        poll_after_ms: match (place, opens_in_ms) {
            (Some(p), _) => poll_after_ms(route, p.position),
            (None, Some(left)) => prequeue_poll_after_ms(route, left),
            (None, None) => 5_000,
        },
        return_path: &query.return_path,
        waiting_path: &waiting_path,
        status_url: &status_url,
        leave_url: &leave_url,
        start_position: query.start.or(place.map(|p| p.position)),
        title: route.cfg.page.title.as_deref(),
        message: route.cfg.page.message.as_deref(),
        updated_unix_s: gate.clock().now_s(),
        lane: place.map(|p| route.limits.lanes.get(p.lane).name.as_str()),
        priority: place.is_some_and(|p| p.lane > 0),
        opens_at: route.cfg.opens_at.map(|t| t.rfc3339()),
        opens_in_ms,
    };
    page::render(&view, route.template.as_deref())
}

/// The waiting page's response: its status for `state`, the template's
/// content security policy, and when to retry if it says so.
fn page_response(route: &RouteRt, state: PageState, html: String) -> Answer<Body> {
    let status = match state {
        PageState::Waiting | PageState::PreQueue => StatusCode::OK,
        PageState::TooMany => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    let mut resp = response::html(status, "waiting", html);
    if let Some(csp) = page::content_security_policy(route.template.as_deref()) {
        resp.headers_mut().insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(csp),
        );
    }
    if let Some(retry) = state.retry_after_s() {
        resp = response::with_retry_after(resp, retry);
    }
    resp
}

fn page_query_value(path: &str) -> String {
    WaitingQuery {
        route: String::new(),
        return_path: path.to_owned(),
        lang: None,
        start: None,
    }
    .to_url("")
    .split_once("&return=")
    .map_or_else(|| "%2F".to_owned(), |(_, v)| v.to_owned())
}

/// What a status request or event stream is about: the route it names,
/// the sanitized `return` path, and the route's index if it exists.
fn status_target<'r>(s: &Settings, req: &'r ClientRequest) -> (&'r str, String, Option<usize>) {
    let route_name = query_param(req, "route").unwrap_or("");
    let return_path =
        return_to::sanitize(&WaitingQuery::parse(req.uri().query().unwrap_or("")).return_path);
    (route_name, return_path, s.route_named(route_name))
}

/// `GET /status?route=NAME`: always `200` with JSON.
async fn status(
    gate: &Gate,
    s: &Settings,
    req: &ClientRequest,
    who: Requester<'_>,
    cookies: &CookieMemo,
) -> Answer<Body> {
    let (route_name, return_path, index) = status_target(s, req);
    let Some(index) = index else {
        let body = Standing {
            state: "unknown",
            route: Some(route_name),
            return_path: Some(&return_path),
            ..Standing::default()
        };
        return status_json(&body, None);
    };
    let route = &s.routes[index];
    let creds = s.credentials(index, req.headers(), who.tls, cookies);
    let mut body = Standing {
        route: Some(route.name()),
        return_path: Some(&return_path),
        ..Standing::default()
    };
    let mut set_cookies = [None, None];
    if creds.pass.is_none() && creds.ticket.is_none() {
        body.state = "unknown";
    } else {
        // The credentials just read, not read again.
        let decided = gate.decide(s, index, who, || creds).await;
        fill_decision(&mut body, route, &decided.decision);
        set_cookies = [decided.decision.into_set_cookie(), decided.lane_cookie];
    }
    body.poll_after_ms.get_or_insert(IDLE_POLL_MS);
    status_json(&body, set_cookies.into_iter().flatten())
}

/// Writes a pre-queue waiter's answer into `body` (DESIGN §8.7): the
/// opening and the time left to it by this instance's clock. Returns the
/// poll interval written.
fn fill_prequeue<'a>(
    body: &mut Standing<'a>,
    route: &'a RouteRt,
    opens_in_ms: u64,
    lane: usize,
) -> u64 {
    let poll = prequeue_poll_after_ms(route, opens_in_ms);
    body.state = "prequeue";
    body.opens_at = Some(route.cfg.opens_at.map(|t| t.rfc3339()));
    body.opens_in_ms = Some(opens_in_ms);
    body.poll_after_ms = Some(poll);
    body.lane = Some(&route.limits.lanes.get(lane).name);
    body.priority = Some(lane > 0);
    poll
}

/// Writes a waiter's place into `body`; returns the poll interval written.
fn fill_place<'a>(body: &mut Standing<'a>, route: &'a RouteRt, place: &Place) -> u64 {
    let poll = poll_after_ms(route, place.position);
    body.state = "waiting";
    body.position = Some(place.position);
    body.ahead = Some(place.position - 1);
    body.waiting_total = Some(place.waiting_total);
    body.eta_seconds = Some(route.eta_in_lane(place.position, place.lane));
    body.poll_after_ms = Some(poll);
    body.lane = Some(&route.limits.lanes.get(place.lane).name);
    body.priority = Some(place.lane > 0);
    poll
}

fn status_json(
    body: &Standing<'_>,
    set_cookies: impl IntoIterator<Item = HeaderValue>,
) -> Answer<Body> {
    let mut resp = response::json(StatusCode::OK, "status", body.to_json());
    for cookie in set_cookies {
        resp.headers_mut().append(SET_COOKIE, cookie);
    }
    resp
}

/// `POST /leave?route=NAME`: leave the line or free the slot.
async fn leave(
    gate: &Gate,
    s: &Settings,
    req: &ClientRequest,
    tls: bool,
    cookies: &CookieMemo,
) -> Answer<Body> {
    let route_name = query_param(req, "route").unwrap_or("");
    let Some(index) = s.route_named(route_name) else {
        let body = Standing {
            state: "unknown",
            route: Some(route_name),
            ..Standing::default()
        };
        return status_json(&body, None);
    };
    let route = &s.routes[index];
    let creds = s.credentials(index, req.headers(), tls, cookies);
    let left = gate.leave(route, &creds).await;
    let clear = s.clear_cookie(route, tls);
    if is_navigation(&Method::GET, req.headers()) {
        let mut resp = response::redirect("left", "/");
        *resp.status_mut() = StatusCode::SEE_OTHER;
        resp.headers_mut().append(SET_COOKIE, clear);
        return resp;
    }
    let body = Standing {
        state: if left { "left" } else { "unknown" },
        route: Some(route.name()),
        ..Standing::default()
    };
    status_json(&body, Some(clear))
}
