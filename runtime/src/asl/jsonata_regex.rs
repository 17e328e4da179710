//! JSONata's regular expressions (`/.../`, and the patterns `$match` takes as strings), matched in
//! bounded time.
//!
//! `jsonata-rs` compiles regular expressions with `regress`, a backtracking engine: a pattern like
//! `/(a+)+$/`, or one with many quantifiers, takes exponential time on a short text, and a
//! definition could stall a thread for minutes (the fuzz target `asl_execution` found one). So the
//! functions that search with a regular expression (`$contains`, `$split`, `$replace` and
//! `$match`) are registered here over the crate's, and search with `fancy-regex` instead: a
//! pattern without backreferences or lookaround is handed whole to the `regex` crate, which
//! matches in time linear in the text, and one with them backtracks at most [`BACKTRACK_LIMIT`]
//! times, then the evaluation fails with an error naming the pattern. Nothing is timed, so a
//! replay fails the same way.
//!
//! Patterns are written in ECMAScript syntax, as JSONata's are; [`translate`] rewrites one into
//! the crate's syntax with ECMAScript's meaning: `\d` and `\w` are ASCII (`\b` is not: it
//! also counts letters beyond ASCII as word characters), `.` stops at any
//! line terminator, `[^]` is any character, a `{` that starts no quantifier and a lone `]` are
//! literal, `\uXXXX`, `\cX` and `\0` are characters, and backreferences (`\1`, `\k<name>`),
//! named groups and lookaround work. What it cannot express (a lone surrogate, a lookbehind of
//! varying length) is an error when the definition is loaded, for a literal, or when the search
//! runs, for a pattern read from data.
//!
//! The prelude of every expression binds `$contains`, `$split`, `$match` and `$replace` to these
//! (the crate binds its own functions when evaluation starts, over any registered under their
//! names). The functions follow JSONata's reference implementation: a match of no characters is error
//! `D1004`, a `$match` object's `index` is where the match starts (in UTF-16 code units, as in
//! JavaScript), `$replace` substitutes `$0`, `$N` and `$$` in a replacement string, or calls a
//! replacement function with the match object.

use super::jsonata::bad_arg;
use bumpalo::Bump;
use fancy_regex::{Captures, Regex, RegexBuilder};
use jsonata_rs::{ArrayFlags, Error, FunctionContext, Result, Value as JValue};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// How many times a search with backreferences or lookaround may backtrack before it fails
/// (fancy-regex's default; about a second of work at worst).
pub const BACKTRACK_LIMIT: usize = 1_000_000;

/// `.` in ECMAScript: any character but a line terminator.
const DOT: &str = r"[^\n\r\x{2028}\x{2029}]";

/// Compiled patterns kept per thread, keyed by pattern and flags; patterns longer than
/// [`CACHE_PATTERN_BYTES`] are not kept, and the cache is emptied when it holds [`CACHE_ENTRIES`].
const CACHE_ENTRIES: usize = 64;
const CACHE_PATTERN_BYTES: usize = 4096;

thread_local! {
    static CACHE: RefCell<HashMap<(String, bool, bool), Rc<Regex>>> = RefCell::new(HashMap::new());
}

/// Rewrites an ECMAScript pattern (without its slashes and flags) into fancy-regex syntax with the
/// same meaning; the error says what in the pattern has no equivalent.
pub fn translate(pattern: &str) -> std::result::Result<String, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        match c {
            '\\' => i = escape(&chars, i, &mut out, false)?,
            '[' => i = class(&chars, i, &mut out)?,
            '.' => out.push_str(DOT),
            '{' => match quantifier_end(&chars, i) {
                Some(end) => {
                    out.push('{');
                    out.extend(&chars[i..end]);
                    i = end;
                }
                None => out.push_str(r"\{"),
            },
            '}' => out.push_str(r"\}"),
            ']' => out.push_str(r"\]"),
            _ => out.push(c),
        }
    }
    Ok(out)
}

