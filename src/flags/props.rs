//! The properties a filter reads during evaluation: the person's (with the request's
//! distinct id as the `distinct_id` property when the person has none), a group's, or
//! the request's own, and the small-map lookup they share.

use serde_json::{Map, Value};

use super::compile::DISTINCT_ID;
use super::result::FailureCause;

/// Where early access and group filters read from; `Failed` when the lookup did not
/// succeed. Person filters go through `Env::person_value` (in `evaluate`), which remembers
/// each key.
pub(super) enum Props<'c> {
    Known(Option<&'c Map<String, Value>>),
    /// The person's properties and the request's distinct id, which PostHog adds as the
    /// `distinct_id` property when absent.
    Person(&'c Map<String, Value>, Option<&'c Value>),
    Failed(FailureCause),
}

impl<'c> Props<'c> {
    pub(super) fn get(&self, key: &str) -> Result<Option<&'c Value>, FailureCause> {
        match self {
            Props::Known(map) => Ok(map.and_then(|m| find(m, key))),
            Props::Person(map, distinct) => Ok(person_get(map, key, *distinct)),
            Props::Failed(cause) => Err(cause.clone()),
        }
    }
}

/// Maps up to this many entries are searched by comparing keys: cheaper than hashing
/// the key (SipHash) for the few properties or groups a request usually carries.
const SCAN_ENTRIES: usize = 16;

/// `map.get(key)`, by a scan of the entries when the map is small. Keys are unique, so
/// both find the same entry.
#[inline]
pub(super) fn find<'m>(map: &'m Map<String, Value>, key: &str) -> Option<&'m Value> {
    if map.len() > SCAN_ENTRIES {
        return map.get(key);
    }
    map.iter().find(|(k, _)| k.as_str() == key).map(|(_, v)| v)
}

#[inline]
pub(super) fn person_get<'c>(
    map: &'c Map<String, Value>,
    key: &str,
    distinct: Option<&'c Value>,
) -> Option<&'c Value> {
    match find(map, key) {
        None if key == DISTINCT_ID => distinct,
        found => found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_agrees_with_get_on_either_side_of_the_scan_limit() {
        for size in [0, 1, SCAN_ENTRIES - 1, SCAN_ENTRIES, SCAN_ENTRIES + 1, 40] {
            let map: Map<String, Value> = (0..size)
                .map(|i| (format!("key{i}"), Value::from(i)))
                .collect();
            for i in 0..size + 2 {
                for key in [format!("key{i}"), format!("Key{i}"), format!("key{i} ")] {
                    assert_eq!(find(&map, &key), map.get(&key), "{size} {key}");
                }
            }
            assert_eq!(find(&map, ""), None);
        }
    }
}
