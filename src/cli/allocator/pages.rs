//! Which threads' pages hold the memory the allocator keeps: every page of mimalloc's
//! main heap (all threads' pages) is visited, its committed and used bytes summed by
//! the thread that owns it and by its block size. A page's free bytes (committed less
//! used) are the allocator's share of the resident set while the page has a live
//! block; a page with none is one the thread keeps until it collects. Threads are named
//! from `/proc/self/task/<tid>/comm`: each thread records its mimalloc id (its thread
//! pointer, `pthread_self` on glibc) beside its tid on its first counted allocation.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// Threads remembered; later ones are named by their id alone.
const THREADS: usize = 1024;
/// Rows of the (thread, size) table written, the most free bytes first.
const TOP: usize = 40;

static IDS: [AtomicUsize; THREADS] = [const { AtomicUsize::new(0) }; THREADS];
static TIDS: [AtomicI32; THREADS] = [const { AtomicI32::new(0) }; THREADS];
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SEEN: Cell<bool> = const { Cell::new(false) };
}

/// Called on each counted allocation: the thread's first records its ids.
pub fn note_thread() {
    if SEEN.with(|s| s.replace(true)) {
        return;
    }
    let slot = NEXT.fetch_add(1, Ordering::Relaxed);
    if slot < THREADS {
        // SAFETY: both calls only read the calling thread's own identity.
        let (id, tid) = unsafe { (libc::pthread_self() as usize, libc::gettid()) };
        TIDS[slot].store(tid, Ordering::Relaxed);
        IDS[slot].store(id, Ordering::Release);
    }
}

#[derive(Default, Clone, Copy)]
struct Sum {
    pages: usize,
    empty: usize,
    committed: usize,
    used: usize,
}

impl Sum {
    fn add(&mut self, committed: usize, used: usize) {
        self.pages += 1;
        self.empty += usize::from(used == 0);
        self.committed += committed;
        self.used += used;
    }

    fn merge(&mut self, other: &Sum) {
        self.pages += other.pages;
        self.empty += other.empty;
        self.committed += other.committed;
        self.used += other.used;
    }

    fn free(&self) -> usize {
        self.committed - self.used.min(self.committed)
    }
}

/// Keyed by (owner id, bit length of the block size).
type Table = HashMap<(usize, u32), Sum>;

fn names() -> HashMap<usize, String> {
    let n = NEXT.load(Ordering::Relaxed).min(THREADS);
    let mut names = HashMap::new();
    for slot in 0..n {
        let id = IDS[slot].load(Ordering::Acquire);
        let tid = TIDS[slot].load(Ordering::Relaxed);
        if id == 0 {
            continue;
        }
        let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"));
        // A later thread may reuse an ended one's id: the newest slot wins.
        names.insert(
            id,
            comm.map_or_else(|_| "ended".into(), |c| c.trim().into()),
        );
    }
    names
}

/// Count the page `area` in `table` under its owner and block size.
fn add(table: &mut Table, area: &libmimalloc_sys::mi_heap_area_t) {
    // The area's internal pointer is the page, whose first word is its owner's id
    // with two flag bits (0 or 4 once its thread ended, or while it is full and
    // handed back: abandoned).
    let page = area.reserved1 as *const AtomicUsize;
    let owner = if page.is_null() {
        0
    } else {
        // SAFETY: the page's header stays mapped (a purge zeroes it, never unmaps).
        unsafe { (*page).load(Ordering::Relaxed) & !3 }
    };
    let class = usize::BITS - area.block_size.leading_zeros();
    let used = area.used * area.full_block_size;
    table
        .entry((owner, class))
        .or_default()
        .add(area.committed, used);
}

/// Append the pages' report, stamped `now`: one line of totals by thread name, then
/// the heaviest (thread, block size) rows by free bytes.
pub fn write(out: &mut impl Write, now: u64) {
    let mut table = Table::new();
    let mut apart = Table::new();
    flagpost::support::memory::visit_pages(&mut |area| add(&mut table, area));
    // The deltas' heaps (`support::heaps`), named apart.
    flagpost::support::heaps::visit(&mut |area| add(&mut apart, area));
    let names = names();
    let name = |owner: usize| match owner {
        0 | 4 => "abandoned".to_string(),
        id => names.get(&id).cloned().unwrap_or_else(|| format!("{id:x}")),
    };
    let mut by_name: HashMap<String, Sum> = HashMap::new();
    let mut rows: HashMap<(String, u32), Sum> = HashMap::new();
    let named = table
        .iter()
        .map(|(&(owner, class), s)| (name(owner), class, s));
    let deltas = apart
        .iter()
        .map(|(&(owner, class), s)| (format!("deltas:{}", name(owner)), class, s));
    for (n, class, s) in named.chain(deltas) {
        by_name.entry(n.clone()).or_default().merge(s);
        rows.entry((n, class)).or_default().merge(s);
    }
    let mut by_name: Vec<_> = by_name.into_iter().collect();
    by_name.sort_by_key(|(_, s)| std::cmp::Reverse(s.free()));
    let mut total = Sum::default();
    for (_, s) in &by_name {
        total.merge(s);
    }
    let fmt = |s: &Sum| {
        format!(
            "{}p/{}e commit={} used={} free={}",
            s.pages,
            s.empty,
            s.committed >> 10,
            s.used >> 10,
            s.free() >> 10
        )
    };
    let mut line = format!("{now} all {}", fmt(&total));
    for (n, s) in &by_name {
        line.push_str(&format!(" | {n} {}", fmt(s)));
    }
    let _ = writeln!(out, "{line}");
    let mut rows: Vec<_> = rows.into_iter().collect();
    rows.sort_by_key(|(_, s)| std::cmp::Reverse(s.free()));
    for ((n, class), s) in rows.iter().take(TOP) {
        let _ = writeln!(out, "{now}   {n} c{class} {}", fmt(s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_pages_are_counted_under_its_name() {
        let spawned = std::thread::Builder::new()
            .name("pages-test".into())
            .spawn(|| {
                note_thread();
                // Five blocks of 3 KiB: one page of a class the test's other threads
                // barely use, not full (a full page is abandoned, owned by no thread).
                let held: Vec<Box<[u8; 3000]>> = (0..5).map(|_| Box::new([1u8; 3000])).collect();
                let mut out = Vec::new();
                write(&mut out, 7);
                drop(held);
                String::from_utf8(out).unwrap()
            })
            .unwrap();
        let report = spawned.join().unwrap();
        let first = report.lines().next().unwrap();
        assert!(first.starts_with("7 all "), "{first}");
        let row = report
            .lines()
            .find(|l| l.contains(" pages-test c12 "))
            .unwrap_or_else(|| panic!("no row for the thread's 3 KiB blocks:\n{report}"));
        let used: usize = row
            .split_whitespace()
            .find_map(|w| w.strip_prefix("used="))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(used >= 5 * 3000 / 1024, "{row}\n{report}");
    }
}
