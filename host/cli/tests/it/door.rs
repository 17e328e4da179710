//! What stands in front of the API of `sm4c serve`, against the real binary: a web page cannot
//! drive a server without authentication (the `Host` check, JSON media types, the header of
//! body-less `POST`s), the security headers, the connection limits (a slowloris client, the
//! connection cap), the request timeout that spares long polls, the bounded jq search, and the
//! start-up refusals that keep secrets secret.

use reqwest::blocking::RequestBuilder;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::server;
use server::{Serve, Server, BIN};
const DEADLINE: Duration = Duration::from_secs(20);

/// Starts `sm4c serve` on loopback with `extra` flags and `env`, and waits for `/healthz`.
fn serve(extra: &[&str], env: &[(&str, &str)]) -> Server {
    let mut serve = Serve::new()
        .args(extra)
        .env_remove("SM4C_TOKEN_ADMIN")
        .env_remove("SM4C_TOKEN_OPERATE")
        .env_remove("SM4C_TOKEN_READ")
        // No idle connections kept: each request opens its own, so none holds a slot of the cap.
        .fresh_connections();
    for (k, v) in env {
        serve = serve.env(k, v);
    }
    serve.start()
}

/// What these tests ask of a server.
trait Api {
    fn post(&self, path: &str) -> RequestBuilder;
    fn get(&self, path: &str) -> RequestBuilder;
    fn waiting(&self, n: usize);
}

impl Api for Server {
    fn post(&self, path: &str) -> RequestBuilder {
        self.client().post(format!("{}{path}", self.url()))
    }

    fn get(&self, path: &str) -> RequestBuilder {
        self.client().get(format!("{}{path}", self.url()))
    }

    /// Registers `waiter` and starts instances `w-1`..`w-{n}` that wait for an event.
    fn waiting(&self, n: usize) {
        let doc = json!({
            "id": "waiter", "name": "Waiter", "version": "1",
            "events": [{"name": "go", "type": "com.example.go", "source": "test"}],
            "states": [
                {"name": "Wait", "start": true, "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["go"]}]}]},
                {"name": "Done"}
            ]
        });
        assert_eq!(answer(self.post("/definitions").json(&doc)).0, 201);
        for i in 1..=n {
            let (st, body) = answer(
                self.post("/instances")
                    .json(&json!({"definition": "waiter", "id": format!("w-{i}"), "input": {"n": i}})),
            );
            assert_eq!(st, 201, "{body}");
        }
    }
}

/// (status, JSON body or Null).
fn answer(req: RequestBuilder) -> (u16, Value) {
    let r = req.send().expect("answered");
    let status = r.status().as_u16();
    (
        status,
        serde_json::from_str(&r.text().unwrap_or_default()).unwrap_or(Value::Null),
    )
}

#[test]
fn a_page_that_rebinds_its_name_to_the_server_is_refused() {
    let s = serve(&[], &[]);
    let (st, body) = answer(s.get("/instances").header("host", "attacker.example"));
    assert_eq!(st, 403, "{body}");
    assert_eq!(body["error"], "foreignHost");
    let msg = body["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("\"attacker.example\"") && msg.contains("DNS rebinding"),
        "{msg}"
    );
    // With the port, as browsers send it; and the names that look loopback but are not.
    for foreign in [
        format!("attacker.example:{}", s.port()),
        "127.0.0.1.nip.io".into(),
        "localhost.attacker.example".into(),
    ] {
        let (st, body) = answer(
            s.post("/instances/w/cancel")
                .header("host", &foreign)
                .header("x-sm4c-request", "1"),
        );
        assert_eq!((st, body["error"].as_str()), (403, Some("foreignHost")), "{foreign}");
    }
    for loopback in [
        format!("127.0.0.1:{}", s.port()),
        format!("localhost:{}", s.port()),
        "localhost".into(),
        format!("[::1]:{}", s.port()),
    ] {
        let (st, body) = answer(s.get("/instances").header("host", &loopback));
        assert_eq!(st, 200, "{loopback}: {body}");
    }
    // With tokens, the token decides: a proxy may put any name in front of the server.
    let s = serve(&[], &[("SM4C_TOKEN_READ", "a-read-token")]);
    let (st, body) = answer(
        s.get("/instances")
            .header("host", "sm4c.example.com")
            .bearer_auth("a-read-token"),
    );
    assert_eq!(st, 200, "{body}");
}

