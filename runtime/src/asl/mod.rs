//! The Amazon States Language (ASL) on the engine: definitions recognised by their top-level
//! `StartAt` and `States`, validated into an [`AslMachine`] and run by the same deterministic
//! engine as SM4C (same inputs, effects, journal and snapshots).
//!
//! - [`path`]: JSONPath (`$`, `$$`, `$var`) reading, and Reference Paths for `ResultPath`;
//! - [`template`]: payload templates (`Parameters`, `ResultSelector`, `ItemSelector`, `.$` keys);
//! - [`intrinsics`]: the `States.*` intrinsic functions;
//! - [`choice`]: Choice rules and timestamps;
//! - [`jsonata`]: `QueryLanguage: "JSONata"` expressions (`{% ... %}`).

pub mod choice;
pub mod engine;
pub mod intrinsics;
#[cfg(feature = "jsonata")]
pub mod jsonata;
#[cfg(not(feature = "jsonata"))]
#[path = "jsonata_off.rs"]
pub mod jsonata;
#[cfg(feature = "jsonata")]
mod jsonata_regex;
pub mod model;
pub mod path;
pub mod template;

use crate::engine::{ErrorInfo, ErrorKind};
use crate::kernel::Random;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::cell::Cell;

/// An ASL error: the `Error` name (`States.Runtime`, a task's own name, ...) and its `Cause`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AslError {
    /// The error name; `None` only for a Fail state that names none.
    pub error: Option<String>,
    /// The cause, when there is one.
    pub cause: Option<String>,
}

/// The predefined error names.
pub mod names {
    /// Matches every error name (except `States.Runtime`, which nothing catches).
    pub const ALL: &str = "States.ALL";
    /// A fault in the execution: a path that does not match, a value of the wrong type.
    pub const RUNTIME: &str = "States.Runtime";
    /// A task failed; in a retrier or catcher it matches every task error.
    pub const TASK_FAILED: &str = "States.TaskFailed";
    /// A task ran longer than `TimeoutSeconds`.
    pub const TIMEOUT: &str = "States.Timeout";
    /// A task sent no heartbeat within `HeartbeatSeconds`.
    pub const HEARTBEAT_TIMEOUT: &str = "States.HeartbeatTimeout";
    /// An intrinsic function failed.
    pub const INTRINSIC_FAILURE: &str = "States.IntrinsicFailure";
    /// A JSONata expression failed.
    pub const QUERY_EVALUATION_ERROR: &str = "States.QueryEvaluationError";
    /// A Choice state matched no rule and has no `Default`.
    pub const NO_CHOICE_MATCHED: &str = "States.NoChoiceMatched";
    /// A payload template's path did not match.
    pub const PARAMETER_PATH_FAILURE: &str = "States.ParameterPathFailure";
    /// A `ResultPath` could not be applied.
    pub const RESULT_PATH_MATCH_FAILURE: &str = "States.ResultPathMatchFailure";
    /// A branch of a Parallel state failed.
    pub const BRANCH_FAILED: &str = "States.BranchFailed";
    /// A Map state's failures passed its tolerated threshold.
    pub const EXCEED_TOLERATED_FAILURE_THRESHOLD: &str = "States.ExceedToleratedFailureThreshold";
}

impl AslError {
    /// An error with a name and a cause.
    pub fn new(error: impl Into<String>, cause: impl Into<String>) -> AslError {
        AslError {
            error: Some(error.into()),
            cause: Some(cause.into()),
        }
    }

    /// `States.Runtime` with a cause.
    pub fn runtime(cause: impl Into<String>) -> AslError {
        AslError::new(names::RUNTIME, cause)
    }

    /// `States.IntrinsicFailure` with a cause.
    pub fn intrinsic(cause: impl Into<String>) -> AslError {
        AslError::new(names::INTRINSIC_FAILURE, cause)
    }

    /// `States.QueryEvaluationError` with a cause.
    pub fn query(cause: impl Into<String>) -> AslError {
        AslError::new(names::QUERY_EVALUATION_ERROR, cause)
    }

    /// The error as Step Functions writes it: `{"Error": ..., "Cause": ...}`, a field absent when
    /// there is none.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if let Some(e) = &self.error {
            m.insert("Error".into(), Value::String(e.clone()));
        }
        if let Some(c) = &self.cause {
            m.insert("Cause".into(), Value::String(c.clone()));
        }
        Value::Object(m)
    }
}

/// What paths, payload templates, intrinsic functions and Choice rules evaluate against.
pub struct Env<'a> {
    /// What `$` refers to.
    pub input: &'a Value,
    /// The context object, what `$$` refers to.
    pub context: &'a Value,
    /// The variables in scope (`$name`), already merged from the enclosing scopes.
    pub vars: &'a Map<String, Value>,
    /// The instance's deterministic random source (`States.MathRandom`, `States.UUID`); draw
    /// with [`Env::random`].
    pub rng: &'a Cell<Random>,
}

