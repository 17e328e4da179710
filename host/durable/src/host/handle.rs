//! The handle to the durable host: [`DurableHost`], which whoever serves the host (the HTTP API,
//! `sm4c run`, the batches) holds. [`DurableHost::start`] opens the store, recovers, and spawns the
//! deciding task ([`Loop::run`](super::Loop)); every request after that is a [`Cmd`] sent to it and
//! answered on a oneshot channel once the batch that decides it is committed. Reads (the store, the
//! registry, the breakpoints) do not go through the task.

use super::{Cmd, HostLimits, Loop};
use crate::store::{Batch, Store};
use serde_json::Value;
use sm4c_host::driver::{self, Driver};
use sm4c_host::service::{Answered, Delivery, HostError, Registry};
use sm4c_host::tasks::{decode_token, Answer, TaskLists};
use sm4c_host::Functions;
use sm4c_runtime::engine::migrate::MigrationPlan;
use sm4c_runtime::{load, LoadOptions, Machine};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use tokio::sync::{mpsc, oneshot};

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

impl DurableHost {
    /// Opens the host on a store: loads definitions, timers and calls in flight, checks every
    /// unfinished instance's journal against its definition, and starts the deciding task.
    ///
    /// A stored definition that cannot be read back (or no longer loads) does not stop the start:
    /// it is logged, counted (`corrupt_record("definition")`) and left out, and its unfinished
    /// instances are failed with `corruptRecord` naming it; the other definitions are served.
    pub fn start(
        store: Arc<dyn Store>,
        host: Arc<dyn Functions>,
        limits: HostLimits,
    ) -> Result<DurableHost, HostError> {
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
