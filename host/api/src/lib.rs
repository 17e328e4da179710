//! `sm4c serve`: the HTTP API, over the durable host (SQLite) or the Kafka host.
//!
//! Both implement [`Backend`], so the API, the CLI client and the OpenAPI document are the same
//! in both modes.

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use errors::*;
use serde::Deserialize;
use serde_json::{json, Value};
use sm4c_host::service::{Answered, Backend, HostError};
use sm4c_host::tasks::Answer;
use sm4c_runtime::engine::rfc3339;
use sm4c_runtime::timespan;
use sm4c_runtime::validate::is_task_list_name;
use std::sync::Arc;
use std::time::Duration;

pub mod auth;
mod batches;
pub mod cluster;
pub mod door;
pub mod errors;
pub mod metrics;
mod schedules;
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
fn check_nesting(bytes: &[u8], whole: bool) -> Result<(), ApiError> {
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
        .route("/definitions", post(post_definition).get(list_definitions))
        .route("/definitions/{id}", get(get_definition))
        .route(
            "/definitions/{id}/breakpoints",
            put(put_breakpoints).get(get_breakpoints).delete(delete_breakpoints),
        )
        .route(
            "/definitions/{id}/default-version",
            put(put_default_version).delete(delete_default_version),
        )
        .route("/definitions/{id}/upgrade-check", post(post_upgrade_check))
        .route("/breakpoints", get(all_breakpoints))
        .route("/instances", post(post_instance).get(list_instances))
        // Subflow instance ids contain `/` (`parent/1.enter/0`), so the rest of the path is the id,
        // with `/history`, `/cancel`, `/resume` and `/step` recognised at its end.
        .route("/instances/{*rest}", get(instance_get).post(instance_post))
        .route("/events", post(post_event))
        .route("/events/explain", post(post_explain))
        .route("/tasklists", get(task_lists))
        .route("/tasklists/{name}/poll", post(poll))
        .route("/tasks/{token}/complete", post(complete))
        .route("/tasks/{token}/fail", post(fail))
        .route("/tasks/{token}/heartbeat", post(heartbeat))
        .route("/tasks/send-task-success", post(send_task_success))
        .route("/tasks/send-task-failure", post(send_task_failure))
        .route("/tasks/send-task-heartbeat", post(send_task_heartbeat))
        .route("/events/sent", get(sent))
        .route(
            "/openapi.json",
            get(|| async { ([("content-type", "application/json")], OPENAPI) }),
        )
        .route("/healthz", get(|State(h): State<Api>| async move { Json(h.health()) }))
        .route("/members", get(members))
        .merge(schedules::routes())
        .merge(batches::routes())
        .fallback(|| async { NoSuchEndpoint })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(host.clone())
        // The web inspector (its assets and the routes only it uses; not in openapi.json).
        .merge(ui::routes(host))
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

type Api = Arc<dyn Backend>;

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    definition: String,
    version: Option<String>,
    input: Option<Value>,
    id: Option<String>,
}

async fn post_instance(
    State(h): State<Api>,
    headers: axum::http::HeaderMap,
    Body(b): Body<StartBody>,
) -> Result<Response, ApiError> {
    if b.id
        .as_deref()
        .is_some_and(|i| !sm4c_host::service::valid_instance_id(i))
    {
        return Err(InvalidId.into());
    }
    let input = b.input.unwrap_or_else(|| json!({}));
    // The request's W3C trace context is the instance's origin: its steps' spans link to it.
    let origin = traceparent(&headers).map(str::to_string);
    let (id, created) = h.start_traced(b.definition, b.version, b.id, input, origin).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({"id": id, "created": created}))).into_response())
}

