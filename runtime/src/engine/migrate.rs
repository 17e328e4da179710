//! Moving a running instance to another version of its definition.
//!
//! An SM4C instance that waits in a state (for events, or a timeout) moves to the state of the same
//! name in the other version, or the one `states` maps it to; an ASL execution that waits at the
//! top level in a Task (for its result, or between attempts) or a Wait state moves to the state
//! of the same type there, its task or timer going on. It keeps its id, data, inbox and
//! correlation bindings; what it waits for comes from the new state's transitions; a state timeout
//! the new state keeps keeps its deadline, a new one counts from the migration, one it drops is
//! cancelled (the execution timeout likewise). The move is an input in the journal
//! ([`Input::Migrate`]), so a replay across it, given both versions, is deterministic.

use super::{Entry, Input, Instance, Next, Output, Phase, Status, Timed, Trace, EXEC_TIMER};
use crate::model::Trigger;
use crate::{Machine, Millis};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why an instance cannot move: a stable `reason` code and a message that says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotMigratable {
    /// `ended`, `notStarted`, `paused`, `inAction`, `noCounterpart`, `unknownState`,
    /// `otherKind` (ASL: the counterpart is another type of state, or retries otherwise),
    /// `otherDefinition`, `sameVersion` or `language`.
    pub reason: &'static str,
    /// What is in the way.
    pub message: String,
}

impl std::fmt::Display for NotMigratable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn refuse(reason: &'static str, message: String) -> NotMigratable {
    NotMigratable { reason, message }
}

/// What a migration does to a timer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimerChange {
    /// The timer.
    pub timer: String,
    /// `kept` (its deadline stays), `armed` (counts from the migration) or `cancelled`.
    pub change: &'static str,
    /// Its due time (for `armed`, from the migration's time), ms since the Unix epoch.
    pub due: Option<Millis>,
}

/// What a migration would do: the move, and the timers it keeps, arms and cancels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationPlan {
    /// The version the instance runs on.
    pub from: String,
    /// The version it moves to.
    pub version: String,
    /// The state it waits in.
    pub state: String,
    /// Its counterpart in the new version.
    pub to: String,
    /// The timers that change, or stay, with it.
    pub timers: Vec<TimerChange>,
}

impl Instance {
    /// What moving to `to` would do, or why the instance cannot move (nothing changes either way).
    /// `states` maps old state names to new ones where they differ; `at` is the migration's time.
    pub fn migration_plan(
        &self,
        to: &Machine,
        states: &BTreeMap<String, String>,
        at: Millis,
    ) -> Result<MigrationPlan, NotMigratable> {
        let m = &self.machine;
        if to.id != m.id {
            return Err(refuse(
                "otherDefinition",
                format!("instance {:?} runs definition {:?}, not {:?}", self.s.id, m.id, to.id),
            ));
        }
        if to.version == m.version {
            return Err(refuse(
                "sameVersion",
                format!("instance {:?} already runs version {:?}", self.s.id, m.version),
            ));
        }
        if m.asl.is_some() != to.asl.is_some() {
            return Err(refuse(
                "language",
                format!(
                    "version {:?} is written in another language than version {:?}",
                    to.version, m.version
                ),
            ));
        }
        match self.s.status {
            s if s.is_final() => {
                return Err(refuse(
                    "ended",
                    format!("instance {:?} has ended ({})", self.s.id, s.as_str()),
                ))
            }
            Status::Created => {
                return Err(refuse(
                    "notStarted",
                    format!("instance {:?} has not started", self.s.id),
                ))
            }
            Status::Paused => {
                return Err(refuse(
                    "paused",
                    format!(
                        "instance {:?} is paused at a breakpoint; resume it, then migrate it",
                        self.s.id
                    ),
                ))
            }
            _ => {}
        }
        if let (Some(old), Some(new)) = (&m.asl, &to.asl) {
            return self.asl_plan(old, new, to, states, at);
        }
        let state = self.s.state_name.clone().unwrap_or_default();
        if !matches!(self.s.phase, Phase::Waiting) {
            let what = match &self.s.phase {
                Phase::Enter { .. } => "its enter action",
                Phase::Exit { .. } => "its exit action",
                Phase::Transition { .. } => "a transition's action",
                Phase::TimeoutAction { .. } => "its state timeout action",
                _ => "a step",
            };
            return Err(refuse(
                "inAction",
                format!(
                    "instance {:?} is in the middle of {what} in state {state:?}; it can move once it waits for events or a timeout",
                    self.s.id
                ),
            ));
        }
        for (old, new) in states {
            if m.state(old).is_none() {
                return Err(refuse(
                    "unknownState",
                    format!("states maps {old:?}, which is not a state of version {:?}", m.version),
                ));
            }
            if to.state(new).is_none() {
                return Err(refuse(
                    "unknownState",
                    format!(
                        "states maps {old:?} to {new:?}, which is not a state of version {:?}",
                        to.version
                    ),
                ));
            }
        }
        let target = states.get(&state).cloned().unwrap_or_else(|| state.clone());
        let Some(idx) = to.state(&target) else {
            return Err(refuse(
                "noCounterpart",
                format!(
                    "state {state:?} has no counterpart in version {:?}; map it to one of its states with \"states\": {{{state:?}: \"...\"}}",
                    to.version
                ),
            ));
        };
        let now = self.s.now.max(at);
        let mut timers = Vec::new();
        let keeps_timeout = to.states[idx]
            .transitions
            .iter()
            .find(|t| t.trigger == Trigger::Timeout);
        match (&self.s.state_timer, keeps_timeout) {
            (Some(t), Some(_)) => timers.push(TimerChange {
                timer: t.clone(),
                change: "kept",
                due: self.s.timers.get(t).copied(),
            }),
            (Some(t), None) => timers.push(TimerChange {
                timer: t.clone(),
                change: "cancelled",
                due: self.s.timers.get(t).copied(),
            }),
            (None, Some(t)) => timers.push(TimerChange {
                timer: format!("{}.timeout", self.s.visit),
                change: "armed",
                due: Some(now.saturating_add(t.timeout_ms.unwrap_or(0).min(i64::MAX as u64) as i64)),
            }),
            (None, None) => {}
        }
        exec_timer(
            &mut timers,
            self.s.timers.get(EXEC_TIMER).copied(),
            to.timeout.as_ref().map(|t| t.duration_ms),
            now,
        );
        Ok(MigrationPlan {
            from: m.version.clone(),
            version: to.version.clone(),
            state,
            to: to.states[idx].name.clone(),
            timers,
        })
    }

