//! Payload templates (`Parameters`, `ResultSelector`, `ItemSelector`, JSONPath `Assign`): a JSON
//! value whose object keys ending in `.$` take a Path or an intrinsic function.
//!
//! Every other value is literal, however it looks (`"result": "$result"` stays the string
//! `$result`). The `.$` is removed from the key in the output. A Path that matches nothing is
//! `States.Runtime` (AWS's choice, where the spec names `States.ParameterPathFailure`).

use super::intrinsics::{is_intrinsic, Call};
use super::path::Path;
use super::{AslError, Env};
use serde_json::{Map, Value};

/// How deep a template may nest.
const MAX_DEPTH: usize = 256;

/// A part of a template.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    /// A value without any `.$` key inside.
    Literal(Value),
    Object(Vec<(String, Node)>),
    Array(Vec<Node>),
    /// `"key.$": "$..."`: the field name without `.$`, and the path.
    Path(String, Path),
    /// `"key.$": "States...(...)"`.
    Call(Call),
}

/// A parsed payload template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    root: Node,
}

/// Escapes a key for a JSON pointer.
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// True when there is a `.$` key anywhere in `v`.
fn has_dollar_key(v: &Value, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return true;
    }
    match v {
        Value::Object(m) => m.iter().any(|(k, x)| k.ends_with(".$") || has_dollar_key(x, depth + 1)),
        Value::Array(a) => a.iter().any(|x| has_dollar_key(x, depth + 1)),
        _ => false,
    }
}

fn parse_node(v: &Value, at: &str, depth: usize, errors: &mut Vec<(String, String)>) -> Node {
    if depth > MAX_DEPTH {
        errors.push((
            at.to_string(),
            format!("the template nests deeper than {MAX_DEPTH} levels"),
        ));
        return Node::Literal(Value::Null);
    }
    if !has_dollar_key(v, depth) {
        return Node::Literal(v.clone());
    }
    match v {
        Value::Object(m) => {
            let mut fields: Vec<(String, Node)> = Vec::with_capacity(m.len());
            for (k, x) in m {
                let here = format!("{at}/{}", pointer_token(k));
                let (name, node) = match k.strip_suffix(".$") {
                    None => (k.clone(), parse_node(x, &here, depth + 1, errors)),
                    Some(name) => match dynamic(name, x) {
                        Ok(node) => (name.to_string(), node),
                        Err(e) => {
                            errors.push((here, e));
                            continue;
                        }
                    },
                };
                if fields.iter().any(|(f, _)| *f == name) || (k.ends_with(".$") && m.contains_key(&name)) {
                    errors.push((
                        here,
                        format!("the field '{name}' appears twice once '.$' is removed from the names"),
                    ));
                    continue;
                }
                fields.push((name, node));
            }
            Node::Object(fields)
        }
        Value::Array(a) => Node::Array(
            a.iter()
                .enumerate()
                .map(|(i, x)| parse_node(x, &format!("{at}/{i}"), depth + 1, errors))
                .collect(),
        ),
        _ => Node::Literal(v.clone()),
    }
}

/// The value of a `name.$` field: a Path or an intrinsic function.
fn dynamic(name: &str, x: &Value) -> Result<Node, String> {
    let Value::String(s) = x else {
        return Err(format!(
            "the value of '{name}.$' must be a string holding a Path or an intrinsic function"
        ));
    };
    if s.starts_with('$') {
        Path::parse(s).map(|p| Node::Path(format!("{name}.$"), p))
    } else if is_intrinsic(s) {
        Call::parse(s).map(Node::Call)
    } else {
        Err(format!(
            "the value of '{name}.$' must be a Path (starting with '$') or an intrinsic function, not '{s}'"
        ))
    }
}

fn eval_node(n: &Node, env: &Env) -> Result<Value, AslError> {
    match n {
        Node::Literal(v) => Ok(v.clone()),
        Node::Object(fields) => {
            let mut m = Map::new();
            for (k, x) in fields {
                m.insert(k.clone(), eval_node(x, env)?);
            }
            Ok(Value::Object(m))
        }
        Node::Array(items) => items
            .iter()
            .map(|x| eval_node(x, env))
            .collect::<Result<_, _>>()
            .map(Value::Array),
        Node::Path(field, p) => p.read(env).map_err(|e| {
            let input = serde_json::to_string(env.input).unwrap_or_default();
            let why = e.cause.unwrap_or_default();
            AslError::runtime(format!(
                "The JSONPath '{}' specified for the field '{field}' could not be found in the input '{input}' ({why})",
                p.text()
            ))
        }),
        Node::Call(c) => c.eval(env),
    }
}

