//! The process-wide budget of request bytes held in memory. Every request body is
//! read within a share of it (`http::body`), so many large requests at once meet 503
//! instead of pushing the process out of memory. It lives in `app::App` beside the
//! rest of the shared state, below the HTTP layer that spends it. Also the process's
//! resident set ([`resident_bytes`]), which `/metrics` shows beside the holders.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget is counted in units of this many bytes (a semaphore has u32 permits).
const BUDGET_UNIT: usize = 1024;

/// The budget has no room for the bytes asked for, right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overloaded;

/// Memory held by request bodies, across all requests. Decoded payloads are bounded
/// separately: at most `App::heavy_decodes` large decodes run at once, each within the
/// decompressed cap.
#[derive(Clone)]
pub struct Budget(Arc<Semaphore>);

/// A request's share of the [`Budget`], returned when dropped.
#[derive(Default)]
pub struct Reservation(Option<OwnedSemaphorePermit>);

impl Budget {
    pub fn new(bytes: usize) -> Budget {
        let units = (bytes / BUDGET_UNIT).clamp(1, Semaphore::MAX_PERMITS);
        Budget(Arc::new(Semaphore::new(units)))
    }

    /// Grow `held` to cover `total` bytes, or fail without waiting.
    pub fn reserve(&self, held: &mut Reservation, total: usize) -> Result<(), Overloaded> {
        let have = held.0.as_ref().map_or(0, |p| p.num_permits());
        let want = total.div_ceil(BUDGET_UNIT);
        if want <= have {
            return Ok(());
        }
        let more = u32::try_from(want - have).map_err(|_| Overloaded)?;
        let permit = self
            .0
            .clone()
            .try_acquire_many_owned(more)
            .map_err(|_| Overloaded)?;
        match &mut held.0 {
            Some(p) => p.merge(permit),
            None => held.0 = Some(permit),
        }
        Ok(())
    }
}

/// The process's resident set in bytes, from `/proc/self/statm` (0 where there is
/// none): what `flagpost_memory_bytes`' holders are measured against.
pub fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Bytes mimalloc counts as committed, for every thread: its pages and, on a kernel
/// that overcommits, the arenas it commits whole when it reserves them (so more than
/// it has touched, and than the resident set). The allocation report prints it.
pub fn allocator_committed() -> u64 {
    let (mut elapsed, mut user, mut system) = (0, 0, 0);
    let (mut rss, mut peak_rss, mut commit, mut peak_commit, mut faults) = (0, 0, 0, 0, 0);
    // SAFETY: every argument is a valid pointer to a usize of this frame.
    unsafe {
        libmimalloc_sys::mi_process_info(
            &mut elapsed,
            &mut user,
            &mut system,
            &mut rss,
            &mut peak_rss,
            &mut commit,
            &mut peak_commit,
            &mut faults,
        );
    }
    commit as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocators_committed_bytes_count_a_block_taken_from_it() {
        // The tests' allocator is the system's: a block taken from mimalloc directly,
        // large enough that nothing else in the process can account for it.
        let size = 64 << 20;
        // SAFETY: takes nothing of ours; the block is checked below and freed once.
        let block = unsafe { libmimalloc_sys::mi_malloc(size) };
        assert!(!block.is_null());
        // SAFETY: written within the `size` bytes just allocated.
        unsafe { std::ptr::write_bytes(block.cast::<u8>(), 1, size) };
        let held = allocator_committed();
        assert!(held >= size as u64, "{held} committed holding {size}");
        // SAFETY: allocated above by mimalloc, freed once.
        unsafe { libmimalloc_sys::mi_free(block) };
    }

    #[test]
    fn budget_grows_and_returns() {
        let budget = Budget::new(10 * BUDGET_UNIT);
        let mut a = Reservation::default();
        budget.reserve(&mut a, 4 * BUDGET_UNIT).unwrap();
        budget.reserve(&mut a, 6 * BUDGET_UNIT + 1).unwrap();
        let mut b = Reservation::default();
        assert_eq!(budget.reserve(&mut b, 4 * BUDGET_UNIT), Err(Overloaded));
        budget.reserve(&mut b, 3 * BUDGET_UNIT).unwrap();
        drop(a);
        budget.reserve(&mut b, 10 * BUDGET_UNIT).unwrap();
    }

    #[test]
    fn resident_set_counts_pages_written() {
        let before = resident_bytes();
        assert!(before > 0, "the test binary has a resident set");
        // 64 MiB written page by page: resident at once, whatever else the test
        // threads free meanwhile.
        let mut held = vec![0u8; 64 << 20];
        for page in held.chunks_mut(4096) {
            page[0] = 1;
        }
        let during = resident_bytes();
        assert!(
            during >= before + (32 << 20),
            "{before} bytes before, {during} with 64 MiB written"
        );
        std::hint::black_box(&held);
    }
}
