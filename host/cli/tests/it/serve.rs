//! `sm4c serve` as clients see it: the HTTP API and the CLI client commands, run against the real
//! binary started as a child process (one server and one fresh store per test).

use reqwest::blocking::{Client, RequestBuilder};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

use crate::support::run::sm4c;
use crate::support::server;
use server::{Serve, Server, BIN};

/// Longest a server may take to answer `/healthz`, an instance to reach a status, or a command to end.
const DEADLINE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// Definitions
// ---------------------------------------------------------------------------------------------

/// Waits for `com.example.paid` from `shop` whose `customerid` is the instance's `.customerId`.
fn waiter() -> Value {
    json!({
        "id": "waiter", "name": "Waiter", "version": "1",
        "events": [{
            "name": "paid", "type": "com.example.paid", "source": "shop",
            "correlation": [{"contextAttributeName": "customerid", "contextAttributeValue": "${ .customerId }"}]
        }],
        "states": [
            {"name": "Wait", "start": true, "transitions": [{
                "nextState": "Done",
                "eventGroups": [{"events": ["paid"], "resultHandler": "${ .paid = ($value | .data) }"}]
            }]},
            {"name": "Done"}
        ]
    })
}

/// Waits for the `com.example.x` event that [`sender`] sends, correlated on `customerid`.
fn receiver() -> Value {
    json!({
        "id": "receiver", "name": "Receiver", "version": "1",
        "events": [{
            "name": "x", "type": "com.example.x", "source": "sender",
            "correlation": [{"contextAttributeName": "customerid", "contextAttributeValue": "${ .customerId }"}]
        }],
        "states": [
            {"name": "Wait", "start": true, "transitions": [{
                "nextState": "Done",
                "eventGroups": [{"events": ["x"], "resultHandler": "${ .got = ($value | .data) }"}]
            }]},
            {"name": "Done"}
        ]
    })
}

/// Sends `com.example.x` with data `{n}` and extension `customerid`, then completes.
fn sender() -> Value {
    json!({
        "id": "sender", "name": "Sender", "version": "1",
        "events": [{"name": "x", "type": "com.example.x", "source": "sender"}],
        "states": [{"name": "Send", "start": true, "enterAction": {
            "type": "sendEvent", "event": "x", "expression": "${ {n: .n} }",
            "contextAttributes": {"customerid": "${ .customerId }"}
        }}]
    })
}

/// Waits 0.2 s, then completes.
fn delayed() -> Value {
    json!({
        "id": "delayed", "name": "Delayed", "version": "1",
        "states": [
            {"name": "Pause", "start": true, "enterAction": {"type": "delay", "timeout": "0.2s"},
             "transitions": [{"nextState": "Done"}]},
            {"name": "Done"}
        ]
    })
}

/// Calls function `double` and stores its result in `.result`.
fn doubler() -> Value {
    json!({
        "id": "doubler", "name": "Doubler", "version": "1",
        "functions": [{"name": "double", "operation": "http://example.org/math.json#double"}],
        "states": [{"name": "Call", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "double", "waitForCompletion": true,
                            "arguments": {"n": "${ .n }"}},
            "enterResultHandler": "${ .result = $value }"}]
    })
}

/// Completes at once, greeting `.name`.
fn hello() -> Value {
    json!({
        "id": "hello", "name": "Hello", "version": "1",
        "states": [{"name": "Hello", "start": true,
            "enterAction": {"type": "injectData", "expression": "${ \"Hello \" + .name }"},
            "enterResultHandler": "${ .greeting = $value }"}]
    })
}

