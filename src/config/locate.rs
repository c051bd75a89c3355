//! Finding the line of a field path in the YAML text.
//!
//! `serde_yaml::Value` keeps no positions, but the YAML deserializer stamps
//! the position of the current node on any error raised while reading it. So
//! to find `routes[1].tick` the text is read once more, skipping everything
//! off that path, and an error is raised on reaching the `tick` key: its
//! position is the answer.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::error::{FieldPath, Segment};

/// Raised on reaching the sought node; never escapes this module.
const FOUND: &str = "queuegate-config-locate-found";

/// The 1-based line of `path` in `text`, or `None` when the path is not
/// written there (a missing field, or one that came in by a merge key).
pub(crate) fn line_of(text: &str, path: &FieldPath) -> Option<usize> {
    if path.segments().is_empty() {
        return None;
    }
    let result = Seek(path.segments()).deserialize(serde_yaml::Deserializer::from_str(text));
    match result {
        Err(err) if err.to_string().contains(FOUND) => err.location().map(|at| at.line()),
        _ => None,
    }
}

/// The line of `path`, or of the nearest enclosing field that is written.
pub(crate) fn nearest_line(text: &str, path: &FieldPath) -> Option<usize> {
    let mut current = Some(path.clone());
    while let Some(path) = current {
        if let Some(line) = line_of(text, &path) {
            return Some(line);
        }
        current = path.parent();
    }
    None
}

/// Walks towards the node at the remaining segments.
struct Seek<'a>(&'a [Segment]);

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        if self.0.is_empty() {
            // Fail from inside the node so the error carries its position.
            deserializer.deserialize_any(Here)
        } else {
            deserializer.deserialize_any(self)
        }
    }
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((Segment::Key(wanted), rest)) = self.0.split_first() else {
            return drain_map(map);
        };
        while let Some(is_wanted) = map.next_key_seed(KeySeek {
            wanted,
            last: rest.is_empty(),
        })? {
            if is_wanted {
                map.next_value_seed(Seek(rest))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((Segment::Index(wanted), rest)) = self.0.split_first() else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        let mut index = 0;
        loop {
            let more = if index == *wanted {
                seq.next_element_seed(Seek(rest))?.is_some()
            } else {
                seq.next_element::<IgnoredAny>()?.is_some()
            };
            if !more {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        // A tagged node (`!tag value`): look inside it no further.
        let (IgnoredAny, variant) = data.variant::<IgnoredAny>()?;
        de::VariantAccess::newtype_variant::<IgnoredAny>(variant)?;
        Ok(())
    }
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Reads one mapping key; fails on the sought key when it ends the path, so
/// the position is the key's own rather than its value's.
struct KeySeek<'a> {
    wanted: &'a str,
    last: bool,
}

impl<'de> DeserializeSeed<'de> for KeySeek<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeySeek<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        if key == self.wanted && self.last {
            return Err(E::custom(FOUND));
        }
        Ok(key == self.wanted)
    }

    fn visit_bool<E: de::Error>(self, key: bool) -> Result<bool, E> {
        self.visit_str(&key.to_string())
    }

    fn visit_i64<E: de::Error>(self, key: i64) -> Result<bool, E> {
        self.visit_str(&key.to_string())
    }

    fn visit_u64<E: de::Error>(self, key: u64) -> Result<bool, E> {
        self.visit_str(&key.to_string())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
        drain_map(map)?;
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

/// Fails on whatever node it is given.
struct Here;

impl Here {
    fn found<E: de::Error>() -> Result<(), E> {
        Err(E::custom(FOUND))
    }
}

impl<'de> Visitor<'de> for Here {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Self::found()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Self::found()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Self::found()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Self::found()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Self::found()
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Self::found()
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Self::found()
    }

    fn visit_some<D: Deserializer<'de>>(self, _: D) -> Result<(), D::Error> {
        Self::found()
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Self::found()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Self::found()
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Self::found()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
upstream:
  url: http://127.0.0.1:3000
routes:
  - name: a
    tick: 3
  - { name: b, foo: 1 }
  - name: c
    page:
      title: x
";

    fn path(segments: &[&str]) -> FieldPath {
        let mut path = FieldPath::root();
        for segment in segments {
            path = match segment.parse::<usize>() {
                Ok(index) => path.index(index),
                Err(_) => path.key(segment),
            };
        }
        path
    }

    #[test]
    fn keys_are_found_on_their_own_line() {
        assert_eq!(line_of(TEXT, &path(&["upstream", "url"])), Some(2));
        assert_eq!(line_of(TEXT, &path(&["routes", "0", "tick"])), Some(5));
        assert_eq!(line_of(TEXT, &path(&["routes", "1", "foo"])), Some(6));
        assert_eq!(line_of(TEXT, &path(&["routes", "2", "page"])), Some(8));
        assert_eq!(
            line_of(TEXT, &path(&["routes", "2", "page", "title"])),
            Some(9)
        );
        assert_eq!(line_of(TEXT, &path(&["routes"])), Some(3));
    }

    #[test]
    fn list_items_are_found_at_their_first_line() {
        assert_eq!(line_of(TEXT, &path(&["routes", "1"])), Some(6));
        assert_eq!(line_of(TEXT, &path(&["routes", "2"])), Some(7));
    }

    #[test]
    fn missing_fields_fall_back_to_the_enclosing_one() {
        assert_eq!(line_of(TEXT, &path(&["routes", "2", "capacity"])), None);
        assert_eq!(
            nearest_line(TEXT, &path(&["routes", "2", "capacity"])),
            Some(7)
        );
        assert_eq!(nearest_line(TEXT, &path(&["routes", "9"])), Some(3));
        assert_eq!(nearest_line(TEXT, &path(&["store"])), None);
    }
}
