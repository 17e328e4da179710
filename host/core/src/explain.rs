//! Why an event reaches the instances it reaches, and why the others turn it away.
//!
//! Correlation that fails silently is what users of event-driven engines complain about most;
//! `POST /events/explain` and `sm4c explain-event` answer with this report instead.

use serde_json::{json, Value};
use sm4c_runtime::engine::event::{attribute_text, kind_matches, mismatch};
use sm4c_runtime::{Machine, Snapshot};
use std::sync::Arc;

/// Explains where `event` (a CloudEvent in JSON form) would go among `instances`.
///
/// The report has `reached` (instances it would be delivered to), `nearMisses` (unfinished
/// instances of definitions that declare an event of its type and source, with the attribute or
/// correlation rule that turned it away), `definitions` (for each definition, whether one of its
/// event definitions matches the event's type and source, else why not) and `starts` (definitions
/// whose `startEvent` it matches).
pub fn explain<'a>(machines: &[Arc<Machine>], instances: impl Iterator<Item = &'a Snapshot>, event: &Value) -> Value {
    let target = attribute_text(event, "sm4cinstanceid");
    let mut reached = Vec::new();
    let mut near = Vec::new();
    let mut seen_target = false;
    for snap in instances {
        if target.as_deref().is_some_and(|t| t != snap.id) {
            continue;
        }
        seen_target |= target.is_some();
        let Some(m) = machines
            .iter()
            .find(|m| m.id == snap.definition && m.version == snap.version)
        else {
            continue;
        };
        if snap.status.is_final() {
            if target.is_some() {
                near.push(json!({"instance": snap.id, "definition": m.id,
                    "reason": format!("the instance has ended ({})", snap.status.as_str())}));
            }
            continue;
        }
        let mut why = Vec::new();
        let mut matched = None;
        for d in &m.events {
            match mismatch(d, event, &snap.data.0, &snap.bindings) {
                None => {
                    matched = Some(d.name.clone());
                    break;
                }
                Some(r) => {
                    if target.is_some() || kind_matches(d, event) {
                        why.push(format!("event {:?}: {r}", d.name));
                    }
                }
            }
        }
        match matched {
            Some(name) => reached.push(
                json!({"instance": snap.id, "definition": m.id, "state": snap.state_name,
                "status": snap.status.as_str(), "event": name}),
            ),
            None if !why.is_empty() => near.push(json!({"instance": snap.id, "definition": m.id,
                "state": snap.state_name, "reason": why.join("; ")})),
            None => {}
        }
    }
    if let (Some(t), false) = (&target, seen_target) {
        near.push(json!({"instance": t, "reason": format!("the event names instance {t:?} (sm4cinstanceid), which does not exist")}));
    }
    let definitions: Vec<Value> = machines
        .iter()
        .filter(|m| !m.events.is_empty())
        .map(|m| {
            let hit = m.events.iter().find(|d| kind_matches(d, event));
            match hit {
                Some(d) => json!({"id": m.id, "version": m.version, "matches": true, "event": d.name}),
                None => {
                    let reasons: Vec<String> = m
                        .events
                        .iter()
                        .filter_map(|d| {
                            mismatch(d, event, &sm4c_runtime::json::to_val(&Value::Null), &Default::default())
                                .map(|r| format!("event {:?}: {r}", d.name))
                        })
                        .collect();
                    json!({"id": m.id, "version": m.version, "matches": false, "reason": reasons.join("; ")})
                }
            }
        })
        .collect();
    let starts: Vec<Value> = machines
        .iter()
        .filter(|m| m.start_event.as_ref().is_some_and(|s| starts_with(s, event)))
        .map(|m| json!({"definition": m.id, "version": m.version}))
        .collect();
    json!({
        "event": {"id": attribute_text(event, "id"), "type": attribute_text(event, "type"),
                  "source": attribute_text(event, "source"), "sm4cinstanceid": target},
        "reached": reached,
        "nearMisses": near,
        "definitions": definitions,
        "starts": starts,
    })
}

/// True when `event` is the start event a definition declares.
pub fn starts_with(s: &sm4c_runtime::model::StartEvent, event: &Value) -> bool {
    attribute_text(event, "type").as_deref() == Some(s.event_type.as_str())
        && s.source
            .as_ref()
            .is_none_or(|src| attribute_text(event, "source").as_deref() == Some(src.as_str()))
}
