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

mod metered;

use crate::json::{from_val, to_val};
use jaq_core::box_iter::box_once;
use jaq_core::load::parse::{BinaryOp, Def, Pattern, Term};
use jaq_core::load::{Arena, File, Loader};
use jaq_core::native::{bome, run, v, Fun};
use jaq_core::ops::{Cmp, Math};
use jaq_core::path::{Part, Path};
use jaq_core::{Ctx, DataT, Exn, Vars};
use jaq_json::Val;
use serde_json::Value;
use std::cell::Cell;
use std::sync::{Arc, OnceLock};

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

/// Names refused by the sandbox, with the reason shown to the user.
const REFUSED: &[(&str, &str)] = &[
    ("env", "reads the process environment"),
    ("$ENV", "reads the process environment"),
    ("input", "reads the process input"),
    ("inputs", "reads the process input"),
    ("halt", "stops the process"),
    ("halt_error", "stops the process"),
    (
        "now",
        "reads the wall clock; instance time comes from its recorded inputs",
    ),
    ("localtime", "depends on the host's time zone"),
    ("strflocaltime", "depends on the host's time zone"),
    ("mktime", "is not deterministic across hosts"),
    ("input_filename", "reads the process input"),
    ("$__loc__", "is not supported"),
    ("get_search_list", "reads files"),
];

/// Every jq function a definition may call, as (name, arity), sorted. The sandbox is built from this
/// list: jaq's natives and standard definitions that are on it, and [`OUR_DEFS`] (which must all be on
/// it). Everything else, including whatever a newer jaq adds, is refused when an expression is
/// compiled. Some entries are jaq's helpers behind standard definitions (`error_empty`, `matches`,
/// `split_`, `totype`, ...), callable like any definition and as harmless.
pub const ALLOWED: &[(&str, usize)] = &[
    ("@base64", 0),
    ("@base64d", 0),
    ("@html", 0),
    ("@htmld", 0),
    ("@json", 0),
    ("@sh", 0),
    ("@text", 0),
    ("@uri", 0),
    ("@urid", 0),
    ("abs", 0),
    ("acos", 0),
    ("acosh", 0),
    ("add", 0),
    ("add", 1),
    ("all", 0),
    ("all", 1),
    ("all", 2),
    ("any", 0),
    ("any", 1),
    ("any", 2),
    ("arrays", 0),
    ("ascii_downcase", 0),
    ("ascii_upcase", 0),
    ("asin", 0),
    ("asinh", 0),
    ("atan", 0),
    ("atan2", 2),
    ("atanh", 0),
    ("booleans", 0),
    ("bsearch", 1),
    ("capture", 1),
    ("capture", 2),
    ("capture_of_match", 0),
    ("cbrt", 0),
    ("ceil", 0),
    ("combinations", 0),
    ("combinations", 1),
    ("contains", 1),
    ("copysign", 2),
    ("cos", 0),
    ("cosh", 0),
    ("debug", 0),
    ("debug", 1),
    ("decode_base64", 0),
    ("decode_uri", 0),
    ("del", 1),
    ("delpaths", 1),
    ("drem", 2),
    ("empty", 0),
    ("encode_base64", 0),
    ("encode_uri", 0),
    ("endswith", 1),
    ("erf", 0),
    ("erfc", 0),
    ("error", 0),
    ("error", 1),
    ("error_empty", 0),
    ("escape_html", 0),
    ("escape_sh", 0),
    ("exp", 0),
    ("exp10", 0),
    ("exp2", 0),
    ("explode", 0),
    ("expm1", 0),
    ("fabs", 0),
    ("false", 0),
    ("fdim", 2),
    ("finites", 0),
    ("first", 0),
    ("first", 1),
    ("flatten", 0),
    ("flatten", 1),
    ("floor", 0),
    ("fma", 3),
    ("fmax", 2),
    ("fmin", 2),
    ("fmod", 2),
    ("frexp", 0),
    ("from_entries", 0),
    ("fromdate", 0),
    ("fromdateiso8601", 0),
    ("fromjson", 0),
    ("gamma", 0),
    ("getpath", 1),
    ("gmtime", 0),
    ("group_by", 1),
    ("gsub", 2),
    ("gsub", 3),
    ("has", 1),
    ("hypot", 2),
    ("ilogb", 0),
    ("implode", 0),
    ("in", 1),
    ("index", 1),
    ("indices", 1),
    ("infinite", 0),
    ("inside", 1),
    ("isarray", 0),
    ("isboolean", 0),
    ("isempty", 1),
    ("isfinite", 0),
    ("isinfinite", 0),
    ("isnan", 0),
    ("isnormal", 0),
    ("isnumber", 0),
    ("isobject", 0),
    ("isstring", 0),
    ("iterables", 0),
    ("j0", 0),
    ("j1", 0),
    ("jn", 2),
    ("join", 1),
    ("key_values", 0),
    ("keys", 0),
    ("keys_unsorted", 0),
    ("last", 0),
    ("last", 1),
    ("ldexp", 2),
    ("length", 0),
    ("lgamma", 0),
    ("limit", 2),
    ("log", 0),
    ("log10", 0),
    ("log1p", 0),
    ("log2", 0),
    ("logb", 0),
    ("ltrim", 0),
    ("ltrimstr", 1),
    ("map", 1),
    ("map_values", 1),
    ("match", 1),
    ("match", 2),
    ("matches", 2),
    ("max", 0),
    ("max_by", 1),
    ("max_by_or_empty", 1),
    ("min", 0),
    ("min_by", 1),
    ("min_by_or_empty", 1),
    ("modf", 0),
    ("nan", 0),
    ("nearbyint", 0),
    ("nextafter", 2),
    ("nexttoward", 2),
    ("normals", 0),
    ("not", 0),
    ("nth", 1),
    ("nth", 2),
    ("null", 0),
    ("nulls", 0),
    ("numbers", 0),
    ("objects", 0),
    ("path", 1),
    ("path_value", 1),
    ("paths", 0),
    ("paths", 1),
    ("pick", 1),
    ("pow", 2),
    ("pow10", 0),
    ("range", 1),
    ("range", 2),
    ("range", 3),
    ("recurse", 0),
    ("recurse", 1),
    ("recurse", 2),
    ("remainder", 2),
    ("repeat", 1),
    ("reverse", 0),
    ("rindex", 1),
    ("rint", 0),
    ("round", 0),
    ("rtrim", 0),
    ("rtrimstr", 1),
    ("scalars", 0),
    ("scalb", 2),
    ("scalbln", 2),
    ("scan", 1),
    ("scan", 2),
    ("scan_", 2),
    ("schedule", 0),
    ("select", 1),
    ("setpath", 2),
    ("significand", 0),
    ("sin", 0),
    ("sinh", 0),
    ("skip", 2),
    ("sort", 0),
    ("sort_by", 1),
    ("split", 1),
    ("split", 2),
    ("split_", 2),
    ("split_matches", 2),
    ("splits", 1),
    ("splits", 2),
    ("sqrt", 0),
    ("startswith", 1),
    ("stderr", 0),
    ("strftime", 1),
    ("strings", 0),
    ("strptime", 1),
    ("sub", 2),
    ("sub", 3),
    ("tan", 0),
    ("tanh", 0),
    ("test", 1),
    ("test", 2),
    ("tgamma", 0),
    ("to_entries", 0),
    ("toboolean", 0),
    ("tobytes", 0),
    ("todate", 0),
    ("todateiso8601", 0),
    ("tojson", 0),
    ("tonumber", 0),
    ("tostring", 0),
    ("totype", 2),
    ("transpose", 0),
    ("trim", 0),
    ("true", 0),
    ("trunc", 0),
    ("type", 0),
    ("unescape_html", 0),
    ("unique", 0),
    ("unique_by", 1),
    ("until", 2),
    ("utf8bytelength", 0),
    ("values", 0),
    ("walk", 1),
    ("while", 2),
    ("with_entries", 1),
    ("y0", 0),
    ("y1", 0),
    ("yn", 2),
];

/// True when `name/arity` is on [`ALLOWED`].
fn allowed(name: &str, arity: usize) -> bool {
    ALLOWED.binary_search(&(name, arity)).is_ok()
}

/// Definitions we add: sandboxed replacements, and `range/3` as a recursion that burns fuel.
const OUR_DEFS: &str = r#"
def fromjson: __json_depth | __fromjson;
def matches(re; flags): __regex_guard(flags) | __matches(re; flags);
def split_matches(re; flags): __regex_guard(flags) | __split_matches(re; flags);
def split_(re; flags): __regex_guard(flags) | __split_(re; flags);
def debug: .;
def debug(msgs): .;
def stderr: .;
def range($from; $upto; $by):
  def up: if . < $upto then ., (. + $by | up) else empty end;
  def down: if . > $upto then ., (. + $by | down) else empty end;
  if $by > 0 then $from | up elif $by < 0 then $from | down else empty end;
"#;

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

/// What an array element and an object entry count for against [`Limits::memory`].
const VAL_BYTES: u64 = 16;
const ENTRY_BYTES: u64 = 48;
/// What `fromjson` is charged per byte of text (the most a JSON text can grow into as values), and
/// a global regex function per character of its input (the most its matches can take).
const JSON_FACTOR: u64 = 8;
const MATCH_BYTES: u64 = 64;

/// The natives whose output is new and can be large: their output is checked and charged.
const SIZED: &[&str] = &[
    "__fromjson",
    "ascii_downcase",
    "ascii_upcase",
    "decode_base64",
    "decode_uri",
    "encode_base64",
    "encode_uri",
    "escape_html",
    "escape_sh",
    "explode",
    "group_by",
    "implode",
    "indices",
    "keys_unsorted",
    "reverse",
    "sort",
    "sort_by",
    "strftime",
    "todateiso8601",
    "tojson",
    "unescape_html",
];

/// What a value counts for against [`Limits::memory`]: its own size, not its elements'.
fn shallow_size(v: &Val) -> u64 {
    match v {
        Val::TStr(s) | Val::BStr(s) => s.len() as u64,
        Val::Arr(a) => a.len() as u64 * VAL_BYTES,
        Val::Obj(o) => o.len() as u64 * ENTRY_BYTES,
        _ => 0,
    }
}

/// The size of `v` as the JSON it stands for, counted as [`Limits::memory`] counts what is built
/// (string bytes, [`VAL_BYTES`] an array element, [`ENTRY_BYTES`] and the key an object entry, at
/// least a byte a value), or `None` once it passes `budget`. jq shares values rather than copying
/// them, so `[., .]` or `.a = .` build almost nothing while the value they yield, written out,
/// doubles: repeated, a few bytes of jq stand for more JSON than the host has memory. Each share is
/// counted as often as it appears; the walk stops at the budget, so it costs at most that much.
fn expanded_size(v: &Val, budget: u64) -> Option<u64> {
    let mut left = budget;
    let mut todo: Vec<&Val> = Vec::new();
    let mut next = Some(v);
    while let Some(v) = next.take().or_else(|| todo.pop()) {
        left = left.checked_sub(shallow_size(v).max(1))?;
        match v {
            Val::Arr(a) => todo.extend(a.iter()),
            Val::Obj(o) => {
                for (k, x) in o.iter() {
                    left = left.checked_sub(shallow_size(k))?;
                    todo.push(x);
                }
            }
            _ => {}
        }
    }
    Some(budget - left)
}

/// In one walk: `None` when the [`expanded_size`] of `v` passes `budget`, else whether `v` nests
/// arrays and objects deeper than `depth` levels ([`crate::json::val_too_deep`]). It recurses
/// only `depth` levels deep, and allocates nothing for values that stay within them.
fn size_and_depth(v: &Val, budget: u64, depth: usize) -> Option<bool> {
    fn walk(v: &Val, left: &mut u64, depth: usize, deep: &mut bool) -> Option<()> {
        *left = left.checked_sub(shallow_size(v).max(1))?;
        let children: &mut dyn Iterator<Item = &Val> = match v {
            Val::Arr(a) => &mut a.iter(),
            Val::Obj(o) => {
                for k in o.keys() {
                    *left = left.checked_sub(shallow_size(k))?;
                }
                &mut o.values()
            }
            _ => return Some(()),
        };
        if depth == 0 {
            // A container past the depth limit: count the rest without recursing further.
            *deep = true;
            for c in children {
                *left -= expanded_size(c, *left)?;
            }
        } else {
            for c in children {
                walk(c, left, depth - 1, deep)?;
            }
        }
        Some(())
    }
    let mut left = budget;
    let mut deep = false;
    walk(v, &mut left, depth, &mut deep)?;
    Some(deep)
}

/// A sink for text that fails once more than its bytes would be written.
struct BoundedText(usize);

impl std::fmt::Write for BoundedText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0 = self.0.checked_sub(s.len()).ok_or(std::fmt::Error)?;
        Ok(())
    }
}

/// Checks that the JSON text of an array or object fits the string limit, writing it into a sink
/// that stops at the limit (strings and numbers are bounded already).
fn text_fits(env: &Env, v: &Val) -> Result<(), i32> {
    if !matches!(v, Val::Arr(_) | Val::Obj(_)) {
        return Ok(());
    }
    let mut sink = BoundedText(env.limits.max_string);
    match std::fmt::write(&mut sink, format_args!("{v}")) {
        Ok(()) => Ok(()),
        Err(_) => Err(STRING_TOO_LONG),
    }
}

