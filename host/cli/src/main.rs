//! The `sm4c` command: glue between the command line and the host crates.

mod batch_cmd;
mod client;
mod debug;
mod files;
mod forward;
mod memory;
mod replay_cmd;
mod schedule_cmd;
mod test_cmd;
mod traces;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use files::FileError;
use serde_json::{json, Value};
use sm4c_host::{graph, Clock, Config, InMemoryHost};
use sm4c_invoke::config::CallConfig;
use sm4c_invoke::grpc::{self, GrpcInvoker};
use sm4c_invoke::router::CallRouter;
use sm4c_runtime::engine::Scheduled;
use sm4c_runtime::{ErrorKind, Limits, Options, Status, Trace};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `sm4c serve --batch-rate`'s default: instances per second a batch acts on (see
/// bench/batch/README.md for what it costs live starts).
const DEFAULT_BATCH_RATE: u32 = 500;

const SCHEMA: &str = include_str!("../../../schemas/sm4c.schema.json");

#[derive(Parser)]
#[command(
    name = "sm4c",
    version,
    about = "Run SM4C state machines (State Machines For Cloud) written in JSON",
    after_help = "Examples:\n  sm4c validate flows/*.json\n  sm4c run order.json --input in.json --mock mocks.json --events events.ndjson --virtual-time\n  sm4c graph order.json --format dot | dot -Tsvg > order.svg\n  sm4c test flows/ --min-coverage 80 --junit report.xml"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check definitions; prints `FILE: /json/pointer: message` for every error (exit 2 if any).
    Validate {
        /// Definition files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Folder of definitions that `invokeSubflow` may name (checked when given).
        #[arg(long)]
        subflows: Option<PathBuf>,
    },
    /// Run one instance to its end and print its final data.
    Run(RunArgs),
    /// Print the state diagram.
    Graph {
        /// Definition file.
        file: PathBuf,
        /// Diagram syntax.
        #[arg(long, value_enum, default_value_t = Format::Mermaid)]
        format: Format,
        /// Mark the transitions that the tests did not take, from `sm4c test --json` output.
        #[arg(long, value_name = "RESULT.json")]
        coverage: Option<PathBuf>,
    },
    /// Run the tests of `*.test.json` and `*.test.yaml` files, with coverage (exit 1 if any fails,
    /// 2 if a test file or definition is invalid).
    Test(test_cmd::TestArgs),
    /// Run one state of a definition and print the transition that fires, the data after it and
    /// the effects.
    TestState(test_cmd::state::TestStateArgs),
    /// Replay a recorded history (`sm4c history ID --json`, or a folder of them) through a
    /// definition: exit 0 when it decides the same, 1 at the first divergence (shown field by
    /// field), 2 for an unreadable history or an invalid definition.
    Replay(replay_cmd::ReplayArgs),
    /// Print the JSON Schema of the definition language.
    Schema,
    /// Schedules: `sm4c schedule next SPEC` prints a schedule's next times without a server.
    Schedule(schedule_cmd::ScheduleArgs),
    /// Batch operations of a server: cancel, redrive, migrate or send to every instance a filter
    /// matches, following the batch with a progress bar (`sm4c batch status|list|stop` too).
    Batch(batch_cmd::BatchArgs),
    /// Serve durable instances over HTTP, stored in SQLite.
    Serve(Box<ServeArgs>),
    #[command(flatten)]
    Client(client::ClientCommand),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// The SQLite store file.
    #[arg(long, default_value = "./sm4c.db")]
    db: PathBuf,
    /// Address to listen on; port 0 takes one the system picks. Once bound, `sm4c serve` prints
    /// `sm4c: listening on URL` (http:// or https://, the bound address) on stdout.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Folder of definitions to register at start (all must be valid).
    #[arg(long)]
    definitions: Option<PathBuf>,
    /// JSON object mapping function names to jq expressions, as for `sm4c run`.
    #[arg(long)]
    mock: Option<PathBuf>,
    /// How long an event that reached no instance is kept for one that starts waiting (e.g. 5m).
    #[arg(long, default_value = "5m")]
    event_window: String,
    /// SQLite mode: most bytes (JSON text) of events kept parked at once; an event that reaches no
    /// instance and would pass it is refused with 429 `parkedLimit`. Default 64 MiB.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20, conflicts_with = "kafka")]
    max_parked_bytes: u64,
    /// Most redrives of one instance (`POST /instances/{id}/redrive`) whose definition does not
    /// say (SM4C `maxRedrives` does); past it a redrive is refused with 409 `notRedrivable`,
    /// reason `limitReached`. Default: no limit.
    #[arg(long, value_name = "N")]
    max_redrives: Option<u32>,
    #[command(flatten)]
    expression: ExpressionArgs,
    /// Listen on an address other than loopback without authentication (no token and no client
    /// certificate configured): anyone who reaches the port may do anything.
    #[arg(long)]
    insecure_no_auth: bool,
    /// Accept bearer tokens over plain HTTP on an address other than loopback (anyone on the path
    /// can read them): without it, such a server refuses to start; configure [server.tls] instead.
    /// In Kafka mode it also lets a worker send the group's peer token to workers whose URLs are
    /// plain http:// beyond loopback.
    #[arg(long)]
    insecure_plain_http: bool,
    /// Most connections open at once; one more is answered 503 and closed.
    #[arg(long, value_name = "N", default_value_t = sm4c_api::tls::MAX_CONNECTIONS)]
    max_connections: usize,
    /// Longest a client may take to send a request's headers (HTTP/1), e.g. 10s.
    #[arg(long, value_name = "TIME", default_value = "10s")]
    header_timeout: String,
    /// Longest a request may take before it is answered 503 `timeout`, e.g. 2m (not a task-list
    /// poll, bounded by its `wait`, nor the inspector's event stream).
    #[arg(long, value_name = "TIME", default_value = "2m")]
    request_timeout: String,
    /// Longest a search of the inspector, a replay of an instance's journal for its page or a
    /// `POST /events/explain` may run (and wait for a slot) before it is answered 503 `busy`, e.g. 10s.
    #[arg(long, value_name = "TIME", default_value = "10s")]
    work_budget: String,
    /// How many of those jobs run at once (0: as many as the machine has cores); one more waits for
    /// a slot, at most `--work-budget`.
    #[arg(long, value_name = "N", default_value_t = 0)]
    work_slots: usize,
    /// The most instances per second a batch operation (`POST /batches`) acts on, each batch; a
    /// batch may ask for less with its `rate` field.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BATCH_RATE, value_parser = clap::value_parser!(u32).range(1..))]
    batch_rate: u32,
    /// Export OpenTelemetry traces (a span per instance step) over OTLP/HTTP to this URL, e.g. a
    /// collector's http://localhost:4318 (`/v1/traces` is added to a URL without a path). Off by
    /// default; the standard OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_* variables configure it too.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    #[command(flatten)]
    calls: CallArgs,
    #[command(flatten)]
    kafka: KafkaArgs,
}

