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

/// fuzz target asl_execution (non-sanitized build, twice: 2 minutes into a run and after 1.3 million
/// executions): a stack overflow (SIGSEGV, no report) in jsonata-rs, which walks an expression's
/// syntax tree recursively after parsing it. Brackets and runs of prefix operators were bounded
/// (64 levels), but not chains of binary operators: `1+1+...+1` with 2,000 `+` (4 KB of text) is a
/// tree 2,000 deep and overflowed the main thread's 8 MiB; 600 overflowed a 2 MiB thread, the
/// default of a thread an application spawns. Chains of more than 200 operators (the crate stops
/// evaluating at a depth of 200 anyway) are now refused
/// when the definition is loaded and when the expression is evaluated; refusing them takes no stack
/// (checked here on a 2 MiB thread).
#[test]
fn jsonata_operator_chains_are_refused_before_they_exhaust_the_stack() {
    let refusals = || {
        let refused = |chain: String| {
            let def = json!({
                "QueryLanguage": "JSONata", "StartAt": "S",
                "States": {"S": {"Type": "Pass", "Output": format!("{{% {chain} %}}"), "End": true}}
            });
            let mut no_files = |name: &str| Err(format!("no file {name}"));
            let errs = match sm4c_runtime::load(&def, &mut no_files, sm4c_runtime::LoadOptions::default()) {
                Ok(_) => panic!("loaded: {}", &chain[..40]),
                Err(e) => e,
            };
            let text = format!("{errs:?}");
            assert!(
                text.contains("chains more than 200 operators") || text.contains("more than 600 operator characters"),
                "{}: {text}",
                &chain[..40]
            );
            let context = json!({});
            let env = Env {
                input: &Value::Null,
                context: &context,
                vars: &Map::new(),
                rng: &Cell::new(1),
            };
            let err = eval_expression(&chain, &json!({}), &env).expect_err("refused");
            let text = format!("{err:?}");
            assert!(
                text.contains("chains more than 200") || text.contains("more than 600 operator"),
                "{text}"
            );
        };
        for (unit, last) in [
            ("1+", "1"),
            ("a.", "a"),
            ("1 and ", "1"),
            ("1 in ", "[1]"),
            ("1?1:", "1"),
            ("$a:=", "1"),
            ("'a'&", "'a'"),
            ("1~>", "$string()"),
            ("(1)+", "1"),
        ] {
            refused(format!("{}{last}", unit.repeat(2_000)));
        }
    };
    // Refused before the crate parses them: nothing of the stack is used.
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(refusals)
        .expect("thread")
        .join()
        .expect("no panic");
    // 150 chained operators, and paths and conditions of ordinary size, still run (on 16 MiB: this
    // test's debug build takes several times the stack per level of the release build).
    let accepted = || {
        let context = json!({});
        let env = Env {
            input: &Value::Null,
            context: &context,
            vars: &Map::new(),
            rng: &Cell::new(1),
        };
        let states = json!({"input": {"a": {"b": [1, 2, 3]}, "c": -2}});
        for (expr, want) in [
            (format!("{}1", "1+".repeat(150)), json!(151)),
            (
                "$states.input.a.b[1] * 2 + ($states.input.c > -3 ? 10 : 20) - -1".to_string(),
                json!(15),
            ),
            (
                "$states.input.a.b[$ >= 2] ~> $count() = 2 and 'x' in ['x', 'y']".to_string(),
                json!(true),
            ),
        ] {
            assert_eq!(eval_expression(&expr, &states, &env).expect(&expr), want, "{expr}");
        }
    };
    std::thread::Builder::new()
        .stack_size(16 << 20)
        .spawn(accepted)
        .expect("thread")
        .join()
        .expect("no panic");
}

