//! The `forward` scenario's drain phase, and the parts of the scenario every phase
//! uses: capturing a backlog, reading it, timing its drain, and the counting sink.
//!
//! A drain captures `--forward-events` into an edge of its own while upstream is
//! down, then starts upstream and times the edge's backlog down to 0. Upstream is in
//! turn what it is in this benchmark and what it stands in for: an upstream flagpost
//! as it runs by default, whose compactor (at nice 10) competes with the edge for the
//! same two cores; the same with its compactor at nice 19, which leaves the edge the
//! cores it would have if upstream were PostHog on machines of its own; and a sink in
//! this process that takes every request and only counts it (the edge's own rate).
//! With `--baseline` each drain runs with that build as the edge too, the order
//! alternating, so the builds are compared in one run.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use crate::client;
use crate::forward_cpu::{self as cpu, Threads};
use crate::payloads::{Scenario, BATCH_EVENTS};
use crate::target::{Options, Target};

/// How often the backlog is read.
const POLL: Duration = Duration::from_millis(50);
/// The longest wait for a backlog to build or drain before giving up.
pub const LIMIT: Duration = Duration::from_secs(900);
pub const BACKLOG: &str = "flagpost_upstream_forward_backlog_events";

/// What the edge forwards into.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Upstream {
    /// A flagpost as it runs by default.
    Flagpost,
    /// A flagpost whose compactor runs at nice 19.
    Nice19,
    /// The counting sink.
    Sink,
}

impl Upstream {
    pub const ALL: [Upstream; 3] = [Upstream::Flagpost, Upstream::Nice19, Upstream::Sink];

    pub fn label(self) -> &'static str {
        match self {
            Upstream::Flagpost => "an upstream flagpost (compactor at nice 10)",
            Upstream::Nice19 => "an upstream flagpost, its compactor at nice 19",
            Upstream::Sink => "a sink that only counts",
        }
    }
}

/// A backlog drained into upstream.
pub struct Drain {
    pub events: f64,
    /// From upstream's start, backoff included, and from the first delivery.
    pub from_start: Duration,
    pub from_first: Duration,
    /// How long the edge took to capture and count the backlog.
    pub built: Duration,
    /// CPU the edge's and the upstream flagpost's threads took from upstream's start
    /// until the backlog was empty (the sink's is this process's, not counted).
    pub cpu: [Threads; 2],
}

/// Every drain, each upstream in turn and each build within it, the builds' order
/// alternating; a drain that failed says why in its place.
pub fn drains(
    runtime: &tokio::runtime::Runtime,
    builds: &[(&'static str, &Path)],
    (events, connections): (usize, usize),
    data_dir: &Path,
    dir: &Path,
) -> Vec<(&'static str, Upstream, Result<Drain, String>)> {
    let bodies: Arc<[Bytes]> = Scenario::Batch.bodies().into();
    let mut out = Vec::new();
    for (n, upstream) in Upstream::ALL.into_iter().enumerate() {
        let mut order = builds.to_vec();
        if n % 2 == 1 {
            order.reverse();
        }
        for (build, binary) in order {
            let at = dir.join(format!("forward-drain-{n}-{build}"));
            let drained = runtime.block_on(drain(
                binary,
                upstream,
                (events, connections),
                &bodies,
                data_dir,
                &at,
            ));
            if let Err(e) = &drained {
                eprintln!("forward: the drain of {build} into {upstream:?} failed: {e}");
            }
            // Each drain's databases are gone before the next: 200,000 page views
            // take a few hundred MB in the two.
            let _ = std::fs::remove_dir_all(&at);
            out.push((build, upstream, drained));
        }
    }
    out
}

async fn drain(
    binary: &Path,
    upstream: Upstream,
    (events, connections): (usize, usize),
    bodies: &Arc<[Bytes]>,
    data_dir: &Path,
    dir: &Path,
) -> Result<Drain, String> {
    let listen = format!("127.0.0.1:{}", free_port()?);
    let options = Options {
        args: vec!["--upstream".into(), format!("http://{listen}")],
        env: Vec::new(),
    };
    let mut edge = Target::flagpost_with("edge", binary, data_dir, &dir.join("edge"), &options)?;
    let started = Instant::now();
    let sent = capture(edge.addr, bodies, events, connections).await?;
    wait_until(edge.addr, |backlog| backlog >= sent as f64).await?;
    let built = started.elapsed();
    let edge_before = cpu::read(edge.pid());
    let (mut target, mut sink) = (None, None);
    match upstream {
        Upstream::Sink => sink = Some(Sink::start(&listen).await?),
        Upstream::Flagpost | Upstream::Nice19 => {
            let nice = [("FLAGPOST_COMPACTOR_NICE".to_string(), "19".to_string())];
            let options = Options {
                args: Vec::new(),
                env: if upstream == Upstream::Nice19 {
                    nice.to_vec()
                } else {
                    Vec::new()
                },
            };
            let db = dir.join("upstream");
            target = Some(Target::flagpost_on(
                "upstream", binary, data_dir, &db, &listen, &options,
            )?);
        }
    }
    let upstream_before = target.as_ref().map(|t| cpu::read(t.pid()));
    let drained = time_drain(edge.addr, sent as f64, 0.0).await;
    let cpu = [
        cpu::since(&edge_before, &cpu::read(edge.pid())),
        match (&target, upstream_before) {
            (Some(t), Some(before)) => cpu::since(&before, &cpu::read(t.pid())),
            _ => Threads::new(),
        },
    ];
    if let Some(mut t) = target {
        t.stop()?;
    }
    if let Some(s) = sink {
        s.stop();
    }
    edge.stop()?;
    let (from_start, from_first) = drained?;
    Ok(Drain {
        events: sent as f64,
        from_start,
        from_first,
        built,
        cpu,
    })
}

/// An upstream that takes every request (200) and only counts requests and bytes.
pub struct Sink {
    task: tokio::task::JoinHandle<()>,
    counts: Arc<[AtomicU64; 2]>,
}

impl Sink {
    pub async fn start(listen: &str) -> Result<Sink, String> {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| format!("cannot bind the counting sink on {listen}: {e}"))?;
        let counts: Arc<[AtomicU64; 2]> = Arc::new(Default::default());
        let c = counts.clone();
        let task = tokio::spawn(async move {
            // Its connections end with it: the outage after the rounds finds it gone.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let c = c.clone();
                let service = service_fn(move |req: Request<Incoming>| {
                    let c = c.clone();
                    async move {
                        let body = req.into_body().collect().await?.to_bytes();
                        c[0].fetch_add(1, Ordering::Relaxed);
                        c[1].fetch_add(body.len() as u64, Ordering::Relaxed);
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(
                            br#"{"status":1}"#,
                        ))))
                    }
                });
                connections.spawn(async move {
                    let http = hyper::server::conn::http1::Builder::new();
                    let _ = http.serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Ok(Sink { task, counts })
    }

    /// Stop it and its connections; the requests and bytes it took.
    pub fn stop(self) -> (u64, u64) {
        self.task.abort();
        let [requests, bytes] = &*self.counts;
        (
            requests.load(Ordering::Relaxed),
            bytes.load(Ordering::Relaxed),
        )
    }
}

/// A loopback port nothing listens on now, for an upstream started later.
pub fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot bind: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("cannot read a bound address: {e}"))
}

