//! `GET /metrics`: Prometheus metrics of `sm4c serve`, kept with the `prometheus-client` crate.
//!
//! [`Metrics`] holds the registry and its families. It is fed by the driver through the core's
//! [`Observer`] hook (instances started and ended, transitions, store commits, Kafka transactions) and by [`Metered`], which wraps the
//! host's [`Functions`] to time every function call. [`route`] answers the registry in the text
//! format (OpenMetrics 1.0, which Prometheus scrapes). Label values are definition ids, function
//! names, function types, statuses and error types: never instance ids or data. The names are
//! documented in `docs/src/metrics.md`.

use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use serde_json::Value;
use sm4c_host::metrics::Observer;
use sm4c_host::{BoxFuture, FunctionCall, Functions};
use sm4c_runtime::{ErrorInfo, ErrorKind, Machine, Status};
use std::sync::Arc;
use std::time::Instant;

/// The content type of the answer to `GET /metrics`.
pub const CONTENT_TYPE_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of instance counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DefinitionLabels {
    definition: String,
}

/// Labels of ended instances.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndedLabels {
    definition: String,
    status: String,
}

/// Labels of function calls.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    function: String,
    r#type: String,
    outcome: String,
}

/// Labels of tasks taken.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskListLabels {
    task_list: String,
}

/// Labels of tasks answered.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskOutcomeLabels {
    task_list: String,
    outcome: String,
}

/// Labels of a commands partition.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    partition: String,
}

/// Labels of a topic partition.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicPartitionLabels {
    topic: String,
    partition: String,
}

/// Labels of unreadable stored records.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RecordLabels {
    record: String,
}

/// Labels of dead letters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: String,
}

/// Labels of panics: where in the worker.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WhereLabels {
    stage: String,
}

/// Labels of skipped schedule times: why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WhyLabels {
    why: String,
}

/// Labels of ended actions.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: String,
    outcome: String,
}

fn action_histogram() -> Histogram {
    // 1 ms to about 18 h (a `delay` or a call may wait long); 0 for actions that end at once.
    Histogram::new(exponential_buckets(0.001, 4.0, 14))
}

/// Labels of Kafka transactions.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