/// Where the `}` of a quantifier `{n}`, `{n,}` or `{n,m}` is, when the text after a `{` (at
/// `start`) is one, one past it.
fn quantifier_end(chars: &[char], start: usize) -> Option<usize> {
    let digits = |from: usize| chars[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut i = start;
    let n = digits(i);
    if n == 0 {
        return None;
    }
    i += n;
    if chars.get(i) == Some(&',') {
        i += 1;
        i += digits(i);
    }
    (chars.get(i) == Some(&'}')).then_some(i + 1)
}

/// Pushes `c` as a literal (escaped where the crate's syntax, in or out of a class, gives it a
/// meaning).
fn literal(out: &mut String, c: char) {
    if r"\.+*?()|[]{}^$#&-~".contains(c) {
        out.push('\\');
    }
    out.push(c);
}

/// Pushes the character with code `code` as an escape.
fn code_point(out: &mut String, code: u32) -> std::result::Result<(), String> {
    if char::from_u32(code).is_none() {
        return Err(format!(
            "the escape for U+{code:04X} is a lone surrogate, which no text can contain"
        ));
    }
    out.push_str(&format!(r"\x{{{code:X}}}"));
    Ok(())
}

/// Hex digits at `at` (exactly `n` of them), as a number.
fn hex(chars: &[char], at: usize, n: usize) -> Option<u32> {
    let digits = chars.get(at..at + n)?;
    digits.iter().try_fold(0u32, |acc, c| Some(acc * 16 + c.to_digit(16)?))
}

/// Translates the escape whose first character (after `\`) is at `i`; returns where the text goes
/// on.
fn escape(chars: &[char], i: usize, out: &mut String, in_class: bool) -> std::result::Result<usize, String> {
    let Some(&c) = chars.get(i) else {
        return Err("the pattern ends with a backslash".into());
    };
    let mut next = i + 1;
    match c {
        'd' if in_class => out.push_str("0-9"),
        'd' => out.push_str("[0-9]"),
        'D' => out.push_str("[^0-9]"),
        'w' if in_class => out.push_str("0-9A-Za-z_"),
        'w' => out.push_str("[0-9A-Za-z_]"),
        'W' => out.push_str("[^0-9A-Za-z_]"),
        's' if in_class => out.push_str(r"\s\x{FEFF}"),
        's' => out.push_str(r"[\s\x{FEFF}]"),
        'S' => out.push_str(r"[^\s\x{FEFF}]"),
        'b' if in_class => out.push_str(r"\x{8}"),
        // fancy-regex has no ASCII word boundary; its `\b` also counts letters beyond ASCII.
        'b' => out.push_str(r"\b"),
        'B' if !in_class => out.push_str(r"\B"),
        't' => out.push_str(r"\t"),
        'n' => out.push_str(r"\n"),
        'r' => out.push_str(r"\r"),
        'v' => out.push_str(r"\x{B}"),
        'f' => out.push_str(r"\x{C}"),
        '0' if !chars.get(next).is_some_and(char::is_ascii_digit) => out.push_str(r"\x{0}"),
        '0'..='9' if in_class => {
            return Err(format!(
                "the escape \\{c} in a character class (a legacy octal escape) is not supported"
            ));
        }
        '1'..='9' => {
            let n = chars[i..].iter().take_while(|c| c.is_ascii_digit()).count();
            out.push('\\');
            out.extend(&chars[i..i + n]);
            next = i + n;
        }
        '0' => return Err("legacy octal escapes (\\0 followed by a digit) are not supported".into()),
        'k' if !in_class && chars.get(next) == Some(&'<') => {
            let Some(close) = chars[next..].iter().position(|&c| c == '>') else {
                return Err("the backreference \\k< has no closing >".into());
            };
            out.push_str(r"\k");
            out.extend(&chars[next..next + close + 1]);
            next += close + 1;
        }
        'x' => match hex(chars, next, 2) {
            Some(code) => {
                code_point(out, code)?;
                next += 2;
            }
            None => out.push('x'),
        },
        'u' => match hex(chars, next, 4) {
            Some(high @ 0xD800..=0xDBFF) => {
                let low = (chars.get(next + 4..next + 6) == Some(&['\\', 'u'])).then(|| hex(chars, next + 6, 4));
                match low.flatten() {
                    Some(low @ 0xDC00..=0xDFFF) => {
                        code_point(out, 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))?;
                        next += 10;
                    }
                    _ => code_point(out, high)?,
                }
            }
            Some(code) => {
                code_point(out, code)?;
                next += 4;
            }
            None => out.push('u'),
        },
        'c' => match chars.get(next) {
            Some(l) if l.is_ascii_alphabetic() => {
                code_point(out, *l as u32 % 32)?;
                next += 1;
            }
            _ => {
                literal(out, '\\');
                out.push('c');
            }
        },
        // Anything else stands for itself (ECMAScript's identity escapes).
        _ => literal(out, c),
    }
    Ok(next)
}