/// An error `try` is about to catch, with a text (an error that is not a value) written within the
/// string limit first; a longer text stops the evaluation.
fn caught_text<'a>(env: &Env, exn: Exn<'a, Val>) -> Exn<'a, Val> {
    let err = match exn.get_err() {
        Ok(err) => err,
        Err(other) => return other,
    };
    // jaq keeps an error made from a value (`error(v)`) as that value and the others as parts of a
    // text; only its `Debug` tells them apart, and the start of it says which.
    let mut start = TextStart(String::new());
    let _ = std::fmt::write(&mut start, format_args!("{err:?}"));
    if start.0.starts_with("Error(Val(") {
        return Exn::from(err);
    }
    let mut text = CappedText(String::new(), env.limits.max_string);
    if std::fmt::write(&mut text, format_args!("{err}")).is_err() {
        return halt(env, STRING_TOO_LONG);
    }
    Exn::from(jaq_core::Error::new(Val::from(text.0)))
}

/// A text written once, failing once more than its bytes would be written.
struct CappedText(String, usize);

impl std::fmt::Write for CappedText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.1 = self.1.checked_sub(s.len()).ok_or(std::fmt::Error)?;
        self.0.push_str(s);
        Ok(())
    }
}

/// The first few bytes of a text, then a failure that ends the writing.
struct TextStart(String);

impl std::fmt::Write for TextStart {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = 16usize.saturating_sub(self.0.len());
        self.0.extend(s.chars().take(room));
        if self.0.len() >= 16 {
            return Err(std::fmt::Error);
        }
        Ok(())
    }
}

/// Checks a value against the size limits (not charging it).
fn check_size(env: &Env, v: &Val) -> Result<(), i32> {
    match v {
        Val::TStr(s) | Val::BStr(s) if s.len() > env.limits.max_string => Err(STRING_TOO_LONG),
        Val::Arr(a) if a.len() > env.limits.max_items => Err(TOO_MANY_ITEMS),
        Val::Obj(o) if o.len() > env.limits.max_items => Err(TOO_MANY_ITEMS),
        _ => Ok(()),
    }
}

/// Takes `bytes` from what the evaluation may still build.
fn charge(env: &Env, bytes: u64) -> Result<(), i32> {
    match env.memory.get().checked_sub(bytes) {
        Some(left) => {
            env.memory.set(left);
            Ok(())
        }
        None => Err(OUT_OF_MEMORY),
    }
}

/// Checks a new value and charges it.
fn check_new(env: &Env, v: &Val) -> Result<(), i32> {
    check_size(env, v)?;
    charge(env, shallow_size(v))
}

/// Charges what comparing `l` with `r` may walk. Values share their parts (`.a = .`, `[., .]`), so
/// two arrays or objects built in a few steps can stand for more JSON than the host has memory, and
/// comparing them walks all of it: an equality walks at most the smaller, an ordering may walk both
/// (it sorts each object's keys). That is charged against [`Limits::memory`] as if it were built,
/// each walk stopping at what is left, so that comparisons cannot take longer than building would.
/// Scalars, and values of different kinds, compare at once and cost nothing.
fn charge_compare(env: &Env, op: Cmp, l: &Val, r: &Val) -> Result<(), i32> {
    let containers = matches!((l, r), (Val::Arr(_), Val::Arr(_)) | (Val::Obj(_), Val::Obj(_)));
    if !containers {
        return Ok(());
    }
    let left = env.memory.get();
    let cost = match op {
        Cmp::Eq | Cmp::Ne => {
            let sl = expanded_size(l, left);
            match (sl, expanded_size(r, sl.unwrap_or(left))) {
                (_, Some(b)) => b,
                (Some(a), None) => a,
                (None, None) => return Err(OUT_OF_MEMORY),
            }
        }
        _ => {
            let sl = expanded_size(l, left).ok_or(OUT_OF_MEMORY)?;
            sl + expanded_size(r, left - sl).ok_or(OUT_OF_MEMORY)?
        }
    };
    charge(env, cost)
}

/// Charges the size of an array or object that is about to be sorted or compared as a whole.
fn charge_walk(env: &Env, v: &Val) -> Result<(), i32> {
    if !matches!(v, Val::Arr(_) | Val::Obj(_)) {
        return Ok(());
    }
    let size = expanded_size(v, env.memory.get()).ok_or(OUT_OF_MEMORY)?;
    charge(env, size)
}

fn str_len(v: &Val) -> Option<usize> {
    match v {
        Val::TStr(s) | Val::BStr(s) => Some(s.len()),
        _ => None,
    }
}

/// `l + r`, `l * r` and `l / r`, refusing before they allocate what would cross a limit.
fn checked_math(env: &Env, op: Math, l: Val, r: Val) -> Result<Result<Val, jaq_core::Error<Val>>, i32> {
    let limits = env.limits;
    let before = shallow_size(&l);
    match (op, &l, &r) {
        (Math::Add, Val::TStr(a) | Val::BStr(a), Val::TStr(b) | Val::BStr(b))
            if a.len().saturating_add(b.len()) > limits.max_string =>
        {
            return Err(STRING_TOO_LONG);
        }
        (Math::Add, Val::Arr(a), Val::Arr(b)) if a.len().saturating_add(b.len()) > limits.max_items => {
            return Err(TOO_MANY_ITEMS);
        }
        (Math::Mul, Val::TStr(_) | Val::BStr(_), Val::Num(n))
        | (Math::Mul, Val::Num(n), Val::TStr(_) | Val::BStr(_)) => {
            let len = str_len(&l).or_else(|| str_len(&r)).unwrap_or(0);
            let times = match n {
                jaq_json::Num::Int(i) => (*i).max(0) as u64,
                big @ jaq_json::Num::BigInt(_) => {
                    if Val::Num(big.clone()) < Val::Num(jaq_json::Num::Int(0)) {
                        0
                    } else {
                        u64::MAX
                    }
                }
                _ => 0,
            };
            let total = (len as u64).saturating_mul(times);
            if total > limits.max_string as u64 {
                return Err(STRING_TOO_LONG);
            }
            charge(env, total)?;
            return Ok(op.run(l, r));
        }
        // `l * r` of two objects merges them deeply, down every key where both hold an object: it
        // walks at most the smaller, and builds anew what it walks. `l - r` of two arrays compares
        // every element of `l` with those of `r`. Both are charged like comparisons first: values
        // that share their parts stand for more than the host has memory.
        (Math::Mul, Val::Obj(_), Val::Obj(_)) => charge_compare(env, Cmp::Eq, &l, &r)?,
        (Math::Sub, Val::Arr(_), Val::Arr(_)) => charge_compare(env, Cmp::Lt, &l, &r)?,
        (Math::Div, Val::TStr(a), Val::TStr(b)) | (Math::Div, Val::BStr(a), Val::BStr(b)) => {
            let pieces = split_count(a, b) as u64;
            if pieces > limits.max_items as u64 {
                return Err(TOO_MANY_ITEMS);
            }
            charge(env, pieces * VAL_BYTES)?;
            return Ok(op.run(l, r));
        }
        _ => {}
    }
    let out = op.run(l, r);
    if let Ok(v) = &out {
        check_size(env, v)?;
        let grown = match op {
            Math::Add | Math::Sub => shallow_size(v).saturating_sub(before),
            _ => shallow_size(v),
        };
        charge(env, grown)?;
    }
    Ok(out)
}

/// How many pieces `s / sep` yields (jaq splits on characters when `sep` is empty), counted
/// without allocating.
fn split_count(s: &[u8], sep: &[u8]) -> usize {
    if s.is_empty() {
        0
    } else if sep.is_empty() {
        // One piece per character: count the bytes that do not continue a UTF-8 sequence.
        s.iter().filter(|b| (**b & 0xC0) != 0x80).count()
    } else {
        let (mut n, mut i) = (1, 0);
        while i + sep.len() <= s.len() {
            if &s[i..i + sep.len()] == sep {
                n += 1;
                i += sep.len();
            } else {
                i += 1;
            }
        }
        n
    }
}

/// An address in the current stack frame.
#[inline(always)]
fn stack_address() -> usize {
    let probe = 0u8;
    std::hint::black_box(&probe) as *const u8 as usize
}

/// Deepest nesting `fromjson` accepts.
pub const MAX_JSON_DEPTH: usize = 10_000;

/// The deepest nesting of arrays and objects in a JSON text (strings skipped).
fn json_nesting(text: &str) -> usize {
    crate::json::text_nesting(text.as_bytes())
}

/// The halt of a limit, remembered (see [`Env::halted`]).
fn halt<'a>(env: &Env, code: i32) -> Exn<'a, Val> {
    if env.halted.get().is_none() {
        env.halted.set(Some(code));
    }
    Exn::halt(code)
}

/// The halt code of the limit that stopped the evaluation, if one did.
fn halted(env: &Env) -> Option<i32> {
    env.halted.get()
}

/// Burns `n` units of fuel at once (all that is left when that is fewer, then the halt code).
fn burn_n(env: &Env, n: u64) -> Result<(), i32> {
    match env.fuel.get().checked_sub(n) {
        Some(left) => {
            env.fuel.set(left);
            Ok(())
        }
        None => {
            env.fuel.set(0);
            Err(OUT_OF_FUEL)
        }
    }
}

/// Burns one unit of fuel; the halt code when fuel or stack is exhausted.
fn burn(env: &Env) -> Result<(), i32> {
    if stack_address().abs_diff(env.base) > env.stack_bytes {
        return Err(OUT_OF_STACK);
    }
    match env.fuel.get() {
        0 => Err(OUT_OF_FUEL),
        n => {
            env.fuel.set(n - 1);
            Ok(())
        }
    }
}

thread_local! {
    /// What `schedule` yields while an instance handles an input on this thread (see
    /// [`with_schedule`]); natives are plain functions and cannot capture the instance.
    static SCHEDULE: std::cell::RefCell<Val> = const { std::cell::RefCell::new(Val::Null) };
}

/// Runs `f` with `schedule` yielding `schedule` (the instance's [`crate::engine::Scheduled`] as
/// definitions see it, or null), as it was before once `f` returns or unwinds.
pub(crate) fn with_schedule<R>(schedule: Val, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Val>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(v) = self.0.take() {
                SCHEDULE.with(|s| *s.borrow_mut() = v);
            }
        }
    }
    let before = SCHEDULE.with(|s| std::mem::replace(&mut *s.borrow_mut(), schedule));
    let _restore = Restore(Some(before));
    f()
}