#[derive(clap::Args)]
struct KafkaArgs {
    /// Run on Kafka (bootstrap servers): instances are spread over the workers of a consumer group
    /// and kept in Kafka topics; `--db` is not used.
    #[arg(long, value_name = "BOOTSTRAP")]
    kafka: Option<String>,
    /// Consumer group of the workers.
    #[arg(long, default_value = "sm4c", requires = "kafka")]
    group: String,
    /// Prefix of the topics.
    #[arg(long, default_value = "sm4c", requires = "kafka")]
    topic_prefix: String,
    /// Another topic to consume incoming CloudEvents from (repeatable).
    #[arg(long = "events-topic", value_name = "TOPIC", requires = "kafka")]
    events_topics: Vec<String>,
    /// A librdkafka setting for every client, e.g. security.protocol=SASL_SSL (repeatable).
    #[arg(long = "kafka-config", value_name = "KEY=VALUE", requires = "kafka")]
    kafka_config: Vec<String>,
    /// A librdkafka setting whose value is read from an environment variable, e.g.
    /// sasl.password=KAFKA_PASSWORD (repeatable): secrets stay out of the command line, which
    /// other local users can read.
    #[arg(long = "kafka-config-env", value_name = "KEY=VARIABLE", requires = "kafka")]
    kafka_config_env: Vec<String>,
    /// exactly-once (transactions) or at-least-once (brokers without transactions).
    #[arg(long, default_value = "exactly-once", value_parser = ["exactly-once", "at-least-once"], requires = "kafka")]
    delivery: String,
    /// Partitions of the topics created at start.
    #[arg(long, default_value_t = 8, requires = "kafka")]
    partitions: i32,
    /// Events kept parked at most: in SQLite mode by the server (one more that reaches no instance
    /// is refused with 429 `parkedLimit`), in Kafka mode by each commands partition (more are
    /// dead-lettered, `parkedLimit`).
    #[arg(long, default_value_t = 100_000)]
    max_parked: usize,
    /// How many unended instances a worker keeps in memory; the others wait in its local store
    /// and are read from there when a command, an event or a timer comes for them.
    #[arg(long, default_value_t = 10_000, requires = "kafka")]
    cached_instances: usize,
    /// How long an ended instance stays on the state topic and in the API (then it is deleted).
    #[arg(long, default_value = "7d", requires = "kafka")]
    retention: String,
    /// Where this worker keeps the state of the partitions it owns (SQLite files), so that a
    /// restart reads only what is new on Kafka; one directory per worker. Without it, a temporary
    /// directory removed at exit.
    #[arg(long, value_name = "DIR", requires = "kafka")]
    state_dir: Option<PathBuf>,
    /// The URL at which the other workers and clients reach this worker's HTTP API, published in
    /// its membership record. Default: from --listen (a wildcard address becomes this machine's
    /// host name).
    #[arg(long, value_name = "URL", requires = "kafka")]
    advertise: Option<String>,
    /// This worker's static name in its group (Kafka's `group.instance.id`, KIP-345), the same at
    /// every restart and different for each worker: back within the session timeout, it gets its
    /// partitions again without a rebalance. Without it, each start joins as a new member.
    #[arg(long, value_name = "NAME", requires = "kafka")]
    group_instance_id: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Mermaid,
    Dot,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Definition file.
    file: PathBuf,
    /// JSON input (default `{}`).
    #[arg(long)]
    input: Option<PathBuf>,
    /// JSON object mapping function names to jq expressions over the call's arguments.
    #[arg(long)]
    mock: Option<PathBuf>,
    /// NDJSON CloudEvents placed in the instance's inbox before the first state runs.
    #[arg(long)]
    events: Option<PathBuf>,
    /// Append every CloudEvent the instance sends to this file as NDJSON.
    #[arg(long)]
    sent: Option<PathBuf>,
    /// Folder of definitions, found by `id`, for `invokeSubflow`.
    #[arg(long)]
    subflows: Option<PathBuf>,
    /// Jump the clock to the next timer whenever the instance only waits for timers.
    #[arg(long)]
    virtual_time: bool,
    /// Run as a schedule's run for this nominal time (RFC 3339, e.g. 2026-11-28T02:00:00Z): the
    /// instance is `<schedule>@<time>` and reads the time with `schedule` (ASL: `$$.Schedule`); with
    /// --virtual-time the clock starts at it.
    #[arg(long, value_name = "TIME", value_parser = sm4c_schedule::parse_time)]
    nominal_time: Option<i64>,
    /// The schedule's id for --nominal-time (default: the definition's id).
    #[arg(long, value_name = "ID", requires = "nominal_time")]
    schedule: Option<String>,
    /// Write the run's history (its journal, as `sm4c history ID --json` prints one) to this file,
    /// for `sm4c replay`.
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
    /// Print states entered, actions and transitions on stderr.
    #[arg(short, long)]
    verbose: bool,
    /// Transitions one input may cause before the instance fails as looping.
    #[arg(long, default_value_t = Options::default().max_transitions)]
    max_transitions: u64,
    #[command(flatten)]
    expression: ExpressionArgs,
    #[command(flatten)]
    calls: CallArgs,
}

