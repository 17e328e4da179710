//! Runs an ASL execution on the engine's terms: timed inputs in, journal entries and effects out,
//! everything the execution is kept as data in [`Exec`] (part of the instance's snapshot).
//!
//! An execution is a tree of [`Run`]s: the machine's own, and one per running Parallel branch and
//! Map iteration. Each input is delivered to the run that waits for it, then every run goes as far
//! as it can without waiting. Operation and timer ids are derived from the run's position, the state
//! and its visit, so replaying the journal gives the same effects.

use super::model::{AslMachine, Assign, Catcher, Dyn, Kind, Lang, ResultPath, State, Test, WaitFor};
use super::{names, AslError, Env};
use crate::engine::{rfc3339, Effect, Millis, Options, Output, Trace};
use crate::kernel::Random;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::cell::Cell;
use std::collections::BTreeMap;

/// The state of an ASL execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exec {
    /// The execution's input (`$$.Execution.Input`).
    pub input: Value,
    /// The machine's run.
    pub root: Run,
}

/// One run of a `StartAt`/`States` block: the machine's, a Parallel branch's or a Map iteration's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Index of the graph.
    pub graph: usize,
    /// The current state.
    pub state: usize,
    /// The current state's raw input.
    pub input: Value,
    /// The variables in scope.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub vars: Map<String, Value>,
    /// Prefix of the ids of this run's operations and timers.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
    /// States entered so far (part of ids).
    pub visits: u64,
    /// When the current state was entered.
    pub entered: Millis,
    /// Retry bookkeeping of the current state: attempts per retrier, and attempts in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<(Vec<u32>, u32)>,
    /// Where the run is.
    pub step: Step,
}

/// Where a run is in its current state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "camelCase")]
pub enum Step {
    /// About to run the state.
    Enter,
    /// Waiting for a task's result.
    Task {
        /// Operation id.
        op: String,
        /// The task's effective input.
        effective: Value,
        /// `TimeoutSeconds` timer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout: Option<String>,
        /// `HeartbeatSeconds` timer and its length in ms.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        heartbeat: Option<(String, u64)>,
    },
    /// Waiting before the next attempt.
    Backoff {
        /// Timer id.
        timer: String,
    },
    /// A Wait state waits.
    Wait {
        /// Timer id.
        timer: String,
        /// Its effective input.
        effective: Value,
    },
    /// Parallel branches or Map iterations run.
    Children {
        /// The runs by position; `Done`/`Failed` once finished.
        slots: Vec<Slot>,
        /// Map: items not started yet (the next one is `slots.len()`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pending: Vec<Value>,
        /// At most this many at once (0: no limit).
        max: u64,
        /// Map: failures tolerated.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tolerated: Option<Tolerance>,
        /// Failures so far.
        #[serde(default)]
        failures: u64,
        /// The number of items in all (Map).
        total: u64,
    },
    /// The run ended.
    Done {
        /// Its output or error.
        outcome: Outcome,
    },
}

/// A Map's failure tolerance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// Failures tolerated, as a count.
    pub count: Option<u64>,
    /// Failures tolerated, as a percentage of the items.
    pub percentage: Option<f64>,
}

/// A branch or iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "slot", rename_all = "camelCase")]
pub enum Slot {
    /// Still running.
    Running {
        /// The run.
        run: Box<Run>,
    },
    /// Finished with this output.
    Done {
        /// Output.
        output: Value,
    },
    /// Failed.
    Failed {
        /// Error.
        error: AslError,
    },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// With this output.
    Output(Value),
    /// With this error.
    Error(AslError),
}

/// What an input says to the run that waits for it.
pub enum Delivery<'a> {
    /// A task returned.
    Completed(&'a str, &'a Value),
    /// A task failed.
    Failed(&'a str, &'a AslError),
    /// A timer fired.
    Timer(&'a str),
    /// A worker took a task or sent a heartbeat.
    Alive(&'a str),
}

/// What the engine knows while it runs an execution.
pub struct Cx<'a> {
    /// The machine.
    pub m: &'a AslMachine,
    /// Definition id (the state machine's name).
    pub definition: &'a str,
    /// Instance id (the execution's name).
    pub id: &'a str,
    /// The execution's input.
    pub exec_input: &'a Value,
    /// When the execution started.
    pub started: Millis,
    /// The schedule that started it and the run's nominal time (`$$.Schedule`), if one did.
    pub scheduled: Option<&'a crate::engine::Scheduled>,
    /// The time of the input.
    pub now: Millis,
    /// Deterministic random source.
    pub rng: Cell<Random>,
    /// Active timers.
    pub timers: &'a mut BTreeMap<String, Millis>,
    /// What the input produced.
    pub out: &'a mut Output,
    /// Engine options.
    pub options: Options,
    /// States run in this input, against `options.max_transitions`.
    pub burst: u64,
    /// Name of the machine's current state (for the snapshot).
    pub top_state: Option<String>,
}

