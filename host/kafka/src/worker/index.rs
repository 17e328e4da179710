//! What a partition's owner indexes: its waiting instances by what the events they may take must
//! carry, and its parked events, each its own record on the state topic.

use super::{Out, Shared};
use crate::wire::{
    corr_key, subscription_key, Parked, StateRecord, Subscription, Tally, CLOCK_HEADER, SUBSCRIPTION_PREFIX,
    TALLY_PREFIX,
};
use indexmap::IndexMap;
use serde_json::Value;
use sm4c_host::local::LocalStore;
use sm4c_runtime::engine::event::{attribute_text, correlation_key, kind_matches};
use sm4c_runtime::model::EventDef;
use sm4c_runtime::Machine;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// The correlation attribute an event definition is routed by: its first correlation rule's,
/// when that rule names the value (`contextAttributeValue`). Every instance of such a
/// definition knows the one value an event must carry in it to reach it (or can take none, when
/// the value does not evaluate), so the events are routed by that value and the instances
/// subscribe to it (`IndexEntries::routed`). `None` when the correlation leaves the value open.
fn routing_attribute(def: &EventDef) -> Option<String> {
    let rule = def.correlation.first()?;
    rule.value.as_ref()?;
    Some(rule.name.to_ascii_lowercase())
}

/// The correlation key (attribute, value; its partition is that of [`corr_key`]) an event without
/// `sm4cinstanceid` is routed by: `Some` when every definition of `machines` with an event definition of the event's type and
/// source routes that definition by the same attribute, and the event carries it. Otherwise
/// (an open correlation somewhere, definitions that disagree, a missing attribute) `None`: the
/// event goes to every partition.
pub(super) fn keyed_route(machines: &[Arc<Machine>], event: &serde_json::Value) -> Option<(String, String)> {
    let mut attribute: Option<String> = None;
    for d in machines
        .iter()
        .flat_map(|m| m.events.iter())
        .filter(|d| kind_matches(d, event))
    {
        let a = routing_attribute(d)?;
        match &attribute {
            Some(x) if *x != a => return None,
            Some(_) => {}
            None => attribute = Some(a),
        }
    }
    let a = attribute?;
    let v = attribute_text(event, &a)?;
    Some((a, v))
}

/// Keys of the local index that decisions read: those in the partition's local store, with the
/// changes the store does not have yet kept in memory until it has them. Without a store, memory
/// keeps them all. A store that cannot be read is noted ([`Kept::failed`]): the batch that read
/// it must not commit.
#[derive(Default)]
pub(super) struct Kept {
    store: Option<Arc<dyn LocalStore>>,
    /// Changes not in the store yet: key → (the keeper's ticket of their write, value or `None`
    /// for a deletion). [`NOT_HANDED`]: not given to the keeper yet; [`NO_STORE`]: kept for good.
    pub(super) mem: BTreeMap<String, (u64, Option<Vec<u8>>)>,
    /// The keys changed since the last [`Kept::take`].
    next: BTreeSet<String>,
    /// The keys of the last [`Kept::take`], until [`Kept::handed`] gives them their ticket.
    taken: Vec<String>,
    /// The keys handed to the keeper, with their tickets, in the order handed.
    handed: std::collections::VecDeque<(u64, String)>,
    /// Why reading the store failed.
    pub(super) failed: Option<String>,
}

const NOT_HANDED: u64 = u64::MAX;
const NO_STORE: u64 = u64::MAX - 1;

impl Kept {
    pub(super) fn put(&mut self, key: String, value: Option<Vec<u8>>) {
        let ticket = if self.store.is_some() { NOT_HANDED } else { NO_STORE };
        if self.store.is_none() && value.is_none() {
            self.mem.remove(&key);
            return;
        }
        self.mem.insert(key.clone(), (ticket, value));
        if self.store.is_some() {
            self.next.insert(key);
        }
    }

