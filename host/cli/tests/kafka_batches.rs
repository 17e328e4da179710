//! Batch operations (`/batches`) in Kafka mode against a real broker (tansu), with `sm4c serve
//! --kafka` workers as child processes: each commands partition's owner applies a batch to its own
//! instances, the answers merge every worker's shares, and a worker SIGKILLed in the middle of a
//! batch leaves no instance acted on twice or skipped. The SQLite server's batches are tested in
//! `batches.rs`; the answers here have the same shape.

#[path = "support/kafka.rs"]
mod kafka_support;
use kafka_support::*;

/// A definition whose instances wait for an event that never comes.
fn waiter() -> Value {
    json!({"id": "waiter", "name": "Waiter", "version": "1",
    "events": [{"name": "poke", "type": "com.example.poke", "source": "test"}],
    "states": [
        {"name": "Wait", "start": true, "transitions": [{"nextState": "Done",
            "eventGroups": [{"events": ["poke"]}]}]},
        {"name": "Done"}
    ]})
}

fn define(w: &Worker, others: &[&Worker], doc: Value) {
    let id = doc["id"].as_str().expect("an id").to_string();
    let (st, v) = w.post("/definitions", doc);
    assert_eq!(st, 201, "{v}");
    for o in others {
        wait_until(
            "the other worker to read the definition",
            30,
            || o.get(&format!("/definitions/{id}"))["id"] == json!(id),
            &[w, o],
        );
    }
}

/// Starts instances `<prefix>-0` .. `<prefix>-{n-1}` of `definition` through `w`, four requests
/// at a time.
fn start_many(w: &Worker, definition: &str, prefix: &str, n: usize) {
    std::thread::scope(|s| {
        for k in 0..4 {
            s.spawn(move || {
                for i in (k..n).step_by(4) {
                    let id = format!("{prefix}-{i}");
                    let (st, v) = w.post(
                        "/instances",
                        json!({"definition": definition, "id": id, "input": {"n": i}}),
                    );
                    assert_eq!(st, 201, "{id}: {v}");
                }
            });
        }
    });
}

/// `GET path` through `w`: the status and the answer (a worker whose peer is gone answers 503
/// until the group has rebalanced).
fn get(w: &Worker, path: &str) -> (u16, Value) {
    let r = http().get(format!("{}{path}", w.base)).send().expect("GET");
    let st = r.status().as_u16();
    (st, r.json().unwrap_or(Value::Null))
}

/// Batch `id` once it has ended (asked again while a worker answers 503), within `secs`.
fn ended_batch(w: &Worker, id: &str, secs: u64, logs: &[&Worker]) -> Value {
    let mut last = Value::Null;
    wait_until(
        "the batch to end",
        secs,
        || {
            let (st, v) = get(w, &format!("/batches/{id}"));
            let over = st == 200 && v["running"] == json!(false);
            last = v;
            over
        },
        logs,
    );
    last
}

