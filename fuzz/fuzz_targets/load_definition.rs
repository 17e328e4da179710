//! Definition loading and validation: arbitrary bytes, read as JSON, loaded as a definition. SM4C and
//! ASL (a document with `StartAt` and `States`) both go through `load`; it must answer `Ok` or a list of
//! errors, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sm4c_runtime::{load, no_files, LoadOptions};

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = load(&doc, &mut no_files, LoadOptions::default());
});