    pub(super) fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        if let Some((_, v)) = self.mem.get(key) {
            return v.clone();
        }
        let store = self.store.as_ref()?;
        match store.get(key) {
            Ok(v) => v,
            Err(e) => {
                self.failed = Some(format!(
                    "the correlation index cannot be read from the local store: {e}"
                ));
                None
            }
        }
    }

    /// The keys under `prefix` (what follows it in each), the store's and memory's.
    fn keys(&mut self, prefix: &str) -> BTreeSet<String> {
        let mut keys = BTreeSet::new();
        if let Some(store) = &self.store {
            let mem = &self.mem;
            let scanned = store.scan(prefix, &mut |k, _| {
                if !mem.contains_key(k) {
                    keys.insert(k[prefix.len()..].to_string());
                }
            });
            if let Err(e) = scanned {
                self.failed = Some(format!(
                    "the correlation index cannot be read from the local store: {e}"
                ));
            }
        }
        let start = prefix.to_string();
        for (k, (_, v)) in self.mem.range(start..) {
            if !k.starts_with(prefix) {
                break;
            }
            if v.is_some() {
                keys.insert(k[prefix.len()..].to_string());
            }
        }
        keys
    }

    /// The first `limit` keys under `prefix`, the store's and memory's, in key order, with their
    /// values.
    pub(super) fn first(&mut self, prefix: &str, limit: usize) -> Vec<(String, Vec<u8>)> {
        let mut found: Vec<(String, Vec<u8>)> = Vec::new();
        if let Some(store) = &self.store {
            let mem = &self.mem;
            let mut n = 0;
            let scanned = store.scan_from(prefix, prefix, &mut |k, v| {
                if !mem.contains_key(k) {
                    found.push((k.to_string(), v.to_vec()));
                    n += 1;
                }
                n < limit
            });
            if let Err(e) = scanned {
                self.failed = Some(format!("the local index cannot be read from the local store: {e}"));
            }
        }
        for (k, (_, v)) in self.mem.range(prefix.to_string()..) {
            if !k.starts_with(prefix) {
                break;
            }
            if let Some(v) = v {
                found.push((k.clone(), v.clone()));
            }
        }
        found.sort();
        found.truncate(limit);
        found
    }

    /// The changes since the last call, for the next transaction's write to the store.
    pub(super) fn take(&mut self) -> Vec<(String, Option<Vec<u8>>)> {
        self.skip();
        self.taken
            .iter()
            .filter_map(|k| Some((k.clone(), self.mem.get(k)?.1.clone())))
            .collect()
    }

    /// As [`Kept::take`], for changes the transaction writes by other means (records of the
    /// state partition among its outputs).
    pub(super) fn skip(&mut self) {
        self.taken = std::mem::take(&mut self.next).into_iter().collect();
    }

    /// The changes last taken went to the keeper with `ticket`.
    pub(super) fn handed(&mut self, ticket: u64) {
        for k in std::mem::take(&mut self.taken) {
            if let Some((t, _)) = self.mem.get_mut(&k).filter(|(t, _)| *t == NOT_HANDED) {
                *t = ticket;
                self.handed.push_back((ticket, k));
            }
        }
    }

    /// Lets go of the changes the store has now (the keeper's tickets up to `written`).
    pub(super) fn prune(&mut self, written: u64) {
        while self.handed.front().is_some_and(|(t, _)| *t <= written) {
            let Some((t, k)) = self.handed.pop_front() else { break };
            if self.mem.get(&k).is_some_and(|(u, _)| *u == t) {
                self.mem.remove(&k);
            }
        }
        if self.handed.capacity() > 2 * self.handed.len() + 1024 {
            self.handed.shrink_to(2 * self.handed.len());
        }
    }

    /// From now on in `store`: the keys under `prefixes` there are replaced by those memory holds
    /// (a restore's, made from the instances themselves), at once. Memory keeps nothing after.
    pub(super) fn place(&mut self, store: Arc<dyn LocalStore>, prefixes: &[&str]) -> Result<(), String> {
        let entries = self.mem.iter().map(|(k, (_, v))| (k.as_str(), v.as_deref()));
        replace_under(store.as_ref(), prefixes, entries)?;
        self.attach(store);
        Ok(())
    }

    /// Whether the keys are in a store ([`Kept::place`], [`Kept::attach`]).
    pub(super) fn placed(&self) -> bool {
        self.store.is_some()
    }

    /// From now on in `store`, which holds already what memory holds (records of the state
    /// partition that a restore wrote there): memory keeps nothing after.
    pub(super) fn attach(&mut self, store: Arc<dyn LocalStore>) {
        self.mem.clear();
        self.next.clear();
        self.taken.clear();
        self.handed.clear();
        self.store = Some(store);
    }
}

/// Replaces, at once, the keys of `store` under `prefixes` by `entries` (a restore's index, made
/// from the instances themselves).
pub(super) fn replace_under<'a>(
    store: &dyn LocalStore,
    prefixes: &[&str],
    entries: impl Iterator<Item = (&'a str, Option<&'a [u8]>)>,
) -> Result<(), String> {
    let mut old = Vec::new();
    for prefix in prefixes {
        store
            .scan(prefix, &mut |k, _| old.push(k.to_string()))
            .map_err(|e| e.to_string())?;
    }
    let mut changes: Vec<(&str, Option<&[u8]>)> = old.iter().map(|k| (k.as_str(), None)).collect();
    for (k, v) in entries {
        changes.push((k, v));
    }
    store.apply(&changes, None).map_err(|e| e.to_string())
}

/// The correlation index's keys in the local index ([`crate::view::INDEX_PREFIX`]).
pub(super) const CORR_PREFIX: &str = "\u{0}local/corr/";
/// `<prefix><attribute><NUL><value><NUL><instance>`: instances by correlation key.
const BY_KEY: &str = "\u{0}local/corr/key/";
/// `<prefix>=<type><NUL><instance>` (`*` for any type): instances whose correlation is open.
const BY_TYPE: &str = "\u{0}local/corr/type/";
/// `<prefix><instance>`: an instance's [`IndexEntries`] (JSON).
const ENTRIES: &str = "\u{0}local/corr/of/";

fn type_key(t: &Option<String>) -> String {
    match t {
        Some(t) => format!("{BY_TYPE}={t}\u{0}"),
        None => format!("{BY_TYPE}*\u{0}"),
    }
}

fn attr_key((attr, value): &(String, String)) -> String {
    format!("{BY_KEY}{attr}\u{0}{value}\u{0}")
}

/// The unended instances of a partition indexed by what an event must carry to reach them, so
/// that an event without `sm4cinstanceid` is matched (with jq) against those only, not against
/// every instance of the partition: by the correlation key of each of their event definitions
/// ([`correlation_key`]), and, for definitions whose correlation leaves it open, by event type.
/// With a local store the index lives there ([`Kept`]): memory holds only the attribute names.
#[derive(Default)]
pub(super) struct CorrIndex {
    pub(super) kept: Kept,
    /// The attribute names of the correlation keys indexed since the partition was restored (an
    /// event is looked up by each it carries).
    pub(super) attrs: BTreeSet<String>,
    /// How many instances each open event type has (`None`: any type): an event is looked up in
    /// the store by type only when some instance is there, which most definitions never need. One
    /// count per type, not per instance.
    open_types: HashMap<Option<String>, usize>,
    /// The keys each instance changed by the batch being decided subscribed to before it (see
    /// [`CorrIndex::routed_before`]).
    before: HashMap<String, Box<[String]>>,
}

