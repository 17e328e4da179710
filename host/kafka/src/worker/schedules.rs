//! Schedules in Kafka mode. A schedule lives on the commands partition its id hashes to, as a
//! record of the partition's own on the state topic ([`crate::wire::schedule_key`]), and its
//! owner decides for it like for any instance:
//!
//! - What `/schedules` asks is a [`Command::Schedule`] on that partition, decided in a batch; the
//!   answer is kept for the API request that waits ([`crate::view::View::take_answer`]).
//! - When a schedule has something to do, the owner proposes a [`Command::ScheduleTick`] (as it
//!   proposes a timer that came due, again every few seconds until it is decided); the tick is
//!   decided at its own timestamp (the proposer's clock: a schedule's times, its catch-up window
//!   and a run's lateness are real times) or the partition's stream time if later, and does not
//!   move the stream time.
//! - A run it starts is a [`Command::Start`] of `<schedule>@<nominal time>`, applied in the batch
//!   when the id hashes to the same partition, or produced to the instance's partition in the
//!   same transaction as the schedule's new state otherwise: the start and the schedule's record
//!   of it commit together or not at all, and a start of an id that exists starts nothing.
//! - A run that ends tells its schedule ([`Command::ScheduleEnded`]), directly when the schedule
//!   is on the same partition, through the schedule's partition otherwise, in the transaction
//!   that ends it; a start that finds its instance ended, or its definition unknown, says so too.
//!
//! A new owner restores the schedules with the partition's other records and wakes each at once
//! if its time has passed: the planner starts the times missed within the catch-up window.

use super::decision::Decision;
use super::{command, Out, Shared, TIMER_RETRY_MS};
use crate::view::Refusal;
use crate::wire::{partition_of, schedule_key, Command, ScheduleCmd, ScheduleRecord, StateRecord, CLOCK_HEADER};
use serde_json::{json, Value};
use sm4c_schedule::{rfc3339, Action, Skipped, Spec, State, UPCOMING};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The schedules of one commands partition.
#[derive(Default)]
pub(super) struct Scheds {
    /// Each schedule's specification and state.
    pub(super) all: BTreeMap<String, (Spec, State)>,
    /// When each next has something to do (ms).
    wakes: sm4c_schedule::Wakes,
    /// Ticks proposed and not decided yet: schedule → when to propose it again (ms). Ordered,
    /// so that what is proposed follows from the inputs alone (the simulation replays seeds).
    proposed: BTreeMap<String, i64>,
    /// Changed by the batch being decided: written (or deleted) in its transaction.
    changed: BTreeSet<String>,
    /// The answers to the API requests the batch being decided: (request token, answer).
    answers: Vec<(String, crate::view::ScheduleAnswer)>,
    /// The skipped counts the metrics were last told, by schedule.
    reported: HashMap<String, Skipped>,
}

impl Scheds {
    /// Takes in a schedule's record, as a restore read it (woken by [`Scheds::wake_all`] once
    /// the partition is placed). One whose specification no longer reads is logged and counted,
    /// and left out.
    pub(super) fn restore(&mut self, id: &str, r: ScheduleRecord) {
        match Spec::from_json(&r.spec) {
            Ok(spec) => {
                self.reported.insert(id.to_string(), r.state.skipped.clone());
                self.all.insert(id.to_string(), (spec, r.state));
            }
            Err(errs) => {
                let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
                tracing::error!(schedule = id, error = %text.join("; "), "a stored schedule's specification no longer reads; it is left out");
                if let Some(o) = sm4c_host::metrics::observer() {
                    o.corrupt_record("schedule");
                }
            }
        }
    }

    /// A restored partition's schedules, woken at `now` (the worker's clock): one whose time
    /// passed while no worker owned it acts at once, and catches up what the window allows.
    pub(super) fn wake_all(&mut self, now: i64) {
        let ids: Vec<String> = self.all.keys().cloned().collect();
        for id in ids {
            self.reindex(&id, now);
        }
    }

    fn unwake(&mut self, id: &str) {
        self.wakes.set(id, None);
    }

    fn reindex(&mut self, id: &str, now: i64) {
        let at = self.all.get(id).and_then(|(spec, state)| state.wake_at(spec, now));
        self.wakes.set(id, at);
    }

