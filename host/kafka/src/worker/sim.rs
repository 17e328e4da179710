//! A deterministic simulation of the Kafka semantics the worker rests on, run against the worker's
//! own decision and restore code.
//!
//! No broker this project can install shows that the design is exactly-once (tansu shows aborted
//! records to `read_committed` readers and does not fence by group generation), so the guarantees
//! are checked here, in the manner of FoundationDB's simulation and TigerBeetle's VOPR:
//!
//! - **The model** ([`Broker`]): partitioned logs with offsets; transactional producers fenced by
//!   transactional id and epoch (`init_transactions` aborts the open transaction of a previous
//!   epoch); `read_committed` reads that stop at the last stable offset and hide aborted records
//!   (or, like tansu, show them); two consumer groups (the commands topic's and the events
//!   topic's), each with its own generation, and transactional offset commits refused for a stale
//!   generation of their group (KIP-447); rebalances of one group or both, cooperative (a worker
//!   keeps what it is not told to give up) or, for some seeds, eager (a worker gives up all of a
//!   group's partitions at each rebalance and is assigned its share again); idempotent plain
//!   producers; compaction of the state topic below the last stable offset; for some seeds,
//!   markers that land late as on tansu ([`Broker::late`]: a committed transaction held
//!   invisible until a later one on its partition ends), which the workers' stall guard, run with
//!   its own rules, must end where nothing else does.
//! - **The workers** are the real code with the IO taken out: [`decision::decide`] decides each
//!   batch, [`Latest`] restores a partition from the state topic, [`Owner::committed`],
//!   [`Owner::track`] and [`Owner::due_timers`] do what the worker loop does after a commit and on
//!   its timers. Only the transport is the simulation's: it reads the model's logs, produces into
//!   its transactions and commits them.
//! - **A schedule of starts** ([`SCHEDULE`], every 10 s until [`SCHEDULE_FOR`] after the start,
//!   of a definition that ends at once) runs beside them: its owner proposes its ticks as the
//!   worker loop does, and its runs hash to every partition.
//! - **A schedule**, drawn from a seed, interleaves client requests (starts, events, each
//!   sometimes repeated), batches, timers, call results (sometimes repeated), the passing of
//!   time, workers killed at any record of a transaction and restarted, partitions moved to
//!   another worker while the old one still runs (a zombie), and transactions the broker aborts;
//!   for some seeds, a decision that panics every time for one instance ([`panics`]).
//!   Then every worker comes back and the cluster runs until every instance has ended.
//! - **The checks**, on what a real `read_committed` reader of Apache Kafka would see: every
//!   instance started once and ended once, every sent event committed exactly once, every
//!   instance's journal gapless with each input taken once, every timer fired at most once, every
//!   call made, every dead letter once; the schedule started each of its nominal times from its
//!   first run to its end exactly once (its catch-up window spans the whole run), knows it did,
//!   and heard that each run ended.
//!
//! `SM4C_SIM_SEEDS=N` runs more seeds than CI does (from seed `SM4C_SIM_FROM`, 0 by default, to
//! split a long run over processes); `SM4C_SIM_SEED=S` replays seed `S` and prints its schedule. A
//! failure names its seed and how to replay it.

use super::decision;
use super::restore::Latest;
use super::{note_committed, note_uncertain, route_events, Out, Outstanding, Owner};
use crate::wire::{partition_of, Command, JournalRecord, Outcome, Quiet, StateRecord, CLOCK_HEADER};
use crate::{KafkaConfig, Shared, Topics};
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
use rdkafka::Timestamp;
use serde_json::{json, Value};
use sm4c_host::driver::{Driver, Work};
use sm4c_host::local::{LocalStores, MemoryStores};
use sm4c_host::service::Registry;
use sm4c_host::{BoxFuture, FunctionCall, Functions};
use sm4c_runtime::{Entry, ErrorInfo, Input, LoadOptions, Trace};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};

const PARTITIONS: i32 = 4;
/// The simulated schedule's id, and how long after the start it ends (ms): past it the heal's
/// rounds of 5 s go, so every seed sees it end.
const SCHEDULE: &str = "every";
const SCHEDULE_FOR: i64 = 600_000;
/// How often it starts its definition (ms).
const SCHEDULE_EVERY: i64 = 10_000;
/// Instances per seed: at least the first, plus up to the second.
const INSTANCES: (usize, usize) = (50, 20);
/// Steps of a seed's schedule before it heals: at least the first, plus up to the second.
const STEPS: (usize, usize) = (1000, 500);

/// What the broker does to the first transaction of a worker's turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Aborts it.
    Abort,
    /// Commits it, and the worker is told it failed.
    Ambiguous,
    /// The worker's thread panics halfway through producing its records (a bug outside the code
    /// that fails one instance): the transaction is left open, and the worker goes on as it does
    /// after a panic, restoring the partition (or making the router again) and reading its inputs
    /// again from the committed offsets.
    Panic,
}
/// Partitions of the events topic.
const EVENTS: i32 = 2;
const WORKERS: usize = 3;
/// A rebalance of both groups (a worker joins or leaves both).
const BOTH: [bool; 2] = [true, true];

/// The definition every simulated instance runs: a function call, then a wait for a `go` event
/// with a timeout, then a sent event that says which came first.
fn definition() -> Value {
    json!({
        "id": "sim",
        "version": "1.0",
        "name": "Simulated order",
        "functions": [ { "name": "charge", "operation": "http://example.org/payments.json#charge" } ],
        "events": [
            {
                "name": "go", "type": "sim.go", "source": "client",
                "correlation": [ { "contextAttributeName": "order", "contextAttributeValue": "${ \"i\" + (.n | tostring) }" } ]
            },
            { "name": "done", "type": "sim.done", "source": "sm4c/sim" }
        ],
        "states": [
            {
                "name": "Charge",
                "start": true,
                "enterAction": {
                    "name": "charge", "type": "invokeFunction", "functionName": "charge",
                    "arguments": { "n": "${ .n }" }, "waitForCompletion": true
                },
                "enterResultHandler": "${ .charged = ($value | .charge) }",
                "transitions": [ { "nextState": "Check" } ]
            },
            {
                "name": "Check",
                "enterAction": {
                    "type": "invokeSubflow", "subflowName": "sim-child", "waitForCompletion": true,
                    "arguments": { "n": "${ .n }" }
                },
                "enterResultHandler": "${ .checked = ($value | .checked) }",
                "transitions": [ { "nextState": "Wait" } ]
            },
            {
                "name": "Wait",
                "transitions": [
                    { "nextState": "Went", "eventGroups": [ { "events": [ "go" ] } ] },
                    { "nextState": "Slept", "timeout": "PT30S" }
                ]
            },
            {
                "name": "Went",
                "enterAction": { "type": "sendEvent", "event": "done", "expression": "${ { n: .n, how: \"event\" } }" },
                "final": true
            },
            {
                "name": "Slept",
                "enterAction": { "type": "sendEvent", "event": "done", "expression": "${ { n: .n, how: \"timer\" } }" },
                "final": true
            }
        ]
    })
}

/// The subflow: it waits a moment, then ends with its data.
fn child() -> Value {
    json!({
        "id": "sim-child",
        "version": "1.0",
        "name": "Simulated check",
        "states": [
            {
                "name": "Pause",
                "start": true,
                "transitions": [ { "nextState": "Done", "timeout": "PT10S" } ]
            },
            { "name": "Done", "final": true, "enterResultHandler": "${ .checked = true }" }
        ]
    })
}

/// How many `step` events a [`sequence`] instance takes, one after another.
const STEPS_PER_SEQUENCE: u32 = 3;

/// A definition that takes [`STEPS_PER_SEQUENCE`] `step` events of one source in turn, each
/// within 2 minutes (a step parked past its event window, when its instance's start came late, is
/// dead-lettered): the order in which its instances take them is checked against the order they
/// were produced.
fn sequence() -> Value {
    let wait = |name: &str, next: &str| {
        json!({"name": name, "transitions": [
            { "nextState": next, "eventGroups": [ { "events": [ "step" ] } ] },
            { "nextState": "Late", "timeout": "PT2M" }
        ]})
    };
    let mut one = wait("One", "Two");
    one["start"] = json!(true);
    json!({
        "id": "sim-seq",
        "version": "1.0",
        "name": "Simulated sequence",
        "events": [
            {
                "name": "step", "type": "sim.step", "source": "client",
                "correlation": [ { "contextAttributeName": "order", "contextAttributeValue": "${ \"s\" + (.n | tostring) }" } ]
            }
        ],
        "states": [
            one, wait("Two", "Three"), wait("Three", "Done"),
            { "name": "Done", "final": true }, { "name": "Late", "final": true }
        ]
    })
}

/// Never called: the simulation performs calls itself.
struct NoFunctions;

impl Functions for NoFunctions {
    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
        Box::pin(async move { Ok(call.arguments) })
    }
}

pub(super) fn shared(rt: &tokio::runtime::Runtime) -> Shared {
    let mut cfg = KafkaConfig::new("");
    cfg.prefix = "sim".into();
    cfg.partitions = PARTITIONS;
    // Far timers (the definitions' are 10 and 30 s) go through the local stores.
    cfg.timer_horizon_ms = 4_000;
    let mut registry = Registry::default();
    let tick = json!({"id": "sim-tick", "version": "1.0", "name": "Scheduled",
        "states": [{"name": "Done", "start": true, "end": true}]});
    for d in [child(), definition(), sequence(), tick] {
        let m = sm4c_runtime::load(&d, &mut sm4c_runtime::no_files, LoadOptions::default())
            .unwrap_or_else(|e| panic!("the simulation's definition does not load: {e:?}"));
        registry.insert(Arc::new(m));
    }
    // A client with no broker: the decisions never produce through it.
    let plain = rdkafka::ClientConfig::new()
        .create_with_context(Quiet)
        .unwrap_or_else(|e| panic!("cannot create a producer: {e}"));
    Shared {
        topics: Topics::new(&cfg.prefix, &[]),
        cfg,
        partitions: PARTITIONS,
        registry: RwLock::new(registry),
        host: Arc::new(NoFunctions),
        rt: rt.handle().clone(),
        plain,
        stop: AtomicBool::new(false),
        owned: AtomicUsize::new(0),
        events_read: AtomicUsize::new(0),
        cached: AtomicUsize::new(0),
        failure: Mutex::new(None),
        driver: Driver::durable(),
        breakpoints: Default::default(),
        local: None,
        keeper: None,
        members: crate::members::Members::new("sim".into(), 0, None),
        view: Default::default(),
        journals: Default::default(),
        stalls: Default::default(),
        behind: Default::default(),
        repaired: Default::default(),
        longest_turn_ms: Default::default(),
    }
}

// ---------------------------------------------------------------------------------------------
// The model of Kafka.

#[derive(Debug, Clone)]
struct Rec {
    offset: i64,
    key: Option<String>,
    payload: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
    ts: i64,
    txn: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxnState {
    Open,
    Committed,
    Aborted,
}

/// The commands group, and the events group (indexes of [`Broker::generations`]).
const COMMANDS_GROUP: usize = 0;
const EVENTS_GROUP: usize = 1;

struct Txn {
    tid: String,
    epoch: u32,
    /// The generations of both groups as the producing worker last saw them.
    generations: [u64; 2],
    state: TxnState,
    /// Offsets sent to the transaction, committed with it.
    pending: Vec<(String, i32, i64)>,
    /// When it began (virtual ms): the broker aborts it after the transaction timeout.
    began: i64,
    /// The partitions it wrote records to.
    wrote: BTreeSet<(String, i32)>,
}

/// `transaction.timeout.ms`, as the worker sets it.
const TRANSACTION_TIMEOUT_MS: i64 = 60_000;

#[derive(Default)]
struct Broker {
    /// Per topic-partition: the next offset and the records still in the log.
    logs: BTreeMap<(String, i32), (i64, Vec<Rec>)>,
    txns: Vec<Txn>,
    /// Per transactional id: its current epoch and its open transaction.
    epochs: BTreeMap<String, u32>,
    open: BTreeMap<String, usize>,
    /// The group's committed offsets.
    offsets: BTreeMap<(String, i32), i64>,
    /// The same, had none been lost ([`World::expire`]): what a repair must find.
    kept_offsets: BTreeMap<(String, i32), i64>,
    /// Each group's generation: a rebalance of the group moves it on.
    generations: [u64; 2],
    /// The topics whose offsets are committed in the events group.
    events_topics: BTreeSet<String>,
    /// Like tansu: `read_committed` readers see aborted records too.
    shows_aborted: bool,
    /// The topics of one partition (the dead letters).
    single: BTreeSet<String>,
    /// Like tansu: a committed transaction's markers land late. One that ends while another
    /// transaction is open on a partition it wrote stays *prepared* there (its records invisible
    /// to `read_committed` readers, the partition's last stable offset held at its first record)
    /// until a later transaction on that partition ends with none open there.
    late: bool,
    /// With late markers, the worst case: only the stall guard's transactions land them (as at
    /// the end of a workload on tansu, when nothing writes a held partition again), so that the
    /// guard alone must keep every `read_committed` reader going.
    stingy: bool,
    /// The (transaction, topic, partition) whose markers have not landed yet: its records there
    /// hold the partition's last stable offset.
    prepared: BTreeSet<(usize, String, i32)>,
    /// How many times a transaction was held on a partition, and how many of those the stall
    /// guard's transactions landed.
    held: usize,
    unstuck: usize,
}

impl Broker {
    fn append(&mut self, topic: &str, p: i32, o: &Out, ts: i64, txn: Option<usize>) {
        let (next, recs) = self.logs.entry((topic.to_string(), p)).or_default();
        recs.push(Rec {
            offset: *next,
            key: o.key.clone(),
            payload: o.payload.clone(),
            headers: o.headers.clone(),
            ts,
            txn,
        });
        *next += 1;
    }

    /// `init_transactions`: a new epoch for the id, which aborts its open transaction.
    fn init(&mut self, tid: &str) -> u32 {
        if let Some(i) = self.open.get(tid).copied() {
            self.abort_by(i, false);
        }
        let e = self.epochs.entry(tid.to_string()).or_default();
        *e += 1;
        *e
    }

    fn live(&self, txn: usize) -> Result<(), String> {
        let t = &self.txns[txn];
        if t.state != TxnState::Open {
            return Err(format!("transaction {txn} is {:?}", t.state));
        }
        if self.epochs.get(&t.tid) != Some(&t.epoch) {
            return Err(format!("producer {} epoch {} is fenced", t.tid, t.epoch));
        }
        Ok(())
    }

    fn begin(&mut self, tid: &str, epoch: u32, generations: [u64; 2], now: i64) -> Result<usize, String> {
        if self.epochs.get(tid) != Some(&epoch) {
            return Err(format!("producer {tid} epoch {epoch} is fenced"));
        }
        if let Some(i) = self.open.get(tid).copied() {
            self.abort_by(i, false);
        }
        self.txns.push(Txn {
            tid: tid.to_string(),
            epoch,
            generations,
            state: TxnState::Open,
            pending: Vec::new(),
            began: now,
            wrote: BTreeSet::new(),
        });
        let i = self.txns.len() - 1;
        self.open.insert(tid.to_string(), i);
        Ok(i)
    }

    fn produce(&mut self, txn: usize, o: &Out, ts: i64) -> Result<(), String> {
        self.live(txn)?;
        let p = self.partition(o);
        self.append(&o.topic.clone(), p, o, ts, Some(txn));
        self.txns[txn].wrote.insert((o.topic.clone(), p));
        Ok(())
    }

    /// Whether a transaction other than `but` is open on a partition.
    fn open_on(&self, topic: &str, p: i32, but: usize) -> bool {
        self.open
            .values()
            .any(|i| *i != but && self.txns[*i].wrote.contains(&(topic.to_string(), p)))
    }

