//! The load generator: N keep-alive HTTP/1 connections (hyper's low-level client, no
//! pool in between), each sending requests back to back. A warm-up runs unmeasured;
//! then every request that starts and completes inside the measurement window has its
//! latency recorded. Errors are non-2xx answers and I/O failures; after an I/O failure
//! the connection is opened again, as a client library would.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_ENCODING, CONTENT_TYPE, HOST, USER_AGENT};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::payloads::Scenario;

/// After a failed connect, pause instead of spinning on a server that is down.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(10);
/// Identifies the harness in flagpost's logs.
const AGENT: &str = "flagpost-load";

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// One scenario's load, the same for every target.
pub struct Load {
    pub scenario: Scenario,
    pub bodies: Arc<[Bytes]>,
    pub connections: usize,
    pub warmup: Duration,
    pub measure: Duration,
    /// With an offered rate: the time between two requests of one connection.
    pub interval: Option<Duration>,
}

/// What one connection saw inside the measurement window.
#[derive(Default)]
struct Tally {
    /// Microseconds per successful request, in completion order.
    latencies: Vec<u32>,
    errors: u64,
}

/// The outcome of one scenario against one target.
pub struct Measurement {
    /// Microseconds per successful request, sorted.
    latencies: Vec<u32>,
    pub errors: u64,
    window: Duration,
}

impl Measurement {
    /// Successful requests per second.
    pub fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.window.as_secs_f64()
    }

    /// The latency below which `quantile` of successful requests completed, in ms.
    pub fn percentile_ms(&self, quantile: f64) -> Option<f64> {
        let last = self.latencies.len().checked_sub(1)?;
        let at = (quantile * last as f64).round() as usize;
        Some(f64::from(self.latencies[at]) / 1000.0)
    }
}

impl Load {
    /// Drive `addr` for the warm-up plus the measurement window.
    pub async fn run(&self, addr: SocketAddr) -> Measurement {
        let start = Instant::now();
        let window = (start + self.warmup, start + self.warmup + self.measure);
        let mut tasks = JoinSet::new();
        for index in 0..self.connections {
            let plan = Plan {
                addr,
                scenario: self.scenario,
                bodies: self.bodies.clone(),
                first: index,
                stride: self.connections,
                window,
                interval: self.interval,
            };
            tasks.spawn(plan.drive());
        }
        let mut latencies = Vec::new();
        let mut errors = 0;
        while let Some(joined) = tasks.join_next().await {
            let tally = joined.expect("a connection task does not panic");
            latencies.extend(tally.latencies);
            errors += tally.errors;
        }
        latencies.sort_unstable();
        Measurement {
            latencies,
            errors,
            window: self.measure,
        }
    }
}

/// One request of the scenario to `addr`, answering its status: tells whether the
/// server serves this scenario at all before load is spent on it.
pub async fn probe(addr: SocketAddr, load: &Load) -> Result<StatusCode, String> {
    let attempt = async {
        let mut sender = connect(addr).await?;
        send(
            &mut sender,
            request(load.scenario, addr, load.bodies[0].clone()),
        )
        .await
    };
    attempt
        .await
        .map_err(|e| format!("{} probe to {addr} failed: {e}", load.scenario.name()))
}

/// What one connection sends, and when it counts.
struct Plan {
    addr: SocketAddr,
    scenario: Scenario,
    bodies: Arc<[Bytes]>,
    /// Connections take interleaved bodies from the pool so they send different ones.
    first: usize,
    stride: usize,
    /// Measurement start and end.
    window: (Instant, Instant),
    interval: Option<Duration>,
}

impl Plan {
    async fn drive(self) -> Tally {
        let (from, until) = self.window;
        let mut tally = Tally::default();
        let mut next = self.first;
        // Paced connections start spread over one interval, not all at once.
        let mut ticker = self.interval.map(|every| {
            let offset = every.mul_f64(self.first as f64 / self.stride.max(1) as f64);
            tokio::time::interval_at(tokio::time::Instant::now() + offset, every)
        });
        if let Some(t) = &mut ticker {
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        'connection: while Instant::now() < until {
            let mut sender = match connect(self.addr).await {
                Ok(sender) => sender,
                Err(_) => {
                    if Instant::now() >= from {
                        tally.errors += 1;
                    }
                    tokio::time::sleep(RECONNECT_BACKOFF).await;
                    continue;
                }
            };
            loop {
                if let Some(t) = &mut ticker {
                    t.tick().await;
                }
                let started = Instant::now();
                if started >= until {
                    break 'connection;
                }
                let body = self.bodies[next % self.bodies.len()].clone();
                next += self.stride;
                let outcome = send(&mut sender, request(self.scenario, self.addr, body)).await;
                let done = Instant::now();
                let measured = started >= from;
                match outcome {
                    Ok(status) if status.is_success() => {
                        if measured && done <= until {
                            let micros = (done - started).as_micros();
                            tally.latencies.push(micros.try_into().unwrap_or(u32::MAX));
                        }
                    }
                    Ok(_) => tally.errors += u64::from(measured),
                    Err(_) => {
                        tally.errors += u64::from(measured);
                        continue 'connection;
                    }
                }
            }
        }
        tally
    }
}

