//! The Kafka host: state machines that consume and send CloudEvents on Kafka topics, spread over
//! the workers of a consumer group, with Kafka as the only store.
//!
//! # How it works
//!
//! - **Instances live in partitions.** An instance belongs to partition `partition_of(id)` of
//!   the commands topic; the worker the group assigns that partition to owns the instance and
//!   is the only one deciding for it (one decision task at a time per execution, as in SWF).
//! - **Everything an instance reacts to is a command** on its partition: starts, cancels, events
//!   routed from the events topics, call results, timers that came due. The owner reads a batch,
//!   runs the engine, and in one Kafka transaction produces the new instance states (state
//!   topic, compacted), journal entries, sent events and commands for other instances, and
//!   commits the batch's input offsets.
//! - **A new owner restores** the partition from the state topic, re-arms timers and performs
//!   calls in flight again (with the same operation id), then goes on from the committed offset.
//! - **Events are routed** by the owner of their events partition: to the instance named by
//!   `sm4cinstanceid`; else, when every definition that may take it routes it by a correlation
//!   attribute whose value it names, to the partition that owns that key (`attribute`, value),
//!   which hands it to the partitions of the instances subscribed to the key (each instance's
//!   owner subscribes it in the transaction that gives it the key) or parks it until one
//!   subscribes; else to every commands partition, where each owner matches its own instances.
//!   An event no instance takes within the window is dead-lettered once every partition it
//!   went to has said so. A batch of an events partition rides in the transaction of one of
//!   the worker's commands partitions: the events for that partition's instances are applied
//!   there at once, the others become commands, and the events offsets are committed with it.
//!   Each instance still sees the events of one events partition in order: a partition takes
//!   events directly only when no command routed to it from that events partition is pending,
//!   and, after an assignment, once it has read back a barrier it put at the end of its
//!   commands partition.
//! - **Restores read committed records only**, even on brokers that show the records of aborted
//!   transactions: every transaction of a commands partition commits the next number on
//!   `P.clock` (a topic never written; only the group's offsets on it count), and state and
//!   journal records carry the number of the transaction that wrote them.
//!
//! # Example
//!
//! An application runs state machines inside its own service with its own librdkafka settings:
//!
//! ```no_run
//! use serde_json::Value;
//! use sm4c_host::{BoxFuture, FunctionCall, Functions};
//! use sm4c_kafka::{KafkaConfig, KafkaHost};
//! use sm4c_runtime::ErrorInfo;
//! use std::sync::Arc;
//!
//! /// The application's functions: here, each call echoes its arguments.
//! struct App;
//!
//! impl Functions for App {
//!     fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
//!         Box::pin(async move { Ok(call.arguments) })
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let mut config = KafkaConfig::new("localhost:9092");
//! config.group = "orders".into();
//! config.settings.push(("security.protocol".into(), "plaintext".into()));
//! let definition = serde_json::from_str(&std::fs::read_to_string("order-saga.json")?)?;
//! let functions = Arc::new(App);
//! let host = KafkaHost::start(config, vec![definition], functions).await?;
//! // ... the service runs; instances start from events or from `host.start_instance(..)`.
//! host.shutdown().await;
//! # Ok(())
//! # }
//! ```

#[doc(hidden)]
pub mod fuzzing;
pub mod members;
mod view;
mod wire;
mod worker;

pub use wire::{corr_key, partition_of, start_id};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::{json, Value};
use sm4c_host::service::Backend;
use sm4c_host::service::{BatchOp, HostError, Registry, ScheduleOp};
use sm4c_host::service::{Stored, Summary};
use sm4c_host::{BoxFuture, Functions};
use sm4c_runtime::{load, Entry, LoadOptions, Machine};
use sm4c_schedule::Spec;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use wire::{Command, JournalRecord, Quiet};

/// How long API calls wait for the cluster to take a command into account.
const API_WAIT: Duration = Duration::from_secs(30);

/// How often a request waiting for its write to be decided looks again without being woken (it is
/// woken when the owner commits it: this is for a partition that moved meanwhile).
const RECHECK: Duration = Duration::from_millis(250);
/// How long a request about an instance waits for a worker to serve the instance's partition
/// (while it is restored, or while the group moves it after a worker left).
const LOCATE_WAIT: Duration = Duration::from_secs(10);

/// Settings of a Kafka host.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// Consumer group of the workers (default `sm4c`).
    pub group: String,
    /// Prefix of the topics (default `sm4c`).
    pub prefix: String,
    /// More topics to consume incoming CloudEvents from, besides `<prefix>.events`.
    pub events_topics: Vec<String>,
    /// librdkafka settings for every client (TLS, SASL, timeouts...).
    pub settings: Vec<(String, String)>,
    /// Transactions (exactly once); `false` for at least once, on brokers without transactions.
    pub exactly_once: bool,
    /// Partitions of the topics created at start.
    pub partitions: i32,
    /// How long an event that reached no instance is kept for one (ms).
    pub event_window_ms: i64,
    /// Journal entries an instance may have.
    pub max_journal: i64,
    /// Events a commands partition keeps parked at most; beyond, they are dead-lettered
    /// (`parkedLimit`).
    pub max_parked: usize,
    /// The largest event (JSON bytes) that is parked; larger ones are dead-lettered (`tooLarge`):
    /// its record must fit the broker's message limit (`message.max.bytes`, 1 MB by default).
    pub max_record_bytes: usize,
    /// How long a commands partition may go without a transaction before it commits an empty one
    /// (ms, default one day): its offsets on `P.clock` must not reach the broker's
    /// `offsets.retention.minutes` (7 days by default), so keep this well below it.
    pub offsets_refresh_ms: i64,
    /// How long an ended instance stays on `P.state` (and in the API) after it ended (ms,
    /// default 7 days); then its state record is deleted. Its journal follows `P.journal`'s own
    /// retention.
    pub retention_ms: i64,
    /// Limits of every jq evaluation (fuel, sizes) of the definitions the workers load.
    pub expression: sm4c_runtime::Limits,
    /// Most redrives of one instance whose definition does not say (SM4C `maxRedrives` does);
    /// none: no limit.
    pub max_redrives: Option<u32>,
    /// How many unended instances a worker keeps in memory, over all its partitions, when it
    /// keeps local stores (default 10,000): the least recently used beyond that are read from the
    /// partition's store when a command, an event or a timer comes for them.
    pub cached_instances: usize,
    /// With local stores, the timers due more than this from now (ms, default 10 minutes) are kept
    /// in their partition's local store, not in memory, and taken into memory as they come near:
    /// an instance that waits for a day costs no memory for its timer.
    pub timer_horizon_ms: i64,
    /// Static membership (`group.instance.id`, KIP-345): the worker's name in its group, stable
    /// across restarts and different for each worker. A worker that comes back under its name
    /// within the session timeout is given its partitions again without a rebalance, and the
    /// others keep theirs; one that does not come back holds its partitions until the session
    /// timeout ends (`session.timeout.ms`, librdkafka's default 45 s). A second worker started
    /// under a name in use fences the first, which stops (its health says why). `None` (the
    /// default): a new member at each start.
    pub group_instance_id: Option<String>,
    /// The most instances per second a batch operation acts on over the whole group (`sm4c serve
    /// --batch-rate`, default 500): each commands partition's owner applies its share at this
    /// rate divided by the number of partitions.
    pub batch_rate: u32,
}

impl KafkaConfig {
    /// Defaults for a cluster.
    pub fn new(bootstrap: &str) -> Self {
        KafkaConfig {
            bootstrap: bootstrap.to_string(),
            group: "sm4c".into(),
            prefix: "sm4c".into(),
            events_topics: Vec::new(),
            settings: Vec::new(),
            exactly_once: true,
            partitions: 8,
            event_window_ms: 5 * 60_000,
            max_journal: 100_000,
            max_parked: 100_000,
            max_record_bytes: 900_000,
            offsets_refresh_ms: 24 * 3_600_000,
            retention_ms: 7 * 24 * 3_600_000,
            expression: sm4c_runtime::Limits::default(),
            max_redrives: None,
            cached_instances: 10_000,
            timer_horizon_ms: 10 * 60_000,
            group_instance_id: None,
            batch_rate: 500,
        }
    }

    /// The consumer group the workers read the events topics in: `<group>.events`. The commands
    /// topic is read in [`KafkaConfig::group`]; each group balances its own partitions.
    pub fn events_group(&self) -> String {
        format!("{}.events", self.group)
    }

    /// The worker's static name in its group: [`KafkaConfig::group_instance_id`], else a
    /// `group.instance.id` among the librdkafka settings.
    pub fn static_name(&self) -> Option<String> {
        self.group_instance_id.clone().or_else(|| {
            self.settings
                .iter()
                .rev()
                .find(|(k, _)| k == "group.instance.id")
                .map(|(_, v)| v.clone())
        })
    }

