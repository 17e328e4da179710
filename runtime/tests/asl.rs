//! ASL executions through the runtime's public API (`load`, `Instance::new/handle/replay/snapshot/
//! from_snapshot`): replay, snapshots in the middle of a Map, deterministic op and timer ids, late
//! results of old attempts, validation pointers, timeouts and cancellation.

use serde_json::{json, Value};
use sm4c_runtime::{
    load, no_files, Effect, Entry, ErrorInfo, ErrorKind, Input, Instance, LoadOptions, Machine, Millis, Options,
    Status, Timed,
};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

fn machine(doc: Value) -> Arc<Machine> {
    Arc::new(load(&doc, &mut no_files, LoadOptions::default()).expect("valid definition"))
}

/// The pointers of the validation errors of `doc` (it must be invalid).
fn pointers(doc: Value) -> Vec<String> {
    match load(&doc, &mut no_files, LoadOptions::default()) {
        Ok(_) => panic!("expected {doc} to be invalid"),
        Err(errors) => errors.into_iter().map(|e| e.pointer).collect(),
    }
}

/// A task failure with an ASL error name, as a host reports it.
fn task_error(name: &str, cause: &str) -> ErrorInfo {
    ErrorInfo::new(ErrorKind::FunctionError, cause).with_details(json!({"Error": name, "Cause": cause}))
}

/// How the simulated host answers a task, from the effect's op, function (Resource) and arguments:
/// a result, or an ASL error name and cause.
type Answer = fn(&str, &str, &Value) -> Result<Value, (&'static str, &'static str)>;

/// A host in a test: answers tasks at once (in order), fires timers when nothing else is left
/// (earliest first, moving the clock to their due time), and keeps what the instance produced.
#[derive(Clone)]
struct Host {
    now: Millis,
    queue: VecDeque<Input>,
    timers: BTreeMap<String, Millis>,
    answer: Answer,
    /// Every effect, in order.
    effects: Vec<Effect>,
    /// The journal.
    journal: Vec<Entry>,
    /// Inputs handled so far.
    inputs: usize,
}

impl Host {
    fn new(answer: Answer) -> Host {
        Host {
            now: 1_000,
            queue: VecDeque::new(),
            timers: BTreeMap::new(),
            answer,
            effects: Vec::new(),
            journal: Vec::new(),
            inputs: 0,
        }
    }

    fn feed(&mut self, i: &mut Instance, input: Input) {
        let out = i.handle(Timed { at: self.now, input });
        self.inputs += 1;
        self.journal.extend(out.entries);
        for e in out.effects {
            match &e {
                Effect::InvokeFunction {
                    op,
                    function,
                    arguments,
                    ..
                } => self.queue.push_back(match (self.answer)(op, function, arguments) {
                    Ok(result) => Input::Completed { op: op.clone(), result },
                    Err((name, cause)) => Input::Failed {
                        op: op.clone(),
                        error: task_error(name, cause),
                    },
                }),
                Effect::StartTimer { timer, due } => {
                    self.timers.insert(timer.clone(), *due);
                }
                Effect::CancelTimer { timer } => {
                    self.timers.remove(timer);
                }
                Effect::CancelOperation { op } => self
                    .queue
                    .retain(|q| !matches!(q, Input::Completed { op: o, .. } | Input::Failed { op: o, .. } if o == op)),
                _ => {}
            }
            self.effects.push(e);
        }
    }

    /// Delivers the next input; false when there is none.
    fn step(&mut self, i: &mut Instance) -> bool {
        if i.status().is_final() {
            return false;
        }
        if let Some(input) = self.queue.pop_front() {
            self.feed(i, input);
            return true;
        }
        let Some((timer, due)) = self.timers.iter().min_by_key(|(t, d)| (**d, (*t).clone())) else {
            return false;
        };
        let (timer, due) = (timer.clone(), *due);
        self.timers.remove(&timer);
        self.now = self.now.max(due);
        self.feed(i, Input::TimerFired { timer });
        true
    }

    fn run(&mut self, i: &mut Instance) {
        let mut n = 0;
        while self.step(i) {
            n += 1;
            assert!(n < 1_000, "the execution does not end");
        }
    }

