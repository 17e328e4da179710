//! The intrinsic functions (`States.Format(...)`, ...).
//!
//! A call is a function name, then `(`, then zero or more comma-separated arguments, then `)`.
//! Arguments are `'strings'` (where only `\'`, `\{`, `\}` and `\\` are escapes: any other
//! backslash, `\"` included, is refused as AWS does), numbers, `null`, `true`, `false`, Paths
//! (`$...`, `$$...`, `$var...`) and nested calls. Unknown functions and wrong argument counts are
//! parse errors; wrong argument types and values are `States.IntrinsicFailure` at evaluation; a
//! Path argument that does not match is `States.Runtime`.
//!
//! Where AWS's recorded behaviour differs from a plain reading of its documentation, AWS wins:
//! `States.MathAdd` rounds each argument half up before adding, `States.StringSplit` splits on
//! every character of the delimiter and drops empty pieces, `States.StringToJson` of a blank
//! string is `null`, `States.Format` renders an array or object argument Java-style
//! (`{Arg1=1, Arg2=[]}`), `States.JsonToString` is compact, and `States.JsonMerge` is shallow
//! (its third argument must be `false`, as AWS documents).

use super::path::{json_eq, Path};
use super::{AslError, Env};
use crate::json::kind;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine;
use serde_json::{Map, Number, Value};

/// How deep calls may nest inside one another.
const MAX_NESTING: usize = 32;
/// The longest string `States.Base64Encode`, `States.Base64Decode` and `States.Hash` accept.
const MAX_STRING_CHARS: usize = 10_000;
/// The most elements `States.ArrayRange` makes.
const MAX_RANGE: i128 = 1000;

/// The intrinsic functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Func {
    Format,
    StringToJson,
    JsonToString,
    Array,
    ArrayPartition,
    ArrayContains,
    ArrayRange,
    ArrayGetItem,
    ArrayLength,
    ArrayUnique,
    Base64Encode,
    Base64Decode,
    Hash,
    JsonMerge,
    MathRandom,
    MathAdd,
    StringSplit,
    Uuid,
}

/// Every function: its name, and its least and most argument counts.
const FUNCS: &[(Func, &str, usize, usize)] = &[
    (Func::Format, "States.Format", 1, usize::MAX),
    (Func::StringToJson, "States.StringToJson", 1, 1),
    (Func::JsonToString, "States.JsonToString", 1, 1),
    (Func::Array, "States.Array", 0, usize::MAX),
    (Func::ArrayPartition, "States.ArrayPartition", 2, 2),
    (Func::ArrayContains, "States.ArrayContains", 2, 2),
    (Func::ArrayRange, "States.ArrayRange", 3, 3),
    (Func::ArrayGetItem, "States.ArrayGetItem", 2, 2),
    (Func::ArrayLength, "States.ArrayLength", 1, 1),
    (Func::ArrayUnique, "States.ArrayUnique", 1, 1),
    (Func::Base64Encode, "States.Base64Encode", 1, 1),
    (Func::Base64Decode, "States.Base64Decode", 1, 1),
    (Func::Hash, "States.Hash", 2, 2),
    (Func::JsonMerge, "States.JsonMerge", 3, 3),
    (Func::MathRandom, "States.MathRandom", 2, 3),
    (Func::MathAdd, "States.MathAdd", 2, 2),
    (Func::StringSplit, "States.StringSplit", 2, 2),
    (Func::Uuid, "States.UUID", 0, 0),
];

/// A piece of a string literal: text, or an unescaped `{}` (a `States.Format` placeholder).
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Hole,
}

/// An argument.
#[derive(Debug, Clone, PartialEq)]
enum Arg {
    /// A number, `null`, `true` or `false`.
    Literal(Value),
    /// A `'string'`, kept in pieces so that `States.Format` tells `{}` from `\{\}`.
    Str(Vec<Piece>),
    Path(Path),
    Call(Box<Call>),
}

/// A parsed intrinsic function call.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    text: String,
    func: Func,
    name: &'static str,
    args: Vec<Arg>,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '.' || c == '_'
}

/// True when `s` is written as an intrinsic function call (a name followed by `(`).
pub fn is_intrinsic(s: &str) -> bool {
    let n = s.chars().take_while(|&c| is_name_char(c)).count();
    // Name characters are ASCII, so `n` is also a byte offset.
    n > 0 && s[n..].starts_with('(')
}

impl Call {
    /// Parses a call; the error says what is wrong.
    pub fn parse(text: &str) -> Result<Call, String> {
        let chars: Vec<char> = text.chars().collect();
        let mut p = Parser { s: &chars, i: 0 };
        let call = p
            .call(0)
            .map_err(|e| format!("invalid intrinsic function '{text}': {e}"))?;
        p.ws();
        if p.i < chars.len() {
            return Err(format!(
                "invalid intrinsic function '{text}': unexpected text after the call at position {}",
                p.i
            ));
        }
        Ok(Call {
            text: text.to_string(),
            ..call
        })
    }

    /// The call as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Evaluates the call.
    pub fn eval(&self, env: &Env) -> Result<Value, AslError> {
        let args = self
            .args
            .iter()
            .map(|a| eval_arg(a, env))
            .collect::<Result<Vec<Value>, AslError>>()?;
        self.apply(args, env)
    }

    fn fail(&self, why: impl std::fmt::Display) -> AslError {
        AslError::intrinsic(format!("{}: {why}", self.name))
    }

