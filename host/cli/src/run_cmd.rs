//! `sm4c run FILE`: one instance in memory, run to its end, its final data (or its error) printed;
//! functions without a mock are called for real.

use crate::args::RunArgs;
use crate::{files, report};
use anyhow::Context;
use serde_json::{json, Value};
use sm4c_host::{Clock, Config, InMemoryHost};
use sm4c_invoke::grpc::{self, GrpcInvoker};
use sm4c_invoke::router::CallRouter;
use sm4c_runtime::engine::Scheduled;
use sm4c_runtime::{ErrorKind, Options, Status, Trace};
use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let limits = args.expression.limits();
    let mut errs = Vec::new();
    let machine = files::load_definition(&args.file, limits)
        .map_err(|e| errs.extend(e))
        .ok();
    let subflows = match &args.subflows {
        Some(dir) => files::load_folder(dir, limits)
            .map_err(|e| errs.extend(e))
            .unwrap_or_default(),
        None => HashMap::new(),
    };
    if let Some(m) = &machine {
        errs.extend(files::check_subflows(&args.file, m, &subflows));
        errs.extend(grpc::check_definition(&args.file, m));
    }
    for (id, m) in &subflows {
        errs.extend(files::check_subflows(Path::new(&format!("subflow {id}")), m, &subflows));
    }
    let input = match &args.input {
        Some(p) => files::load_input(p).map_err(|e| errs.push(e)).unwrap_or(Value::Null),
        None => Value::Object(Default::default()),
    };
    let mocks = match &args.mock {
        Some(p) => files::load_mocks(p, limits)
            .map_err(|e| errs.extend(e))
            .unwrap_or_default(),
        None => HashMap::new(),
    };
    let events = match &args.events {
        Some(p) => files::load_events(p).map_err(|e| errs.extend(e)).unwrap_or_default(),
        None => Vec::new(),
    };
    let nominal = args.nominal_time;
    let mut calls = args.calls.config()?.map_err(|e| errs.extend(e)).unwrap_or_default();
    // sm4c run calls what its user's definition names: private addresses are allowed unless the
    // configuration refuses them.
    calls.apply(false);
    let Some(machine) = machine.filter(|_| errs.is_empty()) else {
        return Ok(report(&errs));
    };
    let sent = match &args.sent {
        Some(p) => Some(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("cannot open {} for sent events", p.display()))?,
        )),
        None => None,
    };

    let machine = Arc::new(machine);
    let is_asl = machine.asl.is_some();
    let base = args.file.parent().map(Path::to_path_buf).unwrap_or_default();
    let http = Arc::new(sm4c_invoke::asl::HttpTask::new(&calls.asl));
    let rest = Arc::new(sm4c_invoke::rest::RestInvoker::new(&base, calls.rest));
    let grpc = Arc::new(GrpcInvoker::new(&base, calls.grpc));
    let host = Arc::new(CallRouter {
        mocks,
        subflows,
        sent,
        rest: Some(rest),
        grpc: Some(grpc),
        asl_resources: calls.asl.resources,
        asl_at_most_once: calls.asl.at_most_once,
        http: Some(http),
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let verbose = args.verbose;
    let schedule = args.schedule.clone();
    let config = Config {
        clock: if args.virtual_time {
            Clock::Virtual {
                start: nominal.unwrap_or_else(sm4c_host::clock::wall_ms),
            }
        } else {
            Clock::Real
        },
        options: Options {
            journal: args.history.is_some(),
            trace: verbose || args.history.is_some(),
            max_transitions: args.max_transitions,
            ..Options::default()
        },
        trace: verbose.then(|| Arc::new(print_trace) as sm4c_host::TraceSink),
        ..Config::default()
    };
    let outcome = rt.block_on(async move {
        let host = InMemoryHost::new(host, config);
        let scheduled = nominal.map(|t| Scheduled {
            schedule: schedule.unwrap_or_else(|| machine.id.clone()),
            nominal_time: t,
        });
        let id = match &scheduled {
            Some(s) => sm4c_schedule::instance_id(&s.schedule, s.nominal_time),
            None => format!("{}-run", machine.id),
        };
        let id = host
            .start_scheduled(machine.clone(), Some(id), input, events, scheduled)
            .await;
        host.settle(&id).await
    });
    if let Some(path) = &args.history {
        let entries: Vec<Value> = outcome
            .journal
            .iter()
            .zip(1..)
            .map(|(e, seq)| sm4c_runtime::engine::history::history_entry(seq, e))
            .collect();
        let text = serde_json::to_string_pretty(&json!({"id": outcome.id, "entries": entries}))?;
        std::fs::write(path, text + "\n").with_context(|| format!("cannot write the history to {}", path.display()))?;
    }
    if is_asl {
        return asl_outcome(&outcome);
    }
    match outcome.status {
        Status::Completed => {
            println!("{}", serde_json::to_string_pretty(&outcome.data)?);
            Ok(ExitCode::SUCCESS)
        }
        status => {
            let error = match (&outcome.error, status.is_final()) {
                (Some(e), _) => e.clone(),
                (None, _) => {
                    let why = if outcome.pending_timers == 0 {
                        "the instance waits for events that never arrive and has no timer or call to wait for"
                    } else {
                        "the instance still runs after a million timers under --virtual-time (an endless timer loop?)"
                    };
                    let mut e = sm4c_runtime::ErrorInfo::new(ErrorKind::Stuck, why);
                    e.state = outcome.state.clone();
                    e
                }
            };
            println!("{}", serde_json::to_string_pretty(&error.to_json())?);
            let state = error.state.as_deref().or(outcome.state.as_deref()).unwrap_or("?");
            let what = match status {
                Status::TimedOut => "timed out",
                Status::Cancelled => "was cancelled",
                s if s.is_final() => "failed",
                _ => "cannot proceed",
            };
            let context = match error
                .details
                .as_ref()
                .and_then(|d| d.get("expression"))
                .and_then(Value::as_str)
            {
                Some(expr) if !error.message.contains(expr) => format!(" (in {expr})"),
                _ => String::new(),
            };
            eprintln!("sm4c: instance {what} in state {state:?}: {}{context}", error.message);
            Ok(ExitCode::from(1))
        }
    }
}

/// How `sm4c run` reports an ASL execution: its output (exit 0), or `{"Error", "Cause"}` on stdout
/// and a line naming the state on stderr (exit 1).
fn asl_outcome(outcome: &sm4c_host::memory::Outcome) -> anyhow::Result<ExitCode> {
    if outcome.status == Status::Completed {
        println!("{}", serde_json::to_string_pretty(&outcome.data)?);
        return Ok(ExitCode::SUCCESS);
    }
    let (error, state) = match &outcome.error {
        Some(e) => (
            e.details
                .clone()
                .unwrap_or_else(|| json!({"Error": e.kind.as_str(), "Cause": e.message})),
            e.state.clone().or(outcome.state.clone()),
        ),
        None => (
            json!({"Error": "States.Runtime", "Cause": "the execution cannot proceed: it waits for a task or timer that never comes"}),
            outcome.state.clone(),
        ),
    };
    println!("{}", serde_json::to_string_pretty(&error)?);
    let name = error.get("Error").and_then(Value::as_str).unwrap_or("(no error name)");
    let cause = error
        .get("Cause")
        .and_then(Value::as_str)
        .map(|c| format!(": {c}"))
        .unwrap_or_default();
    let what = match outcome.status {
        Status::TimedOut => "timed out",
        Status::Cancelled => "was cancelled",
        s if s.is_final() => "failed",
        _ => "cannot proceed",
    };
    eprintln!(
        "sm4c: execution {what} in state {:?}: {name}{cause}",
        state.as_deref().unwrap_or("?")
    );
    Ok(ExitCode::from(1))
}

fn print_trace(id: &str, t: &Trace) {
    let line = match t {
        Trace::StateEntered { state } => format!("enter state {state:?}"),
        Trace::TransitionFired {
            state,
            transition,
            next,
            trigger,
        } => match next {
            Some(n) => format!("transition {transition} of {state:?} ({trigger}) -> {n:?}"),
            None => format!("transition {transition} of {state:?} ({trigger}) stays"),
        },
        Trace::EventConsumed { event, id } => format!("event {event:?} consumed (id {id})"),
        Trace::ActionCompleted { op, action } => format!("{action} {op} completed"),
        Trace::ConditionNotBoolean {
            pointer,
            condition,
            value,
        } => format!("condition {pointer} {condition} yielded {value}, not a boolean: it does not fire"),
        Trace::ActionFailed { op, action, message } => format!("{action} {op} failed: {message}"),
        Trace::Retrying { op, attempt, delay_ms } => format!("retry {op}: attempt {attempt} in {delay_ms} ms"),
        Trace::Finished { status } => format!("instance {}", status.as_str()),
        Trace::Migrated {
            from,
            version,
            state,
            to,
        } => format!("moved from version {from} state {state:?} to version {version} state {to:?}"),
        Trace::Redriven { from, redrives } => format!("redriven (redrive {redrives}) from {from}"),
        Trace::Covered { pointer } => format!("took {pointer}"),
        Trace::Paused { at } => format!("paused at {}", serde_json::to_string(at).unwrap_or_default()),
        Trace::Resumed { stepping } => (if *stepping { "stepped" } else { "resumed" }).to_string(),
    };
    eprintln!("[{id}] {line}");
}
