//! The deterministic engine: inputs in, journal entries and effects out. No IO, no clock.
//!
//! An [`Instance`] follows the seed's execution algorithm. [`Instance::handle`] takes one timed
//! input, runs the instance as far as it can go without waiting, and returns what to record and
//! what to perform. Everything an instance is can be saved as a [`Snapshot`], and
//! [`Instance::replay`] rebuilds an instance from its journal, checking that the definition still
//! asks for the effects the journal recorded.

pub mod action;
pub mod debug;
pub mod event;
pub mod history;
pub mod migrate;
pub mod redrive;
pub mod task;
pub mod types;

use crate::expr::EvalError;
use crate::json::{from_val, to_val};
pub use crate::kernel::output::{Options, Output};
use crate::kernel::Random;
use crate::model::{Condition, Machine, StateId, Trigger, Verdict};
use crate::timespan;
use action::{cancel, deliver, start, Run, Signal, Step};
use jaq_json::Val;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
pub use types::*;

/// Id of the execution timeout timer.
pub const EXEC_TIMER: &str = "exec:timeout";

/// Where an instance is in the seed's algorithm.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "phase", rename_all = "camelCase")]
pub enum Phase {
    /// Not started.
    Idle,
    /// Running the enter action.
    Enter {
        /// The action.
        run: Run,
    },
    /// Running the action of transition `transition`.
    Transition {
        /// Index of the transition in the state.
        transition: usize,
        /// The action.
        run: Run,
    },
    /// Running the exit action before entering `next`.
    Exit {
        /// The state to enter afterwards.
        next: StateId,
        /// The action.
        run: Run,
    },
    /// Waiting for events or the state's timeout.
    Waiting,
    /// Running the execution timeout's action.
    TimeoutAction {
        /// The action.
        run: Run,
    },
    /// Ended.
    Ended,
}

/// Everything an instance is, as data. Saving and loading this is how hosts suspend instances.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// Instance id.
    pub id: String,
    /// Definition id.
    pub definition: String,
    /// Definition version.
    pub version: String,
    /// Lifecycle status.
    pub status: Status,
    /// Global data.
    pub data: J,
    /// Current state.
    pub state: Option<StateId>,
    /// Current state's name.
    #[serde(default)]
    pub state_name: Option<String>,
    /// Count of states entered (part of operation ids).
    pub visit: u64,
    /// Transitions fired in this visit (part of operation ids).
    pub firings: u64,
    /// Position in the algorithm.
    pub phase: Phase,
    /// The state's timeout timer, once waiting started.
    pub state_timer: Option<String>,
    /// Events delivered and not consumed, oldest first.
    pub inbox: Vec<Value>,
    /// Active timers and their due times.
    pub timers: BTreeMap<String, Millis>,
    /// Time of the latest input.
    pub now: Millis,
    /// When the instance started.
    pub started_at: Option<Millis>,
    /// When it ended.
    pub ended_at: Option<Millis>,
    /// Deterministic random state (jitter).
    pub rng: Random,
    /// Correlation values bound by earlier events.
    pub bindings: BTreeMap<String, String>,
    /// Why the instance failed or timed out.
    pub error: Option<ErrorInfo>,
    /// An ASL execution's runs (the definition is in the Amazon States Language).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asl: Option<Box<crate::asl::engine::Exec>>,
    /// The step debugger's breakpoints and pause; absent while no breakpoint was ever recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debug: Option<Box<debug::Debug>>,
    /// The schedule that started the instance, and its run's nominal time (from the start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled: Option<Scheduled>,
    /// Its redrives, and where a failed or timed-out instance goes on from; absent until it first
    /// fails or times out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redrive: Option<Box<redrive::Redrives>>,
}

impl Snapshot {
    /// The operation id and start time of each SM4C action running now (nested ones too), for a
    /// host that measures how long actions take: an action that completes in a later step took
    /// from its start here to that step's time. Empty for ASL executions.
    pub fn running_actions(&self) -> Vec<(String, Millis)> {
        let mut out = Vec::new();
        match &self.phase {
            Phase::Enter { run }
            | Phase::Transition { run, .. }
            | Phase::Exit { run, .. }
            | Phase::TimeoutAction { run } => run.running(&mut out),
            _ => {}
        }
        out
    }
}

/// A running instance of a [`Machine`].
pub struct Instance {
    machine: Arc<Machine>,
    s: Snapshot,
    options: Options,
    burst: u64,
    /// Set on resuming: the first breakpoint-able point reached (the one it paused at) does not pause.
    skip: bool,
    /// Where [`Instance::run_action`] writes the position of the action it starts.
    path: String,
    /// Where a redrive goes on from, set just before the step that fails the instance.
    point: Option<redrive::Point>,
}

/// Context handed to action code: the instance's mutable parts and the output being built.
pub struct Cx<'a> {
    pub(crate) m: &'a Machine,
    pub(crate) id: &'a str,
    pub(crate) now: Millis,
    pub(crate) data: &'a mut Val,
    pub(crate) timers: &'a mut BTreeMap<String, Millis>,
    rng: &'a mut Random,
    out: &'a mut Output,
    options: Options,
}

impl Cx<'_> {
    pub(crate) fn effect(&mut self, e: Effect) {
        self.out.effect(&self.options, e);
    }

    pub(crate) fn start_timer(&mut self, timer: &str, after_ms: u64) {
        let due = self.now.saturating_add(after_ms.min(i64::MAX as u64) as i64);
        self.out.start_timer(&self.options, self.timers, timer, due);
    }

    pub(crate) fn cancel_timer(&mut self, timer: &str) {
        self.out.cancel_timer(&self.options, self.timers, timer);
    }

    pub(crate) fn trace(&mut self, f: impl FnOnce() -> Trace) {
        self.out.trace(&self.options, f);
    }

    /// Records that the part of the definition at JSON pointer `pointer` was taken (coverage only).
    pub(crate) fn cover(&mut self, pointer: impl FnOnce() -> String) {
        self.out.cover(&self.options, pointer);
    }

    /// A uniform number in `[0, 1)` from the instance's deterministic random source.
    pub(crate) fn random_unit(&mut self) -> f64 {
        self.rng.next_unit()
    }
}

