//! Crash and durability tests against the real `sm4c serve` binary.
//!
//! Every test starts `sm4c serve` as a child process on its own SQLite file and port, and "crashes" it
//! with SIGKILL (`Child::kill` on Unix), then starts it again on the same file. What must hold:
//! journals are written before effects; after kill -9 every instance resumes from its journal
//! (completed actions are not run again, calls in flight are made again with the same operation id,
//! sent events keep their ids); timers are durable and fire on time, or at once when they came due
//! while the server was down; a journal that no longer matches its definition fails the instance with
//! `replayMismatch`; cancelling is durable; a crashed store opens cleanly while a foreign or corrupt
//! file is refused with exit code 2 and left untouched.

use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::server;
use server::{Serve, Server, BIN};

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Starts `sm4c serve --db DB [--mock MOCK]` (appending to `log`) and waits until `/healthz` answers.
fn start(db: &Path, mock: Option<&Path>, log: &Path) -> Server {
    start_with(db, mock, log, &[])
}

/// [`start`] with more arguments to `sm4c serve`.
fn start_with(db: &Path, mock: Option<&Path>, log: &Path, args: &[&str]) -> Server {
    let mut serve = Serve::new().db(db).log(log);
    if let Some(m) = mock {
        serve = serve.arg("--mock").arg(m);
    }
    serve.args(args).start()
}

/// What these tests ask of a server.
trait Api {
    fn send(&self, req: reqwest::blocking::RequestBuilder, what: &str) -> (u16, Value);
    fn cli(&self, args: &[&str]) -> (Option<i32>, String, String);
    fn get(&self, path: &str) -> (u16, Value);
    fn post(&self, path: &str, body: &Value) -> (u16, Value);
    fn define(&self, doc: &Value);
    fn start_instance(&self, definition: &str, id: &str, input: Value);
    fn instance(&self, id: &str) -> Value;
    fn history(&self, id: &str) -> Vec<Value>;
    fn sent(&self) -> Vec<Value>;
    fn post_event(&self, event: &Value) -> (u16, Value);
    fn wait_instance(&self, id: &str, timeout: Duration, what: &str, done: impl Fn(&Value) -> bool) -> Value;
}

impl Api for Server {
    fn send(&self, req: reqwest::blocking::RequestBuilder, what: &str) -> (u16, Value) {
        let r = req
            .send()
            .unwrap_or_else(|e| panic!("{what}: request failed: {e}; server log:\n{}", self.log_tail()));
        let status = r.status().as_u16();
        let text = r.text().unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, body)
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

    fn define(&self, doc: &Value) {
        let (st, body) = self.post("/definitions", doc);
        assert!(st == 201 || st == 200, "POST /definitions: {st} {body}");
    }

    fn start_instance(&self, definition: &str, id: &str, input: Value) {
        let (st, body) = self.post(
            "/instances",
            &json!({"definition": definition, "id": id, "input": input}),
        );
        assert_eq!(st, 201, "POST /instances {id}: {body}");
        assert_eq!(body["id"], id, "POST /instances {id}: {body}");
    }

    fn instance(&self, id: &str) -> Value {
        let (st, body) = self.get(&format!("/instances/{id}"));
        assert_eq!(st, 200, "GET /instances/{id}: {body}");
        body
    }

    /// The whole journal of an instance, following the `next` cursor.
    fn history(&self, id: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = String::new();
        loop {
            let (st, body) = self.get(&format!("/instances/{id}/history?limit=1000&after={after}"));
            assert_eq!(st, 200, "GET /instances/{id}/history: {body}");
            let entries = body["entries"].as_array().cloned().unwrap_or_default();
            let n = entries.len();
            out.extend(entries);
            match body["next"].as_str() {
                Some(next) if n > 0 => after = next.to_string(),
                _ => return out,
            }
        }
    }

    /// Every event in the outbox, following the `next` cursor.
    fn sent(&self) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = String::new();
        loop {
            let (st, body) = self.get(&format!("/events/sent?limit=1000&after={after}"));
            assert_eq!(st, 200, "GET /events/sent: {body}");
            let events = body["events"].as_array().cloned().unwrap_or_default();
            if events.is_empty() {
                return out;
            }
            out.extend(events);
            match body["next"].as_str() {
                Some(next) => after = next.to_string(),
                None => return out,
            }
        }
    }

    /// Posts a CloudEvent in structured mode.
    fn post_event(&self, event: &Value) -> (u16, Value) {
        self.send(
            self.client()
                .post(format!("{}/events", self.url()))
                .header("content-type", "application/cloudevents+json")
                .body(event.to_string()),
            "POST /events",
        )
    }

    /// Polls an instance until `done` holds for it.
    fn wait_instance(&self, id: &str, timeout: Duration, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.instance(id);
            if done(&v) {
                return v;
            }
            if Instant::now() > deadline {
                panic!(
                    "instance {id} did not become {what} within {timeout:?}: {v}\nhistory: {}\nserver log:\n{}",
                    Value::Array(self.history(id)),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(v).expect("serialize")).expect("write file");
}

/// Entries of a journal with a given `entry` kind and `step`/`effect`/`input` tag.
fn entries<'a>(history: &'a [Value], entry: &str, tag_field: &str, tag: &str) -> Vec<&'a Value> {
    history
        .iter()
        .filter(|e| e["entry"] == entry && e[tag_field] == tag)
        .collect()
}

/// Copies a (possibly crashed) store with its WAL so it can be inspected without recovering the original.
fn snapshot_store(db: &Path, dir: &Path) -> PathBuf {
    let copy = dir.join("inspect.db");
    for suffix in ["", "-wal", "-shm"] {
        let from = PathBuf::from(format!("{}{suffix}", db.display()));
        let to = PathBuf::from(format!("{}{suffix}", copy.display()));
        let _ = std::fs::remove_file(&to);
        if from.exists() {
            std::fs::copy(&from, &to).expect("copy store file");
        }
    }
    copy
}

