//! Redrive: a failed or timed-out instance goes back to running from where it failed.
//!
//! When an SM4C instance fails or times out, the engine keeps the point it failed at as a
//! [`Point`] in the snapshot ([`Redrives`]). [`Instance::redrive_plan`] checks that the instance
//! can go on, applies the operator's update (a jq expression over the data) and says what the
//! redrive would do; the host then delivers the [`Input::Redrive`] it gives, which the journal
//! records like any input, so replay redrives the same way.
//!
//! What runs again (SM4C): inside an action, every action that was still running when the
//! instance failed: the one whose failure ended it (its attempts counted afresh, from 1) and
//! those its failure cancelled (siblings in a `parallel` or `foreach`); the actions of the state
//! that had finished are not run again. They start again with new operation ids (the path gets
//! `~r<n>` for the n-th redrive) and, but for `foreach` items, with the input the data gives
//! after the update. A failure outside a running action goes on from that step: a result handler
//! that failed runs again with the action's result, an action that failed as it started starts
//! again, transitions whose conditions failed (or none held) are evaluated again; that step
//! counts as a new visit of the state, so what it starts has new operation and timer ids. An ASL
//! execution re-enters the top-level state that failed, with its Retry counters at zero (a
//! Parallel or Map runs all its branches or iterations again). The execution timeout, when the
//! definition has one, counts afresh from the redrive.

use super::action::{Node, Run};
use super::{Instance, Next, Phase, EXEC_TIMER};
use crate::engine::types::{ErrorKind, Input, Status, Trace, J};
use crate::json::{from_val, to_val};
use crate::model::StateId;
use jaq_json::Val;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where a failed or timed-out SM4C instance goes on from when redriven.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "at", rename_all = "camelCase")]
pub enum Point {
    /// Inside an action: the phase as it was before the input that failed it (or before the
    /// execution timeout). The actions still running in it start again.
    Action {
        /// The phase.
        phase: Box<Phase>,
    },
    /// The state's enter action, from its start (it failed as it started).
    EnterAction,
    /// Transition `transition`'s action, from its start.
    TransitionAction {
        /// The transition's index.
        transition: usize,
    },
    /// The exit action before entering `next`, from its start.
    ExitAction {
        /// The state to enter afterwards.
        next: StateId,
    },
    /// The enter action's result handler, with the action's result (see [`MAX_KEPT_RESULT`]).
    Entered {
        /// The result.
        value: J,
    },
    /// Transition `transition`'s result handler, with its action's result.
    Fired {
        /// The transition's index.
        transition: usize,
        /// The result.
        value: J,
    },
    /// The exit action's result handler, with its result, before entering `next`.
    Exited {
        /// The state to enter afterwards.
        next: StateId,
        /// The result.
        value: J,
    },
    /// The state's transitions, evaluated again.
    Evaluate,
    /// ASL: the top-level state the execution failed in, entered again.
    State,
}

impl Point {
    /// Where it goes on from, as `history` and the redrive's answer say it.
    fn describe(&self, m: &crate::model::Machine, state: Option<StateId>) -> String {
        let here = state.and_then(|s| m.states.get(s)).map_or("", |s| s.name.as_str());
        match self {
            Point::Action { phase } => {
                let mut ops = Vec::new();
                if let Phase::Enter { run }
                | Phase::Transition { run, .. }
                | Phase::Exit { run, .. }
                | Phase::TimeoutAction { run } = &**phase
                {
                    leaves(run, &mut ops);
                }
                format!("state {here:?}, action {}", ops.join(", "))
            }
            Point::EnterAction | Point::Entered { .. } => format!("state {here:?}, enter action"),
            Point::TransitionAction { transition } | Point::Fired { transition, .. } => {
                format!("state {here:?}, transition {transition}")
            }
            Point::ExitAction { .. } | Point::Exited { .. } => format!("state {here:?}, exit action"),
            Point::Evaluate => format!("state {here:?}, its transitions"),
            Point::State => "state".into(),
        }
    }
}

/// Most bytes (about, written out as JSON) of an action's result a failed result handler keeps for
/// a redrive; a larger result is not kept, and the redrive runs the action again instead.
pub const MAX_KEPT_RESULT: u64 = 8 << 20;

