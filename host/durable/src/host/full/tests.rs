//! A store whose disk fills and empties on command, against the host's pause.

use crate::host::{DurableHost, HostLimits};
use crate::store::{Batch, MemoryStore, Store, StoreError, Stored, Summary};
use serde_json::{json, Value};
use sm4c_host::service::HostError;
use sm4c_host::{BoxFuture, FunctionCall, Functions};
use sm4c_runtime::{Effect, Entry, ErrorInfo, Millis, Status};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A [`MemoryStore`] that refuses every write with [`StoreError::Full`] while `full` is set.
#[derive(Default)]
struct Filling {
    inner: MemoryStore,
    full: AtomicBool,
}

impl Filling {
    fn check(&self) -> Result<(), StoreError> {
        if self.full.load(Ordering::SeqCst) {
            return Err(StoreError::Full("database or disk is full".into()));
        }
        Ok(())
    }
}

impl Store for Filling {
    fn put_definition(&self, id: &str, version: &str, doc: &Value) -> Result<bool, StoreError> {
        self.check()?;
        self.inner.put_definition(id, version, doc)
    }
    fn definitions(&self) -> Result<Vec<Value>, StoreError> {
        self.inner.definitions()
    }
    fn instance(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        self.inner.instance(id)
    }
    fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        self.check()?;
        self.inner.commit(batch)
    }
    fn list(&self, s: Option<&str>, d: Option<&str>, after: i64, limit: usize) -> Result<Vec<Summary>, StoreError> {
        self.inner.list(s, d, after, limit)
    }
    fn history(&self, id: &str, after: i64, limit: usize) -> Result<Vec<(i64, Entry)>, StoreError> {
        self.inner.history(id, after, limit)
    }
    fn timers(&self) -> Result<Vec<(String, String, Millis)>, StoreError> {
        self.inner.timers()
    }
    fn calls(&self) -> Result<Vec<(String, Effect)>, StoreError> {
        self.inner.calls()
    }
    fn calls_of(&self, instance: &str) -> Result<Vec<Effect>, StoreError> {
        self.inner.calls_of(instance)
    }
    fn origin(&self, instance: &str) -> Result<Option<String>, StoreError> {
        self.inner.origin(instance)
    }
    fn active(&self, definitions: &[(String, String)]) -> Result<Vec<String>, StoreError> {
        self.inner.active(definitions)
    }
    fn outbox(&self, after: i64, limit: usize) -> Result<Vec<crate::store::SentRow>, StoreError> {
        self.inner.outbox(after, limit)
    }
    fn parked(&self, now: Millis) -> Result<Vec<(i64, Value)>, StoreError> {
        self.inner.parked(now)
    }
    fn schedules(&self) -> Result<Vec<crate::store::ScheduleRow>, StoreError> {
        self.inner.schedules()
    }
}

/// Answers each call once the gate opens, and counts the calls made per operation.
#[derive(Default)]
struct Gate {
    open: tokio::sync::Notify,
    opened: AtomicBool,
    calls: Mutex<HashMap<String, usize>>,
}

struct Gated(Arc<Gate>);

impl Functions for Gated {
    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
        let gate = self.0.clone();
        *gate
            .calls
            .lock()
            .unwrap()
            .entry(format!("{}/{}", call.instance, call.op))
            .or_default() += 1;
        Box::pin(async move {
            while !gate.opened.load(Ordering::SeqCst) {
                let notified = gate.open.notified();
                if gate.opened.load(Ordering::SeqCst) {
                    break;
                }
                notified.await;
            }
            Ok(json!({"n": call.arguments["n"]}))
        })
    }
}

fn caller() -> Value {
    json!({"id": "c", "name": "c", "version": "1",
        "functions": [{"name": "f", "operation": "http://example.org/f.json#f"}],
        "states": [{"name": "Call", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "f", "waitForCompletion": true,
                            "arguments": {"n": "${ .n }"}},
            "enterResultHandler": "${ .r = $value }"}]})
}

