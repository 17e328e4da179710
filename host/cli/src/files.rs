//! Reading what users hand the CLI: definitions, inputs, mocks, events and subflow folders,
//! with messages that name the file and the place (JSON pointer or line number).

use serde_json::Value;
pub use sm4c_invoke::files::{ferr, resolve_uri, FileError};
use sm4c_runtime::{load, Expr, Limits, LoadOptions, Machine};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Reads a JSON document.
pub fn read_json(path: &Path) -> Result<Value, FileError> {
    let text = std::fs::read_to_string(path).map_err(|e| ferr(path, "/", format!("cannot read: {e}")))?;
    serde_json::from_str(&text).map_err(|e| {
        ferr(
            path,
            "/",
            format!(
                "not valid JSON: {} at line {} column {}",
                strip_position(&e),
                e.line(),
                e.column()
            ),
        )
    })
}

fn strip_position(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.find(" at line ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// The name of an ASL definition file: its name up to the first `.` (`order.asl.json` is `order`).
pub fn asl_name(path: &Path) -> String {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state-machine");
    name.split('.')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or("state-machine")
        .to_string()
}

/// Loads and validates a definition; `events`/`functions`/`retries` URIs resolve relative to it.
pub fn load_definition(path: &Path, limits: Limits) -> Result<Machine, Vec<FileError>> {
    let mut doc = read_json(path).map_err(|e| vec![e])?;
    // An ASL definition is named after its file (`order.asl.json` is `order`).
    if sm4c_runtime::asl::model::is_asl(&doc) {
        if let Some(o) = doc.as_object_mut() {
            if !o.contains_key(sm4c_runtime::asl::model::ID_KEY) {
                o.insert(sm4c_runtime::asl::model::ID_KEY.into(), Value::String(asl_name(path)));
            }
        }
    }
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut resolve = |uri: &str| -> Result<Value, String> {
        let target = resolve_uri(&dir, uri)?;
        let text = sm4c_invoke::files::read_text(&target)?;
        serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON: {e}", target.display()))
    };
    load(&doc, &mut resolve, LoadOptions { limits }).map_err(|errs| {
        errs.into_iter()
            .map(|e| {
                ferr(
                    path,
                    if e.pointer.is_empty() {
                        "/".to_string()
                    } else {
                        e.pointer
                    },
                    e.message,
                )
            })
            .collect()
    })
}

/// Reads a JSON input file.
pub fn load_input(path: &Path) -> Result<Value, FileError> {
    read_json(path)
}

/// Reads a mock file: a JSON object mapping function names to jq expressions.
pub fn load_mocks(path: &Path, limits: Limits) -> Result<HashMap<String, Expr>, Vec<FileError>> {
    let doc = read_json(path).map_err(|e| vec![e])?;
    let Value::Object(map) = doc else {
        return Err(vec![ferr(
            path,
            "/",
            "a mock file must be a JSON object mapping function names to jq expressions",
        )]);
    };
    let mut out = HashMap::new();
    let mut errs = Vec::new();
    for (name, v) in map {
        let pointer = format!("/{}", name.replace('~', "~0").replace('/', "~1"));
        match v.as_str() {
            Some(code) => match Expr::compile(code, &[], limits) {
                Ok(e) => {
                    out.insert(name, e);
                }
                Err(msg) => errs.push(ferr(path, pointer, format!("invalid jq expression {code:?}: {msg}"))),
            },
            None => errs.push(ferr(path, pointer, "must be a jq expression string")),
        }
    }
    if errs.is_empty() {
        Ok(out)
    } else {
        Err(errs)
    }
}

/// Checks that a JSON value is a CloudEvent in JSON structured format.
pub fn check_cloudevent(v: &Value) -> Result<(), String> {
    let Some(o) = v.as_object() else {
        return Err("not a CloudEvent: expected a JSON object".into());
    };
    for attr in ["specversion", "id", "source", "type"] {
        match o.get(attr) {
            Some(Value::String(s)) if !s.is_empty() => {}
            Some(_) => return Err(format!("not a CloudEvent: `{attr}` must be a non-empty string")),
            None => return Err(format!("not a CloudEvent: missing required attribute `{attr}`")),
        }
    }
    if o.get("specversion").and_then(Value::as_str) != Some("1.0") {
        return Err("not a CloudEvent: `specversion` must be \"1.0\"".into());
    }
    for k in o.keys() {
        if k != "data_base64" && !k.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()) {
            return Err(format!(
                "not a CloudEvent: attribute name {k:?} must be lower-case letters and digits"
            ));
        }
    }
    Ok(())
}

/// Reads NDJSON CloudEvents, one per line; blank lines are skipped.
pub fn load_events(path: &Path) -> Result<Vec<Value>, Vec<FileError>> {
    let text = std::fs::read_to_string(path).map_err(|e| vec![ferr(path, "/", format!("cannot read: {e}"))])?;
    let mut out = Vec::new();
    let mut errs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let place = format!("line {}", i + 1);
        match serde_json::from_str::<Value>(line) {
            Ok(v) => match check_cloudevent(&v) {
                Ok(()) => out.push(v),
                Err(m) => errs.push(ferr(path, place, m)),
            },
            Err(e) => errs.push(ferr(
                path,
                place,
                format!("not valid JSON: {} at column {}", strip_position(&e), e.column()),
            )),
        }
    }
    if errs.is_empty() {
        Ok(out)
    } else {
        Err(errs)
    }
}

/// The `*.json` files of a folder, sorted by name.
pub fn json_files(dir: &Path) -> Result<Vec<PathBuf>, FileError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ferr(dir, "/", format!("cannot read folder: {e}")))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    Ok(paths)
}

/// Loads every `*.json` definition in a folder, indexed by `id`.
pub fn load_folder(dir: &Path, limits: Limits) -> Result<HashMap<String, Arc<Machine>>, Vec<FileError>> {
    let paths = json_files(dir).map_err(|e| vec![e])?;
    let mut out = HashMap::new();
    let mut errs = Vec::new();
    for p in paths {
        match load_definition(&p, limits) {
            Ok(m) => {
                if out.contains_key(&m.id) {
                    errs.push(ferr(
                        &p,
                        "/id",
                        format!("another definition in {} has id {:?}", dir.display(), m.id),
                    ));
                } else {
                    out.insert(m.id.clone(), Arc::new(m));
                }
            }
            Err(e) => errs.extend(e),
        }
    }
    if errs.is_empty() {
        Ok(out)
    } else {
        Err(errs)
    }
}

/// Reports `invokeSubflow` targets missing from `known`.
pub fn check_subflows(file: &Path, m: &Machine, known: &HashMap<String, Arc<Machine>>) -> Vec<FileError> {
    m.subflow_refs()
        .filter(|(_, id)| !known.contains_key(*id) && *id != m.id)
        .map(|(pointer, id)| {
            ferr(
                file,
                format!("{pointer}/subflowName"),
                format!("unknown subflow {id:?}: no definition with that id"),
            )
        })
        .collect()
}
