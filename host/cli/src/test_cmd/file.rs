//! Test files (`*.test.json`, `*.test.yaml`): reading them, and checking every field with a
//! message that names the file, the JSON pointer and the problem.

use crate::files::{self, ferr, FileError};
use serde_json::{Map, Value};
use sm4c_runtime::engine::Scheduled;
use sm4c_runtime::{Expr, Limits, Machine};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The keys a test file may have.
const FILE_KEYS: [&str; 4] = ["definition", "mocks", "subflows", "tests"];
/// The keys a test may have.
const TEST_KEYS: [&str; 9] = [
    "name",
    "input",
    "mocks",
    "events",
    "subflows",
    "virtualTime",
    "nominalTime",
    "schedule",
    "expect",
];
/// The keys of `expect`.
pub const EXPECT_KEYS: [&str; 6] = ["status", "states", "data", "sent", "error", "calls"];
/// The statuses an instance can end a test in, as `expect.status` names them (ASL's names too).
const STATUSES: [&str; 12] = [
    "completed",
    "failed",
    "timedOut",
    "cancelled",
    "waiting",
    "running",
    "SUCCEEDED",
    "FAILED",
    "TIMED_OUT",
    "ABORTED",
    "RUNNING",
    "created",
];

/// A test file, read and checked.
pub struct TestFile {
    /// The file, as found.
    pub path: PathBuf,
    /// The definition it tests.
    pub definition_path: PathBuf,
    /// The definition, loaded and validated.
    pub machine: Arc<Machine>,
    /// Its tests, in order.
    pub tests: Vec<TestCase>,
}

/// One test of a file.
pub struct TestCase {
    /// `name`.
    pub name: String,
    /// `input` (default `{}`).
    pub input: Value,
    /// The file's mocks with the test's over them, by function name (ASL: Resource or state name).
    pub mocks: HashMap<String, Mock>,
    /// `events`: CloudEvents in the inbox before the first state runs.
    pub events: Vec<Value>,
    /// The definitions of the `subflows` folder, by id.
    pub subflows: HashMap<String, Arc<Machine>>,
    /// The `subflows` folder.
    pub subflows_dir: Option<PathBuf>,
    /// `virtualTime` (default true).
    pub virtual_time: bool,
    /// `nominalTime` and `schedule`: run as that schedule's run for that nominal time.
    pub scheduled: Option<Scheduled>,
    /// `expect`, each key as written.
    pub expect: Map<String, Value>,
}

/// A function's mock.
#[derive(Clone)]
pub enum Mock {
    /// A jq program over the call's arguments, as `sm4c run --mock` takes it.
    Jq(Expr),
    /// One outcome per call, in order.
    Sequence(Vec<MockOutcome>),
}

/// One call's outcome in a mock's list.
#[derive(Clone, Debug, PartialEq)]
pub enum MockOutcome {
    /// `{"result": VALUE}`: the call returns VALUE.
    Result(Value),
    /// `{"error": {"kind", "message", "details"}}`: the call fails. For an ASL Task, `kind` is
    /// the error name (default `States.TaskFailed`) and `message` the cause.
    Error {
        /// `kind` (SM4C default `functionError`).
        kind: Option<String>,
        /// `message`.
        message: String,
        /// `details`.
        details: Option<Value>,
    },
}

