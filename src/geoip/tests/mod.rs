//! GeoIP tests against the MaxMind test database: lookups, properties, opening and
//! reloading files; `proxy.rs` tests which peer's forwarded address is believed.

mod proxy;

use super::*;
use serde_json::json;
use std::time::Duration;

fn test_db() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/GeoIP2-City-Test.mmdb")
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// A directory removed on drop, unique per test so tests can run in parallel.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("geoip-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Writes `bytes` to `path` and moves its mtime well past any earlier write, so change
/// detection does not depend on the filesystem's timestamp granularity.
fn write_file(path: &Path, bytes: &[u8], generation: u64) {
    fs::write(path, bytes).unwrap();
    let file = fs::File::options().write(true).open(path).unwrap();
    let mtime = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + generation * 10);
    file.set_modified(mtime).unwrap();
}

fn live_reader(geoip: &Database) -> Arc<Reader<Vec<u8>>> {
    geoip.reader.load_full().unwrap()
}

fn london() -> Properties {
    vec![
        ("$geoip_city_name", json!("London")),
        ("$geoip_country_name", json!("United Kingdom")),
        ("$geoip_country_code", json!("GB")),
        ("$geoip_continent_name", json!("Europe")),
        ("$geoip_continent_code", json!("EU")),
        ("$geoip_time_zone", json!("Europe/London")),
        ("$geoip_latitude", json!(51.5142)),
        ("$geoip_longitude", json!(-0.0931)),
        ("$geoip_subdivision_1_code", json!("ENG")),
        ("$geoip_subdivision_1_name", json!("England")),
    ]
}

#[test]
fn london_ipv4_has_every_known_property_and_no_postal_code() {
    let geoip = Database::open(&test_db()).unwrap();
    assert_eq!(geoip.lookup(ip("81.2.69.160")), london());
}

#[test]
fn boxford_has_postal_code_and_first_subdivision_only() {
    let geoip = Database::open(&test_db()).unwrap();
    let expected = vec![
        ("$geoip_city_name", json!("Boxford")),
        ("$geoip_country_name", json!("United Kingdom")),
        ("$geoip_country_code", json!("GB")),
        ("$geoip_continent_name", json!("Europe")),
        ("$geoip_continent_code", json!("EU")),
        ("$geoip_postal_code", json!("OX1")),
        ("$geoip_time_zone", json!("Europe/London")),
        ("$geoip_latitude", json!(51.75)),
        ("$geoip_longitude", json!(-1.25)),
        ("$geoip_subdivision_1_code", json!("ENG")),
        ("$geoip_subdivision_1_name", json!("England")),
    ];
    assert_eq!(geoip.lookup(ip("2.125.160.216")), expected);
}

#[test]
fn japan_ipv6_has_country_level_properties_only() {
    let geoip = Database::open(&test_db()).unwrap();
    let expected = vec![
        ("$geoip_country_name", json!("Japan")),
        ("$geoip_country_code", json!("JP")),
        ("$geoip_continent_name", json!("Asia")),
        ("$geoip_continent_code", json!("AS")),
        ("$geoip_time_zone", json!("Asia/Tokyo")),
        ("$geoip_latitude", json!(35.68536)),
        ("$geoip_longitude", json!(139.75309)),
    ];
    assert_eq!(geoip.lookup(ip("2001:218::")), expected);
    // Anywhere in the /32 network, not only its first address.
    assert_eq!(geoip.lookup(ip("2001:218:ffff::1")), expected);
}

#[test]
fn ipv4_mapped_ipv6_is_looked_up_as_ipv4() {
    let geoip = Database::open(&test_db()).unwrap();
    assert_eq!(geoip.lookup(ip("::ffff:81.2.69.160")), london());
    assert!(geoip.lookup(ip("::ffff:10.0.0.1")).is_empty());
}

#[test]
fn lookup_into_appends_after_existing_entries() {
    let geoip = Database::open(&test_db()).unwrap();
    let mut out = vec![("$ip", json!("81.2.69.160"))];
    assert_eq!(geoip.lookup_into(ip("81.2.69.160"), &mut out), 10);
    assert_eq!(out[0], ("$ip", json!("81.2.69.160")));
    assert_eq!(out[1..], london()[..]);
    assert_eq!(geoip.lookup_into(ip("10.0.0.1"), &mut out), 0);
    assert_eq!(out.len(), 11);
}