/// The limits of every jq evaluation.
#[derive(clap::Args, Clone, Copy)]
struct ExpressionArgs {
    /// Steps one jq evaluation may take (its fuel): definition calls, and values of `l, r`, `..` and `.[]`.
    #[arg(long, default_value_t = Limits::default().fuel)]
    expression_fuel: u64,
    /// Longest string one jq evaluation may build, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_string)]
    expression_max_string: usize,
    /// Most elements of an array, or entries of an object, one jq evaluation may build.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_items)]
    expression_max_items: usize,
    /// Bytes one jq evaluation may build in all.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().memory)]
    expression_memory: u64,
}

impl ExpressionArgs {
    fn limits(&self) -> Limits {
        Limits {
            fuel: self.expression_fuel,
            max_string: self.expression_max_string,
            max_items: self.expression_max_items,
            memory: self.expression_memory,
            ..Limits::default()
        }
    }
}

/// Where functions without a mock go (they are called for real): REST servers and credentials,
/// gRPC targets, and the configuration file holding them.
#[derive(clap::Args, Clone, Default)]
struct CallArgs {
    /// TOML file of REST servers and headers per document, gRPC targets, metadata and deadlines per
    /// service, and what ASL Task Resources call (see the README); the flags below override and extend it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Base URL for an OpenAPI document, replacing its `servers`: DOCUMENT=URL (repeatable).
    #[arg(long = "rest-server", value_name = "DOCUMENT=URL")]
    servers: Vec<String>,
    /// A header sent with every call to a document's operations, for credentials:
    /// DOCUMENT=NAME:VALUE, or DOCUMENT=NAME:env:VAR to read the value from the environment (repeatable).
    #[arg(long = "rest-header", value_name = "DOCUMENT=NAME:VALUE")]
    headers: Vec<String>,
    /// Where a gRPC service runs: package.Service=http://HOST:PORT (repeatable).
    #[arg(long = "grpc-target", value_name = "SERVICE=URL")]
    grpc_targets: Vec<String>,
}