impl Env<'_> {
    /// The next 64 random bits of the instance's deterministic source (splitmix64).
    pub fn random(&self) -> u64 {
        let mut rng = self.rng.get();
        let bits = rng.next_u64();
        self.rng.set(rng);
        bits
    }
}

impl AslError {
    /// The error as the engine's [`ErrorInfo`]: its kind is the error name, its message the cause,
    /// and its details `{"Error", "Cause"}` exactly as Step Functions reports them.
    pub fn to_info(&self, state: Option<&str>) -> ErrorInfo {
        let mut e = ErrorInfo::new(
            ErrorKind::Other(self.error.clone().unwrap_or_default()),
            self.cause.clone().unwrap_or_default(),
        )
        .with_details(self.to_json());
        e.state = state.map(str::to_string);
        e
    }

    /// The ASL error a function call's failure stands for: a failure that names its `Error` (a
    /// mock's `error({"Error": ..., "Cause": ...})`, a worker's answer) keeps it; any other function
    /// failure is `States.TaskFailed` with the message as its cause; a timeout is `States.Timeout`.
    pub fn from_info(e: &ErrorInfo) -> AslError {
        if let Some(Value::Object(d)) = &e.details {
            let text = |k: &str| match d.get(k) {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Null) | None => None,
                Some(other) => Some(other.to_string()),
            };
            if d.contains_key("Error") {
                return AslError {
                    error: text("Error"),
                    cause: text("Cause"),
                };
            }
            // A child execution that failed: its own error (an ASL child's is in its details).
            if let (ErrorKind::SubflowError, Some(Value::Object(child))) = (&e.kind, d.get("error")) {
                if let Some(Value::Object(asl)) = child.get("details") {
                    if asl.contains_key("Error") || asl.contains_key("Cause") {
                        return AslError::from_info(
                            &ErrorInfo::new(ErrorKind::Other(String::new()), "")
                                .with_details(Value::Object(asl.clone())),
                        );
                    }
                }
                let kind = child.get("type").and_then(Value::as_str).unwrap_or("States.TaskFailed");
                let message = child.get("message").and_then(Value::as_str).map(str::to_string);
                return AslError {
                    error: Some(kind.to_string()),
                    cause: message,
                };
            }
        }
        let cause = (!e.message.is_empty()).then(|| e.message.clone());
        match &e.kind {
            ErrorKind::Timeout => AslError {
                error: Some(names::TIMEOUT.into()),
                cause,
            },
            // One name on both sides: `Retry`/`Catch` name it as SM4C error handlers do.
            ErrorKind::StepInterrupted => AslError {
                error: Some(e.kind.as_str().into()),
                cause,
            },
            ErrorKind::Other(name) if !name.is_empty() => AslError {
                error: Some(name.clone()),
                cause,
            },
            _ => AslError {
                error: Some(names::TASK_FAILED.into()),
                cause,
            },
        }
    }
}

/// Checks that a saved execution fits its machine (every graph and state index exists).
pub fn fits(m: &model::AslMachine, s: &crate::engine::Snapshot) -> Result<(), String> {
    fn run_fits(m: &model::AslMachine, r: &engine::Run) -> bool {
        let ok = m.graphs.get(r.graph).is_some_and(|g| r.state < g.states.len());
        ok && match &r.step {
            engine::Step::Children { slots, .. } => slots.iter().all(|s| match s {
                engine::Slot::Running { run } => run_fits(m, run),
                _ => true,
            }),
            _ => true,
        }
    }
    match &s.asl {
        Some(exec) if !run_fits(m, &exec.root) => Err("it is in a state the definition no longer has".into()),
        _ => Ok(()),
    }
}

