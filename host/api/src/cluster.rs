//! Requests in a group of workers that each hold a share of the instances (`sm4c serve --kafka`).
//!
//! - A request about one instance (`/instances/{id}…`, a task answer, the inspector's instance
//!   page, `POST /instances`) is answered by the worker that holds the instance: the worker that
//!   receives it asks its [`Backend::locate`] and forwards the request there as it came (the
//!   caller's credentials included), with the header [`FORWARDED`], and returns the answer.
//! - A listing (`GET /instances`, the inspector's lists and searches, `GET /tasklists`,
//!   `POST /events/explain`) asks every worker ([`Backend::peers`]) for its share and merges.
//!
//! A request that carries [`FORWARDED`] is answered where it lands: it is never forwarded again.
//! The worker that holds nothing of it answers 503 (say, when the partition moved meanwhile).

use crate::errors::Unavailable;
use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sm4c_host::service::{Answered, Backend, HostError, SentPage, Stored, Summary, Whereabouts};
use sm4c_host::tasks::Answer;
use sm4c_host::BoxFuture;
use sm4c_runtime::{Breakpoint, Entry, Machine};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The header of a request one worker forwards to another: answer it here.
pub const FORWARDED: &str = "sm4c-forwarded";

/// The header of an answer that another worker gave: its URL.
pub const ANSWERED_BY: &str = "sm4c-answered-by";

/// Sends a request to another worker's HTTP API. `sm4c serve` gives one built on its HTTP client
/// (with the TLS roots it trusts); an error is why the worker did not answer.
pub trait Forward: Send + Sync + 'static {
    /// Sends `req` (its URI absolute) and gives the answer.
    fn send(&self, req: axum::http::Request<Bytes>) -> BoxFuture<'static, Result<axum::http::Response<Bytes>, String>>;
}

/// The request being answered.
#[derive(Clone, Default)]
struct Caller {
    /// Its credentials, passed on when it asks other workers.
    auth: Option<HeaderValue>,
    /// Whether another worker forwarded it: then it asks no one.
    forwarded: bool,
}

tokio::task_local! {
    static CALLER: Caller;
}

/// The caller of the request being answered (none outside a request).
fn caller() -> Caller {
    CALLER.try_with(Caller::clone).unwrap_or_default()
}

/// `f` run as the caller of the request being answered, wherever it is polled: task-locals do not
/// follow work moved off the request's task (the bounded [`crate::work`] pool), and without its
/// caller a forwarded explanation would ask every worker again, which would ask it back.
pub(crate) fn as_caller<F: Future>(f: F) -> impl Future<Output = F::Output> {
    CALLER.scope(caller(), f)
}

type Api = Arc<dyn Backend>;

