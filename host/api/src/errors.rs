//! The API's errors, one type each, as axum has one type per rejection: each knows its status,
//! its code (the `error` field of the body) and how its message reads. [`ApiError`] is what
//! handlers return; every error type converts into it, so `?` works on any of them.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use sm4c_host::service::HostError;

/// An error response: `{"error": CODE, "message": TEXT, "details"?: ...}` with its status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    details: Option<Value>,
}

impl ApiError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The error code, the body's `error` field.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": self.code, "message": self.message});
        if let Some(d) = self.details {
            body["details"] = d;
        }
        (self.status, Json(body)).into_response()
    }
}

/// Defines error types: `Name(fields) => STATUS, "code", |self| message`.
macro_rules! errors {
    ($(
        $(#[$doc:meta])*
        $name:ident $( ( $($field:ty),* ) )? => $status:ident, $code:literal, |$s:ident| $message:expr;
    )*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name $( ( $(pub $field),* ) )?;

        impl $name {
            /// The HTTP status of this error.
            pub const STATUS: StatusCode = StatusCode::$status;
            /// Its code, the body's `error` field.
            pub const CODE: &'static str = $code;

            /// Its message.
            pub fn message(&self) -> String {
                let $s = self;
                $message
            }
        }

        impl From<$name> for ApiError {
            fn from(e: $name) -> ApiError {
                ApiError {
                    status: $name::STATUS,
                    code: $name::CODE,
                    message: e.message(),
                    details: None,
                }
            }
        }

        impl IntoResponse for $name {
            fn into_response(self) -> Response {
                ApiError::from(self).into_response()
            }
        }
    )*};
}

