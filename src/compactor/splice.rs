//! Applying a record whose event JSON is canonical (see [`raw`]) without turning it into
//! a `serde_json::Value`: the properties stay text, member by member, and only what the
//! compactor adds or changes is written (GeoIP properties, the top-level person
//! operations, `$group_<index>`, `$ip`). Only the few values persons and groups read
//! are parsed. The result is byte for byte what [`super::apply::round_trip`] stores: each step
//! below mirrors one of its `serde_json::Map` operations (with `preserve_order`, insert
//! keeps a key's place and appends a new one, remove swaps the last member in).

use std::borrow::Cow;

use serde_json::{Map, Value};
use uuid::Uuid;

use super::cache::{Cache, Tx};
use super::enrich::{Geo, ProjectSettings, GEO_KEY_STARTS};
use super::groups;
use super::raw::{self, KeyFilter, Member};
use crate::log::Record;
use crate::persons::{self, EventView, Store as _};

type Result<T> = std::result::Result<T, sled::transaction::UnabortableTransactionError>;

/// The buffer an event's properties are held in as text ([`Members`]), kept from one
/// event of a chunk to the next: made anew for each, it was an allocation an event
/// whose first writes all missed the cache.
pub type Scratch<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

/// Properties as text: each member's key (escaped, without quotes) and value, and a
/// filter of the keys, since most keys looked up are absent.
struct Members<'a>(Scratch<'a>, KeyFilter);

impl<'a> Members<'a> {
    fn new(members: &[Member<'a>], mut out: Scratch<'a>) -> Members<'a> {
        out.clear();
        out.reserve(members.len() + 16);
        let mut filter = KeyFilter::default();
        for m in members {
            filter.insert(m.key);
            out.push((Cow::Borrowed(m.key), Cow::Borrowed(m.value)));
        }
        Members(out, filter)
    }

    /// `key` must need no escaping (every key the compactor adds is so).
    fn position(&self, key: &str) -> Option<usize> {
        if !self.1.maybe_contains(key) {
            return None;
        }
        self.0.iter().position(|(k, _)| k == key)
    }

    fn push(&mut self, key: Cow<'a, str>, value: Cow<'a, str>) {
        self.1.insert(&key);
        self.0.push((key, value));
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.position(key).map(|i| &*self.0[i].1)
    }

    /// `Map::entry(key).or_insert(value)`; returns the member's index.
    fn or_insert(&mut self, key: &'a str, value: impl Into<Cow<'a, str>>) -> usize {
        match self.position(key) {
            Some(i) => i,
            None => {
                self.push(Cow::Borrowed(key), value.into());
                self.0.len() - 1
            }
        }
    }

    /// `Map::insert`.
    fn insert(&mut self, key: String, value: String) {
        match self.position(&key) {
            Some(i) => self.0[i].1 = Cow::Owned(value),
            None => self.push(Cow::Owned(key), Cow::Owned(value)),
        }
    }

    /// `Map::remove`, which is `swap_remove` with `preserve_order`.
    fn remove(&mut self, key: &str) {
        if let Some(i) = self.position(key) {
            self.0.swap_remove(i);
        }
    }

    fn write(&self) -> Vec<u8> {
        let len = self
            .0
            .iter()
            .map(|(k, v)| k.len() + v.len() + 4)
            .sum::<usize>();
        let mut out = Vec::with_capacity(len + 2);
        out.push(b'{');
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'"');
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(b"\":");
            out.extend_from_slice(v.as_bytes());
        }
        out.push(b'}');
        out
    }
}

/// A canonical value parsed; it always parses, being checked already.
fn parse(text: Option<&str>) -> Option<Value> {
    serde_json::from_str(text?).ok()
}