/// Waits for an event that never comes, with an instance timeout of 0.2 s.
fn expiring() -> Value {
    let mut d = waiter();
    d["id"] = json!("expiring");
    d["timeout"] = json!({"duration": "0.2s"});
    d
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// Starts `sm4c serve` on a fresh store with `extra` flags and waits until `/healthz` answers.
fn serve(extra: &[&str]) -> Server {
    Serve::new().args(extra).start()
}

/// [`serve`] with the store in `dir` (which holds the files `extra` names).
fn serve_in(dir: TempDir, extra: &[&str]) -> Server {
    Serve::new()
        .db(dir.path().join("sm4c.db"))
        .log(dir.path().join("server.log"))
        .args(extra)
        .keep(dir)
        .start()
}

/// Sends a request and returns (status, JSON body or Null).
fn answer(req: RequestBuilder) -> (u16, Value) {
    let resp = req.send().expect("request answered");
    let status = resp.status().as_u16();
    let text = resp.text().expect("response body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// What these tests ask of a server.
trait Api {
    fn stderr(&self) -> String;
    fn get(&self, path: &str) -> (u16, Value);
    fn post(&self, path: &str, body: &Value) -> (u16, Value);
    fn define(&self, doc: &Value);
    fn start(&self, definition: &str, id: &str, input: Value) -> String;
    fn instance(&self, id: &str) -> Value;
    fn wait_status(&self, id: &str, status: &str) -> Value;
    fn send_structured(&self, event: &Value) -> (u16, Value);
    fn list_all(&self, query: &str, limit: usize) -> Vec<Value>;
}

impl Api for Server {
    fn stderr(&self) -> String {
        self.log()
    }

    fn get(&self, path: &str) -> (u16, Value) {
        answer(self.client().get(format!("{}{path}", self.url())))
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        answer(self.client().post(format!("{}{path}", self.url())).json(body))
    }

    fn define(&self, doc: &Value) {
        let (code, body) = self.post("/definitions", doc);
        assert!(code == 201 || code == 200, "defining {}: {code} {body}", doc["id"]);
    }

    /// Starts an instance and returns its id.
    fn start(&self, definition: &str, id: &str, input: Value) -> String {
        let (code, body) = self.post(
            "/instances",
            &json!({"definition": definition, "id": id, "input": input}),
        );
        assert_eq!(code, 201, "starting {id}: {body}");
        assert_eq!(body["id"], json!(id));
        body["id"].as_str().expect("id").to_string()
    }

    fn instance(&self, id: &str) -> Value {
        let (code, body) = self.get(&format!("/instances/{id}"));
        assert_eq!(code, 200, "GET /instances/{id}: {body}");
        body
    }

    /// Polls the instance until it has `status`; returns it.
    fn wait_status(&self, id: &str, status: &str) -> Value {
        let started = Instant::now();
        loop {
            let v = self.instance(id);
            if v["status"] == json!(status) {
                return v;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "instance {id} did not become {status} within {DEADLINE:?}; it is {v}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Posts a CloudEvent in structured mode.
    fn send_structured(&self, event: &Value) -> (u16, Value) {
        answer(
            self.client()
                .post(format!("{}/events", self.url()))
                .header("content-type", "application/cloudevents+json")
                .body(event.to_string()),
        )
    }

    /// Every instance of the listing, walking the pages with `after=next`.
    fn list_all(&self, query: &str, limit: usize) -> Vec<Value> {
        let mut all = Vec::new();
        let mut after = String::new();
        for _ in 0..10_000 {
            let (code, page) = self.get(&format!("/instances?limit={limit}&after={after}{query}"));
            assert_eq!(code, 200, "{page}");
            let rows = page["instances"].as_array().expect("instances array");
            assert!(rows.len() <= limit, "page longer than limit {limit}: {page}");
            all.extend(rows.iter().cloned());
            match &page["next"] {
                Value::Null => return all,
                Value::String(n) => after = n.clone(),
                other => panic!("`next` must be a string or null, not {other}"),
            }
        }
        panic!("pagination never ended");
    }
}

fn ids(rows: &[Value]) -> Vec<String> {
    rows.iter().map(|r| r["id"].as_str().expect("id").to_string()).collect()
}

fn assert_error(code: u16, body: &Value, want_code: u16, want_error: &str) {
    assert_eq!(code, want_code, "expected {want_code} {want_error}, got {code} {body}");
    assert_eq!(body["error"], json!(want_error), "error code of {body}");
    assert!(body["message"].is_string(), "error without a message: {body}");
}

fn write(dir: &Path, name: &str, v: &Value) -> String {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).expect("json")).expect("write file");
    p.to_str().expect("utf-8 path").to_string()
}

fn parse(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{stdout}"))
}

// ---------------------------------------------------------------------------------------------
// Service endpoints
// ---------------------------------------------------------------------------------------------

#[test]
fn healthz_openapi_and_unknown_routes() {
    let s = serve(&[]);
    assert_eq!(s.get("/healthz"), (200, json!({"status": "ok"})));

    let resp = s
        .client()
        .get(format!("{}/openapi.json", s.url()))
        .send()
        .expect("openapi");
    assert_eq!(resp.status().as_u16(), 200);
    let ctype = resp.headers()["content-type"].to_str().unwrap_or_default().to_string();
    assert!(ctype.starts_with("application/json"), "content-type {ctype}");
    let doc: Value = serde_json::from_str(&resp.text().expect("body")).expect("OpenAPI document is JSON");
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.1")),
        "not OpenAPI 3.1: {}",
        doc["openapi"]
    );
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    let routes = [
        ("/definitions", &["get", "post"][..]),
        ("/definitions/{id}", &["get"]),
        ("/instances", &["get", "post"]),
        ("/instances/{id}", &["get"]),
        ("/instances/{id}/history", &["get"]),
        ("/instances/{id}/cancel", &["post"]),
        ("/events", &["post"]),
        ("/events/sent", &["get"]),
        ("/openapi.json", &["get"]),
        ("/healthz", &["get"]),
    ];
    for (path, methods) in routes {
        let item = &doc["paths"][path];
        assert!(item.is_object(), "OpenAPI document lacks path {path}");
        for m in methods {
            assert!(item[m].is_object(), "OpenAPI document lacks {m} {path}");
        }
    }

    // The members of a group are those of Kafka mode.
    let (code, body) = s.get("/members");
    assert_error(code, &body, 501, "notSupported");

    let (code, body) = s.get("/no/such/route");
    assert_eq!(code, 404, "{body}");
    assert!(
        body["error"].is_string() && body["message"].is_string(),
        "404 is not a JSON error: {body}"
    );
    let (code, body) = s.post("/nothing-here", &json!({}));
    assert_eq!(code, 404, "{body}");
    assert!(body["error"].is_string(), "{body}");
}

// ---------------------------------------------------------------------------------------------
// Definitions
// ---------------------------------------------------------------------------------------------

#[test]
fn definitions_register_conflict_invalid_list_and_get() {
    let s = serve(&[]);
    let (code, body) = s.post("/definitions", &waiter());
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["id"], json!("waiter"));
    assert_eq!(body["version"], json!("1"));
    let (code, body) = s.post("/definitions", &waiter());
    assert_eq!(code, 200, "same definition again: {body}");

    let mut changed = waiter();
    changed["description"] = json!("changed");
    let (code, body) = s.post("/definitions", &changed);
    assert_error(code, &body, 409, "definitionConflict");

    let mut v2 = waiter();
    v2["version"] = json!("2");
    let (code, body) = s.post("/definitions", &v2);
    assert_eq!(code, 201, "a new version: {body}");

    let invalid = json!({
        "id": "broken", "name": "Broken", "version": "1",
        "states": [{"name": "A", "start": true, "transitions": [{"nextState": "Nowhere"}]}]
    });
    let (code, body) = s.post("/definitions", &invalid);
    assert_error(code, &body, 400, "invalidDefinition");
    let details = body["details"].as_array().expect("details is a list");
    assert!(!details.is_empty(), "{body}");
    for d in details {
        assert!(
            d["pointer"].as_str().is_some_and(|p| p.starts_with('/')) && d["message"].is_string(),
            "detail is not {{pointer, message}}: {d}"
        );
    }
    assert!(
        details
            .iter()
            .any(|d| d["pointer"] == json!("/states/0/transitions/0/nextState")),
        "no detail points at the bad nextState: {body}"
    );
    let (code, body) = s.post("/definitions", &json!({"id": "x"}));
    assert_error(code, &body, 400, "invalidDefinition");

    let (code, body) = s.get("/definitions");
    assert_eq!(code, 200);
    let listed: Vec<(Value, Value)> = body["definitions"]
        .as_array()
        .expect("definitions array")
        .iter()
        .map(|d| (d["id"].clone(), d["version"].clone()))
        .collect();
    assert!(listed.contains(&(json!("waiter"), json!("1"))), "{body}");
    assert!(listed.contains(&(json!("waiter"), json!("2"))), "{body}");
    assert!(
        !listed.iter().any(|(id, _)| id == "broken"),
        "invalid definition was registered: {body}"
    );

    let (code, body) = s.get("/definitions/waiter");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["id"], json!("waiter"));
    assert_eq!(body["latest"], json!("2"));
    assert_eq!(body["definition"], v2);
    assert_eq!(body["versions"].as_array().map(Vec::len), Some(2), "{body}");

    let (code, body) = s.get("/definitions/nope");
    assert_eq!(code, 404, "{body}");
    assert!(body["error"].is_string(), "{body}");
}

#[test]
fn definitions_post_rejects_bad_bodies() {
    let s = serve(&[]);
    let (code, body) = answer(
        s.client()
            .post(format!("{}/definitions", s.url()))
            .header("content-type", "application/json")
            .body("{not json"),
    );
    assert_error(code, &body, 400, "malformedJson");
    let (code, body) = answer(
        s.client()
            .post(format!("{}/definitions", s.url()))
            .body(waiter().to_string()),
    );
    assert_error(code, &body, 415, "unsupportedMediaType");
}

// ---------------------------------------------------------------------------------------------
// Instances
// ---------------------------------------------------------------------------------------------

#[test]
fn start_instance_is_idempotent_by_id() {
    let s = serve(&[]);
    s.define(&waiter());
    let (code, body) = s.post(
        "/instances",
        &json!({"definition": "waiter", "id": "w1", "input": {"customerId": "c1"}}),
    );
    assert_eq!((code, &body), (201, &json!({"id": "w1", "created": true})));

    // The same id again starts nothing new, even with other input.
    let (code, body) = s.post(
        "/instances",
        &json!({"definition": "waiter", "id": "w1", "input": {"customerId": "other"}}),
    );
    assert_eq!((code, &body), (200, &json!({"id": "w1", "created": false})));
    let v = s.instance("w1");
    assert_eq!(
        v["data"],
        json!({"customerId": "c1"}),
        "the second start changed the instance: {v}"
    );
    assert_eq!(s.list_all("&definition=waiter", 100).len(), 1);

    // Without an id, the server picks one; without input the data is {}.
    let (code, body) = s.post("/instances", &json!({"definition": "waiter"}));
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["created"], json!(true));
    let id = body["id"].as_str().expect("generated id").to_string();
    assert!(!id.is_empty() && id != "w1");
    assert_eq!(s.instance(&id)["data"], json!({}));

    // A version may be named.
    let (code, body) = s.post(
        "/instances",
        &json!({"definition": "waiter", "version": "1", "id": "w2"}),
    );
    assert_eq!(code, 201, "{body}");
    assert_eq!(s.instance("w2")["version"], json!("1"));
}