#[test]
fn bodies_a_browser_sends_cross_site_without_asking_are_415() {
    let s = serve(&[], &[]);
    s.waiting(1);
    let start = json!({"definition": "waiter", "id": "w-9"}).to_string();
    let answers = [
        ("/instances", start.as_str()),
        ("/definitions", "{}"),
        ("/tasks/send-task-success", r#"{"taskToken": "t", "output": "{}"}"#),
        ("/tasks/send-task-heartbeat", r#"{"taskToken": "t"}"#),
        ("/tasks/dGFzaw/complete", "{}"),
        ("/tasks/dGFzaw/fail", "{}"),
        (
            "/events",
            r#"{"specversion": "1.0", "id": "1", "type": "com.example.go", "source": "test"}"#,
        ),
        (
            "/events/explain",
            r#"{"specversion": "1.0", "id": "1", "type": "com.example.go", "source": "test"}"#,
        ),
    ];
    for ty in [
        "text/plain;a=+json",
        "text/plain; charset=application/json",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=application+json",
    ] {
        for (path, body) in answers {
            let (st, v) = answer(s.post(path).header("content-type", ty).body(body.to_string()));
            assert_eq!(
                (st, v["error"].as_str()),
                (415, Some("unsupportedMediaType")),
                "{path} as {ty}: {v}"
            );
            assert!(
                v["message"].as_str().is_some_and(|m| m.contains("application/json")),
                "{v}"
            );
        }
    }
    // Nothing was started.
    assert_eq!(answer(s.get("/instances/w-9")).0, 404);
    // JSON media types, parsed as such, pass (the answers say what else is wrong).
    let (st, v) = answer(
        s.post("/instances")
            .header("content-type", "application/json; charset=utf-8")
            .body(start.clone()),
    );
    assert_eq!(st, 201, "{v}");
    let (st, v) = answer(
        s.post("/tasks/send-task-heartbeat")
            .header("content-type", "application/x-amz-json-1.0")
            .body(r#"{"taskToken": "dGFzaw"}"#),
    );
    assert_eq!(st, 404, "a token that names no task: {v}");
    // A CloudEvent in binary mode keeps its content type: its ce-* headers are not ones a page
    // can send cross-site. JSON data is JSON; other data stays bytes.
    let binary = |ty: &str, data: &str| {
        s.post("/events")
            .header("ce-specversion", "1.0")
            .header("ce-id", "b-1")
            .header("ce-type", "com.example.other")
            .header("ce-source", "test")
            .header("content-type", ty)
            .body(data.to_string())
    };
    assert_eq!(answer(binary("application/json", r#"{"n": 1}"#)).0, 202);
    assert_eq!(answer(binary("text/plain", "hello")).0, 202);
}

#[test]
fn a_post_without_a_json_body_needs_the_header_without_authentication() {
    let s = serve(&[], &[]);
    s.waiting(2);
    for (what, req) in [
        ("nothing", s.post("/instances/w-1/cancel")),
        (
            "an empty form",
            s.post("/instances/w-1/cancel")
                .header("content-type", "application/x-www-form-urlencoded"),
        ),
        (
            "text/plain",
            s.post("/instances/w-1/cancel").header("content-type", "text/plain"),
        ),
        ("a poll", s.post("/tasklists/images/poll?wait=0s")),
        ("a resume", s.post("/instances/w-1/resume")),
        ("a task answer", s.post("/tasks/dGFzaw/complete")),
    ] {
        let (st, v) = answer(req);
        assert_eq!((st, v["error"].as_str()), (403, Some("headerRequired")), "{what}: {v}");
        assert!(
            v["message"].as_str().is_some_and(|m| m.contains("X-Sm4c-Request: 1")),
            "{what}: {v}"
        );
    }
    let (_, v) = answer(s.get("/instances/w-1"));
    assert_eq!(v["status"], "waiting", "nothing was cancelled: {v}");
    // With the header, or a JSON Content-Type, it goes through.
    let (st, v) = answer(s.post("/instances/w-1/cancel").header("x-sm4c-request", "1"));
    assert_eq!((st, v["status"].as_str()), (200, Some("cancelled")), "{v}");
    let (st, v) = answer(
        s.post("/instances/w-2/cancel")
            .header("content-type", "application/json"),
    );
    assert_eq!((st, v["status"].as_str()), (200, Some("cancelled")), "{v}");
    let (st, _) = answer(s.post("/tasklists/images/poll?wait=0s").header("x-sm4c-request", "1"));
    assert_eq!(st, 204);
    // The CLI client sends it.
    let out = Command::new(BIN)
        .args(["cancel", "w-1", "--server", s.url()])
        .output()
        .expect("sm4c cancel");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("instanceEnded"),
        "the server took the request and said why not: {err}"
    );
    // With a token, the token is what a page cannot send.
    let s = serve(&[], &[("SM4C_TOKEN_OPERATE", "an-operate-token")]);
    let (st, _) = answer(s.post("/tasklists/images/poll?wait=0s").bearer_auth("an-operate-token"));
    assert_eq!(st, 204);
}

#[test]
fn every_answer_says_nosniff_and_the_inspector_its_policy() {
    let s = serve(&[], &[]);
    for (what, req) in [
        ("/healthz", s.get("/healthz")),
        ("/instances", s.get("/instances")),
        ("a 404", s.get("/nowhere")),
        ("/ui/app.js", s.get("/ui/app.js")),
        ("a refusal", s.get("/instances").header("host", "attacker.example")),
        (
            "a 415",
            s.post("/instances").header("content-type", "text/plain").body("x"),
        ),
    ] {
        let r = req.send().expect("answered");
        assert_eq!(
            r.headers().get("x-content-type-options").and_then(|v| v.to_str().ok()),
            Some("nosniff"),
            "{what}"
        );
    }
    for page in ["/ui", "/ui/"] {
        let r = s.get(page).send().expect("page");
        assert_eq!(
            r.headers().get("content-security-policy").and_then(|v| v.to_str().ok()),
            Some("script-src 'self'; frame-ancestors 'none'"),
            "{page}"
        );
        // The policy forbids inline scripts and handlers: the page has none.
        let html = r.text().expect("html");
        assert!(html.contains(r#"<script src="/ui/app.js"></script>"#), "{html}");
        assert_eq!(html.matches("<script").count(), 1, "{html}");
        assert!(!html.contains(" onclick=") && !html.contains(" onload="), "{html}");
    }
}

#[test]
fn a_client_that_sends_its_headers_a_byte_a_second_is_cut_off() {
    let s = serve(&["--header-timeout", "2s"], &[]);
    let mut slow = TcpStream::connect(("127.0.0.1", s.port())).expect("connect");
    slow.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let started = Instant::now();
    let request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut sent = 0;
    let closed = loop {
        // One byte a second, never finishing the headers.
        if slow.write_all(&request[sent % request.len()..][..1]).is_err() {
            break true;
        }
        sent += 1;
        let mut buf = [0u8; 512];
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut gone = false;
        while Instant::now() < deadline {
            match slow.read(&mut buf) {
                Ok(0) => {
                    gone = true;
                    break;
                }
                // hyper answers 408 before closing; then the end comes.
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => {
                    gone = true;
                    break;
                }
            }
        }
        if gone {
            break true;
        }
        // Others are served meanwhile.
        assert_eq!(answer(s.get("/healthz")).0, 200);
        if started.elapsed() > Duration::from_secs(15) {
            break false;
        }
    };
    assert!(
        closed,
        "the server kept a client that sent {sent} bytes of headers over {:?}",
        started.elapsed()
    );
    assert!(
        sent >= 2,
        "it was cut off only after the timeout, not at once ({sent} bytes)"
    );
    assert_eq!(answer(s.get("/healthz")).0, 200, "and it serves on");
}

#[test]
fn a_connection_in_use_outlives_the_header_timeout() {
    let s = serve(&["--header-timeout", "2s"], &[]);
    let mut c = TcpStream::connect(("127.0.0.1", s.port())).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    // One keep-alive connection, a request every half second for three times the timeout: each is
    // answered on it (the first-request deadline is for connections that never ask).
    let started = Instant::now();
    let mut answered = 0;
    while started.elapsed() < Duration::from_secs(6) {
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .expect("the connection is still open");
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        // The whole answer: its head, then as many body bytes as it says.
        let complete = |got: &[u8]| {
            let text = String::from_utf8_lossy(got);
            let Some((head, body)) = text.split_once("\r\n\r\n") else {
                return false;
            };
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok());
            len.is_some_and(|n| body.len() >= n)
        };
        while !complete(&got) {
            let n = c.read(&mut buf).expect("an answer");
            assert!(n > 0, "the server closed a connection in use after {answered} answers");
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
        answered += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(answered >= 8, "{answered}");
}

#[test]
fn an_http2_client_that_never_sends_a_request_is_cut_off() {
    let s = serve(&["--header-timeout", "2s"], &[]);
    let mut idle = TcpStream::connect(("127.0.0.1", s.port())).expect("connect");
    idle.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    // HTTP/2 with prior knowledge: the preface and an empty SETTINGS frame, then nothing.
    idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").expect("preface");
    idle.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).expect("settings");
    let started = Instant::now();
    let mut received = Vec::new();
    let closed = loop {
        let mut buf = [0u8; 512];
        match idle.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break true,
        }
        if started.elapsed() > Duration::from_secs(20) {
            break false;
        }
    };
    assert!(
        closed,
        "the server kept an HTTP/2 connection without a request for {:?}",
        started.elapsed()
    );
    // It spoke HTTP/2 (its SETTINGS frame, type 4, came first) and said goodbye (GOAWAY, type 7).
    assert_eq!(received.get(3), Some(&4), "{received:?}");
    let mut at = 0;
    let mut types = Vec::new();
    while at + 9 <= received.len() {
        let len =
            (usize::from(received[at]) << 16) | (usize::from(received[at + 1]) << 8) | usize::from(received[at + 2]);
        types.push(received[at + 3]);
        at += 9 + len;
    }
    assert!(types.contains(&7), "frames {types:?}");
    assert_eq!(answer(s.get("/healthz")).0, 200, "and it serves on");
}

#[test]
fn connections_beyond_the_cap_are_answered_503_and_the_server_serves_on() {
    let s = serve(&["--max-connections", "2", "--header-timeout", "60s"], &[]);
    // Wait until the client of the start-up check has gone: hold both slots.
    let mut held = Vec::new();
    let started = Instant::now();
    loop {
        held.push(TcpStream::connect(("127.0.0.1", s.port())).expect("connect"));
        held.push(TcpStream::connect(("127.0.0.1", s.port())).expect("connect"));
        let mut third = TcpStream::connect(("127.0.0.1", s.port())).expect("connect");
        third
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .expect("send");
        third.set_read_timeout(Some(DEADLINE)).expect("timeout");
        let mut text = String::new();
        let _ = third.read_to_string(&mut text);
        if text.starts_with("HTTP/1.1 503") {
            assert!(
                text.contains("\"tooManyConnections\"") && text.contains("--max-connections"),
                "{text}"
            );
            break;
        }
        // The start-up check's connection still held a slot: one of ours was answered instead.
        assert!(started.elapsed() < DEADLINE, "never refused: {text}");
        held.clear();
        std::thread::sleep(Duration::from_millis(100));
    }
    // A slot given back is taken again.
    held.truncate(1);
    let started = Instant::now();
    loop {
        match s
            .client()
            .get(format!("{}/healthz", s.url()))
            .send()
            .map(|r| r.status().as_u16())
        {
            Ok(200) => break,
            other => {
                assert!(started.elapsed() < DEADLINE, "no slot came free: {other:?}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

#[test]
fn the_request_timeout_spares_long_polls() {
    let s = serve(&["--request-timeout", "1s"], &[]);
    let (st, v) = answer(s.post("/tasklists/images/poll?wait=3s").header("x-sm4c-request", "1"));
    assert_eq!(st, 204, "the poll waited its 3 s, past the 1 s request timeout: {v}");
    for bad in [
        ["--request-timeout", "0s"],
        ["--header-timeout", "soon"],
        ["--max-connections", "0"],
        ["--work-budget", "0s"],
        ["--work-slots", "many"],
    ] {
        let out = Command::new(BIN)
            .args(["serve", "--db", "/nonexistent/x.db"])
            .args(bad)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(err.contains(bad[0]), "{bad:?}: {err}");
    }
}

#[test]
fn a_search_condition_runs_within_the_configured_expression_limits() {
    let s = serve(&["--expression-fuel", "2000"], &[]);
    s.waiting(3);
    // Cheap enough under the default fuel, far over 2000 steps.
    let q = "[range(100000)] | length > 0";
    let (st, v) = answer(s.get("/ui/api/search").query(&[("condition", q)]));
    assert_eq!((st, v["error"].as_str()), (400, Some("invalidQuery")), "{v}");
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(msg.contains("expression limits") && msg.contains("w-"), "{msg}");
    // Within the limits it matches, and the server serves on.
    let (st, v) = answer(s.get("/ui/api/search").query(&[("condition", ".n >= 2")]));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["instances"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(answer(s.get("/healthz")).0, 200);
}

#[test]
fn searches_run_within_the_configured_work_budget_and_slots() {
    // One slot, a budget of 1 s, and fuel enough for a condition that runs far longer.
    let s = serve(
        &[
            "--work-budget",
            "1s",
            "--work-slots",
            "1",
            "--expression-fuel",
            "10000000000",
        ],
        &[],
    );
    s.waiting(1);
    let slow = "reduce range(10000000000) as $i (0; . + 1) > 0";
    let (st, v) = answer(s.get("/ui/api/search").query(&[("condition", slow)]));
    assert_eq!((st, v["error"].as_str()), (503, Some("busy")), "{v}");
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(msg.contains("took longer than its budget, PT1S"), "{msg}");
    // The job keeps its one slot while it runs: the next search waits the budget for it, in vain.
    let (st, v) = answer(s.get("/ui/api/search").query(&[("condition", ".n >= 0")]));
    assert_eq!((st, v["error"].as_str()), (503, Some("busy")), "{v}");
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(msg.contains("busy with 1 searches"), "{msg}");
    // What needs no slot is served meanwhile.
    assert_eq!(answer(s.get("/healthz")).0, 200);
}

#[test]
fn a_kafka_setting_from_an_unset_variable_stops_the_start_and_names_it() {
    let out = Command::new(BIN)
        .args(["serve", "--kafka", "127.0.0.1:1", "--listen", "127.0.0.1:0"])
        .args(["--kafka-config", "sasl.username=me"])
        .args(["--kafka-config-env", "sasl.password=SM4C_TEST_UNSET_PASSWORD"])
        .env_remove("SM4C_TEST_UNSET_PASSWORD")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--kafka-config-env sasl.password=SM4C_TEST_UNSET_PASSWORD")
            && err.contains("SM4C_TEST_UNSET_PASSWORD is not set"),
        "{err}"
    );
}
