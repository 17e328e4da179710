//! Events: an event from outside or sent by an instance goes to the instance it names, else to
//! every unfinished instance with a matching event definition; one that reaches none is parked
//! for a while (within the parking limits), and parked events are handed to instances that start
//! waiting for them at the end of each batch.

use super::{now_ms, Loop};
use serde_json::Value;
use sm4c_host::driver;
use sm4c_host::service::{Delivery, HostError};
use sm4c_runtime::{Input, Status};
use std::collections::BTreeSet;

impl Loop {
    /// Sends an event to the instance it names, else to every unfinished instance with a matching
    /// event definition; parks it when it reaches none. `from` does not receive its own event.
    /// An event from outside that reaches none is refused when parking it would pass a limit
    /// ([`HostLimits::max_parked`](super::HostLimits::max_parked),
    /// [`HostLimits::max_parked_bytes`](super::HostLimits::max_parked_bytes)); an event an
    /// instance sent is never refused (it is in the instance's outbox) and never parked.
    pub(super) fn route(&mut self, event: Value, from: Option<&str>) -> Result<Delivery, HostError> {
        if from.is_none() {
            if let Some(target) = driver::target(&event) {
                if self.in_batch(&target).is_some() {
                    self.queue.push((target.clone(), Input::Event { event }));
                    return Ok(Delivery {
                        reached: vec![target],
                        parked: false,
                        cancel_requested: None,
                    });
                }
            }
        }
        let candidates = self.candidates(&event, from);
        if candidates.is_empty() {
            if from.is_none() {
                let size = crate::store::parked_size(&event);
                self.room_to_park(size)?;
                self.batch.parked.push((event, now_ms() + self.limits.park_ms as i64));
                self.parked_count += 1;
                self.parked_bytes += size;
            }
            return Ok(Delivery {
                reached: Vec::new(),
                parked: from.is_none(),
                cancel_requested: None,
            });
        }
        for id in &candidates {
            self.queue.push((id.clone(), Input::Event { event: event.clone() }));
        }
        Ok(Delivery {
            reached: candidates,
            parked: false,
            cancel_requested: None,
        })
    }

    /// Whether an event of `size` bytes may be parked: `Err` naming the limit it would pass. At a
    /// limit the parked events are counted again in the store (expired ones leave it), at most
    /// once a second.
    pub(super) fn room_to_park(&mut self, size: u64) -> Result<(), HostError> {
        let fits = |l: &Self| {
            l.parked_count < l.limits.max_parked && l.parked_bytes.saturating_add(size) <= l.limits.max_parked_bytes
        };
        if fits(self) {
            return Ok(());
        }
        let now = now_ms();
        if now - self.parked_counted >= 1000 {
            if let Ok((count, bytes)) = self.store.parked_totals(now) {
                // What this batch parks is not in the store yet.
                let pending: u64 = self
                    .batch
                    .parked
                    .iter()
                    .map(|(e, _)| crate::store::parked_size(e))
                    .sum();
                self.parked_count = count + self.batch.parked.len();
                self.parked_bytes = bytes + pending;
                self.parked_counted = now;
                if fits(self) {
                    return Ok(());
                }
            }
        }
        let why = if self.parked_count >= self.limits.max_parked {
            format!(
                "the event reached no instance and was not parked: {} events are parked already (the limit, --max-parked); it was not kept, send it again once instances take parked events or they expire",
                self.limits.max_parked
            )
        } else {
            format!(
                "the event reached no instance and was not parked: its {size} bytes would take the parked events past {} bytes (the limit, --max-parked-bytes); it was not kept, send it again once instances take parked events or they expire",
                self.limits.max_parked_bytes
            )
        };
        tracing::warn!(
            max_parked = self.limits.max_parked,
            max_parked_bytes = self.limits.max_parked_bytes,
            "an event was refused: the parked events are at a limit"
        );
        if let Some(o) = sm4c_host::metrics::observer() {
            o.event_refused("parkedLimit");
        }
        Err(HostError::ParkedLimit(why))
    }

    /// Unfinished instances with an event definition that matches the event.
    pub(super) fn candidates(&mut self, event: &Value, from: Option<&str>) -> Vec<String> {
        let defs: Vec<(String, String)> = {
            let reg = self.registry.read().unwrap_or_else(|p| p.into_inner());
            reg.all()
                .iter()
                .filter(|m| driver::may_accept(m, event))
                .map(|m| (m.id.clone(), m.version.clone()))
                .collect()
        };
        if defs.is_empty() {
            return Vec::new();
        }
        let mut ids: Vec<String> = self.store.active(&defs).unwrap_or_default();
        for (id, slot) in &self.cache {
            let snap = slot.h.inst.snapshot();
            if !snap.status.is_final()
                && defs.iter().any(|(d, v)| *d == snap.definition && *v == snap.version)
                && !ids.contains(id)
            {
                ids.push(id.clone());
            }
        }
        ids.retain(|id| Some(id.as_str()) != from);
        ids.into_iter().filter(|id| self.accepts(id, event)).collect()
    }

    pub(super) fn accepts(&mut self, id: &str, event: &Value) -> bool {
        self.in_batch(id).is_some_and(|s| driver::accepts(&s.h.inst, event))
    }

    /// Hands parked events to instances that now wait for them.
    pub(super) fn unpark_for_waiting(&mut self) {
        if self.parked_count == 0 {
            return;
        }
        let waiting: Vec<String> = self
            .cache
            .iter()
            .filter(|(_, s)| s.h.inst.status() == Status::Waiting && !s.was_waiting)
            .map(|(id, _)| id.clone())
            .collect();
        if waiting.is_empty() {
            return;
        }
        // Only the parked events of the types these instances wait for are read.
        let types = self.awaited_types(&waiting);
        let parked = self.store.parked_of(now_ms(), types.as_ref()).unwrap_or_default();
        for (seq, event) in parked {
            if let Some(id) = waiting.iter().find(|id| self.accepts(id, &event)).cloned() {
                self.batch.unparked.push(seq);
                self.parked_count = self.parked_count.saturating_sub(1);
                self.parked_bytes = self.parked_bytes.saturating_sub(crate::store::parked_size(&event));
                self.queue.push((id, Input::Event { event }));
            }
        }
    }

    /// The CloudEvent types the instances `ids` have event definitions for; `None` when one of
    /// them takes events of any type (a definition with a `source` and no `type`).
    pub(super) fn awaited_types(&mut self, ids: &[String]) -> Option<BTreeSet<String>> {
        let mut types = BTreeSet::new();
        for id in ids {
            let Some(slot) = self.cache.get(id) else { continue };
            for def in &slot.h.inst.machine().events {
                match (&def.event_type, &def.source) {
                    (Some(t), _) => types.insert(t.clone()),
                    (None, None) => types.insert(def.name.clone()),
                    (None, Some(_)) => return None,
                };
            }
        }
        Some(types)
    }
}
