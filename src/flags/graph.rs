//! Orders flags so every dependency is evaluated before the flags that read it, and fails
//! closed on what cannot be ordered: flags on or behind a dependency cycle, and flags whose
//! dependency is itself broken, are marked broken with a warning rather than rejecting the
//! whole file (one bad edit must not take every other flag of the project down). A broken
//! flag answers off with reason `missing_dependency`, as PostHog's flags service answers.

use std::collections::VecDeque;

use super::error::{CompileError, ErrorKind};
use super::filter::{FlagRef, Leaf};
use super::flag::Flag;

/// Marks broken flags and returns the evaluation order of the rest (active flags only).
pub(super) fn plan(flags: &mut [Flag], warnings: &mut Vec<CompileError>) -> Vec<usize> {
    let deps = dependencies(flags);
    let mut dependents = vec![Vec::new(); flags.len()];
    let mut pending = vec![0usize; flags.len()];
    for (i, flag_deps) in deps.iter().enumerate() {
        for &j in flag_deps {
            dependents[j].push(i);
            pending[i] += 1;
        }
    }
    // Kahn's algorithm, seeded in definition order so the result is deterministic.
    let mut ready: VecDeque<usize> = (0..flags.len())
        .filter(|&i| flags[i].logic.is_some() && pending[i] == 0)
        .collect();
    let mut topo = Vec::with_capacity(flags.len());
    while let Some(i) = ready.pop_front() {
        topo.push(i);
        for &k in &dependents[i] {
            pending[k] -= 1;
            if pending[k] == 0 {
                ready.push_back(k);
            }
        }
    }
    for (i, flag) in flags.iter_mut().enumerate() {
        if flag.logic.is_some() && pending[i] > 0 {
            flag.broken = true;
            warnings.push(warning(flag, ErrorKind::DependencyCycle));
        }
    }
    for &i in &topo {
        if flags[i].broken {
            continue;
        }
        if let Some(&j) = deps[i].iter().find(|&&j| flags[j].broken) {
            let kind = ErrorKind::BrokenDependency(flags[j].header.key.clone());
            flags[i].broken = true;
            warnings.push(warning(&flags[i], kind));
        }
    }
    topo.retain(|&i| !flags[i].broken);
    for (flag, deps) in flags.iter_mut().zip(deps) {
        flag.deps = deps;
    }
    topo
}

/// For each flag, the distinct active flags it reads. Inactive dependencies need no
/// ordering: they always read as disabled.
fn dependencies(flags: &[Flag]) -> Vec<Vec<usize>> {
    flags
        .iter()
        .map(|flag| {
            let mut deps = Vec::new();
            for leaf in flag.logic.iter().flat_map(|logic| logic.leaves()) {
                if let Leaf::Flag {
                    flag: FlagRef::Index(j),
                    ..
                } = leaf
                {
                    if flags[*j].logic.is_some() && !deps.contains(j) {
                        deps.push(*j);
                    }
                }
            }
            deps
        })
        .collect()
}

fn warning(flag: &Flag, kind: ErrorKind) -> CompileError {
    CompileError::new(String::new(), kind).in_flag(&flag.header.key)
}
