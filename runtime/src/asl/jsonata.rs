//! `QueryLanguage: "JSONata"`: `{% ... %}` expressions in `Arguments`, `Output`, `Assign`,
//! `Condition`, `Items`, `Seconds`, ...
//!
//! Expressions are parsed and evaluated by the `jsonata-rs` crate (Stedi), with what Step
//! Functions adds or changes around it:
//!
//! - `$states` and the workflow variables (`$name`) are bound for each evaluation;
//! - the Step Functions functions `$partition`, `$range`, `$hash` and `$parse` are added, and
//!   `$type` and `$average`, which the crate lacks;
//! - `$random` and `$uuid` draw from the instance's deterministic source ([`Env::random`]), and
//!   `$now` and `$millis` read the time the state was entered (`$$.State.EnteredTime`, else
//!   `$$.Execution.StartTime`), so that a replay evaluates to the same values;
//! - the result is converted to JSON: whole numbers are written as integers, an object read from
//!   the input keeps its key order, and an object the expression builds has its keys sorted (the
//!   crate keeps objects in a hash map, so their order would otherwise change from run to run);
//! - evaluation depth is bounded, so is the nesting of an expression's text, and a panic in the
//!   crate is caught and reported as an evaluation error.

use super::{jsonata_regex, AslError, Env};
use crate::kernel::random::unit;
use crate::kernel::Random;
use bumpalo::Bump;
use jsonata_rs::{ArrayFlags, Budget, Error as JError, FunctionContext, JsonAta, Value as JValue};
use serde_json::{Map, Number, Value};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Opening brackets, and operator characters, an expression may have in all when it has quotes,
/// backticks or slashes (see [`check_nesting`]): each is at most a level of the parser's recursion
/// or of the syntax tree, so these bound the stack whatever the text hides.
const MAX_HIDDEN_NESTING: usize = 256;
const MAX_HIDDEN_OPERATORS: usize = 600;

/// The deepest evaluation (nested calls of the crate's evaluator) allowed before an expression
/// fails with a stack overflow error instead of exhausting the thread's stack.
const MAX_EVAL_DEPTH: usize = 200;

/// Steps one evaluation may take (see `vendor/jsonata-rs/PATCHED.md` for what counts): each
/// evaluated node of the expression, each element of a range it builds, and each element of an
/// array it passes to a built-in function. Like jq's fuel, a count rather than a time, so that a
/// replay stops at the same point; evaluations run at several million steps a second.
pub const MAX_STEPS: u64 = 10_000_000;

/// Bytes one evaluation may build in its arena, beyond the values bound to its variables (the
/// input's size is bounded where it enters); checked at every step.
pub const MAX_BYTES: usize = 64 << 20;

/// The arena's hard limit beyond the bound values: an allocation past it panics (caught, and
/// reported as the memory budget), for a single step that builds more than [`MAX_BYTES`] at once.
const HARD_BYTES: usize = 2 * MAX_BYTES;

/// The deepest nesting of brackets and prefix operators allowed in an expression's text, which
/// bounds the parser's recursion.
const MAX_NESTING: usize = 64;

/// The most binary operators an expression may chain, counted along each path of brackets (`a +
/// (b + c)` chains two at its deepest point). Each is a level of the syntax tree, which the crate
/// walks recursively after parsing: in the non-sanitized fuzz build, 600 chained `+` exhausted a
/// 2 MiB thread stack and 2,000 the main thread's 8 MiB. The crate's evaluation stops at a depth
/// of [`MAX_EVAL_DEPTH`] anyway, so a longer chain could not have been evaluated.
const MAX_OPERATORS: usize = 200;

/// True when `s` is a JSONata expression: it starts with `{%` and ends with `%}`. The string is
/// not trimmed: `" {% 1 %} "` is a literal string, as in Step Functions.
pub fn is_expression(s: &str) -> bool {
    s.len() >= 4 && s.starts_with("{%") && s.ends_with("%}")
}

/// The expression inside `{% ... %}`, trimmed; `None` when `s` is not an expression.
pub fn expression_body(s: &str) -> Option<&str> {
    if is_expression(s) {
        Some(s[2..s.len() - 2].trim())
    } else {
        None
    }
}

/// Checks the syntax of one expression (the text inside `{% %}`); the error is a message.
pub fn check_expression(expr: &str) -> Result<(), String> {
    if expr.trim().is_empty() {
        return Err("the JSONata expression is empty".into());
    }
    let mut regexes = Vec::new();
    check_nesting(expr, &mut regexes)?;
    let arena = Bump::new();
    match catch_unwind(AssertUnwindSafe(|| JsonAta::new(expr, &arena).map(|_| ()))) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("invalid JSONata expression '{expr}': {e}")),
        Err(_) => return Err(format!("invalid JSONata expression '{expr}'")),
    }
    for (pattern, flags) in regexes {
        jsonata_regex::check_literal(&pattern, &flags)
            .map_err(|e| format!("invalid JSONata expression '{expr}': {e}"))?;
    }
    Ok(())
}

/// Evaluates one expression (the text inside `{% %}`) with `$states` bound to `states` and the
/// variables of `env`. An expression that yields nothing (undefined) is an error, as is a result
/// JSON cannot represent (a function, a number that is not finite).
pub fn eval_expression(expr: &str, states: &Value, env: &Env) -> Result<Value, AslError> {
    check_expression(expr).map_err(AslError::query)?;
    let time = entered_time(env.context);
    RNG.with(|r| r.set(Some(env.rng.get())));
    let result = catch_unwind(AssertUnwindSafe(|| evaluate(expr, states, env, time)));
    if let Some(state) = RNG.with(|r| r.take()) {
        env.rng.set(state);
    }
    match result {
        Ok(Ok(Some(v))) => match crate::json::too_deep(&v, crate::json::MAX_DEPTH) {
            None => Ok(v),
            Some(_) => Err(AslError::query(format!(
                "The JSONata expression '{expr}' returned a value nested deeper than {} levels, the most sm4c keeps.",
                crate::json::MAX_DEPTH
            ))),
        },
        Ok(Ok(None)) => Err(AslError::query(format!(
            "The JSONata expression '{expr}' returned nothing (undefined)."
        ))),
        Ok(Err(cause)) => Err(AslError::query(format!(
            "The JSONata expression '{expr}' failed: {cause}"
        ))),
        Err(_) => Err(AslError::query(format!(
            "The JSONata expression '{expr}' could not be evaluated."
        ))),
    }
}

/// A JSON value whose strings may be `{% %}` expressions, at any depth.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    source: Value,
    /// Whether any string in `source` is an expression (if not, `eval` returns it as is).
    dynamic: bool,
}

impl Query {
    /// Parses a value; every expression in it is checked. Errors are `(pointer relative to the
    /// value, message)`.
    pub fn parse(v: &Value) -> Result<Query, Vec<(String, String)>> {
        let mut errors = Vec::new();
        let mut dynamic = false;
        check_value(v, &mut String::new(), &mut errors, &mut dynamic);
        if errors.is_empty() {
            Ok(Query {
                source: v.clone(),
                dynamic,
            })
        } else {
            Err(errors)
        }
    }