/// fuzz target jq_expression, a timeout (189 s and 2 GB in the non-sanitized build, after the fix
/// above): an evaluation that fails on a value it shares with itself (`cannot index {..} with ..`).
/// jaq writes the values an error names into its message, and writing this one never ended. The
/// message is now written with a bound (`--expression-max-string`) before it is kept.
#[test]
fn jq_errors_naming_shared_values_are_written_with_a_bound() {
    use sm4c_runtime::{Expr, Limits};
    let limits = Limits {
        fuel: 100_000,
        ..Limits::default()
    };
    let input = jq_target_input();
    for code in [
        // What the fuzzer found.
        ".knancanccGedi4QQQQQQQQQQQQQQQ0.fredi4=.f=.frexpc4k|.ecQQQQQQQQQ0.fredi4=.f=.frexpc4k|.eccri4=.f=.frexpc4k|.eccredi4=.f=.fredi4=.f=.frexpc4k|.decedi4=.redi4QQQQQQQQQQQQQQQ0.fredi4=.f=.frexpc4k|.ecQQQQQQQQoecedi4=.f=.frediedi4=.f=.frexpc4k|.ecQQQQQQQQQ0.fredi4=.f=.frexpc4k|.eccri4=.f=.frexpc4k|.eccredi4=.f=.fredi4=.f=.frexpc4k|.decedi4ccredi4=.f=.fddec+[][].cGedi4QQQQQQQQQQQQQQQ0.fredi4=.f=.frexpc4k|.ecQQQQQQQQQ0.fredi4=.f=.frexpc4k|.eccri4=.f=.frexpc4k|.eccredi4=.f=.fredi4=.f=.frexpc4k|.decedi4=.redi4QQQQQQQQQQQQQQQ0.fredi4=.f=.frexpc4k|.ecQQQQQQQQoecedi4=.f=.frediedi4=.f=.frexpc4k|.ecQQQQQQQQQ0.fredi4=.f=.frexpc4k|.eccri4=.f=.frexpc4k|.eccredi4=.f=.fredi4=.f=.frexpc4k|.decedi4ccredi4=.f=.fddec+[][].c=from_entries.f=.frescredi4=.f=.fddec+[][].c=.f=.freexp0",
        "reduce range(40) as $i ([1]; [., .]) | .[\"x\"]",
        "reduce range(40) as $i ({}; {a: ., b: .}) | . + 1",
        "reduce range(40) as $i ([1]; [., .]) as $x | 1 - $x",
        "error(reduce range(40) as $i ([1]; [., .]))",
    ] {
        let expr = Expr::compile(code, &[], limits).unwrap();
        let err = expr.eval_json(&input).expect_err(code);
        assert!(
            err.out_of_fuel && err.message.contains("error message would be longer than 10485760 bytes"),
            "{code}: {err:?}"
        );
    }
    // Errors of ordinary size keep their message.
    let expr = Expr::compile("[1, [2]] | .[\"x\"]", &[], limits).unwrap();
    let err = expr.eval_json(&input).expect_err("an error");
    assert_eq!(err.message, "cannot index [1,[2]] with \"x\"");
}

