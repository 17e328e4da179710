//! What the durable host reads back from its SQLite store (host/durable): the input's fields, separated by
//! NUL bytes, are written as text into the rows of a real store file (a copy of a template store on
//! /dev/shm, with the approval-with-timeout and word-count-worker definitions registered), which is then
//! opened with `SqliteStore::open` and `DurableHost::start` (recovery: timers, calls in flight, every
//! unfinished instance's journal replayed), and every row is read back through the `Store` trait
//! (`list`, `instance`, `history`, `calls`, `calls_of`, `origin`, `outbox`, `parked`, `breakpoints`).
//! Fields, in order (an empty or missing field writes no row):
//! 0. a definition document (`definitions.doc`, under its `id` and `version` when it has them);
//! 1. instance `i`'s snapshot (`instances.snapshot`; definition, version and status from it when it is JSON);
//! 2. `i`'s journal entries, one a line (`journal.entry`, seq from 1);
//! 3. `i`'s calls in flight, one a line (`calls.effect`, op `op1`, `op2`, ...);
//! 4. breakpoints of approval-with-timeout (`breakpoints.breakpoints`);
//! 5. `i`'s origin (`origins.traceparent`);
//! 6. a parked event (`parked.event`, expires far ahead);
//! 7. an outbox event (`outbox.event`);
//! 8. `i`'s timers, one name a line, all due (`timers.timer`).
//! Everything ends with a value or an error (`StoreError::Corrupt`, `HostError`), never a panic.
//!
//! With `SM4C_FUZZ_SEEDS=<dir>` set, the first run writes seeds in this format to `<dir>` (instances of
//! the registered definitions run by the real driver; fuzz/seed-corpus.sh does this).
#![no_main]

use libfuzzer_sys::fuzz_target;
#[path = "common/store.rs"]
mod store;

use rusqlite::Connection;
use serde_json::Value;
use sm4c_durable::store::{SqliteStore, Store};
use sm4c_durable::{DurableHost, HostLimits};
use sm4c_host::{BoxFuture, FunctionCall, Functions};
use sm4c_runtime::ErrorInfo;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use store::{read_all, write_rows, DEFINITIONS};

/// Every call returns its arguments.
struct Echo;

impl Functions for Echo {
    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
        Box::pin(async move { Ok(call.arguments) })
    }
}

struct Fixture {
    dir: PathBuf,
    template: Vec<u8>,
    rt: tokio::runtime::Runtime,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("sm4c-fuzz-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the store");
    let path = dir.join("template.db");
    let _ = std::fs::remove_file(&path);
    {
        let store = SqliteStore::open(&path).expect("the template store");
        for d in DEFINITIONS {
            let doc: Value = serde_json::from_str(d).expect("a definition");
            let id = doc["id"].as_str().unwrap_or_default().to_string();
            let version = doc["version"].as_str().unwrap_or_default().to_string();
            store.put_definition(&id, &version, &doc).expect("registered");
        }
    }
    let template = std::fs::read(&path).expect("the template");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    if let Ok(seeds) = std::env::var("SM4C_FUZZ_SEEDS") {
        write_seeds(&PathBuf::from(seeds));
    }
    Fixture { dir, template, rt }
});

/// Seeds from what the real driver makes of the registered definitions.
fn write_seeds(dir: &std::path::Path) {
    let docs: Vec<Value> = DEFINITIONS
        .iter()
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let records = sm4c_kafka::fuzzing::Records::new(&docs);
    let _ = std::fs::create_dir_all(dir);
    for (n, s) in records.stored().into_iter().enumerate() {
        let fields = [
            String::new(),
            s.snapshot,
            s.journal.join("\n"),
            s.calls.join("\n"),
            "[]".to_string(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_string(),
            r#"{"specversion":"1.0","id":"1","source":"/s","type":"t"}"#.to_string(),
            r#"{"specversion":"1.0","id":"2","source":"/s","type":"t","data":{}}"#.to_string(),
            s.timers.join("\n"),
        ];
        let _ = std::fs::write(dir.join(format!("driver-{n}")), fields.join("\0"));
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let fields: Vec<&str> = text.split('\0').collect();
    let f = &*FIXTURE;
    let path = f.dir.join("run.db");
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(f.dir.join(format!("run.db{suffix}")));
    }
    std::fs::write(&path, &f.template).expect("a copy of the template");
    {
        let conn = Connection::open(&path).expect("the copy opens");
        if write_rows(&conn, &fields).is_err() {
            return;
        }
    }
    let store: Arc<dyn Store> = match SqliteStore::open(&path) {
        Ok(s) => Arc::new(s),
        Err(_) => return,
    };
    f.rt.block_on(async {
        match DurableHost::start(store.clone(), Arc::new(Echo), HostLimits::default()) {
            Ok(host) => {
                read_all(&*store);
                host.shutdown().await;
            }
            Err(_) => read_all(&*store),
        }
    });
});