impl CallArgs {
    /// The configuration file, then the flags; `Ok(Err(..))` holds the file's errors, to report with the others.
    fn config(&self) -> anyhow::Result<Result<CallConfig, Vec<FileError>>> {
        let mut c = match &self.config {
            Some(p) => match CallConfig::from_file(p) {
                Ok(c) => c,
                Err(errs) => return Ok(Err(errs)),
            },
            None => CallConfig::default(),
        };
        for s in &self.servers {
            c.rest_server(s).map_err(anyhow::Error::msg)?;
        }
        for h in &self.headers {
            c.rest_header(h).map_err(anyhow::Error::msg)?;
        }
        for t in &self.grpc_targets {
            c.grpc_target(t).map_err(anyhow::Error::msg)?;
        }
        c.check_rest_headers().map_err(anyhow::Error::msg)?;
        Ok(Ok(c))
    }
}

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
        Command::Run(args) => match run(args) {
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
        Command::Serve(args) => match serve(*args) {
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

fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
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

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let park_ms =
        sm4c_runtime::timespan::parse(&args.event_window).map_err(|e| anyhow::anyhow!("--event-window: {e}"))?;
    connections(&args)?;
    timespan(&args.request_timeout, "--request-timeout")?;
    timespan(&args.work_budget, "--work-budget")?;
    let mut errs = Vec::new();
    let mut docs = Vec::new();
    if let Some(dir) = &args.definitions {
        let paths = match files::json_files(dir) {
            Ok(p) => p,
            Err(e) => return Ok(report(&[e])),
        };
        for p in paths {
            match files::load_definition(&p, args.expression.limits()) {
                Ok(m) => {
                    errs.extend(grpc::check_definition(&p, &m));
                    docs.push((p, m.source.clone()))
                }
                Err(e) => errs.extend(e),
            }
        }
    }
    let mocks = match &args.mock {
        Some(p) => files::load_mocks(p, args.expression.limits())
            .map_err(|e| errs.extend(e))
            .unwrap_or_default(),
        None => HashMap::new(),
    };
    let mut calls = args.calls.config()?.map_err(|e| errs.extend(e)).unwrap_or_default();
    // Definitions registered over HTTP come from the API's callers: private and link-local
    // addresses are refused unless the configuration allows them ([calls]).
    calls.apply(true);
    if !errs.is_empty() {
        return Ok(report(&errs));
    }
    let security = match Security::of(&args, &calls.server) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sm4c: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    // Before the runtime: the exporter's blocking HTTP client is built outside async code.
    let traces = traces::Traces::configure(args.otlp_endpoint.as_deref())?.map(Arc::new);
    memory::spawn(std::time::Duration::from_secs(5));
    let code = serve_on(args, docs, mocks, calls, park_ms, security, traces.clone());
    if let Some(t) = traces {
        t.shutdown();
    }
    code
}

fn serve_on(
    args: ServeArgs,
    docs: Vec<(PathBuf, serde_json::Value)>,
    mocks: HashMap<String, sm4c_runtime::Expr>,
    calls: sm4c_invoke::config::CallConfig,
    park_ms: u64,
    security: Security,
    traces: Option<Arc<traces::Traces>>,
) -> anyhow::Result<ExitCode> {
    use sm4c_durable::store::SqliteStore;
    use sm4c_durable::{DurableHost, HostLimits};
    if let Some(bootstrap) = &args.kafka.kafka {
        return serve_kafka(&args, bootstrap, docs, mocks, calls, park_ms, security, traces);
    }
    let conns = connections(&args)?;
    let store = match SqliteStore::open(&args.db) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("sm4c: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let rt = serve_runtime()?;
    rt.block_on(async move {
        let metrics = metrics(traces);
        let host = served_functions(args.definitions.as_deref(), calls, mocks, &metrics);
        let limits = HostLimits {
            park_ms,
            max_parked: args.kafka.max_parked,
            max_parked_bytes: args.max_parked_bytes,
            expression: args.expression.limits(),
            max_redrives: args.max_redrives,
            ..HostLimits::default()
        };
        let batch_store = store.clone();
        let durable = match DurableHost::start(store, host, limits) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("sm4c: cannot start: {e}");
                return Ok(ExitCode::from(2));
            }
        };
        for (path, doc) in docs {
            if let Err(e) = durable.define(doc).await {
                eprintln!("{}: /: {e}", path.display());
                return Ok(ExitCode::from(2));
            }
        }
        // Batches left unfinished by the last run resume now.
        let batches = sm4c_host::batch::Batches::new(
            Arc::new(durable.clone()),
            batch_store,
            args.batch_rate,
            args.expression.limits(),
        );
        match batches.resume() {
            Ok(0) => {}
            Ok(n) => tracing::info!(batches = n, "resuming unfinished batches"),
            Err(e) => {
                eprintln!("sm4c: cannot read the batches: {e}");
                return Ok(ExitCode::from(2));
            }
        }
        let Some(listener) = listen(&args.listen).await else {
            return Ok(ExitCode::from(2));
        };
        tracing::info!(listen = %listener.local_addr()?, db = %args.db.display(), https = security.tls.is_some(), auth = security.auth.is_on(), "sm4c serving");
        report_listening(listener.local_addr()?, security.tls.is_some());
        let door = door(&args, security.auth.is_on(), listener.local_addr()?, None)?;
        let app = sm4c_api::door::layer(served_api(durable.clone(), metrics, security.auth, Some(batches)), door);
        let polls = durable.clone();
        let store_failure = Arc::new(std::sync::OnceLock::new());
        let failure = store_failure.clone();
        sm4c_api::tls::serve(listener, security.tls, conns, app, async move {
            tokio::select! {
                _ = shutdown_signal() => {}
                why = polls.failed() => {
                    let _ = failure.set(why);
                }
            }
            // Long polls would hold the stop for up to a minute.
            polls.close_polls();
        })
        .await?;
        if let Some(why) = store_failure.get() {
            // Nothing decided since the failure was acted on; a restart recovers from the store.
            eprintln!("sm4c: cannot write to the store: {why}; stopping");
            return Ok(ExitCode::from(3));
        }
        durable.shutdown().await;
        tracing::info!("stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// The metrics of `sm4c serve` (`GET /metrics`), fed by the driver of this process.
/// The runtime `sm4c serve` runs on, in both modes (instances run on threads with a large stack).
fn serve_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(STACK)
        .build()
}

/// The functions `sm4c serve` calls, in both modes: a jq mock where there is one, else the REST or
/// gRPC invoker (paths relative to the definitions folder), every call timed for the metrics.
fn served_functions(
    definitions: Option<&Path>,
    calls: sm4c_invoke::config::CallConfig,
    mocks: HashMap<String, sm4c_runtime::Expr>,
    metrics: &Arc<sm4c_api::metrics::Metrics>,
) -> Arc<sm4c_api::metrics::Metered> {
    let base = definitions.unwrap_or(Path::new("."));
    let http = Arc::new(sm4c_invoke::asl::HttpTask::new(&calls.asl));
    Arc::new(sm4c_api::metrics::Metered {
        inner: Arc::new(CallRouter {
            mocks,
            subflows: HashMap::new(),
            sent: None,
            rest: Some(Arc::new(sm4c_invoke::rest::RestInvoker::new(base, calls.rest))),
            grpc: Some(Arc::new(GrpcInvoker::new(base, calls.grpc))),
            asl_resources: calls.asl.resources,
            asl_at_most_once: calls.asl.at_most_once,
            http: Some(http),
        }),
        metrics: metrics.clone(),
    })
}

/// The line `sm4c serve` prints on stdout once it is bound, for a program that started it (with
/// `--listen 127.0.0.1:0`, a port the system picks) to read where it listens: the bound address, not
/// the one asked for. Nothing else of `sm4c serve` goes to stdout.
fn listening_line(addr: std::net::SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    format!("sm4c: listening on {scheme}://{addr}")
}

/// Prints [`listening_line`] and flushes it (stdout is block-buffered when it is not a terminal).
fn report_listening(addr: std::net::SocketAddr, tls: bool) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // A closed stdout must not stop the server: the log line says the same.
    let _ = writeln!(out, "{}", listening_line(addr, tls));
    let _ = out.flush();
}

/// Binds the API's address; says why on stderr when it cannot.
async fn listen(addr: &str) -> Option<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => Some(l),
        Err(e) => {
            eprintln!("sm4c: cannot listen on {addr}: {e}");
            None
        }
    }
}

