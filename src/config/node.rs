//! The YAML node tree: every node and every mapping key with the line it is
//! written on, and a serde `Deserializer` over the tree so the raw structs are
//! read from it.
//!
//! The text is parsed by `serde-saphyr`: it is maintained (`serde_yaml` is
//! not), never panics on malformed input, expands anchors and merge keys
//! (`<<: *base`), rejects duplicate keys, and its `Spanned<T>` gives each
//! node where it is written (`referenced`) and where its value was first
//! written (`defined`, which differs for what came in by an alias or a merge
//! key). The tree keeps those positions, so the line of a field path is a
//! walk down the tree rather than a second parse.
//!
//! Plain scalars are typed as YAML 1.2 does: only `true`/`false` are
//! booleans (`on`, `yes` and `y` stay text), and `007` or `1_000` are text,
//! not numbers.

use std::fmt;

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{
    self, Deserialize, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Unexpected, Visitor,
};
use serde_saphyr::{Location, Spanned};

/// Errors while reading the raw structs from the tree: serde's messages.
pub(crate) type Error = de::value::Error;

/// One YAML node, its children with their positions.
#[derive(Clone, Debug)]
pub(crate) enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<Node>>),
    /// Entries in file order; keys are nodes too (`1: x` is valid YAML).
    Map(Vec<(Spanned<Node>, Spanned<Node>)>),
}

/// Why a text is not a YAML document.
#[derive(Debug)]
pub(crate) struct SyntaxError {
    /// 1-based line, when the parser knows it.
    pub line: Option<usize>,
    pub column: Option<usize>,
    /// What is wrong, without the position.
    pub message: String,
}

/// Parses one YAML document; `None` when the text holds no document (empty,
/// only comments, or a lone `null`).
pub(crate) fn parse(text: &str) -> Result<Option<Spanned<Node>>, SyntaxError> {
    let options = serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        with_snippet: false,
    };
    serde_saphyr::from_str_with_options::<Option<Spanned<Node>>>(text, options)
        .map(|root| root.filter(|root| !matches!(root.value, Node::Null)))
        .map_err(|err| {
            let at = err
                .location()
                .and_then(|at| Some((line(&at)?, column(&at)?)));
            let mut message = err.without_snippet().to_string();
            if let Some((line, column)) = at {
                let suffix = format!(" at line {line}, column {column}");
                if let Some(stripped) = message.strip_suffix(&suffix) {
                    message = stripped.to_owned();
                }
            }
            SyntaxError {
                line: at.map(|(line, _)| line),
                column: at.map(|(_, column)| column),
                message,
            }
        })
}

/// The 1-based line of a position; `None` when the parser does not know it.
pub(crate) fn line(at: &Location) -> Option<usize> {
    usize::try_from(at.line()).ok().filter(|line| *line > 0)
}

fn column(at: &Location) -> Option<usize> {
    usize::try_from(at.column())
        .ok()
        .filter(|column| *column > 0)
}

/// Whether a node is written where it is used, rather than brought there by
/// an alias or a merge key.
pub(crate) fn written_here<T>(node: &Spanned<T>) -> bool {
    let (used, defined) = (&node.referenced, &node.defined);
    (used.line(), used.column()) == (defined.line(), defined.column())
}

impl Node {
    /// The mapping entry whose key reads as `key`.
    pub(crate) fn entry(&self, key: &str) -> Option<&(Spanned<Node>, Spanned<Node>)> {
        match self {
            Node::Map(entries) => entries.iter().find(|(k, _)| k.value.is_key(key)),
            _ => None,
        }
    }

    /// The list item at `index`.
    pub(crate) fn item(&self, index: usize) -> Option<&Spanned<Node>> {
        match self {
            Node::Seq(items) => items.get(index),
            _ => None,
        }
    }

    /// Whether this node, as a mapping key, is the field named `key` (a
    /// number or boolean key is named as written).
    fn is_key(&self, key: &str) -> bool {
        match self {
            Node::Str(text) => text == key,
            Node::Bool(value) => value.to_string() == key,
            Node::Int(value) => value.to_string() == key,
            Node::UInt(value) => value.to_string() == key,
            Node::Null | Node::Float(_) | Node::Seq(_) | Node::Map(_) => false,
        }
    }

    /// Removes the mapping entry `key`; `false` if there is none.
    pub(crate) fn remove(&mut self, key: &str) -> bool {
        let Node::Map(entries) = self else {
            return false;
        };
        match entries.iter().position(|(k, _)| k.value.is_key(key)) {
            Some(at) => {
                entries.remove(at);
                true
            }
            None => false,
        }
    }

    /// The child at `key` (of a mapping) or at `index` (of a list).
    pub(crate) fn entry_mut(&mut self, key: &str) -> Option<&mut Node> {
        match self {
            Node::Map(entries) => entries
                .iter_mut()
                .find(|(k, _)| k.value.is_key(key))
                .map(|(_, value)| &mut value.value),
            _ => None,
        }
    }

    pub(crate) fn item_mut(&mut self, index: usize) -> Option<&mut Node> {
        match self {
            Node::Seq(items) => items.get_mut(index).map(|item| &mut item.value),
            _ => None,
        }
    }

