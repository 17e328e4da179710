//! The durable host: instances that survive crashes and restarts.
//!
//! One task decides for every instance, one input at a time (the decider model: one decision at a
//! time per execution). Inputs are handled in batches; a batch's journal entries, snapshots, timers,
//! calls in flight and sent events are committed to the [`Store`] in one transaction (group commit),
//! and only then are its effects performed. An instance that waits holds no memory here: it is
//! loaded from the store when something arrives for it. After a crash, timers come back from the
//! store (firing at once if they came due meanwhile) and calls that were in flight are made again
//! with the same operation id.

use crate::store::{Batch, InstanceWrite, Store, StoreError};
use serde_json::{json, Value};
use sm4c_host::driver::{self, Answering, Driver, Hosted, ParentLink, Work};
use sm4c_host::service::redrive_error;
use sm4c_host::service::{new_id, Answered, Delivery, HostError, Registry};
use sm4c_host::tasks::{decode_token, Answer, Poller, Task, TaskLists};
use sm4c_host::Functions;
use sm4c_runtime::engine::migrate::MigrationPlan;
use sm4c_runtime::engine::redrive::RedrivePlan;
use sm4c_runtime::{load, Effect, Entry, ErrorInfo, ErrorKind, Input, LoadOptions, Machine, Millis, Status, Timed};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

mod full;
mod schedules;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

/// An answer to a request, sent once its batch is committed, or with the error that kept it out.
type Reply = Box<dyn FnOnce(Result<(), HostError>) + Send>;

/// Limits the durable host enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long an event that reached no instance is kept for one that starts waiting (ms).
    pub park_ms: u64,
    /// Most events kept parked at once; one more that reaches no instance is refused
    /// ([`HostError::ParkedLimit`]).
    pub max_parked: usize,
    /// Most bytes (their JSON text) of events kept parked at once; an event that would pass it is
    /// refused ([`HostError::ParkedLimit`]).
    pub max_parked_bytes: u64,
    /// Largest journal of one instance (entries); past it the instance fails.
    pub max_journal: i64,
    /// Inputs handled per batch (one commit).
    pub batch: usize,
    /// Limits of every jq evaluation (fuel, sizes) of the definitions the host loads.
    pub expression: sm4c_runtime::Limits,
    /// Most redrives of one instance whose definition says nothing (SM4C `maxRedrives` says);
    /// none: no limit.
    pub max_redrives: Option<u32>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            park_ms: 5 * 60 * 1000,
            max_parked: 100_000,
            max_parked_bytes: 64 << 20,
            max_journal: 100_000,
            batch: 512,
            expression: sm4c_runtime::Limits::default(),
            max_redrives: None,
        }
    }
}

enum Cmd {
    Define(Value, oneshot::Sender<Result<(Arc<Machine>, bool), HostError>>),
    Start {
        definition: String,
        version: Option<String>,
        id: Option<String>,
        input: Value,
        origin: Option<String>,
        reply: oneshot::Sender<Result<(String, bool), HostError>>,
    },
    Event(Value, oneshot::Sender<Result<Delivery, HostError>>),
    Cancel(String, oneshot::Sender<Result<(), HostError>>),
    /// The step debugger resumes a paused instance (`true`: a step).
    Resume(String, bool, oneshot::Sender<Result<(), HostError>>),
    /// Moves an instance to another version (or, dry, says what that would do).
    Migrate {
        id: String,
        version: String,
        states: std::collections::BTreeMap<String, String>,
        dry_run: bool,
        reply: oneshot::Sender<Result<MigrationPlan, HostError>>,
    },
    /// Redrives a failed or timed-out instance (or, dry, says what that would do).
    Redrive {
        id: String,
        update: Option<String>,
        dry_run: bool,
        reply: oneshot::Sender<Result<Value, HostError>>,
    },
    Result {
        instance: String,
        op: String,
        result: Result<Value, ErrorInfo>,
    },
    /// A worker waits for a task of a task list until `deadline`.
    Poll {
        list: String,
        worker: Option<String>,
        deadline: tokio::time::Instant,
        reply: oneshot::Sender<Value>,
    },
    /// A worker answers a task.
    Answer {
        instance: String,
        op: String,
        answer: Answer,
        reply: oneshot::Sender<Result<Answered, HostError>>,
    },
    TaskLists(oneshot::Sender<Vec<Value>>),
    /// What `/schedules` asks.
    Schedule(
        sm4c_host::service::ScheduleOp,
        oneshot::Sender<Result<Value, HostError>>,
    ),
    /// Waiting workers go away empty-handed and new polls are answered at once (the server stops).
    ClosePolls,
    Shutdown(oneshot::Sender<()>),
}

/// A handle to the durable host's task.
#[derive(Clone)]
pub struct DurableHost {
    tx: mpsc::UnboundedSender<Cmd>,
    store: Arc<dyn Store>,
    registry: Arc<RwLock<Registry>>,
    /// Set, once, to why the deciding task stopped on a store failure.
    failure: tokio::sync::watch::Receiver<Option<String>>,
    /// The step debugger's breakpoints (kept in the store too).
    breakpoints: Arc<driver::Breakpoints>,
}

fn now_ms() -> Millis {
    sm4c_host::clock::wall_ms()
}

