//! The host `sm4c run` and `sm4c serve` use: functions answered by jq mocks, else called for real
//! (REST, gRPC, and for ASL Tasks what host configuration binds their Resource to, or the HTTP
//! Task), sent events appended to a file, subflows from a folder.

use crate::asl::{asl_error, bound_call, AslTarget, HttpTask, HTTP_INVOKE};
use serde_json::Value;
use sm4c_host::{BoxFuture, FunctionCall, Functions};
use sm4c_runtime::{ErrorInfo, ErrorKind, Expr, Machine};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Functions answered by jq expressions over the call's arguments.
#[derive(Default)]
pub struct CallRouter {
    /// Mock expressions by function name.
    pub mocks: HashMap<String, Expr>,
    /// Subflow definitions by id.
    pub subflows: HashMap<String, Arc<Machine>>,
    /// Where sent events are appended as NDJSON.
    pub sent: Option<Mutex<std::fs::File>>,
    /// Real calls of `rest` functions that have no mock.
    pub rest: Option<Arc<crate::rest::RestInvoker>>,
    /// Real calls of `rpc` functions that have no mock.
    pub grpc: Option<Arc<crate::grpc::GrpcInvoker>>,
    /// What ASL Task Resources without a mock call (`[asl.resources]` of the configuration).
    pub asl_resources: BTreeMap<String, AslTarget>,
    /// ASL Task Resources whose calls are `atMostOnce` (`[asl.resources]` `delivery`).
    pub asl_at_most_once: std::collections::BTreeSet<String>,
    /// HTTP Tasks (`arn:aws:states:::http:invoke`) without a mock.
    pub http: Option<Arc<HttpTask>>,
}

impl CallRouter {
    /// An ASL Task (`function` is its `Resource`, `operation` its state name): answered by the mock
    /// keyed by the Resource, else by the state name; else by what the configuration binds the
    /// Resource to (REST, gRPC), else, for `arn:aws:states:::http:invoke`, by the HTTP call.
    fn asl_task(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
        if self.mocks.contains_key(&call.function) || self.mocks.contains_key(&call.operation) {
            return Box::pin(std::future::ready(self.asl_mock(&call)));
        }
        let missing = |what: &str| {
            asl_error(
                "States.TaskFailed",
                format!(
                    "Task state {:?} calls Resource {:?}, {what}",
                    call.operation, call.function
                ),
            )
        };
        let result = match (self.asl_resources.get(&call.function), call.function.as_str()) {
            (Some(AslTarget::Rest(op)), _) => match &self.rest {
                Some(rest) => {
                    let (rest, call) = (rest.clone(), bound_call(&call, "rest", op));
                    return Box::pin(async move { rest.call(&call).await });
                }
                None => Err(missing("bound to a REST operation, and this host makes no REST calls")),
            },
            (Some(AslTarget::Grpc(op)), _) => match &self.grpc {
                Some(grpc) => {
                    let (grpc, call) = (grpc.clone(), bound_call(&call, "rpc", op));
                    return Box::pin(async move { grpc.call(&call).await });
                }
                None => Err(missing("bound to a gRPC method, and this host makes no gRPC calls")),
            },
            (Some(AslTarget::Worker(list)), _) => Err(missing(&format!(
                "bound to task list {list:?}, and sm4c run has no workers: give a mock with --mock, or run the definition under sm4c serve, where workers poll the task list"
            ))),
            (None, HTTP_INVOKE) => match &self.http {
                Some(http) => {
                    let http = http.clone();
                    return Box::pin(async move { http.call(&call).await });
                }
                None => Err(missing("the HTTP Task, and this host makes no HTTP calls")),
            },
            (None, _) => Err(missing(
                "which has no mock and is bound to nothing: give a mock with --mock (a JSON object of Resources or Task state names to jq expressions), or bind the Resource in the configuration file (--config), [asl.resources.\"RESOURCE\"] with rest = \"DOCUMENT#operationId\", grpc = \"FILE.proto#package.Service/Method\" or worker = \"TASK-LIST\"",
            )),
        };
        Box::pin(std::future::ready(result))
    }

