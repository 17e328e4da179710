//! The validated, compiled form of a definition. The engine accepts only this.
//!
//! Built by [`crate::validate::load`]: names are resolved to indices, timespans to milliseconds,
//! and every jq expression is compiled once.

use crate::expr::{EvalError, Expr};
use crate::json::{from_val, str_val, to_val};
use jaq_json::Val;
use serde_json::Value;

/// Index of a state in [`Machine::states`].
pub type StateId = usize;
/// Index of an action in [`Machine::actions`].
pub type ActionId = usize;

/// A compiled state machine definition.
#[derive(Debug)]
pub struct Machine {
    /// `id`.
    pub id: String,
    /// `name`.
    pub name: String,
    /// `version`.
    pub version: String,
    /// `description`.
    pub description: Option<String>,
    /// `timeout` (or `execTimeout`).
    pub timeout: Option<ExecTimeout>,
    /// Event definitions.
    pub events: Vec<EventDef>,
    /// Function definitions.
    pub functions: Vec<Function>,
    /// Retry policies.
    pub retries: Vec<RetryPolicy>,
    /// States, in document order.
    pub states: Vec<State>,
    /// The start state.
    pub start: StateId,
    /// Every action of the definition, children included; states and transitions refer to them by index.
    pub actions: Vec<Action>,
    /// The CloudEvent that starts an instance (extension `startEvent`).
    pub start_event: Option<StartEvent>,
    /// How often a failed instance may be redriven (extension `maxRedrives`); none: as the host
    /// says.
    pub max_redrives: Option<u32>,
    /// The definition as it was loaded (external `events`/`functions`/`retries` inlined).
    pub source: Value,
    /// For a definition written in the Amazon States Language: the validated machine (then
    /// `states` and `actions` are empty and the engine runs this instead).
    pub asl: Option<std::sync::Arc<crate::asl::model::AslMachine>>,
}

impl Machine {
    /// Finds a state by name.
    pub fn state(&self, name: &str) -> Option<StateId> {
        self.states.iter().position(|s| s.name == name)
    }

    /// Every `invokeSubflow` target with the JSON pointer of the action naming it.
    pub fn subflow_refs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.actions.iter().filter_map(|a| match &a.kind {
            ActionKind::InvokeSubflow { subflow, .. } => Some((a.pointer.as_str(), subflow.as_str())),
            _ => None,
        })
    }
}

/// `timeout` of the state machine: how long an instance may run, and what it does when that elapses.
#[derive(Debug)]
pub struct ExecTimeout {
    /// `duration` in milliseconds.
    pub duration_ms: u64,
    /// `action`, run before the instance ends as timed out.
    pub action: Option<ActionId>,
}

/// `startEvent`: the CloudEvent that starts a new instance.
#[derive(Debug)]
pub struct StartEvent {
    /// Required CloudEvent `type`.
    pub event_type: String,
    /// Optional CloudEvent `source`.
    pub source: Option<String>,
}

/// A state.
#[derive(Debug)]
pub struct State {
    /// `name`.
    pub name: String,
    /// JSON pointer of the state in the definition.
    pub pointer: String,
    /// `inputFilter`.
    pub input_filter: Option<Expr>,
    /// `enterAction`.
    pub enter: Option<ActionId>,
    /// `enterResultHandler`.
    pub enter_handler: Option<Expr>,
    /// `exitAction`.
    pub exit: Option<ActionId>,
    /// `exitResultHandler`.
    pub exit_handler: Option<Expr>,
    /// `transitions`, in document order.
    pub transitions: Vec<Transition>,
}

/// What triggers a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// No condition, events or timeout: always fires.
    Implicit,
    /// A condition alone.
    Condition,
    /// Event groups (optionally guarded by a condition).
    Events,
    /// A timeout alone.
    Timeout,
}

