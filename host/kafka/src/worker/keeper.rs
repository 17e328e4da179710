//! Writes what transactions committed to the owned partitions' local stores on a thread of its
//! own, so that the SQLite writes are not on a batch's path (they cost a worker about a fifth of its
//! event throughput when they were). The writes of all partitions go through one queue, in order;
//! a restore waits for the writes queued before it ([`Keeper::flush`]) before it reads the store.
//! Each write of a partition has a ticket, and [`Progress`] says which tickets are written: the
//! worker's API reads an instance from the store once the write that holds its record is done, and
//! from memory until then.

use sm4c_host::local::{Checkpoint, LocalStore};
use std::collections::{HashMap, HashSet};
use std::sync::{mpsc, Arc, Mutex};

/// The changes of one transaction: keys and their values (`None` deletes).
pub(crate) type Changes = Vec<(String, Option<Vec<u8>>)>;

enum Op {
    Keep {
        p: i32,
        store: Arc<dyn LocalStore>,
        changes: Changes,
        checkpoint: Option<Checkpoint>,
        ticket: u64,
    },
    Forget {
        p: i32,
        store: Arc<dyn LocalStore>,
        prefixes: Vec<String>,
    },
    Flush {
        p: i32,
        done: mpsc::Sender<()>,
        /// A restore's: a store of `p` whose write failed is written again from now on.
        restore: bool,
    },
}

/// A store of a partition, as the writer tells them apart (a partition has a state store and a
/// journal store).
fn slot(p: i32, store: &Arc<dyn LocalStore>) -> (i32, usize) {
    (p, Arc::as_ptr(store) as *const () as usize)
}

/// The queue of writes to the local stores, and its thread.
pub(crate) struct Keeper {
    tx: mpsc::SyncSender<Op>,
    /// The last ticket given to a write of each partition. Held while the write is queued, so a
    /// partition's tickets are in the queue's order (the owner and a journal catch-up both queue
    /// writes of a partition).
    tickets: Mutex<HashMap<i32, u64>>,
    progress: Arc<Progress>,
}

/// What the writer has done, for readers of the stores.
#[derive(Default)]
pub(crate) struct Progress {
    marks: Mutex<Marks>,
}

#[derive(Default)]
struct Marks {
    /// The last ticket of each partition whose write is done (applied, or dropped as the store
    /// is broken).
    written: HashMap<i32, u64>,
    /// The stores whose write failed: cleared, and not written again until their partition is
    /// restored (a later write would make one look complete without what the failed one had).
    broken: HashSet<(i32, usize)>,
}

impl Progress {
    fn marks(&self) -> std::sync::MutexGuard<'_, Marks> {
        self.marks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last ticket of partition `p` whose write is done.
    pub(crate) fn written(&self, p: i32) -> u64 {
        self.marks().written.get(&p).copied().unwrap_or(0)
    }

    /// Whether a write to `store` (of partition `p`) failed since the partition was restored: it
    /// is cleared, so it holds none of the partition's records.
    pub(crate) fn broken(&self, p: i32, store: &Arc<dyn LocalStore>) -> bool {
        self.marks().broken.contains(&slot(p, store))
    }
}

/// How many transactions' writes may wait; a batch that would queue more waits for the thread.
const QUEUE: usize = 1024;

impl Keeper {
    /// Starts the thread; it ends once the keeper is dropped and the queue is empty.
    pub(crate) fn start() -> Result<Keeper, String> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let progress = Arc::new(Progress::default());
        let marks = progress.clone();
        std::thread::Builder::new()
            .name("sm4c-local-stores".into())
            .spawn(move || run(rx, &marks))
            .map_err(|e| format!("cannot start the local stores' writer: {e}"))?;
        Ok(Keeper {
            tx,
            tickets: Mutex::default(),
            progress,
        })
    }

    /// What the writer has done.
    pub(crate) fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    /// Queues the changes of a committed transaction of partition `p`, and its new checkpoint.
    /// Gives the partition's last ticket: once [`Progress::written`] reaches it, these changes are
    /// in the store (or the store is [broken](Progress::broken)).
    pub(crate) fn keep(
        &self,
        p: i32,
        store: Arc<dyn LocalStore>,
        changes: Changes,
        checkpoint: Option<Checkpoint>,
    ) -> u64 {
        let mut tickets = self.tickets.lock().unwrap_or_else(|p| p.into_inner());
        let last = tickets.entry(p).or_default();
        if changes.is_empty() && checkpoint.is_none() {
            return *last;
        }
        *last += 1;
        let op = Op::Keep {
            p,
            store,
            changes,
            checkpoint,
            ticket: *last,
        };
        if self.tx.send(op).is_err() {
            tracing::warn!(
                partition = p,
                "the local stores' writer has stopped; the store is not written"
            );
        }
        *last
    }

    /// Queues the deletion of every key of `store` under one of `prefixes` (the journal entries of
    /// instances deleted after their retention).
    pub(crate) fn forget(&self, p: i32, store: Arc<dyn LocalStore>, prefixes: Vec<String>) {
        if !prefixes.is_empty() {
            let _ = self.tx.send(Op::Forget { p, store, prefixes });
        }
    }

    /// Waits until every write queued before for partition `p` is done; a store of `p` that could
    /// not be written is written again from now on (the restore that calls this finds it cleared).
    pub(crate) fn flush(&self, p: i32) {
        self.wait(p, true);
    }

    /// Waits until every write queued before for partition `p` is done, for a reader of its stores.
    pub(crate) fn sync(&self, p: i32) {
        self.wait(p, false);
    }

    fn wait(&self, p: i32, restore: bool) {
        let (done, wait) = mpsc::channel();
        if self.tx.send(Op::Flush { p, done, restore }).is_ok() {
            let _ = wait.recv();
        }
    }
}

