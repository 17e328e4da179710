//! `sm4c test`, `sm4c test-state` and `sm4c graph --coverage`, run as the real binary on the
//! fixtures in `tests/data/test_cmd/` (an SM4C order with a retry, an error handler, an event and
//! a timeout; an ASL check with Retry, Catch, Choice rules and Default; a parent with a subflow)
//! and on test files each test writes into a temporary folder.

use crate::support::run;

use run::{parse, sm4c, tmp, write, write_raw};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/test_cmd")
}

fn fixture(name: &str) -> String {
    data().join(name).to_str().expect("utf-8 path").to_string()
}

/// A definition whose one function call has no error handler: a failed call fails the instance.
fn strict() -> Value {
    json!({"id": "strict", "version": "1", "name": "Strict",
    "functions": [{"name": "f", "operation": "http://example.org/api.json#f"}],
    "states": [
        {"name": "A", "start": true,
         "enterAction": {"type": "invokeFunction", "functionName": "f", "waitForCompletion": true,
                         "arguments": {"x": "${ .x }"}},
         "enterResultHandler": "${ .got = $value }",
         "transitions": [{"nextState": "B"}]},
        {"name": "B"}
    ]})
}

/// The failures `sm4c test --json` reports for test `name`, as (path, expected, actual).
fn failures(doc: &Value, name: &str) -> Vec<(String, Value, Value)> {
    let t = doc["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no test {name:?} in {doc:#}"));
    t["failures"]
        .as_array()
        .expect("failures")
        .iter()
        .map(|f| {
            (
                f["path"].as_str().expect("path").to_string(),
                f["expected"].clone(),
                f["actual"].clone(),
            )
        })
        .collect()
}

