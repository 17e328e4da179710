//! Where function calls go: REST servers, headers, timeouts and concurrency bounds per OpenAPI
//! document, gRPC targets, metadata, deadlines and concurrency bounds per service. Read from the
//! configuration file (`--config FILE`, TOML), then amended by the command-line flags, which win.
//!
//! ```toml
//! [rest."file://api.yaml"]            # the document as written in `operation`, before `#`
//! server = "https://staging.example.com/v1"
//! headers = { x-api-key = "env:API_KEY", x-tenant = "acme" }
//! timeout = "5s"                      # longest a call may take, its wait for a turn included (30s)
//! concurrency = 8                     # most calls in flight at once to this server (64)
//!
//! [grpc."shop.v1.Inventory"]          # package.Service
//! target = "https://inventory.internal:50051"
//! metadata = { authorization = "env:INVENTORY_TOKEN" }
//! deadline = "5s"                     # longest a call may take, its wait for a turn included (30s)
//! concurrency = 8                     # most calls in flight at once to this service (64)
//! ca = "certs/ca.pem"                 # TLS: roots to trust besides the webpki roots
//! cert = "certs/client.pem"           # TLS: client certificate and key (mutual TLS)
//! key = "certs/client.key"
//! ```
//!
//! The `[server]` section is for `sm4c serve`: its bearer tokens and its TLS (see [`ServerConfig`]).
//!
//! ```toml
//! [server]
//! tokens = [{ role = "admin", token = "env:SM4C_ADMIN" }, { role = "read", token = "env:DASHBOARD" }]
//! peer_token = "env:SM4C_PEER"         # Kafka mode: the secret the workers of a group share
//!
//! [server.tls]
//! cert = "certs/server.pem"
//! key = "certs/server.key"
//! client_ca = "certs/clients-ca.pem"   # mutual TLS: verify client certificates signed by these CAs
//! clients = { "CN=ops" = "operate" }   # a verified client certificate's subject CN and its role
//! ```
//!
//! The `[asl]` section binds ASL Task `Resource`s to functions (see [`crate::asl`]): a REST
//! operation, a gRPC method (both written as an SM4C function's `operation`, resolved the same
//! way) or a worker task list; and gives the HTTP Task's connections their credentials.
//!
//! ```toml
//! [asl.resources."arn:aws:lambda:us-east-1:123456789012:function:charge"]
//! rest = "payments.yaml#chargeCard"
//!
//! [asl.resources."arn:aws:states:::lambda:invoke"]
//! grpc = "shop.proto#shop.v1.Inventory/Reserve"
//!
//! [asl.resources."arn:aws:states:::sqs:sendMessage.waitForTaskToken"]
//! worker = "approvals"                 # a .waitForTaskToken Resource can only go to a worker
//!
//! [asl.connections."arn:aws:events:us-east-1:123456789012:connection/stripe/1"]
//! headers = { authorization = "env:STRIPE_AUTH" }
//! endpoints = ["https://api.stripe.com/v1/"]  # the only URLs its headers are sent to (required)
//! ```
//!
//! The `[calls]` section bounds what calls may reach and read (see [`crate::net`]):
//!
//! ```toml
//! [calls]
//! max_response = "4MiB"                # the most of an answer read (bytes, or KiB/MiB/GiB)
//! allow_private = false                # private and link-local addresses (default: refused by
//!                                      # `sm4c serve`, allowed by `sm4c run`)
//! allow_networks = ["10.20.0.0/16"]    # networks allowed even when private addresses are refused
//! ```
//!
//! Header, metadata and token values are literal or `env:VAR`. They are credentials: no message
//! quotes them. File paths are relative to the configuration file's folder.

use crate::asl::AslConfig;
use crate::files::FileError;
use crate::grpc::{GrpcConfig, GrpcTls};
use crate::rest::RestConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};

/// Host configuration of function calls.
#[derive(Debug, Clone, Default)]
pub struct CallConfig {
    /// The `[calls]` section: what calls may reach and how much of an answer they read.
    pub calls: CallsConfig,
    /// The configuration file's folder: configured documents may be read from it too.
    pub dir: Option<PathBuf>,
    /// REST functions.
    pub rest: RestConfig,
    /// gRPC functions.
    pub grpc: GrpcConfig,
    /// The `[server]` section, for `sm4c serve`.
    pub server: ServerConfig,
    /// The `[asl]` section: what ASL Task Resources call.
    pub asl: AslConfig,
}

/// The `[calls]` section.
#[derive(Debug, Clone, Default)]
pub struct CallsConfig {
    /// Most bytes read of an answer (default [`crate::net::DEFAULT_MAX_RESPONSE`]).
    pub max_response: Option<usize>,
    /// Whether private and link-local addresses may be called (default: the command's).
    pub allow_private: Option<bool>,
    /// Networks that may be called even when private addresses are refused.
    pub allow_networks: Vec<ipnet::IpNet>,
}

impl CallConfig {
    /// What calls may reach: private addresses are refused unless `[calls]` allows them and
    /// `refuse_private` (what `sm4c serve` passes, `sm4c run` does not) is set.
    pub fn net_policy(&self, refuse_private: bool) -> crate::net::NetPolicy {
        crate::net::NetPolicy {
            allow_private: self.calls.allow_private.unwrap_or(!refuse_private),
            allowed: self.calls.allow_networks.clone(),
            max_response: self.calls.max_response.unwrap_or(crate::net::DEFAULT_MAX_RESPONSE),
        }
    }

    /// The policy and the configuration file's folder handed to the invokers, before they are made.
    pub fn apply(&mut self, refuse_private: bool) {
        let net = self.net_policy(refuse_private);
        self.rest.net = net.clone();
        self.rest.config_dir = self.dir.clone();
        self.grpc.config_dir = self.dir.clone();
        self.grpc.net = net.clone();
        self.asl.net = net;
        for target in self.asl.resources.values() {
            match target {
                crate::asl::AslTarget::Rest(op) => {
                    if let Some((doc, _)) = op.rsplit_once('#') {
                        self.rest.bound.insert(doc.to_string());
                    }
                }
                crate::asl::AslTarget::Grpc(op) => {
                    if let Some((proto, _, _)) = crate::grpc::parse_operation(op) {
                        self.grpc.bound.insert(proto.to_string());
                    }
                }
                crate::asl::AslTarget::Worker(_) => {}
            }
        }
    }
}

