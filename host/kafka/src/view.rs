//! What a worker's HTTP API answers from: the instances of the commands partitions this worker
//! owns, fed by the worker itself (the records of a partition when it is restored, then those of
//! each committed transaction), and dropped with the partition. Requests about another worker's
//! instances are forwarded to that worker by the API ([`sm4c_host::service::Whereabouts`]); a
//! listing asks every worker. Also the definitions topic, which every worker reads whole.
//!
//! Where the worker keeps local stores, an instance's record is read from its partition's store
//! (which holds the committed records of the state partition): memory keeps a small row per
//! instance for listings, and the records of the last transactions until the store has them. An
//! instance that ended long ago, or one that waits for a week, costs its row only. Without stores
//! every record stays in memory.

use super::wire::{InstanceRecord, Quiet, StateRecord};
use super::worker::keeper::Progress;
use super::Shared;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use sm4c_host::local::LocalStore;
use sm4c_host::service::Summary;
use sm4c_runtime::engine::rfc3339;
use sm4c_runtime::{load, LoadOptions, Snapshot, Status};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// The instances of one partition, by id.
pub(crate) type Records = HashMap<String, InstanceRecord>;

/// A partition's local store, and the writer's progress with it.
#[derive(Clone)]
pub(crate) struct Backing {
    pub store: Arc<dyn LocalStore>,
    pub progress: Arc<Progress>,
}

/// The instances of the partitions this worker owns and has restored.
#[derive(Default)]
pub struct View {
    partitions: RwLock<HashMap<i32, Part>>,
    /// Definition ids and task list names, one copy each for every row.
    names: Mutex<HashSet<Arc<str>>>,
    /// True once the definitions topic was read to its end at start.
    pub ready: AtomicBool,
    /// Set to stop following.
    pub stop: AtomicBool,
}

/// What the view keeps of one partition.
struct Part {
    /// Where the records are read from; `None`: they all stay in `recent`.
    backing: Option<Backing>,
    /// Every instance of the partition, ended ones too (until deleted after the retention).
    rows: HashMap<Box<str>, Row>,
    /// Records of the last transactions, with the writer's ticket of each, until the store has
    /// them (every record when the partition has no store).
    recent: HashMap<Box<str>, (u64, InstanceRecord)>,
    /// The records in `recent` in the order of their tickets.
    queue: VecDeque<(u64, Box<str>)>,
}

/// What a listing needs of an instance without reading its record.
struct Row {
    seq: i64,
    status: Status,
    definition: Arc<str>,
    /// The task lists of its open worker tasks (for `GET /tasklists`).
    tasks: Box<[Arc<str>]>,
}

/// An instance's place in listings: the timestamp of its start command (ms), then its partition
/// and the start's offset there (10 bits each), in one integer that grows with later starts.
/// Two starts get the same only if they share the millisecond, their partition modulo 1,024 and
/// their offset modulo 1,024 (over a million starts a second on one partition).
pub fn seq(r: &InstanceRecord, p: i32) -> i64 {
    let (at, offset) = r.order;
    (at.clamp(0, (1 << 43) - 1) << 20) | (((p as i64) & 0x3ff) << 10) | (offset & 0x3ff)
}

/// What of an instance's `order` its [`seq`] keeps, in the same order.
pub fn order_key((at, offset): (i64, i64)) -> (i64, i64) {
    (at.clamp(0, (1 << 43) - 1), offset & 0x3ff)
}

/// The place in listings of an instance that starts at `at` from the input at `offset`, given the
/// latest place `last` taken on its partition: `(at, offset)` when it comes after `last` in
/// [`seq`]'s order, else the next place after `last`. So no two instances of a partition share a
/// [`seq`], which a listing's cursor needs (a page that ends between two with the same one would
/// skip the second): starts applied from different events partitions in one millisecond have
/// offsets that can agree modulo 1,024.
pub fn next_order(last: (i64, i64), at: i64, offset: i64) -> (i64, i64) {
    let (last_at, last_off) = order_key(last);
    if order_key((at, offset)) > (last_at, last_off) {
        (at, offset)
    } else if last_off < 0x3ff {
        (last_at, last_off + 1)
    } else {
        (last_at + 1, 0)
    }
}

