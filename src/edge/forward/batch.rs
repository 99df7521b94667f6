//! Stored events as PostHog's `/batch/` wants them, and the requests they go in.
//!
//! Each event is rebuilt from its block as `{"uuid", "event", "distinct_id",
//! "timestamp", "properties"}`: the properties exactly as stored, which already hold
//! what PostHog reads elsewhere too (the compactor keeps top-level `$set`,
//! `$set_once` and `$unset` as properties, where PostHog's ingestion merges them),
//! and the timestamp as the edge corrected it. The text depends only on the stored
//! block, so every resend of an event carries the same bytes; only a request's
//! `sent_at` changes.
//!
//! What the edge's own GeoIP database added (`$geoip_*`, and in `$set`/`$set_once`)
//! goes as stored: it cannot be told apart from values a client sent itself, and
//! PostHog's GeoIP transformation looks `$ip` up again and overwrites the `$geoip_*`
//! keys it finds, so upstream's enrichment wins wherever it has an answer.
//!
//! A request holds one project's events, recent or historical, at most
//! [`MAX_EVENTS`] of them and [`MAX_BODY_BYTES`] of JSON before gzip.

use std::io::Write;
use std::ops::Range;

use flate2::write::GzEncoder;
use uuid::Uuid;

use crate::store::block::Block;
use crate::support::clock::{format_ms, write_ms};

/// Events per request: PostHog's SDKs send at most a few hundred at a time; a
/// thousand keeps requests few at 100k events/s and well under upstream's limits.
pub const MAX_EVENTS: usize = 1000;
/// Bytes of JSON per request before gzip: PostHog's capture refuses bodies past
/// 20 MB; the margin holds the envelope.
pub const MAX_BODY_BYTES: usize = 20 * 1024 * 1024 - 64 * 1024;

/// One event as forwarded: its JSON text and what identifies it.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub uuid: Uuid,
    /// Unix milliseconds, as stored.
    pub timestamp: i64,
    pub json: Vec<u8>,
}

/// Every event of `block`, in its order.
pub fn lines(block: &Block, out: &mut Vec<Line>) {
    for h in block.heads() {
        let properties = block.properties(h);
        let (event, distinct_id) = (block.event(h), block.distinct_id(h));
        // The envelope's keys, the uuid and the time take about 120 bytes; the two
        // strings grow only when escaped. One allocation an event, as a drain makes
        // a hundred thousand of them a second.
        let size = properties.len() + event.len() + distinct_id.len() + 128;
        let mut json = Vec::with_capacity(size);
        json.extend_from_slice(b"{\"uuid\":\"");
        let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
        json.extend_from_slice(h.uuid.hyphenated().encode_lower(&mut text).as_bytes());
        json.extend_from_slice(b"\",\"event\":");
        push_str(&mut json, event);
        json.extend_from_slice(b",\"distinct_id\":");
        push_str(&mut json, distinct_id);
        json.extend_from_slice(b",\"timestamp\":\"");
        write_ms(&mut json, h.timestamp);
        json.extend_from_slice(b"\",\"properties\":");
        match properties.first() {
            Some(b'{') => json.extend_from_slice(properties),
            // Never stored so; an object keeps the event acceptable upstream.
            _ => json.extend_from_slice(b"{}"),
        }
        json.push(b'}');
        out.push(Line {
            uuid: h.uuid,
            timestamp: h.timestamp,
            json,
        });
    }
}