    /// The schedules whose tick to propose at `now` (the worker's clock): those whose time came,
    /// and those whose proposed tick was not decided within [`TIMER_RETRY_MS`] (the broker may
    /// not have taken it). A tick decided twice does nothing more.
    pub(super) fn due(&mut self, now: i64) -> Vec<String> {
        let mut out = Vec::new();
        while let Some((t, id)) = self.wakes.first().map(|(t, id)| (t, id.to_string())) {
            if t > now {
                break;
            }
            self.unwake(&id);
            self.proposed.insert(id.clone(), now + TIMER_RETRY_MS);
            out.push(id);
        }
        for (id, at) in self.proposed.iter_mut() {
            if *at <= now && !out.contains(id) {
                *at = now + TIMER_RETRY_MS;
                out.push(id.clone());
            }
        }
        out
    }

    /// The batch is decided at `now` (its stream time): the records of the schedules it
    /// changed, for a transaction numbered `clock` that consumed commands through `through`;
    /// what the API's view takes once it commits; the answers to its API requests.
    #[allow(clippy::type_complexity)]
    pub(super) fn decided(
        &mut self,
        shared: &Shared,
        partition: i32,
        through: i64,
        clock: i64,
        now: i64,
    ) -> (
        Vec<Out>,
        Vec<(String, Option<(Spec, State)>)>,
        Vec<(String, crate::view::ScheduleAnswer)>,
    ) {
        let mut outs = Vec::new();
        let mut changes = Vec::new();
        for id in std::mem::take(&mut self.changed) {
            self.proposed.remove(&id);
            self.reindex(&id, now);
            let kept = self.all.get(&id).cloned();
            let payload = kept.as_ref().map(|(spec, state)| {
                let r = StateRecord {
                    through,
                    clock: Some(clock),
                    schedule: Some(ScheduleRecord {
                        spec: spec.to_json(),
                        state: state.clone(),
                    }),
                    ..StateRecord::default()
                };
                serde_json::to_vec(&r).unwrap_or_default()
            });
            let headers = match payload {
                Some(_) => Vec::new(),
                None => vec![(CLOCK_HEADER.to_string(), clock.to_string().into_bytes())],
            };
            outs.push(Out {
                topic: shared.topics.state.clone(),
                partition: Some(partition),
                key: Some(schedule_key(&id)),
                payload,
                headers,
            });
            changes.push((id, kept));
        }
        (outs, changes, std::mem::take(&mut self.answers))
    }
}

/// A schedule's specification read from JSON, its errors as a refusal.
pub(crate) fn spec_of(doc: &Value) -> Result<Spec, Refusal> {
    Spec::from_json(doc).map_err(|errs| Refusal::Invalid(errs.into_iter().map(|e| (e.pointer, e.message)).collect()))
}

