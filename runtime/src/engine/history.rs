//! Histories as people and tools read them, and what a definition would decide with one.
//!
//! A history is an instance's journal, each entry with its place (`seq`) and, for inputs, the time
//! in RFC 3339: what `GET /instances/{id}/history` pages through and `sm4c history ID --json` prints.
//! [`compare`] runs a history's recorded inputs through a definition, as a replay does, and says
//! whether the definition makes the same decisions: the states it enters, the transitions it fires,
//! the actions it starts and ends, the calls, subflows, sent events and timers it asks for, all in
//! the same order and with the same content. It is how a new version of a definition is checked
//! against the instances the old one ran, before they meet it.

use super::{rfc3339, Entry, Input, Instance, Options, Trace};
use crate::json::kind;
use crate::Machine;
use serde_json::{json, Value};
use std::sync::Arc;

/// A journal entry as a person reads it: the entry, its place in the journal (`seq`) and, for an
/// input, its time in RFC 3339 (`time`) beside the milliseconds (`at`).
pub fn history_entry(seq: i64, e: &Entry) -> Value {
    let mut v = serde_json::to_value(e).unwrap_or(Value::Null);
    v["seq"] = json!(seq);
    if let Entry::Input(t) = e {
        v["time"] = json!(rfc3339(t.at));
    }
    v
}

/// A history read back: the instance's id when the history names it, and its entries with their
/// places.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// The instance's id (`{"id": …}` of an API page); none for a bare array of entries.
    pub id: Option<String>,
    /// The entries, each with its `seq` (its position from 1 when the history has none).
    pub entries: Vec<(i64, Entry)>,
}

/// Why a history cannot be read: where (a JSON pointer, `/` for the whole) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryError {
    /// JSON pointer of what is wrong in the history.
    pub pointer: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for HistoryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.pointer, self.message)
    }
}

fn herr(pointer: impl Into<String>, message: impl Into<String>) -> HistoryError {
    HistoryError {
        pointer: pointer.into(),
        message: message.into(),
    }
}

impl History {
    /// Reads a history: an array of entries (`sm4c history ID --json`), or an object with
    /// `entries` and `id` (one page of `GET /instances/{id}/history`, or pages merged). An error
    /// names the entry by its JSON pointer.
    pub fn from_json(v: &Value) -> Result<History, HistoryError> {
        let (id, list, base) = match v {
            Value::Array(a) => (None, a, ""),
            Value::Object(o) => {
                let Some(Value::Array(a)) = o.get("entries") else {
                    return Err(herr("/", "a history is an array of journal entries, or an object with \"entries\": [...] (as GET /instances/{id}/history answers)"));
                };
                let id = match o.get("id") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(other) => return Err(herr("/id", format!("the instance id must be a string, not {other}"))),
                };
                (id, a, "/entries")
            }
            other => {
                return Err(herr(
                    "/",
                    format!("a history is an array of journal entries, not {}", kind(other)),
                ))
            }
        };
        let mut entries = Vec::with_capacity(list.len());
        for (i, e) in list.iter().enumerate() {
            let entry: Entry = serde_json::from_value(e.clone())
                .map_err(|err| herr(format!("{base}/{i}"), format!("not a journal entry: {err}")))?;
            let seq = match e.get("seq") {
                None => i as i64 + 1,
                Some(s) => s
                    .as_i64()
                    .ok_or_else(|| herr(format!("{base}/{i}/seq"), format!("must be an integer, not {s}")))?,
            };
            entries.push((seq, entry));
        }
        Ok(History { id, entries })
    }

    /// The instance id the history's own entries give away when the history does not name it: the
    /// `sm4cinstanceid` of an event the instance sent.
    pub fn sent_by(&self) -> Option<String> {
        self.entries.iter().find_map(|(_, e)| match e {
            Entry::Effect(super::Effect::SendEvent { event, .. }) => {
                event.get("sm4cinstanceid").and_then(Value::as_str).map(str::to_string)
            }
            _ => None,
        })
    }
}

/// One field in which a recorded entry and the one the definition decides differ.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldDifference {
    /// JSON pointer of the field inside the entry, e.g. `/arguments/amount`.
    pub pointer: String,
    /// The recorded value (null when the recorded entry has no such field).
    pub recorded: Value,
    /// What the definition decides (null when its entry has no such field).
    pub decided: Value,
}

/// Where a definition first decides differently from a history.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    /// `seq` of the recorded entry that differs (of the input after which the definition asks for
    /// more, when the history has nothing there).
    pub entry: i64,
    /// The state the recorded instance was in there (the last one it entered), if any.
    pub state: Option<String>,
    /// The recorded entry (none: the definition asks for more than the history has).
    pub recorded: Option<Entry>,
    /// What the definition decides in its place (none: it no longer decides it).
    pub decided: Option<Entry>,
    /// Field by field, when both are there.
    pub differences: Vec<FieldDifference>,
}

