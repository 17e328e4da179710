//! Schedules in the durable host: each schedule's specification and state are rows of the store,
//! written in the batch that starts (or cancels) its instances, so a start and the schedule's
//! record of it are durable together; the instance's id is its nominal time, so a start repeated
//! after a crash is the same start. The deciding task fires them from its loop, as it fires timers.

use super::{now_ms, Loop};
use serde_json::{json, Value};
use sm4c_host::service::{HostError, ScheduleOp};
use sm4c_runtime::engine::Scheduled;
use sm4c_runtime::{Input, Status};
use sm4c_schedule::{rfc3339, Action, Spec, State, Wakes, UPCOMING};
use std::collections::{BTreeMap, BTreeSet};

/// The schedules a durable host keeps, in memory beside the store.
#[derive(Default)]
pub(super) struct Schedules {
    all: BTreeMap<String, (Spec, State)>,
    /// When each schedule next has something to do.
    wakes: Wakes,
    /// Changed in this batch: written (or deleted) with it.
    dirty: BTreeSet<String>,
    /// Schedules that started a run in this batch: woken again only once it is decided (a tick
    /// before would see the run as running).
    held: BTreeSet<String>,
    /// The skipped counts the metrics were last told, by schedule.
    reported: BTreeMap<String, sm4c_schedule::Skipped>,
}

impl Schedules {
    /// Whether the batch has schedules to write.
    pub(super) fn changed(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// The next time one has something to do.
    pub(super) fn next_wake(&self) -> Option<i64> {
        self.wakes.first().map(|(t, _)| t)
    }

    fn unwake(&mut self, id: &str) {
        self.wakes.set(id, None);
    }

    fn reindex(&mut self, id: &str, now: i64) {
        let at = self.all.get(id).and_then(|(spec, state)| state.wake_at(spec, now));
        self.wakes.set(id, at);
    }
}

impl Loop {
    /// Reads the schedules from the store (at start, and after a batch the store refused). A row
    /// that cannot be read back is logged and counted, and left out.
    pub(super) fn load_schedules(&mut self) -> Result<(), crate::store::StoreError> {
        let now = now_ms();
        let mut s = Schedules::default();
        for (id, row) in self.store.schedules()? {
            let read = row.and_then(|(spec, state)| {
                let spec = Spec::from_json(&spec).map_err(|errs| {
                    let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
                    format!("its specification no longer reads: {}", text.join("; "))
                })?;
                let state: State =
                    serde_json::from_value(state).map_err(|e| format!("its state does not read: {e}"))?;
                Ok((spec, state))
            });
            match read {
                Ok(pair) => {
                    s.reported.insert(id.clone(), pair.1.skipped.clone());
                    s.all.insert(id.clone(), pair);
                    s.reindex(&id, now);
                }
                Err(why) => {
                    tracing::error!(schedule = %id, error = %why, "a stored schedule cannot be read back; it is left out");
                    if let Some(o) = sm4c_host::metrics::observer() {
                        o.corrupt_record("schedule");
                    }
                }
            }
        }
        self.schedules = s;
        Ok(())
    }

    /// The schedules whose time has come act, once each: their starts and cancels go into this
    /// batch. One that has more to do is woken again once this batch is decided (a second tick now
    /// would see its new run as still running).
    pub(super) fn fire_schedules(&mut self, now: i64) {
        // At most a batch's worth at a time: each start is an instance created in memory and
        // written with its batch, so ten thousand schedules due in the same second are decided a
        // batch at a time as the loop comes back, rather than all created at once and written
        // (then read back) before most of them run.
        let room = self.limits.batch.saturating_sub(self.queue.len());
        let due = self.schedules.wakes.due(now, room);
        for id in due {
            self.schedules.unwake(&id);
            self.reconcile(&id);
            let Some((spec, state)) = self.schedules.all.get_mut(&id) else {
                continue;
            };
            let actions = state.tick(spec, now);
            self.act(&id, actions, now);
        }
    }

    /// An instance ended with `status`: the schedule that started it (its id is
    /// `<schedule>@<time>`) is told.
    pub(super) fn schedule_ended(&mut self, instance: &str, status: Status) {
        let Some((schedule, _)) = instance.split_once('@') else {
            return;
        };
        let Some((_, state)) = self.schedules.all.get_mut(schedule) else {
            return;
        };
        if state.running.contains(instance) {
            state.ended(instance, status.as_str());
            self.schedules.dirty.insert(schedule.to_string());
            if !self.schedules.held.contains(schedule) {
                self.schedules.reindex(schedule, now_ms());
            }
        }
    }

