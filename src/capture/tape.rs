//! A read-only view of a simd-json tape: the parsed body as one flat vector of nodes,
//! where a container is followed by everything nested in it. Ingestion reads a few
//! top-level fields of each event and writes the event back out whole, so it never
//! needs a tree of owned values. Lookups follow `serde_json::Map`'s rules, which the
//! event model was written against: when a key repeats, the last value wins.

use simd_json::{Node, StaticNode};

/// One JSON value: its node and the nodes nested in it.
#[derive(Debug, Clone, Copy)]
pub struct Value<'t, 'a>(&'t [Node<'a>]);

/// An object: its own node, then key, value, key, value...
#[derive(Debug, Clone, Copy)]
pub struct Object<'t, 'a> {
    len: usize,
    nodes: &'t [Node<'a>],
}

/// An array's elements, after the array's own node.
#[derive(Debug, Clone, Copy)]
pub struct Array<'t, 'a> {
    len: usize,
    elements: &'t [Node<'a>],
}

/// How many nodes the value starting with `node` takes.
fn span(node: &Node<'_>) -> usize {
    match node {
        Node::Object { count, .. } | Node::Array { count, .. } => 1 + count,
        _ => 1,
    }
}

/// Split the value at the start of `nodes` from the nodes after it. `None` on an empty
/// or inconsistent slice (a tape from simd-json is neither).
fn split<'t, 'a>(nodes: &'t [Node<'a>]) -> Option<(Value<'t, 'a>, &'t [Node<'a>])> {
    let n = span(nodes.first()?);
    (n <= nodes.len()).then(|| {
        let (head, tail) = nodes.split_at(n);
        (Value(head), tail)
    })
}