#[test]
fn start_instance_errors() {
    let s = serve(&[]);
    s.define(&waiter());
    let (code, body) = s.post("/instances", &json!({"definition": "nope"}));
    assert_error(code, &body, 404, "unknownDefinition");
    let (code, body) = s.post("/instances", &json!({"definition": "waiter", "version": "9"}));
    assert_error(code, &body, 404, "unknownDefinition");
    let (code, body) = s.post("/instances", &json!({"definition": "waiter", "colour": "red"}));
    assert_error(code, &body, 400, "malformedJson");
    let (code, body) = s.post("/instances", &json!({"input": {}}));
    assert_error(code, &body, 400, "malformedJson");
    let (code, body) = answer(
        s.client()
            .post(format!("{}/instances", s.url()))
            .header("content-type", "application/json")
            .body(r#"{"definition": "waiter""#),
    );
    assert_error(code, &body, 400, "malformedJson");
    let (code, body) = answer(
        s.client()
            .post(format!("{}/instances", s.url()))
            .body(json!({"definition": "waiter"}).to_string()),
    );
    assert_error(code, &body, 415, "unsupportedMediaType");
    // Ids: 1 to 200 characters, no control character (hosts keep their own records under keys
    // that start with one).
    for id in ["", "\u{0}sub/x", "a\nb", &"x".repeat(201)] {
        let (code, body) = s.post("/instances", &json!({"definition": "waiter", "id": id}));
        assert_error(code, &body, 400, "invalidId");
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.contains("control character")),
            "{body}"
        );
    }
    assert!(s.list_all("", 100).is_empty(), "a refused start created an instance");
}

#[test]
fn instance_shape_and_statuses() {
    let s = serve(&[]);
    for d in [waiter(), hello(), doubler(), expiring()] {
        s.define(&d);
    }

    let w = s.start("waiter", "w", json!({"customerId": "c1"}));
    let v = s.wait_status(&w, "waiting");
    for k in ["id", "definition", "version", "status", "state", "data", "startedAt"] {
        assert!(v.get(k).is_some(), "{k} missing from {v}");
    }
    assert_eq!(v["id"], json!("w"));
    assert_eq!(v["definition"], json!("waiter"));
    assert_eq!(v["version"], json!("1"));
    assert_eq!(v["state"], json!("Wait"));
    assert_eq!(v["data"], json!({"customerId": "c1"}));
    assert!(v.get("endedAt").is_none(), "a waiting instance has endedAt: {v}");
    assert!(v.get("error").is_none(), "{v}");
    let started = v["startedAt"].as_str().expect("startedAt is a string");
    assert!(
        started.len() >= 20 && started.as_bytes()[10] == b'T' && (started.ends_with('Z') || started.contains('+')),
        "startedAt is not RFC 3339: {started}"
    );

    s.start("hello", "h", json!({"name": "Ada"}));
    let v = s.wait_status("h", "completed");
    assert_eq!(v["data"]["greeting"], json!("Hello Ada"));
    assert!(v["endedAt"].is_string(), "a completed instance has no endedAt: {v}");
    assert!(v.get("error").is_none(), "{v}");

    // No --mock: the call fails and so does the instance.
    s.start("doubler", "d", json!({"n": 2}));
    let v = s.wait_status("d", "failed");
    assert!(
        v["error"]["type"].is_string() && v["error"]["message"].is_string(),
        "{v}"
    );
    assert!(v["endedAt"].is_string(), "{v}");

    s.start("expiring", "e", json!({"customerId": "c9"}));
    let v = s.wait_status("e", "timedOut");
    assert!(v["endedAt"].is_string(), "{v}");

    let (code, body) = s.get("/instances/nope");
    assert_error(code, &body, 404, "unknownInstance");
}

#[test]
fn delay_runs_on_the_server_clock() {
    let s = serve(&[]);
    s.define(&delayed());
    let t0 = Instant::now();
    s.start("delayed", "p", json!({}));
    let v = s.instance("p");
    assert_ne!(v["status"], json!("completed"), "the 0.2s delay finished at once: {v}");
    assert_eq!(v["state"], json!("Pause"));
    let v = s.wait_status("p", "completed");
    assert!(
        t0.elapsed() >= Duration::from_millis(200),
        "completed after {:?}",
        t0.elapsed()
    );
    assert!(v["endedAt"].is_string());
}

#[test]
fn mock_functions_answer_calls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = write(dir.path(), "mocks.json", &json!({"double": ".n * 2"}));
    let s = serve_in(dir, &["--mock", &mock]);
    s.define(&doubler());
    s.start("doubler", "d", json!({"n": 21}));
    let v = s.wait_status("d", "completed");
    assert_eq!(v["data"], json!({"n": 21, "result": 42}));
}

#[test]
fn list_instances_paginates_and_filters() {
    let s = serve(&[]);
    s.define(&waiter());
    s.define(&hello());
    let mut waiting = Vec::new();
    let mut done = Vec::new();
    for i in 0..13 {
        waiting.push(s.start("waiter", &format!("w{i:02}"), json!({"customerId": format!("c{i}")})));
    }
    for i in 0..12 {
        done.push(s.start("hello", &format!("h{i:02}"), json!({"name": "x"})));
    }
    for id in &done {
        s.wait_status(id, "completed");
    }

    for limit in [1, 7, 25, 1000] {
        let all = ids(&s.list_all("", limit));
        let unique: HashSet<&String> = all.iter().collect();
        assert_eq!(unique.len(), all.len(), "duplicates with limit {limit}: {all:?}");
        let mut want: Vec<String> = waiting.iter().chain(&done).cloned().collect();
        let mut got = all.clone();
        want.sort();
        got.sort();
        assert_eq!(got, want, "limit {limit}");
    }

    let rows = s.list_all("", 100);
    for r in &rows {
        for k in ["id", "definition", "version", "status"] {
            assert!(r.get(k).is_some(), "{k} missing from listed {r}");
        }
    }

    let mut got = ids(&s.list_all("&status=waiting", 5));
    got.sort();
    assert_eq!(got, waiting);
    let mut got = ids(&s.list_all("&status=completed", 5));
    got.sort();
    assert_eq!(got, done);
    let mut got = ids(&s.list_all("&definition=hello", 4));
    got.sort();
    assert_eq!(got, done);
    assert!(s.list_all("&definition=waiter&status=completed", 10).is_empty());

    // The last page says there is no next one.
    let (code, page) = s.get("/instances?limit=1000");
    assert_eq!(code, 200);
    assert_eq!(page["next"], Value::Null, "{}", page["next"]);

    for bad in ["abc", "-x", "1.5"] {
        let (code, body) = s.get(&format!("/instances?after={bad}"));
        assert_error(code, &body, 400, "invalidCursor");
    }
}

#[test]
fn bad_query_parameters_get_json_errors() {
    // openapi.json documents every 400 as an `Error` JSON object.
    let s = serve(&[]);
    s.define(&waiter());
    s.start("waiter", "w", json!({"customerId": "c1"}));
    for path in [
        "/instances?limit=abc",
        "/instances/w/history?limit=-1",
        "/events/sent?limit=many",
    ] {
        let resp = s.client().get(format!("{}{path}", s.url())).send().expect("answered");
        let code = resp.status().as_u16();
        let ctype = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let text = resp.text().expect("body");
        assert_eq!(code, 400, "GET {path}: {text}");
        let body: Value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("GET {path}: 400 body is not JSON ({ctype}): {text:?}"));
        assert!(
            body["error"].is_string() && body["message"].is_string(),
            "GET {path}: {body}"
        );
    }
}

