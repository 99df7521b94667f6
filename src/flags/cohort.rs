//! Cohorts from the file's `cohorts` object: nested AND/OR groups of person-property and
//! cohort filters. Cohorts may refer to each other; a cohort on a reference cycle, or one
//! that reaches a missing cohort, is marked unusable so the flags using it fail closed
//! instead of recursing forever or guessing.

use std::collections::HashMap;

use super::definition::Node;
use super::error::{CompileError, ErrorKind};
use super::filter::{Allow, CohortRef, Leaf, Scope};

/// A cohort's definition, or a subtree of it.
/// Deepest chain of cohorts built on cohorts that is evaluated. Evaluation recurses along
/// such chains, so a bound keeps a pathological file from exhausting the stack; real
/// projects nest a handful of levels.
const MAX_COHORT_NESTING: usize = 64;

#[derive(Debug, Clone)]
pub(super) enum Tree {
    /// Every child matches; an empty group matches.
    All(Vec<Tree>),
    /// Some child matches; an empty group matches, as in PostHog.
    Any(Vec<Tree>),
    Leaf(Leaf),
}

#[derive(Debug, Default)]
pub(super) struct Cohorts {
    pub(super) ids: Vec<i64>,
    pub(super) trees: Vec<Tree>,
    /// False for cohorts on a cycle, reaching a missing cohort, or nested too deep.
    pub(super) usable: Vec<bool>,
    /// Why a cohort cannot be evaluated at all (an operator or filter type PostHog's
    /// flags service does not evaluate, such as a behavioral filter): the flags using
    /// it are left out, not the file.
    pub(super) unsupported: Vec<Option<CompileError>>,
}

/// The cohort ids of the file, in file order, so references can be resolved up front.
pub(super) fn ids(cohorts: &Node<'_>) -> Result<HashMap<i64, usize>, CompileError> {
    let mut ids = HashMap::new();
    for (index, (name, node)) in cohorts.entries()?.into_iter().enumerate() {
        let id = name
            .trim()
            .parse::<i64>()
            .map_err(|_| node.invalid(format!("cohort id {name:?} is not an integer")))?;
        if ids.insert(id, index).is_some() {
            return Err(node.invalid(format!("cohort id {id} appears twice")));
        }
    }
    Ok(ids)
}

pub(super) fn compile(cohorts: &Node<'_>, scope: &Scope) -> Result<Cohorts, CompileError> {
    let mut out = Cohorts::default();
    for (name, node) in cohorts.entries()? {
        // Ids were validated by `ids`; the check keeps this path total.
        let id = name
            .trim()
            .parse::<i64>()
            .map_err(|_| node.error(ErrorKind::Missing))?;
        // The feed sends the property group itself; a full cohort object wraps it.
        let body = node
            .value()
            .get("properties")
            .map(|_| node.get("properties"));
        let root = Node::root(body.as_ref().unwrap_or(&node).value());
        let (tree, unsupported) = match tree(&root, scope) {
            Ok(tree) => (tree, None),
            Err(e) if e.is_unsupported() => (Tree::Any(Vec::new()), Some(e.in_cohort(name))),
            Err(e) => return Err(e.in_cohort(name)),
        };
        out.ids.push(id);
        out.trees.push(tree);
        out.unsupported.push(unsupported);
    }
    out.usable = usable(&out.trees);
    for (usable, unsupported) in out.usable.iter_mut().zip(&out.unsupported) {
        *usable &= unsupported.is_none();
    }
    Ok(out)
}

fn tree(node: &Node<'_>, scope: &Scope) -> Result<Tree, CompileError> {
    let kind = node.get("type");
    let group = match kind.value().as_str() {
        Some(t) if t.eq_ignore_ascii_case("AND") => Some(true),
        Some(t) if t.eq_ignore_ascii_case("OR") => Some(false),
        _ => None,
    };
    let Some(all) = group else {
        return Leaf::compile(node, scope, Allow::NoFlags).map(Tree::Leaf);
    };
    let values = node.get("values");
    let children = values
        .items()?
        .iter()
        .map(|child| tree(child, scope))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(if all {
        Tree::All(children)
    } else {
        Tree::Any(children)
    })
}

/// Cohorts referenced by a tree, with `None` for missing ones.
fn references(tree: &Tree, out: &mut Vec<Option<usize>>) {
    match tree {
        Tree::All(children) | Tree::Any(children) => {
            children.iter().for_each(|child| references(child, out));
        }
        Tree::Leaf(Leaf::Cohort { cohort, .. }) => out.push(match cohort {
            CohortRef::Index(i) => Some(*i),
            CohortRef::Missing(_) => None,
        }),
        Tree::Leaf(_) => {}
    }
}

