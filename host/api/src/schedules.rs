//! `/schedules`: schedules that start a definition every interval or on a cron expression, once per
//! nominal time (see `docs/src/schedules.md`). The host keeps them ([`Backend::schedules`]).

use crate::{Api, ApiError, Body};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;
use sm4c_host::service::ScheduleOp;

/// The routes of `/schedules`.
pub(crate) fn routes() -> Router<Api> {
    Router::new()
        .route("/schedules", post(create).get(list))
        .route("/schedules/{id}", get(show).put(replace).delete(delete))
        .route("/schedules/{id}/pause", post(pause))
        .route("/schedules/{id}/resume", post(resume))
        .route("/schedules/{id}/trigger", post(trigger))
        .route("/schedules/{id}/backfill", post(backfill))
}

async fn create(State(h): State<Api>, Body(spec): Body<Value>) -> Result<Response, ApiError> {
    let v = h.schedules(ScheduleOp::Create(spec)).await?;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

async fn list(State(h): State<Api>) -> Result<Json<Value>, ApiError> {
    Ok(Json(h.schedules(ScheduleOp::List).await?))
}

async fn show(State(h): State<Api>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(h.schedules(ScheduleOp::Get(id)).await?))
}

async fn replace(
    State(h): State<Api>,
    Path(id): Path<String>,
    Body(spec): Body<Value>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(h.schedules(ScheduleOp::Replace(id, spec)).await?))
}

async fn delete(State(h): State<Api>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    h.schedules(ScheduleOp::Delete(id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn pause(State(h): State<Api>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(h.schedules(ScheduleOp::Pause(id)).await?))
}

async fn resume(State(h): State<Api>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(h.schedules(ScheduleOp::Resume(id)).await?))
}

async fn trigger(State(h): State<Api>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(h.schedules(ScheduleOp::Trigger(id)).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Span {
    from: String,
    to: String,
}

async fn backfill(
    State(h): State<Api>,
    Path(id): Path<String>,
    Body(span): Body<Span>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        h.schedules(ScheduleOp::Backfill {
            id,
            from: span.from,
            to: span.to,
        })
        .await?,
    ))
}
