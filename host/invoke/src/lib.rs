//! Calling SM4C functions for real.
//!
//! - [`rest`]: `rest` functions, through an OpenAPI document.
//! - [`grpc`]: `rpc` functions, through a `.proto` file compiled at load time.
//! - [`asl`]: what ASL Task Resources call (bound functions, the HTTP Task).
//! - [`net`]: where requests may go (redirects, private addresses) and how much of an answer is read.
//! - [`config`]: where calls go and with which credentials (the configuration file and flags).
//! - [`router::CallRouter`]: the [`sm4c_host::Functions`] of `sm4c run` and `sm4c serve`: each
//!   call goes to its jq mock, else to the REST or gRPC invoker.

// ErrorInfo is returned on the cold path only; boxing it would buy nothing.
#![allow(clippy::result_large_err)]

pub mod asl;
pub mod config;
pub mod files;
pub mod grpc;
pub mod net;
pub mod rest;
pub mod router;
