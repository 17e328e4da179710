//! The decisions of one batch: commands applied to the partition's instances, with no IO; what to
//! produce goes to `outs`, what to do once the batch committed to `after`.

use super::{command, deadletter, sent_event, subflow_start, Applied, Carried, Out, Owner, Shared, Slot};
use crate::wire::{
    self, parked_key, partition_of, tally_key, Command, JournalRecord, Origin, Outcome, Parked, StateRecord,
    CLOCK_HEADER,
};
use serde_json::Value;
use sm4c_host::driver::{self, Answering, ChildStart, Work};
use sm4c_host::tasks::Answer;
use sm4c_runtime::engine::event::attribute_text;
use sm4c_runtime::engine::Scheduled;
use sm4c_runtime::{Input, Machine, Status, Timed};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A batch decided and not committed yet: what its transaction produces and commits, and what to
/// do once it has committed.
pub(super) struct Batch {
    /// The records to produce.
    pub(super) outs: Vec<Out>,
    /// The input offsets to commit with them: (topic, partition, next offset to read).
    pub(super) offsets: Vec<(String, i32, i64)>,
    /// What to do once committed: calls, timers.
    pub(super) after: Vec<(String, Work)>,
    /// Per events partition, the largest event offset the batch applied.
    pub(super) applied: Applied,
    /// The instances that ended: when, and their place in listings ([`crate::view::seq`]).
    pub(super) ended: Vec<(String, (i64, i64))>,
    /// The new record of each instance the batch wrote, `None` for one it deleted: the API's
    /// [`crate::view::View`] takes them once the batch has committed.
    pub(super) records: Vec<(String, Option<crate::wire::InstanceRecord>)>,
    /// The journal records among `outs`: their keys in the local journal, and their places.
    pub(super) journal: Vec<(String, usize)>,
    /// What the partition's local index changes by ([`crate::view::index_changes`]), written to
    /// the local store with the state records.
    pub(super) index: Vec<(String, Option<Vec<u8>>)>,
    /// The partition's stream time once decided: the timestamp of the records the batch
    /// produces, never the deciding worker's clock.
    pub(super) at: i64,
    /// The new specification and state of each schedule the batch changed, `None` for one it
    /// deleted: the API's view takes them once the batch has committed.
    pub(super) schedules: Vec<(String, Option<(sm4c_schedule::Spec, sm4c_schedule::State)>)>,
    /// The answers to the schedule operations of API requests the batch decided.
    pub(super) answers: Vec<(String, crate::view::ScheduleAnswer)>,
    /// The new share of each batch operation the batch changed ([`super::batches`]): the API's
    /// view takes them once the batch has committed.
    pub(super) batches: Vec<(String, sm4c_host::batch::Share)>,
}

/// Decides one batch of a commands partition, with no IO: `records` are the partition's records
/// (offset, timestamp in ms, payload) in order, `hosted` what events partitions' batches bring to
/// its transaction, and `now` a floor for the partition's stream time: the latest timestamp its
/// inputs carried, at which parked events are found for waiting instances (never the worker's
/// clock: what is decided follows the inputs). The
/// owner changes as if the batch committed; [`Owner::committed`] finishes that once it has, and a
/// batch that does not commit leaves the owner to be restored.
pub(super) fn decide<'a>(
    shared: &Shared,
    t: &mut Owner,
    records: impl IntoIterator<Item = (i64, i64, &'a [u8])>,
    hosted: Carried,
    now: i64,
) -> Batch {
    let mut applied = Applied::new();
    let mut d = Decision {
        shared,
        t,
        outs: Vec::new(),
        after: Vec::new(),
        through: -1,
    };
    let resume = d.t.resume;
    d.t.stream_ms = d.t.stream_ms.max(now);
    // Instances whose last state record the restore could not read back: failed from their last
    // readable one, through the driver (a parent learns of it as of any failure), in this batch.
    for (id, why) in std::mem::take(&mut d.t.corrupt) {
        let error = sm4c_runtime::ErrorInfo::new(
            sm4c_runtime::ErrorKind::CorruptRecord,
            format!(
                "the state record of instance {id:?} on {} partition {} cannot be read back: {why}",
                shared.topics.state, d.t.partition
            ),
        )
        .with_details(serde_json::json!({"record": "state"}));
        let at = d.t.stream_ms;
        d.handle(&id, Input::Abort { error }, at);
    }
    for (offset, at, payload) in records.into_iter().filter(|(o, _, _)| *o >= resume) {
        d.through = offset;
        let c = match serde_json::from_slice::<Command>(payload) {
            Ok(c) => c,
            Err(e) => {
                // Not ours to decide, and not to be lost without a word: it goes to the dead
                // letters, in this batch's transaction (counted there by its code).
                let why = format!(
                    "record {offset} of {} partition {} is not a command: {e}",
                    shared.topics.commands, d.t.partition
                );
                let headers = vec![(
                    "sm4c-origin".to_string(),
                    format!("{}/{}/{offset}", shared.topics.commands, d.t.partition).into_bytes(),
                )];
                d.outs
                    .push(deadletter(shared, payload.to_vec(), headers, "notACommand", &why));
                continue;
            }
        };
        // The stream time moves with the timestamps of the inputs that come from outside; the
        // owner's own proposals (a timer, a tick, a barrier, a schedule's tick) carry the
        // proposer's clock, which must not move it: a timer and a tick move it to the due time
        // they name. (A schedule's tick is decided at its own timestamp: see `schedule_tick`.)
        if !matches!(
            c,
            Command::Timer { .. }
                | Command::Tick { .. }
                | Command::Barrier { .. }
                | Command::ScheduleTick { .. }
                | Command::BatchTick { .. }
        ) {
            d.t.stream_ms = d.t.stream_ms.max(at);
        }
        if let Some(o) = c.origin() {
            let e = applied.entry((o.topic.clone(), o.partition)).or_insert(o.offset);
            *e = (*e).max(o.offset);
        }
        if let Command::Barrier { token } = &c {
            if d.t.barrier.as_ref() == Some(token) {
                d.t.barrier = None;
            }
            continue;
        }
        d.guarded(c, at, offset);
    }
    for (c, at, offset) in hosted.inline {
        let at = at.unwrap_or(d.t.stream_ms);
        d.t.stream_ms = d.t.stream_ms.max(at);
        d.guarded(c, at, offset);
    }
    d.unpark(d.t.stream_ms);
    let through = d.through;
    let (sched_outs, schedules, answers) =
        d.t.scheds
            .decided(shared, d.t.partition, through, d.t.clock, d.t.stream_ms);
    let (batch_outs, batches) = d.t.batches.decided(shared, d.t.partition, through, d.t.clock);
    let (new, after) = (d.outs, d.after);
    if through >= 0 {
        t.next_command = through + 1;
    }
    // The partition's position first: a restore repairs the group's offsets from it if they are
    // lost ([`crate::wire::POSITION_KEY`]).
    let position = StateRecord {
        through: t.next_command - 1,
        clock: Some(t.clock),
        stream: Some(t.stream_ms),
        ..StateRecord::default()
    };
    let mut outs = vec![Out {
        topic: shared.topics.state.clone(),
        partition: Some(t.partition),
        key: Some(crate::wire::POSITION_KEY.to_string()),
        payload: Some(serde_json::to_vec(&position).unwrap_or_default()),
        headers: vec![(CLOCK_HEADER.to_string(), t.clock.to_string().into_bytes())],
    }];
    outs.append(&mut t.repair);
    outs.extend(new);
    let clock = Some(t.clock);
    // Stamped no earlier than the events routed in it: a command made of an event carries (at
    // least) the event's time to the partition it goes to, which decides it at that time.
    let stamp = t.stream_ms.max(hosted.latest.unwrap_or(i64::MIN));
    outs.extend(hosted.outs);
    // The new state of every instance touched, and their journals.
    let mut ended = Vec::new();
    let mut records = Vec::new();
    let mut journal = Vec::new();
    for id in std::mem::take(&mut t.resubscribe) {
        for key in t.corr.routed(&id).iter() {
            let c = Command::Subscribe {
                key: key.clone(),
                id: id.clone(),
            };
            outs.push(command(shared, partition_of(key, shared.partitions), Some(key), &c));
        }
    }
    // The touched ones only: a batch costs what it changed, not the partition's size.
    for id in std::mem::take(&mut t.dirty) {
        let Some(s) = t.slots.get_mut(&id) else { continue };
        if s.h.inst.status().is_final() {
            let place = crate::view::seq_of(s.order, t.partition);
            ended.push((id.clone(), (s.h.inst.snapshot().ended_at.unwrap_or(0), place)));
        }
        // The correlation keys it takes events of (as its last step indexed them): the keys'
        // partitions learn of each change in this transaction.
        let keys = t.corr.routed(&id);
        let before = t.corr.routed_before(&id);
        if keys != before {
            for (key, on) in before
                .iter()
                .filter(|k| !keys.contains(k))
                .map(|k| (k, false))
                .chain(keys.iter().filter(|k| !before.contains(k)).map(|k| (k, true)))
            {
                let c = if on {
                    Command::Subscribe {
                        key: key.clone(),
                        id: id.clone(),
                    }
                } else {
                    Command::Unsubscribe {
                        key: key.clone(),
                        id: id.clone(),
                    }
                };
                outs.push(command(shared, partition_of(key, shared.partitions), Some(key), &c));
            }
        }
        let p = t.partition;
        if !s.h.pending.is_empty() {
            // One record per instance and transaction, however many entries it holds.
            let r = JournalRecord {
                through,
                clock,
                seq: s.h.journal_len + 1,
                entries: std::mem::take(&mut s.h.pending),
            };
            s.h.journal_len += r.entries.len() as i64;
            journal.push((super::journal::key(&id, r.seq), outs.len()));
            outs.push(Out {
                topic: shared.topics.journal.clone(),
                partition: Some(p),
                key: Some(id.clone()),
                payload: Some(serde_json::to_vec(&r).unwrap_or_default()),
                headers: Vec::new(),
            });
        }
        let mut r = StateRecord {
            through,
            clock,
            instance: Some(s.record()),
            ..StateRecord::default()
        };
        outs.push(Out {
            topic: shared.topics.state.clone(),
            partition: Some(p),
            key: Some(id.clone()),
            payload: Some(serde_json::to_vec(&r).unwrap_or_default()),
            headers: Vec::new(),
        });
        records.push((id, r.instance.take()));
    }
    outs.extend(t.parking.records(shared, t.partition, through, t.clock));
    outs.extend(sched_outs);
    outs.extend(batch_outs);
    let mut index = Vec::new();
    for (id, r) in &records {
        index.extend(crate::view::index_changes(t.partition, id, r.as_ref(), None));
    }
    t.corr.decided();
    index.extend(t.corr.kept.take());
    // The expired instances' entries leave with their records.
    index.extend(t.ended.kept.take());
    // The subscriptions' changes are written as the state records among `outs`.
    t.parking.subs.skip();
    index.extend(t.far_timers(&after));
    index.append(&mut t.index_next);
    for (id, place) in &t.expired {
        index.extend(crate::view::index_changes(t.partition, id, None, Some(*place)));
        records.push((id.clone(), None));
        outs.push(Out {
            topic: shared.topics.state.clone(),
            partition: Some(t.partition),
            key: Some(id.clone()),
            payload: None,
            headers: vec![(CLOCK_HEADER.to_string(), t.clock.to_string().into_bytes())],
        });
    }
    let mut offsets = Vec::new();
    if through >= 0 {
        offsets.push((shared.topics.commands.clone(), t.partition, through + 1));
    }
    offsets.push((shared.topics.clock.clone(), t.partition, t.clock + 1));
    offsets.extend(hosted.offsets);
    Batch {
        outs,
        offsets,
        after,
        applied,
        ended,
        records,
        journal,
        index,
        at: stamp,
        schedules,
        answers,
        batches,
    }
}

