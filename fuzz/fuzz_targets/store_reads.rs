//! The durable store's decoding of what it reads back, without starting a host: the same input as
//! `store_records` (NUL-separated texts written into the rows of a store holding the
//! approval-with-timeout and word-count-worker definitions; see store_records.rs for the fields), in
//! an in-memory SQLite database, opened again with `SqliteStore::open` (as a restarted server opens its
//! file), read back through every `Store` read, then recovered as `DurableHost::start` recovers:
//! every call in flight turned into its work by the driver (a worker task's instance restored from its
//! snapshot), and every unfinished instance's journal replayed against its definition and compared
//! with its snapshot.
//!
//! `store_records` starts a real `DurableHost` on a file, which compiles the stored definitions' jq
//! expressions on every input (about 10 inputs a second); here the two definitions are compiled once,
//! so the decoding paths run a hundred times as often. A fuzzed definition row is read back (and
//! decoded) but not compiled: `load_definition` fuzzes that.
//! Everything ends with a value or an error, never a panic.
#![no_main]

#[path = "common/store.rs"]
mod store;

use libfuzzer_sys::fuzz_target;
use rusqlite::backup::Backup;
use rusqlite::Connection;
use serde_json::Value;
use sm4c_durable::store::{SqliteStore, Store};
use sm4c_host::driver::{Driver, Work};
use sm4c_runtime::{load, no_files, Entry, Instance, LoadOptions, Machine};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;
use store::{read_all, write_rows, DEFINITIONS};

/// The definitions, compiled once: (document, machine).
static MACHINES: LazyLock<Vec<(Value, Arc<Machine>)>> = LazyLock::new(|| {
    DEFINITIONS
        .iter()
        .map(|d| {
            let doc: Value = serde_json::from_str(d).expect("a definition");
            let m = load(&doc, &mut no_files, LoadOptions::default()).expect("a valid definition");
            (doc, Arc::new(m))
        })
        .collect()
});

/// A store made once, with the two definitions registered: each input's database starts as a copy
/// of its pages (SQLite's backup API), which costs far less than creating the tables again.
static TEMPLATE: LazyLock<Mutex<Connection>> = LazyLock::new(|| {
    let uri = format!(
        "file:sm4c-fuzz-template-{}?mode=memory&cache=shared",
        std::process::id()
    );
    let conn = Connection::open(&uri).expect("an in-memory database");
    let store = SqliteStore::open(Path::new(&uri)).expect("a new store");
    for d in DEFINITIONS {
        let doc: Value = serde_json::from_str(d).expect("a definition");
        let id = doc["id"].as_str().unwrap_or_default().to_string();
        let version = doc["version"].as_str().unwrap_or_default().to_string();
        store.put_definition(&id, &version, &doc).expect("registered");
    }
    Mutex::new(conn)
});

/// The compiled machine of a stored definition, when it is one of ours unchanged.
fn machine(registered: &[Value], id: &str, version: &str) -> Option<Arc<Machine>> {
    let doc = registered
        .iter()
        .find(|d| d["id"].as_str() == Some(id) && d["version"].as_str() == Some(version))?;
    MACHINES.iter().find(|(d, _)| d == doc).map(|(_, m)| m.clone())
}

/// What `DurableHost::start` does with the store before it decides anything.
fn recover(store: &dyn Store) {
    let Ok(registered) = store.definitions() else {
        return;
    };
    let driver = Driver::durable();
    let mut ids: BTreeSet<String> = BTreeSet::new();
    if let Ok(timers) = store.timers() {
        ids.extend(timers.into_iter().map(|(i, _, _)| i));
    }
    if let Ok(calls) = store.calls() {
        for (id, effect) in calls {
            ids.insert(id.clone());
            let Ok(Some(stored)) = store.instance(&id) else {
                continue;
            };
            let Some(m) = machine(&registered, &stored.snapshot.definition, &stored.snapshot.version) else {
                continue;
            };
            if let Work::Task { task, .. } = driver.work(&id, &m, 0, effect) {
                let _ = driver.restore(m, stored.snapshot).task_started(&task.op);
            }
        }
    }
    let keys: Vec<(String, String)> = registered
        .iter()
        .map(|d| {
            let s = |k: &str| d[k].as_str().unwrap_or_default().to_string();
            (s("id"), s("version"))
        })
        .collect();
    if let Ok(active) = store.active(&keys) {
        ids.extend(active);
    }
    for id in ids {
        let Ok(Some(stored)) = store.instance(&id) else {
            continue;
        };
        if stored.snapshot.status.is_final() {
            continue;
        }
        let Some(m) = machine(&registered, &stored.snapshot.definition, &stored.snapshot.version) else {
            continue;
        };
        let Ok(history) = store.history(&id, 0, usize::MAX) else {
            continue;
        };
        let journal: Vec<Entry> = history.into_iter().map(|(_, e)| e).collect();
        if let Ok(replayed) = Instance::replay(m, &id, &journal, driver.options) {
            let _ = sm4c_runtime::engine::snapshot_differences(replayed.snapshot(), &stored.snapshot);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let fields: Vec<&str> = text.split('\0').collect();
    // A database of its own for each input, alive while `holder` is open.
    static N: AtomicU64 = AtomicU64::new(0);
    let uri = format!(
        "file:sm4c-fuzz-store-{}-{}?mode=memory&cache=shared",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let mut holder = Connection::open(&uri).expect("an in-memory database");
    {
        let template = TEMPLATE.lock().unwrap_or_else(|p| p.into_inner());
        Backup::new(&template, &mut holder)
            .and_then(|b| b.run_to_completion(i32::MAX, Duration::ZERO, None))
            .expect("a copy of the template");
    }
    if write_rows(&holder, &fields).is_err() {
        return;
    }
    let Ok(store) = SqliteStore::open(Path::new(&uri)) else {
        return;
    };
    read_all(&store);
    recover(&store);
});
