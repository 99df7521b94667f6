//! A stored person tested for a property without decoding it whole: the console's
//! searches by a property and a flag's reach read thousands of persons a request, and
//! building each one's properties (a map of a dozen values) was most of their cost.
//!
//! Persons are stored as serde_json writes a [`Person`](crate::persons::Person) (only
//! the compactor writes them), so a property key in them is exactly the text
//! serde_json writes for the key, then `:`. A person whose bytes lack that text ([`Needle`]) has no such
//! property; the text elsewhere (a nested object's key, a field of the person itself)
//! only means the person is decoded. [`probe`] reads a person's bytes as decoding a
//! [`Person`](crate::persons::Person) would, accepting and refusing the same bytes
//! that serde_json wrote, but keeps only its first event's time, its distinct ids'
//! count and last one, its first distinct id, and the properties asked for; every
//! other value is skipped without being built.

use std::fmt;

use memchr::memmem::Finder;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use uuid::Uuid;

/// A property key as stored persons write it.
pub struct Needle(Finder<'static>);

impl Needle {
    pub fn new(key: &str) -> Needle {
        let mut text = serde_json::to_vec(key).unwrap_or_default();
        text.push(b':');
        Needle(Finder::new(&text).into_owned())
    }

    /// Whether a stored person's `bytes` may have the property (false: it has not).
    pub fn may_be_in(&self, bytes: &[u8]) -> bool {
        self.0.find(bytes).is_some()
    }
}

/// What [`probe`] keeps of a person.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub created_at: i64,
    pub distinct_ids: usize,
    /// The last of its distinct ids (its latest), if any.
    pub last_id: Option<String>,
    pub first_distinct_id: String,
    /// The properties asked for that it has.
    pub properties: Map<String, Value>,
}

/// A stored person's `bytes` read for the properties `keys` (none: for its time and
/// ids alone); None when they do not decode as a [`Person`](crate::persons::Person).
pub fn probe(bytes: &[u8], keys: &[&str]) -> Option<Probe> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let probe = PersonSeed(keys).deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(probe)
}

/// What [`glance`] reads of a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Glance {
    pub created_at: i64,
    /// Whether it has any distinct id.
    pub has_ids: bool,
}

/// Where serde_json writes a person's first event: after `{"id":"<36>","created_at":`.
const CREATED_AT: usize = 7 + 36 + 15;