/// The decisions of one batch.
pub(super) struct Decision<'a> {
    pub(super) shared: &'a Shared,
    pub(super) t: &'a mut Owner,
    outs: Vec<Out>,
    after: Vec<(String, Work)>,
    through: i64,
}

impl Decision<'_> {
    /// [`Decision::apply`], a panic in it (a bug of ours; the engine's own are caught by the
    /// driver) caught: it fails only the instance the command is for, and the command goes to the
    /// dead letters with the panic's message (code `panicked`), logged and counted. The batch goes
    /// on: reading it again would panic again, for ever.
    fn guarded(&mut self, c: Command, at: i64, offset: i64) {
        let copy = serde_json::to_vec(&c).unwrap_or_default();
        let id = serde_json::from_slice::<Value>(&copy)
            .ok()
            .and_then(|v| v.get("id").and_then(Value::as_str).map(str::to_string));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.apply(c, at, offset)));
        let Err(panic) = r else { return };
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into());
        tracing::error!(
            partition = self.t.partition,
            offset,
            instance = id.as_deref(),
            panic = what,
            "deciding a command panicked; its instance is failed"
        );
        if let Some(o) = sm4c_host::metrics::observer() {
            o.kafka_panic("decide");
        }
        if let Some(id) = &id {
            let error = sm4c_runtime::ErrorInfo::new(
                sm4c_runtime::ErrorKind::InternalError,
                format!("the worker failed on this instance: {what}"),
            );
            // Failed through the driver, as any failure is: a parent waiting for it learns of it
            // (failing it in place told no parent, which waited for ever: the simulation's panic
            // in a subflow's timer found it), its calls and timers are let go of, and its
            // correlation keys leave the index with it (else its subscriptions stayed). Should
            // that panic too, it is failed in place, and its keys still leave the index. At the
            // partition's stream time, not `at`: a timer's record carries its proposer's clock
            // (the simulation's clock check found a failure decided at it).
            let now = self.t.stream_ms;
            let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.handle(id, sm4c_runtime::Input::Abort { error: error.clone() }, now)
            }));
            if self.t.slot(self.shared, id).is_some() {
                let in_place = match self.t.slots.get_mut(id) {
                    Some(slot) if failed.is_err() || !slot.h.inst.status().is_final() => {
                        if !slot.h.inst.status().is_final() {
                            slot.h.inst.force_fail(error);
                        }
                        self.t.corr.update(id, &slot.h.inst);
                        true
                    }
                    _ => false,
                };
                if in_place {
                    self.ended_run(id);
                }
                self.t.dirty.insert(id.clone());
            }
        }
        let origin = format!("{}/{}/{offset}", self.shared.topics.commands, self.t.partition);
        let why = format!("deciding this command panicked: {what}");
        self.outs.push(deadletter(
            self.shared,
            copy,
            vec![("sm4c-origin".to_string(), origin.into_bytes())],
            "panicked",
            &why,
        ));
    }

    pub(super) fn apply(&mut self, c: Command, at: i64, offset: i64) {
        #[cfg(test)]
        tests::maybe_panic(&c);
        let n = self.shared.partitions;
        match c {
            Command::Start {
                id,
                definition,
                version,
                input,
                parent,
                depth,
                request,
                traceparent,
                schedule,
                nominal,
                ..
            } => {
                let scheduled = schedule
                    .clone()
                    .zip(nominal)
                    .map(|(schedule, nominal_time)| Scheduled { schedule, nominal_time });
                if self.t.ended.contains(&id) {
                    // A schedule's run that exists and ended (a backfill over a time long past):
                    // the schedule follows it as it is.
                    if let Some(schedule) = schedule {
                        let status = self.shared.view.get(self.t.partition, &id).map(|r| r.snapshot.status);
                        let status = status.map_or("ended", |s| s.as_str());
                        self.tell_schedule(&schedule, &id, status);
                    }
                    return;
                }
                if let Some(slot) = self.t.slot(self.shared, &id) {
                    // Started already: the same instance. A schedule asking for it hears when it ends.
                    if schedule.is_some() && slot.schedule.is_none() {
                        slot.schedule = schedule;
                        self.t.dirty.insert(id);
                    }
                    return;
                }
                let m = self.shared.machine_or_latest(&definition, version.as_deref());
                if m.is_none() {
                    tracing::warn!(instance = id, definition, "start of an unknown definition");
                    if let Some(schedule) = &schedule {
                        self.tell_schedule(schedule, &id, "notStarted");
                    }
                }
                let mut h = match parent {
                    Some(parent) => {
                        let start = ChildStart {
                            id: id.clone(),
                            definition,
                            input: input.clone(),
                            parent,
                            depth,
                        };
                        match self.shared.driver.child(&start, m) {
                            Ok(h) => h,
                            Err(notify) => {
                                if let Some(n) = notify {
                                    self.notify(n);
                                }
                                return;
                            }
                        }
                    }
                    None => match m {
                        Some(m) => self.shared.driver.create(m, &id),
                        None => return,
                    },
                };
                h.origin = traceparent;
                let order = self.t.place(at, offset);
                self.t.slots.insert(
                    id.clone(),
                    Box::new(Slot {
                        h,
                        seen: Default::default(),
                        order,
                        request,
                        answered: Vec::new(),
                        recent: Vec::new(),
                        schedule,
                        ticket: 0,
                        used: 0,
                    }),
                );
                self.t.dirty.insert(id.clone());
                self.handle(&id, Input::Start { data: input, scheduled }, at);
            }
            Command::Cancel { id, reason } => {
                if self
                    .t
                    .slot(self.shared, &id)
                    .is_some_and(|s| !s.h.inst.status().is_final())
                {
                    self.handle(&id, Input::Cancel { reason: Some(reason) }, at);
                }
            }
            Command::Migrate { id, version, states } => {
                let _ = self.migrate(&id, &version, &states, at);
            }
            Command::Redrive { id, update } => {
                let _ = self.redrive(&id, update.as_deref(), at);
            }
            Command::Resume { id, step } => {
                if self
                    .t
                    .slot(self.shared, &id)
                    .is_some_and(|s| s.h.inst.status() == Status::Paused)
                {
                    self.handle(&id, Input::Resume { step }, at);
                }
            }
            Command::Event {
                target,
                event,
                origin,
                home,
                expect,
            } => {
                let source = format!("{}/{}", origin.topic, origin.partition);
                match target {
                    Some(id) if self.t.ended.contains(&id) => {
                        let why = format!("instance {id:?} named by sm4cinstanceid has ended");
                        self.dead(&event, &origin, "instanceEnded", &why);
                    }
                    // Read from the local store first when the owner let go of it.
                    Some(id) => match self.t.slot(self.shared, &id) {
                        Some(s) if s.seen.get(&source).is_some_and(|o| *o >= origin.offset) => {
                            tracing::debug!(
                                instance = id,
                                source,
                                offset = origin.offset,
                                "event applied already; skipped"
                            );
                        }
                        Some(s) if s.h.inst.status().is_final() => {
                            let why = format!("instance {id:?} named by sm4cinstanceid has ended");
                            self.dead(&event, &origin, "instanceEnded", &why);
                        }
                        Some(s) if driver::accepts(&s.h.inst, &event) => self.deliver(&id, event, &origin, at),
                        _ => self.park(Parked {
                            event,
                            origin,
                            target: Some(id),
                            home: None,
                            key: None,
                            expect: None,
                            expires: at + self.shared.cfg.event_window_ms,
                        }),
                    },
                    None => {
                        // Only the instances the index says the event may reach are matched. An
                        // event routed by key came the long way, through the key's partition:
                        // events read after it may have reached the instance first, so the mark
                        // of what was applied from its events partition does not judge it (the
                        // event's source and id still do).
                        let mut ids: Vec<String> = Vec::new();
                        for id in self.t.corr.candidates(&event) {
                            let fresh = self.t.slot(self.shared, &id).is_some_and(|s| {
                                expect.is_some() || s.seen.get(&source).is_none_or(|o| *o < origin.offset)
                            });
                            if fresh {
                                ids.push(id);
                            }
                        }
                        ids.retain(|id| self.accepts(id, &event));
                        if ids.is_empty() {
                            self.park(Parked {
                                event,
                                origin,
                                target: None,
                                home,
                                key: None,
                                expect,
                                expires: at + self.shared.cfg.event_window_ms,
                            });
                        } else {
                            for id in ids {
                                self.deliver(&id, event.clone(), &origin, at);
                            }
                        }
                    }
                }
            }
            Command::Keyed { key, event, origin } => {
                // This partition owns the key: the event goes to the partitions of the instances
                // subscribed to it (each matches it as a broadcast, and reports it here if none of
                // its instances takes it), or waits here for a subscription.
                let me = self.t.partition;
                let to: BTreeSet<i32> = self
                    .t
                    .parking
                    .subscribers(&key)
                    .iter()
                    .map(|id| partition_of(id, n))
                    .collect();
                if to.is_empty() {
                    self.park(Parked {
                        event,
                        origin,
                        target: None,
                        home: Some(me),
                        key: Some(key),
                        expect: Some(1),
                        expires: at + self.shared.cfg.event_window_ms,
                    });
                    return;
                }
                let expect = Some(to.len() as u32);
                for q in to {
                    let c = Command::Event {
                        target: None,
                        event: event.clone(),
                        origin: origin.clone(),
                        home: Some(me),
                        expect,
                    };
                    self.outs.push(command(self.shared, q, Some(&key), &c));
                }
            }
            Command::Subscribe { key, id } => {
                if self.t.parking.subscribe(&key, &id) {
                    // The instance's owner confirms it ([`Command::Subscribed`]).
                    let c = Command::Subscribed {
                        key: key.clone(),
                        id: id.clone(),
                    };
                    self.outs
                        .push(command(self.shared, partition_of(&id, n), Some(&id), &c));
                }
                // What waited here for the key goes to the new subscriber's partition, which
                // reports it back if none of its instances takes it.
                let waiting = self.t.parking.parked_for_key(&key);
                if waiting.is_empty() {
                    return;
                }
                let parked: Vec<Parked> = waiting
                    .iter()
                    .filter_map(|k| self.t.parking.parked.get(k).cloned())
                    .collect();
                self.t.parking.remove_all(&waiting);
                let q = partition_of(&id, n);
                for p in parked {
                    let c = Command::Event {
                        target: None,
                        event: p.event,
                        origin: p.origin,
                        home: Some(self.t.partition),
                        expect: Some(1),
                    };
                    self.outs.push(command(self.shared, q, Some(&key), &c));
                }
            }
            Command::Unsubscribe { key, id } => self.t.parking.unsubscribe(&key, &id),
            Command::Subscribed { key, id } => {
                // The instance as this partition's committed decisions left it: unknown or
                // ended instances are not in the index, and take no key's events.
                if !self.t.corr.routed(&id).contains(&key) {
                    let c = Command::Unsubscribe { key: key.clone(), id };
                    self.outs
                        .push(command(self.shared, partition_of(&key, n), Some(&key), &c));
                }
            }
            Command::Result { id, op, outcome } => {
                let driver = self.shared.driver.clone();
                if self.t.slot(self.shared, &id).is_none() {
                    return;
                }
                let Some(s) = self.t.slots.get_mut(&id) else { return };
                if s.h.open_op(&op).is_none() {
                    return;
                }
                self.t.dirty.insert(id.clone());
                let result = match outcome {
                    Outcome::Ok(v) => Ok(v),
                    Outcome::Err(e) => Err(e),
                };
                if let Some(input) = driver.call_done(&mut s.h, &op, result) {
                    self.handle(&id, input, at);
                }
            }
            Command::Answer {
                id,
                op,
                answer,
                event,
                request,
            } => {
                let driver = self.shared.driver.clone();
                let heartbeat = matches!(answer, Answer::Heartbeat(_));
                let answering = match self.t.slot(self.shared, &id) {
                    Some(s) => driver.answer(&mut s.h, &op, answer),
                    None => Answering::Closed,
                };
                let input = match answering {
                    Answering::Open { input } => input,
                    Answering::Closed => {
                        // Answered, timed out or cancelled already (or never a task): a heartbeat
                        // is moot, an answer that came as an event is dead-lettered so it is not
                        // lost unseen.
                        if let (Some((event, origin)), false) = (event, heartbeat) {
                            let why = format!(
                                "task {op:?} of instance {id:?} is closed: it was completed, failed, timed out or cancelled, or never existed"
                            );
                            self.dead(&event, &origin, "taskClosed", &why);
                        }
                        return;
                    }
                };
                if !heartbeat {
                    // Closed from now on: a second answer is turned away.
                    if let Some(s) = self.t.slots.get_mut(&id) {
                        if let Some(r) = request {
                            s.answered.push((op.clone(), r));
                            let over = s.answered.len().saturating_sub(wire::ANSWERS_KEPT);
                            s.answered.drain(..over);
                        }
                        self.t.dirty.insert(id.clone());
                    }
                }
                if let Some(input) = input {
                    self.handle(&id, input, at);
                }
            }
            Command::Timer { id, timer } => {
                let due = self
                    .t
                    .slot(self.shared, &id)
                    .and_then(|s| s.h.inst.snapshot().timers.get(&timer).copied());
                if let Some(due) = due {
                    // Decided at its due time, whenever and by whatever clock it was proposed: a
                    // worker whose clock runs ahead proposes it early, one behind late, and the
                    // proposal's timestamp is that clock's. The stream time moves on to it.
                    self.t.stream_ms = self.t.stream_ms.max(due);
                    self.handle(&id, Input::TimerFired { timer }, due);
                }
            }
            Command::Barrier { .. } => {}
            Command::Schedule { schedule, op, request } => self.schedule_op(schedule, op, request, at, offset),
            Command::ScheduleTick { schedule } => self.schedule_tick(&schedule, at, offset),
            Command::ScheduleEnded {
                schedule,
                instance,
                status,
            } => self.schedule_ended(&schedule, &instance, &status),
            Command::Batch { id, spec, created } => self.batch_new(&id, spec, created),
            Command::BatchTick { id } => self.batch_tick(&id, at, offset),
            Command::BatchStop { id } => self.batch_stop(&id),
            Command::Tick { at: due } => {
                // Decided at the partition's stream time, moved on to the due time the tick was
                // proposed for; never at the proposer's clock (the record's timestamp).
                if let Some(due) = due {
                    self.t.stream_ms = self.t.stream_ms.max(due);
                }
                let at = self.t.stream_ms;
                self.t.expire(at, self.shared.cfg.retention_ms);
                let gone: Vec<(String, Parked)> = self
                    .t
                    .parking
                    .parked
                    .iter()
                    .filter(|(_, p)| p.expires <= at)
                    .map(|(k, p)| (k.clone(), p.clone()))
                    .collect();
                let keys: Vec<String> = gone.iter().map(|(k, _)| k.clone()).collect();
                self.t.parking.remove_all(&keys);
                for (_, p) in gone {
                    match (p.target, p.home) {
                        (Some(id), _) => {
                            let why = format!(
                                "no instance {id:?} (named by sm4cinstanceid) accepted it within the event window"
                            );
                            self.dead(&p.event, &p.origin, "noInstance", &why);
                        }
                        (None, Some(home)) => {
                            let c = Command::Unmatched {
                                key: p.origin.key(),
                                partition: self.t.partition,
                                event: p.event,
                                expect: p.expect,
                            };
                            self.outs.push(command(self.shared, home, None, &c));
                        }
                        (None, None) => {}
                    }
                }
                let window = self.shared.cfg.event_window_ms;
                let parking = &mut self.t.parking;
                let old: Vec<String> = parking
                    .tally
                    .iter()
                    .filter(|(_, (_, _, first))| tally_expiry(*first, window) <= at)
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in old {
                    parking.tally.remove(&k);
                    parking.changed.insert(tally_key(&k));
                }
            }
            Command::Unmatched {
                key,
                partition,
                event,
                expect,
            } => {
                let parking = &mut self.t.parking;
                let entry = parking.tally.entry(key.clone()).or_insert((Vec::new(), event, at));
                if !entry.0.contains(&partition) {
                    entry.0.push(partition);
                }
                parking.changed.insert(tally_key(&key));
                if entry.0.len() as i32 >= expect.map_or(n, |e| e as i32) {
                    let (_, event, _) = parking.tally.remove(&key).unwrap_or_default();
                    let why =
                        "no instance accepted it within the event window (type, source or correlation did not match)";
                    let origin = parse_origin(&key);
                    self.dead(&event, &origin, "noInstance", why);
                }
            }
        }
    }

    pub(super) fn command_for(&mut self, id: &str, c: Command) {
        let p = partition_of(id, self.shared.partitions);
        self.outs.push(command(self.shared, p, Some(id), &c));
    }

    fn dead(&mut self, event: &Value, origin: &Origin, code: &str, why: &str) {
        let headers = vec![
            ("content-type".to_string(), b"application/cloudevents+json".to_vec()),
            ("sm4c-origin".to_string(), origin.key().into_bytes()),
        ];
        let o = deadletter(
            self.shared,
            serde_json::to_vec(event).unwrap_or_default(),
            headers,
            code,
            why,
        );
        self.outs.push(o);
    }

    /// Keeps an event no instance took yet, within the partition's limits. One that does not fit
    /// is never retried: an event for a named instance is dead-lettered with the reason; a
    /// broadcast is reported to its home partition as unmatched here, which dead-letters it once
    /// every partition has.
    fn park(&mut self, p: Parked) {
        let key = parked_key(&p);
        if self.t.parking.parked.contains_key(&key) {
            return;
        }
        let cfg = &self.shared.cfg;
        let size = serde_json::to_vec(&p.event).map(|v| v.len()).unwrap_or(0);
        let refused = if self.t.parking.parked.len() >= cfg.max_parked {
            Some((
                "parkedLimit",
                format!(
                    "no instance took it, and partition {} already holds {} parked events (the limit, --max-parked)",
                    self.t.partition, cfg.max_parked
                ),
            ))
        } else if size > cfg.max_record_bytes {
            Some((
                "tooLarge",
                format!(
                    "no instance took it, and at {size} bytes it is too large to park (the limit is {} bytes)",
                    cfg.max_record_bytes
                ),
            ))
        } else {
            None
        };
        let Some((code, why)) = refused else {
            self.t.parking.changed.insert(key.clone());
            self.t.parking.insert(key, p);
            return;
        };
        match p.home {
            None => self.dead(&p.event, &p.origin, code, &why),
            Some(home) => {
                tracing::warn!(partition = self.t.partition, origin = %p.origin.key(), code, reason = %why, "event not parked");
                let c = Command::Unmatched {
                    key: p.origin.key(),
                    partition: self.t.partition,
                    event: p.event,
                    expect: p.expect,
                };
                self.outs.push(command(self.shared, home, None, &c));
            }
        }
    }

    fn accepts(&mut self, id: &str, event: &Value) -> bool {
        self.t
            .slot(self.shared, id)
            .is_some_and(|s| driver::accepts(&s.h.inst, event))
    }

    /// Sends an input to another instance, through its commands partition.
    fn notify(&mut self, n: driver::Notify) {
        let (op, outcome) = match n.input {
            Input::Completed { op, result } => (op, Outcome::Ok(result)),
            Input::Failed { op, error } => (op, Outcome::Err(error)),
            other => {
                tracing::error!(instance = n.instance, input = ?other, "no command carries this input");
                return;
            }
        };
        let id = n.instance;
        self.command_for(&id.clone(), Command::Result { id, op, outcome });
    }

    pub(super) fn deliver(&mut self, id: &str, event: Value, origin: &Origin, at: i64) {
        self.unpark_older(id, origin, at);
        let pair = (
            attribute_text(&event, "source").unwrap_or_default(),
            attribute_text(&event, "id").unwrap_or_default(),
        );
        if let Some(s) = self.t.slot(self.shared, id) {
            if s.recent.contains(&pair) {
                tracing::debug!(
                    instance = id,
                    source = pair.0,
                    id = pair.1,
                    "a duplicate of an event taken already; skipped"
                );
                return;
            }
            s.recent.push(pair);
            let over = s.recent.len().saturating_sub(wire::EVENTS_KEPT);
            s.recent.drain(..over);
            // A parked event delivered late is older than what the instance saw since: the mark
            // only moves forward, or events applied already would be taken again.
            let mark = s
                .seen
                .entry(format!("{}/{}", origin.topic, origin.partition))
                .or_insert(origin.offset);
            *mark = (*mark).max(origin.offset);
        }
        self.handle(id, Input::Event { event }, at);
    }

    /// Before an event from an events partition is delivered to instance `id`, the events of the
    /// same events partition parked here for it by name go to it first, oldest first, those it
    /// takes: an instance sees each events partition's events in order. Parked events are
    /// otherwise delivered once the batch is decided ([`Decision::unpark`]), after the commands:
    /// simulation seed 6189 caught an instance started in a batch that took an event routed to
    /// it as a command before the older one parked for it until it started.
    fn unpark_older(&mut self, id: &str, origin: &Origin, at: i64) {
        let Some(keys) = self.t.parking.by_target.get(id) else {
            return;
        };
        let mut older: Vec<(usize, String, Parked)> = keys
            .iter()
            .filter_map(|k| {
                let (pos, _, p) = self.t.parking.parked.get_full(k)?;
                let before = p.origin.topic == origin.topic
                    && p.origin.partition == origin.partition
                    && p.origin.offset < origin.offset;
                before.then(|| (pos, k.clone(), p.clone()))
            })
            .collect();
        older.sort_by_key(|(pos, _, _)| *pos);
        for (_, key, p) in older {
            if self.accepts(id, &p.event) {
                self.t.parking.remove_all(std::slice::from_ref(&key));
                self.deliver(id, p.event, &p.origin, at);
            }
        }
    }

    /// Parked events for instances that now wait for them.
    fn unpark(&mut self, at: i64) {
        if self.t.parking.parked.is_empty() {
            return;
        }
        let waiting: Vec<String> = self
            .t
            .dirty
            .iter()
            .filter(|id| {
                self.t
                    .slots
                    .get(*id)
                    .is_some_and(|s| s.h.inst.status() == Status::Waiting)
            })
            .cloned()
            .collect();
        if waiting.is_empty() {
            return;
        }
        // The parked events each of them may take, found through the indexes (no jq), in the
        // order they were parked; jq decides for those only.
        let mut wanted: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for id in &waiting {
            let entries = self.t.corr.entries(id);
            for key in self.t.parking.candidates(id, &entries) {
                if let Some(pos) = self.t.parking.parked.get_index_of(&key) {
                    wanted.entry(pos).or_default().push(id.clone());
                }
            }
        }
        let mut delivered = Vec::new();
        for (pos, ids) in wanted {
            let Some((key, p)) = self
                .t
                .parking
                .parked
                .get_index(pos)
                .map(|(k, p)| (k.clone(), p.clone()))
            else {
                continue;
            };
            let to: Vec<String> = ids.into_iter().filter(|id| self.accepts(id, &p.event)).collect();
            if to.is_empty() {
                continue;
            }
            delivered.push(key);
            for id in to {
                self.deliver(&id, p.event.clone(), &p.origin, at);
            }
        }
        self.t.parking.remove_all(&delivered);
    }

    pub(super) fn handle(&mut self, id: &str, input: Input, at: i64) {
        let shared = self.shared;
        if self.t.slot(shared, id).is_none() {
            return;
        }
        let Some(slot) = self.t.slots.get_mut(id) else { return };
        if slot.h.inst.status().is_final() {
            return;
        }
        // The step debugger: breakpoints changed since the instance last recorded them.
        if let Some(debug) = shared.breakpoints.input_for(&slot.h.inst) {
            shared.driver.step(&mut slot.h, Timed { at, input: debug });
        }
        let step = shared.driver.step(&mut slot.h, Timed { at, input });
        self.stepped(id, step, at);
    }

    /// Moves instance `id` to `version` of its definition (what the API checked may no longer
    /// hold: then nothing changes, and the API's wait for the move ends in its bound). `Err`
    /// says why it did not move.
    pub(super) fn migrate(
        &mut self,
        id: &str,
        version: &str,
        states: &std::collections::BTreeMap<String, String>,
        at: i64,
    ) -> Result<(), String> {
        let shared = self.shared;
        if self.t.slot(shared, id).is_none() {
            return Err(format!("instance {id:?} has ended or does not exist"));
        }
        let Some(slot) = self.t.slots.get_mut(id) else {
            return Err(format!("instance {id:?} has ended or does not exist"));
        };
        let definition = slot.h.inst.machine().id.clone();
        let Some(to) = shared.machine_or_latest(&definition, Some(version)) else {
            tracing::warn!(
                instance = id,
                definition,
                version,
                "a migration names a version this worker does not have"
            );
            return Err(format!(
                "no version {version:?} of definition {definition:?} is registered"
            ));
        };
        match shared.driver.migrate(&mut slot.h, to, states, at) {
            Ok(step) => {
                self.stepped(id, step, at);
                Ok(())
            }
            Err(e) => {
                tracing::info!(instance = id, version, reason = e.reason, "migration refused: {e}");
                Err(sm4c_host::service::HostError::NotMigratable(e).to_string())
            }
        }
    }

    /// Redrives instance `id` (what the API checked may no longer hold: then nothing changes, and
    /// the API's wait for the redrive ends in its bound). `Err` says why it was refused.
    pub(super) fn redrive(&mut self, id: &str, update: Option<&str>, at: i64) -> Result<(), String> {
        let shared = self.shared;
        if self.t.revive(shared, id).is_none() {
            return Err(format!("no instance {id:?}"));
        }
        let Some(slot) = self.t.slots.get_mut(id) else {
            return Err(format!("no instance {id:?}"));
        };
        match shared.driver.redrive(&mut slot.h, update, shared.cfg.max_redrives, at) {
            Ok((_, step)) => {
                self.t.revived(id);
                self.stepped(id, step, at);
                Ok(())
            }
            Err(e) => {
                tracing::info!(instance = id, "redrive refused: {e}");
                Err(sm4c_host::service::redrive_error(e).to_string())
            }
        }
    }

    /// What instance `id`'s step asks for, in this transaction or after it commits.
    fn stepped(&mut self, id: &str, step: sm4c_host::driver::Step, at: i64) {
        let shared = self.shared;
        let Some(slot) = self.t.slots.get_mut(id) else { return };
        self.t.dirty.insert(id.to_string());
        self.t.corr.update(id, &slot.h.inst);
        for work in step.work {
            match work {
                // A worker task goes on its task list topic in this transaction: it is published
                // exactly when the decision to schedule it commits.
                Work::Task { task, .. } => {
                    let topic = shared.topics.task_list(&task.task_list);
                    self.outs.push(sent_event(shared, id, topic, &task.to_event(at), None));
                }
                Work::StartChild(start) => {
                    self.outs.push(subflow_start(shared, &start, slot.h.origin.clone()));
                    // Started once this commits: a parent that does not wait is done with it.
                    slot.h.child_started(&start.parent.op);
                }
                Work::Send { event, hop, .. } => {
                    let topic = sent_topic(slot.h.inst.machine(), &event).unwrap_or_else(|| shared.topics.out.clone());
                    self.outs.push(sent_event(shared, id, topic, &event, hop.as_deref()));
                }
                Work::Stop { op, child } => {
                    let c = Command::Cancel {
                        id: child.clone(),
                        reason: "the parent no longer waits".into(),
                    };
                    let p = partition_of(&child, shared.partitions);
                    self.outs.push(command(shared, p, Some(&child), &c));
                    self.after.push((id.to_string(), Work::Stop { op, child }));
                }
                work @ (Work::Call { .. } | Work::ArmTimer { .. } | Work::CancelTimer { .. }) => {
                    self.after.push((id.to_string(), work))
                }
            }
        }
        if let Some(n) = step.notify {
            self.notify(n);
        }
        self.ended_run(id);
    }

    /// Instance `id`, if it is a schedule's run that has just ended, tells its schedule.
    fn ended_run(&mut self, id: &str) {
        let Some(slot) = self.t.slots.get(id) else { return };
        let status = slot.h.inst.status();
        if let (true, Some(schedule)) = (status.is_final(), slot.schedule.clone()) {
            self.tell_schedule(&schedule, id, status.as_str());
        }
    }
}

