//! The waiting page: the visitor's language, the page's own URL, page
//! templates and their placeholders, and rendering a [`PageView`] to HTML.
//! It holds no HTTP-server code: callers pass in what they know and send the
//! returned text.
//!
//! The default page is `assets/waiting.html`, with `assets/waiting.css`,
//! `assets/waiting.js` and `assets/strings.json` embedded into it; the
//! placeholders are documented in `assets/README.md`.

use std::fmt::Write as _;
use std::sync::LazyLock;

use base64::Engine as _;
use sha2::Digest as _;

use super::return_to;
use crate::template::{phrase, Part, Slot, PHRASES};
pub use crate::template::{Lang, Template, TemplateError};

const DEFAULT_TEMPLATE: &str = include_str!("../../assets/waiting.html");
const STYLE: &str = include_str!("../../assets/waiting.css");
const SCRIPT: &str = include_str!("../../assets/waiting.js");

/// Picks the page language: `?lang=` when it names a supported language,
/// else the most preferred supported language of `Accept-Language` (q-values
/// honoured, `q=0` means "not this one", ties go to the earlier entry), else
/// English.
pub fn negotiate(accept_language: Option<&str>, query_lang: Option<&str>) -> Lang {
    if let Some(lang) = query_lang.and_then(Lang::from_tag) {
        return lang;
    }
    let mut best: Option<(u16, Lang)> = None;
    for entry in accept_language.unwrap_or("").split(',') {
        let mut fields = entry.split(';');
        let tag = fields.next().unwrap_or("").trim();
        let mut quality = Some(1000u16);
        for param in fields {
            let Some((name, value)) = param.split_once('=') else {
                continue;
            };
            if name.trim().eq_ignore_ascii_case("q") {
                quality = parse_quality(value.trim());
            }
        }
        let Some(quality) = quality.filter(|&q| q > 0) else {
            continue;
        };
        let lang = if tag == "*" {
            Some(Lang::En)
        } else {
            Lang::from_tag(tag)
        };
        if let Some(lang) = lang {
            if best.is_none_or(|(q, _)| quality > q) {
                best = Some((quality, lang));
            }
        }
    }
    best.map_or(Lang::En, |(_, lang)| lang)
}

/// RFC 9110 `qvalue` in thousandths: `0`, `0.5`, `1`, `1.000`; anything else
/// is malformed and the entry is skipped.
fn parse_quality(value: &str) -> Option<u16> {
    let (whole, fraction) = value.split_once('.').unwrap_or((value, ""));
    if fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths = format!("{fraction:0<3}").parse::<u16>().ok()?;
    match whole {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// What the page is telling the visitor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageState {
    /// In line: place, people ahead, estimated wait; polls the status URL.
    Waiting,
    /// The route is closed: a calm message; retries slowly.
    Closed,
    /// The line is full: try again later; retries by itself too.
    Full,
    /// The visitor's network holds as many places as it may, or joined too
    /// often (DESIGN §8.3): try again later; retries by itself too.
    TooMany,
    /// The store cannot take new places right now; retries.
    StoreDown,
    /// Before the route's opening (DESIGN §8.7): when it opens and a
    /// countdown; polls, and turns into the waiting page at the opening.
    PreQueue,
}

impl PageState {
    /// The `state` code in the embedded JSON and the `data-state` attribute.
    pub fn code(self) -> &'static str {
        match self {
            PageState::Waiting => "waiting",
            PageState::Closed => "closed",
            PageState::Full => "full",
            PageState::TooMany => "too_many",
            PageState::StoreDown => "store_down",
            PageState::PreQueue => "prequeue",
        }
    }

    /// Seconds before a page in this state goes back to the `return` path
    /// to ask again (`None` while waiting: then the page polls).
    pub fn retry_after_s(self) -> Option<u64> {
        match self {
            PageState::Waiting | PageState::PreQueue => None,
            PageState::Closed => Some(60),
            PageState::Full | PageState::TooMany => Some(30),
            PageState::StoreDown => Some(10),
        }
    }
}