/// Handles one input of an ASL execution (the engine's [`crate::Instance::handle`] for ASL).
pub fn handle(
    m: &model::AslMachine,
    s: &mut crate::engine::Snapshot,
    input: crate::engine::Input,
    options: crate::engine::Options,
    out: &mut crate::engine::Output,
) {
    use crate::engine::{Input, Status, Trace, EXEC_TIMER};
    if s.status.is_final() {
        return;
    }
    if let Input::Start { .. } = &input {
        if s.status != Status::Created {
            return;
        }
    } else if s.asl.is_none() {
        return;
    }
    let mut exec = s.asl.take();
    let exec_input = match (&input, &mut exec) {
        (Input::Start { data, .. }, _) => data.clone(),
        (_, Some(e)) => std::mem::take(&mut e.input),
        (_, None) => Value::Null,
    };
    let started = s.started_at.unwrap_or(s.now);
    let mut cx = engine::Cx {
        m,
        definition: &s.definition,
        id: &s.id,
        exec_input: &exec_input,
        started,
        scheduled: s.scheduled.as_ref(),
        now: s.now,
        rng: Cell::new(s.rng),
        timers: &mut s.timers,
        out,
        options,
        burst: 0,
        top_state: None,
    };
    let mut ended: Option<(Status, Option<AslError>)> = None;
    match input {
        Input::Start { .. } => {
            let root = engine::start(&mut cx);
            exec = Some(Box::new(engine::Exec {
                input: Value::Null,
                root,
            }));
        }
        Input::Completed { op, result } => {
            if let Some(e) = &mut exec {
                engine::deliver(&mut cx, &mut e.root, &engine::Delivery::Completed(&op, &result));
            }
        }
        Input::Failed { op, error } => {
            if let Some(e) = &mut exec {
                let err = AslError::from_info(&error);
                engine::deliver(&mut cx, &mut e.root, &engine::Delivery::Failed(&op, &err));
            }
        }
        Input::TaskStarted { op, .. } | Input::TaskHeartbeat { op, .. } => {
            if let Some(e) = &mut exec {
                engine::deliver(&mut cx, &mut e.root, &engine::Delivery::Alive(&op));
            }
        }
        Input::TimerFired { timer } => {
            if let Some(e) = &mut exec {
                if timer == EXEC_TIMER {
                    cx.timers.remove(EXEC_TIMER);
                    engine::cancel(&mut cx, &mut e.root);
                    ended = Some((
                        Status::TimedOut,
                        Some(AslError {
                            error: Some(names::TIMEOUT.into()),
                            cause: Some("the execution ran longer than its TimeoutSeconds".into()),
                        }),
                    ));
                } else {
                    engine::deliver(&mut cx, &mut e.root, &engine::Delivery::Timer(&timer));
                }
            }
        }
        Input::Redrive { .. } => {
            if let Some(e) = &mut exec {
                engine::redrive_root(&mut cx, &mut e.root);
            }
        }
        Input::Event { .. } | Input::Debug { .. } | Input::Resume { .. } | Input::Migrate { .. } => {}
        Input::Abort { error } => {
            if let Some(e) = &mut exec {
                engine::cancel(&mut cx, &mut e.root);
            }
            let timers: Vec<String> = cx.timers.keys().cloned().collect();
            drop(cx);
            for t in timers {
                s.timers.remove(&t);
            }
            s.asl = exec;
            s.status = Status::Failed;
            // The host ended it: a redrive cannot go on from there.
            if let Some(r) = s.redrive.as_mut() {
                r.point = None;
            }
            s.error = Some(error);
            s.ended_at = Some(s.now);
            if options.trace {
                out.entries
                    .push(crate::engine::Entry::Trace(Trace::Finished { status: Status::Failed }));
            }
            if let Some(e) = &mut s.asl {
                e.input = exec_input;
            }
            return;
        }
        Input::Cancel { .. } => {
            if let Some(e) = &mut exec {
                engine::cancel(&mut cx, &mut e.root);
            }
            ended = Some((Status::Cancelled, None));
        }
    }
    let top_state = cx.top_state.take();
    let rng = cx.rng.get();
    if ended.is_none() {
        if let Some(e) = &exec {
            ended = match engine::outcome(&e.root) {
                Some(engine::Outcome::Output(_)) => Some((Status::Completed, None)),
                Some(engine::Outcome::Error(err)) => Some((Status::Failed, Some(err.clone()))),
                None => None,
            };
        }
    }
    if ended.is_some() && cx.timers.contains_key(EXEC_TIMER) {
        cx.cancel_timer_pub(EXEC_TIMER);
    }
    drop(cx);
    s.rng = rng;
    if let Some(t) = top_state {
        s.state_name = Some(t);
    }
    if let Some(e) = &mut exec {
        e.input = exec_input;
    }
    match ended {
        None => {
            s.status = Status::Waiting;
            // What `show` gives of a running execution: the input of the machine's current state.
            if let Some(e) = &exec {
                s.data = crate::engine::J(crate::json::to_val(&e.root.input));
            }
        }
        Some((status, err)) => {
            if let Some(e) = &exec {
                if let Some(engine::Outcome::Output(v)) = engine::outcome(&e.root) {
                    s.data = crate::engine::J(crate::json::to_val(v));
                }
            }
            s.timers.clear();
            s.status = status;
            // A redrive enters the top-level state it failed or timed out in again.
            if matches!(status, Status::Failed | Status::TimedOut) {
                s.redrive.get_or_insert_with(Default::default).point = Some(crate::engine::redrive::Point::State);
            } else if let Some(r) = s.redrive.as_mut() {
                r.point = None;
            }
            s.error = err.map(|e| e.to_info(s.state_name.as_deref()));
            s.ended_at = Some(s.now);
            if options.trace {
                out.entries
                    .push(crate::engine::Entry::Trace(Trace::Finished { status }));
            }
        }
    }
    s.asl = exec;
}
