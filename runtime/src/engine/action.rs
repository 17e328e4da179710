//! Running actions: the eight action types, hierarchical composition, error handlers and retries.
//!
//! An action that cannot finish at once becomes a [`Run`]: a serializable tree that records what it
//! waits for (an operation, a timer) and what its children have produced so far. Inputs are routed
//! into the tree by [`deliver`]. Operation ids are the action's position: the state visit, the site
//! (`enter`, `exit`, `t<index>.<firing>`), the child indices, and the attempt when retried.

use super::event::outgoing_event;
use super::task::{self, Worker};
use super::types::{Effect, ErrorInfo, ErrorKind, Trace, J};
use super::Cx;
use crate::json::{from_val, str_val};
use crate::model::{ActionId, ActionKind, Completion, FunctionKind};
use jaq_json::Val;
use serde::{Deserialize, Serialize};

/// An action that has started and not finished.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Run {
    /// Index into [`crate::model::Machine::actions`].
    pub action: ActionId,
    /// Position, without the attempt suffix.
    pub path: String,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The input the action was started with (kept for children and retries).
    pub input: J,
    /// What it waits for.
    pub node: Node,
    /// When this attempt started (the time of the input that started it); 0 in snapshots written
    /// before it was kept. Not part of replay: only [`Run::running`] reads it, for the metrics.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub started: crate::Millis,
}

fn is_zero(v: &crate::Millis) -> bool {
    *v == 0
}

impl Run {
    /// The operation id and start time of this action and of every action running inside it
    /// (`sequence`, `parallel` and `foreach` children), except a wait between attempts; actions
    /// whose start time is unknown are left out.
    pub fn running(&self, out: &mut Vec<(String, crate::Millis)>) {
        match &self.node {
            Node::Backoff { .. } => return,
            Node::Sequence { child, .. } => child.running(out),
            Node::Parallel { running, .. } | Node::Foreach { running, .. } => {
                for (_, r) in running {
                    r.running(out);
                }
            }
            _ => {}
        }
        if self.started > 0 {
            out.push((op_id(&self.path, self.attempt), self.started));
        }
    }
}

/// What a running action waits for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "wait", rename_all = "camelCase")]
pub enum Node {
    /// A function call or subflow with `waitForCompletion`.
    Call {
        /// Operation id.
        op: String,
        /// The action `timeout` timer.
        timer: Option<String>,
    },
    /// The task of a `worker` function, waiting for a worker to take and answer it.
    Task {
        /// Operation id.
        op: String,
        /// The action `timeout` timer.
        timer: Option<String>,
        /// The worker, once one has taken the task.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worker: Option<Worker>,
    },
    /// A `delay`.
    Delay {
        /// Timer id.
        timer: String,
    },
    /// The wait before the next attempt.
    Backoff {
        /// Timer id.
        timer: String,
    },
    /// A `sequence`: the child running now and the outputs so far.
    Sequence {
        /// Index of the running child.
        index: usize,
        /// Outputs of the finished children.
        out: Vec<J>,
        /// The running child.
        child: Box<Run>,
    },
    /// A `parallel`: running branches and finished outputs.
    Parallel {
        /// Branches still running (by index).
        running: Vec<(usize, Run)>,
        /// Outputs of finished branches.
        out: Vec<Option<J>>,
    },
    /// A `foreach`: the items, the next one to start, running children and outputs.
    Foreach {
        /// The input array.
        items: Vec<J>,
        /// The next item to start.
        next: usize,
        /// Running children (by item index).
        running: Vec<(usize, Run)>,
        /// Outputs so far.
        out: Vec<Option<J>>,
    },
}

/// The result of starting or advancing an action.
pub enum Step {
    /// Finished with an output.
    Done(Val),
    /// Failed, after the action's error handlers declined or ran out of retries.
    Fail(ErrorInfo),
    /// Not finished yet.
    Pending(Run),
}