impl Decision<'_> {
    /// Now, for a schedule: the partition's stream time.
    fn sched_now(&self) -> i64 {
        self.t.stream_ms
    }

    /// Decides what `/schedules` asked (request `request`) of schedule `id`.
    pub(super) fn schedule_op(&mut self, id: String, op: ScheduleCmd, request: String, at: i64, offset: i64) {
        let answer = self.schedule_answer(&id, op, at, offset);
        if let Err(why) = &answer {
            tracing::info!(schedule = id, refusal = ?why, "a schedule operation is refused");
        }
        self.t.scheds.answers.push((request, answer));
    }

    fn schedule_answer(&mut self, id: &str, op: ScheduleCmd, at: i64, offset: i64) -> crate::view::ScheduleAnswer {
        let now = self.sched_now();
        let exists = self.t.scheds.all.contains_key(id);
        let unknown = || Err(Refusal::Unknown(id.to_string()));
        match op {
            ScheduleCmd::Create { spec } => {
                let spec = self.registered(&spec)?;
                if spec.id != id {
                    return Err(Refusal::Invalid(vec![(
                        "/id".into(),
                        format!("{:?} is not the schedule {id:?} the command is for", spec.id),
                    )]));
                }
                if exists {
                    return Err(Refusal::Exists(id.to_string()));
                }
                let state = State::new(&spec, now);
                self.t.scheds.all.insert(id.to_string(), (spec, state));
                self.schedule_act(id, Vec::new(), at, offset);
                tracing::info!(schedule = id, "schedule created");
            }
            ScheduleCmd::Replace { spec } if exists => {
                let spec = self.registered(&spec)?;
                if spec.id != id {
                    return Err(Refusal::Invalid(vec![(
                        "/id".into(),
                        format!("{:?} disagrees with the path's schedule {id:?}", spec.id),
                    )]));
                }
                let Some((old, state)) = self.t.scheds.all.get_mut(id) else {
                    return unknown();
                };
                // What it did and owes is kept; a change of `paused` pauses or resumes it.
                let (was, paused) = (state.paused, spec.paused);
                *old = spec;
                let actions = match (was, paused) {
                    (false, true) => state.pause(old, now),
                    (true, false) => state.resume(old, now),
                    _ => Vec::new(),
                };
                self.schedule_act(id, actions, at, offset);
            }
            ScheduleCmd::Delete if exists => {
                self.t.scheds.all.remove(id);
                self.t.scheds.reported.remove(id);
                self.t.scheds.changed.insert(id.to_string());
                tracing::info!(schedule = id, "schedule deleted");
                return Ok(json!({"deleted": id}));
            }
            ScheduleCmd::Backfill { from, to } if exists => {
                let Some((spec, state)) = self.t.scheds.all.get_mut(id) else {
                    return unknown();
                };
                let n = state
                    .backfill(spec, from, to)
                    .map_err(|e| Refusal::Invalid(vec![("/to".into(), e)]))?;
                let actions = state.tick(spec, now);
                self.schedule_act(id, actions, at, offset);
                let mut v = self.schedule_view(id, now);
                v["backfilled"] = json!(n);
                return Ok(v);
            }
            ScheduleCmd::Pause | ScheduleCmd::Resume | ScheduleCmd::Trigger if exists => {
                let Some((spec, state)) = self.t.scheds.all.get_mut(id) else {
                    return unknown();
                };
                let actions = match op {
                    ScheduleCmd::Pause => state.pause(spec, now),
                    ScheduleCmd::Resume => state.resume(spec, now),
                    _ => state.trigger(spec, now),
                };
                self.schedule_act(id, actions, at, offset);
            }
            _ => return unknown(),
        }
        Ok(self.schedule_view(id, now))
    }

    /// A specification, checked; its definition must be registered.
    fn registered(&self, doc: &Value) -> Result<Spec, Refusal> {
        let spec = spec_of(doc)?;
        if self
            .shared
            .machine_or_latest(&spec.definition, spec.version.as_deref())
            .is_none()
        {
            return Err(Refusal::UnknownDefinition(match &spec.version {
                Some(v) => format!("{} version {v}", spec.definition),
                None => spec.definition.clone(),
            }));
        }
        Ok(spec)
    }

    fn schedule_view(&self, id: &str, now: i64) -> Value {
        match self.t.scheds.all.get(id) {
            Some((spec, state)) => sm4c_schedule::view(id, spec, state, now, UPCOMING),
            None => json!({"id": id}),
        }
    }

    /// Schedule `id`'s time came: it acts, once, at the later of the tick's timestamp (the
    /// proposing owner's clock, by which a schedule's times come and how late they are is
    /// judged) and the partition's stream time. The tick does not move the stream time: the
    /// partition's other decisions follow the inputs.
    pub(super) fn schedule_tick(&mut self, id: &str, at: i64, offset: i64) {
        let now = at.max(self.sched_now());
        let Some((spec, state)) = self.t.scheds.all.get_mut(id) else {
            // Deleted since it was proposed.
            self.t.scheds.proposed.remove(id);
            return;
        };
        let actions = state.tick(spec, now);
        self.schedule_act(id, actions, at, offset);
    }

    /// A run of schedule `id` ended with `status`.
    pub(super) fn schedule_ended(&mut self, id: &str, instance: &str, status: &str) {
        let Some((_, state)) = self.t.scheds.all.get_mut(id) else {
            return;
        };
        if state.running.contains(instance) {
            state.ended(instance, status);
            self.t.scheds.changed.insert(id.to_string());
        }
    }

    /// Tells schedule `schedule` that its run `instance` ended with `status`: directly when it is
    /// on this partition, with a command to its partition otherwise, in this transaction.
    pub(super) fn tell_schedule(&mut self, schedule: &str, instance: &str, status: &str) {
        if partition_of(schedule, self.shared.partitions) == self.t.partition {
            self.schedule_ended(schedule, instance, status);
            return;
        }
        let c = Command::ScheduleEnded {
            schedule: schedule.to_string(),
            instance: instance.to_string(),
            status: status.to_string(),
        };
        self.command_for(schedule, c);
    }

    /// Carries out what schedule `id` decided: its starts and cancels go into this batch (the
    /// instance's partition's in this transaction when it is another), with its new state.
    fn schedule_act(&mut self, id: &str, actions: Vec<Action>, at: i64, offset: i64) {
        self.t.scheds.changed.insert(id.to_string());
        let Some((spec, state)) = self.t.scheds.all.get(id) else {
            return;
        };
        if let Some(o) = sm4c_host::metrics::observer() {
            let was = self.t.scheds.reported.entry(id.to_string()).or_default();
            for (why, n) in state.skipped.since(was) {
                o.schedule_skipped(why, n);
            }
            *was = state.skipped.clone();
        }
        let (definition, version, input) = (spec.definition.clone(), spec.version.clone(), spec.input.clone());
        for a in actions {
            let (instance, c) = match a {
                Action::Start {
                    nominal,
                    instance,
                    late,
                } => {
                    tracing::debug!(schedule = id, instance, nominal = %rfc3339(nominal), late_ms = late, "a schedule starts its run");
                    // The run is for its nominal time, a due time like a timer's: the stream time
                    // moves on to it, so a start sent to another partition is stamped no earlier.
                    self.t.stream_ms = self.t.stream_ms.max(nominal);
                    if let Some(o) = sm4c_host::metrics::observer() {
                        o.schedule_run(late as f64 / 1000.0);
                    }
                    let c = Command::Start {
                        id: instance.clone(),
                        definition: definition.clone(),
                        version: version.clone(),
                        input: input.clone(),
                        parent: None,
                        depth: 0,
                        origin: None,
                        request: None,
                        traceparent: None,
                        schedule: Some(id.to_string()),
                        nominal: Some(nominal),
                    };
                    (instance, c)
                }
                Action::Cancel { instance } => {
                    let c = Command::Cancel {
                        id: instance.clone(),
                        reason: format!("schedule {id:?} started its next run (overlap cancelOther)"),
                    };
                    (instance, c)
                }
            };
            if partition_of(&instance, self.shared.partitions) == self.t.partition {
                self.apply(c, at, offset);
            } else {
                self.command_for(&instance, c);
            }
        }
    }
}

