//! Amazon States Language definitions under `sm4c serve` (durable SQLite host), its HTTP API and the
//! CLI client, against the real binary: registering ASL files and bodies (named by file or
//! `?name=`), starting, showing, listing, cancelling and explaining ASL instances, drawing ASL
//! graphs, and crash tests: an execution killed with SIGKILL in a Wait state, in a Task's retry
//! interval and inside a Map (some iterations done, one waiting) resumes after a restart on the same
//! SQLite file, finishes with the right output and calls no finished task again.
//!
//! "Not called again" is checked twice: in the journal (every operation has one `invokeFunction`
//! effect and one result) and in the restarted process's own `/metrics`, which count the calls that
//! process made per Resource.

use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::run;

use crate::support::server;
use server::{Serve, Server};

/// Longest an instance may take to reach a position or end (generous: debug builds on busy machines).
const DEADLINE: Duration = Duration::from_secs(60);

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/asl").join(name)
}

/// `sm4c serve --db DB --mock MOCKS [--definitions DIR]` (appending to `log`), once it answers
/// `/healthz`.
fn start(db: &Path, definitions: Option<&Path>, log: &Path) -> Server {
    let mut serve = Serve::new().db(db).log(log).arg("--mock").arg(data("mocks.json"));
    if let Some(d) = definitions {
        serve = serve.arg("--definitions").arg(d);
    }
    serve.start()
}

/// What these tests ask of a server.
trait Api {
    fn send(&self, req: reqwest::blocking::RequestBuilder, what: &str) -> (u16, Value);
    fn get(&self, path: &str) -> (u16, Value);
    fn post(&self, path: &str, body: &Value) -> (u16, Value);
    fn start_instance(&self, definition: &str, id: &str, input: Value);
    fn instance(&self, id: &str) -> Value;
    fn history(&self, id: &str) -> Vec<Value>;
    fn wait_for(&self, id: &str, what: &str, done: impl Fn(&Value, &[Value]) -> bool) -> (Value, Vec<Value>);
    fn calls(&self) -> HashMap<String, u64>;
}

