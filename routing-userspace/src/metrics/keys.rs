//! Per-model routing-key statistics: the cardinality trackers behind
//! `flexinfer_proxy_routing_key_cardinality{model,strategy,key_source}` (and its overflow
//! counter), and the hot-key list of `/debug/routing`.
//!
//! The routing table holds each model's [`ModelKeys`] handle (resolved when the table is built),
//! so the request path pays one uncontended-in-practice mutex per model, a hash-set probe and a
//! scan of `k` hot-key counters; metric handles are resolved once per series, never per request. Estimates
//! are computed when `/metrics` is scraped, not per request. Everything is keyed by 64-bit key
//! hashes; no key text reaches this module.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use prometheus::{Gauge, GaugeVec, IntCounter, IntCounterVec};

use super::cardinality::{CardinalityTracker, Observed};
use super::hot_keys::{HotKey, SpaceSaving};
use crate::rules::sources_for;
use crate::vocab::{KeySource, Strategy};

/// Key tracking settings (flags of `serve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyTracking {
    /// Distinct key hashes kept exactly per series and generation.
    pub cardinality_cap: usize,
    /// Generation length of the cardinality trackers (`None`: count forever).
    pub cardinality_window: Option<Duration>,
    /// Hot keys listed per model (0 disables).
    pub hot_keys: usize,
    /// Half-life of the hot-key counts (`None`: no decay).
    pub hot_keys_half_life: Option<Duration>,
}

impl KeyTracking {
    pub const DEFAULT: Self = Self {
        cardinality_cap: 10_000,
        cardinality_window: Some(Duration::from_secs(600)),
        hot_keys: 20,
        hot_keys_half_life: Some(Duration::from_secs(60)),
    };
}

impl Default for KeyTracking {
    fn default() -> Self {
        Self::DEFAULT
    }
}

struct Series {
    strategy: Strategy,
    source: KeySource,
    tracker: CardinalityTracker,
    gauge: Gauge,
    overflow: IntCounter,
}

/// One model's key statistics.
pub struct ModelKeys {
    series: Vec<Series>,
    hot: SpaceSaving,
}

impl std::fmt::Debug for ModelKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelKeys")
            .field("series", &self.series.len())
            .finish()
    }
}

impl ModelKeys {
    /// Count one routed key (the request path). Its series exists: [`KeyStats::model`] made
    /// every keyed source of the model's strategy.
    pub fn observe(&mut self, strategy: Strategy, source: KeySource, hash: u64, now: Instant) {
        self.hot.observe(hash, source, now);
        if let Some(s) = self
            .series
            .iter_mut()
            .find(|s| s.strategy == strategy && s.source == source)
        {
            if s.tracker.observe(hash, now) == Observed::Overflow {
                s.overflow.inc();
            }
        }
    }
}

/// One series' state, for `/debug/routing`.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesReport {
    pub strategy: Strategy,
    pub source: KeySource,
    pub estimate: f64,
    pub exact_keys: usize,
}

pub struct KeyStats {
    tracking: KeyTracking,
    cardinality: GaugeVec,
    overflow: IntCounterVec,
    models: RwLock<HashMap<Arc<str>, Arc<Mutex<ModelKeys>>>>,
}

impl KeyStats {
    pub fn new(tracking: KeyTracking, cardinality: GaugeVec, overflow: IntCounterVec) -> Self {
        Self {
            tracking,
            cardinality,
            overflow,
            models: RwLock::new(HashMap::new()),
        }
    }

    pub fn tracking(&self) -> KeyTracking {
        self.tracking
    }

    fn entry(&self, model: &Arc<str>, now: Instant) -> Arc<Mutex<ModelKeys>> {
        if let Some(m) = self.models.read().expect("key stats lock").get(model) {
            return Arc::clone(m);
        }
        let mut models = self.models.write().expect("key stats lock");
        Arc::clone(models.entry(Arc::clone(model)).or_insert_with(|| {
            Arc::new(Mutex::new(ModelKeys {
                series: Vec::new(),
                hot: SpaceSaving::new(
                    self.tracking.hot_keys,
                    self.tracking.hot_keys_half_life,
                    now,
                ),
            }))
        }))
    }

