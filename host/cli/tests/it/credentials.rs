//! Where configured credentials may go, against real HTTP servers that record every request they
//! receive: an HTTP Task's connection only to its `endpoints`, never through a redirect to another
//! origin (REST either), answers capped, private addresses refused unless configured, and local
//! files only inside the definitions folder. Every case runs the real `sm4c` binary.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::server;
use server::{Serve, BIN};
const CONN: &str = "arn:aws:events:us-east-1:123456789012:connection/api/1";
const SECRET: &str = "Bearer conn-s3cret";

/// One request a recording server received: its path and its headers.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HashMap<String, String>,
}

/// A real HTTP server on 127.0.0.1 that records every request it receives.
/// - `/v1/ok`: 200 `{"ok": true}`;
/// - `/v1/redirect?to=URL`: 302 to `URL`;
/// - `/v1/huge`: 200, a JSON string of 200 KiB;
/// - `/v1/denied`: 401 with `Set-Cookie`, `WWW-Authenticate` and `x-plain` headers;
/// - anything else: 200 `{"path": PATH}`.
#[derive(Clone)]
struct Recorder {
    url: String,
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn record(
    State(seen): State<Arc<Mutex<Vec<Seen>>>>,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
    h: HeaderMap,
) -> Response {
    let headers = h
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    seen.lock().unwrap().push(Seen {
        path: uri.path().to_string(),
        headers,
    });
    let json = |status: StatusCode, v: Value| (status, [("content-type", "application/json")], v.to_string());
    match uri.path() {
        "/v1/ok" => json(StatusCode::OK, json!({"ok": true})).into_response(),
        "/v1/redirect" => (
            StatusCode::FOUND,
            [("location", q.get("to").cloned().unwrap_or_default())],
            "",
        )
            .into_response(),
        "/v1/huge" => json(StatusCode::OK, Value::String("x".repeat(200 << 10))).into_response(),
        "/v1/denied" => (
            StatusCode::UNAUTHORIZED,
            [
                ("set-cookie", "session=cookie-s3cret"),
                ("www-authenticate", "Bearer realm=\"challenge-s3cret\""),
                ("x-plain", "visible"),
                ("content-type", "application/json"),
            ],
            json!({"reason": "no"}).to_string(),
        )
            .into_response(),
        other => json(StatusCode::OK, json!({"path": other})).into_response(),
    }
}

impl Recorder {
    fn start() -> Recorder {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let state = seen.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let app = Router::new().fallback(record).with_state(state);
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                axum::serve(listener, app).await.unwrap();
            });
        });
        let addr: std::net::SocketAddr = rx.recv().unwrap();
        Recorder {
            url: format!("http://{addr}"),
            port: addr.port(),
            seen,
        }
    }

    fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// `sm4c ARGS` with `env`: (exit code, stdout, stderr).