    /// An ASL Task answered by its mock. A mock's `error({"Error": ..., "Cause": ...})` fails the
    /// task with that error; `error("text")` with `States.TaskFailed` and cause `text`.
    fn asl_mock(&self, call: &FunctionCall) -> Result<Value, ErrorInfo> {
        let Some(expr) = self
            .mocks
            .get(&call.function)
            .or_else(|| self.mocks.get(&call.operation))
        else {
            return Err(asl_error("States.TaskFailed", "no mock"));
        };
        expr.eval_json(&call.arguments).map_err(|e| {
            let mut err = ErrorInfo::new(ErrorKind::FunctionError, e.message.clone());
            match e.value {
                Some(Value::String(text)) => {
                    err.details = Some(serde_json::json!({"Error": "States.TaskFailed", "Cause": text}));
                }
                Some(Value::Object(o)) if o.contains_key("Error") => err.details = Some(Value::Object(o)),
                Some(other) => {
                    err.details = Some(serde_json::json!({"Error": "States.TaskFailed", "Cause": other.to_string()}));
                }
                None => {
                    err.details = Some(serde_json::json!({"Error": "States.TaskFailed", "Cause": e.message}));
                }
            }
            err
        })
    }
}

impl Functions for CallRouter {
    /// A definition registered over HTTP may not name a local file outside the definitions folder
    /// ([`crate::files::escaping_files`]); the folder's own definitions are checked the same way
    /// when they are loaded.
    fn check_definition(&self, m: &Machine) -> Vec<sm4c_runtime::ValidationError> {
        let base = match (&self.rest, &self.grpc) {
            (Some(rest), _) => rest.base(),
            (None, Some(grpc)) => grpc.base(),
            (None, None) => return Vec::new(),
        };
        crate::files::escaping_files(base, m)
    }

    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
        if call.function_type == "asl" {
            return self.asl_task(call);
        }
        let result = match self.mocks.get(&call.function) {
            Some(expr) => expr.eval_json(&call.arguments).map_err(|e| {
                let mut err = ErrorInfo::new(ErrorKind::FunctionError, e.message.clone());
                err.details = e.value.filter(|v| !v.is_string());
                err
            }),
            None => match (call.function_type.as_str(), &self.rest, &self.grpc) {
                ("rest", Some(rest), _) => {
                    let rest = rest.clone();
                    return Box::pin(async move { rest.call(&call).await });
                }
                ("rpc", _, Some(grpc)) => {
                    let grpc = grpc.clone();
                    return Box::pin(async move { grpc.call(&call).await });
                }
                ("worker", _, _) => Err(ErrorInfo::new(
                    ErrorKind::FunctionError,
                    format!("function {:?} is a worker function (task list {:?}) and sm4c run has no workers: give a mock with --mock, or run the definition under sm4c serve, where workers poll its task list", call.function, call.operation),
                )),
                _ => Err(ErrorInfo::new(
                    ErrorKind::FunctionError,
                    format!("function {:?} has no mock: give one with --mock (a JSON object of function names to jq expressions)", call.function),
                )),
            },
        };
        Box::pin(async move { result })
    }

    fn send_event(&self, event: Value) -> BoxFuture<'static, Result<(), ErrorInfo>> {
        let result = match &self.sent {
            None => Ok(()),
            Some(file) => {
                let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
                writeln!(f, "{event}")
                    .map_err(|e| ErrorInfo::new(ErrorKind::HostError, format!("cannot write sent event: {e}")))
            }
        };
        Box::pin(async move { result })
    }

    fn subflow(&self, id: &str) -> Option<Arc<Machine>> {
        self.subflows.get(id).cloned()
    }

    /// Resources bound to task lists, except those a mock answers.
    fn task_lists(&self) -> Option<Arc<sm4c_host::driver::TaskListBindings>> {
        let bound: sm4c_host::driver::TaskListBindings = self
            .asl_resources
            .iter()
            .filter(|(r, _)| !self.mocks.contains_key(*r))
            .filter_map(|(r, t)| match t {
                AslTarget::Worker(list) => Some((r.clone(), list.clone())),
                _ => None,
            })
            .collect();
        (!bound.is_empty()).then(|| Arc::new(bound))
    }

    /// Resources configured `atMostOnce`, except those a mock answers (a mock makes no call).
    fn at_most_once(&self) -> Option<Arc<sm4c_host::driver::AtMostOnceResources>> {
        let set: sm4c_host::driver::AtMostOnceResources = self
            .asl_at_most_once
            .iter()
            .filter(|r| !self.mocks.contains_key(*r))
            .cloned()
            .collect();
        (!set.is_empty()).then(|| Arc::new(set))
    }
}
