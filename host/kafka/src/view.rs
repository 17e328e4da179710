//! What a worker's HTTP API answers from: the instances of the commands partitions this worker
//! owns, fed by the worker itself (the records of a partition when it is restored, then those of
//! each committed transaction), and dropped with the partition. Requests about another worker's
//! instances are forwarded to that worker by the API ([`sm4c_host::service::Whereabouts`]); a
//! listing asks every worker. Also the definitions topic, which every worker reads whole.
//!
//! Where the worker keeps local stores, an instance's record is read from its partition's store
//! (which holds the committed records of the state partition), and listings from the *local
//! index* kept beside them in the same store ([`index_changes`]): a row per instance in start
//! order, and the task lists of the instances with open tasks. Memory keeps only the records of
//! the last transactions until the store has them: an instance that ended long ago, or one that
//! waits for a week, costs no memory at all. Without stores every record stays in memory.

use super::wire::{InstanceRecord, Quiet, StateRecord};
use super::worker::keeper::Progress;
use super::Shared;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use sm4c_host::local::LocalStore;
use sm4c_host::service::Summary;
use sm4c_runtime::engine::rfc3339;
use sm4c_runtime::{load, LoadOptions, Snapshot, Status};
use sm4c_schedule::{Spec, State};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// The instances of one partition, by id.
pub(crate) type Records = HashMap<String, InstanceRecord>;

/// The keys of the local index: derived from the state records in the same store, written with
/// them, never in the log. (Instance ids that start with a NUL character are refused, so no
/// record's key starts with it but the partition's own records' and these.)
pub(crate) const INDEX_PREFIX: &str = "\u{0}local/";
/// An instance's row in listings: `<prefix><seq as 16 hex digits><NUL><id>`, so that the keys
/// are in start order; its value is the instance's [`Summary`].
pub(crate) const ROW_PREFIX: &str = "\u{0}local/row/";
/// The task lists of an unended instance's open worker tasks: `<prefix><id>`, a JSON array.
const TASKS_PREFIX: &str = "\u{0}local/tasks/";

/// Says which version of the local index a store holds: one without it (written by an earlier
/// version) is rebuilt from the log at its next restore.
pub(crate) const INDEX_VERSION_KEY: &str = "\u{0}local/version";
/// The version of the local index this build writes.
pub(crate) const INDEX_VERSION: &[u8] = b"1";

fn row_key(seq: i64, id: &str) -> String {
    format!("{ROW_PREFIX}{:016x}\u{0}{id}", seq.max(0))
}

/// The seq and the id of a row's key.
pub(crate) fn parse_row_key(k: &str) -> Option<(i64, &str)> {
    let (seq, id) = k.strip_prefix(ROW_PREFIX)?.split_once('\u{0}')?;
    Some((i64::from_str_radix(seq, 16).ok()?, id))
}

/// The listing of an instance, from its record.
pub(crate) fn summary(id: &str, r: &InstanceRecord, seq: i64) -> Summary {
    Summary {
        id: id.to_string(),
        definition: r.snapshot.definition.clone(),
        version: r.snapshot.version.clone(),
        status: r.snapshot.status.as_str().to_string(),
        state: r.snapshot.state_name.clone(),
        started_at: r.snapshot.started_at.map(rfc3339),
        ended_at: r.snapshot.ended_at.map(rfc3339),
        parent: r.parent.as_ref().map(|p| p.instance.clone()),
        seq,
    }
}

/// The task lists of an instance's open worker tasks (none once it ended).
fn task_lists(r: &InstanceRecord) -> impl Iterator<Item = &str> {
    let open = !r.snapshot.status.is_final();
    r.calls
        .iter()
        .filter(move |_| open)
        .filter(|(_, e)| sm4c_host::driver::is_task(e))
        .filter_map(|(_, e)| match e {
            sm4c_runtime::Effect::InvokeFunction { operation, .. } => Some(operation.as_str()),
            _ => None,
        })
}