/// A transition.
#[derive(Debug)]
pub struct Transition {
    /// Resolved `nextState`; `None` stays in the state and evaluates transitions again.
    pub next: Option<StateId>,
    /// `condition`.
    pub condition: Option<Condition>,
    /// `eventGroups`.
    pub groups: Vec<EventGroup>,
    /// `timeout` in milliseconds.
    pub timeout_ms: Option<u64>,
    /// `action`.
    pub action: Option<ActionId>,
    /// `resultHandler`.
    pub handler: Option<Expr>,
    /// What triggers it.
    pub trigger: Trigger,
}

/// An event group: one of `events` satisfies it.
#[derive(Debug)]
pub struct EventGroup {
    /// Indices into [`Machine::events`].
    pub events: Vec<usize>,
    /// `condition`, evaluated against the matched event.
    pub condition: Option<Condition>,
    /// `resultHandler`, with the matched event as `$value`.
    pub handler: Option<Expr>,
}

/// An event definition.
#[derive(Debug)]
pub struct EventDef {
    /// `name`.
    pub name: String,
    /// `source`.
    pub source: Option<String>,
    /// `type`.
    pub event_type: Option<String>,
    /// `kind` (informative).
    pub kind: Option<String>,
    /// `correlation`.
    pub correlation: Vec<Correlation>,
    /// Extension `topic`: where sent events of this definition go in Kafka mode.
    pub topic: Option<String>,
}

impl EventDef {
    /// The CloudEvent type of events sent under this definition: `type`, else the name.
    pub fn sent_type(&self) -> &str {
        self.event_type.as_deref().unwrap_or(&self.name)
    }
}

/// A correlation rule.
#[derive(Debug)]
pub struct Correlation {
    /// `contextAttributeName`, compared without regard to case.
    pub name: String,
    /// `contextAttributeValue`: a literal, or a jq expression over the instance data.
    pub value: Option<Template>,
}

/// A function definition.
#[derive(Debug)]
pub struct Function {
    /// `name`.
    pub name: String,
    /// `operation`.
    pub operation: String,
    /// `type`.
    pub kind: FunctionKind,
    /// `delivery`: what a host does with a call of it that was in flight when it stopped.
    pub delivery: Delivery,
}

pub use crate::kernel::types::Delivery;

/// Function `type`.
#[derive(Debug)]
pub enum FunctionKind {
    /// `rest` (OpenAPI), performed by the host.
    Rest,
    /// `rpc` (gRPC), performed by the host.
    Rpc,
    /// `expression`: jq evaluated by the engine with the arguments as input.
    Expression(Expr),
    /// `worker`: a task put on the task list named by `operation`, done by an external worker that
    /// starts, heartbeats and completes it by its task token.
    Worker(TaskTimeouts),
}

/// The timeouts of a `worker` function (ms). Each one that elapses fails the call with error type
/// `timeout` and `details.timeoutType` naming it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskTimeouts {
    /// `scheduleToStartTimeout`: from scheduling the task until a worker takes it.
    pub schedule_to_start_ms: Option<u64>,
    /// `startToCloseTimeout`: from a worker taking the task until it completes or fails it.
    pub start_to_close_ms: Option<u64>,
    /// `heartbeatTimeout`: the longest gap between heartbeats once started.
    pub heartbeat_ms: Option<u64>,
    /// `scheduleToCloseTimeout`: from scheduling the task until it completes or fails.
    pub schedule_to_close_ms: Option<u64>,
}

impl FunctionKind {
    /// The lower-case type name.
    pub fn as_str(&self) -> &'static str {
        match self {
            FunctionKind::Rest => "rest",
            FunctionKind::Rpc => "rpc",
            FunctionKind::Expression(_) => "expression",
            FunctionKind::Worker(_) => "worker",
        }
    }
}

