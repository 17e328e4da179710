//! Arbitrary values written through the durable store and read back (issue 35, item 1): the input
//! bytes build a JSON value (any nesting, up to the input's length), which is committed to a real
//! SQLite store (`SqliteStore`, in memory) as an instance's data (in its snapshot), a parked event and
//! a sent event, and then read back through the `Store` trait (`instance`, `parked`, `outbox`).
//! What must hold: a value within `MAX_DEPTH` (what the hosts let in) always reads back equal; any
//! other value reads back equal or is refused with `StoreError::Corrupt` naming the read depth; never
//! a panic or a stack overflow.
//!
//! One store serves [`ROUNDS`] inputs in turn (opening one, which creates its schema, took most of
//! an input's time: about 210 inputs a second under ASan): each input overwrites instance `i`, reads
//! the sent events after the last one read, and parks its event until the next input's time (input
//! `n` parks it to expire at `n + 1` and reads the parked events at `n`: the read drops the earlier
//! ones, unreadable ones included), so what one input wrote never answers for the next.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};
use sm4c_durable::store::{Batch, InstanceWrite, SqliteStore, Store, StoreError};
use sm4c_runtime::json::{from_val, to_val, too_deep, MAX_DEPTH};
use sm4c_runtime::{load, no_files, Instance, LoadOptions, Machine, Options};
use std::sync::{Arc, LazyLock, Mutex};

/// Deepest value built: past the store's read depth, far below what the fuzzer's stack holds.
const MOST: usize = 600;

static MACHINE: LazyLock<Arc<Machine>> = LazyLock::new(|| {
    let doc = json!({"id": "w", "name": "W", "version": "1",
        "events": [{"name": "go", "type": "go", "source": "t"}],
        "states": [{"name": "Wait", "start": true, "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["go"]}]}]},
                   {"name": "Done"}]});
    Arc::new(load(&doc, &mut no_files, LoadOptions::default()).expect("a valid definition"))
});

/// Inputs one store serves before a fresh one is opened (parked events that do not read back stay in
/// it until then).
const ROUNDS: u32 = 1000;

/// The store, how many inputs it has served, and the sequence number of the last sent event read.
struct Turn {
    store: SqliteStore,
    served: u32,
    sent: i64,
}

static STORE: Mutex<Option<Turn>> = Mutex::new(None);

fn fresh() -> Turn {
    Turn {
        store: SqliteStore::open(std::path::Path::new(":memory:")).expect("a store"),
        served: 0,
        sent: 0,
    }
}

/// A value from the bytes: each byte opens an array or object, closes one, or adds a scalar.
fn value(data: &[u8]) -> Value {
    let mut stack: Vec<(Value, Option<String>)> = vec![(json!([]), None)];
    let mut key = 0u32;
    let mut bytes = data.iter().copied();
    while let Some(b) = bytes.next() {
        let scalar = match b % 8 {
            0 if stack.len() < MOST => {
                stack.push((json!([]), None));
                continue;
            }
            1 if stack.len() < MOST => {
                stack.push((Value::Object(Map::new()), None));
                continue;
            }
            2 if stack.len() > 1 => {
                let (v, _) = stack.pop().expect("open");
                v
            }
            3 => json!(i64::from(bytes.next().unwrap_or(0)) - 128),
            4 => json!(f64::from(bytes.next().unwrap_or(0)) / 7.0),
            5 => json!(format!("s{}\"[{{\\", bytes.next().unwrap_or(0))),
            6 => json!(b & 0x10 != 0),
            _ => Value::Null,
        };
        push(&mut stack, scalar, &mut key);
    }
    while stack.len() > 1 {
        let (v, _) = stack.pop().expect("open");
        push(&mut stack, v, &mut key);
    }
    let (mut root, _) = stack.pop().expect("the root");
    // A single value stands for itself.
    match root.as_array_mut() {
        Some(a) if a.len() == 1 => a.pop().expect("one"),
        _ => root,
    }
}

fn push(stack: &mut [(Value, Option<String>)], v: Value, key: &mut u32) {
    let (top, _) = stack.last_mut().expect("the root");
    match top {
        Value::Array(a) => a.push(v),
        Value::Object(o) => {
            *key += 1;
            o.insert(format!("k{key}"), v);
        }
        _ => {}
    }
}

/// Read back equal, or refused as corrupt, and always read back when within the door's limit.
fn check<T: PartialEq + std::fmt::Debug>(what: &str, wrote: &T, read: Result<T, StoreError>, shallow: bool) {
    match read {
        Ok(back) => assert_eq!(&back, wrote, "{what} read back different"),
        Err(StoreError::Corrupt(e)) => {
            assert!(!shallow, "{what} within {MAX_DEPTH} levels did not read back: {e}");
            assert!(e.contains("more than the"), "{what}: {e}");
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let v = value(data);
    let shallow = too_deep(&v, MAX_DEPTH).is_none();
    let mut turn = STORE.lock().unwrap_or_else(|p| p.into_inner());
    if turn.as_ref().is_none_or(|t| t.served >= ROUNDS) {
        *turn = Some(fresh());
    }
    let turn = turn.as_mut().expect("a store");
    turn.served += 1;
    let store = &turn.store;
    let mut snapshot = Instance::new(MACHINE.clone(), "i", Options::default()).snapshot().clone();
    snapshot.data.0 = to_val(&v);
    // What the engine keeps is what a jq value says: compare with that.
    let data_as_kept = from_val(&snapshot.data.0);
    let batch = Batch {
        instances: vec![InstanceWrite {
            snapshot,
            parent: None,
            entries: Vec::new(),
            calls: Vec::new(),
            origin: None,
        }],
        outbox: vec![("i".to_string(), v.clone(), 0)],
        parked: vec![(v.clone(), i64::from(turn.served) + 1)],
        ..Batch::default()
    };
    store.commit(&batch).expect("committed");
    let instance = store
        .instance("i")
        .map(|s| from_val(&s.expect("the instance").snapshot.data.0));
    check("the instance's data", &data_as_kept, instance, shallow);
    // The earlier inputs' parked events have expired: at most this one reads back.
    let parked = store.parked(i64::from(turn.served)).expect("parked");
    assert!(parked.len() <= 1, "{} parked events read back", parked.len());
    // A parked event that does not read back is passed over (and counted), not an error.
    match parked.first() {
        Some((_, e)) => assert_eq!(e, &v, "the parked event read back different"),
        None => assert!(!shallow, "a parked event within {MAX_DEPTH} levels was passed over"),
    }
    // A sent event that does not read back is listed with why (a row of its own), not an error.
    let mut sent = store.outbox(turn.sent, 2).expect("outbox");
    assert_eq!(sent.len(), 1, "one sent event after the last one read");
    let (seq, _, read) = sent.pop().expect("the sent event");
    turn.sent = seq;
    check("the sent event", &v, read.map_err(StoreError::Corrupt), shallow);
});