/// An instance's entries in a [`CorrIndex`], each correlation value evaluated once per step.
#[derive(Default, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct IndexEntries {
    /// The correlation key of each event definition that has one.
    pub(super) keys: Box<[(String, String)]>,
    /// The types of the definitions whose correlation is open.
    pub(super) open: Box<[Option<String>]>,
    /// The keys it subscribes to at their partitions ([`corr_key`]): for each of its event
    /// definitions routed by key, the value its data gives the routing attribute.
    pub(super) routed: Box<[String]>,
}

impl IndexEntries {
    /// The entries of an instance as it is now (none for an ended one).
    ///
    /// Boxed slices, not vectors: a vector grown by one push keeps room for four.
    fn of(inst: &sm4c_runtime::Instance) -> IndexEntries {
        let (mut keys, mut open, mut routed) = (Vec::new(), Vec::new(), Vec::new());
        if inst.status().is_final() {
            return IndexEntries::default();
        }
        let snap = inst.snapshot();
        for d in &inst.machine().events {
            match correlation_key(d, &snap.data.0, &snap.bindings) {
                Some(k) => {
                    if routing_attribute(d).is_some_and(|a| a == k.0) {
                        routed.push(corr_key(&k.0, &k.1));
                    }
                    keys.push(k);
                }
                None => open.push(match (&d.event_type, &d.source) {
                    (Some(t), _) => Some(t.clone()),
                    (None, None) => Some(d.name.clone()),
                    (None, Some(_)) => None,
                }),
            }
        }
        routed.sort();
        routed.dedup();
        keys.sort();
        keys.dedup();
        open.sort();
        open.dedup();
        IndexEntries {
            keys: keys.into_boxed_slice(),
            open: open.into_boxed_slice(),
            routed: routed.into_boxed_slice(),
        }
    }

    fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.open.is_empty()
    }
}

impl CorrIndex {
    /// Instance `id`'s entries as last indexed (none when it is not).
    pub(super) fn entries(&mut self, id: &str) -> IndexEntries {
        self.kept
            .get(&format!("{ENTRIES}{id}"))
            .and_then(|v| serde_json::from_slice(&v).ok())
            .unwrap_or_default()
    }

    /// Indexes an instance as it is now (an ended one leaves the index).
    pub(super) fn update(&mut self, id: &str, inst: &sm4c_runtime::Instance) {
        let new = IndexEntries::of(inst);
        let old = self.entries(id);
        if !self.before.contains_key(id) {
            self.before.insert(id.to_string(), old.routed.clone());
        }
        if new == old {
            return;
        }
        self.set(id, &old, &new);
    }

    fn set(&mut self, id: &str, old: &IndexEntries, new: &IndexEntries) {
        for k in old.keys.iter().filter(|k| !new.keys.contains(k)) {
            self.kept.put(format!("{}{id}", attr_key(k)), None);
        }
        for t in old.open.iter().filter(|t| !new.open.contains(t)) {
            self.kept.put(format!("{}{id}", type_key(t)), None);
            if let Some(n) = self.open_types.get_mut(t) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.open_types.remove(t);
                }
            }
        }
        for k in new.keys.iter().filter(|k| !old.keys.contains(k)) {
            self.attrs.insert(k.0.clone());
            self.kept.put(format!("{}{id}", attr_key(k)), Some(Vec::new()));
        }
        for t in new.open.iter().filter(|t| !old.open.contains(t)) {
            self.kept.put(format!("{}{id}", type_key(t)), Some(Vec::new()));
            *self.open_types.entry(t.clone()).or_default() += 1;
        }
        let entries = (!new.is_empty() || !new.routed.is_empty()).then(|| serde_json::to_vec(new).unwrap_or_default());
        self.kept.put(format!("{ENTRIES}{id}"), entries);
    }

    /// The correlation keys instance `id` subscribes to, as it was last indexed.
    pub(super) fn routed(&mut self, id: &str) -> Box<[String]> {
        self.entries(id).routed
    }

    /// The correlation keys instance `id` subscribed to before the batch being decided changed it
    /// (its keys now when the batch did not index it again); forgets them.
    pub(super) fn routed_before(&mut self, id: &str) -> Box<[String]> {
        match self.before.remove(id) {
            Some(keys) => keys,
            None => self.routed(id),
        }
    }

    /// The batch was decided: what it noted for [`CorrIndex::routed_before`] goes.
    pub(super) fn decided(&mut self) {
        self.before.clear();
        if self.before.capacity() > 1024 {
            self.before.shrink_to(0);
        }
    }

    pub(super) fn remove(&mut self, id: &str) {
        let old = self.entries(id);
        if old != IndexEntries::default() {
            self.set(id, &old, &IndexEntries::default());
        }
    }

    /// The instances an event may reach, in id order: every other one has, for each of its
    /// event definitions, a correlation key the event does not carry.
    pub(super) fn candidates(&mut self, event: &Value) -> BTreeSet<String> {
        let mut ids = BTreeSet::new();
        let attrs: Vec<String> = self.attrs.iter().cloned().collect();
        for attr in attrs {
            if let Some(v) = attribute_text(event, &attr) {
                ids.extend(self.kept.keys(&attr_key(&(attr, v))));
            }
        }
        let ty = attribute_text(event, "type");
        for t in [ty, None] {
            if self.open_types.contains_key(&t) {
                ids.extend(self.kept.keys(&type_key(&t)));
            }
        }
        ids
    }
}