errors! {
    /// No credentials, or credentials the server does not know (why). The response also carries
    /// `WWW-Authenticate: Bearer` (see [`crate::auth`]).
    Unauthenticated(String) => UNAUTHORIZED, "unauthorized", |s| s.0.clone();
    /// The caller's role (first) does not allow the request, which needs the second.
    Forbidden(String, String) => FORBIDDEN, "forbidden",
        |s| format!("the {} role does not allow this request; it needs {}", s.0, s.1);
    /// No route has this path.
    NoSuchEndpoint => NOT_FOUND, "notFound", |_s| "no such endpoint; see /openapi.json".into();
    /// A POST to an instance path other than `/cancel`.
    NoSuchInstanceAction => METHOD_NOT_ALLOWED, "methodNotAllowed",
        |_s| "POST /instances/{id}/cancel cancels an instance; see /openapi.json".into();
    /// A body that is not JSON was sent where JSON is expected.
    UnsupportedMediaType => UNSUPPORTED_MEDIA_TYPE, "unsupportedMediaType",
        |_s| "send JSON with Content-Type: application/json".into();
    /// A body whose `Content-Type` (what it was) is not a JSON media type ([`crate::door`]).
    UnsupportedMediaTypeOf(String) => UNSUPPORTED_MEDIA_TYPE, "unsupportedMediaType",
        |s| format!("the body's Content-Type is {:?}, not JSON: send it with Content-Type: application/json (or application/cloudevents+json, application/*+json)", s.0);
    /// A request to a `Host` (what it was) that is not a name of this server, which has no
    /// authentication ([`crate::door`]).
    ForeignHost(String) => FORBIDDEN, "foreignHost",
        |s| format!("Host {:?} is not a name of this server: without authentication it answers only requests addressed to loopback (localhost, 127.0.0.1, [::1]), so that a web page cannot reach it by pointing its own DNS name at it (DNS rebinding); use http://127.0.0.1:PORT, or configure tokens", s.0);
    /// A body-less `POST` without [`crate::door::REQUEST_HEADER`] to a server without authentication.
    HeaderRequired => FORBIDDEN, "headerRequired",
        |_s| "a POST without a JSON body needs the header X-Sm4c-Request: 1 (or Content-Type: application/json) when the server has no authentication: a web page cannot send either cross-site without the browser asking the server first".into();
    /// The request took longer than the server waits (milliseconds, `--request-timeout`).
    RequestTimeout(u64) => SERVICE_UNAVAILABLE, "timeout",
        |s| format!("the request was not answered within {} (--request-timeout): the server stopped working on it; what it asked may or may not have been done", sm4c_runtime::timespan::format(s.0));
    /// The server is busy with as much bounded work (searches, replays, explanations) as it takes
    /// at once, or the work took longer than its budget (what).
    Busy(String) => SERVICE_UNAVAILABLE, "busy", |s| s.0.clone();
    /// The body is larger than the API accepts (its limit in bytes).
    PayloadTooLarge(usize) => PAYLOAD_TOO_LARGE, "payloadTooLarge", |s| format!("the body is larger than {} bytes", s.0);
    /// The body is not JSON, or not the JSON the endpoint takes (what the parser said).
    MalformedJson(String) => BAD_REQUEST, "malformedJson", |s| s.0.clone();
    /// A value in the body nests deeper than [`sm4c_runtime::json::MAX_DEPTH`] levels (which, and where).
    TooDeep(String) => BAD_REQUEST, "tooDeep", |s| s.0.clone();
    /// A query string the endpoint does not take (what is wrong).
    InvalidQuery(String) => BAD_REQUEST, "invalidQuery", |s| s.0.clone();
    /// An instance id out of bounds.
    InvalidId => BAD_REQUEST, "invalidId", |_s| sm4c_host::service::INSTANCE_ID_RULE.into();
    /// A paging cursor that did not come from a previous page.
    InvalidCursor(String) => BAD_REQUEST, "invalidCursor",
        |s| format!("`after` must be a cursor from a previous page, not {:?}", s.0);
    /// Not a CloudEvent, or a CloudEvent that cannot be taken (why).
    InvalidCloudEvent(String) => BAD_REQUEST, "invalidCloudEvent", |s| s.0.clone();
    /// A task list name that cannot be one.
    InvalidTaskList(String) => BAD_REQUEST, "invalidTaskList",
        |s| format!("{:?} is not a task list name: task lists have 1 to 249 letters, digits, `.`, `_` or `-`", s.0);
    /// A worker's failure body that is not `{error?, message?, details?}` (why).
    InvalidFailure(String) => BAD_REQUEST, "invalidFailure", |s| s.0.clone();
    /// No definition with this id (and version).
    UnknownDefinition(String) => NOT_FOUND, "unknownDefinition", |s| format!("no definition {:?}", s.0);
    /// No instance with this id.
    UnknownInstance(String) => NOT_FOUND, "unknownInstance", |s| format!("no instance {:?}", s.0);
    /// The instance has ended.
    InstanceEnded(String) => CONFLICT, "instanceEnded", |s| format!("instance {:?} has already ended", s.0);
    /// The same definition id and version is registered with other content.
    DefinitionConflict(String, String) => CONFLICT, "definitionConflict",
        |s| format!("definition {:?} version {:?} is already registered with different content; register a new version", s.0, s.1);
    /// A token that names no task (why).
    UnknownTask(String) => NOT_FOUND, "unknownTask", |s| s.0.clone();
    /// The task was answered, timed out or cancelled: (instance, operation).
    TaskClosed(String, String) => CONFLICT, "taskClosed",
        |s| format!("task {:?} of instance {:?} is closed: it was completed, failed, timed out or cancelled", s.1, s.0);
    /// The command is in the log but not decided yet: the worker that holds the instance did not
    /// answer, and no other had taken it over within the bound (what, and how to follow it).
    Accepted(String) => ACCEPTED, "accepted", |s| s.0.clone();
    /// A service the host depends on did not answer in time (what).
    Unavailable(String) => SERVICE_UNAVAILABLE, "unavailable", |s| s.0.clone();
    /// The store's disk is full: the request was not written (what the store said).
    StorageFull(String) => SERVICE_UNAVAILABLE, "storageFull", |s| s.0.clone();
    /// An event that reached no instance could not be parked: the parked events are at a limit (why).
    ParkedLimit(String) => TOO_MANY_REQUESTS, "parkedLimit", |s| s.0.clone();
    /// Resume or step of an instance that is not paused.
    NotPaused(String) => CONFLICT, "notPaused", |s| format!("instance {:?} is not paused", s.0);
    /// A breakpoint that does not fit its definition, or is not a breakpoint (what is wrong).
    InvalidBreakpoint(String) => BAD_REQUEST, "invalidBreakpoint", |s| s.0.clone();
    /// No batch with this id.
    UnknownBatch(String) => NOT_FOUND, "unknownBatch", |s| format!("no batch {:?}", s.0);
    /// No schedule with this id.
    UnknownSchedule(String) => NOT_FOUND, "unknownSchedule", |s| format!("no schedule {:?}", s.0);
    /// A schedule of this id exists already.
    ScheduleExists(String) => CONFLICT, "scheduleExists",
        |s| format!("schedule {:?} exists already; change it with PUT /schedules/{}", s.0, s.0);
    /// The mode the server runs in does not offer this (what).
    NotSupported(String) => NOT_IMPLEMENTED, "notSupported", |s| s.0.clone();
    /// An ASL definition posted without a name: no `?name=` and no top-level `sm4c:id`.
    UnnamedDefinition => BAD_REQUEST, "unnamedDefinition",
        |_s| format!("an Amazon States Language definition carries no id: name it with ?name=NAME or a top-level {:?} field", sm4c_runtime::asl::model::ID_KEY);
    /// `?name=` (first) disagrees with the name in the body (second) in its field (third).
    DefinitionNameMismatch(String, String, String) => BAD_REQUEST, "definitionNameMismatch",
        |s| format!("?name={} disagrees with the definition's {:?} field, {:?}; drop one or make them agree", s.0, s.2, s.1);
    /// Something went wrong inside the server (what).
    Internal(String) => INTERNAL_SERVER_ERROR, "internal", |s| s.0.clone();
}