    /// [`Instance::migration_plan`] of an ASL execution: one that waits at the top level, in a
    /// Task for its result (or between its attempts) or in a Wait state, moves to the state of the
    /// same type that has its name, or the name `states` gives.
    fn asl_plan(
        &self,
        old: &crate::asl::model::AslMachine,
        new: &crate::asl::model::AslMachine,
        to: &Machine,
        states: &BTreeMap<String, String>,
        at: Millis,
    ) -> Result<MigrationPlan, NotMigratable> {
        use crate::asl::engine::Step;
        use crate::asl::model::Kind;
        let (m, id) = (&self.machine, &self.s.id);
        let Some(root) = self.s.asl.as_ref().map(|e| &e.root) else {
            return Err(refuse("notStarted", format!("execution {id:?} has not started")));
        };
        let (top_old, top_new) = (&old.graphs[0], &new.graphs[0]);
        for (from, into) in states {
            if top_old.find(from).is_none() {
                return Err(refuse(
                    "unknownState",
                    format!("states maps {from:?}, which is not a state of version {:?}", m.version),
                ));
            }
            if top_new.find(into).is_none() {
                return Err(refuse(
                    "unknownState",
                    format!(
                        "states maps {from:?} to {into:?}, which is not a state of version {:?}",
                        to.version
                    ),
                ));
            }
        }
        let here = &top_old.states[root.state];
        let state = here.name.clone();
        let waits = match &root.step {
            Step::Task { .. } | Step::Backoff { .. } => "Task",
            Step::Wait { .. } => "Wait",
            Step::Children { .. } => {
                return Err(refuse(
                    "inAction",
                    format!("execution {id:?} runs the branches or iterations of state {state:?}; it can move once it waits in a Task or a Wait state"),
                ))
            }
            Step::Enter | Step::Done { .. } => {
                return Err(refuse(
                    "inAction",
                    format!("execution {id:?} is between steps in state {state:?}"),
                ))
            }
        };
        let target = states.get(&state).cloned().unwrap_or_else(|| state.clone());
        let Some(idx) = top_new.find(&target) else {
            return Err(refuse(
                "noCounterpart",
                format!(
                    "state {state:?} has no counterpart in version {:?}; map it to one of its states with \"states\": {{{state:?}: \"...\"}}",
                    to.version
                ),
            ));
        };
        let there = &top_new.states[idx];
        let fits = matches!(
            (&there.kind, waits),
            (Kind::Task { .. }, "Task") | (Kind::Wait { .. }, "Wait")
        );
        if !fits {
            return Err(refuse(
                "otherKind",
                format!("state {state:?} waits as a {waits} state, and its counterpart {target:?} in version {:?} is not one", to.version),
            ));
        }
        // The attempts counted so far go on against the new state's retriers, one for one.
        if root.retry.is_some() && here.retry.len() != there.retry.len() {
            return Err(refuse(
                "otherKind",
                format!(
                    "state {state:?} counts its attempts against {} retriers and {target:?} has {}; move it when it is not retrying",
                    here.retry.len(),
                    there.retry.len()
                ),
            ));
        }
        // Its task's or its wait's timers stay as they are.
        let mut timers: Vec<TimerChange> = match &root.step {
            Step::Task { timeout, heartbeat, .. } => timeout
                .iter()
                .chain(heartbeat.iter().map(|(t, _)| t))
                .map(|t| TimerChange {
                    timer: t.clone(),
                    change: "kept",
                    due: self.s.timers.get(t).copied(),
                })
                .collect(),
            Step::Backoff { timer } | Step::Wait { timer, .. } => vec![TimerChange {
                timer: timer.clone(),
                change: "kept",
                due: self.s.timers.get(timer).copied(),
            }],
            _ => Vec::new(),
        };
        let now = self.s.now.max(at);
        exec_timer(
            &mut timers,
            self.s.timers.get(EXEC_TIMER).copied(),
            new.timeout_seconds.map(|s| s.saturating_mul(1000)),
            now,
        );
        Ok(MigrationPlan {
            from: m.version.clone(),
            version: to.version.clone(),
            state,
            to: there.name.clone(),
            timers,
        })
    }

