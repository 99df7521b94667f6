//! What the criterion benches share (each includes this file with `#[path]`): settings
//! short enough for the whole suite to run in a few minutes on a shared 2-core machine,
//! and a posthog-js `$pageview` built deterministically, so fixtures and figures do not
//! drift from run to run.

// Each bench uses its own part of this module.
#![allow(dead_code)]

use std::time::Duration;

use criterion::Criterion;
use serde_json::{json, Value};
use uuid::Uuid;

/// Enough to reach steady state for everything here but the disk-bound benches, which
/// set their own sampling.
const WARM_UP: Duration = Duration::from_secs(1);
/// Indicative on a noisy shared machine while keeping each benchmark to a few seconds;
/// `--measurement-time` on the command line still overrides it.
const MEASUREMENT: Duration = Duration::from_secs(3);

/// The project key every generated event carries.
pub const API_KEY: &str = "phc_bench_project_key";
/// The fixed "now" of generated events (2025-06-15T15:06:40Z), unix milliseconds.
pub const NOW_MS: i64 = 1_750_000_000_000;

/// The settings of every bench group; arguments given to the bench apply on top.
pub fn criterion() -> Criterion {
    Criterion::default()
        .warm_up_time(WARM_UP)
        .measurement_time(MEASUREMENT)
}

/// A uuid v7 for the `n`th generated id at `ms`, the same on every run; its random bits
/// hold `n` (the decode bench's fixture was built from these).
pub fn uuid(ms: i64, n: u64) -> Uuid {
    let mut random = [0u8; 10];
    random[2..].copy_from_slice(&n.to_be_bytes());
    uuid::Builder::from_unix_timestamp_millis(ms as u64, &random).into_uuid()
}

/// A uuid v7 for the `n`th generated id at `ms`, the same on every run, whose random bits
/// look random as real clients' do: a counter there compresses far better and flatters
/// every figure of bytes at rest.
pub fn random_uuid(ms: i64, n: u64) -> Uuid {
    let mut random = [0u8; 10];
    random[..8].copy_from_slice(&mix(n).to_be_bytes());
    random[8..].copy_from_slice(&mix(!n).to_be_bytes()[..2]);
    uuid::Builder::from_unix_timestamp_millis(ms as u64, &random).into_uuid()
}

/// SplitMix64's finaliser: a fixed, well-spread 64-bit value for each `n`.
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub fn distinct_id(n: usize) -> String {
    format!("user-{n:06}")
}

/// A `$pageview` the way posthog-js builds it for the `n`th person, about 600 bytes
/// once serialised with `api_key` (the load harness's capture body, made repeatable).
pub fn pageview(n: usize) -> Value {
    let at = NOW_MS + n as i64;
    let id = n as u64 * 4;
    let ids = [uuid(at, id), uuid(at, id + 1), uuid(at, id + 2)];
    let mut event = pageview_event(n, at, ids, API_KEY);
    event["api_key"] = API_KEY.into();
    event
}

/// The `n`th person's `$pageview` at `at_ms`, with `ids` as its uuid, device id and
/// session id, and `token` as the project key in its properties.
pub fn pageview_event(n: usize, at_ms: i64, ids: [Uuid; 3], token: &str) -> Value {
    let page = ["dashboard", "insights", "settings", "billing"][n % 4];
    let [uuid, device, session] = ids;
    json!({
        "uuid": uuid.to_string(),
        "event": "$pageview",
        "properties": {
            "$os": "Mac OS X",
            "$browser": "Chrome",
            "$browser_version": 124,
            "$device_type": "Desktop",
            "$current_url": format!("https://app.example.com/project/{}/{page}?tab=overview", n % 7),
            "$host": "app.example.com",
            "$pathname": format!("/project/{}/{page}", n % 7),
            "$lib": "web",
            "$lib_version": "1.130.2",
            "$referrer": "$direct",
            "$device_id": device.to_string(),
            "$session_id": session.to_string(),
            "token": token,
            "distinct_id": distinct_id(n),
        },
        "timestamp": flagpost::support::clock::format_ms(at_ms),
        "distinct_id": distinct_id(n),
    })
}

/// The server's sled cache, so benches see the same cache behaviour.
const CACHE_BYTES: u64 = flagpost::config::DEFAULT_CACHE_BYTES;

/// A temporary directory under the target dir (not /tmp, which is often tmpfs, where
/// a sync is free); removed on drop.
pub fn target_tmpdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a temporary dir under the target dir")
}

/// A fresh sled database in a [`target_tmpdir`], opened as the server opens it. Keep
/// the dir alive as long as the db.
pub fn open_db(prefix: &str) -> (tempfile::TempDir, sled::Db) {
    let dir = target_tmpdir(prefix);
    let db = sled::Config::new()
        .path(dir.path())
        .cache_capacity(CACHE_BYTES)
        .open()
        .expect("sled opens");
    (dir, db)
}

/// The first `count` (at most 40) of the person properties posthog-js and PostHog's
/// enrichment set on the `n`th person, on its `page`th page: who it is, where it is
/// and what it uses (`$set`, two of them changing with the page), and where it first
/// came from (`$initial_*`, `$set_once`).
pub fn person_properties(n: usize, page: usize, count: usize) -> serde_json::Map<String, Value> {
    let path = ["dashboard", "insights", "settings", "billing"][page % 4];
    let city = ["Berlin", "London", "Paris", "Madrid"][n % 4];
    let plan = ["free", "pro", "enterprise"][n % 3];
    let all = json!({
        "email": format!("user{n}@example.com"),
        "plan": plan,
        "$current_url": format!("https://app.example.com/{path}"),
        "$initial_referrer": "https://www.google.com/",
        "$initial_current_url": format!("https://app.example.com/welcome?ref={}", n % 97),
        "name": format!("User {n}"),
        "$pathname": format!("/{path}"),
        "$browser": "Chrome", "$browser_version": 131,
        "$os": "Mac OS X", "$os_version": "15.1.0", "$device_type": "Desktop",
        "$geoip_city_name": city, "$geoip_country_code": "DE", "$geoip_country_name": "Germany",
        "$geoip_continent_code": "EU", "$geoip_time_zone": "Europe/Berlin",
        "$geoip_latitude": 52.52, "$geoip_longitude": 13.405, "seats": n % 40,
        "$initial_browser": "Chrome", "$initial_browser_version": 131,
        "$initial_os": "Mac OS X", "$initial_os_version": "15.1.0",
        "$initial_device_type": "Desktop", "$initial_pathname": "/welcome",
        "$initial_referring_domain": "www.google.com", "$initial_utm_source": "newsletter",
        "$initial_utm_medium": "email", "$initial_utm_campaign": format!("spring-{}", n % 7),
        "$initial_gclid": format!("Cj0KCQ{n:012}"),
        "$initial_geoip_city_name": city, "$initial_geoip_country_code": "DE",
        "$initial_geoip_country_name": "Germany", "$initial_geoip_continent_code": "EU",
        "$initial_geoip_time_zone": "Europe/Berlin", "$initial_geoip_latitude": 52.52,
        "$initial_geoip_longitude": 13.405, "company": format!("company-{}", n % 1000),
        "role": "engineer",
    });
    let Value::Object(all) = all else {
        unreachable!("an object")
    };
    all.into_iter().take(count).collect()
}
