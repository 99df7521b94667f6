//! A large buffer kept between the jobs that fill it (a fold's run, a chunk's journal
//! record), cleared rather than freed, so its pages stay resident and are written
//! again instead of faulted in afresh, and it never grows by doubling through the
//! sizes between (each a page of its own to make and purge with mimalloc 2; packed
//! eight or more to a 4 MiB page with mimalloc 3, where one block that stays keeps its
//! freed neighbours resident).
//!
//! A buffer is first made at `start` capacity: past 512 KiB (the largest block either
//! version of mimalloc packs with others), so it has a page of its own, reused whole. One a rare job grew past `bound`
//! is freed when handed back, so one outsized job does not pin its memory.

use std::cell::RefCell;
use std::thread::LocalKey;

/// Capacity a kept byte buffer starts at: past the largest block mimalloc packs.
pub const START_BYTES: usize = 1024 * 1024;

/// One kept buffer of `T`, its capacity counted in elements.
pub struct Reused<T> {
    kept: Vec<T>,
    start: usize,
    bound: usize,
}

impl<T> Reused<T> {
    /// Made at `start` capacity when first taken; freed when handed back above `bound`.
    pub const fn new(start: usize, bound: usize) -> Reused<T> {
        Reused {
            kept: Vec::new(),
            start,
            bound,
        }
    }

    /// The kept buffer, empty (a new one at `start` capacity if none is kept).
    pub fn take(&mut self) -> Vec<T> {
        match self.kept.capacity() {
            0 => Vec::with_capacity(self.start),
            _ => std::mem::take(&mut self.kept),
        }
    }

    /// Keep `buf` for the next [`Reused::take`], cleared; freed instead if it grew
    /// past the bound.
    pub fn give_back(&mut self, mut buf: Vec<T>) {
        buf.clear();
        if buf.capacity() <= self.bound && buf.capacity() >= self.kept.capacity() {
            self.kept = buf;
        }
    }

    /// The kept buffer's capacity, in elements (0 when none is kept).
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.kept.capacity()
    }
}

/// [`Reused::take`] of a thread's own kept buffer.
pub fn take<T: 'static>(slot: &'static LocalKey<RefCell<Reused<T>>>) -> Vec<T> {
    slot.with(|r| r.borrow_mut().take())
}

/// [`Reused::give_back`] to a thread's own kept buffer (dropped if the thread is ending).
pub fn give_back<T: 'static>(slot: &'static LocalKey<RefCell<Reused<T>>>, buf: Vec<T>) {
    let _ = slot.try_with(|r| r.borrow_mut().give_back(buf));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_kept_with_its_capacity_and_cleared() {
        let mut r = Reused::<u8>::new(64, 1024);
        let mut buf = r.take();
        assert_eq!(buf.capacity(), 64);
        buf.extend_from_slice(&[7; 500]);
        let grown = buf.capacity();
        let at = buf.as_ptr();
        r.give_back(buf);
        let again = r.take();
        assert!(again.is_empty());
        assert_eq!((again.capacity(), again.as_ptr()), (grown, at));
    }

    #[test]
    fn a_huge_job_then_a_small_one_leaves_the_capacity_under_the_bound() {
        let mut r = Reused::<u64>::new(16, 256);
        let mut buf = r.take();
        buf.resize(100_000, 1);
        r.give_back(buf);
        assert_eq!(r.capacity(), 0);
        let mut small = r.take();
        assert!(small.capacity() <= 256);
        small.extend_from_slice(&[1, 2, 3]);
        r.give_back(small);
        assert!((16..=256).contains(&r.capacity()));
    }

    #[test]
    fn the_larger_of_two_buffers_handed_back_is_kept() {
        let mut r = Reused::<u8>::new(8, 1024);
        let (mut a, b) = (r.take(), r.take());
        a.reserve(512);
        let big = a.capacity();
        r.give_back(a);
        r.give_back(b);
        assert_eq!(r.capacity(), big);
    }
}
