//! `GET /metrics` of `sm4c serve`: the real binary runs instances that complete, fail, are cancelled
//! and time out, calls a mocked function, and the exposition it answers is parsed and checked.

use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use tempfile::TempDir;

use crate::support::server;
use server::{Serve, Server};
const DEADLINE: Duration = Duration::from_secs(20);

/// Calls `double`, which fails for a negative `.n`, and stores its result.
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

/// Waits 0.1 s, then takes one transition to `Done`.
fn delayed() -> Value {
    json!({
        "id": "delayed", "name": "Delayed", "version": "1",
        "states": [
            {"name": "Pause", "start": true, "enterAction": {"type": "delay", "timeout": "0.1s"},
             "transitions": [{"nextState": "Done"}]},
            {"name": "Done"}
        ]
    })
}

/// Waits for an event that never comes; `timeout` (if any) ends it.
fn waiter(id: &str, timeout: Option<&str>) -> Value {
    let mut d = json!({
        "id": id, "name": id, "version": "1",
        "events": [{"name": "paid", "type": "com.example.paid", "source": "shop"}],
        "states": [
            {"name": "Wait", "start": true, "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["paid"]}]}]},
            {"name": "Done"}
        ]
    });
    if let Some(t) = timeout {
        d["timeout"] = json!({"duration": t});
    }
    d
}

fn start(dir: TempDir, extra: &[&str]) -> Server {
    Serve::new()
        .db(dir.path().join("sm4c.db"))
        .log(dir.path().join("server.log"))
        .args(extra)
        .keep(dir)
        .start()
}

/// What these tests ask of a server.
trait Api {
    fn post(&self, path: &str, body: &Value) -> (u16, Value);
    fn define(&self, doc: &Value);
    fn run(&self, definition: &str, id: &str, input: Value);
    fn wait_status(&self, id: &str, status: &str);
    fn metrics(&self) -> Exposition;
}

impl Api for Server {
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client()
            .post(format!("{}{path}", self.url()))
            .json(body)
            .send()
            .expect("answered");
        let code = r.status().as_u16();
        (code, r.json().unwrap_or(Value::Null))
    }

    fn define(&self, doc: &Value) {
        let (code, body) = self.post("/definitions", doc);
        assert_eq!(code, 201, "defining {}: {body}", doc["id"]);
    }

    fn run(&self, definition: &str, id: &str, input: Value) {
        let (code, body) = self.post(
            "/instances",
            &json!({"definition": definition, "id": id, "input": input}),
        );
        assert_eq!(code, 201, "starting {id}: {body}");
    }

    fn wait_status(&self, id: &str, status: &str) {
        let t0 = Instant::now();
        loop {
            let v: Value = self
                .client()
                .get(format!("{}/instances/{id}", self.url()))
                .send()
                .and_then(|r| r.json())
                .expect("instance");
            if v["status"] == json!(status) {
                return;
            }
            assert!(t0.elapsed() < DEADLINE, "{id} did not become {status}: {v}");
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn metrics(&self) -> Exposition {
        let r = self
            .client()
            .get(format!("{}/metrics", self.url()))
            .send()
            .expect("GET /metrics");
        assert_eq!(r.status(), 200);
        let ct = r.headers()["content-type"].to_str().expect("content type").to_string();
        assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
        Exposition::parse(&r.text().expect("body"))
    }
}

type Labels = BTreeMap<String, String>;

/// The parsed text format: each family's type and every sample.
#[derive(Debug)]
struct Exposition {
    types: HashMap<String, String>,
    samples: Vec<(String, Labels, f64)>,
}

impl Exposition {
    fn parse(text: &str) -> Exposition {
        assert!(text.ends_with("# EOF\n"), "no # EOF at the end:\n{text}");
        let mut types = HashMap::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
                types.insert(name.to_string(), kind.to_string());
                continue;
            }
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("a sample and its value");
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line:?}"));
            let (name, labels) = match series.split_once('{') {
                None => (series.to_string(), Labels::new()),
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').expect("labels end with }");
                    let mut labels = Labels::new();
                    // Label values here hold no commas or quotes.
                    for pair in body.split(',').filter(|p| !p.is_empty()) {
                        let (k, v) = pair.split_once('=').expect("label=value");
                        let v = v
                            .strip_prefix('"')
                            .and_then(|v| v.strip_suffix('"'))
                            .expect("quoted value");
                        labels.insert(k.to_string(), v.to_string());
                    }
                    (name.to_string(), labels)
                }
            };
            samples.push((name, labels, value));
        }
        Exposition { types, samples }
    }

    /// The value of the one sample `name` with exactly `labels` (0 when there is none).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let want: Labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let found: Vec<f64> = self
            .samples
            .iter()
            .filter(|(n, l, _)| n == name && *l == want)
            .map(|(_, _, v)| *v)
            .collect();
        assert!(found.len() <= 1, "{name} {want:?} appears {} times", found.len());
        found.first().copied().unwrap_or(0.0)
    }

    /// Every label set of samples named `name`.
    fn series(&self, name: &str) -> Vec<&Labels> {
        self.samples
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, l, _)| l)
            .collect()
    }
}