    /// Transaction `txn` has ended, committed or aborted, by its producer (`client`, an `EndTxn`)
    /// or by the broker. An `EndTxn` that finds no other transaction open on a partition it wrote
    /// lands the markers there: its own and those of every transaction held there. With late
    /// markers, as on tansu, a transaction ended otherwise stays held on its partitions (its
    /// records, committed or aborted, hold the last stable offset): one whose `EndTxn` found
    /// another open there, and one the broker ended (fenced when its transactional id was taken
    /// over, a SIGKILLed worker's; timed out).
    fn ended(&mut self, txn: usize, client: bool) {
        let lands = client && (!self.stingy || self.txns[txn].tid.contains(".unstick."));
        for (topic, p) in self.txns[txn].wrote.clone() {
            if lands && !self.open_on(&topic, p, txn) {
                self.prepared.retain(|(_, t, q)| !(*t == topic && *q == p));
            } else if self.late && self.prepared.insert((txn, topic, p)) {
                self.held += 1;
            }
        }
    }

    /// The last stable offset: where a `read_committed` reader stops (the first record of an
    /// open transaction, else the log's end).
    fn stable_end(&self, topic: &str, p: i32) -> i64 {
        let Some((next, recs)) = self.logs.get(&(topic.to_string(), p)) else {
            return 0;
        };
        recs.iter().find(|r| self.held(topic, p, r)).map_or(*next, |r| r.offset)
    }

    /// Where a restore stops reading: the first record of an open transaction, else the log's end
    /// (past committed transactions whose markers have not landed).
    fn open_end(&self, topic: &str, p: i32) -> i64 {
        let Some((next, recs)) = self.logs.get(&(topic.to_string(), p)) else {
            return 0;
        };
        recs.iter()
            .find(|r| self.state_of(r) == TxnState::Open)
            .map_or(*next, |r| r.offset)
    }

    /// Whether `read_committed` readers stop at a record: its transaction is open, or committed
    /// and its markers have not landed on the partition yet.
    fn held(&self, topic: &str, p: i32, r: &Rec) -> bool {
        self.state_of(r) == TxnState::Open
            || r.txn
                .is_some_and(|i| self.prepared.contains(&(i, topic.to_string(), p)))
    }

    /// The partitions whose readers stop at a committed transaction whose markers have not
    /// landed: `(topic, partition, last stable offset)`.
    fn held_back(&self) -> BTreeSet<(String, i32, i64)> {
        self.prepared
            .iter()
            .map(|(_, t, p)| (t.clone(), *p, self.stable_end(t, *p)))
            .collect()
    }

    /// The largest offset of a record that producer `tid` wrote to a partition (what the
    /// producer's delivery reports told its process).
    fn last_of(&self, tid: &str, topic: &str, p: i32) -> Option<i64> {
        let (_, recs) = self.logs.get(&(topic.to_string(), p))?;
        recs.iter()
            .rev()
            .find(|r| r.txn.is_some_and(|i| self.txns[i].tid == tid))
            .map(|r| r.offset)
    }

    fn end(&self, topic: &str, p: i32) -> i64 {
        self.logs.get(&(topic.to_string(), p)).map_or(0, |(next, _)| *next)
    }

    /// The partition a record goes to: its own, else its key's, as the default partitioner does.
    fn partition(&self, o: &Out) -> i32 {
        match (o.partition, self.single.contains(&o.topic)) {
            (Some(p), _) => p,
            (None, true) => 0,
            (None, false) => partition_of(o.key.as_deref().unwrap_or(""), PARTITIONS),
        }
    }

    /// A plain (idempotent, non-transactional) produce.
    fn plain(&mut self, o: &Out, ts: i64) {
        let p = self.partition(o);
        self.append(&o.topic.clone(), p, o, ts, None);
    }

    /// `send_offsets_to_transaction`, once per group the offsets belong to: refused for a fenced
    /// producer, and (KIP-447) for a stale generation of that group, which aborts the transaction.
    fn send_offsets(&mut self, txn: usize, offsets: &[(String, i32, i64)]) -> Result<(), String> {
        self.live(txn)?;
        for g in [COMMANDS_GROUP, EVENTS_GROUP] {
            let of_group = |t: &String| self.events_topics.contains(t) == (g == EVENTS_GROUP);
            if offsets.iter().any(|(t, _, _)| of_group(t)) && self.txns[txn].generations[g] != self.generations[g] {
                self.abort(txn);
                let which = if g == EVENTS_GROUP { "events" } else { "commands" };
                return Err(format!("the {which} group's generation is stale (KIP-447)"));
            }
        }
        self.txns[txn].pending.extend(offsets.iter().cloned());
        Ok(())
    }

    /// Commits a transaction and the offsets sent to it; refused for a fenced producer.
    fn commit(&mut self, txn: usize) -> Result<(), String> {
        self.live(txn)?;
        let t = &mut self.txns[txn];
        t.state = TxnState::Committed;
        let tid = t.tid.clone();
        let pending = std::mem::take(&mut t.pending);
        self.open.remove(&tid);
        for (topic, p, o) in pending {
            self.kept_offsets.insert((topic.clone(), p), o);
            self.offsets.insert((topic, p), o);
        }
        self.ended(txn, true);
        Ok(())
    }

    /// Whether a partition's committed offset is stable: no open transaction has offsets for it
    /// (KIP-447: a fetch of committed offsets that requires stable ones waits for that).
    fn stable(&self, topic: &str, p: i32) -> bool {
        !self
            .open
            .values()
            .any(|i| self.txns[*i].pending.iter().any(|(t, q, _)| t == topic && *q == p))
    }

    /// The broker aborts the transactions open longer than their timeout (a producer that died
    /// in one, and whose transactional id nobody took up again).
    fn expire(&mut self, now: i64) {
        let old: Vec<usize> = self
            .open
            .values()
            .copied()
            .filter(|i| self.txns[*i].began + TRANSACTION_TIMEOUT_MS <= now)
            .collect();
        for i in old {
            self.abort_by(i, false);
        }
    }

    /// The producer aborts its transaction (`EndTxn`).
    fn abort(&mut self, txn: usize) {
        self.abort_by(txn, true);
    }

    /// A transaction aborted by its producer (`client`), or by the broker: fenced by a new epoch
    /// of its transactional id, timed out, or aborted on its own.
    fn abort_by(&mut self, txn: usize, client: bool) {
        let t = &mut self.txns[txn];
        if t.state == TxnState::Open {
            t.state = TxnState::Aborted;
            let tid = t.tid.clone();
            self.open.remove(&tid);
            self.ended(txn, client);
        }
    }

    fn committed_offset(&self, topic: &str, p: i32) -> i64 {
        self.offsets.get(&(topic.to_string(), p)).copied().unwrap_or(0)
    }

    fn state_of(&self, r: &Rec) -> TxnState {
        r.txn.map_or(TxnState::Committed, |i| self.txns[i].state)
    }

    /// What a `read_committed` consumer reads from `from`: up to the last stable offset, without
    /// aborted records unless the broker shows them.
    fn read(&self, topic: &str, p: i32, from: i64) -> Vec<&Rec> {
        self.read_as(topic, p, from, true)
    }

    /// [`Broker::read`], or (`markers: false`) as a restore reads the state topic: every record
    /// to the log's end, a committed transaction's whether or not its markers landed (the restore
    /// tells committed records by the committed offsets, not by what `read_committed` shows).
    fn read_as(&self, topic: &str, p: i32, from: i64, markers: bool) -> Vec<&Rec> {
        let mut out = Vec::new();
        let Some((_, recs)) = self.logs.get(&(topic.to_string(), p)) else {
            return out;
        };
        for r in recs.iter().filter(|r| r.offset >= from) {
            if markers && self.held(topic, p, r) {
                break;
            }
            match self.state_of(r) {
                TxnState::Open => break,
                TxnState::Aborted if !self.shows_aborted => {}
                _ => out.push(r),
            }
        }
        out
    }

    /// What Apache Kafka's `read_committed` readers see once every transaction has ended: the
    /// ground truth the checks use.
    fn truth(&self, topic: &str, p: i32) -> Vec<&Rec> {
        let Some((_, recs)) = self.logs.get(&(topic.to_string(), p)) else {
            return Vec::new();
        };
        recs.iter()
            .filter(|r| self.state_of(r) == TxnState::Committed)
            .collect()
    }

