//! What a Kafka worker decodes from the records it reads back (sm4c-kafka's `fuzzing` module, which calls
//! the worker's own code): the first byte's low three bits (modulo 5) select the kind, the rest is the record.
//! - 0: a commands-topic payload → `wire::Command`.
//! - 1: `key\npayload`, a state-topic record → `wire::StateRecord`, judged by `wire::committed`; an instance
//!   record of one of the registered definitions (approval-with-timeout, travel-saga, word-count-worker,
//!   loan-with-subflow, the Kafka test saga and the ASL flow) is restored through the driver, then its timers
//!   fire, its calls in flight return, an event arrives and it is cancelled; the partition record and
//!   parked/tally records give their keys.
//! - 2: `key\nclock`, a state-topic tombstone whose `sm4c-clock` header is `clock` (no header when there is
//!   no newline).
//! - 3: a journal-topic payload → `wire::JournalRecord`, judged by `wire::committed`.
//! - 4: an events-topic record: header lines (`name: value`; a line without a colon is a header without a
//!   value), an empty line, the payload (no payload and no headers when there is no empty line: the whole
//!   rest is then a payload without headers) → the worker's `read_event`, binary (`ce_*` headers) or
//!   structured (`content-type: application/cloudevents+json`) mode.
//!
//! The first byte's top bit set means nothing is committed yet (committed offsets 0), else every offset
//! below 2^40 is. Each record gives a value or is skipped, never a panic.
//!
//! With `SM4C_FUZZ_SEEDS=<dir>` set, the first run writes seeds in this format to `<dir>`: the records a
//! worker writes for instances of the registered definitions started by the real driver
//! (`Records::samples`; fuzz/seed-corpus.sh does this).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sm4c_kafka::fuzzing::Records;
use std::sync::LazyLock;

static RECORDS: LazyLock<Records> = LazyLock::new(|| {
    let docs = [
        include_str!("../../samples/approval-with-timeout/definition.json"),
        include_str!("../../samples/travel-saga/definition.json"),
        include_str!("../../samples/word-count-worker/definition.json"),
        include_str!("../../samples/loan-with-subflow/definition.json"),
        include_str!("../../host/cli/tests/data/kafka/saga.json"),
        include_str!("../../host/cli/tests/data/asl/flow.asl.json"),
    ];
    let docs: Vec<serde_json::Value> = docs.iter().filter_map(|d| serde_json::from_str(d).ok()).collect();
    let records = Records::new(&docs);
    if let Ok(dir) = std::env::var("SM4C_FUZZ_SEEDS") {
        let _ = std::fs::create_dir_all(&dir);
        for (n, s) in records.samples().into_iter().enumerate() {
            let _ = std::fs::write(std::path::Path::new(&dir).join(format!("driver-{n}")), s);
        }
    }
    records
});

fn split(data: &[u8], sep: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let i = data.windows(sep.len()).position(|w| w == sep)?;
    Some((data[..i].to_vec(), data[i + sep.len()..].to_vec()))
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let (committed, clock) = if first & 0x80 != 0 { (0, 0) } else { (1 << 40, 1 << 40) };
    let r = &*RECORDS;
    match (first & 7) % 5 {
        0 => r.command(rest),
        1 => {
            let (key, payload) = split(rest, b"\n").unwrap_or((Vec::new(), rest.to_vec()));
            r.state(&String::from_utf8_lossy(&key), Some(&payload), &[], committed, clock);
        }
        2 => {
            let headers = match split(rest, b"\n") {
                Some((key, value)) => (key, vec![("sm4c-clock".to_string(), Some(value))]),
                None => (rest.to_vec(), Vec::new()),
            };
            r.state(&String::from_utf8_lossy(&headers.0), None, &headers.1, committed, clock);
        }
        3 => r.journal(rest, committed, clock),
        _ => {
            let Some((head, body)) = split(rest, b"\n\n") else {
                let _ = r.event(Some(rest), &[]);
                return;
            };
            let mut headers = Vec::new();
            for line in head.split(|&b| b == b'\n') {
                match line.iter().position(|&b| b == b':') {
                    Some(c) => headers.push((
                        String::from_utf8_lossy(&line[..c]).into_owned(),
                        Some(line[c + 1..].trim_ascii().to_vec()),
                    )),
                    None => headers.push((String::from_utf8_lossy(line).into_owned(), None)),
                }
            }
            let _ = r.event(Some(&body), &headers);
        }
    }
});