fn natives() -> Vec<Fun<Data>> {
    // `schedule`: the schedule that started the instance and the nominal time of its run,
    // `{"id", "nominalTime"}`, or null. Recorded in the start's journal entry, so a replay reads
    // the same.
    let schedule: Fun<Data> = run(("schedule", v(0), |_cv| bome(Ok(SCHEDULE.with(|s| s.borrow().clone())))));
    // `__tick` passes its input through (also as a path and under updates, so definitions such as
    // `select` and `first` still work in `del(...)` and `|=`), burning one unit of fuel.
    let tick: Fun<Data> = (
        "__tick",
        v(0),
        jaq_core::Native::new(|cv| match burn(cv.0.data()) {
            Ok(()) => bome(Ok(cv.1)),
            Err(code) => box_once(Err(halt(cv.0.data(), code))),
        })
        .with_paths(|cv| match burn(cv.0.data()) {
            Ok(()) => box_once(Ok(cv.1)),
            Err(code) => box_once(Err(halt(cv.0.data(), code))),
        })
        .with_update(|cv, f| match burn(cv.0.data()) {
            Ok(()) => f(cv.1),
            Err(code) => box_once(Err(halt(cv.0.data(), code))),
        }),
    );
    // `__gate` passes its input through until a limit has stopped the evaluation, then raises that
    // halt again. It goes before the right operand of the pairs jaq makes (see `gated`), so that
    // after a limit each pair has a halt on its right and passes it on.
    let gate: Fun<Data> = (
        "__gate",
        v(0),
        jaq_core::Native::new(|cv| match halted(cv.0.data()) {
            None => bome(Ok(cv.1)),
            Some(code) => box_once(Err(Exn::halt(code))),
        })
        .with_paths(|cv| match halted(cv.0.data()) {
            None => box_once(Ok(cv.1)),
            Some(code) => box_once(Err(Exn::halt(code))),
        })
        .with_update(|cv, f| match halted(cv.0.data()) {
            None => f(cv.1),
            Some(code) => box_once(Err(Exn::halt(code))),
        }),
    );
    // `__fits` passes a value on only if its JSON text fits the string limit: it goes before what
    // writes a value out as text (`tojson`, and string interpolation, so `tostring`), which jaq
    // would otherwise write whole before its length is checked (a value sharing its parts can
    // stand for more text than the host has memory).
    let fits: Fun<Data> = run(("__fits", v(0), |cv| match text_fits(cv.0.data(), &cv.1) {
        Ok(()) => bome(Ok(cv.1)),
        Err(code) => box_once(Err(halt(cv.0.data(), code))),
    }));
    // `__epoch` passes on what `gmtime` and `strftime` may read as seconds since the epoch: jaq-std
    // multiplies an integer by a million in `i64` first, which overflows past 9.2e12 (a panic where
    // overflow is checked, a wrong time where it is not). Seconds well past the years jiff knows
    // (-9999 to 9999) are an error here, as jiff's own are nearer them.
    let epoch: Fun<Data> = run(("__epoch", v(0), |cv| {
        // jiff's range: -377705023201 to 253402207200 seconds.
        const MAX_SECONDS: isize = 377_705_023_201;
        match jaq_std::ValT::as_isize(&cv.1) {
            Some(i) if i.unsigned_abs() > MAX_SECONDS as usize => bome(Err(jaq_core::Error::str(format!(
                "cannot convert {} to time: it is outside the years -9999 to 9999",
                cv.1
            )))),
            _ => bome(Ok(cv.1)),
        }
    }));
    fn caught(env: &Env, error: &Val) -> Result<(), i32> {
        burn(env)?;
        charge(env, str_len(error).map_or(VAL_BYTES, |n| n as u64))
    }
    let caught_: Fun<Data> = run(("__caught", v(0), |cv| match caught(cv.0.data(), &cv.1) {
        Ok(()) => bome(Ok(cv.1)),
        Err(code) => box_once(Err(halt(cv.0.data(), code))),
    }));
    let dropped: Fun<Data> = run(("__dropped", v(0), |cv| match caught(cv.0.data(), &cv.1) {
        Ok(()) => Box::new(std::iter::empty()),
        Err(code) => box_once(Err(halt(cv.0.data(), code))),
    }));
    // `__guard(f)` is `f`, with each error that is not a value (`cannot index [..] with "a"`) turned
    // into its text before `try` catches it: jaq writes that text whole before a handler runs, and
    // a value that shares its parts can stand for more text than the host has memory. Here it is
    // written with the string limit as its bound first.
    let guard: Fun<Data> = (
        "__guard",
        [jaq_core::Bind::Fun(())].into(),
        jaq_core::Native::<Data>::new(|mut cv| {
            let (f, fc) = cv.0.pop_fun();
            let env: Env = cv.0.data().clone();
            Box::new(f.run((fc, cv.1)).map(move |y| y.map_err(|e| caught_text(&env, e))))
        })
        .with_paths(|mut cv| {
            let (f, fc) = cv.0.pop_fun();
            let env: Env = fc.data().clone();
            Box::new(f.paths((fc, cv.1)).map(move |y| y.map_err(|e| caught_text(&env, e))))
        }),
    );
    // jq's `fromjson` reads one JSON value from a text, and errors on anything after it (so
    // `"2024-01-01" | tonumber` is an error); jaq-json's reads a sequence of values.
    let fromjson: Fun<Data> = run(("__fromjson", v(0), |cv| {
        let bytes = match cv.1.try_as_utf8_bytes_owned() {
            Ok(bytes) => bytes,
            Err(e) => return bome(Err(e)),
        };
        bome(
            jaq_json::read::parse_single(&bytes)
                .map_err(|e| jaq_core::Error::str(format_args!("cannot parse {} as JSON: {e}", cv.1))),
        )
    }));
    let getp: Fun<Data> = run(("__getp", v(1), |mut cv| {
        let path = cv.0.pop_var();
        bome(crate::fast::get_path(&cv.1, &path).map_err(jaq_core::Error::str))
    }));
    let setp: Fun<Data> = run(("__setp", v(2), |mut cv| {
        let x = cv.0.pop_var();
        let path = cv.0.pop_var();
        bome(crate::fast::set_path(cv.1, &path, x).map_err(jaq_core::Error::str))
    }));
    // Deeply nested JSON would exhaust the stack while it is parsed and later converted; a long
    // text is charged for the most it can turn into before it is parsed.
    let depth: Fun<Data> = run(("__json_depth", v(0), |cv| {
        let len = str_len(&cv.1).unwrap_or(0) as u64;
        if let Err(code) = charge(cv.0.data(), len.saturating_mul(JSON_FACTOR)) {
            return box_once(Err(halt(cv.0.data(), code)));
        }
        let deep = crate::json::as_str(&cv.1).is_some_and(|s| json_nesting(&s) > MAX_JSON_DEPTH);
        if deep {
            bome(Err(jaq_core::Error::str(format!(
                "fromjson: the text nests deeper than {MAX_JSON_DEPTH} levels"
            ))))
        } else {
            bome(Ok(cv.1))
        }
    }));
    fn math(mut cv: jaq_core::Cv<Data>, op: Math) -> jaq_core::ValXs<Val> {
        let r = cv.0.pop_var();
        match checked_math(cv.0.data(), op, cv.1, r) {
            Ok(out) => bome(out),
            Err(code) => box_once(Err(halt(cv.0.data(), code))),
        }
    }
    fn compare(mut cv: jaq_core::Cv<Data>, op: Cmp) -> jaq_core::ValXs<Val> {
        let r = cv.0.pop_var();
        match charge_compare(cv.0.data(), op, &cv.1, &r) {
            Ok(()) => bome(Ok(Val::from(op.run(&cv.1, &r)))),
            Err(code) => box_once(Err(halt(cv.0.data(), code))),
        }
    }
    let eq: Fun<Data> = run(("__eq", v(1), |cv| compare(cv, Cmp::Eq)));
    let ne: Fun<Data> = run(("__ne", v(1), |cv| compare(cv, Cmp::Ne)));
    let lt: Fun<Data> = run(("__lt", v(1), |cv| compare(cv, Cmp::Lt)));
    let le: Fun<Data> = run(("__le", v(1), |cv| compare(cv, Cmp::Le)));
    let gt: Fun<Data> = run(("__gt", v(1), |cv| compare(cv, Cmp::Gt)));
    let ge: Fun<Data> = run(("__ge", v(1), |cv| compare(cv, Cmp::Ge)));
    // `__sorted` goes before what sorts or groups its input, and after the keys of `sort_by(f)` and
    // its kin: each is charged its size, as comparing it may walk all of it (see `charge_compare`).
    let sorted: Fun<Data> = run(("__sorted", v(0), |cv| match charge_walk(cv.0.data(), &cv.1) {
        Ok(()) => bome(Ok(cv.1)),
        Err(code) => box_once(Err(halt(cv.0.data(), code))),
    }));
    // `__keyed(k)` is `k`, given the value it indexes (see `keyed_path`), and `k` is charged its size;
    // with an array key, so is the input. An array key in an array (`.[[1, 2]]`, `x[k]`) finds where
    // it occurs, comparing element by element: those comparisons are made here first, paying fuel as
    // `indices` does, so jaq's own search after it costs at most as much again and never runs unpaid.
    // An object key is charged too, as every key was before `__keyed`: jaq names it in the error it
    // raises, and a fuzz input (`... .[..] ...`) looped without end on object keys that were free.
    let keyed: Fun<Data> = run(("__keyed", v(1), |mut cv| {
        let key = cv.0.pop_var();
        let data = cv.0.data();
        let paid = charge_walk(data, &key).and_then(|()| match (&cv.1, &key) {
            (Val::Arr(_), Val::Arr(_)) => {
                charge_walk(data, &cv.1).and_then(|()| metered::indices(data, &cv.1, &key).map(drop))
            }
            (_, Val::Arr(_)) => charge_walk(data, &cv.1),
            _ => Ok(()),
        });
        if let Err(code) = paid {
            return box_once(Err(halt(cv.0.data(), code)));
        }
        bome(Ok(key))
    }));
    // `contains` and `indices` pay fuel for the comparisons they make (see `metered`).
    let contains: Fun<Data> = run(("contains", v(1), |mut cv| {
        let r = cv.0.pop_var();
        match metered::contains(cv.0.data(), &cv.1, &r) {
            Ok(b) => bome(Ok(Val::from(b))),
            Err(code) => box_once(Err(halt(cv.0.data(), code))),
        }
    }));
    let indices: Fun<Data> = run(("indices", v(1), |mut cv| {
        let y = cv.0.pop_var();
        match metered::indices(cv.0.data(), &cv.1, &y) {
            Ok(Some(found)) => bome(Ok(found.into_iter().map(|i| Val::from(i as isize)).collect())),
            Ok(None) => bome(Err(jaq_core::Error::index(cv.1, y))),
            Err(code) => box_once(Err(halt(cv.0.data(), code))),
        }
    }));
    let add: Fun<Data> = run(("__add", v(1), |cv| math(cv, Math::Add)));
    let mul: Fun<Data> = run(("__mul", v(1), |cv| math(cv, Math::Mul)));
    let div: Fun<Data> = run(("__div", v(1), |cv| math(cv, Math::Div)));
    let sub: Fun<Data> = run(("__sub", v(1), |cv| math(cv, Math::Sub)));
    // `[f]` collects `f | __item`: every element counts before the array holds it.
    let item: Fun<Data> = run(("__item", v(0), |cv| match charge(cv.0.data(), VAL_BYTES) {
        Ok(()) => bome(Ok(cv.1)),
        Err(code) => box_once(Err(halt(cv.0.data(), code))),
    }));
    // `__check` passes a new value through (also as a path and under updates, like `__tick`),
    // checking its size and charging it.
    let check: Fun<Data> = (
        "__check",
        v(0),
        jaq_core::Native::new(|cv| match check_new(cv.0.data(), &cv.1) {
            Ok(()) => bome(Ok(cv.1)),
            Err(code) => box_once(Err(halt(cv.0.data(), code))),
        })
        .with_paths(|cv| match check_new(cv.0.data(), &cv.1 .0) {
            Ok(()) => box_once(Ok(cv.1)),
            Err(code) => box_once(Err(halt(cv.0.data(), code))),
        })
        .with_update(|cv, f| match check_new(cv.0.data(), &cv.1) {
            Ok(()) => f(cv.1),
            Err(code) => box_once(Err(halt(cv.0.data(), code))),
        }),
    );
    // `__sized` checks the size of a value without charging it (assignments to computed paths).
    let sized: Fun<Data> = run(("__sized", v(0), |cv| match check_size(cv.0.data(), &cv.1) {
        Ok(()) => bome(Ok(cv.1)),
        Err(code) => box_once(Err(halt(cv.0.data(), code))),
    }));
    // A global regex function can turn every character of its input into a match: it is charged
    // for that before it runs.
    let regex: Fun<Data> = run(("__regex_guard", v(1), |mut cv| {
        let flags = cv.0.pop_var();
        let global = crate::json::as_str(&flags).is_some_and(|f| f.contains('g'));
        let len = str_len(&cv.1).unwrap_or(0) as u64;
        match charge(cv.0.data(), if global { (len + 1) * MATCH_BYTES } else { 0 }) {
            Ok(()) => bome(Ok(cv.1)),
            Err(code) => box_once(Err(halt(cv.0.data(), code))),
        }
    }));
    // Which of jaq's natives are admitted is decided once (by position: `jaq_natives` yields them in
    // the same order every time); the natives themselves are made anew, as jaq cannot clone them.
    static ADMITTED: OnceLock<Vec<bool>> = OnceLock::new();
    let admitted = ADMITTED.get_or_init(|| {
        jaq_natives()
            .map(|(name, args, _)| admitted(name, args.len()))
            .collect()
    });
    jaq_natives()
        .zip(admitted)
        .filter_map(|(f, &admitted)| admitted.then_some(f))
        .filter(|(name, args, _)| !METERED.contains(&(*name, args.len())))
        .chain([depth, schedule])
        .chain([
            tick, gate, fits, epoch, caught_, dropped, guard, fromjson, getp, setp, keyed, add, mul, div, sub, item,
            check, sized, regex, eq, ne, lt, le, gt, ge, sorted, contains, indices,
        ])
        .collect()
}

/// Every native jaq provides, `matches` and the like renamed (our definitions wrap them).
fn jaq_natives() -> impl Iterator<Item = Fun<Data>> {
    jaq_core::funs::<Data>()
        .chain(jaq_std::funs::<Data>())
        .chain(jaq_json::funs::<Data>())
        .map(|(name, args, f)| match RENAMED.iter().find(|(n, _)| *n == name) {
            Some((_, ours)) => (*ours, args, f),
            None => (name, args, f),
        })
}

/// jaq natives replaced by our own (`metered`), which give the same results and pay for their work.
const METERED: &[(&str, usize)] = &[("contains", 1), ("indices", 1)];

/// jaq natives our definitions wrap, under the names the wrappers call.
const RENAMED: &[(&str, &str)] = &[
    ("matches", "__matches"),
    ("split_matches", "__split_matches"),
    ("split_", "__split_"),
];

/// The natives the sandbox takes from `natives`: those on [`ALLOWED`] that [`OUR_DEFS`] does not
/// replace, and the ones [`RENAMED`] names.
#[cfg(test)]
fn admitted_natives(natives: impl Iterator<Item = Fun<Data>>) -> impl Iterator<Item = Fun<Data>> {
    natives.filter(|(name, args, _)| admitted(name, args.len()))
}

/// True when the sandbox takes jaq's native `name/arity` (see [`admitted_natives`]).
fn admitted(name: &str, arity: usize) -> bool {
    RENAMED.iter().any(|(_, ours)| *ours == name) || (allowed(name, arity) && !ours(name, arity))
}

/// Our definitions, parsed once.
fn our_defs() -> &'static [Def<&'static str>] {
    static OURS: OnceLock<Vec<Def<&'static str>>> = OnceLock::new();
    OURS.get_or_init(|| jaq_core::load::parse(OUR_DEFS, |p| p.defs()).expect("our definitions parse"))
}

/// True when [`OUR_DEFS`] defines `name/arity` (replacing jaq's).
fn ours(name: &str, arity: usize) -> bool {
    our_defs().iter().any(|d| d.name == name && d.args.len() == arity)
}

/// Every `(name, arity)` jaq provides, natives and standard definitions, allowed or not.
fn jaq_functions() -> &'static std::collections::BTreeSet<(&'static str, usize)> {
    static ALL: OnceLock<std::collections::BTreeSet<(&'static str, usize)>> = OnceLock::new();
    ALL.get_or_init(|| {
        jaq_core::funs::<Data>()
            .chain(jaq_std::funs::<Data>())
            .chain(jaq_json::funs::<Data>())
            .map(|(name, args, _)| (name, args.len()))
            .chain(jaq_defs().map(|d| (d.name, d.args.len())))
            .collect()
    })
}

/// Every standard definition jaq provides.
fn jaq_defs() -> impl Iterator<Item = Def<&'static str>> {
    jaq_core::defs().chain(jaq_std::defs()).chain(jaq_json::defs())
}

