//! Cohort membership for one request: a cohort's tree of AND/OR groups over person
//! tests, evaluated on the person's properties (whatever the leaves' types say).

use super::super::cohort::Tree;
use super::super::filter::{Leaf, Source};
use super::super::result::FailureCause;
use super::Env;

impl Env<'_, '_> {
    pub(super) fn cohort(&self, index: usize) -> Result<bool, FailureCause> {
        let cohorts = &self.rules.cohorts;
        match (cohorts.trees.get(index), cohorts.usable.get(index)) {
            (Some(tree), Some(true)) => self.tree(tree),
            _ => Err(FailureCause::Unsupported),
        }
    }

    fn tree(&self, tree: &Tree) -> Result<bool, FailureCause> {
        match tree {
            Tree::All(children) => {
                for child in children {
                    if !self.tree(child)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            Tree::Any(children) => {
                for child in children {
                    if self.tree(child)? {
                        return Ok(true);
                    }
                }
                Ok(children.is_empty())
            }
            // Cohorts are about people: their leaves read the person, whatever their type.
            // A group-typed leaf's test number is shared with group filters, which read
            // the group, so only person-typed leaves use the remembered answers.
            Tree::Leaf(Leaf::Property {
                key,
                slot,
                predicate,
                source,
                operator,
                negate,
            }) => {
                let matched = match source {
                    Source::Person => self.person_test(key, *slot, *predicate, operator)?,
                    Source::Group(_) => {
                        operator.matches(self.person_value(key, *slot)?, self.ctx.now)
                    }
                };
                Ok(matched != *negate)
            }
            Tree::Leaf(leaf) => self.leaf(leaf, None),
        }
    }
}
