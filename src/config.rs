//! Typed runtime configuration. The binary turns command-line flags and environment
//! variables into a [`Config`]; the library only ever sees this type, never argh's.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The largest request body accepted before decompression: PostHog's `/batch/` limit,
/// also the `client_max_body_size` of the shipped nginx site.
pub const DEFAULT_MAX_BODY_BYTES: usize = 20 * 1024 * 1024;
/// The largest payload after decompression. A gzip or lz64 bomb fails here instead of
/// growing without bound; legitimate JSON compresses about 5-10x, so a full 20 MB
/// compressed batch of ordinary events still fits.
pub const DEFAULT_MAX_DECOMPRESSED_BYTES: usize = 100 * 1024 * 1024;
/// Slow clients get this long to send the request line and headers.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// And this long to send the body, so a trickled body cannot hold a connection forever.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Open connections beyond this are closed at accept: idle sockets cannot exhaust
/// file descriptors or memory.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Request bodies held in memory at once, across all connections. Past it, new
/// requests get 503 with Retry-After instead of pushing the process out of memory.
pub const DEFAULT_MAX_INFLIGHT_BODY_BYTES: usize = 256 * 1024 * 1024;
/// sled's page cache. sled's real memory use runs well past this figure (its nodes
/// and the allocator's overhead on them), and the operating system's page cache keeps
/// the database file warm anyway, so it is kept small: after one million events from
/// 100,000 persons, 64 MiB here left the server 208 MiB resident at rest against 182
/// with 16 (one pair of runs), and `/decide` with stored persons was as fast.
pub const DEFAULT_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// Projects, flag definitions, the GeoIP database.
    pub data_dir: PathBuf,
    /// The sled database: write-ahead log, events, persons, groups.
    pub db_dir: PathBuf,
    pub limits: Limits,
    pub compactor: crate::store::compactor::Settings,
    /// The GeoIP database; `None` means `<data dir>/GeoLite2-City.mmdb` if it exists.
    pub geoip: Option<PathBuf>,
    /// Peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: crate::geoip::TrustedProxies,
    /// Free disk space below which new events are refused.
    pub min_free_disk_bytes: u64,
    /// sled's page cache in bytes.
    pub cache_bytes: u64,
    /// The size of the write-ahead log's segment files.
    pub log_segment_bytes: u64,
    /// posthog-js's `dist/` files served at `/static/`; `None` means
    /// `<data dir>/static` if it exists.
    pub static_dir: Option<PathBuf>,
}

/// Request limits; see the constants for why each default is what it is.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_decompressed_bytes: usize,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub max_connections: usize,
    pub max_inflight_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_inflight_body_bytes: DEFAULT_MAX_INFLIGHT_BODY_BYTES,
        }
    }
}

impl Config {
    /// The contract's defaults: `127.0.0.1:8000`, `./data`, `./var/db`.
    pub fn new(data_dir: PathBuf, db_dir: PathBuf) -> Config {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8000)),
            data_dir,
            db_dir,
            limits: Limits::default(),
            compactor: Default::default(),
            geoip: None,
            trusted_proxies: crate::geoip::TrustedProxies::loopback_only(),
            min_free_disk_bytes: crate::store::space::DEFAULT_RESERVE_BYTES,
            cache_bytes: DEFAULT_CACHE_BYTES,
            log_segment_bytes: crate::store::log::SEGMENT_BYTES,
            static_dir: None,
        }
    }

    pub fn projects_file(&self) -> PathBuf {
        self.data_dir.join("projects.json")
    }

    /// The GeoIP file to use and whether the operator named it (then it must open).
    pub fn geoip_file(&self) -> (PathBuf, bool) {
        match &self.geoip {
            Some(path) => (path.clone(), true),
            None => (self.data_dir.join("GeoLite2-City.mmdb"), false),
        }
    }

    /// The static assets directory and whether the operator named it (then it must
    /// exist at start).
    pub fn static_dir(&self) -> (PathBuf, bool) {
        match &self.static_dir {
            Some(path) => (path.clone(), true),
            None => (self.data_dir.join("static"), false),
        }
    }

    pub fn flags_dir(&self) -> PathBuf {
        self.data_dir.join("flags")
    }

    pub fn surveys_dir(&self) -> PathBuf {
        self.data_dir.join("surveys")
    }

    pub fn early_access_dir(&self) -> PathBuf {
        self.data_dir.join("early_access")
    }
}
