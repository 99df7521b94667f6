//! Edge mode's keys, written into each event at ingest, before the log's fsync, so
//! every copy the edge ever forwards upstream carries the same ones. PostHog's events
//! table collapses copies of an event only when uuid, day, event and distinct id are
//! all equal, so a resend after an unknown outcome must not move any of them:
//! - `uuid`: the client's (in its canonical form), or the one minted here; PostHog's
//!   capture mints a new one per try, so an event sent without one could never be
//!   deduplicated;
//! - `timestamp`: corrected for the client's clock as PostHog corrects it (`now +
//!   timestamp - sent_at`, `offset`, the 23 h clamp), with `properties.$ignore_sent_at
//!   = true` so upstream keeps it as it is however late it arrives, and the client's
//!   `sent_at` kept as `properties.$sent_at`; `offset`, now folded in, is dropped;
//! - `properties.$ip`: the client's address from the trusted-proxy chain when the
//!   event has none or a falsy one (PostHog's `!properties['$ip']`), since one
//!   forwarded batch mixes many clients and no request header can name them all. Not
//!   for a project with `anonymize_ips`: the edge stores and forwards no address then.
//!
//! An event already in the stored form (see `data`) is copied from the body with the
//! replaced entries left out and the fixed ones appended, as [`written`] would write
//! it; the request's `sent_at` and address are formatted once per request
//! ([`Fixer`]). Outside edge mode none of this runs:
//! [`encode_event`](super::encode_event) stores the event as sent.

use serde_json::{Map, Value};
use simd_json::{Node, StaticNode};
use uuid::Uuid;

use super::data;
use super::normalise::{resolve, Context, Encoded};
use super::parse::{Event, IDENTIFY};
use super::tape::{self, Object, Value as TapeValue};
use super::write::{self, Keys, RepeatedKey};
use super::Error;
use crate::support::clock::{format_ms, write_ms};

mod splice;

use splice::Sent;

/// Room for the keys added to an event: a uuid, two times, an address and the names.
const ADDED_BYTES: usize = 192;

/// What fixing the keys of one project's events needs beyond the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fixing {
    /// The project's `anonymize_ips`: no `$ip` is added.
    pub anonymize_ips: bool,
}

/// One request's events with their keys fixed: what every event of the request
/// shares is formatted once.
pub struct Fixer {
    ctx: Context,
    sent_at: Option<String>,
    ip: Option<String>,
    /// The properties' fixed entries and closing brace, as [`appended`] writes them
    /// after no kept entry: without `$ip`, then with the request's (when it has one).
    tails: [Vec<u8>; 2],
}

impl Fixer {
    pub fn new(ctx: &Context, fixing: Fixing) -> Fixer {
        let mut fixer = Fixer {
            ctx: *ctx,
            sent_at: ctx.sent_at.map(format_ms),
            ip: ctx
                .ip
                .filter(|_| !fixing.anonymize_ips)
                .map(|ip| ip.to_string()),
            tails: Default::default(),
        };
        let keys = fixer.keys(Uuid::nil(), 0);
        let mut tails: [Vec<u8>; 2] = Default::default();
        appended(&mut tails[0], true, None, &keys);
        appended(&mut tails[1], true, keys.ip, &keys);
        fixer.tails = tails;
        fixer
    }