/// Escapes a key for a JSON pointer.
pub fn esc(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Reads a JSON or YAML document (YAML for `.yaml` and `.yml` files) as JSON.
pub fn read_doc(path: &Path) -> Result<Value, FileError> {
    let yaml = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
    if !yaml {
        return files::read_json(path);
    }
    let text = std::fs::read_to_string(path).map_err(|e| ferr(path, "/", format!("cannot read: {e}")))?;
    serde_yaml_ng::from_str::<Value>(&text).map_err(|e| {
        let at = e
            .location()
            .map(|l| format!(" at line {} column {}", l.line(), l.column()))
            .unwrap_or_default();
        let msg = e.to_string();
        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
        ferr(path, "/", format!("not valid YAML: {msg}{at}"))
    })
}

/// Reads and checks a test file and the definition and subflows it names.
pub fn load(path: &Path, limits: Limits) -> Result<TestFile, Vec<FileError>> {
    let doc = read_doc(path).map_err(|e| vec![e])?;
    let mut errs = Vec::new();
    let Some(obj) = doc.as_object() else {
        return Err(vec![ferr(
            path,
            "/",
            "a test file must be an object with `definition` and `tests`",
        )]);
    };
    unknown_keys(path, "", obj, &FILE_KEYS, &mut errs);
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let definition_path = match obj.get("definition") {
        Some(Value::String(d)) if !d.is_empty() => dir.join(d),
        Some(_) => {
            errs.push(ferr(
                path,
                "/definition",
                "must be the definition's path, relative to the test file",
            ));
            return Err(errs);
        }
        None => {
            errs.push(ferr(
                path,
                "/definition",
                "missing: the definition's path, relative to the test file",
            ));
            return Err(errs);
        }
    };
    let machine = match files::load_definition(&definition_path, limits) {
        Ok(m) => Some(Arc::new(m)),
        Err(e) => {
            if !definition_path.exists() {
                errs.push(ferr(
                    path,
                    "/definition",
                    format!("{} does not exist", definition_path.display()),
                ));
            } else {
                errs.extend(e);
            }
            None
        }
    };
    let file_mocks = match obj.get("mocks") {
        Some(v) => mocks(path, "/mocks", v, limits, &mut errs),
        None => HashMap::new(),
    };
    let file_subflows = obj.get("subflows");
    if let Some(v) = file_subflows {
        if !v.is_string() {
            errs.push(ferr(
                path,
                "/subflows",
                "must be a folder path, relative to the test file",
            ));
        }
    }
    let mut folders: BTreeMap<Option<String>, HashMap<String, Arc<Machine>>> = BTreeMap::new();
    let mut tests = Vec::new();
    match obj.get("tests") {
        Some(Value::Array(list)) if !list.is_empty() => {
            let mut names = HashMap::new();
            for (i, t) in list.iter().enumerate() {
                let at = format!("/tests/{i}");
                let Some(t) = t.as_object() else {
                    errs.push(ferr(path, &at, "a test must be an object with `name` and `expect`"));
                    continue;
                };
                unknown_keys(path, &at, t, &TEST_KEYS, &mut errs);
                let name = match t.get("name") {
                    Some(Value::String(n)) if !n.trim().is_empty() => n.clone(),
                    _ => {
                        errs.push(ferr(path, format!("{at}/name"), "must be a non-empty string"));
                        String::new()
                    }
                };
                if !name.is_empty() {
                    if let Some(first) = names.insert(name.clone(), i) {
                        errs.push(ferr(
                            path,
                            format!("{at}/name"),
                            format!("test {name:?} is already the name of /tests/{first}"),
                        ));
                    }
                }
                let mut mocks_here = file_mocks.clone();
                if let Some(v) = t.get("mocks") {
                    mocks_here.extend(mocks(path, &format!("{at}/mocks"), v, limits, &mut errs));
                }
                let events = match t.get("events") {
                    None => Vec::new(),
                    Some(Value::Array(evs)) => {
                        for (j, e) in evs.iter().enumerate() {
                            if let Err(m) = files::check_cloudevent(e) {
                                errs.push(ferr(path, format!("{at}/events/{j}"), m));
                            }
                        }
                        evs.clone()
                    }
                    Some(_) => {
                        errs.push(ferr(
                            path,
                            format!("{at}/events"),
                            "must be a list of CloudEvents (JSON structured format)",
                        ));
                        Vec::new()
                    }
                };
                let folder = match t.get("subflows").or(file_subflows) {
                    None => None,
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(_) => {
                        if t.contains_key("subflows") {
                            errs.push(ferr(
                                path,
                                format!("{at}/subflows"),
                                "must be a folder path, relative to the test file",
                            ));
                        }
                        None
                    }
                };
                if !folders.contains_key(&folder) {
                    let loaded = match &folder {
                        None => HashMap::new(),
                        Some(f) => {
                            let place = if t.contains_key("subflows") {
                                format!("{at}/subflows")
                            } else {
                                "/subflows".into()
                            };
                            let full = dir.join(f);
                            if !full.is_dir() {
                                errs.push(ferr(path, place, format!("{} is not a folder", full.display())));
                                HashMap::new()
                            } else {
                                files::load_folder(&full, limits)
                                    .map_err(|e| errs.extend(e))
                                    .unwrap_or_default()
                            }
                        }
                    };
                    if let Some(m) = &machine {
                        errs.extend(files::check_subflows(&definition_path, m, &loaded));
                    }
                    folders.insert(folder.clone(), loaded);
                }
                let virtual_time = match t.get("virtualTime") {
                    None => true,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => {
                        errs.push(ferr(path, format!("{at}/virtualTime"), "must be true or false"));
                        true
                    }
                };
                let nominal = match t.get("nominalTime") {
                    None => None,
                    Some(Value::String(text)) => match sm4c_schedule::parse_time(text) {
                        Ok(ms) => Some(ms),
                        Err(e) => {
                            errs.push(ferr(path, format!("{at}/nominalTime"), e));
                            None
                        }
                    },
                    Some(_) => {
                        errs.push(ferr(
                            path,
                            format!("{at}/nominalTime"),
                            "must be an RFC 3339 time such as 2026-11-28T02:00:00Z",
                        ));
                        None
                    }
                };
                let schedule = match t.get("schedule") {
                    None => None,
                    Some(Value::String(id)) if t.get("nominalTime").is_some() => Some(id.clone()),
                    Some(Value::String(_)) => {
                        errs.push(ferr(
                            path,
                            format!("{at}/schedule"),
                            "names the schedule of a scheduled run: give its nominalTime too",
                        ));
                        None
                    }
                    Some(_) => {
                        errs.push(ferr(path, format!("{at}/schedule"), "must be a schedule id (a string)"));
                        None
                    }
                };
                let scheduled = nominal.map(|t| Scheduled {
                    schedule: schedule.unwrap_or_else(|| machine.as_ref().map(|m| m.id.clone()).unwrap_or_default()),
                    nominal_time: t,
                });
                let expect = match t.get("expect") {
                    Some(Value::Object(e)) => {
                        check_expect(path, &format!("{at}/expect"), e, &mut errs);
                        e.clone()
                    }
                    Some(_) => {
                        errs.push(ferr(path, format!("{at}/expect"), "must be an object"));
                        Map::new()
                    }
                    None => {
                        errs.push(ferr(
                            path,
                            format!("{at}/expect"),
                            format!(
                                "missing: what the test expects, one or more of {}",
                                EXPECT_KEYS.join(", ")
                            ),
                        ));
                        Map::new()
                    }
                };
                tests.push(TestCase {
                    name,
                    input: t.get("input").cloned().unwrap_or_else(|| Value::Object(Map::new())),
                    mocks: mocks_here,
                    events,
                    subflows: folders.get(&folder).cloned().unwrap_or_default(),
                    subflows_dir: folder.as_ref().map(|f| dir.join(f)),
                    virtual_time,
                    scheduled,
                    expect,
                });
            }
        }
        Some(Value::Array(_)) => errs.push(ferr(path, "/tests", "has no tests: give at least one")),
        Some(_) => errs.push(ferr(path, "/tests", "must be a list of tests")),
        None => errs.push(ferr(path, "/tests", "missing: the list of tests")),
    }
    match machine {
        Some(machine) if errs.is_empty() => Ok(TestFile {
            path: path.to_path_buf(),
            definition_path,
            machine,
            tests,
        }),
        _ => Err(errs),
    }
}

fn unknown_keys(path: &Path, at: &str, obj: &Map<String, Value>, known: &[&str], errs: &mut Vec<FileError>) {
    for k in obj.keys() {
        if !known.contains(&k.as_str()) {
            errs.push(ferr(
                path,
                format!("{at}/{}", esc(k)),
                format!("unknown field {k:?}; expected one of {}", known.join(", ")),
            ));
        }
    }
}

/// Parses a `mocks` object: function name to a jq program, or to a list of outcomes.
pub fn mocks(path: &Path, at: &str, v: &Value, limits: Limits, errs: &mut Vec<FileError>) -> HashMap<String, Mock> {
    let mut out = HashMap::new();
    let Some(map) = v.as_object() else {
        errs.push(ferr(
            path,
            at,
            "must be an object mapping function names to a jq program or a list of results",
        ));
        return out;
    };
    for (name, m) in map {
        let here = format!("{at}/{}", esc(name));
        match m {
            Value::String(code) => match Expr::compile(code, &[], limits) {
                Ok(e) => {
                    out.insert(name.clone(), Mock::Jq(e));
                }
                Err(msg) => errs.push(ferr(path, here, format!("invalid jq program {code:?}: {msg}"))),
            },
            Value::Array(list) => {
                let mut seq = Vec::new();
                for (j, o) in list.iter().enumerate() {
                    match outcome(o) {
                        Ok(o) => seq.push(o),
                        Err(m) => errs.push(ferr(path, format!("{here}/{j}"), m)),
                    }
                }
                out.insert(name.clone(), Mock::Sequence(seq));
            }
            _ => errs.push(ferr(
                path,
                here,
                "must be a jq program (a string) or a list of results, one per call ({\"result\": VALUE} or {\"error\": {\"kind\", \"message\"}})",
            )),
        }
    }
    out
}

fn outcome(v: &Value) -> Result<MockOutcome, String> {
    let shape = "must be {\"result\": VALUE} or {\"error\": {\"kind\": KIND, \"message\": TEXT}}";
    let Some(o) = v.as_object().filter(|o| o.len() == 1) else {
        return Err(shape.into());
    };
    if let Some(r) = o.get("result") {
        return Ok(MockOutcome::Result(r.clone()));
    }
    let Some(e) = o.get("error") else {
        return Err(shape.into());
    };
    match e {
        Value::String(m) => Ok(MockOutcome::Error {
            kind: None,
            message: m.clone(),
            details: None,
        }),
        Value::Object(e) => {
            if let Some(k) = e.keys().find(|k| !matches!(k.as_str(), "kind" | "message" | "details")) {
                return Err(format!(
                    "unknown field {k:?} of the error; expected kind, message, details"
                ));
            }
            let kind = match e.get("kind") {
                None => None,
                Some(Value::String(k)) if !k.is_empty() => Some(k.clone()),
                Some(_) => return Err("the error's `kind` must be a non-empty string".into()),
            };
            let message = match e.get("message") {
                Some(Value::String(m)) => m.clone(),
                None => String::new(),
                Some(_) => return Err("the error's `message` must be a string".into()),
            };
            Ok(MockOutcome::Error {
                kind,
                message,
                details: e.get("details").cloned(),
            })
        }
        _ => Err(shape.into()),
    }
}

fn check_expect(path: &Path, at: &str, e: &Map<String, Value>, errs: &mut Vec<FileError>) {
    unknown_keys(path, at, e, &EXPECT_KEYS, errs);
    if e.is_empty() {
        errs.push(ferr(
            path,
            at,
            format!("expects nothing: give one or more of {}", EXPECT_KEYS.join(", ")),
        ));
    }
    if let Some(s) = e.get("status") {
        if !s.as_str().is_some_and(|s| STATUSES.contains(&s)) {
            errs.push(ferr(
                path,
                format!("{at}/status"),
                format!("must be one of {}", STATUSES.join(", ")),
            ));
        }
    }
    if let Some(s) = e.get("states") {
        let ok = s.as_array().is_some_and(|l| l.iter().all(Value::is_string));
        if !ok {
            errs.push(ferr(
                path,
                format!("{at}/states"),
                "must be a list of state names, in the order they are entered",
            ));
        }
    }
    if let Some(s) = e.get("sent") {
        if !s.is_array() {
            errs.push(ferr(
                path,
                format!("{at}/sent"),
                "must be a list of (subsets of) the events sent, in order",
            ));
        }
    }
    if let Some(c) = e.get("calls") {
        match c.as_array() {
            None => errs.push(ferr(
                path,
                format!("{at}/calls"),
                "must be a list of calls, in order: a function name, or {\"function\", \"arguments\"}",
            )),
            Some(list) => {
                for (i, c) in list.iter().enumerate() {
                    let ok = match c {
                        Value::String(_) => true,
                        Value::Object(o) => {
                            o.get("function").is_some_and(Value::is_string)
                                && o.keys()
                                    .all(|k| matches!(k.as_str(), "function" | "arguments" | "state"))
                        }
                        _ => false,
                    };
                    if !ok {
                        errs.push(ferr(
                            path,
                            format!("{at}/calls/{i}"),
                            "must be a function name, or {\"function\": NAME, \"arguments\": SUBSET}",
                        ));
                    }
                }
            }
        }
    }
}

/// A call as `expect.calls` compares it: `{"function", "arguments"?}` from a name or an object.
pub fn expected_call(v: &Value) -> Value {
    match v {
        Value::String(name) => serde_json::json!({"function": name}),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn outcomes_are_results_or_errors() {
        assert_eq!(outcome(&json!({"result": 3})), Ok(MockOutcome::Result(json!(3))));
        assert_eq!(
            outcome(&json!({"error": {"kind": "timeout", "message": "slow"}})),
            Ok(MockOutcome::Error {
                kind: Some("timeout".into()),
                message: "slow".into(),
                details: None
            })
        );
        assert!(outcome(&json!(3)).is_err());
        assert!(outcome(&json!({"result": 1, "error": "x"})).is_err());
        assert!(outcome(&json!({"error": {"kind": "x", "cause": "y"}}))
            .unwrap_err()
            .contains("\"cause\""));
    }
}
