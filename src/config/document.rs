//! The YAML document: syntax check, then deserialization into the raw
//! structs in a loop that records each field serde rejects, sets that field
//! aside and reads the rest again, so one bad field does not hide the next.

use serde_yaml::{Mapping, Value};

use super::error::{ConfigErrors, FieldPath, Segment};
use super::raw::RawConfig;
use super::validate::Problems;

/// More rejected fields than this in one file: stop reading, report those.
const MAX_READ_PROBLEMS: usize = 200;

/// Parses `text` into the raw structs, recording every unreadable field in
/// `problems` (and then `None` if what is left still cannot be read). A YAML
/// syntax error ends everything at once, with its line.
pub(crate) fn read(text: &str, problems: &mut Problems) -> Result<Option<RawConfig>, ConfigErrors> {
    let mut value: Value = serde_yaml::from_str(text).map_err(syntax_error)?;
    if let Err(err) = value.apply_merge() {
        return Err(ConfigErrors::whole_file(None, err.to_string()));
    }
    match value {
        Value::Mapping(_) => {}
        Value::Null => {
            return Err(ConfigErrors::whole_file(
                None,
                "the file is empty: a config needs at least listen, upstream, keys".to_owned(),
            ))
        }
        _ => {
            return Err(ConfigErrors::whole_file(
                Some(1),
                "the file must be a mapping of sections (listen:, upstream:, ...)".to_owned(),
            ))
        }
    }

    let mut replaced: Vec<FieldPath> = Vec::new();
    for _ in 0..MAX_READ_PROBLEMS {
        let err = match serde_path_to_error::deserialize::<_, RawConfig>(value.clone()) {
            Ok(raw) => return Ok(Some(raw)),
            Err(err) => err,
        };
        let (path, exact) = field_path(err.path());
        problems.report(path.clone(), plain_message(&err.inner().to_string()));
        problems.skip(path.clone());
        if !exact || !set_aside(&mut value, &path, &mut replaced) {
            return Ok(None);
        }
    }
    problems.report(
        FieldPath::root(),
        "too many problems to read the rest of the file".to_owned(),
    );
    Ok(None)
}

/// A YAML syntax error, with its line and without the position repeated in
/// the message.
fn syntax_error(err: serde_yaml::Error) -> ConfigErrors {
    let line = err.location().map(|at| at.line());
    let mut message = err.to_string();
    if let Some(at) = err.location() {
        let suffix = format!(" at line {} column {}", at.line(), at.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            message = format!("{stripped} (column {})", at.column());
        }
    }
    ConfigErrors::whole_file(line, format!("not valid YAML: {message}"))
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
fn set_aside(value: &mut Value, path: &FieldPath, replaced: &mut Vec<FieldPath>) -> bool {
    match path.segments().last() {
        Some(Segment::Key(key)) => remove_key(value, path, key),
        Some(Segment::Index(index)) if !replaced.contains(path) => {
            replaced.push(path.clone());
            let Some(parent) = path.parent() else {
                return false;
            };
            match node_mut(value, &parent) {
                Some(Value::Sequence(items)) => match items.get_mut(*index) {
                    Some(item) => {
                        *item = Value::Mapping(Mapping::new());
                        true
                    }
                    None => false,
                },
                _ => false,
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

fn remove_key(value: &mut Value, path: &FieldPath, key: &str) -> bool {
    let Some(parent) = path.parent() else {
        return false;
    };
    match node_mut(value, &parent) {
        Some(Value::Mapping(map)) => map.remove(key).is_some(),
        _ => false,
    }
}

fn node_mut<'v>(value: &'v mut Value, path: &FieldPath) -> Option<&'v mut Value> {
    let mut node = value;
    for segment in path.segments() {
        node = match (segment, node) {
            (Segment::Key(key), Value::Mapping(map)) => map.get_mut(key.as_str())?,
            (Segment::Index(index), Value::Sequence(items)) => items.get_mut(*index)?,
            _ => return None,
        };
    }
    Some(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_problems(text: &str) -> Vec<(String, String)> {
        let mut problems = Problems::default();
        let raw = read(text, &mut problems).expect("valid YAML");
        assert!(raw.is_some(), "the rest of the file should still be read");
        problems
            .into_errors(text)
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
        assert_eq!(err.errors[0].line, Some(3));
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
        assert_eq!(routes[1].capacity, Some(3));
    }

    #[test]
    fn a_document_that_is_not_a_mapping_is_rejected() {
        let mut problems = Problems::default();
        assert!(read("- a\n- b\n", &mut problems).is_err());
        assert!(read("", &mut problems).is_err());
    }
}
