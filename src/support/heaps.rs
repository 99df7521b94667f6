//! A heap of its own for what is freed together: each layered table's active map
//! (its nodes, long keys, and the values the chunks make for it) from the freeze
//! that starts it to the drop of that map once folded ([`crate::store::layered::delta`]).
//! mimalloc fills a page with blocks of one size for whichever thread asks, and a
//! page goes back only once every block in it is free: a map's blocks among longer-
//! lived ones (sled's node copies, the caches' offsets) leave holes when the map is
//! folded. In a heap of its own a folded map's pages are wholly free and go back
//! when the heap is released; a block still alive then (a value a reader cloned) is
//! moved with its page to the owner thread's own heap and freed there as ever. One
//! heap for all the tables' maps was tried and not kept: they fold at different
//! times, so the freed memory moved into it (`BENCHMARKS.md`).
//!
//! The code that allocates for a map names its [`Heap`] with [`within`]; the binary's
//! allocator serves the thread's allocations meanwhile from it ([`current`]). Frees
//! need nothing: mimalloc finds a block's page from its address.
//!
//! Only one thread allocates in these heaps, the *owner* ([`adopt`]: the compactor,
//! which makes the chunks' values and writes the maps), and it alone releases them
//! ([`release`]) or counts their pages ([`Heap::committed`]): a mimalloc 2 heap
//! belongs to the thread that made it, which alone may allocate in it, walk it or
//! delete it (any thread may free into it). When that thread ends, mimalloc deletes
//! its heaps itself (their live blocks move to the heaps it leaves behind), so a heap
//! made by an owner that has ended is only forgotten. On any other thread (a fold
//! putting back what it left, a start replaying the journal, a background build)
//! [`within`] changes nothing. Nor does it without the binary's allocator ([`enable`];
//! the tests use the system's).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use libmimalloc_sys::mi_heap_t;

use super::sync::lock;

static ENABLED: AtomicBool = AtomicBool::new(false);
/// The owner thread's [`me`], 0 for none.
static OWNER: AtomicUsize = AtomicUsize::new(0);
/// Heaps dropped and not yet released: (owner, heap).
static RETIRED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
static RETIRED_COUNT: AtomicUsize = AtomicUsize::new(0);

/// The number the next thread to ask gets from [`me`].
static NEXT_THREAD: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    static CURRENT: Cell<*mut mi_heap_t> = const { Cell::new(std::ptr::null_mut()) };
    static ME: Cell<usize> = const { Cell::new(0) };
}

/// This thread, by a number no other thread of the process is given, ended ones
/// included (a thread-local's address is reused by a later thread, whose heaps are not
/// the ended one's).
fn me() -> usize {
    ME.with(|m| {
        if m.get() == 0 {
            m.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
        }
        m.get()
    })
}

/// The binary's allocator serves [`current`]: heaps are made from now on.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// The calling thread becomes the one that allocates in the heaps and releases them.
/// Heaps made by a thread before (one that has ended: the compactor is started again
/// only after the last one stopped) are released by the next [`release`].
pub fn adopt() {
    OWNER.store(me(), Ordering::Relaxed);
}

/// The heap this thread allocates in now, if not the main one.
#[inline]
pub fn current() -> Option<*mut mi_heap_t> {
    let heap = CURRENT.with(Cell::get);
    (!heap.is_null()).then_some(heap)
}

/// A heap for blocks freed together, made by its owner's first [`within`] and
/// released once dropped (by the owner's next [`release`]).
#[derive(Default)]
pub struct Heap {
    /// (owner, heap), the heap null if mimalloc could not make one.
    made: OnceLock<(usize, usize)>,
}

impl Heap {
    /// The heap, if this thread may allocate in it.
    fn here(&self) -> Option<*mut mi_heap_t> {
        if !ENABLED.load(Ordering::Relaxed) {
            return None;
        }
        let me = me();
        if OWNER.load(Ordering::Relaxed) != me {
            return None;
        }
        let &(owner, heap) = self.made.get_or_init(|| {
            // SAFETY: mi_heap_new takes nothing; its own bookkeeping is allocated by
            // mimalloc directly, not through this process's allocator.
            let heap = unsafe { libmimalloc_sys::mi_heap_new() } as usize;
            (me, heap)
        });
        (owner == me && heap != 0).then_some(heap as *mut mi_heap_t)
    }