pub(crate) fn instance_json(h: &Api, id: &str) -> Result<Value, ApiError> {
    let s = h
        .instance(id)?
        .ok_or_else(|| HostError::UnknownInstance(id.to_string()))?;
    let snap = &s.snapshot;
    let mut v = json!({
        "id": snap.id,
        "definition": snap.definition,
        "version": snap.version,
        "status": snap.status.as_str(),
        "state": snap.state_name,
        "data": sm4c_runtime::json::from_val(&snap.data.0),
        "startedAt": snap.started_at.map(rfc3339),
    });
    // An ASL execution keeps its data in its runs: while it runs, show the current state's input.
    if let (Some(exec), false) = (&snap.asl, snap.status.is_final()) {
        v["data"] = exec.root.input.clone();
    }
    if let Some(e) = &snap.error {
        v["error"] = e.to_json();
    }
    if let Some(p) = snap.debug.as_ref().and_then(|d| d.paused.as_ref()) {
        v["pausedAt"] = json!(p.at);
    }
    if let Some(t) = snap.ended_at {
        v["endedAt"] = json!(rfc3339(t));
    }
    if let Some(p) = &s.parent {
        v["parent"] = json!({"instance": p.instance, "operation": p.op});
    }
    if let Some(sch) = &snap.scheduled {
        v["scheduled"] = json!({"schedule": sch.schedule, "nominalTime": sch.to_json()["nominalTime"]});
    }
    Ok(v)
}

async fn instance_get(
    State(h): State<Api>,
    Path(rest): Path<String>,
    q: Params<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    match rest.strip_suffix("/history") {
        Some(id) => history(h, id.to_string(), q.0).await,
        // The host may read its store (SQLite) for it: on a blocking thread, not on the tokio
        // threads that serve every other request and make function calls.
        None => {
            let v = tokio::task::spawn_blocking(move || instance_json(&h, &rest))
                .await
                .map_err(|e| ApiError::from(HostError::Unavailable(e.to_string())))??;
            Ok(Json(v))
        }
    }
}

async fn instance_post(State(h): State<Api>, Path(rest): Path<String>, req: Request) -> Result<Response, ApiError> {
    if let Some(id) = rest.strip_suffix("/redrive") {
        // The body is optional: none redrives without an update.
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
        return Ok(redrive(h, id.to_string(), body).await?.into_response());
    }
    if let Some(id) = rest.strip_suffix("/migrate") {
        let Body(body) = Body::<MigrateBody>::from_request(req, &()).await?;
        return Ok(migrate(h, id.to_string(), body).await?.into_response());
    }
    if let Some(id) = rest.strip_suffix("/resume") {
        return Ok(resume(h, id.to_string(), false).await?.into_response());
    }
    if let Some(id) = rest.strip_suffix("/step") {
        return Ok(resume(h, id.to_string(), true).await?.into_response());
    }
    match rest.strip_suffix("/cancel") {
        Some(id) => Ok(cancel(h, id.to_string()).await?.into_response()),
        // A 405 says which methods the resource has (RFC 9110): `/instances/{id}` and its
        // `/history` are read with GET.
        None => {
            let mut r = ApiError::from(NoSuchInstanceAction).into_response();
            r.headers_mut()
                .insert(axum::http::header::ALLOW, axum::http::HeaderValue::from_static("GET"));
            Ok(r)
        }
    }
}

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

#[derive(Deserialize)]
struct ListQuery {
    status: Option<String>,
    definition: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
}

fn cursor(after: Option<&str>) -> Result<i64, ApiError> {
    match after {
        None | Some("") => Ok(0),
        Some(a) => a.parse().map_err(|_| InvalidCursor(a.to_string()).into()),
    }
}

/// The statuses `GET /instances?status=` filters on (the document's `Status`).
pub(crate) const STATUSES: [&str; 8] = [
    "created",
    "running",
    "waiting",
    "paused",
    "completed",
    "failed",
    "cancelled",
    "timedOut",
];

