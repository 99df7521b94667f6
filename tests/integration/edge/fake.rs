//! A scriptable upstream for the forwarder's tests: hyper on 127.0.0.1:0 that records
//! every `/batch/` delivery (each event's text as it came), passes it on to a real
//! flagpost when given one, and on demand answers a status (429 with Retry-After,
//! 503, 413, 400 for a poison event, 401 for a key it does not know), closes every
//! connection at once (down), is slow, or takes a batch and then resets the
//! connection without answering.

use std::collections::VecDeque;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::util::{send, Req};

/// One scripted answer, taken by the next request.
#[derive(Debug, Clone)]
pub enum Act {
    /// Answer this status (with this Retry-After), keeping nothing.
    Status(u16, Option<u64>),
    /// Keep the batch (and pass it on), then drop the connection unanswered.
    CommitThenReset,
}

/// One request that reached the fake with a body it could read.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub api_key: String,
    pub historical: bool,
    /// Each event's uuid and its exact text.
    pub events: Vec<(String, String)>,
    /// Whether it counts as delivered (kept upstream).
    pub kept: bool,
}

#[derive(Default)]
pub struct State {
    pub deliveries: Vec<Delivery>,
    pub script: VecDeque<Act>,
    /// Close every connection as soon as it is accepted, and one kept alive from
    /// before at its next request, unanswered.
    pub down: bool,
    /// A batch holding an event with one of these uuids is answered 400.
    pub poison: Vec<String>,
    /// A batch larger than this many events is answered 413.
    pub max_events: Option<usize>,
    /// Keys other than these are answered 401.
    pub keys: Option<Vec<String>>,
    /// Wait this long before answering.
    pub slow: Option<Duration>,
    /// A flagpost the kept batches are passed on to.
    pub upstream: Option<SocketAddr>,
    pub requests: usize,
}

pub struct Fake {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Deserialize)]
struct Body<'a> {
    api_key: String,
    #[serde(default)]
    historical_migration: bool,
    #[serde(borrow)]
    batch: Vec<&'a RawValue>,
}

impl Fake {
    pub fn start(upstream: Option<SocketAddr>) -> Fake {
        let state = Arc::new(Mutex::new(State {
            upstream,
            ..State::default()
        }));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let (stream, _) = tokio::select! {
                        _ = &mut stopped => return,
                        a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                    };
                    if shared.lock().unwrap().down {
                        drop(stream);
                        continue;
                    }
                    let state = shared.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let state = state.clone();
                            async move { answer(state, req).await }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        });
        Fake {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Every kept event by uuid: its texts, one per delivery of it.
    pub fn kept(&self) -> std::collections::HashMap<String, Vec<String>> {
        let mut out: std::collections::HashMap<String, Vec<String>> = Default::default();
        for d in self.with(|s| s.deliveries.clone()) {
            if d.kept {
                for (uuid, text) in d.events {
                    out.entry(uuid).or_default().push(text);
                }
            }
        }
        out
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn answer(
    state: Arc<Mutex<State>>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let gzip = req
        .headers()
        .get("content-encoding")
        .is_some_and(|v| v == "gzip");
    let raw = req
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    let mut text = Vec::new();
    if gzip {
        flate2::read::GzDecoder::new(&raw[..]).read_to_end(&mut text)?;
    } else {
        text = raw.to_vec();
    }
    let body: Body = serde_json::from_slice(&text).map_err(std::io::Error::other)?;
    let events: Vec<(String, String)> = body
        .batch
        .iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(e.get()).unwrap();
            (
                v["uuid"].as_str().unwrap_or("").to_string(),
                e.get().to_string(),
            )
        })
        .collect();
    let (act, slow, upstream) = {
        let mut s = state.lock().unwrap();
        if s.down {
            return Err(std::io::Error::other("down"));
        }
        s.requests += 1;
        let act = s.script.pop_front();
        let act = act.or_else(|| {
            if s.keys.as_ref().is_some_and(|k| !k.contains(&body.api_key)) {
                return Some(Act::Status(401, None));
            }
            if s.max_events.is_some_and(|m| events.len() > m) {
                return Some(Act::Status(413, None));
            }
            if events.iter().any(|(u, _)| s.poison.contains(u)) {
                return Some(Act::Status(400, None));
            }
            None
        });
        (act, s.slow, s.upstream)
    };
    let kept = !matches!(act, Some(Act::Status(..)));
    if kept {
        if let Some(up) = upstream {
            let forwarded = text.clone();
            let status = tokio::task::spawn_blocking(move || {
                send(up, Req::post("/batch/", forwarded)).status
            })
            .await
            .map_err(std::io::Error::other)?;
            assert_eq!(status, 200, "the upstream flagpost refused a batch");
        }
    }
    state.lock().unwrap().deliveries.push(Delivery {
        api_key: body.api_key.clone(),
        historical: body.historical_migration,
        events,
        kept,
    });
    // Slow to answer, not to keep: a batch is kept on arrival, as a server that stores
    // before it answers does, so an edge killed while it waits for the answer has still
    // delivered it (and a scripted act taken by a request is always on record).
    if let Some(d) = slow {
        tokio::time::sleep(d).await;
    }
    match act {
        None => Ok(Response::new(Full::new(Bytes::from_static(
            b"{\"status\":\"Ok\"}",
        )))),
        Some(Act::CommitThenReset) => Err(std::io::Error::other("reset after keeping the batch")),
        Some(Act::Status(code, retry)) => {
            let mut r = Response::builder().status(code);
            if let Some(secs) = retry {
                r = r.header("retry-after", secs.to_string());
            }
            let detail =
                format!("{{\"type\":\"validation_error\",\"detail\":\"scripted {code}\"}}");
            Ok(r.body(Full::new(Bytes::from(detail))).unwrap())
        }
    }
}