/// A retry policy.
#[derive(Debug)]
pub struct RetryPolicy {
    /// `name`.
    pub name: String,
    /// `delay`: wait before the first retry (ms, default 1000).
    pub delay_ms: u64,
    /// `maxDelay`: upper bound of any wait (ms).
    pub max_delay_ms: Option<u64>,
    /// `increment`: added to the wait for each further retry (ms).
    pub increment_ms: u64,
    /// `multiplier`: the wait is multiplied by this for each further retry (default 1).
    pub multiplier: f64,
    /// `maxAttempts`: retries after the first attempt (default 3).
    pub max_attempts: u32,
    /// `jitter`.
    pub jitter: Jitter,
}

/// `jitter` of a retry policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// No jitter.
    None,
    /// A fraction of the wait, added or subtracted at random.
    Fraction(f64),
    /// A fixed span in ms, added or subtracted at random.
    Span(u64),
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1 = first retry), before jitter.
    pub fn base_delay(&self, retry: u32) -> u64 {
        let n = retry.saturating_sub(1);
        let d = self.delay_ms as f64 * self.multiplier.powi(n as i32) + (self.increment_ms as f64) * n as f64;
        let d = if d.is_finite() { d.max(0.0) } else { f64::MAX };
        let d = self.max_delay_ms.map_or(d, |m| d.min(m as f64));
        d.min(1e15) as u64
    }

    /// The wait with jitter applied; `unit` is a uniform random number in `[0, 1)`.
    pub fn delay(&self, retry: u32, unit: f64) -> u64 {
        let base = self.base_delay(retry) as f64;
        let spread = match self.jitter {
            Jitter::None => 0.0,
            Jitter::Fraction(f) => base * f,
            Jitter::Span(ms) => ms as f64,
        };
        let d = (base + spread * (2.0 * unit - 1.0)).max(0.0);
        let d = self.max_delay_ms.map_or(d, |m| d.min(m as f64));
        d.round() as u64
    }
}

/// An action.
#[derive(Debug)]
pub struct Action {
    /// `name`.
    pub name: Option<String>,
    /// JSON pointer of the action in the definition.
    pub pointer: String,
    /// The action's type and its fields.
    pub kind: ActionKind,
    /// `errorHandlers`, in order.
    pub handlers: Vec<ErrorHandler>,
}

/// `parallel` completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Every branch.
    And,
    /// The first branch; the rest are cancelled.
    Xor,
    /// The first `n` branches; the rest are cancelled.
    NOfM(usize),
}

/// The eight action types.
#[derive(Debug)]
pub enum ActionKind {
    /// `delay`.
    Delay {
        /// `timeout` in ms.
        ms: u64,
    },
    /// `foreach`.
    Foreach {
        /// `input`: must yield an array.
        input: Expr,
        /// `action`: run for each element, with the element as input.
        action: ActionId,
        /// `maxParallel` (default 1).
        max_parallel: usize,
    },
    /// `injectData`.
    InjectData {
        /// `expression`.
        value: Template,
    },
    /// `invokeFunction`.
    InvokeFunction {
        /// Index into [`Machine::functions`].
        function: usize,
        /// `arguments`.
        args: Template,
        /// `timeout` in ms.
        timeout_ms: Option<u64>,
        /// `waitForCompletion` (default false).
        wait: bool,
        /// `delivery` of the action, which overrides the function's.
        delivery: Option<Delivery>,
    },
    /// `invokeSubflow`.
    InvokeSubflow {
        /// `subflowName`: the `id` of the definition to start.
        subflow: String,
        /// `arguments`.
        args: Template,
        /// `timeout` in ms.
        timeout_ms: Option<u64>,
        /// `waitForCompletion` (default false).
        wait: bool,
    },
    /// `parallel`.
    Parallel {
        /// `actions`.
        actions: Vec<ActionId>,
        /// `completionType` and `n`.
        completion: Completion,
    },
    /// `sendEvent`.
    SendEvent {
        /// Index into [`Machine::events`].
        event: usize,
        /// `expression`: the event data.
        data: Option<Template>,
        /// `contextAttributes`.
        attributes: Vec<(String, Template)>,
    },
    /// `sequence`.
    Sequence {
        /// `actions`.
        actions: Vec<ActionId>,
    },
}

