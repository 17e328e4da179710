//! Local stores: what a worker keeps on its own disk of the log partitions it owns, so that a
//! restart or a partition that comes back reads only what is new in the log.
//!
//! A local store is a cache of a log, never a source of truth: it holds the latest value of each
//! key as of some point of the log, and a *checkpoint*, an offset at or before that point from
//! which reading the log on and applying it again gives the log's latest values. A store that is
//! lost, stale or unreadable is cleared and rebuilt from the log. The Kafka host (`sm4c-kafka`)
//! keeps the state partitions of its commands partitions in one; `sm4c-durable` gives the SQLite
//! implementation the `sm4c` binary uses, and [`MemoryStores`] keeps them in memory for the
//! process's life.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Where a store's log was read to, and when that was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Reading the log on from this offset and applying it brings the store up to date.
    pub offset: i64,
    /// When the checkpoint was written (ms since the epoch, the host's wall clock): a store left
    /// longer than its log keeps deletions is stale.
    pub written_ms: i64,
}

/// A failed store operation, in a sentence.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct LocalError(pub String);

/// One partition's store: keys and their latest values (bytes as the log carries them).
pub trait LocalStore: Send + Sync {
    /// The checkpoint, `None` for a new or cleared store.
    fn checkpoint(&self) -> Result<Option<Checkpoint>, LocalError>;
    /// Calls `f` with every key and value.
    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) -> Result<(), LocalError>;
    /// The value of one key.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, LocalError>;
    /// Calls `f` with every key that starts with `prefix`, and its value, in key order.
    fn scan(&self, prefix: &str, f: &mut dyn FnMut(&str, &[u8])) -> Result<(), LocalError> {
        let mut all = Vec::new();
        self.each(&mut |k, v| {
            if k.starts_with(prefix) {
                all.push((k.to_string(), v.to_vec()));
            }
        })?;
        all.sort();
        for (k, v) in &all {
            f(k, v);
        }
        Ok(())
    }
    /// Calls `f` with the keys that start with `prefix` and are not before `from`, and their
    /// values, in key order, until `f` gives `false`: a page of an index kept in the store.
    fn scan_from(&self, prefix: &str, from: &str, f: &mut dyn FnMut(&str, &[u8]) -> bool) -> Result<(), LocalError> {
        let mut more = true;
        self.scan(prefix, &mut |k, v| {
            if more && k >= from {
                more = f(k, v);
            }
        })
    }
    /// How many keys start with `prefix`.
    fn count(&self, prefix: &str) -> Result<usize, LocalError> {
        let mut n = 0;
        self.scan(prefix, &mut |_, _| n += 1)?;
        Ok(n)
    }
    /// Writes values (`None` deletes the key) and, when given, a new checkpoint, all at once.
    fn apply(&self, changes: &[(&str, Option<&[u8]>)], checkpoint: Option<Checkpoint>) -> Result<(), LocalError>;
    /// Forgets everything: keys and checkpoint.
    fn clear(&self) -> Result<(), LocalError>;
}

/// Opens the stores of a worker by name (one per partition, `<topic>-<partition>`).
pub trait LocalStores: Send + Sync {
    /// The store of this name, made empty when it does not exist.
    fn open(&self, name: &str) -> Result<Arc<dyn LocalStore>, LocalError>;
    /// Where the stores live, for the logs.
    fn describe(&self) -> String;
}

/// Stores in memory, kept for the life of the process: a partition that comes back to the worker
/// reads only what is new, a restart rebuilds everything.
#[derive(Default)]
pub struct MemoryStores {
    stores: Mutex<HashMap<String, Arc<MemoryStore>>>,
}

impl LocalStores for MemoryStores {
    fn open(&self, name: &str) -> Result<Arc<dyn LocalStore>, LocalError> {
        let mut all = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        Ok(all.entry(name.to_string()).or_default().clone())
    }

    fn describe(&self) -> String {
        "memory".into()
    }
}

/// The values and the checkpoint of a store in memory.
type Kept = (BTreeMap<String, Vec<u8>>, Option<Checkpoint>);

#[derive(Default)]
struct MemoryStore {
    inner: Mutex<Kept>,
}

impl LocalStore for MemoryStore {
    fn checkpoint(&self) -> Result<Option<Checkpoint>, LocalError> {
        Ok(self.inner.lock().unwrap_or_else(|p| p.into_inner()).1)
    }

    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) -> Result<(), LocalError> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (k, v) in &inner.0 {
            f(k, v);
        }
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, LocalError> {
        Ok(self.inner.lock().unwrap_or_else(|p| p.into_inner()).0.get(key).cloned())
    }

    fn scan(&self, prefix: &str, f: &mut dyn FnMut(&str, &[u8])) -> Result<(), LocalError> {
        self.scan_from(prefix, prefix, &mut |k, v| {
            f(k, v);
            true
        })
    }

    fn scan_from(&self, prefix: &str, from: &str, f: &mut dyn FnMut(&str, &[u8]) -> bool) -> Result<(), LocalError> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let start = if from > prefix { from } else { prefix };
        for (k, v) in inner.0.range(start.to_string()..) {
            if !k.starts_with(prefix) || !f(k, v) {
                break;
            }
        }
        Ok(())
    }

    fn apply(&self, changes: &[(&str, Option<&[u8]>)], checkpoint: Option<Checkpoint>) -> Result<(), LocalError> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (k, v) in changes {
            match v {
                Some(v) => inner.0.insert(k.to_string(), v.to_vec()),
                None => inner.0.remove(*k),
            };
        }
        if checkpoint.is_some() {
            inner.1 = checkpoint;
        }
        Ok(())
    }

    fn clear(&self) -> Result<(), LocalError> {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = Default::default();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_store_keeps_the_latest_values_and_the_checkpoint_until_cleared() {
        let stores = MemoryStores::default();
        let s = stores.open("state-0").unwrap();
        assert_eq!(s.checkpoint().unwrap(), None);
        let cp = Checkpoint {
            offset: 7,
            written_ms: 1,
        };
        s.apply(&[("a", Some(b"1")), ("b", Some(b"2"))], None).unwrap();
        s.apply(&[("a", None), ("b", Some(b"3"))], Some(cp)).unwrap();
        // The same name opens the same store.
        let again = stores.open("state-0").unwrap();
        assert_eq!(again.checkpoint().unwrap(), Some(cp));
        assert_eq!(again.get("a").unwrap(), None);
        let mut all = Vec::new();
        again.each(&mut |k, v| all.push((k.to_string(), v.to_vec()))).unwrap();
        assert_eq!(all, vec![("b".to_string(), b"3".to_vec())]);
        again
            .apply(&[("b1", Some(b"4")), ("c", Some(b"5")), ("a9", Some(b"6"))], None)
            .unwrap();
        let mut under_b = Vec::new();
        again.scan("b", &mut |k, _| under_b.push(k.to_string())).unwrap();
        assert_eq!(under_b, vec!["b", "b1"]);
        let mut page = Vec::new();
        again
            .scan_from("b", "b0", &mut |k, _| {
                page.push(k.to_string());
                true
            })
            .unwrap();
        assert_eq!(page, vec!["b1"], "from a key on, within the prefix");
        let mut first = Vec::new();
        again
            .scan_from("", "", &mut |k, _| {
                first.push(k.to_string());
                first.len() < 2
            })
            .unwrap();
        assert_eq!(first, vec!["a9", "b"], "stops when told");
        assert_eq!(again.count("b").unwrap(), 2);
        again.clear().unwrap();
        assert_eq!(s.checkpoint().unwrap(), None);
        assert_eq!(s.get("b").unwrap(), None);
    }
}
