//! GeoIP end to end with MaxMind's test database: event and person enrichment, the
//! X-Forwarded-For trust rules, and the decide override.

use serde_json::{json, Value};

use crate::util::*;

fn test_db() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/data/GeoIP2-City-Test.mmdb").to_string()
}

fn capture_from(server: &Server, xff: &str, event: &str, distinct_id: &str) {
    let body = json!({"api_key": KEY_ONE, "event": event, "distinct_id": distinct_id});
    let r = server.request(Req::post("/capture/", body.to_string()).header("X-Forwarded-For", xff));
    assert_eq!(r.status, 200);
}

fn find<'a>(events: &'a [Value], name: &str) -> &'a Value {
    events.iter().find(|e| e["event"] == name).unwrap()
}

#[test]
fn events_and_persons_are_enriched_through_a_trusted_proxy() {
    let server = Server::start_with(&["--geoip", &test_db()]);
    capture_from(
        &server,
        "6.6.6.6, 81.2.69.160, 127.0.0.1",
        "from-london",
        "visitor",
    );
    capture_from(&server, "2.125.160.216", "from-boxford", "visitor");
    capture_from(&server, "2001:218::1", "from-japan", "tokyo");
    capture_from(&server, "192.168.1.9", "from-lan", "lan");
    let body = json!({"api_key": KEY_ONE, "event": "opted-out", "distinct_id": "quiet", "properties": {"$geoip_disable": true}});
    server
        .request(Req::post("/capture/", body.to_string()).header("X-Forwarded-For", "81.2.69.160"));
    let events = server.settle(1);

    let london = &find(&events, "from-london")["properties"];
    assert_eq!(
        london["$ip"], "81.2.69.160",
        "the rightmost X-Forwarded-For entry that is not a trusted proxy"
    );
    assert_eq!(london["$geoip_city_name"], "London");
    assert_eq!(london["$geoip_country_code"], "GB");
    assert_eq!(london["$geoip_country_name"], "United Kingdom");
    assert_eq!(london["$geoip_continent_code"], "EU");
    assert_eq!(london["$geoip_time_zone"], "Europe/London");
    let boxford = &find(&events, "from-boxford")["properties"];
    assert_eq!(boxford["$geoip_city_name"], "Boxford");
    assert_eq!(boxford["$geoip_postal_code"], "OX1");
    let japan = &find(&events, "from-japan")["properties"];
    assert_eq!(japan["$geoip_country_code"], "JP");
    let lan = &find(&events, "from-lan")["properties"];
    assert!(
        lan.as_object()
            .unwrap()
            .keys()
            .all(|k| !k.starts_with("$geoip")),
        "{lan}"
    );
    let quiet = &find(&events, "opted-out")["properties"];
    assert!(quiet.get("$geoip_city_name").is_none());

    let r = server.api("/api/projects/1/persons/?distinct_id=visitor", PERSONAL_ONE);
    let person = &r.json()["results"][0]["properties"];
    assert_eq!(person["$geoip_city_name"], "Boxford", "latest location");
    assert_eq!(
        person["$initial_geoip_city_name"], "London",
        "first location"
    );
    let metrics = server.get("/metrics").text();
    assert!(metrics.contains("flagpost_geoip_hits_total"), "{metrics}");
}

#[test]
fn an_untrusted_peer_cannot_choose_its_address() {
    // Only 10.9.9.9 is trusted: the test client (127.0.0.1) is not a proxy.
    let server = Server::start_with(&["--geoip", &test_db(), "--trusted-proxies", "10.9.9.9"]);
    capture_from(&server, "81.2.69.160", "spoofed", "mallory");
    let events = server.settle(1);
    let props = &find(&events, "spoofed")["properties"];
    assert_eq!(props["$ip"], "127.0.0.1");
    assert!(props.get("$geoip_city_name").is_none());
}

#[test]
fn decide_uses_the_location_of_x_forwarded_for() {
    let server = Server::start_with(&["--geoip", &test_db()]);
    let rules = json!({"flags": [{"id": 1, "key": "uk-only", "active": true, "filters": {"groups": [
        {"properties": [{"key": "$geoip_country_code", "value": "GB", "operator": "exact", "type": "person"}], "rollout_percentage": 100}]}}]});
    std::fs::write(server.data().join("flags/1.json"), rules.to_string()).unwrap();
    server.sighup();
    let decide = |xff: Option<&str>, props: Value| {
        let body =
            json!({"token": KEY_ONE, "distinct_id": "d", "person_properties": props}).to_string();
        let mut req = Req::post("/decide/?v=3", body);
        if let Some(xff) = xff {
            req = req.header("X-Forwarded-For", xff);
        }
        server.request(req).json()["featureFlags"]["uk-only"].clone()
    };
    wait_for("the rules", || {
        (decide(Some("81.2.69.160"), json!({})) == true).then_some(())
    });
    assert_eq!(decide(Some("2.125.160.216"), json!({})), true);
    assert_eq!(decide(Some("2001:218::"), json!({})), false);
    // Without the header: the client address, loopback here, locates nowhere.
    assert_eq!(decide(None, json!({})), false);
    // The request's own person properties still win.
    assert_eq!(
        decide(Some("2001:218::"), json!({"$geoip_country_code": "GB"})),
        true
    );
}

#[test]
fn without_a_database_geoip_is_off_and_said_once() {
    let server = Server::start();
    capture_from(&server, "81.2.69.160", "no-db", "d");
    let events = server.settle(1);
    assert!(find(&events, "no-db")["properties"]
        .get("$geoip_city_name")
        .is_none());
    assert_eq!(
        server.log().matches("GeoIP is off").count(),
        1,
        "{}",
        server.log()
    );
}