/// The standard definitions, each body prefixed with a fuel tick. Parsed once per process.
fn prelude() -> &'static [Def<&'static str>] {
    static PRELUDE: OnceLock<Vec<Def<&'static str>>> = OnceLock::new();
    PRELUDE.get_or_init(|| admitted_defs(jaq_defs()).into_iter().map(fuel_def).collect())
}

/// Which prelude definitions each prelude definition may call, built once with the prelude.
struct PreludeIndex {
    /// For the prelude definition at each index, the indices of the prelude definitions named in its
    /// body.
    deps: Vec<Vec<usize>>,
    /// The indices of the prelude definitions of each name (all arities).
    by_name: std::collections::HashMap<&'static str, Vec<usize>>,
}

fn prelude_index() -> &'static PreludeIndex {
    static INDEX: OnceLock<PreludeIndex> = OnceLock::new();
    INDEX.get_or_init(|| {
        let mut by_name: std::collections::HashMap<&'static str, Vec<usize>> = std::collections::HashMap::new();
        for (i, d) in prelude().iter().enumerate() {
            by_name.entry(d.name).or_default().push(i);
        }
        let deps = prelude()
            .iter()
            .map(|d| {
                let mut names = Vec::new();
                calls(&d.body, &mut names);
                let mut deps: Vec<usize> = names.iter().filter_map(|n| by_name.get(n)).flatten().copied().collect();
                deps.sort_unstable();
                deps.dedup();
                deps
            })
            .collect();
        PreludeIndex { deps, by_name }
    })
}

/// The prelude definitions that code calling `names` can reach, as indices into [`prelude`] in
/// their order: every definition of each name, and transitively every definition of each name
/// those call. Compiling only these instead of all ~200 is what makes [`Expr::compile`] cheap, and
/// changes nothing else: jaq resolves a call to the last definition before it with the same name and
/// arity (else to a native), and every definition with a name that is called is kept, in the same
/// order, so each call resolves to the same definition or native as with the whole prelude.
fn reachable<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<usize> {
    let index = prelude_index();
    let mut kept = vec![false; index.deps.len()];
    let mut todo: Vec<usize> = names
        .into_iter()
        .filter_map(|n| index.by_name.get(n))
        .flatten()
        .copied()
        .collect();
    while let Some(i) = todo.pop() {
        if !std::mem::replace(&mut kept[i], true) {
            todo.extend(index.deps[i].iter().copied().filter(|&j| !kept[j]));
        }
    }
    (0..kept.len()).filter(|&i| kept[i]).collect()
}

/// Appends every name `t` calls to `out`: filters (`map`, `__tick`, a `def`'s own name) and string
/// formats (`@base64 "..."`, which jaq compiles as a call), in nested definitions too. A superset of
/// what the compiler resolves against the prelude: names bound locally are included.
fn calls<'a>(t: &Term<&'a str>, out: &mut Vec<&'a str>) {
    use jaq_core::load::lex::StrPart;
    match t {
        Term::Id | Term::Recurse | Term::Num(_) | Term::Var(_) | Term::Break(_) | Term::Arr(None) => {}
        Term::Str(fmt, parts) => {
            out.extend(fmt.iter().copied());
            for p in parts {
                match p {
                    StrPart::Term(t) => calls(t, out),
                    StrPart::Str(_) | StrPart::Char(_) => {}
                }
            }
        }
        Term::Arr(Some(x)) | Term::Neg(x) | Term::Label(_, x) => calls(x, out),
        Term::Obj(kvs) => {
            for (k, v) in kvs {
                calls(k, out);
                if let Some(v) = v {
                    calls(v, out);
                }
            }
        }
        Term::BinOp(l, op, r) => {
            calls(l, out);
            if let BinaryOp::Pipe(Some(p)) = op {
                pattern_calls(p, out);
            }
            calls(r, out);
        }
        Term::Fold(_, x, pat, args) => {
            calls(x, out);
            pattern_calls(pat, out);
            args.iter().for_each(|a| calls(a, out));
        }
        Term::TryCatch(t, c) => {
            calls(t, out);
            if let Some(c) = c {
                calls(c, out);
            }
        }
        Term::IfThenElse(branches, els) => {
            for (c, t) in branches {
                calls(c, out);
                calls(t, out);
            }
            if let Some(e) = els {
                calls(e, out);
            }
        }
        Term::Def(defs, body) => {
            defs.iter().for_each(|d| calls(&d.body, out));
            calls(body, out);
        }
        Term::Call(name, args) => {
            out.push(name);
            args.iter().for_each(|a| calls(a, out));
        }
        Term::Path(x, Path(parts)) => {
            calls(x, out);
            for (part, _) in parts {
                match part {
                    Part::Index(i) => calls(i, out),
                    Part::Range(f, t) => {
                        if let Some(f) = f {
                            calls(f, out);
                        }
                        if let Some(t) = t {
                            calls(t, out);
                        }
                    }
                }
            }
        }
    }
}

fn pattern_calls<'a>(p: &Pattern<&'a str>, out: &mut Vec<&'a str>) {
    match p {
        Pattern::Var(_) => {}
        Pattern::Arr(ps) => ps.iter().for_each(|p| pattern_calls(p, out)),
        Pattern::Obj(kps) => {
            for (k, p) in kps {
                calls(k, out);
                pattern_calls(p, out);
            }
        }
    }
}

/// The first name in `t` that would capture one of ours: a definition, a filter argument or a
/// variable (bound or read) whose name starts with `__` (`$__`). The rewrites call our natives
/// (`__keyed`, `__eq`, `__tick`, ...) and bind our variables (`$__in`, `$__p`, ...) inside the
/// user's code, where jq's lexical scope would hand them the user's namesakes instead: a user's
/// `def __keyed(k): k;` ran an array key's search unpaid. `$__loc__` is left to [`REFUSED`].
fn reserved_name<'a>(t: &Term<&'a str>) -> Option<&'a str> {
    use jaq_core::load::lex::StrPart;
    let ours = |n: &&'a str| (n.starts_with("__") || n.starts_with("$__")) && *n != "$__loc__";
    let pattern = |p: &Pattern<&'a str>| reserved_in_pattern(p, &ours);
    match t {
        Term::Id | Term::Recurse | Term::Num(_) | Term::Break(_) | Term::Arr(None) => None,
        Term::Call(_, args) => args.iter().find_map(reserved_name),
        Term::Var(v) => Some(*v).filter(ours),
        Term::Str(_, parts) => parts.iter().find_map(|p| match p {
            StrPart::Term(t) => reserved_name(t),
            StrPart::Str(_) | StrPart::Char(_) => None,
        }),
        Term::Arr(Some(x)) | Term::Neg(x) | Term::Label(_, x) => reserved_name(x),
        Term::Obj(kvs) => kvs
            .iter()
            .find_map(|(k, v)| reserved_name(k).or_else(|| v.as_ref().and_then(reserved_name))),
        Term::BinOp(l, op, r) => reserved_name(l)
            .or_else(|| match op {
                BinaryOp::Pipe(Some(p)) => pattern(p),
                _ => None,
            })
            .or_else(|| reserved_name(r)),
        Term::Fold(_, x, pat, args) => reserved_name(x)
            .or_else(|| pattern(pat))
            .or_else(|| args.iter().find_map(reserved_name)),
        Term::TryCatch(t, c) => reserved_name(t).or_else(|| c.as_ref().and_then(|c| reserved_name(c))),
        Term::IfThenElse(branches, els) => branches
            .iter()
            .find_map(|(c, t)| reserved_name(c).or_else(|| reserved_name(t)))
            .or_else(|| els.as_ref().and_then(|e| reserved_name(e))),
        Term::Def(defs, body) => defs
            .iter()
            .find_map(|d| {
                std::iter::once(&d.name)
                    .chain(&d.args)
                    .copied()
                    .find(|n| ours(n))
                    .or_else(|| reserved_name(&d.body))
            })
            .or_else(|| reserved_name(body)),
        Term::Path(x, Path(parts)) => reserved_name(x).or_else(|| {
            parts.iter().find_map(|(part, _)| match part {
                Part::Index(i) => reserved_name(i),
                Part::Range(f, t) => f
                    .as_ref()
                    .and_then(reserved_name)
                    .or_else(|| t.as_ref().and_then(reserved_name)),
            })
        }),
    }
}

/// The error for code that names one of ours (see [`reserved_name`]).
fn refuse_reserved(t: &Term<&str>) -> Result<(), String> {
    match reserved_name(t) {
        Some(name) => Err(format!(
            "`{name}` is reserved: names that start with `__` belong to sm4c's own jq helpers; rename it"
        )),
        None => Ok(()),
    }
}

fn reserved_in_pattern<'a>(p: &Pattern<&'a str>, ours: &impl Fn(&&'a str) -> bool) -> Option<&'a str> {
    match p {
        Pattern::Var(v) => Some(*v).filter(ours),
        Pattern::Arr(ps) => ps.iter().find_map(|p| reserved_in_pattern(p, ours)),
        Pattern::Obj(kps) => kps
            .iter()
            .find_map(|(k, p)| reserved_name(k).or_else(|| reserved_in_pattern(p, ours))),
    }
}

/// The definitions the sandbox takes from `standard`: those on [`ALLOWED`] that [`OUR_DEFS`] does
/// not replace, and ours.
fn admitted_defs(standard: impl Iterator<Item = Def<&'static str>>) -> Vec<Def<&'static str>> {
    let mut defs: Vec<Def<&'static str>> = Vec::new();
    let mut placed = false;
    for def in standard {
        if !allowed(def.name, def.args.len()) || ours(def.name, def.args.len()) {
            continue;
        }
        // Ours (among them `range/3`) must exist before the standard `range/2` refers to it.
        if def.name == "range" && !placed {
            defs.extend(our_defs().iter().cloned());
            placed = true;
        }
        defs.push(def);
    }
    if !placed {
        defs.extend(our_defs().iter().cloned());
    }
    defs
}

fn tick<'a>() -> Term<&'a str> {
    Term::Call("__tick", Vec::new())
}

fn fuel_def(def: Def<&str>) -> Def<&str> {
    Def {
        name: def.name,
        args: def.args,
        body: Term::BinOp(Box::new(tick()), BinaryOp::Pipe(None), Box::new(fuel_term(def.body))),
    }
}

/// Adds a fuel tick to the body of every definition nested in a term.
fn fuel_term<'a>(t: Term<&'a str>) -> Term<&'a str> {
    let b = |t: Box<Term<&'a str>>| Box::new(fuel_term(*t));
    match t {
        Term::Def(defs, body) => Term::Def(defs.into_iter().map(fuel_def).collect(), b(body)),
        Term::Str(fmt, parts) => {
            let interpolated = parts.iter().any(|p| matches!(p, jaq_core::load::lex::StrPart::Term(_)));
            let s = Term::Str(
                fmt,
                parts
                    .into_iter()
                    .map(|p| match p {
                        jaq_core::load::lex::StrPart::Term(t) => jaq_core::load::lex::StrPart::Term(Term::BinOp(
                            Box::new(gated(fuel_term(t))),
                            BinaryOp::Pipe(None),
                            Box::new(Term::Call("__fits", Vec::new())),
                        )),
                        other => other,
                    })
                    .collect(),
            );
            if interpolated {
                checked(s)
            } else {
                s
            }
        }
        Term::Arr(Some(f)) => checked(Term::Arr(Some(Box::new(Term::BinOp(
            b(f),
            BinaryOp::Pipe(None),
            Box::new(Term::Call("__item", Vec::new())),
        ))))),
        Term::Obj(kvs) => Term::Obj(
            kvs.into_iter()
                .map(|(k, v)| {
                    // `{$x}` stays as written: jaq names the entry after the variable.
                    let k = match k {
                        k @ Term::Var(_) if v.is_none() => k,
                        k => gated(fuel_term(k)),
                    };
                    (k, v.map(|v| gated(fuel_term(v))))
                })
                .collect(),
        ),
        Term::Neg(x) => Term::Neg(b(x)),
        Term::BinOp(l, op, r) => match (crate::fast::simple_path(&l), op) {
            (
                Some(path),
                op @ (BinaryOp::Assign | BinaryOp::Update | BinaryOp::UpdateMath(_) | BinaryOp::UpdateAlt),
            ) => assignment(path, op, fuel_term(*r)),
            (_, BinaryOp::Math(m)) => math_term(fuel_term(*l), m, fuel_term(*r)),
            // `l op= r` is jq's `r as $v | l |= . op $v`, so that the operation is checked.
            (_, BinaryOp::UpdateMath(m)) => Term::BinOp(
                b(r),
                BinaryOp::Pipe(Some(Pattern::Var("$__u"))),
                Box::new(Term::BinOp(
                    b(l),
                    BinaryOp::Update,
                    Box::new(math_term(Term::Id, m, Term::Var("$__u"))),
                )),
            ),
            // What an assignment to a computed path builds is new entries: their number is checked.
            (_, op @ (BinaryOp::Assign | BinaryOp::Update | BinaryOp::UpdateAlt)) => Term::BinOp(
                Box::new(Term::BinOp(b(l), op, b(r))),
                BinaryOp::Pipe(None),
                Box::new(Term::Call("__sized", Vec::new())),
            ),
            (_, BinaryOp::Comma) => Term::BinOp(Box::new(comma_left(*l)), BinaryOp::Comma, b(r)),
            (_, BinaryOp::Cmp(c)) => cmp_term(fuel_term(*l), c, fuel_term(*r)),
            (_, op) => Term::BinOp(b(l), fuel_op(op), b(r)),
        },
        Term::Label(l, x) => Term::Label(l, b(x)),
        Term::Fold(f, x, pat, args) => {
            Term::Fold(f, b(x), fuel_pattern(pat), args.into_iter().map(fuel_term).collect())
        }
        // jaq writes an error it catches into a string (`cannot index {..} with ..`) before the
        // handler runs: `__caught` charges that string and a step, so that catching errors over
        // and over (`.. - (try error(.))`) cannot go on past the limits.
        Term::TryCatch(t, c) => {
            let caught = |name| Box::new(Term::Call(name, Vec::new()));
            let handler = match c {
                Some(c) => Term::BinOp(caught("__caught"), BinaryOp::Pipe(None), b(c)),
                None => *caught("__dropped"),
            };
            Term::TryCatch(
                Box::new(Term::Call("__guard", vec![fuel_term(*t)])),
                Some(Box::new(handler)),
            )
        }
        Term::IfThenElse(branches, els) => Term::IfThenElse(
            branches
                .into_iter()
                .map(|(c, t)| (fuel_term(c), fuel_term(t)))
                .collect(),
            els.map(b),
        ),
        Term::Call(f, args) => {
            // What `sort_by(f)` and its kin compare is what `f` yields; `contains`, `indices` and
            // `bsearch` compare their argument with their input (see `charge_compare`); `has` only
            // when its key is an array.
            let compares = matches!(
                (f, args.len()),
                (
                    "sort_by" | "group_by" | "min_by_or_empty" | "max_by_or_empty" | "contains" | "indices" | "bsearch",
                    1
                )
            );
            let args = args.into_iter().map(fuel_term);
            let call = if (f, args.len()) == ("has", 1) {
                Term::Call(f, args.map(|k| Term::Call("__keyed", vec![k])).collect())
            } else if compares {
                let sorted = |a| {
                    Term::BinOp(
                        Box::new(a),
                        BinaryOp::Pipe(None),
                        Box::new(Term::Call("__sorted", Vec::new())),
                    )
                };
                Term::Call(f, args.map(sorted).collect())
            } else {
                Term::Call(f, args.collect())
            };
            // `tojson` writes its input out whole: only if that fits the string limit. `gmtime` and
            // `strftime` take seconds only where jaq-std can multiply them. `sort`, `contains` and
            // `indices` may walk their input whole.
            let guard = match f {
                "tojson" => Some("__fits"),
                "gmtime" | "strftime" => Some("__epoch"),
                "sort" | "contains" | "indices" => Some("__sorted"),
                _ => None,
            };
            let call = match guard {
                Some(g) => Term::BinOp(
                    Box::new(Term::Call(g, Vec::new())),
                    BinaryOp::Pipe(None),
                    Box::new(call),
                ),
                None => call,
            };
            if SIZED.contains(&f) {
                checked(call)
            } else {
                call
            }
        }
        Term::Path(x, Path(parts)) => {
            let iterates = parts.iter().any(|(part, _)| matches!(part, Part::Range(None, None)));
            let path = keyed_path(*x, parts);
            if iterates {
                ticked(path)
            } else {
                path
            }
        }
        Term::Recurse => ticked(Term::Recurse),
        other => other,
    }
}

