//! Redrive through the engine's Rust API: a failed or timed-out instance goes on from where it
//! failed, after an update to its data; the refusals; replay across a redrive.

use serde_json::{json, Value};
use sm4c_runtime::engine::redrive::RedriveError;
use sm4c_runtime::{
    load, no_files, Effect, Entry, ErrorInfo, ErrorKind, Input, Instance, LoadOptions, Machine, Options, Status, Timed,
    Trace,
};
use std::sync::Arc;

fn machine(doc: Value) -> Arc<Machine> {
    Arc::new(load(&doc, &mut no_files, LoadOptions::default()).expect("valid definition"))
}

fn options() -> Options {
    Options {
        trace: true,
        ..Options::default()
    }
}

/// A host in miniature: it answers every call with `answer` (none: the call fails as
/// [`declined`]) and fires retry and redrive timers
/// (no other timer) at once, until nothing is left; it keeps the journal and the calls it made.
struct Host<F: FnMut(&str, &Value) -> Option<Value>> {
    journal: Vec<Entry>,
    calls: Vec<(String, Value)>,
    now: i64,
    answer: F,
}

impl<F: FnMut(&str, &Value) -> Option<Value>> Host<F> {
    fn new(answer: F) -> Self {
        Host {
            journal: Vec::new(),
            calls: Vec::new(),
            now: 1_000,
            answer,
        }
    }

    fn feed(&mut self, i: &mut Instance, input: Input) {
        self.now += 10;
        let mut queue = vec![input];
        while let Some(input) = queue.pop() {
            let out = i.handle(Timed { at: self.now, input });
            self.journal.extend(out.entries);
            for e in out.effects {
                match e {
                    Effect::InvokeFunction {
                        op,
                        arguments,
                        wait: true,
                        ..
                    } => {
                        self.calls.push((op.clone(), arguments.clone()));
                        queue.insert(
                            0,
                            match (self.answer)(&op, &arguments) {
                                Some(result) => Input::Completed { op, result },
                                None => Input::Failed { op, error: declined() },
                            },
                        );
                    }
                    Effect::StartTimer { timer, .. }
                        if timer.ends_with(":retry") || timer.ends_with(":redrive") || timer.starts_with("retry:") =>
                    {
                        queue.insert(0, Input::TimerFired { timer })
                    }
                    _ => {}
                }
            }
        }
    }

    fn ops(&self) -> Vec<&str> {
        self.calls.iter().map(|(op, _)| op.as_str()).collect()
    }
}

fn declined() -> ErrorInfo {
    ErrorInfo::new(ErrorKind::FunctionError, "HTTP 400: card missing")
}

/// Charges (two attempts) and notifies in parallel, then ends.
fn order() -> Value {
    json!({
        "id": "order", "name": "order", "version": "1",
        "functions": [{"name": "charge", "operation": "http://x/api.json#charge"},
                      {"name": "notify", "operation": "http://x/api.json#notify"}],
        "retries": [{"name": "once", "delay": "PT1S", "maxAttempts": 1}],
        "states": [
            {"name": "Pay", "start": true,
             "enterAction": {"type": "parallel", "actions": [
                 {"name": "charge", "type": "invokeFunction", "functionName": "charge", "waitForCompletion": true,
                  "arguments": {"card": "${ .card }"},
                  "errorHandlers": [{"retryPolicy": "once"}]},
                 {"name": "notify", "type": "invokeFunction", "functionName": "notify", "waitForCompletion": true}]},
             "enterResultHandler": "${ .paid = $value.charge }",
             "transitions": [{"nextState": "Done"}]},
            {"name": "Done"}
        ]
    })
}

