//! The bucketing hash, bit-identical to PostHog's: SHA-1 of `"<key>.<id><salt>"`, the first
//! 15 hex digits (60 bits) as an integer, divided by `0xFFFFFFFFFFFFFFF`. Users moving from
//! PostHog must land in the same rollout bucket and variant, so nothing here may change.

use sha1::digest::generic_array::GenericArray;
use sha1::{Digest, Sha1};

/// Divisor of the 60-bit hash prefix, so hashes fall in `[0, 1]`.
const HASH_SCALE: f64 = 0xFFF_FFFF_FFFF_FFFF_u64 as f64;

/// Capture truncates distinct ids to 200 characters; cutting here too makes a long id hash
/// the same whether it came from an event or straight from a /decide request.
const MAX_IDENTIFIER_CHARS: usize = 200;

/// Salt of the variant pick; the rollout hash uses none.
pub(super) const VARIANT_SALT: &str = "variant";

/// Prefix of the holdout hash, which deliberately has no flag key, dot or salt so one
/// holdout spans every flag that uses it.
const HOLDOUT_PREFIX: &str = "holdout-";

/// The hash of `"<flag_key>.<identifier><salt>"`; an empty identifier hashes to 0.0.
pub(super) fn flag_hash(flag_key: &str, identifier: &str, salt: &str) -> f64 {
    if identifier.is_empty() {
        return 0.0;
    }
    scaled(&[flag_key, ".", cut(identifier), salt])
}

/// The holdout hash of `"holdout-<identifier>"`; an empty identifier hashes to 0.0.
pub(super) fn holdout_hash(identifier: &str) -> f64 {
    if identifier.is_empty() {
        return 0.0;
    }
    scaled(&[HOLDOUT_PREFIX, cut(identifier)])
}

/// Whether a hash falls inside a rollout; `None` means 100 %, which needs no hash.
pub(super) fn in_rollout(percentage: Option<f64>, hash: impl FnOnce() -> f64) -> bool {
    match percentage {
        None => true,
        Some(p) if p >= 100.0 => true,
        Some(p) => hash() <= p / 100.0,
    }
}

/// The two hashes of a flag for one bucketing id, computed at most once each.
pub(super) struct FlagHashes<'a> {
    key: &'a str,
    id: &'a str,
    known: Computed,
}

/// The rollout and variant hashes computed so far for one flag and id.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Computed {
    rollout: Option<f64>,
    variant: Option<f64>,
}

impl<'a> FlagHashes<'a> {
    pub(super) fn new(key: &'a str, id: &'a str) -> Self {
        FlagHashes::resume(key, id, Computed::default())
    }

    /// The hashes of `key` and `id`, with those already computed for them.
    pub(super) fn resume(key: &'a str, id: &'a str, known: Computed) -> Self {
        FlagHashes { key, id, known }
    }

    /// What has been computed, to resume from later.
    pub(super) fn known(&self) -> Computed {
        self.known
    }

    pub(super) fn rollout(&mut self) -> f64 {
        *self
            .known
            .rollout
            .get_or_insert_with(|| flag_hash(self.key, self.id, ""))
    }

    pub(super) fn variant(&mut self) -> f64 {
        *self
            .known
            .variant
            .get_or_insert_with(|| flag_hash(self.key, self.id, VARIANT_SALT))
    }
}

/// SHA-1's initial state (FIPS 180-4, 5.3.1).
const SHA1_INITIAL_STATE: [u32; 5] = [
    0x6745_2301,
    0xEFCD_AB89,
    0x98BA_DCFE,
    0x1032_5476,
    0xC3D2_E1F0,
];

/// SHA-1's block size.
const SHA1_BLOCK_BYTES: usize = 64;

/// Longest message whose padding (a 0x80 byte and the 8-byte bit length) fits in the same
/// block. Bucketing inputs (`"<flag key>.<distinct id>variant"`) usually do.
const ONE_BLOCK_MAX_BYTES: usize = SHA1_BLOCK_BYTES - 9;

/// The first `MAX_IDENTIFIER_CHARS` Unicode scalar values of `s`.
fn cut(s: &str) -> &str {
    // Every scalar takes at least one byte: a short string needs no counting.
    if s.len() <= MAX_IDENTIFIER_CHARS {
        return s;
    }
    match s.char_indices().nth(MAX_IDENTIFIER_CHARS) {
        Some((end, _)) => &s[..end],
        None => s,
    }
}

