//! REST functions through OpenAPI against a real axum server: path, query, header and body
//! parameters, a 500, a slow endpoint and the action timeout, retries with their
//! Idempotency-Key, server overrides, credentials from the environment, YAML documents, and a call
//! made again with the same key after `sm4c serve` is killed mid-call.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

use crate::support::server;
use server::{Serve, Server};

/// `sm4c serve` of the definitions in `defs` on the store `db`, once it answers `/healthz`.
fn serve(defs: &std::path::Path, db: &std::path::Path) -> Server {
    Serve::new().db(db).arg("--definitions").arg(defs).start()
}

/// Starts the test API on a free port in a background thread; returns its base URL.
fn api(seen: Seen) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let app = Router::new()
                .route(
                    "/items/{id}",
                    get(|Path(id): Path<String>, Query(q): Query<HashMap<String, String>>, h: HeaderMap| async move {
                        Json(json!({"id": id, "verbose": q.get("verbose"), "tenant": h.get("x-tenant").and_then(|v| v.to_str().ok())}))
                    }),
                )
                .route(
                    "/orders",
                    post(|h: HeaderMap, Json(body): Json<Value>| async move {
                        if h.get("x-api-key").and_then(|v| v.to_str().ok()) != Some("s3cret") {
                            return (StatusCode::UNAUTHORIZED, Json(json!({"reason": "no key"})));
                        }
                        (StatusCode::CREATED, Json(json!({"accepted": body})))
                    }),
                )
                .route("/fail", get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"reason": "boom"}))) }))
                .route(
                    "/slow",
                    get(|| async {
                        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                        Json(json!("late"))
                    }),
                )
                .route(
                    "/flaky",
                    get(|State(seen): State<Seen>, h: HeaderMap| async move {
                        let key = h.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                        let mut s = seen.0.lock().unwrap();
                        s.push(key.clone());
                        if s.len() == 1 {
                            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"retry": true})))
                        } else {
                            (StatusCode::OK, Json(json!({"key": key})))
                        }
                    }),
                )
                .with_state(seen);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

fn openapi(server: &str) -> Value {
    json!({
        "openapi": "3.0.1",
        "servers": [{"url": server}],
        "paths": {
            "/items/{id}": {"parameters": [{"name": "id", "in": "path", "required": true}],
                "get": {"operationId": "getItem", "parameters": [
                    {"name": "verbose", "in": "query"}, {"name": "x-tenant", "in": "header"}]}},
            "/orders": {"post": {"operationId": "createOrder"}},
            "/fail": {"get": {"operationId": "fail"}},
            "/slow": {"get": {"operationId": "slow"}},
            "/flaky": {"get": {"operationId": "flaky"}}
        }
    })
}

fn definition(doc: &str, state: Value) -> Value {
    let functions: Vec<Value> = ["getItem", "createOrder", "fail", "slow", "flaky"]
        .iter()
        .map(|op| json!({"name": op, "operation": format!("{doc}#{op}")}))
        .collect();
    json!({
        "id": "rest", "name": "rest", "version": "1",
        "functions": functions,
        "retries": [{"name": "again", "delay": "0.1s", "maxAttempts": 2}],
        "states": [state]
    })
}

