//! GeoIP: which address a request came from, and where that address is. This module owns
//! the in-memory MaxMind City database (GeoIP2, GeoLite2 or a compatible City-schema file),
//! its hot swap when the file changes, the `$geoip_*` properties added to events and to
//! /decide person properties, and the trusted-proxy rule that decides whether
//! `X-Forwarded-For` is believed. Everything here is synchronous: lookups never block, but
//! [`Database::open`] and the reloads read the whole file, so async callers run those on a
//! blocking thread.

mod proxy;
#[cfg(test)]
mod tests;

pub use proxy::{client_ip, forwarded_for, subscriber, TrustedProxies};

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwapOption;
use maxminddb::{geoip2, MaxMindDbError, Reader};
use serde_json::{Map, Number, Value};

use crate::support::sync::lock;

/// `$geoip_*` properties of one address: only the keys the database knows, always in the
/// order city, country name, country code, continent name, continent code, postal code,
/// time zone, latitude, longitude, subdivision 1 code, subdivision 1 name. Keys are static
/// so enrichment allocates only the values, and a plain list lets the caller insert into
/// whatever map type its event uses.
pub type Properties = Vec<(&'static str, Value)>;

/// The part of a database type that marks the City schema. GeoIP2-City, GeoLite2-City and
/// DB-IP's City files carry it; Country and ASN files lack the fields we read.
const CITY_SCHEMA_MARKER: &str = "City";

/// Shared GeoIP reader. Lookups take no lock (a few microseconds, almost all of it decoding
/// the record); the database is replaced atomically by [`Database::reload`] and
/// [`Database::reload_if_changed`] while lookups continue (in-flight ones finish on the old
/// database). Share it behind an `Arc`.
pub struct Database {
    /// `None` when GeoIP is disabled; fixed for the life of the value.
    path: Option<PathBuf>,
    /// The live database. The whole file is read into memory rather than mapped, because an
    /// operator rewriting the file in place (truncate, then write) would make a mapped reader
    /// fault with SIGBUS. A reload briefly holds two copies: about 2 x 60 MB for GeoLite2-City.
    /// ArcSwap so the hot path reads it without a lock and a reload never waits for readers.
    reader: ArcSwapOption<Reader<Vec<u8>>>,
    /// The file's state at the last load attempt, good or bad, so a poll reports a bad file
    /// once instead of every interval. A Mutex because only reloads touch it, and holding it
    /// across the load serialises reloads so an older file can never replace a newer one.
    /// A poisoned lock only means a reload panicked; `Seen` is a plain value that cannot be
    /// left half-written, so carrying on is safe.
    seen: Mutex<Option<Seen>>,
    /// Metrics. Relaxed atomics: they are counters read for display, ordering nothing.
    lookups: AtomicU64,
    hits: AtomicU64,
    errors: AtomicU64,
}

/// What a stat of the database file returned. A failed stat is remembered by kind so a
/// missing file is reported once, like a corrupt one.
type Seen = Result<Stamp, io::ErrorKind>;

/// Identifies one version of the file cheaply. Size is compared too because some
/// filesystems keep mtime at one-second granularity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
}

