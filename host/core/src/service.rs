//! What a durable host offers the HTTP API and the CLI, whichever host it is: the
//! [`Backend`] trait, its errors, and the records it answers with.

use crate::driver::ParentLink;
use crate::functions::BoxFuture;
use crate::tasks::Answer;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sm4c_runtime::{Breakpoint, Entry, Machine, Millis, Snapshot, ValidationError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Registered definitions by id and version.
#[derive(Default)]
pub struct Registry {
    machines: HashMap<(String, String), Arc<Machine>>,
    /// Newest version of each id, by registration order.
    latest: HashMap<String, String>,
    order: Vec<(String, String)>,
    /// The version new starts take, by id, where one is set (otherwise the newest).
    defaults: HashMap<String, String>,
}

impl Registry {
    /// A definition by id and optional version; without one, the version new starts take: the
    /// default version set for the id, else the newest registered.
    pub fn get(&self, id: &str, version: Option<&str>) -> Option<Arc<Machine>> {
        let v = match version {
            Some(v) => v,
            None => self.starts_take(id)?,
        };
        self.machines.get(&(id.to_string(), v.to_string())).cloned()
    }

    /// The newest version registered of `id`.
    pub fn newest(&self, id: &str) -> Option<&str> {
        self.latest.get(id).map(String::as_str)
    }

    /// The default version set for `id`, if one is.
    pub fn default_version(&self, id: &str) -> Option<&str> {
        self.defaults.get(id).map(String::as_str)
    }

    /// The version new starts of `id` take: its default version when one is set (and registered),
    /// else the newest.
    pub fn starts_take(&self, id: &str) -> Option<&str> {
        match self.defaults.get(id) {
            Some(v) if self.machines.contains_key(&(id.to_string(), v.clone())) => Some(v),
            _ => self.newest(id),
        }
    }

    /// Sets (or, with none, clears) the version new starts of `id` take.
    pub fn set_default(&mut self, id: &str, version: Option<String>) {
        match version {
            Some(v) => self.defaults.insert(id.to_string(), v),
            None => self.defaults.remove(id),
        };
    }

    /// Every (id, version), in registration order.
    pub fn keys(&self) -> &[(String, String)] {
        &self.order
    }

    /// Every definition, in registration order.
    pub fn all(&self) -> Vec<Arc<Machine>> {
        self.order
            .iter()
            .filter_map(|k| self.machines.get(k).cloned())
            .collect()
    }

    /// Adds a definition; it becomes the newest version of its id.
    pub fn insert(&mut self, m: Arc<Machine>) {
        let key = (m.id.clone(), m.version.clone());
        if !self.machines.contains_key(&key) {
            self.order.push(key.clone());
        }
        self.latest.insert(m.id.clone(), m.version.clone());
        self.machines.insert(key, m);
    }
}

/// Why a request to the durable host failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The definition is invalid.
    #[error("invalid definition")]
    Invalid(Vec<ValidationError>),
    /// Unknown definition.
    #[error("no definition {0:?}")]
    UnknownDefinition(String),
    /// Unknown instance.
    #[error("no instance {0:?}")]
    UnknownInstance(String),
    /// The instance has ended.
    #[error("instance {0:?} has already ended")]
    Ended(String),
    /// The same definition id and version is registered with other content.
    #[error(
        "definition {id:?} version {version:?} is already registered with different content; register a new version"
    )]
    Conflict {
        /// Definition id.
        id: String,
        /// Version.
        version: String,
    },
    /// The store failed.
    #[error("{0}")]
    Store(String),
    /// A cursor that did not come from a previous page.
    #[error("`after` must be a cursor from a previous page, not {0:?}")]
    InvalidCursor(String),
    /// The mode the server runs in does not offer this.
    #[error("{0}")]
    NotSupported(String),
    /// A service the host depends on (the Kafka cluster) did not answer in time.
    #[error("{0}")]
    Unavailable(String),
    /// The store's disk is full: the request was not written. Writes resume once space returns.
    #[error("{0}; the request was not written: retry once space is freed")]
    StorageFull(String),
    /// The host has stopped.
    #[error("the server is shutting down")]
    Stopped,
    /// The host stopped deciding because its store failed: nothing after the failure was acted on.
    #[error("the store failed, so the host stopped: {0}")]
    Failed(String),
    /// A task token that names no task.
    #[error("{0}")]
    UnknownTask(String),
    /// The task was answered already, timed out or was cancelled.
    #[error("task {op:?} of instance {instance:?} is closed: it was completed, failed, timed out or cancelled")]
    TaskClosed {
        /// Instance id.
        instance: String,
        /// Operation id.
        op: String,
    },
    /// An `sm4c.task.*` CloudEvent that cannot answer a task.
    #[error("{0}")]
    InvalidTaskEvent(String),
    /// The instance cannot move to the version asked for (why); nothing changed.
    #[error("{}", .0.message)]
    NotMigratable(sm4c_runtime::engine::migrate::NotMigratable),
    /// The instance cannot be redriven; nothing changed.
    #[error("{message}")]
    NotRedrivable {
        /// Why, as a fixed code (`completed`, `cancelled`, `running`, `limitReached`, ...).
        reason: String,
        /// The whole message, naming the instance.
        message: String,
    },
    /// A redrive's update does not compile, fails, or does not yield one object; nothing changed.
    #[error("/update: {0}")]
    InvalidUpdate(String),
    /// The step debugger was asked to resume or step an instance that is not paused.
    #[error("instance {0:?} is not paused")]
    NotPaused(String),
    /// A breakpoint that does not fit its definition (an unknown state, action or transition).
    #[error("{0}")]
    InvalidBreakpoint(String),
    /// An event that reached no instance was not parked: the parked events are at a limit (which
    /// one, and how to raise it). Nothing of the event was kept.
    #[error("{0}")]
    ParkedLimit(String),
    /// An instance id that [`valid_instance_id`] refuses.
    #[error("{INSTANCE_ID_RULE}, not {0:?}")]
    InvalidInstanceId(String),
    /// The command is in the log, but no worker has decided it yet (the worker that holds its
    /// instance did not answer): it will be decided once another worker takes the instance over.
    #[error("{0}")]
    Appended(String),
    /// A schedule's specification is invalid: (JSON pointer, what is wrong) for each field.
    #[error("invalid schedule")]
    InvalidSchedule(Vec<(String, String)>),
    /// Unknown schedule.
    #[error("no schedule {0:?}")]
    UnknownSchedule(String),
    /// A batch request is invalid: (JSON pointer, what is wrong) for each field.
    #[error("invalid batch")]
    InvalidBatch(Vec<(String, String)>),
    /// Unknown batch.
    #[error("no batch {0:?}")]
    UnknownBatch(String),
    /// A schedule of this id exists already.
    #[error("schedule {0:?} exists already; change it with PUT /schedules/{0}")]
    ScheduleExists(String),
}

