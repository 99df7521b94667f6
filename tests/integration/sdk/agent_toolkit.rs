//! PostHog's agent toolkit (`@posthog/agent-toolkit`, the tools PostHog gives AI agents)
//! managing flags through flagpost's REST API, unchanged, from
//! `tests/sdk/node/agent_toolkit.mjs`: the AI SDK runs the toolkit's tools as an agent
//! would, a scripted model choosing each call. Each step is one run of the script; the
//! flags file and `/decide` are checked between them.

use std::path::Path;

use serde_json::{json, Value};

use super::*;
use crate::util::*;

/// The key the toolkit holds, kept in projects.json only as its hash.
const AGENT_KEY: &str = "phx_agent_toolkit_key_kept_hashed";

struct Agent {
    server: Server,
    host: String,
}

impl Agent {
    /// One tool call; the toolkit first asks who its key is, as it does every run.
    fn call(&self, tool: &str, input: Value) -> Value {
        let input = input.to_string();
        let args = [
            "node/agent_toolkit.mjs",
            &self.host,
            AGENT_KEY,
            tool,
            &input,
        ];
        let out = run(Path::new("node"), &args);
        assert_eq!(out["error"], Value::Null, "{tool}: {out}");
        assert_eq!(
            out["tools"],
            json!([
                "create-feature-flag",
                "delete-feature-flag",
                "feature-flag-get-all",
                "feature-flag-get-definition",
                "update-feature-flag"
            ]),
            "the tools the key's scopes allow"
        );
        let requests: Vec<String> = array(&out["requests"])
            .iter()
            .map(|r| {
                format!(
                    "{} {} {}",
                    r["method"].as_str().unwrap(),
                    r["path"].as_str().unwrap(),
                    r["status"]
                )
            })
            .collect();
        assert_eq!(
            requests[..2],
            [
                "GET /api/personal_api_keys/@current 200",
                "GET /api/users/@me/ 200"
            ]
        );
        json!({"output": out["output"], "requests": requests[2..]})
    }

    fn flag_in_file(&self) -> Value {
        let text = std::fs::read_to_string(self.server.data().join("flags/1.json")).unwrap();
        let file: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(array(&file["flags"]).len(), 1, "{file}");
        file["flags"][0].clone()
    }

    fn decide(&self, email: &str) -> Value {
        let body = json!({"api_key": KEY_ONE, "distinct_id": email,
                          "person_properties": {"email": email}});
        let r = self.server.post("/decide/?v=3", body.to_string());
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["featureFlags"]["acme-rollout"].clone()
    }
}

fn acme(rollout: u32) -> Value {
    json!({"groups": [{"properties": [{"key": "email", "value": "@acme.com", "operator": "icontains"}],
                       "rollout_percentage": rollout}]})
}

fn acme_stored(rollout: u32) -> Value {
    json!({"groups": [{"properties": [{"key": "email", "value": "@acme.com", "operator": "icontains",
                                        "type": "person"}],
                       "rollout_percentage": rollout}]})
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_agent_toolkit_creates_lists_updates_and_deletes_a_flag() {
    let dir = sdk_dir().join("node/node_modules/@posthog/agent-toolkit");
    require("@posthog/agent-toolkit", &[&dir]);
    let tmp = data_dir();
    let hash = flagpost::projects::hash_key(AGENT_KEY);
    std::fs::write(
        tmp.path().join("data/projects.json"),
        json!({"projects": [
            {"id": 1, "name": "one", "api_key": KEY_ONE,
             "personal_api_keys": [{"sha256": hash, "label": "agent"}]},
            {"id": 2, "api_key": KEY_TWO, "personal_api_keys": [PERSONAL_TWO]}
        ]})
        .to_string(),
    )
    .unwrap();
    let mut server = Server::spawn(tmp.path(), &[]);
    server.keep(tmp);
    let host = format!("http://{}", server.addr);
    let agent = Agent { server, host };

    let none = agent.call("feature-flag-get-all", json!({}));
    assert_eq!(none["output"], json!([]));
    assert_eq!(
        none["requests"],
        json!(["GET /api/projects/1/feature_flags/ 200"])
    );

    // Created switched on for nobody yet.
    let created = agent.call(
        "create-feature-flag",
        json!({"name": "Acme rollout", "key": "acme-rollout", "description": "acme first",
               "active": true, "filters": acme(0)}),
    );
    assert_eq!(
        created["requests"],
        json!(["POST /api/projects/1/feature_flags/ 201"])
    );
    let out = &created["output"];
    assert_eq!(
        (&out["id"], &out["key"], &out["active"]),
        (&json!(1), &json!("acme-rollout"), &json!(true))
    );
    assert_eq!(out["filters"], acme_stored(0));
    assert_eq!(
        out["url"],
        format!("{}/project/1/feature_flags/1", agent.host)
    );
    let flag = agent.flag_in_file();
    assert_eq!(
        (
            &flag["id"],
            &flag["key"],
            &flag["name"],
            &flag["version"],
            &flag["created_by"]
        ),
        (
            &json!(1),
            &json!("acme-rollout"),
            &json!("Acme rollout"),
            &json!(1),
            &json!("agent")
        )
    );
    assert_eq!(flag["filters"], acme_stored(0));
    assert_eq!(agent.decide("ada@acme.com"), false);

    let listed = agent.call("feature-flag-get-all", json!({}));
    assert_eq!(
        listed["output"],
        json!([{"id": 1, "key": "acme-rollout", "name": "Acme rollout", "active": true}])
    );

    // Rolled out to all of acme: found by key, then changed.
    let updated = agent.call(
        "update-feature-flag",
        json!({"flagKey": "acme-rollout", "data": {"filters": acme(100)}}),
    );
    assert_eq!(
        updated["requests"],
        json!([
            "GET /api/projects/1/feature_flags/ 200",
            "GET /api/projects/1/feature_flags/1/ 200",
            "PATCH /api/projects/1/feature_flags/1/ 200"
        ])
    );
    assert_eq!(updated["output"]["filters"], acme_stored(100));
    let flag = agent.flag_in_file();
    assert_eq!(
        (&flag["version"], &flag["last_modified_by"]),
        (&json!(2), &json!("agent"))
    );
    assert_eq!(flag["filters"], acme_stored(100));
    assert_eq!(agent.decide("ada@acme.com"), true);
    assert_eq!(agent.decide("bob@example.com"), false);

    let read = agent.call(
        "feature-flag-get-definition",
        json!({"flagKey": "acme-rollout"}),
    );
    assert_eq!(read["output"]["filters"], acme_stored(100));

    // Deleted as PostHog deletes: marked, and gone from the API and /decide.
    let deleted = agent.call("delete-feature-flag", json!({"flagKey": "acme-rollout"}));
    assert_eq!(
        deleted["output"],
        json!({"success": true, "message": "Feature flag deleted successfully"})
    );
    assert_eq!(
        deleted["requests"],
        json!([
            "GET /api/projects/1/feature_flags/ 200",
            "GET /api/projects/1/feature_flags/1/ 200",
            "PATCH /api/projects/1/feature_flags/1/ 200"
        ])
    );
    let flag = agent.flag_in_file();
    assert_eq!(
        (&flag["deleted"], &flag["version"]),
        (&json!(true), &json!(3))
    );
    assert_eq!(agent.decide("ada@acme.com"), Value::Null);
    assert_eq!(
        agent.call("feature-flag-get-all", json!({}))["output"],
        json!([])
    );
    let again = agent.call("delete-feature-flag", json!({"flagKey": "acme-rollout"}));
    assert_eq!(again["output"], "Feature flag is already deleted.");
}