/// fuzz target jq_expression, a timeout (non-sanitized build of e6bc75a, 1.3 million executions in;
/// past 120 s alone, and past 20 s with fuel 10): `..-00000%try..-00%try..-00%try...`. jaq pairs every
/// value of `l` in `l - r` with every value of `r`, and where `r` yields nothing it drops `l`'s value
/// unseen, a halt among them: the fuel ran out in the `..` of `.. - (try .a.b)`, yet `..` went on, and
/// so did every such product around it, each running its `r` again for every value; nothing stopped
/// the evaluation. `l % r`, `l == r`, `{(k): v}`, `"\(a)\(b)"` and `.[i][j]` pair values the same way.
/// A halt is now remembered, raised again before each such `r` runs (`__gate`), and ends the
/// evaluation however it ends. And every error a `try` catches, which jaq writes out as text first, is
/// charged a step and its length, so catching errors over and over stops at the limits too.
#[test]
fn jq_halts_are_not_lost_where_jaq_pairs_values_with_none() {
    use sm4c_runtime::{Expr, Limits};
    let input = jq_target_input();
    let limits = Limits {
        fuel: 10,
        ..Limits::default()
    };
    for code in [
        ".. - (try .a.b)",
        ".. % (try .a.b)",
        ".. == (try .a.b)",
        ".. < (try .a.b)",
        "{(.. | tostring): (try .a.b)}",
        "{a: (.. | 1), b: (try .a.b)}",
        "\"\\(..)\\(try .a.b)\"",
        ".[.. | \"a\"][try .a.b]",
        ".[.. | 0:try .a.b]",
        ".. - (.. - (.. - (try .a.b)))",
    ] {
        let expr = Expr::compile(code, &[], limits).unwrap();
        let err = expr.eval_json(&input).expect_err(code);
        assert!(
            err.out_of_fuel && err.message.contains("after 10 steps"),
            "{code}: {err:?}"
        );
    }
    // What the fuzzer found ends within the fuel of the target: at the fuel until `-` paired its
    // values through a native (the charge of `-` of two arrays), now at once at an error of `%`
    // that `-` no longer drops.
    let found = "..-00000%try..-00%try..-00%try..-00000%00000%try..-00%try..-00%try..-00000%try--try----exp.pac0# --)";
    let limits = Limits {
        fuel: 100_000,
        ..Limits::default()
    };
    let err = Expr::compile(found, &[], limits)
        .unwrap()
        .eval_json(&input)
        .unwrap_err();
    assert!(err.message.starts_with("cannot calculate 0 % {"), "{err:?}");
    // 100,000 caught errors of 1 KB each are charged: more than the 64 MiB an evaluation may build.
    let limits = Limits {
        fuel: 10_000_000,
        ..Limits::default()
    };
    for code in [
        "(\"x\" * 1000) as $s | [range(100000) | try ($s | .a)] | length",
        "(\"x\" * 1000) as $s | [range(100000) | try ($s | .a) catch 0] | length",
        "(\"x\" * 1000) as $s | [range(100000) | ($s | .a)?] | length",
    ] {
        let err = Expr::compile(code, &[], limits)
            .unwrap()
            .eval_json(&input)
            .expect_err(code);
        assert!(
            err.out_of_fuel && err.message.contains("more than 67108864 bytes"),
            "{code}: {err:?}"
        );
    }
    // What fits still works, with jq's results.
    for (code, want) in [
        ("[.c[] | try (. - 1)]", json!([0, 1.5])),
        (
            "[.c[] | try (. - 1) catch \"no\"]",
            json!([0, 1.5, "no", "no", "no", "no"]),
        ),
        ("[.c[] | (. - 1)?]", json!([0, 1.5])),
        (
            "[.a - (1, 2)] + [(.a, 2) == (1, 2)]",
            json!([0, -1, true, false, false, true]),
        ),
        (
            "[{a: .a, (.b): (1, 2)}]",
            json!([{"a": 1, "two": 1}, {"a": 1, "two": 2}]),
        ),
        ("[\"\\(.a)-\\(.b, .a)\"]", json!(["1-two", "1-1"])),
        ("[.c[1, 0][]?]", json!([])),
        ("[.c[0:(2, 3)]]", json!([[1, 2.5], [1, 2.5, "x"]])),
        ("{a: (try error(\"x\") catch .)}", json!({"a": "x"})),
        (
            ".b as $x | {$x, a, \"b\", \"\\(\"o\")\"}",
            json!({"x": "two", "a": 1, "b": "two", "o": {"k": {"k2": "v"}}}),
        ),
    ] {
        let expr = Expr::compile(code, &[], Limits::default()).unwrap();
        let got = expr.eval_json(&input);
        assert_eq!(got.as_ref().ok(), Some(&want), "{code}: {got:?}");
    }
}