/// Runs `sm4c serve` on a file that must be refused: returns (exit code, stderr).
fn serve_refused(db: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(BIN)
        .arg("serve")
        .arg("--db")
        .arg(db)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sm4c serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            return (status.code(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "sm4c serve --db {} did not exit within 20 s: it accepted the file",
                db.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn dir_listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
}

// ---------------------------------------------------------------------------------------------
// 1. The crash test
// ---------------------------------------------------------------------------------------------

/// Iterations of the slow mock: long enough (about 0.1–0.3 s in a debug build) that a kill right
/// after a start lands while the call is being made.
const SPIN: u64 = 25_000;

fn crash_definition() -> Value {
    json!({
        "id": "crash",
        "name": "Crash test",
        "version": "1.0",
        "events": [{
            "name": "orderPaid",
            "type": "com.example.paid",
            "source": "shop",
            "correlation": [{"contextAttributeName": "orderId", "contextAttributeValue": "${ .orderId }"}]
        }],
        "functions": [
            {"name": "work", "operation": "http://example.org/api.json#work"},
            {"name": "slow", "operation": "http://example.org/api.json#slow"},
            {"name": "finish", "operation": "http://example.org/api.json#finish"}
        ],
        "retries": [{"name": "slowRetry", "delay": "12s", "maxAttempts": 1}],
        "states": [
            {
                "name": "Prepare",
                "start": true,
                "enterAction": {"type": "injectData", "expression": "${ .n * 10 }"},
                "enterResultHandler": "${ .prepared = $value }",
                "transitions": [
                    {"condition": "${ .g == \"A\" }", "nextState": "Sleep"},
                    {"condition": "${ .g == \"B\" }", "nextState": "AwaitOrder"},
                    {"condition": "${ .g == \"C\" }", "nextState": "Call"},
                    {"nextState": "Slow"}
                ]
            },
            {
                "name": "Sleep",
                "enterAction": {"type": "delay", "timeout": "12s"},
                "transitions": [{"nextState": "Done"}]
            },
            {
                "name": "AwaitOrder",
                "transitions": [{
                    "nextState": "Done",
                    "eventGroups": [{"events": ["orderPaid"], "resultHandler": "${ .paid = ($value | .data) }"}]
                }]
            },
            {
                "name": "Call",
                "enterAction": {
                    "type": "sequence",
                    "actions": [{
                        "name": "work",
                        "type": "invokeFunction",
                        "functionName": "work",
                        "waitForCompletion": true,
                        "arguments": {"n": "${ .n }", "g": "${ .g }"},
                        "errorHandlers": [{"retryPolicy": "slowRetry"}]
                    }],
                    "errorHandlers": [{"resultHandler": "${ .handled = ($value | .message) }"}]
                },
                "transitions": [{"nextState": "Done"}]
            },
            {
                "name": "Slow",
                "enterAction": {
                    "type": "invokeFunction",
                    "functionName": "slow",
                    "waitForCompletion": true,
                    "arguments": {"n": "${ .n }"}
                },
                "enterResultHandler": "${ .slow = $value }",
                "transitions": [{"nextState": "Done"}]
            },
            {
                "name": "Done",
                "enterAction": {
                    "type": "invokeFunction",
                    "functionName": "finish",
                    "waitForCompletion": true,
                    "arguments": {"n": "${ .n }"}
                },
                "enterResultHandler": "${ .finished = $value }"
            }
        ]
    })
}

fn crash_mocks() -> Value {
    json!({
        "work": "if .g == \"C\" then error(\"flaky\") else {ok: .n} end",
        "slow": format!("(reduce range(0; {SPIN}) as $i (0; . + 1)) as $x | {{ok: .n, spin: $x}}"),
        "finish": "{done: .n}"
    })
}

fn group(i: usize) -> &'static str {
    match i {
        0..=59 => "A",
        60..=119 => "B",
        120..=179 => "C",
        _ => "D",
    }
}

fn crash_id(i: usize) -> String {
    format!("crash-{i:03}")
}

fn crash_input(i: usize) -> Value {
    json!({"n": i, "g": group(i), "orderId": format!("order-{i}")})
}

fn crash_expected(i: usize) -> Value {
    let mut v = crash_input(i);
    v["prepared"] = json!(i * 10);
    match group(i) {
        "B" => v["paid"] = json!({"amount": i}),
        "C" => v["handled"] = json!("flaky"),
        "D" => v["slow"] = json!({"ok": i, "spin": SPIN}),
        _ => {}
    }
    v["finished"] = json!({"done": i});
    v
}

/// Is the instance in the mid-flight position its group should be in?
fn in_position(s: &Server, i: usize) -> bool {
    let v = s.instance(&crash_id(i));
    // An instance in an action (a delay, a call, a retry backoff) is `running`; one waiting on its
    // transitions (events, timeouts) is `waiting`.
    let state_ok = |st: &str, status: &str| v["status"] == status && v["state"] == st;
    match group(i) {
        "A" => {
            state_ok("Sleep", "running")
                && s.history(&crash_id(i))
                    .iter()
                    .any(|e| e["entry"] == "effect" && e["effect"] == "startTimer")
        }
        "B" => state_ok("AwaitOrder", "waiting"),
        "C" => {
            state_ok("Call", "running")
                && s.history(&crash_id(i))
                    .iter()
                    .any(|e| e["entry"] == "trace" && e["step"] == "retrying")
        }
        _ => true,
    }
}

/// Checks one finished instance's journal: no completed action ran twice, no effect or input was
/// recorded twice, timers fired once and not before they were due.
fn check_journal(id: &str, history: &[Value]) -> Result<(), String> {
    let mut completed: HashMap<String, usize> = HashMap::new();
    let mut effects: HashMap<String, usize> = HashMap::new();
    let mut results: HashMap<String, usize> = HashMap::new();
    let mut fired: HashMap<String, usize> = HashMap::new();
    let mut finished = 0;
    for e in history {
        match e["entry"].as_str() {
            Some("trace") if e["step"] == "actionCompleted" => {
                *completed
                    .entry(e["op"].as_str().unwrap_or("?").to_string())
                    .or_default() += 1;
            }
            Some("trace") if e["step"] == "finished" => finished += 1,
            Some("effect") => {
                let key = format!(
                    "{} {}",
                    e["effect"].as_str().unwrap_or("?"),
                    e["op"].as_str().or(e["timer"].as_str()).unwrap_or("?")
                );
                *effects.entry(key).or_default() += 1;
            }
            Some("input") if e["input"] == "completed" || e["input"] == "failed" => {
                *results.entry(e["op"].as_str().unwrap_or("?").to_string()).or_default() += 1;
            }
            Some("input") if e["input"] == "timerFired" => {
                *fired.entry(e["timer"].as_str().unwrap_or("?").to_string()).or_default() += 1;
            }
            _ => {}
        }
    }
    let twice = |what: &str, m: &HashMap<String, usize>| -> Result<(), String> {
        let dups: BTreeMap<&String, &usize> = m.iter().filter(|(_, n)| **n > 1).collect();
        if dups.is_empty() {
            Ok(())
        } else {
            Err(format!("{id}: {what} recorded more than once: {dups:?}"))
        }
    };
    twice("actionCompleted trace (a completed action ran again)", &completed)?;
    twice("effect", &effects)?;
    twice("call result input", &results)?;
    twice("timerFired input", &fired)?;
    if finished != 1 {
        return Err(format!("{id}: {finished} `finished` traces"));
    }
    // Every result answers an invokeFunction or startSubflow effect with the same operation id.
    for op in results.keys() {
        if !effects.contains_key(&format!("invokeFunction {op}"))
            && !effects.contains_key(&format!("startSubflow {op}"))
        {
            return Err(format!(
                "{id}: result for op {op} without an invokeFunction or startSubflow effect with that op"
            ));
        }
    }
    // Timers fire at or after their due time.
    for t in entries(history, "effect", "effect", "startTimer") {
        let timer = t["timer"].as_str().unwrap_or("?");
        let due = t["due"]
            .as_i64()
            .ok_or_else(|| format!("{id}: startTimer without `due`: {t}"))?;
        if let Some(f) = history
            .iter()
            .find(|e| e["entry"] == "input" && e["input"] == "timerFired" && e["timer"] == timer)
        {
            let at = f["at"]
                .as_i64()
                .ok_or_else(|| format!("{id}: timerFired without `at`: {f}"))?;
            if at < due {
                return Err(format!("{id}: timer {timer} fired at {at}, before it was due at {due}"));
            }
        }
    }
    Ok(())
}

#[test]
fn kill_dash_nine_mid_flight_every_instance_resumes_from_its_journal() {
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("crash.db");
    let mock = dir.path().join("mocks.json");
    let log = dir.path().join("server.log");
    write_json(&mock, &crash_mocks());

    let mut s = start(&db, Some(&mock), &log);
    s.define(&crash_definition());

    // Groups A, B and C: 180 instances started from 6 threads.
    let t_start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..6 {
            let s = &s;
            scope.spawn(move || {
                for i in (t..180).step_by(6) {
                    s.start_instance("crash", &crash_id(i), crash_input(i));
                }
            });
        }
    });
    let started_in = t_start.elapsed();
    // Each is mid-flight: A in its delay, B waiting for its event, C in retry backoff.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut pending: Vec<usize> = (0..180).collect();
    while !pending.is_empty() {
        pending.retain(|&i| !in_position(&s, i));
        if !pending.is_empty() && Instant::now() > deadline {
            let i = pending[0];
            panic!(
                "{} instances not mid-flight in time, e.g. {}: {}\nhistory: {}",
                pending.len(),
                crash_id(i),
                s.instance(&crash_id(i)),
                Value::Array(s.history(&crash_id(i)))
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let positioned = t0.elapsed();

    // Group D, one at a time: every start is acknowledged once its invokeFunction effect is committed,
    // and the slow mock then runs. Kill -9 right after the 10th acknowledgement: its call is in flight.
    for i in 180..190 {
        s.start_instance("crash", &crash_id(i), crash_input(i));
    }
    s.kill();
    let killed_at = now_ms();

    // What the crashed store says (inspected on a copy, so the restart still recovers the original).
    let copy = snapshot_store(&db, dir.path());
    let in_flight: Vec<(String, String)> = {
        let conn = rusqlite::Connection::open(&copy).expect("open copy of crashed store");
        let mut stmt = conn
            .prepare("SELECT instance, op FROM calls ORDER BY instance")
            .expect("prepare");
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("query calls")
            .collect::<Result<_, _>>()
            .expect("read calls")
    };
    assert!(
        in_flight.iter().any(|(inst, _)| inst == &crash_id(189)),
        "the last acknowledged start's call should have been in flight at the crash; calls table: {in_flight:?}"
    );

    // Restart on the same file: it opens cleanly and serves every instance started before the crash.
    let restarted_at = now_ms();
    let s = {
        drop(s);
        start(&db, Some(&mock), &log)
    };
    for i in 0..190 {
        let v = s.instance(&crash_id(i));
        assert_eq!(v["id"], crash_id(i));
    }
    // The rest of group D, on the restarted server.
    for i in 190..200 {
        s.start_instance("crash", &crash_id(i), crash_input(i));
    }
    // Group B's events.
    for i in 60..120 {
        let (st, body) = s.post_event(&json!({
            "specversion": "1.0",
            "id": format!("pay-{i}"),
            "source": "shop",
            "type": "com.example.paid",
            "orderid": format!("order-{i}"),
            "datacontenttype": "application/json",
            "data": {"amount": i}
        }));
        assert_eq!(st, 202, "POST /events for {}: {body}", crash_id(i));
        assert_eq!(
            body["reached"],
            json!([crash_id(i)]),
            "event for {} reached: {body}",
            crash_id(i)
        );
    }

    // Every instance completes with its expected data.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut done = 0;
        let mut after = String::new();
        loop {
            let (st, body) = s.get(&format!(
                "/instances?status=completed&definition=crash&limit=1000&after={after}"
            ));
            assert_eq!(st, 200, "GET /instances: {body}");
            let rows = body["instances"].as_array().cloned().unwrap_or_default();
            done += rows.len();
            match body["next"].as_str() {
                Some(n) if !rows.is_empty() => after = n.to_string(),
                _ => break,
            }
        }
        if done == 200 {
            break;
        }
        if Instant::now() > deadline {
            let stuck: Vec<Value> = (0..200)
                .map(|i| s.instance(&crash_id(i)))
                .filter(|v| v["status"] != "completed")
                .take(5)
                .collect();
            panic!(
                "only {done} of 200 instances completed within 60 s of the restart; e.g. {stuck:?}\nserver log:\n{}",
                s.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let completed_in = t0.elapsed();

    let mut failures = Vec::new();
    for i in 0..200 {
        let id = crash_id(i);
        let v = s.instance(&id);
        if v["status"] != "completed" || v["data"] != crash_expected(i) {
            failures.push(format!(
                "{id}: status {} data {} (expected {})",
                v["status"],
                v["data"],
                crash_expected(i)
            ));
            continue;
        }
        let h = s.history(&id);
        if let Err(e) = check_journal(&id, &h) {
            failures.push(e);
            continue;
        }
        // Group A's delay was still pending at the restart: it fires on time, not early, not late.
        if group(i) == "A" {
            let started = entries(&h, "effect", "effect", "startTimer");
            let fired = entries(&h, "input", "input", "timerFired");
            assert_eq!((started.len(), fired.len()), (1, 1), "{id}: {h:?}");
            let (due, at) = (started[0]["due"].as_i64().unwrap(), fired[0]["at"].as_i64().unwrap());
            if due > restarted_at && at - due > 2_000 {
                failures.push(format!("{id}: delay due at {due} fired {} ms late", at - due));
            }
        }
        // Group C retried once after its backoff, with a deterministic attempt id.
        if group(i) == "C" {
            let calls: Vec<&str> = entries(&h, "effect", "effect", "invokeFunction")
                .iter()
                .filter(|e| e["function"] == "work")
                .map(|e| e["op"].as_str().unwrap_or("?"))
                .collect();
            if calls.len() != 2 || calls[1] != format!("{}#2", calls[0]) {
                failures.push(format!(
                    "{id}: work calls {calls:?}, expected a first attempt and one retry `#2`"
                ));
            }
        }
        // The call that was in flight at the crash was made again with the same operation id.
        if let Some((_, op)) = in_flight.iter().find(|(inst, _)| *inst == id) {
            let effects = entries(&h, "effect", "effect", "invokeFunction");
            let same: Vec<_> = effects.iter().filter(|e| e["op"] == op.as_str()).collect();
            let answered = h
                .iter()
                .filter(|e| e["entry"] == "input" && e["input"] == "completed" && e["op"] == op.as_str())
                .count();
            if same.len() != 1 || answered != 1 {
                failures.push(format!(
                    "{id}: call {op} in flight at the crash: {} effects, {answered} results",
                    same.len()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 200 instances wrong after kill -9 and restart:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "crash test: 180 started in {started_in:?}, mid-flight after {positioned:?}, killed at {killed_at}, {} calls in flight, all 200 completed after {completed_in:?}",
        in_flight.len()
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Timers that came due while the server was down
// ---------------------------------------------------------------------------------------------

#[test]
fn a_timer_that_came_due_while_down_fires_at_once_after_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("nap.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&json!({
        "id": "nap", "name": "Nap", "version": "1.0",
        "states": [
            {"name": "Nap", "start": true, "enterAction": {"type": "delay", "timeout": "1s"},
             "transitions": [{"nextState": "Woke"}]},
            {"name": "Woke", "enterAction": {"type": "injectData", "expression": "${ \"woke\" }"},
             "enterResultHandler": "${ .status = $value }"}
        ]
    }));
    s.start_instance("nap", "nap-1", json!({}));
    s.kill();
    std::thread::sleep(Duration::from_secs(2));

    let restarted = now_ms();
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    let v = s.wait_instance(
        "nap-1",
        Duration::from_secs(3),
        "completed promptly after the restart",
        |v| v["status"] == "completed",
    );
    assert_eq!(v["data"], json!({"status": "woke"}));

    let h = s.history("nap-1");
    let started = entries(&h, "effect", "effect", "startTimer");
    assert_eq!(started.len(), 1, "one startTimer effect: {h:?}");
    let due = started[0]["due"].as_i64().expect("startTimer has `due` (ms)");
    let fired = entries(&h, "input", "input", "timerFired");
    assert_eq!(fired.len(), 1, "one timerFired input: {h:?}");
    assert_eq!(fired[0]["timer"], started[0]["timer"]);
    let at = fired[0]["at"].as_i64().expect("timerFired has `at` (ms)");
    assert!(
        fired[0]["time"].is_string(),
        "timerFired has a readable `time`: {}",
        fired[0]
    );
    assert!(at >= due, "fired at {at}, before due {due}");
    assert!(
        due < restarted,
        "the timer came due while the server was down (due {due}, restart {restarted})"
    );
    assert!(
        at <= restarted + 3_000,
        "a timer that came due while down fires at once after the restart: fired {} ms after it",
        at - restarted
    );
    check_journal("nap-1", &h).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 3. Replay mismatch
// ---------------------------------------------------------------------------------------------

#[test]
fn a_journal_that_no_longer_matches_its_definition_fails_the_instance_naming_the_entry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("drift.db");
    let log = dir.path().join("server.log");
    let mock = dir.path().join("mocks.json");
    write_json(&mock, &json!({"notify": "{sent: .who}"}));
    let mut s = start(&db, Some(&mock), &log);
    s.define(&json!({
        "id": "drift", "name": "Drift", "version": "1.0",
        "events": [{"name": "reply", "type": "com.example.reply", "source": "test"}],
        "functions": [{"name": "notify", "operation": "http://example.org/api.json#notify"}],
        "states": [
            {"name": "Ask", "start": true,
             "enterAction": {"type": "invokeFunction", "functionName": "notify", "arguments": {"who": "${ .who }"}},
             "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["reply"]}]}]},
            {"name": "Done", "enterAction": {"type": "injectData", "expression": "${ \"done\" }"},
             "enterResultHandler": "${ .status = $value }"}
        ]
    }));
    s.start_instance("drift", "drift-1", json!({"who": "ada"}));
    s.wait_instance("drift-1", Duration::from_secs(10), "waiting", |v| {
        v["status"] == "waiting"
    });
    let before = s.history("drift-1");
    s.kill();

    // The definition changes under the running instance: the call's argument differs.
    {
        let conn = rusqlite::Connection::open(&db).expect("open store");
        let text: String = conn
            .query_row("SELECT doc FROM definitions WHERE id = 'drift'", [], |r| r.get(0))
            .expect("read definition");
        let mut doc: Value = serde_json::from_str(&text).expect("definition JSON");
        doc["states"][0]["enterAction"]["arguments"]["who"] = json!("${ .who + \"!\" }");
        let n = conn
            .execute("UPDATE definitions SET doc = ?1 WHERE id = 'drift'", [doc.to_string()])
            .expect("update definition");
        assert_eq!(n, 1);
    }

    let s = {
        drop(s);
        start(&db, Some(&mock), &log)
    };
    let v = s.wait_instance("drift-1", Duration::from_secs(10), "failed", |v| {
        v["status"] == "failed"
    });
    let error = &v["error"];
    assert_eq!(error["type"], "replayMismatch", "error: {error}");
    let message = error["message"].as_str().unwrap_or_default();
    let n: usize = message
        .strip_prefix("journal entry ")
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the message names the journal entry (`journal entry N: ...`): {message:?}"));
    // The journal before the crash is kept as it was.
    let after = s.history("drift-1");
    assert_eq!(&after[..before.len()], &before[..], "the journal was rewritten");

    let mut problems = Vec::new();
    // The entry it names is the recorded call, as the history API numbers entries (`seq`).
    match before.iter().find(|e| e["seq"] == n) {
        Some(named) if named["entry"] == "effect" && named["effect"] == "invokeFunction" => {}
        named => problems.push(format!(
            "\"journal entry {n}\" should be the recorded invokeFunction effect, but the history entry with seq {n} is {}",
            named.map_or("absent".to_string(), Value::to_string)
        )),
    }
    if let Some(d) = error["details"]["entry"].as_u64() {
        if d as usize != n {
            problems.push(format!("details.entry {d} disagrees with the message's entry {n}"));
        }
    }
    // The mismatch itself is named: the call's arguments changed (who: "ada" then, "ada!" now).
    if !(message.contains("notify") && message.contains("ada!")) {
        problems.push(
            "the message should say what differs (the call's arguments, \"ada\" recorded vs \"ada!\" now)".to_string(),
        );
    }
    assert!(
        problems.is_empty(),
        "replayMismatch error {error}\n{}\nhistory: {before:?}",
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Cancel
// ---------------------------------------------------------------------------------------------

#[test]
fn cancelling_is_recorded_stops_the_instance_and_its_timers_across_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("cancel.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&json!({
        "id": "snooze", "name": "Snooze", "version": "1.0",
        "states": [
            {"name": "Sleep", "start": true, "enterAction": {"type": "delay", "timeout": "3s"},
             "transitions": [{"nextState": "Woke"}]},
            {"name": "Woke", "enterAction": {"type": "injectData", "expression": "${ \"woke\" }"},
             "enterResultHandler": "${ .status = $value }"}
        ]
    }));
    s.start_instance("snooze", "snooze-1", json!({}));
    // In its delay the instance is `running` (an action is under way), not `waiting`.
    let v = s.instance("snooze-1");
    assert!(v["status"] == "running" && v["state"] == "Sleep", "{v}");

    let (st, body) = s.post("/instances/snooze-1/cancel", &json!({}));
    assert_eq!(st, 200, "POST cancel: {body}");
    assert_eq!(
        body["status"], "cancelled",
        "POST cancel answers with the cancelled instance: {body}"
    );
    let h = s.history("snooze-1");
    assert_eq!(
        entries(&h, "input", "input", "cancel").len(),
        1,
        "the cancel request is recorded: {h:?}"
    );
    let started = entries(&h, "effect", "effect", "startTimer");
    let cancelled = entries(&h, "effect", "effect", "cancelTimer");
    assert_eq!(started.len(), 1, "{h:?}");
    assert_eq!(cancelled.len(), 1, "cancelling cancels the delay's timer: {h:?}");
    assert_eq!(cancelled[0]["timer"], started[0]["timer"]);
    let due = started[0]["due"].as_i64().expect("due");

    s.kill();
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    assert_eq!(s.instance("snooze-1")["status"], "cancelled");
    // Past the timer's due time, nothing fires.
    let wait = (due - now_ms() + 1_500).max(0) as u64;
    std::thread::sleep(Duration::from_millis(wait));
    let v = s.instance("snooze-1");
    assert_eq!(v["status"], "cancelled", "{v}");
    assert_eq!(v["state"], "Sleep", "{v}");
    let after = s.history("snooze-1");
    assert_eq!(after, h, "nothing happened to the cancelled instance after the restart");
    assert!(entries(&after, "input", "input", "timerFired").is_empty());
    let (st, body) = s.post("/instances/snooze-1/cancel", &json!({}));
    assert_eq!(st, 409, "cancelling again: {body}");
    // The store keeps no timer for it.
    drop(s);
    let conn = rusqlite::Connection::open(&db).expect("open store");
    let timers: i64 = conn
        .query_row("SELECT COUNT(*) FROM timers WHERE instance = 'snooze-1'", [], |r| {
            r.get(0)
        })
        .expect("count timers");
    assert_eq!(timers, 0);
}

// ---------------------------------------------------------------------------------------------
// 5. Store files that are not sm4c stores
// ---------------------------------------------------------------------------------------------

#[test]
fn a_foreign_sqlite_file_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("people.db");
    {
        let conn = rusqlite::Connection::open(&db).expect("create foreign db");
        conn.execute_batch(
            "CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
             INSERT INTO people (name) VALUES ('ada'), ('grace');",
        )
        .expect("fill foreign db");
    }
    let bytes = std::fs::read(&db).expect("read foreign db");
    let listing = dir_listing(dir.path());

    let (code, stderr) = serve_refused(&db);
    assert_eq!(code, Some(2), "exit code for a foreign SQLite file; stderr: {stderr}");
    assert!(
        stderr.contains(&db.display().to_string()),
        "the message names the file: {stderr:?}"
    );
    assert!(
        stderr.contains("another application") || stderr.contains("not an sm4c store"),
        "the message says it is not an sm4c store: {stderr:?}"
    );
    assert!(
        std::fs::read(&db).expect("read foreign db") == bytes,
        "the foreign file was modified by `sm4c serve` (header bytes 18-19: before {:?}, after {:?})",
        &bytes[18..20],
        &std::fs::read(&db).unwrap()[18..20]
    );
    assert_eq!(
        dir_listing(dir.path()),
        listing,
        "files were left beside the foreign file"
    );
}

#[test]
fn a_corrupted_file_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("garbage.db");
    // Deterministic pseudo-random bytes.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let bytes: Vec<u8> = (0..8192)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    std::fs::write(&db, &bytes).expect("write garbage");
    let listing = dir_listing(dir.path());

    let (code, stderr) = serve_refused(&db);
    assert_eq!(code, Some(2), "exit code for a corrupted file; stderr: {stderr}");
    assert!(
        stderr.contains(&db.display().to_string()),
        "the message names the file: {stderr:?}"
    );
    assert!(
        stderr.contains("not an sm4c store"),
        "the message says it is not an sm4c store: {stderr:?}"
    );
    assert!(
        std::fs::read(&db).expect("read garbage") == bytes,
        "the corrupted file was modified"
    );
    assert_eq!(
        dir_listing(dir.path()),
        listing,
        "files were left beside the corrupted file"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Sent events keep their ids across a crash
// ---------------------------------------------------------------------------------------------

#[test]
fn a_sent_event_has_a_deterministic_id_and_is_not_sent_twice_after_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sent.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&json!({
        "id": "notifier", "name": "Notifier", "version": "1.0",
        "events": [
            {"name": "shipped", "type": "com.example.shipped", "source": "warehouse"},
            {"name": "ack", "type": "com.example.ack", "source": "test",
             "correlation": [{"contextAttributeName": "orderid", "contextAttributeValue": "${ .order }"}]}
        ],
        "states": [
            {"name": "Notify", "start": true,
             "enterAction": {"type": "sendEvent", "event": "shipped", "expression": "${ {order: .order} }"},
             "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["ack"]}]}]},
            {"name": "Done", "enterAction": {"type": "injectData", "expression": "${ \"acked\" }"},
             "enterResultHandler": "${ .status = $value }"}
        ]
    }));
    s.start_instance("notifier", "i-1", json!({"order": "o-1"}));
    s.wait_instance("i-1", Duration::from_secs(5), "waiting", |v| v["status"] == "waiting");

    let mine = |sent: Vec<Value>| -> Vec<Value> { sent.into_iter().filter(|e| e["instance"] == "i-1").collect() };
    let before = mine(s.sent());
    assert_eq!(before.len(), 1, "one sent event: {before:?}");
    assert_eq!(
        before[0]["event"]["id"], "i-1/1.enter",
        "deterministic id <instance>/<op>: {}",
        before[0]
    );
    assert_eq!(before[0]["event"]["data"], json!({"order": "o-1"}));
    let h = s.history("i-1");
    let effect = entries(&h, "effect", "effect", "sendEvent");
    assert_eq!(effect.len(), 1, "{h:?}");
    assert_eq!(effect[0]["op"], "1.enter");
    assert_eq!(
        effect[0]["event"], before[0]["event"],
        "the journal records the event that was sent"
    );

    s.kill();
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    let (st, body) = s.post_event(&json!({
        "specversion": "1.0", "id": "ack-1", "source": "test", "type": "com.example.ack", "orderid": "o-1"
    }));
    assert_eq!(st, 202, "{body}");
    assert_eq!(body["reached"], json!(["i-1"]));
    let v = s.wait_instance("i-1", Duration::from_secs(5), "completed", |v| {
        v["status"] == "completed"
    });
    assert_eq!(v["data"], json!({"order": "o-1", "status": "acked"}));
    let after = mine(s.sent());
    assert_eq!(
        after, before,
        "the outbox after the crash: the same single event, same id"
    );
    check_journal("i-1", &s.history("i-1")).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 7. Repeated kill -9 under load
// ---------------------------------------------------------------------------------------------

/// Instances loop five times through a call (a slow mock, so calls are in flight at each kill) and a
/// short delay, while the server is killed -9 and restarted over and over. Every instance still ends
/// with each step done exactly once.
#[test]
fn repeated_kill_nine_under_load_repeats_no_completed_step() {
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("storm.db");
    let mock = dir.path().join("mocks.json");
    let log = dir.path().join("server.log");
    write_json(
        &mock,
        &json!({"inc": "(reduce range(0; 3000) as $i (0; . + 1)) as $x | {n: (.n + 1)}"}),
    );
    let definition = json!({
        "id": "storm", "name": "Storm", "version": "1.0",
        "functions": [{"name": "inc", "operation": "http://example.org/api.json#inc"}],
        "states": [
            {"name": "Step", "start": true,
             "enterAction": {"type": "invokeFunction", "functionName": "inc", "waitForCompletion": true,
                             "arguments": {"n": "${ .n }"}},
             "enterResultHandler": "${ .n = $value.n | .trail += [$value.n] }",
             "transitions": [{"condition": "${ .n < 5 }", "nextState": "Pause"}, {"nextState": "End"}]},
            {"name": "Pause", "enterAction": {"type": "delay", "timeout": "200ms"},
             "transitions": [{"nextState": "Step"}]},
            {"name": "End"}
        ]
    });
    const N: usize = 60;
    let id = |i: usize| format!("storm-{i:02}");

    let mut s = start(&db, Some(&mock), &log);
    s.define(&definition);
    std::thread::scope(|scope| {
        for t in 0..4 {
            let s = &s;
            scope.spawn(move || {
                for i in (t..N).step_by(4) {
                    s.start_instance("storm", &id(i), json!({"n": 0, "trail": []}));
                }
            });
        }
    });
    let mut kills = 0;
    let mut in_flight_seen = 0;
    for round in 0..6 {
        std::thread::sleep(Duration::from_millis(400 + 150 * (round % 3)));
        s.kill();
        kills += 1;
        let copy = snapshot_store(&db, dir.path());
        let calls: i64 = rusqlite::Connection::open(&copy)
            .and_then(|c| c.query_row("SELECT COUNT(*) FROM calls", [], |r| r.get(0)))
            .expect("count calls in the crashed store");
        in_flight_seen += calls;
        drop(s);
        s = start(&db, Some(&mock), &log);
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..N {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = s.wait_instance(&id(i), left, "completed", |v| {
            v["status"]
                .as_str()
                .is_some_and(|st| st != "running" && st != "waiting")
        });
        assert_eq!(v["status"], "completed", "{v}");
        assert_eq!(
            v["data"],
            json!({"n": 5, "trail": [1, 2, 3, 4, 5]}),
            "{}: each step once",
            id(i)
        );
    }
    let mut failures = Vec::new();
    for i in 0..N {
        if let Err(e) = check_journal(&id(i), &s.history(&id(i))) {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {N} journals wrong after {kills} kills:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "storm: {N} instances, {kills} kills, {in_flight_seen} calls in flight at the kills, done after {:?}",
        t0.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 8. A subflow whose start was recorded just before the crash
// ---------------------------------------------------------------------------------------------

/// The parent's `startSubflow` effect is committed, then the server dies before the child instance
/// is created (here: while a slow call from the same step is being made). After the restart the
/// child must be started (at least once, same id `<parent>/<op>`) and the parent must complete.
#[test]
fn a_subflow_recorded_but_not_started_at_the_crash_is_started_after_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("subflow.db");
    let mock = dir.path().join("mocks.json");
    let log = dir.path().join("server.log");
    write_json(
        &mock,
        &json!({"slow": "(reduce range(0; 100000) as $i (0; . + 1)) as $x | {ok: .n}"}),
    );
    let mut s = start(&db, Some(&mock), &log);
    s.define(&json!({
        "id": "child", "name": "Child", "version": "1.0",
        "states": [{"name": "C", "start": true,
                    "enterAction": {"type": "injectData", "expression": "${ .k * 2 }"},
                    "enterResultHandler": "${ .doubled = $value }"}]
    }));
    s.define(&json!({
        "id": "parent", "name": "Parent", "version": "1.0",
        "functions": [{"name": "slow", "operation": "http://example.org/api.json#slow"}],
        "states": [{"name": "P", "start": true,
                    "enterAction": {"type": "parallel", "completionType": "and", "actions": [
                        {"name": "slow", "type": "invokeFunction", "functionName": "slow",
                         "waitForCompletion": true, "arguments": {"n": 1}},
                        {"name": "child", "type": "invokeSubflow", "subflowName": "child",
                         "waitForCompletion": true, "arguments": {"k": 7}}
                    ]},
                    "enterResultHandler": "${ .out = $value }"}]
    }));
    let expected = json!({"out": {"slow": {"ok": 1}, "child": {"k": 7, "doubled": 14}}});

    // Without a crash it works.
    s.start_instance("parent", "p-0", json!({}));
    let v = s.wait_instance("p-0", Duration::from_secs(20), "completed", |v| {
        v["status"] == "completed"
    });
    assert_eq!(v["data"], expected);

    // Kill -9 right after the start is acknowledged: both effects are committed, the slow call is
    // being made and the child is not created yet.
    s.start_instance("parent", "p-1", json!({}));
    s.kill();
    let copy = snapshot_store(&db, dir.path());
    let journal: Vec<String> = rusqlite::Connection::open(&copy)
        .and_then(|c| {
            let mut st = c.prepare("SELECT entry FROM journal WHERE instance = 'p-1' ORDER BY seq")?;
            let rows = st.query_map([], |r| r.get(0))?.collect::<Result<Vec<String>, _>>();
            rows
        })
        .expect("read the crashed journal");
    assert!(
        journal.iter().any(|e| e.contains("\"startSubflow\"")),
        "the startSubflow effect was committed before the crash: {journal:?}"
    );

    let s = {
        drop(s);
        start(&db, Some(&mock), &log)
    };
    let v = s.wait_instance("p-1", Duration::from_secs(10), "completed after the restart", |v| {
        v["status"] == "completed"
    });
    assert_eq!(v["data"], expected);
    let child = s.instance("p-1/1.enter/1");
    assert_eq!(child["status"], "completed", "{child}");
    check_journal("p-1", &s.history("p-1")).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 9. Acknowledged events survive a crash
// ---------------------------------------------------------------------------------------------

/// An event answered with 202 is durable: delivered to a waiting instance, or parked for one that
/// starts waiting later, it is not lost by a kill -9 right after the answer.
#[test]
fn acknowledged_events_survive_kill_nine_delivered_or_parked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("events.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&json!({
        "id": "waiter", "name": "Waiter", "version": "1.0",
        "events": [{"name": "go", "type": "com.example.go", "source": "test",
                    "correlation": [{"contextAttributeName": "orderid", "contextAttributeValue": "${ .order }"}]}],
        "states": [
            {"name": "Wait", "start": true,
             "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["go"], "resultHandler": "${ .got = ($value | .data) }"}]}]},
            {"name": "Done"}
        ]
    }));
    let go = |order: &str| {
        json!({"specversion": "1.0", "id": format!("go-{order}"), "source": "test", "type": "com.example.go",
               "orderid": order, "datacontenttype": "application/json", "data": {"order": order}})
    };

    // Delivered, then kill -9 at once.
    s.start_instance("waiter", "w-1", json!({"order": "A"}));
    s.wait_instance("w-1", Duration::from_secs(5), "waiting", |v| v["status"] == "waiting");
    let (st, body) = s.post_event(&go("A"));
    assert_eq!(st, 202, "{body}");
    assert_eq!(body["reached"], json!(["w-1"]));
    s.kill();
    s = {
        drop(s);
        start(&db, None, &log)
    };
    let v = s.wait_instance("w-1", Duration::from_secs(5), "completed", |v| {
        v["status"] == "completed"
    });
    assert_eq!(v["data"], json!({"order": "A", "got": {"order": "A"}}));

    // Parked (no instance waits for it yet), then kill -9 at once.
    let (st, body) = s.post_event(&go("B"));
    assert_eq!(st, 202, "{body}");
    assert_eq!(body["parked"], true, "{body}");
    s.kill();
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    s.start_instance("waiter", "w-2", json!({"order": "B"}));
    let v = s.wait_instance("w-2", Duration::from_secs(5), "completed by the parked event", |v| {
        v["status"] == "completed"
    });
    assert_eq!(v["data"], json!({"order": "B", "got": {"order": "B"}}));
    check_journal("w-1", &s.history("w-1")).unwrap();
    check_journal("w-2", &s.history("w-2")).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 10. A damaged sm4c store
// ---------------------------------------------------------------------------------------------

/// A real sm4c store whose pages were overwritten (a disk fault, a bad copy) is refused with exit 2
/// and a message that names the file, and is not modified.
#[test]
fn a_damaged_sm4c_store_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("damaged.db");
    let log = dir.path().join("server.log");
    {
        let s = start(&db, None, &log);
        for i in 0..20 {
            s.define(&json!({
                "id": format!("d{i}"), "name": "D", "version": "1.0",
                "states": [{"name": "A", "start": true,
                            "enterAction": {"type": "injectData", "expression": format!("${{ {{v: {i}}} }}")},
                            "enterResultHandler": "${ .r = $value }"}]
            }));
            s.start_instance(&format!("d{i}"), &format!("x-{i}"), json!({"pad": "x".repeat(500)}));
        }
    }
    // Move everything into the main file, then damage pages 2 to 4.
    {
        let conn = rusqlite::Connection::open(&db).expect("open store");
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .expect("checkpoint");
    }
    let mut bytes = std::fs::read(&db).expect("read store");
    assert!(bytes.len() >= 4 * 4096, "store is {} bytes", bytes.len());
    for (i, b) in bytes.iter_mut().enumerate().take(4 * 4096).skip(4096) {
        *b = (i.wrapping_mul(7919) % 251) as u8;
    }
    std::fs::write(&db, &bytes).expect("write damaged store");
    let listing = dir_listing(dir.path());

    let (code, stderr) = serve_refused(&db);
    assert_eq!(code, Some(2), "exit code for a damaged store; stderr: {stderr}");
    assert!(
        stderr.contains(&db.display().to_string()),
        "the message names the damaged file: {stderr:?}"
    );
    assert!(
        std::fs::read(&db).expect("read store") == bytes,
        "the damaged file was modified"
    );
    assert_eq!(
        dir_listing(dir.path()),
        listing,
        "files were left beside the damaged file"
    );
}

// ---------------------------------------------------------------------------------------------
// 3b, 3c. More definitions that changed under a running instance
// ---------------------------------------------------------------------------------------------

/// Starts `def` as instance `id` (which then waits for an event), kills the server, rewrites the
/// stored definition with `change`, restarts and returns the server.
fn change_definition_under(dir: &Path, def: Value, id: &str, change: impl FnOnce(&mut Value)) -> (Server, Vec<Value>) {
    let db = dir.join("drift.db");
    let log = dir.join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&def);
    let def_id = def["id"].as_str().unwrap().to_string();
    s.start_instance(&def_id, id, json!({"n": 4}));
    s.wait_instance(id, Duration::from_secs(10), "waiting", |v| v["status"] == "waiting");
    let before = s.history(id);
    s.kill();
    {
        let conn = rusqlite::Connection::open(&db).expect("open store");
        let text: String = conn
            .query_row("SELECT doc FROM definitions WHERE id = ?1", [&def_id], |r| r.get(0))
            .expect("read definition");
        let mut doc: Value = serde_json::from_str(&text).expect("definition JSON");
        change(&mut doc);
        conn.execute(
            "UPDATE definitions SET doc = ?1 WHERE id = ?2",
            [doc.to_string(), def_id],
        )
        .expect("update definition");
    }
    drop(s);
    (start(&db, None, &log), before)
}

fn waiting_definition() -> Value {
    json!({
        "id": "drift2", "name": "Drift", "version": "1.0",
        "events": [{"name": "reply", "type": "com.example.reply", "source": "test"}],
        "states": [
            {"name": "Prepare", "start": true, "transitions": [{"nextState": "Ask"}]},
            {"name": "Ask",
             "enterAction": {"type": "injectData", "expression": "${ .n * 10 }"},
             "enterResultHandler": "${ .asked = $value }",
             "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["reply"]}]}]},
            {"name": "Done"}
        ]
    })
}

/// The brief's own example: the waiting state's `injectData` expression changed. Replaying the
/// journal with the new definition gives other data than the instance has, so the journal no longer
/// matches its definition.
#[test]
fn a_changed_inject_data_expression_under_a_waiting_instance_is_a_replay_mismatch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, before) = change_definition_under(dir.path(), waiting_definition(), "drift2-1", |doc| {
        doc["states"][1]["enterAction"]["expression"] = json!("${ .n * 20 }");
    });
    let v = s.wait_instance("drift2-1", Duration::from_secs(5), "failed", |v| {
        v["status"] != "waiting" && v["status"] != "running"
    });
    assert_eq!(
        (v["status"].as_str(), v["error"]["type"].as_str()),
        (Some("failed"), Some("replayMismatch")),
        "an instance whose enter action's injectData changed under it (data {} recorded with `.n * 10`, the definition now says `.n * 20`) should fail with replayMismatch; it is {v}\njournal: {before:?}",
        v["data"]
    );
    assert!(
        v["error"]["message"].as_str().unwrap_or("").contains("journal entry"),
        "{}",
        v["error"]
    );
}

/// The state the instance waits in no longer exists in its definition. That must not take the server
/// down: the instance fails with `replayMismatch` and other instances keep running.
#[test]
fn an_instance_whose_state_was_removed_from_its_definition_fails_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, before) = change_definition_under(dir.path(), waiting_definition(), "drift2-1", |doc| {
        // Ask and Done are gone; Prepare now ends the instance.
        doc["states"] = json!([{"name": "Prepare", "start": true}]);
        doc["events"] = json!([]);
    });
    // An event for it arrives (the instance is loaded from its snapshot, if it is still waiting).
    let (st, body) = s.post_event(
        &json!({"specversion": "1.0", "id": "r-1", "source": "test", "type": "com.example.reply",
                                          "sm4cinstanceid": "drift2-1"}),
    );
    assert_eq!(st, 202, "POST /events: {body}\nserver log:\n{}", s.log_tail());
    // The server still works.
    s.define(&json!({"id": "other", "name": "Other", "version": "1.0",
                     "states": [{"name": "A", "start": true, "enterAction": {"type": "injectData", "expression": "${ 1 }"},
                                 "enterResultHandler": "${ .one = $value }"}]}));
    s.start_instance("other", "other-1", json!({}));
    let v = s.wait_instance("other-1", Duration::from_secs(5), "completed", |v| {
        v["status"] == "completed"
    });
    assert_eq!(v["data"], json!({"one": 1}));
    let v = s.wait_instance("drift2-1", Duration::from_secs(5), "failed", |v| {
        v["status"] != "waiting" && v["status"] != "running"
    });
    assert_eq!(
        (v["status"].as_str(), v["error"]["type"].as_str()),
        (Some("failed"), Some("replayMismatch")),
        "the instance waited in state Ask, which its definition no longer has: {v}\njournal: {before:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Nesting and unreadable records (issue 35, item 1)
// ---------------------------------------------------------------------------------------------

/// `levels` arrays nested in one another around `1`.
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!(1), |v, _| json!([v]))
}

fn waiter_definition() -> Value {
    json!({
        "id": "waiter", "name": "Waiter", "version": "1.0",
        "events": [{"name": "go", "type": "com.example.go", "source": "test"}],
        "states": [
            {"name": "Wait", "start": true, "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["go"]}]}]},
            {"name": "Done"}
        ]
    })
}

/// A 126-level input was accepted, and its journal row (two levels deeper) could no longer be
/// read back: the next start stopped with `recursion limit exceeded`, exit 2. Now the door refuses
/// it naming the limit, and an input at the limit is kept across a restart.
#[test]
fn an_input_nested_deeper_than_the_limit_is_refused_and_one_at_the_limit_reads_back_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("deep.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&waiter_definition());
    for levels in [126, 65, 300] {
        let (st, body) = s.post(
            "/instances",
            &json!({"definition": "waiter", "id": format!("deep-{levels}"), "input": nested(levels)}),
        );
        assert_eq!(st, 400, "a {levels}-level input: {body}");
        assert_eq!(body["error"], "tooDeep", "a {levels}-level input: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains("nested deeper than 64 levels"), "{message}");
        if levels < 128 {
            assert!(message.starts_with("input is nested"), "names the field: {message}");
        }
        let (st, _) = s.get(&format!("/instances/deep-{levels}"));
        assert_eq!(st, 404, "a refused start leaves no instance");
    }
    // An event whose data nests deeper is refused too, and is not delivered.
    let (st, body) = s.post_event(&json!({"specversion": "1.0", "id": "e-1", "source": "test",
        "type": "com.example.go", "datacontenttype": "application/json", "data": nested(65)}));
    assert_eq!(st, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("the event's data is nested deeper than 64 levels"),
        "{body}"
    );

    // At the limit: accepted, and read back after a restart, as are the inputs of other instances.
    let input = json!({"x": nested(63)});
    s.start_instance("waiter", "at-limit", input.clone());
    s.start_instance("waiter", "plain", json!({"n": 1}));
    s.wait_instance("at-limit", Duration::from_secs(10), "waiting", |v| {
        v["status"] == "waiting"
    });
    s.kill();
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    let v = s.instance("at-limit");
    assert_eq!(v["status"], "waiting", "{v}");
    assert_eq!(v["data"], input);
    assert!(!s.history("at-limit").is_empty());
    assert_eq!(s.instance("plain")["data"], json!({"n": 1}));
}

/// A store written by a version without the limit (a 126-level input, its journal row 128 levels
/// deep) starts, and the instance reads back.
#[test]
fn a_row_deeper_than_the_json_readers_default_limit_reads_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("old.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&waiter_definition());
    s.start_instance("waiter", "deep", json!({"n": 1}));
    s.wait_instance("deep", Duration::from_secs(10), "waiting", |v| v["status"] == "waiting");
    s.kill();
    // What the door let in before: the data and the start entry, 126 levels deep.
    {
        let conn = rusqlite::Connection::open(&db).expect("open store");
        let deep = nested(126).to_string();
        let snapshot: String = conn
            .query_row("SELECT snapshot FROM instances WHERE id = 'deep'", [], |r| r.get(0))
            .expect("snapshot");
        let snapshot = snapshot.replace(r#"{"n":1}"#, &deep);
        let entry: String = conn
            .query_row(
                "SELECT entry FROM journal WHERE instance = 'deep' ORDER BY seq LIMIT 1",
                [],
                |r| r.get(0),
            )
            .expect("journal row");
        assert!(entry.contains(r#"{"n":1}"#), "{entry}");
        let entry = entry.replacen(r#"{"n":1}"#, &deep, 1);
        assert!(
            text_depth(&entry) >= 128,
            "the row is as deep as the one that broke starts"
        );
        conn.execute("UPDATE instances SET snapshot = ?1 WHERE id = 'deep'", [&snapshot])
            .expect("update");
        conn.execute("UPDATE journal SET entry = ?1 WHERE instance = 'deep'", [&entry])
            .expect("update");
    }
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    let v = s.instance("deep");
    assert_eq!(v["status"], "waiting", "{v}");
    assert_eq!(v["data"], nested(126));
}

/// The deepest nesting of JSON text (no strings with brackets in these rows).
fn text_depth(text: &str) -> usize {
    let (mut d, mut most) = (0usize, 0usize);
    for c in text.bytes() {
        match c {
            b'[' | b'{' => {
                d += 1;
                most = most.max(d);
            }
            b']' | b'}' => d = d.saturating_sub(1),
            _ => {}
        }
    }
    most
}

/// Rows overwritten with garbage by hand: the server starts, the instances they belong to are
/// failed with `corruptRecord` naming the record, the failures are counted, and every other instance
/// is served (one completes on an event after the restart).
#[test]
fn a_store_row_corrupted_by_hand_fails_its_instance_and_the_others_are_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("bad.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&waiter_definition());
    for id in ["bad-journal", "bad-snapshot", "good"] {
        s.start_instance("waiter", id, json!({"who": id}));
        s.wait_instance(id, Duration::from_secs(10), "waiting", |v| v["status"] == "waiting");
    }
    s.kill();
    {
        let conn = rusqlite::Connection::open(&db).expect("open store");
        let n = conn
            .execute(
                "UPDATE journal SET entry = '[{\"entry\": garbage' WHERE instance = 'bad-journal'",
                [],
            )
            .expect("overwrite a journal row");
        assert!(n >= 1);
        let n = conn
            .execute(
                "UPDATE instances SET snapshot = 'not json at all' WHERE id = 'bad-snapshot'",
                [],
            )
            .expect("overwrite a snapshot");
        assert_eq!(n, 1);
    }
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    for (id, record) in [("bad-journal", "journal"), ("bad-snapshot", "snapshot")] {
        let v = s.wait_instance(id, Duration::from_secs(10), "failed", |v| v["status"] != "waiting");
        assert_eq!(v["status"], "failed", "{v}");
        assert_eq!(v["error"]["type"], "corruptRecord", "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(record) && message.contains(id),
            "names the record and the instance: {message}"
        );
    }
    // The others are served: listed, and the good one goes on.
    let (st, list) = s.get("/instances?limit=10");
    assert_eq!(st, 200, "{list}");
    assert_eq!(list["instances"].as_array().map(Vec::len), Some(3), "{list}");
    assert_eq!(s.instance("good")["status"], "waiting");
    let (st, body) = s.post_event(&json!({"specversion": "1.0", "id": "go-1", "source": "test",
        "type": "com.example.go", "sm4cinstanceid": "good"}));
    assert_eq!(st, 202, "{body}");
    let v = s.wait_instance("good", Duration::from_secs(10), "completed", |v| {
        v["status"] == "completed"
    });
    assert_eq!(v["data"], json!({"who": "good"}));
    // Counted, by kind of record, and logged.
    let text = s
        .client()
        .get(format!("{}/metrics", s.url()))
        .send()
        .and_then(|r| r.text())
        .expect("GET /metrics");
    for record in ["journal", "snapshot"] {
        let line = format!("sm4c_corrupt_records_total{{record=\"{record}\"}} 1");
        assert!(text.contains(&line), "{line} in:\n{text}");
    }
    let logged = s.log_tail();
    assert!(
        logged.contains("corruptRecord") && logged.contains("bad-journal"),
        "{logged}"
    );
    // And a second restart keeps them failed and starts as well.
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    assert_eq!(s.instance("bad-snapshot")["error"]["type"], "corruptRecord");
    assert_eq!(s.instance("good")["status"], "completed");
}

fn correlated_waiter() -> Value {
    json!({
        "id": "waiter", "name": "Waiter", "version": "1.0",
        "events": [{"name": "go", "type": "com.example.go", "source": "test",
                    "correlation": [{"contextAttributeName": "orderid", "contextAttributeValue": "${ .order }"}]}],
        "states": [
            {"name": "Wait", "start": true,
             "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["go"], "resultHandler": "${ .got = ($value | .data) }"}]}]},
            {"name": "Done"}
        ]
    })
}

fn go_event(order: &str) -> Value {
    json!({"specversion": "1.0", "id": format!("go-{order}"), "source": "test", "type": "com.example.go",
           "orderid": order, "datacontenttype": "application/json", "data": {"order": order}})
}

/// Events that no instance waits for were parked without limit. Past `--max-parked` (or
/// `--max-parked-bytes`) an event is refused with 429 `parkedLimit` naming the flag, the events
/// parked before are kept (across a restart too), and there is room again once one is taken.
#[test]
fn parked_events_past_the_limits_are_refused_with_429_and_the_parked_ones_are_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("parked.db");
    let log = dir.path().join("server.log");
    let mut s = start_with(&db, None, &log, &["--max-parked", "2"]);
    s.define(&correlated_waiter());
    for order in ["A", "B"] {
        let (st, body) = s.post_event(&go_event(order));
        assert_eq!((st, &body["parked"]), (202, &json!(true)), "{body}");
    }
    let (st, body) = s.post_event(&go_event("C"));
    assert_eq!(st, 429, "{body}");
    assert_eq!(body["error"], "parkedLimit", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("--max-parked") && message.contains('2'), "{message}");
    // The limit holds across a restart: it counts what the file holds.
    s.kill();
    let s = {
        drop(s);
        start_with(&db, None, &log, &["--max-parked", "2"])
    };
    let (st, body) = s.post_event(&go_event("C"));
    assert_eq!((st, body["error"].as_str()), (429, Some("parkedLimit")), "{body}");
    // Counted, by reason (this process refused one).
    let text = s
        .client()
        .get(format!("{}/metrics", s.url()))
        .send()
        .and_then(|r| r.text())
        .expect("GET /metrics");
    let line = "sm4c_events_refused_total{code=\"parkedLimit\"} 1";
    assert!(text.contains(line), "{line} in:\n{text}");
    // Both parked events are still there: each instance gets its own.
    for order in ["A", "B"] {
        let id = format!("w-{order}");
        s.start_instance("waiter", &id, json!({"order": order}));
        let v = s.wait_instance(&id, Duration::from_secs(10), "completed by its parked event", |v| {
            v["status"] == "completed"
        });
        assert_eq!(v["data"]["got"], json!({"order": order}));
    }
    let (st, body) = s.post_event(&go_event("C"));
    assert_eq!((st, &body["parked"]), (202, &json!(true)), "room again: {body}");
    drop(s);

    // The bytes limit: smaller than one event.
    let db = dir.path().join("bytes.db");
    let s = start_with(&db, None, &log, &["--max-parked-bytes", "100"]);
    s.define(&correlated_waiter());
    let (st, body) = s.post_event(&go_event("A"));
    assert_eq!((st, body["error"].as_str()), (429, Some("parkedLimit")), "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("--max-parked-bytes"),
        "{body}"
    );
    s.start_instance("waiter", "w-A", json!({"order": "A"}));
    let (st, body) = s.post_event(&go_event("A"));
    assert_eq!(
        (st, &body["reached"]),
        (202, &json!(["w-A"])),
        "delivered events are not limited: {body}"
    );
}

/// A store written before parked events carried their type (no `type` column, no index) opens,
/// gets the column, and its parked events still reach the instances that start waiting for them.
#[test]
fn parked_events_of_a_store_without_the_type_column_are_kept_and_delivered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("old.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&correlated_waiter());
    let (st, body) = s.post_event(&go_event("A"));
    assert_eq!((st, &body["parked"]), (202, &json!(true)), "{body}");
    s.kill();
    {
        // Back to the schema of the versions before the column.
        let conn = rusqlite::Connection::open(&db).expect("open store");
        conn.execute_batch("DROP INDEX parked_type; DROP INDEX parked_expires; ALTER TABLE parked DROP COLUMN type;")
            .expect("drop the type column");
        let columns: i64 = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('parked') WHERE name = 'type'",
                [],
                |r| r.get(0),
            )
            .expect("columns");
        assert_eq!(columns, 0);
    }
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    s.start_instance("waiter", "w-A", json!({"order": "A"}));
    let v = s.wait_instance(
        "w-A",
        Duration::from_secs(10),
        "completed by the old parked event",
        |v| v["status"] == "completed",
    );
    assert_eq!(v["data"]["got"], json!({"order": "A"}));
    let conn = rusqlite::Connection::open(&db).expect("open store");
    let columns: i64 = conn
        .query_row(
            "SELECT count(*) FROM pragma_table_info('parked') WHERE name = 'type'",
            [],
            |r| r.get(0),
        )
        .expect("columns");
    assert_eq!(columns, 1, "the column was added");
}

/// A subflow whose definition row is corrupted while its parent waits for it: recovery fails the
/// subflow with `corruptRecord`, and the parent is told, as it is of any subflow that fails (it
/// waited for ever before: recovery failed the child outside any step, so nobody told the parent).
#[test]
fn a_parent_is_told_when_recovery_fails_its_subflow_for_a_corrupt_definition() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("bad.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&waiter_definition());
    s.define(&json!({
        "id": "parent", "name": "Parent", "version": "1.0",
        "states": [
            {"name": "Call", "start": true,
             "enterAction": {"type": "invokeSubflow", "subflowName": "waiter", "waitForCompletion": true},
             "transitions": [{"nextState": "Done"}]},
            {"name": "Done"}
        ]
    }));
    s.start_instance("parent", "p-1", json!({}));
    // The subflow waits for its event, and its parent for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (st, page) = s.get("/instances?definition=waiter&status=waiting");
        assert_eq!(st, 200, "{page}");
        if page["instances"].as_array().is_some_and(|a| a.len() == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "the subflow did not wait: {page}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(s.instance("p-1")["status"], "running");
    s.kill();
    {
        let conn = rusqlite::Connection::open(&db).expect("open store");
        let child: String = conn
            .query_row("SELECT id FROM instances WHERE parent = 'p-1'", [], |r| r.get(0))
            .expect("the subflow's row");
        assert_ne!(child, "p-1");
        let n = conn
            .execute("UPDATE definitions SET doc = '{\"id\": broken' WHERE id = 'waiter'", [])
            .expect("overwrite a definition row");
        assert_eq!(n, 1);
    }
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    let v = s.wait_instance("p-1", Duration::from_secs(10), "told", |v| v["status"] != "waiting");
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(v["error"]["type"], "subflowError", "{v}");
    let child = v["error"]["details"]["instance"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(v["error"]["details"]["error"]["type"], "corruptRecord", "{v}");
    let c = s.instance(&child);
    assert_eq!(
        (c["status"].as_str(), c["error"]["type"].as_str()),
        (Some("failed"), Some("corruptRecord")),
        "{c}"
    );
    // A second restart keeps both as they are.
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    assert_eq!(s.instance("p-1")["error"]["type"], "subflowError");
    assert_eq!(s.instance(&child)["status"], "failed");
}

/// A definition row or a sent event corrupted by hand: the server used to refuse to start (a bad
/// definition row) and `GET /events/sent` to fail (a bad outbox row). Now the bad definition is left
/// out and its unfinished instance fails with `corruptRecord` naming it, the bad sent event is listed
/// with a `corruptRecord` error, both are logged and counted, and everything else is served.
#[test]
fn a_corrupt_definition_or_outbox_row_is_reported_and_the_rest_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("bad.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&json!({
        "id": "notifier", "name": "Notifier", "version": "1.0",
        "events": [
            {"name": "shipped", "type": "com.example.shipped", "source": "warehouse"},
            {"name": "ack", "type": "com.example.ack", "source": "test"}
        ],
        "states": [
            {"name": "Notify", "start": true,
             "enterAction": {"type": "sendEvent", "event": "shipped", "expression": "${ {order: .order} }"},
             "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["ack"]}]}]},
            {"name": "Done"}
        ]
    }));
    s.define(&waiter_definition());
    for n in 1..=3 {
        let id = format!("n-{n}");
        s.start_instance("notifier", &id, json!({"order": n}));
        s.wait_instance(&id, Duration::from_secs(10), "waiting", |v| v["status"] == "waiting");
    }
    s.start_instance("waiter", "w-1", json!({"who": "w-1"}));
    s.wait_instance("w-1", Duration::from_secs(10), "waiting", |v| v["status"] == "waiting");
    assert_eq!(s.sent().len(), 3);
    s.kill();
    {
        let conn = rusqlite::Connection::open(&db).expect("open store");
        let n = conn
            .execute("UPDATE definitions SET doc = '{\"id\": broken' WHERE id = 'waiter'", [])
            .expect("overwrite a definition row");
        assert_eq!(n, 1);
        let n = conn
            .execute("UPDATE outbox SET event = 'not json' WHERE instance = 'n-2'", [])
            .expect("overwrite an outbox row");
        assert_eq!(n, 1);
    }
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    // The instance of the unreadable definition is failed, naming the record and the definition.
    let v = s.wait_instance("w-1", Duration::from_secs(10), "failed", |v| v["status"] != "waiting");
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(v["error"]["type"], "corruptRecord", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("definition") && message.contains("waiter"),
        "{message}"
    );
    let (st, body) = s.post("/instances", &json!({"definition": "waiter", "input": {}}));
    assert_eq!(st, 404, "the definition is left out: {body}");
    // The outbox is served, the bad row marked in its place.
    let sent = s.sent();
    let instances: Vec<&str> = sent
        .iter()
        .map(|e| e["instance"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(instances, ["n-1", "n-2", "n-3"], "{sent:?}");
    assert_eq!(sent[1]["event"], Value::Null, "{}", sent[1]);
    assert_eq!(sent[1]["error"]["type"], "corruptRecord", "{}", sent[1]);
    assert!(
        sent[1]["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("outbox"),
        "{}",
        sent[1]
    );
    assert_eq!(sent[0]["event"]["data"], json!({"order": 1}));
    assert_eq!(sent[2]["event"]["data"], json!({"order": 3}));
    // The other definition's instances go on.
    let (st, body) = s.post_event(&json!({"specversion": "1.0", "id": "ack-1", "source": "test",
        "type": "com.example.ack", "sm4cinstanceid": "n-1"}));
    assert_eq!(st, 202, "{body}");
    s.wait_instance("n-1", Duration::from_secs(10), "completed", |v| {
        v["status"] == "completed"
    });
    // Counted, by kind of record, and logged.
    let text = s
        .client()
        .get(format!("{}/metrics", s.url()))
        .send()
        .and_then(|r| r.text())
        .expect("GET /metrics");
    assert!(
        text.contains("sm4c_corrupt_records_total{record=\"definition\"} 1"),
        "{text}"
    );
    assert!(text.contains("sm4c_corrupt_records_total{record=\"outbox\"}"), "{text}");
    let logged = s.log_tail();
    assert!(
        logged.contains("a stored definition cannot be read back") && logged.contains("waiter"),
        "{logged}"
    );
    // A second restart starts as well, and keeps the instance failed.
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    assert_eq!(s.instance("w-1")["error"]["type"], "corruptRecord");
    assert_eq!(s.instance("n-3")["status"], "waiting");
}

/// A definition that ends as soon as it starts.
/// Ends at once, with the nominal time of its run (`schedule`) in its data.
fn quick_definition() -> Value {
    json!({"id": "quick", "name": "Quick", "version": "1.0", "states": [{"name": "Done", "start": true, "end": true,
        "enterAction": {"type": "InjectData", "expression": "${ schedule.nominalTime }"},
        "enterResultHandler": "${ .nominal = $value }"}]})
}

/// The nominal times (seconds since the epoch) of a schedule's instances, from their ids.
fn schedule_runs(s: &Server, schedule: &str, definition: &str) -> Vec<i64> {
    let (st, page) = s.get(&format!("/instances?definition={definition}&limit=1000"));
    assert_eq!(st, 200, "{page}");
    let mut times: Vec<i64> = page["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .filter_map(|i| {
            i["id"]
                .as_str()?
                .strip_prefix(&format!("{schedule}@"))
                .map(str::to_string)
        })
        .map(|t| chrono_secs(&t).unwrap_or_else(|| panic!("{t:?} is not an RFC 3339 time")))
        .collect();
    times.sort_unstable();
    times
}

/// Seconds since the epoch of `2026-11-28T02:00:00Z`.
fn chrono_secs(t: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(t).ok().map(|d| d.timestamp())
}

/// An every-second schedule starts each second once, as `<id>@<time>`; after a SIGKILL, the
/// seconds missed while the server was down (within the catch-up window) are started once each,
/// in order, and the record of runs survives the restart.
#[test]
fn a_schedule_starts_every_second_once_and_catches_up_after_a_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sched.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&quick_definition());
    let (st, v) = s.post(
        "/schedules",
        &json!({"id": "sec", "definition": "quick", "every": "PT1S", "overlap": "bufferAll",
            "catchupWindow": "PT1M", "input": {"from": "schedule"}}),
    );
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["nextTimes"].as_array().map(Vec::len), Some(10), "{v}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while schedule_runs(&s, "sec", "quick").len() < 3 {
        assert!(Instant::now() < deadline, "three runs did not start: {}", s.log_tail());
        std::thread::sleep(Duration::from_millis(100));
    }
    let first = schedule_runs(&s, "sec", "quick")[0];
    s.kill();
    std::thread::sleep(Duration::from_secs(3));
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    // Runs on for a little after the restart, then every second from the first is there once.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let runs = schedule_runs(&s, "sec", "quick");
        let last = *runs.last().expect("runs");
        if last >= first + 7 {
            let want: Vec<i64> = (first..=last).collect();
            assert_eq!(runs, want, "a second missing or doubled");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the schedule did not go on after the restart: {runs:?}\n{}",
            s.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let nominal = {
        let (st, v) = s.get("/instances?definition=quick&limit=1");
        assert_eq!(st, 200);
        v["instances"][0]["id"]
            .as_str()
            .expect("an id")
            .split_once('@')
            .expect("@")
            .1
            .to_string()
    };
    let inst = s.instance(&format!("sec@{nominal}"));
    assert_eq!(inst["status"], "completed", "{inst}");
    // The run reads its nominal time (the jq function `schedule`).
    assert_eq!(inst["data"], json!({"from": "schedule", "nominal": nominal}), "{inst}");
    assert_eq!(
        inst["scheduled"],
        json!({"schedule": "sec", "nominalTime": nominal}),
        "{inst}"
    );
    // And the start's journal entry records it.
    let history = s.history(&format!("sec@{nominal}"));
    let start = history.iter().find(|e| e["input"] == "start").expect("a start entry");
    let at = chrono::DateTime::parse_from_rfc3339(&nominal)
        .expect("RFC 3339")
        .timestamp_millis();
    assert_eq!(
        start["scheduled"],
        json!({"schedule": "sec", "nominalTime": at}),
        "{start}"
    );
    let (st, v) = s.get("/schedules/sec");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["skipped"]["catchup"], 0, "{v}");
    assert!(v["runs"].as_u64().unwrap_or(0) >= 8, "{v}");
    let runs = v["runs"].as_u64().unwrap_or(0).min(10) as usize;
    assert_eq!(v["recentRuns"].as_array().map(Vec::len), Some(runs), "{v}");
    assert_eq!(v["recentRuns"][1]["status"], "completed", "{v}");
}

/// With a run that does not end, `skip` passes over the times that come, and `cancelOther`
/// cancels the running one for each.
#[test]
fn a_schedules_overlap_policy_decides_what_a_time_does_while_its_last_run_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sched.db");
    let log = dir.path().join("server.log");
    let s = start(&db, None, &log);
    s.define(&waiter_definition());
    for (id, overlap) in [("skipper", "skip"), ("canceller", "cancelOther")] {
        let (st, v) = s.post(
            "/schedules",
            &json!({"id": id, "definition": "waiter", "every": "PT1S", "overlap": overlap}),
        );
        assert_eq!(st, 201, "{v}");
    }
    std::thread::sleep(Duration::from_millis(3500));
    let (_, skipper) = s.get("/schedules/skipper");
    assert_eq!(skipper["runs"], 1, "{skipper}");
    assert!(skipper["skipped"]["overlap"].as_u64().unwrap_or(0) >= 2, "{skipper}");
    assert_eq!(skipper["running"].as_array().map(Vec::len), Some(1), "{skipper}");
    let (_, canceller) = s.get("/schedules/canceller");
    let runs = canceller["runs"].as_u64().unwrap_or(0);
    assert!(runs >= 3, "{canceller}");
    let recent = canceller["recentRuns"].as_array().expect("runs");
    assert_eq!(recent[0]["status"], "running", "{canceller}");
    for older in &recent[1..] {
        assert_eq!(older["status"], "cancelled", "{canceller}");
        let i = s.instance(older["instance"].as_str().expect("id"));
        assert_eq!(i["status"], "cancelled", "{i}");
    }
    // The metrics count the runs and the skipped times.
    let text = s
        .client()
        .get(format!("{}/metrics", s.url()))
        .send()
        .expect("GET /metrics")
        .text()
        .expect("body");
    let value = |series: &str| -> f64 {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .find(|(s, _)| *s == series)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in {text}"))
    };
    let (_, skipper) = s.get("/schedules/skipper");
    let (_, canceller) = s.get("/schedules/canceller");
    let runs = skipper["runs"].as_f64().unwrap_or(0.0) + canceller["runs"].as_f64().unwrap_or(0.0);
    assert!(value("sm4c_schedule_run_lateness_seconds_count") >= runs, "{text}");
    assert!(
        value(r#"sm4c_schedule_skipped_total{why="overlap"}"#) >= skipper["skipped"]["overlap"].as_f64().unwrap_or(1.0),
        "{text}"
    );
}

/// With a run that does not end, `bufferOne` keeps one time (the next are skipped) and starts it
/// when the run ends, `bufferAll` keeps every time, and `allowAll` starts each anyway; a schedule
/// past its `endAt` ends; a cron expression with seconds, in a zone half an hour off UTC, runs on
/// the real clock.
#[test]
fn buffered_overlaps_end_at_and_a_cron_with_seconds_run_on_the_real_clock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sched.db");
    let log = dir.path().join("server.log");
    let s = start(&db, None, &log);
    s.define(&waiter_definition());
    s.define(&quick_definition());
    for (id, overlap) in [("one", "bufferOne"), ("all", "bufferAll"), ("any", "allowAll")] {
        let (st, v) = s.post(
            "/schedules",
            &json!({"id": id, "definition": "waiter", "every": "PT1S", "overlap": overlap}),
        );
        assert_eq!(st, 201, "{v}");
    }
    let end_at = chrono::Utc::now() + chrono::Duration::seconds(2);
    let (st, v) = s.post(
        "/schedules",
        &json!({"id": "brief", "definition": "quick", "every": "PT1S",
                "endAt": end_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)}),
    );
    assert_eq!(st, 201, "{v}");
    let (st, v) = s.post(
        "/schedules",
        &json!({"id": "kolkata", "definition": "quick", "cron": "*/2 * * * * *", "timezone": "Asia/Kolkata"}),
    );
    assert_eq!(st, 201, "{v}");
    std::thread::sleep(Duration::from_millis(4500));
    let (_, one) = s.get("/schedules/one");
    assert_eq!(one["runs"], 1, "{one}");
    assert_eq!(one["buffered"].as_array().map(Vec::len), Some(1), "{one}");
    assert!(one["skipped"]["overlap"].as_u64().unwrap_or(0) >= 1, "{one}");
    let (_, all) = s.get("/schedules/all");
    assert_eq!(all["runs"], 1, "{all}");
    assert!(all["buffered"].as_array().map_or(0, Vec::len) >= 3, "{all}");
    assert_eq!(all["skipped"]["overlap"], 0, "{all}");
    let (_, any) = s.get("/schedules/any");
    assert!(any["runs"].as_u64().unwrap_or(0) >= 4, "{any}");
    assert_eq!(
        any["running"].as_array().map(Vec::len),
        any["runs"].as_u64().map(|n| n as usize),
        "{any}"
    );
    // The buffered time starts once the running one ends, as the instance of that time.
    let kept = one["buffered"][0].as_str().expect("a kept time").to_string();
    let running = one["running"][0].as_str().expect("a running run").to_string();
    let (st, v) = s.post(&format!("/instances/{running}/cancel"), &json!({}));
    assert!(st < 300, "{st} {v}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, one) = s.get("/schedules/one");
        if one["runs"] == 2 {
            assert_eq!(one["running"], json!([format!("one@{kept}")]), "{one}");
            break;
        }
        assert!(Instant::now() < deadline, "the kept time did not start: {one}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, brief) = s.get("/schedules/brief");
    assert_eq!(brief["state"], "ended", "{brief}");
    assert!((1..=3).contains(&brief["runs"].as_u64().unwrap_or(0)), "{brief}");
    let ended_runs = brief["runs"].clone();
    let (_, kolkata) = s.get("/schedules/kolkata");
    let runs: Vec<&str> = kolkata["recentRuns"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|r| r["nominalTime"].as_str())
        .collect();
    assert!(runs.len() >= 2, "{kolkata}");
    for t in &runs {
        let secs: u32 = t[17..19].parse().expect("seconds");
        assert_eq!(secs % 2, 0, "{t}: {kolkata}");
    }
    std::thread::sleep(Duration::from_millis(1500));
    let (_, brief) = s.get("/schedules/brief");
    assert_eq!(brief["runs"], ended_runs, "an ended schedule ran again: {brief}");
}

/// Times that come while a schedule is paused are skipped and counted, not run when it resumes;
/// resumed, it runs its next times again.
#[test]
fn a_paused_schedule_skips_its_times_and_runs_again_once_resumed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sched.db");
    let log = dir.path().join("server.log");
    let s = start(&db, None, &log);
    s.define(&quick_definition());
    let (st, v) = s.post(
        "/schedules",
        &json!({"id": "tick", "definition": "quick", "every": "PT1S", "paused": true}),
    );
    assert_eq!((st, v["state"].as_str()), (201, Some("paused")), "{v}");
    std::thread::sleep(Duration::from_millis(2500));
    let (_, v) = s.get("/schedules/tick");
    assert_eq!(v["runs"], 0, "{v}");
    let paused = v["skipped"]["paused"].as_u64().unwrap_or(0);
    assert!(paused >= 2, "{v}");
    let (st, v) = s.post("/schedules/tick/resume", &json!({}));
    assert_eq!((st, v["state"].as_str()), (200, Some("active")), "{v}");
    let resumed = chrono::Utc::now().timestamp_millis();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, v) = s.get("/schedules/tick");
        if v["runs"].as_u64().unwrap_or(0) >= 2 {
            // Only times after the resume ran: none of the skipped ones.
            for r in v["recentRuns"].as_array().expect("runs") {
                let t = chrono::DateTime::parse_from_rfc3339(r["nominalTime"].as_str().expect("a time"))
                    .expect("RFC 3339")
                    .timestamp_millis();
                assert!(t >= resumed - 1000, "a time from before the resume ran: {v}");
            }
            assert!(v["skipped"]["paused"].as_u64().unwrap_or(0) >= paused, "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "the resumed schedule did not run: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Pause, resume, trigger, backfill, change and delete; bad specifications are refused naming the
/// field; the schedule and its record survive a restart.
#[test]
fn schedules_are_paused_triggered_backfilled_changed_and_deleted_over_http() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sched.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&quick_definition());
    let (st, v) = s.post(
        "/schedules",
        &json!({"id": "bad id", "definition": "quick", "cron": "0 25 * * *",
        "overlap": "often"}),
    );
    assert_eq!((st, v["error"].as_str()), (400, Some("invalidSchedule")), "{v}");
    let pointers: Vec<&str> = v["details"]
        .as_array()
        .expect("details")
        .iter()
        .filter_map(|d| d["pointer"].as_str())
        .collect();
    assert_eq!(pointers, ["/id", "/cron", "/overlap"], "{v}");
    let (st, v) = s.post(
        "/schedules",
        &json!({"id": "n", "definition": "nope", "cron": "@daily"}),
    );
    assert_eq!((st, v["error"].as_str()), (404, Some("unknownDefinition")), "{v}");
    let spec = json!({"id": "nightly", "definition": "quick", "cron": "0 2 * * *", "timezone": "Europe/Paris"});
    assert_eq!(s.post("/schedules", &spec).0, 201);
    let (st, v) = s.post("/schedules", &spec);
    assert_eq!((st, v["error"].as_str()), (409, Some("scheduleExists")), "{v}");
    let (_, v) = s.get("/schedules/nightly");
    assert!(
        v["nextTimes"][0].as_str().unwrap_or_default().ends_with("T01:00:00Z"),
        "02:00 in Paris is 01:00Z in winter: {v}"
    );
    // Paused: trigger still starts one now.
    let (st, v) = s.post("/schedules/nightly/pause", &json!({}));
    assert_eq!((st, v["state"].as_str()), (200, Some("paused")), "{v}");
    let (st, v) = s.post("/schedules/nightly/trigger", &json!({}));
    assert_eq!(st, 200, "{v}");
    let triggered = v["recentRuns"][0]["instance"].as_str().expect("a run").to_string();
    assert!(triggered.starts_with("nightly@"), "{triggered}");
    // A backfill of three nights, once each even when asked twice.
    let span = json!({"from": "2026-11-01T00:00:00Z", "to": "2026-11-04T00:00:00Z"});
    let (st, v) = s.post("/schedules/nightly/backfill", &span);
    assert_eq!((st, v["backfilled"].as_u64()), (200, Some(3)), "{v}");
    let (st, _) = s.post("/schedules/nightly/backfill", &span);
    assert_eq!(st, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    let want = [
        "nightly@2026-11-01T01:00:00Z",
        "nightly@2026-11-02T01:00:00Z",
        "nightly@2026-11-03T01:00:00Z",
    ];
    loop {
        let (_, page) = s.get("/instances?definition=quick&limit=100");
        let ids: Vec<&str> = page["instances"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|i| i["id"].as_str())
            .collect();
        if want.iter().all(|w| ids.contains(w)) {
            assert_eq!(ids.len(), 4, "the trigger's and three nights', once each: {ids:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the backfill did not start: {ids:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A backfilled run reads the nominal time it stands for, long past.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let inst = s.instance(want[0]);
        if inst["status"] == "completed" {
            assert_eq!(inst["data"]["nominal"], "2026-11-01T01:00:00Z", "{inst}");
            break;
        }
        assert!(Instant::now() < deadline, "the backfilled run did not end: {inst}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (st, v) = s.post(
        "/schedules/nightly/backfill",
        &json!({"from": "yesterday", "to": "2026-11-04T00:00:00Z"}),
    );
    assert_eq!((st, v["details"][0]["pointer"].as_str()), (400, Some("/from")), "{v}");
    // Changed (every hour), resumed by the change; the record is kept across a restart.
    let (st, v) = s.send(
        s.client()
            .put(format!("{}/schedules/nightly", s.url()))
            .json(&json!({"definition": "quick", "every": "PT1H"})),
        "PUT",
    );
    assert_eq!((st, v["state"].as_str()), (200, Some("active")), "{v}");
    assert_eq!(v["spec"]["every"], "PT1H", "{v}");
    s.kill();
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    let (st, v) = s.get("/schedules");
    assert_eq!(st, 200);
    assert_eq!(v["schedules"][0]["id"], "nightly", "{v}");
    assert_eq!(v["schedules"][0]["runs"], 4, "{v}");
    // The same through the command line.
    let cli = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .args(["--server", s.url()])
            .output()
            .expect("sm4c runs");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (
            out.status.code(),
            text,
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, out, err) = cli(&["schedule", "show", "nightly"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).expect("JSON")["runs"], 4, "{out}");
    let (code, out, err) = cli(&["schedule", "pause", "nightly"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"paused\""), "{out}");
    let file = dir.path().join("hourly.json");
    std::fs::write(
        &file,
        json!({"id": "hourly", "definition": "quick", "cron": "0 * * * *"}).to_string(),
    )
    .expect("write");
    let (code, _, err) = cli(&["schedule", "create", file.to_str().expect("path")]);
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = cli(&["schedule", "create", file.to_str().expect("path")]);
    assert_eq!(code, Some(1));
    assert!(err.contains("scheduleExists (409)"), "{err}");
    let (code, out, err) = cli(&["schedule", "list"]);
    assert_eq!(code, Some(0), "{err}");
    let ids: Vec<String> = serde_json::from_str::<Value>(&out).expect("JSON")["schedules"]
        .as_array()
        .expect("schedules")
        .iter()
        .filter_map(|v| v["id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(ids, ["hourly", "nightly"]);
    let (code, _, err) = cli(&["schedule", "delete", "hourly"]);
    assert_eq!(code, Some(0), "{err}");
    let (st, _) = s.send(s.client().delete(format!("{}/schedules/nightly", s.url())), "DELETE");
    assert_eq!(st, 204);
    let (st, v) = s.get("/schedules/nightly");
    assert_eq!((st, v["error"].as_str()), (404, Some("unknownSchedule")), "{v}");
    let (code, _, err) = cli(&["schedule", "show", "hourly"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("unknownSchedule (404)"), "{err}");
}

/// A version of `greeter` that greets with `word`.
fn greeter(version: &str, word: &str) -> Value {
    json!({
        "id": "greeter", "name": "Greeter", "version": version,
        "states": [{"name": "Greet", "start": true,
            "enterAction": {"type": "injectData", "expression": format!("${{ \"{word} \" + .name }}")},
            "enterResultHandler": "${ .greeting = $value }"}]
    })
}

/// A default version holds new starts on it while newer versions are registered, is shown by
/// `GET /definitions/{id}`, survives a SIGKILL, and once cleared new starts take the newest again.
#[test]
fn a_default_version_takes_the_starts_while_newer_ones_wait_and_survives_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("versions.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&greeter("1", "Hello"));
    let (code, out, err) = s.cli(&["default-version", "greeter", "1"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.trim(),
        "new starts of greeter take version 1 (its default version); the newest is 1"
    );
    // Version 2 is registered but takes no traffic; a start may still name it.
    s.define(&greeter("2", "Hi"));
    let (st, v) = s.get("/definitions/greeter");
    assert_eq!(st, 200);
    assert_eq!(
        (&v["latest"], &v["defaultVersion"], &v["startsTake"]),
        (&json!("2"), &json!("1"), &json!("1")),
        "{v}"
    );
    assert_eq!(v["definition"]["version"], "1", "{v}");
    s.start_instance("greeter", "g1", json!({"name": "Ada"}));
    let (st, b) = s.post(
        "/instances",
        &json!({"definition": "greeter", "version": "2", "id": "g2", "input": {"name": "Bo"}}),
    );
    assert_eq!(st, 201, "{b}");
    let g1 = s.wait_instance("g1", Duration::from_secs(10), "g1 ends", |v| v["status"] == "completed");
    let g2 = s.wait_instance("g2", Duration::from_secs(10), "g2 ends", |v| v["status"] == "completed");
    assert_eq!(
        (&g1["version"], &g1["data"]["greeting"]),
        (&json!("1"), &json!("Hello Ada")),
        "{g1}"
    );
    assert_eq!(
        (&g2["version"], &g2["data"]["greeting"]),
        (&json!("2"), &json!("Hi Bo")),
        "{g2}"
    );

    // An unknown version or definition is refused and changes nothing.
    let (code, _, err) = s.cli(&["default-version", "greeter", "9"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no definition \"greeter version 9\""), "{err}");
    let (code, _, err) = s.cli(&["default-version", "nobody", "1"]);
    assert_eq!(code, Some(1), "{err}");
    let (st, b) = s.send(
        s.client()
            .put(format!("{}/definitions/greeter/default-version", s.url()))
            .header("content-type", "application/json")
            .body("{\"version\": 2, \"extra\": true}"),
        "a bad body",
    );
    assert_eq!((st, b["error"].as_str()), (400, Some("malformedJson")), "{b}");
    assert_eq!(s.get("/definitions/greeter").1["startsTake"], "1");

    s.kill();
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    let (_, v) = s.get("/definitions/greeter");
    assert_eq!(
        (&v["defaultVersion"], &v["startsTake"]),
        (&json!("1"), &json!("1")),
        "{v}"
    );
    s.start_instance("greeter", "g3", json!({"name": "Cy"}));
    let g3 = s.wait_instance("g3", Duration::from_secs(10), "g3 ends", |v| v["status"] == "completed");
    assert_eq!(g3["version"], "1", "{g3}");

    // Cleared: the newest takes the starts again.
    let (code, out, err) = s.cli(&["default-version", "greeter", "--latest", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        v,
        json!({"id": "greeter", "latest": "2", "defaultVersion": null, "startsTake": "2"})
    );
    s.start_instance("greeter", "g4", json!({"name": "Di"}));
    let g4 = s.wait_instance("g4", Duration::from_secs(10), "g4 ends", |v| v["status"] == "completed");
    assert_eq!(
        (&g4["version"], &g4["data"]["greeting"]),
        (&json!("2"), &json!("Hi Di")),
        "{g4}"
    );
}

/// Version `v` of an order that waits for `paid` (correlated on `orderid`) in `wait`, with a
/// one-hour timeout, then records in `next` which version took it there.
fn order_version(v: &str, wait: &str, next: &str) -> Value {
    json!({
        "id": "order", "name": "Order", "version": v,
        "events": [{"name": "paid", "type": "paid", "source": "shop",
                    "correlation": [{"contextAttributeName": "orderid", "contextAttributeValue": "${ .orderId }"}]}],
        "states": [
            {"name": wait, "start": true, "transitions": [
                {"nextState": next, "eventGroups": [{"events": ["paid"]}]},
                {"nextState": "Expired", "timeout": "PT1H"}]},
            {"name": next, "enterAction": {"type": "injectData", "expression": format!("${{ \"{next} on {v}\" }}")},
             "enterResultHandler": "${ .path = $value }"},
            {"name": "Expired"}
        ]
    })
}

/// A waiting instance moves to a newer version with a state map (after a dry run that changes
/// nothing, and refusals that change nothing), keeps its timeout's deadline, survives a SIGKILL
/// right after the move, and finishes on the new version's path when its event comes; `history`
/// shows the move.
#[test]
fn a_waiting_instance_migrates_to_a_new_version_and_finishes_there_after_a_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("migrate.db");
    let log = dir.path().join("server.log");
    let mut s = start(&db, None, &log);
    s.define(&order_version("1", "Wait", "Done"));
    s.define(&order_version("2", "AwaitPayment", "Ship"));
    let (st, b) = s.post(
        "/instances",
        &json!({"definition": "order", "version": "1", "id": "o1", "input": {"orderId": "o1"}}),
    );
    assert_eq!(st, 201, "{b}");
    let before = s.wait_instance("o1", Duration::from_secs(10), "o1 waits", |v| v["status"] == "waiting");
    assert_eq!(before["version"], "1");
    let recorded = s.history("o1").len();

    // Refused without a map: 409 naming the state, and nothing changes.
    let (st, b) = s.post("/instances/o1/migrate", &json!({"version": "2"}));
    assert_eq!(
        (st, b["error"].as_str(), b["details"]["reason"].as_str()),
        (409, Some("notMigratable"), Some("noCounterpart")),
        "{b}"
    );
    assert!(
        b["message"]
            .as_str()
            .unwrap_or_default()
            .contains("state \"Wait\" has no counterpart in version \"2\""),
        "{b}"
    );
    let (st, b) = s.post("/instances/o1/migrate", &json!({"version": "7"}));
    assert_eq!((st, b["error"].as_str()), (404, Some("unknownDefinition")), "{b}");
    // A dry run says what would happen and changes nothing either.
    let (code, out, err) = s.cli(&[
        "migrate",
        "o1",
        "--version",
        "2",
        "--state",
        "Wait=AwaitPayment",
        "--dry-run",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("o1 would move from version 1 state Wait to version 2 state AwaitPayment\n"),
        "{out}"
    );
    assert!(out.contains("  timer 1.timeout: kept"), "{out}");
    let same = s.instance("o1");
    assert_eq!(
        (&same["version"], &same["state"]),
        (&json!("1"), &json!("Wait")),
        "{same}"
    );
    assert_eq!(s.history("o1").len(), recorded, "refusals and a dry run record nothing");

    let (code, out, err) = s.cli(&[
        "migrate",
        "o1",
        "--version",
        "2",
        "--state",
        "Wait=AwaitPayment",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        (&v["version"], &v["state"], &v["status"]),
        (&json!("2"), &json!("AwaitPayment"), &json!("waiting")),
        "{v}"
    );
    assert_eq!(
        v["migration"]["timers"],
        json!([{"timer": "1.timeout", "change": "kept", "due": v["migration"]["timers"][0]["due"]}])
    );
    // Moved once: the same move again is refused (it is on version 2 already).
    let (st, b) = s.post("/instances/o1/migrate", &json!({"version": "2"}));
    assert_eq!((st, b["details"]["reason"].as_str()), (409, Some("sameVersion")), "{b}");

    s.kill();
    let s = {
        drop(s);
        start(&db, None, &log)
    };
    let v = s.instance("o1");
    assert_eq!(
        (&v["version"], &v["state"], &v["status"]),
        (&json!("2"), &json!("AwaitPayment"), &json!("waiting")),
        "{v}"
    );
    let history = s.history("o1");
    let moves = entries(&history, "input", "input", "migrate");
    assert_eq!(moves.len(), 1, "{history:?}");
    assert_eq!(
        (&moves[0]["from"], &moves[0]["version"], &moves[0]["states"]),
        (&json!("1"), &json!("2"), &json!({"Wait": "AwaitPayment"}))
    );
    let (code, out, _) = s.cli(&["history", "o1"]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("input migrate from version 1 to 2 (Wait=AwaitPayment)"),
        "{out}"
    );
    assert!(
        out.contains("moved from state Wait of version 1 to state AwaitPayment of version 2"),
        "{out}"
    );

    let (st, b) =
        s.post_event(&json!({"specversion": "1.0", "id": "p1", "source": "shop", "type": "paid", "orderid": "o1"}));
    assert_eq!(st, 202, "{b}");
    let done = s.wait_instance("o1", Duration::from_secs(10), "o1 ends", |v| v["status"] == "completed");
    assert_eq!(done["data"]["path"], "Ship on 2", "{done}");
    assert!(!s.log_tail().contains("replayMismatch"), "{}", s.log_tail());
}

/// Version `v` of a router: an order with `.slow` goes to `Work` (a worker task nobody takes),
/// the others wait for `paid` in `wait`.
fn router(v: &str, wait: &str) -> Value {
    json!({
        "id": "router", "name": "Router", "version": v,
        "functions": [{"name": "work", "type": "worker", "operation": "slow-work"}],
        "events": [{"name": "paid", "type": "paid", "source": "shop"}],
        "states": [
            {"name": "Route", "start": true, "transitions": [
                {"nextState": "Work", "condition": "${ .slow == true }"},
                {"nextState": wait}]},
            {"name": "Work", "enterAction": {"type": "invokeFunction", "functionName": "work", "waitForCompletion": true}},
            {"name": wait, "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["paid"]}]}]},
            {"name": "Done"}
        ]
    })
}

/// `sm4c upgrade-check` reports, per version and state, the instances that could move to a new
/// version as they are, those that need a state map, those that cannot (in the middle of an
/// action), and whose histories it decides otherwise; nothing is registered or changed.
#[test]
fn the_upgrade_report_counts_what_could_move_what_needs_a_map_and_what_cannot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("upgrade.db");
    let log = dir.path().join("server.log");
    let s = start(&db, None, &log);
    s.define(&router("1", "Wait"));
    for i in 0..3 {
        s.start_instance("router", &format!("w{i}"), json!({}));
    }
    s.start_instance("router", "slow", json!({"slow": true}));
    for id in ["w0", "w1", "w2"] {
        s.wait_instance(id, Duration::from_secs(10), "it waits", |v| v["status"] == "waiting");
    }
    // Running its enter action: the task waits on its task list.
    s.wait_instance("slow", Duration::from_secs(10), "its task", |v| v["state"] == "Work");
    let check = |doc: &Value, json: bool| {
        let file = dir.path().join("next.json");
        write_json(&file, doc);
        let mut args = vec![
            "upgrade-check".to_string(),
            file.display().to_string(),
            "--server".into(),
            s.url().to_string(),
        ];
        if json {
            args.push("--json".into());
        }
        let out = Command::new(BIN).args(&args).output().expect("sm4c runs");
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };

    // Version 2 renames Wait: those need a map; the one in its action cannot move.
    let v: Value = serde_json::from_str(&check(&router("2", "AwaitPayment"), true)).expect("JSON");
    assert_eq!(
        (&v["instances"], &v["canMove"], &v["needMapping"], &v["cannot"]),
        (&json!(4), &json!(0), &json!(3), &json!({"inAction": 1})),
        "{v}"
    );
    let groups = v["groups"].as_array().expect("groups");
    let wait = groups.iter().find(|g| g["state"] == "Wait").expect("the Wait group");
    assert_eq!(
        (&wait["version"], &wait["instances"], &wait["needMapping"]),
        (&json!("1"), &json!(3), &json!(3)),
        "{v}"
    );
    // Their histories entered Wait, which version 2 does not have.
    assert_eq!(wait["diverged"], 3, "{v}");
    let work = groups.iter().find(|g| g["state"] == "Work").expect("the Work group");
    assert_eq!(work["cannot"], json!({"inAction": 1}), "{v}");
    assert!(
        work["examples"][0]["why"]
            .as_str()
            .unwrap_or_default()
            .contains("in the middle of its enter action"),
        "{v}"
    );

    // Version 3 keeps Wait: those could move as they are, with the same decisions.
    let text = check(&router("3", "Wait"), false);
    assert!(
        text.starts_with("version 3 of router, against the 4 instances that have not ended:\n  3 can move to it as they are, 0 need a state map, 1 cannot (inAction 1)\n  4 histories it decides the same, 0 otherwise\n"),
        "{text}"
    );
    assert!(
        text.contains("VERSION  STATE  INSTANCES  MOVE  MAP  CANNOT      SAME  DIVERGED"),
        "{text}"
    );
    // Nothing was registered.
    let (_, d) = s.get("/definitions/router");
    assert_eq!(d["versions"].as_array().map(Vec::len), Some(1), "{d}");
}