/// Whether condition `c` fires on `input` (with `$value` = `value`): only when it yields `true`.
/// A value that is not a boolean does not fire; with `trace` on, the first such value of each
/// condition in an input is recorded as a [`Trace::ConditionNotBoolean`] naming the condition and
/// the value (an event group condition may be tried on every event in the inbox: once is enough).
pub(crate) fn fires(c: &Condition, input: &Val, value: &Val, trace: bool, out: &mut Output) -> Result<bool, EvalError> {
    match c.test(input, value)? {
        Verdict::True => Ok(true),
        Verdict::False => Ok(false),
        Verdict::NotBoolean(v) => {
            if trace && !out.noted.contains(&c.pointer) {
                out.noted.push(c.pointer.clone());
                out.entries
                    .push(Entry::Trace(Trace::condition_not_boolean(&c.pointer, c.source(), &v)));
            }
            Ok(false)
        }
    }
}

/// Where the algorithm goes next; driving is a loop over these so long runs use no stack.
enum Next {
    Enter(StateId),
    EnterAction,
    Entered(Val),
    Evaluate,
    Fire(usize, &'static str),
    TransitionAction(usize),
    Fired(usize, Val),
    ExitAction(StateId),
    Exited(StateId, Val),
    Stop,
}

/// A replayed journal disagrees with its definition.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("journal entry {index}: {message}")]
pub struct ReplayError {
    /// Index of the journal entry where replay diverged.
    pub index: usize,
    /// What differs.
    pub message: String,
}

impl Instance {
    /// A new instance, not started; deliver [`Input::Start`] to start it.
    pub fn new(machine: Arc<Machine>, id: impl Into<String>, options: Options) -> Instance {
        let id = id.into();
        let s = Snapshot {
            definition: machine.id.clone(),
            version: machine.version.clone(),
            status: Status::Created,
            data: J(Val::Null),
            state: None,
            state_name: None,
            visit: 0,
            firings: 0,
            phase: Phase::Idle,
            state_timer: None,
            inbox: Vec::new(),
            timers: BTreeMap::new(),
            now: 0,
            started_at: None,
            ended_at: None,
            rng: Random::for_id(&id),
            bindings: BTreeMap::new(),
            error: None,
            asl: None,
            debug: None,
            scheduled: None,
            redrive: None,
            id,
        };
        Instance {
            machine,
            s,
            options,
            burst: 0,
            skip: false,
            path: String::new(),
            point: None,
        }
    }

    /// An instance restored from a snapshot taken by [`Instance::snapshot`].
    pub fn from_snapshot(machine: Arc<Machine>, snapshot: Snapshot, options: Options) -> Instance {
        let mut inst = Instance {
            machine,
            s: snapshot,
            options,
            burst: 0,
            skip: false,
            path: String::new(),
            point: None,
        };
        if let Err(why) = inst.fits() {
            let e = ErrorInfo::new(
                ErrorKind::ReplayMismatch,
                format!("the saved instance does not fit its definition: {why}"),
            );
            inst.force_fail(e);
        }
        inst
    }

    /// Ends the instance as failed without running any of its definition (for instances that can no
    /// longer run: a snapshot that does not fit, an internal error).
    pub fn force_fail(&mut self, mut error: ErrorInfo) {
        if error.state.is_none() {
            error.state = self.s.state_name.clone();
        }
        if self.s.state.is_some_and(|s| s >= self.machine.states.len()) {
            self.s.state = None;
        }
        self.s.phase = Phase::Ended;
        self.s.timers.clear();
        self.s.state_timer = None;
        self.s.status = Status::Failed;
        self.s.error = Some(error);
        self.s.ended_at = Some(self.s.now);
        if let Some(r) = self.s.redrive.as_mut() {
            r.point = None;
        }
    }

    /// Checks that every index in the snapshot exists in the definition.
    fn fits(&self) -> Result<(), String> {
        let m = &self.machine;
        if self.s.status.is_final() {
            return Ok(());
        }
        if let Some(asl) = &m.asl {
            return crate::asl::fits(asl, &self.s);
        }
        let state = match self.s.state {
            Some(s) if s >= m.states.len() => {
                return Err(format!("it is in state number {s}, which the definition lacks"))
            }
            Some(s) => Some(&m.states[s]),
            None => None,
        };
        if let (Some(st), Some(name)) = (state, &self.s.state_name) {
            if &st.name != name {
                return Err(format!(
                    "it is in state {name:?}, but that position now holds state {:?}",
                    st.name
                ));
            }
        }
        fn run_fits(m: &Machine, r: &Run) -> bool {
            if r.action >= m.actions.len() {
                return false;
            }
            match &r.node {
                action::Node::Sequence { child, .. } => run_fits(m, child),
                action::Node::Parallel { running, .. } | action::Node::Foreach { running, .. } => {
                    running.iter().all(|(_, c)| run_fits(m, c))
                }
                _ => true,
            }
        }
        let ok = match &self.s.phase {
            Phase::Enter { run } | Phase::TimeoutAction { run } => run_fits(m, run),
            Phase::Transition { transition, run } => {
                state.is_some_and(|st| *transition < st.transitions.len()) && run_fits(m, run)
            }
            Phase::Exit { next, run } => *next < m.states.len() && run_fits(m, run),
            Phase::Idle | Phase::Waiting | Phase::Ended => true,
        };
        if !ok {
            return Err("the action it is running no longer exists".into());
        }
        if let Some(p) = self.s.debug.as_ref().and_then(|d| d.paused.as_ref()) {
            let n = state.map_or(0, |st| st.transitions.len());
            let fits = match &p.resume {
                debug::Resume::Enter { state: s } | debug::Resume::ExitAction { next: s } => *s < m.states.len(),
                debug::Resume::EnterAction => state.is_some(),
                debug::Resume::Fire { transition, .. } | debug::Resume::TransitionAction { transition } => {
                    *transition < n
                }
            };
            if !fits {
                return Err("the point it is paused at no longer exists".into());
            }
        }
        Ok(())
    }

    /// Rebuilds an instance by replaying its journal. Fails when the definition now asks for
    /// different effects than the journal recorded.
    pub fn replay(
        machine: Arc<Machine>,
        id: &str,
        journal: &[Entry],
        options: Options,
    ) -> Result<Instance, ReplayError> {
        Instance::replay_versions(machine, id, journal, options, &|_: &str| None)
    }

