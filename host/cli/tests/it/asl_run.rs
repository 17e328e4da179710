//! `sm4c run`, `validate` and the ASL contract as users see it, against the real binary: the output
//! on exit 0, `{"Error", "Cause"}` on stdout and a line naming the state on stderr on exit 1, every
//! validation error with its JSON pointer on exit 2, mocks keyed by Resource or state name, virtual
//! time, and child executions started by `states:startExecution`. (The 193 cases recorded against
//! AWS live in ../shared/conformance/asl and run in a separate step of scripts/test.sh.)

use crate::support::run;

use run::{parse, sm4c, tmp, write};
use serde_json::{json, Value};

fn run_asl(def: &Value, input: &Value, mock: Option<&Value>, extra: &[&str]) -> (i32, String, String) {
    let dir = tmp();
    let d = write(dir.path(), "flow.asl.json", def);
    let i = write(dir.path(), "input.json", input);
    let sent = dir.path().join("sent.ndjson");
    let mut args = vec![
        "run",
        d.as_str(),
        "--input",
        i.as_str(),
        "--sent",
        sent.to_str().expect("path"),
    ];
    let m;
    if let Some(mock) = mock {
        m = write(dir.path(), "mock.json", mock);
        args.extend(["--mock", m.as_str()]);
    }
    args.extend(extra);
    sm4c(&args)
}

#[test]
fn an_execution_that_succeeds_prints_its_output() {
    let def = json!({
        "StartAt": "Charge",
        "States": {
            "Charge": {
                "Type": "Task",
                "Resource": "arn:aws:lambda:us-east-1:111111111111:function:charge",
                "Parameters": {"amount.$": "$.order.total", "currency": "EUR"},
                "ResultSelector": {"receipt.$": "$.id"},
                "ResultPath": "$.payment",
                "Next": "Big?"
            },
            "Big?": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.order.total", "NumericGreaterThan": 100, "Next": "Review"}],
                "Default": "Done"
            },
            "Review": {"Type": "Pass", "Result": "manual", "ResultPath": "$.review", "Next": "Done"},
            "Done": {"Type": "Succeed", "OutputPath": "$.payment"}
        }
    });
    let mock = json!({"arn:aws:lambda:us-east-1:111111111111:function:charge": "{id: (\"r-\" + (.amount | tostring)), currency}"});
    let (code, out, err) = run_asl(&def, &json!({"order": {"total": 150}}), Some(&mock), &[]);
    assert_eq!(code, 0, "stderr: {err}");
    assert_eq!(parse(&out), json!({"receipt": "r-150"}));
}

#[test]
fn a_failed_execution_prints_error_and_cause_and_names_the_state() {
    let def = json!({
        "StartAt": "Charge",
        "States": {
            "Charge": {"Type": "Task", "Resource": "charge", "End": true}
        }
    });
    let mock = json!({"Charge": "error({\"Error\": \"Card.Declined\", \"Cause\": \"insufficient funds\"})"});
    let (code, out, err) = run_asl(&def, &json!({}), Some(&mock), &[]);
    assert_eq!(code, 1);
    assert_eq!(
        parse(&out),
        json!({"Error": "Card.Declined", "Cause": "insufficient funds"})
    );
    assert_eq!(err.lines().count(), 1, "one stderr line: {err}");
    assert!(err.contains("\"Charge\"") && err.contains("Card.Declined"), "{err}");

    // error("text") is States.TaskFailed with the text as its cause.
    let mock = json!({"charge": "error(\"gateway down\")"});
    let (code, out, _) = run_asl(&def, &json!({}), Some(&mock), &[]);
    assert_eq!(code, 1);
    assert_eq!(
        parse(&out),
        json!({"Error": "States.TaskFailed", "Cause": "gateway down"})
    );
}