    fn arg<'v>(&self, args: &'v [Value], n: usize) -> Result<&'v Value, AslError> {
        args.get(n)
            .ok_or_else(|| self.fail(format!("argument {} is missing", n + 1)))
    }

    fn string<'v>(&self, args: &'v [Value], n: usize) -> Result<&'v str, AslError> {
        match self.arg(args, n)? {
            Value::String(s) => Ok(s),
            v => Err(self.fail(format!("argument {} must be a string, not {}", n + 1, kind(v)))),
        }
    }

    fn limited_string<'v>(&self, args: &'v [Value], n: usize) -> Result<&'v str, AslError> {
        let s = self.string(args, n)?;
        if s.chars().count() > MAX_STRING_CHARS {
            return Err(self.fail(format!(
                "argument {} is longer than {MAX_STRING_CHARS} characters",
                n + 1
            )));
        }
        Ok(s)
    }

    fn array<'v>(&self, args: &'v [Value], n: usize) -> Result<&'v Vec<Value>, AslError> {
        match self.arg(args, n)? {
            Value::Array(a) => Ok(a),
            v => Err(self.fail(format!("argument {} must be an array, not {}", n + 1, kind(v)))),
        }
    }

    fn object<'v>(&self, args: &'v [Value], n: usize) -> Result<&'v Map<String, Value>, AslError> {
        match self.arg(args, n)? {
            Value::Object(m) => Ok(m),
            v => Err(self.fail(format!("argument {} must be an object, not {}", n + 1, kind(v)))),
        }
    }

    fn integer(&self, args: &[Value], n: usize) -> Result<i64, AslError> {
        let v = self.arg(args, n)?;
        as_integer(v).ok_or_else(|| self.fail(format!("argument {} must be an integer, not {v}", n + 1)))
    }

    fn apply(&self, args: Vec<Value>, env: &Env) -> Result<Value, AslError> {
        let a = &args[..];
        Ok(match self.func {
            Func::Format => self.format(a)?,
            Func::StringToJson => {
                let s = self.string(a, 0)?;
                if s.trim().is_empty() {
                    Value::Null
                } else {
                    let v: Value = serde_json::from_str(s).map_err(|e| self.fail(format!("not JSON: {e}")))?;
                    normalize_zero(v)
                }
            }
            Func::JsonToString => Value::String(serde_json::to_string(self.arg(a, 0)?).map_err(|e| self.fail(e))?),
            Func::Array => Value::Array(args),
            Func::ArrayPartition => {
                let arr = self.array(a, 0)?;
                let size = self.integer(a, 1)?;
                let size = usize::try_from(size)
                    .ok()
                    .filter(|&s| s > 0)
                    .ok_or_else(|| self.fail("the chunk size must be a positive integer"))?;
                Value::Array(arr.chunks(size).map(|c| Value::Array(c.to_vec())).collect())
            }
            Func::ArrayContains => {
                let arr = self.array(a, 0)?;
                let x = self.arg(a, 1)?;
                Value::Bool(arr.iter().any(|v| json_eq(v, x)))
            }
            Func::ArrayRange => {
                let (start, end, step) = (
                    i128::from(self.integer(a, 0)?),
                    i128::from(self.integer(a, 1)?),
                    i128::from(self.integer(a, 2)?),
                );
                if step == 0 {
                    return Err(self.fail("the step cannot be 0"));
                }
                let count = if (step > 0 && start <= end) || (step < 0 && start >= end) {
                    (end - start) / step + 1
                } else {
                    0
                };
                if count > MAX_RANGE {
                    return Err(self.fail(format!("the range has more than {MAX_RANGE} elements")));
                }
                let items = (0..count).filter_map(|k| i64::try_from(start + k * step).ok());
                Value::Array(items.map(Value::from).collect())
            }
            Func::ArrayGetItem => {
                let arr = self.array(a, 0)?;
                let i = self.integer(a, 1)?;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| arr.get(i))
                    .cloned()
                    .ok_or_else(|| self.fail(format!("index {i} is out of the array's bounds (0..{})", arr.len())))?
            }
            Func::ArrayLength => Value::from(self.array(a, 0)?.len()),
            Func::ArrayUnique => {
                let mut out: Vec<Value> = Vec::new();
                for v in self.array(a, 0)? {
                    if !out.iter().any(|u| json_eq(u, v)) {
                        out.push(v.clone());
                    }
                }
                Value::Array(out)
            }
            Func::Base64Encode => Value::String(STANDARD.encode(self.limited_string(a, 0)?)),
            Func::Base64Decode => {
                let s = self.limited_string(a, 0)?;
                let bytes = STANDARD
                    .decode(s)
                    .or_else(|_| STANDARD_NO_PAD.decode(s))
                    .map_err(|e| self.fail(format!("not base64: {e}")))?;
                Value::String(String::from_utf8(bytes).map_err(|_| self.fail("the decoded bytes are not UTF-8"))?)
            }
            Func::Hash => {
                let data = self.limited_string(a, 0)?;
                let alg = self.string(a, 1)?;
                Value::String(hash(data.as_bytes(), alg).ok_or_else(|| {
                    self.fail(format!(
                        "unknown algorithm '{alg}' (MD5, SHA-1, SHA-256, SHA-384 or SHA-512)"
                    ))
                })?)
            }
            Func::JsonMerge => {
                let first = self.object(a, 0)?;
                let second = self.object(a, 1)?;
                match self.arg(a, 2)? {
                    Value::Bool(false) => {}
                    Value::Bool(true) => {
                        return Err(self.fail("only the shallow mode is supported: the third argument must be false"))
                    }
                    v => return Err(self.fail(format!("argument 3 must be a boolean, not {}", kind(v)))),
                }
                let mut out = first.clone();
                for (k, v) in second {
                    out.insert(k.clone(), v.clone());
                }
                Value::Object(out)
            }
            Func::MathRandom => {
                let start = i128::from(self.integer(a, 0)?);
                let end = i128::from(self.integer(a, 1)?);
                if start >= end {
                    return Err(self.fail("the start must be less than the end"));
                }
                let bits = if a.len() > 2 {
                    // A seed makes the result a function of the seed, as in AWS.
                    crate::kernel::random::splitmix64(self.integer(a, 2)? as u64)
                } else {
                    env.random()
                };
                let span = end - start;
                let n = start + i128::from(bits) % span;
                Value::from(i64::try_from(n).map_err(|_| self.fail("the result is out of range"))?)
            }
            Func::MathAdd => {
                let x = self.rounded(a, 0)?;
                let y = self.rounded(a, 1)?;
                Value::from(x + y)
            }
            Func::StringSplit => {
                let s = self.string(a, 0)?;
                let delims: Vec<char> = self.string(a, 1)?.chars().collect();
                Value::Array(
                    s.split(|c| delims.contains(&c))
                        .filter(|p| !p.is_empty())
                        .map(|p| Value::String(p.to_string()))
                        .collect(),
                )
            }
            Func::Uuid => Value::String(uuid4(env.random(), env.random())),
        })
    }

    /// A `States.MathAdd` argument: a number rounded half up, within a 32-bit integer's range.
    fn rounded(&self, args: &[Value], n: usize) -> Result<i64, AslError> {
        let v = self.arg(args, n)?;
        let r = match v {
            Value::Number(x) => match x.as_i64() {
                Some(i) => Some(i),
                None => x
                    .as_f64()
                    .map(|f| (f + 0.5).floor())
                    .filter(|f| f.is_finite())
                    .and_then(|f| {
                        if (f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&f) {
                            // In range, so the conversion is exact.
                            Some(f as i64)
                        } else {
                            None
                        }
                    }),
            },
            _ => return Err(self.fail(format!("argument {} must be a number, not {}", n + 1, kind(v)))),
        };
        r.filter(|i| i32::try_from(*i).is_ok())
            .ok_or_else(|| self.fail(format!("argument {} is out of the 32-bit integer range", n + 1)))
    }

    /// `States.Format`: the first argument's `{}` replaced, in order, by the other arguments.
    fn format(&self, args: &[Value]) -> Result<Value, AslError> {
        let pieces = match self.args.first() {
            // A literal keeps its escaped braces apart from its placeholders.
            Some(Arg::Str(pieces)) => pieces.clone(),
            _ => split_holes(self.string(args, 0)?),
        };
        let rest = args.get(1..).unwrap_or_default();
        let holes = pieces.iter().filter(|p| **p == Piece::Hole).count();
        if holes != rest.len() {
            return Err(self.fail(format!(
                "the format string has {holes} placeholder(s) but {} argument(s) follow it",
                rest.len()
            )));
        }
        let mut values = rest.iter();
        let mut out = String::new();
        for piece in &pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Hole => out.push_str(&values.next().map(|v| render(v, 0)).unwrap_or_default()),
            }
        }
        Ok(Value::String(out))
    }
}

