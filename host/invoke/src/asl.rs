//! What ASL Task states call: the functions host configuration binds their `Resource`s to, and the
//! HTTP Task (`arn:aws:states:::http:invoke`).
//!
//! A definition never says where a Resource goes: the `[asl.resources."RESOURCE"]` tables of the
//! configuration file do, naming a REST operation (`rest = "api.yaml#chargeCard"`, as an SM4C
//! `rest` function's `operation`), a gRPC method (`grpc = "shop.proto#shop.v1.Shop/Charge"`, as an
//! `rpc` function's) or a worker task list (`worker = "approvals"`). The HTTP Task's credentials come
//! from `[asl.connections."CONNECTION ARN"]`, the connection its `Authentication` names, and go
//! only to the URL prefixes that connection lists (`endpoints`): a Task whose `ApiEndpoint` is
//! outside them fails with `States.Runtime` before any request is made. Redirects are followed only
//! within one origin, answers are capped, and private addresses refused as [`crate::net`] says.
//! A Resource's table may also say `delivery = "atMostOnce"` (alone, for the HTTP Task): ASL has
//! no field for it ([`AslConfig::at_most_once`]).

use crate::net::{read_capped, under, NetPolicy};
use crate::rest::encode;
use serde_json::{json, Map, Value};
use sm4c_host::FunctionCall;
use sm4c_runtime::{ErrorInfo, ErrorKind};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

/// The Resource of the HTTP Task.
pub const HTTP_INVOKE: &str = "arn:aws:states:::http:invoke";

/// What a Resource is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AslTarget {
    /// A REST operation: `<OpenAPI document URI>#<operationId>`.
    Rest(String),
    /// A gRPC method: `<.proto URI>#<package.Service>/<Method>`.
    Grpc(String),
    /// A worker task list.
    Worker(String),
}

/// The `[asl]` section: Resources bound to functions, and the HTTP Task's connections.
#[derive(Debug, Clone, Default)]
pub struct AslConfig {
    /// What each bound Resource calls.
    pub resources: BTreeMap<String, AslTarget>,
    /// The Resources whose Tasks' calls are `atMostOnce` (`delivery = "atMostOnce"`): a call in
    /// flight when the host stopped fails with `stepInterrupted` instead of being made again.
    pub at_most_once: std::collections::BTreeSet<String>,
    /// Each connection, by the `ConnectionArn` as definitions write it.
    pub connections: BTreeMap<String, Connection>,
    /// What HTTP Tasks may reach and read.
    pub net: NetPolicy,
}

/// One `[asl.connections."ARN"]`: its headers (credentials) and the URL prefixes they may go to.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Connection {
    /// Headers sent with the Task's request (credentials).
    pub headers: Vec<(String, String)>,
    /// The URL prefixes the headers may be sent to (scheme, host, port, path on a segment boundary).
    pub endpoints: Vec<reqwest::Url>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values are credentials: only their names are shown.
        let names: Vec<&String> = self.headers.iter().map(|(n, _)| n).collect();
        let endpoints: Vec<&str> = self.endpoints.iter().map(reqwest::Url::as_str).collect();
        f.debug_struct("Connection")
            .field("headers", &names)
            .field("endpoints", &endpoints)
            .finish()
    }
}

impl AslConfig {
    /// The Resources bound to worker task lists (Resource → task list).
    pub fn task_lists(&self) -> BTreeMap<String, String> {
        self.resources
            .iter()
            .filter_map(|(r, t)| match t {
                AslTarget::Worker(list) => Some((r.clone(), list.clone())),
                _ => None,
            })
            .collect()
    }
}

