//! The `sm4c` command as users see it: exit codes, stdout and stderr of `validate`, `run`,
//! `graph` and `schema`, run against the real binary. (The definitions of the SM4C reference
//! implementation, in ../shared, are run by the `reference` test.)

use crate::support::run;

use run::{parse, sm4c, tmp, write, write_events, write_raw};
use serde_json::{json, Value};
use std::path::Path;

/// A definition with `id`, `name` and `version` added to `body`.
fn sm(body: Value) -> Value {
    let mut m = json!({"id": "t", "name": "test", "version": "1.0"});
    for (k, v) in body.as_object().expect("object body") {
        m[k] = v.clone();
    }
    m
}

/// A small valid definition of the samples, for tests about everything but the definition.
fn hello() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../samples/hello-world/definition.json")
        .to_str()
        .expect("utf-8 path")
        .to_string()
}

/// Asserts one stderr line is `FILE: PLACE: ...` and contains every needle.
fn assert_error(stderr: &str, file: &str, place: &str, needles: &[&str]) {
    let prefix = format!("{file}: {place}: ");
    let found = stderr
        .lines()
        .any(|l| l.starts_with(&prefix) && needles.iter().all(|n| l.contains(n)));
    assert!(
        found,
        "no stderr line `{prefix}...` containing {needles:?}; stderr:\n{stderr}"
    );
}

/// Validates `def` (written into `dir`), expecting exit 2, empty stdout; returns (path, stderr).
fn invalid(dir: &Path, def: &Value) -> (String, String) {
    let f = write(dir, "def.json", def);
    let (code, out, err) = sm4c(&["validate", &f]);
    assert_eq!(code, 2, "stderr:\n{err}");
    assert_eq!(out, "");
    (f, err)
}

fn one_state(state: Value) -> Value {
    let mut s = state;
    s["name"] = json!(s.get("name").cloned().unwrap_or(json!("A")));
    s["start"] = json!(true);
    sm(json!({ "states": [s] }))
}

// ---------------------------------------------------------------- bad definitions

#[test]
fn not_json_names_line_and_column() {
    let d = tmp();
    let f = write_raw(d.path(), "def.json", "{\"id\": \"x\",\n  \"name\": }");
    for cmd in ["validate", "run"] {
        let (code, out, err) = sm4c(&[cmd, &f]);
        assert_eq!(code, 2, "{cmd}: stderr:\n{err}");
        assert_eq!(out, "", "{cmd}");
        assert_error(&err, &f, "/", &["not valid JSON", "line 2 column 11"]);
    }
}

#[test]
fn missing_states() {
    let d = tmp();
    let (f, err) = invalid(d.path(), &sm(json!({})));
    assert_error(&err, &f, "/", &["missing required field `states`"]);
}

#[test]
fn missing_name() {
    let d = tmp();
    let (f, err) = invalid(
        d.path(),
        &json!({"id": "x", "version": "1.0", "states": [{"name": "A", "start": true}]}),
    );
    assert_error(&err, &f, "/", &["missing required field `name`"]);
    assert_eq!(err.lines().count(), 1, "stderr:\n{err}");
}

#[test]
fn zero_start_states() {
    let d = tmp();
    let (f, err) = invalid(d.path(), &sm(json!({"states": [{"name": "A"}, {"name": "B"}]})));
    assert_error(&err, &f, "/states", &["no start state"]);
}

#[test]
fn two_start_states() {
    let d = tmp();
    let def = sm(json!({"states": [{"name": "A", "start": true}, {"name": "B", "start": true}]}));
    let (f, err) = invalid(d.path(), &def);
    assert_error(&err, &f, "/states/1/start", &["more than one start state", "A", "B"]);
}

#[test]
fn duplicate_state_names() {
    let d = tmp();
    let def = sm(json!({"states": [{"name": "A", "start": true}, {"name": "A"}]}));
    let (f, err) = invalid(d.path(), &def);
    assert_error(&err, &f, "/states/1/name", &["duplicate state name \"A\""]);
}

#[test]
fn unknown_next_state() {
    let d = tmp();
    let def = one_state(json!({"transitions": [{"nextState": "Nowhere"}]}));
    let (f, err) = invalid(d.path(), &def);
    assert_error(
        &err,
        &f,
        "/states/0/transitions/0/nextState",
        &["unknown state \"Nowhere\""],
    );
}

#[test]
fn unknown_function() {
    let d = tmp();
    let def = one_state(json!({"enterAction": {"type": "invokeFunction", "functionName": "ghost"}}));
    let (f, err) = invalid(d.path(), &def);
    assert_error(
        &err,
        &f,
        "/states/0/enterAction/functionName",
        &["unknown function \"ghost\""],
    );
}

#[test]
fn unknown_event_in_event_group() {
    let d = tmp();
    let def = sm(json!({
        "events": [{"name": "known", "type": "k", "source": "s"}],
        "states": [
            {"name": "A", "start": true,
             "transitions": [{"nextState": "B", "eventGroups": [{"events": ["known", "ghost"]}]}]},
            {"name": "B"}
        ]
    }));
    let (f, err) = invalid(d.path(), &def);
    assert_error(
        &err,
        &f,
        "/states/0/transitions/0/eventGroups/0/events/1",
        &["unknown event \"ghost\""],
    );
    assert_eq!(err.lines().count(), 1, "stderr:\n{err}");
}

#[test]
fn unknown_event_in_send_event() {
    let d = tmp();
    let def = one_state(json!({"enterAction": {"type": "sendEvent", "event": "ghost"}}));
    let (f, err) = invalid(d.path(), &def);
    assert_error(&err, &f, "/states/0/enterAction/event", &["unknown event \"ghost\""]);
}