/// Where one record is: in memory, or in a store.
enum Found {
    Here(Box<InstanceRecord>),
    Stored(Arc<dyn LocalStore>),
}

impl Found {
    fn read(self, id: &str) -> Option<InstanceRecord> {
        match self {
            Found::Here(r) => Some(*r),
            Found::Stored(store) => decode(store.as_ref(), id),
        }
    }
}

/// Instance `id`'s record as a partition's local store keeps it (the state topic's record);
/// `Err` says why it cannot be read.
pub(crate) fn stored(store: &dyn LocalStore, id: &str) -> Result<Option<InstanceRecord>, String> {
    let Some(bytes) = store
        .get(id)
        .map_err(|e| format!("instance {id:?} cannot be read from the local store: {e}"))?
    else {
        return Ok(None);
    };
    serde_json::from_slice::<StateRecord>(&bytes)
        .map(|r| r.instance)
        .map_err(|e| format!("instance {id:?} in the local store does not read: {e}"))
}

/// [`stored`], for the API: a record that cannot be read is logged and answered as missing.
fn decode(store: &dyn LocalStore, id: &str) -> Option<InstanceRecord> {
    stored(store, id).unwrap_or_else(|why| {
        tracing::warn!(why, "an instance record is not answered");
        None
    })
}

impl Part {
    /// Whether the partition can be answered for: a store whose write failed holds nothing (the
    /// worker restores the partition again).
    fn usable(&self, p: i32) -> bool {
        self.backing.as_ref().is_none_or(|b| !b.progress.broken(p, &b.store))
    }

    fn find(&self, id: &str) -> Option<Found> {
        self.rows.get(id)?;
        match self.recent.get(id) {
            Some((_, r)) => Some(Found::Here(Box::new(r.clone()))),
            None => Some(Found::Stored(self.backing.as_ref()?.store.clone())),
        }
    }

    /// Drops from memory the records the store has now.
    fn prune(&mut self, p: i32) {
        let Some(b) = &self.backing else { return };
        if b.progress.broken(p, &b.store) {
            return;
        }
        let written = b.progress.written(p);
        while self.queue.front().is_some_and(|(t, _)| *t <= written) {
            let Some((t, id)) = self.queue.pop_front() else { break };
            if self.recent.get(&id).is_some_and(|(u, _)| *u == t) {
                self.recent.remove(&id);
            }
        }
    }
}

impl View {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<i32, Part>> {
        self.partitions.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<i32, Part>> {
        self.partitions.write().unwrap_or_else(|p| p.into_inner())
    }

    fn name(&self, n: &str) -> Arc<str> {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = names.get(n) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(n);
        names.insert(a.clone());
        a
    }

    fn row(&self, r: &InstanceRecord, p: i32) -> Row {
        let tasks = match r.snapshot.status.is_final() {
            true => Box::default(),
            false => r
                .calls
                .iter()
                .filter(|(_, e)| sm4c_host::driver::is_task(e))
                .filter_map(|(_, e)| match e {
                    sm4c_runtime::Effect::InvokeFunction { operation, .. } => Some(self.name(operation)),
                    _ => None,
                })
                .collect(),
        };
        Row {
            seq: seq(r, p),
            status: r.snapshot.status,
            definition: self.name(&r.snapshot.definition),
            tasks,
        }
    }

    /// Instance `id`, if its partition is held here (`p`, its partition).
    pub fn get(&self, p: i32, id: &str) -> Option<InstanceRecord> {
        // The store is read without holding the view: a record it gives is the one found missing
        // from memory or a later one (the store only moves on).
        let found = self.read().get(&p)?.find(id)?;
        found.read(id)
    }

    /// Whether partition `p` is held here: owned and restored.
    pub fn holds(&self, p: i32) -> bool {
        self.read().get(&p).is_some_and(|part| part.usable(p))
    }

    /// The partitions held here.
    pub(crate) fn held(&self) -> Vec<i32> {
        self.read().keys().copied().collect()
    }

