//! The tests of the `sm4c` command, in one test binary (cargo links one instead of one per file):
//! each module runs the real binary as a child process. `support/` holds what they share: starting
//! `sm4c serve` on a port the system picks (`support::server`), running the command, and the test
//! servers. `tests/kafka.rs` (Kafka mode, against a real broker) and `tests/reference.rs` (the
//! definitions in `../shared`) are binaries of their own.
//!
//! Every test runs in parallel with the others in this one process: no test changes the process's
//! environment or working directory (a child gets what it needs through its `Command`).
//!
//! One module: `cargo test -p sm4c --test it serve::`.

mod support;

mod asl_run;
mod asl_serve;
mod asl_tasks;
mod auth;
mod batches;
mod campaign;
mod cli;
mod credentials;
mod debugger;
mod delivery;
mod demo;
mod disk_full;
mod door;
mod downstreams;
mod durability;
mod golden;
mod grpc;
mod metrics;
mod redrive;
mod rest;
mod samples;
mod schema;
mod serve;
mod tasks;
mod test_cmd;
mod traces;
mod ui;
