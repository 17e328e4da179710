//! gRPC functions: `operation` is `<.proto URI>#<package.Service>/<Method>`.
//!
//! The `.proto` file is compiled when the definition is loaded (protox, no code generation);
//! arguments become the request message through the protobuf JSON mapping and the response comes
//! back as JSON the same way. Where a service runs is host configuration (a target per service),
//! never part of the definition. Every call carries the metadata `idempotency-key: <instance>/<operation
//! id>`, as REST calls carry `Idempotency-Key`. A status other than OK, a refused connection and an
//! expired deadline are `functionError`s carrying the gRPC code, so error handlers and retry policies
//! apply.
//!
//! A slow or hung service must not take others down with it, as with REST ([`crate::rest`]): calls
//! to one service are bounded (at most [`DEFAULT_CONCURRENCY`] at once unless configured; the others
//! wait their turn), and a call's deadline covers its wait for a turn, so a queue behind a hung
//! service drains at the deadline's pace instead of growing, and services that share its target
//! (its HTTP/2 connection, whose streams the server limits) are not starved of streams.

use crate::files::FileError;
pub use crate::rest::DEFAULT_CONCURRENCY;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, MethodDescriptor, SerializeOptions};
use serde_json::{json, Value};
use sm4c_host::FunctionCall;
use sm4c_runtime::model::FunctionKind;
use sm4c_runtime::{ErrorInfo, ErrorKind, Machine};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

/// Host configuration for gRPC functions, per service (`package.Service`). Metadata holds
/// credentials and is never logged.
#[derive(Clone, Default)]
pub struct GrpcConfig {
    /// Address of each service (`http://host:port`).
    pub targets: HashMap<String, String>,
    /// Metadata sent with every call to a service (credentials); never logged.
    pub metadata: HashMap<String, Vec<(AsciiMetadataKey, AsciiMetadataValue)>>,
    /// Deadline of each call to a service; `deadline` when absent.
    pub deadlines: HashMap<String, Duration>,
    /// Deadline of calls to services without their own (default 30 s). The action's own
    /// `timeout` can be shorter.
    pub deadline: Option<Duration>,
    /// TLS settings of services with `https` targets, beyond the defaults (webpki roots).
    pub tls: HashMap<String, GrpcTls>,
    /// Most calls in flight at once per service (else [`DEFAULT_CONCURRENCY`]).
    pub concurrency: HashMap<String, usize>,
    /// What remote `.proto` fetches may reach, and the most bytes read of an answer (a response
    /// message, a fetched `.proto`).
    pub net: crate::net::NetPolicy,
    /// The configuration file's folder: `.proto` files the configuration names may be read from it.
    pub config_dir: Option<PathBuf>,
    /// `.proto` URIs named by `[asl.resources]`.
    pub bound: std::collections::HashSet<String>,
}

impl std::fmt::Debug for GrpcConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Metadata values are credentials: only their names are shown.
        let metadata: HashMap<&String, Vec<&str>> = self
            .metadata
            .iter()
            .map(|(s, m)| (s, m.iter().map(|(k, _)| k.as_str()).collect()))
            .collect();
        f.debug_struct("GrpcConfig")
            .field("targets", &self.targets)
            .field("metadata", &metadata)
            .field("deadlines", &self.deadlines)
            .field("deadline", &self.deadline)
            .field("tls", &self.tls)
            .field("concurrency", &self.concurrency)
            .field("net", &self.net)
            .field("config_dir", &self.config_dir)
            .field("bound", &self.bound)
            .finish()
    }
}

/// TLS settings of one service: more roots to trust, and a client identity for mutual TLS.
#[derive(Clone, Default)]
pub struct GrpcTls {
    /// PEM certificates to trust besides the webpki roots.
    pub ca: Option<Vec<u8>>,
    /// PEM client certificate chain and private key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for GrpcTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a secret: never shown.
        f.debug_struct("GrpcTls")
            .field("ca", &self.ca.as_ref().map(|c| c.len()))
            .field("identity", &self.identity.as_ref().map(|_| "(not shown)"))
            .finish()
    }
}

