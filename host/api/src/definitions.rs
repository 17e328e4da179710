//! `/definitions`: registering definitions (SM4C, or ASL named by `?name=`), listing and reading
//! them with their versions, choosing the version new starts take, and checking what a new
//! version would mean for the instances that have not ended (`upgrade-check`). Their breakpoints
//! are the debugger's ([`crate::debug`]).

use crate::errors::*;
use crate::{cluster, work, Api, ApiError, Body, Params};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sm4c_host::service::HostError;

/// The routes of `/definitions` (but its breakpoints).
pub(crate) fn routes() -> Router<Api> {
    Router::new()
        .route("/definitions", post(post_definition).get(list_definitions))
        .route("/definitions/{id}", get(get_definition))
        .route(
            "/definitions/{id}/default-version",
            put(put_default_version).delete(delete_default_version),
        )
        .route("/definitions/{id}/upgrade-check", post(post_upgrade_check))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DefineQuery {
    name: Option<String>,
}

/// The definition to register: an ASL document gets its name (`?name=`) as its `sm4c:id`, as ASL
/// carries no id of its own; a name that disagrees with the body is refused.
fn named(mut doc: Value, name: Option<String>) -> Result<Value, ApiError> {
    use sm4c_runtime::asl::model::{is_asl, ID_KEY};
    if name.as_deref() == Some("") {
        return Err(InvalidQuery("name: must not be empty".into()).into());
    }
    let field = if is_asl(&doc) { ID_KEY } else { "id" };
    match (name, doc.get(field)) {
        (Some(n), Some(Value::String(have))) if *have != n => {
            Err(DefinitionNameMismatch(n, have.clone(), field.into()).into())
        }
        (Some(n), None) if field == ID_KEY => {
            if let Some(o) = doc.as_object_mut() {
                o.insert(ID_KEY.into(), Value::String(n));
            }
            Ok(doc)
        }
        (None, None) if field == ID_KEY => Err(UnnamedDefinition.into()),
        // A name that agrees, or an SM4C document whose `id` validation reports.
        _ => Ok(doc),
    }
}

async fn post_definition(
    State(h): State<Api>,
    Params(q): Params<DefineQuery>,
    Body(doc): Body<Value>,
) -> Result<Response, ApiError> {
    let (m, created) = h.define(named(doc, q.name)?).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({"id": m.id, "version": m.version, "name": m.name}))).into_response())
}

async fn list_definitions(State(h): State<Api>) -> Json<Value> {
    let list: Vec<Value> = h
        .machines()
        .iter()
        .map(|m| json!({"id": m.id, "version": m.version, "name": m.name, "description": m.description}))
        .collect();
    Json(json!({"definitions": list}))
}

async fn get_definition(State(h): State<Api>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let versions: Vec<Value> = h
        .machines()
        .iter()
        .filter(|m| m.id == id)
        .map(|m| json!({"version": m.version, "definition": m.source}))
        .collect();
    // The newest registered is the last of the id in registration order; new starts take the
    // default version when one is set.
    let newest = h.machines().into_iter().filter(|m| m.id == id).last();
    let takes = h.latest(&id);
    let (Some(newest), Some(takes)) = (newest, takes) else {
        return Err(HostError::UnknownDefinition(id).into());
    };
    Ok(Json(json!({
        "id": id,
        "latest": newest.version,
        "defaultVersion": h.default_version(&id),
        "startsTake": takes.version,
        "definition": takes.source,
        "versions": versions,
    })))
}

/// What a new version of a definition (the body, not registered) would mean for the instances of
/// the definition that have not ended: per version and state, how many could move to it as they
/// are, how many need a state map, why the others cannot, and whose histories it would decide
/// otherwise. Run in the bounded [`work`] pool: it replays every such instance's journal.
async fn post_upgrade_check(
    State(h): State<Api>,
    Path(id): Path<String>,
    work: Option<axum::Extension<work::Work>>,
    Body(doc): Body<Value>,
) -> Result<Json<Value>, ApiError> {
    let doc = named(doc, Some(id.clone()))?;
    let pool = work::of(work);
    let options = sm4c_runtime::LoadOptions { limits: pool.limits };
    let m = sm4c_runtime::load(&doc, &mut sm4c_runtime::no_files, options).map_err(HostError::Invalid)?;
    if h.latest(&id).is_none() {
        return Err(HostError::UnknownDefinition(id).into());
    }
    let rt = tokio::runtime::Handle::current();
    let m = std::sync::Arc::new(m);
    let checking = cluster::as_caller(async move { h.upgrade_check(m).await });
    let report = pool
        .run("checking the upgrade", move |_| rt.block_on(checking))
        .await??;
    Ok(Json(report))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DefaultVersionBody {
    version: String,
}

/// Sets the version new starts of a definition take (one registered already), so that a newer
/// version can be registered before it takes traffic.
async fn put_default_version(
    State(h): State<Api>,
    Path(id): Path<String>,
    Body(body): Body<Value>,
) -> Result<Json<Value>, ApiError> {
    let b: DefaultVersionBody = serde_json::from_value(body)
        .map_err(|e| MalformedJson(format!("the body must be {{\"version\": \"V\"}}: {e}")))?;
    h.set_default_version(id.clone(), Some(b.version)).await?;
    get_definition(State(h), Path(id)).await
}

/// Clears the default version: new starts take the newest registered again.
async fn delete_default_version(State(h): State<Api>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    h.set_default_version(id.clone(), None).await?;
    get_definition(State(h), Path(id)).await
}

#[cfg(test)]
mod tests {
    use super::named;
    use serde_json::{json, Value};

    fn asl() -> Value {
        json!({"StartAt": "A", "States": {"A": {"Type": "Succeed"}}})
    }

    /// `?name=` and the body's own name, as a table: (document, name, the document registered or
    /// the error's code).
    #[test]
    fn a_definition_is_named_by_the_query_or_its_body() {
        let with = |mut doc: Value, k: &str, v: &str| {
            doc[k] = json!(v);
            doc
        };
        let cases: Vec<(Value, Option<&str>, Result<Value, &str>)> = vec![
            // ASL carries no id: the name becomes its `sm4c:id`, and it needs one.
            (asl(), Some("order"), Ok(with(asl(), "sm4c:id", "order"))),
            (asl(), None, Err("unnamedDefinition")),
            (
                with(asl(), "sm4c:id", "order"),
                None,
                Ok(with(asl(), "sm4c:id", "order")),
            ),
            (
                with(asl(), "sm4c:id", "order"),
                Some("order"),
                Ok(with(asl(), "sm4c:id", "order")),
            ),
            (
                with(asl(), "sm4c:id", "order"),
                Some("other"),
                Err("definitionNameMismatch"),
            ),
            // SM4C names itself with `id`; one missing is validation's to report.
            (json!({"id": "order"}), Some("order"), Ok(json!({"id": "order"}))),
            (json!({"id": "order"}), Some("other"), Err("definitionNameMismatch")),
            (json!({"states": {}}), Some("order"), Ok(json!({"states": {}}))),
            (json!({"states": {}}), None, Ok(json!({"states": {}}))),
            (json!({"id": "order"}), Some(""), Err("invalidQuery")),
        ];
        for (doc, name, want) in cases {
            let got = named(doc.clone(), name.map(str::to_string)).map_err(|e| e.code());
            assert_eq!(got, want, "{doc} named {name:?}");
        }
    }
}