impl Api for Server {
    fn send(&self, req: reqwest::blocking::RequestBuilder, what: &str) -> (u16, Value) {
        let r = req
            .send()
            .unwrap_or_else(|e| panic!("{what}: request failed: {e}; server log:\n{}", self.log_tail()));
        let status = r.status().as_u16();
        let text = r.text().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    fn get(&self, path: &str) -> (u16, Value) {
        self.send(
            self.client().get(format!("{}{path}", self.url())),
            &format!("GET {path}"),
        )
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(
            self.client().post(format!("{}{path}", self.url())).json(body),
            &format!("POST {path}"),
        )
    }

    fn start_instance(&self, definition: &str, id: &str, input: Value) {
        let (st, body) = self.post(
            "/instances",
            &json!({"definition": definition, "id": id, "input": input}),
        );
        assert_eq!(st, 201, "POST /instances {id}: {body}");
    }

    fn instance(&self, id: &str) -> Value {
        let (st, body) = self.get(&format!("/instances/{id}"));
        assert_eq!(st, 200, "GET /instances/{id}: {body}");
        body
    }

    fn history(&self, id: &str) -> Vec<Value> {
        let (st, body) = self.get(&format!("/instances/{id}/history?limit=1000"));
        assert_eq!(st, 200, "GET /instances/{id}/history: {body}");
        assert!(body["next"].is_null(), "more than 1000 entries: {body}");
        body["entries"].as_array().cloned().unwrap_or_default()
    }

    /// Polls until `done` holds for the instance and its history.
    fn wait_for(&self, id: &str, what: &str, done: impl Fn(&Value, &[Value]) -> bool) -> (Value, Vec<Value>) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let (v, h) = (self.instance(id), self.history(id));
            if done(&v, &h) {
                return (v, h);
            }
            assert!(
                Instant::now() < deadline,
                "instance {id} did not become {what} within {DEADLINE:?}: {v}\nhistory: {}\nserver log:\n{}",
                Value::Array(h),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Function calls this process made, per Resource (`sm4c_function_call_duration_seconds_count`).
    fn calls(&self) -> HashMap<String, u64> {
        let r = self
            .client()
            .get(format!("{}/metrics", self.url()))
            .send()
            .expect("GET /metrics");
        assert!(r.status().is_success(), "GET /metrics: {}", r.status());
        let text = r.text().expect("metrics text");
        let mut out = HashMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("sm4c_function_call_duration_seconds_count{") else {
                continue;
            };
            let (labels, n) = rest.split_once("} ").expect("a sample line");
            let function = labels
                .split(',')
                .find_map(|l| l.strip_prefix("function=\""))
                .map(|f| f.trim_end_matches('"').to_string())
                .expect("a function label");
            *out.entry(function).or_default() += n.trim().parse::<u64>().expect("a count");
        }
        out
    }
}

/// The operation ids of `invokeFunction` effects for a Resource, in order.
fn calls_of(h: &[Value], resource: &str) -> Vec<String> {
    h.iter()
        .filter(|e| e["entry"] == "effect" && e["effect"] == "invokeFunction" && e["function"] == resource)
        .map(|e| e["op"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// Results (`completed`/`failed` inputs) in the journal, by operation id.
fn results(h: &[Value]) -> HashMap<String, usize> {
    let mut out: HashMap<String, usize> = HashMap::new();
    for e in h {
        if e["entry"] == "input" && (e["input"] == "completed" || e["input"] == "failed") {
            *out.entry(e["op"].as_str().unwrap_or("?").to_string()).or_default() += 1;
        }
    }
    out
}

/// No operation was called or answered twice, no timer started or fired twice, one `finished`.
fn check_journal(id: &str, h: &[Value]) {
    let mut effects: HashMap<String, usize> = HashMap::new();
    let mut fired: HashMap<String, usize> = HashMap::new();
    for e in h {
        if e["entry"] == "effect" {
            let key = format!(
                "{} {}",
                e["effect"].as_str().unwrap_or("?"),
                e["op"].as_str().or(e["timer"].as_str()).unwrap_or("?")
            );
            *effects.entry(key).or_default() += 1;
        }
        if e["entry"] == "input" && e["input"] == "timerFired" {
            *fired.entry(e["timer"].as_str().unwrap_or("?").to_string()).or_default() += 1;
        }
    }
    let twice = |what: &str, m: &HashMap<String, usize>| {
        let dups: Vec<_> = m.iter().filter(|(_, n)| **n > 1).collect();
        assert!(dups.is_empty(), "{id}: {what} recorded more than once: {dups:?}\n{h:?}");
    };
    twice("effect", &effects);
    twice("timerFired", &fired);
    twice("call result", &results(h));
    let finished = h
        .iter()
        .filter(|e| e["entry"] == "trace" && e["step"] == "finished")
        .count();
    assert_eq!(finished, 1, "{id}: one `finished` trace: {h:?}");
    for op in results(h).keys() {
        assert!(
            effects.contains_key(&format!("invokeFunction {op}")),
            "{id}: a result for {op} with no invokeFunction effect: {h:?}"
        );
    }
}

fn has_timer(h: &[Value]) -> bool {
    h.iter().any(|e| e["entry"] == "effect" && e["effect"] == "startTimer")
}

// ---------------------------------------------------------------------------------------------
// Registering ASL definitions
// ---------------------------------------------------------------------------------------------

fn greet() -> Value {
    json!({"StartAt": "Hello", "States": {"Hello": {"Type": "Pass", "Result": "hi", "ResultPath": "$.greeting", "End": true}}})
}

#[test]
fn asl_definitions_register_from_the_folder_by_file_name_and_over_http_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).expect("mkdir");
    std::fs::copy(data("wait.asl.json"), defs.join("wait.asl.json")).expect("copy");
    let s = start(&dir.path().join("s.db"), Some(&defs), &dir.path().join("log"));

    // --definitions: the file's name is the definition's id, kept in `sm4c:id`.
    let (st, body) = s.get("/definitions/wait");
    assert_eq!(st, 200, "the folder's wait.asl.json is registered as `wait`: {body}");
    assert_eq!(body["definition"]["sm4c:id"], "wait", "{body}");
    assert_eq!(body["definition"]["StartAt"], "Reserve", "{body}");

    // ?name= names an ASL body.
    let (st, body) = s.post("/definitions?name=greet", &greet());
    assert_eq!(st, 201, "{body}");
    assert_eq!(body["id"], "greet", "{body}");
    let (st, again) = s.post("/definitions?name=greet", &greet());
    assert_eq!(
        (st, &again["version"]),
        (200, &body["version"]),
        "same content, same version: {again}"
    );
    let (_, stored) = s.get("/definitions/greet");
    assert_eq!(
        stored["definition"]["sm4c:id"], "greet",
        "the name is stored as sm4c:id: {stored}"
    );

    // sm4c:id in the body names it too; a ?name= that agrees is fine.
    let mut named = greet();
    named["sm4c:id"] = json!("hello");
    let (st, body) = s.post("/definitions", &named);
    assert_eq!((st, &body["id"]), (201, &json!("hello")), "{body}");
    let (st, body) = s.post("/definitions?name=hello", &named);
    assert_eq!(st, 200, "{body}");

    // No name at all: refused, saying how to name it.
    let (st, body) = s.post("/definitions", &greet());
    assert_eq!(st, 400, "{body}");
    assert_eq!(body["error"], "unnamedDefinition", "{body}");
    let msg = body["message"].as_str().unwrap_or_default();
    assert!(msg.contains("?name=") && msg.contains("sm4c:id"), "{body}");

    // A name that disagrees with the body.
    let (st, body) = s.post("/definitions?name=other", &named);
    assert_eq!(
        (st, body["error"].as_str()),
        (400, Some("definitionNameMismatch")),
        "{body}"
    );
    assert!(body["message"].as_str().unwrap_or_default().contains("hello"), "{body}");
    let (st, body) = s.post("/definitions?name=", &greet());
    assert_eq!((st, body["error"].as_str()), (400, Some("invalidQuery")), "{body}");

    // Invalid ASL: every error with its JSON pointer.
    let bad = json!({"StartAt": "A", "States": {
        "A": {"Type": "Pass", "Next": "Nowhere"},
        "B": {"Type": "Teleport", "End": true}
    }});
    let (st, body) = s.post("/definitions?name=bad", &bad);
    assert_eq!((st, body["error"].as_str()), (400, Some("invalidDefinition")), "{body}");
    let pointers: Vec<&str> = body["details"]
        .as_array()
        .expect("details")
        .iter()
        .filter_map(|d| d["pointer"].as_str())
        .collect();
    assert!(
        pointers.iter().any(|p| p.starts_with("/States/A")) && pointers.iter().any(|p| p.starts_with("/States/B")),
        "an error for each bad state, with its pointer: {body}"
    );

    // The OpenAPI document describes ?name=.
    let (_, api) = s.get("/openapi.json");
    let params = &api["paths"]["/definitions"]["post"]["parameters"];
    assert!(
        params
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["name"] == "name" && p["in"] == "query")),
        "{params}"
    );

