//! `/events`: CloudEvents posted to the instances (in either HTTP content mode), explaining which
//! instances an event would reach and why (`/events/explain`), and the events the instances sent
//! (`/events/sent`).

use crate::errors::*;
use crate::{cluster, work, Api, ApiError, PageQuery, Params, MAX_BODY};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

/// The routes of `/events`.
pub(crate) fn routes() -> Router<Api> {
    Router::new()
        .route("/events", post(post_event))
        .route("/events/explain", post(post_explain))
        .route("/events/sent", get(sent))
}

async fn post_event(State(h): State<Api>, req: Request) -> Result<Response, ApiError> {
    let hop = traceparent(req.headers()).map(str::to_string);
    let mut value = read_event(req).await?;
    // An event without the CloudEvents distributed-tracing extension has the request that posted
    // it as its origin.
    if let (Some(tp), Some(o)) = (hop, value.as_object_mut()) {
        o.entry("traceparent").or_insert(Value::String(tp));
    }
    let delivery = h.deliver(value).await?;
    Ok((StatusCode::ACCEPTED, Json(delivery)).into_response())
}

/// Explains an event in the bounded [`work`] pool, off the async runtime's threads: matching it
/// evaluates every waiting instance's correlation expressions.
async fn post_explain(
    State(h): State<Api>,
    work: Option<axum::Extension<work::Work>>,
    req: Request,
) -> Result<Json<Value>, ApiError> {
    let value = read_event(req).await?;
    let rt = tokio::runtime::Handle::current();
    // Made here, on the request's task, so that it keeps the request's caller (cluster::as_caller).
    let explaining = cluster::as_caller(async move { h.explain(value).await });
    let explained = work::of(work)
        .run("explaining the event", move |_| rt.block_on(explaining))
        .await??;
    Ok(Json(explained))
}

/// The W3C `traceparent` header of a request, when it has the form of version 00:
/// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`.
pub(crate) fn traceparent(headers: &axum::http::HeaderMap) -> Option<&str> {
    sm4c_host::driver::traceparent(headers.get("traceparent")?.to_str().ok()?)
}

/// A CloudEvent from an HTTP request in either content mode, as its JSON (structured) form.
async fn read_event(req: Request) -> Result<Value, ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| PayloadTooLarge(MAX_BODY))?;
    // cloudevents-sdk reads both content modes: `ce-*` headers (binary) or application/cloudevents+json (structured).
    let event = cloudevents::binding::http::to_event(&parts.headers, bytes.to_vec()).map_err(|e| {
        InvalidCloudEvent(format!(
            "not a CloudEvent in the HTTP binding (binary or structured mode): {e}"
        ))
    })?;
    // In binary mode a JSON body arrives as bytes; it becomes JSON data, as in structured mode.
    let value = sm4c_host::events::event_json(&event).map_err(InvalidCloudEvent)?;
    Ok(value)
}

async fn sent(State(h): State<Api>, Params(q): Params<PageQuery>) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let (events, next) = h.sent(q.after.as_deref().unwrap_or(""), limit).await?;
    Ok(Json(json!({"events": events, "next": next})))
}
