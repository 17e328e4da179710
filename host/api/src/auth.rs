//! Authentication and roles of the HTTP API.
//!
//! A request proves who it is with a bearer token (`Authorization: Bearer TOKEN`) or, over mutual
//! TLS, with a client certificate whose subject common name is mapped to a role. Three roles, each
//! implying the ones below it:
//!
//! - `read`: every `GET`, and `POST /events/explain` (which delivers nothing);
//! - `operate`: starting, cancelling instances, sending events, polling and answering tasks (workers);
//! - `admin`: registering definitions (`POST /definitions`).
//!
//! `GET /healthz`, `GET /openapi.json` and the web inspector's assets (`/ui`, not its data) stay open. Tokens are kept as their SHA-256 digests and
//! compared in constant time; no message or log quotes them. Without any token or client mapping,
//! [`Auth::is_on`] is false and [`layer`] lets every request through.
//!
//! The workers of a Kafka group authenticate to each other with a token of their own, the group's
//! [`PeerToken`], never with a caller's credentials: a request one worker forwards to another
//! carries the peer token in [`PEER_TOKEN`] and the role its caller authenticated with at the first
//! worker in [`CALLER_ROLE`]. The receiving worker trusts that role only when the peer token is
//! valid (compared by digest in constant time, like the API tokens); a client cannot name its own
//! role, nor pass as a forwarded request ([`crate::cluster::FORWARDED`] is removed from requests
//! that carry no peer token).

use crate::errors::{Forbidden, Unauthenticated};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// What a caller may do; each role implies the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Every `GET`.
    Read,
    /// Starting and cancelling instances, sending events, worker task lists.
    Operate,
    /// Registering definitions.
    Admin,
}

impl Role {
    /// Every role, from the least to the most allowed.
    pub const ALL: [Role; 3] = [Role::Read, Role::Operate, Role::Admin];

    /// Its name in the configuration file and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not a role: read, operate or admin"))
    }
}

/// The SHA-256 digest of a token, the only form in which the server keeps it.
pub fn digest(token: &str) -> [u8; 32] {
    digest_bytes(token.as_bytes())
}

fn digest_bytes(token: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The header of a request from another worker of the group: the group's [`PeerToken`].
pub const PEER_TOKEN: &str = "sm4c-peer-token";

/// The header of a request from another worker of the group: the [`Role`] its caller
/// authenticated with there. Trusted only beside a valid [`PEER_TOKEN`].
pub const CALLER_ROLE: &str = "sm4c-caller-role";

/// The secret the workers of a group share to authenticate to each other (`[server] peer_token`
/// in the configuration file, or `SM4C_PEER_TOKEN`). Its `Debug` hides it, and it goes out only
/// in the [`PEER_TOKEN`] header, marked sensitive.
#[derive(Clone)]
pub struct PeerToken(HeaderValue);

impl PeerToken {
    /// A peer token: at least 16 characters, printable ASCII without spaces (it travels in a
    /// header). The error never quotes it.
    pub fn new(token: &str) -> Result<PeerToken, String> {
        if token.is_empty() {
            return Err("the peer token is empty".into());
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("a peer token is printable ASCII without spaces".into());
        }
        if token.len() < 16 {
            return Err(format!(
                "the peer token has {} characters: use at least 16 (e.g. `openssl rand -hex 32`)",
                token.len()
            ));
        }
        let mut v = HeaderValue::from_str(token).map_err(|_| "a peer token is printable ASCII without spaces")?;
        v.set_sensitive(true);
        Ok(PeerToken(v))
    }

    /// Its SHA-256 digest, what the receiving worker keeps ([`Auth::peer`]).
    pub fn digest(&self) -> [u8; 32] {
        digest_bytes(self.0.as_bytes())
    }

    /// The header value sent to the other workers.
    pub(crate) fn header(&self) -> HeaderValue {
        self.0.clone()
    }
}

impl fmt::Debug for PeerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PeerToken(hidden)")
    }
}

/// The role a request's caller authenticated with, which the authentication layer puts in the
/// request's extensions: a worker that forwards the request names it to the other ([`CALLER_ROLE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Authenticated(pub Role);

