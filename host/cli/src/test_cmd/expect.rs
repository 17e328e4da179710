//! Comparing what a test expects with what its instance did: expected values are subsets of the
//! actual ones, and every difference is reported at its JSON pointer.

use super::file::{esc, expected_call};
use serde_json::{Map, Value};

/// Where an expectation and the instance differ.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// JSON pointer of the field, from the expectation (`/data/order/total`, `/states/2`).
    pub path: String,
    /// The expected value.
    pub expected: Value,
    /// The actual value; `None` when the instance has no such field.
    pub actual: Option<Value>,
}

/// What a test's instance did, as the expectations read it.
#[derive(Clone, Debug, Default)]
pub struct Actual {
    /// Its status (`completed`, `failed`, `waiting`, ...).
    pub status: String,
    /// The states it entered, in order.
    pub states: Vec<Value>,
    /// Its final data (ASL: its output).
    pub data: Value,
    /// The events it sent, in order.
    pub sent: Vec<Value>,
    /// Its error (ASL: `{"Error", "Cause"}`), if it has one.
    pub error: Option<Value>,
    /// The calls it made, in order: `{"function", "arguments"}` (ASL: and `state`).
    pub calls: Vec<Value>,
}

/// ASL's name of a status (`SUCCEEDED`, ...), for tests that expect those.
fn asl_status(status: &str) -> &str {
    match status {
        "completed" => "SUCCEEDED",
        "failed" => "FAILED",
        "timedOut" => "TIMED_OUT",
        "cancelled" => "ABORTED",
        "waiting" | "running" | "created" | "paused" => "RUNNING",
        other => other,
    }
}

/// Every difference between `expect` and `actual`, in the order of [`super::file::EXPECT_KEYS`].
pub fn check(expect: &Map<String, Value>, actual: &Actual) -> Vec<Failure> {
    let mut out = Vec::new();
    if let Some(Value::String(want)) = expect.get("status") {
        let is_upper = want.chars().all(|c| c.is_ascii_uppercase() || c == '_');
        let got = if is_upper {
            asl_status(&actual.status)
        } else {
            actual.status.as_str()
        };
        if got != want {
            out.push(Failure {
                path: "/status".into(),
                expected: Value::String(want.clone()),
                actual: Some(Value::String(got.into())),
            });
        }
    }
    if let Some(want) = expect.get("states") {
        subset("/states", want, Some(&Value::Array(actual.states.clone())), &mut out);
    }
    if let Some(want) = expect.get("data") {
        subset("/data", want, Some(&actual.data), &mut out);
    }
    if let Some(want) = expect.get("sent") {
        subset("/sent", want, Some(&Value::Array(actual.sent.clone())), &mut out);
    }
    if let Some(want) = expect.get("error") {
        subset("/error", want, actual.error.as_ref(), &mut out);
    }
    if let Some(Value::Array(want)) = expect.get("calls") {
        let want = Value::Array(want.iter().map(expected_call).collect());
        subset("/calls", &want, Some(&Value::Array(actual.calls.clone())), &mut out);
    }
    out
}

/// True when two JSON scalars are the same value (numbers by value: `1` is `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        _ => a == b,
    }
}

/// Checks that `expected` is a subset of `actual` at `path`: every key of an expected object is in
/// the actual one with a matching value; arrays have the same length and match element by element;
/// anything else is equal. Pushes one failure per difference.
pub fn subset(path: &str, expected: &Value, actual: Option<&Value>, out: &mut Vec<Failure>) {
    let fail = |out: &mut Vec<Failure>| {
        out.push(Failure {
            path: path.to_string(),
            expected: expected.clone(),
            actual: actual.cloned(),
        })
    };
    let Some(actual) = actual else {
        return fail(out);
    };
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, v) in e {
                subset(&format!("{path}/{}", esc(k)), v, a.get(k), out);
            }
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => {
            for (i, (x, y)) in e.iter().zip(a).enumerate() {
                subset(&format!("{path}/{i}"), x, Some(y), out);
            }
        }
        (Value::Object(_) | Value::Array(_), _) => fail(out),
        (e, a) if same(e, a) => {}
        _ => fail(out),
    }
}

/// Longest one-line rendering shown side by side; longer values get a line diff.
const SIDE_BY_SIDE: usize = 60;

