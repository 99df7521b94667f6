//! Edge mode's metrics, named by the contract: how old each synced project's flag
//! definitions are, the forwarder's backlog and lag, dead letters, and every upstream
//! answer by endpoint and status. Prometheus handles over shared atomics: the sync
//! loop, the flag fallback and the forwarder update them directly, and `/metrics`
//! registers them under the `flagpost_` prefix with [`Stats::register`] whether or not
//! edge mode is on (they stay at zero when it is off).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProjectLabels {
    pub project: u64,
}

/// `endpoint` is the upstream path's name (`flags_definitions`, `local_evaluation`,
/// `flags`, `batch`, `s`, `config`, `surveys`, ...); `status` the HTTP status, or
/// `timeout`, `refused`, `reset` or `error` when no status came back.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: &'static str,
    pub status: String,
}

#[derive(Clone, Default)]
pub struct Stats {
    /// Seconds since each synced project's definitions were last confirmed by upstream
    /// (a 200 or a 304).
    pub definitions_age_seconds: Family<ProjectLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Events stored but not yet acknowledged by upstream.
    pub forward_backlog_events: Gauge,
    /// Age of the oldest event not yet acknowledged by upstream; 0 when all is sent.
    pub forward_lag_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Events upstream refused for good (400), kept in `<db>/upstream/dead-letter.ndjson`.
    pub dead_letters: Counter,
    /// Every request to upstream, by endpoint and answer.
    pub requests: Family<RequestLabels, Counter>,
}

impl Stats {
    /// Count one upstream request's outcome.
    pub fn answered(&self, endpoint: &'static str, status: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint,
                status: status.to_string(),
            })
            .inc();
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "upstream_definitions_age_seconds",
            "Seconds since upstream last confirmed a synced project's flag definitions",
            self.definitions_age_seconds.clone(),
        );
        registry.register(
            "upstream_forward_backlog_events",
            "Events stored but not yet acknowledged by upstream",
            self.forward_backlog_events.clone(),
        );
        registry.register(
            "upstream_forward_lag_seconds",
            "Age of the oldest event not yet acknowledged by upstream",
            self.forward_lag_seconds.clone(),
        );
        registry.register(
            "upstream_dead_letters",
            "Events upstream refused for good, kept in the dead-letter file",
            self.dead_letters.clone(),
        );
        registry.register(
            "upstream_requests",
            "Requests to upstream, by endpoint and answer",
            self.requests.clone(),
        );
    }
}
