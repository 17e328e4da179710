//! What the durable host does when its store's disk is full: the batch that could not be written
//! is forgotten (SQLite rolled it back) and its requests are refused with
//! [`HostError::StorageFull`]; the host writes nothing for a pause that doubles up to a bound,
//! refusing write requests at once meanwhile, then carries on from the store as after a restart
//! and tries again. Nothing it had acknowledged depends on the refused batch, and nothing the
//! refused batch decided was acted on (effects are performed only after a commit).

use super::{now_ms, Cmd, Loop};
use crate::store::{Batch, StoreError};
use sm4c_host::driver::Work;
use sm4c_host::service::HostError;
use sm4c_runtime::Effect;
use std::time::Duration;

/// How long the host waits before it writes again after the disk was full, first and at most.
const FULL_BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(2));

impl Loop {
    /// The disk is full and the batch was not written (SQLite rolled it back): its requests are
    /// told so, what it decided is forgotten, and the host writes nothing for a while. Calls whose
    /// results the batch handled are kept in flight; their results are handled again after the pause.
    pub(super) fn refused(&mut self, e: StoreError) {
        let why = e.to_string();
        let backoff = match self.backoff {
            Some(last) => (last * 2).min(FULL_BACKOFF.1),
            None => FULL_BACKOFF.0,
        };
        tracing::warn!(error = %why, retry_in_ms = backoff.as_millis() as u64, "the store's disk is full; requests are refused until a write succeeds");
        for reply in std::mem::take(&mut self.replies) {
            reply(Err(HostError::StorageFull(why.clone())));
        }
        // Workers waiting for these tasks get none; the tasks are queued again after the pause.
        self.handouts.clear();
        self.cache.clear();
        self.queue.clear();
        self.after.clear();
        self.batch = Batch::default();
        // What the refused batch changed of the schedules is forgotten with it.
        if let Err(e) = self.load_schedules() {
            tracing::warn!(error = %e, "cannot read the schedules again; they are read after the pause");
        }
        for (handle, instance, op, result) in std::mem::take(&mut self.results) {
            self.in_flight.insert((instance.clone(), op.clone()), handle);
            self.held.push(Cmd::Result { instance, op, result });
        }
        self.backoff = Some(backoff);
        self.paused = Some(tokio::time::Instant::now() + backoff);
    }

    /// A request that needs a write, during the pause, is refused at once; call results and
    /// workers' polls wait for its end (a poll handed a task would write the task's start).
    pub(super) fn command_paused(&mut self, cmd: Cmd) {
        let full = || HostError::StorageFull("the store's disk is full".into());
        match cmd {
            Cmd::Start { reply, .. } => drop(reply.send(Err(full()))),
            Cmd::Event(_, reply) => drop(reply.send(Err(full()))),
            Cmd::Cancel(_, reply) => drop(reply.send(Err(full()))),
            Cmd::Resume(_, _, reply) => drop(reply.send(Err(full()))),
            Cmd::Migrate {
                reply, dry_run: false, ..
            } => drop(reply.send(Err(full()))),
            Cmd::Redrive {
                reply, dry_run: false, ..
            } => drop(reply.send(Err(full()))),
            Cmd::Answer { reply, .. } => drop(reply.send(Err(full()))),
            Cmd::Schedule(op, reply)
                if !matches!(
                    op,
                    sm4c_host::service::ScheduleOp::Get(_) | sm4c_host::service::ScheduleOp::List
                ) =>
            {
                drop(reply.send(Err(full())))
            }
            cmd @ (Cmd::Result { .. } | Cmd::Poll { .. }) => self.held.push(cmd),
            other => self.command(other),
        }
    }

    /// After a pause, carries on from the store, as after a restart: timers come back (those the
    /// refused batch fired among them), tasks not taken are queued again, open calls whose results
    /// were lost are made again with the same operation id, and the held results are handled.
    pub(super) fn resume(&mut self) -> Result<(), StoreError> {
        self.load_schedules()?;
        let timers = self.store.timers()?;
        let calls = self.store.calls()?;
        self.parked_count = self.store.parked(now_ms())?.len();
        self.timers = timers.into_iter().map(|(i, t, due)| (due, i, t)).collect();
        // What the last written batch left over goes first, as it would have.
        let carried = std::mem::take(&mut self.carried);
        self.queue.splice(0..0, carried);
        for (inst, effect) in calls {
            if let Effect::InvokeFunction { op, .. } = &effect {
                if self.in_flight.contains_key(&(inst.clone(), op.clone())) {
                    continue;
                }
            }
            match self.recovered(&inst, effect) {
                Ok(Some(work)) => {
                    if let Work::Task { task, .. } = &work {
                        self.tasks.remove(&task.instance, &task.op);
                    }
                    self.perform(&inst, work);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(instance = %inst, error = %e, "cannot resume an open call"),
            }
        }
        for cmd in std::mem::take(&mut self.held) {
            self.command(cmd);
        }
        self.paused = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
