//! The worker loop: consumes the commands and events topics as a member of two consumer groups
//! (see [`consumers`]),
//! owns the instances of its assigned commands partitions, and decides for them one batch at a
//! time, each batch in one Kafka transaction with its input offsets.

use super::wire::Quiet;
use super::wire::{corr_key, partition_of, start_id, Command, InstanceRecord, Origin, Outcome};
use super::{Delivery, Shared};
mod batches;
mod consumers;
mod decision;
#[cfg(test)]
mod golden;
mod index;
pub(crate) mod journal;
pub(crate) mod keeper;
mod restore;
mod route;
mod schedules;
#[cfg(test)]
mod sim;
pub(crate) mod stall;
use consumers::{offsets_reader_config, Consumers};
use decision::tally_expiry;
use index::{CorrIndex, Parking};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use restore::{restore, Restored};
use route::{committed_of, note_committed, note_uncertain, put_barrier, route_events, Outstanding, Routing};
pub(crate) use route::{queued, route_of};
use serde_json::Value;
use sm4c_host::driver::{self, ChildStart, Hosted, Work};
use sm4c_host::local::{Checkpoint, LocalStore};
use sm4c_runtime::engine::event::attribute_text;
use sm4c_runtime::{ErrorInfo, Machine};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// How long taking over a partition may wait on the broker (fencing the previous owner, reading
/// committed offsets), and how long a rewind may; like [`COMMIT_TIMEOUT`], under half the
/// consumer's `max.poll.interval.ms`, so an outage fails the step instead of the group membership.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(20);
const REWIND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after a failed restore it is tried again.
const RESTORE_RETRY: Duration = Duration::from_secs(1);

/// A commands partition being restored.
enum Restoring {
    /// The restore's thread, and what tells it the partition was revoked meanwhile.
    Running(std::thread::JoinHandle<Restored>, Arc<AtomicBool>),
    /// The last restore failed then.
    Failed(Instant),
}

/// How long a batch's transaction may take from its first call to its commit; aborting it has
/// [`ABORT_TIMEOUT`] more. Together they stay under half the consumer's `max.poll.interval.ms`
/// (60 s unless configured), so a worker held up by an unreachable broker is not taken out of its
/// group for it: the batch fails, its partition is restored, and its inputs are read again.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a proposed timer command has to be applied before it is proposed again (ms).
const TIMER_RETRY_MS: i64 = 5_000;
/// A turn of the worker's loop longer than this is logged as a warning, with where the time went.
const SLOW_TURN: Duration = Duration::from_secs(2);
const ABORT_TIMEOUT: Duration = Duration::from_secs(8);

/// When a producer settles after its last transaction that wrote records (see [`Settle`]): this
/// long after it, then this long after it again, and so on, while it writes nothing else.
const SETTLE_AFTER: [Duration; 4] = [
    Duration::from_millis(500),
    Duration::from_secs(2),
    Duration::from_secs(8),
    Duration::from_secs(30),
];
/// An owner, whose settling writes no record, goes on settling this often after the last step of
/// [`SETTLE_AFTER`], until [`SETTLE_FOR`] after its last transaction that wrote records.
const SETTLE_EVERY: Duration = Duration::from_secs(15);
const SETTLE_FOR: Duration = Duration::from_secs(600);

/// A transactional producer's settling: once it has been quiet a moment after a transaction that
/// wrote records, it ends one more transaction that changes nothing, a few times with a growing
/// wait ([`SETTLE_AFTER`]): an owner commits its partition's clock offset again (and goes on doing
/// so every [`SETTLE_EVERY`] for [`SETTLE_FOR`]); a router, which has no offset of its own to
/// commit, ticks the commands partition it last wrote to.
///
/// Why: a broker may finalize a committed transaction that overlapped others late. tansu (the
/// test broker) marks such a transaction prepared and finalizes it only when a later transaction
/// that overlaps it ends while every transaction it overlaps is prepared; the check is not
/// transitive, so when T1 overlaps T2 on one partition and T2 overlaps T3 on another, T3's end can
/// finalize T2 and leave T1 prepared for good. Its partitions' last stable offset then stays
/// before T1's records: `read_committed` readers (other workers, the API views, consumers of sent
/// events) see nothing past them until another transaction of T1's producer, or one overlapping
/// it, ends. An idle system has none: that was the stall of issue 13. Ending one more transaction
/// when quiet is that transaction; one that ends while another producer's is open finalizes
/// nothing, hence the repeats. On Apache Kafka it is a few cheap transactions per quiet spell.
#[derive(Debug, Default)]
struct Settle {
    /// When the last transaction that wrote records committed; `None` once settled.
    since: Option<Instant>,
    /// How many settling transactions have ended since.
    done: usize,
}

impl Settle {
    /// A transaction that wrote records has committed.
    fn wrote(&mut self) {
        *self = Settle {
            since: Some(Instant::now()),
            done: 0,
        };
    }

    /// Whether a settling transaction is due now; if so, it counts as done. `repeat`: after the
    /// steps of [`SETTLE_AFTER`], go on every [`SETTLE_EVERY`] until [`SETTLE_FOR`].
    fn due(&mut self, repeat: bool) -> bool {
        let Some(since) = self.since else { return false };
        let last = SETTLE_AFTER[SETTLE_AFTER.len() - 1];
        let next = match SETTLE_AFTER.get(self.done) {
            Some(wait) => *wait,
            None if repeat => last + SETTLE_EVERY * (self.done + 1 - SETTLE_AFTER.len()) as u32,
            None => Duration::MAX,
        };
        if next > SETTLE_FOR {
            self.since = None;
            return false;
        }
        if since.elapsed() < next {
            return false;
        }
        self.done += 1;
        true
    }
}

/// A call's result on its way back to the worker loop.
pub(crate) struct CallDone {
    pub instance: String,
    pub op: String,
    pub result: Result<Value, ErrorInfo>,
}

use sm4c_host::clock::wall_ms as now_ms;

/// A message to produce.
pub(crate) struct Out {
    pub(crate) topic: String,
    pub(crate) partition: Option<i32>,
    pub(crate) key: Option<String>,
    /// `None` for a tombstone.
    pub(crate) payload: Option<Vec<u8>>,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
}

pub(crate) fn produce(p: &ThreadedProducer<Quiet>, o: &Out) -> Result<(), String> {
    produce_at(p, o, None)
}

/// [`produce`], with the record's timestamp `at` (ms) when given, else the producer's clock.
fn produce_at(p: &ThreadedProducer<Quiet>, o: &Out, at: Option<i64>) -> Result<(), String> {
    let mut headers = OwnedHeaders::new();
    for (k, v) in &o.headers {
        headers = headers.insert(Header {
            key: k,
            value: Some(v.as_slice()),
        });
    }
    loop {
        let mut rec = BaseRecord::<String, Vec<u8>>::to(&o.topic).headers(headers.clone());
        if let Some(payload) = &o.payload {
            rec = rec.payload(payload);
        }
        if let Some(k) = &o.key {
            rec = rec.key(k);
        }
        if let Some(p) = o.partition {
            rec = rec.partition(p);
        }
        if let Some(at) = at {
            rec = rec.timestamp(at);
        }
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), _)) => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err((e, _)) => return Err(format!("cannot produce to {}: {e}", o.topic)),
        }
    }
}

fn command(shared: &Shared, partition: i32, key: Option<&str>, c: &Command) -> Out {
    Out {
        topic: shared.topics.commands.clone(),
        partition: Some(partition),
        key: key.map(str::to_string),
        payload: Some(serde_json::to_vec(c).unwrap_or_default()),
        headers: Vec::new(),
    }
}

fn deadletter(shared: &Shared, payload: Vec<u8>, mut headers: Vec<(String, Vec<u8>)>, code: &str, why: &str) -> Out {
    tracing::warn!(code, reason = why, "event dead-lettered");
    headers.push(("sm4c-deadletter-code".into(), code.as_bytes().to_vec()));
    headers.push(("sm4c-deadletter-reason".into(), why.as_bytes().to_vec()));
    Out {
        topic: shared.topics.deadletter.clone(),
        partition: None,
        key: None,
        payload: Some(payload),
        headers,
    }
}

/// A sent event in binary content mode (or structured, when the SDK cannot map it).
fn sent_event(shared: &Shared, instance: &str, topic: String, event: &Value, hop: Option<&str>) -> Out {
    use cloudevents::binding::rdkafka::{BaseRecordExt, MessageRecord};
    let _ = shared;
    // The step's trace context travels per hop in the record's own `traceparent` header; the
    // event's `traceparent` attribute (`ce_traceparent` in binary mode) keeps its origin.
    let hop = hop.map(|tp| ("traceparent".to_string(), tp.as_bytes().to_vec()));
    if let Ok(ev) = serde_json::from_value::<cloudevents::Event>(event.clone()) {
        if let Ok(rec) = MessageRecord::from_event(ev) {
            if let Ok(br) = BaseRecord::<str, Vec<u8>>::to(&topic).message_record(&rec) {
                let mut headers = Vec::new();
                if let Some(h) = &br.headers {
                    for x in h.iter() {
                        headers.push((x.key.to_string(), x.value.map(<[u8]>::to_vec).unwrap_or_default()));
                    }
                }
                headers.extend(hop);
                let payload = br.payload.cloned().unwrap_or_default();
                return Out {
                    topic,
                    partition: None,
                    key: Some(instance.to_string()),
                    payload: Some(payload),
                    headers,
                };
            }
        }
    }
    let mut headers = vec![("content-type".into(), b"application/cloudevents+json".to_vec())];
    headers.extend(hop);
    Out {
        topic,
        partition: None,
        key: Some(instance.to_string()),
        payload: Some(serde_json::to_vec(event).unwrap_or_default()),
        headers,
    }
}

/// A CloudEvent from a Kafka message, either content mode; a JSON payload with `specversion` and
/// no headers is read as structured mode too.
pub(crate) fn read_event(m: &OwnedMessage) -> Result<Value, (&'static str, String)> {
    let mut event = read_cloudevent(m)?;
    // An event without the CloudEvents distributed-tracing extension has the record's per-hop
    // trace context (its `traceparent` header) as its origin, as `POST /events` does with the
    // request's.
    let hop = m.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == "traceparent")
            .and_then(|x| std::str::from_utf8(x.value?).ok())
            .and_then(sm4c_host::driver::traceparent)
            .map(str::to_string)
    });
    if let (Some(tp), Some(o)) = (hop, event.as_object_mut()) {
        o.entry("traceparent").or_insert(Value::String(tp));
    }
    Ok(event)
}

