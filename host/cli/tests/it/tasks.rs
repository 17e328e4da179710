//! Worker task lists through a real `sm4c serve`: polling, heartbeats, completion and failure by
//! token (HTTP and CloudEvents), the four task timeouts, cancellation, crashes (SIGKILL), and the
//! Python sample worker.

use reqwest::blocking::{Client, RequestBuilder};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::server;
use server::{Serve, Server, BIN};

/// Longest anything may take to happen (the machine is slow and tests run in parallel).
const DEADLINE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Definitions
// ---------------------------------------------------------------------------------------------

/// Resizes `.url` with worker function `resize` (task list `images`, `function` fields added);
/// a failure or timeout is recorded in `.failed`.
fn thumbs(id: &str, function: Value) -> Value {
    let mut f = json!({"name": "resize", "type": "worker", "operation": "images"});
    for (k, v) in function.as_object().cloned().unwrap_or_default() {
        f[k] = v;
    }
    json!({
        "id": id, "name": id, "version": "1",
        "functions": [f],
        "states": [{"name": "Resize", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "resize", "waitForCompletion": true,
                            "arguments": {"url": "${ .url }", "width": 128},
                            "errorHandlers": [{"resultHandler": "${ .failed = $value }"}]},
            "enterResultHandler": "${ .thumb = $value }"}]
    })
}

/// Like [`thumbs`], but a heartbeat timeout is retried once (after 0.1 s) and recorded.
fn retried(function: Value) -> Value {
    let mut d = thumbs("retried", function);
    d["retries"] = json!([{"name": "again", "delay": "0.1s", "maxAttempts": 1}]);
    d["states"][0]["enterAction"]["errorHandlers"] = json!([
        {"condition": "${ .details.timeoutType == \"heartbeat\" }", "retryPolicy": "again",
         "resultHandler": "${ .timeouts += [$value.details] }"}
    ]);
    d
}

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// A server on a fresh store with `extra` flags.
fn fresh(extra: &[&str]) -> Server {
    Serve::new().args(extra).client_timeout(Duration::from_secs(90)).start()
}

/// A server on the store in `dir` (the store survives the server).
fn on(dir: &Path, extra: &[&str]) -> Server {
    Serve::new()
        .db(dir.join("sm4c.db"))
        .log(dir.join("server.log"))
        .args(extra)
        .client_timeout(Duration::from_secs(90))
        .start()
}

/// What these tests ask of a server.
trait Api {
    fn send(&self, req: RequestBuilder) -> (u16, Value);
    fn post(&self, path: &str, body: &Value) -> (u16, Value);
    fn post_empty(&self, path: &str) -> (u16, Value);
    fn get(&self, path: &str) -> (u16, Value);
    fn define(&self, doc: &Value);
    fn start_instance(&self, definition: &str, id: &str, input: Value);
    fn poll(&self, list: &str, wait: &str) -> Option<Value>;
    fn take(&self, list: &str) -> Value;
    fn answer(&self, token: &str, what: &str, body: Option<&Value>) -> (u16, Value);
    fn instance(&self, id: &str) -> Value;
    fn ended(&self, id: &str) -> Value;
    fn task_list(&self, name: &str) -> Value;
}

