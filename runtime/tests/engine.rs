//! The deterministic engine through its Rust API: effects, operation ids, replay, snapshots.

use proptest::prelude::*;
use serde_json::{json, Value};
use sm4c_runtime::{
    load, no_files, Effect, Entry, ErrorKind, Input, Instance, LoadOptions, Machine, Options, Status, Timed, Trace,
};
use std::sync::Arc;

fn machine(doc: Value) -> Arc<Machine> {
    Arc::new(load(&doc, &mut no_files, LoadOptions::default()).expect("valid definition"))
}

fn start(m: &Arc<Machine>, id: &str, data: Value) -> (Instance, Vec<Effect>) {
    let mut i = Instance::new(m.clone(), id, Options::default());
    let out = i.handle(Timed {
        at: 1_000,
        input: Input::Start { data, scheduled: None },
    });
    (i, out.effects)
}

/// A saga with a waited call, retries, a parallel race, events and timeouts.
fn saga() -> Value {
    json!({
        "id": "saga", "name": "saga", "version": "1",
        "functions": [{"name": "charge", "operation": "http://x/api.json#charge"},
                      {"name": "notify", "operation": "http://x/api.json#notify"}],
        "retries": [{"name": "r", "delay": "PT1S", "multiplier": 2, "maxAttempts": 2, "jitter": 0.5}],
        "events": [{"name": "paid", "type": "payment.done", "correlation": [{"contextAttributeName": "orderId"}]},
                   {"name": "out", "type": "order.request"}],
        "states": [
            {"name": "Charge", "start": true,
             "enterAction": {"type": "sequence", "actions": [
                 {"name": "charge", "type": "invokeFunction", "functionName": "charge", "waitForCompletion": true,
                  "arguments": {"amount": "${ .amount }"},
                  "errorHandlers": [{"condition": "${ .type == \"functionError\" }", "retryPolicy": "r"}]},
                 {"name": "ask", "type": "sendEvent", "event": "out", "expression": "${ {id: .id} }"},
                 {"name": "race", "type": "parallel", "completionType": "xor", "actions": [
                     {"type": "delay", "timeout": "PT5S"},
                     {"type": "invokeFunction", "functionName": "notify", "waitForCompletion": true}]}]},
             "enterResultHandler": "${ .charge = $value }",
             "transitions": [
                 {"nextState": "Done", "eventGroups": [{"events": ["paid"], "resultHandler": "${ .paid = ($value | .data) }"}]},
                 {"nextState": "Late", "timeout": "PT1M"}]},
            {"name": "Done"},
            {"name": "Late"}
        ]
    })
}

#[test]
fn invoke_function_emits_effect_with_deterministic_op_and_waits() {
    let m = machine(saga());
    let (i, effects) = start(&m, "o-1", json!({"amount": 5, "id": "o-1"}));
    assert_eq!(i.status(), Status::Running);
    assert_eq!(
        effects,
        vec![Effect::InvokeFunction {
            op: "1.enter/0".into(),
            function: "charge".into(),
            operation: "http://x/api.json#charge".into(),
            function_type: "rest".into(),
            arguments: json!({"amount": 5}),
            wait: true,
            delivery: Default::default(),
        }]
    );
    // The same instance id gives the same effects: operation ids derive from positions, not randomness.
    let (_, again) = start(&m, "o-1", json!({"amount": 5, "id": "o-1"}));
    assert_eq!(effects, again);
}

#[test]
fn retries_use_policy_delays_and_deterministic_jitter() {
    let m = machine(saga());
    let (mut i, _) = start(&m, "o-1", json!({"amount": 5}));
    let fail = |op: &str| Input::Failed {
        op: op.into(),
        error: sm4c_runtime::ErrorInfo::new(ErrorKind::FunctionError, "down"),
    };
    let out = i.handle(Timed {
        at: 2_000,
        input: fail("1.enter/0"),
    });
    let Some(Effect::StartTimer { timer, due }) = out.effects.first().cloned() else {
        panic!("{:?}", out.effects)
    };
    assert_eq!(timer, "1.enter/0:retry");
    assert!((2_500..=3_500).contains(&due), "1s ± 50% after 2000, got {due}");
    let out = i.handle(Timed {
        at: due,
        input: Input::TimerFired { timer },
    });
    assert!(matches!(&out.effects[0], Effect::InvokeFunction { op, .. } if op == "1.enter/0#2"));
    let out = i.handle(Timed {
        at: due + 10,
        input: fail("1.enter/0#2"),
    });
    let Some(Effect::StartTimer { due: due2, .. }) = out.effects.first().cloned() else {
        panic!()
    };
    assert!((due + 10 + 1_000..=due + 10 + 3_000).contains(&due2), "2s ± 50%");
    // Same id, same failures, same jitter.
    let (mut j, _) = start(&m, "o-1", json!({"amount": 5}));
    let out = j.handle(Timed {
        at: 2_000,
        input: fail("1.enter/0"),
    });
    assert!(matches!(out.effects[0], Effect::StartTimer { due: d, .. } if d == due));
    // Third failure: retries exhausted, the error propagates and fails the instance.
    i.handle(Timed {
        at: due2,
        input: Input::TimerFired {
            timer: "1.enter/0#2:retry".into(),
        },
    });
    i.handle(Timed {
        at: due2 + 1,
        input: fail("1.enter/0#3"),
    });
    assert_eq!(i.status(), Status::Failed);
    assert_eq!(i.error().unwrap().message, "down");
    assert_eq!(i.error().unwrap().state.as_deref(), Some("Charge"));
}

