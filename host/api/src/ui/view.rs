//! What the inspector shows of one instance, read through [`Backend`] only (so the same on SQLite
//! and Kafka): its record, its diagram with its marks, what it is waiting on, its steps with the
//! data after each, and its children.
//!
//! The data after each step is not stored: the journal is replayed here (the engine is
//! deterministic, so the fold gives the data each step left), up to [`MAX_ENTRIES`] entries.

use super::diagram::{self, Marks};
use serde_json::{json, Value};
use sm4c_host::driver::child_id;
use sm4c_host::service::{Backend, HostError};
use sm4c_runtime::engine::event::attribute_text;
use sm4c_runtime::engine::rfc3339;
use sm4c_runtime::json::{from_val, to_val};
use sm4c_runtime::model::Trigger;
use sm4c_runtime::{Effect, Entry, Input, Instance, Machine, Options, Snapshot, Trace};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Most journal entries read and replayed for one instance page.
pub const MAX_ENTRIES: usize = 5000;

/// The page of instance `id`: `{instance, diagram, waiting, steps, children, truncated}`.
pub async fn instance(h: &Arc<dyn Backend>, id: &str) -> Result<Value, crate::ApiError> {
    let record = crate::instance_json(h, id)?;
    let stored = h
        .instance(id)?
        .ok_or_else(|| HostError::UnknownInstance(id.to_string()))?;
    let snap = &stored.snapshot;
    let machine = h
        .machines()
        .into_iter()
        .find(|m| m.id == snap.definition && m.version == snap.version);
    let mut journal = Vec::new();
    let mut after = 0;
    let mut history_error = None;
    while journal.len() < MAX_ENTRIES {
        match h.history(id, after, 1000).await {
            Ok(page) => {
                let full = page.len() == 1000;
                after = page.last().map_or(after, |r| r.0);
                journal.extend(page);
                if !full {
                    break;
                }
            }
            Err(e) => {
                history_error = Some(e.to_string());
                break;
            }
        }
    }
    let truncated = journal.len() >= MAX_ENTRIES;
    let replay = machine.as_ref().map(|m| replay(m, id, &journal));
    let (steps, marks, open) = replay.unwrap_or_default();
    let marks = Marks {
        current: (!snap.status.is_final()).then(|| snap.state_name.clone()).flatten(),
        ..marks
    };
    let diagram = machine.as_ref().map(|m| diagram::svg(&diagram::graph(m), &marks));
    let waiting = match &machine {
        Some(m) if !snap.status.is_final() => waiting(m, snap, &open),
        _ => json!({"events": [], "timers": [], "operations": []}),
    };
    let mut children = Vec::new();
    for step in &steps {
        for e in step["effects"].as_array().into_iter().flatten() {
            if e["effect"] == "startSubflow" {
                let child = child_id(id, e["op"].as_str().unwrap_or(""));
                let status = h
                    .instance(&child)
                    .ok()
                    .flatten()
                    .map(|s| s.snapshot.status.as_str().to_string());
                children.push(json!({"id": child, "definition": e["definition"], "status": status}));
            }
        }
    }
    Ok(json!({
        "instance": record,
        "diagram": diagram,
        "waiting": waiting,
        "steps": steps,
        "children": children,
        "truncated": truncated,
        "historyError": history_error,
        "machineMissing": machine.is_none(),
    }))
}

/// Operations the instance has asked for and not had answered: op -> what it is.
type Open = BTreeMap<String, Value>;