/// What is asked of a host's schedules (`/schedules`); each answers the schedule as JSON (a list
/// of them for [`ScheduleOp::List`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ScheduleOp {
    /// Registers a schedule (its specification).
    Create(Value),
    /// Changes a schedule's specification; what it did and owes is kept.
    Replace(String, Value),
    /// One schedule, with its next times and recent runs.
    Get(String),
    /// Every schedule.
    List,
    /// Pauses a schedule: times that come are skipped.
    Pause(String),
    /// Resumes a paused schedule.
    Resume(String),
    /// Starts one now, under the overlap policy.
    Trigger(String),
    /// One start per nominal time in `[from, to)` (RFC 3339 times), under the overlap policy.
    Backfill {
        /// The schedule.
        id: String,
        /// From this time.
        from: String,
        /// Up to this time (not included).
        to: String,
    },
    /// Deletes a schedule (its running instances run on).
    Delete(String),
}

/// What is asked of a host's batches (`/batches`) when the host runs them itself (Kafka mode:
/// each partition's owner applies a batch to its own instances); the SQLite server's
/// [`crate::batch::Batches`] answers them otherwise.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchOp {
    /// A batch request (`POST /batches`'s body): a dry run, or a batch to start.
    Create(Value),
    /// One batch.
    Get(String),
    /// Every batch.
    List,
    /// Stops a batch.
    Cancel(String),
}