    // `sm4c define FILE` names an ASL file after the file.
    let map_file = dir.path().join("packing.asl.json");
    std::fs::copy(data("map.asl.json"), &map_file).expect("copy");
    let (code, out, err) = run::sm4c(&["define", map_file.to_str().unwrap(), "--server", s.url()]);
    assert_eq!(code, 0, "sm4c define: {out}{err}");
    assert!(out.contains("registered packing version"), "{out}");
    let (st, body) = s.get("/definitions/packing");
    assert_eq!(st, 200, "{body}");
    let bad_file = run::write(dir.path(), "bad.asl.json", &bad);
    let (code, out, err) = run::sm4c(&["define", &bad_file, "--server", s.url()]);
    assert_eq!(code, 1, "an invalid definition is refused: {out}{err}");
    assert!(err.contains("invalidDefinition") && err.contains("/States/B"), "{err}");
}

#[test]
fn a_runaway_jsonata_expression_fails_its_instance_and_the_server_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(&dir.path().join("s.db"), None, &dir.path().join("log"));
    let spin = json!({
        "QueryLanguage": "JSONata",
        "StartAt": "Spin",
        "States": {"Spin": {"Type": "Pass", "Output": {"v": "{% [1..10000000].[1..10000000] %}"}, "End": true}}
    });
    let (st, body) = s.post("/definitions?name=spin", &spin);
    assert_eq!(st, 201, "{body}");
    let (st, body) = s.post("/definitions?name=greet", &greet());
    assert_eq!(st, 201, "{body}");

    s.start_instance("spin", "spin-1", json!({}));
    let (v, h) = s.wait_for("spin-1", "ended", |v, _| {
        !matches!(v["status"].as_str(), Some("waiting" | "running"))
    });
    assert_eq!(v["status"], "failed", "{v}\n{h:?}");
    assert_eq!(v["error"]["type"], "States.QueryEvaluationError", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("JSONata evaluation budget of 10000000 steps"), "{v}");

    // The task that decides for every instance is free again.
    s.start_instance("greet", "greet-1", json!({"name": "Ada"}));
    let (v, _) = s.wait_for("greet-1", "ended", |v, _| {
        !matches!(v["status"].as_str(), Some("waiting" | "running"))
    });
    assert_eq!(v["status"], "completed", "{v}");
}

