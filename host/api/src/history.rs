//! An instance's history: its journal, a page at a time, as `GET /instances/{id}/history`
//! (which [`crate::instances`] routes here).

use crate::instances::instance_json;
use crate::{cursor, Api, ApiError, PageQuery};
use axum::Json;
use serde_json::{json, Value};

pub(crate) async fn history(h: Api, id: String, q: PageQuery) -> Result<Json<Value>, ApiError> {
    instance_json(&h, &id)?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let rows = h.history(&id, cursor(q.after.as_deref())?, limit).await?;
    let next = (rows.len() == limit)
        .then(|| rows.last().map(|r| r.0.to_string()))
        .flatten();
    let entries: Vec<Value> = rows
        .iter()
        .map(|(s, e)| sm4c_runtime::engine::history::history_entry(*s, e))
        .collect();
    Ok(Json(json!({"id": id, "entries": entries, "next": next})))
}
