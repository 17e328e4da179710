//! The embedded store: one SQLite file in WAL mode.

use super::{Batch, Store, StoreError, Stored, Summary};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;
use sm4c_host::driver::ParentLink;
use sm4c_host::service::time;
use sm4c_runtime::{Breakpoint, Effect, Entry, Millis, Snapshot};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

/// The store's format. `sm4c-store-2` differs from `sm4c-store-1` only in what new rows look like:
/// a journal row holds the entries one commit appended to an instance (a JSON array, `seq` the
/// last entry's number), where format 1 wrote one row per entry (a JSON object); the instances'
/// `seq` is a plain row id (no deletions, so it still only grows) and the unused `(status, seq)`
/// index is gone. Both kinds of journal row read the same, so a format-1 file is upgraded in
/// place when it is opened; a format-2 file is refused by the versions that read only format 1.
const FORMAT: &str = "sm4c-store-2";
/// The format this version upgrades on open.
const FORMAT_1: &str = "sm4c-store-1";
/// `sm4c-store-3` is `sm4c-store-2` whose journal or open calls may hold an `atMostOnce` call
/// (an `invokeFunction` effect with `"delivery": "atMostOnce"`). A version that reads only format 2
/// would take that call for one to make again after a crash, so a file is stamped format 3 in the
/// commit that first stores such a call, and such versions refuse it. A file that never holds one
/// stays format 2, byte for byte as before.
const FORMAT_3: &str = "sm4c-store-3";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sm4c_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS definitions (
    id TEXT NOT NULL, version TEXT NOT NULL, doc TEXT NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (id, version));
CREATE TABLE IF NOT EXISTS instances (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE, definition TEXT NOT NULL, version TEXT NOT NULL,
    status TEXT NOT NULL, state TEXT, started_at INTEGER, ended_at INTEGER,
    parent TEXT, parent_op TEXT, parent_waits INTEGER NOT NULL DEFAULT 0,
    snapshot TEXT NOT NULL, journal_len INTEGER NOT NULL DEFAULT 0);
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
    seq INTEGER PRIMARY KEY AUTOINCREMENT, event TEXT NOT NULL, expires INTEGER NOT NULL, type TEXT);
