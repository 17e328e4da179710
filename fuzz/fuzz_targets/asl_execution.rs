//! Running what loads: the bytes are a definition and an input, split at the first NUL byte (or, with
//! none, the whole is the definition and the input is `{}`). A definition that loads is started and
//! driven for a bounded number of rounds: every timer fires, every function call completes with the
//! input as its result, every subflow completes too, every worker task is started first. Nothing may
//! panic, and an instance never takes more than `max_transitions` per input (jsonata-rs's own panics,
//! which the runtime catches, are let through: see `jsonata_panics.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use sm4c_runtime::{load, no_files, Effect, Input, Instance, LoadOptions, Options, Status, Timed};
use std::sync::Arc;

#[path = "jsonata_panics.rs"]
mod jsonata_panics;

const ROUNDS: usize = 64;
const INPUTS_PER_ROUND: usize = 64;

fuzz_target!(|data: &[u8]| {
    jsonata_panics::tolerate_jsonata_panics();
    let (def, input) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b"{}"[..]),
    };
    let Ok(doc) = serde_json::from_slice::<Value>(def) else {
        return;
    };
    let input: Value = serde_json::from_slice(input).unwrap_or_else(|_| json!({}));
    let Ok(machine) = load(&doc, &mut no_files, LoadOptions::default()) else {
        return;
    };
    let options = Options {
        // 1,000, not 10,000: a loop that appends to an array copies it on every transition, and at
        // 10,000 transitions one such input took 16 s under ASan, past libFuzzer's timeout (found
        // by the CI smoke run; see fuzz/README.md, "Findings"). `sm4c run` takes 0.7 s for it.
        max_transitions: 1_000,
        journal: true,
        ..Options::default()
    };
    let mut instance = Instance::new(Arc::new(machine), "fuzz-1", options);
    let mut now: i64 = 1_700_000_000_000;
    let out = instance.handle(Timed {
        at: now,
        input: Input::Start { data: input.clone(), scheduled: None },
    });
    let mut pending = out.effects;
    for _ in 0..ROUNDS {
        if pending.is_empty() || !matches!(instance.status(), Status::Running | Status::Waiting) {
            break;
        }
        let mut next = Vec::new();
        for effect in pending.drain(..).take(INPUTS_PER_ROUND) {
            let inputs = match effect {
                Effect::StartTimer { timer, due } => {
                    now = now.max(due);
                    vec![Input::TimerFired { timer }]
                }
                Effect::InvokeFunction {
                    op,
                    function_type,
                    wait: true,
                    ..
                } => {
                    let mut v = Vec::new();
                    if function_type == "worker" {
                        v.push(Input::TaskStarted {
                            op: op.clone(),
                            worker: None,
                        });
                    }
                    v.push(Input::Completed {
                        op,
                        result: input.clone(),
                    });
                    v
                }
                Effect::StartSubflow { op, wait: true, .. } => vec![Input::Completed {
                    op,
                    result: input.clone(),
                }],
                _ => Vec::new(),
            };
            for input in inputs {
                if !matches!(instance.status(), Status::Running | Status::Waiting) {
                    break;
                }
                let out = instance.handle(Timed { at: now, input });
                next.extend(out.effects);
            }
        }
        pending = next;
    }
});
