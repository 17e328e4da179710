//! The durable host: instances that survive crashes and restarts.
//!
//! One task decides for every instance, one input at a time (the decider model: one decision at a
//! time per execution). Inputs are handled in batches; a batch's journal entries, snapshots, timers,
//! calls in flight and sent events are committed to the [`Store`] in one transaction (group commit),
//! and only then are its effects performed. An instance that waits holds no memory here: it is
//! loaded from the store when something arrives for it. After a crash, timers come back from the
//! store (firing at once if they came due meanwhile) and calls that were in flight are made again
//! with the same operation id.
//!
//! The deciding task is a [`Loop`], cut by concern into `impl Loop` blocks in submodules:
//! `handle` ([`DurableHost`] and the requests it sends), `commands` (the dispatcher of those
//! requests), `recover` (what a start does with the store), `route` (events, parking), `commit`
//! (a batch: step, commit), `work` (effects, worker tasks, subflows), `schedules` and `full` (a
//! full disk). This file holds the loop's state and [`Loop::run`], which takes requests into
//! batches until the host stops.

use crate::store::{Batch, Store};
use serde_json::Value;
use sm4c_host::driver::{self, Driver, Hosted, Work};
use sm4c_host::service::{HostError, Registry};
use sm4c_host::tasks::{Poller, Task, TaskLists};
use sm4c_host::Functions;
use sm4c_runtime::{ErrorInfo, Input, Machine, Millis};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

mod commands;
mod commit;
mod full;
mod handle;
mod recover;
mod route;
mod schedules;
#[cfg(test)]
mod tests;
mod work;

use commands::Cmd;
pub use handle::DurableHost;

/// An answer to a request, sent once its batch is committed, or with the error that kept it out.
type Reply = Box<dyn FnOnce(Result<(), HostError>) + Send>;

/// Limits the durable host enforces: parking, journal length, batch size, redrives, and the
/// expression limits of the definitions it loads. Named apart from `sm4c_runtime::Limits` (one
/// expression's) and `sm4c_host::driver::Limits` (the driver's, set from these).
#[derive(Debug, Clone, Copy)]
pub struct HostLimits {
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

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits {
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

fn now_ms() -> Millis {
    sm4c_host::clock::wall_ms()
}

/// An instance the current batch holds in memory (loaded from the store by [`Loop::in_batch`], or
/// created in the batch), until the batch is committed.
struct BatchInstance {
    h: Hosted,
    /// Changed in this batch: written by the commit.
    dirty: bool,
    /// It waited already when it was loaded (and no migration or redrive changed that since):
    /// parked events are offered only to instances that start waiting in the batch.
    was_waiting: bool,
}

/// The deciding task's state: what the current batch has decided and not yet written, and what
/// lives across batches (timers, calls in flight, task lists, schedules, the parking count).
struct Loop {
    store: Arc<dyn Store>,
    host: Arc<dyn Functions>,
    driver: Driver,
    failed: tokio::sync::watch::Sender<Option<String>>,
    registry: Arc<RwLock<Registry>>,
    breakpoints: Arc<driver::Breakpoints>,
    limits: HostLimits,
    tx: mpsc::WeakUnboundedSender<Cmd>,
    /// Instances touched in the current batch only.
    cache: HashMap<String, BatchInstance>,
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
}
