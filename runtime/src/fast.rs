//! A direct evaluator for the simplest jq shapes, the ones that dominate conditions and handlers:
//! `.a.b`, literals, `$value`, comparisons, arithmetic, `and`/`or`, `|`, `.a.b = x` and `.a += x`.
//!
//! It reuses jaq's own operations (`ops::Cmp`, `ops::Math`, `Val` ordering), and it only takes the
//! happy path: anything unusual (an index into a non-object, an arithmetic error) returns `None` and
//! the expression runs through jaq, so results and error messages stay exactly jaq's. Arithmetic is
//! on numbers only: what `+`, `*` and `/` build from strings, arrays and objects is checked against
//! the expression limits in jaq. A property test checks the two agree.

use jaq_core::load::lex::StrPart;
use jaq_core::load::parse::{BinaryOp, Term};
use jaq_core::ops::{Cmp, Math};
use jaq_core::path::{Opt, Part, Path};
use jaq_json::{Map, Num, Val};
use std::borrow::Cow;

/// A compiled simple expression.
#[derive(Debug, Clone)]
pub enum Fast {
    /// A constant.
    Lit(Val),
    /// `.a.b` applied to the input of this node.
    Path(Box<Fast>, Vec<Val>),
    /// `.`.
    Id,
    /// `$value`.
    Value,
    /// `l <op> r`.
    Cmp(Box<Fast>, Cmp, Box<Fast>),
    /// `l <op> r`.
    Math(Box<Fast>, Math, Box<Fast>),
    /// `l and r`.
    And(Box<Fast>, Box<Fast>),
    /// `l or r`.
    Or(Box<Fast>, Box<Fast>),
    /// `l | r`.
    Pipe(Box<Fast>, Box<Fast>),
    /// `.a.b = r`.
    Assign(Vec<Val>, Box<Fast>),
    /// `.a.b op= r`.
    Update(Vec<Val>, Math, Box<Fast>),
}

fn key(t: &Term<&str>) -> Option<Val> {
    match t {
        Term::Num(n) if !n.is_empty() && n.len() < 10 && n.bytes().all(|b| b.is_ascii_digit()) => {
            Some(Val::Num(Num::from_str_radix(n, 10)?))
        }
        Term::Str(None, parts) => {
            let mut s = String::new();
            for p in parts {
                match p {
                    StrPart::Str(x) => s.push_str(x),
                    StrPart::Char(c) => s.push(*c),
                    StrPart::Term(_) => return None,
                }
            }
            Some(Val::utf8_str(s.into_bytes()))
        }
        _ => None,
    }
}

fn keys(path: &Path<Term<&str>>) -> Option<Vec<Val>> {
    path.0
        .iter()
        .map(|(part, opt)| match (part, opt) {
            (Part::Index(i), Opt::Essential) => key(i),
            _ => None,
        })
        .collect()
}

/// A path written from `.`: `.a.b` (but not `.`, which jq cannot assign to as an object key path).
fn lhs_path(t: &Term<&str>) -> Option<Vec<Val>> {
    match t {
        Term::Path(base, path) if matches!(**base, Term::Id) => keys(path).filter(|k| !k.is_empty()),
        _ => None,
    }
}

/// For `.a.b` (a path of fixed keys from `.`), the keys as a jq array term `["a", "b"]`.
pub fn simple_path<'a>(t: &Term<&'a str>) -> Option<Term<&'a str>> {
    let Term::Path(base, path) = t else { return None };
    if !matches!(**base, Term::Id) || path.0.is_empty() {
        return None;
    }
    let mut items: Option<Term<&'a str>> = None;
    for (part, opt) in &path.0 {
        let (Part::Index(k @ (Term::Str(None, _) | Term::Num(_))), Opt::Essential) = (part, opt) else {
            return None;
        };
        key(k)?;
        items = Some(match items {
            None => k.clone(),
            Some(prev) => Term::BinOp(Box::new(prev), BinaryOp::Comma, Box::new(k.clone())),
        });
    }
    Some(Term::Arr(items.map(Box::new)))
}