/// The middleware that forwards requests about one instance to the worker that holds it.
pub(crate) async fn forwarding(State((h, fwd)): State<(Api, Arc<dyn Forward>)>, req: Request, next: Next) -> Response {
    let caller = Caller {
        auth: req.headers().get(header::AUTHORIZATION).cloned(),
        forwarded: req.headers().contains_key(FORWARDED),
    };
    if caller.forwarded {
        return CALLER.scope(caller, next.run(req)).await;
    }
    let (req, id) = match about(&h, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Some(id) = id else {
        return CALLER.scope(caller, next.run(req)).await;
    };
    match h.locate(&id).await {
        Whereabouts::Here => CALLER.scope(caller, next.run(req)).await,
        Whereabouts::Unavailable(why) => Unavailable(why).into_response(),
        Whereabouts::At(url) => match forward(&*fwd, &url, req).await {
            Ok(mut r) => {
                if let Ok(v) = HeaderValue::from_str(&url) {
                    r.headers_mut().insert(ANSWERED_BY, v);
                }
                r
            }
            Err(e) => Unavailable(format!(
                "instance {id:?} is held by the worker at {url}, which did not answer: {e}"
            ))
            .into_response(),
        },
    }
}

/// The instance a request is about, if it is about one. A start without an id gets its id here,
/// written into its body, so that it goes to the worker that will hold the instance.
async fn about(h: &Api, req: Request) -> Result<(Request, Option<String>), Response> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if let Some(rest) = path.strip_prefix("/instances/") {
        let rest = decode(rest);
        let id = ["/history", "/cancel", "/resume", "/step"]
            .iter()
            .find_map(|s| rest.strip_suffix(s))
            .unwrap_or(&rest);
        return Ok((req, Some(id.to_string())));
    }
    if let Some(token) = path
        .strip_prefix("/tasks/")
        .and_then(|t| t.split_once('/'))
        .filter(|(_, what)| ["complete", "fail", "heartbeat"].contains(what))
        .map(|(t, _)| decode(t))
    {
        return Ok((req, sm4c_host::tasks::decode_token(&token).map(|(i, _)| i)));
    }
    if path == "/ui/api/instance" {
        let id = req.uri().query().and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("id="))
                .map(|v| decode(&v.replace('+', " ")))
        });
        return Ok((req, id));
    }
    let posted = method == Method::POST && (path == "/instances" || path.starts_with("/tasks/send-task-"));
    if !posted {
        return Ok((req, None));
    }
    // A body too large or not JSON is the handler's to refuse.
    let (parts, body) = req.into_parts();
    let bytes = match to_bytes(body, crate::MAX_BODY + 1).await {
        Ok(b) => b,
        Err(_) => return Err(crate::errors::PayloadTooLarge(crate::MAX_BODY).into_response()),
    };
    let mut doc: Option<serde_json::Map<String, Value>> = serde_json::from_slice(&bytes).ok();
    let mut id = None;
    let mut body = bytes;
    if let Some(doc) = doc.as_mut() {
        if path == "/instances" {
            id = match doc.get("id") {
                Some(Value::String(i)) => Some(i.clone()),
                Some(_) => None,
                None => {
                    let definition = doc.get("definition").and_then(Value::as_str).unwrap_or_default();
                    let m = match doc.get("version").and_then(Value::as_str) {
                        Some(v) => h.machines().into_iter().find(|m| m.id == definition && m.version == v),
                        None => h.latest(definition),
                    };
                    m.map(|m| {
                        let id = sm4c_host::service::new_id(&m.id);
                        doc.insert("id".into(), json!(id));
                        body = Bytes::from(serde_json::to_vec(&doc).unwrap_or_default());
                        id
                    })
                }
            };
        } else if let Some(Value::String(token)) = doc.get("taskToken") {
            id = sm4c_host::tasks::decode_token(token).map(|(i, _)| i);
        }
    }
    let mut parts = parts;
    parts.headers.remove(header::CONTENT_LENGTH);
    Ok((Request::from_parts(parts, Body::from(body)), id))
}

/// `%XX` sequences decoded (paths and query values); a malformed one stays as it is.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}

/// Headers not passed on (hop by hop, or set again for the new request).
const DROPPED: [HeaderName; 5] = [
    header::HOST,
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::CONTENT_LENGTH,
    header::TE,
];

/// How long a forwarded request may take: a start waits up to 30 s for its owner to apply it.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);

/// Sends `req` to the worker at `base` as it came, marked [`FORWARDED`].
async fn forward(fwd: &dyn Forward, base: &str, req: Request) -> Result<Response, String> {
    let (parts, body) = req.into_parts();
    let body = to_bytes(body, crate::MAX_BODY + 1).await.map_err(|e| e.to_string())?;
    let target = format!(
        "{}{}",
        base.trim_end_matches('/'),
        parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
    );
    let mut out = axum::http::Request::builder()
        .method(parts.method)
        .uri(target.parse::<Uri>().map_err(|e| format!("{target:?}: {e}"))?);
    for (k, v) in &parts.headers {
        if !DROPPED.contains(k) {
            out = out.header(k, v);
        }
    }
    let out = out.header(FORWARDED, "1").body(body).map_err(|e| e.to_string())?;
    let answer = fwd.send(out).await?;
    let (mut parts, body) = answer.into_parts();
    for h in &DROPPED {
        parts.headers.remove(h);
    }
    Ok(Response::from_parts(parts, Body::from(body)))
}

