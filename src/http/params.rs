//! A request's query string, read once into its name/value pairs: where the read API,
//! the management API and the console take their parameters from. An empty value
//! counts as absent. Each endpoint adds the readers of its own parameters beside its
//! handler (`impl Params` blocks there); what they share is here.

use super::error::ApiError;

pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn parse(query: Option<&str>) -> Params {
        Params(
            form_urlencoded::parse(query.unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The first non-empty value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, v)| k == key && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }

    /// Every non-empty value of `key`, in order (`?event=a&event=b`).
    pub fn all(&self, key: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, v)| k == key && !v.is_empty())
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// A whole number; `default` when absent.
    pub fn number(&self, key: &'static str, default: usize) -> Result<usize, ApiError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| ApiError::BadQuery(format!("{key} must be a whole number"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_values_are_absent_and_repeats_kept() {
        let p = Params::parse(Some("a=&a=1&e=x&e=&e=y&n=12&bad=1.5"));
        assert_eq!(p.get("a"), Some("1"));
        assert_eq!(p.all("e"), ["x", "y"]);
        assert_eq!(p.number("n", 3).ok(), Some(12));
        assert_eq!(p.number("missing", 3).ok(), Some(3));
        assert!(matches!(p.number("bad", 0), Err(ApiError::BadQuery(_))));
    }
}
