//! A message's header fields as a list in the order they came
//! ([`Fields`]), read and rewritten without a hash map.
//!
//! An HTTP/1 head (a client's request, an origin's answer) is parsed once,
//! and its fields stay where they were read: each name is a span of the
//! frozen head, each value a `HeaderValue` sharing its bytes. A message
//! carries a dozen fields or so and is asked for a few of them by name, so
//! a look along the list costs less than building a `HeaderMap` (a table
//! allocated, every name parsed and hashed) for each message. HTTP/2's
//! fields come as hyper's `HeaderMap` and are moved into the same list.
//!
//! Names are compared without regard to case, as HTTP says; a name
//! queuegate sets is a `HeaderName`. Written out (by `h1::write` and
//! `h1::answer`) every name is in lower case, as hyper writes them.
//!
//! [`Headers`] is what reading a message's fields needs, for the rules
//! that read a [`Fields`] list and a `HeaderMap` (trailers, a test's
//! fields) alike.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};

/// A message's header fields, in the order they came (see the module
/// docs).
#[derive(Clone, Default)]
pub struct Fields {
    /// The head the names as sent are spans of (empty if none are).
    head: Bytes,
    list: Vec<Field>,
}

/// A field that cannot be added: outside its head, or not a field value.
#[derive(Debug, PartialEq, Eq)]
pub struct BadField;

#[derive(Clone)]
struct Field {
    name: Name,
    value: HeaderValue,
}

#[derive(Clone)]
enum Name {
    /// `head[start..end]`, as the client spelled it.
    Sent { start: u32, end: u32 },
    /// Set by queuegate, or moved from a `HeaderMap`.
    Set(HeaderName),
}

/// A field name to look for: a `HeaderName`, a reference to one, or a
/// name's text (compared without regard to case).
pub trait AsName {
    fn name_str(&self) -> &str;
}

impl AsName for HeaderName {
    fn name_str(&self) -> &str {
        self.as_str()
    }
}

impl AsName for &HeaderName {
    fn name_str(&self) -> &str {
        self.as_str()
    }
}

impl AsName for &str {
    fn name_str(&self) -> &str {
        self
    }
}

impl Fields {
    /// No fields.
    pub fn new() -> Fields {
        Fields::default()
    }

    /// Room for `capacity` fields, whose names as sent are spans of `head`
    /// (see [`Fields::push_sent`]).
    pub fn over(head: Bytes, capacity: usize) -> Fields {
        Fields {
            head,
            list: Vec::with_capacity(capacity),
        }
    }

    /// Adds the field named `head[name.0..name.1]` (a valid name, which
    /// the caller has parsed) with the value `head[value.0..value.1]`,
    /// shared with the head. Fails, adding nothing, on a span outside the
    /// head or a value that is not a field value.
    pub fn push_sent(&mut self, name: (u32, u32), value: (u32, u32)) -> Result<(), BadField> {
        let len = self.head.len();
        let in_head = |(s, e): (u32, u32)| s <= e && (e as usize) <= len;
        if !in_head(name) || !in_head(value) {
            return Err(BadField);
        }
        let value = self.head.slice(value.0 as usize..value.1 as usize);
        let value = HeaderValue::from_maybe_shared(value).map_err(|_| BadField)?;
        let name = Name::Sent {
            start: name.0,
            end: name.1,
        };
        self.list.push(Field { name, value });
        Ok(())
    }

    /// How many fields there are (a name given twice counts twice).
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The name of `field`, as it was sent or set.
    fn name_of<'a>(&'a self, field: &'a Field) -> &'a [u8] {
        match &field.name {
            Name::Sent { start, end } => self
                .head
                .get(*start as usize..*end as usize)
                .unwrap_or_default(),
            Name::Set(name) => name.as_str().as_bytes(),
        }
    }

    /// Whether `field` is named `name`.
    fn is(&self, field: &Field, name: &str) -> bool {
        named(&self.head, field, name)
    }

    /// The first value of `name`.
    pub fn get(&self, name: impl AsName) -> Option<&HeaderValue> {
        let name = name.name_str();
        self.list
            .iter()
            .find(|f| self.is(f, name))
            .map(|f| &f.value)
    }

    /// Every value of `name`, in order.
    pub fn get_all<'a, N: AsName + 'a>(
        &'a self,
        name: N,
    ) -> impl DoubleEndedIterator<Item = &'a HeaderValue> + 'a {
        self.list
            .iter()
            .filter(move |f| self.is(f, name.name_str()))
            .map(|f| &f.value)
    }

    /// Whether `name` is there.
    pub fn contains_key(&self, name: impl AsName) -> bool {
        self.get(name).is_some()
    }