/// Where a redrive goes on from after result handler `handler` failed on `value`: the handler
/// with the value when the value is small enough to keep ([`MAX_KEPT_RESULT`]), else the action
/// (`again`) from its start. A value shared with itself (`[., .]` forty times) is small in memory
/// and huge written out: it is measured as written, and the measure stops at the bound.
pub(super) fn after_handler(value: Val, keep: impl FnOnce(J) -> Point, again: Point) -> Point {
    let mut budget = MAX_KEPT_RESULT;
    let mut stack = vec![&value];
    let mut fits = true;
    while let Some(v) = stack.pop() {
        let cost = match v {
            Val::TStr(s) | Val::BStr(s) => s.len() as u64 + 2,
            Val::Arr(a) => {
                stack.extend(a.iter());
                2
            }
            Val::Obj(o) => {
                stack.extend(o.values());
                2 + 16 * o.len() as u64
            }
            _ => 8,
        };
        if cost > budget {
            fits = false;
            break;
        }
        budget -= cost;
    }
    drop(stack);
    if fits {
        keep(J(value))
    } else {
        again
    }
}

/// The paths of the actions still running in `run` (those a redrive starts again).
fn leaves(run: &Run, out: &mut Vec<String>) {
    match &run.node {
        Node::Sequence { child, .. } => leaves(child, out),
        Node::Parallel { running, .. } | Node::Foreach { running, .. } => {
            for (_, r) in running {
                leaves(r, out);
            }
        }
        _ => out.push(run.path.clone()),
    }
}

/// What the snapshot keeps for redrives; absent until the instance first fails or times out.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Redrives {
    /// Times the instance was redriven.
    #[serde(default)]
    pub count: u32,
    /// Where it goes on from, while it is failed or timed out and can go on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point: Option<Point>,
}

/// What a redrive does (or would do): the answer of `POST /instances/{id}/redrive`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RedrivePlan {
    /// Where the instance goes on from.
    pub from: String,
    /// Its redrives once this one is made.
    pub redrives: u32,
    /// The data after the update (ASL: the failed state's input).
    pub data: Value,
    /// What the update changes, as an RFC 6902 JSON Patch.
    pub diff: Vec<Value>,
    /// The input that makes the redrive (deliver it, at the time given, to redrive).
    #[serde(skip)]
    pub input: Input,
}

/// Why an instance cannot be redriven; nothing changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RedriveError {
    /// The instance cannot go on (`reason` is a fixed code).
    #[error("{message}")]
    NotRedrivable {
        /// `completed`, `cancelled`, `running`, `limitReached`, `cannotResume` or `failState`.
        reason: &'static str,
        /// The whole message.
        message: String,
    },
    /// The update does not compile, fails, or (SM4C) does not yield an object.
    #[error("{0}")]
    Update(String),
}

impl RedriveError {
    fn refuse(reason: &'static str, message: String) -> RedriveError {
        RedriveError::NotRedrivable { reason, message }
    }
}