/// What can reach a running action.
pub enum Signal<'a> {
    /// A call or subflow returned.
    Completed(&'a str, &'a Val),
    /// A call or subflow failed.
    Failed(&'a str, &'a ErrorInfo),
    /// A timer came due.
    Timer(&'a str),
    /// A worker took a task (operation, worker name).
    TaskStarted(&'a str, Option<&'a str>),
    /// The worker of a task is alive (operation, progress).
    TaskHeartbeat(&'a str, Option<&'a serde_json::Value>),
}

fn op_id(path: &str, attempt: u32) -> String {
    if attempt <= 1 {
        path.to_string()
    } else {
        format!("{path}#{attempt}")
    }
}

/// Starts an action (attempt `attempt`) and applies its error handlers to an immediate failure.
pub fn start(cx: &mut Cx, id: ActionId, input: Val, path: &str, attempt: u32) -> Step {
    let m = cx.m;
    cx.cover(|| m.actions[id].pointer.clone());
    let raw = start_raw(cx, id, &input, path, attempt);
    match raw {
        Step::Fail(e) => settle(cx, id, input, path, attempt, e),
        Step::Done(v) => {
            cx.trace(|| Trace::ActionCompleted {
                op: op_id(path, attempt),
                action: cx.m.actions[id].kind.type_name().into(),
            });
            Step::Done(v)
        }
        pending => pending,
    }
}

