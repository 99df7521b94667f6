//! Surveys files: what is served, which flags are generated, and errors that name the
//! survey and the field.

use serde_json::{json, Value};

use super::*;

fn nps(id: &str) -> Value {
    json!({
        "id": id, "name": "NPS", "type": "popover", "description": "internal notes",
        "questions": [{"type": "rating", "question": "How likely?", "scale": 10,
                       "display": "number", "lowerBoundLabel": "No", "upperBoundLabel": "Yes"}],
        "appearance": {"position": "right"}, "conditions": null,
        "start_date": "2026-01-05T09:00:00Z", "end_date": null
    })
}

fn parse(file: Value) -> Result<ProjectSurveys, FileError> {
    ProjectSurveys::parse(file.to_string().as_bytes())
}

fn served(p: &ProjectSurveys) -> Value {
    serde_json::from_slice(&p.body()).unwrap()
}

#[test]
fn a_survey_is_served_in_posthogs_public_shape() {
    let p = parse(json!({"surveys": [nps("s1")]})).unwrap();
    let key = targeting::internal_key("s1");
    let question_id = targeting::question_id("s1", 0);
    assert_eq!(
        served(&p),
        json!({"surveys": [{
            "id": "s1", "name": "NPS", "type": "popover",
            "linked_flag_key": null, "targeting_flag_key": null,
            "internal_targeting_flag_key": key,
            "questions": [{"type": "rating", "question": "How likely?", "scale": 10,
                           "display": "number", "lowerBoundLabel": "No", "upperBoundLabel": "Yes",
                           "id": question_id}],
            "conditions": null, "appearance": {"position": "right"},
            "start_date": "2026-01-05T09:00:00Z", "end_date": null,
            "current_iteration": null, "current_iteration_start_date": null,
            "schedule": null, "enable_partial_responses": null}],
         "survey_config": null})
    );
    assert!(p.any_active());
    let flags: Vec<&Value> = p.flags().collect();
    assert_eq!(flags.len(), 1);
    assert_eq!(flags[0]["key"], json!(key));
    assert_eq!(flags[0]["active"], json!(true));
}