/// Everything one rendering of the page shows. Text values are raw: the
/// renderer escapes them.
#[derive(Clone, Debug)]
pub struct PageView<'a> {
    pub route: &'a str,
    pub lang: Lang,
    pub state: PageState,
    /// 1-based place in line (`None` when not in line).
    pub position: Option<u64>,
    pub ahead: Option<u64>,
    pub waiting_total: Option<u64>,
    /// `None` while the admit rate is not known yet: shown as "calculating…".
    pub eta_seconds: Option<u64>,
    /// How long the script waits before its first poll.
    pub poll_after_ms: u64,
    /// Where to go once admitted; sanitized again here.
    pub return_path: &'a str,
    /// Path of the waiting page itself, e.g. `/__queuegate/waiting`.
    pub waiting_path: &'a str,
    /// e.g. `/__queuegate/status?route=tickets`.
    pub status_url: &'a str,
    /// e.g. `/__queuegate/leave?route=tickets` (the page POSTs a form to it).
    pub leave_url: &'a str,
    /// The place the visitor had when the page first showed (from the
    /// waiting URL's `start`), for the progress bar.
    pub start_position: Option<u64>,
    /// The route's page title (`page.title`), else a generic one.
    pub title: Option<&'a str>,
    /// The route's page message (`page.message`), shown as given.
    pub message: Option<&'a str>,
    /// When the figures were read, seconds since the Unix epoch.
    pub updated_unix_s: u64,
    /// The lane the visitor waits in, when the route has several.
    pub lane: Option<&'a str>,
    /// Whether that lane is not the route's first: the page says
    /// "priority line".
    pub priority: bool,
    /// The route's opening, RFC 3339, when it has one.
    pub opens_at: Option<String>,
    /// Before the opening: how long until it, by the server's clock.
    pub opens_in_ms: Option<u64>,
}

/// The query of the waiting page URL: `route`, `return`, and the page's own
/// `lang` and `start` (the place the visitor started from).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WaitingQuery {
    pub route: String,
    /// Already sanitized: a relative path on this site, `/` when absent.
    pub return_path: String,
    pub lang: Option<Lang>,
    pub start: Option<u64>,
}

impl WaitingQuery {
    /// Reads a query string (without `?`), form-encoded as browsers write it.
    /// Unknown parameters are ignored; a bad `return` becomes `/`.
    pub fn parse(query: &str) -> WaitingQuery {
        let mut out = WaitingQuery {
            return_path: "/".to_owned(),
            ..WaitingQuery::default()
        };
        for pair in query.split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = form_decode(value);
            match name {
                "route" => out.route = value,
                "return" => out.return_path = return_to::sanitize(&value),
                "lang" => out.lang = Lang::from_tag(&value),
                "start" => out.start = value.parse().ok().filter(|&n| n > 0),
                _ => {}
            }
        }
        out
    }

    /// `waiting_path?route=…&return=…[&lang=…][&start=…]`, every value encoded.
    pub fn to_url(&self, waiting_path: &str) -> String {
        let mut url = format!(
            "{waiting_path}?route={}&return={}",
            query_encode(&self.route),
            query_encode(&return_to::sanitize(&self.return_path))
        );
        if let Some(lang) = self.lang {
            url.push_str("&lang=");
            url.push_str(lang.code());
        }
        if let Some(start) = self.start {
            let _ = write!(url, "&start={start}");
        }
        url
    }
}

fn form_decode(value: &str) -> String {
    let spaced = value.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8_lossy()
        .into_owned()
}

/// Bytes percent-encoded in a query value: all but unreserved characters
/// and `/` (kept so a `return` path stays readable).
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

fn query_encode(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, QUERY_VALUE).to_string()
}

/// The built-in page, parsed once. A unit test proves it parses; should it
/// ever fail, `render` falls back to a bare page rather than panicking.
static DEFAULT: LazyLock<Option<Template>> =
    LazyLock::new(|| Template::parse(DEFAULT_TEMPLATE).ok());

/// The phrase table as it is embedded for the script, `<` escaped.
static PHRASES_JSON: LazyLock<String> = LazyLock::new(|| {
    script_safe_json(&serde_json::to_string(&*PHRASES).unwrap_or_else(|_| "{}".to_owned()))
});

fn text(lang: Lang, key: &str) -> &'static str {
    phrase(lang, key).unwrap_or("")
}

/// The `Content-Security-Policy` the default page works under: nothing
/// loads but the page itself, only its own inline script and style run, and
/// it may fetch and post only to its own origin, and start the worker that
/// keeps time for polling from a `blob:` URL. `None` for a custom
/// template, whose author may have added inline code of their own.
pub fn content_security_policy(template: Option<&Template>) -> Option<&'static str> {
    static POLICY: LazyLock<String> = LazyLock::new(|| {
        let hash = |code: &str| {
            base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(code.as_bytes()))
        };
        format!(
            "default-src 'none'; script-src 'sha256-{}'; style-src 'sha256-{}'; \
             connect-src 'self'; worker-src blob:; form-action 'self'; base-uri 'none'; \
             frame-ancestors 'none'",
            hash(SCRIPT),
            hash(STYLE)
        )
    });
    match template {
        None => Some(POLICY.as_str()),
        Some(_) => None,
    }
}

