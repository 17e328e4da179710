//! ASL's small languages: the text is parsed as a JSONPath / Reference Path, as an intrinsic function
//! call (`States.Format(...)`), and as a JSONata expression (`{% ... %}`); whatever parses is evaluated
//! against a fixed input, context and variables. Nothing may panic.
//!
//! jsonata-rs panics on some inputs; the runtime catches those with `catch_unwind` and reports a
//! `States.QueryEvaluationError`. libFuzzer's panic hook would abort on them all the same, so this
//! target lets a panic whose location is inside jsonata-rs unwind to that `catch_unwind` (see
//! `jsonata_panics.rs`). Every other panic aborts as usual.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};
use sm4c_runtime::asl::intrinsics::Call;
use sm4c_runtime::asl::jsonata::Query;
use sm4c_runtime::asl::path::Path;
use sm4c_runtime::asl::Env;
use sm4c_runtime::kernel::Random;
use std::cell::Cell;
use std::sync::OnceLock;

struct Fixture {
    input: Value,
    context: Value,
    vars: Map<String, Value>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| Fixture {
        input: json!({
            "a": 1, "b": "two", "c": [1, 2.5, "x", null, true, {"d": [3, 4]}],
            "nested": {"deep": {"deeper": {"k": "v"}}, "list": [{"n": 1}, {"n": 2}]},
            "s": "a,b,c", "empty": {}, "none": null, "big": 1e300, "neg": -7, "t": true,
            "text": "héllo wörld", "json": "{\"x\": [1, 2]}", "b64": "aGVsbG8="
        }),
        context: json!({
            "Execution": {"Id": "arn:exec:1", "Input": {"a": 1}, "Name": "fuzz", "StartTime": "2024-01-01T00:00:00.000Z"},
            "State": {"EnteredTime": "2024-01-01T00:00:01.000Z", "Name": "S", "RetryCount": 0},
            "StateMachine": {"Id": "arn:sm:1", "Name": "sm"},
            "Map": {"Item": {"Index": 0, "Value": {"a": 1}}}
        }),
        vars: json!({"x": 1, "name": "n", "arr": [1, 2, 3], "obj": {"k": [true]}})
            .as_object()
            .cloned()
            .unwrap(),
    })
}

#[path = "jsonata_panics.rs"]
mod jsonata_panics;
use jsonata_panics::tolerate_jsonata_panics;

fuzz_target!(|data: &[u8]| {
    tolerate_jsonata_panics();
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let f = fixture();
    let rng = Cell::new(Random::new(42));
    let env = Env {
        input: &f.input,
        context: &f.context,
        vars: &f.vars,
        rng: &rng,
    };

    if let Ok(path) = Path::parse(text) {
        let _ = path.text();
        let _ = path.is_definite();
        let _ = path.read(&env);
        let _ = path.read_value(&f.input);
        if path.is_reference() {
            let _ = path.write(f.input.clone(), json!({"w": 1}));
            let _ = path.write(json!(null), json!([1]));
        }
    }

    if let Ok(call) = Call::parse(text) {
        let _ = call.eval(&env);
    }

    let states = json!({"input": f.input, "context": f.context});
    let as_expression = if text.starts_with("{%") {
        text.to_string()
    } else {
        format!("{{% {text} %}}")
    };
    for v in [json!(as_expression), json!({"k": [as_expression, 1]})] {
        if let Ok(query) = Query::parse(&v) {
            let _ = query.eval(&states, &env);
        }
    }
});
