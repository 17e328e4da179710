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
use rusqlite::{params, Connection};
use serde_json::Value;
use sm4c_durable::store::{SqliteStore, Store};
use sm4c_durable::{DurableHost, Limits};
use sm4c_host::{BoxFuture, FunctionCall, Functions};
use sm4c_runtime::ErrorInfo;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

/// Every call returns its arguments.
struct Echo;

impl Functions for Echo {
    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
        Box::pin(async move { Ok(call.arguments) })
    }
}

const DEFINITIONS: [&str; 2] = [
    include_str!("../../samples/approval-with-timeout/definition.json"),
    include_str!("../../samples/word-count-worker/definition.json"),
];

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

fn field<'a>(fields: &[&'a str], i: usize) -> Option<&'a str> {
    fields.get(i).copied().filter(|s| !s.is_empty())
}

fn write_rows(conn: &Connection, fields: &[&str]) -> rusqlite::Result<()> {
    if let Some(doc) = field(fields, 0) {
        let v: Value = serde_json::from_str(doc).unwrap_or(Value::Null);
        let id = v["id"].as_str().unwrap_or("fuzz");
        let version = v["version"].as_str().unwrap_or("1");
        conn.execute(
            "INSERT OR REPLACE INTO definitions (id, version, doc, seq) VALUES (?1, ?2, ?3, 99)",
            params![id, version, doc],
        )?;
    }
    if let Some(snap) = field(fields, 1) {
        let v: Value = serde_json::from_str(snap).unwrap_or(Value::Null);
        let definition = v["definition"].as_str().unwrap_or("approval-with-timeout");
        let version = v["version"].as_str().unwrap_or("1.0");
        let status = v["status"].as_str().unwrap_or("running");
        let journal = field(fields, 2).map_or(0, |j| j.lines().count() as i64);
        conn.execute(
            "INSERT INTO instances (id, definition, version, status, started_at, snapshot, journal_len)
             VALUES ('i', ?1, ?2, ?3, 1, ?4, ?5)",
            params![definition, version, status, snap, journal],
        )?;
    }
    if let Some(j) = field(fields, 2) {
        for (n, e) in j.lines().enumerate() {
            conn.execute(
                "INSERT INTO journal (instance, seq, entry) VALUES ('i', ?1, ?2)",
                params![n as i64 + 1, e],
            )?;
        }
    }
    if let Some(c) = field(fields, 3) {
        for (n, e) in c.lines().enumerate() {
            conn.execute(
                "INSERT INTO calls (instance, op, effect) VALUES ('i', ?1, ?2)",
                params![format!("op{}", n + 1), e],
            )?;
        }
    }
    if let Some(b) = field(fields, 4) {
        conn.execute(
            "INSERT INTO breakpoints (definition, breakpoints) VALUES ('approval-with-timeout', ?1)",
            [b],
        )?;
    }
    if let Some(o) = field(fields, 5) {
        conn.execute("INSERT INTO origins (instance, traceparent) VALUES ('i', ?1)", [o])?;
    }
    if let Some(e) = field(fields, 6) {
        conn.execute(
            "INSERT INTO parked (event, expires) VALUES (?1, ?2)",
            params![e, i64::MAX / 2],
        )?;
    }
    if let Some(e) = field(fields, 7) {
        conn.execute("INSERT INTO outbox (instance, event, at) VALUES ('i', ?1, 1)", [e])?;
    }
    if let Some(t) = field(fields, 8) {
        for name in t.lines() {
            conn.execute(
                "INSERT OR IGNORE INTO timers (instance, timer, due) VALUES ('i', ?1, 1)",
                [name],
            )?;
        }
    }
    Ok(())
}

fn read_all(store: &dyn Store) {
    let _ = store.definitions();
    let _ = store.breakpoints();
    let _ = store.list(None, None, 0, 100);
    let _ = store.list(Some("running"), Some("approval-with-timeout"), 0, 100);
    let _ = store.instance("i");
    let _ = store.history("i", 0, 1000);
    let _ = store.timers();
    let _ = store.calls();
    let _ = store.calls_of("i");
    let _ = store.origin("i");
    let _ = store.outbox(0, 100);
    let _ = store.parked(0);
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
        match DurableHost::start(store.clone(), Arc::new(Echo), Limits::default()) {
            Ok(host) => {
                read_all(&*store);
                host.shutdown().await;
            }
            Err(_) => read_all(&*store),
        }
    });
});
