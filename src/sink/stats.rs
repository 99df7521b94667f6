//! The sink's metrics: rows sent per table, failed attempts, and how far behind
//! ClickHouse is. Prometheus handles over shared atomics, so the worker updates them
//! directly and `/metrics` registers them under the `flagpost_` prefix with
//! [`Stats::register`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::schema::Table;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabels {
    pub table: &'static str,
}

#[derive(Clone, Default)]
pub struct Stats {
    /// Rows ClickHouse acknowledged, by table (a re-sent row counts again).
    pub rows: Family<TableLabels, Counter>,
    /// Attempts that failed: connecting, creating tables, inserting or the outbox.
    pub errors: Counter,
    /// Age of the oldest change not yet acknowledged; 0 when all is sent.
    pub lag_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Event blocks named by the outbox but deleted before they were sent.
    pub missing_blocks: Counter,
}

impl Stats {
    pub fn register(&self, registry: &mut Registry) {
        for table in Table::ALL {
            // Present from the start so a rate() over them is defined.
            self.rows
                .get_or_create(&TableLabels {
                    table: table.name(),
                })
                .inc_by(0);
        }
        registry.register(
            "sink_rows",
            "Rows ClickHouse acknowledged, by table",
            self.rows.clone(),
        );
        registry.register(
            "sink_errors",
            "Failed attempts to reach or write ClickHouse (each is retried)",
            self.errors.clone(),
        );
        registry.register(
            "sink_lag_seconds",
            "Age of the oldest change not yet in ClickHouse; 0 when all is sent",
            self.lag_seconds.clone(),
        );
        registry.register(
            "sink_missing_blocks",
            "Event blocks deleted before the sink sent them",
            self.missing_blocks.clone(),
        );
    }

    pub fn sent(&self, table: Table, rows: u64) {
        self.rows
            .get_or_create(&TableLabels {
                table: table.name(),
            })
            .inc_by(rows);
    }

    /// Rows acknowledged so far in `table`.
    pub fn rows_of(&self, table: Table) -> u64 {
        self.rows
            .get_or_create(&TableLabels {
                table: table.name(),
            })
            .get()
    }
}