/// How many `cancel` inputs instance `id`'s journal holds.
fn cancels(w: &Worker, id: &str) -> usize {
    let h = settled_get(w, &format!("/instances/{id}/history"));
    h["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("the history of {id}: {h}"))
        .iter()
        .filter(|e| e["input"] == "cancel")
        .count()
}

/// Two workers, `N` waiting instances over four partitions, a batch cancel of them all
/// (optionally with the worker that holds half of the partitions SIGKILLed mid-batch), and `LATE`
/// instances started once the batch is posted, which it leaves alone.
fn batch_cancel(prefix: &str, kill: bool) {
    const N: usize = 1_000;
    const LATE: usize = 20;
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    // 200 a second over the group: the batch takes about five seconds, long enough to be cut.
    let args = worker_args(&broker, prefix, 4, &["--batch-rate", "200"]);
    let mut w1 = Worker::start(dir.path(), "w1", &args);
    let w2 = Worker::start(dir.path(), "w2", &args);
    wait_owned(&[&w1, &w2], 4);
    define(&w1, &[&w2], waiter());
    start_many(&w1, "waiter", "w", N);

    let (st, v) = w2.post(
        "/batches",
        json!({"operation": "cancel", "where": {"definition": "waiter", "status": "waiting"}}),
    );
    assert_eq!(st, 202, "{v}");
    let id = v["id"].as_str().expect("a batch id").to_string();
    assert!(id.starts_with("batch-"), "{id}");
    // Answered once every partition has its share: all matched instances are counted.
    assert_eq!(v["matched"], json!(N), "{v}");
    assert_eq!(v["operation"], "cancel", "{v}");
    assert_eq!(v["partitions"].as_array().map(Vec::len), Some(4), "{v}");
    start_many(&w1, "waiter", "late", LATE);

    let live = if kill {
        // Cut once some, not all, are done.
        wait_until(
            "the batch to be part-way",
            60,
            || {
                let v = w2.get(&format!("/batches/{id}"));
                v["done"].as_u64().is_some_and(|d| d > 0 && d < N as u64 / 2)
            },
            &[&w1, &w2],
        );
        w1.kill9();
        wait_owned(&[&w2], 4);
        &w2
    } else {
        &w1
    };
    let v = ended_batch(live, &id, 120, &[&w1, &w2]);
    assert_eq!(
        (
            v["phase"].as_str(),
            v["matched"].as_u64(),
            v["done"].as_u64(),
            v["failedCount"].as_u64()
        ),
        (Some("completed"), Some(N as u64), Some(N as u64), Some(0)),
        "{v}"
    );
    assert_eq!(v["pending"], 0, "{v}");
    assert!(v["endedAt"].is_string(), "{v}");
    for i in 0..N {
        let inst = format!("w-{i}");
        let s = settled_get(live, &format!("/instances/{inst}"));
        assert_eq!(s["status"], "cancelled", "{inst}: {s}");
        assert_eq!(cancels(live, &inst), 1, "{inst} is cancelled exactly once");
    }
    for i in 0..LATE {
        let inst = format!("late-{i}");
        let s = settled_get(live, &format!("/instances/{inst}"));
        assert_eq!(s["status"], "waiting", "started after the batch: {inst}: {s}");
    }
    // The listing has it, as it has ended.
    let list = live.get("/batches");
    let mine: Vec<&Value> = list["batches"]
        .as_array()
        .expect("batches")
        .iter()
        .filter(|b| b["id"] == json!(id))
        .collect();
    assert_eq!(mine.len(), 1, "{list}");
    assert_eq!(
        (mine[0]["phase"].as_str(), mine[0]["done"].as_u64()),
        (Some("completed"), Some(N as u64)),
        "{list}"
    );
}

#[test]
fn a_batch_cancel_on_two_workers_cancels_each_matched_instance_once_and_leaves_later_ones() {
    batch_cancel("bc", false);
}

#[test]
fn a_batch_cancel_cut_by_a_sigkill_finishes_on_the_survivor_with_each_instance_cancelled_once() {
    batch_cancel("bk", true);
}

/// Refusals and answers as in SQLite mode, through either worker: a bad body names each wrong
/// field, an unknown batch is 404, a dry run counts every worker's instances, and a batch stopped
/// while it runs stays stopped.
#[test]
fn batch_requests_are_checked_dry_run_and_stopped_through_either_worker() {
    const N: usize = 200;
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let args = worker_args(&broker, "bq", 4, &[]);
    let w1 = Worker::start(dir.path(), "w1", &args);
    let w2 = Worker::start(dir.path(), "w2", &args);
    wait_owned(&[&w1, &w2], 4);
    define(&w1, &[&w2], waiter());
    for w in [&w1, &w2] {
        let (st, v) = w.post(
            "/batches",
            json!({"operation": "stop", "where": {"defintion": "x", "status": "done"}, "extra": 1}),
        );
        assert_eq!((st, v["error"].as_str()), (400, Some("invalidBatch")), "{v}");
        let pointers: Vec<&str> = v["details"]
            .as_array()
            .expect("details")
            .iter()
            .filter_map(|d| d["pointer"].as_str())
            .collect();
        assert_eq!(
            pointers,
            ["/extra", "/where/defintion", "/where/status", "/operation"],
            "{v}"
        );
        let (st, v) = w.post(
            "/batches",
            json!({"operation": "cancel", "where": {"definition": "nope"}}),
        );
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["details"][0]["pointer"], "/where/definition", "{v}");
        let (st, v) = get(w, "/batches/batch-unknown");
        assert_eq!((st, v["error"].as_str()), (404, Some("unknownBatch")), "{v}");
        let (st, v) = w.post("/batches/batch-unknown/cancel", json!({}));
        assert_eq!((st, v["error"].as_str()), (404, Some("unknownBatch")), "{v}");
    }
    start_many(&w1, "waiter", "w", N);
    // A dry run counts the instances of both workers' partitions, and creates nothing.
    let (st, v) = w2.post(
        "/batches",
        json!({"operation": "cancel", "where": {"definition": "waiter", "jq": ".n < 150"}, "dryRun": true}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["dryRun"].as_bool(), v["matched"].as_u64()),
        (Some(true), Some(150)),
        "{v}"
    );
    let listed: std::collections::BTreeSet<&str> = v["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .filter_map(|i| i["id"].as_str())
        .collect();
    assert_eq!(listed.len(), 150, "{v}");
    assert!(
        listed.contains("w-0") && listed.contains("w-149") && !listed.contains("w-150"),
        "{v}"
    );
    assert_eq!(w1.get("/batches")["batches"], json!([]), "a dry run creates no batch");

    // At 4 a second over four partitions, one a second each: stopped after about a second.
    let (st, v) = w1.post(
        "/batches",
        json!({"operation": "cancel", "where": {"definition": "waiter"}, "rate": 4}),
    );
    assert_eq!(st, 202, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    wait_until(
        "the batch to cancel some",
        30,
        || {
            w2.get(&format!("/batches/{id}"))["done"]
                .as_u64()
                .is_some_and(|d| d > 0)
        },
        &[&w1, &w2],
    );
    let (st, v) = w2.post(&format!("/batches/{id}/cancel"), json!({}));
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["phase"].as_str(), v["running"].as_bool()),
        (Some("cancelled"), Some(false)),
        "{v}"
    );
    let done = v["done"].as_u64().expect("done");
    let cancelled = || all_instances(&w1).iter().filter(|i| i["status"] == "cancelled").count() as u64;
    assert_eq!(cancelled(), done, "{v}");
    assert!(done < N as u64, "{v}");
    std::thread::sleep(std::time::Duration::from_millis(2_000));
    assert_eq!(cancelled(), done, "nothing more is cancelled once the batch is stopped");
    let v = w1.get(&format!("/batches/{id}"));
    assert_eq!(
        (v["phase"].as_str(), v["done"].as_u64()),
        (Some("cancelled"), Some(done)),
        "{v}"
    );
    // `sm4c batch` works against a Kafka worker as against the SQLite server: it posts a batch,
    // follows it to its end and reports it, and lists the batches.
    let sm4c = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sm4c"))
            .args(args)
            .output()
            .expect("sm4c runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (
            out.status.code(),
            text,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, text, err) = sm4c(&[
        "batch",
        "cancel",
        "--where",
        "definition=waiter,status=waiting",
        "--json",
        "--server",
        &w1.base,
    ]);
    assert_eq!(code, Some(0), "{text}{err}");
    let v: Value = serde_json::from_str(&text).expect("--json prints the batch");
    let rest = N as u64 - done;
    assert_eq!(
        (v["phase"].as_str(), v["matched"].as_u64(), v["done"].as_u64()),
        (Some("completed"), Some(rest), Some(rest)),
        "{v}"
    );
    assert_eq!(cancelled(), N as u64);
    let (code, text, err) = sm4c(&["batch", "list", "--server", &w2.base]);
    assert_eq!(code, Some(0), "{text}{err}");
    assert!(text.contains(&id) && text.contains("cancelled"), "{text}");
}

