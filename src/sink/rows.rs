//! One row of each table as the sink sends it, and its RowBinary encoding in the
//! column order [`super::schema`] lists for the server's [`Shape`]. Rows borrow what
//! they can: a batch of events is encoded straight from the stored blocks.

use uuid::Uuid;

use super::rowbinary::RowBinary;
use super::version::Shape;

/// Sub-second digits of `DateTime64` columns holding event times (PostHog's).
const EVENT_TIME_PRECISION: u32 = 6;
/// Sub-second digits of `DateTime64` columns holding persons' and groups' times.
const ENTITY_TIME_PRECISION: u32 = 3;

/// Where a row came from in the sink's outbox: the Unix milliseconds the compactor
/// committed it and the outbox position. Written to `_timestamp` and `_offset`, and
/// the same however often the row is re-sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    pub committed_ms: i64,
    pub offset: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EventRow<'a> {
    pub uuid: Uuid,
    pub event: &'a str,
    /// The properties as JSON text (compact, as the old servers' `visitParam*`
    /// functions need).
    pub properties: &'a [u8],
    /// Unix milliseconds.
    pub timestamp: i64,
    pub team_id: i64,
    pub distinct_id: &'a str,
    pub elements_chain: &'a str,
    /// Unix milliseconds.
    pub created_at: i64,
    /// The nil uuid when the event has no person (`$process_person_profile: false`).
    pub person_id: Uuid,
    /// The `$group_0..4` keys; empty where the event names no group of that type.
    pub groups: [&'a str; 5],
    pub origin: Origin,
}

impl EventRow<'_> {
    pub fn encode(&self, shape: Shape, out: &mut RowBinary) {
        out.uuid(self.uuid);
        out.str(self.event);
        out.string(self.properties);
        time(out, shape, self.timestamp, EVENT_TIME_PRECISION);
        out.i64(self.team_id);
        out.str(self.distinct_id);
        out.str(self.elements_chain);
        time(out, shape, self.created_at, EVENT_TIME_PRECISION);
        out.uuid(self.person_id);
        for key in self.groups {
            out.str(key);
        }
        if shape == Shape::Narrow {
            out.i64(self.timestamp);
            out.i64(self.created_at);
        }
        origin(out, self.origin);
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PersonRow<'a> {
    pub id: Uuid,
    /// Unix milliseconds.
    pub created_at: i64,
    pub team_id: i64,
    pub properties: &'a [u8],
    pub is_identified: bool,
    /// A person merged into another is sent once more, deleted, at a higher version.
    pub is_deleted: bool,
    pub version: u64,
    pub origin: Origin,
}

impl PersonRow<'_> {
    pub fn encode(&self, shape: Shape, out: &mut RowBinary) {
        out.uuid(self.id);
        time(out, shape, self.created_at, ENTITY_TIME_PRECISION);
        out.i64(self.team_id);
        out.string(self.properties);
        out.i8(self.is_identified as i8);
        out.i8(self.is_deleted as i8);
        out.u64(self.version);
        origin(out, self.origin);
    }
}

/// A distinct id's link to its person (`person_distinct_id2`).
#[derive(Debug, Clone, PartialEq)]
pub struct DistinctIdRow<'a> {
    pub team_id: i64,
    pub distinct_id: &'a str,
    pub person_id: Uuid,
    pub is_deleted: bool,
    pub version: u64,
    pub origin: Origin,
}

impl DistinctIdRow<'_> {
    pub fn encode(&self, _shape: Shape, out: &mut RowBinary) {
        out.i64(self.team_id);
        out.str(self.distinct_id);
        out.uuid(self.person_id);
        out.i8(self.is_deleted as i8);
        out.u64(self.version);
        origin(out, self.origin);
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct GroupRow<'a> {
    pub group_type_index: u8,
    pub group_key: &'a str,
    /// Unix milliseconds.
    pub created_at: i64,
    pub team_id: i64,
    pub group_properties: &'a [u8],
    pub origin: Origin,
}

impl GroupRow<'_> {
    pub fn encode(&self, shape: Shape, out: &mut RowBinary) {
        out.u8(self.group_type_index);
        out.str(self.group_key);
        time(out, shape, self.created_at, ENTITY_TIME_PRECISION);
        out.i64(self.team_id);
        out.string(self.group_properties);
        origin(out, self.origin);
    }
}

fn time(out: &mut RowBinary, shape: Shape, ms: i64, precision: u32) {
    match shape {
        Shape::Current => out.datetime64_ms(ms, precision),
        Shape::Narrow => out.datetime_ms(ms),
    }
}

fn origin(out: &mut RowBinary, origin: Origin) {
    out.datetime_ms(origin.committed_ms);
    out.u64(origin.offset);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_row_byte_for_byte() {
        let row = DistinctIdRow {
            team_id: 2,
            distinct_id: "ab",
            person_id: Uuid::from_u128(0x0102030405060708_090a0b0c0d0e0f10),
            is_deleted: true,
            version: 7,
            origin: Origin {
                committed_ms: 1000,
                offset: 9,
            },
        };
        let mut out = RowBinary::default();
        row.encode(Shape::Narrow, &mut out);
        let mut want = vec![2, 0, 0, 0, 0, 0, 0, 0, 2, b'a', b'b'];
        want.extend_from_slice(&[
            8, 7, 6, 5, 4, 3, 2, 1, 0x10, 0xf, 0xe, 0xd, 0xc, 0xb, 0xa, 9,
        ]);
        want.extend_from_slice(&[
            1, 7, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0,
        ]);
        assert_eq!(out.as_bytes(), want);
    }

    #[test]
    fn narrow_events_carry_the_exact_instants_too() {
        let row = EventRow {
            uuid: Uuid::nil(),
            event: "e",
            properties: b"{}",
            timestamp: 1_500,
            team_id: 1,
            distinct_id: "d",
            elements_chain: "",
            created_at: 2_250,
            person_id: Uuid::nil(),
            groups: [""; 5],
            origin: Origin {
                committed_ms: 0,
                offset: 0,
            },
        };
        let (mut narrow, mut current) = (RowBinary::default(), RowBinary::default());
        row.encode(Shape::Narrow, &mut narrow);
        row.encode(Shape::Current, &mut current);
        // Narrow: two u32 times instead of two i64, plus two i64 exact instants.
        assert_eq!(narrow.len(), current.len() - 8 + 16);
        let tail = &narrow.as_bytes()[narrow.len() - 12 - 16..narrow.len() - 12];
        assert_eq!(&tail[..8], 1_500i64.to_le_bytes());
        assert_eq!(&tail[8..], 2_250i64.to_le_bytes());
    }
}