    /// A client configuration in three layers: sm4c's `defaults` (tuning the user may change), then
    /// the user's `settings`, then what sm4c's guarantees rest on (`forced`: the group, the
    /// transactional id, no auto-commit, read committed), which no setting overrides.
    pub fn layered(&self, defaults: &[(&str, &str)], forced: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap);
        for (k, v) in defaults {
            c.set(*k, *v);
        }
        for (k, v) in &self.settings {
            c.set(k, v);
        }
        for (k, v) in forced {
            c.set(*k, *v);
        }
        c
    }
}

/// Topic names.
#[derive(Debug, Clone)]
pub struct Topics {
    /// Incoming CloudEvents: `<prefix>.events` and the extra ones.
    pub events: Vec<String>,
    /// Sent CloudEvents (default destination): `<prefix>.events.out`.
    pub out: String,
    /// Events no instance took, unreadable messages: `<prefix>.events.deadletter`.
    pub deadletter: String,
    /// The group's workers: `<prefix>.members` ([`members`]).
    pub members: String,
    /// Instance commands: `<prefix>.commands`.
    pub commands: String,
    /// Instance states (compacted): `<prefix>.state`.
    pub state: String,
    /// Journals: `<prefix>.journal`.
    pub journal: String,
    /// Definitions (compacted): `<prefix>.definitions`.
    pub definitions: String,
    /// What task list topics start with: `<prefix>.tasks.`.
    pub tasks: String,
    /// Never written: the group's committed offsets on it number each partition's transactions
    /// (`<prefix>.clock`, one partition per commands partition).
    pub clock: String,
}

impl Topics {
    /// The topics of a prefix.
    pub fn new(prefix: &str, extra_events: &[String]) -> Topics {
        let mut events = vec![format!("{prefix}.events")];
        events.extend(extra_events.iter().cloned());
        Topics {
            events,
            out: format!("{prefix}.events.out"),
            deadletter: format!("{prefix}.events.deadletter"),
            commands: format!("{prefix}.commands"),
            state: format!("{prefix}.state"),
            journal: format!("{prefix}.journal"),
            definitions: format!("{prefix}.definitions"),
            tasks: format!("{prefix}.tasks."),
            clock: format!("{prefix}.clock"),
            members: format!("{prefix}.members"),
        }
    }

    /// The topic of worker task list `name`: `<prefix>.tasks.<name>`.
    pub fn task_list(&self, name: &str) -> String {
        format!("{}{name}", self.tasks)
    }
}

/// Why the Kafka host could not start.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// The cluster or a client failed.
    #[error("kafka: {0}")]
    Kafka(String),
    /// A definition is invalid or conflicts with a registered one.
    #[error("{0}")]
    Definition(String),
}

/// What POST /events answers in Kafka mode: the event is on the events topic.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Delivery {
    /// Always true: routing happens when a worker consumes it.
    pub queued: bool,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

pub(crate) struct Shared {
    pub cfg: KafkaConfig,
    pub topics: Topics,
    pub partitions: i32,
    pub registry: RwLock<Registry>,
    pub host: Arc<dyn Functions>,
    pub rt: tokio::runtime::Handle,
    pub plain: ThreadedProducer<Quiet>,
    pub stop: AtomicBool,
    pub owned: AtomicUsize,
    /// How many events partitions this worker reads, in the events group.
    pub events_read: AtomicUsize,
    /// How many unended instances the owners keep in memory ([`KafkaConfig::cached_instances`]).
    pub cached: AtomicUsize,
    pub failure: Mutex<Option<String>>,
    /// How instances run: the same driver as every host's.
    pub driver: sm4c_host::driver::Driver,
    /// The step debugger's breakpoints, by definition id: records of the definitions topic
    /// ([`wire::BREAKPOINTS_PREFIX`]), which every worker's view reads.
    pub breakpoints: sm4c_host::driver::Breakpoints,
    /// Where the state partitions of owned commands partitions are kept between restores
    /// ([`sm4c_host::local`]); `None`: each restore reads its state partition from the beginning.
    pub local: Option<Arc<dyn sm4c_host::local::LocalStores>>,
    /// Writes to the local stores, off the batches' path (with `local` only).
    pub keeper: Option<worker::keeper::Keeper>,
    /// The group's workers and what each owns ([`members`]).
    pub members: members::Members,
    /// The instances of the partitions this worker owns, for its HTTP API.
    pub view: view::View,
    /// The local journals of the partitions this worker owns.
    pub(crate) journals: worker::journal::Journals,
    /// Partitions whose last stable offset does not move ([`worker::stall`]).
    pub(crate) stalls: worker::stall::Stalls,
    /// State partitions found ending before this worker's local checkpoint of them, last seen
    /// (shown in `/healthz` as `logBehindCheckpoint`).
    pub(crate) behind: Mutex<std::collections::BTreeMap<i32, Value>>,
    /// Partitions whose group offsets a restore found lost and repaired from the partition's
    /// position record, last seen (shown in `/healthz` as `offsetsRepaired`).
    pub(crate) repaired: Mutex<std::collections::BTreeMap<i32, Value>>,
    /// The longest turn of the worker's loop so far (ms): past `max.poll.interval.ms`, the group
    /// would take the worker out.
    pub longest_turn_ms: std::sync::atomic::AtomicU64,
}

impl Shared {
    pub fn consumer_config(&self, group: &str) -> ClientConfig {
        self.cfg.layered(
            &[
                ("fetch.wait.max.ms", "10"),
                // The loop polls every few milliseconds; a shorter bound than librdkafka's 5
                // minutes lets the group move a dead worker's partitions sooner on brokers that
                // wait for it.
                ("max.poll.interval.ms", "60000"),
            ],
            &[
                ("group.id", group),
                ("enable.auto.commit", "false"),
                ("auto.offset.reset", "earliest"),
                ("isolation.level", "read_committed"),
            ],
        )
    }

    pub fn machine(&self, id: &str, version: &str) -> Option<Arc<Machine>> {
        self.registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id, Some(version))
    }

    pub fn machine_or_latest(&self, id: &str, version: Option<&str>) -> Option<Arc<Machine>> {
        self.registry.read().unwrap_or_else(|p| p.into_inner()).get(id, version)
    }

    pub fn machines(&self) -> Vec<Arc<Machine>> {
        self.registry.read().unwrap_or_else(|p| p.into_inner()).all()
    }

    pub fn fail(&self, why: String) {
        tracing::error!(error = %why, "kafka worker stopped");
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }
}

/// How a partition is read: what `read_committed` readers see, or every record of the log.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Isolation {
    Committed,
    /// Every record, those of aborted and open transactions too, to the log's end: for readers
    /// that tell committed records by their own means (a restore, by the committed offsets).
    Uncommitted,
}

/// Reads a partition from offset `from` (0: its beginning) to its end, calling `f(key, payload,
/// headers)`; a tombstone's payload is `None`. Gives the offset after the last one read (the end,
/// where reading on would start).
pub(crate) fn read_partition(
    shared: &Shared,
    topic: &str,
    p: i32,
    from: i64,
    isolation: Isolation,
    mut f: impl FnMut(Option<String>, Option<&[u8]>, Option<&rdkafka::message::BorrowedHeaders>),
) -> Result<i64, String> {
    let mut c = shared.consumer_config(&format!("{}.reader", shared.cfg.group));
    c.set("enable.partition.eof", "true");
    if isolation == Isolation::Uncommitted {
        c.set("isolation.level", "read_uncommitted");
    }
    let consumer: BaseConsumer<Quiet> = c
        .create_with_context(Quiet)
        .map_err(|e| format!("cannot create a reader: {e}"))?;
    let mut tpl = TopicPartitionList::new();
    // From offset 0, not the broker's "beginning": tansu has been seen to give a partition a low
    // watermark above records it still had, and a restore that trusted it read none of them (an
    // offset really gone falls back to the earliest, `auto.offset.reset`). For the same reason only
    // the high watermark says there is nothing to read.
    let start = Offset::Offset(from.max(0));
    tpl.add_partition_offset(topic, p, start).map_err(|e| e.to_string())?;
    // Nothing to read: do not wait for the end-of-partition notice.
    if let Ok((_, high)) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10)) {
        if high <= from.max(0) {
            return Ok(high.max(from));
        }
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut next = from;
    loop {
        if Instant::now() > deadline {
            return Err(format!("reading {topic} partition {p} did not reach its end in time"));
        }
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => {
                next = m.offset() + 1;
                let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
                f(key, m.payload(), m.headers());
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => {
                // Past the last record read: transaction markers, and records a reader skips.
                let position = consumer
                    .position()
                    .ok()
                    .and_then(|l| l.find_partition(topic, p).map(|e| e.offset()))
                    .and_then(|o| match o {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    });
                return Ok(position.unwrap_or(next).max(next));
            }
            Some(Err(e)) => tracing::debug!(error = %e, topic, "reader"),
            None => {}
        }
    }
}

