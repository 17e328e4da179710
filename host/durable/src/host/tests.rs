use super::*;
use crate::store::MemoryStore;
use serde_json::json;
use sm4c_host::driver::ParentLink;
use sm4c_host::service::Delivery;
use sm4c_host::{BoxFuture, FunctionCall};
use sm4c_runtime::{Effect, Entry, Status};

struct Echo;
impl Functions for Echo {
    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
        Box::pin(async move { Ok(json!({"echo": call.arguments, "op": call.op})) })
    }
}

fn start(limits: HostLimits) -> (DurableHost, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::default());
    let host = DurableHost::start(store.clone(), Arc::new(Echo), limits).expect("starts");
    (host, store)
}

async fn settle(h: &DurableHost, id: &str) -> sm4c_runtime::Snapshot {
    for _ in 0..200 {
        let s = h.store().instance(id).unwrap().unwrap().snapshot;
        if s.status.is_final() {
            return s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    h.store().instance(id).unwrap().unwrap().snapshot
}

fn waiter() -> Value {
    json!({"id": "w", "name": "w", "version": "1",
        "events": [{"name": "go", "type": "go", "correlation": [{"contextAttributeName": "orderId", "contextAttributeValue": "${ .order }"}]}],
        "states": [{"name": "Wait", "start": true, "transitions": [
            {"nextState": "Done", "eventGroups": [{"events": ["go"], "resultHandler": "${ .got = ($value | .data) }"}]}]},
            {"name": "Done"}]})
}

fn go(order: &str) -> Value {
    json!({"specversion": "1.0", "id": format!("e-{order}"), "source": "t", "type": "go", "orderid": order, "data": order})
}

#[tokio::test]
async fn parked_events_stop_at_the_count_and_bytes_limits_and_a_refused_event_is_not_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(crate::store::SqliteStore::open(&dir.path().join("s.db")).expect("open"));
    let limits = HostLimits {
        max_parked: 2,
        ..HostLimits::default()
    };
    let h = DurableHost::start(store.clone(), Arc::new(Echo), limits).expect("starts");
    h.define(waiter()).await.unwrap();
    assert!(h.deliver(go("A")).await.unwrap().parked);
    assert!(h.deliver(go("B")).await.unwrap().parked);
    match h.deliver(go("C")).await {
        Err(HostError::ParkedLimit(why)) => {
            assert!(
                why.contains("2 events are parked") && why.contains("--max-parked"),
                "{why}"
            )
        }
        other => panic!("the third event is refused, not {other:?}"),
    }
    assert_eq!(store.parked_totals(0).unwrap().0, 2, "the refused event was not kept");
    // An instance takes a parked event: there is room again, and nothing parked was lost.
    h.start_instance("w", None, Some("a".into()), json!({"order": "A"}))
        .await
        .unwrap();
    assert_eq!(settle(&h, "a").await.status, Status::Completed, "A was still parked");
    assert!(h.deliver(go("C")).await.unwrap().parked, "room for C once A was taken");
    let ids: Vec<String> = store
        .parked(0)
        .unwrap()
        .iter()
        .map(|(_, e)| e["orderid"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(ids, ["B", "C"]);
    // Events sent to an instance are never refused.
    h.start_instance("w", None, Some("d".into()), json!({"order": "D"}))
        .await
        .unwrap();
    let d = h.deliver(go("D")).await.unwrap();
    assert_eq!(d.reached, ["d"]);
    h.shutdown().await;

    // The bytes limit: room for one event of this size, not two.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(crate::store::SqliteStore::open(&dir.path().join("s.db")).expect("open"));
    let size = crate::store::parked_size(&go("A"));
    let limits = HostLimits {
        max_parked_bytes: size + size / 2,
        ..HostLimits::default()
    };
    let h = DurableHost::start(store.clone(), Arc::new(Echo), limits).expect("starts");
    h.define(waiter()).await.unwrap();
    assert!(h.deliver(go("A")).await.unwrap().parked);
    match h.deliver(go("B")).await {
        Err(HostError::ParkedLimit(why)) => assert!(why.contains("--max-parked-bytes"), "{why}"),
        other => panic!("the second event is refused, not {other:?}"),
    }
    assert_eq!(store.parked_totals(0).unwrap(), (1, size));
    h.shutdown().await;
    // After a restart the limit counts what the file holds.
    let h = DurableHost::start(store.clone(), Arc::new(Echo), limits).expect("starts again");
    assert!(matches!(h.deliver(go("B")).await, Err(HostError::ParkedLimit(_))));
    h.shutdown().await;
}

#[tokio::test]
async fn events_reach_correlated_instances_and_early_events_wait_in_the_window() {
    let (h, _) = start(HostLimits::default());
    h.define(waiter()).await.unwrap();
    // Sent before any instance waits: parked.
    let d = h.deliver(go("B")).await.unwrap();
    assert_eq!(
        d,
        Delivery {
            reached: vec![],
            parked: true,
            cancel_requested: None,
        }
    );
    h.start_instance("w", None, Some("a".into()), json!({"order": "A"}))
        .await
        .unwrap();
    h.start_instance("w", None, Some("b".into()), json!({"order": "B"}))
        .await
        .unwrap();
    assert_eq!(
        settle(&h, "b").await.status,
        Status::Completed,
        "the parked event reached b"
    );
    let d = h.deliver(go("A")).await.unwrap();
    assert_eq!(d.reached, vec!["a".to_string()], "correlation picks a only");
    let a = settle(&h, "a").await;
    assert_eq!(a.status, Status::Completed);
    assert_eq!(sm4c_runtime::json::from_val(&a.data.0)["got"], "A");
}

#[tokio::test]
async fn journal_limit_fails_the_instance_with_a_clear_error() {
    let (h, _) = start(HostLimits {
        max_journal: 20,
        ..HostLimits::default()
    });
    h.define(json!({"id": "loop", "name": "loop", "version": "1", "states": [{"name": "A", "start": true,
        "transitions": [{"condition": "${ .n < 100 }", "action": {"type": "delay", "timeout": "1ms"}, "resultHandler": "${ .n += 1 }"},
                        {"nextState": "B"}]}, {"name": "B"}]}))
        .await
        .unwrap();
    h.start_instance("loop", None, Some("l".into()), json!({"n": 0}))
        .await
        .unwrap();
    let s = settle(&h, "l").await;
    assert_eq!(s.status, Status::Failed);
    let e = s.error.unwrap();
    assert_eq!(e.kind, "limitExceeded");
    assert!(e.message.contains("20 entries"), "{}", e.message);
}

#[tokio::test]
async fn subflows_are_linked_in_both_journals_and_calls_carry_their_op() {
    let (h, store) = start(HostLimits::default());
    h.define(json!({"id": "child", "name": "c", "version": "1",
        "functions": [{"name": "f", "operation": "x#f"}],
        "states": [{"name": "C", "start": true, "enterAction": {"type": "invokeFunction", "functionName": "f",
            "arguments": {"n": "${ .n }"}, "waitForCompletion": true}, "enterResultHandler": "${ .r = $value }"}]}))
        .await
        .unwrap();
    h.define(json!({"id": "parent", "name": "p", "version": "1", "states": [{"name": "P", "start": true,
        "enterAction": {"type": "invokeSubflow", "subflowName": "child", "arguments": {"n": 7}, "waitForCompletion": true},
        "enterResultHandler": "${ .child = $value }"}]}))
        .await
        .unwrap();
    let (id, created) = h
        .start_instance("parent", None, Some("p".into()), json!({}))
        .await
        .unwrap();
    assert!(created);
    let p = settle(&h, &id).await;
    assert_eq!(p.status, Status::Completed);
    let data = sm4c_runtime::json::from_val(&p.data.0);
    assert_eq!(data["child"]["r"], json!({"echo": {"n": 7}, "op": "1.enter"}));
    let child = store.instance("p/1.enter").unwrap().expect("child stored");
    assert_eq!(
        child.parent,
        Some(ParentLink::from(("p".to_string(), "1.enter".to_string(), true)))
    );
    let parent_journal = store.history("p", 0, 1000).unwrap();
    assert!(parent_journal
        .iter()
        .any(|(_, e)| matches!(e, Entry::Effect(Effect::StartSubflow { definition, .. }) if definition == "child")));
    // The same id again starts nothing new.
    let (_, created) = h
        .start_instance("parent", None, Some("p".into()), json!({}))
        .await
        .unwrap();
    assert!(!created);
}

#[tokio::test]
async fn definitions_are_versioned_and_conflicts_refused() {
    let (h, _) = start(HostLimits::default());
    let mut d = waiter();
    assert!(h.define(d.clone()).await.unwrap().1);
    assert!(!h.define(d.clone()).await.unwrap().1, "same content again is not new");
    d["states"][0]["name"] = json!("Waiting");
    d["states"][0]["start"] = json!(true);
    assert!(matches!(h.define(d.clone()).await, Err(HostError::Conflict { .. })));
    d["version"] = json!("2");
    assert!(h.define(d).await.unwrap().1);
    let (id, _) = h
        .start_instance("w", Some("1"), None, json!({"order": "X"}))
        .await
        .unwrap();
    assert_eq!(h.store().instance(&id).unwrap().unwrap().snapshot.version, "1");
    let (id2, _) = h.start_instance("w", None, None, json!({"order": "X"})).await.unwrap();
    assert_eq!(
        h.store().instance(&id2).unwrap().unwrap().snapshot.version,
        "2",
        "newest by default"
    );
}
