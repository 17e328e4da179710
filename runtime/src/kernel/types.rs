//! What goes into an engine (inputs), what comes out (effects), what is recorded (journal
//! entries), and an instance's status and errors: the same for every language.
//!
//! Re-exported from `sm4c_runtime::engine` (and the crate root), where they always were. Two
//! things still tie these types to this crate, and must go before the kernel can be its own
//! crate: [`Input::Debug`] and [`Trace::Paused`] carry the SM4C debugger's
//! [`Breakpoint`](crate::engine::debug::Breakpoint) (state, action or transition); and the
//! jq views of an error and of a condition's value (`ErrorInfo::to_val`,
//! `Trace::condition_not_boolean`) are written beside the engine, in `engine/types.rs`, since they
//! speak jaq.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// `delivery` of a function or an `invokeFunction` action: whether a call in flight when the host
/// stopped is made again on recovery (`atLeastOnce`, the default) or fails the action with the
/// error kind `stepInterrupted` (`atMostOnce`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Delivery {
    /// Made again after a crash until its result is journaled (today's behaviour).
    #[default]
    AtLeastOnce,
    /// Its start is journaled and committed before it is made; never made again after a crash.
    AtMostOnce,
}

impl Delivery {
    /// The value as definitions write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::AtLeastOnce => "atLeastOnce",
            Delivery::AtMostOnce => "atMostOnce",
        }
    }

    /// Reads `atLeastOnce` or `atMostOnce`.
    pub fn parse(s: &str) -> Option<Delivery> {
        match s {
            "atLeastOnce" => Some(Delivery::AtLeastOnce),
            "atMostOnce" => Some(Delivery::AtMostOnce),
            _ => None,
        }
    }

    /// True for the default, [`Delivery::AtLeastOnce`] (which effects do not write).
    pub fn is_at_least_once(&self) -> bool {
        *self == Delivery::AtLeastOnce
    }
}

/// Milliseconds since the Unix epoch. The engine has no clock: every input carries its time.
pub type Millis = i64;

/// An input to an instance, with the time it happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timed {
    /// When the input happened, in ms since the Unix epoch.
    pub at: Millis,
    /// What happened.
    #[serde(flatten)]
    pub input: Input,
}

/// What a start says of the schedule that made it: the schedule, and the nominal time the run is
/// for (the time the schedule named, not the time the start ran). Definitions read it: SM4C with the
/// jq function `schedule`, ASL as `$$.Schedule`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Scheduled {
    /// The schedule's id.
    pub schedule: String,
    /// The nominal time, in ms since the Unix epoch.
    pub nominal_time: Millis,
}

impl Scheduled {
    /// As definitions see it: `{"id": …, "nominalTime": "<RFC 3339 UTC>"}`.
    pub fn to_json(&self) -> Value {
        let time = rfc3339_seconds(self.nominal_time);
        json!({"id": self.schedule, "nominalTime": time})
    }
}

