//! Keys themselves: who a key says its caller is ([`Caller`], with its scopes), how a
//! key is hashed and masked for the file and the logs, and new random keys from the
//! operating system's CSPRNG for `flagpost key new`.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::{PERSONAL_KEY_PREFIX, SECRET_KEY_PREFIX};
use crate::support::hex;

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
pub(super) fn mask_secret(key: &str) -> String {
    let tail = key.get(key.len().saturating_sub(4)..).unwrap_or("");
    format!("{SECRET_KEY_PREFIX}...{tail}")
}

/// The 64 hex digits of a stored hash, lowercased, without PostHog's `sha256$` prefix.
pub(super) fn normalise_hash(stored: &str) -> Option<String> {
    let hex = stored.strip_prefix("sha256$").unwrap_or(stored);
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| hex.to_ascii_lowercase())
}

/// Project API keys carry this prefix, as PostHog's do.
pub const PROJECT_KEY_PREFIX: &str = "phc_";

/// The characters of a new key after its prefix: PostHog's base62 alphabet.
pub(super) const KEY_ALPHABET: &[u8] =
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

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
