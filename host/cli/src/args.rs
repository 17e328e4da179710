//! The command line: the clap types of `sm4c` and of its subcommands that have no file of their
//! own (`run`, `serve` and its Kafka flags), and the flags they share (the expression limits, where
//! calls go).

use crate::files::FileError;
use crate::{batch_cmd, client, replay_cmd, schedule_cmd, test_cmd};
use clap::{Parser, Subcommand, ValueEnum};
use sm4c_invoke::config::CallConfig;
use sm4c_runtime::{Limits, Options};
use std::path::PathBuf;

/// `sm4c serve --batch-rate`'s default: instances per second a batch acts on (see
/// bench/batch/README.md for what it costs live starts).
const DEFAULT_BATCH_RATE: u32 = 500;

#[derive(Parser)]
#[command(
    name = "sm4c",
    version,
    about = "Run SM4C state machines (State Machines For Cloud) written in JSON",
    after_help = "Examples:\n  sm4c validate flows/*.json\n  sm4c run order.json --input in.json --mock mocks.json --events events.ndjson --virtual-time\n  sm4c graph order.json --format dot | dot -Tsvg > order.svg\n  sm4c test flows/ --min-coverage 80 --junit report.xml"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
pub struct ServeArgs {
    /// The SQLite store file.
    #[arg(long, default_value = "./sm4c.db")]
    pub db: PathBuf,
    /// Address to listen on; port 0 takes one the system picks. Once bound, `sm4c serve` prints
    /// `sm4c: listening on URL` (http:// or https://, the bound address) on stdout.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Folder of definitions to register at start (all must be valid).
    #[arg(long)]
    pub definitions: Option<PathBuf>,
    /// JSON object mapping function names to jq expressions, as for `sm4c run`.
    #[arg(long)]
    pub mock: Option<PathBuf>,
    /// How long an event that reached no instance is kept for one that starts waiting (e.g. 5m).
    #[arg(long, default_value = "5m")]
    pub event_window: String,
    /// SQLite mode: most bytes (JSON text) of events kept parked at once; an event that reaches no
    /// instance and would pass it is refused with 429 `parkedLimit`. Default 64 MiB.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20, conflicts_with = "kafka")]
    pub max_parked_bytes: u64,
    /// Most redrives of one instance (`POST /instances/{id}/redrive`) whose definition does not
    /// say (SM4C `maxRedrives` does); past it a redrive is refused with 409 `notRedrivable`,
    /// reason `limitReached`. Default: no limit.
    #[arg(long, value_name = "N")]
    pub max_redrives: Option<u32>,
    #[command(flatten)]
    pub expression: ExpressionArgs,
    /// Listen on an address other than loopback without authentication (no token and no client
    /// certificate configured): anyone who reaches the port may do anything.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// Accept bearer tokens over plain HTTP on an address other than loopback (anyone on the path
    /// can read them): without it, such a server refuses to start; configure [server.tls] instead.
    /// In Kafka mode it also lets a worker send the group's peer token to workers whose URLs are
    /// plain http:// beyond loopback.
    #[arg(long)]
    pub insecure_plain_http: bool,
    /// Most connections open at once; one more is answered 503 and closed.
    #[arg(long, value_name = "N", default_value_t = sm4c_api::tls::MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers (HTTP/1), e.g. 10s.
    #[arg(long, value_name = "TIME", default_value = "10s")]
    pub header_timeout: String,
    /// Longest a request may take before it is answered 503 `timeout`, e.g. 2m (not a task-list
    /// poll, bounded by its `wait`, nor the inspector's event stream).
    #[arg(long, value_name = "TIME", default_value = "2m")]
    pub request_timeout: String,
    /// Longest a search of the inspector, a replay of an instance's journal for its page or a
    /// `POST /events/explain` may run (and wait for a slot) before it is answered 503 `busy`, e.g. 10s.
    #[arg(long, value_name = "TIME", default_value = "10s")]
    pub work_budget: String,
    /// How many of those jobs run at once (0: as many as the machine has cores); one more waits for
    /// a slot, at most `--work-budget`.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub work_slots: usize,
    /// The most instances per second a batch operation (`POST /batches`) acts on, each batch; a
    /// batch may ask for less with its `rate` field.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BATCH_RATE, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_rate: u32,
    /// Export OpenTelemetry traces (a span per instance step) over OTLP/HTTP to this URL, e.g. a
    /// collector's http://localhost:4318 (`/v1/traces` is added to a URL without a path). Off by
    /// default; the standard OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_* variables configure it too.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    #[command(flatten)]
    pub calls: CallArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
}

