//! ASL Tasks calling real things: Resources bound by the configuration file to a REST operation
//! (a real axum server), a gRPC method (the real tonic inventory server) or a worker task list
//! (a real `sm4c serve`, answered through the task API and the AWS-shaped SendTask* endpoints),
//! and the HTTP Task (`arn:aws:states:::http:invoke`) against a real axum server.

use crate::support::inventory;

use axum::extract::{Path as UrlPath, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::server;
use server::{Serve, Server, BIN};
const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/asl_tasks");
const CHARGE: &str = "arn:aws:lambda:us-east-1:123456789012:function:charge";

/// The test API on a free port, in a background thread; returns its base URL.
fn api() -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let app = Router::new()
                .route(
                    "/charges",
                    post(|h: HeaderMap, Json(body): Json<Value>| async move {
                        if body["amount"].as_i64().unwrap_or(0) > 1000 {
                            return (StatusCode::PAYMENT_REQUIRED, Json(json!({"reason": "limit"})));
                        }
                        let key = h.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string);
                        (StatusCode::CREATED, Json(json!({"charged": body, "idempotencyKey": key})))
                    }),
                )
                .route(
                    "/items/{id}",
                    get(|UrlPath(id): UrlPath<String>, Query(q): Query<HashMap<String, String>>, h: HeaderMap| async move {
                        let header = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
                        if header("authorization").as_deref() != Some("Bearer conn-s3cret") {
                            return (StatusCode::UNAUTHORIZED, Json(json!({"reason": "who are you"})));
                        }
                        (StatusCode::OK, Json(json!({"id": id, "q": q, "tenant": header("x-tenant")})))
                    }),
                )
                .route(
                    "/echo",
                    post(|h: HeaderMap, body: String| async move {
                        let ct = h.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                        ([("x-seen", "yes")], format!("{ct}|{body}"))
                    }),
                );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

/// `sm4c ARGS`: (exit code, stdout, stderr).
fn sm4c(args: &[&str]) -> (i32, String, String) {
    sm4c_env(args, &[])
}

