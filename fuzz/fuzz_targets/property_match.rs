//! Structured: one flag with one property filter (any operator, arbitrary key and value)
//! evaluated against arbitrary properties.

#![no_main]

use arbitrary::Arbitrary;
use flagpost_fuzz::checks::{property_match, PropertyCase};
use serde_json::{Map, Value};

/// Every operator of the definition format, one no flag may use (`ends_with`, which a
/// file is refused for), and room for names that are none.
const OPERATORS: [&str; 29] = [
    "exact",
    "is_not",
    "icontains",
    "not_icontains",
    "icontains_multi",
    "not_icontains_multi",
    "ends_with",
    "not_in",
    "regex",
    "not_regex",
    "gt",
    "gte",
    "lt",
    "lte",
    "is_set",
    "is_not_set",
    "is_date_before",
    "is_date_after",
    "is_date_exact",
    "semver_eq",
    "semver_neq",
    "semver_gt",
    "semver_gte",
    "semver_lt",
    "semver_lte",
    "semver_tilde",
    "semver_caret",
    "semver_wildcard",
    "in",
];

#[derive(Debug, Arbitrary)]
enum Scalar {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// Strings that look like what the operators parse: versions, dates, numbers.
    Shaped(u8, u16, u16),
}

impl Scalar {
    fn json(self) -> Value {
        match self {
            Scalar::Null => Value::Null,
            Scalar::Bool(b) => Value::Bool(b),
            Scalar::Int(i) => i.into(),
            Scalar::Float(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
            Scalar::Str(s) => Value::String(s),
            Scalar::Shaped(kind, a, b) => Value::String(match kind % 6 {
                0 => format!("{}.{}.{}", a % 20, b % 20, a / 1000),
                1 => format!(
                    "-{}{}",
                    a % 400,
                    ["h", "d", "w", "m", "y"][usize::from(b % 5)]
                ),
                2 => format!("2024-{:02}-{:02}T{:02}:00:00Z", a % 13, b % 32, a % 25),
                3 => format!("{}.{}", a, b),
                4 => format!("{}*", a % 10),
                _ => format!("(a+)+${}", "a".repeat(usize::from(a % 40))),
            }),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Json {
    Scalar(Scalar),
    Array(Vec<Scalar>),
    Object(Vec<(String, Scalar)>),
}

impl Json {
    fn json(self) -> Value {
        match self {
            Json::Scalar(s) => s.json(),
            Json::Array(items) => Value::Array(items.into_iter().map(Scalar::json).collect()),
            Json::Object(entries) => {
                Value::Object(entries.into_iter().map(|(k, v)| (k, v.json())).collect())
            }
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    operator: u8,
    other_operator: String,
    key: String,
    value: Json,
    negation: bool,
    group: bool,
    /// The filter's own key gets this value, when present.
    own: Option<Json>,
    others: Vec<(String, Json)>,
}

libfuzzer_sys::fuzz_target!(|input: Input| {
    let operator = match OPERATORS.get(usize::from(input.operator % 32)) {
        Some(name) => (*name).to_owned(),
        None => input.other_operator,
    };
    let mut properties: Map<String, Value> = input
        .others
        .into_iter()
        .map(|(k, v)| (k, v.json()))
        .collect();
    if let Some(own) = input.own {
        properties.insert(input.key.clone(), own.json());
    }
    property_match(&PropertyCase {
        operator,
        key: input.key,
        value: input.value.json(),
        negation: input.negation,
        group: input.group,
        properties,
    });
});
