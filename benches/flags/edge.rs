//! The `FLAGS_DRIVER` mode's edge cases: what `/decide` at an edge (`serve --upstream`)
//! does for a request it decides entirely, beside the same request at a plain flagpost,
//! each in a function of its own so callgrind's inclusive counts compare them. The edge
//! evaluates with [`ProjectRules::outcomes_at_edge`] (which notes the person properties
//! it found), adds the verdicts over the rules ([`ProjectRules::inconclusive`], checked
//! against what each flag reads, worked out once per rules) and, for a request for every
//! flag, the lookup of the keys learned from upstream; everything else is the plain
//! path. (The handler no longer copies the decoded body in case upstream is asked: it
//! decodes it again when it is.)
//!
//! Two requests, each at both: naming in `flag_keys` the flags the edge decides for the
//! callers (the load harness's conclusive wrk case), and asking for every flag of rules
//! made of those flags only, with upstream's extra keys already learned (none).

use std::sync::Arc;

use flagpost::edge::fallback::{self, Flags, Learned};
use flagpost::flags::{Context, ProjectRules};
use serde_json::Value;

use super::DECIDE_VERSION;

/// The project id the learned keys are kept under.
const PROJECT: u64 = 1;

/// The flags no caller of `contexts` needs upstream for.
pub fn conclusive_keys(rules: &ProjectRules, contexts: &[Context<'_>]) -> Vec<String> {
    let mut needed = vec![false; rules.flag_count()];
    for ctx in contexts {
        let outcomes = rules.outcomes_at_edge(ctx);
        for (n, out) in rules.inconclusive(ctx, &outcomes).into_iter().enumerate() {
            needed[n] |= out;
        }
    }
    rules
        .keys()
        .zip(needed)
        .filter(|(_, needed)| !needed)
        .map(|(key, _)| key.to_owned())
        .collect()
}

/// `rules` as the edge holds them, with upstream's answer for every flag learned (it
/// named none beyond them).
pub fn learned(rules: &Arc<ProjectRules>) -> Learned {
    let learned = Learned::default();
    learned.learn(PROJECT, rules, &Flags::default());
    learned
}

#[inline(never)]
pub fn drive_plain(
    rules: &ProjectRules,
    contexts: &[Context<'_>],
    keys: Option<&[String]>,
    requests: usize,
) -> usize {
    let mut bytes = 0;
    for n in 0..requests {
        let ctx = &contexts[n % contexts.len()];
        let mut outcomes = rules.outcomes(ctx);
        if let Some(keys) = keys {
            outcomes.retain_keys(keys);
        }
        let body = outcomes.response_bytes(DECIDE_VERSION, uuid::Uuid::nil());
        bytes += std::hint::black_box(body).len();
    }
    bytes
}

#[inline(never)]
pub fn drive_edge(
    rules: &Arc<ProjectRules>,
    contexts: &[Context<'_>],
    keys: Option<&[String]>,
    learned: &Learned,
    requests: usize,
) -> usize {
    let mut bytes = 0;
    for n in 0..requests {
        let ctx = &contexts[n % contexts.len()];
        let mut outcomes = rules.outcomes_at_edge(ctx);
        if let Some(keys) = keys {
            outcomes.retain_keys(keys);
        }
        let plan = fallback::plan(PROJECT, rules, ctx, &mut outcomes, keys, learned);
        assert!(!plan.needed(), "a conclusive request asked upstream");
        let body = outcomes.response_bytes(DECIDE_VERSION, uuid::Uuid::nil());
        bytes += std::hint::black_box(body).len();
    }
    bytes
}

/// The cases, by the name `FLAGS_EDGE` takes.
pub const CASES: [&str; 4] = ["plain-named", "edge-named", "plain-every", "edge-every"];

/// One case (`FLAGS_EDGE`), `requests` times: each run counts one case alone, since
/// callgrind's count of a `drive_*` function sums every call of it.
pub fn driver(definitions: &Value, contexts: &[Context<'_>], case: &str, requests: usize) {
    let rules = Arc::new(ProjectRules::from_value(definitions.clone()).expect("compiles"));
    let keys = conclusive_keys(&rules, contexts);
    let only: Vec<&str> = keys.iter().map(String::as_str).collect();
    let subset =
        Arc::new(ProjectRules::from_value(super::only(definitions, &only)).expect("compiles"));
    let bytes = match case {
        "plain-named" => drive_plain(&rules, contexts, Some(&keys), requests),
        "edge-named" => {
            let none = Learned::default();
            drive_edge(&rules, contexts, Some(&keys), &none, requests)
        }
        "plain-every" => drive_plain(&subset, contexts, None, requests),
        "edge-every" => drive_edge(&subset, contexts, None, &learned(&subset), requests),
        _ => panic!("FLAGS_EDGE is one of {CASES:?}"),
    };
    println!(
        "{case} ({} of {} flags): {requests} requests, {bytes} bytes",
        keys.len(),
        rules.flag_count()
    );
}