    /// [`Instance::replay`] of a journal that may move the instance to other versions
    /// ([`Input::Migrate`]): `version` gives the definition of each version it names. The replay
    /// starts on the version the first migration moved from (on `machine` when there is none).
    pub fn replay_versions(
        machine: Arc<Machine>,
        id: &str,
        journal: &[Entry],
        options: Options,
        version: &dyn Fn(&str) -> Option<Arc<Machine>>,
    ) -> Result<Instance, ReplayError> {
        let load = |v: &str, i: usize| {
            version(v).ok_or_else(|| ReplayError {
                index: i + 1,
                message: format!("the journal moves the instance across version {v:?}, which cannot be loaded here"),
            })
        };
        let first = journal.iter().enumerate().find_map(|(i, e)| match e {
            Entry::Input(Timed {
                input: Input::Migrate { from, .. },
                ..
            }) => Some((i, from)),
            _ => None,
        });
        let machine = match first {
            Some((i, from)) if *from != machine.version => load(from, i)?,
            _ => machine,
        };
        let mut inst = Instance::new(
            machine,
            id,
            Options {
                journal: false,
                trace: false,
                coverage: false,
                ..options
            },
        );
        let mut produced: Vec<Effect> = Vec::new();
        let mut pos = 0;
        let mut input_index = 0;
        let check_done = |produced: &[Effect], pos: usize, at: usize, input_index: usize| {
            if pos < produced.len() {
                Err(ReplayError {
                    index: at,
                    message: format!(
                        "the definition now asks for {} after the input at entry {}, which the journal does not have",
                        describe(&produced[pos]),
                        input_index + 1
                    ),
                })
            } else {
                Ok(())
            }
        };
        for (i, e) in journal.iter().enumerate() {
            match e {
                Entry::Input(Timed {
                    at,
                    input: Input::Migrate { version: v, states, .. },
                }) => {
                    check_done(&produced, pos, i, input_index)?;
                    let to = load(v, i)?;
                    produced = inst
                        .migrate(to, states, *at)
                        .map_err(|e| ReplayError {
                            index: i + 1,
                            message: format!(
                                "the journal moves the instance to version {v:?}, which it cannot do now: {e}"
                            ),
                        })?
                        .effects;
                    pos = 0;
                    input_index = i;
                }
                Entry::Input(t) => {
                    check_done(&produced, pos, i, input_index)?;
                    produced = inst.handle(t.clone()).effects;
                    pos = 0;
                    input_index = i;
                }
                Entry::Effect(recorded) => {
                    match produced.get(pos) {
                        Some(p) if p == recorded => {}
                        Some(p) => {
                            return Err(ReplayError {
                                index: i + 1,
                                message: format!(
                                    "the journal has {} but the definition now asks for {}{}",
                                    describe(recorded),
                                    describe(p),
                                    differences(recorded, p)
                                ),
                            })
                        }
                        None => {
                            return Err(ReplayError {
                                index: i + 1,
                                message: format!(
                                    "the journal has {} but the definition no longer asks for it",
                                    describe(recorded)
                                ),
                            })
                        }
                    }
                    pos += 1;
                }
                Entry::Trace(_) => {}
            }
        }
        check_done(&produced, pos, journal.len(), input_index)?;
        inst.options = options;
        Ok(inst)
    }

    /// The instance as data.
    pub fn snapshot(&self) -> &Snapshot {
        &self.s
    }

    /// The definition it runs.
    pub fn machine(&self) -> &Arc<Machine> {
        &self.machine
    }

    /// Instance id.
    pub fn id(&self) -> &str {
        &self.s.id
    }

    /// Lifecycle status.
    pub fn status(&self) -> Status {
        self.s.status
    }

    /// The global data (the output, once ended).
    pub fn data(&self) -> Value {
        from_val(&self.s.data.0)
    }

    /// The error, for failed and timed-out instances.
    pub fn error(&self) -> Option<&ErrorInfo> {
        self.s.error.as_ref()
    }

    /// The current state's name.
    pub fn state_name(&self) -> Option<&str> {
        if self.machine.asl.is_some() {
            return self.s.state_name.as_deref();
        }
        self.s
            .state
            .and_then(|s| self.machine.states.get(s))
            .map(|s| s.name.as_str())
    }

    /// The breakpoints last recorded for the instance ([`Input::Debug`]).
    pub fn breakpoints(&self) -> &[debug::Breakpoint] {
        self.s.debug.as_ref().map_or(&[], |d| &d.breakpoints)
    }

    /// Where the instance is paused, while it is.
    pub fn paused_at(&self) -> Option<&debug::Breakpoint> {
        self.s.debug.as_ref().and_then(|d| d.paused.as_ref()).map(|p| &p.at)
    }

    /// Active timers and their due times.
    pub fn timers(&self) -> &BTreeMap<String, Millis> {
        &self.s.timers
    }

    /// For the open task of a `worker` call `op`: whether a worker has taken it. `None` when the
    /// instance does not wait for such a task.
    pub fn task_started(&self, op: &str) -> Option<bool> {
        match &self.s.phase {
            Phase::Enter { run }
            | Phase::Transition { run, .. }
            | Phase::Exit { run, .. }
            | Phase::TimeoutAction { run } => task::started(&run.node, op),
            Phase::Idle | Phase::Waiting | Phase::Ended => match &self.s.asl {
                Some(exec) if crate::asl::engine::waits_for(&exec.root, op) => Some(false),
                _ => None,
            },
        }
    }

    /// Handles one input and returns what to record and perform.
    ///
    /// An [`Input::Migrate`] is not handled here (it needs the other version's definition): see
    /// [`Instance::migrate`]; given here, it does nothing.
    pub fn handle(&mut self, timed: Timed) -> Output {
        let mut out = Output::default();
        if matches!(timed.input, Input::Migrate { .. }) {
            return out;
        }
        if self.options.journal {
            out.entries.push(Entry::Input(timed.clone()));
        }
        self.input(&mut out, timed);
        out
    }

    /// Handles one input (already recorded), with the jq function `schedule` reading the
    /// instance's schedule.
    fn input(&mut self, out: &mut Output, timed: Timed) {
        if let Input::Start {
            scheduled: Some(sch), ..
        } = &timed.input
        {
            if self.s.status == Status::Created {
                self.s.scheduled = Some(sch.clone());
            }
        }
        match self.s.scheduled.as_ref().map(|s| to_val(&s.to_json())) {
            Some(v) => crate::expr::with_schedule(v, || self.input_in(out, timed)),
            None => self.input_in(out, timed),
        }
    }

