//! `ProjectRules`: one project's flag file, parsed and compiled once into the form that is
//! evaluated on every request. Compilation resolves every name (group types, cohorts, flag
//! dependencies) to an index and orders flags by dependency, so evaluation does no lookups
//! by name and cannot loop.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

use serde_json::Value;

use super::cohort::{self, Cohorts, Tree};
use super::definition::Node;
use super::error::{CompileError, ErrorKind};
use super::filter::{Leaf, Scope, Source, UNSHARED};
use super::flag::{Flag, FlagScope, Header, Logic};
use super::graph;
use super::property::Matching;

pub(super) mod needs;
use needs::Needs;

/// A project's flag definitions, compiled. Immutable and cheap to share between threads.
#[derive(Debug)]
pub struct ProjectRules {
    /// Live (not deleted) flags in definition order; indexes refer to this list.
    pub(super) flags: Vec<Flag>,
    /// Evaluation order: active, unbroken flags, each after its dependencies.
    pub(super) order: Vec<usize>,
    pub(super) cohorts: Cohorts,
    group_types: BTreeMap<i64, String>,
    definitions: Value,
    warnings: Vec<CompileError>,
    needs_person: bool,
    needs_group: bool,
    needs_continuity: bool,
    /// How many distinct property keys the filters read (see `Scope::slot`).
    pub(super) property_keys: usize,
    /// How many person tests more than one filter makes (see [`share_predicates`]).
    pub(super) predicates: usize,
    /// The slot of the `distinct_id` property, when a filter reads it: PostHog adds the
    /// request's distinct id to the person properties a flag sees.
    pub(super) distinct_id_slot: Option<usize>,
    /// Each flag's index by key, for requests naming their flags (`flag_keys`): one
    /// lookup a named key instead of comparing it with every flag's key. The keys are
    /// the rules' own, so a fast unkeyed hash is safe here.
    by_key: HashMap<String, usize, BuildHasherDefault<KeyHasher>>,
    /// What each flag needs for an edge to decide it, worked out on an edge's first
    /// verdict (`inconclusive`): plain serving never asks.
    needs: OnceLock<Needs>,
}

/// The person property PostHog fills with the distinct id when the person has none.
pub(super) const DISTINCT_ID: &str = "distinct_id";

impl ProjectRules {
    /// Parses and compiles a `flags/<id>.json` file in PostHog's local-evaluation format.
    pub fn compile(json: &[u8]) -> Result<ProjectRules, CompileError> {
        let definitions: Value = serde_json::from_slice(json)
            .map_err(|e| CompileError::new(String::new(), ErrorKind::Json(e.to_string())))?;
        ProjectRules::from_value(definitions)
    }

    /// Compiles definitions that are already parsed.
    pub fn from_value(definitions: Value) -> Result<ProjectRules, CompileError> {
        let root = Node::root(&definitions);
        if !definitions.is_object() {
            return Err(root.wrong_type("an object with \"flags\""));
        }
        let group_types = group_types(&root.get("group_type_mapping"))?;
        let flags_node = root.get("flags");
        let items = flags_node.items()?;
        let mut headers = Vec::new();
        for item in &items {
            headers.push(Header::read(item)?);
        }
        let live: Vec<usize> = (0..items.len()).filter(|&i| !headers[i].deleted).collect();
        let cohorts_node = root.get("cohorts");
        let scope = Scope {
            cohorts: cohort::ids(&cohorts_node)?,
            flags_by_id: index_ids(&live, &headers, &items)?,
            flags_by_key: index_keys(&live, &headers, &items)?,
            property_keys: Default::default(),
            predicates: Default::default(),
            matching: matching(&root.get("property_matching_version"))?,
        };
        let mut cohorts = cohort::compile(&cohorts_node, &scope)?;
        let ctx = FlagScope {
            scope: &scope,
            cohorts: &cohorts,
            group_types: &group_types,
        };
        let mut warnings = Vec::new();
        let mut flags = Vec::with_capacity(live.len());
        for &i in &live {
            flags.push(compile_flag(
                &items[i],
                headers[i].clone(),
                &ctx,
                &mut warnings,
            )?);
        }
        let property_keys = scope.property_keys.borrow().len();
        let predicates = share_predicates(&mut flags, &mut cohorts.trees);
        let distinct_id_slot = scope.property_keys.borrow().get(DISTINCT_ID).copied();
        let by_key = scope
            .flags_by_key
            .iter()
            .map(|(k, i)| (k.clone(), *i))
            .collect();
        let order = graph::plan(&mut flags, &mut warnings);
        let logic = |i: &usize| flags[*i].logic.as_ref();
        let needs_person = order.iter().filter_map(logic).any(Logic::reads_person);
        let needs_group = order.iter().filter_map(logic).any(Logic::reads_group);
        let needs_continuity = order.iter().filter_map(logic).any(|l| l.continuity);
        Ok(ProjectRules {
            flags,
            order,
            cohorts,
            group_types,
            definitions,
            warnings,
            needs_person,
            needs_group,
            needs_continuity,
            property_keys,
            predicates,
            distinct_id_slot,
            by_key,
            needs: OnceLock::new(),
        })
    }

