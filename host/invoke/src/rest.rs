//! REST functions described by OpenAPI: `operation` is `<document URI>#<operationId>`.
//!
//! Arguments fill the operation's path, query and header parameters by name; the arguments left
//! over form the JSON body. The server comes from the document's `servers`, unless the host
//! configuration overrides it per document. Every call carries `Idempotency-Key:
//! <instance>/<operation id>`, the same on every retry of the same step after a crash. A JSON
//! response is the result; anything else (a non-2xx status, a timeout, a refused connection) is a
//! `functionError` that error handlers and retry policies see.
//!
//! A slow or failing service must not take others down with it: calls to one document's server are
//! bounded (at most [`DEFAULT_CONCURRENCY`] at once unless configured; the others wait their turn),
//! and a call's timeout covers its wait for a turn, so a queue behind a hung service drains at the
//! timeout's pace instead of growing.
//!
//! Configured headers go only where the configuration sends them: with a configured `server`, only
//! to URLs under it; without one, only to the servers of a local document (a file in the
//! definitions folder or the configuration's, which the operator placed), never to the servers a
//! remote document names. Redirects are followed only within one origin, answers (and fetched
//! documents) are capped, and private addresses refused as [`crate::net`] says. Local documents
//! must be inside the definitions folder (or, for documents the configuration names, its folder),
//! and are read off the async runtime's threads.

use crate::net::{read_capped, under, NetPolicy};
use serde_json::{json, Map, Value};
use sm4c_host::FunctionCall;
use sm4c_runtime::{ErrorInfo, ErrorKind};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Host configuration for REST functions. Credentials live here, never in definitions.
#[derive(Clone, Default)]
pub struct RestConfig {
    /// Base URL per OpenAPI document (as written in `operation`, before `#`), replacing its `servers`.
    pub servers: HashMap<String, String>,
    /// Extra headers per document (credentials); never logged.
    pub headers: HashMap<String, Vec<(String, String)>>,
    /// Longest a call may take (default 30 s); the action's own `timeout` can be shorter.
    pub timeout: Option<Duration>,
    /// Longest a call may take per document, waiting for its turn included (else `timeout`).
    pub timeouts: HashMap<String, Duration>,
    /// Most calls in flight at once per document (else [`DEFAULT_CONCURRENCY`]).
    pub concurrency: HashMap<String, usize>,
    /// What calls may reach, and how much of an answer they read.
    pub net: NetPolicy,
    /// The configuration file's folder: documents the configuration names may be read from it.
    pub config_dir: Option<PathBuf>,
    /// Documents named by `[asl.resources]` (besides the keys of the maps above).
    pub bound: HashSet<String>,
}

impl std::fmt::Debug for RestConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values are credentials: only their names are shown.
        let headers: HashMap<&String, Vec<&String>> = self
            .headers
            .iter()
            .map(|(d, h)| (d, h.iter().map(|(n, _)| n).collect()))
            .collect();
        f.debug_struct("RestConfig")
            .field("servers", &self.servers)
            .field("headers", &headers)
            .field("timeout", &self.timeout)
            .field("timeouts", &self.timeouts)
            .field("concurrency", &self.concurrency)
            .field("net", &self.net)
            .field("config_dir", &self.config_dir)
            .field("bound", &self.bound)
            .finish()
    }
}

impl RestConfig {
    /// Whether the configuration names a document (so it may be read from the configuration's folder).
    pub fn names(&self, uri: &str) -> bool {
        self.servers.contains_key(uri)
            || self.headers.contains_key(uri)
            || self.timeouts.contains_key(uri)
            || self.concurrency.contains_key(uri)
            || self.bound.contains(uri)
    }
}

/// Most calls in flight at once to one document's server, unless configured.
pub const DEFAULT_CONCURRENCY: usize = 64;