#[test]
fn a_call_that_failed_on_its_data_succeeds_after_a_redrive_with_an_update() {
    let m = machine(order());
    let mut i = Instance::new(m.clone(), "o-1", options());
    // The payment service declines a body without a card; notify always answers.
    let mut host = Host::new(|op: &str, args: &Value| {
        if op.contains("enter/1") {
            return Some(json!("sent"));
        }
        args["card"].as_str().map(|card| json!({"charged": card}))
    });
    host.feed(
        &mut i,
        Input::Start {
            data: json!({"amount": 5}),
            scheduled: None,
        },
    );
    assert_eq!(i.status(), Status::Failed);
    assert_eq!(host.ops(), ["1.enter/0", "1.enter/1", "1.enter/0#2"]);
    let before = i.snapshot().clone();

    let plan = i
        .redrive_plan(Some(r#".card = "4242""#), None)
        .expect("a failed instance can be redriven");
    assert_eq!(plan.redrives, 1);
    assert_eq!(plan.data, json!({"amount": 5, "card": "4242"}));
    assert_eq!(plan.diff, vec![json!({"op": "add", "path": "/card", "value": "4242"})]);
    assert!(plan.from.contains("1.enter/0"), "{}", plan.from);
    assert_eq!(i.snapshot(), &before, "a plan changes nothing");

    host.feed(&mut i, plan.input);
    assert_eq!(i.status(), Status::Completed, "{:?}", i.error());
    // Only the failed call was made again (a new operation), not notify, which had answered.
    assert_eq!(host.ops(), ["1.enter/0", "1.enter/1", "1.enter/0#2", "1.enter/0~r1"]);
    assert_eq!(host.calls[3].1, json!({"card": "4242"}));
    assert_eq!(i.data()["paid"], json!({"charged": "4242"}));
    assert!(host
        .journal
        .iter()
        .any(|e| matches!(e, Entry::Trace(Trace::Redriven { redrives: 1, .. }))));
    assert!(host.journal.iter().any(|e| matches!(
        e,
        Entry::Input(Timed { input: Input::Redrive { update: Some(u), diff }, .. })
            if u == r#".card = "4242""# && diff.len() == 1
    )));

    // The journal replays across the redrive to the same instance.
    let replayed = Instance::replay(m, "o-1", &host.journal, options()).expect("replays");
    assert_eq!(replayed.snapshot(), i.snapshot());
}

#[test]
fn a_redriven_action_has_its_retries_counted_afresh_and_a_redrive_without_update_keeps_the_data() {
    let m = machine(order());
    let mut i = Instance::new(m.clone(), "o-2", options());
    // The payment service is down for its first four calls, then up.
    let mut charges = 0;
    let mut host = Host::new(move |op: &str, _args: &Value| {
        if op.contains("enter/1") {
            return Some(json!("sent"));
        }
        charges += 1;
        if charges <= 3 {
            None
        } else {
            Some(json!("ok"))
        }
    });
    host.feed(
        &mut i,
        Input::Start {
            data: json!({"card": "1"}),
            scheduled: None,
        },
    );
    assert_eq!(i.status(), Status::Failed);
    let plan = i.redrive_plan(None, None).expect("redrivable");
    assert!(plan.diff.is_empty());
    assert_eq!(plan.data, json!({"card": "1"}));
    host.feed(&mut i, plan.input);
    // The third call fails again, but the retry policy gives it its second attempt anew.
    assert_eq!(i.status(), Status::Completed, "{:?}", i.error());
    assert_eq!(
        host.ops(),
        [
            "1.enter/0",
            "1.enter/1",
            "1.enter/0#2",
            "1.enter/0~r1",
            "1.enter/0~r1#2"
        ]
    );
    let replayed = Instance::replay(m, "o-2", &host.journal, options()).expect("replays");
    assert_eq!(replayed.snapshot(), i.snapshot());
}

#[test]
fn a_timed_out_instance_goes_on_waiting_with_its_execution_timeout_counted_afresh() {
    let m = machine(json!({
        "id": "wait", "name": "wait", "version": "1",
        "timeout": {"duration": "PT10S"},
        "events": [{"name": "go", "type": "go"}],
        "states": [
            {"name": "Wait", "start": true, "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["go"]}]}]},
            {"name": "Done"}
        ]
    }));
    let mut i = Instance::new(m.clone(), "w", options());
    let mut journal = i
        .handle(Timed {
            at: 0,
            input: Input::Start {
                data: json!({}),
                scheduled: None,
            },
        })
        .entries;
    journal.extend(
        i.handle(Timed {
            at: 10_000,
            input: Input::TimerFired {
                timer: "exec:timeout".into(),
            },
        })
        .entries,
    );
    assert_eq!(i.status(), Status::TimedOut);
    let plan = i
        .redrive_plan(None, None)
        .expect("a timed-out instance can be redriven");
    let out = i.handle(Timed {
        at: 50_000,
        input: plan.input,
    });
    assert!(out.effects.contains(&Effect::StartTimer {
        timer: "exec:timeout".into(),
        due: 60_000
    }));
    journal.extend(out.entries);
    assert_eq!((i.status(), i.state_name()), (Status::Waiting, Some("Wait")));
    journal.extend(
        i.handle(Timed {
            at: 51_000,
            input: Input::Event {
                event: json!({"specversion": "1.0", "id": "e", "source": "t", "type": "go"}),
            },
        })
        .entries,
    );
    assert_eq!(i.status(), Status::Completed);
    let replayed = Instance::replay(m, "w", &journal, options()).expect("replays");
    assert_eq!(replayed.snapshot(), i.snapshot());
}

fn reason(e: RedriveError) -> &'static str {
    match e {
        RedriveError::NotRedrivable { reason, .. } => reason,
        RedriveError::Update(m) => panic!("not a refusal: {m}"),
    }
}

#[test]
fn refusals_name_their_reason_and_change_nothing() {
    let mut doc = order();
    doc["maxRedrives"] = json!(1);
    let m = machine(doc);
    let failing = |op: &str, _: &Value| {
        if op.contains("enter/1") {
            Some(json!("sent"))
        } else {
            None
        }
    };

    // Running: the first call has not answered.
    let mut i = Instance::new(m.clone(), "r", options());
    i.handle(Timed {
        at: 0,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    assert_eq!(reason(i.redrive_plan(None, None).unwrap_err()), "running");
    // Cancelled.
    i.handle(Timed {
        at: 1,
        input: Input::Cancel { reason: None },
    });
    assert_eq!(reason(i.redrive_plan(None, None).unwrap_err()), "cancelled");

    // Completed.
    let mut i = Instance::new(m.clone(), "c", options());
    let mut host = Host::new(|_: &str, _: &Value| Some(json!(1)));
    host.feed(
        &mut i,
        Input::Start {
            data: json!({}),
            scheduled: None,
        },
    );
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(reason(i.redrive_plan(None, None).unwrap_err()), "completed");

    // Failed by the host (an abort): it cannot resume.
    let mut i = Instance::new(m.clone(), "a", options());
    i.handle(Timed {
        at: 0,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    i.handle(Timed {
        at: 1,
        input: Input::Abort {
            error: ErrorInfo::new(ErrorKind::ReplayMismatch, "journal entry 3 differs"),
        },
    });
    assert_eq!(i.status(), Status::Failed);
    match i.redrive_plan(None, None).unwrap_err() {
        RedriveError::NotRedrivable { reason, message } => {
            assert_eq!(reason, "cannotResume");
            assert!(message.contains("replayMismatch"), "{message}");
        }
        e => panic!("{e}"),
    }

    // The cap: maxRedrives 1 allows one redrive, then refuses (the host's cap gives way to it).
    let mut i = Instance::new(m.clone(), "l", options());
    let mut host = Host::new(failing);
    host.feed(
        &mut i,
        Input::Start {
            data: json!({}),
            scheduled: None,
        },
    );
    assert_eq!(i.status(), Status::Failed);
    // Updates that are not one: nothing changes.
    for bad in ["{", "1", ".x | error(\"no\")"] {
        assert!(
            matches!(i.redrive_plan(Some(bad), None), Err(RedriveError::Update(_))),
            "{bad}"
        );
    }
    let plan = i.redrive_plan(None, Some(5)).expect("first redrive");
    host.feed(&mut i, plan.input);
    assert_eq!(i.status(), Status::Failed, "fails again");
    let before = i.snapshot().clone();
    match i.redrive_plan(None, Some(5)).unwrap_err() {
        RedriveError::NotRedrivable { reason, message } => {
            assert_eq!(reason, "limitReached");
            assert!(message.contains("(1)"), "{message}");
        }
        e => panic!("{e}"),
    }
    // A redrive input past the definition's cap does nothing.
    i.handle(Timed {
        at: 99_999,
        input: Input::Redrive {
            update: None,
            diff: Vec::new(),
        },
    });
    let (after, before) = (i.snapshot(), &before);
    assert_eq!(
        (after.status, &after.redrive, &after.phase),
        (before.status, &before.redrive, &before.phase)
    );
}

#[test]
fn max_redrives_must_be_a_whole_number() {
    let mut doc = order();
    doc["maxRedrives"] = json!("three");
    let errs = load(&doc, &mut no_files, LoadOptions::default()).expect_err("refused");
    assert!(errs.iter().any(|e| e.pointer == "/maxRedrives"), "{errs:?}");
}

#[test]
fn an_asl_execution_is_redriven_from_its_failed_task_with_its_retry_counters_reset() {
    let m = machine(json!({
        "StartAt": "Prepare",
        "States": {
            "Prepare": {"Type": "Pass", "Result": {"amount": 5}, "Next": "Charge"},
            "Charge": {"Type": "Task", "Resource": "charge", "Next": "Done",
                       "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": 1, "IntervalSeconds": 1}]},
            "Done": {"Type": "Succeed"}
        }
    }));
    let mut i = Instance::new(m.clone(), "x", options());
    let mut calls = 0;
    let mut host = Host::new(move |_: &str, args: &Value| {
        calls += 1;
        // Needs a card, and fails once more after that (the reset retry takes it).
        if args.get("card").is_none() || calls == 3 {
            None
        } else {
            Some(json!({"charged": args["card"]}))
        }
    });
    host.feed(
        &mut i,
        Input::Start {
            data: json!({}),
            scheduled: None,
        },
    );
    assert_eq!(i.status(), Status::Failed);
    assert_eq!(host.ops().len(), 2, "the first attempt and its one retry");
    let plan = i.redrive_plan(Some(r#".card = "4242""#), None).expect("redrivable");
    assert_eq!(plan.from, "state \"Charge\"");
    assert_eq!(plan.data, json!({"amount": 5, "card": "4242"}));
    host.feed(&mut i, plan.input);
    assert_eq!(i.status(), Status::Completed, "{:?}", i.error());
    assert_eq!(host.ops().len(), 4, "{:?}", host.ops());
    assert_eq!(i.data(), json!({"charged": "4242"}));
    let replayed = Instance::replay(m, "x", &host.journal, options()).expect("replays");
    assert_eq!(replayed.snapshot(), i.snapshot());
}

#[test]
fn an_asl_execution_that_ended_in_its_fail_state_is_not_redrivable() {
    let m = machine(json!({
        "StartAt": "No",
        "States": {"No": {"Type": "Fail", "Error": "Nope", "Cause": "by design"}}
    }));
    let mut i = Instance::new(m, "f", options());
    i.handle(Timed {
        at: 0,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    assert_eq!(i.status(), Status::Failed);
    assert_eq!(reason(i.redrive_plan(None, None).unwrap_err()), "failState");
}

#[test]
fn sm4c_replay_compares_a_history_across_a_redrive() {
    use sm4c_runtime::engine::history::{compare, history_entry, History};
    let m = machine(order());
    let mut i = Instance::new(m.clone(), "h", options());
    let mut host = Host::new(|op: &str, args: &Value| {
        if op.contains("enter/1") {
            return Some(json!("sent"));
        }
        args["card"].as_str().map(|card| json!({"charged": card}))
    });
    host.feed(
        &mut i,
        Input::Start {
            data: json!({"amount": 5}),
            scheduled: None,
        },
    );
    let plan = i.redrive_plan(Some(r#".card = "1""#), None).expect("redrivable");
    host.feed(&mut i, plan.input);
    assert_eq!(i.status(), Status::Completed);
    let entries: Vec<Value> = host
        .journal
        .iter()
        .zip(1..)
        .map(|(e, seq)| history_entry(seq, e))
        .collect();
    let h = History::from_json(&json!({"id": "h", "entries": entries})).expect("readable");
    let same = compare(m, "h", &h);
    assert_eq!(same.divergence, None, "{same:?}");
    assert_eq!(same.inputs, entries.iter().filter(|e| e["entry"] == "input").count());

    // A definition that decides otherwise (no retry) still diverges.
    let mut changed = order();
    changed["retries"][0]["maxAttempts"] = json!(0);
    let c = compare(machine(changed), "h", &h);
    assert!(c.divergence.is_some(), "{c:?}");
}

#[test]
fn failures_outside_a_running_action_go_on_from_their_step() {
    // The enter action fails as it starts (an expression function), then no transition holds
    // until the data says where to go.
    let m = machine(json!({
        "id": "steps", "name": "steps", "version": "1",
        "functions": [{"name": "check", "type": "expression",
                       "operation": "if .card == null then error(\"no card\") else .card end"}],
        "states": [
            {"name": "Check", "start": true,
             "enterAction": {"type": "invokeFunction", "functionName": "check", "waitForCompletion": true,
                             "arguments": {"card": "${ .card }"}},
             "enterResultHandler": "${ .checked = $value }",
             "transitions": [{"nextState": "Done", "condition": "${ .route == \"done\" }"}]},
            {"name": "Done"}
        ]
    }));
    let mut i = Instance::new(m.clone(), "s", options());
    let mut host = Host::new(|_: &str, _: &Value| None);
    host.feed(
        &mut i,
        Input::Start {
            data: json!({}),
            scheduled: None,
        },
    );
    assert_eq!(i.status(), Status::Failed);
    let plan = i.redrive_plan(Some(r#".card = "c""#), None).expect("redrivable");
    assert_eq!(plan.from, "state \"Check\", enter action");
    host.feed(&mut i, plan.input);
    // The action ran again and took the card; now no transition holds.
    assert_eq!(i.status(), Status::Failed);
    assert_eq!(i.error().map(|e| e.kind.clone()), Some(ErrorKind::NoTransition));
    assert_eq!(i.data()["checked"], json!("c"));
    let plan = i.redrive_plan(Some(r#".route = "done""#), None).expect("redrivable");
    assert_eq!(plan.from, "state \"Check\", its transitions");
    host.feed(&mut i, plan.input);
    assert_eq!((i.status(), i.state_name()), (Status::Completed, Some("Done")));
    assert_eq!(i.snapshot().redrive.as_ref().map(|r| r.count), Some(2));
    let replayed = Instance::replay(m, "s", &host.journal, options()).expect("replays");
    assert_eq!(replayed.snapshot(), i.snapshot());
}

#[test]
fn a_result_too_large_to_keep_is_not_kept_and_its_action_runs_again() {
    // The result is shared with itself: small in memory, 2^40 elements written out. The handler
    // fails on it; the snapshot must not keep it.
    let m = machine(json!({
        "id": "big", "name": "big", "version": "1",
        "states": [{"name": "Build", "start": true,
            "enterAction": {"type": "injectData", "expression": "${ reduce range(40) as $i ([1]; [., .]) }"},
            "enterResultHandler": "${ .n = ($value | tojson | length) }"}]
    }));
    let mut i = Instance::new(m, "b", options());
    i.handle(Timed {
        at: 0,
        input: Input::Start {
            data: json!({}),
            scheduled: None,
        },
    });
    assert_eq!(i.status(), Status::Failed);
    let written = serde_json::to_string(i.snapshot()).expect("snapshot");
    assert!(written.len() < 10_000, "{} bytes", written.len());
    let plan = i.redrive_plan(None, None).expect("redrivable");
    assert_eq!(plan.from, "state \"Build\", enter action");
}

#[test]
fn a_timed_out_asl_execution_enters_its_state_again_with_the_execution_timeout_counted_afresh() {
    let m = machine(json!({
        "TimeoutSeconds": 10,
        "StartAt": "Nap",
        "States": {"Nap": {"Type": "Wait", "Seconds": 60, "Next": "Done"}, "Done": {"Type": "Succeed"}}
    }));
    let mut i = Instance::new(m.clone(), "t", options());
    let mut journal = i
        .handle(Timed {
            at: 0,
            input: Input::Start {
                data: json!({"n": 1}),
                scheduled: None,
            },
        })
        .entries;
    journal.extend(
        i.handle(Timed {
            at: 10_000,
            input: Input::TimerFired {
                timer: "exec:timeout".into(),
            },
        })
        .entries,
    );
    assert_eq!(i.status(), Status::TimedOut);
    let plan = i
        .redrive_plan(None, None)
        .expect("a timed-out execution can be redriven");
    assert_eq!(plan.from, "state \"Nap\"");
    let out = i.handle(Timed {
        at: 20_000,
        input: plan.input,
    });
    assert!(out.effects.contains(&Effect::StartTimer {
        timer: "exec:timeout".into(),
        due: 30_000
    }));
    journal.extend(out.entries);
    assert_eq!((i.status(), i.state_name()), (Status::Waiting, Some("Nap")));
    let replayed = Instance::replay(m, "t", &journal, options()).expect("replays");
    assert_eq!(replayed.snapshot(), i.snapshot());
}

#[test]
fn an_asl_execution_timed_out_between_retries_is_redriven_with_its_retry_counters_reset() {
    let m = machine(json!({
        "TimeoutSeconds": 10,
        "StartAt": "Pay",
        "States": {"Pay": {"Type": "Task", "Resource": "pay", "End": true,
            "Retry": [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 100, "MaxAttempts": 1}]}}
    }));
    let call = |effects: &[Effect]| {
        effects
            .iter()
            .find_map(|e| match e {
                Effect::InvokeFunction { op, .. } => Some(op.clone()),
                _ => None,
            })
            .expect("a call")
    };
    let retry_timer = |effects: &[Effect]| {
        effects
            .iter()
            .any(|e| matches!(e, Effect::StartTimer { timer, .. } if timer.starts_with("retry:")))
    };
    let mut i = Instance::new(m.clone(), "r", options());
    let mut journal = Vec::new();
    let mut step = |i: &mut Instance, at: i64, input: Input| {
        let out = i.handle(Timed { at, input });
        journal.extend(out.entries);
        out.effects
    };
    let first = step(
        &mut i,
        0,
        Input::Start {
            data: json!({}),
            scheduled: None,
        },
    );
    let op = call(&first);
    // The first attempt fails: its one retry waits 100 s, and the execution times out meanwhile.
    let after = step(&mut i, 1_000, Input::Failed { op, error: declined() });
    assert!(retry_timer(&after), "{after:?}");
    step(
        &mut i,
        10_000,
        Input::TimerFired {
            timer: "exec:timeout".into(),
        },
    );
    assert_eq!(i.status(), Status::TimedOut);
    let plan = i.redrive_plan(None, None).expect("redrivable");
    let again = step(&mut i, 20_000, plan.input);
    let op = call(&again);
    // Counted afresh: the failure after the redrive is retried (its one retry was used before).
    let after = step(&mut i, 21_000, Input::Failed { op, error: declined() });
    assert!(retry_timer(&after), "the retry counters were reset: {after:?}");
    assert_eq!(i.status(), Status::Waiting);
    let replayed = Instance::replay(m, "r", &journal, options()).expect("replays");
    assert_eq!(replayed.snapshot(), i.snapshot());
}