    /// Log compaction below the last stable offset: the latest committed record of each key stays
    /// (tombstones too), aborted records go.
    fn compact(&mut self, topic: &str, p: i32) {
        let Some((_, recs)) = self.logs.get(&(topic.to_string(), p)) else {
            return;
        };
        let stable = recs
            .iter()
            .find(|r| self.held(topic, p, r))
            .map_or(i64::MAX, |r| r.offset);
        let mut last: BTreeMap<&str, i64> = BTreeMap::new();
        for r in recs.iter().filter(|r| r.offset < stable) {
            if let (Some(k), TxnState::Committed) = (&r.key, self.state_of(r)) {
                last.insert(k, r.offset);
            }
        }
        let keep: Vec<Rec> = recs
            .iter()
            .filter(|r| {
                r.offset >= stable
                    || (self.state_of(r) == TxnState::Committed
                        && r.key.as_deref().is_some_and(|k| last.get(k) == Some(&r.offset)))
            })
            .cloned()
            .collect();
        if let Some((_, recs)) = self.logs.get_mut(&(topic.to_string(), p)) {
            *recs = keep;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The simulated cluster.

/// Spreads partitions `0..n` over the live workers: a partition of a dead worker goes to the one
/// with fewest, and the counts are evened out (sticky: a partition moves only to even them).
fn balance(map: &mut BTreeMap<i32, usize>, n: i32, alive: &[usize]) {
    if alive.is_empty() {
        map.clear();
        return;
    }
    let count = |map: &BTreeMap<i32, usize>, w: usize| map.values().filter(|x| **x == w).count();
    for p in 0..n {
        if !map.get(&p).is_some_and(|w| alive.contains(w)) {
            let least = *alive.iter().min_by_key(|w| count(map, **w)).unwrap_or(&alive[0]);
            map.insert(p, least);
        }
    }
    loop {
        let most = *alive.iter().max_by_key(|w| count(map, **w)).unwrap_or(&alive[0]);
        let least = *alive.iter().min_by_key(|w| count(map, **w)).unwrap_or(&alive[0]);
        if count(map, most) <= count(map, least) + 1 {
            break;
        }
        let Some(p) = map.iter().rev().find(|(_, w)| **w == most).map(|(p, _)| *p) else {
            break;
        };
        map.insert(p, least);
    }
}

struct SimOwner {
    t: Owner,
    epoch: u32,
    /// The consumer's position on the commands partition; `None` until it has read the
    /// partition's committed offset again, which it does once that is stable.
    pos: Option<i64>,
}

/// The router of an events partition.
struct SimRouter {
    epoch: u32,
    /// The consumer's position on the events partition (see [`SimOwner::pos`]).
    pos: Option<i64>,
}

#[derive(Default)]
struct SimWorker {
    alive: bool,
    /// The generations of both groups this worker last synced its assignment at.
    generations: [u64; 2],
    owners: BTreeMap<i32, SimOwner>,
    routers: BTreeMap<i32, SimRouter>,
    outstanding: Outstanding,
    /// Its stall guard's memory of the partitions it looks at (the worker's own rules), and the
    /// epochs of its `unstick` producers per commands partition: both gone with the process.
    watch: super::stall::Watch,
    unstick: BTreeMap<i32, u32>,
}

/// A call in flight: (worker, partition, instance, op, arguments).
type Call = (usize, i32, String, String, Value);

struct World<'a> {
    shared: &'a Shared,
    broker: Broker,
    rng: fastrand::Rng,
    now: i64,
    workers: Vec<SimWorker>,
    /// Commands partition → worker.
    assignment: BTreeMap<i32, usize>,
    /// Events partition → worker.
    events_assignment: BTreeMap<i32, usize>,
    /// (events topic?, partition) → the generation of its group that last gave it to another
    /// worker.
    moved_at: BTreeMap<(bool, i32), u64>,
    barriers: u64,
    calls: Vec<Call>,
    executed: BTreeMap<(String, String), u32>,
    started: BTreeSet<String>,
    /// Every `go` event record sent: (instance, its origin `topic/partition/offset`).
    gos: Vec<(String, String)>,
    /// Per instance a go event was sent to: whether every one went by key (none named it).
    keyed_only: BTreeMap<String, bool>,
    /// Client requests and call results that may be sent again later (a client that timed out
    /// and retried, a call answered twice): (instance, command).
    resend: Vec<(String, Command)>,
    /// The schedule so far, for a failing seed's report.
    trace: Vec<String>,
    /// Whether the broker may not take a plain produce of a timer or a call result (as when it is
    /// away longer than the producer's `message.timeout.ms`): until the cluster heals.
    lossy: bool,
    verbose: bool,
    /// Each worker's disk: its local stores, kept across kills and restarts unless the disk is
    /// lost. `None`: the seed runs without local stores (every restore reads from the beginning).
    disks: Option<Vec<Arc<MemoryStores>>>,
    /// Draws for the disks, apart from `rng` so that they do not change a seed's schedule.
    disk_rng: fastrand::Rng,
    /// Draws for the events sent before their instance starts, apart from `rng` likewise.
    early_rng: fastrand::Rng,
    /// Whether a go event names its instance (`sm4cinstanceid`) or is routed by its correlation
    /// key (`order`): a stream of its own, so the other draws of a seed stay as they were.
    keyed_rng: fastrand::Rng,
    /// How many unended instances each owner keeps in memory once its batch committed, with local
    /// stores (the others are read back from the store by what comes for them): none, one, a few,
    /// or all, drawn for the seed apart from `rng` likewise.
    cache: usize,
    /// Whether the groups rebalance eagerly (every worker gives up all of a group's partitions at
    /// each of its rebalances) rather than cooperatively; drawn apart from `rng` likewise.
    eager: bool,
    /// Each worker's clock, as an offset (ms) from the model's true clock `now`: in three seeds of
    /// four one worker runs ahead and one behind, by up to [`MAX_SKEW_MS`]; drawn apart from
    /// `rng` likewise. Used for all the worker takes from its clock: when to propose timers and
    /// ticks, the timestamps of what it produces, its timers' horizon. Clients use the true one.
    skew: [i64; WORKERS],
    /// Per commands partition, the stream time the model finds in the inputs decided so far:
    /// the latest timestamp of a record from outside (a client's, a call result, a command a
    /// transaction sent), and the due times ticks and fired timers named; never the timestamp of
    /// a worker's proposal. What a decision records must not be later ([`World::check_clock`]).
    stream: BTreeMap<i32, i64>,
    /// The first decision found against the stream time ([`World::check_clock`]).
    clock_fault: Option<String>,
    /// Per commands partition, every time something of it was due at: a parked event's window
    /// end, a broadcast tally's retention (what a tick may name).
    dues: BTreeMap<i32, BTreeSet<i64>>,
    /// A panic inside a decision ([`panics`]): the kind of command whose decision panics, every
    /// time, for one instance or its subflow.
    panicky: Option<(&'static str, String)>,
    /// The instant the stall guard's rules take for the start of the workers' clocks.
    base: std::time::Instant,
    /// Draws for the instances of [`sequence`] and their steps, apart from `rng` likewise: in one
    /// seed of two, `None` in the others (which run as they did before it).
    seq_rng: Option<fastrand::Rng>,
    /// Each started [`sequence`] instance: whether its steps go by key (else they name it), and
    /// how many it was sent.
    seqs: BTreeMap<String, (bool, u32)>,
    /// Every step sent: (instance, event id, its origin `topic/partition/offset`).
    steps: Vec<(String, String, String)>,
    /// For seeds that lose the group's offsets ([`World::expire`]): when, and which.
    expiry: Option<fastrand::Rng>,
    /// How many times a restore repaired lost offsets.
    repairs: usize,
    /// For one seed in four, the worker's thread panics now and then outside the code that fails
    /// one instance ([`Fault::Panic`]).
    loop_panics: bool,
    /// How many times a thread panicked with its transaction open.
    panicked: usize,
    /// For one seed in three, retention deletes the records of commands and events partitions
    /// that their group has consumed ([`World::retain`]); and how many it deleted.
    retention: Option<fastrand::Rng>,
    retained: usize,
}

/// The seeds that regression tests and the testing chapter name, found by mutations of the
/// worlds they ran before sequences ([`sequence`]) were added: they run no sequence, so that
/// their worlds stay as they were and the mutations still fail them.
const KEPT_SEEDS: [u64; 11] = [0, 1, 2, 6, 7, 15, 20, 21, 27, 65, 153];

/// The model's clock at the start (ms).
const START_MS: i64 = 1_700_000_000_000;

/// The panic of a seed ([`World::panicky`]): in one seed of four, deciding a command panics
/// every time it is decided, a bug of ours as the worker would meet it: the call result of one
/// instance (`result`, of instance `i<k>`), or the timer of its subflow (`timer`, of `i<k>/...`),
/// whose failure its parent then learns of. The instance is among the first
/// [`INSTANCES`]`.0`, which every seed starts.
fn panics(seed: u64) -> Option<(&'static str, String)> {
    let mut r = fastrand::Rng::with_seed(seed ^ 0x9a_41c5);
    (r.u8(..4) == 0).then(|| {
        (
            ["result", "timer"][r.usize(..2)],
            format!("i{}", r.usize(..INSTANCES.0)),
        )
    })
}

/// What a seed's panic makes of instance `id`: `Some(true)` for the one whose decision panics,
/// `Some(false)` for the parent of a subflow whose timer panics (it fails with its subflow).
fn panic_role(panicky: &Option<(&'static str, String)>, id: &str) -> Option<bool> {
    let (kind, of) = panicky.as_ref()?;
    let child = id.strip_prefix(of.as_str()).is_some_and(|r| r.starts_with('/'));
    match *kind {
        "result" => (id == of).then_some(true),
        _ if child => Some(true),
        _ => (id == of).then_some(false),
    }
}

/// While it lives, the decisions of this thread panic as the seed says ([`panics`]).
struct PanicFor;

impl PanicFor {
    fn set(target: Option<(&'static str, String)>) -> PanicFor {
        decision::tests::panic_for(target);
        PanicFor
    }
}

impl Drop for PanicFor {
    fn drop(&mut self) {
        decision::tests::panic_for(None);
    }
}

/// The most a simulated worker's clock runs ahead of the true one or behind it (ms).
const MAX_SKEW_MS: i64 = 5 * 60_000;

/// The workers' clock offsets of a seed: in three seeds of four, one worker ahead and another
/// behind, each by 1 s to [`MAX_SKEW_MS`]; else every clock right.
fn skews(seed: u64) -> [i64; WORKERS] {
    let mut r = fastrand::Rng::with_seed(seed ^ 0xc10c_5ce3);
    let mut skew = [0; WORKERS];
    if r.u8(..4) != 0 {
        let ahead = r.usize(..WORKERS);
        let behind = (ahead + 1 + r.usize(..WORKERS - 1)) % WORKERS;
        skew[ahead] = r.i64(1_000..=MAX_SKEW_MS);
        skew[behind] = -r.i64(1_000..=MAX_SKEW_MS);
    }
    skew
}

impl<'a> World<'a> {
    /// Worker `w`'s clock.
    fn clock(&self, w: usize) -> i64 {
        self.now + self.skew[w]
    }

    fn new(shared: &'a Shared, seed: u64, verbose: bool) -> World<'a> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let broker = Broker {
            shows_aborted: rng.bool(),
            single: BTreeSet::from([shared.topics.deadletter.clone()]),
            events_topics: shared.topics.events.iter().cloned().collect(),
            ..Broker::default()
        };
        let mut w = World {
            shared,
            broker,
            rng,
            now: START_MS,
            workers: (0..WORKERS).map(|_| SimWorker::default()).collect(),
            assignment: BTreeMap::new(),
            events_assignment: BTreeMap::new(),
            moved_at: BTreeMap::new(),
            barriers: 0,
            calls: Vec::new(),
            executed: BTreeMap::new(),
            started: BTreeSet::new(),
            gos: Vec::new(),
            keyed_only: BTreeMap::new(),
            resend: Vec::new(),
            trace: Vec::new(),
            lossy: true,
            verbose,
            disks: None,
            disk_rng: fastrand::Rng::with_seed(seed ^ 0x5eed_d15c),
            early_rng: fastrand::Rng::with_seed(seed ^ 0xea51_7e57),
            keyed_rng: fastrand::Rng::with_seed(seed ^ 0x6e_7ed0),
            cache: [0, 1, 3, usize::MAX][fastrand::Rng::with_seed(seed ^ 0xca_c4e).usize(..4)],
            eager: fastrand::Rng::with_seed(seed ^ 0xea6e_4e4e).u8(..4) == 0,
            skew: skews(seed),
            stream: BTreeMap::new(),
            clock_fault: None,
            dues: BTreeMap::new(),
            panicky: panics(seed),
            base: std::time::Instant::now(),
            seq_rng: Some(fastrand::Rng::with_seed(seed ^ 0x5e9_0e4d))
                .filter(|r| r.clone().bool() && !KEPT_SEEDS.contains(&seed)),
            seqs: BTreeMap::new(),
            steps: Vec::new(),
            expiry: None,
            repairs: 0,
            loop_panics: fastrand::Rng::with_seed(seed ^ 0x9a_1c5).u8(..4) == 0,
            panicked: 0,
            retention: Some(fastrand::Rng::with_seed(seed ^ 0x7e_7e47)).filter(|r| r.clone().u8(..3) == 0),
            retained: 0,
        };
        // In one seed of four the markers of a committed transaction land late, as on tansu; in
        // half of those only the stall guard's transactions land them.
        let mut late = fastrand::Rng::with_seed(seed ^ 0x1a7e_3a4c);
        w.broker.late = late.u8(..4) == 0;
        w.broker.stingy = w.broker.late && late.bool();
        // In one seed of three whose broker is Apache Kafka's kind (aborted records hidden,
        // markers written before a fenced producer's id is given again), the group's committed
        // offsets of a commands partition are lost now and then (`offsets.retention.minutes`, or
        // a reset by hand): restores must repair them from the partition's position records.
        let mut expiry = fastrand::Rng::with_seed(seed ^ 0xe8_1e5);
        if !w.broker.shows_aborted && !w.broker.late && expiry.u8(..3) == 0 && std::env::var("NOEXP").is_err() {
            w.expiry = Some(expiry);
        }
        if w.disk_rng.u8(..4) != 0 {
            w.disks = Some((0..WORKERS).map(|_| Arc::default()).collect());
        }
        for x in &mut w.workers {
            x.alive = true;
        }
        w.rebalance(BOTH, None);
        w
    }

    fn note(&mut self, s: String) {
        if self.verbose {
            eprintln!("{s}");
        }
        self.trace.push(s);
    }

    /// A rebalance of the `groups` named: partitions of dead workers go to live ones, and the
    /// live ones are balanced (sticky: a partition moves only to even the counts). `moved` forces
    /// one partition to another worker.
    fn rebalance(&mut self, groups: [bool; 2], moved: Option<(bool, i32, usize)>) {
        for (g, yes) in groups.iter().enumerate() {
            if *yes {
                self.broker.generations[g] += 1;
            }
        }
        let before = (self.assignment.clone(), self.events_assignment.clone());
        let alive: Vec<usize> = (0..WORKERS).filter(|w| self.workers[*w].alive).collect();
        for (map, n, yes) in [
            (&mut self.assignment, PARTITIONS, groups[COMMANDS_GROUP]),
            (&mut self.events_assignment, EVENTS, groups[EVENTS_GROUP]),
        ] {
            if yes {
                balance(map, n, &alive);
            }
        }
        match moved {
            Some((false, p, to)) => self.assignment.insert(p, to),
            Some((true, p, to)) => self.events_assignment.insert(p, to),
            None => None,
        };
        for (events, old, new) in [
            (false, &before.0, &self.assignment),
            (true, &before.1, &self.events_assignment),
        ] {
            let generation = self.broker.generations[usize::from(events)];
            for (p, w) in new {
                if old.get(p) != Some(w) {
                    self.moved_at.insert((events, *p), generation);
                }
            }
        }
        let a = format!("{:?} events {:?}", self.assignment, self.events_assignment);
        let g = self.broker.generations;
        self.note(format!("rebalance {groups:?}, generations {g:?}: {a}"));
    }

    /// The worker polls: it learns its assignment, drops the partitions it lost, and restores
    /// those it gained (fencing their previous owner).
    fn sync(&mut self, w: usize) {
        if !self.workers[w].alive {
            return;
        }
        let generations = self.broker.generations;
        let last = std::mem::replace(&mut self.workers[w].generations, generations);
        // Eager rebalancing: each group that rebalanced since this worker last polled took all its
        // partitions away first (the worker saw an empty assignment), then gave them out again.
        if self.eager {
            if last[COMMANDS_GROUP] != generations[COMMANDS_GROUP] {
                let all: Vec<i32> = self.workers[w].owners.keys().copied().collect();
                for p in all {
                    self.drop_owner(w, p, "revoked (eager)");
                }
            }
            if last[EVENTS_GROUP] != generations[EVENTS_GROUP] && !self.workers[w].routers.is_empty() {
                self.workers[w].routers.clear();
                self.note(format!("w{w} drops its routers (eager)"));
            }
        }
        // A partition that went to another worker and came back since this worker last polled:
        // the worker keeps what it had (it saw no change), but the consumer reads it on from the
        // committed offset, as after any new assignment.
        let moved_at = &self.moved_at;
        let moved = |events: bool, p: i32| {
            moved_at
                .get(&(events, p))
                .is_some_and(|g| *g > last[usize::from(events)])
        };
        let worker = &mut self.workers[w];
        for (p, o) in worker.owners.iter_mut() {
            if moved(false, *p) {
                o.pos = None;
            }
        }
        for (e, r) in worker.routers.iter_mut() {
            if moved(true, *e) {
                r.pos = None;
            }
        }
        let mine: BTreeSet<i32> = self
            .assignment
            .iter()
            .filter(|(_, x)| **x == w)
            .map(|(p, _)| *p)
            .collect();
        let lost: Vec<i32> = self.workers[w]
            .owners
            .keys()
            .filter(|p| !mine.contains(p))
            .copied()
            .collect();
        for p in lost {
            self.drop_owner(w, p, "revoked");
        }
        for p in mine {
            if !self.workers[w].owners.contains_key(&p) {
                self.restore(w, p);
            }
        }
        // Routers, as the worker makes them: fence the previous one, then read the committed
        // offset once it is stable (after the previous owner's last transaction).
        let events = self.shared.topics.events[0].clone();
        let mine: BTreeSet<i32> = self
            .events_assignment
            .iter()
            .filter(|(_, x)| **x == w)
            .map(|(p, _)| *p)
            .collect();
        self.workers[w].routers.retain(|e, _| mine.contains(e));
        let mut new_router = false;
        for e in mine {
            if self.workers[w].routers.contains_key(&e) {
                continue;
            }
            let epoch = self.broker.init(&self.router_tid(e));
            if !self.broker.stable(&events, e) {
                self.note(format!("w{w} router e{e}: the committed offset is not stable yet"));
                continue;
            }
            let pos = self.broker.committed_offset(&events, e);
            self.workers[w].routers.insert(e, SimRouter { epoch, pos: Some(pos) });
            self.note(format!("w{w} routes e{e} from {pos}, epoch {epoch}"));
            new_router = true;
        }
        if new_router {
            // What the previous router sent to our partitions goes first.
            let owned: Vec<i32> = self.workers[w].owners.keys().copied().collect();
            for p in owned {
                let token = self.barrier(w, p);
                if let Some(o) = self.workers[w].owners.get_mut(&p) {
                    o.t.barrier = Some(token);
                }
            }
        }
        let owned: BTreeSet<i32> = self.workers[w].owners.keys().copied().collect();
        self.workers[w].outstanding.retain(|(_, q), _| owned.contains(q));
    }

    /// Worker `w` puts a barrier command on commands partition `p` (plain), as `put_barrier`
    /// does.
    fn barrier(&mut self, w: usize, p: i32) -> String {
        self.barriers += 1;
        let token = format!("barrier-{}", self.barriers);
        let out = super::command(self.shared, p, None, &Command::Barrier { token: token.clone() });
        self.plain_lossy(&out, self.clock(w));
        token
    }

    fn router_tid(&self, e: i32) -> String {
        format!("{}.{}.{}", self.shared.cfg.group, self.shared.topics.events[0], e)
    }

    fn drop_owner(&mut self, w: usize, p: i32, why: &str) {
        self.workers[w].owners.remove(&p);
        // Its calls in flight are aborted with it.
        self.calls.retain(|c| !(c.0 == w && c.1 == p));
        self.note(format!("w{w} drops p{p}: {why}"));
    }

    fn tid(&self, p: i32) -> String {
        format!("{}.{}.{}", self.shared.cfg.group, self.shared.topics.commands, p)
    }

    fn restore(&mut self, w: usize, p: i32) {
        let shared = self.shared;
        let epoch = self.broker.init(&self.tid(p));
        let committed = self.broker.committed_offset(&shared.topics.commands, p);
        let clock = self.broker.committed_offset(&shared.topics.clock, p);
        if self.rng.u8(..4) == 0 {
            self.broker.compact(&shared.topics.state, p);
        }
        let mut state = Latest::new(committed, clock);
        // The worker's local store of the partition, read on from its checkpoint.
        let store = self.disks.as_ref().map(|d| {
            d[w].open(&format!("{}-{p}", shared.topics.state))
                .expect("a memory store opens")
        });
        // The restore streams through the store, as the worker's does.
        if let Some(s) = &store {
            state.stream(s.clone(), p, self.cache);
        }
        let mut from = 0;
        if let Some(cp) = store
            .as_ref()
            .and_then(|s| s.checkpoint().expect("a memory store reads"))
        {
            if let Some(s) = &store {
                s.each(&mut |k, v| assert!(state.known(k, v), "a kept record reads"))
                    .expect("a memory store reads");
            }
            from = cp.offset;
        }
        let records = self.broker.read_as(&shared.topics.state, p, from, false);
        let end = self.broker.open_end(&shared.topics.state, p).max(from);
        for r in records {
            let at = r
                .headers
                .iter()
                .find(|(k, _)| k == CLOCK_HEADER)
                .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse().ok());
            state.record(r.key.clone(), r.payload.as_deref(), at);
            if state.due() {
                state.write(false);
            }
        }
        if let Some(lost) = state.offsets_lost() {
            // As the worker does: repair the group's offsets from the latest committed position,
            // and restore again (reading the repaired offsets).
            if self.repair_offsets(p, lost, committed, clock) {
                self.restore(w, p);
            }
            return;
        }
        // As the worker does: a partition that never committed commits a first transaction
        // that decides nothing, its clock 1 (`restore::commit_offsets`).
        if clock == 0 && state.fresh() {
            let offsets = [
                (shared.topics.commands.clone(), p, committed),
                (shared.topics.clock.clone(), p, 1),
            ];
            let what = format!("w{w} p{p} first transaction");
            let tid = self.tid(p);
            if self
                .transact(w, &tid, epoch, &[], &offsets, &mut None, &mut Fault::None, &what, None)
                .is_err()
            {
                return;
            }
            state.genesis();
        }
        let kept = store.and_then(|s| Some((state.save(s.as_ref(), p, from, end)?, s)));
        if kept.is_some() {
            state.cache(self.cache);
        }
        let token = self.barrier(w, p);
        let (mut t, calls) = state.owner(shared, p, None, Some(token));
        assert_eq!(t.unreadable.take(), None, "a memory store reads");
        if let Some((checkpoint, s)) = kept {
            t.store = Some(s);
            t.checkpoint = checkpoint;
        }
        t.place_index(self.clock(w), shared.cfg.timer_horizon_ms)
            .expect("a memory store writes");
        let n = t.slots.len();
        let mut calls: Vec<(String, Work)> = calls;
        calls.sort_by(|a, b| a.0.cmp(&b.0));
        self.workers[w].owners.insert(
            p,
            SimOwner {
                t,
                epoch,
                pos: Some(committed),
            },
        );
        for (id, work) in calls {
            self.after(w, p, &id, work);
        }
        // The store holds every record it read (it writes at once, so every ticket is done); the
        // calls in flight were sent again first, as the worker does.
        if let Some(o) = self.workers[w].owners.get_mut(&p) {
            o.t.evict(self.cache, u64::MAX);
        }
        self.note(format!(
            "w{w} restores p{p}: epoch {epoch}, committed {committed}, clock {clock}, {n} instances, state read from {from}"
        ));
    }

    /// The group's committed offsets of a commands partition are lost: both its commands offset
    /// and its clock, or (one time in three) the commands offset alone.
    fn expire(&mut self) {
        let Some(r) = self.expiry.as_mut() else { return };
        let p = r.i32(0..PARTITIONS);
        let both = r.u8(..3) != 0;
        let shared = self.shared;
        self.broker.offsets.remove(&(shared.topics.commands.clone(), p));
        if both {
            self.broker.offsets.remove(&(shared.topics.clock.clone(), p));
        }
        let what = if both {
            "commands offset and clock"
        } else {
            "commands offset"
        };
        self.note(format!("the group's {what} of p{p} are lost"));
    }

    /// Retention (`retention.ms`) deletes the oldest records of a commands or events partition,
    /// those its group has committed: nothing a worker does may need them again (a restore reads
    /// the state topic, and the inputs read again after a failed batch lie past the committed
    /// offset).
    fn retain(&mut self) {
        let Some(r) = self.retention.as_mut() else { return };
        let shared = self.shared;
        let (topic, p) = if r.bool() {
            (shared.topics.commands.clone(), r.i32(0..PARTITIONS))
        } else {
            (shared.topics.events[0].clone(), r.i32(0..EVENTS))
        };
        let upto = self.broker.committed_offset(&topic, p);
        let Some((_, recs)) = self.broker.logs.get_mut(&(topic.clone(), p)) else {
            return;
        };
        let before = recs.len();
        recs.retain(|r| r.offset >= upto);
        let gone = before - recs.len();
        self.retained += gone;
        self.note(format!(
            "retention deletes {gone} records of {topic} partition {p} below {upto}"
        ));
    }

    /// What `restore::repair_offsets` does, in the model: the latest position record a
    /// `read_committed` reader sees, if it is of transaction `lost` or later, becomes the group's
    /// committed offsets (`false`: none can be read yet, and the restore fails).
    fn repair_offsets(&mut self, p: i32, lost: i64, committed: i64, clock: i64) -> bool {
        let shared = self.shared;
        let mut position: Option<(i64, i64)> = None;
        for r in self.broker.read(&shared.topics.state, p, 0) {
            if r.key.as_deref() != Some(crate::wire::POSITION_KEY) {
                continue;
            }
            let Some(rec) = r
                .payload
                .as_deref()
                .and_then(|b| serde_json::from_slice::<StateRecord>(b).ok())
            else {
                continue;
            };
            if let Some(c) = rec.clock.filter(|c| position.is_none_or(|(_, at)| *c >= at)) {
                position = Some((rec.through, c));
            }
        }
        let Some((through, c)) = position.filter(|(_, c)| *c >= lost) else {
            self.note(format!("p{p}: offsets lost, no committed position {lost} readable yet"));
            return false;
        };
        let (commands, next) = ((through + 1).max(committed), c + 1);
        let kept = |t: &str| self.broker.kept_offsets.get(&(t.to_string(), p)).copied().unwrap_or(0);
        let want = (kept(&shared.topics.commands), kept(&shared.topics.clock));
        if (commands, next) != want {
            self.clock_fault.get_or_insert(format!(
                "p{p}: lost offsets repaired to commands {commands}, clock {next}; they were {want:?}"
            ));
        }
        self.broker
            .offsets
            .insert((shared.topics.commands.clone(), p), commands);
        self.broker.offsets.insert((shared.topics.clock.clone(), p), next);
        self.repairs += 1;
        self.note(format!(
            "p{p}: offsets lost (committed {committed}, clock {clock}); repaired to {commands}, clock {next}"
        ));
        true
    }

    /// What the worker does once a decision committed (or a restore asked for).
    fn after(&mut self, w: usize, p: i32, id: &str, work: Work) {
        match work {
            Work::Call { call, .. } => self.calls.push((w, p, id.to_string(), call.op, call.arguments)),
            Work::Stop { op, .. } => self.calls.retain(|c| !(c.2 == id && c.3 == op)),
            work @ (Work::ArmTimer { .. } | Work::CancelTimer { .. }) => {
                if let Some(o) = self.workers[w].owners.get_mut(&p) {
                    o.t.track(id, work);
                }
            }
            Work::StartChild(start) => {
                // Only from a restore: a subflow start still open after a crash is sent again.
                let origin = self.workers[w]
                    .owners
                    .get(&p)
                    .and_then(|o| o.t.slots.get(id))
                    .and_then(|s| s.h.origin.clone());
                let out = super::subflow_start(self.shared, &start, origin);
                self.note(format!("w{w} sends the start of {} again", start.id));
                self.plain_lossy(&out, self.clock(w));
            }
            Work::Task { .. } | Work::Send { .. } => {}
        }
    }

    /// One turn of worker `w`'s loop: a batch of up to `max` records from each of its commands
    /// and events partitions, routed and decided by the worker's own code, each commands
    /// partition's batch (and the events batches it carries) committed in one transaction, and
    /// events batches no owned partition carries routed in their own. `crash`: the worker dies
    /// at that step of one of its transactions (a record, or after sending its offsets); `abort`:
    /// the broker aborts the first one.
    fn turn(&mut self, w: usize, max: usize, crash: Option<usize>, mut abort: Fault) {
        let shared = self.shared;
        let commands = shared.topics.commands.clone();
        let events = shared.topics.events[0].clone();
        // A position to read again from the committed offset: once that is stable.
        let broker = &self.broker;
        let settle = |topic: &str, p: i32, pos: &mut Option<i64>| {
            if pos.is_none() && broker.stable(topic, p) {
                *pos = Some(broker.committed_offset(topic, p));
            }
        };
        let worker = &mut self.workers[w];
        for (p, o) in worker.owners.iter_mut() {
            settle(&commands, *p, &mut o.pos);
        }
        for (e, r) in worker.routers.iter_mut() {
            settle(&events, *e, &mut r.pos);
        }
        let mut batches: BTreeMap<i32, Vec<Rec>> = BTreeMap::new();
        for (p, o) in &self.workers[w].owners {
            let Some(pos) = o.pos else { continue };
            let recs: Vec<Rec> = self
                .broker
                .read(&commands, *p, pos)
                .into_iter()
                .take(max)
                .cloned()
                .collect();
            if !recs.is_empty() {
                batches.insert(*p, recs);
            }
        }
        let mut event_batches = Vec::new();
        let mut read_events = BTreeMap::new();
        for (e, r) in &self.workers[w].routers {
            let Some(pos) = r.pos else { continue };
            let msgs: Vec<OwnedMessage> = self
                .broker
                .read(&events, *e, pos)
                .into_iter()
                .take(max)
                .map(|r| message(&events, *e, r))
                .collect();
            if let Some(last) = msgs.last() {
                read_events.insert(*e, rdkafka::Message::offset(last));
                event_batches.push(((events.clone(), *e), msgs));
            }
        }
        if batches.is_empty() && event_batches.is_empty() {
            return;
        }
        // The consumer's position moves on as it reads; a batch not committed goes back.
        for (e, last) in &read_events {
            if let Some(r) = self.workers[w].routers.get_mut(e) {
                r.pos = Some(last + 1);
            }
        }
        let worker = &self.workers[w];
        let local: BTreeSet<i32> = worker.owners.keys().copied().collect();
        let ready: BTreeSet<i32> = worker
            .owners
            .iter()
            .filter(|(_, o)| o.t.barrier.is_none())
            .map(|(p, _)| *p)
            .collect();
        let commanded: BTreeSet<i32> = batches.keys().copied().collect();
        let routing = route_events(shared, &local, &ready, &worker.outstanding, &commanded, event_batches);
        let mut hosted = routing.hosted;
        let busy: BTreeSet<i32> = commanded.iter().chain(hosted.keys()).copied().collect();
        let mut crash = crash;
        for p in busy {
            let recs = batches.remove(&p).unwrap_or_default();
            let carried = hosted.remove(&p).unwrap_or_default();
            let carried_events: Vec<i32> = routing
                .hosted_by
                .iter()
                .filter(|(_, host)| *host == p)
                .map(|((_, e), _)| *e)
                .collect();
            let forwarded = carried.forwarded.clone();
            let Some(mut o) = self.workers[w].owners.remove(&p) else {
                continue;
            };
            let records = recs
                .iter()
                .map(|r| (r.offset, r.ts, r.payload.as_deref().unwrap_or_default()));
            // The stream time of the batch's inputs, as the model sees it, and the parked events'
            // windows before the batch.
            let window = shared.cfg.event_window_ms;
            let due = self.dues.entry(p).or_default();
            due.extend(o.t.parking.parked.values().map(|x| x.expires));
            due.extend(
                o.t.parking
                    .tally
                    .values()
                    .map(|(_, _, first)| decision::tally_expiry(*first, window)),
            );
            let mut stream = self.stream.get(&p).copied().unwrap_or(0);
            for r in &recs {
                match serde_json::from_slice::<Command>(r.payload.as_deref().unwrap_or_default()) {
                    Ok(Command::Timer { .. } | Command::Barrier { .. }) => {}
                    // A tick moves the stream time on to what it names only when something of
                    // the partition was due then (a clock reading is not).
                    Ok(Command::Tick { at }) => {
                        if let Some(at) = at.filter(|at| due.contains(at)) {
                            stream = stream.max(at);
                        }
                    }
                    _ => stream = stream.max(r.ts),
                }
            }
            for (_, at, _) in &carried.inline {
                stream = stream.max(at.unwrap_or(i64::MIN));
            }
            let windows: BTreeMap<String, i64> =
                o.t.parking
                    .parked
                    .values()
                    .map(|x| (x.origin.key(), x.expires))
                    .collect();
            // As the worker does: the partition's stream time is the floor, not a clock.
            let floor = o.t.stream_ms;
            let mut b = decision::decide(shared, &mut o.t, records, carried, floor);
            // Still parked after the batch: not dropped (a tally's dead letter may name one).
            let kept: BTreeSet<String> = o.t.parking.parked.values().map(|x| x.origin.key()).collect();
            let windows: BTreeMap<String, i64> = windows.into_iter().filter(|(k, _)| !kept.contains(k)).collect();
            let checked = self.check_clock(p, &b.outs, stream, &windows).and_then(|()| {
                // The owner's own stream time is no later than the model's either.
                let model = self.stream.get(&p).copied().unwrap_or(0);
                match o.t.stream_ms > model {
                    true => Err(format!(
                        "p{p}'s owner (w{w}) took its stream time to {}, {} ms past the inputs' {model}",
                        o.t.stream_ms,
                        o.t.stream_ms.saturating_sub(model)
                    )),
                    false => Ok(()),
                }
            });
            if let Err(e) = checked {
                self.clock_fault.get_or_insert(e);
            }
            let what = format!(
                "w{w} p{p} batch ({} commands, events of {carried_events:?})",
                recs.len()
            );
            match self.transact(
                w,
                &self.tid(p),
                o.epoch,
                &b.outs,
                &b.offsets,
                &mut crash,
                &mut abort,
                &what,
                Some(b.at),
            ) {
                Ok(()) => {
                    if let Some(last) = recs.last() {
                        o.pos = Some(last.offset + 1);
                    }
                    if let Some(store) = &o.t.store {
                        let delivered = self
                            .broker
                            .last_of(&self.tid(p), &shared.topics.state, p)
                            .filter(|d| *d >= o.t.checkpoint);
                        // Written at once: the worker's writer thread applies the same changes
                        // in the same order, and a restore waits for it.
                        let index = std::mem::take(&mut b.index);
                        let (changes, checkpoint) = super::local_changes(shared, p, &b.outs, index, delivered);
                        let refs: Vec<(&str, Option<&[u8]>)> =
                            changes.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
                        store.apply(&refs, checkpoint).expect("a memory store writes");
                        for kept in [&mut o.t.corr.kept, &mut o.t.parking.subs, &mut o.t.ended.kept] {
                            kept.handed(0);
                            kept.prune(u64::MAX);
                        }
                        if let Some(d) = delivered {
                            o.t.checkpoint = o.t.checkpoint.max(d + 1);
                        }
                    }
                    let (after, applied) = o.t.committed(b);
                    o.t.evict(self.cache, u64::MAX);
                    note_committed(&mut self.workers[w].outstanding, p, applied, forwarded);
                    self.workers[w].owners.insert(p, o);
                    for (id, work) in after {
                        self.after(w, p, &id, work);
                    }
                }
                Err(killed) => {
                    if killed {
                        return;
                    }
                    // It may have committed: what it forwarded is awaited as if it had.
                    note_uncertain(&mut self.workers[w].outstanding, forwarded);
                    self.drop_owner(w, p, "not committed");
                    for e in carried_events {
                        self.rewind_router(w, e);
                    }
                }
            }
        }
        for ((_, e), outs, last, at) in routing.solo {
            let Some(epoch) = self.workers[w].routers.get(&e).map(|r| r.epoch) else {
                continue;
            };
            let offsets = vec![(events.clone(), e, last + 1)];
            let what = format!("w{w} router e{e} to {last}");
            match self.transact(
                w,
                &self.router_tid(e),
                epoch,
                &outs,
                &offsets,
                &mut crash,
                &mut abort,
                &what,
                at,
            ) {
                Ok(()) => {}
                Err(true) => return,
                Err(false) => {
                    // Made again at the next assignment check, from the committed offset.
                    self.workers[w].routers.remove(&e);
                }
            }
        }
    }

    /// The decisions of a batch of partition `p` against the stream time (`stream`: what its
    /// inputs carried, as the model finds it; `windows`: the parked events' window ends before
    /// it): each timer fired at its due time, however early or late its proposal came; every
    /// other step decided no later than the stream time (a later one took a worker's clock); no
    /// parked event dropped before its window ended in stream time (`windows`: those that left
    /// the partition in the batch). Moves the model's stream time of `p` on.
    fn check_clock(
        &mut self,
        p: i32,
        outs: &[Out],
        mut stream: i64,
        windows: &BTreeMap<String, i64>,
    ) -> Result<(), String> {
        let topics = &self.shared.topics;
        let mut steps = Vec::new();
        for o in outs.iter().filter(|o| o.topic == topics.journal) {
            let id = o.key.clone().unwrap_or_default();
            let j: JournalRecord = serde_json::from_slice(o.payload.as_deref().unwrap_or_default())
                .map_err(|e| format!("journal record of {id}: {e}"))?;
            for (i, e) in j.entries.iter().enumerate() {
                let Entry::Input(t) = e else { continue };
                let Input::TimerFired { timer } = &t.input else {
                    steps.push((id.clone(), t.at));
                    continue;
                };
                // Its due time: armed earlier in this record, or in the instance's committed journal.
                let armed = |entries: &[Entry]| {
                    entries.iter().rev().find_map(|e| match e {
                        Entry::Effect(sm4c_runtime::Effect::StartTimer { timer: x, due }) if x == timer => Some(*due),
                        _ => None,
                    })
                };
                let due = armed(&j.entries[..i]).or_else(|| {
                    self.broker
                        .truth(&topics.journal, p)
                        .into_iter()
                        .rev()
                        .filter(|r| r.key.as_deref() == Some(id.as_str()))
                        .filter_map(|r| serde_json::from_slice::<JournalRecord>(r.payload.as_deref()?).ok())
                        .find_map(|r| armed(&r.entries))
                });
                let Some(due) = due else {
                    return Err(format!("{id} fired timer {timer} that its journal never armed"));
                };
                if t.at != due {
                    return Err(format!(
                        "{id} fired timer {timer} at {}, not at its due time {due} (a worker's clock decided it)",
                        t.at
                    ));
                }
                stream = stream.max(due);
            }
        }
        for (id, at) in steps {
            if at > stream {
                return Err(format!(
                    "p{p} decided a step of {id} at {at}, {} ms past its stream time {stream} (a worker's clock decided it)",
                    at - stream
                ));
            }
        }
        for o in outs {
            let dropped = if o.topic == topics.deadletter {
                let code = o.headers.iter().find(|(k, _)| k == "sm4c-deadletter-code");
                let origin = o.headers.iter().find(|(k, _)| k == "sm4c-origin");
                match (code, origin) {
                    (Some((_, c)), Some((_, origin))) if c.as_slice() == b"noInstance" => {
                        Some(String::from_utf8_lossy(origin).into_owned())
                    }
                    _ => None,
                }
            } else if o.topic == topics.commands {
                match serde_json::from_slice::<Command>(o.payload.as_deref().unwrap_or_default()) {
                    Ok(Command::Unmatched { key, partition, .. }) if partition == p => Some(key),
                    _ => None,
                }
            } else {
                None
            };
            if let Some(end) = dropped.and_then(|k| windows.get(&k).map(|end| (k, *end))) {
                if end.1 > stream {
                    return Err(format!(
                        "p{p} dropped the parked event from {} at stream time {stream}, before its window ends at {}",
                        end.0, end.1
                    ));
                }
            }
        }
        let s = self.stream.entry(p).or_insert(i64::MIN);
        *s = (*s).max(stream);
        Ok(())
    }

    /// Back to the committed offset (read once it is stable).
    fn rewind_router(&mut self, w: usize, e: i32) {
        if let Some(r) = self.workers[w].routers.get_mut(&e) {
            r.pos = None;
        }
    }

    /// One transaction: begin, produce `outs` (stamped `at`, else by the worker's clock), send
    /// `offsets`, commit. `Err(true)` when the worker was killed in it (the transaction stays open
    /// until its producer is fenced), `Err(false)` when it did not commit.
    #[allow(clippy::too_many_arguments)]
    fn transact(
        &mut self,
        w: usize,
        tid: &str,
        epoch: u32,
        outs: &[Out],
        offsets: &[(String, i32, i64)],
        crash: &mut Option<usize>,
        abort: &mut Fault,
        what: &str,
        at: Option<i64>,
    ) -> Result<(), bool> {
        let generations = self.workers[w].generations;
        let txn = match self.broker.begin(tid, epoch, generations, self.now) {
            Ok(t) => t,
            Err(e) => {
                self.note(format!("{what}: begin refused: {e}"));
                return Err(false);
            }
        };
        for (i, out) in outs.iter().enumerate() {
            if *abort == Fault::Panic && i == outs.len() / 2 {
                *abort = Fault::None;
                self.panicked += 1;
                self.note(format!(
                    "{what}: panics at record {i} of {}, its transaction left open",
                    outs.len()
                ));
                return Err(false);
            }
            if *crash == Some(i) {
                self.note(format!("{what}: killed at record {i} of {}", outs.len()));
                self.kill(w);
                return Err(true);
            }
            // Stamped as the worker asks, else by the producer's clock, as librdkafka does.
            if let Err(e) = self.broker.produce(txn, out, at.unwrap_or(self.clock(w))) {
                self.note(format!("{what}: produce refused: {e}"));
                self.broker.abort(txn);
                return Err(false);
            }
        }
        if let Err(e) = self.broker.send_offsets(txn, offsets) {
            self.note(format!("{what}: offsets refused: {e}"));
            self.broker.abort(txn);
            return Err(false);
        }
        if *crash == Some(outs.len()) {
            self.note(format!("{what}: killed after sending its offsets"));
            self.kill(w);
            return Err(true);
        }
        let fault = std::mem::replace(abort, Fault::None);
        if fault == Fault::Abort {
            self.broker.abort_by(txn, false);
            self.note(format!("{what}: the broker aborts it"));
            return Err(false);
        }
        if let Err(e) = self.broker.commit(txn) {
            self.note(format!("{what}: commit refused: {e}"));
            return Err(false);
        }
        if fault == Fault::Ambiguous {
            self.note(format!(
                "{what}: committed, {} records, but the worker is told it failed",
                outs.len()
            ));
            return Err(false);
        }
        self.note(format!("{what}: committed, {} records", outs.len()));
        Ok(())
    }

    fn kill(&mut self, w: usize) {
        self.workers[w].alive = false;
        self.workers[w].owners.clear();
        self.workers[w].routers.clear();
        self.workers[w].outstanding.clear();
        self.workers[w].watch = Default::default();
        self.workers[w].unstick.clear();
        self.calls.retain(|c| c.0 != w);
        self.note(format!("w{w} killed"));
        self.rebalance(BOTH, None);
    }

    /// A worker's plain produce, which the broker may not take (before the world heals).
    fn plain_lossy(&mut self, out: &Out, now: i64) {
        if self.lossy && self.rng.u8(..6) == 0 {
            self.note("(the broker does not take it)".into());
            return;
        }
        self.broker.plain(out, now);
    }

    /// A plain produce of command `c` for instance `id`, stamped `ts` by its producer's clock.
    fn command(&mut self, id: &str, c: &Command, ts: i64) {
        let p = partition_of(id, PARTITIONS);
        let proposed = matches!(
            c,
            Command::Timer { .. } | Command::Result { .. } | Command::ScheduleTick { .. }
        );
        if self.lossy && proposed && self.rng.u8(..6) == 0 {
            self.note("(the broker does not take it)".into());
            return;
        }
        let out = super::command(self.shared, p, Some(id), c);
        self.broker.plain(&out, ts);
    }

    fn fire_timers(&mut self, w: usize) {
        let now = self.clock(w);
        let mut due = Vec::new();
        let horizon_ms = self.shared.cfg.timer_horizon_ms;
        for o in self.workers[w].owners.values_mut() {
            // Its store is written at once: every write is done.
            o.t.advance_timers(now, horizon_ms, u64::MAX);
            due.extend(o.t.due(self.shared, now));
            for id in o.t.scheds.due(now) {
                due.push(Command::ScheduleTick { schedule: id });
            }
        }
        for c in due {
            let id = match &c {
                Command::Timer { id, timer } => {
                    self.note(format!("w{w} proposes timer {timer} of {id}"));
                    id.clone()
                }
                Command::Result { id, op, .. } => {
                    self.note(format!("w{w} proposes the result of {op} of {id} again"));
                    id.clone()
                }
                Command::ScheduleTick { schedule } => {
                    self.note(format!("w{w} proposes a tick of schedule {schedule}"));
                    schedule.clone()
                }
                _ => continue,
            };
            self.command(&id, &c, now);
        }
        // As the worker loop does: a partition whose parked events' window has passed (by this
        // worker's clock) gets a tick naming the due time it is for.
        let (window, retention) = (self.shared.cfg.event_window_ms, self.shared.cfg.retention_ms);
        let ticks: Vec<(i32, i64)> = self.workers[w]
            .owners
            .iter_mut()
            .filter_map(|(p, o)| Some((*p, o.t.tick_at(now, window, retention)?)))
            .collect();
        for (p, at) in ticks {
            self.note(format!("w{w} ticks p{p} for {at}"));
            let out = super::command(self.shared, p, None, &Command::Tick { at: Some(at) });
            self.plain_lossy(&out, now);
        }
        self.guard(w);
    }

    /// The topics the stall guard looks after (those with `read_committed` readers: the owners,
    /// the consumers of sent events and of dead letters), with their partition counts.
    fn guarded_topics(&self) -> [(String, i32); 3] {
        let t = &self.shared.topics;
        [
            (t.commands.clone(), PARTITIONS),
            (t.out.clone(), PARTITIONS),
            (t.deadletter.clone(), 1),
        ]
    }

    /// Worker `w`'s stall guard, with late markers: it looks at the partitions mapped to the
    /// commands partitions it owns (`q mod partitions`), by its own clock, with the worker's own
    /// rules ([`super::stall::Watch`]), and ends a transaction on each that stalled as the worker
    /// does: one record, aborted, under `<group>.unstick.<commands partition>`. Without late
    /// markers it is left out, so that those seeds' schedules stay as they were (there it ends
    /// only empty aborted transactions).
    fn guard(&mut self, w: usize) {
        if !self.broker.late {
            return;
        }
        let owned: BTreeSet<i32> = self.workers[w].owners.keys().copied().collect();
        self.workers[w].unstick.retain(|p, _| owned.contains(p));
        let since = u64::try_from(self.clock(w) - START_MS + MAX_SKEW_MS).unwrap_or(0);
        let at = self.base + std::time::Duration::from_millis(since);
        for (topic, n) in self.guarded_topics() {
            for q in (0..n).filter(|q| owned.contains(&(q % PARTITIONS))) {
                let key = (topic.clone(), q);
                let (lso, high) = (self.broker.stable_end(&topic, q), self.broker.end(&topic, q));
                let verdict = self.workers[w].watch.observe(key.clone(), lso, high, at);
                if let super::stall::Verdict::Stalled { for_ms, repair: true } = verdict {
                    self.note(format!(
                        "w{w}'s guard: {topic}/{q} stalled for {for_ms} ms at {lso} of {high}"
                    ));
                    self.unstick(w, q % PARTITIONS, &topic, q);
                    self.workers[w].watch.repaired(&key, at);
                }
            }
        }
    }

    /// Ends one transaction on `topic`/`q` as the stall guard's repair does.
    fn unstick(&mut self, w: usize, p: i32, topic: &str, q: i32) {
        let shared = self.shared;
        let tid = format!("{}.unstick.{p}", shared.cfg.group);
        let epoch = match self.workers[w].unstick.get(&p) {
            Some(e) => *e,
            None => {
                let e = self.broker.init(&tid);
                self.workers[w].unstick.insert(p, e);
                e
            }
        };
        let record = if topic == shared.topics.commands {
            super::command(shared, q, None, &Command::Tick { at: None })
        } else {
            let mut headers = vec![(super::stall::UNSTICK_HEADER.to_string(), b"aborted".to_vec())];
            if topic == shared.topics.deadletter {
                headers.push(("sm4c-deadletter-code".into(), b"unstick".to_vec()));
            }
            Out {
                topic: topic.to_string(),
                partition: Some(q),
                key: None,
                payload: Some(Vec::new()),
                headers,
            }
        };
        let generations = self.workers[w].generations;
        let done = self.broker.begin(&tid, epoch, generations, self.now).and_then(|txn| {
            self.broker.produce(txn, &record, self.now + self.skew[w])?;
            let before = self.broker.prepared.len();
            self.broker.abort(txn);
            // What it landed (the aborted record itself was never held).
            self.broker.unstuck += before.saturating_sub(self.broker.prepared.len());
            Ok(())
        });
        if let Err(e) = done {
            // Dropped: the next one fences it.
            self.workers[w].unstick.remove(&p);
            self.note(format!("w{w}'s guard cannot end a transaction on {topic}/{q}: {e}"));
        }
    }

    /// The partitions with `read_committed` readers held back by markers that have not landed.
    fn stalled(&self) -> Vec<(String, i32, i64)> {
        let watched: BTreeSet<String> = self.guarded_topics().into_iter().map(|(t, _)| t).collect();
        self.broker
            .held_back()
            .into_iter()
            .filter(|(t, _, _)| watched.contains(t))
            .collect()
    }

    /// Whether some owner still holds a parked event.
    fn parked(&self) -> bool {
        self.workers
            .iter()
            .any(|w| w.owners.values().any(|o| !o.t.parking.parked.is_empty()))
    }

    fn finish_call(&mut self, i: usize, repeat: bool) {
        let (w, p, id, op, args) = self.calls.remove(i);
        *self.executed.entry((id.clone(), op.clone())).or_default() += 1;
        let outcome = Outcome::Ok(json!({ "charge": args }));
        let now = self.clock(w);
        // As the worker loop hands a result back: through the owner, which keeps it until taken.
        let Some(o) = self.workers[w].owners.get_mut(&p) else {
            return;
        };
        let c = o.t.answered(&id, &op, outcome, now);
        self.note(format!(
            "call {op} of {id} (w{w}) answers{}",
            if repeat { " twice" } else { "" }
        ));
        self.command(&id, &c, now);
        if self.rng.u8(..8) == 0 {
            self.resend.push((id.clone(), c.clone()));
        }
        if repeat {
            self.command(&id, &c, now);
        }
    }

    fn start(&mut self, k: usize) {
        let id = format!("i{k}");
        let c = Command::Start {
            id: id.clone(),
            definition: "sim".into(),
            version: None,
            input: json!({ "n": k }),
            parent: None,
            depth: 0,
            origin: None,
            request: None,
            traceparent: None,
            schedule: None,
            nominal: None,
        };
        self.note(format!("client starts {id}"));
        self.command(&id, &c, self.now);
        if self.rng.u8(..8) == 0 {
            self.resend.push((id.clone(), c.clone()));
        }
        self.started.insert(id);
        // Now and then an instance of the sequence beside it.
        if self.seq_rng.as_mut().is_some_and(|r| r.u8(..3) == 0) {
            let id = format!("s{k}");
            let keyed = self.seq_rng.as_mut().is_some_and(|r| r.bool());
            let c = Command::Start {
                id: id.clone(),
                definition: "sim-seq".into(),
                version: None,
                input: json!({ "n": k }),
                parent: None,
                depth: 0,
                origin: None,
                request: None,
                traceparent: None,
                schedule: None,
                nominal: None,
            };
            self.note(format!("client starts {id}"));
            self.command(&id, &c, self.now);
            self.seqs.insert(id, (keyed, 0));
        }
    }

    /// The client sends the next `step` event of sequence instance `id`, on its events partition,
    /// naming it or carrying only its correlation key (the same way for all its steps: events
    /// routed by different keys, or one by key and one by name, may reach it in either order).
    fn send_step(&mut self, id: &str) {
        let Some((keyed, sent)) = self.seqs.get(id).copied() else {
            return;
        };
        if sent >= STEPS_PER_SEQUENCE {
            return;
        }
        let step = sent + 1;
        let mut event = json!({
            "specversion": "1.0", "id": format!("step-{id}-{step}"), "source": "client", "type": "sim.step",
            "order": id
        });
        if !keyed {
            event["sm4cinstanceid"] = json!(id);
        }
        let topic = self.shared.topics.events[0].clone();
        let e = partition_of(id, EVENTS);
        let origin = format!("{topic}/{e}/{}", self.broker.end(&topic, e));
        self.steps.push((id.to_string(), format!("step-{id}-{step}"), origin));
        let out = Out {
            topic,
            partition: Some(e),
            key: Some(id.to_string()),
            payload: Some(event.to_string().into_bytes()),
            headers: vec![("content-type".into(), b"application/cloudevents+json".to_vec())],
        };
        self.broker.plain(&out, self.now);
        self.note(format!("client sends step {step} to {id} (e{e})"));
        self.seqs.insert(id.to_string(), (keyed, step));
    }

    /// A client sends the `go` CloudEvent (structured mode) to the events topic, keyed by the
    /// instance it names.
    fn send_go(&mut self, id: &str) {
        let c = self.post_go(id);
        if self.rng.u8(..8) == 0 {
            self.resend.push((id.to_string(), c));
        }
    }

    /// Produces the `go` event for `id`, naming it or (every other time or so) carrying only its
    /// correlation key, so that it goes through the key's partition; gives the command that
    /// repeats it.
    fn post_go(&mut self, id: &str) -> Command {
        let mut event = json!({
            "specversion": "1.0", "id": format!("go-{id}"), "source": "client", "type": "sim.go",
            "order": id
        });
        let keyed = self.keyed_rng.bool();
        if !keyed {
            event["sm4cinstanceid"] = json!(id);
        }
        let topic = self.shared.topics.events[0].clone();
        let e = partition_of(id, EVENTS);
        let offset = self.broker.end(&topic, e);
        let out = Out {
            topic: topic.clone(),
            partition: Some(e),
            key: Some(id.to_string()),
            payload: Some(event.to_string().into_bytes()),
            headers: vec![("content-type".into(), b"application/cloudevents+json".to_vec())],
        };
        self.broker.plain(&out, self.now);
        let how = if keyed { " by key" } else { "" };
        self.note(format!("client sends go to {id}{how} (e{e} @{offset})"));
        self.gos.push((id.to_string(), format!("{topic}/{e}/{offset}")));
        *self.keyed_only.entry(id.to_string()).or_insert(true) &= keyed;
        Command::Event {
            target: Some(id.to_string()),
            event,
            origin: crate::wire::Origin {
                topic,
                partition: e,
                offset,
            },
            home: None,
            expect: None,
        }
    }

    /// One random step of the schedule.
    fn random_step(&mut self, next_start: &mut usize, instances: usize) {
        let alive: Vec<usize> = (0..WORKERS).filter(|w| self.workers[*w].alive).collect();
        match self.rng.u32(..100) {
            0..=9 if *next_start < instances => {
                let k = *next_start;
                *next_start += 1;
                self.start(k);
                if self.rng.u8(..5) == 0 {
                    self.note("(repeated)".into());
                    self.start(k);
                }
            }
            10..=15 if !self.started.is_empty() => {
                let ids: Vec<String> = self.started.iter().cloned().collect();
                let id = ids[self.rng.usize(..ids.len())].clone();
                self.send_go(&id);
                // And the next step of a sequence instance (sometimes before it started).
                let seqs: Vec<String> = self.seqs.keys().cloned().collect();
                if let Some(r) = self.seq_rng.as_mut().filter(|_| !seqs.is_empty()) {
                    let id = seqs[r.usize(..seqs.len())].clone();
                    self.send_step(&id);
                }
                // Now and then the go event of an instance not started yet: its partition parks
                // it (a record of its own on the state topic) until the instance starts and
                // waits for it, or dead-letters it once the event window has passed.
                if *next_start < instances && self.early_rng.u8(..3) == 0 {
                    let early = format!("i{next_start}");
                    if !self.gos.iter().any(|(i, _)| *i == early) {
                        self.note(format!("the go event of {early} comes before its start"));
                        self.post_go(&early);
                    }
                }
            }
            16..=25 if !self.calls.is_empty() => {
                let i = self.rng.usize(..self.calls.len());
                let repeat = self.rng.u8(..5) == 0;
                self.finish_call(i, repeat);
            }
            61..=64 if !self.resend.is_empty() => {
                let (id, c) = self.resend[self.rng.usize(..self.resend.len())].clone();
                match &c {
                    // A client that retries `POST /events`: the same event in a new record.
                    Command::Event { .. } => {
                        self.note(format!("the client sends the go event for {id} again"));
                        self.send_go(&id);
                    }
                    _ => {
                        let kind = if matches!(c, Command::Start { .. }) {
                            "start"
                        } else {
                            "call result"
                        };
                        self.note(format!("the {kind} for {id} comes again"));
                        self.command(&id, &c, self.now);
                    }
                }
            }
            26..=31 => {
                let ms = self.rng.i64(1..20_000);
                self.now += ms;
                self.broker.expire(self.now);
                self.note(format!("time +{ms} ms"));
            }
            32..=37 if !alive.is_empty() => {
                let w = alive[self.rng.usize(..alive.len())];
                self.fire_timers(w);
            }
            65 if self.expiry.is_some() => self.expire(),
            66 if self.retention.is_some() => self.retain(),
            38..=40 if alive.len() > 1 => {
                let w = alive[self.rng.usize(..alive.len())];
                self.kill(w);
            }
            41..=44 => {
                let dead: Vec<usize> = (0..WORKERS).filter(|w| !self.workers[*w].alive).collect();
                if let Some(w) = dead.first().copied() {
                    self.workers[w].alive = true;
                    self.note(format!("w{w} restarts"));
                    if self.disk_rng.u8(..5) == 0 {
                        if let Some(d) = &mut self.disks {
                            d[w] = Arc::default();
                            self.note(format!("w{w} lost its disk"));
                        }
                    }
                    self.rebalance(BOTH, None);
                }
            }
            45..=46 if alive.len() > 1 => {
                // A partition moves while its old owner still runs: a zombie until it polls.
                let to = alive[self.rng.usize(..alive.len())];
                let moved = if self.rng.bool() {
                    let p = self.rng.i32(0..PARTITIONS);
                    self.note(format!("p{p} moves to w{to}"));
                    (false, p, to)
                } else {
                    let e = self.rng.i32(0..EVENTS);
                    self.note(format!("e{e} moves to w{to}"));
                    (true, e, to)
                };
                // Only the moved partition's group rebalances; the other goes on as it was.
                let groups = if moved.0 { [false, true] } else { [true, false] };
                self.rebalance(groups, Some(moved));
                self.sync(to);
            }
            47..=60 if !alive.is_empty() => {
                let w = alive[self.rng.usize(..alive.len())];
                self.sync(w);
            }
            _ if !alive.is_empty() => {
                let w = alive[self.rng.usize(..alive.len())];
                let max = self.rng.usize(1..8);
                let crash = (self.rng.u8(..20) == 0).then(|| self.rng.usize(..6));
                // The broker aborts the first transaction, or commits it and the worker is told it
                // failed (a timeout after EndTxn: an ambiguous outcome).
                let fault = match self.rng.u8(..25) {
                    0 => Fault::Abort,
                    1 => Fault::Ambiguous,
                    2 if self.loop_panics => Fault::Panic,
                    _ => Fault::None,
                };
                self.turn(w, max, crash, fault);
            }
            _ => {}
        }
    }

    /// Every worker back, no more faults: runs until every instance has ended.
    fn heal(&mut self) -> Result<(), String> {
        for w in 0..WORKERS {
            self.workers[w].alive = true;
        }
        self.note("heal: every worker back".into());
        self.lossy = false;
        // Every sequence instance is sent the rest of its steps.
        let seqs: Vec<String> = self.seqs.keys().cloned().collect();
        for id in seqs {
            for _ in 0..STEPS_PER_SEQUENCE {
                self.send_step(&id);
            }
        }
        self.rebalance(BOTH, None);
        for _ in 0..400 {
            for w in 0..WORKERS {
                self.sync(w);
                self.turn(w, 64, None, Fault::None);
                self.fire_timers(w);
            }
            while !self.calls.is_empty() {
                self.finish_call(0, false);
            }
            // Parked events wait for their window to pass (dead-lettered) before the checks.
            // And every committed record readable by `read_committed` readers (late markers
            // landed, by a later transaction or the stall guard's).
            if self.all_ended() && self.drained() && !self.parked() && self.schedule_done() && self.stalled().is_empty()
            {
                return Ok(());
            }
            self.now += 5_000;
            self.broker.expire(self.now);
        }
        Err(format!(
            "the cluster did not end every instance (and the schedule) after 400 healed rounds: {}",
            self.stuck()
        ))
    }

    /// What is left when the cluster does not finish: unended instances, and where each worker's
    /// partitions stand.
    fn stuck(&self) -> String {
        let (commands, events) = (&self.shared.topics.commands, &self.shared.topics.events[0]);
        let mut out = Vec::new();
        for id in self.instances() {
            let state = self.latest_state(&id).and_then(|r| r.instance);
            if !state.as_ref().is_some_and(|i| i.snapshot.status.is_final()) {
                let what = state
                    .map(|i| format!("{:?}", i.snapshot.status))
                    .unwrap_or_else(|| "no state".into());
                out.push(format!("{id} (p{}) {what}", partition_of(&id, PARTITIONS)));
            }
        }
        for (w, x) in self.workers.iter().enumerate() {
            for (p, o) in &x.owners {
                let barrier = if o.t.barrier.is_some() { ", barrier pending" } else { "" };
                out.push(format!(
                    "w{w} p{p} at {:?} of {}{barrier}",
                    o.pos,
                    self.broker.end(commands, *p)
                ));
            }
            for (e, r) in &x.routers {
                out.push(format!("w{w} e{e} at {:?} of {}", r.pos, self.broker.end(events, *e)));
            }
            if !x.outstanding.is_empty() {
                out.push(format!("w{w} outstanding {:?}", x.outstanding));
            }
        }
        out.push(format!(
            "open transactions {}, calls {}",
            self.broker.open.len(),
            self.calls.len()
        ));
        let stalled = self.stalled();
        if !stalled.is_empty() {
            out.push(format!(
                "held back by markers not landed (topic, partition, LSO): {stalled:?}"
            ));
        }
        if !self.schedule_done() {
            out.push(format!(
                "schedule {SCHEDULE} not done: {:?}",
                self.schedule_record().map(|r| r.state)
            ));
        }
        out.join("; ")
    }

    fn latest_state(&self, id: &str) -> Option<StateRecord> {
        let p = partition_of(id, PARTITIONS);
        self.broker
            .truth(&self.shared.topics.state, p)
            .into_iter()
            .rfind(|r| r.key.as_deref() == Some(id))
            .and_then(|r| serde_json::from_slice(r.payload.as_deref()?).ok())
    }

    /// Whether every commands and events partition has been read to its end (past what aborted
    /// transactions left, as a consumer reads past it), every transaction has ended, and no call is
    /// in flight.
    fn drained(&self) -> bool {
        let (commands, events) = (&self.shared.topics.commands, &self.shared.topics.events[0]);
        let read =
            |topic: &str, pos: Option<i64>, p: i32| pos.is_some_and(|x| self.broker.read(topic, p, x).is_empty());
        let ends = (0..PARTITIONS).all(|p| {
            self.workers
                .iter()
                .any(|w| w.owners.get(&p).is_some_and(|o| read(commands, o.pos, p)))
        }) && (0..EVENTS).all(|e| {
            self.workers
                .iter()
                .any(|w| w.routers.get(&e).is_some_and(|r| read(events, r.pos, e)))
        });
        ends && self.broker.open.is_empty() && self.calls.is_empty()
    }

    /// Every instance: those the client started, and every instance on the state topic (their
    /// subflows).
    fn instances(&self) -> BTreeSet<String> {
        let mut all: BTreeSet<String> = self.started.clone();
        for p in 0..PARTITIONS {
            for r in self.broker.truth(&self.shared.topics.state, p) {
                if let Some(k) = r.key.as_deref().filter(|k| !k.starts_with('\0')) {
                    all.insert(k.to_string());
                }
            }
        }
        all
    }

    /// The simulated schedule as its partition's committed record has it.
    fn schedule_record(&self) -> Option<crate::wire::ScheduleRecord> {
        let key = crate::wire::schedule_key(SCHEDULE);
        let p = partition_of(SCHEDULE, PARTITIONS);
        self.broker
            .truth(&self.shared.topics.state, p)
            .into_iter()
            .rfind(|r| r.key.as_deref() == Some(key.as_str()))
            .and_then(|r| serde_json::from_slice::<StateRecord>(r.payload.as_deref()?).ok())
            .and_then(|r| r.schedule)
    }

    /// Whether the simulated schedule has passed its end, and heard that each of its runs ended.
    fn schedule_done(&self) -> bool {
        self.schedule_record().is_some_and(|r| {
            let spec = sm4c_schedule::Spec::from_json(&r.spec).expect("the schedule reads");
            r.state.running.is_empty() && r.state.wake_at(&spec, self.now).is_none()
        })
    }

    /// Creates the simulated schedule, at the start.
    fn create_schedule(&mut self) {
        let spec = json!({"id": SCHEDULE, "definition": "sim-tick", "every": "PT10S", "overlap": "allowAll",
            "catchupWindow": "PT2H", "endAt": sm4c_schedule::rfc3339(self.now + SCHEDULE_FOR)});
        let c = Command::Schedule {
            schedule: SCHEDULE.into(),
            op: crate::wire::ScheduleCmd::Create { spec },
            request: "sim".into(),
        };
        self.note(format!("client creates schedule {SCHEDULE}"));
        self.command(SCHEDULE, &c, self.now);
    }

    fn all_ended(&self) -> bool {
        self.instances().iter().all(|id| {
            self.latest_state(id)
                .and_then(|r| r.instance)
                .is_some_and(|i| i.snapshot.status.is_final())
        })
    }

    /// The checks, on what Apache Kafka's `read_committed` readers see. Gives how many instances
    /// took a go event that only its correlation key routed.
    fn check(&self) -> Result<usize, String> {
        let mut by_key = 0;
        let topics = &self.shared.topics;
        // Each owner's local store holds what its state partition holds: the latest committed
        // record of every key, and no key the partition deleted.
        for (w, worker) in self.workers.iter().enumerate() {
            for (p, o) in &worker.owners {
                let Some(store) = &o.t.store else { continue };
                let mut truth: BTreeMap<String, Value> = BTreeMap::new();
                for r in self.broker.truth(&topics.state, *p) {
                    let Some(k) = r.key.clone() else { continue };
                    match r.payload.as_deref().map(serde_json::from_slice::<Value>) {
                        Some(Ok(v)) => truth.insert(k, v),
                        _ => truth.remove(&k),
                    };
                }
                let mut kept: BTreeMap<String, Value> = BTreeMap::new();
                let mut index: BTreeMap<String, Vec<u8>> = BTreeMap::new();
                store
                    .each(&mut |k, v| {
                        if [
                            super::index::TIMER_PREFIX,
                            super::index::CORR_PREFIX,
                            super::index::ENDED_PREFIX,
                        ]
                        .iter()
                        .any(|x| k.starts_with(x))
                        {
                            // Checked below: every armed timer is known to its owner.
                        } else if crate::view::is_index_key(k) {
                            index.insert(k.to_string(), v.to_vec());
                        } else {
                            kept.insert(k.to_string(), serde_json::from_slice(v).unwrap_or(Value::Null));
                        }
                    })
                    .map_err(|e| e.to_string())?;
                // Its local index is the one the partition's records make.
                let mut expected: BTreeMap<String, Vec<u8>> = BTreeMap::from([(
                    crate::view::INDEX_VERSION_KEY.to_string(),
                    crate::view::INDEX_VERSION.to_vec(),
                )]);
                for (k, v) in &truth {
                    let Some(rec) = serde_json::from_value::<StateRecord>(v.clone())
                        .ok()
                        .and_then(|r| r.instance)
                    else {
                        continue;
                    };
                    for (key, value) in crate::view::index_changes(*p, k, Some(&rec), None) {
                        if let Some(value) = value {
                            expected.insert(key, value);
                        }
                    }
                }
                if index != expected {
                    let differs = expected
                        .keys()
                        .chain(index.keys())
                        .find(|k| expected.get(*k) != index.get(*k))
                        .cloned()
                        .unwrap_or_default();
                    return Err(format!(
                        "w{w}'s local index of p{p} differs from the one the state partition makes at key {differs:?}: {:?} kept, {:?} made",
                        index.get(&differs).map(|v| String::from_utf8_lossy(v).into_owned()),
                        expected.get(&differs).map(|v| String::from_utf8_lossy(v).into_owned())
                    ));
                }
                for k in truth.keys().chain(kept.keys()).collect::<BTreeSet<_>>() {
                    let strip = |v: Option<&Value>| {
                        // The transaction's bookkeeping differs between a record and the one a
                        // restore wrote again for it; what it says of its key may not.
                        v.cloned().map(|mut v| {
                            if let Some(o) = v.as_object_mut() {
                                o.remove("through");
                                o.remove("clock");
                            }
                            v
                        })
                    };
                    if strip(truth.get(k)) != strip(kept.get(k)) {
                        return Err(format!(
                            "w{w}'s local store of p{p} differs from the state partition at key {k:?}: {:?} kept, {:?} in the log",
                            kept.get(k),
                            truth.get(k)
                        ));
                    }
                }
            }
        }
        // Every instance has ended: none is subscribed to a correlation key any more.
        for p in 0..PARTITIONS {
            let mut subs: BTreeMap<String, bool> = BTreeMap::new();
            for r in self.broker.truth(&topics.state, p) {
                if let Some(k) = r
                    .key
                    .clone()
                    .filter(|k| k.starts_with(crate::wire::SUBSCRIPTION_PREFIX))
                {
                    subs.insert(k, r.payload.is_some());
                }
            }
            if let Some((k, _)) = subs.iter().find(|(_, live)| **live) {
                return Err(format!(
                    "p{p} still holds subscription {k:?} after every instance ended"
                ));
            }
        }
        // Sent events: one per instance, ids unique.
        let mut sent: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let mut ids = BTreeSet::new();
        for p in 0..PARTITIONS {
            for r in self.broker.truth(&topics.out, p) {
                let key = r.key.clone().unwrap_or_default();
                let id = r
                    .headers
                    .iter()
                    .find(|(k, _)| k == "ce_id")
                    .map(|(_, v)| String::from_utf8_lossy(v).to_string())
                    .ok_or_else(|| format!("a sent event of {key} has no ce_id header"))?;
                if !ids.insert(id.clone()) {
                    return Err(format!("sent event {id} of {key} is committed twice"));
                }
                let data: Value = serde_json::from_slice(r.payload.as_deref().unwrap_or_default())
                    .map_err(|e| format!("sent event {id}: {e}"))?;
                sent.entry(key).or_default().push(data);
            }
        }
        let mut children: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut scheduled: Vec<i64> = Vec::new();
        // The instances that took their go event.
        let mut took_go = BTreeSet::new();
        // The instances that ended holding their go event in their inbox.
        let mut inboxed = BTreeSet::new();
        // The steps the sequences took.
        let mut seq_took: BTreeSet<String> = BTreeSet::new();
        for id in &self.instances() {
            let run = id.strip_prefix(&format!("{SCHEDULE}@"));
            let state = self
                .latest_state(id)
                .and_then(|r| r.instance)
                .ok_or_else(|| format!("instance {id} has no committed state"))?;
            let status = &state.snapshot.status;
            if !status.is_final() {
                return Err(format!("instance {id} did not end: {status:?}"));
            }
            let parent = state.parent.as_ref().map(|l| l.instance.clone());
            if let Some(parent) = &parent {
                children.entry(parent.clone()).or_default().push(id.clone());
            }
            let done = sent.get(id).map(Vec::as_slice).unwrap_or_default();
            // The seed's panic fails the instance it came from, with what panicked, and through
            // the driver: a parent that waited for it fails with it. No other instance.
            let role = panic_role(&self.panicky, id);
            let error = state.snapshot.error.as_ref();
            match role {
                Some(true)
                    if *status != sm4c_runtime::Status::Failed
                        || !error.is_some_and(|e| {
                            e.kind == sm4c_runtime::ErrorKind::InternalError
                                && e.message.contains("a bug while deciding")
                        }) =>
                {
                    return Err(format!(
                        "{id}, whose decision panicked, ended {status:?} with {error:?}, not failed by the panic"
                    ));
                }
                Some(false) if *status != sm4c_runtime::Status::Failed => {
                    return Err(format!(
                        "{id}, whose subflow's decision panicked, ended {status:?}, not failed with it"
                    ));
                }
                _ => {}
            }
            if role.is_none() && *status == sm4c_runtime::Status::Failed {
                return Err(format!("{id} failed, though no decision of it panicked: {error:?}"));
            }
            let seq = self.seqs.contains_key(id);
            let (events, calls, timers) = match (run, &parent, role) {
                (Some(_), _, _) => (0, 0, 0),
                _ if seq => (0, 0, 0),
                // Failed at its call's result, before its subflow.
                (None, None, Some(true)) => (0, 0, 0),
                // Failed with its subflow: its call's result only.
                (None, None, Some(false)) => (0, 1, 0),
                // Failed at its timer.
                (None, Some(_), Some(true)) => (0, 0, 0),
                (None, Some(_), _) => (0, 0, 1),
                (None, None, None) => (1, 2, 0),
            };
            if done.len() != events {
                return Err(format!(
                    "instance {id} sent {} events, not {events}: {done:?}",
                    done.len()
                ));
            }
            // The journal: gapless, each input once.
            let p = partition_of(id, PARTITIONS);
            let mut next = 1;
            let mut starts = 0;
            let (mut fired, mut completed, mut consumed) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
            // The events it took, in the order it took them.
            let mut took = Vec::new();
            for r in self.broker.truth(&topics.journal, p) {
                if r.key.as_deref() != Some(id) {
                    continue;
                }
                let j: JournalRecord = serde_json::from_slice(r.payload.as_deref().unwrap_or_default())
                    .map_err(|e| format!("journal record of {id}: {e}"))?;
                if j.seq != next {
                    return Err(format!(
                        "the journal of {id} has entries from {} where {next} was next",
                        j.seq
                    ));
                }
                next += j.entries.len() as i64;
                for e in &j.entries {
                    match e {
                        Entry::Input(t) => match &t.input {
                            Input::Start { .. } => starts += 1,
                            Input::TimerFired { timer } => *fired.entry(timer.clone()).or_insert(0) += 1,
                            Input::Completed { op, .. } => *completed.entry(op.clone()).or_insert(0) += 1,
                            _ => {}
                        },
                        Entry::Trace(Trace::EventConsumed { id: event, .. }) => {
                            *consumed.entry(event.clone()).or_insert(0) += 1;
                            took.push(event.clone());
                        }
                        _ => {}
                    }
                }
            }
            if starts != 1 {
                return Err(format!("the journal of {id} has {starts} starts"));
            }
            for (what, counts) in [("timer", &fired), ("call", &completed), ("event", &consumed)] {
                if let Some((k, n)) = counts.iter().find(|(_, n)| **n > 1) {
                    return Err(format!("{id} took {what} {k} {n} times"));
                }
            }
            if completed.len() != calls {
                return Err(format!(
                    "{id} completed {} calls and subflows, not {calls}",
                    completed.len()
                ));
            }
            if let Some(at) = run {
                let at = sm4c_schedule::parse_time(at).map_err(|e| format!("run {id}: {e}"))?;
                scheduled.push(at);
                continue;
            }
            // A sequence took its steps, from one source on one events partition, in the order
            // they were produced (all of them, unless one came too late, parked past its window
            // before its instance started: those are dead-lettered, as checked below).
            if seq {
                let want: Vec<String> = (1..=STEPS_PER_SEQUENCE).map(|j| format!("step-{id}-{j}")).collect();
                let places: Vec<Option<usize>> = took.iter().map(|e| want.iter().position(|w| w == e)).collect();
                let in_order = places.iter().all(Option::is_some) && places.windows(2).all(|w| w[0] < w[1]);
                let done = state.snapshot.state_name.as_deref() == Some("Done");
                if !in_order || done != (took.len() == want.len()) {
                    return Err(format!(
                        "{id} took its steps as {took:?} and ended in {:?}, not as {want:?} in that order",
                        state.snapshot.state_name
                    ));
                }
                seq_took.extend(took.iter().cloned());
                continue;
            }
            if parent.is_some() {
                if fired.len() != timers {
                    return Err(format!("subflow {id} fired {} timers, not {timers}", fired.len()));
                }
                continue;
            }
            let by_event = consumed.contains_key(&format!("go-{id}"));
            if by_event {
                took_go.insert(id.clone());
            }
            let go = format!("go-{id}");
            if role.is_some() && state.snapshot.inbox.iter().any(|e| e["id"] == go.as_str()) {
                inboxed.insert(id.clone());
            }
            if role.is_some() {
                if by_event {
                    return Err(format!(
                        "{id} failed by a panic before it waited, yet took its go event"
                    ));
                }
                continue;
            }
            let how = done[0]["how"].as_str().unwrap_or_default();
            if by_event && self.keyed_only.get(id) == Some(&true) {
                by_key += 1;
            }
            if by_event != (how == "event") || (how == "timer") != (fired.len() == 1) {
                return Err(format!(
                    "{id} ended by {how:?} but its journal has {} go events and {} timers",
                    consumed.len(),
                    fired.len()
                ));
            }
        }
        // The schedule: each nominal time from its first run to its end started once (its
        // catch-up window spans the whole run, and its overlap policy starts every time), and it
        // knows it did, each run's end told to it.
        scheduled.sort_unstable();
        let r = self
            .schedule_record()
            .ok_or_else(|| format!("schedule {SCHEDULE} has no committed record"))?;
        let first = *scheduled.first().ok_or("the schedule started no run")?;
        let end = 1_700_000_000_000 + SCHEDULE_FOR;
        let want: Vec<i64> = (first..end).step_by(SCHEDULE_EVERY as usize).collect();
        if scheduled != want {
            let missing: Vec<String> = want
                .iter()
                .filter(|t| !scheduled.contains(t))
                .map(|t| sm4c_schedule::rfc3339(*t))
                .collect();
            return Err(format!(
                "schedule {SCHEDULE} ran {} times from {}, not each of {}: missing {missing:?}",
                scheduled.len(),
                sm4c_schedule::rfc3339(first),
                want.len()
            ));
        }
        if r.state.runs != scheduled.len() as u64 || !r.state.running.is_empty() || r.state.skipped.catchup != 0 {
            return Err(format!(
                "schedule {SCHEDULE} started {} runs, but its state says {:?}",
                scheduled.len(),
                r.state
            ));
        }
        for id in &self.started {
            let n = children.get(id).map_or(0, Vec::len);
            // Failed at its call's result, before it started its subflow.
            let want = match self.panicky.as_ref() {
                Some((kind, of)) if *kind == "result" && of == id => 0,
                _ => 1,
            };
            if n != want {
                return Err(format!("{id} has {n} subflows, not {want}: {:?}", children.get(id)));
            }
        }
        for ((id, op), n) in &self.executed {
            if *n == 0 {
                return Err(format!("call {op} of {id} was never made"));
            }
        }
        // Dead letters: at most one per incoming event record.
        let mut dead = BTreeSet::new();
        let mut panicked = 0;
        for r in self.broker.truth(&topics.deadletter, 0) {
            let origin = r
                .headers
                .iter()
                .find(|(k, _)| k == "sm4c-origin")
                .map(|(_, v)| String::from_utf8_lossy(v).to_string())
                .unwrap_or_default();
            let code = r.headers.iter().find(|(k, _)| k == "sm4c-deadletter-code");
            if code.is_some_and(|(_, c)| c.as_slice() == b"panicked") {
                // The command whose decision panicked, and nothing else.
                let c: Command = serde_json::from_slice(r.payload.as_deref().unwrap_or_default())
                    .map_err(|e| format!("the panicked command from {origin}: {e}"))?;
                let v = serde_json::to_value(&c).unwrap_or_default();
                let id = v.get("id").and_then(Value::as_str).unwrap_or_default();
                let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
                let ours = self.panicky.as_ref().is_some_and(|(k, _)| *k == kind);
                if !ours || panic_role(&self.panicky, id) != Some(true) {
                    return Err(format!("a {kind} command for {id:?} is dead-lettered as panicked"));
                }
                panicked += 1;
            }
            // A broker that shows aborted records shows the workers the commands an aborted
            // transaction routed too: an event for an ended instance routed in one is
            // dead-lettered again when it is routed anew. Kafka hides them.
            if !dead.insert(origin.clone()) && !self.broker.shows_aborted {
                return Err(format!("the event from {origin} is dead-lettered twice"));
            }
        }
        if self.panicky.is_some() && panicked == 0 {
            return Err(format!(
                "no command is dead-lettered as panicked, though deciding {:?} panics",
                self.panicky
            ));
        }
        // An instance that did not take its go event (it ended by its timer, or a panic failed
        // it): each one sent to it is dead-lettered (once, as checked above), unless it reached
        // the instance, which holds it in its inbox as it ended (a panic failed it before it
        // waited for it).
        for (id, event, origin) in &self.steps {
            if !seq_took.contains(event) && !dead.contains(origin) {
                return Err(format!(
                    "step {event} of {id} ({origin}) was neither taken nor dead-lettered"
                ));
            }
        }
        for (id, origin) in &self.gos {
            if !took_go.contains(id) && !inboxed.contains(id) && !dead.contains(origin) {
                return Err(format!("the go event for {id} ({origin}) is not dead-lettered"));
            }
        }
        Ok(by_key)
    }
}

/// A record of the model as the consumer hands it over.
fn message(topic: &str, p: i32, r: &Rec) -> OwnedMessage {
    let mut headers = OwnedHeaders::new();
    for (k, v) in &r.headers {
        headers = headers.insert(Header {
            key: k,
            value: Some(v.as_slice()),
        });
    }
    OwnedMessage::new(
        r.payload.clone(),
        r.key.clone().map(String::into_bytes),
        topic.to_string(),
        Timestamp::CreateTime(r.ts),
        p,
        r.offset,
        (!r.headers.is_empty()).then_some(headers),
    )
}

/// What a seed's run saw, for the checks that the faults happen.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// Instances that took a go event routed by key.
    by_key: usize,
    /// Whether its groups rebalanced eagerly.
    eager: bool,
    /// Transactions held on a partition by late markers, and those the stall guard landed.
    held: usize,
    unstuck: usize,
    /// Restores that repaired the group's lost offsets.
    repairs: usize,
    /// Threads that panicked with their transaction open.
    panicked: usize,
    /// Commands and events records retention deleted.
    retained: usize,
}

/// Runs one seed: a random schedule with faults, then a healed run to the end, then the checks.
fn run(shared: &Shared, seed: u64, verbose: bool) -> Result<Seen, (String, Vec<String>)> {
    run_traced(shared, seed, verbose).0
}

/// [`run`], and the whole schedule as it ran.
#[allow(clippy::type_complexity)]
fn run_traced(shared: &Shared, seed: u64, verbose: bool) -> (Result<Seen, (String, Vec<String>)>, Vec<String>) {
    let mut w = World::new(shared, seed, verbose);
    let _panics = PanicFor::set(w.panicky.clone());
    if let Some((kind, id)) = &w.panicky {
        w.note(format!("deciding a {kind} command of {id} or its subflow panics"));
    }
    if w.broker.late {
        let only = if w.broker.stingy {
            ", only by the stall guard"
        } else {
            ""
        };
        w.note(format!("the markers of committed transactions land late{only}"));
    }
    w.create_schedule();
    let instances = INSTANCES.0 + w.rng.usize(..INSTANCES.1);
    let steps = STEPS.0 + w.rng.usize(..STEPS.1);
    let mut next_start = 0;
    for _ in 0..steps {
        w.random_step(&mut next_start, instances);
    }
    while next_start < instances {
        w.start(next_start);
        next_start += 1;
    }
    let r = w
        .heal()
        .and_then(|()| w.clock_fault.take().map_or(Ok(()), Err))
        .and_then(|()| w.check())
        .map(|by_key| Seen {
            by_key,
            eager: w.eager,
            held: w.broker.held,
            unstuck: w.broker.unstuck,
            repairs: w.repairs,
            panicked: w.panicked,
            retained: w.retained,
        });
    if verbose {
        eprintln!("{r:?}");
    }
    let trace = w.trace.clone();
    let r = r.map_err(|e| {
        let mode = if w.broker.shows_aborted {
            "showing aborted records"
        } else {
            "hiding aborted records"
        };
        (format!("{e} ({mode})"), w.trace)
    });
    (r, trace)
}

/// A seed is a replay: the same schedule, the same decisions, the same trace, every time (no
/// `HashMap` order, clock or randomness of the process leaks into what the workers decide).
#[test]
fn a_seed_runs_the_same_way_every_time() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    for seed in 0..10 {
        let (first, a) = run_traced(&shared, seed, false);
        let (second, b) = run_traced(&shared, seed, false);
        assert_eq!(first.is_ok(), second.is_ok(), "seed {seed}");
        if let Some(i) = (0..a.len().max(b.len())).find(|i| a.get(*i) != b.get(*i)) {
            panic!(
                "seed {seed} ran differently the second time, at step {i}:\n  {:?}\n  {:?}",
                a.get(i),
                b.get(i)
            );
        }
    }
}

#[test]
fn the_workers_decisions_stay_exactly_once_under_seeded_crashes_rebalances_and_aborts() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    if let Some(seed) = std::env::var("SM4C_SIM_SEED").ok().and_then(|s| s.parse::<u64>().ok()) {
        if let Err((e, _)) = run(&shared, seed, true) {
            panic!("seed {seed}: {e}");
        }
        return;
    }
    let seeds: u64 = std::env::var("SM4C_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    // Where the range starts, to split a long run over processes.
    let from: u64 = std::env::var("SM4C_SIM_FROM")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (mut by_key, mut eager, mut held, mut unstuck, mut repairs, mut panicked, mut retained) = (0, 0, 0, 0, 0, 0, 0);
    for seed in from..from + seeds {
        match run(&shared, seed, false) {
            Ok(seen) => {
                by_key += seen.by_key;
                eager += usize::from(seen.eager);
                held += seen.held;
                unstuck += seen.unstuck;
                repairs += seen.repairs;
                panicked += seen.panicked;
                retained += seen.retained;
            }
            Err((e, trace)) => {
                let tail = trace[trace.len().saturating_sub(60)..].join("\n");
                panic!(
                    "seed {seed} fails: {e}\nthe last steps of its schedule:\n{tail}\nreplay it with SM4C_SIM_SEED={seed} cargo test -p sm4c-kafka --lib sim"
                );
            }
        }
    }
    // The schedules go through routing by correlation key, not only around it.
    assert!(
        seeds < 20 || by_key >= seeds as usize / 4,
        "only {by_key} instances in {seeds} seeds took a go event routed by its key"
    );
    // Both kinds of rebalancing.
    assert!(
        seeds < 20 || (eager >= seeds as usize / 8 && eager <= seeds as usize / 2),
        "{eager} of {seeds} seeds rebalanced eagerly"
    );
    // Late markers hold partitions back, and the stall guard lands them where nothing else does.
    assert!(
        seeds < 20 || (held >= seeds as usize && unstuck > 0),
        "in {seeds} seeds late markers held {held} transactions, and the stall guard landed {unstuck}"
    );
    // Lost offsets are repaired, and threads panic with their transactions open.
    assert!(
        seeds < 20 || (repairs > 0 && panicked > 0 && retained > 0),
        "in {seeds} seeds {repairs} restores repaired lost offsets, {panicked} threads panicked mid-transaction, and retention deleted {retained} records"
    );
    eprintln!(
        "{seeds} seeds ({eager} rebalancing eagerly); {by_key} instances took a go event routed by its correlation key; late markers held {held} transactions on a partition, {unstuck} landed by the stall guard; {repairs} restores repaired lost offsets; {panicked} threads panicked mid-transaction; retention deleted {retained} consumed commands and events records"
    );
}

/// Issue 34, item 5: seeds that fail when a worker's clock decides something again, kept as
/// regression seeds (they run in CI's range too; here they run whatever `SM4C_SIM_SEEDS` says),
/// each with a worker's clock ahead and another's behind. Found by mutations, each failing the
/// seed named: a timer decided at its proposal's timestamp (`at.max(due)`) rather than its due
/// time; the timestamps of timers, ticks and barriers moving the stream time; a tick naming the
/// proposer's clock rather than the due time it is for (`Owner::tick_at`).
#[test]
fn seeds_that_caught_a_workers_clock_deciding_pass() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    for seed in CLOCK_SEEDS {
        let skew = skews(seed);
        assert!(
            skew.iter().any(|s| *s > 0) && skew.iter().any(|s| *s < 0),
            "seed {seed} runs no clock ahead and behind: {skew:?}"
        );
        if let Err((e, _)) = run(&shared, seed, false) {
            panic!("seed {seed} fails: {e}");
        }
    }
}

/// See [`seeds_that_caught_a_workers_clock_deciding_pass`].
const CLOCK_SEEDS: [u64; 1] = [0];

/// Issue 34, item 2: seeds whose decisions panic ([`panics`]), kept as regression seeds of what
/// the panic found. A panicking decision failed its instance in place (`force_fail`), not through
/// the driver: seed 6, whose subflow's timer panics, never ended its parent (nobody told it its
/// subflow failed), and seed 15, whose call result panics, left the failed instance subscribed to
/// its correlation key. Both fail with `Decision::guarded` failing the instance in place again.
/// Seed 65, whose subflow's timer panics, fails when the failure is decided at the panicking
/// record's timestamp (a timer's carries its proposer's clock) rather than the stream time.
#[test]
fn seeds_that_caught_a_panic_failing_its_instance_in_place_pass() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    for (seed, kind) in PANIC_SEEDS {
        let panicky = panics(seed);
        assert_eq!(
            panicky.as_ref().map(|(k, _)| *k),
            Some(kind),
            "seed {seed} no longer panics at a {kind}"
        );
        if let Err((e, _)) = run(&shared, seed, false) {
            panic!("seed {seed} ({panicky:?}) fails: {e}");
        }
    }
}

/// Seeds 667 and 2130 lose a partition's offsets right after its first transaction that decided
/// something. When that transaction was numbered 0, its position record was no higher than the
/// clock the group read once the offsets were lost (0): the loss went unnoticed and the commands
/// were decided again (an instance's journal began again at entry 1). Since a new partition's
/// first transaction decides nothing and numbers the clock 1 (`restore::commit_offsets`), the loss
/// is seen and repaired.
#[test]
fn seeds_that_lose_offsets_after_a_partitions_first_decisions_pass() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    for seed in [667, 2130] {
        match run(&shared, seed, false) {
            Ok(seen) => assert!(seen.repairs > 0, "seed {seed} no longer repairs lost offsets"),
            Err((e, _)) => panic!("seed {seed} fails: {e}"),
        }
    }
}

