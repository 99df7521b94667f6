//! posthog-js's start-up files under `/array/<project key>/`: `config` (JSON),
//! `config.js` (the script PostHog answers, which the library loads first) and
//! `array.js` (the snippet's library with that script appended, PostHog's per-token
//! bundle). Public, like the key in the path. The fields come from
//! [`crate::projects::client_config`]; what the server knows about a project besides its
//! switches is gathered in [`facts`], the one place to feed new facts from.

use hyper::header::{HeaderValue, CACHE_CONTROL};
use hyper::{HeaderMap, Response, StatusCode};

use super::error::ApiError;
use super::response::{self, Body};
use crate::app::App;
use crate::projects::client_config::{self, Facts};
use crate::projects::Project;

/// Switches change on SIGHUP: browsers pick a change up within a minute, while a
/// page's repeated loads within it come from their cache.
const CACHE_CONTROL_CONFIG: &str = "public, max-age=60";
const JAVASCRIPT: &str = "application/javascript; charset=utf-8";

/// Which file under `/array/<key>/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum File {
    Config,
    ConfigJs,
    ArrayJs,
}

/// The project key and file of an `/array/<key>/<file>` path.
pub fn parse_path(path: &str) -> Option<(&str, File)> {
    let rest = path.strip_prefix("/array/")?;
    let (token, name) = rest.split_once('/')?;
    let file = match name {
        "config" => File::Config,
        "config.js" => File::ConfigJs,
        "array.js" => File::ArrayJs,
        _ => return None,
    };
    (!token.is_empty()).then_some((token, file))
}

/// Everything the server knows about a project that its client config reflects,
/// besides the switches of `projects.json`.
pub fn facts(app: &App, project: &Project) -> Facts {
    Facts {
        surveys: super::surveys::has_active_survey(app, project),
    }
}

/// The `/decide` and `/flags` members for a project: its client config, written when
/// the projects file was read.
pub fn decide_tail<'a>(app: &App, project: &'a Project) -> &'a str {
    project.decide_tail(facts(app, project).surveys)
}

pub async fn handle(app: &App, path: &str) -> Result<Response<Body>, ApiError> {
    let (token, file) = parse_path(path).ok_or(ApiError::NotFound)?;
    let project = super::project_key::project_of(app, token)?;
    let (switches, facts) = (&project.remote_config, facts(app, &project));
    let mut r = match file {
        File::Config => response::with_type(
            StatusCode::OK,
            "application/json",
            client_config::remote_config(&project.api_key, switches, facts),
        ),
        File::ConfigJs => response::with_type(
            StatusCode::OK,
            JAVASCRIPT,
            client_config::remote_config_js(&project.api_key, switches, facts),
        ),
        File::ArrayJs => {
            let config = client_config::remote_config_js(&project.api_key, switches, facts);
            response::with_type(StatusCode::OK, JAVASCRIPT, array_js(app, &config).await?)
        }
    };
    r.headers_mut().insert(
        CACHE_CONTROL,
        HeaderValue::from_static(CACHE_CONTROL_CONFIG),
    );
    Ok(r)
}

/// `array.js`: the library from the server's static files, then the project's config
/// script, as PostHog serves it. Shared with the edge, whose script comes from upstream.
pub async fn array_js(app: &App, config: &[u8]) -> Result<Vec<u8>, ApiError> {
    let (dir, named) = app.config.static_dir();
    let library = super::assets::serve(&dir, named, "array.js", &HeaderMap::new()).await?;
    let mut body = http_body_util::BodyExt::collect(library.into_body())
        .await
        .map_err(|_| ApiError::Internal)?
        .to_bytes()
        .to_vec();
    body.extend_from_slice(b"\n\n");
    body.extend_from_slice(config);
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            parse_path("/array/phc_k/config"),
            Some(("phc_k", File::Config))
        );
        assert_eq!(
            parse_path("/array/phc_k/config.js"),
            Some(("phc_k", File::ConfigJs))
        );
        assert_eq!(
            parse_path("/array/phc_k/array.js"),
            Some(("phc_k", File::ArrayJs))
        );
        assert_eq!(parse_path("/array//config"), None);
        assert_eq!(parse_path("/array/a/b/config"), None);
        assert_eq!(parse_path("/array/phc_k/config/"), None);
        assert_eq!(parse_path("/array/phc_k"), None);
    }
}
