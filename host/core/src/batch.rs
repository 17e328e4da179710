//! Batch operations (`/batches`): one operation (cancel, redrive, migrate, send) over every
//! instance a `where` filter matches, run by a task of the server at a bounded rate, and durable:
//! the batch, the instances it matched and each one's outcome are rows of a [`BatchStore`], so a
//! server stopped in the middle (even by SIGKILL) resumes the batch when it starts again.
//!
//! A batch runs in two phases. **Matching** pages through the instances (oldest first) and records
//! the ids that match, with the listing's cursor, a page per write: the set a batch acts on is
//! fixed once matched (instances started after the batch was posted are left out). **Applying**
//! takes the matched instances in order, a group at a time: it applies the operation to each
//! instance of the group (concurrently, so that the host commits them together), then records the
//! group's outcomes in one write.
//!
//! No instance gets the operation twice: a group is marked started before it is applied, and an
//! instance of a started group whose outcome is not recorded when the server stops is checked
//! before the operation is applied again ([`Operation`] says how each is checked): a cancel, a
//! redrive or a migration whose effect is already there is recorded as done without being applied
//! again, and a sent event is looked for in the instance's journal by its id (the batch id and the
//! instance id), so it is not sent twice.

use crate::service::{Backend, HostError, Summary};
use serde_json::{json, Map, Value};
use sm4c_runtime::{Entry, Expr, Input, Limits, Status};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How many instances a group applies at once (and records in one write).
pub const GROUP: usize = 64;
/// How many instances a matching page lists.
const PAGE: usize = 500;
/// How many instances matching lists a second, per instance a second the batch applies to.
const LISTING: f64 = 4.0;
/// The most instances a dry run lists (it counts them all).
pub const DRY_RUN_LIST: usize = 1000;
/// The most failed instances `GET /batches/{id}` lists (it counts them all).
pub const FAILED_LIST: usize = 1000;

/// What a batch does to each instance it matched.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation {
    /// Cancels it. Checked after a restart: an instance already cancelled is done.
    Cancel,
    /// Redrives it ([`Backend::redrive`]) after applying `update` to its data. Checked after a
    /// restart: an instance no longer failed or timed out is done.
    Redrive {
        /// A jq expression over the instance's data.
        update: Option<String>,
    },
    /// Moves it to `version` of its definition (`states`: old state name to new). Checked after a
    /// restart: an instance on `version` already is done.
    Migrate {
        /// The version to move to.
        version: String,
        /// State names that differ.
        states: BTreeMap<String, String>,
    },
    /// Sends it `event` (its `sm4cinstanceid` set to the instance, its `id` to
    /// `<batch>/<instance>`). Checked after a restart: an instance whose journal has the event is
    /// done.
    Send {
        /// The CloudEvent (JSON structured form), without `sm4cinstanceid`.
        event: Value,
    },
}

impl Operation {
    /// The name the API gives it.
    pub fn name(&self) -> &'static str {
        match self {
            Operation::Cancel => "cancel",
            Operation::Redrive { .. } => "redrive",
            Operation::Migrate { .. } => "migrate",
            Operation::Send { .. } => "send",
        }
    }
}

/// Which instances a batch acts on: every field given must hold.
#[derive(Debug, Clone, Default)]
pub struct Where {
    /// Definition id.
    pub definition: Option<String>,
    /// Definition version.
    pub version: Option<String>,
    /// Status (`running`, `failed`, ...).
    pub status: Option<String>,
    /// Current state's name.
    pub state: Option<String>,
    /// Started strictly after this time (ms since the Unix epoch).
    pub started_after: Option<i64>,
    /// Started strictly before this time (ms since the Unix epoch).
    pub started_before: Option<i64>,
    /// A jq expression over the instance's data that must yield `true`.
    pub jq: Option<Expr>,
}

/// The statuses `where.status` may name.
const STATUSES: [&str; 8] = [
    "created",
    "running",
    "waiting",
    "completed",
    "failed",
    "cancelled",
    "timedOut",
    "paused",
];

impl Where {
    /// Whether an instance as listed matches everything but `jq` (which needs its data).
    pub fn matches_summary(&self, s: &Summary) -> bool {
        let same = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        if !same(&self.definition, &s.definition) || !same(&self.version, &s.version) || !same(&self.status, &s.status)
        {
            return false;
        }
        if self.state.is_some() && self.state.as_deref() != s.state.as_deref() {
            return false;
        }
        if self.started_after.is_some() || self.started_before.is_some() {
            let Some(at) = s.started_at.as_deref().and_then(parse_time) else {
                return false;
            };
            if self.started_after.is_some_and(|t| at <= t) || self.started_before.is_some_and(|t| at >= t) {
                return false;
            }
        }
        true
    }

    /// Whether the `jq` filter (if any) yields `true` on `data`. An expression that fails on the
    /// data, or yields anything but `true`, does not match.
    pub fn matches_data(&self, data: &Value) -> bool {
        match &self.jq {
            None => true,
            Some(e) => matches!(e.eval_json(data), Ok(Value::Bool(true))),
        }
    }
}

/// An RFC 3339 time as ms since the Unix epoch.
pub fn parse_time(text: &str) -> Option<i64> {
    sm4c_runtime::asl::choice::parse_timestamp(text).map(|ns| (ns / 1_000_000) as i64)
}

/// A batch request, read and checked.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The operation.
    pub operation: Operation,
    /// The filter.
    pub filter: Where,
    /// Only list what would be touched.
    pub dry_run: bool,
    /// Instances per second, when the request bounds it below the server's bound.
    pub rate: Option<u32>,
}

