//! Choice rules (JSONPath Choice states) and ASL timestamps.
//!
//! A rule is parsed once ([`Rule::parse`], which reports every problem with a pointer relative to
//! the rule) and tested against an [`Env`] ([`Rule::test`]). As AWS does, a comparison on a value
//! of the wrong type is simply false (`StringEquals` on a number, `BooleanEquals: false` on `0`,
//! `TimestampEquals` on a string that is not a timestamp), while a `Variable` or `...Path` operand
//! that selects nothing is a `States.Runtime` error, except for `IsPresent`, which is then false.

use super::path::Path;
use super::{names, AslError, Env};
use serde_json::{Number, Value};
use std::borrow::Cow;
use std::cmp::Ordering;

/// How deeply `And`, `Or` and `Not` may nest (far beyond any real definition; it keeps the
/// recursive parse and test off the end of the stack).
const MAX_DEPTH: usize = 100;

/// A Choice rule: a comparison, an `Is*` test, or `And`/`Or`/`Not`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    expr: Expr,
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    And(Vec<Rule>),
    Or(Vec<Rule>),
    Not(Box<Rule>),
    Test { variable: Path, test: Test },
}

#[derive(Debug, Clone, PartialEq)]
enum Test {
    /// `StringEquals`, `NumericLessThanPath`, ...
    Compare { kind: Kind, cmp: Cmp, operand: Operand },
    /// `StringMatches`, the pattern already split into literal characters and wildcards.
    Matches(Vec<Glob>),
    /// `IsNull`, `IsPresent`, ... with the expected answer (`"IsNull": false` is true on `0`).
    Is { kind: IsKind, expected: bool },
}

/// The type a comparison works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    String,
    Numeric,
    Boolean,
    Timestamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Eq,
    Lt,
    Gt,
    Le,
    Ge,
}