#[test]
fn ids_with_reserved_characters() {
    let s = serve(&[]);
    s.define(&waiter());
    s.start("waiter", "order 1/a?b#c", json!({"customerId": "c1"}));
    let (code, body) = s.get("/instances/order%201%2Fa%3Fb%23c");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["id"], json!("order 1/a?b#c"));
    let (code, body) = s.get("/instances/order%201%2Fa%3Fb%23c/history");
    assert_eq!(code, 200, "{body}");
    let url = s.url();
    let (code, out, err) = sm4c(&["show", "order 1/a?b#c", "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse(&out)["id"], json!("order 1/a?b#c"));
    let (code, out, err) = sm4c(&["history", "order 1/a?b#c", "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(!parse(&out).as_array().expect("array").is_empty());
    let (code, out, err) = sm4c(&["cancel", "order 1/a?b#c", "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse(&out)["status"], json!("cancelled"));
}

#[test]
fn history_entries_and_paging() {
    let s = serve(&[]);
    s.define(&waiter());
    s.start("waiter", "w", json!({"customerId": "c1"}));
    let (code, body) = s.send_structured(&json!({
        "specversion": "1.0", "id": "e1", "source": "shop", "type": "com.example.paid",
        "customerid": "c1", "datacontenttype": "application/json", "data": {"amount": 5}
    }));
    assert_eq!(code, 202, "{body}");
    s.wait_status("w", "completed");

    let (code, body) = s.get("/instances/w/history");
    assert_eq!(code, 200, "{body}");
    let entries = body["entries"].as_array().expect("entries").clone();
    assert!(entries.len() >= 3, "{body}");
    let mut last = i64::MIN;
    for e in &entries {
        let seq = e["seq"].as_i64().unwrap_or_else(|| panic!("entry without seq: {e}"));
        assert!(seq > last, "seqs not increasing: {body}");
        last = seq;
        let kind = e["entry"].as_str().unwrap_or_else(|| panic!("entry without kind: {e}"));
        assert!(["input", "effect", "trace"].contains(&kind), "entry {kind}");
        if kind == "input" {
            assert!(e["time"].is_string(), "input without time: {e}");
        }
    }
    assert_eq!(entries[0]["entry"], json!("input"));
    assert_eq!(entries[0]["input"], json!("start"), "{}", entries[0]);
    assert!(
        entries
            .iter()
            .any(|e| e["entry"] == json!("input") && e["event"]["id"] == json!("e1")),
        "the event is not in the history: {body}"
    );

    // Page by 2 and compare.
    let mut paged = Vec::new();
    let mut after = String::new();
    for _ in 0..1000 {
        let (code, page) = s.get(&format!("/instances/w/history?limit=2&after={after}"));
        assert_eq!(code, 200, "{page}");
        let rows = page["entries"].as_array().expect("entries");
        assert!(rows.len() <= 2);
        paged.extend(rows.iter().cloned());
        match &page["next"] {
            Value::String(n) => after = n.clone(),
            Value::Null => break,
            other => panic!("next {other}"),
        }
    }
    assert_eq!(paged, entries);

    let (code, body) = s.get("/instances/w/history?after=zzz");
    assert_error(code, &body, 400, "invalidCursor");
    let (code, body) = s.get("/instances/nope/history");
    assert_error(code, &body, 404, "unknownInstance");
}

#[test]
fn a_condition_that_is_not_a_boolean_does_not_fire_and_is_in_the_history() {
    let s = serve(&[]);
    s.define(&json!({
        "id": "checker", "name": "Checker", "version": "1",
        "states": [
            {"name": "Check", "start": true, "transitions": [
                {"nextState": "Truthy", "condition": "${ .status }"},
                {"nextState": "Yes", "condition": "${ .status == \"yes\" }"}
            ]},
            {"name": "Truthy"},
            {"name": "Yes"}
        ]
    }));
    s.start("checker", "c", json!({"status": "yes"}));
    let v = s.wait_status("c", "completed");
    assert_eq!(v["state"], json!("Yes"), "{v}");

    let (code, body) = s.get("/instances/c/history");
    assert_eq!(code, 200, "{body}");
    let entries = body["entries"].as_array().expect("entries");
    let noted: Vec<&Value> = entries
        .iter()
        .filter(|e| e["step"] == json!("conditionNotBoolean"))
        .collect();
    assert_eq!(noted.len(), 1, "{body}");
    let e = noted[0];
    assert_eq!(e["entry"], json!("trace"), "{e}");
    assert_eq!(e["pointer"], json!("/states/0/transitions/0/condition"), "{e}");
    assert_eq!(e["condition"], json!("${ .status }"), "{e}");
    assert_eq!(e["value"], json!("\"yes\""), "{e}");
    assert!(
        entries
            .iter()
            .any(|e| e["step"] == json!("transitionFired") && e["transition"] == json!(1) && e["next"] == json!("Yes")),
        "{body}"
    );

    let (code, out, err) = sm4c(&["history", "c", "--server", s.url()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("condition /states/0/transitions/0/condition ${ .status } yielded \"yes\", not a boolean"),
        "{out}"
    );
}

#[test]
fn cancel_instance() {
    let s = serve(&[]);
    s.define(&waiter());
    s.start("waiter", "w", json!({"customerId": "c1"}));
    let (code, body) = s.post("/instances/w/cancel", &json!({}));
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["id"], json!("w"));
    assert_eq!(body["status"], json!("cancelled"), "{body}");
    assert!(body["endedAt"].is_string(), "{body}");
    assert_eq!(s.instance("w")["status"], json!("cancelled"));

    let (code, body) = s.post("/instances/w/cancel", &json!({}));
    assert_error(code, &body, 409, "instanceEnded");
    let (code, body) = s.post("/instances/nope/cancel", &json!({}));
    assert_error(code, &body, 404, "unknownInstance");

    // A cancelled instance no longer receives events.
    let (code, body) = s.send_structured(&json!({
        "specversion": "1.0", "id": "e1", "source": "shop", "type": "com.example.paid", "customerid": "c1"
    }));
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["reached"], json!([]), "{body}");
    assert_eq!(s.instance("w")["status"], json!("cancelled"));
}

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

#[test]
fn event_binary_mode_reaches_correlated_instance() {
    let s = serve(&[]);
    s.define(&waiter());
    s.start("waiter", "w1", json!({"customerId": "c1"}));
    s.start("waiter", "w2", json!({"customerId": "c2"}));
    let (code, body) = answer(
        s.client()
            .post(format!("{}/events", s.url()))
            .header("ce-specversion", "1.0")
            .header("ce-id", "evt-1")
            .header("ce-source", "shop")
            .header("ce-type", "com.example.paid")
            .header("ce-customerid", "c1")
            .header("content-type", "application/json")
            .body(r#"{"amount": 5}"#),
    );
    assert_eq!(code, 202, "{body}");
    assert_eq!(body, json!({"reached": ["w1"], "parked": false}));
    let v = s.wait_status("w1", "completed");
    assert_eq!(v["data"]["paid"], json!({"amount": 5}), "{v}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.instance("w2")["status"], json!("waiting"));
}

#[test]
fn event_structured_mode_reaches_every_matching_instance() {
    let s = serve(&[]);
    s.define(&waiter());
    s.start("waiter", "a", json!({"customerId": "same"}));
    s.start("waiter", "b", json!({"customerId": "same"}));
    s.start("waiter", "c", json!({"customerId": "other"}));
    let (code, body) = s.send_structured(&json!({
        "specversion": "1.0", "id": "e1", "source": "shop", "type": "com.example.paid",
        "customerid": "same", "datacontenttype": "application/json", "data": {"amount": 9}
    }));
    assert_eq!(code, 202, "{body}");
    let mut reached: Vec<String> = serde_json::from_value(body["reached"].clone()).expect("reached list");
    reached.sort();
    assert_eq!(reached, ["a", "b"], "{body}");
    assert_eq!(body["parked"], json!(false));
    for id in ["a", "b"] {
        assert_eq!(s.wait_status(id, "completed")["data"]["paid"], json!({"amount": 9}));
    }
    assert_eq!(s.instance("c")["status"], json!("waiting"));

    // Wrong type or source reaches nobody (and is parked).
    let (code, body) = s.send_structured(&json!({
        "specversion": "1.0", "id": "e2", "source": "elsewhere", "type": "com.example.paid", "customerid": "other"
    }));
    assert_eq!(code, 202, "{body}");
    assert_eq!(body, json!({"reached": [], "parked": true}));
    assert_eq!(s.instance("c")["status"], json!("waiting"));
}

#[test]
fn event_with_sm4cinstanceid_goes_to_that_instance_only() {
    let s = serve(&[]);
    s.define(&waiter());
    s.start("waiter", "a", json!({"customerId": "same"}));
    s.start("waiter", "b", json!({"customerId": "same"}));
    let (code, body) = s.send_structured(&json!({
        "specversion": "1.0", "id": "e1", "source": "shop", "type": "com.example.paid",
        "customerid": "same", "sm4cinstanceid": "b", "data": {"to": "b"}
    }));
    assert_eq!(code, 202, "{body}");
    assert_eq!(body, json!({"reached": ["b"], "parked": false}));
    assert_eq!(s.wait_status("b", "completed")["data"]["paid"], json!({"to": "b"}));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.instance("a")["status"], json!("waiting"));

    // Binary mode: the extension is a ce- header.
    let (code, body) = answer(
        s.client()
            .post(format!("{}/events", s.url()))
            .header("ce-specversion", "1.0")
            .header("ce-id", "e2")
            .header("ce-source", "shop")
            .header("ce-type", "com.example.paid")
            .header("ce-customerid", "same")
            .header("ce-sm4cinstanceid", "a")
            .header("content-type", "application/json")
            .body(r#"{"to": "a"}"#),
    );
    assert_eq!(code, 202, "{body}");
    assert_eq!(body, json!({"reached": ["a"], "parked": false}));
    assert_eq!(s.wait_status("a", "completed")["data"]["paid"], json!({"to": "a"}));
}

#[test]
fn parked_event_is_given_to_an_instance_that_starts_waiting() {
    let s = serve(&[]);
    s.define(&waiter());
    let (code, body) = s.send_structured(&json!({
        "specversion": "1.0", "id": "early", "source": "shop", "type": "com.example.paid",
        "customerid": "c7", "data": {"early": true}
    }));
    assert_eq!(code, 202, "{body}");
    assert_eq!(body, json!({"reached": [], "parked": true}));

    // Another customer's instance does not take it.
    s.start("waiter", "other", json!({"customerId": "c8"}));
    s.start("waiter", "w", json!({"customerId": "c7"}));
    let v = s.wait_status("w", "completed");
    assert_eq!(v["data"]["paid"], json!({"early": true}));
    assert_eq!(s.instance("other")["status"], json!("waiting"));

    // It was given once: a later instance for the same customer keeps waiting.
    s.start("waiter", "w-again", json!({"customerId": "c7"}));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.instance("w-again")["status"], json!("waiting"));
}

#[test]
fn parked_event_expires_after_the_event_window() {
    let s = serve(&["--event-window", "300ms"]);
    s.define(&waiter());
    let (code, body) = s.send_structured(&json!({
        "specversion": "1.0", "id": "early", "source": "shop", "type": "com.example.paid", "customerid": "c7"
    }));
    assert_eq!((code, &body), (202, &json!({"reached": [], "parked": true})));
    std::thread::sleep(Duration::from_millis(800));
    s.start("waiter", "late", json!({"customerId": "c7"}));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        s.instance("late")["status"],
        json!("waiting"),
        "an expired event was delivered"
    );
}

#[test]
fn events_that_are_not_cloudevents_are_refused() {
    let s = serve(&[]);
    let post = || s.client().post(format!("{}/events", s.url()));
    // Plain JSON with no ce- headers.
    let (code, body) = answer(post().header("content-type", "application/json").body(r#"{"a": 1}"#));
    assert_error(code, &body, 400, "invalidCloudEvent");
    // Structured mode without a type.
    let (code, body) = answer(
        post()
            .header("content-type", "application/cloudevents+json")
            .body(json!({"specversion": "1.0", "id": "x", "source": "s"}).to_string()),
    );
    assert_error(code, &body, 400, "invalidCloudEvent");
    // Structured mode that is not JSON.
    let (code, body) = answer(
        post()
            .header("content-type", "application/cloudevents+json")
            .body("{nope"),
    );
    assert_error(code, &body, 400, "invalidCloudEvent");
    // Binary mode without ce-id.
    let (code, body) = answer(
        post()
            .header("ce-specversion", "1.0")
            .header("ce-source", "shop")
            .header("ce-type", "t")
            .header("content-type", "application/json")
            .body("{}"),
    );
    assert_error(code, &body, 400, "invalidCloudEvent");
}

#[test]
fn sent_events_go_to_the_outbox_and_to_waiting_instances() {
    let s = serve(&[]);
    s.define(&sender());
    s.define(&receiver());
    s.start("receiver", "b", json!({"customerId": "c1"}));
    s.start("receiver", "b-other", json!({"customerId": "c2"}));
    s.start("sender", "a", json!({"customerId": "c1", "n": 3}));
    s.wait_status("a", "completed");
    let v = s.wait_status("b", "completed");
    assert_eq!(v["data"]["got"], json!({"n": 3}), "{v}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.instance("b-other")["status"], json!("waiting"));

    let (code, body) = s.get("/events/sent");
    assert_eq!(code, 200, "{body}");
    let events = body["events"].as_array().expect("events").clone();
    assert_eq!(events.len(), 1, "{body}");
    let e = &events[0];
    assert!(e["seq"].is_i64(), "{e}");
    assert_eq!(e["instance"], json!("a"));
    assert_eq!(e["event"]["type"], json!("com.example.x"));
    assert_eq!(e["event"]["source"], json!("sender"));
    assert_eq!(e["event"]["customerid"], json!("c1"));
    assert_eq!(e["event"]["data"], json!({"n": 3}));
    assert_eq!(
        e["event"]["sm4cinstanceid"],
        json!("a"),
        "a sent event lacks sm4cinstanceid: {e}"
    );

    // Following `next` gives only newer events.
    let next = body["next"].as_str().expect("next cursor").to_string();
    let (code, page) = s.get(&format!("/events/sent?after={next}"));
    assert_eq!(code, 200);
    assert_eq!(page["events"], json!([]), "{page}");
    s.start("sender", "a2", json!({"customerId": "c2", "n": 4}));
    s.wait_status("a2", "completed");
    s.wait_status("b-other", "completed");
    let (code, page) = s.get(&format!("/events/sent?after={next}"));
    assert_eq!(code, 200);
    let newer = page["events"].as_array().expect("events");
    assert_eq!(newer.len(), 1, "{page}");
    assert_eq!(newer[0]["instance"], json!("a2"));
    assert_eq!(newer[0]["event"]["sm4cinstanceid"], json!("a2"));
    let (code, body) = s.get("/events/sent?after=bad");
    assert_error(code, &body, 400, "invalidCursor");
}

// ---------------------------------------------------------------------------------------------
// Limits and concurrency
// ---------------------------------------------------------------------------------------------

#[test]
fn bodies_over_one_mebibyte_are_refused() {
    let s = serve(&[]);
    s.define(&waiter());
    let big = "x".repeat(1024 * 1024 + 16);

    let body = json!({"definition": "waiter", "id": "big", "input": {"blob": big}});
    let (code, resp) = s.post("/instances", &body);
    assert_error(code, &resp, 413, "payloadTooLarge");
    let (code, _) = s.get("/instances/big");
    assert_eq!(code, 404, "a refused start created an instance");

    let (code, resp) = answer(
        s.client()
            .post(format!("{}/events", s.url()))
            .header("ce-specversion", "1.0")
            .header("ce-id", "big")
            .header("ce-source", "shop")
            .header("ce-type", "com.example.paid")
            .header("content-type", "application/json")
            .body(json!({"blob": big}).to_string()),
    );
    assert_error(code, &resp, 413, "payloadTooLarge");

    let (code, resp) = s.send_structured(&json!({
        "specversion": "1.0", "id": "big2", "source": "shop", "type": "com.example.paid", "data": {"blob": big}
    }));
    assert_error(code, &resp, 413, "payloadTooLarge");

    // Just under the limit is fine.
    let ok = "y".repeat(1024 * 1024 - 200);
    let (code, resp) = s.post(
        "/instances",
        &json!({"definition": "waiter", "id": "fits", "input": {"blob": ok}}),
    );
    assert_eq!(code, 201, "{resp}");
}

/// Expressions that would build too much (a signal ended the whole server for the first one) fail
/// their instance with an `expressionError` quoting them; the server goes on serving the others.
#[test]
fn expressions_that_build_too_much_fail_their_instance_only() {
    let cases = [
        (
            "${ (\"x\" * 10000000000) | length }",
            "string longer than 10485760 bytes",
        ),
        ("${ (\"x\" * 100000000) | length }", "string longer than"),
        ("${ [range(1100000)] | length }", "more than 1048576 entries"),
        (
            "${ reduce range(22) as $i ([1]; [., .]) | tostring | length }",
            "string longer than",
        ),
        (
            "${ reduce range(22) as $i ([1]; [., .]) | tojson | length }",
            "string longer than",
        ),
        (
            "${ reduce range(40) as $i (\"x\"; . + .) | length }",
            "string longer than",
        ),
        (
            "${ \"[\" + (\"0,\" * 4000000) + \"0]\" | fromjson | length }",
            "more than 67108864 bytes",
        ),
        (
            "${ \"x\" * 2000000 | gsub(\"x\"; \"y\") | length }",
            "more than 67108864 bytes",
        ),
        // Shared with itself at each step: 2^40 elements written out, in the instance's data.
        ("${ reduce range(40) as $i ([1]; [., .]) }", "more than 67108864 bytes"),
    ];
    // The fuel is raised so that the array of `range` is stopped by its size, not by its steps.
    let s = serve(&["--expression-fuel", "100000000"]);
    s.define(&hello());
    for (i, (expression, _)) in cases.iter().enumerate() {
        s.define(&json!({
            "id": format!("build{i}"), "name": "Build", "version": "1",
            "states": [{"name": "Build", "start": true,
                "enterAction": {"type": "injectData", "expression": expression},
                "enterResultHandler": "${ .n = $value }"}]
        }));
    }
    s.start("hello", "before", json!({"name": "Ada"}));
    for i in 0..cases.len() {
        s.start(&format!("build{i}"), &format!("b{i}"), json!({}));
    }
    s.start("hello", "after", json!({"name": "Bob"}));
    for (i, (expression, why)) in cases.iter().enumerate() {
        let v = s.wait_status(&format!("b{i}"), "failed");
        assert_eq!(v["error"]["type"], "expressionError", "{expression}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(why) && message.contains(expression),
            "{expression}: {v}"
        );
    }
    for (id, name) in [("before", "Ada"), ("after", "Bob")] {
        let v = s.wait_status(id, "completed");
        assert_eq!(v["data"]["greeting"], json!(format!("Hello {name}")), "{v}");
    }
    let (code, _) = s.get("/healthz");
    assert_eq!(code, 200, "the server still answers:\n{}", s.stderr());
}

#[test]
fn concurrent_starts_with_distinct_ids() {
    let s = serve(&[]);
    s.define(&waiter());
    let codes: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..50)
            .map(|i| {
                let s = &s;
                scope.spawn(move || {
                    s.post(
                        "/instances",
                        &json!({"definition": "waiter", "id": format!("c{i}"), "input": {"customerId": i}}),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    for (code, body) in &codes {
        assert_eq!(*code, 201, "{body}");
        assert_eq!(body["created"], json!(true));
    }
    let mut got = ids(&s.list_all("", 1000));
    got.sort();
    let mut want: Vec<String> = (0..50).map(|i| format!("c{i}")).collect();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn concurrent_starts_with_the_same_id() {
    let s = serve(&[]);
    s.define(&waiter());
    let results: Vec<(u16, Value, u16)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..50)
            .map(|i| {
                let s = &s;
                scope.spawn(move || {
                    let (code, body) = s.post(
                        "/instances",
                        &json!({"definition": "waiter", "id": "same", "input": {"customerId": i}}),
                    );
                    // Whoever was told the instance exists can read it at once.
                    let (get, _) = s.get("/instances/same");
                    (code, body, get)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let created = results.iter().filter(|(c, ..)| *c == 201).count();
    let existing = results.iter().filter(|(c, ..)| *c == 200).count();
    assert_eq!((created, existing), (1, 49), "{results:?}");
    for (code, body, _) in &results {
        assert_eq!(body["id"], json!("same"));
        assert_eq!(body["created"], json!(*code == 201));
    }
    assert_eq!(ids(&s.list_all("", 1000)), ["same"]);
    let not_found = results.iter().filter(|(.., get)| *get != 200).count();
    assert_eq!(
        not_found, 0,
        "GET /instances/same right after POST answered 200/201 was not 200 for {not_found} of 50 requests"
    );
}

// ---------------------------------------------------------------------------------------------
// Start-up and shutdown
// ---------------------------------------------------------------------------------------------

#[test]
fn definitions_folder_is_registered_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).expect("mkdir");
    write(&defs, "waiter.json", &waiter());
    write(&defs, "hello.json", &hello());
    std::fs::write(defs.join("README.txt"), "not a definition").expect("write");
    let s = serve_in(dir, &["--definitions", defs.to_str().expect("path")]);
    let (code, body) = s.get("/definitions");
    assert_eq!(code, 200);
    let mut listed: Vec<String> = body["definitions"]
        .as_array()
        .expect("definitions")
        .iter()
        .map(|d| d["id"].as_str().unwrap_or_default().to_string())
        .collect();
    listed.sort();
    assert_eq!(listed, ["hello", "waiter"]);
    let (code, _) = s.get("/definitions/waiter");
    assert_eq!(code, 200);
    s.start("hello", "h", json!({"name": "Bo"}));
    assert_eq!(s.wait_status("h", "completed")["data"]["greeting"], json!("Hello Bo"));
}

#[test]
fn invalid_definition_in_folder_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).expect("mkdir");
    write(&defs, "good.json", &waiter());
    let bad = write(
        &defs,
        "bad.json",
        &json!({"id": "bad", "name": "Bad", "version": "1",
                "states": [{"name": "A", "start": true, "transitions": [{"nextState": "Nowhere"}]}]}),
    );
    let db = dir.path().join("sm4c.db");
    let (code, _, err) = sm4c(&[
        "serve",
        "--db",
        db.to_str().expect("path"),
        "--listen",
        "127.0.0.1:0",
        "--definitions",
        defs.to_str().expect("path"),
    ]);
    assert_eq!(code, 2, "stderr: {err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with(&format!("{bad}: /states/0/transitions/0/nextState: "))),
        "no `FILE: /pointer: message` line for {bad}:\n{err}"
    );
}

#[test]
fn foreign_db_file_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("random.db");
    let bytes: Vec<u8> = (0..8192u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&db, bytes).expect("write");
    let (code, _, err) = sm4c(&["serve", "--db", db.to_str().expect("path"), "--listen", "127.0.0.1:0"]);
    assert_eq!(code, 2, "stderr: {err}");
    assert!(err.contains("not an sm4c store"), "stderr: {err}");
}

#[test]
fn sigterm_stops_the_server_with_exit_0() {
    let mut s = serve(&[]);
    s.define(&waiter());
    s.start("waiter", "w", json!({"customerId": "c1"}));
    let status = s.terminate();
    assert_eq!(status.code(), Some(0), "exit status {status}; stderr:\n{}", s.stderr());
}

#[test]
fn port_0_takes_a_port_the_system_picks_and_says_which_on_stdout() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("server.log");
    let mut child = Command::new(BIN)
        .arg("serve")
        .arg("--db")
        .arg(dir.path().join("sm4c.db"))
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("sm4c serve starts");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    // Read on a thread, so that a server that never says where it listens fails the test instead
    // of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut first = String::new();
        let _ = stdout.read_line(&mut first);
        let _ = tx.send(first);
        let mut rest = String::new();
        let _ = stdout.read_to_string(&mut rest);
        rest
    });
    let first = rx.recv_timeout(DEADLINE).unwrap_or_else(|_| {
        let _ = child.kill();
        panic!(
            "no line on stdout within {DEADLINE:?}; log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    let url = first
        .trim_end()
        .strip_prefix("sm4c: listening on ")
        .unwrap_or_else(|| panic!("first line on stdout: {first:?}"))
        .to_string();
    let port: u16 = url
        .strip_prefix("http://127.0.0.1:")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("not http://127.0.0.1:PORT: {url:?}"));
    assert_ne!(port, 0, "the bound port, not the one asked for");
    let (code, body) = answer(client().get(format!("{url}/healthz")));
    assert_eq!((code, body), (200, json!({"status": "ok"})), "the server is at {url}");
    let logged = std::fs::read_to_string(&log).expect("log");
    assert!(
        logged
            .lines()
            .any(|l| l.contains("sm4c serving") && l.contains(&format!("127.0.0.1:{port}"))),
        "the log line names the same address:\n{logged}"
    );
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(ok.success());
    let rest = reader.join().expect("the reader thread");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "exit status {status}");
    assert_eq!(rest, "", "nothing else on stdout");
}

#[test]
fn serve_help_says_how_it_reports_where_it_listens() {
    let (code, out, err) = sm4c(&["serve", "--help"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("sm4c: listening on URL"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// CLI client
// ---------------------------------------------------------------------------------------------

#[test]
fn cli_client_commands_with_json() {
    let s = serve(&[]);
    s.define(&waiter());
    let dir = tempfile::tempdir().expect("tempdir");
    let input = write(dir.path(), "in.json", &json!({"customerId": "c1"}));
    let url = s.url();

    let (code, out, err) = sm4c(&[
        "start", "waiter", "--input", &input, "--id", "w1", "--server", url, "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse(&out), json!({"id": "w1", "created": true}));
    let (code, out, err) = sm4c(&["start", "waiter", "--id", "w1", "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse(&out), json!({"id": "w1", "created": false}));
    let (code, out, err) = sm4c(&["start", "waiter", "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    let other = parse(&out)["id"].as_str().expect("generated id").to_string();

    let (code, out, err) = sm4c(&["list", "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    let mut got = ids(parse(&out).as_array().expect("list is an array"));
    got.sort();
    let mut want = vec!["w1".to_string(), other.clone()];
    want.sort();
    assert_eq!(got, want);

    let (code, out, err) = sm4c(&["show", "w1", "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = parse(&out);
    assert_eq!(v["id"], json!("w1"));
    assert_eq!(v["status"], json!("waiting"));
    assert_eq!(v["data"], json!({"customerId": "c1"}));

    let event = write(
        dir.path(),
        "event.json",
        &json!({"specversion": "1.0", "id": "e1", "source": "shop", "type": "com.example.paid",
                "customerid": "c1", "datacontenttype": "application/json", "data": {"amount": 1}}),
    );
    let (code, out, err) = sm4c(&["send", &event, "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse(&out), json!({"reached": ["w1"], "parked": false}));
    s.wait_status("w1", "completed");

    let (code, out, err) = sm4c(&["list", "--status", "completed", "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(ids(parse(&out).as_array().expect("array")), ["w1"]);
    let (code, out, err) = sm4c(&["list", "--status", "waiting", "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(ids(parse(&out).as_array().expect("array")), [other.as_str()]);

    let (code, out, err) = sm4c(&["history", "w1", "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    let h = parse(&out);
    let entries = h.as_array().expect("history is an array");
    assert!(entries.len() >= 3, "{h}");
    assert!(
        entries.iter().all(|e| e["seq"].is_i64() && e["entry"].is_string()),
        "{h}"
    );
    assert!(entries.iter().any(|e| e["event"]["id"] == json!("e1")), "{h}");

    let (code, out, err) = sm4c(&["cancel", &other, "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = parse(&out);
    assert_eq!(v["id"], json!(other));
    assert_eq!(v["status"], json!("cancelled"));
    let (code, _, err) = sm4c(&["cancel", &other, "--server", url, "--json"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("already ended"), "{err}");
}

#[test]
fn cli_client_tables() {
    let s = serve(&[]);
    s.define(&waiter());
    s.start("waiter", "w1", json!({"customerId": "c1"}));
    let url = s.url();

    let (code, out, err) = sm4c(&["list", "--server", url]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    let header = lines.next().expect("header line");
    for col in ["ID", "DEFINITION", "VERSION", "STATUS", "STATE"] {
        assert!(header.contains(col), "header {header:?} lacks {col}");
    }
    let row = lines.next().expect("a row");
    for field in ["w1", "waiter", "waiting", "Wait"] {
        assert!(row.split_whitespace().any(|f| f == field), "row {row:?} lacks {field}");
    }
    assert!(serde_json::from_str::<Value>(&out).is_err(), "table mode printed JSON");

    let (code, out, err) = sm4c(&["show", "w1", "--server", url]);
    assert_eq!(code, 0, "{err}");
    for (k, v) in [
        ("id:", "w1"),
        ("definition:", "waiter"),
        ("status:", "waiting"),
        ("state:", "Wait"),
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(k) && l.split_whitespace().any(|f| f == v)),
            "show lacks {k} {v}:\n{out}"
        );
    }
    assert!(out.contains("\"customerId\": \"c1\""), "show lacks the data:\n{out}");

    let (code, out, err) = sm4c(&["start", "waiter", "--id", "w2", "--server", url]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("w2"), "{out}");
    let (code, out, err) = sm4c(&["history", "w2", "--server", url]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("input start"), "{out}");
    let (code, out, err) = sm4c(&["cancel", "w2", "--server", url]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("w2") && out.contains("cancelled"), "{out}");
}

#[test]
fn cli_client_errors() {
    let s = serve(&[]);
    let url = s.url();
    for args in [
        vec!["show", "nope", "--server", url],
        vec!["show", "nope", "--server", url, "--json"],
        vec!["history", "nope", "--server", url, "--json"],
        vec!["cancel", "nope", "--server", url, "--json"],
    ] {
        let (code, out, err) = sm4c(&args);
        assert_eq!(code, 1, "{args:?}: stdout {out} stderr {err}");
        assert!(
            err.contains("no instance \"nope\""),
            "{args:?}: server message missing from stderr: {err}"
        );
    }
    let (code, _, err) = sm4c(&["start", "nope", "--server", url, "--json"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no definition \"nope\""), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let not_event = write(dir.path(), "e.json", &json!({"hello": 1}));
    let (code, _, err) = sm4c(&["send", &not_event, "--server", url, "--json"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("invalidCloudEvent"), "{err}");

    // Port 1 (tcpmux): nothing listens there on a test machine, and no test binds it.
    let dead = "http://127.0.0.1:1".to_string();
    for args in [
        vec!["list", "--server", dead.as_str()],
        vec!["show", "x", "--server", dead.as_str(), "--json"],
        vec!["start", "waiter", "--server", dead.as_str()],
    ] {
        let (code, _, err) = sm4c(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(!err.is_empty());
    }
}

#[test]
fn explain_event_names_the_reached_instances_and_why_the_others_turn_it_away() {
    let s = serve(&[]);
    s.define(&waiter());
    s.start("waiter", "w-alice", json!({"customerId": "alice"}));
    s.start("waiter", "w-bob", json!({"customerId": "bob"}));
    let event =
        json!({"specversion": "1.0", "id": "e1", "source": "shop", "type": "com.example.paid", "customerid": "alice"});
    let (code, v) = answer(
        s.client()
            .post(format!("{}/events/explain", s.url()))
            .header("content-type", "application/cloudevents+json")
            .body(event.to_string()),
    );
    assert_eq!(code, 200, "{v}");
    let reached: Vec<&str> = v["reached"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["instance"].as_str().unwrap())
        .collect();
    assert_eq!(reached, vec!["w-alice"], "{v}");
    let near = &v["nearMisses"][0];
    assert_eq!(near["instance"], "w-bob", "{v}");
    assert!(
        near["reason"]
            .as_str()
            .unwrap()
            .contains("correlation attribute \"customerid\" is \"alice\", expected \"bob\""),
        "{v}"
    );
    assert_eq!(v["definitions"][0]["matches"], true, "{v}");
    // Explaining delivers nothing.
    assert_eq!(s.instance("w-alice")["state"], "Wait");
    // The CLI says the same in words; another source is turned away by its definition.
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "e.json",
        &json!({"specversion": "1.0", "id": "e2", "source": "elsewhere", "type": "com.example.paid", "customerid": "bob"}),
    );
    let (code, out, err) = sm4c(&["explain-event", &file, "--server", s.url()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("reaches no instance"), "{out}");
    assert!(out.contains("source \"elsewhere\" is not \"shop\""), "{out}");
}

// ---------------------------------------------------------------------------------------------
// Found by schemathesis against /openapi.json (docs/src/testing.md, "Schemathesis")
// ---------------------------------------------------------------------------------------------

/// `?status=` outside the document's `Status` enum was answered 200 with an empty page.
#[test]
fn schemathesis_unknown_status_filter_is_refused() {
    let s = serve(&[]);
    let (code, body) = s.get("/instances?status=AAA");
    assert_error(code, &body, 400, "invalidQuery");
    for status in [
        "created",
        "running",
        "waiting",
        "paused",
        "completed",
        "failed",
        "cancelled",
        "timedOut",
    ] {
        assert_eq!(s.get(&format!("/instances?status={status}")).0, 200, "{status}");
    }
}

/// A 405 for `POST /instances/{id}` had no `Allow` header (RFC 9110 requires one).
#[test]
fn schemathesis_post_to_an_instance_says_allow_get() {
    let s = serve(&[]);
    // With the header a body-less POST needs on a server without tokens, so that the route answers.
    let r = s
        .client()
        .post(format!("{}/instances/x", s.url()))
        .header("x-sm4c-request", "1")
        .send()
        .expect("request");
    assert_eq!(r.status().as_u16(), 405);
    assert_eq!(r.headers().get("allow").and_then(|v| v.to_str().ok()), Some("GET"));
}

/// Every path and method of the OpenAPI document reaches a handler of the server (no `notFound`
/// and no 405): the document names no route the server lacks.
#[test]
fn every_documented_operation_is_served() {
    let s = serve(&[]);
    let doc: Value = s
        .client()
        .get(format!("{}/openapi.json", s.url()))
        .send()
        .expect("doc")
        .json()
        .expect("JSON");
    let mut seen = 0;
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        let concrete = path
            .replace("{id}", "x")
            .replace("{token}", "t")
            .replace("{name}", "list");
        for method in ops.as_object().expect("operations").keys() {
            // A short wait so a poll of an empty task list ends at once.
            let wait = if path.ends_with("/poll") { "?wait=0s" } else { "" };
            let url = format!("{}{concrete}{wait}", s.url());
            let r = match method.as_str() {
                "get" => s.client().get(&url),
                "post" => s.client().post(&url),
                "put" => s.client().put(&url),
                "delete" => s.client().delete(&url),
                other => panic!("{other} {path}: a method the test does not know"),
            };
            let r = r.header("x-sm4c-request", "1").send().expect("request");
            let code = r.status().as_u16();
            if path == "/ui/events" {
                // A stream that never ends: its headers say it is served.
                let ty = r.headers().get("content-type").and_then(|v| v.to_str().ok());
                assert_eq!((code, ty), (200, Some("text/event-stream")), "{path}");
                seen += 1;
                continue;
            }
            let body: Value = r.json().unwrap_or(Value::Null);
            assert!(
                code != 405 && body["error"] != json!("notFound"),
                "{method} {path} is documented but not served: {code} {body}"
            );
            seen += 1;
        }
    }
    assert!(seen >= 30, "{seen} operations");
}

/// Waits for `paid` (correlated on `customerid`), then sends `com.example.receipt` with the amount.
fn receipt() -> Value {
    let mut d = waiter();
    d["id"] = json!("receipt");
    d["events"]
        .as_array_mut()
        .expect("events")
        .push(json!({"name": "receipt", "type": "com.example.receipt", "source": "shop"}));
    d["states"][1] = json!({"name": "Done", "enterAction": {
        "type": "sendEvent", "event": "receipt", "expression": "${ {amount: .paid.amount} }"
    }});
    d
}

/// A durable instance's history, as `sm4c history ID --json` prints it and as the API's page
/// gives it, replays through its definition (exit 0), and a changed copy diverges where it sends
/// other content (exit 1), naming the field.
#[test]
fn a_servers_history_replays_through_its_definition_and_a_changed_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = tempfile::tempdir().expect("tempdir");
    let s = serve_in(dir, &[]);
    s.define(&receipt());
    s.start("receipt", "r1", json!({"customerId": "c1"}));
    s.wait_status("r1", "waiting");
    let (code, _) = s.send_structured(&json!({"specversion": "1.0", "id": "e1", "source": "shop",
        "type": "com.example.paid", "customerid": "c1", "datacontenttype": "application/json",
        "data": {"amount": 7}}));
    assert_eq!(code, 202);
    s.wait_status("r1", "completed");

    let url = s.url();
    let (code, out, err) = sm4c(&["history", "r1", "--server", url, "--json"]);
    assert_eq!(code, 0, "{err}");
    let cli_history = write(files.path(), "cli.json", &parse(&out));
    let (code, page) = s.get("/instances/r1/history");
    assert_eq!(code, 200);
    let api_history = write(files.path(), "api.json", &page);
    let def = write(files.path(), "receipt.json", &receipt());
    for h in [&cli_history, &api_history] {
        let (code, out, err) = sm4c(&["replay", h, "--definition", &def]);
        assert_eq!(code, 0, "{h}: {out}{err}");
        assert!(out.starts_with("same decisions as recorded: 2 inputs, "), "{out}");
        // The bare array does not name the instance: the sent event's `sm4cinstanceid` does.
        assert!(!out.contains("note:"), "{out}");
    }

    let mut changed = receipt();
    changed["states"][1]["enterAction"]["expression"] = json!("${ {amount: (.paid.amount * 100)} }");
    let changed = write(files.path(), "changed.json", &changed);
    let (code, out, err) = sm4c(&["replay", &cli_history, "--definition", &changed]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.lines().next().expect("line").ends_with("in state \"Done\""),
        "{out}"
    );
    assert!(out.contains("  /event/data/amount: 7 recorded, 700 decided\n"), "{out}");
}
