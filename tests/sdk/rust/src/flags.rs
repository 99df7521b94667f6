//! The flag calls an app makes, remotely (`/flags/?v=2`, with stored and with passed
//! person and group properties) and locally from the polled definitions; each
//! answer is reported under a name, a failure as `{"error": …}`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use posthog_rs::{Client, EvaluateFlagsOptions, FeatureFlagEvaluations, FlagValue};
use serde_json::{json, Map, Value};

use crate::{pause, result};

type Props = Option<HashMap<String, Value>>;
type Groups = Option<HashMap<String, String>>;
type GroupProps = Option<HashMap<String, HashMap<String, Value>>>;

/// The ids the calls are made for.
pub struct Who {
    pub user: String,
    pub stranger: String,
    pub company: String,
    pub prefix: String,
}

fn plan(plan: &str) -> Props {
    Some(HashMap::from([("plan".to_string(), json!(plan))]))
}

fn company(key: &str) -> Groups {
    Some(HashMap::from([("company".to_string(), key.to_string())]))
}

fn seats(n: i64) -> GroupProps {
    let seats = HashMap::from([("seats".to_string(), json!(n))]);
    Some(HashMap::from([("company".to_string(), seats)]))
}

/// Every flag of a snapshot: values through `get_flag`, payloads through
/// `get_flag_payload`, keyed "<flag>" and "<flag> payload".
fn snapshot(flags: &FeatureFlagEvaluations) -> Value {
    let mut keys = flags.keys();
    keys.sort();
    let mut out = Map::new();
    for key in &keys {
        out.insert(key.clone(), json!(flags.get_flag(key)));
        if let Some(p) = flags.get_flag_payload(key) {
            out.insert(format!("{key} payload"), p);
        }
    }
    Value::Object(out)
}

#[allow(deprecated)]
async fn enabled(c: &Client, key: &str, id: &str, person: Props) -> Value {
    result(w!(c.is_feature_enabled(key, id, None, person, None)))
}

#[allow(deprecated)]
async fn flag(c: &Client, key: &str, id: &str, groups: Groups, props: GroupProps) -> Value {
    result(w!(c.get_feature_flag(key, id, groups, None, props)))
}

#[allow(deprecated)]
async fn payload(c: &Client, key: &str, id: &str) -> Value {
    result(w!(c.get_feature_flag_payload(key, id)))
}

async fn evaluate(c: &Client, id: &str, options: EvaluateFlagsOptions) -> Value {
    result(w!(c.evaluate_flags(id, options)).map(|f| snapshot(&f)))
}

/// Ask for `key` until it is on (stored person and group properties show up once
/// the server has applied the events) or it fails; returns the last answer.
#[allow(deprecated)]
async fn until_on(c: &Client, key: &str, id: &str, groups: Groups) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = w!(c.get_feature_flag(key, id, groups.clone(), None, None));
        let on = matches!(&got, Ok(Some(FlagValue::Boolean(true))));
        if on || got.is_err() || Instant::now() > deadline {
            return result(got);
        }
        pause(Duration::from_millis(100)).await;
    }
}

/// The options of the call evaluated both remotely and locally: properties given.
pub fn with_properties(who: &Who) -> EvaluateFlagsOptions {
    EvaluateFlagsOptions {
        groups: company(&who.company),
        person_properties: plan("pro"),
        group_properties: seats(50),
        ..Default::default()
    }
}

pub async fn remote(c: &Client, who: &Who) -> Value {
    let (user, stranger) = (who.user.as_str(), who.stranger.as_str());
    let acme = company(&who.company);
    let other = company(&format!("{}-other", who.prefix));
    let mut out = Map::new();
    let mut put = |k: &str, v: Value| out.insert(k.to_string(), v);
    put("pro-only poll", until_on(c, "pro-only", user, None).await);
    put(
        "big-orgs poll",
        until_on(c, "big-orgs", user, acme.clone()).await,
    );
    put("always-on", enabled(c, "always-on", user, None).await);
    put("never", enabled(c, "never", user, None).await);
    put("pro-only", enabled(c, "pro-only", user, None).await);
    put(
        "pro-only stranger",
        enabled(c, "pro-only", stranger, None).await,
    );
    let on_pro = enabled(c, "pro-only", stranger, plan("pro")).await;
    put("pro-only stranger on pro", on_pro);
    put("checkout", flag(c, "checkout", user, None, None).await);
    put("checkout payload", payload(c, "checkout", user).await);
    put("always-on payload", payload(c, "always-on", user).await);
    put("never payload", payload(c, "never", user).await);
    put(
        "big-orgs",
        flag(c, "big-orgs", user, acme.clone(), None).await,
    );
    let on_20 = flag(c, "big-orgs", stranger, other.clone(), seats(20)).await;
    put("big-orgs other on 20 seats", on_20);
    let on_5 = flag(c, "big-orgs", stranger, other, seats(5)).await;
    put("big-orgs other on 5 seats", on_5);
    match w!(c.get_feature_flags(user, None, None, None)) {
        Ok((values, payloads)) => {
            put("all", json!(values));
            put("all payloads", json!(payloads));
        }
        Err(e) => {
            put("all", json!({ "error": e.to_string() }));
        }
    }
    let in_acme = EvaluateFlagsOptions {
        groups: acme,
        ..Default::default()
    };
    put("evaluate", evaluate(c, user, in_acme).await);
    let given = evaluate(c, stranger, with_properties(who)).await;
    put("evaluate with properties", given);
    let two = EvaluateFlagsOptions {
        flag_keys: Some(vec!["always-on".into(), "checkout".into()]),
        ..Default::default()
    };
    put("evaluate two keys", evaluate(c, user, two).await);
    Value::Object(out)
}

/// With `local_evaluation_only`, so that a flag the definitions cannot answer is
/// reported as null rather than asked of the server.
pub async fn local(c: &Client, who: &Who) -> Value {
    let (user, stranger) = (who.user.as_str(), who.stranger.as_str());
    let acme = company(&who.company);
    let mut out = Map::new();
    let mut put = |k: &str, v: Value| out.insert(k.to_string(), v);
    put("always-on", enabled(c, "always-on", user, None).await);
    put("never", enabled(c, "never", user, None).await);
    put("pro-only", enabled(c, "pro-only", user, plan("pro")).await);
    put(
        "pro-only free",
        enabled(c, "pro-only", user, plan("free")).await,
    );
    put("checkout", flag(c, "checkout", user, None, None).await);
    let on_50 = flag(c, "big-orgs", user, acme.clone(), seats(50)).await;
    put("big-orgs", on_50);
    put(
        "big-orgs on 5 seats",
        flag(c, "big-orgs", user, acme, seats(5)).await,
    );
    let only_local = EvaluateFlagsOptions {
        only_evaluate_locally: true,
        ..with_properties(who)
    };
    put(
        "evaluate with properties",
        evaluate(c, stranger, only_local).await,
    );
    Value::Object(out)
}