CREATE TABLE IF NOT EXISTS breakpoints (
    definition TEXT PRIMARY KEY, breakpoints TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS default_versions (
    definition TEXT PRIMARY KEY, version TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS schedules (
    id TEXT PRIMARY KEY, spec TEXT NOT NULL, state TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, spec TEXT NOT NULL, phase TEXT NOT NULL,
    cursor INTEGER NOT NULL DEFAULT 0, created INTEGER NOT NULL, ended INTEGER);
CREATE TABLE IF NOT EXISTS batch_items (
    seq INTEGER PRIMARY KEY, batch TEXT NOT NULL, instance TEXT NOT NULL,
    started INTEGER NOT NULL DEFAULT 0, outcome TEXT, reason TEXT,
    UNIQUE (batch, instance));
CREATE INDEX IF NOT EXISTS batch_items_outcome ON batch_items (batch, outcome, seq);
";

/// Instance state, journals and timers in one SQLite file (WAL mode).
pub struct SqliteStore {
    conn: Mutex<Connection>,
    /// The file is stamped [`FORMAT_3`].
    format_3: std::sync::atomic::AtomicBool,
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
        // Whether the file is new or of format 1, to be written as this version's format.
        let mut stamp = tables.is_empty();
        let mut format_3 = false;
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
                Some(FORMAT_3) => format_3 = true,
                Some(FORMAT_1) => stamp = true,
                Some(other) => {
                    return Err(StoreError::Foreign(format!(
                        "{name} is an sm4c store of format {other:?}; this version reads {FORMAT:?} and {FORMAT_3:?}"
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
        // Parked events are looked up by their type: a file whose `parked` table has no `type`
        // column (written before it existed) gets one, and the index. Its rows keep a NULL type and
        // are read by every lookup until they expire; versions without the column still read and
        // write the file (they park without a type). Otherwise nothing is written.
        let typed: bool = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('parked') WHERE name = 'type'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(damaged)?
            > 0;
        if !typed {
            conn.execute_batch("ALTER TABLE parked ADD COLUMN type TEXT;")
                .map_err(damaged)?;
        }
        conn.execute_batch(
            "CREATE INDEX IF NOT EXISTS parked_type ON parked (type, seq);
             CREATE INDEX IF NOT EXISTS parked_expires ON parked (expires);",
        )
        .map_err(damaged)?;
        // A new file gets the format; a format-1 file is upgraded (its rows read as they are; the
        // index no query uses any more is dropped, sparing every commit a page). Otherwise opening
        // writes nothing, so a store on a full disk still opens.
        if stamp {
            conn.execute_batch(&format!(
                "BEGIN;
                 DROP INDEX IF EXISTS instances_status;
                 INSERT INTO sm4c_meta (key, value) VALUES ('format', '{FORMAT}')
                   ON CONFLICT (key) DO UPDATE SET value = excluded.value;
                 COMMIT;"
            ))
            .map_err(damaged)?;
        }
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            format_3: format_3.into(),
        })
    }

    pub(super) fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether an open call is `atMostOnce` (what makes a file [`FORMAT_3`]).
fn at_most_once(effect: &Effect) -> bool {
    matches!(
        effect,
        Effect::InvokeFunction {
            delivery: sm4c_runtime::Delivery::AtMostOnce,
            ..
        }
    )
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A row read back, with the checked depth of [`sm4c_runtime::json::read_stored`] (rows deeper
/// than serde_json's default 128 levels read back).
pub(crate) fn parse<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    sm4c_runtime::json::read_stored(text.as_bytes()).map_err(StoreError::Corrupt)
}

/// The entries of one journal row with their numbers: a JSON array of the entries one commit
/// appended, `last` the number of its last one, or (format 1) one entry, numbered `last`.
fn journal_row(last: i64, text: &str) -> Result<Vec<(i64, Entry)>, StoreError> {
    if text.trim_start().starts_with('[') {
        let entries: Vec<Entry> = parse(text)?;
        if entries.is_empty() || last < entries.len() as i64 {
            return Err(StoreError::Corrupt(format!(
                "a journal row numbered {last} holds {} entries",
                entries.len()
            )));
        }
        let first = last - entries.len() as i64 + 1;
        Ok((first..).zip(entries).collect())
    } else {
        Ok(vec![(last, parse(text)?)])
    }
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

    fn definition_rows(&self) -> Result<Vec<super::DefinitionRow>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT id, version, doc FROM definitions ORDER BY seq")?;
        let rows: Vec<(String, String, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<Result<_, _>>()?;
        Ok(rows
            .into_iter()
            .map(|(id, version, doc)| {
                parse(&doc).map_err(|e| match e {
                    StoreError::Corrupt(why) => (id, version, why),
                    other => (id, version, other.to_string()),
                })
            })
            .collect())
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

    fn definition_of(&self, id: &str) -> Result<Option<(String, String)>, StoreError> {
        let conn = self.conn();
        Ok(conn
            .query_row("SELECT definition, version FROM instances WHERE id = ?1", [id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?)
    }

    fn parent_of(&self, id: &str) -> Result<Option<ParentLink>, StoreError> {
        let conn = self.conn();
        let row: Option<(Option<String>, Option<String>, bool)> = conn
            .query_row(
                "SELECT parent, parent_op, parent_waits FROM instances WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        Ok(row.and_then(|(parent, op, waits)| parent.zip(op).map(|(p, o)| ParentLink::from((p, o, waits)))))
    }

    fn schedules(&self) -> Result<Vec<super::ScheduleRow>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT id, spec, state FROM schedules ORDER BY id")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, spec, state) = row?;
            let read = |text: &str, what: &str| {
                sm4c_runtime::json::read_stored::<Value>(text.as_bytes())
                    .map_err(|e| format!("its {what} cannot be read back: {e}"))
            };
            out.push((
                id,
                read(&spec, "specification").and_then(|s| Ok((s, read(&state, "state")?))),
            ));
        }
        Ok(out)
    }

    fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut upsert = tx.prepare_cached(
                "INSERT INTO instances (id, definition, version, status, state, started_at, ended_at, parent, parent_op, parent_waits, snapshot, journal_len)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT (id) DO UPDATE SET version = ?3, status = ?4, state = ?5, started_at = ?6, ended_at = ?7, snapshot = ?11,
                   journal_len = journal_len + ?12
                 RETURNING journal_len",
            )?;
            // One row for what this commit appends to an instance's journal, under the number of
            // its last entry: one B-tree insert instead of one per entry (a three-step workflow
            // appends ten), and fewer pages written to the WAL.
            let mut append = tx.prepare_cached("INSERT INTO journal (instance, seq, entry) VALUES (?1, ?2, ?3)")?;
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
                let journal_len: i64 = upsert.query_row(
                    params![
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
                    ],
                    |r| r.get(0),
                )?;
                if !w.entries.is_empty() {
                    append.execute(params![s.id, journal_len, json(&w.entries)])?;
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
            let mut park = tx.prepare_cached("INSERT INTO parked (event, expires, type) VALUES (?1, ?2, ?3)")?;
            for (ev, exp) in &batch.parked {
                park.execute(params![json(ev), exp, super::parked_type(ev)])?;
            }
            let mut unpark = tx.prepare_cached("DELETE FROM parked WHERE seq = ?1")?;
            for seq in &batch.unparked {
                unpark.execute([seq])?;
            }
            for (id, row) in &batch.schedules {
                match row {
                    Some((spec, state)) => tx
                        .prepare_cached("INSERT OR REPLACE INTO schedules (id, spec, state) VALUES (?1, ?2, ?3)")?
                        .execute(params![id, json(spec), json(state)])?,
                    None => tx
                        .prepare_cached("DELETE FROM schedules WHERE id = ?1")?
                        .execute([id])?,
                };
            }
        }
        let stamp_3 = !self.format_3.load(std::sync::atomic::Ordering::Relaxed)
            && batch.instances.iter().flat_map(|w| &w.calls).any(at_most_once);
        if stamp_3 {
            tx.execute(
                "INSERT INTO sm4c_meta (key, value) VALUES ('format', ?1)
                   ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [FORMAT_3],
            )?;
        }
        tx.commit()?;
        if stamp_3 {
            self.format_3.store(true, std::sync::atomic::Ordering::Relaxed);
        }
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
            "SELECT seq, id, definition, version, status, state, started_at, ended_at, parent FROM instances
             WHERE seq > ?1 AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR definition = ?3) ORDER BY seq LIMIT ?4",
        )?;
        let rows = stmt.query_map(params![after, status, definition, limit as i64], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, Option<String>>(5)?,
                r.get::<_, Option<i64>>(6)?,
                r.get::<_, Option<i64>>(7)?,
                r.get::<_, Option<String>>(8)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            // The row's own columns (the state's name is kept beside the snapshot): a listing
            // reads no snapshot, so one that cannot be read back does not hide the others.
            let (seq, id, definition, version, status, state, started, ended, parent) = row?;
            out.push(Summary {
                id,
                definition,
                version,
                status,
                state,
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
        // Each row holds at least one entry with a number above `after`, so `limit` rows hold
        // enough.
        let rows: Vec<(i64, String)> = stmt
            .query_map(params![id, after, limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let mut out = Vec::with_capacity(limit.min(1024));
        for (last, text) in rows {
            for (seq, entry) in journal_row(last, &text)? {
                if seq > after && out.len() < limit {
                    out.push((seq, entry));
                }
            }
        }
        Ok(out)
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

    fn default_versions(&self) -> Result<Vec<(String, String)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT definition, version FROM default_versions ORDER BY definition")?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }

    fn put_default_version(&self, definition: &str, version: Option<&str>) -> Result<(), StoreError> {
        let conn = self.conn();
        match version {
            None => conn.execute("DELETE FROM default_versions WHERE definition = ?1", [definition])?,
            Some(v) => conn.execute(
                "INSERT OR REPLACE INTO default_versions (definition, version) VALUES (?1, ?2)",
                params![definition, v],
            )?,
        };
        Ok(())
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

    fn outbox(&self, after: i64, limit: usize) -> Result<Vec<super::SentRow>, StoreError> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare_cached("SELECT seq, instance, event FROM outbox WHERE seq > ?1 ORDER BY seq LIMIT ?2")?;
        let rows: Vec<(i64, String, String)> = stmt
            .query_map(params![after, limit as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<Result<_, _>>()?;
        // A sent event that cannot be read back is marked, logged and counted: the page and the
        // rows after it are still served.
        Ok(rows
            .into_iter()
            .map(|(s, i, e)| {
                let event = parse(&e).map_err(|err| {
                    tracing::error!(outbox = s, instance = %i, error = %err, "a sent event cannot be read back; it is listed with a corruptRecord error");
                    if let Some(o) = sm4c_host::metrics::observer() {
                        o.corrupt_record("outbox");
                    }
                    match err {
                        StoreError::Corrupt(why) => why,
                        other => other.to_string(),
                    }
                });
                (s, i, event)
            })
            .collect())
    }

    fn parked(&self, now: Millis) -> Result<Vec<(i64, Value)>, StoreError> {
        let conn = self.conn();
        conn.prepare_cached("DELETE FROM parked WHERE expires <= ?1")?
            .execute([now])?;
        let mut stmt = conn.prepare_cached("SELECT seq, event FROM parked ORDER BY seq")?;
        let rows: Vec<(i64, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        Ok(read_parked(rows))
    }

    fn parked_of(&self, now: Millis, types: Option<&BTreeSet<String>>) -> Result<Vec<(i64, Value)>, StoreError> {
        let Some(types) = types else {
            return self.parked(now);
        };
        let conn = self.conn();
        conn.prepare_cached("DELETE FROM parked WHERE expires <= ?1")?
            .execute([now])?;
        // Through the `(type, seq)` index: one range per type, and the rows parked before the
        // column existed (NULL type).
        let mut rows: Vec<(i64, String)> = Vec::new();
        let mut stmt = conn.prepare_cached("SELECT seq, event FROM parked WHERE type IS NULL")?;
        for row in stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))? {
            rows.push(row?);
        }
        let mut stmt = conn.prepare_cached("SELECT seq, event FROM parked WHERE type = ?1")?;
        for ty in types {
            for row in stmt.query_map([ty], |r| Ok((r.get(0)?, r.get(1)?)))? {
                rows.push(row?);
            }
        }
        rows.sort_unstable_by_key(|(s, _)| *s);
        Ok(read_parked(rows))
    }

    fn parked_totals(&self, now: Millis) -> Result<(usize, u64), StoreError> {
        let conn = self.conn();
        conn.prepare_cached("DELETE FROM parked WHERE expires <= ?1")?
            .execute([now])?;
        let (count, bytes): (i64, i64) = conn.query_row(
            "SELECT count(*), coalesce(sum(length(CAST(event AS BLOB))), 0) FROM parked",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok((count.max(0) as usize, bytes.max(0) as u64))
    }
}

/// Parked rows read back. One that cannot be read back belongs to no instance yet: it is passed
/// over (logged and counted) rather than stop the server from starting.
fn read_parked(rows: Vec<(i64, String)>) -> Vec<(i64, Value)> {
    rows.into_iter()
        .filter_map(|(s, e)| match parse(&e) {
            Ok(event) => Some((s, event)),
            Err(err) => {
                tracing::error!(parked = s, error = %err, "a parked event cannot be read back; it is passed over");
                if let Some(o) = sm4c_host::metrics::observer() {
                    o.corrupt_record("parked");
                }
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::InstanceWrite;
    use serde_json::json;

    fn snapshot(id: &str) -> Snapshot {
        serde_json::from_value(json!({
            "id": id, "definition": "three", "version": "1", "status": "running", "data": {},
            "state": 0, "stateName": "One", "visit": 1, "firings": 0, "phase": {"phase": "waiting"},
            "stateTimer": null, "inbox": [], "timers": {}, "now": 0, "startedAt": 0, "endedAt": null,
            "rng": 1, "bindings": {}, "error": null
        }))
        .expect("a snapshot")
    }

    fn entry(n: i64) -> Entry {
        serde_json::from_value(json!({"entry": "trace", "step": "stateEntered", "state": format!("S{n}")}))
            .expect("an entry")
    }

    fn write(store: &SqliteStore, id: &str, entries: Vec<Entry>) {
        let batch = Batch {
            instances: vec![InstanceWrite {
                snapshot: snapshot(id),
                parent: None,
                entries,
                calls: Vec::new(),
                origin: None,
            }],
            ..Batch::default()
        };
        store.commit(&batch).expect("commit");
    }

    fn seqs(store: &SqliteStore, id: &str, after: i64, limit: usize) -> Vec<(i64, Value)> {
        store
            .history(id, after, limit)
            .expect("history")
            .into_iter()
            .map(|(s, e)| (s, serde_json::to_value(e).expect("json")))
            .collect()
    }

    #[test]
    fn history_pages_through_the_entries_of_each_commit_in_order_whatever_the_cursor_and_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("s.db")).expect("open");
        // Commits of 3, 1, 0 and 4 entries; the same id twice in one batch counts on.
        let mut n = 0;
        for size in [3, 1, 0, 4] {
            write(&store, "i", (0..size).map(|k| entry(n + k)).collect());
            n += size;
        }
        let batch = Batch {
            instances: (0..2)
                .map(|k| InstanceWrite {
                    snapshot: snapshot("i"),
                    parent: None,
                    entries: vec![entry(n + 2 * k), entry(n + 2 * k + 1)],
                    calls: Vec::new(),
                    origin: None,
                })
                .collect(),
            ..Batch::default()
        };
        store.commit(&batch).expect("commit");
        n += 4;
        write(&store, "other", vec![entry(100)]);
        let all: Vec<(i64, Value)> = (0..n)
            .map(|k| (k + 1, serde_json::to_value(entry(k)).expect("json")))
            .collect();
        assert_eq!(seqs(&store, "i", 0, 1000), all);
        assert_eq!(store.instance("i").expect("read").expect("stored").journal_len, n);
        for after in 0..=n {
            for limit in 0..=(n as usize + 1) {
                let want: Vec<_> = all.iter().filter(|(s, _)| *s > after).take(limit).cloned().collect();
                assert_eq!(seqs(&store, "i", after, limit), want, "after {after}, limit {limit}");
            }
        }
        assert_eq!(seqs(&store, "other", 0, 10).len(), 1);
    }

    #[test]
    fn a_format_1_store_is_upgraded_on_open_and_its_journal_reads_on_with_the_new_rows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("old.db");
        {
            // What format 1 wrote: one journal row per entry, the (status, seq) index.
            let c = Connection::open(&path).expect("open");
            c.execute_batch(&SCHEMA.replace("seq INTEGER PRIMARY KEY,", "seq INTEGER PRIMARY KEY AUTOINCREMENT,"))
                .expect("schema");
            c.execute_batch(
                "CREATE INDEX instances_status ON instances (status, seq);
                 INSERT INTO sm4c_meta (key, value) VALUES ('format', 'sm4c-store-1');",
            )
            .expect("format 1");
            c.execute(
                "INSERT INTO instances (id, definition, version, status, snapshot, journal_len)
                 VALUES ('i', 'three', '1', 'running', ?1, 2)",
                [json(&snapshot("i"))],
            )
            .expect("instance");
            for k in 0..2 {
                c.execute(
                    "INSERT INTO journal (instance, seq, entry) VALUES ('i', ?1, ?2)",
                    params![k + 1, json(&entry(k))],
                )
                .expect("entry");
            }
        }
        let store = SqliteStore::open(&path).expect("a format-1 store opens");
        write(&store, "i", vec![entry(2), entry(3)]);
        let want: Vec<(i64, Value)> = (0..4)
            .map(|k| (k + 1, serde_json::to_value(entry(k)).expect("json")))
            .collect();
        assert_eq!(seqs(&store, "i", 0, 10), want);
        assert_eq!(seqs(&store, "i", 1, 2), want[1..3].to_vec());
        let c = store.conn();
        let format: String = c
            .query_row("SELECT value FROM sm4c_meta WHERE key = 'format'", [], |r| r.get(0))
            .expect("format");
        assert_eq!(format, FORMAT);
        let index: Option<String> = c
            .query_row(
                "SELECT name FROM sqlite_master WHERE name = 'instances_status'",
                [],
                |r| r.get(0),
            )
            .optional()
            .expect("schema");
        assert_eq!(index, None);
    }

    fn event(ty: &str, n: u32) -> Value {
        serde_json::json!({"specversion": "1.0", "id": format!("{ty}-{n}"), "source": "t", "type": ty})
    }

    fn park(store: &SqliteStore, events: &[Value], expires: Millis) {
        let batch = Batch {
            parked: events.iter().map(|e| (e.clone(), expires)).collect(),
            ..Batch::default()
        };
        store.commit(&batch).expect("park");
    }

    fn ids(rows: &[(i64, Value)]) -> Vec<&str> {
        rows.iter().map(|(_, e)| e["id"].as_str().unwrap_or_default()).collect()
    }

    #[test]
    fn parked_events_are_read_by_type_through_an_index_and_expire() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("s.db")).expect("open");
        park(
            &store,
            &[event("a", 1), event("b", 1), event("c", 1), event("a", 2)],
            1_000,
        );
        park(&store, &[event("b", 2)], 10);
        let types: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        assert_eq!(
            ids(&store.parked_of(0, Some(&types)).expect("read")),
            ["a-1", "b-1", "a-2", "b-2"]
        );
        assert_eq!(
            ids(&store.parked_of(0, Some(&BTreeSet::new())).expect("read")),
            Vec::<&str>::new()
        );
        assert_eq!(ids(&store.parked_of(0, None).expect("read")).len(), 5);
        // Expired at 10: gone from lookups and totals.
        assert_eq!(
            ids(&store.parked_of(10, Some(&types)).expect("read")),
            ["a-1", "b-1", "a-2"]
        );
        let (count, bytes) = store.parked_totals(10).expect("totals");
        let want: u64 = [event("a", 1), event("b", 1), event("c", 1), event("a", 2)]
            .iter()
            .map(super::super::parked_size)
            .sum();
        assert_eq!((count, bytes), (4, want));
        // The lookup by type goes through the index, not over every parked row.
        let c = store.conn();
        let plan: Vec<String> = c
            .prepare("EXPLAIN QUERY PLAN SELECT seq, event FROM parked WHERE type = ?1")
            .and_then(|mut s| s.query_map(["a"], |r| r.get::<_, String>(3))?.collect())
            .expect("plan");
        assert!(plan.iter().any(|p| p.contains("USING INDEX parked_type")), "{plan:?}");
    }

    #[test]
    fn a_store_whose_parked_events_have_no_type_gets_the_column_and_keeps_its_parked_events() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("old.db");
        {
            // What the versions before the `type` column wrote.
            let c = Connection::open(&path).expect("open");
            c.execute_batch(&SCHEMA.replace(", expires INTEGER NOT NULL, type TEXT)", ", expires INTEGER NOT NULL)"))
                .expect("schema");
            c.execute("INSERT INTO sm4c_meta (key, value) VALUES ('format', ?1)", [FORMAT])
                .expect("format");
            for e in [event("a", 1), event("b", 1)] {
                c.execute(
                    "INSERT INTO parked (event, expires) VALUES (?1, ?2)",
                    params![json(&e), 1_000],
                )
                .expect("parked");
            }
            let typed: i64 = c
                .query_row(
                    "SELECT count(*) FROM pragma_table_info('parked') WHERE name = 'type'",
                    [],
                    |r| r.get(0),
                )
                .expect("columns");
            assert_eq!(typed, 0, "the old schema has no type column");
        }
        let store = SqliteStore::open(&path).expect("an old store opens");
        park(&store, &[event("a", 2), event("c", 1)], 1_000);
        // The old rows have no type: every lookup reads them (they expire with the window).
        let types: BTreeSet<String> = ["a".to_string()].into();
        assert_eq!(
            ids(&store.parked_of(0, Some(&types)).expect("read")),
            ["a-1", "b-1", "a-2"]
        );
        assert_eq!(ids(&store.parked(0).expect("read")), ["a-1", "b-1", "a-2", "c-1"]);
        drop(store);
        // Opened again: nothing more to migrate, the same rows.
        let store = SqliteStore::open(&path).expect("opens again");
        assert_eq!(store.parked_totals(0).expect("totals").0, 4);
    }

    #[test]
    fn a_store_of_a_later_format_is_refused_by_name_and_left_as_it_was() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("new.db");
        drop(SqliteStore::open(&path).expect("open"));
        Connection::open(&path)
            .and_then(|c| c.execute("UPDATE sm4c_meta SET value = 'sm4c-store-4' WHERE key = 'format'", []))
            .expect("stamp a later format");
        let err = SqliteStore::open(&path).err().expect("refused").to_string();
        assert!(err.contains("\"sm4c-store-4\"") && err.contains(FORMAT), "{err}");
        let format: String = Connection::open(&path)
            .and_then(|c| c.query_row("SELECT value FROM sm4c_meta WHERE key = 'format'", [], |r| r.get(0)))
            .expect("format");
        assert_eq!(format, "sm4c-store-4");
    }

    #[test]
    fn a_journal_row_numbered_below_its_entry_count_is_corrupt_not_a_panic() {
        let err = journal_row(1, &json(&vec![entry(0), entry(1)])).expect_err("corrupt");
        assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
        assert!(matches!(journal_row(3, "[]"), Err(StoreError::Corrupt(_))));
        assert!(matches!(journal_row(3, "[1]"), Err(StoreError::Corrupt(_))));
        assert_eq!(journal_row(5, &json(&entry(0))).expect("format 1 row").len(), 1);
    }

    /// Values written through the store read back equal at every depth the door lets in and past
    /// serde_json's 128 levels; deeper than the read depth is a corrupt record, never a stack
    /// overflow (the store_roundtrip fuzz target does the same with arbitrary values).
    #[test]
    fn values_written_read_back_up_to_the_read_depth_and_deeper_is_a_corrupt_record() {
        use sm4c_runtime::json::{from_val, to_val, MAX_DEPTH, READ_DEPTH};
        let nested = |levels: usize| (0..levels).fold(json!({"s": "[{\\\""}), |v, _| json!([v]));
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("s.db")).expect("open");
        for levels in [0, MAX_DEPTH, 130, READ_DEPTH - 8, READ_DEPTH + 1, 600] {
            let v = nested(levels);
            let id = format!("i{levels}");
            let mut snap = snapshot(&id);
            snap.data.0 = to_val(&v);
            let batch = Batch {
                instances: vec![InstanceWrite {
                    snapshot: snap,
                    parent: None,
                    entries: Vec::new(),
                    calls: Vec::new(),
                    origin: None,
                }],
                outbox: vec![(id.clone(), v.clone(), 0)],
                parked: vec![(v.clone(), i64::MAX)],
                ..Batch::default()
            };
            store.commit(&batch).expect("commit");
            let read = store.instance(&id);
            let sent = store.outbox(0, usize::MAX);
            if levels + 4 <= READ_DEPTH {
                let data = from_val(&read.expect("reads back").expect("the instance").snapshot.data.0);
                assert_eq!(data, v, "{levels} levels");
                let sent = sent.expect("reads back");
                assert_eq!(sent.last().map(|(_, _, e)| e), Some(&Ok(v.clone())), "{levels} levels");
                let parked = store.parked(0).expect("reads back");
                assert_eq!(parked.last().map(|(_, e)| e), Some(&v), "{levels} levels");
            } else {
                let err = read.map(|s| s.is_some()).expect_err("too deep to read back");
                assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
                assert!(err.to_string().contains("more than the 256"), "{err}");
                // A sent event that cannot be read back is marked in its page, not a failed page.
                let sent = sent.expect("the page reads");
                assert!(
                    matches!(sent.last(), Some((_, i, Err(why))) if *i == id && why.contains("more than the 256")),
                    "{sent:?}"
                );
                // A parked event that cannot be read back is passed over, the others still read.
                let parked = store.parked(0).expect("the others read back");
                assert!(parked.iter().all(|(_, e)| e != &v));
                // The sent event of this level, which cannot be read back, is not left for the next.
                let conn = store.conn();
                conn.execute("DELETE FROM outbox WHERE instance = ?1", [&id])
                    .expect("delete");
            }
        }
    }
}