#[test]
fn unlocatable_and_unknown_addresses_are_empty() {
    let geoip = Database::open(&test_db()).unwrap();
    let skipped = [
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "127.0.0.1",
        "169.254.1.1",
        "0.0.0.0",
        "255.255.255.255",
        "::1",
        "::",
        "fc00::1",
        "fd12:3456::1",
        "fe80::1",
    ];
    for text in skipped {
        assert_eq!(geoip.lookup(ip(text)), vec![], "{text}");
        assert_eq!(geoip.decide_properties(ip(text)), Map::new(), "{text}");
    }
    // Skipped addresses never reach the database.
    assert_eq!(geoip.lookups(), 0);

    for text in ["1.1.1.1", "2001:db8::1"] {
        assert_eq!(geoip.lookup(ip(text)), vec![], "{text}");
    }
    assert_eq!((geoip.lookups(), geoip.hits(), geoip.errors()), (2, 0, 0));
    geoip.lookup(ip("81.2.69.160"));
    assert_eq!((geoip.lookups(), geoip.hits()), (3, 1));
}

#[test]
fn decide_properties_are_the_seven_string_properties() {
    let geoip = Database::open(&test_db()).unwrap();
    let boxford = geoip.decide_properties(ip("2.125.160.216"));
    let expected = json!({
        "$geoip_city_name": "Boxford",
        "$geoip_country_name": "United Kingdom",
        "$geoip_country_code": "GB",
        "$geoip_continent_name": "Europe",
        "$geoip_continent_code": "EU",
        "$geoip_postal_code": "OX1",
        "$geoip_time_zone": "Europe/London",
    });
    assert_eq!(Value::Object(boxford.clone()), expected);
    let keys: Vec<&str> = boxford.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "$geoip_city_name",
            "$geoip_country_name",
            "$geoip_country_code",
            "$geoip_continent_name",
            "$geoip_continent_code",
            "$geoip_postal_code",
            "$geoip_time_zone",
        ]
    );

    let japan = geoip.decide_properties(ip("2001:218::"));
    let expected = json!({
        "$geoip_country_name": "Japan",
        "$geoip_country_code": "JP",
        "$geoip_continent_name": "Asia",
        "$geoip_continent_code": "AS",
        "$geoip_time_zone": "Asia/Tokyo",
    });
    assert_eq!(Value::Object(japan), expected);
    assert_eq!(geoip.decide_properties(ip("81.2.69.160")).len(), 6);
}

#[test]
fn disabled_knows_nothing_and_reloads_nothing() {
    let geoip = Database::disabled();
    assert!(!geoip.is_enabled());
    assert_eq!(geoip.path(), None);
    assert_eq!(geoip.lookup(ip("81.2.69.160")), vec![]);
    assert_eq!(geoip.decide_properties(ip("81.2.69.160")), Map::new());
    assert!(matches!(geoip.reload_if_changed(), Ok(false)));
    geoip.reload().unwrap();
    assert_eq!(geoip.lookups(), 0);
}

#[test]
fn open_refuses_missing_garbage_truncated_and_non_city_files() {
    let dir = TempDir::new("open");
    let missing = dir.0.join("missing.mmdb");
    assert!(matches!(Database::open(&missing), Err(Error::Read { .. })));

    let garbage = dir.0.join("garbage.mmdb");
    fs::write(&garbage, b"this is not a database").unwrap();
    assert!(matches!(
        Database::open(&garbage),
        Err(Error::Format { .. })
    ));

    let db = fs::read(test_db()).unwrap();
    let truncated = dir.0.join("truncated.mmdb");
    fs::write(&truncated, &db[..db.len() / 2]).unwrap();
    assert!(matches!(
        Database::open(&truncated),
        Err(Error::Format { .. })
    ));

    // The same database with its metadata type renamed: a valid MMDB of another schema.
    let country = dir.0.join("country.mmdb");
    fs::write(
        &country,
        rename_database_type(&db, b"GeoIP2-City", b"GeoIP2-Ctry"),
    )
    .unwrap();
    match Database::open(&country) {
        Err(error @ Error::NotCity { .. }) => assert_eq!(
            error.to_string(),
            format!(
                "{} is a \"GeoIP2-Ctry\" database; GeoIP needs the City schema \
                 (GeoLite2-City or GeoIP2-City)",
                country.display()
            )
        ),
        other => panic!("expected NotCity, got {other:?}"),
    }
}

