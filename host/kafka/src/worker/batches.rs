//! Batch operations in Kafka mode (`/batches`): each commands partition's owner applies a batch
//! to its own instances, so that adding workers adds capacity.
//!
//! - `POST /batches` sends a [`Command::Batch`] to every commands partition. Its owner decides it
//!   into the partition's share of the batch ([`Share`]), a record of the partition's own on the
//!   state topic ([`crate::wire::batch_key`]), written in the decision's transaction: the share
//!   keeps the request, the partition's latest place in listings then (its bound: the instances
//!   started later are left out), how many instances matched, a cursor, the counts and the first
//!   failures.
//! - While its share applies, the owner proposes a [`Command::BatchTick`] every [`TICK_MS`] (as
//!   it proposes a timer that came due; a repeated one does nothing more). Deciding it, it takes
//!   the partition's next instances after the cursor, in start order up to the bound, that match
//!   the batch's `where`, as many as the rate allows since the last group (the group's `rate`,
//!   or `--batch-rate`, divided by the number of partitions), applies the operation to each in
//!   the same decision (a cancel as `POST /instances/{id}/cancel` does, a redrive and a migration
//!   by the paths of their commands, a send by delivering the event with id
//!   [`event_id`]`(batch, instance)`), and records each outcome and the new cursor in the share:
//!   the instances' new records and the share commit in one transaction, or neither does. A new
//!   owner restores both from the same committed transaction, so a SIGKILL in the middle of a
//!   batch neither applies an operation twice nor skips one.
//! - [`Command::BatchStop`] (`POST /batches/{id}/cancel`, to every partition) ends a share
//!   that still applies; the instances without an outcome are left as they are.
//!
//! Shares are kept as the SQLite server keeps its batches: they are not deleted.

use super::decision::Decision;
use super::{command, Out, Shared};
use crate::wire::{batch_key, Command, Origin, StateRecord};
use serde_json::{json, Value};
use sm4c_host::batch::{event_id, Operation, Outcome, Phase, Share, Spec, GROUP};
use sm4c_host::service::Summary;
use sm4c_runtime::{Input, Status};
use std::collections::{BTreeMap, BTreeSet};

/// How often the owner proposes the next group of a share that applies (ms of its clock).
pub(super) const TICK_MS: i64 = 200;

/// How many instances one tick looks at, at most, matching or not.
const SCAN: usize = 2_000;

/// The shares of batches of one commands partition.
#[derive(Default)]
pub(super) struct Batches {
    /// Each batch's share, by id.
    pub(super) all: BTreeMap<String, Share>,
    /// When to propose the next tick of each share that applies (ms of the worker's clock).
    /// Ordered, so that what is proposed follows from the inputs alone.
    proposed: BTreeMap<String, i64>,
    /// Changed by the batch being decided: written in its transaction.
    changed: BTreeSet<String>,
}

impl Batches {
    /// Takes in a share, as a restore read it.
    pub(super) fn restore(&mut self, id: &str, share: Share) {
        self.all.insert(id.to_string(), share);
    }

    /// The batches whose tick to propose at `now` (the worker's clock): each share that applies,
    /// every [`TICK_MS`].
    pub(super) fn due(&mut self, now: i64) -> Vec<String> {
        let running: BTreeSet<&String> = self
            .all
            .iter()
            .filter(|(_, s)| s.phase().is_running())
            .map(|(id, _)| id)
            .collect();
        self.proposed.retain(|id, _| running.contains(id));
        let mut out = Vec::new();
        for id in running {
            let at = self.proposed.entry(id.clone()).or_insert(now);
            if *at <= now {
                *at = now + TICK_MS;
                out.push(id.clone());
            }
        }
        out
    }

