//! The requests the deciding task takes: [`Cmd`], sent by the [`DurableHost`](super::DurableHost)
//! handle and by finished calls, and [`Loop::command`], which turns each into inputs queued for the
//! batch (a start, an event, a cancel, a task's answer) or does it at once in the batch (a
//! definition, a migration, a redrive), leaving its reply to be sent once the batch is committed.

use super::{now_ms, Loop};
use serde_json::{json, Value};
use sm4c_host::service::redrive_error;
use sm4c_host::service::{new_id, Answered, Delivery, HostError};
use sm4c_host::tasks::{Answer, Poller};
use sm4c_runtime::engine::migrate::MigrationPlan;
use sm4c_runtime::engine::redrive::RedrivePlan;
use sm4c_runtime::{load, ErrorInfo, Input, LoadOptions, Machine, Status};
use std::sync::Arc;
use tokio::sync::oneshot;

pub(super) enum Cmd {
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

impl Loop {
    pub(super) fn command(&mut self, cmd: Cmd) {
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
            Cmd::Cancel(id, reply) => match self.in_batch(&id).map(|s| s.h.inst.status()) {
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
            Cmd::Resume(id, step, reply) => match self.in_batch(&id).map(|s| s.h.inst.status()) {
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
                    if let Some(slot) = self.in_batch(&instance) {
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

    /// Moves instance `id` to `version` now (in this batch), or says why it cannot.
    pub(super) fn migrate(
        &mut self,
        id: &str,
        version: &str,
        states: &std::collections::BTreeMap<String, String>,
        dry_run: bool,
    ) -> Result<MigrationPlan, HostError> {
        let now = now_ms();
        let driver = self.driver.clone();
        let definition = match self.in_batch(id) {
            Some(slot) => slot.h.inst.machine().id.clone(),
            None => return Err(HostError::UnknownInstance(id.to_string())),
        };
        let Some(to) = self.machine(&definition, version) else {
            return Err(HostError::UnknownDefinition(format!("{definition} version {version}")));
        };
        let Some(slot) = self.in_batch(id) else {
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
    pub(super) fn redrive(&mut self, id: &str, update: Option<&str>, dry_run: bool) -> Result<Value, HostError> {
        let now = now_ms();
        let driver = self.driver.clone();
        let cap = self.limits.max_redrives;
        let Some(slot) = self.in_batch(id) else {
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

    pub(super) fn define(&mut self, doc: Value) -> Result<(Arc<Machine>, bool), HostError> {
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
