//! Entry points for the fuzz targets (`fuzz/fuzz_targets/kafka_records.rs`): what a worker decodes
//! from the records it reads back, through the same code and types. Not part of the API.

use crate::wire::{self, Command, InstanceRecord, JournalRecord, StateRecord, CLOCK_HEADER, PARKED_PREFIX};
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};
use serde_json::Value;
use sm4c_host::driver::{op_of, Driver, Hosted};
use sm4c_runtime::{ErrorInfo, ErrorKind, Input, LoadOptions, Machine, Timed};
use std::sync::Arc;

/// What the records are read against: the registered definitions and the driver, as a worker has.
pub struct Records {
    driver: Driver,
    machines: Vec<Arc<Machine>>,
}

impl Records {
    /// A reader with these definitions registered (those that do not load are left out).
    pub fn new(definitions: &[Value]) -> Records {
        let machines = definitions
            .iter()
            .filter_map(|d| sm4c_runtime::load(d, &mut sm4c_runtime::no_files, LoadOptions::default()).ok())
            .map(Arc::new)
            .collect();
        Records {
            driver: Driver::durable(),
            machines,
        }
    }

    fn machine(&self, id: &str, version: &str) -> Option<Arc<Machine>> {
        self.machines
            .iter()
            .find(|m| m.id == id && m.version == version)
            .cloned()
    }

    /// A record of the commands topic, as a worker's batch reads it.
    pub fn command(&self, payload: &[u8]) {
        let Ok(c) = serde_json::from_slice::<Command>(payload) else {
            return;
        };
        if let Some(o) = c.origin() {
            let _ = o.key();
        }
        match &c {
            Command::Start { id, definition, .. } => {
                let _ = wire::partition_of(id, 12);
                let _ = wire::start_id(definition, "fuzz", id);
            }
            Command::Event { event, .. } | Command::Unmatched { event, .. } => {
                let _ = serde_json::from_value::<cloudevents::Event>(event.clone());
            }
            _ => {}
        }
    }

    /// A record of the state topic under `key` (a tombstone when `payload` is `None`), with the
    /// committed offsets of its commands partition and clock, as a restore reads it. A committed
    /// instance record is restored through the driver and given the inputs a new owner gives it.
    pub fn state(
        &self,
        key: &str,
        payload: Option<&[u8]>,
        headers: &[(String, Option<Vec<u8>>)],
        committed: i64,
        clock: i64,
    ) {
        let Some(payload) = payload else {
            // As the restore reads a tombstone's clock header.
            let at = headers
                .iter()
                .find(|(k, _)| k == CLOCK_HEADER)
                .and_then(|(_, v)| std::str::from_utf8(v.as_deref()?).ok()?.parse::<i64>().ok());
            let _ = at.is_none_or(|c| c < clock);
            return;
        };
        let Ok(r) = serde_json::from_slice::<StateRecord>(payload) else {
            return;
        };
        if !wire::committed(r.through, r.clock, committed, clock) {
            return;
        }
        if key == wire::PARTITION_KEY {
            let old = r.partition.unwrap_or_default();
            for p in &old.parked {
                let _ = wire::parked_key(p);
            }
            for origin in old.tally.keys() {
                let _ = wire::tally_key(origin);
            }
            return;
        }
        if key.starts_with(PARKED_PREFIX) || key.starts_with(wire::TALLY_PREFIX) {
            if let Some(p) = &r.parked {
                let _ = wire::parked_key(p);
            }
            return;
        }
        if let Some(rec) = r.instance {
            self.instance(rec);
        }
    }

    /// An instance record a new owner restores (`Slot::from_record`), then its timers fire, its
    /// calls in flight return, an event arrives and it is cancelled.
    fn instance(&self, rec: InstanceRecord) {
        if rec.snapshot.status.is_final() {
            return;
        }
        let Some(m) = self.machine(&rec.snapshot.definition, &rec.snapshot.version) else {
            return;
        };
        let inst = self.driver.restore(m, rec.snapshot);
        let open: Vec<_> = rec.calls.into_iter().map(|(_, e)| e).collect();
        let mut h = Hosted::restored(inst, rec.parent, rec.depth, open, rec.journal_len);
        h.origin = rec.origin;
        let mut inputs: Vec<Input> = h
            .inst
            .snapshot()
            .timers
            .keys()
            .map(|t| Input::TimerFired { timer: t.clone() })
            .collect();
        for (i, e) in h.open.iter().enumerate() {
            if let Some(op) = op_of(e) {
                let op = op.to_string();
                inputs.push(if i % 2 == 0 {
                    Input::Completed {
                        op,
                        result: serde_json::json!({"ok": true}),
                    }
                } else {
                    Input::Failed {
                        op,
                        error: ErrorInfo::new(ErrorKind::FunctionError, "fuzz"),
                    }
                });
            }
        }
        inputs.push(Input::Event {
            event: serde_json::json!({"specversion": "1.0", "id": "1", "source": "/fuzz", "type": "fuzz", "data": {}}),
        });
        inputs.push(Input::Cancel { reason: None });
        let mut at = 1_700_000_000_000;
        for input in inputs.into_iter().take(64) {
            at += 1000;
            let _ = self.driver.step(&mut h, Timed { at, input });
            h.pending.clear();
        }
    }