impl ActionKind {
    /// The type name as the seed writes it.
    pub fn type_name(&self) -> &'static str {
        match self {
            ActionKind::Delay { .. } => "delay",
            ActionKind::Foreach { .. } => "foreach",
            ActionKind::InjectData { .. } => "injectData",
            ActionKind::InvokeFunction { .. } => "invokeFunction",
            ActionKind::InvokeSubflow { .. } => "invokeSubflow",
            ActionKind::Parallel { .. } => "parallel",
            ActionKind::SendEvent { .. } => "sendEvent",
            ActionKind::Sequence { .. } => "sequence",
        }
    }
}

/// An error handler.
#[derive(Debug)]
pub struct ErrorHandler {
    /// `condition`, evaluated with the error as input (and as `$value`).
    pub condition: Option<Condition>,
    /// `resultHandler`, over the global data with the error as `$value`.
    pub handler: Option<Expr>,
    /// `retryPolicy`, as an index into [`Machine::retries`].
    pub retry: Option<usize>,
}

/// A `condition` of a transition, an event group or an error handler.
///
/// It fires only when its expression yields the JSON boolean `true`: the specification says "result
/// of 'true' triggers this transition", and the reference implementation does the same. `false`,
/// `null`, strings (even `"true"`), numbers, arrays and objects do not fire; jq's truthiness (anything
/// but `false` and `null`) does not apply here.
#[derive(Debug, Clone)]
pub struct Condition {
    /// The jq expression.
    pub expr: Expr,
    /// JSON pointer of the `condition` field in the definition.
    pub pointer: String,
}

/// What a condition yielded, as far as firing goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// `true`: the condition fires.
    True,
    /// `false`: it does not.
    False,
    /// Something other than a boolean (`null`, a string, a number, an array, an object): it does
    /// not fire, and the author may want to know.
    NotBoolean(Val),
}

impl Condition {
    /// The expression as written.
    pub fn source(&self) -> &str {
        self.expr.source()
    }

    /// Evaluates the condition (one output is needed) and judges its value. This is the one place
    /// that decides whether a condition fires.
    pub fn test(&self, input: &Val, value: &Val) -> Result<Verdict, EvalError> {
        Ok(match self.expr.eval_on(input, value)? {
            Val::Bool(true) => Verdict::True,
            Val::Bool(false) => Verdict::False,
            other => Verdict::NotBoolean(other),
        })
    }
}

/// JSON with jq expressions inside: `{"order": "${ .orders[1] }", "priority": 1}`.
#[derive(Debug, Clone)]
pub enum Template {
    /// A value without expressions.
    Const(Val),
    /// A `${ }` expression.
    Expr(Expr),
    /// An array with expressions inside.
    Arr(Vec<Template>),
    /// An object with expressions inside.
    Obj(Vec<(String, Template)>),
}

impl Template {
    /// Resolves the template against `input`.
    pub fn resolve(&self, input: &Val) -> Result<Val, EvalError> {
        match self {
            Template::Const(v) => Ok(v.clone()),
            Template::Expr(e) => e.eval(input.clone(), Val::Null),
            Template::Arr(items) => items.iter().map(|t| t.resolve(input)).collect(),
            Template::Obj(fields) => {
                let mut map = jaq_json::Map::default();
                for (k, t) in fields {
                    map.insert(str_val(k), t.resolve(input)?);
                }
                Ok(Val::obj(map))
            }
        }
    }

    /// A template that always gives this JSON.
    pub fn constant(v: &Value) -> Template {
        Template::Const(to_val(v))
    }

    /// The constant JSON, if the template has no expressions.
    pub fn as_const(&self) -> Option<Value> {
        match self {
            Template::Const(v) => Some(from_val(v)),
            _ => None,
        }
    }
}