impl Divergence {
    /// One line: where, and what against what.
    pub fn summary(&self) -> String {
        let state = self
            .state
            .as_deref()
            .map(|s| format!(" in state {s:?}"))
            .unwrap_or_default();
        let what = match (&self.recorded, &self.decided) {
            (Some(r), Some(d)) => format!("recorded {} but the definition decides {}", describe(r), describe(d)),
            (Some(r), None) => format!("recorded {} but the definition no longer decides it", describe(r)),
            (None, Some(d)) => format!(
                "the definition decides {}, which the history does not have",
                describe(d)
            ),
            (None, None) => "the history and the definition part here".into(),
        };
        format!("entry {}{state}: {what}", self.entry)
    }
}

/// What [`compare`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Comparison {
    /// Inputs run through the definition (up to the divergence, if any).
    pub inputs: usize,
    /// Decisions (effects and steps) found the same.
    pub decisions: usize,
    /// Differences that changed no decision: a failed action's message, a condition's non-boolean
    /// value, an instance id the history does not name.
    pub notes: Vec<String>,
    /// The first decision that differs; none when the definition decides as recorded.
    pub divergence: Option<Divergence>,
}

/// A short description of an entry: `effect invokeFunction (function "charge", operation 1.enter)`.
pub fn describe(e: &Entry) -> String {
    match e {
        Entry::Input(t) => format!(
            "the input {}",
            tag(&serde_json::to_value(&t.input).unwrap_or_default(), "input")
        ),
        Entry::Effect(ef) => format!("the effect {}", super::describe(ef)),
        Entry::Trace(tr) => {
            let v = serde_json::to_value(tr).unwrap_or_default();
            let step = tag(&v, "step");
            let detail: Vec<String> = v
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| k.as_str() != "step")
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            match detail.is_empty() {
                true => format!("the step {step}"),
                false => format!("the step {step} ({})", detail.join(", ")),
            }
        }
    }
}

fn tag(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("?").to_string()
}

/// Runs the history's recorded inputs through `machine`, as instance `id`, and compares what it
/// decides after each with what the history recorded there.
///
/// Steps are compared only when the history recorded steps (hosts do; `journal`-only histories have
/// effects alone). Coverage marks are ignored. A failed action's message and a condition's
/// non-boolean value are data no decision depended on: a difference there is a note.
pub fn compare(machine: Arc<Machine>, id: &str, history: &History) -> Comparison {
    let steps = history
        .entries
        .iter()
        .any(|(_, e)| matches!(e, Entry::Trace(t) if !matches!(t, Trace::Covered { .. })));
    let mut inst = Instance::new(
        machine,
        id,
        Options {
            journal: true,
            trace: steps,
            coverage: false,
            ..Options::default()
        },
    );
    let mut out = Comparison::default();
    let mut recorded_state: Option<String> = None;
    let mut i = 0;
    let entries = &history.entries;
    // Decisions recorded before the first input (none in a journal the engine wrote) are compared
    // against nothing.
    while i < entries.len() {
        let (seq, e) = &entries[i];
        let Entry::Input(t) = e else {
            if let Some(d) = decision(e, steps) {
                out.divergence = Some(Divergence {
                    entry: *seq,
                    state: recorded_state.clone(),
                    recorded: Some(d.clone()),
                    decided: None,
                    differences: Vec::new(),
                });
                return out;
            }
            i += 1;
            continue;
        };
        let input_seq = *seq;
        if let Input::Migrate { version, .. } = &t.input {
            out.notes.push(format!(
                "entry {input_seq} moves the instance to version {version:?}: the decisions after it are that version's, compared up to here"
            ));
            return out;
        }
        out.inputs += 1;
        let decided: Vec<Entry> = inst
            .handle(t.clone())
            .entries
            .into_iter()
            .filter(|e| decision(e, steps).is_some())
            .collect();
        i += 1;
        let start = i;
        while i < entries.len() && !matches!(entries[i].1, Entry::Input(_)) {
            i += 1;
        }
        let recorded: Vec<(i64, &Entry)> = entries[start..i]
            .iter()
            .filter(|(_, e)| decision(e, steps).is_some())
            .map(|(s, e)| (*s, e))
            .collect();
        let (recorded, recorded_soft) = split_soft(recorded);
        let decided_soft: Vec<&Entry> = decided.iter().filter(|e| soft(e)).collect();
        let decided: Vec<&Entry> = decided.iter().filter(|e| !soft(e)).collect();
        if recorded_soft.iter().map(|(_, e)| *e).ne(decided_soft.iter().copied()) {
            out.notes.push(format!(
                "after the input at entry {input_seq}: a condition yields {} now, {} recorded",
                soft_values(decided_soft.iter().copied()),
                soft_values(recorded_soft.iter().map(|(_, e)| *e))
            ));
        }
        for k in 0..recorded.len().max(decided.len()) {
            let r = recorded.get(k);
            let d = decided.get(k).copied();
            match (r, d) {
                (Some((_, a)), Some(b)) if *a == b => {
                    out.decisions += 1;
                    if let Entry::Trace(Trace::StateEntered { state }) = a {
                        recorded_state = Some(state.clone());
                    }
                }
                (Some((s, a)), Some(b)) if only_message(a, b) => {
                    out.decisions += 1;
                    out.notes.push(format!(
                        "entry {s}: the failed action's message is {:?} now, {:?} recorded",
                        message(b),
                        message(a)
                    ));
                }
                (r, d) => {
                    let differences = match (r, d) {
                        (Some((_, a)), Some(b)) => fields(a, b),
                        _ => Vec::new(),
                    };
                    out.divergence = Some(Divergence {
                        entry: r.map_or(input_seq, |(s, _)| *s),
                        state: recorded_state.clone(),
                        recorded: r.map(|(_, e)| (*e).clone()),
                        decided: d.cloned(),
                        differences,
                    });
                    return out;
                }
            }
        }
    }
    out
}