/// What an instance id given by a client must be.
pub const INSTANCE_ID_RULE: &str = "an instance id must have 1 to 200 characters, none of them a control character";

/// Whether a client may name an instance `id` ([`INSTANCE_ID_RULE`]). Control characters are
/// refused because hosts keep their own records under keys that start with one (the Kafka host's
/// state topic and local stores), and no listing or log should carry them.
pub fn valid_instance_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 200 && !id.chars().any(char::is_control)
}

/// A refused redrive as the host reports it.
pub fn redrive_error(e: sm4c_runtime::engine::redrive::RedriveError) -> HostError {
    use sm4c_runtime::engine::redrive::RedriveError;
    match e {
        RedriveError::NotRedrivable { reason, message } => HostError::NotRedrivable {
            reason: reason.to_string(),
            message,
        },
        RedriveError::Update(m) => HostError::InvalidUpdate(m),
    }
}

/// Where an event went.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Delivery {
    /// Instances it reached.
    pub reached: Vec<String>,
    /// True when it reached none and is kept for an instance that starts waiting for it.
    pub parked: bool,
    /// For a task heartbeat event: whether the instance no longer waits for the task.
    #[serde(rename = "cancelRequested", skip_serializing_if = "Option::is_none")]
    pub cancel_requested: Option<bool>,
}

/// A task answer the host accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    /// The instance the task belongs to.
    pub instance: String,
    /// The task's operation id.
    pub op: String,
    /// For heartbeats: true when the instance no longer waits for the task (the worker should stop).
    pub cancel_requested: bool,
}

/// An instance as listings show it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Instance id.
    pub id: String,
    /// Definition id.
    pub definition: String,
    /// Definition version.
    pub version: String,
    /// Status.
    pub status: String,
    /// Current state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Start time (RFC 3339).
    pub started_at: Option<String>,
    /// End time (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Parent instance, for subflows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Sequence number, for cursors.
    #[serde(skip)]
    pub seq: i64,
}

/// A stored instance.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Its snapshot.
    pub snapshot: Snapshot,
    /// Parent link.
    pub parent: Option<ParentLink>,
    /// Journal length.
    pub journal_len: i64,
}

/// A time as listings show it (RFC 3339).
pub fn time(ms: Option<Millis>) -> Option<String> {
    ms.map(sm4c_runtime::engine::rfc3339)
}

/// What the API says of a write (a start, a cancel, a task answer) it runs on behalf of the worker
/// that holds its instance, in a group of workers (`sm4c serve --kafka`); [`write`] reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Write {
    /// The client request's id, the same on every worker that runs it: a start or a task answer
    /// recorded with it is this request's (a 201, an answer taken), whichever worker appended it.
    pub request: Option<String>,
    /// The worker that holds the instance did not answer, or none holds it now: a host that does
    /// not hold the instance appends the command anyway and answers [`HostError::Appended`].
    pub not_owner: bool,
    /// The command was appended already (by an earlier run of the same request): a cancel
    /// answers once the instance is final, whoever ended it.
    pub appended: bool,
}

tokio::task_local! {
    static WRITE: Write;
}

/// What the API said of the write being answered ([`Write`]); the default outside one.
pub fn write() -> Write {
    WRITE.try_with(Write::clone).unwrap_or_default()
}

