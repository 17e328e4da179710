//! The driver: one way to run an instance through the engine, for every host.
//!
//! A host (in-memory, SQLite, Kafka) keeps instances somewhere and performs effects somehow; how an
//! input becomes a step is decided here, once. [`Driver::step`] takes an instance with its host
//! bookkeeping ([`Hosted`]) and a timed input, runs the engine, and returns a [`Step`]: the journal
//! entries to record, the [`Work`] to perform in order (calls, worker tasks, children to start,
//! events to send, timers to arm or cancel, operations to stop) and the parent to notify. The
//! driver owns the policies every host must agree on: the journal limit, what an engine panic
//! does, how deep subflows nest, parent links, what cancelling an operation stops, which instance
//! an event is for and whether an instance accepts it, and whether a worker's answer still counts.
//!
//! Like the engine it does no IO and reads no clock: time comes in with the input, so it is tested
//! by feeding inputs and checking outputs.

use crate::functions::FunctionCall;
use crate::tasks::{Answer, Task};
use serde_json::{json, Value};
use sm4c_runtime::engine::event::{attribute_text, kind_matches, mismatch};
use sm4c_runtime::engine::redrive::{RedriveError, RedrivePlan};
use sm4c_runtime::{Effect, Entry, ErrorInfo, ErrorKind, Input, Instance, Machine, Millis, Options, Status, Timed};
use std::sync::Arc;

/// How deep subflows may nest (a definition that starts itself would otherwise never end).
pub const MAX_SUBFLOW_DEPTH: u32 = 32;

/// The CloudEvent extension attribute that names the instance an event is for.
pub const INSTANCE_ATTRIBUTE: &str = "sm4cinstanceid";

/// Limits every host enforces the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest journal of one instance (entries); past it the instance fails with `limitExceeded`.
    pub max_journal: i64,
    /// How deep subflows may nest: a top-level instance is at depth 0, its subflows at 1.
    pub max_subflow_depth: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_journal: 100_000,
            max_subflow_depth: MAX_SUBFLOW_DEPTH,
        }
    }
}

/// How a subflow is linked to the instance that started it.
///
/// Serialised as the tuple `[instance, op, waits]`, as stores and Kafka records have always kept it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "(String, String, bool)", into = "(String, String, bool)")]
pub struct ParentLink {
    /// The parent instance.
    pub instance: String,
    /// The parent's operation id that started the child.
    pub op: String,
    /// Whether the parent waits for the child's output.
    pub waits: bool,
}

impl From<(String, String, bool)> for ParentLink {
    fn from((instance, op, waits): (String, String, bool)) -> Self {
        ParentLink { instance, op, waits }
    }
}

impl From<ParentLink> for (String, String, bool) {
    fn from(l: ParentLink) -> Self {
        (l.instance, l.op, l.waits)
    }
}

/// The instance id of the subflow that operation `op` of instance `parent` starts (deterministic,
/// so a start repeated after a crash names the same child).
pub fn child_id(parent: &str, op: &str) -> String {
    format!("{parent}/{op}")
}

/// An instance with what a host keeps beside it.
pub struct Hosted {
    /// The instance.
    pub inst: Instance,
    /// The parent, for a subflow.
    pub parent: Option<ParentLink>,
    /// 0 for a top-level instance, the parent's depth + 1 for a subflow.
    pub depth: u32,
    /// Calls and subflow starts the instance has asked for and not seen through (`InvokeFunction`
    /// and `StartSubflow` effects): kept with the instance so a crash cannot lose them. A call
    /// leaves when it returns or is stopped, a subflow the parent waits for when it ends, one it
    /// does not wait for once the host has started it ([`Hosted::child_started`]).
    pub open: Vec<Effect>,
    /// Journal entries already recorded by the host.
    pub journal_len: i64,
    /// Journal entries not yet recorded (the host drains them when it commits).
    pub pending: Vec<Entry>,
    /// The W3C `traceparent` of the request or event that started the instance, where the host
    /// keeps it: the spans of its steps link to it ([`crate::metrics::StepSpan::origin`]).
    pub origin: Option<String>,
}

