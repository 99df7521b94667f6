//! `serve`'s edge-mode options (`--upstream` and the four that tune it) into
//! [`config::Upstream`]; the values' own syntax is `flagpost::edge::settings`.

use flagpost::config;

use super::{or_env, timeout, Serve};

/// Edge mode's settings if `--upstream` is given.
pub(super) fn settings(args: &Serve) -> Result<Option<config::Upstream>, String> {
    use flagpost::edge::settings::{bytes, seconds};
    let Some(url) = or_env(args.upstream.clone(), "FLAGPOST_UPSTREAM")? else {
        return Ok(None);
    };
    let mut settings = flagpost::edge::settings::parse_url(&url)?;
    if let Some(v) = or_env(args.upstream_poll.clone(), "FLAGPOST_UPSTREAM_POLL")? {
        settings.poll = seconds(&v).map_err(|e| format!("--upstream-poll {v:?}: {e}"))?;
    }
    let historical = or_env(
        args.upstream_historical_after.clone(),
        "FLAGPOST_UPSTREAM_HISTORICAL_AFTER",
    )?;
    if let Some(v) = historical {
        settings.historical_after =
            seconds(&v).map_err(|e| format!("--upstream-historical-after {v:?}: {e}"))?;
    }
    let backlog = or_env(
        args.upstream_max_backlog.clone(),
        "FLAGPOST_UPSTREAM_MAX_BACKLOG",
    )?;
    if let Some(v) = backlog {
        settings.max_backlog_bytes =
            Some(bytes(&v).map_err(|e| format!("--upstream-max-backlog {v:?}: {e}"))?);
    }
    if let Some(t) = timeout(args.upstream_flags_budget_ms, "UPSTREAM_FLAGS_BUDGET_MS")? {
        settings.flags_budget = t;
    }
    Ok(Some(settings))
}