// ---------------------------------------------------------------------------------------------
// Instances: start, show, list, history, cancel, explain
// ---------------------------------------------------------------------------------------------

#[test]
fn asl_instances_start_show_list_history_cancel_and_explain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).expect("mkdir");
    for f in ["wait.asl.json", "flow.asl.json"] {
        std::fs::copy(data(f), defs.join(f)).expect("copy");
    }
    let s = start(&dir.path().join("s.db"), Some(&defs), &dir.path().join("log"));
    let url = s.url();

    // start (CLI), then show while it waits: the current state and its input.
    let input = run::write(dir.path(), "in.json", &json!({"item": "book", "to": "Oslo"}));
    let (code, out, err) = run::sm4c(&["start", "wait", "--id", "w-1", "--input", &input, "--server", url]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("started w-1"), "{out}");
    let (v, _) = s.wait_for("w-1", "waiting in Nap", |v, h| v["state"] == "Nap" && has_timer(h));
    assert_eq!(v["status"], "waiting", "{v}");
    assert!(v["startedAt"].is_string(), "an ASL instance has a start time: {v}");
    assert_eq!(v["data"]["reserved"], json!({"item": "book", "ok": true}), "{v}");

    // list and show (CLI).
    let (code, out, err) = run::sm4c(&["list", "--definition", "wait", "--server", url]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("w-1") && out.contains("Nap"), "{out}");
    let (code, out, _) = run::sm4c(&["show", "w-1", "--server", url]);
    assert_eq!(code, 0);
    assert!(out.contains("waiting") && out.contains("\"book\""), "{out}");

    // cancel (CLI): the Wait's timer stops, the instance is cancelled.
    let (code, out, err) = run::sm4c(&["cancel", "w-1", "--server", url]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("w-1 cancelled"), "{out}");
    let (v, h) = s.wait_for("w-1", "cancelled", |v, _| v["status"] == "cancelled");
    assert!(v["endedAt"].is_string(), "{v}");
    assert!(
        !h.iter().any(|e| e["entry"] == "input" && e["input"] == "timerFired"),
        "the Wait never fired: {h:?}"
    );
    assert_eq!(calls_of(&h, "arn:sm4c:ship"), Vec::<String>::new(), "{h:?}");

    // A failed ASL instance: its Error and Cause.
    s.start_instance("flow", "f-bad", json!({"ok": false}));
    let (v, h) = s.wait_for("f-bad", "ended", |v, _| {
        !matches!(v["status"].as_str(), Some("waiting" | "running"))
    });
    assert_eq!(v["status"], "failed", "{v}\n{h:?}");
    assert_eq!(v["error"]["type"], "Refused", "{v}");
    assert_eq!(v["error"]["message"], "the check refused", "{v}");
    assert_eq!(
        v["error"]["details"],
        json!({"Error": "Refused", "Cause": "the check refused"}),
        "{v}"
    );
    assert_eq!(v["state"], "Refused", "{v}");
    let (code, out, _) = run::sm4c(&["show", "f-bad", "--server", url]);
    assert_eq!(code, 0);
    assert!(
        out.contains("error:") && out.contains("Refused: the check refused"),
        "{out}"
    );
    // history (CLI): the task call, the catch to Refused, the end.
    let (code, out, _) = run::sm4c(&["history", "f-bad", "--server", url]);
    assert_eq!(code, 0);
    assert!(
        out.contains("invokeFunction arn:sm4c:check")
            && out.contains("enter state Refused")
            && out.contains("instance failed"),
        "{out}"
    );
    assert_eq!(calls_of(&h, "arn:sm4c:check").len(), 1);

    // A completed one, through a Parallel state.
    s.start_instance("flow", "f-ok", json!({"ok": true, "kind": "both"}));
    let (v, h) = s.wait_for("f-ok", "ended", |v, _| {
        !matches!(v["status"].as_str(), Some("waiting" | "running"))
    });
    assert_eq!(
        (&v["status"], &v["state"]),
        (&json!("completed"), &json!("Done")),
        "{v}\n{h:?}"
    );
    let branch = json!({"ok": true, "kind": "both", "check": {"checked": true}});
    assert_eq!(
        v["data"],
        json!([branch, branch]),
        "a Parallel's output is its branches' outputs: {v}"
    );
    let (code, out, _) = run::sm4c(&["list", "--status", "completed", "--server", url, "--json"]);
    assert_eq!(code, 0);
    assert!(
        run::parse(&out)
            .as_array()
            .is_some_and(|l| l.iter().any(|i| i["id"] == "f-ok")),
        "{out}"
    );

    // explain: ASL instances declare no events, so an event reaches none of them; it still answers.
    let event = json!({"specversion": "1.0", "id": "e1", "source": "shop", "type": "com.example.paid"});
    let (st, body) = s.send(
        s.client()
            .post(format!("{url}/events/explain"))
            .header("content-type", "application/cloudevents+json")
            .body(event.to_string()),
        "POST /events/explain",
    );
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["reached"], json!([]), "{body}");
}