impl Cx<'_> {
    fn effect(&mut self, e: Effect) {
        self.out.effect(&self.options, e);
    }

    fn start_timer(&mut self, timer: &str, due: Millis) {
        self.out.start_timer(&self.options, self.timers, timer, due);
    }

    fn cancel_timer(&mut self, timer: &str) {
        self.out.cancel_timer(&self.options, self.timers, timer);
    }

    /// Cancels a timer (recording the effect) if it is armed.
    pub fn cancel_timer_pub(&mut self, timer: &str) {
        self.cancel_timer(timer);
    }

    fn trace(&mut self, f: impl FnOnce() -> Trace) {
        self.out.trace(&self.options, f);
    }

    /// Records that the part of the definition at JSON pointer `pointer` was taken (coverage only).
    fn cover(&mut self, pointer: impl FnOnce() -> String) {
        self.out.cover(&self.options, pointer);
    }

    fn unit(&self) -> f64 {
        let mut rng = self.rng.get();
        let unit = rng.next_unit();
        self.rng.set(rng);
        unit
    }

    /// The context object for `st` in `run` (`item`: the Map item being selected).
    fn context(&self, run: &Run, st: &State, item: Option<(usize, &Value)>, token: Option<&str>) -> Value {
        if !st.uses_context {
            return Value::Null;
        }
        let attempts = run.retry.as_ref().map_or(0, |r| r.1);
        let mut c = json!({
            "Execution": {
                "Id": format!("arn:aws:states:local:000000000000:execution:{}:{}", self.definition, self.id),
                "Input": self.exec_input,
                "Name": self.id,
                "RoleArn": "arn:aws:iam::000000000000:role/sm4c",
                "StartTime": rfc3339(self.started),
                "RedriveCount": 0,
            },
            "State": {
                "EnteredTime": rfc3339(run.entered),
                "Name": st.name,
                "RetryCount": attempts,
            },
            "StateMachine": {
                "Id": format!("arn:aws:states:local:000000000000:stateMachine:{}", self.definition),
                "Name": self.definition,
            },
        });
        if let Some(sch) = self.scheduled {
            let v = sch.to_json();
            c["Schedule"] = json!({"Id": v["id"], "NominalTime": v["nominalTime"]});
        }
        if let Some((index, value)) = item {
            c["Map"] = json!({"Item": {"Index": index, "Value": value}});
        }
        if let Some(t) = token {
            c["Task"] = json!({ "Token": t });
        }
        c
    }
}

fn op_id(run: &Run, st: &State) -> String {
    let attempt = run.retry.as_ref().map_or(0, |r| r.1);
    if attempt == 0 {
        format!("{}{}#{}", run.prefix, st.name, run.visits)
    } else {
        format!("{}{}#{}@{}", run.prefix, st.name, run.visits, attempt)
    }
}

/// Starts an execution with input `cx.exec_input`; returns the machine's run.
pub fn start(cx: &mut Cx) -> Run {
    if let Some(t) = cx.m.timeout_seconds {
        let due = cx
            .now
            .saturating_add(t.saturating_mul(1000).min(i64::MAX as u64 / 2) as i64);
        cx.start_timer(crate::engine::EXEC_TIMER, due);
    }
    let mut root = Run {
        graph: 0,
        state: cx.m.graphs[0].start,
        input: cx.exec_input.clone(),
        vars: Map::new(),
        prefix: String::new(),
        visits: 0,
        entered: cx.now,
        retry: None,
        step: Step::Enter,
    };
    advance(cx, &mut root, true);
    root
}

/// Delivers an input to the run waiting for it, then runs everything as far as it goes.
/// False when no run waits for it.
pub fn deliver(cx: &mut Cx, root: &mut Run, d: &Delivery) -> bool {
    let handled = deliver_to(cx, root, d);
    if handled {
        advance(cx, root, true);
    }
    handled
}

/// Redrives a failed or timed-out execution: the machine's run enters its current state again
/// (its Retry counters at zero, a Parallel's branches and a Map's iterations all anew), and the
/// execution timeout, if any, counts afresh from now.
pub fn redrive_root(cx: &mut Cx, root: &mut Run) {
    if let Some(t) = cx.m.timeout_seconds {
        let due = cx
            .now
            .saturating_add(t.saturating_mul(1000).min(i64::MAX as u64 / 2) as i64);
        cx.start_timer(crate::engine::EXEC_TIMER, due);
    }
    root.retry = None;
    root.step = Step::Enter;
    advance(cx, root, true);
}

/// Ends every run, cancelling what they wait for.
pub fn cancel(cx: &mut Cx, run: &mut Run) {
    match std::mem::replace(&mut run.step, Step::Enter) {
        Step::Task {
            op, timeout, heartbeat, ..
        } => {
            cx.effect(Effect::CancelOperation { op });
            if let Some(t) = timeout {
                cx.cancel_timer(&t);
            }
            if let Some((t, _)) = heartbeat {
                cx.cancel_timer(&t);
            }
        }
        Step::Backoff { timer } | Step::Wait { timer, .. } => cx.cancel_timer(&timer),
        Step::Children { mut slots, .. } => {
            for s in &mut slots {
                if let Slot::Running { run } = s {
                    cancel(cx, run);
                }
            }
        }
        Step::Enter | Step::Done { .. } => {}
    }
    run.step = Step::Done {
        outcome: Outcome::Error(AslError::new("States.Cancelled", "the execution was stopped")),
    };
}