/// The fields of a batch request.
const FIELDS: [&str; 8] = [
    "operation",
    "where",
    "dryRun",
    "rate",
    "update",
    "version",
    "states",
    "event",
];
/// The fields of `where`.
pub const WHERE_FIELDS: [&str; 7] = [
    "definition",
    "version",
    "status",
    "state",
    "startedAfter",
    "startedBefore",
    "jq",
];

impl Spec {
    /// Reads a batch request (`POST /batches`'s body); every problem as (JSON pointer, what).
    pub fn from_json(body: &Value, limits: Limits) -> Result<Spec, Vec<(String, String)>> {
        let mut errs = Vec::new();
        let mut err = |p: &str, m: String| errs.push((p.to_string(), m));
        let Some(o) = body.as_object() else {
            return Err(vec![("".into(), "a batch is a JSON object".into())]);
        };
        for k in o.keys().filter(|k| !FIELDS.contains(&k.as_str())) {
            err(
                &format!("/{}", escape(k)),
                format!("unknown field {k:?}; a batch has {}", FIELDS.join(", ")),
            );
        }
        let text = |k: &str, o: &Map<String, Value>, at: &str, err: &mut dyn FnMut(&str, String)| match o.get(k) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                err(&format!("{at}/{k}"), "must be a string".into());
                None
            }
        };
        let op = text("operation", o, "", &mut err);
        let mut filter = Where::default();
        match o.get("where") {
            None => err(
                "/where",
                "missing: a batch names the instances it acts on (at least {} matches every instance)".into(),
            ),
            Some(Value::Object(w)) => {
                for k in w.keys().filter(|k| !WHERE_FIELDS.contains(&k.as_str())) {
                    err(
                        &format!("/where/{}", escape(k)),
                        format!("unknown field {k:?}; where has {}", WHERE_FIELDS.join(", ")),
                    );
                }
                filter.definition = text("definition", w, "/where", &mut err);
                filter.version = text("version", w, "/where", &mut err);
                filter.status = text("status", w, "/where", &mut err);
                if let Some(s) = &filter.status {
                    if !STATUSES.contains(&s.as_str()) {
                        err(
                            "/where/status",
                            format!("{s:?} is not a status; one of {}", STATUSES.join(", ")),
                        );
                    }
                }
                filter.state = text("state", w, "/where", &mut err);
                for (k, slot) in [
                    ("startedAfter", &mut filter.started_after),
                    ("startedBefore", &mut filter.started_before),
                ] {
                    if let Some(t) = text(k, w, "/where", &mut err) {
                        match parse_time(&t) {
                            Some(ms) => *slot = Some(ms),
                            None => err(
                                &format!("/where/{k}"),
                                format!("{t:?} is not an RFC 3339 time (2026-01-31T12:00:00Z)"),
                            ),
                        }
                    }
                }
                if let Some(jq) = text("jq", w, "/where", &mut err) {
                    match Expr::compile(&jq, &[], limits) {
                        Ok(e) => filter.jq = Some(e),
                        Err(e) => err("/where/jq", format!("does not compile: {e}")),
                    }
                }
            }
            Some(_) => err("/where", "must be an object".into()),
        }
        let dry_run = match o.get("dryRun") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                err("/dryRun", "must be true or false".into());
                false
            }
        };
        let rate = match o.get("rate") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().filter(|n| (1..=1_000_000).contains(n)) {
                Some(n) => Some(n as u32),
                None => {
                    err(
                        "/rate",
                        "must be a whole number of instances per second, 1 to 1000000".into(),
                    );
                    None
                }
            },
        };
        let update = text("update", o, "", &mut err);
        let version = text("version", o, "", &mut err);
        let mut states = BTreeMap::new();
        match o.get("states") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    match v.as_str() {
                        Some(s) => {
                            states.insert(k.clone(), s.to_string());
                        }
                        None => err(
                            &format!("/states/{}", escape(k)),
                            "must be a state name (a string)".into(),
                        ),
                    }
                }
            }
            Some(_) => err("/states", "must be an object of old state name to new".into()),
        }
        let event = o.get("event").filter(|v| !v.is_null()).cloned();
        // The fields each operation takes, beyond operation, where, dryRun and rate.
        let takes: &[&str] = match op.as_deref() {
            Some("cancel") => &[],
            Some("redrive") => &["update"],
            Some("migrate") => &["version", "states"],
            Some("send") => &["event"],
            _ => &["update", "version", "states", "event"],
        };
        for k in ["update", "version", "states", "event"] {
            if o.get(k).is_some_and(|v| !v.is_null()) && !takes.contains(&k) {
                err(
                    &format!("/{k}"),
                    format!("{:?} does not take {k:?}", op.as_deref().unwrap_or_default()),
                );
            }
        }
        let operation = match op.as_deref() {
            Some("cancel") => Some(Operation::Cancel),
            Some("redrive") => {
                if let Some(u) = &update {
                    if let Err(e) = Expr::compile(u, &[], limits) {
                        err("/update", format!("does not compile: {e}"));
                    }
                }
                Some(Operation::Redrive { update })
            }
            Some("migrate") => match version {
                Some(version) => Some(Operation::Migrate { version, states }),
                None => {
                    err("/version", "missing: migrate moves instances to a version".into());
                    None
                }
            },
            Some("send") => match event {
                Some(Value::Object(mut e)) => {
                    if e.contains_key(crate::driver::INSTANCE_ATTRIBUTE) || e.contains_key("id") {
                        err(
                            "/event",
                            "must not have sm4cinstanceid or id: the batch addresses each event to its instance and gives it the id <batch>/<instance>".into(),
                        );
                    }
                    for k in ["type", "source"] {
                        if !e.get(k).is_some_and(Value::is_string) {
                            err(
                                &format!("/event/{k}"),
                                "missing: a CloudEvent has a type and a source (strings)".into(),
                            );
                        }
                    }
                    e.entry("specversion").or_insert(json!("1.0"));
                    Some(Operation::Send {
                        event: Value::Object(e),
                    })
                }
                Some(_) => {
                    err(
                        "/event",
                        "must be a CloudEvent (a JSON object with type and source)".into(),
                    );
                    None
                }
                None => {
                    err("/event", "missing: send sends each instance a CloudEvent".into());
                    None
                }
            },
            Some(other) => {
                err(
                    "/operation",
                    format!("{other:?} is not an operation; one of cancel, redrive, migrate, send"),
                );
                None
            }
            None => {
                err("/operation", "missing: one of cancel, redrive, migrate, send".into());
                None
            }
        };
        match operation {
            Some(operation) if errs.is_empty() => Ok(Spec {
                operation,
                filter,
                dry_run,
                rate,
            }),
            _ => Err(errs),
        }
    }
}