    fn unexpected(&self) -> Unexpected<'_> {
        match self {
            Node::Null => Unexpected::Unit,
            Node::Bool(value) => Unexpected::Bool(*value),
            Node::Int(value) => Unexpected::Signed(*value),
            Node::UInt(value) => Unexpected::Unsigned(*value),
            Node::Float(value) => Unexpected::Float(*value),
            Node::Str(text) => Unexpected::Str(text),
            Node::Seq(_) => Unexpected::Seq,
            Node::Map(_) => Unexpected::Map,
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Node, E> {
        Ok(Node::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Node, E> {
        Ok(Node::Int(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Node, E> {
        Ok(Node::UInt(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Node, E> {
        Ok(Node::Float(value))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Node, E> {
        Ok(Node::Str(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Node, E> {
        Ok(Node::Str(text))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Node::Map(entries))
    }
}

/// Reads a value out of the tree the way serde reads it out of YAML.
impl<'de> Deserializer<'de> for &Node {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self {
            Node::Null => visitor.visit_unit(),
            Node::Bool(value) => visitor.visit_bool(*value),
            Node::Int(value) => visitor.visit_i64(*value),
            Node::UInt(value) => visitor.visit_u64(*value),
            Node::Float(value) => visitor.visit_f64(*value),
            Node::Str(text) => visitor.visit_str(text),
            Node::Seq(items) => {
                visitor.visit_seq(SeqDeserializer::new(items.iter().map(|item| &item.value)))
            }
            Node::Map(entries) => visitor.visit_map(MapDeserializer::new(
                entries
                    .iter()
                    .map(|(key, value)| (&key.value, &value.value)),
            )),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self {
            Node::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    /// Enums are written as their variant's name (`mode: gate`).
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self {
            Node::Str(text) => visitor.visit_enum(text.as_str().into_deserializer()),
            other => Err(de::Error::invalid_type(other.unexpected(), &visitor)),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct identifier
    }
}

impl<'de> IntoDeserializer<'de, Error> for &Node {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(text: &str) -> Node {
        parse(text).expect("valid YAML").expect("a document").value
    }

    #[test]
    fn only_true_and_false_are_booleans() {
        let node = root("a: [true, false, yes, on, y, no]\n");
        let Some((_, list)) = node.entry("a") else {
            panic!("{node:?}")
        };
        let Node::Seq(items) = &list.value else {
            panic!("{list:?}")
        };
        let values: Vec<String> = items
            .iter()
            .map(|item| match &item.value {
                Node::Bool(value) => format!("bool {value}"),
                Node::Str(text) => format!("str {text}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            values,
            [
                "bool true",
                "bool false",
                "str yes",
                "str on",
                "str y",
                "str no"
            ]
        );
    }

    #[test]
    fn leading_zeros_and_underscores_stay_text() {
        let node = root("a: 007\nb: 1_000\nc: 7\nd: -3\n");
        let value = |key| node.entry(key).map(|(_, value)| &value.value);
        assert!(matches!(value("a"), Some(Node::Str(text)) if text == "007"));
        assert!(matches!(value("b"), Some(Node::Str(text)) if text == "1_000"));
        assert!(matches!(value("c"), Some(Node::UInt(7))));
        assert!(matches!(value("d"), Some(Node::Int(-3))));
    }

    #[test]
    fn merged_and_aliased_nodes_are_not_written_where_they_are_used() {
        let text = "a: &base { x: 1 }\nb: { <<: *base, y: 2 }\nc: *base\n";
        let node = root(text);
        let (key, value) = node.entry("b").unwrap();
        assert!(written_here(key));
        let (x, _) = value.value.entry("x").unwrap();
        let (y, _) = value.value.entry("y").unwrap();
        assert!(!written_here(x));
        assert!(written_here(y));
        let (_, c) = node.entry("c").unwrap();
        assert!(!written_here(&c.value.entry("x").unwrap().0));
    }

    #[test]
    fn an_empty_text_is_no_document() {
        assert!(parse("").unwrap().is_none());
        assert!(parse("# only a comment\n").unwrap().is_none());
        assert!(parse("~\n").unwrap().is_none());
    }

    #[test]
    fn syntax_errors_carry_their_position_apart_from_the_message() {
        let err = parse("a: 1\n  b: 2\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(err.column.is_some());
        assert!(!err.message.contains("line 2"), "{}", err.message);
    }

    #[test]
    fn the_tree_reads_into_serde_types() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        #[serde(rename_all = "snake_case")]
        enum Kind {
            QueueAll,
        }
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Item {
            n: Option<u16>,
            kind: Kind,
            tags: Vec<String>,
        }
        let item = Item::deserialize(&root("n: 7\nkind: queue_all\ntags: [a, b]\n")).unwrap();
        assert_eq!(
            item,
            Item {
                n: Some(7),
                kind: Kind::QueueAll,
                tags: vec!["a".into(), "b".into()]
            }
        );
        let err = Item::deserialize(&root("n: 70000\nkind: x\ntags: []\n")).unwrap_err();
        assert!(err.to_string().contains("expected u16"), "{err}");
        let err = Item::deserialize(&root("n: ~\nkind: [x]\ntags: []\n")).unwrap_err();
        assert!(err.to_string().contains("invalid type: sequence"), "{err}");
    }
}
