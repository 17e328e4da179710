//! What the two store targets share: the rows an input writes into a store, and every read of the
//! `Store` trait. Each target includes it with `#[path]`.

use rusqlite::{params, Connection};
use serde_json::Value;
use sm4c_durable::store::Store;

/// The definitions every store starts with (fields refer to their instances).
pub const DEFINITIONS: [&str; 2] = [
    include_str!("../../../samples/approval-with-timeout/definition.json"),
    include_str!("../../../samples/word-count-worker/definition.json"),
];

pub fn field<'a>(fields: &[&'a str], i: usize) -> Option<&'a str> {
    fields.get(i).copied().filter(|s| !s.is_empty())
}

pub fn write_rows(conn: &Connection, fields: &[&str]) -> rusqlite::Result<()> {
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

pub fn read_all(store: &dyn Store) {
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
