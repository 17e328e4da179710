//! The natives we add to jaq's: fuel ticks, gates and size checks the rewrite calls, metered
//! comparisons, paths, regexes and `schedule`.

use super::fuel::{burn, halt, halted};
use super::sandbox::{admitted, jaq_natives, METERED};
use super::size::{
    caught_text, charge, charge_compare, charge_walk, check_new, check_size, checked_math, json_nesting, str_len,
    text_fits, JSON_FACTOR, MATCH_BYTES, MAX_JSON_DEPTH, VAL_BYTES,
};
use super::{metered, Data, Env};
use jaq_core::box_iter::box_once;
use jaq_core::native::{bome, run, v, Fun};
use jaq_core::ops::{Cmp, Math};
use jaq_core::Exn;
use jaq_json::Val;
use std::sync::OnceLock;

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

pub(super) fn natives() -> Vec<Fun<Data>> {
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