    /// How many instances are held here.
    pub fn len(&self) -> usize {
        self.read().values().map(|part| part.rows.len()).sum()
    }

    /// How many records are in memory (those the stores do not have yet, or every record without
    /// stores).
    pub fn in_memory(&self) -> usize {
        self.read().values().map(|part| part.recent.len()).sum()
    }

    /// A partition restored here: its instances, ended ones included, and the store that holds
    /// them all (`None`: the view keeps them).
    pub(crate) fn take(&self, p: i32, records: Records, backing: Option<Backing>) {
        let rows = records
            .iter()
            .map(|(id, r)| (id.as_str().into(), self.row(r, p)))
            .collect();
        let recent = match backing {
            Some(_) => HashMap::new(),
            None => records
                .into_iter()
                .map(|(id, r)| (id.into_boxed_str(), (0, r)))
                .collect(),
        };
        let part = Part {
            backing,
            rows,
            recent,
            queue: VecDeque::new(),
        };
        self.write().insert(p, part);
    }

    /// A committed transaction of partition `p`: each instance's new record, or `None` for one
    /// deleted (past its retention); `ticket` is the writer's ticket of the transaction's write to
    /// the partition's store.
    pub(crate) fn apply(&self, p: i32, changes: Vec<(String, Option<InstanceRecord>)>, ticket: u64) {
        type Change = (Box<str>, Option<(Row, InstanceRecord)>);
        let rows: Vec<Change> = changes
            .into_iter()
            .map(|(id, r)| (id.into_boxed_str(), r.map(|r| (self.row(&r, p), r))))
            .collect();
        let mut all = self.write();
        let Some(part) = all.get_mut(&p) else { return };
        part.prune(p);
        let stored = part.backing.is_some();
        for (id, r) in rows {
            match r {
                Some((row, r)) => {
                    part.rows.insert(id.clone(), row);
                    if stored {
                        part.queue.push_back((ticket, id.clone()));
                    }
                    part.recent.insert(id, (ticket, r));
                }
                None => {
                    part.rows.remove(&id);
                    part.recent.remove(&id);
                }
            }
        }
    }

    /// Drops from memory the records the stores have now (also done with each transaction; this
    /// is for partitions that are quiet).
    pub(crate) fn prune(&self) {
        for (p, part) in self.write().iter_mut() {
            part.prune(*p);
        }
    }

    /// Partition `p` is no longer owned here.
    pub(crate) fn release(&self, p: i32) {
        self.write().remove(&p);
    }

    /// The open worker tasks of the instances held here, by task list.
    pub fn open_tasks(&self) -> HashMap<Arc<str>, usize> {
        let mut open: HashMap<Arc<str>, usize> = HashMap::new();
        for part in self.read().values() {
            for row in part.rows.values().filter(|r| !r.status.is_final()) {
                for l in row.tasks.iter() {
                    *open.entry(l.clone()).or_default() += 1;
                }
            }
        }
        open
    }

    /// The snapshots an event is explained against: instance `target`'s, ended or not, when the
    /// event names one; else those of the unended instances held here.
    pub fn to_explain(&self, target: Option<&str>) -> Vec<Snapshot> {
        let found: Vec<(Box<str>, Found)> = {
            let all = self.read();
            match target {
                Some(t) => all
                    .iter()
                    .filter(|(p, part)| part.usable(**p))
                    .map(|(_, part)| part)
                    .filter_map(|part| Some((t.into(), part.find(t)?)))
                    .collect(),
                None => all
                    .iter()
                    .filter(|(p, part)| part.usable(**p))
                    .map(|(_, part)| part)
                    .flat_map(|part| {
                        part.rows
                            .iter()
                            .filter(|(_, r)| !r.status.is_final())
                            .filter_map(|(id, _)| Some((id.clone(), part.find(id)?)))
                    })
                    .collect(),
            }
        };
        found
            .into_iter()
            .filter_map(|(id, f)| f.read(&id))
            .map(|r| r.snapshot)
            .collect()
    }