impl GrpcTls {
    fn client_config(&self, host: &str) -> ClientTlsConfig {
        let mut c = ClientTlsConfig::new().with_webpki_roots().domain_name(host);
        if let Some(ca) = &self.ca {
            c = c.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.identity {
            c = c.identity(Identity::from_pem(cert, key));
        }
        c
    }

    /// Whether the certificates and key can be used (they are parsed when a channel is made).
    pub fn check(&self) -> Result<(), String> {
        Endpoint::from_static("https://localhost")
            .tls_config(self.client_config("localhost"))
            .map(|_| ())
            .map_err(|e| {
                let mut text = e.to_string();
                let mut cause = std::error::Error::source(&e);
                while let Some(c) = cause {
                    text = format!("{text}: {c}");
                    cause = c.source();
                }
                format!("unusable TLS settings: {text}")
            })
    }
}

/// Calls gRPC functions; one channel (one HTTP/2 connection) per target, shared by every call.
pub struct GrpcInvoker {
    base: PathBuf,
    config: GrpcConfig,
    protos: Mutex<HashMap<ProtoSource, Arc<DescriptorPool>>>,
    channels: Mutex<HashMap<String, Channel>>,
    /// Turns per service: a permit per call in flight.
    slots: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// How long a call that was abandoned (its deadline expired, or its caller dropped it) keeps its
/// turn. Abandoning a call resets its HTTP/2 stream (RST_STREAM), but the server learns of it only
/// when the frame arrives, and ends the call's handler on a task of its own after that: without a
/// delay, the next call's HEADERS can follow the reset on the same connection (often in the same
/// read) and its handler start before the abandoned one is dropped, so that the server sees one
/// call more than the bound. Measured by tests/it/grpc.rs, which counts handlers at the server: with
/// no delay, a hung service with a bound of 2 saw 3 and 4 calls at once; with 250 ms, never more
/// than 2. This is the same race as REST's closing connection, and gets the same answer and the
/// same 250 ms ([`crate::rest`]'s `LINGER`). A call that got an answer, even an error status, is
/// over at the server too and gives its turn back at once.
const LINGER: Duration = Duration::from_millis(250);

/// A call's turn: given back at once by [`Turn::done`], a little later ([`LINGER`]) when the call
/// is abandoned, whether it timed out or its future was dropped (the action's own `timeout`, a
/// cancelled instance).
struct Turn(Option<OwnedSemaphorePermit>);

impl Turn {
    /// The call is over at the server: the turn is free at once.
    fn done(mut self) {
        self.0.take();
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let Some(permit) = self.0.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    tokio::time::sleep(LINGER).await;
                    drop(permit);
                });
            }
            Err(_) => drop(permit),
        }
    }
}

/// Metadata key that marks a status made on this side of the wire (no connection, deadline
/// expired) rather than sent by the server. Never sent.
const LOCAL: &str = "sm4c-local-failure";

fn err(message: String, details: Value) -> ErrorInfo {
    ErrorInfo::new(ErrorKind::FunctionError, message).with_details(details)
}

/// Splits `<.proto URI>#<package.Service>/<Method>`.
pub fn parse_operation(operation: &str) -> Option<(&str, &str, &str)> {
    let (proto, rest) = operation.rsplit_once('#')?;
    let (service, method) = rest.split_once('/')?;
    let ok = |s: &str| !s.is_empty() && !s.contains(['/', '#', ' ']);
    (!proto.is_empty() && ok(service) && ok(method)).then_some((proto, service, method))
}

const FORM: &str = "must be <.proto URI>#<package.Service>/<Method>";

/// Where a `.proto` comes from: a local file, or an `http(s)` URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProtoSource {
    /// A local file; its folder is the import path.
    File(PathBuf),
    /// A URL; imports are fetched relative to it.
    Url(String),
}

impl ProtoSource {
    /// The source a `.proto` URI in a definition names: `http(s)://` as is, `file://` and plain
    /// paths relative to the definition's folder `dir`, and inside it ([`crate::files::resolve_uri`]).
    pub fn locate(dir: &Path, uri: &str) -> Result<ProtoSource, String> {
        ProtoSource::locate_in(dir, &[dir], uri)
    }

