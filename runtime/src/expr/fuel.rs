//! Fuel: the budget every evaluation burns, the halts that stop it, and the rewrite of the
//! syntax tree that puts a fuel tick into every definition call and every value of a product.

use super::size::SIZED;
use super::{Env, OUT_OF_FUEL, OUT_OF_STACK};
use jaq_core::load::parse::{BinaryOp, Def, Pattern, Term};
use jaq_core::ops::{Cmp, Math};
use jaq_core::path::{Part, Path};
use jaq_core::Exn;
use jaq_json::Val;

/// An address in the current stack frame.
#[inline(always)]
pub(super) fn stack_address() -> usize {
    let probe = 0u8;
    std::hint::black_box(&probe) as *const u8 as usize
}

/// The halt of a limit, remembered (see [`Env::halted`]).
pub(super) fn halt<'a>(env: &Env, code: i32) -> Exn<'a, Val> {
    if env.halted.get().is_none() {
        env.halted.set(Some(code));
    }
    Exn::halt(code)
}

/// The halt code of the limit that stopped the evaluation, if one did.
pub(super) fn halted(env: &Env) -> Option<i32> {
    env.halted.get()
}

/// Burns `n` units of fuel at once (all that is left when that is fewer, then the halt code).
pub(super) fn burn_n(env: &Env, n: u64) -> Result<(), i32> {
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
pub(super) fn burn(env: &Env) -> Result<(), i32> {
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

pub(super) fn tick<'a>() -> Term<&'a str> {
    Term::Call("__tick", Vec::new())
}

pub(super) fn fuel_def(def: Def<&str>) -> Def<&str> {
    Def {
        name: def.name,
        args: def.args,
        body: Term::BinOp(Box::new(tick()), BinaryOp::Pipe(None), Box::new(fuel_term(def.body))),
    }
}

/// Adds a fuel tick to the body of every definition nested in a term.
pub(super) fn fuel_term<'a>(t: Term<&'a str>) -> Term<&'a str> {
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
pub(super) fn keyed_path<'a>(
    x: Term<&'a str>,
    parts: Vec<(Part<Term<&'a str>>, jaq_core::path::Opt)>,
) -> Term<&'a str> {
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
pub(super) fn ticked(t: Term<&str>) -> Term<&str> {
    Term::BinOp(Box::new(t), BinaryOp::Pipe(None), Box::new(tick()))
}

/// The left operand of `l, r`, every value of it burning a unit (of `a, b, c`, parsed `(a, b), c`, `a`
/// and `b` each once). The right operand is not ticked: it stays a tail call, so a recursion such as
/// `range/3`'s `., (. + $by | up)` runs in constant stack. Of a product of commas, at least one value in
/// two is ticked.
pub(super) fn comma_left(l: Term<&str>) -> Term<&str> {
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
pub(super) fn gated(t: Term<&str>) -> Term<&str> {
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
pub(super) fn checked(t: Term<&str>) -> Term<&str> {
    Term::BinOp(
        Box::new(t),
        BinaryOp::Pipe(None),
        Box::new(Term::Call("__check", Vec::new())),
    )
}

/// `l op r`, through our checked natives for the operations that can make values bigger (see
/// [`native_pair`]): the native takes `l`'s output as its input, so that a value built up in
/// `reduce` (`. + $x`) stays unshared and grows in place as with jaq's own operator.
pub(super) fn math_term<'a>(l: Term<&'a str>, m: Math, r: Term<&'a str>) -> Term<&'a str> {
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
pub(super) fn native_pair<'a>(
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
pub(super) fn cmp_term<'a>(l: Term<&'a str>, c: Cmp, r: Term<&'a str>) -> Term<&'a str> {
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
pub(super) fn closed(t: &Term<&str>) -> bool {
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
pub(super) fn assignment<'a>(path: Term<&'a str>, op: BinaryOp<&'a str>, r: Term<&'a str>) -> Term<&'a str> {
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

pub(super) fn fuel_op(op: BinaryOp<&str>) -> BinaryOp<&str> {
    match op {
        BinaryOp::Pipe(Some(p)) => BinaryOp::Pipe(Some(fuel_pattern(p))),
        other => other,
    }
}

pub(super) fn fuel_pattern(p: Pattern<&str>) -> Pattern<&str> {
    match p {
        Pattern::Var(x) => Pattern::Var(x),
        Pattern::Arr(ps) => Pattern::Arr(ps.into_iter().map(fuel_pattern).collect()),
        Pattern::Obj(kps) => Pattern::Obj(kps.into_iter().map(|(k, p)| (fuel_term(k), fuel_pattern(p))).collect()),
    }
}

#[cfg(test)]
mod tests {
    use crate::expr::{Expr, Limits};
    use serde_json::json;

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
}
