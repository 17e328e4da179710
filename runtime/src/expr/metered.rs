//! `contains` and `indices`, whose work grows with the product of their operands' sizes, with the
//! comparisons they make paid in fuel.
//!
//! jaq's own compare every element of one array with the elements of the other (`contains`, at every
//! level of nesting) or every window of the input with the whole key (`indices` of strings and
//! arrays): `[range(30000)] | contains(reverse)` took 4 s, and `indices` of 2 MB of one letter in
//! 4 MB of it would make some four million million byte comparisons, all inside one native call
//! that fuel never saw, while the host's deciding loop waited. These give the same results in the same order (jaq's code is the model),
//! counting the comparisons as they go: every [`COMPARISONS_PER_STEP`] cost one unit of fuel, so
//! the default fuel allows some 64 million, a fraction of a second.

use super::fuel::burn_n;
use super::size::{charge, VAL_BYTES};
use super::Env;
use bstr::ByteSlice;
use jaq_json::Val;

/// How many comparisons (of two values, each value inside two arrays or objects compared counting as
/// one, or of two 64-byte pieces of strings) one unit of fuel pays for: a step of a jq evaluation
/// costs about as much as this many.
const COMPARISONS_PER_STEP: u64 = 64;

/// Counts comparisons, paying for them in fuel as they add up.
struct Meter<'e, 'a> {
    env: &'e Env<'a>,
    count: u64,
}

impl Meter<'_, '_> {
    /// One comparison; every [`COMPARISONS_PER_STEP`]th burns a unit of fuel.
    fn pay(&mut self) -> Result<(), i32> {
        self.count += 1;
        if self.count == COMPARISONS_PER_STEP {
            self.count = 0;
            burn_n(self.env, 1)?;
        }
        Ok(())
    }
}

/// `l | contains(r)`, as jaq-json's `Val::contains`: a substring, every element of `r` contained in
/// some element of `l`, every entry of `r` contained in `l`'s under the same key, or equality.
pub(super) fn contains(env: &Env, l: &Val, r: &Val) -> Result<bool, i32> {
    contains_in(&mut Meter { env, count: 0 }, l, r)
}

fn contains_in(m: &mut Meter, l: &Val, r: &Val) -> Result<bool, i32> {
    m.pay()?;
    Ok(match (l, r) {
        // A substring search is linear: it costs no more than the comparison that started it.
        (Val::BStr(l), Val::BStr(r)) | (Val::TStr(l), Val::TStr(r)) => l.contains_str(&r[..]),
        (Val::Arr(l), Val::Arr(r)) => {
            for r in r.iter() {
                let mut found = false;
                for l in l.iter() {
                    if contains_in(m, l, r)? {
                        found = true;
                        break;
                    }
                }
                if !found {
                    return Ok(false);
                }
            }
            true
        }
        (Val::Obj(l), Val::Obj(r)) => {
            for (k, r) in r.iter() {
                match l.get(k) {
                    Some(l) if contains_in(m, l, r)? => {}
                    _ => return Ok(false),
                }
            }
            true
        }
        _ => l == r,
    })
}

/// `a == b` as jaq-json's `Val` compares, every value compared paid for: jaq's own `==` of two arrays
/// or objects walks both within one comparison, and two values built in a few steps can share their
/// parts and stand for more JSON than the host has memory. Arrays and objects that are one value
/// are equal at once, as the standard library's `Rc` and `Arc` equality makes them.
fn same(m: &mut Meter, a: &Val, b: &Val) -> Result<bool, i32> {
    m.pay()?;
    Ok(match (a, b) {
        (Val::Arr(x), Val::Arr(y)) => {
            if core::ptr::eq(&**x, &**y) {
                return Ok(true);
            }
            if x.len() != y.len() {
                return Ok(false);
            }
            for (a, b) in x.iter().zip(y.iter()) {
                if !same(m, a, b)? {
                    return Ok(false);
                }
            }
            true
        }
        (Val::Obj(x), Val::Obj(y)) => {
            if core::ptr::eq(&**x, &**y) {
                return Ok(true);
            }
            if x.len() != y.len() {
                return Ok(false);
            }
            for (k, a) in x.iter() {
                match y.get(k) {
                    Some(b) if same(m, a, b)? => {}
                    _ => return Ok(false),
                }
            }
            true
        }
        (Val::BStr(x) | Val::TStr(x), Val::BStr(y) | Val::TStr(y)) => x.len() == y.len() && same_bytes(m, x, y)?,
        _ => a == b,
    })
}

/// Whether `window` equals `key`, compared in pieces of 64 bytes, each one paid for.
fn same_bytes(m: &mut Meter, window: &[u8], key: &[u8]) -> Result<bool, i32> {
    for (a, b) in window.chunks(64).zip(key.chunks(64)) {
        m.pay()?;
        if a != b {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `x | indices(y)`, as jaq-json's `Val::indices`: where `y` starts in the string `x` (in characters
/// for text, bytes for byte strings), where the array `y` occurs in the array `x`, or where an
/// element of the array `x` equals `y`; `None` for anything else (jaq's "cannot index" error).
/// Every index found is charged like an array element, before the array holds it.
pub(super) fn indices(env: &Env, x: &Val, y: &Val) -> Result<Option<Vec<usize>>, i32> {
    let m = &mut Meter { env, count: 0 };
    let mut out = Vec::new();
    let mut found = |i: usize| -> Result<(), i32> {
        charge(env, VAL_BYTES)?;
        out.push(i);
        Ok(())
    };
    match (x, y) {
        (Val::BStr(_), Val::BStr(y)) | (Val::TStr(_), Val::TStr(y)) if y.is_empty() => {}
        (Val::TStr(x), Val::TStr(y)) => {
            for (i, (start, _, _)) in x.char_indices().enumerate() {
                let Some(window) = x.get(start..start + y.len()) else {
                    break;
                };
                if same_bytes(m, window, y)? {
                    found(i)?;
                }
            }
        }
        (Val::BStr(x), Val::BStr(y)) => {
            for (i, window) in x.windows(y.len()).enumerate() {
                if same_bytes(m, window, y)? {
                    found(i)?;
                }
            }
        }
        (Val::Arr(_), Val::Arr(y)) if y.is_empty() => {}
        (Val::Arr(x), Val::Arr(y)) => {
            for (i, window) in x.windows(y.len()).enumerate() {
                let mut whole = true;
                for (a, b) in window.iter().zip(y.iter()) {
                    if !same(m, a, b)? {
                        whole = false;
                        break;
                    }
                }
                if whole {
                    found(i)?;
                }
            }
        }
        (Val::Arr(x), y) => {
            for (i, a) in x.iter().enumerate() {
                if same(m, a, y)? {
                    found(i)?;
                }
            }
        }
        _ => return Ok(None),
    }
    Ok(Some(out))
}