impl Hosted {
    /// An instance restored from what a host stored.
    pub fn restored(
        inst: Instance,
        parent: Option<ParentLink>,
        depth: u32,
        open: Vec<Effect>,
        journal_len: i64,
    ) -> Self {
        Hosted {
            inst,
            parent,
            depth,
            open,
            journal_len,
            pending: Vec::new(),
            origin: None,
        }
    }

    /// The open call or subflow start with operation id `op`.
    pub fn open_op(&self, op: &str) -> Option<&Effect> {
        self.open.iter().find(|e| op_of(e) == Some(op))
    }

    /// Whether `op` is a worker task the instance has not seen answered.
    pub fn open_task(&self, op: &str) -> bool {
        self.open_op(op).is_some_and(is_task)
    }

    /// The subflow that operation `op` starts is started (durably, where the host is durable): a
    /// parent that does not wait for it has nothing left to remember about it.
    pub fn child_started(&mut self, op: &str) {
        if self
            .open_op(op)
            .is_some_and(|e| matches!(e, Effect::StartSubflow { wait: false, .. }))
        {
            self.close(op);
        }
    }

    fn close(&mut self, op: &str) -> Option<Effect> {
        let pos = self.open.iter().position(|e| op_of(e) == Some(op))?;
        Some(self.open.remove(pos))
    }
}

/// The operation id of an effect that has one.
pub fn op_of(effect: &Effect) -> Option<&str> {
    match effect {
        Effect::InvokeFunction { op, .. }
        | Effect::StartSubflow { op, .. }
        | Effect::SendEvent { op, .. }
        | Effect::CancelOperation { op } => Some(op),
        Effect::StartTimer { .. } | Effect::CancelTimer { .. } => None,
    }
}

/// Reports a step of `h` to the metrics observer: a start, the actions that ended (`running` is
/// what ran before the step, as (operation, start): an action that ended in this step took from
/// its start to `at`, or nothing when it started here), the transitions its trace shows, its end.
fn observe(
    o: &dyn crate::metrics::Observer,
    h: &Hosted,
    started: bool,
    step: &Step,
    at: Millis,
    running: &[(String, Millis)],
) {
    let definition = h.inst.machine().id.as_str();
    if started {
        o.instance_started(definition);
    }
    for e in &step.entries {
        let (op, action, outcome) = match e {
            Entry::Trace(sm4c_runtime::Trace::ActionCompleted { op, action }) => (op, action, "completed"),
            Entry::Trace(sm4c_runtime::Trace::ActionFailed { op, action, .. }) => (op, action, "failed"),
            _ => continue,
        };
        let begun = running.iter().find(|(o, _)| o == op).map_or(at, |(_, t)| *t);
        o.action_ended(action, outcome, at.saturating_sub(begun).max(0) as f64 / 1000.0);
    }
    let fired = step
        .entries
        .iter()
        .filter(|e| matches!(e, Entry::Trace(sm4c_runtime::Trace::TransitionFired { .. })))
        .count() as u64;
    if fired > 0 {
        o.transitions(definition, fired);
    }
    if step.finished {
        o.instance_ended(definition, h.inst.status());
    }
}

/// The name of an input's kind, for a step's span.
fn input_kind(input: &Input) -> &'static str {
    match input {
        Input::Start { .. } => "start",
        Input::Completed { .. } => "completed",
        Input::Failed { .. } => "failed",
        Input::TaskStarted { .. } => "taskStarted",
        Input::TaskHeartbeat { .. } => "taskHeartbeat",
        Input::Event { .. } => "event",
        Input::TimerFired { .. } => "timerFired",
        Input::Abort { .. } => "abort",
        Input::Cancel { .. } => "cancel",
        Input::Debug { .. } => "debug",
        Input::Resume { .. } => "resume",
        Input::Migrate { .. } => "migrate",
        Input::Redrive { .. } => "redrive",
    }
}

/// A W3C `traceparent` of version 00 with a non-zero trace and span id, trimmed; `None` for
/// anything else (a malformed header is ignored, as the Trace Context specification asks).
pub fn traceparent(v: &str) -> Option<&str> {
    let v = v.trim();
    let parts: Vec<&str> = v.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2)
        && parts[1].bytes().any(|b| b != b'0')
        && parts[2].bytes().any(|b| b != b'0'))
    .then_some(v)
}

