//! The golden stored-format test of the Kafka host: `tests/golden/records.jsonl` holds the records
//! an earlier build's worker wrote to the state and journal topics (see `tests/golden/README.md`),
//! and today's code must read them as they were written. Every record decodes with today's
//! decoders and encodes back to the same bytes; each partition, restored from its records the way
//! a new owner does ([`Latest`]), holds every unended instance with the same record (same bytes);
//! and each instance's journal, gathered from the journal records, replays (the runtime's fold over
//! it) to the snapshot of its latest state record, as equal JSON values.
//!
//! The records are captured in-process ([`write_golden_records`], run by `scripts/golden.sh`, not by
//! the test suite): the worker's own decision code ([`decision::decide`]) decides each batch of
//! commands, as the simulation (`sim.rs`) runs it, and every record it produces on the state and
//! journal topics is kept, bytes, key and headers as the worker would produce them. No broker is
//! involved: the bytes a broker stores are the bytes produced, and what is under test is the
//! encoding, not the transport.

use super::decision;
use super::restore::Latest;
use super::Owner;
use crate::wire::{partition_of, Command, JournalRecord, ScheduleCmd, StateRecord, CLOCK_HEADER};
use crate::Shared;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};
use sm4c_host::driver::Work;
use sm4c_host::tasks::Answer;
use sm4c_runtime::{Entry, Instance, Machine, Options};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The fixture.
fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/records.jsonl")
}

/// The definitions the records are of: the SQLite golden fixture's.
fn definitions() -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../durable/tests/golden/definitions");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("an entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("cannot read {}: {e}", f.display()));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", f.display()))
        })
        .collect()
}

/// A worker's shared state (the simulation's, with no broker) knowing the golden definitions.
fn shared(rt: &tokio::runtime::Runtime) -> (Shared, BTreeMap<(String, String), Arc<Machine>>) {
    let mut shared = super::sim::shared(rt);
    // Every timer stays in memory: the capture has no local store.
    shared.cfg.timer_horizon_ms = i64::MAX / 4;
    let mut machines = BTreeMap::new();
    for d in definitions() {
        let m = sm4c_runtime::load(&d, &mut sm4c_runtime::no_files, Default::default())
            .unwrap_or_else(|e| panic!("a golden definition does not load: {e:?}"));
        let m = Arc::new(m);
        machines.insert((m.id.clone(), m.version.clone()), m.clone());
        shared.registry.write().unwrap_or_else(|e| e.into_inner()).insert(m);
    }
    (shared, machines)
}

/// One record as a broker keeps it.
#[derive(Debug, Clone, PartialEq)]
struct Rec {
    /// `state` or `journal`.
    topic: &'static str,
    partition: i32,
    key: Option<String>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
}

/// What the fixture holds: the records in the order produced, and per partition the committed
/// offsets of its commands partition and its clock (what a new owner reads them with).
struct Fixture {
    records: Vec<Rec>,
    offsets: BTreeMap<i32, (i64, i64)>,
}

impl Fixture {
    fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for (p, (commands, clock)) in &self.offsets {
            let line = json!({"offsets": {"partition": p, "commands": commands, "clock": clock}});
            out.push_str(&format!("{line}\n"));
        }
        for r in &self.records {
            let line = json!({
                "topic": r.topic,
                "partition": r.partition,
                "key": r.key,
                "value": r.value.as_ref().map(|v| B64.encode(v)),
                "headers": r.headers.iter().map(|(k, v)| json!([k, B64.encode(v)])).collect::<Vec<_>>(),
            });
            out.push_str(&format!("{line}\n"));
        }
        out
    }

    fn read(path: &Path) -> Fixture {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let b64 = |v: &Value| -> Vec<u8> {
            B64.decode(v.as_str().expect("base64 text"))
                .unwrap_or_else(|e| panic!("not base64: {v}: {e}"))
        };
        let mut f = Fixture {
            records: Vec::new(),
            offsets: BTreeMap::new(),
        };
        for (n, line) in text.lines().enumerate() {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("line {}: {e}", n + 1));
            if let Some(o) = v.get("offsets") {
                let int = |k: &str| o[k].as_i64().unwrap_or_else(|| panic!("line {}: {k}", n + 1));
                f.offsets
                    .insert(int("partition") as i32, (int("commands"), int("clock")));
                continue;
            }
            let topic = match v["topic"].as_str() {
                Some("state") => "state",
                Some("journal") => "journal",
                other => panic!("line {}: topic {other:?}", n + 1),
            };
            f.records.push(Rec {
                topic,
                partition: v["partition"].as_i64().expect("partition") as i32,
                key: v["key"].as_str().map(str::to_string),
                value: (!v["value"].is_null()).then(|| b64(&v["value"])),
                headers: v["headers"]
                    .as_array()
                    .expect("headers")
                    .iter()
                    .map(|h| (h[0].as_str().expect("name").to_string(), b64(&h[1])))
                    .collect(),
            });
        }
        f
    }
}

