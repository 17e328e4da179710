//! gRPC functions against a real tonic server started in the test process, implementing
//! `tests/data/grpc/shop.proto` with hand-written prost messages (an encoding independent of the
//! host's dynamic one; the server is `tests/support/inventory.rs`, shared with `tests/kafka.rs`):
//! JSON mapping both ways, status errors and their handlers, retries with their idempotency keys,
//! deadlines, unreachable and missing targets, `.proto` problems found by `sm4c validate`, the
//! configuration file, and `sm4c serve`.

use crate::support::inventory;

use crate::support::proc;
use crate::support::server;
use inventory::{server, Seen};
use serde_json::{json, Value};
use server::{Serve, Server};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Starts the inventory server over TLS (certificate for `localhost` and `127.0.0.1` from
/// `tests/data/grpc/tls`), asking for a client certificate when `client_auth`; returns its port.
fn tls_server(seen: Seen, client_auth: bool) -> u16 {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let tls = data().join("tls");
    let read = |f: &str| std::fs::read(tls.join(f)).unwrap();
    let mut config = ServerTlsConfig::new().identity(Identity::from_pem(read("server.pem"), read("server.key")));
    if client_auth {
        config = config.client_ca_root(Certificate::from_pem(read("ca.pem")));
    }
    inventory::serve(seen, Some(config)).port()
}

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/grpc")
}

/// A folder holding `shop.proto`, for definitions made by the tests.
fn folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(data().join("shop.proto"), dir.path().join("shop.proto")).unwrap();
    dir
}

const SERVICE: &str = "shop.v1.Inventory";

fn definition(state: Value) -> Value {
    let functions: Vec<Value> = ["GetItem", "Reserve", "Slow"]
        .iter()
        .map(|m| json!({"name": m, "type": "rpc", "operation": format!("file://shop.proto#{SERVICE}/{m}")}))
        .collect();
    json!({
        "id": "grpc", "name": "grpc", "version": "1",
        "functions": functions,
        "retries": [{"name": "again", "delay": "0.1s", "maxAttempts": 2}],
        "states": [state]
    })
}

fn call(name: &str, function: &str, args: Value) -> Value {
    json!({"name": name, "type": "invokeFunction", "functionName": function, "arguments": args, "waitForCompletion": true})
}