/// A partition's parked events and broadcast tally. Each is its own record on the state topic
/// (keyed [`crate::wire::parked_key`], [`crate::wire::tally_key`]), written when it changes and deleted by a tombstone, so
/// no record grows with their number.
#[derive(Default)]
pub(super) struct Parking {
    /// Parked events by key, oldest first.
    pub(super) parked: IndexMap<String, Parked>,
    /// Broadcast event key ([`crate::wire::Origin::key`]) → its tally.
    pub(super) tally: BTreeMap<String, Tally>,
    /// State topic keys to write (or delete) in the next transaction.
    pub(super) changed: BTreeSet<String>,
    /// Parked events for a named instance, by instance.
    pub(super) by_target: HashMap<String, BTreeSet<String>>,
    /// Broadcast parked events by each of their context attributes (lower case) and its value:
    /// the correlation keys of a [`CorrIndex`] look them up.
    pub(super) by_attr: HashMap<(String, String), BTreeSet<String>>,
    /// Broadcast parked events by type.
    pub(super) by_type: HashMap<String, BTreeSet<String>>,
    /// Events routed by key parked here, the key's partition, by correlation key: a subscription
    /// takes them.
    pub(super) by_key: HashMap<String, BTreeSet<String>>,
    /// The subscriptions to the correlation keys this partition owns: their state records'
    /// keys ([`subscription_key`]), in the local store when there is one (which has the state
    /// records), the changes it does not have yet in memory.
    pub(super) subs: Kept,
}

/// The attributes of an event that never carry a correlation value.
const UNINDEXED: &[&str] = &[
    "specversion",
    "id",
    "time",
    "datacontenttype",
    "dataschema",
    "data",
    "data_base64",
];

impl Parking {
    /// Parks an event under its key.
    pub(super) fn insert(&mut self, key: String, p: Parked) {
        self.index(&key, &p, true);
        self.parked.insert(key, p);
    }

    /// Removes parked events (their records are deleted in the next transaction).
    pub(super) fn remove_all(&mut self, keys: &[String]) {
        for k in keys {
            if let Some(p) = self.parked.get(k).cloned() {
                self.index(k, &p, false);
            }
            self.changed.insert(k.clone());
        }
        let gone: HashSet<&String> = keys.iter().collect();
        self.parked.retain(|k, _| !gone.contains(k));
    }

    /// Adds a parked event to the indexes, or takes it out.
    pub(super) fn index(&mut self, key: &str, p: &Parked, add: bool) {
        fn put(set: &mut BTreeSet<String>, key: &str, add: bool) {
            if add {
                set.insert(key.to_string());
            } else {
                set.remove(key);
            }
        }
        if let Some(k) = &p.key {
            put(self.by_key.entry(k.clone()).or_default(), key, add);
            if self.by_key.get(k).is_some_and(BTreeSet::is_empty) {
                self.by_key.remove(k);
            }
        }
        if let Some(t) = &p.target {
            put(self.by_target.entry(t.clone()).or_default(), key, add);
            if self.by_target.get(t).is_some_and(BTreeSet::is_empty) {
                self.by_target.remove(t);
            }
            return;
        }
        let Some(attrs) = p.event.as_object() else { return };
        for (name, value) in attrs {
            let name = name.to_ascii_lowercase();
            if UNINDEXED.contains(&name.as_str()) || value.is_object() || value.is_array() || value.is_null() {
                continue;
            }
            let value = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if name == "type" {
                put(self.by_type.entry(value.clone()).or_default(), key, add);
                if self.by_type.get(&value).is_some_and(BTreeSet::is_empty) {
                    self.by_type.remove(&value);
                }
            }
            let k = (name, value);
            put(self.by_attr.entry(k.clone()).or_default(), key, add);
            if self.by_attr.get(&k).is_some_and(BTreeSet::is_empty) {
                self.by_attr.remove(&k);
            }
        }
    }

    /// The parked events instance `id` may take, by its entries in the correlation index: those
    /// naming it, and the broadcasts that carry one of its correlation keys or have a type its
    /// open definitions declare.
    pub(super) fn candidates(&self, id: &str, entries: &IndexEntries) -> BTreeSet<String> {
        let mut keys: BTreeSet<String> = self.by_target.get(id).cloned().unwrap_or_default();
        let IndexEntries {
            keys: corr_keys, open, ..
        } = entries;
        for k in corr_keys {
            if let Some(set) = self.by_attr.get(k) {
                keys.extend(set.iter().cloned());
            }
        }
        for t in open {
            match t {
                Some(t) => keys.extend(self.by_type.get(t).into_iter().flatten().cloned()),
                None => keys.extend(self.by_type.values().flatten().cloned()),
            }
        }
        keys
    }
    /// The latest time, at or before `now`, at which a parked event's window or a tally entry's
    /// retention ends: what a tick proposed at `now` is proposed for (`None`: nothing is due).
    pub(super) fn due_by(&self, now: i64, window: i64) -> Option<i64> {
        let parked = self.parked.values().map(|p| p.expires);
        let tally = self
            .tally
            .values()
            .map(|(_, _, first)| super::tally_expiry(*first, window));
        parked.chain(tally).filter(|at| *at <= now).max()
    }

    /// Instance `id` takes the events of correlation key `key` from now on; whether it did not
    /// before.
    pub(super) fn subscribe(&mut self, key: &str, id: &str) -> bool {
        let k = subscription_key(key, id);
        if self.subs.get(&k).is_some() {
            return false;
        }
        self.subs.put(k.clone(), Some(Vec::new()));
        self.changed.insert(k);
        true
    }

    /// Instance `id` no longer takes the events of correlation key `key`.
    pub(super) fn unsubscribe(&mut self, key: &str, id: &str) {
        let k = subscription_key(key, id);
        if self.subs.get(&k).is_some() {
            self.subs.put(k.clone(), None);
            self.changed.insert(k);
        }
    }

    /// The instances subscribed to correlation key `key`, in id order.
    pub(super) fn subscribers(&mut self, key: &str) -> BTreeSet<String> {
        self.subs.keys(&subscription_key(key, ""))
    }

    /// The events routed by key parked here for correlation key `key`, oldest first.
    pub(super) fn parked_for_key(&self, key: &str) -> Vec<String> {
        let Some(set) = self.by_key.get(key) else {
            return Vec::new();
        };
        let mut keys: Vec<String> = set.iter().cloned().collect();
        keys.sort_by_key(|k| self.parked.get_index_of(k));
        keys
    }

