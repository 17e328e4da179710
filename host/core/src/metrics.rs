//! What the driver reports for metrics, to an [`Observer`] the application installs.
//!
//! The core keeps no registry and no exporter (it depends on the runtime and tokio only): `sm4c
//! serve` installs an observer that feeds Prometheus families (in `sm4c-api`); an embedding
//! application may install its own, or none (then nothing is counted). Label values a host passes
//! are definition ids, function names and statuses, never instance ids or data.

use sm4c_runtime::Status;
use std::sync::OnceLock;

/// Receives what instances do, as the driver sees it. Every method does nothing by default.
pub trait Observer: Send + Sync {
    /// An instance of `definition` took its start input.
    fn instance_started(&self, _definition: &str) {}
    /// An instance of `definition` ended with a final `status`.
    fn instance_ended(&self, _definition: &str, _status: Status) {}
    /// An instance of `definition` fired `count` transitions in one step.
    fn transitions(&self, _definition: &str, _count: u64) {}
    /// An action ended (`completed` or `failed`, after its error handlers), `seconds` after it
    /// started (the time between the inputs of the two steps; 0 when it ended in the step that
    /// started it).
    fn action_ended(&self, _action: &str, _outcome: &str, _seconds: f64) {}
    /// A host committed a batch of `inputs` inputs to its store in one transaction that took
    /// `seconds` (the SQLite host's group commit).
    fn store_commit(&self, _seconds: f64, _inputs: usize) {}
    /// A Kafka worker's transaction (exactly-once delivery) took `seconds` from its begin to its
    /// commit, or to the failure that aborted it (`committed` false).
    fn kafka_transaction(&self, _seconds: f64, _committed: bool) {}
    /// A worker took a task of `task_list` `seconds` after it was scheduled (schedule-to-start).
    fn task_started(&self, _task_list: &str, _seconds: f64) {}
    /// A worker answered a task of `task_list` (`outcome` is `completed` or `failed`) `seconds`
    /// after it took it (start-to-close).
    fn task_closed(&self, _task_list: &str, _outcome: &str, _seconds: f64) {}
    /// A Kafka worker restored commands partition `partition` in `seconds` (fencing, offsets, state).
    fn kafka_restore(&self, _partition: i32, _seconds: f64) {}
    /// Commands partition `partition` of this worker now holds `count` parked events (0 once the
    /// worker no longer owns it).
    fn kafka_parked(&self, _partition: i32, _count: usize) {}
    /// A committed transaction put an event on the dead-letter topic, for reason `code`.
    fn kafka_dead_letter(&self, _code: &str) {}
    /// A stored record (`record`: `snapshot`, `journal`, `call`, `parked`, a Kafka record kind)
    /// could not be read back; its instance was failed with `corruptRecord` (or the record skipped).
    fn corrupt_record(&self, _record: &str) {}
    /// An event the server refused to keep, by reason code (`parkedLimit`: the parked events
    /// are at a limit).
    fn event_refused(&self, _code: &str) {}
    /// A schedule started a run, `late` seconds after its nominal time.
    fn schedule_run(&self, _late: f64) {}
    /// A schedule did not run `n` nominal times, for `why` (`overlap`, `catchup`, `paused`).
    fn schedule_skipped(&self, _why: &str, _n: u64) {}
    /// How many records of `topic` partition `partition` this worker has not read yet (the
    /// partition's end minus the worker's position).
    fn kafka_lag(&self, _topic: &str, _partition: i32, _lag: i64) {}
    /// `topic` partition `partition` has been stalled for `seconds`: its last stable offset has not
    /// moved while records lie past it (0 once it moves again).
    fn kafka_stalled(&self, _topic: &str, _partition: i32, _seconds: f64) {}
    /// A worker ended a transaction on stalled `topic` partition `partition` to finalize what the
    /// broker left prepared there.
    fn kafka_stall_repair(&self, _topic: &str, _partition: i32) {}
    /// `topic` partition `partition` ends before a worker's local checkpoint of it: the broker
    /// lost records it had acknowledged, or the topic was made again.
    fn kafka_log_behind_checkpoint(&self, _topic: &str, _partition: i32) {}
    /// A restore found the group's committed offsets of commands `topic` partition `partition`
    /// behind its state (expired, or reset) and repaired them from the partition's position.
    fn kafka_offsets_repaired(&self, _topic: &str, _partition: i32) {}
    /// A Kafka worker's thread panicked while it decided a batch (`where_` is `decide`) or routed
    /// events (`route`); the batch's inputs are read again.
    fn kafka_panic(&self, _where: &str) {}
    /// A step of an instance is about to run: an observer that traces steps answers with the time
    /// it began, and is told of the step's end by [`Observer::step_traced`]. `None` (the default)
    /// traces nothing and costs nothing more.
    fn step_begin(&self) -> Option<std::time::SystemTime> {
        None
    }
    /// A step that [`Observer::step_begin`] timed has run. The answer is the W3C `traceparent` of the
    /// step's span, which the driver puts on the calls and events the step asks for.
    fn step_traced(&self, _begun: std::time::SystemTime, _step: &StepSpan<'_>) -> Option<String> {
        None
    }
}

/// What a traced step was: the span an observer makes of it.
#[derive(Debug, Clone, Copy)]
pub struct StepSpan<'a> {
    /// The instance.
    pub instance: &'a str,
    /// Its definition id.
    pub definition: &'a str,
    /// The kind of input the step took (`start`, `event`, `timerFired`, `completed`, ...).
    pub input: &'static str,
    /// The W3C `traceparent` of what started the instance (its origin), when one came with it:
    /// every step of the instance links to it rather than nesting under it.
    pub origin: Option<&'a str>,
    /// The `traceparent` extension attribute of the CloudEvent the step took, if any.
    pub event: Option<&'a str>,
    /// The state the instance is in after the step.
    pub state: Option<&'a str>,
    /// Its status after the step.
    pub status: Status,
    /// Transitions the step fired.
    pub transitions: u64,
}

static OBSERVER: OnceLock<Box<dyn Observer>> = OnceLock::new();

/// Installs the process's observer; `false` (and `observer` dropped) when one is installed already.
pub fn observe(observer: Box<dyn Observer>) -> bool {
    OBSERVER.set(observer).is_ok()
}

/// The installed observer, if any.
pub fn observer() -> Option<&'static dyn Observer> {
    OBSERVER.get().map(|o| o.as_ref())
}
