//! Partitions whose last stable offset stays behind their end: found, reported, and ended.
//!
//! A `read_committed` reader of a partition stops at its last stable offset (LSO): the first record
//! of a transaction the broker has not finalized. On Apache Kafka the transaction coordinator writes
//! the markers itself, and the LSO stays behind only while a transaction is open (at most
//! `transaction.timeout.ms`). tansu (the broker of the tests and the demo) finalizes a transaction
//! its client ended only when that `EndTxn` finds every transaction overlapping it on its partitions
//! ended by its client too; one that ended while another was open (a SIGKILLed worker's, rolled back
//! later when its transactional id is taken over) stays prepared until a later transaction on one of
//! its partitions ends. At the end of a workload nothing may write that partition again, and every
//! reader behind it (the owners reading commands, the consumers of sent events) stops for good.
//!
//! The guard, a thread of each worker beside its loop, looks at the partitions the cluster writes in
//! transactions (commands, state, journal, sent events, dead letters and every topic this worker's
//! transactions wrote), the share of them mapped to the commands partitions this worker owns
//! (partition `q` to commands partition `q mod n`, so one worker looks at each). A partition whose
//! LSO stays behind its end, unmoved, for [`STALL_AFTER`] is *stalled*: it is logged, shown in
//! `/healthz` (`stalledPartitions`) and in the metrics (`sm4c_kafka_partition_stalled_seconds`).
//! Then the guard ends a transaction there: one record, aborted, under the transactional id
//! `<group>.unstick.<commands partition>` (taken over with the commands partition, so a dead
//! worker's open one is rolled back by the next owner). Its end finalizes the prepared
//! transactions it overlaps once none of them is open; the aborted record is invisible to
//! `read_committed` readers, which are the readers exactly-once delivery is for. It is tried again
//! with a growing wait ([`REPAIR_AFTER`]) while the partition stays stalled: on a broker that
//! never stalls this way (Apache Kafka) it is a cheap aborted transaction after a producer died with
//! one open, and nothing otherwise.

use crate::wire::Quiet;
use crate::Shared;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{Producer, ThreadedProducer};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long a partition's LSO stays behind its end, unmoved, before it counts as stalled.
pub(crate) const STALL_AFTER: Duration = Duration::from_secs(8);
/// How often the guard looks.
const EVERY: Duration = Duration::from_secs(2);
/// The waits between the transactions ended on a partition that stays stalled.
const REPAIR_AFTER: [Duration; 5] = [
    Duration::ZERO,
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
    Duration::from_secs(60),
];
/// The header of the record a repair writes (and aborts) on a stalled partition other than a
/// commands partition.
pub const UNSTICK_HEADER: &str = "sm4c-unstick";
/// How long a query of the broker may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the partition counts of the watched topics are read again.
const METADATA_EVERY: Duration = Duration::from_secs(60);

/// What the guard knows, shared with the worker's health and its loop.
#[derive(Default)]
pub(crate) struct Stalls {
    /// Stalled partitions now: (topic, partition) → what is known of the stall.
    now: Mutex<BTreeMap<(String, i32), Stalled>>,
    /// Topics this worker's transactions wrote beyond the cluster's own (a definition's `topic`).
    written: RwLock<BTreeSet<String>>,
}

/// A stalled partition, as `/healthz` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Stalled {
    pub topic: String,
    pub partition: i32,
    /// Where `read_committed` readers stop.
    pub last_stable_offset: i64,
    /// The partition's end.
    pub high_watermark: i64,
    /// For how long the LSO has not moved (ms).
    pub stalled_ms: u64,
    /// Transactions the guard ended there since it stalled.
    pub repairs: u32,
}

impl Stalls {
    /// The stalled partitions now, for `/healthz`.
    pub(crate) fn list(&self) -> Vec<Stalled> {
        self.now
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// A committed transaction wrote these topics.
    pub(crate) fn wrote<'a>(&self, topics: impl Iterator<Item = &'a str>) {
        let mut new = Vec::new();
        {
            let known = self.written.read().unwrap_or_else(|p| p.into_inner());
            for t in topics {
                if !known.contains(t) && !new.contains(&t) {
                    new.push(t);
                }
            }
        }
        if !new.is_empty() {
            let mut known = self.written.write().unwrap_or_else(|p| p.into_inner());
            known.extend(new.into_iter().map(str::to_string));
        }
    }