/// Who may do what: token digests and client certificate names with their roles, and the digest
/// of the group's peer token.
#[derive(Default, Clone)]
pub struct Auth {
    tokens: Vec<([u8; 32], Role)>,
    clients: BTreeMap<String, Role>,
    peer: Option<[u8; 32]>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("tokens", &self.tokens.len())
            .field("clients", &self.clients)
            .field("peer", &self.peer.is_some())
            .finish()
    }
}

impl Auth {
    /// Adds a token by its [`digest`].
    pub fn token(&mut self, role: Role, digest: [u8; 32]) {
        self.tokens.push((digest, role));
    }

    /// Maps the subject common name of a verified client certificate to a role.
    pub fn client(&mut self, common_name: impl Into<String>, role: Role) {
        self.clients.insert(common_name.into(), role);
    }

    /// Accepts requests from the other workers of the group that carry the peer token of this
    /// [`PeerToken::digest`], with the role they name for their caller.
    pub fn peer(&mut self, digest: [u8; 32]) {
        self.peer = Some(digest);
    }

    /// Whether a peer token is configured.
    pub fn has_peer(&self) -> bool {
        self.peer.is_some()
    }

    /// Whether requests must authenticate (some token or client certificate is configured).
    pub fn is_on(&self) -> bool {
        !self.tokens.is_empty() || !self.clients.is_empty()
    }

    /// The role of a token, comparing its digest with every known one in constant time.
    fn role_of_token(&self, token: &str) -> Option<Role> {
        let d = digest(token);
        let mut found = None;
        for (known, role) in &self.tokens {
            if bool::from(known.ct_eq(&d)) {
                found = found.max(Some(*role));
            }
        }
        found
    }
}

/// The client of a connection: the subject common name of its verified TLS client certificate.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// `None` over plain HTTP, or over TLS without a client certificate.
    pub common_name: Option<String>,
}

/// The role a request needs, `None` for the open endpoints.
pub fn needs(method: &Method, path: &str) -> Option<Role> {
    match (method, path) {
        (&Method::GET | &Method::HEAD, "/healthz" | "/openapi.json") => None,
        // The inspector's page holds no data: it asks for a token and reads the API with it.
        (&Method::GET | &Method::HEAD, p) if crate::ui::is_asset(p) => None,
        (&Method::GET | &Method::HEAD, _) => Some(Role::Read),
        (&Method::POST, "/definitions") => Some(Role::Admin),
        // A batch acts on many instances at once (a dry run too is a POST /batches).
        (&Method::POST, p) if p == "/batches" || p.starts_with("/batches/") => Some(Role::Admin),
        // Which version takes traffic is the same decision as registering one.
        (&Method::PUT | &Method::DELETE, p) if p.starts_with("/definitions/") && p.ends_with("/default-version") => {
            Some(Role::Admin)
        }
        (&Method::POST, "/events/explain") => Some(Role::Read),
        // A report: it changes nothing.
        (&Method::POST, p) if p.starts_with("/definitions/") && p.ends_with("/upgrade-check") => Some(Role::Read),
        _ => Some(Role::Operate),
    }
}

/// Adds authentication to a router when `auth` [is on](Auth::is_on); otherwise returns it as it is.
pub fn layer(router: Router, auth: Auth) -> Router {
    if !auth.is_on() {
        return router;
    }
    router.layer(axum::middleware::from_fn_with_state(Arc::new(auth), check))
}

/// What `GET /healthz` says instead of a failed dependency's error to a caller that did not
/// authenticate: the error may name hosts, files and accounts.
pub const HIDDEN_ERROR: &str = "a dependency failed; authenticate (any role) to read its error";

/// `GET /healthz` as a caller without credentials reads it: its `error` text replaced by
/// [`HIDDEN_ERROR`].
pub fn redact_health(health: &mut serde_json::Value) {
    if let Some(e) = health.get_mut("error").filter(|e| !e.is_null()) {
        *e = serde_json::Value::String(HIDDEN_ERROR.into());
    }
}

