//! Early access features: `DIR/early_access/<project id>.json` holds
//! `{"earlyAccessFeatures": [...]}` in the shape of PostHog's public
//! `GET /api/early_access_features/?token=` answer, which posthog-js's
//! `getEarlyAccessFeatures` reads. Enrolling (`updateEarlyAccessFeatureEnrollment`) sets
//! the person property `$feature_enrollment/<flagKey>`, which the feature's flag reads
//! (`feature_enrollment` or `super_groups` in the flag file): no state lives here.

use serde_json::{json, Map, Value};

use crate::projects::catalog::{Document, FileError};

/// The stages PostHog knows, in its order.
pub const STAGES: [&str; 6] = [
    "draft",
    "concept",
    "alpha",
    "beta",
    "general-availability",
    "archived",
];

/// PostHog answers the stage posthog-js offers for opt-in when none is asked for.
pub const DEFAULT_STAGE: &str = "beta";

/// A file lists a handful of features; more than this is a mistake.
const MAX_FEATURES: usize = 1000;

/// One project's features, each as served.
#[derive(Debug)]
pub struct ProjectFeatures {
    features: Vec<Feature>,
}

#[derive(Debug)]
struct Feature {
    id: String,
    stage: &'static str,
    flag_key: Option<String>,
    served: Value,
}

impl ProjectFeatures {
    /// The `/api/early_access_features/` body for features in any of `stages`.
    pub fn body(&self, stages: &[&str]) -> Value {
        let features: Vec<&Value> = self
            .features
            .iter()
            .filter(|f| stages.contains(&f.stage))
            .map(|f| &f.served)
            .collect();
        json!({"earlyAccessFeatures": features})
    }

    /// How many features the file lists, in every stage.
    pub fn len(&self) -> usize {
        self.features.len()
    }

    pub fn is_empty(&self) -> bool {
        self.features.is_empty()
    }

    /// Each feature's id and the flag key it names, for `check`.
    pub fn flag_keys(&self) -> impl Iterator<Item = (&str, &str)> {
        self.features
            .iter()
            .filter_map(|f| Some((f.id.as_str(), f.flag_key.as_deref()?)))
    }
}

/// The body for a project without a file: no features.
pub fn empty_body() -> Value {
    json!({"earlyAccessFeatures": []})
}

/// `stage` as one of [`STAGES`], for request parameters and files alike.
pub fn stage(name: &str) -> Option<&'static str> {
    STAGES.iter().copied().find(|s| *s == name)
}

impl Document for ProjectFeatures {
    const KIND: &'static str = "early access features";

    fn parse(bytes: &[u8]) -> Result<ProjectFeatures, FileError> {
        let root: Value = serde_json::from_slice(bytes)
            .map_err(|e| FileError::new("", format!("invalid JSON: {e}")))?;
        let field = "earlyAccessFeatures";
        let list = match root.get(field) {
            None => {
                let message = "missing: expected {\"earlyAccessFeatures\": [...]}";
                return Err(FileError::new(field, message));
            }
            Some(Value::Array(list)) => list,
            Some(_) => return Err(FileError::new(field, "expected a list")),
        };
        if list.len() > MAX_FEATURES {
            let message = format!("more than {MAX_FEATURES} features");
            return Err(FileError::new(field, message));
        }
        let mut features: Vec<Feature> = Vec::with_capacity(list.len());
        let mut ids: Vec<&str> = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            let feature = parse_feature(i, item)?;
            let id = item.get("id").and_then(Value::as_str).unwrap_or_default();
            if ids.contains(&id) {
                let label = format!("feature {id:?}");
                return Err(FileError::in_item(
                    label,
                    "id",
                    "the same id as another feature",
                ));
            }
            ids.push(id);
            features.push(feature);
        }
        Ok(ProjectFeatures { features })
    }
}