/// Translates the character class whose first character (after `[`) is at `i`; returns where
/// the text goes on.
fn class(chars: &[char], mut i: usize, out: &mut String) -> std::result::Result<usize, String> {
    let negated = chars.get(i) == Some(&'^');
    if negated {
        i += 1;
    }
    if chars.get(i) == Some(&']') {
        // `[]` matches nothing and `[^]` any character.
        out.push_str(if negated {
            r"[\x{0}-\x{10FFFF}]"
        } else {
            r"[^\x{0}-\x{10FFFF}]"
        });
        return Ok(i + 1);
    }
    out.push_str(if negated { "[^" } else { "[" });
    let mut previous = None;
    while let Some(&c) = chars.get(i) {
        i += 1;
        match c {
            ']' => {
                out.push(']');
                return Ok(i);
            }
            '\\' => i = escape(chars, i, out, true)?,
            // A range's `-`, except where a second one would make the crate's `--` (difference).
            '-' if previous != Some('-') => out.push('-'),
            _ => literal(out, c),
        }
        previous = Some(c);
    }
    Err("a character class ([...]) is not closed".into())
}

/// Compiles an ECMAScript pattern with JSONata's flags (`i`, `m`) for searching in bounded time.
pub fn compile(pattern: &str, icase: bool, multiline: bool) -> std::result::Result<Rc<Regex>, String> {
    let key = (pattern.to_string(), icase, multiline);
    if let Some(re) = CACHE.with(|c| c.borrow().get(&key).cloned()) {
        return Ok(re);
    }
    let mut text = String::new();
    if icase {
        text.push_str("(?i)");
    }
    if multiline {
        text.push_str("(?m)");
    }
    text.push_str(&translate(pattern)?);
    let re = RegexBuilder::new(&text)
        .backtrack_limit(BACKTRACK_LIMIT)
        .build()
        .map_err(|e| e.to_string())?;
    let re = Rc::new(re);
    if pattern.len() <= CACHE_PATTERN_BYTES {
        CACHE.with(|c| {
            let mut c = c.borrow_mut();
            if c.len() >= CACHE_ENTRIES {
                c.clear();
            }
            c.insert(key, re.clone());
        });
    }
    Ok(re)
}

/// Checks a regular expression literal of an expression's text when the definition is loaded.
pub fn check_literal(pattern: &str, flags: &str) -> std::result::Result<(), String> {
    compile(pattern, flags.contains('i'), flags.contains('m'))
        .map(|_| ())
        .map_err(|e| format!("the regular expression /{pattern}/{flags} cannot be used: {e}"))
}

