//! jq expressions: compiled once through jaq, run in a sandbox with a bounded amount of work.
//!
//! # Sandbox
//! The function set is built from an allow-list, [`ALLOWED`]: the jaq natives and standard
//! definitions on it, and nothing else, so a jaq upgrade that adds a function does not widen what a
//! definition reaches until the function is reviewed and added (a test pins the list). Nothing on it
//! reaches outside the instance: no `env`/`$ENV`, `input`/`inputs`, `halt`/`halt_error`, `now`,
//! `localtime`, `mktime`, module imports or file reads. `debug` and `stderr` are accepted and pass their
//! input through without printing. Expressions that call anything else are rejected when the
//! definition is loaded.
//!
//! # Bounded evaluation
//! Every evaluation gets a budget of *fuel* ([`Limits::fuel`], default one million). Each call of a
//! jq definition (`map`, `select`, `until`, `range`, a user's own `def`) burns one unit, and that is
//! the only way jq can loop, because every recursive or iterating standard filter is a definition here
//! (`range/3` is redefined recursively for this reason). Each value of `l, r`, of `..` and of an
//! iteration (`.[]`) burns one unit too: without loops, their products (`$a[] + $a[] + $a[]`) yield a
//! number of values exponential in the length of the expression. When the fuel runs out the evaluation stops
//! with an error that `try` cannot catch. `contains` and `indices`, whose comparisons grow with the
//! product of their operands' sizes, burn one unit for every 64 they make (`metered`). Fuel is
//! deterministic: the same expression on the same input stops at the same point on every machine
//! and in every replay, unlike a wall-clock limit.
//!
//! # Parts
//! This file holds the public [`Expr`], its errors and the evaluation's [`Env`]; the rest is cut
//! the way jaq cuts its own crates:
//! - `sandbox`: the allow-list, the refused names, our definitions (`sandbox.jq`) and which of
//!   jaq's natives and definitions an expression reaches;
//! - `fuel`: burning fuel, the halts, and the rewrite that ticks every call and every value;
//! - `size`: what values count for against the limits, checked as they are built;
//! - `natives` (with `metered`): the natives we add;
//! - `sugar`: the `${ }` wrapper and `fn:` calls of expression functions;
//! - `diagnostics`: compile errors as an author reads them.

mod diagnostics;
mod fuel;
mod metered;
mod natives;
mod sandbox;
mod size;
mod sugar;

use diagnostics::{describe_load_errors, describe_undefined};
use fuel::{fuel_def, fuel_term, stack_address};
pub(crate) use natives::with_schedule;
pub use sandbox::ALLOWED;
use sandbox::{calls, prelude, reachable, refuse_reserved};
pub use size::MAX_JSON_DEPTH;
use size::{size_and_depth, BoundedText};
use sugar::{fn_order, rewrite_fn_calls};
pub use sugar::{is_expression, strip, ExprFunction};

use crate::json::{from_val, to_val};
use jaq_core::load::parse::Def;
use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Ctx, DataT, Exn, Vars};
use jaq_json::Val;
use serde_json::Value;
use std::cell::Cell;
use std::sync::Arc;

/// Limits applied to every evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Steps one evaluation may take before it is stopped: definition calls, and values of `l, r`,
    /// `..` and iterations (`.[]`).
    pub fuel: u64,
    /// Stack one evaluation may use for nested definition calls, in bytes.
    pub stack_bytes: usize,
    /// Longest string an evaluation may build, in bytes.
    pub max_string: usize,
    /// Most elements of an array, or entries of an object, an evaluation may build.
    pub max_items: usize,
    /// Bytes one evaluation may build in all (see the module documentation for how they count).
    pub memory: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel: 1_000_000,
            stack_bytes: 512 * 1024,
            max_string: 10 << 20,
            max_items: 1 << 20,
            memory: 64 << 20,
        }
    }
}