/// A batch redrive with an update over failed instances: each is redriven once and completes; an
/// instance the batch matched that did not fail is refused, with its reason among the failures.
#[test]
fn a_batch_redrive_redrives_each_failed_instance_once_and_names_the_one_that_did_not_fail() {
    const N: usize = 24;
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    // The payment function declines a charge without a card.
    let mocks = dir.path().join("mocks.json");
    std::fs::write(
        &mocks,
        json!({"charge": "if .card == null then error(\"declined: no card\") else {charged: .card} end"}).to_string(),
    )
    .expect("write mocks");
    let mocks = mocks.display().to_string();
    let args = worker_args(&broker, "br", 4, &["--mock", &mocks]);
    let w1 = Worker::start(dir.path(), "w1", &args);
    let w2 = Worker::start(dir.path(), "w2", &args);
    wait_owned(&[&w1, &w2], 4);
    define(
        &w1,
        &[&w2],
        json!({"id": "kpay", "name": "kpay", "version": "1",
            "functions": [{"name": "charge", "operation": "http://pay.example/api.json#charge"}],
            "states": [{"name": "Charge", "start": true,
                        "enterAction": {"type": "invokeFunction", "functionName": "charge", "waitForCompletion": true,
                                        "arguments": {"card": "${ .card }"}},
                        "enterResultHandler": "${ .receipt = $value }",
                        "transitions": [{"nextState": "Done"}]},
                       {"name": "Done"}]}),
    );
    start_many(&w1, "kpay", "k", N);
    let (st, v) = w1.post(
        "/instances",
        json!({"definition": "kpay", "id": "paid", "input": {"card": "1111"}}),
    );
    assert_eq!(st, 201, "{v}");
    for i in 0..N {
        wait_until(
            "failed",
            30,
            || w2.get(&format!("/instances/k-{i}"))["status"] == "failed",
            &[&w1, &w2],
        );
    }
    wait_until(
        "completed",
        30,
        || w2.get("/instances/paid")["status"] == "completed",
        &[&w1, &w2],
    );
    let (st, v) = w2.post(
        "/batches",
        json!({"operation": "redrive", "where": {"definition": "kpay"}, "update": ".card = \"4242\""}),
    );
    assert_eq!(st, 202, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    let v = ended_batch(&w1, &id, 60, &[&w1, &w2]);
    assert_eq!(
        (
            v["phase"].as_str(),
            v["matched"].as_u64(),
            v["done"].as_u64(),
            v["failedCount"].as_u64()
        ),
        (Some("completed"), Some(N as u64 + 1), Some(N as u64), Some(1)),
        "{v}"
    );
    let failed = v["failed"].as_array().expect("failed");
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["instance"], "paid", "{v}");
    assert!(
        failed[0]["reason"].as_str().unwrap_or_default().contains("completed"),
        "{v}"
    );
    for i in 0..N {
        let inst = format!("k-{i}");
        wait_until(
            "redriven and completed",
            30,
            || w2.get(&format!("/instances/{inst}"))["status"] == "completed",
            &[&w1, &w2],
        );
        let s = w2.get(&format!("/instances/{inst}"));
        assert_eq!(s["data"]["receipt"], json!({"charged": "4242"}), "{s}");
        let h = w2.get(&format!("/instances/{inst}/history"));
        let redrives = h["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| e["input"] == "redrive")
            .count();
        assert_eq!(redrives, 1, "{inst}: {h}");
    }
}
