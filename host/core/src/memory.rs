//! The in-memory host: runs instances in-process on tokio, with a real or a virtual clock.
//!
//! One task owns every instance and handles one input at a time, so instances need no locks and
//! runs are reproducible. Function calls run as their own tasks and report back. With the
//! virtual clock, whenever nothing is left to do but wait for timers, time jumps to the next one.

use crate::driver::{self, Driver, Hosted, Limits, Work};
use crate::functions::Functions;
use serde_json::Value;
use sm4c_runtime::engine::Scheduled;
use sm4c_runtime::{Entry, ErrorInfo, ErrorKind, Input, Machine, Millis, Options, Status, Timed, Trace};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

/// Where time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The system clock; timers wait for real.
    Real,
    /// Time starts at `start` (ms since the epoch) and jumps to the next timer whenever
    /// nothing else can happen.
    Virtual {
        /// Start time, ms since the epoch.
        start: Millis,
    },
}

/// Receives the readable steps of every instance (for `sm4c run -v`).
pub type TraceSink = Arc<dyn Fn(&str, &Trace) + Send + Sync>;

/// Settings of an [`InMemoryHost`].
#[derive(Clone)]
pub struct Config {
    /// Where time comes from.
    pub clock: Clock,
    /// Engine settings for every instance.
    pub options: Options,
    /// Receives trace steps (enable [`Options::trace`] too).
    pub trace: Option<TraceSink>,
    /// The journal limit (when journaling) and how deep subflows nest.
    pub limits: Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            clock: Clock::Real,
            options: Options {
                journal: false,
                ..Options::default()
            },
            trace: None,
            limits: Limits::default(),
        }
    }
}

/// How an instance stands.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Instance id.
    pub id: String,
    /// Status.
    pub status: Status,
    /// Current state, if any.
    pub state: Option<String>,
    /// Global data (the output once completed).
    pub data: Value,
    /// The error, for failed, cancelled and timed-out instances.
    pub error: Option<ErrorInfo>,
    /// The journal (when journaling is on).
    pub journal: Vec<Entry>,
    /// Timers the instance still has.
    pub pending_timers: usize,
}

