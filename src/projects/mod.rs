//! Everything configured per project. This file: the projects a server hosts, read
//! from `projects.json`: which project API key
//! (`phc_...`) ingests into which project, which personal keys (`phx_...`) may read and
//! manage it, and which project secret keys (`phs_...`, PostHog's feature flags secure
//! API key: at most two, the current one and the next) may read its flag definitions.
//! A key is listed either as itself or, so it need not sit on disk in plain
//! text, as `{"sha256": "<hex>", "label": "ci"}`: the SHA-256 of the key, unsalted, as
//! PostHog stores its personal keys (`sha256$<hex>`, which is accepted too). A hashed
//! personal key may carry PostHog's `"scopes"` (`["feature_flag:read"]`); without them
//! it has every right.
//!
//! Beside it, the rest of a project's configuration: what it tells posthog-js at start
//! (`client_config`, its `remote_config` switches), its surveys (`surveys/`) and early
//! access features (`early_access`), and the loader those two share (`catalog`). A
//! survey's targeting flags join the project's flag rules (`flags`).

pub(crate) mod catalog;
pub(crate) mod client_config;
pub(crate) mod early_access;
mod edit;
mod keys;
pub(crate) mod surveys;

pub use edit::{add_hashed_key, add_key, KeyList, NewKey, MAX_LABEL_CHARS};
#[cfg(test)]
use keys::KEY_ALPHABET;
pub use keys::{
    check_scopes, hash_key, mask_key, new_key, new_secret_key, Caller, PROJECT_KEY_PREFIX,
};
use keys::{mask_secret, normalise_hash};

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

/// The longest project key the reference service accepts.
const MAX_KEY_LEN: usize = 64;
/// Personal API keys carry this prefix; they read data and never ingest.
pub const PERSONAL_KEY_PREFIX: &str = "phx_";
/// Project secret keys carry this prefix, as PostHog's feature flags secure API keys do;
/// they read the flag definitions feeds and nothing else.
pub const SECRET_KEY_PREFIX: &str = "phs_";
/// Secret keys a project may have: the one in use and its successor while clients move
/// over (PostHog's `secret_api_token` and `secret_api_token_backup`).
pub const MAX_SECRET_KEYS: usize = 2;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Project {
    pub id: u64,
    #[serde(default)]
    pub name: String,
    pub api_key: String,
    #[serde(default)]
    pub personal_api_keys: Vec<PersonalKey>,
    /// Project secret keys, in the same two forms as personal keys (without scopes).
    #[serde(default)]
    pub secret_api_keys: Vec<PersonalKey>,
    /// Edge mode: the key the flag sync reads this project's definitions from upstream
    /// with (a `phs_` feature flags secure API key, or a `phx_` personal key); without
    /// it, the project's flags stay its own files.
    #[serde(default)]
    pub upstream_secret_key: Option<UpstreamKey>,
    /// Drop `$ip` from stored events once it has been used for enrichment.
    #[serde(default)]
    pub anonymize_ips: bool,
    /// What the project's browser clients are told to turn on (heatmaps, exception
    /// autocapture, web vitals, ...); everything off by default.
    #[serde(default)]
    pub remote_config: crate::projects::client_config::Switches,
    /// The members every `/decide` and `/flags` answer ends with, written once from the
    /// switches: without and with an active survey (`client_config::decide_tail`).
    #[serde(skip)]
    decide_tails: [String; 2],
}

impl Project {
    /// The client config members a decide answer ends with, by whether the project has
    /// an active survey.
    pub fn decide_tail(&self, surveys: bool) -> &str {
        &self.decide_tails[usize::from(surveys)]
    }
}

/// An upstream credential: sent to upstream as it is, so kept in plain text, and never
/// shown (its `Debug` masks it).
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct UpstreamKey(String);

impl UpstreamKey {
    /// The key, for the `Authorization` header of requests to upstream only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A `phs_` or `phx_` key of visible ASCII (it goes into a header).
    fn check(&self) -> Result<(), String> {
        let k = &self.0;
        let shape = (k.starts_with(SECRET_KEY_PREFIX) || k.starts_with(PERSONAL_KEY_PREFIX))
            && k.len() > 4
            && k.bytes().all(|b| b.is_ascii_graphic());
        if shape {
            Ok(())
        } else {
            Err(
                "upstream_secret_key must be upstream's phs_... feature flags secure API key \
                 (or a phx_... personal key)"
                    .into(),
            )
        }
    }
}

impl std::fmt::Debug for UpstreamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UpstreamKey({}...)", self.0.get(..4).unwrap_or_default())
    }
}