/// Puts the `traceparent` of a step's span on the calls it makes and on the events it sends: as
/// the event's `traceparent` attribute when it carries none (the CloudEvents distributed-tracing
/// extension: its origin), and always as its hop ([`Work::Send`]).
fn propagate(work: &mut [Work], traceparent: &str) {
    for w in work {
        match w {
            Work::Call { call, .. } => call.traceparent = Some(traceparent.to_string()),
            Work::Send { event, hop, .. } => {
                if let Some(o) = event.as_object_mut() {
                    o.entry("traceparent").or_insert_with(|| traceparent.into());
                }
                *hop = Some(traceparent.to_string());
            }
            _ => {}
        }
    }
}

/// After a crash, what an open call of an instance comes to: `None` for a call that is made again
/// (`atLeastOnce`, and any other work), or, for an `atMostOnce` call ([`FunctionCall::delivery`]),
/// the input that fails it with [`ErrorKind::StepInterrupted`] instead. Its start was committed
/// before it was made, so it may have reached the function: it is never made again. The host
/// journals the input like any other, so a replay sees the same failure, and the action's error
/// handlers and retry policies see it like any other error (a retry is a new call).
pub fn interrupted(work: &Work) -> Option<Input> {
    let Work::Call { call, .. } = work else {
        return None;
    };
    if call.delivery != sm4c_runtime::Delivery::AtMostOnce {
        return None;
    }
    let error = ErrorInfo::new(
        ErrorKind::StepInterrupted,
        format!(
            "the call of function {:?} (operation {}) was in flight when the host stopped; its delivery is atMostOnce, so it is not made again",
            call.function, call.op
        ),
    )
    .with_details(json!({"function": call.function, "op": call.op, "delivery": "atMostOnce"}));
    Some(Input::Failed {
        op: call.op.clone(),
        error,
    })
}

/// Whether an effect asks for a worker task (a call of a `worker` function).
pub fn is_task(effect: &Effect) -> bool {
    matches!(effect, Effect::InvokeFunction { function_type, .. } if function_type == "worker")
}

/// Whether an open call or subflow start is waited for.
pub fn waits(effect: &Effect) -> bool {
    match effect {
        Effect::InvokeFunction { wait, .. } | Effect::StartSubflow { wait, .. } => *wait,
        _ => false,
    }
}

/// A subflow to start: the host creates it with [`Driver::child`] wherever the child lives.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildStart {
    /// The child's instance id ([`child_id`]).
    pub id: String,
    /// The definition `invokeSubflow` names by `id`.
    pub definition: String,
    /// The child's input.
    pub input: Value,
    /// Its link to the parent.
    pub parent: ParentLink,
    /// Its depth.
    pub depth: u32,
}

/// Something a host must do for an instance after a step, in the order the engine asked.
#[derive(Debug, Clone, PartialEq)]
pub enum Work {
    /// Call a function (`rest`, `rpc`, or anything the application's functions answer).
    Call {
        /// The call.
        call: FunctionCall,
        /// Whether the instance waits for the result ([`Driver::call_done`]).
        wait: bool,
    },
    /// Put a worker task on its task list.
    Task {
        /// The task.
        task: Task,
        /// Whether the instance waits for the answer ([`Driver::answer`]).
        wait: bool,
    },
    /// Start a subflow.
    StartChild(ChildStart),
    /// Publish a CloudEvent the instance sent, and route it to the other instances.
    Send {
        /// The operation id of the `sendEvent`.
        op: String,
        /// The event (JSON structured form), with its deterministic `id`.
        event: Value,
        /// The W3C `traceparent` of the step that sent it, when steps are traced: the per-hop
        /// context a transport carries in its own headers (a Kafka record's `traceparent`
        /// header), while the event's `traceparent` attribute keeps its origin.
        hop: Option<String>,
    },
    /// Deliver `TimerFired { timer }` at `due`.
    ArmTimer {
        /// Timer id.
        timer: String,
        /// Due time, ms since the Unix epoch.
        due: Millis,
    },
    /// The timer is no longer wanted.
    CancelTimer {
        /// Timer id.
        timer: String,
        /// When it was due, when the driver knows it (the step that cancelled it saw it armed):
        /// a host finds it among its timers by it rather than looking through all of them.
        due: Option<Millis>,
    },
    /// Operation `op` is no longer wanted: stop its call, withdraw its task, and cancel its
    /// subflow `child` if one runs.
    Stop {
        /// The operation id.
        op: String,
        /// The subflow that operation would have started ([`child_id`]).
        child: String,
    },
}

