//! Each owned partition's journal in a local store beside its state, so that `history` reads the
//! instance's own entries instead of scanning its partition of `P.journal`.
//!
//! The store holds the committed journal records of the partition, keyed by instance id and first
//! sequence number ([`key`]), and as its checkpoint the offset on `P.journal` below which it holds
//! every committed record (of the instances not deleted since). A restore opens it, and once the
//! owner is taken in a thread of its own catches it up: it reads `P.journal` from the checkpoint to
//! the partition's end as it was then, every record (aborted ones included: whether a record
//! committed is decided from its numbers and the offsets the restore read, as
//! [`crate::wire::committed`]), and the owner writes its own transactions' records after each
//! commit. Until the catch-up is done, or when a write to the store failed, `history` scans the
//! partition as before. All writes go through the [`super::keeper::Keeper`]'s one ordered queue.

use crate::wire::{committed, JournalRecord, Quiet};
use crate::Shared;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use sm4c_host::local::{Checkpoint, LocalStore};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The key of a journal record: the instance id, a separator that ids do not hold, and the record's
/// first sequence number, so that an instance's records are one range, in order.
pub(crate) fn key(id: &str, seq: i64) -> String {
    format!("{}{seq:020}", prefix(id))
}

/// The start of every key of instance `id`.
pub(crate) fn prefix(id: &str) -> String {
    format!("{id}\u{1}")
}

/// Records written per store transaction while catching up.
const CHUNK: usize = 500;

#[derive(Default)]
struct Slot {
    store: Option<Arc<dyn LocalStore>>,
    /// Once caught up: the offset it caught up to (an owner's checkpoints never go below it).
    ready: Option<i64>,
    cancel: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The journal stores of the partitions this worker owns, and their catch-ups.
#[derive(Default)]
pub(crate) struct Journals {
    slots: Mutex<HashMap<i32, Slot>>,
}

impl Journals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops partition `p`'s catch-up, waiting for it to end (a restore, before it touches the
    /// store: the catch-up of an earlier restore must not write into a store this one cleared).
    pub(crate) fn stop(&self, p: i32) {
        let slot = self.lock().remove(&p);
        if let Some(mut s) = slot {
            s.cancel.store(true, Ordering::Relaxed);
            if let Some(t) = s.thread.take() {
                let _ = t.join();
            }
        }
    }

    /// Partition `p` left this worker: its catch-up stops (without waiting; a later restore of `p`
    /// waits for it in [`Journals::stop`]).
    pub(crate) fn release(&self, p: i32) {
        if let Some(s) = self.lock().get_mut(&p) {
            s.cancel.store(true, Ordering::Relaxed);
            s.ready = None;
            s.store = None;
        }
    }

    /// Partition `p`'s journal store, once it is caught up.
    pub(crate) fn ready(&self, p: i32) -> Option<Arc<dyn LocalStore>> {
        let slots = self.lock();
        let s = slots.get(&p)?;
        s.ready.and(s.store.clone())
    }

    /// How many partitions' journals are read from their local store.
    pub(crate) fn ready_count(&self) -> usize {
        self.lock().values().filter(|s| s.ready.is_some()).count()
    }

    /// The checkpoint an owner's commit writes with its journal records: none until the catch-up is
    /// done; then the offset after `delivered`, never below where the catch-up ended.
    pub(crate) fn checkpoint(&self, p: i32, delivered: Option<i64>) -> Option<Checkpoint> {
        let at = self.lock().get(&p)?.ready?;
        Some(Checkpoint {
            offset: delivered.map_or(at, |d| (d + 1).max(at)),
            written_ms: sm4c_host::clock::wall_ms(),
        })
    }
}

