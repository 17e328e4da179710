//! CloudEvents in and out: matching against event definitions and correlation rules, the `$value`
//! form handlers see, and the events `sendEvent` produces.

use super::types::rfc3339;
use super::Cx;
use crate::expr::EvalError;
use crate::json::{from_val, to_val};
use crate::model::{EventDef, Machine, Template};
use jaq_json::Val;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The CloudEvents context attributes that are not extensions.
pub const CORE: &[&str] = &[
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "datacontenttype",
    "dataschema",
    "data",
    "data_base64",
];

/// Reads an attribute by name, without regard to case (CloudEvents attribute names are lower case).
pub fn attribute<'a>(event: &'a Value, name: &str) -> Option<&'a Value> {
    let o = event.as_object()?;
    o.get(name)
        .or_else(|| o.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v))
}

/// An attribute as a string, for comparisons (`42` and `"42"` compare equal).
pub fn attribute_text(event: &Value, name: &str) -> Option<String> {
    attribute(event, name).map(text)
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Why an event definition does not match an event; `None` when it matches.
pub fn mismatch(def: &EventDef, event: &Value, data: &Val, bindings: &BTreeMap<String, String>) -> Option<String> {
    let ty = attribute_text(event, "type");
    let source = attribute_text(event, "source");
    match (&def.event_type, &def.source) {
        (None, None) => {
            if ty.as_deref() != Some(def.name.as_str()) {
                return Some(format!("type {:?} is not {:?}", ty.unwrap_or_default(), def.name));
            }
        }
        (t, s) => {
            if let Some(t) = t {
                if ty.as_deref() != Some(t.as_str()) {
                    return Some(format!("type {:?} is not {:?}", ty.unwrap_or_default(), t));
                }
            }
            if let Some(s) = s {
                if source.as_deref() != Some(s.as_str()) {
                    return Some(format!("source {:?} is not {:?}", source.unwrap_or_default(), s));
                }
            }
        }
    }
    for rule in &def.correlation {
        let Some(got) = attribute_text(event, &rule.name) else {
            return Some(format!(
                "correlation attribute {:?} is missing",
                rule.name.to_ascii_lowercase()
            ));
        };
        let want = match &rule.value {
            Some(t) => match t.resolve(data) {
                Ok(v) => Some(text(&from_val(&v))),
                Err(e) => return Some(format!("correlation value of {:?} failed: {}", rule.name, e.message)),
            },
            None => bindings.get(&rule.name.to_ascii_lowercase()).cloned(),
        };
        if let Some(want) = want {
            if got != want {
                return Some(format!(
                    "correlation attribute {:?} is {got:?}, expected {want:?}",
                    rule.name.to_ascii_lowercase()
                ));
            }
        }
    }
    None
}

/// True when the event's `type` and `source` fit the definition (correlation not considered).
pub fn kind_matches(def: &EventDef, event: &Value) -> bool {
    let ty = attribute_text(event, "type");
    let source = attribute_text(event, "source");
    match (&def.event_type, &def.source) {
        (None, None) => ty.as_deref() == Some(def.name.as_str()),
        (t, s) => {
            t.as_ref().is_none_or(|t| ty.as_deref() == Some(t.as_str()))
                && s.as_ref().is_none_or(|s| source.as_deref() == Some(s.as_str()))
        }
    }
}

/// The correlation attribute (lower case) and value an event of `def` must carry to reach an
/// instance with this data and these bindings: the first rule whose value is known. `None` when the
/// correlation leaves it open (no rule, none bound yet, or a value that does not evaluate).
///
/// Every event that [`mismatch`] lets through carries the key, so an index of waiting instances by
/// it finds every instance an event may reach without evaluating anything per instance; the
/// instances without a key are the ones to check one by one.
pub fn correlation_key(def: &EventDef, data: &Val, bindings: &BTreeMap<String, String>) -> Option<(String, String)> {
    def.correlation.iter().find_map(|rule| {
        let want = match &rule.value {
            Some(t) => t.resolve(data).ok().map(|v| text(&from_val(&v)))?,
            None => bindings.get(&rule.name.to_ascii_lowercase()).cloned()?,
        };
        Some((rule.name.to_ascii_lowercase(), want))
    })
}

/// Records the correlation values an event binds (rules without a value bind on first match).
pub fn bind(def: &EventDef, event: &Value, bindings: &mut BTreeMap<String, String>) {
    for rule in def.correlation.iter().filter(|r| r.value.is_none()) {
        if let Some(v) = attribute_text(event, &rule.name) {
            bindings.entry(rule.name.to_ascii_lowercase()).or_insert(v);
        }
    }
}

/// The event as handlers see it: the CloudEvent JSON form plus the reference implementation's names
/// (`Data`, `EventType`, `EventSource`, `EventId`, `Timestamp`, `ContextAttributes`).
pub fn event_value(event: &Value) -> Val {
    let mut o: Map<String, Value> = event.as_object().cloned().unwrap_or_default();
    if !o.contains_key("data") {
        if let Some(Value::String(b64)) = o.get("data_base64") {
            o.insert("data".into(), Value::String(b64.clone()));
        }
    }
    let get = |k: &str| o.get(k).cloned().unwrap_or(Value::Null);
    let extensions: Map<String, Value> = o
        .iter()
        .filter(|(k, _)| !CORE.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let aliases = [
        ("Data", get("data")),
        ("EventType", get("type")),
        ("EventSource", get("source")),
        ("EventId", get("id")),
        ("Timestamp", get("time")),
        ("ContextAttributes", Value::Object(extensions)),
    ];
    for (k, v) in aliases {
        o.insert(k.into(), v);
    }
    to_val(&Value::Object(o))
}

/// The CloudEvent a `sendEvent` action publishes. Its id is the instance id and operation id.
pub fn outgoing_event(
    cx: &Cx,
    event: usize,
    data: Option<&Template>,
    attributes: &[(String, Template)],
    input: &Val,
    op: &str,
) -> Result<Value, EvalError> {
    let def = &cx.m.events[event];
    let mut o = Map::new();
    o.insert("specversion".into(), "1.0".into());
    o.insert("id".into(), Value::String(event_id(cx.id, op)));
    o.insert(
        "source".into(),
        Value::String(def.source.clone().unwrap_or_else(|| default_source(cx.m))),
    );
    o.insert("type".into(), Value::String(def.sent_type().to_string()));
    o.insert("time".into(), Value::String(rfc3339(cx.now)));
    if let Some(t) = data {
        o.insert("datacontenttype".into(), "application/json".into());
        o.insert("data".into(), from_val(&t.resolve(input)?));
    }
    for rule in &def.correlation {
        if let Some(t) = &rule.value {
            let v = from_val(&t.resolve(cx.data)?);
            o.insert(rule.name.to_ascii_lowercase(), Value::String(text(&v)));
        }
    }
    for (name, t) in attributes {
        let v = from_val(&t.resolve(input)?);
        let v = match v {
            Value::String(_) | Value::Bool(_) | Value::Number(_) => v,
            other => Value::String(other.to_string()),
        };
        o.insert(name.to_ascii_lowercase(), v);
    }
    o.insert("sm4cinstanceid".into(), Value::String(cx.id.to_string()));
    Ok(Value::Object(o))
}

/// The deterministic id of an event sent by operation `op` of instance `instance`.
pub fn event_id(instance: &str, op: &str) -> String {
    format!("{instance}/{op}")
}

/// The `source` of sent events whose definition names none.
pub fn default_source(m: &Machine) -> String {
    format!("sm4c/{}", m.id)
}
