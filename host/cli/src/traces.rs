//! OpenTelemetry traces of `sm4c serve`, exported over OTLP (HTTP/protobuf) when configured.
//!
//! Every step of an instance (one input through the engine) is a span. A step does not nest under
//! what started the instance: an instance that waits three days would make a three-day span. Each
//! step's span is a root span in the trace of the instance's origin (the W3C `traceparent` of the
//! request or event that started it) with a link to the origin's span; the span of a step that
//! took a CloudEvent links to the event's `traceparent` too. An instance started without one gets
//! a trace id of its own, derived from its id, so its steps still share a trace. The step's span
//! context goes out as `traceparent` on the REST and gRPC calls it makes and the events it sends.
//!
//! Off unless `--otlp-endpoint` or one of `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is given; `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` turn it off again. The other `OTEL_*` variables of the SDK and the
//! exporter (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_BSP_*`, `OTEL_TRACES_SAMPLER`) apply as documented.

use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, TraceFlags, TraceId, TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use sm4c_host::metrics::{Observer, StepSpan};
use sm4c_runtime::Status;
use std::time::SystemTime;

/// The exporting tracer; [`Traces::shutdown`] sends what is left when the server stops.
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

/// Whether a variable is set to something.
fn set(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| !v.trim().is_empty())
}

impl Traces {
    /// The tracer `--otlp-endpoint` or the `OTEL_*` variables ask for; `None` when traces are off.
    pub fn configure(endpoint: Option<&str>) -> anyhow::Result<Option<Traces>> {
        let env = |v: &str| std::env::var(v).unwrap_or_default().trim().to_ascii_lowercase();
        if env("OTEL_SDK_DISABLED") == "true" || env("OTEL_TRACES_EXPORTER") == "none" {
            return Ok(None);
        }
        if endpoint.is_none() && !set("OTEL_EXPORTER_OTLP_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            return Ok(None);
        }
        let protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .unwrap_or_default();
        if !matches!(protocol.trim(), "" | "http/protobuf") {
            tracing::warn!(protocol = %protocol, "sm4c exports OTLP over HTTP/protobuf only; using it");
        }
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            // The blocking client: the batch processor exports from a thread of its own.
            .with_http_client(
                reqwest::blocking::Client::builder()
                    .build()
                    .map_err(|e| anyhow::anyhow!("OTLP exporter: {e}"))?,
            );
        if let Some(e) = endpoint {
            exporter = exporter.with_endpoint(traces_url(e));
        }
        let exporter = exporter.build().map_err(|e| anyhow::anyhow!("OTLP exporter: {e}"))?;
        let mut resource = opentelemetry_sdk::Resource::builder();
        if !set("OTEL_SERVICE_NAME") {
            resource = resource.with_service_name("sm4c");
        }
        let provider = SdkTracerProvider::builder()
            .with_resource(resource.build())
            .with_batch_exporter(exporter)
            .build();
        let tracer = provider.tracer("sm4c");
        Ok(Some(Traces { provider, tracer }))
    }

    /// Sends the spans not yet exported and stops the exporter.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "OTLP exporter: the last spans may be lost");
        }
    }

    /// Makes the span of one step; the answer is its `traceparent`.
    fn span(&self, begun: SystemTime, step: &StepSpan<'_>) -> String {
        let origin = step.origin.and_then(parse);
        let mut links = Vec::new();
        if let Some(o) = &origin {
            links.push(Link::with_context(o.clone()));
        }
        if let Some(e) = step.event.and_then(parse) {
            if origin.as_ref().is_none_or(|o| o.span_id() != e.span_id()) {
                links.push(Link::with_context(e));
            }
        }
        let trace_id = match &origin {
            Some(o) => o.trace_id(),
            None => instance_trace(step.instance),
        };
        let mut attributes = vec![
            KeyValue::new("sm4c.instance.id", step.instance.to_string()),
            KeyValue::new("sm4c.definition", step.definition.to_string()),
            KeyValue::new("sm4c.input", step.input),
            KeyValue::new("sm4c.status", step.status.as_str()),
            KeyValue::new("sm4c.transitions", step.transitions as i64),
        ];
        if let Some(s) = step.state {
            attributes.push(KeyValue::new("sm4c.state", s.to_string()));
        }
        let mut span = self
            .tracer
            .span_builder(format!("sm4c step {}", step.definition))
            .with_kind(SpanKind::Internal)
            .with_trace_id(trace_id)
            .with_start_time(begun)
            .with_links(links)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &Context::new());
        if matches!(step.status, Status::Failed | Status::TimedOut) {
            span.set_status(opentelemetry::trace::Status::error(step.status.as_str()));
        }
        let sc = span.span_context().clone();
        span.end_with_timestamp(SystemTime::now());
        format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8())
    }
}