    /// As [`ProtoSource::locate`], the file inside one of the `roots` folders.
    pub fn locate_in(dir: &Path, roots: &[&Path], uri: &str) -> Result<ProtoSource, String> {
        if uri.starts_with("http://") || uri.starts_with("https://") {
            return Ok(ProtoSource::Url(uri.to_string()));
        }
        crate::files::resolve_in(dir, roots, uri).map(ProtoSource::File)
    }

    /// Compiles it (`google/protobuf/*.proto` are built in), fetching over the network as the
    /// default [`crate::net::NetPolicy`] allows.
    pub fn compile(&self) -> Result<DescriptorPool, String> {
        self.compile_with(&crate::net::NetPolicy::default())
    }

    /// Compiles it; a remote `.proto` and its imports are fetched as `net` allows.
    pub fn compile_with(&self, net: &crate::net::NetPolicy) -> Result<DescriptorPool, String> {
        match self {
            ProtoSource::File(path) => compile(path),
            ProtoSource::Url(url) => compile_url(url, net),
        }
    }
}

/// Compiles a `.proto` file (its folder is the import path; `google/protobuf/*.proto` are built in).
pub fn compile(path: &Path) -> Result<DescriptorPool, String> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(format!("{} is not a .proto file", path.display()));
    };
    std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let name = name.to_string_lossy();
    let root = dir.display().to_string();
    let fail = |e: protox::Error| format!("cannot compile {}: {}", path.display(), describe(&name, &root, &e));
    let mut chain = protox::file::ChainFileResolver::new();
    chain.add(protox::file::GoogleFileResolver::new());
    chain.add(LocalResolver {
        root: dir.to_path_buf(),
    });
    let mut compiler = protox::Compiler::with_file_resolver(chain);
    compiler.open_file(&*name).map_err(fail)?;
    Ok(compiler.descriptor_pool())
}

/// Opens a local `.proto` and its imports by name in its folder, each as a definition's own file
/// is opened ([`crate::files::resolve_in`]): made canonical, a regular file of at most
/// [`crate::files::MAX_FILE`] bytes, inside that folder. An import that leaves it (`../x.proto`, or
/// a symbolic link that points out) is refused, where protox's own resolver followed it.
struct LocalResolver {
    root: PathBuf,
}

impl protox::file::FileResolver for LocalResolver {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        let path = self.root.join(name);
        if std::fs::symlink_metadata(&path).is_err() {
            return Err(protox::Error::file_not_found(name));
        }
        let fail = |why: String| protox::Error::new(std::io::Error::other(why));
        let real = crate::files::resolve_in(&self.root, &[&self.root], name).map_err(fail)?;
        let text = std::fs::read_to_string(&real).map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?;
        protox::file::File::from_source(name, &text)
    }
}

/// Fetches `.proto` files over HTTP(S), by their import name relative to a base URL.
struct HttpResolver {
    base: String,
    client: reqwest::blocking::Client,
    /// Most bytes read of one file.
    cap: usize,
    /// The URLs that answered 404.
    missing: Arc<Mutex<Vec<String>>>,
}

impl protox::file::FileResolver for HttpResolver {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        let url = format!("{}/{name}", self.base);
        let fail = |why: String| protox::Error::new(std::io::Error::other(why));
        let resp = self
            .client
            .get(&url)
            .send()
            .map_err(|e| fail(format!("cannot fetch {url}: {}", crate::net::describe(&e))))?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            self.missing.lock().unwrap_or_else(|p| p.into_inner()).push(url);
            return Err(protox::Error::file_not_found(name));
        }
        if !resp.status().is_success() {
            return Err(fail(format!(
                "cannot fetch {url}: the server answered {}",
                resp.status()
            )));
        }
        use std::io::Read;
        let mut bytes = Vec::new();
        resp.take(self.cap as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| fail(format!("cannot read {url}: {e}")))?;
        if bytes.len() > self.cap {
            return Err(fail(format!(
                "cannot read {url}: it is larger than the cap of {} bytes ([calls] max_response in the configuration file)",
                self.cap
            )));
        }
        let text = String::from_utf8_lossy(&bytes);
        protox::file::File::from_source(name, &text)
    }
}