    /// Evaluates it. `states` is what `$states` refers to (`input`, `context`, and `result` or
    /// `errorOutput` where the state has them); `env.vars` are the other `$name` variables.
    pub fn eval(&self, states: &Value, env: &Env) -> Result<Value, AslError> {
        if !self.dynamic {
            return Ok(self.source.clone());
        }
        eval_value(&self.source, states, env)
    }

    /// The value as written in the definition.
    pub fn source(&self) -> &Value {
        &self.source
    }
}

fn check_value(v: &Value, pointer: &mut String, errors: &mut Vec<(String, String)>, dynamic: &mut bool) {
    match v {
        Value::String(s) => {
            if let Some(expr) = expression_body(s) {
                *dynamic = true;
                if let Err(e) = check_expression(expr) {
                    errors.push((pointer.clone(), e));
                }
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let len = pointer.len();
                pointer.push('/');
                pointer.push_str(&i.to_string());
                check_value(x, pointer, errors, dynamic);
                pointer.truncate(len);
            }
        }
        Value::Object(o) => {
            for (k, x) in o {
                let len = pointer.len();
                pointer.push('/');
                pointer.push_str(&k.replace('~', "~0").replace('/', "~1"));
                check_value(x, pointer, errors, dynamic);
                pointer.truncate(len);
            }
        }
        _ => {}
    }
}

fn eval_value(v: &Value, states: &Value, env: &Env) -> Result<Value, AslError> {
    Ok(match v {
        Value::String(s) => match expression_body(s) {
            Some(expr) => eval_expression(expr, states, env)?,
            None => v.clone(),
        },
        Value::Array(a) => Value::Array(a.iter().map(|x| eval_value(x, states, env)).collect::<Result<_, _>>()?),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| Ok((k.clone(), eval_value(x, states, env)?)))
                .collect::<Result<_, AslError>>()?,
        ),
        _ => v.clone(),
    })
}

/// Rejects text nested deeper than [`MAX_NESTING`] (brackets, and runs of prefix operators), which
/// would make the crate's recursive parser exhaust the stack, and text that chains more than
/// [`MAX_OPERATORS`] binary operators, whose syntax tree the crate processes recursively. Operators
/// are counted by their characters (`<=` counts twice, the `.` of a path step once, `and`, `or` and
/// `in` once), more than the parser sees, never fewer. What the crate's tokenizer skips is skipped
/// exactly as it does: strings (`"`, `'`, with `\` escapes), names in backticks (no escapes),
/// comments (`/* */`, which the tokenizer ends only at a `*` directly followed by `/`) and regular
/// expressions (`/.../`, where a `/` may begin one: after nothing, `(`, `[`, `{`, `,`, `~>`, `:=`,
/// `and`, `or`, `=`, `!=`, `<`, `>`, `<=` or `>=`). Brackets in any of them do not nest; brackets
/// outside them always count, so nothing can hide nesting from this check. The regular expressions
/// it reads are added to `regexes` (pattern, flags).
fn check_nesting(expr: &str, regexes: &mut Vec<(String, String)>) -> Result<(), String> {
    let mut depth = 0usize;
    let mut max = 0usize;
    let mut prefix_run = 0usize;
    // Operators chained at each open bracket level, and their sum along the open brackets.
    let mut chained: Vec<usize> = vec![0];
    let mut on_path = 0usize;
    let mut most_chained = 0usize;
    // Whether a `/` here begins a regular expression (the tokenizer's previous token allows one).
    let mut regex_may_start = true;
    let mut word = String::new();
    let mut chars = expr.chars().peekable();
    let chain = |on_path: &mut usize, chained: &mut Vec<usize>, most: &mut usize| {
        *on_path += 1;
        *most = (*most).max(*on_path);
        if let Some(n) = chained.last_mut() {
            *n += 1;
        }
    };
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' || c == '$' {
            word.push(c);
            prefix_run = 0;
            regex_may_start = false;
            continue;
        }
        if !word.is_empty() {
            if matches!(word.as_str(), "and" | "or" | "in") {
                chain(&mut on_path, &mut chained, &mut most_chained);
            }
            regex_may_start = matches!(word.as_str(), "and" | "or");
            word.clear();
        }
        if c.is_whitespace() {
            continue;
        }
        match c {
            '"' | '\'' => {
                while let Some(x) = chars.next() {
                    if x == '\\' {
                        chars.next();
                    } else if x == c {
                        break;
                    }
                }
                regex_may_start = false;
                prefix_run = 0;
                continue;
            }
            '`' => {
                for x in chars.by_ref() {
                    if x == '`' {
                        break;
                    }
                }
                regex_may_start = false;
                prefix_run = 0;
                continue;
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                loop {
                    for x in chars.by_ref() {
                        if x == '*' {
                            break;
                        }
                    }
                    match chars.next() {
                        Some('/') | None => break,
                        Some(_) => {}
                    }
                }
                continue;
            }
            '/' if regex_may_start => {
                let mut escaped = false;
                let mut pattern = String::new();
                for x in chars.by_ref() {
                    match x {
                        '\\' => escaped = true,
                        '/' if !escaped => break,
                        _ => escaped = false,
                    }
                    pattern.push(x);
                }
                let mut flags = String::new();
                while let Some(f) = chars.next_if(|f| matches!(f, 'i' | 'm')) {
                    flags.push(f);
                }
                regexes.push((pattern, flags));
                regex_may_start = false;
                prefix_run = 0;
                continue;
            }
            '(' | '[' | '{' => {
                depth += 1;
                max = max.max(depth + prefix_run);
                chained.push(0);
            }
            ')' | ']' | '}' => {
                depth = depth.saturating_sub(1);
                if chained.len() > 1 {
                    on_path -= chained.pop().unwrap_or(0);
                }
            }
            '+' | '-' | '*' | '/' | '%' | '&' | '=' | '<' | '>' | '!' | '.' | '~' | ':' | '?' | '@' | '#' | '^' => {
                chain(&mut on_path, &mut chained, &mut most_chained);
            }
            _ => {}
        }
        regex_may_start = match c {
            '(' | '[' | '{' | ',' | '=' | '<' => true,
            // `~>`, `:=`, `!=` and `>=` end in these; `>` alone too.
            '>' => true,
            ':' | '!' => chars.peek() == Some(&'='),
            _ => false,
        };
        if c == '-' || c == '?' || c == ':' || c == '~' || c == '>' {
            prefix_run += 1;
            max = max.max(depth + prefix_run);
        } else {
            prefix_run = 0;
        }
    }
    if matches!(word.as_str(), "and" | "or" | "in") {
        most_chained = most_chained.max(on_path + 1);
    }
    // Where the text has a quote, a backtick or a slash, the scan above depends on reading them as
    // the tokenizer does (the fuzzer found two ways it did not: brackets after a quote in a comment,
    // or in a name, were hidden). There, also bound what no reading can hide: all the opening
    // brackets and operator characters of the text, whatever they are inside.
    if expr.contains(['"', '\'', '`', '/']) {
        let openers = expr.chars().filter(|c| matches!(c, '(' | '[' | '{')).count();
        let operators = expr.chars().filter(|c| "+-*/%&=<>!.~:?@#^".contains(*c)).count();
        if openers > MAX_HIDDEN_NESTING {
            return Err(format!(
                "the JSONata expression has more than {MAX_HIDDEN_NESTING} opening brackets besides quotes or slashes"
            ));
        }
        if operators > MAX_HIDDEN_OPERATORS {
            return Err(format!(
                "the JSONata expression has more than {MAX_HIDDEN_OPERATORS} operator characters besides quotes or slashes"
            ));
        }
    }
    if max > MAX_NESTING {
        Err(format!(
            "the JSONata expression is nested deeper than {MAX_NESTING} levels"
        ))
    } else if most_chained > MAX_OPERATORS {
        Err(format!(
            "the JSONata expression chains more than {MAX_OPERATORS} operators (each is a level of its syntax tree)"
        ))
    } else {
        Ok(())
    }
}

