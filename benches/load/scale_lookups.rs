//! The scale scenario's lookups, once the log is empty: a person's (each time another
//! person, spread over the id space), then the read API's and the console's pages of
//! issue 38, each asked the same way each time (as a page open in a browser asks it):
//! events by name, persons, insights, the flags list and a flag's page, and events and
//! persons searched by a property. A flag is made through the API first, as an
//! operator makes one in the console, so its page has rules and history to show.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::Request;

use crate::scale_events::{user_id, Traffic};
use crate::{client, flags, threads};

/// The flag the lookups make and whose page they read.
const FLAG_KEY: &str = "scale-rollout";

/// Lookups of each kind, each for a different person, one after another.
const LOOKUPS: usize = 500;
/// A kind of lookup stops after this long with the lookups it made: a person's events
/// still reads every block before it (seconds each at millions of events).
const LOOKUP_BUDGET: Duration = Duration::from_secs(60);

/// The name tokio gives the server's runtime threads, the ones answering requests
/// and its blocking pool.
const REQUEST_THREADS: &str = "tokio-rt-worker";

pub struct Latency {
    pub what: &'static str,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub errors: usize,
    /// Lookups made (fewer than `LOOKUPS` when the budget ran out).
    pub count: usize,
    /// CPU seconds the server's threads other than the request runtime's used while
    /// these lookups ran (a fold, an index build), by thread name.
    pub beside: Vec<(String, f64)>,
}

/// What is looked up, to see which pages grow with the database: events of a name most
/// events have, of a rarer one (one in twenty), of a rare one (one in two hundred, all
/// sent early in the run), of a name no event has, and of a name and a person at once;
/// the console's flag pages; searches by a property that many match and that few do,
/// and the read API's `properties` filter by an event's key and by a person's.
const KINDS: &[&str] = &[
    "person by distinct id",
    "a person's events",
    "/decide, stored person",
    "events, newest 100",
    "events named $pageview",
    "events named $identify",
    "events named $create_alias",
    "events of a name none has",
    "a person's $identify",
    "console events, $create_alias",
    "persons, first 100",
    "console persons, newest",
    "console insights, 7 days",
    "console top events, 7 days",
    "console events, $pageview",
    "console events, $current_url contains billing",
    "console events, alias is set",
    "API events, alias is set",
    "API $pageviews, person's plan is pro",
    "console persons, email of one",
    "console persons, plan is pro",
    "console flags list",
    "console flag, its rules",
    "console flag, its history",
    "console flag, exposures 7 days",
    "console flag, who it reaches",
];

/// The request of lookup `kind` for the person of distinct id `id`; `flag` is the
/// made flag's id.
fn lookup_request(
    kind: &str,
    id: &str,
    cookie: &str,
    flag: i64,
) -> hyper::http::Result<Request<Full<Bytes>>> {
    let bearer = format!("Bearer {}", flags::PERSONAL_KEY);
    let api = |path: String| {
        Request::get(path)
            .header(AUTHORIZATION, &bearer)
            .body(Full::new(Bytes::new()))
    };
    let console = |path: &str| {
        Request::get(path)
            .header(hyper::header::COOKIE, cookie)
            .body(Full::new(Bytes::new()))
    };
    match kind {
        "person by distinct id" => api(format!("/api/projects/1/persons/?distinct_id={id}")),
        "a person's events" => api(format!(
            "/api/projects/1/events/?distinct_id={id}&limit=100"
        )),
        "/decide, stored person" => Request::post("/decide/?v=3")
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(
                serde_json::json!({"token": flags::API_KEY, "distinct_id": id}).to_string(),
            ))),
        "events, newest 100" => api("/api/projects/1/events/?limit=100".into()),
        "events named $pageview" => {
            api("/api/projects/1/events/?event=%24pageview&limit=100".into())
        }
        "events named $identify" => {
            api("/api/projects/1/events/?event=%24identify&limit=100".into())
        }
        "events named $create_alias" => {
            api("/api/projects/1/events/?event=%24create_alias&limit=100".into())
        }
        "a person's $identify" => api(format!(
            "/api/projects/1/events/?distinct_id={id}&event=%24identify&limit=100"
        )),
        "console events, $create_alias" => {
            console("/console/api/events?event=%24create_alias&limit=50")
        }
        "events of a name none has" => {
            api("/api/projects/1/events/?event=none-has-it&limit=100".into())
        }
        "persons, first 100" => api("/api/projects/1/persons/?limit=100".into()),
        "console persons, newest" => console("/console/api/persons?limit=50"),
        "console insights, 7 days" => {
            console("/console/api/insights/counts?event=$pageview&interval=day&hours=168")
        }
        "console top events, 7 days" => console("/console/api/insights/top?hours=168"),
        "console events, $pageview" => console("/console/api/events?event=%24pageview&limit=50"),
        "console events, $current_url contains billing" => console(
            "/console/api/events?property=%24current_url&operator=icontains&value=billing&limit=50",
        ),
        "console events, alias is set" => {
            console("/console/api/events?property=alias&operator=is_set&limit=50")
        }
        // `properties=[{"key":"alias","operator":"is_set"}]`
        "API events, alias is set" => api(
            "/api/projects/1/events/?limit=100&properties=%5B%7B%22key%22%3A%22alias%22%2C\
             %22operator%22%3A%22is_set%22%7D%5D"
                .into(),
        ),
        // `properties=[{"key":"plan","value":"pro","type":"person"}]`
        "API $pageviews, person's plan is pro" => api(
            "/api/projects/1/events/?event=%24pageview&limit=100&properties=%5B%7B%22key%22%3A\
             %22plan%22%2C%22value%22%3A%22pro%22%2C%22type%22%3A%22person%22%7D%5D"
                .into(),
        ),
        "console persons, email of one" => console(&format!(
            "/console/api/persons?property=email&operator=icontains&value={id}%40&limit=50"
        )),
        "console persons, plan is pro" => {
            console("/console/api/persons?property=plan&operator=exact&value=pro&limit=50")
        }
        "console flags list" => console("/console/api/feature_flags/?limit=1000"),
        "console flag, its rules" => console(&format!("/console/api/feature_flags/{flag}/")),
        "console flag, its history" => console(&format!(
            "/console/api/feature_flags/{flag}/activity/?limit=20"
        )),
        "console flag, exposures 7 days" => console(&format!(
            "/console/api/flag_exposures?key={FLAG_KEY}&interval=day&hours=168"
        )),
        _ => console(&format!("/console/api/flag_reach?key={FLAG_KEY}")),
    }
}