impl Database {
    /// A reader that knows nothing: every lookup is empty and reloads do nothing.
    pub fn disabled() -> Database {
        Database {
            path: None,
            reader: ArcSwapOption::empty(),
            seen: Mutex::new(None),
            lookups: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    /// Reads the database at `path`. Fails if the file cannot be read, is not a MaxMind DB,
    /// or is not of the City schema (a Country or ASN database would silently yield
    /// nothing, which is worse than refusing to start).
    pub fn open(path: &Path) -> Result<Database, Error> {
        let seen = stat(path).map_err(|source| read_error(path, source))?;
        let reader = load(path)?;
        let geoip = Database {
            path: Some(path.to_path_buf()),
            seen: Mutex::new(Some(Ok(seen))),
            ..Database::disabled()
        };
        geoip.reader.store(Some(Arc::new(reader)));
        Ok(geoip)
    }

    pub fn is_enabled(&self) -> bool {
        self.path.is_some()
    }

    /// The database file, if GeoIP is enabled.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Re-reads the file if its mtime or size changed since the last attempt. `Ok(true)`
    /// means a new database is live. A file that fails to load leaves the previous
    /// database in service and returns the error once; later polls of the same bad file
    /// (or of a missing one) return `Ok(false)` until it changes again. Disabled: `Ok(false)`.
    pub fn reload_if_changed(&self) -> Result<bool, Error> {
        let Some(path) = self.path.as_deref() else {
            return Ok(false);
        };
        let mut seen = lock(&self.seen);
        let current = stat(path);
        let current_key = current.as_ref().copied().map_err(io::Error::kind);
        if seen.as_ref() == Some(&current_key) {
            return Ok(false);
        }
        *seen = Some(current_key);
        current.map_err(|source| read_error(path, source))?;
        self.swap_in(path)?;
        Ok(true)
    }

    /// Re-reads the file unconditionally (SIGHUP). On error the previous database stays in
    /// service. Disabled: does nothing.
    pub fn reload(&self) -> Result<(), Error> {
        let Some(path) = self.path.as_deref() else {
            return Ok(());
        };
        let mut seen = lock(&self.seen);
        *seen = Some(stat(path).map_err(|source| source.kind()));
        self.swap_in(path)
    }

    fn swap_in(&self, path: &Path) -> Result<(), Error> {
        let reader = load(path)?;
        self.reader.store(Some(Arc::new(reader)));
        Ok(())
    }

    /// Event enrichment: the `$geoip_*` properties the database knows for `ip` (English
    /// names), see [`Properties`]. Private, loopback, link-local, unspecified and unknown
    /// addresses give an empty list, which does not allocate.
    pub fn lookup(&self, ip: IpAddr) -> Properties {
        let mut out = Properties::new();
        self.lookup_into(ip, &mut out);
        out
    }

    /// [`Database::lookup`] appending to `out`, so a batch can reuse one buffer. Returns the
    /// number of properties appended.
    pub fn lookup_into(&self, ip: IpAddr, out: &mut Properties) -> usize {
        self.collect(ip, Detail::Event, out)
    }

    /// The seven properties PostHog's /decide merges into person properties before flag
    /// evaluation: `$geoip_city_name`, `$geoip_country_name`, `$geoip_country_code`,
    /// `$geoip_continent_name`, `$geoip_continent_code`, `$geoip_postal_code` and
    /// `$geoip_time_zone`, each only when known; all string values.
    pub fn decide_properties(&self, ip: IpAddr) -> Map<String, Value> {
        let mut found = Properties::new();
        self.collect(ip, Detail::Decide, &mut found);
        found
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect()
    }

    fn collect(&self, ip: IpAddr, detail: Detail, out: &mut Properties) -> usize {
        let ip = ip.to_canonical();
        if !is_locatable(ip) {
            return 0;
        }
        let guard = self.reader.load();
        let Some(reader) = guard.as_deref() else {
            return 0;
        };
        self.lookups.fetch_add(1, Relaxed);
        let before = out.len();
        match reader.lookup::<geoip2::City>(ip) {
            Ok(Some(record)) => push_properties(&record, detail, out),
            Ok(None) => {}
            Err(error) => {
                // A record that does not decode is a damaged file, not a bad request: count
                // it for the metrics and carry on without location. The address is not
                // logged; it is personal data.
                self.errors.fetch_add(1, Relaxed);
                tracing::debug!(%error, "geoip record could not be decoded");
            }
        }
        let added = out.len() - before;
        if added > 0 {
            self.hits.fetch_add(1, Relaxed);
        }
        added
    }

    /// Database lookups performed (addresses skipped as private or loopback not counted).
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Relaxed)
    }

    /// Lookups that produced at least one property; `lookups() - hits()` are misses.
    pub fn hits(&self) -> u64 {
        self.hits.load(Relaxed)
    }

    /// Lookups whose record failed to decode (a damaged database).
    pub fn errors(&self) -> u64 {
        self.errors.load(Relaxed)
    }
}

impl fmt::Debug for Database {
    // By hand: the derived form would print the whole database buffer.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Database")
            .field("path", &self.path)
            .field("lookups", &self.lookups())
            .field("hits", &self.hits())
            .field("errors", &self.errors())
            .finish_non_exhaustive()
    }
}

fn stat(path: &Path) -> io::Result<Stamp> {
    let meta = fs::metadata(path)?;
    Ok(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
    })
}

fn load(path: &Path) -> Result<Reader<Vec<u8>>, Error> {
    let bytes = fs::read(path).map_err(|source| read_error(path, source))?;
    let reader = Reader::from_source(bytes).map_err(|source| Error::Format {
        path: path.to_path_buf(),
        source,
    })?;
    let database_type = &reader.metadata.database_type;
    if !database_type.contains(CITY_SCHEMA_MARKER) {
        return Err(Error::NotCity {
            path: path.to_path_buf(),
            database_type: database_type.clone(),
        });
    }
    tracing::info!(
        path = %path.display(),
        database_type = %database_type,
        build_epoch = reader.metadata.build_epoch,
        "geoip database loaded"
    );
    Ok(reader)
}