/// Reads one feature; optional fields get PostHog's empty values, so posthog-js sees
/// every field it reads.
fn parse_feature(index: usize, item: &Value) -> Result<Feature, FileError> {
    let Some(obj) = item.as_object() else {
        let label = format!("earlyAccessFeatures[{index}]");
        return Err(FileError::in_item(label, "", "expected an object"));
    };
    let label = match obj.get("id").and_then(Value::as_str) {
        Some(id) => format!("feature {id:?}"),
        None => format!("earlyAccessFeatures[{index}]"),
    };
    let error = |field: &str, message: &str| FileError::in_item(label.clone(), field, message);
    let string = |field: &str| match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(error(field, "expected a string")),
    };
    let required = |field: &str| match string(field)? {
        Some(s) if !s.trim().is_empty() => Ok(s),
        _ => Err(error(field, "missing")),
    };
    let id = required("id")?;
    let name = required("name")?;
    let stage_name = required("stage")?;
    let stage = stage(stage_name).ok_or_else(|| {
        error(
            "stage",
            &format!("{stage_name:?} is not one of {}", STAGES.join(", ")),
        )
    })?;
    let flag_key = string("flagKey")?.map(str::to_owned);
    let mut served = Map::new();
    served.insert("id".into(), json!(id));
    served.insert("name".into(), json!(name));
    served.insert(
        "description".into(),
        json!(string("description")?.unwrap_or("")),
    );
    served.insert("stage".into(), json!(stage));
    let docs = string("documentationUrl")?.unwrap_or("");
    served.insert("documentationUrl".into(), json!(docs));
    served.insert("imageUrl".into(), json!(string("imageUrl")?.unwrap_or("")));
    let payload = obj.get("payload").cloned().unwrap_or_else(|| json!({}));
    served.insert("payload".into(), payload);
    served.insert("flagKey".into(), json!(flag_key));
    Ok(Feature {
        id: id.to_owned(),
        stage,
        flag_key,
        served: Value::Object(served),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ProjectFeatures, FileError> {
        ProjectFeatures::parse(v.to_string().as_bytes())
    }

    #[test]
    fn features_are_served_with_every_field_and_filtered_by_stage() {
        let file = json!({"earlyAccessFeatures": [
            {"id": "f1", "name": "Dark mode", "stage": "beta", "flagKey": "dark-mode",
             "documentationUrl": "https://example.com/dark", "payload": {"x": 1}},
            {"id": "f2", "name": "Teleport", "stage": "concept", "description": "Soon"}
        ]});
        let features = parse(file).unwrap();
        assert_eq!(
            features.body(&[DEFAULT_STAGE]),
            json!({"earlyAccessFeatures": [
                {"id": "f1", "name": "Dark mode", "description": "", "stage": "beta",
                 "documentationUrl": "https://example.com/dark", "imageUrl": "",
                 "payload": {"x": 1}, "flagKey": "dark-mode"}]})
        );
        let both = features.body(&["concept", "beta"]);
        assert_eq!(both["earlyAccessFeatures"].as_array().unwrap().len(), 2);
        assert_eq!(both["earlyAccessFeatures"][1]["flagKey"], Value::Null);
        assert_eq!(features.body(&["alpha"]), empty_body());
        assert_eq!(
            features.flag_keys().collect::<Vec<_>>(),
            [("f1", "dark-mode")]
        );
    }

    #[test]
    fn errors_name_the_feature_and_the_field() {
        let bad_stage =
            json!({"earlyAccessFeatures": [{"id": "f1", "name": "A", "stage": "gamma"}]});
        assert_eq!(
            parse(bad_stage).unwrap_err().to_string(),
            "feature \"f1\": stage: \"gamma\" is not one of draft, concept, alpha, beta, general-availability, archived"
        );
        let no_name = json!({"earlyAccessFeatures": [{"id": "f1", "stage": "beta"}]});
        assert_eq!(
            parse(no_name).unwrap_err().to_string(),
            "feature \"f1\": name: missing"
        );
        let twice = json!({"earlyAccessFeatures": [
            {"id": "f1", "name": "A", "stage": "beta"}, {"id": "f1", "name": "B", "stage": "beta"}]});
        assert_eq!(
            parse(twice).unwrap_err().to_string(),
            "feature \"f1\": id: the same id as another feature"
        );
        let flag = json!({"earlyAccessFeatures": [{"id": "f", "name": "A", "stage": "beta", "flagKey": 3}]});
        assert_eq!(
            parse(flag).unwrap_err().to_string(),
            "feature \"f\": flagKey: expected a string"
        );
        assert_eq!(
            parse(json!({"features": []})).unwrap_err().to_string(),
            "earlyAccessFeatures: missing: expected {\"earlyAccessFeatures\": [...]}"
        );
    }
}