/// A stored person's first event and whether it has a distinct id, read from where
/// serde_json puts them, for a person that is passed over without a test: serde_json
/// writes a [`Person`](crate::persons::Person)'s fields in order, so the time follows
/// its id at a fixed place, and its distinct ids are the last `,"distinct_ids":[` (a
/// nested object's key of that name would be inside its properties, before it; a
/// string cannot hold an unescaped quote). None for bytes not laid out so: read them
/// with [`probe`] then. Persons are only ever written by serde_json, and their
/// tables check what they read, so bytes laid out so are a person's.
pub fn glance(bytes: &[u8]) -> Option<Glance> {
    if bytes.get(..7)? != b"{\"id\":\"" || bytes.get(43..CREATED_AT)? != b"\",\"created_at\":" {
        return None;
    }
    let digits = &bytes[CREATED_AT..];
    let end = memchr::memchr(b',', digits)?;
    let created_at = std::str::from_utf8(&digits[..end]).ok()?.parse().ok()?;
    let ids = memchr::memmem::rfind(bytes, b",\"distinct_ids\":[")?;
    let has_ids = *bytes.get(ids + 17)? != b']';
    Some(Glance {
        created_at,
        has_ids,
    })
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Field {
    Id,
    CreatedAt,
    Properties,
    DistinctIds,
    IsIdentified,
    FirstDistinctId,
    #[serde(other)]
    Other,
}

const FIELDS: &[&str] = &[
    "id",
    "created_at",
    "properties",
    "distinct_ids",
    "is_identified",
    "first_distinct_id",
];

struct PersonSeed<'k>(&'k [&'k str]);

impl<'de> DeserializeSeed<'de> for PersonSeed<'_> {
    type Value = Probe;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Probe, D::Error> {
        d.deserialize_struct("Person", FIELDS, self)
    }
}

/// Set a field once, as serde's derived decoding refuses a field given twice.
macro_rules! once {
    ($slot:ident, $name:literal, $value:expr) => {
        if $slot.replace($value).is_some() {
            return Err(de::Error::duplicate_field($name));
        }
    };
}

impl<'de> Visitor<'de> for PersonSeed<'_> {
    type Value = Probe;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a stored person")
    }

    /// The fields in order, as serde's derived decoding also accepts them.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Probe, A::Error> {
        let length = |n: usize| <A::Error as de::Error>::invalid_length(n, &"six fields");
        seq.next_element::<Uuid>()?.ok_or_else(|| length(0))?;
        let created_at = seq.next_element::<i64>()?.ok_or_else(|| length(1))?;
        let properties = (seq.next_element_seed(Properties(self.0))?).ok_or_else(|| length(2))?;
        let (distinct_ids, last_id) = (seq.next_element::<Ids>()?).ok_or_else(|| length(3))?.0;
        seq.next_element::<bool>()?.ok_or_else(|| length(4))?;
        let first_distinct_id = seq.next_element::<String>()?.ok_or_else(|| length(5))?;
        Ok(Probe {
            created_at,
            distinct_ids,
            last_id,
            first_distinct_id,
            properties,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Probe, A::Error> {
        let (mut id, mut created_at, mut properties) = (None, None, None);
        let (mut ids, mut identified, mut first) = (None, None, None);
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Id => once!(id, "id", map.next_value::<Uuid>()?),
                Field::CreatedAt => once!(created_at, "created_at", map.next_value::<i64>()?),
                Field::Properties => {
                    once!(
                        properties,
                        "properties",
                        map.next_value_seed(Properties(self.0))?
                    )
                }
                Field::DistinctIds => once!(ids, "distinct_ids", map.next_value::<Ids>()?.0),
                Field::IsIdentified => {
                    once!(identified, "is_identified", map.next_value::<bool>()?)
                }
                Field::FirstDistinctId => {
                    once!(first, "first_distinct_id", map.next_value::<String>()?)
                }
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let missing = |name: &'static str| <A::Error as de::Error>::missing_field(name);
        id.ok_or_else(|| missing("id"))?;
        identified.ok_or_else(|| missing("is_identified"))?;
        let (distinct_ids, last_id) = ids.ok_or_else(|| missing("distinct_ids"))?;
        Ok(Probe {
            created_at: created_at.ok_or_else(|| missing("created_at"))?,
            distinct_ids,
            last_id,
            first_distinct_id: first.ok_or_else(|| missing("first_distinct_id"))?,
            properties: properties.ok_or_else(|| missing("properties"))?,
        })
    }
}

/// A list of distinct ids: how many, and the last.
struct Ids((usize, Option<String>));

impl<'de> Deserialize<'de> for Ids {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Ids, D::Error> {
        d.deserialize_seq(IdsVisitor)
    }
}

struct IdsVisitor;

impl<'de> Visitor<'de> for IdsVisitor {
    type Value = Ids;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of distinct ids")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ids, A::Error> {
        let (mut count, mut last) = (0, None);
        while let Some(id) = seq.next_element::<String>()? {
            count += 1;
            last = Some(id);
        }
        Ok(Ids((count, last)))
    }
}

/// The properties object, keeping the values of the keys asked for (the last, if one
/// is given twice, as a map decoded whole keeps).
struct Properties<'k>(&'k [&'k str]);

impl<'de> DeserializeSeed<'de> for Properties<'_> {
    type Value = Map<String, Value>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Properties<'_> {
    type Value = Map<String, Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of properties")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = Map::new();
        while let Some(asked) = map.next_key_seed(Asked(self.0))? {
            match asked {
                Some(i) => {
                    found.insert(self.0[i].to_owned(), map.next_value::<Value>()?);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// A property's key: which of the keys asked for it is, if any.
struct Asked<'k>(&'k [&'k str]);

impl<'de> DeserializeSeed<'de> for Asked<'_> {
    type Value = Option<usize>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Asked<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a property key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|k| *k == key))
    }
}

#[cfg(test)]
#[path = "tests/person_probe.rs"]
mod tests;
