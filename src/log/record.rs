//! The write-ahead log's record: one accepted event with everything later processing
//! needs, in a small versioned binary layout. Capture has already validated and
//! normalised the event, so the compactor never has to re-derive (and could never
//! re-derive identically after a crash) the uuid or the skew-corrected time.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use uuid::Uuid;

const VERSION: u8 = 1;
const FLAG_HISTORICAL: u8 = 1;
const NO_SENT_AT: i64 = i64::MIN;
/// version, flags, project, received_at, timestamp, sent_at, uuid, ip tag, three lengths.
const FIXED_LEN: usize = 1 + 1 + 8 + 8 + 8 + 8 + 16 + 1 + 4 + 4 + 4;

#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub project: u64,
    /// Server time the request arrived, unix milliseconds.
    pub received_at: i64,
    /// The event's time after clock-skew correction, unix milliseconds.
    pub timestamp: i64,
    /// The client's `sent_at` (batch field or `_` query parameter), unix milliseconds.
    pub sent_at: Option<i64>,
    pub uuid: Uuid,
    /// From a batch sent with `historical_migration: true`.
    pub historical: bool,
    /// The client address, for `$ip` and GeoIP.
    pub ip: Option<IpAddr>,
    pub event: String,
    pub distinct_id: String,
    /// The event object exactly as the client sent it (JSON).
    pub data: Vec<u8>,
}

/// A record that does not decode: the log is damaged at this key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt;

impl std::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("corrupt write-ahead log record")
    }
}

impl std::error::Error for Corrupt {}

/// A record without its data, borrowed: what capture knows about an event before it
/// writes the event's JSON straight into the encoded record.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    pub project: u64,
    pub received_at: i64,
    pub timestamp: i64,
    pub sent_at: Option<i64>,
    pub uuid: Uuid,
    pub historical: bool,
    pub ip: Option<IpAddr>,
    pub event: &'a str,
    pub distinct_id: &'a str,
}

impl Head<'_> {
    /// The encoded record whose data `write` appends (about `data_len` bytes), in
    /// the same buffer as the rest: no copy of the data, no second allocation.
    pub fn encode_with(&self, data_len: usize, write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let ip_len = match self.ip {
            None => 0,
            Some(IpAddr::V4(_)) => 4,
            Some(IpAddr::V6(_)) => 16,
        };
        let mut out = Vec::with_capacity(
            FIXED_LEN + ip_len + self.event.len() + self.distinct_id.len() + data_len,
        );
        out.push(VERSION);
        out.push(if self.historical { FLAG_HISTORICAL } else { 0 });
        out.extend_from_slice(&self.project.to_le_bytes());
        out.extend_from_slice(&self.received_at.to_le_bytes());
        out.extend_from_slice(&self.timestamp.to_le_bytes());
        out.extend_from_slice(&self.sent_at.unwrap_or(NO_SENT_AT).to_le_bytes());
        out.extend_from_slice(self.uuid.as_bytes());
        out.push(ip_len as u8);
        match self.ip {
            None => {}
            Some(IpAddr::V4(v4)) => out.extend_from_slice(&v4.octets()),
            Some(IpAddr::V6(v6)) => out.extend_from_slice(&v6.octets()),
        }
        out.extend_from_slice(&(self.event.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.distinct_id.len() as u32).to_le_bytes());
        // The data's length, filled in once it is written.
        let data_len_at = out.len();
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(self.event.as_bytes());
        out.extend_from_slice(self.distinct_id.as_bytes());
        let data_at = out.len();
        write(&mut out);
        let written = (out.len() - data_at) as u32;
        out[data_len_at..data_len_at + 4].copy_from_slice(&written.to_le_bytes());
        out
    }
}

impl Record {
    pub fn head(&self) -> Head<'_> {
        Head {
            project: self.project,
            received_at: self.received_at,
            timestamp: self.timestamp,
            sent_at: self.sent_at,
            uuid: self.uuid,
            historical: self.historical,
            ip: self.ip,
            event: &self.event,
            distinct_id: &self.distinct_id,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        self.head()
            .encode_with(self.data.len(), |out| out.extend_from_slice(&self.data))
    }