// ---------------------------------------------------------------------------------------------
// Graphs
// ---------------------------------------------------------------------------------------------

#[test]
fn graph_draws_asl_states_choices_catches_ends_branches_and_map_processors() {
    let file = data("flow.asl.json");
    let file = file.to_str().unwrap();
    let (code, out, err) = run::sm4c(&["graph", file, "--format", "mermaid"]);
    assert_eq!(code, 0, "{err}");
    let node = |name: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_suffix(&format!(" : {name}")).map(str::to_string))
            .unwrap_or_else(|| panic!("no state {name} in:\n{out}"))
    };
    let has = |l: String| assert!(out.lines().any(|x| x.trim() == l), "no line {l:?} in:\n{out}");
    let (check, route, hold, both, each, refused, done) = (
        node("Check"),
        node("Route"),
        node("Hold"),
        node("Both"),
        node("Each"),
        node("Refused"),
        node("Done"),
    );
    assert!(out.starts_with("stateDiagram-v2\n"), "{out}");
    has(format!("[*] --> {check}"));
    has(format!("{check} --> {route}"));
    has(format!("{check} --> {refused} : Catch States.ALL"));
    has(format!("{route} --> {both} : $.kind StringEquals both"));
    has(format!(
        "{route} --> {each} : ($.n NumericGreaterThan 1) and (not ($.kind IsPresent true))"
    ));
    has(format!("{route} --> {hold} : Default"));
    has(format!("{hold} --> {done} : after 60 s"));
    has(format!("{refused} --> [*] : fails Refused"));
    has(format!("{done} --> [*]"));
    // The Parallel's branches are concurrent regions of its composite state; the Map's processor is
    // inside the Map.
    let (left, right, right_end, item) = (node("Left"), node("Right"), node("RightEnd"), node("Item"));
    has(format!("state {both} {{"));
    has(format!("[*] --> {left}"));
    has(format!("{left} --> [*]"));
    has(format!("{right} --> {right_end}"));
    has("--".into());
    has(format!("state {each} {{"));
    has(format!("[*] --> {item}"));

    let (code, dot, err) = run::sm4c(&["graph", file, "--format", "dot"]);
    assert_eq!(code, 0, "{err}");
    assert!(dot.starts_with("digraph \"flow\" {"), "{dot}");
    for want in [
        "label=\"Check\\n(Task)\"",
        "label=\"Route\\n(Choice)\", shape=diamond",
        "label=\"Catch States.ALL\", style=dashed",
        "label=\"Default\"",
        "subgraph cluster_",
        "label=\"Both branch 1\"",
        "label=\"Both branch 2\"",
        "label=\"Each item processor\"",
    ] {
        assert!(dot.contains(want), "no {want:?} in:\n{dot}");
    }
    assert_eq!(
        dot.matches('{').count(),
        dot.matches('}').count(),
        "balanced braces:\n{dot}"
    );
}