/// Seeds 1030 and 2929: a partition whose stream time was behind (0, after a restore whose last
/// transaction took no timestamped input) routed an event in its transaction and stamped the
/// command with its own stream time; the key's partition parked the event with a window that
/// ended in 1970 and reported it unmatched at once, while it was parked. A transaction's records
/// are now stamped no earlier than the events routed in it, and a restored owner starts from the
/// stream time its last committed position record names.
#[test]
fn seeds_whose_routed_commands_were_stamped_with_a_restored_partitions_stream_time_pass() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    for seed in [1030, 2929] {
        if let Err((e, _)) = run(&shared, seed, false) {
            panic!("seed {seed} fails: {e}");
        }
    }
}

/// Seed 6189: an event for an instance not started yet was parked, the next event of the same
/// events partition for it came as a command (its partition's owner had dropped it and another
/// partition's transaction routed the event), and the batch that started the instance applied the
/// command before the end of the batch delivered the parked, older event: the instance took its
/// steps out of order. An event delivered to an instance now first takes the older parked events
/// of its events partition named for it (`Decision::unpark_older`).
#[test]
fn a_seed_whose_instance_took_a_newer_event_before_the_parked_older_one_passes() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    if let Err((e, _)) = run(&shared, 6189, false) {
        panic!("seed 6189 fails: {e}");
    }
}