fn type_name(v: &Val) -> &'static str {
    match v {
        Val::Null => "null",
        Val::Bool(_) => "boolean",
        Val::Num(_) => "number",
        Val::TStr(_) | Val::BStr(_) => "string",
        Val::Arr(_) => "array",
        Val::Obj(_) => "object",
    }
}

fn path_keys(path: &Val) -> Result<Vec<Val>, String> {
    match path {
        Val::Arr(a) => Ok(a.iter().cloned().collect()),
        _ => Err("path must be an array".into()),
    }
}

/// `getpath` for object keys with jq's semantics: null yields null; other non-objects are an error.
pub fn get_path(v: &Val, path: &Val) -> Result<Val, String> {
    let mut cur = v.clone();
    for k in path_keys(path)? {
        cur = get(&cur, &k).ok_or_else(|| format!("cannot index {} with {}", type_name(&cur), k))?;
    }
    Ok(cur)
}

/// `setpath` for object keys with jq's semantics: a null or missing parent becomes an object.
pub fn set_path(v: Val, path: &Val, x: Val) -> Result<Val, String> {
    let keys = path_keys(path)?;
    let mut probe = v.clone();
    for k in &keys {
        match get(&probe, k) {
            Some(next) => probe = next,
            None => return Err(format!("cannot index {} with {}", type_name(&probe), k)),
        }
    }
    set(v, &keys, x).ok_or_else(|| "cannot update this path".to_string())
}

/// Compiles a parsed term, if it only uses the shapes above.
pub fn compile(t: &Term<&str>) -> Option<Fast> {
    Some(match t {
        Term::Id => Fast::Id,
        Term::Var("$value") => Fast::Value,
        Term::Call("true", args) if args.is_empty() => Fast::Lit(Val::Bool(true)),
        Term::Call("false", args) if args.is_empty() => Fast::Lit(Val::Bool(false)),
        Term::Call("null", args) if args.is_empty() => Fast::Lit(Val::Null),
        Term::Num(n) => Fast::Lit(Val::Num(
            Num::from_str_radix(n, 10).filter(|_| n.bytes().all(|b| b.is_ascii_digit()))?,
        )),
        Term::Str(..) => Fast::Lit(key(t)?),
        Term::Path(base, path) => {
            let ks = keys(path)?;
            let base = compile(base)?;
            if ks.is_empty() {
                base
            } else {
                Fast::Path(Box::new(base), ks)
            }
        }
        Term::BinOp(l, op, r) => match op {
            BinaryOp::Cmp(c) => Fast::Cmp(Box::new(compile(l)?), *c, Box::new(compile(r)?)),
            BinaryOp::Math(m) => Fast::Math(Box::new(compile(l)?), *m, Box::new(compile(r)?)),
            BinaryOp::And => Fast::And(Box::new(compile(l)?), Box::new(compile(r)?)),
            BinaryOp::Or => Fast::Or(Box::new(compile(l)?), Box::new(compile(r)?)),
            BinaryOp::Pipe(None) => Fast::Pipe(Box::new(compile(l)?), Box::new(compile(r)?)),
            BinaryOp::Assign => Fast::Assign(lhs_path(l)?, Box::new(compile(r)?)),
            BinaryOp::UpdateMath(m) => Fast::Update(lhs_path(l)?, *m, Box::new(compile(r)?)),
            _ => return None,
        },
        _ => return None,
    })
}

fn truthy(v: &Val) -> bool {
    !matches!(v, Val::Null | Val::Bool(false))
}

fn index(k: &Val) -> Option<usize> {
    match k {
        Val::Num(Num::Int(i)) if *i >= 0 => Some(*i as usize),
        _ => None,
    }
}

/// `null`, for lookups that yield it without a value to borrow.
static NULL: Val = Val::Null;

/// Objects up to this many entries are searched key by key: cheaper than hashing the key, and
/// the objects of instance data are mostly this small.
const SCAN: usize = 8;