// ---------------------------------------------------------------------------------------------
// Crash tests
// ---------------------------------------------------------------------------------------------

/// Starts a server with the test definitions, returning it with its paths.
fn crash_server(dir: &Path) -> (Server, PathBuf, PathBuf) {
    let defs = dir.join("defs");
    std::fs::create_dir_all(&defs).expect("mkdir");
    for f in ["wait.asl.json", "retry.asl.json", "map.asl.json"] {
        std::fs::copy(data(f), defs.join(f)).expect("copy");
    }
    let db = dir.join("crash.db");
    let s = start(&db, Some(&defs), &dir.join("log"));
    (s, db, defs)
}

#[test]
fn an_asl_execution_killed_in_a_wait_state_resumes_and_does_not_call_finished_tasks_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut s, db, defs) = crash_server(dir.path());
    s.start_instance("wait", "w", json!({"item": "book", "to": "Oslo"}));
    let (before, h) = s.wait_for("w", "waiting in the Wait state", |v, h| {
        v["state"] == "Nap" && has_timer(h)
    });
    assert_eq!(before["status"], "waiting", "{before}");
    assert_eq!(calls_of(&h, "arn:sm4c:reserve").len(), 1, "{h:?}");
    s.kill();

    let s = start(&db, Some(&defs), &dir.path().join("log"));
    let (v, h) = s.wait_for("w", "completed after the restart", |v, _| {
        v["status"].as_str() != Some("waiting")
    });
    assert_eq!(v["status"], "completed", "{v}\n{h:?}");
    assert_eq!(
        v["data"],
        json!({"item": "book", "to": "Oslo", "reserved": {"item": "book", "ok": true}, "shipped": "shipped to Oslo"}),
        "{v}"
    );
    check_journal("w", &h);
    assert_eq!(calls_of(&h, "arn:sm4c:reserve").len(), 1, "{h:?}");
    assert_eq!(calls_of(&h, "arn:sm4c:ship").len(), 1, "{h:?}");
    let calls = s.calls();
    assert_eq!(
        calls.get("arn:sm4c:reserve"),
        None,
        "Reserve finished before the kill: {calls:?}"
    );
    assert_eq!(calls.get("arn:sm4c:ship"), Some(&1), "{calls:?}");
}

