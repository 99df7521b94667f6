//! Reading request bodies within limits: a size cap answered before reading when the
//! length is declared, a deadline for the whole body, and a process-wide budget of
//! body bytes held in memory so many large requests at once meet 503, not the OOM killer.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget is counted in units of this many bytes (a semaphore has u32 permits).
const BUDGET_UNIT: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Larger than the configured limit.
    TooLarge,
    /// Not received within the body deadline.
    Timeout,
    /// The process holds too much request data right now.
    Overloaded,
    /// The connection failed mid-body.
    Broken,
}

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
    pub fn reserve(&self, held: &mut Reservation, total: usize) -> Result<(), Error> {
        let have = held.0.as_ref().map_or(0, |p| p.num_permits());
        let want = total.div_ceil(BUDGET_UNIT);
        if want <= have {
            return Ok(());
        }
        let more = u32::try_from(want - have).map_err(|_| Error::Overloaded)?;
        let permit = self
            .0
            .clone()
            .try_acquire_many_owned(more)
            .map_err(|_| Error::Overloaded)?;
        match &mut held.0 {
            Some(p) => p.merge(permit),
            None => held.0 = Some(permit),
        }
        Ok(())
    }
}

/// Read the whole body, at most `max` bytes within `deadline`.
pub async fn read(
    body: Incoming,
    declared_len: Option<u64>,
    max: usize,
    deadline: Duration,
    budget: &Budget,
    held: &mut Reservation,
) -> Result<Bytes, Error> {
    if let Some(len) = declared_len {
        if len > max as u64 {
            // Refused before a byte of it is read.
            return Err(Error::TooLarge);
        }
        budget.reserve(held, len as usize)?;
    }
    tokio::time::timeout(deadline, collect(body, max, budget, held))
        .await
        .map_err(|_| Error::Timeout)?
}

async fn collect(
    mut body: Incoming,
    max: usize,
    budget: &Budget,
    held: &mut Reservation,
) -> Result<Bytes, Error> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| Error::Broken)?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(Error::TooLarge);
            }
            budget.reserve(held, buf.len() + data.len())?;
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
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
        assert_eq!(
            budget.reserve(&mut b, 4 * BUDGET_UNIT),
            Err(Error::Overloaded)
        );
        budget.reserve(&mut b, 3 * BUDGET_UNIT).unwrap();
        drop(a);
        budget.reserve(&mut b, 10 * BUDGET_UNIT).unwrap();
    }
}