/// Everything that can happen to an instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "input", rename_all = "camelCase")]
pub enum Input {
    /// The instance starts with this data.
    Start {
        /// The instance input.
        data: Value,
        /// The schedule that started it, and for which nominal time; none for other starts.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scheduled: Option<Scheduled>,
    },
    /// A function call or subflow the instance waits for has returned.
    Completed {
        /// The operation id from the effect.
        op: String,
        /// Its result.
        result: Value,
    },
    /// A function call or subflow the instance waits for has failed.
    Failed {
        /// The operation id from the effect.
        op: String,
        /// Why.
        error: ErrorInfo,
    },
    /// A worker took the task of a `worker` function call (operation `op`) from its task list:
    /// the schedule-to-start timeout stops, the start-to-close and heartbeat timeouts start.
    TaskStarted {
        /// The operation id from the effect.
        op: String,
        /// Who took it, as the worker named itself, for the record.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worker: Option<String>,
    },
    /// The worker of a started task is alive (and may report its progress).
    TaskHeartbeat {
        /// The operation id from the effect.
        op: String,
        /// Progress as the worker reports it; the latest is in the error of a timeout.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        details: Option<Value>,
    },
    /// A CloudEvent (JSON structured form) is delivered to the instance's inbox.
    Event {
        /// The event.
        event: Value,
    },
    /// A timer the instance started has come due.
    TimerFired {
        /// The timer id from the effect.
        timer: String,
    },
    /// The host ends the instance as failed (a limit it enforces, a replay mismatch).
    Abort {
        /// Why.
        error: ErrorInfo,
    },
    /// The instance is cancelled.
    Cancel {
        /// Why, for the record.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The breakpoints of the instance's definition changed (the host records this before the
    /// next input it delivers; see [`crate::engine::debug`]).
    Debug {
        /// The breakpoints from now on (none: the instance no longer pauses at breakpoints).
        breakpoints: Vec<crate::engine::debug::Breakpoint>,
    },
    /// The instance moves to another version of its definition (see
    /// [`Instance::migrate`](crate::Instance::migrate)): from the state it waits in to its
    /// counterpart there (the same name, unless `states` maps it).
    Migrate {
        /// The version it ran on before.
        from: String,
        /// The version it runs on from now.
        version: String,
        /// Old state name to new state name, for states whose names differ.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        states: BTreeMap<String, String>,
    },
    /// A failed or timed-out instance goes back to running from where it failed (see
    /// [`Instance::redrive_plan`](crate::Instance::redrive_plan)), after its data changed by `diff`.
    Redrive {
        /// The update as the operator wrote it (a jq expression over the data), for the record.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        update: Option<String>,
        /// What the update changed, as an RFC 6902 JSON Patch (an array of operations) over the
        /// instance data (ASL: the failed state's input); empty when nothing changed. Replay
        /// applies it, so the journal alone gives the data after the redrive.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        diff: Vec<Value>,
    },
    /// A paused instance goes on; with `step`, it pauses again at the next breakpoint-able point.
    Resume {
        /// Pause at the next breakpoint-able point.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        step: bool,
    },
}

/// Work the host performs for an instance. An effect is recorded in the journal before it is performed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "effect", rename_all = "camelCase")]
pub enum Effect {
    /// Call a `rest` or `rpc` function, or put the task of a `worker` function on its task list
    /// (`operation`). A worker task is answered with `TaskStarted`, `TaskHeartbeat`, `Completed`, `Failed`.
    #[serde(rename_all = "camelCase")]
    InvokeFunction {
        /// Deterministic operation id; hosts pass it on as an idempotency key.
        op: String,
        /// Function name.
        function: String,
        /// The function's `operation`.
        operation: String,
        /// The function's `type`: `rest`, `rpc` or `worker`.
        function_type: String,
        /// Resolved arguments.
        arguments: Value,
        /// True when the instance waits for the result (deliver `Completed`/`Failed` with `op`).
        wait: bool,
        /// `atMostOnce`: a host commits this effect before it makes the call, and after a crash
        /// fails the call with [`ErrorKind::StepInterrupted`] instead of making it again. The
        /// default, `atLeastOnce`, is not written, so journals without it read as they always did.
        #[serde(default, skip_serializing_if = "Delivery::is_at_least_once")]
        delivery: Delivery,
    },
    /// Start a child instance of definition `definition`.
    #[serde(rename_all = "camelCase")]
    StartSubflow {
        /// Deterministic operation id; the child's instance id derives from it.
        op: String,
        /// The child definition's `id`.
        definition: String,
        /// The child's input.
        input: Value,
        /// True when the instance waits for the child's output.
        wait: bool,
    },
    /// Publish a CloudEvent (JSON structured form). Its `id` is deterministic.
    SendEvent {
        /// Deterministic operation id.
        op: String,
        /// The event.
        event: Value,
    },
    /// Deliver `TimerFired { timer }` at `due`.
    StartTimer {
        /// Timer id.
        timer: String,
        /// Due time, ms since the Unix epoch.
        due: Millis,
    },
    /// A timer is no longer wanted.
    CancelTimer {
        /// Timer id.
        timer: String,
    },
    /// A call or subflow's result is no longer wanted (timed out, lost a race, or the instance ended).
    CancelOperation {
        /// The operation id.
        op: String,
    },
}

/// Lifecycle of an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Status {
    /// Created, not started.
    Created,
    /// Running: has work to do.
    Running,
    /// Waiting for events, timers or calls.
    Waiting,
    /// Ended in a state without transitions.
    Completed,
    /// Ended with an error.
    Failed,
    /// Cancelled.
    Cancelled,
    /// Ended by the execution timeout.
    TimedOut,
    /// Stopped at a breakpoint by the step debugger, until resumed.
    Paused,
}

impl Status {
    /// True once the instance has ended.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Status::Completed | Status::Failed | Status::Cancelled | Status::TimedOut
        )
    }

    /// The status as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Running => "running",
            Status::Waiting => "waiting",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::TimedOut => "timedOut",
            Status::Paused => "paused",
        }
    }
}

