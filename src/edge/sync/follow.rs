//! One project's poll loop: poll, act on the answer, wait (the poll interval, or a
//! backoff after a failure, never shorter than upstream's `Retry-After`), again. Each
//! change of state (serving, failing with a given status, quota-limited) is logged
//! once, not once per poll.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::poll::{self, Endpoint, Polled};
use super::{disk, Serving, Syncer, Wanted};
use crate::edge::answer::{Backoff, BACKOFF_CAP};
use crate::support::watch::digest;

/// The kind of state last logged.
#[derive(PartialEq, Eq)]
enum Said {
    Nothing,
    Serving,
    Failing(String),
    QuotaLimited,
}

/// Poll project `id` for good. `etag` and `held` are those of the stored answer
/// installed at start, if any (`held` is its body's digest).
pub(super) async fn follow(
    sync: Arc<Syncer>,
    id: u64,
    wanted: Wanted,
    mut etag: Option<String>,
    mut held: Option<[u8; 20]>,
) {
    let rules_id = i64::try_from(id).unwrap_or_default();
    let dir = disk::dir(&sync.db_dir, id);
    let mut endpoint = Endpoint::Definitions;
    let mut backoff = Backoff::new(sync.poll, BACKOFF_CAP.max(sync.poll));
    let mut said = Said::Nothing;
    loop {
        let result = poll::poll(
            &sync.client,
            endpoint,
            &wanted.token,
            &wanted.key,
            etag.as_deref(),
        )
        .await;
        let status = poll::status_label(&result);
        sync.stats.answered(endpoint.label(), &status);
        sync.board.update(id, |s| {
            s.endpoint = endpoint.label();
            s.last_status = status.clone();
        });
        let wait = match poll::classify(endpoint, result) {
            // An upstream that ignores If-None-Match (PostHog does when it cannot read
            // its ETag) sends the same body again: nothing to compile.
            Polled::Changed { body, etag: tag } if held == Some(digest(&body)) => {
                etag = tag;
                confirmed(
                    &sync,
                    id,
                    etag.clone(),
                    false,
                    &mut backoff,
                    &mut said,
                    "flag definitions confirmed by upstream",
                )
            }
            Polled::Changed { body, etag: tag } => {
                let (s2, body2, tag2, dir2) =
                    (sync.clone(), body.clone(), tag.clone(), dir.clone());
                let installed = tokio::task::spawn_blocking(move || {
                    let version = s2.host.rules().sync_install(rules_id, &body2)?;
                    s2.host.published(id);
                    if let Err(e) = disk::store(&dir2, &body2, tag2.as_deref()) {
                        tracing::warn!(project = id, error = %e, "synced flag definitions not kept on disk; served from memory");
                    }
                    Ok::<u64, crate::flags::CompileError>(version)
                })
                .await;
                match installed {
                    Ok(Ok(_version)) => {
                        etag = tag;
                        held = Some(digest(&body));
                        confirmed(
                            &sync,
                            id,
                            etag.clone(),
                            true,
                            &mut backoff,
                            &mut said,
                            "flag definitions synced from upstream",
                        )
                    }
                    Ok(Err(error)) => {
                        let why = format!("upstream's definitions do not compile: {error}");
                        failed(&sync, id, &mut said, why, &mut backoff, None)
                    }
                    Err(e) => failed(&sync, id, &mut said, e.to_string(), &mut backoff, None),
                }
            }
            Polled::Unchanged { etag: tag } => {
                if let Some(tag) = tag.filter(|t| Some(t) != etag.as_ref()) {
                    let (dir2, tag2) = (dir.clone(), tag.clone());
                    let _ =
                        tokio::task::spawn_blocking(move || disk::store_etag(&dir2, &tag2)).await;
                    etag = Some(tag);
                }
                confirmed(
                    &sync,
                    id,
                    etag.clone(),
                    false,
                    &mut backoff,
                    &mut said,
                    "flag definitions confirmed by upstream",
                )
            }
            Polled::NoSuchEndpoint => {
                tracing::info!(project = id, "upstream has no /flags/definitions; polling /api/feature_flag/local_evaluation");
                endpoint = Endpoint::LocalEvaluation;
                continue;
            }
            Polled::QuotaLimited => {
                (etag, held) = (None, None);
                let (s2, dir2) = (sync.clone(), dir.clone());
                let _ = tokio::task::spawn_blocking(move || {
                    s2.host.rules().sync_quota_limited(rules_id);
                    s2.host.published(id);
                    if let Err(e) = disk::clear(&dir2) {
                        tracing::warn!(project = id, error = %e, "stored flag definitions not removed");
                    }
                })
                .await;
                sync.board.update(id, |s| {
                    s.quota_limited = true;
                    s.serving = Serving::QuotaLimited;
                    s.etag = None;
                    s.failures_in_a_row = 0;
                    s.confirmed = Some(SystemTime::now());
                });
                backoff.succeeded();
                say(&mut said, Said::QuotaLimited, id, "upstream says the flag quota is used up: flags cleared, answering quota_limited");
                sync.poll
            }
            Polled::Failed { why, retry_after } => {
                failed(&sync, id, &mut said, why, &mut backoff, retry_after)
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// Upstream answered with rules now served: the board and the age say so, the backoff
/// starts over, the log says `what` once; the next poll comes after the usual wait.
fn confirmed(
    sync: &Syncer,
    id: u64,
    etag: Option<String>,
    compiled: bool,
    backoff: &mut Backoff,
    said: &mut Said,
    what: &str,
) -> Duration {
    let now = SystemTime::now();
    sync.board.update(id, |s| {
        s.last_success = Some(now);
        s.confirmed = Some(now);
        s.failures_in_a_row = 0;
        s.etag = etag;
        s.quota_limited = false;
        s.serving = Serving::Upstream;
        if compiled {
            s.compiles += 1;
        }
    });
    sync.stats
        .definitions_age_seconds
        .get_or_create(&crate::edge::stats::ProjectLabels { project: id })
        .set(0.0);
    backoff.succeeded();
    say(said, Said::Serving, id, what);
    sync.poll
}

fn failed(
    sync: &Syncer,
    id: u64,
    said: &mut Said,
    why: String,
    backoff: &mut Backoff,
    retry_after: Option<std::time::Duration>,
) -> std::time::Duration {
    sync.board.update(id, |s| s.failures_in_a_row += 1);
    let kind = why.split_whitespace().next().unwrap_or("").to_string();
    if *said != Said::Failing(kind.clone()) {
        tracing::warn!(project = id, reason = %why, "flag sync failing; the last good rules stay");
        *said = Said::Failing(kind);
    }
    backoff.next(retry_after)
}

fn say(said: &mut Said, now: Said, id: u64, what: &str) {
    if *said != now {
        tracing::info!(project = id, "{what}");
        *said = now;
    }
}
