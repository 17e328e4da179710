//! Hosts for SM4C state machines.
//!
//! - [`Host`]: what an application implements so its state machines can call functions,
//!   publish events and start subflows.
//! - [`InMemoryHost`]: runs instances in-process on tokio, with a real or virtual [`Clock`].
//! - [`files`], [`mock`] and [`graph`]: what the `sm4c` command is made of; [`rest`] and [`grpc`]
//!   call functions for real, where [`config`] says.
//!
//! The example on [`InMemoryHost`] embeds the runtime with a function written as a Rust closure.

// ErrorInfo is returned on the cold path only; boxing it would buy nothing.
#![allow(clippy::result_large_err)]

pub mod client;
pub mod clock;
pub mod config;
pub mod driver;
pub mod durable;
pub mod explain;
pub mod files;
pub mod graph;
pub mod grpc;
mod host;
pub mod kafka;
pub mod memory;
pub mod mock;
pub mod rest;
pub mod serve;
pub mod store;
pub mod tasks;

pub use host::{BoxFuture, FunctionCall, Host};
pub use memory::{Clock, Config, InMemoryHost, Outcome, TraceSink};

/// The README's Rust examples, run as doctests so they cannot go stale.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeExamples;