/// What the local index of partition `p` changes by when instance `id`'s record becomes `now`:
/// its row and its open tasks, written or deleted. `before` is the [`seq`] of the record it had,
/// when known and possibly different (an instance deleted and started again gets a new place).
/// No IO: the owner derives it from each transaction, a restore from what it read.
pub(crate) fn index_changes(
    p: i32,
    id: &str,
    now: Option<&InstanceRecord>,
    before: Option<i64>,
) -> Vec<(String, Option<Vec<u8>>)> {
    let mut changes = Vec::with_capacity(3);
    let seq_now = now.map(|r| seq(r, p));
    if let Some(old) = before.filter(|old| Some(*old) != seq_now) {
        changes.push((row_key(old, id), None));
    }
    let tasks_key = format!("{TASKS_PREFIX}{id}");
    match (now, seq_now) {
        (Some(r), Some(seq)) => {
            let row = serde_json::to_vec(&summary(id, r, seq)).unwrap_or_default();
            changes.push((row_key(seq, id), Some(row)));
            let lists: Vec<&str> = task_lists(r).collect();
            let tasks = (!lists.is_empty()).then(|| serde_json::to_vec(&lists).unwrap_or_default());
            changes.push((tasks_key, tasks));
        }
        _ => changes.push((tasks_key, None)),
    }
    changes
}

/// Whether a key of a state store is one of the local index's (not the log's).
pub(crate) fn is_index_key(k: &str) -> bool {
    k.starts_with(INDEX_PREFIX)
}

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
    /// The schedules of the partitions held here, by partition, as of their last committed
    /// transaction.
    schedules: RwLock<HashMap<i32, Schedules>>,
    /// The shares of batch operations of the partitions held here, by partition, as of their
    /// last committed transaction.
    batches: RwLock<HashMap<i32, BTreeMap<String, sm4c_host::batch::Share>>>,
    /// What the owner decided for the schedule operations of API requests, by request token,
    /// with when it was kept: taken by the request that waits (the others are let go after
    /// [`ANSWER_KEPT`]).
    answers: Mutex<HashMap<String, (Instant, ScheduleAnswer)>>,
    /// The API requests waiting for a committed transaction to change an instance's record (by
    /// instance id) or to answer a schedule operation (by request token), with how many wait on
    /// each: [`View::apply`] and [`View::apply_schedules`] wake them as soon as the owner has
    /// committed, instead of leaving them to look again after a pause.
    watched: Mutex<HashMap<Box<str>, Watched>>,
    /// True once the definitions topic was read to its end at start.
    pub ready: AtomicBool,
    /// Set to stop following.
    pub stop: AtomicBool,
}

/// How long the answer to a schedule operation waits for its request (one that gave up, or that
/// another worker appended, takes none).
const ANSWER_KEPT: Duration = Duration::from_secs(120);

/// The schedules of one partition: each one's specification and state, by id.
pub(crate) type Schedules = BTreeMap<String, (Spec, State)>;

/// Why an owner refused a schedule operation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refusal {
    /// The specification is invalid: (JSON pointer, what is wrong) for each field.
    Invalid(Vec<(String, String)>),
    /// No such schedule.
    Unknown(String),
    /// A schedule of this id exists.
    Exists(String),
    /// The definition it starts is not registered.
    UnknownDefinition(String),
}

/// What an owner decided for a schedule operation: the schedule as `GET /schedules/{id}` shows
/// it, or why it refused.
pub(crate) type ScheduleAnswer = Result<serde_json::Value, Refusal>;

/// How many requests watch a key, and what wakes them.
type Watched = (usize, Arc<tokio::sync::Notify>);

/// A request's watch on an instance's record or a schedule request's answer ([`View::watch`]);
/// dropped, it no longer keeps its entry.
pub(crate) struct Watch<'a> {
    view: &'a View,
    key: Box<str>,
    notify: Arc<tokio::sync::Notify>,
}

impl Watch<'_> {
    /// A wait that ends once a committed transaction changes what is watched: take it before
    /// looking, then wait on it (with a bound of the caller's).
    pub(crate) fn armed(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut n = Box::pin(self.notify.notified());
        n.as_mut().enable();
        n
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut watched = self.view.watched.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((n, _)) = watched.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                watched.remove(&self.key);
            }
        }
    }
}