#[test]
fn sent_event_ids_are_deterministic_and_xor_cancels_the_loser() {
    let m = machine(saga());
    let (mut i, _) = start(&m, "o-1", json!({"amount": 5, "id": "o-1"}));
    let out = i.handle(Timed {
        at: 2_000,
        input: Input::Completed {
            op: "1.enter/0".into(),
            result: json!("ok"),
        },
    });
    let sent = out.effects.iter().find_map(|e| match e {
        Effect::SendEvent { event, .. } => Some(event.clone()),
        _ => None,
    });
    let sent = sent.expect("an event is sent");
    assert_eq!(sent["id"], "o-1/1.enter/1");
    assert_eq!(sent["type"], "order.request");
    assert_eq!(sent["sm4cinstanceid"], "o-1");
    assert_eq!(sent["data"], json!({"id": "o-1"}));
    // The delay (5 s) wins the race; the notify call is cancelled.
    let out = i.handle(Timed {
        at: 7_000,
        input: Input::TimerFired {
            timer: "1.enter/2/0:delay".into(),
        },
    });
    assert!(
        out.effects.contains(&Effect::CancelOperation {
            op: "1.enter/2/1".into()
        }),
        "{:?}",
        out.effects
    );
    assert_eq!(i.status(), Status::Waiting);
    assert_eq!(
        i.data()["charge"],
        json!({"charge": "ok", "ask": null, "race": {"0": null}})
    );
}

#[test]
fn events_that_arrive_early_wait_in_the_inbox_and_correlation_binds() {
    let m = machine(saga());
    let (mut i, _) = start(&m, "o-1", json!({"amount": 5}));
    let ev = |id: &str, order: &str| json!({"specversion": "1.0", "id": id, "source": "s", "type": "payment.done", "orderid": order, "data": {"n": id}});
    // Arrives while the enter action still runs.
    i.handle(Timed {
        at: 1_500,
        input: Input::Event { event: ev("e1", "A") },
    });
    i.handle(Timed {
        at: 2_000,
        input: Input::Completed {
            op: "1.enter/0".into(),
            result: json!(1),
        },
    });
    i.handle(Timed {
        at: 2_100,
        input: Input::Completed {
            op: "1.enter/2/1".into(),
            result: json!(2),
        },
    });
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(i.state_name(), Some("Done"));
    assert_eq!(i.data()["paid"], json!({"n": "e1"}));
}

#[test]
fn timeout_transition_fires_when_no_event_comes() {
    let m = machine(saga());
    let (mut i, _) = start(&m, "o-1", json!({}));
    i.handle(Timed {
        at: 2_000,
        input: Input::Completed {
            op: "1.enter/0".into(),
            result: json!(1),
        },
    });
    let out = i.handle(Timed {
        at: 2_100,
        input: Input::Completed {
            op: "1.enter/2/1".into(),
            result: json!(2),
        },
    });
    let due = out.effects.iter().find_map(|e| match e {
        Effect::StartTimer { timer, due } if timer == "1.timeout" => Some(*due),
        _ => None,
    });
    assert_eq!(due, Some(2_100 + 60_000));
    i.handle(Timed {
        at: 62_100,
        input: Input::TimerFired {
            timer: "1.timeout".into(),
        },
    });
    assert_eq!(i.state_name(), Some("Late"));
    assert_eq!(i.status(), Status::Completed);
}

#[test]
fn replay_rebuilds_the_instance_and_detects_a_changed_definition() {
    let m = machine(saga());
    let (mut i, _) = start(&m, "o-1", json!({"amount": 5}));
    let mut journal = vec![];
    let mut fresh = Instance::new(m.clone(), "o-1", Options::default());
    journal.extend(
        fresh
            .handle(Timed {
                at: 1_000,
                input: Input::Start {
                    data: json!({"amount": 5}),
                    scheduled: None,
                },
            })
            .entries,
    );
    for t in [
        Timed {
            at: 2_000,
            input: Input::Completed {
                op: "1.enter/0".into(),
                result: json!("ok"),
            },
        },
        Timed {
            at: 3_000,
            input: Input::Completed {
                op: "1.enter/2/1".into(),
                result: json!("sent"),
            },
        },
    ] {
        i.handle(t.clone());
        journal.extend(fresh.handle(t).entries);
    }
    assert!(
        journal.iter().any(|e| matches!(e, Entry::Effect(_))),
        "effects are journaled"
    );
    let replayed = Instance::replay(m.clone(), "o-1", &journal, Options::default()).expect("replay");
    assert_eq!(replayed.snapshot(), i.snapshot());

    let mut changed = saga();
    changed["functions"][0]["name"] = json!("charge");
    changed["states"][0]["enterAction"]["actions"][0]["arguments"] = json!({"amount": "${ .amount * 2 }"});
    let err = match Instance::replay(machine(changed), "o-1", &journal, Options::default()) {
        Err(e) => e,
        Ok(_) => panic!("a changed definition must not replay silently"),
    };
    // Entries are numbered from 1, as the history API numbers them; the message says what differs.
    assert_eq!(err.index, 2, "{err}");
    assert!(err.to_string().contains("journal entry 2"), "{err}");
    assert!(
        err.to_string()
            .contains(r#"arguments: {"amount":5} in the journal, {"amount":10} now"#),
        "{err}"
    );
}

#[test]
fn snapshots_survive_serialization() {
    let m = machine(saga());
    let (mut i, _) = start(&m, "o-1", json!({"amount": 5}));
    i.handle(Timed {
        at: 2_000,
        input: Input::Completed {
            op: "1.enter/0".into(),
            result: json!("ok"),
        },
    });
    let text = serde_json::to_string(i.snapshot()).unwrap();
    let mut j = Instance::from_snapshot(m.clone(), serde_json::from_str(&text).unwrap(), Options::default());
    let t = Timed {
        at: 3_000,
        input: Input::TimerFired {
            timer: "1.enter/2/0:delay".into(),
        },
    };
    assert_eq!(i.handle(t.clone()), j.handle(t));
    assert_eq!(i.snapshot(), j.snapshot());
}

#[test]
fn wait_for_completion_false_takes_null_and_goes_on() {
    let m = machine(json!({
        "id": "f", "name": "f", "version": "1",
        "functions": [{"name": "fire", "operation": "http://x#y"}],
        "states": [{"name": "A", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "fire", "arguments": {"a": 1}},
            "enterResultHandler": "${ .r = $value }"}]
    }));
    let (i, effects) = start(&m, "f-1", json!({}));
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(i.data(), json!({"r": null}));
    assert!(matches!(&effects[0], Effect::InvokeFunction { wait: false, .. }));
}

