//! Finding the line of a field path: a walk down the document's node tree,
//! whose nodes and keys carry the positions the YAML parser gave them.

use serde_saphyr::Spanned;

use super::error::{FieldPath, Segment};
use super::node::{self, Node};

/// The 1-based line of `path` in the document under `root`, or `None` when
/// the path is not written there (a missing field, or one that came in by a
/// merge key or an alias). A field's line is its key's; a list item's is
/// its first line.
pub(crate) fn line_of(root: &Spanned<Node>, path: &FieldPath) -> Option<usize> {
    let mut node = root;
    let mut line = None;
    for segment in path.segments() {
        let at = match segment {
            Segment::Key(key) => {
                let (key, value) = node.value.entry(key)?;
                if !node::written_here(key) {
                    return None;
                }
                node = value;
                key
            }
            Segment::Index(index) => {
                node = node.value.item(*index)?;
                node
            }
        };
        line = Some(node::line(&at.referenced)?);
    }
    line
}

/// The line of `path`, or of the nearest enclosing field that is written.
pub(crate) fn nearest_line(root: &Spanned<Node>, path: &FieldPath) -> Option<usize> {
    let mut current = Some(path.clone());
    while let Some(path) = current {
        if let Some(line) = line_of(root, &path) {
            return Some(line);
        }
        current = path.parent();
    }
    None
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

    fn tree(text: &str) -> Spanned<Node> {
        node::parse(text).unwrap().unwrap()
    }

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
        assert_eq!(line_of(&tree(TEXT), &path(&["upstream", "url"])), Some(2));
        assert_eq!(
            line_of(&tree(TEXT), &path(&["routes", "0", "tick"])),
            Some(5)
        );
        assert_eq!(
            line_of(&tree(TEXT), &path(&["routes", "1", "foo"])),
            Some(6)
        );
        assert_eq!(
            line_of(&tree(TEXT), &path(&["routes", "2", "page"])),
            Some(8)
        );
        assert_eq!(
            line_of(&tree(TEXT), &path(&["routes", "2", "page", "title"])),
            Some(9)
        );
        assert_eq!(line_of(&tree(TEXT), &path(&["routes"])), Some(3));
    }

    #[test]
    fn list_items_are_found_at_their_first_line() {
        assert_eq!(line_of(&tree(TEXT), &path(&["routes", "1"])), Some(6));
        assert_eq!(line_of(&tree(TEXT), &path(&["routes", "2"])), Some(7));
    }

    #[test]
    fn missing_fields_fall_back_to_the_enclosing_one() {
        assert_eq!(
            line_of(&tree(TEXT), &path(&["routes", "2", "capacity"])),
            None
        );
        assert_eq!(
            nearest_line(&tree(TEXT), &path(&["routes", "2", "capacity"])),
            Some(7)
        );
        assert_eq!(nearest_line(&tree(TEXT), &path(&["routes", "9"])), Some(3));
        assert_eq!(nearest_line(&tree(TEXT), &path(&["store"])), None);
    }

    #[test]
    fn merged_and_aliased_fields_fall_back_to_where_they_are_used() {
        let text = "\
routes:
  - &base
    name: a
    capacity: 3
  - name: b
    <<: *base
  - *base
";
        let root = tree(text);
        assert_eq!(line_of(&root, &path(&["routes", "0", "capacity"])), Some(4));
        assert_eq!(line_of(&root, &path(&["routes", "1", "capacity"])), None);
        assert_eq!(
            nearest_line(&root, &path(&["routes", "1", "capacity"])),
            Some(5)
        );
        assert_eq!(
            nearest_line(&root, &path(&["routes", "2", "capacity"])),
            Some(7)
        );
    }
}
