//! One flag compiled from its definition: conditions with resolved references, variant
//! boundaries precomputed in stored order (the running f64 sum, so the walk is identical to
//! PostHog's), the holdout, early-access settings and payloads.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::cohort::Cohorts;
use super::definition::Node;
use super::error::{CompileError, ErrorKind};
use super::filter::{CohortRef, FlagRef, Leaf, Scope, Source};

/// Person property that records an early-access opt-in, followed by the flag key.
const ENROLLMENT_PREFIX: &str = "$feature_enrollment/";

/// Variant given to holdout members, followed by the holdout id.
const HOLDOUT_VARIANT_PREFIX: &str = "holdout-";

/// Payload key of enabled flags without a variant.
const BOOLEAN_PAYLOAD_KEY: &str = "true";

/// The fields every live flag has, read before any flag is compiled so dependencies can be
/// resolved in any order.
#[derive(Debug, Clone)]
pub(super) struct Header {
    pub(super) key: String,
    /// The key as a JSON string, quotes included, ready to copy into responses.
    pub(super) quoted: Box<str>,
    pub(super) id: i64,
    pub(super) version: Option<i64>,
    pub(super) active: bool,
    pub(super) deleted: bool,
}

impl Header {
    /// Reads from an element of the file's `flags` array. Errors after the key is known are
    /// reported relative to the flag, e.g. `flag "beta": version: expected an integer`.
    pub(super) fn read(item: &Node<'_>) -> Result<Header, CompileError> {
        let key_node = item.get("key");
        let key = key_node.str()?;
        if key.is_empty() {
            return Err(key_node.invalid("flag key is empty"));
        }
        let flag = Node::root(item.value());
        let read = || -> Result<Header, CompileError> {
            Ok(Header {
                key: key.to_owned(),
                quoted: quoted(key),
                id: flag.get("id").i64()?,
                version: flag.get("version").opt_i64()?,
                active: flag.get("active").bool_or(true)?,
                deleted: flag.get("deleted").bool_or(false)?,
            })
        };
        read().map_err(|e| e.in_flag(key))
    }
}

#[derive(Debug)]
pub(super) struct Flag {
    pub(super) header: Header,
    /// `None` for inactive flags: never evaluated, read as disabled by dependents.
    pub(super) logic: Option<Logic>,
    /// Set when a dependency is missing or cyclic: the flag is off, reason
    /// `missing_dependency`.
    pub(super) broken: bool,
    /// Set when the flag uses something that cannot be evaluated (an operator or filter
    /// type PostHog's flags service does not evaluate, a missing or unusable cohort): it
    /// is left out of every response, with `errorsWhileComputingFlags`.
    pub(super) unsupported: bool,
    /// The active flags this one reads, by index (set by `graph::plan`).
    pub(super) deps: Vec<usize>,
}

/// A group aggregation: the group type index and its name, `None` when the index is
/// unmapped (such a condition can never find its group and reads `no_group_type`).
#[derive(Debug, Clone)]
pub(super) struct Aggregation {
    pub(super) index: i64,
    pub(super) name: Option<String>,
}

#[derive(Debug, Clone)]
pub(super) struct Condition {
    pub(super) filters: Vec<Leaf>,
    /// The condition's own `aggregation_group_type_index`, else the flag's: whose
    /// properties its group filters read and whose key it buckets by.
    pub(super) aggregation: Option<Aggregation>,
    /// `None` is 100 %.
    pub(super) rollout: Option<f64>,
    /// The override, kept only when it names a defined variant.
    pub(super) variant: Option<usize>,
}

#[derive(Debug, Clone)]
pub(super) struct Variant {
    pub(super) key: String,
    /// The key as a JSON string, quotes included.
    pub(super) quoted: Box<str>,
    /// Running sum of `rollout_percentage / 100` up to and including this variant.
    pub(super) boundary: f64,
    /// `payloads[key]`, looked up once here rather than per request.
    pub(super) payload: Option<Payload>,
}

#[derive(Debug, Clone)]
pub(super) struct Holdout {
    /// `None` is 100 %.
    pub(super) percentage: Option<f64>,
    pub(super) variant: String,
    /// The variant as a JSON string, quotes included.
    pub(super) quoted: Box<str>,
    /// `payloads[variant]`, if the file has one.
    pub(super) payload: Option<Payload>,
}

/// A payload of an enabled value (never JSON null), with its JSON text so responses copy
/// it instead of serializing it on every request.
#[derive(Debug, Clone)]
pub(super) struct Payload {
    pub(super) value: Value,
    pub(super) json: Box<str>,
}

impl Payload {
    /// `payloads[key]`; a null payload is no payload.
    fn of(payloads: &Map<String, Value>, key: &str) -> Option<Payload> {
        let value = payloads.get(key).filter(|p| !p.is_null())?.clone();
        let json = serde_json::to_string(&value).ok()?.into_boxed_str();
        Some(Payload { value, json })
    }
}