#[test]
fn an_asl_execution_killed_in_a_retry_interval_resumes_with_its_attempt_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut s, db, defs) = crash_server(dir.path());
    s.start_instance("retry", "r", json!({"amount": 5}));
    // The first attempt failed and its retry timer runs.
    let (_, h) = s.wait_for("r", "in Charge's first retry interval", |v, h| {
        v["state"] == "Charge" && !results(h).is_empty() && calls_of(h, "arn:sm4c:charge").len() == 1 && has_timer(h)
    });
    let answered_before = h
        .iter()
        .filter(|e| e["entry"] == "input" && e["input"] == "failed")
        .count();
    assert_eq!(answered_before, 1, "one failed attempt before the kill: {h:?}");
    s.kill();

    let s = start(&db, Some(&defs), &dir.path().join("log"));
    let (v, h) = s.wait_for("r", "ended after the restart", |v, _| {
        !matches!(v["status"].as_str(), Some("waiting" | "running"))
    });
    assert_eq!(v["status"], "completed", "{v}\n{h:?}");
    assert_eq!(
        v["data"],
        json!({"amount": 5, "reserved": {"item": "items", "ok": true}, "charged": {"amount": 5, "attempts": 3}}),
        "three attempts in all: {v}"
    );
    check_journal("r", &h);
    let charge = calls_of(&h, "arn:sm4c:charge");
    assert_eq!(charge.len(), 3, "three attempts, each called once: {charge:?}");
    assert!(
        charge[1].starts_with(&charge[0]) && charge[1] != charge[0] && charge[2] != charge[1],
        "retries have their own operation ids: {charge:?}"
    );
    let failed = h
        .iter()
        .filter(|e| e["entry"] == "input" && e["input"] == "failed")
        .count();
    assert_eq!(failed, 2, "{h:?}");
    let timers = h
        .iter()
        .filter(|e| e["entry"] == "effect" && e["effect"] == "startTimer")
        .count();
    assert_eq!(timers, 2, "one retry interval per failed attempt: {h:?}");
    let calls = s.calls();
    assert_eq!(
        calls.get("arn:sm4c:reserve"),
        None,
        "Reserve finished before the kill: {calls:?}"
    );
    assert_eq!(
        calls.get("arn:sm4c:charge"),
        Some(&2),
        "the attempt that failed before the kill is not made again: {calls:?}"
    );
}

#[test]
fn an_asl_map_killed_with_an_iteration_waiting_resumes_without_repeating_done_iterations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut s, db, defs) = crash_server(dir.path());
    let items = json!([{"n": 1}, {"n": 2}, {"n": 3, "slow": true}, {"n": 4}]);
    s.start_instance("map", "m", json!({"items": items}));
    let (_, h) = s.wait_for("m", "waiting in item 3's Wait", |_, h| has_timer(h));
    let packed_before = calls_of(&h, "arn:sm4c:pack");
    assert_eq!(
        packed_before.len(),
        3,
        "items 1-3 packed, one at a time, before the kill: {h:?}"
    );
    assert_eq!(results(&h).len(), 4, "reserve and three packs answered: {h:?}");
    s.kill();

    let s = start(&db, Some(&defs), &dir.path().join("log"));
    let (v, h) = s.wait_for("m", "ended after the restart", |v, _| {
        !matches!(v["status"].as_str(), Some("waiting" | "running"))
    });
    assert_eq!(v["status"], "completed", "{v}\n{h:?}");
    let packed = |n: u64, slow: bool| json!({"n": n, "slow": slow, "packed": true});
    assert_eq!(
        v["data"]["packed"],
        json!([packed(1, false), packed(2, false), packed(3, true), packed(4, false)]),
        "{v}"
    );
    check_journal("m", &h);
    let pack = calls_of(&h, "arn:sm4c:pack");
    assert_eq!(pack.len(), 4, "each item packed once: {pack:?}");
    assert_eq!(
        pack[..3],
        packed_before[..],
        "the first three calls are those made before the kill"
    );
    let calls = s.calls();
    assert_eq!(calls.get("arn:sm4c:reserve"), None, "{calls:?}");
    assert_eq!(
        calls.get("arn:sm4c:pack"),
        Some(&1),
        "only item 4 is packed after the restart: {calls:?}"
    );
}