    /// Moves the instance to `to` at time `at` (see [`Instance::migration_plan`]), then lets the
    /// new state's transitions take what is already there: a condition that holds, an event in
    /// the inbox. The output's first journal entry is the [`Input::Migrate`]; nothing changes when
    /// the instance cannot move.
    pub fn migrate(
        &mut self,
        to: Arc<Machine>,
        states: &BTreeMap<String, String>,
        at: Millis,
    ) -> Result<Output, NotMigratable> {
        let plan = self.migration_plan(&to, states, at)?;
        let mut out = Output::default();
        if self.options.journal {
            out.entries.push(Entry::Input(Timed {
                at,
                input: Input::Migrate {
                    from: plan.from.clone(),
                    version: plan.version.clone(),
                    states: states.clone(),
                },
            }));
        }
        self.s.now = self.s.now.max(at);
        self.burst = 0;
        if let Some(asl) = to.asl.as_ref() {
            let idx = asl.graphs[0].find(&plan.to).unwrap_or(0);
            if let Some(e) = self.s.asl.as_mut() {
                e.root.state = idx;
            }
            self.machine = to.clone();
            self.s.version = plan.version.clone();
            self.s.state_name = Some(plan.to.clone());
            let mut cx = self.cx(&mut out);
            for t in plan.timers.iter().filter(|t| t.timer == EXEC_TIMER) {
                match t.change {
                    "cancelled" => cx.cancel_timer(&t.timer),
                    "armed" => cx.start_timer(EXEC_TIMER, (t.due.unwrap_or(0) - cx.now).max(0) as u64),
                    _ => {}
                }
            }
            cx.trace(|| Trace::Migrated {
                from: plan.from.clone(),
                version: plan.version.clone(),
                state: plan.state.clone(),
                to: plan.to.clone(),
            });
            // It goes on waiting for its task or its timer, which the new state then takes.
            return Ok(out);
        }
        let idx = to.state(&plan.to).unwrap_or(0);
        self.machine = to;
        self.s.version = plan.version.clone();
        self.s.state = Some(idx);
        self.s.state_name = Some(plan.to.clone());
        {
            let mut cx = self.cx(&mut out);
            for t in plan.timers.iter().filter(|t| t.change == "cancelled") {
                cx.cancel_timer(&t.timer);
            }
            cx.trace(|| Trace::Migrated {
                from: plan.from.clone(),
                version: plan.version.clone(),
                state: plan.state.clone(),
                to: plan.to.clone(),
            });
        }
        if plan
            .timers
            .iter()
            .any(|t| t.timer != EXEC_TIMER && t.change == "cancelled")
        {
            self.s.state_timer = None;
        }
        if let (Some(t), false) = (&self.machine.timeout, self.s.timers.contains_key(EXEC_TIMER)) {
            let ms = t.duration_ms;
            self.cx(&mut out).start_timer(EXEC_TIMER, ms);
        }
        self.s.status = Status::Running;
        // The new state's transitions: a condition may hold, an event may wait in the inbox; if
        // not, it waits, arming its timeout when it has one and none runs.
        self.drive(&mut out, Next::Evaluate);
        Ok(out)
    }
}

/// What the move does to the execution timeout: kept when both versions have one (its deadline
/// stays), cancelled when the new one has none, armed from the move when only it has one.
fn exec_timer(timers: &mut Vec<TimerChange>, due: Option<Millis>, new_ms: Option<u64>, now: Millis) {
    let change = match (due, new_ms) {
        (Some(due), Some(_)) => ("kept", Some(due)),
        (Some(due), None) => ("cancelled", Some(due)),
        (None, Some(ms)) => ("armed", Some(now.saturating_add(ms.min(i64::MAX as u64) as i64))),
        (None, None) => return,
    };
    timers.push(TimerChange {
        timer: EXEC_TIMER.into(),
        change: change.0,
        due: change.1,
    });
}
