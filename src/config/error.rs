//! Configuration problems: where each one is (field path, line) and what is
//! wrong, gathered so that all of them are reported at once; and warnings,
//! written the same way, about a valid config an operator likely did not
//! mean.

use std::fmt;

/// One step of a field path: a mapping key or a list index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    Key(String),
    Index(usize),
}

/// A field path such as `routes[1].tick`; empty for the document itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldPath(Vec<Segment>);

impl FieldPath {
    pub(crate) fn root() -> Self {
        Self::default()
    }

    pub(crate) fn key(&self, key: &str) -> Self {
        let mut segments = self.0.clone();
        segments.push(Segment::Key(key.to_owned()));
        Self(segments)
    }

    pub(crate) fn index(&self, index: usize) -> Self {
        let mut segments = self.0.clone();
        segments.push(Segment::Index(index));
        Self(segments)
    }

    pub(crate) fn segments(&self) -> &[Segment] {
        &self.0
    }

    pub(crate) fn from_segments(segments: Vec<Segment>) -> Self {
        Self(segments)
    }

    /// The enclosing field, or `None` for the document itself.
    pub(crate) fn parent(&self) -> Option<Self> {
        let (_, rest) = self.0.split_last()?;
        Some(Self(rest.to_vec()))
    }

    /// Whether `self` is `other` or lies inside it.
    pub(crate) fn starts_with(&self, other: &FieldPath) -> bool {
        self.0.starts_with(&other.0)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(key) if i == 0 => f.write_str(key)?,
                Segment::Key(key) => write!(f, ".{key}")?,
                Segment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

/// One problem in the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Field path such as `routes[1].tick` or `upstream.url`; empty when the
    /// problem is with the file as a whole (unreadable, not YAML).
    pub path: String,
    /// 1-based line in the file, when known.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_located(f, &self.path, self.line, &self.message)
    }
}

/// A valid config that an operator likely did not mean as written: it is
/// loaded all the same, and the warning is shown (`queuegate check`) or
/// logged (`run`, reload).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigWarning {
    /// Field path such as `routes[0].match.host`.
    pub path: String,
    /// 1-based line in the file, when known.
    pub line: Option<usize>,
    pub message: String,
}

/// Written as a [`ConfigError`] is: `path (line N): message`.
impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_located(f, &self.path, self.line, &self.message)
    }
}

/// `path (line N): message`, leaving out what is not known.
fn write_located(
    f: &mut fmt::Formatter<'_>,
    path: &str,
    line: Option<usize>,
    message: &str,
) -> fmt::Result {
    match (path.is_empty(), line) {
        (false, Some(line)) => write!(f, "{path} (line {line}): {message}"),
        (false, None) => write!(f, "{path}: {message}"),
        (true, Some(line)) => write!(f, "line {line}: {message}"),
        (true, None) => f.write_str(message),
    }
}

/// Every problem found in one configuration file, in file order.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors {
    pub errors: Vec<ConfigError>,
}

impl ConfigErrors {
    /// A single problem with the file as a whole.
    pub(crate) fn whole_file(line: Option<usize>, message: String) -> Self {
        Self {
            errors: vec![ConfigError {
                path: String::new(),
                line,
                message,
            }],
        }
    }

    /// The problem reported for `path`, if any (handy for callers and tests).
    pub fn at(&self, path: &str) -> Option<&ConfigError> {
        self.errors.iter().find(|error| error.path == path)
    }
}

/// One problem per line.
impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_renders_keys_and_indices() {
        let path = FieldPath::root().key("routes").index(1).key("tick");
        assert_eq!(path.to_string(), "routes[1].tick");
        assert_eq!(FieldPath::root().to_string(), "");
    }

    #[test]
    fn errors_print_one_per_line_with_line_numbers() {
        let errors = ConfigErrors {
            errors: vec![
                ConfigError {
                    path: "routes[1].tick".into(),
                    line: Some(23),
                    message: "invalid duration \"10 parsecs\"".into(),
                },
                ConfigError {
                    path: "upstream".into(),
                    line: None,
                    message: "missing".into(),
                },
            ],
        };
        assert_eq!(
            errors.to_string(),
            "routes[1].tick (line 23): invalid duration \"10 parsecs\"\nupstream: missing"
        );
    }

    #[test]
    fn warnings_are_written_like_errors() {
        let warning = ConfigWarning {
            path: "routes[0].match.host".into(),
            line: Some(7),
            message: "set limits.allowed_hosts".into(),
        };
        assert_eq!(
            warning.to_string(),
            "routes[0].match.host (line 7): set limits.allowed_hosts"
        );
    }
}