/// In a restore, once the state store is read: partition `p`'s journal store and the offset its
/// catch-up starts from. A store without a checkpoint (new, or cleared after a failed write), or
/// whose checkpoint lies past the partition's end (the topic was made again), is cleared and caught up
/// from the beginning; one whose checkpoint lies before the log's start keeps what it has (retention
/// deleted the rest from the topic).
pub(super) fn open(shared: &Shared, p: i32) -> Option<(Arc<dyn LocalStore>, i64)> {
    let stores = shared.local.as_ref()?;
    let name = format!("{}-{p}", shared.topics.journal);
    let store = match stores.open(&name) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(partition = p, error = %e, "no local journal for the partition; history scans it");
            return None;
        }
    };
    let high = bounds(shared, p).map(|(_, high)| high);
    let from = match (store.checkpoint(), high) {
        (Ok(Some(cp)), Ok(high)) if cp.offset <= high => cp.offset,
        _ => {
            if let Err(e) = store.clear() {
                tracing::warn!(partition = p, error = %e, "the local journal cannot be cleared; history scans the partition");
                return None;
            }
            0
        }
    };
    Some((store, from))
}

/// The first and the next offset of partition `p` of `P.journal`, aborted records included.
fn bounds(shared: &Shared, p: i32) -> Result<(i64, i64), String> {
    reader(shared)?
        .fetch_watermarks(&shared.topics.journal, p, Duration::from_secs(10))
        .map_err(|e| e.to_string())
}

/// A client that reads every record, committed or not (each is checked with [`committed`]).
fn reader(shared: &Shared) -> Result<BaseConsumer<Quiet>, String> {
    shared
        .cfg
        .layered(
            &[],
            &[
                ("group.id", &format!("{}.journal", shared.cfg.group)),
                ("isolation.level", "read_uncommitted"),
                ("enable.partition.eof", "true"),
            ],
        )
        .create_with_context(Quiet)
        .map_err(|e| e.to_string())
}

/// Starts catching up partition `p`'s journal `store` from offset `from`, with the committed offsets
/// of the commands partition and its clock that the restore read; records of instances not in
/// `known` (deleted after their retention) are left out.
pub(super) fn catch_up(
    shared: &Arc<Shared>,
    p: i32,
    store: Arc<dyn LocalStore>,
    from: i64,
    offsets: (i64, i64),
    known: HashSet<String>,
) {
    let Some(keeper) = &shared.keeper else { return };
    let _ = keeper;
    let cancel = Arc::new(AtomicBool::new(false));
    let (s, st, c) = (shared.clone(), store.clone(), cancel.clone());
    let thread = std::thread::Builder::new()
        .name(format!("sm4c-journal-{p}"))
        .spawn(move || match run(&s, p, &st, from, offsets, &known, &c) {
            Ok(Some(end)) => {
                let mut slots = s.journals.lock();
                if let Some(slot) = slots.get_mut(&p).filter(|_| !c.load(Ordering::Relaxed)) {
                    slot.ready = Some(end);
                    tracing::info!(partition = p, from, end, "the local journal is caught up");
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "the local journal cannot catch up; history scans the partition")
            }
        });
    let mut slots = shared.journals.lock();
    let slot = slots.entry(p).or_default();
    slot.store = Some(store);
    slot.cancel = cancel;
    match thread {
        Ok(t) => slot.thread = Some(t),
        Err(e) => tracing::warn!(partition = p, error = %e, "cannot start the local journal's catch-up"),
    }
}