fn run(dir: &std::path::Path, def: &Value, extra: &[&str], env: &[(&str, &str)]) -> (i32, Value, String) {
    std::fs::write(dir.join("def.json"), def.to_string()).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sm4c"));
    cmd.arg("run").arg(dir.join("def.json")).args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        stdout,
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn call(name: &str, function: &str, args: Value) -> Value {
    json!({"name": name, "type": "invokeFunction", "functionName": function, "arguments": args, "waitForCompletion": true})
}

#[test]
fn rest_functions_fill_parameters_and_body_and_carry_credentials() {
    let server = api(Seen::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("api.json"), openapi(&server).to_string()).unwrap();
    let def = definition(
        "file://api.json",
        json!({"name": "A", "start": true,
        "enterAction": {"type": "sequence", "actions": [
            call("item", "getItem", json!({"id": "a b", "verbose": true, "x-tenant": "t1"})),
            call("order", "createOrder", json!({"sku": "${ .sku }", "qty": 2}))]},
        "enterResultHandler": "${ .out = $value }"}),
    );
    std::fs::write(dir.path().join("in.json"), r#"{"sku": "X-1"}"#).unwrap();
    let input = dir.path().join("in.json");
    let header = "file://api.json=x-api-key:env:API_KEY";
    let (code, out, err) = run(
        dir.path(),
        &def,
        &["--input", input.to_str().unwrap(), "-v", "--rest-header", header],
        &[("API_KEY", "s3cret")],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out["out"]["item"],
        json!({"id": "a b", "verbose": "true", "tenant": "t1"})
    );
    assert_eq!(out["out"]["order"], json!({"accepted": {"sku": "X-1", "qty": 2}}));
    assert!(!err.contains("s3cret"), "credentials must not reach the output: {err}");
}

#[test]
fn http_errors_are_function_errors_that_handlers_see() {
    let server = api(Seen::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("api.json"), openapi(&server).to_string()).unwrap();
    let mut failing = call("f", "fail", json!({}));
    failing["errorHandlers"] =
        json!([{"condition": "${ .details.status == 500 }", "resultHandler": "${ .error = $value }"}]);
    let def = definition(
        "file://api.json",
        json!({"name": "A", "start": true, "enterAction": failing}),
    );
    let (code, out, err) = run(dir.path(), &def, &["--virtual-time"], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out["error"]["type"], "functionError");
    assert_eq!(out["error"]["details"]["status"], 500);
    assert_eq!(out["error"]["details"]["body"], json!({"reason": "boom"}));
    assert!(
        out["error"]["message"].as_str().unwrap().contains("answered 500"),
        "{out}"
    );
    // Unhandled: the instance fails with the function error.
    let def = definition(
        "file://api.json",
        json!({"name": "A", "start": true, "enterAction": call("f", "fail", json!({}))}),
    );
    let (code, out, _) = run(dir.path(), &def, &[], &[]);
    assert_eq!(code, 1);
    assert_eq!(out["type"], "functionError");
}

#[test]
fn a_slow_endpoint_hits_the_action_timeout() {
    let server = api(Seen::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("api.json"), openapi(&server).to_string()).unwrap();
    let mut slow = call("s", "slow", json!({}));
    slow["timeout"] = json!("0.3s");
    let def = definition(
        "file://api.json",
        json!({"name": "A", "start": true, "enterAction": slow, "enterResultHandler": "${ .r = $value }"}),
    );
    let (code, out, err) = run(dir.path(), &def, &[], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        json!({"r": null}),
        "the seed: when the timeout is reached, the result is null"
    );
}

#[test]
fn retries_reach_the_server_with_their_idempotency_keys_and_yaml_documents_work() {
    let seen = Seen::default();
    let server = api(seen.clone());
    let dir = tempfile::tempdir().unwrap();
    // A YAML document whose servers are wrong, corrected by --rest-server.
    let yaml = "openapi: 3.0.1\nservers:\n  - url: http://127.0.0.1:9\npaths:\n  /flaky:\n    get:\n      operationId: flaky\n";
    std::fs::write(dir.path().join("api.yaml"), yaml).unwrap();
    let mut flaky = call("x", "flaky", json!({}));
    flaky["errorHandlers"] = json!([{"retryPolicy": "again"}]);
    let def = definition(
        "file://api.yaml",
        json!({"name": "A", "start": true, "enterAction": flaky, "enterResultHandler": "${ .r = $value }"}),
    );
    let (code, out, err) = run(
        dir.path(),
        &def,
        &["--rest-server", &format!("file://api.yaml={server}")],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out["r"]["key"], "rest-run/1.enter#2");
    assert_eq!(
        *seen.0.lock().unwrap(),
        vec!["rest-run/1.enter".to_string(), "rest-run/1.enter#2".to_string()]
    );
}

#[test]
fn an_unreachable_server_is_a_function_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("api.json"), openapi("http://127.0.0.1:9").to_string()).unwrap();
    let def = definition(
        "file://api.json",
        json!({"name": "A", "start": true, "enterAction": call("i", "getItem", json!({"id": 1}))}),
    );
    let (code, out, _) = run(dir.path(), &def, &[], &[]);
    assert_eq!(code, 1);
    assert_eq!(out["type"], "functionError");
    assert_eq!(out["details"]["kind"], "connection", "{out}");
}