fn commit_histogram() -> Histogram {
    // 0.5 ms to about 4 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn call_histogram() -> Histogram {
    // 1 ms to about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The registry of `sm4c serve` and its families.
pub struct Metrics {
    registry: Registry,
    started: Family<DefinitionLabels, Counter>,
    ended: Family<EndedLabels, Counter>,
    transitions: Family<DefinitionLabels, Counter>,
    actions: Histograms<ActionLabels>,
    calls: Histograms<CallLabels>,
    commits: Histogram,
    batches: Histogram,
    transactions: Histograms<OutcomeLabels>,
    restores: Histogram,
    task_starts: Histograms<TaskListLabels>,
    task_closes: Histograms<TaskOutcomeLabels>,
    parked: Family<PartitionLabels, Gauge>,
    dead_letters: Family<CodeLabels, Counter>,
    refused: Family<CodeLabels, Counter>,
    corrupt: Family<RecordLabels, Counter>,
    lag: Family<TopicPartitionLabels, Gauge>,
    stalled: Family<TopicPartitionLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    stall_repairs: Family<TopicPartitionLabels, Counter>,
    behind_checkpoint: Family<TopicPartitionLabels, Counter>,
    offsets_repaired: Family<TopicPartitionLabels, Counter>,
    panics: Family<WhereLabels, Counter>,
    schedule_runs: Histogram,
    schedule_skipped: Family<WhyLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// An empty registry with every family registered.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("sm4c");
        let started = Family::<DefinitionLabels, Counter>::default();
        let ended = Family::<EndedLabels, Counter>::default();
        let transitions = Family::<DefinitionLabels, Counter>::default();
        let calls: Histograms<CallLabels> = Family::new_with_constructor(call_histogram);
        registry.register("instances_started", "Instances started, by definition", started.clone());
        registry.register(
            "instances_ended",
            "Instances that ended, by definition and final status (completed, failed, cancelled, timedOut)",
            ended.clone(),
        );
        registry.register("transitions", "Transitions fired, by definition", transitions.clone());
        let actions: Histograms<ActionLabels> = Family::new_with_constructor(action_histogram);
        registry.register_with_unit(
            "action_duration",
            "SM4C actions from start to end, by action type and outcome (completed or failed); 0 for an action that ends in the step that started it",
            Unit::Seconds,
            actions.clone(),
        );
        registry.register_with_unit(
            "function_call_duration",
            "Function calls from start to result, by function, function type and outcome (ok or the error type)",
            Unit::Seconds,
            calls.clone(),
        );
        let commits = commit_histogram();
        // 1 to 1024 inputs (a batch holds 512 at most by default).
        let batches = Histogram::new(exponential_buckets(1.0, 2.0, 11));
        registry.register_with_unit(
            "store_commit_duration",
            "Store transactions (SQLite mode: one group commit per batch of inputs), from begin to durable",
            Unit::Seconds,
            commits.clone(),
        );
        registry.register(
            "store_commit_batch_size",
            "Inputs committed per store transaction (SQLite mode)",
            batches.clone(),
        );
        let transactions: Histograms<OutcomeLabels> = Family::new_with_constructor(commit_histogram);
        registry.register_with_unit(
            "kafka_transaction_duration",
            "Kafka mode: transactions from begin to commit, by outcome (committed or aborted)",
            Unit::Seconds,
            transactions.clone(),
        );
        let task_starts: Histograms<TaskListLabels> = Family::new_with_constructor(call_histogram);
        registry.register_with_unit(
            "task_schedule_to_start",
            "Worker tasks (SQLite mode): from scheduled to taken by a worker, by task list",
            Unit::Seconds,
            task_starts.clone(),
        );
        let task_closes: Histograms<TaskOutcomeLabels> = Family::new_with_constructor(call_histogram);
        registry.register_with_unit(
            "task_start_to_close",
            "Worker tasks (SQLite mode): from taken to answered, by task list and outcome (completed or failed)",
            Unit::Seconds,
            task_closes.clone(),
        );
        // 1 ms to about 130 s.
        let restores = Histogram::new(exponential_buckets(0.001, 2.0, 18));
        registry.register_with_unit(
            "kafka_restore_duration",
            "Kafka mode: restores of a commands partition this worker took over (fencing, offsets, state)",
            Unit::Seconds,
            restores.clone(),
        );
        let parked = Family::<PartitionLabels, Gauge>::default();
        registry.register(
            "kafka_parked_events",
            "Kafka mode: events parked for an instance that may wait for them, by commands partition this worker owns",
            parked.clone(),
        );
        let dead_letters = Family::<CodeLabels, Counter>::default();
        registry.register(
            "kafka_dead_letters",
            "Kafka mode: events this worker put on the dead-letter topic, by reason code",
            dead_letters.clone(),
        );
        let refused = Family::<CodeLabels, Counter>::default();
        registry.register(
            "events_refused",
            "Events the server refused to keep, by reason code (parkedLimit: the parked events are at a limit)",
            refused.clone(),
        );
        let corrupt = Family::<RecordLabels, Counter>::default();
        registry.register(
            "corrupt_records",
            "Stored records that could not be read back (each failed its instance with corruptRecord), by kind of record",
            corrupt.clone(),
        );
        let lag = Family::<TopicPartitionLabels, Gauge>::default();
        registry.register(
            "kafka_consumer_lag",
            "Kafka mode: records not read yet, by topic and partition this worker consumes",
            lag.clone(),
        );
        let stalled = Family::<TopicPartitionLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "kafka_partition_stalled_seconds",
            "Kafka mode: how long a partition's last stable offset has not moved while records lie past it (read_committed readers stop there), by topic and partition this worker looks after; 0 once it moves",
            stalled.clone(),
        );
        let stall_repairs = Family::<TopicPartitionLabels, Counter>::default();
        registry.register(
            "kafka_stall_repairs",
            "Kafka mode: transactions this worker ended on a stalled partition to finalize what the broker left prepared there",
            stall_repairs.clone(),
        );
        let behind_checkpoint = Family::<TopicPartitionLabels, Counter>::default();
        registry.register(
            "kafka_log_behind_checkpoint",
            "Kafka mode: restores that found a partition ending before this worker's local checkpoint of it (the broker lost records it had acknowledged, or the topic was made again); the local store is rebuilt from what the broker holds",
            behind_checkpoint.clone(),
        );
        let offsets_repaired = Family::<TopicPartitionLabels, Counter>::default();
        registry.register(
            "kafka_offsets_repaired",
            "Kafka mode: restores that found the group's committed offsets of a commands partition behind its state (expired after offsets.retention.minutes, or reset) and repaired them from the partition's last committed position",
            offsets_repaired.clone(),
        );
        let panics = Family::<WhereLabels, Counter>::default();
        registry.register(
            "kafka_panics",
            "Kafka mode: batches whose thread panicked (a bug: please report it), by stage (decide, route); their inputs are read again",
            panics.clone(),
        );
        // 1 ms to about 65 s late; a catch-up after a long stop is in the last bucket.
        let schedule_runs = Histogram::new(exponential_buckets(0.001, 2.0, 17));
        registry.register(
            "schedule_run_lateness_seconds",
            "Runs a schedule started, by how late after their nominal time (the count is the number of runs)",
            schedule_runs.clone(),
        );
        let schedule_skipped = Family::<WhyLabels, Counter>::default();
        registry.register(
            "schedule_skipped",
            "Nominal times schedules did not run, by why (overlap: the previous run still ran; catchup: missed for longer than the catch-up window; paused)",
            schedule_skipped.clone(),
        );
        Metrics {
            registry,
            started,
            ended,
            transitions,
            actions,
            calls,
            commits,
            batches,
            transactions,
            restores,
            task_starts,
            task_closes,
            parked,
            dead_letters,
            refused,
            corrupt,
            lag,
            stalled,
            stall_repairs,
            behind_checkpoint,
            offsets_repaired,
            panics,
            schedule_runs,
            schedule_skipped,
        }
    }

    /// The registry in the text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Records one function call.
    pub fn function_call(&self, function: &str, function_type: &str, outcome: &str, seconds: f64) {
        let labels = CallLabels {
            function: function.to_string(),
            r#type: function_type.to_string(),
            outcome: outcome.to_string(),
        };
        self.calls.get_or_create(&labels).observe(seconds);
    }
}

