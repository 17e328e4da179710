//! What a worker's HTTP API answers from: the instances of the commands partitions this worker
//! owns, fed by the worker itself (the records of a partition when it is restored, then those of
//! each committed transaction), and dropped with the partition. Requests about another worker's
//! instances are forwarded to that worker by the API ([`sm4c_host::service::Whereabouts`]); a
//! listing asks every worker. Also the definitions topic, which every worker reads whole.

use super::wire::InstanceRecord;
use super::wire::Quiet;
use super::Shared;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use sm4c_host::service::Summary;
use sm4c_runtime::engine::rfc3339;
use sm4c_runtime::{load, LoadOptions, Snapshot};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;
use std::time::Duration;

/// The instances of one partition, by id.
pub(crate) type Records = HashMap<String, InstanceRecord>;

/// The instances of the partitions this worker owns and has restored.
#[derive(Default)]
pub struct View {
    partitions: RwLock<HashMap<i32, Records>>,
    /// True once the definitions topic was read to its end at start.
    pub ready: AtomicBool,
    /// Set to stop following.
    pub stop: AtomicBool,
}

/// An instance's place in listings: the timestamp of its start command (ms), then its partition
/// and the start's offset there (10 bits each), in one integer that grows with later starts.
/// Two starts get the same only if they share the millisecond, their partition modulo 1,024 and
/// their offset modulo 1,024 (over a million starts a second on one partition).
pub fn seq(r: &InstanceRecord, p: i32) -> i64 {
    let (at, offset) = r.order;
    (at.clamp(0, (1 << 43) - 1) << 20) | (((p as i64) & 0x3ff) << 10) | (offset & 0x3ff)
}

impl View {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<i32, Records>> {
        self.partitions.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<i32, Records>> {
        self.partitions.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Instance `id`, if its partition is held here (`p`, its partition).
    pub fn get(&self, p: i32, id: &str) -> Option<InstanceRecord> {
        self.read().get(&p)?.get(id).cloned()
    }

    /// Whether partition `p` is held here: owned and restored.
    pub fn holds(&self, p: i32) -> bool {
        self.read().contains_key(&p)
    }

    /// The partitions held here.
    pub(crate) fn held(&self) -> Vec<i32> {
        self.read().keys().copied().collect()
    }

    /// How many instances are held here.
    pub fn len(&self) -> usize {
        self.read().values().map(|r| r.len()).sum()
    }

    /// A partition restored here: its instances, ended ones included.
    pub(crate) fn take(&self, p: i32, records: Records) {
        self.write().insert(p, records);
    }

    /// A committed transaction of partition `p`: each instance's new record, or `None` for one
    /// deleted (past its retention).
    pub(crate) fn apply(&self, p: i32, changes: Vec<(String, Option<InstanceRecord>)>) {
        if changes.is_empty() {
            return;
        }
        let mut all = self.write();
        let Some(part) = all.get_mut(&p) else { return };
        for (id, r) in changes {
            match r {
                Some(r) => {
                    part.insert(id, r);
                }
                None => {
                    part.remove(&id);
                }
            }
        }
    }

    /// Partition `p` is no longer owned here.
    pub(crate) fn release(&self, p: i32) {
        self.write().remove(&p);
    }

    pub fn records(&self) -> Vec<InstanceRecord> {
        self.read().values().flat_map(|r| r.values().cloned()).collect()
    }

    pub fn snapshots(&self) -> Vec<Snapshot> {
        self.read()
            .values()
            .flat_map(|r| r.values().map(|r| r.snapshot.clone()))
            .collect()
    }

    /// The instances held here in start order ([`seq`]), after cursor `after`.
    pub fn list(&self, status: Option<&str>, definition: Option<&str>, after: i64, limit: usize) -> Vec<Summary> {
        let all = self.read();
        let mut rows: Vec<(i64, &String, &InstanceRecord)> = all
            .iter()
            .flat_map(|(p, part)| part.iter().map(move |(id, r)| (seq(r, *p), id, r)))
            .filter(|(seq, _, r)| {
                *seq > after
                    && status.is_none_or(|s| r.snapshot.status.as_str() == s)
                    && definition.is_none_or(|d| r.snapshot.definition == d)
            })
            .collect();
        rows.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        rows.into_iter()
            .take(limit)
            .map(|(seq, id, r)| Summary {
                id: id.clone(),
                definition: r.snapshot.definition.clone(),
                version: r.snapshot.version.clone(),
                status: r.snapshot.status.as_str().to_string(),
                state: r.snapshot.state_name.clone(),
                started_at: r.snapshot.started_at.map(rfc3339),
                ended_at: r.snapshot.ended_at.map(rfc3339),
                parent: r.parent.as_ref().map(|p| p.instance.clone()),
                seq,
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
