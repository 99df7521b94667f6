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
/// A client that has taken no byte of an answer for this long has stopped reading: its
/// connection's place and the answer's buffers are let go. As long as a body gets to
/// arrive, and far beyond a slow but live reader's pauses.
pub const DEFAULT_WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Open connections beyond this are closed at accept: idle sockets cannot exhaust
/// file descriptors or memory.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Without `--max-connections-per-address`, one address may hold this many connections
/// at most: well above a browser's six per host or an SDK's pool, yet 64 such addresses
/// are needed to fill the default 4096. Trusted proxies (nginx) are not counted.
pub const DEFAULT_CONNECTIONS_PER_ADDRESS: usize = 64;
/// Request bodies held in memory at once, across all connections. Past it, new
/// requests get 503 with Retry-After instead of pushing the process out of memory.
pub const DEFAULT_MAX_INFLIGHT_BODY_BYTES: usize = 256 * 1024 * 1024;
/// sled's page cache. sled's real memory use runs well past this figure (its nodes
/// and the allocator's overhead on them), and the operating system's page cache keeps
/// the database file warm anyway, so it is kept small: what sled holds is the event
/// blocks' pointers (about 50 bytes a block) and the rollups. At 20 million events, 8
/// MiB here left the server 24 MiB fewer live bytes and 39 MiB less resident at rest
/// than 16 (one pair), with every lookup as fast (a person's events p99 7.1 against
/// 6.7 ms); 4 MiB saved 36 MiB more but a person's events took 71 ms at p99, when they
/// were found through sled. Since the event index finds them, 2 MiB here (with the
/// event block cache at 16 MiB) lowered the highest resident set at 20 million events
/// by 14 MiB to the empty log and 10 MiB through the lookups after it, with the
/// drain as fast and a person's events at 2.4 ms p99 (`BENCHMARKS.md`).
pub const DEFAULT_CACHE_BYTES: u64 = 2 * 1024 * 1024;
/// The write-ahead log's segment size: a roll (one extra sync and a rename) every
/// 16 MiB of events.
pub const DEFAULT_LOG_SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// Free disk space kept for sled's own growth (segment files, compaction) and for the
/// compactor, which keeps writing while new events are refused.
pub const DEFAULT_MIN_FREE_DISK_BYTES: u64 = 256 * 1024 * 1024;
/// Log files past which new events are refused until the compactor catches up: about
/// three million posthog-js events, a few seconds of capture at full speed and under a
/// minute of the compactor's work, where a compactor that keeps up holds a few segments.
pub const DEFAULT_MAX_LOG_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// Spike detection per (project, distinct id): the reference service's defaults.
pub const DEFAULT_OVERFLOW_RATE: f64 = 100.0;
pub const DEFAULT_OVERFLOW_BURST: f64 = 1000.0;
/// A year: long enough for product questions, bounded so the disk is too.
pub const DEFAULT_RETENTION_DAYS: u32 = 365;
/// A day: client retries (the SDKs' queues, a proxy's replays) come within hours.
pub const DEFAULT_DEDUP_MAX_AGE_MS: i64 = 24 * 60 * 60 * 1000;
/// Two million uuids: about 20 seconds at 100,000 events/s and a whole day at 23
/// events/s. About 18 MiB in memory once full (`flagpost_memory_bytes{holder=
/// "dedup_window"}`): 16 of the fingerprints' table and up to 3 of the newest uuids'
/// hash set; the 32 MiB of sorted uuids are in scratch files (`store::dedup`).
pub const DEFAULT_DEDUP_MAX_IDS: usize = 2_000_000;
/// Under contention the compactor yields the cores to requests: with it at 0, capture
/// measured 12 to 18% fewer requests/s in four runs, and the compactor still keeps
/// up with 100,000 events/s at 10 (benches/HISTORY.md).
pub const DEFAULT_COMPACTOR_NICE: i32 = 10;
/// The layered tables' deltas (changes not yet folded into their runs) together, by
/// the estimate of their maps' memory: past it the largest is folded, past twice it
/// the compactor waits for the fold under way (`compactor::fold`).
pub const DEFAULT_DELTA_BUDGET_BYTES: u64 = 48 * 1024 * 1024;

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// Projects, flag definitions, the GeoIP database.
    pub data_dir: PathBuf,
    /// The sled database: write-ahead log, events, persons, groups.
    pub db_dir: PathBuf,
    /// The flag files, which the management API and the console rewrite; `None` means
    /// `<data dir>/flags`. A deployment whose data dir is read-only to the service
    /// (`/etc/flagpost`) keeps them in its state directory instead.
    pub flags_dir: Option<PathBuf>,
    pub limits: Limits,
    pub compactor: Compaction,
    /// The GeoIP database; `None` means `<data dir>/GeoLite2-City.mmdb` if it exists.
    pub geoip: Option<PathBuf>,
    /// Peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: crate::geoip::TrustedProxies,
    /// Free disk space below which new events are refused.
    pub min_free_disk_bytes: u64,
    /// Bytes of log files past which new events are refused; 0 for no bound.
    pub max_log_bytes: u64,
    /// sled's page cache in bytes.
    pub cache_bytes: u64,
    /// The size of the write-ahead log's segment files.
    pub log_segment_bytes: u64,
    /// posthog-js's `dist/` files served at `/static/`; `None` means
    /// `<data dir>/static` if it exists.
    pub static_dir: Option<PathBuf>,
    /// The ClickHouse sink, off when `None`; `compactor.outbox` must be on with it.
    pub sink: Option<Sink>,
    /// The web console at `/console/` (`--console off` answers 404 there instead).
    pub console: bool,
    /// `scheme://host[:port]` this server is reached at from outside (`--public-url`):
    /// the base of the absolute links it answers with. `None`: the request's Host when
    /// it is one of the listener's own names (`http::links`).
    pub public_url: Option<String>,
    /// Edge mode (`--upstream`): the PostHog (or flagpost) this server stands in front
    /// of; off when `None`.
    pub upstream: Option<Upstream>,
}

