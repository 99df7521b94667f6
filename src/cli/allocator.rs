//! The process's allocator: mimalloc, with an optional count of the bytes the program
//! holds. The resident set is the allocator's view (pages it keeps committed); the
//! holders' counts in `flagpost_memory_bytes` are the program's estimate of a few
//! structures. Neither says whether memory nobody counts is held by someone or kept
//! free by the allocator; this count does. Set `FLAGPOST_ALLOC_REPORT` to a file and
//! every [`REPORT_EVERY`] a line is appended with the resident set, mimalloc's committed
//! bytes and the live bytes by size (power-of-two classes). Off, it costs a predicted
//! branch per call.

mod sample;

use std::alloc::{GlobalAlloc, Layout};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use flagpost::support::heaps;

/// Often enough to follow a scale run's tenths, rarely enough to cost nothing.
const REPORT_EVERY: Duration = Duration::from_secs(5);
/// How often the resident set is looked at for a new highest...
const PEAK_POLL: Duration = Duration::from_millis(50);
/// ... reported whole when it passes the one before by this much.
const PEAK_STEP: u64 = 4 << 20;
/// The allocation sites' report is longer: one in this many lines.
const SITES_EVERY: u64 = 6;

/// Size classes by bit length: class `c` holds requests of `2^(c-1)` to `2^c - 1` bytes.
const CLASSES: usize = 48;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE_BYTES: [AtomicI64; CLASSES] = [const { AtomicI64::new(0) }; CLASSES];
static LIVE_BLOCKS: [AtomicI64; CLASSES] = [const { AtomicI64::new(0) }; CLASSES];

pub struct Counting;

fn class(size: usize) -> usize {
    ((usize::BITS - size.leading_zeros()) as usize).min(CLASSES - 1)
}

fn add(size: usize) {
    let c = class(size);
    LIVE_BYTES[c].fetch_add(size as i64, Ordering::Relaxed);
    LIVE_BLOCKS[c].fetch_add(1, Ordering::Relaxed);
}

fn sub(size: usize) {
    let c = class(size);
    LIVE_BYTES[c].fetch_sub(size as i64, Ordering::Relaxed);
    LIVE_BLOCKS[c].fetch_sub(1, Ordering::Relaxed);
}

// SAFETY: every call is passed on to mimalloc, in the heap the thread allocates in now
// (`heaps::current`) or its default; the counts only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = match heaps::current() {
            // SAFETY: a live heap (released only by the thread that sets it, outside
            // its scope); size and alignment are the layout's.
            Some(heap) => unsafe {
                libmimalloc_sys::mi_heap_malloc_aligned(heap, layout.size(), layout.align()).cast()
            },
            None => unsafe { mimalloc::MiMalloc.alloc(layout) },
        };
        if COUNTING.load(Ordering::Relaxed) && !p.is_null() {
            add(layout.size());
            sample::on_alloc(p, layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = match heaps::current() {
            // SAFETY: as in `alloc`.
            Some(heap) => unsafe {
                libmimalloc_sys::mi_heap_zalloc_aligned(heap, layout.size(), layout.align()).cast()
            },
            None => unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) },
        };
        if COUNTING.load(Ordering::Relaxed) && !p.is_null() {
            add(layout.size());
            sample::on_alloc(p, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let counting = COUNTING.load(Ordering::Relaxed);
        if counting {
            // Before the block can be handed to another thread's allocation.
            sample::on_free(ptr);
        }
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) };
        if counting {
            sub(layout.size());
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let counting = COUNTING.load(Ordering::Relaxed);
        if counting {
            sample::on_free(ptr);
        }
        let p = match heaps::current() {
            // SAFETY: `ptr` is a live block of any of mimalloc's heaps (the caller's
            // contract); one that moves goes to `heap`, live as in `alloc`.
            Some(heap) => unsafe {
                libmimalloc_sys::mi_heap_realloc_aligned(heap, ptr.cast(), new_size, layout.align())
                    .cast()
            },
            None => unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) },
        };
        if counting && !p.is_null() {
            sub(layout.size());
            add(new_size);
            sample::on_alloc(p, new_size);
        }
        p
    }
}