#[test]
fn only_a_started_unfinished_unarchived_survey_is_active() {
    let mut ended = nps("s1");
    ended["end_date"] = json!("2026-02-01T00:00:00.123456+00:00");
    let mut draft = nps("s2");
    draft["start_date"] = Value::Null;
    let mut archived = nps("s3");
    archived["archived"] = json!(true);
    let p = parse(json!({"surveys": [ended, draft, archived]})).unwrap();
    assert!(!p.any_active());
    let ids: Vec<Value> = served(&p)["surveys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].clone())
        .collect();
    assert_eq!(
        ids,
        [json!("s1"), json!("s2")],
        "archived surveys are never served"
    );
    let active: Vec<&Value> = p.flags().map(|f| &f["active"]).collect();
    assert_eq!(active, [&json!(false), &json!(false)]);
}

#[test]
fn named_keys_targeting_filters_and_iterations() {
    let mut s = nps("s1");
    s["internal_targeting_flag_key"] = json!("survey-targeting-abc-custom");
    s["linked_flag_key"] = json!("new-checkout");
    s["targeting_flag_filters"] = json!({"groups": [{"properties": [
        {"key": "plan", "value": ["pro"], "operator": "exact", "type": "person"}], "rollout_percentage": 100}]});
    s["iteration_count"] = json!(3);
    let p = parse(json!({"surveys": [s], "survey_config": {"appearance": {}}})).unwrap();
    let body = served(&p);
    let survey = &body["surveys"][0];
    assert_eq!(
        survey["internal_targeting_flag_key"],
        "survey-targeting-abc-custom"
    );
    assert_eq!(
        survey["targeting_flag_key"],
        json!(targeting::targeting_key("s1"))
    );
    assert_eq!(survey["linked_flag_key"], "new-checkout");
    assert_eq!(
        survey["current_iteration"], 1,
        "a repeating survey starts at 1"
    );
    assert!(survey.get("targeting_flag_filters").is_none());
    assert!(survey.get("iteration_count").is_none());
    assert!(survey.get("description").is_none());
    assert_eq!(body["survey_config"], json!({"appearance": {}}));
    let flags: Vec<&Value> = p.flags().collect();
    assert_eq!(flags.len(), 2);
    let props = &flags[0]["filters"]["groups"][0]["properties"];
    assert_eq!(props[0]["key"], "$survey_dismissed/s1/1");
    assert_eq!(props[1]["key"], "$survey_responded/s1/1");
    assert_eq!(
        flags[1]["filters"]["groups"][0]["properties"][0]["key"],
        "plan"
    );
}

fn error(file: Value) -> String {
    parse(file).unwrap_err().to_string()
}

#[test]
fn errors_name_the_survey_and_the_field() {
    let with = |field: &str, value: Value| {
        let mut s = nps("s1");
        s[field] = value;
        json!({"surveys": [s]})
    };
    assert_eq!(
        error(json!({"survey": []})),
        "surveys: missing: expected {\"surveys\": [...]}"
    );
    assert_eq!(
        error(json!({"surveys": [3]})),
        "surveys[0]: expected an object"
    );
    assert_eq!(
        error(with("name", json!(""))),
        "survey \"s1\": name: missing"
    );
    assert_eq!(
        error(with("type", json!("modal"))),
        "survey \"s1\": type: \"modal\" is not one of popover, api, widget, external_survey"
    );
    assert_eq!(
        error(with("start_date", json!("yesterday"))),
        "survey \"s1\": start_date: \"yesterday\" is not a date-time like 2024-05-01T09:00:00Z"
    );
    assert_eq!(
        error(with(
            "questions",
            json!([{"type": "single_choice", "question": "Which?"}])
        )),
        "survey \"s1\": questions[0].choices: expected a non-empty list of strings"
    );
    assert_eq!(
        error(with("questions", json!([{"type": "poll", "question": "Which?"}]))),
        "survey \"s1\": questions[0].type: \"poll\" is not one of open, multiple_choice, single_choice, rating, link"
    );
    assert_eq!(
        error(with("targeting_flag_filters", json!({"groups": [{"properties": [
            {"key": "plan", "value": "pro", "operator": "around", "type": "person"}]}]}))),
        "survey \"s1\": targeting_flag_filters.groups[0].properties[0].operator: unknown operator \"around\""
    );
    assert_eq!(
        error(with("id", json!("a/b"))),
        "survey \"a/b\": id: must not contain '/' (it becomes part of property names)"
    );
    assert_eq!(
        error(json!({"surveys": [nps("s1"), nps("s1")]})),
        "survey \"s1\": id: the same id as another survey"
    );
    let mut other = nps("s2");
    other["internal_targeting_flag_key"] = json!(targeting::internal_key("s1"));
    let message = error(json!({"surveys": [nps("s1"), other]}));
    assert!(
        message.starts_with("survey \"s2\": internal_targeting_flag_key: "),
        "{message}"
    );
}

#[test]
fn every_projects_generated_flags_reach_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("4.json"),
        json!({"surveys": [nps("s1")]}).to_string(),
    )
    .unwrap();
    let (catalog, report) = Catalog::<ProjectSurveys>::load(dir.path());
    assert_eq!(report.loaded, [4]);
    let generated = generated(&catalog);
    assert_eq!(generated[&4].len(), 1);
    let rules = crate::flags::Rules::new();
    assert!(rules.set_generated(generated.clone()));
    assert!(
        !rules.set_generated(generated),
        "the same flags are no change"
    );
    let flags = dir.path().join("flags");
    std::fs::create_dir(&flags).unwrap();
    rules.reload(&flags);
    let snapshot = rules.current();
    assert_eq!(snapshot.project(4).map(|r| r.flag_count()), Some(1));
}

#[test]
fn an_empty_flag_key_names_no_flag() {
    let mut s = nps("s1");
    s["linked_flag_key"] = json!("");
    s["internal_targeting_flag_key"] = json!("");
    let p = parse(json!({"surveys": [s]})).unwrap();
    let survey = &p.surveys()[0];
    assert_eq!(survey.linked_flag_key, None);
    assert_eq!(
        survey.internal_targeting_flag_key,
        targeting::internal_key("s1")
    );
    assert_eq!(served(&p)["surveys"][0]["linked_flag_key"], Value::Null);
}
