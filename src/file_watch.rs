//! Noticing that files changed, for the config reload and the TLS
//! certificate reload: one `notify` watcher on the directories that hold the
//! files, so a file replaced by a rename (an editor's save, `mv`) and a
//! Kubernetes volume's `..data` symlink swap are seen, not only writes in
//! place.
//!
//! It only says that something changed; reading the files again, and what
//! to do when they are bad, is the caller's.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};

/// File events closer together than this make one reload: editors write a
/// file in several steps, and a certificate and its key are written one
/// after the other.
pub const SETTLE: Duration = Duration::from_millis(250);

/// The entry a Kubernetes secret or config map volume swaps to publish new
/// files at once; the files themselves are symlinks through it.
const KUBERNETES_DATA: &str = "..data";

/// A running watch: changes are reported until it is dropped.
#[derive(Debug)]
pub struct FileWatch {
    _watcher: RecommendedWatcher,
}

impl FileWatch {
    /// Watches `files` through their directories. `on_change` runs on the
    /// watcher's own thread (so it should only pass the news on) after each
    /// event that names one of the files, or a `..data` entry beside them,
    /// and when the system dropped events and cannot say which.
    pub fn start(
        files: &[&Path],
        on_change: impl Fn() + Send + 'static,
    ) -> notify::Result<FileWatch> {
        let dirs: BTreeSet<PathBuf> = files.iter().map(|f| directory_of(f)).collect();
        let names: BTreeSet<OsString> = files
            .iter()
            .filter_map(|f| f.file_name())
            .map(|name| name.to_os_string())
            .collect();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let Ok(event) = event else { return };
                if event.need_rescan() {
                    on_change();
                    return;
                }
                if event.kind.is_access() {
                    return;
                }
                let ours = event.paths.iter().any(|p| {
                    p.file_name()
                        .is_some_and(|f| f == KUBERNETES_DATA || names.contains(f))
                });
                if ours {
                    on_change();
                }
            })?;
        for dir in &dirs {
            watcher.watch(dir, RecursiveMode::NonRecursive)?;
        }
        Ok(FileWatch { _watcher: watcher })
    }
}

/// The directory holding `file` (`.` for a bare file name).
fn directory_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Waits up to 10 s for a change report.
    fn reported(rx: &mpsc::Receiver<()>) -> bool {
        rx.recv_timeout(Duration::from_secs(10)).is_ok()
    }

    #[test]
    fn a_rename_over_the_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tls.crt");
        std::fs::write(&file, "one").unwrap();
        let (tx, rx) = mpsc::channel();
        let _watch = FileWatch::start(&[&file], move || {
            let _ = tx.send(());
        })
        .unwrap();

        let tmp = dir.path().join("tls.crt.tmp");
        std::fs::write(&tmp, "two").unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        assert!(reported(&rx), "the rename over the file was not reported");
    }

    #[cfg(unix)]
    #[test]
    fn a_kubernetes_data_swap_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tls.key");
        let (tx, rx) = mpsc::channel();
        let _watch = FileWatch::start(&[&file], move || {
            let _ = tx.send(());
        })
        .unwrap();
        // What the kubelet does: a new timestamped directory, a `..data_tmp`
        // symlink to it, renamed over `..data`.
        std::fs::create_dir(dir.path().join("..2025_01_01")).unwrap();
        std::os::unix::fs::symlink("..2025_01_01", dir.path().join("..data_tmp")).unwrap();
        std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
        assert!(reported(&rx), "the ..data swap was not reported");
    }
}
