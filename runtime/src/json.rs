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
