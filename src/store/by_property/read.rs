//! A search of the index: a key's entries read in place ([`Layered::visit_with`]),
//! leaving unread the blocks that cannot hold a candidate. A block all of one value
//! (its first key and the next block's share the value) is known from the table's
//! index of blocks: one whose value fails is not read. A [`Sieve`] (a text an `icontains`
//! test needs, or one a `not_icontains` test refuses) is looked for in each block's
//! bytes at once: an entry is judged by where it hits, and a block where no value may
//! pass is not read on. An `icontains` text is looked for in the bytes ASCII-lowercased
//! (a value holding it in any case may pass); a `not_icontains` text in the bytes as
//! they are, lowercase (a value holding it so fails; one holding it in another case is
//! not judged, and is tested as any), which spares a copy of every block.
//!
//! The fold notes each block of the index it writes ([`NOTER`], [`Noted`]: the bytes
//! and trigrams its values hold, the bytes and a few trigrams every string holds, the
//! start and the end its strings share), in the run's file beside the blocks: a search
//! with a sieve, whatever its text, leaves unread a block where no value may hold its
//! `icontains` text (a byte or a trigram of it no value has) or where every value
//! holds its `not_icontains` text (a byte or trigram every one has, or in the start or
//! the end they share, as an email's domain is), reading only the notes of the key's
//! blocks, not the blocks. A run written before notes were is noted by the searches
//! that read its blocks, kept while it is open ([`Visitor::note`]).
//!
//! [`Layered::visit_with`]: crate::store::layered::Layered::visit_with

use std::ops::Range;

use memchr::memmem::Finder;

use super::{count, key_prefix, CUT, VALUE_BYTES};
use crate::store::layered::{block_entries, successor, Visitor};
use crate::store::{keys, Trees};

#[path = "noted.rs"]
mod noted;
pub use noted::NOTER;
use noted::{part, Noted};

/// What the bytes of a value's JSON text tell of a test before it is parsed, when the
/// value is whole and its text has no escape; the text is ASCII-lowercased, as
/// `icontains` (PostHog's `ILIKE`) folds.
#[derive(Clone, Copy)]
pub enum Sieve<'a> {
    /// Only a value whose text holds this may pass (`icontains`, without wildcards).
    Holds(&'a [u8]),
    /// A string whose text, within its quotes, holds this does not pass
    /// (`not_icontains`).
    Lacks(&'a [u8]),
}

/// A person's place (first event inverted, uuid) as three big-endian words: they sort
/// as its bytes sort, and compare without a call.
type Place = [u64; 3];

/// Runs of places in order that a stable sort merges; past it they are sorted whole.
const RUNS_MERGED: usize = 64;

fn place_of(tail: &[u8; 24]) -> Place {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&tail[i * 8..i * 8 + 8]);
        u64::from_be_bytes(w)
    };
    [word(0), word(1), word(2)]
}

/// The first-seen key of `place` in the project whose key starts `project`.
fn first_seen_key(project: &[u8; 8], place: &Place) -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(project);
    for (i, word) in place.iter().enumerate() {
        key[8 + i * 8..16 + i * 8].copy_from_slice(&word.to_be_bytes());
    }
    key
}

/// The persons of `project` having `key` with a value `test` passes (given the value's
/// JSON text and whether it was cut), and if `absent_passes` those without the key
/// too, as their first-seen keys after `after`, newest first. Each distinct value is
/// tested once, and not at all where `sieve` tells. Candidates only: an entry may be of
/// a value the person no longer has (see the module docs of [`super`]), or a cut one,
/// and a first-seen key may be stale.
///
/// The persons without the key are the first-seen keys that none of its entries names:
/// the places of its entries are sorted (within a value they are in order already, so
/// a key of a few values sorts in a few merges) and the first-seen index is read
/// beside them. Unless the key's [`count`]s say every person holds it: then no one
/// lacks it, and the key is read as for a test only holders pass. Where the counts say
/// the key's entries name more persons than hold it (a stale entry, which could hide a
/// person lacking the key), the answer is None: the index cannot give it.
pub fn candidates(
    trees: &Trees,
    project: u64,
    key: &str,
    after: Option<&[u8]>,
    absent_passes: bool,
    sieve: Option<Sieve<'_>>,
    test: impl FnMut(&[u8], bool) -> bool,
) -> Result<Option<Vec<[u8; 32]>>, sled::Error> {
    let Some(prefix) = key_prefix(project, key) else {
        return Ok(Some(Vec::new()));
    };
    let counts = match absent_passes {
        true => count::of(trees, project, key)?,
        false => None,
    };
    let absent_passes = absent_passes && counts.is_none_or(|(holders, all)| holders != all);
    let mut reader = Reader {
        prefix: &prefix,
        absent_passes,
        test,
        sieve: sieve.map(Sifted::new),
        last: None,
        found: Vec::new(),
        having: Vec::new(),
    };
    let end = successor(&prefix);
    trees
        .by_property
        .visit_with(&prefix, end.as_deref(), &mut reader);
    let Reader {
        mut found, having, ..
    } = reader;
    if absent_passes {
        if counts.is_some_and(|(holders, _)| having.len() as u64 > holders) {
            return Ok(None);
        }
        found.extend(lacking(trees, project, after, having));
    }
    found.sort_unstable();
    found.dedup();
    let project = keys::project(project);
    let keys = found.iter().map(|p| first_seen_key(&project, p));
    Ok(Some(
        keys.filter(|k| after.is_none_or(|a| &k[..] > a)).collect(),
    ))
}

