//! Worker task lists: the lists with tasks waiting (`/tasklists`), long polls for a task
//! (`/tasklists/{name}/poll`), and the answers to a task by its token: completed, failed or a
//! heartbeat (`/tasks/{token}/...`), and the same in the shape of AWS Step Functions'
//! `SendTaskSuccess`, `SendTaskFailure` and `SendTaskHeartbeat` (`/tasks/send-task-...`).

use crate::errors::*;
use crate::{check_nesting, door, Api, ApiError, Params, MAX_BODY};
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sm4c_host::service::Answered;
use sm4c_host::tasks::Answer;
use sm4c_runtime::timespan;
use sm4c_runtime::validate::is_task_list_name;
use std::time::Duration;

/// The routes of `/tasklists` and `/tasks`.
pub(crate) fn routes() -> Router<Api> {
    Router::new()
        .route("/tasklists", get(task_lists))
        .route("/tasklists/{name}/poll", post(poll))
        .route("/tasks/{token}/complete", post(complete))
        .route("/tasks/{token}/fail", post(fail))
        .route("/tasks/{token}/heartbeat", post(heartbeat))
        .route("/tasks/send-task-success", post(send_task_success))
        .route("/tasks/send-task-failure", post(send_task_failure))
        .route("/tasks/send-task-heartbeat", post(send_task_heartbeat))
}

/// Longest a poll may wait for a task.
const MAX_POLL: Duration = Duration::from_secs(60);
/// How long a poll waits when it does not say.
const DEFAULT_POLL: Duration = Duration::from_secs(20);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PollQuery {
    wait: Option<String>,
    worker: Option<String>,
}

async fn task_lists(State(h): State<Api>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"taskLists": h.task_lists().await?})))
}

async fn poll(
    State(h): State<Api>,
    Path(name): Path<String>,
    Params(q): Params<PollQuery>,
) -> Result<Response, ApiError> {
    if !is_task_list_name(&name) {
        return Err(InvalidTaskList(name).into());
    }
    let wait = match q.wait.as_deref() {
        None => DEFAULT_POLL,
        Some(w) => timespan::parse(w)
            .map(Duration::from_millis)
            .map_err(|e| InvalidQuery(format!("wait: {e}")))?,
    };
    if wait > MAX_POLL {
        let most = timespan::format(MAX_POLL.as_millis() as u64);
        return Err(InvalidQuery(format!("wait: at most {most} (PT60S)")).into());
    }
    Ok(match h.poll(name.clone(), q.worker, wait).await? {
        Some(task) => Json(task).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

/// A JSON body that may be empty (`None`).
async fn optional_json(req: Request) -> Result<Option<Value>, ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| PayloadTooLarge(MAX_BODY))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if door::media(door::content_type(&parts.headers)) != door::Media::Json {
        return Err(UnsupportedMediaType.into());
    }
    check_nesting(&bytes, true)?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| MalformedJson(format!("the body is not JSON: {e}")).into())
}

fn answered(a: Answered) -> Json<Value> {
    Json(json!({"instanceId": a.instance, "operation": a.op}))
}

async fn complete(State(h): State<Api>, Path(token): Path<String>, req: Request) -> Result<Json<Value>, ApiError> {
    let result = optional_json(req).await?.unwrap_or(Value::Null);
    Ok(answered(h.answer(token, Answer::Complete(result)).await?))
}

async fn fail(State(h): State<Api>, Path(token): Path<String>, req: Request) -> Result<Json<Value>, ApiError> {
    let body = optional_json(req).await?.unwrap_or(Value::Null);
    let answer = Answer::failure(&body).map_err(InvalidFailure)?;
    Ok(answered(h.answer(token, answer).await?))
}

async fn heartbeat(State(h): State<Api>, Path(token): Path<String>, req: Request) -> Result<Json<Value>, ApiError> {
    let details = optional_json(req).await?;
    let a = h.answer(token, Answer::Heartbeat(details)).await?;
    Ok(Json(json!({"cancelRequested": a.cancel_requested})))
}