/// The Kafka host. Cloning it is cheap; every clone talks to the same workers.
#[derive(Clone)]
pub struct KafkaHost {
    shared: Arc<Shared>,
    api: FutureProducer<Quiet>,
    admin: Arc<AdminClient<DefaultClientContext>>,
    threads: Arc<Mutex<Vec<std::thread::JoinHandle<()>>>>,
}

/// Creates the topics that are missing: `(name, partitions, compacted)`.
async fn create_topics(
    admin: &AdminClient<DefaultClientContext>,
    bootstrap: &str,
    specs: &[(String, i32, bool)],
) -> Result<(), KafkaError> {
    let new: Vec<NewTopic> = specs
        .iter()
        .map(|(t, p, compact)| {
            let nt = NewTopic::new(t, *p, TopicReplication::Fixed(1));
            if *compact {
                nt.set("cleanup.policy", "compact")
            } else {
                nt
            }
        })
        .collect();
    let created = admin
        .create_topics(
            &new,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .map_err(|e| KafkaError::Kafka(format!("cannot create topics at {bootstrap}: {e}")))?;
    for r in created {
        if let Err((t, code)) = r {
            if code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                return Err(KafkaError::Kafka(format!("cannot create topic {t}: {code}")));
            }
        }
    }
    Ok(())
}

/// The worker task lists a definition's `worker` functions use.
fn task_lists_of(m: &Machine) -> impl Iterator<Item = &str> {
    m.functions
        .iter()
        .filter(|f| matches!(f.kind, sm4c_runtime::model::FunctionKind::Worker(_)))
        .map(|f| f.operation.as_str())
}

impl KafkaHost {
    /// Connects, creates missing topics, registers `definitions` (definitions JSON), catches up
    /// with the instances and definitions already on the cluster, and joins the worker group.
    /// Function calls go to `host`. Must be called inside a tokio runtime.
    pub async fn start(
        config: KafkaConfig,
        definitions: Vec<Value>,
        host: Arc<dyn Functions>,
    ) -> Result<KafkaHost, KafkaError> {
        KafkaHost::start_with_stores(config, definitions, host, None).await
    }

    /// As [`KafkaHost::start`], keeping the state of the partitions this worker owns in `local`
    /// stores ([`sm4c_host::local`]; the `sm4c` binary uses SQLite files of `sm4c-durable`): a
    /// partition restored again (after a restart, or coming back in a rebalance) reads only what
    /// its state partition got since.
    pub async fn start_with_stores(
        config: KafkaConfig,
        definitions: Vec<Value>,
        host: Arc<dyn Functions>,
        local: Option<Arc<dyn sm4c_host::local::LocalStores>>,
    ) -> Result<KafkaHost, KafkaError> {
        let topics = Topics::new(&config.prefix, &config.events_topics);
        let admin: AdminClient<DefaultClientContext> = config
            .layered(&[], &[])
            .create()
            .map_err(|e| KafkaError::Kafka(format!("cannot create an admin client: {e}")))?;
        let n = config.partitions.max(1);
        let specs: Vec<(String, i32, bool)> = vec![
            (topics.commands.clone(), n, false),
            (topics.state.clone(), n, true),
            (topics.journal.clone(), n, false),
            (topics.definitions.clone(), 1, true),
            (topics.members.clone(), 1, true),
            (topics.out.clone(), n, false),
            (topics.deadletter.clone(), 1, false),
        ]
        .into_iter()
        .chain(topics.events.iter().map(|t| (t.clone(), n, false)))
        .collect();
        create_topics(&admin, &config.bootstrap, &specs).await?;
        // Idempotence keeps a retried command from being written twice.
        let plain: ThreadedProducer<Quiet> = config
            .layered(&[("linger.ms", "1")], &[("enable.idempotence", "true")])
            .create_with_context(Quiet)
            .map_err(|e| KafkaError::Kafka(format!("cannot create a producer: {e}")))?;
        let api: FutureProducer<Quiet> = config
            .layered(&[("linger.ms", "0")], &[("enable.idempotence", "true")])
            .create_with_context(Quiet)
            .map_err(|e| KafkaError::Kafka(format!("cannot create a producer: {e}")))?;
        // The commands topic may exist already with another partition count: use what it has.
        let partitions = {
            let topic = topics.commands.clone();
            let probe: BaseConsumer<Quiet> = config
                .layered(&[], &[])
                .create_with_context(Quiet)
                .map_err(|e| KafkaError::Kafka(format!("cannot create a client: {e}")))?;
            tokio::task::spawn_blocking(move || {
                probe
                    .fetch_metadata(Some(&topic), Duration::from_secs(30))
                    .ok()
                    .and_then(|m| m.topics().first().map(|t| t.partitions().len() as i32))
            })
            .await
            .ok()
            .flatten()
            .filter(|n| *n > 0)
            .ok_or_else(|| KafkaError::Kafka(format!("cannot read the metadata of {}", topics.commands)))?
        };
        // One clock partition per commands partition, however many that topic has.
        create_topics(&admin, &config.bootstrap, &[(topics.clock.clone(), partitions, false)]).await?;
        let driver = sm4c_host::driver::Driver {
            limits: sm4c_host::driver::Limits {
                max_journal: config.max_journal,
                ..sm4c_host::driver::Limits::default()
            },
            task_lists: host.task_lists(),
            at_most_once: host.at_most_once(),
            ..sm4c_host::driver::Driver::durable()
        };
        let static_name = config.static_name();
        let shared = Arc::new(Shared {
            driver,
            cfg: config,
            topics,
            partitions,
            registry: RwLock::new(Registry::default()),
            host,
            rt: tokio::runtime::Handle::current(),
            plain,
            stop: AtomicBool::new(false),
            owned: AtomicUsize::new(0),
            events_read: AtomicUsize::new(0),
            cached: AtomicUsize::new(0),
            failure: Mutex::new(None),
            breakpoints: sm4c_host::driver::Breakpoints::default(),
            keeper: match &local {
                Some(_) => Some(worker::keeper::Keeper::start().map_err(KafkaError::Kafka)?),
                None => None,
            },
            local,
            members: members::Members::new(
                sm4c_host::service::new_id("worker"),
                sm4c_host::clock::wall_ms(),
                static_name,
            ),
            view: view::View::default(),
            journals: Default::default(),
            stalls: Default::default(),
            behind: Default::default(),
            repaired: Default::default(),
            longest_turn_ms: Default::default(),
        });
        let mut threads = Vec::new();
        {
            let s = shared.clone();
            threads.push(std::thread::spawn(move || view::run(s)));
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while !shared.view.ready.load(Ordering::Relaxed) {
            if let Some(f) = shared.failure.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                return Err(KafkaError::Kafka(f));
            }
            if Instant::now() > deadline {
                return Err(KafkaError::Kafka(
                    "the definitions topic could not be read in time".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let me = KafkaHost {
            shared: shared.clone(),
            api,
            admin: Arc::new(admin),
            threads: Arc::new(Mutex::new(threads)),
        };
        // Task list topics of the definitions already on the cluster (new ones get theirs when
        // they are registered).
        let known = shared.machines();
        me.create_task_topics(known.iter().flat_map(|m| task_lists_of(m)))
            .await?;
        for doc in definitions {
            me.register(doc).await.map_err(|e| match e {
                HostError::Invalid(errs) => {
                    KafkaError::Definition(errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))
                }
                other => KafkaError::Definition(other.to_string()),
            })?;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let s = shared.clone();
            let m = shared.clone();
            let mut threads = me.threads.lock().unwrap_or_else(|p| p.into_inner());
            threads.push(std::thread::spawn(move || worker::run(s, rx, tx)));
            threads.push(std::thread::spawn(move || members::run(&m)));
            if shared.cfg.exactly_once {
                let g = shared.clone();
                threads.push(std::thread::spawn(move || worker::stall::run(&g)));
            }
        }
        Ok(me)
    }

    /// Topic names in use.
    pub fn topics(&self) -> &Topics {
        &self.shared.topics
    }

    /// Commands partitions this worker owns now.
    pub fn owned_partitions(&self) -> usize {
        self.shared.owned.load(Ordering::Relaxed)
    }

    /// Where this worker's HTTP API answers (`http://host:port`), for the other workers and the
    /// clients that ask who owns what: published in its membership record ([`members`]).
    pub fn advertise(&self, url: String) {
        self.shared.members.set_url(url);
    }

    /// The group's live workers as `P.members` has them, by member id, and this worker's id.
    pub fn members(&self) -> (String, std::collections::BTreeMap<String, members::Member>) {
        let m = &self.shared.members;
        (m.me.clone(), m.live(sm4c_host::clock::wall_ms()))
    }

    /// Leaves the group and stops the worker.
    pub async fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.view.stop.store(true, Ordering::Relaxed);
        let threads: Vec<_> = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }

    /// Creates the topics of these task lists, if missing.
    async fn create_task_topics<'a>(&self, lists: impl Iterator<Item = &'a str>) -> Result<(), KafkaError> {
        let n = self.shared.partitions;
        let mut specs: Vec<(String, i32, bool)> = lists.map(|l| (self.shared.topics.task_list(l), n, false)).collect();
        specs.sort();
        specs.dedup();
        if specs.is_empty() {
            return Ok(());
        }
        create_topics(&self.admin, &self.shared.cfg.bootstrap, &specs).await
    }

    async fn register(&self, doc: Value) -> Result<(Arc<Machine>, bool), HostError> {
        let options = LoadOptions {
            limits: self.shared.cfg.expression,
        };
        let m = load(&doc, &mut sm4c_runtime::no_files, options).map_err(HostError::Invalid)?;
        let refused = self.shared.host.check_definition(&m);
        if !refused.is_empty() {
            return Err(HostError::Invalid(refused));
        }
        // Its task lists' topics exist before an instance can put a task on them.
        self.create_task_topics(task_lists_of(&m))
            .await
            .map_err(|e| HostError::Unavailable(e.to_string()))?;
        if let Some(existing) = self.shared.machine(&m.id, &m.version) {
            if existing.source == m.source {
                return Ok((existing, false));
            }
            return Err(HostError::Conflict {
                id: m.id.clone(),
                version: m.version.clone(),
            });
        }
        let key = format!("{}@{}", m.id, m.version);
        let payload = serde_json::to_vec(&m.source).unwrap_or_default();
        self.api
            .send(
                FutureRecord::to(&self.shared.topics.definitions)
                    .key(&key)
                    .payload(&payload),
                API_WAIT,
            )
            .await
            .map_err(|(e, _)| HostError::Unavailable(format!("cannot write the definition to Kafka: {e}")))?;
        let m = Arc::new(m);
        self.shared
            .registry
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(m.clone());
        Ok((m, true))
    }

    async fn send_command(&self, id: &str, c: &Command) -> Result<(), HostError> {
        let payload = serde_json::to_vec(c).unwrap_or_default();
        self.api
            .send(
                FutureRecord::to(&self.shared.topics.commands)
                    .partition(partition_of(id, self.shared.partitions))
                    .key(id)
                    .payload(&payload),
                API_WAIT,
            )
            .await
            .map(|_| ())
            .map_err(|(e, _)| HostError::Unavailable(format!("cannot write to Kafka: {e}")))
    }

    /// Waits until `f` holds of the view, for up to [`API_WAIT`]: `f` is looked at again as soon as
    /// a committed transaction changed instance `id`'s record ([`view::View::watch`]), and every
    /// [`RECHECK`] besides (without an instance, every 3 ms).
    async fn wait_for(&self, what: &str, id: Option<&str>, f: impl Fn(&view::View) -> bool) -> Result<(), HostError> {
        let deadline = tokio::time::Instant::now() + API_WAIT;
        let watch = self.shared.view.watch(id.unwrap_or_default());
        let recheck = if id.is_some() {
            RECHECK
        } else {
            Duration::from_millis(3)
        };
        loop {
            let changed = watch.armed();
            if f(&self.shared.view) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                // In the log already: refusing it now would tell the client a lie.
                return Err(HostError::Appended(format!(
                    "{what} was accepted (it is in the log) but no worker has taken it into account yet; check that workers are running"
                )));
            }
            let _ = tokio::time::timeout_at(deadline.min(tokio::time::Instant::now() + recheck), changed).await;
        }
    }

