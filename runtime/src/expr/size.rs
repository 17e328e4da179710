//! Size limits: what a value counts for against [`Limits::memory`](super::Limits::memory) and
//! the string limit, checked and charged as an evaluation builds, and arithmetic that refuses
//! before it allocates past them.

use super::fuel::halt;
use super::{Env, OUT_OF_MEMORY, STRING_TOO_LONG, TOO_MANY_ITEMS};
use jaq_core::ops::{Cmp, Math};
use jaq_core::Exn;
use jaq_json::Val;

/// What an array element and an object entry count for against [`Limits::memory`].
pub(super) const VAL_BYTES: u64 = 16;
pub(super) const ENTRY_BYTES: u64 = 48;
/// What `fromjson` is charged per byte of text (the most a JSON text can grow into as values), and
/// a global regex function per character of its input (the most its matches can take).
pub(super) const JSON_FACTOR: u64 = 8;
pub(super) const MATCH_BYTES: u64 = 64;

/// The natives whose output is new and can be large: their output is checked and charged.
pub(super) const SIZED: &[&str] = &[
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
pub(super) fn shallow_size(v: &Val) -> u64 {
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
pub(super) fn expanded_size(v: &Val, budget: u64) -> Option<u64> {
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
pub(super) fn size_and_depth(v: &Val, budget: u64, depth: usize) -> Option<bool> {
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
pub(super) struct BoundedText(pub(super) usize);

impl std::fmt::Write for BoundedText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0 = self.0.checked_sub(s.len()).ok_or(std::fmt::Error)?;
        Ok(())
    }
}

/// Checks that the JSON text of an array or object fits the string limit, writing it into a sink
/// that stops at the limit (strings and numbers are bounded already).
pub(super) fn text_fits(env: &Env, v: &Val) -> Result<(), i32> {
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
pub(super) fn caught_text<'a>(env: &Env, exn: Exn<'a, Val>) -> Exn<'a, Val> {
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
pub(super) struct CappedText(String, usize);

impl std::fmt::Write for CappedText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.1 = self.1.checked_sub(s.len()).ok_or(std::fmt::Error)?;
        self.0.push_str(s);
        Ok(())
    }
}

/// The first few bytes of a text, then a failure that ends the writing.
pub(super) struct TextStart(String);

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
pub(super) fn check_size(env: &Env, v: &Val) -> Result<(), i32> {
    match v {
        Val::TStr(s) | Val::BStr(s) if s.len() > env.limits.max_string => Err(STRING_TOO_LONG),
        Val::Arr(a) if a.len() > env.limits.max_items => Err(TOO_MANY_ITEMS),
        Val::Obj(o) if o.len() > env.limits.max_items => Err(TOO_MANY_ITEMS),
        _ => Ok(()),
    }
}

/// Takes `bytes` from what the evaluation may still build.
pub(super) fn charge(env: &Env, bytes: u64) -> Result<(), i32> {
    match env.memory.get().checked_sub(bytes) {
        Some(left) => {
            env.memory.set(left);
            Ok(())
        }
        None => Err(OUT_OF_MEMORY),
    }
}

/// Checks a new value and charges it.
pub(super) fn check_new(env: &Env, v: &Val) -> Result<(), i32> {
    check_size(env, v)?;
    charge(env, shallow_size(v))
}

/// Charges what comparing `l` with `r` may walk. Values share their parts (`.a = .`, `[., .]`), so
/// two arrays or objects built in a few steps can stand for more JSON than the host has memory, and
/// comparing them walks all of it: an equality walks at most the smaller, an ordering may walk both
/// (it sorts each object's keys). That is charged against [`Limits::memory`] as if it were built,
/// each walk stopping at what is left, so that comparisons cannot take longer than building would.
/// Scalars, and values of different kinds, compare at once and cost nothing.
pub(super) fn charge_compare(env: &Env, op: Cmp, l: &Val, r: &Val) -> Result<(), i32> {
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
pub(super) fn charge_walk(env: &Env, v: &Val) -> Result<(), i32> {
    if !matches!(v, Val::Arr(_) | Val::Obj(_)) {
        return Ok(());
    }
    let size = expanded_size(v, env.memory.get()).ok_or(OUT_OF_MEMORY)?;
    charge(env, size)
}

pub(super) fn str_len(v: &Val) -> Option<usize> {
    match v {
        Val::TStr(s) | Val::BStr(s) => Some(s.len()),
        _ => None,
    }
}

/// `l + r`, `l * r` and `l / r`, refusing before they allocate what would cross a limit.
pub(super) fn checked_math(env: &Env, op: Math, l: Val, r: Val) -> Result<Result<Val, jaq_core::Error<Val>>, i32> {
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
pub(super) fn split_count(s: &[u8], sep: &[u8]) -> usize {
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

/// Deepest nesting `fromjson` accepts.
pub const MAX_JSON_DEPTH: usize = 10_000;

/// The deepest nesting of arrays and objects in a JSON text (strings skipped).
pub(super) fn json_nesting(text: &str) -> usize {
    crate::json::text_nesting(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use crate::expr::tests::give;
    use crate::expr::{Expr, Limits};
    use serde_json::json;

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
}
