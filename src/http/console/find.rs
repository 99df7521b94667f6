//! Finding things in the console: the property test that persons
//! ([`super::persons`]) and events are searched with, events filtered by it, and the
//! property names and values the forms offer. A property test is PostHog's: the filter is compiled as the release
//! condition of a one-flag project and matched by the flag evaluation `/decide` runs
//! ([`Matcher`]), so the console's `icontains`, `regex`, `gt`, `is_date_before`,
//! `semver_gte` ... are exactly the flags'.
//!
//! Event filters walk the events newest first and stop after
//! [`MAX_EVENTS_EXAMINED`]; the page's cursor resumes where they stopped.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use hyper::{HeaderMap, Response, StatusCode};
use serde_json::{json, Map, Value};

use super::super::api::{self, Resource};
use super::super::error::ApiError;
use super::super::params::Params;
use super::super::response::{self, Body};
use super::insights::blocking;
use crate::app::App;
use crate::flags::{Context, ProjectRules};
use crate::persons::Person;
use crate::store::query;

/// Events a property filter examines per page at most; the next page goes on from
/// there. Blocks are decoded as the walk reaches them, so this bounds the work of one
/// request to about a hundred blocks.
const MAX_EVENTS_EXAMINED: usize = 100_000;
/// What the property suggestions sample: the newest events and the first persons in
/// id order (hash order for most ids, so close to a random sample).
const SAMPLE: usize = 2_000;
/// Values a suggestion list offers at most, the most frequent first.
const SUGGESTED_VALUES: usize = 50;

/// One property test, compiled as PostHog compiles a flag's property filter.
pub struct Matcher {
    rules: ProjectRules,
    now: time::OffsetDateTime,
}

impl Matcher {
    /// `?property=&operator=&value=` (operator `exact` unless given); None without a
    /// property. `value` is a list for `exact` and `is_not` (comma separated), else
    /// text. A filter the flags would refuse is refused with their words.
    pub fn from_params(params: &Params) -> Result<Option<Matcher>, ApiError> {
        let Some(key) = params.get("property") else {
            return Ok(None);
        };
        let operator = params.get("operator").unwrap_or("exact");
        let text = params.get("value").unwrap_or("");
        let value = match operator {
            "exact" | "is_not" => Value::from(
                text.split(',')
                    .map(|v| Value::from(v.trim()))
                    .collect::<Vec<_>>(),
            ),
            "is_set" | "is_not_set" => Value::from(operator),
            _ => Value::from(text),
        };
        if matches!(operator, "regex" | "not_regex") {
            // The flags treat a regex that does not compile as never matching; a search
            // says why instead.
            regex::Regex::new(text).map_err(|e| {
                ApiError::BadQuery(format!("the property filter is not valid: {e}"))
            })?;
        }
        let filter = json!({"key": key, "operator": operator, "value": value, "type": "person"});
        Matcher::new(filter).map(Some)
    }

    fn new(filter: Value) -> Result<Matcher, ApiError> {
        let definitions = json!({"flags": [{"id": 1, "key": "console-filter", "active": true,
            "filters": {"groups": [{"properties": [filter], "rollout_percentage": 100}]}}]});
        let refused = |e: &dyn std::fmt::Display| {
            ApiError::BadQuery(format!("the property filter is not valid: {e}"))
        };
        // What `check` refuses too (a regex that does not compile, ...): the flags
        // would quietly never match it.
        if let Some(problem) = crate::flags::lint(&definitions).first() {
            return Err(refused(problem));
        }
        let rules = ProjectRules::from_value(definitions).map_err(|e| refused(&e))?;
        if let Some(w) = rules.warnings().first() {
            return Err(refused(w));
        }
        Ok(Matcher {
            rules,
            now: crate::flags::now(),
        })
    }

    /// Whether these properties pass the test.
    pub fn matches(&self, distinct_id: &str, properties: &Map<String, Value>) -> bool {
        let (groups, group_properties) = (Map::new(), HashMap::new());
        let ctx = Context {
            distinct_id,
            anon_distinct_id: None,
            hash_key_override: None,
            person_properties: Some(properties),
            groups: &groups,
            group_properties: &group_properties,
            now: self.now,
        };
        self.rules
            .evaluate(&ctx)
            .flags
            .first()
            .is_some_and(|f| f.enabled)
    }
}

/// The project's stored persons in id order; one that cannot be decoded is None.
pub fn persons_of(
    trees: &crate::store::Trees,
    project: u64,
) -> impl Iterator<Item = Result<Option<Person>, sled::Error>> {
    trees
        .persons
        .scan_prefix(crate::store::keys::project(project))
        .map(|entry| entry.map(|(_, bytes)| serde_json::from_slice::<Person>(&bytes).ok()))
}

