//! The notation around jq: the `${ }` wrapper and `fn:name` calls of expression functions
//! (`type: expression`), rewritten into generated definitions in dependency order.

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

/// Rewrites `fn:name` into calls of generated definitions, returning the indices used.
/// Text inside string literals is left alone (but `\(...)` interpolations are code); `fn:` not
/// followed by a name (as in the object `{fn: 1}`) is ordinary jq.
pub(super) fn rewrite_fn_calls(code: &str, functions: &[ExprFunction]) -> Result<(String, Vec<usize>), String> {
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

pub(super) fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Orders the expression functions used (and those they use) so each is defined before use.
pub(super) fn fn_order(used: &[usize], functions: &[ExprFunction]) -> Result<Vec<usize>, String> {
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
    use crate::expr::{Expr, Limits};
    use serde_json::json;

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
}