/// A regular expression argument, compiled; `None` when the argument is not one.
fn regex_arg(ctx: &FunctionContext, v: &JValue) -> Result<Option<(Rc<Regex>, String)>> {
    let JValue::Regex(literal) = v else {
        return Ok(None);
    };
    let pattern = literal.as_pattern();
    // The crate keeps a literal's flags only inside its compiled form, whose debug output ends
    // with them (`flags: Flags { icase: true, multiline: false, ... }`).
    let debug = format!("{:?}", literal.get_regex());
    let flags = debug.rsplit_once("flags: Flags {").map_or("", |(_, f)| f);
    let (icase, multiline) = (flags.contains("icase: true"), flags.contains("multiline: true"));
    compile_at(ctx, pattern, icase, multiline).map(Some)
}

fn compile_at(ctx: &FunctionContext, pattern: &str, icase: bool, multiline: bool) -> Result<(Rc<Regex>, String)> {
    compile(pattern, icase, multiline)
        .map(|re| (re, pattern.to_string()))
        .map_err(|e| Error::S0303InvalidRegex(ctx.char_index, format!("/{pattern}/: {e}")))
}

/// The matches of `re` in `text` in order, stopping at `limit`; a match of no characters is
/// error `D1004`, as in JSONata, and a search that backtracks too far is an error naming it.
fn matches<'t>(
    ctx: &FunctionContext,
    re: &Regex,
    pattern: &str,
    text: &'t str,
    limit: Option<usize>,
) -> Result<Vec<Captures<'t>>> {
    let mut found = Vec::new();
    for caps in re.captures_iter(text) {
        if limit.is_some_and(|l| found.len() >= l) {
            break;
        }
        let caps = caps.map_err(|e| {
            Error::D3137Error(format!(
                "the regular expression /{pattern}/ could not be searched ({e}; at most {BACKTRACK_LIMIT} steps back)"
            ))
        })?;
        if caps.get(0).is_none_or(|m| m.as_str().is_empty()) {
            return Err(Error::D1004ZeroLengthMatch(ctx.char_index));
        }
        found.push(caps);
    }
    Ok(found)
}

/// The argument at `index` (0-based) as a string; `Ok(None)` when undefined.
fn string_arg<'a>(ctx: &FunctionContext, args: &[&'a JValue<'a>], index: usize) -> Result<Option<&'a JValue<'a>>> {
    match args.get(index).copied() {
        None => Ok(None),
        Some(v) if v.is_undefined() => Ok(None),
        Some(v) if v.is_string() => Ok(Some(v)),
        Some(_) => Err(bad_arg(ctx, index + 1)),
    }
}

/// A limit argument at `index` (0-based): `None` when undefined; `negative` is the error for a
/// negative one.
fn limit_arg(ctx: &FunctionContext, args: &[&JValue], index: usize, negative: Error) -> Result<Option<usize>> {
    match args.get(index).copied() {
        None => Ok(None),
        Some(v) if v.is_undefined() => Ok(None),
        Some(v) if v.is_number() => {
            let n = v.as_f64();
            if n < 0.0 {
                Err(negative)
            } else {
                Ok(Some(n as usize))
            }
        }
        Some(_) => Err(bad_arg(ctx, index + 1)),
    }
}

/// The match object JSONata gives `$match` and a `$replace` function: `match`, `index` (in UTF-16
/// code units; `utf16_start` is the count up to the match) and `groups` (the groups that took part).
fn match_object<'a>(arena: &'a Bump, caps: &Captures, utf16_start: usize) -> &'a JValue<'a> {
    let whole = caps.get(0).map_or("", |m| m.as_str());
    let groups = JValue::array(arena, ArrayFlags::empty());
    for group in caps.iter().skip(1).flatten() {
        groups.push(JValue::string(arena, group.as_str()));
    }
    let object = JValue::object(arena);
    object.insert("match", JValue::string(arena, whole));
    object.insert("index", JValue::number(arena, utf16_start as f64));
    object.insert("groups", groups);
    object
}