    fn keys(&self, uuid: Uuid, timestamp: i64) -> Added<'_> {
        Added {
            uuid,
            timestamp,
            sent_at: self.sent_at.as_deref(),
            ip: self.ip.as_deref(),
        }
    }

    /// [`encode_event`](super::encode_event) with the keys fixed in the stored event.
    pub fn encode(&self, event: Event<'_, '_>) -> Result<Encoded, Error> {
        let ctx = &self.ctx;
        let n = match resolve(event, ctx)? {
            Ok(n) => n,
            Err(reason) => return Ok(Encoded::Drop(reason)),
        };
        let head = n.head(ctx);
        let keys = self.keys(head.uuid, head.timestamp);
        if let Some((sent, origin)) = data::as_sent_at(event) {
            let hint = sent.len() + ADDED_BYTES;
            return Ok(Encoded::Keep(head.encode_with(hint, |out| {
                let start = out.len();
                let bytes = Sent {
                    bytes: sent,
                    origin,
                };
                if self.spliced(out, event.object, bytes, &keys).is_none() {
                    // Bytes not laid out as checked: never seen, written instead.
                    out.truncate(start);
                    write_fixed(out, event, &keys);
                }
            })));
        }
        let hint = event.size_hint + ADDED_BYTES;
        Ok(Encoded::Keep(
            head.encode_with(hint, |out| write_fixed(out, event, &keys)),
        ))
    }
}

/// [`Fixer::encode`] of one event.
pub fn encode_fixed(event: Event<'_, '_>, ctx: &Context, fixing: Fixing) -> Result<Encoded, Error> {
    Fixer::new(ctx, fixing).encode(event)
}

fn write_fixed(out: &mut Vec<u8>, event: Event<'_, '_>, keys: &Added<'_>) {
    let start = out.len();
    if written(out, event, keys).is_err() {
        // A key sent twice somewhere: serde_json keeps one entry of it.
        out.truncate(start);
        via_serde(out, event, keys);
    }
}

/// The keys written into the event.
struct Added<'a> {
    uuid: Uuid,
    /// Unix milliseconds.
    timestamp: i64,
    sent_at: Option<&'a str>,
    ip: Option<&'a str>,
}

/// Top-level keys replaced by the fixed ones.
const REPLACED: [&str; 3] = ["uuid", "timestamp", "offset"];

