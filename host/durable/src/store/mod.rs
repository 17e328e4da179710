//! Where durable instances live: definitions, instance snapshots, journals, timers, calls in
//! flight, the outbox of sent events and events waiting for an instance.
//!
//! The durable host writes a whole batch of steps (from many instances) in one [`Batch`], which a
//! store commits atomically: that is the group commit. [`SqliteStore`] keeps everything in one
//! SQLite file; [`MemoryStore`] serves tests.

mod batches;
mod memory;
mod sqlite;

pub use memory::MemoryStore;
pub use sqlite::SqliteStore;

use serde_json::Value;
use sm4c_host::driver::ParentLink;
use sm4c_host::service::HostError;
pub use sm4c_host::service::{Stored, Summary};
use sm4c_runtime::{Breakpoint, Effect, Entry, Millis, Snapshot};
use std::collections::BTreeSet;

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The same definition id and version is registered with other content.
    #[error(
        "definition {id:?} version {version:?} is already registered with different content; register a new version"
    )]
    Conflict {
        /// Definition id.
        id: String,
        /// Version.
        version: String,
    },
    /// The file is not an sm4c store.
    #[error("{0}")]
    Foreign(String),
    /// The store's file system is full (SQLite said `SQLITE_FULL`): nothing of the write was kept,
    /// and a write may succeed once space returns.
    #[error("the store's disk is full: {0}")]
    Full(String),
    /// SQLite failed.
    #[error("store: {0}")]
    Sqlite(rusqlite::Error),
    /// A stored document could not be read back.
    #[error("store: corrupt record: {0}")]
    Corrupt(String),
}

/// Whether SQLite failed for want of space: `SQLITE_FULL`, or the shared-memory index of the
/// write-ahead log could not grow (`SQLITE_IOERR_SHMSIZE`, which is how opening a store on a full
/// disk fails).
fn disk_full(e: &rusqlite::Error) -> bool {
    use rusqlite::ffi;
    e.sqlite_error()
        .is_some_and(|f| f.code == ffi::ErrorCode::DiskFull || f.extended_code == ffi::SQLITE_IOERR_SHMSIZE)
}

impl From<rusqlite::Error> for StoreError {
    /// A full disk is told apart from every other failure: it passes once space returns.
    fn from(e: rusqlite::Error) -> Self {
        if disk_full(&e) {
            return StoreError::Full(e.to_string());
        }
        StoreError::Sqlite(e)
    }
}

impl StoreError {
    /// Whether the failure is a full disk, which passes once space returns.
    pub fn is_full(&self) -> bool {
        matches!(self, StoreError::Full(_))
    }
}

impl From<StoreError> for HostError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict { id, version } => HostError::Conflict { id, version },
            StoreError::Full(_) => HostError::StorageFull(e.to_string()),
            other => HostError::Store(other.to_string()),
        }
    }
}

/// What one batch writes.
#[derive(Debug, Default)]
pub struct Batch {
    /// Instances written, each with the journal entries appended since its last write.
    pub instances: Vec<InstanceWrite>,
    /// Sent events, in order.
    pub outbox: Vec<(String, Value, Millis)>,
    /// Events that reached no instance: (event, expires at).
    pub parked: Vec<(Value, Millis)>,
    /// Parked events handed to an instance (by their sequence number).
    pub unparked: Vec<i64>,
    /// Schedules written (their specification and state, as JSON), or deleted (`None`).
    pub schedules: Vec<(String, Option<(Value, Value)>)>,
}

/// A stored schedule: its id, and its specification and state, or why the row cannot be read back.
pub type ScheduleRow = (String, Result<(Value, Value), String>);

/// A stored definition: its document, or `(id, version, why)` when the row cannot be read back.
pub type DefinitionRow = Result<Value, (String, String, String)>;

/// A sent event: (seq, instance, the event or why it cannot be read back).
pub type SentRow = (i64, String, Result<Value, String>);

/// One instance's write in a batch.
#[derive(Debug)]
pub struct InstanceWrite {
    /// The instance after the step.
    pub snapshot: Snapshot,
    /// Parent instance and operation, for subflow children.
    pub parent: Option<ParentLink>,
    /// Journal entries to append.
    pub entries: Vec<Entry>,
    /// Calls and subflow starts the instance has open, now.
    pub calls: Vec<Effect>,
    /// The W3C `traceparent` of what started the instance, kept beside it once written.
    pub origin: Option<String>,
}