    /// The records of the shares the batch being decided changed, for a transaction numbered
    /// `clock` that consumed commands through `through`; and the shares, for the API's view once
    /// it commits.
    pub(super) fn decided(
        &mut self,
        shared: &Shared,
        partition: i32,
        through: i64,
        clock: i64,
    ) -> (Vec<Out>, Vec<(String, Share)>) {
        let mut outs = Vec::new();
        let mut changes = Vec::new();
        for id in std::mem::take(&mut self.changed) {
            let Some(share) = self.all.get(&id) else { continue };
            let r = StateRecord {
                through,
                clock: Some(clock),
                batch: Some(share.clone()),
                ..StateRecord::default()
            };
            outs.push(Out {
                topic: shared.topics.state.clone(),
                partition: Some(partition),
                key: Some(batch_key(&id)),
                payload: Some(serde_json::to_vec(&r).unwrap_or_default()),
                headers: Vec::new(),
            });
            changes.push((id, share.clone()));
        }
        (outs, changes)
    }
}

/// How many instances a share applies to at a tick `at`, `last` being when it last applied a
/// group: as many as `rate` a second allows since then, at most a second's worth (and at least
/// [`GROUP`] then), none when the clock has not moved on.
pub(crate) fn group_size(rate: f64, last: i64, at: i64) -> usize {
    let elapsed = (at - last).max(0) as f64 / 1000.0;
    let cap = (rate.ceil() as usize).max(GROUP);
    ((rate * elapsed).floor() as usize).min(cap)
}

/// A batch's rate on one of `partitions` partitions: the group's (the batch's own `rate` when
/// lower) divided among them.
pub(crate) fn partition_rate(server: u32, asked: Option<u32>, partitions: i32) -> f64 {
    let rate = asked.map_or(server, |r| r.min(server)).max(1);
    f64::from(rate) / f64::from(partitions.max(1))
}

