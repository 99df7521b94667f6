//! Semantic-version comparisons for the `semver_*` operators. Versions are read leniently,
//! as app versions are written by hand: a leading `v`, a pre-release (`-beta.1`) or build
//! (`+sha`) suffix is dropped and missing parts are 0, so `v1.2-rc1` reads as `1.2.0`.

use serde_json::Value;

/// `major.minor.patch`, ordered numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Version(u64, u64, u64);

/// Version parts a value may have; more reads as "not a version".
const MAX_PARTS: usize = 3;

impl Version {
    pub(super) fn parse(value: &Value) -> Option<Version> {
        let text = match value {
            Value::String(s) => s.trim(),
            // `2` or `1.5` stored as numbers are still versions.
            Value::Number(n) => return Version::parse(&Value::String(n.to_string())),
            _ => return None,
        };
        let [major, minor, patch] = version_parts(unprefixed(text))?;
        Some(Version(major, minor, patch))
    }
}

/// The text without range sigils and a leading `v`.
fn unprefixed(text: &str) -> &str {
    let text = text.trim_start_matches(['~', '^', '=', ' ']);
    text.strip_prefix(['v', 'V']).unwrap_or(text)
}

/// The text without range sigils, a leading `v`, and any pre-release or build suffix.
fn core(text: &str) -> &str {
    let text = unprefixed(text);
    let end = text.find(['-', '+']).unwrap_or(text.len());
    &text[..end]
}

/// `numeric_parts` of the text up to its first `-` or `+`, in one pass over the bytes:
/// a request parses its version once for every semver filter it meets.
fn version_parts(text: &str) -> Option<[u64; MAX_PARTS]> {
    let mut parts = [0u64; MAX_PARTS];
    let mut part = 0;
    let mut digits = false;
    for &byte in text.as_bytes() {
        match byte {
            b'0'..=b'9' => {
                let n = parts.get_mut(part)?;
                *n = n.checked_mul(10)?.checked_add(u64::from(byte - b'0'))?;
                digits = true;
            }
            // An empty part, or a part past the last, is not a version.
            b'.' if !digits || part + 1 >= MAX_PARTS => return None,
            b'.' => {
                part += 1;
                digits = false;
            }
            b'-' | b'+' => break,
            _ => return None,
        }
    }
    digits.then_some(parts)
}

/// Up to `MAX_PARTS` dot-separated decimal numbers, missing ones 0; `None` when there are
/// more parts or one is not a plain number.
fn numeric_parts(core: &str) -> Option<[u64; MAX_PARTS]> {
    let mut parts = [0; MAX_PARTS];
    for (i, part) in core.split('.').enumerate() {
        if i >= MAX_PARTS || part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        parts[i] = part.parse().ok()?;
    }
    Some(parts)
}

/// A compiled `semver_*` filter. A filter value that is not a version never matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SemverTest {
    Eq(Version),
    Neq(Version),
    Gt(Version),
    Gte(Version),
    Lt(Version),
    Lte(Version),
    /// `[low, high)`, from `semver_tilde` and `semver_caret`.
    Range(Version, Version),
    /// The leading parts that must be equal, from `semver_wildcard` (`1.2.*`).
    Prefix(Vec<u64>),
    Invalid,
}

impl SemverTest {
    /// `operator` is one of the `semver_*` names without the prefix.
    pub(super) fn compile(operator: &str, value: &Value) -> Option<SemverTest> {
        const KNOWN: [&str; 8] = ["eq", "neq", "gt", "gte", "lt", "lte", "tilde", "caret"];
        if operator == "wildcard" {
            return Some(wildcard(value).map_or(SemverTest::Invalid, SemverTest::Prefix));
        }
        if !KNOWN.contains(&operator) {
            return None;
        }
        let Some(v) = Version::parse(value) else {
            return Some(SemverTest::Invalid);
        };
        let Version(major, minor, patch) = v;
        Some(match operator {
            "eq" => SemverTest::Eq(v),
            "neq" => SemverTest::Neq(v),
            "gt" => SemverTest::Gt(v),
            "gte" => SemverTest::Gte(v),
            "lt" => SemverTest::Lt(v),
            "lte" => SemverTest::Lte(v),
            "tilde" => SemverTest::Range(v, Version(major, minor.saturating_add(1), 0)),
            "caret" => {
                let high = if major > 0 {
                    Version(major.saturating_add(1), 0, 0)
                } else if minor > 0 {
                    Version(0, minor.saturating_add(1), 0)
                } else {
                    Version(0, 0, patch.saturating_add(1))
                };
                SemverTest::Range(v, high)
            }
            _ => SemverTest::Invalid,
        })
    }

    pub(super) fn matches(&self, actual: &Value) -> bool {
        let Some(v) = Version::parse(actual) else {
            return false;
        };
        match self {
            SemverTest::Eq(want) => v == *want,
            SemverTest::Neq(want) => v != *want,
            SemverTest::Gt(want) => v > *want,
            SemverTest::Gte(want) => v >= *want,
            SemverTest::Lt(want) => v < *want,
            SemverTest::Lte(want) => v <= *want,
            SemverTest::Range(low, high) => v >= *low && v < *high,
            SemverTest::Prefix(prefix) => {
                let parts = [v.0, v.1, v.2];
                prefix.iter().zip(parts).all(|(want, got)| *want == got)
            }
            SemverTest::Invalid => false,
        }
    }
}

