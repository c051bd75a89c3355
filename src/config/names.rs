//! The names of the config's unit enums (`Mode`, `OnStoreError`, `Backend`)
//! as serde reads them: the enum's `#[serde(rename_all = ...)]` is the one
//! place they are written, and `as_str` takes them from there.

use std::cell::Cell;

use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

/// The name serde reads for the variant of `T` at `index` (its position in
/// the declaration, which is `variant as usize` for a unit enum without
/// explicit discriminants or skipped variants; the tests of each enum check
/// every variant reads back from its name).
pub(super) fn variant<T: DeserializeOwned>(index: usize) -> &'static str {
    let names = Cell::new(&[][..]);
    // Fails by design: the deserializer only records the variant names.
    let _ = T::deserialize(VariantNames(&names));
    names.get().get(index).copied().unwrap_or("")
}

/// A deserializer that records the variant names serde asks it for.
struct VariantNames<'a>(&'a Cell<&'static [&'static str]>);

impl<'de> Deserializer<'de> for VariantNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom(
            "only the variant names of an enum are read",
        ))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.set(variants);
        Err(de::Error::custom(
            "only the variant names of an enum are read",
        ))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use serde::de::{self, IntoDeserializer};
    use serde::Deserialize;

    use super::super::{Backend, Mode, OnStoreError};

    /// Every variant's name reads back as that variant.
    fn round_trips<T>(all: &[T], as_str: fn(&T) -> &'static str)
    where
        T: for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug,
    {
        for value in all {
            let name = as_str(value);
            let read = T::deserialize(IntoDeserializer::<de::value::Error>::into_deserializer(
                name,
            ));
            assert_eq!(read.as_ref(), Ok(value), "{name:?}");
        }
    }

    #[test]
    fn names_are_the_ones_the_config_reads() {
        assert_eq!(Mode::QueueAll.as_str(), "queue_all");
        assert_eq!(OnStoreError::Local.as_str(), "local");
        assert_eq!(Backend::Redis.as_str(), "redis");
        round_trips(
            &[Mode::Gate, Mode::QueueAll, Mode::Passthrough, Mode::Closed],
            |m| m.as_str(),
        );
        round_trips(
            &[
                OnStoreError::Open,
                OnStoreError::Closed,
                OnStoreError::Local,
            ],
            |p| p.as_str(),
        );
        round_trips(&[Backend::Memory, Backend::Redis], |b| b.as_str());
    }
}
