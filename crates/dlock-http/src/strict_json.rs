//! The one JSON parser for request bodies: [`parse_body`].
//!
//! Invariants (each is a `400 VALIDATION_FAILED` at the boundary, before any handler, store
//! or idempotency fingerprint sees the body):
//! - The document is a JSON **object** (C3-extensions.md E-1): `[1,2]`, `"x"`, `3`, `null`
//!   are refused.
//! - No object, at any nesting depth, names a key twice. serde_json's own `Value` keeps the
//!   last of two `amountMinor`s silently; a payment amount must never be resolved that way.
//! - No string, key or value, at any depth, contains U+0000. PostgreSQL `text` cannot store
//!   it (the store would fail as a retry-safe `NOT_READY`, and a client would retry forever)
//!   and SQLite would store it; refusing it here makes every backend answer the same.
//!
//! Nesting depth is bounded by serde_json's recursion limit (128 levels).

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Why a body was refused, with the JSON path of the offending member (`"$"` is the root,
/// `a.b[2].c` a nested member).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyProblem {
    /// Not JSON at all (`line`/`column` of the first error).
    Syntax { line: usize, column: usize },
    /// A JSON document whose top level is not an object.
    NotAnObject,
    /// An object names `path`'s last key twice.
    DuplicateKey { path: String },
    /// A string value at `path`, or a key of the object at `path`, contains U+0000.
    NulCharacter { path: String },
}

impl BodyProblem {
    /// The `details.fields[].field` this problem is reported under.
    pub fn field(&self) -> &str {
        match self {
            BodyProblem::Syntax { .. } | BodyProblem::NotAnObject => "$",
            BodyProblem::DuplicateKey { path } | BodyProblem::NulCharacter { path } => path,
        }
    }

    /// The `details.fields[].problem` text.
    pub fn problem(&self) -> &'static str {
        match self {
            BodyProblem::Syntax { .. } => "must be a JSON document",
            BodyProblem::NotAnObject => "must be a JSON object",
            BodyProblem::DuplicateKey { .. } => "is given more than once",
            BodyProblem::NulCharacter { .. } => "must not contain the NUL character (U+0000)",
        }
    }

    /// The envelope's `message`.
    pub fn message(&self) -> String {
        match self {
            BodyProblem::Syntax { line, column } => {
                format!("the request body is not valid JSON (line {line}, column {column})")
            }
            BodyProblem::NotAnObject => "the request body must be a JSON object".to_owned(),
            BodyProblem::DuplicateKey { path } => format!("the request body names {path} more than once"),
            BodyProblem::NulCharacter { path } => format!("{path} contains the NUL character (U+0000)"),
        }
    }
}

/// Parses a request body under the invariants of this module.
pub fn parse_body(bytes: &[u8]) -> Result<Value, BodyProblem> {
    let found = RefCell::new(None);
    let seed = Strict { path: Path::Root, found: &found };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    match (parsed, found.into_inner()) {
        (Ok(Value::Object(m)), _) => Ok(Value::Object(m)),
        (Ok(_), _) => Err(BodyProblem::NotAnObject),
        (Err(_), Some(problem)) => Err(problem),
        (Err(e), None) => Err(BodyProblem::Syntax { line: e.line(), column: e.column() }),
    }
}

/// Where in the document a value sits.
#[derive(Clone)]
enum Path<'p> {
    Root,
    Key(&'p Path<'p>, &'p str),
    Index(&'p Path<'p>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => f.write_str("$"),
            Path::Key(Path::Root, k) => f.write_str(k),
            Path::Key(parent, k) => write!(f, "{parent}.{k}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

struct Strict<'p, 'f> {
    path: Path<'p>,
    found: &'f RefCell<Option<BodyProblem>>,
}

impl Strict<'_, '_> {
    fn refuse<E: de::Error>(&self, problem: BodyProblem) -> E {
        let msg = problem.message();
        self.found.borrow_mut().get_or_insert(problem);
        E::custom(msg)
    }

    fn check_str<E: de::Error>(&self, s: &str, path: &Path<'_>) -> Result<(), E> {
        if s.contains('\0') {
            return Err(self.refuse(BodyProblem::NulCharacter { path: path.to_string() }));
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_, '_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.check_str(v, &self.path)?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.check_str(&v, &self.path)?;
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            let path = Path::Index(&self.path, out.len());
            match seq.next_element_seed(Strict { path, found: self.found })? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            self.check_str(&key, &self.path)?;
            let path = Path::Key(&self.path, &key);
            if out.contains_key(&key) {
                return Err(self.refuse(BodyProblem::DuplicateKey { path: path.to_string() }));
            }
            let value = map.next_value_seed(Strict { path: path.clone(), found: self.found })?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_parse_exactly_as_serde_json_does() {
        let raw = br#"{"a":1,"b":[true,null,-2,3.5,"x"],"c":{"d":"\u00e9"},"e":18446744073709551615}"#;
        assert_eq!(parse_body(raw), Ok(serde_json::from_slice::<Value>(raw).expect("json")));
    }

    #[test]
    fn a_non_object_document_is_refused() {
        for raw in ["[1,2]", "\"x\"", "3", "null", "true", "[]"] {
            assert_eq!(parse_body(raw.as_bytes()), Err(BodyProblem::NotAnObject), "{raw}");
        }
    }

    #[test]
    fn a_duplicate_key_is_refused_at_any_depth() {
        let cases = [
            (r#"{"amountMinor":1,"amountMinor":2}"#, "amountMinor"),
            (r#"{"a":{"b":1,"b":1}}"#, "a.b"),
            (r#"{"a":[{"x":1},{"y":1,"y":2}]}"#, "a[1].y"),
        ];
        for (raw, path) in cases {
            assert_eq!(parse_body(raw.as_bytes()), Err(BodyProblem::DuplicateKey { path: path.to_owned() }), "{raw}");
        }
    }

    #[test]
    fn a_nul_character_is_refused_in_any_string_or_key() {
        let cases = [
            (r#"{"beneficiaryRef":"a\u0000b"}"#, "beneficiaryRef"),
            (r#"{"a":{"b":["ok","\u0000"]}}"#, "a.b[1]"),
            (r#"{"a\u0000":1}"#, "$"),
            (r#"{"o":{"k\u0000":1}}"#, "o"),
        ];
        for (raw, path) in cases {
            assert_eq!(parse_body(raw.as_bytes()), Err(BodyProblem::NulCharacter { path: path.to_owned() }), "{raw}");
        }
    }

    #[test]
    fn malformed_json_and_trailing_bytes_are_syntax_errors() {
        for raw in ["{nope", "{} {}", "", "{\"a\":1"] {
            assert!(matches!(parse_body(raw.as_bytes()), Err(BodyProblem::Syntax { .. })), "{raw}");
        }
    }
}