/// The reader of a key's entries.
struct Reader<'p, T> {
    prefix: &'p [u8],
    absent_passes: bool,
    test: T,
    sieve: Option<Sifted<'p>>,
    /// The value last tested (its text, whether cut) and its answer.
    last: Option<(Vec<u8>, bool, bool)>,
    /// The places of the entries with a passing value.
    found: Vec<Place>,
    /// The places of every entry of the key, when those without it pass.
    having: Vec<Place>,
}

impl<T: FnMut(&[u8], bool) -> bool> Reader<'_, T> {
    /// The test's answer for a value, tested once while it repeats.
    fn passes(&mut self, text: &[u8], cut: bool) -> bool {
        match &mut self.last {
            Some((last, last_cut, passes)) if last.as_slice() == text && *last_cut == cut => {
                *passes
            }
            last => {
                let passes = (self.test)(text, cut);
                let kept = last.get_or_insert_with(|| (Vec::new(), cut, passes));
                kept.0.clear();
                kept.0.extend_from_slice(text);
                (kept.1, kept.2) = (cut, passes);
                passes
            }
        }
    }
}

impl<T: FnMut(&[u8], bool) -> bool> Visitor for Reader<'_, T> {
    fn pass_over(&mut self, first: &[u8], next: &[u8]) -> bool {
        if self.absent_passes {
            return false;
        }
        let Some((text, _)) = first.strip_prefix(self.prefix).and_then(split_entry) else {
            return false;
        };
        // Every key between two that share the value shares it; one shorter than the
        // kept length is whole.
        let value_end = self.prefix.len() + 1 + text.len();
        text.len() < VALUE_BYTES
            && next.get(..value_end) == first.get(..value_end)
            && !self.passes(text, false)
    }

    fn reads_notes(&self) -> Option<usize> {
        let sieve = self.sieve.as_ref().filter(|_| !self.absent_passes)?;
        Some(part(sieve.sieve))
    }

    fn note(&mut self, raw: &[u8]) -> Option<Vec<u8>> {
        let mut note = Vec::new();
        Noted::of(raw).put(self.reads_notes()?, &mut note);
        Some(note)
    }

    fn pass_over_noted(&mut self, note: &[u8]) -> bool {
        // The part read is the sieve's: a note tells nothing of persons lacking the key.
        let sieve = self.sieve.as_ref().filter(|_| !self.absent_passes);
        sieve.is_some_and(|s| noted::none_may_pass(s.sieve, note))
    }

    fn pass_over_block(&mut self, raw: &[u8]) -> bool {
        let Some(sieve) = &mut self.sieve else {
            return false;
        };
        sieve.mark(raw, self.prefix);
        !self.absent_passes && sieve.none_may_pass()
    }

    fn entry(&mut self, k: &[u8], v: &[u8]) {
        let Some((text, tail)) = split_entry(&k[self.prefix.len()..]) else {
            return;
        };
        let cut = v == CUT;
        let fails = self.sieve.as_mut().is_some_and(|s| s.fails(k, text, cut));
        let passes = !fails && self.passes(text, cut);
        if !passes && !self.absent_passes {
            return;
        }
        // Those before a cursor are left out at the end: for the persons without the
        // key, every entry's place is wanted.
        let place = place_of(tail);
        if self.absent_passes {
            self.having.push(place);
        }
        if passes {
            self.found.push(place);
        }
    }
}

/// A [`Sieve`] over a visit's blocks: the keys' offsets in the block last read whose
/// values it could not judge (`Holds`) or found failing (`Lacks`), and the hits it
/// found there.
struct Sifted<'a> {
    sieve: Sieve<'a>,
    finder: Finder<'a>,
    /// The block, ASCII-lowercased (for `Holds`).
    lower: Vec<u8>,
    hits: Vec<usize>,
    /// Where the block last read is in memory, its keys' offsets that are marked, and
    /// how many of its entries are of the key.
    block: Range<usize>,
    marked: Vec<usize>,
    of_key: usize,
    /// The first of `marked` an entry given next may be.
    next: usize,
}