/// The time `$now()` and `$millis()` report: when the state was entered, else when the
/// execution started.
fn entered_time(context: &Value) -> Option<String> {
    ["State/EnteredTime", "Execution/StartTime"].iter().find_map(|p| {
        context
            .pointer(&format!("/{p}"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    })
}

thread_local! {
    /// The instance's random state while an expression is evaluated on this thread; the native
    /// functions (plain `fn` pointers) cannot capture the [`Env`].
    static RNG: Cell<Option<Random>> = const { Cell::new(None) };
}

/// Draws from the random state of the evaluation on this thread, with [`Env::random`].
fn draw() -> u64 {
    RNG.with(|r| {
        let cell = Cell::new(r.get().unwrap_or(Random::new(0)));
        let n = random_from(&cell);
        r.set(Some(cell.get()));
        n
    })
}

/// [`Env::random`] on a bare state.
fn random_from(state: &Cell<Random>) -> u64 {
    let vars = Map::new();
    let env = Env {
        input: &Value::Null,
        context: &Value::Null,
        vars: &vars,
        rng: state,
    };
    env.random()
}

/// The bindings every prelude starts with: what Step Functions redefines, and the regular
/// expression functions searched in bounded time ([`jsonata_regex`]).
macro_rules! prelude_bindings {
    () => {
        "($random := $__sm4c_random; $uuid := $__sm4c_uuid; \
$contains := $__sm4c_contains; $split := $__sm4c_split; $match := $__sm4c_match; \
$replace := $__sm4c_replace; "
    };
}

/// What Step Functions redefines, bound in a block around the expression (the crate binds its
/// own natives last, over anything bound before evaluation).
const PRELUDE: &str = concat!(
    prelude_bindings!(),
    "$millis := function() { $toMillis($__sm4c_now) }; \
$now := function($p, $tz) { $exists($tz) ? $fromMillis($millis(), $p, $tz) \
: $exists($p) ? $fromMillis($millis(), $p) : $fromMillis($millis()) }; (\n"
);

/// [`PRELUDE`] without the `$millis` and `$now` lambdas, for expressions that use neither:
/// jsonata-rs keeps a lambda's cloned syntax tree in its arena, which never frees it, so each
/// lambda defined leaks it (about 16 KB an evaluation for the two; found by the fuzz target
/// asl_execution under LeakSanitizer).
const PRELUDE_NO_CLOCK: &str = concat!(prelude_bindings!(), "(\n");

/// The prelude `expr` needs.
fn prelude(expr: &str) -> &'static str {
    if expr.contains("$millis") || expr.contains("$now") {
        PRELUDE
    } else {
        PRELUDE_NO_CLOCK
    }
}

/// Evaluates `expr` (already checked); `Ok(None)` when it yields undefined.
fn evaluate(expr: &str, states: &Value, env: &Env, time: Option<String>) -> Result<Option<Value>, String> {
    let arena = Bump::new();
    let bound = Cell::new(usize::MAX);
    match catch_unwind(AssertUnwindSafe(|| {
        evaluate_in(&arena, &bound, expr, states, env, time)
    })) {
        Ok(result) => result,
        Err(_) if arena.allocated_bytes().saturating_sub(bound.get()) > MAX_BYTES => {
            Err(budget_message(&JError::U1003MemoryBudget(MAX_BYTES)))
        }
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// The error of an exhausted budget, naming it.
fn budget_message(e: &JError) -> String {
    match e {
        JError::U1002StepBudget(max) => format!(
            "it exceeded the JSONata evaluation budget of {max} steps (nodes evaluated, and elements of ranges built and of arrays passed to functions)"
        ),
        JError::U1003MemoryBudget(_) => format!(
            "it exceeded the JSONata evaluation budget of {MAX_BYTES} bytes of memory"
        ),
        e => e.to_string(),
    }
}

/// [`evaluate`] in `arena`; `bound` is set to the bytes the bound variables take, from which the
/// memory budget counts.
fn evaluate_in(
    arena: &Bump,
    bound: &Cell<usize>,
    expr: &str,
    states: &Value,
    env: &Env,
    time: Option<String>,
) -> Result<Option<Value>, String> {
    let prelude = prelude(expr);
    let source = format!("{prelude}{expr}\n))");
    let jsonata = JsonAta::new(&source, arena).map_err(|e| e.to_string())?;
    let origins = RefCell::new(HashMap::new());
    let bind = |name: &str, v: &Value| {
        let value = to_jsonata(arena, v, &origins);
        jsonata.assign_var(name, value);
    };
    if expr.contains("$states") {
        bind("states", states);
    }
    for (name, v) in env.vars {
        if !name.is_empty() && name != "states" && expr.contains(&format!("${name}")) {
            bind(name, v);
        }
    }
    if let Some(time) = time {
        bind("__sm4c_now", &Value::String(time));
    }
    bound.set(arena.allocated_bytes());
    arena.set_allocation_limit(Some(bound.get().saturating_add(HARD_BYTES)));
    jsonata.set_budget(Budget {
        max_steps: Some(MAX_STEPS),
        max_bytes: Some(bound.get().saturating_add(MAX_BYTES)),
    });
    jsonata.register_function("__sm4c_random", 1, fn_random);
    jsonata.register_function("__sm4c_uuid", 0, fn_uuid);
    jsonata.register_function("range", 3, fn_range);
    jsonata.register_function("partition", 2, fn_partition);
    jsonata.register_function("parse", 1, fn_parse);
    jsonata.register_function("type", 1, fn_type);
    jsonata.register_function("average", 1, fn_average);
    jsonata.register_function("hash", 2, fn_hash);
    // Searched in bounded time (see the module `jsonata_regex`), not by the crate's backtracking.
    jsonata.register_function("__sm4c_contains", 2, jsonata_regex::fn_contains);
    jsonata.register_function("__sm4c_split", 3, jsonata_regex::fn_split);
    jsonata.register_function("__sm4c_match", 2, jsonata_regex::fn_match);
    jsonata.register_function("__sm4c_replace", 4, jsonata_regex::fn_replace);
    let result = jsonata
        .evaluate_timeboxed(None, Some(MAX_EVAL_DEPTH), None)
        .map_err(|e| match e {
            JError::U1002StepBudget(_) | JError::U1003MemoryBudget(_) => budget_message(&e),
            e => unshift(&e.to_string(), prelude.len()),
        })?;
    if result.is_undefined() {
        return Ok(None);
    }
    let origins = origins.into_inner();
    from_jsonata(result, &origins, 0).map(Some)
}

/// The crate's error message (`CODE @ position: text`) with the position counted from the start
/// of the expression rather than of the prelude (`prelude_len` bytes).
fn unshift(message: &str, prelude_len: usize) -> String {
    if let Some((code, rest)) = message.split_once(" @ ") {
        if let Some((pos, text)) = rest.split_once(':') {
            if let Ok(pos) = pos.trim().parse::<usize>() {
                return format!("{code} @ {}:{text}", pos.saturating_sub(prelude_len));
            }
        }
    }
    message.to_owned()
}

/// Converts JSON into the crate's value, remembering each object's original key order by its
/// address.
fn to_jsonata<'a>(arena: &'a Bump, v: &Value, origins: &RefCell<HashMap<usize, Vec<String>>>) -> &'a JValue<'a> {
    match v {
        Value::Null => JValue::null(arena),
        Value::Bool(b) => JValue::bool(*b),
        Value::Number(n) => JValue::number(arena, n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => JValue::string(arena, s),
        Value::Array(a) => {
            let array = JValue::array_with_capacity(arena, a.len(), ArrayFlags::empty());
            for x in a {
                array.push(to_jsonata(arena, x, origins));
            }
            array
        }
        Value::Object(o) => {
            let object = JValue::object_with_capacity(arena, o.len());
            for (k, x) in o {
                object.insert(k, to_jsonata(arena, x, origins));
            }
            let object: &'a JValue<'a> = object;
            origins
                .borrow_mut()
                .insert(object as *const JValue as usize, o.keys().cloned().collect());
            object
        }
    }
}

/// Converts the crate's value to JSON. Undefined members of arrays are dropped, as are members
/// of objects that are undefined or functions (as `JSON.stringify` does).
fn from_jsonata<'a>(v: &'a JValue<'a>, origins: &HashMap<usize, Vec<String>>, depth: usize) -> Result<Value, String> {
    if depth > 10_000 {
        return Err("the result is nested too deeply".into());
    }
    Ok(match v {
        JValue::Undefined | JValue::Null => Value::Null,
        JValue::Bool(b) => Value::Bool(*b),
        JValue::Number(n) => number(*n)?,
        JValue::String(s) => Value::String(s.to_string()),
        JValue::Array(..) | JValue::Range(..) => {
            let mut out = Vec::with_capacity(v.len());
            for x in v.members() {
                if x.is_undefined() || x.is_function() {
                    continue;
                }
                out.push(from_jsonata(x, origins, depth + 1)?);
            }
            Value::Array(out)
        }
        JValue::Object(o) => {
            let mut keys: Vec<&str> = o
                .iter()
                .filter(|(_, x)| !x.is_undefined() && !x.is_function())
                .map(|(k, _)| k.as_str())
                .collect();
            match origins.get(&(v as *const JValue as usize)) {
                Some(order) if order.len() == keys.len() => {
                    keys = order.iter().map(String::as_str).collect();
                }
                _ => keys.sort_unstable(),
            }
            let mut out = Map::with_capacity(keys.len());
            for k in keys {
                let x = v.get_entry(k);
                out.insert(k.to_owned(), from_jsonata(x, origins, depth + 1)?);
            }
            Value::Object(out)
        }
        JValue::Regex(_) => return Err("a regular expression is not a JSON value".into()),
        JValue::Lambda { .. } | JValue::NativeFn { .. } | JValue::Transformer { .. } => {
            return Err("a function is not a JSON value".into())
        }
    })
}

/// A number as JSON: an integer when it is whole (and below 1e21, where JavaScript switches to
/// exponent notation).
fn number(n: f64) -> Result<Value, String> {
    if !n.is_finite() {
        return Err(format!("the number {n} is not a JSON value"));
    }
    if n.fract() == 0.0 && n.abs() < 1e21 {
        if n >= i64::MIN as f64 && n < i64::MAX as f64 {
            return Ok(Value::Number(Number::from(n as i64)));
        }
        if n >= 0.0 && n < u64::MAX as f64 {
            return Ok(Value::Number(Number::from(n as u64)));
        }
    }
    Number::from_f64(n)
        .map(Value::Number)
        .ok_or_else(|| format!("the number {n} is not a JSON value"))
}

/// A type error on argument `index` (1-based) of the function being called, by the name the
/// expression calls it (`$random` for the `$__sm4c_random` the prelude binds to it).
pub(super) fn bad_arg(ctx: &FunctionContext, index: usize) -> jsonata_rs::Error {
    let name = ctx.name.strip_prefix("__sm4c_").unwrap_or(ctx.name);
    jsonata_rs::Error::T0410ArgumentNotValid(ctx.char_index, index, name.to_string())
}

/// `$random([seed])`: a number in `[0, 1)`; from the instance's source, or from `seed`.
fn fn_random<'a>(ctx: FunctionContext<'a, '_>, args: &[&'a JValue<'a>]) -> jsonata_rs::Result<&'a JValue<'a>> {
    let seed = args.first().copied().filter(|a| !a.is_undefined());
    let bits = match seed {
        None => draw(),
        Some(s) if s.is_number() && s.is_finite() => crate::kernel::random::splitmix64(s.as_f64().to_bits()),
        Some(_) => return Err(bad_arg(&ctx, 1)),
    };
    Ok(JValue::number(ctx.arena, unit(bits)))
}

/// `$uuid()`: a version 4 UUID from the instance's source.
fn fn_uuid<'a>(ctx: FunctionContext<'a, '_>, _args: &[&'a JValue<'a>]) -> jsonata_rs::Result<&'a JValue<'a>> {
    let hi = draw();
    let lo = draw();
    let hi = (hi & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000;
    let lo = (lo & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
    let s = format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    );
    Ok(JValue::string(ctx.arena, &s))
}

/// The most members `$range` and `$partition` may produce (as `States.ArrayRange`).
const MAX_MEMBERS: usize = 1000;

/// `$range(start, end, step)`: the numbers from `start` to `end` (inclusive) by `step`, as a
/// sequence (so one number comes back bare, not in an array).
fn fn_range<'a>(ctx: FunctionContext<'a, '_>, args: &[&'a JValue<'a>]) -> jsonata_rs::Result<&'a JValue<'a>> {
    let int = |i: usize| -> jsonata_rs::Result<f64> {
        match args.get(i) {
            Some(a) if a.is_number() && a.is_finite() && a.as_f64().fract() == 0.0 => Ok(a.as_f64()),
            _ => Err(bad_arg(&ctx, i + 1)),
        }
    };
    let (start, end, step) = (int(0)?, int(1)?, int(2)?);
    if step == 0.0 {
        return Err(bad_arg(&ctx, 3));
    }
    let count = ((end - start) / step).floor() + 1.0;
    let count = if count > 0.0 { count } else { 0.0 };
    if count > MAX_MEMBERS as f64 {
        return Err(jsonata_rs::Error::D2014RangeOutOfBounds(ctx.char_index, count as isize));
    }
    let array = JValue::array_with_capacity(ctx.arena, count as usize, ArrayFlags::SEQUENCE);
    for i in 0..count as usize {
        array.push(JValue::number(ctx.arena, start + step * i as f64));
    }
    Ok(array)
}

