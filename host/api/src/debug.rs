//! The debugger: breakpoints on a definition's states, actions and transitions
//! (`/definitions/{id}/breakpoints`, and `/breakpoints` for every definition), and resuming or
//! stepping a paused instance (`POST /instances/{id}/resume` and `/step`, which
//! [`crate::instances`] routes here).

use crate::errors::*;
use crate::instances::instance_json;
use crate::{Api, ApiError, Body};
use axum::extract::{Path, State};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde_json::{json, Value};
use sm4c_host::service::HostError;

/// The routes of the breakpoints.
pub(crate) fn routes() -> Router<Api> {
    Router::new()
        .route(
            "/definitions/{id}/breakpoints",
            put(put_breakpoints).get(get_breakpoints).delete(delete_breakpoints),
        )
        .route("/breakpoints", get(all_breakpoints))
}

/// Resumes a paused instance (`step`: it pauses again at the next breakpoint-able point).
pub(crate) async fn resume(h: Api, id: String, step: bool) -> Result<Json<Value>, ApiError> {
    h.resume(id.clone(), step).await?;
    Ok(Json(instance_json(&h, &id)?))
}

/// The breakpoints of a request body `{"breakpoints": [...]}`, each read on its own so an error
/// names the one that is wrong.
fn breakpoints_of(body: &Value) -> Result<Vec<sm4c_runtime::Breakpoint>, ApiError> {
    let Some(list) = body.get("breakpoints").and_then(Value::as_array) else {
        return Err(InvalidBreakpoint("the body must be {\"breakpoints\": [...]}".into()).into());
    };
    list.iter()
        .enumerate()
        .map(|(i, b)| {
            serde_json::from_value(b.clone()).map_err(|e| {
                InvalidBreakpoint(format!(
                    "breakpoint {i} ({b}): {e}; a breakpoint is {{\"on\": \"enter\"|\"action\"|\"transition\", \"state\": NAME, \"action\": \"enter\"|\"exit\"|\"tN\", \"transition\": N}}"
                ))
                .into()
            })
        })
        .collect()
}

async fn put_breakpoints(
    State(h): State<Api>,
    Path(id): Path<String>,
    Body(body): Body<Value>,
) -> Result<Json<Value>, ApiError> {
    let b = breakpoints_of(&body)?;
    h.set_breakpoints(id.clone(), b).await?;
    get_breakpoints(State(h), Path(id)).await
}

async fn get_breakpoints(State(h): State<Api>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    if h.latest(&id).is_none() {
        return Err(HostError::UnknownDefinition(id).into());
    }
    let b = h.breakpoints()?.into_iter().find(|(d, _)| *d == id).map(|(_, b)| b);
    Ok(Json(json!({"definition": id, "breakpoints": b.unwrap_or_default()})))
}

async fn delete_breakpoints(State(h): State<Api>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    h.set_breakpoints(id.clone(), Vec::new()).await?;
    get_breakpoints(State(h), Path(id)).await
}

async fn all_breakpoints(State(h): State<Api>) -> Result<Json<Value>, ApiError> {
    let all: Vec<Value> = h
        .breakpoints()?
        .into_iter()
        .map(|(d, b)| json!({"definition": d, "breakpoints": b}))
        .collect();
    Ok(Json(json!({"definitions": all})))
}

#[cfg(test)]
mod tests {
    use super::breakpoints_of;
    use serde_json::json;
    use sm4c_runtime::Breakpoint;

    #[test]
    fn breakpoints_are_read_one_by_one_and_a_wrong_one_is_named_by_its_place() {
        let ok = breakpoints_of(&json!({"breakpoints": [
            {"on": "enter", "state": "Pay"},
            {"on": "transition", "state": "Pay"},
        ]}))
        .map_err(|e| e.message().to_string());
        assert_eq!(
            ok,
            Ok(vec![
                Breakpoint::Enter { state: "Pay".into() },
                Breakpoint::Transition {
                    state: "Pay".into(),
                    transition: None
                },
            ])
        );
        let wrong = breakpoints_of(&json!({"breakpoints": [{"on": "enter", "state": "Pay"}, {"on": "nowhere"}]}))
            .expect_err("an unknown kind of breakpoint is refused");
        assert_eq!(wrong.code(), "invalidBreakpoint");
        assert!(wrong.message().starts_with("breakpoint 1 ("), "{}", wrong.message());
        for body in [json!({}), json!({"breakpoints": {}}), json!([])] {
            let e = breakpoints_of(&body).expect_err("not a list of breakpoints");
            assert_eq!(e.code(), "invalidBreakpoint", "{body}");
            assert!(
                e.message().contains("{\"breakpoints\": [...]}"),
                "{body}: {}",
                e.message()
            );
        }
    }
}
