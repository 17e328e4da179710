//! The golden stored-format test of the SQLite store: `tests/golden/store.sqlite` was written by an
//! earlier build of `sm4c serve` (`scripts/golden.sh`, see `tests/golden/README.md`), and today's
//! code must read every row of it as it was written. For each instance: the stored snapshot
//! deserializes and serializes back to the same bytes; its journal deserializes, entry by entry,
//! back to the same JSON; and replaying the journal (the runtime's fold over it) gives the stored
//! snapshot, as equal JSON values. The open calls, timers, schedule and batch rows read back too.
//! `host/cli/tests/golden.rs` serves the same file and takes the waiting instances to their ends.

use rusqlite::Connection;
use serde_json::Value;
use sm4c_durable::store::{SqliteStore, Store};
use sm4c_host::batch::BatchStore;
use sm4c_runtime::{load, no_files, Effect, Entry, Instance, LoadOptions, Machine, Options, Snapshot, Status};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The fixture, copied to a temporary folder (a store opened writes its write-ahead log beside it).
fn copy() -> (tempfile::TempDir, PathBuf) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/store.sqlite");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("store.sqlite");
    std::fs::copy(&fixture, &path).unwrap_or_else(|e| panic!("cannot copy {}: {e}", fixture.display()));
    (dir, path)
}

/// Every instance the generator leaves, with its stored status (the schedule's run, whose id holds
/// the time it ran, is checked apart).
const INSTANCES: &[(&str, Status)] = &[
    ("sm4c-event", Status::Waiting),
    ("sm4c-timer", Status::Waiting),
    ("sm4c-parallel", Status::Running),
    ("sm4c-completed", Status::Completed),
    ("sm4c-failed", Status::Failed),
    ("sm4c-cancelled", Status::Cancelled),
    ("sm4c-parent", Status::Running),
    ("sm4c-parent/1.enter", Status::Running),
    ("asl-wait", Status::Waiting),
    ("asl-map", Status::Waiting),
    ("asl-token", Status::Waiting),
    ("asl-succeeded", Status::Completed),
    ("asl-failed", Status::Failed),
];

/// The raw rows: each instance's snapshot text, and its journal rows' text in order.
fn raw(path: &Path) -> (BTreeMap<String, String>, BTreeMap<String, Vec<String>>) {
    let conn = Connection::open(path).expect("open the copy");
    let snapshots = conn
        .prepare("SELECT id, snapshot FROM instances")
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .expect("read the instances");
    let mut journals: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let rows: Vec<(String, String)> = conn
        .prepare("SELECT instance, entry FROM journal ORDER BY instance, seq")
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .expect("read the journal");
    for (id, entry) in rows {
        journals.entry(id).or_default().push(entry);
    }
    (snapshots, journals)
}

/// The registered definitions, loaded as the durable host loads them.
fn machines(store: &SqliteStore) -> BTreeMap<(String, String), Arc<Machine>> {
    store
        .definitions()
        .expect("the definitions read back")
        .into_iter()
        .map(|doc| {
            let m = load(&doc, &mut no_files, LoadOptions::default())
                .unwrap_or_else(|e| panic!("a stored definition no longer loads: {e:?}\n{doc}"));
            ((m.id.clone(), m.version.clone()), Arc::new(m))
        })
        .collect()
}