fn deliver_to(cx: &mut Cx, run: &mut Run, d: &Delivery) -> bool {
    match &mut run.step {
        Step::Task {
            op, timeout, heartbeat, ..
        } => {
            let result: Result<Value, AslError> = match d {
                Delivery::Completed(o, v) if *o == op.as_str() => Ok((*v).clone()),
                Delivery::Failed(o, e) if *o == op.as_str() => Err((*e).clone()),
                Delivery::Timer(t) if timeout.as_deref() == Some(*t) => {
                    cx.timers.remove(*t);
                    let op = op.clone();
                    cx.effect(Effect::CancelOperation { op });
                    Err(AslError {
                        error: Some(names::TIMEOUT.into()),
                        cause: None,
                    })
                }
                Delivery::Timer(t) if heartbeat.as_ref().is_some_and(|h| h.0 == *t) => {
                    cx.timers.remove(*t);
                    let op = op.clone();
                    cx.effect(Effect::CancelOperation { op });
                    Err(AslError {
                        error: Some(names::HEARTBEAT_TIMEOUT.into()),
                        cause: None,
                    })
                }
                Delivery::Alive(o) if *o == op.as_str() => {
                    if let Some((t, ms)) = heartbeat.clone() {
                        let due = cx.now.saturating_add(ms as i64);
                        cx.timers.remove(&t);
                        cx.start_timer(&t, due);
                    }
                    return true;
                }
                _ => return false,
            };
            let timeout = timeout.take();
            let heartbeat = heartbeat.take();
            if let Some(t) = timeout {
                cx.cancel_timer(&t);
            }
            if let Some((t, _)) = heartbeat {
                cx.cancel_timer(&t);
            }
            let Step::Task { effective, op, .. } = std::mem::replace(&mut run.step, Step::Enter) else {
                return true;
            };
            let result = match state(cx, run).kind {
                Kind::Task { ref resource, .. } => match StartExecution::of(resource) {
                    Some(mode) => sync_result(cx, mode, &effective, &op, result),
                    None => result,
                },
                _ => result,
            };
            match result {
                Ok(v) => task_result(cx, run, effective, v),
                Err(e) => fail(cx, run, e),
            }
            true
        }
        Step::Backoff { timer } => {
            if !matches!(d, Delivery::Timer(t) if *t == timer.as_str()) {
                return false;
            }
            cx.timers.remove(timer.as_str());
            run.step = Step::Enter;
            true
        }
        Step::Wait { timer, .. } => {
            if !matches!(d, Delivery::Timer(t) if *t == timer.as_str()) {
                return false;
            }
            cx.timers.remove(timer.as_str());
            let Step::Wait { effective, .. } = std::mem::replace(&mut run.step, Step::Enter) else {
                return true;
            };
            let st = state(cx, run);
            finish(cx, run, st, effective);
            true
        }
        Step::Children { slots, .. } => {
            for s in slots.iter_mut() {
                if let Slot::Running { run } = s {
                    if deliver_to(cx, run, d) {
                        return true;
                    }
                }
            }
            false
        }
        Step::Enter | Step::Done { .. } => false,
    }
}

fn state<'m>(cx: &Cx<'m>, run: &Run) -> &'m State {
    &cx.m.graphs[run.graph].states[run.state]
}

/// Runs `run` until it waits or ends.
fn advance(cx: &mut Cx, run: &mut Run, top: bool) {
    loop {
        match &run.step {
            Step::Enter => {
                cx.burst += 1;
                if cx.burst > cx.options.max_transitions {
                    run.step = Step::Done {
                        outcome: Outcome::Error(AslError::runtime(format!(
                            "the execution ran {} states without waiting (an endless loop?)",
                            cx.options.max_transitions
                        ))),
                    };
                    return;
                }
                let st = state(cx, run);
                if top {
                    match &mut cx.top_state {
                        // Reuses the name's buffer: entering states one after another allocates nothing.
                        Some(name) => st.name.clone_into(name),
                        None => cx.top_state = Some(st.name.clone()),
                    }
                }
                enter(cx, run, st);
            }
            Step::Children { .. } => {
                if !children(cx, run) {
                    return;
                }
            }
            Step::Task { .. } | Step::Backoff { .. } | Step::Wait { .. } | Step::Done { .. } => return,
        }
    }
}

fn read_path(
    p: &super::path::Path,
    input: &Value,
    context: &Value,
    vars: &Map<String, Value>,
    rng: &Cell<Random>,
) -> Result<Value, AslError> {
    p.read(&Env {
        input,
        context,
        vars,
        rng,
    })
}

/// The `$states` object of a JSONata expression.
fn states_obj(input: &Value, context: &Value, result: Option<&Value>, error: Option<&Value>) -> Value {
    let mut m = Map::new();
    m.insert("input".into(), input.clone());
    m.insert("context".into(), context.clone());
    if let Some(r) = result {
        m.insert("result".into(), r.clone());
    }
    if let Some(e) = error {
        m.insert("errorOutput".into(), e.clone());
    }
    Value::Object(m)
}

fn enter(cx: &mut Cx, run: &mut Run, st: &State) {
    if run.retry.is_none() {
        run.visits += 1;
        run.entered = cx.now;
        cx.trace(|| Trace::StateEntered { state: st.name.clone() });
    }
    match prepare(cx, run, st) {
        Ok(()) => {}
        Err(e) => fail(cx, run, e),
    }
}

/// The effective input of a state: JSONPath InputPath then Parameters; JSONata Arguments.
fn effective(cx: &Cx, run: &Run, st: &State, ctx: &Value) -> Result<Value, AslError> {
    match st.lang {
        Lang::JsonPath => {
            // The state's input is copied only when it is the effective input itself.
            let after_input = match &st.input_path {
                None => Cow::Borrowed(&run.input),
                Some(None) => Cow::Owned(json!({})),
                Some(Some(p)) => Cow::Owned(read_path(p, &run.input, ctx, &run.vars, &cx.rng)?),
            };
            if matches!(st.kind, Kind::Map(_)) {
                return Ok(after_input.into_owned());
            }
            match &st.parameters {
                Some(t) => t.eval(&Env {
                    input: &after_input,
                    context: ctx,
                    vars: &run.vars,
                    rng: &cx.rng,
                }),
                None => Ok(after_input.into_owned()),
            }
        }
        Lang::Jsonata => match &st.arguments {
            Some(q) => q.eval(
                &states_obj(&run.input, ctx, None, None),
                &Env {
                    input: &run.input,
                    context: ctx,
                    vars: &run.vars,
                    rng: &cx.rng,
                },
            ),
            None => Ok(run.input.clone()),
        },
    }
}