impl Template {
    /// Parses a template. Errors are `(pointer relative to the template, message)`.
    pub fn parse(v: &Value) -> Result<Template, Vec<(String, String)>> {
        let mut errors = Vec::new();
        let root = parse_node(v, "", 0, &mut errors);
        if errors.is_empty() {
            Ok(Template { root })
        } else {
            Err(errors)
        }
    }

    /// Evaluates the template.
    pub fn eval(&self, env: &Env) -> Result<Value, AslError> {
        eval_node(&self.root, env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Random;
    use serde_json::json;
    use std::cell::Cell;

    fn eval_full(t: Value, input: &Value, context: &Value, vars: &Map<String, Value>) -> Result<Value, AslError> {
        let rng = Cell::new(Random::new(3));
        let env = Env {
            input,
            context,
            vars,
            rng: &rng,
        };
        Template::parse(&t).unwrap_or_else(|e| panic!("{e:?}")).eval(&env)
    }

    fn eval(t: Value, input: Value) -> Result<Value, AslError> {
        eval_full(t, &input, &json!({}), &Map::new())
    }

    fn ok(t: Value, input: Value) -> Value {
        eval(t, input).unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn errors(t: Value) -> Vec<(String, String)> {
        Template::parse(&t).expect_err("the template should not parse")
    }

    #[test]
    fn spec_example() {
        let t = json!({
            "flagged": true,
            "parts": {"first.$": "$.vals[0]", "last3.$": "$.vals[3:]"},
            "weekday.$": "$$.DayOfWeek",
            "formattedOutput.$": "States.Format('Today is {}', $$.DayOfWeek)"
        });
        let got = eval_full(
            t,
            &json!({"flagged": 7, "vals": [0, 10, 20, 30, 40, 50]}),
            &json!({"DayOfWeek": "TUESDAY"}),
            &Map::new(),
        )
        .unwrap();
        assert_eq!(
            got,
            json!({
                "flagged": true,
                "parts": {"first": 0, "last3": [30, 40, 50]},
                "weekday": "TUESDAY",
                "formattedOutput": "Today is TUESDAY"
            })
        );
    }

    #[test]
    fn literals_stay_literal() {
        assert_eq!(
            ok(json!({"first": 88, "second": 99}), json!({})),
            json!({"first": 88, "second": 99})
        );
        // variables/reference-in-parameters: "result": "$result" is a plain string.
        assert_eq!(
            ok(json!({"result": "$result"}), json!({})),
            json!({"result": "$result"})
        );
        // pass/escape-sequences-in-literals (Parameters half)
        let t = json!({
            "literal_single_quote": "'",
            "literal_double_quote": "\"",
            "mixed_quotes": "Text with both \"double\" and 'single' quotes.",
            "escaped_double_in_string": "An escaped quote: \\\"hello\\\"",
            "escaped_backslash": "Backslash \\\\ in string",
            "unicode_double_quote": "\"unicode-quote\"",
            "whitespace_escapes": "Line1\nLine2\tTabbed",
            "emoji": "🆗"
        });
        assert_eq!(ok(t.clone(), json!({"Test\\\"\"Name\"": "Value\"\\"})), t);
        assert_eq!(ok(json!([1, {"a": "$.x"}]), json!({})), json!([1, {"a": "$.x"}]));
        assert_eq!(ok(json!("text"), json!({})), json!("text"));
    }

    #[test]
    fn paths_in_templates() {
        // io/input-and-output-path-null, io/input-path-null-gives-empty-object
        assert_eq!(
            ok(
                json!({"Arg1": "argument1", "FromInput.$": "$"}),
                json!({"InputValue": 0})
            ),
            json!({"Arg1": "argument1", "FromInput": {"InputValue": 0}})
        );
        assert_eq!(
            ok(json!({"Arg2": "argument2", "FromInput.$": "$"}), json!({})),
            json!({"Arg2": "argument2", "FromInput": {}})
        );
        let items = json!({"items": (0..11).map(|i| json!({"item_key": i})).collect::<Vec<_>>()});
        // io/jsonpath-array-index-first, io/jsonpath-array-index-eleventh
        assert_eq!(
            ok(json!({"item.$": "$.items[0]"}), items.clone()),
            json!({"item": {"item_key": 0}})
        );
        assert_eq!(
            ok(json!({"item.$": "$.items[10]"}), items),
            json!({"item": {"item_key": 10}})
        );
        // io/jsonpath-bracket-key-with-escapes
        assert_eq!(
            ok(
                json!({"value.$": "$['Test\\\"\"Name\"']"}),
                json!({"Test\\\"\"Name\"": "Value\"\\"})
            ),
            json!({"value": "Value\"\\"})
        );
        // io/jsonpath-filter-expression
        assert_eq!(
            ok(
                json!({"FromInput.$": "$.users[?(@.status == 0)]"}),
                json!({"users": [{"year": 1997, "status": 0}, {"year": 1998, "status": 1}]})
            ),
            json!({"FromInput": [{"year": 1997, "status": 0}]})
        );
        // io/jsonpath-*-gives-empty-list
        for p in ["$[*]", "$.items[*]", "$.item.items[1:5].itemValue"] {
            assert_eq!(ok(json!({"item.$": p}), json!({})), json!({"item": []}), "{p}");
        }
        // spec-mock-keyed-by-state-name
        assert_eq!(ok(json!({"v.$": "$.v"}), json!({"v": 5})), json!({"v": 5}));
        // Nested objects and arrays.
        assert_eq!(
            ok(
                json!({"a": [{"b.$": "$.x"}, 2], "c": {"d": {"e.$": "$.y"}}}),
                json!({"x": 1, "y": [2]})
            ),
            json!({"a": [{"b": 1}, 2], "c": {"d": {"e": [2]}}})
        );
    }

    #[test]
    fn missing_path_is_states_runtime() {
        // io/parameters-path-missing-is-states-runtime, ...-context-path-missing-...
        let e = eval(json!({"value.$": "$.no_such_jsonpath"}), json!({"int-literal": 0})).unwrap_err();
        assert_eq!(e.error.as_deref(), Some("States.Runtime"));
        assert!(e.cause.unwrap().contains("'value.$'"));
        let e = eval_full(
            json!({"value.$": "$$.Execution.Input.no_such_jsonpath"}),
            &json!({}),
            &json!({"Execution": {"Input": {}}}),
            &Map::new(),
        )
        .unwrap_err();
        assert_eq!(e.error.as_deref(), Some("States.Runtime"));
    }

    #[test]
    fn context_object() {
        // context/object-fields (the parts a template decides)
        let ctx = json!({
            "Execution": {"Id": "id", "Input": {"message": "TestMessage"}, "Name": "n", "StartTime": "2024-01-01T00:00:00.000Z"},
            "State": {"Name": "QueryValues1", "EnteredTime": "2024-01-01T00:00:00.000Z"},
            "StateMachine": {"Id": "sm", "Name": "smn"}
        });
        let t = json!({
            "context_object.$": "$$",
            "execution.$": "$$.Execution",
            "execution_input.$": "$$.Execution.Input",
            "state_name.$": "$$.State.Name",
            "statemachine_name.$": "$$.StateMachine.Name"
        });
        let got = eval_full(t, &json!({"message": "TestMessage"}), &ctx, &Map::new()).unwrap();
        assert_eq!(
            got,
            json!({
                "context_object": ctx.clone(),
                "execution": ctx["Execution"].clone(),
                "execution_input": {"message": "TestMessage"},
                "state_name": "QueryValues1",
                "statemachine_name": "smn"
            })
        );
        // map/item-selector-with-context-item
        let ctx = json!({"Map": {"Item": {"Index": 2, "Value": "v"}}});
        assert_eq!(
            eval_full(
                json!({"i.$": "$$.Map.Item.Index", "v.$": "$$.Map.Item.Value"}),
                &json!({}),
                &ctx,
                &Map::new()
            )
            .unwrap(),
            json!({"i": 2, "v": "v"})
        );
    }

    #[test]
    fn variables() {
        let mut vars = Map::new();
        vars.insert("result".into(), json!("foobar"));
        vars.insert("constant_obj".into(), json!({"in_obj_constant_lst": [null, "$$"]}));
        vars.insert("Question".into(), json!("Who's that Pokemon?"));
        // variables/reference-in-parameters, assigned-literals-are-not-evaluated
        assert_eq!(
            eval_full(json!({"result.$": "$result"}), &json!({}), &json!({}), &vars).unwrap(),
            json!({"result": "foobar"})
        );
        assert_eq!(
            eval_full(
                json!({"x.$": "$constant_obj.in_obj_constant_lst"}),
                &json!({}),
                &json!({}),
                &vars
            )
            .unwrap(),
            json!({"x": [null, "$$"]})
        );
        // variables/map-items-path-from-variable
        assert_eq!(
            eval_full(
                json!({"Question.$": "$Question", "Answer.$": "$.AnnouncePokemon"}),
                &json!({"AnnouncePokemon": "It's Pikachu!"}),
                &json!({}),
                &vars
            )
            .unwrap(),
            json!({"Question": "Who's that Pokemon?", "Answer": "It's Pikachu!"})
        );
        let e = eval_full(json!({"x.$": "$nope"}), &json!({}), &json!({}), &vars).unwrap_err();
        assert_eq!(e.error.as_deref(), Some("States.Runtime"));
    }

    #[test]
    fn intrinsics_in_templates() {
        // intrinsics/nested-calls
        assert_eq!(
            ok(
                json!({
                    "last.$": "States.ArrayGetItem(States.StringSplit($.name, '-'), States.MathAdd(States.ArrayLength(States.StringSplit($.name, '-')), -1))",
                    "first.$": "States.ArrayGetItem(States.StringSplit($.name, '-'), 0)"
                }),
                json!({"name": "alpha-beta-gamma"})
            ),
            json!({"last": "gamma", "first": "alpha"})
        );
        // intrinsics/several-functions-over-input-paths
        assert_eq!(
            ok(
                json!({
                    "greeting.$": "States.Format('Hello {}, welcome to {}!', $.name, $.place)",
                    "n.$": "States.MathAdd($.a, $.b)",
                    "s.$": "States.JsonToString($.obj)",
                    "h.$": "States.Hash($.text, 'SHA-256')"
                }),
                json!({"name": "John", "place": "LocalStack", "a": 5, "b": 3, "obj": {"test": "object"}, "text": "Hash this string"})
            ),
            json!({
                "greeting": "Hello John, welcome to LocalStack!",
                "n": 8,
                "s": "{\"test\":\"object\"}",
                "h": "1cac63f39fd68d8c531f27b807610fb3d50f0fc3f186995767fb6316e7200a3e"
            })
        );
        // variables/map-items-path-from-variable (ItemSelector)
        assert_eq!(
            eval_full(
                json!({"AnnouncePokemon.$": "States.Format($.AnswerTemplate, $$.Map.Item.Value)"}),
                &json!({"AnswerTemplate": "It's {}!"}),
                &json!({"Map": {"Item": {"Value": "Charizard"}}}),
                &Map::new()
            )
            .unwrap(),
            json!({"AnnouncePokemon": "It's Charizard!"})
        );
        let e = eval(json!({"x.$": "States.ArrayGetItem($.a, 5)"}), json!({"a": []})).unwrap_err();
        assert_eq!(e.error.as_deref(), Some("States.IntrinsicFailure"));
    }

    #[test]
    fn parse_errors_carry_pointers() {
        // validation/intrinsic-with-backslash-quote-escapes
        let errs = errors(json!({
            "parsed.$": "States.Format('He said, \\\"Hello, {}!\\\"', 'Test \\\"Name\\\" Here')"
        }));
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].0, "/parsed.$");
        let errs = errors(json!({
            "ok.$": "$.a",
            "a": {"b/c": [{"bad.$": "$.["}]},
            "num.$": 5,
            "plain.$": "ConditionTrue",
            "unknown.$": "States.Nope()"
        }));
        let pointers: Vec<&str> = errs.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(pointers, vec!["/a/b~1c/0/bad.$", "/num.$", "/plain.$", "/unknown.$"]);
        // Duplicates once '.$' is removed.
        let errs = errors(json!({"a": 1, "a.$": "$.x"}));
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].0, "/a.$");
        let errs = errors(json!({"a.$": "$.x", "a": 1}));
        assert_eq!(errs.len(), 1);
        // Too deep.
        let mut deep = json!({"x.$": "$"});
        for _ in 0..300 {
            deep = json!({ "k": deep });
        }
        assert!(Template::parse(&deep).is_err());
    }
}
