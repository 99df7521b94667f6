//! Reading rollups for a range of whole hours, `from <= hour < to` (each the first
//! millisecond of an hour).

use std::collections::{BTreeMap, HashMap};

use super::{
    count_of, event_key, event_prefix, hour_prefix, keys, prefix, take_text, Rollups, Sketch,
    EVENTS, EXPOSURES, SURVEYS, VERSION,
};

/// One event name's hours that have events: the first millisecond of each, its count
/// and its unique-person sketch, oldest first.
pub type Hours = Vec<(i64, u64, Sketch)>;

pub fn events(
    rollups: &Rollups,
    project: u64,
    name: &str,
    from: i64,
    to: i64,
) -> Result<Hours, sled::Error> {
    let mut out = Vec::new();
    for (key, value) in
        rollups.range(event_key(project, name, from)..event_key(project, name, to))?
    {
        let (Some(hour), Some(count)) = (key_hour(&key), count_of(&value)) else {
            continue;
        };
        let sketch = Sketch::decode(&value[9..]).unwrap_or_default();
        out.push((hour, count, sketch));
    }
    Ok(out)
}

/// One event's totals and unique persons per bucket of `step` ms (an hour or a day),
/// `n` buckets from `first`: hours add up, their sketches merge.
pub fn series(
    rollups: &Rollups,
    project: u64,
    name: &str,
    (first, step, n): (i64, i64, usize),
) -> Result<(Vec<u64>, Vec<u64>), sled::Error> {
    let mut totals = vec![0u64; n];
    let mut sketches = vec![Sketch::default(); n];
    let end = first.saturating_add(step.saturating_mul(n as i64));
    for (hour, count, sketch) in events(rollups, project, name, first, end)? {
        let Some(i) = usize::try_from((hour - first) / step)
            .ok()
            .filter(|i| *i < n)
        else {
            continue;
        };
        totals[i] += count;
        sketches[i].merge(&sketch);
    }
    Ok((totals, sketches.iter().map(Sketch::estimate).collect()))
}

pub(super) fn key_hour(key: &[u8]) -> Option<i64> {
    let at = key.len().checked_sub(8)?;
    Some(keys::time_from(key[at..].try_into().ok()?))
}

/// Every event name's count over the range.
pub fn top(
    rollups: &Rollups,
    project: u64,
    from: i64,
    to: i64,
) -> Result<HashMap<String, u64>, sled::Error> {
    let mut counts = HashMap::new();
    for name in names(rollups, project)? {
        let mut n = 0u64;
        for (_, value) in
            rollups.range(event_key(project, &name, from)..event_key(project, &name, to))?
        {
            n += count_of(&value).unwrap_or(0);
        }
        if n > 0 {
            counts.insert(name, n);
        }
    }
    Ok(counts)
}

/// The event names with rollups in the tree or in memory: the tree's by one lookup
/// each (a name's hours are skipped over), the hot ones from their keys.
fn names(
    rollups: &Rollups,
    project: u64,
) -> Result<std::collections::BTreeSet<String>, sled::Error> {
    let kind = prefix(project, EVENTS);
    let mut names = rollups.hot().names(&kind);
    let mut at = kind.clone();
    while let Some((key, _)) = rollups.get_gt(&at)? {
        if !key.starts_with(&kind) {
            break;
        }
        let Some((name, _)) = take_text(&key[kind.len()..]) else {
            break;
        };
        names.insert(name.to_owned());
        // Past this name's last hour.
        at = [event_prefix(project, name).as_slice(), &[0xff; 9]].concat();
    }
    Ok(names)
}

/// The values of an hour-first kind over the range, each key without its project,
/// kind and hour.
fn hour_first(
    rollups: &Rollups,
    project: u64,
    kind: u8,
    from: i64,
    to: i64,
    mut each: impl FnMut(&[u8], &[u8]),
) -> Result<(), sled::Error> {
    let skip = prefix(project, kind).len() + 8;
    for (key, value) in
        rollups.range(hour_prefix(project, kind, from)..hour_prefix(project, kind, to))?
    {
        if value.first() == Some(&VERSION) {
            each(&key[skip..], &value);
        }
    }
    Ok(())
}

/// Flag calls by flag and returned value.
pub fn exposures(
    rollups: &Rollups,
    project: u64,
    from: i64,
    to: i64,
) -> Result<BTreeMap<String, BTreeMap<String, u64>>, sled::Error> {
    let mut by_flag: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    hour_first(rollups, project, EXPOSURES, from, to, |rest, value| {
        let (Some((flag, v)), Some(n)) = (take_text(rest), count_of(value)) else {
            return;
        };
        let Ok(v) = std::str::from_utf8(v) else {
            return;
        };
        *by_flag
            .entry(flag.to_owned())
            .or_default()
            .entry(v.to_owned())
            .or_default() += n;
    })?;
    Ok(by_flag)
}

/// A survey's name, its responses and each answer's count.
pub type Survey = (String, u64, BTreeMap<String, u64>);

/// `survey sent` by survey id. The name is the latest hour's.
pub fn surveys(
    rollups: &Rollups,
    project: u64,
    from: i64,
    to: i64,
) -> Result<BTreeMap<String, Survey>, sled::Error> {
    let mut by_survey: BTreeMap<String, Survey> = BTreeMap::new();
    hour_first(rollups, project, SURVEYS, from, to, |rest, value| {
        let (Some((id, rest)), Some(n)) = (take_text(rest), count_of(value)) else {
            return;
        };
        let slot = by_survey
            .entry(id.to_owned())
            .or_insert_with(|| (id.to_owned(), 0, BTreeMap::new()));
        match rest.split_first() {
            Some((0, [])) => {
                slot.1 += n;
                if let Ok(name) = std::str::from_utf8(&value[9..]) {
                    slot.0 = name.to_owned();
                }
            }
            Some((1, answer)) => {
                if let Ok(a) = std::str::from_utf8(answer) {
                    *slot.2.entry(a.to_owned()).or_default() += n;
                }
            }
            _ => {}
        }
    })?;
    Ok(by_survey)
}