fn sm4c(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An ASL definition of one HTTP Task to `endpoint`, with the connection when `auth`, catching
/// every error into `$.error`.
fn http_task(endpoint: &str, auth: bool) -> Value {
    let mut params = json!({"ApiEndpoint": endpoint, "Method": "GET"});
    if auth {
        params["Authentication"] = json!({"ConnectionArn": CONN});
    }
    json!({
        "StartAt": "Call",
        "States": {
            "Call": {
                "Type": "Task", "Resource": "arn:aws:states:::http:invoke", "Parameters": params,
                "ResultPath": "$.result",
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Caught"}],
                "End": true
            },
            "Caught": {"Type": "Pass", "End": true}
        }
    })
}

/// The configuration of the connection: its header, its endpoints, and `extra`.
fn connection(endpoints: &[String], extra: &str) -> String {
    let list: Vec<String> = endpoints.iter().map(|e| format!("{e:?}")).collect();
    format!(
        "[asl.connections.\"{CONN}\"]\nheaders = {{ authorization = \"env:SM4C_CRED_CONN\" }}\nendpoints = [{}]\n{extra}",
        list.join(", ")
    )
}

/// `sm4c run` of an ASL definition with a configuration: (exit code, output, stderr).
fn run_asl(dir: &Path, definition: &Value, config: &str) -> (i32, Value, String) {
    let def = dir.join("call.asl.json");
    std::fs::write(&def, definition.to_string()).unwrap();
    let cfg = dir.join("sm4c.toml");
    std::fs::write(&cfg, config).unwrap();
    let (code, out, err) = sm4c(
        &["run", def.to_str().unwrap(), "--config", cfg.to_str().unwrap()],
        &[("SM4C_CRED_CONN", SECRET)],
    );
    (code, serde_json::from_str(&out).unwrap_or(Value::Null), err)
}

fn cause(out: &Value) -> String {
    out["error"]["Cause"].as_str().unwrap_or_default().to_string()
}

#[test]
fn an_http_task_sends_the_connection_only_to_its_endpoints() {
    let a = Recorder::start();
    let b = Recorder::start();
    let dir = tempfile::tempdir().unwrap();
    let config = connection(&[format!("{}/v1/", a.url)], "");
    // Outside the endpoints: another path prefix, a look-alike path, another port (server b),
    // a host that merely starts with the allowed one. No request reaches any server.
    for endpoint in [
        format!("{}/v2/ok", a.url),
        format!("{}/v1evil", a.url),
        format!("{}/v1/../admin", a.url),
        format!("{}/v1/ok", b.url),
        format!("http://127.0.0.1.nip.io:{}/v1/ok", a.port),
    ] {
        // States.Runtime is not caught by States.ALL: the execution fails with it.
        let (code, out, err) = run_asl(dir.path(), &http_task(&endpoint, true), &config);
        assert_eq!(code, 1, "{out}{err}");
        assert_eq!(out["Error"], "States.Runtime", "{endpoint}: {out}");
        let c = out["Cause"].as_str().unwrap_or_default().to_string();
        assert!(
            c.contains(CONN) && c.contains("is not under an endpoint"),
            "{endpoint}: {c}"
        );
        assert!(c.contains("no request was made"), "{c}");
        assert!(!out.to_string().contains("conn-s3cret"), "{out}");
    }
    assert!(a.requests().is_empty(), "{:?}", a.requests());
    assert!(b.requests().is_empty(), "{:?}", b.requests());
    // Under them: the request is made, with the credential.
    let (code, out, err) = run_asl(dir.path(), &http_task(&format!("{}/v1/ok", a.url), true), &config);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out["result"]["ResponseBody"], json!({"ok": true}), "{out}");
    let seen = a.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].headers.get("authorization").map(String::as_str), Some(SECRET));
}

#[test]
fn a_connection_without_endpoints_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("[asl.connections.\"{CONN}\"]\nheaders = {{ authorization = \"env:SM4C_CRED_CONN\" }}\n");
    let (code, out, err) = run_asl(dir.path(), &http_task("http://127.0.0.1:9/v1/ok", true), &config);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains(&format!("line 2: asl.connections.\"{CONN}\": endpoints is missing")),
        "{err}"
    );
    assert!(!err.contains("conn-s3cret"), "{err}");
    // sm4c serve refuses to start with it too.
    let defs = dir.path().join("defs");
    std::fs::create_dir_all(&defs).unwrap();
    let (code, _, err) = sm4c(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--definitions",
            defs.to_str().unwrap(),
            "--db",
            dir.path().join("db.sqlite").to_str().unwrap(),
            "--config",
            dir.path().join("sm4c.toml").to_str().unwrap(),
        ],
        &[("SM4C_CRED_CONN", SECRET)],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("endpoints is missing"), "{err}");
}

