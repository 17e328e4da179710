//! Redrive against the real `sm4c serve` on a SQLite file: an SM4C instance whose REST call to a
//! real local server failed because of its data goes on after `POST /instances/{id}/redrive`
//! with an update (and the `sm4c redrive` CLI), then survives a SIGKILL right after the redrive's
//! answer; a redrive without an update once the server is fixed; the 409 refusals with their
//! reasons and the 400 for a bad update; `sm4c history` showing the redrive with its data change;
//! an ASL execution redriven from its failed Task with its Retry counters reset.

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::server;
use server::{Serve, Server, BIN};

/// Longest an instance may take to reach a status (generous: debug builds on busy machines).
const DEADLINE: Duration = Duration::from_secs(60);

/// `sm4c serve --db DB --definitions DEFS ARGS` (appending to `log`), once it answers `/healthz`.
fn start(db: &Path, defs: &Path, log: &Path, args: &[&str]) -> Server {
    Serve::new()
        .db(db)
        .log(log)
        .arg("--definitions")
        .arg(defs)
        .args(args)
        .start()
}

/// What these tests ask of a server.
trait Api {
    fn send(&self, req: reqwest::blocking::RequestBuilder) -> (u16, Value);
    fn post(&self, path: &str, body: &Value) -> (u16, Value);
    fn redrive(&self, id: &str, body: &Value) -> (u16, Value);
    fn start_instance(&self, definition: &str, id: &str, input: Value);
    fn instance(&self, id: &str) -> Value;
    fn history(&self, id: &str) -> Vec<Value>;
    fn wait_status(&self, id: &str, statuses: &[&str]) -> Value;
    fn cli(&self, args: &[&str]) -> (Option<i32>, String, String);
}

impl Api for Server {
    fn send(&self, req: reqwest::blocking::RequestBuilder) -> (u16, Value) {
        let r = req
            .send()
            .unwrap_or_else(|e| panic!("request failed: {e}; log:\n{}", self.log()));
        let status = r.status().as_u16();
        let text = r.text().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.client().post(format!("{}{path}", self.url())).json(body))
    }

    fn redrive(&self, id: &str, body: &Value) -> (u16, Value) {
        self.post(&format!("/instances/{id}/redrive"), body)
    }

    fn start_instance(&self, definition: &str, id: &str, input: Value) {
        let (st, body) = self.post(
            "/instances",
            &json!({"definition": definition, "id": id, "input": input}),
        );
        assert_eq!(st, 201, "POST /instances {id}: {body}");
    }

    fn instance(&self, id: &str) -> Value {
        let (st, body) = self.send(self.client().get(format!("{}/instances/{id}", self.url())));
        assert_eq!(st, 200, "GET /instances/{id}: {body}");
        body
    }

    fn history(&self, id: &str) -> Vec<Value> {
        let (st, body) = self.send(
            self.client()
                .get(format!("{}/instances/{id}/history?limit=1000", self.url())),
        );
        assert_eq!(st, 200, "history: {body}");
        body["entries"].as_array().cloned().unwrap_or_default()
    }

    /// Polls instance `id` until its status is one of `statuses`.
    fn wait_status(&self, id: &str, statuses: &[&str]) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let v = self.instance(id);
            if statuses.iter().any(|s| v["status"] == *s) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "instance {id} did not become {statuses:?}: {v}\nhistory: {:?}\nlog:\n{}",
                self.history(id),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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

/// What the payment service received: (Idempotency-Key, body) of each call.
type Calls = Arc<Mutex<Vec<(String, Value)>>>;