/// Request limits; see the constants for why each default is what it is.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_decompressed_bytes: usize,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    /// How long writing an answer may wait without the client taking a byte.
    pub write_stall_timeout: Duration,
    pub max_connections: usize,
    /// Open connections one client address may hold; `None` is
    /// [`DEFAULT_CONNECTIONS_PER_ADDRESS`] ([`Limits::per_address`]).
    pub max_connections_per_address: Option<usize>,
    pub max_inflight_body_bytes: usize,
}

impl Limits {
    /// Connections one address may hold open at once.
    pub fn per_address(&self) -> usize {
        self.max_connections_per_address
            .unwrap_or(DEFAULT_CONNECTIONS_PER_ADDRESS)
            .clamp(1, self.max_connections.max(1))
    }
}

/// How the compactor works: spike limits, retention, the deduplication window and its
/// thread's priority.
#[derive(Debug, Clone)]
pub struct Compaction {
    /// Spike detection: tokens per second and burst per (project, distinct id).
    pub overflow_rate: f64,
    pub overflow_burst: f64,
    /// Events older than this many days are deleted; 0 keeps them forever.
    pub retention_days: u32,
    /// The deduplication window: a uuid stored this recently (milliseconds) and
    /// among the last `dedup_max_ids` stored is not stored again.
    pub dedup_max_age_ms: i64,
    pub dedup_max_ids: usize,
    /// The compactor thread's nice value (0 to 19): above 0, request handling comes
    /// first when the cores are busy, and the compactor catches up when they are not.
    pub nice: i32,
    /// The deltas' memory budget, [`DEFAULT_DELTA_BUDGET_BYTES`]; 0 for none (each
    /// table then folds by its share of its runs alone).
    pub delta_budget_bytes: u64,
    /// Record each chunk's changes in the store's outbox, which the ClickHouse sink
    /// reads (on with `--clickhouse-url`).
    pub outbox: bool,
}