fn run(rx: mpsc::Receiver<Op>, progress: &Progress) {
    // A store that cannot be written or read is cleared, broken until its partition is restored.
    let broken = |p: i32, store: &Arc<dyn LocalStore>, e: &dyn std::fmt::Display| {
        tracing::warn!(partition = p, error = %e, "the local store cannot be written; it is cleared until the partition is restored");
        // Broken before it is cleared: whoever reads the store empty can tell afterwards.
        progress.marks().broken.insert(slot(p, store));
        let _ = store.clear();
    };
    let write = |p: i32, store: &Arc<dyn LocalStore>, changes: &[(&str, Option<&[u8]>)], checkpoint| {
        if progress.broken(p, store) {
            return;
        }
        if let Err(e) = store.apply(changes, checkpoint) {
            broken(p, store, &e);
        }
    };
    for op in rx {
        match op {
            Op::Keep {
                p,
                store,
                changes,
                checkpoint,
                ticket,
            } => {
                let refs: Vec<(&str, Option<&[u8]>)> =
                    changes.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
                write(p, &store, &refs, checkpoint);
                progress.marks().written.insert(p, ticket);
            }
            Op::Forget { p, store, prefixes } => {
                if progress.broken(p, &store) {
                    continue;
                }
                let mut keys = Vec::new();
                // Keys left behind would outlive their instance: a store that cannot say which
                // keys it has is treated as one that cannot be written.
                let scanned: Result<(), _> = prefixes
                    .iter()
                    .try_for_each(|prefix| store.scan(prefix, &mut |k, _| keys.push(k.to_string())));
                match scanned {
                    Ok(()) => {
                        let refs: Vec<(&str, Option<&[u8]>)> = keys.iter().map(|k| (k.as_str(), None)).collect();
                        write(p, &store, &refs, None);
                    }
                    Err(e) => broken(p, &store, &format!("cannot scan it: {e}")),
                }
            }
            Op::Flush { p, done, restore } => {
                if restore {
                    progress.marks().broken.retain(|(q, _)| *q != p);
                }
                let _ = done.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sm4c_host::local::{LocalError, LocalStores, MemoryStores};

    /// A store whose writes of key `b` fail (a full disk, say).
    struct Failing {
        inner: Arc<dyn LocalStore>,
    }

    impl LocalStore for Failing {
        fn checkpoint(&self) -> Result<Option<Checkpoint>, LocalError> {
            self.inner.checkpoint()
        }
        fn each(&self, f: &mut dyn FnMut(&str, &[u8])) -> Result<(), LocalError> {
            self.inner.each(f)
        }
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>, LocalError> {
            self.inner.get(key)
        }
        fn scan(&self, prefix: &str, f: &mut dyn FnMut(&str, &[u8])) -> Result<(), LocalError> {
            if prefix == "bad" {
                return Err(LocalError("unreadable page".into()));
            }
            self.inner.scan(prefix, f)
        }
        fn apply(&self, changes: &[(&str, Option<&[u8]>)], cp: Option<Checkpoint>) -> Result<(), LocalError> {
            if changes.iter().any(|(k, _)| *k == "b") {
                return Err(LocalError("disk full".into()));
            }
            self.inner.apply(changes, cp)
        }
        fn clear(&self) -> Result<(), LocalError> {
            self.inner.clear()
        }
    }

    #[test]
    fn writes_are_applied_in_order_and_a_failed_store_stays_cleared_until_its_partition_is_restored() {
        let keeper = Keeper::start().unwrap();
        let stores = MemoryStores::default();
        let store = Arc::new(Failing {
            inner: stores.open("s-0").unwrap(),
        });
        let cp = |offset| Some(Checkpoint { offset, written_ms: 0 });
        let put = |k: &str, v: &str| vec![(k.to_string(), Some(v.as_bytes().to_vec()))];
        let progress = keeper.progress();
        let dyn_store: Arc<dyn LocalStore> = store.clone();
        assert_eq!(keeper.keep(0, store.clone(), put("a", "1"), cp(1)), 1);
        assert_eq!(keeper.keep(0, store.clone(), put("a", "2"), cp(2)), 2);
        // Nothing to write: no new ticket. Another partition counts its own.
        assert_eq!(keeper.keep(0, store.clone(), Vec::new(), None), 2);
        assert_eq!(keeper.keep(1, store.clone(), put("x", "1"), None), 1);
        keeper.flush(0);
        assert_eq!(store.get("a").unwrap(), Some(b"2".to_vec()));
        assert_eq!(store.checkpoint().unwrap(), cp(2));
        assert_eq!(progress.written(0), 2);
        assert!(!progress.broken(0, &dyn_store));
        // A failed write clears the store; the writes after it are not applied (the store would
        // look complete without the failed one's key).
        keeper.keep(0, store.clone(), put("b", "1"), cp(3));
        keeper.keep(0, store.clone(), put("c", "1"), cp(4));
        keeper.sync(0);
        assert_eq!(store.checkpoint().unwrap(), None);
        assert_eq!(store.get("a").unwrap(), None);
        assert_eq!(store.get("c").unwrap(), None);
        // Its tickets are done all the same, and readers learn that the store is broken.
        assert_eq!(progress.written(0), 4);
        assert!(progress.broken(0, &dyn_store));
        // Once restored (flushed), the partition's store is written again.
        keeper.flush(0);
        keeper.keep(0, store.clone(), put("d", "1"), cp(5));
        keeper.flush(0);
        assert_eq!(store.get("d").unwrap(), Some(b"1".to_vec()));
        assert!(!progress.broken(0, &dyn_store));
    }

    #[test]
    fn forgetting_a_prefix_deletes_its_keys_only_in_the_queues_order_and_sync_leaves_a_broken_store_alone() {
        let keeper = Keeper::start().unwrap();
        let stores = MemoryStores::default();
        let store = stores.open("j-0").unwrap();
        let put = |keys: &[&str]| keys.iter().map(|k| (k.to_string(), Some(b"v".to_vec()))).collect();
        keeper.keep(0, store.clone(), put(&["a\u{1}1", "a\u{1}2", "ab\u{1}1"]), None);
        keeper.forget(0, store.clone(), vec!["a\u{1}".into()]);
        keeper.keep(0, store.clone(), put(&["a\u{1}3"]), None);
        keeper.sync(0);
        let mut left = Vec::new();
        store.each(&mut |k, _| left.push(k.to_string())).unwrap();
        assert_eq!(left, vec!["a\u{1}3", "ab\u{1}1"]);
        // A reader's sync does not make a broken store writable again; a restore's flush does.
        let failing: Arc<dyn LocalStore> = Arc::new(Failing {
            inner: stores.open("s-1").unwrap(),
        });
        keeper.keep(1, failing.clone(), put(&["b"]), None);
        keeper.sync(1);
        keeper.keep(1, failing.clone(), put(&["c"]), None);
        keeper.sync(1);
        assert_eq!(failing.get("c").unwrap(), None);
        keeper.flush(1);
        keeper.keep(1, failing.clone(), put(&["c"]), None);
        keeper.sync(1);
        assert_eq!(failing.get("c").unwrap(), Some(b"v".to_vec()));
    }

    #[test]
    fn a_store_that_cannot_be_scanned_to_forget_a_prefix_is_broken_until_restored() {
        let keeper = Keeper::start().unwrap();
        let stores = MemoryStores::default();
        let store: Arc<dyn LocalStore> = Arc::new(Failing {
            inner: stores.open("j-2").unwrap(),
        });
        keeper.keep(
            2,
            store.clone(),
            vec![("bad\u{1}1".to_string(), Some(b"v".to_vec()))],
            None,
        );
        keeper.forget(2, store.clone(), vec!["bad".into()]);
        keeper.sync(2);
        // Not silently left behind: the store is cleared and readers learn it is broken.
        assert!(keeper.progress().broken(2, &store));
        assert_eq!(store.get("bad\u{1}1").unwrap(), None);
        keeper.flush(2);
        assert!(!keeper.progress().broken(2, &store));
    }
}
