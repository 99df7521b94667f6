//! The compactor and the read API end to end: captured events become stored events,
//! persons and groups that the API returns, to the right keys only.

use std::collections::HashSet;

use serde_json::{json, Value};

use crate::util::*;

fn capture(server: &Server, body: Value) {
    let r = server.post("/batch/", body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn events_persons_and_groups_through_the_api() {
    let server = Server::start();
    capture(
        &server,
        json!({"api_key": KEY_ONE, "batch": [
            {"event": "$pageview", "properties": {"distinct_id": "anon-7", "$current_url": "https://shop/", "$set_once": {"first_seen": "ad"}}},
            {"event": "$identify", "properties": {"distinct_id": "ada@example.com", "$anon_distinct_id": "anon-7", "$set": {"email": "ada@example.com"}}},
            {"event": "$groupidentify", "properties": {"distinct_id": "ada@example.com", "$group_type": "company", "$group_key": "acme", "$group_set": {"seats": 12}}},
            {"event": "order placed", "properties": {"distinct_id": "anon-7", "$groups": {"company": "acme"}, "amount": 30}},
            {"event": "$feature_flag_called", "properties": {"distinct_id": "ada@example.com", "$feature_flag": "beta", "$feature_flag_response": "test", "$feature/beta": "test"}},
            {"event": "$screen", "properties": {"distinct_id": "ada@example.com", "$screen_name": "Home"}}
        ]}),
    );
    capture(
        &server,
        json!({"api_key": KEY_TWO, "batch": [{"event": "other", "properties": {"distinct_id": "x"}}]}),
    );
    let events = server.wait_for_events(1, 6);
    assert_eq!(events.len(), 6);
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "$screen",
            "$feature_flag_called",
            "order placed",
            "$groupidentify",
            "$identify",
            "$pageview"
        ]
    );
    let person_ids: HashSet<&str> = events
        .iter()
        .map(|e| e["person_id"].as_str().unwrap())
        .collect();
    assert_eq!(person_ids.len(), 1, "every event belongs to ada");
    let flag = &events[1]["properties"];
    assert_eq!(
        (
            flag["$feature_flag"].as_str(),
            flag["$feature_flag_response"].as_str()
        ),
        (Some("beta"), Some("test"))
    );
    assert_eq!(flag["$feature/beta"], "test");
    assert_eq!(events[0]["properties"]["$screen_name"], "Home");
    assert_eq!(events[2]["properties"]["$group_0"], "acme");
    assert_eq!(events[5]["properties"]["$current_url"], "https://shop/");
    assert_eq!(events[5]["properties"]["$ip"], "127.0.0.1");
    for e in &events {
        for field in [
            "id",
            "event",
            "distinct_id",
            "properties",
            "timestamp",
            "person_id",
        ] {
            assert!(e.get(field).is_some(), "{field} in {e}");
        }
    }

    let r = server.api("/api/projects/1/persons/?distinct_id=anon-7", PERSONAL_ONE);
    assert_eq!(r.status, 200);
    let person = &r.json()["results"][0];
    assert_eq!(person["id"].as_str(), person_ids.iter().next().copied());
    assert_eq!(
        person["properties"],
        json!({"first_seen": "ad", "email": "ada@example.com"})
    );
    let mut ids: Vec<&str> = person["distinct_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["ada@example.com", "anon-7"]);
    let r = server.api("/api/projects/1/persons/?distinct_id=nobody", PERSONAL_ONE);
    assert_eq!(r.json(), json!({"results": [], "next": null}));

    let r = server.api(
        "/api/projects/1/groups/?group_type_index=0&group_key=acme",
        PERSONAL_ONE,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let g = r.json();
    assert_eq!(
        (g["group_key"].as_str(), g["group_properties"].clone()),
        (Some("acme"), json!({"seats": 12}))
    );
    assert_eq!(
        server
            .api(
                "/api/projects/1/groups/?group_type_index=0&group_key=nope",
                PERSONAL_ONE
            )
            .status,
        404
    );
    assert_eq!(
        server.api("/api/projects/1/groups/", PERSONAL_ONE).status,
        400
    );

    // Filters.
    let r = server.api("/api/projects/1/events/?event=%24pageview", PERSONAL_ONE);
    assert_eq!(r.json()["results"].as_array().unwrap().len(), 1);
    let r = server.api("/api/projects/1/events/?distinct_id=anon-7", PERSONAL_ONE);
    assert_eq!(r.json()["results"].as_array().unwrap().len(), 2);
    let r = server.api(
        "/api/projects/1/events/?after=2100-01-01T00:00:00Z",
        PERSONAL_ONE,
    );
    assert_eq!(r.json()["results"], json!([]));
    let r = server.api("/api/projects/1/events/?before=2000-01-01", PERSONAL_ONE);
    assert_eq!(r.json()["results"], json!([]));
    assert_eq!(
        server
            .api("/api/projects/1/events/?after=soon", PERSONAL_ONE)
            .status,
        400
    );
    // Projects do not see each other's events.
    assert_eq!(server.wait_for_events(2, 1).len(), 1);
}

#[test]
fn paging_and_ndjson_export_return_every_event_once() {
    let server = Server::start();
    let batch: Vec<Value> = (0..250)
        .map(|i| json!({"event": "tick", "uuid": uuid::Uuid::now_v7(), "properties": {"distinct_id": format!("u{}", i % 7), "i": i}}))
        .collect();
    capture(&server, json!({"api_key": KEY_ONE, "batch": batch}));
    server.wait_for_events(1, 250);

    let mut seen = Vec::new();
    let mut url = "/api/projects/1/events/?limit=100".to_string();
    loop {
        let page = server.api(&url, PERSONAL_ONE).json();
        seen.extend(
            page["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].as_str().unwrap().to_string()),
        );
        match page["next"].as_str() {
            Some(next) => {
                url = next
                    .split_once("localhost")
                    .map_or(next, |(_, p)| p)
                    .to_string()
            }
            None => break,
        }
    }
    assert_eq!(seen.len(), 250);
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 250);

    let r = server.request(
        Req::get("/api/projects/1/events/")
            .header("Authorization", &format!("Bearer {PERSONAL_ONE}"))
            .header("Accept", "application/x-ndjson"),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    let lines: Vec<Value> = r
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 250);
    let mut is: Vec<i64> = lines
        .iter()
        .map(|e| e["properties"]["i"].as_i64().unwrap())
        .collect();
    is.sort();
    assert_eq!(is, (0..250).collect::<Vec<_>>());
}

#[test]
fn read_api_keys() {
    let server = Server::start();
    let no_key = server.get("/api/projects/1/events/");
    assert_eq!(no_key.status, 401);
    assert_eq!(no_key.json()["code"], "not_authenticated");
    assert_eq!(
        server.api("/api/projects/1/events/", KEY_ONE).status,
        401,
        "a project key never reads"
    );
    assert_eq!(
        server.api("/api/projects/1/events/", "phx_unknown").status,
        401
    );
    let other = server.api("/api/projects/1/events/", PERSONAL_TWO);
    assert_eq!(other.status, 403);
    assert_eq!(other.json()["code"], "permission_denied");
    assert_eq!(
        server.api("/api/projects/99/persons/", PERSONAL_ONE).status,
        403
    );
    assert_eq!(
        server.api("/api/projects/1/events/", PERSONAL_ONE).status,
        200
    );
    assert_eq!(
        server
            .api("/api/projects/2/groups/?group_type_index=0", PERSONAL_TWO)
            .status,
        200
    );
    assert_eq!(
        server
            .request(
                Req::post("/api/projects/1/events/", "{}")
                    .header("Authorization", &format!("Bearer {PERSONAL_ONE}"))
            )
            .status,
        405
    );
}

#[test]
fn exactly_once_across_hard_kills_during_compaction() {
    let mut server = Server::start();
    let mut acked = HashSet::new();
    for round in 0..4 {
        let addr = server.addr;
        let round_acked: Vec<String> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|w| {
                    s.spawn(move || {
                        let mut ok = Vec::new();
                        for i in 0..25 {
                            let ids: Vec<String> = (0..20).map(|_| uuid::Uuid::now_v7().to_string()).collect();
                            let batch: Vec<Value> = ids
                                .iter()
                                .map(|id| json!({"event": "crash", "uuid": id, "properties": {"distinct_id": format!("r{round}w{w}"), "$set": {"i": i}}}))
                                .collect();
                            let r = send(addr, Req::post("/batch/", json!({"api_key": KEY_ONE, "batch": batch}).to_string()));
                            if r.status == 200 {
                                ok.extend(ids);
                            }
                        }
                        ok
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect()
        });
        acked.extend(round_acked);
        // Killed with the compactor most likely mid-way through the backlog.
        server = server.restart_hard();
    }
    let ids: Vec<String> = server
        .settle(1)
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(ids.len(), unique.len(), "no event stored twice");
    assert_eq!(unique.len(), acked.len());
    assert!(
        acked.iter().all(|id| unique.contains(id)),
        "no acknowledged event lost"
    );
}