/// An input for another instance: the parent of a subflow that ended, or a parent whose subflow
/// could not start.
#[derive(Debug, Clone, PartialEq)]
pub struct Notify {
    /// The instance to deliver to.
    pub instance: String,
    /// What it receives.
    pub input: Input,
}

/// What one input did to an instance.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Step {
    /// Journal entries the step produced (also appended to [`Hosted::pending`] when the instance
    /// journals).
    pub entries: Vec<Entry>,
    /// What the host must do, in order.
    pub work: Vec<Work>,
    /// The parent to tell that this subflow ended.
    pub notify: Option<Notify>,
    /// True when this input ended the instance.
    pub finished: bool,
}

/// What a worker's answer to a task comes to.
#[derive(Debug, Clone, PartialEq)]
pub enum Answering {
    /// The task is open: deliver `input` (`None` when nobody waits for the answer).
    Open {
        /// The input for the instance.
        input: Option<Input>,
    },
    /// The task was answered already, timed out, was cancelled, or never existed.
    Closed,
}

/// Runs instances through the engine: one policy for every host.
#[derive(Debug, Clone)]
pub struct Driver {
    /// Engine settings for every instance.
    pub options: Options,
    /// The limits.
    pub limits: Limits,
    /// ASL Task Resources the host configuration binds to worker task lists (Resource → task
    /// list; [`crate::Functions::task_lists`]): their Tasks become worker tasks on that list.
    pub task_lists: Option<Arc<TaskListBindings>>,
    /// ASL Task Resources host configuration makes `atMostOnce` ([`crate::Functions::at_most_once`]):
    /// ASL has no field for it, so their calls get it here.
    pub at_most_once: Option<Arc<AtMostOnceResources>>,
}

/// ASL Task Resources whose calls are `atMostOnce`, from host configuration.
pub type AtMostOnceResources = std::collections::BTreeSet<String>;

/// ASL Task Resources bound to worker task lists, from host configuration.
pub type TaskListBindings = std::collections::BTreeMap<String, String>;

impl Default for Driver {
    fn default() -> Self {
        Driver::durable()
    }
}

impl Driver {
    /// The driver of hosts that keep a journal and trace steps (the durable and Kafka hosts).
    pub fn durable() -> Driver {
        Driver {
            options: Options {
                journal: true,
                trace: true,
                ..Options::default()
            },
            limits: Limits::default(),
            task_lists: None,
            at_most_once: None,
        }
    }

    /// A new top-level instance.
    pub fn create(&self, machine: Arc<Machine>, id: &str) -> Hosted {
        Hosted::restored(Instance::new(machine, id, self.options), None, 0, Vec::new(), 0)
    }

    /// An instance restored from its snapshot.
    pub fn restore(&self, machine: Arc<Machine>, snapshot: sm4c_runtime::Snapshot) -> Instance {
        Instance::from_snapshot(machine, snapshot, self.options)
    }

    /// The subflow a [`Work::StartChild`] asks for, of `machine` (the definition the host found by
    /// `id`, `None` when there is none). When it cannot start, the parent is told why if it waits.
    pub fn child(&self, start: &ChildStart, machine: Option<Arc<Machine>>) -> Result<Hosted, Option<Notify>> {
        let refuse = |message: String| {
            let error = ErrorInfo::new(ErrorKind::SubflowError, message);
            let op = start.parent.op.clone();
            Err(start.parent.waits.then(|| Notify {
                instance: start.parent.instance.clone(),
                input: Input::Failed { op, error },
            }))
        };
        let definition = &start.definition;
        if start.depth > self.limits.max_subflow_depth {
            return refuse(format!(
                "subflow {definition:?} would nest deeper than {} levels (does a subflow start itself?)",
                self.limits.max_subflow_depth
            ));
        }
        let Some(machine) = machine else {
            return refuse(format!("no definition with id {definition:?} for invokeSubflow"));
        };
        let mut child = self.create(machine, &start.id);
        child.parent = Some(start.parent.clone());
        child.depth = start.depth;
        Ok(child)
    }

