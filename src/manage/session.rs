//! The console's signed-in sessions: a random id (the cookie) mapped to the project of
//! the personal API key that signed in, a per-session token that every state-changing
//! request must echo in a header (the cookie alone never suffices), and the moment it
//! was last used. Sessions live in memory only: a restart signs everyone out, which is
//! what a server holding nothing else about its people should do.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A session unused for this long is gone: long enough for a working session with
/// pauses, short enough that a forgotten tab does not stay signed in overnight.
pub const IDLE_EXPIRY: Duration = Duration::from_secs(30 * 60);
/// Sessions held at most; past it the least recently used goes first, so sign-ins in
/// a loop cannot grow memory without bound.
const MAX_SESSIONS: usize = 10_000;
/// Random bytes in a session id and in a token: 256 bits, beyond guessing.
const SECRET_BYTES: usize = 32;

/// One signed-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    pub project: u64,
    /// The personal key that signed in, kept in memory so every request checks it is
    /// still in `projects.json` (removing a key signs its sessions out); never sent back.
    pub key: String,
    /// Who the key says the person is (a hashed key's label or the masked key).
    pub label: String,
    /// What state-changing requests must send in the token header.
    pub token: String,
    last_used: Instant,
}

#[derive(Default)]
pub struct Sessions {
    /// Plain data with no invariant spanning entries, so a panic cannot leave it
    /// inconsistent (see `sync::lock`).
    by_id: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// A new session for a checked key; its id is the cookie value.
    pub fn create(
        &self,
        project: u64,
        key: &str,
        label: &str,
    ) -> Result<(String, Session), String> {
        self.create_at(project, key, label, Instant::now())
    }

    /// The session of `id`, if it exists and was used within [`IDLE_EXPIRY`]; using it
    /// restarts the idle clock.
    pub fn touch(&self, id: &str) -> Option<Session> {
        self.touch_at(id, Instant::now())
    }

    /// Sign-out; true if there was such a session.
    pub fn remove(&self, id: &str) -> bool {
        crate::support::sync::lock(&self.by_id).remove(id).is_some()
    }

    pub fn len(&self) -> usize {
        crate::support::sync::lock(&self.by_id).len()
    }

    /// Sessions of `project`, the number its health page shows.
    pub fn count_of(&self, project: u64) -> usize {
        crate::support::sync::lock(&self.by_id)
            .values()
            .filter(|s| s.project == project)
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn create_at(
        &self,
        project: u64,
        key: &str,
        label: &str,
        now: Instant,
    ) -> Result<(String, Session), String> {
        let id = secret()?;
        let session = Session {
            project,
            key: key.to_owned(),
            label: label.to_owned(),
            token: secret()?,
            last_used: now,
        };
        let mut by_id = crate::support::sync::lock(&self.by_id);
        if by_id.len() >= MAX_SESSIONS {
            by_id.retain(|_, s| now.duration_since(s.last_used) < IDLE_EXPIRY);
        }
        if by_id.len() >= MAX_SESSIONS {
            let oldest = by_id
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                by_id.remove(&oldest);
            }
        }
        by_id.insert(id.clone(), session.clone());
        Ok((id, session))
    }

    fn touch_at(&self, id: &str, now: Instant) -> Option<Session> {
        let mut by_id = crate::support::sync::lock(&self.by_id);
        let session = by_id.get_mut(id)?;
        if now.duration_since(session.last_used) >= IDLE_EXPIRY {
            by_id.remove(id);
            return None;
        }
        session.last_used = now;
        Some(session.clone())
    }
}

/// Whether two secrets are equal, in time that depends only on their lengths, so a
/// token cannot be found byte by byte from response times.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// 256 random bits from the operating system, as lowercase hex.
fn secret() -> Result<String, String> {
    let mut bytes = [0u8; SECRET_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| format!("no random bytes: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_lasts_while_used_and_ends_when_idle() {
        let sessions = Sessions::default();
        let t0 = Instant::now();
        let (id, s) = sessions.create_at(7, "phx_k", "phx_...k", t0).unwrap();
        assert_eq!((id.len(), s.token.len(), s.project), (64, 64, 7));
        assert_ne!(id, s.token);
        let almost = t0 + IDLE_EXPIRY - Duration::from_secs(1);
        assert_eq!(sessions.touch_at(&id, almost).unwrap().token, s.token);
        // Used just now: the clock restarted.
        let later = almost + IDLE_EXPIRY - Duration::from_secs(1);
        assert!(sessions.touch_at(&id, later).is_some());
        assert!(sessions.touch_at(&id, later + IDLE_EXPIRY).is_none());
        assert!(sessions.is_empty(), "an expired session is forgotten");
        assert!(sessions.touch_at("nope", t0).is_none());
    }

    #[test]
    fn sign_out_removes_only_that_session() {
        let sessions = Sessions::default();
        let (a, _) = sessions.create(1, "phx_a", "a").unwrap();
        let (b, _) = sessions.create(2, "phx_b", "b").unwrap();
        assert!(sessions.remove(&a));
        assert!(!sessions.remove(&a));
        assert!(sessions.touch(&a).is_none());
        assert_eq!(sessions.touch(&b).unwrap().project, 2);
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
        assert!(!same_secret("", "a"));
    }
}