/// [`sm4c`] with `env` added to its environment.
fn sm4c_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).envs(env.iter().copied()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes `definition` as `NAME.asl.json`, the OpenAPI document and `config` into `dir`.
fn setup(dir: &Path, name: &str, definition: &Value, config: &str) -> (String, String) {
    std::fs::copy(format!("{DATA}/payments.json"), dir.join("payments.json")).unwrap();
    let def = dir.join(format!("{name}.asl.json"));
    std::fs::write(&def, serde_json::to_string_pretty(definition).unwrap()).unwrap();
    let cfg = dir.join("sm4c.toml");
    std::fs::write(&cfg, config).unwrap();
    (def.display().to_string(), cfg.display().to_string())
}

/// Charge (`CHARGE`), catching any error into `.failed`.
fn charge_definition() -> Value {
    json!({
        "StartAt": "Charge",
        "States": {
            "Charge": {
                "Type": "Task", "Resource": CHARGE,
                "Parameters": {"amount.$": "$.amount", "currency": "EUR"},
                "ResultPath": "$.charge",
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.failed", "Next": "Failed"}],
                "End": true
            },
            "Failed": {"Type": "Pass", "End": true}
        }
    })
}

#[test]
fn a_resource_bound_to_a_rest_operation_calls_it_with_the_effective_input() {
    let url = api();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[rest.\"payments.json\"]\nserver = \"{url}\"\n\n[asl.resources.\"{CHARGE}\"]\nrest = \"payments.json#chargeCard\"\n"
    );
    let (def, cfg) = setup(dir.path(), "charge", &charge_definition(), &config);
    let (code, out, err) = sm4c(&[
        "run",
        &def,
        "--config",
        &cfg,
        "--input",
        &write_input(dir.path(), json!({"amount": 12})),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        out["charge"]["charged"],
        json!({"amount": 12, "currency": "EUR"}),
        "{out}"
    );
    assert!(
        out["charge"]["idempotencyKey"]
            .as_str()
            .unwrap()
            .starts_with("charge-run/"),
        "{out}"
    );
    // A non-2xx answer fails the Task with States.TaskFailed, which Catch sees.
    let (code, out, err) = sm4c(&[
        "run",
        &def,
        "--config",
        &cfg,
        "--input",
        &write_input(dir.path(), json!({"amount": 5000})),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["failed"]["Error"], "States.TaskFailed", "{out}");
    assert!(out["failed"]["Cause"].as_str().unwrap().contains("402"), "{out}");
    // A mock still wins over the binding.
    let mock = dir.path().join("mock.json");
    std::fs::write(&mock, json!({CHARGE: "{mocked: .amount}"}).to_string()).unwrap();
    let (code, out, err) = sm4c(&[
        "run",
        &def,
        "--config",
        &cfg,
        "--mock",
        mock.to_str().unwrap(),
        "--input",
        &write_input(dir.path(), json!({"amount": 7})),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["charge"],
        json!({"mocked": 7})
    );
}

fn write_input(dir: &Path, input: Value) -> String {
    let p = dir.join(format!("input-{}.json", input.to_string().len()));
    std::fs::write(&p, input.to_string()).unwrap();
    p.display().to_string()
}

#[test]
fn a_resource_bound_to_a_grpc_method_calls_it() {
    let target = inventory::server(inventory::Seen::default());
    let dir = tempfile::tempdir().unwrap();
    // A .proto the configuration names is read from its folder (or the definitions').
    let proto = "shop.proto";
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/grpc/shop.proto"),
        dir.path().join(proto),
    )
    .unwrap();
    let resource = "arn:aws:states:::lambda:invoke";
    let config = format!(
        "[grpc.\"shop.v1.Inventory\"]\ntarget = \"{target}\"\n\n[asl.resources.\"{resource}\"]\ngrpc = \"{proto}#shop.v1.Inventory/GetItem\"\n"
    );
    let definition = json!({
        "StartAt": "Get",
        "States": {"Get": {"Type": "Task", "Resource": resource,
                           "Parameters": {"id.$": "$.sku", "withTags": true}, "ResultSelector": {"id.$": "$.id", "name.$": "$.name"},
                           "End": true}}
    });
    let (def, cfg) = setup(dir.path(), "inventory", &definition, &config);
    let (code, out, err) = sm4c(&[
        "run",
        &def,
        "--config",
        &cfg,
        "--input",
        &write_input(dir.path(), json!({"sku": "sku-1"})),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["id"], "sku-1", "{out}");
    // NOT_FOUND is a States.TaskFailed the execution fails with.
    let (code, out, err) = sm4c(&[
        "run",
        &def,
        "--config",
        &cfg,
        "--input",
        &write_input(dir.path(), json!({"sku": "nope"})),
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["Error"],
        "States.TaskFailed",
        "{out}"
    );
}

#[test]
fn an_unbound_resource_fails_saying_how_to_bind_it_and_bad_bindings_name_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let (def, _) = setup(dir.path(), "charge", &charge_definition(), "");
    let (code, out, err) = sm4c(&["run", &def, "--input", &write_input(dir.path(), json!({"amount": 1}))]);
    assert_eq!(code, 0, "{out}{err}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["failed"]["Error"], "States.TaskFailed", "{out}");
    let cause = out["failed"]["Cause"].as_str().unwrap();
    assert!(
        cause.contains(CHARGE) && cause.contains("[asl.resources.\"RESOURCE\"]") && cause.contains("--mock"),
        "{cause}"
    );

    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        format!("[asl.resources.\"{CHARGE}\"]\nrest = \"payments.json\"\n[asl.resources.\"x.waitForTaskToken\"]\ngrpc = \"a.proto#a.B/C\"\n"),
    )
    .unwrap();
    let (code, _, err) = sm4c(&["run", &def, "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("bad.toml: line 2: asl.resources.\"{CHARGE}\": rest = \"payments.json\" must be <OpenAPI document URI>#<operationId>")),
        "{err}"
    );
    assert!(
        err.contains("line 4: asl.resources.\"x.waitForTaskToken\": a .waitForTaskToken Resource waits for a worker"),
        "{err}"
    );
}

#[test]
fn the_http_task_calls_the_endpoint_with_the_connection_credentials() {
    let url = api();
    let dir = tempfile::tempdir().unwrap();
    let conn = "arn:aws:events:us-east-1:123456789012:connection/items/1";
    let config = format!(
        "[asl.connections.\"{conn}\"]\nheaders = {{ authorization = \"env:SM4C_ASL_TASKS_CONN\" }}\nendpoints = [\"{url}/items/\"]\n"
    );
    let definition = json!({
        "StartAt": "Get",
        "States": {
            "Get": {
                "Type": "Task", "Resource": "arn:aws:states:::http:invoke",
                "Parameters": {
                    "ApiEndpoint.$": "States.Format('{}/items/{}', $.base, $.id)",
                    "Method": "GET",
                    "Authentication": {"ConnectionArn": conn},
                    // The connection's credentials win over a header of the same name.
                    "Headers": {"x-tenant": "acme", "Authorization": "Bearer from-definition"},
                    "QueryParameters": {"verbose": "true", "tag": "a b"}
                },
                "ResultSelector": {"status.$": "$.StatusCode", "text.$": "$.StatusText", "body.$": "$.ResponseBody",
                                   "type.$": "$.Headers.content-type[0]"},
                "ResultPath": "$.get", "Next": "Post"
            },
            "Post": {
                "Type": "Task", "Resource": "arn:aws:states:::http:invoke",
                "Parameters": {"ApiEndpoint.$": "States.Format('{}/echo', $.base)", "Method": "POST",
                               "RequestBody": {"n": 1}},
                "ResultSelector": {"status.$": "$.StatusCode", "body.$": "$.ResponseBody", "seen.$": "$.Headers.x-seen"},
                "ResultPath": "$.post", "Next": "Unauthorised"
            },
            "Unauthorised": {
                "Type": "Task", "Resource": "arn:aws:states:::http:invoke",
                "Parameters": {"ApiEndpoint.$": "States.Format('{}/items/1', $.base)", "Method": "GET"},
                "Catch": [{"ErrorEquals": ["States.Http.StatusCode.401"], "ResultPath": "$.denied", "Next": "Done"}],
                "End": true
            },
            "Done": {"Type": "Pass", "End": true}
        }
    });
    let (def, cfg) = setup(dir.path(), "http", &definition, &config);
    let input = write_input(dir.path(), json!({"base": url, "id": "sku-9"}));
    // The secret reaches the child only: setting it in this process would race the other tests'
    // threads reading the environment (they share one process).
    let (code, out, err) = sm4c_env(
        &["run", &def, "--config", &cfg, "--input", &input],
        &[("SM4C_ASL_TASKS_CONN", "Bearer conn-s3cret")],
    );
    assert_eq!(code, 0, "{out}{err}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        out["get"],
        json!({"status": 200, "text": "OK", "type": "application/json",
               "body": {"id": "sku-9", "q": {"verbose": "true", "tag": "a b"}, "tenant": "acme"}}),
        "{out}"
    );
    assert_eq!(
        out["post"],
        json!({"status": 200, "body": "application/json|{\"n\":1}", "seen": ["yes"]}),
        "{out}"
    );
    assert_eq!(out["denied"]["Error"], "States.Http.StatusCode.401", "{out}");
    let cause: Value = serde_json::from_str(out["denied"]["Cause"].as_str().unwrap()).unwrap();
    assert_eq!(cause["ResponseBody"], json!({"reason": "who are you"}));
    assert!(!out.to_string().contains("conn-s3cret"));
    // A connection the configuration does not give is refused, naming where to give it.
    let (code, out, err) = sm4c(&["run", &def, "--input", &input]);
    assert_eq!(code, 1, "{out}{err}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["Error"], "States.Runtime", "{out}");
    assert!(out["Cause"].as_str().unwrap().contains("[asl.connections."), "{out}");
}

// ---------------------------------------------------------------------------------------------
// Workers, through a real `sm4c serve`
// ---------------------------------------------------------------------------------------------

/// `sm4c serve` on `db` with the definitions in `defs` and the configuration file `config`.
fn start(defs: &Path, config: &Path, db: &Path) -> Server {
    Serve::new()
        .db(db)
        .arg("--definitions")
        .arg(defs)
        .arg("--config")
        .arg(config)
        .client_timeout(Duration::from_secs(60))
        .start()
}

/// What these tests ask of a server.
trait Api {
    fn post(&self, path: &str, body: Value) -> (u16, Value);
    fn poll(&self, list: &str) -> Value;
    fn start_instance(&self, id: &str, input: Value);
    fn ended(&self, id: &str) -> Value;
}

impl Api for Server {
    fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .client()
            .post(format!("{}{path}", self.url()))
            .json(&body)
            .send()
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().unwrap_or(Value::Null))
    }

    fn poll(&self, list: &str) -> Value {
        let r = self
            .client()
            .post(format!("{}/tasklists/{list}/poll?wait=20s", self.url()))
            .header("x-sm4c-request", "1")
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "no task on {list}");
        r.json().unwrap()
    }

    fn start_instance(&self, id: &str, input: Value) {
        let (status, body) = self.post("/instances", json!({"definition": "order", "id": id, "input": input}));
        assert_eq!(status, 201, "{body}");
    }

    fn ended(&self, id: &str) -> Value {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let v: Value = self
                .client()
                .get(format!("{}/instances/{id}", self.url()))
                .send()
                .unwrap()
                .json()
                .unwrap();
            if v["status"] != "running" || Instant::now() > until {
                return v;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

const APPROVE: &str = "arn:aws:states:::sqs:sendMessage.waitForTaskToken";
const PACK: &str = "arn:aws:states:us-east-1:123456789012:activity:pack";

/// `order`: Pack (a Resource bound to task list `packing`), then Approve (a `.waitForTaskToken`
/// Task bound to task list `approvals`, handing out `$$.Task.Token`); a `Rejected` error is caught.
fn serve_order(dir: &Path) -> Server {
    let defs = dir.join("defs");
    std::fs::create_dir_all(&defs).unwrap();
    let definition = json!({
        "StartAt": "Pack",
        "States": {
            "Pack": {"Type": "Task", "Resource": PACK, "Parameters": {"items.$": "$.items"},
                     "ResultPath": "$.packed", "Next": "Approve"},
            "Approve": {
                "Type": "Task", "Resource": APPROVE,
                "Parameters": {"token.$": "$$.Task.Token", "order.$": "$.order"},
                "HeartbeatSeconds": 20,
                "ResultPath": "$.approval",
                "Catch": [{"ErrorEquals": ["Rejected"], "ResultPath": "$.rejected", "Next": "Rejected"}],
                "End": true
            },
            "Rejected": {"Type": "Pass", "End": true}
        }
    });
    std::fs::write(defs.join("order.asl.json"), definition.to_string()).unwrap();
    let config = dir.join("sm4c.toml");
    std::fs::write(
        &config,
        format!("[asl.resources.\"{PACK}\"]\nworker = \"packing\"\n\n[asl.resources.\"{APPROVE}\"]\nworker = \"approvals\"\n"),
    )
    .unwrap();
    start(&defs, &config, &dir.join("sm4c.db"))
}

#[test]
fn bound_workers_and_wait_for_task_token_answered_the_aws_way() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve_order(dir.path());
    s.start_instance("o-1", json!({"items": [1, 2], "order": "o-1"}));
    // The bound Resource is a task on its task list, answered through the task API.
    let pack = s.poll("packing");
    assert_eq!(pack["function"], PACK);
    assert_eq!(pack["arguments"], json!({"items": [1, 2]}));
    let (status, body) = s.post(
        &format!("/tasks/{}/complete", pack["token"].as_str().unwrap()),
        json!({"box": 7}),
    );
    assert_eq!(status, 200, "{body}");
    // The .waitForTaskToken Task hands out a token the worker finds in its input: the task's own.
    let approve = s.poll("approvals");
    let token = approve["token"].as_str().unwrap().to_string();
    assert_eq!(approve["arguments"], json!({"token": token, "order": "o-1"}));
    assert_eq!(approve["instanceId"], "o-1");
    let (status, body) = s.post("/tasks/send-task-heartbeat", json!({"taskToken": token}));
    assert_eq!((status, body), (200, json!({"cancelRequested": false})));
    // AWS's shapes are checked: output is a JSON text.
    let (status, body) = s.post(
        "/tasks/send-task-success",
        json!({"taskToken": token, "output": {"ok": true}}),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("output"), "{body}");
    let (status, body) = s.post(
        "/tasks/send-task-success",
        json!({"taskToken": token, "output": "{not json"}),
    );
    assert_eq!(status, 400, "{body}");
    let (status, body) = s.post("/tasks/send-task-success", json!({"output": "{}"}));
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("taskToken"), "{body}");
    let (status, body) = s.post(
        "/tasks/send-task-success",
        json!({"taskToken": token, "output": "{}", "extra": 1}),
    );
    assert_eq!(status, 400, "{body}");
    let (status, _) = s.post(
        "/tasks/send-task-success",
        json!({"taskToken": "bm9wZQpvcA", "output": "{}"}),
    );
    assert_eq!(status, 404);
    // The AWS SDKs' content type is accepted too.
    let r = s
        .client()
        .post(format!("{}/tasks/send-task-success", s.url()))
        .header("content-type", "application/x-amz-json-1.0")
        .body(json!({"taskToken": token, "output": "{\"approved\": true}"}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.json::<Value>().unwrap(),
        json!({"instanceId": "o-1", "operation": approve["operation"]})
    );
    let end = s.ended("o-1");
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(
        end["data"],
        json!({"items": [1, 2], "order": "o-1", "packed": {"box": 7}, "approval": {"approved": true}})
    );
    // A second answer finds the task closed.
    let (status, _) = s.post("/tasks/send-task-success", json!({"taskToken": token, "output": "{}"}));
    assert_eq!(status, 409);
}

#[test]
fn failures_name_the_asl_error_that_catch_sees() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve_order(dir.path());
    for id in ["aws", "api"] {
        s.start_instance(id, json!({"items": [], "order": id}));
        let pack = s.poll("packing");
        s.post(
            &format!("/tasks/{}/complete", pack["token"].as_str().unwrap()),
            json!(null),
        );
        let token = s.poll("approvals")["token"].as_str().unwrap().to_string();
        let (status, body) = if id == "aws" {
            // SendTaskFailure: error and cause are the ASL error's name and cause.
            s.post(
                "/tasks/send-task-failure",
                json!({"taskToken": token, "error": "Rejected", "cause": "too big"}),
            )
        } else {
            // The task API's failure: its error is the name, its message the cause.
            s.post(
                &format!("/tasks/{token}/fail"),
                json!({"error": "Rejected", "message": "too big"}),
            )
        };
        assert_eq!(status, 200, "{body}");
        let end = s.ended(id);
        assert_eq!(end["status"], "completed", "{end}");
        assert_eq!(end["state"], "Rejected", "{end}");
        assert_eq!(
            end["data"]["rejected"],
            json!({"Error": "Rejected", "Cause": "too big"}),
            "{end}"
        );
    }
    // An error the definition does not catch fails the execution with that name.
    s.start_instance("uncaught", json!({"items": [], "order": "u"}));
    let pack = s.poll("packing");
    let (status, body) = s.post(
        "/tasks/send-task-failure",
        json!({"taskToken": pack["token"], "error": "Broken"}),
    );
    assert_eq!(status, 200, "{body}");
    let end = s.ended("uncaught");
    assert_eq!(end["status"], "failed", "{end}");
    assert!(end["error"].to_string().contains("Broken"), "{end}");
}