/// Replays `journal`: one step per input, with the effects and traces it produced and the data it
/// left; the marks of the states it visited; the operations still open at the end.
fn replay(m: &Arc<Machine>, id: &str, journal: &[(i64, Entry)]) -> (Vec<Value>, Marks, Open) {
    let options = Options {
        journal: true,
        trace: true,
        ..Options::default()
    };
    let mut inst = Instance::new(m.clone(), id, options);
    let mut steps = Vec::new();
    let mut marks = Marks::default();
    let mut open = Open::new();
    let mut last_state: Option<String> = None;
    for (seq, e) in journal {
        let Entry::Input(timed) = e else { continue };
        match &timed.input {
            Input::Completed { op, .. } | Input::Failed { op, .. } => {
                open.remove(op);
            }
            _ => {}
        }
        let out = inst.handle(timed.clone());
        let mut effects = Vec::new();
        let mut traces = Vec::new();
        for entry in out.entries {
            match entry {
                Entry::Effect(effect) => {
                    match &effect {
                        Effect::InvokeFunction {
                            op,
                            function,
                            wait: true,
                            ..
                        } => {
                            open.insert(op.clone(), json!({"op": op, "kind": "function", "name": function}));
                        }
                        Effect::StartSubflow {
                            op,
                            definition,
                            wait: true,
                            ..
                        } => {
                            open.insert(
                                op.clone(),
                                json!({"op": op, "kind": "subflow", "name": definition, "instance": child_id(id, op)}),
                            );
                        }
                        Effect::CancelOperation { op } => {
                            open.remove(op);
                        }
                        _ => {}
                    }
                    effects.push(serde_json::to_value(&effect).unwrap_or(Value::Null));
                }
                Entry::Trace(t) => {
                    match &t {
                        Trace::StateEntered { state } => {
                            if let Some(prev) = last_state.replace(state.clone()) {
                                marks.fired.insert((prev, state.clone()));
                            }
                            marks.visited.insert(state.clone());
                        }
                        Trace::TransitionFired { state, next, .. } => {
                            let to = next.clone().unwrap_or_else(|| state.clone());
                            marks.fired.insert((state.clone(), to));
                        }
                        _ => {}
                    }
                    traces.push(serde_json::to_value(&t).unwrap_or(Value::Null));
                }
                Entry::Input(_) => {}
            }
        }
        let s = inst.snapshot();
        let mut input = serde_json::to_value(&timed.input).unwrap_or(Value::Null);
        // Keep a step light: the start data and event payloads are in `data` and the event view.
        if let Some(o) = input.as_object_mut() {
            o.remove("data");
        }
        steps.push(json!({
            "seq": seq,
            "time": rfc3339(timed.at),
            "input": input,
            "effects": effects,
            "traces": traces,
            "state": s.state_name,
            "status": s.status.as_str(),
            "data": data_of(s),
        }));
    }
    (steps, marks, open)
}

/// The data an instance shows: for a running ASL execution, the current state's input.
pub(crate) fn data_of(s: &Snapshot) -> Value {
    match (&s.asl, s.status.is_final()) {
        (Some(exec), false) => exec.root.input.clone(),
        _ => from_val(&s.data.0),
    }
}

/// What can happen next to a waiting instance: the events its current state's transitions wait
/// for (with the correlation values each must carry), its timers, and the calls and subflows it
/// waits for.
fn waiting(m: &Machine, snap: &Snapshot, open: &Open) -> Value {
    let mut events = Vec::new();
    let state = snap.state.and_then(|i| m.states.get(i));
    let data = to_val(&data_of(snap));
    if let Some(st) = state.filter(|_| m.asl.is_none()) {
        for (i, t) in st.transitions.iter().enumerate() {
            if t.trigger != Trigger::Events {
                continue;
            }
            let next = t.next.and_then(|n| m.states.get(n)).map(|s| s.name.clone());
            for (g, group) in t.groups.iter().enumerate() {
                for &e in &group.events {
                    let d = &m.events[e];
                    let correlation: Vec<Value> = d
                        .correlation
                        .iter()
                        .map(|rule| {
                            let name = rule.name.to_ascii_lowercase();
                            match &rule.value {
                                Some(tpl) => match tpl.resolve(&data) {
                                    Ok(v) => {
                                        let v = from_val(&v);
                                        let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                                        json!({"attribute": name, "value": text, "from": "data"})
                                    }
                                    Err(e) => json!({"attribute": name, "error": e.message}),
                                },
                                None => match snap.bindings.get(&name) {
                                    Some(v) => json!({"attribute": name, "value": v, "from": "bound"}),
                                    None => {
                                        json!({"attribute": name, "value": null, "from": "the first event binds it"})
                                    }
                                },
                            }
                        })
                        .collect();
                    events.push(json!({
                        "event": d.name,
                        "type": d.sent_type(),
                        "source": d.source,
                        "correlation": correlation,
                        "transition": i,
                        "group": g,
                        "next": next,
                        "all": group.events.len() > 1 || t.groups.len() > 1,
                    }));
                }
            }
        }
    }
    let timeout_next = state
        .and_then(|st| st.transitions.iter().find(|t| t.trigger == Trigger::Timeout))
        .and_then(|t| t.next)
        .and_then(|n| m.states.get(n))
        .map(|s| s.name.clone());
    let timers: Vec<Value> = snap
        .timers
        .iter()
        .map(|(name, due)| {
            let (kind, next) = if snap.state_timer.as_deref() == Some(name.as_str()) {
                ("state timeout", timeout_next.clone())
            } else if name == sm4c_runtime::engine::EXEC_TIMER {
                ("instance timeout", None)
            } else if name.ends_with(":delay") {
                ("delay", None)
            } else if name.ends_with(":retry") {
                ("retry", None)
            } else {
                ("timeout", None)
            };
            json!({"timer": name, "kind": kind, "due": rfc3339(*due), "dueMs": due, "next": next})
        })
        .collect();
    let inbox: Vec<Value> = snap
        .inbox
        .iter()
        .map(|e| json!({"type": attribute_text(e, "type"), "id": attribute_text(e, "id")}))
        .collect();
    json!({
        "events": events,
        "timers": timers,
        "operations": open.values().cloned().collect::<Vec<_>>(),
        "inbox": inbox,
    })
}
