//! jq in the sandbox: the text is compiled as an expression under the default limits and evaluated
//! against a small JSON input, through both the direct evaluator and jaq. It must compile or say why,
//! and evaluate or say why (a limit stops it), never panic, hang or exhaust memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use sm4c_runtime::{Expr, Limits};
use std::sync::OnceLock;

fn input() -> &'static Value {
    static I: OnceLock<Value> = OnceLock::new();
    I.get_or_init(|| {
        json!({
            "a": 1, "b": "two", "c": [1, 2.5, "x", null, true, {"d": [3, 4]}],
            "o": {"k": {"k2": "v"}}, "n": null, "t": true, "f": -0.5, "s": "2024-01-01T00:00:00Z"
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(expr) = Expr::compile(text, &[], Limits::default()) else {
        return;
    };
    let _ = expr.eval_json(input());
});