/// `x[k1][k2]` as jaq runs it, but with every key given the value it indexes, so that `__keyed`
/// can charge what an array key costs (it finds where it occurs, comparing element by element like
/// `indices`). Each part indexes on its own: `x | .[k1] | .[k2]`, the order jaq yields them in
/// (each value of `x`, then each key of the first part, and so on), in values, paths and updates.
/// A key still runs on the original input: when it may read it, that input is bound first
/// (`. as $__p | x | .[$__p | k1] | ...`). `.[k]` alone needs neither.
fn keyed_path<'a>(x: Term<&'a str>, parts: Vec<(Part<Term<&'a str>>, jaq_core::path::Opt)>) -> Term<&'a str> {
    let on_input = matches!(x, Term::Id);
    let mut bound = false;
    let mut key = |n: usize, k: Term<&'a str>| {
        let free = closed(&k) || (n == 0 && on_input);
        let k = gated(fuel_term(k));
        if free {
            k
        } else {
            bound = true;
            Term::BinOp(Box::new(Term::Var("$__p")), BinaryOp::Pipe(None), Box::new(k))
        }
    };
    let mut chain: Vec<Term<&'a str>> = Vec::new();
    for (n, (part, opt)) in parts.into_iter().enumerate() {
        let part = match part {
            Part::Index(k) => Part::Index(Term::Call("__keyed", vec![key(n, k)])),
            Part::Range(f, t) => Part::Range(f.map(|f| key(n, f)), t.map(|t| key(n, t))),
        };
        chain.push(Term::Path(Box::new(Term::Id), Path(vec![(part, opt)])));
    }
    let pipe = |l: Term<&'a str>, pat, r: Term<&'a str>| Term::BinOp(Box::new(l), BinaryOp::Pipe(pat), Box::new(r));
    let first = if on_input && !chain.is_empty() {
        chain.remove(0)
    } else {
        fuel_term(x)
    };
    let body = chain.into_iter().fold(first, |l, r| pipe(l, None, r));
    if bound {
        pipe(Term::Id, Some(Pattern::Var("$__p")), body)
    } else {
        body
    }
}

/// `t | __tick`: every output of `t` burns a unit of fuel. For the terms that yield several values
/// without calling a definition (`l, r`, `..` and iterations such as `.[]`): their products
/// (`$a[] + $a[] + $a[]`, `.[paths][paths]`, `(1, 2) * (3, 4)`) would otherwise yield a number of
/// values exponential in the length of the expression for a few units of fuel.
fn ticked(t: Term<&str>) -> Term<&str> {
    Term::BinOp(Box::new(t), BinaryOp::Pipe(None), Box::new(tick()))
}

/// The left operand of `l, r`, every value of it burning a unit (of `a, b, c`, parsed `(a, b), c`, `a`
/// and `b` each once). The right operand is not ticked: it stays a tail call, so a recursion such as
/// `range/3`'s `., (. + $by | up)` runs in constant stack. Of a product of commas, at least one value in
/// two is ticked.
fn comma_left(l: Term<&str>) -> Term<&str> {
    match l {
        Term::BinOp(ll, BinaryOp::Comma, lr) => Term::BinOp(
            Box::new(comma_left(*ll)),
            BinaryOp::Comma,
            Box::new(ticked(fuel_term(*lr))),
        ),
        t => ticked(fuel_term(t)),
    }
}

/// `__gate | t`, for a term that jaq pairs with every value of another (`r` in `l - r`, `l == r`,
/// `{(l): r}`, and the parts of string interpolations and of `.[i][j]`). Where `t` yields no value,
/// jaq drops the value it would pair with, and with it a halt: the fuel ran out in `..` of
/// `.. - (try error)`, yet `..` went on, as did every such product around it, each re-running its
/// `r` for every value, for minutes. `__gate` gives `t` the halt to yield once a limit has stopped
/// the evaluation. A term that yields exactly one value, without error, needs no gate.
fn gated(t: Term<&str>) -> Term<&str> {
    let single = match &t {
        Term::Id | Term::Num(_) | Term::Var(_) => true,
        Term::Str(_, parts) => parts
            .iter()
            .all(|p| !matches!(p, jaq_core::load::lex::StrPart::Term(_))),
        Term::Call(name, args) => args.is_empty() && matches!(*name, "true" | "false" | "null"),
        _ => false,
    };
    if single {
        t
    } else {
        Term::BinOp(
            Box::new(Term::Call("__gate", Vec::new())),
            BinaryOp::Pipe(None),
            Box::new(t),
        )
    }
}

/// `t | __check`: the size of what `t` built is checked and charged.
fn checked(t: Term<&str>) -> Term<&str> {
    Term::BinOp(
        Box::new(t),
        BinaryOp::Pipe(None),
        Box::new(Term::Call("__check", Vec::new())),
    )
}

/// `l op r`, through our checked natives for the operations that can make values bigger (see
/// [`native_pair`]): the native takes `l`'s output as its input, so that a value built up in
/// `reduce` (`. + $x`) stays unshared and grows in place as with jaq's own operator.
fn math_term<'a>(l: Term<&'a str>, m: Math, r: Term<&'a str>) -> Term<&'a str> {
    let name = match m {
        Math::Add => "__add",
        Math::Mul => "__mul",
        Math::Div => "__div",
        Math::Sub => "__sub",
        Math::Rem => return Term::BinOp(Box::new(l), BinaryOp::Math(m), Box::new(gated(r))),
    };
    native_pair(l, name, r, |r| r)
}

/// `l | name(r)`: every value of `l` paired with every value of `r` through a native, in jaq's order
/// (each of `l`, then each of `r`). `r` runs on the original input: when it may read it, that input
/// is bound first (`. as $__in | l | name($__in | r)`). `arg` wraps what the native is given as `r`.
fn native_pair<'a>(
    l: Term<&'a str>,
    name: &'a str,
    r: Term<&'a str>,
    arg: impl Fn(Term<&'a str>) -> Term<&'a str>,
) -> Term<&'a str> {
    let pipe = |a: Term<&'a str>, pat, b: Term<&'a str>| Term::BinOp(Box::new(a), BinaryOp::Pipe(pat), Box::new(b));
    if closed(&r) {
        pipe(l, None, Term::Call(name, vec![arg(r)]))
    } else {
        let r = arg(pipe(Term::Var("$__in"), None, r));
        pipe(
            Term::Id,
            Some(Pattern::Var("$__in")),
            pipe(l, None, Term::Call(name, vec![r])),
        )
    }
}

/// `l cmp r` through our natives (`__eq(r)` and so on, paired as [`native_pair`] pairs them), which
/// charge what comparing two arrays or two objects walks before they compare (see
/// [`charge_compare`]). `r` is gated, as jaq's own comparison's was.
fn cmp_term<'a>(l: Term<&'a str>, c: Cmp, r: Term<&'a str>) -> Term<&'a str> {
    let name = match c {
        Cmp::Eq => "__eq",
        Cmp::Ne => "__ne",
        Cmp::Lt => "__lt",
        Cmp::Le => "__le",
        Cmp::Gt => "__gt",
        Cmp::Ge => "__ge",
    };
    native_pair(l, name, r, gated)
}

/// True when a term does not read its input (variables, literals, and what is built of them).
fn closed(t: &Term<&str>) -> bool {
    match t {
        Term::Var(_) | Term::Num(_) => true,
        Term::Str(_, parts) => parts.iter().all(|p| match p {
            jaq_core::load::lex::StrPart::Term(t) => closed(t),
            _ => true,
        }),
        Term::Call(name, args) => args.is_empty() && matches!(*name, "true" | "false" | "null"),
        Term::Arr(None) => true,
        Term::Arr(Some(x)) | Term::Neg(x) => closed(x),
        Term::Obj(kvs) => kvs.iter().all(|(k, v)| closed(k) && v.as_ref().is_some_and(closed)),
        Term::Path(base, Path(parts)) => {
            closed(base)
                && parts.iter().all(|(part, _)| match part {
                    Part::Index(i) => closed(i),
                    Part::Range(f, t) => f.as_ref().is_none_or(closed) && t.as_ref().is_none_or(closed),
                })
        }
        Term::BinOp(l, BinaryOp::Math(_) | BinaryOp::Comma | BinaryOp::Alt, r) => closed(l) && closed(r),
        _ => false,
    }
}

/// `.a.b = r` and friends with jq's semantics (a missing or null parent becomes an object), which
/// jaq's own updates do not have: `r as $__v | __setp(["a","b"]; $__v)`, and so on.
fn assignment<'a>(path: Term<&'a str>, op: BinaryOp<&'a str>, r: Term<&'a str>) -> Term<&'a str> {
    let pipe = |l: Term<&'a str>, pat: Option<Pattern<&'a str>>, r: Term<&'a str>| {
        Term::BinOp(Box::new(l), BinaryOp::Pipe(pat), Box::new(r))
    };
    let get = || Term::Call("__getp", vec![path.clone()]);
    let set = |x: Term<&'a str>| Term::Call("__setp", vec![path.clone(), x]);
    let var = || Term::Var("$__v");
    let bind = |body: Term<&'a str>| pipe(r.clone(), Some(Pattern::Var("$__v")), body);
    match op {
        BinaryOp::Update => set(pipe(get(), None, r.clone())),
        BinaryOp::UpdateMath(m) => bind(set(math_term(get(), m, var()))),
        BinaryOp::UpdateAlt => bind(set(Term::BinOp(Box::new(get()), BinaryOp::Alt, Box::new(var())))),
        _ => bind(set(var())),
    }
}

fn fuel_op(op: BinaryOp<&str>) -> BinaryOp<&str> {
    match op {
        BinaryOp::Pipe(Some(p)) => BinaryOp::Pipe(Some(fuel_pattern(p))),
        other => other,
    }
}

fn fuel_pattern(p: Pattern<&str>) -> Pattern<&str> {
    match p {
        Pattern::Var(x) => Pattern::Var(x),
        Pattern::Arr(ps) => Pattern::Arr(ps.into_iter().map(fuel_pattern).collect()),
        Pattern::Obj(kps) => Pattern::Obj(kps.into_iter().map(|(k, p)| (fuel_term(k), fuel_pattern(p))).collect()),
    }
}