/// Reads a number given as a literal, a path or an expression.
fn number<T: Copy>(
    cx: &Cx,
    run: &Run,
    d: &Dyn<T>,
    input: &Value,
    ctx: &Value,
    what: &str,
    conv: impl Fn(&Value) -> Option<T>,
) -> Result<T, AslError> {
    let env = Env {
        input,
        context: ctx,
        vars: &run.vars,
        rng: &cx.rng,
    };
    let (v, path) = match d {
        Dyn::Lit(t) => return Ok(*t),
        Dyn::Path(p) => (p.read(&env)?, true),
        Dyn::Query(q) => (q.eval(&states_obj(&run.input, ctx, None, None), &env)?, false),
        Dyn::Call(c) => (c.eval(&env)?, true),
    };
    conv(&v).ok_or_else(|| {
        let why = format!("{what} must be {}, not {v}", what_of(what));
        if path {
            AslError::runtime(why)
        } else {
            AslError::query(why)
        }
    })
}

fn what_of(what: &str) -> &'static str {
    match what {
        "Timestamp" => "an RFC 3339 timestamp with T and Z or an offset",
        "ToleratedFailurePercentage" => "a number from 0 to 100",
        _ => "a non-negative integer",
    }
}

fn non_negative(v: &Value) -> Option<u64> {
    v.as_u64()
}