fn eval_arg(a: &Arg, env: &Env) -> Result<Value, AslError> {
    match a {
        Arg::Literal(v) => Ok(v.clone()),
        Arg::Str(pieces) => Ok(Value::String(join(pieces))),
        Arg::Path(p) => p.read(env),
        Arg::Call(c) => c.eval(env),
    }
}

/// A string literal's value.
fn join(pieces: &[Piece]) -> String {
    pieces
        .iter()
        .map(|p| match p {
            Piece::Text(t) => t.as_str(),
            Piece::Hole => "{}",
        })
        .collect()
}

/// A format string read at run time: each `{}` is a placeholder.
fn split_holes(s: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    for (n, part) in s.split("{}").enumerate() {
        if n > 0 {
            out.push(Piece::Hole);
        }
        out.push(Piece::Text(part.to_string()));
    }
    out
}

/// A value as `States.Format` writes it: strings bare, arrays and objects Java-style.
fn render(v: &Value, depth: usize) -> String {
    if depth > 64 {
        return "...".into();
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(|x| render(x, depth + 1)).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(m) => {
            let items: Vec<String> = m.iter().map(|(k, x)| format!("{k}={}", render(x, depth + 1))).collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

/// A number with an integral value.
fn as_integer(v: &Value) -> Option<i64> {
    let Value::Number(n) = v else { return None };
    if let Some(i) = n.as_i64() {
        return Some(i);
    }
    let f = n.as_f64()?;
    if f.fract() == 0.0 && (-9.0e15..=9.0e15).contains(&f) {
        // Integral and well inside i64's range, so the conversion is exact.
        Some(f as i64)
    } else {
        None
    }
}

/// `-0` parses as the float -0.0; AWS gives 0.
fn normalize_zero(v: Value) -> Value {
    match &v {
        Value::Number(n) if n.as_f64() == Some(0.0) && n.is_f64() => Value::Number(Number::from(0)),
        _ => v,
    }
}

/// The hex digest of `data` with the named algorithm.
fn hash(data: &[u8], alg: &str) -> Option<String> {
    use sha2::Digest;
    let bytes: Vec<u8> = match alg {
        "MD5" => md5::Md5::digest(data).to_vec(),
        "SHA-1" => sha1::Sha1::digest(data).to_vec(),
        "SHA-256" => sha2::Sha256::digest(data).to_vec(),
        "SHA-384" => sha2::Sha384::digest(data).to_vec(),
        "SHA-512" => sha2::Sha512::digest(data).to_vec(),
        _ => return None,
    };
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A version 4 UUID from 128 random bits.
fn uuid4(hi: u64, lo: u64) -> String {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&hi.to_be_bytes());
    b[8..].copy_from_slice(&lo.to_be_bytes());
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

struct Parser<'a> {
    s: &'a [char],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.i += 1;
        }
    }

    fn at(&self) -> String {
        match self.peek() {
            Some(c) => format!("'{c}' at position {}", self.i),
            None => "the end of the text".into(),
        }
    }

    /// `Name(args)`.
    fn call(&mut self, depth: usize) -> Result<Call, String> {
        if depth > MAX_NESTING {
            return Err("calls nest too deeply".into());
        }
        let start = self.i;
        while self.peek().is_some_and(is_name_char) {
            self.i += 1;
        }
        let name: String = self.s[start..self.i].iter().collect();
        if name.is_empty() {
            return Err(format!("expected a function name, found {}", self.at()));
        }
        if self.peek() != Some('(') {
            return Err(format!("expected '(' right after '{name}', found {}", self.at()));
        }
        self.i += 1;
        let &(func, fname, min, max) = FUNCS
            .iter()
            .find(|f| f.1 == name)
            .ok_or_else(|| format!("unknown function '{name}'"))?;
        let mut args = Vec::new();
        self.ws();
        if self.peek() == Some(')') {
            self.i += 1;
        } else {
            loop {
                self.ws();
                args.push(self.arg(depth)?);
                self.ws();
                match self.peek() {
                    Some(',') => self.i += 1,
                    Some(')') => {
                        self.i += 1;
                        break;
                    }
                    _ => {
                        return Err(format!(
                            "expected ',' or ')' in the arguments of {name}, found {}",
                            self.at()
                        ))
                    }
                }
            }
        }
        if args.len() < min || args.len() > max {
            let wanted = if min == max {
                format!("{min}")
            } else if max == usize::MAX {
                format!("at least {min}")
            } else {
                format!("{min} to {max}")
            };
            return Err(format!("{name} takes {wanted} argument(s), not {}", args.len()));
        }
        let text: String = self.s[start..self.i].iter().collect();
        Ok(Call {
            text,
            func,
            name: fname,
            args,
        })
    }

    fn arg(&mut self, depth: usize) -> Result<Arg, String> {
        match self.peek() {
            Some('\'') => {
                self.i += 1;
                self.string().map(Arg::Str)
            }
            Some('$') => self.path().map(Arg::Path),
            Some(c) if c == '-' || c.is_ascii_digit() => self.number().map(Arg::Literal),
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.i;
                while self.peek().is_some_and(is_name_char) {
                    self.i += 1;
                }
                let word: String = self.s[start..self.i].iter().collect();
                if self.peek() == Some('(') {
                    self.i = start;
                    return Ok(Arg::Call(Box::new(self.call(depth + 1)?)));
                }
                match word.as_str() {
                    "null" => Ok(Arg::Literal(Value::Null)),
                    "true" => Ok(Arg::Literal(Value::Bool(true))),
                    "false" => Ok(Arg::Literal(Value::Bool(false))),
                    _ => Err(format!("'{word}' is not an argument: strings are written in '...'")),
                }
            }
            _ => Err(format!("expected an argument, found {}", self.at())),
        }
    }

    /// A string literal, the opening `'` already read.
    fn string(&mut self) -> Result<Vec<Piece>, String> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err("a string argument lacks its closing '".into());
            };
            self.i += 1;
            match c {
                '\'' => break,
                '\\' => match self.peek() {
                    Some(e @ ('\'' | '{' | '}' | '\\')) => {
                        text.push(e);
                        self.i += 1;
                    }
                    Some(e) => {
                        return Err(format!(
                            "'\\{e}' at position {} is not an escape: only \\' \\{{ \\}} and \\\\ are",
                            self.i - 1
                        ))
                    }
                    None => return Err("an open escape '\\' ends the text".into()),
                },
                '{' if self.peek() == Some('}') => {
                    self.i += 1;
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                    pieces.push(Piece::Hole);
                }
                c => text.push(c),
            }
        }
        pieces.push(Piece::Text(text));
        pieces.retain(|p| *p != Piece::Text(String::new()));
        Ok(pieces)
    }

    /// A Path argument: up to a `,` or `)` outside brackets and quotes.
    fn path(&mut self) -> Result<Path, String> {
        let start = self.i;
        let mut brackets = 0usize;
        let mut quote: Option<char> = None;
        while let Some(c) = self.peek() {
            if let Some(q) = quote {
                if c == '\\' {
                    self.i += 1;
                } else if c == q {
                    quote = None;
                }
            } else {
                match c {
                    '\\' => self.i += 1,
                    '[' => brackets += 1,
                    ']' => brackets = brackets.saturating_sub(1),
                    '\'' | '"' if brackets > 0 => quote = Some(c),
                    ',' | ')' if brackets == 0 => break,
                    _ => {}
                }
            }
            self.i += 1;
        }
        self.i = self.i.min(self.s.len());
        let text: String = self.s[start..self.i].iter().collect();
        Path::parse(text.trim_end())
    }

    fn number(&mut self) -> Result<Value, String> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit() || "+-.eE".contains(c)) {
            self.i += 1;
        }
        let text: String = self.s[start..self.i].iter().collect();
        match serde_json::from_str::<Value>(&text) {
            Ok(v @ Value::Number(_)) => Ok(normalize_zero(v)),
            _ => Err(format!("'{text}' is not a number")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Random;
    use serde_json::json;
    use std::cell::Cell;

    fn run_full(
        text: &str,
        input: &Value,
        context: &Value,
        vars: &Map<String, Value>,
        rng: &Cell<Random>,
    ) -> Result<Value, AslError> {
        let env = Env {
            input,
            context,
            vars,
            rng,
        };
        Call::parse(text).unwrap_or_else(|e| panic!("{e}")).eval(&env)
    }

    fn run(text: &str, input: Value) -> Result<Value, AslError> {
        run_full(text, &input, &json!({}), &Map::new(), &Cell::new(Random::new(7)))
    }

    fn ok(text: &str, input: Value) -> Value {
        run(text, input).unwrap_or_else(|e| panic!("{text}: {e:?}"))
    }

    fn failure(text: &str, input: Value) -> String {
        match run(text, input) {
            Err(e) => e.error.unwrap_or_default(),
            Ok(v) => panic!("{text} gave {v}"),
        }
    }

    /// Runs `States.F($.inN.fst, $.inN.snd)` over each recorded input, as the cases do.
    fn pairs(func: &str, cases: &[(Value, Value, Value)]) {
        for (fst, snd, want) in cases {
            let got = ok(&format!("{func}($.fst, $.snd)"), json!({"fst": fst, "snd": snd}));
            assert_eq!(&got, want, "{func}({fst}, {snd})");
        }
    }

    #[test]
    fn recognises_calls() {
        assert!(is_intrinsic("States.Format('x')"));
        assert!(is_intrinsic("States.UUID()"));
        assert!(is_intrinsic("My_func.x("));
        assert!(!is_intrinsic("$.a"));
        assert!(!is_intrinsic("States.Format ('x')"));
        assert!(!is_intrinsic("ConditionTrue"));
        assert!(!is_intrinsic("(x)"));
        assert!(!is_intrinsic(""));
    }

    #[test]
    fn spec_appendix_b() {
        assert_eq!(
            ok(
                "States.Format('Your name is {}, we are in the year {}', $.name, 2020)",
                json!({"name": "Foo", "zebra": "stripe"})
            ),
            json!("Your name is Foo, we are in the year 2020")
        );
        assert_eq!(
            ok(
                "States.StringToJson($.someString)",
                json!({"someString": "{\"number\": 20}", "zebra": "stripe"})
            ),
            json!({"number": 20})
        );
        assert_eq!(
            ok(
                "States.JsonToString($.someJson)",
                json!({"someJson": {"name": "Foo", "year": 2020}, "zebra": "stripe"})
            ),
            json!("{\"name\":\"Foo\",\"year\":2020}")
        );
        assert_eq!(
            ok(
                "States.Array('Foo', 2020, $.someJson, null)",
                json!({"someJson": {"random": "abcdefg"}, "zebra": "stripe"})
            ),
            json!(["Foo", 2020, {"random": "abcdefg"}, null])
        );
        // The spec's escape example.
        assert_eq!(
            ok(
                "States.Format('Welcome to {} {}\\'s playlist.', $.firstName, $.lastName)",
                json!({"firstName": "Ann", "lastName": "Lee"})
            ),
            json!("Welcome to Ann Lee's playlist.")
        );
    }

    #[test]
    fn format() {
        // intrinsics/format-one-argument, format-two-arguments, format-object-argument-java-style
        for (v, s) in [
            (json!(""), ""),
            (json!(" "), " "),
            (json!("HelloWorld"), "HelloWorld"),
            (json!(null), "null"),
            (json!(1), "1"),
            (json!(1.1), "1.1"),
            (json!("{\"Arg1\": 1, \"Arg2\": []}"), "{\"Arg1\": 1, \"Arg2\": []}"),
            (json!(true), "true"),
        ] {
            assert_eq!(
                ok("States.Format('Formatting argument {}.', $.v)", json!({"v": v})),
                json!(format!("Formatting argument {s}."))
            );
            assert_eq!(
                ok(
                    "States.Format('Formatting arguments fst={} and snd={}.', $.v, $.v)",
                    json!({"v": v})
                ),
                json!(format!("Formatting arguments fst={s} and snd={s}."))
            );
        }
        assert_eq!(
            ok(
                "States.Format('Formatting arguments fst={} and snd={}.', $.in7.fst, $.in7.snd)",
                json!({"in7": {"fst": {"Arg1": 1, "Arg2": []}, "snd": {"Arg1": 1, "Arg2": []}}})
            ),
            json!("Formatting arguments fst={Arg1=1, Arg2=[]} and snd={Arg1=1, Arg2=[]}.")
        );
        assert_eq!(
            ok("States.Format('{}', $.v)", json!({"v": [1, "a", {"b": null}]})),
            json!("[1, a, {b=null}]")
        );
        // intrinsics/several-functions-over-input-paths
        assert_eq!(
            ok(
                "States.Format('Hello {}, welcome to {}!', $.name, $.place)",
                json!({"name": "John", "place": "LocalStack"})
            ),
            json!("Hello John, welcome to LocalStack!")
        );
        // Escaped braces are not placeholders; a format string read from a path is.
        assert_eq!(ok("States.Format('\\{\\} {}', 1)", json!({})), json!("{} 1"));
        assert_eq!(ok("States.Format('a\\\\b')", json!({})), json!("a\\b"));
        assert_eq!(
            ok("States.Format($.t, 'Pikachu')", json!({"t": "It's {}!"})),
            json!("It's Pikachu!")
        );
        assert_eq!(ok("States.Format('x')", json!({})), json!("x"));
        assert_eq!(ok("States.Format('{ } {}', 'a')", json!({})), json!("{ } a"));
        // fail/paths-with-intrinsic-format
        assert_eq!(
            ok(
                "States.Format('This is a custom error message for {}, caused by {}.', $.Error, $.Cause)",
                json!({"Error": "error string", "Cause": "cause string"})
            ),
            json!("This is a custom error message for error string, caused by cause string.")
        );
        assert_eq!(
            failure("States.Format('{} {}', 1)", json!({})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            failure("States.Format('{}', 1, 2)", json!({})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            failure("States.Format($.n)", json!({"n": 1})),
            "States.IntrinsicFailure"
        );
    }

    #[test]
    fn string_to_json() {
        // intrinsics/string-to-json
        for (s, v) in [
            ("", json!(null)),
            (" ", json!(null)),
            ("null", json!(null)),
            ("-0", json!(0)),
            ("1", json!(1)),
            ("1.1", json!(1.1)),
            ("true", json!(true)),
            ("\"HelloWorld\"", json!("HelloWorld")),
            ("[1, 2, \"HelloWorld\"]", json!([1, 2, "HelloWorld"])),
            ("{\"Arg1\": 1, \"Arg2\": []}", json!({"Arg1": 1, "Arg2": []})),
        ] {
            let got = ok("States.StringToJson($.s)", json!({"s": s}));
            assert_eq!(got, v, "{s:?}");
            assert_eq!(got.to_string(), v.to_string(), "{s:?}");
        }
        assert_eq!(
            failure("States.StringToJson($.s)", json!({"s": "{"})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            failure("States.StringToJson($.s)", json!({"s": 1})),
            "States.IntrinsicFailure"
        );
    }

    #[test]
    fn json_to_string() {
        // intrinsics/json-to-string
        for (v, s) in [
            (json!(null), "null"),
            (json!(0), "0"),
            (json!(1), "1"),
            (json!(1.1), "1.1"),
            (json!(true), "true"),
            (json!("HelloWorld"), "\"HelloWorld\""),
            (json!([1, 2, "HelloWorld"]), "[1,2,\"HelloWorld\"]"),
            (json!({"Arg1": 1, "Arg2": []}), "{\"Arg1\":1,\"Arg2\":[]}"),
        ] {
            assert_eq!(ok("States.JsonToString($.v)", json!({"v": v})), json!(s));
        }
    }

    #[test]
    fn arrays() {
        // intrinsics/array
        assert_eq!(ok("States.Array()", json!({})), json!([]));
        for v in [
            json!(""),
            json!(" "),
            json!("HelloWorld"),
            json!(null),
            json!(1),
            json!(1.1),
            json!("{\"Arg1\": 1, \"Arg2\": []}"),
            json!({"Arg1": 1, "Arg2": []}),
        ] {
            pairs("States.Array", &[(v.clone(), v.clone(), json!([v.clone(), v]))]);
        }
        // intrinsics/array-contains
        pairs(
            "States.ArrayContains",
            &[
                (json!([]), json!(null), json!(false)),
                (json!([]), json!([]), json!(false)),
                (json!([]), json!(1), json!(false)),
                (json!([[1, 2, 3], 2]), json!(null), json!(false)),
                (json!([[1, 2, 3], 2]), json!([1, 2, 3]), json!(true)),
                (json!([{"1": 2, "2": []}]), json!([]), json!(false)),
                (json!([{"1": 2, "2": []}]), json!({"1": 2, "2": []}), json!(true)),
                (json!([true, false]), json!(true), json!(true)),
                (json!([true, false]), json!(false), json!(true)),
            ],
        );
        // intrinsics/array-partition
        pairs(
            "States.ArrayPartition",
            &[
                (json!([]), json!(1), json!([])),
                (json!([0]), json!(1), json!([[0]])),
                (json!([0, 1]), json!(1), json!([[0], [1]])),
                (json!([0, 1]), json!(2), json!([[0, 1]])),
                (json!([0, 1, 2]), json!(2), json!([[0, 1], [2]])),
                (json!([0, 1, 2]), json!(3), json!([[0, 1, 2]])),
                (json!([0, 1, 2, 3]), json!(2), json!([[0, 1], [2, 3]])),
                (json!([0, 1, 2, 3]), json!(3), json!([[0, 1, 2], [3]])),
                (json!([0, 1, 2, 3]), json!(5), json!([[0, 1, 2, 3]])),
            ],
        );
        assert_eq!(
            failure("States.ArrayPartition($.a, 0)", json!({"a": [1]})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            failure("States.ArrayPartition($.a, 1.5)", json!({"a": [1]})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            failure("States.ArrayPartition($.a, 1)", json!({"a": "x"})),
            "States.IntrinsicFailure"
        );
        // intrinsics/array-range
        for ((s, e, st), want) in [
            ((0, 9, 3), json!([0, 3, 6, 9])),
            ((0, 10, 3), json!([0, 3, 6, 9])),
            ((1, 9, 9), json!([1])),
            ((1, 9, 2), json!([1, 3, 5, 7, 9])),
            ((5, 1, -2), json!([5, 3, 1])),
            ((5, 1, 1), json!([])),
        ] {
            let got = ok("States.ArrayRange($.s, $.e, $.st)", json!({"s": s, "e": e, "st": st}));
            assert_eq!(got, want, "{s} {e} {st}");
        }
        assert_eq!(
            failure("States.ArrayRange(0, 10, 0)", json!({})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            failure("States.ArrayRange(0, 1000, 1)", json!({})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            ok("States.ArrayLength(States.ArrayRange(0, 999, 1))", json!({})),
            json!(1000)
        );
        // intrinsics/array-get-item, array-length
        assert_eq!(
            ok(
                "States.ArrayGetItem($.a, $.i)",
                json!({"a": [1, 2, 3, 4, 5, 6, 7, 8, 9], "i": 5})
            ),
            json!(6)
        );
        assert_eq!(
            failure("States.ArrayGetItem($.a, 3)", json!({"a": [1]})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            failure("States.ArrayGetItem($.a, -1)", json!({"a": [1]})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            ok("States.ArrayLength($.a)", json!({"a": [1, 2, 3, 4, 5, 6, 7, 8, 9]})),
            json!(9)
        );
        assert_eq!(
            failure("States.ArrayLength($.a)", json!({"a": {}})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            ok("States.ArrayUnique($.a)", json!({"a": [1, 2, 2, 3, 3, 4]})),
            json!([1, 2, 3, 4])
        );
        assert_eq!(
            ok(
                "States.ArrayUnique($.a)",
                json!({"a": [{"x": [1]}, 1.0, {"x": [1]}, 1]})
            ),
            json!([{"x": [1]}, 1.0])
        );
    }

    #[test]
    fn array_unique_and_friends() {
        // intrinsics/array-unique-and-friends
        let input = json!({"inputArray": [1, 2, 3, 4, 5, 6], "duplicateArray": [1, 2, 2, 3, 3, 4]});
        for (call, want) in [
            ("States.Array('a', 'b', 'c')", json!(["a", "b", "c"])),
            (
                "States.ArrayPartition($.inputArray, 2)",
                json!([[1, 2], [3, 4], [5, 6]]),
            ),
            ("States.ArrayContains($.inputArray, 5)", json!(true)),
            ("States.ArrayRange(1, 10, 2)", json!([1, 3, 5, 7, 9])),
            ("States.ArrayGetItem($.inputArray, 2)", json!(3)),
            ("States.ArrayLength($.inputArray)", json!(6)),
            ("States.ArrayUnique($.duplicateArray)", json!([1, 2, 3, 4])),
        ] {
            assert_eq!(ok(call, input.clone()), want, "{call}");
        }
    }

    #[test]
    fn base64() {
        // intrinsics/base64-encode, base64-decode
        assert_eq!(ok("States.Base64Encode($.s)", json!({"s": ""})), json!(""));
        assert_eq!(
            ok("States.Base64Encode($.s)", json!({"s": "Data to encode"})),
            json!("RGF0YSB0byBlbmNvZGU=")
        );
        assert_eq!(ok("States.Base64Decode($.s)", json!({"s": ""})), json!(""));
        assert_eq!(
            ok("States.Base64Decode($.s)", json!({"s": "RGF0YSB0byBlbmNvZGU="})),
            json!("Data to encode")
        );
        assert_eq!(
            ok("States.Base64Decode('SGVsbG8gV29ybGQ=')", json!({})),
            json!("Hello World")
        );
        assert_eq!(
            failure("States.Base64Decode('***')", json!({})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            failure("States.Base64Decode('/w==')", json!({})),
            "States.IntrinsicFailure"
        );
        assert_eq!(failure("States.Base64Encode(1)", json!({})), "States.IntrinsicFailure");
        let long = "a".repeat(10_001);
        assert_eq!(
            failure("States.Base64Encode($.s)", json!({"s": long})),
            "States.IntrinsicFailure"
        );
    }

    #[test]
    fn hash() {
        // intrinsics/hash
        for (alg, digest) in [
            ("MD5", "812f45842bc6d66ee14572ce20db8e86"),
            ("SHA-1", "aaff4a450a104cd177d28d18d74485e8cae074b7"),
            ("SHA-256", "b4a697a057313163aee33cd8d40c66e9f0f177e00cac2de32475ffff6169c3e3"),
            ("SHA-384", "d28a7d5cf25a74f11a50a18452b75e04bb3d70c9dd0510d6123aa008c756511b87525bdc835ebb27e1fb9e9374a15562"),
            ("SHA-512", "6ce4adb348546d4f449c4d25aad9a7c9cb711d9e91982d3f0b29ca2f3f47d4ce2deba23bf2954f0f1d593fc50283731a533d30d425402d4f91316d871303aac4"),
        ] {
            pairs("States.Hash", &[(json!("input data"), json!(alg), json!(digest))]);
        }
        // intrinsics/several-functions-over-input-paths
        assert_eq!(
            ok("States.Hash($.text, 'SHA-256')", json!({"text": "Hash this string"})),
            json!("1cac63f39fd68d8c531f27b807610fb3d50f0fc3f186995767fb6316e7200a3e")
        );
        assert_eq!(
            failure("States.Hash('x', 'SHA-3')", json!({})),
            "States.IntrinsicFailure"
        );
        assert_eq!(failure("States.Hash(1, 'MD5')", json!({})), "States.IntrinsicFailure");
    }

    #[test]
    fn json_merge() {
        // intrinsics/json-merge-shallow
        assert_eq!(
            ok(
                "States.JsonMerge($.in0.fst, $.in0.snd, false)",
                json!({"in0": {"fst": {"a": {"a1": 1, "a2": 2}, "b": 2, "d": 3}, "snd": {"a": {"a3": 1, "a4": 2}, "c": 3, "d": 4}}})
            ),
            json!({"a": {"a3": 1, "a4": 2}, "b": 2, "c": 3, "d": 4})
        );
        // intrinsics/json-merge-nested-calls-and-escapes
        let input = json!({"input_field": {"constant_input_field": "constant_value"}});
        let got = run_full(
            "States.JsonMerge(States.StringToJson('{\"constant_in_literal\": \"false\"}'), $$.Execution.Input.input_field, false)",
            &input,
            &json!({"Execution": {"Input": input.clone()}}),
            &Map::new(),
            &Cell::new(Random::new(0)),
        )
        .unwrap();
        assert_eq!(
            got,
            json!({"constant_in_literal": "false", "constant_input_field": "constant_value"})
        );
        assert_eq!(
            failure("States.JsonMerge($.a, $.a, true)", json!({"a": {}})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            failure("States.JsonMerge($.a, 1, false)", json!({"a": {}})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            failure("States.JsonMerge($.a, $.a, 'false')", json!({"a": {}})),
            "States.IntrinsicFailure"
        );
    }

    #[test]
    fn math_add_rounds_each_argument() {
        // intrinsics/math-add-rounds-each-argument
        let cases = [
            (-9.0, 3.0, -6),
            (1.49, 1.5, 3),
            (1.5, 1.51, 4),
            (-1.49, -1.5, -2),
            (-1.5, -1.51, -3),
            (1.49, 0.0, 1),
            (1.49, -1.49, 0),
            (1.5, 0.0, 2),
            (1.51, 0.0, 2),
            (-1.49, 0.0, -1),
            (-1.5, 0.0, -1),
            (-1.51, 0.0, -2),
            (0.5, 0.0, 1),
            (1.5, 0.0, 2),
            (2.5, 0.0, 3),
            (3.5, 0.0, 4),
            (-0.5, 0.5, 1),
            (-0.5, 0.0, 0),
            (-1.5, 0.0, -1),
            (-2.5, 0.0, -2),
            (-3.5, 0.0, -3),
        ];
        for (a, b, want) in cases {
            let got = ok("States.MathAdd($.a, $.b)", json!({"a": a, "b": b}));
            assert_eq!(got.to_string(), want.to_string(), "{a} + {b}");
        }
        assert_eq!(ok("States.MathAdd($.a, $.b)", json!({"a": -9, "b": 3})), json!(-6));
        assert_eq!(ok("States.MathAdd($.a, $.b)", json!({"a": 5, "b": 3})), json!(8));
        assert_eq!(ok("States.MathAdd(1, -1)", json!({})), json!(0));
        assert_eq!(failure("States.MathAdd('1', 1)", json!({})), "States.IntrinsicFailure");
        assert_eq!(
            failure("States.MathAdd(2147483648, 1)", json!({})),
            "States.IntrinsicFailure"
        );
        assert_eq!(
            ok("States.MathAdd(2147483647, 2147483647)", json!({})),
            json!(4294967294i64)
        );
    }

    #[test]
    fn string_split() {
        // intrinsics/string-split
        pairs(
            "States.StringSplit",
            &[
                (json!(" "), json!(","), json!([" "])),
                (json!(" , "), json!(","), json!([" ", " "])),
                (json!(", , ,"), json!(","), json!([" ", " "])),
                (json!(",,,,"), json!(","), json!([])),
                (json!("1,2,3,4,5"), json!(","), json!(["1", "2", "3", "4", "5"])),
                (
                    json!("This.is+a,test=string"),
                    json!(".+,="),
                    json!(["This", "is", "a", "test", "string"]),
                ),
                (
                    json!("split on T and \nnew line"),
                    json!("T\n"),
                    json!(["split on ", " and ", "new line"]),
                ),
                (json!("abc"), json!(""), json!(["abc"])),
            ],
        );
        // intrinsics/string-split-context-input-newlines
        let input = json!({"FunctionInput": "Value1,Value2,Value3\nValue4,Value5,Value6\n,,,\ntrue,1,'HelloWorld'\nNull,None,\n   \n"});
        let got = run_full(
            "States.StringSplit($$.Execution.Input.FunctionInput, ',')",
            &input,
            &json!({"Execution": {"Input": input.clone()}}),
            &Map::new(),
            &Cell::new(Random::new(0)),
        )
        .unwrap();
        assert_eq!(
            got,
            json!([
                "Value1",
                "Value2",
                "Value3\nValue4",
                "Value5",
                "Value6\n",
                "\ntrue",
                "1",
                "'HelloWorld'\nNull",
                "None",
                "\n   \n"
            ])
        );
        // intrinsics/escape-sequence-in-literal-argument: the JSON "\n" is a real newline here.
        assert_eq!(
            ok("States.StringSplit('Hello\nWorld', '\n')", json!({})),
            json!(["Hello", "World"])
        );
        assert_eq!(
            failure("States.StringSplit(1, ',')", json!({})),
            "States.IntrinsicFailure"
        );
    }

    #[test]
    fn nested_calls() {
        // intrinsics/nested-calls
        let input = json!({"name": "alpha-beta-gamma"});
        assert_eq!(
            ok(
                "States.ArrayGetItem(States.StringSplit($.name, '-'), States.MathAdd(States.ArrayLength(States.StringSplit($.name, '-')), -1))",
                input.clone()
            ),
            json!("gamma")
        );
        assert_eq!(
            ok("States.ArrayGetItem(States.StringSplit($.name, '-'), 0)", input),
            json!("alpha")
        );
    }

    #[test]
    fn variables_and_context() {
        // variables/reference-in-intrinsic-functions, variables/nested-map-reads-outer-scopes
        let mut vars = Map::new();
        for (k, v) in [
            ("rawString", json!("Hello World")),
            ("json1", json!({"a": 1, "b": 2})),
            ("json2", json!({"c": 3, "d": 4})),
            ("csvString", json!("a,b,c,d,e")),
            ("xCurrent", json!(9)),
            ("yCurrent", json!(44)),
            ("zCurrent", json!(6)),
            ("bias", json!(4.3)),
        ] {
            vars.insert(k.into(), v);
        }
        let run_v = |t: &str| {
            run_full(
                t,
                &json!({}),
                &json!({"State": {"Name": "S"}}),
                &vars,
                &Cell::new(Random::new(1)),
            )
            .unwrap()
        };
        assert_eq!(run_v("States.Base64Encode($rawString)"), json!("SGVsbG8gV29ybGQ="));
        assert_eq!(
            run_v("States.JsonMerge($json1, $json2, false)"),
            json!({"a": 1, "b": 2, "c": 3, "d": 4})
        );
        assert_eq!(
            run_v("States.StringSplit($csvString, ',')"),
            json!(["a", "b", "c", "d", "e"])
        );
        assert_eq!(
            run_v("States.MathAdd(States.MathAdd(States.MathAdd($yCurrent, $xCurrent), $zCurrent), $bias)"),
            json!(63)
        );
        assert_eq!(run_v("States.Format('in {}', $$.State.Name)"), json!("in S"));
        // A missing path argument is States.Runtime.
        assert_eq!(failure("States.ArrayLength($.nope)", json!({})), "States.Runtime");
    }

    #[test]
    fn random_draws_are_pinned() {
        // Taken from the build before the random source moved to the kernel: a stored random
        // state draws the same numbers after an upgrade.
        let (doc, vars) = (json!(null), Map::new());
        let rng = Cell::new(Random::new(0));
        let env = Env {
            input: &doc,
            context: &doc,
            vars: &vars,
            rng: &rng,
        };
        assert_eq!(env.random(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(env.random(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(env.random(), 0x06c4_5d18_8009_454f);
        assert_eq!(rng.get().state(), 0xdaa6_6d2c_7ddf_743f);
        // A seed argument draws one splitmix64 step from the seed.
        let with_seed = |seed: i64| {
            run_full(
                &format!("States.MathRandom(0, 1000000000, {seed})"),
                &doc,
                &doc,
                &vars,
                &rng,
            )
            .unwrap()
        };
        assert_eq!(with_seed(42), json!(0xbdd7_3226_2feb_6e95_u64 % 1_000_000_000));
        assert_eq!(with_seed(-1), json!(0xe4d9_7177_1b65_2c20_u64 % 1_000_000_000));
    }

    #[test]
    fn uuid_and_random_are_deterministic() {
        // intrinsics/uuid-shape
        let rng = Cell::new(Random::new(42));
        let (input, ctx, vars) = (json!({}), json!({}), Map::new());
        let a = run_full("States.UUID()", &input, &ctx, &vars, &rng).unwrap();
        let b = run_full("States.UUID()", &input, &ctx, &vars, &rng).unwrap();
        assert_ne!(a, b);
        for u in [&a, &b] {
            let s = u.as_str().unwrap();
            let parts: Vec<&str> = s.split('-').collect();
            assert_eq!(
                parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
                vec![8, 4, 4, 4, 12],
                "{s}"
            );
            assert!(s
                .chars()
                .all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
            assert!(parts[2].starts_with('4'), "{s}");
            assert!("89ab".contains(&parts[3][..1]), "{s}");
        }
        let rng2 = Cell::new(Random::new(42));
        assert_eq!(run_full("States.UUID()", &input, &ctx, &vars, &rng2).unwrap(), a);
        for _ in 0..100 {
            let n = run_full("States.MathRandom(1, 999)", &input, &ctx, &vars, &rng).unwrap();
            let n = n.as_i64().unwrap();
            assert!((1..999).contains(&n), "{n}");
        }
        let s1 = run_full("States.MathRandom(0, 100, 7)", &input, &ctx, &vars, &rng).unwrap();
        let s2 = run_full(
            "States.MathRandom(0, 100, 7)",
            &input,
            &ctx,
            &vars,
            &Cell::new(Random::new(9)),
        )
        .unwrap();
        assert_eq!(s1, s2);
        assert_eq!(failure("States.MathRandom(5, 5)", json!({})), "States.IntrinsicFailure");
        assert_eq!(
            failure("States.MathRandom(5, 'x')", json!({})),
            "States.IntrinsicFailure"
        );
    }

    #[test]
    fn parse_errors() {
        for bad in [
            // validation/intrinsic-with-backslash-quote-escapes
            "States.Format('He said, \\\"Hello, {}!\\\"', 'Test \\\"Name\\\" Here')",
            "States.Format('a\\nb')",
            "States.Format('open",
            "States.Format('x') extra",
            "States.Format('x'",
            "States.Format('x',)",
            "States.Format()",
            "States.Nope(1)",
            "States.UUID(1)",
            "States.ArrayRange(1, 2)",
            "States.MathRandom(1)",
            "States.Array(foo)",
            "States.Array(1 2)",
            "States.Array($.a[)",
            "States.Array(1.2.3)",
            "States.Array('a\\')",
            "$.a",
            "",
        ] {
            assert!(Call::parse(bad).is_err(), "{bad:?} should not parse");
        }
        let deep = format!("{}1{}", "States.Array(".repeat(40), ")".repeat(40));
        assert!(Call::parse(&deep).is_err());
        let ok_deep = format!("{}1{}", "States.Array(".repeat(10), ")".repeat(10));
        assert!(Call::parse(&ok_deep).is_ok());
    }

    #[test]
    fn arguments() {
        assert_eq!(
            ok(
                "States.Array( 1 , -2.5,1e2, null, true, false, 'a,b)', $.x[0], $['k,)'] )",
                json!({"x": [7], "k,)": 8})
            ),
            json!([1, -2.5, 100.0, null, true, false, "a,b)", 7, 8])
        );
        assert_eq!(
            ok("States.Array($.a[?(@.v > 1)].v)", json!({"a": [{"v": 1}, {"v": 2}]})),
            json!([[2]])
        );
        assert_eq!(ok("States.Array('\\'\\{\\}\\\\')", json!({})), json!(["'{}\\"]));
        assert_eq!(ok("States.Array('{}')", json!({})), json!(["{}"]));
        assert_eq!(ok("States.Array('\"quoted\"')", json!({})), json!(["\"quoted\""]));
        assert_eq!(Call::parse("States.UUID()").unwrap().text(), "States.UUID()");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn never_panics(args in "[$a-z0-9_.,'{}\\\\()\\[\\] -]{0,24}", f in 0usize..18) {
            let text = format!("{}({args})", FUNCS[f].1);
            if let Ok(c) = Call::parse(&text) {
                let doc = json!({"a": [1, "b", {"c": 2}], "s": "x,y", "n": 2.5});
                let vars = Map::new();
                let rng = Cell::new(Random::new(1));
                let env = Env { input: &doc, context: &doc, vars: &vars, rng: &rng };
                let _ = c.eval(&env);
            }
        }
    }
}
