//! HTTP: the hyper server, routing, request decoding and every response, including
//! the one mapping from errors to statuses (`error`).

pub mod api;
pub mod assets;
pub mod body;
pub mod capture;
pub mod capture_v1;
pub mod console;
pub mod decide;
pub mod decode;
pub mod definitions;
pub mod error;
pub mod flags_api;
pub mod hogql;
pub mod inflate;
pub mod linger;
pub mod links;
pub mod matching;
pub mod not_kept;
pub mod params;
pub mod personal;
pub mod project_key;
pub mod properties;
pub mod recordings;
pub mod remote_config;
pub mod response;
pub mod router;
pub mod server;
pub mod surveys;
pub mod upstream_config;
pub mod whoami;

use std::net::{IpAddr, SocketAddr};

use hyper::HeaderMap;

use crate::app::App;

/// The client's address: the socket peer, or the leftmost `X-Forwarded-For` entry when
/// the peer is one of the trusted proxies.
/// The client's address (`geoip::client_ip`), with every `X-Forwarded-For` header read
/// as one list, in order: a client's own extra header cannot hide the proxy's.
pub fn client_ip(app: &App, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
    let mut all = headers.get_all("x-forwarded-for").iter();
    let (first, rest) = (all.next(), all.next());
    let joined;
    let xff = match (first, rest) {
        (Some(one), None) => Some(one.as_bytes()),
        (None, _) => None,
        (Some(_), Some(_)) => {
            let values: Vec<&[u8]> = headers
                .get_all("x-forwarded-for")
                .iter()
                .map(|v| v.as_bytes())
                .collect();
            joined = values.join(&b","[..]);
            Some(&joined[..])
        }
    };
    crate::geoip::client_ip(peer.ip(), xff, &app.config.trusted_proxies)
}

pub fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(hyper::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

pub fn header_str(headers: &HeaderMap, name: hyper::header::HeaderName) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The `/metrics` body, with gauges refreshed from live state first.
pub fn metrics_text(app: &App) -> String {
    use crate::metrics::{mirror, LaneLabels};
    use std::sync::atomic::Ordering::Relaxed;
    let m = &app.metrics;
    let _scrape = m.scrape_lock();
    let c = &app.compactor;
    mirror(&m.compactor_applied, c.applied.load(Relaxed));
    mirror(&m.compactor_steps, c.steps.load(Relaxed));
    mirror(&m.compactor_duplicates, c.duplicates.load(Relaxed));
    mirror(&m.compactor_corrupt, c.corrupt.load(Relaxed));
    mirror(&m.retention_deleted, c.retention_deleted.load(Relaxed));
    for (lane, n) in [
        ("historical", &c.to_historical),
        ("overflow", &c.to_overflow),
    ] {
        mirror(
            &m.compactor_routed.get_or_create(&LaneLabels { lane }),
            n.load(Relaxed),
        );
    }
    m.compactor_lag_seconds
        .set(c.lag_ms.load(Relaxed) as f64 / 1000.0);
    m.compactor_healthy.set(i64::from(c.healthy.load(Relaxed)));
    m.log_depth.set(
        app.store
            .get()
            .map_or(0, |open| crate::compactor::log_depth(&open.trees, &app.log)) as i64,
    );
    m.log_segments.set(app.log.segments() as i64);
    app.backlog.check(app.log.bytes());
    m.log_bytes
        .set(i64::try_from(app.backlog.bytes()).unwrap_or(i64::MAX));
    m.log_backpressure.set(i64::from(!app.backlog.is_ok()));
    let losses = &app.log.losses;
    mirror(&m.log_torn, losses.torn.load(Relaxed));
    mirror(&m.log_skipped, losses.skipped.load(Relaxed));
    mirror(&m.log_quarantined, losses.quarantined.load(Relaxed));
    mirror(&m.log_missing, losses.missing.load(Relaxed));
    m.decide_cached_persons.set(app.persons.len().1 as i64);
    refresh_memory(app);
    m.disk_free_bytes
        .set(i64::try_from(app.space.free_bytes()).unwrap_or(i64::MAX));
    mirror(&m.geoip_lookups, app.geoip.lookups());
    mirror(&m.geoip_hits, app.geoip.hits());
    let snapshot = app.rules.current();
    m.flags_snapshot_version.set(snapshot.version() as i64);
    mirror(&m.flags_reload_failures, app.rules.reload_failures());
    m.flags_refused.clear();
    for e in app.rules.refused().iter() {
        let file = e
            .file()
            .map(|f| f.display().to_string())
            .unwrap_or_default();
        let (flag, problem) = (e.flag().unwrap_or(""), e.kind().to_string());
        let labels = crate::metrics::RefusedLabels::new(&file, flag, e.field(), &problem);
        m.flags_refused.get_or_create(&labels).set(1);
    }
    mirror(&m.surveys_reload_failures, app.surveys.reload_failures());
    let early_access = app.early_access.reload_failures();
    mirror(&m.early_access_reload_failures, early_access);
    let wal = app.wal.stats();
    m.wal_records.set(wal.appended_records.load(Relaxed) as i64);
    m.wal_flushes.set(wal.groups.load(Relaxed) as i64);
    m.wal_queued_requests.set(app.wal.queued() as i64);
    m.wal_last_flush_seconds
        .set(wal.last_flush_micros.load(Relaxed) as f64 / 1e6);
    m.render()
}

/// `flagpost_memory_bytes`: each holder's bytes by its own count.
fn refresh_memory(app: &App) {
    use std::sync::atomic::Ordering::Relaxed;
    let c = &app.compactor;
    let mut holders = vec![
        ("person_cache", app.persons.bytes() as u64),
        ("dedup_window", c.window_bytes.load(Relaxed)),
        ("compactor_memo", c.memo_bytes.load(Relaxed)),
        ("overflow_limiter", c.limiter_bytes.load(Relaxed)),
        ("parser_scratch", crate::capture::json::kept_bytes() as u64),
        // Sled's page cache by its budget: sled 0.34 does not say what it holds.
        ("sled_cache", app.config.cache_bytes),
    ];
    if let Some(open) = app.store.get() {
        holders.extend(crate::store::memory::holders(&open.trees));
    }
    for (holder, bytes) in holders {
        let gauge = app
            .metrics
            .memory_bytes
            .get_or_create(&crate::metrics::HolderLabels { holder });
        gauge.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
    let resident = crate::support::memory::resident_bytes();
    app.metrics
        .resident_bytes
        .set(i64::try_from(resident).unwrap_or(i64::MAX));
}
