//! The process-wide budget of request bytes held in memory. Every request body is
//! read within a share of it (`http::body`), so many large requests at once meet 503
//! instead of pushing the process out of memory. It lives in `app::App` beside the
//! rest of the shared state, below the HTTP layer that spends it.

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