fn read_error(path: &Path, source: io::Error) -> Error {
    Error::Read {
        path: path.to_path_buf(),
        source,
    }
}

/// Addresses that no GeoIP database can place. Skipping them saves the lookup and keeps
/// internal traffic (health checks, the proxy itself) out of the hit-rate metrics.
/// `ip` must already be canonical, so IPv4-mapped IPv6 addresses are judged as IPv4.
fn is_locatable(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            // 100.64.0.0/10 is carrier-grade NAT space, shared by many customers.
            let shared = a == 100 && (b & 0xc0) == 64;
            !(v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || shared)
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            // fc00::/7 unique local and fe80::/10 link-local, tested by hand because the std
            // helpers are newer than the crate's minimum Rust version.
            let unique_local = (first & 0xfe00) == 0xfc00;
            let link_local = (first & 0xffc0) == 0xfe80;
            !(v6.is_loopback() || v6.is_unspecified() || unique_local || link_local)
        }
    }
}

/// How much of a record to report.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Detail {
    /// The seven /decide keys.
    Decide,
    /// The seven plus coordinates and the first subdivision.
    Event,
}

fn push_properties(record: &geoip2::City<'_>, detail: Detail, out: &mut Properties) {
    let country = record.country.as_ref();
    let continent = record.continent.as_ref();
    let location = record.location.as_ref();
    let city_name = record.city.as_ref().and_then(|c| english(&c.names));
    push_str(out, "$geoip_city_name", city_name);
    push_str(
        out,
        "$geoip_country_name",
        country.and_then(|c| english(&c.names)),
    );
    push_str(out, "$geoip_country_code", country.and_then(|c| c.iso_code));
    push_str(
        out,
        "$geoip_continent_name",
        continent.and_then(|c| english(&c.names)),
    );
    push_str(out, "$geoip_continent_code", continent.and_then(|c| c.code));
    push_str(
        out,
        "$geoip_postal_code",
        record.postal.as_ref().and_then(|p| p.code),
    );
    push_str(out, "$geoip_time_zone", location.and_then(|l| l.time_zone));
    if detail == Detail::Decide {
        return;
    }
    push_number(out, "$geoip_latitude", location.and_then(|l| l.latitude));
    push_number(out, "$geoip_longitude", location.and_then(|l| l.longitude));
    let subdivision = record.subdivisions.as_ref().and_then(|s| s.first());
    push_str(
        out,
        "$geoip_subdivision_1_code",
        subdivision.and_then(|s| s.iso_code),
    );
    push_str(
        out,
        "$geoip_subdivision_1_name",
        subdivision.and_then(|s| english(&s.names)),
    );
}

fn english<'a>(names: &Option<BTreeMap<&'a str, &'a str>>) -> Option<&'a str> {
    names.as_ref()?.get("en").copied()
}

fn push_str(out: &mut Properties, key: &'static str, value: Option<&str>) {
    // An empty string is "unknown" in MaxMind data, and PostHog drops falsy values too.
    if let Some(value) = value.filter(|v| !v.is_empty()) {
        out.push((key, Value::String(value.to_owned())));
    }
}

fn push_number(out: &mut Properties, key: &'static str, value: Option<f64>) {
    // from_f64 refuses NaN and infinities, which JSON cannot carry.
    if let Some(number) = value.and_then(Number::from_f64) {
        out.push((key, Value::Number(number)));
    }
}
/// Why a GeoIP database or a trusted-proxy list was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database file could not be read.
    #[error("cannot read GeoIP database {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    /// The file is not a valid MaxMind database.
    #[error("{} is not a MaxMind database: {source}", path.display())]
    Format {
        path: PathBuf,
        source: MaxMindDbError,
    },
    /// A valid MaxMind database, but not of the City schema.
    #[error(
        "{} is a {database_type:?} database; GeoIP needs the City schema \
         (GeoLite2-City or GeoIP2-City)",
        path.display()
    )]
    NotCity {
        path: PathBuf,
        database_type: String,
    },
    /// An entry of the trusted-proxy list is neither an address nor a CIDR network.
    #[error(
        "invalid trusted proxy {entry:?}: expected an IP address or a CIDR network \
         such as 10.0.0.0/8"
    )]
    Proxy { entry: String },
}