/// The roles a token or a client certificate may have, from the least to the most allowed.
pub const ROLES: [&str; 3] = ["read", "operate", "admin"];

/// `sm4c serve`'s authentication and TLS, from the `[server]` section.
#[derive(Clone, Default)]
pub struct ServerConfig {
    /// Bearer tokens: (role, SHA-256 digest of the token). The tokens themselves are not kept.
    pub tokens: Vec<(String, [u8; 32])>,
    /// The token the workers of a Kafka group authenticate to each other with (`peer_token`):
    /// kept as it is, since this worker sends it. `Debug` only says whether it is set.
    pub peer_token: Option<String>,
    /// HTTPS instead of HTTP.
    pub tls: Option<ServerTls>,
}

/// The server's certificate and key (PEM), and for mutual TLS the client CA and the roles of clients.
#[derive(Clone)]
pub struct ServerTls {
    /// The certificate chain (PEM).
    pub cert: Vec<u8>,
    /// Its private key (PEM).
    pub key: Vec<u8>,
    /// CAs whose client certificates are verified (PEM).
    pub client_ca: Option<Vec<u8>>,
    /// (subject common name, role) of verified client certificates.
    pub clients: Vec<(String, String)>,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let roles: Vec<&str> = self.tokens.iter().map(|(r, _)| r.as_str()).collect();
        f.debug_struct("ServerConfig")
            .field("tokens", &roles)
            .field("peer_token", &self.peer_token.as_ref().map(|_| "(set)"))
            .field("tls", &self.tls.as_ref().map(|t| (&t.clients, t.client_ca.is_some())))
            .finish()
    }
}

/// The SHA-256 digest of a token.
pub fn token_digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    rest: BTreeMap<String, RawDocument>,
    #[serde(default)]
    grpc: BTreeMap<String, RawService>,
    server: Option<RawServer>,
    asl: Option<RawAsl>,
    calls: Option<RawCalls>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCalls {
    max_response: Option<Spanned<toml::Value>>,
    allow_private: Option<bool>,
    #[serde(default)]
    allow_networks: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAsl {
    #[serde(default)]
    resources: BTreeMap<String, RawResource>,
    #[serde(default)]
    connections: BTreeMap<String, RawConnection>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResource {
    rest: Option<Spanned<String>>,
    grpc: Option<Spanned<String>>,
    worker: Option<Spanned<String>>,
    delivery: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConnection {
    #[serde(default)]
    headers: BTreeMap<String, Spanned<String>>,
    endpoints: Option<Spanned<Vec<Spanned<String>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(default)]
    tokens: Vec<RawToken>,
    peer_token: Option<Spanned<String>>,
    tls: Option<RawServerTls>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    role: Spanned<String>,
    token: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServerTls {
    cert: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    client_ca: Option<Spanned<String>>,
    #[serde(default)]
    clients: BTreeMap<String, Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDocument {
    server: Option<Spanned<String>>,
    #[serde(default)]
    headers: BTreeMap<String, Spanned<String>>,
    timeout: Option<Spanned<String>>,
    concurrency: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    target: Option<Spanned<String>>,
    #[serde(default)]
    metadata: BTreeMap<String, Spanned<String>>,
    deadline: Option<Spanned<String>>,
    concurrency: Option<Spanned<i64>>,
    ca: Option<Spanned<String>>,
    cert: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
}

/// A TOML key path, quoting the parts that are not bare keys.
fn key(parts: &[&str]) -> String {
    parts
        .iter()
        .map(|p| {
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
                p.to_string()
            } else {
                format!("{p:?}")
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// A literal value, or the environment variable `env:VAR` names.
fn secret(value: &str) -> Result<String, String> {
    match value.strip_prefix("env:") {
        Some(var) => std::env::var(var).map_err(|_| format!("environment variable {var} is not set")),
        None => Ok(value.to_string()),
    }
}

/// Checks a gRPC target: `http://host:port` (plaintext HTTP/2) or `https://host:port` (TLS).
pub fn check_target(url: &str) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| format!("{url:?} is not a URL; expected http://HOST:PORT or https://HOST:PORT"))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.authority().is_some() => Ok(()),
        _ => Err(format!(
            "{url:?} is not a URL; expected http://HOST:PORT or https://HOST:PORT"
        )),
    }
}

/// Reads a PEM file named in the configuration (relative to its folder).
fn pem(dir: &Path, name: &str, what: &str) -> Result<Vec<u8>, String> {
    let path = dir.join(name);
    let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!("{} is not a PEM file ({what})", path.display()));
    }
    Ok(bytes)
}

fn header(name: &str, value: &str) -> Result<(), String> {
    reqwest::header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("{name:?} is not a header name"))?;
    reqwest::header::HeaderValue::from_str(value)
        .map(|_| ())
        .map_err(|_| format!("the value of header {name} is not a valid header value"))
}

fn metadata(name: &str, value: &str) -> Result<(AsciiMetadataKey, AsciiMetadataValue), String> {
    let k = AsciiMetadataKey::from_bytes(name.as_bytes()).map_err(|_| {
        format!("{name:?} is not a metadata name (lower-case letters, digits, '-', '_' and '.'; not ending in -bin)")
    })?;
    let v = AsciiMetadataValue::try_from(value)
        .map_err(|_| format!("the value of metadata {name} is not visible ASCII"))?;
    Ok((k, v))
}

fn deadline(value: &str) -> Result<Duration, String> {
    sm4c_runtime::timespan::parse(value)
        .map(Duration::from_millis)
        .map_err(|e| format!("not a duration ({e})"))
}

/// A size: a number of bytes, or text with a unit (`"512KiB"`, `"4MiB"`, `"1GiB"`).
fn size(value: &toml::Value) -> Result<usize, String> {
    let shown = match value {
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::String(s) => format!("{s:?}"),
        _ => "the value".to_string(),
    };
    let bad = || format!("{shown} is not a size: a number of bytes, or \"4MiB\" (KiB, MiB or GiB)");
    let n = match value {
        toml::Value::Integer(n) => u64::try_from(*n).map_err(|_| bad())?,
        toml::Value::String(s) => {
            let s = s.trim();
            let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
            let n: u64 = digits.parse().map_err(|_| bad())?;
            let unit = match unit.trim() {
                "" | "B" => 1,
                "KiB" => 1 << 10,
                "MiB" => 1 << 20,
                "GiB" => 1 << 30,
                _ => return Err(bad()),
            };
            n.checked_mul(unit).ok_or_else(bad)?
        }
        _ => return Err(bad()),
    };
    match usize::try_from(n) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(bad()),
    }
}

