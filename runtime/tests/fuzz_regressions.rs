//! Regressions found by the fuzz targets in fuzz/ (see fuzz/README.md): each test is named after what
//! the fuzzer found, and failed before its fix.

use serde_json::{json, Map, Value};
use sm4c_runtime::asl::jsonata::eval_expression;
use sm4c_runtime::asl::Env;
use std::cell::Cell;

/// Resident memory of this process, in bytes (Linux only).
#[cfg(target_os = "linux")]
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// fuzz target asl_execution, LeakSanitizer: every JSONata evaluation leaked the syntax trees of the
/// `$millis` and `$now` lambdas the runtime defined ahead of each expression (jsonata-rs keeps a
/// lambda's cloned tree in its arena, which never runs destructors), about 1 KB an evaluation, for
/// the life of a server: about 16.8 KB an evaluation of `1 + 1` here before the fix (as it still is for
/// an expression that uses `$now`). The lambdas are now defined only for expressions that use them.
/// jsonata-rs still leaks about 1.8 KB an evaluation (its block frames, and the heap maps and vectors
/// of the objects and arrays it builds, `$states` among them): upstream, see fuzz/README.md; this test
/// allows up to 8 KB.
#[cfg(target_os = "linux")]
#[test]
fn jsonata_evaluation_does_not_leak_the_prelude_lambdas() {
    let per_evaluation = leaked_per_evaluation("1 + 1");
    assert!(
        per_evaluation < 8 << 10,
        "each JSONata evaluation grew the resident memory by {per_evaluation} bytes"
    );
}

/// Resident memory an evaluation of `expr` adds, in bytes, over 50,000 evaluations.
#[cfg(target_os = "linux")]
fn leaked_per_evaluation(expr: &str) -> u64 {
    let input = json!({"a": 1});
    let context = json!({"State": {"EnteredTime": "2024-01-01T00:00:00.000Z"}});
    let vars = Map::new();
    let rng = Cell::new(1);
    let env = Env {
        input: &input,
        context: &context,
        vars: &vars,
        rng: &rng,
    };
    let states = json!({"input": input, "context": context});
    let run = |n: u64| {
        for _ in 0..n {
            let v = eval_expression(expr, &states, &env).unwrap();
            assert_eq!(v, Value::from(2));
        }
    };
    run(2_000); // warm up the allocator
    let before = rss_bytes();
    run(50_000);
    rss_bytes().saturating_sub(before) / 50_000
}

/// fuzz target timespan: `1464m18244073709551615s` parsed (humantime) to 18,244,073,709,639,455,000 ms,
/// past i64 (an instance's clock), though ISO 8601 and `hh:mm:ss` refuse anything from 10^17 ms; a
/// heartbeat timeout that long became a due time in the past. Every form now has the same range.
#[test]
fn timespan_humantime_beyond_the_range_of_the_other_forms() {
    use sm4c_runtime::timespan;
    for s in [
        "1464m18244073709551615s",
        "18446744073709551615ms",
        "100000000000000000ms",
    ] {
        assert!(timespan::parse(s).is_err(), "{s} accepted: {:?}", timespan::parse(s));
    }
    assert_eq!(timespan::parse("1000000000000s"), Ok(1_000_000_000_000_000));
    assert!(timespan::parse("100000000000000s").is_err(), "10^17 ms is out of range");
}

/// Found while fixing the above: `hh:mm:ss` multiplied days and hours in u64, which overflows
/// (a panic with overflow checks, a wrong, small timespan without) for hours or days near u64::MAX.
#[test]
fn timespan_clock_hours_and_days_do_not_overflow() {
    use sm4c_runtime::timespan;
    for s in [
        "18446744073709551615:00:00",
        "5124095576030432:00:00",
        "768614336404564651.00:00:00",
    ] {
        assert!(timespan::parse(s).is_err(), "{s} accepted: {:?}", timespan::parse(s));
    }
}

/// fuzz target timespan: `18446744073709551615s0.5s0.5s` panicked in humantime ("overflow in
/// Duration::new": its carry of fractions misses exactly one second), so a definition with such a
/// timeout stopped the process that loaded it. It is now an error.
#[test]
fn timespan_humantime_fraction_carry_overflow() {
    use sm4c_runtime::timespan;
    for s in ["18446744073709551615s0.5s0.5s", "018446744073709551615.5s0.5s0.5s0.5s"] {
        assert!(timespan::parse(s).is_err(), "{s} accepted: {:?}", timespan::parse(s));
    }
}

/// The input the jq_expression fuzz target evaluates its expressions on.
fn jq_target_input() -> Value {
    json!({
        "a": 1, "b": "two", "c": [1, 2.5, "x", null, true, {"d": [3, 4]}],
        "o": {"k": {"k2": "v"}}, "n": null, "t": true, "f": -0.5, "s": "2024-01-01T00:00:00Z"
    })
}