    fn input_in(&mut self, out: &mut Output, timed: Timed) {
        self.s.now = self.s.now.max(timed.at);
        self.burst = 0;
        if let Input::Redrive { diff, .. } = &timed.input {
            return self.redrive_in(out, diff);
        }
        // The step debugger: one branch while no breakpoint was ever recorded for the instance.
        if self.s.debug.is_some() || matches!(timed.input, Input::Debug { .. } | Input::Resume { .. }) {
            match self.debug_input(out, timed) {
                Some(t) => return self.input_run(out, t),
                None => return,
            }
        }
        self.input_run(out, timed)
    }

    /// Takes the debugger's inputs, and holds inputs that arrive while the instance is paused;
    /// gives back an input to handle as usual.
    fn debug_input(&mut self, out: &mut Output, timed: Timed) -> Option<Timed> {
        if self.machine.asl.is_some() || self.s.status.is_final() {
            return match timed.input {
                Input::Debug { .. } | Input::Resume { .. } => None,
                _ => Some(timed),
            };
        }
        match timed.input {
            Input::Debug { breakpoints } => {
                self.s.debug.get_or_insert_with(Default::default).breakpoints = breakpoints;
                self.compact_debug();
                None
            }
            Input::Resume { step } => {
                self.resume(out, step);
                None
            }
            Input::Cancel { .. } | Input::Abort { .. } if self.s.status == Status::Paused => {
                if let Some(d) = self.s.debug.as_mut() {
                    if let Some(p) = d.paused.take() {
                        self.s.status = p.status;
                    }
                    d.held.clear();
                    d.stepping = false;
                }
                self.compact_debug();
                Some(timed)
            }
            _ if self.s.status == Status::Paused => {
                if let Some(d) = self.s.debug.as_mut() {
                    d.held.push(timed);
                }
                None
            }
            _ => Some(timed),
        }
    }

    /// Drops the debugger's part once it keeps nothing.
    fn compact_debug(&mut self) {
        if self.s.debug.as_ref().is_some_and(|d| d.idle()) {
            self.s.debug = None;
        }
    }

    /// A paused instance goes on from where it stopped, then handles the inputs held meanwhile
    /// (until it pauses again).
    fn resume(&mut self, out: &mut Output, step: bool) {
        let Some(d) = self.s.debug.as_mut() else { return };
        let Some(p) = d.paused.take() else { return };
        d.stepping = step;
        self.s.status = p.status;
        self.cx(out).trace(|| Trace::Resumed { stepping: step });
        let next = match p.resume {
            debug::Resume::Enter { state } => Next::Enter(state),
            debug::Resume::EnterAction => Next::EnterAction,
            debug::Resume::Fire { transition, trigger } => Next::Fire(transition, debug::trigger(&trigger)),
            debug::Resume::TransitionAction { transition } => Next::TransitionAction(transition),
            debug::Resume::ExitAction { next } => Next::ExitAction(next),
        };
        self.skip = true;
        self.drive(out, next);
        self.skip = false;
        while self.s.status != Status::Paused && !self.s.status.is_final() {
            let Some(t) = self
                .s
                .debug
                .as_mut()
                .filter(|d| !d.held.is_empty())
                .map(|d| d.held.remove(0))
            else {
                break;
            };
            self.input(out, t);
        }
        if self.s.status.is_final() {
            if let Some(d) = self.s.debug.as_mut() {
                d.held.clear();
                d.paused = None;
                d.stepping = false;
            }
        }
        self.compact_debug();
    }

    /// Whether the instance pauses at breakpoint-able point `at` (going on with `resume`); when it
    /// does, it is paused.
    /// [`Self::pauses`] before the action `action` (`enter`, `exit` or `tN`) of state `s`; one
    /// branch and nothing built while the instance was never debugged.
    fn pauses_before_action(
        &mut self,
        out: &mut Output,
        s: StateId,
        action: impl FnOnce() -> String,
        resume: debug::Resume,
    ) -> bool {
        self.s.debug.is_some()
            && self.pauses(
                out,
                |m| debug::Breakpoint::Action {
                    state: m.states[s].name.clone(),
                    action: action(),
                },
                resume,
            )
    }

    fn pauses(
        &mut self,
        out: &mut Output,
        at: impl FnOnce(&Machine) -> debug::Breakpoint,
        resume: debug::Resume,
    ) -> bool {
        if std::mem::take(&mut self.skip) {
            return false;
        }
        let Some(d) = self.s.debug.as_mut() else { return false };
        let at = at(&self.machine);
        if !d.stepping && !d.breakpoints.iter().any(|b| b.matches(&at)) {
            return false;
        }
        d.stepping = false;
        d.paused = Some(debug::Pause {
            at: at.clone(),
            resume,
            status: self.s.status,
        });
        self.s.status = Status::Paused;
        self.cx(out).trace(|| Trace::Paused { at });
        true
    }

