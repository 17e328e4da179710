//! Putting an instance on another road: redriving a failed or timed-out one
//! (`POST /instances/{id}/redrive`) and migrating one to another version of its definition
//! (`POST /instances/{id}/migrate`), each with a dry run. [`crate::instances`] routes them here.

use crate::errors::PayloadTooLarge;
use crate::instances::instance_json;
use crate::{Api, ApiError, Body, MAX_BODY};
use axum::extract::{FromRequest, Request};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

/// `POST /instances/{id}/migrate`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MigrateBody {
    version: String,
    #[serde(default)]
    states: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    dry_run: bool,
}

/// Moves an instance to another version of its definition: the instance as it now is, with what
/// the move did (`migration`); with `dryRun`, only what it would do.
async fn migrate(h: Api, id: String, body: MigrateBody) -> Result<Json<Value>, ApiError> {
    instance_json(&h, &id)?;
    let plan = h.migrate(id.clone(), body.version, body.states, body.dry_run).await?;
    let plan = serde_json::to_value(&plan).unwrap_or(Value::Null);
    if body.dry_run {
        return Ok(Json(json!({"dryRun": true, "plan": plan})));
    }
    let mut v = instance_json(&h, &id)?;
    v["migration"] = plan;
    Ok(Json(v))
}

/// `POST /instances/{id}/redrive`'s body (it may be empty).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RedriveBody {
    /// A jq expression over the instance's data; its result is the data the instance goes on with.
    #[serde(default)]
    update: Option<String>,
    #[serde(default)]
    dry_run: bool,
}

/// Redrives a failed or timed-out instance: the instance as it now is, with what the redrive did
/// (`redrive`); with `dryRun`, only what it would do (the data after the update).
async fn redrive(h: Api, id: String, body: RedriveBody) -> Result<Json<Value>, ApiError> {
    instance_json(&h, &id)?;
    let done = h.redrive(id.clone(), body.update, body.dry_run).await?;
    if body.dry_run {
        return Ok(Json(json!({"dryRun": true, "redrive": done})));
    }
    let mut v = instance_json(&h, &id)?;
    v["redrive"] = done;
    Ok(Json(v))
}

/// `POST /instances/{id}/redrive`: its body is optional, none redrives without an update.
pub(crate) async fn post_redrive(h: Api, id: String, req: Request) -> Result<Json<Value>, ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| PayloadTooLarge(MAX_BODY))?;
    let body = if bytes.iter().all(u8::is_ascii_whitespace) {
        RedriveBody::default()
    } else {
        let req = Request::from_parts(parts, axum::body::Body::from(bytes));
        Body::<RedriveBody>::from_request(req, &()).await?.0
    };
    redrive(h, id, body).await
}

/// `POST /instances/{id}/migrate`.
pub(crate) async fn post_migrate(h: Api, id: String, req: Request) -> Result<Json<Value>, ApiError> {
    let Body(body) = Body::<MigrateBody>::from_request(req, &()).await?;
    migrate(h, id, body).await
}
