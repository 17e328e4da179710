//! Definition loading and validation: arbitrary bytes, read as JSON, loaded as a definition. SM4C and
//! ASL (a document with `StartAt` and `States`) both go through `load`; it must answer `Ok` or a list of
//! errors, never panic (jsonata-rs's own panics, which the runtime catches, are let through: see
//! `jsonata_panics.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sm4c_runtime::{load, no_files, LoadOptions};

#[path = "jsonata_panics.rs"]
mod jsonata_panics;

fuzz_target!(|data: &[u8]| {
    jsonata_panics::tolerate_jsonata_panics();
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = load(&doc, &mut no_files, LoadOptions::default());
});