/// [`super::apply::record`] for a canonical event. Returns the person id and the properties
/// to store.
pub fn apply<'a>(
    tx: &Tx<'_>,
    cache: &mut Cache,
    record: &Record,
    event: &raw::Event<'a>,
    settings: ProjectSettings,
    geo: Option<&'a Geo>,
    scratch: &mut Scratch<'a>,
) -> Result<(Option<Uuid>, Vec<u8>)> {
    let project = record.project;
    // Enrichment adds to the properties object, creating it if absent, but leaves a
    // `properties` that is not an object alone (it is then stored as none).
    let enrichable = event.properties.is_some() || event.get("properties").is_none();
    let mut props = Members::new(
        event.properties.as_deref().unwrap_or_default(),
        std::mem::take(scratch),
    );
    let mut enriched = [Enriched::Untouched, Enriched::Untouched];
    if let Some(geo) = geo.filter(|g| enrichable && !g.found.is_empty()) {
        enriched = enrich(&mut props, geo);
    }

    let person_id = if props.get("$process_person_profile") == Some("false") {
        None
    } else {
        persons(tx, cache, record, event, &props, enriched)?
    };

    // Top-level person operations are kept with the event, as properties.
    for op in ["$set", "$set_once", "$unset"] {
        if let Some(v) = event.get(op) {
            props.or_insert(op, v);
        }
    }
    if record.event == "$groupidentify" {
        let [kind, key, set] =
            ["$group_type", "$group_key", "$group_set"].map(|k| parse(props.get(k)));
        groups::group_identify(
            tx,
            cache,
            project,
            [kind.as_ref(), key.as_ref(), set.as_ref()],
            record.timestamp,
        )?;
    }
    if let Some(groups) = props.get("$groups").filter(|g| g.starts_with('{')) {
        let groups = parse(Some(groups));
        for (k, v) in groups::groups(tx, cache, project, groups.as_ref())? {
            let v = serde_json::to_string(&v).unwrap_or_default();
            props.insert(k, v);
        }
    }
    match (record.ip, settings.anonymize_ips) {
        (Some(ip), false) => {
            let json = match geo.and_then(|g| g.ip.as_deref()) {
                Some(json) => Cow::Borrowed(json),
                None => Cow::Owned(format!("\"{ip}\"")),
            };
            props.or_insert("$ip", json);
        }
        (_, true) => props.remove("$ip"),
        (None, false) => {}
    }
    let written = props.write();
    *scratch = props.0;
    scratch.clear();
    Ok((person_id, written))
}

/// Apply the event to persons; returns its person. An event whose person operations
/// are exactly those last applied to its person (often: the same user's `$set` and
/// GeoIP's, event after event) would change nothing, and is not parsed or applied.
fn persons(
    tx: &Tx<'_>,
    cache: &mut Cache,
    record: &Record,
    event: &raw::Event<'_>,
    props: &Members<'_>,
    enriched: [Enriched<'_>; 2],
) -> Result<Option<Uuid>> {
    let project = record.project;
    // Linking events do more than apply operations.
    let links = matches!(
        record.event.as_str(),
        "$identify" | "$create_alias" | "$merge_dangerously"
    );
    // The operations as they end up in the stored properties (GeoIP's included), and
    // the top-level ones: together they say all this event does to a person.
    let mut ops = cache.take_ops_buffer();
    for text in ["$set", "$set_once", "$unset"]
        .map(|op| props.get(op))
        .into_iter()
        .chain(["$set", "$set_once", "$unset"].map(|op| event.get(op)))
    {
        // JSON text never holds a raw control character, so these separate.
        ops.push(if text.is_some() { 1 } else { 2 });
        ops.extend_from_slice(text.unwrap_or_default().as_bytes());
    }
    if !links {
        if let Some(id) = cache.applied(project, &record.distinct_id, &ops) {
            cache.put_ops_buffer(ops);
            return Ok(Some(id));
        }
        // Without operations the event changes no person and needs only its person's
        // id. A linked distinct id always names a stored person (a person is deleted
        // only by a merge, which first links each of its ids to the survivor), so the
        // person is not read: at a million persons that read was a block decoded
        // per event.
        if ops == NO_OPERATIONS {
            let linked = cache.persons(tx, project).person_of(&record.distinct_id)?;
            if let Some(id) = linked {
                cache.set_applied(project, id, &ops);
                cache.put_ops_buffer(ops);
                return Ok(Some(id));
            }
        }
    }
    let [set, set_once] = enriched;
    let set = set.sources(props, "$set");
    let set_once = set_once.sources(props, "$set_once");
    let unset = parse(props.get("$unset"));
    let top = |op| parse(event.get(op));
    let (top_set, top_set_once, top_unset) = (top("$set"), top("$set_once"), top("$unset"));
    let anon = if record.event == "$identify" {
        parse(props.get("$anon_distinct_id"))
    } else {
        None
    };
    let alias = if record.event == "$create_alias" || record.event == "$merge_dangerously" {
        parse(props.get("alias"))
    } else {
        None
    };
    let view = EventView {
        name: &record.event,
        distinct_id: &record.distinct_id,
        timestamp: record.timestamp,
        processes_person: true,
        anon_distinct_id: anon.as_ref(),
        alias: alias.as_ref(),
        set_once: [set_once.0.as_ref(), set_once.1, top_set_once.as_ref()],
        set: [set.0.as_ref(), set.1, top_set.as_ref()],
        unset: [unset.as_ref(), top_unset.as_ref()],
    };
    let person = persons::apply(&mut cache.persons(tx, project), &view)?;
    if let Some(id) = person {
        cache.set_applied(project, id, &ops);
    }
    cache.put_ops_buffer(ops);
    Ok(person)
}

/// The operations text of an event without any: each of the six absent.
const NO_OPERATIONS: [u8; 6] = [2; 6];

/// What enrichment did to `$set` or `$set_once`, for persons.
enum Enriched<'a> {
    /// Nothing: read the operation from the properties.
    Untouched,
    /// The object was this text (None: empty) and GeoIP's object was appended to it.
    Appended(Option<&'a str>, &'a Value),
    /// GeoIP added some of its keys to this object.
    Merged(Value),
}