/// The command that proposes schedule `id`'s tick, on its partition.
pub(super) fn tick_command(shared: &Shared, id: &str) -> Out {
    let c = Command::ScheduleTick {
        schedule: id.to_string(),
    };
    command(shared, partition_of(id, shared.partitions), Some(id), &c)
}

#[cfg(test)]
mod tests {
    use super::super::decision::tests::decide_commands;
    use super::super::decision::Batch;
    use super::super::restore::Latest;
    use super::super::Owner;
    use crate::view::Refusal;
    use crate::wire::{partition_of, schedule_key, Command, ScheduleCmd, StateRecord};
    use serde_json::{json, Value};

    const T0: i64 = 1_700_000_000_500;

    /// Decides `commands`, each at its time, as one batch of partition `t`.
    fn batch(shared: &crate::Shared, t: &mut Owner, commands: &[(i64, Command)]) -> Batch {
        let b = decide_commands(shared, t, commands);
        t.clock += 1;
        b
    }

    fn op(id: &str, op: ScheduleCmd) -> Command {
        Command::Schedule {
            schedule: id.into(),
            op,
            request: format!("r-{id}"),
        }
    }

    fn commands(shared: &crate::Shared, b: &Batch) -> Vec<(i32, Value)> {
        b.outs
            .iter()
            .filter(|o| o.topic == shared.topics.commands)
            .map(|o| {
                let v = serde_json::from_slice(o.payload.as_deref().unwrap_or_default()).unwrap_or(Value::Null);
                (o.partition.unwrap_or(-1), v)
            })
            .collect()
    }