    /// Runs one input through the engine.
    ///
    /// An instance that has ended takes no more input. A full journal fails the instance instead of
    /// taking the input, and a panic in the engine fails only this instance, with its message.
    pub fn step(&self, h: &mut Hosted, timed: Timed) -> Step {
        if h.inst.status().is_final() {
            return Step::default();
        }
        if let Input::Completed { op, .. } | Input::Failed { op, .. } = &timed.input {
            h.close(op);
        }
        let max = self.limits.max_journal;
        let input = if h.journal_len + h.pending.len() as i64 >= max {
            Input::Abort {
                error: ErrorInfo::new(
                    ErrorKind::LimitExceeded,
                    format!("the journal of this instance reached its limit of {max} entries"),
                ),
            }
        } else {
            timed.input
        };
        let at = timed.at;
        let starts = matches!(input, Input::Start { .. });
        let Some(o) = crate::metrics::observer() else {
            return self.run_engine(h, |inst| inst.handle(Timed { at, input }));
        };
        // Only an input that answers or times something can end an action begun earlier.
        let running = if matches!(input, Input::Start { .. } | Input::Debug { .. }) {
            Vec::new()
        } else {
            h.inst.snapshot().running_actions()
        };
        let Some(begun) = o.step_begin() else {
            let step = self.run_engine(h, |inst| inst.handle(Timed { at, input }));
            observe(o, h, starts, &step, at, &running);
            return step;
        };
        let kind = input_kind(&input);
        let event = match &input {
            Input::Event { event } => event.get("traceparent").and_then(Value::as_str).map(str::to_string),
            _ => None,
        };
        let mut step = self.run_engine(h, |inst| inst.handle(Timed { at, input }));
        observe(o, h, starts, &step, at, &running);
        let transitions = step
            .entries
            .iter()
            .filter(|e| matches!(e, Entry::Trace(sm4c_runtime::Trace::TransitionFired { .. })))
            .count() as u64;
        let span = crate::metrics::StepSpan {
            instance: h.inst.id(),
            definition: h.inst.machine().id.as_str(),
            input: kind,
            origin: h.origin.as_deref(),
            event: event.as_deref(),
            state: h.inst.state_name(),
            status: h.inst.status(),
            transitions,
        };
        if let Some(parent) = o.step_traced(begun, &span) {
            propagate(&mut step.work, &parent);
        }
        step
    }

    /// Moves the instance to version `to` of its definition at time `at` (see
    /// [`Instance::migrate`]): a step like any input's, or why it cannot move (nothing changes).
    pub fn migrate(
        &self,
        h: &mut Hosted,
        to: Arc<Machine>,
        states: &std::collections::BTreeMap<String, String>,
        at: Millis,
    ) -> Result<Step, sm4c_runtime::engine::migrate::NotMigratable> {
        h.inst.migration_plan(&to, states, at)?;
        let mut refused = None;
        let step = self.run_engine(h, |inst| match inst.migrate(to, states, at) {
            Ok(out) => out,
            Err(e) => {
                refused = Some(e);
                Default::default()
            }
        });
        match refused {
            Some(e) => Err(e),
            None => Ok(step),
        }
    }

    /// Redrives the failed or timed-out instance at time `at` (see [`Instance::redrive_plan`]):
    /// its data changed by `update` (a jq expression), at most `cap` redrives unless its
    /// definition says otherwise. A step like any input's with what the redrive does, or why it
    /// cannot be redriven (nothing changes).
    pub fn redrive(
        &self,
        h: &mut Hosted,
        update: Option<&str>,
        cap: Option<u32>,
        at: Millis,
    ) -> Result<(RedrivePlan, Step), RedriveError> {
        let plan = h.inst.redrive_plan(update, cap)?;
        let input = plan.input.clone();
        let step = self.run_engine(h, |inst| inst.handle(Timed { at, input }));
        Ok((plan, step))
    }