async fn completed(h: &DurableHost, id: &str) -> Value {
    for _ in 0..500 {
        if let Some(s) = h.store().instance(id).unwrap() {
            if s.snapshot.status == Status::Completed {
                return serde_json::to_value(&s.snapshot.data).unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{id} did not complete: {:?}",
        h.store().instance(id).unwrap().map(|s| s.snapshot.status)
    );
}

#[tokio::test]
async fn a_full_disk_refuses_requests_keeps_call_results_and_passes_when_space_returns() {
    let store = Arc::new(Filling::default());
    let gate = Arc::new(Gate::default());
    let h = DurableHost::start(store.clone(), Arc::new(Gated(gate.clone())), HostLimits::default()).unwrap();
    h.define(caller()).await.unwrap();
    let (id, created) = h
        .start_instance("c", None, Some("a".into()), json!({"n": 1}))
        .await
        .unwrap();
    assert_eq!((id.as_str(), created), ("a", true));

    store.full.store(true, Ordering::SeqCst);
    let refused = h.start_instance("c", None, Some("b".into()), json!({"n": 2})).await;
    assert!(matches!(refused, Err(HostError::StorageFull(_))), "{refused:?}");
    let message = refused.unwrap_err().to_string();
    assert!(
        message.contains("disk is full") && message.contains("not written"),
        "{message}"
    );
    // The result of a's call comes while nothing can be written: it is kept, not lost.
    gate.opened.store(true, Ordering::SeqCst);
    gate.open.notify_waiters();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let event = json!({"specversion": "1.0", "id": "e", "source": "t", "type": "nobody"});
    assert!(matches!(h.deliver(event).await, Err(HostError::StorageFull(_))));
    assert!(matches!(h.cancel("a").await, Err(HostError::StorageFull(_))));
    let token = sm4c_host::tasks::token("a", "1.enter");
    let answer = h.answer(&token, sm4c_host::tasks::Answer::Complete(json!(1))).await;
    assert!(matches!(answer, Err(HostError::StorageFull(_))), "{answer:?}");
    assert!(matches!(
        h.define(json!({"id": "d", "name": "d", "version": "1", "states": [{"name": "S", "start": true}]}))
            .await,
        Err(HostError::StorageFull(_))
    ));
    // Through a pause or two, each ending in a refused write.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let a = h.store().instance("a").unwrap().unwrap().snapshot.status;
    assert!(!a.is_final(), "a's result could not be written yet: {a:?}");
    assert!(
        h.store().instance("b").unwrap().is_none(),
        "a refused start is not written"
    );

    store.full.store(false, Ordering::SeqCst);
    let mut tries = 0;
    loop {
        match h.start_instance("c", None, Some("b".into()), json!({"n": 2})).await {
            Ok(_) => break,
            Err(HostError::StorageFull(_)) if tries < 100 => tries += 1,
            other => panic!("a start once space returned: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(completed(&h, "a").await["r"], json!({"n": 1}));
    assert_eq!(completed(&h, "b").await["r"], json!({"n": 2}));
    let calls = gate.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls.values().all(|n| *n == 1),
        "a call whose result came during the pause is not made again: {calls:?}"
    );
}

fn worker_task() -> Value {
    json!({"id": "t", "name": "t", "version": "1",
        "functions": [{"name": "w", "type": "worker", "operation": "packing"}],
        "states": [{"name": "Pack", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "w", "waitForCompletion": true,
                            "arguments": {"n": "${ .n }"}},
            "enterResultHandler": "${ .r = $value }"}]})
}

#[tokio::test]
async fn a_worker_polling_during_the_pause_gets_its_task_once_space_returns_and_only_once() {
    let store = Arc::new(Filling::default());
    let h = DurableHost::start(store.clone(), Arc::new(Gated(Arc::default())), HostLimits::default()).unwrap();
    h.define(worker_task()).await.unwrap();
    h.start_instance("t", None, Some("t1".into()), json!({"n": 7}))
        .await
        .unwrap();

    store.full.store(true, Ordering::SeqCst);
    let refused = h.start_instance("t", None, Some("t2".into()), json!({"n": 8})).await;
    assert!(matches!(refused, Err(HostError::StorageFull(_))), "{refused:?}");
    // The poll waits for the pause to end: handing the task out writes its start.
    let poller = h.clone();
    let poll = tokio::spawn(async move { poller.poll("packing", Some("w1".into()), Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !poll.is_finished(),
        "no task is handed out while its start cannot be written"
    );
    store.full.store(false, Ordering::SeqCst);

    let task = poll.await.unwrap().unwrap().expect("the task, once space returns");
    assert_eq!(task["instanceId"], "t1", "{task}");
    let again = h
        .poll("packing", Some("w2".into()), Duration::from_millis(300))
        .await
        .unwrap();
    assert!(again.is_none(), "the task is handed out once: {again:?}");
    let token = task["token"].as_str().expect("token");
    h.answer(token, sm4c_host::tasks::Answer::Complete(json!({"packed": 7})))
        .await
        .unwrap();
    assert_eq!(completed(&h, "t1").await["r"], json!({"packed": 7}));
}