/// fuzz target jq_expression (the 10-million run on 52db039, a timeout after about 3 million
/// executions; 10.6 s alone in a release build under the default limits): `... .f=.f ... @uri ...`.
/// A value that shares its parts stands for far more text than it takes; `tostring` (string
/// interpolation) and `tojson` had jaq write it out whole, and only then was its length checked.
/// What writes a value out as text now checks first that its text fits the string limit, writing
/// it into a sink that stops there (`__fits`). The input now stops in 0.14 s.
#[test]
fn jq_values_sharing_their_parts_are_not_written_out_past_the_string_limit() {
    use sm4c_runtime::{Expr, Limits};
    let input = jq_target_input();
    let shared = "reduce range(40) as $i ([1]; [., .])";
    for tail in [
        "tostring",
        "tojson",
        "@json",
        "@text",
        "@uri",
        "@base64",
        "@html",
        "\"x\\(.)\"",
        "@base64 \"x\\(.)\"",
        "[.] | map(tostring) | .[0]",
        "{a: .} | tostring",
    ] {
        let code = format!("{shared} | {tail} | length");
        let limits = Limits {
            max_string: 1 << 20,
            ..Limits::default()
        };
        let expr = Expr::compile(&code, &[], limits).unwrap();
        let err = expr.eval_json(&input).expect_err(&code);
        assert!(
            err.out_of_fuel && err.message.contains("a string longer than 1048576 bytes"),
            "{code}: {err:?}"
        );
    }
    // Text that fits is written as before.
    let expr = Expr::compile(
        "reduce range(3) as $i ([1]; [., .]) | [tostring, tojson, @uri] | map(length)",
        &[],
        Limits::default(),
    )
    .unwrap();
    assert_eq!(expr.eval_json(&input).unwrap(), json!([45, 45, 119]));
}

/// fuzz target jq_expression (the 10-million run on 52db039, a crash after about 5.7 million
/// executions): `... 122222222*2222222222222221011111101121110111010 ... | gmtime`. jaq-std turns
/// seconds since the epoch into microseconds by multiplying an integer by a million in `i64`, which
/// overflows past 9.2e12: a panic where overflow is checked (debug builds, the fuzz build), a wrong
/// time where it is not. `gmtime` and `strftime` now refuse seconds outside the years -9999 to 9999
/// with an error a handler can catch.
#[test]
fn jq_gmtime_of_seconds_past_the_year_9999_is_an_error_not_an_overflow() {
    use sm4c_runtime::{Expr, Limits};
    let input = jq_target_input();
    for code in [
        "10000000000000 | gmtime",
        "-10000000000000 | gmtime",
        "9223372036854775807 | gmtime",
        "10000000000000 | strftime(\"%Y\")",
        "400000000000 | gmtime",
    ] {
        let expr = Expr::compile(code, &[], Limits::default()).unwrap();
        let err = expr.eval_json(&input).expect_err(code);
        assert!(!err.out_of_fuel && err.message.contains("to time"), "{code}: {err:?}");
    }
    for (code, want) in [
        ("try (10000000000000 | gmtime) catch \"caught\"", json!("caught")),
        ("0 | gmtime", json!([1970, 0, 1, 0, 0, 0, 4, 0])),
        ("253402207200 | strftime(\"%Y\")", json!("9999")),
        // A float takes jaq-std's other way, which saturates, and jiff refuses it.
        ("try (1e13 | gmtime) catch \"refused\"", json!("refused")),
    ] {
        let expr = Expr::compile(code, &[], Limits::default()).unwrap();
        let got = expr.eval_json(&input);
        assert_eq!(got.as_ref().ok(), Some(&want), "{code}: {got:?}");
    }
}