/// UTF-16 code units of `text` up to each match's start, counted once along the text.
fn utf16_starts(text: &str, found: &[Captures]) -> Vec<usize> {
    let mut units = 0;
    let mut at = 0;
    found
        .iter()
        .map(|caps| {
            let start = caps.get(0).map_or(at, |m| m.start());
            units += text[at..start].encode_utf16().count();
            at = start;
            units
        })
        .collect()
}

/// `$contains(str, pattern)`.
pub fn fn_contains<'a>(ctx: FunctionContext<'a, '_>, args: &[&'a JValue<'a>]) -> Result<&'a JValue<'a>> {
    let Some(text) = string_arg(&ctx, args, 0)? else {
        return Ok(JValue::undefined());
    };
    let text = text.as_str();
    let pattern = args.get(1).copied().unwrap_or_else(JValue::undefined);
    if let Some((re, source)) = regex_arg(&ctx, pattern)? {
        return Ok(JValue::bool(!matches(&ctx, &re, &source, &text, Some(1))?.is_empty()));
    }
    if !pattern.is_string() {
        return Err(bad_arg(&ctx, 2));
    }
    Ok(JValue::bool(text.contains(&*pattern.as_str())))
}

/// `$split(str, separator[, limit])`.
pub fn fn_split<'a>(ctx: FunctionContext<'a, '_>, args: &[&'a JValue<'a>]) -> Result<&'a JValue<'a>> {
    let Some(text) = string_arg(&ctx, args, 0)? else {
        return Ok(JValue::undefined());
    };
    let text = text.as_str();
    let separator = args.get(1).copied().unwrap_or_else(JValue::undefined);
    let regex = regex_arg(&ctx, separator)?;
    if regex.is_none() && !separator.is_string() {
        return Err(bad_arg(&ctx, 2));
    }
    let limit = limit_arg(&ctx, args, 2, Error::D3020NegativeLimit(ctx.char_index))?;
    let result = JValue::array(ctx.arena, ArrayFlags::empty());
    let mut push = |s: &str| result.push(JValue::string(ctx.arena, s));
    if limit == Some(0) {
        // Nothing, as in JSONata.
    } else if let Some((re, source)) = regex {
        let found = matches(&ctx, &re, &source, &text, limit)?;
        let mut start = 0;
        for caps in &found {
            let m = caps.get(0).expect("group 0 is the match");
            push(&text[start..m.start()]);
            start = m.end();
        }
        if limit.is_none_or(|l| found.len() < l) {
            push(&text[start..]);
        }
    } else {
        let separator = separator.as_str();
        let limit = limit.unwrap_or(usize::MAX);
        if separator.is_empty() {
            let mut buf = [0; 4];
            text.chars().take(limit).for_each(|c| push(c.encode_utf8(&mut buf)));
        } else {
            text.split(&*separator).take(limit).for_each(push);
        }
    }
    Ok(result)
}

/// `$match(str, pattern[, limit])`; a string pattern is compiled as a regular expression.
pub fn fn_match<'a>(ctx: FunctionContext<'a, '_>, args: &[&'a JValue<'a>]) -> Result<&'a JValue<'a>> {
    let Some(text) = string_arg(&ctx, args, 0)? else {
        return Ok(JValue::undefined());
    };
    let text = text.as_str();
    let pattern = args.get(1).copied().unwrap_or_else(JValue::undefined);
    let (re, source) = match regex_arg(&ctx, pattern)? {
        Some(r) => r,
        None if pattern.is_string() => compile_at(&ctx, &pattern.as_str(), false, false)?,
        None if pattern.is_undefined() => return Err(Error::D3010EmptyPattern(ctx.char_index)),
        None => return Err(bad_arg(&ctx, 2)),
    };
    let limit = limit_arg(&ctx, args, 2, bad_arg(&ctx, 3))?;
    let found = matches(&ctx, &re, &source, &text, limit)?;
    let result = JValue::array_with_capacity(ctx.arena, found.len(), ArrayFlags::empty());
    for (caps, start) in found.iter().zip(utf16_starts(&text, &found)) {
        result.push(match_object(ctx.arena, caps, start));
    }
    Ok(result)
}