    /// Handles one input as the definition says.
    fn input_run(&mut self, out: &mut Output, timed: Timed) {
        if let Some(asl) = self.machine.asl.clone() {
            // As for SM4C: the start time is the start input's (`$$.Execution.StartTime`, listings).
            if matches!(timed.input, Input::Start { .. }) && self.s.status == Status::Created {
                self.s.started_at = Some(self.s.now);
            }
            crate::asl::handle(&asl, &mut self.s, timed.input, self.options, out);
            return;
        }
        let next = match timed.input {
            Input::Debug { .. } | Input::Resume { .. } | Input::Migrate { .. } | Input::Redrive { .. } => return,
            Input::Start { data, .. } => {
                if self.s.status != Status::Created {
                    return;
                }
                self.s.data = J(to_val(&data));
                self.s.started_at = Some(self.s.now);
                self.s.status = Status::Running;
                if let Some(t) = &self.machine.timeout {
                    let ms = t.duration_ms;
                    self.cx(out).start_timer(EXEC_TIMER, ms);
                }
                Next::Enter(self.machine.start)
            }
            // Events delivered before the start wait in the inbox for the first state.
            Input::Event { event } if self.s.status == Status::Created => {
                self.s.inbox.push(event);
                return;
            }
            _ if self.s.status.is_final() || self.s.status == Status::Created => return,
            Input::Event { event } => {
                self.s.inbox.push(event);
                if self.s.inbox.len() > self.options.max_inbox {
                    self.s.inbox.remove(0);
                }
                if matches!(self.s.phase, Phase::Waiting) {
                    Next::Evaluate
                } else {
                    Next::Stop
                }
            }
            Input::Completed { op, result } => {
                let v = to_val(&result);
                self.signal(out, &Signal::Completed(&op, &v))
            }
            Input::Failed { op, error } => self.signal(out, &Signal::Failed(&op, &error)),
            Input::TaskStarted { op, worker } => self.signal(out, &Signal::TaskStarted(&op, worker.as_deref())),
            Input::TaskHeartbeat { op, details } => self.signal(out, &Signal::TaskHeartbeat(&op, details.as_ref())),
            Input::TimerFired { timer } => {
                if !self.s.timers.contains_key(&timer) {
                    Next::Stop // stale: cancelled, or already fired
                } else if timer == EXEC_TIMER {
                    self.s.timers.remove(&timer);
                    self.exec_timeout(out)
                } else if self.s.state_timer.as_deref() == Some(timer.as_str())
                    && matches!(self.s.phase, Phase::Waiting)
                {
                    self.s.timers.remove(&timer);
                    self.s.state_timer = None;
                    let st = &self.machine.states[self.s.state.unwrap_or(0)];
                    match st.transitions.iter().position(|t| t.trigger == Trigger::Timeout) {
                        Some(i) => Next::Fire(i, "timeout"),
                        None => Next::Stop,
                    }
                } else {
                    self.signal(out, &Signal::Timer(&timer))
                }
            }
            Input::Abort { error } => {
                self.fail(out, error);
                Next::Stop
            }
            Input::Cancel { reason } => {
                let mut e = ErrorInfo::new(
                    ErrorKind::Cancelled,
                    reason.unwrap_or_else(|| "the instance was cancelled".into()),
                );
                e.state = self.state_name().map(str::to_string);
                self.end(out, Status::Cancelled, Some(e));
                Next::Stop
            }
        };
        self.drive(out, next);
    }

    fn cx<'a>(&'a mut self, out: &'a mut Output) -> Cx<'a> {
        Cx {
            m: &self.machine,
            id: &self.s.id,
            now: self.s.now,
            data: &mut self.s.data.0,
            timers: &mut self.s.timers,
            rng: &mut self.s.rng,
            out,
            options: self.options,
        }
    }

    fn signal(&mut self, out: &mut Output, sig: &Signal) -> Next {
        let phase = std::mem::replace(&mut self.s.phase, Phase::Idle);
        let (mut run, resume): (Run, fn(Val, &Phase) -> Next) = match &phase {
            Phase::Enter { run } => (run.clone(), |v, _| Next::Entered(v)),
            Phase::Transition { run, .. } => (run.clone(), |v, p| match p {
                Phase::Transition { transition, .. } => Next::Fired(*transition, v),
                _ => Next::Stop,
            }),
            Phase::Exit { run, .. } => (run.clone(), |v, p| match p {
                Phase::Exit { next, .. } => Next::Exited(*next, v),
                _ => Next::Stop,
            }),
            Phase::TimeoutAction { run } => (run.clone(), |_, _| Next::Stop),
            _ => {
                self.s.phase = phase;
                return Next::Stop;
            }
        };
        let result = deliver(&mut self.cx(out), &mut run, sig);
        let timeout_action = matches!(phase, Phase::TimeoutAction { .. });
        match result {
            None => {
                self.s.phase = match phase {
                    Phase::Enter { .. } => Phase::Enter { run },
                    Phase::Transition { transition, .. } => Phase::Transition { transition, run },
                    Phase::Exit { next, .. } => Phase::Exit { next, run },
                    _ => Phase::TimeoutAction { run },
                };
                Next::Stop
            }
            Some(_) if timeout_action => {
                self.finish_timed_out(out);
                Next::Stop
            }
            Some(Ok(v)) => resume(v, &phase),
            Some(Err(e)) => {
                self.point = Some(redrive::Point::Action { phase: Box::new(phase) });
                self.fail(out, e)
            }
        }
    }

    /// The state's view of the data: global data through the state's `inputFilter`.
    fn view(&self) -> Result<Val, ErrorInfo> {
        let st = &self.machine.states[self.s.state.unwrap_or(0)];
        match &st.input_filter {
            None => Ok(self.s.data.0.clone()),
            Some(f) => f.eval(self.s.data.0.clone(), Val::Null).map_err(|e| {
                ErrorInfo::new(
                    ErrorKind::ExpressionError,
                    format!("inputFilter failed: {} (in {})", e.message, e.expression),
                )
            }),
        }
    }

    /// Applies a result handler: jq over the global data with the result as `$value`.
    fn apply(&mut self, handler: Option<&crate::expr::Expr>, value: Val, what: &str) -> Result<(), ErrorInfo> {
        if let Some(h) = handler {
            h.eval_mut(&mut self.s.data.0, value).map_err(|e| {
                ErrorInfo::new(
                    ErrorKind::ExpressionError,
                    format!("{what} failed: {} (in {})", e.message, e.expression),
                )
            })?;
        }
        Ok(())
    }