/// fuzz target jq_expression (the 10-million run on 023a346, a timeout after about 2.7 million
/// executions; past 60 s alone): `map(... tonumber - ... 3333333333333333?%.a333...?%333...)`.
/// jaq-json's `fromjson` (so `tonumber` of a string) yields a text's values and then, after the first
/// error, errors without end. Where its errors are dropped (`l - r` with an `r` that yields nothing
/// and burns no fuel, here `.a3?` of a string), the evaluation never ended. `fromjson` now ends at
/// its first error, raised again.
#[test]
fn jq_fromjson_ends_at_its_first_error() {
    use sm4c_runtime::{Expr, Limits};
    let input = jq_target_input();
    let limits = Limits {
        fuel: 10_000,
        ..Limits::default()
    };
    // `l - r` pairs values through a native since `-` of two arrays is charged (dc04370 and later):
    // `l`'s error now ends the evaluation even where `r` yields nothing, as with `+`, `*` and `/`.
    for (code, want) in [
        (".b | tonumber - (.a3? % 3)", Err("cannot parse \"two\" as JSON")),
        ("\"x\" | fromjson - (.a3? % 3)", Err("cannot parse \"x\" as JSON")),
        ("\"1 2 x\" | [fromjson?]", Ok(json!([]))),
        // `fromjson` reads one value, as jq's does (jaq's read "2024-01-01T..." as 2024, -0, 1, ...).
        ("[.[] | tonumber?]", Ok(json!([1, -0.5]))),
    ] {
        let expr = Expr::compile(code, &[], limits).unwrap();
        let got = expr.eval_json(&input);
        match want {
            Ok(want) => assert_eq!(got.as_ref().ok(), Some(&want), "{code}: {got:?}"),
            Err(message) => assert!(
                got.as_ref().is_err_and(|e| e.message.starts_with(message)),
                "{code}: {got:?}"
            ),
        }
    }
    let err = Expr::compile("\"1 x\" | fromjson", &[], limits)
        .unwrap()
        .eval_json(&input)
        .unwrap_err();
    assert!(
        err.message.starts_with("cannot parse \"1 x\" as JSON: byte offset 2"),
        "{err:?}"
    );
    let err = Expr::compile("\"x\" | fromjson", &[], limits)
        .unwrap()
        .eval_json(&input)
        .unwrap_err();
    assert_eq!(err.message, "cannot parse \"x\" as JSON: byte offset 0: value expected");
}

/// fuzz target asl_execution (non-sanitized build of e6bc75a, 52,000 executions in; caught under gdb
/// 528,000 into a second run): a stack overflow in jsonata-rs's parser, 2,070 objects nested
/// (`parse_object`). The nesting check skipped strings its own way, and the crate's tokenizer skips
/// more: comments (`/* " */`), regular expressions (`/"/`, `/]]]/`), names in backticks (where `\`
/// escapes nothing). A quote inside one of those hid every bracket after it from the check, and
/// closing brackets inside them hid as many opening ones. The check now skips what the tokenizer
/// skips, and where a text has quotes or slashes it also bounds all its opening brackets (256) and
/// operator characters (600): the next run found brackets hidden behind a quote in a name.
#[test]
fn jsonata_nesting_cannot_hide_in_comments_regexes_or_backticks() {
    let deep = "{'a':".repeat(2_000) + "1" + &"}".repeat(2_000);
    let refusals = move || {
        let context = json!({});
        let env = Env {
            input: &Value::Null,
            context: &context,
            vars: &Map::new(),
            rng: &Cell::new(1),
        };
        for prefix in [
            "/* \" */ ".to_string(),
            "`a\\` & ".to_string(),
            "$match('x', /\"/) & ".to_string(),
            "$match('x', /'/) & ".to_string(),
            format!("$match('x', /{}/) & ", "}".repeat(2_000)),
            format!("/* {} */ ", "}".repeat(2_000)),
            // A name runs up to whitespace or an operator, quotes and all (found next, under gdb:
            // 2,067 objects nested): the bound on all opening brackets catches what a scan misses.
            "a\" & ".to_string(),
            "1a' & ".to_string(),
        ] {
            let expr = format!("{prefix}{deep}");
            let err = eval_expression(&expr, &json!({}), &env).expect_err("refused");
            let text = format!("{err:?}");
            assert!(
                text.contains("nested deeper than 64") || text.contains("more than 256 opening brackets"),
                "{}: {err:?}",
                &expr[..30]
            );
        }
    };
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(refusals)
        .expect("thread")
        .join()
        .expect("no panic");
    // What the tokenizer skips still works, and division is not taken for a regular expression.
    let context = json!({});
    let env = Env {
        input: &Value::Null,
        context: &context,
        vars: &Map::new(),
        rng: &Cell::new(1),
    };
    let states = json!({"input": {"a/b": 2}});
    for (expr, want) in [
        ("/* ( [ { \" */ 1 + 1", json!(2)),
        ("$contains('a/b', /a\\/b/)", json!(true)),
        ("$contains('XY', /[a-z]+/i)", json!(true)),
        ("$states.input.`a/b` / 2 / 1", json!(1)),
        ("'\\\"(((' & \"'\"", json!("\"((('")),
        ("(6) / (3) / [1][0]", json!(2)),
    ] {
        assert_eq!(eval_expression(expr, &states, &env).expect(expr), want, "{expr}");
    }
}

