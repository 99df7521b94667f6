//! Process metrics in the Prometheus text format. Handles are cheap clones of shared
//! atomics, so the hot path only increments; gauges that mirror other state are
//! refreshed when `/metrics` is scraped.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::capture::DropReason;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub events_accepted: Counter,
    pub events_dropped: Family<ReasonLabels, Counter>,
    pub connections_refused: Counter,
    pub wal_records: Gauge,
    pub wal_queued_requests: Gauge,
    pub wal_flushes: Gauge,
    pub wal_last_flush_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("flagpost");
        let m = Metrics {
            requests: Family::default(),
            events_accepted: Counter::default(),
            events_dropped: Family::default(),
            connections_refused: Counter::default(),
            wal_records: Gauge::default(),
            wal_queued_requests: Gauge::default(),
            wal_flushes: Gauge::default(),
            wal_last_flush_seconds: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "http_requests",
            "HTTP requests answered, by route and status",
            m.requests.clone(),
        );
        registry.register(
            "events_accepted",
            "Events acknowledged durably",
            m.events_accepted.clone(),
        );
        registry.register(
            "events_dropped",
            "Events dropped by rule, by reason",
            m.events_dropped.clone(),
        );
        for reason in DropReason::ALL {
            // Present from the start so a rate() over them is defined.
            m.events_dropped
                .get_or_create(&ReasonLabels {
                    reason: reason.as_str(),
                })
                .inc_by(0);
        }
        registry.register(
            "connections_refused",
            "Connections closed at accept because the connection limit was reached",
            m.connections_refused.clone(),
        );
        registry.register(
            "wal_appended_records",
            "Records appended to the write-ahead log since start",
            m.wal_records.clone(),
        );
        registry.register(
            "wal_queued_requests",
            "Requests waiting for the write-ahead log writer",
            m.wal_queued_requests.clone(),
        );
        registry.register(
            "wal_group_commits",
            "Group commits (one fsync each) since start",
            m.wal_flushes.clone(),
        );
        registry.register(
            "wal_last_flush_seconds",
            "Duration of the latest write-ahead log fsync",
            m.wal_last_flush_seconds.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn request(&self, route: &'static str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels { route, status })
            .inc();
    }

    pub fn dropped(&self, reason: DropReason) {
        self.events_dropped
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
