//! The `elements_chain` PostHog's ingestion builds from an `$elements` array, the form
//! older clients and some SDKs send autocapture's elements in (posthog-js sends the
//! chain itself as `$elements_chain` when told `elementsChainAsString`). Each element
//! becomes `tag.class.class:key="value"key="value"`, elements joined by `;`: classes
//! sorted, quotes dropped from classes and escaped as `\"` in keys and values, keys in
//! the order of JavaScript's `localeCompare`. Values are turned into text the way
//! JavaScript's `String()` does, and input that makes PostHog's code throw (a null
//! element, a null `attr__` value, a number where text or classes belong) gives an
//! empty chain, as PostHog's does. The chain stops before the element that would take
//! it past [`MAX_CHAIN_BYTES`], so work and output stay bounded whatever is sent.

use serde_json::{Map, Number, Value};

/// `$el_text` is cut to this many UTF-16 code units (PostHog's `slice(0, 400)`).
const TEXT_UNITS: usize = 400;
/// `attr__href` is cut to this many UTF-16 code units for the `href` key; the
/// `attr__href` key itself keeps it whole, as in PostHog.
const HREF_UNITS: usize = 2048;
/// A chain never grows past this; real ones are a few kilobytes. PostHog has no such
/// limit, but its capture refuses events anywhere near this size.
pub const MAX_CHAIN_BYTES: usize = 1 << 20;
/// Arrays nested deeper than this turn into no text. Unreachable: stored properties
/// were parsed with serde_json's limit of 128.
const MAX_DEPTH: usize = 256;

/// The chain for the value of `$elements`: empty unless it is an array of elements
/// PostHog's ingestion would have turned into a chain.
pub fn chain(elements: &Value) -> String {
    let Value::Array(list) = elements else {
        return String::new();
    };
    let mut out = String::new();
    let mut one = String::new();
    for el in list {
        one.clear();
        match element(el, &mut one) {
            Ok(()) => {}
            Err(Skip::Throws) => return String::new(),
            Err(Skip::TooLong) => break,
        }
        let sep = usize::from(!out.is_empty());
        if out.len() + sep + one.len() > MAX_CHAIN_BYTES {
            break;
        }
        if sep == 1 {
            out.push(';');
        }
        out.push_str(&one);
    }
    out
}

/// Why an element is not in the chain.
enum Skip {
    /// PostHog's code would throw: there is no chain at all.
    Throws,
    /// The element alone would take the chain past [`MAX_CHAIN_BYTES`].
    TooLong,
}

/// Append one element.
fn element(el: &Value, out: &mut String) -> Result<(), Skip> {
    let map = match el {
        Value::Null => return Err(Skip::Throws),
        Value::Object(map) => map,
        // Property reads of a number, string, boolean or array find nothing.
        _ => {
            out.push_str(":nth-child=\"0\"nth-of-type=\"0\"");
            return Ok(());
        }
    };
    let text = |v: &Value| text_of(v).ok_or(Skip::Throws);
    if let Some(tag) = map.get("tag_name").filter(|v| truthy(v)) {
        out.push_str(&text(tag)?);
    }
    classes(map, out)?;
    let mut attributes: Vec<(&str, String)> = Vec::new();
    if let Some(cut) = cut(map.get("$el_text"), TEXT_UNITS).ok_or(Skip::Throws)? {
        attributes.push(("text", cut));
    }
    for (key, field) in [("nth-child", "nth_child"), ("nth-of-type", "nth_of_type")] {
        let value = match map.get(field) {
            None | Some(Value::Null) => "0".to_string(),
            Some(v) => text(v)?,
        };
        attributes.push((key, value));
    }
    if let Some(href) = cut(map.get("attr__href"), HREF_UNITS).ok_or(Skip::Throws)? {
        attributes.push(("href", href));
    }
    if let Some(id) = map.get("attr__id").filter(|v| truthy(v)) {
        attributes.push(("attr_id", text(id)?));
    }
    for (key, value) in map.iter().filter(|(k, _)| k.starts_with("attr__")) {
        attributes.push((key, text(value)?));
    }
    // Stable, as JavaScript's sort: keys that collate equal keep the object's order.
    attributes.sort_by_cached_key(|(key, _)| collation_key(key));
    out.push(':');
    for (key, value) in attributes {
        escape_quotes(key, out);
        out.push_str("=\"");
        escape_quotes(&value, out);
        out.push('"');
    }
    Ok(())
}

/// `.class` for each class of `attr__class` (a list, or text split on single spaces),
/// in UTF-16 order (JavaScript's default sort), without quotes.
fn classes(map: &Map<String, Value>, out: &mut String) -> Result<(), Skip> {
    let mut list: Vec<&str> = match map.get("attr__class") {
        None => return Ok(()),
        Some(v) if !truthy(v) => return Ok(()),
        // Each class is at least its dot: too many cannot fit, and are not listed.
        Some(Value::String(s))
            if memchr::memchr_iter(b' ', s.as_bytes()).count() >= MAX_CHAIN_BYTES =>
        {
            return Err(Skip::TooLong)
        }
        Some(Value::String(s)) => s.split(' ').collect(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str())
            .collect::<Option<Vec<&str>>>()
            .ok_or(Skip::Throws)?,
        Some(_) => return Err(Skip::Throws),
    };
    list.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
    for class in list {
        out.push('.');
        out.extend(class.chars().filter(|&c| c != '"'));
    }
    Ok(())
}

