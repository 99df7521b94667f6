//! The scale scenario's traffic: posthog-js shaped web events (about 500 bytes of JSON
//! and 14 properties each, UUIDv7 ids, timestamps spread over the last 30 days in
//! sending order) from a fixed number of persons, each going anonymous, identified,
//! sometimes aliased and given properties, then browsing; built on a thread of their
//! own into gzip'd 100-event `/batch/` bodies, as the SDKs flush them.
//!
//! Event `i` belongs to person `(i * STRIDE) mod persons`: within each round of
//! `persons` events every person sends exactly one, in an order that scatters them
//! over the id space as real traffic does, and the round number is that person's own
//! event count, so no state per person is kept.

use std::io::Write;

use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use serde_json::{json, Value};

use crate::common::{self, random_uuid};
use crate::flags::API_KEY;

/// Timestamps run over this span before the start of the run.
const SPAN_MS: i64 = 30 * 24 * 3_600_000;
/// Multiplier scattering event numbers over persons; made coprime with the number of
/// persons at the start, so each round still reaches every person once.
const STRIDE: u64 = 1_000_003;

/// What one person does with their `k`th event.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Browsing before signing in, under the device's anonymous id.
    AnonymousView,
    /// Signing in: `$identify` merging the anonymous id into the user id.
    Identify,
    /// Every tenth person also gets a second id by `$create_alias`.
    Alias,
    /// Every fifth person's properties are set by `$set`.
    Set,
    /// Browsing signed in.
    View,
}

fn step(person: u64, k: u64) -> Step {
    match k {
        0 => Step::AnonymousView,
        1 => Step::Identify,
        2 if person.is_multiple_of(10) => Step::Alias,
        3 if person.is_multiple_of(5) => Step::Set,
        _ => Step::View,
    }
}

/// The ids of a person: the user id the read API looks up, and the anonymous one.
pub fn user_id(person: u64) -> String {
    format!("user-{person:07}")
}

fn anonymous_id(person: u64) -> String {
    format!("anon-{person:07}")
}

/// The scenario's events, `events` of them from `persons` persons.
pub struct Traffic {
    pub events: u64,
    pub persons: u64,
    stride: u64,
    start_ms: i64,
}

impl Traffic {
    pub fn new(events: u64, persons: u64, now_ms: i64) -> Traffic {
        let persons = persons.max(1);
        let mut stride = STRIDE % persons;
        while gcd(stride.max(1), persons) != 1 {
            stride += 1;
        }
        Traffic {
            events,
            persons,
            stride: stride.max(1),
            start_ms: now_ms - SPAN_MS,
        }
    }

    /// Batches in the run, the last possibly short.
    pub fn batches(&self) -> u64 {
        self.events.div_ceil(BATCH_EVENTS)
    }

    /// The gzip'd `/batch/` body of batch `b`: events `100 b` to `100 b + 99`.
    pub fn body(&self, b: u64, sent_at_ms: i64) -> Bytes {
        let first = b * BATCH_EVENTS;
        let last = (first + BATCH_EVENTS).min(self.events);
        let events: Vec<Value> = (first..last).map(|i| self.event(i)).collect();
        let sent_at = flagpost::support::clock::format_ms(sent_at_ms);
        let body = json!({"api_key": API_KEY, "batch": events, "sent_at": sent_at});
        let mut gzip = GzEncoder::new(Vec::new(), Compression::fast());
        gzip.write_all(body.to_string().as_bytes())
            .and_then(|()| gzip.finish())
            .map(Bytes::from)
            .expect("gzip into memory cannot fail")
    }

    /// Event `i` of the run.
    fn event(&self, i: u64) -> Value {
        let person = ((i as u128 * self.stride as u128) % self.persons as u128) as u64;
        let k = i / self.persons;
        let at = self.start_ms + (i as u128 * SPAN_MS as u128 / self.events.max(1) as u128) as i64;
        let device = random_uuid(self.start_ms, person * 2);
        // A session of about five events.
        let session = random_uuid(self.start_ms + k as i64 / 5, person * 2 + 1);
        let ids = [random_uuid(at, i), device, session];
        let (user, anonymous) = (user_id(person), anonymous_id(person));
        let step = step(person, k);
        let signed_in = if step == Step::AnonymousView {
            &anonymous
        } else {
            &user
        };
        let mut event = common::pageview_event(person as usize, at, ids, API_KEY);
        event["distinct_id"] = signed_in.as_str().into();
        event["properties"]["distinct_id"] = signed_in.as_str().into();
        let name = match step {
            Step::AnonymousView | Step::View => "$pageview",
            Step::Identify => "$identify",
            Step::Alias => "$create_alias",
            Step::Set => "$set",
        };
        event["event"] = name.into();
        let properties = &mut event["properties"];
        match step {
            Step::AnonymousView | Step::View => {}
            Step::Identify => {
                properties["$anon_distinct_id"] = anonymous.into();
                properties["$set"] = json!({"email": format!("{user}@example.com")});
            }
            Step::Alias => properties["alias"] = format!("alias-{person:07}").into(),
            Step::Set => {
                let plan = ["free", "pro", "enterprise"][person as usize % 3];
                properties["$set"] = json!({ "plan": plan });
            }
        }
        event
    }
}

/// posthog-js flushes its queue in batches of up to 100 events.
pub const BATCH_EVENTS: u64 = 100;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
