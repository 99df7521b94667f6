//! Surveys: `DIR/surveys/<project id>.json` holds `{"surveys": [...]}` in the shape of
//! PostHog's public `GET /api/surveys/?token=` answer. Each file is validated when it
//! loads (a [`crate::projects::catalog::Catalog`] of [`ProjectSurveys`]) and kept ready to serve as
//! bytes. The flags that decide who sees a survey (its internal targeting flag, and a
//! targeting flag when the file gives filters) are generated here and appended to the
//! project's flag rules (`flags::Rules::set_generated`), so `/flags` answers them.

mod survey;
mod targeting;

use bytes::Bytes;
use serde_json::{json, Value};

pub use survey::Survey;

use crate::projects::catalog::{Catalog, Document, FileError};

/// A file lists a few surveys; this many is a mistake, or an attempt to exhaust memory.
const MAX_SURVEYS: usize = 1000;

/// One project's surveys file, validated.
#[derive(Debug)]
pub struct ProjectSurveys {
    /// Every survey of the file, archived ones included (they are never served).
    surveys: Vec<Survey>,
    /// The `/api/surveys/` body: `{"surveys": [...], "survey_config": ...}`.
    body: Bytes,
}

impl ProjectSurveys {
    pub fn surveys(&self) -> &[Survey] {
        &self.surveys
    }

    /// Whether a survey is running: what turns `surveys` on in `/decide`, `/flags` and
    /// remote config, so posthog-js loads its surveys code.
    pub fn any_active(&self) -> bool {
        self.surveys.iter().any(|s| s.active)
    }

    /// The `/api/surveys/` body, JSON.
    pub fn body(&self) -> Bytes {
        self.body.clone()
    }

    /// The flags generated for the project's surveys (archived ones have none).
    pub fn flags(&self) -> impl Iterator<Item = &Value> {
        self.surveys
            .iter()
            .filter(|s| !s.archived)
            .flat_map(|s| s.flags.iter())
    }
}

impl Document for ProjectSurveys {
    const KIND: &'static str = "surveys";

    fn parse(bytes: &[u8]) -> Result<ProjectSurveys, FileError> {
        let root: Value = serde_json::from_slice(bytes)
            .map_err(|e| FileError::new("", format!("invalid JSON: {e}")))?;
        let Some(list) = root.get("surveys") else {
            return Err(FileError::new(
                "surveys",
                "missing: expected {\"surveys\": [...]}",
            ));
        };
        let Some(list) = list.as_array() else {
            return Err(FileError::new("surveys", "expected a list"));
        };
        if list.len() > MAX_SURVEYS {
            return Err(FileError::new(
                "surveys",
                format!("more than {MAX_SURVEYS} surveys"),
            ));
        }
        let mut surveys: Vec<Survey> = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            let survey = Survey::parse(i, item)?;
            let item = || format!("survey {:?}", survey.id);
            if surveys.iter().any(|s| s.id == survey.id) {
                return Err(FileError::in_item(
                    item(),
                    "id",
                    "the same id as another survey",
                ));
            }
            let key = &survey.internal_targeting_flag_key;
            if let Some(other) = surveys
                .iter()
                .find(|s| &s.internal_targeting_flag_key == key)
            {
                let message = format!("{key:?} is survey {:?}'s too", other.id);
                return Err(FileError::in_item(
                    item(),
                    "internal_targeting_flag_key",
                    message,
                ));
            }
            surveys.push(survey);
        }
        let served: Vec<Value> = surveys
            .iter()
            .filter(|s| !s.archived)
            .map(|s| Value::Object(s.served.clone()))
            .collect();
        let config = root.get("survey_config").cloned().unwrap_or(Value::Null);
        let body = json!({"surveys": served, "survey_config": config});
        Ok(ProjectSurveys {
            surveys,
            body: Bytes::from(body.to_string()),
        })
    }
}

/// The generated flags of every project, for `flags::Rules::set_generated`.
pub fn generated(catalog: &Catalog<ProjectSurveys>) -> crate::flags::Generated {
    catalog
        .all()
        .iter()
        .map(|(&id, project)| (id, project.flags().cloned().collect()))
        .filter(|(_, flags): &(i64, Vec<Value>)| !flags.is_empty())
        .collect()
}

#[cfg(test)]
mod tests;
