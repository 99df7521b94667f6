//! `flagpost_memory_bytes{holder}`: each holder of memory reports what it keeps, so an
//! operator can see where the resident set goes (docs/operating.md, "Memory").

use serde_json::json;

use crate::util::{Server, KEY_ONE};

/// The value of `flagpost_memory_bytes{holder="<holder>"}` in a `/metrics` text.
fn holder(metrics: &str, holder: &str) -> Option<f64> {
    let prefix = format!("flagpost_memory_bytes{{holder=\"{holder}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn each_holder_reports_what_stored_events_left_in_memory() {
    let server = Server::start();
    let before = server.get("/metrics").text();
    assert_eq!(holder(&before, "persons_delta"), Some(0.0), "{before}");
    // 300 events of 100 persons, each setting a property: persons, their distinct
    // ids and 300 uuids are then held in memory until a fold.
    let batch: Vec<_> = (0..300)
        .map(|i| {
            json!({"event": "e", "distinct_id": format!("person-{}", i % 100),
                   "properties": {"$set": {"plan": format!("plan {i}")}}})
        })
        .collect();
    let body = json!({"api_key": KEY_ONE, "batch": batch}).to_string();
    assert_eq!(server.post("/batch/", body).status, 200);
    server.settle(1);
    let metrics = server.get("/metrics").text();
    let bytes = |name| holder(&metrics, name).unwrap_or_else(|| panic!("{name} in {metrics}"));
    // 301 uuids of 32 bytes at least (the set's slots), however the set grew.
    assert!(bytes("dedup_window") >= 301.0 * 32.0, "{metrics}");
    // Each entry of a delta costs its key, its value and a share of a node: more
    // than the bytes written.
    assert!(bytes("persons_delta") > 100.0 * 64.0, "{metrics}");
    assert!(bytes("distinct_ids_delta") > 100.0 * 64.0, "{metrics}");
    // Every other holder is reported too.
    for name in [
        "event_block_cache",
        "run_block_cache",
        "person_cache",
        "person_bytes",
        "compactor_memo",
        "first_seen_delta",
        "by_property_delta",
        "table_run_indexes",
        "event_index_recent",
        "event_index_runs",
    ] {
        assert!(holder(&metrics, name).is_some(), "{name} in {metrics}");
    }
    // Sled's cache by the budget it is given (2 MiB unless --cache-mb says).
    assert_eq!(bytes("sled_cache"), 2.0 * 1024.0 * 1024.0, "{metrics}");
    // The resident set beside them, larger than what the holders count.
    let gauge = |name: &str| {
        let prefix = format!("{name} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    let resident = gauge("flagpost_resident_bytes");
    assert!(
        resident > bytes("dedup_window") + bytes("persons_delta"),
        "{metrics}"
    );
}