impl<'a> Sifted<'a> {
    fn new(sieve: Sieve<'a>) -> Sifted<'a> {
        let (Sieve::Holds(text) | Sieve::Lacks(text)) = sieve;
        Sifted {
            sieve,
            finder: Finder::new(text),
            lower: Vec::new(),
            hits: Vec::new(),
            block: 0..0,
            marked: Vec::new(),
            of_key: 0,
            next: 0,
        }
    }

    /// Judge the entries of `prefix` in a block about to be read, by the hits of the
    /// text in its bytes (lowercased for `Holds`).
    fn mark(&mut self, raw: &[u8], prefix: &[u8]) {
        self.hits.clear();
        if let Sieve::Holds(_) = self.sieve {
            self.lower.clear();
            self.lower.extend(raw.iter().map(u8::to_ascii_lowercase));
            self.hits.extend(self.finder.find_iter(&self.lower));
        } else {
            self.hits.extend(self.finder.find_iter(raw));
        }
        let start = raw.as_ptr() as usize;
        (self.block, self.next) = (start..start + raw.len(), 0);
        self.marked.clear();
        self.of_key = 0;
        let mut hits = &self.hits[..];
        for (at, k, v) in block_entries(raw) {
            let Some((text, _)) = k.strip_prefix(prefix).and_then(split_entry) else {
                continue;
            };
            self.of_key += 1;
            let from = at + prefix.len() + 1;
            // Hits before this text are of no later one either.
            let before = hits.partition_point(|&h| h < from);
            hits = &hits[before..];
            if self.judge(hits, from, text, v == CUT) {
                self.marked.push(at);
            }
        }
    }

    /// Whether the entry whose value's text `text` starts at `from` in the searched
    /// bytes whose hits from there on are `hits` is marked.
    fn judge(&self, hits: &[usize], from: usize, text: &[u8], cut: bool) -> bool {
        let n = self.finder.needle().len();
        let within = |lo: usize, hi: usize| {
            hits.iter()
                .take_while(|&&h| h < hi)
                .any(|&h| h >= lo && h + n <= hi)
        };
        let plain = !cut && memchr::memchr(b'\\', text).is_none();
        match self.sieve {
            Sieve::Holds(_) => !plain || within(from, from + text.len()),
            Sieve::Lacks(_) => {
                let string = text.len() >= 2 && text[0] == b'"';
                plain && string && within(from + 1, from + text.len() - 1)
            }
        }
    }

    /// Whether no value of the block last marked may pass: none may hold the text, or
    /// every one holds the text it must lack.
    fn none_may_pass(&self) -> bool {
        match self.sieve {
            Sieve::Holds(_) => self.marked.is_empty(),
            Sieve::Lacks(_) => self.marked.len() == self.of_key,
        }
    }

    /// Whether the entry of key `k`, its value's text `text`, surely fails: judged by
    /// the marks if it is of the block last marked, else from its text.
    fn fails(&mut self, k: &[u8], text: &[u8], cut: bool) -> bool {
        let marked = if self.block.contains(&(k.as_ptr() as usize)) {
            let at = k.as_ptr() as usize - self.block.start;
            self.next += self.marked[self.next..].partition_point(|&m| m < at);
            self.marked.get(self.next) == Some(&at)
        } else {
            // An entry of the delta.
            let lower = text.to_ascii_lowercase();
            let hits: Vec<usize> = self.finder.find_iter(&lower).collect();
            self.judge(&hits, 0, text, cut)
        };
        marked != matches!(self.sieve, Sieve::Holds(_))
    }
}

/// An entry's key past its property key: the value's text and the person's place
/// (first event inverted, uuid).
pub(super) fn split_entry(rest: &[u8]) -> Option<(&[u8], &[u8; 24])> {
    let (&len, rest) = rest.split_first()?;
    let (text, tail) = (rest.get(..len as usize)?, rest.get(len as usize..)?);
    Some((text, tail.try_into().ok()?))
}

/// The places of the persons of `project` in the first-seen index after `after`
/// that are not in `having`.
fn lacking(
    trees: &Trees,
    project: u64,
    after: Option<&[u8]>,
    mut having: Vec<Place>,
) -> Vec<Place> {
    // Within a value the places are in order: a key of a few values is a few runs,
    // which a stable sort merges; one of many values is sorted as any.
    let runs = having.windows(2).filter(|w| w[1] < w[0]).count();
    if runs < RUNS_MERGED {
        having.sort();
    } else {
        having.sort_unstable();
    }
    let mut having = having.into_iter().peekable();
    let prefix = keys::project(project);
    let from = match after {
        Some(a) if a.starts_with(&prefix) => a.to_vec(),
        _ => prefix.to_vec(),
    };
    let end = project.checked_add(1).map(keys::project);
    let mut out = Vec::new();
    trees
        .first_seen
        .visit(&from, end.as_ref().map(|e| &e[..]), |k, _| {
            let Ok(tail) = <&[u8; 24]>::try_from(&k[8..]) else {
                return;
            };
            let place = place_of(tail);
            while having.next_if(|h| *h < place).is_some() {}
            if having.peek() != Some(&place) {
                out.push(place);
            }
        });
    out
}

#[cfg(test)]
#[path = "../tests/by_property_read.rs"]
mod tests;