/// Start counting and reporting if `FLAGPOST_ALLOC_REPORT` names a file. Called first
/// thing in `main`, so what was allocated before (a few bytes) barely skews the count.
pub fn start_report() {
    let Some(path) = std::env::var_os("FLAGPOST_ALLOC_REPORT") else {
        return;
    };
    COUNTING.store(true, Ordering::Relaxed);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path);
    let mut file = match file {
        Ok(f) => f,
        Err(e) => {
            eprintln!("flagpost: cannot write the allocation report to {path:?}: {e}");
            return;
        }
    };
    let mut sites_path = path.clone();
    sites_path.push(".sites");
    let spawned = std::thread::Builder::new()
        .name("alloc-report".into())
        .spawn(move || {
            let mut highest = 0u64;
            let mut next_line = std::time::Instant::now();
            let mut lines = 0u64;
            loop {
                // A new highest resident set is reported whole when it is reached:
                // the regular lines fall anywhere on a saw and miss its top.
                let resident = flagpost::support::memory::resident_bytes();
                let peak = resident >= highest + PEAK_STEP;
                highest = highest.max(resident);
                if !peak && std::time::Instant::now() < next_line {
                    std::thread::sleep(PEAK_POLL);
                    continue;
                }
                let (now, line) = report_line();
                let tag = if peak { " peak" } else { "" };
                if writeln!(file, "{line}{tag}").is_err() {
                    return;
                }
                if peak || lines % SITES_EVERY == SITES_EVERY - 1 {
                    append(&sites_path, |f| sample::write_sites(f, now));
                }
                if !peak {
                    // After a stall (a stopped process), the next line in a period,
                    // not every missed one at once.
                    let now = std::time::Instant::now();
                    next_line = (next_line + REPORT_EVERY).max(now + PEAK_POLL);
                    lines += 1;
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("flagpost: cannot start the allocation report: {e}");
    }
}

/// Open `path` to append and write to it with `write`; a file that cannot be opened
/// is skipped.
fn append(path: &std::ffi::OsStr, write: impl FnOnce(&mut std::fs::File)) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path);
    if let Ok(mut file) = file {
        write(&mut file);
    }
}

