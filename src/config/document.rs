//! The YAML document: syntax check into the node tree, then deserialization
//! into the raw structs in a loop that records each field serde rejects,
//! sets that field aside and reads the rest again, so one bad field does not
//! hide the next.

use serde_saphyr::Spanned;

use super::error::{ConfigErrors, FieldPath, Segment};
use super::locate;
use super::node::{self, Node};
use super::problems::Problems;
use super::raw::RawConfig;

/// More rejected fields than this in one file: stop reading, report those.
const MAX_READ_PROBLEMS: usize = 200;

/// A parsed config file: a mapping of sections, each node with its line.
#[derive(Debug)]
pub(crate) struct Document {
    root: Spanned<Node>,
}

impl Document {
    /// Parses `text`. A YAML syntax error ends everything at once, with its
    /// line; so does a file that is not a mapping of sections.
    pub(crate) fn parse(text: &str) -> Result<Document, ConfigErrors> {
        let root = node::parse(text).map_err(|err| {
            let message = match err.column {
                Some(column) => format!("not valid YAML: {} (column {column})", err.message),
                None => format!("not valid YAML: {}", err.message),
            };
            ConfigErrors::whole_file(err.line, message)
        })?;
        match root {
            Some(root) if matches!(root.value, Node::Map(_)) => Ok(Document { root }),
            Some(_) => Err(ConfigErrors::whole_file(
                Some(1),
                "the file must be a mapping of sections (listen:, upstream:, ...)".to_owned(),
            )),
            None => Err(ConfigErrors::whole_file(
                None,
                "the file is empty: a config needs at least listen, upstream, keys".to_owned(),
            )),
        }
    }

    /// The line of `path`, or of the nearest enclosing field written in the
    /// file.
    pub(crate) fn line_of(&self, path: &FieldPath) -> Option<usize> {
        locate::nearest_line(&self.root, path)
    }

    /// Reads the raw structs, recording every unreadable field in
    /// `problems` (and then `None` if what is left still cannot be read).
    pub(crate) fn read(&self, problems: &mut Problems) -> Option<RawConfig> {
        // Rejected fields are set aside in a copy: the document itself keeps
        // them, so their lines can still be found.
        let mut value = self.root.value.clone();
        let mut replaced: Vec<FieldPath> = Vec::new();
        for _ in 0..MAX_READ_PROBLEMS {
            let err = match serde_path_to_error::deserialize::<_, RawConfig>(&value) {
                Ok(raw) => return Some(raw),
                Err(err) => err,
            };
            let (path, exact) = field_path(err.path());
            problems.report(path.clone(), plain_message(&err.inner().to_string()));
            problems.skip(path.clone());
            if !exact || !set_aside(&mut value, &path, &mut replaced) {
                return None;
            }
        }
        problems.report(
            FieldPath::root(),
            "too many problems to read the rest of the file".to_owned(),
        );
        None
    }
}

/// Parses `text` and reads it into the raw structs (see [`Document::read`]).
#[cfg(test)]
fn read(text: &str, problems: &mut Problems) -> Result<Option<RawConfig>, ConfigErrors> {
    Ok(Document::parse(text)?.read(problems))
}

/// Serde's message without the names of our raw structs, which mean
/// nothing to someone editing the file.
fn plain_message(message: &str) -> String {
    match message.find("expected struct Raw") {
        Some(at) => format!("{}expected a mapping", &message[..at]),
        None => message.to_owned(),
    }
}

/// Our path for a serde path; `false` when part of it could not be named.
fn field_path(path: &serde_path_to_error::Path) -> (FieldPath, bool) {
    let mut segments = Vec::new();
    for segment in path.iter() {
        match segment {
            serde_path_to_error::Segment::Seq { index } => segments.push(Segment::Index(*index)),
            serde_path_to_error::Segment::Map { key } => segments.push(Segment::Key(key.clone())),
            serde_path_to_error::Segment::Enum { variant } => {
                segments.push(Segment::Key(variant.clone()))
            }
            serde_path_to_error::Segment::Unknown => {
                return (FieldPath::from_segments(segments), false)
            }
        }
    }
    (FieldPath::from_segments(segments), true)
}

