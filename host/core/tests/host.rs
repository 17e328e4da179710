//! The in-memory host: real and virtual clocks, event delivery, subflows, cancellation.

use serde_json::{json, Value};
use sm4c_host::{BoxFuture, Clock, Config, FunctionCall, Functions, InMemoryHost};
use sm4c_runtime::{load, no_files, ErrorInfo, ErrorKind, LoadOptions, Machine, Status};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn machine(doc: Value) -> Arc<Machine> {
    Arc::new(load(&doc, &mut no_files, LoadOptions::default()).expect("valid"))
}

#[derive(Default)]
struct TestHost {
    subflows: HashMap<String, Arc<Machine>>,
    sent: Mutex<Vec<Value>>,
    calls: Mutex<Vec<FunctionCall>>,
}

impl Functions for TestHost {
    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
        self.calls.lock().unwrap().push(call.clone());
        Box::pin(async move {
            match call.function.as_str() {
                "double" => Ok(json!(call.arguments["n"].as_i64().unwrap_or(0) * 2)),
                _ => Err(ErrorInfo::new(
                    ErrorKind::FunctionError,
                    format!("{} is down", call.function),
                )),
            }
        })
    }
    fn send_event(&self, event: Value) -> BoxFuture<'static, Result<(), ErrorInfo>> {
        self.sent.lock().unwrap().push(event);
        Box::pin(async { Ok(()) })
    }
    fn subflow(&self, id: &str) -> Option<Arc<Machine>> {
        self.subflows.get(id).cloned()
    }
}

fn waiter() -> Value {
    json!({
        "id": "waiter", "name": "waiter", "version": "1",
        "events": [{"name": "go", "type": "go"}],
        "states": [
            {"name": "Wait", "start": true, "transitions": [
                {"nextState": "Done", "eventGroups": [{"events": ["go"], "resultHandler": "${ .got = ($value | .data) }"}]}]},
            {"name": "Done"}
        ]
    })
}

fn virtual_clock() -> Config {
    Config {
        clock: Clock::Virtual { start: 1_000_000 },
        ..Config::default()
    }
}

#[tokio::test]
async fn real_clock_timers_fire() {
    let m = machine(json!({
        "id": "d", "name": "d", "version": "1",
        "states": [{"name": "A", "start": true, "enterAction": {"type": "delay", "timeout": "0.05s"},
                    "enterResultHandler": "${ .slept = true }"}]
    }));
    let host = InMemoryHost::new(
        Arc::new(TestHost::default()),
        Config {
            clock: Clock::Real,
            ..Config::default()
        },
    );
    let id = host.start(m, json!({})).await;
    let o = host.outcome(&id).await;
    assert_eq!(o.status, Status::Completed);
    assert_eq!(o.data, json!({"slept": true}));
}

#[tokio::test]
async fn events_reach_waiting_instances_by_id_or_by_match() {
    let host = InMemoryHost::new(Arc::new(TestHost::default()), virtual_clock());
    let m = machine(waiter());
    let a = host.start(m.clone(), json!({})).await;
    let b = host.start(m, json!({})).await;
    assert_eq!(host.settle(&a).await.status, Status::Waiting);
    // Addressed to one instance.
    host.deliver_event(
        json!({"specversion": "1.0", "id": "1", "source": "t", "type": "go", "sm4cinstanceid": a, "data": "for a"}),
    );
    let oa = host.outcome(&a).await;
    assert_eq!(oa.data, json!({"got": "for a"}));
    assert_eq!(host.settle(&b).await.status, Status::Waiting, "b was not addressed");
    // Unaddressed: every instance whose definitions match.
    host.deliver_event(json!({"specversion": "1.0", "id": "2", "source": "t", "type": "go", "data": "for all"}));
    assert_eq!(host.outcome(&b).await.data, json!({"got": "for all"}));
}

#[tokio::test]
async fn sent_events_reach_other_instances_and_the_host() {
    let host_impl = Arc::new(TestHost::default());
    let host = InMemoryHost::new(host_impl.clone(), virtual_clock());
    let waiting = host.start(machine(waiter()), json!({})).await;
    let sender = machine(json!({
        "id": "s", "name": "s", "version": "1",
        "events": [{"name": "go", "type": "go", "source": "sender"}],
        "states": [{"name": "A", "start": true, "enterAction": {"type": "sendEvent", "event": "go", "expression": "${ .msg }"}}]
    }));
    let s = host.start(sender, json!({"msg": "hi"})).await;
    assert_eq!(host.outcome(&s).await.status, Status::Completed);
    assert_eq!(host.outcome(&waiting).await.data, json!({"got": "hi"}));
    let sent = host_impl.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["source"], "sender");
    assert_eq!(sent[0]["sm4cinstanceid"], s.as_str());
}