    /// Takes in what a state record of the partition's own holds.
    pub(super) fn restore(&mut self, key: &str, r: StateRecord) {
        if let Some(p) = r.parked {
            self.insert(key.to_string(), p);
        } else if let (Some(t), Some(origin)) = (r.tally, key.strip_prefix(TALLY_PREFIX)) {
            self.tally.insert(origin.to_string(), t);
        } else if let Some(s) = r.subscription {
            self.subs.put(subscription_key(&s.key, &s.id), Some(Vec::new()));
        }
    }

    /// The records of the changed keys, for a transaction numbered `clock`.
    pub(super) fn records(&mut self, shared: &Shared, partition: i32, through: i64, clock: i64) -> Vec<Out> {
        let mut outs = Vec::new();
        for key in std::mem::take(&mut self.changed) {
            let mut r = StateRecord {
                through,
                clock: Some(clock),
                ..StateRecord::default()
            };
            if let Some(p) = self.parked.get(&key) {
                r.parked = Some(p.clone());
            } else if let Some(t) = key.strip_prefix(TALLY_PREFIX).and_then(|o| self.tally.get(o)) {
                r.tally = Some(t.clone());
            } else if let Some((k, id)) = key
                .strip_prefix(SUBSCRIPTION_PREFIX)
                .and_then(|s| s.rsplit_once('\u{0}'))
            {
                if self.subs.get(&key).is_some() {
                    r.subscription = Some(Subscription {
                        key: k.to_string(),
                        id: id.to_string(),
                    });
                }
            }
            let payload = (r.parked.is_some() || r.tally.is_some() || r.subscription.is_some())
                .then(|| serde_json::to_vec(&r).unwrap_or_default());
            let headers = match payload {
                Some(_) => Vec::new(),
                None => vec![(CLOCK_HEADER.to_string(), clock.to_string().into_bytes())],
            };
            outs.push(Out {
                topic: shared.topics.state.clone(),
                partition: Some(partition),
                key: Some(key),
                payload,
                headers,
            });
        }
        outs
    }
}

/// The ended instances of a partition in the local index, until their retention has passed:
/// `<prefix>at/<when it ended, 16 hex digits><NUL><instance>` → its place in listings, in the
/// order they expire, and `<prefix>id/<instance>` → when it ended, to look one up.
pub(super) const ENDED_PREFIX: &str = "\u{0}local/ended/";
const ENDED_AT: &str = "\u{0}local/ended/at/";
const ENDED_ID: &str = "\u{0}local/ended/id/";

/// The ended instances of a partition, kept in its local store when it has one ([`Kept`]): a start
/// with the id of one starts nothing, an event naming one is dead-lettered; past the retention
/// their records are deleted.
#[derive(Default)]
pub(super) struct Ended {
    pub(super) kept: Kept,
}

impl Ended {
    /// Instance `id` ended at `at` (ms), with place `place` in listings.
    pub(super) fn insert(&mut self, id: &str, at: i64, place: i64) {
        let at = at.max(0);
        self.kept.put(
            format!("{ENDED_AT}{at:016x}\u{0}{id}"),
            Some(place.to_string().into_bytes()),
        );
        self.kept
            .put(format!("{ENDED_ID}{id}"), Some(at.to_string().into_bytes()));
    }

    /// Instance `id` is no longer ended (a redrive sent it back to running).
    pub(super) fn remove(&mut self, id: &str) {
        let Some(at) = self.kept.get(&format!("{ENDED_ID}{id}")) else {
            return;
        };
        let at: i64 = std::str::from_utf8(&at).ok().and_then(|a| a.parse().ok()).unwrap_or(0);
        self.kept.put(format!("{ENDED_AT}{at:016x}\u{0}{id}"), None);
        self.kept.put(format!("{ENDED_ID}{id}"), None);
    }

    pub(super) fn contains(&mut self, id: &str) -> bool {
        self.kept.get(&format!("{ENDED_ID}{id}")).is_some()
    }

    /// When the latest of the first `limit` instances that ended at or before `cutoff` ended
    /// (`None`: none did), and when the earliest ended (`None`: none is kept); nothing leaves the
    /// index.
    pub(super) fn ended_by(&mut self, cutoff: i64, limit: usize) -> (Option<i64>, Option<i64>) {
        let ats: Vec<i64> = self
            .kept
            .first(ENDED_AT, limit)
            .iter()
            .filter_map(|(k, _)| i64::from_str_radix(k.strip_prefix(ENDED_AT)?.split_once('\u{0}')?.0, 16).ok())
            .collect();
        (
            ats.iter().copied().take_while(|at| *at <= cutoff).last(),
            ats.first().copied(),
        )
    }

    /// The instances that ended at or before `cutoff`, earliest first, at most `limit`: (id,
    /// place in listings); they leave the index. Also when the earliest left ended (`None`: none
    /// is left).
    pub(super) fn take_until(&mut self, cutoff: i64, limit: usize) -> (Vec<(String, i64)>, Option<i64>) {
        let parse = |k: &str| {
            let (at, id) = k.strip_prefix(ENDED_AT)?.split_once('\u{0}')?;
            Some((i64::from_str_radix(at, 16).ok()?, id.to_string()))
        };
        let mut taken = Vec::new();
        for (k, v) in self.kept.first(ENDED_AT, limit) {
            let Some((at, id)) = parse(&k) else { continue };
            if at > cutoff {
                break;
            }
            let place = std::str::from_utf8(&v).ok().and_then(|p| p.parse().ok()).unwrap_or(0);
            self.kept.put(k, None);
            self.kept.put(format!("{ENDED_ID}{id}"), None);
            taken.push((id, place));
        }
        let next = self
            .kept
            .first(ENDED_AT, 1)
            .first()
            .and_then(|(k, _)| parse(k))
            .map(|(at, _)| at);
        (taken, next)
    }
}

