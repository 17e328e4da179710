//! The driver's policies, shown by feeding inputs and reading steps: no store, no broker, no
//! clock, no runtime.

use super::*;
use sm4c_runtime::{load, no_files, LoadOptions};

const T0: Millis = 1_700_000_000_000;

fn machine(doc: Value) -> Arc<Machine> {
    Arc::new(load(&doc, &mut no_files, LoadOptions::default()).expect("valid definition"))
}

fn at(at: Millis, input: Input) -> Timed {
    Timed { at, input }
}

fn start(d: &Driver, h: &mut Hosted, data: Value) -> Step {
    d.step(h, at(T0, Input::Start { data, scheduled: None }))
}

/// Calls `f`, waiting for its result, then ends.
fn caller(function_type: &str, wait: bool) -> Arc<Machine> {
    machine(json!({"id": "caller", "name": "caller", "version": "1",
        "functions": [{"name": "f", "operation": "list.a", "type": function_type}],
        "states": [{"name": "A", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "f", "arguments": {"n": "${ .n }"},
                            "waitForCompletion": wait},
            "enterResultHandler": "${ .r = $value }"}]}))
}

fn parent(wait: bool) -> Arc<Machine> {
    machine(
        json!({"id": "parent", "name": "p", "version": "1", "states": [{"name": "P", "start": true,
        "enterAction": {"type": "invokeSubflow", "subflowName": "child", "arguments": {"n": 7}, "waitForCompletion": wait},
        "enterResultHandler": "${ .child = $value }"}]}),
    )
}

fn child_machine() -> Arc<Machine> {
    machine(json!({"id": "child", "name": "c", "version": "1",
        "states": [{"name": "C", "start": true, "enterAction": {"type": "injectData", "expression": "${ {done: true} }"},
                    "enterResultHandler": "${ .out = $value }"}]}))
}

fn waiter() -> Arc<Machine> {
    machine(json!({"id": "w", "name": "w", "version": "1",
        "events": [{"name": "go", "type": "go", "correlation": [{"contextAttributeName": "orderid", "contextAttributeValue": "${ .order }"}]}],
        "states": [{"name": "Wait", "start": true, "transitions": [
            {"nextState": "Done", "eventGroups": [{"events": ["go"], "resultHandler": "${ .got = ($value | .data) }"}]}]},
            {"name": "Done"}]}))
}

fn only_call(step: &Step) -> (FunctionCall, bool) {
    match step.work.as_slice() {
        [Work::Call { call, wait }] => (call.clone(), *wait),
        other => panic!("expected one call, got {other:?}"),
    }
}

#[test]
fn a_call_is_open_until_its_result_and_the_result_reaches_the_instance_once() {
    let d = Driver::durable();
    let mut h = d.create(caller("rest", true), "i");
    let (call, wait) = only_call(&start(&d, &mut h, json!({"n": 3})));
    assert!(wait);
    assert_eq!(call.op, "1.enter");
    assert_eq!(call.arguments, json!({"n": 3}));
    assert!(h.open_op("1.enter").is_some());
    let input = d
        .call_done(&mut h, "1.enter", Ok(json!(9)))
        .expect("the instance waits");
    assert!(h.open.is_empty());
    // A second result for the same call (a retry after a crash) reaches nothing.
    assert_eq!(d.call_done(&mut h, "1.enter", Ok(json!(10))), None);
    let step = d.step(&mut h, at(T0 + 1, input));
    assert!(step.finished);
    assert_eq!(h.inst.status(), Status::Completed);
    assert_eq!(h.inst.data()["r"], json!(9));
    // Journaling drivers keep the entries for the host to record.
    assert_eq!(h.pending.len() as i64 + h.journal_len, h.pending.len() as i64);
    assert!(!h.pending.is_empty());
}