/// Seed 425, on a broker that shows aborted records: an instance's partition sent a `Subscribe` in
/// a transaction that was aborted (the events group's generation was stale), the key's partition
/// took it all the same, and the transaction that replaced it started and ended the instance in
/// one batch, so never unsubscribed it: the subscription stayed for good. It passes since the key's
/// partition asks the instance's to confirm each new subscription (`Command::Subscribed`).
#[test]
fn a_seed_whose_aborted_transaction_subscribed_an_instance_passes() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    if let Err((e, _)) = run(&shared, 425, false) {
        panic!("seed 425 fails: {e}");
    }
}

/// Issue 34: seeds that lose the group's committed offsets of commands partitions ([`World::expire`]),
/// whose restores must repair them from the partitions' position records: without the repair,
/// seed 1 never ends four of its instances (their partition read its commands again from the
/// beginning over state it took as uncommitted). Seed 45 caught a restore that read its partition
/// from a local store a restore had written without the position (the offsets lost again, the next
/// restore found nothing to repair from), and each repair is checked against the offsets that were
/// lost.
#[test]
fn seeds_that_lose_the_groups_offsets_pass() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    for seed in [1, 45] {
        match run(&shared, seed, false) {
            Ok(seen) => assert!(seen.repairs > 0, "seed {seed} no longer repairs lost offsets"),
            Err((e, _)) => panic!("seed {seed} fails: {e}"),
        }
    }
}