/// The timers a partition keeps in its local store ([`crate::KafkaConfig::timer_horizon_ms`]):
/// `<prefix><due as 16 hex digits><NUL><instance><NUL><timer>`, in due order, with no value.
/// Part of the local index ([`crate::view::INDEX_PREFIX`]); written by the owner, and rebuilt
/// from the instances by every restore.
pub(crate) const TIMER_PREFIX: &str = "\u{0}local/timer/";

/// The key of a timer kept in the local store.
pub(super) fn timer_key(due: i64, id: &str, timer: &str) -> String {
    format!("{TIMER_PREFIX}{:016x}\u{0}{id}\u{0}{timer}", due.max(0))
}

/// The first key of the timers due at `due` or later.
pub(super) fn timers_from(due: i64) -> String {
    format!("{TIMER_PREFIX}{:016x}", due.max(0))
}

/// The due time, instance and timer of a timer's key. (Instance ids have no control characters.)
pub(super) fn parse_timer_key(k: &str) -> Option<(i64, String, String)> {
    let (due, rest) = k.strip_prefix(TIMER_PREFIX)?.split_once('\u{0}')?;
    let (id, timer) = rest.split_once('\u{0}')?;
    Some((i64::from_str_radix(due, 16).ok()?, id.to_string(), timer.to_string()))
}

#[cfg(test)]
mod tests {
    use super::{keyed_route, CorrIndex, IndexEntries, Parking};
    use crate::wire::{parked_key, Origin, Parked};
    use serde_json::json;
    use sm4c_runtime::{load, Input, LoadOptions, Timed};
    use std::sync::Arc;

    #[test]
    fn the_correlation_index_finds_exactly_the_instances_an_event_may_reach() {
        let doc = json!({
            "id": "saga", "version": "1.0", "name": "Saga",
            "events": [
                {"name": "requested", "type": "payment.requested", "source": "sm4c/saga"},
                {"name": "done", "type": "payment.done", "source": "payments",
                 "correlation": [{"contextAttributeName": "orderId", "contextAttributeValue": "${ .orderId }"}]},
                {"name": "any", "type": "audit", "correlation": [{"contextAttributeName": "region"}]}
            ],
            "states": [
                {"name": "Wait", "start": true, "transitions": [
                    {"nextState": "Done", "eventGroups": [{"events": ["done"]}]},
                    {"nextState": "Done", "eventGroups": [{"events": ["any"]}]}
                ]},
                {"name": "Done", "final": true}
            ]
        });
        let m = Arc::new(load(&doc, &mut sm4c_runtime::no_files, LoadOptions::default()).expect("valid"));
        for stored in [false, true] {
            correlation_index(&m, stored);
        }
    }

    /// Writes what the index changed to its store, as a transaction's write does.
    fn flush(index: &mut CorrIndex, store: &Option<Arc<dyn sm4c_host::local::LocalStore>>, ticket: u64) {
        let Some(store) = store else { return };
        let changes = index.kept.take();
        let refs: Vec<(&str, Option<&[u8]>)> = changes.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
        store.apply(&refs, None).expect("a memory store writes");
        index.kept.handed(ticket);
        index.kept.prune(ticket);
    }