/// What kind of error an [`ErrorInfo`] is: its `type`, which error handlers test.
///
/// Serialised as the strings instances have always seen (`functionError`, `timeout`, ...); a kind
/// this version does not know (one a worker or a stored journal gives) is kept as written.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum ErrorKind {
    /// A function call failed (an HTTP or gRPC error, a mock's `error`, a worker's failure).
    FunctionError,
    /// A jq expression failed.
    ExpressionError,
    /// A subflow could not start, or ended other than completed.
    SubflowError,
    /// An event could not be sent or read.
    EventError,
    /// No transition of the state could be taken.
    NoTransition,
    /// A limit was reached (transitions, journal, inbox).
    LimitExceeded,
    /// A timeout fired.
    Timeout,
    /// The instance or the action was cancelled.
    Cancelled,
    /// The instance waits for what can never come (no timer, no call in flight) in `sm4c run`.
    Stuck,
    /// Replaying the journal against the definition no longer gives the same instance.
    ReplayMismatch,
    /// A stored record of the instance (its snapshot, a journal row, an open call) cannot be read
    /// back: the host fails the instance rather than stop serving the others.
    CorruptRecord,
    /// The engine failed on this instance (a bug, caught).
    InternalError,
    /// The host could not do what the instance asked.
    HostError,
    /// An `atMostOnce` call was in flight when the host stopped: it is not made again.
    StepInterrupted,
    /// Any other kind, as written.
    Other(String),
}

impl ErrorKind {
    const NAMED: [(ErrorKind, &'static str); 14] = [
        (ErrorKind::FunctionError, "functionError"),
        (ErrorKind::ExpressionError, "expressionError"),
        (ErrorKind::SubflowError, "subflowError"),
        (ErrorKind::EventError, "eventError"),
        (ErrorKind::NoTransition, "noTransition"),
        (ErrorKind::LimitExceeded, "limitExceeded"),
        (ErrorKind::Timeout, "timeout"),
        (ErrorKind::Cancelled, "cancelled"),
        (ErrorKind::Stuck, "stuck"),
        (ErrorKind::ReplayMismatch, "replayMismatch"),
        (ErrorKind::CorruptRecord, "corruptRecord"),
        (ErrorKind::InternalError, "internalError"),
        (ErrorKind::HostError, "hostError"),
        (ErrorKind::StepInterrupted, "stepInterrupted"),
    ];

    /// The kind as instances see it.
    pub fn as_str(&self) -> &str {
        match self {
            ErrorKind::Other(s) => s,
            k => ErrorKind::NAMED
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, s)| *s)
                .unwrap_or_default(),
        }
    }
}

impl From<String> for ErrorKind {
    fn from(s: String) -> Self {
        ErrorKind::NAMED
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(k, _)| k.clone())
            .unwrap_or(ErrorKind::Other(s))
    }
}

impl From<ErrorKind> for String {
    fn from(k: ErrorKind) -> Self {
        k.as_str().to_string()
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for ErrorKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ErrorKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// An error as instances see it (`$value` in error handlers) and as a failed instance reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// What kind of error it is (its `type`).
    #[serde(rename = "type")]
    pub kind: ErrorKind,
    /// Human-readable message.
    pub message: String,
    /// More about the error (an HTTP status and body, the value given to jq `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// The state the instance was in, for instance failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

impl ErrorInfo {
    /// A new error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ErrorInfo {
            kind,
            message: message.into(),
            details: None,
            state: None,
        }
    }