    /// Takes out every field named `name`; the first value, if there was
    /// one.
    pub fn remove(&mut self, name: impl AsName) -> Option<HeaderValue> {
        let name = name.name_str();
        let first = self.list.iter().position(|f| self.is(f, name))?;
        let taken = self.list.remove(first);
        let rest = self.list.get(first..).unwrap_or_default();
        if rest.iter().any(|f| self.is(f, name)) {
            let head = &self.head;
            self.list.retain(|f| !named(head, f, name));
        }
        Some(taken.value)
    }

    /// Sets `name` to `value` alone: in the place of its first field if
    /// it had one (the others taken out), else last.
    pub fn insert(&mut self, name: HeaderName, value: HeaderValue) {
        match self.list.iter().position(|f| self.is(f, name.as_str())) {
            None => self.append(name, value),
            Some(first) => {
                let rest = self.list.get(first + 1..).unwrap_or_default();
                if rest.iter().any(|f| self.is(f, name.as_str())) {
                    let head = &self.head;
                    let mut at = 0;
                    self.list.retain(|f| {
                        at += 1;
                        at - 1 <= first || !named(head, f, name.as_str())
                    });
                }
                if let Some(field) = self.list.get_mut(first) {
                    *field = Field {
                        name: Name::Set(name),
                        value,
                    };
                }
            }
        }
    }

    /// Adds a field named `name`, last.
    pub fn append(&mut self, name: HeaderName, value: HeaderValue) {
        self.list.push(Field {
            name: Name::Set(name),
            value,
        });
    }

    /// Replaces the last value of `name`, if it has one, by what `f`
    /// makes of it.
    pub fn update_last(&mut self, name: &HeaderName, f: impl FnOnce(&HeaderValue) -> HeaderValue) {
        let last = self
            .list
            .iter()
            .rposition(|field| self.is(field, name.as_str()));
        if let Some(field) = last.and_then(|at| self.list.get_mut(at)) {
            field.value = f(&field.value);
        }
    }

    /// Each field, in order, as a `HeaderName` and its value (a name that
    /// is not a valid one, which a parsed head cannot have, is left out).
    pub fn into_named(self) -> impl Iterator<Item = (HeaderName, HeaderValue)> {
        let head = self.head;
        self.list.into_iter().filter_map(move |f| {
            let name = match f.name {
                Name::Set(name) => name,
                Name::Sent { start, end } => {
                    let sent = head.get(start as usize..end as usize)?;
                    HeaderName::from_bytes(sent).ok()?
                }
            };
            Some((name, f.value))
        })
    }

    /// Each field, in order: its name as sent (any case) or set, and its
    /// value.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &HeaderValue)> + '_ {
        self.list.iter().map(|f| (self.name_of(f), &f.value))
    }
}

/// Whether `field` of a list over `head` is named `name`, in any case
/// (apart from the list, for `retain`, which borrows it).
fn named(head: &Bytes, field: &Field, name: &str) -> bool {
    let field = match &field.name {
        Name::Set(set) => set.as_str().as_bytes(),
        Name::Sent { start, end } => head.get(*start as usize..*end as usize).unwrap_or_default(),
    };
    let name = name.as_bytes();
    field.len() == name.len() && field.eq_ignore_ascii_case(name)
}

impl From<HeaderMap> for Fields {
    /// The fields of a `HeaderMap`, in its order (a name's values
    /// together).
    fn from(map: HeaderMap) -> Fields {
        let mut list = Vec::with_capacity(map.len());
        let mut last: Option<HeaderName> = None;
        for (name, value) in map {
            let name = match name {
                Some(name) => {
                    last = Some(name.clone());
                    name
                }
                // A further value of the name before it.
                None => match &last {
                    Some(name) => name.clone(),
                    None => continue,
                },
            };
            list.push(Field {
                name: Name::Set(name),
                value,
            });
        }
        Fields {
            head: Bytes::new(),
            list,
        }
    }
}

impl std::fmt::Debug for Fields {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(
                self.iter()
                    .map(|(name, value)| (String::from_utf8_lossy(name), value)),
            )
            .finish()
    }
}

/// Reading and setting a message's fields by name, the same for a
/// [`Fields`] list and a `HeaderMap`.
pub trait Headers {
    /// Every value of `name`, in order.
    fn all<'a>(&'a self, name: &HeaderName) -> impl DoubleEndedIterator<Item = &'a HeaderValue>;
    /// The first value of `name`.
    fn first(&self, name: &HeaderName) -> Option<&HeaderValue>;
    /// Whether `name` is there.
    fn has(&self, name: &HeaderName) -> bool {
        self.first(name).is_some()
    }
    /// Each name, once for each field, in lower or any case.
    fn names(&self) -> impl Iterator<Item = &[u8]>;
    /// Takes out every field named `name`.
    fn take_out(&mut self, name: &HeaderName);
    /// Sets `name` to `value` alone.
    fn put(&mut self, name: HeaderName, value: HeaderValue);
}

