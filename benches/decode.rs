//! Body decoding (`http::decode`): a posthog-js flush of 30 events as each client
//! encoding carries it, gzip, LZ-String lz64 and base64, plus plain JSON as the floor.
//! `decompress` is the decoder alone; `payload` is the whole request path (query hint,
//! form fields, sniffing). Throughput is in bytes of decoded JSON.
//!
//! The lz64 body is a fixture made by the real LZ-String library
//! (`benches/fixtures/lz64.js`), so the decoder is measured on what browsers send,
//! not on what our own encoder would produce. The bench checks that the fixture still
//! decodes to the JSON built here; to regenerate it after changing the events:
//!
//! ```sh
//! FLAGPOST_BENCH_DUMP_JSON=1 cargo bench --bench decode 2>/dev/null \
//!   | NODE_PATH=<dir with lz-string installed>/node_modules node benches/fixtures/lz64.js \
//!   > benches/fixtures/posthog-js-batch.lz64
//! ```

#[path = "common/mod.rs"]
mod common;

use std::io::Write;

use base64::Engine;
use bytes::Bytes;
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use flagpost::http::decode::{self, Compression, Located, Query};
use serde_json::{json, Value};

use common::{distinct_id, uuid, API_KEY, NOW_MS};

/// posthog-js flushes its queue every few seconds; a busy page fills about this many.
const BATCH_EVENTS: usize = 30;
/// The server's default `--max-decompressed-bytes`.
const MAX_DECODED: usize = 100 * 1024 * 1024;
/// Set to print the JSON the lz64 fixture must encode, and exit.
const DUMP_VAR: &str = "FLAGPOST_BENCH_DUMP_JSON";
const LZ64_FIXTURE: &str = include_str!("fixtures/posthog-js-batch.lz64");
/// What posthog-js puts in the query string of every capture request.
const QUERY: &str = "ip=1&_=1750000000000&ver=1.130.2";

/// The properties posthog-js attaches to every event of one page session.
fn common_properties(n: usize) -> Value {
    json!({
        "$os": "Mac OS X",
        "$os_version": "14.4.1",
        "$browser": "Chrome",
        "$device_type": "Desktop",
        "$timezone": "Europe/Berlin",
        "$current_url": "https://app.example.com/project/7/insights/trends?interval=day",
        "$host": "app.example.com",
        "$pathname": "/project/7/insights/trends",
        "$raw_user_agent": "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
        "$browser_version": 124,
        "$browser_language": "de-DE",
        "$screen_height": 1117,
        "$screen_width": 1728,
        "$viewport_height": 960,
        "$viewport_width": 1600,
        "$lib": "web",
        "$lib_version": "1.130.2",
        "$insert_id": format!("{:016x}", 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(n as u64 + 1)),
        "$time": (NOW_MS + n as i64 * 1500) as f64 / 1000.0,
        "distinct_id": distinct_id(7),
        "$device_id": uuid(NOW_MS, 1).to_string(),
        "$user_id": distinct_id(7),
        "$initial_referrer": "https://www.google.com/",
        "$initial_referring_domain": "www.google.com",
        "$referrer": "https://app.example.com/project/7/dashboard",
        "$referring_domain": "app.example.com",
        "$session_id": uuid(NOW_MS, 2).to_string(),
        "$window_id": uuid(NOW_MS, 3).to_string(),
        "$pageview_id": uuid(NOW_MS, 4 + (n / 10) as u64).to_string(),
        "$is_identified": true,
        "$process_person_profile": true,
        "$active_feature_flags": ["new-navigation", "dark-mode", "pricing-page-test"],
        "$feature/new-navigation": true,
        "$feature/dark-mode": true,
        "$feature/pricing-page-test": "test",
        "$console_log_recording_enabled_server_side": false,
        "$session_recording_start_reason": "sampling_overridden",
        "$lib_rate_limit_remaining_tokens": 98.5,
        "$sdk_debug_retry_queue_size": 0,
        "token": API_KEY,
        // Non-ASCII and an astral character, which LZ-String carries as a surrogate pair.
        "title": "Trends — Product analytics 📈",
    })
}

/// One of the events a session produces: pageviews, autocaptured clicks (with their
/// element chain), custom events and a pageleave.
fn event(n: usize) -> Value {
    let mut properties = common_properties(n);
    let name = match n % 10 {
        0 => "$pageview",
        9 => "$pageleave",
        3 | 6 => "insight viewed",
        _ => "$autocapture",
    };
    let extra = match name {
        "$autocapture" => json!({
            "$event_type": "click",
            "$ce_version": 1,
            "$el_text": format!("Series {n}"),
            "$elements": [
                {"tag_name": "button", "$el_text": format!("Series {n}"), "classes": ["btn", "btn-primary"],
                 "attr__class": "btn btn-primary", "attr__data-attr": "add-series", "nth_child": 2, "nth_of_type": 1},
                {"tag_name": "div", "classes": ["series-row"], "attr__class": "series-row", "nth_child": n % 5 + 1, "nth_of_type": n % 5 + 1},
                {"tag_name": "section", "attr__id": "insight-editor", "nth_child": 1, "nth_of_type": 1},
                {"tag_name": "body", "nth_child": 2, "nth_of_type": 1},
            ],
        }),
        "insight viewed" => json!({
            "insight": "TRENDS", "query_kind": "TrendsQuery", "series_length": n % 4 + 1,
            "filters_count": 2, "is_first_component_load": n < 5, "duration_ms": 180 + n * 7,
        }),
        "$pageleave" => json!({"$prev_pageview_duration": 41.2, "$prev_pageview_max_scroll": 2200,
                               "$prev_pageview_max_scroll_percentage": 0.82}),
        _ => json!({"$set_once": {"$initial_os": "Mac OS X", "$initial_browser": "Chrome"}}),
    };
    for (k, v) in extra.as_object().expect("an object literal") {
        properties[k] = v.clone();
    }
    let at = NOW_MS + n as i64 * 1500;
    json!({
        "uuid": uuid(at, 100 + n as u64).to_string(),
        "event": name,
        "properties": properties,
        "timestamp": flagpost::support::clock::format_ms(at),
    })
}