/// The HTTP API of `sm4c serve` over either host, with `/metrics` and, when configured, authentication.
fn served_api(
    backend: impl sm4c_host::service::Backend,
    metrics: Arc<sm4c_api::metrics::Metrics>,
    auth: sm4c_api::auth::Auth,
    batches: Option<Arc<sm4c_host::batch::Batches>>,
) -> axum::Router {
    let mut api = sm4c_api::router(backend);
    if let Some(b) = batches {
        api = api.layer(axum::Extension(b));
    }
    sm4c_api::auth::layer(api.merge(sm4c_api::metrics::route(metrics)), auth)
}

/// The metrics of `sm4c serve`, and the observer that feeds them and, when on, the traces.
fn metrics(traces: Option<Arc<traces::Traces>>) -> Arc<sm4c_api::metrics::Metrics> {
    let metrics = Arc::new(sm4c_api::metrics::Metrics::new());
    // One server per process: the observer is installed once.
    sm4c_host::metrics::observe(Box::new(traces::Observed {
        metrics: Box::new(sm4c_api::metrics::Observed(metrics.clone())),
        traces,
    }));
    metrics
}

#[allow(clippy::too_many_arguments)]
fn serve_kafka(
    args: &ServeArgs,
    bootstrap: &str,
    docs: Vec<(PathBuf, serde_json::Value)>,
    mocks: HashMap<String, sm4c_runtime::Expr>,
    calls: sm4c_invoke::config::CallConfig,
    park_ms: u64,
    security: Security,
    traces: Option<Arc<traces::Traces>>,
) -> anyhow::Result<ExitCode> {
    let mut config = sm4c_kafka::KafkaConfig::new(bootstrap);
    config.group = args.kafka.group.clone();
    config.prefix = args.kafka.topic_prefix.clone();
    config.events_topics = args.kafka.events_topics.clone();
    config.exactly_once = args.kafka.delivery == "exactly-once";
    config.partitions = args.kafka.partitions;
    config.event_window_ms = park_ms as i64;
    config.max_parked = args.kafka.max_parked;
    config.max_redrives = args.max_redrives;
    config.cached_instances = args.kafka.cached_instances;
    config.group_instance_id = args.kafka.group_instance_id.clone();
    config.batch_rate = args.batch_rate;
    config.retention_ms = match sm4c_runtime::timespan::parse(&args.kafka.retention) {
        Ok(ms) => ms as i64,
        Err(e) => {
            eprintln!("sm4c: --retention {:?}: {e}", args.kafka.retention);
            return Ok(ExitCode::from(2));
        }
    };
    config.expression = args.expression.limits();
    let conns = connections(args)?;
    match kafka_settings(&args.kafka.kafka_config, &args.kafka.kafka_config_env, |v| {
        std::env::var(v).ok()
    }) {
        Ok(settings) => config.settings.extend(settings),
        Err(e) => {
            eprintln!("sm4c: {e}");
            return Ok(ExitCode::from(2));
        }
    }
    let stores = match &args.kafka.state_dir {
        Some(dir) => sm4c_durable::local::SqliteStores::open(dir),
        None => sm4c_durable::local::SqliteStores::temporary(),
    };
    let stores: Arc<dyn sm4c_host::local::LocalStores> = match stores {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("sm4c: --state-dir: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let rt = serve_runtime()?;
    rt.block_on(async move {
        let metrics = metrics(traces);
        let host = served_functions(args.definitions.as_deref(), calls, mocks, &metrics);
        let docs: Vec<serde_json::Value> = docs.into_iter().map(|(_, d)| d).collect();
        tracing::info!(state = %stores.describe(), "local stores of the owned partitions");
        let kafka = match sm4c_kafka::KafkaHost::start_with_stores(config, docs, host, Some(stores)).await {
            Ok(k) => k,
            Err(e) => {
                eprintln!("sm4c: cannot start on Kafka: {e}");
                return Ok(ExitCode::from(2));
            }
        };
        let Some(listener) = listen(&args.listen).await else {
            return Ok(ExitCode::from(2));
        };
        let url = match &args.kafka.advertise {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => advertised(listener.local_addr()?, security.tls.is_some()),
        };
        kafka.advertise(url.clone());
        tracing::info!(listen = %listener.local_addr()?, advertise = %url, kafka = bootstrap, group = %args.kafka.group, https = security.tls.is_some(), auth = security.auth.is_on(), "sm4c serving on Kafka");
        report_listening(listener.local_addr()?, security.tls.is_some());
        let peers = match forward::Peers::new(security.tls_roots.as_deref()) {
            Ok(p) => Arc::new(p),
            Err(e) => {
                eprintln!("sm4c: the client for the other workers: {e}");
                return Ok(ExitCode::from(2));
            }
        };
        let api =
            sm4c_api::router_with(kafka.clone(), peers, security.peering).merge(sm4c_api::metrics::route(metrics));
        let door = door(args, security.auth.is_on(), listener.local_addr()?, Some(&url))?;
        let app = sm4c_api::door::layer(sm4c_api::auth::layer(api, security.auth), door);
        sm4c_api::tls::serve(listener, security.tls, conns, app, shutdown_signal()).await?;
        kafka.shutdown().await;
        tracing::info!("stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// The librdkafka settings of `--kafka-config KEY=VALUE` and `--kafka-config-env KEY=VARIABLE`
/// (the value of the variable, read with `env`). Errors never quote a value: it may be a secret.
fn kafka_settings(
    given: &[String],
    from_env: &[String],
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for kv in given {
        let Some((k, v)) = kv.split_once('=') else {
            let key = kv.split(':').next().unwrap_or_default();
            return Err(format!("--kafka-config {key:?}…: expected KEY=VALUE"));
        };
        out.push((k.trim().to_string(), v.trim().to_string()));
    }
    for kv in from_env {
        let Some((k, var)) = kv
            .split_once('=')
            .filter(|(k, v)| !k.trim().is_empty() && !v.trim().is_empty())
        else {
            return Err(format!(
                "--kafka-config-env {kv:?}: expected KEY=VARIABLE, e.g. sasl.password=KAFKA_PASSWORD"
            ));
        };
        let (k, var) = (k.trim(), var.trim());
        let Some(v) = env(var) else {
            return Err(format!(
                "--kafka-config-env {k}={var}: the environment variable {var} is not set"
            ));
        };
        // A setting given both ways takes the variable's value.
        out.retain(|(have, _)| have != k);
        out.push((k.to_string(), v));
    }
    Ok(out)
}

/// The URL of a worker's HTTP API listening at `addr`: a wildcard address becomes this machine's
/// host name (`/proc/sys/kernel/hostname`, else `HOSTNAME`, else `localhost`).
fn advertised(addr: std::net::SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    let host = if addr.ip().is_unspecified() {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into())
    } else if addr.is_ipv6() {
        format!("[{}]", addr.ip())
    } else {
        addr.ip().to_string()
    };
    format!("{scheme}://{host}:{}", addr.port())
}

/// Who may use the server and whether it speaks TLS: from the `[server]` section of the
/// configuration file and the `SM4C_TOKEN_ADMIN`, `SM4C_TOKEN_OPERATE` and `SM4C_TOKEN_READ`
/// variables (comma-separated tokens); in Kafka mode, the group's peer token (`[server]
/// peer_token`, or `SM4C_PEER_TOKEN`, which wins).
struct Security {
    auth: sm4c_api::auth::Auth,
    /// How this worker authenticates to the others of its group (Kafka mode).
    peering: sm4c_api::cluster::Peering,
    tls: Option<Arc<sm4c_api::tls::ServerConfig>>,
    /// The server certificate's chain (PEM): trusted when this worker asks another of its group,
    /// which usually serves the same.
    tls_roots: Option<Vec<u8>>,
}

impl Security {
    fn of(args: &ServeArgs, server: &sm4c_invoke::config::ServerConfig) -> Result<Security, String> {
        use sm4c_api::auth::{Auth, Role};
        let mut auth = Auth::default();
        for (role, digest) in &server.tokens {
            auth.token(role.parse()?, *digest);
        }
        for role in Role::ALL {
            let var = format!("SM4C_TOKEN_{}", role.as_str().to_uppercase());
            if let Ok(list) = std::env::var(&var) {
                for token in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                    auth.token(role, sm4c_api::auth::digest(token));
                }
            }
        }
        let config_file = args
            .calls
            .config
            .as_deref()
            .unwrap_or(Path::new("the configuration file"));
        let peer = match (std::env::var(PEER_TOKEN_VAR), &server.peer_token) {
            (Ok(t), _) => Some(sm4c_api::auth::PeerToken::new(&t).map_err(|e| format!("{PEER_TOKEN_VAR}: {e}"))?),
            (Err(_), Some(t)) => Some(
                sm4c_api::auth::PeerToken::new(t)
                    .map_err(|e| format!("{}: server.peer_token: {e}", config_file.display()))?,
            ),
            (Err(_), None) => None,
        };
        let mut tls_roots = None;
        let tls = match &server.tls {
            None => None,
            Some(t) => {
                tls_roots = Some(t.cert.clone());
                for (cn, role) in &t.clients {
                    auth.client(cn.clone(), role.parse()?);
                }
                let config = sm4c_api::tls::server_config(&t.cert, &t.key, t.client_ca.as_deref())
                    .map_err(|e| format!("{}: server.tls: {e}", config_file.display()))?;
                Some(Arc::new(config))
            }
        };
        if auth.is_on() && tls.is_none() && !is_loopback(&args.listen) && !args.insecure_plain_http {
            return Err(format!(
                "refusing to accept bearer tokens over plain HTTP on {}: anyone on the network path could read \
                 them and use them. Configure [server.tls] in --config (HTTPS), listen on loopback behind a \
                 proxy that speaks HTTPS, or pass --insecure-plain-http",
                args.listen
            ));
        }
        // A group whose API needs credentials needs the workers' own: they never pass a caller's
        // on. Refused at the start rather than at the first request for an instance held by
        // another worker, which a user would meet only once the group grew past one worker.
        if auth.is_on() && args.kafka.kafka.is_some() && peer.is_none() {
            return Err(format!(
                "Kafka mode with authentication needs a peer token, which the workers of the group \
                 authenticate to each other with (they never pass a caller's token on): set \
                 {PEER_TOKEN_VAR}, or [server] peer_token in --config (\"env:VARIABLE\" or a literal), \
                 to the same secret of at least 16 characters on every worker"
            ));
        }
        let peering = sm4c_api::cluster::Peering {
            // With authentication off nobody checks it: it is not sent.
            token: peer.filter(|_| auth.is_on()),
            plain_http: args.insecure_plain_http,
        };
        if let Some(p) = &peering.token {
            auth.peer(p.digest());
        }
        if !auth.is_on() {
            if !is_loopback(&args.listen) && !args.insecure_no_auth {
                return Err(format!(
                    "refusing to listen on {} without authentication: anyone who reaches it could register \
                     definitions, start and cancel instances. Configure tokens ([server] tokens in --config, or \
                     SM4C_TOKEN_ADMIN / SM4C_TOKEN_OPERATE / SM4C_TOKEN_READ), listen on loopback (127.0.0.1, \
                     ::1, localhost), or pass --insecure-no-auth",
                    args.listen
                ));
            }
            if args.insecure_no_auth && !is_loopback(&args.listen) {
                tracing::warn!(listen = %args.listen, "no authentication (--insecure-no-auth): anyone who reaches this address may do anything");
            }
        }
        Ok(Security {
            auth,
            peering,
            tls,
            tls_roots,
        })
    }
}

/// The variable of the peer token of a Kafka group (see [`Security`]).
const PEER_TOKEN_VAR: &str = "SM4C_PEER_TOKEN";

/// The checks and limits in front of the API ([`sm4c_api::door`]) for a server listening at
/// `local` (from `--listen`), advertised to its group at `advertise` (Kafka).
fn door(
    args: &ServeArgs,
    auth: bool,
    local: std::net::SocketAddr,
    advertise: Option<&str>,
) -> anyhow::Result<sm4c_api::door::Door> {
    let mut door = sm4c_api::door::Door {
        auth,
        any_ip: local.ip().is_unspecified(),
        request_timeout: timespan(&args.request_timeout, "--request-timeout")?,
        work: sm4c_api::work::Work::new(
            args.expression.limits(),
            timespan(&args.work_budget, "--work-budget")?,
            args.work_slots,
        ),
        ..Default::default()
    };
    if !local.ip().is_unspecified() {
        door.host_of_url(&args.listen);
        door.host_of_url(&local.to_string());
    }
    if let Some(url) = advertise {
        door.host_of_url(url);
    }
    Ok(door)
}

/// The connection limits of `--max-connections` and `--header-timeout`.
fn connections(args: &ServeArgs) -> anyhow::Result<sm4c_api::tls::Connections> {
    if args.max_connections == 0 {
        anyhow::bail!("--max-connections: must be at least 1");
    }
    Ok(sm4c_api::tls::Connections {
        max: args.max_connections,
        header_timeout: timespan(&args.header_timeout, "--header-timeout")?,
    })
}

/// A span of time of a flag (`10s`, `2m`, `PT1M`), more than zero.
fn timespan(text: &str, flag: &str) -> anyhow::Result<std::time::Duration> {
    match sm4c_runtime::timespan::parse(text) {
        Ok(0) => anyhow::bail!("{flag} {text:?}: must be more than zero"),
        Ok(ms) => Ok(std::time::Duration::from_millis(ms)),
        Err(e) => anyhow::bail!("{flag} {text:?}: {e}"),
    }
}

/// Whether `--listen` is a loopback address: 127.0.0.0/8, ::1 or `localhost`.
fn is_loopback(listen: &str) -> bool {
    if let Ok(a) = listen.parse::<std::net::SocketAddr>() {
        return a.ip().is_loopback();
    }
    listen
        .rsplit_once(':')
        .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"))
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
}

#[cfg(test)]
mod tests {
    use super::{kafka_settings, listening_line};

    #[test]
    fn the_listening_line_names_the_bound_address_and_the_scheme() {
        let v4: std::net::SocketAddr = "127.0.0.1:40213".parse().unwrap();
        assert_eq!(listening_line(v4, false), "sm4c: listening on http://127.0.0.1:40213");
        assert_eq!(listening_line(v4, true), "sm4c: listening on https://127.0.0.1:40213");
        let v6: std::net::SocketAddr = "[::1]:8443".parse().unwrap();
        assert_eq!(listening_line(v6, true), "sm4c: listening on https://[::1]:8443");
    }

    #[test]
    fn kafka_settings_come_from_the_flags_and_the_environment() {
        let env = |v: &str| (v == "KAFKA_PASSWORD").then(|| "s3cret=with=equals".to_string());
        let given = [
            "security.protocol=SASL_SSL".to_string(),
            "sasl.password=on-the-command-line".into(),
        ];
        let from_env = ["sasl.password=KAFKA_PASSWORD".to_string()];
        let got = kafka_settings(&given, &from_env, env).expect("settings");
        assert_eq!(
            got,
            vec![
                ("security.protocol".to_string(), "SASL_SSL".to_string()),
                ("sasl.password".to_string(), "s3cret=with=equals".to_string()),
            ],
            "the variable's value wins over the flag's"
        );
        let e = kafka_settings(&[], &["sasl.password=NOT_SET".into()], env).expect_err("unset");
        assert!(e.contains("NOT_SET is not set") && e.contains("sasl.password"), "{e}");
        for bad in ["sasl.password", "=VAR", "sasl.password="] {
            let e = kafka_settings(&[], &[bad.into()], env).expect_err(bad);
            assert!(e.contains("expected KEY=VARIABLE"), "{e}");
        }
        // A malformed --kafka-config does not quote what may be a secret.
        let e = kafka_settings(&["sasl.password:hunter2".into()], &[], env).expect_err("no =");
        assert!(!e.contains("hunter2") && e.contains("expected KEY=VALUE"), "{e}");
    }
}