/// A failure as the terminal shows it: the pointer and both values on one line, or, for long
/// values, a line diff of their pretty forms (`-` expected, `+` actual).
pub fn render(f: &Failure) -> String {
    let exp = f.expected.to_string();
    let act = f.actual.as_ref().map_or("(missing)".to_string(), Value::to_string);
    if exp.chars().count() <= SIDE_BY_SIDE && act.chars().count() <= SIDE_BY_SIDE {
        return format!("{}: expected {exp}, actual {act}", f.path);
    }
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
    let e = pretty(&f.expected);
    let a = f.actual.as_ref().map_or("(missing)\n".to_string(), pretty);
    let mut out = format!("{}: expected and actual differ (- expected, + actual):", f.path);
    for change in similar::TextDiff::from_lines(&e, &a).iter_all_changes() {
        let sign = match change.tag() {
            similar::ChangeTag::Delete => '-',
            similar::ChangeTag::Insert => '+',
            similar::ChangeTag::Equal => ' ',
        };
        out.push_str(&format!("\n  {sign} {}", change.value().trim_end_matches('\n')));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn diffs(e: Value, a: Value) -> Vec<(String, Value, Option<Value>)> {
        let mut out = Vec::new();
        subset("", &e, Some(&a), &mut out);
        out.into_iter().map(|f| (f.path, f.expected, f.actual)).collect()
    }

    #[test]
    fn an_object_subset_ignores_other_keys() {
        assert!(diffs(json!({"a": 1}), json!({"a": 1, "b": 2})).is_empty());
        assert!(diffs(json!({"a": {"b": 1}}), json!({"a": {"b": 1.0, "c": 2}})).is_empty());
    }

    #[test]
    fn each_difference_is_reported_at_its_pointer() {
        assert_eq!(
            diffs(
                json!({"a": {"b": 1, "c/d": "x"}, "e": true}),
                json!({"a": {"b": 2, "c/d": "x"}})
            ),
            vec![
                ("/a/b".into(), json!(1), Some(json!(2))),
                ("/e".into(), json!(true), None)
            ]
        );
        assert_eq!(
            diffs(json!({"a/b": 1, "m~n": 2}), json!({"a/b": 0, "m~n": 0}))
                .into_iter()
                .map(|d| d.0)
                .collect::<Vec<_>>(),
            vec!["/a~1b", "/m~0n"]
        );
    }

    #[test]
    fn arrays_match_element_by_element_with_the_same_length() {
        assert!(diffs(json!([{"a": 1}, 2]), json!([{"a": 1, "b": 0}, 2])).is_empty());
        assert_eq!(
            diffs(json!([1, 2]), json!([1, 3])),
            vec![("/1".into(), json!(2), Some(json!(3)))]
        );
        assert_eq!(
            diffs(json!([1]), json!([1, 2])),
            vec![("".into(), json!([1]), Some(json!([1, 2])))]
        );
    }

    #[test]
    fn types_must_agree() {
        assert_eq!(diffs(json!({"a": "1"}), json!({"a": 1})).len(), 1);
        assert_eq!(diffs(json!({"a": {}}), json!({"a": []})).len(), 1);
        assert_eq!(diffs(json!(null), json!(false)).len(), 1);
        assert!(diffs(json!(2.5), json!(2.5)).is_empty());
    }

    #[test]
    fn short_values_are_side_by_side_and_long_ones_a_diff() {
        let short = Failure {
            path: "/data/x".into(),
            expected: json!(1),
            actual: None,
        };
        assert_eq!(render(&short), "/data/x: expected 1, actual (missing)");
        let long = Failure {
            path: "/data".into(),
            expected: json!({"name": "a very long name that goes on", "items": [1, 2, 3], "total": 6}),
            actual: Some(json!({"name": "a very long name that goes on", "items": [1, 2, 4], "total": 7})),
        };
        let text = render(&long);
        assert!(text.starts_with("/data: expected and actual differ"), "{text}");
        assert!(text.contains("\n  -   \"total\": 6\n  +   \"total\": 7"), "{text}");
        assert!(text.contains("\n  -     3\n  +     4"), "{text}");
        assert!(text.contains("\n      \"name\""), "{text}");
    }

    #[test]
    fn asl_status_names_are_accepted() {
        let actual = Actual {
            status: "completed".into(),
            ..Actual::default()
        };
        let e = |s: &str| json!({"status": s}).as_object().unwrap().clone();
        assert!(check(&e("SUCCEEDED"), &actual).is_empty());
        assert!(check(&e("completed"), &actual).is_empty());
        assert_eq!(check(&e("FAILED"), &actual)[0].actual, Some(json!("SUCCEEDED")));
    }
}