/// `events?...` as the read API answers it, plus `property`/`operator`/`value`: the
/// page holds the matches among the next [`MAX_EVENTS_EXAMINED`] events, and `next`
/// goes on after the last event examined.
pub async fn events(
    app: &Arc<App>,
    project: u64,
    headers: &HeaderMap,
    path: &str,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    let Some(matcher) = Matcher::from_params(&params)? else {
        return api::serve(app, project, Resource::Events, headers, path, query).await;
    };
    let filter = params.filter()?;
    let limit = params.limit()?;
    let cursor = params.cursor()?;
    let open = app.store.get().ok_or(ApiError::Storage)?;
    let (found, last, examined) = blocking(move || {
        let mut found = Vec::new();
        let mut examined = 0;
        for entry in query::events(&open.trees, project, filter, cursor.as_deref()) {
            let (key, event) = entry?;
            examined += 1;
            if matcher.matches(&event.distinct_id, &event.properties) {
                found.push(event.to_api());
            }
            if found.len() >= limit || examined >= MAX_EVENTS_EXAMINED {
                return Ok((found, Some(key), examined));
            }
        }
        Ok((found, None, examined))
    })
    .await?;
    let next = last.map(|key| api::next_url(app, headers, path, query, &crate::support::hex(&key)));
    Ok(response::json(
        StatusCode::OK,
        &json!({"results": found, "next": next, "examined": examined}),
    ))
}

/// `properties?of=events|persons[&key=K]`: the property names seen in a sample of
/// the newest events (or of the persons), most common first; with `key`, that
/// property's most common values there. `$`-names are PostHog's own and listed too.
pub async fn properties(
    app: &Arc<App>,
    project: u64,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    let of_persons = match params.get("of").unwrap_or("events") {
        "events" => false,
        "persons" => true,
        _ => return Err(ApiError::BadQuery("of must be events or persons".into())),
    };
    let key = params.get("key").map(str::to_owned);
    let open = app.store.get().ok_or(ApiError::Storage)?;
    let (names, values) = blocking(move || {
        let mut names: HashMap<String, u64> = HashMap::new();
        let mut values: HashMap<String, u64> = HashMap::new();
        let mut tally = |props: &Map<String, Value>| {
            for (k, v) in props {
                *names.entry(k.clone()).or_default() += 1;
                if key.as_deref() == Some(k.as_str()) {
                    let text = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    *values.entry(text).or_default() += 1;
                }
            }
        };
        if of_persons {
            for person in persons_of(&open.trees, project).take(SAMPLE) {
                if let Some(p) = person? {
                    tally(&p.properties);
                }
            }
        } else {
            let all = query::EventFilter {
                after: None,
                before: None,
                event: None,
                distinct_id: None,
                person_id: None,
            };
            for entry in query::events(&open.trees, project, all, None).take(SAMPLE) {
                tally(&entry?.1.properties);
            }
        }
        Ok((
            most_first(names, usize::MAX),
            most_first(values, SUGGESTED_VALUES),
        ))
    })
    .await?;
    Ok(response::json(
        StatusCode::OK,
        &json!({"names": names, "values": values, "sampled": SAMPLE}),
    ))
}

/// The keys, most counted first (ties by name), at most `n`.
fn most_first(counts: HashMap<String, u64>, n: usize) -> Vec<String> {
    let mut by: BTreeMap<(Reverse<u64>, String), ()> = BTreeMap::new();
    for (k, c) in counts {
        by.insert((Reverse(c), k), ());
    }
    by.into_keys().take(n).map(|(_, k)| k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn matcher(q: &str) -> Result<Option<Matcher>, ApiError> {
        Matcher::from_params(&Params::parse(Some(q)))
    }

    #[test]
    fn property_tests_are_the_flags_operators() {
        let ada = props(json!({"email": "ada@Example.com", "age": 36, "app": "1.4.2"}));
        let cases = [
            ("property=email&value=ada@example.com", true),
            ("property=email&value=bob@example.com,ada@example.com", true),
            (
                "property=email&operator=is_not&value=ada@example.com",
                false,
            ),
            ("property=email&operator=icontains&value=EXAMPLE", true),
            ("property=email&operator=regex&value=^ada@", true),
            ("property=age&operator=gt&value=40", false),
            ("property=age&operator=lte&value=36", true),
            ("property=app&operator=semver_gte&value=1.4.0", true),
            ("property=plan&operator=is_not_set", true),
            ("property=plan&operator=is_set", false),
        ];
        for (q, want) in cases {
            let m = matcher(q).unwrap().unwrap();
            assert_eq!(m.matches("ada", &ada), want, "{q}");
        }
        assert!(matcher("value=x").unwrap().is_none());
    }

    #[test]
    fn a_filter_the_flags_refuse_is_refused() {
        for q in [
            "property=email&operator=ends_wth&value=x",
            "property=email&operator=regex&value=(",
        ] {
            match matcher(q) {
                Err(ApiError::BadQuery(m)) => assert!(m.contains("not valid"), "{q}: {m}"),
                Err(e) => panic!("{q}: {e:?}"),
                Ok(_) => panic!("{q} was accepted"),
            }
        }
    }

    #[test]
    fn most_common_first_then_by_name() {
        let counts = HashMap::from([("b".into(), 2), ("a".into(), 2), ("c".into(), 5)]);
        assert_eq!(most_first(counts, 2), ["c", "a"]);
    }
}