    /// A record of the journal topic, as the API's history reads it.
    pub fn journal(&self, payload: &[u8], committed: i64, clock: i64) {
        if let Ok(r) = serde_json::from_slice::<JournalRecord>(payload) {
            let _ = wire::committed(r.through, r.clock, committed, clock);
            let _ = serde_json::to_value(&r.entries);
        }
    }

    /// An incoming record of an events topic, as the worker reads it into an event (`read_event`):
    /// binary mode (`ce_*` headers) or structured mode (`content-type: application/cloudevents+json`).
    pub fn event(&self, payload: Option<&[u8]>, headers: &[(String, Option<Vec<u8>>)]) -> Result<Value, String> {
        let mut h = OwnedHeaders::new();
        for (k, v) in headers {
            h = h.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        let m = OwnedMessage::new(
            payload.map(<[u8]>::to_vec),
            None,
            "events".into(),
            Timestamp::CreateTime(1_700_000_000_000),
            0,
            0,
            (!headers.is_empty()).then_some(h),
        );
        crate::worker::read_event(&m).map_err(|(code, why)| format!("{code}: {why}"))
    }
}

/// An instance as a host stores it, as text: what the fuzz targets' seeds are made of.
pub struct StoredText {
    /// The snapshot.
    pub snapshot: String,
    /// The journal entries, one each.
    pub journal: Vec<String>,
    /// The calls in flight, one effect each.
    pub calls: Vec<String>,
    /// The timers' names.
    pub timers: Vec<String>,
}

impl Records {
    /// Each registered definition's instance, started with `{}` by the driver, as text.
    pub fn stored(&self) -> Vec<StoredText> {
        self.started()
            .into_iter()
            .map(|(h, entries)| StoredText {
                snapshot: serde_json::to_string(h.inst.snapshot()).unwrap_or_default(),
                journal: entries.iter().filter_map(|e| serde_json::to_string(e).ok()).collect(),
                calls: h.open.iter().filter_map(|e| serde_json::to_string(e).ok()).collect(),
                timers: h.inst.snapshot().timers.keys().cloned().collect(),
            })
            .collect()
    }

    fn started(&self) -> Vec<(Hosted, Vec<sm4c_runtime::Entry>)> {
        let mut out = Vec::new();
        for m in &self.machines {
            let mut h = self.driver.create(m.clone(), "i");
            let input = Input::Start {
                data: serde_json::json!({"requestId": "R-77", "text": "a b a", "amount": 10}),
                scheduled: None,
            };
            let _ = self.driver.step(
                &mut h,
                Timed {
                    at: 1_700_000_000_000,
                    input,
                },
            );
            let entries = std::mem::take(&mut h.pending);
            out.push((h, entries));
        }
        out
    }

