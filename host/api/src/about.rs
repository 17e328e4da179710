//! What the server says about itself: its health (`/healthz`), the workers that share the
//! instances (`/members`) and its OpenAPI document (`/openapi.json`).

use crate::{Api, ApiError, OPENAPI};
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::Value;

/// The routes of `/healthz`, `/members` and `/openapi.json`.
pub(crate) fn routes() -> Router<Api> {
    Router::new()
        .route(
            "/openapi.json",
            get(|| async { ([("content-type", "application/json")], OPENAPI) }),
        )
        .route("/healthz", get(|State(h): State<Api>| async move { Json(h.health()) }))
        .route("/members", get(members))
}

async fn members(State(h): State<Api>) -> Result<Json<Value>, ApiError> {
    Ok(Json(h.members()?))
}
