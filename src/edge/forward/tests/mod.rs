//! Delivering one request against a small upstream on loopback that refuses what a
//! test says: bisecting a 400 down to the one event, splitting a 413, dead-lettering
//! a single event still too large, and waiting on a 503 with the same run kept.

mod encoding;
mod retry;
mod window;

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use super::batch::Lines;
use super::dead::{DeadLetters, DEAD_LETTER};
use super::deliver::{deliver, Ended, Pending, Target};
use crate::edge::{Client, Stats};

/// Answers 400 to a batch holding `"poison"`, 413 to one of more than `max` events,
/// `status` otherwise; records each request's event count.
async fn upstream(max: usize, status: u16) -> (String, Arc<Mutex<Vec<usize>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let log = log.clone();
                        async move {
                            let gz = req.into_body().collect().await?.to_bytes();
                            let mut text = String::new();
                            std::io::Read::read_to_string(
                                &mut flate2::read::GzDecoder::new(&gz[..]),
                                &mut text,
                            )
                            .unwrap();
                            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                            let n = v["batch"].as_array().unwrap().len();
                            log.lock().unwrap().push(n);
                            let code = if text.contains("poison") {
                                400
                            } else if n > max {
                                413
                            } else {
                                status
                            };
                            Ok::<_, hyper::Error>(
                                Response::builder()
                                    .status(code)
                                    .body(Full::new(Bytes::from_static(b"{\"detail\":\"no\"}")))
                                    .unwrap(),
                            )
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), seen)
}

fn lines(n: usize, poison: Option<usize>, big: Option<usize>) -> Lines {
    let mut lines = Lines::new();
    for i in 0..n {
        let name = if Some(i) == poison { "poison" } else { "e" };
        let pad = if Some(i) == big {
            "x".repeat(100)
        } else {
            String::new()
        };
        let uuid = uuid::Uuid::from_u128(i as u128);
        let json = format!(r#"{{"uuid":"{uuid}","event":"{name}","properties":{{"p":"{pad}"}}}}"#);
        lines.push(uuid, 0, json.as_bytes());
    }
    lines
}

async fn run(url: &str, dir: &std::path::Path, lines: &Lines, stats: &Stats) -> (Ended, Pending) {
    let client = Client::new(url).unwrap();
    // A new one each run, as after a restart: it reads what the file holds.
    let dead = Arc::new(DeadLetters::new(dir));
    let target = Target {
        client: &client,
        stats,
        dead: &dead,
        project: 1,
        api_key: "phc_k",
        historical: false,
    };
    let events: Vec<usize> = (0..lines.len()).collect();
    let mut pending: Pending = std::iter::once(0..events.len()).collect();
    let ended = deliver(&target, lines, &events, &mut pending, None).await;
    (ended, pending)
}

fn dead_letters(dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join(DEAD_LETTER))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn a_400_is_bisected_down_to_the_one_refused_event() {
    let dir = tempfile::tempdir().unwrap();
    let (url, seen) = upstream(usize::MAX, 200).await;
    let stats = Stats::default();
    let (ended, pending) = run(&url, dir.path(), &lines(16, Some(5), None), &stats).await;
    assert_eq!((ended, pending.len()), (Ended::Done, 0));
    let letters = dead_letters(dir.path());
    assert_eq!(letters.len(), 1);
    assert_eq!(
        letters[0]["event"]["uuid"],
        uuid::Uuid::from_u128(5).to_string()
    );
    assert_eq!(letters[0]["reason"], "400 no");
    assert_eq!(stats.dead_letters.get(), 1);
    // Halves in order, the refused half halved again: 16 and 8 refused, 4 taken, 4
    // and 2 refused, 1 taken, 1 dead-lettered, then the untried halves taken.
    assert_eq!(*seen.lock().unwrap(), [16, 8, 4, 4, 2, 1, 1, 2, 8]);
    // The same request bisected again, as after a crash cut it short: the event is
    // refused again and kept once.
    let again = Stats::default();
    let (ended, _) = run(&url, dir.path(), &lines(16, Some(5), None), &again).await;
    assert_eq!(ended, Ended::Done);
    assert_eq!(dead_letters(dir.path()).len(), 1);
    assert_eq!(again.dead_letters.get(), 0);
}

#[tokio::test]
async fn a_413_splits_and_a_single_event_too_large_is_dead_lettered() {
    let dir = tempfile::tempdir().unwrap();
    // At most 3 events a request; one event is refused as too large on its own.
    let (url, seen) = upstream(3, 200).await;
    let stats = Stats::default();
    let (ended, _) = run(&url, dir.path(), &lines(8, None, None), &stats).await;
    assert_eq!(ended, Ended::Done);
    assert!(dead_letters(dir.path()).is_empty());
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.iter().filter(|n| **n <= 3).sum::<usize>(),
        8,
        "{seen:?}"
    );
    let (url, _) = upstream(0, 200).await;
    let (ended, _) = run(&url, dir.path(), &lines(2, None, None), &stats).await;
    assert_eq!(ended, Ended::Done);
    let letters = dead_letters(dir.path());
    assert_eq!(letters.len(), 2);
    assert!(letters[0]["reason"].as_str().unwrap().starts_with("413"));
}

#[tokio::test]
async fn a_503_keeps_the_run_for_the_next_try() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _) = upstream(usize::MAX, 503).await;
    let stats = Stats::default();
    let (ended, pending) = run(&url, dir.path(), &lines(4, None, None), &stats).await;
    let retry = Ended::Retry {
        after: None,
        unreachable: false,
    };
    assert_eq!(ended, retry);
    assert_eq!(pending.first(), Some(&(0..4)));
    assert_eq!(pending.len(), 1);
    let (ended, _) = run(&url, dir.path(), &lines(4, None, Some(0)), &stats).await;
    assert_eq!(ended, retry);
    assert!(dead_letters(dir.path()).is_empty());
}

#[tokio::test]
async fn an_upstream_nothing_listens_on_is_told_apart_as_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let stats = Stats::default();
    let (ended, pending) = run(&url, dir.path(), &lines(4, None, None), &stats).await;
    let retry = Ended::Retry {
        after: None,
        unreachable: true,
    };
    assert_eq!(ended, retry);
    assert_eq!(pending.first(), Some(&(0..4)));
    assert_eq!(pending.len(), 1);
}

/// A forwarder over `trees` and `outbox` sending to `url`, project 1 keyed `phc_k`,
/// nothing historical for a day: the set-up the window and retry tests share.
fn forwarder_over(
    dir: &std::path::Path,
    trees: &crate::store::Trees,
    outbox: crate::store::outbox::Outbox,
    url: &str,
) -> super::Forwarder {
    let projects =
        crate::projects::Projects::parse(br#"{"projects":[{"id":1,"api_key":"phc_k"}]}"#).unwrap();
    super::Forwarder::new(
        Client::new(url).unwrap(),
        outbox,
        trees.events.clone(),
        trees.blocks.clone(),
        Arc::new(arc_swap::ArcSwap::from_pointee(projects)),
        Stats::default(),
        dir.to_path_buf(),
        std::time::Duration::from_secs(86_400),
    )
}