/// The jaq data kind: values are [`Val`], and natives can reach the evaluation's fuel.
pub struct Data;

impl DataT for Data {
    type V<'a> = Val;
    type Data<'a> = Env<'a>;
}

/// What natives see of an evaluation.
#[derive(Clone)]
pub struct Env<'a> {
    lut: &'a jaq_core::Lut<Data>,
    fuel: &'a Cell<u64>,
    /// The first limit that stopped the evaluation. jaq drops the halt of a value paired with
    /// nothing (`l - r`, `l == r`, `{(k): v}`, `"\(a)\(b)"` and `.[i][j]`, where `r`, `v`, `b` or `j`
    /// yields no value), and would go on evaluating; the halt is remembered here, `__gate` raises it
    /// again before each such `r` runs, and the evaluation ends with it however it ends.
    halted: &'a Cell<Option<i32>>,
    /// Bytes the evaluation may still build, and the limits.
    memory: &'a Cell<u64>,
    limits: &'a Limits,
    /// Stack address where the evaluation began, and how far below it definitions may nest.
    base: usize,
    stack_bytes: usize,
}

impl<'a> jaq_core::data::HasLut<'a, Data> for Env<'a> {
    fn lut(&self) -> &'a jaq_core::Lut<Data> {
        self.lut
    }
}

/// Halt codes used internally to stop an evaluation; `try` cannot catch a halt.
const OUT_OF_FUEL: i32 = -7_777;
const OUT_OF_STACK: i32 = -7_778;
const STRING_TOO_LONG: i32 = -7_779;
const TOO_MANY_ITEMS: i32 = -7_780;
const OUT_OF_MEMORY: i32 = -7_781;

/// A compiled jq expression.
#[derive(Clone)]
pub struct Expr(Arc<Compiled>);

struct Compiled {
    source: String,
    /// The same expression for the direct evaluator, when its shape allows.
    fast: Option<crate::fast::Fast>,
    filter: jaq_core::Filter<Data>,
    limits: Limits,
}

impl std::fmt::Debug for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Expr({:?})", self.0.source)
    }
}

/// Why an evaluation failed. The message always quotes the expression.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct EvalError {
    /// Human-readable description, quoting the expression.
    pub message: String,
    /// The value given to jq's `error(...)`, when the expression raised one itself.
    pub value: Option<Value>,
    /// True when a limit stopped the evaluation (fuel, stack, or the size of what it builds): an
    /// error `try` could not catch.
    pub out_of_fuel: bool,
    /// The expression as written.
    pub expression: String,
}

impl Expr {
    /// Compiles an expression (with or without `${ }`), resolving `fn:name` against `functions`.
    pub fn compile(text: &str, functions: &[ExprFunction], limits: Limits) -> Result<Expr, String> {
        Self::compile_with(text, functions, limits, false)
    }