#[test]
fn a_redirect_to_another_origin_carries_no_configured_header() {
    let a = Recorder::start();
    let b = Recorder::start();
    let dir = tempfile::tempdir().unwrap();
    // The HTTP Task: the redirect to b is not followed; the 302 is the answer.
    let config = connection(&[format!("{}/v1/", a.url)], "");
    let to = format!("{}/landing", b.url);
    let endpoint = format!("{}/v1/redirect?to={to}", a.url);
    let (code, out, err) = run_asl(dir.path(), &http_task(&endpoint, true), &config);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out["error"]["Error"], "States.Http.StatusCode.302", "{out}");
    assert!(b.requests().is_empty(), "{:?}", b.requests());
    // A redirect within the origin is followed, the credential kept.
    let endpoint = format!("{}/v1/redirect?to=/v1/ok", a.url);
    let (code, out, err) = run_asl(dir.path(), &http_task(&endpoint, true), &config);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out["result"]["ResponseBody"], json!({"ok": true}), "{out}");
    let last = a.requests().pop().unwrap();
    assert_eq!(last.path, "/v1/ok");
    assert_eq!(last.headers.get("authorization").map(String::as_str), Some(SECRET));

    // REST: a configured header, and an operation whose answer redirects to b.
    let doc = json!({
        "openapi": "3.0.1",
        "servers": [{"url": "http://unused.invalid"}],
        "paths": {"/v1/redirect": {"get": {"operationId": "hop", "parameters": [{"name": "to", "in": "query"}]}}}
    });
    std::fs::write(dir.path().join("api.json"), doc.to_string()).unwrap();
    let def = json!({
        "id": "hop", "name": "hop", "version": "1",
        "functions": [{"name": "hop", "operation": "api.json#hop"}],
        "states": [{"name": "A", "start": true,
            "enterAction": {"name": "a", "type": "invokeFunction", "functionName": "hop",
                            "arguments": {"to": to}, "waitForCompletion": true,
                            "errorHandlers": [{"condition": "${ true }", "resultHandler": "${ .error = $value }"}]}}]
    });
    std::fs::write(dir.path().join("hop.json"), def.to_string()).unwrap();
    std::fs::write(
        dir.path().join("rest.toml"),
        format!(
            "[rest.\"api.json\"]\nserver = \"{}\"\nheaders = {{ x-api-key = \"env:SM4C_CRED_KEY\" }}\n",
            a.url
        ),
    )
    .unwrap();
    let (code, out, err) = sm4c(
        &[
            "run",
            dir.path().join("hop.json").to_str().unwrap(),
            "--config",
            dir.path().join("rest.toml").to_str().unwrap(),
        ],
        &[("SM4C_CRED_KEY", "key-s3cret")],
    );
    assert_eq!(code, 0, "{out}{err}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["error"]["details"]["status"], 302, "{out}");
    let at_a: Vec<Seen> = a
        .requests()
        .into_iter()
        .filter(|s| s.headers.contains_key("x-api-key"))
        .collect();
    assert_eq!(at_a.len(), 1, "the configured server got the call: {at_a:?}");
    assert_eq!(at_a[0].path, "/v1/redirect");
    assert!(b.requests().is_empty(), "{:?}", b.requests());
}