/// `$partition(array, size)`: the array in chunks of `size` members (the last may be shorter).
fn fn_partition<'a>(ctx: FunctionContext<'a, '_>, args: &[&'a JValue<'a>]) -> jsonata_rs::Result<&'a JValue<'a>> {
    let array = match args.first() {
        Some(a) if a.is_array() => *a,
        Some(a) if a.is_undefined() => return Ok(JValue::undefined()),
        Some(a) if !a.is_function() => JValue::wrap_in_array(ctx.arena, a, ArrayFlags::empty()),
        _ => return Err(bad_arg(&ctx, 1)),
    };
    let size = match args.get(1) {
        Some(s) if s.is_number() && s.is_finite() && s.as_f64() >= 1.0 => s.as_f64().floor() as usize,
        _ => return Err(bad_arg(&ctx, 2)),
    };
    let members: Vec<&'a JValue<'a>> = array.members().collect();
    let out = JValue::array_with_capacity(ctx.arena, members.len().div_ceil(size), ArrayFlags::empty());
    for chunk in members.chunks(size) {
        let part = JValue::array_with_capacity(ctx.arena, chunk.len(), ArrayFlags::empty());
        for m in chunk {
            part.push(m);
        }
        out.push(part);
    }
    Ok(out)
}

/// `$type(value)`: the JSONata type name of the value.
fn fn_type<'a>(ctx: FunctionContext<'a, '_>, args: &[&'a JValue<'a>]) -> jsonata_rs::Result<&'a JValue<'a>> {
    let name = match args.first() {
        None => return Ok(JValue::undefined()),
        Some(a) => match a {
            JValue::Undefined => return Ok(JValue::undefined()),
            JValue::Null => "null",
            JValue::Number(_) => "number",
            JValue::Bool(_) => "boolean",
            JValue::String(_) => "string",
            JValue::Array(..) | JValue::Range(..) => "array",
            JValue::Object(_) | JValue::Regex(_) => "object",
            JValue::Lambda { .. } | JValue::NativeFn { .. } | JValue::Transformer { .. } => "function",
        },
    };
    Ok(JValue::string(ctx.arena, name))
}