#[derive(clap::Args)]
pub struct KafkaArgs {
    /// Run on Kafka (bootstrap servers): instances are spread over the workers of a consumer group
    /// and kept in Kafka topics; `--db` is not used.
    #[arg(long, value_name = "BOOTSTRAP")]
    pub kafka: Option<String>,
    /// Consumer group of the workers.
    #[arg(long, default_value = "sm4c", requires = "kafka")]
    pub group: String,
    /// Prefix of the topics.
    #[arg(long, default_value = "sm4c", requires = "kafka")]
    pub topic_prefix: String,
    /// Another topic to consume incoming CloudEvents from (repeatable).
    #[arg(long = "events-topic", value_name = "TOPIC", requires = "kafka")]
    pub events_topics: Vec<String>,
    /// A librdkafka setting for every client, e.g. security.protocol=SASL_SSL (repeatable).
    #[arg(long = "kafka-config", value_name = "KEY=VALUE", requires = "kafka")]
    pub kafka_config: Vec<String>,
    /// A librdkafka setting whose value is read from an environment variable, e.g.
    /// sasl.password=KAFKA_PASSWORD (repeatable): secrets stay out of the command line, which
    /// other local users can read.
    #[arg(long = "kafka-config-env", value_name = "KEY=VARIABLE", requires = "kafka")]
    pub kafka_config_env: Vec<String>,
    /// exactly-once (transactions) or at-least-once (brokers without transactions).
    #[arg(long, default_value = "exactly-once", value_parser = ["exactly-once", "at-least-once"], requires = "kafka")]
    pub delivery: String,
    /// Partitions of the topics created at start.
    #[arg(long, default_value_t = 8, requires = "kafka")]
    pub partitions: i32,
    /// Events kept parked at most: in SQLite mode by the server (one more that reaches no instance
    /// is refused with 429 `parkedLimit`), in Kafka mode by each commands partition (more are
    /// dead-lettered, `parkedLimit`).
    #[arg(long, default_value_t = 100_000)]
    pub max_parked: usize,
    /// How many unended instances a worker keeps in memory; the others wait in its local store
    /// and are read from there when a command, an event or a timer comes for them.
    #[arg(long, default_value_t = 10_000, requires = "kafka")]
    pub cached_instances: usize,
    /// How long an ended instance stays on the state topic and in the API (then it is deleted).
    #[arg(long, default_value = "7d", requires = "kafka")]
    pub retention: String,
    /// Where this worker keeps the state of the partitions it owns (SQLite files), so that a
    /// restart reads only what is new on Kafka; one directory per worker. Without it, a temporary
    /// directory removed at exit.
    #[arg(long, value_name = "DIR", requires = "kafka")]
    pub state_dir: Option<PathBuf>,
    /// The URL at which the other workers and clients reach this worker's HTTP API, published in
    /// its membership record. Default: from --listen (a wildcard address becomes this machine's
    /// host name).
    #[arg(long, value_name = "URL", requires = "kafka")]
    pub advertise: Option<String>,
    /// This worker's static name in its group (Kafka's `group.instance.id`, KIP-345), the same at
    /// every restart and different for each worker: back within the session timeout, it gets its
    /// partitions again without a rebalance. Without it, each start joins as a new member.
    #[arg(long, value_name = "NAME", requires = "kafka")]
    pub group_instance_id: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Mermaid,
    Dot,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// Definition file.
    pub file: PathBuf,
    /// JSON input (default `{}`).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// JSON object mapping function names to jq expressions over the call's arguments.
    #[arg(long)]
    pub mock: Option<PathBuf>,
    /// NDJSON CloudEvents placed in the instance's inbox before the first state runs.
    #[arg(long)]
    pub events: Option<PathBuf>,
    /// Append every CloudEvent the instance sends to this file as NDJSON.
    #[arg(long)]
    pub sent: Option<PathBuf>,
    /// Folder of definitions, found by `id`, for `invokeSubflow`.
    #[arg(long)]
    pub subflows: Option<PathBuf>,
    /// Jump the clock to the next timer whenever the instance only waits for timers.
    #[arg(long)]
    pub virtual_time: bool,
    /// Run as a schedule's run for this nominal time (RFC 3339, e.g. 2026-11-28T02:00:00Z): the
    /// instance is `<schedule>@<time>` and reads the time with `schedule` (ASL: `$$.Schedule`); with
    /// --virtual-time the clock starts at it.
    #[arg(long, value_name = "TIME", value_parser = sm4c_schedule::parse_time)]
    pub nominal_time: Option<i64>,
    /// The schedule's id for --nominal-time (default: the definition's id).
    #[arg(long, value_name = "ID", requires = "nominal_time")]
    pub schedule: Option<String>,
    /// Write the run's history (its journal, as `sm4c history ID --json` prints one) to this file,
    /// for `sm4c replay`.
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,
    /// Print states entered, actions and transitions on stderr.
    #[arg(short, long)]
    pub verbose: bool,
    /// Transitions one input may cause before the instance fails as looping.
    #[arg(long, default_value_t = Options::default().max_transitions)]
    pub max_transitions: u64,
    #[command(flatten)]
    pub expression: ExpressionArgs,
    #[command(flatten)]
    pub calls: CallArgs,
}