    fn written(&self) -> Vec<String> {
        self.written
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// What the guard decides of one look at a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Readers reach the end, or the LSO moved since the last look.
    Moving,
    /// Behind, not for long enough yet.
    Behind,
    /// Stalled for `for_` (ms); `repair`: end a transaction there now.
    Stalled { for_ms: u64, repair: bool },
}

/// One partition's history, as the guard keeps it between looks.
#[derive(Debug, Clone)]
struct Seen {
    lso: i64,
    /// When the LSO was first seen at this value, behind the end.
    since: Instant,
    /// Transactions ended there since it stalled, and when the last one was.
    repairs: u32,
    last_repair: Option<Instant>,
}

/// The guard's memory of the partitions it looks at: pure, so the rules are tested without a broker.
#[derive(Default)]
pub(crate) struct Watch {
    seen: HashMap<(String, i32), Seen>,
}

impl Watch {
    /// Takes one look at `(topic, partition)`: its LSO and end at `now`.
    pub(crate) fn observe(&mut self, key: (String, i32), lso: i64, high: i64, now: Instant) -> Verdict {
        if lso >= high {
            self.seen.remove(&key);
            return Verdict::Moving;
        }
        let s = self.seen.entry(key).or_insert(Seen {
            lso,
            since: now,
            repairs: 0,
            last_repair: None,
        });
        if s.lso != lso {
            *s = Seen {
                lso,
                since: now,
                repairs: 0,
                last_repair: None,
            };
            return Verdict::Moving;
        }
        let behind = now.saturating_duration_since(s.since);
        if behind < STALL_AFTER {
            return Verdict::Behind;
        }
        let wait = REPAIR_AFTER[(s.repairs as usize).min(REPAIR_AFTER.len() - 1)];
        let repair = s.last_repair.is_none_or(|at| now.saturating_duration_since(at) >= wait);
        Verdict::Stalled {
            for_ms: behind.as_millis() as u64,
            repair,
        }
    }

    /// A transaction was ended on `key` at `now`.
    pub(crate) fn repaired(&mut self, key: &(String, i32), now: Instant) {
        if let Some(s) = self.seen.get_mut(key) {
            s.repairs += 1;
            s.last_repair = Some(now);
        }
    }

    fn repairs(&self, key: &(String, i32)) -> u32 {
        self.seen.get(key).map_or(0, |s| s.repairs)
    }

