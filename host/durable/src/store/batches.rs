//! Batch operations' rows in the SQLite store ([`BatchStore`]): `batches` (the request, its phase
//! and matching cursor) and `batch_items` (each matched instance, in order, with its outcome once
//! it has one). Each method is one transaction.

use super::{SqliteStore, StoreError};
use rusqlite::{params, OptionalExtension};
use serde_json::Value;
use sm4c_host::batch::{BatchRow, BatchStore, Counts, Outcome, Phase};
use sm4c_host::service::HostError;

fn err(e: rusqlite::Error) -> HostError {
    StoreError::from(e).into()
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String, String, i64, i64, Option<i64>)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
}

/// A stored batch, or why it cannot be read back.
fn read(
    (id, spec, phase, cursor, created, ended): (String, String, String, i64, i64, Option<i64>),
) -> Result<BatchRow, HostError> {
    let spec: Value = serde_json::from_str(&spec).map_err(|e| {
        HostError::Store(StoreError::Corrupt(format!("batch {id:?}: its request does not read: {e}")).to_string())
    })?;
    let phase = Phase::parse(&phase).ok_or_else(|| {
        HostError::Store(StoreError::Corrupt(format!("batch {id:?}: unknown phase {phase:?}")).to_string())
    })?;
    Ok(BatchRow {
        id,
        spec,
        phase,
        cursor,
        created,
        ended,
    })
}

const COLUMNS: &str = "id, spec, phase, cursor, created, ended";

impl BatchStore for SqliteStore {
    fn create_batch(&self, id: &str, spec: &Value, created: i64) -> Result<(), HostError> {
        self.conn()
            .execute(
                "INSERT INTO batches (id, spec, phase, cursor, created) VALUES (?1, ?2, 'matching', 0, ?3)",
                params![id, spec.to_string(), created],
            )
            .map_err(err)?;
        Ok(())
    }

    fn batches(&self) -> Result<Vec<BatchRow>, HostError> {
        let conn = self.conn();
        let mut st = conn
            .prepare(&format!("SELECT {COLUMNS} FROM batches ORDER BY seq"))
            .map_err(err)?;
        let rows: Vec<_> = st
            .query_map([], row)
            .map_err(err)?
            .collect::<Result<_, _>>()
            .map_err(err)?;
        rows.into_iter().map(read).collect()
    }

    fn batch(&self, id: &str) -> Result<Option<BatchRow>, HostError> {
        let r = self
            .conn()
            .query_row(&format!("SELECT {COLUMNS} FROM batches WHERE id = ?1"), [id], row)
            .optional()
            .map_err(err)?;
        r.map(read).transpose()
    }

