//! Groups from events: `$groupidentify` creates or updates a group, `$groups` attaches
//! an event to groups, and both name group types, up to [`MAX_GROUP_TYPES`] per
//! project. Shared by both ways of applying a record ([`super::apply`] and
//! [`super::splice`]); every read and write goes through the chunk's transaction.

use serde_json::{Map, Value};
use sled::transaction::UnabortableTransactionError;

use super::cache::{Cache, Tx};
use crate::store::{keys, Group, MAX_GROUP_TYPES};

type Result<T> = std::result::Result<T, UnabortableTransactionError>;

/// The index of a group type, allocating the next free one (up to five).
fn group_type_index(
    tx: &Tx<'_>,
    cache: &mut Cache,
    project: u64,
    name: &str,
) -> Result<Option<u8>> {
    if let Some(index) = cache.group_type(project, name) {
        return Ok(Some(index));
    }
    if let Some(v) = tx
        .group_types
        .get(keys::group_type_by_name(project, name))?
    {
        if let Some(&index) = v.first() {
            cache.set_group_type(project, name, index);
        }
        return Ok(v.first().copied());
    }
    for index in 0..MAX_GROUP_TYPES {
        if tx
            .group_types
            .get(keys::group_type_by_index(project, index))?
            .is_none()
        {
            tx.group_types
                .insert(keys::group_type_by_name(project, name), &[index][..])?;
            tx.group_types.insert(
                &keys::group_type_by_index(project, index)[..],
                name.as_bytes(),
            )?;
            cache.added_group_type(project, name, index);
            return Ok(Some(index));
        }
    }
    tracing::debug!(project, "group type limit reached; not adding {name:?}");
    Ok(None)
}

fn scalar_key(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `$groupidentify` creates the group or updates its properties with `$group_set`;
/// given the `$group_type`, `$group_key` and `$group_set` properties.
pub fn group_identify(
    tx: &Tx<'_>,
    cache: &mut Cache,
    project: u64,
    [kind, key, set]: [Option<&Value>; 3],
    timestamp: i64,
) -> Result<()> {
    let (Some(kind), Some(key)) = (kind.and_then(Value::as_str), scalar_key(key)) else {
        return Ok(());
    };
    let Some(index) = group_type_index(tx, cache, project, kind)? else {
        return Ok(());
    };
    let k = keys::group(project, index, &key);
    let mut group = match tx.groups.get(&k)? {
        Some(bytes) => serde_json::from_slice(&bytes).ok(),
        None => None,
    }
    .unwrap_or_else(|| Group {
        group_type_index: index,
        group_key: key.clone(),
        properties: Map::new(),
        created_at: timestamp,
    });
    if let Some(Value::Object(set)) = set {
        for (pk, pv) in set {
            group.properties.insert(pk.clone(), pv.clone());
        }
    }
    group.created_at = group.created_at.min(timestamp);
    tx.groups
        .insert(k, serde_json::to_vec(&group).unwrap_or_default())?;
    cache.wrote_group(project, index, &key);
    Ok(())
}

/// `$groups: {type: key}` attaches the event to groups: the `$group_<index>`
/// properties to set, with their keys. It names group types (as PostHog does) but
/// never creates a group.
pub fn groups(
    tx: &Tx<'_>,
    cache: &mut Cache,
    project: u64,
    groups: Option<&Value>,
) -> Result<Vec<(String, String)>> {
    let Some(Value::Object(groups)) = groups else {
        return Ok(Vec::new());
    };
    let mut attached = Vec::new();
    for (kind, key) in groups {
        if let (Some(key), Some(index)) = (
            scalar_key(Some(key)),
            group_type_index(tx, cache, project, kind)?,
        ) {
            attached.push((format!("$group_{index}"), key));
        }
    }
    Ok(attached)
}
