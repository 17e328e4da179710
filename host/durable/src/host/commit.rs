//! The batch: due timers fire into the queue, [`Loop::step`] hands each queued input to its
//! instance (loaded from the store into the batch by [`Loop::in_batch`], at most once per batch),
//! what each step asks is collected, and [`Loop::commit`] writes the whole batch in one
//! transaction; only then are replies sent, tasks handed to workers and effects performed.

use super::{now_ms, BatchInstance, Loop};
use crate::store::{InstanceWrite, StoreError};
use sm4c_host::driver::{Hosted, ParentLink, Work};
use sm4c_runtime::{Input, Status, Timed};

impl Loop {
    pub(super) fn fire_due(&mut self) {
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
    pub(super) fn step(&mut self) -> Result<(), StoreError> {
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

    pub(super) fn in_batch(&mut self, id: &str) -> Option<&mut BatchInstance> {
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
                BatchInstance {
                    h,
                    dirty: changed,
                    was_waiting,
                },
            );
        }
        self.cache.get_mut(id)
    }

    /// How deep an instance with this parent nests, from the parent links in the store.
    pub(super) fn depth(&self, parent: Option<&ParentLink>) -> u32 {
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

    pub(super) fn handle(&mut self, id: &str, input: Input) {
        let now = now_ms();
        let driver = self.driver.clone();
        let breakpoints = self.breakpoints.clone();
        let Some(slot) = self.in_batch(id) else { return };
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
    pub(super) fn after_step(&mut self, id: &str, step: sm4c_host::driver::Step, now: i64) {
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

    /// Commits the batch of `inputs` inputs in one transaction.
    pub(super) fn commit(&mut self, inputs: usize) -> Result<(), StoreError> {
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
}