/// Whether a request carries credentials the server knows (a valid bearer token, or a client
/// certificate with a role).
fn authenticated(auth: &Auth, req: &Request) -> bool {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    if bearer.is_some_and(|t| auth.role_of_token(t).is_some()) {
        return true;
    }
    req.extensions()
        .get::<ConnectInfo<Peer>>()
        .and_then(|ConnectInfo(p)| p.common_name.as_ref())
        .is_some_and(|cn| auth.clients.contains_key(cn))
}

/// Whether `given` is the group's peer token, compared by digest in constant time.
fn is_peer(auth: &Auth, given: &HeaderValue) -> bool {
    auth.peer
        .as_ref()
        .is_some_and(|known| bool::from(known.ct_eq(&digest_bytes(given.as_bytes()))))
}

async fn check(State(auth): State<Arc<Auth>>, mut req: Request, next: Next) -> Response {
    if let Some(given) = req.headers().get(PEER_TOKEN) {
        return from_peer(&auth, is_peer(&auth, given), req, next).await;
    }
    // Only another worker may say a request was forwarded, and name its caller's role.
    req.headers_mut().remove(crate::cluster::FORWARDED);
    req.headers_mut().remove(CALLER_ROLE);
    let Some(needed) = needs(req.method(), req.uri().path()) else {
        if req.uri().path() == "/healthz" && !authenticated(&auth, &req) {
            return hide_health(next.run(req).await).await;
        }
        return next.run(req).await;
    };
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or("").trim())
        .map(|v| match v.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => Some(token.trim()),
            _ => None,
        });
    let role = match bearer {
        Some(Some(token)) => match auth.role_of_token(token) {
            Some(r) => r,
            None => return unauthenticated("the bearer token is not valid"),
        },
        Some(None) => return unauthenticated("the Authorization header must be `Bearer TOKEN`"),
        None => {
            let cn = req
                .extensions()
                .get::<ConnectInfo<Peer>>()
                .and_then(|ConnectInfo(p)| p.common_name.clone());
            match cn.as_ref().and_then(|cn| auth.clients.get(cn)) {
                Some(r) => *r,
                None => {
                    return unauthenticated(&match cn {
                        Some(cn) => format!("the client certificate CN={cn} has no role and no bearer token was sent"),
                        None => "this request needs a bearer token (Authorization: Bearer TOKEN)".into(),
                    })
                }
            }
        }
    };
    if role < needed {
        return Forbidden(role.to_string(), needed.to_string()).into_response();
    }
    req.extensions_mut().insert(Authenticated(role));
    next.run(req).await
}

/// A request from another worker of the group (it carries [`PEER_TOKEN`], `valid` or not): with a
/// valid peer token, answered as its caller's role ([`CALLER_ROLE`]) allows, here, never forwarded
/// again.
async fn from_peer(auth: &Auth, valid: bool, mut req: Request, next: Next) -> Response {
    if !valid {
        return unauthenticated(match auth.peer {
            Some(_) => "the peer token (sm4c-peer-token) is not valid: the workers of a group must share one",
            None => "this worker has no peer token configured, so it takes no request from another worker",
        });
    }
    let role = req
        .headers()
        .get(CALLER_ROLE)
        .and_then(|v| v.to_str().ok())
        .map(str::parse::<Role>);
    let Some(Ok(role)) = role else {
        return unauthenticated(
            "a request from another worker names its caller's role (sm4c-caller-role: read, operate or admin)",
        );
    };
    if let Some(needed) = needs(req.method(), req.uri().path()) {
        if role < needed {
            return Forbidden(role.to_string(), needed.to_string()).into_response();
        }
    }
    req.headers_mut()
        .insert(crate::cluster::FORWARDED, HeaderValue::from_static("1"));
    req.extensions_mut().insert(Authenticated(role));
    next.run(req).await
}

/// The health answer `r` with its error text hidden ([`redact_health`]).
async fn hide_health(r: Response) -> Response {
    let (mut parts, body) = r.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "health unreadable").into_response();
    };
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    redact_health(&mut v);
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(v.to_string()))
}

fn unauthenticated(why: &str) -> Response {
    let mut r = Unauthenticated(why.to_string()).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"sm4c\""),
    );
    r
}