/// Issue 34, item 4: seeds whose brokers land late markers only with the stall guard's
/// transactions ([`Broker::stingy`]), so that every `read_committed` reader goes on only if the
/// guard's rules ([`super::stall::Watch`], run by each simulated worker by its own clock) find
/// and end every stalled partition. Both fail with the guard left out, and with a guard that does
/// not look at the sent events' topic.
#[test]
fn seeds_whose_late_markers_only_the_stall_guard_lands_pass() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    for seed in GUARD_SEEDS {
        let w = World::new(&shared, seed, false);
        assert!(
            w.broker.late && w.broker.stingy,
            "seed {seed} no longer lands markers only by the guard"
        );
        match run(&shared, seed, false) {
            Ok(seen) => assert!(seen.unstuck > 0, "seed {seed}: the guard landed nothing: {seen:?}"),
            Err((e, _)) => panic!("seed {seed} fails: {e}"),
        }
    }
}

/// Issue 34, the simulation's check of event order per instance: a seed whose sequence `s52`
/// ([`sequence`]) took step 2 before step 1 when a restore put the parked events of its key's
/// partition in the order of their expiry rather than the order they were read (an event routed
/// by key is parked at the stream time of the partition that sent it there). It fails with the
/// restore sorting them by expiry again.
#[test]
fn a_seed_that_caught_an_instance_taking_its_events_out_of_order_passes() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    for seed in ORDER_SEEDS {
        assert!(
            World::new(&shared, seed, false).seq_rng.is_some(),
            "seed {seed} runs no sequence"
        );
        if let Err((e, _)) = run(&shared, seed, false) {
            panic!("seed {seed} fails: {e}");
        }
    }
}

