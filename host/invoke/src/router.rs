//! The host `sm4c run` and `sm4c serve` use: functions answered by jq mocks, else called for real
//! (REST, gRPC), sent events appended to a file, subflows from a folder.

use serde_json::Value;
use sm4c_host::{BoxFuture, FunctionCall, Functions};
use sm4c_runtime::{ErrorInfo, ErrorKind, Expr, Machine};
use std::collections::HashMap;
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
}

impl CallRouter {
    /// An ASL Task (`function` is its `Resource`, `operation` its state name): answered by the mock
    /// keyed by the Resource, else by the state name. A mock's `error({"Error": ..., "Cause": ...})`
    /// fails the task with that error; `error("text")` with `States.TaskFailed` and cause `text`.
    fn asl_task(&self, call: &FunctionCall) -> Result<Value, ErrorInfo> {
        let Some(expr) = self
            .mocks
            .get(&call.function)
            .or_else(|| self.mocks.get(&call.operation))
        else {
            return Err(ErrorInfo::new(
                ErrorKind::FunctionError,
                format!(
                    "Task state {:?} calls {:?}, which has no mock: give one with --mock (a JSON object of Resources or Task state names to jq expressions)",
                    call.operation, call.function
                ),
            )
            .with_details(serde_json::json!({
                "Error": "States.TaskFailed",
                "Cause": format!("no mock and no configured function for Resource {:?}", call.function),
            })));
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
    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
        if call.function_type == "asl" {
            return Box::pin(std::future::ready(self.asl_task(&call)));
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
}
