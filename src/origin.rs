//! What an origin tells queuegate in its answer (DESIGN §8.5, §8.6): two
//! response headers, queuegate's own, read in one place ([`take`]) and
//! removed from every answer before it reaches the client. A client that
//! sends either, in a request's headers or its trailers, has it removed
//! before the origin sees it ([`OWN_FIELDS`]).
//!
//! # `Queuegate-Command`
//!
//! A command for the visitor's session: `end-session` ends it after this
//! answer. A value may list several commands, comma-separated; unknown
//! values are ignored (logged at debug), so an origin can be ahead of the
//! queuegate it runs behind.
//!
//! # `Queuegate-Lane`
//!
//! A response header from the origin, named in any case, possibly repeated
//! or holding a comma-separated list: the last valid lane name in it counts.
//! Other values are ignored (logged at debug), so an origin that sends
//! something queuegate cannot read changes nothing. The lane cookie that
//! records it is `lane_grant`'s.

use http::header::HeaderName;

use crate::fields::Headers;

use crate::lane_grant::Lane;

/// The response header an origin gives queuegate commands in (DESIGN §8.6).
/// It is queuegate's, never the client's: removed from every response
/// before it is answered and from every request before it is forwarded.
pub const QUEUEGATE_COMMAND: HeaderName = HeaderName::from_static("queuegate-command");

/// What an origin may tell queuegate in a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OriginCommand {
    /// `end-session`: end the visitor's session after this response.
    EndSession,
}

impl OriginCommand {
    fn parse(value: &[u8]) -> Option<OriginCommand> {
        value
            .trim_ascii()
            .eq_ignore_ascii_case(b"end-session")
            .then_some(OriginCommand::EndSession)
    }
}

/// Removes every `Queuegate-Command` header (named in any case) from an
/// origin's response and answers the command they give. A value may list
/// several commands, comma-separated; unknown values are ignored (logged at
/// debug), so an origin can be ahead of the queuegate it runs behind.
fn take_command(headers: &mut impl Headers) -> Option<OriginCommand> {
    let mut command = None;
    if !headers.has(&QUEUEGATE_COMMAND) {
        return None;
    }
    for value in headers.all(&QUEUEGATE_COMMAND) {
        for part in value.as_bytes().split(|&b| b == b',') {
            match OriginCommand::parse(part) {
                Some(known) => command = Some(known),
                None => tracing::debug!(
                    value = %String::from_utf8_lossy(part.trim_ascii()),
                    "unknown origin command ignored"
                ),
            }
        }
    }
    headers.take_out(&QUEUEGATE_COMMAND);
    command
}

/// The response header an origin names a visitor's lane in. It is
/// queuegate's, never the client's: removed from every response before it
/// is answered and from every request before it is forwarded.
pub const QUEUEGATE_LANE: HeaderName = HeaderName::from_static("queuegate-lane");

/// queuegate's own fields: a command or a lane is the origin's to give
/// (DESIGN §8.5, §8.6); one in a request, in its headers or its trailers,
/// is nobody's and is not forwarded.
pub static OWN_FIELDS: [HeaderName; 2] = [QUEUEGATE_COMMAND, QUEUEGATE_LANE];

/// What the origin said in an answer's headers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Said {
    /// What its `Queuegate-Command` said, if anything known.
    pub command: Option<OriginCommand>,
    /// The lane its `Queuegate-Lane` named, if a valid one.
    pub lane: Option<Lane>,
}

/// Removes queuegate's own fields from an origin's answer and answers what
/// they said.
pub fn take(headers: &mut impl Headers) -> Said {
    Said {
        command: take_command(headers),
        lane: take_lane(headers),
    }
}

/// Removes every `Queuegate-Lane` header (named in any case) from an
/// origin's response and answers the lane they name: the last valid lane
/// name among their values and comma-separated parts. Invalid names are
/// ignored (logged at debug).
fn take_lane(headers: &mut impl Headers) -> Option<Lane> {
    if !headers.has(&QUEUEGATE_LANE) {
        return None;
    }
    let mut lane = None;
    for value in headers.all(&QUEUEGATE_LANE) {
        for part in value.as_bytes().split(|&b| b == b',') {
            let part = part.trim_ascii();
            match std::str::from_utf8(part).ok().and_then(Lane::new) {
                Some(named) => lane = Some(named),
                None => tracing::debug!(
                    value = %String::from_utf8_lossy(&part[..part.len().min(64)]),
                    "invalid lane from the origin ignored"
                ),
            }
        }
    }
    headers.take_out(&QUEUEGATE_LANE);
    lane
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;
    use http::HeaderValue;

    #[test]
    fn origin_commands_are_taken_out_in_any_case_and_unknown_ones_ignored() {
        let mut h = HeaderMap::new();
        h.append("Queuegate-Command", HeaderValue::from_static("launch"));
        assert_eq!(take_command(&mut h), None);
        assert!(h.is_empty());
        h.append("QUEUEGATE-COMMAND", HeaderValue::from_static("x"));
        h.append(
            "queuegate-command",
            HeaderValue::from_static("x, End-Session "),
        );
        h.append("x-other", HeaderValue::from_static("1"));
        assert_eq!(take_command(&mut h), Some(OriginCommand::EndSession));
        assert!(!h.contains_key(QUEUEGATE_COMMAND));
        assert_eq!(h.len(), 1);
        assert_eq!(take_command(&mut h), None);
    }

    #[test]
    fn take_lane_takes_every_header_and_the_last_valid_name() {
        let mut h = HeaderMap::new();
        assert_eq!(take_lane(&mut h), None);
        h.append("Queuegate-Lane", "vip".parse().unwrap());
        assert_eq!(take_lane(&mut h), Lane::new("vip"));
        assert!(h.is_empty());
        h.append("QUEUEGATE-LANE", "press".parse().unwrap());
        h.append("queuegate-lane", " staff , NOT VALID, ".parse().unwrap());
        h.append("x-other", "1".parse().unwrap());
        assert_eq!(take_lane(&mut h), Lane::new("staff"));
        assert!(!h.contains_key(QUEUEGATE_LANE));
        assert_eq!(h.len(), 1);
        for bad in ["VIP", "", "a.b", "waytoolongforalane", "v\u{e9}p"] {
            let mut h = HeaderMap::new();
            h.append(
                QUEUEGATE_LANE,
                http::HeaderValue::from_bytes(bad.as_bytes()).unwrap(),
            );
            assert_eq!(take_lane(&mut h), None, "{bad}");
            assert!(h.is_empty());
        }
    }

    #[test]
    fn take_reads_both_fields_and_leaves_the_rest() {
        let mut h = HeaderMap::new();
        h.append("Queuegate-Command", HeaderValue::from_static("end-session"));
        h.append("Queuegate-Lane", HeaderValue::from_static("vip"));
        h.append("x-other", HeaderValue::from_static("1"));
        let said = take(&mut h);
        assert_eq!(said.command, Some(OriginCommand::EndSession));
        assert_eq!(said.lane, Lane::new("vip"));
        assert_eq!(h.len(), 1);
        assert_eq!(take(&mut h), Said::default());
    }
}