    /// [`Expr::compile`], given the whole prelude instead of what the expression reaches when
    /// `whole_prelude` (for the test that shows both compile to the same).
    fn compile_with(
        text: &str,
        functions: &[ExprFunction],
        limits: Limits,
        whole_prelude: bool,
    ) -> Result<Expr, String> {
        let code = strip(text);
        let (code, used) = rewrite_fn_calls(code, functions)?;
        let order = fn_order(&used, functions)?;
        let fn_bodies: Vec<(usize, String)> = order
            .iter()
            .map(|&i| {
                rewrite_fn_calls(strip(&functions[i].body), functions)
                    .map(|(body, _)| (i, body))
                    .map_err(|e| format!("in expression function {:?}: {e}", functions[i].name))
            })
            .collect::<Result<_, _>>()?;
        let names: Vec<String> = order.iter().map(|i| format!("__fn_{i}")).collect();

        // First load the code as written, for faithful parse errors. They concern the code alone (the
        // prelude is parsed already), so it is loaded without the prelude.
        let arena = Arena::default();
        let loader = Loader::new(std::iter::empty());
        if let Err(errs) = loader.load(&arena, File { code: &code, path: () }) {
            return Err(describe_load_errors(&code, errs));
        }
        let mut extra: Vec<Def<&str>> = Vec::new();
        for ((_, body), name) in fn_bodies.iter().zip(&names) {
            let term = jaq_core::load::parse(body, |p| p.term())
                .ok_or_else(|| format!("expression function body {body:?} does not parse"))?;
            refuse_reserved(&term)?;
            extra.push(fuel_def(Def {
                name: name.as_str(),
                args: Vec::new(),
                body: term,
            }));
        }
        let main =
            jaq_core::load::parse(&code, |p| p.term()).ok_or_else(|| format!("{code:?} is not a single jq filter"))?;
        refuse_reserved(&main)?;
        // Code that defines nothing cannot recurse by itself: compile it as written (cheaper to run).
        // Code with its own `def`s is wrapped so that those definitions burn fuel too.
        let rewritten = fuel_term(main.clone());
        let direct = !code.contains("def") && format!("{rewritten:?}") == format!("{main:?}");
        let fast = if code.contains("def") {
            None
        } else {
            crate::fast::compile(&main)
        };
        let main_code = if direct {
            code.as_str()
        } else {
            extra.push(Def {
                name: "__main",
                args: vec!["$value"],
                body: rewritten,
            });
            "__main($value)"
        };
        let mut names = Vec::new();
        calls(&main, &mut names);
        extra.iter().for_each(|d| calls(&d.body, &mut names));
        let defs: Vec<usize> = if whole_prelude {
            (0..prelude().len()).collect()
        } else {
            reachable(names)
        };
        let loader = Loader::new(defs.into_iter().map(|i| prelude()[i].clone()).chain(extra));
        let modules = loader
            .load(
                &arena,
                File {
                    code: main_code,
                    path: (),
                },
            )
            .map_err(|errs| describe_load_errors(&code, errs))?;
        let filter = jaq_core::Compiler::default()
            .with_funs(natives::natives())
            .with_global_vars(["$value"])
            .compile(modules)
            .map_err(|errs| {
                let mut msgs = Vec::new();
                for (_, undefined) in errs {
                    for (name, kind) in undefined {
                        msgs.push(describe_undefined(name, &kind));
                    }
                }
                msgs.dedup();
                msgs.join("; ")
            })?;
        Ok(Expr(Arc::new(Compiled {
            source: text.trim().to_string(),
            fast,
            filter,
            limits,
        })))
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.0.source
    }

    /// Runs the expression and returns every output, up to `max` of them.
    fn outputs(&self, input: Val, value: Val, max: usize) -> Result<Vec<Val>, EvalError> {
        let fuel = Cell::new(self.0.limits.fuel);
        let memory = Cell::new(self.0.limits.memory);
        let halted = Cell::new(None);
        let env = Env {
            lut: &self.0.filter.lut,
            fuel: &fuel,
            halted: &halted,
            memory: &memory,
            limits: &self.0.limits,
            base: stack_address(),
            stack_bytes: self.0.limits.stack_bytes,
        };
        let ctx = Ctx::<Data>::new(env, Vars::new([value]));
        let mut out = Vec::new();
        let mut failed = None;
        for item in self.0.filter.id.run((ctx, input)) {
            match item {
                Ok(v) => out.push(self.bounded(v)?),
                Err(exn) => {
                    failed = Some(exn);
                    break;
                }
            }
            if out.len() >= max || halted.get().is_some() {
                break;
            }
        }
        // A limit whose halt jaq dropped on the way (see `Env::halted`) still ends the evaluation:
        // what it yielded after that is incomplete.
        if let Some(code) = halted.get() {
            return Err(self.halt_error(code));
        }
        match failed {
            Some(exn) => Err(self.exn_error(exn)),
            None => Ok(out),
        }
    }