    fn drive(&mut self, out: &mut Output, mut next: Next) {
        let m = self.machine.clone();
        loop {
            let cur = self.s.state.unwrap_or(0);
            next = match next {
                Next::Stop => return,
                Next::Enter(s)
                    if self.s.debug.is_some()
                        && self.pauses(
                            out,
                            |m| debug::Breakpoint::Enter {
                                state: m.states[s].name.clone(),
                            },
                            debug::Resume::Enter { state: s },
                        ) =>
                {
                    Next::Stop
                }
                Next::Enter(s) => {
                    self.s.visit += 1;
                    self.s.firings = 0;
                    self.s.state = Some(s);
                    self.s.status = Status::Running;
                    let st = &m.states[s];
                    match &mut self.s.state_name {
                        Some(name) if *name == st.name => {}
                        // Reuses the name's buffer: entering states one after another allocates nothing.
                        Some(name) => st.name.clone_into(name),
                        None => self.s.state_name = Some(st.name.clone()),
                    }
                    self.cx(out).trace(|| Trace::StateEntered { state: st.name.clone() });
                    match st.enter {
                        None => Next::Entered(Val::Null),
                        Some(_) => Next::EnterAction,
                    }
                }
                Next::EnterAction => {
                    let s = self.s.state.unwrap_or(0);
                    if self.pauses_before_action(out, s, || "enter".into(), debug::Resume::EnterAction) {
                        Next::Stop
                    } else {
                        match m.states[s].enter {
                            None => Next::Entered(Val::Null),
                            Some(a) => self.run_action(
                                out,
                                a,
                                format_args!("enter"),
                                redrive::Point::EnterAction,
                                Next::Entered,
                                |run| Phase::Enter { run },
                            ),
                        }
                    }
                }
                Next::Entered(v) => {
                    let st = &m.states[self.s.state.unwrap_or(0)];
                    let kept = st.enter_handler.as_ref().map(|_| v.clone());
                    match self.apply(st.enter_handler.as_ref(), v, "enterResultHandler") {
                        Ok(()) => Next::Evaluate,
                        Err(e) => {
                            self.point = kept.map(|v| {
                                redrive::after_handler(
                                    v,
                                    |value| redrive::Point::Entered { value },
                                    redrive::Point::EnterAction,
                                )
                            });
                            self.fail(out, e)
                        }
                    }
                }
                Next::Evaluate => self.evaluate(&m, out),
                Next::Fire(i, trigger)
                    if self.s.debug.is_some()
                        && self.pauses(
                            out,
                            |m| debug::Breakpoint::Transition {
                                state: m.states[cur].name.clone(),
                                transition: Some(i),
                            },
                            debug::Resume::Fire {
                                transition: i,
                                trigger: trigger.into(),
                            },
                        ) =>
                {
                    Next::Stop
                }
                Next::Fire(i, trigger) => {
                    self.burst += 1;
                    if self.burst > self.options.max_transitions {
                        let e = ErrorInfo::new(
                            ErrorKind::LimitExceeded,
                            format!(
                                "more than {} transitions without waiting: the state machine loops",
                                self.options.max_transitions
                            ),
                        );
                        self.fail(out, e)
                    } else {
                        self.s.firings += 1;
                        let st = &m.states[self.s.state.unwrap_or(0)];
                        let t = &st.transitions[i];
                        self.cx(out).trace(|| Trace::TransitionFired {
                            state: st.name.clone(),
                            transition: i,
                            next: t.next.map(|n| m.states[n].name.clone()),
                            trigger: trigger.into(),
                        });
                        self.cx(out).cover(|| format!("{}/transitions/{i}", st.pointer));
                        match t.action {
                            None => Next::Fired(i, Val::Null),
                            Some(_) => Next::TransitionAction(i),
                        }
                    }
                }
                Next::TransitionAction(i) => {
                    let s = self.s.state.unwrap_or(0);
                    if self.pauses_before_action(
                        out,
                        s,
                        || format!("t{i}"),
                        debug::Resume::TransitionAction { transition: i },
                    ) {
                        Next::Stop
                    } else {
                        match m.states[s].transitions[i].action {
                            None => Next::Fired(i, Val::Null),
                            Some(a) => {
                                let firings = self.s.firings;
                                self.run_action(
                                    out,
                                    a,
                                    format_args!("t{i}.{firings}"),
                                    redrive::Point::TransitionAction { transition: i },
                                    |v| Next::Fired(i, v),
                                    |run| Phase::Transition { transition: i, run },
                                )
                            }
                        }
                    }
                }
                Next::Fired(i, v) => {
                    let t = &m.states[self.s.state.unwrap_or(0)].transitions[i];
                    let kept = t.handler.as_ref().map(|_| v.clone());
                    match self.apply(t.handler.as_ref(), v, "transition resultHandler") {
                        Err(e) => {
                            self.point = kept.map(|v| {
                                redrive::after_handler(
                                    v,
                                    |value| redrive::Point::Fired { transition: i, value },
                                    redrive::Point::TransitionAction { transition: i },
                                )
                            });
                            self.fail(out, e)
                        }
                        Ok(()) => match t.next {
                            None => Next::Evaluate,
                            Some(n) => {
                                if let Some(timer) = self.s.state_timer.take() {
                                    self.cx(out).cancel_timer(&timer);
                                }
                                match m.states[self.s.state.unwrap_or(0)].exit {
                                    None => Next::Exited(n, Val::Null),
                                    Some(_) => Next::ExitAction(n),
                                }
                            }
                        },
                    }
                }
                Next::ExitAction(n) => {
                    let s = self.s.state.unwrap_or(0);
                    if self.pauses_before_action(out, s, || "exit".into(), debug::Resume::ExitAction { next: n }) {
                        Next::Stop
                    } else {
                        match m.states[s].exit {
                            None => Next::Exited(n, Val::Null),
                            Some(a) => self.run_action(
                                out,
                                a,
                                format_args!("exit"),
                                redrive::Point::ExitAction { next: n },
                                |v| Next::Exited(n, v),
                                |run| Phase::Exit { next: n, run },
                            ),
                        }
                    }
                }
                Next::Exited(n, v) => {
                    let st = &m.states[self.s.state.unwrap_or(0)];
                    let kept = st.exit_handler.as_ref().map(|_| v.clone());
                    match self.apply(st.exit_handler.as_ref(), v, "exitResultHandler") {
                        Ok(()) => Next::Enter(n),
                        Err(e) => {
                            self.point = kept.map(|v| {
                                redrive::after_handler(
                                    v,
                                    |value| redrive::Point::Exited { next: n, value },
                                    redrive::Point::ExitAction { next: n },
                                )
                            });
                            self.fail(out, e)
                        }
                    }
                }
            };
        }
    }

    /// Starts an action at `site` of the current visit; continues with `done` or parks in `phase`.
    fn run_action(
        &mut self,
        out: &mut Output,
        action: usize,
        site: std::fmt::Arguments,
        again: redrive::Point,
        done: impl FnOnce(Val) -> Next,
        phase: impl FnOnce(Run) -> Phase,
    ) -> Next {
        let view = match self.view() {
            Ok(v) => v,
            Err(e) => {
                self.point = Some(again);
                return self.fail(out, e);
            }
        };
        // The action's position, written into a buffer kept from step to step.
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        let _ = write!(path, "{}.{site}", self.s.visit);
        let step = start(&mut self.cx(out), action, view, &path, 1);
        self.path = path;
        match step {
            Step::Done(v) => done(v),
            Step::Fail(e) => {
                self.point = Some(again);
                self.fail(out, e)
            }
            Step::Pending(run) => {
                self.s.phase = phase(run);
                Next::Stop
            }
        }
    }