/// The value at key `k` of object `m`, as [`Map::get`] finds it.
fn lookup<'a>(m: &'a Map, k: &Val) -> Option<&'a Val> {
    if m.len() <= SCAN {
        m.iter().find(|(x, _)| *x == k).map(|(_, v)| v)
    } else {
        m.get(k)
    }
}

/// The value at key `k` of object `m`, to change in place.
fn lookup_mut<'a>(m: &'a mut Map, k: &Val) -> Option<&'a mut Val> {
    if m.len() <= SCAN {
        m.iter_mut().find(|(x, _)| *x == k).map(|(_, v)| v)
    } else {
        m.get_mut(k)
    }
}

/// `v[k]` with jq's semantics for object keys and array indices, borrowed.
fn get_ref<'a>(v: &'a Val, k: &Val) -> Option<&'a Val> {
    match (v, k) {
        (Val::Null, _) => Some(&NULL),
        (Val::Obj(m), Val::TStr(_)) => Some(lookup(m, k).unwrap_or(&NULL)),
        (Val::Arr(a), _) => Some(a.get(index(k)?).unwrap_or(&NULL)),
        _ => None,
    }
}

fn get(v: &Val, k: &Val) -> Option<Val> {
    get_ref(v, k).cloned()
}

/// Largest array index an assignment may create (jq pads with nulls up to it).
const MAX_INDEX: usize = 1 << 20;

fn set(v: Val, ks: &[Val], x: Val) -> Option<Val> {
    let Some((k, rest)) = ks.split_first() else {
        return Some(x);
    };
    match (v, k) {
        (v @ (Val::Null | Val::Obj(_)), Val::TStr(_)) => {
            let mut map = match v {
                Val::Obj(m) => jaq_json::Rc::unwrap_or_clone(m),
                _ => jaq_json::Map::default(),
            };
            match lookup_mut(&mut map, k) {
                Some(slot) => {
                    let inner = std::mem::take(slot);
                    *slot = set(inner, rest, x)?;
                }
                None => {
                    map.insert(k.clone(), set(Val::Null, rest, x)?);
                }
            }
            Some(Val::obj(map))
        }
        (v @ (Val::Null | Val::Arr(_)), Val::Num(_)) => {
            let i = index(k).filter(|i| *i <= MAX_INDEX)?;
            let mut arr = match v {
                Val::Arr(a) => jaq_json::Rc::unwrap_or_clone(a),
                _ => Vec::new(),
            };
            if arr.len() <= i {
                arr.resize(i + 1, Val::Null);
            }
            let inner = std::mem::take(&mut arr[i]);
            arr[i] = set(inner, rest, x)?;
            Some(Val::Arr(arr.into()))
        }
        _ => None,
    }
}

/// Arithmetic on two numbers. Strings, arrays and objects go to jaq, where what `+`, `*` and `/`
/// build is checked against the expression limits.
fn numbers(m: Math, l: Val, r: Val) -> Option<Val> {
    match (&l, &r) {
        (Val::Num(_), Val::Num(_)) => m.run(l, r).ok(),
        _ => None,
    }
}