    /// A value the expression yields, if it stays within [`Limits::memory`] written out (see
    /// [`expanded_size`]) and within [`crate::json::MAX_DEPTH`] levels of nesting; else the error of
    /// an evaluation that would build too much.
    fn bounded(&self, v: Val) -> Result<Val, EvalError> {
        self.check_bounds(&v)?;
        Ok(v)
    }

    /// [`Expr::bounded`] without taking the value.
    fn check_bounds(&self, v: &Val) -> Result<(), EvalError> {
        if !matches!(v, Val::Arr(_) | Val::Obj(_)) {
            return Ok(());
        }
        match size_and_depth(v, self.0.limits.memory, crate::json::MAX_DEPTH) {
            None => Err(self.too_large()),
            Some(true) => Err(self.stopped(format!(
                "expression result is nested deeper than {} levels, the most sm4c keeps (in {})",
                crate::json::MAX_DEPTH,
                self.0.source
            ))),
            Some(false) => Ok(()),
        }
    }

    fn too_large(&self) -> EvalError {
        self.stopped(format!(
            "expression stopped: it would build more than {} bytes in one evaluation (in {}); see the expression limits in the README",
            self.0.limits.memory, self.0.source
        ))
    }

    /// An evaluation stopped by a limit: `try` cannot catch it, like running out of fuel.
    fn stopped(&self, message: String) -> EvalError {
        EvalError {
            message,
            value: None,
            out_of_fuel: true,
            expression: self.0.source.clone(),
        }
    }