pub async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, Error> {
    let stream = TcpStream::connect(addr).await?;
    // Requests are small and sent whole; Nagle's algorithm would only add delay.
    stream.set_nodelay(true)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        // Its failures surface on the sender as well, where they are counted.
        let _ = connection.await;
    });
    Ok(sender)
}

pub fn request(scenario: Scenario, addr: SocketAddr, body: Bytes) -> Request<Full<Bytes>> {
    let mut builder = Request::post(scenario.path())
        .header(HOST, addr.to_string())
        .header(USER_AGENT, AGENT)
        .header(CONTENT_TYPE, "application/json");
    if let Some(encoding) = scenario.encoding() {
        builder = builder.header(CONTENT_ENCODING, encoding);
    }
    builder
        .body(Full::new(body))
        .expect("static request parts are valid")
}

/// Send one request and read the whole answer, so the next can follow on the connection.
pub async fn send(
    sender: &mut SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Result<StatusCode, Error> {
    send_reading(sender, request)
        .await
        .map(|(status, _)| status)
}

/// [`send`], keeping the answer's body.
pub async fn send_reading(
    sender: &mut SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, Bytes), Error> {
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// GET a path and return the body as text (for `/metrics`).
pub async fn get_text(addr: SocketAddr, path: &str) -> Result<String, String> {
    let attempt = async {
        let mut sender = connect(addr).await?;
        sender.ready().await?;
        let request = Request::get(path)
            .header(HOST, addr.to_string())
            .header(USER_AGENT, AGENT)
            .body(Full::new(Bytes::new()))
            .expect("static request parts are valid");
        let response = sender.send_request(request).await?;
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, Error>(String::from_utf8_lossy(&body).into_owned())
    };
    attempt
        .await
        .map_err(|e| format!("GET {path} from {addr} failed: {e}"))
}

/// Drive `addr` with `load` while `sample` reads the server every `every`: the
/// measurement, and the readings taken inside its window (`at` tells a reading's time).
pub async fn run_sampled<S, F, Fut>(
    load: &Load,
    addr: SocketAddr,
    every: Duration,
    sample: F,
    at: impl Fn(&S) -> Instant,
) -> Result<(Measurement, Vec<S>), String>
where
    S: Send + 'static,
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<S, String>> + Send,
{
    let started = Instant::now();
    let window = (started + load.warmup, started + load.warmup + load.measure);
    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        while Instant::now() < window.1 + every {
            if let Ok(s) = sample().await {
                samples.push(s);
            }
            tokio::time::sleep(every).await;
        }
        samples
    });
    let measurement = load.run(addr).await;
    let samples = sampler.await.map_err(|e| format!("sampler failed: {e}"))?;
    let inside = samples
        .into_iter()
        .filter(|s| (window.0..=window.1).contains(&at(s)))
        .collect();
    Ok((measurement, inside))
}

/// The value of an unlabelled metric in Prometheus text.
pub fn metric_in(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Read one unlabelled metric from the server's `/metrics`.
pub async fn metric(addr: SocketAddr, name: &str) -> Result<f64, String> {
    let text = get_text(addr, "/metrics").await?;
    metric_in(&text, name).ok_or_else(|| format!("{name} missing from /metrics"))
}

/// The longest wait for a flagpost's log to empty after a measurement.
const SETTLE_LIMIT: Duration = Duration::from_secs(120);

/// Wait until a flagpost's write-ahead log is empty (its compactor idle), at most
/// `limit`; answers how long it took. An error if the metric cannot be read or the
/// log is still not empty at the limit.
pub async fn wait_for_empty_log(addr: SocketAddr, limit: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        let depth = metric(addr, "flagpost_log_depth").await?;
        if depth == 0.0 {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            return Err(format!(
                "the log still holds {depth} entries after {limit:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until a flagpost's log is empty, so the work one measurement queued does not
/// run during the next. A server without the metric (an older build) is given a
/// fixed pause instead; one that does not drain in time is measured anyway.
pub async fn settle(addr: SocketAddr) {
    if wait_for_empty_log(addr, SETTLE_LIMIT).await.is_err() {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