/// See [`a_seed_that_caught_an_instance_taking_its_events_out_of_order_passes`].
const ORDER_SEEDS: [u64; 1] = [123];

/// See [`seeds_whose_late_markers_only_the_stall_guard_lands_pass`].
const GUARD_SEEDS: [u64; 2] = [7, 21];

/// See [`seeds_that_caught_a_panic_failing_its_instance_in_place_pass`].
const PANIC_SEEDS: [(u64, &str); 3] = [(6, "timer"), (15, "result"), (65, "timer")];

#[test]
fn an_expired_instance_leaves_the_local_store_and_its_index_in_the_transaction_that_deletes_it() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    let p = 0;
    let mut old = crate::view::tests::record("old", "order", sm4c_runtime::Status::Completed, 5);
    old.snapshot.ended_at = Some(1_000);
    let waiting = crate::view::tests::record("new", "order", sm4c_runtime::Status::Waiting, 6);
    // A restore reads both from the state partition into an empty store.
    let mut state = Latest::new(10, 10);
    for r in [&old, &waiting] {
        let record = StateRecord {
            through: 0,
            clock: Some(0),
            instance: Some(r.clone()),
            ..StateRecord::default()
        };
        let payload = serde_json::to_vec(&record).unwrap_or_default();
        state.record(Some(r.snapshot.id.clone()), Some(&payload), None);
    }
    let stores = MemoryStores::default();
    let store = stores.open("sim.state-0").expect("a memory store opens");
    assert_eq!(state.save(store.as_ref(), p, 0, 2), Some(2));
    let rows = || {
        let mut ids = Vec::new();
        store
            .scan(crate::view::ROW_PREFIX, &mut |k, _| {
                ids.extend(crate::view::parse_row_key(k).map(|(_, id)| id.to_string()))
            })
            .expect("a memory store reads");
        ids
    };
    assert_eq!(rows(), ["old", "new"], "the restore wrote the rows of the local index");
    let (mut t, _) = state.owner(&shared, p, None, None);
    t.store = Some(store.clone());
    t.place_index(0, 60_000).expect("a memory store writes");
    assert_eq!(
        store.count(super::index::ENDED_PREFIX).expect("a memory store reads"),
        2,
        "the ended instance is in the store's index, by time and by id"
    );
    assert!(t.ended.kept.mem.is_empty(), "not in memory");
    assert!(t.ended.contains("old") && !t.ended.contains("new"));
    let retention = 60_000;
    t.expire(1_000, retention);
    assert!(t.expired.is_empty(), "not yet");
    t.expire(1_000 + retention, retention);
    assert_eq!(t.expired, [("old".to_string(), crate::view::seq(&old, p))]);
    // The owner's tick deletes it: its state record and its row go in the same write.
    let now = 1_000 + retention;
    let tick = super::command(&shared, p, None, &Command::Tick { at: None });
    let payload = tick.payload.unwrap_or_default();
    let mut b = decision::decide(
        &shared,
        &mut t,
        [(10, now, payload.as_slice())],
        Default::default(),
        now,
    );
    assert!(b.records.iter().any(|(id, r)| id == "old" && r.is_none()));
    let index = std::mem::take(&mut b.index);
    let (changes, _) = super::local_changes(&shared, p, &b.outs, index, None);
    let refs: Vec<(&str, Option<&[u8]>)> = changes.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
    store.apply(&refs, None).expect("a memory store writes");
    assert_eq!(store.get("old").expect("a memory store reads"), None);
    assert!(store.get("new").expect("a memory store reads").is_some());
    assert_eq!(rows(), ["new"], "the expired instance's row is gone with it");
    assert_eq!(
        store.count(super::index::ENDED_PREFIX).expect("a memory store reads"),
        0
    );
    t.committed(b);
    assert!(!t.ended.contains("old"));
}