    /// Instances a schedule believes running that ended without a step telling it (failed by a
    /// recovery, or gone): it is told now, before it decides an overlap on them.
    fn reconcile(&mut self, id: &str) {
        let Some((_, state)) = self.schedules.all.get(id) else {
            return;
        };
        let running: Vec<String> = state.running.iter().cloned().collect();
        for instance in running {
            let status = match self.cache.get(&instance) {
                Some(slot) => Some(slot.h.inst.status()),
                None => match self.store.instance(&instance) {
                    Ok(Some(stored)) => Some(stored.snapshot.status),
                    // Never written (its start was refused): it does not run.
                    Ok(None) => Some(Status::Failed),
                    Err(_) => None,
                },
            };
            if let Some(s) = status.filter(|s| s.is_final()) {
                self.schedule_ended(&instance, s);
            }
        }
    }

    /// Carries out what schedule `id` decided.
    fn act(&mut self, id: &str, actions: Vec<Action>, now: i64) {
        if let (Some((_, state)), Some(o)) = (self.schedules.all.get(id), sm4c_host::metrics::observer()) {
            let was = self.schedules.reported.entry(id.to_string()).or_default();
            for (why, n) in state.skipped.since(was) {
                o.schedule_skipped(why, n);
            }
            *was = state.skipped.clone();
        }
        let started = actions.iter().any(|a| matches!(a, Action::Start { .. }));
        for a in actions {
            match a {
                Action::Start {
                    nominal,
                    instance,
                    late,
                } => self.start_scheduled(id, nominal, &instance, late),
                Action::Cancel { instance } => self.queue.push((
                    instance,
                    Input::Cancel {
                        reason: Some(format!("schedule {id:?} started its next run (overlap cancelOther)")),
                    },
                )),
            }
        }
        self.schedules.dirty.insert(id.to_string());
        match started {
            true => {
                self.schedules.unwake(id);
                self.schedules.held.insert(id.to_string());
            }
            false if !self.schedules.held.contains(id) => self.schedules.reindex(id, now),
            false => {}
        }
    }

    /// The batch is written: schedules that started runs in it are woken again.
    pub(super) fn schedules_written(&mut self) {
        let now = now_ms();
        for id in std::mem::take(&mut self.schedules.held) {
            self.schedules.reindex(&id, now);
        }
    }

    fn start_scheduled(&mut self, schedule: &str, nominal: i64, instance: &str, late: i64) {
        let Some((spec, state)) = self.schedules.all.get_mut(schedule) else {
            return;
        };
        let m = self
            .registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&spec.definition, spec.version.as_deref());
        let Some(m) = m else {
            tracing::error!(schedule, instance, definition = %spec.definition, "a schedule's definition is not registered; its run is not started");
            state.ended(instance, "notStarted");
            return;
        };
        // Started before (a backfill asked again for a time long past): the same instance, not a
        // second one; the schedule follows it as it is.
        let status = match self.cache.get(instance) {
            Some(slot) => Some(slot.h.inst.status()),
            None => match self.store.instance(instance) {
                Ok(Some(stored)) => Some(stored.snapshot.status),
                Ok(None) => None,
                Err(e) => {
                    tracing::error!(schedule, instance, error = %e, "cannot tell whether a schedule's run exists; it is not started");
                    Some(Status::Failed)
                }
            },
        };
        if let Some(status) = status {
            if status.is_final() {
                state.ended(instance, status.as_str());
            }
            return;
        }
        let input = spec.input.clone();
        tracing::debug!(schedule, instance, nominal = %rfc3339(nominal), late_ms = late, "a schedule starts its run");
        if let Some(o) = sm4c_host::metrics::observer() {
            o.schedule_run(late as f64 / 1000.0);
        }
        self.create(instance, m, None);
        let scheduled = Some(Scheduled {
            schedule: schedule.to_string(),
            nominal_time: nominal,
        });
        self.queue
            .push((instance.to_string(), Input::Start { data: input, scheduled }));
    }

    /// Writes the changed schedules into the batch.
    pub(super) fn write_schedules(&mut self) {
        for id in std::mem::take(&mut self.schedules.dirty) {
            let row = self
                .schedules
                .all
                .get(&id)
                .map(|(spec, state)| (spec.to_json(), serde_json::to_value(state).unwrap_or(Value::Null)));
            self.batch.schedules.push((id, row));
        }
    }

