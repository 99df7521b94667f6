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
pub(crate) mod surveys;

pub use edit::{add_hashed_key, add_key, KeyList, NewKey, MAX_LABEL_CHARS};

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::support::hex;

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

/// Who a personal key says the caller is, for logs and the activity log: the label of
/// a hashed key, or a masked form of a plain one (`phx_...abcd`, as PostHog shows
/// keys). Never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub project: u64,
    pub label: String,
    /// The key's scopes; `None` (a key listed without any) is every right.
    pub scopes: Option<Arc<[String]>>,
}

impl Caller {
    /// Whether the key may do what `scope` names (`feature_flag:write`): its scopes hold
    /// it, or `*`, or, for a `:read` scope, the same object's `:write`, as PostHog judges.
    pub fn allows(&self, scope: &str) -> bool {
        let Some(scopes) = &self.scopes else {
            return true;
        };
        let write = scope
            .strip_suffix(":read")
            .map(|object| format!("{object}:write"));
        scopes
            .iter()
            .any(|s| s == "*" || s == scope || Some(s) == write.as_ref())
    }
}

/// Scope names as PostHog writes them: `*`, or `object:read` / `object:write` with a
/// lowercase object (`feature_flag`, `query`, ...). A list names at least one.
pub fn check_scopes(scopes: &[String]) -> Result<(), String> {
    for scope in scopes {
        let ok = scope == "*"
            || scope.split_once(':').is_some_and(|(object, action)| {
                !object.is_empty()
                    && object.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                    && matches!(action, "read" | "write")
            });
        if !ok {
            return Err(format!(
                "scope {scope:?} is not one: write PostHog's names, such as feature_flag:read, \
                 feature_flag:write or *"
            ));
        }
    }
    Ok(())
}