/// A JSON pointer's escape of one key.
fn escape(k: &str) -> String {
    k.replace('~', "~0").replace('/', "~1")
}

/// A batch's phase, as stored and reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Listing the instances that match.
    Matching,
    /// Applying the operation.
    Applying,
    /// Every matched instance has its outcome.
    Completed,
    /// Stopped by `POST /batches/{id}/cancel`: the instances without an outcome are left as they are.
    Cancelled,
}

impl Phase {
    /// As stored and reported.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Matching => "matching",
            Phase::Applying => "applying",
            Phase::Completed => "completed",
            Phase::Cancelled => "cancelled",
        }
    }

    /// From its stored name.
    pub fn parse(s: &str) -> Option<Phase> {
        [Phase::Matching, Phase::Applying, Phase::Completed, Phase::Cancelled]
            .into_iter()
            .find(|p| p.as_str() == s)
    }

    /// Whether the batch still has work.
    pub fn is_running(self) -> bool {
        matches!(self, Phase::Matching | Phase::Applying)
    }
}

/// A stored batch.
#[derive(Debug, Clone)]
pub struct BatchRow {
    /// Its id.
    pub id: String,
    /// The request, as posted.
    pub spec: Value,
    /// Its phase.
    pub phase: Phase,
    /// The listing cursor matching has reached.
    pub cursor: i64,
    /// When it was posted (ms since the Unix epoch).
    pub created: i64,
    /// When it completed or was cancelled.
    pub ended: Option<i64>,
}

/// One instance's outcome in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The operation was applied (or found applied after a restart: the note says so).
    Done(Option<String>),
    /// The operation failed: why.
    Failed(String),
}

/// How many instances of a batch are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Matched.
    pub matched: u64,
    /// Done.
    pub done: u64,
    /// Failed.
    pub failed: u64,
}

/// Where batches are kept. Each method is durable once it returns.
pub trait BatchStore: Send + Sync + 'static {
    /// Records a new batch (phase matching, cursor 0).
    fn create_batch(&self, id: &str, spec: &Value, created: i64) -> Result<(), HostError>;
    /// Every batch, oldest first.
    fn batches(&self) -> Result<Vec<BatchRow>, HostError>;
    /// One batch.
    fn batch(&self, id: &str) -> Result<Option<BatchRow>, HostError>;
    /// Adds matched instances (in order; one already added is not added again) and moves the
    /// matching cursor to `cursor`, or ends matching (phase applying) when `last`, in one write.
    fn add_matched(&self, id: &str, instances: &[String], cursor: i64, last: bool) -> Result<(), HostError>;
    /// Up to `limit` matched instances without an outcome, in the order they were matched, each
    /// with whether its group was started ([`BatchStore::start_group`]).
    fn pending(&self, id: &str, limit: usize) -> Result<Vec<(String, bool)>, HostError>;
    /// Marks instances as about to have the operation applied, in one write.
    fn start_group(&self, id: &str, instances: &[String]) -> Result<(), HostError>;
    /// Records outcomes, in one write.
    fn record(&self, id: &str, outcomes: &[(String, Outcome)]) -> Result<(), HostError>;
    /// Sets a batch's phase (and when it ended, for a final one).
    fn set_phase(&self, id: &str, phase: Phase, ended: Option<i64>) -> Result<(), HostError>;
    /// How many matched, done, failed.
    fn counts(&self, id: &str) -> Result<Counts, HostError>;
    /// Up to `limit` failed instances, with why.
    fn failures(&self, id: &str, limit: usize) -> Result<Vec<(String, String)>, HostError>;
}

/// The batches of a server: it takes requests, runs each batch in a task of its own, and resumes
/// the unfinished ones when it starts ([`Batches::resume`]).
pub struct Batches {
    backend: Arc<dyn Backend>,
    store: Arc<dyn BatchStore>,
    /// The most instances per second a batch acts on (`sm4c serve --batch-rate`).
    rate: u32,
    limits: Limits,
    /// Batches being run here, and whether each was asked to stop.
    running: Mutex<HashMap<String, Arc<std::sync::atomic::AtomicBool>>>,
    /// Why a batch's runner stopped before the batch ended (the store or the host failed).
    halted: Mutex<HashMap<String, String>>,
}

impl Batches {
    /// Batches over `backend`, kept in `store`, at most `rate` instances per second each.
    pub fn new(backend: Arc<dyn Backend>, store: Arc<dyn BatchStore>, rate: u32, limits: Limits) -> Arc<Batches> {
        Arc::new(Batches {
            backend,
            store,
            rate: rate.max(1),
            limits,
            running: Mutex::new(HashMap::new()),
            halted: Mutex::new(HashMap::new()),
        })
    }