fn prepare(cx: &mut Cx, run: &mut Run, st: &State) -> Result<(), AslError> {
    let ctx = cx.context(run, st, None, None);
    match &st.kind {
        Kind::Pass { result } => {
            let eff = effective(cx, run, st, &ctx)?;
            let out = match (st.lang, result) {
                (Lang::JsonPath, Some(r)) => r.clone(),
                _ => eff,
            };
            finish(cx, run, st, out);
            Ok(())
        }
        Kind::Succeed => {
            let eff = effective(cx, run, st, &ctx)?;
            finish(cx, run, st, eff);
            Ok(())
        }
        Kind::Fail { error, cause } => {
            let text = |d: &Option<Dyn<String>>| -> Result<Option<String>, AslError> {
                let Some(d) = d else { return Ok(None) };
                let env = Env {
                    input: &run.input,
                    context: &ctx,
                    vars: &run.vars,
                    rng: &cx.rng,
                };
                let v = match d {
                    Dyn::Lit(s) => return Ok(Some(s.clone())),
                    Dyn::Path(p) => p.read(&env)?,
                    Dyn::Call(c) => c.eval(&env)?,
                    Dyn::Query(q) => q.eval(&states_obj(&run.input, &ctx, None, None), &env)?,
                };
                match v {
                    Value::String(s) => Ok(Some(s)),
                    other => Err(AslError::runtime(format!(
                        "the Fail state's error or cause must be a string, not {other}"
                    ))),
                }
            };
            let e = AslError {
                error: text(error)?,
                cause: text(cause)?,
            };
            run.step = Step::Done {
                outcome: Outcome::Error(e),
            };
            Ok(())
        }
        Kind::Choice { choices, default } => {
            let eff = match st.lang {
                Lang::JsonPath => effective(cx, run, st, &ctx)?,
                Lang::Jsonata => run.input.clone(),
            };
            let env = Env {
                input: &eff,
                context: &ctx,
                vars: &run.vars,
                rng: &cx.rng,
            };
            let sobj = || states_obj(&run.input, &ctx, None, None);
            for (n, c) in choices.iter().enumerate() {
                let hit = match &c.test {
                    Test::Rule(r) => r.test(&env)?,
                    Test::Condition(q) => match q.eval(&sobj(), &env)? {
                        Value::Bool(b) => b,
                        other => {
                            return Err(AslError::query(format!(
                                "a Choice Condition must yield a boolean, not {other}"
                            )))
                        }
                    },
                };
                if hit {
                    let out = match (&c.output, st.lang) {
                        (Some(q), _) => q.eval(&sobj(), &env)?,
                        (None, _) => {
                            transition(cx, run, st, eff, Some(c.next), c.assign.as_ref(), &ctx)?;
                            cx.cover(|| format!("{}/Choices/{n}", st.pointer));
                            return Ok(());
                        }
                    };
                    let assigned = match &c.assign {
                        Some(a) => Some(assign_values(cx, run, a, &eff, &ctx, None, None)?),
                        None => None,
                    };
                    apply_assign(run, assigned);
                    go(cx, run, Some(c.next), out);
                    cx.cover(|| format!("{}/Choices/{n}", st.pointer));
                    return Ok(());
                }
            }
            match default {
                Some(d) => {
                    transition(cx, run, st, eff, Some(*d), None, &ctx)?;
                    cx.cover(|| format!("{}/Default", st.pointer));
                    Ok(())
                }
                None => Err(AslError::new(
                    names::NO_CHOICE_MATCHED,
                    format!("no Choice rule of state {:?} matched and it has no Default", st.name),
                )),
            }
        }
        Kind::Wait { until } => {
            let eff = effective(cx, run, st, &ctx)?;
            let due = match until {
                WaitFor::Seconds(d) => {
                    let secs = number(cx, run, d, &eff, &ctx, "Seconds", non_negative)?;
                    cx.now
                        .saturating_add(secs.saturating_mul(1000).min(i64::MAX as u64 / 2) as i64)
                }
                WaitFor::Timestamp(d) => {
                    let ns = number(cx, run, d, &eff, &ctx, "Timestamp", |v| {
                        v.as_str().and_then(super::choice::parse_timestamp)
                    })?;
                    (ns.div_euclid(1_000_000)).clamp(i64::MIN as i128, i64::MAX as i128) as i64
                }
            };
            if due <= cx.now {
                finish(cx, run, st, eff);
            } else {
                let timer = format!("wait:{}", op_id(run, st));
                cx.start_timer(&timer, due);
                run.step = Step::Wait { timer, effective: eff };
            }
            Ok(())
        }
        Kind::Task {
            resource,
            timeout,
            heartbeat,
        } => {
            let op = op_id(run, st);
            // `$$.Task.Token` names the instance and the operation, so a worker's answer finds them.
            let token = resource
                .ends_with(".waitForTaskToken")
                .then(|| crate::task_token::token(cx.id, &op));
            let ctx = if token.is_some() {
                cx.context(run, st, None, token.as_deref())
            } else {
                ctx
            };
            let eff = effective(cx, run, st, &ctx)?;
            let raw_in = run.input.clone();
            let timeout_s = match timeout {
                Some(d) => Some(number(cx, run, d, &raw_in, &ctx, "TimeoutSeconds", |v| {
                    v.as_u64().filter(|n| *n > 0)
                })?),
                None => None,
            };
            let heartbeat_s = match heartbeat {
                Some(d) => Some(number(cx, run, d, &raw_in, &ctx, "HeartbeatSeconds", |v| {
                    v.as_u64().filter(|n| *n > 0)
                })?),
                None => None,
            };
            match StartExecution::of(resource) {
                Some(mode) => {
                    let (definition, input) = start_execution_target(&eff)?;
                    cx.effect(Effect::StartSubflow {
                        op: op.clone(),
                        definition: definition.clone(),
                        input,
                        wait: mode != StartExecution::Start,
                    });
                    if mode == StartExecution::Start {
                        // Without .sync the task ends once the execution has started.
                        let result = json!({
                            "ExecutionArn": execution_arn(&definition, &format!("{}/{op}", cx.id)),
                            "StartDate": rfc3339(cx.now),
                        });
                        task_result(cx, run, eff, result);
                        return Ok(());
                    }
                }
                None => {
                    let function_type = if token.is_some() { "worker" } else { "asl" };
                    cx.effect(Effect::InvokeFunction {
                        op: op.clone(),
                        function: resource.clone(),
                        operation: st.name.clone(),
                        function_type: function_type.into(),
                        arguments: eff.clone(),
                        wait: true,
                        delivery: Default::default(),
                    });
                }
            }
            let timeout = timeout_s.map(|s| {
                let t = format!("timeout:{op}");
                cx.start_timer(&t, cx.now.saturating_add((s.min(u32::MAX as u64) * 1000) as i64));
                t
            });
            let heartbeat = heartbeat_s.map(|s| {
                let t = format!("heartbeat:{op}");
                let ms = s.min(u32::MAX as u64) * 1000;
                cx.start_timer(&t, cx.now.saturating_add(ms as i64));
                (t, ms)
            });
            run.step = Step::Task {
                op,
                effective: eff,
                timeout,
                heartbeat,
            };
            Ok(())
        }
        Kind::Parallel { branches } => {
            let eff = effective(cx, run, st, &ctx)?;
            let base = op_id(run, st);
            let slots = branches
                .iter()
                .enumerate()
                .map(|(i, &g)| Slot::Running {
                    run: Box::new(child(cx, run, g, eff.clone(), format!("{base}/{i}/"))),
                })
                .collect();
            run.step = Step::Children {
                slots,
                pending: Vec::new(),
                max: 0,
                tolerated: None,
                failures: 0,
                total: branches.len() as u64,
            };
            let _ = eff;
            Ok(())
        }
        Kind::Map(spec) => {
            let eff = effective(cx, run, st, &ctx)?;
            let env = Env {
                input: &eff,
                context: &ctx,
                vars: &run.vars,
                rng: &cx.rng,
            };
            let items = match st.lang {
                Lang::JsonPath => match &spec.items_path {
                    Some(p) => p.read(&env)?,
                    None => eff.clone(),
                },
                Lang::Jsonata => match &spec.items {
                    Some(q) => q.eval(&states_obj(&run.input, &ctx, None, None), &env)?,
                    None => eff.clone(),
                },
            };
            let Value::Array(items) = items else {
                let why = format!("the Map state's items must be an array, not {items}");
                return Err(match st.lang {
                    Lang::JsonPath => AslError::runtime(why),
                    Lang::Jsonata => AslError::query(why),
                });
            };
            let max = match &spec.max_concurrency {
                Some(d) => number(cx, run, d, &eff, &ctx, "MaxConcurrency", non_negative)?,
                None => 0,
            };
            let count = match &spec.tolerated_count {
                Some(d) => Some(number(cx, run, d, &eff, &ctx, "ToleratedFailureCount", non_negative)?),
                None => None,
            };
            let percentage = match &spec.tolerated_percentage {
                Some(d) => Some(number(cx, run, d, &eff, &ctx, "ToleratedFailurePercentage", |v| {
                    v.as_f64().filter(|p| (0.0..=100.0).contains(p))
                })?),
                None => None,
            };
            // Each item's input: ItemSelector / Parameters with $$.Map.Item.
            let mut inputs = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let selected = match (st.lang, &st.parameters, &spec.item_selector) {
                    (Lang::JsonPath, Some(t), _) => {
                        let ictx = cx.context(run, st, Some((i, item)), None);
                        let ictx = if ictx.is_null() {
                            json!({"Map": {"Item": {"Index": i, "Value": item}}})
                        } else {
                            ictx
                        };
                        t.eval(&Env {
                            input: &eff,
                            context: &ictx,
                            vars: &run.vars,
                            rng: &cx.rng,
                        })?
                    }
                    (Lang::Jsonata, _, Some(q)) => {
                        let mut ictx = cx.context(run, st, Some((i, item)), None);
                        if ictx.is_null() {
                            ictx = json!({"Map": {"Item": {"Index": i, "Value": item}}});
                        }
                        q.eval(
                            &states_obj(&run.input, &ictx, None, None),
                            &Env {
                                input: &eff,
                                context: &ictx,
                                vars: &run.vars,
                                rng: &cx.rng,
                            },
                        )?
                    }
                    _ => item.clone(),
                };
                inputs.push(selected);
            }
            let total = inputs.len() as u64;
            inputs.reverse();
            run.step = Step::Children {
                slots: Vec::new(),
                pending: inputs,
                max,
                tolerated: (count.is_some() || percentage.is_some()).then_some(Tolerance { count, percentage }),
                failures: 0,
                total,
            };
            Ok(())
        }
    }
}

