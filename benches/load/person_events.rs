//! A person's events through the read API, once a database is stored: the latency of
//! `GET /api/projects/1/events/?distinct_id=X&limit=100` for persons spread over the
//! whole range, one request at a time on one keep-alive connection (the console's
//! person page asks the same, by `person_id`). The disk scenario runs it before it
//! stops the server, so its figures come with the database's size.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, HOST};
use hyper::{Request, StatusCode};

use crate::client;
use crate::common::distinct_id;

/// Persons looked up: enough for a p99 that is not the single slowest.
const LOOKUPS: usize = 300;
/// A prime step through the persons, so the sample covers the range evenly.
const STRIDE: usize = 7_919;

/// The lookups' latencies, sorted, and how many events they returned in all.
pub struct Latencies {
    pub sorted: Vec<Duration>,
    pub events: usize,
}

impl Latencies {
    pub fn percentile_ms(&self, q: f64) -> f64 {
        let i = ((self.sorted.len() as f64 * q).ceil() as usize).clamp(1, self.sorted.len());
        self.sorted[i - 1].as_secs_f64() * 1e3
    }
}

pub async fn measure(addr: SocketAddr, persons: usize) -> Result<Latencies, String> {
    let fail = |e: client::Error| format!("person events: {e}");
    let mut sender = client::connect(addr).await.map_err(fail)?;
    let mut sorted = Vec::with_capacity(LOOKUPS);
    let mut events = 0;
    for i in 0..LOOKUPS {
        let who = distinct_id(i * STRIDE % persons.max(1));
        let path = format!("/api/projects/1/events/?distinct_id={who}&limit=100");
        let request = Request::get(path.as_str())
            .header(HOST, addr.to_string())
            .header(
                AUTHORIZATION,
                format!("Bearer {}", crate::flags::PERSONAL_KEY),
            )
            .body(Full::new(Bytes::new()))
            .expect("static request parts are valid");
        let started = Instant::now();
        sender.ready().await.map_err(|e| fail(e.into()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| fail(e.into()))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| fail(e.into()))?
            .to_bytes();
        sorted.push(started.elapsed());
        if status != StatusCode::OK {
            return Err(format!("person events: {path} answered {status}"));
        }
        let page: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| format!("person events: {path} is not JSON: {e}"))?;
        events += page["results"].as_array().map_or(0, Vec::len);
    }
    sorted.sort();
    Ok(Latencies { sorted, events })
}