/// `unix_secs rss_kib commit_kib live_kib c<class>=<kib>/<blocks> ...`, the classes
/// holding at least a MiB.
fn report_line() -> (u64, String) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let rss = flagpost::support::memory::resident_bytes() as usize;
    let commit = flagpost::support::memory::allocator_committed();
    let mut total = 0i64;
    let mut classes = String::new();
    for c in 0..CLASSES {
        let bytes = LIVE_BYTES[c].load(Ordering::Relaxed);
        let blocks = LIVE_BLOCKS[c].load(Ordering::Relaxed);
        total += bytes;
        if bytes >= 1 << 20 {
            classes.push_str(&format!(" c{c}={}/{blocks}", bytes >> 10));
        }
    }
    let line = format!(
        "{now} rss_kib={} commit_kib={} live_kib={}{classes}",
        rss >> 10,
        commit >> 10,
        total >> 10
    );
    (now, line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_bytes_follow_an_allocation_and_its_free() {
        COUNTING.store(true, Ordering::Relaxed);
        // A gigabyte and one byte: no other test allocates in this class, and an
        // untouched reservation costs no memory.
        let size = (1usize << 30) + 1;
        let c = class(size);
        let before = (
            LIVE_BYTES[c].load(Ordering::Relaxed),
            LIVE_BLOCKS[c].load(Ordering::Relaxed),
        );
        let held: Vec<u8> = Vec::with_capacity(size);
        let during = (
            LIVE_BYTES[c].load(Ordering::Relaxed),
            LIVE_BLOCKS[c].load(Ordering::Relaxed),
        );
        drop(held);
        let after = (
            LIVE_BYTES[c].load(Ordering::Relaxed),
            LIVE_BLOCKS[c].load(Ordering::Relaxed),
        );
        assert_eq!(during, (before.0 + size as i64, before.1 + 1));
        assert_eq!(after, before);
        let (_, line) = report_line();
        assert!(line.contains(" live_kib="), "{line}");
    }

    fn in_heap(heap: *mut libmimalloc_sys::mi_heap_t, p: *const u8) -> bool {
        // SAFETY: only reads the segment's and the page's headers of a live block.
        unsafe { libmimalloc_sys::mi_heap_contains_block(heap, p.cast()) }
    }

    /// The calling thread's own heap.
    fn own_heap() -> *mut libmimalloc_sys::mi_heap_t {
        // SAFETY: takes nothing; the heap lives as long as this thread.
        unsafe { libmimalloc_sys::mi_heap_get_default() }
    }

    /// The only test of this binary that makes heaps: the owner is process-wide.
    #[test]
    fn a_heap_serves_its_scope_and_a_block_outlives_its_release() {
        heaps::enable();
        heaps::adopt();
        let heap = heaps::Heap::default();
        let (inside, mut kept) = heaps::within(&heap, || {
            let mut grown = Vec::with_capacity(100);
            grown.resize(5000, 3u8);
            (Box::new([2u8; 300]), grown)
        });
        let outside = Box::new([1u8; 300]);
        let raw = heap.made().expect("made by the owner");
        assert!(in_heap(raw, inside.as_ptr()));
        assert!(in_heap(raw, kept.as_ptr()), "grown inside: moved within it");
        assert!(!in_heap(raw, outside.as_ptr()));
        // Elsewhere that thread's own heap serves.
        let theirs = std::thread::scope(|s| {
            s.spawn(|| {
                let b = heaps::within(&heap, || Box::new([4u8; 300]));
                assert!(in_heap(own_heap(), b.as_ptr()));
                b
            })
            .join()
            .unwrap()
        });
        assert!(!in_heap(raw, theirs.as_ptr()));
        drop(inside);
        drop(heap);
        assert!(heaps::release() >= 1);
        // A block still alive (a value a reader cloned) stays valid, now this thread's
        // own heap's.
        assert!(in_heap(own_heap(), kept.as_ptr()));
        assert!(kept.iter().all(|&b| b == 3));
        kept.resize(100_000, 5);
        assert_eq!(kept[4999..5001], [3, 5]);

        // An owner that ends (a compactor stopped, then started again on another
        // thread): mimalloc deletes its heaps as it ends, so the next owner forgets
        // them rather than deleting them again, and their blocks stay valid.
        let (outlived, ended) = std::thread::scope(|s| {
            s.spawn(|| {
                heaps::adopt();
                let heap = heaps::Heap::default();
                let block = heaps::within(&heap, || vec![7u8; 5000]);
                assert!(in_heap(
                    heap.made().expect("made by the owner"),
                    block.as_ptr()
                ));
                assert!(heap.committed() >= 5000, "its pages, walked by its owner");
                (block, heap)
            })
            .join()
            .unwrap()
        });
        heaps::adopt();
        assert_eq!(
            ended.committed(),
            0,
            "walked only by the thread that made it"
        );
        drop(ended);
        assert_eq!(heaps::retired(), 1);
        assert_eq!(heaps::release(), 1);
        assert_eq!(heaps::retired(), 0);
        assert!(outlived.iter().all(|&b| b == 7));
        drop(outlived);
    }

    #[test]
    fn a_grown_buffer_moves_to_its_new_class() {
        COUNTING.store(true, Ordering::Relaxed);
        let (small, large) = ((1usize << 29) + 3, (1usize << 31) + 5);
        let (from, to) = (class(small), class(large));
        let before = (
            LIVE_BYTES[from].load(Ordering::Relaxed),
            LIVE_BYTES[to].load(Ordering::Relaxed),
        );
        let mut held: Vec<u8> = Vec::with_capacity(small);
        held.reserve_exact(large);
        let cap = held.capacity();
        assert!(cap >= large);
        assert_eq!(LIVE_BYTES[from].load(Ordering::Relaxed), before.0);
        assert_eq!(
            LIVE_BYTES[class(cap)].load(Ordering::Relaxed),
            before.1 + cap as i64
        );
        drop(held);
        assert_eq!(LIVE_BYTES[to].load(Ordering::Relaxed), before.1);
    }
}