#[test]
fn a_fail_state_without_error_name_prints_neither_field() {
    let def = json!({"StartAt": "F", "States": {"F": {"Type": "Fail"}}});
    let (code, out, err) = run_asl(&def, &json!({}), None, &[]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(parse(&out), json!({}));
}

#[test]
fn a_task_without_mock_fails_with_a_message_saying_how_to_give_one() {
    let def = json!({"StartAt": "T", "States": {"T": {"Type": "Task", "Resource": "arn:x", "End": true}}});
    let (code, out, err) = run_asl(&def, &json!({}), None, &[]);
    assert_eq!(code, 1);
    assert_eq!(parse(&out)["Error"], json!("States.TaskFailed"));
    assert!(err.contains("\"T\""), "{err}");
}

#[test]
fn retries_then_catch_under_virtual_time() {
    // The mock fails while the input's attempt counter is below 3; a Pass before the task counts.
    let def = json!({
        "StartAt": "Call",
        "States": {
            "Call": {
                "Type": "Task",
                "Resource": "flaky",
                "Retry": [{"ErrorEquals": ["Flaky"], "IntervalSeconds": 30, "MaxAttempts": 2, "BackoffRate": 2}],
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Recovered"}],
                "End": true
            },
            "Recovered": {"Type": "Pass", "End": true}
        }
    });
    let mock = json!({"flaky": "error({\"Error\": \"Flaky\", \"Cause\": \"again\"})"});
    let started = std::time::Instant::now();
    let (code, out, err) = run_asl(&def, &json!({"k": 1}), Some(&mock), &["--virtual-time"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        parse(&out),
        json!({"k": 1, "error": {"Error": "Flaky", "Cause": "again"}})
    );
    // 30 s + 60 s of retry intervals passed in virtual time, not on the wall clock.
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

#[test]
fn map_and_parallel_keep_item_and_branch_order() {
    let def = json!({
        "StartAt": "Each",
        "States": {
            "Each": {
                "Type": "Map",
                "ItemsPath": "$.items",
                "MaxConcurrency": 2,
                "ItemSelector": {"value.$": "$$.Map.Item.Value", "index.$": "$$.Map.Item.Index"},
                "ItemProcessor": {
                    "StartAt": "Wait",
                    "States": {
                        "Wait": {"Type": "Wait", "SecondsPath": "$.value", "Next": "Both"},
                        "Both": {
                            "Type": "Parallel",
                            "Branches": [
                                {"StartAt": "A", "States": {"A": {"Type": "Pass", "Parameters": {"a.$": "$.index"}, "End": true}}},
                                {"StartAt": "B", "States": {"B": {"Type": "Pass", "Parameters": {"b.$": "$.value"}, "End": true}}}
                            ],
                            "End": true
                        }
                    }
                },
                "End": true
            }
        }
    });
    let (code, out, err) = run_asl(&def, &json!({"items": [3, 1, 2]}), None, &["--virtual-time"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        parse(&out),
        json!([[{"a": 0}, {"b": 3}], [{"a": 1}, {"b": 1}], [{"a": 2}, {"b": 2}]])
    );
}

#[test]
fn variables_and_jsonata() {
    let def = json!({
        "QueryLanguage": "JSONata",
        "StartAt": "Keep",
        "States": {
            "Keep": {"Type": "Pass", "Assign": {"total": "{% $sum($states.input.prices) %}"}, "Next": "Use"},
            "Use": {"Type": "Pass", "Output": {"total": "{% $total %}", "double": "{% $total * 2 %}"}, "End": true}
        }
    });
    let (code, out, err) = run_asl(&def, &json!({"prices": [1, 2, 3.5]}), None, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse(&out), json!({"total": 6.5, "double": 13}));
}

/// The JSONata expression that would run for hours without a budget.
const RUNAWAY: &str = "{% [1..10000000].[1..10000000] %}";

#[test]
fn a_runaway_jsonata_expression_fails_at_its_step_budget() {
    let def = json!({
        "QueryLanguage": "JSONata",
        "StartAt": "Spin",
        "States": {"Spin": {"Type": "Pass", "Output": {"v": RUNAWAY}, "End": true}}
    });
    let (code, out, err) = run_asl(&def, &json!({}), None, &[]);
    assert_ne!(code, 0, "{out}{err}");
    let failure = parse(&out);
    assert_eq!(failure["Error"], "States.QueryEvaluationError", "{out}");
    let cause = failure["Cause"].as_str().unwrap_or_default();
    assert!(cause.contains("JSONata evaluation budget of 10000000 steps"), "{out}");
    assert!(err.contains("Spin"), "the failed state is named: {err}");
}

#[test]
fn invalid_definitions_report_every_error_with_its_pointer() {
    let def = json!({
        "StartAt": "Nowhere",
        "States": {
            "A": {"Type": "Pass", "Next": "Missing", "End": true},
            "B": {"Type": "Task", "Resource": "r", "InputPath": "not a path", "End": true},
            "C": {"Type": "Pass", "Parameters": {"x.$": "States.Format('a\\\"b')"}, "End": true},
            "D": {"Type": "Wait", "Timestamp": "2016-03-14 01:59:00", "End": true},
            "E": {"Type": "Task", "Resource": "r", "Retry": [{"ErrorEquals": ["States.ALL"]}, {"ErrorEquals": ["X"]}], "End": true},
            "F": {"Type": "Pass", "Bogus": 1, "End": true}
        }
    });
    let dir = tmp();
    let d = write(dir.path(), "bad.asl.json", &def);
    for cmd in ["validate", "run"] {
        let (code, out, err) = sm4c(&[cmd, d.as_str()]);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(out.is_empty(), "{cmd} prints nothing on stdout: {out}");
        for pointer in [
            "/StartAt",
            "/States/A",
            "/States/B/InputPath",
            "/States/C/Parameters",
            "/States/D/Timestamp",
            "/States/E/Retry/0/ErrorEquals",
            "/States/F/Bogus",
        ] {
            assert!(
                err.lines().any(|l| l.starts_with(&format!("{d}: {pointer}"))),
                "{cmd}: no error at {pointer}:\n{err}"
            );
        }
    }
}

#[test]
fn start_execution_runs_a_child_definition_from_the_subflows_folder() {
    let dir = tmp();
    let sub = dir.path().join("flows");
    std::fs::create_dir(&sub).expect("mkdir");
    write(
        &sub,
        "double.asl.json",
        &json!({"StartAt": "P", "States": {"P": {"Type": "Pass", "Parameters": {"n.$": "States.MathAdd($.n, $.n)"}, "End": true}}}),
    );
    write(
        &sub,
        "broken.asl.json",
        &json!({"StartAt": "F", "States": {"F": {"Type": "Fail", "Error": "Child.Broke", "Cause": "on purpose"}}}),
    );
    let def = json!({
        "StartAt": "Double",
        "States": {
            "Double": {
                "Type": "Task",
                "Resource": "arn:aws:states:::states:startExecution.sync:2",
                "Parameters": {"StateMachineArn": "arn:aws:states:us-east-1:111111111111:stateMachine:double", "Input": {"n.$": "$.n"}},
                "ResultSelector": {"n.$": "$.Output.n", "status.$": "$.Status"},
                "Next": "Broken"
            },
            "Broken": {
                "Type": "Task",
                "Resource": "arn:aws:states:::states:startExecution.sync",
                "Parameters": {"StateMachineArn": "arn:aws:states:us-east-1:111111111111:stateMachine:broken", "Input": "{}"},
                "Catch": [{"ErrorEquals": ["States.TaskFailed"], "ResultPath": "$.failure", "Next": "Done"}],
                "End": true
            },
            "Done": {"Type": "Pass", "End": true}
        }
    });
    let d = write(dir.path(), "parent.asl.json", &def);
    let i = write(dir.path(), "input.json", &json!({"n": 21}));
    let (code, out, err) = sm4c(&[
        "run",
        d.as_str(),
        "--input",
        i.as_str(),
        "--subflows",
        sub.to_str().expect("path"),
    ]);
    assert_eq!(code, 0, "{err}");
    let out = parse(&out);
    assert_eq!(out["n"], json!(42));
    assert_eq!(out["status"], json!("SUCCEEDED"));
    assert_eq!(out["failure"]["Error"], json!("States.TaskFailed"));
    let described: Value =
        serde_json::from_str(out["failure"]["Cause"].as_str().expect("cause is JSON text")).expect("json");
    assert_eq!(described["Status"], json!("FAILED"));
    assert_eq!(described["Error"], json!("Child.Broke"));
    assert_eq!(described["Cause"], json!("on purpose"));
}
