//! CPU time of a process's threads, by thread name, from `/proc/<pid>/task`: the
//! forward scenario prints it beside each `wrk` round, so a round that came out slower
//! with forwarding on can be told apart from a busier machine. What the edge's
//! forwarder threads took (its reading and gzip, at the compactor's nice value) and
//! what its request workers took (capture, and the forwarder's requests on the
//! reactor) are then figures of their own, not guesses from one ratio.

use std::collections::BTreeMap;

/// CPU seconds by thread name, numbered names (`forwarder-0`, `forwarder-1`) summed.
pub type Threads = BTreeMap<String, f64>;

/// The CPU seconds each thread name of `pid` used so far; empty if `/proc` cannot be
/// read (the figures are then missing from the report, not wrong).
pub fn read(pid: u32) -> Threads {
    let mut out = Threads::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    // SAFETY: sysconf reads a constant of the system and has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        if let Some((name, seconds)) = parse(&stat, tick) {
            *out.entry(name).or_default() += seconds;
        }
    }
    out
}

/// A thread's name (its trailing number cut) and user plus system CPU seconds, from
/// one `stat` line: `tid (name) state ppid ...`, utime and stime the 14th and 15th
/// fields. The name may hold spaces and parentheses, so it runs to the last `)`.
fn parse(stat: &str, tick: f64) -> Option<(String, f64)> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let name = stat.get(open + 1..close)?;
    let name = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let name = name.trim_end_matches(['-', '_']).to_string();
    let fields: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((name, (utime + stime) / tick))
}

/// What each thread name used between two readings; threads gone since are not in
/// `after` and so not counted.
pub fn since(before: &Threads, after: &Threads) -> Threads {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v >= 0.005)
        .collect()
}

/// `total s (name s, ...)`, the largest first.
pub fn summary(threads: &Threads) -> String {
    let mut by_time: Vec<(&String, &f64)> = threads.iter().collect();
    by_time.sort_by(|a, b| b.1.total_cmp(a.1));
    let total: f64 = threads.values().sum();
    let parts: Vec<String> = by_time
        .iter()
        .map(|(name, s)| format!("{name} {s:.2}"))
        .collect();
    format!("{total:.2} s ({})", parts.join(", "))
}
