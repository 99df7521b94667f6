//! Reading request bodies within limits: a size cap answered before reading when the
//! length is declared, a deadline for the whole body, and a share of the process-wide
//! [`Budget`] of body bytes held in memory so many large requests at once meet 503, not
//! the OOM killer.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::support::memory::{Budget, Overloaded, Reservation};

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

impl From<Overloaded> for Error {
    fn from(_: Overloaded) -> Self {
        Error::Overloaded
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
    // A declared length (within the limit, and reserved) is made room for at once: the
    // body is copied into one buffer, not into one that doubles as frames come.
    let room = declared_len.map_or(0, |len| len as usize);
    tokio::time::timeout(deadline, collect(body, room, max, budget, held))
        .await
        .map_err(|_| Error::Timeout)?
}

async fn collect(
    mut body: Incoming,
    room: usize,
    max: usize,
    budget: &Budget,
    held: &mut Reservation,
) -> Result<Bytes, Error> {
    let mut buf = BytesMut::with_capacity(room);
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

/// A refused request's body up to this size is read and dropped before the answer, so
/// the answer reaches the client and the connection stays usable (an SDK's batch is
/// well under it). A larger one is answered at once with `Connection: close`, and the
/// lingering close ([`super::linger`]) drains what the client still sends.
pub const DISCARD_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// Read and drop the body of a refused request, at most [`DISCARD_MAX_BYTES`] within
/// `deadline`. Whether all of it was read, so the connection can be kept.
pub async fn discard(mut body: Incoming, declared_len: Option<u64>, deadline: Duration) -> bool {
    if declared_len.is_some_and(|len| len > DISCARD_MAX_BYTES) {
        return false;
    }
    let drain = async {
        let mut seen = 0u64;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return false };
            if let Ok(data) = frame.into_data() {
                seen += data.len() as u64;
                if seen > DISCARD_MAX_BYTES {
                    return false;
                }
            }
        }
        true
    };
    tokio::time::timeout(deadline, drain).await.unwrap_or(false)
}