async fn list_instances(
    State(h): State<Api>,
    headers: axum::http::HeaderMap,
    Params(q): Params<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    // An unknown status matches no instance: it is a mistake to report, not an empty page.
    if let Some(s) = q.status.as_deref().filter(|s| !STATUSES.contains(s)) {
        return Err(InvalidQuery(format!("status: {s:?} is not one of {}", STATUSES.join(", "))).into());
    }
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let rows = h
        .list(
            q.status.as_deref(),
            q.definition.as_deref(),
            cursor(q.after.as_deref())?,
            limit,
        )
        .await?;
    let next = (rows.len() == limit)
        .then(|| rows.last().map(|r| r.seq.to_string()))
        .flatten();
    let mut page = json!({"instances": rows, "next": next});
    if cluster::forwarded(&headers) {
        // For the worker that merges the shares: each row's place in the listing.
        for (v, r) in page["instances"].as_array_mut().into_iter().flatten().zip(&rows) {
            v["seq"] = json!(r.seq);
        }
    }
    Ok(Json(page))
}

#[derive(Deserialize)]
struct PageQuery {
    limit: Option<usize>,
    after: Option<String>,
}

async fn history(h: Api, id: String, q: PageQuery) -> Result<Json<Value>, ApiError> {
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

/// Resumes a paused instance (`step`: it pauses again at the next breakpoint-able point).
async fn resume(h: Api, id: String, step: bool) -> Result<Json<Value>, ApiError> {
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

async fn members(State(h): State<Api>) -> Result<Json<Value>, ApiError> {
    Ok(Json(h.members()?))
}

async fn all_breakpoints(State(h): State<Api>) -> Result<Json<Value>, ApiError> {
    let all: Vec<Value> = h
        .breakpoints()?
        .into_iter()
        .map(|(d, b)| json!({"definition": d, "breakpoints": b}))
        .collect();
    Ok(Json(json!({"definitions": all})))
}

async fn cancel(h: Api, id: String) -> Result<Json<Value>, ApiError> {
    h.cancel(id.clone()).await?;
    Ok(Json(instance_json(&h, &id)?))
}

async fn post_event(State(h): State<Api>, req: Request) -> Result<Response, ApiError> {
    let hop = traceparent(req.headers()).map(str::to_string);
    let mut value = read_event(req).await?;
    // An event without the CloudEvents distributed-tracing extension has the request that posted
    // it as its origin.
    if let (Some(tp), Some(o)) = (hop, value.as_object_mut()) {
        o.entry("traceparent").or_insert(Value::String(tp));
    }
    let delivery = h.deliver(value).await?;
    Ok((StatusCode::ACCEPTED, Json(delivery)).into_response())
}

/// Explains an event in the bounded [`work`] pool, off the async runtime's threads: matching it
/// evaluates every waiting instance's correlation expressions.
async fn post_explain(
    State(h): State<Api>,
    work: Option<axum::Extension<work::Work>>,
    req: Request,
) -> Result<Json<Value>, ApiError> {
    let value = read_event(req).await?;
    let rt = tokio::runtime::Handle::current();
    // Made here, on the request's task, so that it keeps the request's caller (cluster::as_caller).
    let explaining = cluster::as_caller(async move { h.explain(value).await });
    let explained = work::of(work)
        .run("explaining the event", move |_| rt.block_on(explaining))
        .await??;
    Ok(Json(explained))
}

/// The W3C `traceparent` header of a request, when it has the form of version 00:
/// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`.
fn traceparent(headers: &axum::http::HeaderMap) -> Option<&str> {
    sm4c_host::driver::traceparent(headers.get("traceparent")?.to_str().ok()?)
}

/// A CloudEvent from an HTTP request in either content mode, as its JSON (structured) form.
async fn read_event(req: Request) -> Result<Value, ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| PayloadTooLarge(MAX_BODY))?;
    // cloudevents-sdk reads both content modes: `ce-*` headers (binary) or application/cloudevents+json (structured).
    let event = cloudevents::binding::http::to_event(&parts.headers, bytes.to_vec()).map_err(|e| {
        InvalidCloudEvent(format!(
            "not a CloudEvent in the HTTP binding (binary or structured mode): {e}"
        ))
    })?;
    // In binary mode a JSON body arrives as bytes; it becomes JSON data, as in structured mode.
    let value = sm4c_host::events::event_json(&event).map_err(InvalidCloudEvent)?;
    Ok(value)
}

