//! Recovery, when the host starts on a store: timers come back, calls that were in flight are
//! made again with the same operation ids, and every unfinished instance's journal is replayed
//! against its definition. A record that cannot be read back (a definition, a snapshot, a journal
//! row, an open call) fails only the instances it belongs to, with `corruptRecord` naming it; an
//! instance failed this way outside any step tells its waiting parent itself.

use super::{now_ms, Loop};
use crate::store::{Batch, InstanceWrite, StoreError};
use serde_json::json;
use sm4c_host::driver::{self, ParentLink, Work};
use sm4c_host::service::HostError;
use sm4c_runtime::{Effect, Entry, ErrorInfo, ErrorKind, Input, Millis, Status};
use std::collections::BTreeSet;

/// Whether a store error, as a host error's text, is a record that cannot be read back.
fn corrupt_text(e: &str) -> bool {
    e.starts_with("store: corrupt record:")
}

impl Loop {
    /// Restores timers and calls in flight; checks unfinished instances against their definitions.
    ///
    /// One record that cannot be read back never stops recovery: its instance is failed with
    /// `corruptRecord` naming the record (see [`Loop::corrupt`]), and every other instance goes on.
    pub(super) fn recover(&mut self) -> Result<(), HostError> {
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
    pub(super) fn lost_definitions(&mut self, lost: &[(String, String, String)]) -> Result<(), HostError> {
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
    pub(super) fn corrupt(&mut self, id: &str, record: &str, why: &str) -> Result<(), HostError> {
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
    pub(super) fn tell_parent(
        &mut self,
        id: &str,
        parent: Option<&ParentLink>,
        snapshot: &sm4c_runtime::Snapshot,
    ) -> bool {
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
    pub(super) fn write_ended(
        &mut self,
        mut snapshot: sm4c_runtime::Snapshot,
        now: Millis,
        told: bool,
    ) -> Result<(), HostError> {
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
    pub(super) fn recovered(&mut self, id: &str, effect: Effect) -> Result<Option<Work>, HostError> {
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

    /// Replays an unfinished instance's journal; a mismatch fails the instance, naming the entry.
    /// `Ok(Err((record, why)))` when a record of the instance cannot be read back.
    pub(super) fn verify(&mut self, id: &str) -> Result<Result<(), (&'static str, String)>, HostError> {
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
}