    fn evaluate(&mut self, m: &Machine, out: &mut Output) -> Next {
        let st = &m.states[self.s.state.unwrap_or(0)];
        if st.transitions.is_empty() {
            self.end(out, Status::Completed, None);
            return Next::Stop;
        }
        // Without an input filter the view is the data itself: conditions read it where it is.
        let filtered = match st.input_filter {
            None => None,
            Some(_) => match self.view() {
                Ok(v) => Some(v),
                Err(e) => {
                    self.point = Some(redrive::Point::Evaluate);
                    return self.fail(out, e);
                }
            },
        };
        let view = filtered.as_ref().unwrap_or(&self.s.data.0);
        for (i, t) in st.transitions.iter().enumerate() {
            match t.trigger {
                Trigger::Implicit => return Next::Fire(i, "implicit"),
                Trigger::Condition => {
                    let Some(c) = &t.condition else { continue };
                    match fires(c, view, &Val::Null, self.options.trace, out) {
                        Ok(true) => return Next::Fire(i, "condition"),
                        Ok(false) => {}
                        Err(e) => {
                            self.point = Some(redrive::Point::Evaluate);
                            return self.fail(
                                out,
                                ErrorInfo::new(
                                    ErrorKind::ExpressionError,
                                    format!(
                                        "condition of transition {i} failed: {} (in {})",
                                        e.message, e.expression
                                    ),
                                ),
                            );
                        }
                    }
                }
                _ => {}
            }
        }
        for (i, t) in st.transitions.iter().enumerate() {
            if t.trigger != Trigger::Events {
                continue;
            }
            match self.match_groups(out, i, view) {
                Err(e) => {
                    self.point = Some(redrive::Point::Evaluate);
                    return self.fail(out, e);
                }
                Ok(None) => {}
                Ok(Some(chosen)) => {
                    // Consume the matched events, bind correlation values, run the group handlers.
                    let mut events: Vec<(usize, Value)> = Vec::new();
                    let mut order: Vec<usize> = chosen.iter().map(|(_, idx, _)| *idx).collect();
                    order.sort_unstable();
                    for (g, idx, def) in &chosen {
                        events.push((*g, self.s.inbox[*idx].clone()));
                        event::bind(&m.events[*def], &self.s.inbox[*idx], &mut self.s.bindings);
                        let (name, id) = (
                            m.events[*def].name.clone(),
                            event::attribute_text(&self.s.inbox[*idx], "id").unwrap_or_default(),
                        );
                        self.cx(out).trace(|| Trace::EventConsumed { event: name, id });
                    }
                    for idx in order.into_iter().rev() {
                        self.s.inbox.remove(idx);
                    }
                    for (g, ev) in events {
                        let handler = t.groups[g].handler.as_ref();
                        if let Err(e) = self.apply(handler, event::event_value(&ev), "event group resultHandler") {
                            return self.fail(out, e);
                        }
                    }
                    return Next::Fire(i, "events");
                }
            }
        }
        let timeout = st.transitions.iter().find(|t| t.trigger == Trigger::Timeout);
        let has_events = st.transitions.iter().any(|t| t.trigger == Trigger::Events);
        if timeout.is_none() && !has_events {
            let e = ErrorInfo::new(
                ErrorKind::NoTransition,
                format!("state {:?} cannot proceed: no transition condition holds and it has no event or timeout transition", st.name),
            );
            self.point = Some(redrive::Point::Evaluate);
            return self.fail(out, e);
        }
        if let (Some(t), None) = (timeout, &self.s.state_timer) {
            let timer = format!("{}.timeout", self.s.visit);
            let ms = t.timeout_ms.unwrap_or(0);
            self.cx(out).start_timer(&timer, ms);
            self.s.state_timer = Some(timer);
        }
        self.s.phase = Phase::Waiting;
        self.s.status = Status::Waiting;
        Next::Stop
    }

    /// Finds one inbox event per event group of transition `t`: `(group, inbox index, event definition)`.
    #[allow(clippy::type_complexity)]
    fn match_groups(
        &self,
        out: &mut Output,
        t: usize,
        view: &Val,
    ) -> Result<Option<Vec<(usize, usize, usize)>>, ErrorInfo> {
        let m = &self.machine;
        let tr = &m.states[self.s.state.unwrap_or(0)].transitions[t];
        let mut chosen: Vec<(usize, usize, usize)> = Vec::new();
        for (g, group) in tr.groups.iter().enumerate() {
            let mut found = None;
            'inbox: for (idx, ev) in self.s.inbox.iter().enumerate() {
                if chosen.iter().any(|(_, i, _)| *i == idx) {
                    continue;
                }
                for &def in &group.events {
                    if event::mismatch(&m.events[def], ev, &self.s.data.0, &self.s.bindings).is_some() {
                        continue;
                    }
                    if let Some(c) = &group.condition {
                        let v = event::event_value(ev);
                        match fires(c, &v, &v, self.options.trace, out) {
                            Ok(true) => {}
                            Ok(false) => continue,
                            Err(e) => {
                                return Err(ErrorInfo::new(
                                    ErrorKind::ExpressionError,
                                    format!("event group condition failed: {} (in {})", e.message, e.expression),
                                ))
                            }
                        }
                    }
                    found = Some((g, idx, def));
                    break 'inbox;
                }
            }
            match found {
                Some(f) => chosen.push(f),
                None => return Ok(None),
            }
        }
        if let Some(c) = &tr.condition {
            match fires(c, view, &Val::Null, self.options.trace, out) {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(e) => {
                    return Err(ErrorInfo::new(
                        ErrorKind::ExpressionError,
                        format!(
                            "condition of transition {t} failed: {} (in {})",
                            e.message, e.expression
                        ),
                    ))
                }
            }
        }
        Ok(Some(chosen))
    }

