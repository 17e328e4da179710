//! A store in memory, for tests and for trying things out.

use super::{Batch, Store, StoreError, Stored, Summary};
use serde_json::Value;
use sm4c_host::service::time;
use sm4c_runtime::{Breakpoint, Effect, Entry, Millis};
use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Default)]
struct Inner {
    definitions: Vec<((String, String), Value)>,
    instances: BTreeMap<String, (i64, Stored)>,
    seq: i64,
    journal: BTreeMap<String, Vec<Entry>>,
    calls: BTreeMap<String, Vec<Effect>>,
    origins: BTreeMap<String, String>,
    outbox: Vec<(i64, String, Value)>,
    parked: BTreeMap<i64, (Value, Millis)>,
    parked_seq: i64,
    breakpoints: BTreeMap<String, Vec<Breakpoint>>,
    schedules: BTreeMap<String, (Value, Value)>,
}

/// Everything in memory; gone when the process ends.
#[derive(Default)]
pub struct MemoryStore(Mutex<Inner>);

impl MemoryStore {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemoryStore {
    fn put_definition(&self, id: &str, version: &str, doc: &Value) -> Result<bool, StoreError> {
        let mut i = self.inner();
        let key = (id.to_string(), version.to_string());
        match i.definitions.iter().find(|(k, _)| *k == key) {
            Some((_, d)) if d == doc => Ok(false),
            Some(_) => Err(StoreError::Conflict {
                id: id.into(),
                version: version.into(),
            }),
            None => {
                i.definitions.push((key, doc.clone()));
                Ok(true)
            }
        }
    }

    fn schedules(&self) -> Result<Vec<super::ScheduleRow>, StoreError> {
        Ok(self
            .inner()
            .schedules
            .iter()
            .map(|(k, v)| (k.clone(), Ok(v.clone())))
            .collect())
    }

    fn breakpoints(&self) -> Result<Vec<(String, Vec<Breakpoint>)>, StoreError> {
        Ok(self.inner().breakpoints.clone().into_iter().collect())
    }

    fn put_breakpoints(&self, definition: &str, breakpoints: &[Breakpoint]) -> Result<(), StoreError> {
        let mut i = self.inner();
        if breakpoints.is_empty() {
            i.breakpoints.remove(definition);
        } else {
            i.breakpoints.insert(definition.to_string(), breakpoints.to_vec());
        }
        Ok(())
    }

    fn definitions(&self) -> Result<Vec<Value>, StoreError> {
        Ok(self.inner().definitions.iter().map(|(_, d)| d.clone()).collect())
    }

    fn instance(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        Ok(self.inner().instances.get(id).map(|(_, s)| s.clone()))
    }

    fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        let mut i = self.inner();
        for w in &batch.instances {
            let id = w.snapshot.id.clone();
            if let Some(tp) = &w.origin {
                i.origins.entry(id.clone()).or_insert_with(|| tp.clone());
            }
            let journal = i.journal.entry(id.clone()).or_default();
            journal.extend(w.entries.iter().cloned());
            let journal_len = journal.len() as i64;
            let seq = match i.instances.get(&id) {
                Some((seq, _)) => *seq,
                None => {
                    i.seq += 1;
                    i.seq
                }
            };
            let parent = i
                .instances
                .get(&id)
                .and_then(|(_, s)| s.parent.clone())
                .or_else(|| w.parent.clone());
            i.instances.insert(
                id.clone(),
                (
                    seq,
                    Stored {
                        snapshot: w.snapshot.clone(),
                        parent,
                        journal_len,
                    },
                ),
            );
            i.calls.insert(id, w.calls.clone());
        }
        for (inst, ev, _) in &batch.outbox {
            let seq = i.outbox.len() as i64 + 1;
            i.outbox.push((seq, inst.clone(), ev.clone()));
        }
        for (ev, exp) in &batch.parked {
            i.parked_seq += 1;
            let seq = i.parked_seq;
            i.parked.insert(seq, (ev.clone(), *exp));
        }
        for (id, row) in &batch.schedules {
            match row {
                Some(r) => i.schedules.insert(id.clone(), r.clone()),
                None => i.schedules.remove(id),
            };
        }
        for seq in &batch.unparked {
            i.parked.remove(seq);
        }
        Ok(())
    }