#[test]
fn a_call_nobody_waits_for_closes_when_it_returns_and_delivers_nothing() {
    let d = Driver::durable();
    let mut h = d.create(caller("rest", false), "i");
    let (_, wait) = only_call(&start(&d, &mut h, json!({"n": 1})));
    assert!(!wait);
    assert_eq!(h.inst.status(), Status::Completed);
    // Ended: nothing stays open, and a late result is moot.
    assert!(h.open.is_empty());
    assert_eq!(d.call_done(&mut h, "1.enter", Ok(json!(1))), None);
}

#[test]
fn a_worker_call_is_a_task_and_only_its_first_answer_counts() {
    let d = Driver::durable();
    let mut h = d.create(caller("worker", true), "i");
    let step = start(&d, &mut h, json!({"n": 1}));
    let task = match step.work.as_slice() {
        [Work::Task { task, wait: true }] => task.clone(),
        other => panic!("expected a task, got {other:?}"),
    };
    assert_eq!(task.task_list, "list.a");
    assert!(h.open_task("1.enter"));
    // A heartbeat keeps it open.
    match d.answer(&mut h, "1.enter", Answer::Heartbeat(None)) {
        Answering::Open {
            input: Some(Input::TaskHeartbeat { .. }),
        } => {}
        other => panic!("{other:?}"),
    }
    assert!(h.open_task("1.enter"));
    let input = match d.answer(&mut h, "1.enter", Answer::Complete(json!("ok"))) {
        Answering::Open { input: Some(i) } => i,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        d.answer(&mut h, "1.enter", Answer::Complete(json!("again"))),
        Answering::Closed
    );
    assert_eq!(
        d.answer(
            &mut h,
            "9.nothing",
            Answer::Fail(ErrorInfo::new(ErrorKind::FunctionError, "x"))
        ),
        Answering::Closed
    );
    d.step(&mut h, at(T0 + 5, input));
    assert_eq!(h.inst.data()["r"], json!("ok"));
}

#[test]
fn the_journal_limit_fails_the_instance_instead_of_taking_the_input() {
    let d = Driver {
        limits: Limits {
            max_journal: 3,
            ..Limits::default()
        },
        ..Driver::durable()
    };
    let mut h = d.create(caller("rest", true), "i");
    start(&d, &mut h, json!({"n": 1}));
    assert!(h.pending.len() >= 3, "the start alone fills this small journal");
    let input = d.call_done(&mut h, "1.enter", Ok(json!(1))).unwrap();
    let step = d.step(&mut h, at(T0 + 1, input));
    assert!(step.finished);
    let e = h.inst.error().expect("failed");
    assert_eq!(e.kind, "limitExceeded");
    assert_eq!(e.message, "the journal of this instance reached its limit of 3 entries");
    // Recorded entries count as much as pending ones.
    let mut h = d.create(caller("rest", true), "j");
    start(&d, &mut h, json!({}));
    h.journal_len = h.pending.len() as i64;
    h.pending.clear();
    let input = d.call_done(&mut h, "1.enter", Ok(json!(1))).unwrap();
    d.step(&mut h, at(T0 + 1, input));
    assert_eq!(h.inst.error().map(|e| e.kind.as_str()), Some("limitExceeded"));
}

#[test]
fn an_engine_panic_fails_that_instance_with_its_message() {
    let d = Driver::durable();
    let mut h = d.create(caller("rest", true), "i");
    let step = d.run_engine(&mut h, |_| {
        panic!("index out of bounds: the len is 1 but the index is 4")
    });
    assert!(step.finished);
    assert!(step.work.is_empty());
    let e = h.inst.error().expect("failed");
    assert_eq!(e.kind, "internalError");
    assert_eq!(
        e.message,
        "the engine failed on this instance: index out of bounds: the len is 1 but the index is 4"
    );
    // Ended: it takes no more input.
    assert_eq!(start(&d, &mut h, json!({})), Step::default());
    // Another instance is untouched.
    let mut other = d.create(caller("rest", true), "j");
    assert_eq!(only_call(&start(&d, &mut other, json!({}))).0.instance, "j");
}

