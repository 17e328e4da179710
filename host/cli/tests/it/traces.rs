//! OpenTelemetry traces of `sm4c serve`, received by a real OTLP/HTTP receiver (our own, in this
//! test: an axum server that decodes `ExportTraceServiceRequest` protobufs). An instance started
//! with a `traceparent` header waits on a timer, calls a REST server and sends an event: every step
//! is a span in the starting trace that links to the starting span and has no parent; the REST
//! server and the sent event carry a step's trace context; the origin survives a restart; and with
//! no OTLP configured nothing is exported and no trace context goes out.

use crate::support::otlp;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::get;
use axum::{Json, Router};
use opentelemetry_proto::tonic::trace::v1::Span;
use otlp::{attr, hex, receiver, spawn, Received};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ORIGIN_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const ORIGIN_SPAN: &str = "00f067aa0ba902b7";

use crate::support::server;
use server::{Serve, Server};

/// A REST server whose `GET /work` records the `traceparent` header it got (or "").
fn rest_server() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let app = Router::new()
        .route(
            "/work",
            get(|State(seen): State<Arc<Mutex<Vec<String>>>>, h: HeaderMap| async move {
                let tp = h
                    .get("traceparent")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                seen.lock().unwrap().push(tp);
                Json(json!({"done": true}))
            }),
        )
        .with_state(seen.clone());
    (spawn(app), seen)
}

/// Definitions: `traced` waits 0.2 s, calls `GET /work`, then sends an event; `slow` waits 2 s.
fn definitions(dir: &Path, rest: &str) {
    let doc = json!({
        "openapi": "3.0.1", "servers": [{"url": rest}],
        "paths": {"/work": {"get": {"operationId": "work"}}}
    });
    // In a folder inside the definitions folder (a document a definition names stays in its folder),
    // not beside the definitions, whose every .json file is a definition.
    std::fs::create_dir_all(dir.join("apis")).unwrap();
    std::fs::write(dir.join("apis/api.json"), doc.to_string()).unwrap();
    let traced = json!({
        "id": "traced", "name": "traced", "version": "1",
        "functions": [{"name": "work", "operation": "apis/api.json#work"}],
        "events": [{"name": "done", "type": "com.example.done", "source": "traced"}],
        "states": [
            {"name": "Pause", "start": true, "enterAction": {"type": "delay", "timeout": "0.2s"},
             "transitions": [{"nextState": "Call"}]},
            {"name": "Call", "enterAction": {"type": "invokeFunction", "functionName": "work", "waitForCompletion": true},
             "transitions": [{"nextState": "Done"}]},
            {"name": "Done", "enterAction": {"type": "sendEvent", "event": "done", "expression": "${ {} }"}}
        ]
    });
    std::fs::write(dir.join("traced.json"), traced.to_string()).unwrap();
    let slow = json!({
        "id": "slow", "name": "slow", "version": "1",
        "states": [
            {"name": "Pause", "start": true, "enterAction": {"type": "delay", "timeout": "2s"},
             "transitions": [{"nextState": "Done"}]},
            {"name": "Done"}
        ]
    });
    std::fs::write(dir.join("slow.json"), slow.to_string()).unwrap();
}

