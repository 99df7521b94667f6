//! Reading request bodies within limits: a size cap answered before reading when the
//! length is declared, a deadline for the whole body, and a share of the process-wide
//! [`Budget`] of body bytes held in memory so many large requests at once meet 503, not
//! the OOM killer.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::memory::{Budget, Overloaded, Reservation};

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