/// Checks one `[asl.resources."RESOURCE"]` entry: exactly one of `rest`, `grpc` and `worker`, each
/// in its form.
pub fn check_target(
    resource: &str,
    rest: Option<&str>,
    grpc: Option<&str>,
    worker: Option<&str>,
) -> Result<AslTarget, String> {
    if resource == HTTP_INVOKE {
        return Err(format!(
            "{HTTP_INVOKE} is the HTTP Task, which sm4c performs itself: give its credentials in [asl.connections.\"CONNECTION ARN\"]"
        ));
    }
    let target = match (rest, grpc, worker) {
        (Some(op), None, None) => {
            match op.rsplit_once('#') {
                Some((doc, id)) if !doc.is_empty() && !id.is_empty() => {}
                _ => return Err(format!("rest = {op:?} must be <OpenAPI document URI>#<operationId>")),
            }
            AslTarget::Rest(op.to_string())
        }
        (None, Some(op), None) => {
            if crate::grpc::parse_operation(op).is_none() {
                return Err(format!("grpc = {op:?} must be <.proto URI>#<package.Service>/<Method>"));
            }
            AslTarget::Grpc(op.to_string())
        }
        (None, None, Some(list)) => {
            if !sm4c_runtime::validate::is_task_list_name(list) {
                return Err(format!(
                    "worker = {list:?} is not a task list name (1 to 249 letters, digits, '.', '_' or '-')"
                ));
            }
            AslTarget::Worker(list.to_string())
        }
        (None, None, None) => return Err("give one of rest, grpc or worker".into()),
        _ => return Err("give only one of rest, grpc or worker".into()),
    };
    if resource.ends_with(".waitForTaskToken") && !matches!(target, AslTarget::Worker(_)) {
        return Err(
            "a .waitForTaskToken Resource waits for a worker's answer: bind it to a task list (worker = \"NAME\")"
                .into(),
        );
    }
    Ok(target)
}

/// A failure as ASL sees it: the error name `Catch` and `Retry` match, and its cause.
pub fn asl_error(name: &str, cause: impl Into<String>) -> ErrorInfo {
    let cause = cause.into();
    ErrorInfo::new(ErrorKind::FunctionError, cause.clone()).with_details(json!({"Error": name, "Cause": cause}))
}

/// The call a bound Resource makes: the Task's effective input are the arguments, as an SM4C
/// function call of that type would have them (`rest` or `rpc`).
pub fn bound_call(call: &FunctionCall, function_type: &str, operation: &str) -> FunctionCall {
    FunctionCall {
        instance: call.instance.clone(),
        op: call.op.clone(),
        function: call.function.clone(),
        operation: operation.to_string(),
        function_type: function_type.to_string(),
        arguments: call.arguments.clone(),
        traceparent: call.traceparent.clone(),
        delivery: call.delivery,
    }
}

/// Checks the `delivery` of one `[asl.resources."RESOURCE"]` entry bound to `target` (none: the
/// entry gives only a delivery, for a Resource sm4c performs itself, such as the HTTP Task):
/// `atLeastOnce` or `atMostOnce`, the latter not for a worker task list. `Ok(true)`: atMostOnce.
pub fn check_delivery(delivery: &str, target: Option<&AslTarget>) -> Result<bool, String> {
    match sm4c_runtime::Delivery::parse(delivery) {
        None => Err(format!(
            "delivery = {delivery:?} is not a delivery: use \"atLeastOnce\" or \"atMostOnce\""
        )),
        Some(sm4c_runtime::Delivery::AtMostOnce) if matches!(target, Some(AslTarget::Worker(_))) => Err(
            "delivery = \"atMostOnce\" applies to calls sm4c makes (rest, grpc, the HTTP Task); a worker task is taken once by a worker and bound by its own timeouts"
                .into(),
        ),
        Some(d) => Ok(d == sm4c_runtime::Delivery::AtMostOnce),
    }
}

/// Performs HTTP Tasks.
pub struct HttpTask {
    /// Built at the first call: building it reads the system's certificates, which a run without
    /// HTTP Tasks does not need.
    client: OnceLock<reqwest::Client>,
    connections: BTreeMap<String, Connection>,
    net: NetPolicy,
}