/// What posthog-js sends to `/e/`: an array of events.
fn batch_json() -> String {
    Value::Array((0..BATCH_EVENTS).map(event).collect()).to_string()
}

/// The bodies of one batch in each encoding.
struct Bodies {
    json: Vec<u8>,
    gzip: Vec<u8>,
    lz64: Vec<u8>,
    base64: Vec<u8>,
}

impl Bodies {
    fn new() -> Bodies {
        let json = batch_json().into_bytes();
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gzip.write_all(&json).expect("gzip into memory cannot fail");
        let lz64 = LZ64_FIXTURE.trim().as_bytes().to_vec();
        let decoded = decode::decompress(&lz64, Compression::Lz64, MAX_DECODED)
            .expect("the lz64 fixture decodes");
        assert!(
            decoded == json,
            "benches/fixtures/posthog-js-batch.lz64 no longer encodes the batch built here; \
             regenerate it (see the top of benches/decode.rs)"
        );
        Bodies {
            base64: base64::engine::general_purpose::STANDARD
                .encode(&json)
                .into_bytes(),
            gzip: gzip.finish().expect("gzip into memory cannot fail"),
            lz64,
            json,
        }
    }
}

fn form(fields: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in fields {
        out.append_pair(k, std::str::from_utf8(v).expect("encoded bodies are ASCII"));
    }
    out.finish().into_bytes()
}

fn decompress(c: &mut Criterion) {
    let bodies = Bodies::new();
    println!(
        "decode: {BATCH_EVENTS} events, {} bytes of JSON; gzip {} bytes, lz64 {}, base64 {}",
        bodies.json.len(),
        bodies.gzip.len(),
        bodies.lz64.len(),
        bodies.base64.len()
    );
    let mut group = c.benchmark_group("decode/decompress");
    group.throughput(Throughput::Bytes(bodies.json.len() as u64));
    for (name, raw, hint) in [
        ("json", &bodies.json, Compression::None),
        ("gzip", &bodies.gzip, Compression::Gzip),
        ("lz64", &bodies.lz64, Compression::Lz64),
        ("base64", &bodies.base64, Compression::Base64),
    ] {
        group.bench_with_input(BenchmarkId::from_parameter(name), raw, |b, raw| {
            b.iter(|| decode::decompress(raw, hint, MAX_DECODED).expect("decodes"))
        });
    }
    group.finish();
}

/// One request as it reaches the decoder.
struct Request {
    name: &'static str,
    query: String,
    content_type: Option<&'static str>,
    content_encoding: Option<&'static str>,
    /// Shared, as the server holds a body it has read.
    body: Bytes,
}

impl Request {
    fn decode(&self) -> Vec<u8> {
        let query = Query::parse(Some(&self.query));
        Located::find(&query, self.content_type, self.content_encoding, &self.body)
            .decode(MAX_DECODED)
            .expect("decodes")
    }
}

/// The request shapes posthog-js sends, through `Query::parse` and `Located`, as the
/// server decodes them.
fn payload(c: &mut Criterion) {
    let bodies = Bodies::new();
    const FORM: Option<&str> = Some("application/x-www-form-urlencoded");
    let request = |name, query: &str, content_type, content_encoding, body: Vec<u8>| Request {
        name,
        query: query.to_owned(),
        content_type,
        content_encoding,
        body: Bytes::from(body),
    };
    let json = Some("application/json");
    let gzip_js = format!("{QUERY}&compression=gzip-js");
    let lz64_form = form(&[("data", &bodies.lz64), ("compression", b"lz64")]);
    let requests = [
        request("json", QUERY, json, None, bodies.json.clone()),
        request(
            "gzip-js",
            &gzip_js,
            Some("text/plain"),
            None,
            bodies.gzip.clone(),
        ),
        request(
            "gzip-header",
            QUERY,
            json,
            Some("gzip"),
            bodies.gzip.clone(),
        ),
        request("lz64-form", QUERY, FORM, None, lz64_form),
        request(
            "base64-form",
            QUERY,
            FORM,
            None,
            form(&[("data", &bodies.base64)]),
        ),
    ];
    let mut group = c.benchmark_group("decode/payload");
    group.throughput(Throughput::Bytes(bodies.json.len() as u64));
    for request in &requests {
        assert!(
            request.decode() == bodies.json,
            "{} decodes to the batch",
            request.name
        );
        group.bench_function(BenchmarkId::from_parameter(request.name), |b| {
            b.iter(|| request.decode())
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = decompress, payload
}

fn main() {
    if std::env::var_os(DUMP_VAR).is_some() {
        print!("{}", batch_json());
        return;
    }
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
