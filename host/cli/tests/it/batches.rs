//! Batch operations (`POST /batches`, `sm4c batch`) against the real `sm4c serve` binary on real
//! SQLite files: a cancel over 10,000 instances with the server killed -9 in the middle (it
//! resumes, and every instance is cancelled once), dry runs, migrate and send batches, refusals,
//! and stopping a batch.

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::server;
use server::{Serve, Server, BIN};

/// `sm4c serve --db DB ARGS` (appending to `log`), once it answers `/healthz`.
fn start(db: &Path, log: &Path, args: &[&str]) -> Server {
    Serve::new()
        .db(db)
        .log(log)
        .args(args)
        .client_timeout(Duration::from_secs(60))
        .start()
}

/// What these tests ask of a server.
trait Api {
    fn send(&self, req: reqwest::blocking::RequestBuilder) -> (u16, Value);
    fn get(&self, path: &str) -> (u16, Value);
    fn post(&self, path: &str, body: &Value) -> (u16, Value);
    fn define(&self, doc: &Value);
    fn start_many(&self, definition: &str, prefix: &str, n: usize);
    fn wait_batch(&self, id: &str, timeout: Duration) -> Value;
    fn inputs(&self, id: &str, kind: &str) -> usize;
    fn cli(&self, args: &[&str]) -> (Option<i32>, String, String);
}

impl Api for Server {
    fn send(&self, req: reqwest::blocking::RequestBuilder) -> (u16, Value) {
        let r = req
            .send()
            .unwrap_or_else(|e| panic!("request failed: {e}; log:\n{}", self.log()));
        let st = r.status().as_u16();
        (st, r.json().unwrap_or(Value::Null))
    }

    fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.client().get(format!("{}{path}", self.url())))
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.client().post(format!("{}{path}", self.url())).json(body))
    }

    fn define(&self, doc: &Value) {
        let (st, b) = self.post("/definitions", doc);
        assert!(st == 200 || st == 201, "{st} {b}");
    }

    /// Starts `n` instances `PREFIX-i` of `definition` with input `{"n": i}`, from 8 threads.
    fn start_many(&self, definition: &str, prefix: &str, n: usize) {
        std::thread::scope(|s| {
            for t in 0..8 {
                s.spawn(move || {
                    for i in (t..n).step_by(8) {
                        let (st, b) = self.post(
                            "/instances",
                            &json!({"definition": definition, "id": format!("{prefix}-{i}"), "input": {"n": i}}),
                        );
                        assert_eq!(st, 201, "start {prefix}-{i}: {b}");
                    }
                });
            }
        });
    }

    /// Polls `GET /batches/{id}` until the batch is not running.
    fn wait_batch(&self, id: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let (st, v) = self.get(&format!("/batches/{id}"));
            assert_eq!(st, 200, "{v}");
            if v["running"] == false {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "batch {id} still runs after {timeout:?}: {v}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// How many inputs of `kind` (`cancel`, `event`) the journal of `id` has.
    fn inputs(&self, id: &str, kind: &str) -> usize {
        let (st, b) = self.get(&format!("/instances/{id}/history?limit=1000"));
        assert_eq!(st, 200, "{b}");
        assert!(b["next"].is_null(), "a short journal: {b}");
        b["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| e["entry"] == "input" && e["input"] == kind)
            .count()
    }

    /// `sm4c ARGS --server` this server: (exit code, stdout, stderr).
    fn cli(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = Command::new(BIN)
            .args(args)
            .args(["--server", self.url()])
            .output()
            .expect("sm4c runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }
}

fn read(log: &Path) -> String {
    let t = std::fs::read_to_string(log).unwrap_or_default();
    t[t.len().saturating_sub(4000)..].to_string()
}

/// Waits for an event, then for another: an event taken twice shows in its state and journal.
fn waiter(version: &str) -> Value {
    json!({"id": "waiter", "name": "Waiter", "version": version,
    "events": [{"name": "poke", "type": "com.example.poke", "source": "test"}],
    "states": [
        {"name": "Wait", "start": true, "transitions": [{"nextState": "Again",
            "eventGroups": [{"events": ["poke"], "resultHandler": "${ .poked = ($value | .data) }"}]}]},
        {"name": "Again", "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["poke"]}]}]},
        {"name": "Done"}
    ]})
}

#[test]
fn a_batch_cancel_over_10000_instances_survives_kill_9_and_cancels_each_instance_once() {
    const N: usize = 10_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, log) = (dir.path().join("b.db"), dir.path().join("server.log"));
    // 1000 a second: the batch takes about 10 s, and is killed in the middle.
    let mut s = start(&db, &log, &["--batch-rate", "1000"]);
    s.define(&waiter("1"));
    let t = Instant::now();
    s.start_many("waiter", "w", N);
    let started_in = t.elapsed();
    let (st, v) = s.post(
        "/batches",
        &json!({"operation": "cancel", "where": {"definition": "waiter"}}),
    );
    assert_eq!(st, 202, "{v}");
    let id = v["id"].as_str().expect("the batch's id").to_string();
    // Killed once a good part, not all, is done.
    let deadline = Instant::now() + Duration::from_secs(120);
    let done_before = loop {
        let (_, v) = s.get(&format!("/batches/{id}"));
        let done = v["done"].as_u64().unwrap_or(0);
        if done >= 2_000 {
            break done;
        }
        assert!(v["running"] == true, "the batch ended before it could be killed: {v}");
        assert!(Instant::now() < deadline, "the batch does not progress: {v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    s.kill();
    drop(s);
    let t = Instant::now();
    let s = start(&db, &log, &["--batch-rate", "1000"]);
    let v = s.wait_batch(&id, Duration::from_secs(180));
    let resumed_in = t.elapsed();
    assert!(read(&log).contains("resuming unfinished batches"), "{}", read(&log));
    assert_eq!(v["phase"], "completed", "{v}");
    assert_eq!(
        (v["matched"].as_u64(), v["done"].as_u64(), v["failedCount"].as_u64()),
        (Some(N as u64), Some(N as u64), Some(0)),
        "{v}"
    );
    assert!(done_before < N as u64, "killed in the middle: {done_before}");
    // Every instance is cancelled, and its journal has one cancel.
    let wrong: Vec<String> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let s = &s;
                sc.spawn(move || {
                    (t..N)
                        .step_by(8)
                        .filter_map(|i| {
                            let id = format!("w-{i}");
                            let (_, v) = s.get(&format!("/instances/{id}"));
                            let cancels = s.inputs(&id, "cancel");
                            (v["status"] != "cancelled" || cancels != 1)
                                .then(|| format!("{id}: {} with {cancels} cancel inputs", v["status"]))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("checker")).collect()
    });
    assert!(
        wrong.is_empty(),
        "{} wrong: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(20)]
    );
    eprintln!(
        "batch test: {N} started in {started_in:?}; killed at {done_before} done; resumed and completed in {resumed_in:?}"
    );
}

#[test]
fn dry_runs_migrate_and_send_batches_refusals_and_a_stopped_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, log) = (dir.path().join("b.db"), dir.path().join("server.log"));
    let s = start(&db, &log, &[]);
    s.define(&waiter("1"));
    s.start_many("waiter", "w", 40);

    // A dry run lists what it would touch and changes nothing (CLI and API).
    let (code, out, err) = s.cli(&[
        "batch",
        "cancel",
        "--where",
        "definition=waiter,state=Wait",
        "--jq",
        ".n < 3",
        "--dry-run",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    for i in 0..3 {
        assert!(out.contains(&format!("w-{i} ")), "{out}");
    }
    assert!(out.contains("would touch 3 instances"), "{out}");
    let (st, v) = s.post(
        "/batches",
        &json!({"operation": "cancel", "where": {"jq": ".n >= 30"}, "dryRun": true}),
    );
    assert_eq!((st, v["matched"].as_u64()), (200, Some(10)), "{v}");
    assert_eq!(s.get("/batches").1["batches"], json!([]), "a dry run is not recorded");
    assert!((0..40).all(|i| s.get(&format!("/instances/w-{i}")).1["status"] == "waiting"));

    // Refusals name the field.
    for (body, pointer) in [
        (json!({"operation": "cancel", "where": {"jq": ".n >"}}), "/where/jq"),
        (
            json!({"operation": "cancel", "where": {"state": "Wait", "colour": "red"}}),
            "/where/colour",
        ),
        (
            json!({"operation": "cancel", "where": {"startedAfter": "today"}}),
            "/where/startedAfter",
        ),
        (json!({"operation": "explode", "where": {}}), "/operation"),
        (json!({"operation": "migrate", "where": {}}), "/version"),
        (json!({"operation": "cancel", "where": {}, "event": {}}), "/event"),
        (
            json!({"operation": "cancel", "where": {"definition": "nope"}}),
            "/where/definition",
        ),
    ] {
        let (st, v) = s.post("/batches", &body);
        assert_eq!((st, v["error"].as_str()), (400, Some("invalidBatch")), "{body}: {v}");
        assert!(
            v["details"]
                .as_array()
                .expect("details")
                .iter()
                .any(|d| d["pointer"] == pointer),
            "{body}: {v}"
        );
    }
    assert_eq!(s.get("/batches/nope").0, 404);

    // A send batch: each instance gets its own event, by sm4cinstanceid, with the id batch/instance.
    let event = dir.path().join("poke.json");
    std::fs::write(
        &event,
        json!({"type": "com.example.poke", "source": "test", "data": "hi"}).to_string(),
    )
    .expect("write");
    let (code, out, err) = s.cli(&[
        "batch",
        "send",
        "--where",
        "definition=waiter",
        "--jq",
        ".n < 10",
        "--event",
        event.to_str().expect("path"),
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("matched 10, done 10, failed 0"), "{out}");
    for i in 0..40 {
        let v = s.get(&format!("/instances/w-{i}")).1;
        let want = if i < 10 { "Again" } else { "Wait" };
        assert_eq!(v["state"], want, "w-{i}: {v}");
        assert_eq!(s.inputs(&format!("w-{i}"), "event"), usize::from(i < 10));
    }

    // A migrate batch moves the instances waiting in Wait to version 2.
    s.define(&waiter("2"));
    let (code, out, err) = s.cli(&[
        "batch",
        "migrate",
        "--to-version",
        "2",
        "--where",
        "definition=waiter,version=1,state=Wait",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let v: Value = serde_json::from_str(&out).expect("--json prints the batch");
    assert_eq!((v["matched"].as_u64(), v["done"].as_u64()), (Some(30), Some(30)), "{v}");
    for i in 0..40 {
        let want = if i < 10 { "1" } else { "2" };
        assert_eq!(s.get(&format!("/instances/w-{i}")).1["version"], want, "w-{i}");
    }

    // A batch whose instances fail: the report names each, and the exit code is 1. Redrive is
    // refused for instances that are waiting, or not offered by this build's host: either way
    // each is a failure with its reason.
    let (code, out, _) = s.cli(&["batch", "redrive", "--where", "definition=waiter", "--jq", ".n < 2"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("matched 2, done 0, failed 2") && out.contains("failed w-0: "),
        "{out}"
    );

    // Stopped: at 1 a second, most instances are never reached and stay as they are.
    let (st, v) = s.post(
        "/batches",
        &json!({"operation": "cancel", "where": {"definition": "waiter"}, "rate": 1}),
    );
    assert_eq!(st, 202, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    std::thread::sleep(Duration::from_millis(1500));
    let (code, out, err) = s.cli(&["batch", "stop", &id]);
    assert_eq!(code, Some(1), "a stopped batch exits 1: {out}{err}");
    assert!(out.contains("cancelled"), "{out}");
    let v = s.get(&format!("/batches/{id}")).1;
    assert_eq!(
        (v["phase"].as_str(), v["running"].as_bool()),
        (Some("cancelled"), Some(false)),
        "{v}"
    );
    let cancelled = |s: &Server| {
        (0..40)
            .filter(|i| s.get(&format!("/instances/w-{i}")).1["status"] == "cancelled")
            .count()
    };
    let now = cancelled(&s);
    assert_eq!(now as u64, v["done"].as_u64().expect("done"), "{v}");
    assert!(now < 40, "{now}");
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(
        cancelled(&s),
        now,
        "nothing more is cancelled once the batch is stopped"
    );
    let (code, out, _) = s.cli(&["batch", "list"]);
    assert_eq!(code, Some(0));
    assert!(out.contains(&id) && out.contains("cancelled"), "{out}");
}

/// A payment API on a free port that answers 503 while `outage` is set, 200 otherwise, and counts
/// the calls per order.
fn payment_api(outage: std::sync::Arc<std::sync::atomic::AtomicBool>, calls: Calls) -> String {
    use axum::routing::post;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async move {
            let app = axum::Router::new().route(
                "/pay",
                post(move |axum::Json(body): axum::Json<Value>| async move {
                    let order = body["order"].as_str().unwrap_or_default().to_string();
                    *calls.0.lock().expect("calls").entry(order).or_insert(0) += 1;
                    if outage.load(std::sync::atomic::Ordering::SeqCst) {
                        (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            axum::Json(json!({"down": true})),
                        )
                    } else {
                        (axum::http::StatusCode::OK, axum::Json(json!({"paid": body["order"]})))
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send");
            axum::serve(listener, app).await.expect("serve");
        });
    });
    format!("http://{}", rx.recv().expect("the API's address"))
}

/// Calls the payment API received, by order.
#[derive(Clone, Default)]
struct Calls(std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, usize>>>);

/// A payment API down (503) fails every instance that calls it; once it is back, one batch
/// redrives every instance that failed of it, and each completes, calling the API once more.
#[test]
fn a_batch_redrive_after_an_outage_completes_every_instance_that_failed_of_it() {
    let outage = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let calls = Calls::default();
    let api = payment_api(outage.clone(), calls.clone());
    let dir = tempfile::tempdir().expect("tempdir");
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).expect("mkdir");
    std::fs::write(
        defs.join("pay.openapi"),
        json!({"openapi": "3.0.1", "servers": [{"url": api}],
            "paths": {"/pay": {"post": {"operationId": "pay"}}}})
        .to_string(),
    )
    .expect("write");
    std::fs::write(
        defs.join("payer.json"),
        json!({"id": "payer", "name": "Payer", "version": "1",
            "functions": [{"name": "pay", "operation": "file://pay.openapi#pay"}],
            "states": [{"name": "Pay", "start": true,
                "enterAction": {"name": "pay", "type": "invokeFunction", "functionName": "pay",
                    "arguments": {"order": "${ .order }"}, "waitForCompletion": true},
                "enterResultHandler": "${ .receipt = $value }"}]})
        .to_string(),
    )
    .expect("write");
    let log = dir.path().join("server.log");
    let defs_arg = defs.to_str().expect("path").to_string();
    let s = start(&dir.path().join("b.db"), &log, &["--definitions", &defs_arg]);
    const N: usize = 50;
    for i in 0..N {
        let (st, b) = s.post(
            "/instances",
            &json!({"definition": "payer", "id": format!("p-{i}"), "input": {"order": format!("o-{i}")}}),
        );
        assert_eq!(st, 201, "{b}");
    }
    // The outage fails every instance (no retry policy).
    let deadline = Instant::now() + Duration::from_secs(60);
    while (0..N).any(|i| s.get(&format!("/instances/p-{i}")).1["status"] != "failed") {
        assert!(
            Instant::now() < deadline,
            "the instances did not all fail in the outage"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    outage.store(false, std::sync::atomic::Ordering::SeqCst);
    let (code, out, err) = s.cli(&["batch", "redrive", "--where", "definition=payer,status=failed"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(&format!("matched {N}, done {N}, failed 0")), "{out}");
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..N {
        loop {
            let v = s.get(&format!("/instances/p-{i}")).1;
            if v["status"] == "completed" {
                assert_eq!(v["data"]["receipt"]["paid"], format!("o-{i}"), "{v}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "p-{i} did not complete after the redrive: {v}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Each order was tried once in the outage and once after it: redriven once.
    let seen = calls.0.lock().expect("calls").clone();
    assert_eq!(seen.len(), N, "{seen:?}");
    assert!(seen.values().all(|n| *n == 2), "{seen:?}");
}
