//! Durable SM4C instances on one machine: the [`DurableHost`] keeps every instance in a
//! [`store::Store`] (one SQLite file with [`store::SqliteStore`]) and survives crashes and restarts.
//!
//! It runs instances with the driver of `sm4c-host`, like every host, and implements
//! [`sm4c_host::service::Backend`], which the HTTP API serves.

// ErrorInfo is returned on the cold path only; boxing it would buy nothing.
#![allow(clippy::result_large_err)]

mod backend;
mod host;
pub mod local;
pub mod store;

pub use host::{DurableHost, HostLimits};