/// Takes the rejected field out of `value` so the rest can be read: a
/// mapping entry is removed; a list item is first replaced by an empty
/// mapping (keeping the indices of the items after it), and if that is
/// rejected too, the list's own field is removed. `false` if nothing could
/// be set aside.
fn set_aside(value: &mut Node, path: &FieldPath, replaced: &mut Vec<FieldPath>) -> bool {
    match path.segments().last() {
        Some(Segment::Key(key)) => remove_key(value, path, key),
        Some(Segment::Index(index)) if !replaced.contains(path) => {
            replaced.push(path.clone());
            let item = path
                .parent()
                .and_then(|parent| node_mut(value, &parent))
                .and_then(|list| list.item_mut(*index));
            match item {
                Some(item) => {
                    *item = Node::Map(Vec::new());
                    true
                }
                None => false,
            }
        }
        Some(Segment::Index(_)) => {
            // Walk up to the nearest enclosing mapping entry and drop it.
            let mut current = path.parent();
            while let Some(candidate) = current {
                if let Some(Segment::Key(key)) = candidate.segments().last() {
                    return remove_key(value, &candidate, key);
                }
                current = candidate.parent();
            }
            false
        }
        None => false,
    }
}

fn remove_key(value: &mut Node, path: &FieldPath, key: &str) -> bool {
    path.parent()
        .and_then(|parent| node_mut(value, &parent))
        .is_some_and(|map| map.remove(key))
}

fn node_mut<'v>(value: &'v mut Node, path: &FieldPath) -> Option<&'v mut Node> {
    let mut node = value;
    for segment in path.segments() {
        node = match segment {
            Segment::Key(key) => node.entry_mut(key)?,
            Segment::Index(index) => node.item_mut(*index)?,
        };
    }
    Some(node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::raw::RawCapacity;

    fn read_problems(text: &str) -> Vec<(String, String)> {
        let mut problems = Problems::default();
        let document = Document::parse(text).expect("valid YAML");
        let raw = document.read(&mut problems);
        assert!(raw.is_some(), "the rest of the file should still be read");
        problems
            .into_errors(|path| document.line_of(path))
            .errors
            .into_iter()
            .map(|error| (error.path, error.message))
            .collect()
    }

    #[test]
    fn every_unreadable_field_is_reported_not_just_the_first() {
        let problems = read_problems(
            "limits: { header_timeout: 10, bogus: 1 }\nroutes:\n  - { name: a, tick: x }\n  - { name: b, tick: 5 }\n",
        );
        let paths: Vec<&str> = problems.iter().map(|(path, _)| path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "limits.header_timeout",
                "limits.bogus",
                "routes[0].tick",
                "routes[1].tick"
            ]
        );
    }

    #[test]
    fn a_list_item_of_the_wrong_shape_keeps_later_indices() {
        let problems = read_problems("routes:\n  - 7\n  - { name: b, nope: 1 }\n");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert_eq!(problems[0].0, "routes[0]");
        assert!(
            problems[0].1.ends_with("expected a mapping"),
            "{problems:?}"
        );
        assert_eq!(problems[1].0, "routes[1].nope");
    }

    #[test]
    fn a_list_item_that_cannot_be_replaced_drops_its_list() {
        let problems = read_problems("store:\n  redis:\n    cluster: [redis://a:1, [x]]\n");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "store.redis.cluster[1]");
    }

    #[test]
    fn syntax_errors_stop_at_once_with_their_line() {
        let mut problems = Problems::default();
        let err = read("a: 1\nb: [\n", &mut problems).unwrap_err();
        assert_eq!(err.errors.len(), 1);
        // The line of the bracket left open, not the end of the file.
        assert_eq!(err.errors[0].line, Some(2));
        assert!(err.errors[0].message.starts_with("not valid YAML"));
    }

    #[test]
    fn duplicate_keys_are_syntax_errors() {
        let mut problems = Problems::default();
        let err = read("upstream: {}\nupstream: {}\n", &mut problems).unwrap_err();
        assert!(err.errors[0].message.contains("duplicate"), "{err}");
    }

    #[test]
    fn merge_keys_are_applied() {
        let mut problems = Problems::default();
        let text = "routes:\n  - &base { name: a, capacity: 3 }\n  - { <<: *base, name: b }\n";
        let raw = read(text, &mut problems).unwrap().unwrap();
        assert!(problems.is_empty());
        let routes = raw.routes.unwrap();
        assert_eq!(routes[1].name.as_deref(), Some("b"));
        assert!(matches!(routes[1].capacity, Some(RawCapacity::Fixed(3))));
    }

    #[test]
    fn a_document_that_is_not_a_mapping_is_rejected() {
        let mut problems = Problems::default();
        assert!(read("- a\n- b\n", &mut problems).is_err());
        assert!(read("", &mut problems).is_err());
    }
}