impl<'a> Enriched<'a> {
    /// The operation as persons read it: the object, then what was appended to it.
    fn sources(self, props: &Members<'_>, op: &str) -> (Option<Value>, Option<&'a Value>) {
        match self {
            Enriched::Untouched => (parse(props.get(op)), None),
            Enriched::Appended(text, added) => (parse(text), Some(added)),
            Enriched::Merged(v) => (Some(v), None),
        }
    }
}

/// As the round trip's enrich: the GeoIP properties the event lacks, and the same in
/// its `$set` and (as `$initial_geoip_*`) `$set_once`, unless `$geoip_disable` is true.
/// Usually neither holds any GeoIP key, and GeoIP's members are appended as text.
fn enrich<'a>(props: &mut Members<'a>, geo: &'a Geo) -> [Enriched<'a>; 2] {
    let mut out = [Enriched::Untouched, Enriched::Untouched];
    if props.get("$geoip_disable") == Some("true") {
        return out;
    }
    for ((k, _), json) in geo.found.iter().zip(&geo.json) {
        props.or_insert(k, json.as_str());
    }
    for (slot, op) in ["$set", "$set_once"].into_iter().enumerate() {
        let at = props.or_insert(op, "{}");
        let text = match &props.0[at].1 {
            Cow::Borrowed(t) => *t,
            // Only this function writes these two, once each.
            Cow::Owned(_) => continue,
        };
        if !text.starts_with('{') {
            continue;
        }
        let (added, added_text) = (&geo.objects[slot], &geo.texts[slot]);
        if text == "{}" {
            props.0[at].1 = Cow::Borrowed(added_text);
            out[slot] = Enriched::Appended(None, added);
        } else if geo.prefixed && !text.contains(GEO_KEY_STARTS[slot]) {
            let mut joined = String::with_capacity(text.len() + added_text.len());
            joined.push_str(&text[..text.len() - 1]);
            joined.push(',');
            joined.push_str(&added_text[1..]);
            props.0[at].1 = Cow::Owned(joined);
            out[slot] = Enriched::Appended(Some(text), added);
        } else {
            let mut target: Map<String, Value> = serde_json::from_str(text).unwrap_or_default();
            let mut changed = false;
            for (i, (k, v)) in geo.found.iter().enumerate() {
                let key = if slot == 1 { &geo.initial[i] } else { *k };
                if !target.contains_key(key) {
                    target.insert(key.to_string(), v.clone());
                    changed = true;
                }
            }
            let target = Value::Object(target);
            if changed {
                props.0[at].1 = Cow::Owned(serde_json::to_string(&target).unwrap_or_default());
            }
            out[slot] = Enriched::Merged(target);
        }
    }
    out
}