/// Runs state machine instances in-process.
///
/// ```
/// use sm4c_host::{BoxFuture, Clock, Config, FunctionCall, Functions, InMemoryHost};
/// use sm4c_runtime::{load, no_files, ErrorInfo, LoadOptions, Status};
/// use serde_json::{json, Value};
/// use std::sync::Arc;
///
/// // Functions are plain Rust closures behind the Functions trait.
/// struct Greeter;
/// impl Functions for Greeter {
///     fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
///         Box::pin(async move {
///             let name = call.arguments["name"].as_str().unwrap_or("stranger").to_string();
///             Ok(json!(format!("Hello, {name}!")))
///         })
///     }
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let definition = json!({
///     "id": "greeting", "name": "Greeting", "version": "1.0",
///     "functions": [{"name": "greet", "operation": "https://example.org/api.json#greet"}],
///     "states": [{
///         "name": "Greet", "start": true,
///         "enterAction": {"type": "invokeFunction", "functionName": "greet",
///                         "arguments": {"name": "${ .person.name }"}, "waitForCompletion": true},
///         "enterResultHandler": "${ .greeting = $value }"
///     }]
/// });
/// let machine = Arc::new(load(&definition, &mut no_files, LoadOptions::default()).unwrap());
/// let host = InMemoryHost::new(Arc::new(Greeter), Config { clock: Clock::Virtual { start: 0 }, ..Config::default() });
/// let id = host.start(machine, json!({"person": {"name": "Ada"}})).await;
/// let outcome = host.outcome(&id).await;
/// assert_eq!(outcome.status, Status::Completed);
/// assert_eq!(outcome.data["greeting"], "Hello, Ada!");
/// # });
/// ```
#[derive(Clone)]
pub struct InMemoryHost {
    tx: mpsc::UnboundedSender<Cmd>,
}

enum Cmd {
    Start {
        machine: Arc<Machine>,
        id: Option<String>,
        input: Value,
        events: Vec<Value>,
        scheduled: Option<Scheduled>,
        reply: oneshot::Sender<String>,
    },
    Event(Value),
    Cancel(String),
    Result {
        instance: String,
        op: String,
        result: Result<Value, ErrorInfo>,
    },
    Watch {
        id: String,
        until_idle: bool,
        reply: oneshot::Sender<Outcome>,
    },
}

impl InMemoryHost {
    /// Starts the host's task on the current tokio runtime.
    pub fn new(host: Arc<dyn Functions>, config: Config) -> InMemoryHost {
        let (tx, rx) = mpsc::unbounded_channel();
        let now = match config.clock {
            Clock::Virtual { start } => start,
            Clock::Real => wall_clock(),
        };
        let lp = Loop {
            host,
            driver: Driver {
                options: config.options,
                limits: config.limits,
                // Its functions do the work of worker tasks too: nothing is bound to task lists.
                task_lists: None,
                // No crash to recover from: a call is made once either way.
                at_most_once: None,
            },
            config,
            tx: tx.downgrade(),
            vnow: now,
            instances: HashMap::new(),
            timers: BTreeSet::new(),
            seq: 0,
            queue: VecDeque::new(),
            in_flight: HashMap::new(),
            watchers: Vec::new(),
            counter: 0,
            virtual_jumps: 0,
        };
        tokio::spawn(lp.run(rx));
        InMemoryHost { tx }
    }

    /// Starts an instance with a generated id and returns the id.
    pub async fn start(&self, machine: Arc<Machine>, input: Value) -> String {
        self.start_with(machine, None, input, Vec::new()).await
    }

    /// Starts an instance with an optional id and events placed in its inbox before the first state runs.
    pub async fn start_with(
        &self,
        machine: Arc<Machine>,
        id: Option<String>,
        input: Value,
        events: Vec<Value>,
    ) -> String {
        self.start_scheduled(machine, id, input, events, None).await
    }

    /// [`InMemoryHost::start_with`], as a schedule starts a run: `scheduled` names the schedule
    /// and the run's nominal time, which the instance reads (the jq function `schedule`).
    pub async fn start_scheduled(
        &self,
        machine: Arc<Machine>,
        id: Option<String>,
        input: Value,
        events: Vec<Value>,
        scheduled: Option<Scheduled>,
    ) -> String {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(Cmd::Start {
            machine,
            id,
            input,
            events,
            scheduled,
            reply,
        });
        rx.await.unwrap_or_default()
    }

    /// Delivers a CloudEvent (JSON structured form): to the instance named by `sm4cinstanceid`,
    /// else to every instance that has not ended.
    pub fn deliver_event(&self, event: Value) {
        let _ = self.tx.send(Cmd::Event(event));
    }

    /// Cancels an instance.
    pub fn cancel(&self, id: &str) {
        let _ = self.tx.send(Cmd::Cancel(id.to_string()));
    }

    /// Waits until the instance has ended.
    pub async fn outcome(&self, id: &str) -> Outcome {
        self.watch(id, false).await
    }

    /// Waits until the instance has ended, or until nothing more can happen without outside input
    /// (no timers, no calls in flight): then the instance is returned as it stands.
    pub async fn settle(&self, id: &str) -> Outcome {
        self.watch(id, true).await
    }

    async fn watch(&self, id: &str, until_idle: bool) -> Outcome {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(Cmd::Watch {
            id: id.to_string(),
            until_idle,
            reply,
        });
        rx.await.unwrap_or_else(|_| Outcome {
            id: id.to_string(),
            status: Status::Failed,
            state: None,
            data: Value::Null,
            error: Some(ErrorInfo::new(ErrorKind::HostError, "the in-memory host has stopped")),
            journal: Vec::new(),
            pending_timers: 0,
        })
    }
}

use crate::clock::wall_ms as wall_clock;

/// Jumps of the virtual clock after which the host stops firing timers (an endless timer loop).
pub const MAX_VIRTUAL_JUMPS: u64 = 1_000_000;

struct Loop {
    host: Arc<dyn Functions>,
    config: Config,
    driver: Driver,
    tx: mpsc::WeakUnboundedSender<Cmd>,
    vnow: Millis,
    instances: HashMap<String, Hosted>,
    /// (due, seq, instance, timer)
    timers: BTreeSet<(Millis, u64, String, String)>,
    seq: u64,
    queue: VecDeque<(String, Input)>,
    /// Calls in flight: (instance, op) -> task.
    in_flight: HashMap<(String, String), AbortHandle>,
    watchers: Vec<(String, bool, oneshot::Sender<Outcome>)>,
    counter: u64,
    /// Times the virtual clock jumped to a timer.
    virtual_jumps: u64,
}

impl Loop {
    fn now(&self) -> Millis {
        match self.config.clock {
            Clock::Virtual { .. } => self.vnow,
            Clock::Real => wall_clock(),
        }
    }

    /// Whether something is still owed to an instance that waits for it: a call it waits for.
    fn awaiting_calls(&self) -> bool {
        self.in_flight.keys().any(|(id, op)| {
            self.instances
                .get(id)
                .and_then(|h| h.open_op(op))
                .is_some_and(crate::driver::waits)
        })
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        loop {
            while let Some((id, input)) = self.queue.pop_front() {
                self.process(&id, input).await;
            }
            match rx.try_recv() {
                Ok(cmd) => {
                    self.command(cmd);
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => return,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            let next_due = self.timers.iter().next().map(|(due, ..)| *due);
            let awaiting = self.awaiting_calls();
            if !awaiting && next_due.is_none() {
                self.resolve_idle_watchers();
            }
            match (self.config.clock, next_due) {
                (Clock::Virtual { .. }, Some(due)) if !awaiting => {
                    if self.virtual_jumps >= MAX_VIRTUAL_JUMPS {
                        // An endless timer loop: report the instances as they stand instead of spinning.
                        self.timers.clear();
                        continue;
                    }
                    self.virtual_jumps += 1;
                    self.vnow = self.vnow.max(due);
                    self.fire_due();
                }
                (Clock::Real, Some(due)) => {
                    let wait = (due - wall_clock()).max(0) as u64;
                    tokio::select! {
                        cmd = rx.recv() => match cmd {
                            Some(cmd) => self.command(cmd),
                            None => return,
                        },
                        _ = tokio::time::sleep(std::time::Duration::from_millis(wait)) => self.fire_due(),
                    }
                }
                _ => match rx.recv().await {
                    Some(cmd) => self.command(cmd),
                    None => return,
                },
            }
        }
    }

    fn fire_due(&mut self) {
        let now = self.now();
        while let Some(first) = self.timers.first().cloned() {
            if first.0 > now {
                break;
            }
            self.timers.remove(&first);
            let (_, _, inst, timer) = first;
            self.queue.push_back((inst, Input::TimerFired { timer }));
        }
    }

    fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Start {
                machine,
                id,
                input,
                events,
                scheduled,
                reply,
            } => {
                let id = id.unwrap_or_else(|| {
                    self.counter += 1;
                    format!("{}-{}", machine.id, self.counter)
                });
                if !self.instances.contains_key(&id) {
                    self.instances.insert(id.clone(), self.driver.create(machine, &id));
                    for e in events {
                        self.queue.push_back((id.clone(), Input::Event { event: e }));
                    }
                    self.queue
                        .push_back((id.clone(), Input::Start { data: input, scheduled }));
                }
                let _ = reply.send(id);
            }
            Cmd::Event(event) => self.broadcast(event, None),
            Cmd::Cancel(id) => self.queue.push_back((id, Input::Cancel { reason: None })),
            Cmd::Result { instance, op, result } => {
                self.in_flight.remove(&(instance.clone(), op.clone()));
                if let Some(h) = self.instances.get_mut(&instance) {
                    if let Some(input) = self.driver.call_done(h, &op, result) {
                        self.queue.push_back((instance, input));
                    }
                }
            }
            Cmd::Watch { id, until_idle, reply } => match self.instances.get(&id) {
                Some(h) if h.inst.status().is_final() => {
                    let _ = reply.send(outcome(h));
                }
                Some(_) => self.watchers.push((id, until_idle, reply)),
                None => {
                    let _ = reply.send(Outcome {
                        id: id.clone(),
                        status: Status::Failed,
                        state: None,
                        data: Value::Null,
                        error: Some(ErrorInfo::new(ErrorKind::HostError, format!("no instance {id:?}"))),
                        journal: Vec::new(),
                        pending_timers: 0,
                    });
                }
            },
        }
    }

    fn resolve_idle_watchers(&mut self) {
        if !self.queue.is_empty() {
            return;
        }
        let watchers = std::mem::take(&mut self.watchers);
        for (id, until_idle, reply) in watchers {
            match self.instances.get(&id) {
                Some(h) if until_idle => {
                    let _ = reply.send(outcome(h));
                }
                _ => self.watchers.push((id, until_idle, reply)),
            }
        }
    }

    /// Queues an event for the instance it names, else for every instance that has not ended (except `from`).
    fn broadcast(&mut self, event: Value, from: Option<&str>) {
        if from.is_none() {
            if let Some(target) = driver::target(&event) {
                if self.instances.contains_key(&target) {
                    self.queue.push_back((target, Input::Event { event }));
                    return;
                }
            }
        }
        let mut ids: Vec<&String> = self
            .instances
            .iter()
            .filter(|(id, h)| !h.inst.status().is_final() && Some(id.as_str()) != from)
            .map(|(id, _)| id)
            .collect();
        ids.sort();
        let ids: Vec<String> = ids.into_iter().cloned().collect();
        for id in ids {
            self.queue.push_back((id, Input::Event { event: event.clone() }));
        }
    }

    async fn process(&mut self, id: &str, input: Input) {
        let at = self.now();
        let Some(h) = self.instances.get_mut(id) else { return };
        let step = self.driver.step(h, Timed { at, input });
        if let Some(sink) = &self.config.trace {
            for e in &step.entries {
                if let Entry::Trace(t) = e {
                    sink(id, t);
                }
            }
        }
        for work in step.work {
            self.perform(id, work).await;
        }
        if step.finished {
            self.finished(id);
        }
        if let Some(n) = step.notify {
            self.queue.push_back((n.instance, n.input));
        }
    }

    fn finished(&mut self, id: &str) {
        let Some(h) = self.instances.get(id) else { return };
        let o = outcome(h);
        let watchers = std::mem::take(&mut self.watchers);
        for (wid, until_idle, reply) in watchers {
            if wid == id {
                let _ = reply.send(o.clone());
            } else {
                self.watchers.push((wid, until_idle, reply));
            }
        }
    }

    async fn perform(&mut self, id: &str, work: Work) {
        match work {
            Work::Call { call, wait: _ } => self.call(call),
            Work::Task { task, wait: _ } => {
                // Here the application's functions are the worker: the task starts when it is
                // called, so its start-to-close and heartbeat timeouts measure the call.
                let input = Input::TaskStarted {
                    op: task.op.clone(),
                    worker: None,
                };
                self.queue.push_back((id.to_string(), input));
                self.call(task.call());
            }
            Work::StartChild(start) => {
                let machine = self.host.subflow(&start.definition);
                match self.driver.child(&start, machine) {
                    Ok(child) => {
                        if let Some(h) = self.instances.get_mut(id) {
                            h.child_started(&start.parent.op);
                        }
                        self.instances.insert(start.id.clone(), child);
                        self.queue.push_back((
                            start.id,
                            Input::Start {
                                data: start.input,
                                scheduled: None,
                            },
                        ));
                    }
                    Err(notify) => {
                        if let Some(n) = notify {
                            self.queue.push_back((n.instance, n.input));
                        }
                    }
                }
            }
            Work::Send { event, .. } => {
                if let Err(e) = self.host.send_event(event.clone()).await {
                    if let Some(sink) = &self.config.trace {
                        sink(
                            id,
                            &Trace::ActionFailed {
                                op: "sendEvent".into(),
                                action: "sendEvent".into(),
                                message: e.message,
                            },
                        );
                    }
                }
                self.broadcast(event, Some(id));
            }
            Work::ArmTimer { timer, due } => {
                self.seq += 1;
                self.timers.insert((due, self.seq, id.to_string(), timer));
            }
            Work::CancelTimer { timer, due } => {
                let matches = |(_, _, i, t): &&(Millis, u64, String, String)| i == id && *t == timer;
                match due {
                    Some(due) => {
                        let at = (due, 0, String::new(), String::new())..(due, u64::MAX, String::new(), String::new());
                        if let Some(k) = self.timers.range(at).find(matches).cloned() {
                            self.timers.remove(&k);
                        }
                    }
                    None => self.timers.retain(|k| !matches(&k)),
                }
            }
            Work::Stop { op, child } => {
                if let Some(task) = self.in_flight.remove(&(id.to_string(), op)) {
                    task.abort();
                }
                if self.instances.get(&child).is_some_and(|h| !h.inst.status().is_final()) {
                    self.queue.push_back((
                        child,
                        Input::Cancel {
                            reason: Some("the parent no longer waits".into()),
                        },
                    ));
                }
            }
        }
    }

    /// Makes a call on its own task; the result comes back as a command.
    fn call(&mut self, call: crate::functions::FunctionCall) {
        let key = (call.instance.clone(), call.op.clone());
        let task = crate::functions::spawn_call(&self.host, call, self.tx.clone(), |instance, op, result| {
            Cmd::Result { instance, op, result }
        });
        self.in_flight.insert(key, task);
    }
}

fn outcome(h: &Hosted) -> Outcome {
    Outcome {
        id: h.inst.id().to_string(),
        status: h.inst.status(),
        state: h.inst.state_name().map(str::to_string),
        data: h.inst.data(),
        error: h.inst.error().cloned(),
        journal: h.pending.clone(),
        pending_timers: h.inst.timers().len(),
    }
}
