//! The sandbox: the allow-list of jq functions a definition may call, the names refused with
//! their reasons, our own definitions (`sandbox.jq`), and which of jaq's natives and standard
//! definitions are admitted, compiled only as far as an expression reaches them.

use super::fuel::fuel_def;
use super::Data;
use jaq_core::load::parse::{BinaryOp, Def, Pattern, Term};
use jaq_core::native::Fun;
use jaq_core::path::{Part, Path};
use std::sync::OnceLock;

/// Names refused by the sandbox, with the reason shown to the user.
pub(super) const REFUSED: &[(&str, &str)] = &[
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
pub(super) fn allowed(name: &str, arity: usize) -> bool {
    ALLOWED.binary_search(&(name, arity)).is_ok()
}

/// Definitions we add: sandboxed replacements, and `range/3` as a recursion that burns fuel.
pub(super) const OUR_DEFS: &str = include_str!("sandbox.jq");

/// Every native jaq provides, `matches` and the like renamed (our definitions wrap them).
pub(super) fn jaq_natives() -> impl Iterator<Item = Fun<Data>> {
    jaq_core::funs::<Data>()
        .chain(jaq_std::funs::<Data>())
        .chain(jaq_json::funs::<Data>())
        .map(|(name, args, f)| match RENAMED.iter().find(|(n, _)| *n == name) {
            Some((_, ours)) => (*ours, args, f),
            None => (name, args, f),
        })
}

/// jaq natives replaced by our own (`metered`), which give the same results and pay for their work.
pub(super) const METERED: &[(&str, usize)] = &[("contains", 1), ("indices", 1)];

/// jaq natives our definitions wrap, under the names the wrappers call.
pub(super) const RENAMED: &[(&str, &str)] = &[
    ("matches", "__matches"),
    ("split_matches", "__split_matches"),
    ("split_", "__split_"),
];

/// The natives the sandbox takes from `natives`: those on [`ALLOWED`] that [`OUR_DEFS`] does not
/// replace, and the ones [`RENAMED`] names.
#[cfg(test)]
pub(super) fn admitted_natives(natives: impl Iterator<Item = Fun<Data>>) -> impl Iterator<Item = Fun<Data>> {
    natives.filter(|(name, args, _)| admitted(name, args.len()))
}

/// True when the sandbox takes jaq's native `name/arity` (see [`admitted_natives`]).
pub(super) fn admitted(name: &str, arity: usize) -> bool {
    RENAMED.iter().any(|(_, ours)| *ours == name) || (allowed(name, arity) && !ours(name, arity))
}

/// Our definitions, parsed once.
pub(super) fn our_defs() -> &'static [Def<&'static str>] {
    static OURS: OnceLock<Vec<Def<&'static str>>> = OnceLock::new();
    OURS.get_or_init(|| jaq_core::load::parse(OUR_DEFS, |p| p.defs()).expect("our definitions parse"))
}

/// True when [`OUR_DEFS`] defines `name/arity` (replacing jaq's).
pub(super) fn ours(name: &str, arity: usize) -> bool {
    our_defs().iter().any(|d| d.name == name && d.args.len() == arity)
}

/// Every `(name, arity)` jaq provides, natives and standard definitions, allowed or not.
pub(super) fn jaq_functions() -> &'static std::collections::BTreeSet<(&'static str, usize)> {
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
pub(super) fn jaq_defs() -> impl Iterator<Item = Def<&'static str>> {
    jaq_core::defs().chain(jaq_std::defs()).chain(jaq_json::defs())
}

/// The standard definitions, each body prefixed with a fuel tick. Parsed once per process.
pub(super) fn prelude() -> &'static [Def<&'static str>] {
    static PRELUDE: OnceLock<Vec<Def<&'static str>>> = OnceLock::new();
    PRELUDE.get_or_init(|| admitted_defs(jaq_defs()).into_iter().map(fuel_def).collect())
}

/// Which prelude definitions each prelude definition may call, built once with the prelude.
pub(super) struct PreludeIndex {
    /// For the prelude definition at each index, the indices of the prelude definitions named in its
    /// body.
    deps: Vec<Vec<usize>>,
    /// The indices of the prelude definitions of each name (all arities).
    by_name: std::collections::HashMap<&'static str, Vec<usize>>,
}

pub(super) fn prelude_index() -> &'static PreludeIndex {
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
pub(super) fn reachable<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<usize> {
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
pub(super) fn calls<'a>(t: &Term<&'a str>, out: &mut Vec<&'a str>) {
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

pub(super) fn pattern_calls<'a>(p: &Pattern<&'a str>, out: &mut Vec<&'a str>) {
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
pub(super) fn reserved_name<'a>(t: &Term<&'a str>) -> Option<&'a str> {
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
pub(super) fn refuse_reserved(t: &Term<&str>) -> Result<(), String> {
    match reserved_name(t) {
        Some(name) => Err(format!(
            "`{name}` is reserved: names that start with `__` belong to sm4c's own jq helpers; rename it"
        )),
        None => Ok(()),
    }
}

pub(super) fn reserved_in_pattern<'a>(p: &Pattern<&'a str>, ours: &impl Fn(&&'a str) -> bool) -> Option<&'a str> {
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
pub(super) fn admitted_defs(standard: impl Iterator<Item = Def<&'static str>>) -> Vec<Def<&'static str>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::natives::natives;
    use crate::expr::sugar::ExprFunction;
    use crate::expr::{Expr, Limits};
    use crate::json::to_val;
    use jaq_core::native::{bome, run, v};
    use jaq_json::Val;
    use serde_json::json;

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
}