/// Renders the page: `template`, or the built-in one when `None`. Every
/// dynamic value is HTML-escaped; the state embedded for the script is JSON
/// with `<`, `>` and `&` escaped so it cannot end its `<script>` element.
pub fn render(view: &PageView, template: Option<&Template>) -> String {
    let Some(template) = template.or(DEFAULT.as_ref()) else {
        return bare_page(view);
    };
    let facts = Facts::of(view);
    let mut out = String::with_capacity(24 * 1024);
    for part in &template.parts {
        match part {
            Part::Text(text) => out.push_str(text),
            Part::Phrase(key) => escape_into(&mut out, text(view.lang, key)),
            Part::Slot(slot) => facts.write(*slot, view, &mut out),
        }
    }
    out
}

/// Values derived once per rendering.
struct Facts {
    return_path: String,
    start: Option<u64>,
    progress: u64,
    refresh_seconds: u64,
    waiting_url: String,
    switch_url: String,
}

impl Facts {
    fn of(view: &PageView) -> Facts {
        let return_path = return_to::sanitize(view.return_path);
        let start = match (view.start_position, view.position) {
            (Some(start), Some(position)) => Some(start.max(position)),
            (start, position) => start.or(position),
        };
        let progress = match (start, view.position) {
            (Some(start), Some(position)) if start > 0 => (start - position) * 100 / start,
            _ => 0,
        };
        let refresh_seconds = view
            .state
            .retry_after_s()
            .unwrap_or_else(|| view.poll_after_ms.div_ceil(1000).clamp(2, 20));
        let query = |lang| WaitingQuery {
            route: view.route.to_owned(),
            return_path: return_path.clone(),
            lang: Some(lang),
            start,
        };
        Facts {
            waiting_url: query(view.lang).to_url(view.waiting_path),
            switch_url: query(view.lang.other()).to_url(view.waiting_path),
            return_path,
            start,
            progress,
            refresh_seconds,
        }
    }

