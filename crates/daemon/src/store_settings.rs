//! The store server's settings that weaken the guarantees (see
//! `Store::setting_warnings`), watched for as long as the process runs:
//! read at start, every [`STORE_SETTINGS_RECHECK`], and at once after the
//! store found a new primary (a failover). A warning is logged when it
//! appears and when it clears, each setting is a gauge that is 1 while it
//! is wrong, and the controller puts the current warnings in every
//! LeaderGroup's status.

use std::time::{Duration, Instant};

use leasehold_engine::{SettingWarning, Store};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::config::{PRIMARY_CHANGE_POLL, STORE_SETTINGS_RECHECK};
use crate::metrics::Label;

/// The running watch; stops when dropped.
pub struct SettingsWatch {
    current: watch::Receiver<Vec<SettingWarning>>,
    /// Aborted when the watch is dropped.
    _task: tokio_util::task::AbortOnDropHandle<()>,
}

impl SettingsWatch {
    /// Starts watching `store`'s server and registers the gauge in
    /// `registry`. Returns after the first reading (bounded by a second:
    /// a store that does not answer yet is read again later).
    pub async fn start(store: Store, registry: &mut Registry) -> Self {
        Self::start_every(store, registry, STORE_SETTINGS_RECHECK).await
    }

    /// Like [`SettingsWatch::start`], reading the settings every `recheck`.
    pub async fn start_every(store: Store, registry: &mut Registry, recheck: Duration) -> Self {
        let gauges = Family::<Label, Gauge>::default();
        for setting in SettingWarning::SETTINGS {
            let _ = gauges.get_or_create(&[("setting", setting)]);
        }
        // Named before the store was: dashboards and alerts use the name.
        registry.register(
            "redis_setting_unsafe",
            "1 while this setting of the store's server weakens a guarantee (the log says how)",
            gauges.clone(),
        );
        let (tx, current) = watch::channel(Vec::new());
        let mut state = State {
            known: None,
            gauges,
            tx,
        };
        let mut primaries = store.primaries_found();
        let mut read_at = state.read(&store).await.then(Instant::now);
        let task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            loop {
                tokio::time::sleep(PRIMARY_CHANGE_POLL.min(recheck)).await;
                let found = store.primaries_found();
                let due = read_at.is_none_or(|at| at.elapsed() >= recheck);
                // Marked read only when the read worked: a failed one (at
                // start, or the first after a failover) is tried again at
                // the next poll.
                if (found != primaries || due) && state.read(&store).await {
                    primaries = found;
                    read_at = Some(Instant::now());
                }
            }
        }));
        Self {
            current,
            _task: task,
        }
    }

    /// The current warnings, updated as they change.
    pub fn current(&self) -> watch::Receiver<Vec<SettingWarning>> {
        self.current.clone()
    }
}

struct State {
    /// The last reading, `None` before the first that succeeded.
    known: Option<Vec<SettingWarning>>,
    gauges: Family<Label, Gauge>,
    tx: watch::Sender<Vec<SettingWarning>>,
}

impl State {
    /// Reads the settings; false if the server did not answer.
    async fn read(&mut self, store: &Store) -> bool {
        let read =
            leasehold_engine::store::bounded(Duration::from_secs(1), store.setting_warnings());
        let warnings = match read.await {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!(error = %e, "could not read the store server's settings");
                return false;
            }
        };
        let before = self.known.take().unwrap_or_default();
        for w in &warnings {
            if !before.iter().any(|b| b.setting == w.setting) {
                tracing::warn!(setting = w.setting, "{}", w.message);
            }
        }
        for b in &before {
            if !warnings.iter().any(|w| w.setting == b.setting) {
                tracing::info!(setting = b.setting, "{} is no longer a concern", b.setting);
            }
        }
        for setting in SettingWarning::SETTINGS {
            let wrong = warnings.iter().any(|w| w.setting == setting);
            self.gauges
                .get_or_create(&[("setting", setting)])
                .set(i64::from(wrong));
        }
        self.tx.send_replace(warnings.clone());
        self.known = Some(warnings);
        true
    }
}