fn read_cloudevent(m: &OwnedMessage) -> Result<Value, (&'static str, String)> {
    use cloudevents::binding::rdkafka::MessageExt;
    // The SDK unwraps header values and structured payloads: keep what it cannot read away from it.
    let null_header = m.headers().is_some_and(|h| h.iter().any(|x| x.value.is_none()));
    let structured = m.headers().is_some_and(|h| {
        h.iter().any(|x| {
            x.key.eq_ignore_ascii_case("content-type")
                && x.value.is_some_and(|v| v.starts_with(b"application/cloudevents"))
        })
    });
    let sdk = if null_header || (structured && m.payload().is_none()) {
        Err("a header without a value, or a structured-mode message without a payload".to_string())
    } else {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.to_event()))
            .unwrap_or_else(|_| Err(cloudevents::message::Error::WrongEncoding {}))
            .map_err(|e| e.to_string())
    };
    match sdk {
        Ok(ev) => sm4c_host::events::event_json(&ev).map_err(|e| ("unparsableData", e)),
        Err(e) => {
            let payload = m.payload().unwrap_or_default();
            if let Ok(v) = serde_json::from_slice::<Value>(payload) {
                if v.get("specversion").is_some() {
                    return match serde_json::from_value::<cloudevents::Event>(v) {
                        Ok(ev) => sm4c_host::events::event_json(&ev).map_err(|e| ("unparsableData", e)),
                        Err(e) => Err(("notACloudEvent", format!("not a valid CloudEvent: {e}"))),
                    };
                }
            }
            Err((
                "notACloudEvent",
                format!("not a CloudEvent in the Kafka binding (binary or structured mode): {e}"),
            ))
        }
    }
}

/// An incoming message, as it came, to the dead-letter topic.
fn dead_message(shared: &Shared, m: &OwnedMessage, origin: &Origin, code: &str, why: &str) -> Out {
    let mut h = headers_of(m);
    h.push(("sm4c-origin".into(), origin.key().into_bytes()));
    deadletter(shared, m.payload().unwrap_or_default().to_vec(), h, code, why)
}

fn headers_of(m: &OwnedMessage) -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    if let Some(h) = m.headers() {
        for x in h.iter() {
            v.push((x.key.to_string(), x.value.map(<[u8]>::to_vec).unwrap_or_default()));
        }
    }
    v
}