/// `$replace(str, pattern, replacement[, limit])`.
pub fn fn_replace<'a>(ctx: FunctionContext<'a, '_>, args: &[&'a JValue<'a>]) -> Result<&'a JValue<'a>> {
    let Some(text) = string_arg(&ctx, args, 0)? else {
        return Ok(JValue::undefined());
    };
    let text = text.as_str();
    let pattern = args.get(1).copied().unwrap_or_else(JValue::undefined);
    if pattern.is_string() && pattern.as_str().is_empty() {
        return Err(Error::D3010EmptyPattern(ctx.char_index));
    }
    let replacement = args.get(2).copied().unwrap_or_else(JValue::undefined);
    let limit = limit_arg(&ctx, args, 3, Error::D3011NegativeLimit(ctx.char_index))?;
    let Some((re, source)) = regex_arg(&ctx, pattern)? else {
        if !pattern.is_string() {
            return Err(bad_arg(&ctx, 2));
        }
        if !replacement.is_string() {
            return Err(bad_arg(&ctx, 3));
        }
        let (pattern, replacement) = (pattern.as_str(), replacement.as_str());
        let replaced = match limit {
            Some(n) => text.replacen(&*pattern, &replacement, n),
            None => text.replace(&*pattern, &replacement),
        };
        return Ok(JValue::string(ctx.arena, &replaced));
    };
    if !replacement.is_string() && !replacement.is_function() {
        return Err(bad_arg(&ctx, 3));
    }
    let found = matches(&ctx, &re, &source, &text, limit)?;
    let mut result = String::with_capacity(text.len());
    let mut position = 0;
    for (caps, start) in found.iter().zip(utf16_starts(&text, &found)) {
        let m = caps.get(0).expect("group 0 is the match");
        result.push_str(&text[position..m.start()]);
        if replacement.is_string() {
            substitute(&replacement.as_str(), caps, &mut result);
        } else {
            let object = match_object(ctx.arena, caps, start);
            let value = ctx.trampoline_evaluate_value(ctx.evaluate_function(replacement, &[object])?)?;
            if !value.is_string() {
                return Err(Error::D3012InvalidReplacementType(ctx.char_index));
            }
            result.push_str(&value.as_str());
        }
        position = m.end();
    }
    result.push_str(&text[position..]);
    Ok(JValue::string(ctx.arena, &result))
}

