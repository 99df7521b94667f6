//! Two nodes behind one balancer: separate databases, the same data dir (projects and
//! flags). They agree on every person no merge touched, because a person's id derives
//! from the project and the distinct id; a merge only one node saw is where they part.

use serde_json::{json, Value};

use crate::util::*;

/// PostHog's person ids for project 1 (Python: `uuid5(UUID("932979b4-65c3-4424-8467-
/// 0b66ec27bc22"), "1:u1")`), which both nodes must give.
const PERSON_1_U1: &str = "66545e47-9600-5f24-95fd-044cb5baa8f0";
const PERSON_1_ANON_9: &str = "8f213645-5ba9-5653-a074-e7ae1872740e";

const RULES: &str = r#"{"flags": [{"id": 1, "key": "pro-only", "active": true,
    "filters": {"groups": [{"properties": [{"key": "plan", "value": "pro", "operator": "exact", "type": "person"}],
                            "rollout_percentage": 100}]}}],
    "group_type_mapping": {}, "cohorts": {}}"#;

/// A node with its own database and `shared` as its data dir.
fn node(shared: &std::path::Path) -> (Server, tempfile::TempDir) {
    let own = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(shared.join("data"), own.path().join("data")).unwrap();
    (Server::spawn(own.path(), &[]), own)
}

fn capture(node: &Server, event: Value) {
    let mut body = event;
    body["api_key"] = json!(KEY_ONE);
    let r = node.post("/capture/", body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
}

/// The person of `distinct_id` on `node`: id, sorted distinct ids, properties.
fn person(node: &Server, distinct_id: &str) -> (String, Vec<String>, Value) {
    let path = format!("/api/projects/1/persons/?distinct_id={distinct_id}");
    let r = node.api(&path, PERSONAL_ONE);
    assert_eq!(r.status, 200, "{}", r.text());
    let p = &r.json()["results"][0];
    let mut ids: Vec<String> = p["distinct_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    ids.sort();
    (
        p["id"].as_str().unwrap().to_string(),
        ids,
        p["properties"].clone(),
    )
}

fn pro_only(node: &Server, distinct_id: &str) -> Value {
    let body = json!({"token": KEY_ONE, "distinct_id": distinct_id});
    let r = node.post("/decide/?v=3", body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["featureFlags"]["pro-only"].clone()
}

#[test]
fn two_nodes_agree_on_unmerged_persons_and_part_on_a_merge_one_saw() {
    let shared = data_dir();
    std::fs::write(shared.path().join("data/flags/1.json"), RULES).unwrap();
    let (a, _a_dir) = node(shared.path());
    let (b, _b_dir) = node(shared.path());

    // The same user on both nodes, its property set on both.
    let pro = json!({"event": "$pageview", "distinct_id": "u1", "$set": {"plan": "pro"}});
    capture(&a, pro.clone());
    capture(&b, pro);
    // An anonymous visitor seen by node B only, so far.
    capture(&b, json!({"event": "$pageview", "distinct_id": "anon-9"}));
    a.settle(1);
    b.settle(1);

    let u1 = (
        PERSON_1_U1.to_string(),
        vec!["u1".to_string()],
        json!({"plan": "pro"}),
    );
    assert_eq!(person(&a, "u1"), u1);
    assert_eq!(person(&b, "u1"), u1);
    assert_eq!(
        (pro_only(&a, "u1"), pro_only(&b, "u1")),
        (json!(true), json!(true))
    );

    // The visitor logs in as u1; the $identify reaches node A only.
    capture(
        &a,
        json!({"event": "$identify", "distinct_id": "u1",
               "properties": {"$anon_distinct_id": "anon-9"}}),
    );
    a.settle(1);

    // Node A: the anonymous id joined u1's person.
    let merged = (
        PERSON_1_U1.to_string(),
        vec!["anon-9".to_string(), "u1".to_string()],
        json!({"plan": "pro"}),
    );
    assert_eq!(person(&a, "anon-9"), merged);
    assert_eq!(person(&a, "u1"), merged);
    // Node B never saw the merge: the anonymous id is still its own person, without
    // u1's properties, so the flag answers differently for it.
    assert_eq!(
        person(&b, "anon-9"),
        (
            PERSON_1_ANON_9.to_string(),
            vec!["anon-9".to_string()],
            json!({})
        )
    );
    assert_eq!(person(&b, "u1"), u1);
    assert_eq!(
        (pro_only(&a, "anon-9"), pro_only(&b, "anon-9")),
        (json!(true), json!(false))
    );
    // The identified id still agrees on both.
    assert_eq!(
        (pro_only(&a, "u1"), pro_only(&b, "u1")),
        (json!(true), json!(true))
    );

    // The events each node stored (and would sink) carry the same person for u1; B's
    // event of the anonymous id keeps the person A merged away.
    let persons_of = |node: &Server| {
        let mut seen: Vec<(String, String, String)> = node
            .stored_events(1)
            .into_iter()
            .filter(|e| e["distinct_id"] != "settle")
            .map(|e| {
                let field = |k: &str| e[k].as_str().unwrap().to_string();
                (field("event"), field("distinct_id"), field("person_id"))
            })
            .collect();
        seen.sort();
        seen
    };
    let row = |event: &str, id: &str, person: &str| {
        (event.to_string(), id.to_string(), person.to_string())
    };
    assert_eq!(
        persons_of(&a),
        [
            row("$identify", "u1", PERSON_1_U1),
            row("$pageview", "u1", PERSON_1_U1)
        ]
    );
    assert_eq!(
        persons_of(&b),
        [
            row("$pageview", "anon-9", PERSON_1_ANON_9),
            row("$pageview", "u1", PERSON_1_U1)
        ]
    );
}