/// Reads `P.journal` partition `p` from `from` to its end as it is now into `store` (through the
/// keeper); gives that end, or `None` when cancelled.
fn run(
    shared: &Shared,
    p: i32,
    store: &Arc<dyn LocalStore>,
    from: i64,
    (commands, clock): (i64, i64),
    known: &HashSet<String>,
    cancel: &AtomicBool,
) -> Result<Option<i64>, String> {
    let keeper = shared.keeper.as_ref().ok_or("no local stores")?;
    let topic = &shared.topics.journal;
    let consumer = reader(shared)?;
    let (low, high) = consumer
        .fetch_watermarks(topic, p, Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let mut changes = Vec::new();
    if from.max(low) < high {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Offset(from.max(low)))
            .map_err(|e| e.to_string())?;
        consumer.assign(&tpl).map_err(|e| e.to_string())?;
        loop {
            if cancel.load(Ordering::Relaxed) {
                return Ok(None);
            }
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) if m.offset() < high => {
                    let (Some(id), Some(payload)) = (m.key().and_then(|k| std::str::from_utf8(k).ok()), m.payload())
                    else {
                        continue;
                    };
                    if !known.contains(id) {
                        continue;
                    }
                    if let Ok(r) = serde_json::from_slice::<Seq>(payload) {
                        if committed(r.through, r.clock, commands, clock) {
                            changes.push((key(id, r.seq), Some(payload.to_vec())));
                        }
                    }
                    if changes.len() >= CHUNK {
                        keeper.keep(p, store.clone(), std::mem::take(&mut changes), None);
                    }
                    if m.offset() + 1 >= high {
                        break;
                    }
                }
                Some(Ok(_)) | Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => tracing::debug!(error = %e, partition = p, "journal reader"),
                None => {}
            }
        }
    }
    let checkpoint = Checkpoint {
        offset: high.max(from),
        written_ms: sm4c_host::clock::wall_ms(),
    };
    keeper.keep(p, store.clone(), changes, Some(checkpoint));
    Ok(Some(checkpoint.offset))
}

/// What the catch-up reads of a journal record.
#[derive(serde::Deserialize)]
struct Seq {
    through: i64,
    #[serde(default)]
    clock: Option<i64>,
    seq: i64,
}

/// The journal records of a committed batch, as the journal store keeps them.
pub(super) fn changes(b: &super::decision::Batch) -> super::keeper::Changes {
    b.journal
        .iter()
        .filter_map(|(key, i)| Some((key.clone(), Some(b.outs.get(*i)?.payload.clone()?))))
        .collect()
}

/// Instance `id`'s journal from `store`: each sequence number's entry from the last record that has
/// it (as a reader of `P.journal` takes them).
pub(crate) fn read(store: &dyn LocalStore, id: &str) -> Result<Vec<(i64, sm4c_runtime::Entry)>, String> {
    let mut entries = BTreeMap::new();
    store
        .scan(&prefix(id), &mut |_, v| {
            if let Ok(r) = sm4c_runtime::json::read_stored::<JournalRecord>(v) {
                for (i, e) in r.entries.into_iter().enumerate() {
                    entries.insert(r.seq + i as i64, e);
                }
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(entries.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sm4c_host::local::{LocalStores, MemoryStores};
    use sm4c_runtime::{Entry, Input, Timed};

    fn record(seq: i64, n: usize) -> Vec<u8> {
        let entries: Vec<Entry> = (0..n)
            .map(|i| {
                Entry::Input(Timed {
                    at: seq + i as i64,
                    input: Input::Cancel {
                        reason: Some(format!("{}", seq + i as i64)),
                    },
                })
            })
            .collect();
        serde_json::to_vec(&JournalRecord {
            through: 0,
            clock: Some(1),
            seq,
            entries,
        })
        .unwrap()
    }

    #[test]
    fn an_instances_journal_is_read_from_its_own_keys_in_order_the_last_record_of_a_number_winning() {
        let store = MemoryStores::default().open("j-0").unwrap();
        // Keys sort by sequence number, 10 after 9; another id with this one as its start is apart.
        store
            .apply(
                &[
                    (&key("a", 10), Some(&record(10, 1))),
                    (&key("a", 1), Some(&record(1, 3))),
                    (&key("a", 4), Some(&record(4, 6))),
                    (&key("ab", 1), Some(&record(1, 2))),
                ],
                None,
            )
            .unwrap();
        let seqs: Vec<i64> = read(store.as_ref(), "a").unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(seqs, (1..=10).collect::<Vec<_>>());
        assert_eq!(read(store.as_ref(), "ab").unwrap().len(), 2);
        assert!(read(store.as_ref(), "b").unwrap().is_empty());
        assert!(key("a", 9) < key("a", 10));
    }
}