#[test]
fn every_stored_snapshot_reads_back_byte_for_byte_and_its_journal_replays_to_it() {
    let (_dir, path) = copy();
    let (snapshots, journals) = raw(&path);
    let store = SqliteStore::open(&path).expect("today's code opens the golden store");
    let machines = machines(&store);
    assert_eq!(machines.len(), 10, "the ten golden definitions are registered");

    let listed = store.list(None, None, 0, 1000).expect("list");
    let mut ids: Vec<&str> = listed.iter().map(|s| s.id.as_str()).collect();
    ids.sort_unstable();
    let runs: Vec<&&str> = ids.iter().filter(|id| id.starts_with("golden-hourly@")).collect();
    assert_eq!(runs.len(), 1, "the schedule ran once: {ids:?}");
    let mut expected: Vec<&str> = INSTANCES.iter().map(|(id, _)| *id).chain([*runs[0]]).collect();
    expected.sort_unstable();
    assert_eq!(ids, expected, "the instances listed");

    for id in &ids {
        let text = &snapshots[*id];
        // The snapshot deserializes, and serializes back to the very bytes stored.
        let snapshot: Snapshot = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("the stored snapshot of {id} does not deserialize: {e}\n{text}"));
        assert_eq!(
            &serde_json::to_string(&snapshot).expect("serialize"),
            text,
            "the snapshot of {id} does not serialize back to what was stored"
        );
        let stored = store.instance(id).expect("read").expect("the instance is there");
        assert_eq!(stored.snapshot, snapshot, "{id}: the store reads the row as serde does");

        // Each journal row (a JSON array of entries) deserializes and serializes back to itself.
        let rows = journals.get(*id).unwrap_or_else(|| panic!("{id} has no journal rows"));
        let mut from_rows: Vec<Entry> = Vec::new();
        for row in rows {
            let entries: Vec<Entry> = serde_json::from_str(row)
                .unwrap_or_else(|e| panic!("a journal row of {id} does not deserialize: {e}\n{row}"));
            assert_eq!(
                &serde_json::to_string(&entries).expect("serialize"),
                row,
                "a journal row of {id} does not serialize back to what was stored"
            );
            from_rows.extend(entries);
        }
        let journal: Vec<Entry> = store
            .history(id, 0, usize::MAX)
            .expect("history")
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        assert_eq!(
            journal, from_rows,
            "{id}: the store reads the journal rows as serde does"
        );
        assert_eq!(journal.len() as i64, stored.journal_len, "{id}: journal length");

        // Replaying the journal gives the stored snapshot.
        let key = (snapshot.definition.clone(), snapshot.version.clone());
        let machine = machines
            .get(&key)
            .unwrap_or_else(|| panic!("{id}: definition {key:?} is not registered"));
        let versions = |v: &str| machines.get(&(snapshot.definition.clone(), v.to_string())).cloned();
        let replayed = Instance::replay_versions(machine.clone(), id, &journal, Options::default(), &versions)
            .unwrap_or_else(|e| panic!("the journal of {id} no longer replays: {e}"));
        let diffs = sm4c_runtime::engine::snapshot_differences(replayed.snapshot(), &snapshot);
        assert!(
            diffs.is_empty(),
            "replaying the journal of {id} does not give its stored snapshot: {}",
            diffs.join("; ")
        );
        assert_eq!(
            serde_json::to_value(replayed.snapshot()).expect("serialize"),
            serde_json::from_str::<Value>(text).expect("json"),
            "replaying the journal of {id} does not give its stored snapshot"
        );
    }

    // The open calls' rows: each effect deserializes and serializes back to its bytes.
    let conn = Connection::open(&path).expect("open the copy");
    let calls: Vec<(String, String)> = conn
        .prepare("SELECT instance, effect FROM calls")
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .expect("read the calls");
    assert!(calls.len() >= 6, "the fixture has open calls: {calls:?}");
    for (id, text) in &calls {
        let effect: Effect = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("an open call of {id} does not deserialize: {e}\n{text}"));
        assert_eq!(
            &serde_json::to_string(&effect).expect("serialize"),
            text,
            "an open call of {id} does not serialize back to what was stored"
        );
    }

    for (id, status) in INSTANCES {
        let stored = store.instance(id).expect("read").expect("there");
        assert_eq!(stored.snapshot.status, *status, "{id}: status");
    }
}

#[test]
fn the_stored_shapes_are_those_the_fixture_is_for() {
    let (_dir, path) = copy();
    let store = SqliteStore::open(&path).expect("open");
    let snapshot =
        |id: &str| serde_json::to_value(store.instance(id).expect("read").expect("there").snapshot).expect("json");

    // The failed instance keeps where a redrive resumes: its parallel action, two calls open.
    let failed = snapshot("sm4c-failed");
    assert_eq!(failed["redrive"]["point"]["at"], "action", "{failed}");
    assert_eq!(failed["error"]["type"], "functionError", "{failed}");

    // Open calls: the parallel/foreach instance's two, the child's one, and the ASL tasks.
    let calls = |id: &str| store.calls_of(id).expect("calls").len();
    assert_eq!(
        calls("sm4c-parallel"),
        2,
        "the parallel's own call answered, the foreach's two (maxParallel 2) open"
    );
    assert_eq!(calls("sm4c-parent"), 1, "the subflow start");
    assert_eq!(calls("sm4c-parent/1.enter"), 1, "the child's call to a worker");
    assert_eq!(calls("asl-token"), 1);
    assert!(
        calls("asl-map") >= 2,
        "the Map's and the Parallel's other branch's tasks"
    );
    assert_eq!(
        snapshot("sm4c-parent/1.enter")["parent"],
        Value::Null,
        "a child's parent is in its row"
    );
    assert_eq!(
        store.parent_of("sm4c-parent/1.enter").expect("row").map(|p| p.instance),
        Some("sm4c-parent".to_string())
    );

    // Timers: the timeout transition's and the Wait state's.
    let mut timers: Vec<String> = store.timers().expect("timers").into_iter().map(|t| t.0).collect();
    timers.sort_unstable();
    assert_eq!(timers, ["asl-wait", "sm4c-timer"]);

    // The schedule, paused after one run; the batch that cancelled one instance.
    let schedules = store.schedules().expect("schedules");
    assert_eq!(schedules.len(), 1);
    let (id, row) = &schedules[0];
    assert_eq!(id, "golden-hourly");
    let (spec, state) = row.as_ref().expect("the schedule reads back");
    assert_eq!(spec["definition"], "asl-pass", "{spec}");
    let state: sm4c_schedule::State = serde_json::from_value(state.clone()).expect("the schedule's state reads back");
    assert_eq!(
        serde_json::to_value(&state).expect("json"),
        row.as_ref().expect("row").1,
        "the schedule's state serializes back to what was stored"
    );
    let batches = store.batches().expect("batches");
    assert_eq!(batches.len(), 1);
    let counts = store.counts(&batches[0].id).expect("counts");
    assert_eq!((counts.matched, counts.done, counts.failed), (1, 1, 0));
}