/// A payment service: `POST /charge` answers 400 unless the body has a `card` (or the service
/// was "fixed": then it charges without one); it records every call.
fn payments(calls: Calls, fixed: Arc<AtomicBool>) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async move {
            let app = Router::new().route(
                "/charge",
                post(move |h: HeaderMap, Json(body): Json<Value>| {
                    let (calls, fixed) = (calls.clone(), fixed.clone());
                    async move {
                        let key = h
                            .get("idempotency-key")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        calls.lock().expect("lock").push((key, body.clone()));
                        match body.get("card").and_then(Value::as_str) {
                            Some(card) => (StatusCode::OK, Json(json!({"charged": card}))),
                            None if fixed.load(Ordering::SeqCst) => {
                                (StatusCode::OK, Json(json!({"charged": "on file"})))
                            }
                            None => (StatusCode::BAD_REQUEST, Json(json!({"reason": "card missing"}))),
                        }
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send");
            axum::serve(listener, app).await.expect("serve");
        });
    });
    format!("http://{}", rx.recv().expect("address"))
}

/// Charges (one retry), then waits for nothing and ends; `pay-capped` may be redriven once.
fn pay(id: &str, cap: Option<u32>) -> Value {
    let mut def = json!({"id": id, "name": id, "version": "1",
    "functions": [{"name": "charge", "operation": "file://pay.openapi#charge"}],
    "retries": [{"name": "once", "delay": "PT0.2S", "maxAttempts": 1}],
    "states": [
        {"name": "Charge", "start": true,
         "enterAction": {"name": "charge", "type": "invokeFunction", "functionName": "charge",
                         "waitForCompletion": true, "arguments": {"amount": "${ .amount }", "card": "${ .card }"},
                         "errorHandlers": [{"retryPolicy": "once"}]},
         "enterResultHandler": "${ .receipt = $value }",
         "transitions": [{"nextState": "Done"}]},
        {"name": "Done"}
    ]});
    if let Some(cap) = cap {
        def["maxRedrives"] = json!(cap);
    }
    def
}

