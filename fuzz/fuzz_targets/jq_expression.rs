//! jq in the sandbox: the text is compiled as an expression under limits smaller than the defaults
//! (fuel 10,000 steps, 4 MiB built in all, strings of 1 MiB, 65,536 entries), and evaluated against a
//! small JSON input, through both the direct evaluator and jaq. It must compile or say why, and
//! evaluate or say why (a limit stops it), never panic, hang or exhaust memory. A step can cost several
//! microseconds (a value of a product of `paths` indexes: the default million took 6.7 s in the
//! non-sanitized build, longer under ASan, near libFuzzer's 10 s timeout on a busy machine). The target
//! shows that evaluation stops at its limits, whatever they are; smaller ones let the inputs that reach
//! them end sooner, which leaves time for more inputs (10 million executions in one run).
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
    let limits = Limits {
        fuel: 10_000,
        memory: 4 << 20,
        max_string: 1 << 20,
        max_items: 1 << 16,
        ..Limits::default()
    };
    let Ok(expr) = Expr::compile(text, &[], limits) else {
        return;
    };
    let _ = expr.eval_json(input());
});