    fn ops(&self) -> Vec<String> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::InvokeFunction { op, .. } => Some(op.clone()),
                _ => None,
            })
            .collect()
    }

    fn started_timers(&self) -> Vec<String> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::StartTimer { timer, .. } => Some(timer.clone()),
                _ => None,
            })
            .collect()
    }
}

fn start(m: &Arc<Machine>, host: &mut Host, data: Value) -> Instance {
    let mut i = Instance::new(m.clone(), "exec-1", Options::default());
    host.feed(&mut i, Input::Start { data, scheduled: None });
    i
}

/// A Task with a retry, a Wait, a Parallel (a Task and a Pass) and a Map with MaxConcurrency 1.
fn order() -> Value {
    json!({
        "StartAt": "Charge",
        "States": {
            "Charge": {
                "Type": "Task", "Resource": "charge",
                "Parameters": {"amount.$": "$.amount"},
                "Retry": [{"ErrorEquals": ["Flaky"], "IntervalSeconds": 2, "MaxAttempts": 2, "BackoffRate": 2}],
                "ResultPath": "$.charge", "Next": "Pause"
            },
            "Pause": {"Type": "Wait", "Seconds": 5, "Next": "Both"},
            "Both": {
                "Type": "Parallel", "ResultPath": "$.both", "Next": "Lines",
                "Branches": [
                    {"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "audit", "End": true}}},
                    {"StartAt": "B", "States": {"B": {"Type": "Pass", "Result": "b", "End": true}}}
                ]
            },
            "Lines": {
                "Type": "Map", "ItemsPath": "$.items", "MaxConcurrency": 1, "ResultPath": "$.shipped",
                "ItemProcessor": {"StartAt": "Ship", "States": {
                    "Ship": {
                        "Type": "Task", "Resource": "ship",
                        "Retry": [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 1, "MaxAttempts": 1}],
                        "Next": "Rest"
                    },
                    "Rest": {"Type": "Wait", "Seconds": 1, "End": true}
                }},
                "End": true
            }
        }
    })
}

/// `charge` fails with `Flaky` on its first attempt; `ship` fails once for item 2; the rest succeed.
fn order_answer(op: &str, function: &str, args: &Value) -> Result<Value, (&'static str, &'static str)> {
    match function {
        "charge" if !op.contains('@') => Err(("Flaky", "try again")),
        "charge" => Ok(json!({"charged": args["amount"]})),
        "audit" => Ok(json!("audited")),
        "ship" if *args == json!(2) && !op.contains('@') => Err(("Lost", "parcel lost")),
        "ship" => Ok(json!({"shipped": args})),
        other => panic!("unexpected task {other}"),
    }
}

fn order_input() -> Value {
    json!({"amount": 12, "items": [1, 2, 3]})
}

fn order_output() -> Value {
    json!({
        "amount": 12, "items": [1, 2, 3],
        "charge": {"charged": 12},
        "both": ["audited", "b"],
        "shipped": [{"shipped": 1}, {"shipped": 2}, {"shipped": 3}]
    })
}

#[test]
fn an_asl_execution_with_task_wait_retry_parallel_and_map_completes() {
    let m = machine(order());
    let mut host = Host::new(order_answer);
    let mut i = start(&m, &mut host, order_input());
    host.run(&mut i);
    assert_eq!(i.status(), Status::Completed, "{:?}", i.error());
    assert_eq!(i.data(), order_output());
    assert!(
        i.timers().is_empty(),
        "no timer outlives the execution: {:?}",
        i.timers()
    );
}