/// The OTLP/HTTP traces URL of `--otlp-endpoint`: a base URL (a collector's `http://host:4318`)
/// gets the signal path `/v1/traces`, as `OTEL_EXPORTER_OTLP_ENDPOINT` does; a URL with a path is
/// used as it is.
fn traces_url(endpoint: &str) -> String {
    let e = endpoint.trim();
    let rest = e.split_once("://").map_or(e, |(_, r)| r);
    match rest.find('/') {
        Some(i) if rest[i..] != *"/" => e.to_string(),
        _ => format!("{}/v1/traces", e.trim_end_matches('/')),
    }
}

/// A W3C `traceparent` (version 00) as a remote span context.
fn parse(tp: &str) -> Option<SpanContext> {
    let mut parts = tp.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let trace = TraceId::from_hex(trace).ok()?;
    let span = SpanId::from_hex(span).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
    let sc = SpanContext::new(trace, span, flags, true, TraceState::default());
    sc.is_valid().then_some(sc)
}

/// The trace of an instance that started without a trace context: derived from its id, so every
/// step of it (across restarts, on any worker) lands in the same trace.
fn instance_trace(instance: &str) -> TraceId {
    use std::hash::{Hash, Hasher};
    let half = |seed: u64| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        seed.hash(&mut h);
        instance.hash(&mut h);
        h.finish()
    };
    let id = ((half(0x736d_3463) as u128) << 64) | half(0x7472_6163) as u128;
    TraceId::from(id.max(1))
}

/// The observer `sm4c serve` installs: the metrics, and the traces when they are on.
pub struct Observed {
    pub metrics: Box<dyn Observer>,
    pub traces: Option<std::sync::Arc<Traces>>,
}

impl Observer for Observed {
    fn instance_started(&self, definition: &str) {
        self.metrics.instance_started(definition)
    }
    fn instance_ended(&self, definition: &str, status: Status) {
        self.metrics.instance_ended(definition, status)
    }
    fn transitions(&self, definition: &str, count: u64) {
        self.metrics.transitions(definition, count)
    }
    fn action_ended(&self, action: &str, outcome: &str, seconds: f64) {
        self.metrics.action_ended(action, outcome, seconds)
    }
    fn store_commit(&self, seconds: f64, inputs: usize) {
        self.metrics.store_commit(seconds, inputs)
    }
    fn kafka_transaction(&self, seconds: f64, committed: bool) {
        self.metrics.kafka_transaction(seconds, committed)
    }
    fn task_started(&self, task_list: &str, seconds: f64) {
        self.metrics.task_started(task_list, seconds)
    }
    fn task_closed(&self, task_list: &str, outcome: &str, seconds: f64) {
        self.metrics.task_closed(task_list, outcome, seconds)
    }
    fn kafka_restore(&self, partition: i32, seconds: f64) {
        self.metrics.kafka_restore(partition, seconds)
    }
    fn kafka_parked(&self, partition: i32, count: usize) {
        self.metrics.kafka_parked(partition, count)
    }
    fn kafka_dead_letter(&self, code: &str) {
        self.metrics.kafka_dead_letter(code)
    }
    fn corrupt_record(&self, record: &str) {
        self.metrics.corrupt_record(record)
    }
    fn event_refused(&self, code: &str) {
        self.metrics.event_refused(code)
    }
    fn kafka_lag(&self, topic: &str, partition: i32, lag: i64) {
        self.metrics.kafka_lag(topic, partition, lag)
    }
    fn kafka_stalled(&self, topic: &str, partition: i32, seconds: f64) {
        self.metrics.kafka_stalled(topic, partition, seconds)
    }
    fn kafka_stall_repair(&self, topic: &str, partition: i32) {
        self.metrics.kafka_stall_repair(topic, partition)
    }
    fn kafka_panic(&self, where_: &str) {
        self.metrics.kafka_panic(where_)
    }
    fn kafka_log_behind_checkpoint(&self, topic: &str, partition: i32) {
        self.metrics.kafka_log_behind_checkpoint(topic, partition)
    }
    fn kafka_offsets_repaired(&self, topic: &str, partition: i32) {
        self.metrics.kafka_offsets_repaired(topic, partition)
    }
    fn schedule_run(&self, late_seconds: f64) {
        self.metrics.schedule_run(late_seconds)
    }
    fn schedule_skipped(&self, why: &str, n: u64) {
        self.metrics.schedule_skipped(why, n)
    }
    // Every step is reported (not only when tracing): the web inspector hears of changes from it.
    fn step_begin(&self) -> Option<SystemTime> {
        Some(SystemTime::now())
    }
    fn step_traced(&self, begun: SystemTime, step: &StepSpan<'_>) -> Option<String> {
        sm4c_api::ui::changed(step);
        Some(self.traces.as_ref()?.span(begun, step))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_parse_and_urls_resolve() {
        let sc = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(sc.is_sampled() && sc.is_remote());
        assert!(parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
        assert!(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").is_none());
        assert!(parse("garbage").is_none());
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/custom/path"), "http://c:4318/custom/path");
        assert_eq!(instance_trace("a"), instance_trace("a"));
        assert_ne!(instance_trace("a"), instance_trace("b"));
    }
}