/// `Arc<Metrics>` as the driver's observer (install it with [`sm4c_host::metrics::observe`]).
pub struct Observed(pub Arc<Metrics>);

impl Observer for Observed {
    fn instance_started(&self, definition: &str) {
        let labels = DefinitionLabels {
            definition: definition.to_string(),
        };
        self.0.started.get_or_create(&labels).inc();
    }

    fn instance_ended(&self, definition: &str, status: Status) {
        let labels = EndedLabels {
            definition: definition.to_string(),
            status: status.as_str().to_string(),
        };
        self.0.ended.get_or_create(&labels).inc();
    }

    fn transitions(&self, definition: &str, count: u64) {
        let labels = DefinitionLabels {
            definition: definition.to_string(),
        };
        self.0.transitions.get_or_create(&labels).inc_by(count);
    }

    fn action_ended(&self, action: &str, outcome: &str, seconds: f64) {
        let labels = ActionLabels {
            action: action.to_string(),
            outcome: outcome.to_string(),
        };
        self.0.actions.get_or_create(&labels).observe(seconds);
    }

    fn store_commit(&self, seconds: f64, inputs: usize) {
        self.0.commits.observe(seconds);
        self.0.batches.observe(inputs as f64);
    }

    fn kafka_transaction(&self, seconds: f64, committed: bool) {
        let outcome = if committed { "committed" } else { "aborted" };
        let labels = OutcomeLabels {
            outcome: outcome.to_string(),
        };
        self.0.transactions.get_or_create(&labels).observe(seconds);
    }

    fn task_started(&self, task_list: &str, seconds: f64) {
        let labels = TaskListLabels {
            task_list: task_list.to_string(),
        };
        self.0.task_starts.get_or_create(&labels).observe(seconds);
    }

    fn task_closed(&self, task_list: &str, outcome: &str, seconds: f64) {
        let labels = TaskOutcomeLabels {
            task_list: task_list.to_string(),
            outcome: outcome.to_string(),
        };
        self.0.task_closes.get_or_create(&labels).observe(seconds);
    }

    fn kafka_restore(&self, _partition: i32, seconds: f64) {
        self.0.restores.observe(seconds);
    }

    fn kafka_parked(&self, partition: i32, count: usize) {
        let labels = PartitionLabels {
            partition: partition.to_string(),
        };
        self.0.parked.get_or_create(&labels).set(count as i64);
    }

    fn kafka_dead_letter(&self, code: &str) {
        let labels = CodeLabels { code: code.to_string() };
        self.0.dead_letters.get_or_create(&labels).inc();
    }

    fn event_refused(&self, code: &str) {
        let labels = CodeLabels { code: code.to_string() };
        self.0.refused.get_or_create(&labels).inc();
    }

    fn schedule_run(&self, late: f64) {
        self.0.schedule_runs.observe(late);
    }

    fn schedule_skipped(&self, why: &str, n: u64) {
        let labels = WhyLabels { why: why.to_string() };
        self.0.schedule_skipped.get_or_create(&labels).inc_by(n);
    }

    fn corrupt_record(&self, record: &str) {
        let labels = RecordLabels {
            record: record.to_string(),
        };
        self.0.corrupt.get_or_create(&labels).inc();
    }

    fn kafka_lag(&self, topic: &str, partition: i32, lag: i64) {
        let labels = TopicPartitionLabels {
            topic: topic.to_string(),
            partition: partition.to_string(),
        };
        self.0.lag.get_or_create(&labels).set(lag);
    }