    fn exn_error<'a>(&self, exn: Exn<'a, Val>) -> EvalError {
        match exn.get_err() {
            Ok(err) => {
                // jaq writes the values an error names into its message (`cannot index {..} with
                // ..`); a value that shares its parts can stand for more text than the host has
                // memory, and writing it took minutes. Write it with a bound first.
                let mut text = BoundedText(self.0.limits.max_string);
                if std::fmt::write(&mut text, format_args!("{err}")).is_err() {
                    return self.stopped(format!(
                        "expression stopped: its error message would be longer than {} bytes (in {}); see the expression limits in the README",
                        self.0.limits.max_string, self.0.source
                    ));
                }
                // The message is the error's own text, so handlers can match `error("x")` as "x";
                // the expression goes with it in `value` for diagnosis.
                let payload = err.into_val();
                // A payload that shares its parts (`error([., .] ...)`) is written out whole in
                // the message and the value: bounded like any value an expression yields.
                if let Err(e) = self.bounded(payload.clone()) {
                    return e;
                }
                match &payload {
                    Val::TStr(_) | Val::BStr(_) => EvalError {
                        message: crate::json::as_str(&payload).unwrap_or_default(),
                        value: None,
                        out_of_fuel: false,
                        expression: self.0.source.clone(),
                    },
                    other => EvalError {
                        message: other.to_string(),
                        value: Some(from_val(other)),
                        out_of_fuel: false,
                        expression: self.0.source.clone(),
                    },
                }
            }
            Err(exn) => self.halt_error(exn.get_halt().unwrap_or(OUT_OF_FUEL)),
        }
    }

    /// The error of an evaluation a limit stopped, by the limit's halt code.
    fn halt_error(&self, code: i32) -> EvalError {
        let limits = &self.0.limits;
        let source = &self.0.source;
        let message = match code {
                    OUT_OF_STACK => format!(
                        "expression recursed too deeply (more than {} KiB of stack) (in {source})",
                        limits.stack_bytes / 1024,
                    ),
                    STRING_TOO_LONG => format!(
                        "expression stopped: it would build a string longer than {} bytes (in {source}); see the expression limits in the README",
                        limits.max_string
                    ),
                    TOO_MANY_ITEMS => format!(
                        "expression stopped: it would build an array or object of more than {} entries (in {source}); see the expression limits in the README",
                        limits.max_items
                    ),
                    OUT_OF_MEMORY => format!(
                        "expression stopped: it would build more than {} bytes in one evaluation (in {source}); see the expression limits in the README",
                        limits.memory
                    ),
                    _ => format!(
                        "expression stopped after {} steps (definition calls and values iterated) without finishing (in {source}); see the expression limits in the README",
                        limits.fuel
                    ),
                };
        self.stopped(message)
    }

    /// Runs the expression where exactly one output is needed.
    pub fn eval(&self, input: Val, value: Val) -> Result<Val, EvalError> {
        if let Some(v) = self.0.fast.as_ref().and_then(|f| f.eval(&input, &value)) {
            // `.a = .` shares its input too.
            return self.bounded(v);
        }
        self.eval_jaq(input, value)
    }

    /// [`Expr::eval`] on borrowed values: the direct evaluator reads them where they are, and only
    /// jaq is given copies (which share their parts).
    pub fn eval_on(&self, input: &Val, value: &Val) -> Result<Val, EvalError> {
        if let Some(v) = self.0.fast.as_ref().and_then(|f| f.eval(input, value)) {
            return self.bounded(v);
        }
        self.eval_jaq(input.clone(), value.clone())
    }

    /// Runs the expression on `data` where exactly one output is needed, and makes that output the
    /// new `data`; on an error `data` is left as it was. The same as `*data = self.eval(data.clone(),
    /// value)?`, but an assignment to a field (`.a.b = $value`, `.n += 1`) changes the field in place:
    /// when `data` alone holds its objects, nothing of it is copied.
    pub fn eval_mut(&self, data: &mut Val, value: Val) -> Result<(), EvalError> {
        if let Some((path, x)) = self.0.fast.as_ref().and_then(|f| f.in_place(data, &value)) {
            let old = crate::fast::replace(data, path, x);
            if let Err(e) = self.check_bounds(data) {
                crate::fast::restore(data, path, old);
                return Err(e);
            }
            return Ok(());
        }
        *data = self.eval(data.clone(), value)?;
        Ok(())
    }

    /// Runs the expression through jaq only (the reference for the direct evaluator).
    #[doc(hidden)]
    pub fn eval_jaq(&self, input: Val, value: Val) -> Result<Val, EvalError> {
        let mut out = self.outputs(input, value, 2)?;
        match out.len() {
            1 => Ok(out.pop().expect("one output")),
            0 => Err(EvalError {
                message: format!("expression yielded no value (in {})", self.0.source),
                value: None,
                out_of_fuel: false,
                expression: self.0.source.clone(),
            }),
            _ => Err(EvalError {
                message: format!(
                    "expression yielded more than one value where one is needed (in {})",
                    self.0.source
                ),
                value: None,
                out_of_fuel: false,
                expression: self.0.source.clone(),
            }),
        }
    }

    /// Convenience for hosts: evaluates on JSON values.
    pub fn eval_json(&self, input: &Value) -> Result<Value, EvalError> {
        self.eval(to_val(input), Val::Null).map(|v| from_val(&v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn give(input: Value, code: &str, want: Value) {
        let e = Expr::compile(code, &[], Limits::default()).unwrap();
        assert_eq!(e.eval_json(&input).unwrap(), want, "{code}");
    }

    #[test]
    fn basics() {
        give(json!({"a": 1}), "${ .a + 1 }", json!(2));
        give(json!({}), r#"${ .result += "Hello" }"#, json!({"result": "Hello"}));
        give(json!([3, 1, 2]), "sort | map(. * 2)", json!([2, 4, 6]));
        give(json!(null), "[range(5)]", json!([0, 1, 2, 3, 4]));
        give(json!(null), "[range(0; 10; 3)]", json!([0, 3, 6, 9]));
        give(json!(null), "[range(5; 0; -2)]", json!([5, 3, 1]));
        give(json!(null), "[limit(3; repeat(1))]", json!([1, 1, 1]));
        give(
            json!(null),
            "def f: if . < 3 then . + 1 | f else . end; 0 | f",
            json!(3),
        );
        give(json!({"a": "x"}), "debug | .a", json!("x"));
        give(json!(1), "try error(\"boom\") catch .", json!("boom"));
    }

    #[test]
    fn assignments_follow_jq_and_create_missing_objects() {
        give(json!({}), ".a.b = 1", json!({"a": {"b": 1}}));
        give(json!(null), ".a = 1", json!({"a": 1}));
        give(json!({"a": {"b": 1}}), ".a.b += 2", json!({"a": {"b": 3}}));
        give(json!({"a": {"b": 1}}), ".a.b |= . * 10", json!({"a": {"b": 10}}));
        give(json!({}), ".x //= 5 | .x //= 6", json!({"x": 5}));
        give(
            json!({"n": 2}),
            ".out.v = (.n | tostring)",
            json!({"n": 2, "out": {"v": "2"}}),
        );
        give(json!({"k": [1]}), ".k[0] = 9", json!({"k": [9]}));
        give(json!({}), ".a[0] = 1", json!({"a": [1]}));
        give(json!({}), ".a[2].b = 1", json!({"a": [null, null, {"b": 1}]}));
        give(json!({"a": [1]}), ".a[0] += 1", json!({"a": [2]}));
        give(json!(null), ".results[1] = \"x\"", json!({"results": [null, "x"]}));
        let e = Expr::compile(".a.b = 1", &[], Limits::default()).unwrap();
        let err = e.eval_json(&json!({"a": 1})).unwrap_err();
        assert!(err.message.contains("cannot index number"), "{err:?}");
    }

    #[test]
    fn path_expressions_work_through_definitions() {
        let items = json!({"items": [{"id": 1, "done": false}, {"id": 2, "done": false}]});
        give(
            items.clone(),
            "del(.items[] | select(.id == 1))",
            json!({"items": [{"id": 2, "done": false}]}),
        );
        give(
            items.clone(),
            "(.items[] | select(.id == 2) | .done) |= not",
            json!({"items": [{"id": 1, "done": false}, {"id": 2, "done": true}]}),
        );
        give(items, "[paths(type == \"boolean\")] | length", json!(2));
        give(json!({"a": {"b": 1}}), "delpaths([[\"a\", \"b\"]])", json!({"a": {}}));
        give(
            json!({"a": true}),
            "(.. | select(type == \"boolean\")) |= not",
            json!({"a": false}),
        );
    }

    #[test]
    fn error_messages_are_the_raised_text() {
        let e = Expr::compile("${ error(\"card declined\") }", &[], Limits::default()).unwrap();
        let err = e.eval_json(&json!(null)).unwrap_err();
        assert_eq!(err.message, "card declined");
        assert_eq!(err.expression, "${ error(\"card declined\") }");
        let e = Expr::compile("error({code: 42})", &[], Limits::default()).unwrap();
        let err = e.eval_json(&json!(null)).unwrap_err();
        assert_eq!(err.value, Some(json!({"code": 42})));
    }

    #[test]
    fn value_variable() {
        let e = Expr::compile("${ .x = $value }", &[], Limits::default()).unwrap();
        let out = e.eval(to_val(&json!({})), to_val(&json!([1]))).unwrap();
        assert_eq!(from_val(&out), json!({"x": [1]}));
    }

    #[test]
    fn one_value_required() {
        let e = Expr::compile(".[]", &[], Limits::default()).unwrap();
        let err = e.eval_json(&json!([1, 2])).unwrap_err();
        assert!(err.message.contains("more than one value") && err.message.contains(".[]"));
        let err = e.eval_json(&json!([])).unwrap_err();
        assert!(err.message.contains("no value"));
    }

    #[test]
    fn machine_shares_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Expr>();
    }
}
