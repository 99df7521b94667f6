//! CPU a server's threads used over a phase, by thread name, from
//! `/proc/<pid>/task/*/stat`: what ran beside the requests being timed (a fold, an
//! index build, a poll that does not sleep), which a latency alone cannot tell from
//! the machine's load.

use std::collections::{BTreeMap, HashMap};

/// Each thread's name and CPU ticks (user and system) at one moment, by thread id.
pub struct Sample(HashMap<u32, (String, u64)>);

/// The threads of `pid` now; a thread that ends while it is read is left out.
pub fn sample(pid: u32) -> Result<Sample, String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|e| format!("cannot list /proc/{pid}/task: {e}"))?;
    let mut threads = HashMap::new();
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // The name is between the first '(' and the last ')'; utime and stime are the
        // 12th and 13th fields after it.
        let (Some(open), Some((_, rest))) = (stat.find('('), stat.rsplit_once(')')) else {
            continue;
        };
        let name = stat[open + 1..stat.len() - rest.len() - 1].to_owned();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
        if let (Some(user), Some(system)) = (ticks(11), ticks(12)) {
            threads.insert(tid, (name, user + system));
        }
    }
    Ok(Sample(threads))
}

/// CPU seconds each thread name used from `before` to `after` (threads of one name
/// summed; one started in between counted from zero), busiest first.
pub fn used(before: &Sample, after: &Sample) -> Vec<(String, f64)> {
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut by_name: BTreeMap<&str, u64> = BTreeMap::new();
    for (tid, (name, ticks)) in &after.0 {
        let earlier = before.0.get(tid).map_or(0, |(_, t)| *t);
        *by_name.entry(name).or_default() += ticks.saturating_sub(earlier);
    }
    let mut out: Vec<(String, f64)> = by_name
        .into_iter()
        .filter(|&(_, ticks)| ticks > 0)
        .map(|(name, ticks)| (name.to_owned(), ticks as f64 / per_second))
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
}

/// `used` as one line: `name 1.23 s, other 0.04 s`, or `none`.
pub fn line(used: &[(String, f64)]) -> String {
    if used.is_empty() {
        return "none".into();
    }
    let parts: Vec<String> = used
        .iter()
        .map(|(name, s)| format!("{name} {s:.2} s"))
        .collect();
    parts.join(", ")
}
