//! The scenarios and their request bodies: what posthog-js sends for a page view, a
//! flushed batch of 100 events (gzip'd, as the SDKs send batches) and a `/decide` call.
//!
//! Bodies are built before the clock starts and cycled through, so during the
//! measurement the client spends its share of the cores on HTTP, not on JSON and gzip.
//! Each pool is large enough that consecutive requests carry different distinct_ids.

use std::io::Write;

use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use serde_json::{json, Value};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::common::{self, distinct_id};
use crate::flags::{API_KEY, GROUP_KEYS};

/// Distinct single-event bodies (about 600 bytes each).
const CAPTURE_POOL: usize = 4096;
/// Distinct gzip'd batches; each holds `BATCH_EVENTS` events, so 25,600 distinct events.
const BATCH_POOL: usize = 256;
/// Distinct `/decide` bodies, one person each.
const DECIDE_POOL: usize = 4096;
/// posthog-js flushes its queue in batches of up to 100 events.
pub const BATCH_EVENTS: usize = 100;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Capture,
    Batch,
    Decide,
    /// Batches as fast as they are accepted, then the compactor's pace and lag: with
    /// person processing, and without (`$process_person_profile: false`).
    Compactor,
    CompactorAnon,
}

impl Scenario {
    /// What runs when no scenario is named.
    pub const ALL: [Scenario; 5] = [
        Scenario::Capture,
        Scenario::Batch,
        Scenario::Decide,
        Scenario::Compactor,
        Scenario::CompactorAnon,
    ];

    pub fn parse(name: &str) -> Result<Scenario, String> {
        Scenario::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| {
                format!(
                    "unknown scenario {name:?}; try capture, batch, decide, compactor or compactor-anon"
                )
            })
    }

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Capture => "capture",
            Scenario::Batch => "batch",
            Scenario::Decide => "decide",
            Scenario::Compactor => "compactor",
            Scenario::CompactorAnon => "compactor-anon",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Scenario::Capture => "/capture/",
            Scenario::Batch | Scenario::Compactor | Scenario::CompactorAnon => "/batch/",
            Scenario::Decide => "/decide/?v=3",
        }
    }

    /// Measured against flagpost alone: the reference has nothing to compact.
    pub fn is_compactor(self) -> bool {
        matches!(self, Scenario::Compactor | Scenario::CompactorAnon)
    }

    /// The `Content-Encoding` of the body, if it is compressed.
    pub fn encoding(self) -> Option<&'static str> {
        match self {
            Scenario::Batch | Scenario::Compactor | Scenario::CompactorAnon => Some("gzip"),
            Scenario::Capture | Scenario::Decide => None,
        }
    }

    /// Events acknowledged by one successful request, or none if it ingests nothing.
    pub fn events_per_request(self) -> Option<usize> {
        match self {
            Scenario::Capture => Some(1),
            Scenario::Batch | Scenario::Compactor | Scenario::CompactorAnon => Some(BATCH_EVENTS),
            Scenario::Decide => None,
        }
    }

    /// The pool of request bodies this scenario cycles through.
    pub fn bodies(self) -> Vec<Bytes> {
        let now = now_ms();
        match self {
            Scenario::Capture => (0..CAPTURE_POOL)
                .map(|n| {
                    let mut event = pageview(n, now);
                    event["api_key"] = API_KEY.into();
                    // No uuid: the server assigns one, so a pool body sent again is a
                    // new event the compactor must apply, not a duplicate it skips.
                    if let Some(obj) = event.as_object_mut() {
                        obj.remove("uuid");
                    }
                    Bytes::from(event.to_string())
                })
                .collect(),
            Scenario::Batch | Scenario::Compactor => {
                (0..BATCH_POOL).map(|n| batch(n, now, true)).collect()
            }
            Scenario::CompactorAnon => (0..BATCH_POOL).map(|n| batch(n, now, false)).collect(),
            Scenario::Decide => (0..DECIDE_POOL).map(decide).collect(),
        }
    }
}

/// A `$pageview` the way posthog-js builds it, for the `n`th person, at `now_ms`.
fn pageview(n: usize, now_ms: i64) -> Value {
    let ids = [Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7()];
    common::pageview_event(n, now_ms, ids, API_KEY)
}

/// `{api_key, batch: [100 events], sent_at}`, gzip'd; the `n`th of the pool. The
/// events carry no uuid (the server assigns one), so a pool body sent again stores new
/// events instead of duplicates the compactor would skip. `persons: false` marks them
/// `$process_person_profile: false`.
fn batch(n: usize, now: i64, persons: bool) -> Bytes {
    let events: Vec<Value> = (0..BATCH_EVENTS)
        .map(|i| {
            let mut event = pageview(n * BATCH_EVENTS + i, now);
            if let Some(obj) = event.as_object_mut() {
                obj.remove("uuid");
            }
            if !persons {
                event["properties"]["$process_person_profile"] = false.into();
            }
            event
        })
        .collect();
    let sent_at = flagpost::support::clock::format_ms(now);
    let body = json!({"api_key": API_KEY, "batch": events, "sent_at": sent_at});
    let mut gzip = GzEncoder::new(Vec::new(), Compression::default());
    gzip.write_all(body.to_string().as_bytes())
        .and_then(|()| gzip.finish())
        .map(Bytes::from)
        .expect("gzip into memory cannot fail")
}

/// `count` batches with person processing, the `n`th holding the events of persons
/// `100 n` to `100 n + 99`: together they cover `100 count` distinct ids.
pub fn person_batches(count: usize) -> Vec<Bytes> {
    let now = now_ms();
    (0..count).map(|n| batch(n, now, true)).collect()
}

/// The current time in unix milliseconds.
fn now_ms() -> i64 {
    let nanos = OffsetDateTime::now_utc().unix_timestamp_nanos();
    i64::try_from(nanos / 1_000_000).expect("the current time fits in i64 milliseconds")
}

/// `count` `/decide` bodies of the callers from the `first`th on.
pub fn decide_bodies(first: usize, count: usize) -> Vec<Bytes> {
    (first..first + count).map(decide).collect()
}

/// A posthog-js `/decide` call: the person's properties and groups travel with it, so
/// every condition of the generated flags has something to compare.
fn decide(n: usize) -> Bytes {
    let plan = ["free", "pro", "enterprise"][n % 3];
    let country = ["GB", "US", "DE", "FR", "BR"][n % 5];
    let body = json!({
        "token": API_KEY,
        "distinct_id": distinct_id(n),
        "$anon_distinct_id": Uuid::now_v7().to_string(),
        "groups": {
            GROUP_KEYS[0]: format!("org-{}", n % 50),
            GROUP_KEYS[1]: format!("company-{}", n % 20),
        },
        "person_properties": {
            "email": format!("{}@{}", distinct_id(n), ["example.com", "acme.io", "gmail.com"][n % 3]),
            "plan": plan,
            "$geoip_country_code": country,
            "app_version": format!("2.{}.{}", n % 12, n % 5),
            "signed_up_at": "2024-03-01T10:00:00Z",
            "seats": n % 40,
            "$browser": "Chrome",
        },
        "group_properties": {
            GROUP_KEYS[0]: {"tier": plan, "employees": (n % 50) * 10},
        },
    });
    Bytes::from(body.to_string())
}
