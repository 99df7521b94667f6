//! A stored event: what the compactor writes to the `events` tree and the read API
//! returns, kept compact with LZ4.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use crate::support::clock::format_ms;

/// A stored value never decompresses to more than this; anything claiming more is
/// damaged, and refusing it avoids a huge allocation.
const MAX_DECODED_BYTES: usize = 256 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredEvent {
    pub uuid: Uuid,
    pub event: String,
    pub distinct_id: String,
    pub properties: Map<String, Value>,
    /// Unix milliseconds, after clock-skew correction.
    pub timestamp: i64,
    /// Unix milliseconds when the server received it.
    pub created_at: i64,
    pub person_id: Option<Uuid>,
}

impl StoredEvent {
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).unwrap_or_default();
        lz4_flex::compress_prepend_size(&json)
    }

    pub fn decode(bytes: &[u8]) -> Option<StoredEvent> {
        let json = decompress(bytes)?;
        serde_json::from_slice(&json).ok()
    }

    /// The read API's shape, like PostHog's events API.
    pub fn to_api(&self) -> Value {
        json!({
            "id": self.uuid,
            "event": self.event,
            "distinct_id": self.distinct_id,
            "properties": self.properties,
            "timestamp": format_ms(self.timestamp),
            "created_at": format_ms(self.created_at),
            "person_id": self.person_id,
        })
    }
}

/// LZ4 with a size prefix, checked against a bound before allocating.
fn decompress(bytes: &[u8]) -> Option<Vec<u8>> {
    let size = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    if size > MAX_DECODED_BYTES {
        return None;
    }
    lz4_flex::decompress_size_prepended(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let e = StoredEvent {
            uuid: Uuid::now_v7(),
            event: "$pageview".into(),
            distinct_id: "d".into(),
            properties: json!({"$current_url": "https://x/", "n": [1, 2]})
                .as_object()
                .unwrap()
                .clone(),
            timestamp: 1_700_000_000_000,
            created_at: 1_700_000_000_005,
            person_id: Some(Uuid::now_v7()),
        };
        let bytes = e.encode();
        assert_eq!(StoredEvent::decode(&bytes), Some(e.clone()));
        assert_eq!(StoredEvent::decode(&bytes[..bytes.len() / 2]), None);
        assert_eq!(StoredEvent::decode(&[0xff, 0xff, 0xff, 0x7f, 1, 2]), None);
        assert_eq!(e.to_api()["timestamp"], "2023-11-14T22:13:20.000Z");
    }
}