    /// With a store (`stored`), part of what the checks read is in the store and part, not
    /// written yet, in memory, deletions included.
    fn correlation_index(m: &Arc<sm4c_runtime::Machine>, stored: bool) {
        use sm4c_host::local::LocalStores;
        let driver = sm4c_host::driver::Driver::durable();
        let mut index = CorrIndex::default();
        let store = stored.then(|| {
            let s = sm4c_host::local::MemoryStores::default()
                .open("p")
                .expect("a memory store opens");
            // A stale entry of an earlier owner goes.
            s.apply(&[("\u{0}local/corr/type/=audit\u{0}old", Some(&[][..]))], None)
                .expect("a memory store writes");
            index
                .kept
                .place(s.clone(), &[super::CORR_PREFIX])
                .expect("a memory store writes");
            s
        });
        let mut hosts = Vec::new();
        for (id, order) in [("i1", "a"), ("i2", "b"), ("i3", "a")] {
            let mut h = driver.create(m.clone(), id);
            driver.step(
                &mut h,
                Timed {
                    at: 0,
                    input: Input::Start {
                        data: json!({"orderId": order}),
                        scheduled: None,
                    },
                },
            );
            index.update(id, &h.inst);
            hosts.push(h);
        }
        flush(&mut index, &store, 1);
        if let Some(store) = &store {
            assert!(store.count(super::CORR_PREFIX).expect("a memory store reads") > 0);
            assert!(index.kept.mem.is_empty(), "all in the store");
        }
        fn ids(index: &mut CorrIndex, event: serde_json::Value) -> Vec<String> {
            index.candidates(&event).into_iter().collect()
        }
        // By key: only the instances whose orderId the event carries.
        assert_eq!(
            ids(
                &mut index,
                json!({"type": "payment.done", "source": "payments", "orderid": "a"})
            ),
            ["i1", "i3"]
        );
        assert_eq!(
            ids(
                &mut index,
                json!({"type": "payment.done", "source": "payments", "orderid": "z"})
            ),
            Vec::<String>::new()
        );
        // Open correlations (no rule, or a rule that binds on first match) are found by type.
        assert_eq!(
            ids(&mut index, json!({"type": "audit", "region": "eu"})),
            ["i1", "i2", "i3"]
        );
        assert_eq!(
            ids(&mut index, json!({"type": "payment.requested", "source": "sm4c/saga"})),
            ["i1", "i2", "i3"]
        );
        assert_eq!(ids(&mut index, json!({"type": "other"})), Vec::<String>::new());
        // Data changes move an instance; an ended one leaves.
        let h = &mut hosts[1];
        driver.step(h, Timed { at: 1, input: Input::Event { event: json!({"specversion": "1.0", "id": "e", "type": "payment.done", "source": "payments", "orderid": "b"}) } });
        index.update("i2", &h.inst);
        assert!(h.inst.status().is_final());
        assert_eq!(ids(&mut index, json!({"type": "audit", "region": "eu"})), ["i1", "i3"]);
        index.remove("i1");
        assert_eq!(
            ids(
                &mut index,
                json!({"type": "payment.done", "source": "payments", "orderid": "a"})
            ),
            ["i3"]
        );
        assert_eq!(
            index.kept.keys(super::BY_KEY).into_iter().collect::<Vec<_>>(),
            ["orderid\u{0}a\u{0}i3"]
        );
        assert_eq!(index.attrs.len(), 1);
        assert!(index.kept.failed.is_none());

        // Parked events are found through the same keys: by correlation value, by type for the
        // open definitions, and by target; nothing else.
        let mut parking = Parking::default();
        let origin = |offset| Origin {
            topic: "e".into(),
            partition: 0,
            offset,
        };
        let park = |parking: &mut Parking, offset, target: Option<&str>, event: serde_json::Value| {
            let p = Parked {
                event,
                origin: origin(offset),
                target: target.map(str::to_string),
                home: None,
                key: None,
                expect: None,
                expires: 0,
            };
            parking.insert(parked_key(&p), p);
        };
        park(
            &mut parking,
            1,
            None,
            json!({"type": "payment.done", "source": "payments", "orderid": "a"}),
        );
        park(
            &mut parking,
            2,
            None,
            json!({"type": "payment.done", "source": "payments", "orderid": "z"}),
        );
        park(&mut parking, 3, None, json!({"type": "audit", "region": "eu"}));
        park(
            &mut parking,
            4,
            Some("i3"),
            json!({"type": "payment.done", "orderid": "q"}),
        );
        park(
            &mut parking,
            5,
            Some("i9"),
            json!({"type": "payment.done", "orderid": "a"}),
        );
        let offsets = |keys: std::collections::BTreeSet<String>| {
            let mut o: Vec<i64> = keys.iter().map(|k| parking.parked[k].origin.offset).collect();
            o.sort();
            o
        };
        assert_eq!(offsets(parking.candidates("i3", &index.entries("i3"))), [1, 3, 4]);
        assert_eq!(
            offsets(parking.candidates("i1", &index.entries("i1"))),
            Vec::<i64>::new()
        );
        let all: Vec<String> = parking.parked.keys().cloned().collect();
        parking.remove_all(&all);
        assert!(parking.parked.is_empty() && parking.by_attr.is_empty() && parking.by_type.is_empty());
        assert!(parking.by_target.is_empty() && parking.changed.len() == 5);
    }

    /// The correlation keys an instance subscribes to, as its index entries hold them.
    fn subscriptions(inst: &sm4c_runtime::Instance) -> Vec<String> {
        IndexEntries::of(inst).routed.into_vec()
    }

    fn machine(events: serde_json::Value) -> Arc<sm4c_runtime::Machine> {
        let doc = json!({
            "id": "m", "version": "1.0", "name": "M",
            "events": events,
            "states": [
                {"name": "Wait", "start": true, "transitions": [
                    {"nextState": "Done", "eventGroups": [{"events": ["done"]}]}
                ]},
                {"name": "Done", "final": true}
            ]
        });
        Arc::new(load(&doc, &mut sm4c_runtime::no_files, LoadOptions::default()).expect("valid"))
    }

    #[test]
    fn an_event_is_routed_by_key_only_when_every_definition_that_may_take_it_names_the_value() {
        let keyed = machine(json!([
            {"name": "done", "type": "payment.done", "source": "payments",
             "correlation": [{"contextAttributeName": "orderId", "contextAttributeValue": "${ .orderId }"},
                             {"contextAttributeName": "region"}]},
            {"name": "other", "type": "audit"}
        ]));
        let same = machine(json!([
            {"name": "done", "type": "payment.done",
             "correlation": [{"contextAttributeName": "ORDERID", "contextAttributeValue": "x"}]}
        ]));
        let open = machine(json!([
            {"name": "done", "type": "payment.done", "correlation": [{"contextAttributeName": "orderId"}]}
        ]));
        let other = machine(json!([
            {"name": "done", "type": "payment.done",
             "correlation": [{"contextAttributeName": "customer", "contextAttributeValue": "${ .c }"}]}
        ]));
        let pay = json!({"type": "payment.done", "source": "payments", "orderid": "o-1", "customer": "c"});
        let key = Some(("orderid".to_string(), "o-1".to_string()));
        assert_eq!(keyed_route(std::slice::from_ref(&keyed), &pay), key);
        assert_eq!(keyed_route(&[keyed.clone(), same.clone()], &pay), key);
        // An open correlation, or definitions that route by other attributes: every partition.
        assert_eq!(keyed_route(&[keyed.clone(), open], &pay), None);
        assert_eq!(keyed_route(&[keyed.clone(), other], &pay), None);
        // Without the attribute, or of a type only open definitions take: every partition.
        assert_eq!(
            keyed_route(
                std::slice::from_ref(&keyed),
                &json!({"type": "payment.done", "source": "payments"})
            ),
            None
        );
        assert_eq!(
            keyed_route(std::slice::from_ref(&keyed), &json!({"type": "audit"})),
            None
        );
        // A source the definition does not declare leaves it out.
        assert_eq!(
            keyed_route(
                &[keyed.clone(), same],
                &json!({"type": "payment.done", "source": "elsewhere", "orderid": "o-1"})
            ),
            key
        );

        // An instance subscribes to the value its data gives the routing attribute; an ended
        // one, or one whose value does not evaluate, to none.
        let driver = sm4c_host::driver::Driver::durable();
        let mut h = driver.create(keyed.clone(), "i1");
        driver.step(
            &mut h,
            Timed {
                at: 0,
                input: Input::Start {
                    data: json!({"orderId": "o-1"}),
                    scheduled: None,
                },
            },
        );
        assert_eq!(subscriptions(&h.inst), vec![crate::wire::corr_key("orderid", "o-1")]);
        let mut none = driver.create(keyed, "i2");
        driver.step(
            &mut none,
            Timed {
                at: 0,
                input: Input::Start {
                    data: json!({}),
                    scheduled: None,
                },
            },
        );
        assert_eq!(
            subscriptions(&none.inst),
            vec![crate::wire::corr_key("orderid", "null")]
        );
        driver.step(
            &mut h,
            Timed {
                at: 1,
                input: Input::Event {
                    event: json!({"specversion": "1.0", "id": "e", "type": "payment.done", "source": "payments", "orderid": "o-1", "region": "eu"}),
                },
            },
        );
        assert!(h.inst.status().is_final());
        assert!(subscriptions(&h.inst).is_empty());
    }