/// A commands partition: its commands (timestamp, payload), and how many were decided.
type Log = (Vec<(i64, Vec<u8>)>, usize);

/// The capture: one owner per partition deciding its commands with the worker's decision code,
/// every batch committed (no faults: what is captured is the encoding).
struct Capture<'a> {
    shared: &'a Shared,
    owners: BTreeMap<i32, Owner>,
    /// Per partition: its commands (timestamp, payload) and how many were decided.
    logs: BTreeMap<i32, Log>,
    fixture: Fixture,
    /// Calls and tasks handed out and not answered yet: (instance, op, arguments).
    calls: Vec<(String, String, Value)>,
    tasks: Vec<(String, String, String, Value)>,
    now: i64,
}

impl<'a> Capture<'a> {
    fn new(shared: &'a Shared) -> Capture<'a> {
        let owners = (0..shared.partitions)
            .map(|p| (p, Latest::new(0, 0).owner(shared, p, None, None).0))
            .collect();
        Capture {
            shared,
            owners,
            logs: BTreeMap::new(),
            fixture: Fixture {
                records: Vec::new(),
                offsets: BTreeMap::new(),
            },
            calls: Vec::new(),
            tasks: Vec::new(),
            // A fixed start, so that the capture is the same on every run of the same code.
            now: 1_795_000_000_000,
        }
    }

    fn command(&mut self, key: &str, c: &Command) {
        let p = partition_of(key, self.shared.partitions);
        let payload = serde_json::to_vec(c).expect("a command encodes");
        self.logs.entry(p).or_default().0.push((self.now, payload));
    }

    fn start(&mut self, definition: &str, id: &str, input: Value) {
        let c = Command::Start {
            id: id.into(),
            definition: definition.into(),
            version: None,
            input,
            parent: None,
            depth: 0,
            origin: None,
            request: Some(format!("golden-{id}")),
            traceparent: None,
            schedule: None,
            nominal: None,
        };
        self.command(id, &c);
    }

    /// Decides every command appended, and those the decisions append, until none is left.
    fn run(&mut self) {
        let (state, journal, commands) = (
            self.shared.topics.state.clone(),
            self.shared.topics.journal.clone(),
            self.shared.topics.commands.clone(),
        );
        loop {
            let Some(p) = self
                .logs
                .iter()
                .find(|(_, (log, read))| *read < log.len())
                .map(|(p, _)| *p)
            else {
                return;
            };
            self.now += 1_000;
            let (log, read) = self.logs.get_mut(&p).expect("the log");
            let batch: Vec<(i64, i64, Vec<u8>)> = log[*read..]
                .iter()
                .enumerate()
                .map(|(i, (ts, v))| ((*read + i) as i64, *ts, v.clone()))
                .collect();
            *read = log.len();
            let o = self.owners.get_mut(&p).expect("an owner");
            let floor = o.stream_ms;
            let records = batch.iter().map(|(off, ts, v)| (*off, *ts, v.as_slice()));
            let b = decision::decide(self.shared, o, records, Default::default(), floor);
            let mut routed = Vec::new();
            for out in &b.outs {
                let partition = out
                    .partition
                    .unwrap_or_else(|| partition_of(out.key.as_deref().unwrap_or_default(), self.shared.partitions));
                let topic = if out.topic == state {
                    "state"
                } else if out.topic == journal {
                    "journal"
                } else {
                    if out.topic == commands {
                        routed.push((partition, out.payload.clone().expect("a command")));
                    } else if out.topic.starts_with(&self.shared.topics.tasks) {
                        // A worker task, published on its task list (the CloudEvent's data).
                        let t: Value =
                            serde_json::from_slice(out.payload.as_deref().unwrap_or_default()).expect("a task's data");
                        let text = |k: &str| t[k].as_str().unwrap_or_else(|| panic!("task {k}: {t}")).to_string();
                        self.tasks.push((
                            text("instanceId"),
                            text("operation"),
                            text("taskList"),
                            t["arguments"].clone(),
                        ));
                    }
                    continue;
                };
                self.fixture.records.push(Rec {
                    topic,
                    partition,
                    key: out.key.clone(),
                    value: out.payload.clone(),
                    headers: out.headers.clone(),
                });
            }
            for (topic, q, next) in &b.offsets {
                let e = self.fixture.offsets.entry(*q).or_default();
                if *topic == commands {
                    e.0 = *next;
                } else if *topic == self.shared.topics.clock {
                    e.1 = *next;
                }
            }
            let (after, _) = o.committed(b);
            for (id, work) in after {
                match work {
                    Work::Call { call, .. } => self.calls.push((id, call.op, call.arguments)),
                    // Published in the transaction (above), never handed back.
                    Work::Task { .. } => unreachable!("the decision publishes tasks itself"),
                    work @ (Work::ArmTimer { .. } | Work::CancelTimer { .. }) => o.track(&id, work),
                    Work::Stop { op, .. } => {
                        self.calls.retain(|c| !(c.0 == id && c.1 == op));
                        self.tasks.retain(|t| !(t.0 == id && t.1 == op));
                    }
                    Work::StartChild(_) | Work::Send { .. } => {}
                }
            }
            for (q, payload) in routed {
                self.logs.entry(q).or_default().0.push((self.now, payload));
            }
        }
    }

    /// Answers the first open task of `instance` on `list`.
    fn answer(&mut self, instance: &str, list: &str, answer: impl FnOnce(&Value) -> Answer) {
        let i = self
            .tasks
            .iter()
            .position(|t| t.0 == instance && t.2 == list)
            .unwrap_or_else(|| panic!("{instance} has no task on {list}: {:?}", self.tasks));
        let (id, op, _, arguments) = self.tasks.remove(i);
        let c = Command::Answer {
            id: id.clone(),
            op,
            answer: answer(&arguments),
            event: None,
            request: None,
        };
        self.command(&id, &c);
        self.run();
    }
}

/// Writes `tests/golden/records.jsonl`: run by `scripts/golden.sh` (`--ignored`), never by the suite.
#[test]
#[ignore = "writes the golden Kafka records: scripts/golden.sh runs it"]
fn write_golden_records() {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let (shared, _) = shared(&rt);
    let mut c = Capture::new(&shared);
    let done = |a: &Value| Answer::Complete(json!({ "done": a }));

    // SM4C: completed after its parallel and foreach tasks; failed by a task (redrive point kept);
    // in the middle of them; a subflow parent and child; waiting on an event; cancelled; a timer.
    c.start("g-work", "sm4c-completed", json!({"items": ["a", "b", "c"]}));
    c.run();
    while c.tasks.iter().any(|t| t.0 == "sm4c-completed") {
        c.answer("sm4c-completed", "golden-work", done);
    }
    c.start("g-work", "sm4c-failed", json!({"items": ["x", "y"]}));
    c.run();
    c.answer("sm4c-failed", "golden-work", |_| {
        Answer::failure(&json!({"error": "Broken", "message": "the golden worker fails"})).expect("a failure")
    });
    c.start("g-work", "sm4c-parallel", json!({"items": ["p", "q", "r"]}));
    c.run();
    c.answer("sm4c-parallel", "golden-work", done);
    c.start("g-parent", "sm4c-parent", json!({"n": 7}));
    c.start("g-event", "sm4c-event", json!({"order": "o-1"}));
    c.start("g-event", "sm4c-cancelled", json!({"order": "o-2"}));
    c.start("g-timer", "sm4c-timer", json!({}));
    c.run();
    c.command(
        "sm4c-cancelled",
        &Command::Cancel {
            id: "sm4c-cancelled".into(),
            reason: "the golden fixture cancels it".into(),
        },
    );
    // ASL: a Map in a Parallel with one task answered, a task token, a Wait, a success, a failure.
    c.start("asl-map", "asl-map", json!({"items": [1, 2, 3]}));
    c.start("asl-token", "asl-token", json!({"amount": 5}));
    c.start("asl-wait", "asl-wait", json!({}));
    c.start("asl-pass", "asl-succeeded", json!({}));
    c.start("asl-fail", "asl-failed", json!({}));
    c.run();
    c.answer("asl-map", "Handle", |a| {
        Answer::Complete(json!({ "handled": a["item"] }))
    });
    // A schedule, triggered once and paused.
    let spec = json!({"id": "golden-hourly", "definition": "asl-pass", "every": "PT1H"});
    for (n, op) in [ScheduleCmd::Create { spec }, ScheduleCmd::Trigger, ScheduleCmd::Pause]
        .into_iter()
        .enumerate()
    {
        let cmd = Command::Schedule {
            schedule: "golden-hourly".into(),
            op,
            request: format!("golden-schedule-{n}"),
        };
        c.command("golden-hourly", &cmd);
        c.run();
    }
    assert!(
        c.calls.is_empty(),
        "the golden definitions call workers only: {:?}",
        c.calls
    );
    std::fs::write(fixture(), c.fixture.to_jsonl()).expect("write the fixture");
}

/// The unended instances the fixture holds, and the ended ones.
const WAITING: &[&str] = &[
    "sm4c-event",
    "sm4c-timer",
    "sm4c-parallel",
    "sm4c-parent",
    "sm4c-parent/1.enter",
    "asl-wait",
    "asl-map",
    "asl-token",
];
const ENDED: &[&str] = &[
    "sm4c-completed",
    "sm4c-failed",
    "sm4c-cancelled",
    "asl-succeeded",
    "asl-failed",
];

#[test]
fn the_golden_records_decode_encode_to_the_same_bytes_restore_and_replay() {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let (shared, machines) = shared(&rt);
    let f = Fixture::read(&fixture());
    assert_eq!(f.offsets.len(), shared.partitions as usize, "every partition's offsets");

    // Every record decodes with today's decoders and encodes back to its bytes.
    let mut latest: BTreeMap<String, StateRecord> = BTreeMap::new();
    let mut journals: BTreeMap<String, BTreeMap<i64, Vec<Entry>>> = BTreeMap::new();
    let (mut positions, mut schedules, mut tombstones) = (0, 0, 0);
    for (n, r) in f.records.iter().enumerate() {
        let key = r.key.clone().unwrap_or_else(|| panic!("record {n} has no key"));
        let Some(bytes) = &r.value else {
            // A tombstone carries the number of the transaction that deleted.
            let clock = r.headers.iter().find(|(k, _)| k == CLOCK_HEADER).map(|(_, v)| v);
            let clock = clock.unwrap_or_else(|| panic!("tombstone {key:?} without {CLOCK_HEADER}"));
            std::str::from_utf8(clock)
                .ok()
                .and_then(|c| c.parse::<i64>().ok())
                .unwrap_or_else(|| panic!("tombstone {key:?}: {CLOCK_HEADER} is not a number"));
            tombstones += 1;
            continue;
        };
        match r.topic {
            "state" => {
                let rec: StateRecord = sm4c_runtime::json::read_stored(bytes)
                    .unwrap_or_else(|e| panic!("state record {n} ({key:?}) does not decode: {e}"));
                assert_eq!(
                    String::from_utf8_lossy(&serde_json::to_vec(&rec).expect("encode")),
                    String::from_utf8_lossy(bytes),
                    "state record {n} ({key:?}) does not encode back to its bytes"
                );
                positions += usize::from(key == crate::wire::POSITION_KEY);
                schedules += usize::from(rec.schedule.is_some());
                if rec.instance.is_some() {
                    latest.insert(key, rec);
                }
            }
            _ => {
                let rec: JournalRecord = sm4c_runtime::json::read_stored(bytes)
                    .unwrap_or_else(|e| panic!("journal record {n} ({key:?}) does not decode: {e}"));
                assert_eq!(
                    String::from_utf8_lossy(&serde_json::to_vec(&rec).expect("encode")),
                    String::from_utf8_lossy(bytes),
                    "journal record {n} ({key:?}) does not encode back to its bytes"
                );
                // Keyed by the instance, as its state record is (and on the same partition).
                let id = key;
                journals.entry(id).or_default().insert(rec.seq, rec.entries);
            }
        }
    }
    assert!(
        positions > 0 && schedules > 0 && tombstones > 0,
        "the fixture holds position and schedule records, and a tombstone"
    );
    let mut ids: Vec<&str> = latest.keys().map(String::as_str).collect();
    ids.retain(|id| !id.starts_with("golden-hourly@"));
    let mut expected: Vec<&str> = WAITING.iter().chain(ENDED).copied().collect();
    expected.sort_unstable();
    assert_eq!(ids, expected, "the instances with state records");

    // Each journal replays to the snapshot of the instance's latest state record.
    for (id, rec) in &latest {
        let inst = rec.instance.as_ref().expect("an instance");
        let records = journals
            .get(id)
            .unwrap_or_else(|| panic!("{id} has no journal records"));
        let mut entries: Vec<Entry> = Vec::new();
        for (seq, more) in records {
            assert_eq!(*seq, entries.len() as i64 + 1, "{id}: the journal records follow on");
            entries.extend(more.iter().cloned());
        }
        assert_eq!(entries.len() as i64, inst.journal_len, "{id}: the journal's length");
        let s = &inst.snapshot;
        let machine = machines
            .get(&(s.definition.clone(), s.version.clone()))
            .unwrap_or_else(|| panic!("{id}: no definition {} {}", s.definition, s.version));
        let versions = |v: &str| machines.get(&(s.definition.clone(), v.to_string())).cloned();
        let replayed = Instance::replay_versions(machine.clone(), id, &entries, Options::default(), &versions)
            .unwrap_or_else(|e| panic!("the journal of {id} no longer replays: {e}"));
        let diffs = sm4c_runtime::engine::snapshot_differences(replayed.snapshot(), s);
        assert!(
            diffs.is_empty(),
            "replaying the journal of {id} does not give its stored snapshot: {}",
            diffs.join("; ")
        );
        assert_eq!(
            serde_json::to_value(replayed.snapshot()).expect("json"),
            serde_json::to_value(s).expect("json"),
            "replaying the journal of {id} does not give the snapshot of its state record"
        );
    }

    // Each partition restored from its state records as a new owner restores it: the unended
    // instances are held with the very records written, the ended ones are not.
    let mut restored = 0;
    for (p, (commands, clock)) in &f.offsets {
        let mut state = Latest::new(*commands, *clock);
        for r in f.records.iter().filter(|r| r.topic == "state" && r.partition == *p) {
            let clock = r
                .headers
                .iter()
                .find(|(k, _)| k == CLOCK_HEADER)
                .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse().ok());
            state.record(r.key.clone(), r.value.as_deref(), clock);
        }
        let (owner, _) = state.owner(&shared, *p, None, None);
        assert_eq!(owner.unreadable, None, "partition {p}");
        for (id, slot) in &owner.slots {
            let rec = latest.get(id).and_then(|r| r.instance.as_ref());
            let rec = rec.unwrap_or_else(|| panic!("partition {p} restored {id}, which has no state record"));
            assert_eq!(
                serde_json::to_string(&slot.record()).expect("encode"),
                serde_json::to_string(rec).expect("encode"),
                "partition {p} restored {id} other than its record"
            );
            assert!(!ENDED.contains(&id.as_str()), "{id} ended");
            restored += 1;
        }
    }
    assert_eq!(restored, WAITING.len(), "every unended instance is restored");
}