    /// The instances held here in start order ([`seq`]), after cursor `after`.
    pub fn list(&self, status: Option<&str>, definition: Option<&str>, after: i64, limit: usize) -> Vec<Summary> {
        let page: Vec<(i64, Box<str>, Found)> = {
            let all = self.read();
            // A partition whose store broke is left out, as one being restored is.
            let mut rows: Vec<(i64, &str, &Part)> = all
                .iter()
                .filter(|(p, part)| part.usable(**p))
                .map(|(_, part)| part)
                .flat_map(|part| part.rows.iter().map(move |(id, r)| (r, &**id, part)))
                .filter(|(r, _, _)| {
                    r.seq > after
                        && status.is_none_or(|s| r.status.as_str() == s)
                        && definition.is_none_or(|d| *r.definition == *d)
                })
                .map(|(r, id, part)| (r.seq, id, part))
                .collect();
            // The first `limit` only: a page costs one pass over the rows, not a sort of them all.
            let order = |a: &(i64, &str, &Part), b: &(i64, &str, &Part)| (a.0, a.1).cmp(&(b.0, b.1));
            if rows.len() > limit && limit > 0 {
                rows.select_nth_unstable_by(limit - 1, order);
            }
            rows.truncate(limit);
            rows.sort_unstable_by(order);
            rows.into_iter()
                .filter_map(|(seq, id, part)| Some((seq, id.into(), part.find(id)?)))
                .collect()
        };
        page.into_iter()
            .filter_map(|(seq, id, found)| {
                let r = found.read(&id)?;
                Some(Summary {
                    id: id.into(),
                    definition: r.snapshot.definition,
                    version: r.snapshot.version,
                    status: r.snapshot.status.as_str().to_string(),
                    state: r.snapshot.state_name,
                    started_at: r.snapshot.started_at.map(rfc3339),
                    ended_at: r.snapshot.ended_at.map(rfc3339),
                    parent: r.parent.map(|p| p.instance),
                    seq,
                })
            })
            .collect()
    }
}

/// Follows the definitions topic (definitions and breakpoints) from its beginning.
pub(crate) fn run(shared: std::sync::Arc<Shared>) {
    let view = &shared.view;
    let mut c = shared.consumer_config(&format!("{}.view", shared.cfg.group));
    c.set("enable.partition.eof", "true");
    let consumer: BaseConsumer<Quiet> = match c.create_with_context(Quiet) {
        Ok(c) => c,
        Err(e) => {
            shared.fail(format!("cannot create the definitions reader: {e}"));
            return;
        }
    };
    let mut tpl = TopicPartitionList::new();
    let _ = tpl.add_partition_offset(&shared.topics.definitions, 0, Offset::Beginning);
    if let Err(e) = consumer.assign(&tpl) {
        shared.fail(format!("cannot read the definitions topic: {e}"));
        return;
    }
    while !view.stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
                let payload = m.payload().unwrap_or_default();
                if let Some(definition) = key
                    .as_deref()
                    .and_then(|k| k.strip_prefix(super::wire::BREAKPOINTS_PREFIX))
                {
                    match serde_json::from_slice::<Vec<sm4c_runtime::Breakpoint>>(payload) {
                        Ok(b) => shared.breakpoints.set(definition, b),
                        Err(_) if payload.is_empty() => shared.breakpoints.set(definition, Vec::new()),
                        Err(e) => {
                            tracing::warn!(definition, error = %e, "breakpoints on the definitions topic do not read")
                        }
                    }
                    continue;
                }
                if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(payload) {
                    let options = LoadOptions {
                        limits: shared.cfg.expression,
                    };
                    match load(&doc, &mut sm4c_runtime::no_files, options) {
                        Ok(mach) => {
                            let mut reg = shared.registry.write().unwrap_or_else(|p| p.into_inner());
                            if reg.get(&mach.id, Some(&mach.version)).is_none() {
                                reg.insert(std::sync::Arc::new(mach));
                            }
                        }
                        Err(_) => tracing::warn!(key, "a definition on the definitions topic does not load"),
                    }
                }
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => view.ready.store(true, Ordering::Relaxed),
            Some(Err(e)) => tracing::debug!(error = %e, "definitions reader"),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::keeper::Keeper;
    use sm4c_host::local::{LocalError, LocalStores, MemoryStores};
    use sm4c_runtime::engine::Options;
    use sm4c_runtime::Instance;

    fn record(id: &str, definition: &str, status: Status, at: i64) -> InstanceRecord {
        let doc = serde_json::json!({"id": definition, "name": definition, "version": "1.0",
            "states": [{"name": "Wait", "start": true}]});
        let m = Arc::new(load(&doc, &mut sm4c_runtime::no_files, LoadOptions::default()).unwrap());
        let mut snapshot = Instance::new(m, id, Options::default()).snapshot().clone();
        snapshot.status = status;
        InstanceRecord {
            snapshot,
            parent: None,
            depth: 0,
            calls: Vec::new(),
            journal_len: 1,
            seen: Default::default(),
            order: (at, 0),
            request: None,
            origin: None,
            answered: Vec::new(),
            recent: Vec::new(),
        }
    }

    /// Writes records as a committed transaction's state records, the way the owner does.
    fn keep(keeper: &Keeper, store: &Arc<dyn LocalStore>, records: &[&InstanceRecord]) -> u64 {
        let changes = records
            .iter()
            .map(|r| {
                let state = StateRecord {
                    through: 0,
                    instance: Some((*r).clone()),
                    ..StateRecord::default()
                };
                (r.snapshot.id.clone(), Some(serde_json::to_vec(&state).unwrap()))
            })
            .collect();
        keeper.keep(0, store.clone(), changes, None)
    }

    #[test]
    fn with_a_store_records_are_read_from_it_and_memory_keeps_rows_and_the_unwritten_transactions() {
        let keeper = Keeper::start().unwrap();
        let stores = MemoryStores::default();
        let store = stores.open("state-0").unwrap();
        let (a, b, c) = (
            record("a", "order", Status::Waiting, 3),
            record("b", "order", Status::Completed, 1),
            record("c", "refund", Status::Waiting, 2),
        );
        // A restore: every record is in the store already.
        keep(&keeper, &store, &[&a, &b, &c]);
        keeper.sync(0);
        let view = View::default();
        let records: Records = [&a, &b, &c]
            .iter()
            .map(|r| (r.snapshot.id.clone(), (*r).clone()))
            .collect();
        let backing = Backing {
            store: store.clone(),
            progress: keeper.progress().clone(),
        };
        view.take(0, records, Some(backing));
        assert_eq!((view.len(), view.in_memory()), (3, 0));
        assert_eq!(view.get(0, "a").unwrap().snapshot.id, "a");
        assert!(view.get(0, "x").is_none());
        assert!(view.get(1, "a").is_none(), "partition 1 is not held");
        // Listings page in start order, filtered by the rows alone.
        let ids = |rows: Vec<Summary>| rows.into_iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(view.list(None, None, 0, 10)), ["b", "c", "a"]);
        assert_eq!(ids(view.list(None, None, 0, 2)), ["b", "c"]);
        let after = view.list(None, None, 0, 2)[1].seq;
        assert_eq!(ids(view.list(None, None, after, 2)), ["a"]);
        assert_eq!(ids(view.list(Some("waiting"), None, 0, 10)), ["c", "a"]);
        assert_eq!(ids(view.list(None, Some("refund"), 0, 10)), ["c"]);
        assert_eq!(view.list(None, None, 0, 10)[0].status, "completed");
        let unended: Vec<String> = view.to_explain(None).into_iter().map(|s| s.id).collect();
        assert_eq!(unended.len(), 2);
        assert_eq!(
            view.to_explain(Some("b")).len(),
            1,
            "a named instance is explained ended or not"
        );

        // A transaction: its records are answered from memory until the store has them.
        let mut a2 = a.clone();
        a2.snapshot.status = Status::Completed;
        a2.journal_len = 2;
        let ticket = keep(&keeper, &store, &[&a2]);
        view.apply(0, vec![("a".into(), Some(a2.clone())), ("b".into(), None)], ticket);
        assert_eq!(view.get(0, "a").unwrap().journal_len, 2);
        assert!(view.get(0, "b").is_none(), "deleted");
        assert_eq!(view.len(), 2);
        keeper.sync(0);
        // The next transaction drops what the store has by then.
        let d = record("d", "order", Status::Waiting, 4);
        let ticket = keep(&keeper, &store, &[&d]);
        view.apply(0, vec![("d".into(), Some(d.clone()))], ticket);
        assert_eq!(view.in_memory(), 1, "only d, whose write may still be queued");
        assert_eq!(view.get(0, "a").unwrap().journal_len, 2, "read from the store");
        assert_eq!(view.get(0, "d").unwrap().snapshot.id, "d");
        assert_eq!(ids(view.list(Some("completed"), None, 0, 10)), ["a"]);
        view.release(0);
        assert!(!view.holds(0));
    }

