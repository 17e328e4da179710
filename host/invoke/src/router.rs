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

impl Functions for CallRouter {
    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
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