#[test]
fn a_huge_response_fails_the_call_naming_the_cap() {
    let a = Recorder::start();
    let dir = tempfile::tempdir().unwrap();
    let config = connection(&[format!("{}/v1/", a.url)], "[calls]\nmax_response = \"64KiB\"\n");
    let (code, out, err) = run_asl(dir.path(), &http_task(&format!("{}/v1/huge", a.url), true), &config);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out["error"]["Error"], "States.TaskFailed", "{out}");
    assert!(
        cause(&out).contains("larger than the cap of 65536 bytes ([calls] max_response"),
        "{out}"
    );
    // The default cap (4 MiB) lets 200 KiB through.
    let config = connection(&[format!("{}/v1/", a.url)], "");
    let (code, out, err) = run_asl(dir.path(), &http_task(&format!("{}/v1/huge", a.url), true), &config);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out["result"]["ResponseBody"].as_str().map(str::len), Some(200 << 10));

    // REST: the same cap, seen by the action's error handler.
    let doc = json!({"openapi": "3.0.1", "servers": [{"url": a.url}],
                     "paths": {"/v1/huge": {"get": {"operationId": "huge"}}}});
    std::fs::write(dir.path().join("api.json"), doc.to_string()).unwrap();
    let def = json!({
        "id": "huge", "name": "huge", "version": "1",
        "functions": [{"name": "huge", "operation": "api.json#huge"}],
        "states": [{"name": "A", "start": true,
            "enterAction": {"name": "a", "type": "invokeFunction", "functionName": "huge", "waitForCompletion": true,
                            "errorHandlers": [{"condition": "${ true }", "resultHandler": "${ .error = $value }"}]}}]
    });
    std::fs::write(dir.path().join("huge.json"), def.to_string()).unwrap();
    std::fs::write(dir.path().join("rest.toml"), "[calls]\nmax_response = \"64KiB\"\n").unwrap();
    let (code, out, err) = sm4c(
        &[
            "run",
            dir.path().join("huge.json").to_str().unwrap(),
            "--config",
            dir.path().join("rest.toml").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["error"]["details"]["kind"], "tooLarge", "{out}");
    assert!(out.to_string().contains("larger than the cap of 65536 bytes"), "{out}");
}

#[test]
fn error_causes_and_results_copy_no_credential_headers() {
    let a = Recorder::start();
    let dir = tempfile::tempdir().unwrap();
    let config = connection(&[format!("{}/v1/", a.url)], "");
    let (code, out, err) = run_asl(dir.path(), &http_task(&format!("{}/v1/denied", a.url), true), &config);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out["error"]["Error"], "States.Http.StatusCode.401", "{out}");
    let c: Value = serde_json::from_str(&cause(&out)).unwrap();
    assert_eq!(c["ResponseBody"], json!({"reason": "no"}), "{c}");
    assert_eq!(c["Headers"]["x-plain"], json!(["visible"]), "{c}");
    assert!(c["Headers"].get("set-cookie").is_none(), "{c}");
    assert!(c["Headers"].get("www-authenticate").is_none(), "{c}");
    assert!(!out.to_string().contains("s3cret"), "{out}");
}

#[test]
fn private_addresses_are_refused_unless_configured() {
    // 0.0.0.0 reaches this machine's listeners on Linux, and is refused like a private address:
    // it lets the test show both the refusal and the configured exception against a real server.
    let a = Recorder::start();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://0.0.0.0:{}/v1/ok", a.port);
    let refused = "[calls]\nallow_private = false\n".to_string();
    let (code, out, err) = run_asl(dir.path(), &http_task(&endpoint, false), &refused);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(out["Error"], "States.Runtime", "{out}");
    let c = out["Cause"].as_str().unwrap_or_default();
    assert!(
        c.contains("0.0.0.0 is the unspecified address, which calls may not reach"),
        "{out}"
    );
    assert!(c.contains("[calls] allow_networks = [\"0.0.0.0/32\"]"), "{out}");
    assert!(a.requests().is_empty(), "{:?}", a.requests());
    let allowed = refused.replace(
        "allow_private = false\n",
        "allow_private = false\nallow_networks = [\"0.0.0.0/32\"]\n",
    );
    let (code, out, err) = run_asl(dir.path(), &http_task(&endpoint, false), &allowed);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out["result"]["ResponseBody"], json!({"ok": true}), "{out}");
    assert_eq!(a.requests().len(), 1);
    // sm4c run allows them by default (its definition is its user's).
    let (code, out, err) = run_asl(dir.path(), &http_task(&endpoint, false), "");
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out["result"]["ResponseBody"], json!({"ok": true}), "{out}");
    assert_eq!(a.requests().len(), 2);
}

