//! `sm4c serve`: the HTTP API, over the durable host (SQLite) or the Kafka host.
//!
//! Both implement [`Backend`], so the API, the CLI client and the OpenAPI document are the same
//! in both modes.
//!
//! This file assembles the router and holds what every handler shares: the state (`Api`), the
//! body and query extractors ([`Body`], [`Params`]) and paging. The handlers live one module per
//! resource: `definitions`, `instances` (with `history`, `repair` for redrive and migrate, and
//! `debug` for breakpoints and stepping), `events`, `tasks`, `schedules`, `batches` and `about`
//! (health, members, the OpenAPI document).

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Query, Request};
use axum::{Json, Router};
use errors::*;
use serde::Deserialize;
use serde_json::Value;
use sm4c_host::service::Backend;
use std::sync::Arc;

mod about;
pub mod auth;
mod batches;
pub mod cluster;
mod debug;
mod definitions;
pub mod door;
pub mod errors;
mod events;
mod history;
mod instances;
pub mod metrics;
mod repair;
mod schedules;
mod tasks;
pub mod tls;
pub mod ui;
pub mod work;

pub use errors::ApiError;

/// Largest request body accepted (bytes).
pub const MAX_BODY: usize = 1024 * 1024;

/// The OpenAPI document of this API.
pub const OPENAPI: &str = include_str!("openapi.json");

/// JSON bodies with our error shape for malformed input.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let bytes = axum::body::to_bytes(body, MAX_BODY)
            .await
            .map_err(|_| PayloadTooLarge(MAX_BODY))?;
        check_nesting(&bytes, false)?;
        let req = Request::from_parts(parts, axum::body::Body::from(bytes));
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(UnsupportedMediaType.into()),
            Err(JsonRejection::BytesRejection(_)) => Err(PayloadTooLarge(MAX_BODY).into()),
            Err(e) => Err(MalformedJson(e.body_text()).into()),
        }
    }
}

/// Whether a JSON body's values stay within [`sm4c_runtime::json::MAX_DEPTH`] levels: those of an
/// object body's members (a start's `input`, an event's `data`), or the whole body when it is not an
/// object or is one value (`whole`: a task's result). Too deep is a `tooDeep` error naming the member, so that nothing the
/// server takes in nests deeper than its store reads back.
pub(crate) fn check_nesting(bytes: &[u8], whole: bool) -> Result<(), ApiError> {
    use sm4c_runtime::json::{check_depth, text_nesting, MAX_DEPTH};
    if text_nesting(bytes) <= MAX_DEPTH {
        return Ok(());
    }
    let body = match serde_json::from_slice::<Value>(bytes) {
        Ok(body) => body,
        // Deeper than the JSON reader goes.
        Err(e) if e.to_string().contains("recursion limit") => {
            return Err(TooDeep(format!(
                "the body is nested deeper than {MAX_DEPTH} levels, the most sm4c takes in"
            ))
            .into())
        }
        // Not JSON: the parser says what is wrong.
        Err(_) => return Ok(()),
    };
    let problem = match &body {
        Value::Object(o) if !whole => o.iter().find_map(|(k, v)| check_depth(v, k).err()),
        other => check_depth(other, "the body").err(),
    };
    problem.map_or(Ok(()), |m| Err(TooDeep(m).into()))
}

/// Query strings with our error shape.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Params(v))
            .map_err(|e| InvalidQuery(e.body_text()).into())
    }
}

/// The API's routes.
pub fn router(backend: impl Backend) -> Router {
    routes(Arc::new(backend))
}

/// The API's routes for one worker of several that each hold a share of the instances
/// ([`Backend::peers`]): requests about an instance held elsewhere are forwarded to the worker that
/// holds it, and listings ask every worker, with `forward`, authenticated with `peering`
/// ([`cluster`]). With authentication on, [`auth::layer`] goes around this router: forwarding
/// needs the role it established.
pub fn router_with(backend: impl Backend, forward: Arc<dyn cluster::Forward>, peering: cluster::Peering) -> Router {
    let inner: Api = Arc::new(backend);
    let host: Api = Arc::new(cluster::Clustered {
        inner: inner.clone(),
        fwd: forward.clone(),
        peering: peering.clone(),
    });
    routes(host).layer(axum::middleware::from_fn_with_state(
        (inner, forward, peering),
        cluster::forwarding,
    ))
}