/// Appends `replacement` with JSONata's substitutions for the match `caps`: `$$` is `$`, `$0` the
/// match, `$N` group N (nothing when it did not take part). N has as many digits as the number of
/// groups, one fewer when that names no group; a `$` before anything else stays.
fn substitute(replacement: &str, caps: &Captures, out: &mut String) {
    let groups = caps.len() - 1;
    let max_digits = if groups == 0 { 1 } else { groups.to_string().len() };
    let mut rest = replacement;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(r) = rest.strip_prefix('$') {
            out.push('$');
            rest = r;
            continue;
        }
        if let Some(r) = rest.strip_prefix('0') {
            out.push_str(caps.get(0).map_or("", |m| m.as_str()));
            rest = r;
            continue;
        }
        let digits = rest.bytes().take(max_digits).take_while(u8::is_ascii_digit).count();
        let mut n: usize = rest[..digits].parse().unwrap_or(0);
        if digits == 0 {
            out.push('$');
            continue;
        }
        if max_digits > 1 && n > groups && digits > 1 {
            n = rest[..digits - 1].parse().unwrap_or(0);
        }
        if n >= 1 {
            out.push_str(caps.get(n).map_or("", |m| m.as_str()));
        }
        // JSONata steps over the digits of the number it read (`$01` is group 1, then `1`).
        rest = &rest[n.to_string().len()..];
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(pattern: &str, text: &str) -> Option<String> {
        compile(pattern, false, false)
            .unwrap()
            .find(text)
            .unwrap()
            .map(|m| m.as_str().to_string())
    }

    #[test]
    fn ecmascript_meanings() {
        assert_eq!(find(r"\d+", "x٣42"), Some("42".into()), "\\d is ASCII");
        assert_eq!(find(r"\w+", "éab_1"), Some("ab_1".into()), "\\w is ASCII");
        assert_eq!(find(r"a.c", "a\rc a-c"), Some("a-c".into()), ". stops at \\r");
        assert_eq!(find(r"[^]+", "a\nb"), Some("a\nb".into()));
        assert_eq!(find(r"x[]", "x"), None);
        assert_eq!(
            find(r"a{,2}", "a{,2}"),
            Some("a{,2}".into()),
            "{{ that starts no quantifier"
        );
        assert_eq!(find(r"a{2}", "aaa"), Some("aa".into()));
        assert_eq!(find(r"]", "a]"), Some("]".into()));
        assert_eq!(find(r"\u0041\x42\cJ", "AB\n"), Some("AB\n".into()));
        assert_eq!(find(r"\uD83D\uDE00", "😀"), Some("😀".into()));
        assert_eq!(find(r"(a)\1", "xaa"), Some("aa".into()));
        assert_eq!(find(r"(?<q>['])x\k<q>", "'x'"), Some("'x'".into()));
        assert_eq!(find(r"a(?=b)", "acab"), Some("a".into()));
        assert_eq!(find(r"[\w-]+", "a-b c"), Some("a-b".into()));
        assert_eq!(find(r"[+--]+", "+,-"), Some("+,-".into()), "a range ending at -");
        assert_eq!(
            find(r"[a&&b~~c[]+", "&~[ab"),
            Some("&~[ab".into()),
            "literal in a class"
        );
        assert_eq!(find(r"\bb\B", "ab bc"), Some("b".into()));
        assert_eq!(find(r"\/\$", "/$"), Some("/$".into()));
        assert!(compile("[a", false, false).unwrap_err().contains("not closed"));
        assert!(compile(r"\uD800", false, false).unwrap_err().contains("lone surrogate"));
        assert!(compile("x", true, false).unwrap().is_match("X").unwrap());
        assert!(compile("^b", false, true).unwrap().is_match("a\nb").unwrap());
    }

    #[test]
    fn catastrophic_patterns_are_linear_or_bounded() {
        // Exponential for a backtracking engine; linear here.
        let text = format!("{}!", "a".repeat(50_000));
        assert!(!compile("^(a+)+$", false, false).unwrap().is_match(&text).unwrap());
        let many = "a*".repeat(40) + "b";
        assert!(!compile(&many, false, false).unwrap().is_match(&text).unwrap());
        // With a backreference it backtracks, and stops at the limit with an error.
        let err = compile(r"^(a+)+\1b$", false, false)
            .unwrap()
            .is_match(&text[..40])
            .unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
    }

    #[test]
    fn substitutions() {
        let re = compile("(a)(b)?", false, false).unwrap();
        let caps = re.captures("ab").unwrap().unwrap();
        let sub = |r: &str| {
            let mut out = String::new();
            substitute(r, &caps, &mut out);
            out
        };
        assert_eq!(sub("[$0|$1|$2|$$|$x|$]"), "[ab|a|b|$|$x|$]");
        assert_eq!(sub("$3"), "");
        let re = compile("(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)(k)", false, false).unwrap();
        let caps = re.captures("abcdefghijk").unwrap().unwrap();
        let mut out = String::new();
        substitute("$11|$12|$01", &caps, &mut out);
        assert_eq!(out, "k|a2|abcdefghijk1");
    }
}