    /// The same rules with `definitions` as the local-evaluation feed: the file as
    /// written, without the flags generated from surveys.
    pub(super) fn with_feed(mut self, definitions: Value) -> ProjectRules {
        self.definitions = definitions;
        self
    }

    /// Group type index to name, from the file's `group_type_mapping`.
    pub fn group_type_mapping(&self) -> &BTreeMap<i64, String> {
        &self.group_types
    }

    /// The file as loaded (flags, group types and cohorts), for the local-evaluation feed.
    pub fn definitions_json(&self) -> &Value {
        &self.definitions
    }

    /// Whether any evaluable flag may read person properties; when false the server can
    /// skip the person lookup (passing `None` then costs nothing).
    pub fn needs_person_properties(&self) -> bool {
        self.needs_person
    }

    /// Whether any evaluable flag may read group properties.
    pub fn needs_group_properties(&self) -> bool {
        self.needs_group
    }

    /// Whether any evaluable flag uses `ensure_experience_continuity`, and so needs the
    /// person's first distinct id.
    pub fn needs_continuity(&self) -> bool {
        self.needs_continuity
    }

    /// Flags disabled at compile time, worth logging: missing or cyclic dependencies
    /// (those flags answer off, `missing_dependency`), and filters or cohorts that
    /// cannot be evaluated (those flags are left out).
    pub fn warnings(&self) -> &[CompileError] {
        &self.warnings
    }

    /// Number of live (not deleted) flags, active or not.
    pub fn flag_count(&self) -> usize {
        self.flags.len()
    }

    /// The index of the flag with `key` in definition order, if the rules have it.
    pub fn index_of(&self, key: &str) -> Option<usize> {
        self.by_key.get(key).copied()
    }

    pub(super) fn needs(&self) -> &Needs {
        self.needs.get_or_init(|| Needs::of(self))
    }
}

fn compile_flag(
    item: &Node<'_>,
    header: Header,
    ctx: &FlagScope<'_>,
    warnings: &mut Vec<CompileError>,
) -> Result<Flag, CompileError> {
    let key = header.key.clone();
    let mut flag = Flag {
        header,
        logic: None,
        broken: false,
        unsupported: false,
        deps: Vec::new(),
    };
    // Inactive flags are never evaluated, so their filters are not held against the file.
    if !flag.header.active {
        return Ok(flag);
    }
    let root = Node::root(item.value());
    let mut found = Vec::new();
    let logic = match Logic::compile(&root, &key, ctx, &mut found) {
        Ok(logic) => logic,
        // A filter type PostHog has and flagpost does not evaluate leaves the one flag
        // out; an operator or type no flag may use is a mistake that refuses the file.
        Err(e) if e.is_unsupported() && !e.is_unknown_name() => {
            flag.unsupported = true;
            warnings.push(e.in_flag(&key));
            return Ok(flag);
        }
        Err(e) => return Err(e.in_flag(&key)),
    };
    flag.unsupported = found.iter().any(|w| {
        matches!(
            w.kind(),
            ErrorKind::MissingCohort(_) | ErrorKind::UnsupportedCohort(..)
        )
    });
    flag.broken = !found.is_empty() && !flag.unsupported;
    warnings.extend(found.into_iter().map(|w| w.in_flag(&key)));
    if !flag.unsupported {
        flag.logic = Some(logic);
    }
    Ok(flag)
}

