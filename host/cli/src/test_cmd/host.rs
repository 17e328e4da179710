//! Running one test: an in-memory host whose functions are the test's mocks, recording every
//! call and sent event, with the instance's trace and coverage collected on the side.

use super::expect::{Actual, Failure};
use super::file::{esc, Mock, MockOutcome};
use serde_json::{json, Value};
use sm4c_host::{BoxFuture, Clock, Config, FunctionCall, Functions, InMemoryHost, TraceSink};
use sm4c_runtime::engine::Scheduled;
use sm4c_runtime::{ErrorInfo, ErrorKind, Machine, Options, Status, Trace};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// Where the virtual clock of a test starts: 2026-01-01T00:00:00Z, the same on every run, so
/// that what a definition reads of the time is the same on every run too.
pub const VIRTUAL_START: i64 = 1_767_225_600_000;

/// The instance id of the definition under test (its subflows' ids start with it).
pub const ROOT: &str = "test";

/// Functions answered by a test's mocks, and nothing else: a test never calls a real service.
pub struct TestFunctions {
    mocks: HashMap<String, Mock>,
    subflows: HashMap<String, Arc<Machine>>,
    record: Mutex<Record>,
}

/// What the instance (and its subflows) asked of the functions.
#[derive(Default)]
pub struct Record {
    /// Calls, in order: `{"function", "arguments"}` (ASL: and `state`).
    pub calls: Vec<Value>,
    /// Sent events, in order.
    pub sent: Vec<Value>,
    /// The ids of the subflows started, in order.
    pub subflows: Vec<String>,
    /// The definitions of the subflows started, in order (those found).
    pub started: Vec<Arc<Machine>>,
    /// Calls the mocks could not answer: no mock, or a list of results used up.
    pub problems: Vec<Failure>,
    /// Calls made so far per mock with a list of results.
    used: HashMap<String, usize>,
}

impl TestFunctions {
    /// Functions answered by `mocks`, with subflows from `subflows`.
    pub fn new(mocks: HashMap<String, Mock>, subflows: HashMap<String, Arc<Machine>>) -> TestFunctions {
        TestFunctions {
            mocks,
            subflows,
            record: Mutex::new(Record::default()),
        }
    }

    /// What was recorded, taken out.
    pub fn take(&self) -> Record {
        std::mem::take(&mut *self.record.lock().unwrap_or_else(|p| p.into_inner()))
    }

    #[allow(clippy::result_large_err, reason = "the error the Functions trait returns")]
    fn answer(&self, call: &FunctionCall) -> Result<Value, ErrorInfo> {
        let asl = call.function_type == "asl";
        let mut rec = self.record.lock().unwrap_or_else(|p| p.into_inner());
        let mut recorded = json!({"function": call.function, "arguments": call.arguments});
        if asl {
            recorded["state"] = Value::String(call.operation.clone());
        }
        rec.calls.push(recorded);
        let key = if self.mocks.contains_key(&call.function) {
            Some(call.function.as_str())
        } else if asl && self.mocks.contains_key(&call.operation) {
            Some(call.operation.as_str())
        } else {
            None
        };
        let Some((key, mock)) = key.and_then(|k| self.mocks.get(k).map(|m| (k, m))) else {
            let what = if asl {
                format!("Task state {:?} calls Resource {:?}", call.operation, call.function)
            } else {
                format!("function {:?}", call.function)
            };
            rec.problems.push(Failure {
                path: format!("/mocks/{}", esc(&call.function)),
                expected: json!("a mock"),
                actual: None,
            });
            let message = format!("{what} has no mock in this test");
            return Err(fail(asl, None, message, None));
        };
        match mock {
            Mock::Jq(expr) => expr.eval_json(&call.arguments).map_err(|e| {
                if asl {
                    let details = match e.value {
                        Some(Value::Object(o)) if o.contains_key("Error") => Value::Object(o),
                        Some(Value::String(text)) => json!({"Error": "States.TaskFailed", "Cause": text}),
                        Some(other) => json!({"Error": "States.TaskFailed", "Cause": other.to_string()}),
                        None => json!({"Error": "States.TaskFailed", "Cause": e.message}),
                    };
                    ErrorInfo::new(ErrorKind::FunctionError, e.message.clone()).with_details(details)
                } else {
                    let mut err = ErrorInfo::new(ErrorKind::FunctionError, e.message.clone());
                    err.details = e.value.filter(|v| !v.is_string());
                    err
                }
            }),
            Mock::Sequence(list) => {
                let n = rec.used.entry(key.to_string()).or_insert(0);
                *n += 1;
                let n = *n;
                match list.get(n - 1) {
                    Some(MockOutcome::Result(v)) => Ok(v.clone()),
                    Some(MockOutcome::Error { kind, message, details }) => {
                        Err(fail(asl, kind.as_deref(), message.clone(), details.clone()))
                    }
                    None => {
                        rec.problems.push(Failure {
                            path: format!("/mocks/{}", esc(key)),
                            expected: json!(format!("at most {} calls", list.len())),
                            actual: Some(json!(format!("call {n}"))),
                        });
                        Err(fail(
                            asl,
                            None,
                            format!("the mock of {key:?} has {} results and this is call {n}", list.len()),
                            None,
                        ))
                    }
                }
            }
        }
    }
}

