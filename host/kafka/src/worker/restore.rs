//! Taking over a commands partition: fencing its previous owner, reading its committed offsets and
//! its state from the state topic, re-arming timers.

use super::{
    committed_of, index, produce, subflow_start, txn_producer, CorrIndex, Out, Owner, Parking, Shared, Slot,
    RESTORE_TIMEOUT,
};
use crate::wire::{
    parked_key, tally_key, Quiet, StateRecord, CLOCK_HEADER, PARKED_PREFIX, PARTITION_KEY, POSITION_KEY,
    SUBSCRIPTION_PREFIX, TALLY_PREFIX,
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
    // The worker's share of the cache: the owner keeps at most this many unended instances in
    // memory, and the restore no more (the others go to the store as they are read).
    let keep = shared.cfg.cached_instances / shared.owned.load(std::sync::atomic::Ordering::Relaxed).max(1);
    // An earlier restore's journal catch-up ends before the stores are touched.
    shared.journals.stop(p);
    let mut store = local_store(shared, p);
    if let Some((s, _)) = &store {
        state.stream(s.clone(), p, keep);
    }
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
                } else {
                    state.stream(s.clone(), p, keep);
                }
            }
        }
    }
    let known = state.latest.len() + state.stored.len();
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
            if state.due() {
                // Written as it is read, unless the partition was revoked meanwhile.
                state.write(gone().is_some());
            }
        },
    )?;
    let (read, uncommitted) = (state.read, state.uncommitted);
    if let Some(why) = gone() {
        return Err(why);
    }
    if let Some(lost) = state.offsets_lost() {
        // The restore fails either way: once repaired, the next one reads the offsets again.
        return Err(repair_offsets(
            shared,
            offsets,
            txn.as_ref(),
            p,
            lost,
            (committed, clock),
            RESTORE_TIMEOUT,
        ));
    }
    if clock == 0 && state.fresh() {
        if let Some(producer) = txn.as_ref() {
            // A timeout of its own: reading the state partition has its own budget, which may
            // have used up the restore's (a slow restore's first transaction timed out at once).
            commit_offsets(shared, offsets, producer, p, committed, 1, RESTORE_TIMEOUT)
                .map_err(|e| format!("the partition's first transaction (its clock to 1) failed: {e}"))?;
            tracing::info!(
                partition = p,
                "a new partition's first transaction committed its clock as 1"
            );
            state.genesis();
        }
    }
    let streamed = state.streaming();
    let kept = store.and_then(|(s, _)| Some((state.save(s.as_ref(), p, from, end)?, s)));
    if streamed && kept.is_none() {
        // What was read is in the store only, which failed: the store is rebuilt by the next
        // restore (or, when it cannot even be cleared, left out).
        return Err("the local store cannot be written".to_string());
    }
    // The store holds every record read: beyond the worker's share of the cache, instances are
    // read from it when needed.
    if kept.is_some() {
        state.cache(keep);
    }
    // The loop puts the partition's barrier when it takes the restored owner in.
    let (mut t, calls) = state.owner(shared, p, txn, None);
    if let Some(why) = t.unreadable.take() {
        return Err(why);
    }
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

/// The group's committed offsets of partition `p` are behind its state
/// ([`Latest::offsets_lost`]: transaction `lost` certainly committed; `was`: the committed commands
/// offset and clock). The group's offsets expired (Kafka
/// drops a group's offsets `offsets.retention.minutes` after its last member left) or were reset by
/// hand; restored from them, the partition would take every record of its state as uncommitted
/// and read its commands again from the beginning. They are repaired instead from the latest
/// position record a `read_committed` reader sees (which, on a broker that shows it the records of
/// aborted transactions, such as tansu, may be an aborted transaction's), in a transaction of the
/// partition's producer; said loudly, counted and shown in `/healthz`. Gives why this restore
/// ends (the next one reads the repaired offsets).
fn repair_offsets(
    shared: &Shared,
    offsets: &BaseConsumer<Quiet>,
    txn: Option<&rdkafka::producer::ThreadedProducer<Quiet>>,
    p: i32,
    lost: i64,
    was: (i64, i64),
    timeout: std::time::Duration,
) -> String {
    use rdkafka::consumer::Consumer;
    use rdkafka::{Offset, TopicPartitionList};
    let started = Instant::now();
    let mut position: Option<(i64, i64)> = None;
    let read = crate::read_partition(
        shared,
        &shared.topics.state,
        p,
        0,
        crate::Isolation::Committed,
        |key, payload, _| {
            if key.as_deref() != Some(POSITION_KEY) {
                return;
            }
            if let Some(Ok(StateRecord {
                through,
                clock: Some(c),
                ..
            })) = payload.map(sm4c_runtime::json::read_stored::<StateRecord>)
            {
                if position.is_none_or(|(_, at)| c >= at) {
                    position = Some((through, c));
                }
            }
        },
    );
    if let Err(e) = read {
        return format!(
            "the group's committed offsets of partition {p} are lost, and its position cannot be read: {e}"
        );
    }
    // A committed transaction's markers may not have landed yet (tansu): try again later.
    let Some((through, c)) = position.filter(|(_, c)| *c >= lost) else {
        return format!(
            "the group's committed offsets of partition {p} are behind its state (committed clock {}, transaction {lost} committed), and no committed position record that far can be read yet",
            was.1
        );
    };
    let (commands, clock) = ((through + 1).max(was.0), c + 1);
    tracing::error!(
        partition = p,
        committed = was.0,
        committed_clock = was.1,
        commands,
        clock,
        "the group's committed offsets of this partition are behind its state (they expired, or were reset): repairing them from the partition's last committed position"
    );
    let mut tpl = TopicPartitionList::new();
    let added = tpl
        .add_partition_offset(&shared.topics.commands, p, Offset::Offset(commands))
        .and_then(|()| tpl.add_partition_offset(&shared.topics.clock, p, Offset::Offset(clock)));
    if let Err(e) = added {
        return e.to_string();
    }
    let deadline = timeout.saturating_sub(started.elapsed());
    let committed = match txn {
        Some(producer) => in_transaction(offsets, producer, &tpl, deadline),
        None => offsets
            .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
            .map_err(|e| e.to_string()),
    };
    if let Err(e) = committed {
        return format!("the group's committed offsets of partition {p} are lost, and repairing them failed: {e}");
    }
    if let Some(o) = sm4c_host::metrics::observer() {
        o.kafka_offsets_repaired(&shared.topics.commands, p);
    }
    shared.repaired.lock().unwrap_or_else(|e| e.into_inner()).insert(
        p,
        serde_json::json!({"partition": p, "committed": was.0, "committedClock": was.1,
                           "repaired": commands, "repairedClock": clock, "at": sm4c_runtime::engine::rfc3339(now_ms())}),
    );
    format!("the group's committed offsets of partition {p} were lost; repaired to commands offset {commands} and clock {clock}, the partition is restored again")
}