/// How long a call that timed out keeps its turn: long enough for its connection to be closed
/// before the next call opens one, so that the service never sees more connections than the bound.
/// The connection is closed by the HTTP client's own task, which a busy runtime may run late: with
/// 100 ms, a burst of 10,000 calls to a hung service on 2 cores let it see 8 connections at once
/// (tests/it/downstreams.rs, `SM4C_DOWNSTREAMS_FULL=1`); with 250 ms, never more than the bound.
const LINGER: Duration = Duration::from_millis(250);

/// Calls REST functions; connections to the same host are reused.
pub struct RestInvoker {
    /// Built at the first call: building it reads the system's certificates, which a run that
    /// calls no REST function (or only mocks) does not need.
    client: OnceLock<reqwest::Client>,
    base: PathBuf,
    config: RestConfig,
    docs: Mutex<HashMap<String, Arc<Value>>>,
    /// Turns per document: a permit per call in flight.
    slots: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl RestInvoker {
    /// The folder relative documents resolve against (the definitions' folder).
    pub fn base(&self) -> &std::path::Path {
        &self.base
    }
}

struct Operation {
    method: reqwest::Method,
    server: String,
    path: String,
    params: Vec<(String, String)>,
}

fn err(message: String, details: Value) -> ErrorInfo {
    ErrorInfo::new(ErrorKind::FunctionError, message).with_details(details)
}

impl RestInvoker {
    /// Relative `file://` documents resolve against `base` (the definitions' folder).
    pub fn new(base: &Path, config: RestConfig) -> RestInvoker {
        RestInvoker {
            client: OnceLock::new(),
            base: base.to_path_buf(),
            config,
            docs: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The HTTP client, built at the first call.
    fn client(&self) -> &reqwest::Client {
        self.client.get_or_init(|| {
            self.config
                .net
                .client(self.config.timeout.unwrap_or(Duration::from_secs(30)))
                .pool_idle_timeout(Duration::from_secs(90))
                .build()
                .unwrap_or_default()
        })
    }

    /// The turns of one document's calls.
    fn slots(&self, uri: &str) -> (Arc<tokio::sync::Semaphore>, usize) {
        let n = self
            .config
            .concurrency
            .get(uri)
            .copied()
            .unwrap_or(DEFAULT_CONCURRENCY)
            .max(1);
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let s = slots
            .entry(uri.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(n)));
        (s.clone(), n)
    }

    async fn document(&self, uri: &str) -> Result<Arc<Value>, ErrorInfo> {
        if let Some(d) = self.docs.lock().unwrap_or_else(|p| p.into_inner()).get(uri) {
            return Ok(d.clone());
        }
        let text = if uri.starts_with("http://") || uri.starts_with("https://") {
            let fetch_err = |e: String| {
                err(
                    format!("cannot fetch OpenAPI document {uri}: {e}"),
                    json!({"document": uri}),
                )
            };
            let url = reqwest::Url::parse(uri).map_err(|e| fetch_err(e.to_string()))?;
            self.config.net.check_url(&url).map_err(fetch_err)?;
            let resp = self
                .client()
                .get(url)
                .send()
                .await
                .map_err(|e| fetch_err(crate::net::describe(&e)))?;
            if !resp.status().is_success() {
                return Err(fetch_err(format!("the server answered {}", resp.status())));
            }
            let bytes = read_capped(resp, self.config.net.max_response)
                .await
                .map_err(|e| fetch_err(e.to_string()))?;
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            // The file is found and read off the runtime's threads.
            let (base, config_dir, owned) = (
                self.base.clone(),
                self.config.config_dir.clone().filter(|_| self.config.names(uri)),
                uri.to_string(),
            );
            let read = tokio::task::spawn_blocking(move || {
                let mut roots: Vec<&Path> = vec![&base];
                roots.extend(config_dir.as_deref());
                crate::files::resolve_in(&base, &roots, &owned).and_then(|p| crate::files::read_text(&p))
            })
            .await
            .unwrap_or_else(|_| Err("reading the document failed".into()));
            read.map_err(|e| {
                err(
                    format!("function operation {uri:?}: cannot read OpenAPI document: {e}"),
                    json!({"document": uri}),
                )
            })?
        };
        let doc: Value = serde_json::from_str(&text)
            .or_else(|_| serde_yaml_ng::from_str::<Value>(&text))
            .map_err(|e| {
                err(
                    format!("OpenAPI document {uri} is neither JSON nor YAML: {e}"),
                    json!({"document": uri}),
                )
            })?;
        let doc = Arc::new(doc);
        self.docs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uri.to_string(), doc.clone());
        Ok(doc)
    }