#[test]
fn unknown_retry_policy() {
    let d = tmp();
    let def = one_state(json!({"enterAction": {
        "type": "injectData", "expression": "${ 1 }", "errorHandlers": [{"retryPolicy": "ghost"}]
    }}));
    let (f, err) = invalid(d.path(), &def);
    assert_error(
        &err,
        &f,
        "/states/0/enterAction/errorHandlers/0/retryPolicy",
        &["unknown retry policy \"ghost\""],
    );
}

#[test]
fn unknown_subflow() {
    let d = tmp();
    let empty = d.path().join("subflows");
    std::fs::create_dir(&empty).expect("mkdir");
    let empty = empty.to_str().expect("utf-8");
    let def =
        one_state(json!({"enterAction": {"type": "invokeSubflow", "subflowName": "child", "waitForCompletion": true}}));
    let f = write(d.path(), "def.json", &def);
    let (code, out, err) = sm4c(&["run", &f, "--subflows", empty]);
    assert_eq!(code, 2, "stderr:\n{err}");
    assert_eq!(out, "");
    assert_error(
        &err,
        &f,
        "/states/0/enterAction/subflowName",
        &["unknown subflow \"child\""],
    );
    let (code, _, err) = sm4c(&["validate", &f, "--subflows", empty]);
    assert_eq!(code, 2, "stderr:\n{err}");
    assert_error(
        &err,
        &f,
        "/states/0/enterAction/subflowName",
        &["unknown subflow \"child\""],
    );
}

#[test]
fn bad_jq_syntax() {
    let d = tmp();
    let def = one_state(json!({"enterAction": {"type": "injectData", "expression": "${ .a | }"}}));
    let (f, err) = invalid(d.path(), &def);
    assert_error(
        &err,
        &f,
        "/states/0/enterAction/expression",
        &["invalid jq expression", ".a |"],
    );
}

#[test]
fn jq_sandbox_refuses_env_now_input_halt() {
    let d = tmp();
    let def = sm(json!({"states": [
        {"name": "A", "start": true,
         "enterAction": {"type": "injectData", "expression": "${ env.HOME }"},
         "enterResultHandler": "${ .t = now }",
         "exitResultHandler": "${ halt }",
         "transitions": [{"nextState": "B", "condition": "${ input == 1 }",
                          "action": {"type": "injectData", "expression": "${ $ENV.PATH }"}}]},
        {"name": "B"}
    ]}));
    let (f, err) = invalid(d.path(), &def);
    for (place, name) in [
        ("/states/0/enterAction/expression", "`env`"),
        ("/states/0/enterResultHandler", "`now`"),
        ("/states/0/exitResultHandler", "`halt`"),
        ("/states/0/transitions/0/condition", "`input`"),
        ("/states/0/transitions/0/action/expression", "`$ENV`"),
    ] {
        assert_error(&err, &f, place, &[name, "not available"]);
    }
    assert_eq!(err.lines().count(), 5, "stderr:\n{err}");
}

#[test]
fn jq_sandbox_refuses_functions_not_on_its_list() {
    // jaq has `debug_empty`, `stderr_empty` and `halt/1`; none is on sm4c's list of allowed functions.
    let d = tmp();
    let def = one_state(json!({
        "enterAction": {"type": "injectData", "expression": "${ debug_empty }"},
        "enterResultHandler": "${ stderr_empty }",
        "exitResultHandler": "${ halt(1) }"
    }));
    let (f, err) = invalid(d.path(), &def);
    for (place, name) in [
        ("/states/0/enterAction/expression", "`debug_empty`"),
        ("/states/0/enterResultHandler", "`stderr_empty`"),
        ("/states/0/exitResultHandler", "`halt`"),
    ] {
        assert_error(&err, &f, place, &[name, "is not available in sm4c expressions"]);
    }
    assert_error(
        &err,
        &f,
        "/states/0/enterAction/expression",
        &["not on the list of jq functions sm4c allows"],
    );
    assert_eq!(err.lines().count(), 3, "stderr:\n{err}");
}

#[test]
fn bad_timespan() {
    let d = tmp();
    let def = one_state(json!({"enterAction": {"type": "delay", "timeout": "soon"}}));
    let (f, err) = invalid(d.path(), &def);
    assert_error(
        &err,
        &f,
        "/states/0/enterAction/timeout",
        &["invalid timespan \"soon\""],
    );
}

#[test]
fn unknown_action_type() {
    let d = tmp();
    let def = one_state(json!({"enterAction": {"type": "teleport"}}));
    let (f, err) = invalid(d.path(), &def);
    assert_error(
        &err,
        &f,
        "/states/0/enterAction/type",
        &["unknown action type \"teleport\""],
    );
}

#[test]
fn every_error_is_reported() {
    let d = tmp();
    let def = sm(json!({"states": [
        {"name": "A", "start": true, "enterAction": {"type": "teleport"}, "transitions": [{"nextState": "Nope"}]},
        {"name": "B", "transitions": [{"nextState": "A", "timeout": "soon"}]}
    ]}));
    let (f, err) = invalid(d.path(), &def);
    assert_error(&err, &f, "/states/0/enterAction/type", &["teleport"]);
    assert_error(&err, &f, "/states/0/transitions/0/nextState", &["Nope"]);
    assert_error(&err, &f, "/states/1/transitions/0/timeout", &["soon"]);
    assert_eq!(err.lines().count(), 3, "stderr:\n{err}");
    // `run` refuses the same definition the same way, printing nothing on stdout.
    let (code, out, run_err) = sm4c(&["run", &f]);
    assert_eq!(code, 2);
    assert_eq!(out, "");
    assert_eq!(run_err, err);
}