    /// Adds details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The error as the instance reports it.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// A journal entry. The journal of an instance is the truth: replaying its inputs gives the same instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "entry", rename_all = "camelCase")]
pub enum Entry {
    /// An input the instance handled.
    Input(Timed),
    /// An effect the engine asked for (recorded before the host performs it).
    Effect(Effect),
    /// A readable step (state entered, transition fired, action finished); not needed for replay.
    Trace(Trace),
}

/// A readable step of an instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "camelCase")]
pub enum Trace {
    /// A state was entered.
    StateEntered {
        /// State name.
        state: String,
    },
    /// A transition fired.
    TransitionFired {
        /// The state it left from.
        state: String,
        /// Its index in the state's transitions.
        transition: usize,
        /// The state it leads to (none: stays).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
        /// What fired it: `condition`, `implicit`, `events`, `timeout`.
        trigger: String,
    },
    /// An event was consumed by an event group.
    EventConsumed {
        /// Event definition name.
        event: String,
        /// CloudEvent id.
        id: String,
    },
    /// An action finished.
    ActionCompleted {
        /// Operation id (the action's position).
        op: String,
        /// Action type.
        action: String,
    },
    /// A condition yielded something other than a boolean, so it did not fire (conditions fire only
    /// on `true`). Recorded so the author hears of a condition that relied on jq's truthiness.
    ConditionNotBoolean {
        /// JSON pointer of the condition in the definition.
        pointer: String,
        /// The condition as written.
        condition: String,
        /// What it yielded, as JSON text (cut after [`Trace::MAX_VALUE_CHARS`] characters).
        value: String,
    },
    /// An action failed.
    ActionFailed {
        /// Operation id.
        op: String,
        /// Action type.
        action: String,
        /// Error message.
        message: String,
    },
    /// An action is retried after a delay.
    Retrying {
        /// Operation id of the failed attempt.
        op: String,
        /// Attempt about to be made (2 = first retry).
        attempt: u32,
        /// Wait before it, ms.
        delay_ms: u64,
    },
    /// The instance paused at a breakpoint-able point (the step debugger).
    Paused {
        /// The point.
        at: crate::engine::debug::Breakpoint,
    },
    /// The paused instance went on.
    Resumed {
        /// True for a step (it pauses again at the next point).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stepping: bool,
    },
    /// A part of the definition was taken: a transition, an action's error handler or an action
    /// (ASL: a `Next`, a Choice rule or `Default`, a `Catch`), by its JSON pointer in the
    /// definition. Recorded only under [`Options::coverage`](crate::Options::coverage).
    Covered {
        /// JSON pointer of what was taken, e.g. `/states/1/transitions/0`.
        pointer: String,
    },
    /// The instance moved to another version of its definition.
    Migrated {
        /// The version it ran on.
        from: String,
        /// The version it runs on now.
        version: String,
        /// The state it waited in.
        state: String,
        /// Its counterpart in the new version, where it waits now.
        to: String,
    },
    /// The instance was redriven: it runs again from where it failed.
    Redriven {
        /// Where it went on from: the SM4C action's operation or the step of the algorithm, the
        /// ASL state.
        from: String,
        /// Its redrives so far, this one included.
        redrives: u32,
    },
    /// The instance ended.
    Finished {
        /// Final status.
        status: Status,
    },
}

impl Trace {
    /// Longest rendering of a value a trace keeps, in characters.
    pub const MAX_VALUE_CHARS: usize = 200;
}

/// [`rfc3339`] without the milliseconds when there are none (`2026-11-28T02:00:00Z`), the form of a
/// scheduled instance's id.
fn rfc3339_seconds(ms: Millis) -> String {
    let text = rfc3339(ms);
    match ms.rem_euclid(1000) {
        0 => text.replace(".000Z", "Z"),
        _ => text,
    }
}

/// Formats ms since the epoch as RFC 3339 UTC (`2026-11-22T10:00:00.000Z`).
pub fn rfc3339(ms: Millis) -> String {
    let secs = ms.div_euclid(1000);
    let milli = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{milli:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_time() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_000_000_123), "2026-11-18T11:06:40.123Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn inputs_round_trip() {
        let t = Timed {
            at: 5,
            input: Input::TimerFired {
                timer: "1.enter#delay".into(),
            },
        };
        let s = serde_json::to_string(&t).unwrap();
        assert_eq!(s, r#"{"at":5,"input":"timerFired","timer":"1.enter#delay"}"#);
        assert_eq!(serde_json::from_str::<Timed>(&s).unwrap(), t);
    }
}

#[cfg(test)]
mod error_kind_tests {
    use super::*;

    #[test]
    fn error_kinds_serialise_to_the_strings_instances_have_always_seen() {
        for (kind, text) in ErrorKind::NAMED {
            assert_eq!(serde_json::to_value(&kind).unwrap(), json!(text));
            assert_eq!(serde_json::from_value::<ErrorKind>(json!(text)).unwrap(), kind);
            assert_eq!(kind.as_str(), text);
        }
        // A kind this version does not know (from a worker or an older journal) is kept as written.
        let other: ErrorKind = serde_json::from_value(json!("paymentDeclined")).unwrap();
        assert_eq!(other, ErrorKind::Other("paymentDeclined".into()));
        assert_eq!(serde_json::to_value(&other).unwrap(), json!("paymentDeclined"));
        let e = ErrorInfo::new(ErrorKind::Timeout, "late");
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({"type": "timeout", "message": "late"})
        );
    }
}
