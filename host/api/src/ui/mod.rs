//! The web inspector at `/ui`: a page of plain HTML, JS and CSS built into the binary, which reads
//! the HTTP API like any client, and the few routes it needs beyond it (under `/ui/api/` and
//! `/ui/events`), all through [`Backend`], so it is the same over SQLite and Kafka.
//!
//! The assets are open (they hold no data); `/ui/api/*` and `/ui/events` need the `read` role when
//! authentication is on ([`crate::auth::needs`]), like every `GET` of the API.

pub mod diagram;
pub mod live;
pub mod newest;
pub mod search;
pub mod view;

pub use live::changed;

use crate::errors::InvalidQuery;
use crate::{ApiError, Params};
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sm4c_host::service::{Backend, HostError};
use std::sync::Arc;

const INDEX: &str = include_str!("../../ui/index.html");
const APP_JS: &str = include_str!("../../ui/app.js");
const APP_CSS: &str = include_str!("../../ui/app.css");

/// The assets, by path: (path, content type, body).
const ASSETS: [(&str, &str, &str); 4] = [
    ("/ui", "text/html; charset=utf-8", INDEX),
    ("/ui/", "text/html; charset=utf-8", INDEX),
    ("/ui/app.js", "text/javascript; charset=utf-8", APP_JS),
    ("/ui/app.css", "text/css; charset=utf-8", APP_CSS),
];

/// The Content-Security-Policy of the inspector's page: no inline script, no script from elsewhere,
/// in no frame.
pub const CSP: &str = "script-src 'self'; frame-ancestors 'none'";

/// Whether `path` is one of the inspector's assets, which any caller may read.
pub fn is_asset(path: &str) -> bool {
    ASSETS.iter().any(|(p, _, _)| *p == path)
}

type Api = Arc<dyn Backend>;

/// The inspector's routes.
pub(crate) fn routes(host: Api) -> Router {
    let mut r = Router::new();
    for (path, ty, body) in ASSETS {
        r = r.route(
            path,
            get(move || async move {
                // The page runs only its own script and is shown in no frame (clickjacking).
                let csp = if ty.starts_with("text/html") {
                    CSP
                } else {
                    "frame-ancestors 'none'"
                };
                (
                    [
                        (header::CONTENT_TYPE, ty),
                        (header::CACHE_CONTROL, "no-cache"),
                        (header::CONTENT_SECURITY_POLICY, csp),
                    ],
                    body,
                )
                    .into_response()
            }),
        );
    }
    r.route("/ui/api/instance", get(instance))
        .route("/ui/api/definition", get(definition))
        .route("/ui/api/search", get(search))
        .route("/ui/api/instances", get(instances))
        .route("/ui/events", get(live::events))
        .with_state(host)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InstanceQuery {
    id: String,
}

async fn instance(
    State(h): State<Api>,
    work: Option<axum::Extension<crate::work::Work>>,
    Params(q): Params<InstanceQuery>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(view::instance(&h, &q.id, &crate::work::of(work)).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    status: Option<String>,
    definition: Option<String>,
    limit: Option<usize>,
    before: Option<String>,
}

/// The newest instances first (`GET /instances` lists the oldest first): `{instances, next}`, `next`
/// the `before` of the next, older, page.
async fn instances(State(h): State<Api>, Params(q): Params<ListQuery>) -> Result<Json<Value>, ApiError> {
    let f = newest::Filter {
        status: q.status.as_deref().filter(|s| !s.is_empty()),
        definition: q.definition.as_deref().filter(|s| !s.is_empty()),
    };
    if let Some(s) = f.status.filter(|s| !crate::instances::STATUSES.contains(s)) {
        let all = crate::instances::STATUSES.join(", ");
        return Err(InvalidQuery(format!("status: {s:?} is not one of {all}")).into());
    }
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let before = match q.before.as_deref().filter(|s| !s.is_empty()) {
        Some(b) => b
            .parse()
            .map_err(|_| InvalidQuery(format!("before: {b:?} is not a cursor")))?,
        None => match newest::top(&h, f).await? {
            Some(t) => t,
            None => return Ok(Json(json!({"instances": [], "next": null}))),
        },
    };
    let (rows, next) = newest::page(&h, f, before, limit).await?;
    Ok(Json(json!({"instances": rows, "next": next.map(|n| n.to_string())})))
}

async fn search(
    State(h): State<Api>,
    work: Option<axum::Extension<crate::work::Work>>,
    Params(q): Params<search::Search>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(search::search(&h, q, &crate::work::of(work)).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DefinitionQuery {
    id: String,
    version: Option<String>,
}

async fn definition(State(h): State<Api>, Params(q): Params<DefinitionQuery>) -> Result<Json<Value>, ApiError> {
    let m = match &q.version {
        Some(v) => h.machines().into_iter().find(|m| m.id == q.id && &m.version == v),
        None => h.latest(&q.id),
    };
    let m = match (m, &q.version) {
        (Some(m), _) => m,
        (None, Some(v)) => {
            return Err(InvalidQuery(format!("definition {:?} has no version {v:?}", q.id)).into());
        }
        (None, None) => return Err(HostError::UnknownDefinition(q.id).into()),
    };
    let versions: Vec<String> = h
        .machines()
        .iter()
        .filter(|x| x.id == m.id)
        .map(|x| x.version.clone())
        .collect();
    Ok(Json(json!({
        "id": m.id,
        "version": m.version,
        "name": m.name,
        "description": m.description,
        "versions": versions,
        "events": m.events.iter().map(|e| json!({"name": e.name, "type": e.sent_type(), "source": e.source})).collect::<Vec<_>>(),
        "diagram": diagram::svg(&diagram::graph(&m), &diagram::Marks::default()),
        "mermaid": sm4c_host::graph::mermaid(&m),
        "definition": m.source,
    })))
}