/// fuzz target jq_expression, timeouts (`[paths[paths][paths[paths][paths]]][paths[paths][paths]]`, 8 s
/// in a release build under the default limits, and mutations of it): products of streams were free.
/// Fuel counted only definition calls, but `A[B]`, `A + B`, `A, B` and the like yield every
/// combination of their operands' values without calling one: `[range(100)] as $a | last($a[] + $a[] +
/// $a[] + $a[])` took 50 s for about 100 units of fuel, and each more `+ $a[]` a hundred times longer.
/// Every value of `l, r`, `..` and an iteration (`.[]`) now burns a unit, so these stop at the fuel
/// limit. Here, 6,859 paths (19 paths, indexed by 19, indexed by 19) must not be built for 5,000 units.
#[test]
fn jq_products_of_streams_burn_fuel() {
    use sm4c_runtime::{Expr, Limits};
    let limits = Limits {
        fuel: 5_000,
        ..Limits::default()
    };
    let input = jq_target_input();
    // What the fuzzer found: the values of the index products, built or discarded.
    for code in [
        "[paths[paths][paths]] | length",
        "last(paths[paths][paths])",
        "[range(30)] as $a | last($a[] + $a[] + $a[])",
        "last((0, 1, 2, 3, 4, 5, 6, 7, 8, 9) * (0, 1, 2, 3, 4, 5, 6, 7, 8, 9) * (0, 1, 2, 3, 4, 5, 6, 7, 8, 9) * (0, 1, 2, 3, 4, 5, 6, 7, 8, 9))",
        "last(.. as $a | .. as $b | .. as $c | 0)",
    ] {
        let expr = Expr::compile(code, &[], limits).unwrap();
        let err = expr.eval_json(&input).unwrap_err();
        assert!(err.out_of_fuel && err.message.contains("5000 steps"), "{code}: {err:?}");
    }
    // Ordinary work still fits: 19 paths, each indexed by 19, is 361 values.
    let expr = Expr::compile("[paths[paths]] | length", &[], limits).unwrap();
    assert_eq!(expr.eval_json(&input).unwrap(), json!(361));
}

/// fuzz target jq_expression, out of memory (`.k.x = .f = .f | .e = .f = .f | ...`, 16 GB of RSS and
/// 22 s in a release build, for 852 MB of JSON, within the fuel): jq shares values instead of copying
/// them, so `.a = .` and `[., .]` build next to nothing while the value they yield, written out,
/// doubles. Only what was built counted against the memory limit; the shared result then grew without
/// bound where the host turned it into JSON (an instance's data, an error's payload). Every value an
/// expression yields, and an error's payload, now counts in full, shares as often as they appear.
#[test]
fn jq_shared_values_count_in_full_in_what_an_expression_yields() {
    use sm4c_runtime::{Expr, Limits};
    let limits = Limits {
        fuel: 100_000,
        ..Limits::default()
    };
    let input = jq_target_input();
    // Each pair of assignments (the direct evaluator's `.a.b = r`) nearly doubles the input.
    let doubled = |n: usize| vec![".a = . | .b = ."; n].join(" | ");
    for code in [
        // What the fuzzer found.
        ".k.deccAQQcceccrceccredi0=.f=.fredi4=.f=.frexpc4k|.e__tick4=.f=.fredi4=.f=.frexpc4k|.decedi4=.oeccecrceccredi0=.f=.fredi4=.f=.frexpc4k|.eccredi4=.f=.fredi4=.f=.frexpzexpc4k|.e__tick4=.f=.fredi4=.f=.frexpc4k|.deredi4QQQQQQQQQQQQQQQQQQQQQQQQQQQQAQQcceccrceccredi0=.f=.fredi4=.f=.frexpc4k|.e__tick4=.f=.fredi4=.f=.frexpc4k|.decedi4=.oeccecrceccredi0=.f=.fredi4=.f=.frexpc4k|.eccredi4=.f=.fredi4=.f=.frexpzexpc4k|.e__tick4=.f=.fredi4=.f=.frexpc4k|.decedi4=.oeccecrceccredi0=.f=.fredi4=.reexp0",
        &doubled(30),
        "reduce range(40) as $i ([1]; [., .])",
        "reduce range(40) as $i ({}; {a: ., b: .})",
        "[limit(2; repeat(reduce range(40) as $i ([1]; [., .])))]",
        "error(reduce range(40) as $i ([1]; [., .]))",
    ] {
        let expr = Expr::compile(code, &[], limits).unwrap();
        let err = match expr.eval_json(&input) {
            Ok(v) => panic!("{code}: yielded {} bytes of JSON", v.to_string().len()),
            Err(e) => e,
        };
        assert!(
            err.out_of_fuel && err.message.contains("more than 67108864 bytes"),
            "{code}: {err:?}"
        );
    }
    // What fits still runs, shared or not (4,408 paths, as jq 1.7 counts them).
    for (code, want) in [
        ("reduce range(10) as $i ([1]; [., .]) | flatten | length", json!(1024)),
        ("try error(reduce range(40) as $i ([1]; [., .])) catch length", json!(2)),
        (&format!("{} | [paths] | length", doubled(5)) as &str, json!(4_408)),
    ] {
        let expr = Expr::compile(code, &[], limits).unwrap();
        assert_eq!(expr.eval_json(&input).unwrap(), want, "{code}");
    }
    let expr = Expr::compile(&doubled(5), &[], limits).unwrap();
    assert!(expr.eval_json(&input).unwrap()["b"]["a"]["b"]["a"]["o"]["k"]["k2"] == json!("v"));
}