/// `LOOKUPS` of each of [`KINDS`], each within [`LOOKUP_BUDGET`].
pub async fn lookups(
    addr: SocketAddr,
    pid: u32,
    traffic: &Traffic,
) -> Result<Vec<Latency>, String> {
    let mut sender = client::connect(addr).await.map_err(|e| e.to_string())?;
    let cookie = crate::console::sign_in(addr).await?;
    // Without the flag its pages answer errors, counted as such; the rest still runs.
    let flag = make_flag(addr).await.unwrap_or_else(|e| {
        eprintln!("scale: {e}");
        0
    });
    let mut out = Vec::new();
    for &what in KINDS {
        let mut times = Vec::with_capacity(LOOKUPS);
        let mut errors = 0;
        let threads_before = threads::sample(pid)?;
        let began = Instant::now();
        for n in 0..LOOKUPS as u64 {
            if began.elapsed() > LOOKUP_BUDGET {
                break;
            }
            let person = (n * 7_919 + 13) % traffic.persons;
            let id = user_id(person);
            let mut request =
                lookup_request(what, &id, &cookie, flag).expect("static request parts are valid");
            request.headers_mut().insert(
                HOST,
                addr.to_string()
                    .parse()
                    .expect("an address is a valid header"),
            );
            let at = Instant::now();
            match client::send(&mut sender, request).await {
                Ok(status) if status.is_success() => times.push(at.elapsed().as_secs_f64() * 1e3),
                Ok(_) => errors += 1,
                Err(e) => return Err(format!("{what}: {e}")),
            }
        }
        let mut beside = threads::used(&threads_before, &threads::sample(pid)?);
        beside.retain(|(name, _)| name != REQUEST_THREADS);
        times.sort_by(f64::total_cmp);
        let at = |q: f64| {
            times
                .get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1)))
                .copied()
                .unwrap_or(f64::NAN)
        };
        out.push(Latency {
            what,
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: times.last().copied().unwrap_or(f64::NAN),
            errors,
            count: times.len() + errors,
            beside,
        });
    }
    Ok(out)
}

/// Make [`FLAG_KEY`] through the API, 30% of users whose plan is set; its id. A
/// target sharing another's data directory finds it made already: then its id.
async fn make_flag(addr: SocketAddr) -> Result<i64, String> {
    let body = serde_json::json!({
        "key": FLAG_KEY, "name": "Scale rollout", "active": true,
        "filters": {"groups": [{"properties": [{"key": "plan", "operator": "is_set",
            "value": "is_set", "type": "person"}], "rollout_percentage": 30}]},
    });
    let path = "/api/projects/1/feature_flags/";
    let (status, made) = flags_api(addr, "POST", path, Some(body)).await?;
    if let (true, Some(id)) = (status.is_success(), made["id"].as_i64()) {
        return Ok(id);
    }
    let (_, list) = flags_api(addr, "GET", &format!("{path}?search={FLAG_KEY}"), None).await?;
    list["results"]
        .as_array()
        .and_then(|flags| flags.iter().find(|f| f["key"] == FLAG_KEY))
        .and_then(|f| f["id"].as_i64())
        .ok_or_else(|| format!("making the flag: {status} {made}"))
}

/// One request to the flag-management API with the harness's personal key.
async fn flags_api(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<(hyper::StatusCode, serde_json::Value), String> {
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, addr.to_string())
        .header(AUTHORIZATION, format!("Bearer {}", flags::PERSONAL_KEY))
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let mut sender = client::connect(addr).await.map_err(|e| e.to_string())?;
    let (status, bytes) = client::send_reading(&mut sender, request)
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, serde_json::from_slice(&bytes).unwrap_or_default()))
}
