//! Live reload: the config file is watched (and `SIGHUP` forces a reload); a
//! valid new file replaces the running settings atomically, keeping each
//! surviving route's line, while an invalid one is rejected and the old
//! settings stay in force. Listener, admin, limits, store and upstream changes
//! need a restart: they are logged and otherwise ignored. A route's `shards`
//! never changes on a reload: the store keeps its line split one way, so a
//! file that changes it is rejected.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{mpsc, watch};

use crate::admission::{KeyError, KeyRing};
use crate::admitter::Admitters;
use crate::config::{Config, ConfigError, ConfigErrors};
use crate::file_watch::{self, FileWatch};
use crate::request::App;
use crate::route::Settings;

/// Why a reload was rejected; the running settings are unchanged.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("invalid configuration:\n{0}")]
    Invalid(ConfigErrors),
    #[error("keys: {0}")]
    Keys(#[from] KeyError),
}

/// What asked for a reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Cause {
    /// The file (or its directory entry) changed: skipped when it still
    /// says what is running (a comment or formatting edit).
    FileChanged,
    /// `SIGHUP` or an explicit request: always reloads (key files may have
    /// changed even when the YAML did not).
    Forced,
}

/// Asks the running process to reload its config file, as `SIGHUP` does.
#[derive(Clone, Debug)]
pub struct ReloadTrigger(mpsc::UnboundedSender<Cause>);

impl ReloadTrigger {
    /// Forces a reload of the config file (what the `SIGHUP` handler calls).
    pub fn reload(&self) {
        let _ = self.0.send(Cause::Forced);
    }

    fn file_changed(&self) {
        let _ = self.0.send(Cause::FileChanged);
    }
}

/// The receiving end of [`ReloadTrigger`]s, handed to [`crate::RunOptions`].
#[derive(Debug)]
pub struct ReloadRequests {
    rx: mpsc::UnboundedReceiver<Cause>,
    /// For the file watcher, which feeds the same queue.
    trigger: ReloadTrigger,
}

/// A trigger and the requests it sends.
pub fn channel() -> (ReloadTrigger, ReloadRequests) {
    let (tx, rx) = mpsc::unbounded_channel();
    let trigger = ReloadTrigger(tx);
    (trigger.clone(), ReloadRequests { rx, trigger })
}

/// Forwards every `SIGHUP` to `trigger` for as long as the runtime lives.
pub fn forward_sighup(trigger: ReloadTrigger) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = signal(SignalKind::hangup())?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP received: reloading the config");
                trigger.reload();
            }
        });
    }
    #[cfg(not(unix))]
    let _ = trigger;
    Ok(())
}

/// Applies config files to a running [`App`].
pub struct Reloader {
    app: Arc<App>,
    path: PathBuf,
    admitters: Arc<Admitters>,
    /// The config in force.
    running: Mutex<Config>,
}

impl Reloader {
    /// A reloader of `path` for `app`, which runs `config`.
    pub fn new(
        app: Arc<App>,
        path: PathBuf,
        config: Config,
        admitters: Arc<Admitters>,
    ) -> Reloader {
        Reloader {
            app,
            path,
            admitters,
            running: Mutex::new(config),
        }
    }

    /// The watched file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file again and, when it is valid, replaces the running
    /// settings (counted in `queuegate_config_reloads_total`). Returns
    /// whether anything was applied.
    pub fn reload(&self) -> Result<bool, ReloadError> {
        self.apply(Cause::Forced)
    }