    fn kafka_stalled(&self, topic: &str, partition: i32, seconds: f64) {
        let labels = TopicPartitionLabels {
            topic: topic.to_string(),
            partition: partition.to_string(),
        };
        self.0.stalled.get_or_create(&labels).set(seconds);
    }

    fn kafka_panic(&self, where_: &str) {
        let labels = WhereLabels {
            stage: where_.to_string(),
        };
        self.0.panics.get_or_create(&labels).inc();
    }

    fn kafka_stall_repair(&self, topic: &str, partition: i32) {
        let labels = TopicPartitionLabels {
            topic: topic.to_string(),
            partition: partition.to_string(),
        };
        self.0.stall_repairs.get_or_create(&labels).inc();
    }

    fn kafka_log_behind_checkpoint(&self, topic: &str, partition: i32) {
        let labels = TopicPartitionLabels {
            topic: topic.to_string(),
            partition: partition.to_string(),
        };
        self.0.behind_checkpoint.get_or_create(&labels).inc();
    }

    fn kafka_offsets_repaired(&self, topic: &str, partition: i32) {
        let labels = TopicPartitionLabels {
            topic: topic.to_string(),
            partition: partition.to_string(),
        };
        self.0.offsets_repaired.get_or_create(&labels).inc();
    }
}

/// The outcome label of a call's result: `ok`, the error type when it is one of the runtime's, else
/// `error` (an application's own error type could be anything).
fn outcome(result: &Result<Value, ErrorInfo>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) if !matches!(e.kind, ErrorKind::Other(_)) => e.kind.as_str().to_string(),
        Err(_) => "error".into(),
    }
}

/// The host's functions, each call timed into [`Metrics`].
pub struct Metered {
    /// The functions that answer.
    pub inner: Arc<dyn Functions>,
    /// Where calls are recorded.
    pub metrics: Arc<Metrics>,
}

impl Functions for Metered {
    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
        let function = call.function.clone();
        let function_type = call.function_type.clone();
        let metrics = self.metrics.clone();
        let call = self.inner.invoke(call);
        Box::pin(async move {
            let start = Instant::now();
            let result = call.await;
            let seconds = start.elapsed().as_secs_f64();
            metrics.function_call(&function, &function_type, &outcome(&result), seconds);
            result
        })
    }

    fn send_event(&self, event: Value) -> BoxFuture<'static, Result<(), ErrorInfo>> {
        self.inner.send_event(event)
    }

    fn subflow(&self, id: &str) -> Option<Arc<Machine>> {
        self.inner.subflow(id)
    }

    fn task_lists(&self) -> Option<Arc<sm4c_host::driver::TaskListBindings>> {
        self.inner.task_lists()
    }

    fn at_most_once(&self) -> Option<Arc<sm4c_host::driver::AtMostOnceResources>> {
        self.inner.at_most_once()
    }

    fn check_definition(&self, m: &Machine) -> Vec<sm4c_runtime::ValidationError> {
        self.inner.check_definition(m)
    }
}

/// `GET /metrics`, answering `metrics` (merge it into the API's router, inside the auth layer: it
/// needs the `read` role when authentication is on).
pub fn route(metrics: Arc<Metrics>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move { ([(CONTENT_TYPE, CONTENT_TYPE_TEXT)], metrics.encode()) }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_named_and_labelled_as_documented() {
        let m = Arc::new(Metrics::new());
        let o = Observed(m.clone());
        o.instance_started("order");
        o.transitions("order", 3);
        o.instance_ended("order", Status::TimedOut);
        m.function_call("charge", "rest", "ok", 0.003);
        o.store_commit(0.002, 3);
        o.kafka_transaction(0.01, false);
        let text = m.encode();
        assert!(text.contains("# TYPE sm4c_instances_started counter"), "{text}");
        assert!(
            text.contains("sm4c_instances_started_total{definition=\"order\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("sm4c_transitions_total{definition=\"order\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("sm4c_instances_ended_total{definition=\"order\",status=\"timedOut\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE sm4c_function_call_duration_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains(
                "sm4c_function_call_duration_seconds_count{function=\"charge\",type=\"rest\",outcome=\"ok\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("sm4c_store_commit_duration_seconds_count 1"), "{text}");
        assert!(text.contains("sm4c_store_commit_batch_size_sum 3.0"), "{text}");
        assert!(
            text.contains("sm4c_kafka_transaction_duration_seconds_count{outcome=\"aborted\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn outcome_names_runtime_error_types_only() {
        assert_eq!(outcome(&Ok(Value::Null)), "ok");
        let e = ErrorInfo::new(ErrorKind::Timeout, "slow");
        assert_eq!(outcome(&Err(e)), "timeout");
        let e = ErrorInfo::new(ErrorKind::Other("customer 42 unknown".into()), "x");
        assert_eq!(outcome(&Err(e)), "error");
    }
}
