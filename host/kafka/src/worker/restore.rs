//! Taking over a commands partition: fencing its previous owner, reading its committed offsets and
//! its state from the state topic, re-arming timers.

use super::{
    committed_of, produce, subflow_start, txn_producer, CorrIndex, Out, Owner, Parking, Shared, Slot, RESTORE_TIMEOUT,
};
use crate::wire::{
    parked_key, tally_key, Quiet, StateRecord, CLOCK_HEADER, PARKED_PREFIX, PARTITION_KEY, SUBSCRIPTION_PREFIX,
    TALLY_PREFIX,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::producer::ThreadedProducer;
use sm4c_host::clock::wall_ms as now_ms;
use sm4c_host::driver::Work;
use sm4c_host::local::{Checkpoint, LocalStore};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What a restore gives: the partition's owner and the calls in flight to perform again.
pub(super) type Restored = Result<(Owner, Vec<(String, Work)>), String>;

/// Takes over a commands partition: fences its previous owner, reads its committed offsets (with
/// `offsets`, a client of the group that never joins it) and its state, and re-arms timers; returns
/// the owner and the calls in flight to perform again.
pub(super) fn restore(shared: &Shared, offsets: &BaseConsumer<Quiet>, p: i32, revoked: &AtomicBool) -> Restored {
    // A restore revoked before it ended runs on (its thread is not stopped): it must leave the
    // partition's local store alone from then on, or its older records could land over those of
    // the owner a later restore makes. It looks before each use of the store. (Not a lock: a
    // later restore must not wait for this one's calls to a broker that may be away.)
    let gone = || {
        revoked
            .load(Ordering::Relaxed)
            .then(|| format!("partition {p} was revoked while it was restored"))
    };
    if let Some(why) = gone() {
        return Err(why);
    }
    let started = Instant::now();
    let left = || RESTORE_TIMEOUT.saturating_sub(started.elapsed());
    let txn = if shared.cfg.exactly_once {
        let id = format!("{}.{}.{}", shared.cfg.group, shared.topics.commands, p);
        Some(txn_producer(shared, &id, left())?)
    } else {
        None
    };
    let t_init = started.elapsed().as_millis() as u64;
    let committed = committed_of(offsets, &shared.topics.commands, p, left())?;
    let clock = committed_of(offsets, &shared.topics.clock, p, left())?;
    let t_committed = started.elapsed().as_millis() as u64;
    // Reading the state partition has a budget of its own (120 s), which this leaves room for.
    slow_restore_for_tests(p);
    let mut state = Latest::new(committed, clock);
    if let Some(why) = gone() {
        return Err(why);
    }
    // An earlier restore's journal catch-up ends before the stores are touched.
    shared.journals.stop(p);
    let mut store = local_store(shared, p);
    let mut from = 0;
    if let Some((s, Some(cp))) = &store {
        let mut unreadable = 0;
        let loaded = s.each(&mut |k, v| {
            if !state.known(k, v) {
                unreadable += 1;
            }
        });
        let indexed = s.get(crate::view::INDEX_VERSION_KEY);
        let failure = match loaded {
            Ok(()) if !matches!(&indexed, Ok(Some(v)) if v.as_slice() == crate::view::INDEX_VERSION) => {
                Some("it holds no local index of this version".to_string())
            }
            Ok(()) if unreadable == 0 => None,
            Ok(()) => Some(format!("{unreadable} of its records do not read")),
            Err(e) => Some(e.to_string()),
        };
        match failure {
            None => from = cp.offset,
            Some(why) => {
                // Read from the beginning into an empty store: what it held may include keys the
                // partition deleted since.
                tracing::warn!(
                    partition = p,
                    why,
                    "the local store does not read; the partition is read from its beginning"
                );
                state = Latest::new(committed, clock);
                if s.clear().is_err() {
                    store = None;
                }
            }
        }
    }
    let known = state.latest.len();
    // Every record to the log's end, not what `read_committed` shows: `Latest` tells committed
    // records by the committed offsets read above (and the previous owner's open transaction was
    // fenced first). tansu can leave its last stable offset behind the records of committed
    // transactions for a while: a restore of a SIGKILLed worker's partition under load read it as
    // 0 and restored none of the partition's instances.
    let isolation = crate::Isolation::Uncommitted;
    let end = crate::read_partition(
        shared,
        &shared.topics.state,
        p,
        from,
        isolation,
        |key, payload, headers| {
            let at = headers.and_then(|h| {
                h.iter()
                    .find(|x| x.key == CLOCK_HEADER)
                    .and_then(|x| std::str::from_utf8(x.value?).ok()?.parse::<i64>().ok())
            });
            state.record(key, payload, at);
        },
    )?;
    let (read, uncommitted) = (state.read, state.uncommitted);
    if let Some(why) = gone() {
        return Err(why);
    }
    let kept = store.and_then(|(s, _)| Some((state.save(s.as_ref(), p, from, end)?, s)));
    // The store holds every record read: beyond the worker's share of the cache, instances are
    // read from it when needed.
    let keep = shared.cfg.cached_instances / shared.owned.load(std::sync::atomic::Ordering::Relaxed).max(1);
    if kept.is_some() {
        state.cache(keep);
    }
    // The loop puts the partition's barrier when it takes the restored owner in.
    let (mut t, calls) = state.owner(shared, p, txn, None);
    if let Some((checkpoint, s)) = kept {
        t.store = Some(s);
        t.checkpoint = checkpoint;
    }
    let cached = t.slots.len();
    if let Err(e) = t.place_index(now_ms(), shared.cfg.timer_horizon_ms) {
        // The partition is restored again: the store cannot be trusted.
        return Err(format!("the local store cannot be written: {e}"));
    }
    t.journal = super::journal::open(shared, p);
    let mut later = Vec::new();
    for (id, work) in calls {
        match work {
            Work::StartChild(start) => {
                // A subflow start still open after a crash: send the start again (the child
                // ignores a second start).
                let origin = t.slots.get(&id).and_then(|s| s.h.origin.clone());
                if let Err(e) = produce(&shared.plain, &subflow_start(shared, &start, origin)) {
                    tracing::warn!(error = %e, "cannot send a subflow start again");
                }
            }
            work => later.push((id, work)),
        }
    }
    t.evict(keep, u64::MAX);
    tracing::info!(
        partition = p,
        instances = cached,
        in_memory = t.slots.len(),
        records = read,
        from,
        known,
        uncommitted,
        committed,
        clock,
        fence_ms = t_init,
        offsets_ms = t_committed,
        ms = started.elapsed().as_millis() as u64,
        "partition restored"
    );
    if let Some(o) = sm4c_host::metrics::observer() {
        o.kafka_restore(p, started.elapsed().as_secs_f64());
        o.kafka_parked(p, t.parking.parked.len());
    }
    t.last_commit = Instant::now();
    Ok((t, later))
}

/// For the tests only: `SM4C_KAFKA_TEST_RESTORE_DELAY=P:MS` makes reading partition P's state take
/// MS milliseconds more, so a test can show that a slow restore holds back neither the loop nor the
/// other partitions (a real one is slow when the state partition is large or the broker slow).
fn slow_restore_for_tests(p: i32) {
    let Ok(v) = std::env::var("SM4C_KAFKA_TEST_RESTORE_DELAY") else {
        return;
    };
    let delay = v
        .split_once(':')
        .filter(|(q, _)| q.trim().parse() == Ok(p))
        .and_then(|(_, ms)| ms.trim().parse::<u64>().ok());
    if let Some(ms) = delay {
        tracing::warn!(
            partition = p,
            ms,
            "SM4C_KAFKA_TEST_RESTORE_DELAY: this restore is made slow on purpose"
        );
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// How old a local store's checkpoint may be: the state topic keeps a deletion (a tombstone) for
/// `delete.retention.ms` (a day by default) once it is compacted, so a store older than that may
/// have missed one.
const LOCAL_MAX_AGE_MS: i64 = 12 * 3_600_000;

/// The partition's local store, when the worker keeps them, and its checkpoint when it can be
/// read on from: a store whose checkpoint lies outside the state partition (the topic was made
/// again, or its beginning deleted) or is older than [`LOCAL_MAX_AGE_MS`] is cleared and rebuilt.
fn local_store(shared: &Shared, p: i32) -> Option<(Arc<dyn LocalStore>, Option<Checkpoint>)> {
    let stores = shared.local.as_ref()?;
    // The writes of the partition's last owner in this process land first.
    if let Some(k) = &shared.keeper {
        k.flush(p);
    }
    let name = format!("{}-{p}", shared.topics.state);
    let store = match stores.open(&name) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(partition = p, error = %e, "no local store for the partition; it is read from its beginning");
            return None;
        }
    };
    let cp = match store.checkpoint() {
        Ok(cp) => cp,
        Err(e) => {
            tracing::warn!(partition = p, error = %e, "the local store's checkpoint does not read; the store is rebuilt");
            None
        }
    };
    let usable = cp.filter(|cp| {
        let age = now_ms() - cp.written_ms;
        let bounds = log_bounds(shared, p);
        let why = match bounds {
            _ if age > LOCAL_MAX_AGE_MS => Some(format!("its checkpoint is {} h old", age / 3_600_000)),
            Ok((low, high)) if cp.offset < low || cp.offset > high => Some(format!(
                "its checkpoint (offset {}) lies outside the state partition ({low}..{high})",
                cp.offset
            )),
            Ok(_) => None,
            Err(e) => Some(format!("the state partition's bounds do not read: {e}")),
        };
        if let Some(why) = &why {
            tracing::info!(partition = p, why, "the local store is rebuilt");
        }
        why.is_none()
    });
    // A store without a usable checkpoint is rebuilt from nothing: one that has records but no
    // checkpoint (a restore that wrote them died before its partition's first transaction) may
    // hold keys the partition deleted since.
    if usable.is_none() {
        if let Err(e) = store.clear() {
            tracing::warn!(partition = p, error = %e, "the local store cannot be cleared; it is not used");
            return None;
        }
    }
    Some((store, usable))
}

/// The first and the next offset of the state partition's log, the records of aborted and open
/// transactions included. Not what a `read_committed` client is told (the last stable offset, which an
/// open transaction holds back, and which tansu can leave behind records of transactions that
/// committed): a checkpoint past it is not outside the log.
fn log_bounds(shared: &Shared, p: i32) -> Result<(i64, i64), String> {
    let consumer: BaseConsumer<Quiet> = shared
        .cfg
        .layered(
            &[],
            &[
                ("group.id", &format!("{}.bounds", shared.cfg.group)),
                ("isolation.level", "read_uncommitted"),
            ],
        )
        .create_with_context(Quiet)
        .map_err(|e| e.to_string())?;
    consumer
        .fetch_watermarks(&shared.topics.state, p, std::time::Duration::from_secs(10))
        .map_err(|e| e.to_string())
}

/// A state partition read from its beginning (or from a local store's checkpoint, the store's
/// records first): the latest committed record of each key. With no IO, so the simulation
/// restores partitions with the same code.
pub(super) struct Latest {
    /// The group's committed offsets of the commands partition and its clock.
    committed: i64,
    clock: i64,
    /// The latest committed record of each key; `None` for a committed tombstone. Ordered, so a
    /// restore takes the instances in the same order in every process (which ones the owner keeps
    /// in memory follows it; the simulation replays a seed exactly).
    latest: BTreeMap<String, Option<StateRecord>>,
    /// The keys whose last record is not committed (yet): see [`Owner::repair`].
    stale: BTreeSet<String>,
    read: u64,
    uncommitted: u64,
    clocked: u64,
    /// The keys of the records read (not those a local store gave).
    touched: BTreeSet<String>,
    /// The `order` of each instance record a local store gave: where its row of the local index
    /// is, to move or delete it when the log says otherwise.
    stored_order: HashMap<String, (i64, i64)>,
    /// With a local store that holds every record read: how many instances the owner keeps in
    /// memory ([`Latest::cache`]).
    cache: Option<usize>,
    /// The keys whose last record cannot be read back, and why: an instance among them is failed
    /// with `corruptRecord` from its last readable record ([`Owner::corrupt`]).
    corrupt: BTreeMap<String, String>,
}

impl Latest {
    pub(super) fn new(committed: i64, clock: i64) -> Latest {
        Latest {
            committed,
            clock,
            latest: BTreeMap::new(),
            stale: BTreeSet::new(),
            read: 0,
            uncommitted: 0,
            clocked: 0,
            touched: BTreeSet::new(),
            stored_order: HashMap::new(),
            cache: None,
            corrupt: BTreeMap::new(),
        }
    }

    /// The local store holds every record read: the owner made of them keeps at most `n`
    /// instances in memory, and neither its instances beyond those nor records for the API are
    /// kept while the others are read (a partition's instances never all are in memory at once).
    pub(super) fn cache(&mut self, n: usize) {
        self.cache = Some(n);
    }

    /// A record a local store kept: committed when it was written there. `false` when it does not
    /// read (the store is then not to be trusted).
    ///
    /// The local index's keys are passed over: they are derived from the records.
    pub(super) fn known(&mut self, key: &str, value: &[u8]) -> bool {
        if crate::view::is_index_key(key) {
            return true;
        }
        match sm4c_runtime::json::read_stored::<StateRecord>(value) {
            Ok(r) => {
                if let Some(rec) = &r.instance {
                    self.stored_order.insert(key.to_string(), rec.order);
                }
                self.latest.insert(key.to_string(), Some(r));
                true
            }
            Err(_) => false,
        }
    }

    /// Writes what was read on from checkpoint `from` to the local store: the latest committed
    /// record of each key read, and the end (`end`) as the new checkpoint, unless a key's last
    /// record is not committed: such records must be read again next time (see
    /// [`Owner::repair`]), so the checkpoint stays where it was until the partition's next
    /// transaction moves it. Gives the store's checkpoint now; `None`: the store could not be
    /// written, and is cleared (read from the beginning next time).
    pub(super) fn save(&self, store: &dyn LocalStore, p: i32, from: i64, end: i64) -> Option<i64> {
        let mut bytes: Vec<(String, Option<Vec<u8>>)> = Vec::with_capacity(self.touched.len());
        let mut index = Vec::new();
        for k in &self.touched {
            let r = self.latest.get(k).and_then(Option::as_ref);
            bytes.push((k.clone(), r.map(|r| serde_json::to_vec(r).unwrap_or_default())));
            let before = self.stored_order.get(k).map(|o| crate::view::seq_of(*o, p));
            let now = r.and_then(|r| r.instance.as_ref());
            if now.is_some() || before.is_some() {
                index.extend(crate::view::index_changes(p, k, now, before));
            }
        }
        bytes.extend(index);
        let version = Some(crate::view::INDEX_VERSION.to_vec());
        bytes.push((crate::view::INDEX_VERSION_KEY.to_string(), version));
        let changes: Vec<(&str, Option<&[u8]>)> = bytes.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
        let cp = (self.stale.is_empty() && end >= from).then(|| Checkpoint {
            offset: end,
            written_ms: now_ms(),
        });
        match store.apply(&changes, cp) {
            Ok(()) => Some(cp.map_or(from, |c| c.offset)),
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "the local store cannot be written; it is cleared");
                let _ = store.clear();
                None
            }
        }
    }

    /// The next record of the partition: its key, its payload (`None` for a tombstone) and its
    /// `sm4c-clock` header.
    pub(super) fn record(&mut self, key: Option<String>, payload: Option<&[u8]>, clock_header: Option<i64>) {
        let (committed, clock) = (self.committed, self.clock);
        self.read += 1;
        let Some(k) = key else { return };
        self.touched.insert(k.clone());
        match payload {
            Some(payload) => {
                let r = match sm4c_runtime::json::read_stored::<StateRecord>(payload) {
                    Ok(r) => r,
                    Err(e) => {
                        // Not silent: logged and counted; the key's earlier record stays, and an
                        // instance is failed from it (see [`Latest::owner`]).
                        tracing::error!(key = %k, error = %e, "a state record cannot be read back");
                        if let Some(o) = sm4c_host::metrics::observer() {
                            o.corrupt_record("state");
                        }
                        self.corrupt.insert(k, e.to_string());
                        return;
                    }
                };
                self.corrupt.remove(&k);
                self.clocked += u64::from(r.clock.is_some());
                if crate::wire::committed(r.through, r.clock, committed, clock) {
                    self.stale.remove(&k);
                    self.latest.insert(k, Some(r));
                } else {
                    self.uncommitted += 1;
                    self.stale.insert(k);
                }
            }
            None => {
                // A deletion counts once its transaction committed (brokers that show aborted
                // records must not make a restore lose a parked event).
                if clock_header.is_none_or(|c| c < clock) {
                    self.corrupt.remove(&k);
                    self.stale.remove(&k);
                    self.latest.insert(k, None);
                } else {
                    self.uncommitted += 1;
                    self.stale.insert(k);
                }
            }
        }
    }

    /// The partition's owner made of what was read, and the calls in flight to perform again
    /// (subflow starts among them).
    pub(super) fn owner(
        self,
        shared: &Shared,
        p: i32,
        txn: Option<ThreadedProducer<Quiet>>,
        barrier: Option<String>,
    ) -> (Owner, Vec<(String, Work)>) {
        let Latest {
            committed,
            clock,
            mut latest,
            stale,
            read,
            clocked,
            cache,
            corrupt,
            ..
        } = self;
        if committed > 0 && clock == 0 && clocked > 0 {
            // Every transaction commits both offsets, so a commands offset without a clock means
            // the broker lost the clock's: every state record that carries a clock is set aside.
            tracing::warn!(
                partition = p,
                committed,
                records = read,
                "the commands partition has a committed offset but its clock has none; its state records are set aside"
            );
        }
        // Each key whose last record is not committed gets its committed record (or a tombstone)
        // again in the next transaction: see [`Owner::repair`].
        let repair = stale
            .into_iter()
            .map(|k| {
                let (payload, headers) = match latest.get(&k) {
                    Some(Some(r)) => (Some(serde_json::to_vec(r).unwrap_or_default()), Vec::new()),
                    _ => (None, vec![(CLOCK_HEADER.to_string(), clock.to_string().into_bytes())]),
                };
                Out {
                    topic: shared.topics.state.clone(),
                    partition: Some(p),
                    key: Some(k),
                    payload,
                    headers,
                }
            })
            .collect();
        let mut t = Owner {
            partition: p,
            stream_ms: 0,
            repair,
            txn,
            slots: HashMap::new(),
            used: 0,
            last_order: (0, 0),
            evicted: false,
            unreadable: None,
            corr: CorrIndex::default(),
            resubscribe: Vec::new(),
            dirty: BTreeSet::new(),
            ended: Default::default(),
            expired: Vec::new(),
            next_expiry: i64::MIN,
            look_at: i64::MIN,
            parking: Parking::default(),
            timers: BTreeSet::new(),
            horizon: i64::MAX,
            index_next: Vec::new(),
            last_ticket: 0,
            retries: BTreeMap::new(),
            answers: BTreeMap::new(),
            last_commit: Instant::now(),
            settle: Default::default(),
            in_flight: HashMap::new(),
            store: None,
            checkpoint: 0,
            checkpoint_at: Instant::now(),
            clock,
            resume: committed,
            barrier,
            records: Default::default(),
            known: HashSet::new(),
            journal: None,
            corrupt: Vec::new(),
        };
        let mut calls = Vec::new();
        // What earlier versions kept in the one partition record becomes a record per entry (the
        // newer records of the same keys, read next, win), and that record is deleted.
        if let Some(Some(old)) = latest.remove(PARTITION_KEY) {
            let old = old.partition.unwrap_or_default();
            for p in old.parked {
                let key = parked_key(&p);
                t.parking.changed.insert(key.clone());
                t.parking.insert(key, p);
            }
            for (origin, tally) in old.tally {
                t.parking.changed.insert(tally_key(&origin));
                t.parking.tally.insert(origin, tally);
            }
            t.parking.changed.insert(PARTITION_KEY.to_string());
        }
        let mut own: Vec<(String, StateRecord)> = Vec::new();
        let mut unended = BTreeSet::new();
        for (k, r) in latest {
            let Some(r) = r else {
                // Deleted: an entry the old partition record had may have left since.
                if let Some(origin) = k.strip_prefix(TALLY_PREFIX) {
                    t.parking.tally.remove(origin);
                }
                if let Some(p) = t.parking.parked.shift_remove(&k) {
                    t.parking.index(&k, &p, false);
                }
                continue;
            };
            if k.starts_with(PARKED_PREFIX) || k.starts_with(TALLY_PREFIX) || k.starts_with(SUBSCRIPTION_PREFIX) {
                own.push((k, r));
                continue;
            }
            let Some(rec) = r.instance else { continue };
            if crate::view::order_key(rec.order) > crate::view::order_key(t.last_order) {
                t.last_order = rec.order;
            }
            t.known.insert(k.clone());
            if rec.snapshot.status.is_final() {
                let place = crate::view::seq_of(rec.order, p);
                t.ended.insert(&k, rec.snapshot.ended_at.unwrap_or(0), place);
                if cache.is_none() {
                    t.records.insert(k, rec);
                }
                continue;
            }
            unended.insert(k.clone());
            if cache.is_none() {
                t.records.insert(k.clone(), rec.clone());
            }
            let Some(m) = shared.machine(&rec.snapshot.definition, &rec.snapshot.version) else {
                tracing::error!(
                    instance = k,
                    "the definition of this instance is not registered; it stays as it is"
                );
                continue;
            };
            let slot = Slot::from_record(shared, m, rec);
            let inst = &slot.h.inst;
            if !inst.status().is_final() {
                for (timer, due) in &inst.snapshot().timers {
                    t.timers.insert((*due, k.clone(), timer.clone()));
                }
                for effect in &slot.h.open {
                    calls.push((
                        k.clone(),
                        shared.driver.work(&k, inst.machine(), slot.h.depth, effect.clone()),
                    ));
                }
            }
            t.corr.update(&k, &slot.h.inst);
            if !shared.cfg.exactly_once && !t.corr.routed(&k).is_empty() {
                t.resubscribe.push(k.clone());
            }
            // One with calls in flight stays: they are made again from it.
            if cache.is_some_and(|n| t.slots.len() >= n) && slot.h.open.is_empty() {
                // In the store: read back when something comes for it.
                t.evicted = true;
            } else {
                t.slots.insert(k, Box::new(slot));
            }
        }
        // Oldest first, as they were parked.
        own.sort_by(|(a, x), (b, y)| {
            let at = |r: &StateRecord| r.parked.as_ref().map(|p| p.expires).unwrap_or(i64::MIN);
            (at(x), a).cmp(&(at(y), b))
        });
        for (k, r) in own {
            t.parking.restore(&k, r);
        }
        for (k, why) in corrupt {
            let instance = ![PARKED_PREFIX, TALLY_PREFIX, SUBSCRIPTION_PREFIX]
                .iter()
                .any(|prefix| k.starts_with(prefix))
                && k != PARTITION_KEY;
            if !instance {
                tracing::error!(
                    partition = p,
                    key = k,
                    "an unreadable state record of the partition's own was skipped; its earlier record stays"
                );
            } else if unended.contains(&k) {
                tracing::error!(partition = p, instance = k, "the last state record of the instance cannot be read back; it is failed with corruptRecord from its last readable one");
                t.corrupt.push((k, why));
            } else if t.known.contains(&k) {
                tracing::error!(
                    partition = p,
                    instance = k,
                    "the last state record of an ended instance cannot be read back; its last readable one stays"
                );
            } else {
                tracing::error!(
                    partition = p,
                    instance = k,
                    "the state record of the instance cannot be read back and it has no earlier one; it is left out"
                );
            }
        }
        (t, calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Origin, Parked};
    use serde_json::{json, Value};

    fn parked_record(event: Value) -> Vec<u8> {
        let record = StateRecord {
            through: 1,
            parked: Some(Parked {
                event,
                origin: Origin {
                    topic: "events".into(),
                    partition: 0,
                    offset: 7,
                },
                target: None,
                home: None,
                key: None,
                expect: None,
                expires: i64::MAX,
            }),
            ..StateRecord::default()
        };
        serde_json::to_vec(&record).expect("a record")
    }

    #[test]
    fn a_record_deeper_than_serde_jsons_default_limit_is_restored() {
        // What an earlier version let in: 126 levels of event data, a few more in the record.
        let deep = (0..126).fold(json!(1), |v, _| json!([v]));
        let payload = parked_record(json!({"data": deep}));
        assert!(serde_json::from_slice::<StateRecord>(&payload).is_err());
        let mut latest = Latest::new(100, 0);
        latest.record(Some("p1".into()), Some(&payload), None);
        let restored = latest
            .latest
            .get("p1")
            .and_then(Option::as_ref)
            .and_then(|r| r.parked.as_ref());
        assert_eq!(restored.map(|p| &p.event["data"]), Some(&deep));
        // A record that does not decode is not taken for one (the key's earlier record stays),
        // and the key is known to be corrupt until a readable record or a deletion follows.
        latest.record(Some("p1".into()), Some(b"{\"through\": garbage"), None);
        assert!(latest.latest.get("p1").and_then(Option::as_ref).is_some());
        assert!(latest.corrupt.get("p1").is_some_and(|why| !why.is_empty()));
        latest.record(Some("p1".into()), Some(&payload), None);
        assert!(latest.corrupt.is_empty());
        latest.record(Some("p1".into()), Some(b"not json"), None);
        latest.record(Some("p1".into()), None, None);
        assert!(latest.corrupt.is_empty());
        assert!(latest.known("p2", &payload));
        assert!(!latest.known("p3", b"not json"));
    }
}