/// Compiles a `.proto` fetched from a URL; its imports are fetched relative to it. Runs on its own
/// thread, so that it may block wherever it is called from.
fn compile_url(url: &str, net: &crate::net::NetPolicy) -> Result<DescriptorPool, String> {
    let Some((base, name)) = url.rsplit_once('/').filter(|(b, n)| !n.is_empty() && b.contains("://")) else {
        return Err(format!("{url} does not name a .proto file"));
    };
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("cannot fetch {url}: {e}"))?;
    net.check_url(&parsed).map_err(|e| format!("cannot fetch {url}: {e}"))?;
    let (base, name, url, net) = (base.to_string(), name.to_string(), url.to_string(), net.clone());
    std::thread::spawn(move || {
        let client = net
            .blocking_client(Duration::from_secs(30))
            .build()
            .map_err(|e| format!("cannot fetch {url}: {e}"))?;
        let missing: Arc<Mutex<Vec<String>>> = Arc::default();
        let mut chain = protox::file::ChainFileResolver::new();
        chain.add(protox::file::GoogleFileResolver::new());
        chain.add(HttpResolver {
            base: base.clone(),
            client,
            cap: net.max_response,
            missing: missing.clone(),
        });
        let mut compiler = protox::Compiler::with_file_resolver(chain);
        if let Err(e) = compiler.open_file(&name) {
            let root_missing = missing.lock().unwrap_or_else(|p| p.into_inner()).contains(&url);
            return Err(if root_missing {
                format!("cannot fetch {url}: the server answered 404 Not Found")
            } else {
                format!("cannot compile {url}: {}", describe(&name, &base, &e))
            });
        }
        Ok(compiler.descriptor_pool())
    })
    .join()
    .unwrap_or_else(|_| Err("compiling a remote .proto failed".to_string()))
}

/// A protox error with the line and column it points at, and the file (under `root`) when it is
/// an import.
fn describe(name: &str, root: &str, e: &protox::Error) -> String {
    use miette::Diagnostic;
    let place = e.labels().and_then(|mut labels| labels.next()).and_then(|label| {
        let source = e.source_code()?;
        let at = source.read_span(label.inner(), 0, 0).ok()?;
        Some(format!("line {} column {}", at.line() + 1, at.column() + 1))
    });
    match (e.file(), place) {
        (Some(file), Some(place)) if file == name => format!("{place}: {e}"),
        (Some(file), Some(place)) => format!("{root}/{file}, {place}: {e}"),
        _ => e.to_string(),
    }
}