fn start_raw(cx: &mut Cx, id: ActionId, input: &Val, path: &str, attempt: u32) -> Step {
    let m = cx.m;
    let action = &m.actions[id];
    // The operation id, built only by the actions that name their operation.
    let op_of = || op_id(path, attempt);
    let expr_err = |e: crate::expr::EvalError| {
        let mut details = serde_json::json!({"expression": e.expression});
        // A value given to jq `error(...)` is kept when it carries more than the message.
        if let Some(v) = e.value {
            details["value"] = v;
        }
        ErrorInfo::new(ErrorKind::ExpressionError, e.message).with_details(details)
    };
    let now = cx.now;
    let pending = |node| {
        Step::Pending(Run {
            action: id,
            path: path.to_string(),
            attempt,
            input: J(input.clone()),
            node,
            started: now,
        })
    };
    match &action.kind {
        ActionKind::Delay { ms } => {
            let timer = format!("{}:delay", op_of());
            cx.start_timer(&timer, *ms);
            pending(Node::Delay { timer })
        }
        ActionKind::InjectData { value } => match value.resolve(input) {
            Ok(v) => Step::Done(v),
            Err(e) => Step::Fail(expr_err(e)),
        },
        ActionKind::InvokeFunction {
            function,
            args,
            timeout_ms,
            wait,
            delivery,
        } => {
            let args = match args.resolve(input) {
                Ok(a) => a,
                Err(e) => return Step::Fail(expr_err(e)),
            };
            let f = &m.functions[*function];
            let delivery = delivery.unwrap_or(f.delivery);
            match &f.kind {
                FunctionKind::Worker(t) if *wait => {
                    let op = op_of();
                    cx.effect(Effect::InvokeFunction {
                        op: op.clone(),
                        function: f.name.clone(),
                        operation: f.operation.clone(),
                        function_type: f.kind.as_str().into(),
                        arguments: from_val(&args),
                        wait: true,
                        delivery,
                    });
                    let timer = action_timer(cx, &op, *timeout_ms);
                    pending(task::scheduled(cx, op, t, timer))
                }
                FunctionKind::Expression(e) => match e.eval(args, Val::Null) {
                    Ok(v) if *wait => Step::Done(v),
                    Ok(_) => Step::Done(Val::Null),
                    Err(e) if *wait => Step::Fail(ErrorInfo {
                        kind: ErrorKind::FunctionError,
                        message: format!("function {}: {}", f.name, e.message),
                        details: e.value.filter(|v| !v.is_string()),
                        state: None,
                    }),
                    Err(_) => Step::Done(Val::Null),
                },
                kind => {
                    let op = op_of();
                    cx.effect(Effect::InvokeFunction {
                        op: op.clone(),
                        function: f.name.clone(),
                        operation: f.operation.clone(),
                        function_type: kind.as_str().into(),
                        arguments: from_val(&args),
                        wait: *wait,
                        delivery,
                    });
                    match waiting(cx, op, *timeout_ms, *wait) {
                        Some(node) => pending(node),
                        None => Step::Done(Val::Null),
                    }
                }
            }
        }
        ActionKind::InvokeSubflow {
            subflow,
            args,
            timeout_ms,
            wait,
        } => {
            let args = match args.resolve(input) {
                Ok(a) => a,
                Err(e) => return Step::Fail(expr_err(e)),
            };
            let op = op_of();
            cx.effect(Effect::StartSubflow {
                op: op.clone(),
                definition: subflow.clone(),
                input: from_val(&args),
                wait: *wait,
            });
            match waiting(cx, op, *timeout_ms, *wait) {
                Some(node) => pending(node),
                None => Step::Done(Val::Null),
            }
        }
        ActionKind::SendEvent {
            event,
            data,
            attributes,
        } => {
            let op = op_of();
            match outgoing_event(cx, *event, data.as_ref(), attributes, input, &op) {
                Ok(ev) => {
                    cx.effect(Effect::SendEvent { op, event: ev });
                    Step::Done(Val::Null)
                }
                Err(e) => Step::Fail(expr_err(e)),
            }
        }
        ActionKind::Sequence { actions } => {
            let op = op_of();
            let mut out = Vec::new();
            for (i, &child) in actions.iter().enumerate() {
                match start(cx, child, input.clone(), &format!("{op}/{i}"), 1) {
                    Step::Done(v) => out.push(J(v)),
                    Step::Fail(e) => return Step::Fail(e),
                    Step::Pending(run) => {
                        return pending(Node::Sequence {
                            index: i,
                            out,
                            child: Box::new(run),
                        });
                    }
                }
            }
            Step::Done(keyed(cx, actions, out.into_iter().map(Some).collect()))
        }
        ActionKind::Parallel { actions, completion } => {
            let op = op_of();
            let mut out: Vec<Option<J>> = vec![None; actions.len()];
            let mut running = Vec::new();
            for (i, &child) in actions.iter().enumerate() {
                match start(cx, child, input.clone(), &format!("{op}/{i}"), 1) {
                    Step::Done(v) => out[i] = Some(J(v)),
                    Step::Fail(e) => {
                        for (_, r) in &running {
                            cancel(cx, r);
                        }
                        return Step::Fail(e);
                    }
                    Step::Pending(run) => running.push((i, run)),
                }
                if parallel_done(*completion, &out, actions.len()) {
                    for (_, r) in &running {
                        cancel(cx, r);
                    }
                    return Step::Done(keyed(cx, actions, out));
                }
            }
            pending(Node::Parallel { running, out })
        }
        ActionKind::Foreach {
            input: items_expr,
            action: child,
            max_parallel,
        } => {
            let items = match items_expr.eval(input.clone(), Val::Null) {
                Ok(Val::Arr(a)) => a.iter().cloned().map(J).collect::<Vec<_>>(),
                Ok(Val::Null) => Vec::new(),
                Ok(other) => {
                    return Step::Fail(ErrorInfo::new(
                        ErrorKind::ExpressionError,
                        format!(
                            "foreach input must be an array, got {} (in {})",
                            json_type(&other),
                            items_expr.source()
                        ),
                    ))
                }
                Err(e) => return Step::Fail(expr_err(e)),
            };
            let node = Node::Foreach {
                out: vec![None; items.len()],
                items,
                next: 0,
                running: Vec::new(),
            };
            let mut run = Run {
                action: id,
                path: path.to_string(),
                attempt,
                input: J(input.clone()),
                node,
                started: cx.now,
            };
            match foreach_fill(cx, *child, *max_parallel, &mut run) {
                Some(Ok(v)) => Step::Done(v),
                Some(Err(e)) => Step::Fail(e),
                None => Step::Pending(run),
            }
        }
    }
}