impl Decision<'_> {
    /// A batch posted: this partition's share of it, decided now. A repeated one does nothing.
    pub(super) fn batch_new(&mut self, id: &str, request: Value, created: i64) {
        if self.t.batches.all.contains_key(id) {
            return;
        }
        let p = self.t.partition;
        let mut share = Share {
            partition: p,
            partitions: self.shared.partitions,
            request: request.clone(),
            created,
            bound: crate::view::seq_of(self.t.last_order, p),
            cursor: i64::MIN,
            matched: 0,
            done: 0,
            failed: 0,
            failures: Vec::new(),
            phase: Phase::Applying.as_str().into(),
            ended: None,
            last: created,
        };
        match Spec::from_json(&request, self.shared.cfg.expression) {
            // Counted now, so that the answer says what is left (not when the view does not
            // answer for the partition: then the count comes as the share ends); the instances
            // are taken as they come, and those that no longer match then are left out.
            Ok(spec) if self.shared.view.holds(p) => {
                let mut cursor = i64::MIN;
                loop {
                    let (page, next, last) = self.batch_page(&spec, cursor, share.bound, usize::MAX);
                    share.matched += page.len() as u64;
                    cursor = next;
                    if last {
                        break;
                    }
                }
            }
            Ok(_) => {}
            Err(errs) => {
                // Checked before it was sent: only another version or other limits refuse it.
                let why: Vec<String> = errs.iter().map(|(p, m)| format!("{p}: {m}")).collect();
                share.phase = Phase::Cancelled.as_str().into();
                share.ended = Some(created);
                share.failures.push((
                    String::new(),
                    format!("the batch does not read here: {}", why.join("; ")),
                ));
                tracing::warn!(batch = id, error = %why.join("; "), "a batch does not read; its share is cancelled");
            }
        }
        tracing::info!(
            batch = id,
            partition = p,
            matched = share.matched,
            "batch share decided"
        );
        self.t.batches.all.insert(id.to_string(), share);
        self.t.batches.changed.insert(id.to_string());
    }

    /// `POST /batches/{id}/cancel`: the share stops where it is.
    pub(super) fn batch_stop(&mut self, id: &str) {
        let now = self.t.stream_ms;
        let Some(share) = self.t.batches.all.get_mut(id) else {
            return;
        };
        if share.phase().is_running() {
            share.phase = Phase::Cancelled.as_str().into();
            share.ended = Some(now);
            self.t.batches.changed.insert(id.to_string());
        }
    }

    /// Batch `id`'s next group on this partition, at `at` (the proposer's clock, which paces
    /// it; it does not move the stream time).
    pub(super) fn batch_tick(&mut self, id: &str, at: i64, offset: i64) {
        let Some(share) = self.t.batches.all.get(id).filter(|s| s.phase().is_running()).cloned() else {
            return;
        };
        let Ok(spec) = Spec::from_json(&share.request, self.shared.cfg.expression) else {
            return;
        };
        // The instances are listed from the view of what committed, which answers for the
        // partition once the restore handed it over and until its local store breaks (then the
        // partition is restored again): without it, an empty listing would end the share early.
        if !self.shared.view.holds(self.t.partition) {
            return;
        }
        let rate = partition_rate(self.shared.cfg.batch_rate, spec.rate, self.shared.partitions);
        let n = group_size(rate, share.last, at);
        if n == 0 {
            return;
        }
        let (page, next, last) = self.batch_page(&spec, share.cursor, share.bound, n);
        let now = self.t.stream_ms;
        let mut share = share;
        let mut applied = 0;
        for s in &page {
            let outcome = self.batch_apply(id, &s.id, &spec.operation, now, offset);
            share.record(&s.id, &outcome);
            share.cursor = s.seq;
            applied += 1;
        }
        // Looked at through `next` without finding more: the cursor moves past them.
        if page.len() < n {
            share.cursor = share.cursor.max(next);
        }
        share.last = at;
        if last && applied == page.len() {
            share.phase = Phase::Completed.as_str().into();
            share.ended = Some(now);
            // What it acted on: those that no longer matched when reached are not counted.
            share.matched = share.done + share.failed;
            tracing::info!(
                batch = id,
                partition = self.t.partition,
                done = share.done,
                failed = share.failed,
                "batch share completed"
            );
        }
        self.t.batches.all.insert(id.to_string(), share);
        self.t.batches.changed.insert(id.to_string());
    }

    /// Up to `limit` of the partition's instances after `cursor`, up to `bound`, in start order,
    /// that match `spec`'s `where` as they are now (this batch's changes included): the
    /// matches, the place of the last instance looked at, and whether none is left after it.
    fn batch_page(&mut self, spec: &Spec, cursor: i64, bound: i64, limit: usize) -> (Vec<Summary>, i64, bool) {
        let p = self.t.partition;
        let w = &spec.filter;
        let rows = self.shared.view.list_in(Some(p), None, None, cursor, SCAN);
        let mut out = Vec::new();
        let mut next = cursor;
        let mut last = rows.len() < SCAN;
        for row in rows {
            if row.seq > bound {
                last = true;
                break;
            }
            next = row.seq;
            // An instance this batch (the transaction being decided) changed: as it is now.
            let now = self
                .t
                .slots
                .get(&row.id)
                .filter(|_| self.t.dirty.contains(&row.id))
                .map(|s| s.record());
            let record = match now {
                Some(r) => Some(r),
                None if w.jq.is_some() => self.shared.view.get(p, &row.id),
                None => None,
            };
            let summary = match &record {
                Some(r) => crate::view::summary(&row.id, r, row.seq),
                None => row,
            };
            if !w.matches_summary(&summary) {
                continue;
            }
            if w.jq.is_some() {
                let data = record
                    .as_ref()
                    .map(|r| serde_json::to_value(&r.snapshot.data).unwrap_or(Value::Null))
                    .unwrap_or(Value::Null);
                if !w.matches_data(&data) {
                    continue;
                }
            }
            out.push(summary);
            if out.len() >= limit {
                return (out, next, false);
            }
        }
        (out, next, last)
    }

    /// Applies `op` to `instance` of this partition, in this decision: its outcome, as the
    /// SQLite server's batches record it.
    fn batch_apply(&mut self, batch: &str, instance: &str, op: &Operation, at: i64, offset: i64) -> Outcome {
        let shared = self.shared;
        let status = |d: &mut Self| -> Option<Status> {
            match d.t.slots.get(instance) {
                Some(s) => Some(s.h.inst.status()),
                None => d.shared.view.get(d.t.partition, instance).map(|r| r.snapshot.status),
            }
        };
        let ended = |st: Status| Outcome::Failed(format!("it had already ended ({})", st.as_str()));
        match op {
            Operation::Cancel => match status(self) {
                None => Outcome::Failed(format!("no instance {instance:?}")),
                Some(st) if st.is_final() => ended(st),
                Some(_) => {
                    let reason = format!("batch {batch}");
                    self.handle(instance, Input::Cancel { reason: Some(reason) }, at);
                    match status(self) {
                        Some(Status::Cancelled) => Outcome::Done(None),
                        Some(st) => Outcome::Failed(format!("it was not cancelled (it is {})", st.as_str())),
                        None => Outcome::Failed(format!("no instance {instance:?}")),
                    }
                }
            },
            Operation::Redrive { update } => match self.redrive(instance, update.as_deref(), at) {
                Ok(()) => Outcome::Done(None),
                Err(why) => Outcome::Failed(why),
            },
            Operation::Migrate { version, states } => match status(self) {
                Some(st) if st.is_final() => ended(st),
                _ => match self.migrate(instance, version, states, at) {
                    Ok(()) => Outcome::Done(None),
                    Err(why) => Outcome::Failed(why),
                },
            },
            Operation::Send { event } => {
                match status(self) {
                    None => return Outcome::Failed(format!("no instance {instance:?}")),
                    Some(st) if st.is_final() => return ended(st),
                    Some(_) => {}
                }
                let mut e = event.clone();
                e[sm4c_host::driver::INSTANCE_ATTRIBUTE] = json!(instance);
                e["id"] = json!(event_id(batch, instance));
                let takes = self
                    .t
                    .slot(shared, instance)
                    .is_some_and(|s| sm4c_host::driver::accepts(&s.h.inst, &e));
                if !takes {
                    return Outcome::Failed(
                        "the event did not reach the instance (it does not wait for it now)".into(),
                    );
                }
                // The batch's command is where the event comes from: its offset marks it applied.
                let origin = Origin {
                    topic: shared.topics.commands.clone(),
                    partition: self.t.partition,
                    offset,
                };
                self.deliver(instance, e, &origin, at);
                Outcome::Done(None)
            }
        }
    }
}