    fn exec_timeout(&mut self, out: &mut Output) -> Next {
        // A redrive goes on from here: the state's transitions again, or the action it ran.
        let point = match &self.s.phase {
            Phase::Waiting => Some(redrive::Point::Evaluate),
            p @ (Phase::Enter { .. } | Phase::Transition { .. } | Phase::Exit { .. }) => Some(redrive::Point::Action {
                phase: Box::new(p.clone()),
            }),
            _ => None,
        };
        self.s.redrive.get_or_insert_with(Default::default).point = point;
        self.cancel_phase(out);
        let m = self.machine.clone();
        match m.timeout.as_ref().and_then(|t| t.action) {
            None => self.finish_timed_out(out),
            Some(a) => {
                let data = self.s.data.0.clone();
                match start(&mut self.cx(out), a, data, "timeout", 1) {
                    Step::Pending(run) => self.s.phase = Phase::TimeoutAction { run },
                    _ => self.finish_timed_out(out),
                }
            }
        }
        Next::Stop
    }

    fn finish_timed_out(&mut self, out: &mut Output) {
        let ms = self.machine.timeout.as_ref().map_or(0, |t| t.duration_ms);
        let mut e = ErrorInfo::new(
            ErrorKind::Timeout,
            format!("the execution timeout of {} elapsed", timespan::format(ms)),
        );
        e.state = self.state_name().map(str::to_string);
        self.end(out, Status::TimedOut, Some(e));
    }

    fn cancel_phase(&mut self, out: &mut Output) {
        let phase = std::mem::replace(&mut self.s.phase, Phase::Ended);
        match &phase {
            Phase::Enter { run }
            | Phase::Transition { run, .. }
            | Phase::Exit { run, .. }
            | Phase::TimeoutAction { run } => cancel(&mut self.cx(out), run),
            _ => {}
        }
    }

    fn fail(&mut self, out: &mut Output, mut e: ErrorInfo) -> Next {
        if e.state.is_none() {
            e.state = self.state_name().map(str::to_string);
        }
        self.end(out, Status::Failed, Some(e));
        Next::Stop
    }

    fn end(&mut self, out: &mut Output, status: Status, error: Option<ErrorInfo>) {
        self.cancel_phase(out);
        let timers: Vec<String> = self.s.timers.keys().cloned().collect();
        let mut cx = self.cx(out);
        for t in timers {
            cx.cancel_timer(&t);
        }
        cx.trace(|| Trace::Finished { status });
        self.s.state_timer = None;
        self.s.phase = Phase::Ended;
        self.s.status = status;
        self.s.error = error;
        self.s.ended_at = Some(self.s.now);
        // Where a redrive goes on from: the point set just before a failure (none: it cannot),
        // the one the execution timeout kept.
        let point = self.point.take();
        match status {
            Status::Failed => {
                if point.is_some() || self.s.redrive.is_some() {
                    self.s.redrive.get_or_insert_with(Default::default).point = point;
                }
            }
            Status::TimedOut => {}
            _ => {
                if let Some(r) = self.s.redrive.as_mut() {
                    r.point = None;
                }
            }
        }
    }
}

/// What differs between two effects, field by field (`; arguments: {..} in the journal, {..} now`).
fn differences(recorded: &Effect, produced: &Effect) -> String {
    let (a, b) = (
        serde_json::to_value(recorded).unwrap_or_default(),
        serde_json::to_value(produced).unwrap_or_default(),
    );
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return String::new();
    };
    let mut out = String::new();
    for (k, v) in a {
        let w = b.get(k).unwrap_or(&Value::Null);
        if v != w {
            out += &format!("; {k}: {v} in the journal, {w} now");
        }
    }
    out
}

/// Fields in which a replayed snapshot differs from the saved one, with both values.
pub fn snapshot_differences(replayed: &Snapshot, saved: &Snapshot) -> Vec<String> {
    let (a, b) = (
        serde_json::to_value(replayed).unwrap_or_default(),
        serde_json::to_value(saved).unwrap_or_default(),
    );
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return Vec::new();
    };
    a.iter()
        .filter(|(k, v)| b.get(k.as_str()) != Some(*v))
        .map(|(k, v)| {
            format!(
                "{k} replays to {v} but the instance has {}",
                b.get(k.as_str()).unwrap_or(&Value::Null)
            )
        })
        .collect()
}

/// A short description of an effect, for replay messages.
pub fn describe(e: &Effect) -> String {
    match e {
        Effect::InvokeFunction { op, function, .. } => format!("a call of function {function:?} (operation {op})"),
        Effect::StartSubflow { op, definition, .. } => format!("a subflow {definition:?} (operation {op})"),
        Effect::SendEvent { op, event } => {
            format!(
                "an event of type {} (operation {op})",
                event.get("type").map(|t| t.to_string()).unwrap_or_default()
            )
        }
        Effect::StartTimer { timer, due } => format!("a timer {timer:?} due at {}", rfc3339(*due)),
        Effect::CancelTimer { timer } => format!("cancelling timer {timer:?}"),
        Effect::CancelOperation { op } => format!("cancelling operation {op}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Arc<Machine> {
        Arc::new(
            crate::load(
                &serde_json::json!({"id": "r", "name": "r", "version": "1",
                    "states": [{"name": "s", "start": true, "end": true}]}),
                &mut crate::no_files,
                crate::LoadOptions::default(),
            )
            .unwrap(),
        )
    }

    #[test]
    fn seeds_are_pinned() {
        // Taken from the build before the hash moved to the kernel: an instance's first random
        // state is a function of its id only, the same in every version.
        let seed = |id: &str| Instance::new(machine(), id, Options::default()).s.rng.state();
        assert_eq!(seed(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(seed("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(seed("order-1"), 0xdee4_809f_34be_e86d);
        assert_eq!(seed("helloworld-1"), 0x4b73_a172_0337_8fcf);
    }

    #[test]
    fn random_units_are_pinned() {
        // Taken from the build before the random source moved to the kernel.
        let mut instance = Instance::new(machine(), "order-1", Options::default());
        assert_eq!(instance.s.rng.state(), 0xdee4_809f_34be_e86d);
        let mut out = Output::default();
        let mut cx = instance.cx(&mut out);
        assert_eq!(cx.random_unit(), 0.2934515912633091);
        assert_eq!(
            cx.random_unit(),
            (0x313b_2716_b1f7_535e_u64 >> 11) as f64 / (1u64 << 53) as f64
        );
        assert_eq!(instance.s.rng.state(), 0x1b53_7412_3353_e097);
    }
}