/// An expression function (`type: expression`) that other expressions call as `fn:name`.
#[derive(Clone, Debug)]
pub struct ExprFunction {
    /// Function name as written after `fn:`.
    pub name: String,
    /// The jq body (with or without `${ }`).
    pub body: String,
}

/// Strips the `${ ... }` wrapper, if present.
pub fn strip(text: &str) -> &str {
    let t = text.trim();
    match t.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
        Some(inner) => inner.trim(),
        None => t,
    }
}

/// True when a string is written as an expression: `${ ... }`.
pub fn is_expression(text: &str) -> bool {
    let t = text.trim();
    t.starts_with("${") && t.ends_with('}')
}

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
            .with_funs(natives())
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

fn describe_undefined(name: &str, undefined: &jaq_core::compile::Undefined) -> String {
    use jaq_core::compile::Undefined;
    let bare = name.trim_start_matches("__fn_");
    if let Some((_, why)) = REFUSED.iter().find(|(n, _)| *n == name) {
        return format!("`{name}` is not available in sm4c expressions: it {why}");
    }
    if let Undefined::Filter(arity) = undefined {
        if jaq_functions().contains(&(name, *arity)) {
            return format!(
                "`{name}` is not available in sm4c expressions: it is not on the list of jq functions sm4c allows"
            );
        }
    }
    if bare != name {
        return format!("unknown expression function {bare}");
    }
    format!("undefined {} `{name}`", undefined.as_str())
}

fn describe_load_errors<P>(code: &str, errs: jaq_core::load::Errors<&str, P>) -> String {
    use jaq_core::load::Error;
    let mut msgs = Vec::new();
    for (_, err) in errs {
        match err {
            Error::Io(items) => {
                for (path, why) in items {
                    msgs.push(format!(
                        "cannot import {path:?}: {why} (sm4c expressions cannot read files)"
                    ))
                }
            }
            Error::Lex(items) => {
                for (expected, found) in items {
                    msgs.push(format!(
                        "jq syntax error: expected {} at {:?}",
                        expected.as_str(),
                        snippet(code, found)
                    ))
                }
            }
            Error::Parse(items) => {
                for (expected, found) in items {
                    msgs.push(format!(
                        "jq syntax error: expected {} at {:?}",
                        expected.as_str(),
                        snippet(code, found)
                    ))
                }
            }
        }
    }
    if msgs.is_empty() {
        msgs.push(format!("{code:?} is not valid jq"));
    }
    msgs.join("; ")
}

fn snippet(code: &str, at: &str) -> String {
    if at.is_empty() {
        return "end of expression".into();
    }
    let start = jaq_core::load::span(code, at).start;
    code[start..].chars().take(20).collect()
}

