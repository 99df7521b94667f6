//! What an upstream answer to a delivery means, and how long to wait before the next
//! try: the table PostHog's capture answers call for (the edge research's §2.7),
//! shared by every forwarding loop so events and recordings are treated alike.
//!
//! | answer | action |
//! |---|---|
//! | 2xx | delivered: advance |
//! | 400 | one event in the batch is refused: bisect, dead-letter the one |
//! | 413 | too big: split; a single event still too big is dead-lettered |
//! | 401, 403 | the token is refused: pause this project, keep its events |
//! | 429, 5xx, other, no answer | retry the same bytes after a backoff |

use std::time::Duration;

use super::client::{Answer, Error};

/// The first wait after a failed try.
pub const BACKOFF_START: Duration = Duration::from_secs(1);
/// The longest wait between tries: PostHog's research table's cap, short enough that an
/// outage's end is noticed within minutes.
pub const BACKOFF_CAP: Duration = Duration::from_secs(300);
/// How often a paused project (401/403) is tried again: keys get fixed by hand.
pub const PAUSE_RETRY: Duration = Duration::from_secs(60);

/// What to do with a batch after one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Upstream has it: move the cursor past it.
    Delivered,
    /// 400: upstream refused something in it, with its reason (bisect to find it).
    Refused(String),
    /// 413: too large for upstream; send it in halves.
    TooLarge,
    /// 401/403: this project's token or key is refused; pause it, keep its events.
    Unauthorized(String),
    /// 429, 5xx, a timeout, a reset or a refused connection: the same bytes again
    /// later, no sooner than `after` if upstream said so.
    Retry { after: Option<Duration> },
}

impl Outcome {
    /// The outcome of an exchange that produced an answer or an error.
    pub fn of(result: &Result<Answer, Error>) -> Outcome {
        match result {
            Err(_) => Outcome::Retry { after: None },
            Ok(answer) => {
                let status = answer.status.as_u16();
                match status {
                    200..=299 => Outcome::Delivered,
                    400 => Outcome::Refused(reason(answer)),
                    413 => Outcome::TooLarge,
                    401 | 403 => Outcome::Unauthorized(reason(answer)),
                    _ => Outcome::Retry {
                        after: answer.retry_after(),
                    },
                }
            }
        }
    }
}

/// Upstream's reason for a refusal, from its JSON `detail` (or `error`) or its text,
/// kept short.
pub fn reason(answer: &Answer) -> String {
    const MAX_CHARS: usize = 500;
    let text = serde_json::from_slice::<serde_json::Value>(&answer.body)
        .ok()
        .and_then(|v| {
            ["detail", "error", "message"]
                .iter()
                .find_map(|k| v.get(k).and_then(|d| d.as_str()).map(str::to_string))
        })
        .unwrap_or_else(|| String::from_utf8_lossy(&answer.body).trim().to_string());
    let text: String = text.chars().take(MAX_CHARS).collect();
    format!("{} {}", answer.status.as_u16(), text)
        .trim()
        .to_string()
}

/// Exponential backoff with full jitter between `start` and `cap`, reset by a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    start: Duration,
    cap: Duration,
    failures: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(BACKOFF_START, BACKOFF_CAP)
    }
}

impl Backoff {
    pub fn new(start: Duration, cap: Duration) -> Backoff {
        Backoff {
            start,
            cap: cap.max(start),
            failures: 0,
        }
    }

    pub fn succeeded(&mut self) {
        self.failures = 0;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The wait after one more failure: a random point in the upper half of
    /// `start * 2^failures` (capped), so many edges recovering together do not all
    /// come back at once, and never shorter than upstream's `Retry-After`.
    pub fn next(&mut self, retry_after: Option<Duration>) -> Duration {
        let exp = self.failures.min(20);
        self.failures = self.failures.saturating_add(1);
        let ceiling = self.start.saturating_mul(1 << exp).min(self.cap);
        let half = ceiling / 2;
        let jitter = half.mul_f64(unit_random());
        let wait = half + jitter;
        match retry_after {
            // Upstream's word, bounded so a hostile answer cannot stall the edge for days.
            Some(after) => wait.max(after.min(self.cap * 4)),
            None => wait,
        }
    }
}

/// A number in [0, 1) from the operating system's generator (a failed read gives 0.5:
/// jitter is a courtesy, not a promise).
fn unit_random() -> f64 {
    let mut bytes = [0u8; 8];
    match getrandom::fill(&mut bytes) {
        Ok(()) => (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 0.5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::StatusCode;

    fn answer(status: u16, body: &str, retry_after: Option<&str>) -> Result<Answer, Error> {
        let mut headers = hyper::HeaderMap::new();
        if let Some(r) = retry_after {
            headers.insert("retry-after", r.parse().unwrap());
        }
        Ok(Answer {
            status: StatusCode::from_u16(status).unwrap(),
            headers,
            body: bytes::Bytes::from(body.to_string()),
        })
    }

    #[test]
    fn the_table() {
        assert_eq!(Outcome::of(&answer(200, "{}", None)), Outcome::Delivered);
        assert_eq!(Outcome::of(&answer(204, "", None)), Outcome::Delivered);
        assert_eq!(
            Outcome::of(&answer(
                400,
                r#"{"type":"validation_error","detail":"bad ts"}"#,
                None
            )),
            Outcome::Refused("400 bad ts".into())
        );
        assert_eq!(Outcome::of(&answer(413, "", None)), Outcome::TooLarge);
        assert!(matches!(
            Outcome::of(&answer(401, "nope", None)),
            Outcome::Unauthorized(r) if r == "401 nope"
        ));
        assert_eq!(
            Outcome::of(&answer(429, "", Some("7"))),
            Outcome::Retry {
                after: Some(Duration::from_secs(7))
            }
        );
        assert_eq!(
            Outcome::of(&answer(503, "", None)),
            Outcome::Retry { after: None }
        );
        assert_eq!(
            Outcome::of(&Err(Error::Timeout(Duration::from_secs(1)))),
            Outcome::Retry { after: None }
        );
    }

    #[test]
    fn backoff_grows_to_its_cap_with_jitter_and_honours_retry_after() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let mut ceiling = Duration::from_millis(100);
        for _ in 0..10 {
            let wait = b.next(None);
            assert!(
                wait >= ceiling / 2 && wait <= ceiling,
                "{wait:?} vs {ceiling:?}"
            );
            ceiling = (ceiling * 2).min(Duration::from_secs(2));
        }
        assert_eq!(b.failures(), 10);
        assert!(b.next(Some(Duration::from_secs(5))) >= Duration::from_secs(5));
        // A year-long Retry-After is bounded by four caps.
        assert!(b.next(Some(Duration::from_secs(31_536_000))) <= Duration::from_secs(8));
        b.succeeded();
        assert!(b.next(None) <= Duration::from_millis(100));
    }
}
