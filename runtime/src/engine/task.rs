//! Worker tasks: the call of a `worker` function, done by an external worker that takes it from a
//! task list, heartbeats and answers it (the activity tasks of Amazon SWF).
//!
//! The task's timeouts are engine timers, so they are journaled, replayed and survive restarts like
//! every other timer. Timer ids follow the call's `<op>:timeout`:
//!
//! | timer | started when | stopped when | fires as |
//! |---|---|---|---|
//! | `<op>:scheduleToStart` | scheduled | a worker takes the task | `timeout`, `timeoutType: scheduleToStart` |
//! | `<op>:scheduleToClose` | scheduled | answered | `timeout`, `timeoutType: scheduleToClose` |
//! | `<op>:startToClose` | taken | answered | `timeout`, `timeoutType: startToClose` |
//! | `<op>:heartbeat` | taken | answered | `timeout`, `timeoutType: heartbeat` |
//!
//! A heartbeat does not restart its timer (that would journal two effects per heartbeat): it records
//! the time, and when the timer fires early because of it, the timer is set again for the rest.

use super::action::{Node, Signal};
use super::types::{Effect, ErrorInfo, ErrorKind, Millis};
use super::Cx;
use crate::model::{ActionId, ActionKind, Function, FunctionKind, Machine, TaskTimeouts};
use crate::timespan;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The worker that has taken a task.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Worker {
    /// The name the worker gave, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its latest sign of life: when it took the task or last heartbeat.
    pub beat: Millis,
    /// The progress it last reported with a heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

/// The four task timeouts, in the order their timers are cancelled.
const KINDS: [&str; 4] = ["scheduleToStart", "scheduleToClose", "startToClose", "heartbeat"];

fn timer_id(op: &str, kind: &str) -> String {
    format!("{op}:{kind}")
}

/// The worker function an `invokeFunction` action calls, and its timeouts.
fn function(m: &Machine, action: ActionId) -> Option<(&Function, TaskTimeouts)> {
    let ActionKind::InvokeFunction { function, .. } = &m.actions[action].kind else {
        return None;
    };
    let f = &m.functions[*function];
    match &f.kind {
        FunctionKind::Worker(t) => Some((f, *t)),
        _ => None,
    }
}

/// After the task's `InvokeFunction` effect: starts the timers that run from scheduling and
/// returns the node that waits for the worker. `timer` is the action's own `timeout` timer.
pub(crate) fn scheduled(cx: &mut Cx, op: String, t: &TaskTimeouts, timer: Option<String>) -> Node {
    if let Some(ms) = t.schedule_to_start_ms {
        cx.start_timer(&timer_id(&op, "scheduleToStart"), ms);
    }
    if let Some(ms) = t.schedule_to_close_ms {
        cx.start_timer(&timer_id(&op, "scheduleToClose"), ms);
    }
    Node::Task {
        op,
        timer,
        worker: None,
    }
}

/// What a signal does to a waiting task: `None` while it stays open, else its result or error.
pub(crate) fn deliver(
    cx: &mut Cx,
    action: ActionId,
    op: &str,
    timer: &mut Option<String>,
    worker: &mut Option<Worker>,
    signal: &Signal,
) -> Option<Result<jaq_json::Val, ErrorInfo>> {
    let timeouts = function(cx.m, action).map(|f| f.1).unwrap_or_default();
    match signal {
        Signal::Completed(o, v) if *o == op => {
            close(cx, op, timer);
            Some(Ok((*v).clone()))
        }
        Signal::Failed(o, e) if *o == op => {
            close(cx, op, timer);
            Some(Err((*e).clone()))
        }
        Signal::TaskStarted(o, name) if *o == op => {
            // A task handed out again (after a restart) keeps the deadlines of its first start.
            if worker.is_none() {
                start(cx, op, &timeouts, worker, name.map(str::to_string));
            }
            None
        }
        Signal::TaskHeartbeat(o, details) if *o == op => {
            // A heartbeat proves the task was taken, even when the start was not seen.
            if worker.is_none() {
                start(cx, op, &timeouts, worker, None);
            }
            if let Some(w) = worker {
                w.beat = cx.now;
                if let Some(d) = details {
                    w.details = Some((*d).clone());
                }
            }
            None
        }
        Signal::Timer(t) if timer.as_deref() == Some(*t) => {
            // The action's own `timeout`: as for any call, the result is null and the call cancelled.
            cx.timers.remove(*t);
            *timer = None;
            close(cx, op, timer);
            cx.effect(Effect::CancelOperation { op: op.to_string() });
            Some(Ok(jaq_json::Val::Null))
        }
        Signal::Timer(t) => {
            let kind = t.strip_prefix(op)?.strip_prefix(':')?;
            let kind = *KINDS.iter().find(|k| **k == kind)?;
            cx.timers.remove(*t);
            if kind == "heartbeat" {
                let beat = worker.as_ref().map_or(cx.now, |w| w.beat);
                let due = beat.saturating_add(timeouts.heartbeat_ms.unwrap_or(0) as Millis);
                if cx.now < due {
                    cx.start_timer(t, (due - cx.now) as u64);
                    return None;
                }
            }
            close(cx, op, timer);
            cx.effect(Effect::CancelOperation { op: op.to_string() });
            Some(Err(timed_out(cx, action, kind, &timeouts, worker.as_ref())))
        }
        _ => None,
    }
}

/// A worker took the task: schedule-to-start stops, start-to-close and heartbeat begin.
fn start(cx: &mut Cx, op: &str, t: &TaskTimeouts, worker: &mut Option<Worker>, name: Option<String>) {
    *worker = Some(Worker {
        name,
        beat: cx.now,
        details: None,
    });
    cx.cancel_timer(&timer_id(op, "scheduleToStart"));
    if let Some(ms) = t.start_to_close_ms {
        cx.start_timer(&timer_id(op, "startToClose"), ms);
    }
    if let Some(ms) = t.heartbeat_ms {
        cx.start_timer(&timer_id(op, "heartbeat"), ms);
    }
}

/// Stops every timer of the task (it was answered, timed out or cancelled).
pub(crate) fn close(cx: &mut Cx, op: &str, timer: &mut Option<String>) {
    if let Some(t) = timer.take() {
        cx.cancel_timer(&t);
    }
    for kind in KINDS {
        cx.cancel_timer(&timer_id(op, kind));
    }
}

fn timed_out(cx: &Cx, action: ActionId, kind: &str, t: &TaskTimeouts, worker: Option<&Worker>) -> ErrorInfo {
    let (function, list) = function(cx.m, action).map_or(("", ""), |(f, _)| (f.name.as_str(), f.operation.as_str()));
    let span = |ms: Option<u64>| timespan::format(ms.unwrap_or(0));
    let message = match kind {
        "scheduleToStart" => format!(
            "no worker took the task of function {function:?} from task list {list:?} within {} (scheduleToStartTimeout)",
            span(t.schedule_to_start_ms)
        ),
        "scheduleToClose" => format!(
            "the task of function {function:?} was not finished within {} of being scheduled (scheduleToCloseTimeout)",
            span(t.schedule_to_close_ms)
        ),
        "startToClose" => format!(
            "the worker did not finish the task of function {function:?} within {} of taking it (startToCloseTimeout)",
            span(t.start_to_close_ms)
        ),
        _ => format!(
            "the worker of the task of function {function:?} sent no heartbeat for {} (heartbeatTimeout)",
            span(t.heartbeat_ms)
        ),
    };
    let mut details = json!({"timeoutType": kind, "function": function, "taskList": list});
    if let Some(w) = worker {
        if let Some(n) = &w.name {
            details["worker"] = json!(n);
        }
        if let Some(d) = &w.details {
            details["lastHeartbeatDetails"] = d.clone();
        }
    }
    ErrorInfo::new(ErrorKind::Timeout, message).with_details(details)
}

/// Whether a worker has taken the task `op` somewhere in a running action.
pub(crate) fn started(node: &Node, op: &str) -> Option<bool> {
    match node {
        Node::Task { op: o, worker, .. } if o == op => Some(worker.is_some()),
        Node::Sequence { child, .. } => started(&child.node, op),
        Node::Parallel { running, .. } | Node::Foreach { running, .. } => {
            running.iter().find_map(|(_, r)| started(&r.node, op))
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "task_tests.rs"]
mod tests;