/// Storage for the durable host.
pub trait Store: Send + Sync + 'static {
    /// Registers a definition; `Ok(false)` when the same content is already registered.
    fn put_definition(&self, id: &str, version: &str, doc: &Value) -> Result<bool, StoreError>;
    /// The step debugger's breakpoints, by definition id (definitions without any are left out).
    /// By default none: a store that does not keep them forgets them when the host stops.
    fn breakpoints(&self) -> Result<Vec<(String, Vec<Breakpoint>)>, StoreError> {
        Ok(Vec::new())
    }
    /// Every schedule ([`Batch::schedules`] writes them).
    fn schedules(&self) -> Result<Vec<ScheduleRow>, StoreError>;
    /// The default version set for each definition id that has one (the version new starts
    /// take instead of the newest). By default none are kept.
    fn default_versions(&self) -> Result<Vec<(String, String)>, StoreError> {
        Ok(Vec::new())
    }
    /// Sets (none: clears) the default version of a definition id; durable once it returns. By
    /// default it is not kept (the host still has it until it stops).
    fn put_default_version(&self, _definition: &str, _version: Option<&str>) -> Result<(), StoreError> {
        Ok(())
    }
    /// Sets the breakpoints of a definition (an empty list clears them); durable once it returns.
    /// By default they are not kept (the host still has them until it stops).
    fn put_breakpoints(&self, _definition: &str, _breakpoints: &[Breakpoint]) -> Result<(), StoreError> {
        Ok(())
    }
    /// Every registered definition.
    fn definitions(&self) -> Result<Vec<Value>, StoreError>;
    /// Every registered definition, each row read on its own: `Err((id, version, why))` for one
    /// that cannot be read back, so that one bad row does not hide the others. By default from
    /// [`Store::definitions`].
    fn definition_rows(&self) -> Result<Vec<DefinitionRow>, StoreError> {
        Ok(self.definitions()?.into_iter().map(Ok).collect())
    }
    /// One instance.
    fn instance(&self, id: &str) -> Result<Option<Stored>, StoreError>;
    /// Commits a batch atomically.
    fn commit(&self, batch: &Batch) -> Result<(), StoreError>;
    /// Instances, newest last, filtered, after a cursor.
    fn list(
        &self,
        status: Option<&str>,
        definition: Option<&str>,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Summary>, StoreError>;
    /// Journal entries of an instance with their sequence numbers, after a cursor.
    fn history(&self, id: &str, after: i64, limit: usize) -> Result<Vec<(i64, Entry)>, StoreError>;
    /// The definition id and version of an instance, from its row alone (not its snapshot): what
    /// recovery needs to fail an instance whose snapshot cannot be read back. `None` by default.
    fn definition_of(&self, _id: &str) -> Result<Option<(String, String)>, StoreError> {
        Ok(None)
    }
    /// The parent link of an instance, from its row alone (not its snapshot): whom recovery tells
    /// when it fails an instance whose snapshot cannot be read back. `None` by default.
    fn parent_of(&self, _id: &str) -> Result<Option<ParentLink>, StoreError> {
        Ok(None)
    }
    /// Every active timer: (instance, timer, due).
    fn timers(&self) -> Result<Vec<(String, String, Millis)>, StoreError>;
    /// Every open call and subflow start: (instance, effect).
    fn calls(&self) -> Result<Vec<(String, Effect)>, StoreError>;
    /// The open calls and subflow starts of one instance.
    fn calls_of(&self, instance: &str) -> Result<Vec<Effect>, StoreError>;
    /// The W3C `traceparent` of what started an instance, when one was written with it.
    fn origin(&self, _instance: &str) -> Result<Option<String>, StoreError> {
        Ok(None)
    }
    /// Ids of instances that have not ended, of the given definitions.
    fn active(&self, definitions: &[(String, String)]) -> Result<Vec<String>, StoreError>;
    /// Sent events after a sequence number: (seq, instance, event). A row whose event cannot be
    /// read back is in the page with `Err(why)`, so that it neither fails the page nor stops the
    /// cursor.
    fn outbox(&self, after: i64, limit: usize) -> Result<Vec<SentRow>, StoreError>;
    /// Parked events not expired at `now`: (seq, event).
    fn parked(&self, now: Millis) -> Result<Vec<(i64, Value)>, StoreError>;
    /// Parked events not expired at `now` whose CloudEvent `type` is one of `types` (every one
    /// when `types` is `None`): (seq, event). Events parked without a known type (by an older
    /// version) are among them. By default [`Store::parked`], filtered.
    fn parked_of(&self, now: Millis, types: Option<&BTreeSet<String>>) -> Result<Vec<(i64, Value)>, StoreError> {
        let all = self.parked(now)?;
        Ok(match types {
            None => all,
            Some(types) => all
                .into_iter()
                .filter(|(_, e)| types.contains(&parked_type(e)))
                .collect(),
        })
    }
    /// How many events are parked and not expired at `now`, and their size in bytes (as stored,
    /// JSON text). By default from [`Store::parked`].
    fn parked_totals(&self, now: Millis) -> Result<(usize, u64), StoreError> {
        let all = self.parked(now)?;
        let bytes = all.iter().map(|(_, e)| parked_size(e)).sum();
        Ok((all.len(), bytes))
    }
}

/// The type a parked event is looked up by: its CloudEvent `type` as text (empty when it has none).
pub fn parked_type(event: &Value) -> String {
    sm4c_runtime::engine::event::attribute_text(event, "type").unwrap_or_default()
}

/// The size a parked event counts for against the bytes cap: its JSON text, as stored.
pub fn parked_size(event: &Value) -> u64 {
    serde_json::to_vec(event).map_or(0, |v| v.len() as u64)
}