/// How a Task starts another state machine's execution (`arn:aws:states:::states:startExecution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StartExecution {
    /// Start it and go on.
    Start,
    /// `.sync`: wait for it; its input and output are JSON text in the result.
    Sync,
    /// `.sync:2`: wait for it; its input and output are JSON in the result.
    Sync2,
}

impl StartExecution {
    fn of(resource: &str) -> Option<StartExecution> {
        match resource.strip_prefix("arn:aws:states:::states:startExecution")? {
            "" => Some(StartExecution::Start),
            ".sync" => Some(StartExecution::Sync),
            ".sync:2" => Some(StartExecution::Sync2),
            _ => None,
        }
    }
}

fn execution_arn(definition: &str, id: &str) -> String {
    format!("arn:aws:states:local:000000000000:execution:{definition}:{id}")
}

fn state_machine_arn(definition: &str) -> String {
    format!("arn:aws:states:local:000000000000:stateMachine:{definition}")
}

/// The definition (by name, the last part of `StateMachineArn`) and input a startExecution Task
/// gives.
fn start_execution_target(eff: &Value) -> Result<(String, Value), AslError> {
    let arn = eff
        .get("StateMachineArn")
        .and_then(Value::as_str)
        .ok_or_else(|| AslError::runtime("a startExecution Task needs Parameters with StateMachineArn (a string)"))?;
    // arn:aws:states:REGION:ACCOUNT:stateMachine:NAME[:VERSION], or just NAME.
    let name = match arn.split(':').collect::<Vec<_>>().as_slice() {
        [.., "stateMachine", name] | [.., "stateMachine", name, _] => name.to_string(),
        _ => arn.to_string(),
    };
    let input = match eff.get("Input") {
        None => json!({}),
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        Some(v) => v.clone(),
    };
    Ok((name, input))
}

/// The result of a `.sync` startExecution Task from the child's output or failure, as AWS gives it.
fn sync_result(
    cx: &Cx,
    mode: StartExecution,
    eff: &Value,
    op: &str,
    result: Result<Value, AslError>,
) -> Result<Value, AslError> {
    let (definition, input) = start_execution_target(eff)?;
    let child = format!("{}/{op}", cx.id);
    let text = |v: &Value| match mode {
        StartExecution::Sync2 => v.clone(),
        _ => Value::String(v.to_string()),
    };
    let mut described = json!({
        "ExecutionArn": execution_arn(&definition, &child),
        "Input": text(&input),
        "Name": child,
        "StateMachineArn": state_machine_arn(&definition),
        "StopDate": rfc3339(cx.now),
    });
    match result {
        Ok(output) => {
            described["Output"] = text(&output);
            described["Status"] = json!("SUCCEEDED");
            Ok(described)
        }
        Err(e) => {
            described["Status"] = json!("FAILED");
            if let Some(name) = &e.error {
                described["Error"] = json!(name);
            }
            if let Some(cause) = &e.cause {
                described["Cause"] = json!(cause);
            }
            Err(AslError::new(names::TASK_FAILED, described.to_string()))
        }
    }
}

fn child(cx: &Cx, parent: &Run, graph: usize, input: Value, prefix: String) -> Run {
    Run {
        graph,
        state: cx.m.graphs[graph].start,
        input,
        vars: parent.vars.clone(),
        prefix,
        visits: 0,
        entered: cx.now,
        retry: None,
        step: Step::Enter,
    }
}