    fn operation(&self, uri: &str, doc: &Value, id: &str) -> Result<Operation, ErrorInfo> {
        let missing = || {
            err(
                format!("OpenAPI document {uri} has no operation {id:?}"),
                json!({"document": uri, "operationId": id}),
            )
        };
        let paths = doc.get("paths").and_then(Value::as_object).ok_or_else(missing)?;
        for (path, item) in paths {
            for method in ["get", "put", "post", "delete", "patch", "head", "options"] {
                let Some(op) = item.get(method) else { continue };
                if op.get("operationId").and_then(Value::as_str) != Some(id) {
                    continue;
                }
                let mut params = Vec::new();
                for list in [item.get("parameters"), op.get("parameters")].into_iter().flatten() {
                    for p in list.as_array().into_iter().flatten() {
                        if let (Some(name), Some(place)) = (
                            p.get("name").and_then(Value::as_str),
                            p.get("in").and_then(Value::as_str),
                        ) {
                            params.retain(|(n, _): &(String, String)| n != name);
                            params.push((name.to_string(), place.to_string()));
                        }
                    }
                }
                let server = self
                    .config
                    .servers
                    .get(uri)
                    .cloned()
                    .or_else(|| {
                        op.pointer("/servers/0/url")
                            .or_else(|| doc.pointer("/servers/0/url"))
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    })
                    .ok_or_else(|| {
                        err(
                            format!("OpenAPI document {uri} names no server; give one with --rest-server {uri}=URL"),
                            json!({"document": uri}),
                        )
                    })?;
                let method =
                    reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap_or(reqwest::Method::GET);
                return Ok(Operation {
                    method,
                    server,
                    path: path.clone(),
                    params,
                });
            }
        }
        Err(missing())
    }