#[test]
fn far_timers_wait_in_the_local_store_and_come_into_memory_as_they_near() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let shared = shared(&rt);
    let (p, horizon) = (0, 60_000);
    let state = Latest::new(0, 0);
    let (mut t, _) = state.owner(&shared, p, None, None);
    let stores = MemoryStores::default();
    let store = stores.open("sim.state-0").expect("a memory store opens");
    // A stale timer a previous owner left in the store goes; of a restore's timers, the near
    // one stays in memory and the far one goes to the store.
    let stale = super::index::timer_key(5_000, "gone", "t");
    store
        .apply(&[(stale.as_str(), Some(&[][..]))], None)
        .expect("a memory store writes");
    t.timers.insert((1_000, "a".into(), "near".into()));
    t.timers.insert((100_000, "b".into(), "far".into()));
    t.store = Some(store.clone());
    t.place_index(0, horizon).expect("a memory store writes");
    let stored = || {
        let mut keys = Vec::new();
        store
            .scan(super::index::TIMER_PREFIX, &mut |k, _| {
                keys.extend(super::index::parse_timer_key(k));
            })
            .expect("a memory store reads");
        keys
    };
    assert_eq!(t.horizon, horizon);
    assert_eq!(t.timers.iter().map(|x| x.2.as_str()).collect::<Vec<_>>(), ["near"]);
    assert_eq!(stored(), [(100_000, "b".to_string(), "far".to_string())]);
    // A decided batch arms a far timer and cancels one: changes of the store, not of memory.
    let after = vec![
        (
            "c".to_string(),
            Work::ArmTimer {
                timer: "later".into(),
                due: 70_000,
            },
        ),
        (
            "b".to_string(),
            Work::CancelTimer {
                timer: "far".into(),
                due: Some(100_000),
            },
        ),
        (
            "a".to_string(),
            Work::ArmTimer {
                timer: "soon".into(),
                due: 2_000,
            },
        ),
    ];
    let changes = t.far_timers(&after);
    assert_eq!(changes.len(), 2, "{changes:?}");
    let refs: Vec<(&str, Option<&[u8]>)> = changes.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
    store.apply(&refs, None).expect("a memory store writes");
    for (id, work) in after {
        t.track(&id, work);
    }
    assert_eq!(t.timers.len(), 2, "near and soon");
    assert_eq!(stored(), [(70_000, "c".to_string(), "later".to_string())]);
    // Half way to the horizon, the next ones come into memory, but not before the keeper has
    // written what it was given (a timer on its way may be due before the new horizon).
    t.last_ticket = 7;
    t.advance_timers(29_000, horizon, 7);
    assert_eq!(t.horizon, horizon, "not half way yet");
    t.advance_timers(31_000, horizon, 6);
    assert_eq!(t.horizon, horizon, "the keeper is behind");
    t.advance_timers(31_000, horizon, 7);
    assert_eq!(t.horizon, 91_000);
    assert!(t.timers.contains(&(70_000, "c".to_string(), "later".to_string())));
    assert_eq!(
        t.index_next.len(),
        1,
        "its key leaves the store with the next transaction"
    );
    assert_eq!(t.index_next[0].1, None);
}