/// Settles usability by repeated passes: a cohort is usable once everything it references
/// is (and the chain is not too deep); whatever never settles sits on or behind a cycle.
/// Cohort counts are small, so the quadratic worst case is cheap and needs no recursion.
fn usable(trees: &[Tree]) -> Vec<bool> {
    let refs: Vec<Vec<Option<usize>>> = trees
        .iter()
        .map(|tree| {
            let mut out = Vec::new();
            references(tree, &mut out);
            out
        })
        .collect();
    // `Some(Some(depth))`: usable at that nesting depth; `Some(None)`: unusable.
    let mut state: Vec<Option<Option<usize>>> = vec![None; trees.len()];
    loop {
        let mut changed = false;
        for (i, deps) in refs.iter().enumerate() {
            if state[i].is_some() {
                continue;
            }
            let (mut settled, mut broken, mut depth) = (true, false, 1);
            for dep in deps {
                match dep.map(|d| state[d]) {
                    None | Some(Some(None)) => broken = true,
                    Some(None) => settled = false,
                    Some(Some(Some(d))) => depth = depth.max(d + 1),
                }
            }
            if broken || settled {
                let usable = !broken && depth <= MAX_COHORT_NESTING;
                state[i] = Some(usable.then_some(depth));
                changed = true;
            }
        }
        if !changed {
            return state
                .into_iter()
                .map(|s| matches!(s, Some(Some(_))))
                .collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compile_cohorts(doc: serde_json::Value) -> Result<Cohorts, CompileError> {
        let root = Node::root(&doc);
        let scope = Scope {
            cohorts: ids(&root)?,
            flags_by_id: HashMap::new(),
            flags_by_key: HashMap::new(),
            property_keys: Default::default(),
            predicates: Default::default(),
            matching: Default::default(),
        };
        compile(&root, &scope)
    }

    fn leaf_ref(id: i64) -> serde_json::Value {
        json!({"type": "OR", "values": [{"key": "id", "type": "cohort", "value": id}]})
    }

    #[test]
    fn cycles_and_missing_references_are_unusable() {
        let cohorts = compile_cohorts(json!({
            "1": leaf_ref(2), "2": leaf_ref(1),          // a cycle
            "3": leaf_ref(1),                           // behind the cycle
            "4": leaf_ref(99),                          // missing
            "5": leaf_ref(6),
            "6": {"type": "AND", "values": [{"key": "plan", "value": "pro", "type": "person"}]},
            "7": {"type": "OR", "values": []}
        }))
        .unwrap();
        assert_eq!(cohorts.ids, vec![1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(
            cohorts.usable,
            vec![false, false, false, false, true, true, true]
        );
    }

    #[test]
    fn overly_deep_chains_are_unusable() {
        let mut doc = serde_json::Map::new();
        doc.insert("0".into(), json!({"type": "OR", "values": []}));
        for id in 1..=MAX_COHORT_NESTING as i64 {
            doc.insert(id.to_string(), leaf_ref(id - 1));
        }
        let cohorts = compile_cohorts(serde_json::Value::Object(doc)).unwrap();
        let last = cohorts.usable.len() - 1;
        assert!(
            cohorts.usable[last - 1],
            "{MAX_COHORT_NESTING} levels are fine"
        );
        assert!(!cohorts.usable[last], "one more is not");
    }

    #[test]
    fn self_reference_is_unusable() {
        let cohorts = compile_cohorts(json!({"8": leaf_ref(8)})).unwrap();
        assert_eq!(cohorts.usable, vec![false]);
    }

    #[test]
    fn errors_name_the_cohort_and_field() {
        // An operator PostHog does not evaluate disables the cohort, not the file.
        let cohorts = compile_cohorts(json!({"42": {"type": "OR", "values": [
            {"type": "AND", "values": [{"key": "a", "type": "person", "operator": "foo"}]}
        ]}}))
        .unwrap();
        assert_eq!(cohorts.usable, vec![false]);
        assert_eq!(
            cohorts.unsupported[0].as_ref().map(ToString::to_string),
            Some(r#"cohort 42: values[0].values[0].operator: unknown operator "foo""#.to_owned())
        );
        let err = compile_cohorts(json!({"x": leaf_ref(1)})).unwrap_err();
        assert_eq!(err.to_string(), r#"x: cohort id "x" is not an integer"#);
        let err = compile_cohorts(json!({"1": {"type": "OR", "values": [
            {"key": "7", "type": "flag", "value": true}
        ]}}))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cohort 1: values[0].type: flag filters cannot be used inside cohorts"
        );
    }

    #[test]
    fn wrapped_cohort_objects_are_accepted() {
        let cohorts = compile_cohorts(json!({"9": {"id": 9, "name": "Pros", "properties":
            {"type": "OR", "values": [{"key": "plan", "value": "pro", "type": "person"}]}}}))
        .unwrap();
        assert!(matches!(&cohorts.trees[0], Tree::Any(children) if children.len() == 1));
    }
}