/// An invalid schedule: every error with its JSON pointer, in `details`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidSchedule(pub Vec<(String, String)>);

impl From<InvalidSchedule> for ApiError {
    fn from(e: InvalidSchedule) -> ApiError {
        pointed(e.0, "invalidSchedule")
    }
}

/// An invalid batch request: every error with its JSON pointer, in `details`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidBatch(pub Vec<(String, String)>);

impl From<InvalidBatch> for ApiError {
    fn from(e: InvalidBatch) -> ApiError {
        pointed(e.0, "invalidBatch")
    }
}

/// A 400 with `code` whose details are the errors with their JSON pointers.
fn pointed(errs: Vec<(String, String)>, code: &'static str) -> ApiError {
    let details: Vec<Value> = errs
        .iter()
        .map(|(p, m)| json!({"pointer": if p.is_empty() { "/" } else { p }, "message": m}))
        .collect();
    let message = errs
        .iter()
        .map(|(p, m)| format!("{p}: {m}"))
        .collect::<Vec<_>>()
        .join("; ");
    ApiError {
        status: StatusCode::BAD_REQUEST,
        code,
        message,
        details: Some(Value::Array(details)),
    }
}

/// An invalid definition: every error with its JSON pointer, in `details`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidDefinition(pub Vec<sm4c_runtime::ValidationError>);

impl InvalidDefinition {
    /// The HTTP status of this error.
    pub const STATUS: StatusCode = StatusCode::BAD_REQUEST;
    /// Its code.
    pub const CODE: &'static str = "invalidDefinition";
}

impl From<InvalidDefinition> for ApiError {
    fn from(e: InvalidDefinition) -> ApiError {
        let details: Vec<Value> =
            e.0.iter()
                .map(|e| json!({"pointer": if e.pointer.is_empty() { "/" } else { &e.pointer }, "message": e.message}))
                .collect();
        let message = e.0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
        ApiError {
            status: InvalidDefinition::STATUS,
            code: InvalidDefinition::CODE,
            message,
            details: Some(Value::Array(details)),
        }
    }
}