    /// Runs the engine on the instance through `engine` (a seam for tests that need the engine to
    /// panic) and turns its output into a step.
    fn run_engine(&self, h: &mut Hosted, engine: impl FnOnce(&mut Instance) -> sm4c_runtime::Output) -> Step {
        // The timers armed before the step: a timer the step cancels is named with its due time.
        let mut armed = h.inst.snapshot().timers.clone();
        let inst = &mut h.inst;
        let out = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine(inst))) {
            Ok(out) => out,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic without a message".into());
                h.inst.force_fail(ErrorInfo::new(
                    ErrorKind::InternalError,
                    format!("the engine failed on this instance: {what}"),
                ));
                Default::default()
            }
        };
        if self.options.journal {
            h.pending.extend(out.entries.iter().cloned());
        }
        let id = h.inst.id().to_string();
        let mut work = Vec::with_capacity(out.effects.len());
        for effect in out.effects {
            let effect = self.bind(h.inst.machine(), effect);
            match &effect {
                Effect::InvokeFunction { .. } | Effect::StartSubflow { .. } => h.open.push(effect.clone()),
                Effect::CancelOperation { op } => {
                    h.close(op);
                }
                _ => {}
            }
            let mut w = self.work(&id, h.inst.machine(), h.depth, effect);
            match &mut w {
                Work::ArmTimer { timer, due } => {
                    // Armed again under the same id (a heartbeat's timer, pushed back): the host
                    // lets go of the earlier due time, which would otherwise fire the timer early.
                    if let Some(old) = armed.insert(timer.clone(), *due).filter(|old| old != due) {
                        work.push(Work::CancelTimer {
                            timer: timer.clone(),
                            due: Some(old),
                        });
                    }
                }
                Work::CancelTimer { timer, due } => *due = armed.remove(timer.as_str()),
                _ => {}
            }
            work.push(w);
        }
        let finished = h.inst.status().is_final();
        if finished {
            h.open.clear();
        }
        let notify = match &h.parent {
            Some(p) if finished && p.waits => Some(Notify {
                instance: p.instance.clone(),
                input: subflow_result(
                    &id,
                    p.op.clone(),
                    h.inst.status(),
                    h.inst.data(),
                    h.inst.error().cloned(),
                ),
            }),
            _ => None,
        };
        Step {
            entries: out.entries,
            work,
            notify,
            finished,
        }
    }

    /// An ASL Task call whose Resource host configuration binds to a worker task list
    /// ([`Driver::task_lists`]) becomes a worker task on that list; every other effect is left as
    /// it is. Bound before the call is kept open, so the worker's answer finds a task.
    pub fn bind(&self, machine: &Machine, effect: Effect) -> Effect {
        if machine.asl.is_none() || (self.task_lists.is_none() && self.at_most_once.is_none()) {
            return effect;
        }
        match effect {
            Effect::InvokeFunction {
                op,
                function,
                operation,
                function_type,
                arguments,
                wait,
                delivery,
            } if matches!(function_type.as_str(), "asl" | "worker") => {
                let bound = self.task_lists.as_ref().and_then(|b| b.get(&function));
                let delivery = match &self.at_most_once {
                    Some(r) if function_type == "asl" && bound.is_none() && r.contains(&function) => {
                        sm4c_runtime::Delivery::AtMostOnce
                    }
                    _ => delivery,
                };
                let (operation, function_type) = match bound {
                    Some(list) => (list.clone(), "worker".into()),
                    None => (operation, function_type),
                };
                Effect::InvokeFunction {
                    op,
                    function,
                    operation,
                    function_type,
                    arguments,
                    wait,
                    delivery,
                }
            }
            other => other,
        }
    }

    /// What an effect of instance `id` (of `machine`, at subflow depth `depth`) asks a host to do.
    /// Hosts use it for the effects they recover after a crash too.
    pub fn work(&self, id: &str, machine: &Machine, depth: u32, effect: Effect) -> Work {
        match effect {
            Effect::InvokeFunction {
                op,
                function,
                operation,
                function_type,
                arguments,
                wait,
                delivery,
            } => {
                let call = FunctionCall {
                    instance: id.to_string(),
                    op,
                    function,
                    operation,
                    function_type,
                    arguments,
                    traceparent: None,
                    delivery,
                };
                if call.function_type == "worker" {
                    Work::Task {
                        task: Task::of_call(call, machine),
                        wait,
                    }
                } else {
                    Work::Call { call, wait }
                }
            }
            Effect::StartSubflow {
                op,
                definition,
                input,
                wait,
            } => Work::StartChild(ChildStart {
                id: child_id(id, &op),
                definition,
                input,
                parent: ParentLink {
                    instance: id.to_string(),
                    op,
                    waits: wait,
                },
                depth: depth + 1,
            }),
            Effect::SendEvent { op, event } => Work::Send { op, event, hop: None },
            Effect::StartTimer { timer, due } => Work::ArmTimer { timer, due },
            Effect::CancelTimer { timer } => Work::CancelTimer { timer, due: None },
            Effect::CancelOperation { op } => Work::Stop {
                child: child_id(id, &op),
                op,
            },
        }
    }

    /// A call the instance made has returned: the input to deliver, if the instance still waits
    /// for it. The call is no longer open either way.
    pub fn call_done(&self, h: &mut Hosted, op: &str, result: Result<Value, ErrorInfo>) -> Option<Input> {
        let effect = h.close(op)?;
        if !waits(&effect) || h.inst.status().is_final() {
            return None;
        }
        let op = op.to_string();
        Some(match result {
            Ok(result) => completed(op, result, "function's result"),
            Err(error) => Input::Failed { op, error },
        })
    }

    /// A worker's answer to task `op`. Completing or failing closes the task, so a second answer
    /// is turned away; a heartbeat keeps it open.
    pub fn answer(&self, h: &mut Hosted, op: &str, answer: Answer) -> Answering {
        if h.inst.status().is_final() || !h.open_task(op) {
            return Answering::Closed;
        }
        let waited = h.open_op(op).is_some_and(waits);
        let op = op.to_string();
        let input = match answer {
            Answer::Heartbeat(details) => Input::TaskHeartbeat { op, details },
            Answer::Complete(result) => {
                h.close(&op);
                completed(op, result, "task's result")
            }
            Answer::Fail(error) => {
                h.close(&op);
                let error = match h.inst.machine().asl {
                    Some(_) => asl_failure(error),
                    None => error,
                };
                Input::Failed { op, error }
            }
        };
        Answering::Open {
            input: waited.then_some(input),
        }
    }
}