/// An execution waiting in a Wait state moves to a second version (its states renamed, its last
/// Task writing elsewhere) with the Wait's timer kept; killed right after the move, it finishes on
/// the second version's path after the restart.
#[test]
fn an_asl_execution_waiting_in_a_wait_state_migrates_and_finishes_on_the_new_version_after_a_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut s, db, defs) = crash_server(dir.path());
    let v2 = json!({"StartAt": "Reserve", "States": {
        "Reserve": {"Type": "Task", "Resource": "arn:sm4c:reserve", "ResultPath": "$.reserved", "Next": "Rest"},
        "Rest": {"Type": "Wait", "Seconds": 3, "Next": "Send"},
        "Send": {"Type": "Task", "Resource": "arn:sm4c:ship", "ResultPath": "$.sent", "End": true}}});
    let (_, d) = s.get("/definitions/wait");
    let v1 = d["latest"].as_str().expect("the folder's version").to_string();
    let (st, b) = s.send(
        s.client()
            .post(format!("{}/definitions?name=wait", s.url()))
            .header("content-type", "application/json")
            .body(v2.to_string()),
        "register version 2",
    );
    assert_eq!(st, 201, "{b}");
    let version = b["version"].as_str().expect("a version").to_string();
    // Started on the first version by name (the second is the newest now).
    let (st, b) = s.post(
        "/instances",
        &json!({"definition": "wait", "version": v1, "id": "w", "input": {"item": "book", "to": "Oslo"}}),
    );
    assert_eq!(st, 201, "{b}");
    let (before, _) = s.wait_for("w", "waiting in the Wait state", |v, h| {
        v["state"] == "Nap" && has_timer(h)
    });
    assert_eq!(before["version"], json!(v1));
    let (st, b) = s.post("/instances/w/migrate", &json!({"version": version}));
    assert_eq!(
        (st, b["details"]["reason"].as_str()),
        (409, Some("noCounterpart")),
        "{b}"
    );
    let (st, b) = s.post(
        "/instances/w/migrate",
        &json!({"version": version, "states": {"Nap": "Rest"}}),
    );
    assert_eq!(st, 200, "{b}");
    assert_eq!((&b["state"], &b["version"]), (&json!("Rest"), &json!(version)), "{b}");
    assert_eq!(b["migration"]["timers"][0]["change"], "kept", "{b}");
    s.kill();

    let s = start(&db, Some(&defs), &dir.path().join("log"));
    let (v, h) = s.wait_for("w", "completed after the restart", |v, _| {
        v["status"].as_str() != Some("waiting")
    });
    assert_eq!(v["status"], "completed", "{v}\n{h:?}");
    assert_eq!(v["version"], json!(version));
    assert_eq!(v["data"]["sent"], "shipped to Oslo", "{v}");
    assert!(v["data"].get("shipped").is_none(), "{v}");
    assert_eq!(calls_of(&h, "arn:sm4c:reserve").len(), 1, "{h:?}");
}
