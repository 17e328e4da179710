//! The `Functions` trait: what an application gives the runtime so its state machines can touch the world.

use serde_json::Value;
use sm4c_runtime::{Effect, ErrorInfo, Machine, ValidationError};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A boxed future, so `Functions` can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A function call an instance makes (`invokeFunction` of a `rest` or `rpc` function).
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionCall {
    /// The calling instance.
    pub instance: String,
    /// Deterministic operation id: the same on every retry of the same step after a crash.
    /// Pass it on as an idempotency key.
    pub op: String,
    /// Function name in the definition.
    pub function: String,
    /// The function's `operation` (for example `http://myapis.org/api.json#doCheck`).
    pub operation: String,
    /// `rest` or `rpc`.
    pub function_type: String,
    /// Resolved arguments.
    pub arguments: Value,
    /// The W3C `traceparent` of the step that made the call, when steps are traced: invokers send
    /// it on (an HTTP header, gRPC metadata).
    pub traceparent: Option<String>,
    /// `atMostOnce`: the call's start is committed before it is made, and a call in flight when
    /// the host stopped is not made again ([`crate::driver::interrupted`]).
    pub delivery: sm4c_runtime::Delivery,
}

impl FunctionCall {
    /// The call an `InvokeFunction` effect of `instance` asks for, and whether the instance waits.
    pub fn from_effect(instance: &str, effect: &Effect) -> Option<(FunctionCall, bool)> {
        match effect {
            Effect::InvokeFunction {
                op,
                function,
                operation,
                function_type,
                arguments,
                wait,
                delivery,
            } => Some((
                FunctionCall {
                    instance: instance.to_string(),
                    op: op.clone(),
                    function: function.clone(),
                    operation: operation.clone(),
                    function_type: function_type.clone(),
                    arguments: arguments.clone(),
                    traceparent: None,
                    delivery: *delivery,
                },
                *wait,
            )),
            _ => None,
        }
    }
}

/// Performs a call on its own task; its result comes back to a host's loop as `wrap(instance, op, result)`.
pub fn spawn_call<C: Send + 'static>(
    functions: &Arc<dyn Functions>,
    call: FunctionCall,
    tx: tokio::sync::mpsc::WeakUnboundedSender<C>,
    wrap: fn(String, String, Result<Value, ErrorInfo>) -> C,
) -> tokio::task::AbortHandle {
    let (instance, op) = (call.instance.clone(), call.op.clone());
    let fut = functions.invoke(call);
    tokio::spawn(async move {
        let result = fut.await;
        if let Some(tx) = tx.upgrade() {
            let _ = tx.send(wrap(instance, op, result));
        }
    })
    .abort_handle()
}

/// The integration points of the seed's host: invoking functions, publishing sent events and
/// finding subflow definitions. Delivering events and running timers is the runtime's part
/// ([`crate::InMemoryHost`]).
pub trait Functions: Send + Sync + 'static {
    /// Performs a function call. An `Err` becomes an action error that error handlers can catch.
    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>>;

    /// Publishes a CloudEvent an instance sent (JSON structured form). Events also reach the
    /// other instances of the same runtime.
    fn send_event(&self, event: Value) -> BoxFuture<'static, Result<(), ErrorInfo>> {
        let _ = event;
        Box::pin(async { Ok(()) })
    }

    /// The definition `invokeSubflow` names by `id`.
    fn subflow(&self, id: &str) -> Option<Arc<Machine>> {
        let _ = id;
        None
    }

    /// ASL Task Resources that host configuration binds to worker task lists (Resource → task
    /// list): hosts with task lists put those Tasks on them instead of calling
    /// [`Functions::invoke`] ([`crate::driver::Driver::task_lists`]).
    fn task_lists(&self) -> Option<Arc<crate::driver::TaskListBindings>> {
        None
    }

    /// ASL Task Resources whose calls the host configuration makes `atMostOnce`
    /// ([`crate::driver::Driver::at_most_once`]); SM4C definitions say it themselves.
    fn at_most_once(&self) -> Option<Arc<crate::driver::AtMostOnceResources>> {
        None
    }

    /// What is wrong with a definition being registered that only this host's configuration can
    /// see, such as a local file it names outside the definitions folder; a non-empty list refuses
    /// the registration with these errors. Cheap: it reads no file's contents and no network.
    fn check_definition(&self, m: &Machine) -> Vec<ValidationError> {
        let _ = m;
        Vec::new()
    }
}