impl From<HostError> for ApiError {
    fn from(e: HostError) -> Self {
        match e {
            HostError::Invalid(errs) => InvalidDefinition(errs).into(),
            HostError::UnknownDefinition(d) => UnknownDefinition(d).into(),
            HostError::UnknownInstance(i) => UnknownInstance(i).into(),
            HostError::Ended(i) => InstanceEnded(i).into(),
            HostError::Conflict { id, version } => DefinitionConflict(id, version).into(),
            HostError::InvalidCursor(c) => InvalidCursor(c).into(),
            HostError::Unavailable(m) => Unavailable(m).into(),
            e @ HostError::StorageFull(_) => StorageFull(e.to_string()).into(),
            HostError::NotSupported(m) => NotSupported(m).into(),
            HostError::UnknownTask(m) => UnknownTask(m).into(),
            HostError::TaskClosed { instance, op } => TaskClosed(instance, op).into(),
            HostError::InvalidTaskEvent(m) => InvalidCloudEvent(m).into(),
            HostError::NotPaused(i) => NotPaused(i).into(),
            HostError::NotMigratable(e) => ApiError {
                status: StatusCode::CONFLICT,
                code: "notMigratable",
                message: e.message,
                details: Some(json!({"reason": e.reason})),
            },
            HostError::NotRedrivable { reason, message } => ApiError {
                status: StatusCode::CONFLICT,
                code: "notRedrivable",
                message,
                details: Some(json!({"reason": reason})),
            },
            HostError::InvalidUpdate(m) => ApiError {
                status: StatusCode::BAD_REQUEST,
                code: "invalidUpdate",
                message: format!("/update: {m}"),
                details: Some(json!({"pointer": "/update"})),
            },
            HostError::InvalidBreakpoint(m) => InvalidBreakpoint(m).into(),
            HostError::InvalidInstanceId(_) => InvalidId.into(),
            HostError::ParkedLimit(m) => ParkedLimit(m).into(),
            HostError::Appended(m) => Accepted(m).into(),
            HostError::InvalidSchedule(errs) => InvalidSchedule(errs).into(),
            HostError::UnknownSchedule(id) => UnknownSchedule(id).into(),
            HostError::InvalidBatch(errs) => InvalidBatch(errs).into(),
            HostError::UnknownBatch(id) => UnknownBatch(id).into(),
            HostError::ScheduleExists(id) => ScheduleExists(id).into(),
            other @ (HostError::Store(_) | HostError::Stopped | HostError::Failed(_)) => {
                Internal(other.to_string()).into()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_has_its_status_code_and_message() {
        let e = ApiError::from(UnknownInstance("a/1".into()));
        assert_eq!(
            (e.status(), e.code(), e.message()),
            (StatusCode::NOT_FOUND, "unknownInstance", "no instance \"a/1\"")
        );
        let e = ApiError::from(HostError::TaskClosed {
            instance: "i".into(),
            op: "1.enter".into(),
        });
        assert_eq!(e.status(), StatusCode::CONFLICT);
        assert_eq!(
            e.message(),
            HostError::TaskClosed {
                instance: "i".into(),
                op: "1.enter".into()
            }
            .to_string(),
            "the API says what the host says"
        );
        let e = ApiError::from(HostError::Conflict {
            id: "d".into(),
            version: "1".into(),
        });
        assert_eq!((e.status(), e.code()), (StatusCode::CONFLICT, "definitionConflict"));
        let e = ApiError::from(PayloadTooLarge(10));
        assert_eq!(e.message(), "the body is larger than 10 bytes");
        let e = ApiError::from(HostError::Stopped);
        assert_eq!((e.status(), e.code()), (StatusCode::INTERNAL_SERVER_ERROR, "internal"));
    }
}