async fn sent(State(h): State<Api>, Params(q): Params<PageQuery>) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let (events, next) = h.sent(q.after.as_deref().unwrap_or(""), limit).await?;
    Ok(Json(json!({"events": events, "next": next})))
}

/// Longest a poll may wait for a task.
const MAX_POLL: Duration = Duration::from_secs(60);
/// How long a poll waits when it does not say.
const DEFAULT_POLL: Duration = Duration::from_secs(20);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PollQuery {
    wait: Option<String>,
    worker: Option<String>,
}

async fn task_lists(State(h): State<Api>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"taskLists": h.task_lists().await?})))
}

async fn poll(
    State(h): State<Api>,
    Path(name): Path<String>,
    Params(q): Params<PollQuery>,
) -> Result<Response, ApiError> {
    if !is_task_list_name(&name) {
        return Err(InvalidTaskList(name).into());
    }
    let wait = match q.wait.as_deref() {
        None => DEFAULT_POLL,
        Some(w) => timespan::parse(w)
            .map(Duration::from_millis)
            .map_err(|e| InvalidQuery(format!("wait: {e}")))?,
    };
    if wait > MAX_POLL {
        let most = timespan::format(MAX_POLL.as_millis() as u64);
        return Err(InvalidQuery(format!("wait: at most {most} (PT60S)")).into());
    }
    Ok(match h.poll(name.clone(), q.worker, wait).await? {
        Some(task) => Json(task).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

/// A JSON body that may be empty (`None`).
async fn optional_json(req: Request) -> Result<Option<Value>, ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| PayloadTooLarge(MAX_BODY))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if door::media(door::content_type(&parts.headers)) != door::Media::Json {
        return Err(UnsupportedMediaType.into());
    }
    check_nesting(&bytes, true)?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| MalformedJson(format!("the body is not JSON: {e}")).into())
}

fn answered(a: Answered) -> Json<Value> {
    Json(json!({"instanceId": a.instance, "operation": a.op}))
}

async fn complete(State(h): State<Api>, Path(token): Path<String>, req: Request) -> Result<Json<Value>, ApiError> {
    let result = optional_json(req).await?.unwrap_or(Value::Null);
    Ok(answered(h.answer(token, Answer::Complete(result)).await?))
}

async fn fail(State(h): State<Api>, Path(token): Path<String>, req: Request) -> Result<Json<Value>, ApiError> {
    let body = optional_json(req).await?.unwrap_or(Value::Null);
    let answer = Answer::failure(&body).map_err(InvalidFailure)?;
    Ok(answered(h.answer(token, answer).await?))
}

async fn heartbeat(State(h): State<Api>, Path(token): Path<String>, req: Request) -> Result<Json<Value>, ApiError> {
    let details = optional_json(req).await?;
    let a = h.answer(token, Answer::Heartbeat(details)).await?;
    Ok(Json(json!({"cancelRequested": a.cancel_requested})))
}

/// A body of the AWS-shaped task answers: JSON, as `application/json` or as the AWS JSON protocol's
/// `application/x-amz-json-1.0` (what AWS SDKs send), with `taskToken` and the fields `fields` names.
async fn aws_answer(req: Request, fields: &[&str]) -> Result<(String, serde_json::Map<String, Value>), ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| PayloadTooLarge(MAX_BODY))?;
    if door::media(door::content_type(&parts.headers)) == door::Media::Other {
        return Err(UnsupportedMediaType.into());
    }
    check_nesting(&bytes, false)?;
    let body: Value =
        serde_json::from_slice(&bytes).map_err(|e| MalformedJson(format!("the body is not JSON: {e}")))?;
    let Value::Object(mut o) = body else {
        return Err(InvalidFailure("the body must be a JSON object with taskToken".into()).into());
    };
    if let Some(k) = o.keys().find(|k| *k != "taskToken" && !fields.contains(&k.as_str())) {
        let known: Vec<String> = std::iter::once("taskToken")
            .chain(fields.iter().copied())
            .map(|f| format!("{f:?}"))
            .collect();
        return Err(InvalidFailure(format!("unknown field {k:?}: expected {}", known.join(", "))).into());
    }
    match o.remove("taskToken") {
        Some(Value::String(t)) if !t.is_empty() => Ok((t, o)),
        _ => Err(InvalidFailure("taskToken (a string, the task's token) is missing".into()).into()),
    }
}