/// After a call or subflow effect: nothing when the action does not wait (its output is null),
/// else the node that waits, with the action's `timeout` timer.
fn waiting(cx: &mut Cx, op: String, timeout_ms: Option<u64>, wait: bool) -> Option<Node> {
    if !wait {
        return None;
    }
    let timer = action_timer(cx, &op, timeout_ms);
    Some(Node::Call { op, timer })
}

/// Starts the `timeout` timer of a call or subflow action that has one.
fn action_timer(cx: &mut Cx, op: &str, timeout_ms: Option<u64>) -> Option<String> {
    timeout_ms.map(|ms| {
        let t = format!("{op}:timeout");
        cx.start_timer(&t, ms);
        t
    })
}

fn json_type(v: &Val) -> &'static str {
    match v {
        Val::Null => "null",
        Val::Bool(_) => "a boolean",
        Val::Num(_) => "a number",
        Val::TStr(_) | Val::BStr(_) => "a string",
        Val::Arr(_) => "an array",
        Val::Obj(_) => "an object",
    }
}

/// Starts foreach children until `max_parallel` run or the items are exhausted.
/// Returns the outcome once every item has finished.
fn foreach_fill(cx: &mut Cx, child: ActionId, max_parallel: usize, run: &mut Run) -> Option<Result<Val, ErrorInfo>> {
    let op = op_id(&run.path, run.attempt);
    let Node::Foreach {
        items,
        next,
        running,
        out,
    } = &mut run.node
    else {
        return None;
    };
    while running.len() < max_parallel && *next < items.len() {
        let i = *next;
        *next += 1;
        match start(cx, child, items[i].0.clone(), &format!("{op}/{i}"), 1) {
            Step::Done(v) => out[i] = Some(J(v)),
            Step::Fail(e) => {
                for (_, r) in running.iter() {
                    cancel(cx, r);
                }
                running.clear();
                return Some(Err(e));
            }
            Step::Pending(r) => running.push((i, r)),
        }
    }
    if running.is_empty() && *next >= items.len() {
        let arr: Val = out
            .iter_mut()
            .map(|o| o.take().map(|j| j.0).unwrap_or(Val::Null))
            .collect();
        return Some(Ok(arr));
    }
    None
}

fn parallel_done(completion: Completion, out: &[Option<J>], total: usize) -> bool {
    let done = out.iter().filter(|o| o.is_some()).count();
    match completion {
        Completion::And => done == total,
        Completion::Xor => done >= 1,
        Completion::NOfM(n) => done >= n,
    }
}

/// Outputs of `parallel`/`sequence`: an object keyed by each child's name, else its index.
fn keyed(cx: &Cx, children: &[ActionId], out: Vec<Option<J>>) -> Val {
    let mut map = jaq_json::Map::default();
    for (i, (o, &child)) in out.into_iter().zip(children).enumerate() {
        if let Some(J(v)) = o {
            let key = cx.m.actions[child].name.clone().unwrap_or_else(|| i.to_string());
            map.insert(str_val(&key), v);
        }
    }
    Val::obj(map)
}