/// Checks an endpoint prefix of a connection: an http(s) URL with a host and no query or fragment.
pub fn endpoint(value: &str) -> Result<reqwest::Url, String> {
    let bad = |why: &str| format!("{value:?} is not an endpoint prefix ({why}); expected https://HOST[:PORT]/PATH/");
    let url = reqwest::Url::parse(value).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(bad("not an http:// or https:// URL with a host"));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() || url.password().is_some() {
        return Err(bad("a prefix has no query, fragment or user"));
    }
    Ok(url)
}

/// Hides the value serde quotes in `invalid type: string "…"`, which may be a credential.
fn redact(message: &str) -> String {
    let mut out = String::new();
    let mut rest = message;
    while let Some(i) = rest.find("string \"") {
        out.push_str(&rest[..i + "string ".len()]);
        let mut chars = rest[i + "string \"".len()..].char_indices();
        let mut end = None;
        while let Some((j, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    end = Some(i + "string \"".len() + j + 1);
                    break;
                }
                _ => {}
            }
        }
        out.push_str("(value not shown)");
        rest = end.map_or("", |e| &rest[e..]);
    }
    out.push_str(rest);
    out
}

impl CallConfig {
    /// Reads a configuration file; every problem is reported with its line and key.
    pub fn from_file(path: &Path) -> Result<CallConfig, Vec<FileError>> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            vec![FileError {
                file: file.clone(),
                place: "/".into(),
                message: format!("cannot read: {e}"),
            }]
        })?;
        let line = |at: usize| format!("line {}", text[..at.min(text.len())].matches('\n').count() + 1);
        let raw: RawFile = toml::from_str(&text).map_err(|e| {
            vec![FileError {
                file: file.clone(),
                place: e.span().map_or_else(|| "/".to_string(), |s| line(s.start)),
                message: redact(e.message().trim()),
            }]
        })?;
        let mut errs = Vec::new();
        let mut fail = |at: usize, key: String, message: String| {
            errs.push(FileError {
                file: file.clone(),
                place: line(at),
                message: format!("{key}: {message}"),
            })
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut c = CallConfig {
            dir: Some(if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir.to_path_buf()
            }),
            ..CallConfig::default()
        };
        if let Some(calls) = &raw.calls {
            if let Some(m) = &calls.max_response {
                match size(m.get_ref()) {
                    Ok(n) => c.calls.max_response = Some(n),
                    Err(e) => fail(m.span().start, key(&["calls", "max_response"]), e),
                }
            }
            c.calls.allow_private = calls.allow_private;
            for (i, n) in calls.allow_networks.iter().enumerate() {
                match n.get_ref().parse::<ipnet::IpNet>() {
                    Ok(net) => c.calls.allow_networks.push(net.trunc()),
                    Err(_) => fail(
                        n.span().start,
                        format!("calls.allow_networks[{i}]"),
                        format!(
                            "{:?} is not a network: expected ADDRESS/BITS, as \"10.20.0.0/16\" or \"fd12::/16\"",
                            n.get_ref()
                        ),
                    ),
                }
            }
        }
        for (doc, d) in &raw.rest {
            if let Some(server) = &d.server {
                c.rest.servers.insert(doc.clone(), server.get_ref().clone());
            }
            if !d.headers.is_empty() && d.server.is_none() && doc.contains("://") && !doc.starts_with("file://") {
                fail(
                    d.headers.values().map(|v| v.span().start).min().unwrap_or(0),
                    key(&["rest", doc, "headers"]),
                    "the headers of a remote document need server, the only place they are sent (a remote document's own servers are not trusted with them)".into(),
                );
            }
            for (name, value) in &d.headers {
                match secret(value.get_ref()).and_then(|v| header(name, &v).map(|_| v)) {
                    Ok(v) => c.rest.headers.entry(doc.clone()).or_default().push((name.clone(), v)),
                    Err(m) => fail(value.span().start, key(&["rest", doc, "headers", name]), m),
                }
            }
            if let Some(t) = &d.timeout {
                match deadline(t.get_ref()) {
                    Ok(t) if !t.is_zero() => {
                        c.rest.timeouts.insert(doc.clone(), t);
                    }
                    Ok(_) => fail(
                        t.span().start,
                        key(&["rest", doc, "timeout"]),
                        "must be more than 0".into(),
                    ),
                    Err(m) => fail(t.span().start, key(&["rest", doc, "timeout"]), m),
                }
            }
            if let Some(n) = &d.concurrency {
                match usize::try_from(*n.get_ref()) {
                    Ok(v @ 1..=10_000) => {
                        c.rest.concurrency.insert(doc.clone(), v);
                    }
                    _ => fail(
                        n.span().start,
                        key(&["rest", doc, "concurrency"]),
                        format!("{} is not a number of calls from 1 to 10000", n.get_ref()),
                    ),
                }
            }
        }
        for (service, s) in &raw.grpc {
            if let Some(target) = &s.target {
                match check_target(target.get_ref()) {
                    Ok(()) => {
                        c.grpc.targets.insert(service.clone(), target.get_ref().clone());
                    }
                    Err(m) => fail(target.span().start, key(&["grpc", service, "target"]), m),
                }
            }
            for (name, value) in &s.metadata {
                match secret(value.get_ref()).and_then(|v| metadata(name, &v)) {
                    Ok(kv) => c.grpc.metadata.entry(service.clone()).or_default().push(kv),
                    Err(m) => fail(value.span().start, key(&["grpc", service, "metadata", name]), m),
                }
            }
            if let Some(d) = &s.deadline {
                match deadline(d.get_ref()) {
                    Ok(d) => {
                        c.grpc.deadlines.insert(service.clone(), d);
                    }
                    Err(m) => fail(d.span().start, key(&["grpc", service, "deadline"]), m),
                }
            }
            if let Some(n) = &s.concurrency {
                match usize::try_from(*n.get_ref()) {
                    Ok(v @ 1..=10_000) => {
                        c.grpc.concurrency.insert(service.clone(), v);
                    }
                    _ => fail(
                        n.span().start,
                        key(&["grpc", service, "concurrency"]),
                        format!("{} is not a number of calls from 1 to 10000", n.get_ref()),
                    ),
                }
            }
            let mut tls = GrpcTls::default();
            if let Some(ca) = &s.ca {
                match pem(dir, ca.get_ref(), "CA certificates") {
                    Ok(b) => tls.ca = Some(b),
                    Err(m) => fail(ca.span().start, key(&["grpc", service, "ca"]), m),
                }
            }
            match (&s.cert, &s.key) {
                (Some(cert), Some(k)) => match (
                    pem(dir, cert.get_ref(), "client certificate"),
                    pem(dir, k.get_ref(), "client key"),
                ) {
                    (Ok(c), Ok(k)) => tls.identity = Some((c, k)),
                    (Err(m), _) => fail(cert.span().start, key(&["grpc", service, "cert"]), m),
                    (_, Err(m)) => fail(k.span().start, key(&["grpc", service, "key"]), m),
                },
                (Some(one), None) | (None, Some(one)) => fail(
                    one.span().start,
                    key(&["grpc", service]),
                    "mutual TLS needs both cert and key".into(),
                ),
                (None, None) => {}
            }
            if tls.ca.is_some() || tls.identity.is_some() {
                if let Some(t) = &s.target {
                    if !t.get_ref().starts_with("https://") {
                        fail(
                            t.span().start,
                            key(&["grpc", service, "target"]),
                            "ca, cert and key are for TLS: the target must be https://HOST:PORT".into(),
                        );
                    }
                }
                if let Err(m) = tls.check() {
                    fail(0, key(&["grpc", service]), m);
                }
                c.grpc.tls.insert(service.clone(), tls);
            }
        }
        if let Some(asl) = &raw.asl {
            for (resource, r) in &asl.resources {
                let at = [&r.rest, &r.grpc, &r.worker, &r.delivery]
                    .into_iter()
                    .flatten()
                    .map(|v| v.span().start)
                    .min()
                    .unwrap_or(0);
                fn text(v: &Option<Spanned<String>>) -> Option<&str> {
                    v.as_ref().map(|v| v.get_ref().as_str())
                }
                let target = match (text(&r.rest), text(&r.grpc), text(&r.worker), text(&r.delivery)) {
                    // Only a delivery: the Resource is performed as it would be without the table.
                    (None, None, None, Some(_)) => None,
                    (rest, grpc, worker, _) => match crate::asl::check_target(resource, rest, grpc, worker) {
                        Ok(t) => Some(t),
                        Err(m) => {
                            fail(at, key(&["asl", "resources", resource]), m);
                            continue;
                        }
                    },
                };
                if let Some(d) = &r.delivery {
                    match crate::asl::check_delivery(d.get_ref(), target.as_ref()) {
                        Ok(true) => {
                            c.asl.at_most_once.insert(resource.clone());
                        }
                        Ok(false) => {}
                        Err(m) => {
                            fail(d.span().start, key(&["asl", "resources", resource]), m);
                            continue;
                        }
                    }
                }
                if let Some(t) = target {
                    c.asl.resources.insert(resource.clone(), t);
                }
            }
            for (arn, conn) in &asl.connections {
                let connection = c.asl.connections.entry(arn.clone()).or_default();
                match &conn.endpoints {
                    None => fail(
                        conn.headers.values().map(|v| v.span().start).min().unwrap_or(0),
                        key(&["asl", "connections", arn]),
                        "endpoints is missing: list the URL prefixes its headers may be sent to, endpoints = [\"https://api.example.com/v1/\"]".into(),
                    ),
                    Some(list) if list.get_ref().is_empty() => fail(
                        list.span().start,
                        key(&["asl", "connections", arn, "endpoints"]),
                        "is empty: list the URL prefixes its headers may be sent to".into(),
                    ),
                    Some(list) => {
                        for (i, e) in list.get_ref().iter().enumerate() {
                            match endpoint(e.get_ref()) {
                                Ok(u) => connection.endpoints.push(u),
                                Err(m) => fail(
                                    e.span().start,
                                    format!("{}[{i}]", key(&["asl", "connections", arn, "endpoints"])),
                                    m,
                                ),
                            }
                        }
                    }
                }
                let headers = &mut connection.headers;
                for (name, value) in &conn.headers {
                    match secret(value.get_ref()).and_then(|v| header(name, &v).map(|_| v)) {
                        Ok(v) => headers.push((name.clone(), v)),
                        Err(m) => fail(
                            value.span().start,
                            key(&["asl", "connections", arn, "headers", name]),
                            m,
                        ),
                    }
                }
            }
        }
        if let Some(server) = &raw.server {
            for (i, t) in server.tokens.iter().enumerate() {
                let at = |field: &str| format!("server.tokens[{i}].{field}");
                if !ROLES.contains(&t.role.get_ref().as_str()) {
                    fail(
                        t.role.span().start,
                        at("role"),
                        format!("{:?} is not a role: read, operate or admin", t.role.get_ref()),
                    );
                }
                match secret(t.token.get_ref()) {
                    Ok(v) if v.trim().is_empty() => {
                        fail(t.token.span().start, at("token"), "the token is empty".into())
                    }
                    Ok(v) if v.trim() != v || v.contains(char::is_whitespace) => fail(
                        t.token.span().start,
                        at("token"),
                        "a token cannot contain spaces".into(),
                    ),
                    Ok(v) => c.server.tokens.push((t.role.get_ref().clone(), token_digest(&v))),
                    Err(m) => fail(t.token.span().start, at("token"), m),
                }
            }
            if let Some(t) = &server.peer_token {
                match secret(t.get_ref()) {
                    Ok(v) if v.is_empty() => fail(
                        t.span().start,
                        "server.peer_token".into(),
                        "the peer token is empty".into(),
                    ),
                    Ok(v) => c.server.peer_token = Some(v),
                    Err(m) => fail(t.span().start, "server.peer_token".into(), m),
                }
            }
            if let Some(tls) = &server.tls {
                let file = |v: &Option<Spanned<String>>,
                            name: &str,
                            what: &str,
                            fail: &mut dyn FnMut(usize, String, String)| {
                    v.as_ref().and_then(|v| match pem(dir, v.get_ref(), what) {
                        Ok(b) => Some(b),
                        Err(m) => {
                            fail(v.span().start, key(&["server", "tls", name]), m);
                            None
                        }
                    })
                };
                let cert = file(&tls.cert, "cert", "server certificate", &mut fail);
                let k = file(&tls.key, "key", "server key", &mut fail);
                let client_ca = file(&tls.client_ca, "client_ca", "client CA certificates", &mut fail);
                match (&tls.cert, &tls.key) {
                    (Some(one), None) | (None, Some(one)) => fail(
                        one.span().start,
                        key(&["server", "tls"]),
                        "TLS needs both cert and key".into(),
                    ),
                    (None, None) => fail(0, key(&["server", "tls"]), "TLS needs both cert and key".into()),
                    _ => {}
                }
                let mut clients = Vec::new();
                for (subject, role) in &tls.clients {
                    let at = key(&["server", "tls", "clients", subject]);
                    match subject.strip_prefix("CN=") {
                        Some(cn) if !cn.is_empty() => clients.push((cn.to_string(), role.get_ref().clone())),
                        _ => fail(
                            role.span().start,
                            at.clone(),
                            "a client is named by its certificate's subject common name: \"CN=NAME\"".into(),
                        ),
                    }
                    if !ROLES.contains(&role.get_ref().as_str()) {
                        fail(
                            role.span().start,
                            at,
                            format!("{:?} is not a role: read, operate or admin", role.get_ref()),
                        );
                    }
                }
                if !tls.clients.is_empty() && tls.client_ca.is_none() {
                    fail(
                        0,
                        key(&["server", "tls", "clients"]),
                        "client certificates need client_ca, the CAs that sign them".into(),
                    );
                }
                if let (Some(cert), Some(key)) = (cert, k) {
                    c.server.tls = Some(ServerTls {
                        cert,
                        key,
                        client_ca,
                        clients,
                    });
                }
            }
        }
        if errs.is_empty() {
            Ok(c)
        } else {
            Err(errs)
        }
    }

    /// `--rest-server DOCUMENT=URL`: replaces the document's server.
    pub fn rest_server(&mut self, flag: &str) -> Result<(), String> {
        let (doc, url) = flag
            .split_once('=')
            .ok_or_else(|| format!("--rest-server {flag:?}: expected DOCUMENT=URL"))?;
        self.rest.servers.insert(doc.to_string(), url.to_string());
        Ok(())
    }

    /// `--rest-header DOCUMENT=NAME:VALUE` or `DOCUMENT=NAME:env:VAR`: adds a header to the
    /// document's calls, replacing one of the same name from the file.
    pub fn rest_header(&mut self, flag: &str) -> Result<(), String> {
        let usage = || "--rest-header: expected DOCUMENT=NAME:VALUE".to_string();
        let (doc, header_flag) = flag.split_once('=').ok_or_else(usage)?;
        let (name, value) = header_flag.split_once(':').ok_or_else(usage)?;
        let (name, value) = (name.trim(), value.trim());
        let value = secret(value)
            .and_then(|v| header(name, &v).map(|_| v))
            .map_err(|e| format!("--rest-header {doc}={name}: {e}"))?;
        let headers = self.rest.headers.entry(doc.to_string()).or_default();
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        headers.push((name.to_string(), value));
        Ok(())
    }

    /// Refuses headers of a remote document (`--rest-header`, or the file) without a server: its
    /// own `servers` are not trusted with them.
    pub fn check_rest_headers(&self) -> Result<(), String> {
        for (doc, headers) in &self.rest.headers {
            let remote = doc.contains("://") && !doc.starts_with("file://");
            if remote && !headers.is_empty() && !self.rest.servers.contains_key(doc) {
                return Err(format!(
                    "the headers of {doc} need a server (--rest-server {doc}=URL or server in [rest.\"{doc}\"]), the only place they are sent: a remote document's own servers are not trusted with them"
                ));
            }
        }
        Ok(())
    }

    /// `--grpc-target SERVICE=URL`: where a gRPC service runs, replacing the file's target.
    pub fn grpc_target(&mut self, flag: &str) -> Result<(), String> {
        let (service, url) = flag.split_once('=').ok_or_else(|| {
            format!("--grpc-target {flag:?}: expected package.Service=http://HOST:PORT (or https://)")
        })?;
        check_target(url).map_err(|e| format!("--grpc-target {service}: {e}"))?;
        self.grpc.targets.insert(service.to_string(), url.to_string());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<CallConfig, Vec<String>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sm4c.toml");
        std::fs::write(&path, text).unwrap();
        CallConfig::from_file(&path).map_err(|errs| {
            errs.into_iter()
                .map(|e| format!("{}: {}", e.place, e.message))
                .collect()
        })
    }

    #[test]
    fn reads_rest_and_grpc_sections() {
        std::env::set_var("SM4C_CONFIG_TEST_KEY", "k-123");
        let c = load(
            "[rest.\"file://api.json\"]\nserver = \"http://localhost:1\"\nheaders = { x-api-key = \"env:SM4C_CONFIG_TEST_KEY\", x-tenant = \"acme\" }\n\n[grpc.\"shop.v1.Inventory\"]\ntarget = \"http://127.0.0.1:50051\"\nmetadata = { authorization = \"Bearer t\" }\ndeadline = \"1.5s\"\n",
        )
        .unwrap();
        assert_eq!(c.rest.servers["file://api.json"], "http://localhost:1");
        assert_eq!(
            c.rest.headers["file://api.json"],
            vec![
                ("x-api-key".to_string(), "k-123".to_string()),
                ("x-tenant".to_string(), "acme".to_string())
            ]
        );
        assert_eq!(c.grpc.targets["shop.v1.Inventory"], "http://127.0.0.1:50051");
        assert_eq!(c.grpc.metadata["shop.v1.Inventory"][0].0.as_str(), "authorization");
        assert_eq!(c.grpc.deadlines["shop.v1.Inventory"], Duration::from_millis(1500));
    }

    #[test]
    fn rest_documents_take_a_timeout_and_a_concurrency_bound() {
        let c = load("[rest.\"file://api.json\"]\ntimeout = \"2s\"\nconcurrency = 4\n").unwrap();
        assert_eq!(c.rest.timeouts["file://api.json"], Duration::from_secs(2));
        assert_eq!(c.rest.concurrency["file://api.json"], 4);
        let errs = load("[rest.\"a.json\"]\ntimeout = \"soon\"\nconcurrency = 0\n").unwrap_err();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs[0].starts_with("line 2: rest.\"a.json\".timeout: not a duration"),
            "{errs:?}"
        );
        assert_eq!(
            errs[1],
            "line 3: rest.\"a.json\".concurrency: 0 is not a number of calls from 1 to 10000"
        );
    }

    #[test]
    fn grpc_services_take_a_concurrency_bound() {
        let c = load(
            "[grpc.\"shop.v1.Inventory\"]\ntarget = \"http://127.0.0.1:50051\"\ndeadline = \"2s\"\nconcurrency = 4\n\n[grpc.\"a.B\"]\nconcurrency = 10000\n\n[grpc.\"c.D\"]\ntarget = \"http://127.0.0.1:1\"\n",
        )
        .unwrap();
        assert_eq!(c.grpc.concurrency["shop.v1.Inventory"], 4);
        assert_eq!(c.grpc.deadlines["shop.v1.Inventory"], Duration::from_secs(2));
        assert_eq!(c.grpc.concurrency["a.B"], 10_000);
        // Unset: the invoker's default, the same as REST's.
        assert!(!c.grpc.concurrency.contains_key("c.D"));
        assert_eq!(crate::grpc::DEFAULT_CONCURRENCY, 64);
        let errs = load(
            "[grpc.\"a.B\"]\nconcurrency = 0\n[grpc.\"c.D\"]\nconcurrency = 10001\n[grpc.\"e.F\"]\nconcurrency = -3\n",
        )
        .unwrap_err();
        assert_eq!(
            errs,
            vec![
                "line 2: grpc.\"a.B\".concurrency: 0 is not a number of calls from 1 to 10000",
                "line 4: grpc.\"c.D\".concurrency: 10001 is not a number of calls from 1 to 10000",
                "line 6: grpc.\"e.F\".concurrency: -3 is not a number of calls from 1 to 10000",
            ]
        );
        // Not a number: the parse error, with its line.
        let errs = load("[grpc.\"a.B\"]\ntarget = \"http://x:1\"\nconcurrency = \"8\"\n").unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].starts_with("line 3: invalid type"), "{errs:?}");
    }

    #[test]
    fn errors_name_the_line_and_key_and_never_the_secret() {
        let errs = load(
            "[grpc.\"a.B\"]\ntarget = \"ftp://x:1\"\nmetadata = { \"bad name\" = \"s3cret\", token = \"env:SM4C_CONFIG_TEST_UNSET\" }\ndeadline = \"soon\"\n",
        )
        .unwrap_err();
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert!(errs[0].starts_with("line 2: grpc.\"a.B\".target: "), "{errs:?}");
        assert!(
            errs[1].starts_with("line 3: grpc.\"a.B\".metadata.\"bad name\": \"bad name\" is not a metadata name"),
            "{errs:?}"
        );
        assert_eq!(
            errs[2],
            "line 3: grpc.\"a.B\".metadata.token: environment variable SM4C_CONFIG_TEST_UNSET is not set"
        );
        assert!(
            errs[3].starts_with("line 4: grpc.\"a.B\".deadline: not a duration"),
            "{errs:?}"
        );
        assert!(!errs.iter().any(|e| e.contains("s3cret")), "{errs:?}");
        // A secret in the wrong place is not quoted by the parse error either.
        let errs = load("\n[rest.\"api.json\"]\nheaders = \"s3cret\"\n").unwrap_err();
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("line 3: "), "{errs:?}");
        assert!(!errs[0].contains("s3cret"), "{errs:?}");
        // Unknown keys are refused with their line.
        let errs = load("[grpc.\"a.B\"]\ntarget = \"http://x:1\"\ntimeout = \"1s\"\n").unwrap_err();
        assert!(errs[0].starts_with("line 3: unknown field `timeout`"), "{errs:?}");
    }

    #[test]
    fn flags_override_and_extend_the_file() {
        let mut c = load(
            "[rest.\"d\"]\nheaders = { X-Key = \"old\", x-other = \"o\" }\n[grpc.\"a.B\"]\ntarget = \"http://x:1\"\n",
        )
        .unwrap();
        c.rest_header("d=x-key:new").unwrap();
        c.grpc_target("a.B=http://y:2").unwrap();
        c.rest_server("d=http://z").unwrap();
        assert_eq!(
            c.rest.headers["d"],
            vec![
                ("x-other".to_string(), "o".to_string()),
                ("x-key".to_string(), "new".to_string())
            ]
        );
        assert_eq!(c.grpc.targets["a.B"], "http://y:2");
        assert_eq!(c.rest.servers["d"], "http://z");
        assert!(c.grpc_target("a.B").unwrap_err().contains("expected"));
        let e = c.rest_header("d=x-key:env:SM4C_CONFIG_TEST_UNSET").unwrap_err();
        assert_eq!(
            e,
            "--rest-header d=x-key: environment variable SM4C_CONFIG_TEST_UNSET is not set"
        );
    }

    #[test]
    fn reads_the_server_section_keeping_only_token_digests() {
        std::env::set_var("SM4C_CONFIG_TEST_TOKEN", "from-env");
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("certs")).unwrap();
        for f in ["a.pem", "a.key", "ca.pem"] {
            std::fs::write(dir.path().join("certs").join(f), "-----BEGIN X-----\n-----END X-----\n").unwrap();
        }
        let path = dir.path().join("sm4c.toml");
        std::fs::write(
            &path,
            "[server]\ntokens = [{ role = \"admin\", token = \"lit\" }, { role = \"read\", token = \"env:SM4C_CONFIG_TEST_TOKEN\" }]\n[server.tls]\ncert = \"certs/a.pem\"\nkey = \"certs/a.key\"\nclient_ca = \"certs/ca.pem\"\nclients = { \"CN=ops team\" = \"operate\" }\n",
        )
        .unwrap();
        let c = CallConfig::from_file(&path).unwrap();
        assert_eq!(
            c.server.tokens,
            vec![
                ("admin".to_string(), token_digest("lit")),
                ("read".to_string(), token_digest("from-env"))
            ]
        );
        let tls = c.server.tls.as_ref().unwrap();
        assert!(tls.cert.starts_with(b"-----BEGIN X") && tls.client_ca.is_some());
        assert_eq!(tls.clients, vec![("ops team".to_string(), "operate".to_string())]);
        let debug = format!("{c:?}");
        assert!(!debug.contains("lit") && !debug.contains("from-env"), "{debug}");
        // Empty tokens and tokens with spaces are refused; an unknown key in a token too.
        let errs =
            load("[server]\ntokens = [{ role = \"read\", token = \"\" },\n { role = \"read\", token = \"a b\" }]\n")
                .unwrap_err();
        assert_eq!(
            errs,
            vec![
                "line 2: server.tokens[0].token: the token is empty",
                "line 3: server.tokens[1].token: a token cannot contain spaces"
            ]
        );
        let errs = load("[server]\ntokens = [{ role = \"read\", token = \"t\", note = \"x\" }]\n").unwrap_err();
        assert!(errs[0].contains("unknown field `note`"), "{errs:?}");
    }

    #[test]
    fn reads_the_peer_token_and_keeps_it_out_of_debug() {
        std::env::set_var("SM4C_CONFIG_TEST_PEER", "peer-s3cret-from-env");
        let c = load("[server]\npeer_token = \"env:SM4C_CONFIG_TEST_PEER\"\n").unwrap();
        assert_eq!(c.server.peer_token.as_deref(), Some("peer-s3cret-from-env"));
        let debug = format!("{c:?}");
        assert!(!debug.contains("s3cret") && debug.contains("peer_token"), "{debug}");
        assert_eq!(load("[server]\n").unwrap().server.peer_token, None);
        assert_eq!(
            load("[server]\npeer_token = \"\"\n").unwrap_err(),
            vec!["line 2: server.peer_token: the peer token is empty"]
        );
        assert_eq!(
            load("[server]\npeer_token = \"env:SM4C_CONFIG_TEST_UNSET_PEER\"\n").unwrap_err(),
            vec!["line 2: server.peer_token: environment variable SM4C_CONFIG_TEST_UNSET_PEER is not set"]
        );
    }

    #[test]
    fn reads_the_asl_section_and_names_bad_entries() {
        std::env::set_var("SM4C_CONFIG_TEST_CONN", "Bearer c-1");
        let c = load(
            "[asl.resources.\"arn:aws:lambda:us-east-1:1:function:charge\"]\nrest = \"pay.yaml#charge\"\n[asl.resources.\"arn:x:grpc\"]\ngrpc = \"s.proto#a.B/C\"\n[asl.resources.\"arn:aws:states:::sqs:sendMessage.waitForTaskToken\"]\nworker = \"approvals\"\n[asl.connections.\"arn:conn\"]\nheaders = { authorization = \"env:SM4C_CONFIG_TEST_CONN\" }\nendpoints = [\"https://api.example.com/v1/\"]\n",
        )
        .unwrap();
        use crate::asl::AslTarget;
        assert_eq!(
            c.asl.resources["arn:aws:lambda:us-east-1:1:function:charge"],
            AslTarget::Rest("pay.yaml#charge".into())
        );
        assert_eq!(c.asl.resources["arn:x:grpc"], AslTarget::Grpc("s.proto#a.B/C".into()));
        assert_eq!(
            c.asl.task_lists()["arn:aws:states:::sqs:sendMessage.waitForTaskToken"],
            "approvals"
        );
        assert_eq!(
            c.asl.connections["arn:conn"].headers,
            vec![("authorization".to_string(), "Bearer c-1".to_string())]
        );
        assert_eq!(
            c.asl.connections["arn:conn"].endpoints,
            vec![reqwest::Url::parse("https://api.example.com/v1/").unwrap()]
        );
        let errs = load(
            "[asl.resources.a]\nrest = \"no-operation\"\n\n[asl.resources.\"b.waitForTaskToken\"]\ngrpc = \"s.proto#a.B/C\"\n[asl.resources.c]\nworker = \"x\"\nrest = \"d#o\"\n[asl.connections.k]\nheaders = { \"bad name\" = \"s3cret\" }\nendpoints = [\"https://x/\"]\n",
        )
        .unwrap_err();
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert!(
            errs[0].starts_with("line 2: asl.resources.a: rest = \"no-operation\" must be"),
            "{errs:?}"
        );
        assert!(
            errs[1].starts_with("line 5: asl.resources.\"b.waitForTaskToken\": a .waitForTaskToken"),
            "{errs:?}"
        );
        assert!(
            errs[2].starts_with("line 7: asl.resources.c: give only one"),
            "{errs:?}"
        );
        assert!(
            errs[3].starts_with("line 10: asl.connections.k.headers.\"bad name\": "),
            "{errs:?}"
        );
        assert!(!errs.iter().any(|e| e.contains("s3cret")), "{errs:?}");
        let errs = load("[asl.resources.a]\nlambda = \"x\"\n").unwrap_err();
        assert!(errs[0].starts_with("line 2: unknown field `lambda`"), "{errs:?}");
    }

    #[test]
    fn asl_resources_say_their_delivery_alone_or_beside_their_target() {
        let c = load(
            "[asl.resources.\"arn:aws:states:::http:invoke\"]\ndelivery = \"atMostOnce\"\n[asl.resources.a]\nrest = \"d#o\"\ndelivery = \"atMostOnce\"\n[asl.resources.b]\nrest = \"d#o\"\ndelivery = \"atLeastOnce\"\n",
        )
        .unwrap();
        // The HTTP Task stays sm4c's own (no binding), and is atMostOnce.
        assert!(!c.asl.resources.contains_key("arn:aws:states:::http:invoke"));
        assert_eq!(
            c.asl.at_most_once.iter().map(String::as_str).collect::<Vec<_>>(),
            ["a", "arn:aws:states:::http:invoke"]
        );
        assert_eq!(c.asl.resources["a"], crate::asl::AslTarget::Rest("d#o".into()));
        assert_eq!(c.asl.resources["b"], crate::asl::AslTarget::Rest("d#o".into()));
        let errs = load("[asl.resources.a]\nrest = \"d#o\"\ndelivery = 1\n").unwrap_err();
        assert!(errs[0].starts_with("line 3:"), "{errs:?}");
        let errs = load("[asl.resources.w]\nworker = \"jobs\"\ndelivery = \"atMostOnce\"\n").unwrap_err();
        assert!(
            errs[0].starts_with("line 3: asl.resources.w: delivery = \"atMostOnce\" applies to calls sm4c makes"),
            "{errs:?}"
        );
    }

    #[test]
    fn a_connection_lists_its_endpoints_or_is_refused() {
        let errs = load("[asl.connections.\"arn:c\"]\nheaders = { authorization = \"s3cret\" }\n").unwrap_err();
        assert_eq!(
            errs,
            vec!["line 2: asl.connections.\"arn:c\": endpoints is missing: list the URL prefixes its headers may be sent to, endpoints = [\"https://api.example.com/v1/\"]"]
        );
        let errs = load(
            "[asl.connections.a]\nheaders = { authorization = \"s3cret\" }\nendpoints = []\n[asl.connections.b]\nendpoints = [\"https://ok.example/\", \"ftp://x/\", \"https://x/?q=1\", \"not a url\"]\n",
        )
        .unwrap_err();
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert_eq!(
            errs[0],
            "line 3: asl.connections.a.endpoints: is empty: list the URL prefixes its headers may be sent to"
        );
        assert!(
            errs[1].starts_with("line 5: asl.connections.b.endpoints[1]: \"ftp://x/\" is not an endpoint prefix"),
            "{errs:?}"
        );
        assert!(
            errs[2].starts_with("line 5: asl.connections.b.endpoints[2]: "),
            "{errs:?}"
        );
        assert!(
            errs[3].starts_with("line 5: asl.connections.b.endpoints[3]: "),
            "{errs:?}"
        );
        assert!(!errs.iter().any(|e| e.contains("s3cret")), "{errs:?}");
    }

    #[test]
    fn the_calls_section_sets_the_cap_and_the_allowed_networks() {
        let c = load("[calls]\nmax_response = \"512KiB\"\nallow_private = false\nallow_networks = [\"10.20.3.4/16\", \"fd12::/16\"]\n").unwrap();
        assert_eq!(c.calls.max_response, Some(512 << 10));
        let net = c.net_policy(false);
        assert!(!net.allow_private, "the file's false wins over sm4c run's default");
        assert_eq!(net.max_response, 512 << 10);
        assert!(net.check_ip("h", "10.20.9.9".parse().unwrap()).is_ok());
        assert!(net.check_ip("h", "10.21.9.9".parse().unwrap()).is_err());
        assert!(net.check_ip("h", "fd12::1".parse().unwrap()).is_ok());
        // The defaults: 4 MiB, private addresses refused by serve and allowed by run.
        let c = load("").unwrap();
        assert_eq!(c.net_policy(true).max_response, 4 << 20);
        assert!(!c.net_policy(true).allow_private);
        assert!(c.net_policy(false).allow_private);
        assert_eq!(
            load("[calls]\nmax_response = 1000\n").unwrap().calls.max_response,
            Some(1000)
        );
        let errs = load("[calls]\nmax_response = \"4 parsecs\"\nallow_networks = [\"10.0.0.0/33\"]\n").unwrap_err();
        assert_eq!(
            errs,
            vec![
                "line 2: calls.max_response: \"4 parsecs\" is not a size: a number of bytes, or \"4MiB\" (KiB, MiB or GiB)",
                "line 3: calls.allow_networks[0]: \"10.0.0.0/33\" is not a network: expected ADDRESS/BITS, as \"10.20.0.0/16\" or \"fd12::/16\"",
            ]
        );
        assert!(load("[calls]\nmax_response = 0\n").unwrap_err()[0].contains("is not a size"));
    }

    #[test]
    fn headers_of_a_remote_document_need_a_server() {
        let errs =
            load("[rest.\"https://specs.example.com/api.yaml\"]\nheaders = { x-key = \"s3cret\" }\n").unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("line 2: rest.\"https://specs.example.com/api.yaml\".headers: the headers of a remote document need server"),
            "{errs:?}"
        );
        let c = load("[rest.\"https://specs.example.com/api.yaml\"]\nserver = \"https://api.example.com\"\nheaders = { x-key = \"k\" }\n[rest.\"api.yaml\"]\nheaders = { x-key = \"k\" }\n").unwrap();
        assert_eq!(c.check_rest_headers(), Ok(()));
        let mut c = CallConfig::default();
        c.rest_header("https://specs.example.com/api.yaml=x-key:k").unwrap();
        assert!(c.check_rest_headers().unwrap_err().contains("need a server"));
        c.rest_server("https://specs.example.com/api.yaml=https://api.example.com")
            .unwrap();
        assert_eq!(c.check_rest_headers(), Ok(()));
    }

    #[test]
    fn debug_of_the_configuration_shows_no_credential() {
        std::env::set_var("SM4C_CONFIG_TEST_DEBUG", "env-s3cret");
        let c = load(
            "[rest.\"api.json\"]\nserver = \"http://localhost:1\"\nheaders = { x-api-key = \"rest-s3cret\" }\n[grpc.\"a.B\"]\ntarget = \"http://x:1\"\nmetadata = { authorization = \"grpc-s3cret\" }\n[asl.connections.c]\nheaders = { authorization = \"env:SM4C_CONFIG_TEST_DEBUG\" }\nendpoints = [\"https://x/\"]\n[server]\ntokens = [{ role = \"read\", token = \"token-s3cret\" }]\n",
        )
        .unwrap();
        for shown in [
            format!("{c:?}"),
            format!("{:?}", c.rest),
            format!("{:?}", c.grpc),
            format!("{:?}", c.asl),
            format!("{:?}", c.asl.connections["c"]),
        ] {
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        let all = format!("{c:?}");
        for name in ["x-api-key", "authorization", "https://x/"] {
            assert!(all.contains(name), "{name} missing from {all}");
        }
    }

    #[test]
    fn redact_hides_quoted_strings_only() {
        assert_eq!(
            redact("invalid type: string \"a\\\"b\", expected a map"),
            "invalid type: string (value not shown), expected a map"
        );
        assert_eq!(redact("unknown field `x`"), "unknown field `x`");
    }
}
