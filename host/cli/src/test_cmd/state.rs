//! `sm4c test-state`: runs one state of a definition (its enter action, its transitions, its exit
//! action; ASL: the state, with its Retry and Catch) from given data, and prints which transition
//! fires, the data after it and the effects the state asks for.
//!
//! It runs a copy of the definition that starts at the state and in which every other state does
//! nothing and ends the instance (SM4C: a state with only a name; ASL: a `Succeed` state), so the
//! instance stops where the transition leads.

use super::file;
use super::host;
use crate::files::{self, ferr, FileError};
use serde_json::{json, Map, Value};
use sm4c_runtime::{load, no_files, Limits, LoadOptions, Machine, Trace};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// The arguments of `sm4c test-state`.
#[derive(clap::Args)]
pub struct TestStateArgs {
    /// Definition file.
    definition: PathBuf,
    /// The state to run (ASL: a state of the top-level `States`).
    #[arg(long)]
    state: String,
    /// JSON file: the data the state is entered with (ASL: its input).
    #[arg(long)]
    input: PathBuf,
    /// JSON object of mocks: function name (ASL: Resource or state name) to a jq program over the
    /// arguments, or to a list of results, one per call, as in test files.
    #[arg(long)]
    mock: Option<PathBuf>,
    /// CloudEvents in the inbox when the state is entered: a JSON event, a JSON list of events, or
    /// NDJSON (repeatable).
    #[arg(long = "event", value_name = "FILE")]
    events: Vec<PathBuf>,
    /// Folder of definitions, found by `id`, for `invokeSubflow`.
    #[arg(long)]
    subflows: Option<PathBuf>,
    /// Wait for timers in real time instead of jumping the clock to them.
    #[arg(long)]
    real_time: bool,
}

/// Reads one event, a list of events, or NDJSON events.
fn load_events(path: &Path) -> Result<Vec<Value>, Vec<FileError>> {
    if let Ok(v) = files::read_json(path) {
        let list = match v {
            Value::Array(l) => l,
            one => vec![one],
        };
        let errs: Vec<FileError> = list
            .iter()
            .enumerate()
            .filter_map(|(i, e)| files::check_cloudevent(e).err().map(|m| ferr(path, format!("/{i}"), m)))
            .collect();
        return if errs.is_empty() { Ok(list) } else { Err(errs) };
    }
    files::load_events(path)
}

/// The definition `m` reduced to state `name`: it starts there, and every other state ends the
/// instance at once.
fn isolate(path: &Path, m: &Machine, name: &str) -> Result<Value, FileError> {
    let mut doc = m.source.clone();
    if m.asl.is_some() {
        let Some(states) = doc.get_mut("States").and_then(Value::as_object_mut) else {
            return Err(ferr(path, "/States", "missing"));
        };
        if !states.contains_key(name) {
            let names: Vec<&String> = states.keys().collect();
            return Err(ferr(
                path,
                "/States",
                format!("no top-level state {name:?} (test-state runs one of {names:?})"),
            ));
        }
        for (k, v) in states.iter_mut() {
            if k != name {
                *v = json!({"Type": "Succeed"});
            }
        }
        doc["StartAt"] = Value::String(name.to_string());
        return Ok(doc);
    }
    let Some(states) = doc.get_mut("states").and_then(Value::as_array_mut) else {
        return Err(ferr(path, "/states", "missing"));
    };
    if !states
        .iter()
        .any(|s| s.get("name").and_then(Value::as_str) == Some(name))
    {
        return Err(ferr(path, "/states", format!("no state {name:?}")));
    }
    for s in states.iter_mut() {
        let this = s.get("name").and_then(Value::as_str) == Some(name);
        if this {
            s["start"] = Value::Bool(true);
        } else {
            let mut only = Map::new();
            only.insert("name".into(), s.get("name").cloned().unwrap_or(Value::Null));
            *s = Value::Object(only);
        }
    }
    Ok(doc)
}