impl Default for Compaction {
    fn default() -> Self {
        Compaction {
            overflow_rate: DEFAULT_OVERFLOW_RATE,
            overflow_burst: DEFAULT_OVERFLOW_BURST,
            retention_days: DEFAULT_RETENTION_DAYS,
            dedup_max_age_ms: DEFAULT_DEDUP_MAX_AGE_MS,
            dedup_max_ids: DEFAULT_DEDUP_MAX_IDS,
            nice: DEFAULT_COMPACTOR_NICE,
            delta_budget_bytes: DEFAULT_DELTA_BUDGET_BYTES,
            outbox: false,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            write_stall_timeout: DEFAULT_WRITE_STALL_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: None,
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
            flags_dir: None,
            limits: Limits::default(),
            compactor: Default::default(),
            geoip: None,
            trusted_proxies: crate::geoip::TrustedProxies::loopback_only(),
            min_free_disk_bytes: DEFAULT_MIN_FREE_DISK_BYTES,
            max_log_bytes: DEFAULT_MAX_LOG_BYTES,
            cache_bytes: DEFAULT_CACHE_BYTES,
            log_segment_bytes: DEFAULT_LOG_SEGMENT_BYTES,
            static_dir: None,
            sink: None,
            console: true,
            public_url: None,
            upstream: None,
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
        match &self.flags_dir {
            Some(dir) => dir.clone(),
            None => self.data_dir.join("flags"),
        }
    }

    pub fn surveys_dir(&self) -> PathBuf {
        self.data_dir.join("surveys")
    }

    pub fn early_access_dir(&self) -> PathBuf {
        self.data_dir.join("early_access")
    }
}

/// Where the ClickHouse sink writes and as whom (`--clickhouse-url` and its options).
/// The sink adds what it makes of them (the URL's `host:port`, the basic-auth header).
#[derive(Clone, PartialEq, Eq)]
pub struct Sink {
    /// `http://HOST[:PORT]`; no TLS (put a local proxy in front for that).
    pub url: String,
    pub database: String,
    pub user: String,
    /// Never from the command line: see `sink::read_password`.
    pub password: String,
}

/// The database the sink writes when none is configured (PostHog's default).
pub const DEFAULT_SINK_DATABASE: &str = "default";
/// The ClickHouse user when none is configured (ClickHouse's own default).
pub const DEFAULT_SINK_USER: &str = "default";

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("url", &self.url)
            .field("database", &self.database)
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl Sink {
    pub fn new(url: &str) -> Sink {
        Sink {
            url: url.to_string(),
            database: DEFAULT_SINK_DATABASE.to_string(),
            user: DEFAULT_SINK_USER.to_string(),
            password: String::new(),
        }
    }
}

/// The definitions poll of edge mode: PostHog's SDKs poll every 30 s by default, and a
/// conditional poll that answers 304 costs upstream almost nothing.
pub const DEFAULT_UPSTREAM_POLL: Duration = Duration::from_secs(30);
/// Events older than this travel upstream as `historical_migration` batches: PostHog
/// routes those away from its live pipeline, and a day covers a client's own retries.
pub const DEFAULT_UPSTREAM_HISTORICAL_AFTER: Duration = Duration::from_secs(24 * 60 * 60);
/// How long `/decide` and `/flags` wait for upstream on a flag the edge cannot decide:
/// PostHog's own flag routes time out at 5 s, and a page waits on this answer.
pub const DEFAULT_UPSTREAM_FLAGS_BUDGET: Duration = Duration::from_millis(1500);

/// Edge mode's settings (`--upstream` and its options); see `crate::edge`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `http[s]://host[:port]`, no path: PostHog's ingestion host (`https://eu.i.posthog.com`)
    /// or another flagpost.
    pub url: String,
    /// How often each synced project's flag definitions are polled.
    pub poll: Duration,
    /// Events older than this are forwarded as `historical_migration` batches.
    pub historical_after: Duration,
    /// Bytes of events not yet forwarded past which capture answers 503; `None` is "until
    /// the disk reserve" (`min_free_disk_bytes`).
    pub max_backlog_bytes: Option<u64>,
    /// How long a request may wait on upstream `/flags` for what the edge cannot decide.
    pub flags_budget: Duration,
}

impl Upstream {
    pub fn new(url: &str) -> Upstream {
        Upstream {
            url: url.trim_end_matches('/').to_string(),
            poll: DEFAULT_UPSTREAM_POLL,
            historical_after: DEFAULT_UPSTREAM_HISTORICAL_AFTER,
            max_backlog_bytes: None,
            flags_budget: DEFAULT_UPSTREAM_FLAGS_BUDGET,
        }
    }
}