    fn apply(&self, cause: Cause) -> Result<bool, ReloadError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            // Mid-rename the file may be missing for a moment: the rename's
            // own event follows.
            Err(err)
                if cause == Cause::FileChanged && err.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(false)
            }
            Err(err) => {
                return self.rejected(ReloadError::Invalid(ConfigErrors::whole_file(
                    None,
                    format!("cannot read {}: {err}", self.path.display()),
                )))
            }
        };
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let (config, warnings) = match Config::from_yaml_with_warnings(&text) {
            Ok(loaded) => (loaded.config, loaded.warnings),
            Err(errors) => return self.rejected(ReloadError::Invalid(errors)),
        };
        if cause == Cause::FileChanged && *running == config {
            return Ok(false);
        }
        if let Some(errors) = split_changes(&running, &config) {
            return self.rejected(ReloadError::Invalid(errors));
        }
        let ring = match KeyRing::load(&config.keys) {
            Ok(ring) => ring,
            Err(err) => return self.rejected(ReloadError::Keys(err)),
        };
        let old = self.app.settings.load();
        let lives: HashMap<_, _> = old
            .routes
            .iter()
            .map(|r| (r.name().to_owned(), r.live.clone()))
            .collect();
        // Overrides stay laid over the new file, but a field the file now
        // says otherwise of is the file's again (the admitter clears it in
        // the store at its next tick).
        let settings = Settings::new(
            &config,
            ring,
            &lives,
            &self.app.metrics,
            &self.app.caches,
            &old.overrides(),
        );
        for route in &settings.routes {
            let before = old.route_named(route.name()).map(|i| &old.routes[i]);
            if let Some(before) = before.and_then(|r| r.overridden.as_ref()) {
                if route.overridden.as_ref() != Some(before) {
                    tracing::info!(
                        route = route.name(),
                        mode = route.file_mode.as_str(),
                        capacity = route.file_capacity,
                        "override dropped where the config file changed the field"
                    );
                }
            }
        }
        for field in needs_restart(&running, &config) {
            tracing::warn!(
                field,
                "config change to {field} needs a restart: the running value stays"
            );
        }
        for gone in old
            .routes
            .iter()
            .filter(|r| !config.routes.iter().any(|n| n.name == r.name()))
        {
            tracing::info!(route = gone.name(), "route removed");
            self.app.metrics.forget_route(gone.name());
        }
        for added in config
            .routes
            .iter()
            .filter(|n| !lives.contains_key(&n.name))
        {
            tracing::info!(route = %added.name, "route added");
        }
        self.app.settings.store(Arc::new(settings));
        self.admitters.start_missing();
        self.app.metrics.config_reload(true);
        for warning in &warnings {
            tracing::warn!(path = %self.path.display(), "config: {warning}");
        }
        tracing::info!(
            path = %self.path.display(),
            routes = config.routes.len(),
            "config reloaded"
        );
        *running = config;
        Ok(true)
    }

    fn rejected(&self, err: ReloadError) -> Result<bool, ReloadError> {
        self.app.metrics.config_reload(false);
        tracing::error!(
            path = %self.path.display(),
            error = %err,
            "config reload rejected: the previous config stays in force"
        );
        Err(err)
    }

    /// Reloads on every request until `stop` changes: file events are
    /// debounced, forced reloads apply at once.
    pub async fn serve(
        self: Arc<Self>,
        mut requests: ReloadRequests,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let mut cause = tokio::select! {
                cause = requests.rx.recv() => match cause {
                    Some(cause) => cause,
                    None => return,
                },
                _ = stop.changed() => return,
            };
            if cause == Cause::FileChanged {
                let settle = tokio::time::sleep(file_watch::SETTLE);
                tokio::pin!(settle);
                loop {
                    tokio::select! {
                        _ = &mut settle => break,
                        more = requests.rx.recv() => match more {
                            Some(more) => cause = cause.max(more),
                            None => break,
                        },
                    }
                }
            }
            // Errors are logged and counted where they happen.
            let _ = self.apply(cause);
        }
    }

    /// Watches the file's directory (so rename-on-save and Kubernetes'
    /// `..data` symlink swaps are seen) and feeds `requests`. Keep the
    /// returned watcher alive for as long as reloads should happen. The file
    /// is checked once as soon as the watch is on, so an edit made between
    /// loading the config and starting the watch is not missed.
    pub fn watch(&self, requests: &ReloadRequests) -> notify::Result<FileWatch> {
        let trigger = requests.trigger.clone();
        let watch = FileWatch::start(&[&self.path], move || trigger.file_changed())?;
        requests.trigger.file_changed();
        Ok(watch)
    }
}

/// The routes of `new` whose `shards` differs from the running route of the
/// same name: the store holds that route's line split the running way, and
/// visitors would be looked for in the wrong sub-lines (see
/// `queue::shards`).
fn split_changes(old: &Config, new: &Config) -> Option<ConfigErrors> {
    let errors: Vec<ConfigError> = new
        .routes
        .iter()
        .enumerate()
        .filter_map(|(i, route)| {
            let running = old.routes.iter().find(|r| r.name == route.name)?;
            (running.shards != route.shards).then(|| ConfigError {
                path: format!("routes[{i}].shards"),
                line: None,
                message: format!(
                    "cannot change from {} to {} while queuegate runs: the store keeps route \
                     {}'s line split one way; change it only once the route's line and \
                     sessions are empty, and restart",
                    running.shards, route.shards, route.name
                ),
            })
        })
        .collect();
    (!errors.is_empty()).then_some(ConfigErrors { errors })
}

/// The fields that changed between `old` and `new` but only apply on restart.
fn needs_restart(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut fields = Vec::new();
    if old.listen != new.listen {
        fields.push("listen");
    }
    if old.admin != new.admin {
        fields.push("admin");
    }
    if old.limits != new.limits {
        fields.push("limits");
    }
    if old.upstream != new.upstream {
        fields.push("upstream");
    }
    if old.client_ip != new.client_ip {
        fields.push("client_ip");
    }
    if old.store.backend != new.store.backend
        || old.store.redis != new.store.redis
        || old.store.memory != new.store.memory
    {
        fields.push("store");
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "
listen: [{ addr: 127.0.0.1:8080 }]
upstream: { url: http://127.0.0.1:3000 }
keys: [{ id: k1, env: QUEUEGATE_TEST_RELOAD_KEY }]
routes:
  - { name: tickets, match: { path_prefix: /tickets }, capacity: 5 }
";

    #[test]
    fn restart_only_fields_are_named() {
        let old = Config::from_yaml(BASE).unwrap();
        let mut new = old.clone();
        new.routes[0].capacity = 50;
        assert!(needs_restart(&old, &new).is_empty());
        new.listen[0].addr = "127.0.0.1:9090".parse().unwrap();
        new.upstream.url = "http://127.0.0.1:4000".parse().unwrap();
        assert_eq!(needs_restart(&old, &new), vec!["listen", "upstream"]);
    }

    #[test]
    fn a_route_split_another_way_is_refused() {
        let old = Config::from_yaml(BASE).unwrap();
        let mut new = old.clone();
        assert!(split_changes(&old, &new).is_none());
        new.routes[0].shards = 3;
        let errors = split_changes(&old, &new).expect("refused");
        let error = errors.at("routes[0].shards").expect("names the field");
        assert!(error.message.contains("from 1 to 3"), "{}", error.message);
        // A new route may be split any way.
        new.routes[0].name = "other".into();
        assert!(split_changes(&old, &new).is_none());
    }
}