/// SHA-256 of a key as lowercase hex, the form `projects.json` stores.
pub fn hash_key(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

/// `phx_...abcd`: enough to tell keys apart in a log, not enough to use one.
pub fn mask_key(key: &str) -> String {
    let tail: String = key
        .chars()
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("{PERSONAL_KEY_PREFIX}...{tail}")
}

/// `phs_...abcd`, as [`mask_key`] does for personal keys.
fn mask_secret(key: &str) -> String {
    let tail = key.get(key.len().saturating_sub(4)..).unwrap_or("");
    format!("{SECRET_KEY_PREFIX}...{tail}")
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

/// The 64 hex digits of a stored hash, lowercased, without PostHog's `sha256$` prefix.
fn normalise_hash(stored: &str) -> Option<String> {
    let hex = stored.strip_prefix("sha256$").unwrap_or(stored);
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| hex.to_ascii_lowercase())
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

/// Project API keys carry this prefix, as PostHog's do.
pub const PROJECT_KEY_PREFIX: &str = "phc_";

/// The characters of a new key after its prefix: PostHog's base62 alphabet.
const KEY_ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Characters after the prefix: 43 base62 characters carry 256 bits, the 32 random
/// bytes of PostHog's project keys; personal keys get 48 (285 bits, above its 35 bytes).
const PROJECT_KEY_CHARS: usize = 43;
const PERSONAL_KEY_CHARS: usize = 48;

/// A new random key from the operating system's CSPRNG: a project API key
/// (`phc_` and 43 characters) or a personal API key (`phx_` and 48).
pub fn new_key(personal: bool) -> Result<String, getrandom::Error> {
    match personal {
        true => random_key(PERSONAL_KEY_PREFIX, PERSONAL_KEY_CHARS),
        false => random_key(PROJECT_KEY_PREFIX, PROJECT_KEY_CHARS),
    }
}

/// A new random project secret key: `phs_` and 48 characters, as strong as a personal key.
pub fn new_secret_key() -> Result<String, getrandom::Error> {
    random_key(SECRET_KEY_PREFIX, PERSONAL_KEY_CHARS)
}

fn random_key(prefix: &str, chars: usize) -> Result<String, getrandom::Error> {
    let mut key = String::from(prefix);
    let mut bytes = [0u8; 64];
    while key.len() < prefix.len() + chars {
        getrandom::fill(&mut bytes)?;
        // Bytes of 248 and above are dropped, so each of the 62 characters is
        // equally likely (248 = 4 * 62).
        let usable = bytes
            .iter()
            .filter(|&&b| usize::from(b) < 4 * KEY_ALPHABET.len());
        for &b in usable.take(prefix.len() + chars - key.len()) {
            key.push(char::from(
                KEY_ALPHABET[usize::from(b) % KEY_ALPHABET.len()],
            ));
        }
    }
    Ok(key)
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

    /// The project a personal API key belongs to and who it says the caller is.
    pub fn personal_key(&self, key: &str) -> Option<(&Arc<Project>, Caller)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_indexes() {
        let p = Projects::parse(
            br#"{"projects":[{"id":1,"name":"a","api_key":"phc_a","personal_api_keys":["phx_a"]},
                             {"id":2,"api_key":"phc_b"}]}"#,
        )
        .unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p.by_api_key("phc_a").unwrap().id, 1);
        assert_eq!(p.by_personal_key("phx_a").unwrap().id, 1);
        assert!(p.by_api_key("phx_a").is_none());
        assert_eq!(p.by_id(2).unwrap().api_key, "phc_b");
    }

    #[test]
    fn rejects_bad_files() {
        for (bad, why) in [
            (r#"{"projects":[{"id":1,"api_key":"phx_a"}]}"#, "personal"),
            (r#"{"projects":[{"id":1,"api_key":""}]}"#, "1-64"),
            (
                r#"{"projects":[{"id":1,"api_key":"a"},{"id":1,"api_key":"b"}]}"#,
                "duplicate",
            ),
            (
                r#"{"projects":[{"id":1,"api_key":"a"},{"id":2,"api_key":"a"}]}"#,
                "another",
            ),
            (
                r#"{"projects":[{"id":1,"api_key":"a","personal_api_keys":["phc_x"]}]}"#,
                "phx_",
            ),
            (
                r#"{"projects":[{"id":1,"api_key":"a","typo":1}]}"#,
                "unknown field",
            ),
        ] {
            let err = Projects::parse(bad.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn hashed_keys_authenticate_with_their_label() {
        let hash = hash_key("phx_secret");
        // Python's hashlib.sha256(b"phx_secret").hexdigest(), what PostHog's
        // `hash_key_value` writes after `sha256$`.
        assert_eq!(
            hash,
            "30e09a05dca2e5dca49128b7f09bba629763a8f4f386abb74d71d12a87209d3b"
        );
        let file = format!(
            r#"{{"projects":[{{"id":1,"api_key":"phc_a","personal_api_keys":["phx_plain",
                {{"sha256":"{hash}","label":"ci"}}]}},
                {{"id":2,"api_key":"phc_b","personal_api_keys":[{{"sha256":"sha256${}"}}]}}]}}"#,
            hash_key("phx_other").to_uppercase()
        );
        let p = Projects::parse(file.as_bytes()).unwrap();
        let (project, caller) = p.personal_key("phx_secret").unwrap();
        assert_eq!((project.id, caller.label.as_str()), (1, "ci"));
        let (_, caller) = p.personal_key("phx_plain").unwrap();
        assert_eq!(caller.label, "phx_...lain");
        let (project, caller) = p.personal_key("phx_other").unwrap();
        assert_eq!(project.id, 2);
        assert_eq!(
            caller.label,
            format!("key sha256:{}", &hash_key("phx_other")[..8])
        );
        assert!(p.personal_key("phx_secreT").is_none());
        assert_eq!(p.by_personal_key("phx_secret").unwrap().id, 1);
        for bad in [
            r#"{"sha256":"abc"}"#,
            r#"{"sha256":"x","label":"l","more":1}"#,
        ] {
            let file =
                format!(r#"{{"projects":[{{"id":1,"api_key":"a","personal_api_keys":[{bad}]}}]}}"#);
            assert!(Projects::parse(file.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn new_keys_are_well_formed_and_accepted() {
        let project = new_key(false).unwrap();
        assert!(
            project.starts_with("phc_") && project.len() == 4 + 43,
            "{project}"
        );
        assert!(key_shape_is_valid(&project));
        let personal = new_key(true).unwrap();
        assert!(
            personal.starts_with("phx_") && personal.len() == 4 + 48,
            "{personal}"
        );
        assert!(
            !key_shape_is_valid(&personal),
            "a personal key never ingests"
        );
        let file = format!(
            r#"{{"projects":[{{"id":1,"api_key":"{project}","personal_api_keys":["{personal}"]}}]}}"#
        );
        let parsed = Projects::parse(file.as_bytes()).unwrap();
        assert_eq!(parsed.by_api_key(&project).unwrap().id, 1);
        assert_eq!(parsed.by_personal_key(&personal).unwrap().id, 1);
        // Every character of the alphabet turns up, none outside it, no key twice.
        let keys: Vec<String> = (0..200).map(|_| new_key(false).unwrap()).collect();
        let unique: std::collections::HashSet<&String> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len());
        let mut seen: std::collections::BTreeSet<u8> = Default::default();
        for key in &keys {
            seen.extend(key.bytes().skip(4));
        }
        let alphabet: std::collections::BTreeSet<u8> = KEY_ALPHABET.iter().copied().collect();
        assert_eq!(seen, alphabet);
    }

    #[test]
    fn key_shapes() {
        assert!(key_shape_is_valid("phc_abc"));
        assert!(!key_shape_is_valid(""));
        assert!(!key_shape_is_valid("phx_abc"));
        assert!(!key_shape_is_valid(&"a".repeat(65)));
        assert!(key_shape_is_valid(&"a".repeat(64)));
        assert!(!key_shape_is_valid("phc_é"));
    }

    #[test]
    fn secret_keys_and_scoped_personal_keys() {
        let file = format!(
            r#"{{"projects":[{{"id":1,"api_key":"phc_a",
                "secret_api_keys":["phs_plain", {{"sha256":"{}","label":"next"}}],
                "personal_api_keys":[{{"sha256":"{}","label":"ro","scopes":["feature_flag:read"]}},
                                     {{"sha256":"{}","label":"all"}}]}}]}}"#,
            hash_key("phs_hashed"),
            hash_key("phx_ro"),
            hash_key("phx_all")
        );
        let p = Projects::parse(file.as_bytes()).unwrap();
        assert_eq!(
            p.secret_key("phs_plain").map(|(p, l)| (p.id, l)),
            Some((1, "phs_...lain".into()))
        );
        assert_eq!(
            p.secret_key("phs_hashed").map(|(p, l)| (p.id, l)),
            Some((1, "next".into()))
        );
        assert!(p.secret_key("phs_other").is_none());
        assert!(
            p.personal_key("phs_plain").is_none(),
            "a secret key is no personal key"
        );
        let (_, ro) = p.personal_key("phx_ro").unwrap();
        assert!(ro.allows("feature_flag:read"));
        assert!(!ro.allows("feature_flag:write"));
        assert!(!ro.allows("query:read"));
        let (_, all) = p.personal_key("phx_all").unwrap();
        assert!(all.allows("feature_flag:write") && all.allows("query:read"));
        let writer = Caller {
            project: 1,
            label: "w".into(),
            scopes: Some(Arc::from(vec!["feature_flag:write".to_owned()])),
        };
        assert!(writer.allows("feature_flag:read"), "write includes read");
        assert!(!writer.allows("cohort:read"));
        let star = Caller {
            scopes: Some(Arc::from(vec!["*".to_owned()])),
            ..writer
        };
        assert!(star.allows("cohort:write"));
        assert!(!key_shape_is_valid("phs_abc"), "a secret key never ingests");
        let secret = new_secret_key().unwrap();
        assert!(
            secret.starts_with("phs_") && secret.len() == 4 + 48,
            "{secret}"
        );
    }

    #[test]
    fn rejects_bad_secret_keys_and_scopes() {
        for (bad, why) in [
            (r#""secret_api_keys":["phx_a"]"#, "phs_"),
            (
                r#""secret_api_keys":["phs_a","phs_b","phs_c"]"#,
                "at most 2",
            ),
            (r#""secret_api_keys":["phs_a","phs_a"]"#, "listed twice"),
            (
                r#""personal_api_keys":[{"sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":[]}]"#,
                "at least one scope",
            ),
            (
                r#""personal_api_keys":[{"sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":["flags"]}]"#,
                "is not one",
            ),
        ] {
            let file = format!(r#"{{"projects":[{{"id":1,"api_key":"phc_a",{bad}}}]}}"#);
            let err = Projects::parse(file.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
