//! A block read one event at a time: decompressed and checked whole, the events'
//! headers (times, uuids, persons, names and distinct ids) read in place, but each
//! event's properties made only when asked for. A person's events need one or two
//! events of each block they read; making every event's properties (version 3 joins
//! them back from a dozen packed values each) was most of the cost of such a read.
//! [`Block`](super::Block) holds one of these with every event's properties made.
//!
//! A block is refused here for exactly what would have made any of its events
//! unreadable, so a damaged block is skipped whole whichever way it is read.

use serde_json::{Map, Value};

use super::pack::unpack;
use super::props::Props;
use super::{body, columns, count, decode_rows, files, range, Head, HEADER_LEN, ROWS};
use super::{BY_KEY, MAX_DECODED_BYTES, PREFIX_LEN, VERSION};
use crate::store::event::StoredEvent;

/// A decoded block whose properties are made on demand.
#[derive(Debug)]
pub struct Rows {
    /// The decompressed body, as stored.
    body: Vec<u8>,
    /// Names and distinct ids point into `body`; `properties` as [`Props`] says.
    heads: Vec<Head>,
    props: Props,
}

impl Rows {
    /// None if the value is damaged in any way: one bad block must not break reads.
    pub fn decode(value: &[u8]) -> Option<Rows> {
        if value.first() == Some(&files::TAG) {
            return None;
        }
        let count = count(value)? as usize;
        let compressed = value.get(PREFIX_LEN..)?;
        let size = u32::from_le_bytes(compressed.get(..4)?.try_into().ok()?) as usize;
        // Every event needs at least its fixed fields.
        let least = match value[0] {
            ROWS => HEADER_LEN,
            VERSION => body::LEAST,
            _ => columns::FIXED,
        };
        if size > MAX_DECODED_BYTES || count > size / least {
            return None;
        }
        let mut body = lz4_flex::decompress_size_prepended(compressed).ok()?;
        let (heads, props) = match value[0] {
            ROWS => (decode_rows(&body, count)?, Props::Plain),
            VERSION => {
                let (heads, props, texts) = body::parse(&body, count)?;
                body.extend_from_slice(&texts);
                (heads, props)
            }
            version => columns::parse(&body, count, version == BY_KEY)?,
        };
        // Names and ids are checked once here, so reading them later cannot fail.
        for h in &heads {
            std::str::from_utf8(body.get(range(h.event))?).ok()?;
            std::str::from_utf8(body.get(range(h.distinct_id))?).ok()?;
            body.get(range(h.properties))?;
        }
        Some(Rows { body, heads, props })
    }

    /// About the bytes it holds in memory.
    pub fn weight(&self) -> usize {
        let layout = match &self.props {
            Props::ByKey(layout) => layout.weight(),
            _ => 0,
        };
        self.body.capacity() + self.heads.capacity() * std::mem::size_of::<Head>() + layout
    }

    /// The events' headers, oldest first.
    pub fn heads(&self) -> &[Head] {
        &self.heads
    }

    pub fn event(&self, h: &Head) -> &str {
        self.text(h.event)
    }

    pub fn distinct_id(&self, h: &Head) -> &str {
        self.text(h.distinct_id)
    }

    fn text(&self, r: (u32, u32)) -> &str {
        std::str::from_utf8(self.bytes(r)).unwrap_or_default()
    }

    /// The body's bytes in `r`, a range of a head (checked by [`Rows::decode`]).
    pub(super) fn bytes(&self, r: (u32, u32)) -> &[u8] {
        &self.body[range(r)]
    }

    /// The body and, for the layouts that split properties by key, where they are.
    pub(super) fn by_key(&self) -> Option<(&[u8], &super::props::Layout)> {
        match &self.props {
            Props::ByKey(layout) => Some((&self.body, layout)),
            _ => None,
        }
    }

    /// Event `i`'s properties as stored (compact JSON text), added to `out`.
    pub fn properties(&self, i: usize, out: &mut Vec<u8>) {
        let Some(h) = self.heads.get(i) else {
            return;
        };
        // The checks of [`Rows::decode`] leave nothing here that can fail.
        match &self.props {
            Props::Plain => out.extend_from_slice(&self.body[range(h.properties)]),
            Props::Packed => {
                let _ = unpack(&self.body[range(h.properties)], out);
            }
            Props::ByKey(layout) => {
                let distinct = &self.body[range(h.distinct_id)];
                let _ = layout.write(&self.body, i, distinct, out);
            }
        }
    }

    /// Event `i` whole; properties that do not parse read as none.
    pub fn stored(&self, i: usize) -> Option<StoredEvent> {
        let h = self.heads.get(i)?;
        let mut json = Vec::new();
        self.properties(i, &mut json);
        let properties = match serde_json::from_slice(&json) {
            Ok(Value::Object(p)) => p,
            _ => Map::new(),
        };
        Some(StoredEvent {
            uuid: h.uuid,
            event: self.event(h).to_owned(),
            distinct_id: self.distinct_id(h).to_owned(),
            properties,
            timestamp: h.timestamp,
            created_at: h.created_at,
            person_id: h.person_id,
        })
    }

    /// Every event made whole: each one's name, distinct id and properties back to
    /// back, the heads pointing there.
    pub(super) fn into_block(self) -> Option<super::Block> {
        if let Props::Plain = self.props {
            return Some(super::Block { rows: self });
        }
        let mut out = Vec::with_capacity(self.body.len() * 2);
        let mut heads = Vec::with_capacity(self.heads.len());
        for (i, h) in self.heads.iter().enumerate() {
            let event = append(&mut out, &self.body[range(h.event)])?;
            let distinct_id = append(&mut out, &self.body[range(h.distinct_id)])?;
            let start = u32::try_from(out.len()).ok()?;
            self.properties(i, &mut out);
            heads.push(Head {
                event,
                distinct_id,
                properties: (start, u32::try_from(out.len()).ok()?),
                ..h.clone()
            });
        }
        let rows = Rows {
            body: out,
            heads,
            props: Props::Plain,
        };
        Some(super::Block { rows })
    }
}

/// `bytes` added to `out`; where they are.
fn append(out: &mut Vec<u8>, bytes: &[u8]) -> Option<(u32, u32)> {
    let start = u32::try_from(out.len()).ok()?;
    out.extend_from_slice(bytes);
    Some((start, u32::try_from(out.len()).ok()?))
}
