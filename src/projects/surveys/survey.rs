//! One survey of a surveys file: validated field by field (errors name the survey and the
//! field), turned into the object `/api/surveys/` serves and the flags that target it.

use serde_json::{Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::targeting;
use crate::projects::catalog::FileError;

/// `type` values posthog-js knows.
const TYPES: [&str; 4] = ["popover", "api", "widget", "external_survey"];
const QUESTION_TYPES: [&str; 5] = ["open", "multiple_choice", "single_choice", "rating", "link"];
const SCHEDULES: [&str; 3] = ["once", "recurring", "always"];

/// The fields PostHog's public surveys endpoint serves, in its order. Other fields of the
/// file are served after them, except [`PRIVATE`].
const PUBLIC: [&str; 15] = [
    "id",
    "name",
    "type",
    "linked_flag_key",
    "targeting_flag_key",
    "internal_targeting_flag_key",
    "questions",
    "conditions",
    "appearance",
    "start_date",
    "end_date",
    "current_iteration",
    "current_iteration_start_date",
    "schedule",
    "enable_partial_responses",
];

/// Fields of the file that PostHog never serves publicly: the description may hold notes
/// not meant for users, and the rest configure the server.
const PRIVATE: [&str; 4] = [
    "description",
    "archived",
    "targeting_flag_filters",
    "iteration_count",
];

/// A survey as loaded.
#[derive(Debug, Clone)]
pub struct Survey {
    pub id: String,
    /// Launched and not stopped: `start_date` set, `end_date` not, not archived.
    pub active: bool,
    pub archived: bool,
    /// Flag keys the survey's display depends on, with the field naming each; those not
    /// generated here must be defined in the project's flag file.
    pub linked_flag_key: Option<String>,
    pub targeting_flag_key: Option<String>,
    pub internal_targeting_flag_key: String,
    /// Whether the targeting flag is generated from `targeting_flag_filters`.
    pub generates_targeting_flag: bool,
    /// The object `/api/surveys/` serves.
    pub served: Map<String, Value>,
    /// The flags generated for it, in the flag file format.
    pub flags: Vec<Value>,
}

/// Reads a field of one survey, with errors that name the survey and the field.
struct Fields<'a> {
    label: String,
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn error(&self, field: &str, message: impl Into<String>) -> FileError {
        FileError::in_item(self.label.clone(), field, message)
    }

    /// The field, `None` when absent or null.
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    fn string(&self, field: &str) -> Result<Option<&'a str>, FileError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.error(field, "expected a string")),
        }
    }

    fn required(&self, field: &str) -> Result<&'a str, FileError> {
        match self.string(field)? {
            Some(s) if !s.trim().is_empty() => Ok(s),
            _ => Err(self.error(field, "missing")),
        }
    }

    fn one_of(&self, field: &str, allowed: &[&str]) -> Result<Option<&'a str>, FileError> {
        match self.string(field)? {
            Some(s) if !allowed.contains(&s) => {
                Err(self.error(field, format!("{s:?} is not one of {}", allowed.join(", "))))
            }
            other => Ok(other),
        }
    }

    fn object(&self, field: &str) -> Result<Option<&'a Map<String, Value>>, FileError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(o)),
            Some(_) => Err(self.error(field, "expected an object")),
        }
    }

    fn boolean(&self, field: &str) -> Result<Option<bool>, FileError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.error(field, "expected true or false")),
        }
    }

    fn count(&self, field: &str) -> Result<Option<u64>, FileError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.error(field, "expected a whole number, 0 or more")),
        }
    }

    /// An RFC 3339 date-time, as PostHog writes them.
    fn date(&self, field: &str) -> Result<Option<&'a str>, FileError> {
        let text = self.string(field)?;
        if let Some(t) = text {
            OffsetDateTime::parse(t, &Rfc3339).map_err(|_| {
                self.error(
                    field,
                    format!("{t:?} is not a date-time like 2024-05-01T09:00:00Z"),
                )
            })?;
        }
        Ok(text)
    }
}

