//! What every worker knows about every instance, for the HTTP API: the state topic read from the
//! beginning and followed, and the definitions topic.

use super::wire::Quiet;
use super::wire::{InstanceRecord, StateRecord, PARTITION_KEY};
use super::Shared;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use sm4c_host::service::Summary;
use sm4c_runtime::engine::rfc3339;
use sm4c_runtime::{load, LoadOptions, Snapshot};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The instances as the state topic has them.
#[derive(Default)]
pub struct View {
    instances: RwLock<HashMap<String, InstanceRecord>>,
    /// True once the topics were read to their end at start.
    pub ready: AtomicBool,
    /// Set to stop following.
    pub stop: AtomicBool,
}

impl View {
    pub fn get(&self, id: &str) -> Option<InstanceRecord> {
        self.instances
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    pub fn records(&self) -> Vec<InstanceRecord> {
        self.instances
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub fn snapshots(&self) -> Vec<Snapshot> {
        self.instances
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|r| r.snapshot.clone())
            .collect()
    }

    /// Instances in start order; the cursor is the position in that order.
    pub fn list(&self, status: Option<&str>, definition: Option<&str>, after: i64, limit: usize) -> Vec<Summary> {
        let map = self.instances.read().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<(&String, &InstanceRecord)> = map.iter().collect();
        all.sort_by(|a, b| (a.1.order, a.0).cmp(&(b.1.order, b.0)));
        all.into_iter()
            .enumerate()
            .map(|(i, (id, r))| (i as i64 + 1, id, r))
            .filter(|(seq, _, r)| {
                *seq > after
                    && status.is_none_or(|s| r.snapshot.status.as_str() == s)
                    && definition.is_none_or(|d| r.snapshot.definition == d)
            })
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

pub(crate) fn run(shared: Arc<Shared>, view: Arc<View>) {
    let mut c = shared.consumer_config(&format!("{}.view", shared.cfg.group));
    c.set("enable.partition.eof", "true");
    let consumer: BaseConsumer<Quiet> = match c.create_with_context(Quiet) {
        Ok(c) => c,
        Err(e) => {
            shared.fail(format!("cannot create the state reader: {e}"));
            return;
        }
    };
    let mut tpl = TopicPartitionList::new();
    let mut pending: HashSet<(String, i32)> = HashSet::new();
    for p in 0..shared.partitions {
        let _ = tpl.add_partition_offset(&shared.topics.state, p, Offset::Beginning);
        pending.insert((shared.topics.state.clone(), p));
    }
    let _ = tpl.add_partition_offset(&shared.topics.definitions, 0, Offset::Beginning);
    pending.insert((shared.topics.definitions.clone(), 0));
    if let Err(e) = consumer.assign(&tpl) {
        shared.fail(format!("cannot read the state topic: {e}"));
        return;
    }
    while !view.stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
                if let (None, Some(key), true) = (m.payload(), &key, m.topic() == shared.topics.state) {
                    // A tombstone: an ended instance past its retention.
                    view.instances.write().unwrap_or_else(|p| p.into_inner()).remove(key);
                    continue;
                }
                let payload = m.payload().unwrap_or_default();
                if let (true, Some(definition)) = (
                    m.topic() == shared.topics.definitions,
                    key.as_deref()
                        .and_then(|k| k.strip_prefix(super::wire::BREAKPOINTS_PREFIX)),
                ) {
                    match serde_json::from_slice::<Vec<sm4c_runtime::Breakpoint>>(payload) {
                        Ok(b) => shared.breakpoints.set(definition, b),
                        Err(_) if payload.is_empty() => shared.breakpoints.set(definition, Vec::new()),
                        Err(e) => {
                            tracing::warn!(definition, error = %e, "breakpoints on the definitions topic do not read")
                        }
                    }
                    continue;
                }
                if m.topic() == shared.topics.definitions {
                    if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(payload) {
                        let options = LoadOptions {
                            limits: shared.cfg.expression,
                        };
                        match load(&doc, &mut sm4c_runtime::no_files, options) {
                            Ok(mach) => {
                                let mut reg = shared.registry.write().unwrap_or_else(|p| p.into_inner());
                                if reg.get(&mach.id, Some(&mach.version)).is_none() {
                                    reg.insert(Arc::new(mach));
                                }
                            }
                            Err(_) => tracing::warn!(key, "a definition on the definitions topic does not load"),
                        }
                    }
                    continue;
                }
                let Some(key) = key.filter(|k| k != PARTITION_KEY) else {
                    continue;
                };
                if let Ok(StateRecord {
                    instance: Some(rec), ..
                }) = serde_json::from_slice::<StateRecord>(payload)
                {
                    view.instances
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key, rec);
                }
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) if !pending.is_empty() => {
                // EOF carries the partition only; both topics' partition 0 may be pending.
                let k = pending.iter().find(|(_, q)| *q == p).cloned();
                if let Some(k) = k {
                    pending.remove(&k);
                }
                if pending.is_empty() {
                    view.ready.store(true, Ordering::Relaxed);
                }
            }
            Some(Err(e)) => tracing::debug!(error = %e, "state reader"),
            None => {}
        }
    }
}
