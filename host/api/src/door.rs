//! What every request passes before the API sees it: the checks that keep web pages from driving
//! the API through a visitor's browser, the security headers of every answer, and the time a
//! request may take.
//!
//! - **`Host`**: without authentication (no token and no client certificate configured), a request
//!   whose `Host` is not a loopback name (`localhost`, `127.0.0.1` and the rest of 127/8, `[::1]`,
//!   any port) or one of [`Door::hosts`] is answered 403 `foreignHost`: a page that rebinds its
//!   own DNS name to 127.0.0.1 reaches the server with its own name as `Host` (DNS rebinding).
//! - **Media types**: a `POST`, `PUT` or `PATCH` with a body needs a JSON media type, parsed as a
//!   media type: `application/json`, `application/*+json` (`application/cloudevents+json`), and
//!   `application/x-amz-json-1.0`/`1.1` for the AWS-shaped task answers; anything else is 415.
//!   `text/plain`, form and multipart bodies (the types a browser sends cross-site without asking)
//!   never reach a handler. A CloudEvent in binary content mode (`ce-specversion` and the other
//!   `ce-*` headers) keeps any content type for its data: those headers are not ones a browser
//!   sends cross-site without a preflight.
//! - **Body-less `POST`s** (cancel, resume, step, task-list poll, a task answer without a body):
//!   without authentication they need [`REQUEST_HEADER`] (any value) or a JSON `Content-Type`,
//!   both of which make a browser ask the server first (CORS preflight), which it never grants.
//!   Without them: 403 `headerRequired`.
//! - **Headers**: `X-Content-Type-Options: nosniff` on every answer (the inspector's pages also get
//!   a `Content-Security-Policy`, [`crate::ui`]).
//! - **Work**: the requests get [`Door::work`], the pool their searches, replays and explanations
//!   run in.
//! - **Time**: a request may take [`Door::request_timeout`] at most (503 `timeout`), except a
//!   task-list poll (bounded by its own `wait`) and the inspector's event stream.

use crate::errors::{ForeignHost, HeaderRequired, RequestTimeout, UnsupportedMediaTypeOf};
use axum::body::HttpBody;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// The header a body-less `POST` carries when the server has no authentication, e.g.
/// `X-Sm4c-Request: 1`.
pub const REQUEST_HEADER: &str = "x-sm4c-request";

/// How long a request may take by default.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The checks of [`layer`].
#[derive(Debug, Clone)]
pub struct Door {
    /// Whether authentication is on (tokens or client certificates): then `Host` is not checked
    /// and body-less `POST`s need no [`REQUEST_HEADER`].
    pub auth: bool,
    /// `Host` names accepted besides the loopback ones (without port, lowercase; IPv6 in
    /// brackets): the address listened on, the URL a Kafka worker advertises.
    pub hosts: Vec<String>,
    /// Whether any IP address is accepted as `Host` (a server on a wildcard address without
    /// authentication, `--insecure-no-auth`): DNS rebinding always comes with a name.
    pub any_ip: bool,
    /// Longest a request may take (not a poll, not the event stream).
    pub request_timeout: Duration,
    /// The pool of bounded work given to the requests ([`crate::work`]).
    pub work: crate::work::Work,
}

impl Default for Door {
    fn default() -> Door {
        Door {
            auth: false,
            hosts: Vec::new(),
            any_ip: false,
            request_timeout: REQUEST_TIMEOUT,
            work: crate::work::Work::default(),
        }
    }
}

impl Door {
    /// Adds the host of `url` (`http://name:port/...`) to [`Door::hosts`].
    pub fn host_of_url(&mut self, url: &str) {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
        if let Some(h) = host_name(authority) {
            self.hosts.push(h);
        }
    }

    /// Whether a request with this `Host` header value may be answered.
    pub fn accepts_host(&self, host: Option<&str>) -> bool {
        if self.auth {
            return true;
        }
        let Some(name) = host.and_then(host_name) else {
            return false;
        };
        if name == "localhost" || name.ends_with(".localhost") || self.hosts.contains(&name) {
            return true;
        }
        match name.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || self.any_ip,
            Err(_) => false,
        }
    }
}

/// The host name of a `Host` value or URL authority, lowercase and without its port (`None`
/// when it is not one).
fn host_name(authority: &str) -> Option<String> {
    let a = authority.trim();
    let name = if a.starts_with('[') {
        let end = a.find(']')?;
        &a[..=end]
    } else {
        match a.rsplit_once(':') {
            Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
            _ => a,
        }
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    (!name.is_empty()).then_some(name)
}

/// What a `Content-Type` value is, parsed as a media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Media {
    /// `application/json` or `application/*+json`.
    Json,
    /// `application/x-amz-json-1.0` or `1.1` (the AWS JSON protocol).
    AmzJson,
    /// Anything else, or not a media type.
    Other,
}

/// The kind of a `Content-Type` value.
pub fn media(content_type: Option<&str>) -> Media {
    let Some(m) = content_type.and_then(|t| t.parse::<mime::Mime>().ok()) else {
        return Media::Other;
    };
    if m.type_() != mime::APPLICATION {
        return Media::Other;
    }
    if m.subtype() == mime::JSON || m.suffix() == Some(mime::JSON) {
        Media::Json
    } else if matches!(m.subtype().as_str(), "x-amz-json-1.0" | "x-amz-json-1.1") {
        Media::AmzJson
    } else {
        Media::Other
    }
}

/// The `Content-Type` of a request.
pub(crate) fn content_type(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok())
}