/// `$average(array)`: the mean of an array of numbers.
fn fn_average<'a>(ctx: FunctionContext<'a, '_>, args: &[&'a JValue<'a>]) -> jsonata_rs::Result<&'a JValue<'a>> {
    let arg = match args.first() {
        None => return Ok(JValue::undefined()),
        Some(a) if a.is_undefined() => return Ok(JValue::undefined()),
        Some(a) => *a,
    };
    let mut sum = 0.0;
    let mut count = 0usize;
    if arg.is_array() {
        for m in arg.members() {
            if !m.is_number() {
                return Err(bad_arg(&ctx, 1));
            }
            sum += m.as_f64();
            count += 1;
        }
    } else if arg.is_number() {
        sum = arg.as_f64();
        count = 1;
    } else {
        return Err(bad_arg(&ctx, 1));
    }
    if count == 0 {
        return Ok(JValue::undefined());
    }
    Ok(JValue::number(ctx.arena, sum / count as f64))
}

/// `$hash(value, algorithm)`: the hex digest of a string with `MD5`, `SHA-1`, `SHA-256`,
/// `SHA-384` or `SHA-512`.
fn fn_hash<'a>(ctx: FunctionContext<'a, '_>, args: &[&'a JValue<'a>]) -> jsonata_rs::Result<&'a JValue<'a>> {
    use sha2::Digest;
    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
    let data = match args.first() {
        Some(a) if a.is_undefined() => return Ok(JValue::undefined()),
        Some(a) if a.is_string() => a.as_str(),
        _ => return Err(bad_arg(&ctx, 1)),
    };
    let algorithm = match args.get(1) {
        Some(a) if a.is_string() => a.as_str(),
        _ => return Err(bad_arg(&ctx, 2)),
    };
    let bytes = data.as_bytes();
    let digest = match &*algorithm {
        "MD5" => hex(&md5::Md5::digest(bytes)),
        "SHA-1" => hex(&sha1::Sha1::digest(bytes)),
        "SHA-256" => hex(&sha2::Sha256::digest(bytes)),
        "SHA-384" => hex(&sha2::Sha384::digest(bytes)),
        "SHA-512" => hex(&sha2::Sha512::digest(bytes)),
        other => {
            return Err(jsonata_rs::Error::D3137Error(format!(
                "$hash: the algorithm {other:?} is not one of MD5, SHA-1, SHA-256, SHA-384, SHA-512"
            )))
        }
    };
    Ok(JValue::string(ctx.arena, &digest))
}