/// Asks the worker at `base` (a request marked [`FORWARDED`], with the caller's credentials) and
/// reads its JSON answer.
async fn ask(
    fwd: &dyn Forward,
    base: &str,
    method: Method,
    path_and_query: &str,
    body: Option<&Value>,
) -> Result<Value, HostError> {
    let url = format!("{}{path_and_query}", base.trim_end_matches('/'));
    let unavailable = |why: String| HostError::Unavailable(format!("the worker at {base} did not answer: {why}"));
    let mut req = axum::http::Request::builder()
        .method(method)
        .uri(url.parse::<Uri>().map_err(|e| unavailable(e.to_string()))?)
        .header(FORWARDED, "1");
    if let Some(auth) = caller().auth {
        req = req.header(header::AUTHORIZATION, auth);
    }
    let body = match body {
        Some(b) => {
            // The only body sent is an event to explain, in the structured mode.
            req = req.header(header::CONTENT_TYPE, "application/cloudevents+json");
            Bytes::from(serde_json::to_vec(b).unwrap_or_default())
        }
        None => Bytes::new(),
    };
    let answer = fwd
        .send(req.body(body).map_err(|e| unavailable(e.to_string()))?)
        .await
        .map_err(unavailable)?;
    let status = answer.status();
    let v: Value = serde_json::from_slice(answer.body()).unwrap_or(Value::Null);
    if !status.is_success() {
        let why = v["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| status.to_string());
        return Err(unavailable(format!("{status}: {why}")));
    }
    Ok(v)
}

/// Asks every peer at once.
async fn ask_all<F, Fut>(peers: Vec<String>, f: F) -> Result<Vec<Value>, HostError>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<Value, HostError>> + Send + 'static,
{
    let tasks: Vec<_> = peers.into_iter().map(|p| tokio::spawn(f(p))).collect();
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.map_err(|e| HostError::Unavailable(e.to_string()))??);
    }
    Ok(all)
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                b => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    pairs
        .iter()
        .filter_map(|(k, v)| Some(format!("{k}={}", enc(v.as_deref()?))))
        .collect::<Vec<_>>()
        .join("&")
}

/// A [`Backend`] whose listings cover every worker's share: this worker's, and its peers' asked
/// over HTTP. Everything else is the backend's own.
pub(crate) struct Clustered {
    pub inner: Api,
    pub fwd: Arc<dyn Forward>,
}

impl Clustered {
    /// The workers to ask too: none for a request another worker forwarded.
    fn peers(&self) -> Vec<String> {
        match caller().forwarded {
            true => Vec::new(),
            false => self.inner.peers().unwrap_or_default(),
        }
    }
}