    fn series<'a>(
        &self,
        keys: &'a mut ModelKeys,
        model: &str,
        strategy: Strategy,
        source: KeySource,
        now: Instant,
    ) -> &'a mut Series {
        let i = match keys
            .series
            .iter()
            .position(|s| s.strategy == strategy && s.source == source)
        {
            Some(i) => i,
            None => {
                let labels = [model, strategy.as_str(), source.as_str()];
                keys.series.push(Series {
                    strategy,
                    source,
                    tracker: CardinalityTracker::new(
                        self.tracking.cardinality_cap,
                        self.tracking.cardinality_window,
                        now,
                    ),
                    gauge: self.cardinality.with_label_values(&labels),
                    overflow: self.overflow.with_label_values(&labels),
                });
                keys.series.len() - 1
            }
        };
        &mut keys.series[i]
    }

    /// Count one routed key (tests; the request path goes through the model's handle).
    pub fn observe(
        &self,
        model: &Arc<str>,
        strategy: Strategy,
        source: KeySource,
        hash: u64,
        now: Instant,
    ) {
        let m = self.model(model, strategy, now);
        let mut keys = m.lock().expect("model keys lock");
        keys.observe(strategy, source, hash, now);
    }

    /// The model's statistics handle, with its series existing (at zero) for every keyed
    /// source its strategy can report; series of another strategy (the model's routing
    /// changed) are forgotten.
    pub fn model(
        &self,
        model: &Arc<str>,
        strategy: Strategy,
        now: Instant,
    ) -> Arc<Mutex<ModelKeys>> {
        let m = self.entry(model, now);
        self.touch_entry(&m, model, strategy, now);
        m
    }

    /// [`KeyStats::model`] without keeping the handle.
    pub fn touch(&self, model: &Arc<str>, strategy: Strategy, now: Instant) {
        self.model(model, strategy, now);
    }

    fn touch_entry(
        &self,
        m: &Mutex<ModelKeys>,
        model: &Arc<str>,
        strategy: Strategy,
        now: Instant,
    ) {
        let mut keys = m.lock().expect("model keys lock");
        keys.series.retain(|s| {
            let keep = s.strategy == strategy;
            if !keep {
                let _ = self.cardinality.remove_label_values(&[
                    model,
                    s.strategy.as_str(),
                    s.source.as_str(),
                ]);
            }
            keep
        });
        for &source in sources_for(strategy) {
            if source != KeySource::None {
                self.series(&mut keys, model, strategy, source, now);
            }
        }
    }

    /// Drop the state (and cardinality gauges) of models `keep` rejects.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut models = self.models.write().expect("key stats lock");
        models.retain(|name, m| {
            if keep(name) {
                return true;
            }
            let keys = m.lock().expect("model keys lock");
            for s in &keys.series {
                let _ = self.cardinality.remove_label_values(&[
                    name,
                    s.strategy.as_str(),
                    s.source.as_str(),
                ]);
            }
            false
        });
    }

    fn each_model(&self) -> Vec<(Arc<str>, Arc<Mutex<ModelKeys>>)> {
        let models = self.models.read().expect("key stats lock");
        models
            .iter()
            .map(|(k, v)| (Arc::clone(k), Arc::clone(v)))
            .collect()
    }

    /// Roll every tracker's window and publish its estimate (run per scrape).
    pub fn refresh_gauges(&self, now: Instant) {
        for (_, m) in self.each_model() {
            let mut keys = m.lock().expect("model keys lock");
            for s in &mut keys.series {
                s.tracker.roll(now);
                s.gauge.set(s.tracker.estimate());
            }
        }
    }

    /// A model's stats if it has any (read paths never create them).
    fn existing(&self, model: &str) -> Option<Arc<Mutex<ModelKeys>>> {
        self.models
            .read()
            .expect("key stats lock")
            .get(model)
            .cloned()
    }

    /// The model's hottest keys, hottest first, and the decayed total they are shares of.
    pub fn hot_keys(&self, model: &str, now: Instant) -> (Vec<HotKey>, f64) {
        match self.existing(model) {
            Some(m) => m.lock().expect("model keys lock").hot.top(now),
            None => (Vec::new(), 0.0),
        }
    }

    /// The model's cardinality series.
    pub fn series_report(&self, model: &str, now: Instant) -> Vec<SeriesReport> {
        let Some(m) = self.existing(model) else {
            return Vec::new();
        };
        let mut keys = m.lock().expect("model keys lock");
        let mut v: Vec<SeriesReport> = keys
            .series
            .iter_mut()
            .map(|s| {
                s.tracker.roll(now);
                SeriesReport {
                    strategy: s.strategy,
                    source: s.source,
                    estimate: s.tracker.estimate(),
                    exact_keys: s.tracker.exact_keys(),
                }
            })
            .collect();
        v.sort_by_key(|r| r.source);
        v
    }

    /// Bytes all trackers and hot-key lists can hold at most with the series that exist now.
    pub fn memory_bound(&self) -> usize {
        self.each_model()
            .iter()
            .map(|(_, m)| {
                let keys = m.lock().expect("model keys lock");
                keys.hot.memory_bound()
                    + keys
                        .series
                        .iter()
                        .map(|s| s.tracker.memory_bound())
                        .sum::<usize>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::hash_key;
    use prometheus::Opts;

    fn stats(cap: usize) -> KeyStats {
        let labels = ["model", "strategy", "key_source"];
        KeyStats::new(
            KeyTracking {
                cardinality_cap: cap,
                ..KeyTracking::default()
            },
            GaugeVec::new(Opts::new("c", "c"), &labels).unwrap(),
            IntCounterVec::new(Opts::new("o", "o"), &labels).unwrap(),
        )
    }

    #[test]
    fn touch_creates_zero_series_for_keyed_sources_only() {
        let s = stats(10);
        let now = Instant::now();
        let m: Arc<str> = Arc::from("chat");
        s.touch(&m, Strategy::SessionAffinity, now);
        let labels = |src: KeySource| ["chat", "session-affinity", src.as_str()];
        assert_eq!(
            s.overflow
                .get_metric_with_label_values(&labels(KeySource::SessionHeader))
                .unwrap()
                .get(),
            0
        );
        let report = s.series_report("chat", now);
        let sources: Vec<_> = report.iter().map(|r| r.source).collect();
        assert_eq!(
            sources,
            [
                KeySource::SessionHeader,
                KeySource::ConversationHeader,
                KeySource::SessionBody,
                KeySource::ImplicitSession
            ]
        );
        // A routing change forgets the old strategy's gauges.
        s.touch(&m, Strategy::Prefix, now);
        assert_eq!(s.series_report("chat", now).len(), 8);
        s.retain(|_| false);
        assert!(s.series_report("chat", now).is_empty());
    }

    #[test]
    fn overflow_counts_and_the_gauge_follows_at_refresh() {
        let s = stats(5);
        let now = Instant::now();
        let m: Arc<str> = Arc::from("chat");
        for i in 0..50 {
            s.observe(
                &m,
                Strategy::Prefix,
                KeySource::ExplicitHeader,
                hash_key(&format!("k{i}")),
                now,
            );
        }
        let labels = ["chat", "prefix", "explicit-header"];
        assert_eq!(s.overflow.with_label_values(&labels).get(), 45);
        s.refresh_gauges(now);
        let e = s.cardinality.with_label_values(&labels).get();
        assert!((45.0..55.0).contains(&e), "estimate {e}");
        let (top, total) = s.hot_keys("chat", now);
        assert_eq!(total, 50.0);
        assert_eq!(top.len(), 20);
    }
}