/// `$parse(text)`: the JSON value `text` holds.
fn fn_parse<'a>(ctx: FunctionContext<'a, '_>, args: &[&'a JValue<'a>]) -> jsonata_rs::Result<&'a JValue<'a>> {
    let text = match args.first() {
        Some(a) if a.is_undefined() => return Ok(JValue::undefined()),
        Some(a) if a.is_string() => a.as_str(),
        _ => return Err(bad_arg(&ctx, 1)),
    };
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| jsonata_rs::Error::D3137Error(format!("$parse: the string is not JSON: {e}")))?;
    let origins = RefCell::new(HashMap::new());
    Ok(to_jsonata(ctx.arena, &v, &origins))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Evaluates `query` as a JSONata Query with `input` as `$states.input`, and `vars`.
    fn run_with(query: Value, input: Value, vars: Value) -> Result<Value, AslError> {
        let q = Query::parse(&query).expect("the query parses");
        let context = json!({"State": {"EnteredTime": "2024-05-06T07:08:09.123Z", "Name": "S"}});
        let states = json!({"input": input, "context": context});
        let vars = match vars {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        let rng = Cell::new(Random::new(7));
        let env = Env {
            input: &states["input"],
            context: &states["context"],
            vars: &vars,
            rng: &rng,
        };
        q.eval(&states, &env)
    }

    fn run(query: Value, input: Value) -> Result<Value, AslError> {
        run_with(query, input, json!({}))
    }

    fn expr(e: &str, input: Value) -> Result<Value, AslError> {
        run(Value::String(format!("{{% {e} %}}")), input)
    }

    fn query_error(r: Result<Value, AslError>) -> String {
        let e = r.expect_err("an error");
        assert_eq!(e.error.as_deref(), Some(super::super::names::QUERY_EVALUATION_ERROR));
        e.cause.unwrap_or_default()
    }

    #[test]
    fn recognises_expressions() {
        assert!(is_expression("{% 1 %}"));
        assert!(is_expression("{%1%}"));
        assert!(!is_expression(" {% 1 %} "));
        assert!(!is_expression("{%}"));
        assert!(!is_expression("$states.input"));
        assert_eq!(expression_body("{%  $x  %}"), Some("$x"));
    }

    // choice-condition.asl.json
    #[test]
    fn condition_reads_input() {
        let c = json!("{% $states.input.condition %}");
        assert_eq!(run(c.clone(), json!({"condition": true})), Ok(json!(true)));
        assert_eq!(run(c, json!({"condition": false})), Ok(json!(false)));
    }

    // choice-condition-constant-true.asl.json
    #[test]
    fn constant_condition() {
        assert_eq!(run(json!(true), json!({})), Ok(json!(true)));
    }

    // fail-error-expression.asl.json
    #[test]
    fn fail_error_expression() {
        let r = run(json!("{% $states.input.error %}"), json!({"error": "Exception"}));
        assert_eq!(r, Ok(json!("Exception")));
    }

    // map-input-not-array-is-query-evaluation-error.asl.json (the Output of Start)
    #[test]
    fn output_reads_string_member() {
        let r = run(json!("{% $states.input.items %}"), json!({"items": "string"}));
        assert_eq!(r, Ok(json!("string")));
    }

    // map-items-array-with-expression-element.asl.json
    #[test]
    fn items_array_with_expression_element() {
        let r = run(json!([1, "{% $number(\"2\") %}", 3]), json!({}));
        assert_eq!(r, Ok(json!([1, 2, 3])));
    }

    // map-items-expression.asl.json
    #[test]
    fn items_expression() {
        assert_eq!(expr("[1, 'two', 3]", json!({})), Ok(json!([1, "two", 3])));
    }

    // merge-with-input-references.asl.json
    #[test]
    fn merge_with_input_references() {
        let r = expr(
            "$merge([$states.input.part1, $states.input.part2])",
            json!({"part1": {"hello": "world"}, "part2": {"foo": "bar"}}),
        );
        assert_eq!(r, Ok(json!({"hello": "world", "foo": "bar"})));
    }

    // output-list-rich.asl.json
    #[test]
    fn output_list_rich() {
        let output = json!([null, 0, 0.1, true, "string", [], "$nosuchvar", "$.no.such.path",
            "{% $states.input %}", {"key": "{% true %}"}]);
        let r = run(output, json!({"input_value": "stringliteral"}));
        assert_eq!(
            r,
            Ok(json!([null, 0, 0.1, true, "string", [], "$nosuchvar", "$.no.such.path",
                {"input_value": "stringliteral"}, {"key": true}]))
        );
    }

    // output-literals-not-evaluated.asl.json
    #[test]
    fn output_literals_not_evaluated() {
        let lst = json!([null, 0, 0.1, true, [], {"constant": 0}, " {% states.input %} ",
            "$states.input", "$no.such.var.path"]);
        let output = json!({
            "constant_null": null, "constant_int": 0, "constant_float": 0.1,
            "constant_bool": true, "constant_str": "constant string",
            "constant_not_jsonata": " {% states.input %} ",
            "constant_varpath_states": "$states.input", "constant_varpath": "$no.such.var.path",
            "constant_jp_input": "$", "constant_jp_input.$": "$",
            "constant_jp_input_path": "$.input_value", "constant_jp_context": "$$",
            "constant_if": "States.Format('Format:{}', 101)",
            "constant_lst_empty": [], "constant_lst": lst, "constant_obj_empty": {},
            "constant_obj": {"in_obj_constant_null": null, "in_obj_constant_lst": lst,
                "in_obj_constant_not_jsonata": " {% states.input %} ",
                "in_obj_constant_obj": {"constant": 0}}
        });
        let q = Query::parse(&output).unwrap();
        assert!(!q.dynamic);
        let r = run(output.clone(), json!({"input_value": "string literal"}));
        assert_eq!(r, Ok(output));
    }

    // output-str-lit.asl.json
    #[test]
    fn output_string_literal() {
        assert_eq!(run(json!("string literal"), json!({})), Ok(json!("string literal")));
    }

    // parse-function.asl.json
    #[test]
    fn parse_function() {
        let r = expr(
            "$parse($states.input.FunctionInput)",
            json!({"FunctionInput": "{\"Arg1\": 1, \"Arg2\": []}"}),
        );
        assert_eq!(r, Ok(json!({"Arg1": 1, "Arg2": []})));
    }

    // range-singleton-is-unwrapped.asl.json
    #[test]
    fn range_singleton_is_unwrapped() {
        let e = "$range($states.input.FunctionInput.fst, $states.input.FunctionInput.snd, \
                 $states.input.FunctionInput.trd)";
        let r = expr(e, json!({"FunctionInput": {"fst": 1, "snd": 9, "trd": 9}}));
        assert_eq!(r, Ok(json!(1)));
        assert_eq!(expr("$range(0, 10, 2)", json!({})), Ok(json!([0, 2, 4, 6, 8, 10])));
        assert_eq!(expr("$range(5, 1, -2)", json!({})), Ok(json!([5, 3, 1])));
    }

    // regex-literal.asl.json
    #[test]
    fn regex_literal() {
        let r = expr("$contains(\"hello$world\", /^hello\\$/)", json!({}));
        assert_eq!(r, Ok(json!(true)));
        assert_eq!(expr("$contains(\"hello\", /^x/)", json!({})), Ok(json!(false)));
    }

    #[test]
    fn regex_functions_follow_jsonata() {
        let input = json!({"s": "Hello wörld, hello WORLD"});
        let m = expr("$match($states.input.s, /(h)ello (w)?/i)", input.clone()).unwrap();
        assert_eq!(
            m,
            json!([
                {"match": "Hello w", "index": 0, "groups": ["H", "w"]},
                {"match": "hello W", "index": 13, "groups": ["h", "W"]}
            ])
        );
        // `index` counts UTF-16 code units, as in JavaScript.
        assert_eq!(expr("$match('😀ab', /b/).index", json!({})), Ok(json!(3)));
        assert_eq!(expr("$match('a1b22', '[0-9]+', 1).match", json!({})), Ok(json!("1")));
        let r = expr(
            "$replace($states.input.s, /(\\w+)ello/, '[$1|$0|$$|$9]')",
            input.clone(),
        );
        assert_eq!(r, Ok(json!("[H|Hello|$|] wörld, [h|hello|$|] WORLD")));
        let r = expr(
            "$replace('abc abc', /b/, function($m) { $uppercase($m.match) & $m.index }, 1)",
            json!({}),
        );
        assert_eq!(r, Ok(json!("aB1c abc")));
        assert_eq!(expr("$replace('a.b.c', '.', '-', 1)", json!({})), Ok(json!("a-b.c")));
        assert_eq!(
            expr("$split('a, b,,c', /,\\s*/)", json!({})),
            Ok(json!(["a", "b", "", "c"]))
        );
        assert_eq!(expr("$split('a,b,c', /,/, 2)", json!({})), Ok(json!(["a", "b"])));
        assert_eq!(expr("$split('abc', '')", json!({})), Ok(json!(["a", "b", "c"])));
        assert_eq!(
            expr("$contains('line1\\nline2', /^line2$/m)", json!({})),
            Ok(json!(true))
        );
        assert_eq!(
            expr("$contains('line1\\nline2', /^line2$/)", json!({})),
            Ok(json!(false))
        );
        // A match of no characters is D1004, as in JSONata.
        assert!(query_error(expr("$match('abc', /x*/)", json!({}))).contains("D1004"));
        let cause = query_error(expr("$split('abc', 5)", json!({})));
        assert!(
            cause.contains("T0410") && cause.contains("split") && !cause.contains("__sm4c"),
            "{cause}"
        );
    }

    #[test]
    fn regex_searches_are_bounded() {
        // Exponential for a backtracking engine: answered at once.
        let input = json!({"s": format!("{}!", "a".repeat(10_000))});
        assert_eq!(
            expr("$contains($states.input.s, /^(a+)+$/)", input.clone()),
            Ok(json!(false))
        );
        assert_eq!(
            expr("$match($states.input.s, '^(a|aa)+$')", input.clone()),
            Ok(json!([]))
        );
        // A backreference needs backtracking: it stops at the limit, with an error naming the pattern.
        let input = json!({"s": "a".repeat(40)});
        let cause = query_error(expr("$contains($states.input.s, /^(a+)+\\1b$/)", input));
        assert!(cause.contains("/^(a+)+\\1b$/") && cause.contains("1000000"), "{cause}");
        // A pattern with no equivalent is refused when the definition is loaded.
        let err = check_expression("$contains('x', /\\uD800/)").unwrap_err();
        assert!(err.contains("lone surrogate"), "{err}");
        let err = check_expression("$contains('x', /(?<=a+)b/)").unwrap_err();
        assert!(err.contains("/(?<=a+)b/"), "{err}");
    }

    // wait-seconds-expression.asl.json
    #[test]
    fn wait_seconds_expression() {
        let r = expr("$states.input.waitSeconds", json!({"waitSeconds": 0}));
        assert_eq!(r, Ok(json!(0)));
    }

    #[test]
    fn whole_numbers_are_integers() {
        assert_eq!(expr("1.5 + 1.5", json!({})), Ok(json!(3)));
        assert_eq!(expr("7 / 2", json!({})), Ok(json!(3.5)));
        assert_eq!(expr("$states.input.n * 2", json!({"n": 21})), Ok(json!(42)));
        assert_eq!(expr("-0.25", json!({})), Ok(json!(-0.25)));
    }

    #[test]
    fn strings_objects_and_arrays() {
        let input = json!({"name": "World", "xs": [1, 2, 3]});
        assert_eq!(
            expr("'Hello ' & $states.input.name", input.clone()),
            Ok(json!("Hello World"))
        );
        assert_eq!(
            expr(
                "{'n': $count($states.input.xs), 'sum': $sum($states.input.xs)}",
                input.clone()
            ),
            Ok(json!({"n": 3, "sum": 6}))
        );
        assert_eq!(expr("$states.input.xs[$ > 1]", input.clone()), Ok(json!([2, 3])));
        assert_eq!(expr("$states.input.xs[0]", input.clone()), Ok(json!(1)));
        assert_eq!(
            expr("$map($states.input.xs, function($x) { $x * 10 })", input),
            Ok(json!([10, 20, 30]))
        );
        assert_eq!(expr("$uppercase('abc')", json!({})), Ok(json!("ABC")));
        assert_eq!(expr("$string(12)", json!({})), Ok(json!("12")));
    }

    #[test]
    fn a_result_nested_deeper_than_the_limit_is_a_query_evaluation_error() {
        let depth = crate::json::MAX_DEPTH;
        let input = (0..depth).fold(json!(1), |v, _| json!([v]));
        assert_eq!(expr("$states.input", input.clone()), Ok(input.clone()));
        let cause = query_error(expr("{'a': $states.input}", input));
        assert!(cause.contains("nested deeper than 64 levels"), "{cause}");
    }

    #[test]
    fn object_order_is_kept_from_the_input_and_sorted_otherwise() {
        let input: Value = serde_json::from_str(r#"{"z": 1, "a": {"y": 2, "b": 3}}"#).unwrap();
        let out = expr("$states.input", input).unwrap();
        assert_eq!(serde_json::to_string(&out).unwrap(), r#"{"z":1,"a":{"y":2,"b":3}}"#);
        let out = expr("{'z': 1, 'a': 2, 'm': 3}", json!({})).unwrap();
        assert_eq!(serde_json::to_string(&out).unwrap(), r#"{"a":2,"m":3,"z":1}"#);
    }

    #[test]
    fn variables() {
        let vars = json!({"x": 5, "obj": {"k": "v"}, "unused": [1]});
        assert_eq!(run_with(json!("{% $x + 1 %}"), json!({}), vars.clone()), Ok(json!(6)));
        assert_eq!(run_with(json!("{% $obj.k %}"), json!({}), vars.clone()), Ok(json!("v")));
        assert_eq!(
            run_with(json!({"a": "{% $x %}", "b": ["{% $obj %}"]}), json!({}), vars),
            Ok(json!({"a": 5, "b": [{"k": "v"}]}))
        );
    }

    #[test]
    fn states_members() {
        let q = Query::parse(&json!("{% $states.result.v & $states.context.State.Name %}")).unwrap();
        let states = json!({"input": {}, "context": {"State": {"Name": "S"}}, "result": {"v": "r"}});
        let (vars, rng) = (Map::new(), Cell::new(Random::new(0)));
        let env = Env {
            input: &states["input"],
            context: &states["context"],
            vars: &vars,
            rng: &rng,
        };
        assert_eq!(q.eval(&states, &env), Ok(json!("rS")));
    }

    #[test]
    fn partition() {
        assert_eq!(
            expr("$partition([1, 2, 3, 4, 5], 2)", json!({})),
            Ok(json!([[1, 2], [3, 4], [5]]))
        );
        query_error(expr("$partition([1], 0)", json!({})));
    }

    #[test]
    fn random_and_uuid_are_deterministic() {
        let a = expr("[$random(), $random(), $uuid()]", json!({})).unwrap();
        let b = expr("[$random(), $random(), $uuid()]", json!({})).unwrap();
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
        let r = a[0].as_f64().unwrap();
        assert!((0.0..1.0).contains(&r));
        let u = a[2].as_str().unwrap();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_eq!(expr("$random(3) = $random(3)", json!({})), Ok(json!(true)));
    }

    #[test]
    fn random_advances_the_instance_source() {
        let q = Query::parse(&json!("{% $random() %}")).unwrap();
        let (vars, rng) = (Map::new(), Cell::new(Random::new(1)));
        let states = json!({"input": {}, "context": {}});
        let env = Env {
            input: &Value::Null,
            context: &Value::Null,
            vars: &vars,
            rng: &rng,
        };
        let a = q.eval(&states, &env).unwrap();
        assert_ne!(rng.get(), Random::new(1));
        let b = q.eval(&states, &env).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn now_is_the_entered_time() {
        assert_eq!(expr("$now()", json!({})), Ok(json!("2024-05-06T07:08:09.123Z")));
        assert_eq!(expr("$millis()", json!({})), Ok(json!(1_714_979_289_123_i64)));
    }

    #[test]
    fn undefined_is_an_error() {
        let cause = query_error(expr("$states.input.nosuch", json!({})));
        assert!(cause.contains("returned nothing"), "{cause}");
        query_error(run(json!({"a": ["{% $nosuchvar %}"]}), json!({})));
        query_error(expr("$range(1, 0, 1)", json!({})));
    }

    #[test]
    fn evaluation_errors() {
        query_error(expr("1 + 'a'", json!({})));
        query_error(expr("$parse('{not json')", json!({})));
        query_error(expr("$error('boom')", json!({})));
        query_error(expr("$nosuchfunction(1)", json!({})));
        query_error(expr("function($x) { $x }", json!({})));
        query_error(expr("1 / 0", json!({})));
        query_error(expr("$range(1, 100000, 1)", json!({})));
        let deep = "($f := function($n) { $n = 0 ? 0 : 1 + $f($n - 1) }; $f(100000))";
        query_error(expr(deep, json!({})));
    }

    #[test]
    fn syntax_errors_have_pointers() {
        let errs = Query::parse(&json!({"a": ["x", "{% 1 + %}"], "b/c": "{% ( %}", "d": "{%  %}"})).unwrap_err();
        let pointers: Vec<&str> = errs.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(pointers, ["/a/1", "/b~1c", "/d"]);
        assert_eq!(Query::parse(&json!("{% ) %}")).unwrap_err()[0].0, "");
        assert!(check_expression("1) + (2").is_err());
    }

    #[test]
    fn deep_nesting_is_refused() {
        let deep = format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(check_expression(&deep).is_err());
        let minus = format!("{}1", "-".repeat(10_000));
        assert!(check_expression(&minus).is_err());
        let arrays = format!("{}1{}", "[".repeat(50), "]".repeat(50));
        assert!(expr(&arrays, json!({})).is_ok());
    }

    #[test]
    fn top_level_regex_and_error_positions() {
        assert_eq!(
            expr("($x := 'abc'; $replace($x, /b/, 'x'))", json!({})),
            Ok(json!("axc"))
        );
        assert!(expr("$string(/abc/ = 1)", json!({})).is_ok());
        let cause = query_error(expr("$number('x')", json!({})));
        assert!(cause.contains("D3030 @ 0:"), "{cause}");
    }

    #[test]
    fn added_functions() {
        assert_eq!(
            expr("$type('a') & $type(1) & $type([]) & $type({})", json!({})),
            Ok(json!("stringnumberarrayobject"))
        );
        assert_eq!(expr("$average([1, 2, 4, 5])", json!({})), Ok(json!(3)));
        assert_eq!(
            expr("$hash('input data', 'SHA-384')", json!({})),
            Ok(json!(
                "d28a7d5cf25a74f11a50a18452b75e04bb3d70c9dd0510d6123aa008c756511b87525bdc835ebb27e1fb9e9374a15562"
            ))
        );
        assert_eq!(
            expr("$hash('abc', 'SHA-256')", json!({})),
            Ok(json!(
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
            ))
        );
        assert_eq!(
            expr("$hash('abc', 'MD5')", json!({})),
            Ok(json!("900150983cd24fb0d6963f7d28e17f72"))
        );
        query_error(expr("$hash('a', 'SHA-3')", json!({})));
        query_error(expr("$hash(1, 'MD5')", json!({})));
    }

    #[test]
    fn now_without_a_time_is_undefined() {
        let q = Query::parse(&json!("{% $now() %}")).unwrap();
        let (vars, rng) = (Map::new(), Cell::new(Random::new(0)));
        let states = json!({"input": {}, "context": {}});
        let env = Env {
            input: &Value::Null,
            context: &states["context"],
            vars: &vars,
            rng: &rng,
        };
        query_error(q.eval(&states, &env));
    }

    #[test]
    fn a_product_of_ranges_stops_at_the_step_budget() {
        let cause = query_error(expr("[1..10000000].[1..10000000]", json!({})));
        assert!(cause.contains(&format!("budget of {MAX_STEPS} steps")), "{cause}");
    }

    #[test]
    fn loops_stop_at_a_budget() {
        // Every step of these allocates a little, so the memory budget may stop them first.
        for e in [
            "[1..1000000].$sum([1..1000])",
            "[1..5000].$reduce([1..5000], function($a, $b) { $a })",
            "($f := function($n) { $n = 0 ? 0 : $f($n - 1) }; [1..100000].$f(90))",
        ] {
            let cause = query_error(expr(e, json!({})));
            assert!(cause.contains("the JSONata evaluation budget of"), "{cause}");
        }
    }

    #[test]
    fn building_a_large_value_stops_at_the_memory_budget() {
        // Few steps, each doubling a string: the memory budget stops it.
        let cause = query_error(expr(
            "($p := function($s, $n) { $n = 0 ? $s : $p($s & $s, $n - 1) }; $length($p('x', 40)))",
            json!({}),
        ));
        assert!(cause.contains(&format!("budget of {MAX_BYTES} bytes")), "{cause}");
    }

    #[test]
    fn the_budget_stops_at_the_same_point_every_time() {
        let first = query_error(expr("[1..3000000].{'a': $}", json!({})));
        let second = query_error(expr("[1..3000000].{'a': $}", json!({})));
        assert_eq!(first, second);
        assert!(first.contains("budget"), "{first}");
    }

    #[test]
    fn work_within_the_budget_is_untouched() {
        assert_eq!(expr("$sum([1..100000])", json!({})).unwrap(), json!(5000050000u64));
        assert_eq!(expr("$count([1..100000].($ * 2))", json!({})).unwrap(), json!(100000));
    }
}