#[test]
fn replaying_the_journal_gives_the_same_effects_and_state() {
    let m = machine(order());
    let mut host = Host::new(order_answer);
    let mut i = start(&m, &mut host, order_input());
    host.run(&mut i);
    assert_eq!(i.status(), Status::Completed);

    let replayed = Instance::replay(m.clone(), "exec-1", &host.journal, Options::default()).expect("replays");
    assert_eq!(replayed.snapshot(), i.snapshot());
    assert_eq!(replayed.data(), order_output());

    // Feeding the journal's inputs to a fresh instance asks for exactly the recorded effects.
    let recorded: Vec<Effect> = host
        .journal
        .iter()
        .filter_map(|e| match e {
            Entry::Effect(e) => Some(e.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(recorded, host.effects);
    let mut fresh = Instance::new(m.clone(), "exec-1", Options::default());
    let mut effects = Vec::new();
    for e in &host.journal {
        if let Entry::Input(t) = e {
            effects.extend(fresh.handle(t.clone()).effects);
        }
    }
    assert_eq!(effects, host.effects);
    assert_eq!(fresh.snapshot(), i.snapshot());

    // Replaying a prefix of the journal gives the instance as it was then; it goes on the same way.
    let cut = host
        .journal
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, Entry::Input(_)))
        .map(|(n, _)| n)
        .nth(6)
        .expect("more than six inputs");
    let mut partial = Instance::replay(m, "exec-1", &host.journal[..cut], Options::default()).expect("prefix replays");
    assert!(!partial.status().is_final());
    for e in &host.journal[cut..] {
        if let Entry::Input(t) = e {
            partial.handle(t.clone());
        }
    }
    assert_eq!(partial.snapshot(), i.snapshot());
}

#[test]
fn a_replay_against_a_changed_definition_is_refused() {
    let m = machine(order());
    let mut host = Host::new(order_answer);
    let mut i = start(&m, &mut host, order_input());
    host.run(&mut i);
    let mut changed = order();
    changed["States"]["Charge"]["Resource"] = json!("charge-v2");
    let err = Instance::replay(machine(changed), "exec-1", &host.journal, Options::default())
        .err()
        .expect("a different Resource asks for different effects");
    assert!(err.message.contains("charge"), "{}", err.message);
}

#[test]
fn a_snapshot_restored_in_the_middle_of_a_map_finishes_like_an_execution_that_never_stopped() {
    let m = machine(order());
    let mut whole = Host::new(order_answer);
    let mut reference = start(&m, &mut whole, order_input());
    whole.run(&mut reference);
    assert_eq!(reference.status(), Status::Completed);

    // Stop as soon as the second Map iteration has asked for its task, mid-Map.
    let mut host = Host::new(order_answer);
    let mut i = start(&m, &mut host, order_input());
    while !host.ops().iter().any(|op| op.contains("/1/Ship")) {
        assert!(host.step(&mut i), "the Map's second iteration never starts");
    }
    assert_eq!(i.state_name(), Some("Lines"));
    let text = serde_json::to_string(i.snapshot()).expect("snapshot serialises");
    drop(i);
    let snapshot = serde_json::from_str(&text).expect("snapshot deserialises");
    let mut restored = Instance::from_snapshot(m.clone(), snapshot, Options::default());
    assert_eq!(
        serde_json::to_value(restored.snapshot()).unwrap(),
        serde_json::from_str::<Value>(&text).unwrap()
    );
    host.run(&mut restored);
    assert_eq!(restored.status(), Status::Completed, "{:?}", restored.error());
    assert_eq!(restored.data(), reference.data());
    assert_eq!(host.effects, whole.effects);
    assert_eq!(restored.snapshot(), reference.snapshot());
}

#[test]
fn op_and_timer_ids_are_deterministic_and_distinct_per_iteration_and_attempt() {
    let m = machine(order());
    let mut a = Host::new(order_answer);
    let mut ia = start(&m, &mut a, order_input());
    a.run(&mut ia);
    let mut b = Host::new(order_answer);
    let mut ib = start(&m, &mut b, order_input());
    b.run(&mut ib);
    assert_eq!(
        a.effects, b.effects,
        "the same execution asks for the same effects with the same ids"
    );

    let ops = a.ops();
    let mut unique = ops.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ops.len(), "op ids repeat: {ops:?}");
    // Charge twice (first attempt, retry), audit, ship three times plus one retry.
    assert_eq!(ops.len(), 7, "{ops:?}");
    let charge: Vec<&String> = ops.iter().filter(|o| o.contains("Charge")).collect();
    assert_eq!(charge.len(), 2);
    assert_ne!(charge[0], charge[1], "each attempt has its own op");
    let ship: Vec<&String> = ops.iter().filter(|o| o.contains("Ship")).collect();
    assert_eq!(ship.len(), 4, "{ship:?}");
    for k in 0..3 {
        assert!(
            ship.iter().any(|o| o.contains(&format!("/{k}/"))),
            "iteration {k} has an op of its own: {ship:?}"
        );
    }

    let timers = a.started_timers();
    let mut unique = timers.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), timers.len(), "timer ids repeat: {timers:?}");
    // One retry of Charge, the Pause, one retry of Ship and one Rest per iteration.
    assert_eq!(timers.len(), 6, "{timers:?}");

    // Other execution ids give the same op ids: they derive from positions, not from the id or the clock.
    let mut c = Host::new(order_answer);
    c.now = 5_000_000;
    let mut ic = Instance::new(m.clone(), "another", Options::default());
    c.feed(
        &mut ic,
        Input::Start {
            data: order_input(),
            scheduled: None,
        },
    );
    c.run(&mut ic);
    assert_eq!(c.ops(), ops);
}