/// What the view keeps of one partition.
struct Part {
    /// Where the records and the local index are read from; `None`: every record stays in
    /// `recent`.
    backing: Option<Backing>,
    /// Records of the last transactions, with the writer's ticket of each, until the store has
    /// them (every record when the partition has no store); `None` for one deleted.
    recent: HashMap<Box<str>, (u64, Option<InstanceRecord>)>,
    /// The records in `recent` in the order of their tickets.
    queue: VecDeque<(u64, Box<str>)>,
}

/// An instance's place in listings: the timestamp of its start command (ms), then its partition
/// and the start's offset there (10 bits each), in one integer that grows with later starts.
/// Two starts get the same only if they share the millisecond, their partition modulo 1,024 and
/// their offset modulo 1,024 (over a million starts a second on one partition).
pub fn seq(r: &InstanceRecord, p: i32) -> i64 {
    seq_of(r.order, p)
}

/// [`seq`] of an instance's `order` (see [`InstanceRecord::order`]).
pub fn seq_of((at, offset): (i64, i64), p: i32) -> i64 {
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
    sm4c_runtime::json::read_stored::<StateRecord>(&bytes)
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
        match self.recent.get(id) {
            Some((_, r)) => Some(Found::Here(Box::new(r.clone()?))),
            None => Some(Found::Stored(self.backing.as_ref()?.store.clone())),
        }
    }

    fn store(&self) -> Option<Arc<dyn LocalStore>> {
        self.backing.as_ref().map(|b| b.store.clone())
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
        // A burst of transactions grows the table for the records waiting for the store; it
        // keeps that room once they are written (a hundred thousand starts left 19 MB), so give
        // it back.
        if self.recent.capacity() > 2 * self.recent.len() + 1024 {
            self.recent.shrink_to(2 * self.recent.len());
        }
        if self.queue.capacity() > 2 * self.queue.len() + 1024 {
            self.queue.shrink_to(2 * self.queue.len());
        }
    }
}

/// What a reader of one partition takes from the view before it reads the store, so that the view
/// is not held while it does: the store, and the records of the last transactions (which win over
/// what the store says of the same instances).
struct Taken<T> {
    store: Option<Arc<dyn LocalStore>>,
    /// What the reader takes of each recent record; `None` for one deleted or not wanted (its id
    /// still hides what the store says of it).
    recent: HashMap<Box<str>, Option<T>>,
}

/// Logs a local index that cannot be read: the answer leaves its partition's stored instances out.
fn unread(what: &str, e: sm4c_host::local::LocalError) {
    tracing::warn!(error = %e, "the local index cannot be read for {what}");
}