/// A worker's failure of an ASL Task: the `error` a worker gives (`{"error": CODE, "message":
/// TEXT}`) is the ASL error name and its message the cause, so `Catch` and `Retry` see the name.
/// A failure that already names its ASL `Error` (`SendTaskFailure`) is left as it is.
/// A call's or task's result as the instance receives it: a result nested deeper than
/// [`sm4c_runtime::json::MAX_DEPTH`] fails the call (a `functionError` naming the limit) instead of
/// entering the instance, so that nothing the host stores nests deeper than it reads back.
pub fn completed(op: String, result: Value, what: &str) -> Input {
    match sm4c_runtime::json::check_depth(&result, &format!("the {what}")) {
        Ok(()) => Input::Completed { op, result },
        Err(message) => Input::Failed {
            error: ErrorInfo::new(ErrorKind::FunctionError, message)
                .with_details(json!({"limit": sm4c_runtime::json::MAX_DEPTH})),
            op,
        },
    }
}

fn asl_failure(mut error: ErrorInfo) -> ErrorInfo {
    if let Some(Value::Object(d)) = &mut error.details {
        if !d.contains_key("Error") {
            if let Some(Value::String(code)) = d.get("error").cloned() {
                d.insert("Error".into(), json!(code));
                d.insert("Cause".into(), json!(error.message));
            }
        }
    }
    error
}

