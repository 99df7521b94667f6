//! Allocations kept apart by how long they live. mimalloc fills a page with blocks of
//! one size for whichever thread asks; a page goes back to the kernel only once every
//! block in it is free. When a few long-lived blocks (a cached block, a run's index)
//! land among the short-lived ones of a busy thread (a fold's buffers, a batch's
//! rows), each keeps its page resident after the rest are freed: at 5 M events that
//! was about 100 MiB of freed memory nobody held.
//!
//! So the code that makes something meant to stay names its [`Place`] with
//! [`within`], and the binary's allocator ([`heap`]) serves those allocations from a
//! mimalloc heap of their own, whose pages hold only their kind: a cache's evicted
//! block leaves a hole the next cached block fills, and the deltas' maps, freed
//! whole at each fold, free their pages whole. Frees need nothing: mimalloc finds a
//! block's page from its address. Without the binary's allocator (the tests), a place
//! changes nothing.

use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, Ordering};

use libmimalloc_sys::mi_heap_t;

/// Where an allocation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The default: everything not said otherwise.
    Main = 0,
    /// Kept until evicted or replaced: the caches' blocks, runs' indexes and filters.
    Kept = 1,
    /// A table's delta, freed whole by the fold that writes it out.
    Delta = 2,
}

/// The places with a heap of their own, and their names in reports.
pub const APART: [(Place, &str); 2] = [(Place::Kept, "kept"), (Place::Delta, "delta")];

static HEAPS: [AtomicPtr<mi_heap_t>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];

thread_local! {
    static PLACE: Cell<Place> = const { Cell::new(Place::Main) };
}

/// Run `f` with its allocations (on this thread) in `place`; the place before is
/// restored after, also when `f` panics.
pub fn within<R>(place: Place, f: impl FnOnce() -> R) -> R {
    struct Restore(Place);
    impl Drop for Restore {
        fn drop(&mut self) {
            PLACE.with(|p| p.set(self.0));
        }
    }
    let _restore = Restore(PLACE.with(|p| p.replace(place)));
    f()
}

/// The place this thread allocates in now.
pub fn current() -> Place {
    PLACE.with(Cell::get)
}

/// The heap for this thread's allocations now: None for the main heap (the
/// allocator's default path). The heaps are made on first use and never freed.
pub fn heap() -> Option<*mut mi_heap_t> {
    let place = current();
    if place == Place::Main {
        return None;
    }
    let slot = &HEAPS[place as usize];
    let heap = slot.load(Ordering::Acquire);
    if !heap.is_null() {
        return Some(heap);
    }
    // SAFETY: mi_heap_new takes nothing and allocates its own metadata internally
    // (not through this process's global allocator, so no recursion).
    let made = unsafe { libmimalloc_sys::mi_heap_new() };
    if made.is_null() {
        return None;
    }
    match slot.compare_exchange(
        std::ptr::null_mut(),
        made,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => Some(made),
        Err(theirs) => {
            // SAFETY: `made` is ours alone and has never allocated.
            unsafe { libmimalloc_sys::mi_heap_delete(made) };
            Some(theirs)
        }
    }
}

/// The heaps made so far, with their places' names.
pub fn made() -> impl Iterator<Item = (&'static str, *mut mi_heap_t)> {
    APART.iter().filter_map(|&(place, name)| {
        let heap = HEAPS[place as usize].load(Ordering::Acquire);
        (!heap.is_null()).then_some((name, heap))
    })
}

/// Hand back what this thread freed in every heap (`mi_collect` does the main one).
pub fn collect() {
    for (_, heap) in made() {
        // SAFETY: the heap was made by mi_heap_new and is never deleted.
        unsafe { libmimalloc_sys::mi_heap_collect(heap, true) };
    }
}

/// Bytes in mimalloc's pages, over every heap: committed, and used by live blocks (as
/// the allocator rounds them). Committed less used is freed memory the allocator
/// keeps in pages still partly in use (or kept empty for reuse): its share of the
/// resident set. Zero when mimalloc is not the allocator (the tests).
pub fn pages() -> (u64, u64) {
    let mut sums = (0u64, 0u64);
    visit(&mut |_, area| {
        sums.0 += area.committed as u64;
        sums.1 += (area.used * area.full_block_size) as u64;
    });
    sums
}

/// Call `f` with each page (an area) of every heap, and the name of its heap ("main"
/// for the default one). Other threads allocating meanwhile make a page's counts
/// approximate, never invalid: only page headers are read, and mimalloc never unmaps
/// them (a purge zeroes them).
pub fn visit(f: &mut dyn FnMut(&str, &libmimalloc_sys::mi_heap_area_t)) {
    struct Arg<'a> {
        name: &'a str,
        f: &'a mut dyn FnMut(&str, &libmimalloc_sys::mi_heap_area_t),
    }
    unsafe extern "C" fn each(
        _heap: *const mi_heap_t,
        area: *const libmimalloc_sys::mi_heap_area_t,
        _block: *mut libc::c_void,
        _size: usize,
        arg: *mut libc::c_void,
    ) -> bool {
        // SAFETY: mimalloc passes a valid area, and `arg` is the `Arg` below.
        let (area, arg) = unsafe { (&*area, &mut *(arg as *mut Arg<'_>)) };
        (arg.f)(arg.name, area);
        true
    }
    let heaps = std::iter::once(("main", std::ptr::null_mut())).chain(made());
    for (name, heap) in heaps {
        let mut arg = Arg { name, f: &mut *f };
        // SAFETY: a null heap is the main heap; `arg` outlives the call.
        unsafe {
            libmimalloc_sys::mi_heap_visit_blocks(
                heap,
                false,
                Some(each),
                &mut arg as *mut Arg<'_> as *mut libc::c_void,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_holds_for_its_closure_and_is_restored() {
        assert_eq!(current(), Place::Main);
        let inner = within(Place::Kept, || {
            let nested = within(Place::Delta, current);
            (current(), nested)
        });
        assert_eq!(inner, (Place::Kept, Place::Delta));
        assert_eq!(current(), Place::Main);
        let caught = std::panic::catch_unwind(|| within(Place::Delta, || panic!("inside")));
        assert!(caught.is_err());
        assert_eq!(current(), Place::Main, "restored after a panic");
    }

    #[test]
    fn a_place_apart_gets_a_heap_of_its_own_and_its_pages_are_seen() {
        assert!(heap().is_none(), "the main place uses the default path");
        let kept = within(Place::Kept, heap).unwrap();
        assert_eq!(within(Place::Kept, heap), Some(kept), "made once");
        let delta = within(Place::Delta, heap).unwrap();
        assert_ne!(kept, delta);
        // Blocks taken straight from the heap (the tests' allocator is the system's).
        let size = 3000;
        // SAFETY: the heap is live; each block is freed below.
        let blocks: Vec<_> = (0..10)
            .map(|_| unsafe { libmimalloc_sys::mi_heap_malloc(kept, size) })
            .collect();
        let mut seen = 0;
        visit(&mut |name, area| {
            if name == "kept" && area.block_size >= size {
                seen += area.used;
            }
        });
        assert!(seen >= 10, "{seen} blocks seen in the kept heap's pages");
        let (committed, used) = pages();
        assert!(committed >= used && used >= 10 * size as u64);
        for b in blocks {
            // SAFETY: each was allocated above and is freed once.
            unsafe { libmimalloc_sys::mi_free(b) };
        }
    }
}
