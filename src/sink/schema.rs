//! The four tables the sink writes, in PostHog's shapes so PostHog-style SQL runs on
//! them: `events`, `person`, `person_distinct_id2` and `groups`. Each is a
//! `ReplacingMergeTree` whose sort key identifies a row, so a row sent twice (after a
//! crash between insert and checkpoint) collapses to one: events by their uuid (with
//! the date, name and distinct id PostHog sorts by ahead of it), persons by id, links
//! by distinct id and groups by key, the highest version winning. PostHog's Kafka
//! bookkeeping columns `_timestamp` and `_offset` hold the time the compactor committed
//! the change and its place in the sink's outbox, so a batch re-sent after a crash is
//! byte for byte the batch first sent.
//!
//! Columns are listed once, here, and both the CREATE TABLE and the INSERT's column
//! list are built from them, so the order [`super::rows`] encodes in is the order the
//! INSERT names.

use super::version::Shape;

/// Replacing engines on non-replicated tables remember the hashes of this many recent
/// inserts on current servers, so a re-sent batch with the same deduplication token is
/// dropped at once. Far more than the batches in flight at any time.
pub const DEDUP_WINDOW: u32 = 1000;

/// The tables, in the order each batch is inserted: people and groups before the
/// events that refer to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Person,
    DistinctId,
    Group,
    Event,
}

impl Table {
    pub const ALL: [Table; 4] = [Table::Person, Table::DistinctId, Table::Group, Table::Event];

    pub fn name(self) -> &'static str {
        match self {
            Table::Event => "events",
            Table::Person => "person",
            Table::DistinctId => "person_distinct_id2",
            Table::Group => "groups",
        }
    }

    /// Each column's name and type, in insert order.
    pub fn columns(self, shape: Shape) -> Vec<(&'static str, &'static str)> {
        let (micros, millis) = match shape {
            Shape::Current => ("DateTime64(6, 'UTC')", "DateTime64(3, 'UTC')"),
            Shape::Narrow => ("DateTime('UTC')", "DateTime('UTC')"),
        };
        let mut columns = match self {
            Table::Event => vec![
                ("uuid", "UUID"),
                ("event", "String"),
                ("properties", "String"),
                ("timestamp", micros),
                ("team_id", "Int64"),
                ("distinct_id", "String"),
                ("elements_chain", "String"),
                ("created_at", micros),
                ("person_id", "UUID"),
                ("`$group_0`", "String"),
                ("`$group_1`", "String"),
                ("`$group_2`", "String"),
                ("`$group_3`", "String"),
                ("`$group_4`", "String"),
            ],
            Table::Person => vec![
                ("id", "UUID"),
                ("created_at", millis),
                ("team_id", "Int64"),
                ("properties", "String"),
                ("is_identified", "Int8"),
                ("is_deleted", "Int8"),
                ("version", "UInt64"),
            ],
            // PostHog's version here is Int64; servers before 19 refuse a signed
            // version column, and the sink's versions are never negative.
            Table::DistinctId => vec![
                ("team_id", "Int64"),
                ("distinct_id", "String"),
                ("person_id", "UUID"),
                ("is_deleted", "Int8"),
                ("version", "UInt64"),
            ],
            Table::Group => vec![
                ("group_type_index", "UInt8"),
                ("group_key", "String"),
                ("created_at", millis),
                ("team_id", "Int64"),
                ("group_properties", "String"),
            ],
        };
        if self == Table::Event && shape == Shape::Narrow {
            columns.push(("timestamp_ms", "Int64"));
            columns.push(("created_at_ms", "Int64"));
        }
        columns.push(("_timestamp", "DateTime('UTC')"));
        columns.push(("_offset", "UInt64"));
        columns
    }

    /// The engine and its keys.
    fn engine(self, shape: Shape) -> String {
        let body = match (self, shape) {
            (Table::Event, Shape::Current) => {
                "ReplacingMergeTree(_timestamp) PARTITION BY toYYYYMM(timestamp) \
                 ORDER BY (team_id, toDate(timestamp), event, cityHash64(distinct_id), \
                 cityHash64(uuid))"
            }
            // cityHash64 of a UUID is refused before 19; the uuid itself sorts as well.
            (Table::Event, Shape::Narrow) => {
                "ReplacingMergeTree(_timestamp) PARTITION BY toYYYYMM(timestamp) \
                 ORDER BY (team_id, toDate(timestamp), event, cityHash64(distinct_id), uuid)"
            }
            (Table::Person, _) => "ReplacingMergeTree(version) ORDER BY (team_id, id)",
            (Table::DistinctId, _) => {
                "ReplacingMergeTree(version) ORDER BY (team_id, distinct_id) \
                 SETTINGS index_granularity = 512"
            }
            // PostHog versions groups by `_timestamp`, whole seconds; the outbox
            // position orders two changes within one second too.
            (Table::Group, _) => {
                "ReplacingMergeTree(_offset) ORDER BY (team_id, group_type_index, group_key)"
            }
        };
        let mut engine = body.to_string();
        if shape.dedup_token() {
            let sep = if engine.contains(" SETTINGS ") {
                ", "
            } else {
                " SETTINGS "
            };
            engine.push_str(&format!(
                "{sep}non_replicated_deduplication_window = {DEDUP_WINDOW}"
            ));
        }
        engine
    }

    /// `CREATE TABLE IF NOT EXISTS`, in the database the connection names.
    pub fn create_sql(self, shape: Shape) -> String {
        let columns: Vec<String> = self
            .columns(shape)
            .iter()
            .map(|(name, ty)| format!("{name} {ty}"))
            .collect();
        format!(
            "CREATE TABLE IF NOT EXISTS {} ({}) ENGINE = {}",
            self.name(),
            columns.join(", "),
            self.engine(shape)
        )
    }

    /// `INSERT INTO t (columns) FORMAT RowBinary`; the rows follow as the body.
    pub fn insert_sql(self, shape: Shape) -> String {
        let names: Vec<&str> = self.columns(shape).iter().map(|(n, _)| *n).collect();
        format!(
            "INSERT INTO {} ({}) FORMAT RowBinary",
            self.name(),
            names.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements() {
        assert_eq!(
            Table::DistinctId.create_sql(Shape::Narrow),
            "CREATE TABLE IF NOT EXISTS person_distinct_id2 (team_id Int64, distinct_id String, \
             person_id UUID, is_deleted Int8, version UInt64, _timestamp DateTime('UTC'), \
             _offset UInt64) ENGINE = ReplacingMergeTree(version) ORDER BY (team_id, \
             distinct_id) SETTINGS index_granularity = 512"
        );
        assert!(Table::DistinctId.create_sql(Shape::Current).ends_with(
            "SETTINGS index_granularity = 512, non_replicated_deduplication_window = 1000"
        ));
        assert!(Table::Person.create_sql(Shape::Current).ends_with(
            "ORDER BY (team_id, id) SETTINGS non_replicated_deduplication_window = 1000"
        ));
        assert_eq!(
            Table::Group.insert_sql(Shape::Narrow),
            "INSERT INTO groups (group_type_index, group_key, created_at, team_id, \
             group_properties, _timestamp, _offset) FORMAT RowBinary"
        );
        let narrow = Table::Event.insert_sql(Shape::Narrow);
        assert!(narrow.contains("`$group_4`, timestamp_ms, created_at_ms, _timestamp, _offset"));
        assert!(!Table::Event
            .create_sql(Shape::Current)
            .contains("timestamp_ms"));
    }
}
