//! The embedded store: one SQLite file in WAL mode.

use super::{Batch, Store, StoreError, Stored, Summary};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;
use sm4c_host::driver::ParentLink;
use sm4c_host::service::time;
use sm4c_runtime::{Breakpoint, Effect, Entry, Millis, Snapshot};
use std::path::Path;
use std::sync::Mutex;

const FORMAT: &str = "sm4c-store-1";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sm4c_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS definitions (
    id TEXT NOT NULL, version TEXT NOT NULL, doc TEXT NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (id, version));
CREATE TABLE IF NOT EXISTS instances (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE, definition TEXT NOT NULL, version TEXT NOT NULL,
    status TEXT NOT NULL, state TEXT, started_at INTEGER, ended_at INTEGER,
    parent TEXT, parent_op TEXT, parent_waits INTEGER NOT NULL DEFAULT 0,
    snapshot TEXT NOT NULL, journal_len INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS instances_status ON instances (status, seq);
CREATE INDEX IF NOT EXISTS instances_definition ON instances (definition, version, status);
CREATE TABLE IF NOT EXISTS journal (
    instance TEXT NOT NULL, seq INTEGER NOT NULL, entry TEXT NOT NULL,
    PRIMARY KEY (instance, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS timers (
    instance TEXT NOT NULL, timer TEXT NOT NULL, due INTEGER NOT NULL,
    PRIMARY KEY (instance, timer)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS calls (
    instance TEXT NOT NULL, op TEXT NOT NULL, effect TEXT NOT NULL,
    PRIMARY KEY (instance, op)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, instance TEXT NOT NULL, event TEXT NOT NULL, at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS origins (
    instance TEXT PRIMARY KEY, traceparent TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS parked (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, event TEXT NOT NULL, expires INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS breakpoints (
    definition TEXT PRIMARY KEY, breakpoints TEXT NOT NULL) WITHOUT ROWID;
";

/// Instance state, journals and timers in one SQLite file (WAL mode).
pub struct SqliteStore {
    conn: Mutex<Connection>,
}

impl SqliteStore {
    /// Opens (or creates) a store file. A file from a crashed server opens cleanly (SQLite recovers
    /// its WAL); a file that is not an sm4c store is refused.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let name = path.display().to_string();
        // On a full disk even reading fails (the write-ahead log's index cannot grow): say so,
        // rather than call the file foreign or damaged.
        let full = |e: &rusqlite::Error| {
            super::disk_full(e)
                .then(|| StoreError::Full(format!("cannot open {name} ({e}); free space and start again")))
        };
        let not_ours = |e: rusqlite::Error| {
            full(&e).unwrap_or_else(|| {
                StoreError::Foreign(format!(
                    "{name} is not an sm4c store (not a readable SQLite database: {e})"
                ))
            })
        };
        let damaged = |e: rusqlite::Error| {
            full(&e).unwrap_or_else(|| StoreError::Foreign(format!("{name} is a damaged sm4c store: {e}")))
        };
        let conn = Connection::open(path).map_err(not_ours)?;
        // Identify the file before changing anything in it (a foreign file must stay untouched).
        let tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(not_ours)?;
        if !tables.is_empty() {
            let format: Option<String> = if tables.iter().any(|t| t == "sm4c_meta") {
                conn.query_row("SELECT value FROM sm4c_meta WHERE key = 'format'", [], |r| r.get(0))
                    .optional()
                    .map_err(damaged)?
            } else {
                None
            };
            match format.as_deref() {
                Some(FORMAT) => {}
                Some(other) => {
                    return Err(StoreError::Foreign(format!(
                        "{name} is an sm4c store of format {other:?}; this version reads {FORMAT:?}"
                    )))
                }
                None => {
                    return Err(StoreError::Foreign(format!(
                        "{name} is a SQLite database of another application (tables: {}); give sm4c its own file",
                        tables.join(", ")
                    )))
                }
            }
            let check: String = conn
                .query_row("PRAGMA quick_check", [], |r| r.get(0))
                .map_err(damaged)?;
            if check != "ok" {
                return Err(StoreError::Foreign(format!("{name} is a damaged sm4c store: {check}")));
            }
        }
        conn.pragma_update(None, "journal_mode", "WAL").map_err(damaged)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(damaged)?;
        conn.busy_timeout(std::time::Duration::from_secs(10)).map_err(damaged)?;
        conn.execute_batch(SCHEMA).map_err(damaged)?;
        conn.execute(
            "INSERT OR IGNORE INTO sm4c_meta (key, value) VALUES ('format', ?1)",
            [FORMAT],
        )
        .map_err(damaged)?;
        Ok(SqliteStore { conn: Mutex::new(conn) })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn parse<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(e.to_string()))
}

impl Store for SqliteStore {
    fn put_definition(&self, id: &str, version: &str, doc: &Value) -> Result<bool, StoreError> {
        let conn = self.conn();
        let existing: Option<String> = conn
            .query_row(
                "SELECT doc FROM definitions WHERE id = ?1 AND version = ?2",
                params![id, version],
                |r| r.get(0),
            )
            .optional()?;
        match existing {
            Some(text) if parse::<Value>(&text)? == *doc => Ok(false),
            Some(_) => Err(StoreError::Conflict {
                id: id.into(),
                version: version.into(),
            }),
            None => {
                conn.execute(
                    "INSERT INTO definitions (id, version, doc, seq) VALUES (?1, ?2, ?3, (SELECT COUNT(*) FROM definitions))",
                    params![id, version, json(doc)],
                )?;
                Ok(true)
            }
        }
    }

    fn definitions(&self) -> Result<Vec<Value>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT doc FROM definitions ORDER BY seq")?;
        let rows: Vec<String> = stmt.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?;
        rows.iter().map(|t| parse(t)).collect()
    }

    fn instance(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let conn = self.conn();
        type Row = (String, Option<String>, Option<String>, bool, i64);
        // Cached: every start asks whether its id is taken, and parsing the query each time was
        // about 6% of the server's CPU at one client.
        let row: Option<Row> = conn
            .prepare_cached(
                "SELECT snapshot, parent, parent_op, parent_waits, journal_len FROM instances WHERE id = ?1",
            )?
            .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
            .optional()?;
        row.map(|(snap, parent, op, waits, journal_len)| {
            Ok(Stored {
                snapshot: parse::<Snapshot>(&snap)?,
                parent: parent.zip(op).map(|(p, o)| ParentLink::from((p, o, waits))),
                journal_len,
            })
        })
        .transpose()
    }

    fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut upsert = tx.prepare_cached(
                "INSERT INTO instances (id, definition, version, status, state, started_at, ended_at, parent, parent_op, parent_waits, snapshot, journal_len)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT (id) DO UPDATE SET status = ?4, state = ?5, started_at = ?6, ended_at = ?7, snapshot = ?11,
                   journal_len = journal_len + ?12",
            )?;
            let mut append = tx.prepare_cached(
                "INSERT INTO journal (instance, seq, entry) VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM journal WHERE instance = ?1), ?2)",
            )?;
            let mut clear_timers = tx.prepare_cached("DELETE FROM timers WHERE instance = ?1")?;
            let mut timer = tx.prepare_cached("INSERT INTO timers (instance, timer, due) VALUES (?1, ?2, ?3)")?;
            let mut clear_calls = tx.prepare_cached("DELETE FROM calls WHERE instance = ?1")?;
            let mut call = tx.prepare_cached("INSERT INTO calls (instance, op, effect) VALUES (?1, ?2, ?3)")?;
            let mut origin =
                tx.prepare_cached("INSERT OR IGNORE INTO origins (instance, traceparent) VALUES (?1, ?2)")?;
            for w in &batch.instances {
                let s = &w.snapshot;
                let state = s.state_name.as_deref();
                let (parent, op, waits) = match &w.parent {
                    Some(l) => (Some(l.instance.as_str()), Some(l.op.as_str()), l.waits),
                    None => (None, None, false),
                };
                upsert.execute(params![
                    s.id,
                    s.definition,
                    s.version,
                    s.status.as_str(),
                    state,
                    s.started_at,
                    s.ended_at,
                    parent,
                    op,
                    waits,
                    json(s),
                    w.entries.len() as i64
                ])?;
                for e in &w.entries {
                    append.execute(params![s.id, json(e)])?;
                }
                if let Some(tp) = &w.origin {
                    origin.execute(params![s.id, tp])?;
                }
                clear_timers.execute([&s.id])?;
                for (t, due) in &s.timers {
                    timer.execute(params![s.id, t, due])?;
                }
                clear_calls.execute([&s.id])?;
                for effect in &w.calls {
                    call.execute(params![s.id, sm4c_host::driver::op_of(effect), json(effect)])?;
                }
            }
            let mut out = tx.prepare_cached("INSERT INTO outbox (instance, event, at) VALUES (?1, ?2, ?3)")?;
            for (inst, ev, at) in &batch.outbox {
                out.execute(params![inst, json(ev), at])?;
            }
            let mut park = tx.prepare_cached("INSERT INTO parked (event, expires) VALUES (?1, ?2)")?;
            for (ev, exp) in &batch.parked {
                park.execute(params![json(ev), exp])?;
            }
            let mut unpark = tx.prepare_cached("DELETE FROM parked WHERE seq = ?1")?;
            for seq in &batch.unparked {
                unpark.execute([seq])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn list(
        &self,
        status: Option<&str>,
        definition: Option<&str>,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Summary>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT seq, id, definition, version, status, snapshot, started_at, ended_at, parent FROM instances
             WHERE seq > ?1 AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR definition = ?3) ORDER BY seq LIMIT ?4",
        )?;
        let rows = stmt.query_map(params![after, status, definition, limit as i64], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, Option<i64>>(6)?,
                r.get::<_, Option<i64>>(7)?,
                r.get::<_, Option<String>>(8)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, id, definition, version, status, snap, started, ended, parent) = row?;
            let snapshot: Snapshot = parse(&snap)?;
            out.push(Summary {
                id,
                definition,
                version,
                status,
                state: snapshot.state_name.clone(),
                started_at: time(started),
                ended_at: time(ended),
                parent,
                seq,
            });
        }
        Ok(out)
    }

    fn history(&self, id: &str, after: i64, limit: usize) -> Result<Vec<(i64, Entry)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached("SELECT seq, entry FROM journal WHERE instance = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3")?;
        let rows: Vec<(i64, String)> = stmt
            .query_map(params![id, after, limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        rows.into_iter().map(|(s, e)| Ok((s, parse(&e)?))).collect()
    }

    fn timers(&self) -> Result<Vec<(String, String, Millis)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT instance, timer, due FROM timers ORDER BY due")?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }

    fn calls(&self) -> Result<Vec<(String, Effect)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT instance, effect FROM calls")?;
        let rows: Vec<(String, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        rows.into_iter().map(|(i, e)| Ok((i, parse(&e)?))).collect()
    }

    fn calls_of(&self, instance: &str) -> Result<Vec<Effect>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT effect FROM calls WHERE instance = ?1")?;
        let rows: Vec<String> = stmt.query_map([instance], |r| r.get(0))?.collect::<Result<_, _>>()?;
        rows.iter().map(|e| parse(e)).collect()
    }

    fn breakpoints(&self) -> Result<Vec<(String, Vec<Breakpoint>)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT definition, breakpoints FROM breakpoints ORDER BY definition")?;
        let rows: Vec<(String, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        rows.into_iter().map(|(d, b)| Ok((d, parse(&b)?))).collect()
    }

    fn put_breakpoints(&self, definition: &str, breakpoints: &[Breakpoint]) -> Result<(), StoreError> {
        let conn = self.conn();
        if breakpoints.is_empty() {
            conn.execute("DELETE FROM breakpoints WHERE definition = ?1", [definition])?;
        } else {
            conn.execute(
                "INSERT OR REPLACE INTO breakpoints (definition, breakpoints) VALUES (?1, ?2)",
                params![definition, json(&breakpoints)],
            )?;
        }
        Ok(())
    }

    fn origin(&self, instance: &str) -> Result<Option<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT traceparent FROM origins WHERE instance = ?1")?;
        Ok(stmt.query_row([instance], |r| r.get(0)).optional()?)
    }

    fn active(&self, definitions: &[(String, String)]) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT id FROM instances WHERE definition = ?1 AND version = ?2 AND status IN ('running', 'waiting', 'created', 'paused') ORDER BY seq",
        )?;
        let mut out = Vec::new();
        for (d, v) in definitions {
            let ids: Vec<String> = stmt.query_map(params![d, v], |r| r.get(0))?.collect::<Result<_, _>>()?;
            out.extend(ids);
        }
        Ok(out)
    }

    fn outbox(&self, after: i64, limit: usize) -> Result<Vec<(i64, String, Value)>, StoreError> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare_cached("SELECT seq, instance, event FROM outbox WHERE seq > ?1 ORDER BY seq LIMIT ?2")?;
        let rows: Vec<(i64, String, String)> = stmt
            .query_map(params![after, limit as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<Result<_, _>>()?;
        rows.into_iter().map(|(s, i, e)| Ok((s, i, parse(&e)?))).collect()
    }

    fn parked(&self, now: Millis) -> Result<Vec<(i64, Value)>, StoreError> {
        let conn = self.conn();
        conn.prepare_cached("DELETE FROM parked WHERE expires <= ?1")?
            .execute([now])?;
        let mut stmt = conn.prepare_cached("SELECT seq, event FROM parked ORDER BY seq")?;
        let rows: Vec<(i64, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        rows.into_iter().map(|(s, e)| Ok((s, parse(&e)?))).collect()
    }
}