/// Whether the AWS JSON protocol's media type is taken at `path`.
fn takes_amz_json(path: &str) -> bool {
    path.starts_with("/tasks/send-task-")
}

/// Adds the checks of `door` in front of `router` (outside authentication: its answers get the
/// headers too).
pub fn layer(router: Router, door: Door) -> Router {
    router.layer(axum::middleware::from_fn_with_state(Arc::new(door), check))
}

async fn check(State(door): State<Arc<Door>>, mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(door.work.clone());
    let mut r = match refuse(&door, &req) {
        Some(r) => r,
        None => timed(&door, req, next).await,
    };
    r.headers_mut()
        .insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    r
}

/// The answer to a request that may not go on, if it may not.
fn refuse(door: &Door, req: &Request) -> Option<Response> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    if !door.accepts_host(host) {
        return Some(ForeignHost(host.unwrap_or("").to_string()).into_response());
    }
    if !matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH) {
        return None;
    }
    let headers = req.headers();
    let path = req.uri().path();
    let binary_event = matches!(path, "/events" | "/events/explain") && headers.contains_key("ce-specversion");
    let kind = media(content_type(headers));
    let json = kind == Media::Json || (kind == Media::AmzJson && takes_amz_json(path));
    let has_body = req.body().size_hint().exact() != Some(0);
    if has_body && !json && !binary_event {
        let why = content_type(headers).unwrap_or("none").to_string();
        return Some(UnsupportedMediaTypeOf(why).into_response());
    }
    if !door.auth && *req.method() == Method::POST && !json && !binary_event && !headers.contains_key(REQUEST_HEADER) {
        return Some(HeaderRequired.into_response());
    }
    None
}

/// Runs the request within the door's time, except long polls and the event stream.
async fn timed(door: &Door, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let unbounded = path == "/ui/events" || (path.starts_with("/tasklists/") && path.ends_with("/poll"));
    if unbounded {
        return next.run(req).await;
    }
    match tokio::time::timeout(door.request_timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => RequestTimeout(door.request_timeout.as_millis() as u64).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slow_request_is_cut_at_the_timeout_but_a_long_poll_is_not() {
        use tower::ServiceExt;
        let slow = || async {
            tokio::time::sleep(Duration::from_millis(800)).await;
            "done"
        };
        let app = layer(
            Router::new()
                .route("/instances", axum::routing::get(slow))
                .route("/tasklists/{name}/poll", axum::routing::post(slow))
                .route("/ui/events", axum::routing::get(slow)),
            Door {
                request_timeout: Duration::from_millis(100),
                ..Door::default()
            },
        );
        let ask = |method: &str, path: &str| {
            let req = axum::http::Request::builder()
                .method(method)
                .uri(path)
                .header(header::HOST, "127.0.0.1:8080")
                .header(REQUEST_HEADER, "1")
                .body(axum::body::Body::empty())
                .expect("request");
            let app = app.clone();
            async move { app.oneshot(req).await.expect("answer") }
        };
        let r = ask("GET", "/instances").await;
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.expect("body");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(v["error"], "timeout");
        assert!(
            v["message"].as_str().is_some_and(|m| m.contains("--request-timeout")),
            "{v}"
        );
        assert_eq!(ask("POST", "/tasklists/images/poll").await.status(), 200);
        assert_eq!(ask("GET", "/ui/events").await.status(), 200);
    }

    #[test]
    fn media_types_are_parsed_not_matched() {
        assert_eq!(media(Some("application/json")), Media::Json);
        assert_eq!(media(Some("application/json; charset=utf-8")), Media::Json);
        assert_eq!(media(Some("Application/JSON")), Media::Json);
        assert_eq!(media(Some("application/cloudevents+json")), Media::Json);
        assert_eq!(media(Some("application/problem+json;q=1")), Media::Json);
        assert_eq!(media(Some("application/x-amz-json-1.0")), Media::AmzJson);
        assert_eq!(media(Some("text/plain;a=+json")), Media::Other);
        assert_eq!(media(Some("text/plain; charset=application/json")), Media::Other);
        assert_eq!(media(Some("text/json")), Media::Other);
        assert_eq!(media(Some("application/x-www-form-urlencoded")), Media::Other);
        assert_eq!(media(Some("application/jsonp")), Media::Other);
        assert_eq!(media(Some("json")), Media::Other);
        assert_eq!(media(None), Media::Other);
    }

    #[test]
    fn only_loopback_hosts_without_authentication() {
        let d = Door::default();
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.1.2.3:1",
            "[::1]",
            "[::1]:8080",
            "localhost.",
            "app.localhost:3000",
        ] {
            assert!(d.accepts_host(Some(ok)), "{ok}");
        }
        for no in [
            "attacker.example",
            "attacker.example:8080",
            "127.0.0.1.attacker.example",
            "localhost.attacker.example",
            "10.0.0.1:8080",
            "[::2]:80",
            "",
        ] {
            assert!(!d.accepts_host(Some(no)), "{no}");
        }
        assert!(!d.accepts_host(None));
        let mut d = Door {
            any_ip: true,
            ..Door::default()
        };
        d.host_of_url("http://Worker-2.internal:8081/");
        assert!(d.accepts_host(Some("10.0.0.1:8080")) && d.accepts_host(Some("[fe80::1]:80")));
        assert!(d.accepts_host(Some("worker-2.internal:8081")));
        assert!(!d.accepts_host(Some("attacker.example")));
        let d = Door {
            auth: true,
            ..Door::default()
        };
        assert!(
            d.accepts_host(Some("attacker.example")),
            "tokens protect the API, not the host name"
        );
    }
}