/// fuzz target jq_expression (non-sanitized build of 023a346, fork mode, two timeouts among 6.2
/// million executions): `... .f=.f ... .+.+. > ..+.+. ...` took 11.6 s at the target's 4 MiB and
/// 23.7 s at the default 64 MiB to stop. Values share their parts, so an array or object built in a
/// few steps can stand for more JSON than the host has memory, and comparing two of them (`==`, `<`,
/// and the sorts, groupings, `contains` and `indices`, which compare) walked all of it within one
/// step of fuel. Such a walk is now charged against the memory limit before it runs.
#[test]
fn jq_comparisons_of_values_sharing_their_parts_are_charged_before_they_walk_them() {
    use sm4c_runtime::{Expr, Limits};
    let input = jq_target_input();
    let limits = Limits {
        fuel: 10_000,
        memory: 4 << 20,
        ..Limits::default()
    };
    // Each `big` is 2^40 ones written out, built in 40 steps; two of them are distinct but equal,
    // so no comparison can stop early.
    let big = "def big: reduce range(40) as $i ([1]; [., .]); def obj: reduce range(40) as $i ({}; {a: ., b: .}); ";
    for code in [
        "big == big",
        "big != big",
        "big < big",
        "big >= big",
        "obj == obj",
        "obj <= obj",
        "{x: big} == {x: big}",
        "[big, big] | sort | length",
        "[1, 2] | sort_by(big) | length",
        "[1, 2] | group_by(big) | length",
        "[1, 2] | unique_by(big) | length",
        "[1, 2] | min_by(big)",
        "[big, big] | max",
        "[big, big] | unique | length",
        "[big] | contains([big])",
        "[big] | inside([big])",
        "[big] | indices([big])",
        "[big] | index([big])",
        "[big, 1] | any(. == big)",
        "[big] | all(. == big)",
        "big | .[big]",
        "big | .[[big[0]]]",
        "big | has(big)",
        "big | bsearch(big[0])",
        "big - big",
        "[big] - [big]",
        "{a: obj} * {a: obj} | length",
        "obj | .a * .b | length",
        // The key is small and the input is not: 4,096 copies of a 65,536-element value.
        "(reduce range(16) as $i ([1]; [., .])) as $x | [range(4096) | $x] | .[[$x]]",
        "(reduce range(16) as $i ([1]; [., .])) as $x | [range(4096) | $x] | has([$x])",
    ] {
        let expr = Expr::compile(&format!("{big}{code}"), &[], limits).unwrap();
        let err = expr.eval_json(&input).unwrap_err();
        assert!(err.message.contains("would build more than"), "{code}: {err:?}");
    }
    // Comparisons of ordinary values keep jq's results, and jaq's order of a product's pairs.
    for (code, want) in [
        ("[(1, 2) < (2, 3)]", json!([true, true, false, true])),
        (
            "[.a == 1, .b != \"two\", .c < .c, .o >= .o, .c[5] == {d: [3, 4]}]",
            json!([true, false, false, true, true]),
        ),
        ("[.c[] | select(. == 1 or . == \"x\")]", json!([1, "x"])),
        ("[[3, 1], [2], [1, 5]] | sort", json!([[1, 5], [2], [3, 1]])),
        ("[{k: 2}, {k: 1}] | sort_by(.k) | map(.k)", json!([1, 2])),
        ("[1, 2, 1, 3] | group_by(. % 2)", json!([[2], [1, 1, 3]])),
        ("[3, 1, 3] | unique", json!([1, 3])),
        ("[{a: 1, b: [1, 2]}] | contains([{b: [2]}])", json!(true)),
        ("[1, 2, 1, 2] | indices([1, 2])", json!([0, 2])),
        (".c | index(\"x\")", json!(2)),
        ("[.c | min, max]", json!([null, {"d": [3, 4]}])),
        ("{a: 1} < {a: 1, b: 2}", json!(true)),
        ("[1, 2, 1, 2] | .[[1, 2]]", json!([0, 2])),
        ("{x: [1, 2, 1]} | .x[[1]]", json!([0, 2])),
        (
            "[has(\"a\"), has(\"z\"), (.c | has(5), has(6))]",
            json!([true, false, true, false]),
        ),
        ("[1, 2, 3] | [bsearch(2, 4)]", json!([1, -4])),
        ("[1, 2, 3, 2] - [2]", json!([1, 3])),
        ("[(1, 2) - (10, 20)]", json!([-9, -19, -8, -18])),
        (
            "{a: {b: 1, c: 2}} * {a: {b: 3}, d: 4}",
            json!({"a": {"b": 3, "c": 2}, "d": 4}),
        ),
        (".o * {o: 1} | .o", json!(1)),
    ] {
        let expr = Expr::compile(code, &[], limits).unwrap();
        assert_eq!(expr.eval_json(&input).ok(), Some(want), "{code}");
    }
}

