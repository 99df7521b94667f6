//! `$ip` and a project's `anonymize_ips`, as forwarded. PostHog's ingestion deletes
//! `$ip` from the events of a team with `anonymize_ips` (after its GeoIP step), and
//! adds the request's address only to those of other teams, so an edge must not hand
//! upstream the address it resolved for such a project, nor the one a client sent:
//! upstream would have nothing to drop it from once the edge's batch carries it.

use serde_json::{json, Value};

use super::wait_kept;
use crate::edge::fake::Fake;
use crate::util::*;

#[test]
fn an_anonymized_project_forwards_no_address_and_the_others_their_clients() {
    let fake = Fake::start(None);
    let tmp = data_dir();
    let projects = format!(
        r#"{{"projects": [
            {{"id": 1, "name": "one", "api_key": "{KEY_ONE}", "personal_api_keys": ["{PERSONAL_ONE}"], "anonymize_ips": true}},
            {{"id": 2, "name": "two", "api_key": "{KEY_TWO}", "personal_api_keys": ["{PERSONAL_TWO}"]}}
        ]}}"#
    );
    std::fs::write(tmp.path().join("data/projects.json"), projects).unwrap();
    let mut edge = Server::spawn(tmp.path(), &["--upstream", &fake.url()]);
    edge.keep(tmp);

    let mut sent = Vec::new();
    for (key, ip, own) in [
        (KEY_ONE, "198.51.100.1", None),
        (KEY_ONE, "198.51.100.2", Some("203.0.113.50")),
        (KEY_TWO, "198.51.100.3", None),
        (KEY_TWO, "198.51.100.4", Some("203.0.113.60")),
    ] {
        let uuid = uuid::Uuid::now_v7().to_string();
        let mut properties = json!({"from": ip});
        if let Some(own) = own {
            properties["$ip"] = json!(own);
        }
        let body = json!({"api_key": key, "event": "seen", "distinct_id": ip, "uuid": uuid,
                          "properties": properties});
        let r = edge.request(Req::post("/i/v0/e/", body.to_string()).header("X-Forwarded-For", ip));
        assert_eq!(r.status, 200);
        sent.push(uuid);
    }
    let kept = wait_kept(&fake, &edge, &sent);
    let forwarded: Vec<Value> = sent
        .iter()
        .map(|u| serde_json::from_str(&kept[u][0]).unwrap())
        .collect();
    for e in &forwarded[..2] {
        assert_eq!(e["properties"].get("$ip"), None, "{e}");
    }
    // Other projects: the client's own `$ip` wins, else the resolved address.
    assert_eq!(forwarded[2]["properties"]["$ip"], "198.51.100.3");
    assert_eq!(forwarded[3]["properties"]["$ip"], "203.0.113.60");
    // What the edge itself stores is what it forwards.
    for e in edge.stored_events(1) {
        assert_eq!(e["properties"].get("$ip"), None, "{e}");
    }
    let deliveries = fake.with(|s| s.deliveries.clone());
    assert!(deliveries
        .iter()
        .filter(|d| d.kept)
        .all(|d| d.api_key == KEY_ONE || d.api_key == KEY_TWO));
}