impl Headers for Fields {
    fn all<'a>(&'a self, name: &HeaderName) -> impl DoubleEndedIterator<Item = &'a HeaderValue> {
        // Cloned (a copy for every name queuegate looks for) so that the
        // values outlive a name made for the call.
        self.get_all(name.clone())
    }

    fn first(&self, name: &HeaderName) -> Option<&HeaderValue> {
        self.get(name)
    }

    fn names(&self) -> impl Iterator<Item = &[u8]> {
        self.list.iter().map(|f| self.name_of(f))
    }

    fn take_out(&mut self, name: &HeaderName) {
        self.remove(name);
    }

    fn put(&mut self, name: HeaderName, value: HeaderValue) {
        self.insert(name, value);
    }
}

impl Headers for HeaderMap {
    fn all<'a>(&'a self, name: &HeaderName) -> impl DoubleEndedIterator<Item = &'a HeaderValue> {
        self.get_all(name).iter()
    }

    fn first(&self, name: &HeaderName) -> Option<&HeaderValue> {
        self.get(name)
    }

    fn names(&self) -> impl Iterator<Item = &[u8]> {
        self.keys().map(|n| n.as_str().as_bytes())
    }

    fn take_out(&mut self, name: &HeaderName) {
        self.remove(name);
    }

    fn put(&mut self, name: HeaderName, value: HeaderValue) {
        self.insert(name, value);
    }
}

/// Test helpers: fields as a client sent them, and a list's fields as text.
#[cfg(test)]
pub mod testing {
    use super::*;

    /// The fields of a head as sent, names in the case given.
    pub fn sent(pairs: &[(&str, &str)]) -> Fields {
        let mut head = Vec::new();
        let mut spans = Vec::new();
        for (name, value) in pairs {
            let n = head.len() as u32;
            head.extend_from_slice(name.as_bytes());
            let v = head.len() as u32;
            head.extend_from_slice(value.as_bytes());
            spans.push(((n, v), (v, head.len() as u32)));
        }
        let mut fields = Fields::over(Bytes::from(head), spans.len());
        for (name, value) in spans {
            fields.push_sent(name, value).unwrap();
        }
        fields
    }

    /// Each field as `name=value`, the name as sent or set.
    pub fn names(fields: &Fields) -> Vec<String> {
        fields
            .iter()
            .map(|(n, v)| format!("{}={}", String::from_utf8_lossy(n), v.to_str().unwrap()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{names, sent};
    use super::*;
    use http::header;

    #[test]
    fn names_are_found_whatever_their_case_and_values_keep_their_order() {
        let f = sent(&[("Cookie", "a=1"), ("HOST", "x"), ("cookie", "b=2")]);
        assert_eq!(f.get(header::HOST).unwrap(), "x");
        let cookies: Vec<_> = f.get_all(header::COOKIE).collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert!(f.contains_key(&header::COOKIE));
        assert!(!f.contains_key(header::ACCEPT));
        assert!(f.get(header::ACCEPT).is_none());
    }

    #[test]
    fn insert_replaces_in_place_remove_takes_every_one_and_append_goes_last() {
        let mut f = sent(&[("a-b", "1"), ("Host", "x"), ("A-B", "2"), ("c", "3")]);
        let ab = HeaderName::from_static("a-b");
        f.insert(ab.clone(), HeaderValue::from_static("9"));
        assert_eq!(names(&f), ["a-b=9", "Host=x", "c=3"]);
        f.append(ab.clone(), HeaderValue::from_static("10"));
        assert_eq!(f.remove(&ab).unwrap(), "9");
        assert_eq!(names(&f), ["Host=x", "c=3"]);
        assert!(f.remove(&ab).is_none());
        f.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        assert_eq!(names(&f), ["Host=x", "c=3", "accept=*/*"]);
        f.update_last(&header::ACCEPT, |_| HeaderValue::from_static("t"));
        assert_eq!(f.get(header::ACCEPT).unwrap(), "t");
    }

    #[test]
    fn a_span_outside_the_head_or_a_bad_value_is_refused() {
        let mut f = Fields::over(Bytes::from_static(b"ab\x01"), 2);
        assert!(f.push_sent((0, 1), (1, 9)).is_err());
        assert!(f.push_sent((0, 1), (2, 3)).is_err());
        assert!(f.push_sent((0, 1), (1, 2)).is_ok());
        assert_eq!(f.len(), 1);
    }

    #[test]
    fn a_header_map_moves_in_with_each_value() {
        let mut map = HeaderMap::new();
        map.append(header::COOKIE, HeaderValue::from_static("a=1"));
        map.append(header::HOST, HeaderValue::from_static("x"));
        map.append(header::COOKIE, HeaderValue::from_static("b=2"));
        let f = Fields::from(map);
        assert_eq!(names(&f), ["cookie=a=1", "cookie=b=2", "host=x"]);
        assert_eq!(Headers::names(&f).count(), 3);
    }
}