impl View {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<i32, Part>> {
        self.partitions.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<i32, Part>> {
        self.partitions.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The usable partitions' stores, and what `take` makes of their recent records (of partition,
    /// id and record): the records themselves are not copied.
    fn take_parts<T>(&self, take: impl Fn(i32, &str, &InstanceRecord) -> Option<T>) -> Vec<(i32, Taken<T>)> {
        self.take_parts_of(None, take)
    }

    /// [`View::take_parts`] of partition `only`, or of every partition.
    fn take_parts_of<T>(
        &self,
        only: Option<i32>,
        take: impl Fn(i32, &str, &InstanceRecord) -> Option<T>,
    ) -> Vec<(i32, Taken<T>)> {
        self.read()
            .iter()
            .filter(|(p, part)| only.is_none_or(|o| o == **p) && part.usable(**p))
            .map(|(p, part)| {
                let recent = part
                    .recent
                    .iter()
                    .map(|(id, (_, r))| (id.clone(), r.as_ref().and_then(|r| take(*p, id, r))))
                    .collect();
                (
                    *p,
                    Taken {
                        store: part.store(),
                        recent,
                    },
                )
            })
            .collect()
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

    /// How many instances are held here: the rows of the local indexes, corrected by the records
    /// of the last transactions.
    pub fn len(&self) -> usize {
        let mut n: i64 = 0;
        for (_, t) in self.take_parts(|_, _, _| Some(())) {
            let Some(store) = t.store else {
                n += t.recent.values().filter(|r| r.is_some()).count() as i64;
                continue;
            };
            match store.count(ROW_PREFIX) {
                Ok(rows) => n += rows as i64,
                Err(e) => unread("a count", e),
            }
            for (id, r) in &t.recent {
                let stored = matches!(store.get(id), Ok(Some(_)));
                n += i64::from(r.is_some() && !stored) - i64::from(r.is_none() && stored);
            }
        }
        n.max(0) as usize
    }

    /// How many records are in memory (those the stores do not have yet, or every record without
    /// stores).
    pub fn in_memory(&self) -> usize {
        self.read().values().map(|part| part.recent.len()).sum()
    }

    /// A partition restored here: its instances, ended ones included, and the store that holds
    /// them all and their local index (`None`: the view keeps them).
    pub(crate) fn take(&self, p: i32, records: Records, backing: Option<Backing>) {
        let recent = match backing {
            Some(_) => HashMap::new(),
            None => records
                .into_iter()
                .map(|(id, r)| (id.into_boxed_str(), (0, Some(r))))
                .collect(),
        };
        let part = Part {
            backing,
            recent,
            queue: VecDeque::new(),
        };
        self.write().insert(p, part);
    }

    /// A committed transaction of partition `p`: each instance's new record, or `None` for one
    /// deleted (past its retention); `ticket` is the writer's ticket of the transaction's write to
    /// the partition's store.
    pub(crate) fn apply(&self, p: i32, changes: Vec<(String, Option<InstanceRecord>)>, ticket: u64) {
        let mut all = self.write();
        let Some(part) = all.get_mut(&p) else { return };
        part.prune(p);
        let stored = part.backing.is_some();
        let watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        let mut wake = Vec::new();
        for (id, r) in changes {
            let id = id.into_boxed_str();
            if let Some((_, n)) = watched.get(&id) {
                wake.push(n.clone());
            }
            if stored {
                part.queue.push_back((ticket, id.clone()));
                part.recent.insert(id, (ticket, r));
            } else if let Some(r) = r {
                part.recent.insert(id, (ticket, Some(r)));
            } else {
                part.recent.remove(&id);
            }
        }
        drop(watched);
        drop(all);
        // Once the records are in: a woken request reads them.
        for n in wake {
            n.notify_waiters();
        }
    }

    /// Watches `key`, an instance's id (its record) or a schedule request's token (its answer),
    /// for a waiting request: the [`Watch`] it gets is woken when a committed transaction changes
    /// it. Arm it ([`Watch::armed`]) before looking, so that no change is missed between the look
    /// and the wait.
    pub(crate) fn watch(&self, key: &str) -> Watch<'_> {
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        let (n, notify) = watched
            .entry(key.into())
            .or_insert_with(|| (0, Arc::new(tokio::sync::Notify::new())));
        *n += 1;
        Watch {
            view: self,
            key: key.into(),
            notify: notify.clone(),
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
        self.schedules.write().unwrap_or_else(|e| e.into_inner()).remove(&p);
        self.batches.write().unwrap_or_else(|e| e.into_inner()).remove(&p);
    }

    /// The shares of batches of partition `p` as its restore read them, or as a committed
    /// transaction changed them (`fresh`: the restore's, which replace what was held).
    pub(crate) fn apply_batches(&self, p: i32, shares: Vec<(String, sm4c_host::batch::Share)>, fresh: bool) {
        let mut all = self.batches.write().unwrap_or_else(|e| e.into_inner());
        let part = all.entry(p).or_default();
        if fresh {
            part.clear();
        }
        part.extend(shares);
    }

    /// The shares of every batch of the partitions held here, by batch id.
    pub(crate) fn batch_shares(&self) -> BTreeMap<String, Vec<sm4c_host::batch::Share>> {
        let held = self.held();
        let all = self.batches.read().unwrap_or_else(|e| e.into_inner());
        let mut out: BTreeMap<String, Vec<sm4c_host::batch::Share>> = BTreeMap::new();
        for (_, part) in all.iter().filter(|(p, _)| held.contains(p)) {
            for (id, s) in part {
                out.entry(id.clone()).or_default().push(s.clone());
            }
        }
        out
    }

    /// The schedules of partition `p` as its restore read them.
    pub(crate) fn take_schedules(&self, p: i32, all: Schedules) {
        self.schedules.write().unwrap_or_else(|e| e.into_inner()).insert(p, all);
    }

    /// A committed transaction of partition `p`: each schedule it changed (`None`: deleted), and
    /// the answers to the API requests it decided.
    pub(crate) fn apply_schedules(
        &self,
        p: i32,
        changes: Vec<(String, Option<(Spec, State)>)>,
        answers: Vec<(String, ScheduleAnswer)>,
    ) {
        if !changes.is_empty() {
            let mut all = self.schedules.write().unwrap_or_else(|e| e.into_inner());
            if let Some(part) = all.get_mut(&p) {
                for (id, s) in changes {
                    match s {
                        Some(s) => drop(part.insert(id, s)),
                        None => drop(part.remove(&id)),
                    }
                }
            }
        }
        if !answers.is_empty() {
            let mut kept = self.answers.lock().unwrap_or_else(|e| e.into_inner());
            kept.retain(|_, (at, _)| at.elapsed() < ANSWER_KEPT);
            let now = Instant::now();
            let wake: Vec<_> = {
                let watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
                answers
                    .iter()
                    .filter_map(|(r, _)| watched.get(r.as_str()).map(|(_, n)| n.clone()))
                    .collect()
            };
            kept.extend(answers.into_iter().map(|(r, a)| (r, (now, a))));
            drop(kept);
            for n in wake {
                n.notify_waiters();
            }
        }
    }

    /// Schedule `id` of partition `p`, if the partition is held here and has it.
    pub(crate) fn schedule(&self, p: i32, id: &str) -> Option<(Spec, State)> {
        let all = self.schedules.read().unwrap_or_else(|e| e.into_inner());
        all.get(&p)?.get(id).cloned()
    }

    /// Every schedule of the partitions held here, in id order.
    pub(crate) fn all_schedules(&self) -> Vec<(String, Spec, State)> {
        let all = self.schedules.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, Spec, State)> = all
            .values()
            .flat_map(|part| {
                part.iter()
                    .map(|(id, (spec, st))| (id.clone(), spec.clone(), st.clone()))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The answer to the schedule operation of request `request`, once its owner decided it.
    pub(crate) fn take_answer(&self, request: &str) -> Option<ScheduleAnswer> {
        let mut kept = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        kept.remove(request).map(|(_, a)| a)
    }

    /// The open worker tasks of the instances held here, by task list.
    pub fn open_tasks(&self) -> HashMap<Arc<str>, usize> {
        let mut open: HashMap<Arc<str>, usize> = HashMap::new();
        let mut count = |l: &str| match open.get_mut(l) {
            Some(n) => *n += 1,
            None => {
                open.insert(Arc::from(l), 1);
            }
        };
        let lists = |_, _: &str, r: &InstanceRecord| Some(task_lists(r).map(str::to_string).collect::<Vec<_>>());
        for (_, t) in self.take_parts(lists) {
            for l in t.recent.values().flatten().flatten() {
                count(l);
            }
            let Some(store) = t.store else { continue };
            let scanned = store.scan(TASKS_PREFIX, &mut |k, v| {
                let id = &k[TASKS_PREFIX.len()..];
                if t.recent.contains_key(id) {
                    return;
                }
                if let Ok(lists) = serde_json::from_slice::<Vec<&str>>(v) {
                    lists.into_iter().for_each(&mut count);
                }
            });
            if let Err(e) = scanned {
                unread("the open tasks", e);
            }
        }
        open
    }

    /// The snapshots an event is explained against: instance `target`'s, ended or not, when the
    /// event names one; else those of the unended instances held here.
    pub fn to_explain(&self, target: Option<&str>) -> Vec<Snapshot> {
        if let Some(t) = target {
            let found: Vec<Found> = self
                .read()
                .iter()
                .filter(|(p, part)| part.usable(**p))
                .filter_map(|(_, part)| part.find(t))
                .collect();
            return found
                .into_iter()
                .filter_map(|f| f.read(t))
                .map(|r| r.snapshot)
                .collect();
        }
        let mut snaps = Vec::new();
        let unended = |_, _: &str, r: &InstanceRecord| (!r.snapshot.status.is_final()).then(|| r.snapshot.clone());
        for (_, mut t) in self.take_parts(unended) {
            // Taken out, their ids left to hide the store's rows of the same instances.
            snaps.extend(t.recent.values_mut().filter_map(Option::take));
            let Some(store) = t.store else { continue };
            let mut unended = Vec::new();
            let scanned = store.scan(ROW_PREFIX, &mut |k, v| {
                let Some((_, id)) = parse_row_key(k) else { return };
                if t.recent.contains_key(id) {
                    return;
                }
                let ended = serde_json::from_slice::<Summary>(v)
                    .ok()
                    .and_then(|s| serde_json::from_value::<Status>(s.status.into()).ok())
                    .is_some_and(|s| s.is_final());
                if !ended {
                    unended.push(id.to_string());
                }
            });
            if let Err(e) = scanned {
                unread("an explanation", e);
            }
            snaps.extend(
                unended
                    .iter()
                    .filter_map(|id| decode(store.as_ref(), id))
                    .map(|r| r.snapshot),
            );
        }
        snaps
    }

    /// The instances held here in start order ([`seq`]), after cursor `after`.
    pub fn list(&self, status: Option<&str>, definition: Option<&str>, after: i64, limit: usize) -> Vec<Summary> {
        self.list_in(None, status, definition, after, limit)
    }

    /// [`View::list`] of partition `only`, or of every partition held here.
    pub(crate) fn list_in(
        &self,
        only: Option<i32>,
        status: Option<&str>,
        definition: Option<&str>,
        after: i64,
        limit: usize,
    ) -> Vec<Summary> {
        let wanted = |s: &Summary| {
            s.seq > after && status.is_none_or(|x| s.status == x) && definition.is_none_or(|d| s.definition == d)
        };
        let mut page: Vec<Summary> = Vec::new();
        // A partition whose store broke is left out, as one being restored is.
        // Only the partition asked for is taken: a batch's tick reads its own partition.
        let parts = self.take_parts_of(only, |p, id, r| Some(summary(id, r, seq(r, p))).filter(|s| wanted(s)));
        for (_, mut t) in parts {
            // Taken out, their ids left to hide the store's rows of the same instances.
            page.extend(t.recent.values_mut().filter_map(Option::take));
            let Some(store) = t.store else { continue };
            // The partition's first `limit` rows after the cursor that the filters take; the rows
            // are in start order in the store.
            let from = row_key(after.saturating_add(1), "");
            let mut taken = 0;
            let scanned = store.scan_from(ROW_PREFIX, &from, &mut |k, v| {
                let Some((seq, id)) = parse_row_key(k) else { return true };
                if t.recent.contains_key(id) {
                    return true;
                }
                if let Ok(mut s) = serde_json::from_slice::<Summary>(v) {
                    s.seq = seq;
                    if wanted(&s) {
                        page.push(s);
                        taken += 1;
                    }
                }
                taken < limit
            });
            if let Err(e) = scanned {
                unread("a listing", e);
            }
        }
        // The first `limit` only: a page costs a sort of what the partitions gave.
        page.sort_unstable_by(|a, b| (a.seq, &a.id).cmp(&(b.seq, &b.id)));
        page.truncate(limit);
        page
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
                if let Some(definition) = key
                    .as_deref()
                    .and_then(|k| k.strip_prefix(super::wire::DEFAULT_VERSION_PREFIX))
                {
                    let version = match payload.is_empty() {
                        true => Ok(None),
                        false => serde_json::from_slice::<serde_json::Value>(payload)
                            .map(|v| v.get("version").and_then(serde_json::Value::as_str).map(str::to_string)),
                    };
                    match version {
                        Ok(v) => shared
                            .registry
                            .write()
                            .unwrap_or_else(|p| p.into_inner())
                            .set_default(definition, v),
                        Err(e) => {
                            tracing::warn!(definition, error = %e, "a default version on the definitions topic does not read")
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
pub(crate) mod tests {
    use super::*;
    use crate::worker::keeper::Keeper;
    use sm4c_host::local::{LocalError, LocalStores, MemoryStores};
    use sm4c_runtime::engine::Options;
    use sm4c_runtime::Instance;

    /// An instance of a one-state definition `definition`, with `status`, started at `at`.
    pub(crate) fn record(id: &str, definition: &str, status: Status, at: i64) -> InstanceRecord {
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
            schedule: None,
        }
    }

    /// Writes a committed transaction's state records and the changes of the local index they
    /// make, the way the owner does: `(id, record or None when deleted, its place before)`.
    fn write(
        keeper: &Keeper,
        store: &Arc<dyn LocalStore>,
        records: &[(&str, Option<&InstanceRecord>, Option<i64>)],
    ) -> u64 {
        let mut changes = Vec::new();
        for (id, r, before) in records {
            let state = r.map(|r| StateRecord {
                through: 0,
                instance: Some(r.clone()),
                ..StateRecord::default()
            });
            changes.push((id.to_string(), state.map(|s| serde_json::to_vec(&s).unwrap())));
            changes.extend(index_changes(0, id, *r, *before));
        }
        keeper.keep(0, store.clone(), changes, None)
    }

    fn keep(keeper: &Keeper, store: &Arc<dyn LocalStore>, records: &[&InstanceRecord]) -> u64 {
        let all: Vec<_> = records
            .iter()
            .map(|r| (r.snapshot.id.as_str(), Some(*r), None))
            .collect();
        write(keeper, store, &all)
    }

    /// A worker task of list `list`, open.
    fn task(op: &str, list: &str) -> (String, sm4c_runtime::Effect) {
        let effect = sm4c_runtime::Effect::InvokeFunction {
            op: op.into(),
            function: "f".into(),
            operation: list.into(),
            function_type: "worker".into(),
            arguments: serde_json::Value::Null,
            wait: true,
            delivery: Default::default(),
        };
        (op.into(), effect)
    }

    #[test]
    fn with_a_store_records_and_listings_are_read_from_it_and_memory_keeps_only_the_unwritten_transactions() {
        let keeper = Keeper::start().unwrap();
        let stores = MemoryStores::default();
        let store = stores.open("state-0").unwrap();
        let (a, b, mut c) = (
            record("a", "order", Status::Waiting, 3),
            record("b", "order", Status::Completed, 1),
            record("c", "refund", Status::Waiting, 2),
        );
        c.calls = vec![task("op-1", "refunds"), task("op-2", "refunds")];
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
        assert_eq!(
            (view.len(), view.in_memory()),
            (3, 0),
            "nothing of an instance in memory"
        );
        assert_eq!(view.get(0, "a").unwrap().snapshot.id, "a");
        assert!(view.get(0, "x").is_none());
        assert!(view.get(1, "a").is_none(), "partition 1 is not held");
        // Listings page in start order, filtered, from the local index.
        let ids = |rows: Vec<Summary>| rows.into_iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(view.list(None, None, 0, 10)), ["b", "c", "a"]);
        assert_eq!(ids(view.list(None, None, 0, 2)), ["b", "c"]);
        let after = view.list(None, None, 0, 2)[1].seq;
        assert_eq!(after, seq(&c, 0));
        assert_eq!(ids(view.list(None, None, after, 2)), ["a"]);
        assert_eq!(ids(view.list(Some("waiting"), None, 0, 10)), ["c", "a"]);
        assert_eq!(ids(view.list(Some("waiting"), None, 0, 1)), ["c"]);
        assert_eq!(ids(view.list(None, Some("refund"), 0, 10)), ["c"]);
        assert_eq!(view.list(None, None, 0, 10)[0], summary("b", &b, seq(&b, 0)));
        assert_eq!(view.open_tasks().get("refunds"), Some(&2));
        let unended: Vec<String> = view.to_explain(None).into_iter().map(|s| s.id).collect();
        assert_eq!(unended, ["c", "a"]);
        assert_eq!(
            view.to_explain(Some("b")).len(),
            1,
            "a named instance is explained ended or not"
        );

        // A transaction: its records are answered from memory until the store has them, its
        // deletion too.
        let mut a2 = a.clone();
        a2.snapshot.status = Status::Completed;
        a2.journal_len = 2;
        let mut c2 = c.clone();
        c2.calls.pop();
        let ticket = write(
            &keeper,
            &store,
            &[
                ("a", Some(&a2), None),
                ("b", None, Some(seq(&b, 0))),
                ("c", Some(&c2), None),
            ],
        );
        let applied = vec![
            ("a".into(), Some(a2.clone())),
            ("b".into(), None),
            ("c".into(), Some(c2)),
        ];
        view.apply(0, applied, ticket);
        for _ in 0..2 {
            assert_eq!(view.get(0, "a").unwrap().journal_len, 2);
            assert!(view.get(0, "b").is_none(), "deleted");
            assert_eq!(view.len(), 2);
            assert_eq!(ids(view.list(None, None, 0, 10)), ["c", "a"]);
            assert_eq!(ids(view.list(Some("completed"), None, 0, 10)), ["a"]);
            assert_eq!(view.open_tasks().get("refunds"), Some(&1));
            let unended: Vec<String> = view.to_explain(None).into_iter().map(|s| s.id).collect();
            assert_eq!(unended, ["c"]);
            // Again once the store has it all, and memory has nothing.
            keeper.sync(0);
            view.prune();
        }
        assert_eq!(view.in_memory(), 0);
        // The next transaction: only its records are in memory.
        let d = record("d", "order", Status::Waiting, 4);
        let ticket = keep(&keeper, &store, &[&d]);
        view.apply(0, vec![("d".into(), Some(d.clone()))], ticket);
        assert!(view.in_memory() <= 1, "only d, whose write may still be queued");
        assert_eq!(view.get(0, "a").unwrap().journal_len, 2, "read from the store");
        assert_eq!(view.get(0, "d").unwrap().snapshot.id, "d");
        assert_eq!(ids(view.list(None, None, 0, 10)), ["c", "a", "d"]);
        view.release(0);
        assert!(!view.holds(0));
    }

    #[test]
    fn an_instance_deleted_and_started_again_moves_its_row() {
        let mut a = record("a", "order", Status::Completed, 3);
        let before = seq(&a, 0);
        a.order = (9, 0);
        let changes = index_changes(0, "a", Some(&a), Some(before));
        assert_eq!(changes[0], (row_key(before, "a"), None), "the old row goes");
        assert_eq!(changes[1].0, row_key(seq(&a, 0), "a"));
        assert_eq!(parse_row_key(&changes[1].0), Some((seq(&a, 0), "a")));
        let gone = index_changes(0, "a", None, Some(seq(&a, 0)));
        assert!(gone.iter().all(|(k, v)| is_index_key(k) && v.is_none()), "{gone:?}");
        assert_eq!(gone.len(), 2, "its row and its tasks");
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

    /// Whether a waiting request's armed watch has been woken, without waiting for it.
    fn woken(armed: &mut std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>>) -> bool {
        use std::future::Future;
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        armed.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn a_request_waiting_for_an_instance_is_woken_by_the_commit_that_changes_it_and_by_no_other() {
        let view = View::default();
        view.take(0, Records::new(), None);
        {
            let (watch, also) = (view.watch("a"), view.watch("a"));
            let (mut armed, mut armed_too) = (watch.armed(), also.armed());
            // Another instance's transaction, and another partition's: not what it waits for.
            view.apply(0, vec![("b".into(), Some(record("b", "order", Status::Waiting, 1)))], 0);
            view.apply(1, vec![("a".into(), Some(record("a", "order", Status::Waiting, 1)))], 0);
            assert!(
                !woken(&mut armed),
                "woken by a transaction that did not change its instance"
            );
            // Its instance's: both requests waiting for it are woken, with the record in the view.
            view.apply(0, vec![("a".into(), Some(record("a", "order", Status::Waiting, 2)))], 0);
            assert!(woken(&mut armed) && woken(&mut armed_too));
            assert!(view.get(0, "a").is_some());
        }
        {
            // A schedule request's answer wakes the request waiting for it.
            let answer = view.watch("schedule-1");
            let mut armed = answer.armed();
            view.apply_schedules(0, Vec::new(), vec![("schedule-2".into(), Ok(serde_json::json!({})))]);
            assert!(!woken(&mut armed));
            view.apply_schedules(0, Vec::new(), vec![("schedule-1".into(), Ok(serde_json::json!({})))]);
            assert!(woken(&mut armed));
        }
        // Dropped, the watches leave nothing behind.
        assert!(view.watched.lock().unwrap().is_empty());
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