/// Rewrites `fn:name` into calls of generated definitions, returning the indices used.
/// Text inside string literals is left alone (but `\(...)` interpolations are code); `fn:` not
/// followed by a name (as in the object `{fn: 1}`) is ordinary jq.
fn rewrite_fn_calls(code: &str, functions: &[ExprFunction]) -> Result<(String, Vec<usize>), String> {
    let bytes = code.as_bytes();
    let mut out = String::with_capacity(code.len());
    let mut used = Vec::new();
    let mut i = 0;
    let mut in_str = false;
    // Paren depth of each open interpolation, innermost last; `depth` counts parens in code.
    let mut interpolations: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    while i < bytes.len() {
        let c = bytes[i];
        if in_str {
            if c == b'\\' && bytes.get(i + 1) == Some(&b'(') {
                out.push_str("\\(");
                i += 2;
                depth += 1;
                interpolations.push(depth);
                in_str = false;
                continue;
            }
            if c == b'\\' && i + 1 < bytes.len() {
                let ch = code[i + 1..].chars().next().expect("in bounds");
                out.push('\\');
                out.push(ch);
                i += 1 + ch.len_utf8();
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
            let ch = code[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'(' => depth += 1,
            b')' => {
                if interpolations.last() == Some(&depth) {
                    interpolations.pop();
                    in_str = true;
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        let boundary = i == 0 || !is_ident(bytes[i - 1]);
        let names_follow = bytes.get(i + 3).is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_');
        if boundary && names_follow && code[i..].starts_with("fn:") {
            let rest = &code[i + 3..];
            let found = functions
                .iter()
                .enumerate()
                .filter(|(_, f)| {
                    rest.starts_with(f.name.as_str()) && !rest[f.name.len()..].bytes().next().is_some_and(is_ident)
                })
                .max_by_key(|(_, f)| f.name.len());
            match found {
                Some((idx, f)) => {
                    out.push_str(&format!("__fn_{idx}"));
                    if !used.contains(&idx) {
                        used.push(idx);
                    }
                    i += 3 + f.name.len();
                    continue;
                }
                None => {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '-')
                        .collect();
                    return Err(format!(
                        "unknown expression function fn:{name} (declare it in `functions` with \"type\": \"expression\")"
                    ));
                }
            }
        }
        let ch = code[i..].chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    Ok((out, used))
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Orders the expression functions used (and those they use) so each is defined before use.
fn fn_order(used: &[usize], functions: &[ExprFunction]) -> Result<Vec<usize>, String> {
    fn visit(i: usize, functions: &[ExprFunction], state: &mut Vec<u8>, order: &mut Vec<usize>) -> Result<(), String> {
        match state[i] {
            2 => return Ok(()),
            1 => {
                return Err(format!(
                    "expression function {:?} calls itself through fn:",
                    functions[i].name
                ))
            }
            _ => {}
        }
        state[i] = 1;
        let (_, deps) = rewrite_fn_calls(strip(&functions[i].body), functions)?;
        for d in deps {
            visit(d, functions, state, order)?;
        }
        state[i] = 2;
        order.push(i);
        Ok(())
    }
    let mut state = vec![0u8; functions.len()];
    let mut order = Vec::new();
    for &i in used {
        visit(i, functions, &mut state, &mut order)?;
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn give(input: Value, code: &str, want: Value) {
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
    fn a_result_nested_deeper_than_the_limit_is_an_error_that_names_it() {
        let depth = crate::json::MAX_DEPTH;
        // Built by the expression: `reduce` wraps one level per step (the direct evaluator and jaq).
        let deep = Expr::compile(
            &format!("reduce range({}) as $i (1; [.])", depth + 1),
            &[],
            Limits::default(),
        )
        .unwrap();
        let err = deep.eval_json(&json!(null)).expect_err("too deep");
        assert!(err.message.contains("nested deeper than 64 levels"), "{}", err.message);
        // `try` cannot catch it: the output is refused, not an error inside the expression.
        assert!(err.out_of_fuel);
        let at = Expr::compile(&format!("reduce range({depth}) as $i (1; [.])"), &[], Limits::default()).unwrap();
        assert!(at.eval_json(&json!(null)).is_ok());
        // Wrapping data that sits at the limit passes it too, on the direct path.
        let input = (0..depth).fold(json!(1), |v, _| json!([v]));
        let wrap = Expr::compile(".a = .", &[], Limits::default()).unwrap();
        assert!(wrap.eval_json(&input).is_err());
        // `fromjson` of a text that nests deeper is refused the same way.
        let text = format!("{}1{}", "[".repeat(depth + 1), "]".repeat(depth + 1));
        let from = Expr::compile("fromjson", &[], Limits::default()).unwrap();
        assert!(from.eval_json(&json!(text)).is_err());
    }

    #[test]
    fn fromjson_refuses_absurd_nesting() {
        give(json!("[[1]]"), "fromjson", json!([[1]]));
        give(json!("\"[[\""), "fromjson", json!("[["));
        let e = Expr::compile("\"[\" * 100000 | fromjson", &[], Limits::default()).unwrap();
        assert!(e.eval_json(&json!(null)).unwrap_err().message.contains("nests deeper"));
    }

    #[test]
    fn value_variable() {
        let e = Expr::compile("${ .x = $value }", &[], Limits::default()).unwrap();
        let out = e.eval(to_val(&json!({})), to_val(&json!([1]))).unwrap();
        assert_eq!(from_val(&out), json!({"x": [1]}));
    }

    #[test]
    fn refused_functions() {
        for code in [
            "env",
            "$ENV",
            "now",
            "input",
            "[inputs]",
            "halt",
            "halt_error(1)",
            "localtime",
            "import \"a\" as a; .",
        ] {
            let err = Expr::compile(code, &[], Limits::default()).unwrap_err();
            assert!(
                err.contains("not available") || err.contains("cannot") || err.contains("syntax"),
                "{code}: {err}"
            );
        }
        let err = Expr::compile("now", &[], Limits::default()).unwrap_err();
        assert!(err.contains("wall clock"), "{err}");
    }

    /// The functions a definition can call, pinned: widening the sandbox (a new entry on
    /// `ALLOWED`, or a jaq upgrade that changes what an entry is) must change this list too, in a
    /// reviewed change. It also fails when a jaq upgrade drops a function definitions may be using.
    #[test]
    fn the_allowed_functions_are_pinned() {
        const PINNED: &str = "
        @base64/0 @base64d/0 @html/0 @htmld/0 @json/0 @sh/0 @text/0 @uri/0 @urid/0 abs/0 acos/0 acosh/0
        add/0 add/1 all/0 all/1 all/2 any/0 any/1 any/2 arrays/0 ascii_downcase/0 ascii_upcase/0 asin/0
        asinh/0 atan/0 atan2/2 atanh/0 booleans/0 bsearch/1 capture/1 capture/2 capture_of_match/0
        cbrt/0 ceil/0 combinations/0 combinations/1 contains/1 copysign/2 cos/0 cosh/0 debug/0 debug/1
        decode_base64/0 decode_uri/0 del/1 delpaths/1 drem/2 empty/0 encode_base64/0 encode_uri/0
        endswith/1 erf/0 erfc/0 error/0 error/1 error_empty/0 escape_html/0 escape_sh/0 exp/0 exp10/0
        exp2/0 explode/0 expm1/0 fabs/0 false/0 fdim/2 finites/0 first/0 first/1 flatten/0 flatten/1
        floor/0 fma/3 fmax/2 fmin/2 fmod/2 frexp/0 from_entries/0 fromdate/0 fromdateiso8601/0
        fromjson/0 gamma/0 getpath/1 gmtime/0 group_by/1 gsub/2 gsub/3 has/1 hypot/2 ilogb/0 implode/0
        in/1 index/1 indices/1 infinite/0 inside/1 isarray/0 isboolean/0 isempty/1 isfinite/0
        isinfinite/0 isnan/0 isnormal/0 isnumber/0 isobject/0 isstring/0 iterables/0 j0/0 j1/0 jn/2
        join/1 key_values/0 keys/0 keys_unsorted/0 last/0 last/1 ldexp/2 length/0 lgamma/0 limit/2 log/0
        log10/0 log1p/0 log2/0 logb/0 ltrim/0 ltrimstr/1 map/1 map_values/1 match/1 match/2 matches/2
        max/0 max_by/1 max_by_or_empty/1 min/0 min_by/1 min_by_or_empty/1 modf/0 nan/0 nearbyint/0
        nextafter/2 nexttoward/2 normals/0 not/0 nth/1 nth/2 null/0 nulls/0 numbers/0 objects/0 path/1
        path_value/1 paths/0 paths/1 pick/1 pow/2 pow10/0 range/1 range/2 range/3 recurse/0 recurse/1
        recurse/2 remainder/2 repeat/1 reverse/0 rindex/1 rint/0 round/0 rtrim/0 rtrimstr/1 scalars/0
        scalb/2 scalbln/2 scan/1 scan/2 scan_/2 schedule/0 select/1 setpath/2 significand/0 sin/0 sinh/0 skip/2
        sort/0 sort_by/1 split/1 split/2 split_/2 split_matches/2 splits/1 splits/2 sqrt/0 startswith/1
        stderr/0 strftime/1 strings/0 strptime/1 sub/2 sub/3 tan/0 tanh/0 test/1 test/2 tgamma/0
        to_entries/0 toboolean/0 tobytes/0 todate/0 todateiso8601/0 tojson/0 tonumber/0 tostring/0
        totype/2 transpose/0 trim/0 true/0 trunc/0 type/0 unescape_html/0 unique/0 unique_by/1 until/2
        utf8bytelength/0 values/0 walk/1 while/2 with_entries/1 y0/0 y1/0 yn/2
    ";
        let mut built: Vec<(&str, usize)> = natives()
            .iter()
            .map(|(name, args, _)| (*name, args.len()))
            .chain(prelude().iter().map(|d| (d.name, d.args.len())))
            .collect();
        built.sort_unstable();
        built.dedup();
        let (internal, callable): (Vec<_>, Vec<_>) = built.into_iter().partition(|(n, _)| n.starts_with("__"));
        let text = |fs: &[(&str, usize)]| fs.iter().map(|(n, a)| format!("{n}/{a}")).collect::<Vec<_>>().join(" ");
        assert_eq!(text(&callable), PINNED.split_whitespace().collect::<Vec<_>>().join(" "));
        assert_eq!(callable, ALLOWED, "every allowed function is built, and nothing else");
        assert_eq!(
            text(&internal),
            "__add/1 __caught/0 __check/0 __div/1 __dropped/0 __epoch/0 __eq/1 __fits/0 __fromjson/0 __gate/0 __ge/1 \
             __getp/1 __gt/1 __guard/1 __item/0 __json_depth/0 __keyed/1 __le/1 __lt/1 __matches/2 __mul/1 __ne/1 __regex_guard/1 __setp/2 \
             __sized/0 __sorted/0 __split_/2 __split_matches/2 __sub/1 __tick/0",
            "our own helpers (assignments, fuel, fromjson and its depth check, caught errors, checked sizes)"
        );
        assert!(
            ALLOWED.windows(2).all(|w| w[0] < w[1]),
            "ALLOWED must be sorted (binary search)"
        );
        for d in our_defs() {
            assert!(
                allowed(d.name, d.args.len()),
                "{}/{} is ours but not on ALLOWED",
                d.name,
                d.args.len()
            );
        }
    }

    #[test]
    fn functions_not_on_the_list_are_refused() {
        // jaq provides these; they are not on the list.
        for (code, name, why) in [
            (
                "debug_empty",
                "`debug_empty`",
                "not on the list of jq functions sm4c allows",
            ),
            (
                "\"x\" | stderr_empty",
                "`stderr_empty`",
                "not on the list of jq functions sm4c allows",
            ),
            ("env", "`env`", "process environment"),
            ("now", "`now`", "wall clock"),
            ("halt", "`halt`", "stops the process"),
            ("halt(1)", "`halt`", "stops the process"),
            ("halt_error(1)", "`halt_error`", "stops the process"),
            ("localtime", "`localtime`", "time zone"),
            ("strflocaltime(\"%c\")", "`strflocaltime`", "time zone"),
            ("[1970, 0, 1, 0, 0, 0, 4, 0] | mktime", "`mktime`", "not deterministic"),
        ] {
            assert!(
                jaq_functions().iter().any(|(n, _)| format!("`{n}`") == name),
                "jaq has {name}"
            );
            let err = Expr::compile(code, &[], Limits::default()).unwrap_err();
            assert_eq!(
                err.split(": it ").next(),
                Some(format!("{name} is not available in sm4c expressions").as_str()),
                "{code}: {err}"
            );
            assert!(err.contains(why), "{code}: {err}");
        }
        // An allowed name with an arity jaq does not have is simply undefined.
        let err = Expr::compile("map(.; .)", &[], Limits::default()).unwrap_err();
        assert_eq!(err, "undefined filter `map`");
    }

    /// What a jaq upgrade could bring: a native and a definition that are not on the list, and a new
    /// arity of an allowed name. None of them reaches the sandbox.
    #[test]
    fn functions_a_newer_jaq_adds_are_not_admitted() {
        let exec: Fun<Data> = run(("exec", v(1), |cv| bome(Ok(cv.1))));
        let natives: Vec<_> = admitted_natives(jaq_natives().chain([exec]))
            .map(|(n, a, _)| (n, a.len()))
            .collect();
        assert!(!natives.contains(&("exec", 1)), "{natives:?}");
        assert!(natives.contains(&("length", 0)), "{natives:?}");

        let extra =
            jaq_core::load::parse("def shell($cmd): $cmd; def map(f; g): map(f) | g;", |p| p.defs()).expect("parses");
        let defs: Vec<_> = admitted_defs(jaq_defs().chain(extra))
            .iter()
            .map(|d| (d.name, d.args.len()))
            .collect();
        assert!(!defs.contains(&("shell", 1)), "{defs:?}");
        assert!(!defs.contains(&("map", 2)), "{defs:?}");
        assert!(defs.contains(&("map", 1)), "{defs:?}");
        assert_eq!(
            defs,
            admitted_defs(jaq_defs())
                .iter()
                .map(|d| (d.name, d.args.len()))
                .collect::<Vec<_>>()
        );
    }

    /// `Expr::compile` compiles only the prelude definitions an expression reaches. Every allowed
    /// function, called, and a set of expressions that combine them (nested definitions, formats,
    /// patterns, paths, folds, labels, expression functions, errors) compile to the same filter as
    /// against the whole prelude: the same error, or the same outputs and errors on every input.
    #[test]
    fn the_reachable_prelude_compiles_like_the_whole_prelude() {
        let mut codes: Vec<String> = ALLOWED
            .iter()
            .map(|(name, arity)| match (name.starts_with('@'), arity) {
                (true, _) => format!("{name}, {name} \"<\\(.)>\""),
                (false, 0) => (*name).to_string(),
                (false, n) => format!("{name}({})", vec!["."; *n].join("; ")),
            })
            .collect();
        codes.extend(
            [
                "[range(0; 10; 3)], [range(5; 0; -2)], [limit(3; repeat(1))]",
                "def f(g): def h: g | g; [.[]? | h]; f(. + 1)",
                "def inc: . + 1; [paths], [paths(type == \"number\")], (.. |= (numbers |= inc))",
                "to_entries | from_entries | with_entries(.value |= tostring)",
                "walk(if type == \"number\" then . + 1 else . end)",
                ".a |= . + 1, .b += 2, .c //= 3, .d.e = 4, del(.a), pick(.b)",
                "reduce .[]? as [$x, {a: $y}] (0; . + 1), (. as {(\"a\" | ascii_upcase): $z} | $z)",
                "label $out | foreach (.[]?) as $x (0; . + 1; if . > 2 then ., break $out else . end)",
                "[.[]?[1:]?], .[\"a\"]?, .[(\"a\" | ascii_downcase)]?, try error(\"x\") catch .",
                "@base64 \"\\(.)\" | @base64d, @json \"x\\(tojson | fromjson)\", @text, @sh \"\\(tostring)\"",
                "tostring | test(\"A\"; \"i\"), [splits(\", *\")], sub(\"a\"; \"b\"; \"g\"), gsub(\"\\\\d\"; \"#\")",
                "tostring | capture(\"(?<x>[0-9])\"), [scan(\"[a-z]\")], [match(\"a\"; \"g\") | .offset]",
                "[.[]?] | (sort_by(tostring), group_by(type), unique_by(length?), min_by(tostring), combinations?)",
                "first(range(10)), last(range(10)), nth(2; range(10)), isempty(empty), [skip(1; range(5))]",
                "1 | until(. > 100; . * 2), [while(. < 100; . * 2)], (0 | todate | fromdate), strftime(\"%Y\")?",
                "fn:twice(.)",
                "{a: 1, (\"b\" + \"c\"): [1, 2] | add, \"d\\(1)\": null} | keys, to_entries[0]",
                "getpath([\"a\"]), setpath([\"a\"]; 1), delpaths([[\"a\"]]), ltrimstr(\"a\"), splits(\"a\")",
                "input",
                "nosuchfn",
                "map(.; .)",
                "$__loc__",
                "halt_error(1)",
                "[.[]? | select(. > 1)",
                "include \"x\"; .",
                "other::map(.)",
                "def f: f; f",
                "[recurse(if . < 3 then . + 1 else empty end)] | length, ([1, [2]] | flatten), tojson",
            ]
            .map(String::from),
        );
        let functions = [ExprFunction {
            name: "twice".into(),
            body: "${ [., .] | map(tostring) | join(\",\") }".into(),
        }];
        let inputs = [
            json!(null),
            json!(2.5),
            json!("a, b"),
            json!([3, 1, [2], "x", {"a": 1}]),
            json!({"a": 1, "b": [1, 2], "s": "2024-01-01T00:00:00Z"}),
        ];
        let limits = Limits {
            fuel: 10_000,
            ..Limits::default()
        };
        let mut compiled = 0;
        for code in &codes {
            let reached = Expr::compile_with(code, &functions, limits, false);
            let whole = Expr::compile_with(code, &functions, limits, true);
            let (reached, whole) = match (reached, whole) {
                (Ok(r), Ok(w)) => (r, w),
                (r, w) => {
                    assert_eq!(r.map(|_| ()), w.map(|_| ()), "{code}");
                    continue;
                }
            };
            compiled += 1;
            for input in &inputs {
                // Compared as text: NaN is an output too.
                assert_eq!(
                    format!("{:?}", reached.outputs(to_val(input), Val::Null, 100)),
                    format!("{:?}", whole.outputs(to_val(input), Val::Null, 100)),
                    "{code} on {input}"
                );
            }
        }
        assert!(compiled > ALLOWED.len(), "{compiled} of {} compiled", codes.len());
    }

    /// What `reachable` keeps: nothing for code that calls no definition, the definitions a call
    /// needs, transitively, and not the rest.
    #[test]
    fn only_the_reachable_prelude_is_compiled() {
        let names = |called: &[&str]| -> Vec<(&str, usize)> {
            reachable(called.iter().copied())
                .into_iter()
                .map(|i| (prelude()[i].name, prelude()[i].args.len()))
                .collect()
        };
        assert_eq!(names(&[]), []);
        assert_eq!(names(&["__tick", "length", "nosuchfn"]), []);
        assert_eq!(names(&["map"]), [("map", 1)]);
        let range = names(&["range"]);
        assert!(
            range.contains(&("range", 1)) && range.contains(&("range", 2)) && range.contains(&("range", 3)),
            "{range:?}"
        );
        let walk = names(&["walk"]);
        assert!(walk.contains(&("walk", 1)), "{walk:?}");
        assert!(!walk.contains(&("sort_by", 1)), "{walk:?}");
        // Through the definitions a definition calls.
        let base64 = names(&["@base64"]);
        assert!(base64.contains(&("tostring", 0)), "{base64:?}");
        assert!(names(&["walk", "map"]).len() < prelude().len() / 4);
    }

    #[test]
    fn syntax_errors_are_described() {
        let err = Expr::compile("${ .a | }", &[], Limits::default()).unwrap_err();
        assert!(err.contains("syntax"), "{err}");
        let err = Expr::compile("nosuchfn(1)", &[], Limits::default()).unwrap_err();
        assert!(err.contains("nosuchfn"), "{err}");
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
    fn endless_expressions_stop() {
        let limits = Limits {
            fuel: 100_000,
            ..Limits::default()
        };
        for code in [
            "until(false; .)",
            "def f: f; f",
            "[range(1e18)] | length",
            "last(repeat(1))",
            "try until(false; .) catch 0",
            "def f: try f catch f; f",
            "[recurse(. + 1)] | length",
        ] {
            let e = Expr::compile(code, &[], limits).unwrap();
            let err = e.eval_json(&json!(0)).unwrap_err();
            assert!(err.out_of_fuel, "{code}: {err:?}");
        }
    }

    /// `contains` and `indices` compare the pairs of their operands' parts: jaq's took 4 s for
    /// `[range(30000)] | contains(reverse)` at the default limits, inside one call that burnt no
    /// fuel (and the host's deciding loop waited). Ours pay for their comparisons and keep jq's
    /// results.
    #[test]
    fn contains_and_indices_pay_for_their_comparisons() {
        let limits = Limits {
            fuel: 100_000,
            ..Limits::default()
        };
        for code in [
            "[range(5000)] | contains(reverse)",
            "[range(5000)] | inside(reverse)",
            "[[range(5000)]] | contains([[range(5000)] | reverse])",
            "{a: [range(5000)]} | contains({a: ([range(5000)] | reverse)})",
            "(\"a\" * 200000) | indices(\"a\" * 100000)",
            "(\"a\" * 200000) | index(\"a\" * 100000)",
            "(\"a\" * 200000 | tobytes) | indices(\"a\" * 100000 | tobytes)",
            "[range(20000) | 0] as $a | $a | indices($a[:10000])",
            // Elements that are arrays: each comparison of two of them walks both.
            "[range(300)] as $a | [range(600) | $a | .[0] = 0] as $x | $x | indices($x[:300])",
        ] {
            let e = Expr::compile(code, &[], limits).unwrap();
            match e.eval_json(&json!(null)) {
                Err(err) => assert!(err.out_of_fuel, "{code}: {err:?}"),
                Ok(_) => panic!("{code}: a value, not the end of the fuel"),
            }
        }
        // Every index found is charged before the array holds it.
        let e = Expr::compile("(\"a\" * 5000000) | indices(\"a\") | length", &[], limits).unwrap();
        let err = e.eval_json(&json!(null)).unwrap_err();
        assert!(err.message.contains("would build more than"), "{err:?}");
        // jq's results (the examples of jq's manual among them), for text, bytes, arrays, objects
        // and scalars, in jaq's order; and the same work at a smaller size fits.
        for (code, want) in [
            ("\"foobar\" | contains(\"bar\")", json!(true)),
            ("[\"foobar\", \"foobaz\", \"blarp\"] | contains([\"baz\", \"bar\"])", json!(true)),
            ("[\"foobar\", \"foobaz\", \"blarp\"] | contains([\"bazzzzz\", \"bar\"])", json!(false)),
            (
                "{foo: 12, bar: [1, 2, {barp: 12, blip: 13}]} | [contains({foo: 12, bar: [{barp: 12}]}), contains({foo: 12, bar: [{barp: 15}]})]",
                json!([true, false]),
            ),
            ("[1 | contains(1), contains(\"1\"), contains(null)]", json!([true, false, false])),
            ("[{} | contains({}), ([] | contains([])), ([1] | contains([]))]", json!([true, true, true])),
            ("[\"bar\" | inside(\"foobar\"), inside(\"baz\")]", json!([true, false])),
            ("\"a,b, cd, efg\" | indices(\", \")", json!([3, 7])),
            ("[0, 1, 2, 1, 3, 1, 4] | indices(1)", json!([1, 3, 5])),
            ("[0, 1, 2, 3, 1, 4, 2, 5, 1, 2, 6, 7] | indices([1, 2])", json!([1, 8])),
            ("\"aaa\" | indices(\"aa\")", json!([0, 1])),
            // Characters of text, bytes of a byte string.
            ("\"\u{e9}o\u{f6}o\" | indices(\"o\")", json!([1, 3])),
            ("\"\u{e9}o\u{f6}o\" | tobytes | indices(\"o\" | tobytes)", json!([2, 5])),
            ("[\"x\" | indices(\"\"), ([1] | indices([])), (\"ab\" | indices(\"abc\"))]", json!([[], [], []])),
            ("\"a,b, cd, efg\" | [index(\", \"), rindex(\", \")]", json!([3, 7])),
            ("[range(2000)] | contains([range(2000)])", json!(true)),
            ("(\"ab\" * 1000) | indices(\"ab\" * 999)", json!([0, 2])),
            ("[range(300) | 0] | indices([range(100) | 0]) | length", json!(201)),
            ("\"abc\" | tobytes | indices(\"bc\" | tobytes)", json!([1])),
        ] {
            let e = Expr::compile(code, &[], Limits::default()).unwrap();
            assert_eq!(e.eval_json(&json!(null)).unwrap(), want, "{code}");
        }
        // What is not text, bytes or an array is jaq's error.
        let e = Expr::compile("{} | indices(1)", &[], Limits::default()).unwrap();
        let err = e.eval_json(&json!(null)).unwrap_err();
        assert!(err.message.contains("cannot index"), "{err:?}");
    }

    /// An array key (`.[[1, 2]]`) finds where it occurs in an array, comparing element by element
    /// like `indices`; jaq made those comparisons unpaid, and `x[k]` and the later parts of a path
    /// paid only for the key. Every part now pays for them, and paths keep jaq's results.
    #[test]
    fn array_keys_pay_for_their_comparisons() {
        let limits = Limits {
            fuel: 200_000,
            ..Limits::default()
        };
        for code in [
            "[range(20000) | 0] | .[.[:10000]]",
            "[range(20000) | 0] as $a | $a[$a[:10000]]",
            "[range(20000) | 0] as $a | [$a] | .[0][$a[:10000]]",
            "{a: [range(20000) | 0]} | .a[.a[:10000]]",
            "{a: [range(20000) | 0]} | path(.a[.a[:10000]])",
            "[[range(20000) | 0]] | .[0][[range(10000) | 0]]",
            "[range(300)] as $a | [range(600) | $a | .[0] = 0] as $x | $x | .[$x[:300]]",
        ] {
            let e = Expr::compile(code, &[], limits).unwrap();
            match e.eval_json(&json!(null)) {
                Err(err) => assert!(err.out_of_fuel, "{code}: {err:?}"),
                Ok(_) => panic!("{code}: a value, not the end of the fuel"),
            }
        }
        for (code, want) in [
            ("[[1, 2], [3, 4]] | [.[0, 1][0, 1]]", json!([1, 2, 3, 4])),
            ("{a: [0, 1, 2, 1, 2], k: [1, 2]} | .a[.k]", json!([1, 3])),
            ("[0, 1, 2, 1, 2] as $x | {k: [1, 2]} | $x[.k]", json!([1, 3])),
            ("{a: {b: [5, 6, 7]}, i: 1} | .a.b[.i]", json!(6)),
            (
                "{a: [5, 6, 7], i: 1} | [path(.a[.i], .a[.i:], .a[:.i], .a[]?)]",
                json!([["a", 1], ["a", {"start": 1}], ["a", {"end": 1}], ["a", 0], ["a", 1], ["a", 2]]),
            ),
            (
                "{a: [5, 6, 7], i: 1} | .a[.i] |= . + 10",
                json!({"a": [5, 16, 7], "i": 1}),
            ),
            ("{a: [5, 6, 7], i: 1} | .a[.i:] |= [0]", json!({"a": [5, 0], "i": 1})),
            (
                "{a: [[1, 2], [3, 4]], i: 1} | del(.a[.i][0])",
                json!({"a": [[1, 2], [4]], "i": 1}),
            ),
            ("{a: [[1, 2], [3, 4]]} | [.a[.a[0][0]][.a[0][0]]]", json!([4])),
            (
                "{a: [1, 2, 3]} | [.a[range(2)], (.a[1, 2] as $v | $v)]",
                json!([1, 2, 2, 3]),
            ),
            ("[[0, 1, 0, 1]] | .[0][[0, 1]]", json!([0, 2])),
            ("{a: [1], b: \"x\"} | [.a[.b]?]", json!([])),
            ("[range(300) | 0] as $a | $a[$a[:100]] | length", json!(201)),
        ] {
            let e = Expr::compile(code, &[], Limits::default()).unwrap();
            assert_eq!(e.eval_json(&json!(null)).unwrap(), want, "{code}");
        }
    }

    /// Our rewrites call our natives and bind our variables inside the user's code, where a user's
    /// namesake would capture them: `def __keyed(k): k;` ran an array key's search unpaid (15 s).
    /// Names that start with `__` are refused wherever the user's code could bind or read them.
    #[test]
    fn names_of_our_helpers_are_refused() {
        for (code, name) in [
            ("def __keyed(k): k; [range(10) | 0] as $a | $a[$a[:5]]", "__keyed"),
            ("def __tick: .; [.[]]", "__tick"),
            ("def f(__sorted): [3, 1] | sort; f(.)", "__sorted"),
            ("def f($__p): $__p; f(1)", "$__p"),
            ("1 as $__in | 2 | . + (. + $__in)", "$__in"),
            ("{a: 1} as {a: $__v} | $__v", "$__v"),
            ("[1] as [$__u] | $__u", "$__u"),
            ("reduce range(3) as $__x (0; . + $__x)", "$__x"),
            ("{k: 0, v: [7, 8]} | .v[.k + $__p]", "$__p"),
            ("\"\\($__z)\"", "$__z"),
        ] {
            let err = Expr::compile(code, &[], Limits::default()).unwrap_err();
            assert!(err.contains(&format!("`{name}` is reserved")), "{code}: {err}");
        }
        // In an expression function's body too.
        let functions = [ExprFunction {
            name: "f".into(),
            body: "${ def __eq(x): true; . == 1 }".into(),
        }];
        let err = Expr::compile("fn:f", &functions, Limits::default()).unwrap_err();
        assert!(err.contains("`__eq` is reserved"), "{err}");
        // A string, a key or a field may say `__` (they bind nothing), and jq's own names still work.
        for (code, want) in [
            ("{__a: \"$__b\"} | .__a", json!("$__b")),
            ("{a: 1} as {a: $x_} | $x_", json!(1)),
            ("def f__: 2; f__", json!(2)),
        ] {
            let e = Expr::compile(code, &[], Limits::default()).unwrap();
            assert_eq!(e.eval_json(&json!(null)).unwrap(), want, "{code}");
        }
    }

    /// Builds too big for the limits stop the evaluation, before they allocate where they can,
    /// and `try` cannot catch it.
    #[test]
    fn what_an_expression_builds_is_bounded() {
        let wide = json!((0..200).collect::<Vec<_>>());
        for (code, input, why) in [
            ("\"x\" * 10000000000", json!(null), "string longer than 10485760 bytes"),
            ("\"x\" * 100000000", json!(null), "string longer than"),
            ("100000000 * \"xy\"", json!(null), "string longer than"),
            ("\"x\" * (10000000000 * 10000000000)", json!(null), "string longer than"),
            ("try (\"x\" * 100000000) catch 0", json!(null), "string longer than"),
            (
                "reduce range(40) as $i (\"x\"; . + .)",
                json!(null),
                "string longer than",
            ),
            (
                "reduce range(40) as $i ([1]; . + .)",
                json!(null),
                "more than 1048576 entries",
            ),
            (
                "reduce range(40) as $i (\"x\"; \"\\(.)\\(.)\")",
                json!(null),
                "string longer than",
            ),
            (
                "reduce range(40) as $i ({a: \"x\"}; .[\"a\"] += .a)",
                json!(null),
                "string longer than",
            ),
            (
                "\"a\" as $k | reduce range(40) as $i ({a: \"x\"}; .[$k] += .[$k])",
                json!(null),
                "string longer than",
            ),
            (
                "[range(100)] | map(\"x\" * 1000000) | length",
                json!(null),
                "more than 67108864 bytes",
            ),
            (
                "[range(30)] | map(\"x\" * 1000000) | tojson",
                json!(null),
                "string longer than",
            ),
            (
                "reduce range(22) as $i ([1]; [., .]) | tostring",
                json!(null),
                "string longer than",
            ),
            (
                "reduce range(22) as $i ([1]; [., .]) | tojson",
                json!(null),
                "string longer than",
            ),
            (
                "\"[\" + (\"0,\" * 4000000) + \"0]\" | fromjson",
                json!(null),
                "more than 67108864 bytes",
            ),
            (
                "\"x\" * 2000000 | gsub(\"x\"; \"y\")",
                json!(null),
                "more than 67108864 bytes",
            ),
            (
                "\"x\" * 2000000 | [match(\"x\"; \"g\")] | length",
                json!(null),
                "more than 67108864 bytes",
            ),
            ("\"x\" * 5000000 | explode", json!(null), "more than 1048576 entries"),
            ("\"x\" * 5000000 | . / \"\"", json!(null), "more than 1048576 entries"),
            (
                "[.[] as $a | .[] as $b | .[] as $c | 1] | length",
                wide,
                "more than 67108864 bytes",
            ),
        ] {
            let e = Expr::compile(
                code,
                &[],
                Limits {
                    fuel: 100_000_000,
                    ..Limits::default()
                },
            )
            .unwrap();
            let err = e.eval_json(&input).unwrap_err();
            assert!(err.message.contains(why), "{code}: {err:?}");
            assert!(err.message.contains(code), "{code}: {err:?}");
            assert!(err.out_of_fuel, "{code}: {err:?}");
        }
    }

    #[test]
    fn assignments_to_computed_paths_are_bounded() {
        let limits = Limits {
            max_items: 1000,
            ..Limits::default()
        };
        let e = Expr::compile("reduce range(2000) as $i ({}; .[\"k\\($i)\"] = 1)", &[], limits).unwrap();
        let err = e.eval_json(&json!(null)).unwrap_err();
        assert!(
            err.message.contains("more than 1000 entries") && err.out_of_fuel,
            "{err:?}"
        );
        let e = Expr::compile(
            "reduce range(1000) as $i ({}; .[\"k\\($i)\"] = 1) | length",
            &[],
            limits,
        )
        .unwrap();
        assert_eq!(e.eval_json(&json!(null)).unwrap(), json!(1000));
    }

    #[test]
    fn size_checks_leave_ordinary_work_alone() {
        give(json!(null), "\"ab\" * 3", json!("ababab"));
        give(json!(null), "\"ab\" * 0", json!(null));
        give(json!(null), "\"a,b\" / \",\"", json!(["a", "b"]));
        give(json!(null), "\"héllo\" / \"\" | length", json!(5));
        give(json!(null), "{a: {b: 1}} * {a: {c: 2}}", json!({"a": {"b": 1, "c": 2}}));
        // Outputs come in jaq's order (`-` is still jaq's own operator).
        give(json!(null), "[(1, 2) + (10, 20)] == [(1, 2) - (-10, -20)]", json!(true));
        give(json!(null), "[(\"a\", \"b\") * (1, 2)]", json!(["a", "aa", "b", "bb"]));
        give(json!([1, 2]), ".[] += 1", json!([2, 3]));
        give(json!({"a": "x"}), "\"a\" as $k | .[$k] += \"y\"", json!({"a": "xy"}));
        give(json!({"a": [1]}), ".a += [2] | .a |= . + [3]", json!({"a": [1, 2, 3]}));
        give(json!(null), "\"a-b-c\" | gsub(\"-\"; \"+\")", json!("a+b+c"));
        give(json!(null), "\"abc\" | test(\"b\")", json!(true));
        give(json!(null), "\"[1, [2]]\" | fromjson", json!([1, [2]]));
        give(json!(null), "[1, {a: 2}] | tojson", json!("[1,{\"a\":2}]"));
        // Growth is what counts for `+`: joining 100,000 strings builds each once, not each prefix.
        give(
            json!(null),
            "[range(100000) | \"abcdefghij\"] | join(\",\") | length",
            json!(1_099_999),
        );
        give(
            json!(null),
            "reduce range(100000) as $i (\"\"; . + \"abcdefghij\") | length",
            json!(1_000_000),
        );
    }

    #[test]
    fn expression_functions() {
        let fns = vec![
            ExprFunction {
                name: "double".into(),
                body: "${ . * 2 }".into(),
            },
            ExprFunction {
                name: "quad".into(),
                body: "${ fn:double | fn:double }".into(),
            },
        ];
        let e = Expr::compile("${ .n | fn:quad }", &fns, Limits::default()).unwrap();
        assert_eq!(e.eval_json(&json!({"n": 3})).unwrap(), json!(12));
        let e = Expr::compile("${ \"fn:double\" }", &fns, Limits::default()).unwrap();
        assert_eq!(e.eval_json(&json!(null)).unwrap(), json!("fn:double"));
        let e = Expr::compile("${ {fn: 1, a: (2 | fn:double)} }", &fns, Limits::default()).unwrap();
        assert_eq!(e.eval_json(&json!(null)).unwrap(), json!({"fn": 1, "a": 4}));
        let e = Expr::compile("${ \"n=\\(.n | fn:double)!\" }", &fns, Limits::default()).unwrap();
        assert_eq!(e.eval_json(&json!({"n": 5})).unwrap(), json!("n=10!"));
        let err = Expr::compile("${ fn:nope }", &fns, Limits::default()).unwrap_err();
        assert!(err.contains("fn:nope"), "{err}");
        let cyc = vec![ExprFunction {
            name: "a".into(),
            body: "fn:a".into(),
        }];
        assert!(Expr::compile("fn:a", &cyc, Limits::default())
            .unwrap_err()
            .contains("itself"));
    }

    #[test]
    fn machine_shares_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Expr>();
    }
}
