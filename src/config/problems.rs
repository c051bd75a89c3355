//! Problems found while a config is read and validated, each at its field
//! path, and warnings, which do not stop a config from loading; written out
//! as `ConfigErrors` and `ConfigWarning`s in file order once the lines of
//! the paths are known.

use super::error::{ConfigError, ConfigErrors, ConfigWarning, FieldPath};

/// Problems found so far, each at its field path; and warnings, which do
/// not stop a config from loading.
#[derive(Debug, Default)]
pub(crate) struct Problems {
    found: Vec<(FieldPath, String)>,
    /// Fields whose value could not be read: anything later said about them
    /// (missing, out of range) is a consequence, not news.
    skipped: Vec<FieldPath>,
    warnings: Vec<(FieldPath, String)>,
}

impl Problems {
    pub(crate) fn report(&mut self, path: FieldPath, message: impl Into<String>) {
        if self.skipped.iter().any(|skipped| path.starts_with(skipped)) {
            return;
        }
        self.found.push((path, message.into()));
    }

    pub(crate) fn skip(&mut self, path: FieldPath) {
        self.skipped.push(path);
    }

    /// Records a warning: the config still loads.
    pub(crate) fn warn(&mut self, path: FieldPath, message: impl Into<String>) {
        self.warnings.push((path, message.into()));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// Every problem with its line (`line_of` its path), in file order
    /// (problems with no line last).
    pub(crate) fn into_errors(self, line_of: impl Fn(&FieldPath) -> Option<usize>) -> ConfigErrors {
        let errors = in_file_order(self.found, line_of)
            .map(|(path, line, message)| ConfigError {
                path,
                line,
                message,
            })
            .collect();
        ConfigErrors { errors }
    }

    /// Every warning with its line (`line_of` its path), in file order.
    pub(crate) fn into_warnings(
        self,
        line_of: impl Fn(&FieldPath) -> Option<usize>,
    ) -> Vec<ConfigWarning> {
        in_file_order(self.warnings, line_of)
            .map(|(path, line, message)| ConfigWarning {
                path,
                line,
                message,
            })
            .collect()
    }
}

/// `(path, line, message)` for each of `found`, sorted by line (those with
/// no line last, in the order found).
fn in_file_order(
    found: Vec<(FieldPath, String)>,
    line_of: impl Fn(&FieldPath) -> Option<usize>,
) -> impl Iterator<Item = (String, Option<usize>, String)> {
    let mut located: Vec<_> = found
        .into_iter()
        .map(|(path, message)| {
            let line = line_of(&path);
            (path.to_string(), line, message)
        })
        .collect();
    located.sort_by_key(|(_, line, _)| line.unwrap_or(usize::MAX));
    located.into_iter()
}
