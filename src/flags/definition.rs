//! Typed, path-aware reading of the definition JSON. Every accessor returns an error that
//! names the field it was reading, so compile errors can say exactly which field of which
//! flag is wrong. The path is a chain of borrowed segments on the stack and is only turned
//! into a string when an error is actually built.

use serde_json::Value;

use super::error::{CompileError, ErrorKind};

/// Stands in for absent fields, so "missing" and "null" read the same way.
static NULL: Value = Value::Null;

#[derive(Clone, Copy)]
enum Segment<'a> {
    Root,
    Key(&'a str),
    Index(usize),
}

/// A JSON value together with the path that led to it.
#[derive(Clone, Copy)]
pub(super) struct Node<'a> {
    value: &'a Value,
    segment: Segment<'a>,
    parent: Option<&'a Node<'a>>,
}

impl<'a> Node<'a> {
    pub(super) fn root(value: &'a Value) -> Self {
        Node {
            value,
            segment: Segment::Root,
            parent: None,
        }
    }

    pub(super) fn value(&self) -> &'a Value {
        self.value
    }

    pub(super) fn is_null(&self) -> bool {
        self.value.is_null()
    }

    /// The member `name` of an object; absent members (or a non-object) read as null.
    pub(super) fn get<'b>(&'b self, name: &'b str) -> Node<'b> {
        Node {
            value: self.value.get(name).unwrap_or(&NULL),
            segment: Segment::Key(name),
            parent: Some(self),
        }
    }

    /// The elements of an array; null reads as an empty array.
    pub(super) fn items<'b>(&'b self) -> Result<Vec<Node<'b>>, CompileError> {
        match self.value {
            Value::Null => Ok(Vec::new()),
            Value::Array(items) => Ok(items
                .iter()
                .enumerate()
                .map(|(i, value)| Node {
                    value,
                    segment: Segment::Index(i),
                    parent: Some(self),
                })
                .collect()),
            _ => Err(self.wrong_type("an array")),
        }
    }

    /// The members of an object, in file order; null reads as an empty object.
    pub(super) fn entries<'b>(&'b self) -> Result<Vec<(&'b str, Node<'b>)>, CompileError> {
        match self.value {
            Value::Null => Ok(Vec::new()),
            Value::Object(map) => Ok(map
                .iter()
                .map(|(name, value)| {
                    let node = Node {
                        value,
                        segment: Segment::Key(name),
                        parent: Some(self),
                    };
                    (name.as_str(), node)
                })
                .collect()),
            _ => Err(self.wrong_type("an object")),
        }
    }

    pub(super) fn str(&self) -> Result<&'a str, CompileError> {
        match self.value {
            Value::String(s) => Ok(s),
            Value::Null => Err(self.error(ErrorKind::Missing)),
            _ => Err(self.wrong_type("a string")),
        }
    }

    pub(super) fn opt_str(&self) -> Result<Option<&'a str>, CompileError> {
        match self.value {
            Value::Null => Ok(None),
            _ => self.str().map(Some),
        }
    }

    pub(super) fn i64(&self) -> Result<i64, CompileError> {
        match self.value {
            Value::Null => Err(self.error(ErrorKind::Missing)),
            value => value.as_i64().ok_or_else(|| self.wrong_type("an integer")),
        }
    }

    pub(super) fn opt_i64(&self) -> Result<Option<i64>, CompileError> {
        match self.value {
            Value::Null => Ok(None),
            _ => self.i64().map(Some),
        }
    }

    /// A percentage or other number; null is `None`.
    pub(super) fn opt_f64(&self) -> Result<Option<f64>, CompileError> {
        match self.value {
            Value::Null => Ok(None),
            Value::Number(n) => n
                .as_f64()
                .filter(|f| f.is_finite())
                .map(Some)
                .ok_or_else(|| self.wrong_type("a finite number")),
            _ => Err(self.wrong_type("a number")),
        }
    }

    pub(super) fn bool_or(&self, default: bool) -> Result<bool, CompileError> {
        match self.value {
            Value::Null => Ok(default),
            Value::Bool(b) => Ok(*b),
            _ => Err(self.wrong_type("a boolean")),
        }
    }

    pub(super) fn wrong_type(&self, expected: &'static str) -> CompileError {
        self.error(ErrorKind::WrongType { expected })
    }

    pub(super) fn invalid(&self, message: impl Into<String>) -> CompileError {
        self.error(ErrorKind::InvalidValue(message.into()))
    }

    pub(super) fn error(&self, kind: ErrorKind) -> CompileError {
        CompileError::new(self.path(), kind)
    }

    /// Renders the path from the nearest root, e.g. `filters.groups[1].properties[0]`.
    pub(super) fn path(&self) -> String {
        let mut segments = Vec::new();
        let mut node = Some(self);
        while let Some(current) = node {
            segments.push(current.segment);
            node = current.parent;
        }
        let mut out = String::new();
        for segment in segments.iter().rev() {
            match segment {
                Segment::Root => {}
                Segment::Key(name) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(name);
                }
                Segment::Index(i) => {
                    out.push('[');
                    out.push_str(&i.to_string());
                    out.push(']');
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_render_keys_and_indexes() {
        let doc = json!({"filters": {"groups": [{}, {"properties": [{"operator": 3}]}]}});
        let root = Node::root(&doc);
        let filters = root.get("filters");
        let groups = filters.get("groups");
        let groups = groups.items().unwrap();
        let props = groups[1].get("properties");
        let props = props.items().unwrap();
        let op = props[0].get("operator");
        assert_eq!(op.path(), "filters.groups[1].properties[0].operator");
        let err = op.str().unwrap_err();
        assert_eq!(
            err.to_string(),
            "filters.groups[1].properties[0].operator: expected a string"
        );
    }

    #[test]
    fn absent_and_null_read_as_defaults() {
        let doc = json!({"a": null});
        let root = Node::root(&doc);
        assert!(root.get("a").items().unwrap().is_empty());
        assert!(root.get("b").entries().unwrap().is_empty());
        assert_eq!(root.get("b").opt_f64().unwrap(), None);
        assert!(root.get("b").bool_or(true).unwrap());
        assert_eq!(root.get("b").str().unwrap_err().kind(), &ErrorKind::Missing);
    }
}
