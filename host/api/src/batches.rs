//! `/batches`: one operation (cancel, redrive, migrate, send) over every instance a filter
//! matches, run durably by the server at a bounded rate (see `docs/src/operating-many.md`). The
//! SQLite server hands the router its [`Batches`] as an extension, which runs them; without one,
//! the host runs them itself ([`Backend::batches`](sm4c_host::service::Backend::batches)): in
//! Kafka mode each partition's owner applies a batch to its own instances, and the answers merge
//! every worker's shares ([`crate::cluster`]).

use crate::{Api, ApiError, Body};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::Value;
use sm4c_host::batch::Batches;
use sm4c_host::service::BatchOp;
use std::sync::Arc;

/// The routes of `/batches`.
pub(crate) fn routes() -> Router<Api> {
    Router::new()
        .route("/batches", post(create).get(list))
        .route("/batches/{id}", get(show))
        .route("/batches/{id}/cancel", post(cancel))
}

type Runner = Option<Extension<Arc<Batches>>>;

async fn create(State(h): State<Api>, b: Runner, Body(body): Body<Value>) -> Result<Response, ApiError> {
    let (started, v) = match b {
        Some(Extension(b)) => b.submit(body).await?,
        None => {
            let v = h.batches(BatchOp::Create(body)).await?;
            (v["dryRun"] != Value::Bool(true), v)
        }
    };
    let status = if started { StatusCode::ACCEPTED } else { StatusCode::OK };
    Ok((status, Json(v)).into_response())
}

async fn list(State(h): State<Api>, b: Runner) -> Result<Json<Value>, ApiError> {
    Ok(Json(match b {
        Some(Extension(b)) => b.list()?,
        None => h.batches(BatchOp::List).await?,
    }))
}

async fn show(State(h): State<Api>, b: Runner, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(match b {
        Some(Extension(b)) => b.get(&id)?,
        None => h.batches(BatchOp::Get(id)).await?,
    }))
}

async fn cancel(State(h): State<Api>, b: Runner, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(match b {
        Some(Extension(b)) => b.cancel(&id).await?,
        None => h.batches(BatchOp::Cancel(id)).await?,
    }))
}
