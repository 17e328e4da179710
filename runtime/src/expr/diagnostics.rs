//! Compile errors as a definition's author reads them: undefined names (and why a refused one
//! is), parse errors with a snippet of where.

use super::sandbox::{jaq_functions, REFUSED};

pub(super) fn describe_undefined(name: &str, undefined: &jaq_core::compile::Undefined) -> String {
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

pub(super) fn describe_load_errors<P>(code: &str, errs: jaq_core::load::Errors<&str, P>) -> String {
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

pub(super) fn snippet(code: &str, at: &str) -> String {
    if at.is_empty() {
        return "end of expression".into();
    }
    let start = jaq_core::load::span(code, at).start;
    code[start..].chars().take(20).collect()
}

#[cfg(test)]
mod tests {
    use crate::expr::{Expr, Limits};

    #[test]
    fn syntax_errors_are_described() {
        let err = Expr::compile("${ .a | }", &[], Limits::default()).unwrap_err();
        assert!(err.contains("syntax"), "{err}");
        let err = Expr::compile("nosuchfn(1)", &[], Limits::default()).unwrap_err();
        assert!(err.contains("nosuchfn"), "{err}");
    }
}