/// The entry when it is a decision compared: an effect, or a step other than a coverage mark
/// (when steps are compared).
fn decision(e: &Entry, steps: bool) -> Option<&Entry> {
    match e {
        Entry::Input(_) => None,
        Entry::Effect(_) => Some(e),
        Entry::Trace(Trace::Covered { .. }) => None,
        Entry::Trace(_) => steps.then_some(e),
    }
}

/// A condition's non-boolean value: a note when it differs, never a decision.
fn soft(e: &Entry) -> bool {
    matches!(e, Entry::Trace(Trace::ConditionNotBoolean { .. }))
}

#[allow(clippy::type_complexity)]
fn split_soft(list: Vec<(i64, &Entry)>) -> (Vec<(i64, &Entry)>, Vec<(i64, &Entry)>) {
    list.into_iter().partition(|(_, e)| !soft(e))
}

fn soft_values<'a>(list: impl Iterator<Item = &'a Entry>) -> String {
    let v: Vec<String> = list
        .filter_map(|e| match e {
            Entry::Trace(Trace::ConditionNotBoolean { pointer, value, .. }) => Some(format!("{value} at {pointer}")),
            _ => None,
        })
        .collect();
    match v.is_empty() {
        true => "booleans".into(),
        false => v.join(", "),
    }
}

/// The same failed action, with another message.
fn only_message(a: &Entry, b: &Entry) -> bool {
    match (a, b) {
        (
            Entry::Trace(Trace::ActionFailed { op, action, .. }),
            Entry::Trace(Trace::ActionFailed {
                op: op2,
                action: action2,
                ..
            }),
        ) => op == op2 && action == action2,
        _ => false,
    }
}

fn message(e: &Entry) -> &str {
    match e {
        Entry::Trace(Trace::ActionFailed { message, .. }) => message,
        _ => "",
    }
}

/// The fields in which two entries differ, each by its JSON pointer.
fn fields(a: &Entry, b: &Entry) -> Vec<FieldDifference> {
    let (a, b) = (
        serde_json::to_value(a).unwrap_or_default(),
        serde_json::to_value(b).unwrap_or_default(),
    );
    let mut out = Vec::new();
    walk(&a, &b, String::new(), &mut out);
    out
}

fn walk(a: &Value, b: &Value, at: String, out: &mut Vec<FieldDifference>) {
    if a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                walk(v, y.get(k).unwrap_or(&Value::Null), format!("{at}/{}", escape(k)), out);
            }
            for (k, w) in y.iter().filter(|(k, _)| !x.contains_key(*k)) {
                walk(&Value::Null, w, format!("{at}/{}", escape(k)), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                walk(v, w, format!("{at}/{i}"), out);
            }
        }
        _ => out.push(FieldDifference {
            pointer: if at.is_empty() { "/".into() } else { at },
            recorded: a.clone(),
            decided: b.clone(),
        }),
    }
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// What a comparison says as JSON: `{"outcome": "same"|"diverged", "inputs", "decisions", "notes",
/// "divergence": {"entry", "state", "recorded", "decided", "differences": [{"pointer", "recorded",
/// "decided"}]}}`.
pub fn comparison_json(c: &Comparison) -> Value {
    let divergence = c.divergence.as_ref().map(|d| {
        json!({
            "entry": d.entry,
            "state": d.state,
            "summary": d.summary(),
            "recorded": d.recorded,
            "decided": d.decided,
            "differences": d.differences.iter().map(|f| json!({
                "pointer": f.pointer,
                "recorded": f.recorded,
                "decided": f.decided,
            })).collect::<Vec<_>>(),
        })
    });
    json!({
        "outcome": if c.divergence.is_some() { "diverged" } else { "same" },
        "inputs": c.inputs,
        "decisions": c.decisions,
        "notes": c.notes,
        "divergence": divergence,
    })
}

/// True when the history holds the instance's start: one without it (a page after the first)
/// cannot be replayed.
pub fn has_start(h: &History) -> bool {
    h.entries
        .iter()
        .any(|(_, e)| matches!(e, Entry::Input(t) if matches!(t.input, Input::Start { .. })))
}