/// One entry of `personal_api_keys`: the key itself, or its hash with a label.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PersonalKey {
    Plain(String),
    Hashed(HashedKey),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HashedKey {
    /// Lowercase hex of SHA-256 over the key's UTF-8 bytes, optionally `sha256$`-prefixed.
    pub sha256: String,
    #[serde(default)]
    pub label: Option<String>,
    /// PostHog's scope names (`feature_flag:read`, ...); `None` is every right.
    #[serde(default)]
    pub scopes: Option<Vec<String>>,
}

/// A hashed key's label, or one made from its hash when it has none.
fn label_of(h: &HashedKey, hash: &str) -> String {
    h.label
        .clone()
        .unwrap_or_else(|| format!("key sha256:{}", hash.get(..8).unwrap_or_default()))
}

/// `secret_api_keys`: at most [`MAX_SECRET_KEYS`], each `phs_...` or a hash, no scopes
/// (a secret key has one right).
fn check_secret_keys(keys: &[PersonalKey]) -> Result<(), String> {
    if keys.len() > MAX_SECRET_KEYS {
        return Err(format!(
            "secret_api_keys holds {} keys; at most {MAX_SECRET_KEYS}, the current one and the next",
            keys.len()
        ));
    }
    for k in keys {
        match k {
            PersonalKey::Plain(k) if !k.starts_with(SECRET_KEY_PREFIX) || k.len() <= 4 => {
                let shown: String = k.chars().take(4).collect();
                return Err(format!(
                    "secret_api_keys entry starting {shown:?} must look like phs_..."
                ));
            }
            PersonalKey::Hashed(h) if normalise_hash(&h.sha256).is_none() => {
                return Err(
                    "secret_api_keys sha256 must be 64 hex digits (optionally sha256$...)".into(),
                );
            }
            PersonalKey::Hashed(h) if h.scopes.is_some() => {
                return Err(
                    "secret_api_keys entries take no scopes: a secret key only reads flag definitions"
                        .into(),
                );
            }
            _ => {}
        }
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    projects: Vec<Project>,
}

/// An immutable index of the projects file; replaced whole on reload.
#[derive(Debug, Default)]
pub struct Projects {
    by_key: HashMap<String, Arc<Project>>,
    by_id: HashMap<u64, Arc<Project>>,
    by_personal_key: HashMap<String, Arc<Project>>,
    /// Hashed personal keys by their hex digest, with who they say the caller is.
    by_key_hash: HashMap<String, (Arc<Project>, Caller)>,
    /// Project secret keys by their hex digest (plain ones hashed at load), with labels.
    by_secret_hash: HashMap<String, (Arc<Project>, String)>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Error(String);

/// Why a key cannot be a project API key, judged by shape alone (before any lookup),
/// with the reference service's rules.
pub fn key_shape_is_valid(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && key.is_ascii()
        && !key.starts_with(PERSONAL_KEY_PREFIX)
        && !key.starts_with(SECRET_KEY_PREFIX)
}

impl Projects {
    pub fn load(path: &Path) -> Result<Projects, Error> {
        Projects::parse_file(path, &Projects::load_bytes(path)?)
    }

    /// The file's bytes, or an error naming it.
    pub fn load_bytes(path: &Path) -> Result<Vec<u8>, Error> {
        std::fs::read(path).map_err(|e| Error(format!("{}: cannot read: {e}", path.display())))
    }

    /// [`Projects::parse`] with errors naming the file.
    pub fn parse_file(path: &Path, bytes: &[u8]) -> Result<Projects, Error> {
        Projects::parse(bytes).map_err(|e| Error(format!("{}: {}", path.display(), e.0)))
    }

    pub fn parse(bytes: &[u8]) -> Result<Projects, Error> {
        let file: File = serde_json::from_slice(bytes).map_err(|e| Error(e.to_string()))?;
        let mut projects = Projects::default();
        for (i, p) in file.projects.into_iter().enumerate() {
            let at = format!("projects[{i}] (id {})", p.id);
            if !key_shape_is_valid(&p.api_key) {
                return Err(Error(format!(
                    "{at}: api_key must be 1-{MAX_KEY_LEN} ASCII characters and not a personal key"
                )));
            }
            for k in &p.personal_api_keys {
                match k {
                    PersonalKey::Plain(k)
                        if !k.starts_with(PERSONAL_KEY_PREFIX) || k.len() <= 4 =>
                    {
                        let shown: String = k.chars().take(4).collect();
                        return Err(Error(format!(
                            "{at}: personal_api_keys entry starting {shown:?} must look like phx_..."
                        )));
                    }
                    PersonalKey::Hashed(h) if normalise_hash(&h.sha256).is_none() => {
                        return Err(Error(format!(
                            "{at}: personal_api_keys sha256 must be 64 hex digits (optionally sha256$...)"
                        )));
                    }
                    PersonalKey::Hashed(HashedKey {
                        scopes: Some(scopes),
                        ..
                    }) => {
                        if scopes.is_empty() {
                            return Err(Error(format!(
                                "{at}: personal_api_keys scopes must name at least one scope; \
                                 leave \"scopes\" out for every right"
                            )));
                        }
                        check_scopes(scopes).map_err(|e| Error(format!("{at}: {e}")))?;
                    }
                    _ => {}
                }
            }
            check_secret_keys(&p.secret_api_keys).map_err(|e| Error(format!("{at}: {e}")))?;
            if let Some(k) = &p.upstream_secret_key {
                k.check().map_err(|e| Error(format!("{at}: {e}")))?;
            }
            let mut p = p;
            p.decide_tails = [false, true].map(|surveys| {
                crate::projects::client_config::decide_tail(
                    &p.remote_config,
                    crate::projects::client_config::Facts { surveys },
                )
            });
            let p = Arc::new(p);
            if projects.by_id.insert(p.id, p.clone()).is_some() {
                return Err(Error(format!("{at}: duplicate project id")));
            }
            if projects
                .by_key
                .insert(p.api_key.clone(), p.clone())
                .is_some()
            {
                return Err(Error(format!("{at}: api_key used by another project")));
            }
            for k in &p.personal_api_keys {
                let fresh = match k {
                    PersonalKey::Plain(k) => projects
                        .by_personal_key
                        .insert(k.clone(), p.clone())
                        .is_none(),
                    PersonalKey::Hashed(h) => {
                        let hash = normalise_hash(&h.sha256).unwrap_or_default();
                        if projects.by_secret_hash.contains_key(&hash) {
                            return Err(both_lists(&at));
                        }
                        let caller = Caller {
                            project: p.id,
                            label: label_of(h, &hash),
                            scopes: h.scopes.clone().map(Arc::from),
                        };
                        projects
                            .by_key_hash
                            .insert(hash, (p.clone(), caller))
                            .is_none()
                    }
                };
                if !fresh {
                    return Err(Error(format!("{at}: personal key listed twice")));
                }
            }
            for k in &p.secret_api_keys {
                let (hash, label) = match k {
                    PersonalKey::Plain(k) => (hash_key(k), mask_secret(k)),
                    PersonalKey::Hashed(h) => {
                        let hash = normalise_hash(&h.sha256).unwrap_or_default();
                        let label = label_of(h, &hash);
                        (hash, label)
                    }
                };
                if projects.by_key_hash.contains_key(&hash) {
                    return Err(both_lists(&at));
                }
                if projects
                    .by_secret_hash
                    .insert(hash, (p.clone(), label))
                    .is_some()
                {
                    return Err(Error(format!("{at}: secret key listed twice")));
                }
            }
        }
        Ok(projects)
    }

    pub fn by_api_key(&self, key: &str) -> Option<&Arc<Project>> {
        self.by_key.get(key)
    }

    pub fn by_id(&self, id: u64) -> Option<&Arc<Project>> {
        self.by_id.get(&id)
    }

    /// The project a personal API key belongs to, whether listed plain or hashed.
    pub fn by_personal_key(&self, key: &str) -> Option<&Arc<Project>> {
        self.personal_key(key).map(|(p, _)| p)
    }

    /// The project a personal API key belongs to and who it says the caller is. Only a
    /// `phx_` key is one, whatever hash a list holds: every caller (Bearer, console
    /// sign-in, a session's recheck) looks keys up here.
    pub fn personal_key(&self, key: &str) -> Option<(&Arc<Project>, Caller)> {
        if !key.starts_with(PERSONAL_KEY_PREFIX) {
            return None;
        }
        if let Some(p) = self.by_personal_key.get(key) {
            let label = mask_key(key);
            return Some((
                p,
                Caller {
                    project: p.id,
                    label,
                    scopes: None,
                },
            ));
        }
        if self.by_key_hash.is_empty() {
            return None;
        }
        let (p, caller) = self.by_key_hash.get(&hash_key(key))?;
        Some((p, caller.clone()))
    }

    /// The project a project secret key (`phs_...`) belongs to, and the key's label.
    pub fn secret_key(&self, key: &str) -> Option<(&Arc<Project>, String)> {
        if self.by_secret_hash.is_empty() || !key.starts_with(SECRET_KEY_PREFIX) {
            return None;
        }
        let (p, label) = self.by_secret_hash.get(&hash_key(key))?;
        Some((p, label.clone()))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Project>> {
        self.by_id.values()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// One key hash in both a personal and a secret list would let the secret key (which
/// a server holds, and which has no scopes) sign in to the console, or the other way
/// round: refused when the file is read.
fn both_lists(at: &str) -> Error {
    Error(format!(
        "{at}: a key hash is in both personal_api_keys and secret_api_keys \
         (of this or another project); a key is one or the other"
    ))
}

#[cfg(test)]
mod tests;