/// `f` run as the write `w`.
pub async fn writing<F: std::future::Future>(w: Write, f: F) -> F::Output {
    WRITE.scope(w, f).await
}

/// A fresh instance id: the definition id, the time, the process (workers of one Kafka group start
/// instances side by side) and a counter.
pub fn new_id(definition: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{definition}-{:x}{:04x}{:04x}",
        nanos,
        std::process::id() & 0xffff,
        n & 0xffff
    )
}

/// A page of sent events and the cursor of the next one.
pub type SentPage = (Vec<Value>, Option<String>);

/// Where the requests about one instance are answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whereabouts {
    /// By this host.
    Here,
    /// By the worker whose HTTP API is at this URL (Kafka mode: the owner of the instance's
    /// partition); the API forwards the request there.
    At(String),
    /// By no worker for now (its partition is being restored, or its worker left the group): why.
    Unavailable(String),
}

/// What the HTTP API runs on.
pub trait Backend: Send + Sync + 'static {
    /// Registers a definition; `true` when it is new.
    fn define(&self, doc: Value) -> BoxFuture<'_, Result<(Arc<Machine>, bool), HostError>>;
    /// Every registered definition (all versions).
    fn machines(&self) -> Vec<Arc<Machine>>;
    /// The latest version of a definition.
    fn latest(&self, id: &str) -> Option<Arc<Machine>>;
    /// Starts an instance; `true` when it is new (an existing id is not started again).
    fn start_instance(
        &self,
        definition: String,
        version: Option<String>,
        id: Option<String>,
        input: Value,
    ) -> BoxFuture<'_, Result<(String, bool), HostError>>;
    /// Starts an instance with the W3C `traceparent` of the request that started it (its origin),
    /// for a host that keeps it; by default the origin is not kept.
    fn start_traced(
        &self,
        definition: String,
        version: Option<String>,
        id: Option<String>,
        input: Value,
        _origin: Option<String>,
    ) -> BoxFuture<'_, Result<(String, bool), HostError>> {
        self.start_instance(definition, version, id, input)
    }
    /// One instance.
    fn instance(&self, id: &str) -> Result<Option<Stored>, HostError>;
    /// Instances, oldest first, after a cursor.
    fn list(
        &self,
        status: Option<&str>,
        definition: Option<&str>,
        after: i64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Summary>, HostError>>;
    /// Journal entries of an instance after a cursor.
    fn history(&self, id: &str, after: i64, limit: usize) -> BoxFuture<'_, Result<Vec<(i64, Entry)>, HostError>>;
    /// Cancels an instance.
    fn cancel(&self, id: String) -> BoxFuture<'_, Result<(), HostError>>;
    /// Delivers (or queues) an incoming CloudEvent; the JSON answered with 202.
    fn deliver(&self, event: Value) -> BoxFuture<'_, Result<Value, HostError>>;
    /// Sent events after a cursor: (events, next cursor).
    fn sent(&self, after: &str, limit: usize) -> BoxFuture<'_, Result<SentPage, HostError>>;
    /// Which instances an event would reach, and why the others turn it away.
    fn explain(&self, event: Value) -> BoxFuture<'_, Result<Value, HostError>>;
    /// The upgrade report of `new` (a version of a definition, registered or not) over the
    /// unended instances of its definition this host holds: see [`crate::upgrade::report`].
    fn upgrade_check(&self, new: Arc<Machine>) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(crate::upgrade::report(self, new, crate::clock::wall_ms()))
    }
    /// The task lists with tasks waiting or taken.
    fn task_lists(&self) -> BoxFuture<'_, Result<Vec<Value>, HostError>>;
    /// Waits up to `wait` for a task of a task list.
    fn poll(
        &self,
        list: String,
        worker: Option<String>,
        wait: Duration,
    ) -> BoxFuture<'_, Result<Option<Value>, HostError>>;
    /// A worker's answer to a task, by token.
    fn answer(&self, token: String, answer: Answer) -> BoxFuture<'_, Result<Answered, HostError>>;
    /// The step debugger's breakpoints, by definition id.
    fn breakpoints(&self) -> Result<Vec<(String, Vec<Breakpoint>)>, HostError> {
        Err(HostError::NotSupported(
            "the step debugger runs on SQLite (sm4c serve without --kafka)".into(),
        ))
    }
    /// Sets the breakpoints of a definition (an empty list clears them).
    fn set_breakpoints(
        &self,
        _definition: String,
        _breakpoints: Vec<Breakpoint>,
    ) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async { self.breakpoints().map(|_| ()) })
    }
    /// Moves instance `id` to `version` of its definition (`states`: old state name to new where
    /// they differ), or with `dry_run` says what it would do and changes nothing. Answered with
    /// the plan once the move is committed.
    fn migrate(
        &self,
        id: String,
        _version: String,
        _states: std::collections::BTreeMap<String, String>,
        _dry_run: bool,
    ) -> BoxFuture<'_, Result<sm4c_runtime::engine::migrate::MigrationPlan, HostError>> {
        Box::pin(async move {
            Err(HostError::NotSupported(format!(
                "moving instance {id:?} to another version is done by the SQLite host (sm4c serve without --kafka)"
            )))
        })
    }
    /// Sends failed or timed-out instance `id` back to running from the action (SM4C) or state
    /// (ASL) that failed, after applying `update` (a jq expression over its data), or with
    /// `dry_run` says what it would do (the data after the update) and changes nothing. Answered
    /// once the redrive is committed.
    fn redrive(&self, id: String, _update: Option<String>, _dry_run: bool) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async move {
            Err(HostError::NotSupported(format!(
                "redriving instance {id:?} is not offered by this host"
            )))
        })
    }
    /// The default version set for definition `id` (the version new starts take instead of the
    /// newest), if one is.
    fn default_version(&self, _id: &str) -> Option<String> {
        None
    }
    /// Sets which version new starts of definition `id` take (none: the newest again). The id and
    /// the version must be registered.
    fn set_default_version(&self, id: String, _version: Option<String>) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            Err(HostError::NotSupported(format!(
                "this host cannot set the default version of {id:?}"
            )))
        })
    }
    /// A paused instance goes on (`step`: to the next breakpoint-able point).
    fn resume(&self, _id: String, _step: bool) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async { self.breakpoints().map(|_| ()) })
    }
    /// What `GET /members` answers: the workers of a Kafka group and the partitions each owns.
    fn members(&self) -> Result<Value, HostError> {
        Err(HostError::NotSupported(
            "a server on SQLite is one worker; the members of a group are those of Kafka mode (sm4c serve --kafka)"
                .into(),
        ))
    }
    /// Where the requests about instance `id` are answered: here, unless the host is one worker of
    /// several that each hold a share of the instances.
    fn locate(&self, _id: &str) -> BoxFuture<'_, Whereabouts> {
        Box::pin(async { Whereabouts::Here })
    }
    /// The HTTP APIs of the other workers, which a listing of every instance asks too; `None` for
    /// a host that holds every instance itself.
    fn peers(&self) -> Option<Vec<String>> {
        None
    }
    /// Schedules: what `/schedules` asks ([`ScheduleOp`]). Not offered by default.
    fn schedules(&self, _op: ScheduleOp) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async {
            Err(HostError::NotSupported(
                "schedules are not offered by this host: run sm4c serve (with its SQLite store, or --kafka)".into(),
            ))
        })
    }
    /// Batches run by the host itself ([`BatchOp`]). Not offered by default.
    fn batches(&self, _op: BatchOp) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async {
            Err(HostError::NotSupported(
                "batch operations are run by sm4c serve (with its SQLite store, or --kafka)".into(),
            ))
        })
    }
    /// What `GET /healthz` answers.
    fn health(&self) -> Value {
        json!({"status": "ok"})
    }
}