impl DurableHost {
    /// Opens the host on a store: loads definitions, timers and calls in flight, checks every
    /// unfinished instance's journal against its definition, and starts the deciding task.
    ///
    /// A stored definition that cannot be read back (or no longer loads) does not stop the start:
    /// it is logged, counted (`corrupt_record("definition")`) and left out, and its unfinished
    /// instances are failed with `corruptRecord` naming it; the other definitions are served.
    pub fn start(store: Arc<dyn Store>, host: Arc<dyn Functions>, limits: Limits) -> Result<DurableHost, HostError> {
        let mut registry = Registry::default();
        let mut lost: Vec<(String, String, String)> = Vec::new();
        for row in store.definition_rows()? {
            let doc = match row {
                Ok(doc) => doc,
                Err(bad) => {
                    lost.push(bad);
                    continue;
                }
            };
            let options = LoadOptions {
                limits: limits.expression,
            };
            match load(&doc, &mut sm4c_runtime::no_files, options) {
                Ok(m) => registry.insert(Arc::new(m)),
                Err(errs) => {
                    let text = |k: &str| match &doc[k] {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    let why = errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
                    lost.push((text("id"), text("version"), format!("it no longer loads: {why}")));
                }
            }
        }
        for (definition, version) in store.default_versions()? {
            registry.set_default(&definition, Some(version));
        }
        let registry = Arc::new(RwLock::new(registry));
        let breakpoints = Arc::new(driver::Breakpoints::default());
        for (definition, b) in store.breakpoints()? {
            breakpoints.set(&definition, b);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (failed, failure) = tokio::sync::watch::channel(None);
        let task_lists = host.task_lists();
        let at_most_once = host.at_most_once();
        let mut lp = Loop {
            store: store.clone(),
            host,
            driver: Driver {
                limits: driver::Limits {
                    max_journal: limits.max_journal,
                    ..driver::Limits::default()
                },
                task_lists,
                at_most_once,
                ..Driver::durable()
            },
            failed,
            registry: registry.clone(),
            breakpoints: breakpoints.clone(),
            limits,
            tx: tx.downgrade(),
            cache: HashMap::new(),
            timers: BTreeSet::new(),
            queue: Vec::new(),
            in_flight: HashMap::new(),
            batch: Batch::default(),
            after: Vec::new(),
            replies: Vec::new(),
            results: Vec::new(),
            paused: None,
            backoff: None,
            held: Vec::new(),
            carried: Vec::new(),
            parked_count: 0,
            parked_bytes: 0,
            parked_counted: 0,
            tasks: TaskLists::default(),
            handouts: Vec::new(),
            task_times: HashMap::new(),
            closing: false,
            schedules: Default::default(),
        };
        lp.lost_definitions(&lost)?;
        lp.recover()?;
        lp.load_schedules()?;
        tokio::spawn(lp.run(rx));
        Ok(DurableHost {
            tx,
            store,
            registry,
            failure,
            breakpoints,
        })
    }

    /// Waits until the host stops deciding because its store failed, and says why. The host
    /// never ends the process: whoever runs it decides what a failed store means (`sm4c serve`
    /// exits with status 3).
    pub async fn failed(&self) -> String {
        let mut rx = self.failure.clone();
        let why = rx.wait_for(Option::is_some).await.map(|why| why.clone());
        match why {
            Ok(why) => why.unwrap_or_default(),
            // The deciding task is gone without a failure: wait forever, as for a healthy host.
            Err(_) => std::future::pending().await,
        }
    }

    fn stopped(&self) -> HostError {
        match self.failure.borrow().clone() {
            Some(why) => HostError::Failed(why),
            None => HostError::Stopped,
        }
    }

    /// The store, for reads.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The registered definitions.
    pub fn registry(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|p| p.into_inner())
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<Result<T, HostError>>) -> Cmd) -> Result<T, HostError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).map_err(|_| self.stopped())?;
        rx.await.map_err(|_| self.stopped())?
    }

    /// What `/schedules` asks ([`sm4c_host::service::ScheduleOp`]): a change is answered once it
    /// is written.
    pub async fn schedules(&self, op: sm4c_host::service::ScheduleOp) -> Result<Value, HostError> {
        self.ask(|r| Cmd::Schedule(op, r)).await
    }

    /// Registers a definition (`true` when new). The same id and version with other content is refused.
    pub async fn define(&self, doc: Value) -> Result<(Arc<Machine>, bool), HostError> {
        self.ask(|r| Cmd::Define(doc, r)).await
    }

    /// Starts an instance (`true` when new; an existing id starts nothing and is returned).
    pub async fn start_instance(
        &self,
        definition: &str,
        version: Option<&str>,
        id: Option<String>,
        input: Value,
    ) -> Result<(String, bool), HostError> {
        self.start_traced(definition, version, id, input, None).await
    }

    /// Starts an instance as [`DurableHost::start_instance`] does, with the W3C `traceparent` of
    /// what started it (its origin): stored beside it, so the spans of its steps link to it across
    /// restarts.
    pub async fn start_traced(
        &self,
        definition: &str,
        version: Option<&str>,
        id: Option<String>,
        input: Value,
        origin: Option<String>,
    ) -> Result<(String, bool), HostError> {
        let (definition, version) = (definition.to_string(), version.map(str::to_string));
        self.ask(|reply| Cmd::Start {
            definition,
            version,
            id,
            input,
            origin,
            reply,
        })
        .await
    }

    /// Delivers a CloudEvent (JSON structured form). An event of type `sm4c.task.completed`,
    /// `sm4c.task.failed` or `sm4c.task.heartbeat` answers the task its `sm4ctasktoken` names instead.
    pub async fn deliver(&self, event: Value) -> Result<Delivery, HostError> {
        match Answer::from_event(&event).map_err(HostError::InvalidTaskEvent)? {
            Some((token, answer)) => {
                let heartbeat = matches!(answer, Answer::Heartbeat(_));
                let a = self.answer(&token, answer).await?;
                Ok(Delivery {
                    reached: vec![a.instance],
                    parked: false,
                    cancel_requested: heartbeat.then_some(a.cancel_requested),
                })
            }
            None => self.ask(|r| Cmd::Event(event, r)).await,
        }
    }

    /// Waits up to `wait` for a task of task list `list` and hands it to the worker (its start is
    /// committed first). `None` when no task came.
    pub async fn poll(
        &self,
        list: &str,
        worker: Option<String>,
        wait: std::time::Duration,
    ) -> Result<Option<Value>, HostError> {
        let (reply, rx) = oneshot::channel();
        let deadline = tokio::time::Instant::now() + wait;
        let list = list.to_string();
        self.tx
            .send(Cmd::Poll {
                list,
                worker,
                deadline,
                reply,
            })
            .map_err(|_| self.stopped())?;
        // The deciding task drops the request at its deadline; a task handed out just before is
        // answered once its start is committed, which is why this waits a little longer.
        match tokio::time::timeout_at(deadline + std::time::Duration::from_secs(30), rx).await {
            Ok(Ok(task)) => Ok(Some(task)),
            _ => Ok(None),
        }
    }

    /// Answers the task a token names: completes, fails or heartbeats it.
    pub async fn answer(&self, token: &str, answer: Answer) -> Result<Answered, HostError> {
        let (instance, op) = decode_token(token).ok_or_else(|| {
            HostError::UnknownTask(format!(
                "{token:?} is not a task token (tokens come from polling a task list)"
            ))
        })?;
        self.ask(|reply| Cmd::Answer {
            instance,
            op,
            answer,
            reply,
        })
        .await
    }

    /// Every task list with its queued tasks and waiting workers (`name`, `queued`, `polling`).
    pub async fn task_lists(&self) -> Result<Vec<Value>, HostError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Cmd::TaskLists(reply)).map_err(|_| self.stopped())?;
        rx.await.map_err(|_| self.stopped())
    }

    /// Sends waiting workers away without a task, and answers later polls at once (for a prompt stop).
    pub fn close_polls(&self) {
        let _ = self.tx.send(Cmd::ClosePolls);
    }

    /// Cancels an instance.
    pub async fn cancel(&self, id: &str) -> Result<(), HostError> {
        let id = id.to_string();
        self.ask(|r| Cmd::Cancel(id, r)).await
    }

    /// The step debugger's breakpoints, by definition id.
    pub fn breakpoints(&self) -> Vec<(String, Vec<sm4c_runtime::Breakpoint>)> {
        self.breakpoints.all()
    }

    /// Sets the breakpoints of a definition (an empty list clears them), each checked against its
    /// latest version; stored before this returns. Instances pick them up with their next input.
    pub fn set_breakpoints(
        &self,
        definition: &str,
        mut breakpoints: Vec<sm4c_runtime::Breakpoint>,
    ) -> Result<(), HostError> {
        let m = self
            .registry()
            .get(definition, None)
            .ok_or_else(|| HostError::UnknownDefinition(definition.to_string()))?;
        for b in &breakpoints {
            b.check(&m).map_err(HostError::InvalidBreakpoint)?;
        }
        let mut seen = Vec::new();
        breakpoints.retain(|b| {
            let new = !seen.contains(b);
            seen.push(b.clone());
            new
        });
        let store = &self.store;
        self.breakpoints
            .update(definition, breakpoints, |b| store.put_breakpoints(definition, b))?;
        Ok(())
    }

    /// Sets which version new starts of definition `id` take (none: the newest registered, as
    /// without a default); stored before this returns. Instances already running keep theirs.
    pub fn set_default_version(&self, id: &str, version: Option<&str>) -> Result<(), HostError> {
        let mut registry = self.registry.write().unwrap_or_else(|p| p.into_inner());
        if registry.newest(id).is_none() {
            return Err(HostError::UnknownDefinition(id.to_string()));
        }
        if let Some(v) = version {
            if registry.get(id, Some(v)).is_none() {
                return Err(HostError::UnknownDefinition(format!("{id} version {v}")));
            }
        }
        self.store.put_default_version(id, version)?;
        registry.set_default(id, version.map(str::to_string));
        Ok(())
    }

    /// Moves instance `id` to `version` of its definition, from the state it waits in to the one
    /// of the same name there or the one `states` maps it to; answered with what it did once that
    /// is committed. With `dry_run`, says what it would do and changes nothing.
    pub async fn migrate(
        &self,
        id: &str,
        version: &str,
        states: std::collections::BTreeMap<String, String>,
        dry_run: bool,
    ) -> Result<MigrationPlan, HostError> {
        let (id, version) = (id.to_string(), version.to_string());
        self.ask(|reply| Cmd::Migrate {
            id,
            version,
            states,
            dry_run,
            reply,
        })
        .await
    }

    /// Redrives failed or timed-out instance `id` from where it failed, its data changed by
    /// `update` (a jq expression over it): answered with what the redrive did (`id`, `from`,
    /// `redrives`, `data`, `diff`) once it is committed. With `dry_run`, says what it would do
    /// and changes nothing.
    pub async fn redrive(&self, id: &str, update: Option<String>, dry_run: bool) -> Result<Value, HostError> {
        let id = id.to_string();
        self.ask(|reply| Cmd::Redrive {
            id,
            update,
            dry_run,
            reply,
        })
        .await
    }

    /// Resumes a paused instance; with `step`, it pauses again at the next breakpoint-able point.
    /// Answered once the resume is committed.
    pub async fn resume(&self, id: &str, step: bool) -> Result<(), HostError> {
        let id = id.to_string();
        self.ask(|r| Cmd::Resume(id, step, r)).await
    }

    /// Finishes the current batch and stops deciding.
    pub async fn shutdown(&self) {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Cmd::Shutdown(reply)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// Whether a store error, as a host error's text, is a record that cannot be read back.
fn corrupt_text(e: &str) -> bool {
    e.starts_with("store: corrupt record:")
}

struct Slot {
    h: Hosted,
    dirty: bool,
    was_waiting: bool,
}

struct Loop {
    store: Arc<dyn Store>,
    host: Arc<dyn Functions>,
    driver: Driver,
    failed: tokio::sync::watch::Sender<Option<String>>,
    registry: Arc<RwLock<Registry>>,
    breakpoints: Arc<driver::Breakpoints>,
    limits: Limits,
    tx: mpsc::WeakUnboundedSender<Cmd>,
    /// Instances touched in the current batch only.
    cache: HashMap<String, Slot>,
    timers: BTreeSet<(Millis, String, String)>,
    queue: Vec<(String, Input)>,
    /// Calls in flight, until they return.
    in_flight: HashMap<(String, String), AbortHandle>,
    batch: Batch,
    /// Work to perform once the batch is committed.
    after: Vec<(String, Work)>,
    /// Answers to requests, sent once the batch is committed (so many requests share one commit).
    replies: Vec<Reply>,
    /// Results of calls handled in the current batch, with their calls' handles: when the batch
    /// cannot be written they are handled again after the pause, and the calls are not made again.
    results: Vec<(AbortHandle, String, String, Result<Value, ErrorInfo>)>,
    /// Set while the disk is full: until when the host writes nothing.
    paused: Option<tokio::time::Instant>,
    /// The last pause, until a batch is written again (each pause doubles it, up to a bound).
    backoff: Option<Duration>,
    /// Call results that arrived during the pause, handled when it ends.
    held: Vec<Cmd>,
    /// Inputs a written batch left for the next (past the batch size): when the next cannot be
    /// written, they are handled again after the pause, since what they answer is written.
    carried: Vec<(String, Input)>,
    /// Events parked (written or in the batch), as last counted plus what was parked and taken
    /// since: more than are left when some expired, which a count at the limit corrects.
    parked_count: usize,
    /// Their bytes (JSON text), counted the same way.
    parked_bytes: u64,
    /// When the parked events were last counted in the store (ms).
    parked_counted: Millis,
    /// Worker tasks waiting for workers, and workers waiting for tasks.
    tasks: TaskLists,
    /// Tasks handed to workers, sent to them once their `TaskStarted` is committed.
    handouts: Vec<(Task, Poller)>,
    /// For the metrics: when this process scheduled each open task (instance, op) and when a
    /// worker took it (task list, scheduled, taken). Tasks scheduled before a restart are not timed.
    task_times: HashMap<(String, String), (String, Instant, Option<Instant>)>,
    /// Set when the server stops: polls are answered at once.
    closing: bool,
    /// The schedules, as the store has them plus this batch's changes.
    schedules: schedules::Schedules,
}

impl Loop {
    fn machine(&self, id: &str, version: &str) -> Option<Arc<Machine>> {
        self.registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id, Some(version))
    }

    /// Restores timers and calls in flight; checks unfinished instances against their definitions.
    ///
    /// One record that cannot be read back never stops recovery: its instance is failed with
    /// `corruptRecord` naming the record (see [`Loop::corrupt`]), and every other instance goes on.
    fn recover(&mut self) -> Result<(), HostError> {
        for (inst, timer, due) in self.store.timers()? {
            self.timers.insert((due, inst, timer));
        }
        let mut ids: BTreeSet<String> = self.timers.iter().map(|(_, i, _)| i.clone()).collect();
        let all: Vec<(String, String)> = self.registry.read().unwrap_or_else(|p| p.into_inner()).keys().to_vec();
        let active = self.store.active(&all)?;
        let mut corrupt: Vec<(String, &'static str, String)> = Vec::new();
        let calls = match self.store.calls() {
            Ok(calls) => calls,
            // Some call cannot be read back: read them instance by instance, to know whose.
            Err(StoreError::Corrupt(_)) => {
                let mut calls = Vec::new();
                for id in &active {
                    match self.store.calls_of(id) {
                        Ok(open) => calls.extend(open.into_iter().map(|e| (id.clone(), e))),
                        Err(StoreError::Corrupt(e)) => corrupt.push((id.clone(), "call", e)),
                        Err(e) => return Err(e.into()),
                    }
                }
                calls
            }
            Err(e) => return Err(e.into()),
        };
        for (inst, effect) in calls {
            ids.insert(inst.clone());
            match self.recovered(&inst, effect) {
                Ok(Some(work)) => self.after.push((inst, work)),
                Ok(None) => {}
                Err(HostError::Store(e)) if corrupt_text(&e) => corrupt.push((inst, "snapshot", e)),
                Err(e) => return Err(e),
            }
        }
        ids.extend(active);
        for id in ids {
            if corrupt.iter().any(|(c, ..)| *c == id) {
                continue;
            }
            if let Err((record, e)) = self.verify(&id)? {
                corrupt.push((id, record, e));
            }
        }
        for (id, record, e) in corrupt {
            self.after.retain(|(i, _)| *i != id);
            self.corrupt(&id, record, &e)?;
        }
        let now = now_ms();
        (self.parked_count, self.parked_bytes) = self.store.parked_totals(now)?;
        self.parked_counted = now;
        Ok(())
    }

    /// Definitions left out at start because their stored row cannot be read back (`lost`:
    /// id, version, why): each is logged and counted, and its unfinished instances, which nothing
    /// can step without it, are failed with `corruptRecord` naming the definition record (their
    /// timers and open calls are dropped; a parent waiting for one is told it failed).
    fn lost_definitions(&mut self, lost: &[(String, String, String)]) -> Result<(), HostError> {
        for (definition, version, why) in lost {
            tracing::error!(definition, version, error = %why, "a stored definition cannot be read back; it is left out and its unfinished instances are failed with corruptRecord");
            if let Some(o) = sm4c_host::metrics::observer() {
                o.corrupt_record("definition");
            }
            let key = [(definition.clone(), version.clone())];
            let now = now_ms();
            for id in self.store.active(&key)? {
                let (mut snapshot, parent) = match self.store.instance(&id) {
                    Ok(Some(stored)) => (stored.snapshot, stored.parent),
                    Ok(None) => continue,
                    // Its snapshot cannot be read either: it stays as it is (listed, not served).
                    Err(e) => {
                        tracing::error!(instance = %id, error = %e, "the snapshot of an instance of an unreadable definition cannot be read back either; it is left as it is");
                        continue;
                    }
                };
                tracing::error!(instance = %id, definition, version, "the instance's definition cannot be read back; the instance is failed with corruptRecord");
                snapshot.status = Status::Failed;
                snapshot.error = Some(
                    ErrorInfo::new(
                        ErrorKind::CorruptRecord,
                        format!(
                            "the store's definition record of {definition:?} version {version:?}, which instance {id:?} runs, cannot be read back: {why}"
                        ),
                    )
                    .with_details(json!({"record": "definition", "definition": definition, "version": version})),
                );
                snapshot.timers.clear();
                snapshot.state_timer = None;
                let told = self.tell_parent(&id, parent.as_ref(), &snapshot);
                self.write_ended(snapshot, now, told)?;
            }
        }
        Ok(())
    }

    /// Fails an instance one of whose records (`record`: its `snapshot`, a `journal` row, an open
    /// `call`) cannot be read back (`why`): logged, counted, and recorded as a `corruptRecord`
    /// error naming the record. An instance whose snapshot is readable is aborted as usual; one
    /// whose snapshot is not gets a new one, failed, made from its definition.
    fn corrupt(&mut self, id: &str, record: &str, why: &str) -> Result<(), HostError> {
        tracing::error!(instance = %id, record, error = %why, "a stored record of the instance cannot be read back; the instance is failed with corruptRecord");
        if let Some(o) = sm4c_host::metrics::observer() {
            o.corrupt_record(record);
        }
        let error = ErrorInfo::new(
            ErrorKind::CorruptRecord,
            format!("the store's {record} record of instance {id:?} cannot be read back: {why}"),
        )
        .with_details(json!({"record": record}));
        if let Ok(Some(_)) = self.store.instance(id) {
            self.queue.push((id.to_string(), Input::Abort { error }));
            return Ok(());
        }
        let Some((definition, version)) = self.store.definition_of(id)? else {
            return Ok(());
        };
        let Some(m) = self.machine(&definition, &version) else {
            tracing::error!(instance = %id, definition, version, "the definition of an instance with an unreadable snapshot is not registered; it is left as it is");
            return Ok(());
        };
        let mut snapshot = sm4c_runtime::Instance::new(m, id, self.driver.options)
            .snapshot()
            .clone();
        snapshot.status = Status::Failed;
        snapshot.error = Some(error);
        let parent = self.store.parent_of(id)?;
        let told = self.tell_parent(id, parent.as_ref(), &snapshot);
        self.write_ended(snapshot, now_ms(), told)
    }

    /// A parent that waits for instance `id`, failed by recovery as `snapshot` says (outside any
    /// step, so the driver does not tell it), gets its subflow's outcome as a step would give it.
    /// Whether one was told.
    fn tell_parent(&mut self, id: &str, parent: Option<&ParentLink>, snapshot: &sm4c_runtime::Snapshot) -> bool {
        let Some(p) = parent.filter(|p| p.waits) else {
            return false;
        };
        {
            let input = driver::subflow_result(
                id,
                p.op.clone(),
                snapshot.status,
                sm4c_runtime::json::from_val(&snapshot.data.0),
                snapshot.error.clone(),
            );
            self.queue.push((p.instance.clone(), input));
        }
        true
    }

    /// Writes `snapshot` of an instance that ends at `now` outside any step (a recovery that fails
    /// it): no journal entries, no calls. In a batch of its own, or, when its parent was `told`, in
    /// the next batch, which decides the parent's input: the child's end and what its parent makes
    /// of it are written together, so a crash between them cannot leave the parent waiting.
    fn write_ended(&mut self, mut snapshot: sm4c_runtime::Snapshot, now: Millis, told: bool) -> Result<(), HostError> {
        snapshot.now = now;
        snapshot.ended_at = Some(now);
        let write = InstanceWrite {
            snapshot,
            parent: None,
            entries: Vec::new(),
            calls: Vec::new(),
            origin: None,
        };
        if told {
            self.batch.instances.push(write);
            return Ok(());
        }
        let batch = Batch {
            instances: vec![write],
            ..Batch::default()
        };
        self.store.commit(&batch)?;
        Ok(())
    }

    /// The work an open call or subflow start of a crashed server still needs: the call is made
    /// again with the same operation id (an `atMostOnce` call is failed with `stepInterrupted`
    /// instead, [`driver::interrupted`]), the subflow started if it was not, and a worker task
    /// queued again with the same token, unless a worker had taken it (that worker still has its
    /// token, and the task's start-to-close and heartbeat timeouts cover a worker that is gone).
    fn recovered(&mut self, id: &str, effect: Effect) -> Result<Option<Work>, HostError> {
        let Some(stored) = self.store.instance(id)? else {
            return Ok(None);
        };
        let Some(m) = self.machine(&stored.snapshot.definition, &stored.snapshot.version) else {
            return Ok(None);
        };
        let depth = self.depth(stored.parent.as_ref());
        let work = self.driver.work(id, &m, depth, effect);
        // An atMostOnce call may have reached its function: it fails instead (journaled, so a
        // replay sees the same), and the instance's handlers and retries take it from there.
        if let Some(input) = driver::interrupted(&work) {
            self.queue.push((id.to_string(), input));
            return Ok(None);
        }
        if let Work::Task { task, .. } = &work {
            let inst = self.driver.restore(m, stored.snapshot);
            if inst.task_started(&task.op) != Some(false) {
                return Ok(None);
            }
        }
        Ok(Some(work))
    }

    /// How deep an instance with this parent nests, from the parent links in the store.
    fn depth(&self, parent: Option<&ParentLink>) -> u32 {
        let mut depth = 0;
        let mut cur = parent.map(|p| p.instance.clone());
        while let Some(p) = cur {
            depth += 1;
            if depth > self.driver.limits.max_subflow_depth {
                break;
            }
            cur = match self.cache.get(&p) {
                Some(slot) => slot.h.parent.as_ref().map(|l| l.instance.clone()),
                None => self
                    .store
                    .instance(&p)
                    .ok()
                    .flatten()
                    .and_then(|s| s.parent)
                    .map(|l| l.instance),
            };
        }
        depth
    }

    /// Replays an unfinished instance's journal; a mismatch fails the instance, naming the entry.
    /// `Ok(Err((record, why)))` when a record of the instance cannot be read back.
    fn verify(&mut self, id: &str) -> Result<Result<(), (&'static str, String)>, HostError> {
        let stored = match self.store.instance(id) {
            Ok(Some(stored)) => stored,
            Ok(None) => return Ok(Ok(())),
            Err(StoreError::Corrupt(e)) => return Ok(Err(("snapshot", e))),
            Err(e) => return Err(e.into()),
        };
        if stored.snapshot.status.is_final() {
            return Ok(Ok(()));
        }
        let Some(m) = self.machine(&stored.snapshot.definition, &stored.snapshot.version) else {
            return Ok(Ok(()));
        };
        let journal: Vec<Entry> = match self.store.history(id, 0, usize::MAX) {
            Ok(history) => history.into_iter().map(|(_, e)| e).collect(),
            Err(StoreError::Corrupt(e)) => return Ok(Err(("journal", e))),
            Err(e) => return Err(e.into()),
        };
        let (registry, definition) = (self.registry.clone(), stored.snapshot.definition.clone());
        let version = move |v: &str| {
            let r = registry.read().unwrap_or_else(|p| p.into_inner());
            r.get(&definition, Some(v))
        };
        let error = match sm4c_runtime::Instance::replay_versions(m, id, &journal, self.driver.options, &version) {
            Err(e) => {
                Some(ErrorInfo::new(ErrorKind::ReplayMismatch, e.to_string()).with_details(json!({"entry": e.index})))
            }
            Ok(replayed) => {
                // Same effects, but does the journal still lead to the saved instance?
                let diffs = sm4c_runtime::engine::snapshot_differences(replayed.snapshot(), &stored.snapshot);
                (!diffs.is_empty()).then(|| {
                    ErrorInfo::new(
                        ErrorKind::ReplayMismatch,
                        format!(
                            "journal entry {}: replaying the journal against the definition no longer gives the saved instance: {}",
                            journal.len(),
                            diffs.join("; ")
                        ),
                    )
                    .with_details(json!({"entry": journal.len()}))
                })
            }
        };
        if let Some(error) = error {
            self.queue.push((id.to_string(), Input::Abort { error }));
        }
        Ok(Ok(()))
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        // Calls that were in flight at a crash are made again (same operation ids).
        let pending = std::mem::take(&mut self.after);
        for (inst, work) in pending {
            self.perform(&inst, work);
        }
        let mut shutdown: Option<oneshot::Sender<()>> = None;
        loop {
            if let Some(until) = self.paused {
                if tokio::time::Instant::now() < until {
                    tokio::select! {
                        cmd = rx.recv() => match cmd {
                            // Nothing is left to write: the last batch was refused.
                            Some(Cmd::Shutdown(r)) => {
                                let _ = r.send(());
                                return;
                            }
                            Some(cmd) => self.command_paused(cmd),
                            None => return,
                        },
                        _ = tokio::time::sleep_until(until) => {}
                    }
                    continue;
                }
                if let Err(e) = self.resume() {
                    self.refused(e);
                }
                continue;
            }
            // Take what has arrived, up to a batch.
            while self.queue.len() < self.limits.batch {
                match rx.try_recv() {
                    Ok(Cmd::Shutdown(r)) => {
                        shutdown = Some(r);
                        break;
                    }
                    Ok(cmd) => self.command(cmd),
                    Err(_) => break,
                }
            }
            self.fire_due();
            if !self.queue.is_empty()
                || !self.replies.is_empty()
                || self.cache.values().any(|s| s.dirty)
                || self.schedules.changed()
            {
                match self.step() {
                    Ok(()) => {}
                    // Nothing of the batch was written: its requests are refused, the host pauses,
                    // then carries on from what the store holds, as after a restart.
                    Err(e) if e.is_full() => self.refused(e),
                    Err(e) => {
                        // The decisions of this batch cannot be made durable: stop rather than act on
                        // them. Requests waiting for this batch, and later ones, are told why.
                        tracing::error!(error = %e, "cannot write to the store; the host stops deciding");
                        let _ = self.failed.send(Some(e.to_string()));
                        return;
                    }
                }
                continue;
            }
            if let Some(r) = shutdown.take() {
                let _ = r.send(());
                return;
            }
            let first = match (self.timers.first().map(|(due, ..)| *due), self.schedules.next_wake()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let wait = first.map(|due| (due - now_ms()).max(0) as u64);
            // Waiting workers are sent away empty-handed at their deadline.
            let wait = match self.tasks.next_deadline() {
                Some(d) => {
                    let poll = d.saturating_duration_since(tokio::time::Instant::now()).as_millis() as u64;
                    Some(wait.map_or(poll, |w| w.min(poll)))
                }
                None => wait,
            };
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(Cmd::Shutdown(r)) => shutdown = Some(r),
                    Some(cmd) => self.command(cmd),
                    None => return,
                },
                _ = tokio::time::sleep(std::time::Duration::from_millis(wait.unwrap_or(3_600_000))) => {}
            }
        }
    }

    fn fire_due(&mut self) {
        self.tasks.expire(tokio::time::Instant::now());
        let now = now_ms();
        while let Some(first) = self.timers.first().cloned() {
            if first.0 > now {
                break;
            }
            self.timers.remove(&first);
            self.queue.push((first.1, Input::TimerFired { timer: first.2 }));
        }
        self.fire_schedules(now);
    }

    /// Handles the queued inputs, commits them, then performs their effects.
    fn step(&mut self) -> Result<(), StoreError> {
        // A deque: an event fanned out to many instances must not cost a shift per input.
        let mut queue: std::collections::VecDeque<(String, Input)> = std::mem::take(&mut self.queue).into();
        let mut processed = 0;
        while processed < self.limits.batch {
            let Some((id, input)) = queue.pop_front() else { break };
            self.handle(&id, input);
            processed += 1;
            // Inputs produced while handling (sent events routed locally, child completions) go next.
            queue.extend(self.queue.drain(..));
        }
        self.queue = queue.into();
        self.unpark_for_waiting();
        self.commit(processed)
    }

    fn slot(&mut self, id: &str) -> Option<&mut Slot> {
        if !self.cache.contains_key(id) {
            let stored = self.store.instance(id).ok()??;
            let m = self.machine(&stored.snapshot.definition, &stored.snapshot.version)?;
            let was_waiting = stored.snapshot.status == Status::Waiting;
            let saved_status = stored.snapshot.status;
            let inst = self.driver.restore(m, stored.snapshot);
            // A snapshot that no longer fits its definition comes back failed: that must be saved.
            let changed = inst.status() != saved_status;
            let depth = self.depth(stored.parent.as_ref());
            // Calls in flight are kept with the instance; reload them for this batch.
            let open = self.store.calls_of(id).unwrap_or_default();
            let mut h = Hosted::restored(inst, stored.parent, depth, open, stored.journal_len);
            h.origin = self.store.origin(id).unwrap_or_default();
            self.cache.insert(
                id.to_string(),
                Slot {
                    h,
                    dirty: changed,
                    was_waiting,
                },
            );
        }
        self.cache.get_mut(id)
    }

    /// Moves instance `id` to `version` now (in this batch), or says why it cannot.
    fn migrate(
        &mut self,
        id: &str,
        version: &str,
        states: &std::collections::BTreeMap<String, String>,
        dry_run: bool,
    ) -> Result<MigrationPlan, HostError> {
        let now = now_ms();
        let driver = self.driver.clone();
        let definition = match self.slot(id) {
            Some(slot) => slot.h.inst.machine().id.clone(),
            None => return Err(HostError::UnknownInstance(id.to_string())),
        };
        let Some(to) = self.machine(&definition, version) else {
            return Err(HostError::UnknownDefinition(format!("{definition} version {version}")));
        };
        let Some(slot) = self.slot(id) else {
            return Err(HostError::UnknownInstance(id.to_string()));
        };
        let plan = slot
            .h
            .inst
            .migration_plan(&to, states, now)
            .map_err(HostError::NotMigratable)?;
        if dry_run {
            return Ok(plan);
        }
        let step = driver
            .migrate(&mut slot.h, to, states, now)
            .map_err(HostError::NotMigratable)?;
        slot.dirty = true;
        // It may wait for other events now: those parked for it are handed over.
        slot.was_waiting = false;
        self.after_step(id, step, now);
        Ok(plan)
    }

    /// Redrives instance `id` now (in this batch), or says why it cannot.
    fn redrive(&mut self, id: &str, update: Option<&str>, dry_run: bool) -> Result<Value, HostError> {
        let now = now_ms();
        let driver = self.driver.clone();
        let cap = self.limits.max_redrives;
        let Some(slot) = self.slot(id) else {
            return Err(HostError::UnknownInstance(id.to_string()));
        };
        let answer = |plan: &RedrivePlan| json!({"id": id, "from": plan.from, "redrives": plan.redrives, "data": plan.data, "diff": plan.diff});
        if dry_run {
            let plan = slot.h.inst.redrive_plan(update, cap).map_err(redrive_error)?;
            return Ok(answer(&plan));
        }
        let (plan, step) = driver.redrive(&mut slot.h, update, cap, now).map_err(redrive_error)?;
        slot.dirty = true;
        // It may wait for events again: those parked for it are handed over.
        slot.was_waiting = false;
        self.after_step(id, step, now);
        Ok(answer(&plan))
    }

    fn handle(&mut self, id: &str, input: Input) {
        let now = now_ms();
        let driver = self.driver.clone();
        let breakpoints = self.breakpoints.clone();
        let Some(slot) = self.slot(id) else { return };
        if slot.h.inst.status().is_final() {
            return;
        }
        // The step debugger: breakpoints changed since the instance last recorded them.
        if let Some(debug) = breakpoints.input_for(&slot.h.inst) {
            driver.step(&mut slot.h, Timed { at: now, input: debug });
        }
        let step = driver.step(&mut slot.h, Timed { at: now, input });
        slot.dirty = true;
        self.after_step(id, step, now);
    }

    /// What an instance's step asks of the host: its effects after the commit, its sent events
    /// routed, the instance it notifies, the schedule it ran for when it ended.
    fn after_step(&mut self, id: &str, step: sm4c_host::driver::Step, now: i64) {
        for work in step.work {
            if let Work::Send { event, .. } = &work {
                self.batch.outbox.push((id.to_string(), event.clone(), now));
                // An instance's own event is never refused (only events from outside are parked).
                let _ = self.route(event.clone(), Some(id));
            }
            self.after.push((id.to_string(), work));
        }
        if let Some(n) = step.notify {
            self.queue.push((n.instance, n.input));
        }
        if step.finished {
            let status = self.cache.get(id).map(|s| s.h.inst.status());
            if let Some(status) = status {
                self.schedule_ended(id, status);
            }
        }
    }

    /// Sends an event to the instance it names, else to every unfinished instance with a matching
    /// event definition; parks it when it reaches none. `from` does not receive its own event.
    /// An event from outside that reaches none is refused when parking it would pass a limit
    /// ([`Limits::max_parked`], [`Limits::max_parked_bytes`]); an event an instance sent is never
    /// refused (it is in the instance's outbox) and never parked.
    fn route(&mut self, event: Value, from: Option<&str>) -> Result<Delivery, HostError> {
        if from.is_none() {
            if let Some(target) = driver::target(&event) {
                if self.slot(&target).is_some() {
                    self.queue.push((target.clone(), Input::Event { event }));
                    return Ok(Delivery {
                        reached: vec![target],
                        parked: false,
                        cancel_requested: None,
                    });
                }
            }
        }
        let candidates = self.candidates(&event, from);
        if candidates.is_empty() {
            if from.is_none() {
                let size = crate::store::parked_size(&event);
                self.room_to_park(size)?;
                self.batch.parked.push((event, now_ms() + self.limits.park_ms as i64));
                self.parked_count += 1;
                self.parked_bytes += size;
            }
            return Ok(Delivery {
                reached: Vec::new(),
                parked: from.is_none(),
                cancel_requested: None,
            });
        }
        for id in &candidates {
            self.queue.push((id.clone(), Input::Event { event: event.clone() }));
        }
        Ok(Delivery {
            reached: candidates,
            parked: false,
            cancel_requested: None,
        })
    }

    /// Whether an event of `size` bytes may be parked: `Err` naming the limit it would pass. At a
    /// limit the parked events are counted again in the store (expired ones leave it), at most
    /// once a second.
    fn room_to_park(&mut self, size: u64) -> Result<(), HostError> {
        let fits = |l: &Self| {
            l.parked_count < l.limits.max_parked && l.parked_bytes.saturating_add(size) <= l.limits.max_parked_bytes
        };
        if fits(self) {
            return Ok(());
        }
        let now = now_ms();
        if now - self.parked_counted >= 1000 {
            if let Ok((count, bytes)) = self.store.parked_totals(now) {
                // What this batch parks is not in the store yet.
                let pending: u64 = self
                    .batch
                    .parked
                    .iter()
                    .map(|(e, _)| crate::store::parked_size(e))
                    .sum();
                self.parked_count = count + self.batch.parked.len();
                self.parked_bytes = bytes + pending;
                self.parked_counted = now;
                if fits(self) {
                    return Ok(());
                }
            }
        }
        let why = if self.parked_count >= self.limits.max_parked {
            format!(
                "the event reached no instance and was not parked: {} events are parked already (the limit, --max-parked); it was not kept, send it again once instances take parked events or they expire",
                self.limits.max_parked
            )
        } else {
            format!(
                "the event reached no instance and was not parked: its {size} bytes would take the parked events past {} bytes (the limit, --max-parked-bytes); it was not kept, send it again once instances take parked events or they expire",
                self.limits.max_parked_bytes
            )
        };
        tracing::warn!(
            max_parked = self.limits.max_parked,
            max_parked_bytes = self.limits.max_parked_bytes,
            "an event was refused: the parked events are at a limit"
        );
        if let Some(o) = sm4c_host::metrics::observer() {
            o.event_refused("parkedLimit");
        }
        Err(HostError::ParkedLimit(why))
    }

    /// Unfinished instances with an event definition that matches the event.
    fn candidates(&mut self, event: &Value, from: Option<&str>) -> Vec<String> {
        let defs: Vec<(String, String)> = {
            let reg = self.registry.read().unwrap_or_else(|p| p.into_inner());
            reg.all()
                .iter()
                .filter(|m| driver::may_accept(m, event))
                .map(|m| (m.id.clone(), m.version.clone()))
                .collect()
        };
        if defs.is_empty() {
            return Vec::new();
        }
        let mut ids: Vec<String> = self.store.active(&defs).unwrap_or_default();
        for (id, slot) in &self.cache {
            let snap = slot.h.inst.snapshot();
            if !snap.status.is_final()
                && defs.iter().any(|(d, v)| *d == snap.definition && *v == snap.version)
                && !ids.contains(id)
            {
                ids.push(id.clone());
            }
        }
        ids.retain(|id| Some(id.as_str()) != from);
        ids.into_iter().filter(|id| self.accepts(id, event)).collect()
    }

    fn accepts(&mut self, id: &str, event: &Value) -> bool {
        self.slot(id).is_some_and(|s| driver::accepts(&s.h.inst, event))
    }

    /// Hands parked events to instances that now wait for them.
    fn unpark_for_waiting(&mut self) {
        if self.parked_count == 0 {
            return;
        }
        let waiting: Vec<String> = self
            .cache
            .iter()
            .filter(|(_, s)| s.h.inst.status() == Status::Waiting && !s.was_waiting)
            .map(|(id, _)| id.clone())
            .collect();
        if waiting.is_empty() {
            return;
        }
        // Only the parked events of the types these instances wait for are read.
        let types = self.awaited_types(&waiting);
        let parked = self.store.parked_of(now_ms(), types.as_ref()).unwrap_or_default();
        for (seq, event) in parked {
            if let Some(id) = waiting.iter().find(|id| self.accepts(id, &event)).cloned() {
                self.batch.unparked.push(seq);
                self.parked_count = self.parked_count.saturating_sub(1);
                self.parked_bytes = self.parked_bytes.saturating_sub(crate::store::parked_size(&event));
                self.queue.push((id, Input::Event { event }));
            }
        }
    }

    /// The CloudEvent types the instances `ids` have event definitions for; `None` when one of
    /// them takes events of any type (a definition with a `source` and no `type`).
    fn awaited_types(&mut self, ids: &[String]) -> Option<BTreeSet<String>> {
        let mut types = BTreeSet::new();
        for id in ids {
            let Some(slot) = self.cache.get(id) else { continue };
            for def in &slot.h.inst.machine().events {
                match (&def.event_type, &def.source) {
                    (Some(t), _) => types.insert(t.clone()),
                    (None, None) => types.insert(def.name.clone()),
                    (None, Some(_)) => return None,
                };
            }
        }
        Some(types)
    }

    /// Commits the batch of `inputs` inputs in one transaction.
    fn commit(&mut self, inputs: usize) -> Result<(), StoreError> {
        self.write_schedules();
        let mut batch = std::mem::take(&mut self.batch);
        for (_, slot) in self.cache.iter_mut().filter(|(_, s)| s.dirty) {
            let h = &mut slot.h;
            h.journal_len += h.pending.len() as i64;
            batch.instances.push(InstanceWrite {
                snapshot: h.inst.snapshot().clone(),
                parent: h.parent.clone(),
                entries: std::mem::take(&mut h.pending),
                calls: h.open.clone(),
                origin: h.origin.clone(),
            });
        }
        let started = std::time::Instant::now();
        self.store.commit(&batch)?;
        self.schedules_written();
        self.results.clear();
        self.carried.clone_from(&self.queue);
        if self.backoff.take().is_some() {
            tracing::info!("the store takes writes again");
        }
        if let Some(o) = sm4c_host::metrics::observer() {
            o.store_commit(started.elapsed().as_secs_f64(), inputs);
        }
        // Waiting instances hold no memory: keep nothing past the batch.
        self.cache.clear();
        for reply in std::mem::take(&mut self.replies) {
            reply(Ok(()));
        }
        // Their starts are committed now (they were first in the batch).
        for (task, poller) in std::mem::take(&mut self.handouts) {
            if let Err(json) = poller.reply.send(task.to_json()) {
                drop(json);
                // The worker left before it got the task: the next one gets it.
                if let Some((t, p)) = self.tasks.offer(task, true) {
                    self.hand_out(t, p);
                }
            }
        }
        let work = std::mem::take(&mut self.after);
        for (inst, w) in work {
            self.perform(&inst, w);
        }
        Ok(())
    }

    /// Gives a task to a worker: its start goes first into the next batch, and the worker gets the
    /// task once that batch is committed.
    fn hand_out(&mut self, task: Task, poller: Poller) {
        if let Some((list, scheduled, taken)) = self.task_times.get_mut(&(task.instance.clone(), task.op.clone())) {
            if taken.is_none() {
                let now = Instant::now();
                *taken = Some(now);
                if let Some(o) = sm4c_host::metrics::observer() {
                    o.task_started(list, now.duration_since(*scheduled).as_secs_f64());
                }
            }
        }
        let input = Input::TaskStarted {
            op: task.op.clone(),
            worker: poller.worker.clone(),
        };
        self.queue.insert(0, (task.instance.clone(), input));
        self.handouts.push((task, poller));
    }

    fn perform(&mut self, id: &str, work: Work) {
        match work {
            // Workers take it from its task list; nothing is called.
            Work::Task { task, .. } => {
                self.task_times.insert(
                    (task.instance.clone(), task.op.clone()),
                    (task.task_list.clone(), Instant::now(), None),
                );
                if let Some((t, p)) = self.tasks.offer(task, false) {
                    self.hand_out(t, p);
                }
            }
            Work::Call { call, .. } => {
                let key = (call.instance.clone(), call.op.clone());
                let task = sm4c_host::spawn_call(&self.host, call, self.tx.clone(), |instance, op, result| {
                    Cmd::Result { instance, op, result }
                });
                self.in_flight.insert(key, task);
            }
            Work::StartChild(start) => {
                let exists =
                    self.cache.contains_key(&start.id) || self.store.instance(&start.id).ok().flatten().is_some();
                if !exists {
                    let machine = self
                        .registry
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&start.definition, None);
                    // A subflow's steps link to the origin of the instance that started it.
                    let origin = self.cache.get(id).and_then(|s| s.h.origin.clone());
                    match self.driver.child(&start, machine) {
                        Ok(mut child) => {
                            child.origin = origin;
                            self.cache.insert(
                                start.id.clone(),
                                Slot {
                                    h: child,
                                    dirty: true,
                                    was_waiting: false,
                                },
                            );
                            self.queue.push((
                                start.id.clone(),
                                Input::Start {
                                    data: start.input,
                                    scheduled: None,
                                },
                            ));
                        }
                        Err(notify) => self.queue.extend(notify.map(|n| (n.instance, n.input))),
                    }
                }
                // Started: a parent that does not wait no longer needs to remember to start it.
                if let Some(slot) = self.slot(id) {
                    slot.h.child_started(&start.parent.op);
                    slot.dirty = true;
                }
            }
            Work::Send { event, .. } => {
                let host = self.host.clone();
                tokio::spawn(async move {
                    let _ = host.send_event(event).await;
                });
            }
            Work::ArmTimer { timer, due } => {
                self.timers.insert((due, id.to_string(), timer));
            }
            Work::CancelTimer { timer, due } => match due {
                Some(due) => {
                    self.timers.remove(&(due, id.to_string(), timer));
                }
                None => self.timers.retain(|(_, i, t)| !(i == id && *t == timer)),
            },
            Work::Stop { op, child } => {
                if let Some(task) = self.in_flight.remove(&(id.to_string(), op.clone())) {
                    task.abort();
                }
                self.tasks.remove(id, &op);
                self.task_times.remove(&(id.to_string(), op.clone()));
                let running = match self.cache.get(&child) {
                    Some(s) => !s.h.inst.status().is_final(),
                    None => self
                        .store
                        .instance(&child)
                        .ok()
                        .flatten()
                        .is_some_and(|s| !s.snapshot.status.is_final()),
                };
                if running {
                    self.queue.push((
                        child,
                        Input::Cancel {
                            reason: Some("the parent no longer waits".into()),
                        },
                    ));
                }
            }
        }
    }

    fn create(&mut self, id: &str, m: Arc<Machine>, origin: Option<String>) {
        let mut h = self.driver.create(m, id);
        h.origin = origin;
        self.cache.insert(
            id.to_string(),
            Slot {
                h,
                dirty: true,
                was_waiting: false,
            },
        );
    }

    fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Define(doc, reply) => {
                let _ = reply.send(self.define(doc));
            }
            Cmd::Start {
                definition,
                version,
                id,
                input,
                origin,
                reply,
            } => {
                let m = self
                    .registry
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&definition, version.as_deref());
                let Some(m) = m else {
                    let what = match version {
                        Some(v) => format!("{definition} version {v}"),
                        None => definition,
                    };
                    let _ = reply.send(Err(HostError::UnknownDefinition(what)));
                    return;
                };
                let id = id.unwrap_or_else(|| new_id(&m.id));
                match self.store.instance(&id) {
                    Ok(Some(_)) => {
                        let _ = reply.send(Ok((id, false)));
                    }
                    _ if self.cache.contains_key(&id) => {
                        let _ = reply.send(Ok((id, false)));
                    }
                    Ok(None) => {
                        self.create(&id, m, origin);
                        self.queue.push((
                            id.clone(),
                            Input::Start {
                                data: input,
                                scheduled: None,
                            },
                        ));
                        // Starting is acknowledged once its first step is committed.
                        self.replies.push(Box::new(move |r| {
                            let _ = reply.send(r.map(|()| (id, true)));
                        }));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e.into()));
                    }
                }
            }
            Cmd::Event(event, reply) => match self.route(event, None) {
                Ok(delivery) => self.replies.push(Box::new(move |r| {
                    let _ = reply.send(r.map(|()| delivery));
                })),
                // Nothing of a refused event is in the batch: answered at once.
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Cmd::Cancel(id, reply) => match self.slot(&id).map(|s| s.h.inst.status()) {
                None => {
                    let _ = reply.send(Err(HostError::UnknownInstance(id)));
                }
                Some(s) if s.is_final() => {
                    let _ = reply.send(Err(HostError::Ended(id)));
                }
                Some(_) => {
                    self.queue.push((
                        id,
                        Input::Cancel {
                            reason: Some("cancelled through the API".into()),
                        },
                    ));
                    self.replies.push(Box::new(move |r| {
                        let _ = reply.send(r);
                    }));
                }
            },
            Cmd::Resume(id, step, reply) => match self.slot(&id).map(|s| s.h.inst.status()) {
                None => {
                    let _ = reply.send(Err(HostError::UnknownInstance(id)));
                }
                Some(s) if s != Status::Paused => {
                    let _ = reply.send(Err(HostError::NotPaused(id)));
                }
                Some(_) => {
                    self.queue.push((id, Input::Resume { step }));
                    self.replies.push(Box::new(move |r| {
                        let _ = reply.send(r);
                    }));
                }
            },
            Cmd::Migrate {
                id,
                version,
                states,
                dry_run,
                reply,
            } => match self.migrate(&id, &version, &states, dry_run) {
                Ok(plan) if dry_run => {
                    let _ = reply.send(Ok(plan));
                }
                // Answered once the move is committed.
                Ok(plan) => self.replies.push(Box::new(move |r| {
                    let _ = reply.send(r.map(|()| plan));
                })),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Cmd::Redrive {
                id,
                update,
                dry_run,
                reply,
            } => match self.redrive(&id, update.as_deref(), dry_run) {
                Ok(answer) if dry_run => {
                    let _ = reply.send(Ok(answer));
                }
                // Answered once the redrive is committed.
                Ok(answer) => self.replies.push(Box::new(move |r| {
                    let _ = reply.send(r.map(|()| answer));
                })),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Cmd::Result { instance, op, result } => {
                // A call that was stopped meanwhile is not in flight any more: its result is moot.
                if let Some(handle) = self.in_flight.remove(&(instance.clone(), op.clone())) {
                    self.results
                        .push((handle, instance.clone(), op.clone(), result.clone()));
                    let driver = self.driver.clone();
                    if let Some(slot) = self.slot(&instance) {
                        // The call is done, so it is no longer open, whether or not anyone waits.
                        slot.dirty = true;
                        if let Some(input) = driver.call_done(&mut slot.h, &op, result) {
                            self.queue.push((instance, input));
                        }
                    }
                }
            }
            Cmd::Poll {
                list,
                worker,
                deadline,
                reply,
            } => {
                if self.closing {
                    return; // dropped: the worker is told there is no task
                }
                let poller = Poller {
                    worker,
                    deadline,
                    reply,
                };
                if let Some((task, poller)) = self.tasks.poll(&list, poller, tokio::time::Instant::now()) {
                    self.hand_out(task, poller);
                }
            }
            Cmd::Answer {
                instance,
                op,
                answer,
                reply,
            } => self.answer(instance, op, answer, reply),
            Cmd::TaskLists(reply) => {
                let known: Vec<String> = self
                    .registry
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .all()
                    .iter()
                    .flat_map(|m| {
                        m.functions
                            .iter()
                            .filter(|f| matches!(f.kind, sm4c_runtime::model::FunctionKind::Worker(_)))
                            .map(|f| f.operation.clone())
                            .collect::<Vec<_>>()
                    })
                    .collect();
                let lists = self
                    .tasks
                    .summary(known.iter().map(String::as_str))
                    .into_iter()
                    .map(|(name, (queued, polling))| json!({"name": name, "queued": queued, "polling": polling}))
                    .collect();
                let _ = reply.send(lists);
            }
            Cmd::Schedule(op, reply) => {
                let read = matches!(
                    op,
                    sm4c_host::service::ScheduleOp::Get(_) | sm4c_host::service::ScheduleOp::List
                );
                match self.schedule_op(op) {
                    // A change is answered once it is written.
                    Ok(v) if !read => self.replies.push(Box::new(move |r| {
                        let _ = reply.send(r.map(|()| v));
                    })),
                    answer => drop(reply.send(answer)),
                }
            }
            Cmd::ClosePolls => {
                self.closing = true;
                self.tasks.release_pollers();
            }
            Cmd::Shutdown(_) => {}
        }
    }

    /// A worker's answer: a task the instance still waits for is answered once the step is
    /// committed; a closed task refuses completion and failure, and asks a heartbeating worker to stop.
    fn answer(
        &mut self,
        instance: String,
        op: String,
        answer: Answer,
        reply: oneshot::Sender<Result<Answered, HostError>>,
    ) {
        let driver = self.driver.clone();
        let Some(slot) = self.slot(&instance) else {
            let _ = reply.send(Err(HostError::UnknownTask(format!(
                "no task: the token names instance {instance:?}, which does not exist"
            ))));
            return;
        };
        let heartbeat = matches!(answer, Answer::Heartbeat(_));
        let completed = matches!(answer, Answer::Complete(_));
        let input = match driver.answer(&mut slot.h, &op, answer) {
            Answering::Closed => {
                let _ = reply.send(if heartbeat {
                    Ok(Answered {
                        instance,
                        op,
                        cancel_requested: true,
                    })
                } else {
                    Err(HostError::TaskClosed { instance, op })
                });
                return;
            }
            Answering::Open { input } => input,
        };
        if !heartbeat {
            // Closed from now on: a second answer in the same batch is refused.
            slot.dirty = true;
            if let Some((list, _, Some(taken))) = self.task_times.remove(&(instance.clone(), op.clone())) {
                if let Some(o) = sm4c_host::metrics::observer() {
                    let outcome = if completed { "completed" } else { "failed" };
                    o.task_closed(&list, outcome, taken.elapsed().as_secs_f64());
                }
            }
        }
        // The worker has the task, whatever the list says (it may have been queued again after a restart).
        self.tasks.remove(&instance, &op);
        self.queue.extend(input.map(|i| (instance.clone(), i)));
        self.replies.push(Box::new(move |r| {
            let _ = reply.send(r.map(|()| Answered {
                instance,
                op,
                cancel_requested: false,
            }));
        }));
    }

    fn define(&mut self, doc: Value) -> Result<(Arc<Machine>, bool), HostError> {
        let options = LoadOptions {
            limits: self.limits.expression,
        };
        let m = load(&doc, &mut sm4c_runtime::no_files, options).map_err(HostError::Invalid)?;
        let refused = self.host.check_definition(&m);
        if !refused.is_empty() {
            return Err(HostError::Invalid(refused));
        }
        let created = self.store.put_definition(&m.id, &m.version, &doc)?;
        let m = Arc::new(m);
        if created || self.machine(&m.id, &m.version).is_none() {
            self.registry
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(m.clone());
        }
        Ok((m, created))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use sm4c_host::{BoxFuture, FunctionCall};

    struct Echo;
    impl Functions for Echo {
        fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
            Box::pin(async move { Ok(json!({"echo": call.arguments, "op": call.op})) })
        }
    }

    fn start(limits: Limits) -> (DurableHost, Arc<MemoryStore>) {
        let store = Arc::new(MemoryStore::default());
        let host = DurableHost::start(store.clone(), Arc::new(Echo), limits).expect("starts");
        (host, store)
    }

    async fn settle(h: &DurableHost, id: &str) -> sm4c_runtime::Snapshot {
        for _ in 0..200 {
            let s = h.store().instance(id).unwrap().unwrap().snapshot;
            if s.status.is_final() {
                return s;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        h.store().instance(id).unwrap().unwrap().snapshot
    }

    fn waiter() -> Value {
        json!({"id": "w", "name": "w", "version": "1",
            "events": [{"name": "go", "type": "go", "correlation": [{"contextAttributeName": "orderId", "contextAttributeValue": "${ .order }"}]}],
            "states": [{"name": "Wait", "start": true, "transitions": [
                {"nextState": "Done", "eventGroups": [{"events": ["go"], "resultHandler": "${ .got = ($value | .data) }"}]}]},
                {"name": "Done"}]})
    }

    fn go(order: &str) -> Value {
        json!({"specversion": "1.0", "id": format!("e-{order}"), "source": "t", "type": "go", "orderid": order, "data": order})
    }

    #[tokio::test]
    async fn parked_events_stop_at_the_count_and_bytes_limits_and_a_refused_event_is_not_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(crate::store::SqliteStore::open(&dir.path().join("s.db")).expect("open"));
        let limits = Limits {
            max_parked: 2,
            ..Limits::default()
        };
        let h = DurableHost::start(store.clone(), Arc::new(Echo), limits).expect("starts");
        h.define(waiter()).await.unwrap();
        assert!(h.deliver(go("A")).await.unwrap().parked);
        assert!(h.deliver(go("B")).await.unwrap().parked);
        match h.deliver(go("C")).await {
            Err(HostError::ParkedLimit(why)) => {
                assert!(
                    why.contains("2 events are parked") && why.contains("--max-parked"),
                    "{why}"
                )
            }
            other => panic!("the third event is refused, not {other:?}"),
        }
        assert_eq!(store.parked_totals(0).unwrap().0, 2, "the refused event was not kept");
        // An instance takes a parked event: there is room again, and nothing parked was lost.
        h.start_instance("w", None, Some("a".into()), json!({"order": "A"}))
            .await
            .unwrap();
        assert_eq!(settle(&h, "a").await.status, Status::Completed, "A was still parked");
        assert!(h.deliver(go("C")).await.unwrap().parked, "room for C once A was taken");
        let ids: Vec<String> = store
            .parked(0)
            .unwrap()
            .iter()
            .map(|(_, e)| e["orderid"].as_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(ids, ["B", "C"]);
        // Events sent to an instance are never refused.
        h.start_instance("w", None, Some("d".into()), json!({"order": "D"}))
            .await
            .unwrap();
        let d = h.deliver(go("D")).await.unwrap();
        assert_eq!(d.reached, ["d"]);
        h.shutdown().await;

        // The bytes limit: room for one event of this size, not two.
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(crate::store::SqliteStore::open(&dir.path().join("s.db")).expect("open"));
        let size = crate::store::parked_size(&go("A"));
        let limits = Limits {
            max_parked_bytes: size + size / 2,
            ..Limits::default()
        };
        let h = DurableHost::start(store.clone(), Arc::new(Echo), limits).expect("starts");
        h.define(waiter()).await.unwrap();
        assert!(h.deliver(go("A")).await.unwrap().parked);
        match h.deliver(go("B")).await {
            Err(HostError::ParkedLimit(why)) => assert!(why.contains("--max-parked-bytes"), "{why}"),
            other => panic!("the second event is refused, not {other:?}"),
        }
        assert_eq!(store.parked_totals(0).unwrap(), (1, size));
        h.shutdown().await;
        // After a restart the limit counts what the file holds.
        let h = DurableHost::start(store.clone(), Arc::new(Echo), limits).expect("starts again");
        assert!(matches!(h.deliver(go("B")).await, Err(HostError::ParkedLimit(_))));
        h.shutdown().await;
    }

    #[tokio::test]
    async fn events_reach_correlated_instances_and_early_events_wait_in_the_window() {
        let (h, _) = start(Limits::default());
        h.define(waiter()).await.unwrap();
        // Sent before any instance waits: parked.
        let d = h.deliver(go("B")).await.unwrap();
        assert_eq!(
            d,
            Delivery {
                reached: vec![],
                parked: true,
                cancel_requested: None,
            }
        );
        h.start_instance("w", None, Some("a".into()), json!({"order": "A"}))
            .await
            .unwrap();
        h.start_instance("w", None, Some("b".into()), json!({"order": "B"}))
            .await
            .unwrap();
        assert_eq!(
            settle(&h, "b").await.status,
            Status::Completed,
            "the parked event reached b"
        );
        let d = h.deliver(go("A")).await.unwrap();
        assert_eq!(d.reached, vec!["a".to_string()], "correlation picks a only");
        let a = settle(&h, "a").await;
        assert_eq!(a.status, Status::Completed);
        assert_eq!(sm4c_runtime::json::from_val(&a.data.0)["got"], "A");
    }

    #[tokio::test]
    async fn journal_limit_fails_the_instance_with_a_clear_error() {
        let (h, _) = start(Limits {
            max_journal: 20,
            ..Limits::default()
        });
        h.define(json!({"id": "loop", "name": "loop", "version": "1", "states": [{"name": "A", "start": true,
            "transitions": [{"condition": "${ .n < 100 }", "action": {"type": "delay", "timeout": "1ms"}, "resultHandler": "${ .n += 1 }"},
                            {"nextState": "B"}]}, {"name": "B"}]}))
            .await
            .unwrap();
        h.start_instance("loop", None, Some("l".into()), json!({"n": 0}))
            .await
            .unwrap();
        let s = settle(&h, "l").await;
        assert_eq!(s.status, Status::Failed);
        let e = s.error.unwrap();
        assert_eq!(e.kind, "limitExceeded");
        assert!(e.message.contains("20 entries"), "{}", e.message);
    }

    #[tokio::test]
    async fn subflows_are_linked_in_both_journals_and_calls_carry_their_op() {
        let (h, store) = start(Limits::default());
        h.define(json!({"id": "child", "name": "c", "version": "1",
            "functions": [{"name": "f", "operation": "x#f"}],
            "states": [{"name": "C", "start": true, "enterAction": {"type": "invokeFunction", "functionName": "f",
                "arguments": {"n": "${ .n }"}, "waitForCompletion": true}, "enterResultHandler": "${ .r = $value }"}]}))
            .await
            .unwrap();
        h.define(json!({"id": "parent", "name": "p", "version": "1", "states": [{"name": "P", "start": true,
            "enterAction": {"type": "invokeSubflow", "subflowName": "child", "arguments": {"n": 7}, "waitForCompletion": true},
            "enterResultHandler": "${ .child = $value }"}]}))
            .await
            .unwrap();
        let (id, created) = h
            .start_instance("parent", None, Some("p".into()), json!({}))
            .await
            .unwrap();
        assert!(created);
        let p = settle(&h, &id).await;
        assert_eq!(p.status, Status::Completed);
        let data = sm4c_runtime::json::from_val(&p.data.0);
        assert_eq!(data["child"]["r"], json!({"echo": {"n": 7}, "op": "1.enter"}));
        let child = store.instance("p/1.enter").unwrap().expect("child stored");
        assert_eq!(
            child.parent,
            Some(ParentLink::from(("p".to_string(), "1.enter".to_string(), true)))
        );
        let parent_journal = store.history("p", 0, 1000).unwrap();
        assert!(parent_journal.iter().any(
            |(_, e)| matches!(e, Entry::Effect(Effect::StartSubflow { definition, .. }) if definition == "child")
        ));
        // The same id again starts nothing new.
        let (_, created) = h
            .start_instance("parent", None, Some("p".into()), json!({}))
            .await
            .unwrap();
        assert!(!created);
    }

    #[tokio::test]
    async fn definitions_are_versioned_and_conflicts_refused() {
        let (h, _) = start(Limits::default());
        let mut d = waiter();
        assert!(h.define(d.clone()).await.unwrap().1);
        assert!(!h.define(d.clone()).await.unwrap().1, "same content again is not new");
        d["states"][0]["name"] = json!("Waiting");
        d["states"][0]["start"] = json!(true);
        assert!(matches!(h.define(d.clone()).await, Err(HostError::Conflict { .. })));
        d["version"] = json!("2");
        assert!(h.define(d).await.unwrap().1);
        let (id, _) = h
            .start_instance("w", Some("1"), None, json!({"order": "X"}))
            .await
            .unwrap();
        assert_eq!(h.store().instance(&id).unwrap().unwrap().snapshot.version, "1");
        let (id2, _) = h.start_instance("w", None, None, json!({"order": "X"})).await.unwrap();
        assert_eq!(
            h.store().instance(&id2).unwrap().unwrap().snapshot.version,
            "2",
            "newest by default"
        );
    }
}