    /// Whether a write about instance `id` (of partition `p`) is to be appended here without its
    /// partition: the API says its owner did not answer ([`sm4c_host::service::Write`]) and the
    /// partition is not held here.
    fn stranger(&self, w: &sm4c_host::service::Write, p: i32) -> bool {
        w.not_owner && !self.shared.view.holds(p)
    }

    /// What a write appended without its partition answers: `what` (about instance `id`, of
    /// partition `p`) is in the log, to be decided by the partition's next owner.
    fn appended(&self, what: &str, id: &str, p: i32) -> HostError {
        HostError::Appended(format!(
            "{what} is in the log (partition {p} of topic {:?}) but not decided yet: the worker that held \
             instance {id:?} did not answer, and no other has taken its partition over yet. It will be \
             decided once one has (the group rebalances within the consumers' session timeout); \
             GET /instances/{id} shows it then",
            self.shared.topics.commands
        ))
    }

    /// Instance `id`'s record, when its partition is held here (owned and restored); an error that
    /// says where it is otherwise (the API asks [`Backend::locate`] first, which waits for a
    /// partition being restored, up to [`LOCATE_WAIT`]).
    fn record(&self, id: &str) -> Result<Option<wire::InstanceRecord>, HostError> {
        let p = partition_of(id, self.shared.partitions);
        match self.shared.view.holds(p) {
            true => Ok(self.shared.view.get(p, id)),
            false => Err(HostError::Unavailable(self.elsewhere(id, p))),
        }
    }

    /// [`KafkaHost::record`] on a blocking thread: the view may read the partition's local store
    /// (SQLite), which must not hold up the tokio threads that make function calls.
    /// An instance's record ([`KafkaHost::record_off`]) and the version of its definition it runs:
    /// what a migration or a redrive checks before it is sent to the owner.
    async fn record_and_machine(&self, id: &str) -> Result<(wire::InstanceRecord, Arc<Machine>), HostError> {
        let Some(r) = self.record_off(id).await? else {
            return Err(HostError::UnknownInstance(id.to_string()));
        };
        let definition = &r.snapshot.definition;
        let Some(m) = self.shared.machine(definition, &r.snapshot.version) else {
            return Err(HostError::UnknownDefinition(format!(
                "{definition} version {}",
                r.snapshot.version
            )));
        };
        Ok((r, m))
    }

    async fn record_off(&self, id: &str) -> Result<Option<wire::InstanceRecord>, HostError> {
        let (me, id) = (self.clone(), id.to_string());
        tokio::task::spawn_blocking(move || me.record(&id))
            .await
            .map_err(|e| HostError::Unavailable(e.to_string()))?
    }

    /// Why a request about instance `id` (of partition `p`) is not answered here.
    fn elsewhere(&self, id: &str, p: i32) -> String {
        self.elsewhere_of(&format!("instance {id:?}"), p)
    }

    /// Why a request about `what` (an instance or a schedule, of partition `p`) is not answered
    /// here.
    fn elsewhere_of(&self, what: &str, p: i32) -> String {
        let m = &self.shared.members;
        match m.owner(p, sm4c_host::clock::wall_ms()) {
            Some((member, _)) if member == m.me => format!(
                "{what} is in partition {p}, which this worker is restoring; try again in a moment"
            ),
            Some((member, owner)) => format!(
                "{what} is in partition {p}, which worker {member} at {} owns; ask it (sm4c serve forwards such requests itself)",
                owner.url.as_deref().unwrap_or("an address it has not published")
            ),
            None => format!("{what} is in partition {p}, which no worker owns now; try again in a moment"),
        }
    }

    /// Appends `c` (about batch `id`) to every commands partition.
    async fn send_everywhere(&self, id: &str, c: &Command) -> Result<(), HostError> {
        let payload = serde_json::to_vec(c).unwrap_or_default();
        for p in 0..self.shared.partitions {
            self.api
                .send(
                    FutureRecord::to(&self.shared.topics.commands)
                        .partition(p)
                        .key(id)
                        .payload(&payload),
                    API_WAIT,
                )
                .await
                .map_err(|(e, _)| HostError::Unavailable(format!("cannot write to Kafka: {e}")))?;
        }
        Ok(())
    }

    /// Batch `id` as the partitions held here know it: rendered with their shares only, which
    /// may be none (`partitions` empty).
    fn batch_share(&self, id: &str) -> Value {
        let shares = self.shared.view.batch_shares().remove(id).unwrap_or_default();
        sm4c_host::batch::render(id, &shares, true).unwrap_or_else(|| json!({"id": id, "partitions": []}))
    }

    /// What a batch would act on among the instances held here, started before `now`: how many,
    /// and the first [`sm4c_host::batch::DRY_RUN_LIST`] in start order (each with its place in
    /// listings, `seq`, so that the workers' lists merge in order).
    fn dry_run(&self, spec: &sm4c_host::batch::Spec, now: i64) -> Value {
        let w = &spec.filter;
        let (mut cursor, mut count, mut listed) = (i64::MIN, 0u64, Vec::new());
        loop {
            let page = self
                .shared
                .view
                .list(w.status.as_deref(), w.definition.as_deref(), cursor, 500);
            let last = page.len() < 500;
            for s in page {
                cursor = s.seq;
                let late = s
                    .started_at
                    .as_deref()
                    .and_then(sm4c_host::batch::parse_time)
                    .is_some_and(|t| t > now);
                if late || !w.matches_summary(&s) {
                    continue;
                }
                if w.jq.is_some() {
                    let p = partition_of(&s.id, self.shared.partitions);
                    let data = self
                        .shared
                        .view
                        .get(p, &s.id)
                        .map(|r| serde_json::to_value(&r.snapshot.data).unwrap_or(Value::Null));
                    if !data.is_some_and(|d| w.matches_data(&d)) {
                        continue;
                    }
                }
                count += 1;
                if listed.len() < sm4c_host::batch::DRY_RUN_LIST {
                    listed.push(json!({"id": s.id, "definition": s.definition, "version": s.version,
                        "status": s.status, "state": s.state, "seq": s.seq}));
                }
            }
            if last {
                break;
            }
        }
        json!({"dryRun": true, "operation": spec.operation.name(), "matched": count,
               "truncated": count as usize > listed.len(), "instances": listed})
    }