impl<'t, 'a> Value<'t, 'a> {
    /// The root value of a tape.
    pub fn root(tape: &'t [Node<'a>]) -> Option<Value<'t, 'a>> {
        split(tape).map(|(v, _)| v)
    }

    pub fn node(&self) -> &'t Node<'a> {
        &self.0[0]
    }

    /// Null, as `serde_json::Value` sees it: a float that is not finite becomes null
    /// there too.
    pub fn is_null(&self) -> bool {
        match self.node() {
            Node::Static(StaticNode::Null) => true,
            Node::Static(StaticNode::F64(f)) => !f.is_finite(),
            _ => false,
        }
    }

    pub fn as_str(&self) -> Option<&'a str> {
        match self.node() {
            Node::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self.node() {
            Node::Static(StaticNode::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    /// A number as f64, like `serde_json::Value::as_f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match self.node() {
            Node::Static(StaticNode::I64(n)) => Some(*n as f64),
            Node::Static(StaticNode::U64(n)) => Some(*n as f64),
            Node::Static(StaticNode::F64(f)) if f.is_finite() => Some(*f),
            _ => None,
        }
    }

    /// A number in `serde_json::Number`'s decimal form; `None` for anything else.
    pub fn number_string(&self) -> Option<String> {
        match self.node() {
            Node::Static(StaticNode::I64(n)) => Some(n.to_string()),
            Node::Static(StaticNode::U64(n)) => Some(n.to_string()),
            Node::Static(StaticNode::F64(f)) => {
                serde_json::Number::from_f64(*f).map(|n| n.to_string())
            }
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<Object<'t, 'a>> {
        match self.node() {
            Node::Object { len, .. } => Some(Object {
                len: *len,
                nodes: self.0,
            }),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<Array<'t, 'a>> {
        match self.node() {
            Node::Array { len, .. } => Some(Array {
                len: *len,
                elements: &self.0[1..],
            }),
            _ => None,
        }
    }

    /// `self[name]` of an object, like `serde_json::Value::get`: `None` when this is
    /// not an object.
    pub fn get(&self, name: &str) -> Option<Value<'t, 'a>> {
        self.as_object().and_then(|o| o.get(name))
    }
}

impl<'t, 'a> Object<'t, 'a> {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> Entries<'t, 'a> {
        Entries {
            left: self.len,
            rest: &self.nodes[1..],
        }
    }

    /// The value of `name`, the last one if the key repeats.
    pub fn get(&self, name: &str) -> Option<Value<'t, 'a>> {
        self.iter()
            .filter(|(k, _)| *k == name)
            .last()
            .map(|(_, v)| v)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.iter().any(|(k, _)| k == name)
    }
}

impl<'t, 'a> From<Object<'t, 'a>> for Value<'t, 'a> {
    fn from(o: Object<'t, 'a>) -> Self {
        Value(o.nodes)
    }
}

/// The entries of an [`Object`], in the order they were sent.
pub struct Entries<'t, 'a> {
    left: usize,
    rest: &'t [Node<'a>],
}

impl<'t, 'a> Iterator for Entries<'t, 'a> {
    type Item = (&'a str, Value<'t, 'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (key, rest) = self.rest.split_first()?;
        let key = match key {
            Node::String(s) => *s,
            _ => return None,
        };
        let (value, rest) = split(rest)?;
        self.rest = rest;
        Some((key, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

impl<'t, 'a> Array<'t, 'a> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn iter(&self) -> Elements<'t, 'a> {
        Elements {
            left: self.len,
            rest: self.elements,
        }
    }
}

/// The elements of an [`Array`].
pub struct Elements<'t, 'a> {
    left: usize,
    rest: &'t [Node<'a>],
}

impl<'t, 'a> Iterator for Elements<'t, 'a> {
    type Item = Value<'t, 'a>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (value, rest) = split(self.rest)?;
        self.rest = rest;
        Some(value)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

/// The value as a `serde_json::Value`, built exactly as deserialising the same JSON
/// with serde would: a repeated key keeps its first position and its last value, a
/// float that is not finite becomes null.
pub fn to_serde(v: Value<'_, '_>) -> serde_json::Value {
    use serde_json::Value as J;
    match v.node() {
        Node::String(s) => J::String((*s).to_owned()),
        Node::Static(StaticNode::Null) => J::Null,
        Node::Static(StaticNode::Bool(b)) => J::Bool(*b),
        Node::Static(StaticNode::I64(n)) => J::from(*n),
        Node::Static(StaticNode::U64(n)) => J::from(*n),
        Node::Static(StaticNode::F64(f)) => {
            serde_json::Number::from_f64(*f).map_or(J::Null, J::Number)
        }
        Node::Array { .. } => J::Array(
            v.as_array()
                .map(|a| a.iter().map(to_serde).collect())
                .unwrap_or_default(),
        ),
        Node::Object { .. } => {
            let mut map = serde_json::Map::new();
            for (k, v) in v.as_object().iter().flat_map(Object::iter) {
                map.insert(k.to_owned(), to_serde(v));
            }
            J::Object(map)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_tape<R>(json: &str, f: impl FnOnce(Value<'_, '_>) -> R) -> R {
        let mut bytes = json.as_bytes().to_vec();
        let tape = simd_json::to_tape(&mut bytes).unwrap();
        f(Value::root(&tape.0).unwrap())
    }

    #[test]
    fn lookups_follow_serde_json() {
        with_tape(
            r#"{"a":{"x":[1,{"y":2}],"z":3},"b":"s","a":{"last":true},"n":null}"#,
            |v| {
                let o = v.as_object().unwrap();
                let keys: Vec<&str> = o.iter().map(|(k, _)| k).collect();
                assert_eq!(keys, ["a", "b", "a", "n"]);
                // The last of a repeated key.
                assert_eq!(
                    v.get("a").unwrap().get("last").unwrap().as_bool(),
                    Some(true)
                );
                assert_eq!(v.get("b").unwrap().as_str(), Some("s"));
                assert!(v.get("n").unwrap().is_null());
                assert!(v.get("missing").is_none());
                assert!(v.get("b").unwrap().get("x").is_none());
                assert_eq!(
                    to_serde(v),
                    serde_json::json!({"a":{"last":true},"b":"s","n":null})
                );
            },
        );
        with_tape(r#"[1,-2,2.5,18446744073709551615,[],{}]"#, |v| {
            let a = v.as_array().unwrap();
            let nums: Vec<Option<String>> = a.iter().map(|e| e.number_string()).collect();
            assert_eq!(
                nums,
                [
                    Some("1".into()),
                    Some("-2".into()),
                    Some("2.5".into()),
                    Some("18446744073709551615".into()),
                    None,
                    None
                ]
            );
            assert_eq!(a.iter().count(), 6);
        });
    }
}