/// When a tally entry first reported at `first` is dropped: by then every partition that could
/// report the event has long done so (each parks it for at most one window).
pub(super) fn tally_expiry(first: i64, window: i64) -> i64 {
    first + 2 * window + 60_000
}

/// The topic a sent event goes to: its event definition's `topic` extension.
fn sent_topic(m: &Arc<Machine>, event: &Value) -> Option<String> {
    let ty = attribute_text(event, "type")?;
    m.events
        .iter()
        .find(|d| d.sent_type() == ty && d.topic.is_some())
        .and_then(|d| d.topic.clone())
}

fn parse_origin(key: &str) -> Origin {
    let mut parts = key.rsplitn(3, '/');
    let offset = parts.next().and_then(|s| s.parse().ok()).unwrap_or(-1);
    let partition = parts.next().and_then(|s| s.parse().ok()).unwrap_or(-1);
    let topic = parts.next().unwrap_or_default().to_string();
    Origin {
        topic,
        partition,
        offset,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::decide;

    /// Decides `commands`, each at its time, as one batch of partition `t`, at offsets after the
    /// ones its earlier batches took, with the partition's own stream time as the floor (as the
    /// worker loop does).
    pub(in crate::worker) fn decide_commands(
        shared: &crate::Shared,
        t: &mut super::Owner,
        commands: &[(i64, Command)],
    ) -> super::Batch {
        let payloads: Vec<(i64, Vec<u8>)> = commands
            .iter()
            .map(|(at, c)| (*at, serde_json::to_vec(c).expect("json")))
            .collect();
        let from = t.resume.max(0) + t.clock * 100;
        let records = payloads
            .iter()
            .enumerate()
            .map(|(i, (at, p))| (from + i as i64, *at, p.as_slice()));
        let floor = t.stream_ms;
        decide(shared, t, records, Default::default(), floor)
    }

    thread_local! {
        /// The kind of command whose decision panics, for the test of a panic's containment.
        static PANIC_ON: std::cell::RefCell<Option<&'static str>> = const { std::cell::RefCell::new(None) };
    }

    thread_local! {
        /// The kind of command, and the instance (or the subflows of the instance) whose decision
        /// panics: the simulation's fault of a panic inside a decision ([`panic_for`]).
        static PANIC_FOR: std::cell::RefCell<Option<(&'static str, String)>> = const { std::cell::RefCell::new(None) };
    }

    /// Sets (or with `None` clears) the commands whose decision panics on this thread: those of
    /// `kind` for instance `id` or for any subflow of it (`id/...`), every time one is decided.
    pub(in crate::worker) fn panic_for(target: Option<(&'static str, String)>) {
        PANIC_FOR.with(|p| *p.borrow_mut() = target);
    }

    /// A seam for tests: panics when deciding a command of the kind set in [`PANIC_ON`], or of
    /// the kind and instance set by [`panic_for`].
    pub(super) fn maybe_panic(c: &Command) {
        let v = serde_json::to_value(c).ok();
        let kind = v.as_ref().and_then(|v| {
            v.get("kind")
                .or(v.get("type"))
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        PANIC_ON.with(|p| {
            if let (Some(want), Some(kind)) = (*p.borrow(), &kind) {
                if kind == want {
                    panic!("a bug while deciding {kind}");
                }
            }
        });
        let id = v.as_ref().and_then(|v| v.get("id")).and_then(Value::as_str);
        PANIC_FOR.with(|p| {
            if let (Some((want, of)), Some(kind), Some(id)) = (&*p.borrow(), &kind, id) {
                let mine = id == of || id.strip_prefix(of.as_str()).is_some_and(|r| r.starts_with('/'));
                if kind == want && mine {
                    panic!("a bug while deciding {kind} for {id}");
                }
            }
        });
    }
    use crate::wire::{corr_key, partition_of, Command, Origin};
    use serde_json::{json, Value};

    /// What a batch of `commands` at time `at` makes the owner of partition `p` produce on the
    /// commands topic, and its dead letters' event ids.
    fn run(
        shared: &crate::Shared,
        t: &mut super::Owner,
        commands: &[Command],
        at: i64,
    ) -> (Vec<(i32, Value)>, Vec<String>) {
        let payloads: Vec<Vec<u8>> = commands.iter().map(|c| serde_json::to_vec(c).expect("json")).collect();
        let start = t.resume.max(0) + 1000 * at;
        let records = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| (start + i as i64, at, p.as_slice()));
        let b = decide(shared, t, records, Default::default(), at);
        let mut commands = Vec::new();
        let mut dead = Vec::new();
        for o in b.outs {
            let v: Value = o
                .payload
                .as_deref()
                .and_then(|p| serde_json::from_slice(p).ok())
                .unwrap_or(Value::Null);
            if o.topic == shared.topics.commands {
                commands.push((o.partition.unwrap_or(-1), v));
            } else if o.topic == shared.topics.deadletter {
                dead.push(v["id"].as_str().unwrap_or_default().to_string());
            }
        }
        (commands, dead)
    }

    #[test]
    fn a_panic_while_deciding_a_command_fails_only_its_instance_and_dead_letters_the_command() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = super::super::sim::shared(&rt);
        let start = |id: &str| Command::Start {
            id: id.into(),
            definition: "sim".into(),
            version: None,
            input: json!({"n": 1}),
            parent: None,
            depth: 0,
            origin: None,
            request: None,
            traceparent: None,
            schedule: None,
            nominal: None,
        };
        // Two instances of one partition.
        let ids: Vec<String> = (0..200)
            .map(|i| format!("x{i}"))
            .filter(|id| partition_of(id, shared.partitions) == 0)
            .take(2)
            .collect();
        let (mut t, _) = super::super::restore::Latest::new(0, 0).owner(&shared, 0, None, None);
        run(&shared, &mut t, &[start(&ids[0]), start(&ids[1])], 1);
        let cancel = Command::Cancel {
            id: ids[0].clone(),
            reason: "test".into(),
        };
        let payloads: Vec<Vec<u8>> = [cancel, Command::Tick { at: None }]
            .iter()
            .map(|c| serde_json::to_vec(c).expect("json"))
            .collect();
        PANIC_ON.with(|p| *p.borrow_mut() = Some("cancel"));
        let records: Vec<(i64, i64, &[u8])> =
            vec![(5000, 2, payloads[0].as_slice()), (5001, 2, payloads[1].as_slice())];
        let b = decide(&shared, &mut t, records, Default::default(), 2);
        PANIC_ON.with(|p| *p.borrow_mut() = None);
        // The command is a dead letter that says why.
        let dead: Vec<_> = b.outs.iter().filter(|o| o.topic == shared.topics.deadletter).collect();
        assert_eq!(dead.len(), 1);
        let code = dead[0]
            .headers
            .iter()
            .find(|(k, _)| k == "sm4c-deadletter-code")
            .map(|(_, v)| v.clone());
        assert_eq!(code.as_deref(), Some(&b"panicked"[..]));
        // Its instance failed, with what panicked; the other one is untouched, and the batch went on.
        let failed = t.slot(&shared, &ids[0]).expect("the instance");
        assert_eq!(failed.h.inst.status(), sm4c_runtime::Status::Failed);
        let err = failed.h.inst.snapshot().error.clone().expect("an error");
        assert!(err.message.contains("a bug while deciding cancel"), "{err:?}");
        let other = t.slot(&shared, &ids[1]).expect("the other instance");
        assert!(!other.h.inst.status().is_final());
        assert!(
            b.offsets
                .iter()
                .any(|(topic, p, o)| topic == &shared.topics.commands && *p == 0 && *o == 5002),
            "{:?}",
            b.offsets
        );
        // Its new state is written in the batch's transaction.
        assert!(
            b.records.iter().any(|(id, r)| id == &ids[0] && r.is_some()),
            "the failed instance's record"
        );
    }

    #[test]
    fn the_stream_time_follows_the_inputs_timestamps_and_never_goes_back() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = super::super::sim::shared(&rt);
        let (mut t, _) = super::super::restore::Latest::new(0, 0).owner(&shared, 0, None, None);
        // An input from outside (a cancel of an instance the partition does not hold).
        let cancel = serde_json::to_vec(&Command::Cancel {
            id: "nobody".into(),
            reason: "r".into(),
        })
        .expect("json");
        // The latest timestamp of the batch, whatever the floor the caller gives.
        decide(
            &shared,
            &mut t,
            vec![(0, 7_000, cancel.as_slice()), (1, 5_000, cancel.as_slice())],
            Default::default(),
            1_000,
        );
        assert_eq!(t.stream_ms, 7_000);
        // An older batch (a producer's clock behind) does not take it back.
        decide(
            &shared,
            &mut t,
            vec![(2, 3_000, cancel.as_slice())],
            Default::default(),
            0,
        );
        assert_eq!(t.stream_ms, 7_000);
        // A floor above it moves it on.
        decide(&shared, &mut t, Vec::new(), Default::default(), 9_000);
        assert_eq!(t.stream_ms, 9_000);
    }

    /// Issue 34, item 5: the owner's own proposals carry its clock, which runs ahead or behind;
    /// their timestamps never move the stream time, only the due times they name do.
    #[test]
    fn the_timestamps_of_a_workers_timers_ticks_and_barriers_do_not_move_the_stream_time() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = super::super::sim::shared(&rt);
        let (mut t, _) = super::super::restore::Latest::new(0, 0).owner(&shared, 0, None, None);
        let ahead = 3_600_000;
        let proposals: Vec<Vec<u8>> = [
            Command::Tick { at: None },
            Command::Timer {
                id: "nobody".into(),
                timer: "t".into(),
            },
            Command::Barrier { token: "b".into() },
        ]
        .iter()
        .map(|c| serde_json::to_vec(c).expect("json"))
        .collect();
        let records = proposals
            .iter()
            .enumerate()
            .map(|(i, p)| (i as i64, ahead, p.as_slice()));
        decide(&shared, &mut t, records, Default::default(), 2_000);
        assert_eq!(t.stream_ms, 2_000, "a clock an hour ahead moved the stream time");
        // A tick names what came due: the stream time moves on to that.
        let tick = serde_json::to_vec(&Command::Tick { at: Some(4_000) }).expect("json");
        decide(
            &shared,
            &mut t,
            vec![(3, ahead, tick.as_slice())],
            Default::default(),
            0,
        );
        assert_eq!(t.stream_ms, 4_000);
    }

    /// Issue 34, item 5: an event record without a timestamp is taken at the stream time of the
    /// partition that decides it, not at the clock of the worker that routed it.
    #[test]
    fn an_event_record_without_a_timestamp_is_taken_at_the_stream_time() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = super::super::sim::shared(&rt);
        let event =
            json!({"specversion": "1.0", "id": "e1", "source": "client", "type": "sim.go", "sm4cinstanceid": "nobody"});
        let m = rdkafka::message::OwnedMessage::new(
            Some(event.to_string().into_bytes()),
            None,
            "sim.events".to_string(),
            rdkafka::Timestamp::NotAvailable,
            0,
            7,
            None,
        );
        let plan = super::super::route::plan(&shared, "sim.events", 0, vec![m]);
        assert_eq!(plan.cmds.len(), 1);
        assert_eq!(plan.cmds[0].3, None);
        let (mut t, _) = super::super::restore::Latest::new(0, 0).owner(&shared, 0, None, None);
        let carried = super::super::Carried {
            inline: plan.cmds.into_iter().map(|(_, _, c, at, o)| (c, at, o)).collect(),
            ..Default::default()
        };
        decide(&shared, &mut t, Vec::new(), carried, 4_000);
        // Parked (no such instance) for the window from the stream time.
        assert_eq!(
            t.parking.parked.values().map(|p| p.expires).collect::<Vec<_>>(),
            [4_000 + shared.cfg.event_window_ms]
        );
        assert_eq!(t.stream_ms, 4_000);
    }

    /// Issue 34, item 5: a timer is decided at its due time, whatever the clock of the worker that
    /// proposed it said (an hour ahead here).
    #[test]
    fn a_timer_proposed_by_a_clock_ahead_fires_at_its_due_time() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = super::super::sim::shared(&rt);
        let (mut t, _) = super::super::restore::Latest::new(0, 0).owner(&shared, 0, None, None);
        // The simulation's subflow waits 10 s as it starts.
        let start = serde_json::to_vec(&Command::Start {
            id: "c".into(),
            definition: "sim-child".into(),
            version: None,
            input: json!({}),
            parent: None,
            depth: 0,
            origin: None,
            request: None,
            traceparent: None,
            schedule: None,
            nominal: None,
        })
        .expect("json");
        decide(
            &shared,
            &mut t,
            vec![(0, 1_000, start.as_slice())],
            Default::default(),
            0,
        );
        let due = t.slots["c"].h.inst.snapshot().timers.values().copied().next();
        assert_eq!(due, Some(11_000));
        let timer = t.slots["c"]
            .h
            .inst
            .snapshot()
            .timers
            .keys()
            .next()
            .cloned()
            .unwrap_or_default();
        let fire = serde_json::to_vec(&Command::Timer { id: "c".into(), timer }).expect("json");
        let b = decide(
            &shared,
            &mut t,
            vec![(1, 3_601_000, fire.as_slice())],
            Default::default(),
            0,
        );
        assert_eq!(
            b.ended
                .iter()
                .map(|(id, (at, _))| (id.as_str(), *at))
                .collect::<Vec<_>>(),
            [("c", 11_000)]
        );
        assert_eq!(t.stream_ms, 11_000);
        // What the batch produces is stamped with that stream time, not the proposer's clock.
        assert_eq!(b.at, 11_000);
    }

    /// Issue 34, item 5: a tick drops parked events past their window and deletes ended instances
    /// past their retention by the partition's stream time: a tick whose proposer's clock runs
    /// ahead (its timestamp) decides nothing early.
    #[test]
    fn a_tick_drops_parked_events_and_deletes_ended_instances_at_the_stream_time_not_its_proposers_clock() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = super::super::sim::shared(&rt);
        let (window, retention) = (shared.cfg.event_window_ms, shared.cfg.retention_ms);
        let (mut t, _) = super::super::restore::Latest::new(0, 0).owner(&shared, 0, None, None);
        t.ended.insert("old", 1_000, 1);
        let event = serde_json::to_vec(&Command::Event {
            target: Some("nobody".into()),
            event: json!({"specversion": "1.0", "id": "e1", "source": "client", "type": "sim.go"}),
            origin: Origin {
                topic: "sim.events".into(),
                partition: 0,
                offset: 1,
            },
            home: None,
            expect: None,
        })
        .expect("json");
        decide(
            &shared,
            &mut t,
            vec![(0, 5_000, event.as_slice())],
            Default::default(),
            0,
        );
        assert_eq!(
            t.parking.parked.values().map(|p| p.expires).collect::<Vec<_>>(),
            [5_000 + window]
        );
        let tick = |at: Option<i64>| serde_json::to_vec(&Command::Tick { at }).expect("json");
        let dead = |b: &super::Batch| b.outs.iter().filter(|o| o.topic == shared.topics.deadletter).count();
        let deleted = |b: &super::Batch| b.records.iter().filter(|(_, r)| r.is_none()).count();
        // Stamped by a clock past both the window and the retention: nothing is due in stream time.
        let far = 1_000 + retention + window;
        let b = decide(
            &shared,
            &mut t,
            vec![(1, far, tick(None).as_slice())],
            Default::default(),
            0,
        );
        assert_eq!((dead(&b), deleted(&b), t.parking.parked.len()), (0, 0, 1));
        t.committed(b);
        // The window's end, named by the tick: the event goes, the ended instance stays.
        let b = decide(
            &shared,
            &mut t,
            vec![(2, far, tick(Some(5_000 + window)).as_slice())],
            Default::default(),
            0,
        );
        assert_eq!((dead(&b), deleted(&b), t.parking.parked.len()), (1, 0, 0));
        t.committed(b);
        assert!(t.ended.contains("old"));
        // Its retention's end: it is deleted.
        let b = decide(
            &shared,
            &mut t,
            vec![(3, 0, tick(Some(1_000 + retention)).as_slice())],
            Default::default(),
            0,
        );
        assert_eq!(
            b.records
                .iter()
                .map(|(id, r)| (id.as_str(), r.is_none()))
                .collect::<Vec<_>>(),
            [("old", true)]
        );
        t.committed(b);
        assert!(!t.ended.contains("old"));
    }

    /// Issue 34, item 5: the worker's clock says when a tick is proposed; the tick names the due
    /// time of what came due, not the clock's reading.
    #[test]
    fn a_tick_names_the_due_time_it_is_proposed_for_not_the_clock() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = super::super::sim::shared(&rt);
        let (window, retention) = (shared.cfg.event_window_ms, shared.cfg.retention_ms);
        let (mut t, _) = super::super::restore::Latest::new(0, 0).owner(&shared, 0, None, None);
        t.ended.insert("old", 1_000, 1);
        t.ended.insert("older", 500, 2);
        let parked = crate::wire::Parked {
            event: json!({"id": "e1"}),
            origin: Origin {
                topic: "sim.events".into(),
                partition: 0,
                offset: 1,
            },
            target: Some("nobody".into()),
            home: None,
            key: None,
            expect: None,
            expires: 5_000 + window,
        };
        t.parking.insert(crate::wire::parked_key(&parked), parked);
        assert_eq!(t.tick_at(5_000 + window - 1, window, retention), None);
        assert_eq!(
            t.tick_at(5_000 + window + 60_000, window, retention),
            Some(5_000 + window)
        );
        // Both ended instances are past their retention by this clock: the tick names the later.
        let clock = 1_000 + retention + 3_600_000;
        assert_eq!(t.tick_at(clock, window, retention), Some(1_000 + retention));
    }

    #[test]
    fn a_record_that_is_not_a_command_goes_to_the_dead_letters_with_its_reason_and_the_batch_goes_on() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = super::super::sim::shared(&rt);
        let (mut t, _) = super::super::restore::Latest::new(0, 0).owner(&shared, 1, None, None);
        let tick = serde_json::to_vec(&Command::Tick { at: None }).expect("json");
        let records = vec![(0, 5, &b"{not json"[..]), (1, 5, tick.as_slice())];
        let b = decide(&shared, &mut t, records, Default::default(), 5);
        let dead: Vec<_> = b.outs.iter().filter(|o| o.topic == shared.topics.deadletter).collect();
        assert_eq!(dead.len(), 1, "one dead letter");
        assert_eq!(
            dead[0].payload.as_deref(),
            Some(&b"{not json"[..]),
            "the record as it was"
        );
        let header = |k: &str| {
            dead[0]
                .headers
                .iter()
                .find(|(h, _)| h == k)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        assert_eq!(header("sm4c-deadletter-code").as_deref(), Some("notACommand"));
        let reason = header("sm4c-deadletter-reason").expect("a reason");
        assert!(reason.contains("record 0 of sim.commands partition 1"), "{reason}");
        assert_eq!(header("sm4c-origin").as_deref(), Some("sim.commands/1/0"));
        // The batch went through both records: the next one read is the one after.
        assert!(
            b.offsets
                .iter()
                .any(|(topic, p, o)| topic == &shared.topics.commands && *p == 1 && *o == 2),
            "{:?}",
            b.offsets
        );
    }

    #[test]
    fn the_partition_of_a_key_hands_its_events_to_the_subscribers_partitions_or_keeps_them_for_one() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = super::super::sim::shared(&rt);
        let n = shared.partitions;
        let key = corr_key("order", "o-1");
        let me = partition_of(&key, n);
        let (mut t, _) = super::super::restore::Latest::new(0, 0).owner(&shared, me, None, None);
        // Two instances on two other partitions.
        let ids: Vec<String> = {
            let mut seen = std::collections::BTreeSet::new();
            (0..100)
                .map(|i| format!("s{i}"))
                .filter(|id| partition_of(id, n) != me && seen.insert(partition_of(id, n)))
                .take(2)
                .collect()
        };
        let origin = |offset| Origin {
            topic: "sim.events".into(),
            partition: 0,
            offset,
        };
        let event =
            |id: &str| json!({"specversion": "1.0", "id": id, "source": "client", "type": "sim.go", "order": "o-1"});
        let keyed = |id: &str, offset| Command::Keyed {
            key: key.clone(),
            event: event(id),
            origin: origin(offset),
        };

        // No subscriber: the event waits here, a parked record keyed by nothing else.
        let (out, dead) = run(&shared, &mut t, &[keyed("e1", 1)], 1_000);
        assert!(out.is_empty() && dead.is_empty(), "{out:?}");
        assert_eq!(t.parking.parked_for_key(&key).len(), 1);
        // The first subscription takes it to the subscriber's partition, which reports to this
        // one, the home, if none of its instances takes it.
        let sub = |id: &str| Command::Subscribe {
            key: key.clone(),
            id: id.to_string(),
        };
        // And the subscriber's partition is asked to confirm the new subscription.
        let (mut out, _) = run(&shared, &mut t, &[sub(&ids[0])], 2_000);
        assert_eq!(out.len(), 2, "{out:?}");
        let (q, c) = out.remove(0);
        assert_eq!(q, partition_of(&ids[0], n));
        assert_eq!(
            (c["kind"].as_str(), c["id"].as_str()),
            (Some("subscribed"), Some(ids[0].as_str()))
        );
        // Asked to confirm the subscription of an instance it does not hold (one whose Subscribe
        // came from an aborted transaction a broker showed), a partition takes it back.
        let confirm = Command::Subscribed {
            key: key.clone(),
            id: "nobody".into(),
        };
        let (back, _) = run(&shared, &mut t, &[confirm], 2_000);
        assert_eq!(back.len(), 1, "{back:?}");
        assert_eq!(back[0].0, partition_of(&key, n));
        assert_eq!(
            (back[0].1["kind"].as_str(), back[0].1["id"].as_str()),
            (Some("unsubscribe"), Some("nobody"))
        );
        // A subscription it holds already is not confirmed again.
        let (again, _) = run(&shared, &mut t, &[sub(&ids[0])], 2_000);
        assert!(again.is_empty(), "{again:?}");
        let (q, c) = &out[0];
        assert_eq!(*q, partition_of(&ids[0], n));
        assert_eq!(
            (c["kind"].as_str(), c["home"].as_i64(), c["expect"].as_u64()),
            (Some("event"), Some(me as i64), Some(1))
        );
        assert_eq!(c["event"]["id"], "e1");
        assert!(t.parking.parked.is_empty() && t.parking.by_key.is_empty());
        // With two subscribers on two partitions, an event goes to both, each expected to report.
        let (out, _) = run(&shared, &mut t, &[sub(&ids[1]), keyed("e2", 2)], 3_000);
        let out: Vec<_> = out.into_iter().filter(|(_, c)| c["kind"] != "subscribed").collect();
        let mut to: Vec<i32> = out.iter().map(|(q, _)| *q).collect();
        to.sort();
        let mut want: Vec<i32> = ids.iter().map(|id| partition_of(id, n)).collect();
        want.sort();
        assert_eq!(to, want, "{out:?}");
        assert!(
            out.iter().all(|(_, c)| c["expect"] == 2 && c["event"]["id"] == "e2"),
            "{out:?}"
        );
        // Dead-lettered once both partitions said no instance took it, not before.
        let unmatched = |q: i32| Command::Unmatched {
            key: origin(2).key(),
            partition: q,
            event: event("e2"),
            expect: Some(2),
        };
        let (_, dead) = run(&shared, &mut t, &[unmatched(want[0]), unmatched(want[0])], 4_000);
        assert!(dead.is_empty());
        let (_, dead) = run(&shared, &mut t, &[unmatched(want[1])], 5_000);
        assert_eq!(dead, ["e2"]);
        // Unsubscribed, the key's events wait here again; past the window a tick reports the
        // event to this partition itself, which dead-letters it.
        let unsub = |id: &str| Command::Unsubscribe {
            key: key.clone(),
            id: id.to_string(),
        };
        let (out, _) = run(
            &shared,
            &mut t,
            &[unsub(&ids[0]), unsub(&ids[1]), keyed("e3", 3)],
            6_000,
        );
        assert!(out.is_empty(), "{out:?}");
        assert!(t.parking.subscribers(&key).is_empty());
        let later = 6_000 + shared.cfg.event_window_ms;
        let (out, _) = run(&shared, &mut t, &[Command::Tick { at: None }], later);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(
            (out[0].0, out[0].1["kind"].as_str(), out[0].1["expect"].as_u64()),
            (me, Some("unmatched"), Some(1))
        );
        let report: Command = serde_json::from_value(out[0].1.clone()).expect("a command");
        let (_, dead) = run(&shared, &mut t, &[report], later + 1);
        assert_eq!(dead, ["e3"]);
    }
}