impl Instance {
    /// Whether the instance can be redriven (given at most `cap` redrives, unless its definition
    /// says another number: SM4C `maxRedrives`), what the `update` (a
    /// jq expression over its data) makes of its data, and the input that redrives it. Changes
    /// nothing.
    pub fn redrive_plan(&self, update: Option<&str>, cap: Option<u32>) -> Result<RedrivePlan, RedriveError> {
        let id = &self.s.id;
        match self.s.status {
            Status::Failed | Status::TimedOut => {}
            Status::Completed => {
                return Err(RedriveError::refuse(
                    "completed",
                    format!("instance {id:?} completed: only a failed or timed-out instance can be redriven"),
                ))
            }
            Status::Cancelled => {
                return Err(RedriveError::refuse(
                    "cancelled",
                    format!("instance {id:?} was cancelled: only a failed or timed-out instance can be redriven"),
                ))
            }
            other => {
                return Err(RedriveError::refuse(
                    "running",
                    format!(
                        "instance {id:?} is {}: only a failed or timed-out instance can be redriven",
                        other.as_str()
                    ),
                ))
            }
        }
        let count = self.s.redrive.as_ref().map_or(0, |r| r.count);
        let Some(point) = self.s.redrive.as_ref().and_then(|r| r.point.as_ref()) else {
            let (kind, message) = self.s.error.as_ref().map_or(("unknown".into(), String::new()), |e| {
                (e.kind.to_string(), e.message.clone())
            });
            let why = match self.s.error.as_ref().map(|e| &e.kind) {
                Some(ErrorKind::ReplayMismatch) => {
                    "the host ended it because its journal no longer replays against its definition"
                }
                Some(ErrorKind::CorruptRecord) => "the host ended it because a stored record of it cannot be read",
                Some(ErrorKind::LimitExceeded) => {
                    "it reached a limit (it looped, or its journal or inbox grew too large)"
                }
                _ => "the host ended it, or it failed outside any step it can go on from",
            };
            return Err(RedriveError::refuse(
                "cannotResume",
                format!("instance {id:?} failed with {kind} ({message}), which cannot resume: {why}"),
            ));
        };
        if let Some(cap) = self.machine.max_redrives.or(cap) {
            if count >= cap {
                return Err(RedriveError::refuse(
                    "limitReached",
                    format!(
                        "instance {id:?} was redriven {count} time{}, the most allowed ({cap})",
                        if count == 1 { "" } else { "s" }
                    ),
                ));
            }
        }
        let from = match (&self.machine.asl, point) {
            (Some(asl), _) => {
                let root = self.s.asl.as_ref().map(|e| &e.root);
                let st = root.and_then(|r| asl.graphs[r.graph].states.get(r.state));
                if let Some(st) = st {
                    if matches!(st.kind, crate::asl::model::Kind::Fail { .. }) {
                        return Err(RedriveError::refuse(
                            "failState",
                            format!(
                                "instance {id:?} ended in its Fail state {:?}: the definition itself failed it, and entering it again would fail it again",
                                st.name
                            ),
                        ));
                    }
                }
                format!("state {:?}", st.map_or("", |s| s.name.as_str()))
            }
            (None, p) => p.describe(&self.machine, self.s.state),
        };
        let before = self.redrive_data();
        let after = match update {
            None => before.clone(),
            Some(text) => {
                let expr = crate::expr::Expr::compile(text, &[], crate::expr::Limits::default())
                    .map_err(|e| RedriveError::Update(format!("the update does not compile: {e}")))?;
                // SM4C data is an object; an ASL state's input may be any value.
                let asl = self.machine.asl.is_some();
                match expr.eval(to_val(&before), Val::Null) {
                    Ok(v @ Val::Obj(_)) => from_val(&v),
                    Ok(v) if asl => from_val(&v),
                    Ok(v) => {
                        return Err(RedriveError::Update(format!(
                            "the update must yield an object (the instance data), not {}",
                            crate::json::kind(&from_val(&v))
                        )))
                    }
                    Err(e) => return Err(RedriveError::Update(format!("the update failed: {}", e.message))),
                }
            }
        };
        let diff: Vec<Value> = match serde_json::to_value(json_patch::diff(&before, &after)) {
            Ok(Value::Array(ops)) => ops,
            _ => Vec::new(),
        };
        Ok(RedrivePlan {
            from,
            redrives: count + 1,
            data: after,
            diff: diff.clone(),
            input: Input::Redrive {
                update: update.map(str::to_string),
                diff,
            },
        })
    }

    /// The data an update reads: SM4C the instance data, ASL the failed state's input.
    fn redrive_data(&self) -> Value {
        match &self.s.asl {
            Some(exec) => exec.root.input.clone(),
            None => from_val(&self.s.data.0),
        }
    }