/// The command that proposes batch `id`'s next group on partition `p`.
pub(super) fn tick_command(shared: &Shared, p: i32, id: &str) -> Out {
    let c = Command::BatchTick { id: id.to_string() };
    command(shared, p, Some(id), &c)
}

#[cfg(test)]
mod tests {
    use super::super::decision::tests::decide_commands;
    use super::super::decision::Batch;
    use super::super::restore::Latest;
    use super::super::Owner;
    use super::{group_size, partition_rate};
    use crate::wire::{batch_key, partition_of, Command, StateRecord};
    use serde_json::json;
    use sm4c_runtime::Status;

    const T0: i64 = 1_700_000_000_000;

    /// Decides `commands`, each at its time, as one batch of partition `t`.
    fn batch(shared: &crate::Shared, t: &mut Owner, commands: &[(i64, Command)]) -> Batch {
        decide_commands(shared, t, commands)
    }

    /// Commits a decided batch as the worker loop does: the view takes its records, and the
    /// state records it wrote are kept (for a restore).
    fn commit(shared: &crate::Shared, t: &mut Owner, mut b: Batch, log: &mut Vec<(String, Vec<u8>)>) {
        for o in b.outs.iter().filter(|o| o.topic == shared.topics.state) {
            if let (Some(k), Some(v)) = (&o.key, &o.payload) {
                log.push((k.clone(), v.clone()));
            }
        }
        shared.view.apply(t.partition, std::mem::take(&mut b.records), 0);
        shared
            .view
            .apply_batches(t.partition, std::mem::take(&mut b.batches), false);
        t.committed(b);
    }

