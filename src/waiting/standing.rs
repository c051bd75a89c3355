//! Where a visitor stands on a route, as the JSON an app reads it: the
//! status endpoint's answer, each event of its stream, leave's answer, and
//! the answer to a held-back request that is not a navigation (DESIGN §1
//! step 5). One struct, serialised straight into the answer's text.

use serde::Serialize;

/// The fields of a status answer; a field that is `None` is left out.
///
/// They are declared in the alphabetical order of their names, the order
/// in which these answers have always listed them, so an answer reads
/// byte for byte as before.
#[derive(Debug, Default, Serialize)]
pub struct Standing<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ahead: Option<u64>,
    /// `Some(None)` is written as `null`: no estimate yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<Option<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lane: Option<&'a str>,
    /// `Some(None)` is written as `null`: the route has no opening time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_in_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<bool>,
    #[serde(rename = "return", skip_serializing_if = "Option::is_none")]
    pub return_path: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<&'a str>,
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_total: Option<u64>,
}

impl Standing<'_> {
    /// The JSON text.
    pub fn to_json(&self) -> String {
        // Strings, numbers and booleans only: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field set, with text that needs escaping.
    fn full() -> Standing<'static> {
        Standing {
            ahead: Some(2),
            eta_seconds: Some(Some(40)),
            lane: Some("vip"),
            opens_at: Some(Some("2026-12-05T10:00:00Z".into())),
            opens_in_ms: Some(0),
            poll_after_ms: Some(1_042),
            position: Some(3),
            priority: Some(true),
            return_path: Some("/a?b=\"c\"&d=\\é\u{1}"),
            route: Some("tickets"),
            state: "waiting",
            status_url: Some("/__queuegate/status?route=tickets".into()),
            waiting_total: Some(u64::MAX),
        }
    }

    /// The text a sorted JSON map of the same fields makes, as the answers
    /// were written before.
    fn as_map(standing: &Standing<'_>) -> String {
        let value = serde_json::to_value(standing).unwrap_or_default();
        let map: std::collections::BTreeMap<String, serde_json::Value> =
            serde_json::from_value(value).unwrap_or_default();
        serde_json::to_string(&map).unwrap_or_default()
    }

    #[test]
    fn writes_what_a_sorted_map_of_the_same_fields_writes() {
        let full = full();
        assert_eq!(full.to_json(), as_map(&full));
        assert!(full
            .to_json()
            .starts_with(r#"{"ahead":2,"eta_seconds":40,"#));
        let nulls = Standing {
            eta_seconds: Some(None),
            opens_at: Some(None),
            ..full
        };
        assert_eq!(nulls.to_json(), as_map(&nulls));
        assert!(nulls.to_json().contains(r#""eta_seconds":null"#));
        assert!(nulls.to_json().contains(r#""opens_at":null"#));
    }

    #[test]
    fn leaves_out_the_fields_not_set() {
        let unknown = Standing {
            state: "unknown",
            route: Some(""),
            ..Standing::default()
        };
        assert_eq!(unknown.to_json(), r#"{"route":"","state":"unknown"}"#);
    }
}