    /// Appends schedule operation `op` of schedule `id` to the commands partition of the id, held
    /// here, and waits until its owner (this worker) has decided it: its answer.
    async fn schedule_write(&self, id: &str, op: wire::ScheduleCmd) -> Result<Value, HostError> {
        let p = partition_of(id, self.shared.partitions);
        if !self.shared.view.holds(p) {
            return Err(HostError::Unavailable(
                self.elsewhere_of(&format!("schedule {id:?}"), p),
            ));
        }
        let request = sm4c_host::service::new_id("schedule");
        let c = Command::Schedule {
            schedule: id.to_string(),
            op,
            request: request.clone(),
        };
        let watch = self.shared.view.watch(&request);
        self.send_command(id, &c).await?;
        let deadline = tokio::time::Instant::now() + API_WAIT;
        loop {
            let answered = watch.armed();
            if let Some(answer) = self.shared.view.take_answer(&request) {
                return answer.map_err(|r| match r {
                    view::Refusal::Invalid(fields) => HostError::InvalidSchedule(fields),
                    view::Refusal::Unknown(id) => HostError::UnknownSchedule(id),
                    view::Refusal::Exists(id) => HostError::ScheduleExists(id),
                    view::Refusal::UnknownDefinition(what) => HostError::UnknownDefinition(what),
                });
            }
            if tokio::time::Instant::now() > deadline {
                return Err(self.appended(&format!("the operation on schedule {id:?}"), id, p));
            }
            let _ = tokio::time::timeout_at(deadline.min(tokio::time::Instant::now() + RECHECK), answered).await;
        }
    }

    /// Refuses a request about schedule `id` that the partition holding it (here) does not
    /// know: 404. A partition held elsewhere is the owner's to judge.
    fn known_schedule(&self, id: &str) -> Result<(), HostError> {
        let p = partition_of(id, self.shared.partitions);
        match self.shared.view.holds(p) && self.shared.view.schedule(p, id).is_none() {
            true => Err(HostError::UnknownSchedule(id.to_string())),
            false => Ok(()),
        }
    }

    /// A schedule's specification, checked before it is appended (the owner checks it again):
    /// a bad one is a 400 naming its fields, an unknown definition a 404.
    fn checked_spec(&self, doc: &Value) -> Result<sm4c_schedule::Spec, HostError> {
        let spec = Spec::from_json(doc)
            .map_err(|errs| HostError::InvalidSchedule(errs.into_iter().map(|e| (e.pointer, e.message)).collect()))?;
        if self
            .shared
            .machine_or_latest(&spec.definition, spec.version.as_deref())
            .is_none()
        {
            return Err(HostError::UnknownDefinition(match &spec.version {
                Some(v) => format!("{} version {v}", spec.definition),
                None => spec.definition.clone(),
            }));
        }
        Ok(spec)
    }

    /// Reads a journal from the partition's local journal, once it is caught up and whole (a store
    /// whose write failed is cleared, checkpoint and all, and not written again until restored).
    fn local_journal(&self, id: &str) -> Option<Result<Vec<(i64, Entry)>, HostError>> {
        let p = partition_of(id, self.shared.partitions);
        let store = self.shared.journals.ready(p)?;
        // What the transactions the view has seen wrote is in the store.
        self.shared.keeper.as_ref()?.sync(p);
        store.checkpoint().ok().flatten()?;
        Some(worker::journal::read(store.as_ref(), id).map_err(HostError::Unavailable))
    }

    /// Reads a journal from the journal topic: entries of committed transactions only.
    fn journal(&self, id: &str) -> Result<Vec<(i64, Entry)>, HostError> {
        let p = partition_of(id, self.shared.partitions);
        let consumer: BaseConsumer<Quiet> = self
            .shared
            .consumer_config(&self.shared.cfg.group)
            .create_with_context(Quiet)
            .map_err(|e| HostError::Unavailable(e.to_string()))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.shared.topics.commands, p);
        tpl.add_partition(&self.shared.topics.clock, p);
        let offsets = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .map_err(|e| HostError::Unavailable(format!("cannot read committed offsets: {e}")))?;
        let of = |topic: &str| {
            offsets
                .find_partition(topic, p)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
                .unwrap_or(0)
        };
        let (committed, clock) = (of(&self.shared.topics.commands), of(&self.shared.topics.clock));
        let mut entries: std::collections::BTreeMap<i64, Entry> = Default::default();
        read_partition(
            &self.shared,
            &self.shared.topics.journal,
            p,
            0,
            Isolation::Committed,
            |key, payload, _| {
                if let (true, Some(payload)) = (key.as_deref() == Some(id), payload) {
                    if let Ok(r) = serde_json::from_slice::<JournalRecord>(payload) {
                        if wire::committed(r.through, r.clock, committed, clock) {
                            for (i, e) in r.entries.into_iter().enumerate() {
                                entries.insert(r.seq + i as i64, e);
                            }
                        }
                    }
                }
            },
        )
        .map_err(HostError::Unavailable)?;
        Ok(entries.into_iter().collect())
    }
}

/// Whether the instance record waits for worker task `op`.
fn task_open(r: &wire::InstanceRecord, op: &str) -> bool {
    !r.snapshot.status.is_final() && r.calls.iter().any(|(o, e)| o == op && sm4c_host::driver::is_task(e))
}