/// `sm4c test-state`.
pub fn run(args: TestStateArgs) -> ExitCode {
    let limits = Limits::default();
    let mut errs = Vec::new();
    let machine = files::load_definition(&args.definition, limits)
        .map_err(|e| errs.extend(e))
        .ok();
    let input = files::read_json(&args.input).map_err(|e| errs.push(e)).ok();
    let mocks = match &args.mock {
        Some(p) => match files::read_json(p) {
            Ok(v) => file::mocks(p, "", &v, limits, &mut errs),
            Err(e) => {
                errs.push(e);
                HashMap::new()
            }
        },
        None => HashMap::new(),
    };
    let mut events = Vec::new();
    for p in &args.events {
        match load_events(p) {
            Ok(e) => events.extend(e),
            Err(e) => errs.extend(e),
        }
    }
    let subflows = match &args.subflows {
        Some(dir) => files::load_folder(dir, limits)
            .map_err(|e| errs.extend(e))
            .unwrap_or_default(),
        None => HashMap::new(),
    };
    let (Some(machine), Some(input)) = (machine, input) else {
        return crate::report(&errs);
    };
    if !errs.is_empty() {
        return crate::report(&errs);
    }
    let is_asl = machine.asl.is_some();
    let one = match isolate(&args.definition, &machine, &args.state).and_then(|doc| {
        load(&doc, &mut no_files, LoadOptions { limits }).map_err(|e| {
            let e = e.into_iter().next().map(|e| format!("{}: {}", e.pointer, e.message));
            ferr(
                &args.definition,
                "/",
                format!("state {:?} cannot run alone: {}", args.state, e.unwrap_or_default()),
            )
        })
    }) {
        Ok(m) => Arc::new(m),
        Err(e) => return crate::report(&[e]),
    };
    let ran = match host::run(host::Setup {
        machine: one,
        input,
        mocks,
        events,
        subflows: &subflows,
        virtual_time: !args.real_time,
        scheduled: None,
        // SM4C: one transition per input; a transition that stays in the state and fires again
        // ends the run with a limit error rather than looping.
        max_transitions: if is_asl {
            sm4c_runtime::Options::default().max_transitions
        } else {
            1
        },
    }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sm4c: {e}");
            return ExitCode::from(3);
        }
    };
    let report = describe(&args.state, is_asl, &ran);
    println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
    for p in &ran.problems {
        eprintln!("sm4c: {}", super::expect::render(p));
    }
    if ran.actual.status == "failed" && report["transition"].is_null() {
        eprintln!(
            "sm4c: state {:?} failed: {}",
            args.state,
            ran.note.as_deref().unwrap_or("")
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// What the state did: the transition (SM4C: its index, trigger and next state; ASL: the `Next`,
/// Choice rule, `Default` or `Catch` taken and the next state), the data after it, its effects
/// (the calls, with the mocks' answers, the sent events, the subflows started), and the error
/// when it failed without a transition.
fn describe(state: &str, is_asl: bool, ran: &host::Ran) -> Value {
    let mut transition = Value::Null;
    let mut stays = false;
    if is_asl {
        let next = ran.actual.states.get(1).cloned();
        let prefix = format!("/States/{}/", file::esc(state));
        let took = ran.traces.iter().find_map(|t| match t {
            Trace::Covered { pointer } => pointer
                .strip_prefix(&prefix)
                .filter(|rest| !rest.contains("States"))
                .map(|_| pointer.clone()),
            _ => None,
        });
        if let Some(took) = took {
            transition = json!({"took": took, "next": next});
        }
    } else {
        let fired: Vec<&Trace> = ran
            .traces
            .iter()
            .filter(|t| matches!(t, Trace::TransitionFired { .. }))
            .collect();
        if let Some(Trace::TransitionFired {
            transition: i,
            next,
            trigger,
            ..
        }) = fired.first()
        {
            stays = next.is_none();
            transition = json!({"index": i, "trigger": trigger, "next": next});
        }
    }
    let mut out = json!({
        "state": state,
        "transition": transition,
        "status": ran.actual.status,
        "data": ran.actual.data,
        "calls": ran.actual.calls,
        "sent": ran.actual.sent,
        "subflows": ran.subflows,
    });
    if transition.is_null() || stays {
        if let Some(e) = &ran.actual.error {
            out["error"] = e.clone();
        }
        if let Some(n) = &ran.note {
            out["note"] = Value::String(n.clone());
        }
    }
    if stays {
        out["note"] = Value::String(
            "the transition stays in the state: test-state stops after it, before the transitions are evaluated again"
                .into(),
        );
    }
    out
}