/// fuzz target jq_expression (the text of a caught error): jaq writes an error that `try` catches
/// (`cannot index [..] with "a"`) into a string whole before any of our code sees it, and an error
/// naming a value that shares its parts stands for more text than the host has memory; `.a?` too,
/// as it is `try .a`. The error's text is now written by our own native first, with the string limit
/// as its bound, and a text past it stops the evaluation like any string past it.
#[test]
fn jq_caught_errors_naming_shared_values_are_written_with_a_bound() {
    use sm4c_runtime::{Expr, Limits};
    let input = jq_target_input();
    let limits = Limits {
        fuel: 10_000,
        memory: 4 << 20,
        ..Limits::default()
    };
    let big = "def big: reduce range(40) as $i ([1]; [., .]); ";
    for code in [
        "try (big | .a) catch length",
        "try (big | .a) catch \"caught\"",
        "[(big | .a)?]",
        "(big | .a)? // 1",
        "big | try .a catch 2",
        "try ([big] | .[0] | .x) catch 1",
        "try (big | tonumber) catch 1",
        "try (big - 1) catch 1",
        "big | [path((.[0], .x)?)]",
        "try (try (big | .a) catch error) catch 1",
    ] {
        let expr = Expr::compile(&format!("{big}{code}"), &[], limits).unwrap();
        let err = expr.eval_json(&input).unwrap_err();
        assert!(
            err.message.contains("would build a string longer than"),
            "{code}: {err:?}"
        );
    }
    // Caught errors of ordinary values keep their text and values, breaks pass through, and paths
    // under `?` are the paths they were.
    for (code, want) in [
        ("try ([1] | .a) catch .", json!("cannot index [1] with \"a\"")),
        ("[.c[] | .d?]", json!([null, [3, 4]])),
        (
            "[.c[] | try .d catch \"no\"]",
            json!(["no", "no", "no", null, "no", [3, 4]]),
        ),
        ("try error({x: 1}) catch .x", json!(1)),
        ("try error(null) catch .", Value::Null),
        ("[.[] | (tonumber)?]", json!([1, -0.5])),
        ("label $out | try (1, break $out) catch 2", json!(1)),
        ("[path((.a, .b.x)?)]", json!([["a"]])),
        ("[1] | [path((.[0], .x)?)]", json!([[0]])),
        ("[path(try (.a, .b.x) catch empty)]", json!([["a"]])),
        ("[1, \"x\"] | map(try (. + 1) catch \"no\")", json!([2, "no"])),
    ] {
        let expr = Expr::compile(code, &[], limits).unwrap();
        assert_eq!(expr.eval_json(&input).ok(), Some(want), "{code}");
    }
}