    /// The server-wide bound, in instances per second.
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// Starts a task for every batch that has not finished (after a restart).
    pub fn resume(self: &Arc<Self>) -> Result<usize, HostError> {
        let mut n = 0;
        for b in self.store.batches()? {
            if b.phase.is_running() {
                self.spawn(b.id);
                n += 1;
            }
        }
        Ok(n)
    }

    fn spawn(self: &Arc<Self>, id: String) {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        self.lock().insert(id.clone(), stop.clone());
        let me = self.clone();
        tokio::spawn(async move {
            if let Err(e) = me.run(&id, &stop).await {
                // The store or the host failed: the batch stays unfinished and resumes at the next
                // start; until then GET /batches/{id} says why it halted.
                me.halted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id.clone(), e.to_string());
            }
            me.lock().remove(&id);
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<std::sync::atomic::AtomicBool>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a batch request: a dry run answers what it would touch (200); otherwise the batch is
    /// recorded and started, and answered as `GET /batches/{id}` does (202).
    pub async fn submit(self: &Arc<Self>, body: Value) -> Result<(bool, Value), HostError> {
        let spec = Spec::from_json(&body, self.limits).map_err(HostError::InvalidBatch)?;
        if let Some(d) = &spec.filter.definition {
            if self.backend.latest(d).is_none() {
                return Err(HostError::InvalidBatch(vec![(
                    "/where/definition".into(),
                    format!("no definition {d:?} is registered"),
                )]));
            }
        }
        let now = crate::clock::wall_ms();
        if spec.dry_run {
            let mut listed = Vec::new();
            let mut count = 0u64;
            let mut cursor = 0;
            loop {
                let (page, next, last) = self.match_page(&spec.filter, cursor, now).await?;
                count += page.len() as u64;
                for s in page {
                    if listed.len() < DRY_RUN_LIST {
                        listed.push(json!({"id": s.id, "definition": s.definition, "version": s.version,
                            "status": s.status, "state": s.state}));
                    }
                }
                cursor = next;
                if last {
                    break;
                }
            }
            return Ok((
                false,
                json!({"dryRun": true, "operation": spec.operation.name(), "matched": count,
                       "instances": listed, "truncated": count as usize > listed.len()}),
            ));
        }
        let id = crate::service::new_id("batch");
        let mut stored = body;
        if let Some(o) = stored.as_object_mut() {
            o.remove("dryRun");
        }
        self.store.create_batch(&id, &stored, now)?;
        self.spawn(id.clone());
        Ok((true, self.get(&id)?))
    }

    /// One page of matching instances after `cursor`, started before `before`: (matched, the next
    /// cursor, whether this was the last page).
    async fn match_page(&self, w: &Where, cursor: i64, before: i64) -> Result<(Vec<Summary>, i64, bool), HostError> {
        let page = self
            .backend
            .list(w.status.as_deref(), w.definition.as_deref(), cursor, PAGE)
            .await?;
        let last = page.len() < PAGE;
        let next = page.last().map_or(cursor, |s| s.seq);
        let mut out = Vec::new();
        for s in page {
            // Instances started after the batch was posted are not its business.
            if s.started_at.as_deref().and_then(parse_time).is_some_and(|t| t > before) || !w.matches_summary(&s) {
                continue;
            }
            if w.jq.is_some() {
                let Some(stored) = self.backend.instance(&s.id)? else {
                    continue;
                };
                let data = serde_json::to_value(&stored.snapshot.data).unwrap_or(Value::Null);
                if !w.matches_data(&data) {
                    continue;
                }
            }
            out.push(s);
        }
        Ok((out, next, last))
    }

    /// A batch as `GET /batches/{id}` answers it.
    pub fn get(&self, id: &str) -> Result<Value, HostError> {
        let b = self
            .store
            .batch(id)?
            .ok_or_else(|| HostError::UnknownBatch(id.to_string()))?;
        let c = self.store.counts(id)?;
        let failed: Vec<Value> = self
            .store
            .failures(id, FAILED_LIST)?
            .into_iter()
            .map(|(i, why)| json!({"instance": i, "reason": why}))
            .collect();
        Ok(json!({
            "id": b.id,
            "operation": b.spec.get("operation"),
            "where": b.spec.get("where"),
            "request": b.spec,
            "phase": b.phase.as_str(),
            "running": b.phase.is_running(),
            "createdAt": sm4c_runtime::engine::rfc3339(b.created),
            "endedAt": b.ended.map(sm4c_runtime::engine::rfc3339),
            "matched": c.matched,
            "matching": b.phase == Phase::Matching,
            "done": c.done,
            "failedCount": c.failed,
            "failed": failed,
            "pending": c.matched.saturating_sub(c.done + c.failed),
            "halted": self.halted.lock().unwrap_or_else(|p| p.into_inner()).get(id),
        }))
    }

    /// Every batch, newest first, as [`Batches::get`] without its failures.
    pub fn list(&self) -> Result<Value, HostError> {
        let mut out = Vec::new();
        for b in self.store.batches()?.into_iter().rev() {
            let c = self.store.counts(&b.id)?;
            out.push(json!({
                "id": b.id,
                "operation": b.spec.get("operation"),
                "where": b.spec.get("where"),
                "phase": b.phase.as_str(),
                "running": b.phase.is_running(),
                "createdAt": sm4c_runtime::engine::rfc3339(b.created),
                "endedAt": b.ended.map(sm4c_runtime::engine::rfc3339),
                "matched": c.matched,
                "done": c.done,
                "failedCount": c.failed,
            }));
        }
        Ok(json!({"batches": out}))
    }

    /// Stops a batch: the instances without an outcome are left as they are. A batch that has
    /// ended already is answered as it is.
    pub async fn cancel(&self, id: &str) -> Result<Value, HostError> {
        let b = self
            .store
            .batch(id)?
            .ok_or_else(|| HostError::UnknownBatch(id.to_string()))?;
        if b.phase.is_running() {
            if let Some(stop) = self.lock().get(id) {
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            self.store
                .set_phase(id, Phase::Cancelled, Some(crate::clock::wall_ms()))?;
            // The runner stops before its next group; wait for it, so that the answer's counts stay.
            for _ in 0..200 {
                if !self.lock().contains_key(id) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        self.get(id)
    }

    /// Runs batch `id` from where its rows say it is, until it completes, is stopped, or the
    /// store fails.
    async fn run(&self, id: &str, stop: &Arc<std::sync::atomic::AtomicBool>) -> Result<(), HostError> {
        use std::sync::atomic::Ordering::SeqCst;
        let Some(b) = self.store.batch(id)? else {
            return Ok(());
        };
        let spec = match Spec::from_json(&b.spec, self.limits) {
            Ok(s) => s,
            Err(errs) => {
                // Checked when posted: only a changed server (other limits) refuses it now.
                let why: Vec<String> = errs.iter().map(|(p, m)| format!("{p}: {m}")).collect();
                self.store
                    .set_phase(id, Phase::Cancelled, Some(crate::clock::wall_ms()))?;
                return Err(HostError::InvalidBatch(vec![(
                    String::new(),
                    format!("the batch no longer reads, so it was cancelled: {}", why.join("; ")),
                )]));
            }
        };
        let mut phase = b.phase;
        let mut cursor = b.cursor;
        let rate = spec.rate.map_or(self.rate, |r| r.min(self.rate)).max(1);
        // Matching is paced too, at LISTING times the rate in instances listed: without it, listing
        // 100,000 instances flat out is a burst of store reads and writes that live requests wait
        // behind (bench/batch), and it is short next to applying at the rate anyway.
        let begun = tokio::time::Instant::now();
        let mut listed: u64 = 0;
        while phase == Phase::Matching {
            let due = begun + Duration::from_secs_f64(listed as f64 / (f64::from(rate) * LISTING));
            if !pace(due, stop).await {
                return Ok(());
            }
            let (page, next, last) = self.match_page(&spec.filter, cursor, b.created).await?;
            let ids: Vec<String> = page.into_iter().map(|s| s.id).collect();
            self.store.add_matched(id, &ids, next, last)?;
            listed += PAGE as u64;
            cursor = next;
            if last {
                phase = Phase::Applying;
            }
        }
        let begun = tokio::time::Instant::now();
        let mut applied: u64 = 0;
        loop {
            if stop.load(SeqCst) {
                return Ok(());
            }
            let group = self.store.pending(id, GROUP)?;
            if group.is_empty() {
                break;
            }
            // Recorded before the group is applied: after a restart, only the instances of a group
            // that was started are checked for an operation applied without its outcome.
            let fresh: Vec<String> = group
                .iter()
                .filter(|(_, started)| !started)
                .map(|(i, _)| i.clone())
                .collect();
            self.store.start_group(id, &fresh)?;
            let mut tasks = tokio::task::JoinSet::new();
            for (i, (instance, started)) in group.iter().enumerate() {
                // Paced: instance n starts no sooner than n / rate seconds after the batch began here.
                let due = begun + Duration::from_secs_f64((applied + i as u64) as f64 / f64::from(rate));
                let backend = self.backend.clone();
                let op = spec.operation.clone();
                let (batch, instance, check, stop) = (id.to_string(), instance.clone(), *started, stop.clone());
                tasks.spawn(async move {
                    if !pace(due, &stop).await {
                        return (instance, Ok(None));
                    }
                    let outcome = apply(&*backend, &batch, &instance, &op, check).await;
                    (instance, outcome.map(Some))
                });
            }
            let mut outcomes = HashMap::new();
            while let Some(r) = tasks.join_next().await {
                match r {
                    Ok((instance, Ok(Some(o)))) => {
                        outcomes.insert(instance, o);
                    }
                    // Stopped before it was applied.
                    Ok((_, Ok(None))) => {}
                    // The store or the host failed: what this group did is checked again at the
                    // next start.
                    Ok((_, Err(e))) => return Err(e),
                    Err(e) => return Err(HostError::Store(format!("a batch task failed: {e}"))),
                }
            }
            let ordered: Vec<(String, Outcome)> = group
                .into_iter()
                .filter_map(|(i, _)| outcomes.remove(&i).map(|o| (i, o)))
                .collect();
            applied += ordered.len() as u64;
            self.store.record(id, &ordered)?;
        }
        if !stop.load(SeqCst) {
            self.store
                .set_phase(id, Phase::Completed, Some(crate::clock::wall_ms()))?;
        }
        Ok(())
    }
}

/// Waits until `due`, in slices, so that a stop is seen at once: `false` when the batch was stopped.
async fn pace(due: tokio::time::Instant, stop: &std::sync::atomic::AtomicBool) -> bool {
    loop {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        let now = tokio::time::Instant::now();
        if now >= due {
            return true;
        }
        tokio::time::sleep((due - now).min(Duration::from_millis(50))).await;
    }
}

/// One commands partition's share of a batch in Kafka mode, as the partition's owner keeps it
/// (a record of the partition's own on the state topic) and as `GET /batches/{id}` lists it
/// under `partitions`: each owner applies the batch to its own instances, and the answer sums
/// the shares ([`render`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Share {
    /// The commands partition.
    pub partition: i32,
    /// How many commands partitions there are (so many shares make the whole batch).
    pub partitions: i32,
    /// The request, as posted (without `dryRun`).
    pub request: Value,
    /// When it was posted (ms since the Unix epoch).
    pub created: i64,
    /// The partition's latest place in listings when the batch was decided there: the instances
    /// started later are left out.
    pub bound: i64,
    /// The place in listings of the last instance looked at: the next group starts after it.
    pub cursor: i64,
    /// How many instances matched when the batch was decided there; once the share has ended,
    /// how many it acted on (done and failed).
    pub matched: u64,
    /// Done.
    pub done: u64,
    /// Failed.
    pub failed: u64,
    /// The first [`FAILED_LIST`] failures: (instance, why).
    #[serde(default)]
    pub failures: Vec<(String, String)>,
    /// `applying`, `completed` or `cancelled` ([`Phase`]).
    pub phase: String,
    /// When it completed or was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<i64>,
    /// When its last group was applied (the time of the tick that applied it): the next group is
    /// as large as the rate allows since then.
    pub last: i64,
}

impl Share {
    /// Its phase (an unknown name reads as applying: it still has work).
    pub fn phase(&self) -> Phase {
        Phase::parse(&self.phase).unwrap_or(Phase::Applying)
    }

    /// Records one instance's outcome.
    pub fn record(&mut self, instance: &str, outcome: &Outcome) {
        match outcome {
            Outcome::Done(_) => self.done += 1,
            Outcome::Failed(why) => {
                self.failed += 1;
                if self.failures.len() < FAILED_LIST {
                    self.failures.push((instance.to_string(), why.clone()));
                }
            }
        }
    }
}

/// Batch `id` as `GET /batches/{id}` answers it, from its partitions' shares (the first of a
/// partition counts: one that moved between two answers may be in both); `None` when there are
/// none. Running until every partition has its share and none is applying; the counts are the
/// sums, the failures the first [`FAILED_LIST`] of them in partition order. `failures` false
/// leaves them out (a listing).
pub fn render(id: &str, shares: &[Share], failures: bool) -> Option<Value> {
    let mut by: BTreeMap<i32, &Share> = BTreeMap::new();
    for s in shares {
        by.entry(s.partition).or_insert(s);
    }
    let first = by.values().next()?;
    let all = by.len() as i32 >= first.partitions;
    let running = !all || by.values().any(|s| s.phase().is_running());
    let phase = if running {
        Phase::Applying
    } else if by.values().any(|s| s.phase() == Phase::Cancelled) {
        Phase::Cancelled
    } else {
        Phase::Completed
    };
    let sum = |f: fn(&Share) -> u64| by.values().map(|s| f(s)).sum::<u64>();
    let (matched, done, failed) = (sum(|s| s.matched), sum(|s| s.done), sum(|s| s.failed));
    let created = by.values().map(|s| s.created).min().unwrap_or(first.created);
    let ended = (!running).then(|| by.values().filter_map(|s| s.ended).max()).flatten();
    let request = &first.request;
    let mut v = json!({
        "id": id,
        "operation": request.get("operation"),
        "where": request.get("where"),
        "phase": phase.as_str(),
        "running": running,
        "createdAt": sm4c_runtime::engine::rfc3339(created),
        "endedAt": ended.map(sm4c_runtime::engine::rfc3339),
        "matched": matched,
        "done": done,
        "failedCount": failed,
        "partitions": by.values().collect::<Vec<_>>(),
    });
    if failures {
        let list: Vec<Value> = by
            .values()
            .flat_map(|s| s.failures.iter())
            .take(FAILED_LIST)
            .map(|(i, why)| json!({"instance": i, "reason": why}))
            .collect();
        v["request"] = request.clone();
        v["matching"] = json!(false);
        v["failed"] = json!(list);
        v["pending"] = json!(matched.saturating_sub(done + failed));
        v["halted"] = Value::Null;
    }
    Some(v)
}

/// The shares a rendered batch (or several answers for the same batch) lists under `partitions`.
pub fn shares_of(answers: &[Value]) -> Vec<Share> {
    answers
        .iter()
        .flat_map(|a| a["partitions"].as_array().into_iter().flatten())
        .filter_map(|s| serde_json::from_value(s.clone()).ok())
        .collect()
}

/// Dry runs of the same request over several workers' shares, as one: the counts summed, the
/// instances listed in start order up to [`DRY_RUN_LIST`].
pub fn merge_dry_runs(answers: &[Value]) -> Value {
    let matched: u64 = answers.iter().filter_map(|a| a["matched"].as_u64()).sum();
    let mut listed: Vec<(i64, Value)> = answers
        .iter()
        .flat_map(|a| a["instances"].as_array().into_iter().flatten())
        .map(|i| (i["seq"].as_i64().unwrap_or(0), i.clone()))
        .collect();
    listed.sort_by_key(|(seq, _)| *seq);
    listed.truncate(DRY_RUN_LIST);
    let operation = answers.first().map_or(Value::Null, |a| a["operation"].clone());
    let instances: Vec<Value> = listed.into_iter().map(|(_, i)| i).collect();
    json!({"dryRun": true, "operation": operation, "matched": matched,
           "truncated": matched as usize > instances.len(), "instances": instances})
}

/// The id of the event a send batch gives `instance`.
pub fn event_id(batch: &str, instance: &str) -> String {
    format!("{batch}/{instance}")
}

/// Applies `op` to `instance`; with `check` (its group was started before a restart, and its
/// outcome not recorded), first looks whether it was applied already. An error of the store (or a
/// stopped host) is `Err`: the batch stops there and resumes at the next start; every other error
/// is the instance's failed outcome.
async fn apply(
    b: &dyn Backend,
    batch: &str,
    instance: &str,
    op: &Operation,
    check: bool,
) -> Result<Outcome, HostError> {
    let status = |b: &dyn Backend| -> Result<Option<(Status, String)>, HostError> {
        Ok(b.instance(instance)?
            .map(|s| (s.snapshot.status, s.snapshot.version.clone())))
    };
    const BEFORE: &str = "applied before the server restarted";
    if check {
        let Some((st, version)) = status(b)? else {
            return Ok(Outcome::Failed(format!("no instance {instance:?}")));
        };
        let already = match op {
            Operation::Cancel => st == Status::Cancelled,
            Operation::Redrive { .. } => !matches!(st, Status::Failed | Status::TimedOut),
            Operation::Migrate { version: v, .. } => version == *v,
            Operation::Send { .. } => sent_before(b, instance, &event_id(batch, instance)).await?,
        };
        if already {
            return Ok(Outcome::Done(Some(BEFORE.into())));
        }
    }
    let r = match op {
        Operation::Cancel => b.cancel(instance.to_string()).await,
        Operation::Redrive { update } => b.redrive(instance.to_string(), update.clone(), false).await.map(|_| ()),
        Operation::Migrate { version, states } => b
            .migrate(instance.to_string(), version.clone(), states.clone(), false)
            .await
            .map(|_| ()),
        Operation::Send { event } => {
            // The host takes an event addressed to an instance that has ended, and drops it.
            if let Some((st, _)) = status(b)?.filter(|(s, _)| s.is_final()) {
                return Ok(Outcome::Failed(format!("it had already ended ({})", st.as_str())));
            }
            let mut e = event.clone();
            e[crate::driver::INSTANCE_ATTRIBUTE] = json!(instance);
            e["id"] = json!(event_id(batch, instance));
            match b.deliver(e).await {
                Ok(d) if d["reached"].as_array().is_some_and(|r| r.iter().any(|i| i == instance)) => Ok(()),
                Ok(d) => {
                    let parked = if d["parked"] == json!(true) {
                        "; it was parked for the instance"
                    } else {
                        ""
                    };
                    return Ok(Outcome::Failed(format!(
                        "the event did not reach the instance (it does not wait for it now){parked}"
                    )));
                }
                Err(e) => Err(e),
            }
        }
    };
    Ok(match r {
        Ok(()) => Outcome::Done(None),
        Err(e @ (HostError::Store(_) | HostError::Stopped | HostError::Failed(_) | HostError::StorageFull(_))) => {
            return Err(e)
        }
        Err(HostError::Ended(_)) => {
            let st = status(b)?.map_or("gone".to_string(), |(s, _)| s.as_str().to_string());
            Outcome::Failed(format!("it had already ended ({st})"))
        }
        Err(e) => Outcome::Failed(e.to_string()),
    })
}

/// Whether `instance`'s journal has an event of id `id` (the journal's tail: a send batch's event
/// is among its last inputs when the server stopped just after delivering it).
async fn sent_before(b: &dyn Backend, instance: &str, id: &str) -> Result<bool, HostError> {
    let mut after = 0;
    loop {
        let page = b.history(instance, after, 500).await?;
        let Some(last) = page.last().map(|(s, _)| *s) else {
            return Ok(false);
        };
        let found = page.iter().any(|(_, e)| match e {
            Entry::Input(t) => {
                matches!(&t.input, Input::Event { event, .. } if event.get("id").and_then(Value::as_str) == Some(id))
            }
            _ => false,
        });
        if found {
            return Ok(true);
        }
        after = last;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointers(body: Value) -> Vec<String> {
        match Spec::from_json(&body, Limits::default()) {
            Ok(s) => panic!("accepted: {s:?}"),
            Err(errs) => errs.into_iter().map(|(p, _)| p).collect(),
        }
    }

    #[test]
    fn a_request_is_refused_naming_each_wrong_field() {
        assert_eq!(pointers(json!({"operation": "cancel"})), ["/where"]);
        assert_eq!(pointers(json!({"operation": "stop", "where": {}})), ["/operation"]);
        assert_eq!(
            pointers(
                json!({"operation": "cancel", "where": {"defintion": "x", "jq": ".a ==", "status": "done",
                "startedAfter": "yesterday"}, "extra": 1})
            ),
            [
                "/extra",
                "/where/defintion",
                "/where/status",
                "/where/startedAfter",
                "/where/jq"
            ]
        );
        assert_eq!(pointers(json!({"operation": "migrate", "where": {}})), ["/version"]);
        assert_eq!(
            pointers(json!({"operation": "cancel", "where": {}, "version": "2"})),
            ["/version"]
        );
        assert_eq!(
            pointers(json!({"operation": "send", "where": {}, "event": {"type": "t"}})),
            ["/event/source"]
        );
        assert_eq!(
            pointers(json!({"operation": "send", "where": {}, "event": {"type": "t", "source": "s", "id": "1"}})),
            ["/event"]
        );
        assert_eq!(
            pointers(json!({"operation": "redrive", "where": {}, "update": "{"})),
            ["/update"]
        );
        assert_eq!(
            pointers(json!({"operation": "cancel", "where": {}, "rate": 0})),
            ["/rate"]
        );
        assert_eq!(
            pointers(json!({"operation": "cancel", "where": {"a/b": 1}})),
            ["/where/a~1b"]
        );
    }

    fn share(partition: i32, phase: Phase, done: u64, failures: &[(&str, &str)]) -> Share {
        Share {
            partition,
            partitions: 3,
            request: json!({"operation": "cancel", "where": {"definition": "d"}}),
            created: 1_000 + i64::from(partition),
            bound: 0,
            cursor: 0,
            matched: 10,
            done,
            failed: failures.len() as u64,
            failures: failures.iter().map(|(i, w)| (i.to_string(), w.to_string())).collect(),
            phase: phase.as_str().into(),
            ended: (!phase.is_running()).then_some(5_000 + i64::from(partition)),
            last: 0,
        }
    }

    #[test]
    fn a_batch_is_the_sum_of_its_partitions_shares_and_runs_until_each_has_ended() {
        let a = share(0, Phase::Completed, 9, &[("x", "it had already ended (completed)")]);
        let b = share(1, Phase::Applying, 4, &[]);
        // A partition's share that has not been decided yet: the batch still runs.
        let v = render("b1", &[a.clone(), b.clone()], true).expect("a batch");
        assert_eq!(
            (v["running"].as_bool(), v["phase"].as_str()),
            (Some(true), Some("applying"))
        );
        assert_eq!(v["endedAt"], Value::Null);
        let c = share(2, Phase::Completed, 10, &[]);
        let v = render("b1", &[a.clone(), b.clone(), c.clone()], true).expect("a batch");
        assert_eq!(
            (
                v["matched"].as_u64(),
                v["done"].as_u64(),
                v["failedCount"].as_u64(),
                v["pending"].as_u64()
            ),
            (Some(30), Some(23), Some(1), Some(6)),
            "{v}"
        );
        assert_eq!(
            v["failed"],
            json!([{"instance": "x", "reason": "it had already ended (completed)"}])
        );
        assert_eq!(v["operation"], "cancel");
        assert_eq!(v["createdAt"], sm4c_runtime::engine::rfc3339(1_000));
        // Every share ended, one stopped: the batch is cancelled, ended when the last one did.
        let stopped = share(1, Phase::Cancelled, 4, &[]);
        let v = render("b1", &[a.clone(), stopped.clone(), c.clone()], true).expect("a batch");
        assert_eq!(
            (v["running"].as_bool(), v["phase"].as_str()),
            (Some(false), Some("cancelled"))
        );
        assert_eq!(v["endedAt"], sm4c_runtime::engine::rfc3339(5_002));
        // Two workers' answers that both list a partition (it moved between them) count it once,
        // and the shares read back from the rendered answers.
        let one = render("b1", &[a.clone(), c.clone()], true).expect("a batch");
        let two = render("b1", &[c.clone(), share(1, Phase::Completed, 10, &[])], true).expect("a batch");
        let merged = render("b1", &shares_of(&[one, two]), false).expect("a batch");
        assert_eq!(
            (merged["done"].as_u64(), merged["phase"].as_str()),
            (Some(29), Some("completed"))
        );
        assert!(merged.get("failed").is_none(), "a listing leaves the failures out");
        assert!(render("b1", &[], true).is_none());
    }

    #[test]
    fn dry_runs_of_several_workers_sum_and_list_in_start_order() {
        let one = json!({"dryRun": true, "operation": "cancel", "matched": 2, "truncated": false,
            "instances": [{"id": "a", "seq": 1}, {"id": "c", "seq": 3}]});
        let two = json!({"dryRun": true, "operation": "cancel", "matched": 1, "truncated": false,
            "instances": [{"id": "b", "seq": 2}]});
        let v = merge_dry_runs(&[one, two]);
        assert_eq!(v["matched"], 3);
        let ids: Vec<&str> = v["instances"]
            .as_array()
            .expect("instances")
            .iter()
            .filter_map(|i| i["id"].as_str())
            .collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(v["truncated"], false);
    }

    fn summary(status: &str, state: &str, started: &str) -> Summary {
        Summary {
            id: "i".into(),
            definition: "d".into(),
            version: "1".into(),
            status: status.into(),
            state: Some(state.into()),
            started_at: Some(started.into()),
            ended_at: None,
            parent: None,
            seq: 1,
        }
    }

    #[test]
    fn where_matches_every_field_it_gives() {
        let spec = Spec::from_json(
            &json!({"operation": "cancel", "where": {"definition": "d", "status": "failed", "state": "Pay",
                "startedAfter": "2026-01-01T00:00:00Z", "startedBefore": "2026-02-01T00:00:00Z", "jq": ".total > 10"}}),
            Limits::default(),
        )
        .expect("valid");
        let w = &spec.filter;
        assert!(w.matches_summary(&summary("failed", "Pay", "2026-01-15T00:00:00.000Z")));
        assert!(!w.matches_summary(&summary("running", "Pay", "2026-01-15T00:00:00.000Z")));
        assert!(!w.matches_summary(&summary("failed", "Ship", "2026-01-15T00:00:00.000Z")));
        assert!(!w.matches_summary(&summary("failed", "Pay", "2026-02-15T00:00:00.000Z")));
        assert!(
            !w.matches_summary(&summary("failed", "Pay", "2026-01-01T00:00:00.000Z")),
            "after is strict"
        );
        assert!(w.matches_data(&json!({"total": 11})));
        assert!(!w.matches_data(&json!({"total": 10})));
        // Anything but true (here null: there is no total) is no match.
        assert!(!w.matches_data(&json!({})));
        let not_bool = Spec::from_json(
            &json!({"operation": "cancel", "where": {"jq": ".total"}}),
            Limits::default(),
        )
        .expect("valid");
        assert!(!not_bool.filter.matches_data(&json!({"total": 1})));
        let all = Spec::from_json(&json!({"operation": "cancel", "where": {}}), Limits::default()).expect("valid");
        assert!(all
            .filter
            .matches_summary(&summary("completed", "End", "2020-01-01T00:00:00Z")));
        assert!(all.filter.matches_data(&Value::Null));
    }
}
