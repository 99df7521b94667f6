//! Whether the console slows capture or decide: each of batch and decide measured on
//! one flagpost alone, then again while signed-in console users ask for its pages
//! back to back (flags with exposures, recent events, a person and their flags, a
//! 7-day chart, health), with no pause between requests: harder than any person
//! clicking. Reports both throughputs and what the console users got done.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, COOKIE, HOST, ORIGIN, SET_COOKIE};
use hyper::Request;

use crate::client::{self, Load, Measurement};
use crate::payloads::Scenario;
use crate::target::Target;

pub const NAME: &str = "console";
/// Console users browsing at once.
const USERS: usize = 2;
/// What each console user asks for, in turn.
const PAGES: &[&str] = &[
    "/console/api/feature_flags/?limit=1000",
    "/console/api/exposures?hours=24",
    "/console/api/events?limit=50",
    "/console/api/persons?distinct_id=user-1",
    "/console/api/person_flags?distinct_id=user-1",
    "/console/api/insights/counts?event=$pageview&interval=day&hours=168",
    "/console/api/insights/top?hours=168",
    "/console/api/health",
];

pub struct Settings {
    pub connections: usize,
    pub warmup: Duration,
    pub measure: Duration,
    /// Each console user's pause after each answer (`--console-pause-ms`): zero asks
    /// back to back; a person reading pages and the live tail (a poll every 2 s) asks
    /// about twice a second.
    pub pause: Duration,
}

pub struct Row {
    pub scenario: Scenario,
    pub alone: Measurement,
    pub beside: Measurement,
    /// Console requests answered per second during the second run, and failures.
    pub console_rate: f64,
    pub console_errors: u64,
}

pub fn run(
    runtime: &tokio::runtime::Runtime,
    settings: &Settings,
    data_dir: &Path,
    dir: &Path,
) -> Result<Vec<Row>, String> {
    let mut flagpost = Target::flagpost(data_dir, &dir.join("console-db"))?;
    let addr = flagpost.addr;
    let rows = runtime.block_on(async {
        let mut rows = Vec::new();
        for scenario in [Scenario::Batch, Scenario::Decide] {
            let load = Load {
                scenario,
                bodies: scenario.bodies().into(),
                connections: settings.connections,
                warmup: settings.warmup,
                measure: settings.measure,
                interval: None,
            };
            let alone = load.run(addr).await;
            client::settle(addr).await;
            let cookie = sign_in(addr).await?;
            let stop = Arc::new(AtomicBool::new(false));
            let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            let users: Vec<_> = (0..USERS)
                .map(|_| {
                    let (stop, done, failed) = (stop.clone(), done.clone(), failed.clone());
                    let cookie = cookie.clone();
                    tokio::spawn(browse(addr, cookie, settings.pause, stop, done, failed))
                })
                .collect();
            tokio::time::sleep(settings.warmup).await;
            let before = done.load(Ordering::Relaxed);
            let beside = load.run(addr).await;
            let answered = done.load(Ordering::Relaxed) - before;
            stop.store(true, Ordering::Relaxed);
            for u in users {
                let _ = u.await;
            }
            client::settle(addr).await;
            let window = (settings.warmup + settings.measure).as_secs_f64();
            rows.push(Row {
                scenario,
                alone,
                beside,
                console_rate: answered as f64 / window,
                console_errors: failed.load(Ordering::Relaxed),
            });
        }
        Ok::<_, String>(rows)
    })?;
    flagpost.stop()?;
    Ok(rows)
}

/// A console session's cookie, signed in with the load data dir's personal key.
pub async fn sign_in(addr: SocketAddr) -> Result<String, String> {
    let body = format!(r#"{{"key": "{}"}}"#, crate::flags::PERSONAL_KEY);
    let attempt = async {
        let mut sender = client::connect(addr).await?;
        let request = Request::post("/console/api/session")
            .header(HOST, addr.to_string())
            .header(ORIGIN, format!("http://{addr}"))
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let cookie = response
            .headers()
            .get(SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(str::to_owned);
        response.into_body().collect().await?;
        Ok::<_, client::Error>(cookie)
    };
    attempt
        .await
        .map_err(|e| format!("console sign-in failed: {e}"))?
        .ok_or_else(|| "console sign-in set no cookie".to_owned())
}

/// One console user: every page in turn, again and again, until told to stop.
async fn browse(
    addr: SocketAddr,
    cookie: String,
    pause: Duration,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
) {
    let Ok(mut sender) = client::connect(addr).await else {
        failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    for path in PAGES.iter().cycle() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let request = Request::get(*path)
            .header(HOST, addr.to_string())
            .header(COOKIE, cookie.as_str())
            .body(Full::new(Bytes::new()))
            .expect("static request parts are valid");
        match client::send(&mut sender, request).await {
            Ok(status) if status.is_success() => {
                done.fetch_add(1, Ordering::Relaxed);
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            _ => {
                failed.fetch_add(1, Ordering::Relaxed);
                match client::connect(addr).await {
                    Ok(s) => sender = s,
                    Err(_) => return,
                }
            }
        }
    }
}

pub fn report(rows: &[Row], pause: Duration) {
    println!();
    let pace = if pause.is_zero() {
        "no pause between requests".to_owned()
    } else {
        format!("{} ms between requests", pause.as_millis())
    };
    println!("console beside the load ({USERS} console users, {pace}):");
    println!(
        "{:<8} {:>14} {:>14} {:>8} {:>16}",
        "scenario", "alone req/s", "beside req/s", "change", "console req/s"
    );
    for r in rows {
        let (a, b) = (r.alone.rate(), r.beside.rate());
        println!(
            "{:<8} {:>14.0} {:>14.0} {:>7.1}% {:>10.1} ({} failed)",
            r.scenario.name(),
            a,
            b,
            (b - a) / a * 100.0,
            r.console_rate,
            r.console_errors
        );
    }
}