/// A failed call: SM4C errors of `kind` (default `functionError`); ASL errors named `kind`
/// (default `States.TaskFailed`) with `message` as their cause.
fn fail(asl: bool, kind: Option<&str>, message: String, details: Option<Value>) -> ErrorInfo {
    if asl {
        let name = kind.unwrap_or("States.TaskFailed");
        ErrorInfo::new(ErrorKind::FunctionError, message.clone()).with_details(json!({"Error": name, "Cause": message}))
    } else {
        let mut e = ErrorInfo::new(
            kind.map_or(ErrorKind::FunctionError, |k| ErrorKind::from(k.to_string())),
            message,
        );
        e.details = details;
        e
    }
}

impl Functions for TestFunctions {
    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
        let result = self.answer(&call);
        Box::pin(std::future::ready(result))
    }

    fn send_event(&self, event: Value) -> BoxFuture<'static, Result<(), ErrorInfo>> {
        self.record.lock().unwrap_or_else(|p| p.into_inner()).sent.push(event);
        Box::pin(std::future::ready(Ok(())))
    }

    fn subflow(&self, id: &str) -> Option<Arc<Machine>> {
        let found = self.subflows.get(id).cloned();
        let mut rec = self.record.lock().unwrap_or_else(|p| p.into_inner());
        rec.subflows.push(id.to_string());
        if let Some(m) = &found {
            rec.started.push(m.clone());
        }
        found
    }
}

/// What one run of a definition gave.
pub struct Ran {
    /// What the expectations read.
    pub actual: Actual,
    /// The pointers of the transitions, handlers and actions taken (see [`Trace::Covered`]).
    pub covered: BTreeSet<String>,
    /// The traces of the instance under test, in order.
    pub traces: Vec<Trace>,
    /// Calls the mocks could not answer.
    pub problems: Vec<Failure>,
    /// The ids of the subflows started, in order.
    pub subflows: Vec<String>,
    /// What the subflows' instances reached, by definition id.
    pub children: Vec<(String, super::coverage::Reached)>,
    /// How the instance ended, in one line, when it did not complete.
    pub note: Option<String>,
}

/// What an instance is given to run.
pub struct Setup<'a> {
    /// The definition.
    pub machine: Arc<Machine>,
    /// The input.
    pub input: Value,
    /// Mocks by function name.
    pub mocks: HashMap<String, Mock>,
    /// Events in its inbox at the start.
    pub events: Vec<Value>,
    /// Subflows by id.
    pub subflows: &'a HashMap<String, Arc<Machine>>,
    /// Whether time is virtual.
    pub virtual_time: bool,
    /// Run as a schedule's run: the schedule and the nominal time (the virtual clock starts at it).
    pub scheduled: Option<Scheduled>,
    /// Transitions one input may cause.
    pub max_transitions: u64,
}

