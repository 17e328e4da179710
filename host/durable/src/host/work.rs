//! Work, performed once the batch that decided it is committed: calls are made (their results come
//! back as [`Cmd::Result`]), worker tasks wait in their task lists and are handed to polling
//! workers, whose answers come back here, subflows are started in the batch, events are sent,
//! timers armed and cancelled.

use super::{BatchInstance, Cmd, Loop};
use sm4c_host::driver::{Answering, Work};
use sm4c_host::service::{Answered, HostError};
use sm4c_host::tasks::{Answer, Poller, Task};
use sm4c_runtime::{Input, Machine};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

impl Loop {
    /// Gives a task to a worker: its start goes first into the next batch, and the worker gets the
    /// task once that batch is committed.
    pub(super) fn hand_out(&mut self, task: Task, poller: Poller) {
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

    pub(super) fn perform(&mut self, id: &str, work: Work) {
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
                                BatchInstance {
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
                if let Some(slot) = self.in_batch(id) {
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

    pub(super) fn create(&mut self, id: &str, m: Arc<Machine>, origin: Option<String>) {
        let mut h = self.driver.create(m, id);
        h.origin = origin;
        self.cache.insert(
            id.to_string(),
            BatchInstance {
                h,
                dirty: true,
                was_waiting: false,
            },
        );
    }

    /// A worker's answer: a task the instance still waits for is answered once the step is
    /// committed; a closed task refuses completion and failure, and asks a heartbeating worker to stop.
    pub(super) fn answer(
        &mut self,
        instance: String,
        op: String,
        answer: Answer,
        reply: oneshot::Sender<Result<Answered, HostError>>,
    ) {
        let driver = self.driver.clone();
        let Some(slot) = self.in_batch(&instance) else {
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
}