impl Backend for KafkaHost {
    /// Task lists are topics in Kafka mode: their names and topics, and how many tasks are open.
    fn task_lists(&self) -> BoxFuture<'_, Result<Vec<Value>, HostError>> {
        Box::pin(async move {
            let mut lists: std::collections::BTreeMap<String, usize> = Default::default();
            for m in self.shared.machines() {
                for l in task_lists_of(&m) {
                    lists.entry(l.to_string()).or_default();
                }
            }
            let me = self.clone();
            let open = tokio::task::spawn_blocking(move || me.shared.view.open_tasks())
                .await
                .map_err(|e| HostError::Unavailable(e.to_string()))?;
            for (list, open) in open {
                *lists.entry(list.to_string()).or_default() += open;
            }
            Ok(lists
                .into_iter()
                .map(|(name, open)| json!({"name": name, "topic": self.shared.topics.task_list(&name), "open": open}))
                .collect())
        })
    }

    fn poll(&self, name: String, _: Option<String>, _: Duration) -> BoxFuture<'_, Result<Option<Value>, HostError>> {
        let topic = self.shared.topics.task_list(&name);
        Box::pin(async move {
            Err(HostError::NotSupported(format!(
                "in Kafka mode task list {name:?} is the topic {topic:?}: consume it with a consumer group \
                 (each record is an {} CloudEvent) and answer by token here or with a CloudEvent",
                sm4c_host::tasks::EVENT_SCHEDULED
            )))
        })
    }

    /// Completions and failures wait until the owner has applied them (so a second answer is
    /// refused as for `sm4c serve`); heartbeats return at once, saying whether the task is still
    /// wanted as far as this worker's view knows.
    fn answer(
        &self,
        token: String,
        answer: sm4c_host::tasks::Answer,
    ) -> BoxFuture<'_, Result<sm4c_host::service::Answered, HostError>> {
        Box::pin(async move {
            let (instance, op) = sm4c_host::tasks::decode_token(&token).ok_or_else(|| {
                HostError::UnknownTask(format!(
                    "{token:?} is not a task token (tokens come in the tasks on the task list topics)"
                ))
            })?;
            let heartbeat = matches!(answer, sm4c_host::tasks::Answer::Heartbeat(_));
            let w = sm4c_host::service::write();
            let request = w
                .request
                .clone()
                .unwrap_or_else(|| sm4c_host::service::new_id("answer"));
            let p = partition_of(&instance, self.shared.partitions);
            if self.stranger(&w, p) {
                let c = Command::Answer {
                    id: instance.clone(),
                    op: op.clone(),
                    answer,
                    event: None,
                    request: (!heartbeat).then(|| request.clone()),
                };
                self.send_command(&instance, &c).await?;
                // A heartbeat is not decided: the task is wanted as far as this worker knows.
                return match heartbeat {
                    true => Ok(sm4c_host::service::Answered {
                        instance,
                        op,
                        cancel_requested: false,
                    }),
                    false => Err(self.appended(&format!("the answer to task {op:?}"), &instance, p)),
                };
            }
            let Some(r) = self.record(&instance)? else {
                return Err(HostError::UnknownTask(format!(
                    "no task: the token names instance {instance:?}, which does not exist"
                )));
            };
            // This request's answer, appended by a worker that did not hold the instance, was taken.
            let taken = |r: &wire::InstanceRecord| r.answered.iter().any(|(o, t)| *o == op && *t == request);
            if !heartbeat && taken(&r) {
                return Ok(sm4c_host::service::Answered {
                    instance,
                    op,
                    cancel_requested: false,
                });
            }
            if !task_open(&r, &op) {
                return if heartbeat {
                    Ok(sm4c_host::service::Answered {
                        instance,
                        op,
                        cancel_requested: true,
                    })
                } else {
                    Err(HostError::TaskClosed { instance, op })
                };
            }
            let c = Command::Answer {
                id: instance.clone(),
                op: op.clone(),
                answer,
                event: None,
                request: (!heartbeat).then(|| request.clone()),
            };
            self.send_command(&instance, &c).await?;
            if !heartbeat {
                self.wait_for("the answer", Some(&instance), |v| {
                    v.get(p, &instance).is_none_or(|r| !task_open(&r, &op))
                })
                .await?;
                // Another answer may have closed the task first: only the one applied says so.
                let mine = self.shared.view.get(p, &instance).is_some_and(|r| taken(&r));
                if !mine {
                    return Err(HostError::TaskClosed { instance, op });
                }
            }
            Ok(sm4c_host::service::Answered {
                instance,
                op,
                cancel_requested: false,
            })
        })
    }

    fn define(&self, doc: Value) -> BoxFuture<'_, Result<(Arc<Machine>, bool), HostError>> {
        Box::pin(self.register(doc))
    }

    fn machines(&self) -> Vec<Arc<Machine>> {
        self.shared.machines()
    }

    fn latest(&self, id: &str) -> Option<Arc<Machine>> {
        self.shared.machine_or_latest(id, None)
    }

    fn default_version(&self, id: &str) -> Option<String> {
        let registry = self.shared.registry.read().unwrap_or_else(|p| p.into_inner());
        registry.default_version(id).map(str::to_string)
    }

    fn set_default_version(&self, id: String, version: Option<String>) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            {
                let registry = self.shared.registry.read().unwrap_or_else(|p| p.into_inner());
                if registry.newest(&id).is_none() {
                    return Err(HostError::UnknownDefinition(id));
                }
                if let Some(v) = &version {
                    if registry.get(&id, Some(v)).is_none() {
                        return Err(HostError::UnknownDefinition(format!("{id} version {v}")));
                    }
                }
            }
            // On the definitions topic, after the versions it names, which every worker's view
            // reads from its beginning: a tombstone clears it.
            let key = format!("{}{id}", wire::DEFAULT_VERSION_PREFIX);
            let payload = serde_json::to_vec(&json!({"version": version})).unwrap_or_default();
            let record = FutureRecord::to(&self.shared.topics.definitions).key(&key);
            let record = match version {
                Some(_) => record.payload(&payload),
                None => record,
            };
            self.api
                .send(record, API_WAIT)
                .await
                .map_err(|(e, _)| HostError::Unavailable(format!("cannot write the default version to Kafka: {e}")))?;
            let shared = self.shared.clone();
            self.wait_for("the default version", None, move |_| {
                let registry = shared.registry.read().unwrap_or_else(|p| p.into_inner());
                registry.default_version(&id) == version.as_deref()
            })
            .await
        })
    }

    fn start_instance(
        &self,
        definition: String,
        version: Option<String>,
        id: Option<String>,
        input: Value,
    ) -> BoxFuture<'_, Result<(String, bool), HostError>> {
        self.start_traced(definition, version, id, input, None)
    }

    fn start_traced(
        &self,
        definition: String,
        version: Option<String>,
        id: Option<String>,
        input: Value,
        origin: Option<String>,
    ) -> BoxFuture<'_, Result<(String, bool), HostError>> {
        Box::pin(async move {
            let Some(m) = self.shared.machine_or_latest(&definition, version.as_deref()) else {
                return Err(HostError::UnknownDefinition(match version {
                    Some(v) => format!("{definition} version {v}"),
                    None => definition,
                }));
            };
            if let Some(id) = id.as_deref().filter(|id| !sm4c_host::service::valid_instance_id(id)) {
                return Err(HostError::InvalidInstanceId(id.to_string()));
            }
            let id = id.unwrap_or_else(|| sm4c_host::service::new_id(&m.id));
            let w = sm4c_host::service::write();
            let request = w.request.clone().unwrap_or_else(|| sm4c_host::service::new_id("start"));
            let p = partition_of(&id, self.shared.partitions);
            let c = Command::Start {
                id: id.clone(),
                definition: m.id.clone(),
                version: Some(m.version.clone()),
                input,
                parent: None,
                depth: 0,
                origin: None,
                request: Some(request.clone()),
                traceparent: origin,
                schedule: None,
                nominal: None,
            };
            if self.stranger(&w, p) {
                // Whether the instance exists is the next owner's to decide: a second start of
                // one is ignored.
                self.send_command(&id, &c).await?;
                return Err(self.appended(&format!("the start of instance {id:?}"), &id, p));
            }
            let t0 = Instant::now();
            // Only the request that created it says 201, wherever it was appended.
            if let Some(r) = self.record_off(&id).await? {
                return Ok((id, r.request.as_ref() == Some(&request)));
            }
            let looked = t0.elapsed();
            self.send_command(&id, &c).await?;
            let appended = t0.elapsed();
            self.wait_for("the start", Some(&id), |v| v.get(p, &id).is_some())
                .await?;
            // Another request for the same id may have won the race: only the creator says 201.
            let created = self
                .shared
                .view
                .get(p, &id)
                .is_some_and(|r| r.request.as_ref() == Some(&request));
            tracing::debug!(
                partition = p,
                looked_us = looked.as_micros() as u64,
                appended_us = appended.as_micros() as u64,
                decided_us = t0.elapsed().as_micros() as u64,
                "start answered"
            );
            Ok((id, created))
        })
    }

    fn instance(&self, id: &str) -> Result<Option<Stored>, HostError> {
        Ok(self.record(id)?.map(|r| Stored {
            snapshot: r.snapshot,
            parent: r.parent,
            journal_len: r.journal_len,
        }))
    }

    fn list(
        &self,
        status: Option<&str>,
        definition: Option<&str>,
        after: i64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Summary>, HostError>> {
        // Off the tokio threads: the view may read the local stores (SQLite).
        let (me, status, definition) = (self.clone(), status.map(str::to_string), definition.map(str::to_string));
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                me.shared
                    .view
                    .list(status.as_deref(), definition.as_deref(), after, limit)
            })
            .await
            .map_err(|e| HostError::Unavailable(e.to_string()))
        })
    }

    fn history(&self, id: &str, after: i64, limit: usize) -> BoxFuture<'_, Result<Vec<(i64, Entry)>, HostError>> {
        let id = id.to_string();
        Box::pin(async move {
            let len = self.record(&id)?.map(|r| r.journal_len).unwrap_or(0);
            let me = self.clone();
            let all = tokio::task::spawn_blocking(move || me.local_journal(&id).unwrap_or_else(|| me.journal(&id)))
                .await
                .map_err(|e| HostError::Unavailable(e.to_string()))??;
            Ok(all
                .into_iter()
                .filter(|(s, _)| *s > after && *s <= len.max(after))
                .take(limit)
                .collect())
        })
    }

    fn cancel(&self, id: String) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            let p = partition_of(&id, self.shared.partitions);
            let w = sm4c_host::service::write();
            let c = Command::Cancel {
                id: id.clone(),
                reason: "cancelled through the API".into(),
            };
            if self.stranger(&w, p) {
                self.send_command(&id, &c).await?;
                return Err(self.appended(&format!("the cancel of instance {id:?}"), &id, p));
            }
            match self.record_off(&id).await? {
                None => return Err(HostError::UnknownInstance(id)),
                // This request's cancel is in the log already: a final instance is what it asked.
                Some(r) if r.snapshot.status.is_final() && w.appended => return Ok(()),
                Some(r) if r.snapshot.status.is_final() => return Err(HostError::Ended(id)),
                Some(_) => {}
            }
            let t0 = Instant::now();
            self.send_command(&id, &c).await?;
            let appended = t0.elapsed();
            self.wait_for("the cancel", Some(&id), |v| {
                v.get(p, &id).is_some_and(|r| r.snapshot.status.is_final())
            })
            .await?;
            tracing::debug!(
                partition = p,
                appended_us = appended.as_micros() as u64,
                decided_us = t0.elapsed().as_micros() as u64,
                "cancel answered"
            );
            Ok(())
        })
    }

    fn breakpoints(&self) -> Result<Vec<(String, Vec<sm4c_runtime::Breakpoint>)>, HostError> {
        Ok(self.shared.breakpoints.all())
    }

    fn set_breakpoints(
        &self,
        definition: String,
        mut breakpoints: Vec<sm4c_runtime::Breakpoint>,
    ) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            let m = self
                .shared
                .machine_or_latest(&definition, None)
                .ok_or_else(|| HostError::UnknownDefinition(definition.clone()))?;
            for b in &breakpoints {
                b.check(&m).map_err(HostError::InvalidBreakpoint)?;
            }
            let mut seen = Vec::new();
            breakpoints.retain(|b| {
                let new = !seen.contains(b);
                seen.push(b.clone());
                new
            });
            // On the definitions topic, which every worker's view reads from its beginning: an
            // empty list is a tombstone.
            let key = format!("{}{definition}", wire::BREAKPOINTS_PREFIX);
            let payload = serde_json::to_vec(&breakpoints).unwrap_or_default();
            let record = FutureRecord::to(&self.shared.topics.definitions).key(&key);
            let record = if breakpoints.is_empty() {
                record
            } else {
                record.payload(&payload)
            };
            self.api
                .send(record, API_WAIT)
                .await
                .map_err(|(e, _)| HostError::Unavailable(format!("cannot write the breakpoints to Kafka: {e}")))?;
            let shared = self.shared.clone();
            self.wait_for("the breakpoints", None, move |_| {
                shared.breakpoints.of(&definition) == breakpoints
            })
            .await
        })
    }

    fn migrate(
        &self,
        id: String,
        version: String,
        states: std::collections::BTreeMap<String, String>,
        dry_run: bool,
    ) -> BoxFuture<'_, Result<sm4c_runtime::engine::migrate::MigrationPlan, HostError>> {
        Box::pin(async move {
            let p = partition_of(&id, self.shared.partitions);
            let (r, from) = self.record_and_machine(&id).await?;
            let definition = r.snapshot.definition.clone();
            let Some(to) = self.shared.machine(&definition, &version) else {
                return Err(HostError::UnknownDefinition(format!("{definition} version {version}")));
            };
            // Checked here against the instance as this worker holds it, so that a refusal says
            // why; the owner decides the move in its own turn, checking again.
            let inst = sm4c_runtime::Instance::from_snapshot(from, r.snapshot, sm4c_runtime::Options::default());
            let plan = inst
                .migration_plan(&to, &states, sm4c_host::clock::wall_ms())
                .map_err(HostError::NotMigratable)?;
            if dry_run {
                return Ok(plan);
            }
            self.send_command(
                &id,
                &Command::Migrate {
                    id: id.clone(),
                    version: version.clone(),
                    states,
                },
            )
            .await?;
            self.wait_for("the migration", Some(&id), |v| {
                v.get(p, &id).is_some_and(|r| r.snapshot.version == version)
            })
            .await?;
            Ok(plan)
        })
    }

    fn redrive(&self, id: String, update: Option<String>, dry_run: bool) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async move {
            let p = partition_of(&id, self.shared.partitions);
            let (r, m) = self.record_and_machine(&id).await?;
            // Checked here against the instance as this worker holds it, so that a refusal says
            // why (and a dry run previews the data); the owner redrives it in its own turn,
            // checking again and running the update again on the same data.
            let before = r.snapshot.redrive.as_ref().map_or(0, |r| r.count);
            let inst = sm4c_runtime::Instance::from_snapshot(m, r.snapshot, sm4c_runtime::Options::default());
            let plan = inst
                .redrive_plan(update.as_deref(), self.shared.cfg.max_redrives)
                .map_err(sm4c_host::service::redrive_error)?;
            let answer =
                json!({"id": id, "from": plan.from, "redrives": plan.redrives, "data": plan.data, "diff": plan.diff});
            if dry_run {
                return Ok(answer);
            }
            self.send_command(&id, &Command::Redrive { id: id.clone(), update })
                .await?;
            self.wait_for("the redrive", Some(&id), |v| {
                v.get(p, &id)
                    .is_some_and(|r| r.snapshot.redrive.as_ref().map_or(0, |r| r.count) > before)
            })
            .await?;
            Ok(answer)
        })
    }

    fn resume(&self, id: String, step: bool) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            let p = partition_of(&id, self.shared.partitions);
            let before = match self.record(&id)? {
                None => return Err(HostError::UnknownInstance(id)),
                Some(r) if r.snapshot.status != sm4c_runtime::Status::Paused => return Err(HostError::NotPaused(id)),
                Some(r) => r.journal_len,
            };
            self.send_command(&id, &Command::Resume { id: id.clone(), step })
                .await?;
            // Taken into account once the instance's journal has grown past the resume.
            self.wait_for("the resume", Some(&id), |v| {
                v.get(p, &id).is_some_and(|r| r.journal_len > before)
            })
            .await
        })
    }

    fn deliver(&self, event: Value) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async move {
            let key = sm4c_runtime::engine::event::attribute_text(&event, "sm4cinstanceid")
                .or_else(|| sm4c_runtime::engine::event::attribute_text(&event, "id"))
                .unwrap_or_default();
            let payload = serde_json::to_vec(&event).unwrap_or_default();
            let topic = &self.shared.topics.events[0];
            let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
                key: "content-type",
                value: Some("application/cloudevents+json; charset=UTF-8"),
            });
            let (partition, offset) = self
                .api
                .send(
                    FutureRecord::to(topic).key(&key).payload(&payload).headers(headers),
                    API_WAIT,
                )
                .await
                .map(|d| (d.partition, d.offset))
                .map_err(|(e, _)| HostError::Unavailable(format!("cannot write the event to Kafka: {e}")))?;
            Ok(serde_json::to_value(worker::queued(topic, partition, offset)).unwrap_or(Value::Null))
        })
    }

    fn sent(&self, after: &str, limit: usize) -> BoxFuture<'_, Result<sm4c_host::service::SentPage, HostError>> {
        let after = after.to_string();
        Box::pin(async move {
            let me = self.clone();
            tokio::task::spawn_blocking(move || me.read_sent(&after, limit))
                .await
                .map_err(|e| HostError::Unavailable(e.to_string()))?
        })
    }

    fn locate(&self, id: &str) -> BoxFuture<'_, sm4c_host::service::Whereabouts> {
        use members::Member;
        use sm4c_host::service::Whereabouts;
        let p = partition_of(id, self.shared.partitions);
        let id = id.to_string();
        Box::pin(async move {
            let deadline = Instant::now() + LOCATE_WAIT;
            let m = &self.shared.members;
            loop {
                if self.shared.view.holds(p) {
                    return Whereabouts::Here;
                }
                match m.owner(p, sm4c_host::clock::wall_ms()) {
                    Some((member, Member { url: Some(url), .. })) if member != m.me => return Whereabouts::At(url),
                    _ if Instant::now() > deadline => return Whereabouts::Unavailable(self.elsewhere(&id, p)),
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        })
    }

    /// The workers that own a partition now, by the newest claim of each: a worker that was
    /// killed is asked no more once the group has given its partitions to others.
    fn peers(&self) -> Option<Vec<String>> {
        let m = &self.shared.members;
        let now = sm4c_host::clock::wall_ms();
        let mut urls: Vec<String> = (0..self.shared.partitions)
            .filter_map(|p| m.owner(p, now))
            .filter(|(id, _)| *id != m.me)
            .filter_map(|(_, w)| w.url)
            .collect();
        urls.sort_unstable();
        urls.dedup();
        Some(urls)
    }

    /// Schedules live on the commands partition their id hashes to: a read is answered by its
    /// owner (the API forwards it there), a change is a command on that partition decided by
    /// the owner; a listing is this worker's share (the API merges every worker's).
    /// Batches run on every commands partition, each owner applying a batch to its own
    /// instances (`worker/batches.rs`): a new batch and a stop are sent to every partition; what
    /// is answered here is this worker's share (its partitions'), which the API merges with the
    /// other workers' ([`sm4c_host::batch::render`]).
    fn batches(&self, op: BatchOp) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async move {
            match op {
                BatchOp::Create(body) => {
                    let spec = sm4c_host::batch::Spec::from_json(&body, self.shared.cfg.expression)
                        .map_err(HostError::InvalidBatch)?;
                    if let Some(d) = &spec.filter.definition {
                        if self.latest(d).is_none() {
                            return Err(HostError::InvalidBatch(vec![(
                                "/where/definition".into(),
                                format!("no definition {d:?} is registered"),
                            )]));
                        }
                    }
                    let now = sm4c_host::clock::wall_ms();
                    if spec.dry_run {
                        return Ok(self.dry_run(&spec, now));
                    }
                    let id = sm4c_host::service::new_id("batch");
                    let mut request = body;
                    if let Some(o) = request.as_object_mut() {
                        o.remove("dryRun");
                    }
                    let c = Command::Batch {
                        id: id.clone(),
                        spec: request,
                        created: now,
                    };
                    self.send_everywhere(&id, &c).await?;
                    Ok(self.batch_share(&id))
                }
                BatchOp::Get(id) => Ok(self.batch_share(&id)),
                BatchOp::List => {
                    let all: Vec<Value> = self
                        .shared
                        .view
                        .batch_shares()
                        .iter()
                        .filter_map(|(id, shares)| sm4c_host::batch::render(id, shares, false))
                        .collect();
                    Ok(json!({"batches": all}))
                }
                BatchOp::Cancel(id) => {
                    self.send_everywhere(&id, &Command::BatchStop { id: id.clone() })
                        .await?;
                    Ok(self.batch_share(&id))
                }
            }
        })
    }

    fn schedules(&self, op: ScheduleOp) -> BoxFuture<'_, Result<Value, HostError>> {
        use wire::ScheduleCmd;
        Box::pin(async move {
            let now = sm4c_host::clock::wall_ms();
            match op {
                ScheduleOp::List => {
                    let all: Vec<Value> = self
                        .shared
                        .view
                        .all_schedules()
                        .iter()
                        .map(|(id, spec, state)| sm4c_schedule::view(id, spec, state, now, 1))
                        .collect();
                    Ok(json!({"schedules": all}))
                }
                ScheduleOp::Get(id) => {
                    let p = partition_of(&id, self.shared.partitions);
                    if !self.shared.view.holds(p) {
                        return Err(HostError::Unavailable(
                            self.elsewhere_of(&format!("schedule {id:?}"), p),
                        ));
                    }
                    match self.shared.view.schedule(p, &id) {
                        Some((spec, state)) => {
                            Ok(sm4c_schedule::view(&id, &spec, &state, now, sm4c_schedule::UPCOMING))
                        }
                        None => Err(HostError::UnknownSchedule(id)),
                    }
                }
                ScheduleOp::Create(doc) => {
                    let spec = self.checked_spec(&doc)?;
                    self.schedule_write(&spec.id, ScheduleCmd::Create { spec: spec.to_json() })
                        .await
                }
                ScheduleOp::Replace(id, mut doc) => {
                    // As in SQLite mode: an unknown schedule is a 404 before its specification
                    // is looked at (the owner decides again).
                    self.known_schedule(&id)?;
                    sm4c_schedule::path_id(&mut doc, &id)
                        .map_err(|why| HostError::InvalidSchedule(vec![("/id".into(), why)]))?;
                    let spec = self.checked_spec(&doc)?;
                    self.schedule_write(&id, ScheduleCmd::Replace { spec: spec.to_json() })
                        .await
                }
                ScheduleOp::Pause(id) => self.schedule_write(&id, ScheduleCmd::Pause).await,
                ScheduleOp::Resume(id) => self.schedule_write(&id, ScheduleCmd::Resume).await,
                ScheduleOp::Trigger(id) => self.schedule_write(&id, ScheduleCmd::Trigger).await,
                ScheduleOp::Delete(id) => self.schedule_write(&id, ScheduleCmd::Delete).await,
                ScheduleOp::Backfill { id, from, to } => {
                    self.known_schedule(&id)?;
                    let bad = |pointer: &str, e: String| HostError::InvalidSchedule(vec![(pointer.into(), e)]);
                    let from = sm4c_schedule::parse_time(&from).map_err(|e| bad("/from", e))?;
                    let to = sm4c_schedule::parse_time(&to).map_err(|e| bad("/to", e))?;
                    self.schedule_write(&id, ScheduleCmd::Backfill { from, to }).await
                }
            }
        })
    }

    fn health(&self) -> Value {
        let failure = self.shared.failure.lock().unwrap_or_else(|p| p.into_inner()).clone();
        json!({
            "status": if failure.is_some() { "failing" } else { "ok" },
            "mode": "kafka",
            "group": self.shared.cfg.group,
            "ownedPartitions": self.owned_partitions(),
            "eventsGroup": self.shared.cfg.events_group(),
            "eventsPartitions": self.shared.events_read.load(Ordering::Relaxed),
            "instances": self.shared.view.len(),
            "recordsInMemory": self.shared.view.in_memory(),
            "instancesInMemory": self.shared.cached.load(Ordering::Relaxed),
            "localJournals": self.shared.journals.ready_count(),
            "partitions": self.shared.partitions,
            "stalledPartitions": self.shared.stalls.list(),
            "logBehindCheckpoint": self.shared.behind.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect::<Vec<_>>(),
            "offsetsRepaired": self.shared.repaired.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect::<Vec<_>>(),
            "longestTurnMs": self.shared.longest_turn_ms.load(Ordering::Relaxed),
            "error": failure,
        })
    }

    fn members(&self) -> Result<Value, HostError> {
        let now = sm4c_host::clock::wall_ms();
        let (me, live) = self.members();
        let members: Vec<Value> = live
            .into_iter()
            .map(|(id, m)| {
                json!({
                    "member": id,
                    "url": m.url,
                    "partitions": m.partitions,
                    "startedAt": sm4c_runtime::engine::rfc3339(m.started),
                    "ageMs": (now - m.at).max(0),
                })
            })
            .collect();
        Ok(json!({"group": self.shared.cfg.group, "partitions": self.shared.partitions, "me": me, "members": members}))
    }

    fn explain(&self, event: Value) -> BoxFuture<'_, Result<Value, HostError>> {
        let target = sm4c_runtime::engine::event::attribute_text(&event, "sm4cinstanceid");
        let snaps = self.shared.view.to_explain(target.as_deref());
        let mut r = sm4c_host::explain::explain(&self.shared.machines(), snaps.iter(), &event);
        // Which partitions the event goes to, as the router would send it.
        if let Some(o) = r.as_object_mut() {
            o.insert("route".into(), worker::route_of(&self.shared, &event));
        }
        Box::pin(async move { Ok(r) })
    }
}