/// A definitions folder with the payment service's OpenAPI document and the `pay` definitions.
fn definitions(dir: &Path, server: &str) -> PathBuf {
    let defs = dir.join("defs");
    std::fs::create_dir_all(&defs).expect("mkdir");
    let doc = json!({"openapi": "3.1.0", "info": {"title": "pay", "version": "1"}, "servers": [{"url": server}],
        "paths": {"/charge": {"post": {"operationId": "charge",
            "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}}}}}});
    // Not `.json`: every `.json` file in the definitions folder must be a definition.
    std::fs::write(defs.join("pay.openapi"), doc.to_string()).expect("write");
    std::fs::write(defs.join("pay.json"), pay("pay", None).to_string()).expect("write");
    std::fs::write(defs.join("capped.json"), pay("pay-capped", Some(1)).to_string()).expect("write");
    std::fs::write(
        defs.join("wait.json"),
        json!({"id": "wait", "name": "wait", "version": "1",
            "events": [{"name": "go", "type": "go"}],
            "states": [{"name": "Wait", "start": true, "transitions": [{"nextState": "End", "eventGroups": [{"events": ["go"]}]}]},
                       {"name": "End"}]})
        .to_string(),
    )
    .expect("write");
    defs
}

fn bodies_with_card(calls: &Calls) -> Vec<(String, Value)> {
    calls
        .lock()
        .expect("lock")
        .iter()
        .filter(|(_, b)| b.get("card").is_some_and(|c| !c.is_null()))
        .cloned()
        .collect()
}

#[test]
fn a_call_that_failed_on_its_data_succeeds_after_a_redrive_with_an_update_also_across_a_sigkill() {
    let calls: Calls = Arc::default();
    let server = payments(calls.clone(), Arc::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let defs = definitions(dir.path(), &server);
    let (db, log) = (dir.path().join("s.db"), dir.path().join("log"));
    let mut s = start(&db, &defs, &log, &[]);

    s.start_instance("pay", "p1", json!({"amount": 5}));
    let failed = s.wait_status("p1", &["failed", "completed"]);
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(calls.lock().expect("lock").len(), 2, "the call and its one retry");

    // A bad update is a 400 naming /update, and changes nothing.
    for bad in ["{", ".amount"] {
        let (st, body) = s.redrive("p1", &json!({"update": bad}));
        assert_eq!(st, 400, "{bad}: {body}");
        assert_eq!(body["error"], "invalidUpdate", "{body}");
        assert_eq!(body["details"]["pointer"], "/update", "{body}");
    }
    // A dry run previews the data after the update and changes nothing.
    let (st, body) = s.redrive("p1", &json!({"update": ".card = \"4242\"", "dryRun": true}));
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["redrive"]["data"], json!({"amount": 5, "card": "4242"}), "{body}");
    assert_eq!(
        body["redrive"]["diff"],
        json!([{"op": "add", "path": "/card", "value": "4242"}])
    );
    assert_eq!(s.instance("p1")["status"], "failed");
    assert_eq!(calls.lock().expect("lock").len(), 2, "a dry run calls nothing");

    // The CLI redrives with the update; the server is killed right after its answer.
    let (code, out, err) = s.cli(&["redrive", "p1", "--update", ".card = \"4242\""]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("goes on from state \"Charge\""), "{out}");
    assert!(out.contains("add /card: \"4242\""), "{out}");
    s.kill();

    let s = start(&db, &defs, &log, &[]);
    let done = s.wait_status("p1", &["completed", "failed"]);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["id"], "p1");
    assert_eq!(done["data"]["receipt"], json!({"charged": "4242"}), "{done}");
    // The call with the card was made for one operation only (at least once, never with a new key).
    let with_card = bodies_with_card(&calls);
    assert!(!with_card.is_empty());
    assert!(
        with_card.iter().all(|(k, _)| *k == with_card[0].0),
        "one operation: {with_card:?}"
    );
    assert!(with_card[0].0.contains("~r1"), "a new operation id: {with_card:?}");
    // At least once: the call may have been in flight at the kill, then made again with its key.
    assert!(with_card.len() <= 2, "{with_card:?}");
    // The journal keeps the failure, the redrive with its data change, and one completion.
    let h = s.history("p1");
    let redrives: Vec<&Value> = h
        .iter()
        .filter(|e| e["entry"] == "input" && e["input"] == "redrive")
        .collect();
    assert_eq!(redrives.len(), 1, "{h:?}");
    assert_eq!(redrives[0]["update"], ".card = \"4242\"");
    assert_eq!(
        redrives[0]["diff"],
        json!([{"op": "add", "path": "/card", "value": "4242"}])
    );
    let ends: Vec<&str> = h
        .iter()
        .filter(|e| e["step"] == "finished")
        .map(|e| e["status"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        ends,
        ["failed", "completed"],
        "it failed once and completed once: {h:?}"
    );
    let (code, out, err) = s.cli(&["history", "p1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("input redrive with update .card = \"4242\""), "{out}");
    assert!(out.contains("add /card: \"4242\""), "{out}");

    // Refusals: a completed instance, an unknown one.
    let (st, body) = s.redrive("p1", &json!({}));
    assert_eq!(st, 409, "{body}");
    assert_eq!(body["error"], "notRedrivable");
    assert_eq!(body["details"]["reason"], "completed", "{body}");
    let (st, _) = s.redrive("nobody", &json!({}));
    assert_eq!(st, 404);
}

#[test]
fn a_redrive_without_update_once_the_server_is_fixed_completes_and_refusals_name_their_reason() {
    let calls: Calls = Arc::default();
    let fixed = Arc::new(AtomicBool::new(false));
    let server = payments(calls.clone(), fixed.clone());
    let dir = tempfile::tempdir().expect("tempdir");
    let defs = definitions(dir.path(), &server);
    let s = start(&dir.path().join("s.db"), &defs, &dir.path().join("log"), &[]);

    // Capped at one redrive: the second is refused with limitReached.
    s.start_instance("pay-capped", "c1", json!({"amount": 1}));
    assert_eq!(s.wait_status("c1", &["failed"])["status"], "failed");
    let (st, body) = s.redrive("c1", &json!({}));
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["redrive"]["redrives"], 1);
    // The server is still broken: the redriven call fails again after its retry, counted afresh.
    let deadline = Instant::now() + DEADLINE;
    while calls.lock().expect("lock").len() < 4 {
        assert!(Instant::now() < deadline, "{:?}", calls.lock().expect("lock"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(s.wait_status("c1", &["failed"])["status"], "failed");
    assert_eq!(calls.lock().expect("lock").len(), 4, "two attempts before, two after");
    let (st, body) = s.redrive("c1", &json!({}));
    assert_eq!(st, 409, "{body}");
    assert_eq!(body["details"]["reason"], "limitReached", "{body}");

    // Running and cancelled instances are refused.
    s.start_instance("wait", "w1", json!({}));
    s.wait_status("w1", &["waiting"]);
    let (st, body) = s.redrive("w1", &json!({}));
    assert_eq!((st, &body["details"]["reason"]), (409, &json!("running")), "{body}");
    let (st, _) = s.post("/instances/w1/cancel", &json!({}));
    assert!(st < 300);
    s.wait_status("w1", &["cancelled"]);
    let (st, body) = s.redrive("w1", &json!({}));
    assert_eq!((st, &body["details"]["reason"]), (409, &json!("cancelled")), "{body}");

    // Fixed: a redrive with no body at all (a body-less POST carries the API's request header)
    // goes on with the data as it is.
    s.start_instance("pay", "p2", json!({"amount": 7}));
    assert_eq!(s.wait_status("p2", &["failed"])["status"], "failed");
    fixed.store(true, Ordering::SeqCst);
    let r = s
        .client()
        .post(format!("{}/instances/p2/redrive", s.url()))
        .header("x-sm4c-request", "1")
        .send()
        .expect("redrive");
    assert_eq!(r.status().as_u16(), 200);
    let done = s.wait_status("p2", &["completed", "failed"]);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["data"], json!({"amount": 7, "receipt": {"charged": "on file"}}));
}

#[test]
fn an_asl_execution_is_redriven_from_its_failed_task_with_its_retry_counters_reset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let defs = dir.path().join("defs");
    std::fs::create_dir_all(&defs).expect("mkdir");
    // Declined without a card; with one, the first attempt after a (re)start is flaky.
    let mocks = dir.path().join("mocks.json");
    std::fs::write(
        &mocks,
        json!({"arn:sm4c:pay": "if .card == null then error({Error: \"Declined\", Cause: \"no card\"}) elif .attempt < 1 then error({Error: \"Flaky\", Cause: \"try again\"}) else {paid: .card, attempt: .attempt} end"})
            .to_string(),
    )
    .expect("write");
    std::fs::write(
        defs.join("asl-pay.asl.json"),
        json!({"StartAt": "Pay", "States": {"Pay": {"Type": "Task", "Resource": "arn:sm4c:pay",
            "Parameters": {"card.$": "$.card", "attempt.$": "$$.State.RetryCount"},
            "Retry": [{"ErrorEquals": ["Declined", "Flaky"], "IntervalSeconds": 1, "MaxAttempts": 1}],
            "End": true}}})
        .to_string(),
    )
    .expect("write");
    let mocks = mocks.to_string_lossy().to_string();
    let s = start(
        &dir.path().join("s.db"),
        &defs,
        &dir.path().join("log"),
        &["--mock", &mocks],
    );
    s.start_instance("asl-pay", "a1", json!({"card": null}));
    let failed = s.wait_status("a1", &["failed", "completed"]);
    assert_eq!(failed["status"], "failed", "{failed}");
    let (st, body) = s.redrive("a1", &json!({"update": ".card = \"4242\""}));
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["redrive"]["from"], "state \"Pay\"");
    let done = s.wait_status("a1", &["completed", "failed"]);
    // Flaky on RetryCount 0 after the redrive: only a reset counter leaves it a retry.
    assert_eq!(done["status"], "completed", "{done}\n{:?}", s.history("a1"));
    assert_eq!(done["data"], json!({"paid": "4242", "attempt": 1}));
}