/// `sm4c serve` of the definitions in `dir`, exporting to `otlp` when given, once it answers.
fn serve(dir: &Path, otlp: Option<&str>) -> Server {
    let mut serve = Serve::new()
        .db(dir.join("sm4c.db"))
        .arg("--definitions")
        .arg(dir.join("defs"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("OTEL_")) {
        serve = serve.env_remove(k);
    }
    if let Some(o) = otlp {
        // Export every 100 ms rather than every 5 s.
        serve = serve
            .arg("--otlp-endpoint")
            .arg(o)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    }
    serve.start()
}

fn start(port: u16, definition: &str, id: &str, traceparent: Option<&str>) {
    let mut req = reqwest::blocking::Client::new()
        .post(format!("http://127.0.0.1:{port}/instances"))
        .json(&json!({"definition": definition, "id": id}));
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let resp = req.send().unwrap();
    assert_eq!(resp.status().as_u16(), 201, "{:?}", resp.text());
}

fn wait_completed(port: u16, id: &str) {
    let t0 = Instant::now();
    loop {
        let v: Value = reqwest::blocking::get(format!("http://127.0.0.1:{port}/instances/{id}"))
            .unwrap()
            .json()
            .unwrap();
        if v["status"] == "completed" {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{id} did not complete: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the receiver has the span of the step that ended instance `id`; its spans then.
fn wait_spans(got: &Received, id: &str) -> Vec<Span> {
    let t0 = Instant::now();
    loop {
        let spans = got.spans_of(id);
        if spans
            .iter()
            .any(|s| attr(s, "sm4c.status").as_deref() == Some("completed"))
        {
            return spans;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no final span of {id}: {spans:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every span is in the origin's trace, has no parent, and links to the origin's span.
fn assert_linked(spans: &[Span]) {
    for s in spans {
        assert_eq!(hex(&s.trace_id), ORIGIN_TRACE, "a step's span is in the starting trace");
        assert!(s.parent_span_id.is_empty(), "a step's span does not nest: {s:?}");
        assert!(
            s.links
                .iter()
                .any(|l| hex(&l.trace_id) == ORIGIN_TRACE && hex(&l.span_id) == ORIGIN_SPAN),
            "a step's span links to the starting span: {s:?}"
        );
    }
}

#[test]
fn steps_are_spans_linked_to_the_starting_trace_and_context_goes_out() {
    let dir = tempfile::tempdir().unwrap();
    let (otlp, got) = receiver();
    let (rest, seen) = rest_server();
    std::fs::create_dir(dir.path().join("defs")).unwrap();
    definitions(&dir.path().join("defs"), &rest);
    let server = serve(dir.path(), Some(&otlp));
    let port = server.port();
    let origin = format!("00-{ORIGIN_TRACE}-{ORIGIN_SPAN}-01");
    start(port, "traced", "t-1", Some(&origin));
    wait_completed(port, "t-1");
    let spans = wait_spans(&got, "t-1");

    // One span per step: the start, the timer, the call's answer.
    let inputs: Vec<String> = spans.iter().filter_map(|s| attr(s, "sm4c.input")).collect();
    for input in ["start", "timerFired", "completed"] {
        assert!(
            inputs.iter().any(|i| i == input),
            "a span of the {input} step: {inputs:?}"
        );
    }
    assert_linked(&spans);
    for s in &spans {
        assert_eq!(s.name, "sm4c step traced");
        assert_eq!(attr(s, "sm4c.definition").as_deref(), Some("traced"));
        assert!(s.end_time_unix_nano >= s.start_time_unix_nano && s.start_time_unix_nano > 0);
    }

    // The REST server got the trace context of the step that called it: the timer's.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let timer = spans
        .iter()
        .find(|s| attr(s, "sm4c.input").as_deref() == Some("timerFired"))
        .unwrap();
    assert_eq!(seen[0], format!("00-{ORIGIN_TRACE}-{}-01", hex(&timer.span_id)));

    // The sent event carries the trace context of the step that sent it (the call's answer).
    let sent: Value = reqwest::blocking::get(format!("http://127.0.0.1:{port}/events/sent"))
        .unwrap()
        .json()
        .unwrap();
    let event = &sent["events"][0]["event"];
    let answer = spans
        .iter()
        .find(|s| attr(s, "sm4c.input").as_deref() == Some("completed"))
        .unwrap();
    assert_eq!(
        event["traceparent"],
        json!(format!("00-{ORIGIN_TRACE}-{}-01", hex(&answer.span_id))),
        "{event}"
    );

    // The origin is stored with the instance: a step after a restart still links to it.
    start(port, "slow", "s-1", Some(&origin));
    drop(server);
    let server = serve(dir.path(), Some(&otlp));
    let port = server.port();
    wait_completed(port, "s-1");
    let spans = wait_spans(&got, "s-1");
    assert!(spans
        .iter()
        .any(|s| attr(s, "sm4c.input").as_deref() == Some("timerFired")));
    assert_linked(&spans);

    // An instance started without a trace context still has its steps in one trace of their own.
    start(port, "slow", "s-2", None);
    wait_completed(port, "s-2");
    let spans = wait_spans(&got, "s-2");
    assert!(spans.len() >= 2);
    assert!(spans
        .iter()
        .all(|s| s.trace_id == spans[0].trace_id && s.links.is_empty()));
    assert_ne!(hex(&spans[0].trace_id), ORIGIN_TRACE);
    drop(server);
}

#[test]
fn without_otlp_nothing_is_exported_and_no_context_goes_out() {
    let dir = tempfile::tempdir().unwrap();
    let (otlp, got) = receiver();
    let (rest, seen) = rest_server();
    std::fs::create_dir(dir.path().join("defs")).unwrap();
    definitions(&dir.path().join("defs"), &rest);
    // The receiver runs, but nothing points the server at it.
    let _ = otlp;
    let server = serve(dir.path(), None);
    let port = server.port();
    start(
        port,
        "traced",
        "t-1",
        Some(&format!("00-{ORIGIN_TRACE}-{ORIGIN_SPAN}-01")),
    );
    wait_completed(port, "t-1");
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [String::new()],
        "no traceparent on the call"
    );
    let sent: Value = reqwest::blocking::get(format!("http://127.0.0.1:{port}/events/sent"))
        .unwrap()
        .json()
        .unwrap();
    assert!(sent["events"][0]["event"]["type"] == "com.example.done", "{sent}");
    assert!(sent["events"][0]["event"].get("traceparent").is_none(), "{sent}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(got.requests(), 0);
}
