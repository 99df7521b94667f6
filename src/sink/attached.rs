//! The property values PostHog keeps in columns of their own: the `$group_0..4` keys
//! the compactor attached and the elements chain, posthog-js's `$elements_chain` or,
//! where that is missing or falsy, the chain [`super::elements`] builds from an
//! `$elements` array. As PostHog's ingestion does, the row's `properties` leave out
//! `$elements_chain` and `$elements`.
//!
//! Fast for the sink's sake: an event that mentions none of these keys is not parsed
//! at all, one that has them is read once for just these keys, and the two members
//! are cut out of its text, the rest copied as stored. Only text serde_json would not
//! have written (a key given twice, an escaped key) takes a full parse.

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::elements;

#[derive(Debug, Default, PartialEq)]
pub struct Attached {
    pub groups: [String; 5],
    pub elements_chain: String,
    /// The properties to send instead of those stored: them without `$elements_chain`
    /// and `$elements`, for an event that has either.
    pub properties: Option<Vec<u8>>,
}

const CHAIN: &str = "$elements_chain";
const ELEMENTS: &str = "$elements";

/// Only the top-level keys the columns need; serde skips the rest without building
/// values, several times faster than parsing the whole object.
#[derive(Deserialize)]
struct Columns<'a> {
    #[serde(rename = "$group_0")]
    group_0: Option<Value>,
    #[serde(rename = "$group_1")]
    group_1: Option<Value>,
    #[serde(rename = "$group_2")]
    group_2: Option<Value>,
    #[serde(rename = "$group_3")]
    group_3: Option<Value>,
    #[serde(rename = "$group_4")]
    group_4: Option<Value>,
    #[serde(rename = "$elements_chain", borrow, default)]
    chain: Member<'a>,
    #[serde(rename = "$elements", borrow, default)]
    elements: Member<'a>,
}

/// A member's value as its text in the properties, null included.
#[derive(Default)]
struct Member<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Member<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(|raw| Member(Some(raw)))
    }
}

impl Attached {
    /// The columns of an event whose stored properties are `properties`.
    pub fn of(properties: &[u8]) -> Attached {
        let mentions = |needle: &[u8]| memchr::memmem::find(properties, needle).is_some();
        // `"$elements` also finds `"$elements_chain"`.
        if !mentions(b"\"$group_") && !mentions(b"\"$elements") {
            return Attached::default();
        }
        let Ok(c) = serde_json::from_slice::<Columns>(properties) else {
            return Attached::parsed(properties);
        };
        let groups = [c.group_0, c.group_1, c.group_2, c.group_3, c.group_4];
        let (Member(chain), Member(list)) = (c.chain, c.elements);
        let removed: Vec<_> = [(chain, CHAIN), (list, ELEMENTS)]
            .into_iter()
            .filter_map(|(raw, key)| Some((raw?, key)))
            .collect();
        let properties = match removed.is_empty() {
            true => None,
            false => match cut(properties, &removed) {
                Some(cut) => Some(cut),
                None => return Attached::parsed(properties),
            },
        };
        let value = |raw: Option<&RawValue>| raw.and_then(|r| serde_json::from_str(r.get()).ok());
        let chain: Option<Value> = value(chain);
        // The list is read only where the chain does not count.
        let list = match chain.as_ref().is_some_and(elements::truthy) {
            true => None,
            false => value(list.filter(|r| r.get().starts_with('['))),
        };
        Attached::new(groups, chain, list, properties)
    }

    /// The slow way, for properties serde_json would not have written.
    fn parsed(properties: &[u8]) -> Attached {
        let Ok(Value::Object(mut map)) = serde_json::from_slice::<Value>(properties) else {
            return Attached::default();
        };
        let groups = std::array::from_fn(|i| map.get(&format!("$group_{i}")).cloned());
        let (chain, list) = (map.shift_remove(CHAIN), map.shift_remove(ELEMENTS));
        let properties = (chain.is_some() || list.is_some())
            .then(|| serde_json::to_vec(&map).unwrap_or_else(|_| b"{}".to_vec()));
        Attached::new(groups, chain, list, properties)
    }

    fn new(
        groups: [Option<Value>; 5],
        chain: Option<Value>,
        list: Option<Value>,
        properties: Option<Vec<u8>>,
    ) -> Attached {
        // PostHog takes `$elements_chain` when it is truthy, else builds from `$elements`.
        let elements_chain = match chain.filter(elements::truthy) {
            Some(chain) => text(Some(chain)),
            None => list.map_or_else(String::new, |list| elements::chain(&list)),
        };
        Attached {
            groups: groups.map(text),
            elements_chain,
            properties,
        }
    }
}

/// A string's text, a number as written, anything else nothing.
fn text(value: Option<Value>) -> String {
    match value {
        Some(Value::String(s)) => s,
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// `object` without the `removed` members (values borrowed from it, with their keys),
/// the others copied as they are; None where a key is not written as plain text.
fn cut(object: &[u8], removed: &[(&RawValue, &str)]) -> Option<Vec<u8>> {
    let is_space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let open = object.iter().position(|b| !is_space(b))?;
    let close = object.iter().rposition(|b| !is_space(b))?;
    if object[open] != b'{' || object[close] != b'}' {
        return None;
    }
    let mut spans = Vec::with_capacity(removed.len());
    for (raw, key) in removed {
        let start = (raw.get().as_ptr() as usize).checked_sub(object.as_ptr() as usize)?;
        let end = start + raw.get().len();
        if start <= open || end > close {
            return None;
        }
        // Back over `"key":` to where the member starts.
        let mut at = start
            - object[..start]
                .iter()
                .rev()
                .take_while(|b| is_space(b))
                .count();
        if object[..at].last() != Some(&b':') {
            return None;
        }
        at -= 1;
        at -= object[..at]
            .iter()
            .rev()
            .take_while(|b| is_space(b))
            .count();
        let before = object[open + 1..at]
            .strip_suffix(b"\"")?
            .strip_suffix(key.as_bytes())?
            .strip_suffix(b"\"")?;
        spans.push((open + 1 + before.len(), end));
    }
    spans.sort_unstable();
    // The runs of members between those cut out, joined by commas again.
    let mut out = Vec::with_capacity(object.len());
    out.push(b'{');
    let mut at = open + 1;
    for (start, end) in spans.into_iter().chain([(close, close)]) {
        let run = object.get(at..start)?;
        let skip = |b: &u8| is_space(b) || *b == b',';
        let from = run.iter().position(|b| !skip(b)).unwrap_or(run.len());
        let to = run.iter().rposition(|b| !skip(b)).map_or(from, |i| i + 1);
        if from < to {
            if out.len() > 1 {
                out.push(b',');
            }
            out.extend_from_slice(&run[from..to]);
        }
        at = end;
    }
    out.push(b'}');
    Some(out)
}

#[cfg(test)]
#[path = "tests/attached.rs"]
mod tests;