/// Commits offsets `tpl` of the commands group in a transaction of `producer` that writes nothing.
fn in_transaction(
    offsets: &BaseConsumer<Quiet>,
    producer: &rdkafka::producer::ThreadedProducer<Quiet>,
    tpl: &rdkafka::TopicPartitionList,
    deadline: std::time::Duration,
) -> Result<(), String> {
    use rdkafka::consumer::Consumer;
    use rdkafka::producer::Producer;
    let meta = offsets
        .group_metadata()
        .ok_or_else(|| "no consumer group metadata".to_string())?;
    producer.begin_transaction().map_err(|e| e.to_string())?;
    producer
        .send_offsets_to_transaction(tpl, &meta, deadline)
        .and_then(|()| producer.commit_transaction(deadline))
        .map_err(|e| e.to_string())
}

/// A partition that never committed a transaction ([`Latest::fresh`]) commits one that decides
/// nothing before its owner decides anything: its commands offset as it is, its clock 1. So no
/// decision is ever numbered 0, and every position record of a decision is numbered above the
/// clock the group reads once its offsets are lost (none, 0): lost offsets are told from a
/// partition that never committed ([`Latest::offsets_lost`]). Without it, offsets lost after a
/// partition's first transaction went unnoticed, and its commands were decided again (simulation
/// seed 667: an instance's journal began again at entry 1).
fn commit_offsets(
    shared: &Shared,
    offsets: &BaseConsumer<Quiet>,
    producer: &rdkafka::producer::ThreadedProducer<Quiet>,
    p: i32,
    commands: i64,
    clock: i64,
    deadline: std::time::Duration,
) -> Result<(), String> {
    use rdkafka::{Offset, TopicPartitionList};
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&shared.topics.commands, p, Offset::Offset(commands))
        .and_then(|()| tpl.add_partition_offset(&shared.topics.clock, p, Offset::Offset(clock)))
        .map_err(|e| e.to_string())?;
    in_transaction(offsets, producer, &tpl, deadline)
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
            Ok((_, high)) if cp.offset > high => {
                // The log ends before what this worker read of it and wrote down: records the
                // broker had acknowledged are gone (a broker that lost its tail in a crash, such as
                // tansu's object-store engine killed mid-flush), or the topic was made again. What
                // the broker no longer holds cannot be restored from it: said loudly, counted,
                // and shown in /healthz; the store is rebuilt from what the broker holds.
                tracing::error!(
                    partition = p,
                    checkpoint = cp.offset,
                    end = high,
                    topic = %shared.topics.state,
                    "the state partition ends before this worker's checkpoint of it: the broker lost records it had acknowledged, or the topic was made again; the local store is rebuilt from what the broker holds"
                );
                if let Some(o) = sm4c_host::metrics::observer() {
                    o.kafka_log_behind_checkpoint(&shared.topics.state, p);
                }
                shared.behind.lock().unwrap_or_else(|e| e.into_inner()).insert(
                    p,
                    serde_json::json!({"topic": shared.topics.state, "partition": p, "checkpoint": cp.offset,
                                       "end": high, "at": sm4c_runtime::engine::rfc3339(now_ms())}),
                );
                Some(format!(
                    "its checkpoint (offset {}) lies past the state partition's end ({high})",
                    cp.offset
                ))
            }
            Ok((low, high)) if cp.offset < low => Some(format!(
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
    /// With a local store ([`Latest::stream`]): the store the instance records go to as they
    /// are read, and what is to be written there next.
    spill: Option<Spill>,
    /// With a local store: what the restore decides with of each instance key whose latest
    /// committed record is in the store (`None`: deleted, or not an instance's), in place of the
    /// records in `latest`, which then holds only the partition's own keys.
    stored: BTreeMap<String, Option<Meta>>,
    /// The latest position record read ([`crate::wire::POSITION_KEY`]), committed or not:
    /// (`through`, `clock`); and `through` of the last one numbered one below the committed
    /// clock, which is the last committed transaction's.
    position: Option<(i64, i64)>,
    last_committed: Option<i64>,
    /// The stream time the last committed transaction's position record names (0 when none
    /// does): where the owner's stream time starts.
    stream: i64,
}

/// Of an instance record a streaming restore wrote to the local store, what the restore decides
/// with: its place in listings, and when it ended.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Meta {
    order: (i64, i64),
    /// When it ended (ms; 0 when the record does not say); `None`: not ended.
    ended: Option<i64>,
}