    /// A store whose writes fail, as on a full disk.
    struct Failing(Arc<dyn LocalStore>);

    impl LocalStore for Failing {
        fn checkpoint(&self) -> Result<Option<sm4c_host::local::Checkpoint>, LocalError> {
            self.0.checkpoint()
        }
        fn each(&self, f: &mut dyn FnMut(&str, &[u8])) -> Result<(), LocalError> {
            self.0.each(f)
        }
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>, LocalError> {
            self.0.get(key)
        }
        fn apply(
            &self,
            _: &[(&str, Option<&[u8]>)],
            _: Option<sm4c_host::local::Checkpoint>,
        ) -> Result<(), LocalError> {
            Err(LocalError("disk full".into()))
        }
        fn clear(&self) -> Result<(), LocalError> {
            self.0.clear()
        }
    }

    #[test]
    fn a_partition_whose_store_failed_a_write_is_not_answered_for_until_restored() {
        let keeper = Keeper::start().unwrap();
        let stores = MemoryStores::default();
        let store: Arc<dyn LocalStore> = Arc::new(Failing(stores.open("state-0").unwrap()));
        let view = View::default();
        let backing = Backing {
            store: store.clone(),
            progress: keeper.progress().clone(),
        };
        view.take(0, Records::new(), Some(backing));
        assert!(view.holds(0));
        let a = record("a", "order", Status::Waiting, 1);
        let ticket = keep(&keeper, &store, &[&a]);
        view.apply(0, vec![("a".into(), Some(a))], ticket);
        keeper.sync(0);
        assert!(
            !view.holds(0),
            "the store is cleared: the partition is restored again first"
        );
        assert!(
            view.list(None, None, 0, 10).is_empty(),
            "listed as a partition being restored"
        );
        assert!(view.to_explain(None).is_empty() && view.to_explain(Some("a")).is_empty());
        // The records stay in memory: a failed store's tickets are done, yet nothing is dropped.
        view.apply(0, Vec::new(), ticket);
        assert_eq!(view.in_memory(), 1);
    }