impl Cmp {
    fn holds(self, ord: Ordering) -> bool {
        match self {
            Cmp::Eq => ord == Ordering::Equal,
            Cmp::Lt => ord == Ordering::Less,
            Cmp::Gt => ord == Ordering::Greater,
            Cmp::Le => ord != Ordering::Greater,
            Cmp::Ge => ord != Ordering::Less,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IsKind {
    Null,
    Present,
    Numeric,
    String,
    Boolean,
    Timestamp,
}

/// The right-hand side of a comparison: the literal, or the Path of a `...Path` operator.
#[derive(Debug, Clone, PartialEq)]
enum Operand {
    Literal(Value),
    Path(Path),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Glob {
    Char(char),
    Star,
}

/// A field of a rule that is an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    And,
    Or,
    Not,
    Compare(Kind, Cmp, bool),
    Matches,
    Is(IsKind),
}

/// The operator a field name stands for, if any (`NumericEqualsPath` is
/// `Compare(Numeric, Eq, true)`).
fn operator(name: &str) -> Option<Op> {
    let op = match name {
        "And" => Op::And,
        "Or" => Op::Or,
        "Not" => Op::Not,
        "StringMatches" => Op::Matches,
        "IsNull" => Op::Is(IsKind::Null),
        "IsPresent" => Op::Is(IsKind::Present),
        "IsNumeric" => Op::Is(IsKind::Numeric),
        "IsString" => Op::Is(IsKind::String),
        "IsBoolean" => Op::Is(IsKind::Boolean),
        "IsTimestamp" => Op::Is(IsKind::Timestamp),
        _ => {
            let (base, path) = match name.strip_suffix("Path") {
                Some(base) => (base, true),
                None => (name, false),
            };
            let (kind, rest) = if let Some(rest) = base.strip_prefix("String") {
                (Kind::String, rest)
            } else if let Some(rest) = base.strip_prefix("Numeric") {
                (Kind::Numeric, rest)
            } else if let Some(rest) = base.strip_prefix("Boolean") {
                (Kind::Boolean, rest)
            } else if let Some(rest) = base.strip_prefix("Timestamp") {
                (Kind::Timestamp, rest)
            } else {
                return None;
            };
            let cmp = match rest {
                "Equals" => Cmp::Eq,
                "LessThan" => Cmp::Lt,
                "GreaterThan" => Cmp::Gt,
                "LessThanEquals" => Cmp::Le,
                "GreaterThanEquals" => Cmp::Ge,
                _ => return None,
            };
            if kind == Kind::Boolean && cmp != Cmp::Eq {
                return None;
            }
            Op::Compare(kind, cmp, path)
        }
    };
    Some(op)
}

/// `at` extended by one JSON Pointer token.
fn ptr(at: &str, key: &str) -> String {
    format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"))
}

/// Collects the problems found while parsing a rule.
struct Errors(Vec<(String, String)>);

impl Errors {
    fn push(&mut self, at: impl Into<String>, msg: impl Into<String>) {
        self.0.push((at.into(), msg.into()));
    }
}

impl Rule {
    /// Parses a rule. `top` is true for an element of `Choices` (which carries `Next`, read by the
    /// caller); nested rules must not have `Next`. Errors are `(pointer relative to the rule, message)`.
    ///
    /// A top-level rule may also carry `Assign` (read by the caller too); any rule may carry a
    /// string `Comment`. Other fields that are not operators are refused.
    pub fn parse(v: &Value, top: bool) -> Result<Rule, Vec<(String, String)>> {
        let mut errs = Errors(Vec::new());
        let rule = parse_rule(v, top, "", 0, &mut errs);
        match rule {
            Some(rule) if errs.0.is_empty() => Ok(rule),
            _ => {
                if errs.0.is_empty() {
                    errs.push("", "not a valid Choice Rule");
                }
                Err(errs.0)
            }
        }
    }

    /// Tests the rule. A `Variable` or `...Path` operand that selects nothing is `States.Runtime`
    /// (for `IsPresent`, the rule is then false); `And` and `Or` stop at the first rule that
    /// decides them.
    pub fn test(&self, env: &Env) -> Result<bool, AslError> {
        match &self.expr {
            Expr::And(rules) => {
                for rule in rules {
                    if !rule.test(env)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            Expr::Or(rules) => {
                for rule in rules {
                    if rule.test(env)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            Expr::Not(rule) => Ok(!rule.test(env)?),
            Expr::Test { variable, test } => match test {
                Test::Is {
                    kind: IsKind::Present,
                    expected,
                } => Ok(variable.read(env).is_ok() == *expected),
                Test::Is { kind, expected } => {
                    let value = read(variable, env)?;
                    Ok(is(*kind, &value) == *expected)
                }
                Test::Matches(pattern) => {
                    let value = read(variable, env)?;
                    Ok(matches!(&value, Value::String(s) if glob_match(pattern, s)))
                }
                Test::Compare { kind, cmp, operand } => {
                    let left = read(variable, env)?;
                    let right = match operand {
                        Operand::Literal(v) => Cow::Borrowed(v),
                        Operand::Path(p) => Cow::Owned(read(p, env)?),
                    };
                    Ok(compare(*kind, *cmp, &left, &right))
                }
            },
        }
    }
}

/// Reads a condition path; a path that selects nothing fails with AWS's cause.
fn read(path: &Path, env: &Env) -> Result<Value, AslError> {
    path.read(env).map_err(|e| {
        if e.error.as_deref() == Some(names::RUNTIME) {
            AslError::runtime(format!(
                "Invalid path '{}': The choice state's condition path references an invalid value.",
                path.text()
            ))
        } else {
            e
        }
    })
}

fn parse_rule(v: &Value, top: bool, at: &str, depth: usize, errs: &mut Errors) -> Option<Rule> {
    let Some(o) = v.as_object() else {
        errs.push(at, "a Choice Rule must be an object");
        return None;
    };
    if depth > MAX_DEPTH {
        errs.push(
            at,
            format!("Choice Rules nest too deeply (more than {MAX_DEPTH} levels)"),
        );
        return None;
    }
    let mut ops: Vec<(&str, Op, &Value)> = Vec::new();
    let mut variable = None;
    for (key, value) in o {
        match key.as_str() {
            "Variable" => variable = Some(value),
            "Comment" => {
                if !value.is_string() {
                    errs.push(ptr(at, key), "must be a string");
                }
            }
            "Next" | "Assign" if top => {}
            "Next" | "Assign" => errs.push(ptr(at, key), "not allowed in a Choice Rule nested in And, Or or Not"),
            "Condition" | "Output" => errs.push(
                ptr(at, key),
                "unknown field in a JSONPath Choice Rule (it needs QueryLanguage JSONata)",
            ),
            _ => match operator(key) {
                Some(op) => ops.push((key, op, value)),
                None => errs.push(ptr(at, key), "unknown field in a Choice Rule"),
            },
        }
    }
    let (name, op, value) = match ops.as_slice() {
        [] => {
            errs.push(
                at,
                "missing a comparison operator (such as StringEquals or IsPresent) or And, Or, Not",
            );
            if let Some(v) = variable {
                parse_path(v, &ptr(at, "Variable"), errs);
            }
            return None;
        }
        [one] => *one,
        many => {
            let names: Vec<&str> = many.iter().map(|(n, _, _)| *n).collect();
            errs.push(
                at,
                format!(
                    "has {} operators ({}): a Choice Rule must have exactly one",
                    many.len(),
                    names.join(", ")
                ),
            );
            return None;
        }
    };
    let at_op = ptr(at, name);
    let expr = match op {
        Op::And | Op::Or | Op::Not => {
            if variable.is_some() {
                errs.push(ptr(at, "Variable"), format!("not allowed with {name}"));
            }
            if op == Op::Not {
                let rule = parse_rule(value, false, &at_op, depth + 1, errs)?;
                Expr::Not(Box::new(rule))
            } else {
                let rules = match value.as_array() {
                    Some(items) if !items.is_empty() => items,
                    _ => {
                        errs.push(at_op, "must be a non-empty array of Choice Rules");
                        return None;
                    }
                };
                let mut parsed = Vec::with_capacity(rules.len());
                for (i, r) in rules.iter().enumerate() {
                    if let Some(rule) = parse_rule(r, false, &format!("{at_op}/{i}"), depth + 1, errs) {
                        parsed.push(rule);
                    }
                }
                if parsed.len() != rules.len() {
                    return None;
                }
                if op == Op::And {
                    Expr::And(parsed)
                } else {
                    Expr::Or(parsed)
                }
            }
        }
        Op::Compare(kind, cmp, is_path) => {
            let variable = parse_variable(variable, at, errs);
            let operand = if is_path {
                parse_path(value, &at_op, errs).map(Operand::Path)
            } else {
                parse_literal(kind, value, &at_op, errs).map(Operand::Literal)
            };
            Expr::Test {
                variable: variable?,
                test: Test::Compare {
                    kind,
                    cmp,
                    operand: operand?,
                },
            }
        }
        Op::Matches => {
            let variable = parse_variable(variable, at, errs);
            let pattern = match value {
                Value::String(s) => match parse_glob(s) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        errs.push(at_op, e);
                        None
                    }
                },
                _ => {
                    errs.push(at_op, "must be a string");
                    None
                }
            };
            Expr::Test {
                variable: variable?,
                test: Test::Matches(pattern?),
            }
        }
        Op::Is(kind) => {
            let variable = parse_variable(variable, at, errs);
            let expected = match value {
                Value::Bool(b) => Some(*b),
                _ => {
                    errs.push(at_op, "must be a boolean");
                    None
                }
            };
            Expr::Test {
                variable: variable?,
                test: Test::Is {
                    kind,
                    expected: expected?,
                },
            }
        }
    };
    Some(Rule { expr })
}

/// The `Variable` of a data-test rule, which must be there.
fn parse_variable(variable: Option<&Value>, at: &str, errs: &mut Errors) -> Option<Path> {
    match variable {
        Some(v) => parse_path(v, &ptr(at, "Variable"), errs),
        None => {
            errs.push(at, "missing required field `Variable`");
            None
        }
    }
}

fn parse_path(v: &Value, at: &str, errs: &mut Errors) -> Option<Path> {
    match v {
        Value::String(s) => match Path::parse(s) {
            Ok(p) => Some(p),
            Err(e) => {
                errs.push(at, format!("not a valid Path: {e}"));
                None
            }
        },
        _ => {
            errs.push(at, "must be a Path (a string starting with `$`)");
            None
        }
    }
}

fn parse_literal(kind: Kind, v: &Value, at: &str, errs: &mut Errors) -> Option<Value> {
    let ok = match kind {
        Kind::String => v.is_string(),
        Kind::Numeric => v.is_number(),
        Kind::Boolean => v.is_boolean(),
        Kind::Timestamp => match v {
            Value::String(s) => {
                if parse_timestamp(s).is_none() {
                    errs.push(
                        at,
                        "must be a timestamp such as \"2016-03-14T01:59:00Z\" (RFC 3339 with \
                         `T` and `Z` or an offset)",
                    );
                    return None;
                }
                true
            }
            _ => false,
        },
    };
    if ok {
        Some(v.clone())
    } else {
        let what = match kind {
            Kind::String => "must be a string",
            Kind::Numeric => "must be a number",
            Kind::Boolean => "must be a boolean",
            Kind::Timestamp => "must be a timestamp string",
        };
        errs.push(at, what);
        None
    }
}

/// Splits a `StringMatches` pattern into characters and `*` wildcards; `\*` is a literal `*` and
/// `\\` a literal `\`. Any other backslash is an open escape, which the spec makes an error.
fn parse_glob(s: &str) -> Result<Vec<Glob>, String> {
    let mut out = Vec::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        out.push(match c {
            '*' => Glob::Star,
            '\\' => match chars.next() {
                Some('*') => Glob::Char('*'),
                Some('\\') => Glob::Char('\\'),
                Some(other) => {
                    return Err(format!(
                        "open escape `\\{other}`: only `\\*` and `\\\\` are escapes (write \
                         `\\\\` for a backslash)"
                    ))
                }
                None => return Err("ends with an open escape backslash (write `\\\\` for a backslash)".into()),
            },
            c => Glob::Char(c),
        });
    }
    Ok(out)
}

/// True when `s` matches the pattern, `*` standing for any run of characters (possibly empty).
/// Greedy with one backtracking point: at most `pattern.len() * s.len()` steps.
fn glob_match(pattern: &[Glob], s: &str) -> bool {
    let text: Vec<char> = s.chars().collect();
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while let Some(&c) = text.get(t) {
        match pattern.get(p) {
            Some(Glob::Star) => {
                star = Some((p, t));
                p += 1;
            }
            Some(Glob::Char(g)) if *g == c => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern.iter().skip(p).all(|g| *g == Glob::Star)
}

fn is(kind: IsKind, v: &Value) -> bool {
    match kind {
        IsKind::Null => v.is_null(),
        // IsPresent is decided by whether the path reads at all; a value read is present.
        IsKind::Present => true,
        IsKind::Numeric => v.is_number(),
        IsKind::String => v.is_string(),
        IsKind::Boolean => v.is_boolean(),
        IsKind::Timestamp => matches!(v, Value::String(s) if parse_timestamp(s).is_some()),
    }
}

/// A comparison on plain values: false unless both are of the operator's type (strings that are
/// timestamps for `Timestamp*`). Strings compare by Unicode code points, numbers as numbers
/// (`1 == 1.0`), timestamps as instants.
fn compare(kind: Kind, cmp: Cmp, left: &Value, right: &Value) -> bool {
    let ord = match (kind, left, right) {
        // UTF-8 byte order is code point order.
        (Kind::String, Value::String(a), Value::String(b)) => a.as_str().cmp(b.as_str()),
        (Kind::Numeric, Value::Number(a), Value::Number(b)) => match number_cmp(a, b) {
            Some(ord) => ord,
            None => return false,
        },
        (Kind::Boolean, Value::Bool(a), Value::Bool(b)) => a.cmp(b),
        (Kind::Timestamp, Value::String(a), Value::String(b)) => match (parse_timestamp(a), parse_timestamp(b)) {
            (Some(a), Some(b)) => a.cmp(&b),
            _ => return false,
        },
        _ => return false,
    };
    cmp.holds(ord)
}

/// Numbers compare exactly when both are integers, as binary64 otherwise.
fn number_cmp(a: &Number, b: &Number) -> Option<Ordering> {
    fn int(n: &Number) -> Option<i128> {
        n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from))
    }
    match (int(a), int(b)) {
        (Some(a), Some(b)) => Some(a.cmp(&b)),
        _ => a.as_f64()?.partial_cmp(&b.as_f64()?),
    }
}

/// An ASL timestamp (RFC 3339 with a `T` and a `Z` or offset, any number of fraction digits) as
/// nanoseconds since the Unix epoch; `None` when `s` is not one.
///
/// The form is `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)` with an uppercase `T` and `Z`,
/// a real calendar date and a time up to `23:59:59`; fraction digits past the ninth are dropped.
pub fn parse_timestamp(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    let year = digits(b, 0, 4)?;
    byte(b, 4, b'-')?;
    let month = digits(b, 5, 2)?;
    byte(b, 7, b'-')?;
    let day = digits(b, 8, 2)?;
    byte(b, 10, b'T')?;
    let hour = digits(b, 11, 2)?;
    byte(b, 13, b':')?;
    let minute = digits(b, 14, 2)?;
    byte(b, 16, b':')?;
    let second = digits(b, 17, 2)?;
    let mut i = 19;
    let mut nanos: i128 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        let mut scale: i128 = 100_000_000;
        while let Some(d) = b.get(i).filter(|c| c.is_ascii_digit()) {
            nanos += i128::from(d - b'0') * scale;
            scale /= 10;
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let offset = match b.get(i) {
        Some(b'Z') => {
            i += 1;
            0
        }
        Some(&sign @ (b'+' | b'-')) => {
            let oh = digits(b, i + 1, 2)?;
            byte(b, i + 3, b':')?;
            let om = digits(b, i + 4, 2)?;
            if oh > 23 || om > 59 {
                return None;
            }
            i += 6;
            let secs = i128::from(oh * 3600 + om * 60);
            if sign == b'-' {
                -secs
            } else {
                secs
            }
        }
        _ => return None,
    };
    if i != b.len()
        || !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let days = days_from_civil(i128::from(year), i128::from(month), i128::from(day));
    let secs = days * 86_400 + i128::from(hour * 3600 + minute * 60 + second) - offset;
    Some(secs * 1_000_000_000 + nanos)
}

/// `n` ASCII digits of `b` from `at`.
fn digits(b: &[u8], at: usize, n: usize) -> Option<u32> {
    let part = b.get(at..at.checked_add(n)?)?;
    part.iter().try_fold(0u32, |acc, c| {
        c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
    })
}

fn byte(b: &[u8], at: usize, want: u8) -> Option<()> {
    (b.get(at) == Some(&want)).then_some(())
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i128, m: i128, d: i128) -> i128 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Random;
    use serde_json::{json, Map};
    use std::cell::Cell;

    // ---- helpers ----

    /// Parses `rule` as a top-level rule and tests it on `input` (the context object's
    /// `Execution.Input` is the input too).
    fn run(rule: Value, input: Value) -> Result<bool, AslError> {
        let rule = match Rule::parse(&rule, true) {
            Ok(r) => r,
            Err(e) => panic!("rule refused: {e:?}"),
        };
        let context = json!({"Execution": {"Input": input.clone()}});
        let vars = Map::new();
        let rng = Cell::new(Random::new(0));
        let env = Env {
            input: &input,
            context: &context,
            vars: &vars,
            rng: &rng,
        };
        rule.test(&env)
    }

    /// The LocalStack choice-operator template: `{"Variable": "$.Variable", OP: operand}` on
    /// `{"Variable": variable, "Value": value}`.
    fn template(op: &str, operand: Value, variable: Value, value: Value) -> bool {
        let mut rule = json!({"Variable": "$.Variable", "Next": "ConditionTrue"});
        rule[op] = operand;
        match run(rule, json!({"Variable": variable, "Value": value})) {
            Ok(b) => b,
            Err(e) => panic!("{op}: unexpected error {e:?}"),
        }
    }

    fn errors(rule: Value, top: bool) -> Vec<(String, String)> {
        match Rule::parse(&rule, top) {
            Ok(r) => panic!("accepted: {r:?}"),
            Err(e) => e,
        }
    }

    fn has_error(errs: &[(String, String)], at: &str, needle: &str) -> bool {
        errs.iter().any(|(p, m)| p == at && m.contains(needle))
    }

    fn ts(s: &str) -> i128 {
        match parse_timestamp(s) {
            Some(n) => n,
            None => panic!("not a timestamp: {s}"),
        }
    }

    const SEC: i128 = 1_000_000_000;

    // ---- parse_timestamp (no Path needed) ----

    #[test]
    fn timestamp_seconds_and_offsets() {
        assert_eq!(ts("1970-01-01T00:00:00Z"), 0);
        assert_eq!(ts("2012-10-09T19:00:55Z"), 1_349_809_255 * SEC);
        assert_eq!(ts("2012-10-09T20:00:55+01:00"), 1_349_809_255 * SEC);
        assert_eq!(ts("2012-10-09T18:30:55-00:30"), 1_349_809_255 * SEC);
        assert_eq!(ts("2000-02-29T12:00:00Z"), 951_825_600 * SEC);
        assert_eq!(ts("0001-01-01T00:00:00Z"), -62_135_596_800 * SEC);
        assert_eq!(ts("9999-12-31T23:59:59Z"), 253_402_300_799 * SEC);
        assert_eq!(ts("1969-12-31T23:59:59Z"), -SEC);
    }

    #[test]
    fn timestamp_fractions_any_number_of_digits() {
        // wait/timestamp-in-past-nanoseconds, wait/timestamp-path-in-past-nanoseconds
        assert_eq!(ts("2016-03-05T21:29:29.243167252Z"), 1_457_213_369 * SEC + 243_167_252);
        // wait/timestamp-in-past-seconds, wait/timestamp-path-in-past-seconds
        assert_eq!(ts("2016-03-14T01:59:00Z"), 1_457_920_740 * SEC);
        // wait/timestamp-path-two-digit-fraction
        assert_eq!(ts("2016-03-14T01:59:00.00Z"), 1_457_920_740 * SEC);
        assert_eq!(ts("2016-03-14T01:59:00.5Z"), 1_457_920_740 * SEC + SEC / 2);
        assert_eq!(
            ts("2016-03-14T01:59:00.1234567891234Z"),
            1_457_920_740 * SEC + 123_456_789
        );
    }

    #[test]
    fn timestamp_refusals() {
        for bad in [
            "2016-13-05T21:29:29Z",       // wait/timestamp-path-invalid-date-is-states-runtime
            "2016-12-05T25:29:29Z",       // wait/timestamp-path-invalid-time-is-states-runtime
            "2016-12-05 21:29:29Z",       // wait/timestamp-path-no-t-is-states-runtime
            "2016-12-05T21:29:29",        // wait/timestamp-path-no-z-is-states-runtime
            "2023-02-24 12:15:56.832957", // choice/timestamp-equals-non-timestamp-is-false
            "2012-10-09T19:00:55",
            "2023-02-24",
            "",
            "2016-12-05t21:29:29Z",
            "2016-12-05T21:29:29z",
            "2016-02-30T00:00:00Z",
            "2015-02-29T00:00:00Z",
            "2016-00-10T00:00:00Z",
            "2016-01-00T00:00:00Z",
            "2016-01-01T00:60:00Z",
            "2016-01-01T00:00:60Z",
            "2016-01-01T00:00:00.Z",
            "2016-01-01T00:00:00+0100",
            "2016-01-01T00:00:00+24:00",
            "2016-01-01T00:00:00+01",
            "2016-01-01T00:00:00Z ",
            " 2016-01-01T00:00:00Z",
            "2016-01-01T00:00Z",
            "16-01-01T00:00:00Z",
            "+2016-01-01T00:00:00Z",
            "2016-1-01T00:00:00Z",
            "２016-01-01T00:00:00Z",
            "2016-01-01T00:00:00ZZ",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad:?}");
        }
        assert!(parse_timestamp("1900-02-28T00:00:00Z").is_some());
        assert!(parse_timestamp("1900-02-29T00:00:00Z").is_none());
    }

    // ---- comparisons on plain values (no Path needed) ----

    #[test]
    fn compare_strings_by_code_points() {
        let s = |a: &str, cmp, b: &str| compare(Kind::String, cmp, &json!(a), &json!(b));
        assert!(s("Hello", Cmp::Eq, "Hello"));
        assert!(!s(" ", Cmp::Eq, "     "));
        assert!(!s("\t\n", Cmp::Eq, "\t\r\n"));
        assert!(s("A", Cmp::Lt, "AB"));
        assert!(!s("A", Cmp::Gt, "A "));
        assert!(s("AB", Cmp::Ge, "A"));
        assert!(s("", Cmp::Ge, ""));
        assert!(s("", Cmp::Le, ""));
        assert!(!s("AB", Cmp::Le, "A"));
        assert!(s("Z", Cmp::Lt, "a"));
        assert!(s("\u{FFFF}", Cmp::Lt, "\u{10000}"));
        assert!(s("é", Cmp::Gt, "z"));
        assert!(!compare(Kind::String, Cmp::Eq, &json!(1), &json!("1")));
        assert!(!compare(Kind::String, Cmp::Eq, &json!(null), &json!("")));
    }

    #[test]
    fn compare_numbers_as_numbers() {
        let n = |a: Value, cmp, b: Value| compare(Kind::Numeric, cmp, &a, &b);
        assert!(n(json!(1), Cmp::Eq, json!(1.0)));
        assert!(n(json!(0), Cmp::Eq, json!(0.0)));
        assert!(n(json!(0.0), Cmp::Ge, json!(0)));
        assert!(n(json!(2.22), Cmp::Eq, json!(2.22)));
        assert!(!n(json!(1.1), Cmp::Eq, json!(1)));
        assert!(n(json!(-1), Cmp::Lt, json!(0)));
        assert!(n(json!(u64::MAX), Cmp::Gt, json!(i64::MAX)));
        assert!(n(json!(i64::MIN), Cmp::Lt, json!(u64::MAX)));
        assert!(n(json!(1e300), Cmp::Gt, json!(u64::MAX)));
        assert!(!n(json!("1"), Cmp::Eq, json!(1)));
        assert!(!n(json!(true), Cmp::Eq, json!(1)));
        assert!(!n(json!(null), Cmp::Eq, json!(0)));
    }

    #[test]
    fn compare_booleans_and_timestamps() {
        assert!(compare(Kind::Boolean, Cmp::Eq, &json!(false), &json!(false)));
        assert!(!compare(Kind::Boolean, Cmp::Eq, &json!(0), &json!(false)));
        assert!(!compare(Kind::Boolean, Cmp::Eq, &json!(null), &json!(false)));
        assert!(!compare(Kind::Boolean, Cmp::Eq, &json!("true"), &json!(true)));
        let t = |a: &str, cmp, b: &str| compare(Kind::Timestamp, cmp, &json!(a), &json!(b));
        assert!(t("2012-10-09T19:00:55Z", Cmp::Eq, "2012-10-09T19:00:55Z"));
        assert!(t("2012-10-09T20:00:55+01:00", Cmp::Eq, "2012-10-09T19:00:55Z"));
        assert!(t("2012-10-09T19:00:55.000Z", Cmp::Eq, "2012-10-09T19:00:55Z"));
        assert!(t("2012-10-09T19:00:55Z", Cmp::Lt, "2012-10-09T19:00:56Z"));
        assert!(!t("2012-10-09T19:00:56Z", Cmp::Le, "2012-10-09T19:00:55Z"));
        assert!(!t("2023-02-24 12:15:56.832957", Cmp::Eq, "2012-10-09T19:00:55Z"));
        assert!(!t("2012-10-09T19:00:55", Cmp::Le, "2012-10-09T19:00:55Z"));
        assert!(!compare(
            Kind::Timestamp,
            Cmp::Eq,
            &json!(1_349_809_255),
            &json!("2012-10-09T19:00:55Z")
        ));
    }

    #[test]
    fn is_tests_on_plain_values() {
        assert!(is(IsKind::Null, &json!(null)));
        assert!(!is(IsKind::Null, &json!(0)));
        assert!(is(IsKind::Numeric, &json!(1.1)));
        assert!(!is(IsKind::Numeric, &json!(" ")));
        assert!(!is(IsKind::Numeric, &json!("1")));
        assert!(is(IsKind::String, &json!("2012-10-09T19:00:55")));
        assert!(!is(IsKind::String, &json!([])));
        assert!(is(IsKind::Boolean, &json!(false)));
        assert!(!is(IsKind::Boolean, &json!(0)));
        assert!(is(IsKind::Timestamp, &json!("2012-10-09T19:00:55Z")));
        assert!(!is(IsKind::Timestamp, &json!("2012-10-09T19:00:55")));
        assert!(!is(IsKind::Timestamp, &json!(0)));
    }

    #[test]
    fn string_matches_wildcards_and_escapes() {
        let m = |pat: &str, s: &str| match parse_glob(pat) {
            Ok(p) => glob_match(&p, s),
            Err(e) => panic!("{pat:?}: {e}"),
        };
        // The spec's examples.
        assert!(m("foo*.log", "foo23.log"));
        assert!(m("*.log", "zebra.log"));
        assert!(m("foo*.*", "foobar.zebra"));
        assert!(!m("foo*.log", "foo23.txt"));
        assert!(!m("*.log", "zebra.log.gz"));
        assert!(m("*", ""));
        assert!(m("**", "abc"));
        assert!(m("", ""));
        assert!(!m("", "a"));
        assert!(m("a*b*c", "aXbYbZc"));
        assert!(!m("a*b*c", "aXbYbZ"));
        assert!(m("*a", "aaa"));
        assert!(m("é*ü", "éxyzü"));
        assert!(!m("abc", "ab"));
        assert!(!m("ab", "abc"));
        // No character but `*` is special.
        assert!(m("a?c.[x]", "a?c.[x]"));
        assert!(!m("a?c", "abc"));
        // `\*` is a literal star, `\\` a literal backslash.
        assert!(m("a\\*b", "a*b"));
        assert!(!m("a\\*b", "aXb"));
        assert!(m("a\\\\b", "a\\b"));
        assert!(m("a\\\\*", "a\\anything"));
        assert!(m("\\**", "*x"));
        assert!(!m("\\**", "x*"));
        // An open escape is refused.
        assert!(parse_glob("a\\").is_err());
        assert!(parse_glob("a\\b").is_err());
        // Worst case stays quadratic, not exponential.
        let long = "a".repeat(2000);
        assert!(!m(&format!("{}b", "*a".repeat(50)), &long));
    }

    #[test]
    fn operator_names() {
        assert_eq!(
            operator("NumericEqualsPath"),
            Some(Op::Compare(Kind::Numeric, Cmp::Eq, true))
        );
        assert_eq!(
            operator("TimestampGreaterThanEquals"),
            Some(Op::Compare(Kind::Timestamp, Cmp::Ge, false))
        );
        assert_eq!(
            operator("StringLessThanEqualsPath"),
            Some(Op::Compare(Kind::String, Cmp::Le, true))
        );
        assert_eq!(
            operator("BooleanEqualsPath"),
            Some(Op::Compare(Kind::Boolean, Cmp::Eq, true))
        );
        assert_eq!(operator("IsTimestamp"), Some(Op::Is(IsKind::Timestamp)));
        for bad in [
            "BooleanLessThan",
            "StringMatchesPath",
            "IsNullPath",
            "stringEquals",
            "StringEqual",
            "Path",
            "NumericPath",
            "Variable",
        ] {
            assert_eq!(operator(bad), None, "{bad}");
        }
    }

    // ---- parse: validation (needs Path::parse) ----

    #[test]
    fn parse_refuses_missing_or_extra_operators() {
        let e = errors(json!({"Variable": "$.a", "Next": "X"}), true);
        assert!(has_error(&e, "", "missing a comparison operator"), "{e:?}");
        let e = errors(
            json!({"Variable": "$.a", "StringEquals": "x", "IsPresent": true, "Next": "X"}),
            true,
        );
        assert!(has_error(&e, "", "StringEquals, IsPresent"), "{e:?}");
        let e = errors(
            json!({"And": [{"Variable": "$.a", "IsNull": true}], "Not": {"Variable": "$.a", "IsNull": true}}),
            true,
        );
        assert!(has_error(&e, "", "exactly one"), "{e:?}");
    }

    #[test]
    fn parse_refuses_missing_variable_and_bad_paths() {
        let e = errors(json!({"StringEquals": "x", "Next": "X"}), true);
        assert!(has_error(&e, "", "`Variable`"), "{e:?}");
        let e = errors(json!({"Variable": 3, "StringEquals": "x"}), true);
        assert!(has_error(&e, "/Variable", "must be a Path"), "{e:?}");
        let e = errors(json!({"Variable": "a.b", "StringEquals": "x"}), true);
        assert!(has_error(&e, "/Variable", "not a valid Path"), "{e:?}");
        let e = errors(json!({"Variable": "$.a", "NumericEqualsPath": 3}), true);
        assert!(has_error(&e, "/NumericEqualsPath", "must be a Path"), "{e:?}");
        let e = errors(json!({"Variable": "$.a", "NumericEqualsPath": "b"}), true);
        assert!(has_error(&e, "/NumericEqualsPath", "not a valid Path"), "{e:?}");
        let e = errors(
            json!({"Variable": "$.a", "And": [{"Variable": "$.a", "IsNull": true}]}),
            true,
        );
        assert!(has_error(&e, "/Variable", "not allowed with And"), "{e:?}");
    }

    #[test]
    fn parse_refuses_wrong_value_types() {
        let cases = [
            ("StringEquals", json!(1), "must be a string"),
            ("StringLessThan", json!(null), "must be a string"),
            ("StringMatches", json!(true), "must be a string"),
            ("NumericEquals", json!("1"), "must be a number"),
            ("NumericGreaterThanEquals", json!(null), "must be a number"),
            ("BooleanEquals", json!(0), "must be a boolean"),
            ("BooleanEquals", json!("true"), "must be a boolean"),
            ("TimestampEquals", json!(0), "must be a timestamp string"),
            ("TimestampLessThan", json!("2016-12-05T21:29:29"), "must be a timestamp"),
            (
                "TimestampGreaterThan",
                json!("2016-13-05T21:29:29Z"),
                "must be a timestamp",
            ),
            ("IsNull", json!("true"), "must be a boolean"),
            ("IsPresent", json!(1), "must be a boolean"),
            ("IsTimestamp", json!(null), "must be a boolean"),
            ("StringMatches", json!("a\\b"), "open escape"),
            ("StringMatches", json!("a\\"), "open escape"),
        ];
        for (op, value, msg) in cases {
            let mut rule = json!({"Variable": "$.a", "Next": "X"});
            rule[op] = value;
            let e = errors(rule, true);
            assert!(has_error(&e, &format!("/{op}"), msg), "{op}: {e:?}");
        }
    }

    #[test]
    fn parse_nested_pointers() {
        let e = errors(
            json!({
                "And": [
                    {"Variable": "$.a", "IsPresent": true},
                    {"Variable": "$.a", "NumericEquals": "x"},
                    {"Or": [{"Not": {"Variable": "$.a", "TimestampEquals": "nope"}}]}
                ],
                "Next": "X"
            }),
            true,
        );
        assert!(has_error(&e, "/And/1/NumericEquals", "must be a number"), "{e:?}");
        assert!(
            has_error(&e, "/And/2/Or/0/Not/TimestampEquals", "must be a timestamp"),
            "{e:?}"
        );
        assert_eq!(e.len(), 2, "{e:?}");
        let e = errors(json!({"And": [], "Next": "X"}), true);
        assert!(has_error(&e, "/And", "non-empty array"), "{e:?}");
        let e = errors(json!({"Or": {"Variable": "$.a", "IsNull": true}}), true);
        assert!(has_error(&e, "/Or", "non-empty array"), "{e:?}");
        let e = errors(json!({"Not": [{"Variable": "$.a", "IsNull": true}]}), true);
        assert!(has_error(&e, "/Not", "must be an object"), "{e:?}");
        let e = errors(json!({"And": [1]}), true);
        assert!(has_error(&e, "/And/0", "must be an object"), "{e:?}");
        let e = errors(json!("StringEquals"), true);
        assert!(has_error(&e, "", "must be an object"), "{e:?}");
    }

    #[test]
    fn parse_next_only_at_top_level() {
        assert!(Rule::parse(&json!({"Variable": "$.a", "IsNull": true, "Next": "X"}), true).is_ok());
        let e = errors(json!({"Variable": "$.a", "IsNull": true, "Next": "X"}), false);
        assert!(has_error(&e, "/Next", "not allowed"), "{e:?}");
        let e = errors(
            json!({"Not": {"Variable": "$.a", "IsNull": true, "Next": "X"}, "Next": "Y"}),
            true,
        );
        assert!(has_error(&e, "/Not/Next", "not allowed"), "{e:?}");
        let e = errors(
            json!({"Or": [{"Variable": "$.a", "IsNull": true}, {"Variable": "$.a", "IsNull": false, "Next": "Z"}]}),
            true,
        );
        assert!(has_error(&e, "/Or/1/Next", "not allowed"), "{e:?}");
    }

    #[test]
    fn parse_fields_in_any_order_and_unknown_fields() {
        let a = Rule::parse(
            &json!({"BooleanEquals": true, "Next": "X", "Variable": "$.result.done"}),
            true,
        );
        let b = Rule::parse(
            &json!({"Variable": "$.result.done", "BooleanEquals": true, "Next": "X"}),
            true,
        );
        assert!(a.is_ok());
        assert_eq!(a, b);
        assert!(Rule::parse(
            &json!({"Comment": "c", "Variable": "$.a", "IsNull": true, "Assign": {"x": 1}, "Next": "X"}),
            true
        )
        .is_ok());
        let e = errors(
            json!({"Variable": "$.a", "IsNull": true, "Bogus/x": 1, "Next": "X"}),
            true,
        );
        assert!(has_error(&e, "/Bogus~1x", "unknown field"), "{e:?}");
        let e = errors(json!({"Variable": "$.a", "BooleanLessThan": true}), true);
        assert!(has_error(&e, "/BooleanLessThan", "unknown field"), "{e:?}");
        let e = errors(json!({"Condition": "{% true %}", "Next": "X"}), true);
        assert!(has_error(&e, "/Condition", "JSONata"), "{e:?}");
    }

    #[test]
    fn parse_refuses_absurd_nesting_without_overflow() {
        let mut rule = json!({"Variable": "$.a", "IsNull": true});
        for _ in 0..(MAX_DEPTH + 5) {
            rule = json!({ "Not": rule });
        }
        let e = errors(rule, true);
        assert!(e.iter().any(|(_, m)| m.contains("nest too deeply")), "{e:?}");
    }

    // ---- test: missing paths (needs Path) ----

    #[test]
    fn missing_variable_is_states_runtime() {
        for rule in [
            json!({"Variable": "$.nope", "StringEquals": "x"}),
            json!({"Variable": "$.nope", "NumericEquals": 1}),
            json!({"Variable": "$.nope", "IsNull": true}),
            json!({"Variable": "$.nope", "IsNumeric": false}),
            json!({"Variable": "$.nope", "StringMatches": "*"}),
            json!({"Not": {"Variable": "$.nope", "BooleanEquals": true}}),
        ] {
            match run(rule.clone(), json!({"a": 1})) {
                Err(e) => assert_eq!(e.error.as_deref(), Some(names::RUNTIME), "{rule}"),
                Ok(b) => panic!("{rule}: {b}"),
            }
        }
    }

    #[test]
    fn missing_path_operand_is_states_runtime() {
        // No recorded case; AWS makes every condition path that selects nothing States.Runtime.
        for rule in [
            json!({"Variable": "$.a", "NumericEqualsPath": "$.nope"}),
            json!({"Variable": "$.a", "StringEqualsPath": "$.nope"}),
            json!({"Variable": "$.a", "TimestampLessThanPath": "$.nope"}),
        ] {
            match run(rule.clone(), json!({"a": 1})) {
                Err(e) => assert_eq!(e.error.as_deref(), Some(names::RUNTIME), "{rule}"),
                Ok(b) => panic!("{rule}: {b}"),
            }
        }
    }

    #[test]
    fn is_present_on_missing_field_is_false() {
        let rule = json!({"Variable": "$.nope", "IsPresent": true});
        assert_eq!(run(rule, json!({"a": 1})), Ok(false));
        let rule = json!({"Variable": "$.nope", "IsPresent": false});
        assert_eq!(run(rule, json!({"a": 1})), Ok(true));
        let rule = json!({"Variable": "$.a", "IsPresent": true});
        assert_eq!(run(rule, json!({"a": 1})), Ok(true));
    }

    #[test]
    fn and_or_short_circuit_before_a_missing_path() {
        let rule = json!({"Or": [
            {"Variable": "$.a", "NumericEquals": 1},
            {"Variable": "$.nope", "NumericEquals": 1}
        ]});
        assert_eq!(run(rule, json!({"a": 1})), Ok(true));
        let rule = json!({"And": [
            {"Variable": "$.a", "NumericEquals": 2},
            {"Variable": "$.nope", "NumericEquals": 1}
        ]});
        assert_eq!(run(rule, json!({"a": 1})), Ok(false));
        let rule = json!({"Or": [
            {"Variable": "$.a", "NumericEquals": 2},
            {"Variable": "$.nope", "NumericEquals": 1}
        ]});
        assert!(run(rule, json!({"a": 1})).is_err());
    }

    #[test]
    fn string_matches_rule() {
        let rule = json!({"Variable": "$.f", "StringMatches": "log-*.txt"});
        assert_eq!(run(rule.clone(), json!({"f": "log-2024.txt"})), Ok(true));
        assert_eq!(run(rule.clone(), json!({"f": "log-2024.csv"})), Ok(false));
        assert_eq!(run(rule, json!({"f": 3})), Ok(false));
    }

    #[test]
    fn is_timestamp_rule() {
        let rule = json!({"Variable": "$.t", "IsTimestamp": true});
        assert_eq!(run(rule.clone(), json!({"t": "2016-03-14T01:59:00Z"})), Ok(true));
        assert_eq!(run(rule.clone(), json!({"t": "2016-03-14T01:59:00"})), Ok(false));
        assert_eq!(run(rule, json!({"t": 0})), Ok(false));
    }

    #[test]
    fn variables_and_context_are_readable() {
        let rule = Rule::parse(
            &json!({"Variable": "$guess", "StringEqualsPath": "$answer", "Next": "X"}),
            true,
        );
        let rule = match rule {
            Ok(r) => r,
            Err(e) => panic!("{e:?}"),
        };
        let mut vars = Map::new();
        vars.insert("guess".into(), json!("the_answer"));
        vars.insert("answer".into(), json!("the_answer"));
        let input = json!({});
        let rng = Cell::new(Random::new(0));
        let env = Env {
            input: &input,
            context: &input,
            vars: &vars,
            rng: &rng,
        };
        assert_eq!(rule.test(&env), Ok(true));
    }

    // ---- the conformance cases (/work/shared/conformance/asl/choice and context) ----

    #[test]
    fn case_and_with_one_rule() {
        let rule = json!({"And": [{"Variable": "$.type", "StringEquals": "Public"}], "Next": "Public"});
        assert_eq!(run(rule, json!({"type": "Public", "value": 22})), Ok(true));
    }

    #[test]
    fn case_boolean_equals_false_false() {
        assert!(template("BooleanEquals", json!(false), json!(false), json!(false)));
    }

    #[test]
    fn case_boolean_equals_path_true() {
        assert!(template(
            "BooleanEqualsPath",
            json!("$.Value"),
            json!(true),
            json!(true)
        ));
    }

    #[test]
    fn case_boolean_equals_zero_is_not_false() {
        assert!(!template("BooleanEquals", json!(false), json!(0), json!(false)));
    }

    /// The three rules of `composite-not-and.asl.json`: the index of the first that matches.
    fn composite(input: Value) -> Option<usize> {
        let rules = [
            json!({"Not": {"Variable": "$.type", "StringEquals": "Private"}, "Next": "NEXT_STATE_ONE"}),
            json!({"Variable": "$.value", "NumericEquals": 0, "Next": "NEXT_STATE_TWO"}),
            json!({"And": [
                {"Variable": "$.value", "NumericGreaterThanEquals": 20},
                {"Variable": "$.value", "NumericLessThan": 30}
            ], "Next": "NEXT_STATE_TWO"}),
        ];
        for (i, rule) in rules.into_iter().enumerate() {
            match run(rule, input.clone()) {
                Ok(true) => return Some(i),
                Ok(false) => {}
                Err(e) => panic!("{e:?}"),
            }
        }
        None
    }

    #[test]
    fn case_composite_and_rule() {
        assert_eq!(composite(json!({"type": "Private", "value": 25})), Some(2));
    }

    #[test]
    fn case_composite_default() {
        assert_eq!(composite(json!({"type": "Private", "value": 3})), None);
    }

    #[test]
    fn case_composite_not_rule() {
        assert_eq!(composite(json!({"type": "Public", "value": 3})), Some(0));
    }

    #[test]
    fn case_is_boolean_on_false() {
        assert!(template("IsBoolean", json!(true), json!(false), json!(true)));
    }

    #[test]
    fn case_is_boolean_on_zero_false() {
        assert!(!template("IsBoolean", json!(true), json!(0), json!(true)));
    }

    #[test]
    fn case_is_null_false_matches_zero() {
        assert!(template("IsNull", json!(false), json!(0), json!(false)));
    }

    #[test]
    fn case_is_null_on_null() {
        assert!(template("IsNull", json!(true), json!(null), json!(true)));
    }

    #[test]
    fn case_is_numeric_false_matches_blank() {
        assert!(template("IsNumeric", json!(false), json!(" "), json!(false)));
    }

    #[test]
    fn case_is_numeric_on_float() {
        assert!(template("IsNumeric", json!(true), json!(1.1), json!(true)));
    }

    #[test]
    fn case_is_present_false_on_null_value() {
        assert!(!template("IsPresent", json!(false), json!(null), json!(false)));
    }

    #[test]
    fn case_is_present_on_null_value() {
        assert!(template("IsPresent", json!(true), json!(null), json!(true)));
    }

    #[test]
    fn case_is_string_on_array_false() {
        assert!(!template("IsString", json!(true), json!([]), json!(true)));
    }

    #[test]
    fn case_is_string_on_timestamp_text() {
        assert!(template(
            "IsString",
            json!(true),
            json!("2012-10-09T19:00:55"),
            json!(true)
        ));
    }

    #[test]
    fn case_numeric_equals_bool_variable_is_false() {
        assert!(!template("NumericEquals", json!(1), json!(true), json!(1)));
    }

    #[test]
    fn case_numeric_equals_int_vs_float() {
        assert!(template("NumericEquals", json!(0.0), json!(0), json!(0.0)));
    }

    #[test]
    fn case_numeric_equals_path_decimal() {
        assert!(template(
            "NumericEqualsPath",
            json!("$.Value"),
            json!(2.22),
            json!(2.22)
        ));
    }

    #[test]
    fn case_numeric_equals_string_variable_is_false() {
        assert!(!template("NumericEquals", json!(0), json!(""), json!(0)));
    }

    #[test]
    fn case_numeric_greater_than_equals_float_zero() {
        assert!(template("NumericGreaterThanEquals", json!(0), json!(0.0), json!(0)));
    }

    #[test]
    fn case_numeric_greater_than_path_equal_is_false() {
        assert!(!template(
            "NumericGreaterThanPath",
            json!("$.Value"),
            json!(1),
            json!(1)
        ));
    }

    #[test]
    fn case_numeric_greater_than_true() {
        assert!(template("NumericGreaterThan", json!(0), json!(1), json!(0)));
    }

    #[test]
    fn case_numeric_less_than_equals_path_false() {
        assert!(!template(
            "NumericLessThanEqualsPath",
            json!("$.Value"),
            json!(1),
            json!(0)
        ));
    }

    #[test]
    fn case_numeric_less_than_true() {
        assert!(template("NumericLessThan", json!(1), json!(0), json!(1)));
    }

    #[test]
    fn case_string_equals_match() {
        assert!(template("StringEquals", json!("Hello"), json!("Hello"), json!("Hello")));
    }

    #[test]
    fn case_string_equals_number_variable_is_false() {
        assert!(!template(
            "StringEquals",
            json!("HelloWorld"),
            json!(1),
            json!("HelloWorld")
        ));
    }

    #[test]
    fn case_string_equals_path_cr_differs() {
        assert!(!template(
            "StringEqualsPath",
            json!("$.Value"),
            json!("\t\n"),
            json!("\t\r\n")
        ));
    }

    #[test]
    fn case_string_equals_path_match() {
        assert!(template(
            "StringEqualsPath",
            json!("$.Value"),
            json!("Hello"),
            json!("Hello")
        ));
    }

    #[test]
    fn case_string_equals_whitespace_differs() {
        assert!(!template("StringEquals", json!("     "), json!(" "), json!("     ")));
    }

    #[test]
    fn case_string_greater_than_equals_empty() {
        assert!(template("StringGreaterThanEquals", json!(""), json!(""), json!("")));
    }

    #[test]
    fn case_string_greater_than_equals_path_true() {
        assert!(template(
            "StringGreaterThanEqualsPath",
            json!("$.Value"),
            json!("AB"),
            json!("A")
        ));
    }

    #[test]
    fn case_string_greater_than_trailing_space_false() {
        assert!(!template("StringGreaterThan", json!("A "), json!("A"), json!("A ")));
    }

    #[test]
    fn case_string_less_than_equals_path_false() {
        assert!(!template(
            "StringLessThanEqualsPath",
            json!("$.Value"),
            json!("AB"),
            json!("A")
        ));
    }

    #[test]
    fn case_string_less_than_prefix() {
        assert!(template("StringLessThan", json!("AB"), json!("A"), json!("AB")));
    }

    /// Rows of `[Variable, Value, expected]` through the template with `op: "$.Value"`.
    fn table(op: &str, rows: Value) {
        let Value::Array(rows) = rows else { panic!("rows") };
        for (i, row) in rows.iter().enumerate() {
            let got = template(op, json!("$.Value"), row[0].clone(), row[1].clone());
            assert_eq!(Value::Bool(got), row[2], "{op} row {i}: {row}");
        }
    }

    #[test]
    fn case_table_boolean_equals_path() {
        table(
            "BooleanEqualsPath",
            json!([
                [null, true, false], [null, false, false],
                [0, true, false], [0, false, false],
                [0.0, true, false], [0.0, false, false],
                [1, true, false], [1, false, false],
                [1.1, true, false], [1.1, false, false],
                ["", true, false], ["", false, false],
                [" ", true, false], [" ", false, false],
                ["HelloWorld", true, false], ["HelloWorld", false, false],
                ["2012-10-09T19:00:55", true, false], ["2012-10-09T19:00:55", false, false],
                ["2012-10-09T19:00:55Z", true, false], ["2012-10-09T19:00:55Z", false, false],
                ["2012-10-09T19:00:55+01:00", true, false],
                ["2012-10-09T19:00:55+01:00", false, false],
                ["2023-02-24", true, false], ["2023-02-24", false, false],
                [[], true, false], [[], false, false],
                [[""], true, false], [[""], false, false],
                [{}, true, false], [{}, false, false],
                [{"A": 0}, true, false], [{"A": 0}, false, false],
                [true, true, true],
                [false, true, false], [false, true, false],
                [false, false, true]
            ]),
        );
    }

    #[test]
    fn case_table_numeric_equals_path() {
        table(
            "NumericEqualsPath",
            json!([
                [null, 0, false], [null, 0.0, false], [null, 1, false], [null, 1.0, false],
                [0, 0, true], [0, 0.0, true], [0, 1, false], [0, 1.0, false],
                [0.0, 0, true], [0.0, 0.0, true], [0.0, 1, false], [0.0, 1.0, false],
                [1, 0, false], [1, 0.0, false], [1, 1, true], [1, 1.0, true],
                [1.1, 0, false], [1.1, 0.0, false], [1.1, 1, false], [1.1, 1.0, false],
                ["", 0, false], ["", 0.0, false], ["", 1, false], ["", 1.0, false],
                [" ", 0, false], [" ", 0.0, false], [" ", 1, false], [" ", 1.0, false],
                [[], 0, false], [[], 0.0, false], [[], 1, false], [[], 1.0, false],
                [[""], 0, false], [[""], 0.0, false], [[""], 1, false], [[""], 1.0, false],
                [{}, 0, false], [{}, 0.0, false], [{}, 1, false], [{}, 1.0, false],
                [{"A": 0}, 0, false], [{"A": 0}, 0.0, false],
                [{"A": 0}, 1, false], [{"A": 0}, 1.0, false],
                [false, 0, false], [false, 0.0, false], [false, 1, false], [false, 1.0, false],
                [true, 0, false], [true, 0.0, false], [true, 1, false], [true, 1.0, false],
                [0, 0, true], [0.0, 0, true], [2.22, 2.22, true]
            ]),
        );
    }

    #[test]
    fn case_table_string_less_than_equals_path() {
        table(
            "StringLessThanEqualsPath",
            json!([["", "", true], ["A", "AB", true], ["AB", "A", false]]),
        );
    }

    #[test]
    fn case_timestamp_equals_match() {
        let t = json!("2012-10-09T19:00:55Z");
        assert!(template("TimestampEquals", t.clone(), t.clone(), t));
    }

    #[test]
    fn case_timestamp_equals_non_timestamp_is_false() {
        assert!(!template(
            "TimestampEquals",
            json!("2012-10-09T19:00:55Z"),
            json!("2023-02-24 12:15:56.832957"),
            json!("2012-10-09T19:00:55Z")
        ));
    }

    #[test]
    fn case_timestamp_equals_path_one_second_apart() {
        assert!(!template(
            "TimestampEqualsPath",
            json!("$.Value"),
            json!("2012-10-09T19:00:55Z"),
            json!("2012-10-09T19:00:56Z")
        ));
    }

    #[test]
    fn case_timestamp_greater_than_equals_same() {
        let t = json!("2012-10-09T19:00:55Z");
        assert!(template("TimestampGreaterThanEquals", t.clone(), t.clone(), t));
    }

    #[test]
    fn case_timestamp_greater_than_path_false() {
        assert!(!template(
            "TimestampGreaterThanPath",
            json!("$.Value"),
            json!("2012-10-09T19:00:55Z"),
            json!("2012-10-09T19:00:56Z")
        ));
    }

    #[test]
    fn case_timestamp_greater_than_true() {
        assert!(template(
            "TimestampGreaterThan",
            json!("2012-10-09T19:00:55Z"),
            json!("2012-10-09T19:00:56Z"),
            json!("2012-10-09T19:00:55Z")
        ));
    }

    #[test]
    fn case_timestamp_less_than_equals_false() {
        assert!(!template(
            "TimestampLessThanEquals",
            json!("2012-10-09T19:00:55Z"),
            json!("2012-10-09T19:00:56Z"),
            json!("2012-10-09T19:00:55Z")
        ));
    }

    #[test]
    fn case_timestamp_less_than_equals_path_false() {
        assert!(!template(
            "TimestampLessThanEqualsPath",
            json!("$.Value"),
            json!("2012-10-09T19:00:56Z"),
            json!("2012-10-09T19:00:55Z")
        ));
    }

    #[test]
    fn case_timestamp_less_than_true() {
        assert!(template(
            "TimestampLessThan",
            json!("2012-10-09T19:00:56Z"),
            json!("2012-10-09T19:00:55Z"),
            json!("2012-10-09T19:00:56Z")
        ));
    }

    /// The two rules of `unsorted-rule-fields.asl.json`, fields in that file's order.
    fn unsorted(input: Value) -> Option<usize> {
        let rules = [
            json!({"BooleanEquals": true, "Next": "FinishTrue", "Variable": "$.result.done"}),
            json!({"BooleanEquals": false, "Next": "FinishFalse", "Variable": "$.result.done"}),
        ];
        for (i, rule) in rules.into_iter().enumerate() {
            match run(rule, input.clone()) {
                Ok(true) => return Some(i),
                Ok(false) => {}
                Err(e) => panic!("{e:?}"),
            }
        }
        None
    }

    #[test]
    fn case_unsorted_rule_fields_false() {
        assert_eq!(unsorted(json!({"result": {"done": false}})), Some(1));
    }

    #[test]
    fn case_unsorted_rule_fields_true() {
        assert_eq!(unsorted(json!({"result": {"done": true}})), Some(0));
    }

    #[test]
    fn case_context_choice_variable_from_context() {
        let rule = json!({
            "Variable": "$$.Execution.Input.input-value",
            "NumericLessThanEquals": 0,
            "Next": "QuitChoiceMatched"
        });
        assert_eq!(run(rule, json!({"input-value": 0})), Ok(true));
    }
}
