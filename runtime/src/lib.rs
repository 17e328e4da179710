//! SM4C ("State Machines For Cloud") runtime: the language, validation, jq expressions and a
//! deterministic engine. This crate does no IO: no files, sockets, clock or async runtime.
//! Hosts (see the `sm4c-host` crate) feed an [`Instance`] timed inputs and perform the effects it returns.
//!
//! ```
//! use sm4c_runtime::{load, no_files, Input, Instance, LoadOptions, Options, Status, Timed};
//! use serde_json::json;
//! use std::sync::Arc;
//!
//! let definition = json!({
//!     "id": "helloworld", "name": "Hello World", "version": "1.0",
//!     "states": [{
//!         "name": "Hello State", "start": true,
//!         "enterAction": {"type": "injectData", "expression": "${ \"Hello World!\" }"},
//!         "enterResultHandler": "${ .result += $value }"
//!     }]
//! });
//! let machine = Arc::new(load(&definition, &mut no_files, LoadOptions::default()).unwrap());
//! let mut instance = Instance::new(machine, "hello-1", Options::default());
//! let out = instance.handle(Timed { at: 0, input: Input::Start { data: json!({}), scheduled: None } });
//! assert!(out.effects.is_empty());
//! assert_eq!(instance.status(), Status::Completed);
//! assert_eq!(instance.data(), json!({"result": "Hello World!"}));
//! ```

// Errors are the cold path; boxing ErrorInfo would cost an allocation on every failure for no gain.
#![allow(clippy::result_large_err)]

pub mod asl;
pub mod engine;
pub mod expr;
mod fast;
pub mod json;
pub mod kernel;
pub mod model;
pub mod task_token;
pub mod timespan;
pub mod validate;

pub use engine::debug::Breakpoint;
pub use engine::{
    describe, Effect, Entry, ErrorInfo, ErrorKind, Input, Instance, Millis, Options, Output, Phase, ReplayError,
    Snapshot, Status, Timed, Trace,
};
pub use expr::{Expr, Limits};
pub use model::{Delivery, Machine};
pub use validate::{load, no_files, LoadOptions, ValidationError};
