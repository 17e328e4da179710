//! The `sm4c` command: glue between the command line and the host crates.
//!
//! This file is the module list, `main` (the command runs on a thread with a large stack), the
//! dispatch of the subcommands, and the exit codes of what fails before a subcommand decides its
//! own: 2 for an error of `sm4c run` or `sm4c serve` (bad input, a refused start), 3 when the
//! command's thread cannot start or panics; `validate`, `graph` and `schema` are short enough to
//! live here. The command line is in [`args`]; `sm4c run` in [`run_cmd`]; `sm4c serve` in
//! [`serve`] (Kafka mode in `serve/kafka.rs`), with who may use it in [`security`]; the client
//! subcommands in [`client`] and [`debug`]; the others in their `*_cmd` modules.

mod args;
mod batch_cmd;
mod client;
mod debug;
mod files;
mod forward;
mod memory;
mod replay_cmd;
mod run_cmd;
mod schedule_cmd;
mod security;
mod serve;
mod test_cmd;
mod traces;

use args::{Cli, Command, Format};
use clap::Parser;
use files::FileError;
use sm4c_host::graph;
use sm4c_invoke::grpc;
use sm4c_runtime::Limits;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SCHEMA: &str = include_str!("../../../schemas/sm4c.schema.json");

/// Stack for the thread that runs instances: deeply nested data is converted and dropped
/// recursively, and jq may nest a value as deep as its fuel allows.
const STACK: usize = 512 << 20;

fn main() -> ExitCode {
    memory::tune();
    let cli = Cli::parse();
    match std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || dispatch(cli))
        .map(|t| t.join())
    {
        Ok(Ok(code)) => code,
        _ => {
            eprintln!("sm4c: internal error");
            ExitCode::from(3)
        }
    }
}

fn dispatch(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Validate { files, subflows } => validate(&files, subflows.as_deref()),
        Command::Run(args) => match run_cmd::run(args) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("sm4c: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Graph { file, format, coverage } => match files::load_definition(&file, Limits::default()) {
            Ok(m) => {
                let untested = match coverage.map(|c| test_cmd::missed_transitions(&c, &m.id)) {
                    None => None,
                    Some(Ok(u)) => Some(u),
                    Some(Err(e)) => return report(&[e]),
                };
                print!(
                    "{}",
                    match format {
                        Format::Mermaid => graph::mermaid_marked(&m, untested.as_ref()),
                        Format::Dot => graph::dot_marked(&m, untested.as_ref()),
                    }
                );
                ExitCode::SUCCESS
            }
            Err(errs) => report(&errs),
        },
        Command::Test(args) => test_cmd::run(args),
        Command::TestState(args) => test_cmd::state::run(args),
        Command::Schedule(args) => schedule_cmd::run(args),
        Command::Batch(args) => batch_cmd::run(args),
        Command::Replay(args) => replay_cmd::run(args),
        Command::Schema => {
            print!("{SCHEMA}");
            ExitCode::SUCCESS
        }
        Command::Serve(args) => match serve::serve(*args) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("sm4c: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Client(cmd) => client::run(cmd),
    }
}

fn report(errs: &[FileError]) -> ExitCode {
    for e in errs {
        eprintln!("{e}");
    }
    ExitCode::from(2)
}

fn validate(paths: &[PathBuf], subflows: Option<&Path>) -> ExitCode {
    let mut errs = Vec::new();
    let known = match subflows.map(|d| files::load_folder(d, Limits::default())) {
        Some(Ok(k)) => Some(k),
        Some(Err(e)) => {
            errs.extend(e);
            None
        }
        None => None,
    };
    for p in paths {
        match files::load_definition(p, Limits::default()) {
            Ok(m) => {
                errs.extend(grpc::check_definition(p, &m));
                if let Some(known) = &known {
                    errs.extend(files::check_subflows(p, &m, known));
                }
            }
            Err(e) => errs.extend(e),
        }
    }
    if errs.is_empty() {
        ExitCode::SUCCESS
    } else {
        report(&errs)
    }
}
