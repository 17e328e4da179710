//! The step debugger in the engine: breakpoints of each kind pause an instance, `step` pauses at
//! the next point, inputs that arrive while paused are handled after the resume, and a journal
//! with pauses and resumes replays to the same instance.

use serde_json::{json, Value};
use sm4c_runtime::{
    load, no_files, Breakpoint, Entry, Input, Instance, LoadOptions, Machine, Options, Status, Timed, Trace,
};
use std::sync::Arc;

fn machine() -> Arc<Machine> {
    let doc = json!({
        "id": "dbg", "name": "dbg", "version": "1",
        "events": [{"name": "go", "type": "go"}],
        "states": [
            {"name": "A", "start": true,
             "enterAction": {"type": "injectData", "expression": "${ 1 }"},
             "enterResultHandler": "${ .a = $value }",
             "exitAction": {"type": "injectData", "expression": "${ 2 }"},
             "exitResultHandler": "${ .x = $value }",
             "transitions": [
                 {"nextState": "B", "eventGroups": [{"events": ["go"], "resultHandler": "${ .go = $value.data }"}],
                  "action": {"type": "injectData", "expression": "${ 3 }"},
                  "resultHandler": "${ .t = $value }"}]},
            {"name": "B",
             "enterAction": {"type": "injectData", "expression": "${ 4 }"},
             "enterResultHandler": "${ .b = $value }"}
        ]
    });
    Arc::new(load(&doc, &mut no_files, LoadOptions::default()).expect("valid definition"))
}

fn options() -> Options {
    Options {
        journal: true,
        trace: true,
        ..Options::default()
    }
}

/// Runs inputs through a fresh instance, keeping the journal.
struct Run {
    inst: Instance,
    journal: Vec<Entry>,
    at: i64,
}

impl Run {
    fn new() -> Run {
        Run {
            inst: Instance::new(machine(), "i-1", options()),
            journal: Vec::new(),
            at: 1_000,
        }
    }

    fn give(&mut self, input: Input) -> &mut Run {
        self.at += 10;
        let out = self.inst.handle(Timed { at: self.at, input });
        self.journal.extend(out.entries);
        self
    }

    fn breakpoints(&mut self, b: Vec<Breakpoint>) -> &mut Run {
        self.give(Input::Debug { breakpoints: b })
    }

    fn start(&mut self) -> &mut Run {
        self.give(Input::Start {
            data: json!({}),
            scheduled: None,
        })
    }

    fn event(&mut self) -> &mut Run {
        self.give(Input::Event {
            event: json!({"specversion": "1.0", "id": "e1", "source": "t", "type": "go", "data": 7}),
        })
    }

    fn resume(&mut self, step: bool) -> &mut Run {
        self.give(Input::Resume { step })
    }

    fn status(&self) -> Status {
        self.inst.status()
    }

    fn at(&self) -> Option<Breakpoint> {
        self.inst.paused_at().cloned()
    }

    fn data(&self) -> Value {
        self.inst.data()
    }

    /// Replaying the journal gives the same instance.
    fn replays(&self) {
        let r = Instance::replay(machine(), "i-1", &self.journal, options()).expect("replays");
        assert_eq!(r.snapshot(), self.inst.snapshot());
    }
}

fn enter(s: &str) -> Breakpoint {
    Breakpoint::Enter { state: s.into() }
}

fn action(s: &str, a: &str) -> Breakpoint {
    Breakpoint::Action {
        state: s.into(),
        action: a.into(),
    }
}

fn transition(s: &str, t: Option<usize>) -> Breakpoint {
    Breakpoint::Transition {
        state: s.into(),
        transition: t,
    }
}

#[test]
fn pauses_before_entering_a_state_and_resumes() {
    let mut r = Run::new();
    r.breakpoints(vec![enter("A")]).start();
    assert_eq!(r.status(), Status::Paused);
    assert_eq!(r.at(), Some(enter("A")));
    assert_eq!(r.data(), json!({}), "nothing of A ran yet");
    assert!(r.journal.contains(&Entry::Trace(Trace::Paused { at: enter("A") })));
    r.resume(false);
    assert_eq!(r.status(), Status::Waiting);
    assert_eq!(r.data(), json!({"a": 1}));
    assert_eq!(r.at(), None);
    r.replays();
}

#[test]
fn pauses_before_each_action() {
    for (bp, data) in [
        (action("A", "enter"), json!({})),
        (action("A", "t0"), json!({"a": 1, "go": 7})),
        (action("A", "exit"), json!({"a": 1, "go": 7, "t": 3})),
        (action("B", "enter"), json!({"a": 1, "go": 7, "t": 3, "x": 2})),
    ] {
        let mut r = Run::new();
        r.breakpoints(vec![bp.clone()]).start().event();
        assert_eq!(r.status(), Status::Paused, "{bp:?}");
        assert_eq!(r.at(), Some(bp.clone()));
        assert_eq!(r.data(), data, "{bp:?}");
        r.replays();
        r.resume(false);
        if bp == action("A", "enter") {
            // The event arrived while paused: it waited and is handled now.
            assert_eq!(r.data()["go"], 7);
        }
        assert_eq!(r.status(), Status::Completed, "{bp:?}");
        assert_eq!(r.data(), json!({"a": 1, "go": 7, "t": 3, "x": 2, "b": 4}));
        r.replays();
    }
}