/// Response headers that may carry credentials: never copied into a Task's result or error cause.
fn is_secret_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "set-cookie" | "set-cookie2" | "cookie" | "authorization" | "www-authenticate"
    ) || n.starts_with("proxy-")
}

const FIELDS: [&str; 7] = [
    "ApiEndpoint",
    "Method",
    "Authentication",
    "Headers",
    "QueryParameters",
    "RequestBody",
    "Transform",
];

const METHODS: [&str; 7] = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"];

impl HttpTask {
    /// An HTTP Task performer with the configured connections and what calls may reach
    /// ([`AslConfig::net`]); a call may take up to 60 s, as AWS's HTTP Task.
    pub fn new(config: &AslConfig) -> HttpTask {
        HttpTask {
            client: OnceLock::new(),
            connections: config.connections.clone(),
            net: config.net.clone(),
        }
    }

    /// Performs the HTTP Task whose effective input (its `Parameters` or `Arguments`) are the
    /// call's arguments: `{"StatusCode", "StatusText", "Headers", "ResponseBody"}`, or the error
    /// `States.Http.StatusCode.<code>` for a status other than 2xx, `States.Http.Socket` when no
    /// answer came, and `States.Runtime` for parameters that cannot be used.
    pub async fn call(&self, call: &FunctionCall) -> Result<Value, ErrorInfo> {
        let bad = |m: String| asl_error("States.Runtime", format!("HTTP Task {:?}: {m}", call.operation));
        let Value::Object(p) = &call.arguments else {
            return Err(bad("Parameters must be an object with ApiEndpoint and Method".into()));
        };
        if let Some(k) = p.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(bad(format!(
                "unknown field {k:?}; an HTTP Task takes {}",
                FIELDS.join(", ")
            )));
        }
        let endpoint = p
            .get("ApiEndpoint")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("ApiEndpoint (a string, the URL to call) is missing".into()))?;
        let url = reqwest::Url::parse(endpoint)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| bad(format!("ApiEndpoint {endpoint:?} is not an http:// or https:// URL")))?;
        let method = p
            .get("Method")
            .and_then(Value::as_str)
            .map(str::to_ascii_uppercase)
            .filter(|m| METHODS.contains(&m.as_str()))
            .ok_or_else(|| bad(format!("Method must be one of {}", METHODS.join(", "))))?;
        if let Some(t) = p.get("Transform") {
            let none = t.get("RequestBodyEncoding").and_then(Value::as_str) == Some("NONE");
            if !none || t.as_object().is_some_and(|o| o.len() > 1) {
                return Err(bad(
                    "Transform (URL-encoded request bodies) is not supported: send RequestBody as JSON".into(),
                ));
            }
        }
        let text = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let mut headers: Vec<(String, String)> = Vec::new();
        match p.get("Headers") {
            None | Some(Value::Null) => {}
            Some(Value::Object(h)) => headers.extend(h.iter().map(|(k, v)| (k.clone(), text(v)))),
            Some(_) => return Err(bad("Headers must be an object of header names to values".into())),
        }
        if let Some(auth) = p.get("Authentication") {
            let arn = auth
                .get("ConnectionArn")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("Authentication must be {\"ConnectionArn\": \"...\"}".into()))?;
            let conn = self.connections.get(arn).ok_or_else(|| {
                bad(format!(
                    "connection {arn:?} is not configured: give its headers and endpoints in the configuration file (--config), [asl.connections.\"{arn}\"] headers = {{ authorization = \"env:VAR\" }}, endpoints = [\"https://HOST/PATH/\"]"
                ))
            })?;
            // The connection's credentials go only where the configuration sends them.
            if !conn.endpoints.iter().any(|prefix| under(prefix, &url)) {
                let listed: Vec<&str> = conn.endpoints.iter().map(reqwest::Url::as_str).collect();
                return Err(bad(format!(
                    "ApiEndpoint {:?} is not under an endpoint of connection {arn:?} ({}); no request was made",
                    url.as_str(),
                    listed.join(", ")
                )));
            }
            let creds = &conn.headers;
            // The connection's credentials win over headers of the same name in the definition.
            headers.retain(|(n, _)| !creds.iter().any(|(c, _)| c.eq_ignore_ascii_case(n)));
            headers.extend(creds.iter().cloned());
        }
        let mut query = Vec::new();
        match p.get("QueryParameters") {
            None | Some(Value::Null) => {}
            Some(Value::Object(q)) => {
                for (k, v) in q {
                    match v {
                        Value::Array(items) => query.extend(items.iter().map(|i| (k.clone(), text(i)))),
                        other => query.push((k.clone(), text(other))),
                    }
                }
            }
            Some(_) => return Err(bad("QueryParameters must be an object of names to values".into())),
        }
        let mut url = url;
        if !query.is_empty() {
            let mut q = url.query().map(str::to_string).unwrap_or_default();
            for (k, v) in &query {
                if !q.is_empty() {
                    q.push('&');
                }
                q.push_str(&format!("{}={}", encode(k), encode(v)));
            }
            url.set_query(Some(&q));
        }
        self.net.check_url(&url).map_err(&bad)?;
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
        let client = self
            .client
            .get_or_init(|| self.net.client(Duration::from_secs(60)).build().unwrap_or_default());
        let mut req = client.request(method.clone(), url.clone());
        for (k, v) in &headers {
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| bad(format!("{k:?} is not a header name")))?;
            let value = reqwest::header::HeaderValue::from_str(v)
                .map_err(|_| bad(format!("the value of header {k} is not a valid header value")))?;
            req = req.header(name, value);
        }
        if let (Some(tp), false) = (
            &call.traceparent,
            headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("traceparent")),
        ) {
            req = req.header("traceparent", tp.as_str());
        }
        match p.get("RequestBody") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                let has_type = headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("content-type"));
                req = req.body(s.clone());
                if !has_type {
                    req = req.header("content-type", "text/plain; charset=utf-8");
                }
            }
            Some(body) => req = req.json(body),
        }
        let target = format!("{method} {}", url.as_str().split('?').next().unwrap_or_default());
        let resp = req.send().await.map_err(|e| {
            let kind = if e.is_timeout() { "timeout" } else { "connection" };
            asl_error(
                "States.Http.Socket",
                format!("{target} failed: {kind}: {}", crate::net::describe(&e)),
            )
        })?;
        let status = resp.status();
        let mut out_headers = Map::new();
        for (name, value) in resp.headers() {
            if is_secret_header(name.as_str()) {
                continue;
            }
            let v = Value::String(String::from_utf8_lossy(value.as_bytes()).into_owned());
            match out_headers.get_mut(name.as_str()) {
                Some(Value::Array(list)) => list.push(v),
                _ => {
                    out_headers.insert(name.as_str().to_string(), Value::Array(vec![v]));
                }
            }
        }
        let json_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/json") || t.contains("+json"));
        let body = match read_capped(resp, self.net.max_response).await {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e @ crate::net::ReadError::TooBig(_)) => {
                // A function error the Task's Catch and Retry see (States.ALL matches it).
                return Err(asl_error("States.TaskFailed", format!("{target}: {e}")));
            }
            Err(e) => return Err(asl_error("States.Http.Socket", format!("{target}: {e}"))),
        };
        let body = match serde_json::from_str::<Value>(&body) {
            Ok(v) if json_type || v.is_object() || v.is_array() => v,
            _ => Value::String(body),
        };
        let out = json!({
            "StatusCode": status.as_u16(),
            "StatusText": status.canonical_reason().unwrap_or_default(),
            "Headers": out_headers,
            "ResponseBody": body,
        });
        if status.is_success() {
            Ok(out)
        } else {
            Err(asl_error(
                &format!("States.Http.StatusCode.{}", status.as_u16()),
                out.to_string(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_take_one_function_in_its_form() {
        assert_eq!(
            check_target("r", Some("api.yaml#charge"), None, None),
            Ok(AslTarget::Rest("api.yaml#charge".into()))
        );
        assert_eq!(
            check_target("r", None, Some("s.proto#a.B/C"), None),
            Ok(AslTarget::Grpc("s.proto#a.B/C".into()))
        );
        assert_eq!(
            check_target("r.waitForTaskToken", None, None, Some("approvals")),
            Ok(AslTarget::Worker("approvals".into()))
        );
        assert!(check_target("r", Some("api.yaml"), None, None)
            .unwrap_err()
            .contains("#<operationId>"));
        assert!(check_target("r", None, Some("s.proto#Svc"), None)
            .unwrap_err()
            .contains("<Method>"));
        assert!(check_target("r", None, None, Some("a b"))
            .unwrap_err()
            .contains("task list name"));
        assert!(check_target("r", None, None, None).unwrap_err().contains("one of"));
        assert!(check_target("r", Some("a#b"), None, Some("l"))
            .unwrap_err()
            .contains("only one"));
        assert!(check_target("x.waitForTaskToken", Some("a#b"), None, None)
            .unwrap_err()
            .contains("worker"));
        assert!(check_target(HTTP_INVOKE, Some("a#b"), None, None)
            .unwrap_err()
            .contains("connections"));
    }

    #[test]
    fn debug_hides_connection_credentials() {
        let mut c = AslConfig::default();
        c.connections.insert(
            "conn".into(),
            Connection {
                headers: vec![("authorization".into(), "Bearer s3cret".into())],
                endpoints: vec![reqwest::Url::parse("https://api.example.com/v1/").unwrap()],
            },
        );
        c.resources.insert("r".into(), AslTarget::Worker("l".into()));
        let d = format!("{c:?}");
        assert!(d.contains("authorization") && !d.contains("s3cret"), "{d}");
        assert!(d.contains("https://api.example.com/v1/"), "{d}");
        let d = format!("{:?}", c.connections["conn"]);
        assert!(d.contains("authorization") && !d.contains("s3cret"), "{d}");
        assert_eq!(c.task_lists(), BTreeMap::from([("r".to_string(), "l".to_string())]));
    }

    fn call(arguments: Value) -> FunctionCall {
        FunctionCall {
            instance: "i".into(),
            op: "1".into(),
            function: HTTP_INVOKE.into(),
            operation: "Call".into(),
            function_type: "asl".into(),
            arguments,
            traceparent: None,
            delivery: Default::default(),
        }
    }

    #[tokio::test]
    async fn bad_parameters_are_refused_before_any_call() {
        let h = HttpTask::new(&AslConfig::default());
        for (args, says) in [
            (json!("x"), "must be an object"),
            (json!({"Method": "GET"}), "ApiEndpoint"),
            (json!({"ApiEndpoint": "ftp://x", "Method": "GET"}), "http://"),
            (json!({"ApiEndpoint": "http://x", "Method": "BREW"}), "Method must be"),
            (
                json!({"ApiEndpoint": "http://x", "Method": "GET", "Body": 1}),
                "unknown field \"Body\"",
            ),
            (
                json!({"ApiEndpoint": "http://x", "Method": "GET", "Authentication": {"ConnectionArn": "c"}}),
                "connection \"c\" is not configured",
            ),
            (
                json!({"ApiEndpoint": "http://x", "Method": "POST", "Transform": {"RequestBodyEncoding": "URL_ENCODED"}}),
                "not supported",
            ),
        ] {
            let e = h.call(&call(args)).await.unwrap_err();
            let d = e.details.unwrap();
            assert_eq!(d["Error"], "States.Runtime");
            assert!(d["Cause"].as_str().unwrap().contains(says), "{d}");
        }
    }
}