/// The subject common name of a DER certificate, if it has one.
pub fn common_name(cert: &[u8]) -> Option<String> {
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version?, serialNumber, signature,
    // issuer, validity, subject, ... }, ... }
    let (_, cert_body, _) = tlv(cert)?;
    let (_, mut tbs, _) = tlv(cert_body)?;
    let mut fields = Vec::new();
    while !tbs.is_empty() && fields.len() < 6 {
        let (tag, value, rest) = tlv(tbs)?;
        fields.push((tag, value));
        tbs = rest;
    }
    let skip = usize::from(fields.first()?.0 == 0xa0);
    let (tag, mut subject) = *fields.get(skip + 4)?;
    if tag != 0x30 {
        return None;
    }
    let mut found = None;
    // Name ::= SEQUENCE OF SET OF SEQUENCE { type OID, value }; the last CN wins, as in most tools.
    while !subject.is_empty() {
        let (_, mut set, rest) = tlv(subject)?;
        subject = rest;
        while !set.is_empty() {
            let (_, attr, rest) = tlv(set)?;
            set = rest;
            let (tag, oid, value) = tlv(attr)?;
            if tag == 0x06 && oid == [0x55, 0x04, 0x03] {
                let (tag, text, _) = tlv(value)?;
                // UTF8String, PrintableString, IA5String, TeletexString
                if matches!(tag, 0x0c | 0x13 | 0x16 | 0x14) {
                    found = Some(String::from_utf8_lossy(text).into_owned());
                }
            }
        }
    }
    found
}