fn push_str(out: &mut Vec<u8>, s: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// A window's events split into requests: recent ones (at or after `cutoff`) first,
/// then historical ones, each run cut at [`MAX_EVENTS`] and `max_bytes`. Returns
/// each request's events (indices into `lines`, in order) and whether it is
/// historical. The same lines and cutoff always give the same requests.
pub fn parts(lines: &[Line], cutoff: i64, max_bytes: usize) -> Vec<(Vec<usize>, bool)> {
    let mut out = Vec::new();
    for historical in [false, true] {
        let mut current: Vec<usize> = Vec::new();
        let mut bytes = 0;
        for (i, line) in lines.iter().enumerate() {
            if (line.timestamp < cutoff) != historical {
                continue;
            }
            let size = line.json.len() + 1;
            if !current.is_empty() && (current.len() >= MAX_EVENTS || bytes + size > max_bytes) {
                out.push((std::mem::take(&mut current), historical));
                bytes = 0;
            }
            current.push(i);
            bytes += size;
        }
        if !current.is_empty() {
            out.push((current, historical));
        }
    }
    out
}

/// The halves a refused or too large run of events is tried again in.
pub fn halves(run: Range<usize>) -> [Range<usize>; 2] {
    let mid = run.start + run.len() / 2;
    [run.start..mid, mid..run.end]
}

/// The gzip'd `/batch/` body for `events`: `{api_key, historical_migration, sent_at,
/// batch}`.
pub fn body<'a>(
    api_key: &str,
    historical: bool,
    sent_at_ms: i64,
    events: impl Iterator<Item = &'a [u8]> + Clone,
) -> Vec<u8> {
    // Sized once: a 1000-event body of page views is about 650 KiB, which growing by
    // doubling from a guess copied once more in all.
    let size = events.clone().map(|e| e.len() + 1).sum::<usize>() + api_key.len() + 128;
    let mut json = Vec::with_capacity(size);
    json.extend_from_slice(b"{\"api_key\":");
    push_str(&mut json, api_key);
    json.extend_from_slice(b",\"historical_migration\":");
    json.extend_from_slice(if historical { b"true" } else { b"false" });
    json.extend_from_slice(b",\"sent_at\":\"");
    json.extend_from_slice(format_ms(sent_at_ms).as_bytes());
    json.extend_from_slice(b"\",\"batch\":[");
    for (i, e) in events.enumerate() {
        if i > 0 {
            json.push(b',');
        }
        json.extend_from_slice(e);
    }
    json.extend_from_slice(b"]}");
    // Fast compression: JSON events shrink about tenfold even so, and the forwarder
    // must keep up with capture on one core.
    let mut gz = GzEncoder::new(
        Vec::with_capacity(json.len() / 4),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(&json);
    gz.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::block::{build, Entry};
    use std::io::Read;

    fn line(ts: i64, size: usize) -> Line {
        Line {
            uuid: Uuid::nil(),
            timestamp: ts,
            json: vec![b'x'; size],
        }
    }

    #[test]
    fn events_as_posthog_batch_reads_them_byte_for_byte_again() {
        let entry = Entry {
            timestamp: 1_700_000_000_123,
            created_at: 1_700_000_000_500,
            uuid: Uuid::from_u128(7),
            person_id: None,
            event: "say \"hi\"".into(),
            distinct_id: "d1".into(),
            properties: br#"{"$set":{"a":1},"$ignore_sent_at":true,"$ip":"1.2.3.4"}"#.to_vec(),
        };
        let blocks = build(vec![entry.clone()]);
        let block = Block::decode(&blocks[0].1).unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        lines(&block, &mut a);
        lines(&block, &mut b);
        assert_eq!(a, b, "the same stored event, the same bytes");
        let v: serde_json::Value = serde_json::from_slice(&a[0].json).unwrap();
        assert_eq!(v["uuid"], "00000000-0000-0000-0000-000000000007");
        assert_eq!(v["event"], "say \"hi\"");
        assert_eq!(v["distinct_id"], "d1");
        assert_eq!(v["timestamp"], "2023-11-14T22:13:20.123Z");
        assert_eq!(v["properties"]["$set"]["a"], 1);
        assert_eq!(v["properties"]["$ip"], "1.2.3.4");

        let gz = body("phc_k", true, 0, a.iter().map(|l| l.json.as_slice()));
        let mut text = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut text)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["api_key"], "phc_k");
        assert_eq!(v["historical_migration"], true);
        assert_eq!(v["sent_at"], "1970-01-01T00:00:00.000Z");
        assert_eq!(
            v["batch"][0]["uuid"],
            "00000000-0000-0000-0000-000000000007"
        );
    }

    #[test]
    fn requests_split_recent_from_historical_and_by_count_and_size() {
        // 0, 2 and 4 are old; the rest recent.
        let lines: Vec<Line> = (0..6)
            .map(|i| line(if i % 2 == 0 { 5 } else { 50 }, 9))
            .collect();
        assert_eq!(
            parts(&lines, 10, 1000),
            vec![(vec![1, 3, 5], false), (vec![0, 2, 4], true)]
        );
        // 10 bytes a line: two fit in 25 bytes.
        assert_eq!(
            parts(&lines, 0, 25),
            vec![
                (vec![0, 1], false),
                (vec![2, 3], false),
                (vec![4, 5], false)
            ]
        );
        // A line larger than the limit goes alone.
        let big = vec![line(50, 9), line(50, 100), line(50, 9)];
        assert_eq!(
            parts(&big, 0, 25),
            vec![(vec![0], false), (vec![1], false), (vec![2], false)]
        );
        let many: Vec<Line> = (0..MAX_EVENTS * 2 + 1).map(|_| line(50, 1)).collect();
        let cut = parts(&many, 0, usize::MAX);
        assert_eq!(
            cut.iter().map(|(p, _)| p.len()).collect::<Vec<_>>(),
            [MAX_EVENTS, MAX_EVENTS, 1]
        );
        assert!(parts(&[], 0, 10).is_empty());
    }

    #[test]
    fn halves_cover_the_run() {
        assert_eq!(halves(0..5), [0..2, 2..5]);
        assert_eq!(halves(3..5), [3..4, 4..5]);
    }
}
