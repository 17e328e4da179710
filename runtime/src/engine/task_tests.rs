//! Worker tasks through the engine: which timers start and stop, what each timeout fails with.

use crate::engine::{Effect, ErrorInfo, ErrorKind, Input, Instance, Options, Status, Timed};
use crate::{load, no_files, LoadOptions};
use serde_json::{json, Value};
use std::sync::Arc;

/// A worker call with every timeout, whose timeouts are retried once (recording each), and a
/// deadline of its own action (`timeout`) when `action_timeout` is given.
fn definition(action_timeout: Option<&str>) -> Value {
    let mut d = json!({
        "id": "w", "name": "w", "version": "1",
        "functions": [{"name": "resize", "type": "worker", "operation": "images",
                       "scheduleToStartTimeout": "PT10S", "startToCloseTimeout": "PT1M",
                       "heartbeatTimeout": "PT5S", "scheduleToCloseTimeout": "PT2M"}],
        "retries": [{"name": "once", "delay": "PT1S", "maxAttempts": 1}],
        "states": [{"name": "A", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "resize", "waitForCompletion": true,
                            "arguments": {"n": "${ .n }"},
                            "errorHandlers": [{"condition": "${ .type == \"timeout\" }", "retryPolicy": "once",
                                               "resultHandler": "${ .timeouts += [$value.details] }"}]},
            "enterResultHandler": "${ .r = $value }"}]
    });
    if let Some(t) = action_timeout {
        d["states"][0]["enterAction"]["timeout"] = json!(t);
    }
    d
}

fn started(doc: Value) -> (Instance, Vec<Effect>) {
    let m = Arc::new(load(&doc, &mut no_files, LoadOptions::default()).expect("valid"));
    let mut i = Instance::new(m, "w-1", Options::default());
    let out = i.handle(Timed {
        at: 0,
        input: Input::Start {
            data: json!({"n": 7}),
            scheduled: None,
        },
    });
    (i, out.effects)
}

fn at(i: &mut Instance, at: i64, input: Input) -> Vec<Effect> {
    i.handle(Timed { at, input }).effects
}

fn fire(i: &mut Instance, when: i64, timer: &str) -> Vec<Effect> {
    at(i, when, Input::TimerFired { timer: timer.into() })
}

fn start_timer(timer: &str, due: i64) -> Effect {
    Effect::StartTimer {
        timer: timer.into(),
        due,
    }
}

fn cancel_timer(timer: &str) -> Effect {
    Effect::CancelTimer { timer: timer.into() }
}

fn task_started(op: &str) -> Input {
    Input::TaskStarted {
        op: op.into(),
        worker: Some("w7".into()),
    }
}

#[test]
fn scheduling_starts_the_schedule_timers_and_taking_the_task_the_others() {
    let (mut i, effects) = started(definition(None));
    assert_eq!(
        effects,
        vec![
            Effect::InvokeFunction {
                op: "1.enter".into(),
                function: "resize".into(),
                operation: "images".into(),
                function_type: "worker".into(),
                arguments: json!({"n": 7}),
                wait: true,
                delivery: Default::default(),
            },
            start_timer("1.enter:scheduleToStart", 10_000),
            start_timer("1.enter:scheduleToClose", 120_000),
        ]
    );
    assert_eq!(i.task_started("1.enter"), Some(false));
    assert_eq!(
        at(&mut i, 2_000, task_started("1.enter")),
        vec![
            cancel_timer("1.enter:scheduleToStart"),
            start_timer("1.enter:startToClose", 62_000),
            start_timer("1.enter:heartbeat", 7_000),
        ]
    );
    assert_eq!(i.task_started("1.enter"), Some(true));
    // Taken again (handed out once more after a restart): the first deadlines stand.
    assert_eq!(at(&mut i, 3_000, task_started("1.enter")), vec![]);
    // Completing stops every timer; nothing is cancelled, the call was answered.
    assert_eq!(
        at(
            &mut i,
            4_000,
            Input::Completed {
                op: "1.enter".into(),
                result: json!("small.png")
            }
        ),
        vec![
            cancel_timer("1.enter:scheduleToClose"),
            cancel_timer("1.enter:startToClose"),
            cancel_timer("1.enter:heartbeat"),
        ]
    );
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(i.data(), json!({"n": 7, "r": "small.png"}));
    assert!(i.timers().is_empty());
    assert_eq!(i.task_started("1.enter"), None);
}