#[test]
fn an_endless_loop_of_transitions_fails_instead_of_hanging() {
    let m = machine(json!({
        "id": "l", "name": "l", "version": "1",
        "states": [{"name": "A", "start": true, "transitions": [{"condition": "${ true }"}]}]
    }));
    let mut i = Instance::new(
        m,
        "l-1",
        Options {
            max_transitions: 1_000,
            ..Options::default()
        },
    );
    i.handle(Timed {
        at: 0,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    assert_eq!(i.status(), Status::Failed);
    assert_eq!(i.error().unwrap().kind, "limitExceeded");
}

/// Drives the saga with a random but legal sequence of inputs.
fn drive(m: &Arc<Machine>, choices: &[(u8, u16)]) -> (Instance, Vec<Entry>) {
    let mut i = Instance::new(m.clone(), "p-1", Options::default());
    let mut journal = i
        .handle(Timed {
            at: 0,
            input: Input::Start {
                data: json!({"amount": 3}),
                scheduled: None,
            },
        })
        .entries;
    let mut pending: Vec<String> = vec![
        "1.enter/0".into(),
        "1.enter/2/1".into(),
        "1.enter/0#2".into(),
        "1.enter/0#3".into(),
    ];
    let mut now = 0;
    for (kind, dt) in choices {
        now += *dt as i64;
        let input = match kind % 5 {
            0 => match i.timers().iter().next() {
                Some((t, due)) => {
                    now = now.max(*due);
                    Input::TimerFired { timer: t.clone() }
                }
                None => continue,
            },
            1 => Input::Completed {
                op: pending[(*dt as usize) % pending.len()].clone(),
                result: json!(dt),
            },
            2 => Input::Failed {
                op: pending[(*dt as usize) % pending.len()].clone(),
                error: sm4c_runtime::ErrorInfo::new(ErrorKind::FunctionError, "x"),
            },
            3 => Input::Event {
                event: json!({"specversion": "1.0", "id": format!("e{dt}"), "source": "s", "type": "payment.done", "orderid": "A", "data": dt}),
            },
            _ => {
                pending.push(format!("1.enter/0#{}", dt % 4));
                continue;
            }
        };
        journal.extend(i.handle(Timed { at: now, input }).entries);
    }
    (i, journal)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn replaying_a_journal_reproduces_the_instance(choices in prop::collection::vec((0u8..5, 0u16..5000), 0..40)) {
        let m = machine(saga());
        let (live, journal) = drive(&m, &choices);
        let replayed = Instance::replay(m.clone(), "p-1", &journal, Options::default()).expect("replay succeeds");
        prop_assert_eq!(replayed.snapshot(), live.snapshot());
        // And a snapshot taken anywhere continues identically.
        let restored = Instance::from_snapshot(m.clone(), serde_json::from_value(serde_json::to_value(live.snapshot()).unwrap()).unwrap(), Options::default());
        prop_assert_eq!(restored.snapshot(), live.snapshot());
    }
}

/// Worker tasks with every timeout, retried on any error, then racing a delay.
fn worker_saga() -> Value {
    json!({
        "id": "wsaga", "name": "wsaga", "version": "1",
        "functions": [{"name": "resize", "type": "worker", "operation": "images",
                       "scheduleToStartTimeout": "PT10S", "startToCloseTimeout": "PT30S",
                       "heartbeatTimeout": "PT5S", "scheduleToCloseTimeout": "PT1M"}],
        "retries": [{"name": "r", "delay": "PT1S", "multiplier": 2, "maxAttempts": 2, "jitter": 0.5}],
        "states": [{"name": "A", "start": true,
            "enterAction": {"type": "sequence", "actions": [
                {"type": "invokeFunction", "functionName": "resize", "waitForCompletion": true,
                 "arguments": {"n": "${ .n }"},
                 "errorHandlers": [{"retryPolicy": "r", "resultHandler": "${ .errors += [$value.details.timeoutType // $value.type] }"}]},
                {"type": "parallel", "completionType": "xor", "actions": [
                    {"type": "delay", "timeout": "PT20S"},
                    {"type": "invokeFunction", "functionName": "resize", "waitForCompletion": true, "timeout": "PT15S"}]}]},
            "enterResultHandler": "${ .r = $value }"}]
    })
}

/// Drives the worker saga with a random but legal sequence of worker answers and timers.
fn drive_worker(m: &Arc<Machine>, choices: &[(u8, u16)]) -> (Instance, Vec<Entry>) {
    let mut i = Instance::new(m.clone(), "wp-1", Options::default());
    let mut journal = i
        .handle(Timed {
            at: 0,
            input: Input::Start {
                data: json!({"n": 3}),
                scheduled: None,
            },
        })
        .entries;
    let ops = ["1.enter/0", "1.enter/0#2", "1.enter/0#3", "1.enter/1/1"];
    let mut now = 0;
    for (kind, dt) in choices {
        now += *dt as i64 * 4;
        let op = ops[(*dt as usize) % ops.len()].to_string();
        let input = match kind % 5 {
            0 => match i.timers().iter().min_by_key(|(_, due)| **due) {
                Some((t, due)) => {
                    now = now.max(*due);
                    Input::TimerFired { timer: t.clone() }
                }
                None => continue,
            },
            1 => Input::TaskStarted {
                op,
                worker: Some(format!("w{dt}")),
            },
            2 => Input::TaskHeartbeat {
                op,
                details: (dt % 2 == 0).then(|| json!({"progress": dt})),
            },
            3 => Input::Completed { op, result: json!(dt) },
            _ => Input::Failed {
                op,
                error: sm4c_runtime::ErrorInfo::new(ErrorKind::FunctionError, "x"),
            },
        };
        journal.extend(i.handle(Timed { at: now, input }).entries);
    }
    (i, journal)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn replaying_a_worker_journal_reproduces_the_instance(choices in prop::collection::vec((0u8..5, 0u16..5000), 0..40)) {
        let m = machine(worker_saga());
        let (live, journal) = drive_worker(&m, &choices);
        let replayed = Instance::replay(m.clone(), "wp-1", &journal, Options::default()).expect("replay succeeds");
        prop_assert_eq!(replayed.snapshot(), live.snapshot());
        let restored = Instance::from_snapshot(m.clone(), serde_json::from_value(serde_json::to_value(live.snapshot()).unwrap()).unwrap(), Options::default());
        prop_assert_eq!(restored.snapshot(), live.snapshot());
        // Every timer of a task belongs to a task the instance still waits for.
        for timer in live.timers().keys() {
            if let Some((op, _)) = timer.split_once(':') {
                if !timer.ends_with(":retry") && !timer.ends_with(":delay") && !timer.ends_with(":timeout") {
                    prop_assert!(live.task_started(op).is_some(), "timer {} outlives its task", timer);
                }
            }
        }
    }
}

#[test]
fn a_condition_that_is_not_a_boolean_is_traced_once_per_input() {
    // The event group condition yields a string for every event, so no event matches; each input
    // tries it on every event in the inbox, and says so once.
    let m = machine(json!({
        "id": "t", "name": "t", "version": "1",
        "events": [{"name": "go", "type": "go"}],
        "states": [
            {"name": "Wait", "start": true, "transitions": [
                {"nextState": "Done", "eventGroups": [{"events": ["go"], "condition": "${ .data.flag }"}]}]},
            {"name": "Done"}
        ]
    }));
    let options = Options {
        trace: true,
        ..Options::default()
    };
    let noted = |entries: &[Entry]| -> Vec<Trace> {
        entries
            .iter()
            .filter_map(|e| match e {
                Entry::Trace(t @ Trace::ConditionNotBoolean { .. }) => Some(t.clone()),
                _ => None,
            })
            .collect()
    };
    let mut i = Instance::new(m, "c", options);
    let out = i.handle(Timed {
        at: 1_000,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    assert!(noted(&out.entries).is_empty(), "{:?}", out.entries);
    for n in 1..=3 {
        let out = i.handle(Timed {
            at: 1_000 + n,
            input: Input::Event {
                event: json!({"specversion": "1.0", "id": format!("e{n}"), "source": "s", "type": "go",
                              "data": {"flag": format!("no {n}")}}),
            },
        });
        assert_eq!(i.status(), Status::Waiting);
        assert_eq!(
            noted(&out.entries),
            vec![Trace::ConditionNotBoolean {
                pointer: "/states/0/transitions/0/eventGroups/0/condition".into(),
                condition: "${ .data.flag }".into(),
                value: "\"no 1\"".into(),
            }],
            "input {n}: {:?}",
            out.entries
        );
    }
}

#[test]
fn coverage_traces_name_what_was_taken_only_when_asked_for() {
    // An action that fails once and is handled, then a condition transition; an ASL Choice and Catch.
    let m = machine(json!({
        "id": "cov", "name": "cov", "version": "1",
        "states": [
            {"name": "A", "start": true,
             "enterAction": {"type": "injectData", "expression": "${ error(\"no\") }",
                             "errorHandlers": [{"condition": "${ false }"}, {"resultHandler": "${ .handled = true }"}]},
             "transitions": [{"nextState": "B", "condition": "${ .handled }"}, {"nextState": "B"}]},
            {"name": "B"}
        ]
    }));
    let covered = |options: Options| -> (Vec<String>, usize) {
        let mut i = Instance::new(m.clone(), "c", options);
        let out = i.handle(Timed {
            at: 0,
            input: Input::Start {
                data: json!({}),
                scheduled: None,
            },
        });
        assert_eq!(i.status(), Status::Completed);
        let pointers = out
            .entries
            .iter()
            .filter_map(|e| match e {
                Entry::Trace(Trace::Covered { pointer }) => Some(pointer.clone()),
                _ => None,
            })
            .collect();
        (pointers, out.entries.len())
    };
    let on = Options {
        trace: true,
        coverage: true,
        ..Options::default()
    };
    assert_eq!(
        covered(on).0,
        [
            "/states/0/enterAction",
            "/states/0/enterAction/errorHandlers/1",
            "/states/0/transitions/0"
        ]
    );
    // Off (the default): the trace and the journal are what they were.
    let (none, with_trace) = covered(Options {
        trace: true,
        ..Options::default()
    });
    assert!(none.is_empty());
    assert_eq!(with_trace + 3, covered(on).1);

    // ASL: the Next, then the Choice rule or the Default.
    let asl = machine(json!({
        "StartAt": "P",
        "States": {
            "P": {"Type": "Pass", "Next": "C"},
            "C": {"Type": "Choice", "Choices": [{"Variable": "$.n", "NumericEquals": 1, "Next": "E"}], "Default": "E"},
            "E": {"Type": "Succeed"}
        }
    }));
    for (n, taken) in [(1, "/States/C/Choices/0"), (2, "/States/C/Default")] {
        let mut i = Instance::new(asl.clone(), "a", on);
        let out = i.handle(Timed {
            at: 0,
            input: Input::Start {
                data: json!({"n": n}),
                scheduled: None,
            },
        });
        let pointers: Vec<&str> = out
            .entries
            .iter()
            .filter_map(|e| match e {
                Entry::Trace(Trace::Covered { pointer }) => Some(pointer.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(pointers, ["/States/P/Next", taken]);
    }
}

/// A run a schedule started reads its schedule and nominal time: SM4C with the jq function
/// `schedule`, ASL as `$$.Schedule`; both come from the start's journal entry, so a replay and a
/// restored snapshot read the same. Other starts read null (SM4C) or no `Schedule` (ASL).
#[test]
fn a_scheduled_run_reads_its_nominal_time_in_both_languages() {
    use sm4c_runtime::engine::Scheduled;
    let sm4c = machine(json!({
        "id": "nightly-report", "name": "report", "version": "1",
        "events": [{"name": "go", "type": "go"}],
        "states": [
            {"name": "Stamp", "start": true,
             "enterAction": {"type": "InjectData", "expression": "${ schedule }"},
             "enterResultHandler": "${ .schedule = $value }",
             "transitions": [{"nextState": "Again", "eventGroups": [{"events": ["go"]}]}]},
            {"name": "Again", "end": true,
             "enterAction": {"type": "InjectData", "expression": "${ schedule.nominalTime }"},
             "enterResultHandler": "${ .again = $value }"}
        ]
    }));
    let asl = machine(json!({
        "StartAt": "Stamp",
        "States": {"Stamp": {"Type": "Pass", "End": true,
                             "Parameters": {"schedule.$": "$$.Schedule", "at.$": "$$.Schedule.NominalTime"}}}
    }));
    let scheduled = Scheduled {
        schedule: "nightly".into(),
        nominal_time: 1_795_831_200_000, // 2026-11-28T02:00:00Z
    };
    let begin = Timed {
        at: 1_795_831_200_450,
        input: Input::Start {
            data: json!({}),
            scheduled: Some(scheduled.clone()),
        },
    };

    let mut i = Instance::new(sm4c.clone(), "nightly@2026-11-28T02:00:00Z", Options::default());
    let mut journal = i.handle(begin.clone()).entries;
    let event = Timed {
        at: 1_795_831_260_000,
        input: Input::Event {
            event: json!({"specversion": "1.0", "id": "e1", "source": "t", "type": "go"}),
        },
    };
    // Between the two steps the instance is suspended and restored, as a host does.
    let snap = serde_json::to_value(i.snapshot()).expect("snapshot");
    let mut i = Instance::from_snapshot(
        sm4c.clone(),
        serde_json::from_value(snap).expect("reads"),
        Options::default(),
    );
    journal.extend(i.handle(event).entries);
    let want = json!({"schedule": {"id": "nightly", "nominalTime": "2026-11-28T02:00:00Z"},
                      "again": "2026-11-28T02:00:00Z"});
    assert_eq!(i.snapshot().status, Status::Completed);
    assert_eq!(i.data(), want);
    let start_entry = serde_json::to_value(&journal[0]).expect("entry");
    assert_eq!(
        start_entry["scheduled"],
        json!({"schedule": "nightly", "nominalTime": 1_795_831_200_000_i64})
    );
    let replayed = Instance::replay(
        sm4c.clone(),
        "nightly@2026-11-28T02:00:00Z",
        &journal,
        Options::default(),
    )
    .expect("replay");
    assert_eq!(replayed.data(), want);

    // Started by hand: no schedule.
    let (i, _) = start(&sm4c, "by-hand", json!({}));
    assert_eq!(i.data(), json!({"schedule": null}));

    let mut i = Instance::new(asl.clone(), "nightly@2026-11-28T02:00:00Z", Options::default());
    i.handle(begin);
    assert_eq!(i.snapshot().status, Status::Completed);
    assert_eq!(
        i.data(),
        json!({"schedule": {"Id": "nightly", "NominalTime": "2026-11-28T02:00:00Z"},
               "at": "2026-11-28T02:00:00Z"})
    );
}

/// A history recorded by one definition, compared against another (`sm4c replay`'s core).
fn recorded(m: &Arc<Machine>, data: Value) -> sm4c_runtime::engine::history::History {
    let mut i = Instance::new(
        m.clone(),
        "h",
        Options {
            trace: true,
            ..Options::default()
        },
    );
    let out = i.handle(Timed {
        at: 5,
        input: Input::Start { data, scheduled: None },
    });
    let entries: Vec<Value> = out
        .entries
        .iter()
        .zip(1..)
        .map(|(e, seq)| sm4c_runtime::engine::history::history_entry(seq, e))
        .collect();
    sm4c_runtime::engine::history::History::from_json(&json!({"id": "h", "entries": entries})).expect("readable")
}

#[test]
fn replaying_a_history_notes_data_no_decision_depended_on() {
    use sm4c_runtime::engine::history::compare;
    // The enter action fails, is handled, and the same transitions fire; only the failure's message
    // and a condition's non-boolean value differ.
    let def = |msg: &str, cond: &str| {
        machine(json!({
            "id": "n", "name": "n", "version": "1",
            "states": [
                {"name": "A", "start": true,
                 "enterAction": {"type": "injectData", "expression": format!("${{ error(\"{msg}\") }}"),
                                 "errorHandlers": [{"resultHandler": "${ .handled = true }"}]},
                 "transitions": [{"nextState": "C", "condition": cond}, {"nextState": "B", "condition": "${ .handled }"}]},
                {"name": "B"},
                {"name": "C"}
            ]
        }))
    };
    let old = def("no stock", "${ .count }");
    let h = recorded(&old, json!({"count": 3}));
    let same = compare(old.clone(), "h", &h);
    assert_eq!(same.divergence, None, "{same:?}");
    assert!(same.notes.is_empty(), "{same:?}");
    assert!(same.decisions >= 4, "{same:?}");

    let new = def("out of stock", "${ .count | tostring }");
    let c = compare(new, "h", &h);
    assert_eq!(c.divergence, None, "{c:?}");
    assert_eq!(c.decisions, same.decisions);
    assert_eq!(c.notes.len(), 2, "{c:?}");
    assert!(
        c.notes
            .iter()
            .any(|n| n.contains("\"out of stock\"") && n.contains("\"no stock\"")),
        "{c:?}"
    );
    assert!(
        c.notes
            .iter()
            .any(|n| n.contains("\"3\"") && n.contains("/states/0/transitions/0")),
        "{c:?}"
    );

    // A condition that now fires is a decision: it diverges at the transition, in state A.
    let fires = def("no stock", "${ .count > 1 }");
    let c = compare(fires, "h", &h);
    let d = c.divergence.expect("diverges");
    assert_eq!(d.state.as_deref(), Some("A"));
    assert!(d.summary().contains("transitionFired"), "{}", d.summary());
    assert!(
        d.differences
            .iter()
            .any(|f| f.pointer == "/next" && f.recorded == json!("B") && f.decided == json!("C")),
        "{d:?}"
    );
}

#[test]
fn a_history_that_is_not_one_is_refused_with_its_pointer() {
    use sm4c_runtime::engine::history::History;
    let e = History::from_json(
        &json!({"entries": [{"entry": "input", "input": "start", "at": 1, "data": {}}, {"entry": "effect"}]}),
    )
    .expect_err("no effect tag");
    assert_eq!(e.pointer, "/entries/1");
    assert!(e.message.starts_with("not a journal entry"), "{e}");
    let e = History::from_json(&json!([{"entry": "input", "input": "start", "at": 1, "data": {}, "seq": "one"}]))
        .expect_err("seq");
    assert_eq!(e.pointer, "/0/seq");
    let e = History::from_json(&json!("history")).expect_err("a string");
    assert_eq!(
        (e.pointer.as_str(), e.message.as_str()),
        ("/", "a history is an array of journal entries, not a string")
    );
    let h = History::from_json(&json!([{"entry": "input", "input": "start", "at": 1, "data": {}}])).expect("an array");
    assert_eq!((h.id, h.entries[0].0), (None, 1));
}

/// Version `v` of an order that waits for `paid` in `wait` (with a one-hour timeout when `timeout`),
/// then enters `next`, which records which version took it there.
fn order_version(v: &str, wait: &str, next: &str, timeout: bool) -> Arc<Machine> {
    let mut transitions = vec![json!({"nextState": next, "eventGroups": [{"events": ["paid"]}]})];
    if timeout {
        transitions.push(json!({"nextState": "Expired", "timeout": "PT1H"}));
    }
    machine(json!({
        "id": "order", "name": "order", "version": v,
        "events": [{"name": "paid", "type": "paid", "source": "shop"}],
        "states": [
            {"name": wait, "start": true, "transitions": transitions},
            {"name": next, "enterAction": {"type": "injectData", "expression": format!("${{ \"{next} on {v}\" }}")},
             "enterResultHandler": "${ .path = $value }"},
            {"name": "Expired"}
        ]
    }))
}

fn paid_event() -> Value {
    json!({"specversion": "1.0", "id": "p1", "source": "shop", "type": "paid"})
}

#[test]
fn a_waiting_instance_moves_to_a_mapped_state_keeps_its_timeout_and_finishes_on_the_new_path() {
    use std::collections::BTreeMap;
    let v1 = order_version("1", "Wait", "Done", true);
    let v2 = order_version("2", "AwaitPayment", "Ship", true);
    let mut i = Instance::new(
        v1.clone(),
        "o-1",
        Options {
            trace: true,
            ..Options::default()
        },
    );
    let mut journal = i
        .handle(Timed {
            at: 1_000,
            input: Input::Start {
                data: json!({}),
                scheduled: None,
            },
        })
        .entries;
    assert_eq!(i.timers().get("1.timeout"), Some(&3_601_000));

    // Without a map the state has no counterpart: refused, nothing changes.
    let before = i.snapshot().clone();
    let e = i
        .migrate(v2.clone(), &BTreeMap::new(), 5_000)
        .expect_err("no counterpart");
    assert_eq!(e.reason, "noCounterpart");
    assert!(
        e.message.contains("state \"Wait\" has no counterpart in version \"2\""),
        "{e}"
    );
    let mut bad = BTreeMap::new();
    bad.insert("Wait".to_string(), "Nowhere".to_string());
    assert_eq!(
        i.migrate(v2.clone(), &bad, 5_000).expect_err("unknown").reason,
        "unknownState"
    );
    assert_eq!(i.snapshot(), &before);

    let map: BTreeMap<String, String> = [("Wait".to_string(), "AwaitPayment".to_string())].into();
    let plan = i.migration_plan(&v2, &map, 5_000).expect("a plan");
    assert_eq!((plan.state.as_str(), plan.to.as_str()), ("Wait", "AwaitPayment"));
    assert_eq!(plan.timers.len(), 1);
    assert_eq!((plan.timers[0].change, plan.timers[0].due), ("kept", Some(3_601_000)));
    assert_eq!(i.snapshot(), &before, "a plan changes nothing");

    let out = i.migrate(v2.clone(), &map, 5_000).expect("moves");
    assert_eq!(
        out.entries[0],
        Entry::Input(Timed {
            at: 5_000,
            input: Input::Migrate {
                from: "1".into(),
                version: "2".into(),
                states: map.clone()
            }
        })
    );
    assert!(out.entries.contains(&Entry::Trace(Trace::Migrated {
        from: "1".into(),
        version: "2".into(),
        state: "Wait".into(),
        to: "AwaitPayment".into()
    })));
    assert!(
        out.effects.is_empty(),
        "the timeout is kept as it was: {:?}",
        out.effects
    );
    journal.extend(out.entries);
    assert_eq!(
        (i.status(), i.state_name(), i.snapshot().version.as_str()),
        (Status::Waiting, Some("AwaitPayment"), "2")
    );
    assert_eq!(i.timers().get("1.timeout"), Some(&3_601_000), "the deadline is kept");

    journal.extend(
        i.handle(Timed {
            at: 6_000,
            input: Input::Event { event: paid_event() },
        })
        .entries,
    );
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(i.data()["path"], json!("Ship on 2"));

    // A replay across the migration, given both versions, gives the same instance; without the
    // old version it cannot start.
    let versions = |v: &str| match v {
        "1" => Some(v1.clone()),
        "2" => Some(v2.clone()),
        _ => None,
    };
    let replayed =
        Instance::replay_versions(v2.clone(), "o-1", &journal, Options::default(), &versions).expect("replays");
    assert!(sm4c_runtime::engine::snapshot_differences(replayed.snapshot(), i.snapshot()).is_empty());
    let e = match Instance::replay(v2.clone(), "o-1", &journal, Options::default()) {
        Err(e) => e,
        Ok(_) => panic!("the old version is needed"),
    };
    assert!(e.message.contains("version \"1\""), "{e}");
}

#[test]
fn a_migration_cancels_or_arms_timeouts_as_the_new_version_says_and_refuses_what_cannot_move() {
    use std::collections::BTreeMap;
    let none = BTreeMap::new();
    let v1 = order_version("1", "Wait", "Done", true);
    // Version 2 waits without a timeout, and has an execution timeout of one day.
    let mut doc = json!({
        "id": "order", "name": "order", "version": "2", "timeout": {"duration": "P1D"},
        "events": [{"name": "paid", "type": "paid", "source": "shop"}],
        "states": [{"name": "Wait", "start": true, "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["paid"]}]}]},
                   {"name": "Done"}]
    });
    let v2 = machine(doc.clone());
    let mut i = Instance::new(v1.clone(), "o-2", Options::default());
    i.handle(Timed {
        at: 1_000,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    let out = i.migrate(v2, &none, 10_000).expect("moves");
    assert_eq!(
        out.effects,
        vec![
            Effect::CancelTimer {
                timer: "1.timeout".into()
            },
            Effect::StartTimer {
                timer: sm4c_runtime::engine::EXEC_TIMER.into(),
                due: 10_000 + 86_400_000
            },
        ]
    );
    assert_eq!(i.timers().len(), 1);

    // An event already in the inbox is taken by the new state's transition at once.
    doc["version"] = json!("3");
    doc["states"][0]["transitions"][0]["nextState"] = json!("Done");
    let v3 = machine(doc);
    i.handle(Timed {
        at: 11_000,
        input: Input::Event {
            event: json!({"specversion": "1.0", "id": "x", "source": "elsewhere", "type": "other"}),
        },
    });
    assert_eq!(i.status(), Status::Waiting);
    i.migrate(v3.clone(), &none, 12_000).expect("moves");
    assert_eq!(i.status(), Status::Waiting);
    i.handle(Timed {
        at: 13_000,
        input: Input::Event { event: paid_event() },
    });
    assert_eq!(i.status(), Status::Completed);
    let e = i.migrate(v1.clone(), &none, 14_000).expect_err("ended");
    assert_eq!(e.reason, "ended");

    // In the middle of an action (waiting for a call's result): refused, naming the state.
    let calling = machine(json!({
        "id": "order", "name": "order", "version": "4",
        "functions": [{"name": "charge", "operation": "http://x/api.json#charge"}],
        "states": [{"name": "Charge", "start": true,
                    "enterAction": {"type": "invokeFunction", "functionName": "charge", "waitForCompletion": true}}]
    }));
    let mut c = Instance::new(calling, "o-3", Options::default());
    c.handle(Timed {
        at: 1_000,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    let e = c.migrate(v1.clone(), &none, 2_000).expect_err("in an action");
    assert_eq!(e.reason, "inAction");
    assert!(e.message.contains("its enter action in state \"Charge\""), "{e}");
    let e = c
        .migrate(
            machine(json!({"id": "other", "name": "o", "version": "9", "states": [{"name": "A", "start": true}]})),
            &none,
            2_000,
        )
        .expect_err("another definition");
    assert_eq!(e.reason, "otherDefinition");
}

/// A payment whose provider has no idempotency key: `atMostOnce` on the function, overridden to
/// `atLeastOnce` by one action; `stepInterrupted` retried once, then handled.
fn payment() -> Value {
    json!({
        "id": "pay", "name": "pay", "version": "1",
        "functions": [{"name": "charge", "operation": "http://x/api.json#charge", "delivery": "atMostOnce"}],
        "retries": [{"name": "once", "delay": "PT1S", "maxAttempts": 1}],
        "states": [
            {"name": "Charge", "start": true,
             "enterAction": {"type": "invokeFunction", "functionName": "charge", "waitForCompletion": true,
                 "errorHandlers": [
                     {"condition": "${ .type == \"stepInterrupted\" and (.details.op | endswith(\"#2\") | not) }", "retryPolicy": "once"},
                     {"condition": "${ .type == \"stepInterrupted\" }", "resultHandler": "${ .interrupted = $value.details.op }"}]},
             "transitions": [{"nextState": "Lookup"}]},
            {"name": "Lookup",
             "enterAction": {"type": "invokeFunction", "functionName": "charge", "waitForCompletion": true,
                 "delivery": "atLeastOnce"}},
        ]
    })
}

#[test]
fn an_interrupted_at_most_once_call_is_an_error_that_retry_policies_and_handlers_see() {
    use sm4c_runtime::Delivery;
    let m = machine(payment());
    let (mut i, effects) = start(&m, "p-1", json!({}));
    assert!(
        matches!(&effects[..], [Effect::InvokeFunction { op, delivery: Delivery::AtMostOnce, .. }] if op == "1.enter"),
        "{effects:?}"
    );
    let interrupted = |op: &str| Input::Failed {
        op: op.into(),
        error: sm4c_runtime::ErrorInfo::new(ErrorKind::StepInterrupted, "in flight at a crash")
            .with_details(json!({"op": op})),
    };
    // The first interruption is retried by the policy, like any error: a new call, still atMostOnce.
    let out = i.handle(Timed {
        at: 2_000,
        input: interrupted("1.enter"),
    });
    let Some(Effect::StartTimer { timer, due }) = out.effects.first().cloned() else {
        panic!("{:?}", out.effects)
    };
    let out = i.handle(Timed {
        at: due,
        input: Input::TimerFired { timer },
    });
    assert!(
        matches!(&out.effects[..], [Effect::InvokeFunction { op, delivery: Delivery::AtMostOnce, .. }] if op == "1.enter#2"),
        "{:?}",
        out.effects
    );
    // The second is handled by the next handler; the action's own override makes the next call
    // atLeastOnce, which the effect then does not write.
    let out = i.handle(Timed {
        at: due + 1,
        input: interrupted("1.enter#2"),
    });
    assert_eq!(i.data()["interrupted"], json!("1.enter#2"));
    assert!(
        matches!(
            &out.effects[..],
            [Effect::InvokeFunction {
                delivery: Delivery::AtLeastOnce,
                ..
            }]
        ),
        "{:?}",
        out.effects
    );
    assert!(!serde_json::to_string(&out.effects[0]).unwrap().contains("delivery"));
    // Unhandled, it fails the instance with its kind.
    let (mut j, _) = start(&m, "p-2", json!({}));
    j.handle(Timed {
        at: 2_000,
        input: Input::Failed {
            op: "1.enter".into(),
            error: sm4c_runtime::ErrorInfo::new(ErrorKind::StepInterrupted, "x")
                .with_details(json!({"op": "1.enter#2"})),
        },
    });
    assert_eq!(j.status(), Status::Running);
    let m2 = machine(json!({
        "id": "p", "name": "p", "version": "1",
        "functions": [{"name": "charge", "operation": "http://x/api.json#charge", "delivery": "atMostOnce"}],
        "states": [{"name": "S", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "charge", "waitForCompletion": true}}]
    }));
    let (mut k, _) = start(&m2, "p-3", json!({}));
    k.handle(Timed {
        at: 2_000,
        input: interrupted("1.enter"),
    });
    assert_eq!(k.status(), Status::Failed);
    assert_eq!(k.error().unwrap().kind, ErrorKind::StepInterrupted);
    assert_eq!(
        serde_json::to_value(k.error().unwrap()).unwrap()["type"],
        json!("stepInterrupted")
    );
}

#[test]
fn journals_without_at_most_once_are_written_as_before() {
    // The saga's journal, entry by entry, as this version writes it: no `delivery` anywhere, and an
    // effect of today's form (without the field) reads back as atLeastOnce.
    let m = machine(saga());
    let mut i = Instance::new(
        m.clone(),
        "o-1",
        Options {
            journal: true,
            ..Options::default()
        },
    );
    let out = i.handle(Timed {
        at: 1_000,
        input: Input::Start {
            data: json!({"amount": 5, "id": "o-1"}),
            scheduled: None,
        },
    });
    let text = serde_json::to_string(&out.entries).unwrap();
    assert!(!text.contains("delivery"), "{text}");
    assert!(text.contains(
        r#"{"entry":"effect","effect":"invokeFunction","op":"1.enter/0","function":"charge","operation":"http://x/api.json#charge","functionType":"rest","arguments":{"amount":5},"wait":true}"#
    ), "{text}");
    let old: Entry = serde_json::from_str(
        r#"{"entry":"effect","effect":"invokeFunction","op":"1","function":"f","operation":"o","functionType":"rest","arguments":null,"wait":true}"#,
    )
    .unwrap();
    assert!(matches!(
        old,
        Entry::Effect(Effect::InvokeFunction {
            delivery: sm4c_runtime::Delivery::AtLeastOnce,
            ..
        })
    ));
}

#[test]
fn delivery_is_validated_with_its_pointer() {
    let errors = |doc: Value| -> Vec<(String, String)> {
        match load(&doc, &mut no_files, LoadOptions::default()) {
            Ok(_) => Vec::new(),
            Err(es) => es.into_iter().map(|e| (e.pointer, e.message)).collect(),
        }
    };
    let doc = |function: Value, action: Value| {
        json!({"id": "d", "name": "d", "version": "1", "functions": [function],
               "states": [{"name": "S", "start": true, "enterAction": action}]})
    };
    let call = json!({"type": "invokeFunction", "functionName": "f", "waitForCompletion": true});
    let e = errors(doc(
        json!({"name": "f", "operation": "a#b", "delivery": "once"}),
        call.clone(),
    ));
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].0, "/functions/0/delivery");
    assert!(e[0].1.contains("\"once\" is not a delivery"), "{e:?}");
    let e = errors(doc(
        json!({"name": "f", "operation": "a#b", "delivery": true}),
        call.clone(),
    ));
    assert_eq!(e[0].0, "/functions/0/delivery");
    let e = errors(doc(
        json!({"name": "f", "operation": ".", "type": "expression", "delivery": "atMostOnce"}),
        call.clone(),
    ));
    assert_eq!(e[0].0, "/functions/0/delivery");
    assert!(e[0].1.contains("is \"expression\""), "{e:?}");
    let e = errors(doc(
        json!({"name": "f", "operation": "jobs", "type": "worker", "delivery": "atMostOnce"}),
        call.clone(),
    ));
    assert_eq!(e[0].0, "/functions/0/delivery");
    assert!(e[0].1.contains("worker task"), "{e:?}");
    let mut bad = call.clone();
    bad["delivery"] = json!("atMostTwice");
    let e = errors(doc(json!({"name": "f", "operation": "a#b"}), bad));
    assert_eq!(e[0].0, "/states/0/enterAction/delivery");
    let e = errors(doc(
        json!({"name": "f", "operation": "a#b"}),
        json!({"type": "delay", "timeout": "PT1S", "delivery": "atMostOnce"}),
    ));
    assert_eq!(e[0].0, "/states/0/enterAction/delivery");
    assert!(e[0].1.contains("only invokeFunction actions"), "{e:?}");
    // Both values are accepted where they apply; atLeastOnce anywhere a call is.
    assert!(errors(doc(
        json!({"name": "f", "operation": "a#b", "delivery": "atMostOnce"}),
        call.clone()
    ))
    .is_empty());
    assert!(errors(doc(
        json!({"name": "f", "operation": "jobs", "type": "worker", "delivery": "atLeastOnce"}),
        call
    ))
    .is_empty());
}
