//! Requests in a group of workers that each hold a share of the instances (`sm4c serve --kafka`).
//!
//! - A request about one instance (`/instances/{id}…`, a task answer, the inspector's instance
//!   page, `POST /instances`) is answered by the worker that holds the instance: the worker that
//!   receives it asks its [`Backend::locate`] and forwards the request there, with the header
//!   [`FORWARDED`], and returns the answer. So is a request about one schedule
//!   (`/schedules/{id}…`, `POST /schedules`): a schedule lives on the partition its id hashes to,
//!   as an instance of that id would.
//! - A listing (`GET /instances`, the inspector's lists and searches, `GET /tasklists`,
//!   `POST /events/explain`, `GET /schedules`) asks every worker ([`Backend::peers`]) for its
//!   share and merges.
//!
//! A request that carries [`FORWARDED`] is answered where it lands: it is never forwarded again.
//! The worker that holds nothing of it answers 503 (say, when the partition moved meanwhile).
//!
//! A write (a start, a cancel, a task answer) is not refused when the worker that holds its
//! instance does not answer (killed, say), answers 503 (it holds it no more), or none holds it
//! now (the group is rebalancing): the log is the source of truth, and any worker can append the
//! command to it. The worker that received it runs it here, marked [`Write::not_owner`], which appends it, then follows the
//! partition to its next owner and asks it again, with the same request id ([`WRITE_REQUEST`], so
//! that a start still answers 201 only to the request that created the instance), until it has
//! decided, or [`FAILOVER_WAIT`] has passed: then it answers 202 Accepted (the command is in the
//! log and will be decided). Reads still answer 503 then: they need the owner's memory.
//!
//! A worker never passes its caller's credentials on (`Authorization`, cookies): with
//! authentication on, it authenticates to the other worker with the group's own
//! [`PeerToken`](crate::auth::PeerToken) ([`Peering`]) and names the role its caller authenticated
//! with ([`crate::auth::CALLER_ROLE`]), which the other worker trusts only beside a valid peer
//! token. It sends the peer token over plain `http://` only to a loopback address, or when told
//! to (`--insecure-plain-http`): anyone on the network path could read it and act as any caller.

use crate::auth::{Authenticated, PeerToken, Role, CALLER_ROLE, PEER_TOKEN};
use crate::errors::Unavailable;
use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sm4c_host::service::{
    writing, Answered, Backend, BatchOp, HostError, SentPage, Stored, Summary, Whereabouts, Write,
};
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

/// The header of a forwarded write: the client request's id ([`Write::request`]), the same on
/// every worker that runs it.
pub const WRITE_REQUEST: &str = "sm4c-write-request";

/// The header of a forwarded write whose command is in the log already ([`Write::appended`]).
pub const WRITE_APPENDED: &str = "sm4c-write-appended";

/// How long a write whose instance's owner did not answer waits for another worker to take the
/// instance over and decide it, once appended, before it answers 202 Accepted: the Kafka host's
/// own bound on a write (30 s), well beyond a rebalance (the consumers' session timeout, 6 s by
/// default in sm4c, then the new owner's restore).
pub const FAILOVER_WAIT: Duration = Duration::from_secs(30);

/// How long [`failover`] waits: [`FAILOVER_WAIT`], shorter in this crate's tests (which see the
/// bound pass).
fn failover_wait() -> Duration {
    if cfg!(test) {
        Duration::from_secs(2)
    } else {
        FAILOVER_WAIT
    }
}

/// How often a write appended during a failover looks for the instance's next owner.
const FAILOVER_POLL: Duration = Duration::from_millis(100);

/// Whether a request is a write about one instance that can be appended to the log by a worker
/// that does not hold the instance: a start, a cancel, a task answer.
fn appendable(method: &Method, path: &str) -> bool {
    if method != Method::POST {
        return false;
    }
    let task_answer = path.strip_prefix("/tasks/").is_some_and(|rest| {
        rest.starts_with("send-task-")
            || rest
                .split_once('/')
                .is_some_and(|(_, what)| ["complete", "fail", "heartbeat"].contains(&what))
    });
    path == "/instances" || (path.starts_with("/instances/") && path.ends_with("/cancel")) || task_answer
}

/// Sends a request to another worker's HTTP API. `sm4c serve` gives one built on its HTTP client
/// (with the TLS roots it trusts); an error is why the worker did not answer.
pub trait Forward: Send + Sync + 'static {
    /// Sends `req` (its URI absolute) and gives the answer.
    fn send(&self, req: axum::http::Request<Bytes>) -> BoxFuture<'static, Result<axum::http::Response<Bytes>, String>>;
}

/// How this worker authenticates to the others of its group.
#[derive(Clone, Debug, Default)]
pub struct Peering {
    /// The group's peer token, sent with every request to another worker; `None` when
    /// authentication is off (then the caller's role is not sent either: nobody checks it).
    pub token: Option<PeerToken>,
    /// Whether the peer token may go to a worker whose URL is plain `http://` beyond loopback
    /// (`--insecure-plain-http`).
    pub plain_http: bool,
}

impl Peering {
    /// The headers that authenticate a request to the worker at `url` for a caller of `role`, or
    /// why it must not be sent there.
    fn headers(&self, url: &Uri, role: Option<Role>) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
        let Some(token) = &self.token else {
            return Ok(Vec::new());
        };
        if url.scheme_str() != Some("https") && !self.plain_http && !url.host().is_some_and(is_loopback) {
            let base = format!(
                "{}://{}",
                url.scheme_str().unwrap_or("http"),
                url.authority().map(|a| a.as_str()).unwrap_or_default()
            );
            return Err(format!(
                "refusing to send the group's peer token to {base} over plain HTTP: anyone on the network \
                 path could read it and act as any caller. Serve the workers over HTTPS ([server.tls]) and \
                 advertise https:// URLs, or pass --insecure-plain-http"
            ));
        }
        let mut out = vec![(HeaderName::from_static(PEER_TOKEN), token.header())];
        if let Some(r) = role {
            out.push((
                HeaderName::from_static(CALLER_ROLE),
                HeaderValue::from_static(r.as_str()),
            ));
        }
        Ok(out)
    }
}

impl Peering {
    /// Why a request must not be sent to the worker at `base`, if it must not.
    fn allows(&self, base: &str) -> Result<(), String> {
        let uri = base.parse::<Uri>().map_err(|e| format!("{base:?}: {e}"))?;
        self.headers(&uri, None).map(|_| ())
    }
}