    /// Does what `/schedules` asks: what to answer once the batch is written (writes) or at once
    /// (reads, and refusals).
    pub(super) fn schedule_op(&mut self, op: ScheduleOp) -> Result<Value, HostError> {
        let now = now_ms();
        let exists = |s: &Schedules, id: &str| match s.all.contains_key(id) {
            true => Ok(()),
            false => Err(HostError::UnknownSchedule(id.to_string())),
        };
        match op {
            ScheduleOp::List => {
                let all: Vec<Value> = self.schedules.all.keys().map(|id| self.view(id, now, 1)).collect();
                Ok(json!({"schedules": all}))
            }
            ScheduleOp::Get(id) => {
                exists(&self.schedules, &id)?;
                Ok(self.view(&id, now, UPCOMING))
            }
            ScheduleOp::Create(doc) => {
                let spec = self.spec_of(&doc)?;
                if self.schedules.all.contains_key(&spec.id) {
                    return Err(HostError::ScheduleExists(spec.id));
                }
                let id = spec.id.clone();
                let state = State::new(&spec, now);
                self.schedules.all.insert(id.clone(), (spec, state));
                self.act(&id, Vec::new(), now);
                tracing::info!(schedule = %id, "schedule created");
                Ok(self.view(&id, now, UPCOMING))
            }
            ScheduleOp::Replace(id, mut doc) => {
                exists(&self.schedules, &id)?;
                sm4c_schedule::path_id(&mut doc, &id)
                    .map_err(|why| HostError::InvalidSchedule(vec![("/id".into(), why)]))?;
                let spec = self.spec_of(&doc)?;
                let Some((old, state)) = self.schedules.all.get_mut(&id) else {
                    return Err(HostError::UnknownSchedule(id));
                };
                // What it did and owes is kept; a change of `paused` pauses or resumes it.
                let (was, now_paused) = (state.paused, spec.paused);
                *old = spec;
                let actions = match (was, now_paused) {
                    (false, true) => state.pause(old, now),
                    (true, false) => state.resume(old, now),
                    _ => Vec::new(),
                };
                self.act(&id, actions, now);
                Ok(self.view(&id, now, UPCOMING))
            }
            ScheduleOp::Delete(id) => {
                exists(&self.schedules, &id)?;
                self.schedules.all.remove(&id);
                self.schedules.reported.remove(&id);
                self.schedules.reindex(&id, now);
                self.schedules.dirty.insert(id.clone());
                tracing::info!(schedule = %id, "schedule deleted");
                Ok(json!({"deleted": id}))
            }
            ScheduleOp::Pause(id) | ScheduleOp::Resume(id) | ScheduleOp::Trigger(id)
                if !self.schedules.all.contains_key(&id) =>
            {
                Err(HostError::UnknownSchedule(id))
            }
            ScheduleOp::Pause(id) => self.operate(&id, now, |spec, state| state.pause(spec, now)),
            ScheduleOp::Resume(id) => self.operate(&id, now, |spec, state| state.resume(spec, now)),
            ScheduleOp::Trigger(id) => {
                self.reconcile(&id);
                self.operate(&id, now, |spec, state| state.trigger(spec, now))
            }
            ScheduleOp::Backfill { id, from, to } => {
                exists(&self.schedules, &id)?;
                let bad = |pointer: &str, e: String| HostError::InvalidSchedule(vec![(pointer.into(), e)]);
                let from = sm4c_schedule::parse_time(&from).map_err(|e| bad("/from", e))?;
                let to = sm4c_schedule::parse_time(&to).map_err(|e| bad("/to", e))?;
                self.reconcile(&id);
                let Some((spec, state)) = self.schedules.all.get_mut(&id) else {
                    return Err(HostError::UnknownSchedule(id));
                };
                let n = state.backfill(spec, from, to).map_err(|e| bad("/to", e))?;
                let actions = state.tick(spec, now);
                self.act(&id, actions, now);
                let mut v = self.view(&id, now, UPCOMING);
                v["backfilled"] = json!(n);
                Ok(v)
            }
        }
    }

    fn operate(
        &mut self,
        id: &str,
        now: i64,
        f: impl FnOnce(&Spec, &mut State) -> Vec<Action>,
    ) -> Result<Value, HostError> {
        let Some((spec, state)) = self.schedules.all.get_mut(id) else {
            return Err(HostError::UnknownSchedule(id.to_string()));
        };
        let actions = f(spec, state);
        self.act(id, actions, now);
        Ok(self.view(id, now, UPCOMING))
    }

    /// A specification, checked; its definition must be registered.
    fn spec_of(&self, doc: &Value) -> Result<Spec, HostError> {
        let spec = Spec::from_json(doc)
            .map_err(|errs| HostError::InvalidSchedule(errs.into_iter().map(|e| (e.pointer, e.message)).collect()))?;
        let known = self
            .registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&spec.definition, spec.version.as_deref())
            .is_some();
        if !known {
            let what = match &spec.version {
                Some(v) => format!("{} version {v}", spec.definition),
                None => spec.definition.clone(),
            };
            return Err(HostError::UnknownDefinition(what));
        }
        Ok(spec)
    }

    /// A schedule as `GET /schedules/{id}` shows it ([`sm4c_schedule::view()`]).
    fn view(&self, id: &str, now: i64, upcoming: usize) -> Value {
        match self.schedules.all.get(id) {
            Some((spec, state)) => sm4c_schedule::view(id, spec, state, now, upcoming),
            None => json!({"id": id}),
        }
    }
}