    pub fn decode(bytes: &[u8]) -> Result<Record, Corrupt> {
        let mut r = Reader(bytes);
        if r.take(1)?[0] != VERSION {
            return Err(Corrupt);
        }
        let flags = r.take(1)?[0];
        let project = u64::from_le_bytes(r.array()?);
        let received_at = i64::from_le_bytes(r.array()?);
        let timestamp = i64::from_le_bytes(r.array()?);
        let sent_at = Some(i64::from_le_bytes(r.array()?)).filter(|&t| t != NO_SENT_AT);
        let uuid = Uuid::from_bytes(r.array()?);
        let ip = match r.take(1)?[0] {
            0 => None,
            4 => Some(IpAddr::V4(Ipv4Addr::from(r.array::<4>()?))),
            16 => Some(IpAddr::V6(Ipv6Addr::from(r.array::<16>()?))),
            _ => return Err(Corrupt),
        };
        let event_len = u32::from_le_bytes(r.array()?) as usize;
        let id_len = u32::from_le_bytes(r.array()?) as usize;
        let data_len = u32::from_le_bytes(r.array()?) as usize;
        let event = String::from_utf8(r.take(event_len)?.to_vec()).map_err(|_| Corrupt)?;
        let distinct_id = String::from_utf8(r.take(id_len)?.to_vec()).map_err(|_| Corrupt)?;
        let data = r.take(data_len)?.to_vec();
        if !r.0.is_empty() {
            return Err(Corrupt);
        }
        Ok(Record {
            project,
            received_at,
            timestamp,
            sent_at,
            uuid,
            historical: flags & FLAG_HISTORICAL != 0,
            ip,
            event,
            distinct_id,
            data,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Corrupt> {
        if self.0.len() < n {
            return Err(Corrupt);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Corrupt> {
        self.take(N)?.try_into().map_err(|_| Corrupt)
    }
}

/// A log entry holds the records of one group commit (or part of it): far fewer
/// sled operations than one entry per record, for the writer and the compactor alike.
const FRAME_VERSION: u8 = 2;

/// Concatenate encoded records into one log entry: version, count, then each record
/// with its length.
pub fn encode_frame<'a>(records: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = vec![FRAME_VERSION, 0, 0, 0, 0];
    let mut count = 0u32;
    for record in records {
        out.extend_from_slice(&(record.len() as u32).to_le_bytes());
        out.extend_from_slice(record);
        count += 1;
    }
    out[1..5].copy_from_slice(&count.to_le_bytes());
    out
}

/// How many records a log entry says it holds, without decoding them.
pub fn frame_len(bytes: &[u8]) -> Option<usize> {
    match bytes {
        [FRAME_VERSION, a, b, c, d, ..] => Some(u32::from_le_bytes([*a, *b, *c, *d]) as usize),
        _ => None,
    }
}

/// The records of a log entry, in order.
pub fn decode_frame(bytes: &[u8]) -> Result<Vec<&[u8]>, Corrupt> {
    let mut r = Reader(bytes);
    if r.take(1)?[0] != FRAME_VERSION {
        return Err(Corrupt);
    }
    let count = u32::from_le_bytes(r.array()?) as usize;
    // Each record needs at least its length; a count beyond that is damage.
    if count > bytes.len() / 4 {
        return Err(Corrupt);
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let len = u32::from_le_bytes(r.array()?) as usize;
        out.push(r.take(len)?);
    }
    if !r.0.is_empty() {
        return Err(Corrupt);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_reject_damage() {
        let records: Vec<Vec<u8>> = vec![b"one".to_vec(), Vec::new(), sample().encode()];
        let frame = encode_frame(records.iter().map(Vec::as_slice));
        let back = decode_frame(&frame).unwrap();
        assert_eq!(back, records.iter().map(Vec::as_slice).collect::<Vec<_>>());
        for n in 0..frame.len() {
            assert_eq!(decode_frame(&frame[..n]), Err(Corrupt), "prefix {n}");
        }
        let mut longer = frame.clone();
        longer.push(1);
        assert_eq!(decode_frame(&longer), Err(Corrupt));
        assert_eq!(
            decode_frame(&[FRAME_VERSION, 0xff, 0xff, 0xff, 0xff]),
            Err(Corrupt)
        );
        assert_eq!(
            decode_frame(&encode_frame([])).unwrap(),
            Vec::<&[u8]>::new()
        );
    }

    fn sample() -> Record {
        Record {
            project: 7,
            received_at: 1_700_000_000_123,
            timestamp: 1_700_000_000_000,
            sent_at: Some(1_700_000_000_100),
            uuid: Uuid::from_u128(0x0192_0000_0000_7000_8000_0000_0000_0001),
            historical: true,
            ip: Some("2001:db8::1".parse().unwrap()),
            event: "$pageview".into(),
            distinct_id: "user-ü".into(),
            data: br#"{"event":"$pageview"}"#.to_vec(),
        }
    }

    #[test]
    fn round_trips() {
        let r = sample();
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        let plain = Record {
            ip: Some("10.1.2.3".parse().unwrap()),
            sent_at: None,
            historical: false,
            ..sample()
        };
        assert_eq!(Record::decode(&plain.encode()).unwrap(), plain);
        let no_ip = Record {
            ip: None,
            ..sample()
        };
        assert_eq!(Record::decode(&no_ip.encode()).unwrap(), no_ip);
    }

    /// The layout, byte for byte, so that a change to how records are written cannot
    /// change what is written.
    #[test]
    fn encoded_layout() {
        let r = Record {
            ip: Some("10.1.2.3".parse().unwrap()),
            ..sample()
        };
        let mut want = vec![VERSION, FLAG_HISTORICAL];
        want.extend_from_slice(&7u64.to_le_bytes());
        want.extend_from_slice(&1_700_000_000_123i64.to_le_bytes());
        want.extend_from_slice(&1_700_000_000_000i64.to_le_bytes());
        want.extend_from_slice(&1_700_000_000_100i64.to_le_bytes());
        want.extend_from_slice(r.uuid.as_bytes());
        want.extend_from_slice(&[4, 10, 1, 2, 3]);
        want.extend_from_slice(&9u32.to_le_bytes());
        want.extend_from_slice(&7u32.to_le_bytes());
        want.extend_from_slice(&21u32.to_le_bytes());
        want.extend_from_slice(b"$pageview");
        want.extend_from_slice("user-ü".as_bytes());
        want.extend_from_slice(br#"{"event":"$pageview"}"#);
        assert_eq!(r.encode(), want);
        let written = r
            .head()
            .encode_with(0, |out| out.extend_from_slice(&r.data));
        assert_eq!(written, want);
    }

    #[test]
    fn every_truncation_and_trailing_garbage_is_corrupt() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            assert_eq!(Record::decode(&bytes[..n]), Err(Corrupt), "prefix {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Record::decode(&longer), Err(Corrupt));
        let mut wrong_version = bytes;
        wrong_version[0] = 9;
        assert_eq!(Record::decode(&wrong_version), Err(Corrupt));
    }
}