#[test]
fn metrics_count_instances_transitions_and_function_calls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = dir.path().join("mocks.json");
    let mocks = json!({"double": "if .n < 0 then error(\"negative\") else .n * 2 end"});
    std::fs::write(&mock, mocks.to_string()).expect("mocks");
    let s = start(dir, &["--mock", mock.to_str().expect("path")]);

    // Before anything ran, the families are declared with their types and hold no series.
    let m = s.metrics();
    for (family, kind) in [
        ("sm4c_instances_started", "counter"),
        ("sm4c_instances_ended", "counter"),
        ("sm4c_transitions", "counter"),
        ("sm4c_action_duration_seconds", "histogram"),
        ("sm4c_function_call_duration_seconds", "histogram"),
        ("sm4c_store_commit_duration_seconds", "histogram"),
        ("sm4c_store_commit_batch_size", "histogram"),
    ] {
        assert_eq!(m.types.get(family).map(String::as_str), Some(kind), "{family}: {m:?}");
    }
    assert!(m.series("sm4c_instances_started_total").is_empty(), "{m:?}");

    for d in [
        doubler(),
        delayed(),
        waiter("waiter", None),
        waiter("expiring", Some("0.1s")),
    ] {
        s.define(&d);
    }
    s.run("doubler", "d-ok-1", json!({"n": 2}));
    s.run("doubler", "d-ok-2", json!({"n": 3}));
    s.run("doubler", "d-bad", json!({"n": -1}));
    s.run("delayed", "late-1", json!({}));
    s.run("delayed", "late-2", json!({}));
    s.run("waiter", "w-1", json!({}));
    s.run("expiring", "e-1", json!({}));
    let (code, body) = s.post("/instances/w-1/cancel", &json!({}));
    assert_eq!(code, 200, "cancel: {body}");
    for (id, status) in [
        ("d-ok-1", "completed"),
        ("d-ok-2", "completed"),
        ("d-bad", "failed"),
        ("late-1", "completed"),
        ("late-2", "completed"),
        ("w-1", "cancelled"),
        ("e-1", "timedOut"),
    ] {
        s.wait_status(id, status);
    }

    let m = s.metrics();
    let started = "sm4c_instances_started_total";
    for (definition, n) in [("doubler", 3.0), ("delayed", 2.0), ("waiter", 1.0), ("expiring", 1.0)] {
        assert_eq!(
            m.value(started, &[("definition", definition)]),
            n,
            "{definition}: {m:?}"
        );
    }
    assert_eq!(m.series(started).len(), 4, "{m:?}");

    let ended = "sm4c_instances_ended_total";
    for (definition, status, n) in [
        ("doubler", "completed", 2.0),
        ("doubler", "failed", 1.0),
        ("delayed", "completed", 2.0),
        ("waiter", "cancelled", 1.0),
        ("expiring", "timedOut", 1.0),
    ] {
        let v = m.value(ended, &[("definition", definition), ("status", status)]);
        assert_eq!(v, n, "{definition} {status}: {m:?}");
    }
    assert_eq!(m.series(ended).len(), 5, "{m:?}");

    // One transition per `delayed` instance; the others fired none.
    assert_eq!(
        m.value("sm4c_transitions_total", &[("definition", "delayed")]),
        2.0,
        "{m:?}"
    );
    assert_eq!(m.series("sm4c_transitions_total").len(), 1, "{m:?}");

    // Two calls answered, one failed; each outcome is a histogram with its buckets, count and sum.
    let call = "sm4c_function_call_duration_seconds";
    let ok = [("function", "double"), ("type", "rest"), ("outcome", "ok")];
    let failed = [("function", "double"), ("type", "rest"), ("outcome", "functionError")];
    assert_eq!(m.value(&format!("{call}_count"), &ok), 2.0, "{m:?}");
    assert_eq!(m.value(&format!("{call}_count"), &failed), 1.0, "{m:?}");
    assert!(m.value(&format!("{call}_sum"), &ok) >= 0.0);
    let mut inf = ok.to_vec();
    inf.push(("le", "+Inf"));
    assert_eq!(m.value(&format!("{call}_bucket"), &inf), 2.0, "{m:?}");
    assert_eq!(m.series(&format!("{call}_count")).len(), 2, "{m:?}");

    // Actions by type and outcome: the two delays took their 0.1 s each (from the step that
    // started them to the timer's); the calls ended in later steps, two completed and one failed.
    let action = "sm4c_action_duration_seconds";
    let delays = [("action", "delay"), ("outcome", "completed")];
    assert_eq!(m.value(&format!("{action}_count"), &delays), 2.0, "{m:?}");
    assert!(m.value(&format!("{action}_sum"), &delays) >= 0.2, "{m:?}");
    let calls = [("action", "invokeFunction"), ("outcome", "completed")];
    assert_eq!(m.value(&format!("{action}_count"), &calls), 2.0, "{m:?}");
    let failed_calls = [("action", "invokeFunction"), ("outcome", "failed")];
    assert_eq!(m.value(&format!("{action}_count"), &failed_calls), 1.0, "{m:?}");

    // Group commits: every input handled went through one. At least 7 starts, 3 call results,
    // 2 delays, 1 cancel and 1 instance timeout were committed.
    let commits = m.value("sm4c_store_commit_duration_seconds_count", &[]);
    assert!(commits >= 1.0, "{m:?}");
    assert_eq!(m.value("sm4c_store_commit_batch_size_count", &[]), commits, "{m:?}");
    assert_eq!(
        m.value("sm4c_store_commit_duration_seconds_bucket", &[("le", "+Inf")]),
        commits
    );
    assert!(m.value("sm4c_store_commit_batch_size_sum", &[]) >= 14.0, "{m:?}");

    // No label carries an instance id.
    for (_, labels, _) in &m.samples {
        for v in labels.values() {
            assert!(
                !["d-ok-1", "d-bad", "late-1", "w-1", "e-1"].contains(&v.as_str()),
                "{labels:?}"
            );
        }
    }
}