#[test]
fn validate_reports_every_file() {
    let d = tmp();
    let good = write(d.path(), "good.json", &one_state(json!({})));
    let bad1 = write(d.path(), "bad1.json", &sm(json!({})));
    let bad2 = write(
        d.path(),
        "bad2.json",
        &one_state(json!({"enterAction": {"type": "teleport"}})),
    );
    let (code, out, err) = sm4c(&["validate", &bad1, &good, &bad2]);
    assert_eq!(code, 2);
    assert_eq!(out, "");
    assert_error(&err, &bad1, "/", &["`states`"]);
    assert_error(&err, &bad2, "/states/0/enterAction/type", &["teleport"]);
    assert!(!err.contains(&good), "stderr:\n{err}");
}

#[test]
fn usage_errors_print_nothing_on_stdout() {
    let d = tmp();
    let missing = d.path().join("missing.json");
    let missing = missing.to_str().expect("utf-8");
    let hello = hello();
    for args in [
        vec!["run"],
        vec!["run", &hello, "--bogus"],
        vec!["run", missing],
        vec!["run", &hello, "--input", missing],
        vec!["validate"],
    ] {
        let (code, out, err) = sm4c(&args);
        assert_eq!(code, 2, "{args:?}: stderr:\n{err}");
        assert_eq!(out, "", "{args:?}");
        assert!(!err.is_empty(), "{args:?}");
    }
}

// ---------------------------------------------------------------- bad run inputs

#[test]
fn input_not_json() {
    let d = tmp();
    let input = write_raw(d.path(), "input.json", "{\"a\": nope}");
    let (code, out, err) = sm4c(&["run", &hello(), "--input", &input]);
    assert_eq!(code, 2, "stderr:\n{err}");
    assert_eq!(out, "");
    assert_error(&err, &input, "/", &["not valid JSON", "line 1 column"]);
}

#[test]
fn events_line_not_json() {
    let d = tmp();
    let ev = write_raw(
        d.path(),
        "events.ndjson",
        "{\"specversion\":\"1.0\",\"id\":\"a\",\"source\":\"s\",\"type\":\"t\"}\n{oops\n",
    );
    let (code, out, err) = sm4c(&["run", &hello(), "--events", &ev]);
    assert_eq!(code, 2, "stderr:\n{err}");
    assert_eq!(out, "");
    assert_error(&err, &ev, "line 2", &["not valid JSON"]);
    assert_eq!(err.lines().count(), 1, "stderr:\n{err}");
}

#[test]
fn events_line_missing_id() {
    let d = tmp();
    // Line 2 is blank: line numbers still count it.
    let ev = write_raw(
        d.path(),
        "events.ndjson",
        "{\"specversion\":\"1.0\",\"id\":\"a\",\"source\":\"s\",\"type\":\"t\"}\n\n\
         {\"specversion\":\"1.0\",\"source\":\"s\",\"type\":\"t\"}\n",
    );
    let (code, out, err) = sm4c(&["run", &hello(), "--events", &ev]);
    assert_eq!(code, 2, "stderr:\n{err}");
    assert_eq!(out, "");
    assert_error(&err, &ev, "line 3", &["`id`"]);
}

fn parse_state(handlers: Value) -> Value {
    one_state(json!({
        "name": "Parse",
        "enterAction": {"type": "injectData", "expression": "${ .a.b.c | tonumber }", "errorHandlers": handlers},
        "enterResultHandler": "${ .n = $value }"
    }))
}