    #[test]
    fn starts_of_one_partition_get_distinct_places_in_listings() {
        let mut last = (0, 0);
        let mut seqs = Vec::new();
        // Offsets that agree modulo 1,024 in one millisecond, an earlier one, and the end of a
        // millisecond's places.
        for (at, offset) in [(10, 5), (10, 1029), (10, 2053), (9, 7), (10, 1023), (10, 3), (11, 0)] {
            last = next_order(last, at, offset);
            let mut r = record("x", "order", Status::Waiting, 0);
            r.order = last;
            seqs.push(seq(&r, 3));
        }
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        assert_eq!(next_order((10, 5), 10, 6), (10, 6), "a later start keeps its own place");
        assert_eq!(next_order((10, 1023), 10, 2), (11, 0));
    }

    #[test]
    fn without_a_store_every_record_stays_in_memory() {
        let view = View::default();
        let a = record("a", "order", Status::Waiting, 1);
        view.take(0, [("a".to_string(), a.clone())].into_iter().collect(), None);
        let b = record("b", "order", Status::Waiting, 2);
        view.apply(0, vec![("b".into(), Some(b))], 0);
        assert_eq!((view.len(), view.in_memory()), (2, 2));
        assert_eq!(view.get(0, "a").unwrap().snapshot.id, "a");
        assert_eq!(view.list(None, None, 0, 10).len(), 2);
    }
}