    /// Records as the worker writes them, each with its kind byte first (`kafka_records`' format).
    pub fn samples(&self) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = Vec::new();
        let mut put = |kind: u8, key: Option<&str>, body: &[u8]| {
            let mut v = vec![kind];
            if let Some(k) = key {
                v.extend_from_slice(k.as_bytes());
                v.push(b'\n');
            }
            v.extend_from_slice(body);
            out.push(v);
        };
        let origin = wire::Origin {
            topic: "events".into(),
            partition: 0,
            offset: 7,
        };
        let event = serde_json::json!({"specversion": "1.0", "id": "1", "source": "approvals", "type": "com.example.approval.decided", "requestid": "R-77", "data": {"approved": true}});
        for (h, entries) in self.started() {
            let snap = h.inst.snapshot().clone();
            let id = snap.id.clone();
            let calls: Vec<(String, sm4c_runtime::Effect)> = h
                .open
                .iter()
                .map(|e| (op_of(e).unwrap_or_default().to_string(), e.clone()))
                .collect();
            let commands = vec![
                Command::Start {
                    id: id.clone(),
                    definition: snap.definition.clone(),
                    version: Some(snap.version.clone()),
                    input: serde_json::json!({}),
                    parent: None,
                    depth: 0,
                    origin: Some(origin.clone()),
                    request: Some("r1".into()),
                    traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
                    schedule: None,
                    nominal: None,
                },
                Command::Event {
                    target: Some(id.clone()),
                    event: event.clone(),
                    origin: origin.clone(),
                    home: Some(1),
                    expect: None,
                },
                Command::Keyed {
                    key: wire::corr_key("orderid", "o-1"),
                    event: event.clone(),
                    origin: origin.clone(),
                },
                Command::Subscribe {
                    key: wire::corr_key("orderid", "o-1"),
                    id: id.clone(),
                },
                Command::Unsubscribe {
                    key: wire::corr_key("orderid", "o-1"),
                    id: id.clone(),
                },
                Command::Cancel {
                    id: id.clone(),
                    reason: "fuzz".into(),
                },
                Command::Resume {
                    id: id.clone(),
                    step: true,
                },
                Command::Tick { at: None },
                Command::Barrier { token: "b".into() },
                Command::Unmatched {
                    key: origin.key(),
                    partition: 2,
                    event: event.clone(),
                    expect: Some(1),
                },
            ];
            for c in commands
                .into_iter()
                .chain(calls.iter().map(|(op, _)| Command::Result {
                    id: id.clone(),
                    op: op.clone(),
                    outcome: wire::Outcome::Ok(serde_json::json!({"ok": true})),
                }))
                .chain(snap.timers.keys().map(|t| Command::Timer {
                    id: id.clone(),
                    timer: t.clone(),
                }))
            {
                put(0, None, &serde_json::to_vec(&c).unwrap_or_default());
            }
            let rec = InstanceRecord {
                snapshot: snap,
                parent: h.parent.clone(),
                depth: h.depth,
                calls,
                journal_len: entries.len() as i64,
                seen: [("events/0".to_string(), 7)].into_iter().collect(),
                order: (1_700_000_000_000, 3),
                request: Some("r1".into()),
                origin: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
                answered: vec![("op".into(), "r2".into())],
                recent: vec![("approvals".into(), "1".into())],
                schedule: None,
            };
            let state = StateRecord {
                through: 5,
                clock: Some(3),
                instance: Some(rec),
                ..StateRecord::default()
            };
            put(1, Some(&id), &serde_json::to_vec(&state).unwrap_or_default());
            let journal = JournalRecord {
                through: 5,
                clock: Some(3),
                seq: 1,
                entries,
            };
            put(3, None, &serde_json::to_vec(&journal).unwrap_or_default());
        }
        let parked = wire::Parked {
            event: event.clone(),
            origin: origin.clone(),
            target: None,
            home: Some(1),
            key: Some(wire::corr_key("orderid", "o-1")),
            expect: Some(1),
            expires: 1_700_000_300_000,
        };
        let key = wire::parked_key(&parked);
        let rec = StateRecord {
            through: 5,
            parked: Some(parked.clone()),
            ..StateRecord::default()
        };
        put(1, Some(&key), &serde_json::to_vec(&rec).unwrap_or_default());
        let sub = wire::Subscription {
            key: wire::corr_key("orderid", "o-1"),
            id: "i-1".into(),
        };
        let rec = StateRecord {
            through: 5,
            clock: Some(3),
            subscription: Some(sub.clone()),
            ..StateRecord::default()
        };
        put(
            1,
            Some(&wire::subscription_key(&sub.key, &sub.id)),
            &serde_json::to_vec(&rec).unwrap_or_default(),
        );
        let tally = StateRecord {
            through: 5,
            clock: Some(2),
            tally: Some((vec![0, 2], event.clone(), 1_700_000_000_000)),
            ..StateRecord::default()
        };
        put(
            1,
            Some(&wire::tally_key(&origin.key())),
            &serde_json::to_vec(&tally).unwrap_or_default(),
        );
        let old = StateRecord {
            through: 4,
            partition: Some(wire::PartitionRecord {
                parked: vec![parked],
                tally: [(origin.key(), (vec![1], event, 1))].into_iter().collect(),
            }),
            ..StateRecord::default()
        };
        put(
            1,
            Some(wire::PARTITION_KEY),
            &serde_json::to_vec(&old).unwrap_or_default(),
        );
        put(2, Some(&key), b"3");
        put(2 | 0x80, Some(&wire::tally_key(&origin.key())), b"9");
        out
    }
}