/// A body of the AWS-shaped task answers: JSON, as `application/json` or as the AWS JSON protocol's
/// `application/x-amz-json-1.0` (what AWS SDKs send), with `taskToken` and the fields `fields` names.
async fn aws_answer(req: Request, fields: &[&str]) -> Result<(String, serde_json::Map<String, Value>), ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| PayloadTooLarge(MAX_BODY))?;
    if door::media(door::content_type(&parts.headers)) == door::Media::Other {
        return Err(UnsupportedMediaType.into());
    }
    check_nesting(&bytes, false)?;
    let body: Value =
        serde_json::from_slice(&bytes).map_err(|e| MalformedJson(format!("the body is not JSON: {e}")))?;
    let Value::Object(mut o) = body else {
        return Err(InvalidFailure("the body must be a JSON object with taskToken".into()).into());
    };
    if let Some(k) = o.keys().find(|k| *k != "taskToken" && !fields.contains(&k.as_str())) {
        let known: Vec<String> = std::iter::once("taskToken")
            .chain(fields.iter().copied())
            .map(|f| format!("{f:?}"))
            .collect();
        return Err(InvalidFailure(format!("unknown field {k:?}: expected {}", known.join(", "))).into());
    }
    match o.remove("taskToken") {
        Some(Value::String(t)) if !t.is_empty() => Ok((t, o)),
        _ => Err(InvalidFailure("taskToken (a string, the task's token) is missing".into()).into()),
    }
}

/// `SendTaskSuccess`, as AWS Step Functions takes it: `{"taskToken", "output"}`, `output` a JSON
/// text.
async fn send_task_success(State(h): State<Api>, req: Request) -> Result<Json<Value>, ApiError> {
    let (token, o) = aws_answer(req, &["output"]).await?;
    let result = match o.get("output") {
        Some(Value::String(text)) => {
            check_nesting(text.as_bytes(), true)?;
            serde_json::from_str(text)
                .map_err(|e| InvalidFailure(format!("output must be a JSON text (a string holding JSON): {e}")))?
        }
        _ => {
            return Err(InvalidFailure(
                "output (a string holding the task's JSON result, as AWS's SendTaskSuccess) is missing".into(),
            )
            .into())
        }
    };
    Ok(answered(h.answer(token, Answer::Complete(result)).await?))
}

/// `SendTaskFailure`, as AWS Step Functions takes it: `{"taskToken", "error"?, "cause"?}`. An ASL
/// Task fails with error name `error` (`States.TaskFailed` when absent) and cause `cause`.
async fn send_task_failure(State(h): State<Api>, req: Request) -> Result<Json<Value>, ApiError> {
    let (token, o) = aws_answer(req, &["error", "cause"]).await?;
    let text = |k: &str, most: usize| match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.chars().count() <= most => Ok(Some(s.clone())),
        Some(Value::String(_)) => Err(InvalidFailure(format!("{k} has more than {most} characters"))),
        Some(_) => Err(InvalidFailure(format!("{k} must be a string"))),
    };
    let (error, cause) = (text("error", 256)?, text("cause", 32768)?);
    let name = error.unwrap_or_else(|| "States.TaskFailed".into());
    let message = cause
        .clone()
        .unwrap_or_else(|| format!("the worker failed the task: {name}"));
    let e = sm4c_runtime::ErrorInfo::new(sm4c_runtime::ErrorKind::FunctionError, message)
        .with_details(json!({"Error": name, "Cause": cause}));
    Ok(answered(h.answer(token, Answer::Fail(e)).await?))
}

/// `SendTaskHeartbeat`, as AWS Step Functions takes it: `{"taskToken"}`.
async fn send_task_heartbeat(State(h): State<Api>, req: Request) -> Result<Json<Value>, ApiError> {
    let (token, _) = aws_answer(req, &[]).await?;
    let a = h.answer(token, Answer::Heartbeat(None)).await?;
    Ok(Json(json!({"cancelRequested": a.cancel_requested})))
}