/// `s` as a JSON string literal.
pub(super) fn quoted(s: &str) -> Box<str> {
    // Serializing a string into a String cannot fail.
    serde_json::to_string(s)
        .unwrap_or_default()
        .into_boxed_str()
}

/// Legacy early access: `super_groups[0]`, considered only when the person has one of
/// its property keys.
#[derive(Debug, Clone)]
pub(super) struct SuperCondition {
    pub(super) condition: Condition,
    pub(super) keys: Vec<String>,
}

#[derive(Debug, Clone)]
pub(super) struct Logic {
    pub(super) aggregation: Option<Aggregation>,
    pub(super) continuity: bool,
    /// The `$feature_enrollment/<key>` property when `feature_enrollment` is on.
    pub(super) enrollment: Option<String>,
    pub(super) super_condition: Option<SuperCondition>,
    pub(super) holdout: Option<Holdout>,
    pub(super) conditions: Vec<Condition>,
    /// Whether some condition aggregates by other than the flag's own aggregation, so
    /// buckets by its own id; when none does, every condition shares the flag's hashes.
    pub(super) own_buckets: bool,
    pub(super) early_exit: bool,
    pub(super) variants: Vec<Variant>,
    /// `payloads["true"]`: the payload of an enabled flag without a variant.
    pub(super) boolean_payload: Option<Payload>,
}

/// What flag compilation may consult besides the flag itself.
pub(super) struct FlagScope<'a> {
    pub(super) scope: &'a Scope,
    pub(super) cohorts: &'a Cohorts,
    pub(super) group_types: &'a BTreeMap<i64, String>,
}

impl FlagScope<'_> {
    fn aggregation(&self, index: i64) -> Aggregation {
        Aggregation {
            index,
            name: self.group_types.get(&index).cloned(),
        }
    }
}

impl Logic {
    /// Compiles a live flag's logic. Broken references are returned as warnings: they
    /// disable this flag, not the file.
    pub(super) fn compile(
        flag: &Node<'_>,
        key: &str,
        ctx: &FlagScope<'_>,
        warnings: &mut Vec<CompileError>,
    ) -> Result<Logic, CompileError> {
        let filters = flag.get("filters");
        let mut variants = variants(&filters.get("multivariate").get("variants"))?;
        let aggregation = filters
            .get("aggregation_group_type_index")
            .opt_i64()?
            .map(|index| ctx.aggregation(index));
        let mut conditions = Vec::new();
        for group in filters.get("groups").items()? {
            let own = group.get("aggregation_group_type_index").opt_i64()?;
            let aggregation = own.map(|i| ctx.aggregation(i)).or(aggregation.clone());
            conditions.push(condition(&group, &variants, aggregation, ctx, warnings)?);
        }
        let enrollment = filters
            .get("feature_enrollment")
            .bool_or(false)?
            .then(|| format!("{ENROLLMENT_PREFIX}{key}"));
        // PostHog reads legacy `super_groups` only for flags without `feature_enrollment`.
        let super_groups = filters.get("super_groups");
        let super_condition = match super_groups.items()?.first() {
            Some(first) if enrollment.is_none() => {
                super_condition(first, &variants, ctx, warnings)?
            }
            _ => None,
        };
        let empty = Map::new();
        let payloads = match filters.get("payloads").value() {
            Value::Object(map) => map,
            Value::Null => &empty,
            _ => return Err(filters.get("payloads").wrong_type("an object")),
        };
        for variant in &mut variants {
            variant.payload = Payload::of(payloads, &variant.key);
        }
        let flag_index = aggregation.as_ref().map(|a| a.index);
        let own_buckets = conditions
            .iter()
            .any(|c| c.aggregation.as_ref().map(|a| a.index) != flag_index);
        Ok(Logic {
            aggregation,
            continuity: flag.get("ensure_experience_continuity").bool_or(false)?,
            enrollment,
            super_condition,
            holdout: holdout(&filters, payloads)?,
            conditions,
            own_buckets,
            early_exit: filters.get("early_exit").bool_or(false)?,
            variants,
            boolean_payload: Payload::of(payloads, BOOLEAN_PAYLOAD_KEY),
        })
    }

    /// Every leaf filter the flag evaluates.
    pub(super) fn leaves(&self) -> impl Iterator<Item = &Leaf> {
        let super_filters = self
            .super_condition
            .iter()
            .flat_map(|s| &s.condition.filters);
        self.conditions
            .iter()
            .flat_map(|c| &c.filters)
            .chain(super_filters)
    }

    /// Whether evaluating this flag may read person properties.
    pub(super) fn reads_person(&self) -> bool {
        self.enrollment.is_some()
            || self.super_condition.is_some()
            || self.leaves().any(|leaf| match leaf {
                Leaf::Property { source, .. } => *source == Source::Person,
                Leaf::Cohort { .. } => true,
                Leaf::Flag { .. } => false,
            })
    }

    /// Whether evaluating this flag may read group properties.
    pub(super) fn reads_group(&self) -> bool {
        self.leaves().any(|leaf| {
            matches!(
                leaf,
                Leaf::Property {
                    source: Source::Group(_),
                    ..
                }
            )
        })
    }
}