/// Numbers the person tests that more than one filter makes (by `Scope::predicate`'s
/// identity) from 0, so a request remembers those answers only; every other filter's
/// `predicate` becomes [`UNSHARED`] and is tested directly, with nothing to remember.
/// Answers the number of shared tests.
fn share_predicates(flags: &mut [Flag], trees: &mut [Tree]) -> usize {
    let mut uses: HashMap<usize, usize> = HashMap::new();
    let mut count = |leaf: &mut Leaf| {
        if let Leaf::Property {
            predicate,
            source: Source::Person,
            ..
        } = leaf
        {
            *uses.entry(*predicate).or_default() += 1;
        }
    };
    each_leaf(flags, trees, &mut count);
    let mut numbers: HashMap<usize, usize> = HashMap::new();
    let mut renumber = |leaf: &mut Leaf| {
        if let Leaf::Property {
            predicate, source, ..
        } = leaf
        {
            *predicate = match (*source, uses.get(predicate)) {
                (Source::Person, Some(&n)) if n > 1 => {
                    let next = numbers.len();
                    *numbers.entry(*predicate).or_insert(next)
                }
                _ => UNSHARED,
            };
        }
    };
    each_leaf(flags, trees, &mut renumber);
    numbers.len()
}

/// Every leaf of the flags' conditions (early access included) and of the cohorts.
fn each_leaf(flags: &mut [Flag], trees: &mut [Tree], f: &mut impl FnMut(&mut Leaf)) {
    for logic in flags.iter_mut().filter_map(|flag| flag.logic.as_mut()) {
        let conditions = logic.conditions.iter_mut();
        let early = logic.super_condition.iter_mut().map(|s| &mut s.condition);
        for condition in conditions.chain(early) {
            condition.filters.iter_mut().for_each(&mut *f);
        }
    }
    fn walk(tree: &mut Tree, f: &mut impl FnMut(&mut Leaf)) {
        match tree {
            Tree::All(children) | Tree::Any(children) => {
                children.iter_mut().for_each(|child| walk(child, f))
            }
            Tree::Leaf(leaf) => f(leaf),
        }
    }
    trees.iter_mut().for_each(|tree| walk(tree, f));
}

/// `property_matching_version`: absent or 1 is the legacy boolean matching; 2 compares
/// text. Other versions are read as 1, as PostHog's SDKs do.
fn matching(node: &Node<'_>) -> Result<Matching, CompileError> {
    Ok(Matching {
        legacy_booleans: node.opt_i64()? != Some(2),
    })
}

fn group_types(node: &Node<'_>) -> Result<BTreeMap<i64, String>, CompileError> {
    let mut out = BTreeMap::new();
    for (index, name) in node.entries()? {
        let index = index
            .trim()
            .parse::<i64>()
            .map_err(|_| name.invalid(format!("group type index {index:?} is not an integer")))?;
        out.insert(index, name.str()?.to_owned());
    }
    Ok(out)
}

fn index_ids(
    live: &[usize],
    headers: &[Header],
    items: &[Node<'_>],
) -> Result<HashMap<i64, usize>, CompileError> {
    let mut out = HashMap::new();
    for (position, &i) in live.iter().enumerate() {
        if out.insert(headers[i].id, position).is_some() {
            let id = items[i].get("id");
            let message = format!("flag id {} is used twice", headers[i].id);
            return Err(id.invalid(message));
        }
    }
    Ok(out)
}

fn index_keys(
    live: &[usize],
    headers: &[Header],
    items: &[Node<'_>],
) -> Result<HashMap<String, usize>, CompileError> {
    let mut out = HashMap::new();
    for (position, &i) in live.iter().enumerate() {
        let key = &headers[i].key;
        if out.insert(key.clone(), position).is_some() {
            let node = items[i].get("key");
            return Err(node.error(ErrorKind::DuplicateKey(key.clone())));
        }
    }
    Ok(out)
}

/// The hash of [`ProjectRules::index_of`]: eight bytes a step with FxHash's mix. With
/// SipHash (or xxHash's set-up per key), hashing the 40-odd keys a request names cost
/// more than comparing each with every flag's key.
#[derive(Default)]
struct KeyHasher(u64);

impl KeyHasher {
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for chunk in &mut words {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, byte: u8) {
        self.mix(u64::from(byte));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