#[test]
fn heartbeats_push_the_heartbeat_deadline_without_effects_and_its_timeout_is_retried() {
    let (mut i, _) = started(definition(None));
    at(&mut i, 2_000, task_started("1.enter"));
    let beat = Input::TaskHeartbeat {
        op: "1.enter".into(),
        details: Some(json!({"done": 40})),
    };
    assert_eq!(
        at(&mut i, 6_000, beat),
        vec![],
        "a heartbeat is one journal entry, no effects"
    );
    // The timer set at the start fires early: it is set again for the rest of the new period.
    assert_eq!(
        fire(&mut i, 7_000, "1.enter:heartbeat"),
        vec![start_timer("1.enter:heartbeat", 11_000)]
    );
    let effects = fire(&mut i, 11_000, "1.enter:heartbeat");
    assert_eq!(
        effects,
        vec![
            cancel_timer("1.enter:scheduleToClose"),
            cancel_timer("1.enter:startToClose"),
            Effect::CancelOperation { op: "1.enter".into() },
            start_timer("1.enter:retry", 12_000),
        ]
    );
    assert_eq!(
        i.data()["timeouts"],
        json!([{"timeoutType": "heartbeat", "function": "resize", "taskList": "images", "worker": "w7",
                "lastHeartbeatDetails": {"done": 40}}])
    );
    // A late answer to the timed-out attempt changes nothing.
    let late = Input::Completed {
        op: "1.enter".into(),
        result: json!("late"),
    };
    assert_eq!(at(&mut i, 11_500, late), vec![]);
    // The retry is a new task with a new operation id, and new timers.
    let retry = fire(&mut i, 12_000, "1.enter:retry");
    assert!(
        matches!(&retry[0], Effect::InvokeFunction { op, .. } if op == "1.enter#2"),
        "{retry:?}"
    );
    assert_eq!(retry[1], start_timer("1.enter#2:scheduleToStart", 22_000));
    // A heartbeat from a worker the start of which was not seen counts as the start.
    let beat = Input::TaskHeartbeat {
        op: "1.enter#2".into(),
        details: None,
    };
    assert_eq!(
        at(&mut i, 13_000, beat),
        vec![
            cancel_timer("1.enter#2:scheduleToStart"),
            start_timer("1.enter#2:startToClose", 73_000),
            start_timer("1.enter#2:heartbeat", 18_000),
        ]
    );
    let done = Input::Completed {
        op: "1.enter#2".into(),
        result: json!(1),
    };
    at(&mut i, 14_000, done);
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(i.data()["r"], json!(1));
}

#[test]
fn each_timeout_fails_the_call_with_its_type_and_a_message_naming_it() {
    let doc = definition(None);
    let mut no_handler = doc.clone();
    no_handler["states"][0]["enterAction"]
        .as_object_mut()
        .unwrap()
        .remove("errorHandlers");
    // (timer, when it fires, started first?, words in the message)
    for (kind, when, take, words) in [
        (
            "scheduleToStart",
            10_000,
            false,
            "no worker took the task of function \"resize\" from task list \"images\" within PT10S",
        ),
        (
            "startToClose",
            62_000,
            true,
            "did not finish the task of function \"resize\" within PT1M of taking it",
        ),
        (
            "scheduleToClose",
            120_000,
            true,
            "was not finished within PT2M of being scheduled",
        ),
        ("heartbeat", 7_000, true, "sent no heartbeat for PT5S"),
    ] {
        let (mut i, _) = started(no_handler.clone());
        if take {
            at(&mut i, 2_000, task_started("1.enter"));
        }
        let effects = fire(&mut i, when, &format!("1.enter:{kind}"));
        assert!(
            effects.contains(&Effect::CancelOperation { op: "1.enter".into() }),
            "{kind}: {effects:?}"
        );
        assert_eq!(i.status(), Status::Failed, "{kind}");
        let e: &ErrorInfo = i.error().unwrap();
        assert_eq!(e.kind, "timeout", "{kind}");
        assert!(e.message.contains(words), "{kind}: {}", e.message);
        assert_eq!(e.details.as_ref().unwrap()["timeoutType"], json!(kind));
        assert!(i.timers().is_empty(), "{kind}: every timer stopped: {:?}", i.timers());
    }
}