/// Runs the children of a Parallel or Map; true when the state moved on (finished or failed).
fn children(cx: &mut Cx, run: &mut Run) -> bool {
    let st = state(cx, run);
    let base = op_id(run, st);
    let Step::Children {
        slots,
        pending,
        max,
        tolerated,
        failures,
        total,
    } = &mut run.step
    else {
        return true;
    };
    let mut failed: Option<AslError> = None;
    loop {
        // Start iterations up to the limit.
        let running = slots.iter().filter(|s| matches!(s, Slot::Running { .. })).count() as u64;
        let mut room = if *max == 0 {
            u64::MAX
        } else {
            max.saturating_sub(running)
        };
        while room > 0 {
            let Some(input) = pending.pop() else { break };
            let i = slots.len();
            let graph = match &st.kind {
                Kind::Map(spec) => spec.processor,
                _ => 0,
            };
            let c = Run {
                graph,
                state: cx.m.graphs[graph].start,
                input,
                vars: run.vars.clone(),
                prefix: format!("{base}/{i}/"),
                visits: 0,
                entered: cx.now,
                retry: None,
                step: Step::Enter,
            };
            slots.push(Slot::Running { run: Box::new(c) });
            room -= 1;
        }
        let mut changed = false;
        for s in slots.iter_mut() {
            let Slot::Running { run: c } = s else { continue };
            advance(cx, c, false);
            if let Step::Done { outcome } = &c.step {
                changed = true;
                *s = match outcome.clone() {
                    Outcome::Output(output) => Slot::Done { output },
                    Outcome::Error(error) => {
                        *failures += 1;
                        let tolerated_now = match tolerated {
                            None => false,
                            Some(t) => {
                                let by_count = t.count.is_some_and(|n| *failures <= n);
                                let by_pct = t
                                    .percentage
                                    .is_some_and(|p| (*failures as f64) * 100.0 <= p * (*total as f64));
                                by_count || by_pct
                            }
                        };
                        if !tolerated_now && failed.is_none() {
                            failed = Some(match tolerated {
                                None => error.clone(),
                                Some(_) => AslError::new(
                                    names::EXCEED_TOLERATED_FAILURE_THRESHOLD,
                                    "the Map state failed because its failures passed the tolerated threshold",
                                ),
                            });
                        }
                        Slot::Failed { error }
                    }
                };
            }
            if failed.is_some() {
                break;
            }
        }
        if failed.is_some() {
            break;
        }
        let all_done = pending.is_empty() && slots.iter().all(|s| !matches!(s, Slot::Running { .. }));
        if all_done {
            break;
        }
        if !changed {
            return false;
        }
    }
    let step = std::mem::replace(&mut run.step, Step::Enter);
    let Step::Children { mut slots, .. } = step else {
        return true;
    };
    if let Some(e) = failed {
        for s in &mut slots {
            if let Slot::Running { run: c } = s {
                cancel(cx, c);
            }
        }
        fail(cx, run, e);
        return true;
    }
    let results: Vec<Value> = slots
        .into_iter()
        .map(|s| match s {
            Slot::Done { output } => output,
            Slot::Failed { error } => error.to_json(),
            Slot::Running { .. } => Value::Null,
        })
        .collect();
    let eff = run.input.clone();
    task_result(cx, run, eff, Value::Array(results));
    true
}

/// A Task, Parallel or Map produced `result`: ResultSelector, then the state's output.
fn task_result(cx: &mut Cx, run: &mut Run, effective: Value, result: Value) {
    let _ = effective;
    let st = state(cx, run);
    let selected = match (&st.result_selector, st.lang) {
        (Some(t), Lang::JsonPath) => {
            let ctx = cx.context(run, st, None, None);
            t.eval(&Env {
                input: &result,
                context: &ctx,
                vars: &run.vars,
                rng: &cx.rng,
            })
        }
        _ => Ok(result),
    };
    match selected {
        Ok(r) => finish(cx, run, st, r),
        Err(e) => fail(cx, run, e),
    }
}

/// The state produced `result`: ResultPath and OutputPath (JSONPath) or Output (JSONata), Assign,
/// then the transition.
fn finish(cx: &mut Cx, run: &mut Run, st: &State, result: Value) {
    let ctx = cx.context(run, st, None, None);
    let done = (|| -> Result<(Value, Option<Map<String, Value>>), AslError> {
        let assigned = match &st.assign {
            Some(a) => Some(assign_values(cx, run, a, &result, &ctx, Some(&result), None)?),
            None => None,
        };
        let out = match st.lang {
            Lang::JsonPath => {
                let combined = match &st.result_path {
                    ResultPath::Replace => result,
                    ResultPath::Discard => run.input.clone(),
                    ResultPath::At(p) => p.write(run.input.clone(), result)?,
                };
                output_path(cx, run, st, combined, &ctx)?
            }
            Lang::Jsonata => match &st.output {
                Some(q) => {
                    let has_result = matches!(st.kind, Kind::Task { .. } | Kind::Parallel { .. } | Kind::Map(_));
                    q.eval(
                        &states_obj(&run.input, &ctx, has_result.then_some(&result), None),
                        &Env {
                            input: &run.input,
                            context: &ctx,
                            vars: &run.vars,
                            rng: &cx.rng,
                        },
                    )?
                }
                None => result,
            },
        };
        Ok((out, assigned))
    })();
    match done {
        Ok((out, assigned)) => {
            apply_assign(run, assigned);
            go(cx, run, st.next, out);
            if st.next.is_some() {
                cx.cover(|| format!("{}/Next", st.pointer));
            }
        }
        Err(e) => fail(cx, run, e),
    }
}

fn output_path(cx: &Cx, run: &Run, st: &State, v: Value, ctx: &Value) -> Result<Value, AslError> {
    match &st.output_path {
        None => Ok(v),
        Some(None) => Ok(json!({})),
        Some(Some(p)) => read_path(p, &v, ctx, &run.vars, &cx.rng),
    }
}

/// A Choice or Wait state moves on without a result of its own.
fn transition(
    cx: &mut Cx,
    run: &mut Run,
    st: &State,
    effective: Value,
    next: Option<usize>,
    rule_assign: Option<&Assign>,
    ctx: &Value,
) -> Result<(), AslError> {
    let assign = rule_assign.or(st.assign.as_ref());
    let assigned = match assign {
        Some(a) => Some(assign_values(cx, run, a, &effective, ctx, None, None)?),
        None => None,
    };
    let out = match st.lang {
        Lang::JsonPath => output_path(cx, run, st, effective, ctx)?,
        Lang::Jsonata => match &st.output {
            Some(q) => q.eval(
                &states_obj(&run.input, ctx, None, None),
                &Env {
                    input: &run.input,
                    context: ctx,
                    vars: &run.vars,
                    rng: &cx.rng,
                },
            )?,
            None => effective,
        },
    };
    apply_assign(run, assigned);
    go(cx, run, next, out);
    Ok(())
}