#[test]
fn pauses_before_a_transition_any_or_by_index() {
    for bp in [transition("A", None), transition("A", Some(0))] {
        let mut r = Run::new();
        r.breakpoints(vec![bp]).start();
        assert_eq!(r.status(), Status::Waiting);
        r.event();
        assert_eq!(r.status(), Status::Paused);
        assert_eq!(r.at(), Some(transition("A", Some(0))));
        assert_eq!(r.data(), json!({"a": 1, "go": 7}));
        r.resume(false);
        assert_eq!(r.status(), Status::Completed);
        r.replays();
    }
    // Another state's breakpoint never stops it.
    let mut r = Run::new();
    r.breakpoints(vec![transition("B", None)]).start().event();
    assert_eq!(r.status(), Status::Completed);
}

#[test]
fn step_pauses_at_every_next_point() {
    let mut r = Run::new();
    r.breakpoints(vec![enter("A")]).start();
    let mut points = vec![r.at().unwrap()];
    r.resume(true);
    points.push(r.at().unwrap());
    r.resume(true);
    // Waiting for the event: no point until it comes, and the step is kept.
    assert_eq!(r.status(), Status::Waiting);
    r.event();
    while r.status() == Status::Paused {
        points.push(r.at().unwrap());
        r.resume(true);
    }
    assert_eq!(r.status(), Status::Completed);
    assert_eq!(
        points,
        vec![
            enter("A"),
            action("A", "enter"),
            transition("A", Some(0)),
            action("A", "t0"),
            action("A", "exit"),
            enter("B"),
            action("B", "enter"),
        ]
    );
    r.replays();
}

#[test]
fn inputs_while_paused_wait_and_cancel_ends_a_paused_instance() {
    let mut r = Run::new();
    r.breakpoints(vec![enter("A")]).start().event();
    assert_eq!(r.status(), Status::Paused);
    // Breakpoints cleared while paused: it stays paused until resumed.
    r.breakpoints(vec![]);
    assert_eq!(r.status(), Status::Paused);
    r.resume(false);
    assert_eq!(
        r.status(),
        Status::Completed,
        "the held event was handled after the resume"
    );
    assert!(r.inst.snapshot().debug.is_none(), "nothing of the debugger is left");
    r.replays();

    let mut r = Run::new();
    r.breakpoints(vec![enter("A")]).start().event();
    r.give(Input::Cancel { reason: None });
    assert_eq!(r.status(), Status::Cancelled);
    assert_eq!(r.at(), None);
    r.replays();
}

#[test]
fn resume_of_an_instance_not_paused_does_nothing() {
    let mut r = Run::new();
    r.start();
    let mut before = r.inst.snapshot().clone();
    r.resume(false);
    before.now = r.inst.snapshot().now; // every input moves the clock
    assert_eq!(r.inst.snapshot(), &before);
}

#[test]
fn without_breakpoints_nothing_changes() {
    let mut plain = Instance::new(machine(), "i-1", options());
    let mut entries = Vec::new();
    for input in [
        Input::Start {
            data: json!({}),
            scheduled: None,
        },
        Input::Event {
            event: json!({"specversion": "1.0", "id": "e1", "source": "t", "type": "go", "data": 7}),
        },
    ] {
        entries.extend(plain.handle(Timed { at: 5, input }).entries);
    }
    assert!(plain.snapshot().debug.is_none());
    assert!(!serde_json::to_string(&entries).unwrap().contains("aused"));
    assert!(!serde_json::to_string(plain.snapshot()).unwrap().contains("debug"));
    // Breakpoints of other states leave the same journal, apart from the input that set them.
    let mut r = Run::new();
    r.breakpoints(vec![enter("Nowhere")]).start().event();
    let inputs: Vec<&Entry> = r.journal.iter().filter(|e| !matches!(e, Entry::Input(_))).collect();
    let plain_inputs: Vec<&Entry> = entries.iter().filter(|e| !matches!(e, Entry::Input(_))).collect();
    assert_eq!(inputs, plain_inputs);
}

#[test]
fn a_paused_snapshot_round_trips_and_breakpoints_check_against_the_definition() {
    let mut r = Run::new();
    r.breakpoints(vec![action("A", "t0")]).start().event();
    let text = serde_json::to_string(r.inst.snapshot()).unwrap();
    let back: sm4c_runtime::Snapshot = serde_json::from_str(&text).unwrap();
    let mut again = Instance::from_snapshot(machine(), back, options());
    assert_eq!(again.status(), Status::Paused);
    again.handle(Timed {
        at: 9_999,
        input: Input::Resume { step: false },
    });
    assert_eq!(again.status(), Status::Completed);

    let m = machine();
    assert!(enter("A").check(&m).is_ok());
    assert!(action("A", "t0").check(&m).is_ok());
    assert!(transition("A", Some(0)).check(&m).is_ok());
    assert!(enter("Z").check(&m).unwrap_err().contains("no state \"Z\""));
    assert!(action("B", "exit").check(&m).unwrap_err().contains("no exit action"));
    assert!(action("A", "t5").check(&m).unwrap_err().contains("no t5 action"));
    assert!(action("A", "later")
        .check(&m)
        .unwrap_err()
        .contains("not an action name"));
    assert!(transition("A", Some(3))
        .check(&m)
        .unwrap_err()
        .contains("no transition 3"));
    assert!(transition("B", None).check(&m).unwrap_err().contains("no transitions"));
    assert_eq!(
        serde_json::to_value(transition("A", Some(0))).unwrap(),
        json!({"on": "transition", "state": "A", "transition": 0})
    );
    assert_eq!(
        serde_json::from_value::<Breakpoint>(json!({"on": "action", "state": "A", "action": "exit"})).unwrap(),
        action("A", "exit")
    );
}