/// `SendTaskSuccess`, as AWS Step Functions takes it: `{"taskToken", "output"}`, `output` a JSON
/// text.
async fn send_task_success(State(h): State<Api>, req: Request) -> Result<Json<Value>, ApiError> {
    let (token, o) = aws_answer(req, &["output"]).await?;
    let result = match o.get("output") {
        Some(Value::String(text)) => {
            check_nesting(text.as_bytes(), true)?;
            serde_json::from_str(text)
                .map_err(|e| InvalidFailure(format!("output must be a JSON text (a string holding JSON): {e}")))?
        }
        _ => {
            return Err(InvalidFailure(
                "output (a string holding the task's JSON result, as AWS's SendTaskSuccess) is missing".into(),
            )
            .into())
        }
    };
    Ok(answered(h.answer(token, Answer::Complete(result)).await?))
}

/// `SendTaskFailure`, as AWS Step Functions takes it: `{"taskToken", "error"?, "cause"?}`. An ASL
/// Task fails with error name `error` (`States.TaskFailed` when absent) and cause `cause`.
async fn send_task_failure(State(h): State<Api>, req: Request) -> Result<Json<Value>, ApiError> {
    let (token, o) = aws_answer(req, &["error", "cause"]).await?;
    let text = |k: &str, most: usize| match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.chars().count() <= most => Ok(Some(s.clone())),
        Some(Value::String(_)) => Err(InvalidFailure(format!("{k} has more than {most} characters"))),
        Some(_) => Err(InvalidFailure(format!("{k} must be a string"))),
    };
    let (error, cause) = (text("error", 256)?, text("cause", 32768)?);
    let name = error.unwrap_or_else(|| "States.TaskFailed".into());
    let message = cause
        .clone()
        .unwrap_or_else(|| format!("the worker failed the task: {name}"));
    let e = sm4c_runtime::ErrorInfo::new(sm4c_runtime::ErrorKind::FunctionError, message)
        .with_details(json!({"Error": name, "Cause": cause}));
    Ok(answered(h.answer(token, Answer::Fail(e)).await?))
}

/// `SendTaskHeartbeat`, as AWS Step Functions takes it: `{"taskToken"}`.
async fn send_task_heartbeat(State(h): State<Api>, req: Request) -> Result<Json<Value>, ApiError> {
    let (token, _) = aws_answer(req, &[]).await?;
    let a = h.answer(token, Answer::Heartbeat(None)).await?;
    Ok(Json(json!({"cancelRequested": a.cancel_requested})))
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

    /// The router's routes (this file, `/schedules`, the inspector's and the metrics route that `sm4c serve` merges in) and the
    /// OpenAPI document's operations are the same set: a route added to one and not the other
    /// fails here. `/instances/{*rest}` is the document's `/instances/{id}` (GET),
    /// `/instances/{id}/history` (GET) and `/instances/{id}/cancel` (POST).
    #[test]
    fn the_openapi_document_matches_every_route() {
        let mut served = routes_in(include_str!("lib.rs").split("#[cfg(test)]").next().unwrap_or_default());
        served.extend(routes_in(include_str!("metrics.rs")));
        served.extend(routes_in(include_str!("schedules.rs")));
        served.extend(routes_in(include_str!("batches.rs")));
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
