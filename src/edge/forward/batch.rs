//! Stored events as PostHog's `/batch/` wants them, and the requests they go in.
//!
//! Each event is written from its block as `{"uuid", "event", "distinct_id",
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
//! A window's events are written once, straight from their blocks' columns, into one
//! buffer ([`Lines`]) with a comma between each two, so the events of a request,
//! which follow each other in the window unless recent and historical ones are mixed,
//! are one slice of it, copied whole into the body: no event is made apart first, nor
//! its properties joined into a block of their own. A request holds one project's
//! events, recent or historical, at most [`MAX_EVENTS`] of them and
//! [`MAX_BODY_BYTES`] of JSON before gzip. The gzip stays flate2's fastest level:
//! libdeflate's compresses page views a fifth tighter but took as much CPU or more
//! (issue 40's fifth round in `benches/HISTORY.md`).

use std::cell::RefCell;
use std::io::Write;
use std::ops::Range;

use flate2::write::GzEncoder;
use uuid::Uuid;

use crate::store::block::Rows;
use crate::support::clock::write_ms;

/// Events per request: PostHog's SDKs send at most a few hundred at a time; a
/// thousand keeps requests few at 100k events/s and well under upstream's limits.
pub const MAX_EVENTS: usize = 1000;
/// Bytes of JSON per request before gzip: PostHog's capture refuses bodies past
/// 20 MB; the margin holds the envelope.
pub const MAX_BODY_BYTES: usize = 20 * 1024 * 1024 - 64 * 1024;
/// A thread's body buffer is kept for its next request up to this size: a thousand
/// page views take about 700 KiB, and a rare 20 MB body is not held for good.
const KEEP_SCRATCH: usize = 4 * 1024 * 1024;

/// One event as forwarded: what identifies it, and where its JSON text is in its
/// [`Lines`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line {
    pub uuid: Uuid,
    /// Unix milliseconds, as stored.
    pub timestamp: i64,
    start: usize,
    end: usize,
}

impl Line {
    /// Bytes of its JSON text.
    pub fn size(&self) -> usize {
        self.end - self.start
    }
}

/// A window's events as forwarded, in order: their JSON texts back to back, a comma
/// between each two, so a run of consecutive events is one slice.
#[derive(Debug, Default)]
pub struct Lines {
    text: Vec<u8>,
    lines: Vec<Line>,
}

impl Lines {
    pub fn new() -> Lines {
        Lines::default()
    }

    pub fn len(&self) -> usize {
        self.lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    pub fn line(&self, i: usize) -> &Line {
        &self.lines[i]
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Line> {
        self.lines.iter()
    }

    /// Event `i`'s JSON text.
    pub fn json(&self, i: usize) -> &[u8] {
        let l = &self.lines[i];
        &self.text[l.start..l.end]
    }

    /// Room for `events` more events, guessed from the size of those so far: a window
    /// of page views grows to megabytes, which doubling would copy about once more.
    pub fn reserve_like(&mut self, events: usize) {
        if let Some(each) = self.text.len().checked_div(self.lines.len()) {
            // A guess: where it is more than memory allows, the buffer grows as needed.
            let bytes = events.saturating_mul(each + 1 + each / 8);
            let _ = self.text.try_reserve(bytes);
            let _ = self.lines.try_reserve(events);
        }
    }

    /// An event whose text is `json`, as is.
    pub fn push(&mut self, uuid: Uuid, timestamp: i64, json: &[u8]) {
        let start = self.start();
        self.text.extend_from_slice(json);
        self.end(uuid, timestamp, start);
    }

    /// Every event of `rows`, in its order, written from its columns.
    pub fn push_rows(&mut self, rows: &Rows) {
        for (i, h) in rows.heads().iter().enumerate() {
            let start = self.start();
            let text = &mut self.text;
            text.extend_from_slice(b"{\"uuid\":\"");
            let mut uuid = [0u8; uuid::fmt::Hyphenated::LENGTH];
            text.extend_from_slice(h.uuid.hyphenated().encode_lower(&mut uuid).as_bytes());
            text.extend_from_slice(b"\",\"event\":");
            push_str(text, rows.event(h));
            text.extend_from_slice(b",\"distinct_id\":");
            push_str(text, rows.distinct_id(h));
            text.extend_from_slice(b",\"timestamp\":\"");
            write_ms(text, h.timestamp);
            text.extend_from_slice(b"\",\"properties\":");
            let at = text.len();
            rows.properties(i, text);
            if text.get(at) != Some(&b'{') {
                // Never stored so; an object keeps the event acceptable upstream.
                text.truncate(at);
                text.extend_from_slice(b"{}");
            }
            text.push(b'}');
            self.end(h.uuid, h.timestamp, start);
        }
    }

    fn start(&mut self) -> usize {
        if !self.lines.is_empty() {
            self.text.push(b',');
        }
        self.text.len()
    }

    fn end(&mut self, uuid: Uuid, timestamp: i64, start: usize) {
        let end = self.text.len();
        self.lines.push(Line {
            uuid,
            timestamp,
            start,
            end,
        });
    }

    /// `events`' texts as a JSON array's inside, added to `out`: one copy for each
    /// run of them that follow each other here.
    fn write_array(&self, events: &[usize], out: &mut Vec<u8>) {
        let mut k = 0;
        while k < events.len() {
            let first = events[k];
            while k + 1 < events.len() && events[k + 1] == events[k] + 1 {
                k += 1;
            }
            if first != events[0] {
                out.push(b',');
            }
            out.extend_from_slice(&self.text[self.lines[first].start..self.lines[events[k]].end]);
            k += 1;
        }
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
pub fn parts(lines: &Lines, cutoff: i64, max_bytes: usize) -> Vec<(Vec<usize>, bool)> {
    let mut out = Vec::new();
    for historical in [false, true] {
        let mut current: Vec<usize> = Vec::new();
        let mut bytes = 0;
        for (i, line) in lines.iter().enumerate() {
            if (line.timestamp < cutoff) != historical {
                continue;
            }
            let size = line.size() + 1;
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

thread_local! {
    /// The JSON of the thread's last body, kept for its next: a fresh buffer of
    /// hundreds of KiB a request is memory the kernel pages in again each time.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The gzip'd `/batch/` body for `events` of `lines`: `{api_key,
/// historical_migration, sent_at, batch}`.
pub fn body(
    api_key: &str,
    historical: bool,
    sent_at_ms: i64,
    lines: &Lines,
    events: &[usize],
) -> Vec<u8> {
    SCRATCH.with_borrow_mut(|json| {
        json.clear();
        json.extend_from_slice(b"{\"api_key\":");
        push_str(json, api_key);
        json.extend_from_slice(b",\"historical_migration\":");
        json.extend_from_slice(if historical { b"true" } else { b"false" });
        json.extend_from_slice(b",\"sent_at\":\"");
        write_ms(json, sent_at_ms);
        json.extend_from_slice(b"\",\"batch\":[");
        lines.write_array(events, json);
        json.extend_from_slice(b"]}");
        let gz = gzip(json);
        if json.capacity() > KEEP_SCRATCH {
            *json = Vec::new();
        }
        gz
    })
}

/// `json` gzip'd at the fastest level: page views shrink eightfold even so (the levels
/// above take twice the CPU or more for a fifth less), and the forwarder must keep up
/// with capture on one core.
fn gzip(json: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(
        Vec::with_capacity(json.len() / 6),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(json);
    gz.finish().unwrap_or_default()
}
