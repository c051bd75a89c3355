//! The route controls (DESIGN §9.4): `PUT /routes/{name}/override` with
//! `{"mode": …, "capacity": N}` (either or both) and `DELETE
//! /routes/{name}/override`. A change needs an admin token; it is kept in
//! the store (every instance follows it within a tick), laid over this
//! instance's settings at once, and logged with the token's name. A refused
//! change changes nothing.

use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::clock::Clock;
use crate::config::Mode;
use crate::message::Answer;
use crate::metrics::Metrics;
use crate::queue::{Guarded, Held, Override, QueueStore};
use crate::response::{self, Body};
use crate::route::{RouteRt, Settings};

/// Most bytes a control's body may have.
pub const MAX_BODY: usize = 4096;

/// Highest capacity a control may set.
pub const MAX_CAPACITY: u64 = 1_000_000_000;

/// What a control asks to set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asked {
    pub mode: Option<Mode>,
    pub capacity: Option<u64>,
}

/// A body refused: the field it names and why.
#[derive(Debug, PartialEq, Eq)]
pub struct BadField {
    pub field: String,
    pub message: String,
}

impl BadField {
    fn new(field: &str, message: impl Into<String>) -> BadField {
        BadField {
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

/// Reads a control's JSON body: an object with `mode` (one of the route
/// modes) and/or `capacity` (a whole number from 1), nothing else.
pub fn parse(body: &[u8]) -> Result<Asked, BadField> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|_| BadField::new("body", "expected a JSON object"))?;
    let Value::Object(fields) = value else {
        return Err(BadField::new("body", "expected a JSON object"));
    };
    if let Some(unknown) = fields.keys().find(|k| *k != "mode" && *k != "capacity") {
        return Err(BadField::new(
            unknown,
            "unknown field: give mode, capacity or both",
        ));
    }
    let mode = match fields.get("mode") {
        None => None,
        Some(v) => Some(serde_json::from_value::<Mode>(v.clone()).map_err(|_| {
            BadField::new(
                "mode",
                "expected one of gate, queue_all, passthrough, closed",
            )
        })?),
    };
    let capacity = match fields.get("capacity") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|c| (1..=MAX_CAPACITY).contains(c))
                .ok_or_else(|| {
                    BadField::new(
                        "capacity",
                        format!("expected a whole number from 1 to {MAX_CAPACITY}"),
                    )
                })?,
        ),
    };
    if mode.is_none() && capacity.is_none() {
        return Err(BadField::new("body", "give mode, capacity or both"));
    }
    Ok(Asked { mode, capacity })
}

/// The override `asked` makes of `route`, on top of the one it runs with
/// (a field not asked keeps its override, if any), by `who` at `at_ms`.
pub fn overriding(route: &RouteRt, asked: Asked, who: &str, at_ms: u64) -> Override {
    let current = route.overridden.as_ref();
    Override {
        mode: asked
            .mode
            .map(|value| Held {
                value,
                file: route.file_mode,
            })
            .or_else(|| current.and_then(|o| o.mode)),
        capacity: asked
            .capacity
            .map(|value| Held {
                value,
                file: route.file_capacity,
            })
            .or_else(|| current.and_then(|o| o.capacity)),
        by: who.to_owned(),
        at_ms,
    }
}

/// What the controls act with.
pub struct Controls<'a> {
    pub store: &'a Guarded,
    pub settings: &'a ArcSwap<Settings>,
    pub metrics: &'a Metrics,
    pub clock: Clock,
}

impl Controls<'_> {
    /// Answers a `PUT` or `DELETE` of route `name`'s override by `who` (the
    /// token's name, already checked), with the request's `body`.
    pub async fn answer(
        &self,
        method: &Method,
        name: &str,
        who: &str,
        body: &Bytes,
    ) -> Answer<Body> {
        let settings = self.settings.load();
        let Some(index) = settings.route_named(name) else {
            return refused(
                StatusCode::NOT_FOUND,
                &BadField::new("route", format!("no route named {name:?}")),
            );
        };
        let route = &settings.routes[index];
        let value = if *method == Method::DELETE {
            None
        } else {
            match parse(body) {
                Ok(asked) => Some(overriding(route, asked, who, self.clock.now_us() / 1_000)),
                Err(bad) => return refused(StatusCode::BAD_REQUEST, &bad),
            }
        };
        if let Err(err) = self.store.set_override(name, value.as_ref()).await {
            tracing::warn!(route = name, by = who, error = %err, "override not changed: the store did not answer");
            return response::json(
                StatusCode::SERVICE_UNAVAILABLE,
                "admin-store-down",
                json!({ "error": "the store did not answer: nothing was changed" }).to_string(),
            );
        }
        log_change(route, who, value.as_ref());
        let name = name.to_owned();
        self.settings
            .rcu(|current| Arc::new(current.with_override(&name, value.clone(), self.metrics)));
        response::json(
            StatusCode::OK,
            "admin-override",
            json!({ "route": name, "override": value }).to_string(),
        )
    }
}

/// One log line per change: who, which route, what it was and is now.
fn log_change(route: &RouteRt, who: &str, value: Option<&Override>) {
    let name = route.name();
    let (was_mode, was_capacity) = (route.cfg.mode.as_str(), route.capacity_now());
    match value {
        Some(o) => tracing::info!(
            route = name,
            by = who,
            mode = o.mode.map_or(was_mode, |m| m.value.as_str()),
            capacity = o.capacity.map_or(was_capacity, |c| c.value),
            was_mode,
            was_capacity,
            "override set"
        ),
        None => tracing::info!(
            route = name,
            by = who,
            mode = route.file_mode.as_str(),
            capacity = route.file_capacity,
            was_mode,
            was_capacity,
            "override cleared: the config file's values apply"
        ),
    }
}

/// A `status` answer naming the field that was refused.
pub fn refused(status: StatusCode, bad: &BadField) -> Answer<Body> {
    response::json(
        status,
        "admin-refused",
        json!({ "error": bad.message, "field": bad.field }).to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(body: &str) -> String {
        parse(body.as_bytes()).unwrap_err().field
    }

    #[test]
    fn a_body_sets_mode_capacity_or_both_and_names_what_it_refuses() {
        assert_eq!(
            parse(br#"{"mode":"closed"}"#).unwrap(),
            Asked {
                mode: Some(Mode::Closed),
                capacity: None
            }
        );
        assert_eq!(
            parse(br#"{"mode":"queue_all","capacity":7}"#).unwrap(),
            Asked {
                mode: Some(Mode::QueueAll),
                capacity: Some(7)
            }
        );
        assert_eq!(field(r#"{"mode":"open"}"#), "mode");
        assert_eq!(field(r#"{"mode":3}"#), "mode");
        assert_eq!(field(r#"{"capacity":0}"#), "capacity");
        assert_eq!(field(r#"{"capacity":-5}"#), "capacity");
        assert_eq!(field(r#"{"capacity":2.5}"#), "capacity");
        assert_eq!(field(r#"{"capacity":"9"}"#), "capacity");
        assert_eq!(field(r#"{"mode":"gate","colour":"red"}"#), "colour");
        assert_eq!(field("{}"), "body");
        assert_eq!(field("[1]"), "body");
        assert_eq!(field("not json"), "body");
    }
}