impl Meta {
    fn of(rec: &crate::wire::InstanceRecord) -> Meta {
        Meta {
            order: rec.order,
            ended: rec
                .snapshot
                .status
                .is_final()
                .then(|| rec.snapshot.ended_at.unwrap_or(0)),
        }
    }
}

/// How many keys a streaming restore writes to the local store at once: the bound of its buffer.
const SPILL_BATCH: usize = 512;

/// Where a streaming restore writes the records it reads.
struct Spill {
    store: Arc<dyn LocalStore>,
    partition: i32,
    /// Records and the changes of the local index they make, in the order read.
    pending: Vec<(String, Option<Vec<u8>>)>,
    /// How many records `pending` holds.
    records: usize,
    /// Why nothing more is written: a write failed, or the partition was revoked.
    failed: Option<String>,
    /// The partition was revoked: the store is left as it is (the restore fails).
    revoked: bool,
}

/// Whether a key of the state topic is an instance's (not a parked event's, a tally's, a
/// subscription's or the old partition record's).
fn instance_key(k: &str) -> bool {
    ![
        PARKED_PREFIX,
        TALLY_PREFIX,
        SUBSCRIPTION_PREFIX,
        crate::wire::SCHEDULE_PREFIX,
        crate::wire::BATCH_PREFIX,
    ]
    .iter()
    .any(|prefix| k.starts_with(prefix))
        && k != PARTITION_KEY
        && k != POSITION_KEY
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
            spill: None,
            stored: BTreeMap::new(),
            position: None,
            last_committed: None,
            stream: 0,
        }
    }

    /// Takes a position record (local store or log, in order): the one of the latest
    /// transaction stays.
    fn position(&mut self, value: &[u8]) -> bool {
        match sm4c_runtime::json::read_stored::<StateRecord>(value) {
            Ok(StateRecord {
                through,
                clock: Some(clock),
                stream,
                ..
            }) => {
                if self.position.is_none_or(|(_, c)| clock >= c) {
                    self.position = Some((through, clock));
                }
                if clock == self.clock - 1 {
                    self.last_committed = Some(through);
                    self.stream = stream.unwrap_or(0);
                }
                true
            }
            _ => false,
        }
    }

    /// Whether the partition never committed a transaction, by what was read: nothing (its
    /// committed clock is 0, and neither its log nor a local store holds a record). Then
    /// [`commit_offsets`] commits its first transaction, which decides nothing.
    pub(super) fn fresh(&self) -> bool {
        self.clock == 0 && self.read == 0 && self.latest.is_empty() && self.stored.is_empty() && self.position.is_none()
    }

    /// The partition's first transaction committed its clock as 1 ([`commit_offsets`]).
    pub(super) fn genesis(&mut self) {
        self.clock = 1;
    }

    /// Whether the group's committed offsets of the partition are behind what its position
    /// records say, and so cannot be what the broker holds: they were lost (expired, or reset by
    /// hand) after those records were written. Gives the number of a transaction that certainly
    /// committed: the one before the latest a position record names, when that one is later than
    /// the committed clock (a transaction numbered with the committed clock is the one after the
    /// last committed, which a restore sees when it was aborted or left open); or the last
    /// committed transaction's, when its position is past the committed commands offset.
    pub(super) fn offsets_lost(&self) -> Option<i64> {
        match (self.position, self.last_committed) {
            (Some((_, c)), _) if c > self.clock => Some(c - 1),
            (_, Some(through)) if through + 1 > self.committed => Some(self.clock - 1),
            _ => None,
        }
    }

    /// Streams the restore through the local store `store` of partition `p`, which then holds
    /// every record read: each instance record read goes there (with its rows of the local
    /// index) in batches of [`SPILL_BATCH`] as it is read, and only what the restore decides with
    /// stays in memory ([`Meta`]); the owner keeps at most `cache` unended instances in memory
    /// ([`Latest::cache`]), and reads each of the others from the store once, for its timers,
    /// correlation keys and calls in flight. So a restore needs memory for its cache and a
    /// bounded buffer, plus a few fields per instance, not for the partition's records.
    pub(super) fn stream(&mut self, store: Arc<dyn LocalStore>, p: i32, cache: usize) {
        self.spill = Some(Spill {
            store,
            partition: p,
            pending: Vec::new(),
            records: 0,
            failed: None,
            revoked: false,
        });
        self.cache = Some(cache);
    }

    /// Whether the restore streams through a local store.
    pub(super) fn streaming(&self) -> bool {
        self.spill.is_some()
    }

    /// Whether the buffer of a streaming restore is full: [`Latest::write`] it.
    pub(super) fn due(&self) -> bool {
        self.spill.as_ref().is_some_and(|s| s.records >= SPILL_BATCH)
    }

    /// Writes the buffer of a streaming restore to its store; `revoked`: the partition was
    /// revoked meanwhile, and the store is left alone from now on (the restore fails).
    pub(super) fn write(&mut self, revoked: bool) {
        let Some(spill) = self.spill.as_mut() else { return };
        if revoked && !spill.revoked {
            spill.revoked = true;
            spill.failed = Some("the partition was revoked".to_string());
        }
        let pending = std::mem::take(&mut spill.pending);
        spill.records = 0;
        if spill.failed.is_some() || pending.is_empty() {
            return;
        }
        let changes: Vec<(&str, Option<&[u8]>)> = pending.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
        if let Err(e) = spill.store.apply(&changes, None) {
            tracing::warn!(partition = spill.partition, error = %e, "the local store cannot be written while the partition is restored");
            spill.failed = Some(e.to_string());
        }
    }

    /// A streaming restore's committed record of instance key `k` (`None`: a deletion): what
    /// the store gets, with the changes of the local index it makes.
    fn spill(&mut self, k: String, r: Option<StateRecord>) {
        let Some(spill) = self.spill.as_mut() else { return };
        let p = spill.partition;
        let before = self
            .stored
            .get(&k)
            .and_then(|m| m.as_ref())
            .map(|m| crate::view::seq_of(m.order, p));
        let now = r.as_ref().and_then(|r| r.instance.as_ref());
        let index = (now.is_some() || before.is_some()).then(|| crate::view::index_changes(p, &k, now, before));
        let meta = now.map(Meta::of);
        spill
            .pending
            .push((k.clone(), r.map(|r| serde_json::to_vec(&r).unwrap_or_default())));
        spill.pending.extend(index.into_iter().flatten());
        spill.records += 1;
        self.stored.insert(k, meta);
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
        if key == POSITION_KEY {
            return self.position(value);
        }
        match sm4c_runtime::json::read_stored::<StateRecord>(value) {
            Ok(r) if self.spill.is_some() && instance_key(key) => {
                // Already in the store: only what the restore decides with stays.
                self.stored.insert(key.to_string(), r.instance.as_ref().map(Meta::of));
                true
            }
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
    ///
    /// A streaming restore ([`Latest::stream`]) wrote its instances' records as it read them:
    /// what is left of its buffer is written with the rest.
    pub(super) fn save(&mut self, store: &dyn LocalStore, p: i32, from: i64, end: i64) -> Option<i64> {
        self.write(false);
        if self.spill.as_ref().is_some_and(|s| s.revoked) {
            return None;
        }
        if let Some(why) = self.spill.as_ref().and_then(|s| s.failed.clone()) {
            tracing::warn!(
                partition = p,
                error = why,
                "the local store cannot be written; it is cleared"
            );
            let _ = store.clear();
            return None;
        }
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
        // The last committed transaction's position, which the store must hold for a later restore
        // from it to find lost offsets (the log past its checkpoint may hold no later one).
        if let Some(through) = self.last_committed {
            let r = StateRecord {
                through,
                clock: Some(self.clock - 1),
                stream: (self.stream != 0).then_some(self.stream),
                ..StateRecord::default()
            };
            bytes.push((
                POSITION_KEY.to_string(),
                Some(serde_json::to_vec(&r).unwrap_or_default()),
            ));
        }
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
        if k == POSITION_KEY {
            if let Some(payload) = payload {
                self.position(payload);
            }
            return;
        }
        // A streaming restore writes its instances' records as it reads them.
        if self.spill.is_none() || !instance_key(&k) {
            self.touched.insert(k.clone());
        }
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
                    if self.spill.is_some() && instance_key(&k) {
                        self.spill(k, Some(r));
                    } else {
                        self.latest.insert(k, Some(r));
                    }
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
                    if self.spill.is_some() && instance_key(&k) {
                        self.spill(k, None);
                    } else {
                        self.latest.insert(k, None);
                    }
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
            spill,
            stored,
            stream,
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
        // A streaming restore's instance records are in the store, as they are to be written.
        let mut unreadable = None;
        let repair = stale
            .into_iter()
            .map(|k| {
                let kept = match &spill {
                    Some(spill) if instance_key(&k) => spill.store.get(&k).unwrap_or_else(|e| {
                        unreadable = Some(format!("instance {k:?} cannot be read from the local store: {e}"));
                        None
                    }),
                    _ => latest
                        .get(&k)
                        .and_then(Option::as_ref)
                        .map(|r| serde_json::to_vec(r).unwrap_or_default()),
                };
                let (payload, headers) = match kept {
                    Some(bytes) => (Some(bytes), Vec::new()),
                    None => (None, vec![(CLOCK_HEADER.to_string(), clock.to_string().into_bytes())]),
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
            stream_ms: stream,
            repair,
            txn,
            slots: HashMap::new(),
            used: 0,
            last_order: (0, 0),
            evicted: false,
            unreadable,
            corr: CorrIndex::default(),
            resubscribe: Vec::new(),
            dirty: BTreeSet::new(),
            ended: Default::default(),
            expired: Vec::new(),
            next_expiry: i64::MIN,
            look_at: i64::MIN,
            parking: Parking::default(),
            scheds: Default::default(),
            batches: Default::default(),
            timers: BTreeSet::new(),
            horizon: i64::MAX,
            timers_stored: false,
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
            next_command: committed,
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
            if !instance_key(&k) {
                own.push((k, r));
                continue;
            }
            let Some(rec) = r.instance else { continue };
            let meta = Meta::of(&rec);
            t.met(&k, meta);
            if let Some(ended) = meta.ended {
                t.ended.insert(&k, ended, crate::view::seq_of(rec.order, p));
                if cache.is_none() {
                    t.records.insert(k, rec);
                }
                continue;
            }
            unended.insert(k.clone());
            if cache.is_none() {
                t.records.insert(k.clone(), rec.clone());
            }
            t.take(shared, k, rec, cache, &mut calls, None);
        }
        // A streaming restore's instances, from the store: each unended one is read once, for
        // what finds it and what it has in flight, and kept in memory only within the cache.
        if let Some(spill) = &spill {
            // The correlation index, the ended instances and the timers go to the store as they
            // are made, in place of the previous owner's.
            let store = spill.store.clone();
            let prefixes = [index::CORR_PREFIX, index::ENDED_PREFIX, index::TIMER_PREFIX];
            if let Err(e) = index::replace_under(store.as_ref(), &prefixes, std::iter::empty()) {
                t.unreadable
                    .get_or_insert(format!("the local store cannot be written: {e}"));
            }
            let (mut since, mut timers) = (0, Vec::new());
            for (k, meta) in stored {
                let Some(meta) = meta else { continue };
                since += 1;
                if since >= SPILL_BATCH {
                    since = 0;
                    t.write_index(store.as_ref(), &mut timers);
                }
                t.met(&k, meta);
                if let Some(ended) = meta.ended {
                    t.ended.insert(&k, ended, crate::view::seq_of(meta.order, p));
                    continue;
                }
                unended.insert(k.clone());
                match crate::view::stored(spill.store.as_ref(), &k) {
                    Ok(Some(rec)) => t.take(shared, k, rec, cache, &mut calls, Some(&mut timers)),
                    Ok(None) => {
                        t.unreadable
                            .get_or_insert_with(|| format!("instance {k:?} is missing from the local store"));
                    }
                    Err(why) => {
                        t.unreadable.get_or_insert(why);
                    }
                }
            }
            t.write_index(store.as_ref(), &mut timers);
            t.corr.kept.attach(store.clone());
            t.ended.kept.attach(store);
            t.timers_stored = true;
        }
        // Parked events in the order they were read from their events partition (the order a
        // subscriber or a waiting instance takes them in), not by when they expire: an event
        // routed by key is parked at the stream time of the transaction that sent it there, so
        // a later event of the same events partition, sent by another partition whose stream time
        // was behind, expires first (the simulation's check of event order found an instance
        // taking step 2 before step 1 after a restore of the key's partition).
        own.sort_by(|(a, x), (b, y)| {
            let origin = |r: &StateRecord| {
                r.parked
                    .as_ref()
                    .map(|p| (p.origin.topic.clone(), p.origin.partition, p.origin.offset))
            };
            (origin(x), a).cmp(&(origin(y), b))
        });
        for (k, mut r) in own {
            if let (Some(id), Some(s)) = (k.strip_prefix(crate::wire::BATCH_PREFIX), r.batch.take()) {
                t.batches.restore(id, s);
                continue;
            }
            match (k.strip_prefix(crate::wire::SCHEDULE_PREFIX), r.schedule.take()) {
                (Some(id), Some(s)) => t.scheds.restore(id, s),
                _ => t.parking.restore(&k, r),
            }
        }
        for (k, why) in corrupt {
            if !instance_key(&k) {
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

impl Owner {
    /// A streaming restore's correlation index, ended instances and timers (their keys in the
    /// store) made so far: written to the store, and let go of.
    fn write_index(&mut self, store: &dyn LocalStore, timers: &mut Vec<String>) {
        let mut mem = std::mem::take(&mut self.corr.kept.mem);
        mem.append(&mut self.ended.kept.mem);
        let mut changes: Vec<(&str, Option<&[u8]>)> =
            mem.iter().map(|(k, (_, v))| (k.as_str(), v.as_deref())).collect();
        changes.extend(timers.iter().map(|k| (k.as_str(), Some(&[][..]))));
        if let Err(e) = store.apply(&changes, None) {
            self.unreadable
                .get_or_insert(format!("the local store cannot be written: {e}"));
        }
        // What `CorrIndex::routed_before` notes for a batch: none is being decided.
        self.corr.decided();
        timers.clear();
    }

    /// A restored instance `k`: its place in listings counts, and it is known (ended or not).
    fn met(&mut self, k: &str, meta: Meta) {
        if crate::view::order_key(meta.order) > crate::view::order_key(self.last_order) {
            self.last_order = meta.order;
        }
        self.known.insert(k.to_string());
    }

    /// A restored unended instance: its timers (the keys of those due from 0 on go to `stored`,
    /// to be written to the store, when given), its calls in flight (to perform again, in
    /// `calls`) and its correlation keys are taken; it stays in memory within `cache` (all of
    /// them without one), or with calls in flight, which are made again from it.
    fn take(
        &mut self,
        shared: &Shared,
        k: String,
        rec: crate::wire::InstanceRecord,
        cache: Option<usize>,
        calls: &mut Vec<(String, Work)>,
        mut stored: Option<&mut Vec<String>>,
    ) {
        let Some(m) = shared.machine(&rec.snapshot.definition, &rec.snapshot.version) else {
            tracing::error!(
                instance = k,
                "the definition of this instance is not registered; it stays as it is"
            );
            return;
        };
        let slot = Slot::from_record(shared, m, rec);
        let inst = &slot.h.inst;
        if !inst.status().is_final() {
            for (timer, due) in &inst.snapshot().timers {
                match stored.as_deref_mut() {
                    Some(keys) if *due >= 0 => keys.push(index::timer_key(*due, &k, timer)),
                    _ => {
                        self.timers.insert((*due, k.clone(), timer.clone()));
                    }
                }
            }
            for effect in &slot.h.open {
                calls.push((
                    k.clone(),
                    shared.driver.work(&k, inst.machine(), slot.h.depth, effect.clone()),
                ));
            }
        }
        self.corr.update(&k, &slot.h.inst);
        if !shared.cfg.exactly_once && !self.corr.routed(&k).is_empty() {
            self.resubscribe.push(k.clone());
        }
        if cache.is_some_and(|n| self.slots.len() >= n) && slot.h.open.is_empty() {
            // In the store: read back when something comes for it.
            self.evicted = true;
        } else {
            self.slots.insert(k, Box::new(slot));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Origin, Parked};
    use serde_json::{json, Value};

    /// A decision's position record numbered 0 cannot tell lost offsets from none (the group
    /// reads clock 0 either way); numbered from 1, as it is after a new partition's first
    /// transaction ([`commit_offsets`]), it can.
    #[test]
    fn lost_offsets_are_seen_once_no_decision_is_numbered_0() {
        let position = |through, clock| {
            serde_json::to_vec(&StateRecord {
                through,
                clock: Some(clock),
                ..StateRecord::default()
            })
            .expect("json")
        };
        assert!(Latest::new(0, 0).fresh(), "nothing read: a new partition");
        assert!(!Latest::new(3, 1).fresh(), "a clock: it committed");
        let mut zero = Latest::new(0, 0);
        zero.record(Some(POSITION_KEY.into()), Some(&position(4, 0)), None);
        assert!(!zero.fresh());
        assert_eq!(zero.offsets_lost(), None, "numbered 0, the loss does not show");
        let mut one = Latest::new(0, 0);
        one.record(Some(POSITION_KEY.into()), Some(&position(4, 1)), None);
        assert_eq!(one.offsets_lost(), Some(0), "numbered 1, it does");
        let mut genesis = Latest::new(0, 0);
        genesis.genesis();
        assert!(!genesis.fresh(), "its first transaction committed");
    }

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

    /// A definition whose instances wait for a correlated event (`order` = their input's `n`)
    /// or an hour.
    fn waiting() -> Value {
        json!({
            "id": "wait", "version": "1.0", "name": "Wait",
            "events": [ { "name": "go", "type": "r.go", "source": "client",
                "correlation": [ { "contextAttributeName": "order", "contextAttributeValue": "${ .n }" } ] } ],
            "states": [
                { "name": "Wait", "start": true, "transitions": [
                    { "nextState": "Done", "eventGroups": [ { "events": [ "go" ] } ] },
                    { "nextState": "Done", "timeout": "PT1H" } ] },
                { "name": "Done", "final": true }
            ]
        })
    }

    fn shared(rt: &tokio::runtime::Runtime) -> Shared {
        let shared = super::super::sim::shared(rt);
        let m = sm4c_runtime::load(&waiting(), &mut sm4c_runtime::no_files, Default::default())
            .unwrap_or_else(|e| panic!("the definition does not load: {e:?}"));
        shared
            .registry
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(Arc::new(m));
        shared
    }

    /// `n` waiting instances of partition 0 started by the real decision code, as records of the
    /// state topic (keyed by id, committed by the offsets `Latest::new(10, 10)` reads with).
    fn started(shared: &Shared, n: usize) -> Vec<(String, Vec<u8>)> {
        let ids: Vec<String> = (0..)
            .map(|i| format!("w{i:05}"))
            .filter(|id| crate::wire::partition_of(id, shared.partitions) == 0)
            .take(n)
            .collect();
        let payloads: Vec<Vec<u8>> = ids
            .iter()
            .map(|id| {
                let start = crate::wire::Command::Start {
                    id: id.clone(),
                    definition: "wait".into(),
                    version: None,
                    input: json!({"n": format!("o-{id}")}),
                    parent: None,
                    depth: 0,
                    origin: None,
                    request: None,
                    traceparent: None,
                    schedule: None,
                    nominal: None,
                };
                serde_json::to_vec(&start).expect("json")
            })
            .collect();
        let (mut t, _) = Latest::new(0, 0).owner(shared, 0, None, None);
        let commands = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| (i as i64, 1_000, p.as_slice()));
        let b = super::super::decision::decide(shared, &mut t, commands, Default::default(), 1_000);
        let records: Vec<(String, Vec<u8>)> = b
            .records
            .into_iter()
            .filter_map(|(id, r)| {
                let record = StateRecord {
                    through: 0,
                    clock: Some(0),
                    instance: Some(r?),
                    ..StateRecord::default()
                };
                Some((id, serde_json::to_vec(&record).expect("json")))
            })
            .collect();
        assert_eq!(records.len(), n, "every instance started");
        records
    }

    /// Restores `records` (then a corrupt record of `corrupt`, a record of `stale` that did not
    /// commit, and an ended instance) through `store` when given (streaming, keeping `cache`
    /// instances), in memory otherwise.
    fn restored(
        shared: &Shared,
        records: &[(String, Vec<u8>)],
        store: Option<Arc<dyn LocalStore>>,
        cache: usize,
        (corrupt, stale): (&str, &str),
    ) -> (Owner, Vec<(String, Work)>, usize) {
        let mut state = Latest::new(10, 10);
        if let Some(s) = &store {
            state.stream(s.clone(), 0, cache);
        }
        let mut written_while_reading = 0;
        for (k, payload) in records {
            state.record(Some(k.clone()), Some(payload), None);
            if state.due() {
                state.write(false);
                written_while_reading += 1;
            }
        }
        let mut ended = crate::view::tests::record("ended", "order", sm4c_runtime::Status::Completed, 5);
        ended.snapshot.ended_at = Some(7_000);
        let ended = StateRecord {
            through: 0,
            clock: Some(0),
            instance: Some(ended),
            ..StateRecord::default()
        };
        state.record(
            Some("ended".into()),
            Some(&serde_json::to_vec(&ended).expect("json")),
            None,
        );
        state.record(Some(corrupt.into()), Some(b"{\"through\": garbage"), None);
        // Written by a transaction that did not commit: the earlier record stays.
        let mut aborted: StateRecord = serde_json::from_slice(&records[0].1).expect("a record");
        aborted.through = 50;
        aborted.clock = Some(20);
        state.record(
            Some(stale.into()),
            Some(&serde_json::to_vec(&aborted).expect("json")),
            None,
        );
        if let Some(s) = &store {
            assert!(
                state.latest.is_empty(),
                "a streaming restore keeps no instance record in memory"
            );
            assert_eq!(
                state.save(s.as_ref(), 0, 0, 100),
                Some(0),
                "a key is stale: no checkpoint"
            );
        }
        let (mut t, calls) = state.owner(shared, 0, None, None);
        assert_eq!(t.unreadable, None);
        t.store = store;
        (t, calls, written_while_reading)
    }

    #[test]
    fn a_streaming_restore_keeps_its_cache_in_memory_and_finds_every_instance_in_the_store() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = shared(&rt);
        let n = SPILL_BATCH * 2 + 10;
        let records = started(&shared, n);
        let corrupt = records[3].0.clone();
        let stale = records[0].0.clone();
        let stores = sm4c_host::local::MemoryStores::default();
        let store = sm4c_host::local::LocalStores::open(&stores, "sim.state-0").expect("a memory store opens");
        let (mut t, calls, written) = restored(&shared, &records, Some(store.clone()), 3, (&corrupt, &stale));
        assert_eq!(
            written, 2,
            "the records went to the store while they were read, in batches"
        );
        assert!(calls.is_empty());
        // Memory holds the cache; the store holds every instance, and its listing rows.
        let first: Vec<&String> = records.iter().map(|(k, _)| k).take(3).collect();
        let mut cached: Vec<&String> = t.slots.keys().collect();
        cached.sort();
        assert_eq!(cached, first, "the first instances in key order");
        assert!(t.evicted);
        assert!(t.records.is_empty(), "the API reads the store");
        assert_eq!(store.count(crate::view::ROW_PREFIX).expect("reads"), n + 1);
        for (k, _) in &records {
            assert!(store.get(k).expect("reads").is_some(), "{k} is in the store");
        }
        // Every unended instance's timer and correlation keys were taken, cached or not; the
        // correlation index and the ended instances went to the store as they were made.
        assert!(t.corr.kept.mem.is_empty() && t.ended.kept.mem.is_empty());
        assert_eq!(store.count(index::ENDED_PREFIX).expect("reads"), 2, "by time and by id");
        assert!(store.count(index::CORR_PREFIX).expect("reads") >= 2 * n);
        assert!(t.timers.is_empty(), "in the store");
        assert_eq!(store.count(index::TIMER_PREFIX).expect("reads"), n);
        assert!(t.known.contains("ended") && t.known.len() == n + 1);
        // Placed with a horizon past them, every timer comes into memory and leaves the store.
        t.place_index(0, 3_600_000 + 1_001).expect("a memory store writes");
        assert_eq!(t.timers.len(), n);
        assert!(t.timers.iter().all(|(due, _, _)| *due == 1_000 + 3_600_000));
        assert_eq!(store.count(index::TIMER_PREFIX).expect("reads"), 0);
        assert!(t.ended.contains("ended"));
        let last = records[n - 1].0.clone();
        let event = json!({"type": "r.go", "source": "client", "order": format!("o-{last}")});
        assert_eq!(
            t.corr.candidates(&event).into_iter().collect::<Vec<_>>(),
            std::slice::from_ref(&last)
        );
        // An instance beyond the cache is read back from the store when something comes for it.
        assert!(!t.slots.contains_key(&last));
        let slot = t.slot(&shared, &last).expect("read from the store");
        assert_eq!(slot.h.inst.snapshot().state_name.as_deref(), Some("Wait"));
        assert_eq!(t.unreadable, None);
        // The corrupt record fails its instance only, from its earlier record, which the store
        // kept; the key whose last record did not commit gets its committed one written again.
        assert_eq!(t.corrupt.iter().map(|(k, _)| k).collect::<Vec<_>>(), [&corrupt]);
        assert!(store.get(&corrupt).expect("reads").is_some());
        assert_eq!(t.repair.len(), 1);
        assert_eq!(t.repair[0].key.as_deref(), Some(stale.as_str()));
        assert_eq!(t.repair[0].payload.as_deref(), Some(records[0].1.as_slice()));
        assert_eq!(
            store.get(&stale).expect("reads").as_deref(),
            Some(records[0].1.as_slice())
        );
    }

    #[test]
    fn a_streaming_restore_decides_as_one_that_holds_the_partition_in_memory() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = shared(&rt);
        let records = started(&shared, 40);
        let keys = (records[5].0.as_str(), records[9].0.as_str());
        let stores = sm4c_host::local::MemoryStores::default();
        let store = sm4c_host::local::LocalStores::open(&stores, "sim.state-0").expect("a memory store opens");
        let (mut streamed, _, _) = restored(&shared, &records, Some(store.clone()), 7, keys);
        let (held, _, _) = restored(&shared, &records, None, 0, keys);
        // Far from now, the timers wait in the store; near, in memory.
        streamed.place_index(0, 60_000).expect("a memory store writes");
        assert!(streamed.timers.is_empty());
        let mut far = Vec::new();
        store
            .scan(index::TIMER_PREFIX, &mut |k, _| far.extend(index::parse_timer_key(k)))
            .expect("a memory store reads");
        assert_eq!(far, held.timers.iter().cloned().collect::<Vec<_>>());
        assert_eq!(streamed.horizon, 60_000);
        assert_eq!(streamed.known, held.known);
        assert_eq!(streamed.last_order, held.last_order);
        assert_eq!(streamed.corrupt, held.corrupt);
        let repair = |t: &Owner| {
            t.repair
                .iter()
                .map(|o| (o.key.clone(), o.payload.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(repair(&streamed), repair(&held));
        assert_eq!(streamed.slots.len(), 7);
        assert_eq!(held.slots.len(), 40);
        assert!(streamed.slots.keys().all(|k| held.slots.contains_key(k)));
    }

    #[test]
    fn a_streaming_restore_revoked_while_it_reads_leaves_the_store_alone_and_fails() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = shared(&rt);
        let records = started(&shared, SPILL_BATCH + 1);
        let stores = sm4c_host::local::MemoryStores::default();
        let store = sm4c_host::local::LocalStores::open(&stores, "sim.state-0").expect("a memory store opens");
        // What the partition's store held: a record, and its checkpoint.
        let (cp, old) = (
            Checkpoint {
                offset: 3,
                written_ms: 1,
            },
            (records[0].0.as_str(), Some(&b"{}"[..])),
        );
        store.apply(&[old], Some(cp)).expect("a memory store writes");
        let mut state = Latest::new(10, 10);
        state.stream(store.clone(), 0, 3);
        for (k, payload) in &records {
            state.record(Some(k.clone()), Some(payload), None);
            if state.due() {
                state.write(true);
            }
        }
        assert_eq!(state.save(store.as_ref(), 0, 3, 100), None);
        assert_eq!(store.count("").expect("reads"), 1, "nothing written");
        assert_eq!(store.get(old.0).expect("reads").as_deref(), old.1);
        assert_eq!(store.checkpoint().expect("reads"), Some(cp));
    }

    /// The peak resident memory of this process so far (`VmHWM`), in MB.
    fn peak_mb() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status reads");
        let kb = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmHWM in /proc/self/status");
        kb / 1024
    }

    /// The restore's memory, measured: restores a partition of `SM4C_RESTORE_BENCH_N` (100,000)
    /// waiting instances, written by the real serializer and read through [`Latest`] as the
    /// worker reads them, into a SQLite local store (as the `sm4c` binary keeps), keeping
    /// `SM4C_RESTORE_BENCH_CACHE` (10,000) in memory; `SM4C_RESTORE_BENCH_MODE=held` restores
    /// the way it did before it streamed (every record held until the owner is made). Prints the
    /// process's peak RSS before and after. Run alone, one process per figure (see
    /// bench/kafka/README.md):
    /// `cargo test -p sm4c-kafka --lib restore_memory -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, run by hand: see bench/kafka/README.md"]
    fn restore_memory() {
        let var = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} must be a number")))
                .unwrap_or(default)
        };
        let n = var("SM4C_RESTORE_BENCH_N", 100_000);
        let cache = var("SM4C_RESTORE_BENCH_CACHE", 10_000);
        let held = std::env::var("SM4C_RESTORE_BENCH_MODE").is_ok_and(|m| m == "held");
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = shared(&rt);
        let template: StateRecord = serde_json::from_slice(&started(&shared, 1)[0].1).expect("a record");
        let stores = sm4c_durable::local::SqliteStores::temporary().expect("a temporary store");
        let store = sm4c_host::local::LocalStores::open(&stores, "sim.state-0").expect("a store opens");
        let before = peak_mb();
        let mut state = Latest::new(10, 10);
        if !held {
            state.stream(store.clone(), 0, cache);
        }
        for i in 0..n {
            let mut r = template.clone();
            let id = format!("i{i:07}");
            if let Some(rec) = r.instance.as_mut() {
                rec.snapshot.id = id.clone();
                rec.order = (1_000 + i as i64, 0);
            }
            let payload = serde_json::to_vec(&r).expect("json");
            state.record(Some(id), Some(&payload), None);
            if state.due() {
                state.write(false);
            }
        }
        assert!(state.save(store.as_ref(), 0, 0, n as i64).is_some());
        state.cache(cache);
        let (mut t, _) = state.owner(&shared, 0, None, None);
        t.store = Some(store.clone());
        t.place_index(0, shared.cfg.timer_horizon_ms).expect("the store writes");
        t.evict(cache, u64::MAX);
        assert_eq!(t.known.len(), n);
        assert_eq!(t.slots.len(), cache.min(n));
        let after = peak_mb();
        println!(
            "restore_memory: {n} instances, cache {cache}, {}: peak RSS {before} MB before the restore, {after} MB after",
            if held { "held" } else { "streamed" }
        );
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