/// `value?.slice(0, units)` as text when truthy, Some(None) where absent or falsy,
/// None where it throws: a string is cut in UTF-16 code units, an array in entries,
/// and other values have no `slice`.
fn cut(value: Option<&Value>, units: usize) -> Option<Option<String>> {
    match value {
        None | Some(Value::Null) => Some(None),
        Some(Value::String(s)) if s.is_empty() => Some(None),
        Some(Value::String(s)) => Some(Some(utf16_prefix(s, units))),
        Some(Value::Array(items)) => {
            let mut text = String::new();
            join(&items[..items.len().min(units)], &mut text, 0);
            Some(Some(text))
        }
        Some(_) => None,
    }
}

/// The first `units` UTF-16 code units of `s`. Where the cut splits a surrogate pair,
/// JavaScript keeps a lone surrogate, which cannot be UTF-8: U+FFFD stands for it.
fn utf16_prefix(s: &str, units: usize) -> String {
    let mut used = 0;
    for (i, c) in s.char_indices() {
        let n = c.len_utf16();
        if used + n > units {
            let mut prefix = s[..i].to_string();
            if used < units {
                prefix.push('\u{FFFD}');
            }
            return prefix;
        }
        used += n;
    }
    s.to_string()
}

/// JavaScript's truthiness.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// `value.toString()`; None for null, which throws.
fn text_of(v: &Value) -> Option<String> {
    let mut out = String::new();
    match v {
        Value::Null => return None,
        Value::Array(items) => join(items, &mut out, 0),
        other => element_text(other, &mut out, 0),
    }
    Some(out)
}

/// `Array.prototype.join(",")`: null entries are empty, arrays joined in turn.
fn join(items: &[Value], out: &mut String, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    for (i, v) in items.iter().enumerate() {
        // Past the cap the element is left out of the chain whole, so its text need
        // not grow further (each `{}` would add 15 bytes of "[object Object]").
        if out.len() > MAX_CHAIN_BYTES {
            return;
        }
        if i > 0 {
            out.push(',');
        }
        element_text(v, out, depth + 1);
    }
}

fn element_text(v: &Value, out: &mut String, depth: usize) {
    match v {
        Value::Null => {}
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&js_number(n)),
        Value::String(s) => out.push_str(s),
        Value::Array(items) => join(items, out, depth),
        Value::Object(_) => out.push_str("[object Object]"),
    }
}

/// A JSON number as JavaScript prints it (`Number.prototype.toString()`): a double,
/// shortest round-trip digits, exponent form from 1e21 and below 1e-6.
pub fn js_number(n: &Number) -> String {
    const EXACT: u64 = 1 << 53;
    if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() <= EXACT) {
        return i.to_string();
    }
    let Some(x) = n.as_f64().filter(|x| x.is_finite()) else {
        return "NaN".to_string();
    };
    if x == 0.0 {
        return "0".to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "1.2345e-7".
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let k = digits.len() as i64;
    let n = exp.parse::<i64>().unwrap_or(0) + 1;
    let mut out = String::from(if x < 0.0 { "-" } else { "" });
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = n - 1;
        out.push_str(&format!("e{}{}", if e < 0 { '-' } else { '+' }, e.abs()));
    }
    out
}

fn escape_quotes(s: &str, out: &mut String) {
    for part in s.split_inclusive('"') {
        match part.strip_suffix('"') {
            Some(head) => {
                out.push_str(head);
                out.push_str("\\\"");
            }
            None => out.push_str(part),
        }
    }
}

/// ASCII in the order of the Unicode root collation (ICU, which `localeCompare`
/// uses): whitespace, punctuation and symbols, digits, then letters, a letter's
/// lowercase and uppercase forms equal but for case. Other controls are ignored.
const ASCII_ORDER: &[u8] = b"\t\n\x0b\x0c\r _-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$0123456789\
    aAbBcCdDeEfFgGhHiIjJkKlLmMnNoOpPqQrRsStTuUvVwWxXyYzZ";

/// Each ASCII character's primary weight (0: ignored) and whether it is uppercase.
const WEIGHTS: [(u16, bool); 128] = {
    let mut table = [(0u16, false); 128];
    let mut i = 0;
    let mut weight = 0;
    while i < ASCII_ORDER.len() {
        let c = ASCII_ORDER[i];
        let upper = c.is_ascii_uppercase();
        if !upper {
            weight += 1;
        }
        table[c as usize] = (weight, upper);
        i += 1;
    }
    table
};

/// A character's primary weight and case: exact for ASCII; anything else sorts after
/// the ASCII letters by code point (ICU would interleave accented letters with theirs).
fn weight(c: char) -> (u32, bool) {
    match WEIGHTS.get(c as usize) {
        Some(&(w, upper)) => (u32::from(w), upper),
        None => (1000 + c as u32, false),
    }
}

/// What `a.localeCompare(b)` of PostHog's attribute sort compares, for ASCII keys:
/// the primary weights first, then case (lowercase first).
fn collation_key(s: &str) -> (Vec<u32>, Vec<bool>) {
    s.chars().map(weight).filter(|&(w, _)| w != 0).unzip()
}

#[cfg(test)]
#[path = "tests/elements.rs"]
mod tests;
