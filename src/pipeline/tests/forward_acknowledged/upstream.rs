//! An upstream on loopback that accepts every connection, records each request's
//! events, and answers what a test says.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// Upstream's `Retry-After` on every answer (the forwarder heeds it on a 429 or 5xx).
const RETRY_AFTER_SECONDS: &str = "600";

/// One request upstream received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub api_key: String,
    pub historical: bool,
    /// The events as sent, each its JSON text.
    pub events: Vec<String>,
    pub status: u16,
}

impl Seen {
    pub fn uuids(&self) -> Vec<String> {
        let parsed = self.events.iter().map(|e| serde_json::from_str::<Value>(e));
        parsed
            .map(|v| v.unwrap()["uuid"].as_str().unwrap().to_string())
            .collect()
    }
}

/// Upstream's answers: the next of `script` while it lasts, then 400 to a request
/// holding an event called `refused`, `failing`'s status to a request with its key,
/// and 200 to the rest.
#[derive(Default)]
pub struct Answers {
    script: VecDeque<u16>,
    pub failing: Option<(String, u16)>,
    /// A request holding the event with this uuid gets this status.
    pub holding: Option<(String, u16)>,
    /// Answer without a `Retry-After`, so the forwarder's own backoff sets the wait.
    pub no_retry_after: bool,
}

pub struct Upstream {
    pub url: String,
    pub answers: Arc<Mutex<Answers>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let answers = Arc::new(Mutex::new(Answers::default()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (a, s) = (answers.clone(), seen.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (a, s) = (a.clone(), s.clone());
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (a, s) = (a.clone(), s.clone());
                        async move {
                            let gz = BodyExt::collect(req.into_body()).await?.to_bytes();
                            let status = answer(&gz, &a, &s);
                            let body = Full::new(Bytes::from_static(b"{\"detail\":\"no\"}"));
                            let mut response = Response::builder().status(status);
                            if !a.lock().unwrap().no_retry_after {
                                // A wait far longer than any test: a retry before it
                                // is one the forwarder should not have made.
                                response = response.header("retry-after", RETRY_AFTER_SECONDS);
                            }
                            let response = response.body(body);
                            Ok::<_, hyper::Error>(response.unwrap())
                        }
                    });
                tokio::spawn(async move {
                    let http = hyper::server::conn::http1::Builder::new();
                    let _ = http.serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Upstream { url, answers, seen }
    }

    pub fn script(&self, statuses: &[u16]) {
        self.answers.lock().unwrap().script = statuses.iter().copied().collect();
    }

    pub fn fail_key(&self, key: &str, status: u16) {
        self.answers.lock().unwrap().failing = Some((key.to_string(), status));
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Every uuid of the requests upstream took (2xx), in order.
    pub fn taken(&self) -> Vec<String> {
        let seen = self.seen().into_iter().filter(|s| s.status == 200);
        seen.flat_map(|s| s.uuids()).collect()
    }
}

/// Decode a request, record it and pick its answer.
fn answer(gz: &[u8], answers: &Mutex<Answers>, seen: &Mutex<Vec<Seen>>) -> u16 {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz), &mut text).unwrap();
    let body: Value = serde_json::from_str(&text).unwrap();
    let batch = body["batch"].as_array().unwrap();
    let api_key = body["api_key"].as_str().unwrap().to_string();
    let mut a = answers.lock().unwrap();
    let status = match a.script.pop_front() {
        Some(s) => s,
        None if batch.iter().any(|e| e["event"] == "refused") => 400,
        None if a
            .holding
            .as_ref()
            .is_some_and(|(uuid, _)| batch.iter().any(|e| e["uuid"] == uuid.as_str())) =>
        {
            a.holding.as_ref().map_or(200, |(_, status)| *status)
        }
        None => match &a.failing {
            Some((key, status)) if *key == api_key => *status,
            _ => 200,
        },
    };
    seen.lock().unwrap().push(Seen {
        api_key,
        historical: body["historical_migration"].as_bool().unwrap(),
        events: batch.iter().map(Value::to_string).collect(),
        status,
    });
    status
}