    /// mimalloc's heap, once made (tests).
    pub fn made(&self) -> Option<*mut mi_heap_t> {
        let &(_, heap) = self.made.get()?;
        (heap != 0).then_some(heap as *mut mi_heap_t)
    }

    /// Bytes committed in this heap's pages, counted on the thread that made it (0
    /// elsewhere, or if never made): only that thread may walk it. There it is live: a
    /// heap is released once its `Heap` is dropped, or deleted once that thread ends.
    pub fn committed(&self) -> u64 {
        let Some(&(owner, heap)) = self.made.get() else {
            return 0;
        };
        if heap == 0 || owner != me() {
            return 0;
        }
        let mut bytes = 0u64;
        visit_heap_pages(heap as *mut mi_heap_t, &mut |area| {
            bytes += area.committed as u64
        });
        bytes
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        if let Some(&(owner, heap)) = self.made.get() {
            if heap != 0 {
                lock(&RETIRED).push((owner, heap));
                RETIRED_COUNT.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Run `f` with this thread's allocations in `heap` (on its owner; elsewhere `f` runs
/// as it is). The heap before is restored after, also when `f` panics.
pub fn within<R>(heap: &Heap, f: impl FnOnce() -> R) -> R {
    struct Restore(*mut mi_heap_t);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let Some(heap) = heap.here() else {
        return f();
    };
    let _restore = Restore(CURRENT.with(|c| c.replace(heap)));
    f()
}

/// Release the heaps dropped since the last call: their pages' frees collected, the
/// wholly free pages handed back, a page with a block still alive moved to the
/// thread's own heap. Called by the owner between its chunks, so none of its own frees
/// is under way. Heaps an ended owner made were deleted by mimalloc as it ended: they
/// are forgotten. Returns how many were released or forgotten.
pub fn release() -> usize {
    if RETIRED_COUNT.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    let (me, owner) = (me(), OWNER.load(Ordering::Relaxed));
    let mine: Vec<(usize, usize)> = {
        let mut retired = lock(&RETIRED);
        let mut mine = Vec::new();
        retired.retain(|&(by, heap)| {
            // A heap of a thread that is not the owner any more: that thread ended.
            let take = by == me || by != owner;
            if take {
                mine.push((by, heap));
            }
            !take
        });
        RETIRED_COUNT.store(retired.len(), Ordering::Relaxed);
        mine
    };
    for &(by, heap) in &mine {
        if by != me {
            // Its thread ended, and mimalloc deleted the heap then.
            continue;
        }
        let heap = heap as *mut mi_heap_t;
        // SAFETY: this thread made the heap with mi_heap_new and releases it once
        // (taken out of RETIRED above); nothing allocates in it any more (its `Heap`
        // was dropped), and this thread's own frees come before or after. The forced
        // collect first takes in the other threads' frees, so a page they emptied is
        // freed rather than moved; the delete moves a page still holding a live block
        // to this thread's own heap, where that block stays valid.
        unsafe {
            libmimalloc_sys::mi_heap_collect(heap, true);
            libmimalloc_sys::mi_heap_delete(heap);
        }
    }
    mine.len()
}

/// Heaps dropped and not yet released (tests, reports).
pub fn retired() -> usize {
    RETIRED_COUNT.load(Ordering::Relaxed)
}

/// Call `f` with each page (an area) of `heap`, made by the calling thread, which must
/// stay live meanwhile.
fn visit_heap_pages(
    heap: *mut libmimalloc_sys::mi_heap_t,
    f: &mut dyn FnMut(&libmimalloc_sys::mi_heap_area_t),
) {
    unsafe extern "C" fn each(
        _heap: *const libmimalloc_sys::mi_heap_t,
        area: *const libmimalloc_sys::mi_heap_area_t,
        _block: *mut libc::c_void,
        _size: usize,
        arg: *mut libc::c_void,
    ) -> bool {
        // SAFETY: mimalloc passes a valid area, and `arg` is the `f` below.
        let (area, f) = unsafe {
            (
                &*area,
                &mut *(arg as *mut &mut dyn FnMut(&libmimalloc_sys::mi_heap_area_t)),
            )
        };
        f(area);
        true
    }
    let mut f = f;
    // SAFETY: the heap is this thread's and live (the caller's contract); `f` outlives
    // the call.
    unsafe {
        libmimalloc_sys::mi_heap_visit_blocks(
            heap,
            false,
            Some(each),
            &mut f as *mut &mut dyn FnMut(&libmimalloc_sys::mi_heap_area_t) as *mut libc::c_void,
        );
    }
}
