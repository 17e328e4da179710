//! The engine's side of the instance types: the jq value stored as JSON ([`J`]) and the jq views
//! of an error and of a condition's value. The types themselves ([`Input`], [`Effect`],
//! [`Entry`], [`Status`], [`ErrorInfo`], …) are the language-neutral kernel's
//! (`crate::kernel::types`), re-exported here under their old paths.

pub use crate::kernel::types::*;

use crate::json::{from_val, to_val};
use jaq_json::Val;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Value};

impl ErrorInfo {
    /// The error as jq sees it: `type`, `message`, `Message`, optional `details`.
    pub fn to_val(&self) -> Val {
        let mut v = json!({"type": self.kind.as_str(), "message": self.message, "Message": self.message});
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        to_val(&v)
    }
}

impl Trace {
    /// The trace of a condition at `pointer` that yielded `value`, not a boolean.
    pub fn condition_not_boolean(pointer: &str, condition: &str, value: &Val) -> Trace {
        let text = from_val(value).to_string();
        let value = match text.char_indices().nth(Self::MAX_VALUE_CHARS) {
            Some((cut, _)) => format!("{}…", &text[..cut]),
            None => text,
        };
        Trace::ConditionNotBoolean {
            pointer: pointer.to_string(),
            condition: condition.to_string(),
            value,
        }
    }
}

/// A jq value stored as JSON in snapshots.
#[derive(Clone, Debug, Default)]
pub struct J(pub Val);

impl Serialize for J {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        from_val(&self.0).serialize(s)
    }
}

impl<'de> Deserialize<'de> for J {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<J, D::Error> {
        Value::deserialize(d).map(|v| J(to_val(&v)))
    }
}

impl PartialEq for J {
    fn eq(&self, other: &J) -> bool {
        self.0 == other.0
    }
}