    fn write(&self, slot: Slot, view: &PageView, out: &mut String) {
        let lang = view.lang;
        match slot {
            Slot::Lang => out.push_str(lang.code()),
            Slot::State => out.push_str(view.state.code()),
            Slot::Route => escape_into(out, view.route),
            Slot::Title => escape_into(out, view.title.unwrap_or(text(lang, "default_title"))),
            Slot::Message => escape_into(out, view.message.unwrap_or("")),
            Slot::Headline => {
                escape_into(out, text(lang, &format!("heading_{}", view.state.code())))
            }
            Slot::Lead => escape_into(out, text(lang, &format!("lead_{}", view.state.code()))),
            Slot::Position => out.push_str(&count(view.position)),
            Slot::Ahead => out.push_str(&count(view.ahead)),
            Slot::WaitingTotal => out.push_str(&count(view.waiting_total)),
            Slot::Eta => escape_into(out, &eta_text(lang, view.eta_seconds)),
            Slot::Progress => {
                let _ = write!(out, "{}", self.progress);
            }
            Slot::Updated => out.push_str(&clock_time_utc(view.updated_unix_s)),
            Slot::UpdatedIso => out.push_str(&iso_time(view.updated_unix_s)),
            Slot::RefreshSeconds => {
                let _ = write!(out, "{}", self.refresh_seconds);
            }
            Slot::RefreshUrl => match view.state {
                PageState::Waiting | PageState::PreQueue => escape_into(out, &self.waiting_url),
                _ => escape_into(out, &self.return_path),
            },
            Slot::RetryUrl | Slot::ReturnPath => escape_into(out, &self.return_path),
            Slot::StatusUrl => escape_into(out, view.status_url),
            Slot::LeaveUrl => escape_into(out, view.leave_url),
            Slot::LangSwitchUrl => escape_into(out, &self.switch_url),
            Slot::LangSwitchName => escape_into(out, text(lang.other(), "lang_name")),
            Slot::LangSwitchCode => out.push_str(lang.other().code()),
            Slot::StatusJson => {
                out.push_str(r#"<script type="application/json" id="qg-state">"#);
                out.push_str(&self.state_json(view));
                out.push_str("</script>");
            }
            Slot::Script => {
                out.push_str(r#"<script type="application/json" id="qg-strings">"#);
                out.push_str(&PHRASES_JSON);
                out.push_str("</script>\n<script>");
                out.push_str(SCRIPT);
                out.push_str("</script>");
            }
            Slot::LaneHidden => {
                if !view.priority {
                    out.push_str(" hidden");
                }
            }
            Slot::OpensAt => escape_into(
                out,
                &view.opens_at.as_deref().unwrap_or("").replacen('T', " ", 1),
            ),
            Slot::OpensIn => out.push_str(&countdown(view.opens_in_ms)),
            Slot::Style => {
                out.push_str("<style>");
                out.push_str(STYLE);
                out.push_str("</style>");
            }
        }
    }

    /// The initial state for the script: the status fields of DESIGN §4 plus
    /// what the page itself needs.
    fn state_json(&self, view: &PageView) -> String {
        let value = serde_json::json!({
            "state": view.state.code(),
            "route": view.route,
            "position": view.position,
            "ahead": view.ahead,
            "waiting_total": view.waiting_total,
            "eta_seconds": view.eta_seconds,
            "poll_after_ms": view.poll_after_ms,
            "return": self.return_path,
            "status_url": view.status_url,
            "leave_url": view.leave_url,
            "lang": view.lang.code(),
            "start_position": self.start,
            "updated_unix_s": view.updated_unix_s,
            "retry_after_s": view.state.retry_after_s(),
            "has_title": view.title.is_some(),
            "lane": view.lane,
            "priority": view.priority,
            "opens_at": view.opens_at,
            "opens_in_ms": view.opens_in_ms,
        });
        script_safe_json(&value.to_string())
    }
}

/// Escapes what could end a `<script>` element or start markup inside it.
/// Only ever applied to serialized JSON, where these characters occur inside
/// strings, so `\uXXXX` escapes keep the value the same.
fn script_safe_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

/// `1,234`, or an en dash when unknown.
/// Time left to an opening as `H:MM:SS` (hours unbounded), rounded up to
/// the second; `–` when unknown. The script counts it down the same way.
fn countdown(ms: Option<u64>) -> String {
    let Some(ms) = ms else {
        return "–".to_owned();
    };
    let s = ms.div_ceil(1000);
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn count(value: Option<u64>) -> String {
    let Some(n) = value else {
        return "–".to_owned();
    };
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// An honest estimate: "calculating…" when unknown, then coarser the
/// further out it is (minutes under 10, five-minute steps under an hour,
/// hours beyond). `assets/waiting.js` applies the same rule.
pub fn eta_text(lang: Lang, eta_seconds: Option<u64>) -> String {
    let Some(seconds) = eta_seconds else {
        return text(lang, "eta_calculating").to_owned();
    };
    if seconds < 60 {
        return text(lang, "eta_under_minute").to_owned();
    }
    let minutes = (seconds + 30) / 60;
    if minutes <= 1 {
        return text(lang, "eta_minute").to_owned();
    }
    if minutes < 10 {
        return text(lang, "eta_minutes").replace("{n}", &minutes.to_string());
    }
    let rounded = (minutes + 2) / 5 * 5;
    if rounded < 60 {
        return text(lang, "eta_minutes").replace("{n}", &rounded.to_string());
    }
    let hours = (seconds + 1800) / 3600;
    if hours <= 1 {
        text(lang, "eta_hour").to_owned()
    } else {
        text(lang, "eta_hours").replace("{n}", &hours.to_string())
    }
}

/// `14:03:12 UTC`: the server cannot know the visitor's time zone; the
/// script replaces it with local time.
fn clock_time_utc(unix_s: u64) -> String {
    let day_s = unix_s % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        day_s / 3600,
        day_s / 60 % 60,
        day_s % 60
    )
}

/// `2025-11-30T14:03:12Z`.
fn iso_time(unix_s: u64) -> String {
    let (year, month, day) = civil_from_days(unix_s / 86_400);
    let day_s = unix_s % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        day_s / 3600,
        day_s / 60 % 60,
        day_s % 60
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian
/// (H. Hinnant's `civil_from_days`, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Used only if the built-in template failed to parse: the figures and a
/// refresh, without the styling.
fn bare_page(view: &PageView) -> String {
    let facts = Facts::of(view);
    let mut out = String::from(
        "<!doctype html><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"",
    );
    let _ = write!(out, "{}; url=", facts.refresh_seconds);
    facts.write(Slot::RefreshUrl, view, &mut out);
    out.push_str("\"><title>");
    facts.write(Slot::Headline, view, &mut out);
    out.push_str("</title><h1>");
    facts.write(Slot::Headline, view, &mut out);
    out.push_str("</h1><p>");
    facts.write(Slot::Position, view, &mut out);
    out.push_str(" · ");
    facts.write(Slot::Eta, view, &mut out);
    out.push_str("</p>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>() -> PageView<'a> {
        PageView {
            route: "tickets",
            lang: Lang::En,
            state: PageState::Waiting,
            position: Some(1234),
            ahead: Some(1233),
            waiting_total: Some(5000),
            eta_seconds: Some(750),
            poll_after_ms: 4000,
            return_path: "/tickets/42?seat=A1",
            waiting_path: "/__queuegate/waiting",
            status_url: "/__queuegate/status?route=tickets",
            leave_url: "/__queuegate/leave?route=tickets",
            start_position: Some(2000),
            title: Some("Concert tickets"),
            message: None,
            updated_unix_s: 1_764_511_392,
            lane: None,
            priority: false,
            opens_at: None,
            opens_in_ms: None,
        }
    }

    #[test]
    fn a_priority_lane_is_named_on_the_page_in_either_language() {
        let plain = render(&view(), None);
        assert!(plain.contains(r#"data-qg="lane" hidden"#), "{plain}");
        let vip = PageView {
            lane: Some("vip"),
            priority: true,
            ..view()
        };
        let en = render(&vip, None);
        assert!(
            en.contains(r#"data-qg="lane" data-i18n="priority_line">Priority line<"#),
            "{en}"
        );
        let state = embedded_json(&en, "qg-state");
        assert_eq!(
            (state["lane"].as_str(), state["priority"].as_bool()),
            (Some("vip"), Some(true))
        );
        let ko = render(
            &PageView {
                lang: Lang::Ko,
                ..vip
            },
            None,
        );
        assert!(ko.contains(">우선 대기열<"), "{ko}");
    }

    /// The JSON inside `<script type="application/json" id="…">`.
    fn embedded_json(html: &str, id: &str) -> serde_json::Value {
        let open = format!(r#"<script type="application/json" id="{id}">"#);
        let start = html.find(&open).map(|i| i + open.len());
        let body = start.and_then(|s| html[s..].find("</script>").map(|e| &html[s..s + e]));
        serde_json::from_str(body.unwrap_or("")).unwrap_or(serde_json::Value::Null)
    }

    #[test]
    fn the_countdown_page_says_when_it_opens_and_counts_down() {
        for (lang, heading) in [(Lang::En, "Opening soon"), (Lang::Ko, "곧 시작합니다")] {
            let html = render(
                &PageView {
                    lang,
                    state: PageState::PreQueue,
                    position: None,
                    opens_at: Some("2026-12-24T10:00:00+09:00".into()),
                    opens_in_ms: Some(3_723_001),
                    poll_after_ms: 9_000,
                    ..view()
                },
                None,
            );
            assert!(html.contains(r#"<body data-state="prequeue">"#));
            assert!(html.contains(heading), "{lang:?}");
            assert!(html.contains("2026-12-24 10:00:00+09:00"));
            assert!(html.contains(">1:02:04<"), "rounded up to the second");
            // Without script: back to the page itself near the opening.
            assert!(html.contains(r#"content="9; url=/__queuegate/waiting?route=tickets"#));
            let state = embedded_json(&html, "qg-state");
            assert_eq!(state["state"], "prequeue");
            assert_eq!(state["opens_in_ms"], 3_723_001);
            assert_eq!(state["opens_at"], "2026-12-24T10:00:00+09:00");
        }
        assert_eq!(countdown(Some(0)), "0:00:00");
        assert_eq!(countdown(Some(90_061_000)), "25:01:01");
        assert_eq!(countdown(None), "–");
    }

    #[test]
    fn default_template_parses() {
        assert!(Template::parse(DEFAULT_TEMPLATE).is_ok());
        assert!(DEFAULT.is_some());
    }

    #[test]
    fn default_page_is_small_and_loads_nothing_from_elsewhere() {
        for lang in [Lang::En, Lang::Ko] {
            for state in [
                PageState::Waiting,
                PageState::Closed,
                PageState::Full,
                PageState::TooMany,
                PageState::StoreDown,
                PageState::PreQueue,
            ] {
                let html = render(
                    &PageView {
                        lang,
                        state,
                        ..view()
                    },
                    None,
                );
                assert!(html.len() < 32 * 1024, "{} bytes", html.len());
                assert!(!html.contains("http://"), "http:// in page");
                assert!(!html.contains("https://"), "https:// in page");
                for (at, _) in html.match_indices("//") {
                    let before = html[..at].chars().last().unwrap_or(' ');
                    // Only the `//` of JS comments, never `"//host`, `'//`, `(//`, `=//`.
                    assert!(
                        !matches!(before, '"' | '\'' | '(' | '=' | '`'),
                        "protocol-relative URL near {:?}",
                        &html[at.saturating_sub(20)..(at + 20).min(html.len())]
                    );
                }
                for tag in ["<link", "<img", "<iframe", "src=", "@import", "url("] {
                    assert!(!html.contains(tag), "{tag} in page");
                }
            }
        }
    }

    #[test]
    fn korean_is_chosen_and_rendered_for_accept_language_ko() {
        let lang = negotiate(Some("ko-KR,ko;q=0.9,en-US;q=0.8,en;q=0.7"), None);
        assert_eq!(lang, Lang::Ko);
        let html = render(&PageView { lang, ..view() }, None);
        assert!(html.contains(r#"<html lang="ko">"#));
        assert!(html.contains("내 대기 순서"));
        assert!(html.contains("약 15분"), "ETA in Korean");
        assert!(html.contains(">English</a>"), "switch offers English");
        // Both languages travel in the phrase table for the switch; the
        // markup itself is Korean.
        let markup = html.split(r#"id="qg-strings""#).next().unwrap_or("");
        assert!(!markup.contains("Your place in line"));
        assert!(!markup.contains("calculating"));
    }

    #[test]
    fn negotiation_honours_q_values_and_the_query() {
        assert_eq!(negotiate(None, None), Lang::En);
        assert_eq!(negotiate(Some("en;q=0.5, ko;q=0.8"), None), Lang::Ko);
        assert_eq!(negotiate(Some("fr-FR, ko;q=0.3"), None), Lang::Ko);
        assert_eq!(negotiate(Some("ko;q=0, en;q=0.1"), None), Lang::En);
        assert_eq!(negotiate(Some("ko;q=0"), None), Lang::En);
        assert_eq!(negotiate(Some("ko, en"), None), Lang::Ko, "tie: first wins");
        assert_eq!(negotiate(Some("KO-kr"), None), Lang::Ko);
        assert_eq!(negotiate(Some("*;q=0.9, ko;q=0.5"), None), Lang::En);
        assert_eq!(
            negotiate(Some("ko;q=abc, en;q=0.2"), None),
            Lang::En,
            "malformed q skipped"
        );
        assert_eq!(negotiate(Some("ko;q=1.5"), None), Lang::En);
        assert_eq!(negotiate(Some(",,;;=,"), None), Lang::En);
        assert_eq!(negotiate(Some("ko"), Some("en")), Lang::En);
        assert_eq!(negotiate(Some("en"), Some("ko")), Lang::Ko);
        assert_eq!(
            negotiate(Some("ko"), Some("de")),
            Lang::Ko,
            "unknown ?lang ignored"
        );
    }

    #[test]
    fn hostile_title_message_route_and_return_are_escaped() {
        let hostile = PageView {
            route: "t\"><script>alert(1)</script>",
            title: Some("<img src=x onerror=alert(1)>"),
            message: Some("Tom & \"Jerry\" 'quoted' </script><script>alert(2)</script>"),
            return_path: "/x?a=\"</script><script>alert(3)</script>",
            ..view()
        };
        let html = render(&hostile, None);
        assert!(!html.contains("<img"));
        assert!(!html.contains("<script>alert"));
        assert!(!html.contains("onerror=alert(1)>"));
        assert!(html.contains("&lt;img src=x onerror=alert(1)&gt;"));
        assert!(html.contains("Tom &amp; &quot;Jerry&quot; &#39;quoted&#39;"));
        // Exactly the page's own three script elements.
        assert_eq!(html.matches("<script").count(), 3);
        assert_eq!(html.matches("</script>").count(), 3);
        let state = embedded_json(&html, "qg-state");
        assert_eq!(state["route"], "t\"><script>alert(1)</script>");
        assert_eq!(
            state["return"],
            "/x?a=%22%3C/script%3E%3Cscript%3Ealert(3)%3C/script%3E"
        );
    }

    #[test]
    fn hostile_absolute_return_becomes_root() {
        let html = render(
            &PageView {
                return_path: "//evil.example/steal",
                ..view()
            },
            None,
        );
        assert!(!html.contains("evil.example"));
        assert_eq!(embedded_json(&html, "qg-state")["return"], "/");
    }

    #[test]
    fn embedded_state_carries_the_status_fields() {
        let html = render(&view(), None);
        let state = embedded_json(&html, "qg-state");
        assert_eq!(state["state"], "waiting");
        assert_eq!(state["route"], "tickets");
        assert_eq!(state["position"], 1234);
        assert_eq!(state["ahead"], 1233);
        assert_eq!(state["waiting_total"], 5000);
        assert_eq!(state["eta_seconds"], 750);
        assert_eq!(state["poll_after_ms"], 4000);
        assert_eq!(state["return"], "/tickets/42?seat=A1");
        assert_eq!(state["status_url"], "/__queuegate/status?route=tickets");
        assert_eq!(state["start_position"], 2000);
        let phrases = embedded_json(&html, "qg-strings");
        assert_eq!(phrases["ko"]["eta_calculating"], "계산 중…");
        let unknown_eta = render(
            &PageView {
                eta_seconds: None,
                ..view()
            },
            None,
        );
        assert!(embedded_json(&unknown_eta, "qg-state")["eta_seconds"].is_null());
        assert!(unknown_eta.contains("calculating…"));
    }

    #[test]
    fn page_works_without_script() {
        let html = render(&view(), None);
        assert!(html.contains(
            r#"<noscript><meta http-equiv="refresh" content="4; url=/__queuegate/waiting?route=tickets&amp;return=/tickets/42%3Fseat%3DA1&amp;lang=en&amp;start=2000"></noscript>"#
        ));
        assert!(html.contains(r#"data-qg="position">1,234<"#));
        assert!(html.contains(r#"data-qg="ahead">1,233<"#));
        assert!(html.contains(r#"value="38""#), "progress from 2000 to 1234");
        assert!(html.contains("14:03:12 UTC"));
        assert!(html.contains(r#"datetime="2025-11-30T14:03:12Z""#));
        assert!(html.contains(r#"<form method="post" action="/__queuegate/leave?route=tickets">"#));
        let closed = render(
            &PageView {
                state: PageState::Closed,
                position: None,
                ..view()
            },
            None,
        );
        assert!(closed.contains(r#"content="60; url=/tickets/42?seat=A1""#));
        assert!(closed.contains(r#"<body data-state="closed">"#));
        assert!(closed.contains("Not open right now"));
    }

    #[test]
    fn refresh_follows_the_poll_interval_within_bounds() {
        let at = |ms| {
            render(
                &PageView {
                    poll_after_ms: ms,
                    ..view()
                },
                None,
            )
            .contains(&format!(
                "content=\"{}; url=",
                ms.div_ceil(1000).clamp(2, 20)
            ))
        };
        assert!(at(900));
        assert!(at(7_500));
        assert!(at(120_000));
    }

    #[test]
    fn template_without_script_is_an_error_naming_it() {
        let err = Template::parse("<html>{{status_json}}</html>").unwrap_err();
        assert_eq!(err, TemplateError::Missing(vec!["{{script}}"]));
        assert!(err.to_string().contains("{{script}}"));
        let err = Template::parse("<html>{{title}}</html>").unwrap_err();
        assert!(
            err.to_string().contains("{{status_json}}, {{script}}"),
            "{err}"
        );
    }

    #[test]
    fn template_errors_name_the_placeholder_and_line() {
        assert_eq!(
            Template::parse("a\nb {{ titel }}\n{{status_json}}{{script}}").unwrap_err(),
            TemplateError::Unknown {
                name: "titel".into(),
                line: 2
            }
        );
        assert_eq!(
            Template::parse("{{status_json}}{{script}}\n\n{{t:no_such_phrase}}").unwrap_err(),
            TemplateError::Unknown {
                name: "t:no_such_phrase".into(),
                line: 3
            }
        );
        assert_eq!(
            Template::parse("{{status_json}}{{script}}\n{{title").unwrap_err(),
            TemplateError::Unclosed { line: 2 }
        );
        assert_eq!(
            Template::parse("{{script}}{{status_json}}\n{{script}}").unwrap_err(),
            TemplateError::Repeated {
                name: "script",
                line: 2
            }
        );
    }

    #[test]
    fn custom_template_gets_escaped_values_and_phrases() {
        let template = Template::parse(
            "<p>{{title}}|{{position}}|{{eta}}|{{t:eta_label}}|{{message}}</p>{{status_json}}{{script}}",
        )
        .unwrap();
        let html = render(
            &PageView {
                lang: Lang::Ko,
                message: Some("a<b"),
                ..view()
            },
            Some(&template),
        );
        assert!(html.starts_with("<p>Concert tickets|1,234|약 15분|예상 대기 시간|a&lt;b</p>"));
        assert!(html.contains(r#"id="qg-state""#));
        assert_eq!(content_security_policy(Some(&template)), None);
    }

    #[test]
    fn phrase_tables_have_the_same_keys_in_both_languages() {
        let en: Vec<_> = PHRASES["en"].keys().collect();
        let ko: Vec<_> = PHRASES["ko"].keys().collect();
        assert_eq!(en, ko);
        assert!(PHRASES["ko"].values().all(|v| !v.is_empty()));
    }

    #[test]
    fn script_and_style_cannot_end_their_elements() {
        assert!(!SCRIPT.to_ascii_lowercase().contains("</script"));
        assert!(!SCRIPT.contains("<!--"));
        assert!(!STYLE.to_ascii_lowercase().contains("</style"));
    }

    #[test]
    fn policy_hashes_the_inline_code() {
        let policy = content_security_policy(None).unwrap_or("");
        assert!(policy.starts_with("default-src 'none'; script-src 'sha256-"));
        assert!(policy.contains("connect-src 'self'"));
        assert!(
            policy.contains("worker-src blob:"),
            "polling worker allowed"
        );
    }

    #[test]
    fn eta_is_honest_and_coarse() {
        let en = |s| eta_text(Lang::En, s);
        assert_eq!(en(None), "calculating…");
        assert_eq!(en(Some(0)), "less than a minute");
        assert_eq!(en(Some(59)), "less than a minute");
        assert_eq!(en(Some(60)), "about 1 minute");
        assert_eq!(en(Some(95)), "about 2 minutes");
        assert_eq!(en(Some(9 * 60)), "about 9 minutes");
        assert_eq!(en(Some(12 * 60 + 40)), "about 15 minutes");
        assert_eq!(en(Some(57 * 60)), "about 55 minutes");
        assert_eq!(en(Some(58 * 60)), "about 1 hour");
        assert_eq!(en(Some(3 * 3600 + 100)), "about 3 hours");
        assert_eq!(eta_text(Lang::Ko, Some(30)), "1분 미만");
        assert_eq!(eta_text(Lang::Ko, Some(7200)), "약 2시간");
    }

    #[test]
    fn waiting_query_round_trips() {
        let q = WaitingQuery {
            route: "tickets".into(),
            return_path: "/tickets/42?seat=A1&x=한".into(),
            lang: Some(Lang::Ko),
            start: Some(17),
        };
        let url = q.to_url("/__queuegate/waiting");
        assert!(url.starts_with(
            "/__queuegate/waiting?route=tickets&return=/tickets/42%3Fseat%3DA1%26x%3D%25ED"
        ));
        let query = url.split_once('?').map_or("", |(_, q)| q);
        let parsed = WaitingQuery::parse(query);
        assert_eq!(parsed.route, "tickets");
        assert_eq!(parsed.return_path, "/tickets/42?seat=A1&x=%ED%95%9C");
        assert_eq!(parsed.lang, Some(Lang::Ko));
        assert_eq!(parsed.start, Some(17));
        let hostile = WaitingQuery::parse("route=t&return=%2F%2Fevil.example&start=-3&lang=xx");
        assert_eq!(hostile.return_path, "/");
        assert_eq!(hostile.start, None);
        assert_eq!(hostile.lang, None);
        assert_eq!(WaitingQuery::parse("return=/a+b").return_path, "/");
        assert_eq!(WaitingQuery::parse("").return_path, "/");
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(iso_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_time(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso_time(1_709_210_096), "2024-02-29T12:34:56Z");
        assert_eq!(clock_time_utc(1_709_210_096), "12:34:56 UTC");
    }
}