    /// Handles an [`Input::Redrive`] (recorded already); does nothing for an instance that cannot
    /// be redriven (the host checks with [`Instance::redrive_plan`] first).
    pub(super) fn redrive_in(&mut self, out: &mut super::Output, diff: &[Value]) {
        let count = self.s.redrive.as_ref().map_or(0, |r| r.count);
        let capped = self.machine.max_redrives.is_some_and(|cap| count >= cap);
        if capped || !matches!(self.s.status, Status::Failed | Status::TimedOut) {
            return;
        }
        let Some(point) = self.s.redrive.as_mut().and_then(|r| r.point.take()) else {
            return;
        };
        let mut data = self.redrive_data();
        if !diff.is_empty() {
            let Ok(patch) = serde_json::from_value::<json_patch::Patch>(Value::Array(diff.to_vec())) else {
                return;
            };
            if json_patch::patch(&mut data, &patch).is_err() {
                return;
            }
        }
        let count = match self.s.redrive.as_mut() {
            Some(r) => {
                r.count += 1;
                r.count
            }
            None => return,
        };
        let from = match &self.machine.asl {
            Some(_) => format!("state {:?}", self.s.state_name.as_deref().unwrap_or("")),
            None => point.describe(&self.machine, self.s.state),
        };
        self.cx(out).trace(|| Trace::Redriven { from, redrives: count });
        self.s.error = None;
        self.s.ended_at = None;
        if let Some(asl) = self.machine.asl.clone() {
            // The failed state's input becomes the data after the update; the state is entered again.
            if let Some(e) = self.s.asl.as_mut() {
                e.root.input = data;
            }
            self.s.status = Status::Running;
            let input = Input::Redrive {
                update: None,
                diff: Vec::new(),
            };
            crate::asl::handle(&asl, &mut self.s, input, self.options, out);
            return;
        }
        self.s.data = J(to_val(&data));
        self.s.status = Status::Running;
        self.s.phase = Phase::Idle;
        if let Some(t) = &self.machine.timeout {
            let ms = t.duration_ms;
            self.cx(out).start_timer(EXEC_TIMER, ms);
        }
        // A step that starts again counts as a new visit of the state, so the operations and
        // timers it starts have ids of their own (a late answer to one of the failed run's
        // operations cannot be taken for a new one's).
        if !matches!(point, Point::Action { .. }) {
            self.s.visit += 1;
        }
        let next = match point {
            Point::Action { phase } => {
                self.restart(out, *phase, count);
                Next::Stop
            }
            Point::EnterAction => Next::EnterAction,
            Point::TransitionAction { transition } => Next::TransitionAction(transition),
            Point::ExitAction { next } => Next::ExitAction(next),
            Point::Entered { value } => Next::Entered(value.0),
            Point::Fired { transition, value } => Next::Fired(transition, value.0),
            Point::Exited { next, value } => Next::Exited(next, value.0),
            Point::Evaluate | Point::State => Next::Evaluate,
        };
        self.drive(out, next);
    }

    /// Puts the phase an action failed in back, every action still running in it made to start
    /// again (attempt 1, a new operation id) on a timer due now.
    fn restart(&mut self, out: &mut super::Output, phase: Phase, count: u32) {
        let mut phase = phase;
        let view = self.view().ok();
        let suffix = format!("~r{count}");
        let mut cx = self.cx(out);
        match &mut phase {
            Phase::Enter { run } | Phase::Transition { run, .. } | Phase::Exit { run, .. } => {
                restart_run(&mut cx, run, view, &suffix)
            }
            Phase::TimeoutAction { run } => restart_run(&mut cx, run, None, &suffix),
            _ => {}
        }
        self.s.phase = phase;
    }
}

/// Makes every action still running in `run` start again; `input` is the run's new input (none:
/// it keeps its own, as `foreach` items do).
fn restart_run(cx: &mut super::Cx, run: &mut Run, input: Option<Val>, suffix: &str) {
    if let Some(v) = input {
        run.input = J(v);
    }
    let own = &run.input.0;
    match &mut run.node {
        Node::Sequence { child, .. } => restart_run(cx, child, Some(own.clone()), suffix),
        Node::Parallel { running, .. } => {
            for (_, r) in running.iter_mut() {
                restart_run(cx, r, Some(own.clone()), suffix);
            }
        }
        Node::Foreach { running, .. } => {
            for (_, r) in running.iter_mut() {
                restart_run(cx, r, None, suffix);
            }
        }
        Node::Call { .. } | Node::Task { .. } | Node::Delay { .. } | Node::Backoff { .. } => {
            // A wait before attempt 1 that is due at once: when it fires, the action starts as a
            // retry would, and what it gives reaches its parents the usual way.
            run.path.push_str(suffix);
            run.attempt = 0;
            run.started = cx.now;
            let timer = format!("{}:redrive", run.path);
            cx.start_timer(&timer, 0);
            run.node = Node::Backoff { timer };
        }
    }
}