#[test]
fn sm4c_serve_refuses_private_addresses_by_default() {
    let a = Recorder::start();
    let dir = tempfile::tempdir().unwrap();
    let defs = dir.path().join("defs");
    std::fs::create_dir_all(&defs).unwrap();
    let start = |config: &str| {
        std::fs::write(dir.path().join("sm4c.toml"), config).unwrap();
        // A fresh store each time, in the server's own folder.
        let server = Serve::new()
            .arg("--definitions")
            .arg(&defs)
            .arg("--config")
            .arg(dir.path().join("sm4c.toml"))
            .start();
        let url = server.url().to_string();
        let client = server.client().clone();
        (server, url, client)
    };
    let run = |url: &str, client: &reqwest::blocking::Client, id: &str| -> Value {
        let mut def = http_task(&format!("http://0.0.0.0:{}/v1/ok", a.port), false);
        def["sm4c:id"] = json!("private");
        let r = client
            .post(format!("{url}/definitions"))
            .header("content-type", "application/json")
            .body(def.to_string())
            .send()
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().unwrap());
        let r = client
            .post(format!("{url}/instances"))
            .json(&json!({"definition": "private", "id": id, "input": {}}))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let v: Value = client
                .get(format!("{url}/instances/{id}"))
                .send()
                .unwrap()
                .json()
                .unwrap();
            if !matches!(v["status"].as_str(), Some("running" | "waiting")) || Instant::now() > until {
                return v;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (server, url, client) = start("");
    let v = run(&url, &client, "refused");
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(v["error"]["type"], "States.Runtime", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("0.0.0.0 is the unspecified address"), "{v}");
    assert!(a.requests().is_empty(), "{:?}", a.requests());
    drop(server);
    let (_server, url, client) = start("[calls]\nallow_networks = [\"0.0.0.0/32\"]\n");
    let v = run(&url, &client, "allowed");
    assert_eq!(v["status"], "completed", "{v}");
    assert!(v.to_string().contains("\"ok\":true"), "{v}");
    assert_eq!(a.requests().len(), 1);
}

#[test]
fn local_files_outside_the_definitions_folder_are_refused() {
    let top = tempfile::tempdir().unwrap();
    let dir = top.path().join("defs");
    std::fs::create_dir_all(&dir).unwrap();
    let doc = json!({"openapi": "3.0.1", "servers": [{"url": "http://127.0.0.1:9"}],
                     "paths": {"/x": {"get": {"operationId": "x"}}}});
    std::fs::write(top.path().join("outside.json"), doc.to_string()).unwrap();
    std::os::unix::fs::symlink(top.path().join("outside.json"), dir.join("link.json")).unwrap();
    let outside = top.path().join("outside.json");
    for uri in [
        "../outside.json".to_string(),
        format!("file://{}", outside.display()),
        outside.display().to_string(),
        "link.json".to_string(),
    ] {
        let def = json!({
            "id": "esc", "name": "esc", "version": "1",
            "functions": [{"name": "x", "operation": format!("{uri}#x")}],
            "states": [{"name": "A", "start": true,
                "enterAction": {"name": "a", "type": "invokeFunction", "functionName": "x", "waitForCompletion": true}}]
        });
        let path = dir.join("esc.json");
        std::fs::write(&path, def.to_string()).unwrap();
        for cmd in ["validate", "run"] {
            let (code, out, err) = sm4c(&[cmd, path.to_str().unwrap()], &[]);
            assert_eq!(code, 2, "{cmd} {uri}: {out}{err}");
            assert!(err.contains("/functions/0/operation"), "{cmd} {uri}: {err}");
            assert!(err.contains("REST function \"x\""), "{err}");
            assert!(
                err.contains(&format!("{uri:?} is outside the folder")),
                "{cmd} {uri}: {err}"
            );
        }
    }
    // A .proto outside the folder, and an events file, are refused the same way.
    std::fs::write(top.path().join("s.proto"), "syntax = \"proto3\";\n").unwrap();
    let def = json!({
        "id": "esc", "name": "esc", "version": "1",
        "functions": [{"name": "g", "type": "rpc", "operation": "../s.proto#a.B/C"}],
        "states": [{"name": "A", "start": true, "end": true}]
    });
    let path = dir.join("esc.json");
    std::fs::write(&path, def.to_string()).unwrap();
    let (code, _, err) = sm4c(&["validate", path.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"../s.proto\" is outside the folder"), "{err}");
    std::fs::write(top.path().join("events.json"), "[]").unwrap();
    let def = json!({"id": "esc", "name": "esc", "version": "1", "events": "../events.json",
                     "states": [{"name": "A", "start": true, "end": true}]});
    std::fs::write(&path, def.to_string()).unwrap();
    let (code, _, err) = sm4c(&["validate", path.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"../events.json\" is outside the folder"), "{err}");
}

#[test]
fn definitions_registered_over_http_may_not_name_files_outside_the_folder() {
    let top = tempfile::tempdir().unwrap();
    let defs = top.path().join("defs");
    // The folder's own files are read as definitions; the documents sit in a subfolder.
    std::fs::create_dir_all(defs.join("apis")).unwrap();
    let doc = json!({"openapi": "3.0.1", "servers": [{"url": "http://127.0.0.1:9"}],
                     "paths": {"/x": {"get": {"operationId": "x"}}}});
    std::fs::write(top.path().join("outside.json"), doc.to_string()).unwrap();
    std::fs::write(defs.join("apis/api.json"), doc.to_string()).unwrap();
    std::os::unix::fs::symlink(top.path().join("outside.json"), defs.join("apis/link.json")).unwrap();
    std::fs::write(top.path().join("s.proto"), "syntax = \"proto3\";\n").unwrap();
    let server = Serve::new()
        .db(top.path().join("s.db"))
        .arg("--definitions")
        .arg(&defs)
        .start();
    let url = server.url().to_string();
    let client = server.client().clone();
    let define = |id: &str, function: Value| -> (u16, Value) {
        let def = json!({
            "id": id, "name": id, "version": "1",
            "functions": [{"name": "keep", "operation": "apis/api.json#x"}, function],
            "states": [{"name": "A", "start": true, "end": true}]
        });
        let r = client
            .post(format!("{url}/definitions"))
            .header("content-type", "application/json")
            .body(def.to_string())
            .send()
            .unwrap();
        (r.status().as_u16(), r.json().unwrap_or(Value::Null))
    };
    let outside = top.path().join("outside.json");
    for (i, uri) in [
        "../outside.json".to_string(),
        format!("file://{}", outside.display()),
        "apis/link.json".to_string(),
    ]
    .into_iter()
    .enumerate()
    {
        let (status, body) = define(
            &format!("esc{i}"),
            json!({"name": "x", "operation": format!("{uri}#x")}),
        );
        assert_eq!(status, 400, "{uri}: {body}");
        assert_eq!(body["error"], "invalidDefinition", "{uri}: {body}");
        assert_eq!(body["details"][0]["pointer"], "/functions/1/operation", "{uri}: {body}");
        let message = body["details"][0]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("{uri:?} is outside the folder")),
            "{uri}: {body}"
        );
        let r = client.get(format!("{url}/definitions/esc{i}")).send().unwrap();
        assert_eq!(r.status().as_u16(), 404, "a refused definition is not stored: {uri}");
    }
    let (status, body) = define(
        "proto",
        json!({"name": "g", "type": "rpc", "operation": "../s.proto#a.B/C"}),
    );
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalidDefinition")),
        "{body}"
    );
    assert!(body["details"].to_string().contains("gRPC function"), "{body}");
    // Files inside the folder, and ones that do not exist yet (reported when called), are fine.
    let (status, body) = define("inside", json!({"name": "y", "operation": "file://apis/api.json#x"}));
    assert_eq!(status, 201, "{body}");
    let (status, body) = define("later", json!({"name": "z", "operation": "missing.json#x"}));
    assert_eq!(status, 201, "{body}");
}
