//! Reading one field: given or not, a duration and its bounds, a count of
//! at least 1, a file path; and a duration shown as an operator writes it.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::DurationText;

/// A field that must be given.
pub(super) fn required<T>(value: Option<T>, at: &FieldPath, problems: &mut Problems) -> Option<T> {
    if value.is_none() {
        problems.report(at.clone(), "required");
    }
    value
}

/// A file that must be named.
pub(super) fn required_path(
    value: Option<PathBuf>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<PathBuf> {
    required(value, at, problems).and_then(|path| file_path(path, at, problems))
}

/// A file named by a field: any path but an empty one.
pub(super) fn file_path(path: PathBuf, at: &FieldPath, problems: &mut Problems) -> Option<PathBuf> {
    if path.as_os_str().is_empty() {
        problems.report(at.clone(), "must not be empty");
        return None;
    }
    Some(path)
}

/// A count that must be at least 1: 0 is reported, and kept.
pub(super) fn at_least_one(value: u64, at: &FieldPath, problems: &mut Problems) -> u64 {
    if value == 0 {
        problems.report(at.clone(), "must be at least 1");
    }
    value
}

/// A duration, or its default.
pub(super) fn duration(value: Option<DurationText>, default: Duration) -> Duration {
    value.map_or(default, |d| d.0)
}

/// A duration, or its default, that must be more than 0.
pub(super) fn positive(
    value: Option<DurationText>,
    default: Duration,
    at: &FieldPath,
    problems: &mut Problems,
) -> Duration {
    let value = duration(value, default);
    if value.is_zero() {
        problems.report(at.clone(), "must be more than 0s");
    }
    value
}

/// A duration, or its default, that must be at least `min`.
pub(super) fn at_least(
    value: Option<DurationText>,
    default: Duration,
    min: Duration,
    at: &FieldPath,
    problems: &mut Problems,
) -> Duration {
    let value = duration(value, default);
    if value < min {
        problems.report(
            at.clone(),
            format!(
                "{} is too short: must be at least {}",
                show(value),
                show(min)
            ),
        );
    }
    value
}

/// A duration as an operator would write it.
pub(super) fn show(duration: Duration) -> String {
    let micros = duration.as_micros();
    if micros.is_multiple_of(3_600_000_000) && micros > 0 {
        format!("{}h", micros / 3_600_000_000)
    } else if micros.is_multiple_of(60_000_000) && micros > 0 {
        format!("{}m", micros / 60_000_000)
    } else if micros.is_multiple_of(1_000_000) {
        format!("{}s", micros / 1_000_000)
    } else if micros.is_multiple_of(1000) {
        format!("{}ms", micros / 1000)
    } else {
        format!("{micros}us")
    }
}

/// Counts in the config are checked against small ranges; on a platform
/// whose `usize` cannot hold one, saturate rather than wrap.
pub(super) fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_back_as_written() {
        assert_eq!(show(Duration::from_secs(600)), "10m");
        assert_eq!(show(Duration::from_secs(7200)), "2h");
        assert_eq!(show(Duration::from_millis(1500)), "1500ms");
        assert_eq!(show(Duration::from_micros(250)), "250us");
        assert_eq!(show(Duration::ZERO), "0s");
    }
}
