//! Where the live bytes were allocated: every allocation of [`LARGE`] bytes or more and
//! one small one in [`SMALL_EVERY`] on each thread keep their call stack while they
//! live, and the report sums the sampled bytes by stack (a small sample weighted by
//! [`SMALL_EVERY`]). The stacks are raw return addresses less the executable's load
//! address, for `addr2line -f -C -i -e flagpost`: resolving them here would allocate
//! and take locks inside the allocator.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// Large buffers are few and each matters: all of them are recorded.
const LARGE: usize = 64 * 1024;
/// A prime, so a loop allocating in a fixed pattern is not always sampled at one spot.
const SMALL_EVERY: u32 = 1021;
/// Deep enough to get past `Vec`'s and `HashMap`'s own frames to their user.
const DEPTH: usize = 32;
/// Frees look here before taking the table's lock: a counter per hash of the address.
const MARKS: usize = 1 << 20;
/// The report names this many stacks, the heaviest.
const TOP: usize = 60;

static MARK: [AtomicU8; MARKS] = [const { AtomicU8::new(0) }; MARKS];
static TABLE: Mutex<Option<HashMap<usize, Sample>>> = Mutex::new(None);

struct Sample {
    size: usize,
    weight: u32,
    frames: [usize; DEPTH],
}

thread_local! {
    /// Set while this thread is inside the sampler, whose own allocations are not sampled.
    static BUSY: Cell<bool> = const { Cell::new(false) };
    static COUNTDOWN: Cell<u32> = const { Cell::new(SMALL_EVERY) };
}

extern "C" {
    fn backtrace(buffer: *mut *mut libc::c_void, size: libc::c_int) -> libc::c_int;
}

fn mark(ptr: usize) -> &'static AtomicU8 {
    &MARK[(ptr >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - 20) & (MARKS - 1)]
}

fn enter() -> bool {
    BUSY.with(|b| !b.replace(true))
}

fn leave() {
    BUSY.with(|b| b.set(false));
}

pub fn on_alloc(ptr: *mut u8, size: usize) {
    // The sampler's own allocations neither count down nor get sampled.
    if BUSY.with(Cell::get) {
        return;
    }
    let weight = if size >= LARGE {
        1
    } else {
        let due = COUNTDOWN.with(|c| {
            let left = c.get().saturating_sub(1);
            c.set(if left == 0 { SMALL_EVERY } else { left });
            left == 0
        });
        if !due {
            return;
        }
        SMALL_EVERY
    };
    if !enter() {
        return;
    }
    let mut raw = [std::ptr::null_mut::<libc::c_void>(); DEPTH];
    // SAFETY: the buffer holds DEPTH pointers.
    let n = unsafe { backtrace(raw.as_mut_ptr(), DEPTH as libc::c_int) }.max(0) as usize;
    let mut frames = [0usize; DEPTH];
    for (f, r) in frames.iter_mut().zip(&raw[..n]) {
        *f = *r as usize;
    }
    if let Ok(mut table) = TABLE.lock() {
        let sample = Sample {
            size,
            weight,
            frames,
        };
        if table
            .get_or_insert_with(HashMap::new)
            .insert(ptr as usize, sample)
            .is_none()
        {
            mark(ptr as usize).fetch_add(1, Ordering::Relaxed);
        }
    }
    leave();
}

pub fn on_free(ptr: *mut u8) {
    if mark(ptr as usize).load(Ordering::Relaxed) == 0 || !enter() {
        return;
    }
    if let Ok(mut table) = TABLE.lock() {
        if let Some(t) = table.as_mut() {
            if t.remove(&(ptr as usize)).is_some() {
                mark(ptr as usize).fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
    leave();
}

/// Write the heaviest stacks: `<bytes> <blocks> <addr> <addr> ...`, addresses relative
/// to the executable's load address.
pub fn write_sites(out: &mut impl Write, now: u64) {
    if !enter() {
        return;
    }
    let base = load_address();
    let mut sites: HashMap<[usize; DEPTH], (u64, u64)> = HashMap::new();
    if let Ok(table) = TABLE.lock() {
        for s in table.iter().flat_map(|t| t.values()) {
            let e = sites.entry(s.frames).or_default();
            e.0 += s.size as u64 * u64::from(s.weight);
            e.1 += u64::from(s.weight);
        }
    }
    let mut sites: Vec<_> = sites.into_iter().collect();
    sites.sort_by_key(|(_, (bytes, _))| std::cmp::Reverse(*bytes));
    let _ = writeln!(out, "sites {now}");
    for (frames, (bytes, blocks)) in sites.into_iter().take(TOP) {
        let mut line = format!("{bytes} {blocks}");
        for f in frames.iter().take_while(|f| **f != 0) {
            line.push_str(&format!(" {:x}", f.wrapping_sub(base)));
        }
        let _ = writeln!(out, "{line}");
    }
    leave();
}

fn load_address() -> usize {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads the address and fills the struct it is given.
    let found = unsafe { libc::dladdr(load_address as *const libc::c_void, &mut info) };
    if found == 0 {
        0
    } else {
        info.dli_fbase as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses no allocation can have (not canonical on x86-64 or aarch64): the
    /// sampler only records them, so the tests need not allocate.
    fn fake(i: usize) -> *mut u8 {
        (0x7f00_0000_0000_0000usize + i * 64) as *mut u8
    }

    fn site_of(bytes: usize) -> Option<String> {
        let mut out = Vec::new();
        write_sites(&mut out, 0);
        let text = String::from_utf8(out).unwrap();
        let prefix = format!("{bytes} 1 ");
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .map(str::to_owned)
    }

    #[test]
    fn a_large_allocation_is_kept_with_its_stack_until_freed() {
        // An odd size no real allocation of the test binary has.
        let size = 3 * LARGE + 7;
        on_alloc(fake(1), size);
        let line = site_of(size).expect("the allocation is reported");
        assert!(line.split(' ').count() > 4, "the stack has frames: {line}");
        on_free(fake(1));
        assert_eq!(site_of(size), None);
    }

    #[test]
    fn one_small_allocation_in_so_many_is_sampled_with_its_weight() {
        let calls = SMALL_EVERY as usize * 3;
        for i in 0..calls {
            on_alloc(fake(1000 + i), 24);
        }
        let sampled = |table: &HashMap<usize, Sample>| {
            (0..calls)
                .filter_map(|i| table.get(&(fake(1000 + i) as usize)))
                .inspect(|s| assert_eq!((s.size, s.weight), (24, SMALL_EVERY)))
                .count()
        };
        let count = TABLE.lock().unwrap().as_ref().map_or(0, sampled);
        assert_eq!(count, 3);
        for i in 0..calls {
            on_free(fake(1000 + i));
        }
        assert_eq!(TABLE.lock().unwrap().as_ref().map_or(0, sampled), 0);
    }
}
