//! The project a public project key names, for the endpoints a browser reaches with
//! the key alone (`/decide`, `/flags`, `/array/<key>/`, the features flagpost does not
//! keep): one lookup, refusing a key of the wrong shape before it is looked up.

use std::sync::Arc;

use super::error::{ApiError, DecideError};
use crate::app::App;
use crate::projects::{key_shape_is_valid, Project};

pub fn project_of(app: &App, key: &str) -> Result<Arc<Project>, ApiError> {
    if !key_shape_is_valid(key) {
        return Err(DecideError::InvalidKey.into());
    }
    app.projects
        .load()
        .by_api_key(key)
        .cloned()
        .ok_or_else(|| DecideError::InvalidKey.into())
}