    /// Performs a call of a `rest` function.
    pub async fn call(&self, call: &FunctionCall) -> Result<Value, ErrorInfo> {
        let (uri, id) = call.operation.rsplit_once('#').ok_or_else(|| {
            err(
                format!(
                    "operation {:?} of function {} must be <OpenAPI document URI>#<operationId>",
                    call.operation, call.function
                ),
                json!({"operation": call.operation}),
            )
        })?;
        let doc = self.document(uri).await?;
        let op = self.operation(uri, &doc, id)?;
        let mut args: Map<String, Value> = match &call.arguments {
            Value::Object(m) => m.clone(),
            Value::Null => Map::new(),
            other => {
                return Err(err(
                    format!("arguments of function {} must be an object, not {other}", call.function),
                    Value::Null,
                ))
            }
        };
        let text = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let mut path = op.path.clone();
        let mut query = Vec::new();
        let mut headers = Vec::new();
        for (name, place) in &op.params {
            let Some(v) = args.remove(name) else { continue };
            match place.as_str() {
                "path" => path = path.replace(&format!("{{{name}}}"), &encode(&text(&v))),
                "query" => query.push((name.clone(), text(&v))),
                "header" => headers.push((name.clone(), text(&v))),
                _ => {}
            }
        }
        let url = format!("{}{}", op.server.trim_end_matches('/'), path);
        let configured = self.config.headers.get(uri).filter(|h| !h.is_empty());
        let refused = |why: String| {
            err(
                format!("function {}: {why}; no request was made", call.function),
                json!({"kind": "refused", "url": url}),
            )
        };
        let parsed = reqwest::Url::parse(&url).map_err(|e| refused(format!("{url:?} is not a URL: {e}")))?;
        self.config.net.check_url(&parsed).map_err(&refused)?;
        if configured.is_some() {
            // Configured headers go only where the configuration sends them.
            match self.config.servers.get(uri) {
                Some(server) => {
                    let prefix = reqwest::Url::parse(server)
                        .map_err(|e| refused(format!("the configured server {server:?} is not a URL: {e}")))?;
                    if !under(&prefix, &parsed) {
                        return Err(refused(format!(
                            "{url} is not under the configured server {server} of {uri}, so its configured headers cannot be sent there"
                        )));
                    }
                }
                None if uri.contains("://") && !uri.starts_with("file://") => {
                    return Err(refused(format!(
                        "{uri} is a remote document with configured headers and no configured server: its own servers are not trusted with them (give server in [rest.\"{uri}\"] or --rest-server)"
                    )))
                }
                None => {}
            }
        }
        let mut req = self
            .client()
            .request(op.method.clone(), parsed)
            .query(&query)
            .header("Idempotency-Key", format!("{}/{}", call.instance, call.op))
            .header("Accept", "application/json");
        let mut traced = false;
        for (k, v) in headers.iter().chain(configured.into_iter().flatten()) {
            traced |= k.eq_ignore_ascii_case("traceparent");
            req = req.header(k.as_str(), v.as_str());
        }
        // The step's trace context (W3C Trace Context), unless the call sets its own.
        if let (Some(tp), false) = (&call.traceparent, traced) {
            req = req.header("traceparent", tp.as_str());
        }
        if !args.is_empty() {
            req = req.json(&Value::Object(args));
        }
        let target = format!("{} {url}", op.method);
        let limit = self
            .config
            .timeouts
            .get(uri)
            .copied()
            .or(self.config.timeout)
            .unwrap_or(Duration::from_secs(30));
        let deadline = tokio::time::Instant::now() + limit;
        let timed_out = |what: String| {
            err(
                format!("{target} failed: timeout: {what}"),
                json!({"kind": "timeout", "url": url, "timeoutMs": limit.as_millis() as u64}),
            )
        };
        let (slots, bound) = self.slots(uri);
        let Ok(Ok(turn)) = tokio::time::timeout_at(deadline, slots.acquire_owned()).await else {
            return Err(timed_out(format!(
                "no turn within {limit:?}: at most {bound} calls to {uri} run at once, and they are all in flight"
            )));
        };
        let cap = self.config.net.max_response;
        let exchange = async {
            let resp = req.timeout(limit).send().await.map_err(crate::net::ReadError::Io)?;
            let status = resp.status();
            read_capped(resp, cap)
                .await
                .map(|body| (status, String::from_utf8_lossy(&body).into_owned()))
        };
        let (status, body) = match tokio::time::timeout_at(deadline, exchange).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e @ crate::net::ReadError::TooBig(_))) => {
                drop(turn);
                return Err(err(
                    format!("{target} failed: {e}"),
                    json!({"kind": "tooLarge", "url": url, "maxResponse": cap}),
                ));
            }
            Ok(Err(crate::net::ReadError::Io(e))) if !e.is_timeout() => {
                drop(turn);
                let kind = if e.is_connect() { "connection" } else { "request" };
                return Err(err(
                    format!("{target} failed: {kind}: {}", crate::net::describe(&e)),
                    json!({"kind": kind, "url": url}),
                ));
            }
            _ => {
                // The connection of the abandoned call may still be closing: keep the turn a
                // little longer, so that the next call does not open one beside it.
                tokio::spawn(async move {
                    tokio::time::sleep(LINGER).await;
                    drop(turn);
                });
                return Err(timed_out(format!("no answer within {limit:?}")));
            }
        };
        drop(turn);
        let parsed = if body.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&body).unwrap_or(Value::String(body))
        };
        if status.is_success() {
            Ok(parsed)
        } else {
            Err(err(
                format!("{target} answered {}", status.as_u16()),
                json!({"status": status.as_u16(), "body": parsed}),
            ))
        }
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
