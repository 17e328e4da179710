//! `QueryLanguage: "JSONata"` in a build of sm4c-runtime without its `jsonata` feature: the
//! definition is refused when it is loaded, naming the feature, and nothing is evaluated.

use super::{AslError, Env};
use serde_json::Value;

/// Why a JSONata definition is refused in this build.
pub const MISSING: &str = "this build of sm4c has no JSONata: enable the `jsonata` feature of the sm4c-runtime crate";

/// True when `s` is a JSONata expression: it starts with `{%` and ends with `%}`.
pub fn is_expression(s: &str) -> bool {
    s.starts_with("{%") && s.ends_with("%}")
}

/// A JSON value whose strings may be `{% %}` expressions; in this build it holds none.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    source: Value,
}

impl Query {
    /// Refuses every expression (errors are `(pointer relative to the value, message)`).
    pub fn parse(v: &Value) -> Result<Query, Vec<(String, String)>> {
        fn walk(v: &Value, pointer: &str, errors: &mut Vec<(String, String)>) {
            match v {
                Value::String(s) if is_expression(s) => errors.push((pointer.to_string(), MISSING.to_string())),
                Value::Array(a) => {
                    for (i, x) in a.iter().enumerate() {
                        walk(x, &format!("{pointer}/{i}"), errors);
                    }
                }
                Value::Object(o) => {
                    for (k, x) in o {
                        walk(
                            x,
                            &format!("{pointer}/{}", k.replace('~', "~0").replace('/', "~1")),
                            errors,
                        );
                    }
                }
                _ => {}
            }
        }
        let mut errors = Vec::new();
        walk(v, "", &mut errors);
        if errors.is_empty() {
            Ok(Query { source: v.clone() })
        } else {
            Err(errors)
        }
    }

    /// The value as written (it holds no expression).
    pub fn eval(&self, states: &Value, env: &Env) -> Result<Value, AslError> {
        let _ = (states, env);
        Ok(self.source.clone())
    }
}
