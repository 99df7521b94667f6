//! Process metrics in the Prometheus text format. Handles are cheap clones of shared
//! atomics, so the hot path only increments; gauges that mirror other state are
//! refreshed when `/metrics` is scraped.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
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

/// One reason a flag file is refused, each value escaped for the text format (see
/// [`RefusedLabels::new`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub file: String,
    pub flag: String,
    pub field: String,
    pub problem: String,
}

impl RefusedLabels {
    /// The encoder writes label values as given; the text format wants `\`, `"` and
    /// line breaks escaped, and a problem's text quotes what was likely meant.
    pub fn new(file: &str, flag: &str, field: &str, problem: &str) -> RefusedLabels {
        let escape = |s: &str| {
            s.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n")
        };
        RefusedLabels {
            file: escape(file),
            flag: escape(flag),
            field: escape(field),
            problem: escape(problem),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabels {
    pub lane: &'static str,
}

/// Who holds a share of the process's memory (`flagpost_memory_bytes`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HolderLabels {
    pub holder: &'static str,
}

/// Latency buckets in seconds: fine below a millisecond, where decide lives.
const LATENCY_BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub events_accepted: Counter,
    pub events_dropped: Family<ReasonLabels, Counter>,
    pub connections_refused: Counter,
    pub connections_refused_per_address: Counter,
    pub connections_open: Gauge,
    pub max_connections: Gauge,
    pub max_connections_per_address: Gauge,
    pub wal_records: Gauge,
    pub wal_queued_requests: Gauge,
    pub wal_flushes: Gauge,
    pub wal_last_flush_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub wal_flush_seconds: Histogram,
    pub log_depth: Gauge,
    pub log_segments: Gauge,
    pub log_bytes: Gauge,
    pub log_backpressure: Gauge,
    pub log_torn: Counter,
    pub log_skipped: Counter,
    pub log_quarantined: Counter,
    pub log_missing: Counter,
    pub decide_cached_persons: Gauge,
    pub memory_bytes: Family<HolderLabels, Gauge>,
    pub resident_bytes: Gauge,
    pub compactor_applied: Counter,
    pub compactor_steps: Counter,
    pub compactor_duplicates: Counter,
    pub compactor_corrupt: Counter,
    pub compactor_routed: Family<LaneLabels, Counter>,
    pub compactor_lag_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub compactor_healthy: Gauge,
    pub retention_deleted: Counter,
    pub decide_seconds: Histogram,
    pub decide_errors: Counter,
    pub flags_snapshot_version: Gauge,
    pub flags_reload_failures: Counter,
    pub flags_refused: Family<RefusedLabels, Gauge>,
    pub surveys_reload_failures: Counter,
    pub early_access_reload_failures: Counter,
    pub disk_free_bytes: Gauge,
    pub geoip_lookups: Counter,
    pub geoip_hits: Counter,
    /// The ClickHouse sink's, registered whether or not it is on.
    pub sink: crate::sink::Stats,
    /// Edge mode's, registered whether or not it is on.
    pub upstream: crate::edge::Stats,
    /// Serialises scrapes, so counters mirrored from other atomics advance once.
    scrape: std::sync::Mutex<()>,
}

/// Advance a counter that mirrors a monotonic atomic elsewhere.
pub fn mirror(counter: &Counter, value: u64) {
    let current = counter.get();
    if value > current {
        counter.inc_by(value - current);
    }
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
            connections_refused_per_address: Counter::default(),
            connections_open: Gauge::default(),
            max_connections: Gauge::default(),
            max_connections_per_address: Gauge::default(),
            wal_records: Gauge::default(),
            wal_queued_requests: Gauge::default(),
            wal_flushes: Gauge::default(),
            wal_last_flush_seconds: Gauge::default(),
            wal_flush_seconds: Histogram::new(LATENCY_BUCKETS.iter().copied()),
            log_depth: Gauge::default(),
            log_segments: Gauge::default(),
            log_bytes: Gauge::default(),
            log_backpressure: Gauge::default(),
            log_torn: Counter::default(),
            log_skipped: Counter::default(),
            log_quarantined: Counter::default(),
            log_missing: Counter::default(),
            decide_cached_persons: Gauge::default(),
            memory_bytes: Family::default(),
            resident_bytes: Gauge::default(),
            compactor_applied: Counter::default(),
            compactor_steps: Counter::default(),
            compactor_duplicates: Counter::default(),
            compactor_corrupt: Counter::default(),
            compactor_routed: Family::default(),
            compactor_lag_seconds: Gauge::default(),
            compactor_healthy: Gauge::default(),
            retention_deleted: Counter::default(),
            decide_seconds: Histogram::new(LATENCY_BUCKETS.iter().copied()),
            decide_errors: Counter::default(),
            flags_snapshot_version: Gauge::default(),
            flags_reload_failures: Counter::default(),
            flags_refused: Family::default(),
            surveys_reload_failures: Counter::default(),
            early_access_reload_failures: Counter::default(),
            disk_free_bytes: Gauge::default(),
            geoip_lookups: Counter::default(),
            geoip_hits: Counter::default(),
            sink: Default::default(),
            upstream: Default::default(),
            scrape: std::sync::Mutex::new(()),
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
            "connections_refused_per_address",
            "Connections closed at accept because their address held its share already",
            m.connections_refused_per_address.clone(),
        );
        registry.register(
            "connections_open",
            "Connections open now",
            m.connections_open.clone(),
        );
        registry.register(
            "max_connections",
            "Connections that may be open at once (--max-connections)",
            m.max_connections.clone(),
        );
        registry.register(
            "max_connections_per_address",
            "Connections one client address may hold open (--max-connections-per-address)",
            m.max_connections_per_address.clone(),
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
        registry.register(
            "wal_flush_duration_seconds",
            "Duration of each write-ahead log fsync (one per group commit)",
            m.wal_flush_seconds.clone(),
        );
        registry.register(
            "log_depth",
            "Entries waiting in the write-ahead log (up to 512 records or 64 KiB each) plus records waiting in the slower lanes",
            m.log_depth.clone(),
        );
        registry.register(
            "log_segments",
            "Write-ahead log segment files in use (each --log-segment-mb), not counting the spare",
            m.log_segments.clone(),
        );
        registry.register(
            "log_bytes",
            "Bytes of write-ahead log segment files in use",
            m.log_bytes.clone(),
        );
        registry.register(
            "log_backpressure",
            "1 while new events get 503 because the log holds more than --max-log-mb (the compactor is behind), else 0",
            m.log_backpressure.clone(),
        );
        registry.register(
            "log_entries_torn",
            "Write-ahead log entries found cut short at the end of the newest segment at a start (a write in progress at a crash)",
            m.log_torn.clone(),
        );
        registry.register(
            "log_entries_skipped",
            "Write-ahead log numbers given up after a failed write (never acknowledged)",
            m.log_skipped.clone(),
        );
        registry.register(
            "log_entries_quarantined",
            "Damaged write-ahead log entries moved to the quarantine, intact entries after them read on",
            m.log_quarantined.clone(),
        );
        registry.register(
            "log_entries_missing",
            "Write-ahead log entries missing with no recorded skip to explain them (deleted or cut-off segments): lost",
            m.log_missing.clone(),
        );
        registry.register(
            "decide_cached_persons",
            "Persons /decide holds in memory between requests",
            m.decide_cached_persons.clone(),
        );
        registry.register(
            "memory_bytes",
            "Bytes each holder of memory keeps, by its own count (caches by their weight, maps estimated from their entries); the resident set adds the allocator's share, sled, buffers and code",
            m.memory_bytes.clone(),
        );
        registry.register(
            "resident_bytes",
            "The process's resident set; less the sum of flagpost_memory_bytes, it is what no holder counts: freed memory the allocator keeps in pages still partly in use, sled beyond its cache, requests in flight, the code and the threads' stacks",
            m.resident_bytes.clone(),
        );
        registry.register(
            "compactor_applied",
            "Log records applied to events, persons and groups",
            m.compactor_applied.clone(),
        );
        registry.register(
            "compactor_steps",
            "Compactor passes, busy or idle: it advances while the compactor runs",
            m.compactor_steps.clone(),
        );
        registry.register(
            "compactor_duplicates",
            "Log records skipped because their uuid was already stored",
            m.compactor_duplicates.clone(),
        );
        registry.register(
            "compactor_corrupt",
            "Undecodable log records moved to quarantine",
            m.compactor_corrupt.clone(),
        );
        registry.register(
            "compactor_routed",
            "Records sent to a slower lane: historical imports and spiking distinct ids",
            m.compactor_routed.clone(),
        );
        registry.register(
            "compactor_lag_seconds",
            "Age of the oldest record not yet applied",
            m.compactor_lag_seconds.clone(),
        );
        registry.register(
            "compactor_healthy",
            "1 while compactor steps succeed; 0 means new events are refused",
            m.compactor_healthy.clone(),
        );
        registry.register(
            "retention_deleted_events",
            "Events deleted by the retention setting",
            m.retention_deleted.clone(),
        );
        registry.register(
            "decide_duration_seconds",
            "Time to answer /decide and /flags, from the request to the body",
            m.decide_seconds.clone(),
        );
        registry.register(
            "decide_partial",
            "Decide answers with errorsWhileComputingFlags (some flags left out)",
            m.decide_errors.clone(),
        );
        registry.register(
            "flags_snapshot_version",
            "Version of the published flag rules; it increases on every reload",
            m.flags_snapshot_version.clone(),
        );
        registry.register(
            "flags_reload_failures",
            "Flag files that failed to load (the previous rules stayed)",
            m.flags_reload_failures.clone(),
        );
        registry.register(
            "flags_refused",
            "1 for each reason a flag file is refused while it is (its previous rules serve)",
            m.flags_refused.clone(),
        );
        registry.register(
            "surveys_reload_failures",
            "Surveys files that failed to load (the previous surveys stayed)",
            m.surveys_reload_failures.clone(),
        );
        registry.register(
            "early_access_reload_failures",
            "Early access files that failed to load (the previous features stayed)",
            m.early_access_reload_failures.clone(),
        );
        registry.register(
            "disk_free_bytes",
            "Free space on the database's filesystem; under --min-free-disk-mb events are refused",
            m.disk_free_bytes.clone(),
        );
        registry.register(
            "geoip_lookups",
            "GeoIP database lookups (public addresses only)",
            m.geoip_lookups.clone(),
        );
        registry.register(
            "geoip_hits",
            "GeoIP lookups that found the address",
            m.geoip_hits.clone(),
        );
        m.sink.register(&mut registry);
        m.upstream.register(&mut registry);
        for lane in ["historical", "overflow"] {
            m.compactor_routed
                .get_or_create(&LaneLabels { lane })
                .inc_by(0);
        }
        Metrics { registry, ..m }
    }

    /// Hold while refreshing mirrored values and rendering.
    pub fn scrape_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // It guards no data: a panic while holding it leaves nothing half-done.
        crate::support::sync::lock(&self.scrape)
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