/// Send at least `events` events as 100-event batches over `connections`; answers
/// how many were accepted.
pub async fn capture(
    addr: SocketAddr,
    bodies: &Arc<[Bytes]>,
    events: usize,
    connections: usize,
) -> Result<usize, String> {
    let requests = events.div_ceil(BATCH_EVENTS);
    let connections = connections.clamp(1, requests.max(1));
    let mut tasks = tokio::task::JoinSet::new();
    for first in 0..connections {
        let bodies = bodies.clone();
        tasks.spawn(async move {
            let mut sender = client::connect(addr).await.map_err(|e| e.to_string())?;
            let mut sent = 0;
            for n in (first..requests).step_by(connections) {
                let body = bodies[n % bodies.len()].clone();
                let status =
                    client::send(&mut sender, client::request(Scenario::Batch, addr, body))
                        .await
                        .map_err(|e| e.to_string())?;
                if !status.is_success() {
                    return Err(format!("the edge answered {status} to a batch"));
                }
                sent += BATCH_EVENTS;
            }
            Ok::<_, String>(sent)
        });
    }
    let mut sent = 0;
    while let Some(joined) = tasks.join_next().await {
        sent += joined.map_err(|e| e.to_string())??;
    }
    Ok(sent)
}

/// Wait until the backlog satisfies `done`.
pub async fn wait_until(addr: SocketAddr, done: impl Fn(f64) -> bool) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let backlog = client::metric(addr, BACKLOG).await?;
        if done(backlog) {
            return Ok(());
        }
        if started.elapsed() > LIMIT {
            return Err(format!("the backlog is {backlog} after {LIMIT:?}"));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Time a backlog of `from` events draining to at most `floor`: from now (upstream
/// just started) and from the first delivery.
pub async fn time_drain(
    addr: SocketAddr,
    from: f64,
    floor: f64,
) -> Result<(Duration, Duration), String> {
    let started = Instant::now();
    let mut first = None;
    loop {
        let backlog = client::metric(addr, BACKLOG).await?;
        let now = Instant::now();
        if first.is_none() && backlog < from {
            first = Some(now);
        }
        if backlog <= floor {
            let first = first.unwrap_or(now);
            return Ok((now - started, now - first));
        }
        if started.elapsed() > LIMIT {
            let delivered = match first {
                Some(t) => format!("{:.0} s after the first delivery", (now - t).as_secs_f64()),
                None => "never below where it started".into(),
            };
            return Err(format!(
                "the backlog is still {backlog:.0} (from {from:.0}, drained means at most {floor:.0}) after {LIMIT:?}, {delivered}"
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}