/// The 60-bit prefix of the SHA-1 of the concatenated parts.
fn prefix60(parts: &[&str]) -> u64 {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len > ONE_BLOCK_MAX_BYTES {
        return prefix60_streamed(parts);
    }
    // The whole message, padded, is one block: compress it straight from the stack.
    let mut block = [0u8; SHA1_BLOCK_BYTES];
    let mut at = 0;
    for part in parts {
        block[at..at + part.len()].copy_from_slice(part.as_bytes());
        at += part.len();
    }
    block[at] = 0x80;
    let bits = (len as u64) * 8;
    block[SHA1_BLOCK_BYTES - 8..].copy_from_slice(&bits.to_be_bytes());
    let mut state = SHA1_INITIAL_STATE;
    sha1::compress(
        &mut state,
        std::slice::from_ref(GenericArray::from_slice(&block)),
    );
    ((u64::from(state[0]) << 32) | u64::from(state[1])) >> 4
}

/// [`prefix60`] of a message of any length, through the streaming hasher.
fn prefix60_streamed(parts: &[&str]) -> u64 {
    let mut hasher = Sha1::new();
    for part in parts {
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first) >> 4
}

fn scaled(parts: &[&str]) -> f64 {
    prefix60(parts) as f64 / HASH_SCALE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_beta_search() {
        assert_eq!(
            format!("{:015x}", prefix60(&["beta-search.user-17"])),
            "02547515f0f76d5"
        );
        let hash = flag_hash("beta-search", "user-17", "");
        assert_eq!(hash, 0.009101217133290002);
        assert!(in_rollout(Some(1.0), || hash));
        assert!(!in_rollout(Some(0.0), || hash));
    }

    #[test]
    fn worked_example_beta_search_rollout() {
        let hash = flag_hash("beta-search-rollout", "user-105", "");
        assert_eq!(hash, 0.2851295399293007);
        assert!(!in_rollout(Some(28.0), || hash));
        assert!(in_rollout(Some(29.0), || hash));
    }

    #[test]
    fn worked_example_holdout() {
        let hash = holdout_hash("user-31");
        assert_eq!(hash, 0.0194745413007599);
        assert!(in_rollout(Some(10.0), || hash));
        assert!(!in_rollout(Some(1.0), || hash));
    }

    #[test]
    fn variant_salt_changes_the_hash() {
        // sha1("beta-search.user-17variant")[..15] = 0x7881930b5af41ed, computed independently.
        assert_eq!(
            flag_hash("beta-search", "user-17", VARIANT_SALT),
            0x7881930b5af41ed_u64 as f64 / HASH_SCALE
        );
    }

    #[test]
    fn one_block_inputs_hash_as_the_streaming_hasher_does() {
        // Around every edge: empty, the last one-block length, and two blocks.
        let text: String = ('a'..='z').cycle().take(130).collect();
        for len in 0..=text.len() {
            let (a, b) = text[..len].split_at(len / 3);
            assert_eq!(
                prefix60(&[a, ".", b]),
                prefix60_streamed(&[a, ".", b]),
                "{len} bytes"
            );
        }
    }

    #[test]
    fn empty_identifier_hashes_to_zero() {
        assert_eq!(flag_hash("beta-search", "", ""), 0.0);
        assert_eq!(flag_hash("beta-search", "", VARIANT_SALT), 0.0);
        assert_eq!(holdout_hash(""), 0.0);
    }

    #[test]
    fn identifiers_are_cut_to_200_scalars() {
        let long = "é".repeat(250);
        let cut_id = "é".repeat(200);
        assert_eq!(flag_hash("f", &long, ""), flag_hash("f", &cut_id, ""));
        assert_ne!(
            flag_hash("f", &long, ""),
            flag_hash("f", &"é".repeat(199), "")
        );
        assert_eq!(holdout_hash(&long), holdout_hash(&cut_id));
    }

    #[test]
    fn rollout_boundaries() {
        assert!(in_rollout(None, unreachable_hash));
        assert!(in_rollout(Some(100.0), unreachable_hash));
        // `<=`: a hash exactly on the boundary is in.
        assert!(in_rollout(Some(50.0), || 0.5));
        assert!(!in_rollout(Some(50.0), || 0.500_000_000_000_1));
    }

    fn unreachable_hash() -> f64 {
        panic!("100 % must not hash")
    }
}