    fn list(
        &self,
        status: Option<&str>,
        definition: Option<&str>,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Summary>, StoreError> {
        let i = self.inner();
        let mut rows: Vec<Summary> = i
            .instances
            .values()
            .filter(|(seq, s)| {
                *seq > after
                    && status.is_none_or(|st| s.snapshot.status.as_str() == st)
                    && definition.is_none_or(|d| s.snapshot.definition == d)
            })
            .map(|(seq, s)| Summary {
                id: s.snapshot.id.clone(),
                definition: s.snapshot.definition.clone(),
                version: s.snapshot.version.clone(),
                status: s.snapshot.status.as_str().into(),
                state: s.snapshot.state_name.clone(),
                started_at: time(s.snapshot.started_at),
                ended_at: time(s.snapshot.ended_at),
                parent: s.parent.as_ref().map(|p| p.instance.clone()),
                seq: *seq,
            })
            .collect();
        rows.sort_by_key(|r| r.seq);
        rows.truncate(limit);
        Ok(rows)
    }

    fn history(&self, id: &str, after: i64, limit: usize) -> Result<Vec<(i64, Entry)>, StoreError> {
        let i = self.inner();
        Ok(i.journal
            .get(id)
            .map(|j| {
                j.iter()
                    .enumerate()
                    .map(|(n, e)| (n as i64 + 1, e.clone()))
                    .filter(|(n, _)| *n > after)
                    .take(limit)
                    .collect()
            })
            .unwrap_or_default())
    }

    fn timers(&self) -> Result<Vec<(String, String, Millis)>, StoreError> {
        let i = self.inner();
        let mut out: Vec<(String, String, Millis)> = i
            .instances
            .values()
            .flat_map(|(_, s)| {
                s.snapshot
                    .timers
                    .iter()
                    .map(|(t, due)| (s.snapshot.id.clone(), t.clone(), *due))
            })
            .collect();
        out.sort_by_key(|t| t.2);
        Ok(out)
    }

    fn calls(&self) -> Result<Vec<(String, Effect)>, StoreError> {
        let i = self.inner();
        Ok(i.calls
            .iter()
            .flat_map(|(inst, cs)| cs.iter().map(|e| (inst.clone(), e.clone())))
            .collect())
    }

    fn calls_of(&self, instance: &str) -> Result<Vec<Effect>, StoreError> {
        Ok(self.inner().calls.get(instance).cloned().unwrap_or_default())
    }

    fn origin(&self, instance: &str) -> Result<Option<String>, StoreError> {
        Ok(self.inner().origins.get(instance).cloned())
    }

    fn active(&self, definitions: &[(String, String)]) -> Result<Vec<String>, StoreError> {
        let i = self.inner();
        let mut rows: Vec<(i64, String)> = i
            .instances
            .values()
            .filter(|(_, s)| {
                !s.snapshot.status.is_final()
                    && definitions
                        .iter()
                        .any(|(d, v)| *d == s.snapshot.definition && *v == s.snapshot.version)
            })
            .map(|(seq, s)| (*seq, s.snapshot.id.clone()))
            .collect();
        rows.sort();
        Ok(rows.into_iter().map(|(_, id)| id).collect())
    }

    fn outbox(&self, after: i64, limit: usize) -> Result<Vec<super::SentRow>, StoreError> {
        Ok(self
            .inner()
            .outbox
            .iter()
            .filter(|(s, _, _)| *s > after)
            .take(limit)
            .map(|(s, i, e)| (*s, i.clone(), Ok(e.clone())))
            .collect())
    }

    fn parked(&self, now: Millis) -> Result<Vec<(i64, Value)>, StoreError> {
        let mut i = self.inner();
        i.parked.retain(|_, (_, exp)| *exp > now);
        Ok(i.parked.iter().map(|(s, (e, _))| (*s, e.clone())).collect())
    }
}