fn sm4c(args: &[&str], env: &[(&str, &str)]) -> (i32, Value, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sm4c"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// `sm4c run` of `def`, written to `dir/def.json`.
fn run(dir: &Path, def: &Value, extra: &[&str], env: &[(&str, &str)]) -> (i32, Value, String) {
    let file = dir.join("def.json");
    std::fs::write(&file, def.to_string()).unwrap();
    let mut args = vec!["run", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    sm4c(&args, env)
}

fn target(url: &str) -> String {
    format!("{SERVICE}={url}")
}

#[test]
fn a_unary_call_maps_json_both_ways_and_its_result_drives_the_instance() {
    let seen = Seen::default();
    let url = server(seen.clone());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.json"), r#"{"sku": "sku-7"}"#).unwrap();
    let input = dir.path().join("in.json");
    let def = data().join("inventory.json");
    let (code, out, err) = sm4c(
        &[
            "run",
            def.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
            "--grpc-target",
            &target(&url),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    // The protobuf JSON mapping: lowerCamelCase names, enums by name, int64 as a string,
    // Timestamp in RFC 3339, and fields at their default value present.
    assert_eq!(
        out["item"],
        json!({"id": "sku-7", "name": "Hammer", "quantity": 3, "tags": ["tool", "steel"], "kind": "KIND_TOOL",
               "priceCents": "1299", "updated": "2023-11-14T22:13:20Z", "caller": ""})
    );
    assert_eq!(out["again"]["tags"], json!([]));
    assert_eq!(out["verdict"], "in stock");
    assert_eq!(seen.peers().len(), 1, "both calls share one connection");
}

#[test]
fn a_status_error_is_a_function_error_that_handlers_see() {
    let url = server(Seen::default());
    let dir = folder();
    let mut missing = call("m", "GetItem", json!({"id": "nope"}));
    missing["errorHandlers"] =
        json!([{"condition": "${ .details.codeName == \"NOT_FOUND\" }", "resultHandler": "${ .error = $value }"}]);
    let def = definition(json!({"name": "A", "start": true, "enterAction": missing}));
    let (code, out, err) = run(dir.path(), &def, &["--grpc-target", &target(&url)], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out["error"]["type"], "functionError");
    assert_eq!(
        out["error"]["details"],
        json!({"code": 5, "codeName": "NOT_FOUND", "message": "no item nope"})
    );
    assert_eq!(
        out["error"]["message"],
        format!("{SERVICE}/GetItem at {url} answered NOT_FOUND: no item nope")
    );
    // Unhandled: the instance fails with it.
    let def = definition(json!({"name": "A", "start": true, "enterAction": call("m", "GetItem", json!({"id": "x"}))}));
    let (code, out, err) = run(dir.path(), &def, &["--grpc-target", &target(&url)], &[]);
    assert_eq!(code, 1);
    assert_eq!(out["details"]["codeName"], "NOT_FOUND", "{out}");
    assert!(err.contains("answered NOT_FOUND: no item x"), "{err}");
    // Arguments that do not fit the request message fail before anything is sent.
    let def = definition(json!({"name": "A", "start": true, "enterAction": call("m", "GetItem", json!({"sku": "x"}))}));
    let (code, out, _) = run(dir.path(), &def, &["--grpc-target", &target(&url)], &[]);
    assert_eq!(code, 1);
    let message = out["message"].as_str().unwrap();
    assert!(
        message.contains("arguments of gRPC function GetItem do not fit message shop.v1.GetItemRequest")
            && message.contains("sku"),
        "{out}"
    );
}

#[test]
fn retries_of_unavailable_reach_the_server_with_their_idempotency_keys() {
    let seen = Seen::default();
    let url = server(seen.clone());
    let dir = folder();
    let mut reserve = call("r", "Reserve", json!({"item_id": "sku-1", "quantity": 2}));
    reserve["errorHandlers"] =
        json!([{"condition": "${ .details.codeName == \"UNAVAILABLE\" }", "retryPolicy": "again"}]);
    let def = definition(
        json!({"name": "A", "start": true, "enterAction": reserve, "enterResultHandler": "${ .r = $value }"}),
    );
    let (code, out, err) = run(dir.path(), &def, &["--grpc-target", &target(&url)], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out["r"], json!({"idempotencyKey": "grpc-run/1.enter#2", "attempt": 2}));
    assert_eq!(seen.keys(), vec!["grpc-run/1.enter", "grpc-run/1.enter#2"]);
}

#[test]
fn deadlines_are_function_errors_and_action_timeouts_give_null() {
    let url = server(Seen::default());
    let dir = folder();
    let config = dir.path().join("sm4c.toml");
    std::fs::write(
        &config,
        format!("[grpc.\"{SERVICE}\"]\ntarget = \"{url}\"\ndeadline = \"300ms\"\n"),
    )
    .unwrap();
    let mut slow = call("s", "Slow", json!({"millis": 5000}));
    slow["errorHandlers"] =
        json!([{"condition": "${ .details.kind == \"timeout\" }", "resultHandler": "${ .error = $value }"}]);
    let def = definition(json!({"name": "A", "start": true, "enterAction": slow}));
    let started = Instant::now();
    let (code, out, err) = run(dir.path(), &def, &["--config", config.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the deadline cut the call short"
    );
    assert_eq!(out["error"]["details"]["code"], 4, "{out}");
    assert_eq!(out["error"]["details"]["codeName"], "DEADLINE_EXCEEDED");
    assert_eq!(
        out["error"]["message"],
        format!("{SERVICE}/Slow at {url} failed: deadline of 300 ms exceeded")
    );
    // The action's own timeout, shorter than the deadline (30 s by default), gives null.
    let mut slow = call("s", "Slow", json!({"millis": 3000}));
    slow["timeout"] = json!("0.3s");
    let def =
        definition(json!({"name": "A", "start": true, "enterAction": slow, "enterResultHandler": "${ .r = $value }"}));
    let (code, out, err) = run(dir.path(), &def, &["--grpc-target", &target(&url)], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, json!({"r": null}));
}

#[test]
fn an_unreachable_target_is_a_function_error_and_a_missing_one_names_the_flag() {
    let dir = folder();
    // Port 1 (tcpmux): nothing listens there on a test machine, and no test binds it.
    let port = 1;
    let def =
        definition(json!({"name": "A", "start": true, "enterAction": call("i", "GetItem", json!({"id": "sku-1"}))}));
    let (code, out, _) = run(
        dir.path(),
        &def,
        &["--grpc-target", &target(&format!("http://127.0.0.1:{port}"))],
        &[],
    );
    assert_eq!(code, 1);
    assert_eq!(out["type"], "functionError");
    assert_eq!(out["details"]["kind"], "connection", "{out}");
    assert_eq!(out["details"]["codeName"], "UNAVAILABLE", "{out}");

    let (code, out, err) = run(dir.path(), &def, &[], &[]);
    assert_eq!(code, 1);
    assert_eq!(out["type"], "functionError");
    assert!(
        err.contains(&format!(
            "gRPC function GetItem calls service {SERVICE}, which has no target: give one with --grpc-target {SERVICE}=http://HOST:PORT"
        )),
        "{err}"
    );
    // A mock answers first, with no target at all.
    std::fs::write(dir.path().join("mocks.json"), r#"{"GetItem": "{name: (.id + \"!\")}"}"#).unwrap();
    let def = definition(
        json!({"name": "A", "start": true, "enterAction": call("i", "GetItem", json!({"id": "sku-1"})),
        "enterResultHandler": "${ .r = $value }"}),
    );
    let mocks = dir.path().join("mocks.json");
    let (code, out, err) = run(dir.path(), &def, &["--mock", mocks.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out["r"], json!({"name": "sku-1!"}));
}

#[test]
fn validate_reports_proto_problems_naming_the_function() {
    let dir = folder();
    std::fs::write(
        dir.path().join("broken.proto"),
        "syntax = \"proto3\";\npackage b;\nmessage M {\n  string id = 1\n}\n",
    )
    .unwrap();
    let functions = json!([
        {"name": "unknownMethod", "type": "rpc", "operation": format!("file://shop.proto#{SERVICE}/Delete")},
        {"name": "unknownService", "type": "rpc", "operation": "shop.proto#shop.v1.Billing/Pay"},
        {"name": "streaming", "type": "rpc", "operation": format!("file://shop.proto#{SERVICE}/Watch")},
        {"name": "broken", "type": "rpc", "operation": "file://broken.proto#b.S/M"},
        {"name": "absent", "type": "rpc", "operation": "file://absent.proto#a.S/M"},
        {"name": "malformed", "type": "rpc", "operation": "file://shop.proto#GetItem"},
        {"name": "fine", "type": "rpc", "operation": format!("shop.proto#{SERVICE}/GetItem")}
    ]);
    let def = json!({"id": "v", "name": "v", "version": "1", "functions": functions,
        "states": [{"name": "A", "start": true}]});
    let file = dir.path().join("def.json");
    std::fs::write(&file, def.to_string()).unwrap();
    let (code, _, err) = sm4c(&["validate", file.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{err}");
    let lines: Vec<&str> = err.lines().collect();
    let f = file.display();
    let d = dir.path().display();
    assert_eq!(
        lines,
        vec![
            format!("{f}: /functions/0/operation: gRPC function \"unknownMethod\": service {SERVICE} in file://shop.proto has no method Delete (it has: GetItem, Reserve, Slow, Watch)"),
            format!("{f}: /functions/1/operation: gRPC function \"unknownService\": shop.proto has no service shop.v1.Billing (it has: {SERVICE})"),
            format!("{f}: /functions/2/operation: gRPC function \"streaming\": method {SERVICE}/Watch streams; only unary methods can be called"),
            format!("{f}: /functions/3/operation: gRPC function \"broken\": cannot compile {d}/broken.proto: line 5 column 1: expected ';' or '[', but found '}}'"),
            format!("{f}: /functions/4/operation: gRPC function \"absent\": cannot read {d}/absent.proto: No such file or directory (os error 2)"),
            format!("{f}: /functions/5/operation: gRPC function \"malformed\": operation \"file://shop.proto#GetItem\" must be <.proto URI>#<package.Service>/<Method>"),
        ],
        "{err}"
    );
    // `sm4c run` and `sm4c serve` refuse the definition the same way, before anything runs.
    let (code, _, err) = sm4c(&["run", file.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("has no method Delete"), "{err}");
    let db = dir.path().join("s.db");
    let (code, _, err) = sm4c(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--definitions",
            dir.path().to_str().unwrap(),
            "--db",
            db.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 2);
    assert!(err.contains("has no method Delete"), "{err}");
}

/// A REST API that wants `x-api-key: k-rest` (the REST half of the configuration file test).
fn rest_api() -> String {
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::get;
    use axum::Json;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let app = axum::Router::new().route(
                "/price",
                get(|h: HeaderMap| async move {
                    match h.get("x-api-key").and_then(|v| v.to_str().ok()) {
                        Some("k-rest") => (StatusCode::OK, Json(json!({"eur": 12.99}))),
                        _ => (StatusCode::UNAUTHORIZED, Json(json!({"reason": "no key"}))),
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

#[test]
fn the_config_file_sets_rest_server_and_header_and_grpc_target_and_metadata() {
    let url = server(Seen::default());
    let rest = rest_api();
    let dir = folder();
    // The document names a server where nothing listens; the configuration file corrects it.
    let openapi = json!({"openapi": "3.0.1", "servers": [{"url": "http://127.0.0.1:9"}],
        "paths": {"/price": {"get": {"operationId": "price"}}}});
    std::fs::write(dir.path().join("api.json"), openapi.to_string()).unwrap();
    let mut def = definition(json!({"name": "A", "start": true,
        "enterAction": {"type": "sequence", "actions": [
            call("item", "GetItem", json!({"id": "sku-2"})), call("price", "price", json!({}))]},
        "enterResultHandler": "${ .caller = $value.item.caller | .price = $value.price }"}));
    def["functions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "price", "operation": "file://api.json#price"}));
    let config = dir.path().join("sm4c.toml");
    std::fs::write(
        &config,
        format!(
            "# where calls go\n[rest.\"file://api.json\"]\nserver = \"{rest}\"\nheaders = {{ x-api-key = \"env:SM4C_TEST_REST_KEY\" }}\n\n\
             [grpc.\"{SERVICE}\"]\ntarget = \"{url}\"\nmetadata = {{ authorization = \"env:SM4C_TEST_GRPC_TOKEN\" }}\n"
        ),
    )
    .unwrap();
    let secrets = [
        ("SM4C_TEST_REST_KEY", "k-rest"),
        ("SM4C_TEST_GRPC_TOKEN", "Bearer s3cret"),
    ];
    let (code, out, err) = run(
        dir.path(),
        &def,
        &["--config", config.to_str().unwrap(), "-v"],
        &secrets,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, json!({"caller": "authenticated", "price": {"eur": 12.99}}));
    assert!(!err.contains("k-rest") && !err.contains("s3cret"), "{err}");

    // --grpc-target wins over the file's target: pointed where nothing listens, the call fails.
    let (code, out, _) = run(
        dir.path(),
        &def,
        &[
            "--config",
            config.to_str().unwrap(),
            "--grpc-target",
            &target("http://127.0.0.1:9"),
        ],
        &secrets,
    );
    assert_eq!(code, 1);
    assert_eq!(out["details"]["kind"], "connection", "{out}");

    // A wrong token is the server's UNAUTHENTICATED, and is not quoted anywhere.
    let (code, out, err) = run(
        dir.path(),
        &def,
        &["--config", config.to_str().unwrap()],
        &[
            ("SM4C_TEST_REST_KEY", "k-rest"),
            ("SM4C_TEST_GRPC_TOKEN", "Bearer wrong-s3cret"),
        ],
    );
    assert_eq!(code, 1);
    assert_eq!(out["details"]["codeName"], "UNAUTHENTICATED", "{out}");
    assert!(!err.contains("wrong-s3cret") && !out.to_string().contains("wrong-s3cret"));

    // Errors in the file name it, the line and the key; an unset variable is named, not guessed.
    let (code, _, err) = run(dir.path(), &def, &["--config", config.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    let c = config.display();
    assert_eq!(
        err.lines().collect::<Vec<_>>(),
        vec![
            format!("{c}: line 4: rest.\"file://api.json\".headers.x-api-key: environment variable SM4C_TEST_REST_KEY is not set"),
            format!("{c}: line 8: grpc.\"{SERVICE}\".metadata.authorization: environment variable SM4C_TEST_GRPC_TOKEN is not set"),
        ]
    );
    std::fs::write(
        &config,
        "[grpc.\"a.B\"]\ntarget = \"http://x:1\"\ntarget_url = \"s3cret\"\n",
    )
    .unwrap();
    let (code, _, err) = run(dir.path(), &def, &["--config", config.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with(&format!("{c}: line 3: unknown field `target_url`")),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
}

#[test]
fn grpc_functions_work_through_sm4c_serve() {
    let seen = Seen::default();
    let url = server(seen.clone());
    let dir = tempfile::tempdir().unwrap();
    // tests/data/grpc holds one definition and its .proto (not read as a definition).
    let server = Serve::new()
        .db(dir.path().join("s.db"))
        .arg("--definitions")
        .arg(data())
        .args(["--grpc-target", &target(&url)])
        .start();
    let base = server.url().to_string();
    let client = reqwest::blocking::Client::new();
    for (id, sku) in [("g1", "sku-1"), ("g2", "sku-2")] {
        let r = client
            .post(format!("{base}/instances"))
            .json(&json!({"definition": "inventory", "id": id, "input": {"sku": sku}}))
            .send()
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    for (id, sku) in [("g1", "sku-1"), ("g2", "sku-2")] {
        let mut v = Value::Null;
        for _ in 0..100 {
            v = client
                .get(format!("{base}/instances/{id}"))
                .send()
                .unwrap()
                .json()
                .unwrap();
            if v["status"] == "completed" {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(v["status"], "completed", "{v}");
        assert_eq!(v["data"]["item"]["id"], sku);
        assert_eq!(v["data"]["item"]["tags"], json!(["tool", "steel"]));
        assert_eq!(v["data"]["verdict"], "in stock");
    }
    assert_eq!(seen.peers().len(), 1, "every call of the server shares one connection");
}

#[test]
fn tls_targets_trust_the_configured_ca_and_present_a_client_certificate() {
    let dir = folder();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    for f in ["ca.pem", "client.pem", "client.key"] {
        std::fs::copy(data().join("tls").join(f), certs.join(f)).unwrap();
    }
    let def = definition(json!({"name": "A", "start": true,
        "enterAction": call("item", "GetItem", json!({"id": "sku-1"})),
        "enterResultHandler": "${ .name = $value.name }"}));
    let config = dir.path().join("sm4c.toml");
    let with_config = |toml: String| {
        std::fs::write(&config, toml).unwrap();
        run(dir.path(), &def, &["--config", config.to_str().unwrap()], &[])
    };

    // A server whose certificate no webpki root vouches for is a connection error...
    let port = tls_server(Seen::default(), false);
    let url = format!("https://localhost:{port}");
    let (code, out, err) = run(dir.path(), &def, &["--grpc-target", &target(&url)], &[]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(out["details"]["kind"], "connection", "{out}");
    assert!(out["message"].as_str().unwrap().contains("certificate"), "{out}");
    // ...and trusted once the configuration names its CA.
    let (code, out, err) = with_config(format!(
        "[grpc.\"{SERVICE}\"]\ntarget = \"{url}\"\nca = \"certs/ca.pem\"\n"
    ));
    assert_eq!((code, &out), (0, &json!({"name": "Hammer"})), "{err}");

    // Mutual TLS, by IP address: without a client certificate the handshake fails; with one it works.
    let seen = Seen::default();
    let port = tls_server(seen.clone(), true);
    let url = format!("https://127.0.0.1:{port}");
    let (code, out, err) = with_config(format!(
        "[grpc.\"{SERVICE}\"]\ntarget = \"{url}\"\nca = \"certs/ca.pem\"\n"
    ));
    assert_eq!(code, 1, "{err}");
    assert_eq!(out["details"]["kind"], "connection", "{out}");
    let (code, out, err) = with_config(format!(
        "[grpc.\"{SERVICE}\"]\ntarget = \"{url}\"\nca = \"certs/ca.pem\"\ncert = \"certs/client.pem\"\nkey = \"certs/client.key\"\n"
    ));
    assert_eq!((code, &out), (0, &json!({"name": "Hammer"})), "{err}");
    assert_eq!(seen.peers().len(), 1);

    // Mistakes are named with their line and key; the key file's content is never shown.
    let (code, _, err) = with_config(format!(
        "[grpc.\"{SERVICE}\"]\ntarget = \"{url}\"\ncert = \"certs/client.pem\"\n"
    ));
    assert_eq!(code, 2);
    let c = config.display();
    assert_eq!(
        err.trim(),
        format!("{c}: line 3: grpc.\"{SERVICE}\": mutual TLS needs both cert and key"),
        "{err}"
    );
    let (code, _, err) = with_config(format!(
        "[grpc.\"{SERVICE}\"]\ntarget = \"http://127.0.0.1:1\"\nca = \"certs/none.pem\"\nkey = \"certs/ca.pem\"\ncert = \"certs/client.key\"\n"
    ));
    assert_eq!(code, 2);
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines[0].starts_with(&format!(
            "{c}: line 3: grpc.\"{SERVICE}\".ca: cannot read CA certificates "
        )),
        "{err}"
    );
    assert!(
        lines.iter().any(|l| l.contains("the target must be https://HOST:PORT")),
        "{err}"
    );
    assert!(!err.contains("PRIVATE KEY"), "{err}");
}

/// Serves `.proto` files over HTTP: `/protos/shop.proto`, and `/protos/entry.proto`, which imports it.
fn proto_server() -> String {
    use axum::routing::get;
    let shop = std::fs::read_to_string(data().join("shop.proto")).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let app = axum::Router::new()
                .route("/protos/shop.proto", get(move || async move { shop }))
                .route(
                    "/protos/entry.proto",
                    get(|| async { "syntax = \"proto3\";\npackage entry;\nimport \"shop.proto\";\n" }),
                );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

#[test]
fn a_proto_over_http_is_fetched_with_its_imports_when_the_definition_loads() {
    let url = server(Seen::default());
    let protos = proto_server();
    let dir = tempfile::tempdir().unwrap();
    let def = json!({"id": "remote", "name": "remote", "version": "1",
        "functions": [{"name": "GetItem", "type": "rpc",
                       "operation": format!("{protos}/protos/entry.proto#{SERVICE}/GetItem")}],
        "states": [{"name": "A", "start": true,
            "enterAction": call("item", "GetItem", json!({"id": "sku-3"})),
            "enterResultHandler": "${ .quantity = $value.quantity }"}]});
    let (code, out, err) = run(dir.path(), &def, &["--grpc-target", &target(&url)], &[]);
    assert_eq!((code, &out), (0, &json!({"quantity": 3})), "{err}");

    // A missing document, and one whose import is missing, are load errors naming the function.
    let functions = json!([
        {"name": "missing", "type": "rpc", "operation": format!("{protos}/protos/none.proto#a.S/M")},
        {"name": "fine", "type": "rpc", "operation": format!("{protos}/protos/shop.proto#{SERVICE}/GetItem")},
        {"name": "unreachable", "type": "rpc", "operation": format!("http://127.0.0.1:9/x.proto#{SERVICE}/GetItem")}
    ]);
    let bad = json!({"id": "v", "name": "v", "version": "1", "functions": functions,
        "states": [{"name": "A", "start": true}]});
    let file = dir.path().join("bad.json");
    std::fs::write(&file, bad.to_string()).unwrap();
    let (code, _, err) = sm4c(&["validate", file.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{err}");
    let f = file.display();
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert_eq!(
        lines[0],
        format!("{f}: /functions/0/operation: gRPC function \"missing\": cannot fetch {protos}/protos/none.proto: the server answered 404 Not Found")
    );
    assert!(
        lines[1].starts_with(&format!("{f}: /functions/2/operation: gRPC function \"unreachable\": cannot compile http://127.0.0.1:9/x.proto: cannot fetch http://127.0.0.1:9/x.proto: ")),
        "{err}"
    );
}

/// What the hung service of [`a_hung_service_gets_at_most_its_bound_and_does_not_stall_another`]
/// saw: calls in flight at the server (from the handler's start until the caller reset the
/// stream), the most at once, and how many arrived.
#[derive(Default)]
struct Hung {
    in_flight: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
    arrived: std::sync::atomic::AtomicUsize,
}

/// A call in flight at the hung service; it ends when dropped.
struct InFlight(std::sync::Arc<Hung>);

impl InFlight {
    fn start(hung: &std::sync::Arc<Hung>) -> InFlight {
        use std::sync::atomic::Ordering::SeqCst;
        hung.arrived.fetch_add(1, SeqCst);
        let now = hung.in_flight.fetch_add(1, SeqCst) + 1;
        hung.max.fetch_max(now, SeqCst);
        InFlight(hung.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The server of the bound test, on one port: `shop.v1.Inventory` (`HEALTHY` false) hangs, and
/// `stock.v1.Inventory` (`HEALTHY` true) is the inventory under another package name.
#[derive(Clone)]
struct Front<const HEALTHY: bool> {
    hung: std::sync::Arc<Hung>,
    inventory: inventory::Inventory,
}

impl tonic::server::NamedService for Front<false> {
    const NAME: &'static str = "shop.v1.Inventory";
}

impl tonic::server::NamedService for Front<true> {
    const NAME: &'static str = "stock.v1.Inventory";
}

impl<const HEALTHY: bool> tower::Service<http::Request<tonic::body::Body>> for Front<HEALTHY> {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self::Response, std::convert::Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        use tonic::codegen::tokio_stream::{self, StreamExt};
        if HEALTHY {
            let (mut parts, body) = req.into_parts();
            parts.uri = parts
                .uri
                .path()
                .replacen("/stock.v1.Inventory/", "/shop.v1.Inventory/", 1)
                .parse()
                .unwrap();
            let fut = self.inventory.call(http::Request::from_parts(parts, body));
            return Box::pin(fut);
        }
        // Hangs the way that defeats the server's own deadline (tonic's applies until the
        // response's headers): headers at once, then nothing, until the caller resets the stream,
        // which drops the body and with it the call's place in `in_flight`.
        let call = InFlight::start(&self.hung);
        Box::pin(async move {
            let silence =
                tokio_stream::pending::<Result<tonic::codegen::Bytes, std::convert::Infallible>>().map(move |frame| {
                    let _call = &call;
                    frame
                });
            Ok(http::Response::builder()
                .header("content-type", "application/grpc")
                .body(tonic::body::Body::new(axum::body::Body::from_stream(silence)))
                .unwrap())
        })
    }
}

/// Starts the bound test's server; returns its URL. It allows 16 streams at once per connection,
/// as servers and proxies limit them: without a bound, calls to the hung service would take them
/// all, and calls to the healthy one, which share the connection, would wait for them.
fn hung_and_healthy_server(hung: std::sync::Arc<Hung>) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let inventory = inventory::Inventory(Seen::default());
            tonic::transport::Server::builder()
                .max_concurrent_streams(16)
                .add_service(Front::<false> {
                    hung: hung.clone(),
                    inventory: inventory.clone(),
                })
                .add_service(Front::<true> { hung, inventory })
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await
                .unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

/// `sm4c serve`, killed when dropped.
struct Serving {
    server: Server,
}

impl Serving {
    fn start(definitions: &Path, config: &Path, db: &Path) -> Serving {
        let server = Serve::new()
            .db(db)
            .arg("--definitions")
            .arg(definitions)
            .arg("--config")
            .arg(config)
            .start();
        Serving { server }
    }

    fn start_instance(&self, definition: &str, id: &str) {
        let r = self
            .server
            .client()
            .post(format!("{}/instances", self.server.url()))
            .json(&json!({"definition": definition, "id": id, "input": {"sku": format!("sku-{id}")}}))
            .send()
            .unwrap();
        assert_eq!(r.status(), 201, "start {id}");
    }

    fn instance(&self, id: &str) -> Value {
        self.server
            .client()
            .get(format!("{}/instances/{id}", self.server.url()))
            .send()
            .unwrap()
            .json()
            .unwrap()
    }

    /// The server's resident set (kB), from /proc.
    fn rss_kb(&self) -> u64 {
        proc::rss_kb(self.server.pid())
    }

    fn ended(v: &Value) -> bool {
        v["status"] == "completed" || v["status"] == "failed"
    }

    /// Waits until every instance has ended; returns them.
    fn wait_ended(&self, ids: &[String], within: Duration) -> Vec<Value> {
        let started = Instant::now();
        ids.iter()
            .map(|id| loop {
                let v = self.instance(id);
                if Serving::ended(&v) {
                    break v;
                }
                assert!(started.elapsed() < within, "{id} has not ended after {within:?}: {v}");
                std::thread::sleep(Duration::from_millis(20));
            })
            .collect()
    }
}

/// The bound tests' definitions (`hung` calls the hung service, `healthy` the healthy one, both
/// on the server at `url`) and configuration (the hung service bounded to `bound` calls, with
/// `deadline`); returns the definitions' folder and the configuration file.
fn bound_definitions(dir: &Path, url: &str, bound: usize, deadline: Duration) -> (PathBuf, PathBuf) {
    let defs = dir.join("defs");
    std::fs::create_dir(&defs).unwrap();
    let shop = std::fs::read_to_string(data().join("shop.proto")).unwrap();
    std::fs::write(defs.join("shop.proto"), &shop).unwrap();
    std::fs::write(
        defs.join("stock.proto"),
        shop.replace("package shop.v1;", "package stock.v1;"),
    )
    .unwrap();
    for (id, proto, service) in [
        ("hung", "shop.proto", SERVICE),
        ("healthy", "stock.proto", "stock.v1.Inventory"),
    ] {
        let def = json!({"id": id, "name": id, "version": "1",
            "functions": [{"name": "GetItem", "type": "rpc", "operation": format!("file://{proto}#{service}/GetItem")}],
            "states": [{"name": "A", "start": true, "enterAction": call("item", "GetItem", json!({"id": "${ .sku }"})),
                "enterResultHandler": "${ .item = $value }"}]});
        std::fs::write(defs.join(format!("{id}.json")), def.to_string()).unwrap();
    }
    let config = dir.join("sm4c.toml");
    std::fs::write(
        &config,
        format!(
            "[grpc.\"{SERVICE}\"]\ntarget = \"{url}\"\ndeadline = \"{}ms\"\nconcurrency = {bound}\n\n\
             [grpc.\"stock.v1.Inventory\"]\ntarget = \"{url}\"\n",
            deadline.as_millis()
        ),
    )
    .unwrap();
    (defs, config)
}

#[test]
fn a_hung_service_gets_at_most_its_bound_and_does_not_stall_another() {
    use std::sync::atomic::Ordering::SeqCst;
    const BOUND: usize = 2;
    const DEADLINE: Duration = Duration::from_secs(4);
    let hung = std::sync::Arc::new(Hung::default());
    let url = hung_and_healthy_server(hung.clone());
    let dir = tempfile::tempdir().unwrap();
    let (defs, config) = bound_definitions(dir.path(), &url, BOUND, DEADLINE);
    let s = Serving::start(&defs, &config, &dir.path().join("s.db"));
    let ids = |prefix: &str, n: usize| -> Vec<String> { (0..n).map(|i| format!("{prefix}-{i:02}")).collect() };

    // A burst of calls to the hung service; then, while they hang or wait, calls to the healthy
    // one, which shares the hung one's target and connection.
    let first = Instant::now();
    // More than the server's streams: without the bound, they would take them all.
    let wave1 = ids("hung1", 20);
    for id in &wave1 {
        s.start_instance("hung", id);
    }
    let healthy = ids("healthy", 10);
    for id in &healthy {
        s.start_instance("healthy", id);
    }
    for v in s.wait_ended(&healthy, Duration::from_secs(60)) {
        assert_eq!(v["status"], "completed", "{v}");
        assert_eq!(v["data"]["item"]["name"], "Hammer", "{v}");
    }
    let healthy_took = first.elapsed();
    // None of the hung calls, in flight or waiting for a turn, fails before its deadline.
    let still: Vec<Value> = wave1.iter().map(|id| s.instance(id)).collect();
    if first.elapsed() < DEADLINE {
        for v in &still {
            assert!(!Serving::ended(v), "ended before its deadline: {v}");
        }
    }
    assert!(
        healthy_took < DEADLINE,
        "the healthy service's calls took {healthy_took:?}, waiting for the hung service's (deadline {DEADLINE:?})"
    );

    // A second wave, waiting when the first wave's calls time out: the turns they give back go to it.
    std::thread::sleep((first + DEADLINE / 2).saturating_duration_since(Instant::now()));
    let wave2 = ids("hung2", 12);
    for id in &wave2 {
        s.start_instance("hung", id);
    }
    let (mut no_turn, mut no_answer) = (0, 0);
    for v in s.wait_ended(&[wave1, wave2].concat(), DEADLINE * 4 + Duration::from_secs(30)) {
        assert_eq!(v["status"], "failed", "{v}");
        let e = &v["error"];
        assert_eq!(e["type"], "functionError", "{v}");
        assert_eq!(e["details"]["kind"], "timeout", "{v}");
        assert_eq!(e["details"]["codeName"], "DEADLINE_EXCEEDED", "{v}");
        let message = e["message"].as_str().unwrap();
        let at = format!("{SERVICE}/GetItem at {url} failed: ");
        if message
            == format!(
                "{at}no turn within the deadline of {} ms: at most {BOUND} calls to service {SERVICE} run at once, \
                 and they are all in flight",
                DEADLINE.as_millis()
            )
        {
            assert_eq!(e["details"]["concurrency"], BOUND, "{v}");
            no_turn += 1;
        } else {
            assert_eq!(
                message,
                format!("{at}deadline of {} ms exceeded", DEADLINE.as_millis()),
                "{v}"
            );
            no_answer += 1;
        }
    }
    let max = hung.max.load(SeqCst);
    let arrived = hung.arrived.load(SeqCst);
    eprintln!(
        "healthy calls done {healthy_took:?} after the hung burst began; hung service: {arrived} calls arrived, \
         at most {max} at once (bound {BOUND}); {no_answer} timed out in flight, {no_turn} without a turn"
    );
    assert!(
        max <= BOUND,
        "the hung service saw {max} calls at once; the bound is {BOUND}"
    );
    assert_eq!(max, BOUND, "the bound was reached");
    // Every call that reached the service timed out there (one that got its turn too late may time
    // out before it reaches it).
    assert!(
        no_answer >= arrived && arrived >= BOUND,
        "{no_answer} timed out in flight, {arrived} arrived"
    );
    assert!(
        no_answer >= 2 * BOUND,
        "the second wave got the first wave's turns: {no_answer}"
    );
    assert!(no_turn >= 12, "most calls got no turn: {no_turn}");
    // Every call the service saw was reset by its caller: none is left in flight.
    let quiet = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        hung.in_flight.load(SeqCst) == 0
    });
    assert!(
        quiet,
        "{} calls still in flight at the hung service",
        hung.in_flight.load(SeqCst)
    );
}

/// The REST campaign's memory check (tests/it/downstreams.rs), for gRPC: bursts of calls to a hung
/// service, far more than its bound, each waiting for a turn or its deadline, do not grow the
/// server's memory beyond a generous bound, and the healthy service on the same connection answers
/// meanwhile. `cargo test` runs two bursts of 500; `SM4C_DOWNSTREAMS_FULL=1` two of 5,000.
#[test]
fn a_large_burst_of_hung_grpc_calls_leaves_memory_bounded() {
    use std::sync::atomic::Ordering::SeqCst;
    const BOUND: usize = 4;
    const DEADLINE: Duration = Duration::from_millis(1500);
    const RSS_GROWTH_MB: u64 = 100;
    let full = std::env::var("SM4C_DOWNSTREAMS_FULL").is_ok_and(|v| !v.is_empty() && v != "0");
    let burst = if full { 5000 } else { 500 };
    let hung = std::sync::Arc::new(Hung::default());
    let url = hung_and_healthy_server(hung.clone());
    let dir = tempfile::tempdir().unwrap();
    let (defs, config) = bound_definitions(dir.path(), &url, BOUND, DEADLINE);
    let s = Serving::start(&defs, &config, &dir.path().join("s.db"));
    let ids = |prefix: &str, n: usize| -> Vec<String> { (0..n).map(|i| format!("{prefix}-{i:05}")).collect() };
    let start = |definition: &str, ids: &[String]| {
        for id in ids {
            s.start_instance(definition, id);
        }
    };
    // Warm up both paths, so that the first reading is not of an idle process.
    let (warm_hung, warm_healthy) = (ids("warm-hung", BOUND), ids("warm-healthy", 20));
    start("hung", &warm_hung);
    start("healthy", &warm_healthy);
    s.wait_ended(&[warm_hung, warm_healthy].concat(), Duration::from_secs(60));
    let rss_before = s.rss_kb();

    let mut healthy_took = Vec::new();
    let mut peak = rss_before;
    for round in 0..2 {
        let (b, g) = (
            ids(&format!("hung{round}"), burst),
            ids(&format!("healthy{round}"), 100),
        );
        start("hung", &b);
        let began = Instant::now();
        start("healthy", &g);
        peak = peak.max(s.rss_kb());
        for v in s.wait_ended(&g, Duration::from_secs(60)) {
            assert_eq!(v["status"], "completed", "{v}");
            assert_eq!(v["data"]["item"]["name"], "Hammer", "{v}");
        }
        healthy_took.push(began.elapsed());
        peak = peak.max(s.rss_kb());
        for v in s.wait_ended(&b, Duration::from_secs(120) + DEADLINE * (burst as u32 / 50)) {
            assert_eq!(v["status"], "failed", "{v}");
            assert_eq!(v["error"]["type"], "functionError", "{v}");
            assert_eq!(v["error"]["details"]["kind"], "timeout", "{v}");
        }
    }
    let rss_after = s.rss_kb();
    let max = hung.max.load(SeqCst);
    eprintln!(
        "two bursts of {burst} hung calls (bound {BOUND}, deadline {DEADLINE:?}): healthy calls started after each burst done in {healthy_took:?}; \
         at most {max} hung calls at once; VmRSS {rss_before} kB before, at most {peak} kB during, {rss_after} kB after"
    );
    assert!(
        max <= BOUND,
        "the hung service saw {max} calls at once; the bound is {BOUND}"
    );
    assert!(
        rss_after <= rss_before + RSS_GROWTH_MB * 1024,
        "VmRSS grew from {rss_before} kB to {rss_after} kB over the bursts"
    );
    assert!(
        peak <= rss_before + RSS_GROWTH_MB * 1024,
        "VmRSS reached {peak} kB during the bursts, from {rss_before} kB"
    );
}

#[test]
fn a_response_over_the_cap_fails_the_call_naming_it() {
    let url = server(Seen::default());
    let dir = folder();
    let mut get = call("get", "GetItem", json!({"id": "sku-1", "withTags": true}));
    get["errorHandlers"] = json!([{"condition": "${ true }", "resultHandler": "${ .error = $value }"}]);
    let def = definition(json!({"name": "A", "start": true, "enterAction": get,
                                "enterResultHandler": "${ .item = $value }"}));
    // The Item answered is some 60 bytes: a cap of 16 bytes refuses it.
    std::fs::write(
        dir.path().join("sm4c.toml"),
        format!("[grpc.\"{SERVICE}\"]\ntarget = \"{url}\"\n[calls]\nmax_response = 16\n"),
    )
    .unwrap();
    let config = dir.path().join("sm4c.toml");
    let (code, out, err) = run(dir.path(), &def, &["--config", config.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out["error"]["details"]["kind"], "tooLarge", "{out}");
    assert_eq!(out["error"]["details"]["maxResponse"], 16, "{out}");
    assert!(
        out.to_string()
            .contains("larger than the cap of 16 bytes ([calls] max_response"),
        "{out}"
    );
    // The default cap lets it through.
    std::fs::write(&config, format!("[grpc.\"{SERVICE}\"]\ntarget = \"{url}\"\n")).unwrap();
    let (code, out, err) = run(dir.path(), &def, &["--config", config.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out["item"]["name"], "Hammer", "{out}");
}