fn routes(host: Api) -> Router {
    Router::new()
        .merge(definitions::routes())
        .merge(debug::routes())
        .merge(instances::routes())
        .merge(events::routes())
        .merge(tasks::routes())
        .merge(about::routes())
        .merge(schedules::routes())
        .merge(batches::routes())
        .fallback(|| async { NoSuchEndpoint })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(host.clone())
        // The web inspector (its assets and the routes only it uses; not in openapi.json).
        .merge(ui::routes(host))
}

/// What every handler is given: the host behind the API.
pub(crate) type Api = Arc<dyn Backend>;

/// A page of a listing: at most `limit` rows after the cursor `after` (the `next` of the page
/// before).
#[derive(Deserialize)]
pub(crate) struct PageQuery {
    pub(crate) limit: Option<usize>,
    pub(crate) after: Option<String>,
}

/// The position a listing goes on after: `after` as the host's sequence number (none: the start).
pub(crate) fn cursor(after: Option<&str>) -> Result<i64, ApiError> {
    match after {
        None | Some("") => Ok(0),
        Some(a) => a.parse().map_err(|_| InvalidCursor(a.to_string()).into()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;
    use std::collections::BTreeSet;

    /// `(path, method)` of every `.route(...)` in `source`, with its methods (`get(..)`, `.post(..)`).
    fn routes_in(source: &str) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for chunk in source.split(".route(").skip(1) {
            let Some(rest) = chunk.trim_start().strip_prefix('"') else {
                continue;
            };
            let Some((path, after)) = rest.split_once('"') else {
                continue;
            };
            // The methods are named up to the route's closing parenthesis (the next `.route(` at most).
            let mut depth = 1;
            let end = after
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(after.len(), |(i, _)| i);
            let methods = &after[..end];
            for m in ["get", "post", "put", "patch", "delete"] {
                let called = methods.match_indices(&format!("{m}(")).any(|(i, _)| {
                    i == 0 || !methods.as_bytes()[i - 1].is_ascii_alphanumeric() && methods.as_bytes()[i - 1] != b'_'
                });
                if called {
                    out.insert((path.to_string(), m.to_string()));
                }
            }
        }
        out
    }

    /// The router's routes (those of every module it merges, the inspector's and the metrics route that `sm4c serve` merges in) and the
    /// OpenAPI document's operations are the same set: a route added to one and not the other
    /// fails here. `/instances/{*rest}` is the document's `/instances/{id}` (GET),
    /// `/instances/{id}/history` (GET) and `/instances/{id}/cancel` (POST).
    #[test]
    fn the_openapi_document_matches_every_route() {
        let mut served = BTreeSet::new();
        for source in [
            include_str!("definitions.rs"),
            include_str!("debug.rs"),
            include_str!("instances.rs"),
            include_str!("events.rs"),
            include_str!("tasks.rs"),
            include_str!("about.rs"),
            include_str!("metrics.rs"),
            include_str!("schedules.rs"),
            include_str!("batches.rs"),
        ] {
            served.extend(routes_in(source));
        }
        // The inspector's routes beyond its assets (pages, not operations: not documented).
        served.extend(routes_in(include_str!("ui/mod.rs")));
        assert!(served.remove(&("/instances/{*rest}".into(), "get".into())));
        assert!(served.remove(&("/instances/{*rest}".into(), "post".into())));
        for (p, m) in [
            ("/instances/{id}", "get"),
            ("/instances/{id}/history", "get"),
            ("/instances/{id}/cancel", "post"),
            ("/instances/{id}/migrate", "post"),
            ("/instances/{id}/redrive", "post"),
            ("/instances/{id}/resume", "post"),
            ("/instances/{id}/step", "post"),
        ] {
            served.insert((p.into(), m.into()));
        }
        let doc: Value = serde_json::from_str(super::OPENAPI).expect("the document is JSON");
        let mut documented = BTreeSet::new();
        for (path, ops) in doc["paths"].as_object().expect("paths") {
            for m in ops
                .as_object()
                .expect("operations")
                .keys()
                .filter(|k| *k != "parameters")
            {
                documented.insert((path.clone(), m.clone()));
            }
        }
        let undocumented: Vec<_> = served.difference(&documented).collect();
        let unserved: Vec<_> = documented.difference(&served).collect();
        assert!(
            undocumented.is_empty() && unserved.is_empty(),
            "served but not in openapi.json: {undocumented:?}; in openapi.json but not served: {unserved:?}"
        );
        assert!(served.len() >= 21, "{served:?}");
    }
}