    #[test]
    fn subscriptions_are_records_of_their_own_written_and_deleted_with_their_partition() {
        let mut parking = Parking::default();
        let key = crate::wire::corr_key("orderid", "o-1");
        parking.subscribe(&key, "i1");
        parking.subscribe(&key, "i2");
        parking.subscribe(&key, "i2");
        assert_eq!(parking.subscribers(&key).len(), 2);
        assert_eq!(parking.changed.len(), 2);
        parking.changed.clear();
        parking.unsubscribe(&key, "i1");
        parking.unsubscribe(&key, "i9");
        assert_eq!(parking.changed.len(), 1);
        // Parked events routed by key are found by it, oldest first.
        let park = |parking: &mut Parking, offset, key: Option<&str>| {
            let p = Parked {
                event: json!({"type": "payment.done", "orderid": "o-1"}),
                origin: crate::wire::Origin {
                    topic: "e".into(),
                    partition: 0,
                    offset,
                },
                target: None,
                home: Some(0),
                key: key.map(str::to_string),
                expect: Some(1),
                expires: 0,
            };
            parking.insert(parked_key(&p), p);
        };
        park(&mut parking, 7, Some(&key));
        park(&mut parking, 3, Some(&key));
        park(&mut parking, 5, None);
        let found: Vec<i64> = parking
            .parked_for_key(&key)
            .iter()
            .map(|k| parking.parked[k].origin.offset)
            .collect();
        assert_eq!(found, [7, 3]);
        parking.remove_all(&parking.parked_for_key(&key));
        assert!(parking.by_key.is_empty() && parking.parked.len() == 1);
        // A subscription's record says what it is; one taken back is a tombstone.
        let sub = crate::wire::subscription_key(&key, "i2");
        let gone = crate::wire::subscription_key(&key, "i1");
        parking.changed.clear();
        parking.changed.insert(sub.clone());
        parking.changed.insert(gone.clone());
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let shared = super::super::sim::shared(&rt);
        let outs = parking.records(&shared, 0, 4, 9);
        let of = |k: &str| outs.iter().find(|o| o.key.as_deref() == Some(k)).expect("written");
        let r: crate::wire::StateRecord =
            serde_json::from_slice(of(&sub).payload.as_deref().expect("a record")).expect("json");
        assert_eq!(
            r.subscription,
            Some(crate::wire::Subscription {
                key: key.clone(),
                id: "i2".into()
            })
        );
        assert!(of(&gone).payload.is_none());
        let mut back = Parking::default();
        back.restore(&sub, r);
        assert!(back.subscribers(&key).contains("i2"));

        // With a local store: the restore wrote the records there, and the transactions' writes
        // carry each change; until the keeper has one, memory answers for it.
        use sm4c_host::local::LocalStores;
        let store = sm4c_host::local::MemoryStores::default()
            .open("p")
            .expect("a memory store opens");
        let write = |store: &Arc<dyn sm4c_host::local::LocalStore>, outs: &[super::Out]| {
            let changes: Vec<(&str, Option<&[u8]>)> = outs
                .iter()
                .map(|o| (o.key.as_deref().unwrap_or_default(), o.payload.as_deref()))
                .collect();
            store.apply(&changes, None).expect("a memory store writes");
        };
        write(&store, &outs);
        back.subs.attach(store.clone());
        assert!(back.subs.mem.is_empty());
        assert_eq!(
            back.subscribers(&key).into_iter().collect::<Vec<_>>(),
            ["i2"],
            "from the store"
        );
        back.subscribe(&key, "i3");
        back.unsubscribe(&key, "i2");
        back.subscribe(&key, "i2");
        back.unsubscribe(&key, "i2");
        let other = crate::wire::corr_key("orderid", "o-10");
        back.subscribe(&other, "i4");
        assert_eq!(
            back.subscribers(&key).into_iter().collect::<Vec<_>>(),
            ["i3"],
            "memory wins"
        );
        back.subs.skip();
        let outs = back.records(&shared, 0, 5, 10);
        back.subs.handed(1);
        assert_eq!(
            back.subscribers(&key).into_iter().collect::<Vec<_>>(),
            ["i3"],
            "not written yet"
        );
        write(&store, &outs);
        back.subs.prune(1);
        assert!(back.subs.mem.is_empty());
        assert_eq!(
            back.subscribers(&key).into_iter().collect::<Vec<_>>(),
            ["i3"],
            "from the store"
        );
        assert_eq!(back.subscribers(&other).into_iter().collect::<Vec<_>>(), ["i4"]);
        assert!(back.subs.failed.is_none());
    }
}
