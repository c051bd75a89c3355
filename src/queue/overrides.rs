//! A route's runtime override (DESIGN §9.4): the mode and capacity an
//! operator set from the admin listener, as every store keeps it (one value
//! per route), with what the config file said of each field when it was
//! set. The rule of when an override stops holding is here, once.

use serde::{Deserialize, Serialize};

use crate::config::Mode;

/// An overridden field: the value in force, and what the file said when the
/// override was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Held<T> {
    pub value: T,
    pub file: T,
}

/// A route's override: either field or both, who set it (the admin token's
/// name) and when (unix ms).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Override {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Held<Mode>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Held<u64>>,
    pub by: String,
    pub at_ms: u64,
}

impl Override {
    /// Whether it overrides nothing.
    pub fn is_empty(&self) -> bool {
        self.mode.is_none() && self.capacity.is_none()
    }

    /// The text the stores keep.
    pub fn encode(&self) -> String {
        // A struct of strings and numbers always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// An override from the text a store kept; `None` for text this version
    /// did not write (it is then as if there were none).
    pub fn decode(text: &str) -> Option<Override> {
        serde_json::from_str(text).ok()
    }

    /// What still holds while the file says `mode` and `capacity`: a field
    /// holds while the file says what it said when the field was overridden;
    /// once the file says something else of it, the file's word is newer.
    /// `None` when nothing holds.
    pub fn holding(&self, mode: Mode, capacity: u64) -> Option<Override> {
        let kept = Override {
            mode: self.mode.filter(|held| held.file == mode),
            capacity: self.capacity.filter(|held| held.file == capacity),
            by: self.by.clone(),
            at_ms: self.at_ms,
        };
        (!kept.is_empty()).then_some(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both() -> Override {
        Override {
            mode: Some(Held {
                value: Mode::Closed,
                file: Mode::Gate,
            }),
            capacity: Some(Held {
                value: 50,
                file: 10,
            }),
            by: "ops".to_owned(),
            at_ms: 1,
        }
    }

    #[test]
    fn a_field_holds_while_the_file_says_what_it_said() {
        let o = both();
        assert_eq!(o.holding(Mode::Gate, 10), Some(o.clone()));
        let kept = o.holding(Mode::Gate, 20).expect("the mode holds");
        assert_eq!((kept.mode, kept.capacity), (o.mode, None));
        let kept = o.holding(Mode::QueueAll, 10).expect("the capacity holds");
        assert_eq!((kept.mode, kept.capacity), (None, o.capacity));
        assert_eq!(o.holding(Mode::QueueAll, 20), None);
    }

    #[test]
    fn the_stored_text_reads_back_and_foreign_text_is_none() {
        let o = both();
        assert_eq!(Override::decode(&o.encode()), Some(o));
        assert_eq!(Override::decode("{\"by\":\"x\"}"), None);
        assert_eq!(Override::decode("not json"), None);
    }
}