impl Api for Server {
    fn send(&self, req: RequestBuilder) -> (u16, Value) {
        let resp = req
            .send()
            .unwrap_or_else(|e| panic!("request failed: {e}\n{}", self.log()));
        let status = resp.status().as_u16();
        let text = resp.text().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.client().post(format!("{}{path}", self.url())).json(body))
    }

    fn post_empty(&self, path: &str) -> (u16, Value) {
        self.send(
            self.client()
                .post(format!("{}{path}", self.url()))
                .header("x-sm4c-request", "1"),
        )
    }

    fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.client().get(format!("{}{path}", self.url())))
    }

    fn define(&self, doc: &Value) {
        let (st, body) = self.post("/definitions", doc);
        assert!(st == 201 || st == 200, "POST /definitions: {st} {body}");
    }

    fn start_instance(&self, definition: &str, id: &str, input: Value) {
        let (st, body) = self.post(
            "/instances",
            &json!({"definition": definition, "id": id, "input": input}),
        );
        assert_eq!(st, 201, "POST /instances: {body}");
    }

    /// Polls task list `list` once, waiting up to `wait`; the task, or `None` on 204.
    fn poll(&self, list: &str, wait: &str) -> Option<Value> {
        let (st, body) = self.post_empty(&format!("/tasklists/{list}/poll?wait={wait}&worker=test-worker"));
        match st {
            200 => Some(body),
            204 => None,
            _ => panic!("poll {list}: {st} {body}\n{}", self.log()),
        }
    }

    /// Polls until a task comes (each poll waits up to 5 s).
    fn take(&self, list: &str) -> Value {
        let started = Instant::now();
        loop {
            if let Some(t) = self.poll(list, "5s") {
                return t;
            }
            assert!(started.elapsed() < DEADLINE, "no task on {list}\n{}", self.log());
        }
    }

    fn answer(&self, token: &str, what: &str, body: Option<&Value>) -> (u16, Value) {
        match body {
            Some(b) => self.post(&format!("/tasks/{token}/{what}"), b),
            None => self.post_empty(&format!("/tasks/{token}/{what}")),
        }
    }

    fn instance(&self, id: &str) -> Value {
        let (st, body) = self.get(&format!("/instances/{id}"));
        assert_eq!(st, 200, "GET /instances/{id}: {body}");
        body
    }

    /// Waits until the instance has ended and returns it.
    fn ended(&self, id: &str) -> Value {
        let started = Instant::now();
        loop {
            let v = self.instance(id);
            if !matches!(v["status"].as_str(), Some("running" | "waiting" | "created")) {
                return v;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "instance {id} did not end: {v}\nhistory: {}\n{}",
                self.get(&format!("/instances/{id}/history?limit=1000")).1,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn task_list(&self, name: &str) -> Value {
        let (st, body) = self.get("/tasklists");
        assert_eq!(st, 200, "{body}");
        body["taskLists"]
            .as_array()
            .and_then(|l| l.iter().find(|t| t["name"] == name).cloned())
            .unwrap_or(Value::Null)
    }
}

fn token_of(task: &Value) -> String {
    task["token"].as_str().expect("a token").to_string()
}

/// The documented token format: base64url without padding of `<instance id>\n<operation id>`.
fn expected_token(instance: &str, op: &str) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = format!("{instance}\n{op}").into_bytes();
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..=c.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[test]
fn a_worker_polls_heartbeats_and_completes_and_the_instance_gets_the_result() {
    let s = fresh(&[]);
    s.define(&thumbs(
        "thumbs",
        json!({"heartbeatTimeout": "PT30S", "startToCloseTimeout": "PT5M"}),
    ));
    assert_eq!(
        s.task_list("images"),
        json!({"name": "images", "queued": 0, "polling": 0}),
        "task lists of registered definitions are listed"
    );
    s.start_instance("thumbs", "t1", json!({"url": "cat.png"}));
    let task = s.take("images");
    assert_eq!(task["taskList"], "images");
    assert_eq!(task["function"], "resize");
    assert_eq!(task["arguments"], json!({"url": "cat.png", "width": 128}));
    assert_eq!(task["instanceId"], "t1");
    assert_eq!(task["operation"], "1.enter");
    assert_eq!(task["attempt"], 1);
    assert_eq!(
        task["timeouts"],
        json!({"startToCloseMs": 300000, "heartbeatMs": 30000})
    );
    let token = token_of(&task);
    assert_eq!(token, expected_token("t1", "1.enter"));
    assert_eq!(s.task_list("images")["queued"], 0, "a taken task leaves the list");

    let (st, body) = s.answer(&token, "heartbeat", Some(&json!({"done": 50})));
    assert_eq!((st, body), (200, json!({"cancelRequested": false})));
    let (st, body) = s.answer(&token, "heartbeat", None);
    assert_eq!(
        (st, body),
        (200, json!({"cancelRequested": false})),
        "details are optional"
    );
    let (st, body) = s.answer(&token, "complete", Some(&json!({"url": "cat-128.png"})));
    assert_eq!((st, body), (200, json!({"instanceId": "t1", "operation": "1.enter"})));

    let inst = s.ended("t1");
    assert_eq!(inst["status"], "completed", "{inst}");
    assert_eq!(inst["data"]["thumb"], json!({"url": "cat-128.png"}));

    // The journal records who took the task and the heartbeat's progress.
    let (_, h) = s.get("/instances/t1/history?limit=1000");
    let inputs: Vec<&Value> = h["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["entry"] == "input")
        .collect();
    assert!(inputs
        .iter()
        .any(|e| e["input"] == "taskStarted" && e["worker"] == "test-worker"));
    assert!(inputs
        .iter()
        .any(|e| e["input"] == "taskHeartbeat" && e["details"] == json!({"done": 50})));

    // The CLI client shows the task lists and the worker in the history.
    let cli = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .args(["--server", s.url()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let tasks = cli(&["tasks"]);
    assert!(
        tasks.starts_with("TASK LIST  QUEUED  POLLING\nimages     0       0"),
        "{tasks}"
    );
    assert!(cli(&["history", "t1"]).contains("input taskStarted 1.enter by test-worker"));

    // Completing twice is refused: the task is closed. A heartbeat now asks the worker to stop.
    let (st, body) = s.answer(&token, "complete", Some(&json!("again")));
    assert_eq!(st, 409, "{body}");
    assert_eq!(body["error"], "taskClosed");
    let (st, body) = s.answer(&token, "heartbeat", None);
    assert_eq!((st, body), (200, json!({"cancelRequested": true})));
}

#[test]
fn a_worker_failure_reaches_the_error_handler_with_its_code_and_details() {
    let s = fresh(&[]);
    s.define(&thumbs("thumbs", json!({})));
    s.start_instance("thumbs", "f1", json!({"url": "missing.png"}));
    let token = token_of(&s.take("images"));
    let (st, body) = s.answer(
        &token,
        "fail",
        Some(&json!({"error": "NotFound", "message": "no image at missing.png", "details": {"status": 404}})),
    );
    assert_eq!(st, 200, "{body}");
    let inst = s.ended("f1");
    assert_eq!(inst["status"], "completed", "the handler caught it: {inst}");
    assert_eq!(
        inst["data"]["failed"],
        json!({"type": "functionError", "message": "no image at missing.png", "Message": "no image at missing.png",
               "details": {"error": "NotFound", "details": {"status": 404}}})
    );
    assert_eq!(inst["data"]["thumb"], Value::Null, "a handled error gives null");
}

#[test]
fn schedule_to_start_timeout_fails_the_call_when_no_worker_comes() {
    let s = fresh(&[]);
    s.define(&thumbs("thumbs", json!({"scheduleToStartTimeout": "0.5s"})));
    s.start_instance("thumbs", "s1", json!({"url": "a.png"}));
    assert_eq!(s.task_list("images")["queued"], 1);
    let inst = s.ended("s1");
    assert_eq!(inst["status"], "completed", "{inst}");
    let failed = &inst["data"]["failed"];
    assert_eq!(failed["type"], "timeout");
    assert_eq!(
        failed["details"],
        json!({"timeoutType": "scheduleToStart", "function": "resize", "taskList": "images"})
    );
    assert!(
        failed["message"].as_str().unwrap().contains("no worker took the task"),
        "{failed}"
    );
    assert_eq!(s.task_list("images")["queued"], 0, "the task left its list");
    assert_eq!(s.poll("images", "0s"), None);
}

#[test]
fn a_heartbeat_timeout_is_retried_as_a_new_task_that_a_second_poll_completes() {
    let s = fresh(&[]);
    s.define(&retried(json!({"heartbeatTimeout": "1s"})));
    s.start_instance("retried", "h1", json!({"url": "b.png"}));
    let first = s.take("images");
    let token1 = token_of(&first);
    // Heartbeats keep the task alive for longer than the heartbeat timeout...
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < Duration::from_millis(2_500) {
        n += 1;
        let (st, body) = s.answer(&token1, "heartbeat", Some(&json!({"beat": n})));
        assert_eq!((st, &body), (200, &json!({"cancelRequested": false})), "beat {n}");
        std::thread::sleep(Duration::from_millis(300));
    }
    // ...and when they stop, it times out and the retry policy schedules a new task.
    let second = s.take("images");
    assert_eq!(second["attempt"], 2);
    assert_eq!(second["operation"], "1.enter#2");
    assert_eq!(second["arguments"], first["arguments"]);
    let token2 = token_of(&second);
    assert_ne!(token1, token2);
    let (st, body) = s.answer(&token1, "heartbeat", None);
    assert_eq!(
        (st, body),
        (200, json!({"cancelRequested": true})),
        "the first worker is told to stop"
    );
    let (st, body) = s.answer(&token1, "complete", Some(&json!("late")));
    assert_eq!((st, body["error"].clone()), (409, json!("taskClosed")));
    let (st, _) = s.answer(&token2, "complete", Some(&json!({"url": "b-128.png"})));
    assert_eq!(st, 200);
    let inst = s.ended("h1");
    assert_eq!(inst["status"], "completed", "{inst}");
    assert_eq!(inst["data"]["thumb"], json!({"url": "b-128.png"}));
    assert_eq!(
        inst["data"]["timeouts"],
        json!([{"timeoutType": "heartbeat", "function": "resize", "taskList": "images",
                "worker": "test-worker", "lastHeartbeatDetails": {"beat": n}}])
    );
}

#[test]
fn start_to_close_timeout_fails_a_task_the_worker_keeps_too_long() {
    let s = fresh(&[]);
    s.define(&thumbs("thumbs", json!({"startToCloseTimeout": "1s"})));
    s.start_instance("thumbs", "c1", json!({"url": "c.png"}));
    let token = token_of(&s.take("images"));
    let inst = s.ended("c1");
    assert_eq!(
        inst["data"]["failed"]["details"]["timeoutType"], "startToClose",
        "{inst}"
    );
    assert!(inst["data"]["failed"]["message"]
        .as_str()
        .unwrap()
        .contains("within PT1S of taking it"));
    let (st, body) = s.answer(&token, "complete", Some(&json!(1)));
    assert_eq!((st, body["error"].clone()), (409, json!("taskClosed")));
}

#[test]
fn cloudevents_complete_fail_and_heartbeat_tasks_by_token() {
    let s = fresh(&[]);
    s.define(&thumbs("thumbs", json!({})));
    s.start_instance("thumbs", "e1", json!({"url": "e1.png"}));
    s.start_instance("thumbs", "e2", json!({"url": "e2.png"}));
    let mut tokens = std::collections::HashMap::new();
    for _ in 0..2 {
        let t = s.take("images");
        tokens.insert(t["instanceId"].as_str().unwrap().to_string(), token_of(&t));
    }
    // Binary mode: the token is the ce-sm4ctasktoken header.
    let binary = |ty: &str, token: &str, body: &str| {
        s.send(
            s.client()
                .post(format!("{}/events", s.url()))
                .header("ce-specversion", "1.0")
                .header("ce-id", format!("{ty}-{token}"))
                .header("ce-source", "workers/py")
                .header("ce-type", ty)
                .header("ce-sm4ctasktoken", token)
                .header("content-type", "application/json")
                .body(body.to_string()),
        )
    };
    let (st, body) = binary("sm4c.task.heartbeat", &tokens["e1"], r#"{"done": 10}"#);
    assert_eq!(
        (st, body),
        (
            202,
            json!({"reached": ["e1"], "parked": false, "cancelRequested": false})
        )
    );
    let (st, body) = binary("sm4c.task.completed", &tokens["e1"], r#"{"url": "e1-128.png"}"#);
    assert_eq!((st, body), (202, json!({"reached": ["e1"], "parked": false})));
    // Structured mode: the token is an attribute of the event.
    let structured = |event: Value| {
        s.send(
            s.client()
                .post(format!("{}/events", s.url()))
                .header("content-type", "application/cloudevents+json")
                .body(event.to_string()),
        )
    };
    let (st, body) = structured(json!({"specversion": "1.0", "id": "f-e2", "source": "workers/py",
        "type": "sm4c.task.failed", "sm4ctasktoken": tokens["e2"],
        "datacontenttype": "application/json", "data": {"error": "Corrupt", "message": "cannot decode e2.png"}}));
    assert_eq!(st, 202, "{body}");
    let e1 = s.ended("e1");
    assert_eq!(e1["data"]["thumb"], json!({"url": "e1-128.png"}), "{e1}");
    let e2 = s.ended("e2");
    assert_eq!(e2["data"]["failed"]["message"], "cannot decode e2.png", "{e2}");
    assert_eq!(e2["data"]["failed"]["details"], json!({"error": "Corrupt"}));
    // Answering a closed task by event is refused as over HTTP; a task event needs its token.
    let (st, body) = binary("sm4c.task.completed", &tokens["e1"], "1");
    assert_eq!((st, body["error"].clone()), (409, json!("taskClosed")));
    let (st, body) = structured(json!({"specversion": "1.0", "id": "x", "source": "w", "type": "sm4c.task.completed"}));
    assert_eq!(st, 400, "{body}");
    assert_eq!(body["error"], "invalidCloudEvent");
    assert!(body["message"].as_str().unwrap().contains("sm4ctasktoken"), "{body}");
}

#[test]
fn bad_and_unknown_tokens_and_requests_get_clear_errors() {
    let s = fresh(&[]);
    s.define(&thumbs("thumbs", json!({})));
    for token in ["not-a-token", "Zm9v", &expected_token("ghost", "1.enter")] {
        for what in ["complete", "fail", "heartbeat"] {
            let (st, body) = s.answer(token, what, None);
            assert_eq!(st, 404, "{token} {what}: {body}");
            assert_eq!(body["error"], "unknownTask", "{body}");
        }
    }
    let (_, body) = s.answer(&expected_token("ghost", "1.enter"), "complete", None);
    assert!(body["message"].as_str().unwrap().contains("\"ghost\""), "{body}");
    // An instance that exists but never had that task: closed.
    s.start_instance("thumbs", "b1", json!({"url": "b.png"}));
    let (st, body) = s.answer(&expected_token("b1", "7.exit"), "complete", None);
    assert_eq!((st, body["error"].clone()), (409, json!("taskClosed")));
    // Bodies and queries.
    let token = token_of(&s.take("images"));
    let (st, body) = s.answer(&token, "fail", Some(&json!({"reason": "x"})));
    assert_eq!((st, body["error"].clone()), (400, json!("invalidFailure")), "{body}");
    let (st, body) = s.send(
        s.client()
            .post(format!("{}/tasks/{token}/complete", s.url()))
            .header("content-type", "text/plain")
            .body("done"),
    );
    assert_eq!((st, body["error"].clone()), (415, json!("unsupportedMediaType")));
    let (st, body) = s.send(
        s.client()
            .post(format!("{}/tasks/{token}/complete", s.url()))
            .header("content-type", "application/json")
            .body("{oops"),
    );
    assert_eq!((st, body["error"].clone()), (400, json!("malformedJson")));
    let (st, body) = s.post_empty("/tasklists/images/poll?wait=soon");
    assert_eq!((st, body["error"].clone()), (400, json!("invalidQuery")), "{body}");
    let (st, body) = s.post_empty("/tasklists/images/poll?wait=2m");
    assert_eq!((st, body["error"].clone()), (400, json!("invalidQuery")), "{body}");
    let (st, body) = s.post_empty("/tasklists/no%20spaces/poll");
    assert_eq!((st, body["error"].clone()), (400, json!("invalidTaskList")), "{body}");
    // The task is still open after all that, and completes.
    let (st, _) = s.answer(&token, "complete", None);
    assert_eq!(st, 200);
    assert_eq!(
        s.ended("b1")["data"]["thumb"],
        Value::Null,
        "an empty body is a null result"
    );
}

#[test]
fn a_long_poll_waits_for_its_bound_or_for_a_task_scheduled_meanwhile() {
    let s = fresh(&[]);
    s.define(&thumbs("thumbs", json!({})));
    let started = Instant::now();
    assert_eq!(s.poll("images", "700ms"), None);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(700) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    // A queued task is returned at once, even without waiting.
    s.start_instance("thumbs", "l0", json!({"url": "l0.png"}));
    assert_eq!(s.poll("images", "0s").expect("the queued task")["instanceId"], "l0");
    // A task scheduled while a worker waits goes to that worker at once.
    std::thread::scope(|scope| {
        let poll = scope.spawn(|| {
            let started = Instant::now();
            (s.poll("images", "30s"), started.elapsed())
        });
        let deadline = Instant::now() + DEADLINE;
        while s.task_list("images")["polling"] != 1 {
            assert!(Instant::now() < deadline, "the poll never waited");
            std::thread::sleep(Duration::from_millis(20));
        }
        s.start_instance("thumbs", "l1", json!({"url": "l.png"}));
        let (task, waited) = poll.join().unwrap();
        assert_eq!(task.expect("the waiting worker got the task")["instanceId"], "l1");
        assert!(waited < Duration::from_secs(20), "{waited:?}");
    });
}

#[test]
fn cancelling_removes_queued_tasks_and_tells_working_workers_to_stop() {
    let s = fresh(&[]);
    s.define(&thumbs("thumbs", json!({})));
    s.start_instance("thumbs", "k1", json!({"url": "k1.png"}));
    let (st, _) = s.post_empty("/instances/k1/cancel");
    assert_eq!(st, 200);
    assert_eq!(
        s.poll("images", "0s"),
        None,
        "the queued task of a cancelled instance is gone"
    );
    assert_eq!(s.task_list("images")["queued"], 0);

    s.start_instance("thumbs", "k2", json!({"url": "k2.png"}));
    let token = token_of(&s.take("images"));
    let (st, _) = s.post_empty("/instances/k2/cancel");
    assert_eq!(st, 200);
    let (st, body) = s.answer(&token, "heartbeat", None);
    assert_eq!((st, body), (200, json!({"cancelRequested": true})));
    let (st, body) = s.answer(&token, "complete", Some(&json!(1)));
    assert_eq!((st, body["error"].clone()), (409, json!("taskClosed")));
    assert_eq!(s.instance("k2")["status"], "cancelled");
}

#[test]
fn after_a_crash_a_queued_task_is_queued_again_with_the_same_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = on(dir.path(), &[]);
    s.define(&thumbs("thumbs", json!({"scheduleToStartTimeout": "PT10M"})));
    s.start_instance("thumbs", "q1", json!({"url": "q.png"}));
    assert_eq!(s.task_list("images")["queued"], 1);
    s.kill();
    let s = on(dir.path(), &[]);
    assert_eq!(s.task_list("images")["queued"], 1, "{}", s.log());
    let task = s.take("images");
    assert_eq!(token_of(&task), expected_token("q1", "1.enter"));
    assert_eq!(task["arguments"], json!({"url": "q.png", "width": 128}));
    assert_eq!(task["attempt"], 1);
    let (st, _) = s.answer(&token_of(&task), "complete", Some(&json!("q-128.png")));
    assert_eq!(st, 200);
    let inst = s.ended("q1");
    assert_eq!(inst["status"], "completed");
    assert_eq!(inst["data"]["thumb"], "q-128.png");
}

#[test]
fn after_a_crash_a_taken_task_stays_with_its_worker_whose_token_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = on(dir.path(), &[]);
    s.define(&thumbs("thumbs", json!({"heartbeatTimeout": "PT1M"})));
    s.start_instance("thumbs", "w1", json!({"url": "w.png"}));
    let token = token_of(&s.take("images"));
    let (st, _) = s.answer(&token, "heartbeat", Some(&json!({"done": 1})));
    assert_eq!(st, 200);
    s.kill();
    let s = on(dir.path(), &[]);
    assert_eq!(s.poll("images", "500ms"), None, "not handed to a second worker");
    let (st, body) = s.answer(&token, "heartbeat", Some(&json!({"done": 2})));
    assert_eq!((st, body), (200, json!({"cancelRequested": false})));
    let (st, _) = s.answer(&token, "complete", Some(&json!("w-128.png")));
    assert_eq!(st, 200);
    assert_eq!(s.ended("w1")["data"]["thumb"], "w-128.png");
}

#[test]
fn task_timeouts_survive_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = on(dir.path(), &[]);
    s.define(&thumbs("thumbs", json!({"heartbeatTimeout": "2s"})));
    s.start_instance("thumbs", "d1", json!({"url": "d.png"}));
    let _ = s.take("images");
    s.kill();
    // The worker is gone too: nobody heartbeats, and the restarted server times the task out.
    let s = on(dir.path(), &[]);
    let inst = s.ended("d1");
    assert_eq!(inst["data"]["failed"]["details"]["timeoutType"], "heartbeat", "{inst}");
}

#[test]
fn the_python_sample_worker_does_the_tasks_of_the_word_count_sample() {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/word-count-worker");
    let definitions = tempfile::tempdir().unwrap();
    std::fs::copy(
        sample.join("definition.json"),
        definitions.path().join("definition.json"),
    )
    .unwrap();
    let s = fresh(&["--definitions", definitions.path().to_str().unwrap()]);
    let input: Value = serde_json::from_str(&std::fs::read_to_string(sample.join("input.json")).unwrap()).unwrap();
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(sample.join("expected.json")).unwrap()).unwrap();
    let tasks = input["documents"].as_array().unwrap().len();
    s.start_instance("word-count", "wc1", input);
    let out = Command::new("python3")
        .arg(sample.join("worker.py"))
        .args(["--server", s.url(), "--wait", "5", "--max-tasks", &tasks.to_string()])
        .output()
        .expect("python3 runs (it is needed for this test)");
    assert!(
        out.status.success(),
        "worker.py failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    let inst = s.ended("wc1");
    assert_eq!(inst["status"], "completed", "{inst}");
    assert_eq!(
        inst["data"], expected,
        "the real worker gives what the sample's mock gives"
    );
}

#[test]
fn sm4c_run_answers_worker_functions_with_mocks_and_explains_when_there_is_none() {
    let dir = tempfile::tempdir().unwrap();
    let def = dir.path().join("thumbs.json");
    std::fs::write(&def, thumbs("thumbs", json!({"heartbeatTimeout": "PT1S"})).to_string()).unwrap();
    let mocks = dir.path().join("mocks.json");
    std::fs::write(&mocks, r#"{"resize": "{url: (.url + \"-small\")}"}"#).unwrap();
    let input = dir.path().join("input.json");
    std::fs::write(&input, r#"{"url": "r.png"}"#).unwrap();
    let run = |extra: &[&Path]| {
        let mut cmd = Command::new(BIN);
        cmd.arg("run")
            .arg(&def)
            .arg("--input")
            .arg(&input)
            .arg("--virtual-time");
        if let Some(m) = extra.first() {
            cmd.arg("--mock").arg(m);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null),
        )
    };
    let (code, data) = run(&[&mocks]);
    assert_eq!(code, Some(0));
    assert_eq!(data["thumb"], json!({"url": "r.png-small"}));
    let (code, data) = run(&[]);
    assert_eq!(code, Some(0), "the definition handles the error");
    let message = data["failed"]["message"].as_str().unwrap();
    assert!(
        message.contains("is a worker function (task list \"images\") and sm4c run has no workers"),
        "{message}"
    );
}

#[test]
fn sm4c_validate_names_bad_worker_definitions_by_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let def = dir.path().join("bad.json");
    let mut doc = thumbs("bad", json!({"operation": "images/small", "heartbeatTimeout": "0s"}));
    doc["states"][0]["enterAction"]["waitForCompletion"] = json!(false);
    std::fs::write(&def, doc.to_string()).unwrap();
    let out = Command::new(BIN).arg("validate").arg(&def).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for want in [
        "/functions/0/operation: \"images/small\" is not a task list name",
        "/functions/0/heartbeatTimeout: must be longer than zero",
        "/states/0/enterAction/waitForCompletion: function \"resize\" is a worker function",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in:\n{stderr}");
    }
}

#[test]
fn the_openapi_document_describes_the_task_list_endpoints() {
    let s = fresh(&[]);
    let (st, doc) = s.get("/openapi.json");
    assert_eq!(st, 200);
    for (path, method) in [
        ("/tasklists", "get"),
        ("/tasklists/{name}/poll", "post"),
        ("/tasks/{token}/complete", "post"),
        ("/tasks/{token}/fail", "post"),
        ("/tasks/{token}/heartbeat", "post"),
    ] {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} is not documented"
        );
    }
    let codes = doc["components"]["schemas"]["Error"]["properties"]["error"]["description"]
        .as_str()
        .unwrap();
    for code in ["invalidTaskList", "unknownTask", "taskClosed", "invalidFailure"] {
        assert!(codes.contains(code), "error code {code} is not documented");
    }
    assert!(doc["components"]["schemas"]["Task"]["required"]
        .as_array()
        .unwrap()
        .contains(&json!("token")));
}

#[test]
fn a_worker_that_left_its_poll_is_not_given_a_task() {
    let s = fresh(&[]);
    s.define(&thumbs("thumbs", json!({})));
    // A worker gives up on its poll (its connection closes) long before the poll's bound.
    let impatient = Client::builder().timeout(Duration::from_millis(300)).build().unwrap();
    let gone = impatient
        .post(format!("{}/tasklists/images/poll?wait=30s&worker=impatient", s.url()))
        .header("x-sm4c-request", "1")
        .send();
    assert!(gone.is_err(), "the client timed out");
    std::thread::sleep(Duration::from_millis(200));
    s.start_instance("thumbs", "g1", json!({"url": "g.png"}));
    let task = s.take("images");
    assert_eq!(task["instanceId"], "g1", "the task waited for a worker that is there");
    let (_, h) = s.get("/instances/g1/history?limit=1000");
    let started: Vec<&Value> = h["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["input"] == "taskStarted")
        .collect();
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0]["worker"], "test-worker");
}

#[test]
fn mocks_do_not_answer_worker_tasks_and_stopping_the_server_ends_long_polls() {
    let dir = tempfile::tempdir().unwrap();
    let mocks = dir.path().join("mocks.json");
    std::fs::write(&mocks, r#"{"resize": "\"mocked\""}"#).unwrap();
    let mut s = fresh(&["--mock", mocks.to_str().unwrap()]);
    s.define(&thumbs("thumbs", json!({})));
    s.start_instance("thumbs", "m1", json!({"url": "m.png"}));
    let task = s.take("images");
    assert_eq!(task["instanceId"], "m1", "the task went to its list, not to the mock");
    std::thread::scope(|scope| {
        let poll = scope.spawn(|| {
            let started = Instant::now();
            let r = s
                .client()
                .post(format!("{}/tasklists/images/poll?wait=60s", s.url()))
                .header("x-sm4c-request", "1")
                .send()
                .map(|r| r.status().as_u16());
            (r, started.elapsed())
        });
        let deadline = Instant::now() + DEADLINE;
        while s.task_list("images")["polling"] != 1 {
            assert!(Instant::now() < deadline, "the poll never waited");
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = s.pid().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let (status, waited) = poll.join().unwrap();
        assert_eq!(status.ok(), Some(204));
        assert!(waited < Duration::from_secs(20), "the poll held the stop: {waited:?}");
    });
    let deadline = Instant::now() + DEADLINE;
    let code = loop {
        if let Some(st) = s.try_wait() {
            break st.code();
        }
        assert!(Instant::now() < deadline, "the server did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(0), "{}", s.log());
}

/// `GET /metrics` times tasks per task list: scheduled to taken, and taken to answered by outcome.
#[test]
fn task_metrics_time_schedule_to_start_and_start_to_close_per_task_list() {
    let s = fresh(&[]);
    s.define(&thumbs("thumbs", json!({})));
    s.start_instance("thumbs", "m-ok", json!({"url": "a.png"}));
    s.start_instance("thumbs", "m-bad", json!({"url": "b.png"}));
    for _ in 0..2 {
        let task = s.take("images");
        let token = token_of(&task);
        let (st, body) = if task["instanceId"] == "m-ok" {
            s.answer(&token, "complete", Some(&json!({"url": "a-128.png"})))
        } else {
            s.answer(
                &token,
                "fail",
                Some(&json!({"error": "BadImage", "message": "not an image"})),
            )
        };
        assert_eq!(st, 200, "{body}");
    }
    s.ended("m-ok");
    s.ended("m-bad");
    let text = s
        .client()
        .get(format!("{}/metrics", s.url()))
        .send()
        .and_then(|r| r.text())
        .expect("GET /metrics");
    let sample = |series: &str| {
        text.lines()
            .filter_map(|l| l.rsplit_once(' '))
            .find(|(s, _)| *s == series)
            .and_then(|(_, v)| v.parse::<f64>().ok())
    };
    assert_eq!(
        sample(r#"sm4c_task_schedule_to_start_seconds_count{task_list="images"}"#),
        Some(2.0),
        "{text}"
    );
    for outcome in ["completed", "failed"] {
        let series = format!(r#"sm4c_task_start_to_close_seconds_count{{task_list="images",outcome="{outcome}"}}"#);
        assert_eq!(sample(&series), Some(1.0), "{series}: {text}");
    }
}