impl KafkaHost {
    /// Sent events on the default out topic; the cursor is `partition:offset,...`.
    fn read_sent(&self, after: &str, limit: usize) -> Result<sm4c_host::service::SentPage, HostError> {
        let topic = self.shared.topics.out.clone();
        let mut pos: Vec<i64> = vec![0; self.shared.partitions as usize];
        if !after.is_empty() {
            for part in after.split(',') {
                let (p, o) = part
                    .split_once(':')
                    .and_then(|(p, o)| Some((p.parse::<usize>().ok()?, o.parse::<i64>().ok()?)))
                    .ok_or_else(|| HostError::InvalidCursor(after.to_string()))?;
                if p >= pos.len() {
                    return Err(HostError::InvalidCursor(after.to_string()));
                }
                pos[p] = o;
            }
        }
        let mut c = self
            .shared
            .consumer_config(&format!("{}.reader", self.shared.cfg.group));
        c.set("enable.partition.eof", "true");
        let consumer: BaseConsumer<Quiet> = c
            .create_with_context(Quiet)
            .map_err(|e| HostError::Unavailable(e.to_string()))?;
        let mut tpl = TopicPartitionList::new();
        for (p, o) in pos.iter().enumerate() {
            tpl.add_partition_offset(&topic, p as i32, Offset::Offset(*o))
                .map_err(|e| HostError::Unavailable(e.to_string()))?;
        }
        consumer
            .assign(&tpl)
            .map_err(|e| HostError::Unavailable(e.to_string()))?;
        let mut done = std::collections::HashSet::new();
        let mut events = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while done.len() < pos.len() && events.len() < limit && Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    use cloudevents::binding::rdkafka::MessageExt;
                    let event = m
                        .detach()
                        .to_event()
                        .ok()
                        .and_then(|e| sm4c_host::events::event_json(&e).ok())
                        .unwrap_or(Value::Null);
                    pos[m.partition() as usize] = m.offset() + 1;
                    let instance = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
                    events.push(json!({"seq": format!("{}:{}", m.partition(), m.offset()), "instance": instance, "event": event}));
                }
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                    done.insert(p);
                }
                Some(Err(_)) | None => {}
            }
        }
        let next = pos
            .iter()
            .enumerate()
            .map(|(p, o)| format!("{p}:{o}"))
            .collect::<Vec<_>>()
            .join(",");
        Ok((events, Some(next)))
    }
}

#[cfg(test)]
mod tests {
    use super::KafkaConfig;

    #[test]
    fn user_settings_change_sm4c_defaults_but_not_what_its_guarantees_rest_on() {
        let mut cfg = KafkaConfig::new("b:9092");
        cfg.settings = vec![
            ("linger.ms".into(), "7".into()),
            ("enable.auto.commit".into(), "true".into()),
            ("security.protocol".into(), "SASL_SSL".into()),
        ];
        let c = cfg.layered(&[("linger.ms", "1")], &[("enable.auto.commit", "false")]);
        assert_eq!(c.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(c.get("linger.ms"), Some("7"));
        assert_eq!(c.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
    }
}
