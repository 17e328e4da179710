//! The step debugger against the real binary: breakpoints set over the HTTP API and with
//! `sm4c debug`, an instance that pauses at one (status `paused`, `pausedAt`), stays paused across
//! a SIGKILL and a restart of `sm4c serve` on the same SQLite file, and goes on with `step` and
//! `resume`; errors for what cannot be done (400, 404, 409).

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::server;
use server::{Serve, Server, BIN};
const DEADLINE: Duration = Duration::from_secs(20);

/// Waits for `paid` (correlated on `.orderId`) for an hour, then ships.
fn order() -> Value {
    serde_json::from_str(include_str!("../../../api/ui/test/order.json")).expect("order.json")
}

/// `sm4c serve` on the store `db` (created when new).
fn serve(db: &Path) -> Server {
    Serve::new().db(db).log(db.with_extension("log")).start()
}

/// What these tests ask of a server.
trait Api {
    fn send(&self, req: reqwest::blocking::RequestBuilder) -> (u16, Value);
    fn get(&self, path: &str) -> (u16, Value);
    fn post(&self, path: &str, body: &Value) -> (u16, Value);
    fn put(&self, path: &str, body: &Value) -> (u16, Value);
    fn start(&self, id: &str, order_id: &str);
    fn pay(&self, order_id: &str);
    fn settled(&self, id: &str, status: &str) -> Value;
    fn debug(&self, args: &[&str]) -> (i32, String, String);
}

impl Api for Server {
    fn send(&self, req: reqwest::blocking::RequestBuilder) -> (u16, Value) {
        let resp = req.send().expect("answered");
        let status = resp.status().as_u16();
        (
            status,
            serde_json::from_str(&resp.text().expect("body")).unwrap_or(Value::Null),
        )
    }

    fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.client().get(format!("{}{path}", self.url())))
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.client().post(format!("{}{path}", self.url())).json(body))
    }

    fn put(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.client().put(format!("{}{path}", self.url())).json(body))
    }

    fn start(&self, id: &str, order_id: &str) {
        let (code, v) = self.post(
            "/instances",
            &json!({"definition": "order", "id": id, "input": {"orderId": order_id}}),
        );
        assert_eq!(code, 201, "{v}");
    }

    fn pay(&self, order_id: &str) {
        let event = json!({"specversion": "1.0", "id": format!("pay-{order_id}"), "source": "shop",
                           "type": "com.example.paid", "orderid": order_id, "data": {"amount": 3}});
        let (code, v) = self.send(
            self.client()
                .post(format!("{}/events", self.url()))
                .header("content-type", "application/cloudevents+json")
                .body(event.to_string()),
        );
        assert_eq!(code, 202, "{v}");
    }

    /// The instance once its status is `status`.
    fn settled(&self, id: &str, status: &str) -> Value {
        let started = Instant::now();
        loop {
            let (code, v) = self.get(&format!("/instances/{id}"));
            if code == 200 && v["status"] == status {
                return v;
            }
            assert!(started.elapsed() < DEADLINE, "{id} is not {status}: {v}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `sm4c debug ARGS --server URL`: (exit code, stdout, stderr).
    fn debug(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(BIN)
            .arg("debug")
            .args(args)
            .args(["--server", self.url()])
            .output()
            .expect("sm4c runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn store() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sm4c.db");
    (dir, db)
}

#[test]
fn breakpoints_are_checked_against_the_definition() {
    let (_dir, db) = store();
    let s = serve(&db);
    assert_eq!(s.post("/definitions", &order()).0, 201);
    let cases = [
        (json!({"on": "enter", "state": "Nope"}), "no state \"Nope\""),
        (
            json!({"on": "action", "state": "Received", "action": "t7"}),
            "no t7 action",
        ),
        (
            json!({"on": "action", "state": "Received", "action": "later"}),
            "not an action name",
        ),
        (
            json!({"on": "transition", "state": "AwaitPayment", "transition": 5}),
            "no transition 5",
        ),
        (json!({"on": "entr", "state": "Ship"}), "breakpoint 0"),
        (json!({"on": "enter"}), "missing field `state`"),
    ];
    for (b, says) in cases {
        let (code, v) = s.put("/definitions/order/breakpoints", &json!({"breakpoints": [b]}));
        assert_eq!(code, 400, "{b}: {v}");
        assert_eq!(v["error"], "invalidBreakpoint", "{v}");
        assert!(v["message"].as_str().unwrap_or_default().contains(says), "{b}: {v}");
    }
    let (code, v) = s.put("/definitions/order/breakpoints", &json!({"points": []}));
    assert_eq!(code, 400, "{v}");
    let (code, v) = s.put("/definitions/nothing/breakpoints", &json!({"breakpoints": []}));
    assert_eq!((code, v["error"].as_str()), (404, Some("unknownDefinition")), "{v}");
    assert_eq!(s.get("/definitions/nothing/breakpoints").0, 404);
    let (code, v) = s.post("/instances/nobody/resume", &json!({}));
    assert_eq!((code, v["error"].as_str()), (404, Some("unknownInstance")), "{v}");
    s.start("o-1", "A1");
    s.settled("o-1", "waiting");
    let (code, v) = s.post("/instances/o-1/step", &json!({}));
    assert_eq!((code, v["error"].as_str()), (409, Some("notPaused")), "{v}");
    // Nothing was set: nothing of the debugger is in the instance's journal.
    let (_, h) = s.get("/instances/o-1/history");
    assert!(!h.to_string().contains("\"debug\""), "{h}");
    let (code, v) = s.get("/breakpoints");
    assert_eq!((code, v), (200, json!({"definitions": []})));
}

#[test]
fn a_paused_instance_survives_sigkill_and_goes_on_with_step_and_resume() {
    let (_dir, db) = store();
    let mut s = serve(&db);
    assert_eq!(s.post("/definitions", &order()).0, 201);

    let (code, out, err) = s.debug(&["break", "order", "--state", "AwaitPayment", "--transition", "0"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "order: before transition 0 of AwaitPayment");
    let (code, out, err) = s.debug(&["break", "order", "--state", "Ship", "--action", "enter"]);
    assert_eq!(code, 0, "{err}");
    let (code, out2, _) = s.debug(&["list"]);
    assert_eq!(code, 0);
    assert_eq!(out, out2);
    assert!(out.contains("order: before the enter action of Ship"), "{out}");
    let (code, _, err) = s.debug(&["break", "order", "--state", "Gone"]);
    assert_eq!(code, 1);
    assert!(err.contains("no state \"Gone\""), "{err}");

    // It waits for its payment as before; the payment takes it to the breakpoint.
    s.start("o-1", "A1");
    s.settled("o-1", "waiting");
    s.pay("A1");
    let v = s.settled("o-1", "paused");
    assert_eq!(
        v["pausedAt"],
        json!({"on": "transition", "state": "AwaitPayment", "transition": 0})
    );
    assert_eq!(v["state"], "AwaitPayment");
    assert_eq!(v["data"]["payment"], json!({"amount": 3}), "its data shows what it has");
    let (_, list) = s.get("/instances?status=paused");
    assert_eq!(list["instances"][0]["id"], "o-1", "{list}");
    let (code, out, _) = s.debug(&["list", "order"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 2, "{out}");

    // SIGKILL: it is still paused after the restart.
    s.kill();
    drop(s);
    s = serve(&db);
    let v = s.settled("o-1", "paused");
    assert_eq!(v["pausedAt"]["state"], "AwaitPayment");
    let (code, out, _) = s.debug(&["list"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 2, "the breakpoints survive the restart too: {out}");

    // Step: the next point is entering Ship.
    let (code, out, err) = s.debug(&["step", "o-1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("o-1 is paused entering Ship\n"), "{out}");
    // Resume: it stops at the breakpoint before Ship's enter action.
    let (code, out, err) = s.debug(&["resume", "o-1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("o-1 is paused before the enter action of Ship\n"),
        "{out}"
    );
    let (code, out, _) = s.debug(&["resume", "o-1"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("o-1 is completed"), "{out}");
    let v = s.settled("o-1", "completed");
    assert_eq!(v["data"]["step"], "shipped");
    assert!(v.get("pausedAt").is_none());
    let (code, _, err) = s.debug(&["resume", "o-1"]);
    assert_eq!(code, 1);
    assert!(err.contains("notPaused (409)"), "{err}");
    let (_, h) = s.get("/instances/o-1/history?limit=1000");
    let steps: Vec<&str> = h["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["entry"]["step"].as_str().or(e["step"].as_str()))
        .filter(|s| *s == "paused" || *s == "resumed")
        .collect();
    assert_eq!(
        steps,
        ["paused", "resumed", "paused", "resumed", "paused", "resumed"],
        "{h}"
    );

    // A paused instance can be cancelled.
    s.start("o-2", "B2");
    s.settled("o-2", "waiting");
    s.pay("B2");
    s.settled("o-2", "paused");
    let (code, v) = s.post("/instances/o-2/cancel", &json!({}));
    assert_eq!((code, v["status"].as_str()), (200, Some("cancelled")), "{v}");

    // Cleared: instances go through as before (a waiting one learns with its next input).
    s.start("o-3", "C3");
    s.settled("o-3", "waiting");
    let (code, out, _) = s.debug(&["clear", "order", "--state", "Ship", "--action", "enter"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "order: before transition 0 of AwaitPayment");
    let (code, out, _) = s.debug(&["clear", "order"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "order: no breakpoints");
    s.pay("C3");
    s.settled("o-3", "completed");
}

#[test]
fn an_event_for_a_paused_instance_waits_for_the_resume() {
    let (_dir, db) = store();
    let s = serve(&db);
    assert_eq!(s.post("/definitions", &order()).0, 201);
    let (code, v) = s.put(
        "/definitions/order/breakpoints",
        &json!({"breakpoints": [{"on": "enter", "state": "Received"}]}),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        v,
        json!({"definition": "order", "breakpoints": [{"on": "enter", "state": "Received"}]})
    );
    s.start("o-9", "Z9");
    let v = s.settled("o-9", "paused");
    assert_eq!(v["pausedAt"], json!({"on": "enter", "state": "Received"}));
    assert_eq!(v["data"], json!({"orderId": "Z9"}));
    // The payment reaches the paused instance, which keeps it until it goes on.
    s.pay("Z9");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.settled("o-9", "paused")["state"], Value::Null);
    let out = Command::new(BIN)
        .args(["show", "o-9", "--server", s.url()])
        .output()
        .expect("sm4c runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("paused:") && l.ends_with(" entering Received")),
        "{text}"
    );
    let (code, v) = s.send(s.client().delete(format!("{}/definitions/order/breakpoints", s.url())));
    assert_eq!((code, v["breakpoints"].clone()), (200, json!([])));
    let (code, v) = s.post("/instances/o-9/resume", &json!({}));
    assert_eq!(code, 200, "{v}");
    let v = s.settled("o-9", "completed");
    assert_eq!(v["data"]["payment"], json!({"amount": 3}), "{v}");
    assert_eq!(v["data"]["step"], "shipped");
}