#[test]
fn a_result_for_an_old_attempt_is_ignored() {
    let m = machine(json!({
        "StartAt": "Call",
        "States": {
            "Call": {
                "Type": "Task", "Resource": "slow", "TimeoutSeconds": 10,
                "Retry": [{"ErrorEquals": ["States.Timeout"], "IntervalSeconds": 1, "MaxAttempts": 1}],
                "End": true
            }
        }
    }));
    let mut i = Instance::new(m, "late", Options::default());
    let out = i.handle(Timed {
        at: 0,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    let first = match &out.effects[0] {
        Effect::InvokeFunction { op, .. } => op.clone(),
        other => panic!("expected the task, got {other:?}"),
    };
    let timeout = i.timers().keys().next().expect("TimeoutSeconds timer").clone();
    let out = i.handle(Timed {
        at: 10_000,
        input: Input::TimerFired { timer: timeout },
    });
    assert!(
        out.effects.contains(&Effect::CancelOperation { op: first.clone() }),
        "{:?}",
        out.effects
    );
    let retry = i.timers().keys().next().expect("retry timer").clone();
    let out = i.handle(Timed {
        at: 11_000,
        input: Input::TimerFired { timer: retry },
    });
    let second = out
        .effects
        .iter()
        .find_map(|e| match e {
            Effect::InvokeFunction { op, .. } => Some(op.clone()),
            _ => None,
        })
        .expect("the second attempt");
    assert_ne!(first, second);

    // The first attempt's result arrives late: nothing happens.
    let before = i.snapshot().clone();
    let out = i.handle(Timed {
        at: 12_000,
        input: Input::Completed {
            op: first.clone(),
            result: json!("stale"),
        },
    });
    assert!(out.effects.is_empty(), "{:?}", out.effects);
    assert_eq!(i.status(), Status::Waiting);
    let mut after = i.snapshot().clone();
    after.now = before.now;
    assert_eq!(after, before);
    let out = i.handle(Timed {
        at: 12_500,
        input: Input::Failed {
            op: first,
            error: task_error("Boom", "stale failure"),
        },
    });
    assert!(out.effects.is_empty());
    assert_eq!(i.status(), Status::Waiting);

    // The current attempt's result counts.
    i.handle(Timed {
        at: 13_000,
        input: Input::Completed {
            op: second,
            result: json!("fresh"),
        },
    });
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(i.data(), json!("fresh"));
}

#[test]
fn validation_errors_carry_json_pointers() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "StartAt names no state",
            json!({"StartAt": "Nope", "States": {"A": {"Type": "Succeed"}}}),
            "/StartAt",
        ),
        (
            "Next names no state",
            json!({"StartAt": "A", "States": {"A": {"Type": "Pass", "Next": "Nowhere"}}}),
            "/States/A/Next",
        ),
        (
            "a path that does not parse",
            json!({"StartAt": "A", "States": {"A": {"Type": "Pass", "InputPath": "$..[", "End": true}}}),
            "/States/A/InputPath",
        ),
        (
            "both Next and End",
            json!({"StartAt": "A", "States": {"A": {"Type": "Pass", "Next": "B", "End": true}, "B": {"Type": "Succeed"}}}),
            "/States/A",
        ),
        (
            "a field the state type does not have",
            json!({"StartAt": "A", "States": {"A": {"Type": "Pass", "End": true, "Colour": "red"}}}),
            "/States/A/Colour",
        ),
        (
            "an intrinsic function that does not exist",
            json!({"StartAt": "A", "States": {"A": {"Type": "Pass", "Parameters": {"x.$": "States.Nope($.a)"}, "End": true}}}),
            "/States/A/Parameters/x.$",
        ),
        (
            "States.ALL not alone and last in Retry",
            json!({"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "r", "End": true, "Retry": [
                {"ErrorEquals": ["States.ALL"]}, {"ErrorEquals": ["Other"]}]}}}),
            "/States/A/Retry/0",
        ),
        (
            "a state inside a Map's processor",
            json!({"StartAt": "M", "States": {"M": {"Type": "Map", "End": true, "ItemProcessor": {
                "StartAt": "I", "States": {"I": {"Type": "Pass", "Next": "Gone"}}}}}}),
            "/States/M/ItemProcessor/States/I/Next",
        ),
    ];
    for (what, doc, pointer) in cases {
        let got = pointers(doc);
        assert!(
            got.iter().any(|p| p.starts_with(pointer)),
            "{what}: expected an error at {pointer}, got {got:?}"
        );
    }
}