#[test]
fn rest_functions_work_through_sm4c_serve() {
    let server = api(Seen::default());
    let dir = tempfile::tempdir().unwrap();
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).unwrap();
    // The document gets its own extension so that serve does not read it as a definition.
    std::fs::write(defs.join("api.openapi"), openapi(&server).to_string()).unwrap();
    let def = definition(
        "file://api.openapi",
        json!({"name": "A", "start": true,
        "enterAction": call("item", "getItem", json!({"id": "${ .id }", "verbose": 1})),
        "enterResultHandler": "${ .item = $value }"}),
    );
    std::fs::write(defs.join("def.json"), def.to_string()).unwrap();
    let server = serve(&defs, &dir.path().join("s.db"));
    let base = server.url().to_string();
    let client = reqwest::blocking::Client::new();
    let r = client
        .post(format!("{base}/instances"))
        .json(&json!({"definition": "rest", "id": "r1", "input": {"id": "42"}}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 201);
    let mut v = Value::Null;
    for _ in 0..100 {
        v = client
            .get(format!("{base}/instances/r1"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        if v["status"] == "completed" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["data"]["item"], json!({"id": "42", "verbose": "1", "tenant": null}));
}

/// A service that records the Idempotency-Key of every `POST /reserve` and answers the first call
/// for each key after 3 s (so that a test can kill sm4c while calls are in flight).
fn reserve_api(keys: Arc<Mutex<Vec<String>>>) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let app = Router::new().route(
                "/reserve",
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
                            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                        }
                        Json(json!({"reserved": body["sku"]}))
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

#[test]
fn a_call_in_flight_when_sm4c_serve_is_killed_is_made_again_with_the_same_idempotency_key() {
    let keys: Arc<Mutex<Vec<String>>> = Arc::default();
    let server = reserve_api(keys.clone());
    let dir = tempfile::tempdir().unwrap();
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).unwrap();
    let doc = json!({"openapi": "3.1.0", "info": {"title": "stock", "version": "1"}, "servers": [{"url": server}],
        "paths": {"/reserve": {"post": {"operationId": "reserve",
            "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}}}}}});
    // Not `.json`: every `.json` file in the definitions folder must be a definition.
    std::fs::write(defs.join("stock.openapi"), doc.to_string()).unwrap();
    let def = json!({"id": "reserve", "name": "reserve", "version": "1",
    "functions": [{"name": "reserve", "operation": "file://stock.openapi#reserve"}],
    "states": [
        {"name": "Reserve", "start": true,
         "enterAction": call("r", "reserve", json!({"sku": "${ .sku }"})),
         "enterResultHandler": "${ .reservation = $value }",
         "transitions": [{"nextState": "Done"}]},
        {"name": "Done"}
    ]});
    std::fs::write(defs.join("reserve.json"), def.to_string()).unwrap();
    let client = reqwest::blocking::Client::new();
    let db = dir.path().join("s.db");
    let wait = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    let mut server = serve(&defs, &db);
    let base = server.url().to_string();
    for i in 0..5 {
        let r = client
            .post(format!("{base}/instances"))
            .json(&json!({"definition": "reserve", "id": format!("o{i}"), "input": {"sku": format!("sku-{i}")}}))
            .send()
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    // Every call has reached the service, none has been answered: kill -9 now.
    wait("five calls in flight", &|| keys.lock().unwrap().len() == 5);
    server.kill();
    // The restart listens on a new port.
    server.restart();
    let base = server.url().to_string();
    let state = |i: usize| -> Value {
        client
            .get(format!("{base}/instances/o{i}"))
            .send()
            .unwrap()
            .json()
            .unwrap()
    };
    wait("the reservations", &|| (0..5).all(|i| state(i)["state"] == "Done"));
    for i in 0..5 {
        assert_eq!(state(i)["data"]["reservation"], json!({"reserved": format!("sku-{i}")}));
    }
    // At least once, never with a new key: each call was made again with the key it had.
    let seen = keys.lock().unwrap().clone();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for k in &seen {
        *counts.entry(k.clone()).or_default() += 1;
    }
    assert_eq!(counts.len(), 5, "{counts:?}");
    assert!(counts.iter().all(|(k, n)| *n == 2 && k.starts_with('o')), "{counts:?}");
}