/// Waits until every produced message is acknowledged. rust-rdkafka's `flush` (which
/// `commit_transaction` calls first) waits in steps of 100 ms when a message is outstanding; a
/// ThreadedProducer's own thread serves the acknowledgements, so a short spin returns as soon as
/// they are in.
fn drain(p: &ThreadedProducer<Quiet>, deadline: Instant) -> Result<(), String> {
    while p.in_flight_count() > 0 {
        if Instant::now() > deadline {
            return Err("messages were not acknowledged in time".into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

fn txn_producer(shared: &Shared, id: &str, timeout: Duration) -> Result<ThreadedProducer<Quiet>, String> {
    let c = shared.cfg.layered(
        &[
            // librdkafka retries a transaction's first produce after 100 ms while the broker still
            // writes the previous one's markers; that back-off was most of a batch's latency.
            ("retry.backoff.ms", "5"),
            ("retry.backoff.max.ms", "50"),
            ("linger.ms", "1"),
            ("transaction.timeout.ms", "60000"),
        ],
        &[("transactional.id", id)],
    );
    let p: ThreadedProducer<Quiet> = c
        .create_with_context(Quiet)
        .map_err(|e| format!("cannot create a producer: {e}"))?;
    p.init_transactions(timeout)
        .map_err(|e| format!("cannot start transactions as {id}: {e}"))?;
    Ok(p)
}

/// What a panic said, for the log.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Commits a batch: in one transaction with the input offsets (exactly once), or produce, flush,
/// then commit offsets (at least once). `at`: the stream time the batch was decided at, the
/// timestamp of every record it produces (they are inputs of other partitions, whose stream time
/// must not take this worker's clock); `None`: the producer's clock.
fn commit(
    shared: &Shared,
    consumers: &Consumers,
    txn: Option<&ThreadedProducer<Quiet>>,
    outs: &[Out],
    offsets: &TopicPartitionList,
    at: Option<i64>,
) -> Result<(), String> {
    match txn {
        Some(p) => {
            let t0 = Instant::now();
            let deadline = t0 + COMMIT_TIMEOUT;
            let left = || deadline.saturating_duration_since(Instant::now());
            p.begin_transaction().map_err(|e| e.to_string())?;
            let r = (|| {
                for o in outs {
                    produce_at(p, o, at)?;
                }
                let t1 = t0.elapsed();
                consumers.send_offsets(p, offsets, deadline)?;
                let t2 = t0.elapsed();
                // Waiting here is much faster than leaving it to commit_transaction, whose own
                // flush took 100 ms per transaction (measured with bench/kafka).
                drain(p, deadline)?;
                let t3 = t0.elapsed();
                let r = p.commit_transaction(left()).map_err(|e| e.to_string());
                tracing::debug!(
                    records = outs.len(),
                    produce_us = t1.as_micros() as u64,
                    offsets_us = t2.as_micros() as u64,
                    acked_us = t3.as_micros() as u64,
                    commit_us = t0.elapsed().as_micros() as u64,
                    "transaction"
                );
                r
            })();
            if let Some(o) = sm4c_host::metrics::observer() {
                o.kafka_transaction(t0.elapsed().as_secs_f64(), r.is_ok());
            }
            if let Err(e) = r {
                // Whether or not the abort succeeds, the caller drops this producer: one whose
                // commit or abort failed may hold a transaction open, and its partition's last
                // stable offset with it; the next producer of its transactional id fences it.
                return Err(match p.abort_transaction(ABORT_TIMEOUT) {
                    Ok(()) => e,
                    Err(a) => format!("{e}; the abort failed too: {a}"),
                });
            }
            count_dead_letters(shared, outs);
            shared.stalls.wrote(outs.iter().map(|o| o.topic.as_str()));
            r
        }
        None => {
            for o in outs {
                produce_at(&shared.plain, o, at)?;
            }
            drain(&shared.plain, Instant::now() + COMMIT_TIMEOUT)?;
            consumers.commit(offsets)?;
            count_dead_letters(shared, outs);
            Ok(())
        }
    }
}

/// Tells the metrics of the dead letters a committed batch put out, by code.
fn count_dead_letters(shared: &Shared, outs: &[Out]) {
    let Some(o) = sm4c_host::metrics::observer() else {
        return;
    };
    for out in outs.iter().filter(|x| x.topic == shared.topics.deadletter) {
        if let Some((_, code)) = out.headers.iter().find(|(k, _)| k == "sm4c-deadletter-code") {
            o.kafka_dead_letter(&String::from_utf8_lossy(code));
        }
    }
}

/// The command that starts a subflow, on the child's commands partition; `origin` is the parent's
/// (a subflow's steps link to the origin of the instance that started it).
fn subflow_start(shared: &Shared, start: &ChildStart, origin: Option<String>) -> Out {
    let c = Command::Start {
        id: start.id.clone(),
        definition: start.definition.clone(),
        version: None,
        input: start.input.clone(),
        parent: Some(start.parent.clone()),
        depth: start.depth,
        origin: None,
        request: None,
        traceparent: origin,
        schedule: None,
        nominal: None,
    };
    command(shared, partition_of(&start.id, shared.partitions), Some(&start.id), &c)
}

/// An owned instance: what the driver runs, and what this host keeps beside it.
struct Slot {
    h: Hosted,
    /// Last applied offset per event source partition (`topic/partition`).
    seen: std::collections::BTreeMap<String, i64>,
    /// Creation order, for listings.
    order: (i64, i64),
    /// The API request that created the instance.
    request: Option<String>,
    /// The latest tasks closed by an API answer: (op, request token).
    answered: Vec<(String, String)>,
    /// The latest events taken: (source, id).
    recent: Vec<(String, String)>,
    /// The schedule that started it, told when it ends.
    schedule: Option<String>,
    /// The keeper's ticket of the last write of its record to the local store (0: the store had
    /// it when the partition was restored): once written, the owner may let it go from memory.
    ticket: u64,
    /// When it was last used ([`Owner::used`]), to let go of the least recently used first.
    used: u64,
}

impl Slot {
    fn from_record(shared: &Shared, m: Arc<Machine>, rec: InstanceRecord) -> Slot {
        let inst = shared.driver.restore(m, rec.snapshot);
        let open = rec.calls.into_iter().map(|(_, e)| e).collect();
        let mut h = Hosted::restored(inst, rec.parent, rec.depth, open, rec.journal_len);
        h.origin = rec.origin;
        Slot {
            h,
            seen: rec.seen,
            order: rec.order,
            request: rec.request,
            answered: rec.answered,
            recent: rec.recent,
            schedule: rec.schedule,
            ticket: 0,
            used: 0,
        }
    }

    fn record(&self) -> InstanceRecord {
        InstanceRecord {
            snapshot: self.h.inst.snapshot().clone(),
            parent: self.h.parent.clone(),
            depth: self.h.depth,
            calls: self
                .h
                .open
                .iter()
                .map(|e| (driver::op_of(e).unwrap_or_default().to_string(), e.clone()))
                .collect(),
            journal_len: self.h.journal_len,
            seen: self.seen.clone(),
            order: self.order,
            request: self.request.clone(),
            origin: self.h.origin.clone(),
            answered: self.answered.clone(),
            recent: self.recent.clone(),
            schedule: self.schedule.clone(),
        }
    }
}

/// The owner of one commands partition.
struct Owner {
    partition: i32,
    /// The partition's stream time (ms): the latest timestamp its inputs carried. What is decided
    /// is decided at it (parked events handed over, an input without a timestamp), never at the
    /// worker's clock, which only says when to propose a timer or a tick.
    stream_ms: i64,
    /// Records the next transaction writes first: the committed record (or a tombstone) again of
    /// each state key whose last record was not committed when the partition was restored.
    ///
    /// Why: the partition's next transaction takes the number on `P.clock` that an aborted one
    /// (the one before the restore) used, so once it commits, a broker that shows aborted records
    /// would make that aborted one's records look committed. Written again after them, the
    /// committed records are the last of their keys; the journal needs nothing, as its readers
    /// take the last record of each sequence number. Found by the simulation (`sim.rs`).
    repair: Vec<Out>,
    txn: Option<ThreadedProducer<Quiet>>,
    /// The unended instances in memory: all of them without a local store; with one, those used
    /// lately (the others are read from the store when a command, an event or a timer comes for
    /// them: [`Owner::slot`]).
    /// Boxed: a slot is large, and the table keeps room for the most it held since the restore.
    slots: HashMap<String, Box<Slot>>,
    /// Counts uses of `slots`, for [`Slot::used`].
    used: u64,
    /// The latest place in listings given to an instance of the partition ([`Owner::place`]).
    last_order: (i64, i64),
    /// Whether an instance was let go of since the restore: until then an instance not in
    /// `slots` does not exist, and the store is not asked.
    evicted: bool,
    /// Why reading an instance from the local store failed during the batch being decided: the
    /// batch must not commit (it may have taken a stored instance for a missing one).
    unreadable: Option<String>,
    /// The unended instances by what the events they may take must carry, and the correlation
    /// keys each is subscribed to at the keys' partitions (in the local store when there is one).
    corr: CorrIndex,
    /// Restored instances whose subscriptions are sent again in the next batch: with
    /// `--delivery at-least-once` a worker that died part-way through producing a batch's records
    /// may have written an instance's state without its subscription (a `Subscribe` is idempotent).
    resubscribe: Vec<String>,
    /// The instances the batch being decided changed: their records are written.
    dirty: BTreeSet<String>,
    /// Instances whose last state record could not be read back at the restore, and why: the
    /// next batch fails each from its last readable record with `corruptRecord`.
    corrupt: Vec<(String, String)>,
    /// Ended instances, when they ended (ms) and their places in listings ([`crate::view::seq`]),
    /// in the local store when there is one: a start with the same id starts nothing, an event
    /// naming one is dead-lettered. Past the retention their state records are deleted.
    ended: index::Ended,
    /// Ended instances whose retention has passed, with their places in listings: their state
    /// records and their rows of the local index are deleted in the next transaction.
    expired: Vec<(String, i64)>,
    /// When `ended` is looked through for expired instances next (ms of stream time): not on
    /// every tick, which would cost a pass over every ended instance twice a second.
    next_expiry: i64,
    /// When the loop looks at the ended instances next to see whether a tick is due for their
    /// retention (ms of this worker's clock: it only says when; [`Owner::tick_at`]).
    look_at: i64,
    parking: Parking,
    /// The schedules whose ids hash to this partition ([`schedules`]).
    scheds: schedules::Scheds,
    /// The shares of batch operations of this partition ([`batches`]).
    batches: batches::Batches,
    /// The armed timers due before `horizon`, by due time (the others are in the local store).
    timers: BTreeSet<(i64, String, String)>,
    /// Timers due at or after this (ms) are kept in the partition's local store, not in `timers`
    /// ([`crate::KafkaConfig::timer_horizon_ms`]); `i64::MAX` without a store.
    horizon: i64,
    /// A streaming restore wrote every timer to the store ([`restore::Latest::stream`]): those
    /// due before the horizon come into memory when the index is placed ([`Owner::place_index`]).
    timers_stored: bool,
    /// Changes of the local index the next transaction writes with its records: the timers taken
    /// into memory from the store.
    index_next: Vec<(String, Option<Vec<u8>>)>,
    /// The keeper's ticket of the partition's last write to its store: the store has every timer
    /// this owner put there once the keeper has done it.
    last_ticket: u64,
    /// When the last transaction committed (or the partition was restored).
    last_commit: Instant,
    /// Settling after the last transaction that wrote records ([`Settle`]).
    settle: Settle,
    /// Timers proposed and not applied yet: (when to look again, instance, timer) → due time.
    retries: BTreeMap<(i64, String, String), i64>,
    /// Call results handed back and not applied yet: (instance, op) → (when to propose again,
    /// result). Like a timer, a result whose command the broker did not take is not lost.
    answers: BTreeMap<(String, String), (i64, Outcome)>,
    /// Calls in flight: (instance, op) → task.
    in_flight: HashMap<(String, String), tokio::task::AbortHandle>,
    /// The partition's local store ([`sm4c_host::local`]): the committed records of its state
    /// partition, written after each transaction, with the offset to read on from.
    store: Option<Arc<dyn LocalStore>>,
    /// The store's checkpoint (it never moves back), and when it was last written: a quiet
    /// partition's store has it written again every [`LOCAL_REFRESH`], as a store whose checkpoint
    /// is old counts as stale at its next restore.
    checkpoint: i64,
    checkpoint_at: Instant,
    /// The number of this partition's next transaction (see [`crate::wire::StateRecord::clock`]).
    clock: i64,
    /// The committed offset of the commands partition when it was restored: the state read then
    /// holds every command below it: the partition is read on from there, and those commands are
    /// skipped if they come again.
    resume: i64,
    /// The next commands offset to apply (the committed offset once the last batch commits): what
    /// each transaction's position record says ([`crate::wire::POSITION_KEY`]).
    next_command: i64,
    /// While set, events are not applied here directly: this worker has put a barrier command
    /// with this token on the partition when the partition or an events partition came to it, and
    /// waits to read it back, so that the commands an earlier owner routed here go first.
    barrier: Option<String>,
    /// The partition's instance records as its restore read them, ended ones included, until the
    /// loop hands them to the API's [`crate::view::View`]; only without a local store (the API
    /// reads the store's).
    records: crate::view::Records,
    /// The ids of the partition's instances as its restore read them, ended ones included, until
    /// its journal's catch-up takes them.
    known: HashSet<String>,
    /// The partition's local journal ([`journal`]), and the offset its catch-up starts from.
    journal: Option<(Arc<dyn LocalStore>, i64)>,
}

impl Owner {
    /// The place in listings of an instance that starts now ([`crate::view::next_order`]): after
    /// every other instance of the partition.
    fn place(&mut self, at: i64, offset: i64) -> (i64, i64) {
        self.last_order = crate::view::next_order(self.last_order, at, offset);
        self.last_order
    }

    /// Unended instance `id`, read from the local store when the owner let go of it. `None`: no
    /// such unended instance (or the store failed, which [`Owner::unreadable`] records).
    /// [`Self::slot`] of an instance a redrive sends back to running: an ended one has left
    /// memory (its record stays on the state topic for the retention), so it is read back from
    /// the partition's records, and leaves the index of ended instances (whose retention would
    /// delete its record).
    fn revive(&mut self, shared: &Shared, id: &str) -> Option<&mut Slot> {
        if !self.slots.contains_key(id) {
            let rec = shared.view.get(self.partition, id)?;
            if rec.snapshot.status.is_final() {
                let m = shared.machine(&rec.snapshot.definition, &rec.snapshot.version)?;
                self.slots
                    .insert(id.to_string(), Box::new(Slot::from_record(shared, m, rec)));
            }
        }
        self.slot(shared, id)
    }

    /// Instance `id`, redriven, is no longer ended: its record is kept past the retention.
    fn revived(&mut self, id: &str) {
        self.ended.remove(id);
    }

    fn slot(&mut self, shared: &Shared, id: &str) -> Option<&mut Slot> {
        if !self.slots.contains_key(id) {
            let loaded = self.load(shared, id)?;
            self.slots.insert(id.to_string(), Box::new(loaded));
        }
        self.used += 1;
        let s = self.slots.get_mut(id)?;
        s.used = self.used;
        Some(s)
    }

    fn load(&mut self, shared: &Shared, id: &str) -> Option<Slot> {
        if !self.evicted {
            return None;
        }
        let rec = match crate::view::stored(self.store.as_deref()?, id) {
            Ok(rec) => rec?,
            Err(why) => {
                self.unreadable = Some(why);
                return None;
            }
        };
        if rec.snapshot.status.is_final() {
            return None;
        }
        let Some(m) = shared.machine(&rec.snapshot.definition, &rec.snapshot.version) else {
            tracing::error!(
                instance = id,
                "the definition of this instance is not registered; it stays as it is"
            );
            return None;
        };
        Some(Slot::from_record(shared, m, rec))
    }

    /// Lets go of the least recently used instances beyond `keep`, among those whose latest
    /// record the local store has (the keeper's tickets up to `written` are done): they are read
    /// from the store again when needed. Only with a store.
    fn evict(&mut self, keep: usize, written: u64) {
        if self.store.is_none() || self.slots.len() <= keep {
            return;
        }
        let mut old: Vec<(u64, &String)> = self
            .slots
            .iter()
            .filter(|(_, s)| s.ticket <= written)
            .map(|(id, s)| (s.used, id))
            .collect();
        let n = (self.slots.len() - keep).min(old.len());
        if n == 0 {
            return;
        }
        old.select_nth_unstable(n - 1);
        let gone: Vec<String> = old[..n].iter().map(|(_, id)| (*id).clone()).collect();
        for id in gone {
            self.slots.remove(&id);
        }
        // The table keeps room for the most it held (a burst of starts): give it back.
        if self.slots.capacity() > 2 * keep.max(self.slots.len()) + 64 {
            self.slots.shrink_to(keep.max(self.slots.len()));
        }
        self.evicted = true;
    }

    /// The changes of the local index that the timer work of a decided batch makes: a timer due
    /// at or after the horizon is kept in the store only (the same transaction's write), not in
    /// memory ([`Owner::track`]).
    fn far_timers(&self, after: &[(String, Work)]) -> Vec<(String, Option<Vec<u8>>)> {
        if self.store.is_none() {
            return Vec::new();
        }
        after
            .iter()
            .filter_map(|(id, w)| match w {
                Work::ArmTimer { timer, due } if *due >= self.horizon => {
                    Some((index::timer_key(*due, id, timer), Some(Vec::new())))
                }
                Work::CancelTimer { timer, due: Some(due) } if *due >= self.horizon => {
                    Some((index::timer_key(*due, id, timer), None))
                }
                _ => None,
            })
            .collect()
    }

    /// A restored partition's local index for deciding, made from the instances the restore read
    /// (the store's may be stale): its correlation index goes to the local store, and of its
    /// timers, those due from a horizon from `now` on. Without a store, or when it cannot be
    /// written, all stay in memory. Its schedules are woken at `now`.
    fn place_index(&mut self, now: i64, horizon_ms: i64) -> Result<(), String> {
        self.scheds.wake_all(now);
        self.horizon = i64::MAX;
        self.corr.decided();
        let Some(store) = self.store.clone() else { return Ok(()) };
        let horizon = now.saturating_add(horizon_ms);
        if self.timers_stored {
            self.timers_stored = false;
            let mut near = Vec::new();
            store
                .scan_from(
                    index::TIMER_PREFIX,
                    &index::timers_from(0),
                    &mut |k, _| match index::parse_timer_key(k) {
                        Some(t) if t.0 >= horizon => false,
                        Some(t) => {
                            near.push((k.to_string(), t));
                            true
                        }
                        None => true,
                    },
                )
                .map_err(|e| e.to_string())?;
            let gone: Vec<(&str, Option<&[u8]>)> = near.iter().map(|(k, _)| (k.as_str(), None)).collect();
            store.apply(&gone, None).map_err(|e| e.to_string())?;
            self.timers.extend(near.into_iter().map(|(_, t)| t));
            self.horizon = horizon;
            return Ok(());
        }
        // A streaming restore wrote these as it made them ([`restore::Latest::stream`]).
        if !self.corr.kept.placed() {
            self.corr.kept.place(store.clone(), &[index::CORR_PREFIX])?;
        }
        if !self.ended.kept.placed() {
            self.ended.kept.place(store.clone(), &[index::ENDED_PREFIX])?;
        }
        // The restore wrote the subscriptions' records to the store.
        self.parking.subs.attach(store.clone());
        let far = self.timers.split_off(&(horizon, String::new(), String::new()));
        let keys: Vec<String> = far.iter().map(|(due, id, tm)| index::timer_key(*due, id, tm)).collect();
        let entries = keys.iter().map(|k| (k.as_str(), Some(&[][..])));
        match index::replace_under(store.as_ref(), &[index::TIMER_PREFIX], entries) {
            Ok(()) => {
                self.horizon = horizon;
                Ok(())
            }
            Err(e) => {
                self.timers.extend(far);
                Err(e)
            }
        }
    }

    /// Takes into memory the timers of the local store due within a horizon from `now`, once
    /// `now` is half way to the current one. Waits until the keeper has written everything this
    /// owner gave it (`written`, its ticket): a timer on its way to the store may be due before
    /// the new horizon. A store that cannot be read makes the partition restored again.
    fn advance_timers(&mut self, now: i64, horizon_ms: i64, written: u64) {
        let Some(store) = &self.store else { return };
        if self.horizon == i64::MAX || now.saturating_add(horizon_ms / 2) < self.horizon || written < self.last_ticket {
            return;
        }
        let until = now.saturating_add(horizon_ms);
        let mut near = Vec::new();
        let scanned = store.scan_from(index::TIMER_PREFIX, &index::timers_from(self.horizon), &mut |k, _| {
            match index::parse_timer_key(k) {
                Some(t) if t.0 >= until => false,
                Some(t) => {
                    near.push((k.to_string(), t));
                    true
                }
                None => true,
            }
        });
        if let Err(e) = scanned {
            self.unreadable = Some(format!("the timers cannot be read from the local store: {e}"));
            return;
        }
        for (k, t) in near {
            self.timers.insert(t);
            self.index_next.push((k, None));
        }
        self.horizon = until;
    }

    /// Keeps the timers an instance armed or cancelled (in a committed decision); one due at or
    /// after the horizon is in the local store ([`Owner::far_timers`]).
    fn track(&mut self, id: &str, work: Work) {
        match work {
            Work::ArmTimer { timer, due } if due < self.horizon => {
                self.timers.insert((due, id.to_string(), timer));
            }
            Work::CancelTimer { timer, due } => match due {
                Some(due) => {
                    self.timers.remove(&(due, id.to_string(), timer));
                }
                None => self.timers.retain(|(_, i, tm)| !(i == id && *tm == timer)),
            },
            _ => {}
        }
    }

    /// A call's result: the command that hands it back, kept until the instance has taken it
    /// ([`Owner::due`] proposes it again meanwhile).
    fn answered(&mut self, id: &str, op: &str, outcome: Outcome, now: i64) -> Command {
        self.answers.insert(
            (id.to_string(), op.to_string()),
            (now + TIMER_RETRY_MS, outcome.clone()),
        );
        Command::Result {
            id: id.to_string(),
            op: op.to_string(),
            outcome,
        }
    }

    /// The commands to propose at `now`: one for each timer that came due, and the call results
    /// not taken yet. A proposed timer stays armed until its instance no longer has it, and a
    /// result kept until its call is no longer open; each is proposed again every
    /// [`TIMER_RETRY_MS`] meanwhile: a command that the broker did not take (or that a failed
    /// batch read and lost) loses neither. A repeated command is harmless: an instance fires
    /// only a timer it still has, and takes only the result of a call still open.
    ///
    /// Found by the simulation (`sim.rs`): a call result the broker did not take left its
    /// instance waiting until the partition was restored.
    fn due(&mut self, shared: &Shared, now: i64) -> Vec<Command> {
        let mut due_now = Vec::new();
        while let Some(first) = self.timers.first().cloned() {
            if first.0 > now {
                break;
            }
            self.timers.pop_first();
            let (due, id, timer) = first;
            // Still armed at this due time? (The id may have been armed again since.)
            let armed = self
                .slot(shared, &id)
                .is_some_and(|s| !s.h.inst.status().is_final() && s.h.inst.snapshot().timers.get(&timer) == Some(&due));
            if !armed {
                continue;
            }
            due_now.push(Command::Timer {
                id: id.clone(),
                timer: timer.clone(),
            });
            self.retries.insert((now + TIMER_RETRY_MS, id, timer), due);
        }
        while let Some(((at, _, _), _)) = self.retries.first_key_value() {
            if *at > now {
                break;
            }
            let Some(((_, id, timer), due)) = self.retries.pop_first() else {
                break;
            };
            self.timers.insert((due, id, timer));
        }
        let mut gone = Vec::new();
        let asked: Vec<(String, String)> = self
            .answers
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for (id, op) in asked {
            if self.slot(shared, &id).is_none_or(|s| s.h.open_op(&op).is_none()) {
                gone.push((id, op));
                continue;
            }
            if let Some((at, outcome)) = self.answers.get_mut(&(id.clone(), op.clone())) {
                *at = now + TIMER_RETRY_MS;
                due_now.push(Command::Result {
                    id,
                    op,
                    outcome: outcome.clone(),
                });
            }
        }
        for k in gone {
            self.answers.remove(&k);
        }
        due_now
    }

    /// The time a tick proposed at `now` (this worker's clock) is proposed for: the latest due
    /// time, at or before `now`, of a parked event's window, a tally entry's retention or an
    /// ended instance's retention (`None`: nothing is due yet). The clock chooses when to
    /// propose; the tick names what came due, and its decision follows the stream time
    /// ([`decision::decide`]), not the clock.
    fn tick_at(&mut self, now: i64, window: i64, retention: i64) -> Option<i64> {
        let parked = self.parking.due_by(now, window);
        let mut ended = None;
        if now >= self.look_at {
            let (due, earliest) = self
                .ended
                .ended_by(now.saturating_sub(retention), EXPIRED_PER_TRANSACTION);
            ended = due.map(|at| at.saturating_add(retention));
            if ended.is_none() {
                // Again when the earliest is due, and at least once a minute (a clock that
                // jumped); an instance that ends meanwhile has it look again at once.
                let next = earliest.map_or(i64::MAX, |at| at.saturating_add(retention));
                self.look_at = next.min(now.saturating_add(EXPIRY_LOOK_MS));
            }
        }
        parked.max(ended)
    }

    /// Picks the ended instances whose retention has passed by `now` (at most
    /// [`EXPIRED_PER_TRANSACTION`]), unless the last ones picked are not deleted yet: the next
    /// transaction deletes their state records and their rows of the local index. Looks through
    /// the ended instances only when one may have expired, not on every tick.
    fn expire(&mut self, now: i64, retention: i64) {
        if !self.expired.is_empty() || now < self.next_expiry {
            return;
        }
        let (old, next) = self
            .ended
            .take_until(now.saturating_sub(retention), EXPIRED_PER_TRANSACTION);
        // Next when the earliest left expires, or a retention from now: what ends from now on
        // expires no earlier (but for the lag of its inputs, by which it is deleted late, never
        // early); at once when this pass stopped at its bound.
        self.next_expiry = match old.len() == EXPIRED_PER_TRANSACTION {
            true => now,
            false => next.map_or(now, |at| at.min(now)).saturating_add(retention),
        };
        self.expired = old;
    }

    /// The batch `b` has committed: the partition's clock moves on, ended instances leave memory
    /// (the state topic keeps them for the retention). Gives back what the batch asked to do once
    /// committed, and the events it applied.
    fn committed(&mut self, b: decision::Batch) -> (Vec<(String, Work)>, Applied) {
        self.clock += 1;
        self.last_commit = Instant::now();
        if !b.outs.is_empty() {
            self.settle.wrote();
        }
        self.expired.clear();
        if !b.ended.is_empty() {
            self.look_at = i64::MIN;
        }
        for (id, (at, place)) in b.ended {
            self.slots.remove(&id);
            self.corr.remove(&id);
            self.ended.insert(&id, at, place);
        }
        (b.after, b.applied)
    }
}

/// How often the loop looks at most for ended instances past their retention while none is (ms).
const EXPIRY_LOOK_MS: i64 = 60_000;

/// How many ended instances past their retention one transaction deletes at most.
const EXPIRED_PER_TRANSACTION: usize = 1000;

/// How often a quiet partition's local store has its checkpoint written again (its time only).
const LOCAL_REFRESH: Duration = Duration::from_secs(3600);

/// What a committed transaction writes to the partition's local store: its state records and the
/// changes of the local index they make (`index`), and as the checkpoint the offset after `delivered`, the last record this process's producers wrote to
/// the state partition (every one of them committed or aborted by now: an owner whose transaction
/// failed is dropped and its partition restored).
fn local_changes(
    shared: &Shared,
    p: i32,
    outs: &[Out],
    index: Vec<(String, Option<Vec<u8>>)>,
    delivered: Option<i64>,
) -> (keeper::Changes, Option<Checkpoint>) {
    let changes = outs
        .iter()
        .filter(|o| o.topic == shared.topics.state && o.partition == Some(p))
        .filter_map(|o| Some((o.key.clone()?, o.payload.clone())))
        .chain(index)
        .collect();
    let checkpoint = delivered.map(|o| Checkpoint {
        offset: o + 1,
        written_ms: now_ms(),
    });
    (changes, checkpoint)
}

/// A command made of an incoming event: (partition, key, command, timestamp, event offset). The
/// timestamp is the event record's (`None` for a record without one, which the deciding partition
/// takes at its stream time, never at a worker's clock).
type RoutedCommand = (i32, Option<String>, Command, Option<i64>, i64);

/// What a batch of one events partition turns into: commands for instances' partitions, and
/// dead letters.
struct Plan {
    cmds: Vec<RoutedCommand>,
    /// Dead letters.
    outs: Vec<Out>,
    /// The last offset read.
    last: i64,
}

/// Events partitions' batches a commands partition's transaction takes in: the commands for its
/// own instances are applied at once (no hop through the commands topic), the rest is produced,
/// and the events offsets are committed, all in that one transaction.
#[derive(Default)]
struct Carried {
    /// Commands for this partition: (command, timestamp, event offset).
    inline: Vec<(Command, Option<i64>, i64)>,
    /// Commands for other partitions and dead letters.
    outs: Vec<Out>,
    /// Events partitions and the offsets to commit.
    offsets: Vec<(String, i32, i64)>,
    /// Commands produced for other owned partitions: (events partition, partition, event offset).
    forwarded: Vec<((String, i32), i32, i64)>,
    /// The latest timestamp of the events routed: the transaction's records are stamped no
    /// earlier (a host partition whose stream time is behind, 0 after a restore, stamped the
    /// commands it routed 0: their partition took a parked event's window to end in 1970, and
    /// reported it unmatched at once; simulation seeds 1030 and 2929).
    latest: Option<i64>,
}

/// Per events partition, the largest event offset that commands applied in a batch were made of.
type Applied = HashMap<(String, i32), i64>;

/// Routes one events partition into commands.
struct Router {
    txn: Option<ThreadedProducer<Quiet>>,
    /// Settling after its last routing transaction ([`Settle`]).
    settle: Settle,
    /// The commands partition its last transaction wrote to: its settling transaction ticks it.
    last_target: i32,
}

/// The most records one loop turn takes from the consumer: they are decided and committed in one
/// transaction per partition, so a backlog costs the broker one transaction per this many records.
const MAX_BATCH: usize = 5_000;

pub(crate) fn run(shared: Arc<Shared>, results: mpsc::Receiver<CallDone>, results_tx: mpsc::Sender<CallDone>) {
    let offsets: Arc<BaseConsumer<Quiet>> = match offsets_reader_config(&shared).create_with_context(Quiet) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            shared.fail(format!("cannot create the offsets reader: {e}"));
            return;
        }
    };
    crate::members::hand_over(&shared);
    let consumers = match Consumers::new(&shared) {
        Ok(c) => c,
        Err(e) => {
            shared.fail(e);
            return;
        }
    };
    let mut w = Worker {
        shared: shared.clone(),
        consumers,
        owners: HashMap::new(),
        routers: HashMap::new(),
        results_tx,
        outstanding: HashMap::new(),
        rewinding: HashSet::new(),
        restoring: HashMap::new(),
        last_assigned: Vec::new(),
        offsets,
    };
    let mut last_tick = Instant::now();
    let mut last_owned: Vec<i32> = Vec::new();
    // Why the worker stops for good, once it must: it says so (its health) only after it let go
    // of its partitions, so a health that says `failing` never shows partitions still owned.
    let mut fatal: Option<String> = None;
    while !shared.stop.load(Ordering::Relaxed) && fatal.is_none() {
        let started = Instant::now();
        let batch = match w.consumers.poll(MAX_BATCH, Duration::from_millis(20)) {
            Ok(b) => b,
            Err(why) => {
                fatal = Some(why);
                break;
            }
        };
        let polled = started.elapsed();
        let n = batch.len();
        // How long the oldest record waited between its producer and this poll (create time), for
        // the debug log only: no pass over the batch when that is off.
        let age_ms = tracing::enabled!(tracing::Level::DEBUG)
            .then(|| batch.iter().filter_map(|m| m.timestamp().to_millis()).min())
            .flatten()
            .map(|t| now_ms() - t);
        let t_sync = Instant::now();
        w.sync_assignment();
        let synced = t_sync.elapsed();
        let mut groups: Vec<((String, i32), Vec<OwnedMessage>)> = Vec::new();
        for m in batch {
            let k = (m.topic().to_string(), m.partition());
            match groups.iter_mut().find(|(g, _)| *g == k) {
                Some((_, v)) => v.push(m),
                None => groups.push((k, vec![m])),
            }
        }
        let t = Instant::now();
        w.process(groups);
        if n > 0 {
            tracing::debug!(
                messages = n,
                age_ms,
                poll_us = polled.as_micros() as u64,
                process_us = t.elapsed().as_micros() as u64,
                "batch"
            );
        }
        let processed = t.elapsed();
        let t_rest = Instant::now();
        w.fire_timers();
        while let Ok(done) = results.try_recv() {
            w.result(done);
        }
        if last_tick.elapsed() > Duration::from_millis(500) {
            last_tick = Instant::now();
            w.tick();
            if let Some((member, m)) = shared.members.superseded_by(now_ms()) {
                fatal = Some(format!(
                    "another worker ({member} at {}) joined the group under this worker's group instance id (--group-instance-id) after it; each worker needs its own; this worker stopped",
                    m.url.as_deref().unwrap_or("an address it has not published")
                ));
            }
        }
        shared.owned.store(w.owners.len(), Ordering::Relaxed);
        shared.events_read.store(w.routers.len(), Ordering::Relaxed);
        shared
            .cached
            .store(w.owners.values().map(|t| t.slots.len()).sum(), Ordering::Relaxed);
        let mut owned: Vec<i32> = w.owners.keys().copied().collect();
        owned.sort_unstable();
        if owned != last_owned {
            shared.members.set_owned(owned.clone());
            last_owned = owned;
        }
        // Nothing else polls the group's consumer: a slow turn of this loop holds every owned
        // partition back (and past max.poll.interval.ms, the group moves them away). Say which
        // part took the time.
        let turn = started.elapsed();
        shared
            .longest_turn_ms
            .fetch_max(turn.as_millis() as u64, Ordering::Relaxed);
        if turn > SLOW_TURN {
            tracing::warn!(
                turn_ms = turn.as_millis() as u64,
                poll_ms = polled.as_millis() as u64,
                assignment_ms = synced.as_millis() as u64,
                decisions_ms = processed.as_millis() as u64,
                timers_and_results_ms = t_rest.elapsed().as_millis() as u64,
                messages = n,
                "a slow turn of the worker's loop"
            );
        }
    }
    let stopped = fatal.is_some();
    if let Some(why) = fatal {
        // The process goes on serving its health; it owns nothing now, and its API answers for
        // none of the partitions (their new owners do).
        let owned: Vec<i32> = w.owners.keys().copied().collect();
        for p in owned {
            w.drop_owner(p);
        }
        shared.owned.store(0, Ordering::Relaxed);
        shared.events_read.store(0, Ordering::Relaxed);
        shared.cached.store(0, Ordering::Relaxed);
        shared.members.set_owned(Vec::new());
        shared.fail(why);
    }
    for (_, t) in w.owners.drain() {
        for (_, h) in t.in_flight {
            h.abort();
        }
    }
    w.consumers.unsubscribe();
    if stopped {
        // Stopped for good: a worker that replaces this one under its name need not wait for it.
        shared.members.retire();
    }
}

struct Worker {
    shared: Arc<Shared>,
    consumers: Consumers,
    owners: HashMap<i32, Owner>,
    routers: HashMap<(String, i32), Router>,
    results_tx: mpsc::Sender<CallDone>,
    /// (events partition, owned commands partition) → the largest event offset routed there as a
    /// command and not yet applied. Events of that events partition are not applied directly on
    /// that partition meanwhile: an instance sees the events of one events partition in order.
    outstanding: Outstanding,
    /// Partitions paused because they could not be rewound to their committed offset yet; their
    /// records are not taken until they are.
    rewinding: HashSet<(String, i32)>,
    /// Commands partitions being restored beside the loop: the restore's thread, or when the last
    /// one failed (it is tried again [`RESTORE_RETRY`] later). Paused meanwhile.
    restoring: HashMap<i32, Restoring>,
    /// What the last assignment check saw, sorted.
    last_assigned: Vec<(String, i32)>,
    /// Reads the group's committed offsets for restores, off the poll loop (it never joins).
    offsets: Arc<BaseConsumer<Quiet>>,
}

impl Worker {
    fn assigned(&self) -> HashSet<(String, i32)> {
        self.consumers.assigned()
    }

    fn sync_assignment(&mut self) {
        if !self.rewinding.is_empty() {
            self.retry_rewinds();
        }
        let assigned = self.assigned();
        let commands = self.shared.topics.commands.clone();
        let mut now: Vec<(String, i32)> = assigned.iter().cloned().collect();
        now.sort_unstable();
        if now != self.last_assigned {
            let of = |events: bool| -> Vec<String> {
                now.iter()
                    .filter(|(t, _)| (*t != commands) == events)
                    .map(|(t, p)| if events { format!("{t}/{p}") } else { p.to_string() })
                    .collect()
            };
            tracing::info!(
                commands = of(false).join(","),
                events = of(true).join(","),
                "assignment changed"
            );
            self.last_assigned = now;
        }
        let gone: Vec<i32> = self
            .owners
            .keys()
            .filter(|p| !assigned.contains(&(commands.clone(), **p)))
            .copied()
            .collect();
        for p in gone {
            tracing::info!(partition = p, "partition revoked");
            if let Some(o) = sm4c_host::metrics::observer() {
                o.kafka_parked(p, 0);
            }
            self.drop_owner(p);
            self.shared.journals.release(p);
        }
        self.routers.retain(|k, _| assigned.contains(k));
        // A restore revoked before it ended: its thread ends by itself without writing the
        // partition's local store, and what it read is dropped.
        self.restoring.retain(|p, r| {
            let keep = assigned.contains(&(commands.clone(), *p));
            if let (false, Restoring::Running(_, revoked)) = (keep, r) {
                revoked.store(true, Ordering::Relaxed);
            }
            keep
        });
        // What the API holds of partitions no longer assigned, also of those revoked while being
        // restored again (after a failed batch), when they had no owner to drop.
        for p in self.shared.view.held() {
            if !assigned.contains(&(commands.clone(), p)) {
                self.shared.view.release(p);
                self.shared.journals.release(p);
            }
        }
        self.start_restores(&assigned);
        self.finish_restores();
        // New routers start side by side: each fences its events partition's transactional id and
        // reads its committed offset (up to RESTORE_TIMEOUT each), and the loop waits for the
        // slowest, not for their sum.
        let mut wanted: Vec<(String, i32)> = assigned
            .into_iter()
            .filter(|(t, p)| *t != commands && !self.routers.contains_key(&(t.clone(), *p)))
            .collect();
        wanted.sort_unstable();
        let new_router = !wanted.is_empty();
        type Started = (
            (String, i32),
            Result<Option<ThreadedProducer<Quiet>>, String>,
            Result<bool, String>,
        );
        let started: Vec<Started> = {
            let (shared, consumers, offsets) = (&self.shared, &self.consumers, &self.offsets);
            std::thread::scope(|s| {
                let hs: Vec<_> = wanted
                    .into_iter()
                    .map(|(topic, p)| {
                        s.spawn(move || {
                            let txn = if shared.cfg.exactly_once {
                                let id = format!("{}.{}.{}", shared.cfg.group, topic, p);
                                match txn_producer(shared, &id, RESTORE_TIMEOUT) {
                                    Ok(t) => Ok(Some(t)),
                                    Err(e) => return ((topic, p), Err(e), Ok(false)),
                                }
                            } else {
                                Ok(None)
                            };
                            // The barriers below must land after the last transaction of the
                            // previous owner that consumed from this events partition, or commands
                            // it routed here would come after events applied directly. Reading the
                            // committed offset with read_committed isolation asks the broker for a
                            // stable offset (KIP-447): it answers once that owner's pending
                            // transaction is committed or aborted. A partition the events group
                            // has no offset for yet goes on from where the commands group's
                            // workers of an earlier version left it.
                            let adopted = consumers.adopt_earlier_offset(offsets, &topic, p, RESTORE_TIMEOUT);
                            ((topic, p), txn, adopted)
                        })
                    })
                    .collect();
                hs.into_iter()
                    .filter_map(|h| {
                        h.join()
                            .map_err(|panic| {
                                // Not in `routers`: the next assignment check starts it again.
                                tracing::error!(panic = panic_text(panic.as_ref()), "starting a router panicked");
                            })
                            .ok()
                    })
                    .collect()
            })
        };
        for ((topic, p), txn, adopted) in started {
            let txn = match txn {
                Ok(t) => t,
                Err(e) => {
                    // What was polled from it meanwhile is not routed: read it again once a router
                    // runs (the next assignment check tries again).
                    tracing::error!(topic, partition = p, error = %e, "cannot start the router; its records are read again");
                    self.rewind(&topic, p);
                    continue;
                }
            };
            match adopted {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::error!(topic, partition = p, error = %e, "cannot read the stable committed offset; the router starts later");
                    self.rewind(&topic, p);
                    continue;
                }
            }
            self.routers.insert(
                (topic, p),
                Router {
                    txn,
                    settle: Settle::default(),
                    last_target: p,
                },
            );
        }
        if new_router {
            // Its previous owner (fenced now) may have routed events to our partitions: those
            // commands are applied before any of its events is applied directly.
            let owned: Vec<i32> = self.owners.keys().copied().collect();
            for p in owned {
                let token = put_barrier(&self.shared, p);
                if let Some(t) = self.owners.get_mut(&p) {
                    t.barrier = Some(token);
                }
            }
        }
        let owners = &self.owners;
        self.outstanding.retain(|(_, q), _| owners.contains_key(q));
    }

    /// Starts restoring the commands partitions newly assigned (and those whose last restore failed
    /// a while ago), each on a thread of its own beside the loop: the loop goes on polling, so a long
    /// restore never makes the group take this worker out (`max.poll.interval.ms`), and partitions
    /// are restored side by side. Each is paused until its restore ends.
    fn start_restores(&mut self, assigned: &HashSet<(String, i32)>) {
        let commands = self.shared.topics.commands.clone();
        let mut new: Vec<i32> = assigned
            .iter()
            .filter(|(t, p)| *t == commands && !self.owners.contains_key(p))
            .map(|(_, p)| *p)
            .filter(|p| match self.restoring.get(p) {
                None => true,
                Some(Restoring::Running(..)) => false,
                Some(Restoring::Failed(at)) => at.elapsed() >= RESTORE_RETRY,
            })
            .collect();
        new.sort_unstable();
        for p in new {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&commands, p);
            if let Err(e) = self.consumers.commands.pause(&tpl) {
                tracing::warn!(partition = p, error = %e, "cannot pause the partition while it is restored");
            }
            let (shared, offsets) = (self.shared.clone(), self.offsets.clone());
            let revoked = Arc::new(AtomicBool::new(false));
            let flag = revoked.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("sm4c-restore-{p}"))
                .spawn(move || restore(&shared, &offsets, p, &flag));
            match spawned {
                Ok(h) => {
                    self.restoring.insert(p, Restoring::Running(h, revoked));
                }
                Err(e) => {
                    tracing::error!(partition = p, error = %e, "cannot start a restore; trying again");
                    self.restoring.insert(p, Restoring::Failed(Instant::now()));
                }
            }
        }
    }

    /// Takes in the restores that have ended: the partition is owned from now on, read on from its
    /// committed offset, and its calls in flight are made again (an `atMostOnce` one fails with
    /// `stepInterrupted` instead, [`sm4c_host::driver::interrupted`]). A failed restore is tried again
    /// [`RESTORE_RETRY`] later, the partition paused meanwhile.
    fn finish_restores(&mut self) {
        let commands = self.shared.topics.commands.clone();
        let ended: Vec<i32> = self
            .restoring
            .iter()
            .filter(|(_, r)| matches!(r, Restoring::Running(h, _) if h.is_finished()))
            .map(|(p, _)| *p)
            .collect();
        for p in ended {
            let Some(Restoring::Running(h, _)) = self.restoring.remove(&p) else {
                continue;
            };
            match h.join().unwrap_or_else(|_| Err("the restore panicked".into())) {
                Ok((mut t, calls)) => {
                    // The partition's barrier is put now, not when the restore started: a router
                    // made meanwhile put its own barrier on the owned partitions only, and the
                    // commands its events partition's previous owner routed here lie before this
                    // one, so events are applied here directly only once they are.
                    t.barrier = Some(put_barrier(&self.shared, p));
                    // Records polled before the pause are dropped (no owner took them): read on
                    // from the offset the restored state holds everything below.
                    let off = if t.resume == 0 {
                        Offset::Beginning
                    } else {
                        Offset::Offset(t.resume)
                    };
                    let mut tpl = TopicPartitionList::new();
                    tpl.add_partition(&commands, p);
                    self.rewinding.remove(&(commands.clone(), p));
                    let c = &self.consumers.commands;
                    let read_on = c
                        .resume(&tpl)
                        .map_err(|e| e.to_string())
                        .and_then(|()| c.seek(&commands, p, off, REWIND_TIMEOUT).map_err(|e| e.to_string()));
                    if let Err(e) = read_on {
                        tracing::warn!(partition = p, error = %e, "cannot read on after the restore; paused until it can");
                        self.pause(&commands, p);
                    }
                    for (id, work) in calls {
                        // An atMostOnce call may have reached its function: it fails instead, by
                        // a result command like any call's (kept and proposed again until taken).
                        match sm4c_host::driver::interrupted(&work) {
                            Some(sm4c_runtime::Input::Failed { op, error }) => {
                                let c = t.answered(&id, &op, Outcome::Err(error), now_ms());
                                let p = partition_of(&id, self.shared.partitions);
                                if let Err(e) = produce(&self.shared.plain, &command(&self.shared, p, Some(&id), &c)) {
                                    tracing::warn!(error = %e, "cannot hand back an interrupted call; proposed again");
                                }
                            }
                            _ => self.perform(&mut t, &id, work),
                        }
                    }
                    let known = std::mem::take(&mut t.known);
                    if let Some((store, from)) = &t.journal {
                        journal::catch_up(&self.shared, p, store.clone(), *from, (t.resume, t.clock), known);
                    }
                    let backing =
                        t.store
                            .clone()
                            .zip(self.shared.keeper.as_ref())
                            .map(|(store, k)| crate::view::Backing {
                                store,
                                progress: k.progress().clone(),
                            });
                    // The schedules first: once the view holds the partition, a request for one
                    // of them is answered here.
                    self.shared.view.take_schedules(p, t.scheds.all.clone());
                    let shares = t.batches.all.iter().map(|(id, s)| (id.clone(), s.clone())).collect();
                    self.shared.view.apply_batches(p, shares, true);
                    self.shared.view.take(p, std::mem::take(&mut t.records), backing);
                    self.owners.insert(p, t);
                }
                Err(e) => {
                    tracing::error!(partition = p, error = %e, "cannot restore the partition; trying again");
                    self.restoring.insert(p, Restoring::Failed(Instant::now()));
                }
            }
        }
    }

    /// Moves the consumer back to the committed offset, so uncommitted inputs are read again: the
    /// partition is paused now, and sought there and resumed at the next turn's assignment check
    /// ([`Worker::retry_rewinds`]), which asks for the committed offsets of all the partitions to
    /// rewind side by side. Until that offset can be read, the partition stays paused: going back
    /// to the beginning would hand old events to instances started since.
    fn rewind(&mut self, topic: &str, p: i32) {
        self.pause(topic, p);
    }

    fn pause(&mut self, topic: &str, p: i32) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, p);
        if let Err(e) = self.consumers.of(topic).pause(&tpl) {
            tracing::warn!(topic, partition = p, error = %e, "cannot pause");
        }
        self.rewinding.insert((topic.to_string(), p));
    }

    /// Rewinds the paused partitions whose committed offset can be read now, and resumes them.
    fn retry_rewinds(&mut self) {
        let assigned = self.assigned();
        let commands = self.shared.topics.commands.clone();
        let pending: Vec<(String, i32)> = self.rewinding.drain().filter(|k| assigned.contains(k)).collect();
        // A partition being restored stays paused: the restore's end reads it on from there.
        let (pending, held): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|(t, p)| !(*t == commands && self.restoring.contains_key(p)));
        self.rewinding.extend(held);
        // The committed offsets are asked for side by side: the loop waits for the slowest answer
        // (at most REWIND_TIMEOUT), not for their sum.
        let answers: Vec<((String, i32), Result<i64, String>)> = {
            let consumers = &self.consumers;
            std::thread::scope(|s| {
                let asks: Vec<_> = pending
                    .into_iter()
                    .map(|key| {
                        let ask = key.clone();
                        let h = s.spawn(move || consumers.committed(&ask.0, ask.1, REWIND_TIMEOUT));
                        (key, h)
                    })
                    .collect();
                asks.into_iter()
                    .map(|(key, h)| {
                        let o = h.join().unwrap_or_else(|p| Err(panic_text(p.as_ref())));
                        (key, o)
                    })
                    .collect()
            })
        };
        for ((topic, p), o) in answers {
            let Ok(o) = o else {
                self.rewinding.insert((topic, p));
                continue;
            };
            let off = if o == 0 { Offset::Beginning } else { Offset::Offset(o) };
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, p);
            let c = self.consumers.of(&topic);
            match c
                .resume(&tpl)
                .map_err(|e| e.to_string())
                .and_then(|()| c.seek(&topic, p, off, REWIND_TIMEOUT).map_err(|e| e.to_string()))
            {
                Ok(()) => tracing::info!(topic, partition = p, offset = o, "rewound and resumed"),
                Err(e) => {
                    tracing::warn!(topic, partition = p, error = %e, "cannot rewind yet");
                    let _ = c.pause(&tpl);
                    self.rewinding.insert((topic, p));
                }
            }
        }
    }

    /// Does, once a decision is committed, what it asked for outside the transaction: calls,
    /// timers, and stopping calls no longer wanted. A worker task is on its task list topic since
    /// the decision committed, and subflow starts and sent events went in the transaction.
    fn perform(&self, t: &mut Owner, id: &str, work: Work) {
        match work {
            Work::Call { call, .. } => {
                let (instance, op) = (call.instance.clone(), call.op.clone());
                let fut = self.shared.host.invoke(call);
                let tx = self.results_tx.clone();
                let key = (instance.clone(), op.clone());
                let h = self.shared.rt.spawn(async move {
                    let result = fut.await;
                    let _ = tx.send(CallDone { instance, op, result });
                });
                t.in_flight.insert(key, h.abort_handle());
            }
            Work::ArmTimer { .. } | Work::CancelTimer { .. } => t.track(id, work),
            Work::Stop { op, .. } => {
                if let Some(h) = t.in_flight.remove(&(id.to_string(), op)) {
                    h.abort();
                }
            }
            Work::Task { .. } | Work::StartChild(_) | Work::Send { .. } => {}
        }
    }

    /// Decides and routes the batches of every partition side by side: each partition has its
    /// own transactional producer, so their commits overlap instead of queueing. The batch of an
    /// events partition rides in the transaction of the owned commands partition most of its
    /// events are for (those are applied there directly); only a worker that owns no commands
    /// partition routes in a transaction of its own.
    fn process(&mut self, groups: Vec<((String, i32), Vec<OwnedMessage>)>) {
        let commands = self.shared.topics.commands.clone();
        let mut batches: HashMap<i32, Vec<OwnedMessage>> = HashMap::new();
        let mut event_batches = Vec::new();
        for ((topic, p), msgs) in groups {
            if self.rewinding.contains(&(topic.clone(), p)) {
                // Polled before the pause: read again after the rewind.
                continue;
            }
            if topic == commands {
                if self.owners.contains_key(&p) {
                    batches.entry(p).or_default().extend(msgs);
                }
            } else if self.routers.contains_key(&(topic.clone(), p)) {
                event_batches.push(((topic, p), msgs));
            }
        }
        let local: BTreeSet<i32> = self.owners.keys().copied().collect();
        let ready: BTreeSet<i32> = self
            .owners
            .iter()
            .filter(|(_, t)| t.barrier.is_none())
            .map(|(p, _)| *p)
            .collect();
        let commanded: BTreeSet<i32> = batches.keys().copied().collect();
        let Routing {
            mut hosted,
            hosted_by,
            solo: routed_alone,
        } = route_events(
            &self.shared,
            &local,
            &ready,
            &self.outstanding,
            &commanded,
            event_batches,
        );
        // Batches routed in their own transaction: (events partition, router, records, last offset).
        type Solo = ((String, i32), Router, Vec<Out>, i64, Option<i64>);
        let mut solo: Vec<Solo> = Vec::new();
        for (k, outs, last, at) in routed_alone {
            if let Some(r) = self.routers.remove(&k) {
                solo.push((k, r, outs, last, at));
            }
        }
        let mut owned = Vec::new();
        let busy: BTreeSet<i32> = batches.keys().chain(hosted.keys()).copied().collect();
        for p in busy {
            if let Some(t) = self.owners.remove(&p) {
                let msgs = batches.remove(&p).unwrap_or_default();
                owned.push((p, t, msgs, hosted.remove(&p).unwrap_or_default()));
            }
        }
        let me = &*self;
        type Forwarded = Vec<((String, i32), i32, i64)>;
        type Decided = (i32, Owner, Forwarded, Result<Applied, String>);
        type Routed = ((String, i32), Router, Result<(), String>);
        // The partitions whose thread panicked: their owner or router went with it.
        let mut panicked_owners: Vec<(i32, Forwarded, String)> = Vec::new();
        let mut panicked_routers: Vec<((String, i32), String)> = Vec::new();
        let (decided, routed): (Vec<Decided>, Vec<Routed>) = std::thread::scope(|s| {
            let ht: Vec<_> = owned
                .into_iter()
                .map(|(p, mut t, msgs, extra)| {
                    let fw = extra.forwarded.clone();
                    let h = s.spawn(move || {
                        let forwarded = extra.forwarded.clone();
                        let r = me.decide(&mut t, msgs, extra);
                        (p, t, forwarded, r)
                    });
                    (p, fw, h)
                })
                .collect();
            let hr: Vec<_> = solo
                .into_iter()
                .map(|(k, mut r, outs, last, at)| {
                    let key = k.clone();
                    let h = s.spawn(move || {
                        let res = me.route(&mut r, &k.0, k.1, &outs, last, at);
                        (k, r, res)
                    });
                    (key, h)
                })
                .collect();
            let mut decided = Vec::new();
            for (p, fw, h) in ht {
                match h.join() {
                    Ok(d) => decided.push(d),
                    Err(panic) => panicked_owners.push((p, fw, panic_text(panic.as_ref()))),
                }
            }
            let mut routed = Vec::new();
            for (k, h) in hr {
                match h.join() {
                    Ok(r) => routed.push(r),
                    Err(panic) => panicked_routers.push((k, panic_text(panic.as_ref()))),
                }
            }
            (decided, routed)
        });
        // A panic is a bug of ours: said loudly and counted, and no input is skipped. The batch's
        // transaction was aborted or never committed; its inputs are read again from the committed
        // offsets (a restore, for an owner, which its panic took with it).
        for (p, forwarded, why) in panicked_owners {
            // It may have panicked after its commit.
            note_uncertain(&mut self.outstanding, forwarded);
            tracing::error!(
                partition = p,
                panic = why,
                "a decision panicked; the partition is restored and its inputs read again"
            );
            if let Some(o) = sm4c_host::metrics::observer() {
                o.kafka_panic("decide");
            }
            self.shared.view.release(p);
            self.rewind(&commands, p);
            let hosted: Vec<(String, i32)> = hosted_by
                .iter()
                .filter(|(_, host)| *host == p)
                .map(|(k, _)| k.clone())
                .collect();
            for (topic, e) in hosted {
                self.rewind(&topic, e);
            }
        }
        for ((topic, p), why) in panicked_routers {
            tracing::error!(
                topic,
                partition = p,
                panic = why,
                "routing panicked; the events are read again"
            );
            if let Some(o) = sm4c_host::metrics::observer() {
                o.kafka_panic("route");
            }
            self.rewind(&topic, p);
        }
        for (p, t, forwarded, r) in decided {
            match r {
                Ok(applied) => {
                    self.owners.insert(p, t);
                    note_committed(&mut self.outstanding, p, applied, forwarded);
                }
                Err(e) => {
                    // The commit may have failed after the broker committed (an ambiguous
                    // outcome): what the batch forwarded is awaited as if it had.
                    note_uncertain(&mut self.outstanding, forwarded);
                    tracing::warn!(partition = p, error = %e, "batch not committed; the partition is restored and its inputs read again");
                    let hosted: Vec<(String, i32)> = hosted_by
                        .iter()
                        .filter(|(_, host)| *host == p)
                        .map(|(k, _)| k.clone())
                        .collect();
                    self.restore_owner(p, t, &hosted);
                }
            }
        }
        for ((topic, p), r, res) in routed {
            match res {
                Ok(()) => {
                    self.routers.insert((topic, p), r);
                }
                Err(e) => {
                    // The router is made again at the next assignment check: a producer whose
                    // transaction could not be aborted (the broker gone, or this one fenced) begins
                    // no other, and a new one's init aborts what the old one left open.
                    tracing::warn!(topic, partition = p, error = %e, "routing batch not committed; read again");
                    self.rewind(&topic, p);
                    drop(r);
                }
            }
        }
    }

    /// Lets go of owner `t` of partition `p` after a transaction of its failed, so that it is
    /// restored with a new producer (whose init fences this one's) and its inputs, and those of the
    /// events partitions `hosted` it decided, are read again from their committed offsets.
    fn restore_owner(&mut self, p: i32, mut t: Owner, hosted: &[(String, i32)]) {
        let commands = self.shared.topics.commands.clone();
        for (_, h) in t.in_flight.drain() {
            h.abort();
        }
        drop(t);
        // The restore may clear the local store the API reads this partition from.
        self.shared.view.release(p);
        self.rewind(&commands, p);
        for (topic, e) in hosted {
            self.rewind(topic, *e);
        }
    }

    /// Commits a routing batch in the events partition's own transaction, its records stamped
    /// `at` (the latest timestamp of the events it routes).
    fn route(
        &self,
        r: &mut Router,
        topic: &str,
        p: i32,
        outs: &[Out],
        last: i64,
        at: Option<i64>,
    ) -> Result<(), String> {
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset(topic, p, Offset::Offset(last + 1))
            .map_err(|e| e.to_string())?;
        commit(&self.shared, &self.consumers, r.txn.as_ref(), outs, &offsets, at)?;
        if !outs.is_empty() {
            r.settle.wrote();
            if let Some(q) = outs
                .iter()
                .find(|o| o.topic == self.shared.topics.commands)
                .and_then(|o| o.partition)
            {
                r.last_target = q;
            }
        }
        Ok(())
    }

    /// One batch of commands for one partition, committed in one transaction.
    fn decide(&self, t: &mut Owner, msgs: Vec<OwnedMessage>, hosted: Carried) -> Result<Applied, String> {
        let shared = self.shared.clone();
        let decide_started = Instant::now();
        // Decided at the time the inputs carry (stream time), not at this worker's clock: a record
        // without a timestamp takes the partition's stream time.
        let stream = t.stream_ms;
        let records = msgs.iter().map(|m| {
            let at = m.timestamp().to_millis().unwrap_or(stream);
            (m.offset(), at, m.payload().unwrap_or_default())
        });
        let mut b = decision::decide(&shared, t, records, hosted, stream);
        // An instance read from the local store while it was failing may have been taken for
        // one that does not exist: such a batch is not committed, and the partition is restored.
        let failed = [
            t.corr.kept.failed.take(),
            t.parking.subs.failed.take(),
            t.ended.kept.failed.take(),
        ];
        if let Some(why) = t.unreadable.take().or(failed.into_iter().flatten().next()) {
            return Err(why);
        }
        if let (Some(store), Some(k)) = (&t.store, &shared.keeper) {
            if t.evicted && k.progress().broken(t.partition, store) {
                return Err("the local store could not be written, and instances are read from it".into());
            }
        }
        let mut offsets = TopicPartitionList::new();
        for (topic, p, o) in &b.offsets {
            offsets
                .add_partition_offset(topic, *p, Offset::Offset(*o))
                .map_err(|e| e.to_string())?;
        }
        tracing::debug!(
            partition = t.partition,
            commands = msgs.len(),
            decide_us = decide_started.elapsed().as_micros() as u64,
            "decided"
        );
        commit(&shared, &self.consumers, t.txn.as_ref(), &b.outs, &offsets, Some(b.at))?;
        // The keeper's ticket of this transaction's state write: the API reads its records from
        // memory until the store has them.
        let mut ticket = 0;
        if let Some(store) = &t.store {
            let delivered = crate::wire::delivered(&shared.topics.state, t.partition).filter(|d| *d >= t.checkpoint);
            let index = std::mem::take(&mut b.index);
            let (changes, checkpoint) = local_changes(&shared, t.partition, &b.outs, index, delivered);
            if let Some(k) = &shared.keeper {
                ticket = k.keep(t.partition, store.clone(), changes, checkpoint);
                t.last_ticket = ticket;
                let written = k.progress().written(t.partition);
                for kept in [&mut t.corr.kept, &mut t.parking.subs, &mut t.ended.kept] {
                    kept.handed(ticket);
                    kept.prune(written);
                }
            }
            if let Some(d) = delivered {
                t.checkpoint = t.checkpoint.max(d + 1);
                t.checkpoint_at = Instant::now();
            }
        }
        if let Some(o) = sm4c_host::metrics::observer() {
            o.kafka_parked(t.partition, t.parking.parked.len());
        }
        if let (Some((store, _)), Some(k)) = (&t.journal, &shared.keeper) {
            let p = t.partition;
            let delivered = crate::wire::delivered(&shared.topics.journal, p);
            k.keep(
                p,
                store.clone(),
                journal::changes(&b),
                shared.journals.checkpoint(p, delivered),
            );
            let deleted = b
                .records
                .iter()
                .filter(|(_, r)| r.is_none())
                .map(|(id, _)| journal::prefix(id));
            k.forget(p, store.clone(), deleted.collect());
        }
        for (id, _) in &b.records {
            if let Some(s) = t.slots.get_mut(id) {
                s.ticket = ticket;
            }
        }
        self.shared
            .view
            .apply(t.partition, std::mem::take(&mut b.records), ticket);
        self.shared.view.apply_schedules(
            t.partition,
            std::mem::take(&mut b.schedules),
            std::mem::take(&mut b.answers),
        );
        self.shared
            .view
            .apply_batches(t.partition, std::mem::take(&mut b.batches), false);
        let (after, applied) = t.committed(b);
        // Committed: now act.
        for (id, work) in after {
            self.perform(t, &id, work);
        }
        Ok(applied)
    }

    /// Restores again each owned partition whose local store could not be written (the writer
    /// cleared it, and the API and the owner read the partition's records there) or read (an
    /// instance the owner let go of, or a timer's check of one, could not be read back). The
    /// restore rebuilds the store from the state partition; the API answers for the partition
    /// again once it ends.
    fn restore_broken_stores(&mut self) {
        let Some(progress) = self.shared.keeper.as_ref().map(|k| k.progress().clone()) else {
            return;
        };
        let broken: Vec<(i32, String)> = self
            .owners
            .values()
            .filter_map(|t| match &t.unreadable {
                Some(why) => Some((t.partition, why.clone())),
                None => t
                    .store
                    .as_ref()
                    .filter(|s| progress.broken(t.partition, s))
                    .map(|_| (t.partition, "the local store could not be written".to_string()))
                    .or_else(|| {
                        t.journal
                            .as_ref()
                            .filter(|(s, _)| progress.broken(t.partition, s))
                            .map(|_| (t.partition, "the local journal could not be written".to_string()))
                    }),
            })
            .collect();
        for (p, why) in broken {
            tracing::warn!(partition = p, why, "the partition is restored again");
            self.drop_owner(p);
        }
    }

    /// Drops the owner of partition `p` and what the API holds of it: revoked, or restored again
    /// at the next assignment check (which may clear the local store the API reads).
    fn drop_owner(&mut self, p: i32) {
        if let Some(t) = self.owners.remove(&p) {
            for (_, h) in t.in_flight {
                h.abort();
            }
        }
        self.shared.view.release(p);
    }

    /// Proposes a timer command for each timer that came due ([`Owner::due`]).
    fn fire_timers(&mut self) {
        let now = now_ms();
        let n = self.shared.partitions;
        let shared = self.shared.clone();
        let horizon_ms = shared.cfg.timer_horizon_ms;
        for t in self.owners.values_mut() {
            let written = shared
                .keeper
                .as_ref()
                .map_or(u64::MAX, |k| k.progress().written(t.partition));
            t.advance_timers(now, horizon_ms, written);
            for id in t.scheds.due(now) {
                if let Err(e) = produce(&self.shared.plain, &schedules::tick_command(&shared, &id)) {
                    tracing::warn!(error = %e, schedule = id, "cannot propose a schedule's tick; trying again");
                }
            }
            for id in t.batches.due(now) {
                if let Err(e) = produce(&self.shared.plain, &batches::tick_command(&shared, t.partition, &id)) {
                    tracing::warn!(error = %e, batch = id, "cannot propose a batch's tick; trying again");
                }
            }
            for c in t.due(&shared, now) {
                let (Command::Timer { id, .. } | Command::Result { id, .. }) = &c else {
                    continue;
                };
                if let Err(e) = produce(
                    &self.shared.plain,
                    &command(&self.shared, partition_of(id, n), Some(id), &c),
                ) {
                    tracing::warn!(error = %e, "cannot propose a timer; trying again");
                }
            }
        }
    }

    fn result(&mut self, done: CallDone) {
        let p = partition_of(&done.instance, self.shared.partitions);
        let outcome = match done.result {
            Ok(v) => Outcome::Ok(v),
            Err(e) => Outcome::Err(e),
        };
        let c = match self.owners.get_mut(&p) {
            Some(t) => {
                t.in_flight.remove(&(done.instance.clone(), done.op.clone()));
                t.answered(&done.instance, &done.op, outcome, now_ms())
            }
            // Not ours any more: the new owner makes the call again.
            None => Command::Result {
                id: done.instance.clone(),
                op: done.op,
                outcome,
            },
        };
        if let Err(e) = produce(&self.shared.plain, &command(&self.shared, p, Some(&done.instance), &c)) {
            tracing::warn!(error = %e, "cannot hand back a call result");
        }
    }

    /// Proposes a tick to each partition that has a parked event or a tally entry due to expire.
    /// Only then: an idle partition holding one unmatched broadcast must not cost the broker a
    /// transaction twice a second for the tally's whole retention.
    ///
    /// Also a partition idle for [`KafkaConfig::offsets_refresh_ms`](super::KafkaConfig) gets one:
    /// its transaction commits the partition's offsets on `P.commands` and `P.clock` again. The
    /// group subscribes to no clock partition, so the broker expires their offsets
    /// `offsets.retention.minutes` after the last commit even while the group lives (KIP-211), and
    /// a partition restored without its clock's offset would set all its state aside.
    fn tick(&mut self) {
        self.restore_broken_stores();
        self.shared.view.prune();
        if let Some(k) = &self.shared.keeper {
            let keep = self.shared.cfg.cached_instances / self.owners.len().max(1);
            for t in self.owners.values_mut() {
                t.evict(keep, k.progress().written(t.partition));
            }
        }
        let now = now_ms();
        for t in self.owners.values_mut() {
            if t.checkpoint_at.elapsed() < LOCAL_REFRESH || t.checkpoint <= 0 {
                continue;
            }
            t.checkpoint_at = Instant::now();
            let (Some(store), Some(k)) = (&t.store, &self.shared.keeper) else {
                continue;
            };
            let again = Checkpoint {
                offset: t.checkpoint,
                written_ms: now,
            };
            k.keep(t.partition, store.clone(), Vec::new(), Some(again));
        }
        let window = self.shared.cfg.event_window_ms;
        let refresh = Duration::from_millis(self.shared.cfg.offsets_refresh_ms.max(1000) as u64);
        let retention = self.shared.cfg.retention_ms;
        for t in self.owners.values_mut() {
            // This worker's clock says when something may be due; the tick names what, and
            // its decision follows the partition's stream time (issue 34, item 5).
            let due = t.tick_at(now, window, retention);
            // An instance to fail for an unreadable record is failed in a batch of its own.
            let idle = t.last_commit.elapsed() >= refresh || !t.corrupt.is_empty();
            if idle || due.is_some() {
                match produce(
                    &self.shared.plain,
                    &command(&self.shared, t.partition, None, &Command::Tick { at: due }),
                ) {
                    // The refresh counts from the tick's proposal; a tick not proposed is proposed
                    // again at the next turn.
                    Ok(()) if idle => t.last_commit = Instant::now(),
                    Ok(()) => {}
                    Err(e) => {
                        tracing::warn!(partition = t.partition, error = %e, "cannot propose a tick; proposed again shortly")
                    }
                }
            }
        }
        // Settling transactions end side by side: a slow broker costs the loop one commit's
        // time, not one per partition.
        let owners_due: Vec<i32> = self
            .owners
            .values_mut()
            .filter_map(|t| (t.txn.is_some() && t.settle.due(true)).then_some(t.partition))
            .collect();
        let routers_due: Vec<(String, i32)> = self
            .routers
            .iter_mut()
            .filter_map(|(k, r)| (r.txn.is_some() && r.settle.due(false)).then(|| k.clone()))
            .collect();
        let (failed_owners, failed_routers) = {
            let (me, shared, consumers) = (&*self, &self.shared, &self.consumers);
            std::thread::scope(|s| {
                let owners: Vec<_> = owners_due
                    .iter()
                    .filter_map(|p| me.owners.get(p))
                    .map(|t| {
                        let h = s.spawn(move || {
                            // The owner's settling transaction commits the partition's clock
                            // offset again, as its last transaction did: it changes nothing, and
                            // it ends.
                            let mut offsets = TopicPartitionList::new();
                            offsets
                                .add_partition_offset(&shared.topics.clock, t.partition, Offset::Offset(t.clock))
                                .map_err(|e| e.to_string())
                                .and_then(|()| commit(shared, consumers, t.txn.as_ref(), &[], &offsets, None))
                        });
                        (t.partition, h)
                    })
                    .collect();
                let routers: Vec<_> = routers_due
                    .iter()
                    .filter_map(|k| me.routers.get(k).map(|r| (k, r)))
                    .map(|(k, r)| {
                        let h = s.spawn(move || {
                            // A router has no offset it may commit again (an owner's transaction
                            // may have taken its events partition further since): its settling
                            // transaction ticks the commands partition it last wrote to, whose
                            // owner then settles as well.
                            let tick = command(shared, r.last_target, None, &Command::Tick { at: None });
                            let none = TopicPartitionList::new();
                            commit(shared, consumers, r.txn.as_ref(), &[tick], &none, None)
                        });
                        (k.clone(), h)
                    })
                    .collect();
                let joined =
                    |r: std::thread::Result<Result<(), String>>| r.unwrap_or_else(|p| Err(panic_text(p.as_ref())));
                let failed_owners: Vec<(i32, String)> = owners
                    .into_iter()
                    .filter_map(|(p, h)| joined(h.join()).err().map(|e| (p, e)))
                    .collect();
                let failed_routers: Vec<((String, i32), String)> = routers
                    .into_iter()
                    .filter_map(|(k, h)| joined(h.join()).err().map(|e| (k, e)))
                    .collect();
                (failed_owners, failed_routers)
            })
        };
        for (p, e) in failed_owners {
            tracing::warn!(partition = p, error = %e, "a settling transaction failed; the partition is restored with a new producer");
            if let Some(t) = self.owners.remove(&p) {
                self.restore_owner(p, t, &[]);
            }
        }
        let failed: Vec<(String, i32)> = failed_routers
            .into_iter()
            .map(|((topic, p), e)| {
                tracing::warn!(topic, partition = p, error = %e, "a router's settling transaction failed; the router is made again");
                (topic, p)
            })
            .collect();
        for (topic, p) in failed {
            // Made again at the next assignment check, with a new producer that fences this one.
            self.routers.remove(&(topic.clone(), p));
            self.rewind(&topic, p);
        }
    }
}