impl Fast {
    /// Evaluates; `None` means "ask jaq" (an edge case or an error).
    pub fn eval(&self, input: &Val, value: &Val) -> Option<Val> {
        match self {
            Fast::Lit(_) | Fast::Id | Fast::Value | Fast::Path(..) => self.eval_ref(input, value).map(Cow::into_owned),
            Fast::Cmp(l, c, r) => {
                let (l, r) = (l.eval_ref(input, value)?, r.eval_ref(input, value)?);
                Some(Val::Bool(c.run(&l, &r)))
            }
            Fast::Math(l, m, r) => {
                let (l, r) = (l.eval_ref(input, value)?, r.eval_ref(input, value)?);
                match (&*l, &*r) {
                    (Val::Num(_), Val::Num(_)) => numbers(*m, l.into_owned(), r.into_owned()),
                    _ => None,
                }
            }
            Fast::And(l, r) => {
                if !truthy(&*l.eval_ref(input, value)?) {
                    return Some(Val::Bool(false));
                }
                Some(Val::Bool(truthy(&*r.eval_ref(input, value)?)))
            }
            Fast::Or(l, r) => {
                if truthy(&*l.eval_ref(input, value)?) {
                    return Some(Val::Bool(true));
                }
                Some(Val::Bool(truthy(&*r.eval_ref(input, value)?)))
            }
            Fast::Pipe(l, r) => {
                let mid = l.eval_ref(input, value)?;
                r.eval(&mid, value)
            }
            Fast::Assign(ks, r) => {
                let x = r.eval(input, value)?;
                set(input.clone(), ks, x)
            }
            Fast::Update(ks, m, r) => {
                let x = r.eval(input, value)?;
                let new = numbers(*m, get_path_ref(input, ks)?.clone(), x)?;
                set(input.clone(), ks, new)
            }
        }
    }

    /// [`Fast::eval`], borrowing from the input, the value or the expression where the result is
    /// one of their parts (`.a.b`, `$value`, a literal): nothing is copied to read or compare it.
    fn eval_ref<'a>(&'a self, input: &'a Val, value: &'a Val) -> Option<Cow<'a, Val>> {
        match self {
            Fast::Lit(v) => Some(Cow::Borrowed(v)),
            Fast::Id => Some(Cow::Borrowed(input)),
            Fast::Value => Some(Cow::Borrowed(value)),
            Fast::Path(base, ks) => match base.eval_ref(input, value)? {
                Cow::Borrowed(v) => get_path_ref(v, ks).map(Cow::Borrowed),
                Cow::Owned(v) => get_path_ref(&v, ks).cloned().map(Cow::Owned),
            },
            _ => self.eval(input, value).map(Cow::Owned),
        }
    }

    /// For an assignment `.a.b = r` or `.a.b op= r` whose target's parent exists (`.a` is an
    /// object, or an array holding the index): its path and the value to store there, computed
    /// without changing `input`. Storing it with [`replace`] gives what [`Fast::eval`] gives.
    /// `None` for every other expression and case.
    pub fn in_place<'a>(&'a self, input: &Val, value: &Val) -> Option<(&'a [Val], Val)> {
        let (ks, x) = match self {
            Fast::Assign(ks, r) => (ks, r.eval(input, value)?),
            Fast::Update(ks, m, r) => {
                let x = r.eval(input, value)?;
                (ks, numbers(*m, get_path_ref(input, ks)?.clone(), x)?)
            }
            _ => return None,
        };
        let (last, parents) = ks.split_last()?;
        let parent = parents.iter().try_fold(input, |v, k| match (v, k) {
            (Val::Obj(m), Val::TStr(_)) => lookup(m, k),
            (Val::Arr(a), _) => a.get(index(k)?),
            _ => None,
        })?;
        match (parent, last) {
            (Val::Obj(_), Val::TStr(_)) => Some((ks, x)),
            (Val::Arr(a), _) if index(last)? < a.len() => Some((ks, x)),
            _ => None,
        }
    }
}

/// `getpath` of a path of fixed keys, borrowed.
fn get_path_ref<'a>(v: &'a Val, ks: &[Val]) -> Option<&'a Val> {
    ks.iter().try_fold(v, |v, k| get_ref(v, k))
}

/// Stores `x` at path `ks` of `v`, whose parents exist (see [`Fast::in_place`]): the containers on
/// the path are changed in place where `v` alone holds them, copied where they are shared. Gives
/// back what was there (`None`: the key was new, and is now the object's last), for [`restore`].
pub fn replace(v: &mut Val, ks: &[Val], x: Val) -> Option<Val> {
    let (last, parents) = ks.split_last()?;
    let mut cur = v;
    for k in parents {
        cur = child_mut(cur, k)?;
    }
    match (cur, last) {
        (Val::Obj(m), Val::TStr(_)) => {
            let m = jaq_json::Rc::make_mut(m);
            match lookup_mut(m, last) {
                Some(slot) => Some(std::mem::replace(slot, x)),
                None => {
                    m.insert(last.clone(), x);
                    None
                }
            }
        }
        (Val::Arr(a), _) => {
            let slot = jaq_json::Rc::make_mut(a).get_mut(index(last)?)?;
            Some(std::mem::replace(slot, x))
        }
        _ => None,
    }
}