#[test]
fn passing_tests_print_a_line_each_and_exit_0() {
    let (code, out, err) = sm4c(&["test", data().to_str().unwrap()]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for name in [
        "approved",
        "busy then fraud",
        "delivered",
        "lost after the timeout",
        "busy then declined",
        "the subflow doubles",
    ] {
        let line = out
            .lines()
            .find(|l| l.contains(&format!(" {name} (")))
            .unwrap_or_else(|| panic!("no line for {name:?}:\n{out}"));
        assert!(line.trim_start().starts_with('✓'), "{line}");
        assert!(line.ends_with(" ms)"), "{line}");
    }
    assert!(out.contains("6 passed, 0 failed"), "{out}");
    // In file order: check.test.yaml, order.test.json, parent.test.json.
    let at = |s: &str| out.find(s).unwrap_or_else(|| panic!("{s:?} missing:\n{out}"));
    assert!(at("check.test.yaml") < at("order.test.json") && at("order.test.json") < at("parent.test.json"));
}

#[test]
fn coverage_counts_match_a_count_by_hand() {
    let (code, out, err) = sm4c(&["test", "--json", data().to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let doc = parse(&out);
    assert_eq!((doc["passed"].clone(), doc["failed"].clone()), (json!(6), json!(0)));
    let c = &doc["coverage"];
    // order: 5 states; 4 transitions + 2 error handlers; 3 actions. The three tests take them all:
    // delivered (t0 of Charge, t0 of Ship), lost (t1 of Ship, a timeout), busy then declined (the
    // retry handler, then the catch-all handler, then t1 of Charge).
    assert_eq!(
        c["order"],
        json!({
            "states": {"covered": 5, "total": 5, "missed": []},
            "transitions": {"covered": 6, "total": 6, "missed": []},
            "actions": {"covered": 3, "total": 3, "missed": []},
        })
    );
    // check (ASL): Score's Next and two Catch, Decide's two rules and Default: 6 transitions.
    // "approved" takes Next and rule 0; "busy then fraud" retries and takes Catch 0.
    assert_eq!(
        c["check"],
        json!({
            "states": {"covered": 4, "total": 5, "missed": ["Review"]},
            "transitions": {"covered": 3, "total": 6, "missed": [
                "/States/Score/Catch/1", "/States/Decide/Choices/1", "/States/Decide/Default"
            ]},
            "actions": {"covered": 1, "total": 1, "missed": []},
        })
    );
    assert_eq!(c["parent"]["actions"], json!({"covered": 1, "total": 1, "missed": []}));
    assert_eq!(
        c["parent"]["transitions"],
        json!({"covered": 0, "total": 0, "missed": []})
    );
    // The subflow, counted from what its instance did as the child of parent's test: Calc, then
    // its second transition to Small.
    assert_eq!(
        c["double"],
        json!({
            "states": {"covered": 2, "total": 3, "missed": ["Big"]},
            "transitions": {"covered": 1, "total": 2, "missed": ["/states/0/transitions/0"]},
            "actions": {"covered": 1, "total": 1, "missed": []},
        })
    );
    let t = doc["tests"].as_array().unwrap();
    assert_eq!(t.len(), 6);
    assert!(t
        .iter()
        .all(|t| t["ms"].is_u64() && t["file"].is_string() && t["passed"] == true));

    // One test alone: delivered enters Charge, Ship, Done and takes t0 of each of the first two.
    let (code, out, _) = sm4c(&["test", "--json", "--filter", "delivered", &fixture("order.test.json")]);
    assert_eq!(code, 0);
    let doc = parse(&out);
    assert_eq!(doc["tests"].as_array().unwrap().len(), 1);
    assert_eq!(
        doc["coverage"]["order"],
        json!({
            "states": {"covered": 3, "total": 5, "missed": ["Declined", "Lost"]},
            "transitions": {"covered": 2, "total": 6, "missed": [
                "/states/0/transitions/1", "/states/1/transitions/1",
                "/states/0/enterAction/errorHandlers/0", "/states/0/enterAction/errorHandlers/1"
            ]},
            "actions": {"covered": 3, "total": 3, "missed": []},
        })
    );
}

#[test]
fn text_coverage_lists_what_was_missed() {
    let (code, out, _) = sm4c(&["test", &fixture("check.test.yaml")]);
    assert_eq!(code, 0);
    assert!(out.contains("  transitions  3/6 (50.0%)"), "{out}");
    assert!(
        out.contains("missed: /States/Decide/Default  Decide Default → Review"),
        "{out}"
    );
    assert!(
        out.contains("missed: /States/Score/Catch/1  Score Catch States.ALL → Review"),
        "{out}"
    );
    assert!(out.contains("    missed: Review\n"), "{out}");
}

#[test]
fn each_kind_of_expectation_fails_at_its_pointer() {
    let dir = tmp();
    write(dir.path(), "strict.json", &strict());
    let order = fixture("order.json");
    write(
        dir.path(),
        "order.test.json",
        &json!({"definition": order, "mocks": {"charge": "{ok: true, order: .order}"}, "tests": [
            {"name": "all wrong", "input": {"id": "B1", "cents": 5},
             "expect": {
                "status": "failed",
                "states": ["Charge", "Ship", "Done"],
                "data": {"payment": {"order": "B2", "ok": true}, "nothere": 1},
                "sent": [{"type": "order.shipped", "data": {"id": "B9"}}],
                "calls": [{"function": "charge", "arguments": {"cents": 6}}]
             }},
            {"name": "fewer calls than made", "input": {"id": "B1"},
             "expect": {"calls": []}},
            {"name": "all right", "input": {"id": "B1", "cents": 5},
             "expect": {
                "status": "completed",
                "states": ["Charge", "Ship", "Lost"],
                "data": {"payment": {"order": "B1"}},
                "sent": [{"type": "order.shipped", "source": "order", "data": {"id": "B1"}}],
                "calls": [{"function": "charge", "arguments": {"cents": 5}}]
             }}
        ]}),
    );
    write(
        dir.path(),
        "strict.test.json",
        &json!({"definition": "strict.json", "tests": [
            {"name": "error as expected", "input": {"x": 1},
             "mocks": {"f": [{"error": {"kind": "timeout", "message": "slow", "details": {"after": 3}}}]},
             "expect": {"status": "failed", "error": {"type": "timeout", "message": "slow", "details": {"after": 3}}}},
            {"name": "another error", "input": {"x": 1},
             "mocks": {"f": [{"error": {"kind": "timeout", "message": "slow"}}]},
             "expect": {"error": {"type": "functionError", "message": "slow"}}},
            {"name": "no error at all", "mocks": {"f": "1"},
             "expect": {"error": {"type": "timeout"}}}
        ]}),
    );
    let (code, out, err) = sm4c(&["test", "--json", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    let doc = parse(&out);
    assert_eq!((doc["passed"].clone(), doc["failed"].clone()), (json!(2), json!(4)));
    assert_eq!(
        failures(&doc, "all wrong"),
        vec![
            ("/status".into(), json!("failed"), json!("completed")),
            ("/states/2".into(), json!("Done"), json!("Lost")),
            ("/data/payment/order".into(), json!("B2"), json!("B1")),
            ("/data/nothere".into(), json!(1), Value::Null),
            ("/sent/0/data/id".into(), json!("B9"), json!("B1")),
            ("/calls/0/arguments/cents".into(), json!(6), json!(5)),
        ]
    );
    let fewer = failures(&doc, "fewer calls than made");
    assert_eq!(fewer.len(), 1);
    assert_eq!((fewer[0].0.as_str(), &fewer[0].1), ("/calls", &json!([])));
    assert_eq!(fewer[0].2[0]["function"], "charge");
    assert!(failures(&doc, "all right").is_empty());
    assert!(failures(&doc, "error as expected").is_empty());
    assert_eq!(
        failures(&doc, "another error"),
        vec![("/error/type".into(), json!("functionError"), json!("timeout"))]
    );
    assert_eq!(
        failures(&doc, "no error at all"),
        vec![("/error".into(), json!({"type": "timeout"}), Value::Null)]
    );

    // The same as text: ✗ lines with the pointer and both values side by side.
    let (code, out, _) = sm4c(&["test", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(out.contains("  ✗ all wrong ("), "{out}");
    assert!(out.contains("  ✓ all right ("), "{out}");
    assert!(
        out.contains("      /states/2: expected \"Done\", actual \"Lost\"\n"),
        "{out}"
    );
    assert!(
        out.contains("      /data/nothere: expected 1, actual (missing)\n"),
        "{out}"
    );
    assert!(out.contains("2 passed, 4 failed"), "{out}");
    // A long value: a line diff, `-` expected and `+` actual.
    assert!(
        out.contains("      /calls: expected and actual differ (- expected, + actual):"),
        "{out}"
    );
    assert!(out.contains("\n          + [\n"), "{out}");
}

#[test]
fn mock_lists_answer_one_call_each_and_say_when_used_up() {
    let dir = tmp();
    write(dir.path(), "strict.json", &strict());
    write(
        dir.path(),
        "s.test.json",
        &json!({"definition": "strict.json", "tests": [
            {"name": "one result", "input": {"x": 7}, "mocks": {"f": [{"result": {"n": 1}}]},
             "expect": {"status": "completed", "data": {"got": {"n": 1}}, "calls": [{"function": "f", "arguments": {"x": 7}}]}},
            {"name": "used up", "mocks": {"f": []}, "expect": {"status": "failed"}},
            {"name": "no mock", "expect": {"status": "failed"}}
        ]}),
    );
    let (code, out, _) = sm4c(&["test", "--json", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1);
    let doc = parse(&out);
    assert!(failures(&doc, "one result").is_empty());
    assert_eq!(
        failures(&doc, "used up"),
        vec![("/mocks/f".into(), json!("at most 0 calls"), json!("call 1"))]
    );
    assert_eq!(
        failures(&doc, "no mock"),
        vec![("/mocks/f".into(), json!("a mock"), Value::Null)]
    );
    let (_, text, _) = sm4c(&["test", dir.path().to_str().unwrap()]);
    assert!(
        text.contains("(the instance ended failed in state \"A\": function \"f\" has no mock in this test)"),
        "{text}"
    );
}

#[test]
fn virtual_time_is_on_unless_turned_off() {
    // Under virtual time the two-hour timeout fires at once and the clock starts at a fixed time.
    let (code, out, _) = sm4c(&["test", "--json", "--filter", "lost", &fixture("order.test.json")]);
    assert_eq!(code, 0, "{out}");
    let dir = tmp();
    let clocked = json!({"id": "clock", "version": "1", "name": "Clock",
        "events": [{"name": "tick", "type": "tick", "source": "clock"}],
        "states": [{"name": "Stamp", "start": true,
            "enterAction": {"type": "sendEvent", "event": "tick", "expression": "${ 1 }"},
            "transitions": [{"nextState": "Late", "timeout": "PT1H"}]},
            {"name": "Late"}]});
    write(dir.path(), "clock.json", &clocked);
    write(
        dir.path(),
        "clock.test.json",
        &json!({"definition": "clock.json", "tests": [
            {"name": "virtual", "expect": {"status": "completed", "states": ["Stamp", "Late"],
                "sent": [{"time": "2026-01-01T00:00:00.000Z"}]}}
        ]}),
    );
    let (code, out, err) = sm4c(&["test", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    // With virtualTime false the clock is the system's: the event is stamped now, not at the
    // virtual start (no timer is waited for: the instance is left waiting).
    let sends = json!({"id": "send", "version": "1", "name": "Send",
        "events": [{"name": "tick", "type": "tick", "source": "clock"},
                   {"name": "never", "type": "never", "source": "nobody"}],
        "states": [{"name": "Stamp", "start": true,
            "enterAction": {"type": "sendEvent", "event": "tick", "expression": "${ 1 }"},
            "transitions": [{"nextState": "End", "eventGroups": [{"events": ["never"]}]}]},
            {"name": "End"}]});
    write(dir.path(), "send.json", &sends);
    write(
        dir.path(),
        "clock.test.json",
        &json!({"definition": "send.json", "tests": [
            {"name": "real", "virtualTime": false,
             "expect": {"status": "waiting", "sent": [{"time": "2026-01-01T00:00:00.000Z"}]}}
        ]}),
    );
    let (code, out, _) = sm4c(&["test", "--json", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1);
    let f = failures(&parse(&out), "real");
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].0, "/sent/0/time");
    assert_ne!(f[0].2, json!("2026-01-01T00:00:00.000Z"));
    assert!(f[0].2.as_str().is_some_and(|t| t.ends_with('Z')), "{f:?}");
}

/// A test can run a definition as a schedule's run: `nominalTime` (and `schedule`, default the
/// definition's id) is what the jq function `schedule` reads, and the virtual clock starts at it.
/// A bad time is refused with its pointer.
#[test]
fn a_test_runs_a_definition_as_a_schedule_would() {
    let dir = tmp();
    let nightly = json!({"id": "nightly", "version": "1", "name": "Nightly",
        "events": [{"name": "tick", "type": "tick", "source": "clock"}],
        "states": [{"name": "Stamp", "start": true,
            "enterAction": {"type": "InjectData", "expression": "${ schedule }"},
            "enterResultHandler": "${ .schedule = $value }",
            "transitions": [{"nextState": "Sent", "timeout": "PT5M"}]},
            {"name": "Sent", "enterAction": {"type": "sendEvent", "event": "tick", "expression": "${ 1 }"}}]});
    write(dir.path(), "nightly.json", &nightly);
    write(
        dir.path(),
        "nightly.test.json",
        &json!({"definition": "nightly.json", "tests": [
            {"name": "as scheduled", "nominalTime": "2026-11-28T02:00:00Z", "schedule": "reports",
             "expect": {"status": "completed",
                "data": {"schedule": {"id": "reports", "nominalTime": "2026-11-28T02:00:00Z"}},
                "sent": [{"time": "2026-11-28T02:05:00.000Z"}]}},
            {"name": "schedule defaults to the definition", "nominalTime": "2026-11-28T03:00:00+01:00",
             "expect": {"data": {"schedule": {"id": "nightly", "nominalTime": "2026-11-28T02:00:00Z"}}}},
            {"name": "by hand", "expect": {"data": {"schedule": null}}}
        ]}),
    );
    let (code, out, err) = sm4c(&["test", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("3 passed, 0 failed"), "{out}");
    let bad = |case: Value, pointer: &str, needle: &str| {
        write(
            dir.path(),
            "nightly.test.json",
            &json!({"definition": "nightly.json", "tests": [case]}),
        );
        let path = dir.path().join("nightly.test.json");
        let (code, out, err) = sm4c(&["test", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{out}{err}");
        assert!(
            err.lines()
                .any(|l| l.contains(&format!(": {pointer}: ")) && l.contains(needle)),
            "no {pointer} naming {needle:?}: {err}"
        );
    };
    bad(
        json!({"name": "x", "nominalTime": "tonight", "expect": {"status": "completed"}}),
        "/tests/0/nominalTime",
        "RFC 3339",
    );
    bad(
        json!({"name": "x", "schedule": "reports", "expect": {"status": "completed"}}),
        "/tests/0/schedule",
        "nominalTime",
    );
}

#[test]
fn subflows_come_from_the_named_folder() {
    let dir = tmp();
    write(
        dir.path(),
        "p.test.json",
        &json!({"definition": fixture("parent.json"), "tests": [
            {"name": "no folder", "input": {"n": 1}, "expect": {"status": "completed"}}
        ]}),
    );
    let (code, _, err) = sm4c(&["test", dir.path().to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "{}: /states/0/enterAction/subflowName: unknown subflow \"double\"",
            fixture("parent.json")
        )),
        "{err}"
    );
    // With the folder given per test.
    write(
        dir.path(),
        "p.test.json",
        &json!({"definition": fixture("parent.json"), "tests": [
            {"name": "folder", "input": {"n": 4}, "subflows": fixture("subflows"),
             "expect": {"data": {"child": {"result": 8}}}}
        ]}),
    );
    let (code, out, err) = sm4c(&["test", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
}

/// Asserts that `sm4c test FILE` exits 2 and says `FILE: POINTER: ...` with every needle.
fn invalid(dir: &Path, name: &str, text: &str, pointer: &str, needles: &[&str]) {
    let path = write_raw(dir, name, text);
    let (code, out, err) = sm4c(&["test", &path]);
    assert_eq!(code, 2, "{name}: stdout:\n{out}\nstderr:\n{err}");
    let prefix = format!("{path}: {pointer}: ");
    assert!(
        err.lines()
            .any(|l| l.starts_with(&prefix) && needles.iter().all(|n| l.contains(n))),
        "{name}: no line `{prefix}...` with {needles:?}:\n{err}"
    );
    assert!(out.is_empty(), "{name}: nothing runs: {out}");
}

#[test]
fn invalid_test_files_exit_2_naming_the_file_pointer_and_problem() {
    let dir = tmp();
    let d = dir.path();
    let order = fixture("order.json");
    let t = |tests: Value| json!({"definition": order, "tests": tests}).to_string();
    invalid(d, "a.test.json", "{\"definition\": 1", "/", &["not valid JSON"]);
    invalid(
        d,
        "b.test.yaml",
        "definition: [a\ntests: {",
        "/",
        &["not valid YAML", "line"],
    );
    invalid(d, "c.test.json", r#"{"tests": []}"#, "/definition", &["missing"]);
    invalid(
        d,
        "d.test.json",
        r#"{"definition": "nope.json", "tests": [{"name": "x", "expect": {"status": "completed"}}]}"#,
        "/definition",
        &["nope.json does not exist"],
    );
    invalid(
        d,
        "e.test.json",
        &t(json!([{"name": "x", "expect": {"status": "done"}}])),
        "/tests/0/expect/status",
        &["must be one of", "completed"],
    );
    invalid(
        d,
        "f.test.json",
        &t(json!([{"name": "x", "expects": {}, "expect": {"status": "completed"}}])),
        "/tests/0/expects",
        &["unknown field \"expects\""],
    );
    invalid(
        d,
        "g.test.json",
        &t(json!([{"name": "x", "mocks": {"charge": "{ok: "}, "expect": {"status": "completed"}}])),
        "/tests/0/mocks/charge",
        &["invalid jq program"],
    );
    invalid(
        d,
        "h.test.json",
        &t(json!([{"name": "x", "mocks": {"charge": [{"result": 1}, 2]}, "expect": {"status": "completed"}}])),
        "/tests/0/mocks/charge/1",
        &["{\"result\": VALUE}"],
    );
    invalid(
        d,
        "i.test.json",
        &t(json!([{"name": "x", "events": [{"id": "1"}], "expect": {"status": "completed"}}])),
        "/tests/0/events/0",
        &["not a CloudEvent"],
    );
    invalid(
        d,
        "j.test.json",
        &t(json!([{"name": "x", "expect": {}}])),
        "/tests/0/expect",
        &["expects nothing"],
    );
    invalid(
        d,
        "k.test.json",
        &t(json!([{"name": "x", "expect": {"status": "completed"}}, {"name": "x", "expect": {"status": "failed"}}])),
        "/tests/1/name",
        &["already the name of /tests/0"],
    );
    invalid(
        d,
        "l.test.json",
        &t(json!([{"name": "x", "expect": {"calls": [3]}}])),
        "/tests/0/expect/calls/0",
        &["function name"],
    );
    // An invalid definition: its own file and pointer.
    let bad = write(
        d,
        "bad.json",
        &json!({"id": "bad", "name": "b", "version": "1", "states": []}),
    );
    let path = write_raw(
        d,
        "m.test.json",
        &json!({"definition": "bad.json", "tests": [{"name": "x", "expect": {"status": "completed"}}]}).to_string(),
    );
    let (code, _, err) = sm4c(&["test", &path]);
    assert_eq!(code, 2);
    assert!(err.lines().any(|l| l.starts_with(&format!("{bad}: /states"))), "{err}");
    // Nothing to run.
    let empty = tmp();
    let (code, _, err) = sm4c(&["test", empty.path().to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("no test files"), "{err}");
}

#[test]
fn junit_has_a_testcase_per_test_and_the_differences_in_failures() {
    let dir = tmp();
    write(
        dir.path(),
        "o.test.json",
        &json!({"definition": fixture("order.json"), "mocks": {"charge": "{ok: true}"}, "tests": [
            {"name": "good <one>", "input": {"id": "C1"}, "expect": {"status": "completed"}},
            {"name": "bad & wrong", "input": {"id": "C2"}, "expect": {"status": "failed", "states": ["Charge"]}}
        ]}),
    );
    let report = dir.path().join("junit.xml");
    let (code, _, err) = sm4c(&[
        "test",
        dir.path().to_str().unwrap(),
        &fixture("check.test.yaml"),
        "--junit",
        report.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    let xml = std::fs::read_to_string(&report).expect("the report is written");
    let doc = roxmltree::Document::parse(&xml).expect("well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites");
    assert_eq!(
        (root.attribute("tests"), root.attribute("failures")),
        (Some("4"), Some("1"))
    );
    let suites: Vec<_> = root.children().filter(|n| n.has_tag_name("testsuite")).collect();
    assert_eq!(suites.len(), 2);
    let cases: Vec<_> = root.descendants().filter(|n| n.has_tag_name("testcase")).collect();
    let names: Vec<&str> = cases.iter().filter_map(|c| c.attribute("name")).collect();
    assert_eq!(names, ["good <one>", "bad & wrong", "approved", "busy then fraud"]);
    assert!(cases
        .iter()
        .all(|c| c.attribute("time").is_some_and(|t| t.parse::<f64>().is_ok())));
    let bad = cases[1];
    let fails: Vec<_> = bad.children().filter(|n| n.has_tag_name("failure")).collect();
    assert_eq!(fails.len(), 2);
    assert_eq!(
        fails[0].attribute("message"),
        Some("/status: expected \"failed\", actual \"completed\"")
    );
    assert_eq!(
        fails[1].text(),
        Some("/states: expected [\"Charge\"], actual [\"Charge\",\"Ship\",\"Lost\"]")
    );
    assert!(cases[0].children().all(|n| !n.has_tag_name("failure")));
}

#[test]
fn min_coverage_fails_a_run_below_it() {
    let check = fixture("check.test.yaml");
    let (code, _, err) = sm4c(&["test", &check, "--min-coverage", "50"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = sm4c(&["test", &check, "--min-coverage", "60"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("the transition coverage of \"check\" is 50.0% (3/6), below --min-coverage 60"),
        "{err}"
    );
    let (code, _, err) = sm4c(&["test", &check, "--min-coverage", "101"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn filter_runs_the_tests_whose_name_contains_it() {
    let (code, out, _) = sm4c(&["test", "--json", "--filter", "busy", data().to_str().unwrap()]);
    assert_eq!(code, 0);
    let doc = parse(&out);
    let names: Vec<&str> = doc["tests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["busy then fraud", "busy then declined"]);
    let (code, _, err) = sm4c(&["test", "--filter", "no such test", data().to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("no test name contains \"no such test\""), "{err}");
}

#[test]
fn test_state_runs_one_state_and_reports_the_transition_data_and_effects() {
    let dir = tmp();
    let input = write(dir.path(), "in.json", &json!({"id": "D1", "cents": 3}));
    let declines = write(dir.path(), "m.json", &json!({"charge": "{ok: false}"}));
    let (code, out, err) = sm4c(&[
        "test-state",
        &fixture("order.json"),
        "--state",
        "Charge",
        "--input",
        &input,
        "--mock",
        &declines,
    ]);
    assert_eq!(code, 0, "{err}");
    let r = parse(&out);
    assert_eq!(
        r["transition"],
        json!({"index": 1, "trigger": "implicit", "next": "Declined"})
    );
    assert_eq!(r["data"], json!({"id": "D1", "cents": 3, "payment": {"ok": false}}));
    assert_eq!(
        r["calls"],
        json!([{"function": "charge", "arguments": {"order": "D1", "cents": 3}}])
    );
    // Ship with the delivery event: its event transition, and the event it sends on entering.
    let event = write(
        dir.path(),
        "e.json",
        &json!({"specversion": "1.0", "id": "e1", "source": "carrier", "type": "order.delivered"}),
    );
    let (code, out, err) = sm4c(&[
        "test-state",
        &fixture("order.json"),
        "--state",
        "Ship",
        "--input",
        &input,
        "--event",
        &event,
    ]);
    assert_eq!(code, 0, "{err}");
    let r = parse(&out);
    assert_eq!(
        r["transition"],
        json!({"index": 0, "trigger": "events", "next": "Done"})
    );
    // Done's enter action did not run: only the state under test does.
    assert_eq!(r["data"], json!({"id": "D1", "cents": 3}));
    assert_eq!(r["sent"][0]["type"], "order.shipped");
    // ASL: the Choice rule taken, and a Catch.
    let low = write(dir.path(), "low.json", &json!({"score": 10}));
    let (code, out, _) = sm4c(&[
        "test-state",
        &fixture("check.asl.json"),
        "--state",
        "Decide",
        "--input",
        &low,
    ]);
    assert_eq!(code, 0);
    assert_eq!(
        parse(&out)["transition"],
        json!({"took": "/States/Decide/Choices/1", "next": "Rejected"})
    );
    let fraud = write(
        dir.path(),
        "fraud.json",
        &json!({"Score": [{"error": {"kind": "Fraud", "message": "stolen"}}]}),
    );
    let (code, out, _) = sm4c(&[
        "test-state",
        &fixture("check.asl.json"),
        "--state",
        "Score",
        "--input",
        &low,
        "--mock",
        &fraud,
    ]);
    assert_eq!(code, 0);
    let r = parse(&out);
    assert_eq!(
        r["transition"],
        json!({"took": "/States/Score/Catch/0", "next": "Rejected"})
    );
    assert_eq!(r["data"]["error"], json!({"Error": "Fraud", "Cause": "stolen"}));
    // A loop body (a transition that stays): the run stops after it.
    let counter = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/counter-loop/definition.json");
    let target = write(dir.path(), "t.json", &json!({"target": 3}));
    let (code, out, _) = sm4c(&[
        "test-state",
        counter.to_str().unwrap(),
        "--state",
        "Count",
        "--input",
        &target,
    ]);
    assert_eq!(code, 0);
    let r = parse(&out);
    assert_eq!(
        r["transition"],
        json!({"index": 1, "trigger": "condition", "next": null})
    );
    assert_eq!(r["data"]["count"], 1);
    assert!(r["note"].as_str().unwrap().contains("stays in the state"), "{r}");
    // A state that is not there.
    let (code, _, err) = sm4c(&[
        "test-state",
        &fixture("order.json"),
        "--state",
        "Nope",
        "--input",
        &input,
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("/states: no state \"Nope\""), "{err}");
}

#[test]
fn graph_coverage_marks_the_untested_transitions() {
    let dir = tmp();
    let (code, out, _) = sm4c(&["test", "--json", &fixture("check.test.yaml")]);
    assert_eq!(code, 0);
    let result = write_raw(dir.path(), "result.json", &out);
    let (code, mermaid, err) = sm4c(&["graph", &fixture("check.asl.json"), "--coverage", &result]);
    assert_eq!(code, 0, "{err}");
    let marked: Vec<&str> = mermaid.lines().filter(|l| l.contains("✗ untested")).collect();
    assert_eq!(
        marked,
        [
            "    g0s0 --> g0s2 : Catch States.ALL ✗ untested",
            "    g0s1 --> g0s4 : $.score NumericLessThan 20 ✗ untested",
            "    g0s1 --> g0s2 : Default ✗ untested",
        ]
    );
    let (_, plain, _) = sm4c(&["graph", &fixture("check.asl.json")]);
    assert!(!plain.contains("untested"));
    let (code, dot, _) = sm4c(&[
        "graph",
        &fixture("check.asl.json"),
        "--format",
        "dot",
        "--coverage",
        &result,
    ]);
    assert_eq!(code, 0);
    assert_eq!(dot.matches(" color=orange").count(), 3, "{dot}");
    assert_eq!(dot.matches("✗ untested").count(), 3, "{dot}");
    // SM4C: the one test of order that runs leaves two transitions untested.
    let (_, out, _) = sm4c(&["test", "--json", "--filter", "delivered", &fixture("order.test.json")]);
    let result = write_raw(dir.path(), "order.json", &out);
    let (code, mermaid, _) = sm4c(&["graph", &fixture("order.json"), "--coverage", &result]);
    assert_eq!(code, 0);
    let marked: Vec<&str> = mermaid.lines().filter(|l| l.contains("untested")).collect();
    assert_eq!(
        marked,
        ["    s0 --> s3 : ✗ untested", "    s1 --> s4 : after PT2H ✗ untested"]
    );
    // A result without this definition.
    let (code, _, err) = sm4c(&["graph", &fixture("parent.json"), "--coverage", &result]);
    assert_eq!(code, 2);
    assert!(
        err.contains("/coverage/parent: no coverage of definition \"parent\""),
        "{err}"
    );
}

#[test]
fn two_different_definitions_with_one_id_are_reported() {
    let dir = tmp();
    let mut other = strict();
    other["states"][1]["name"] = json!("C");
    other["states"][0]["transitions"][0]["nextState"] = json!("C");
    write(dir.path(), "a.json", &strict());
    write(dir.path(), "b.json", &other);
    for (file, def) in [("a.test.json", "a.json"), ("b.test.json", "b.json")] {
        write(
            dir.path(),
            file,
            &json!({"definition": def, "mocks": {"f": "1"}, "tests": [{"name": def, "expect": {"status": "completed"}}]}),
        );
    }
    let (code, _, err) = sm4c(&["test", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("a.json and ") && err.contains("b.json are different definitions with the same id \"strict\""),
        "{err}"
    );
    // The same definition tested from two files is no news.
    let (_, _, err) = sm4c(&["test", &fixture("order.test.json"), &fixture("order.test.json")]);
    assert!(!err.contains("warning"), "{err}");
}