#[test]
fn every_validation_error_is_reported_at_once() {
    let got = pointers(json!({
        "StartAt": "A",
        "States": {
            "A": {"Type": "Pass", "Next": "Nowhere"},
            "B": {"Type": "Pass", "OutputPath": "not a path", "End": true},
            "C": {"Type": "Teleport", "End": true}
        }
    }));
    for p in ["/States/A/Next", "/States/B/OutputPath", "/States/C/Type"] {
        assert!(
            got.iter().any(|g| g.starts_with(p)),
            "expected an error at {p}, got {got:?}"
        );
    }
}

#[test]
fn a_task_timeout_fires_states_timeout_and_can_be_caught() {
    let m = machine(json!({
        "StartAt": "Call",
        "States": {
            "Call": {
                "Type": "Task", "Resource": "slow", "TimeoutSeconds": 30, "ResultPath": "$.result",
                "Catch": [{"ErrorEquals": ["States.Timeout"], "ResultPath": "$.error", "Next": "Handled"}],
                "Next": "Done"
            },
            "Handled": {"Type": "Pass", "Result": "timed out", "ResultPath": "$.handled", "End": true},
            "Done": {"Type": "Succeed"}
        }
    }));
    let mut i = Instance::new(m, "t", Options::default());
    let out = i.handle(Timed {
        at: 1_000,
        input: Input::Start {
            data: json!({"n": 1}),
            scheduled: None,
        },
    });
    let op = match &out.effects[0] {
        Effect::InvokeFunction { op, .. } => op.clone(),
        other => panic!("{other:?}"),
    };
    let (timer, due) = match &out.effects[1] {
        Effect::StartTimer { timer, due } => (timer.clone(), *due),
        other => panic!("{other:?}"),
    };
    assert_eq!(due, 31_000);
    let out = i.handle(Timed {
        at: due,
        input: Input::TimerFired { timer },
    });
    assert_eq!(out.effects, vec![Effect::CancelOperation { op }]);
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(
        i.data(),
        json!({"n": 1, "error": {"Error": "States.Timeout"}, "handled": "timed out"})
    );
}