/// Whether a URL's host is this machine: `localhost`, or a loopback address.
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The request being answered.
#[derive(Clone, Default)]
struct Caller {
    /// The role it authenticated with (none when authentication is off), named to the other
    /// workers it asks.
    role: Option<Role>,
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
pub(crate) async fn forwarding(
    State((h, fwd, peering)): State<(Api, Arc<dyn Forward>, Peering)>,
    req: Request,
    next: Next,
) -> Response {
    let caller = Caller {
        role: req.extensions().get::<Authenticated>().map(|a| a.0),
        forwarded: req.headers().contains_key(FORWARDED),
    };
    if caller.forwarded {
        let w = Write {
            request: req
                .headers()
                .get(WRITE_REQUEST)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            not_owner: false,
            appended: req.headers().contains_key(WRITE_APPENDED),
        };
        return CALLER.scope(caller, writing(w, next.run(req))).await;
    }
    // Only another worker says what a write is ([`Sendable::forwarded`]).
    let mut req = req;
    for h in [WRITE_REQUEST, WRITE_APPENDED] {
        req.headers_mut().remove(h);
    }
    let (req, id) = match about(&h, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Some(id) = id else {
        return CALLER.scope(caller, next.run(req)).await;
    };
    if appendable(req.method(), req.uri().path()) {
        return write(&h, &*fwd, &peering, caller, &id, req, next).await;
    }
    match h.locate(&id).await {
        Whereabouts::Here => CALLER.scope(caller, next.run(req)).await,
        Whereabouts::Unavailable(why) => Unavailable(why).into_response(),
        Whereabouts::At(url) => match peering.allows(&url) {
            Err(why) => Unavailable(format!("instance {id:?} is held by the worker at {url}: {why}")).into_response(),
            Ok(()) => forward_to(&*fwd, &peering, caller.role, &id, &url, req).await,
        },
    }
}

/// A write about instance `id`: run here if it is held here, forwarded to the worker that holds
/// it otherwise, and appended here if that worker does not answer or none holds it now
/// ([`failover`]). Every run of it carries one request id.
async fn write(
    h: &Api,
    fwd: &dyn Forward,
    peering: &Peering,
    caller: Caller,
    id: &str,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let body = match to_bytes(body, crate::MAX_BODY + 1).await {
        Ok(b) => b,
        Err(_) => return crate::errors::PayloadTooLarge(crate::MAX_BODY).into_response(),
    };
    let req = Sendable {
        parts,
        body,
        request: sm4c_host::service::new_id("request"),
    };
    match h.locate(id).await {
        Whereabouts::Here => {
            CALLER
                .scope(caller, writing(req.write(false, false), next.run(req.request())))
                .await
        }
        Whereabouts::Unavailable(why) => failover(h, fwd, peering, caller, id, &req, next, why).await,
        Whereabouts::At(url) => match peering.allows(&url) {
            Err(why) => Unavailable(format!("instance {id:?} is held by the worker at {url}: {why}")).into_response(),
            Ok(()) => match timed(forward(fwd, peering, caller.role, &url, req.forwarded(false)), id, &url).await {
                // It no longer holds the instance (the partition moved meanwhile), or could not
                // write to Kafka: appended here all the same.
                Ok(r) if r.status() == StatusCode::SERVICE_UNAVAILABLE => {
                    let why = format!(
                        "instance {id:?} is held by the worker at {url}, which answered: {}",
                        message(r).await
                    );
                    failover(h, fwd, peering, caller, id, &req, next, why).await
                }
                Ok(r) => answered_by(r, &url),
                Err(e) => {
                    let why = format!("instance {id:?} is held by the worker at {url}, which did not answer: {e}");
                    failover(h, fwd, peering, caller, id, &req, next, why).await
                }
            },
        },
    }
}

/// `f`, a write forwarded to the worker at `url`, with how long it took in the debug log: one of
/// the hops of a write's latency (bench/kafka/latency.py reads it).
async fn timed<T>(f: impl Future<Output = T>, id: &str, url: &str) -> T {
    let t0 = std::time::Instant::now();
    let r = f.await;
    tracing::debug!(
        instance = id,
        to = url,
        forwarded_us = t0.elapsed().as_micros() as u64,
        "write forwarded"
    );
    r
}

/// A write kept whole, to be run more than once: here, and at the workers asked.
struct Sendable {
    parts: axum::http::request::Parts,
    body: Bytes,
    /// The client request's id ([`Write::request`]).
    request: String,
}

impl Sendable {
    /// The request, to run here.
    fn request(&self) -> Request {
        Request::from_parts(self.parts.clone(), Body::from(self.body.clone()))
    }

    /// What the backend learns of it when it runs here.
    fn write(&self, not_owner: bool, appended: bool) -> Write {
        Write {
            request: Some(self.request.clone()),
            not_owner,
            appended,
        }
    }

    /// The request, to forward: marked with its id, and whether it is in the log already.
    fn forwarded(&self, appended: bool) -> Request {
        let mut r = self.request();
        if let Ok(v) = HeaderValue::from_str(&self.request) {
            r.headers_mut().insert(WRITE_REQUEST, v);
        }
        if appended {
            r.headers_mut().insert(WRITE_APPENDED, HeaderValue::from_static("1"));
        }
        r
    }
}

/// A write whose instance's owner did not answer (`why`), or that no worker holds now: appended
/// to the log here, then asked again of the instance's next owner (or run here again, once the
/// instance is held here) until one decides it, within [`FAILOVER_WAIT`]; 202 Accepted after
/// that ([`failover_wait`]). What is refused before it is appended (an unknown definition, say)
/// is answered at once.
#[allow(clippy::too_many_arguments)]
async fn failover(
    h: &Api,
    fwd: &dyn Forward,
    peering: &Peering,
    caller: Caller,
    id: &str,
    req: &Sendable,
    next: Next,
    why: String,
) -> Response {
    use tokio::time::timeout_at;
    let deadline = tokio::time::Instant::now() + failover_wait();
    let here = |appended: bool| {
        CALLER.scope(
            caller.clone(),
            writing(req.write(true, appended), next.clone().run(req.request())),
        )
    };
    let first = here(false).await;
    if first.status() != StatusCode::ACCEPTED {
        return match first.status() {
            // Not appended (Kafka did not take it): why neither worker took it.
            StatusCode::SERVICE_UNAVAILABLE => Unavailable(format!(
                "{why}; and this worker could not take it: {}",
                message(first).await
            ))
            .into_response(),
            _ => first,
        };
    }
    loop {
        tokio::time::sleep(FAILOVER_POLL).await;
        let answer = match timeout_at(deadline, h.locate(id)).await {
            Err(_) => return first,
            Ok(Whereabouts::Here) => timeout_at(deadline, here(true)).await.ok(),
            Ok(Whereabouts::At(url)) if peering.allows(&url).is_ok() => {
                match timeout_at(deadline, forward(fwd, peering, caller.role, &url, req.forwarded(true))).await {
                    Ok(Ok(r)) => Some(answered_by(r, &url)),
                    _ => None,
                }
            }
            Ok(_) => None,
        };
        match answer {
            // Decided (or refused by the owner, which knows).
            Some(r) if ![StatusCode::ACCEPTED, StatusCode::SERVICE_UNAVAILABLE].contains(&r.status()) => return r,
            _ if tokio::time::Instant::now() >= deadline => return first,
            _ => {}
        }
    }
}

/// The `message` of an error answer (its body, when it is not one).
async fn message(r: Response) -> String {
    let body = to_bytes(r.into_body(), 1 << 16).await.unwrap_or_default();
    serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned())
}

/// An answer another worker (at `url`) gave, marked [`ANSWERED_BY`].
fn answered_by(mut r: Response, url: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(url) {
        r.headers_mut().insert(ANSWERED_BY, v);
    }
    r
}

/// `req` forwarded to the worker at `url`, which holds instance `id`, and its answer marked
/// [`ANSWERED_BY`].
async fn forward_to(
    fwd: &dyn Forward,
    peering: &Peering,
    role: Option<Role>,
    id: &str,
    url: &str,
    req: Request,
) -> Response {
    match forward(fwd, peering, role, url, req).await {
        Ok(r) => answered_by(r, url),
        Err(e) => Unavailable(format!(
            "instance {id:?} is held by the worker at {url}, which did not answer: {e}"
        ))
        .into_response(),
    }
}

/// The instance a request is about, if it is about one. A start without an id gets its id here,
/// written into its body, so that it goes to the worker that will hold the instance.
async fn about(h: &Api, req: Request) -> Result<(Request, Option<String>), Response> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if let Some(rest) = path.strip_prefix("/instances/") {
        let rest = decode(rest);
        let id = ["/history", "/cancel", "/resume", "/step", "/migrate", "/redrive"]
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
    if let Some(id) = schedule_of(&path) {
        return Ok((req, Some(id)));
    }
    if path == "/ui/api/instance" {
        let id = req.uri().query().and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("id="))
                .map(|v| decode(&v.replace('+', " ")))
        });
        return Ok((req, id));
    }
    let posted = method == Method::POST
        && (path == "/instances" || path == "/schedules" || path.starts_with("/tasks/send-task-"));
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
        if path == "/schedules" {
            // Without a string id it is refused wherever it lands.
            id = doc.get("id").and_then(Value::as_str).map(str::to_string);
        } else if path == "/instances" {
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

/// The schedule a `/schedules/{id}…` path is about. A schedule lives on the partition its id hashes
/// to, as an instance of that id would: its owner answers for it.
fn schedule_of(path: &str) -> Option<String> {
    let rest = decode(path.strip_prefix("/schedules/")?);
    let id = ["/pause", "/resume", "/trigger", "/backfill"]
        .iter()
        .find_map(|s| rest.strip_suffix(s))
        .unwrap_or(&rest);
    Some(id.to_string())
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

/// Headers not passed on in an answer (hop by hop, or set again for the new message).
const DROPPED: [HeaderName; 5] = [
    header::HOST,
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::CONTENT_LENGTH,
    header::TE,
];

/// Headers of a request not passed on to another worker besides [`DROPPED`]: the caller's
/// credentials (the worker authenticates with its own, [`Peering`]) and what only this worker may
/// say about the request.
fn withheld(name: &HeaderName) -> bool {
    DROPPED.contains(name)
        || [header::AUTHORIZATION, header::PROXY_AUTHORIZATION, header::COOKIE].contains(name)
        || [PEER_TOKEN, CALLER_ROLE, FORWARDED].contains(&name.as_str())
}

/// How long a forwarded request may take: a start waits up to 30 s for its owner to apply it.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);

/// Sends `req` to the worker at `base`, marked [`FORWARDED`] and authenticated with `peering`
/// for a caller of `role`, without the caller's credentials.
async fn forward(
    fwd: &dyn Forward,
    peering: &Peering,
    role: Option<Role>,
    base: &str,
    req: Request,
) -> Result<Response, String> {
    let (parts, body) = req.into_parts();
    let target = format!(
        "{}{}",
        base.trim_end_matches('/'),
        parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
    );
    let uri = target.parse::<Uri>().map_err(|e| format!("{target:?}: {e}"))?;
    let credentials = peering.headers(&uri, role)?;
    let body = to_bytes(body, crate::MAX_BODY + 1).await.map_err(|e| e.to_string())?;
    let mut out = axum::http::Request::builder().method(parts.method).uri(uri);
    for (k, v) in &parts.headers {
        if !withheld(k) {
            out = out.header(k, v);
        }
    }
    for (k, v) in credentials {
        out = out.header(k, v);
    }
    let out = out.header(FORWARDED, "1").body(body).map_err(|e| e.to_string())?;
    let answer = fwd.send(out).await?;
    let (mut parts, body) = answer.into_parts();
    for h in &DROPPED {
        parts.headers.remove(h);
    }
    Ok(Response::from_parts(parts, Body::from(body)))
}

/// Asks the worker at `base` (a request marked [`FORWARDED`], authenticated with `peering` for the
/// caller of the request being answered) and reads its JSON answer.
async fn ask(
    fwd: &dyn Forward,
    peering: &Peering,
    base: &str,
    method: Method,
    path_and_query: &str,
    body: Option<&Value>,
) -> Result<Value, HostError> {
    let url = format!("{}{path_and_query}", base.trim_end_matches('/'));
    let unavailable = |why: String| HostError::Unavailable(format!("the worker at {base} did not answer: {why}"));
    let uri = url.parse::<Uri>().map_err(|e| unavailable(e.to_string()))?;
    let credentials = peering
        .headers(&uri, caller().role)
        .map_err(|why| HostError::Unavailable(format!("the worker at {base} was not asked: {why}")))?;
    let mut req = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header(FORWARDED, "1");
    for (k, v) in credentials {
        req = req.header(k, v);
    }
    let body = match body {
        Some(b) => {
            // An event to explain, in the structured mode; or a batch's dry run.
            let kind = match path_and_query.starts_with("/events/") {
                true => "application/cloudevents+json",
                false => "application/json",
            };
            req = req.header(header::CONTENT_TYPE, kind);
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

/// Every byte but the unreserved characters of RFC 3986 as `%XX`: a path segment or a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let enc = encode;
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
    pub peering: Peering,
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

/// How long a new batch's answer waits for every partition to decide it, and a stop's for every
/// partition to stop.
const BATCH_WAIT: Duration = Duration::from_secs(10);

impl Clustered {
    /// Asks every peer the same request, for its share.
    async fn ask_peers(
        &self,
        method: Method,
        path: &'static str,
        body: Option<Value>,
    ) -> Result<Vec<Value>, HostError> {
        let (fwd, peering) = (self.fwd.clone(), self.peering.clone());
        ask_all(self.peers(), move |p| {
            let (fwd, peering, method, body) = (fwd.clone(), peering.clone(), method.clone(), body.clone());
            CALLER.scope(caller(), async move {
                ask(&*fwd, &peering, &p, method, path, body.as_ref()).await
            })
        })
        .await
    }

    /// Batch `id` from every worker's shares; 404 when none has a share of it.
    async fn batch(&self, id: &str) -> Result<Value, HostError> {
        let mut all = vec![self.inner.batches(BatchOp::Get(id.to_string())).await?];
        let (fwd, peering) = (self.fwd.clone(), self.peering.clone());
        let path = format!("/batches/{}", encode(id));
        all.extend(
            ask_all(self.peers(), move |p| {
                let (fwd, peering, path) = (fwd.clone(), peering.clone(), path.clone());
                CALLER.scope(caller(), async move {
                    ask(&*fwd, &peering, &p, Method::GET, &path, None).await
                })
            })
            .await?,
        );
        sm4c_host::batch::render(id, &sm4c_host::batch::shares_of(&all), true)
            .ok_or_else(|| HostError::UnknownBatch(id.to_string()))
    }

    /// Batch `id` once `done` holds of it, or as it is after [`BATCH_WAIT`].
    async fn batch_when(&self, id: &str, done: impl Fn(&Value) -> bool) -> Result<Value, HostError> {
        let deadline = tokio::time::Instant::now() + BATCH_WAIT;
        loop {
            match self.batch(id).await {
                Ok(v) if done(&v) || tokio::time::Instant::now() >= deadline => return Ok(v),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
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
    fn default_version(&self, id: &str) -> Option<String> {
        self.inner.default_version(id)
    }
    fn migrate(
        &self,
        id: String,
        version: String,
        states: std::collections::BTreeMap<String, String>,
        dry_run: bool,
    ) -> BoxFuture<'_, Result<sm4c_runtime::engine::migrate::MigrationPlan, HostError>> {
        self.inner.migrate(id, version, states, dry_run)
    }
    fn redrive(&self, id: String, update: Option<String>, dry_run: bool) -> BoxFuture<'_, Result<Value, HostError>> {
        self.inner.redrive(id, update, dry_run)
    }
    fn set_default_version(&self, id: String, version: Option<String>) -> BoxFuture<'_, Result<(), HostError>> {
        self.inner.set_default_version(id, version)
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
            let (fwd, peering) = (self.fwd.clone(), self.peering.clone());
            let pages = ask_all(self.peers(), move |p| {
                let (fwd, peering, q) = (fwd.clone(), peering.clone(), q.clone());
                let caller = caller();
                CALLER.scope(caller, async move {
                    ask(&*fwd, &peering, &p, Method::GET, &format!("/instances?{q}"), None).await
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
    fn upgrade_check(&self, new: Arc<Machine>) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async move {
            let mine = self.inner.upgrade_check(new.clone()).await?;
            let (fwd, peering) = (self.fwd.clone(), self.peering.clone());
            let path = format!("/definitions/{}/upgrade-check", encode(&new.id));
            let doc = Arc::new(new.source.clone());
            let theirs = ask_all(self.peers(), move |p| {
                let (fwd, peering, doc, path) = (fwd.clone(), peering.clone(), doc.clone(), path.clone());
                let caller = caller();
                CALLER.scope(caller, async move {
                    ask(&*fwd, &peering, &p, Method::POST, &path, Some(&doc)).await
                })
            })
            .await?;
            let mut all = vec![mine];
            all.extend(theirs);
            Ok(sm4c_host::upgrade::merge(all))
        })
    }
    fn explain(&self, event: Value) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async move {
            let (fwd, peering) = (self.fwd.clone(), self.peering.clone());
            if let Some(target) = sm4c_runtime::engine::event::attribute_text(&event, "sm4cinstanceid") {
                return match self.inner.locate(&target).await {
                    _ if caller().forwarded => self.inner.explain(event).await,
                    Whereabouts::Here => self.inner.explain(event).await,
                    Whereabouts::At(url) => {
                        ask(&*fwd, &peering, &url, Method::POST, "/events/explain", Some(&event)).await
                    }
                    Whereabouts::Unavailable(why) => Err(HostError::Unavailable(why)),
                };
            }
            let mut mine = self.inner.explain(event.clone()).await?;
            let event = Arc::new(event);
            let theirs = ask_all(self.peers(), move |p| {
                let (fwd, peering, event) = (fwd.clone(), peering.clone(), event.clone());
                let caller = caller();
                CALLER.scope(caller, async move {
                    ask(&*fwd, &peering, &p, Method::POST, "/events/explain", Some(&event)).await
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
            let (fwd, peering) = (self.fwd.clone(), self.peering.clone());
            let theirs = ask_all(self.peers(), move |p| {
                let (fwd, peering) = (fwd.clone(), peering.clone());
                let caller = caller();
                CALLER.scope(caller, async move {
                    ask(&*fwd, &peering, &p, Method::GET, "/tasklists", None).await
                })
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
    /// A listing covers every worker's schedules; the rest is about one schedule, which the
    /// request was forwarded to its owner for ([`forwarding`]).
    fn schedules(&self, op: sm4c_host::service::ScheduleOp) -> BoxFuture<'_, Result<Value, HostError>> {
        use sm4c_host::service::ScheduleOp;
        if op != ScheduleOp::List {
            return self.inner.schedules(op);
        }
        Box::pin(async move {
            let mut mine = self.inner.schedules(ScheduleOp::List).await?;
            let (fwd, peering) = (self.fwd.clone(), self.peering.clone());
            let theirs = ask_all(self.peers(), move |p| {
                let (fwd, peering) = (fwd.clone(), peering.clone());
                CALLER.scope(caller(), async move {
                    ask(&*fwd, &peering, &p, Method::GET, "/schedules", None).await
                })
            })
            .await?;
            let mut all: Vec<Value> = mine["schedules"].as_array_mut().map(std::mem::take).unwrap_or_default();
            for page in theirs {
                all.extend(page["schedules"].as_array().into_iter().flatten().cloned());
            }
            all.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
            // A partition that moved between two answers is in both.
            all.dedup_by(|a, b| a["id"] == b["id"]);
            Ok(json!({"schedules": all}))
        })
    }
    /// Each worker holds the shares of its partitions: a batch is answered from every worker's
    /// shares ([`sm4c_host::batch::render`]), a dry run sums every worker's, a listing merges
    /// them by batch. A new batch is broadcast to every partition by the worker that takes the
    /// request, and answered once every partition has decided it (or [`BATCH_WAIT`] passed); a
    /// stop, once no partition applies it any more (or [`BATCH_WAIT`] passed).
    fn batches(&self, op: BatchOp) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async move {
            if caller().forwarded {
                return self.inner.batches(op).await;
            }
            match op {
                BatchOp::Create(body) => {
                    if body["dryRun"] == json!(true) {
                        let mut all = vec![self.inner.batches(BatchOp::Create(body.clone())).await?];
                        all.extend(self.ask_peers(Method::POST, "/batches", Some(body)).await?);
                        return Ok(sm4c_host::batch::merge_dry_runs(&all));
                    }
                    let v = self.inner.batches(BatchOp::Create(body)).await?;
                    let id = v["id"].as_str().unwrap_or_default().to_string();
                    let whole = self
                        .batch_when(&id, |v| {
                            v["partitions"].as_array().map_or(0, Vec::len) as u64
                                >= v["partitions"][0]["partitions"].as_u64().unwrap_or(u64::MAX)
                        })
                        .await;
                    // Sent to every partition already: a worker that does not answer (its
                    // partitions move) does not make the request fail. The answer says what this
                    // worker's partitions decided, with the id to follow the batch by.
                    match whole {
                        Ok(v) => Ok(v),
                        Err(_) => self.inner.batches(BatchOp::Get(id)).await,
                    }
                }
                BatchOp::Get(id) => self.batch(&id).await,
                BatchOp::Cancel(id) => {
                    // Unknown to every worker: 404, and nothing is broadcast.
                    self.batch(&id).await?;
                    self.inner.batches(BatchOp::Cancel(id.clone())).await?;
                    self.batch_when(&id, |v| v["running"] == json!(false)).await
                }
                BatchOp::List => {
                    let mut all = vec![self.inner.batches(BatchOp::List).await?];
                    all.extend(self.ask_peers(Method::GET, "/batches", None).await?);
                    let mut by: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
                    for b in all.iter().flat_map(|a| a["batches"].as_array().into_iter().flatten()) {
                        let id = b["id"].as_str().unwrap_or_default().to_string();
                        by.entry(id).or_default().push(b.clone());
                    }
                    let mut out: Vec<Value> = by
                        .iter()
                        .filter_map(|(id, answers)| {
                            sm4c_host::batch::render(id, &sm4c_host::batch::shares_of(answers), false)
                        })
                        .collect();
                    // Newest first, as the SQLite server lists them.
                    out.sort_by(|a, b| {
                        (b["createdAt"].as_str(), b["id"].as_str()).cmp(&(a["createdAt"].as_str(), a["id"].as_str()))
                    });
                    Ok(json!({"batches": out}))
                }
            }
        })
    }
    fn health(&self) -> Value {
        self.inner.health()
    }
}

/// Whether the request was forwarded by another worker.
pub(crate) fn forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Auth, Role};
    use axum::Router;
    use std::sync::Mutex;

    /// Requests over HTTP/1.1 with hyper's client connection, one connection each.
    struct Http;

    impl Forward for Http {
        fn send(
            &self,
            req: axum::http::Request<Bytes>,
        ) -> BoxFuture<'static, Result<axum::http::Response<Bytes>, String>> {
            Box::pin(async move {
                let authority = req.uri().authority().map(|a| a.to_string()).ok_or("no authority")?;
                let stream = tokio::net::TcpStream::connect(&authority)
                    .await
                    .map_err(|e| e.to_string())?;
                let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                let (mut parts, body) = req.into_parts();
                parts.headers.insert(
                    header::HOST,
                    HeaderValue::from_str(&authority).map_err(|e| e.to_string())?,
                );
                parts.uri = parts
                    .uri
                    .path_and_query()
                    .map(|p| p.as_str())
                    .unwrap_or("/")
                    .parse()
                    .map_err(|e: axum::http::uri::InvalidUri| e.to_string())?;
                let answer = sender
                    .send_request(axum::http::Request::from_parts(parts, Body::from(body)))
                    .await
                    .map_err(|e| e.to_string())?;
                let (parts, body) = answer.into_parts();
                let body = to_bytes(Body::new(body), usize::MAX).await.map_err(|e| e.to_string())?;
                Ok(axum::http::Response::from_parts(parts, body))
            })
        }
    }

    /// A real HTTP server on loopback that records the headers of every request it receives and
    /// answers `{"instances": []}`. Its base URL, and what it saw.
    async fn recorder() -> (String, Arc<Mutex<Vec<HeaderMap>>>) {
        let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
        let log = seen.clone();
        let app = Router::new().fallback(move |headers: HeaderMap| {
            let log = log.clone();
            async move {
                log.lock().expect("log").push(headers);
                axum::Json(json!({"instances": []}))
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        (base, seen)
    }

    const PEER: &str = "peer-s3cret-0123456789";

    fn peering() -> Peering {
        Peering {
            token: Some(PeerToken::new(PEER).expect("peer token")),
            plain_http: false,
        }
    }

    /// What the other worker must never see: the caller's credentials, and a peer token or role
    /// the caller wrote itself.
    fn callers_request() -> Request {
        axum::http::Request::post("/instances/o-1/cancel")
            .header(header::AUTHORIZATION, "Bearer caller-s3cret")
            .header(header::PROXY_AUTHORIZATION, "Basic caller-s3cret")
            .header(header::COOKIE, "session=caller-s3cret")
            .header(PEER_TOKEN, "forged-by-the-caller")
            .header(CALLER_ROLE, "admin")
            .header("x-request-id", "r-1")
            .body(Body::from("{}"))
            .expect("request")
    }

    fn only(seen: &Mutex<Vec<HeaderMap>>) -> HeaderMap {
        let seen = seen.lock().expect("log");
        assert_eq!(seen.len(), 1, "{seen:?}");
        seen[0].clone()
    }

    #[test]
    fn a_schedules_requests_are_about_the_schedule_its_path_names() {
        assert_eq!(super::schedule_of("/schedules/nightly").as_deref(), Some("nightly"));
        for op in ["pause", "resume", "trigger", "backfill"] {
            assert_eq!(
                super::schedule_of(&format!("/schedules/a.b-c/{op}")).as_deref(),
                Some("a.b-c")
            );
        }
        assert_eq!(super::schedule_of("/schedules/odd%20id").as_deref(), Some("odd id"));
        assert_eq!(super::schedule_of("/schedules"), None);
        assert_eq!(super::schedule_of("/instances/x"), None);
    }

    #[tokio::test]
    async fn a_forwarded_request_carries_the_peer_token_and_the_callers_role_never_the_callers_token() {
        let (base, seen) = recorder().await;
        let r = forward(&Http, &peering(), Some(Role::Operate), &base, callers_request())
            .await
            .expect("forwarded");
        assert_eq!(r.status(), 200);
        let h = only(&seen);
        assert_eq!(h.get(PEER_TOKEN).and_then(|v| v.to_str().ok()), Some(PEER), "{h:?}");
        assert_eq!(
            h.get(CALLER_ROLE).and_then(|v| v.to_str().ok()),
            Some("operate"),
            "{h:?}"
        );
        assert_eq!(h.get_all(PEER_TOKEN).iter().count(), 1, "{h:?}");
        assert_eq!(h.get_all(CALLER_ROLE).iter().count(), 1, "{h:?}");
        assert!(h.contains_key(FORWARDED), "{h:?}");
        for gone in [header::AUTHORIZATION, header::PROXY_AUTHORIZATION, header::COOKIE] {
            assert!(!h.contains_key(&gone), "{gone} passed on: {h:?}");
        }
        assert!(
            !format!("{h:?}").contains("caller-s3cret"),
            "the caller's secret reached the other worker: {h:?}"
        );
        // What is not a credential goes on as it came.
        assert_eq!(h.get("x-request-id").and_then(|v| v.to_str().ok()), Some("r-1"));
    }

    #[tokio::test]
    async fn a_listing_asks_the_others_with_the_peer_token_and_the_callers_role() {
        let (base, seen) = recorder().await;
        let caller = Caller {
            role: Some(Role::Read),
            forwarded: false,
        };
        let page = CALLER
            .scope(
                caller,
                ask(&Http, &peering(), &base, Method::GET, "/instances?limit=1", None),
            )
            .await
            .expect("asked");
        assert_eq!(page, json!({"instances": []}));
        let h = only(&seen);
        assert_eq!(h.get(PEER_TOKEN).and_then(|v| v.to_str().ok()), Some(PEER), "{h:?}");
        assert_eq!(h.get(CALLER_ROLE).and_then(|v| v.to_str().ok()), Some("read"), "{h:?}");
        assert!(!h.contains_key(header::AUTHORIZATION), "{h:?}");
    }

    #[tokio::test]
    async fn without_authentication_nothing_is_sent_for_the_caller() {
        let (base, seen) = recorder().await;
        forward(&Http, &Peering::default(), None, &base, callers_request())
            .await
            .expect("forwarded");
        let h = only(&seen);
        for gone in [header::AUTHORIZATION, header::COOKIE] {
            assert!(!h.contains_key(&gone), "{h:?}");
        }
        assert!(!h.contains_key(PEER_TOKEN) && !h.contains_key(CALLER_ROLE), "{h:?}");
    }

    #[test]
    fn the_peer_token_goes_over_plain_http_only_to_loopback_or_when_allowed() {
        let p = peering();
        for ok in [
            "https://w2.internal:8080",
            "http://127.0.0.1:8080",
            "http://127.0.0.2:8080",
            "http://localhost:8080",
            "http://[::1]:8080",
        ] {
            assert_eq!(p.allows(ok), Ok(()), "{ok}");
        }
        let why = p.allows("http://w2.internal:8080/").expect_err("refused");
        assert!(
            why.starts_with("refusing to send the group's peer token to http://w2.internal:8080 over plain HTTP")
                && why.contains("--insecure-plain-http"),
            "{why}"
        );
        assert!(!why.contains(PEER), "{why}");
        assert!(p.allows("http://10.0.0.7:8080").is_err());
        let allowed = Peering {
            plain_http: true,
            ..peering()
        };
        assert_eq!(allowed.allows("http://w2.internal:8080"), Ok(()));
        assert_eq!(
            Peering::default().allows("http://w2.internal:8080"),
            Ok(()),
            "nothing to protect"
        );
    }

    #[tokio::test]
    async fn asking_a_plain_http_worker_beyond_loopback_is_refused_before_connecting() {
        // TEST-NET-1: nothing answers there; a request sent would fail another way, or hang.
        let asked = tokio::time::timeout(
            Duration::from_secs(20),
            ask(&Http, &peering(), "http://192.0.2.1:9", Method::GET, "/tasklists", None),
        )
        .await
        .expect("answered at once");
        match asked {
            Err(HostError::Unavailable(why)) => assert!(
                why.starts_with(
                    "the worker at http://192.0.2.1:9 was not asked: refusing to send the group's peer token"
                ),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
    }

    /// A worker that receives forwarded requests: what the handler learns of its caller.
    fn receiving(peer: Option<&str>) -> Router {
        let who = |req: Request| async move {
            axum::Json(json!({
                "role": req.extensions().get::<Authenticated>().map(|a| a.0.as_str()),
                "forwarded": req.headers().contains_key(FORWARDED),
            }))
        };
        let mut auth = Auth::default();
        auth.token(Role::Read, crate::auth::digest("read-token"));
        if let Some(p) = peer {
            auth.peer(PeerToken::new(p).expect("peer token").digest());
        }
        crate::auth::layer(
            Router::new().route("/instances/{*rest}", axum::routing::get(who).post(who)),
            auth,
        )
    }

    async fn serve(app: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        base
    }

    #[tokio::test]
    async fn the_receiving_worker_takes_the_callers_role_only_from_a_valid_peer_token() {
        let base = serve(receiving(Some(PEER))).await;
        let send = |method: Method, path: &str, headers: &[(&str, &str)]| {
            let mut b = axum::http::Request::builder()
                .method(method)
                .uri(format!("{base}{path}"));
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            let req = b.body(Bytes::new()).expect("request");
            async move {
                let r = Http.send(req).await.expect("answered");
                let v: Value = serde_json::from_slice(r.body()).unwrap_or(Value::Null);
                (r.status().as_u16(), v)
            }
        };
        // Forwarded with the peer token: the role it names, answered here.
        let (status, v) = send(
            Method::GET,
            "/instances/a",
            &[(PEER_TOKEN, PEER), (CALLER_ROLE, "read"), (FORWARDED, "1")],
        )
        .await;
        assert_eq!((status, &v), (200, &json!({"role": "read", "forwarded": true})));
        // The named role is the caller's: a reader may not cancel, whoever forwards it.
        let (status, v) = send(
            Method::POST,
            "/instances/a/cancel",
            &[(PEER_TOKEN, PEER), (CALLER_ROLE, "read")],
        )
        .await;
        assert_eq!(status, 403, "{v}");
        let (status, v) = send(
            Method::POST,
            "/instances/a/cancel",
            &[(PEER_TOKEN, PEER), (CALLER_ROLE, "operate")],
        )
        .await;
        assert_eq!((status, &v), (200, &json!({"role": "operate", "forwarded": true})));
        // A wrong peer token, or none with a role named: not trusted.
        let (status, v) = send(
            Method::GET,
            "/instances/a",
            &[(PEER_TOKEN, "peer-s3cret-0123456780"), (CALLER_ROLE, "admin")],
        )
        .await;
        assert_eq!(status, 401, "{v}");
        assert!(
            v.to_string().contains("peer token (sm4c-peer-token) is not valid"),
            "{v}"
        );
        let (status, _) = send(Method::GET, "/instances/a", &[(CALLER_ROLE, "admin"), (FORWARDED, "1")]).await;
        assert_eq!(status, 401, "no credentials at all");
        let (status, v) = send(Method::GET, "/instances/a", &[(PEER_TOKEN, PEER)]).await;
        assert_eq!(status, 401, "a peer request names its caller's role: {v}");
        // A client with a token of its own cannot raise its role, nor pass as a forwarded request.
        let bearer = "Bearer read-token";
        let (status, v) = send(
            Method::GET,
            "/instances/a",
            &[("authorization", bearer), (CALLER_ROLE, "admin"), (FORWARDED, "1")],
        )
        .await;
        assert_eq!((status, &v), (200, &json!({"role": "read", "forwarded": false})));
        let (status, _) = send(
            Method::POST,
            "/instances/a/cancel",
            &[("authorization", bearer), (CALLER_ROLE, "admin")],
        )
        .await;
        assert_eq!(status, 403);
        // A worker without a peer token takes no request from another.
        let lone = serve(receiving(None)).await;
        let req = axum::http::Request::get(format!("{lone}/instances/a"))
            .header(PEER_TOKEN, PEER)
            .header(CALLER_ROLE, "read")
            .body(Bytes::new())
            .expect("request");
        let r = Http.send(req).await.expect("answered");
        assert_eq!(r.status(), 401);
        assert!(String::from_utf8_lossy(r.body()).contains("no peer token configured"));
    }

    #[tokio::test]
    async fn one_worker_forwards_to_another_that_checks_the_peer_token() {
        // The forwarding side's request, as built here, is what the receiving side accepts.
        let base = serve(receiving(Some(PEER))).await;
        let r = forward(&Http, &peering(), Some(Role::Read), &base, {
            axum::http::Request::get("/instances/a")
                .header(header::AUTHORIZATION, "Bearer read-token")
                .body(Body::empty())
                .expect("request")
        })
        .await
        .expect("forwarded");
        assert_eq!(r.status(), 200);
        let v: Value = serde_json::from_slice(&to_bytes(r.into_body(), 1 << 16).await.expect("body")).expect("JSON");
        assert_eq!(v, json!({"role": "read", "forwarded": true}));
        // A group whose workers hold different peer tokens refuses the forwarded request.
        let other = Peering {
            token: Some(PeerToken::new("another-peer-token-0123").expect("peer token")),
            plain_http: false,
        };
        let r = forward(&Http, &other, Some(Role::Read), &base, {
            axum::http::Request::get("/instances/a")
                .header(header::AUTHORIZATION, "Bearer read-token")
                .body(Body::empty())
                .expect("request")
        })
        .await
        .expect("answered");
        assert_eq!(
            r.status(),
            401,
            "the caller's valid token was not passed on, and the peer token is wrong"
        );
    }

    type Log = Arc<Mutex<Vec<(String, Option<String>)>>>;

    /// One worker of a group, for the failover tests: `log` stands for the commands topic the
    /// group shares (the starts appended: id, request id). A worker that `holds` the instances
    /// decides them (the first start of an id creates it); one that does not locates them at
    /// `dead` until something is in the log, then at `next` (none: no worker holds them now).
    struct Stand {
        holds: bool,
        log: Log,
        dead: String,
        next: Option<String>,
        /// What the API said of each write run here.
        seen: Arc<Mutex<Vec<Write>>>,
    }

    fn not_here<T>() -> BoxFuture<'static, Result<T, HostError>>
    where
        T: Send + 'static,
    {
        Box::pin(async { Err(HostError::NotSupported("not in these tests".into())) })
    }

    impl Backend for Stand {
        fn define(&self, _: Value) -> BoxFuture<'_, Result<(Arc<Machine>, bool), HostError>> {
            not_here()
        }
        fn machines(&self) -> Vec<Arc<Machine>> {
            Vec::new()
        }
        fn latest(&self, _: &str) -> Option<Arc<Machine>> {
            None
        }
        fn start_instance(
            &self,
            definition: String,
            version: Option<String>,
            id: Option<String>,
            input: Value,
        ) -> BoxFuture<'_, Result<(String, bool), HostError>> {
            self.start_traced(definition, version, id, input, None)
        }
        fn start_traced(
            &self,
            definition: String,
            _: Option<String>,
            id: Option<String>,
            _: Value,
            _: Option<String>,
        ) -> BoxFuture<'_, Result<(String, bool), HostError>> {
            let w = sm4c_host::service::write();
            self.seen.lock().expect("seen").push(w.clone());
            Box::pin(async move {
                let id = id.expect("the tests name their instances");
                if definition != "saga" {
                    return Err(HostError::UnknownDefinition(definition));
                }
                let mut log = self.log.lock().expect("log");
                if !self.holds {
                    if !w.not_owner {
                        return Err(HostError::Unavailable(format!("{id:?} is not held here")));
                    }
                    log.push((id.clone(), w.request));
                    return Err(HostError::Appended(format!("the start of {id:?} is in the log")));
                }
                if !log.iter().any(|(i, _)| *i == id) {
                    log.push((id.clone(), w.request.clone()));
                }
                let creator = log.iter().find(|(i, _)| *i == id).and_then(|(_, r)| r.clone());
                Ok((id, creator.is_some() && creator == w.request))
            })
        }
        fn instance(&self, id: &str) -> Result<Option<Stored>, HostError> {
            Err(HostError::Unavailable(format!("{id:?} is not held here")))
        }
        fn list(
            &self,
            _: Option<&str>,
            _: Option<&str>,
            _: i64,
            _: usize,
        ) -> BoxFuture<'_, Result<Vec<Summary>, HostError>> {
            not_here()
        }
        fn history(&self, _: &str, _: i64, _: usize) -> BoxFuture<'_, Result<Vec<(i64, Entry)>, HostError>> {
            not_here()
        }
        fn cancel(&self, _: String) -> BoxFuture<'_, Result<(), HostError>> {
            not_here()
        }
        fn deliver(&self, _: Value) -> BoxFuture<'_, Result<Value, HostError>> {
            not_here()
        }
        fn sent(&self, _: &str, _: usize) -> BoxFuture<'_, Result<SentPage, HostError>> {
            not_here()
        }
        fn explain(&self, _: Value) -> BoxFuture<'_, Result<Value, HostError>> {
            not_here()
        }
        fn task_lists(&self) -> BoxFuture<'_, Result<Vec<Value>, HostError>> {
            not_here()
        }
        fn poll(&self, _: String, _: Option<String>, _: Duration) -> BoxFuture<'_, Result<Option<Value>, HostError>> {
            not_here()
        }
        fn answer(&self, _: String, _: Answer) -> BoxFuture<'_, Result<Answered, HostError>> {
            not_here()
        }
        fn locate(&self, _: &str) -> BoxFuture<'_, Whereabouts> {
            let w = match (self.holds, self.log.lock().expect("log").is_empty(), &self.next) {
                (true, _, _) => Whereabouts::Here,
                (false, true, _) => Whereabouts::At(self.dead.clone()),
                (false, false, Some(next)) => Whereabouts::At(next.clone()),
                (false, false, None) => Whereabouts::Unavailable("no worker holds it now".into()),
            };
            Box::pin(async move { w })
        }
        fn peers(&self) -> Option<Vec<String>> {
            Some(Vec::new())
        }
    }

    /// The URL of a worker that was killed: nothing listens there any more.
    fn killed() -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("address"))
    }

    /// A worker of a group serving its API on loopback, as `sm4c serve --kafka` does.
    async fn worker(holds: bool, log: &Log, dead: &str, next: Option<&str>) -> (String, Arc<Mutex<Vec<Write>>>) {
        let seen: Arc<Mutex<Vec<Write>>> = Arc::default();
        let stand = Stand {
            holds,
            log: log.clone(),
            dead: dead.to_string(),
            next: next.map(str::to_string),
            seen: seen.clone(),
        };
        (
            serve(crate::router_with(stand, Arc::new(Http), Peering::default())).await,
            seen,
        )
    }

    async fn call(method: Method, url: String, body: Option<Value>) -> (u16, Option<String>, Value) {
        let mut b = axum::http::Request::builder().method(method).uri(url);
        if body.is_some() {
            b = b.header(header::CONTENT_TYPE, "application/json");
        }
        let body = body.map(|v| Bytes::from(v.to_string())).unwrap_or_default();
        let r = Http.send(b.body(body).expect("request")).await.expect("answered");
        let by = r
            .headers()
            .get(ANSWERED_BY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        (
            r.status().as_u16(),
            by,
            serde_json::from_slice(r.body()).unwrap_or(Value::Null),
        )
    }

    #[tokio::test]
    async fn a_start_whose_owner_does_not_answer_is_appended_here_and_answered_by_the_next_owner() {
        let (log, dead) = (Log::default(), killed());
        let (owner, owner_saw) = worker(true, &log, &dead, None).await;
        let (a, a_saw) = worker(false, &log, &dead, Some(&owner)).await;
        let start = json!({"definition": "saga", "id": "o-1"});
        let (status, by, v) = call(Method::POST, format!("{a}/instances"), Some(start.clone())).await;
        assert_eq!(
            (status, &v),
            (201, &json!({"id": "o-1", "created": true})),
            "not refused"
        );
        assert_eq!(by.as_deref(), Some(owner.as_str()), "decided by the next owner");
        // Appended once, here, with the request's id; the owner knew the request by that id.
        let appended = log.lock().expect("log").clone();
        assert_eq!(appended.len(), 1, "{appended:?}");
        let request = appended[0].1.clone();
        assert!(request.is_some());
        assert_eq!(
            *a_saw.lock().expect("seen"),
            vec![Write {
                request: request.clone(),
                not_owner: true,
                appended: false
            }]
        );
        assert_eq!(
            *owner_saw.lock().expect("seen"),
            vec![Write {
                request,
                not_owner: false,
                appended: true
            }]
        );
        // Another start of it is not its creator's: 200, through the owner, appended no more.
        let (status, by, v) = call(Method::POST, format!("{a}/instances"), Some(start)).await;
        assert_eq!((status, &v), (200, &json!({"id": "o-1", "created": false})));
        assert_eq!(by.as_deref(), Some(owner.as_str()));
        assert_eq!(log.lock().expect("log").len(), 1);
    }

    #[tokio::test]
    async fn a_start_the_located_owner_no_longer_holds_is_appended_here_and_answered_by_the_next() {
        let (log, dead) = (Log::default(), killed());
        let (owner, _) = worker(true, &log, &dead, None).await;
        // The worker the members record still names: it answers, but holds nothing now.
        let (moved, _) = worker(false, &log, &dead, None).await;
        let (a, _) = worker(false, &log, &moved, Some(&owner)).await;
        let (status, by, v) = call(
            Method::POST,
            format!("{a}/instances"),
            Some(json!({"definition": "saga", "id": "o-4"})),
        )
        .await;
        assert_eq!((status, &v), (201, &json!({"id": "o-4", "created": true})));
        assert_eq!(by.as_deref(), Some(owner.as_str()));
        assert_eq!(log.lock().expect("log").len(), 1);
    }

    #[tokio::test]
    async fn during_a_failover_a_read_still_answers_503_and_a_refused_write_is_not_appended() {
        let (log, dead) = (Log::default(), killed());
        let (a, _) = worker(false, &log, &dead, None).await;
        let (status, _, v) = call(Method::GET, format!("{a}/instances/o-1"), None).await;
        assert_eq!(status, 503, "{v}");
        let message = v["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!(
                "instance \"o-1\" is held by the worker at {dead}, which did not answer"
            )),
            "{v}"
        );
        let (status, _, v) = call(
            Method::POST,
            format!("{a}/instances"),
            Some(json!({"definition": "nope", "id": "o-2"})),
        )
        .await;
        assert_eq!((status, &v["error"]), (404, &json!("unknownDefinition")), "{v}");
        assert!(log.lock().expect("log").is_empty());
    }

    #[tokio::test]
    async fn a_write_no_worker_decides_within_the_bound_answers_202_and_stays_in_the_log() {
        let (log, dead) = (Log::default(), killed());
        let (a, _) = worker(false, &log, &dead, None).await;
        let (status, by, v) = call(
            Method::POST,
            format!("{a}/instances"),
            Some(json!({"definition": "saga", "id": "o-3"})),
        )
        .await;
        assert_eq!(status, 202, "{v}");
        assert_eq!(by, None);
        assert_eq!(
            v,
            json!({"error": "accepted", "message": "the start of \"o-3\" is in the log"})
        );
        assert_eq!(log.lock().expect("log").len(), 1);
    }
}