/// Applies an action's error handlers to a failure: handled (output null), retried (pending), or propagated.
fn settle(cx: &mut Cx, id: ActionId, input: Val, path: &str, attempt: u32, error: ErrorInfo) -> Step {
    let m = cx.m;
    let action = &m.actions[id];
    let op = op_id(path, attempt);
    cx.trace(|| Trace::ActionFailed {
        op: op.clone(),
        action: action.kind.type_name().into(),
        message: error.message.clone(),
    });
    let err_val = error.to_val();
    for (j, h) in action.handlers.iter().enumerate() {
        if let Some(c) = &h.condition {
            match super::fires(c, &err_val, &err_val, cx.options.trace, cx.out) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    return Step::Fail(ErrorInfo::new(
                        ErrorKind::ExpressionError,
                        format!("error handler condition failed: {}", e.message),
                    ))
                }
            }
        }
        cx.cover(|| format!("{}/errorHandlers/{j}", action.pointer));
        if let Some(rh) = &h.handler {
            match rh.eval_mut(cx.data, err_val.clone()) {
                Ok(()) => {}
                Err(e) => {
                    return Step::Fail(ErrorInfo::new(
                        ErrorKind::ExpressionError,
                        format!("error handler resultHandler failed: {}", e.message),
                    ))
                }
            }
        }
        let Some(policy) = h.retry.map(|r| &m.retries[r]) else {
            return Step::Done(Val::Null);
        };
        if attempt > policy.max_attempts {
            // Retries exhausted: the error propagates unchanged.
            return Step::Fail(error);
        }
        let unit = cx.random_unit();
        let delay = policy.delay(attempt, unit);
        let timer = format!("{op}:retry");
        cx.trace(|| Trace::Retrying {
            op: op.clone(),
            attempt: attempt + 1,
            delay_ms: delay,
        });
        cx.start_timer(&timer, delay);
        return Step::Pending(Run {
            action: id,
            path: path.to_string(),
            attempt,
            input: J(input),
            node: Node::Backoff { timer },
            started: cx.now,
        });
    }
    Step::Fail(error)
}

/// What a running action's own node produced, before its error handlers.
enum Raw {
    Ok(Val),
    Err(ErrorInfo),
    /// Already settled (a retry attempt started by `start`).
    Final(Step),
}

/// Routes a signal into a running action. `Some` when the action has finished (handlers applied).
pub fn deliver(cx: &mut Cx, run: &mut Run, signal: &Signal) -> Option<Result<Val, ErrorInfo>> {
    let raw = deliver_raw(cx, run, signal)?;
    match raw {
        Raw::Final(Step::Done(v)) => Some(Ok(v)),
        Raw::Final(Step::Fail(e)) => Some(Err(e)),
        Raw::Final(Step::Pending(next)) => {
            *run = next;
            None
        }
        Raw::Ok(v) => {
            cx.trace(|| Trace::ActionCompleted {
                op: op_id(&run.path, run.attempt),
                action: cx.m.actions[run.action].kind.type_name().into(),
            });
            Some(Ok(v))
        }
        Raw::Err(e) => match settle(cx, run.action, run.input.0.clone(), &run.path, run.attempt, e) {
            Step::Done(v) => Some(Ok(v)),
            Step::Fail(e) => Some(Err(e)),
            Step::Pending(next) => {
                *run = next;
                None
            }
        },
    }
}