#[test]
fn jq_runtime_error_fails_instance() {
    let d = tmp();
    let f = write(d.path(), "def.json", &parse_state(json!([])));
    let input = write(d.path(), "input.json", &json!({"a": {"b": {"c": "abc"}}}));
    let (code, out, err) = sm4c(&["run", &f, "--input", &input]);
    assert_eq!(code, 1, "stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["type"], "expressionError", "{v}");
    assert_eq!(v["state"], "Parse", "{v}");
    // The message is jq's own text; the expression comes with it in details.
    assert!(v["message"].as_str().is_some_and(|m| m.contains("abc")), "{v}");
    assert!(
        v["details"]["expression"]
            .as_str()
            .is_some_and(|m| m.contains("tonumber")),
        "{v}"
    );
    assert_eq!(err.lines().count(), 1, "stderr:\n{err}");
    assert!(err.contains("Parse") && err.contains("tonumber"), "stderr:\n{err}");
}

#[test]
fn jq_runtime_error_caught_by_error_handler() {
    let d = tmp();
    let def = parse_state(json!([{"resultHandler": "${ .caught = ($value | .type) }"}]));
    let f = write(d.path(), "def.json", &def);
    let input = write(d.path(), "input.json", &json!({"a": {"b": {"c": "abc"}}}));
    let (code, out, err) = sm4c(&["run", &f, "--input", &input]);
    assert_eq!(code, 0, "stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["caught"], "expressionError", "{v}");
    assert_eq!(v["n"], Value::Null, "{v}");
    assert_eq!(v["a"], json!({"b": {"c": "abc"}}));
}

#[test]
fn no_transition_holds() {
    let d = tmp();
    let def = sm(json!({"states": [
        {"name": "Stuck", "start": true, "transitions": [
            {"nextState": "B", "condition": "${ false }"},
            {"nextState": "B", "condition": "${ .x == 1 }"}
        ]},
        {"name": "B"}
    ]}));
    let f = write(d.path(), "def.json", &def);
    let (code, out, err) = sm4c(&["run", &f]);
    assert_eq!(code, 1, "stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["state"], "Stuck", "{v}");
    assert_eq!(v["type"], "noTransition", "{v}");
    assert!(err.contains("Stuck"), "stderr:\n{err}");
}

#[test]
fn runaway_expression_is_stopped() {
    let d = tmp();
    let def = one_state(
        json!({"name": "Spin", "enterAction": {"type": "injectData", "expression": "${ 0 | until(false; .) }"}}),
    );
    let f = write(d.path(), "def.json", &def);
    // `sm4c` panics if the run outlives DEADLINE: the fuel limit must stop the loop before that.
    let (code, out, err) = sm4c(&["run", &f]);
    assert_eq!(code, 1, "stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["type"], "expressionError", "{v}");
    assert_eq!(v["state"], "Spin", "{v}");
    assert!(v["message"].as_str().is_some_and(|m| m.contains("stopped")), "{v}");
    assert!(err.contains("Spin") && err.contains("stopped"), "stderr:\n{err}");
}

/// Runs a one-state definition injecting `expression` (with `flags`), expecting the run to end with
/// exit 1 and an `expressionError` that quotes the expression and contains `why`, never a signal.
fn assert_expression_stopped(expression: &str, flags: &[&str], why: &str) {
    let d = tmp();
    let def = one_state(json!({"name": "Build", "enterAction": {"type": "injectData", "expression": expression}}));
    let f = write(d.path(), "def.json", &def);
    let mut args = vec!["run", f.as_str()];
    args.extend_from_slice(flags);
    let (code, out, err) = sm4c(&args);
    assert_eq!(code, 1, "{expression}: exit {code} (-1 is a signal); stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["type"], "expressionError", "{expression}: {v}");
    assert_eq!(v["state"], "Build", "{v}");
    let message = v["message"].as_str().unwrap_or_default();
    assert!(message.contains(why), "{expression}: {v}");
    assert!(message.contains(expression), "the message quotes the expression: {v}");
    assert!(err.contains("Build") && err.contains(why), "stderr:\n{err}");
}

#[test]
fn repeating_a_string_ten_billion_times_is_refused_not_an_abort() {
    assert_expression_stopped(
        "${ (\"x\" * 10000000000) | length }",
        &[],
        "string longer than 10485760 bytes",
    );
}

#[test]
fn repeating_a_string_into_100_mb_is_refused() {
    assert_expression_stopped("${ (\"x\" * 100000000) | length }", &[], "string longer than");
}

#[test]
fn expression_limits_are_flags_of_run() {
    // 2,000 bytes are fine by default and too long with a 1,000-byte limit.
    assert_expression_stopped(
        "${ \"x\" * 2000 }",
        &["--expression-max-string", "1000"],
        "string longer than 1000 bytes",
    );
    assert_expression_stopped(
        "${ [range(10)] }",
        &["--expression-max-items", "5"],
        "more than 5 entries",
    );
    assert_expression_stopped(
        "${ [range(10) | \"x\" * 100] }",
        &["--expression-memory", "500"],
        "more than 500 bytes",
    );
}

#[test]
fn range_collected_into_a_huge_array_is_stopped() {
    assert_expression_stopped(
        "${ [range(1100000)] | length }",
        &["--expression-fuel", "100000000"],
        "more than 1048576 entries",
    );
}

#[test]
fn tostring_and_tojson_of_a_wide_value_are_stopped() {
    // Each step doubles the value by sharing it, so 22 steps are cheap, but its text is 25 MB.
    assert_expression_stopped(
        "${ reduce range(22) as $i ([1]; [., .]) | tostring | length }",
        &[],
        "string longer than",
    );
    assert_expression_stopped(
        "${ reduce range(22) as $i ([1]; [., .]) | tojson | length }",
        &[],
        "string longer than",
    );
    assert_expression_stopped(
        "${ [range(30) | \"x\" * 1000000] | tojson | length }",
        &[],
        "string longer than",
    );
}

/// fuzz target jq_expression: a value shared with itself (`[., .]`, `.a = .`) is cheap to build and
/// written out doubles at every step; as an instance's data it took 16 GB before it was refused.
#[test]
fn values_that_share_themselves_into_huge_data_are_stopped() {
    assert_expression_stopped(
        "${ reduce range(40) as $i ([1]; [., .]) }",
        &[],
        "more than 67108864 bytes",
    );
    let pairs = vec![".a = . | .b = ."; 30].join(" | ");
    assert_expression_stopped(&format!("${{ {pairs} }}"), &[], "more than 67108864 bytes");
}

#[test]
fn string_concatenation_in_reduce_is_stopped() {
    assert_expression_stopped(
        "${ reduce range(40) as $i (\"x\"; . + .) | length }",
        &[],
        "string longer than",
    );
}

#[test]
fn fromjson_of_a_huge_text_is_stopped() {
    assert_expression_stopped(
        "${ \"[\" + (\"0,\" * 4000000) + \"0]\" | fromjson | length }",
        &[],
        "more than 67108864 bytes",
    );
}

#[test]
fn regex_functions_on_long_input_are_stopped() {
    assert_expression_stopped(
        "${ \"x\" * 2000000 | gsub(\"x\"; \"y\") | length }",
        &[],
        "more than 67108864 bytes",
    );
}

#[test]
fn waiting_for_events_that_never_come_fails() {
    let d = tmp();
    let def = sm(json!({
        "events": [{"name": "go", "type": "go", "source": "s"}],
        "states": [
            {"name": "Wait", "start": true, "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["go"]}]}]},
            {"name": "Done"}
        ]
    }));
    let f = write(d.path(), "def.json", &def);
    let (code, out, err) = sm4c(&["run", &f]);
    assert_eq!(code, 1, "stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["state"], "Wait", "{v}");
    assert!(v["type"].is_string() && v["message"].is_string(), "{v}");
    assert!(err.contains("Wait"), "stderr:\n{err}");
}

fn call_state(wait: bool, handlers: Value) -> Value {
    sm(json!({
        "functions": [{"name": "f", "operation": "http://example.org/api.json#f"}],
        "retries": [{"name": "r", "delay": "PT10M", "maxAttempts": 2}],
        "states": [{"name": "Call", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "f", "waitForCompletion": wait,
                            "errorHandlers": handlers},
            "enterResultHandler": "${ .r = $value }"}]
    }))
}

#[test]
fn mock_error_fails_instance() {
    let d = tmp();
    let f = write(d.path(), "def.json", &call_state(true, json!([])));
    let mock = write(d.path(), "mock.json", &json!({"f": "error(\"boom\")"}));
    let (code, out, err) = sm4c(&["run", &f, "--mock", &mock]);
    assert_eq!(code, 1, "stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["message"], "boom", "{v}");
    assert_eq!(v["type"], "functionError", "{v}");
    assert_eq!(v["state"], "Call", "{v}");
    assert!(err.contains("Call") && err.contains("boom"), "stderr:\n{err}");
}

// ---------------------------------------------------------------- features

#[test]
fn sent_events_are_recorded_with_deterministic_ids() {
    let d = tmp();
    let def = sm(json!({
        "events": [{"name": "done", "type": "order.done", "source": "shop"}],
        "states": [{"name": "Send", "start": true,
            "enterAction": {"type": "sendEvent", "event": "done", "expression": "${ { order: .order } }"}}]
    }));
    let f = write(d.path(), "def.json", &def);
    let input = write(d.path(), "input.json", &json!({"order": "o-7"}));
    let sent = d.path().join("sent.ndjson");
    let sent = sent.to_str().expect("utf-8");
    for _ in 0..2 {
        let (code, out, err) = sm4c(&["run", &f, "--input", &input, "--sent", sent]);
        assert_eq!(code, 0, "stderr:\n{err}");
        assert_eq!(parse(&out), json!({"order": "o-7"}));
    }
    let text = std::fs::read_to_string(sent).expect("sent file");
    let events: Vec<Value> = text.lines().map(parse).collect();
    assert_eq!(events.len(), 2, "{text}");
    for e in &events {
        assert_eq!(e["specversion"], "1.0", "{e}");
        assert_eq!(e["source"], "shop", "{e}");
        assert_eq!(e["type"], "order.done", "{e}");
        assert_eq!(e["data"], json!({"order": "o-7"}), "{e}");
        assert!(e["id"].as_str().is_some_and(|s| !s.is_empty()), "{e}");
        assert!(e["sm4cinstanceid"].as_str().is_some_and(|s| !s.is_empty()), "{e}");
    }
    assert_eq!(events[0]["id"], events[1]["id"]);
    assert_eq!(events[0]["sm4cinstanceid"], events[1]["sm4cinstanceid"]);
}

#[test]
fn send_event_context_attributes_take_jq_values() {
    let d = tmp();
    let def = sm(json!({
        "events": [{"name": "done", "type": "order.done", "source": "shop"}],
        "states": [{"name": "Send", "start": true,
            "enterAction": {"type": "sendEvent", "event": "done", "expression": "${ .order }",
                            "contextAttributes": {"orderid": "${ .order.id }", "channel": "web"}}}]
    }));
    let f = write(d.path(), "def.json", &def);
    let input = write(d.path(), "input.json", &json!({"order": {"id": "o-42"}}));
    let sent = d.path().join("sent.ndjson");
    let sent = sent.to_str().expect("utf-8");
    let (code, _, err) = sm4c(&["run", &f, "--input", &input, "--sent", sent]);
    assert_eq!(code, 0, "stderr:\n{err}");
    let text = std::fs::read_to_string(sent).expect("sent file");
    let e = parse(text.lines().next().expect("one event"));
    assert_eq!(e["orderid"], "o-42", "{e}");
    assert_eq!(e["channel"], "web", "{e}");
    assert_eq!(e["data"], json!({"id": "o-42"}), "{e}");
}

#[test]
fn retry_policy_exhausted_then_error_propagates() {
    let d = tmp();
    let f = write(d.path(), "def.json", &call_state(true, json!([{"retryPolicy": "r"}])));
    let mock = write(d.path(), "mock.json", &json!({"f": "error(\"boom\")"}));
    let (code, out, err) = sm4c(&["run", &f, "--mock", &mock, "--virtual-time", "-v"]);
    assert_eq!(code, 1, "stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["type"], "functionError", "{v}");
    assert_eq!(v["message"], "boom", "{v}");
    let retries = err.lines().filter(|l| l.contains("] retry ")).count();
    assert_eq!(retries, 2, "stderr:\n{err}");
    let failures = err.lines().filter(|l| l.contains("failed: boom")).count();
    assert_eq!(failures, 3, "stderr:\n{err}");
}

#[test]
fn wait_for_completion_false_yields_null() {
    let d = tmp();
    let mock = write(d.path(), "mock.json", &json!({"f": "{ a: 1 }"}));
    let f = write(d.path(), "nowait.json", &call_state(false, json!([])));
    let (code, out, err) = sm4c(&["run", &f, "--mock", &mock]);
    assert_eq!(code, 0, "stderr:\n{err}");
    assert_eq!(parse(&out), json!({"r": null}));
    let f = write(d.path(), "wait.json", &call_state(true, json!([])));
    let (code, out, err) = sm4c(&["run", &f, "--mock", &mock]);
    assert_eq!(code, 0, "stderr:\n{err}");
    assert_eq!(parse(&out), json!({"r": {"a": 1}}));
}

#[test]
fn parallel_xor_takes_the_shorter_branch() {
    let d = tmp();
    let branch = |name: &str, delay: &str| {
        json!({"name": name, "type": "sequence", "actions": [
            {"type": "delay", "timeout": delay},
            {"name": "v", "type": "injectData", "expression": format!("${{ \"{name}\" }}")}
        ]})
    };
    let def = one_state(json!({
        "enterAction": {"type": "parallel", "completionType": "xor",
                        "actions": [branch("slow", "PT10M"), branch("fast", "PT1M")]},
        "enterResultHandler": "${ .race = $value }"
    }));
    let f = write(d.path(), "def.json", &def);
    let (code, out, err) = sm4c(&["run", &f, "--virtual-time"]);
    assert_eq!(code, 0, "stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["race"]["fast"]["v"], "fast", "{v}");
    assert!(v["race"].get("slow").is_none(), "{v}");
}

#[test]
fn foreach_runs_at_most_max_parallel_items_at_once() {
    let d = tmp();
    let def = sm(json!({
        "events": [{"name": "tick", "type": "tick", "source": "fe"}],
        "states": [{"name": "Each", "start": true,
            "enterAction": {"type": "foreach", "input": "${ .items }", "maxParallel": 2,
                "action": {"type": "sequence", "actions": [
                    {"type": "delay", "timeout": "PT1M"},
                    {"type": "sendEvent", "event": "tick", "expression": "${ . }"},
                    {"name": "v", "type": "injectData", "expression": "${ . * 10 }"}
                ]}},
            "enterResultHandler": "${ .out = [ $value[] | .v ] }"}]
    }));
    let f = write(d.path(), "def.json", &def);
    let input = write(d.path(), "input.json", &json!({"items": [1, 2, 3, 4, 5]}));
    let sent = d.path().join("sent.ndjson");
    let sent = sent.to_str().expect("utf-8");
    let (code, out, err) = sm4c(&["run", &f, "--input", &input, "--sent", sent, "--virtual-time"]);
    assert_eq!(code, 0, "stderr:\n{err}");
    assert_eq!(parse(&out)["out"], json!([10, 20, 30, 40, 50]));
    // Each item waits one minute: two at a time finish in three waves (2, 2, 1).
    let text = std::fs::read_to_string(sent).expect("sent file");
    let mut times: Vec<String> = text
        .lines()
        .map(|l| parse(l)["time"].as_str().expect("time").to_string())
        .collect();
    times.sort();
    let mut waves: Vec<usize> = Vec::new();
    for (i, t) in times.iter().enumerate() {
        if i > 0 && times[i - 1] == *t {
            *waves.last_mut().expect("wave") += 1;
        } else {
            waves.push(1);
        }
    }
    assert_eq!(waves, vec![2, 2, 1], "{text}");
}

fn exec_timeout_def(key: &str) -> Value {
    let mut def = sm(json!({
        "events": [{"name": "go", "type": "go", "source": "s"},
                   {"name": "late", "type": "late", "source": "t"}],
        "states": [
            {"name": "Wait", "start": true, "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["go"]}]}]},
            {"name": "Done"}
        ]
    }));
    def[key] =
        json!({"duration": "PT1M", "action": {"type": "sendEvent", "event": "late", "expression": "${ \"late\" }"}});
    def
}

fn check_exec_timeout(key: &str) {
    let d = tmp();
    let f = write(d.path(), "def.json", &exec_timeout_def(key));
    let sent = d.path().join("sent.ndjson");
    let sent = sent.to_str().expect("utf-8");
    let (code, out, err) = sm4c(&["run", &f, "--sent", sent, "--virtual-time"]);
    assert_eq!(code, 1, "{key}: stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["type"], "timeout", "{key}: {v}");
    assert_eq!(v["state"], "Wait", "{key}: {v}");
    assert!(err.contains("Wait"), "{key}: stderr:\n{err}");
    let text = std::fs::read_to_string(sent).unwrap_or_default();
    assert!(
        text.lines().any(|l| parse(l)["type"] == "late"),
        "{key}: the timeout action did not send its event: {text:?}"
    );
    // With the awaited event in the inbox the timeout never fires.
    let ev = write_events(
        d.path(),
        "go.ndjson",
        &[json!({"specversion":"1.0","id":"g","source":"s","type":"go"})],
    );
    let (code, out, err) = sm4c(&["run", &f, "--events", &ev, "--virtual-time"]);
    assert_eq!(code, 0, "{key}: stderr:\n{err}");
    assert_eq!(parse(&out), json!({}));
}

#[test]
fn execution_timeout() {
    check_exec_timeout("timeout");
}

#[test]
fn exec_timeout_alias() {
    check_exec_timeout("execTimeout");
}

fn graph_def(dir: &Path) -> String {
    write(
        dir,
        "def.json",
        &sm(json!({"states": [
            {"name": "Count", "start": true, "transitions": [
                {"nextState": "Done", "condition": "${ .count >= 3 }"},
                {"condition": "${ .count < 3 }", "action": {"type": "injectData", "expression": "${ .count + 1 }"},
                 "resultHandler": "${ .count = $value }"}
            ]},
            {"name": "Done"}
        ]})),
    )
}

#[test]
fn graph_dot() {
    let d = tmp();
    let f = graph_def(d.path());
    let (code, out, err) = sm4c(&["graph", &f, "--format", "dot"]);
    assert_eq!(code, 0, "stderr:\n{err}");
    assert!(out.contains("digraph"), "{out}");
    assert!(out.contains(".count >= 3"), "{out}");
    assert!(out.contains("Count") && out.contains("Done"), "{out}");
}

#[test]
fn graph_mermaid_is_default() {
    let d = tmp();
    let f = graph_def(d.path());
    let (code, out, err) = sm4c(&["graph", &f]);
    assert_eq!(code, 0, "stderr:\n{err}");
    assert!(out.contains("stateDiagram-v2"), "{out}");
    assert!(out.contains(".count >= 3"), "{out}");
    let (code, explicit, _) = sm4c(&["graph", &f, "--format", "mermaid"]);
    assert_eq!(code, 0);
    assert_eq!(explicit, out);
}

#[test]
fn graph_of_invalid_definition_fails() {
    let d = tmp();
    let f = write(d.path(), "def.json", &sm(json!({})));
    let (code, out, err) = sm4c(&["graph", &f]);
    assert_eq!(code, 2);
    assert_eq!(out, "");
    assert_error(&err, &f, "/", &["`states`"]);
}

#[test]
fn schema_is_json() {
    let (code, out, err) = sm4c(&["schema"]);
    assert_eq!(code, 0, "stderr:\n{err}");
    let v = parse(&out);
    assert!(v["$defs"].is_object(), "no $defs object");
}

// ---------------------------------------------------------------- conditions fire only on true

/// A value of every JSON type a condition can yield, and whether it fires: only `true` does (the
/// seed: "result of 'true' triggers this transition"), not jq's truthiness.
fn condition_values() -> Vec<(Value, bool)> {
    vec![
        (json!(true), true),
        (json!(false), false),
        (json!(null), false),
        (json!("true"), false),
        (json!(1), false),
        (json!([true]), false),
        (json!({"ok": true}), false),
    ]
}

/// States `Hit` and `Miss`, each recording its name in `.outcome`.
fn hit_and_miss() -> Vec<Value> {
    ["Hit", "Miss"]
        .iter()
        .map(|name| {
            json!({"name": name,
                   "enterAction": {"type": "injectData", "expression": format!("${{ \"{}\" }}", name.to_lowercase())},
                   "enterResultHandler": "${ .outcome = $value }"})
        })
        .collect()
}

/// Asserts what the `-v` trace says of the condition at `pointer`: for a value that is not a
/// boolean, that it yielded it (as JSON) and did not fire; for a boolean, nothing.
fn assert_condition_trace(err: &str, pointer: &str, condition: &str, value: &Value) {
    let line = format!("condition {pointer} {condition} yielded {value}, not a boolean: it does not fire");
    if value.is_boolean() {
        assert!(!err.contains("not a boolean"), "{value}: stderr:\n{err}");
    } else {
        assert!(
            err.lines().any(|l| l.ends_with(&line)),
            "{value}: no stderr line ending `{line}`; stderr:\n{err}"
        );
    }
}

#[test]
fn transition_conditions_fire_only_on_true() {
    let d = tmp();
    let mut states = vec![json!({"name": "Check", "start": true, "transitions": [
        {"nextState": "Hit", "condition": "${ .v }"},
        {"nextState": "Miss"}
    ]})];
    states.extend(hit_and_miss());
    let f = write(d.path(), "def.json", &sm(json!({ "states": states })));
    for (value, fires) in condition_values() {
        let input = write(d.path(), "input.json", &json!({ "v": value }));
        let (code, out, err) = sm4c(&["run", &f, "--input", &input, "-v"]);
        assert_eq!(code, 0, "{value}: stderr:\n{err}");
        let outcome = if fires { "hit" } else { "miss" };
        assert_eq!(parse(&out), json!({"v": value, "outcome": outcome}), "{value}");
        assert_condition_trace(&err, "/states/0/transitions/0/condition", "${ .v }", &value);
    }
}

#[test]
fn event_group_conditions_fire_only_on_true() {
    let d = tmp();
    let mut states = vec![json!({"name": "Wait", "start": true, "transitions": [
        {"nextState": "Hit", "eventGroups": [{"events": ["go"], "condition": "${ .data.v }"}]},
        {"nextState": "Miss", "timeout": "PT1M"}
    ]})];
    states.extend(hit_and_miss());
    let def = sm(json!({"events": [{"name": "go", "type": "go"}], "states": states}));
    let f = write(d.path(), "def.json", &def);
    for (value, fires) in condition_values() {
        let ev = write_events(
            d.path(),
            "events.ndjson",
            &[json!({"specversion": "1.0", "id": "e1", "source": "s", "type": "go",
                     "datacontenttype": "application/json", "data": {"v": value}})],
        );
        let (code, out, err) = sm4c(&["run", &f, "--events", &ev, "--virtual-time", "-v"]);
        assert_eq!(code, 0, "{value}: stderr:\n{err}");
        let outcome = if fires { "hit" } else { "miss" };
        assert_eq!(parse(&out), json!({ "outcome": outcome }), "{value}");
        assert_eq!(err.contains("consumed"), fires, "{value}: stderr:\n{err}");
        assert_condition_trace(
            &err,
            "/states/0/transitions/0/eventGroups/0/condition",
            "${ .data.v }",
            &value,
        );
    }
}

#[test]
fn error_handler_conditions_fire_only_on_true() {
    let d = tmp();
    // The call fails with the JSON text of `.v` as its message; the first handler's condition
    // turns it back into the value, the second handler takes any error.
    let def = sm(json!({
        "functions": [{"name": "f", "operation": "http://example.org/api.json#f"}],
        "states": [{"name": "Call", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "f", "waitForCompletion": true,
                            "arguments": {"v": "${ .v }"},
                            "errorHandlers": [
                                {"condition": "${ .message | fromjson }", "resultHandler": "${ .outcome = \"hit\" }"},
                                {"resultHandler": "${ .outcome = \"miss\" }"}
                            ]}}]
    }));
    let f = write(d.path(), "def.json", &def);
    let mock = write(d.path(), "mock.json", &json!({"f": "error(.v | tojson)"}));
    for (value, fires) in condition_values() {
        let input = write(d.path(), "input.json", &json!({ "v": value }));
        let (code, out, err) = sm4c(&["run", &f, "--input", &input, "--mock", &mock, "-v"]);
        assert_eq!(code, 0, "{value}: stderr:\n{err}");
        let outcome = if fires { "hit" } else { "miss" };
        assert_eq!(parse(&out), json!({"v": value, "outcome": outcome}), "{value}");
        assert_condition_trace(
            &err,
            "/states/0/enterAction/errorHandlers/0/condition",
            "${ .message | fromjson }",
            &value,
        );
    }
}

#[test]
fn the_first_transition_whose_condition_is_true_fires_not_the_first_truthy_one() {
    let d = tmp();
    let mut states = vec![json!({"name": "Check", "start": true, "transitions": [
        {"nextState": "Miss", "condition": "${ .status }"},
        {"nextState": "Miss", "condition": "${ .count }"},
        {"nextState": "Hit", "condition": "${ .status == \"yes\" }"}
    ]})];
    states.extend(hit_and_miss());
    let f = write(d.path(), "def.json", &sm(json!({ "states": states })));
    let input = write(d.path(), "input.json", &json!({"status": "yes", "count": 1}));
    let (code, out, err) = sm4c(&["run", &f, "--input", &input, "-v"]);
    assert_eq!(code, 0, "stderr:\n{err}");
    assert_eq!(parse(&out), json!({"status": "yes", "count": 1, "outcome": "hit"}));
    assert!(
        err.contains("transition 2 of \"Check\" (condition) -> \"Hit\""),
        "stderr:\n{err}"
    );
    assert_condition_trace(&err, "/states/0/transitions/0/condition", "${ .status }", &json!("yes"));
    assert_condition_trace(&err, "/states/0/transitions/1/condition", "${ .count }", &json!(1));
}

// ---------------------------------------------------------------- long runs

#[test]
fn counter_loop_of_ten_thousand_iterations() {
    let d = tmp();
    let def = sm(json!({"states": [
        {"name": "Count", "start": true, "transitions": [
            {"nextState": "Done", "condition": "${ .count >= 10000 }"},
            {"condition": "${ .count < 10000 }",
             "action": {"type": "injectData", "expression": "${ .count + 1 }"},
             "resultHandler": "${ .count = $value }"}
        ]},
        {"name": "Done"}
    ]}));
    let f = write(d.path(), "def.json", &def);
    let input = write(d.path(), "input.json", &json!({"count": 0}));
    let (code, out, err) = sm4c(&["run", &f, "--input", &input]);
    assert_eq!(code, 0, "stderr:\n{err}");
    assert_eq!(parse(&out), json!({"count": 10000}));
}

#[test]
fn schedule_next_prints_a_schedules_times_without_a_server() {
    // A cron expression in a time zone, across the day New York skips 02:30.
    let (code, out, err) = sm4c(&[
        "schedule",
        "next",
        "30 2 * * *",
        "--timezone",
        "America/New_York",
        "--after",
        "2026-03-07T00:00:00Z",
        "--count",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "2026-03-07T07:30:00Z  2026-03-07T02:30:00-05:00 (America/New_York)\n\
         2026-03-09T06:30:00Z  2026-03-09T02:30:00-04:00 (America/New_York)\n"
    );
    // A schedule file, as JSON, with its instance ids; an interval aligned to the epoch.
    let dir = tmp();
    let file = write(
        dir.path(),
        "nightly.json",
        &json!({"id": "nightly", "definition": "report", "every": "PT6H",
        "endAt": "2026-11-28T13:00:00Z"}),
    );
    let (code, out, err) = sm4c(&["schedule", "next", &file, "--after", "2026-11-28T01:00:00Z", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = parse(&out);
    assert_eq!(
        v,
        json!([
            {"nominal": "2026-11-28T06:00:00Z", "local": "2026-11-28T06:00:00+00:00", "instance": "nightly@2026-11-28T06:00:00Z"},
            {"nominal": "2026-11-28T12:00:00Z", "local": "2026-11-28T12:00:00+00:00", "instance": "nightly@2026-11-28T12:00:00Z"}
        ])
    );
    // A bad spec names its field, exit 2.
    let (code, _, err) = sm4c(&["schedule", "next", "0 25 * * *"]);
    assert_eq!(code, 2);
    assert_eq!(err, "0 25 * * *: /cron: hour: 25 is outside 0-23\n");
    let (code, _, err) = sm4c(&["schedule", "next", r#"{"every": "PT1M", "overlap": "often"}"#]);
    assert_eq!(code, 2);
    assert!(err.contains("/overlap: must be one of skip, bufferOne"), "{err}");
}

/// `sm4c run --nominal-time` runs a definition as a schedule's run: SM4C reads it with `schedule`,
/// ASL as `$$.Schedule`; `--schedule` names the schedule (the definition's id by default); under
/// --virtual-time the clock starts at the nominal time. A time that is not RFC 3339 is a usage error.
#[test]
fn run_takes_a_nominal_time_as_a_schedule_would() {
    let dir = tmp();
    let def = write(
        dir.path(),
        "nightly.json",
        &json!({"id": "nightly", "version": "1", "name": "Nightly",
            "states": [{"name": "Stamp", "start": true, "end": true,
                "enterAction": {"type": "InjectData", "expression": "${ schedule }"},
                "enterResultHandler": "${ .schedule = $value }"}]}),
    );
    let (code, out, err) = sm4c(&["run", &def, "--nominal-time", "2026-11-28T03:00:00+01:00"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        parse(&out),
        json!({"schedule": {"id": "nightly", "nominalTime": "2026-11-28T02:00:00Z"}})
    );
    let (code, out, err) = sm4c(&["run", &def]);
    assert_eq!((code, parse(&out)), (0, json!({"schedule": null})), "{err}");
    let asl = write(
        dir.path(),
        "stamp.asl.json",
        &json!({"StartAt": "Wait", "States": {
            "Wait": {"Type": "Wait", "Seconds": 600, "Next": "Stamp"},
            "Stamp": {"Type": "Pass", "End": true,
                      "Parameters": {"schedule.$": "$$.Schedule", "entered.$": "$$.State.EnteredTime"}}}}),
    );
    let (code, out, err) = sm4c(&[
        "run",
        &asl,
        "--virtual-time",
        "--nominal-time",
        "2026-11-28T02:00:00Z",
        "--schedule",
        "reports",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        parse(&out),
        json!({"schedule": {"Id": "reports", "NominalTime": "2026-11-28T02:00:00Z"},
               "entered": "2026-11-28T02:10:00.000Z"})
    );
    let (code, _, err) = sm4c(&["run", &def, "--nominal-time", "tonight"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--nominal-time") && err.contains("RFC 3339"), "{err}");
    let (code, _, err) = sm4c(&["run", &def, "--schedule", "reports"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--nominal-time"), "{err}");
}
