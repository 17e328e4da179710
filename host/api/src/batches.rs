//! `/batches`: one operation (cancel, redrive, migrate, send) over every instance a filter
//! matches, run durably by the server at a bounded rate (see `docs/src/operating-many.md`). The
//! server hands the router its [`Batches`] as an extension; without one (Kafka mode) every route
//! answers 501.

use crate::{Api, ApiError, Body};
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::Value;
use sm4c_host::batch::Batches;
use sm4c_host::service::HostError;
use std::sync::Arc;

/// The routes of `/batches`.
pub(crate) fn routes() -> Router<Api> {
    Router::new()
        .route("/batches", post(create).get(list))
        .route("/batches/{id}", get(show))
        .route("/batches/{id}/cancel", post(cancel))
}

type Runner = Option<Extension<Arc<Batches>>>;

fn runner(b: Runner) -> Result<Arc<Batches>, ApiError> {
    b.map(|Extension(b)| b).ok_or_else(|| {
        HostError::NotSupported(
            "batch operations are run by the SQLite server (sm4c serve without --kafka); in Kafka mode, act on instances one at a time".into(),
        )
        .into()
    })
}

async fn create(b: Runner, Body(body): Body<Value>) -> Result<Response, ApiError> {
    let (started, v) = runner(b)?.submit(body).await?;
    let status = if started { StatusCode::ACCEPTED } else { StatusCode::OK };
    Ok((status, Json(v)).into_response())
}

async fn list(b: Runner) -> Result<Json<Value>, ApiError> {
    Ok(Json(runner(b)?.list()?))
}

async fn show(b: Runner, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(runner(b)?.get(&id)?))
}

async fn cancel(b: Runner, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(runner(b)?.cancel(&id).await?))
}