fn deliver_raw(cx: &mut Cx, run: &mut Run, signal: &Signal) -> Option<Raw> {
    let m = cx.m;
    let action = &m.actions[run.action];
    match &mut run.node {
        Node::Call { op, timer } => match signal {
            Signal::Completed(o, v) if *o == op => {
                if let Some(t) = timer.take() {
                    cx.cancel_timer(&t);
                }
                Some(Raw::Ok((*v).clone()))
            }
            Signal::Failed(o, e) if *o == op => {
                if let Some(t) = timer.take() {
                    cx.cancel_timer(&t);
                }
                Some(Raw::Err((*e).clone()))
            }
            Signal::Timer(t) if timer.as_deref() == Some(*t) => {
                // The seed: when the timeout is reached, the result is null.
                cx.timers.remove(*t);
                cx.effect(Effect::CancelOperation { op: op.clone() });
                Some(Raw::Ok(Val::Null))
            }
            _ => None,
        },
        Node::Task { op, timer, worker } => task::deliver(cx, run.action, op, timer, worker, signal).map(|r| match r {
            Ok(v) => Raw::Ok(v),
            Err(e) => Raw::Err(e),
        }),
        Node::Delay { timer } => match signal {
            Signal::Timer(t) if *t == timer => {
                cx.timers.remove(*t);
                Some(Raw::Ok(Val::Null))
            }
            _ => None,
        },
        Node::Backoff { timer } => match signal {
            Signal::Timer(t) if *t == timer => {
                cx.timers.remove(*t);
                let input = run.input.0.clone();
                match start(cx, run.action, input, &run.path, run.attempt + 1) {
                    Step::Pending(next) => {
                        *run = next;
                        None
                    }
                    step => Some(Raw::Final(step)),
                }
            }
            _ => None,
        },
        Node::Sequence { index, out, child } => {
            let ActionKind::Sequence { actions } = &action.kind else {
                return None;
            };
            match deliver(cx, child, signal)? {
                Err(e) => Some(Raw::Err(e)),
                Ok(v) => {
                    out.push(J(v));
                    let op = op_id(&run.path, run.attempt);
                    let input = run.input.0.clone();
                    for (i, &next) in actions.iter().enumerate().skip(*index + 1) {
                        match start(cx, next, input.clone(), &format!("{op}/{i}"), 1) {
                            Step::Done(v) => out.push(J(v)),
                            Step::Fail(e) => return Some(Raw::Err(e)),
                            Step::Pending(r) => {
                                *index = i;
                                **child = r;
                                return None;
                            }
                        }
                    }
                    let out = std::mem::take(out).into_iter().map(Some).collect();
                    Some(Raw::Ok(keyed(cx, actions, out)))
                }
            }
        }
        Node::Parallel { running, out } => {
            let ActionKind::Parallel { actions, completion } = &action.kind else {
                return None;
            };
            let mut k = 0;
            while k < running.len() {
                let (i, r) = &mut running[k];
                let i = *i;
                match deliver(cx, r, signal) {
                    None => k += 1,
                    Some(Ok(v)) => {
                        out[i] = Some(J(v));
                        running.remove(k);
                    }
                    Some(Err(e)) => {
                        running.remove(k);
                        for (_, r) in running.iter() {
                            cancel(cx, r);
                        }
                        running.clear();
                        return Some(Raw::Err(e));
                    }
                }
            }
            if parallel_done(*completion, out, actions.len()) {
                for (_, r) in running.iter() {
                    cancel(cx, r);
                }
                running.clear();
                let out = std::mem::take(out);
                return Some(Raw::Ok(keyed(cx, actions, out)));
            }
            None
        }
        Node::Foreach { running, out, .. } => {
            let ActionKind::Foreach {
                action: child,
                max_parallel,
                ..
            } = &action.kind
            else {
                return None;
            };
            let mut k = 0;
            let mut changed = false;
            while k < running.len() {
                let (i, r) = &mut running[k];
                let i = *i;
                match deliver(cx, r, signal) {
                    None => k += 1,
                    Some(Ok(v)) => {
                        out[i] = Some(J(v));
                        running.remove(k);
                        changed = true;
                    }
                    Some(Err(e)) => {
                        running.remove(k);
                        for (_, r) in running.iter() {
                            cancel(cx, r);
                        }
                        running.clear();
                        return Some(Raw::Err(e));
                    }
                }
            }
            if changed {
                return foreach_fill(cx, *child, *max_parallel, run).map(|r| match r {
                    Ok(v) => Raw::Ok(v),
                    Err(e) => Raw::Err(e),
                });
            }
            None
        }
    }
}

/// Cancels a running action: its timers and the calls and subflows it waits for.
pub fn cancel(cx: &mut Cx, run: &Run) {
    match &run.node {
        Node::Call { op, timer } => {
            if let Some(t) = timer {
                cx.cancel_timer(t);
            }
            cx.effect(Effect::CancelOperation { op: op.clone() });
        }
        Node::Task { op, timer, .. } => {
            task::close(cx, op, &mut timer.clone());
            cx.effect(Effect::CancelOperation { op: op.clone() });
        }
        Node::Delay { timer } | Node::Backoff { timer } => cx.cancel_timer(timer),
        Node::Sequence { child, .. } => cancel(cx, child),
        Node::Parallel { running, .. } | Node::Foreach { running, .. } => {
            for (_, r) in running {
                cancel(cx, r);
            }
        }
    }
}
