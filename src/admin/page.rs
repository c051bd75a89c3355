//! The live view's page (DESIGN §9.4): one HTML page, its script and its
//! style, embedded in the binary and served by the admin listener itself,
//! nothing from elsewhere, so it works offline. It draws what `/events`
//! pushes (see `live`).

use http::header::HeaderValue;
use http::StatusCode;

use crate::message::Answer;
use crate::response::{self, Body};

const HTML: &str = include_str!("../../assets/admin/live.html");
const SCRIPT: &str = include_str!("../../assets/admin/live.js");
const STYLE: &str = include_str!("../../assets/admin/live.css");

/// What the page may do: load its own script and style, and talk to its
/// own listener; no inline code, no frames, no forms sent anywhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// `GET /`.
pub fn page() -> Answer<Body> {
    with_policy(response::html(
        StatusCode::OK,
        "admin-live",
        HTML.to_owned(),
    ))
}

/// `GET /live.js`.
pub fn script() -> Answer<Body> {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

/// `GET /live.css`.
pub fn style() -> Answer<Body> {
    asset(STYLE, "text/css; charset=utf-8")
}

fn asset(text: &'static str, content_type: &'static str) -> Answer<Body> {
    let mut resp = response::plain(StatusCode::OK, "admin-live", text);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    resp
}

fn with_policy(mut resp: Answer<Body>) -> Answer<Body> {
    let headers = resp.headers_mut();
    headers.insert(
        http::header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        http::header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}