    fn add_matched(&self, id: &str, instances: &[String], cursor: i64, last: bool) -> Result<(), HostError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(err)?;
        {
            let mut ins = tx
                .prepare_cached("INSERT OR IGNORE INTO batch_items (batch, instance) VALUES (?1, ?2)")
                .map_err(err)?;
            for i in instances {
                ins.execute(params![id, i]).map_err(err)?;
            }
        }
        // A batch cancelled meanwhile keeps its phase.
        let phase = if last { "applying" } else { "matching" };
        tx.execute(
            "UPDATE batches SET cursor = ?2, phase = ?3 WHERE id = ?1 AND phase = 'matching'",
            params![id, cursor, phase],
        )
        .map_err(err)?;
        tx.commit().map_err(err)
    }

    fn pending(&self, id: &str, limit: usize) -> Result<Vec<(String, bool)>, HostError> {
        let conn = self.conn();
        let mut st = conn
            .prepare_cached(
                "SELECT instance, started FROM batch_items WHERE batch = ?1 AND outcome IS NULL ORDER BY seq LIMIT ?2",
            )
            .map_err(err)?;
        let r = st
            .query_map(params![id, limit as i64], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? != 0)))
            .map_err(err)?
            .collect::<Result<_, _>>()
            .map_err(err);
        r
    }

    fn start_group(&self, id: &str, instances: &[String]) -> Result<(), HostError> {
        if instances.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(err)?;
        {
            let mut up = tx
                .prepare_cached("UPDATE batch_items SET started = 1 WHERE batch = ?1 AND instance = ?2")
                .map_err(err)?;
            for i in instances {
                up.execute(params![id, i]).map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    fn record(&self, id: &str, outcomes: &[(String, Outcome)]) -> Result<(), HostError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(err)?;
        {
            let mut up = tx
                .prepare_cached(
                    "UPDATE batch_items SET outcome = ?3, reason = ?4 WHERE batch = ?1 AND instance = ?2 AND outcome IS NULL",
                )
                .map_err(err)?;
            for (i, o) in outcomes {
                let (outcome, reason) = match o {
                    Outcome::Done(note) => ("done", note.as_deref()),
                    Outcome::Failed(why) => ("failed", Some(why.as_str())),
                };
                up.execute(params![id, i, outcome, reason]).map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    fn set_phase(&self, id: &str, phase: Phase, ended: Option<i64>) -> Result<(), HostError> {
        // Only a running batch changes phase: a cancel that comes as it completes does not undo it.
        self.conn()
            .execute(
                "UPDATE batches SET phase = ?2, ended = ?3 WHERE id = ?1 AND phase IN ('matching', 'applying')",
                params![id, phase.as_str(), ended],
            )
            .map_err(err)?;
        Ok(())
    }

    fn counts(&self, id: &str) -> Result<Counts, HostError> {
        let conn = self.conn();
        let mut st = conn
            .prepare_cached("SELECT outcome, count(*) FROM batch_items WHERE batch = ?1 GROUP BY outcome")
            .map_err(err)?;
        let mut c = Counts::default();
        let rows = st
            .query_map([id], |r| Ok((r.get::<_, Option<String>>(0)?, r.get::<_, i64>(1)?)))
            .map_err(err)?;
        for r in rows {
            let (outcome, n) = r.map_err(err)?;
            let n = n as u64;
            c.matched += n;
            match outcome.as_deref() {
                Some("done") => c.done += n,
                Some("failed") => c.failed += n,
                _ => {}
            }
        }
        Ok(c)
    }

    fn failures(&self, id: &str, limit: usize) -> Result<Vec<(String, String)>, HostError> {
        let conn = self.conn();
        let mut st = conn
            .prepare_cached(
                "SELECT instance, coalesce(reason, '') FROM batch_items WHERE batch = ?1 AND outcome = 'failed' ORDER BY seq LIMIT ?2",
            )
            .map_err(err)?;
        let r = st
            .query_map(params![id, limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(err)?
            .collect::<Result<_, _>>()
            .map_err(err);
        r
    }
}

#[cfg(test)]
mod tests {
    //! The batch runner ([`sm4c_host::batch::Batches`]) over a real durable host on a real SQLite
    //! file: what it applies, and what it finds applied when it resumes.
    use crate::host::DurableHost;
    use crate::store::SqliteStore;
    use serde_json::{json, Value};
    use sm4c_host::batch::{BatchStore, Batches};
    use sm4c_host::service::Backend;
    use sm4c_host::{BoxFuture, FunctionCall, Functions};
    use sm4c_runtime::{Entry, ErrorInfo, Input, Limits};
    use std::sync::Arc;
    use std::time::Duration;

    struct NoCalls;
    impl Functions for NoCalls {
        fn invoke(&self, _call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
            Box::pin(async { Ok(Value::Null) })
        }
    }

    fn waiter() -> Value {
        json!({"id": "w", "name": "w", "version": "1",
            "events": [{"name": "poke", "type": "poke", "source": "t"}],
            "states": [{"name": "Wait", "start": true, "transitions": [
                {"nextState": "Second", "eventGroups": [{"events": ["poke"], "resultHandler": "${ .got = ($value | .data) }"}]}]},
                // Waits again: an event sent twice would be taken twice.
                {"name": "Second", "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["poke"]}]}]},
                {"name": "Done"}]})
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        host: DurableHost,
        store: Arc<SqliteStore>,
        batches: Arc<Batches>,
    }

    async fn fixture(instances: usize) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(SqliteStore::open(&dir.path().join("b.db")).expect("open"));
        let host = DurableHost::start(store.clone(), Arc::new(NoCalls), crate::HostLimits::default()).expect("starts");
        host.define(waiter()).await.expect("defines");
        for i in 0..instances {
            host.start_instance("w", None, Some(format!("w-{i}")), json!({"n": i}))
                .await
                .expect("starts");
        }
        let batches = Batches::new(Arc::new(host.clone()), store.clone(), 100_000, Limits::default());
        Fixture {
            _dir: dir,
            host,
            store,
            batches,
        }
    }

    async fn finished(b: &Batches, id: &str) -> Value {
        for _ in 0..1000 {
            let v = b.get(id).expect("the batch");
            if v["running"] == json!(false) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("batch {id} did not end: {}", b.get(id).expect("the batch"));
    }

    /// The inputs of one kind in an instance's journal.
    async fn inputs(h: &DurableHost, id: &str, kind: &str) -> Vec<Input> {
        Backend::history(h, id, 0, 10_000)
            .await
            .expect("history")
            .into_iter()
            .filter_map(|(_, e)| match e {
                Entry::Input(t) => Some(t.input),
                _ => None,
            })
            .filter(|i| {
                matches!(
                    (i, kind),
                    (Input::Cancel { .. }, "cancel") | (Input::Event { .. }, "event")
                )
            })
            .collect()
    }

    fn status(h: &DurableHost, id: &str) -> String {
        Backend::instance(h, id)
            .unwrap()
            .unwrap()
            .snapshot
            .status
            .as_str()
            .to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancel_batch_cancels_exactly_the_instances_its_filter_matches() {
        let f = fixture(150).await;
        let (started, v) = f
            .batches
            .submit(json!({"operation": "cancel", "where": {"definition": "w", "jq": ".n % 2 == 0"}}))
            .await
            .expect("submitted");
        assert!(started, "{v}");
        let id = v["id"].as_str().expect("id").to_string();
        let v = finished(&f.batches, &id).await;
        assert_eq!(
            (v["matched"].as_u64(), v["done"].as_u64(), v["failedCount"].as_u64()),
            (Some(75), Some(75), Some(0)),
            "{v}"
        );
        assert_eq!(v["phase"], "completed", "{v}");
        for i in 0..150 {
            let id = format!("w-{i}");
            let want = if i % 2 == 0 { "cancelled" } else { "waiting" };
            assert_eq!(status(&f.host, &id), want, "{id}");
            assert_eq!(
                inputs(&f.host, &id, "cancel").await.len(),
                usize::from(i % 2 == 0),
                "{id}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resumed_batch_does_not_apply_again_what_it_applied_before_the_restart() {
        let f = fixture(10).await;
        // A batch as a server left it when killed: matched, its first group started, with the
        // operation applied to w-0 and w-1 but no outcome recorded.
        f.store
            .create_batch("b1", &json!({"operation": "cancel", "where": {"definition": "w"}}), 0)
            .unwrap();
        let ids: Vec<String> = (0..10).map(|i| format!("w-{i}")).collect();
        f.store.add_matched("b1", &ids, 10, true).unwrap();
        f.store.start_group("b1", &ids).unwrap();
        f.host.cancel("w-0").await.unwrap();
        f.host.cancel("w-1").await.unwrap();
        assert_eq!(f.batches.resume().unwrap(), 1);
        let v = finished(&f.batches, "b1").await;
        assert_eq!(
            (v["matched"].as_u64(), v["done"].as_u64(), v["failedCount"].as_u64()),
            (Some(10), Some(10), Some(0)),
            "{v}"
        );
        for i in &ids {
            assert_eq!(status(&f.host, i), "cancelled", "{i}");
            assert_eq!(inputs(&f.host, i, "cancel").await.len(), 1, "{i} is cancelled once");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_send_batch_addresses_each_event_and_a_resumed_one_does_not_send_it_twice() {
        let f = fixture(6).await;
        let spec = json!({"operation": "send", "where": {"definition": "w"},
            "event": {"type": "poke", "source": "t", "data": "hi"}});
        f.store.create_batch("b2", &spec, 0).unwrap();
        let ids: Vec<String> = (0..6).map(|i| format!("w-{i}")).collect();
        f.store.add_matched("b2", &ids, 6, true).unwrap();
        f.store.start_group("b2", &ids).unwrap();
        // w-0 got its event before the "restart".
        let e = json!({"specversion": "1.0", "id": "b2/w-0", "type": "poke", "source": "t", "data": "hi", "sm4cinstanceid": "w-0"});
        f.host.deliver(e).await.unwrap();
        assert_eq!(f.batches.resume().unwrap(), 1);
        let v = finished(&f.batches, "b2").await;
        assert_eq!(
            (v["done"].as_u64(), v["failedCount"].as_u64()),
            (Some(6), Some(0)),
            "{v}"
        );
        for i in &ids {
            let events = inputs(&f.host, i, "event").await;
            assert_eq!(events.len(), 1, "{i} got one event: {events:?}");
            let Input::Event { event } = &events[0] else {
                unreachable!()
            };
            assert_eq!(event["id"], format!("b2/{i}"), "{event}");
            assert_eq!(
                Backend::instance(&f.host, i)
                    .unwrap()
                    .unwrap()
                    .snapshot
                    .state_name
                    .as_deref(),
                Some("Second")
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_operation_the_host_refuses_is_the_instance_failed_outcome_with_why() {
        let f = fixture(3).await;
        f.host.cancel("w-2").await.unwrap();
        // None of them failed, so the host refuses each redrive; the batch records why, each.
        let (_, v) = f
            .batches
            .submit(json!({"operation": "redrive", "where": {"definition": "w"}}))
            .await
            .unwrap();
        let v = finished(&f.batches, v["id"].as_str().unwrap()).await;
        assert_eq!(
            (v["matched"].as_u64(), v["done"].as_u64(), v["failedCount"].as_u64()),
            (Some(3), Some(0), Some(3)),
            "{v}"
        );
        let failed = v["failed"].as_array().unwrap();
        assert_eq!(failed[0]["instance"], "w-0", "{v}");
        assert!(
            failed[0]["reason"]
                .as_str()
                .unwrap()
                .contains("only a failed or timed-out instance can be redriven"),
            "{v}"
        );
        // A cancel batch over an instance that ended: failed, saying how it ended.
        let (_, v) = f
            .batches
            .submit(json!({"operation": "cancel", "where": {}}))
            .await
            .unwrap();
        let v = finished(&f.batches, v["id"].as_str().unwrap()).await;
        assert_eq!(
            (v["done"].as_u64(), v["failedCount"].as_u64()),
            (Some(2), Some(1)),
            "{v}"
        );
        assert_eq!(v["failed"][0]["instance"], "w-2");
        assert_eq!(v["failed"][0]["reason"], "it had already ended (cancelled)", "{v}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dry_run_lists_and_changes_nothing_and_a_stopped_batch_leaves_the_rest() {
        let f = fixture(20).await;
        let (started, v) = f
            .batches
            .submit(json!({"operation": "cancel", "where": {"state": "Wait", "jq": ".n < 5"}, "dryRun": true}))
            .await
            .unwrap();
        assert!(!started);
        assert_eq!(v["matched"], 5, "{v}");
        let mut listed: Vec<String> = v["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap().to_string())
            .collect();
        listed.sort();
        assert_eq!(listed, ["w-0", "w-1", "w-2", "w-3", "w-4"]);
        assert!(
            f.batches.list().unwrap()["batches"].as_array().unwrap().is_empty(),
            "a dry run is not recorded"
        );
        assert!((0..20).all(|i| status(&f.host, &format!("w-{i}")) == "waiting"));
        // At 2 a second, the batch is stopped long before it reaches the end.
        let (_, v) = f
            .batches
            .submit(json!({"operation": "cancel", "where": {}, "rate": 2}))
            .await
            .unwrap();
        let id = v["id"].as_str().unwrap().to_string();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let v = f.batches.cancel(&id).await.unwrap();
        assert_eq!(v["phase"], "cancelled", "{v}");
        assert_eq!(v["running"], false);
        let touched = (0..20)
            .filter(|i| status(&f.host, &format!("w-{i}")) == "cancelled")
            .count();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let later = (0..20)
            .filter(|i| status(&f.host, &format!("w-{i}")) == "cancelled")
            .count();
        assert_eq!(touched, later, "nothing is cancelled once the batch is stopped");
        assert!(later < 20, "{later}");
        assert!(matches!(
            f.batches.get("nope"),
            Err(sm4c_host::service::HostError::UnknownBatch(_))
        ));
    }
}