/// Runs one instance until it ends or can do nothing more, and collects what it did.
pub fn run(setup: Setup) -> Result<Ran, String> {
    let is_asl = setup.machine.asl.is_some();
    let functions = Arc::new(TestFunctions::new(setup.mocks, setup.subflows.clone()));
    let traces: Arc<Mutex<Vec<(String, Trace)>>> = Arc::default();
    let into = traces.clone();
    let sink: TraceSink = Arc::new(move |id: &str, t: &Trace| {
        into.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id.to_string(), t.clone()));
    });
    let config = Config {
        clock: if setup.virtual_time {
            Clock::Virtual {
                start: setup.scheduled.as_ref().map_or(VIRTUAL_START, |s| s.nominal_time),
            }
        } else {
            Clock::Real
        },
        options: Options {
            journal: false,
            trace: true,
            coverage: true,
            max_transitions: setup.max_transitions,
            ..Options::default()
        },
        trace: Some(sink),
        ..Config::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime for the test: {e}"))?;
    let host_functions = functions.clone();
    let outcome = rt.block_on(async move {
        let host = InMemoryHost::new(host_functions, config);
        let id = host
            .start_scheduled(
                setup.machine,
                Some(ROOT.into()),
                setup.input,
                setup.events,
                setup.scheduled,
            )
            .await;
        host.settle(&id).await
    });
    let all = std::mem::take(&mut *traces.lock().unwrap_or_else(|p| p.into_inner()));
    let record = functions.take();
    let children = children(&all, &record.started);
    let traces: Vec<Trace> = all.into_iter().filter(|(id, _)| id == ROOT).map(|(_, t)| t).collect();
    let mut covered = BTreeSet::new();
    let mut states = Vec::new();
    for t in &traces {
        match t {
            Trace::StateEntered { state } => states.push(Value::String(state.clone())),
            Trace::Covered { pointer } => {
                covered.insert(pointer.clone());
            }
            _ => {}
        }
    }
    let error = outcome.error.as_ref().map(|e| {
        if is_asl {
            e.details
                .clone()
                .filter(|d| d.get("Error").is_some())
                .unwrap_or_else(|| json!({"Error": e.kind.as_str(), "Cause": e.message}))
        } else {
            e.to_json()
        }
    });
    let note = match (&outcome.status, &outcome.error) {
        (Status::Completed, _) => None,
        (status, Some(e)) => Some(format!(
            "the instance ended {} in state {:?}: {}",
            status.as_str(),
            e.state.as_deref().or(outcome.state.as_deref()).unwrap_or("?"),
            e.message
        )),
        (status, None) => Some(format!(
            "the instance is {} in state {:?}: it waits for events that never arrive, or for a timer{}",
            status.as_str(),
            outcome.state.as_deref().unwrap_or("?"),
            if setup.virtual_time {
                ""
            } else {
                " (virtualTime is false)"
            }
        )),
    };
    Ok(Ran {
        actual: Actual {
            status: outcome.status.as_str().to_string(),
            states,
            data: outcome.data,
            sent: record.sent,
            error,
            calls: record.calls,
        },
        covered,
        traces,
        problems: record.problems,
        subflows: record.subflows,
        children,
        note,
    })
}

/// The start state of a definition.
fn start_state(m: &Machine) -> Option<&str> {
    match &m.asl {
        Some(asl) => asl
            .graphs
            .first()
            .and_then(|g| g.states.get(g.start))
            .map(|s| s.name.as_str()),
        None => m.states.get(m.start).map(|s| s.name.as_str()),
    }
}

/// What each subflow instance reached, by its definition's id. The in-memory host starts
/// children in the order it asks for their definitions, and a child's first trace is its start
/// state: the n-th instance seen after the one under test runs the n-th definition asked for.
/// A child whose first state is not its definition's start state is not counted (and no later
/// one either): coverage is never given to the wrong definition.
fn children(all: &[(String, Trace)], started: &[Arc<Machine>]) -> Vec<(String, super::coverage::Reached)> {
    let mut order: Vec<&str> = Vec::new();
    for (id, _) in all {
        if id != ROOT && !order.contains(&id.as_str()) {
            order.push(id);
        }
    }
    let mut out = Vec::new();
    for (id, m) in order.into_iter().zip(started) {
        let mut reached = super::coverage::Reached::default();
        let mut first = true;
        for (_, t) in all.iter().filter(|(i, _)| i == id) {
            match t {
                Trace::StateEntered { state } => {
                    if first && Some(state.as_str()) != start_state(m) {
                        return out;
                    }
                    first = false;
                    reached.states.insert(state.clone());
                }
                Trace::Covered { pointer } => {
                    reached.pointers.insert(pointer.clone());
                }
                _ => {}
            }
        }
        out.push((m.id.clone(), reached));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sm4c_runtime::{load, no_files, LoadOptions};

    fn def(id: &str, start: &str) -> Arc<Machine> {
        let doc = json!({"id": id, "name": id, "version": "1",
            "states": [{"name": start, "start": true, "transitions": [{"nextState": "End"}]}, {"name": "End"}]});
        Arc::new(load(&doc, &mut no_files, LoadOptions::default()).unwrap())
    }

    fn entered(id: &str, state: &str) -> (String, Trace) {
        (id.into(), Trace::StateEntered { state: state.into() })
    }

    #[test]
    fn children_are_matched_to_their_definitions_in_start_order() {
        let (a, b) = (def("a", "A0"), def("b", "B0"));
        let all = vec![
            entered(ROOT, "S"),
            entered("test/1", "A0"),
            entered("test/2", "B0"),
            (
                "test/1".into(),
                Trace::Covered {
                    pointer: "/states/0/transitions/0".into(),
                },
            ),
            entered("test/1", "End"),
        ];
        let got = children(&all, &[a.clone(), b.clone()]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, "a");
        assert_eq!(got[0].1.states, ["A0".to_string(), "End".to_string()].into());
        assert_eq!(got[0].1.pointers, ["/states/0/transitions/0".to_string()].into());
        assert_eq!((got[1].0.as_str(), got[1].1.states.len()), ("b", 1));
        // Out of order: the first child does not start where its definition starts; nothing counts.
        assert!(children(&all, &[b, a]).is_empty());
    }
}