/// The event from the tape with the keys fixed: its own entries in order (the
/// replaced ones left out, `properties` edited in place), then what it lacked.
fn written(out: &mut Vec<u8>, event: Event<'_, '_>, keys: &Added<'_>) -> Result<(), RepeatedKey> {
    let o = event.object;
    let mut seen = Keys::default();
    let mut first = true;
    let mut comma = |out: &mut Vec<u8>| {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
    };
    let mut has_properties = false;
    out.push(b'{');
    for (i, (key, v)) in o.iter().enumerate() {
        seen.check(o, i, key)?;
        if REPLACED.contains(&key) {
            continue;
        }
        if key == "properties" {
            // `resolve` refused any other type; null is taken as none.
            let Some(props) = v.as_object() else { continue };
            comma(out);
            out.extend_from_slice(br#""properties":"#);
            properties(out, Some(props), keys)?;
            has_properties = true;
            continue;
        }
        comma(out);
        write::string(out, key);
        out.push(b':');
        write::value(out, v)?;
    }
    if !has_properties {
        comma(out);
        out.extend_from_slice(br#""properties":"#);
        properties(out, None, keys)?;
    }
    closing(out, keys, event.implied_identify());
    Ok(())
}

/// The fixed top-level keys after the properties, and the event's closing brace.
fn closing(out: &mut Vec<u8>, keys: &Added<'_>, implied_identify: bool) {
    out.extend_from_slice(br#","uuid":""#);
    out.extend_from_slice(
        keys.uuid
            .hyphenated()
            .encode_lower(&mut Uuid::encode_buffer())
            .as_bytes(),
    );
    out.extend_from_slice(br#"","timestamp":""#);
    write_ms(out, keys.timestamp);
    out.push(b'"');
    if implied_identify {
        out.extend_from_slice(br#","event":"$identify""#);
    }
    out.push(b'}');
}

/// The properties object with `$ip`, `$sent_at` and `$ignore_sent_at` fixed.
fn properties(
    out: &mut Vec<u8>,
    props: Option<Object<'_, '_>>,
    keys: &Added<'_>,
) -> Result<(), RepeatedKey> {
    let ip = added_ip(props, keys);
    let mut seen = Keys::default();
    let mut first = true;
    out.push(b'{');
    for (i, (key, v)) in props.iter().flat_map(|p| p.iter()).enumerate() {
        if let Some(p) = props {
            seen.check(p, i, key)?;
        }
        if replaced(key, ip, keys) {
            continue;
        }
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        write::string(out, key);
        out.push(b':');
        write::value(out, v)?;
    }
    appended(out, first, ip, keys);
    Ok(())
}

/// The address written into the properties: the request's, unless they hold a
/// truthy one.
fn added_ip<'a>(props: Option<Object<'_, '_>>, keys: &Added<'a>) -> Option<&'a str> {
    match props.and_then(|p| p.get("$ip")) {
        Some(v) if !falsy(v) => None,
        _ => keys.ip,
    }
}

/// Whether the properties' own `key` gives way to a fixed one.
fn replaced(key: &str, ip: Option<&str>, keys: &Added<'_>) -> bool {
    match key {
        "$ignore_sent_at" => true,
        "$sent_at" => keys.sent_at.is_some(),
        "$ip" => ip.is_some(),
        _ => false,
    }
}

/// The fixed properties after the kept ones (`first`: none was kept), and the
/// object's closing brace.
fn appended(out: &mut Vec<u8>, mut first: bool, ip: Option<&str>, keys: &Added<'_>) {
    let added = [("$ip", ip), ("$sent_at", keys.sent_at)];
    for (name, value) in added.into_iter().filter_map(|(n, v)| Some((n, v?))) {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        write::string(out, name);
        out.push(b':');
        write::string(out, value);
    }
    if !first {
        out.push(b',');
    }
    out.extend_from_slice(br#""$ignore_sent_at":true}"#);
}

/// JavaScript's falsy values as JSON has them: what PostHog's `!properties['$ip']`
/// replaces.
fn falsy(v: TapeValue<'_, '_>) -> bool {
    match v.node() {
        Node::Static(StaticNode::Null) | Node::Static(StaticNode::Bool(false)) => true,
        Node::Static(StaticNode::I64(n)) => *n == 0,
        Node::Static(StaticNode::U64(n)) => *n == 0,
        Node::Static(StaticNode::F64(f)) => *f == 0.0 || f.is_nan(),
        Node::String(s) => s.is_empty(),
        _ => false,
    }
}

fn falsy_json(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Number(n) => n.as_f64().is_none_or(|f| f == 0.0),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// [`written`] for an event with a repeated key, through a `serde_json` map (the
/// last of a repeated key wins, as everywhere).
fn via_serde(out: &mut Vec<u8>, event: Event<'_, '_>, keys: &Added<'_>) {
    let mut map = match tape::to_serde(TapeValue::from(event.object)) {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    for key in REPLACED {
        map.remove(key);
    }
    let props = map.entry("properties").or_insert(Value::Null);
    if !props.is_object() {
        *props = Value::Object(Map::new());
    }
    if let Value::Object(props) = props {
        if let Some(ip) = keys.ip {
            if props.get("$ip").is_none_or(falsy_json) {
                props.insert("$ip".into(), Value::String(ip.into()));
            }
        }
        if let Some(sent_at) = keys.sent_at {
            props.insert("$sent_at".into(), Value::String(sent_at.into()));
        }
        props.insert("$ignore_sent_at".into(), Value::Bool(true));
    }
    map.insert("uuid".into(), Value::String(keys.uuid.to_string()));
    map.insert("timestamp".into(), Value::String(format_ms(keys.timestamp)));
    if event.implied_identify() {
        map.insert("event".into(), Value::String(IDENTIFY.into()));
    }
    // Writing a map of strings into a Vec cannot fail.
    let _ = serde_json::to_writer(out, &map);
}

#[cfg(test)]
#[path = "tests/fixed.rs"]
mod tests;