#[test]
fn the_action_timeout_gives_null_and_cancelling_the_instance_cancels_the_task() {
    let (mut i, effects) = started(definition(Some("PT3S")));
    assert!(effects.contains(&start_timer("1.enter:timeout", 3_000)));
    let effects = fire(&mut i, 3_000, "1.enter:timeout");
    assert!(effects.contains(&Effect::CancelOperation { op: "1.enter".into() }));
    assert!(effects.contains(&cancel_timer("1.enter:scheduleToStart")));
    assert_eq!(i.status(), Status::Completed);
    assert_eq!(i.data()["r"], Value::Null);
    assert!(i.timers().is_empty());

    let (mut i, _) = started(definition(None));
    at(&mut i, 1_000, task_started("1.enter"));
    let effects = at(&mut i, 2_000, Input::Cancel { reason: None });
    assert!(effects.contains(&Effect::CancelOperation { op: "1.enter".into() }));
    assert_eq!(i.status(), Status::Cancelled);
    assert!(i.timers().is_empty());
}

#[test]
fn a_worker_failure_is_the_action_error() {
    let (mut i, _) = started(definition(None));
    let e = ErrorInfo::new(ErrorKind::FunctionError, "no such image").with_details(json!({"error": "NotFound"}));
    at(
        &mut i,
        1_000,
        Input::Failed {
            op: "1.enter".into(),
            error: e.clone(),
        },
    );
    assert_eq!(i.status(), Status::Failed);
    assert_eq!(i.error().unwrap().message, "no such image");
    assert_eq!(i.error().unwrap().details, e.details);
    assert!(i.timers().is_empty());
}

#[test]
fn validation_names_bad_worker_functions_by_pointer() {
    let doc = json!({
        "id": "w", "name": "w", "version": "1",
        "functions": [{"name": "a", "type": "Worker", "operation": "has space", "heartbeatTimeout": "soon"},
                      {"name": "b", "type": "worker", "operation": "ok", "startToCloseTimeout": "PT0S"},
                      {"name": "c", "operation": "http://x/api.json#c", "heartbeatTimeout": "PT5S"}],
        "states": [{"name": "A", "start": true, "enterAction": {"type": "sequence", "actions": [
            {"type": "invokeFunction", "functionName": "b"},
            {"type": "invokeFunction", "functionName": "b", "waitForCompletion": false},
            {"type": "invokeFunction", "functionName": "b", "waitForCompletion": true}]}}]
    });
    let errors: Vec<String> = load(&doc, &mut no_files, LoadOptions::default())
        .unwrap_err()
        .iter()
        .map(|e| e.to_string())
        .collect();
    let expect = [
        "/functions/0/operation: \"has space\" is not a task list name",
        "/functions/0/heartbeatTimeout: invalid timespan \"soon\"",
        "/functions/1/startToCloseTimeout: must be longer than zero",
        "/functions/2/heartbeatTimeout: only functions of type \"worker\" have task timeouts; this one is \"rest\"",
        "/states/0/enterAction/actions/0: function \"b\" is a worker function",
        "/states/0/enterAction/actions/1/waitForCompletion: function \"b\" is a worker function",
    ];
    for want in expect {
        assert!(
            errors.iter().any(|e| e.starts_with(want)),
            "missing {want:?} in {errors:#?}"
        );
    }
    assert_eq!(errors.len(), expect.len(), "{errors:#?}");
}
