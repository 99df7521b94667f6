//! The public, project-key-authenticated endpoints posthog-js calls for surveys and
//! early access features: `GET /api/surveys/?token=` and
//! `GET /api/early_access_features/?token=[&stage=...]`. Both answer from the loaded
//! files (see `crate::projects::surveys`, `crate::projects::early_access`) with CORS, like PostHog's.

use hyper::{Response, StatusCode};

use super::error::ApiError;
use super::error::DecideError as KeyError;
use super::response::{self, Body};
use crate::app::App;
use crate::projects::early_access;
use crate::projects::{key_shape_is_valid, Project};

/// Answers a project without a surveys file: no surveys, as PostHog answers one that
/// has none.
const NO_SURVEYS: &str = r#"{"surveys":[],"survey_config":null}"#;

/// The query's parameters that these endpoints read.
#[derive(Debug, Default, PartialEq)]
pub struct Params {
    pub token: Option<String>,
    pub stages: Vec<String>,
}

impl Params {
    /// `token` (or `api_key`, as PostHog also reads) and every `stage`.
    pub fn parse(query: Option<&str>) -> Params {
        let mut params = Params::default();
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match &*k {
                "token" | "api_key" if params.token.is_none() && !v.is_empty() => {
                    params.token = Some(v.into_owned())
                }
                "stage" => params.stages.push(v.into_owned()),
                _ => {}
            }
        }
        params
    }
}

/// The project the query's key names: 401 without a key or with one that is no
/// project's, as PostHog answers.
fn project(app: &App, params: &Params) -> Result<std::sync::Arc<Project>, ApiError> {
    let token = params.token.as_deref().ok_or(KeyError::MissingKey)?;
    if !key_shape_is_valid(token) {
        return Err(KeyError::InvalidKey.into());
    }
    let projects = app.projects.load();
    let project = projects.by_api_key(token).ok_or(KeyError::InvalidKey)?;
    Ok(project.clone())
}

fn project_id(project: &Project) -> Option<i64> {
    i64::try_from(project.id).ok()
}

/// `GET /api/surveys/?token=`: the project's surveys, archived ones left out.
pub fn surveys(app: &App, query: Option<&str>) -> Result<Response<Body>, ApiError> {
    let project = project(app, &Params::parse(query))?;
    let body = match project_id(&project).and_then(|id| app.surveys.project(id)) {
        Some(surveys) => surveys.body(),
        None => NO_SURVEYS.into(),
    };
    Ok(response::with_type(
        StatusCode::OK,
        "application/json",
        body,
    ))
}

/// `GET /api/early_access_features/?token=[&stage=...]`: the project's features in
/// the stages asked for (`beta` when none is); an unknown stage is a 400.
pub fn early_access_features(app: &App, query: Option<&str>) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    let project = project(app, &params)?;
    let mut stages = Vec::with_capacity(params.stages.len().max(1));
    for name in &params.stages {
        let stage = early_access::stage(name).ok_or_else(|| {
            let known = early_access::STAGES.join(", ");
            ApiError::BadQuery(format!("stage {name:?} is not one of {known}"))
        })?;
        stages.push(stage);
    }
    if stages.is_empty() {
        stages.push(early_access::DEFAULT_STAGE);
    }
    let body = match project_id(&project).and_then(|id| app.early_access.project(id)) {
        Some(features) => features.body(&stages),
        None => early_access::empty_body(),
    };
    Ok(response::json(StatusCode::OK, &body))
}

/// Whether the project has a running survey: `surveys` in `/decide`, `/flags` and
/// remote config.
pub fn has_active_survey(app: &App, project: &Project) -> bool {
    project_id(project)
        .and_then(|id| app.surveys.project(id))
        .is_some_and(|s| s.any_active())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params() {
        let p = Params::parse(Some("token=phc_a&stage=beta&stage=alpha&_=17"));
        assert_eq!(p.token.as_deref(), Some("phc_a"));
        assert_eq!(p.stages, ["beta", "alpha"]);
        assert_eq!(Params::parse(Some("api_key=k")).token.as_deref(), Some("k"));
        assert_eq!(
            Params::parse(Some("token=&api_key=k")).token.as_deref(),
            Some("k")
        );
        assert_eq!(Params::parse(None), Params::default());
    }
}