/// Undoes [`replace`]: puts `old` back at path `ks` of `v`, or removes the key it added.
pub fn restore(v: &mut Val, ks: &[Val], old: Option<Val>) {
    let Some((last, parents)) = ks.split_last() else { return };
    let mut cur = v;
    for k in parents {
        match child_mut(cur, k) {
            Some(c) => cur = c,
            None => return,
        }
    }
    match (cur, old) {
        (Val::Obj(m), None) => {
            jaq_json::Rc::make_mut(m).pop();
        }
        (Val::Obj(m), Some(old)) => {
            if let Some(slot) = lookup_mut(jaq_json::Rc::make_mut(m), last) {
                *slot = old;
            }
        }
        (Val::Arr(a), Some(old)) => {
            if let Some(slot) = index(last).and_then(|i| jaq_json::Rc::make_mut(a).get_mut(i)) {
                *slot = old;
            }
        }
        _ => {}
    }
}

/// The existing child `v[k]` of an object or array, to change in place.
fn child_mut<'a>(v: &'a mut Val, k: &Val) -> Option<&'a mut Val> {
    match (v, k) {
        (Val::Obj(m), Val::TStr(_)) => lookup_mut(jaq_json::Rc::make_mut(m), k),
        (Val::Arr(a), _) => jaq_json::Rc::make_mut(a).get_mut(index(k)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use crate::expr::{Expr, Limits};
    use crate::json::{from_val, to_val};
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn leaf() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(".".to_string()),
            Just(".a".to_string()),
            Just(".b".to_string()),
            Just(".a.b".to_string()),
            Just(".c.a".to_string()),
            Just("$value".to_string()),
            Just("($value | .a)".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            Just("null".to_string()),
            (0u32..5).prop_map(|n| n.to_string()),
            Just("\"x\"".to_string()),
            Just("\"a\\nb\"".to_string()),
        ]
    }

    fn expr() -> impl Strategy<Value = String> {
        leaf().prop_recursive(3, 12, 2, |inner| {
            let ops = prop_oneof![
                Just("+"),
                Just("-"),
                Just("*"),
                Just("/"),
                Just("%"),
                Just("=="),
                Just("!="),
                Just("<"),
                Just("<="),
                Just(">"),
                Just(">="),
                Just("and"),
                Just("or"),
                Just("|")
            ];
            prop_oneof![
                (inner.clone(), ops, inner.clone()).prop_map(|(l, op, r)| format!("({l} {op} {r})")),
                (
                    prop_oneof![Just(".a"), Just(".a.b"), Just(".c")],
                    prop_oneof![Just("="), Just("+="), Just("-="), Just("*=")],
                    inner
                )
                    .prop_map(|(p, op, r)| format!("({p} {op} {r})")),
            ]
        })
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (-3i64..4).prop_map(Value::from),
            Just(json!(1.5)),
            prop_oneof![Just("x"), Just("y"), Just("")].prop_map(Value::from),
        ];
        leaf.prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                (
                    prop::option::of(inner.clone()),
                    prop::option::of(inner.clone()),
                    prop::option::of(inner),
                    any::<bool>()
                )
                    .prop_map(|(a, b, c, big)| {
                        let mut m = serde_json::Map::new();
                        for (k, v) in [("a", a), ("b", b), ("c", c)] {
                            if let Some(v) = v {
                                m.insert(k.into(), v);
                            }
                        }
                        // Past `SCAN` entries, keys are looked up by hash.
                        if big {
                            for i in 0..super::SCAN {
                                m.insert(format!("k{i}"), Value::from(i));
                            }
                        }
                        Value::Object(m)
                    }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn direct_evaluation_agrees_with_jaq(code in expr(), input in value(), v in value()) {
            let e = Expr::compile(&code, &[], Limits::default()).unwrap();
            let fast = e.eval(to_val(&input), to_val(&v)).map(|x| from_val(&x));
            let slow = e.eval_jaq(to_val(&input), to_val(&v)).map(|x| from_val(&x));
            match (&fast, &slow) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "{}", code),
                (Err(a), Err(b)) => prop_assert_eq!(&a.message, &b.message, "{}", code),
                _ => prop_assert!(false, "{code}: direct {fast:?} vs jaq {slow:?}"),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        /// `eval_mut` (in place where it can) gives what `eval` gives, and leaves the data as it
        /// was on an error.
        #[test]
        fn evaluation_in_place_agrees_with_eval(code in expr(), input in value(), v in value()) {
            let e = Expr::compile(&code, &[], Limits::default()).unwrap();
            let expected = e.eval(to_val(&input), to_val(&v)).map(|x| from_val(&x));
            let mut data = to_val(&input);
            let shared = data.clone();
            match (e.eval_mut(&mut data, to_val(&v)), expected) {
                (Ok(()), Ok(x)) => prop_assert_eq!(from_val(&data), x, "{}", code),
                (Err(a), Err(b)) => {
                    prop_assert_eq!(&a.message, &b.message, "{}", code);
                    prop_assert_eq!(from_val(&data), input.clone(), "{}", code);
                }
                (got, want) => prop_assert!(false, "{code}: in place {got:?} vs eval {want:?}"),
            }
            // A copy shared before the change does not see it.
            prop_assert_eq!(from_val(&shared), input, "{}", code);
        }
    }

    /// An assignment in place whose result passes a limit is undone: the data stays as it was,
    /// whether the assignment replaced a field or added one.
    #[test]
    fn assignment_in_place_past_a_limit_is_undone() {
        let small = Limits {
            memory: 400,
            ..Limits::default()
        };
        let long = Value::from("x".repeat(400));
        for code in ["${ .a = $value }", "${ .b = $value }", "${ .c.d = $value }"] {
            let e = Expr::compile(code, &[], small).unwrap();
            let before = json!({"a": 1, "c": {"d": 2}});
            let mut data = to_val(&before);
            let err = e.eval_mut(&mut data, to_val(&long)).unwrap_err();
            assert!(
                err.message.contains("would build more than 400 bytes"),
                "{code}: {}",
                err.message
            );
            assert_eq!(from_val(&data), before, "{code}");
            assert_eq!(
                serde_json::to_string(&from_val(&data)).unwrap(),
                before.to_string(),
                "{code}: key order"
            );
            // A short value fits: the limit stopped the long one.
            e.eval_mut(&mut data, to_val(&json!("y"))).unwrap();
        }
        let deep = (0..crate::json::MAX_DEPTH).fold(Value::Null, |v, _| json!([v]));
        let e = Expr::compile("${ .c.d = $value }", &[], Limits::default()).unwrap();
        let before = json!({"a": 1, "c": {"d": 2}});
        let mut data = to_val(&before);
        let err = e.eval_mut(&mut data, to_val(&deep)).unwrap_err();
        assert!(err.message.contains("nested deeper than"), "{}", err.message);
        assert_eq!(from_val(&data), before);
    }

    #[test]
    fn common_shapes_take_the_direct_path() {
        for code in [
            "${ true }",
            "${ .count >= .limit }",
            "${ .count + 1 }",
            "${ .count = $value }",
            "${ .result += $value }",
            "${ .creditCheck += ($value | .Data) }",
            "${ .a.b == \"Approved\" }",
        ] {
            let text = crate::expr::strip(code);
            let t = jaq_core::load::parse(text, |p| p.term()).unwrap();
            assert!(super::compile(&t).is_some(), "{code}");
        }
    }
}