/// The step debugger: the [`Input::Debug`] a host records before it delivers the next input to
/// `inst`, when `breakpoints` (those now set on the instance's definition) differ from the ones the
/// instance last recorded. `None` when they are the same, which is always the case while no
/// breakpoint is set and none ever was: then nothing is journaled.
pub fn debug_input(inst: &Instance, breakpoints: &[sm4c_runtime::Breakpoint]) -> Option<Input> {
    if inst.status().is_final() || inst.machine().asl.is_some() || inst.breakpoints() == breakpoints {
        return None;
    }
    Some(Input::Debug {
        breakpoints: breakpoints.to_vec(),
    })
}

/// The breakpoints set on definitions (by definition id), as a host keeps them in memory.
#[derive(Debug, Default)]
pub struct Breakpoints {
    any: std::sync::atomic::AtomicBool,
    map: std::sync::RwLock<std::collections::HashMap<String, Vec<sm4c_runtime::Breakpoint>>>,
}

impl Breakpoints {
    /// Sets the breakpoints of a definition (an empty list clears them).
    pub fn set(&self, definition: &str, breakpoints: Vec<sm4c_runtime::Breakpoint>) {
        let _ = self.update(definition, breakpoints, |_| Ok::<(), ()>(()));
    }

    /// Sets the breakpoints of a definition once `keep` (which stores them) succeeds; two updates
    /// of one host store and set theirs in the same order.
    pub fn update<E>(
        &self,
        definition: &str,
        breakpoints: Vec<sm4c_runtime::Breakpoint>,
        keep: impl FnOnce(&[sm4c_runtime::Breakpoint]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        keep(&breakpoints)?;
        if breakpoints.is_empty() {
            map.remove(definition);
        } else {
            map.insert(definition.to_string(), breakpoints);
        }
        self.any.store(!map.is_empty(), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The breakpoints of a definition.
    pub fn of(&self, definition: &str) -> Vec<sm4c_runtime::Breakpoint> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.get(definition).cloned().unwrap_or_default()
    }

    /// Every definition's breakpoints, by definition id.
    pub fn all(&self) -> Vec<(String, Vec<sm4c_runtime::Breakpoint>)> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<_> = map.iter().map(|(d, b)| (d.clone(), b.clone())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// The [`Input::Debug`] to record before the next input of `inst` ([`debug_input`]): costs
    /// one load and one branch while no breakpoint is set and the instance was never debugged.
    pub fn input_for(&self, inst: &Instance) -> Option<Input> {
        if !self.any.load(std::sync::atomic::Ordering::Relaxed) && inst.snapshot().debug.is_none() {
            return None;
        }
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let bps = map.get(&inst.machine().id).map(Vec::as_slice).unwrap_or(&[]);
        debug_input(inst, bps)
    }
}

/// The instance an event names with the `sm4cinstanceid` attribute.
pub fn target(event: &Value) -> Option<String> {
    attribute_text(event, INSTANCE_ATTRIBUTE)
}

/// Whether an unfinished instance has an event definition the event matches, correlation
/// included.
pub fn accepts(inst: &Instance, event: &Value) -> bool {
    if inst.status().is_final() {
        return false;
    }
    let snap = inst.snapshot();
    inst.machine()
        .events
        .iter()
        .any(|d| mismatch(d, event, &snap.data.0, &snap.bindings).is_none())
}

/// Whether instances of `machine` could ever accept the event: its type and source fit one of
/// the machine's event definitions (correlation not considered).
pub fn may_accept(machine: &Machine, event: &Value) -> bool {
    machine.events.iter().any(|d| kind_matches(d, event))
}

/// What a parent that waits for subflow `child` (operation `op`) receives when the child ends:
/// its output, or a `subflowError` naming the child and why it ended.
pub fn subflow_result(child: &str, op: String, status: Status, data: Value, error: Option<ErrorInfo>) -> Input {
    match status {
        Status::Completed => Input::Completed { op, result: data },
        s => {
            let cause = error.as_ref().map(|e| e.message.clone()).unwrap_or_default();
            let mut details = json!({"instance": child, "status": s.as_str()});
            if let Some(e) = &error {
                details["error"] = e.to_json();
            }
            let e = ErrorInfo::new(
                ErrorKind::SubflowError,
                format!("subflow {child} ended {}: {cause}", s.as_str()),
            )
            .with_details(details);
            Input::Failed { op, error: e }
        }
    }
}

#[cfg(test)]
mod tests;