    /// Forgets the partitions no longer looked at.
    fn retain(&mut self, keep: impl Fn(&(String, i32)) -> bool) {
        self.seen.retain(|k, _| keep(k));
    }
}

/// The guard's thread: runs until the worker stops. Only with exactly-once delivery (without
/// transactions, nothing holds an LSO back).
pub(crate) fn run(shared: &Shared) {
    let mut guard = match Guard::new(shared) {
        Ok(g) => g,
        Err(e) => {
            tracing::error!(error = %e, "the guard of stalled partitions cannot start; stalls are not detected");
            return;
        }
    };
    while !shared.stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        guard.look(shared);
        let rest = EVERY.saturating_sub(started.elapsed());
        // In short naps, so that a stopping worker does not wait for the guard.
        let until = Instant::now() + rest;
        while Instant::now() < until && !shared.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

struct Guard {
    committed: BaseConsumer<Quiet>,
    uncommitted: BaseConsumer<Quiet>,
    watch: Watch,
    /// Partition counts of the watched topics, and when they were read.
    counts: HashMap<String, i32>,
    counted: Option<Instant>,
    /// The `unstick` producers, by commands partition.
    producers: HashMap<i32, ThreadedProducer<Quiet>>,
}

impl Guard {
    fn new(shared: &Shared) -> Result<Guard, String> {
        let group = format!("{}.stalls", shared.cfg.group);
        let committed = shared
            .consumer_config(&group)
            .create_with_context(Quiet)
            .map_err(|e| format!("cannot create a client: {e}"))?;
        let mut c = shared.consumer_config(&group);
        c.set("isolation.level", "read_uncommitted");
        let uncommitted = c
            .create_with_context(Quiet)
            .map_err(|e| format!("cannot create a client: {e}"))?;
        Ok(Guard {
            committed,
            uncommitted,
            watch: Watch::default(),
            counts: HashMap::new(),
            counted: None,
            producers: HashMap::new(),
        })
    }

    /// The topics the cluster writes in transactions and reads `read_committed`: commands, sent
    /// events and whatever else this worker's transactions wrote. Not the state and journal topics:
    /// restores read them to their end whatever their LSO, and tell committed records by offsets.
    fn topics(shared: &Shared) -> Vec<String> {
        let t = &shared.topics;
        let mut all: BTreeSet<String> = [&t.commands, &t.out].into_iter().cloned().collect();
        all.extend(shared.stalls.written());
        for own in [&t.state, &t.journal, &t.members, &t.definitions, &t.clock] {
            all.remove(own);
        }
        all.into_iter().collect()
    }

    fn look(&mut self, shared: &Shared) {
        let owned = shared.members.owned();
        self.producers.retain(|p, _| owned.contains(p));
        let n = shared.partitions.max(1);
        let topics = Guard::topics(shared);
        if self.counted.is_none_or(|at| at.elapsed() >= METADATA_EVERY)
            || topics.iter().any(|t| !self.counts.contains_key(t))
        {
            for t in &topics {
                match self.committed.fetch_metadata(Some(t), QUERY_TIMEOUT) {
                    Ok(md) => {
                        let count = md.topics().first().map_or(0, |x| x.partitions().len() as i32);
                        self.counts.insert(t.clone(), count);
                    }
                    Err(e) => tracing::debug!(topic = t, error = %e, "cannot read a topic's partitions"),
                }
            }
            self.counted = Some(Instant::now());
        }
        let mine: Vec<(String, i32)> = topics
            .iter()
            .flat_map(|t| (0..self.counts.get(t).copied().unwrap_or(0)).map(move |q| (t.clone(), q)))
            .filter(|(_, q)| owned.contains(&(q % n)))
            .collect();
        self.watch.retain(|k| mine.contains(k));
        let mut stalled = BTreeMap::new();
        for key in mine {
            let (t, q) = (&key.0, key.1);
            let (Ok((_, lso)), Ok((_, high))) = (
                self.committed.fetch_watermarks(t, q, QUERY_TIMEOUT),
                self.uncommitted.fetch_watermarks(t, q, QUERY_TIMEOUT),
            ) else {
                continue;
            };
            let now = Instant::now();
            match self.watch.observe(key.clone(), lso, high, now) {
                Verdict::Moving | Verdict::Behind => {}
                Verdict::Stalled { for_ms, repair } => {
                    if repair {
                        let repairs = self.watch.repairs(&key);
                        if repairs == 0 {
                            tracing::warn!(
                                topic = t,
                                partition = q,
                                last_stable_offset = lso,
                                high_watermark = high,
                                stalled_ms = for_ms,
                                "a partition's last stable offset has not moved: read_committed readers stop there; ending a transaction on it to finalize what the broker left prepared"
                            );
                        }
                        match self.repair(shared, q % n, t, q) {
                            Ok(()) => {
                                tracing::debug!(topic = t, partition = q, "ended a transaction on a stalled partition")
                            }
                            Err(e) => {
                                tracing::warn!(topic = t, partition = q, error = %e, "cannot end a transaction on a stalled partition")
                            }
                        }
                        self.watch.repaired(&key, Instant::now());
                        if let Some(o) = sm4c_host::metrics::observer() {
                            o.kafka_stall_repair(t, q);
                        }
                    }
                    stalled.insert(
                        key.clone(),
                        Stalled {
                            topic: t.clone(),
                            partition: q,
                            last_stable_offset: lso,
                            high_watermark: high,
                            stalled_ms: for_ms,
                            repairs: self.watch.repairs(&key),
                        },
                    );
                }
            }
        }
        let mut now = shared.stalls.now.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = sm4c_host::metrics::observer() {
            for (t, q) in now.keys().filter(|k| !stalled.contains_key(*k)) {
                tracing::info!(topic = t, partition = q, "the stalled partition moves again");
                o.kafka_stalled(t, *q, 0.0);
            }
            for s in stalled.values() {
                o.kafka_stalled(&s.topic, s.partition, s.stalled_ms as f64 / 1000.0);
            }
        }
        *now = stalled;
    }

    /// Ends one transaction on `topic`/`q`: one record, aborted, under commands partition `p`'s
    /// `unstick` transactional id. A producer that failed is dropped (the next one fences it).
    fn repair(&mut self, shared: &Shared, p: i32, topic: &str, q: i32) -> Result<(), String> {
        let producer = match self.producers.entry(p) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let id = format!("{}.unstick.{p}", shared.cfg.group);
                v.insert(super::txn_producer(shared, &id, QUERY_TIMEOUT * 2)?)
            }
        };
        let r = (|| {
            producer.begin_transaction().map_err(|e| e.to_string())?;
            // On the commands topic a tick, which owners take as such; elsewhere an empty record
            // with a header that says what it is. Aborted: a broker that filters aborted records
            // (Apache Kafka) shows it to no `read_committed` reader; tansu shows it.
            let record = if topic == shared.topics.commands {
                super::command(shared, q, None, &crate::wire::Command::Tick { at: None })
            } else {
                let mut headers = vec![(UNSTICK_HEADER.to_string(), b"aborted".to_vec())];
                if topic == shared.topics.deadletter {
                    // Readers of dead letters expect a code and a reason on every record.
                    headers.push(("sm4c-deadletter-code".into(), b"unstick".to_vec()));
                    headers.push((
                        "sm4c-deadletter-reason".into(),
                        b"not a dead letter: an aborted record a worker wrote to end a stalled transaction".to_vec(),
                    ));
                }
                super::Out {
                    topic: topic.to_string(),
                    partition: Some(q),
                    key: None,
                    payload: Some(Vec::new()),
                    headers,
                }
            };
            super::produce(producer, &record)?;
            super::drain(producer, Instant::now() + QUERY_TIMEOUT)?;
            producer.abort_transaction(QUERY_TIMEOUT).map_err(|e| e.to_string())
        })();
        if r.is_err() {
            self.producers.remove(&p);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(q: i32) -> (String, i32) {
        ("t".to_string(), q)
    }

    #[test]
    fn a_partition_whose_readers_reach_its_end_or_whose_lso_moves_is_never_stalled() {
        let mut w = Watch::default();
        let t0 = Instant::now();
        assert_eq!(w.observe(key(0), 10, 10, t0), Verdict::Moving);
        assert_eq!(w.observe(key(0), 10, 12, t0), Verdict::Behind);
        // Long behind, but moving each time: a busy partition.
        for i in 1..20 {
            let v = w.observe(key(0), 10 + i, 30, t0 + STALL_AFTER * i as u32);
            assert_eq!(v, Verdict::Moving, "look {i}");
        }
        // At its end again: forgotten.
        assert_eq!(w.observe(key(0), 30, 30, t0 + STALL_AFTER * 30), Verdict::Moving);
        assert_eq!(w.repairs(&key(0)), 0);
    }

    #[test]
    fn a_stalled_partition_is_repaired_at_once_then_with_growing_waits() {
        let mut w = Watch::default();
        let t0 = Instant::now();
        assert_eq!(w.observe(key(1), 5, 9, t0), Verdict::Behind);
        assert_eq!(w.observe(key(1), 5, 9, t0 + STALL_AFTER / 2), Verdict::Behind);
        let at = t0 + STALL_AFTER;
        assert_eq!(
            w.observe(key(1), 5, 9, at),
            Verdict::Stalled {
                for_ms: STALL_AFTER.as_millis() as u64,
                repair: true
            }
        );
        w.repaired(&key(1), at);
        // Not again before the next wait.
        let soon = at + REPAIR_AFTER[1] / 2;
        assert!(matches!(
            w.observe(key(1), 5, 9, soon),
            Verdict::Stalled { repair: false, .. }
        ));
        let later = at + REPAIR_AFTER[1];
        assert!(matches!(
            w.observe(key(1), 5, 9, later),
            Verdict::Stalled { repair: true, .. }
        ));
        w.repaired(&key(1), later);
        assert_eq!(w.repairs(&key(1)), 2);
        // The LSO moves: a fresh start, nothing stalled.
        assert_eq!(w.observe(key(1), 7, 9, later + STALL_AFTER), Verdict::Moving);
        assert_eq!(w.repairs(&key(1)), 0);
        // Partitions are independent.
        assert_eq!(w.observe(key(2), 0, 1, later), Verdict::Behind);
    }

    #[test]
    fn the_waits_between_repairs_stop_growing() {
        let mut w = Watch::default();
        let t0 = Instant::now();
        w.observe(key(0), 1, 2, t0);
        let mut at = t0 + STALL_AFTER;
        for _ in 0..20 {
            assert!(matches!(
                w.observe(key(0), 1, 2, at),
                Verdict::Stalled { repair: true, .. }
            ));
            w.repaired(&key(0), at);
            at += REPAIR_AFTER[REPAIR_AFTER.len() - 1];
        }
        assert_eq!(w.repairs(&key(0)), 20);
    }

    #[test]
    fn topics_written_are_remembered_once() {
        let s = Stalls::default();
        s.wrote(["a", "b", "a"].into_iter());
        s.wrote(["b", "c"].into_iter());
        assert_eq!(s.written(), vec!["a", "b", "c"]);
    }
}