    fn start(id: &str) -> Command {
        Command::Start {
            id: id.into(),
            definition: "sim-seq".into(),
            version: None,
            input: json!({"n": 1}),
            parent: None,
            depth: 0,
            origin: None,
            request: None,
            traceparent: None,
            schedule: None,
            nominal: None,
        }
    }

    fn share(t: &Owner, id: &str) -> sm4c_host::batch::Share {
        t.batches.all.get(id).cloned().expect("the share")
    }

    #[test]
    fn a_share_cancels_each_instance_once_through_a_lost_transaction_and_a_restore() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let mut shared = super::super::sim::shared(&rt);
        // 40 a second on this partition.
        shared.cfg.batch_rate = 40 * shared.partitions as u32;
        let p = 0;
        let (mut t, _) = Latest::new(0, 0).owner(&shared, p, None, None);
        shared.view.take(p, Default::default(), None);
        let ids: Vec<String> = (0..400)
            .map(|i| format!("i{i}"))
            .filter(|id| partition_of(id, shared.partitions) == p)
            .take(30)
            .collect();
        assert_eq!(ids.len(), 30);
        let mut log = Vec::new();
        let starts: Vec<(i64, Command)> = ids.iter().map(|id| (T0, start(id))).collect();
        let b = batch(&shared, &mut t, &starts);
        commit(&shared, &mut t, b, &mut log);
        // The batch, then an instance started after it in the same transaction: left out.
        let late = (400..800)
            .map(|i| format!("i{i}"))
            .find(|id| partition_of(id, shared.partitions) == p)
            .expect("a late id");
        let request = json!({"operation": "cancel", "where": {"definition": "sim-seq"}});
        let b = batch(
            &shared,
            &mut t,
            &[
                (
                    T0 + 10,
                    Command::Batch {
                        id: "b".into(),
                        spec: request.clone(),
                        created: T0 + 10,
                    },
                ),
                (T0 + 10, start(&late)),
            ],
        );
        assert!(
            b.outs.iter().any(|o| o.key.as_deref() == Some(batch_key("b").as_str())),
            "the share is written with its decision"
        );
        commit(&shared, &mut t, b, &mut log);
        assert_eq!(share(&t, "b").matched, 30);
        // A repeated one changes nothing.
        let b = batch(
            &shared,
            &mut t,
            &[(
                T0 + 20,
                Command::Batch {
                    id: "b".into(),
                    spec: request,
                    created: T0 + 20,
                },
            )],
        );
        assert!(b.batches.is_empty());
        commit(&shared, &mut t, b, &mut log);
        // Each tick a quarter of a second later takes ten.
        let tick = || Command::BatchTick { id: "b".into() };
        let b = batch(&shared, &mut t, &[(T0 + 260, tick())]);
        commit(&shared, &mut t, b, &mut log);
        assert_eq!(share(&t, "b").done, 10);
        // The next transaction is decided and lost (the worker dies before it commits).
        let lost = batch(&shared, &mut t, &[(T0 + 510, tick())]);
        assert_eq!(share(&t, "b").done, 20);
        drop(lost);
        // A new owner restores the partition from what committed: the share and the instances
        // as that transaction left them.
        let mut latest = Latest::new(1_000_000, 1_000_000);
        for (k, v) in &log {
            latest.record(Some(k.clone()), Some(v), None);
        }
        let (mut t, _) = latest.owner(&shared, p, None, None);
        let restored: StateRecord =
            serde_json::from_slice(&log.iter().rev().find(|(k, _)| *k == batch_key("b")).expect("record").1)
                .expect("a state record");
        assert_eq!(restored.batch.as_ref().map(|s| s.done), Some(10));
        assert_eq!(share(&t, "b").done, 10);
        // Until the view answers for the partition (the worker hands it the restored records
        // before the owner decides), a tick waits: an empty listing must not end the share.
        shared.view.release(p);
        let b = batch(&shared, &mut t, &[(T0 + 505, tick())]);
        assert!(b.batches.is_empty(), "a tick without the view changes nothing");
        commit(&shared, &mut t, b, &mut log);
        shared.view.take(p, std::mem::take(&mut t.records), None);
        for k in 0..6 {
            let b = batch(&shared, &mut t, &[(T0 + 510 + 250 * k, tick())]);
            commit(&shared, &mut t, b, &mut log);
        }
        let s = share(&t, "b");
        assert_eq!(
            (s.phase.as_str(), s.matched, s.done, s.failed),
            ("completed", 30, 30, 0),
            "{s:?}"
        );
        for id in &ids {
            let r = shared.view.get(p, id).expect("the instance");
            assert_eq!(r.snapshot.status, Status::Cancelled, "{id}");
        }
        assert_eq!(
            shared.view.get(p, &late).map(|r| r.snapshot.status),
            Some(Status::Waiting)
        );
        // Completed: a further tick or stop changes nothing.
        let b = batch(
            &shared,
            &mut t,
            &[
                (T0 + 5_000, tick()),
                (T0 + 5_000, Command::BatchStop { id: "b".into() }),
            ],
        );
        assert!(b.batches.is_empty());
    }

    #[test]
    fn a_share_applies_at_its_part_of_the_rate_and_not_when_the_clock_went_back() {
        // 500 a second over 4 partitions: 125 each, so a tick 200 ms after the last takes 25.
        let rate = partition_rate(500, None, 4);
        assert_eq!(rate, 125.0);
        assert_eq!(group_size(rate, 1_000, 1_200), 25);
        // A batch's own rate counts when it is lower, never when higher.
        assert_eq!(partition_rate(500, Some(40), 4), 10.0);
        assert_eq!(partition_rate(500, Some(4_000), 4), 125.0);
        // A proposer whose clock is behind the last group's (a new owner) waits.
        assert_eq!(group_size(rate, 1_200, 1_000), 0);
        // After a long pause, at most a second's worth (and at least a group) at once.
        assert_eq!(group_size(rate, 0, 3_600_000), 125.max(sm4c_host::batch::GROUP));
    }

    #[test]
    fn a_send_share_delivers_each_waiting_instance_its_event_once_with_the_batch_id_and_refuses_an_ended_one() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let mut shared = super::super::sim::shared(&rt);
        shared.cfg.batch_rate = 1_000 * shared.partitions as u32;
        let p = 1;
        let (mut t, _) = Latest::new(0, 0).owner(&shared, p, None, None);
        shared.view.take(p, Default::default(), None);
        let ids: Vec<String> = (0..400)
            .map(|i| format!("s{i}"))
            .filter(|id| partition_of(id, shared.partitions) == p)
            .take(5)
            .collect();
        let mut log = Vec::new();
        let starts: Vec<(i64, Command)> = ids.iter().map(|id| (T0, start(id))).collect();
        let b = batch(&shared, &mut t, &starts);
        commit(&shared, &mut t, b, &mut log);
        // One of them is cancelled first: the event cannot reach it.
        let cancel = Command::Cancel {
            id: ids[0].clone(),
            reason: "test".into(),
        };
        let b = batch(&shared, &mut t, &[(T0 + 1, cancel)]);
        commit(&shared, &mut t, b, &mut log);
        let request = json!({"operation": "send", "where": {"definition": "sim-seq"},
            "event": {"type": "sim.step", "source": "client", "order": "s1"}});
        let b = batch(
            &shared,
            &mut t,
            &[(
                T0 + 10,
                Command::Batch {
                    id: "b".into(),
                    spec: request,
                    created: T0 + 10,
                },
            )],
        );
        commit(&shared, &mut t, b, &mut log);
        let mut events: Vec<(String, String)> = Vec::new();
        for k in 1..4 {
            let b = batch(
                &shared,
                &mut t,
                &[(T0 + 10 + 1_000 * k, Command::BatchTick { id: "b".into() })],
            );
            for o in b.outs.iter().filter(|o| o.topic == shared.topics.journal) {
                let r: crate::wire::JournalRecord =
                    serde_json::from_slice(o.payload.as_deref().expect("a journal record")).expect("json");
                for e in r.entries {
                    if let sm4c_runtime::Entry::Input(ti) = e {
                        if let sm4c_runtime::Input::Event { event } = ti.input {
                            let id = event["id"].as_str().unwrap_or_default().to_string();
                            events.push((o.key.clone().unwrap_or_default(), id));
                        }
                    }
                }
            }
            commit(&shared, &mut t, b, &mut log);
        }
        let s = share(&t, "b");
        assert_eq!((s.phase.as_str(), s.done, s.failed), ("completed", 4, 1), "{s:?}");
        assert_eq!(s.failures[0].0, ids[0]);
        assert!(s.failures[0].1.contains("already ended (cancelled)"), "{s:?}");
        let mut want: Vec<(String, String)> = ids[1..].iter().map(|i| (i.clone(), format!("b/{i}"))).collect();
        want.sort();
        events.sort();
        assert_eq!(
            events, want,
            "each waiting instance took its event once, with the batch's id"
        );
        for id in &ids[1..] {
            let r = shared.view.get(p, id).expect("the instance");
            assert_eq!(r.snapshot.state_name.as_deref(), Some("Two"), "{id}");
        }
    }

    #[test]
    fn a_migrate_share_moves_each_instance_once_and_names_why_a_missing_version_does_not() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let mut shared = super::super::sim::shared(&rt);
        shared.cfg.batch_rate = 1_000 * shared.partitions as u32;
        let v2 = json!({"id": "sim-seq", "version": "2.0", "name": "Simulated sequence, 2",
        "events": [{"name": "step", "type": "sim.step", "source": "client"}],
        "states": [
            {"name": "One", "start": true, "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["step"]}]}]},
            {"name": "Done", "final": true}
        ]});
        let p = 2;
        let (mut t, _) = Latest::new(0, 0).owner(&shared, p, None, None);
        shared.view.take(p, Default::default(), None);
        let ids: Vec<String> = (0..400)
            .map(|i| format!("m{i}"))
            .filter(|id| partition_of(id, shared.partitions) == p)
            .take(6)
            .collect();
        let mut log = Vec::new();
        let starts: Vec<(i64, Command)> = ids.iter().map(|id| (T0, start(id))).collect();
        let b = batch(&shared, &mut t, &starts);
        commit(&shared, &mut t, b, &mut log);
        // Registered once the instances run version 1.0.
        let m = sm4c_runtime::load(&v2, &mut sm4c_runtime::no_files, sm4c_runtime::LoadOptions::default())
            .expect("version 2 loads");
        shared
            .registry
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(std::sync::Arc::new(m));
        let run = |t: &mut Owner, log: &mut Vec<(String, Vec<u8>)>, id: &str, version: &str, at: i64| {
            let request = json!({"operation": "migrate", "where": {"definition": "sim-seq"}, "version": version});
            let b = batch(
                &shared,
                t,
                &[(
                    at,
                    Command::Batch {
                        id: id.into(),
                        spec: request,
                        created: at,
                    },
                )],
            );
            commit(&shared, t, b, log);
            for k in 1..4 {
                let b = batch(&shared, t, &[(at + 1_000 * k, Command::BatchTick { id: id.into() })]);
                commit(&shared, t, b, log);
            }
            share(t, id)
        };
        let s = run(&mut t, &mut log, "to2", "2.0", T0 + 10);
        assert_eq!((s.phase.as_str(), s.done, s.failed), ("completed", 6, 0), "{s:?}");
        for id in &ids {
            let r = shared.view.get(p, id).expect("the instance");
            assert_eq!(r.snapshot.version, "2.0", "{id}");
        }
        let s = run(&mut t, &mut log, "to9", "9.9", T0 + 10_000);
        assert_eq!((s.phase.as_str(), s.done, s.failed), ("completed", 0, 6), "{s:?}");
        assert!(s.failures.iter().all(|(_, why)| why.contains("9.9")), "{s:?}");
    }
}