impl Survey {
    /// Reads the survey at `index` of the file.
    pub fn parse(index: usize, value: &Value) -> Result<Survey, FileError> {
        let Some(obj) = value.as_object() else {
            let item = format!("surveys[{index}]");
            return Err(FileError::in_item(item, "", "expected an object"));
        };
        let label = match obj.get("id").and_then(Value::as_str) {
            Some(id) => format!("survey {id:?}"),
            None => format!("surveys[{index}]"),
        };
        let f = Fields { label, obj };
        let id = f.required("id")?.to_owned();
        if id.contains('/') {
            return Err(f.error(
                "id",
                "must not contain '/' (it becomes part of property names)",
            ));
        }
        let name = f.required("name")?;
        f.one_of("type", &TYPES)?
            .ok_or_else(|| f.error("type", "missing"))?;
        f.one_of("schedule", &SCHEDULES)?;
        f.object("appearance")?;
        f.object("conditions")?;
        f.boolean("enable_partial_responses")?;
        let archived = f.boolean("archived")?.unwrap_or(false);
        let start = f.date("start_date")?;
        let end = f.date("end_date")?;
        f.date("current_iteration_start_date")?;
        let questions = questions(&f, &id)?;
        let active = !archived && start.is_some() && end.is_none();
        let iteration = iteration(&f)?;
        let key = |field: &str| -> Result<Option<String>, FileError> {
            // An empty key names no flag, as posthog-js reads it.
            Ok(f.string(field)?
                .filter(|k| !k.is_empty())
                .map(str::to_owned))
        };
        let linked_flag_key = key("linked_flag_key")?;
        let internal_targeting_flag_key =
            key("internal_targeting_flag_key")?.unwrap_or_else(|| targeting::internal_key(&id));
        let mut flags = vec![targeting::internal_flag(
            &internal_targeting_flag_key,
            name,
            &id,
            iteration,
            active,
        )];
        let targeting_filters = f.object("targeting_flag_filters")?;
        let targeting_flag_key = match (key("targeting_flag_key")?, targeting_filters) {
            (key, Some(filters)) => {
                let key = key.unwrap_or_else(|| targeting::targeting_key(&id));
                let flag = targeting::targeting_flag(&key, name, filters, active);
                targeting::check(&flag).map_err(|(field, msg)| {
                    f.error(&format!("targeting_flag_filters{field}"), msg)
                })?;
                flags.push(flag);
                Some(key)
            }
            (key, None) => key,
        };
        let mut served = served(obj);
        served.insert("questions".into(), Value::Array(questions));
        served.insert("linked_flag_key".into(), json_opt(&linked_flag_key));
        served.insert("targeting_flag_key".into(), json_opt(&targeting_flag_key));
        let internal = Value::String(internal_targeting_flag_key.clone());
        served.insert("internal_targeting_flag_key".into(), internal);
        if let Some(n) = iteration {
            // PostHog starts counting at 1 once a survey repeats; posthog-js keys its
            // "responded" property by this number, so it must be the one flags use.
            served.insert("current_iteration".into(), Value::from(n));
        }
        Ok(Survey {
            id,
            active,
            archived,
            linked_flag_key,
            targeting_flag_key,
            internal_targeting_flag_key,
            generates_targeting_flag: targeting_filters.is_some(),
            served,
            flags,
        })
    }
}

/// The file's survey as served: PostHog's public fields in its order (null when absent),
/// then the file's other fields except the private ones.
fn served(obj: &Map<String, Value>) -> Map<String, Value> {
    let mut served = Map::new();
    for field in PUBLIC {
        let value = obj.get(field).cloned().unwrap_or(Value::Null);
        served.insert(field.to_owned(), value);
    }
    for (field, value) in obj {
        if !served.contains_key(field) && !PRIVATE.contains(&field.as_str()) {
            served.insert(field.clone(), value.clone());
        }
    }
    served
}

fn json_opt(s: &Option<String>) -> Value {
    s.as_ref().map_or(Value::Null, |s| Value::String(s.clone()))
}

/// The iteration a repeating survey is in, as PostHog numbers it: `current_iteration`
/// when set above 0, else 1 when `iteration_count` makes the survey repeat.
fn iteration(f: &Fields<'_>) -> Result<Option<u64>, FileError> {
    let current = f.count("current_iteration")?.filter(|&n| n > 0);
    let repeats = f.count("iteration_count")?.is_some_and(|n| n > 0);
    Ok(current.or(repeats.then_some(1)))
}

/// The questions, validated, each with an `id` (a stable one derived from the survey id
/// and position when the file has none: posthog-js keys responses by it).
fn questions(f: &Fields<'_>, survey: &str) -> Result<Vec<Value>, FileError> {
    let Some(list) = f.get("questions") else {
        return Err(f.error("questions", "missing"));
    };
    let Some(list) = list.as_array() else {
        return Err(f.error("questions", "expected a list"));
    };
    if list.is_empty() {
        return Err(f.error("questions", "a survey needs at least one question"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, q) in list.iter().enumerate() {
        let at = |field: &str| format!("questions[{i}]{field}");
        let Some(obj) = q.as_object() else {
            return Err(f.error(&at(""), "expected an object"));
        };
        let question = Fields {
            label: f.label.clone(),
            obj,
        };
        let kind = question
            .one_of("type", &QUESTION_TYPES)
            .map_err(|e| f.error(&at(".type"), e.message))?
            .ok_or_else(|| f.error(&at(".type"), "missing"))?;
        question
            .required("question")
            .map_err(|e| f.error(&at(".question"), e.message))?;
        if kind == "multiple_choice" || kind == "single_choice" {
            let choices = obj.get("choices").and_then(Value::as_array);
            let valid = choices.is_some_and(|c| !c.is_empty() && c.iter().all(Value::is_string));
            if !valid {
                return Err(f.error(&at(".choices"), "expected a non-empty list of strings"));
            }
        }
        if kind == "rating" {
            let scale = obj.get("scale").and_then(Value::as_u64);
            if !matches!(scale, Some(2 | 3 | 5 | 7 | 10)) {
                return Err(f.error(&at(".scale"), "expected 2, 3, 5, 7 or 10"));
            }
        }
        let mut q = obj.clone();
        match q.get("id") {
            Some(Value::String(id)) if !id.is_empty() => {}
            None | Some(Value::Null) => {
                q.insert(
                    "id".into(),
                    Value::String(targeting::question_id(survey, i)),
                );
            }
            Some(_) => return Err(f.error(&at(".id"), "expected a non-empty string")),
        }
        out.push(Value::Object(q));
    }
    Ok(out)
}