/// `1.2.*`, `1.x`, `*` or a plain `1.2`: the numeric parts before the first wildcard.
fn wildcard(value: &Value) -> Option<Vec<u64>> {
    let Value::String(text) = value else {
        return None;
    };
    let core = core(text.trim());
    let mut prefix = Vec::new();
    let mut wild = false;
    for part in core.split('.') {
        if matches!(part, "*" | "x" | "X") {
            wild = true;
        } else if wild {
            return None;
        } else {
            prefix.push(numeric_parts(part)?[0]);
        }
    }
    (prefix.len() <= MAX_PARTS).then_some(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(op: &str, filter: &str, actual: Value) -> bool {
        SemverTest::compile(op, &json!(filter))
            .unwrap()
            .matches(&actual)
    }

    #[test]
    fn parsing_is_lenient() {
        assert_eq!(Version::parse(&json!("v1.2.3")), Some(Version(1, 2, 3)));
        assert_eq!(Version::parse(&json!("1.2")), Some(Version(1, 2, 0)));
        assert_eq!(Version::parse(&json!("2")), Some(Version(2, 0, 0)));
        assert_eq!(Version::parse(&json!(2)), Some(Version(2, 0, 0)));
        assert_eq!(Version::parse(&json!(1.5)), Some(Version(1, 5, 0)));
        assert_eq!(
            Version::parse(&json!("1.2.3-beta.1")),
            Some(Version(1, 2, 3))
        );
        assert_eq!(
            Version::parse(&json!("1.2.3+build.7")),
            Some(Version(1, 2, 3))
        );
        for bad in [
            json!("1.2.3.4"),
            json!("one"),
            json!(""),
            json!("1..2"),
            json!(true),
        ] {
            assert_eq!(Version::parse(&bad), None, "{bad}");
        }
    }

    #[test]
    fn the_one_pass_parse_agrees_with_splitting() {
        // Every string of up to four characters over the characters that matter, then
        // longer ones from a fixed pseudo-random sequence, and numbers around u64::MAX.
        let alphabet: Vec<char> = "0129.-+vV~^= xé".chars().collect();
        let mut texts: Vec<String> = vec![String::new()];
        let mut last = vec![String::new()];
        for _ in 0..4 {
            last = last
                .iter()
                .flat_map(|t| alphabet.iter().map(move |c| format!("{t}{c}")))
                .collect();
            texts.extend(last.iter().cloned());
        }
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..100_000 {
            let len = (seed % 12) as usize;
            let text: String = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    alphabet[(seed % alphabet.len() as u64) as usize]
                })
                .collect();
            texts.push(text);
        }
        for big in [
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999",
        ] {
            texts.push(big.to_owned());
            texts.push(format!("1.{big}"));
            texts.push(format!("v1.2.{big}-rc"));
        }
        for text in &texts {
            assert_eq!(
                version_parts(unprefixed(text)),
                numeric_parts(core(text)),
                "{text:?}"
            );
        }
    }

    #[test]
    fn comparisons() {
        assert!(check("eq", "1.2.3", json!("v1.2.3-rc.1")));
        assert!(check("eq", "1.2", json!("1.2.0")));
        assert!(!check("eq", "1.2.3", json!("1.2.4")));
        assert!(check("neq", "1.2.3", json!("1.2.4")));
        assert!(!check("neq", "1.2.3", json!("not a version")));
        assert!(check("gt", "1.2.3", json!("1.10.0")));
        assert!(!check("gt", "1.2.3", json!("1.2.3")));
        assert!(check("gte", "1.2.3", json!("1.2.3")));
        assert!(check("lt", "1.2.3", json!("1.2.2")));
        assert!(!check("lt", "1.2.3", json!("1.2.3")));
        assert!(check("lte", "1.2.3", json!("1.2.3")));
        assert!(!check("gt", "banana", json!("1.0.0")));
    }

    #[test]
    fn tilde_and_caret_ranges() {
        assert!(check("tilde", "1.2.3", json!("1.2.9")));
        assert!(!check("tilde", "1.2.3", json!("1.3.0")));
        assert!(!check("tilde", "1.2.3", json!("1.2.2")));
        assert!(check("caret", "1.2.3", json!("1.9.0")));
        assert!(!check("caret", "1.2.3", json!("2.0.0")));
        assert!(check("caret", "0.2.3", json!("0.2.9")));
        assert!(!check("caret", "0.2.3", json!("0.3.0")));
        assert!(check("caret", "0.0.3", json!("0.0.3")));
        assert!(!check("caret", "0.0.3", json!("0.0.4")));
    }

    #[test]
    fn wildcards() {
        assert!(check("wildcard", "1.2.*", json!("1.2.7")));
        assert!(!check("wildcard", "1.2.*", json!("1.3.0")));
        assert!(check("wildcard", "1.*", json!("1.9.9")));
        assert!(check("wildcard", "1.x", json!("v1.0.0-beta")));
        assert!(check("wildcard", "*", json!("7.0.0")));
        assert!(!check("wildcard", "*", json!("seven")));
        assert!(!check("wildcard", "1.*.3", json!("1.2.3")));
    }

    #[test]
    fn unknown_semver_operator_is_rejected() {
        assert_eq!(SemverTest::compile("approx", &json!("1.0.0")), None);
        assert_eq!(SemverTest::compile("approx", &json!("banana")), None);
        assert_eq!(
            SemverTest::compile("gt", &json!("banana")),
            Some(SemverTest::Invalid)
        );
    }
}