fn assign_values(
    cx: &Cx,
    run: &Run,
    a: &Assign,
    dollar: &Value,
    ctx: &Value,
    result: Option<&Value>,
    error: Option<&Value>,
) -> Result<Map<String, Value>, AslError> {
    let env = Env {
        input: dollar,
        context: ctx,
        vars: &run.vars,
        rng: &cx.rng,
    };
    let v = match a {
        Assign::Template(t) => t.eval(&env)?,
        Assign::Query(q) => q.eval(&states_obj(&run.input, ctx, result, error), &env)?,
    };
    match v {
        Value::Object(m) => Ok(m),
        other => Err(AslError::runtime(format!("Assign must give an object, not {other}"))),
    }
}

fn apply_assign(run: &mut Run, assigned: Option<Map<String, Value>>) {
    if let Some(m) = assigned {
        for (k, v) in m {
            run.vars.insert(k, v);
        }
    }
}

fn go(cx: &mut Cx, run: &mut Run, next: Option<usize>, out: Value) {
    let _ = cx;
    run.retry = None;
    match next {
        Some(n) => {
            run.state = n;
            run.input = out;
            run.step = Step::Enter;
        }
        None => {
            run.step = Step::Done {
                outcome: Outcome::Output(out),
            };
        }
    }
}

/// True when an error list (ErrorEquals) matches `name`.
pub fn matches(list: &[String], name: Option<&str>) -> bool {
    let Some(name) = name else {
        return list.iter().any(|e| e == names::ALL);
    };
    if name == names::RUNTIME {
        return false;
    }
    let timeout = name == names::TIMEOUT || name == names::HEARTBEAT_TIMEOUT;
    list.iter().any(|e| {
        e == name
            || e == names::ALL
            || (e == names::TASK_FAILED && !timeout)
            // States.Timeout covers a missed heartbeat too (AWS reports it as States.HeartbeatTimeout).
            || (e == names::TIMEOUT && timeout)
    })
}

/// The state failed with `e`: retry, catch, or end the run with the error.
fn fail(cx: &mut Cx, run: &mut Run, e: AslError) {
    let st = state(cx, run);
    let name = e.error.as_deref();
    if let Some(i) = st.retry.iter().position(|r| matches(&r.errors, name)) {
        let r = &st.retry[i];
        let (mut counts, attempts) = run.retry.take().unwrap_or_else(|| (vec![0; st.retry.len()], 0));
        if counts[i] < r.max_attempts {
            let mut delay = r.interval * r.backoff.powi(counts[i] as i32);
            if let Some(m) = r.max_delay {
                delay = delay.min(m);
            }
            if r.full_jitter {
                delay *= cx.unit();
            }
            counts[i] += 1;
            run.retry = Some((counts, attempts + 1));
            cx.trace(|| Trace::Retrying {
                op: format!("{}{}#{}", run.prefix, st.name, run.visits),
                attempt: attempts + 2,
                delay_ms: (delay * 1000.0) as u64,
            });
            let ms = (delay * 1000.0).clamp(0.0, 1e15) as i64;
            let timer = format!("retry:{}", op_id(run, st));
            cx.start_timer(&timer, cx.now.saturating_add(ms));
            run.step = Step::Backoff { timer };
            return;
        }
        run.retry = Some((counts, attempts));
    }
    if let Some((n, c)) = st.catch.iter().enumerate().find(|(_, c)| matches(&c.errors, name)) {
        match catch(cx, run, st, c, &e) {
            Ok(()) => cx.cover(|| format!("{}/Catch/{n}", st.pointer)),
            Err(e2) => {
                run.retry = None;
                run.step = Step::Done {
                    outcome: Outcome::Error(e2),
                };
            }
        }
        return;
    }
    run.retry = None;
    run.step = Step::Done {
        outcome: Outcome::Error(e),
    };
}

fn catch(cx: &mut Cx, run: &mut Run, st: &State, c: &Catcher, e: &AslError) -> Result<(), AslError> {
    let ctx = cx.context(run, st, None, None);
    let error_output = e.to_json();
    let assigned = match &c.assign {
        Some(a) => Some(assign_values(
            cx,
            run,
            a,
            &error_output,
            &ctx,
            None,
            Some(&error_output),
        )?),
        None => None,
    };
    let out = match st.lang {
        Lang::JsonPath => match &c.result_path {
            ResultPath::Replace => error_output,
            ResultPath::Discard => run.input.clone(),
            ResultPath::At(p) => p.write(run.input.clone(), error_output)?,
        },
        Lang::Jsonata => match &c.output {
            Some(q) => q.eval(
                &states_obj(&run.input, &ctx, None, Some(&error_output)),
                &Env {
                    input: &run.input,
                    context: &ctx,
                    vars: &run.vars,
                    rng: &cx.rng,
                },
            )?,
            None => error_output,
        },
    };
    apply_assign(run, assigned);
    go(cx, run, Some(c.next), out);
    Ok(())
}

/// The run's outcome, once it has one.
pub fn outcome(run: &Run) -> Option<&Outcome> {
    match &run.step {
        Step::Done { outcome } => Some(outcome),
        _ => None,
    }
}

/// For a worker task (`.waitForTaskToken`) `op`: whether it is open. `None` when no run waits for it.
pub fn waits_for(run: &Run, op: &str) -> bool {
    match &run.step {
        Step::Task { op: o, .. } => o == op,
        Step::Children { slots, .. } => slots.iter().any(|s| match s {
            Slot::Running { run } => waits_for(run, op),
            _ => false,
        }),
        _ => false,
    }
}