/// The variants with their boundaries; payloads are attached once the file's payloads
/// are read.
fn variants(node: &Node<'_>) -> Result<Vec<Variant>, CompileError> {
    let mut boundary = 0.0;
    let mut out = Vec::new();
    for item in node.items()? {
        let percentage = item.get("rollout_percentage");
        boundary += percentage
            .opt_f64()?
            .ok_or_else(|| percentage.error(ErrorKind::Missing))?
            / 100.0;
        let key = item.get("key").str()?;
        out.push(Variant {
            key: key.to_owned(),
            quoted: quoted(key),
            boundary,
            payload: None,
        });
    }
    Ok(out)
}

fn condition(
    node: &Node<'_>,
    variants: &[Variant],
    aggregation: Option<Aggregation>,
    ctx: &FlagScope<'_>,
    warnings: &mut Vec<CompileError>,
) -> Result<Condition, CompileError> {
    let mut filters = Vec::new();
    let properties = node.get("properties");
    for item in properties.items()? {
        let leaf = Leaf::compile(&item, ctx.scope, super::filter::Allow::Everything)?;
        if let Some(kind) = broken_reference(&leaf, ctx.cohorts) {
            warnings.push(item.error(kind));
        }
        filters.push(leaf);
    }
    let variant = node.get("variant").opt_str()?;
    Ok(Condition {
        filters,
        aggregation,
        rollout: node.get("rollout_percentage").opt_f64()?,
        variant: variant.and_then(|v| variants.iter().position(|known| known.key == v)),
    })
}

fn super_condition(
    node: &Node<'_>,
    variants: &[Variant],
    ctx: &FlagScope<'_>,
    warnings: &mut Vec<CompileError>,
) -> Result<Option<SuperCondition>, CompileError> {
    // Early access is about the person, whatever the flag aggregates by.
    let condition = condition(node, variants, None, ctx, warnings)?;
    let keys: Vec<String> = condition
        .filters
        .iter()
        .filter_map(|leaf| match leaf {
            Leaf::Property { key, .. } => Some(key.clone()),
            _ => None,
        })
        .collect();
    // Without property keys the gate "one of its keys is present" can never open.
    Ok((!keys.is_empty()).then_some(SuperCondition { condition, keys }))
}

fn broken_reference(leaf: &Leaf, cohorts: &Cohorts) -> Option<ErrorKind> {
    if let Leaf::Cohort {
        cohort: CohortRef::Index(i),
        ..
    } = leaf
    {
        if let Some(Some(why)) = cohorts.unsupported.get(*i) {
            let id = cohorts.ids.get(*i).copied().unwrap_or_default();
            let why = format!("{}: {}", why.field(), why.kind());
            return Some(ErrorKind::UnsupportedCohort(id, why));
        }
    }
    match leaf {
        Leaf::Flag {
            flag: FlagRef::Missing(key),
            ..
        } => Some(ErrorKind::MissingDependency(key.clone())),
        Leaf::Cohort {
            cohort: CohortRef::Missing(id),
            ..
        } => Some(ErrorKind::MissingCohort(*id)),
        Leaf::Cohort {
            cohort: CohortRef::Index(i),
            ..
        } if !cohorts.usable.get(*i).copied().unwrap_or(false) => Some(ErrorKind::MissingCohort(
            cohorts.ids.get(*i).copied().unwrap_or_default(),
        )),
        _ => None,
    }
}

/// `filters.holdout` ({id, exclusion_percentage}), or PostHog's older `holdout_groups`.
fn holdout(
    filters: &Node<'_>,
    payloads: &Map<String, Value>,
) -> Result<Option<Holdout>, CompileError> {
    let holdout = filters.get("holdout");
    if !holdout.is_null() {
        let id = holdout.get("id").i64()?;
        // Required: a null percentage would mean 100 % and hold every user out.
        let percentage = holdout.get("exclusion_percentage");
        let exclusion = percentage
            .opt_f64()?
            .ok_or_else(|| percentage.error(ErrorKind::Missing))?;
        let variant = format!("{HOLDOUT_VARIANT_PREFIX}{id}");
        return Ok(Some(Holdout::new(Some(exclusion), variant, payloads)));
    }
    let groups = filters.get("holdout_groups");
    let items = groups.items()?;
    let Some(first) = items.first() else {
        return Ok(None);
    };
    // Holdout groups with property filters never admit anyone, as in PostHog.
    if !first.get("properties").items()?.is_empty() {
        return Ok(None);
    }
    let Some(variant) = first.get("variant").opt_str()? else {
        return Ok(None);
    };
    let percentage = first.get("rollout_percentage").opt_f64()?;
    Ok(Some(Holdout::new(percentage, variant.to_owned(), payloads)))
}

impl Holdout {
    fn new(percentage: Option<f64>, variant: String, payloads: &Map<String, Value>) -> Holdout {
        Holdout {
            percentage,
            quoted: quoted(&variant),
            payload: Payload::of(payloads, &variant),
            variant,
        }
    }
}