/// One DER tag-length-value: (tag, value, the bytes after it).
fn tlv(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *der.first()?;
    let first = *der.get(1)?;
    let (len, head) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for b in der.get(2..2 + n)? {
            len = (len << 8) | usize::from(*b);
        }
        (len, 2 + n)
    };
    let value = der.get(head..head.checked_add(len)?)?;
    Some((tag, value, &der[head + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_imply_the_ones_below() {
        assert!(Role::Admin > Role::Operate && Role::Operate > Role::Read);
        assert_eq!("operate".parse::<Role>(), Ok(Role::Operate));
        assert!("root".parse::<Role>().unwrap_err().contains("read, operate or admin"));
    }

    #[test]
    fn what_each_request_needs() {
        assert_eq!(needs(&Method::GET, "/healthz"), None);
        assert_eq!(needs(&Method::GET, "/openapi.json"), None);
        assert_eq!(needs(&Method::GET, "/instances/x"), Some(Role::Read));
        assert_eq!(needs(&Method::GET, "/ui"), None);
        assert_eq!(needs(&Method::GET, "/ui/app.js"), None);
        assert_eq!(needs(&Method::GET, "/ui/events"), Some(Role::Read));
        assert_eq!(needs(&Method::GET, "/ui/api/instance"), Some(Role::Read));
        assert_eq!(needs(&Method::GET, "/metrics"), Some(Role::Read));
        assert_eq!(needs(&Method::GET, "/members"), Some(Role::Read));
        assert_eq!(needs(&Method::POST, "/events/explain"), Some(Role::Read));
        assert_eq!(needs(&Method::POST, "/instances"), Some(Role::Operate));
        assert_eq!(
            needs(&Method::PUT, "/definitions/order/default-version"),
            Some(Role::Admin)
        );
        assert_eq!(
            needs(&Method::DELETE, "/definitions/order/default-version"),
            Some(Role::Admin)
        );
        assert_eq!(
            needs(&Method::PUT, "/definitions/order/breakpoints"),
            Some(Role::Operate)
        );
        assert_eq!(needs(&Method::POST, "/tasks/t/complete"), Some(Role::Operate));
        assert_eq!(needs(&Method::POST, "/definitions"), Some(Role::Admin));
        assert_eq!(needs(&Method::POST, "/batches"), Some(Role::Admin));
        assert_eq!(needs(&Method::POST, "/batches/b/cancel"), Some(Role::Admin));
        assert_eq!(needs(&Method::GET, "/batches/b"), Some(Role::Read));
        assert_eq!(needs(&Method::DELETE, "/definitions"), Some(Role::Operate));
    }

    #[test]
    fn tokens_are_matched_by_digest_and_the_highest_role_wins() {
        let mut a = Auth::default();
        assert!(!a.is_on());
        a.token(Role::Read, digest("r"));
        a.token(Role::Admin, digest("shared"));
        a.token(Role::Read, digest("shared"));
        assert!(a.is_on());
        assert_eq!(a.role_of_token("r"), Some(Role::Read));
        assert_eq!(a.role_of_token("shared"), Some(Role::Admin));
        assert_eq!(a.role_of_token("R"), None);
        assert_eq!(a.role_of_token(""), None);
        assert!(!format!("{a:?}").contains(&format!("{:?}", digest("r"))));
    }

    #[test]
    fn a_peer_token_is_long_printable_and_never_shown() {
        let t = PeerToken::new("peer-s3cret-0123456789").expect("peer token");
        assert_eq!(format!("{t:?}"), "PeerToken(hidden)");
        assert!(t.header().is_sensitive());
        assert_eq!(t.digest(), digest("peer-s3cret-0123456789"));
        assert_eq!(PeerToken::new("").unwrap_err(), "the peer token is empty");
        let short = PeerToken::new("s3cret").unwrap_err();
        assert!(short.contains("6 characters") && !short.contains("s3cret"), "{short}");
        assert!(PeerToken::new("peer s3cret 0123456789").is_err());
        assert!(PeerToken::new("peer-s3cret-0123456789\n").is_err());
        let mut a = Auth::default();
        a.peer(t.digest());
        assert!(
            a.has_peer() && !a.is_on(),
            "a peer token alone does not turn authentication on"
        );
        assert!(!format!("{a:?}").contains("s3cret"));
    }

    #[test]
    fn health_without_credentials_says_a_dependency_failed_without_why() {
        let mut v = serde_json::json!({"status": "failing", "mode": "kafka",
            "error": "cannot reach broker sasl://admin@kafka.internal:9093: authentication failed"});
        redact_health(&mut v);
        assert_eq!(v["status"], "failing");
        assert_eq!(v["error"], HIDDEN_ERROR);
        assert!(!v.to_string().contains("kafka.internal"));
        let mut ok = serde_json::json!({"status": "ok", "error": null});
        redact_health(&mut ok);
        assert_eq!(ok["error"], serde_json::Value::Null, "no failure, nothing to hide");
    }

    #[tokio::test]
    async fn healthz_hides_the_error_from_callers_without_credentials_only() {
        use tower::ServiceExt;
        let failing = || async {
            axum::Json(
                serde_json::json!({"status": "failing", "error": "broker kafka.internal:9093: SASL authentication failed"}),
            )
        };
        let mut a = Auth::default();
        a.token(Role::Read, digest("reader"));
        let app = layer(Router::new().route("/healthz", axum::routing::get(failing)), a);
        let ask = |token: Option<&str>| {
            let mut b = axum::http::Request::get("/healthz");
            if let Some(t) = token {
                b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let app = app.clone();
            let req = b.body(axum::body::Body::empty()).expect("request");
            async move {
                let r = app.oneshot(req).await.expect("answer");
                assert_eq!(r.status(), 200);
                let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.expect("body");
                serde_json::from_slice::<serde_json::Value>(&bytes).expect("JSON")
            }
        };
        let open = ask(None).await;
        assert_eq!(
            (open["status"].as_str(), open["error"].as_str()),
            (Some("failing"), Some(HIDDEN_ERROR))
        );
        assert_eq!(ask(Some("wrong")).await["error"], HIDDEN_ERROR);
        assert!(ask(Some("reader")).await["error"]
            .as_str()
            .is_some_and(|e| e.contains("kafka.internal")));
    }

    #[test]
    fn common_name_of_a_certificate() {
        use rustls::pki_types::pem::PemObject;
        let pem = include_bytes!("../../cli/tests/data/grpc/tls/client.pem");
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem).expect("PEM");
        assert_eq!(common_name(&der).as_deref(), Some("sm4c test client"));
        assert_eq!(common_name(&der[..40]), None);
        assert_eq!(common_name(b""), None);
    }
}