#[test]
fn an_uncaught_task_timeout_fails_the_execution() {
    let m = machine(json!({
        "StartAt": "Call",
        "States": {"Call": {"Type": "Task", "Resource": "slow", "TimeoutSeconds": 1, "End": true}}
    }));
    let mut i = Instance::new(m, "t", Options::default());
    i.handle(Timed {
        at: 0,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    let timer = i.timers().keys().next().unwrap().clone();
    i.handle(Timed {
        at: 1_000,
        input: Input::TimerFired { timer },
    });
    assert_eq!(i.status(), Status::Failed);
    let e = i.error().expect("an error");
    assert_eq!(e.kind, ErrorKind::Other("States.Timeout".into()));
    assert_eq!(e.state.as_deref(), Some("Call"));
}

#[test]
fn the_execution_timeout_ends_it_as_timed_out() {
    let m = machine(json!({
        "TimeoutSeconds": 10,
        "StartAt": "Call",
        "States": {
            "Call": {"Type": "Task", "Resource": "work", "Next": "Sleep"},
            "Sleep": {"Type": "Wait", "Seconds": 3600, "End": true}
        }
    }));
    let mut i = Instance::new(m, "t", Options::default());
    let out = i.handle(Timed {
        at: 0,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    let exec_timer = out
        .effects
        .iter()
        .find_map(|e| match e {
            Effect::StartTimer { timer, due: 10_000 } => Some(timer.clone()),
            _ => None,
        })
        .expect("a timer for the execution's TimeoutSeconds");
    let op = out
        .effects
        .iter()
        .find_map(|e| match e {
            Effect::InvokeFunction { op, .. } => Some(op.clone()),
            _ => None,
        })
        .unwrap();
    let out = i.handle(Timed {
        at: 2_000,
        input: Input::Completed { op, result: json!({}) },
    });
    let wait_timer = out
        .effects
        .iter()
        .find_map(|e| match e {
            Effect::StartTimer { timer, .. } => Some(timer.clone()),
            _ => None,
        })
        .expect("the Wait's timer");
    let out = i.handle(Timed {
        at: 10_000,
        input: Input::TimerFired { timer: exec_timer },
    });
    assert_eq!(i.status(), Status::TimedOut);
    assert_eq!(out.effects, vec![Effect::CancelTimer { timer: wait_timer }]);
    assert_eq!(
        i.error().map(|e| e.kind.clone()),
        Some(ErrorKind::Other("States.Timeout".into()))
    );
    assert!(i.timers().is_empty());
}

#[test]
fn an_execution_that_ends_in_time_cancels_its_timeout_timer() {
    let m = machine(json!({
        "TimeoutSeconds": 10,
        "StartAt": "Call",
        "States": {"Call": {"Type": "Task", "Resource": "work", "End": true}}
    }));
    let mut i = Instance::new(m, "t", Options::default());
    let out = i.handle(Timed {
        at: 0,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    let (exec_timer, op) = match &out.effects[..] {
        [Effect::StartTimer { timer, .. }, Effect::InvokeFunction { op, .. }] => (timer.clone(), op.clone()),
        other => panic!("{other:?}"),
    };
    let out = i.handle(Timed {
        at: 1_000,
        input: Input::Completed { op, result: json!(7) },
    });
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(out.effects, vec![Effect::CancelTimer { timer: exec_timer }]);
}

#[test]
fn cancel_ends_the_execution_and_cancels_what_it_waits_for() {
    let m = machine(json!({
        "StartAt": "Both",
        "States": {
            "Both": {
                "Type": "Parallel", "End": true,
                "Branches": [
                    {"StartAt": "T", "States": {"T": {"Type": "Task", "Resource": "work", "TimeoutSeconds": 60, "End": true}}},
                    {"StartAt": "W", "States": {"W": {"Type": "Wait", "Seconds": 60, "End": true}}},
                    {"StartAt": "M", "States": {"M": {"Type": "Map", "End": true, "ItemProcessor": {
                        "StartAt": "U", "States": {"U": {"Type": "Task", "Resource": "item", "End": true}}}}}}
                ]
            }
        }
    }));
    let mut i = Instance::new(m, "c", Options::default());
    let out = i.handle(Timed {
        at: 0,
        input: Input::Start {
            data: json!([1, 2]),
            scheduled: None,
        },
    });
    let ops: Vec<String> = out
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::InvokeFunction { op, .. } => Some(op.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ops.len(), 3, "{:?}", out.effects);
    let timers: Vec<String> = i.timers().keys().cloned().collect();
    assert_eq!(timers.len(), 2, "the task's timeout and the Wait: {timers:?}");
    assert_eq!(i.status(), Status::Waiting);

    let out = i.handle(Timed {
        at: 5_000,
        input: Input::Cancel {
            reason: Some("no longer wanted".into()),
        },
    });
    assert_eq!(i.status(), Status::Cancelled);
    for op in &ops {
        assert!(
            out.effects.contains(&Effect::CancelOperation { op: op.clone() }),
            "{op} not cancelled: {:?}",
            out.effects
        );
    }
    for timer in &timers {
        assert!(
            out.effects.contains(&Effect::CancelTimer { timer: timer.clone() }),
            "{timer} not cancelled: {:?}",
            out.effects
        );
    }
    assert!(i.timers().is_empty());
    // Inputs after the end change nothing.
    let after = i.handle(Timed {
        at: 6_000,
        input: Input::Completed {
            op: ops[0].clone(),
            result: json!(1),
        },
    });
    assert!(after.effects.is_empty());
    assert_eq!(i.status(), Status::Cancelled);
}

#[test]
fn a_map_with_max_concurrency_one_runs_one_iteration_at_a_time() {
    let m = machine(json!({
        "StartAt": "M",
        "States": {"M": {"Type": "Map", "MaxConcurrency": 1, "End": true,
            "ItemProcessor": {"StartAt": "U", "States": {"U": {"Type": "Task", "Resource": "item", "End": true}}}}}
    }));
    let mut i = Instance::new(m, "m", Options::default());
    let mut out = i.handle(Timed {
        at: 0,
        input: Input::Start {
            data: json!(["a", "b", "c"]),
            scheduled: None,
        },
    });
    let mut seen = Vec::new();
    for n in 0..3 {
        let calls: Vec<(String, Value)> = out
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::InvokeFunction { op, arguments, .. } => Some((op.clone(), arguments.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(calls.len(), 1, "one task at a time: {calls:?}");
        let (op, arg) = calls[0].clone();
        seen.push(arg.clone());
        out = i.handle(Timed {
            at: n + 1,
            input: Input::Completed {
                op,
                result: json!({"done": arg}),
            },
        });
    }
    assert_eq!(seen, vec![json!("a"), json!("b"), json!("c")]);
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(i.data(), json!([{"done": "a"}, {"done": "b"}, {"done": "c"}]));
}

#[test]
fn the_context_object_and_intrinsics_are_deterministic() {
    let m = machine(json!({
        "StartAt": "P",
        "States": {"P": {"Type": "Pass", "End": true, "Parameters": {
            "name.$": "$$.Execution.Name",
            "state.$": "$$.State.Name",
            "started.$": "$$.Execution.StartTime",
            "uuid.$": "States.UUID()",
            "random.$": "States.MathRandom(1, 1000000)"
        }}}
    }));
    let run = |id: &str| {
        let mut i = Instance::new(m.clone(), id, Options::default());
        i.handle(Timed {
            at: 1_700_000_000_000,
            input: Input::Start {
                data: json!({}),
                scheduled: None,
            },
        });
        assert_eq!(i.status(), Status::Completed, "{:?}", i.error());
        i.data()
    };
    let a = run("x-1");
    assert_eq!(a["name"], json!("x-1"));
    assert_eq!(a["state"], json!("P"));
    assert_eq!(a["started"], json!("2023-11-14T22:13:20.000Z"));
    assert_eq!(run("x-1"), a, "the same execution draws the same randomness");
}

/// An ASL order (its version is a digest of its text): `Charge` (a Task) then `Ship` or, in
/// version 2, a renamed charge state whose result goes under `$.receipt` and ends in `Record`.
fn asl_order(v: &str) -> Arc<Machine> {
    let doc = match v {
        "1" => json!({"sm4c:id": "asl-order", "StartAt": "Charge", "States": {
            "Charge": {"Type": "Task", "Resource": "arn:aws:lambda:::function:charge", "TimeoutSeconds": 3600,
                       "ResultPath": "$.charge", "Next": "Ship"},
            "Ship": {"Type": "Pass", "Result": "shipped on 1", "ResultPath": "$.path", "End": true}}}),
        _ => {
            json!({"sm4c:id": "asl-order", "StartAt": "ChargeCard", "TimeoutSeconds": 86400, "States": {
            "ChargeCard": {"Type": "Task", "Resource": "arn:aws:lambda:::function:charge", "TimeoutSeconds": 3600,
                           "ResultPath": "$.receipt", "Next": "Record"},
            "Record": {"Type": "Pass", "Result": format!("recorded on {v}"), "ResultPath": "$.path", "End": true},
            "Pause": {"Type": "Wait", "Seconds": 5, "Next": "Record"}}})
        }
    };
    machine(doc)
}

#[test]
fn an_asl_execution_waiting_for_its_task_moves_to_a_mapped_state_and_takes_the_result_there() {
    let v1 = asl_order("1");
    let v2 = asl_order("2");
    let mut i = Instance::new(v1.clone(), "exec-m", Options::default());
    let mut journal = i
        .handle(Timed {
            at: 1_000,
            input: Input::Start {
                data: json!({"order": 7}),
                scheduled: None,
            },
        })
        .entries;
    let op = journal
        .iter()
        .find_map(|e| match e {
            Entry::Effect(Effect::InvokeFunction { op, .. }) => Some(op.clone()),
            _ => None,
        })
        .expect("the task is called");
    assert_eq!(i.state_name(), Some("Charge"));
    let none = BTreeMap::new();
    let e = i.migrate(v2.clone(), &none, 2_000).expect_err("no counterpart");
    assert_eq!(e.reason, "noCounterpart");
    let wrong: BTreeMap<String, String> = [("Charge".to_string(), "Pause".to_string())].into();
    assert_eq!(
        i.migrate(v2.clone(), &wrong, 2_000)
            .expect_err("a Wait is no Task")
            .reason,
        "otherKind"
    );

    let map: BTreeMap<String, String> = [("Charge".to_string(), "ChargeCard".to_string())].into();
    let out = i.migrate(v2.clone(), &map, 2_000).expect("moves");
    // The task's timeout is kept; the execution timeout of version 2 counts from the move.
    assert_eq!(
        out.effects,
        vec![Effect::StartTimer {
            timer: sm4c_runtime::engine::EXEC_TIMER.into(),
            due: 2_000 + 86_400_000
        }]
    );
    assert_eq!(
        (i.state_name(), &i.snapshot().version, i.status()),
        (Some("ChargeCard"), &v2.version, Status::Waiting)
    );
    journal.extend(out.entries);
    // The task's result is taken by the new state: its ResultPath and Next.
    journal.extend(
        i.handle(Timed {
            at: 3_000,
            input: Input::Completed {
                op,
                result: json!({"id": "r-1"}),
            },
        })
        .entries,
    );
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(
        i.data(),
        json!({"order": 7, "receipt": {"id": "r-1"}, "path": "recorded on 2"})
    );

    let versions = |v: &str| [&v1, &v2].into_iter().find(|m| m.version == v).cloned();
    let replayed =
        Instance::replay_versions(v2.clone(), "exec-m", &journal, Options::default(), &versions).expect("replays");
    assert!(sm4c_runtime::engine::snapshot_differences(replayed.snapshot(), i.snapshot()).is_empty());
}

/// The error a host feeds for an `atMostOnce` call in flight at a crash: the kind, no ASL details.
fn interrupted(op: &str) -> Input {
    Input::Failed {
        op: op.into(),
        error: ErrorInfo::new(ErrorKind::StepInterrupted, "in flight when the host stopped"),
    }
}

#[test]
fn an_interrupted_task_is_the_error_step_interrupted_that_retry_and_catch_name() {
    let m = machine(json!({
        "StartAt": "Charge",
        "States": {
            "Charge": {"Type": "Task", "Resource": "arn:charge", "End": true,
                "Retry": [{"ErrorEquals": ["stepInterrupted"], "IntervalSeconds": 1, "MaxAttempts": 1}],
                "Catch": [{"ErrorEquals": ["States.TaskFailed"], "ResultPath": "$.err", "Next": "Check"}]},
            "Check": {"Type": "Pass", "End": true}
        }
    }));
    let mut i = Instance::new(m, "x", Options::default());
    let out = i.handle(Timed {
        at: 1_000,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    let op = |effects: &[Effect]| {
        effects
            .iter()
            .find_map(|e| match e {
                Effect::InvokeFunction { op, .. } => Some(op.clone()),
                _ => None,
            })
            .expect("a call")
    };
    let first = op(&out.effects);
    // Retried once by the Retry that names it.
    let out = i.handle(Timed {
        at: 2_000,
        input: interrupted(&first),
    });
    let timer = out
        .effects
        .iter()
        .find_map(|e| match e {
            Effect::StartTimer { timer, due } => Some((timer.clone(), *due)),
            _ => None,
        })
        .expect("a retry timer");
    let out = i.handle(Timed {
        at: timer.1,
        input: Input::TimerFired { timer: timer.0 },
    });
    let second = op(&out.effects);
    assert_ne!(first, second);
    // Then caught (States.TaskFailed matches it, as every Task error but a timeout).
    i.handle(Timed {
        at: timer.1 + 1,
        input: interrupted(&second),
    });
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(i.data()["err"]["Error"], json!("stepInterrupted"), "{}", i.data());
    assert_eq!(i.data()["err"]["Cause"], json!("in flight when the host stopped"));
}