/// Finds a unary method in a compiled `.proto`.
fn find_method(pool: &DescriptorPool, proto: &str, service: &str, method: &str) -> Result<MethodDescriptor, String> {
    let Some(s) = pool.get_service_by_name(service) else {
        let known: Vec<String> = pool.services().map(|s| s.full_name().to_string()).collect();
        return Err(format!(
            "{proto} has no service {service} (it has: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    };
    let Some(m) = s.methods().find(|m| m.name() == method) else {
        let known: Vec<String> = s.methods().map(|m| m.name().to_string()).collect();
        return Err(format!(
            "service {service} in {proto} has no method {method} (it has: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    };
    if m.is_client_streaming() || m.is_server_streaming() {
        return Err(format!(
            "method {service}/{method} streams; only unary methods can be called"
        ));
    }
    Ok(m)
}

/// Checks every `rpc` function of a definition loaded from `file`: the operation's form, the
/// `.proto` (resolved against the definition's folder, and inside it), its service and unary
/// method; and that the local OpenAPI document of every `rest` function is inside the folder.
pub fn check_definition(file: &Path, m: &Machine) -> Vec<FileError> {
    let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut pools: HashMap<ProtoSource, Result<DescriptorPool, String>> = HashMap::new();
    let functions = m.source.get("functions").and_then(Value::as_array);
    let mut errs = Vec::new();
    for (i, f) in m
        .functions
        .iter()
        .enumerate()
        .filter(|(_, f)| matches!(f.kind, FunctionKind::Rest))
    {
        let Some((doc, _)) = f.operation.rsplit_once('#') else {
            continue;
        };
        if doc.contains("://") && !doc.starts_with("file://") {
            continue;
        }
        // A missing document is found at call time; one outside the folder is refused here.
        if let Err(e) = crate::files::resolve_uri(&dir, doc) {
            if e.contains("is outside the folder") {
                let index = functions
                    .and_then(|list| {
                        list.iter()
                            .position(|d| d.get("name").and_then(Value::as_str) == Some(&f.name))
                    })
                    .unwrap_or(i);
                errs.push(FileError {
                    file: file.display().to_string(),
                    place: format!("/functions/{index}/operation"),
                    message: format!("REST function {:?}: operation {:?}: {e}", f.name, f.operation),
                });
            }
        }
    }
    for f in m.functions.iter().filter(|f| matches!(f.kind, FunctionKind::Rpc)) {
        let index = functions.and_then(|list| {
            list.iter()
                .position(|d| d.get("name").and_then(Value::as_str) == Some(&f.name))
        });
        let place = match index {
            Some(i) => format!("/functions/{i}/operation"),
            None => "/functions".to_string(),
        };
        let problem = match parse_operation(&f.operation) {
            None => Some(format!(
                "gRPC function {:?}: operation {:?} {FORM}",
                f.name, f.operation
            )),
            Some((proto, service, method)) => match ProtoSource::locate(&dir, proto) {
                Err(e) => Some(format!("gRPC function {:?}: {e}", f.name)),
                Ok(src) => match pools.entry(src.clone()).or_insert_with(|| src.compile()) {
                    Err(e) => Some(format!("gRPC function {:?}: {e}", f.name)),
                    Ok(pool) => find_method(pool, proto, service, method)
                        .err()
                        .map(|e| format!("gRPC function {:?}: {e}", f.name)),
                },
            },
        };
        errs.extend(problem.map(|message| FileError {
            file: file.display().to_string(),
            place,
            message,
        }));
    }
    errs
}

impl GrpcInvoker {
    /// The folder relative `.proto` URIs resolve against (the definitions' folder).
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// Relative `.proto` URIs resolve against `base` (the definitions' folder).
    pub fn new(base: &Path, config: GrpcConfig) -> GrpcInvoker {
        GrpcInvoker {
            base: base.to_path_buf(),
            config,
            protos: Mutex::new(HashMap::new()),
            channels: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The turns of one service's calls, and their number.
    fn slots(&self, service: &str) -> (Arc<Semaphore>, usize) {
        let n = self
            .config
            .concurrency
            .get(service)
            .copied()
            .unwrap_or(DEFAULT_CONCURRENCY)
            .max(1);
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let s = slots
            .entry(service.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(n)));
        (s.clone(), n)
    }

    /// The compiled `.proto` of a URI; found, read, fetched and compiled off the runtime's threads.
    async fn pool(&self, uri: &str) -> Result<Arc<DescriptorPool>, String> {
        let named = self.config.bound.contains(uri);
        let config_dir = self.config.config_dir.clone().filter(|_| named);
        let (base, owned) = (self.base.clone(), uri.to_string());
        let src = tokio::task::spawn_blocking(move || {
            let mut roots: Vec<&Path> = vec![&base];
            roots.extend(config_dir.as_deref());
            ProtoSource::locate_in(&base, &roots, &owned)
        })
        .await
        .unwrap_or_else(|_| Err("locating the .proto failed".into()))?;
        if let Some(p) = self.protos.lock().unwrap_or_else(|p| p.into_inner()).get(&src) {
            return Ok(p.clone());
        }
        let (net, compiling) = (self.config.net.clone(), src.clone());
        let pool = tokio::task::spawn_blocking(move || compiling.compile_with(&net))
            .await
            .unwrap_or_else(|_| Err("compiling the .proto failed".into()))?;
        let pool = Arc::new(pool);
        self.protos
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(src, pool.clone());
        Ok(pool)
    }

    /// The channel to a service's target, made on first use; it connects lazily and reconnects
    /// by itself. An `https` target speaks TLS, trusting the webpki roots and the service's `ca`.
    fn channel(&self, service: &str, target: &str) -> Result<Channel, String> {
        // Services at one target share its connection, unless one has TLS settings of its own.
        let key = match self.config.tls.contains_key(service) {
            true => format!("{target} {service}"),
            false => target.to_string(),
        };
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = channels.get(&key) {
            return Ok(c.clone());
        }
        let mut endpoint = Endpoint::from_shared(target.to_string())
            .map_err(|e| format!("target {target:?} is not a URL: {e}"))?
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true);
        if target.starts_with("https://") {
            let host = endpoint
                .uri()
                .host()
                .unwrap_or_default()
                .trim_matches(['[', ']'])
                .to_string();
            let tls = self.config.tls.get(service).cloned().unwrap_or_default();
            endpoint = endpoint
                .tls_config(tls.client_config(&host))
                .map_err(|e| format!("TLS settings for {target}: {e}"))?;
        }
        let channel = endpoint.connect_lazy();
        channels.insert(key, channel.clone());
        Ok(channel)
    }

    /// Performs a call of an `rpc` function.
    pub async fn call(&self, call: &FunctionCall) -> Result<Value, ErrorInfo> {
        let function = &call.function;
        let (proto, service, method) = parse_operation(&call.operation).ok_or_else(|| {
            err(
                format!("operation {:?} of gRPC function {function} {FORM}", call.operation),
                json!({"operation": call.operation}),
            )
        })?;
        let method_desc = self
            .pool(proto)
            .await
            .and_then(|pool| find_method(&pool, proto, service, method))
            .map_err(|e| {
                err(
                    format!("gRPC function {function}: {e}"),
                    json!({"operation": call.operation}),
                )
            })?;
        let target = self.config.targets.get(service).ok_or_else(|| {
            err(
                format!(
                    "gRPC function {function} calls service {service}, which has no target: give one with \
                     --grpc-target {service}=http://HOST:PORT or in the configuration file (--config)"
                ),
                json!({"service": service}),
            )
        })?;
        let arguments = match &call.arguments {
            Value::Null => Value::Object(Default::default()),
            other => other.clone(),
        };
        let request = DynamicMessage::deserialize(method_desc.input(), arguments).map_err(|e| {
            err(
                format!(
                    "arguments of gRPC function {function} do not fit message {}: {e}",
                    method_desc.input().full_name()
                ),
                json!({"message": method_desc.input().full_name()}),
            )
        })?;
        let channel = self
            .channel(service, target)
            .map_err(|e| err(format!("gRPC function {function}: {e}"), json!({"target": target})))?;
        let mut req = tonic::Request::new(request);
        let key = format!("{}/{}", call.instance, call.op);
        if let Ok(v) = AsciiMetadataValue::try_from(visible_ascii(&key)) {
            req.metadata_mut().insert("idempotency-key", v);
        }
        // The step's trace context (W3C Trace Context); configured metadata may replace it.
        if let Some(v) = call
            .traceparent
            .as_deref()
            .and_then(|t| AsciiMetadataValue::try_from(t).ok())
        {
            req.metadata_mut().insert("traceparent", v);
        }
        for (k, v) in self.config.metadata.get(service).into_iter().flatten() {
            req.metadata_mut().insert(k.clone(), v.clone());
        }
        let limit = self
            .config
            .deadlines
            .get(service)
            .copied()
            .or(self.config.deadline)
            .unwrap_or(Duration::from_secs(30));
        let path = http::uri::PathAndQuery::try_from(format!("/{service}/{method}"))
            .map_err(|e| err(format!("gRPC function {function}: {e}"), Value::Null))?;
        let name = format!("{service}/{method} at {target}");
        let started = std::time::Instant::now();
        let deadline = tokio::time::Instant::from_std(started) + limit;
        // The deadline covers the wait for a turn: a call that gets none in time fails as one that
        // got no answer in time does.
        let (slots, bound) = self.slots(service);
        let turn = match tokio::time::timeout_at(deadline, slots.acquire_owned()).await {
            Ok(Ok(permit)) => Turn(Some(permit)),
            _ => return Err(no_turn(&name, target, service, limit, bound)),
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            turn.done();
            return Err(no_turn(&name, target, service, limit, bound));
        }
        // The server is told what is left (grpc-timeout); the channel enforces it until the
        // response's headers, and the timeout below until its end (a server may send its headers
        // and then nothing).
        req.set_timeout(left);
        let mut grpc = tonic::client::Grpc::new(Local(channel)).max_decoding_message_size(self.config.net.max_response);
        let answer = async {
            grpc.ready().await?;
            let resp = grpc.unary(req, path, DynamicCodec(method_desc.output())).await?;
            Ok::<_, Status>(resp.into_inner())
        };
        let status = match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(message)) => {
                turn.done();
                return message
                    .serialize_with_options(
                        serde_json::value::Serializer,
                        &SerializeOptions::new().skip_default_fields(false),
                    )
                    .map_err(|e| err(format!("{name}: cannot convert the response to JSON: {e}"), Value::Null));
            }
            Ok(Err(status)) => status,
            Err(_) => {
                let mut s = Status::deadline_exceeded("deadline exceeded");
                s.metadata_mut().insert(LOCAL, AsciiMetadataValue::from_static("1"));
                s
            }
        };
        if status.code() == Code::OutOfRange && status.message().contains("message length too large") {
            // tonic's own check of the response's size, before decoding it.
            turn.done();
            let cap = self.config.net.max_response;
            return Err(err(
                format!(
                    "{name} failed: the response is larger than the cap of {cap} bytes ([calls] max_response in the configuration file)"
                ),
                json!({"kind": "tooLarge", "target": target, "maxResponse": cap, "message": status.message()}),
            ));
        }
        let e = status_error(&name, target, limit, started.elapsed(), &status);
        // A call that timed out is abandoned, not over: its turn lingers (dropped here); any other
        // failure ended it.
        if e.details.as_ref().is_some_and(|d| d["kind"] != "timeout") {
            turn.done();
        }
        Err(e)
    }
}

/// The function error of a call that got no turn before its deadline: `details.kind` is
/// `"timeout"` (code `DEADLINE_EXCEEDED`), as for a call that got no answer in time.
fn no_turn(name: &str, target: &str, service: &str, limit: Duration, bound: usize) -> ErrorInfo {
    let code = Code::DeadlineExceeded;
    err(
        format!(
            "{name} failed: no turn within the deadline of {} ms: at most {bound} calls to service {service} run \
             at once, and they are all in flight",
            limit.as_millis()
        ),
        json!({"code": code as i32, "codeName": code_name(code), "message": "no turn within the deadline",
               "kind": "timeout", "target": target, "concurrency": bound}),
    )
}

/// The function error for a status; `details.kind` tells failures on this side of the wire.
fn status_error(name: &str, target: &str, deadline: Duration, elapsed: Duration, status: &Status) -> ErrorInfo {
    let local = status.metadata().get(LOCAL).is_some();
    // The channel reports its deadline as a cancellation, like a connection the server closed
    // (a refused TLS client certificate): the time taken tells them apart.
    let timed_out = status.code() == Code::DeadlineExceeded
        || (local && status.code() == Code::Cancelled && elapsed + Duration::from_millis(5) >= deadline);
    let code = if timed_out {
        Code::DeadlineExceeded
    } else {
        status.code()
    };
    let mut details = json!({"code": code as i32, "codeName": code_name(code), "message": status.message()});
    let message = if timed_out {
        details["kind"] = json!("timeout");
        details["target"] = json!(target);
        format!("{name} failed: deadline of {} ms exceeded", deadline.as_millis())
    } else if local {
        details["kind"] = json!("connection");
        details["target"] = json!(target);
        format!("{name} failed: connection: {}", status.message())
    } else {
        format!("{name} answered {}: {}", code_name(code), status.message())
    };
    err(message, details)
}

/// The canonical name of a status code, as in the gRPC specification.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Metadata values are visible ASCII; anything else in an instance id is percent-encoded.
fn visible_ascii(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b' '..=b'~' if b != b'%' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The channel, with its failures marked as local so they are told apart from statuses the
/// server sent (tonic turns both into a `Status`).
#[derive(Clone)]
struct Local(Channel);

fn local(e: tonic::transport::Error) -> Status {
    // Keep the whole cause ("tcp connect error: Connection refused"); tonic keeps the first part.
    let mut causes: Vec<String> = Vec::new();
    let mut cause: Option<&dyn std::error::Error> = Some(&e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !causes.iter().any(|seen| seen.contains(&text)) {
            causes.push(text);
        }
        cause = c.source();
    }
    let code = Status::from_error(Box::new(e)).code();
    let mut s = Status::new(code, causes.join(": "));
    s.metadata_mut().insert(LOCAL, AsciiMetadataValue::from_static("1"));
    s
}

impl tower::Service<http::Request<tonic::body::Body>> for Local {
    type Response = http::Response<tonic::body::Body>;
    type Error = Status;
    type Future = sm4c_host::BoxFuture<'static, Result<Self::Response, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.0.poll_ready(cx).map_err(local)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let fut = self.0.call(req);
        Box::pin(async move { fut.await.map_err(local) })
    }
}

/// Encodes and decodes messages known only at run time, by their descriptors.
#[derive(Clone)]
struct DynamicCodec(MessageDescriptor);

impl Codec for DynamicCodec {
    type Encode = DynamicMessage;
    type Decode = DynamicMessage;
    type Encoder = DynamicCodec;
    type Decoder = DynamicCodec;

    fn encoder(&mut self) -> DynamicCodec {
        self.clone()
    }

    fn decoder(&mut self) -> DynamicCodec {
        self.clone()
    }
}

impl Encoder for DynamicCodec {
    type Item = DynamicMessage;
    type Error = Status;

    fn encode(&mut self, item: DynamicMessage, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("cannot encode {}: {e}", self.0.full_name())))
    }
}

impl Decoder for DynamicCodec {
    type Item = DynamicMessage;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<DynamicMessage>, Status> {
        DynamicMessage::decode(self.0.clone(), src)
            .map(Some)
            .map_err(|e| Status::internal(format!("cannot decode {}: {e}", self.0.full_name())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_proto_imports_files_of_its_folder_only() {
        let top = tempfile::tempdir().expect("tempdir");
        let defs = top.path().join("defs");
        std::fs::create_dir(&defs).expect("dir");
        let service = |import: &str| {
            format!(
                "syntax = \"proto3\";\npackage t;\nimport \"{import}\";\nimport \"google/protobuf/empty.proto\";\nservice S {{ rpc M (Req) returns (google.protobuf.Empty); }}\n"
            )
        };
        let message = "syntax = \"proto3\";\npackage t;\nmessage Req { string a = 1; }\n";
        std::fs::write(defs.join("req.proto"), message).expect("write");
        std::fs::write(top.path().join("outside.proto"), message).expect("write");
        std::os::unix::fs::symlink(top.path().join("outside.proto"), defs.join("link.proto")).expect("symlink");
        // An import inside the folder, and a built-in one: compiled.
        std::fs::write(defs.join("ok.proto"), service("req.proto")).expect("write");
        let pool = compile(&defs.join("ok.proto")).expect("compiles");
        assert!(pool.get_service_by_name("t.S").is_some());
        // A symbolic link out of the folder: refused, naming why (protox's own resolver read it).
        std::fs::write(defs.join("link-user.proto"), service("link.proto")).expect("write");
        let e = compile(&defs.join("link-user.proto")).expect_err("refused");
        assert!(e.contains("outside the folder"), "{e}");
        // A path that leaves it: refused too (protox takes no `..` in an import).
        std::fs::write(defs.join("up.proto"), service("../outside.proto")).expect("write");
        compile(&defs.join("up.proto")).expect_err("refused");
        // A missing import is reported as missing.
        std::fs::write(defs.join("missing.proto"), service("nope.proto")).expect("write");
        let e = compile(&defs.join("missing.proto")).expect_err("missing");
        assert!(e.contains("nope.proto"), "{e}");
    }
}
