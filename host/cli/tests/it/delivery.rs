//! At-most-once calls against the real `sm4c serve` and a real HTTP service: a call of an
//! `atMostOnce` function (SM4C) or of an ASL Resource the configuration file makes `atMostOnce` is
//! in flight when `sm4c serve` is killed with SIGKILL; after the restart the instance reports
//! `stepInterrupted` and the service saw exactly one request, where an `atLeastOnce` call beside it
//! is made again (two requests).

use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::server;
use server::{Serve, Server};

/// `sm4c serve` of the definitions in `defs` on the store `db` (with the configuration file
/// `config`, appending to `log`), once it answers `/healthz`.
fn serve(defs: &Path, db: &Path, config: Option<&Path>, log: &Path) -> Server {
    let mut serve = Serve::new().db(db).log(log).arg("--definitions").arg(defs);
    if let Some(c) = config {
        serve = serve.arg("--config").arg(c);
    }
    serve.start()
}

/// A payment service that records the Idempotency-Key of every `POST /charge` and answers the
/// first request for each key only after 30 s (the call is in flight when the test kills sm4c),
/// later ones at once.
fn pay_api(keys: Arc<Mutex<Vec<String>>>) -> String {
    pay_api_after(keys, Duration::from_secs(30))
}

/// [`pay_api`] answering first requests after `delay`.
fn pay_api_after(keys: Arc<Mutex<Vec<String>>>, delay: Duration) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let app = Router::new().route(
                "/charge",
                post(move |h: HeaderMap, Json(body): Json<Value>| {
                    let keys = keys.clone();
                    async move {
                        let key = h
                            .get("idempotency-key")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let first = {
                            let mut k = keys.lock().unwrap();
                            k.push(key.clone());
                            k.iter().filter(|x| **x == key).count() == 1
                        };
                        if first {
                            tokio::time::sleep(delay).await;
                        }
                        Json(json!({"charged": body}))
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

fn openapi(server: &str) -> Value {
    json!({"openapi": "3.1.0", "info": {"title": "pay", "version": "1"}, "servers": [{"url": server}],
        "paths": {"/charge": {"post": {"operationId": "charge",
            "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}}}}}})
}

/// Requests per idempotency key whose key contains `instance`.
fn requests(keys: &Arc<Mutex<Vec<String>>>, instance: &str) -> usize {
    keys.lock().unwrap().iter().filter(|k| k.contains(instance)).count()
}

fn wait(what: &str, f: &dyn Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Api {
    base: String,
    client: reqwest::blocking::Client,
}

impl Api {
    fn new(url: &str) -> Api {
        Api {
            base: url.to_string(),
            client: reqwest::blocking::Client::new(),
        }
    }

    fn start(&self, definition: &str, id: &str) {
        let r = self
            .client
            .post(format!("{}/instances", self.base))
            .json(&json!({"definition": definition, "id": id, "input": {"amount": 12}}))
            .send()
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().unwrap_or_default());
    }

    fn get(&self, path: &str) -> Value {
        self.client
            .get(format!("{}/{path}", self.base))
            .send()
            .and_then(|r| r.json())
            .unwrap_or(Value::Null)
    }

    fn instance(&self, id: &str) -> Value {
        self.get(&format!("instances/{id}"))
    }

    fn ended(&self, id: &str) -> bool {
        matches!(
            self.instance(id)["status"].as_str(),
            Some("completed" | "failed" | "cancelled" | "timedOut")
        )
    }
}

fn sm4c_definitions() -> Vec<Value> {
    let charge = |delivery: Option<&str>| {
        let mut f = json!({"name": "charge", "operation": "file://pay.openapi#charge"});
        if let Some(d) = delivery {
            f["delivery"] = json!(d);
        }
        f
    };
    let call = json!({"type": "invokeFunction", "functionName": "charge", "waitForCompletion": true,
                      "arguments": {"amount": "${ .amount }"}});
    let mut handled = call.clone();
    handled["errorHandlers"] = json!([{"condition": "${ .type == \"stepInterrupted\" }",
                                       "resultHandler": "${ .interrupted = $value }"}]);
    let def = |id: &str, function: Value, action: Value| {
        json!({"id": id, "name": id, "version": "1", "functions": [function],
               "states": [{"name": "Charge", "start": true, "enterAction": action,
                           "enterResultHandler": "${ .charge = $value }",
                           "transitions": [{"nextState": "Done"}]},
                          {"name": "Done"}]})
    };
    vec![
        // atMostOnce on the function, no handler: the instance fails with stepInterrupted.
        def("amo", charge(Some("atMostOnce")), call.clone()),
        // atMostOnce on the action, with a handler for stepInterrupted: the instance goes on.
        def("amo-handled", charge(None), {
            let mut a = handled;
            a["delivery"] = json!("atMostOnce");
            a
        }),
        // The default: made again after the crash.
        def("alo", charge(None), call),
    ]
}

/// Whether the instance's journal holds the `failed` input of `op` with `stepInterrupted`.
fn journaled_interruption(api: &Api, id: &str) -> bool {
    let history = api.get(&format!("instances/{id}/history"));
    history.to_string().contains("stepInterrupted") && history.to_string().contains("\"failed\"")
}

#[test]
fn an_at_most_once_call_in_flight_at_a_sigkill_is_not_made_again_and_fails_with_step_interrupted() {
    let keys: Arc<Mutex<Vec<String>>> = Arc::default();
    let server = pay_api(keys.clone());
    let dir = tempfile::tempdir().unwrap();
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).unwrap();
    // Not `.json`: every `.json` file in the definitions folder must be a definition.
    std::fs::write(defs.join("pay.openapi"), openapi(&server).to_string()).unwrap();
    for d in sm4c_definitions() {
        std::fs::write(defs.join(format!("{}.json", d["id"].as_str().unwrap())), d.to_string()).unwrap();
    }
    let db = dir.path().join("s.db");
    let log = dir.path().join("serve.log");
    let mut serving = serve(&defs, &db, None, &log);
    let api = Api::new(serving.url());
    for (def, id) in [("amo", "i-amo"), ("amo-handled", "i-handled"), ("alo", "i-alo")] {
        api.start(def, id);
    }
    // Every call has reached the service, none has been answered: kill -9 now.
    wait("three calls in flight", &|| keys.lock().unwrap().len() == 3);
    // The restart listens on a new port.
    serving.restart();
    let api = Api::new(serving.url());
    wait("the three instances to end", &|| {
        ["i-amo", "i-handled", "i-alo"].iter().all(|id| api.ended(id))
    });
    let amo = api.instance("i-amo");
    assert_eq!(amo["status"], "failed", "{amo}");
    assert_eq!(amo["error"]["type"], "stepInterrupted", "{amo}");
    assert!(
        amo["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("not made again"),
        "{amo}"
    );
    let handled = api.instance("i-handled");
    assert_eq!(handled["status"], "completed", "{handled}");
    assert_eq!(handled["data"]["interrupted"]["type"], "stepInterrupted", "{handled}");
    let alo = api.instance("i-alo");
    assert_eq!(alo["status"], "completed", "{alo}");
    assert_eq!(alo["data"]["charge"], json!({"charged": {"amount": 12}}), "{alo}");
    // At most once: one request each; at least once: the call was made again.
    assert_eq!(requests(&keys, "i-amo"), 1, "{:?}", keys.lock().unwrap());
    assert_eq!(requests(&keys, "i-handled"), 1, "{:?}", keys.lock().unwrap());
    assert_eq!(requests(&keys, "i-alo"), 2, "{:?}", keys.lock().unwrap());
    // The interruption is an input in the journal (a replay sees the same failure).
    assert!(
        journaled_interruption(&api, "i-amo"),
        "{}",
        api.get("instances/i-amo/history")
    );
    // The store says it holds atMostOnce calls, so versions that would make them again refuse it.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let format: String = conn
        .query_row("SELECT value FROM sm4c_meta WHERE key = 'format'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(format, "sm4c-store-3");
}

#[test]
fn a_store_without_at_most_once_calls_keeps_its_format() {
    let dir = tempfile::tempdir().unwrap();
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).unwrap();
    let keys: Arc<Mutex<Vec<String>>> = Arc::default();
    let server = pay_api(keys.clone());
    std::fs::write(defs.join("pay.openapi"), openapi(&server).to_string()).unwrap();
    let alo = sm4c_definitions().pop().unwrap();
    std::fs::write(defs.join("alo.json"), alo.to_string()).unwrap();
    let db = dir.path().join("s.db");
    let log = dir.path().join("serve.log");
    let serving = serve(&defs, &db, None, &log);
    let api = Api::new(serving.url());
    api.start("alo", "i-1");
    wait("the call", &|| keys.lock().unwrap().len() == 1);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let format: String = conn
        .query_row("SELECT value FROM sm4c_meta WHERE key = 'format'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(format, "sm4c-store-2");
    let rows: Vec<String> = conn
        .prepare("SELECT entry FROM journal WHERE instance = 'i-1'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        !rows.is_empty() && rows.iter().all(|r| !r.contains("delivery")),
        "{rows:?}"
    );
}

const CHARGE: &str = "arn:aws:lambda:us-east-1:123456789012:function:charge";
const CHARGE_AGAIN: &str = "arn:aws:lambda:us-east-1:123456789012:function:charge-again";

fn asl_definition(resource: &str) -> Value {
    json!({
        "StartAt": "Charge",
        "States": {
            "Charge": {
                "Type": "Task", "Resource": resource,
                "Parameters": {"amount.$": "$.amount"},
                "ResultPath": "$.charge",
                "Catch": [{"ErrorEquals": ["stepInterrupted"], "ResultPath": "$.interrupted", "Next": "Interrupted"}],
                "End": true
            },
            "Interrupted": {"Type": "Pass", "End": true}
        }
    })
}

#[test]
fn an_asl_resource_the_configuration_makes_at_most_once_is_not_called_again_after_a_sigkill() {
    let keys: Arc<Mutex<Vec<String>>> = Arc::default();
    let server = pay_api(keys.clone());
    let dir = tempfile::tempdir().unwrap();
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).unwrap();
    std::fs::write(defs.join("pay.openapi"), openapi(&server).to_string()).unwrap();
    std::fs::write(defs.join("once.asl.json"), asl_definition(CHARGE).to_string()).unwrap();
    std::fs::write(defs.join("again.asl.json"), asl_definition(CHARGE_AGAIN).to_string()).unwrap();
    let config = defs.join("sm4c.toml");
    std::fs::write(
        &config,
        format!(
            "[asl.resources.\"{CHARGE}\"]\nrest = \"pay.openapi#charge\"\ndelivery = \"atMostOnce\"\n\n[asl.resources.\"{CHARGE_AGAIN}\"]\nrest = \"pay.openapi#charge\"\n"
        ),
    )
    .unwrap();
    let db = dir.path().join("s.db");
    let log = dir.path().join("serve.log");
    let mut serving = serve(&defs, &db, Some(&config), &log);
    let api = Api::new(serving.url());
    api.start("once", "e-once");
    api.start("again", "e-again");
    wait("two calls in flight", &|| keys.lock().unwrap().len() == 2);
    // The restart listens on a new port.
    serving.restart();
    let api = Api::new(serving.url());
    wait("both executions to end", &|| {
        api.ended("e-once") && api.ended("e-again")
    });
    let once = api.instance("e-once");
    assert_eq!(once["status"], "completed", "{once}");
    assert_eq!(once["data"]["interrupted"]["Error"], "stepInterrupted", "{once}");
    assert!(
        once["data"]["interrupted"]["Cause"]
            .as_str()
            .unwrap_or("")
            .contains("atMostOnce"),
        "{once}"
    );
    let again = api.instance("e-again");
    assert_eq!(again["status"], "completed", "{again}");
    assert_eq!(again["data"]["charge"], json!({"charged": {"amount": 12}}), "{again}");
    assert_eq!(requests(&keys, "e-once"), 1, "{:?}", keys.lock().unwrap());
    assert_eq!(requests(&keys, "e-again"), 2, "{:?}", keys.lock().unwrap());
}

#[test]
fn a_bad_delivery_in_the_configuration_file_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let def = dir.path().join("d.asl.json");
    std::fs::write(&def, asl_definition(CHARGE).to_string()).unwrap();
    let config = dir.path().join("bad.toml");
    let check = |text: &str| -> (i32, String) {
        std::fs::write(&config, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_sm4c"))
            .arg("run")
            .arg(&def)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = check(&format!(
        "[asl.resources.\"{CHARGE}\"]\nrest = \"pay.openapi#charge\"\ndelivery = \"once\"\n"
    ));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("line 3") && err.contains("delivery = \"once\" is not a delivery"),
        "{err}"
    );
    let (code, err) =
        check("[asl.resources.\"x.waitForTaskToken\"]\nworker = \"approvals\"\ndelivery = \"atMostOnce\"\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 3") && err.contains("worker task"), "{err}");
}

#[test]
fn sm4c_run_accepts_at_most_once_and_makes_each_call_once() {
    // The in-memory host has no crash to recover from: the field is checked and the call made once.
    let dir = tempfile::tempdir().unwrap();
    let keys: Arc<Mutex<Vec<String>>> = Arc::default();
    let server = pay_api_after(keys.clone(), Duration::ZERO);
    let def = sm4c_definitions().remove(0);
    assert_eq!(def["functions"][0]["delivery"], "atMostOnce");
    std::fs::write(dir.path().join("pay.openapi"), openapi(&server).to_string()).unwrap();
    let path = dir.path().join("amo.json");
    std::fs::write(&path, def.to_string()).unwrap();
    let input = dir.path().join("in.json");
    std::fs::write(&input, json!({"amount": 3}).to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sm4c"))
        .arg("run")
        .arg(&path)
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["charge"], json!({"charged": {"amount": 3}}), "{v}");
    assert_eq!(keys.lock().unwrap().len(), 1);
}