/// The limits of every jq evaluation.
#[derive(clap::Args, Clone, Copy)]
pub struct ExpressionArgs {
    /// Steps one jq evaluation may take (its fuel): definition calls, and values of `l, r`, `..` and `.[]`.
    #[arg(long, default_value_t = Limits::default().fuel)]
    pub expression_fuel: u64,
    /// Longest string one jq evaluation may build, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_string)]
    pub expression_max_string: usize,
    /// Most elements of an array, or entries of an object, one jq evaluation may build.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_items)]
    pub expression_max_items: usize,
    /// Bytes one jq evaluation may build in all.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().memory)]
    pub expression_memory: u64,
}

impl ExpressionArgs {
    pub fn limits(&self) -> Limits {
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
pub struct CallArgs {
    /// TOML file of REST servers and headers per document, gRPC targets, metadata and deadlines per
    /// service, and what ASL Task Resources call (see the README); the flags below override and extend it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Base URL for an OpenAPI document, replacing its `servers`: DOCUMENT=URL (repeatable).
    #[arg(long = "rest-server", value_name = "DOCUMENT=URL")]
    pub servers: Vec<String>,
    /// A header sent with every call to a document's operations, for credentials:
    /// DOCUMENT=NAME:VALUE, or DOCUMENT=NAME:env:VAR to read the value from the environment (repeatable).
    #[arg(long = "rest-header", value_name = "DOCUMENT=NAME:VALUE")]
    pub headers: Vec<String>,
    /// Where a gRPC service runs: package.Service=http://HOST:PORT (repeatable).
    #[arg(long = "grpc-target", value_name = "SERVICE=URL")]
    pub grpc_targets: Vec<String>,
}

impl CallArgs {
    /// The configuration file, then the flags; `Ok(Err(..))` holds the file's errors, to report with the others.
    pub fn config(&self) -> anyhow::Result<Result<CallConfig, Vec<FileError>>> {
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