/// Replaces the database type string in the metadata section (after the last marker).
fn rename_database_type(db: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    const MARKER: &[u8] = b"\xab\xcd\xefMaxMind.com";
    let metadata = db.windows(MARKER.len()).rposition(|w| w == MARKER).unwrap();
    let at = metadata
        + db[metadata..]
            .windows(from.len())
            .position(|w| w == from)
            .unwrap();
    let mut out = db.to_vec();
    out[at..at + to.len()].copy_from_slice(to);
    out
}

#[test]
fn reload_if_changed_swaps_on_change_and_keeps_old_reader_on_bad_file() {
    let dir = TempDir::new("reload");
    let path = dir.0.join("GeoLite2-City.mmdb");
    let db = fs::read(test_db()).unwrap();
    write_file(&path, &db, 1);
    let geoip = Database::open(&path).unwrap();
    assert!(geoip.is_enabled());
    assert_eq!(geoip.path(), Some(path.as_path()));
    assert!(matches!(geoip.reload_if_changed(), Ok(false)));

    // Same bytes, new mtime: a new database object goes live.
    let first = live_reader(&geoip);
    write_file(&path, &db, 2);
    assert!(matches!(geoip.reload_if_changed(), Ok(true)));
    let second = live_reader(&geoip);
    assert!(!Arc::ptr_eq(&first, &second));
    assert!(matches!(geoip.reload_if_changed(), Ok(false)));

    // A corrupt file is reported once and the previous database keeps answering.
    write_file(&path, b"corrupt", 3);
    assert!(matches!(
        geoip.reload_if_changed(),
        Err(Error::Format { .. })
    ));
    assert!(Arc::ptr_eq(&second, &live_reader(&geoip)));
    assert_eq!(geoip.lookup(ip("81.2.69.160")), london());
    assert!(matches!(geoip.reload_if_changed(), Ok(false)));
    // An explicit reload always re-reads, so it reports the bad file again.
    assert!(matches!(geoip.reload(), Err(Error::Format { .. })));

    // A missing file likewise.
    fs::remove_file(&path).unwrap();
    assert!(matches!(geoip.reload_if_changed(), Err(Error::Read { .. })));
    assert!(matches!(geoip.reload_if_changed(), Ok(false)));
    assert_eq!(geoip.lookup(ip("81.2.69.160")), london());

    // Fixed: picked up by the next poll.
    write_file(&path, &db, 4);
    assert!(matches!(geoip.reload_if_changed(), Ok(true)));
    assert!(!Arc::ptr_eq(&second, &live_reader(&geoip)));
    geoip.reload().unwrap();
    assert_eq!(geoip.lookup(ip("2.125.160.216")).len(), 11);
}

#[test]
fn reload_detects_a_size_change_with_the_same_mtime() {
    let dir = TempDir::new("size");
    let path = dir.0.join("db.mmdb");
    let db = fs::read(test_db()).unwrap();
    write_file(&path, &db, 1);
    let geoip = Database::open(&path).unwrap();
    write_file(&path, &db[..100], 1);
    assert!(matches!(
        geoip.reload_if_changed(),
        Err(Error::Format { .. })
    ));
}

#[test]
fn lookups_continue_during_reloads() {
    let geoip = Arc::new(Database::open(&test_db()).unwrap());
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let geoip = Arc::clone(&geoip);
            std::thread::spawn(move || {
                for _ in 0..2_000 {
                    assert_eq!(geoip.lookup(ip("81.2.69.160")).len(), 10);
                }
            })
        })
        .collect();
    for _ in 0..20 {
        geoip.reload().unwrap();
    }
    for reader in readers {
        reader.join().unwrap();
    }
    assert_eq!(geoip.hits(), 4_000);
}