#[tokio::test]
async fn subflows_return_output_and_propagate_failure() {
    let child = machine(json!({
        "id": "child", "name": "child", "version": "1",
        "functions": [{"name": "double", "operation": "x#double"}, {"name": "broken", "operation": "x#broken"}],
        "states": [{"name": "A", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "double", "arguments": {"n": "${ .n }"}, "waitForCompletion": true},
            "enterResultHandler": "${ .doubled = $value }"}]
    }));
    let failing = machine(json!({
        "id": "failing", "name": "failing", "version": "1",
        "functions": [{"name": "broken", "operation": "x#broken"}],
        "states": [{"name": "A", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "broken", "waitForCompletion": true}}]
    }));
    let mut h = TestHost::default();
    h.subflows.insert("child".into(), child);
    h.subflows.insert("failing".into(), failing);
    let host = InMemoryHost::new(Arc::new(h), virtual_clock());
    let parent = machine(json!({
        "id": "parent", "name": "parent", "version": "1",
        "states": [{"name": "A", "start": true,
            "enterAction": {"type": "sequence", "actions": [
                {"name": "ok", "type": "invokeSubflow", "subflowName": "child", "arguments": {"n": 21}, "waitForCompletion": true},
                {"name": "bad", "type": "invokeSubflow", "subflowName": "failing", "waitForCompletion": true,
                 "errorHandlers": [{"condition": "${ .type == \"subflowError\" }", "resultHandler": "${ .childError = $value.message }"}]}]},
            "enterResultHandler": "${ .out = $value }"}]
    }));
    let id = host.start(parent, json!({})).await;
    let o = host.outcome(&id).await;
    assert_eq!(o.status, Status::Completed, "{o:?}");
    assert_eq!(o.data["out"], json!({"ok": {"n": 21, "doubled": 42}, "bad": null}));
    assert!(
        o.data["childError"].as_str().unwrap().contains("broken is down"),
        "{}",
        o.data
    );
}

#[tokio::test]
async fn cancelling_a_parent_cancels_its_waiting_child() {
    let mut h = TestHost::default();
    h.subflows.insert("waiter".into(), machine(waiter()));
    let host = InMemoryHost::new(Arc::new(h), virtual_clock());
    let parent = machine(json!({
        "id": "p", "name": "p", "version": "1",
        "states": [{"name": "A", "start": true,
            "enterAction": {"type": "invokeSubflow", "subflowName": "waiter", "waitForCompletion": true}}]
    }));
    let id = host.start(parent, json!({})).await;
    assert_eq!(host.settle(&id).await.status, Status::Running);
    host.cancel(&id);
    let o = host.outcome(&id).await;
    assert_eq!(o.status, Status::Cancelled);
    assert_eq!(o.error.unwrap().kind, "cancelled");
    let child = host.outcome(&format!("{id}/1.enter")).await;
    assert_eq!(child.status, Status::Cancelled);
}

#[tokio::test]
async fn function_calls_carry_the_operation_id() {
    let h = Arc::new(TestHost::default());
    let host = InMemoryHost::new(h.clone(), virtual_clock());
    let m = machine(json!({
        "id": "f", "name": "f", "version": "1",
        "functions": [{"name": "double", "operation": "x#double"}],
        "states": [{"name": "A", "start": true,
            "enterAction": {"type": "foreach", "input": "${ .items }", "maxParallel": 2,
                            "action": {"type": "invokeFunction", "functionName": "double", "arguments": {"n": "${ . }"}, "waitForCompletion": true}},
            "enterResultHandler": "${ .out = $value }"}]
    }));
    let id = host
        .start_with(m, Some("f-1".into()), json!({"items": [1, 2, 3]}), vec![])
        .await;
    assert_eq!(host.outcome(&id).await.data["out"], json!([2, 4, 6]));
    let mut ops: Vec<String> = h.calls.lock().unwrap().iter().map(|c| c.op.clone()).collect();
    ops.sort();
    assert_eq!(ops, vec!["1.enter/0", "1.enter/1", "1.enter/2"]);
}
