//! [Local stores](sm4c_host::local) in SQLite: one file per store in a directory that one process
//! holds at a time.

use rusqlite::{params, Connection, OptionalExtension};
use sm4c_host::local::{Checkpoint, LocalError, LocalStore, LocalStores};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The layout of a store file; a file of another layout is cleared (a store is a cache).
const LAYOUT: i64 = 1;

/// Stores in a directory, one SQLite file each (`<name>.sqlite`), WAL mode, written without
/// waiting for the disk: a store is rebuilt from its log when it is lost, so a crash may cost a
/// longer restore but never data.
pub struct SqliteStores {
    dir: PathBuf,
    /// Held while this process uses the directory: a second process is refused.
    _lock: Mutex<Connection>,
    /// Removed when dropped.
    temporary: bool,
}

impl SqliteStores {
    /// Opens `dir` (created when missing) for this process alone.
    pub fn open(dir: &Path) -> Result<SqliteStores, LocalError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| LocalError(format!("cannot create the state directory {}: {e}", dir.display())))?;
        // SQLite's own file lock, held for the life of the stores: an exclusive transaction on a
        // file of its own (no other process, nor another opening in this one, can take it).
        let lock_path = dir.join("LOCK.sqlite");
        let lock = Connection::open(&lock_path)
            .and_then(|c| {
                c.execute_batch("PRAGMA busy_timeout = 0; PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE;")?;
                Ok(c)
            })
            .map_err(|e| match e.sqlite_error_code() {
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => LocalError(format!(
                    "the state directory {} is in use by another process; give each worker its own",
                    dir.display()
                )),
                _ => LocalError(format!("cannot lock {}: {e}", lock_path.display())),
            })?;
        Ok(SqliteStores {
            dir: dir.to_path_buf(),
            _lock: Mutex::new(lock),
            temporary: false,
        })
    }

    /// A directory of this process's own under the system's temporary directory, removed when
    /// the stores are dropped. Directories that processes no longer running left behind (killed
    /// before they could remove theirs) are removed first.
    pub fn temporary() -> Result<SqliteStores, LocalError> {
        let base = std::env::temp_dir();
        sweep(&base);
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = base.join(format!("{TEMPORARY_PREFIX}{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut s = SqliteStores::open(&dir)?;
        s.temporary = true;
        Ok(s)
    }
}

const TEMPORARY_PREFIX: &str = "sm4c-local-";

/// Removes the temporary store directories that no process holds any more (a killed worker could
/// not remove its own): those whose lock can be taken, and that are more than a minute old (one
/// being made this moment is not locked yet).
fn sweep(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(TEMPORARY_PREFIX) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(60));
        if old && SqliteStores::open(&e.path()).is_ok() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl Drop for SqliteStores {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl LocalStores for SqliteStores {
    fn open(&self, name: &str) -> Result<Arc<dyn LocalStore>, LocalError> {
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = self.dir.join(format!("{safe}.sqlite"));
        let store = SqliteStore::open(&path).or_else(|e| {
            // A damaged file is a lost cache: start it again.
            tracing::warn!(path = %path.display(), error = %e, "a local store does not open; it is rebuilt");
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            SqliteStore::open(&path)
        })?;
        Ok(Arc::new(store))
    }

    fn describe(&self) -> String {
        if self.temporary {
            format!("{} (temporary)", self.dir.display())
        } else {
            self.dir.display().to_string()
        }
    }
}

struct SqliteStore {
    conn: Mutex<Connection>,
}

fn err(path: &str) -> impl Fn(rusqlite::Error) -> LocalError + '_ {
    move |e| LocalError(format!("local store {path}: {e}"))
}

impl SqliteStore {
    fn open(path: &Path) -> Result<SqliteStore, LocalError> {
        let name = path.display().to_string();
        let e = err(&name);
        let conn = Connection::open(path).map_err(&e)?;
        // A small page cache (1 MB): a worker has a store per partition it owns, and reads one
        // whole only when the partition is restored.
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF; PRAGMA busy_timeout=5000; PRAGMA cache_size=-1024;",
        )
        .map_err(&e)?;
        let layout: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(&e)?;
        if layout != LAYOUT {
            conn.execute_batch(&format!(
                "DROP TABLE IF EXISTS entries; DROP TABLE IF EXISTS checkpoint;
                 CREATE TABLE entries (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
                 CREATE TABLE checkpoint (one INTEGER PRIMARY KEY CHECK (one = 1),
                     offset INTEGER NOT NULL, written_ms INTEGER NOT NULL);
                 PRAGMA user_version = {LAYOUT};"
            ))
            .map_err(&e)?;
        }
        Ok(SqliteStore { conn: Mutex::new(conn) })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The key and value of a row of `entries` (selected in that order).
fn entry<'r>(r: &'r rusqlite::Row<'_>) -> Result<(&'r str, &'r [u8]), LocalError> {
    let k = r
        .get_ref(0)
        .map_err(fail)?
        .as_str()
        .map_err(|e| LocalError(e.to_string()))?;
    let v = r
        .get_ref(1)
        .map_err(fail)?
        .as_blob()
        .map_err(|e| LocalError(e.to_string()))?;
    Ok((k, v))
}

fn fail(e: rusqlite::Error) -> LocalError {
    LocalError(format!("local store: {e}"))
}

impl LocalStore for SqliteStore {
    fn checkpoint(&self) -> Result<Option<Checkpoint>, LocalError> {
        self.conn()
            .query_row("SELECT offset, written_ms FROM checkpoint WHERE one = 1", [], |r| {
                Ok(Checkpoint {
                    offset: r.get(0)?,
                    written_ms: r.get(1)?,
                })
            })
            .optional()
            .map_err(fail)
    }

    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) -> Result<(), LocalError> {
        let conn = self.conn();
        let mut q = conn.prepare("SELECT key, value FROM entries").map_err(fail)?;
        let mut rows = q.query([]).map_err(fail)?;
        while let Some(r) = rows.next().map_err(fail)? {
            let (k, v) = entry(r)?;
            f(k, v);
        }
        Ok(())
    }

    fn scan(&self, prefix: &str, f: &mut dyn FnMut(&str, &[u8])) -> Result<(), LocalError> {
        self.scan_from(prefix, prefix, &mut |k, v| {
            f(k, v);
            true
        })
    }

    fn scan_from(&self, prefix: &str, from: &str, f: &mut dyn FnMut(&str, &[u8]) -> bool) -> Result<(), LocalError> {
        let conn = self.conn();
        let mut q = conn
            .prepare_cached("SELECT key, value FROM entries WHERE key >= ?1 ORDER BY key")
            .map_err(fail)?;
        let start = if from > prefix { from } else { prefix };
        let mut rows = q.query([start]).map_err(fail)?;
        while let Some(r) = rows.next().map_err(fail)? {
            let (k, v) = entry(r)?;
            if !k.starts_with(prefix) || !f(k, v) {
                break;
            }
        }
        Ok(())
    }

    fn count(&self, prefix: &str) -> Result<usize, LocalError> {
        // The keys that start with `prefix` lie between it and the prefix with its last character
        // raised by one, as SQLite compares text byte by byte (an index range, not a pass).
        let mut chars: Vec<char> = prefix.chars().collect();
        let bound = chars
            .pop()
            .and_then(|c| char::from_u32(c as u32 + 1))
            .map(|c| chars.into_iter().chain([c]).collect::<String>());
        let conn = self.conn();
        let n: i64 = match bound {
            Some(end) => conn
                .prepare_cached("SELECT count(*) FROM entries WHERE key >= ?1 AND key < ?2")
                .and_then(|mut q| q.query_row(params![prefix, end], |r| r.get(0)))
                .map_err(fail)?,
            None if prefix.is_empty() => conn
                .query_row("SELECT count(*) FROM entries", [], |r| r.get(0))
                .map_err(fail)?,
            None => {
                drop(conn);
                let mut n = 0;
                self.scan(prefix, &mut |_, _| n += 1)?;
                return Ok(n);
            }
        };
        Ok(n as usize)
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, LocalError> {
        self.conn()
            .query_row("SELECT value FROM entries WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(fail)
    }

    fn apply(&self, changes: &[(&str, Option<&[u8]>)], checkpoint: Option<Checkpoint>) -> Result<(), LocalError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(fail)?;
        {
            let mut put = tx
                .prepare_cached("INSERT OR REPLACE INTO entries (key, value) VALUES (?1, ?2)")
                .map_err(fail)?;
            let mut delete = tx.prepare_cached("DELETE FROM entries WHERE key = ?1").map_err(fail)?;
            for (k, v) in changes {
                match v {
                    Some(v) => put.execute(params![k, v]).map_err(fail)?,
                    None => delete.execute([k]).map_err(fail)?,
                };
            }
            if let Some(c) = checkpoint {
                tx.execute(
                    "INSERT OR REPLACE INTO checkpoint (one, offset, written_ms) VALUES (1, ?1, ?2)",
                    params![c.offset, c.written_ms],
                )
                .map_err(fail)?;
            }
        }
        tx.commit().map_err(fail)
    }

    fn clear(&self) -> Result<(), LocalError> {
        self.conn()
            .execute_batch("DELETE FROM entries; DELETE FROM checkpoint;")
            .map_err(fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    #[test]
    fn a_store_survives_its_process_and_its_directory_is_held_by_one_process_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint {
            offset: 42,
            written_ms: 5,
        };
        {
            let stores = SqliteStores::open(dir.path()).unwrap();
            let err = SqliteStores::open(dir.path())
                .err()
                .expect("a second holder is refused");
            assert!(err.0.contains("in use by another process"), "{err}");
            let s = stores.open("sm4c.state-3").unwrap();
            s.apply(&[("a", Some(b"1")), ("b", Some(b"2"))], None).unwrap();
            s.apply(&[("a", None), ("c", Some(b"3"))], Some(cp)).unwrap();
        }
        let stores = SqliteStores::open(dir.path()).unwrap();
        let s = stores.open("sm4c.state-3").unwrap();
        assert_eq!(s.checkpoint().unwrap(), Some(cp));
        let mut all = Vec::new();
        s.each(&mut |k, v| all.push((k.to_string(), v.to_vec()))).unwrap();
        all.sort();
        assert_eq!(all, vec![("b".into(), b"2".to_vec()), ("c".into(), b"3".to_vec())]);
        assert_eq!(s.get("c").unwrap(), Some(b"3".to_vec()));
        // A prefix scan, in key order; a key with the prefix as its start only is not in it.
        s.apply(
            &[
                ("j\u{1}2", Some(b"y")),
                ("j\u{1}1", Some(b"x")),
                ("j2\u{1}1", Some(b"z")),
            ],
            None,
        )
        .unwrap();
        let mut scanned = Vec::new();
        s.scan("j\u{1}", &mut |k, v| scanned.push((k.to_string(), v.to_vec())))
            .unwrap();
        assert_eq!(
            scanned,
            vec![("j\u{1}1".into(), b"x".to_vec()), ("j\u{1}2".into(), b"y".to_vec())]
        );
        let mut page = Vec::new();
        s.scan_from("j\u{1}", "j\u{1}15", &mut |k, _| {
            page.push(k.to_string());
            true
        })
        .unwrap();
        assert_eq!(page, vec!["j\u{1}2"], "from a key on, within the prefix");
        let mut first = Vec::new();
        s.scan_from("", "", &mut |k, _| {
            first.push(k.to_string());
            false
        })
        .unwrap();
        assert_eq!(first, vec!["b"], "stops when told");
        assert_eq!(s.count("j\u{1}").unwrap(), 2);
        assert_eq!(s.count("j").unwrap(), 3);
        assert_eq!(s.count("").unwrap(), 5);
        s.clear().unwrap();
        assert_eq!(s.checkpoint().unwrap(), None);
        assert_eq!(s.get("b").unwrap(), None);
    }

    #[test]
    fn the_sweep_removes_the_temporary_directories_no_process_holds() {
        let base = tempfile::tempdir().unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        let make = |name: &str| {
            let d = base.path().join(name);
            std::fs::create_dir_all(&d).unwrap();
            d
        };
        let left = make("sm4c-local-1-0");
        SqliteStores::open(&left).unwrap();
        let held = make("sm4c-local-2-0");
        let holder = SqliteStores::open(&held).unwrap();
        let fresh = make("sm4c-local-3-0");
        let other = make("not-ours");
        for d in [&left, &held, &other] {
            File::open(d).unwrap().set_modified(old).unwrap();
        }
        sweep(base.path());
        assert!(!left.exists(), "a directory nobody holds is removed");
        assert!(held.exists(), "a held one stays");
        assert!(fresh.exists(), "one made a moment ago stays");
        assert!(other.exists(), "another program's stays");
        drop(holder);
    }

    #[test]
    fn a_damaged_store_file_is_started_again_and_a_temporary_directory_leaves_with_its_stores() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("sm4c.state-0.sqlite"),
            b"not a database at all, not at all",
        )
        .unwrap();
        let stores = SqliteStores::open(dir.path()).unwrap();
        let s = stores.open("sm4c.state-0").unwrap();
        assert_eq!(s.checkpoint().unwrap(), None);
        s.apply(&[("k", Some(b"v"))], None).unwrap();
        assert_eq!(s.get("k").unwrap(), Some(b"v".to_vec()));

        let t = SqliteStores::temporary().unwrap();
        let path = PathBuf::from(t.describe().trim_end_matches(" (temporary)"));
        t.open("x-1").unwrap().apply(&[("k", Some(b"v"))], None).unwrap();
        assert!(path.join("x-1.sqlite").exists());
        drop(t);
        assert!(!path.exists());
    }
}