    fn record(shared: &crate::Shared, b: &Batch, id: &str) -> Option<Option<StateRecord>> {
        b.outs
            .iter()
            .rfind(|o| o.topic == shared.topics.state && o.key.as_deref() == Some(schedule_key(id).as_str()))
            .map(|o| {
                o.payload
                    .as_deref()
                    .map(|p| serde_json::from_slice(p).expect("a state record"))
            })
    }

    #[test]
    fn a_schedules_runs_start_in_the_transaction_that_records_them_wherever_they_hash_and_their_ends_come_back() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = super::super::sim::shared(&rt);
        let id = "s";
        let p = partition_of(id, shared.partitions);
        let (mut t, _) = Latest::new(0, 0).owner(&shared, p, None, None);
        let spec = json!({"id": id, "definition": "sim-tick", "every": "PT1S", "overlap": "allowAll"});
        let b = batch(
            &shared,
            &mut t,
            &[(T0, op(id, ScheduleCmd::Create { spec: spec.clone() }))],
        );
        let (request, answer) = &b.answers[0];
        assert_eq!(request, "r-s");
        let v = answer.as_ref().expect("created");
        assert_eq!(v["nextTimes"][0], "2023-11-14T22:13:21Z", "{v}");
        assert!(
            record(&shared, &b, id).is_some_and(|r| r.is_some()),
            "its record is written"
        );
        // A second create, an unknown schedule and an unregistered definition are refused.
        let mut other = spec.clone();
        other["id"] = json!("t");
        other["definition"] = json!("missing");
        let b = batch(
            &shared,
            &mut t,
            &[
                (T0, op(id, ScheduleCmd::Create { spec: spec.clone() })),
                (T0, op("nope", ScheduleCmd::Pause)),
                (T0, op("t", ScheduleCmd::Create { spec: other })),
            ],
        );
        let refusals: Vec<_> = b.answers.iter().map(|(_, a)| a.clone().err()).collect();
        assert_eq!(
            refusals,
            [
                Some(Refusal::Exists("s".into())),
                Some(Refusal::Unknown("nope".into())),
                Some(Refusal::UnknownDefinition("missing".into()))
            ]
        );
        // Each second's tick starts its time: on this partition in the batch, or as a start
        // command to the instance's partition in the same transaction as the schedule's record.
        let (mut here, mut there) = (Vec::new(), Vec::new());
        for k in 1..40 {
            let at = T0 + 1000 * k;
            let b = batch(&shared, &mut t, &[(at, Command::ScheduleTick { schedule: id.into() })]);
            let nominal = sm4c_schedule::instance_id(id, at - 500);
            let rec = record(&shared, &b, id)
                .flatten()
                .and_then(|r| r.schedule)
                .expect("the record");
            assert_eq!(
                rec.state.recent.back().map(|r| r.instance.as_str()),
                Some(nominal.as_str())
            );
            let starts: Vec<(i32, Value)> = commands(&shared, &b)
                .into_iter()
                .filter(|(_, c)| c["kind"] == "start")
                .collect();
            let q = partition_of(&nominal, shared.partitions);
            if q == p {
                assert!(starts.is_empty(), "{starts:?}");
                // It ran here and ended in this batch: the schedule heard so directly.
                assert!(!rec.state.running.contains(&nominal), "{:?}", rec.state);
                assert_eq!(
                    rec.state.recent.back().and_then(|r| r.outcome.as_deref()),
                    Some("completed")
                );
                here.push(nominal);
            } else {
                assert_eq!(starts.len(), 1, "{starts:?}");
                assert_eq!(starts[0].0, q);
                assert_eq!(starts[0].1["id"], json!(nominal));
                assert_eq!(starts[0].1["schedule"], json!(id));
                assert!(rec.state.running.contains(&nominal), "{:?}", rec.state);
                there.push(nominal);
            }
        }
        assert!(!here.is_empty() && !there.is_empty(), "{here:?} {there:?}");
        // The ticks, the owner's own proposals, did not move the partition's stream time to their
        // timestamps (the proposer's clock); the runs' nominal times, due times like a timer's, did.
        let last = sm4c_schedule::parse_time(there.last().expect("a run").rsplit_once('@').expect("@").1)
            .expect("a time")
            .max(
                sm4c_schedule::parse_time(here.last().expect("a run").rsplit_once('@').expect("@").1).expect("a time"),
            );
        assert_eq!(t.stream_ms, T0.max(last));
        assert!(t.stream_ms < T0 + 39_000, "a tick's timestamp moved the stream time");
        // The run on another partition tells its end back.
        let ended = Command::ScheduleEnded {
            schedule: id.into(),
            instance: there[0].clone(),
            status: "failed".into(),
        };
        let b = batch(&shared, &mut t, &[(T0 + 40_100, ended)]);
        let rec = record(&shared, &b, id)
            .flatten()
            .and_then(|r| r.schedule)
            .expect("the record");
        assert!(!rec.state.running.contains(&there[0]));
        // A new owner restores the schedule as the records left it.
        let mut latest = Latest::new(1_000_000, 1_000_000);
        latest.record(
            Some(schedule_key(id)),
            Some(&serde_json::to_vec(&record(&shared, &b, id).flatten().expect("a record")).expect("json")),
            None,
        );
        let (mut restored, _) = latest.owner(&shared, p, None, None);
        let (_, state) = restored.scheds.all.get(id).expect("restored");
        assert_eq!(*state, rec.state);
        // Deleted: a tombstone, and the view forgets it.
        let b = batch(&shared, &mut restored, &[(T0 + 41_000, op(id, ScheduleCmd::Delete))]);
        assert!(matches!(record(&shared, &b, id), Some(None)), "a tombstone");
        assert_eq!(b.schedules, [(id.to_string(), None)]);
        assert!(restored.scheds.all.is_empty());
    }

    #[test]
    fn a_run_that_finds_its_instance_ended_or_its_definition_gone_tells_its_schedule() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = super::super::sim::shared(&rt);
        let start = |id: &str, definition: &str| Command::Start {
            id: id.into(),
            definition: definition.into(),
            version: None,
            input: json!({}),
            parent: None,
            depth: 0,
            origin: None,
            request: None,
            traceparent: None,
            schedule: Some("elsewhere".into()),
            nominal: None,
        };
        // A run whose id hashes to a partition other than its schedule's.
        let run = (0..100)
            .map(|k| sm4c_schedule::instance_id("elsewhere", T0 - 500 + 1000 * k))
            .find(|r| partition_of(r, shared.partitions) != partition_of("elsewhere", shared.partitions))
            .expect("a run elsewhere");
        let q = partition_of(&run, shared.partitions);
        let (mut t, _) = Latest::new(0, 0).owner(&shared, q, None, None);
        let home = partition_of("elsewhere", shared.partitions);
        let told = |b: &Batch| -> Vec<(i32, Value)> {
            commands(&shared, b)
                .into_iter()
                .filter(|(_, c)| c["kind"] == "scheduleEnded")
                .collect()
        };
        // It runs and ends at once: its end goes to the schedule's partition.
        let b = batch(&shared, &mut t, &[(T0, start(&run, "sim-tick"))]);
        let ends = told(&b);
        assert_eq!(ends.len(), 1, "{ends:?}");
        assert_eq!(ends[0].0, home);
        assert_eq!(ends[0].1["instance"], json!(run));
        assert_eq!(ends[0].1["status"], "completed");
        t.committed(b);
        // Asked for again (a backfill over it): the same instance, its end told again.
        let b = batch(&shared, &mut t, &[(T0 + 1, start(&run, "sim-tick"))]);
        assert_eq!(told(&b).len(), 1);
        assert!(b.records.is_empty(), "no second instance");
        // A definition that is not registered: the run never starts, and the schedule hears so.
        let other = (0..100)
            .map(|k| sm4c_schedule::instance_id("elsewhere", T0 + 500_000 + 1000 * k))
            .find(|r| partition_of(r, shared.partitions) == q)
            .expect("another run on the partition");
        let b = batch(&shared, &mut t, &[(T0 + 2, start(&other, "gone"))]);
        let ends = told(&b);
        assert_eq!(ends.len(), 1, "{ends:?}");
        assert_eq!(ends[0].1["status"], "notStarted");
    }
}