#[test]
fn a_subflow_is_linked_to_its_parent_which_hears_how_it_ended() {
    let d = Driver::durable();
    let mut p = d.create(parent(true), "p");
    let step = start(&d, &mut p, json!({}));
    let child = match step.work.as_slice() {
        [Work::StartChild(c)] => c.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(child.id, "p/1.enter");
    assert_eq!(child.depth, 1);
    assert_eq!(
        child.parent,
        ParentLink {
            instance: "p".into(),
            op: "1.enter".into(),
            waits: true
        }
    );
    let mut c = d.child(&child, Some(child_machine())).expect("starts");
    // A waited-for start stays open until the child ends, even once started.
    p.child_started("1.enter");
    assert!(p.open_op("1.enter").is_some());
    let step = d.step(
        &mut c,
        at(
            T0,
            Input::Start {
                data: child.input.clone(),
                scheduled: None,
            },
        ),
    );
    assert!(step.finished);
    let n = step.notify.expect("the parent waits");
    assert_eq!(n.instance, "p");
    let step = d.step(&mut p, at(T0 + 1, n.input));
    assert!(step.finished);
    assert_eq!(p.inst.data()["child"]["out"], json!({"done": true}));
    assert!(p.open.is_empty());
}

#[test]
fn a_failed_subflow_is_a_subflow_error_for_the_parent() {
    let input = subflow_result(
        "p/1.enter",
        "1.enter".into(),
        Status::Cancelled,
        Value::Null,
        Some(ErrorInfo::new(ErrorKind::Cancelled, "by the API")),
    );
    match input {
        Input::Failed { op, error } => {
            assert_eq!(op, "1.enter");
            assert_eq!(error.kind, "subflowError");
            assert_eq!(error.message, "subflow p/1.enter ended cancelled: by the API");
            assert_eq!(
                error.details,
                Some(json!({
                    "instance": "p/1.enter",
                    "status": "cancelled",
                    "error": {"type": "cancelled", "message": "by the API"}
                }))
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_parent_that_does_not_wait_forgets_the_start_once_made_and_hears_nothing() {
    let d = Driver::durable();
    let mut p = d.create(parent(false), "p");
    let step = start(&d, &mut p, json!({}));
    let child = match step.work.as_slice() {
        [Work::StartChild(c)] => c.clone(),
        other => panic!("{other:?}"),
    };
    assert!(!child.parent.waits);
    let mut c = d.child(&child, Some(child_machine())).unwrap();
    p.child_started("1.enter");
    assert!(p.open.is_empty());
    let step = d.step(
        &mut c,
        at(
            T0,
            Input::Start {
                data: json!({}),
                scheduled: None,
            },
        ),
    );
    assert!(step.finished);
    assert_eq!(step.notify, None);
}

#[test]
fn subflows_nest_at_most_the_limit_and_an_unknown_definition_is_refused() {
    let d = Driver::durable();
    let link = ParentLink {
        instance: "p".into(),
        op: "1.enter".into(),
        waits: true,
    };
    let start = |depth| ChildStart {
        id: "p/1.enter".into(),
        definition: "child".into(),
        input: json!({}),
        parent: link.clone(),
        depth,
    };
    assert!(d.child(&start(MAX_SUBFLOW_DEPTH), Some(child_machine())).is_ok());
    let refused = |r: Result<Hosted, Option<Notify>>| match r {
        Err(Some(Notify {
            instance,
            input: Input::Failed { op, error },
        })) => {
            assert_eq!((instance.as_str(), op.as_str()), ("p", "1.enter"));
            assert_eq!(error.kind, "subflowError");
            error.message
        }
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("started"),
    };
    assert_eq!(
        refused(d.child(&start(MAX_SUBFLOW_DEPTH + 1), Some(child_machine()))),
        "subflow \"child\" would nest deeper than 32 levels (does a subflow start itself?)"
    );
    assert_eq!(
        refused(d.child(&start(1), None)),
        "no definition with id \"child\" for invokeSubflow"
    );
    // A parent that does not wait is not told.
    let mut quiet = start(1);
    quiet.parent.waits = false;
    assert!(matches!(d.child(&quiet, None), Err(None)));
}

#[test]
fn cancelling_an_operation_stops_its_call_and_names_its_child() {
    let d = Driver::durable();
    let m = machine(json!({"id": "t", "name": "t", "version": "1",
        "functions": [{"name": "f", "operation": "x#f"}],
        "states": [{"name": "A", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "f", "waitForCompletion": true, "timeout": "PT1S"}}]}));
    let mut h = d.create(m, "i");
    let step = start(&d, &mut h, json!({}));
    let timer = step
        .work
        .iter()
        .find_map(|w| match w {
            Work::ArmTimer { timer, due } => Some((timer.clone(), *due)),
            _ => None,
        })
        .expect("the action's timeout is a timer");
    assert_eq!(timer.1, T0 + 1000);
    let step = d.step(&mut h, at(T0 + 1000, Input::TimerFired { timer: timer.0 }));
    assert!(step.work.contains(&Work::Stop {
        op: "1.enter".into(),
        child: "i/1.enter".into()
    }));
    assert!(h.open.is_empty());
    // The call's late result reaches nothing.
    assert_eq!(d.call_done(&mut h, "1.enter", Ok(json!(1))), None);
}

#[test]
fn events_go_to_the_instance_they_name_or_to_the_instances_whose_correlation_they_carry() {
    let d = Driver::durable();
    let m = waiter();
    let mut a = d.create(m.clone(), "a");
    let mut b = d.create(m.clone(), "b");
    start(&d, &mut a, json!({"order": "A-1"}));
    start(&d, &mut b, json!({"order": "B-2"}));
    let ev = |order: &str| json!({"specversion": "1.0", "id": "e1", "source": "s", "type": "go", "orderid": order, "data": {"x": 1}});
    assert!(may_accept(&m, &ev("A-1")));
    assert!(!may_accept(
        &m,
        &json!({"specversion": "1.0", "id": "e", "source": "s", "type": "other"})
    ));
    assert!(accepts(&a.inst, &ev("A-1")));
    assert!(!accepts(&b.inst, &ev("A-1")));
    assert_eq!(target(&ev("A-1")), None);
    let mut named = ev("B-2");
    named[INSTANCE_ATTRIBUTE] = json!("b");
    assert_eq!(target(&named).as_deref(), Some("b"));
    let step = d.step(&mut a, at(T0 + 1, Input::Event { event: ev("A-1") }));
    assert!(step.finished);
    assert_eq!(a.inst.data()["got"], json!({"x": 1}));
    // An instance that has ended accepts nothing.
    assert!(!accepts(&a.inst, &ev("A-1")));
}

#[test]
fn the_inbox_limit_is_the_drivers_engine_setting() {
    let d = Driver {
        options: Options {
            max_inbox: 2,
            ..Driver::durable().options
        },
        ..Driver::durable()
    };
    let m = machine(json!({"id": "w", "name": "w", "version": "1",
        "events": [{"name": "go", "type": "go"}, {"name": "other", "type": "other"}],
        "states": [{"name": "Wait", "start": true, "transitions": [
            {"nextState": "Done", "eventGroups": [{"events": ["go"], "resultHandler": "${ .got = ($value | .data) }"}]}]},
            {"name": "Done"}]}));
    let mut h = d.create(m, "i");
    start(&d, &mut h, json!({}));
    for n in 0..3 {
        let e = json!({"specversion": "1.0", "id": format!("o{n}"), "source": "s", "type": "other", "data": n});
        d.step(&mut h, at(T0 + n, Input::Event { event: e }));
    }
    assert_eq!(h.inst.snapshot().inbox.len(), 2);
}

#[test]
fn sent_events_and_timers_come_out_as_work_in_the_engines_order() {
    let d = Driver::durable();
    let m = machine(json!({"id": "s", "name": "s", "version": "1",
        "events": [{"name": "out", "type": "out", "kind": "produced"}],
        "states": [{"name": "A", "start": true,
            "enterAction": {"type": "sequence", "actions": [
                {"type": "sendEvent", "event": "out", "expression": "${ {n: 1} }"},
                {"type": "delay", "timeout": "PT5S"}]}}]}));
    let mut h = d.create(m, "i");
    let step = start(&d, &mut h, json!({}));
    match step.work.as_slice() {
        [Work::Send { event, .. }, Work::ArmTimer { due, .. }] => {
            assert_eq!(event["type"], "out");
            assert_eq!(*due, T0 + 5000);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn parent_links_keep_the_tuple_form_stores_and_records_have() {
    let l = ParentLink {
        instance: "p".into(),
        op: "1.enter".into(),
        waits: true,
    };
    assert_eq!(serde_json::to_value(&l).unwrap(), json!(["p", "1.enter", true]));
    let back: ParentLink = serde_json::from_value(json!(["p", "1.enter", true])).unwrap();
    assert_eq!(back, l);
}

/// An ASL Task of Resource `arn:pack`, failing into a catch of `Rejected`.
fn asl_packer() -> Arc<Machine> {
    machine(json!({"sm4c:id": "pack", "StartAt": "Pack", "States": {
        "Pack": {"Type": "Task", "Resource": "arn:pack", "End": true,
                 "Catch": [{"ErrorEquals": ["Rejected"], "Next": "Caught"}]},
        "Caught": {"Type": "Pass", "End": true}}}))
}

#[test]
fn asl_tasks_bound_to_task_lists_become_tasks_whose_failures_keep_their_name() {
    // Unbound, the Task is a call.
    let d = Driver::durable();
    let mut h = d.create(asl_packer(), "o-1");
    let step = start(&d, &mut h, json!({}));
    assert!(matches!(&step.work[0], Work::Call { call, .. } if call.function_type == "asl"));

    let mut d = Driver::durable();
    let bindings = [("arn:pack", "packing"), ("f", "packing")].map(|(r, l)| (r.to_string(), l.to_string()));
    d.task_lists = Some(Arc::new(TaskListBindings::from(bindings)));
    let mut h = d.create(asl_packer(), "o-2");
    let step = start(&d, &mut h, json!({}));
    let Work::Task { task, wait: true } = &step.work[0] else {
        panic!("{:?}", step.work)
    };
    assert_eq!(
        (task.task_list.as_str(), task.function.as_str()),
        ("packing", "arn:pack")
    );
    assert!(
        h.open_task(&task.op),
        "the bound Task is open as a task, so a worker's answer finds it"
    );
    // The task API's failure `error` is the ASL error name, which Catch matches.
    let failure = Answer::failure(&json!({"error": "Rejected", "message": "too big"})).unwrap();
    let Answering::Open { input: Some(input) } = d.answer(&mut h, &task.op, failure) else {
        panic!("the task is open")
    };
    d.step(&mut h, at(T0 + 1, input));
    assert_eq!(h.inst.status(), Status::Completed);
    assert_eq!(h.inst.data(), json!({"Error": "Rejected", "Cause": "too big"}));
    // SM4C definitions are never bound, whatever their function names.
    let mut h = d.create(caller("rest", true), "c-1");
    assert!(matches!(&start(&d, &mut h, json!({"n": 1})).work[0], Work::Call { .. }));
}

#[test]
fn breakpoints_are_recorded_once_when_they_change_and_a_paused_call_result_waits() {
    let d = Driver::durable();
    let bps = Breakpoints::default();
    let mut h = d.create(caller("rest", true), "c-1");
    // None set: nothing to record, whatever the instance.
    assert_eq!(bps.input_for(&h.inst), None);
    bps.set("caller", vec![sm4c_runtime::Breakpoint::Enter { state: "A".into() }]);
    bps.set("other", vec![sm4c_runtime::Breakpoint::Enter { state: "X".into() }]);
    let debug = bps.input_for(&h.inst).expect("the set differs from the instance's");
    d.step(&mut h, at(T0, debug));
    assert_eq!(
        bps.input_for(&h.inst),
        None,
        "recorded: the same set is not recorded again"
    );
    let step = start(&d, &mut h, json!({"n": 1}));
    assert!(step.work.is_empty(), "paused before entering A: no call yet");
    assert_eq!(h.inst.status(), Status::Paused);
    let step = d.step(&mut h, at(T0 + 1, Input::Resume { step: false }));
    let (call, _) = only_call(&step);
    assert_eq!(h.inst.status(), Status::Running);
    let input = d.call_done(&mut h, &call.op, Ok(json!(5))).expect("waited for");
    d.step(&mut h, at(T0 + 2, input));
    assert_eq!(h.inst.status(), Status::Completed);
    assert_eq!(h.inst.data()["r"], 5);
    // Cleared: the instance is told once, then nothing more.
    bps.set("caller", Vec::new());
    let mut fresh = d.create(caller("rest", true), "c-2");
    assert_eq!(bps.input_for(&fresh.inst), None, "a fresh instance has none recorded");
    assert!(start(&d, &mut fresh, json!({"n": 1})).work.len() == 1);
    assert_eq!(bps.all().len(), 1);
    assert_eq!(input_kind(&Input::Resume { step: true }), "resume");
}

#[test]
fn a_traceparent_is_taken_only_in_the_form_of_version_00() {
    let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert_eq!(super::traceparent(ok), Some(ok));
    assert_eq!(super::traceparent(&format!("  {ok} ")), Some(ok));
    for bad in [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
    ] {
        assert_eq!(super::traceparent(bad), None, "{bad:?}");
    }
}

#[test]
fn a_cancelled_timer_is_named_with_its_due_time_and_one_armed_again_lets_go_of_the_earlier() {
    let mut d = Driver::durable();
    let m = machine(json!({"sm4c:id": "beat", "StartAt": "Work", "States": {
        "Work": {"Type": "Task", "Resource": "arn:work", "HeartbeatSeconds": 10, "End": true}}}));
    let bindings = [("arn:work", "work")].map(|(r, l)| (r.to_string(), l.to_string()));
    d.task_lists = Some(Arc::new(TaskListBindings::from(bindings)));
    let mut h = d.create(m, "b-1");
    let Work::Task { task, .. } = &start(&d, &mut h, json!({})).work[0] else {
        panic!("a task")
    };
    let op = task.op.clone();
    let step = d.step(
        &mut h,
        at(
            T0 + 1_000,
            Input::TaskStarted {
                op: op.clone(),
                worker: None,
            },
        ),
    );
    let beat = step
        .work
        .iter()
        .find_map(|w| match w {
            Work::ArmTimer { timer, due } if timer.starts_with("heartbeat") => Some((timer.clone(), *due)),
            _ => None,
        })
        .expect("the heartbeat timer is armed when the worker takes the task");
    assert_eq!(beat.1, T0 + 11_000);
    // A heartbeat pushes the timer back: the earlier due time is let go of, so a host does not
    // fire the timer at it (the engine would take that as the missed heartbeat).
    let step = d.step(
        &mut h,
        at(
            T0 + 5_000,
            Input::TaskHeartbeat {
                op: op.clone(),
                details: None,
            },
        ),
    );
    match step.work.as_slice() {
        [Work::CancelTimer { timer, due: Some(old) }, Work::ArmTimer { timer: again, due }] => {
            assert_eq!((timer, *old), (&beat.0, T0 + 11_000));
            assert_eq!((again, *due), (&beat.0, T0 + 15_000));
        }
        other => panic!("{other:?}"),
    }
    // The answer cancels the timer, named with the due time it had.
    let done = Answer::Complete(json!({"ok": true}));
    let Answering::Open { input: Some(input) } = d.answer(&mut h, &op, done) else {
        panic!("the task is open")
    };
    let step = d.step(&mut h, at(T0 + 6_000, input));
    assert!(
        step.work.iter().any(
            |w| matches!(w, Work::CancelTimer { timer, due: Some(due) } if *timer == beat.0 && *due == T0 + 15_000)
        ),
        "{:?}",
        step.work
    );
    assert_eq!(h.inst.status(), Status::Completed);
}

#[test]
fn a_function_result_nested_deeper_than_the_limit_fails_the_call_and_enters_nothing() {
    let depth = sm4c_runtime::json::MAX_DEPTH;
    let nested = |levels: usize| (0..levels).fold(json!(1), |v, _| json!([v]));
    let d = Driver::durable();
    let mut h = d.create(caller("rest", true), "i");
    only_call(&start(&d, &mut h, json!({"n": 3})));
    let input = d
        .call_done(&mut h, "1.enter", Ok(nested(depth + 1)))
        .expect("the instance waits");
    match &input {
        Input::Failed { op, error } => {
            assert_eq!(op, "1.enter");
            assert_eq!(error.kind, ErrorKind::FunctionError);
            assert!(
                error
                    .message
                    .contains("function's result is nested deeper than 64 levels"),
                "{}",
                error.message
            );
        }
        other => panic!("expected a failed call, got {other:?}"),
    }
    d.step(&mut h, at(T0 + 1, input));
    assert_eq!(h.inst.status(), Status::Failed);
    assert_eq!(h.inst.data().get("r"), None);

    // At the limit, the result enters the instance.
    let mut h = d.create(caller("rest", true), "j");
    only_call(&start(&d, &mut h, json!({"n": 3})));
    let input = d
        .call_done(&mut h, "1.enter", Ok(nested(depth)))
        .expect("the instance waits");
    assert!(matches!(input, Input::Completed { .. }), "{input:?}");
}

#[test]
fn an_open_at_most_once_call_is_failed_after_a_crash_and_any_other_is_made_again() {
    let d = Driver::durable();
    let amo = machine(json!({"id": "amo", "name": "amo", "version": "1",
        "functions": [{"name": "f", "operation": "a#b", "delivery": "atMostOnce"}],
        "states": [{"name": "A", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "f", "waitForCompletion": true}}]}));
    let mut h = d.create(amo.clone(), "i");
    let step = start(&d, &mut h, json!({}));
    // What a host finds open after a crash, turned into work as on recovery.
    let work = d.work("i", &amo, 0, h.open[0].clone());
    assert!(matches!(&step.work[..], [Work::Call { call, .. }] if call.delivery == sm4c_runtime::Delivery::AtMostOnce));
    let Some(Input::Failed { op, error }) = interrupted(&work) else {
        panic!("{work:?}")
    };
    assert_eq!(op, "1.enter");
    assert_eq!(error.kind, ErrorKind::StepInterrupted);
    // Journaled and stepped like any failure: the call is closed and the instance fails with it.
    let step = d.step(&mut h, at(T0 + 1, Input::Failed { op, error }));
    assert!(step.finished && h.open.is_empty());
    assert_eq!(h.inst.error().map(|e| e.kind.clone()), Some(ErrorKind::StepInterrupted));
    // atLeastOnce calls and worker tasks are made again as before.
    let mut h = d.create(caller("rest", true), "j");
    start(&d, &mut h, json!({"n": 1}));
    assert!(interrupted(&d.work("j", &caller("rest", true), 0, h.open[0].clone())).is_none());
    let mut h = d.create(caller("worker", true), "k");
    start(&d, &mut h, json!({"n": 1}));
    assert!(interrupted(&d.work("k", &caller("worker", true), 0, h.open[0].clone())).is_none());
}
