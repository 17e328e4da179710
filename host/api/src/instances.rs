//! `/instances`: starting an instance, listing them, reading one and cancelling it. Their ids may
//! hold `/` (a subflow's `parent/1.enter/0`), so `/instances/{*rest}` takes the rest of the path
//! and recognises the operation at its end: `/history` ([`crate::history`]), `/cancel`,
//! `/redrive` and `/migrate` ([`crate::repair`]), `/resume` and `/step` ([`crate::debug`]).

use crate::debug::resume;
use crate::errors::*;
use crate::events::traceparent;
use crate::history::history;
use crate::{cluster, cursor, repair, Api, ApiError, Body, PageQuery, Params};
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sm4c_host::service::HostError;
use sm4c_runtime::engine::rfc3339;

/// The routes of `/instances`.
pub(crate) fn routes() -> Router<Api> {
    Router::new()
        .route("/instances", post(post_instance).get(list_instances))
        // Subflow instance ids contain `/` (`parent/1.enter/0`), so the rest of the path is the id,
        // with `/history`, `/cancel`, `/redrive`, `/migrate`, `/resume` and `/step` recognised at its end.
        .route("/instances/{*rest}", get(instance_get).post(instance_post))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    definition: String,
    version: Option<String>,
    input: Option<Value>,
    id: Option<String>,
}

async fn post_instance(
    State(h): State<Api>,
    headers: axum::http::HeaderMap,
    Body(b): Body<StartBody>,
) -> Result<Response, ApiError> {
    if b.id
        .as_deref()
        .is_some_and(|i| !sm4c_host::service::valid_instance_id(i))
    {
        return Err(InvalidId.into());
    }
    let input = b.input.unwrap_or_else(|| json!({}));
    // The request's W3C trace context is the instance's origin: its steps' spans link to it.
    let origin = traceparent(&headers).map(str::to_string);
    let (id, created) = h.start_traced(b.definition, b.version, b.id, input, origin).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({"id": id, "created": created}))).into_response())
}

pub(crate) fn instance_json(h: &Api, id: &str) -> Result<Value, ApiError> {
    let s = h
        .instance(id)?
        .ok_or_else(|| HostError::UnknownInstance(id.to_string()))?;
    let snap = &s.snapshot;
    let mut v = json!({
        "id": snap.id,
        "definition": snap.definition,
        "version": snap.version,
        "status": snap.status.as_str(),
        "state": snap.state_name,
        "data": sm4c_runtime::json::from_val(&snap.data.0),
        "startedAt": snap.started_at.map(rfc3339),
    });
    // An ASL execution keeps its data in its runs: while it runs, show the current state's input.
    if let (Some(exec), false) = (&snap.asl, snap.status.is_final()) {
        v["data"] = exec.root.input.clone();
    }
    if let Some(e) = &snap.error {
        v["error"] = e.to_json();
    }
    if let Some(p) = snap.debug.as_ref().and_then(|d| d.paused.as_ref()) {
        v["pausedAt"] = json!(p.at);
    }
    if let Some(t) = snap.ended_at {
        v["endedAt"] = json!(rfc3339(t));
    }
    if let Some(p) = &s.parent {
        v["parent"] = json!({"instance": p.instance, "operation": p.op});
    }
    if let Some(sch) = &snap.scheduled {
        v["scheduled"] = json!({"schedule": sch.schedule, "nominalTime": sch.to_json()["nominalTime"]});
    }
    Ok(v)
}

async fn instance_get(
    State(h): State<Api>,
    Path(rest): Path<String>,
    q: Params<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    match rest.strip_suffix("/history") {
        Some(id) => history(h, id.to_string(), q.0).await,
        // The host may read its store (SQLite) for it: on a blocking thread, not on the tokio
        // threads that serve every other request and make function calls.
        None => {
            let v = tokio::task::spawn_blocking(move || instance_json(&h, &rest))
                .await
                .map_err(|e| ApiError::from(HostError::Unavailable(e.to_string())))??;
            Ok(Json(v))
        }
    }
}

async fn instance_post(State(h): State<Api>, Path(rest): Path<String>, req: Request) -> Result<Response, ApiError> {
    if let Some(id) = rest.strip_suffix("/redrive") {
        return Ok(repair::post_redrive(h, id.to_string(), req).await?.into_response());
    }
    if let Some(id) = rest.strip_suffix("/migrate") {
        return Ok(repair::post_migrate(h, id.to_string(), req).await?.into_response());
    }
    if let Some(id) = rest.strip_suffix("/resume") {
        return Ok(resume(h, id.to_string(), false).await?.into_response());
    }
    if let Some(id) = rest.strip_suffix("/step") {
        return Ok(resume(h, id.to_string(), true).await?.into_response());
    }
    match rest.strip_suffix("/cancel") {
        Some(id) => Ok(cancel(h, id.to_string()).await?.into_response()),
        // A 405 says which methods the resource has (RFC 9110): `/instances/{id}` and its
        // `/history` are read with GET.
        None => {
            let mut r = ApiError::from(NoSuchInstanceAction).into_response();
            r.headers_mut()
                .insert(axum::http::header::ALLOW, axum::http::HeaderValue::from_static("GET"));
            Ok(r)
        }
    }
}

#[derive(Deserialize)]
struct ListQuery {
    status: Option<String>,
    definition: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
}

/// The statuses `GET /instances?status=` filters on (the document's `Status`).
pub(crate) const STATUSES: [&str; 8] = [
    "created",
    "running",
    "waiting",
    "paused",
    "completed",
    "failed",
    "cancelled",
    "timedOut",
];

async fn list_instances(
    State(h): State<Api>,
    headers: axum::http::HeaderMap,
    Params(q): Params<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    // An unknown status matches no instance: it is a mistake to report, not an empty page.
    if let Some(s) = q.status.as_deref().filter(|s| !STATUSES.contains(s)) {
        return Err(InvalidQuery(format!("status: {s:?} is not one of {}", STATUSES.join(", "))).into());
    }
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let rows = h
        .list(
            q.status.as_deref(),
            q.definition.as_deref(),
            cursor(q.after.as_deref())?,
            limit,
        )
        .await?;
    let next = (rows.len() == limit)
        .then(|| rows.last().map(|r| r.seq.to_string()))
        .flatten();
    let mut page = json!({"instances": rows, "next": next});
    if cluster::forwarded(&headers) {
        // For the worker that merges the shares: each row's place in the listing.
        for (v, r) in page["instances"].as_array_mut().into_iter().flatten().zip(&rows) {
            v["seq"] = json!(r.seq);
        }
    }
    Ok(Json(page))
}

async fn cancel(h: Api, id: String) -> Result<Json<Value>, ApiError> {
    h.cancel(id.clone()).await?;
    Ok(Json(instance_json(&h, &id)?))
}
