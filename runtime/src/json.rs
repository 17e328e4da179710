//! Conversions between JSON documents (`serde_json::Value`) and jq values (`jaq_json::Val`).
//!
//! Instance data lives as [`Val`] inside the engine, so jq runs on it without copying;
//! JSON crosses the boundary only where data enters or leaves an instance.

use jaq_json::{Num, Val};
use serde_json::{Map, Number, Value};

/// JSON to jq value.
pub fn to_val(v: &Value) -> Val {
    match v {
        Value::Null => Val::Null,
        Value::Bool(b) => Val::Bool(*b),
        Value::Number(n) => Val::Num(match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Num::from_integral(i),
            (None, Some(u)) => Num::from_integral(u),
            _ => Num::Float(n.as_f64().unwrap_or(f64::NAN)),
        }),
        Value::String(s) => Val::utf8_str(s.clone().into_bytes()),
        Value::Array(a) => a.iter().map(to_val).collect(),
        Value::Object(o) => Val::obj(
            o.iter()
                .map(|(k, v)| (Val::utf8_str(k.clone().into_bytes()), to_val(v)))
                .collect(),
        ),
    }
}

/// jq value to JSON. Non-finite numbers become `null`, as in jq; non-string keys are written as JSON text.
pub fn from_val(v: &Val) -> Value {
    match v {
        Val::Null => Value::Null,
        Val::Bool(b) => Value::Bool(*b),
        Val::Num(n) => num(n),
        Val::TStr(b) | Val::BStr(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        Val::Arr(a) => Value::Array(a.iter().map(from_val).collect()),
        Val::Obj(o) => {
            let mut m = Map::with_capacity(o.len());
            for (k, v) in o.iter() {
                let key = match k {
                    Val::TStr(b) | Val::BStr(b) => String::from_utf8_lossy(b).into_owned(),
                    other => other.to_string(),
                };
                m.insert(key, from_val(v));
            }
            Value::Object(m)
        }
    }
}

fn num(n: &Num) -> Value {
    match n {
        Num::Int(i) => Value::Number((*i as i64).into()),
        Num::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        other => {
            let text = other.to_string();
            text.parse::<i64>()
                .map(|i| Value::Number(i.into()))
                .or_else(|_| text.parse::<u64>().map(|u| Value::Number(u.into())))
                .ok()
                .or_else(|| text.parse::<f64>().ok().and_then(Number::from_f64).map(Value::Number))
                .unwrap_or(Value::Null)
        }
    }
}

/// Reads a string out of a jq value, if it is one.
pub fn as_str(v: &Val) -> Option<String> {
    match v {
        Val::TStr(b) | Val::BStr(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// A jq string value.
pub fn str_val(s: &str) -> Val {
    Val::utf8_str(s.as_bytes().to_vec())
}

/// Serde helpers that store a [`Val`] as plain JSON.
pub mod serde_val {
    use super::{from_val, to_val};
    use jaq_json::Val;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Serializes a jq value as JSON.
    pub fn serialize<S: Serializer>(v: &Val, s: S) -> Result<S::Ok, S::Error> {
        from_val(v).serialize(s)
    }

    /// Deserializes a jq value from JSON.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Val, D::Error> {
        serde_json::Value::deserialize(d).map(|v| to_val(&v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip() {
        let v = json!({"a": [1, 2.5, "x", null, true], "b": {"c": -3}, "big": 18446744073709551615u64});
        assert_eq!(from_val(&to_val(&v)), v);
    }
}

/// Deepest nesting of arrays and objects a value may have where it enters an instance: a start's
/// input, an event's data, a task's answer, a function's result, an expression's result. One
/// limit, checked where data comes in, well under what every reader in the project accepts
/// ([`READ_DEPTH`]), so that the records the hosts wrap around a value always read back.
pub const MAX_DEPTH: usize = 64;

/// Deepest nesting a host reads back from what it stored (a SQLite row, a Kafka record): above
/// [`MAX_DEPTH`] and the few levels a record wraps around a value, and far below what a thread's
/// stack holds.
pub const READ_DEPTH: usize = 256;

/// The JSON pointer of the first array or object of `v` nested deeper than `limit` levels (a
/// scalar is at no level, `[1]` at one), `None` when `v` stays within it. Looks no deeper than
/// `limit + 1` levels, so any value can be checked.
pub fn too_deep(v: &Value, limit: usize) -> Option<String> {
    fn walk(v: &Value, left: usize, path: &mut String) -> bool {
        let into = |key: &str, child: &Value, path: &mut String| {
            let len = path.len();
            path.push('/');
            path.push_str(&key.replace('~', "~0").replace('/', "~1"));
            let deep = walk(child, left - 1, path);
            if !deep {
                path.truncate(len);
            }
            deep
        };
        match v {
            Value::Array(_) | Value::Object(_) if left == 0 => true,
            Value::Array(a) => a.iter().enumerate().any(|(i, c)| into(&i.to_string(), c, path)),
            Value::Object(o) => o.iter().any(|(k, c)| into(k, c, path)),
            _ => false,
        }
    }
    let mut path = String::new();
    walk(v, limit, &mut path).then_some(path)
}

/// Whether `v` stays within [`MAX_DEPTH`]; else what is wrong, naming `what` (a field, a JSON
/// pointer) and where the limit is passed.
pub fn check_depth(v: &Value, what: &str) -> Result<(), String> {
    match too_deep(v, MAX_DEPTH) {
        None => Ok(()),
        Some(at) => Err(format!(
            "{what} is nested deeper than {MAX_DEPTH} levels, the most sm4c takes in (the array or object at {:?} is level {})",
            if at.is_empty() { "/".to_string() } else { at },
            MAX_DEPTH + 1
        )),
    }
}

/// Whether a jq value nests arrays and objects deeper than `limit` levels (see [`too_deep`]).
pub fn val_too_deep(v: &Val, limit: usize) -> bool {
    match v {
        Val::Arr(_) | Val::Obj(_) if limit == 0 => true,
        Val::Arr(a) => a.iter().any(|c| val_too_deep(c, limit - 1)),
        Val::Obj(o) => o.values().any(|c| val_too_deep(c, limit - 1)),
        _ => false,
    }
}

/// Reads a record a host stored (a SQLite row, a Kafka record). serde_json's reader stops at 128
/// levels, a few above [`MAX_DEPTH`] once a record wraps a value (issue 35: a 126-level input was
/// written and the server could no longer start); records are read with its limit off, behind a
/// checked depth of [`READ_DEPTH`], so whatever was written reads back and nothing overflows a
/// thread's stack. The error says what is wrong.
pub fn read_stored<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let depth = text_nesting(bytes);
    if depth > READ_DEPTH {
        return Err(format!(
            "nested {depth} levels deep, more than the {READ_DEPTH} a stored record may have"
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    de.disable_recursion_limit();
    T::deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| e.to_string())
}

/// The deepest nesting of arrays and objects in JSON text (brackets inside strings do not count),
/// without parsing it: malformed text gets some number, and the parser then says what is wrong.
pub fn text_nesting(text: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in text {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod depth_tests {
    use super::*;
    use serde_json::json;

    fn nested(levels: usize) -> Value {
        (0..levels).fold(json!(1), |v, _| json!([v]))
    }

    #[test]
    fn values_at_the_limit_pass_and_one_level_more_is_named_by_its_pointer() {
        assert_eq!(too_deep(&json!(1), 0), None);
        assert_eq!(too_deep(&json!([]), 0).as_deref(), Some(""));
        assert_eq!(too_deep(&nested(MAX_DEPTH), MAX_DEPTH), None);
        let v = json!({"a/b": nested(MAX_DEPTH)});
        let at = too_deep(&v, MAX_DEPTH).expect("too deep");
        assert!(at.starts_with("/a~1b/0/0/"), "{at}");
        assert_eq!(at.matches('/').count(), MAX_DEPTH);
        let err = check_depth(&nested(MAX_DEPTH + 1), "input").expect_err("too deep");
        assert!(err.starts_with("input is nested deeper than 64 levels"), "{err}");
        assert!(check_depth(&nested(MAX_DEPTH), "input").is_ok());
        assert!(!val_too_deep(&to_val(&nested(MAX_DEPTH)), MAX_DEPTH));
        assert!(val_too_deep(&to_val(&json!({"x": nested(MAX_DEPTH)})), MAX_DEPTH));
    }

    #[test]
    fn stored_records_read_back_past_serde_jsons_limit_up_to_the_read_depth() {
        let text = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
        assert!(serde_json::from_str::<Value>(&text(130)).is_err());
        assert_eq!(read_stored::<Value>(text(130).as_bytes()), Ok(nested(130)));
        assert!(read_stored::<Value>(text(READ_DEPTH).as_bytes()).is_ok());
        let err = read_stored::<Value>(text(READ_DEPTH + 1).as_bytes()).expect_err("too deep");
        assert!(err.contains("more than the 256"), "{err}");
        assert!(read_stored::<Value>(b"[1] x").is_err());
    }

    #[test]
    fn text_nesting_skips_brackets_in_strings() {
        assert_eq!(text_nesting(br#"{"a":"[[[{{","b":[[1]]}"#), 3);
        assert_eq!(text_nesting(br#"["\"[["]"#), 1);
        assert_eq!(text_nesting(b"1"), 0);
    }
}

/// What kind of JSON value `v` is, as messages name it: `null`, `a boolean`, `a number`, `a string`,
/// `an array`, `an object`.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
