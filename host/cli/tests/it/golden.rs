//! The golden stored-format test, served: `sm4c serve` started on a copy of the golden SQLite store
//! (`host/durable/tests/golden/store.sqlite`, written by an earlier build: see its README) takes
//! every waiting instance to its end. The timers stored in it are long past due and fire; the
//! event an instance waits for is sent; the worker tasks and task tokens left open are completed;
//! the failed instance is redriven from the point its snapshot keeps. The ended instances stay as
//! they were. `host/durable/tests/golden.rs` checks the same file row by row.

use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::server::{Serve, Server};

/// Longest an instance may take to reach a status (generous: debug builds on busy machines).
const DEADLINE: Duration = Duration::from_secs(60);

/// What the golden test asks of the server.
struct Golden {
    server: Server,
    base: String,
}

impl Golden {
    fn start(db: &Path, log: &Path) -> Golden {
        let server = Serve::new().db(db).log(log).start();
        let base = server.url().to_string();
        Golden { server, base }
    }

    fn log(&self) -> String {
        self.server.log()
    }

    fn client(&self) -> &reqwest::blocking::Client {
        self.server.client()
    }

    fn send(&self, req: reqwest::blocking::RequestBuilder) -> (u16, Value) {
        let r = req
            .header("X-Sm4c-Request", "1")
            .send()
            .unwrap_or_else(|e| panic!("request failed: {e}; log:\n{}", self.log()));
        let status = r.status().as_u16();
        let text = r.text().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.client().post(format!("{}{path}", self.base)).json(body))
    }

    fn instance(&self, id: &str) -> Value {
        let (status, body) = self.send(self.client().get(format!("{}/instances/{id}", self.base)));
        assert_eq!(status, 200, "GET /instances/{id}: {body}");
        body
    }

    /// Waits (bounded) until instance `id` has status `want`; its view then.
    fn until(&self, id: &str, want: &str) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let i = self.instance(id);
            if i["status"] == want {
                return i;
            }
            // An instance that ended otherwise will not get there: no need to wait.
            let ended = ["completed", "failed", "cancelled", "timedOut"].contains(&i["status"].as_str().unwrap_or(""));
            assert!(!ended, "{id} ended, not {want}: {i}; log:\n{}", self.log());
            assert!(
                Instant::now() < deadline,
                "{id} is not {want}: {i}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Takes a task of `list` (waiting for one up to 10 s), which must be `instance`'s.
    fn poll(&self, list: &str, instance: &str) -> Value {
        let (status, task) = self.send(
            self.client()
                .post(format!("{}/tasklists/{list}/poll?wait=10s&worker=golden", self.base)),
        );
        assert_eq!(status, 200, "no task on {list} for {instance}: {task}");
        assert_eq!(task["instanceId"], instance, "{task}");
        task
    }

    /// Completes `list`'s tasks for `instance` until it has `want`.
    fn work_until(&self, list: &str, instance: &str, want: &str) -> Value {
        for _ in 0..10 {
            let i = self.instance(instance);
            if i["status"] == want {
                return i;
            }
            let task = self.poll(list, instance);
            let (status, body) = self.post(
                &format!("/tasks/{}/complete", task["token"].as_str().expect("token")),
                &json!({"done": task["arguments"]}),
            );
            assert_eq!(status, 200, "{body}");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.until(instance, want)
    }

    /// Answers an ASL task of `list` for `instance` the way AWS workers do.
    fn succeed(&self, list: &str, instance: &str, output: Value) {
        let task = self.poll(list, instance);
        let (status, body) = self.post(
            "/tasks/send-task-success",
            &json!({"taskToken": task["token"], "output": output.to_string()}),
        );
        assert_eq!(status, 200, "{body}");
    }
}

#[test]
fn sm4c_serve_on_the_golden_store_takes_every_waiting_instance_to_its_end() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../durable/tests/golden/store.sqlite");
    let dir = tempfile::tempdir().expect("tmp");
    let db = dir.path().join("store.sqlite");
    std::fs::copy(&fixture, &db).unwrap_or_else(|e| panic!("cannot copy {}: {e}", fixture.display()));
    let s = Golden::start(&db, &dir.path().join("serve.log"));

    // The ended ones are as they were.
    assert_eq!(s.instance("sm4c-completed")["status"], "completed");
    assert_eq!(s.instance("sm4c-cancelled")["status"], "cancelled");
    assert_eq!(s.instance("asl-succeeded")["status"], "completed");
    let failed = s.instance("asl-failed");
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["type"], "Golden.Refused", "{failed}");

    // The timers stored are long past due: they fire.
    let timer = s.until("sm4c-timer", "completed");
    assert_eq!(timer["state"], "Late", "{timer}");
    assert_eq!(timer["data"]["why"], "timed out", "{timer}");
    let wait = s.until("asl-wait", "completed");
    assert_eq!(wait["data"]["after"], "waited", "{wait}");

    // The event the instance waits for, correlated by its order.
    let (status, body) = s.send(
        s.client()
            .post(format!("{}/events", s.base))
            .header("ce-specversion", "1.0")
            .header("ce-type", "golden.go")
            .header("ce-source", "client")
            .header("ce-id", "golden-1")
            .header("ce-orderid", "o-1")
            .json(&json!({"ok": true})),
    );
    assert_eq!(status, 202, "{body}");
    let event = s.until("sm4c-event", "completed");
    assert_eq!(event["data"]["got"], json!({"ok": true}), "{event}");

    // The parallel and foreach calls left open: one was answered before the store was written.
    let parallel = s.work_until("golden-work", "sm4c-parallel", "completed");
    assert_eq!(
        parallel["data"]["results"],
        json!({"one": {"done": {"what": "one"}},
               "each": [{"done": {"what": "p"}}, {"done": {"what": "q"}}, {"done": {"what": "r"}}]}),
        "{parallel}"
    );

    // The failed one goes on from its redrive point.
    let (status, body) = s.post("/instances/sm4c-failed/redrive", &json!({}));
    assert_eq!(status, 200, "{body}");
    let redriven = s.work_until("golden-work", "sm4c-failed", "completed");
    assert_eq!(
        redriven["data"]["results"],
        json!({"one": {"done": {"what": "one"}}, "each": [{"done": {"what": "x"}}, {"done": {"what": "y"}}]}),
        "{redriven}"
    );

    // The subflow child's call; then the parent has the child's data.
    s.work_until("golden-child", "sm4c-parent/1.enter", "completed");
    let parent = s.until("sm4c-parent", "completed");
    assert_eq!(parent["data"]["child"]["worked"], json!({"done": {"n": 7}}), "{parent}");

    // ASL: the task token, and the Map's and the Parallel's tasks.
    s.succeed("Approve", "asl-token", json!({"approved": true}));
    let token = s.until("asl-token", "completed");
    assert_eq!(token["data"]["approval"], json!({"approved": true}), "{token}");
    s.succeed("Side", "asl-map", json!("side"));
    s.succeed("Handle", "asl-map", json!({"handled": "next"}));
    s.succeed("Handle", "asl-map", json!({"handled": "last"}));
    let map = s.until("asl-map", "completed");
    let out = map["data"].as_array().expect("the Parallel's output").clone();
    assert_eq!(out.len(), 2, "{map}");
    assert_eq!(out[1], "side", "{map}");
    let handled = out[0].as_array().expect("the Map's output");
    assert_eq!(handled.len(), 3, "{map}");
    assert_eq!(
        handled[0],
        json!({"handled": 1}),
        "the answer given before the store was written: {map}"
    );
}
