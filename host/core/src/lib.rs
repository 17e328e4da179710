//! Run SM4C state machines in-process.
//!
//! - [`Functions`]: what an application implements so its state machines can call functions,
//!   publish events and start subflows.
//! - [`InMemoryHost`]: runs instances in-process on tokio, with a real or virtual [`Clock`].
//! - [`driver`]: how every host (in-memory, SQLite, Kafka) runs an instance through the engine.
//! - [`service`]: what a durable host offers an API ([`service::Backend`]), and [`tasks`], the
//!   worker task lists they share.
//!
//! This crate depends on the runtime and tokio only. The durable host (`sm4c-durable`), the Kafka
//! host (`sm4c-kafka`), the HTTP API (`sm4c-api`) and the REST and gRPC invokers (`sm4c-invoke`)
//! are crates of their own.
//!
//! The example on [`InMemoryHost`] embeds the runtime with a function written as a Rust closure.

// ErrorInfo is returned on the cold path only; boxing it would buy nothing.
#![allow(clippy::result_large_err)]

pub mod asl_graph;
pub mod batch;
pub mod clock;
pub mod driver;
#[cfg(feature = "cloudevents")]
pub mod events;
pub mod explain;
mod functions;
pub mod graph;
pub mod local;
pub mod memory;
pub mod metrics;
pub mod service;
pub mod tasks;
pub mod upgrade;

pub use functions::{spawn_call, BoxFuture, FunctionCall, Functions};
pub use memory::{Clock, Config, InMemoryHost, Outcome, TraceSink};

/// The README's Rust examples, run as doctests so they cannot go stale.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeExamples;