impl Backend for Clustered {
    fn define(&self, doc: Value) -> BoxFuture<'_, Result<(Arc<Machine>, bool), HostError>> {
        self.inner.define(doc)
    }
    fn machines(&self) -> Vec<Arc<Machine>> {
        self.inner.machines()
    }
    fn latest(&self, id: &str) -> Option<Arc<Machine>> {
        self.inner.latest(id)
    }
    fn start_instance(
        &self,
        definition: String,
        version: Option<String>,
        id: Option<String>,
        input: Value,
    ) -> BoxFuture<'_, Result<(String, bool), HostError>> {
        self.inner.start_instance(definition, version, id, input)
    }
    fn start_traced(
        &self,
        definition: String,
        version: Option<String>,
        id: Option<String>,
        input: Value,
        origin: Option<String>,
    ) -> BoxFuture<'_, Result<(String, bool), HostError>> {
        self.inner.start_traced(definition, version, id, input, origin)
    }
    fn instance(&self, id: &str) -> Result<Option<Stored>, HostError> {
        self.inner.instance(id)
    }
    fn list(
        &self,
        status: Option<&str>,
        definition: Option<&str>,
        after: i64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Summary>, HostError>> {
        let (status, definition) = (status.map(str::to_string), definition.map(str::to_string));
        Box::pin(async move {
            let mut rows = self
                .inner
                .list(status.as_deref(), definition.as_deref(), after, limit)
                .await?;
            let q = query(&[
                ("status", status),
                ("definition", definition),
                ("after", Some(after.to_string())),
                ("limit", Some(limit.to_string())),
            ]);
            let fwd = self.fwd.clone();
            let pages = ask_all(self.peers(), move |p| {
                let (fwd, q) = (fwd.clone(), q.clone());
                let caller = caller();
                CALLER.scope(caller, async move {
                    ask(&*fwd, &p, Method::GET, &format!("/instances?{q}"), None).await
                })
            })
            .await?;
            for page in pages {
                for row in page["instances"].as_array().into_iter().flatten() {
                    if let Ok(mut s) = serde_json::from_value::<Summary>(row.clone()) {
                        s.seq = row["seq"].as_i64().unwrap_or(0);
                        rows.push(s);
                    }
                }
            }
            rows.sort_by(|a, b| (a.seq, &a.id).cmp(&(b.seq, &b.id)));
            rows.truncate(limit);
            Ok(rows)
        })
    }
    fn history(&self, id: &str, after: i64, limit: usize) -> BoxFuture<'_, Result<Vec<(i64, Entry)>, HostError>> {
        self.inner.history(id, after, limit)
    }
    fn cancel(&self, id: String) -> BoxFuture<'_, Result<(), HostError>> {
        self.inner.cancel(id)
    }
    fn deliver(&self, event: Value) -> BoxFuture<'_, Result<Value, HostError>> {
        self.inner.deliver(event)
    }
    fn sent(&self, after: &str, limit: usize) -> BoxFuture<'_, Result<SentPage, HostError>> {
        self.inner.sent(after, limit)
    }
    /// An event naming its instance is explained by the worker that holds it; any other by every
    /// worker, their instances reached and near misses together.
    fn explain(&self, event: Value) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async move {
            let fwd = self.fwd.clone();
            if let Some(target) = sm4c_runtime::engine::event::attribute_text(&event, "sm4cinstanceid") {
                return match self.inner.locate(&target).await {
                    _ if caller().forwarded => self.inner.explain(event).await,
                    Whereabouts::Here => self.inner.explain(event).await,
                    Whereabouts::At(url) => ask(&*fwd, &url, Method::POST, "/events/explain", Some(&event)).await,
                    Whereabouts::Unavailable(why) => Err(HostError::Unavailable(why)),
                };
            }
            let mut mine = self.inner.explain(event.clone()).await?;
            let event = Arc::new(event);
            let theirs = ask_all(self.peers(), move |p| {
                let (fwd, event) = (fwd.clone(), event.clone());
                let caller = caller();
                CALLER.scope(caller, async move {
                    ask(&*fwd, &p, Method::POST, "/events/explain", Some(&event)).await
                })
            })
            .await?;
            for key in ["reached", "nearMisses"] {
                let mut all: Vec<Value> = mine[key].as_array().cloned().unwrap_or_default();
                for t in &theirs {
                    all.extend(t[key].as_array().cloned().unwrap_or_default());
                }
                all.sort_by(|a, b| a["instance"].as_str().cmp(&b["instance"].as_str()));
                mine[key] = Value::Array(all);
            }
            Ok(mine)
        })
    }
    /// Every worker's open tasks, added up by task list.
    fn task_lists(&self) -> BoxFuture<'_, Result<Vec<Value>, HostError>> {
        Box::pin(async move {
            let mut lists = self.inner.task_lists().await?;
            let fwd = self.fwd.clone();
            let theirs = ask_all(self.peers(), move |p| {
                let fwd = fwd.clone();
                let caller = caller();
                CALLER.scope(
                    caller,
                    async move { ask(&*fwd, &p, Method::GET, "/tasklists", None).await },
                )
            })
            .await?;
            for t in theirs {
                for l in t["taskLists"].as_array().into_iter().flatten() {
                    match lists.iter_mut().find(|m| m["name"] == l["name"]) {
                        Some(m) => m["open"] = json!(m["open"].as_u64().unwrap_or(0) + l["open"].as_u64().unwrap_or(0)),
                        None => lists.push(l.clone()),
                    }
                }
            }
            Ok(lists)
        })
    }
    fn poll(
        &self,
        list: String,
        worker: Option<String>,
        wait: Duration,
    ) -> BoxFuture<'_, Result<Option<Value>, HostError>> {
        self.inner.poll(list, worker, wait)
    }
    fn answer(&self, token: String, answer: Answer) -> BoxFuture<'_, Result<Answered, HostError>> {
        self.inner.answer(token, answer)
    }
    fn breakpoints(&self) -> Result<Vec<(String, Vec<Breakpoint>)>, HostError> {
        self.inner.breakpoints()
    }
    fn set_breakpoints(
        &self,
        definition: String,
        breakpoints: Vec<Breakpoint>,
    ) -> BoxFuture<'_, Result<(), HostError>> {
        self.inner.set_breakpoints(definition, breakpoints)
    }
    fn resume(&self, id: String, step: bool) -> BoxFuture<'_, Result<(), HostError>> {
        self.inner.resume(id, step)
    }
    fn members(&self) -> Result<Value, HostError> {
        self.inner.members()
    }
    fn locate(&self, id: &str) -> BoxFuture<'_, Whereabouts> {
        self.inner.locate(id)
    }
    fn peers(&self) -> Option<Vec<String>> {
        self.inner.peers()
    }
    fn health(&self) -> Value {
        self.inner.health()
    }
}

/// Whether the request was forwarded by another worker.
pub(crate) fn forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED)
}
