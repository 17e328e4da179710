//! The validated form of an ASL definition, built by [`load`]: state names resolved to indices,
//! paths, templates, Choice rules and JSONata expressions parsed once, and every error reported
//! with its JSON pointer.

use super::choice::{self, Rule};
use super::jsonata::{self, Query};
use super::path::Path;
use super::template::Template;
use crate::validate::ValidationError;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// The field sm4c adds to an ASL definition to keep the name it was registered under (ASL
/// definitions carry no id of their own).
pub const ID_KEY: &str = "sm4c:id";

/// True when `doc` is written in ASL: a JSON object with top-level `StartAt` and `States`.
pub fn is_asl(doc: &Value) -> bool {
    doc.get("StartAt").is_some() && doc.get("States").is_some()
}

/// The query language of a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// `JSONPath` (the default): paths, payload templates and intrinsic functions.
    JsonPath,
    /// `JSONata`: `{% %}` expressions, `Arguments` and `Output`.
    Jsonata,
}

/// A validated ASL state machine.
#[derive(Debug)]
pub struct AslMachine {
    /// Every `StartAt`/`States` block: `0` is the machine itself, then Parallel branches and Map
    /// processors, which refer to theirs by index.
    pub graphs: Vec<Graph>,
    /// Top-level `TimeoutSeconds`.
    pub timeout_seconds: Option<u64>,
}

/// One `StartAt`/`States` block.
#[derive(Debug)]
pub struct Graph {
    /// JSON pointer of the block.
    pub pointer: String,
    /// The states, in document order.
    pub states: Vec<State>,
    /// Index of `StartAt`.
    pub start: usize,
}

impl Graph {
    /// Finds a state by name.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.states.iter().position(|s| s.name == name)
    }
}

/// A value written as a literal, a Path (`...Path` fields) or a JSONata expression.
#[derive(Debug, Clone)]
pub enum Dyn<T> {
    /// Written as a literal.
    Lit(T),
    /// Read through a Path.
    Path(Path),
    /// A JSONata expression.
    Query(Query),
    /// An intrinsic function call (`ErrorPath`, `CausePath`).
    Call(super::intrinsics::Call),
}

/// Where a state's result goes (`ResultPath`).
#[derive(Debug, Clone)]
pub enum ResultPath {
    /// `$` (the default): the result replaces the input.
    Replace,
    /// `null`: the result is discarded, the output is the input.
    Discard,
    /// A Reference Path into the input.
    At(Path),
}

/// A state's `Assign`.
#[derive(Debug, Clone)]
pub enum Assign {
    /// JSONPath: a payload template.
    Template(Template),
    /// JSONata: expressions.
    Query(Query),
}

/// A state.
#[derive(Debug)]
pub struct State {
    /// Its name.
    pub name: String,
    /// JSON pointer of the state.
    pub pointer: String,
    /// Its query language.
    pub lang: Lang,
    /// What the state does.
    pub kind: Kind,
    /// `InputPath`: `None` is `$`, `Some(None)` is `null`.
    pub input_path: Option<Option<Path>>,
    /// `OutputPath`: `None` is `$`, `Some(None)` is `null`.
    pub output_path: Option<Option<Path>>,
    /// `Parameters` (JSONPath) or `ItemSelector` of a Map.
    pub parameters: Option<Template>,
    /// `ResultSelector`.
    pub result_selector: Option<Template>,
    /// `ResultPath`.
    pub result_path: ResultPath,
    /// `Arguments` (JSONata).
    pub arguments: Option<Query>,
    /// `Output` (JSONata).
    pub output: Option<Query>,
    /// `Assign`.
    pub assign: Option<Assign>,
    /// `Next`, resolved.
    pub next: Option<usize>,
    /// `Retry`.
    pub retry: Vec<Retrier>,
    /// `Catch`.
    pub catch: Vec<Catcher>,
    /// True when any expression of the state reads the context object, which is then built.
    pub uses_context: bool,
}

/// What a state does.
#[derive(Debug)]
pub enum Kind {
    /// `Pass` with its `Result`.
    Pass {
        /// `Result`.
        result: Option<Value>,
    },
    /// `Task`.
    Task {
        /// `Resource`.
        resource: String,
        /// `TimeoutSeconds(Path)`.
        timeout: Option<Dyn<u64>>,
        /// `HeartbeatSeconds(Path)`.
        heartbeat: Option<Dyn<u64>>,
    },
    /// `Choice`.
    Choice {
        /// The rules, in order.
        choices: Vec<Choice>,
        /// `Default`.
        default: Option<usize>,
    },
    /// `Wait`.
    Wait {
        /// How long.
        until: WaitFor,
    },
    /// `Succeed`.
    Succeed,
    /// `Fail`.
    Fail {
        /// `Error` / `ErrorPath`.
        error: Option<Dyn<String>>,
        /// `Cause` / `CausePath`.
        cause: Option<Dyn<String>>,
    },
    /// `Parallel`.
    Parallel {
        /// The graphs of the branches.
        branches: Vec<usize>,
    },
    /// `Map`.
    Map(Box<MapSpec>),
}

/// The parts of a Map state.
#[derive(Debug)]
pub struct MapSpec {
    /// The graph of `ItemProcessor` / `Iterator`.
    pub processor: usize,
    /// `ItemsPath` (JSONPath).
    pub items_path: Option<Path>,
    /// `Items` (JSONata).
    pub items: Option<Query>,
    /// `ItemSelector` (JSONata).
    pub item_selector: Option<Query>,
    /// `MaxConcurrency(Path)`; 0 is unbounded.
    pub max_concurrency: Option<Dyn<u64>>,
    /// `ToleratedFailurePercentage(Path)`.
    pub tolerated_percentage: Option<Dyn<f64>>,
    /// `ToleratedFailureCount(Path)`.
    pub tolerated_count: Option<Dyn<u64>>,
}

/// A Choice rule with where it leads.
#[derive(Debug)]
pub struct Choice {
    /// The test.
    pub test: Test,
    /// `Next`.
    pub next: usize,
    /// `Assign` of the rule.
    pub assign: Option<Assign>,
    /// `Output` of the rule (JSONata).
    pub output: Option<Query>,
}

/// The test of a Choice rule.
#[derive(Debug)]
pub enum Test {
    /// A JSONPath rule.
    Rule(Rule),
    /// A JSONata `Condition`.
    Condition(Query),
}

/// How long a Wait state waits.
#[derive(Debug)]
pub enum WaitFor {
    /// Seconds.
    Seconds(Dyn<u64>),
    /// Until a timestamp (nanoseconds since the epoch).
    Timestamp(Dyn<i128>),
}

/// A retrier.
#[derive(Debug, Clone)]
pub struct Retrier {
    /// `ErrorEquals`.
    pub errors: Vec<String>,
    /// `IntervalSeconds` (default 1).
    pub interval: f64,
    /// `MaxAttempts` (default 3).
    pub max_attempts: u32,
    /// `BackoffRate` (default 2.0).
    pub backoff: f64,
    /// `MaxDelaySeconds`.
    pub max_delay: Option<f64>,
    /// `JitterStrategy` is `FULL`.
    pub full_jitter: bool,
}

/// A catcher.
#[derive(Debug)]
pub struct Catcher {
    /// `ErrorEquals`.
    pub errors: Vec<String>,
    /// `Next`.
    pub next: usize,
    /// `ResultPath` (JSONPath).
    pub result_path: ResultPath,
    /// `Output` (JSONata).
    pub output: Option<Query>,
    /// `Assign`.
    pub assign: Option<Assign>,
}

struct V {
    errors: Vec<ValidationError>,
    graphs: Vec<Graph>,
}

impl V {
    fn err(&mut self, pointer: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ValidationError {
            pointer: pointer.into(),
            message: message.into(),
        });
    }
}

fn esc(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Validates an ASL document.
pub fn load(doc: &Value) -> Result<AslMachine, Vec<ValidationError>> {
    let mut v = V {
        errors: Vec::new(),
        graphs: Vec::new(),
    };
    let Some(root) = doc.as_object() else {
        v.err("", "an ASL definition must be a JSON object");
        return Err(v.errors);
    };
    let lang = match root.get("QueryLanguage") {
        None => Lang::JsonPath,
        Some(l) => lang_of(&mut v, "/QueryLanguage", l).unwrap_or(Lang::JsonPath),
    };
    for key in root.keys() {
        if !matches!(
            key.as_str(),
            "StartAt" | "States" | "Comment" | "Version" | "TimeoutSeconds" | "QueryLanguage" | ID_KEY
        ) {
            v.err(
                format!("/{}", esc(key)),
                format!("{key:?} is not a field of a state machine (StartAt, States, Comment, Version, TimeoutSeconds, QueryLanguage)"),
            );
        }
    }
    if let Some(id) = root.get(ID_KEY) {
        if id.as_str().is_none_or(str::is_empty) {
            v.err(
                format!("/{ID_KEY}"),
                "must be a non-empty string (the definition's name)",
            );
        }
    }
    if let Some(c) = root.get("Comment") {
        if !c.is_string() {
            v.err("/Comment", "must be a string");
        }
    }
    if let Some(ver) = root.get("Version") {
        if !ver.is_string() {
            v.err("/Version", "must be a string");
        }
    }
    let timeout_seconds = root
        .get("TimeoutSeconds")
        .and_then(|t| positive_int(&mut v, "/TimeoutSeconds", t));
    graph(&mut v, "", root, lang);
    if v.errors.is_empty() {
        Ok(AslMachine {
            graphs: v.graphs,
            timeout_seconds,
        })
    } else {
        Err(v.errors)
    }
}

fn lang_of(v: &mut V, p: &str, l: &Value) -> Option<Lang> {
    match l.as_str() {
        Some("JSONPath") => Some(Lang::JsonPath),
        Some("JSONata") => Some(Lang::Jsonata),
        _ => {
            v.err(p, "QueryLanguage must be \"JSONPath\" or \"JSONata\"");
            None
        }
    }
}

fn positive_int(v: &mut V, p: &str, t: &Value) -> Option<u64> {
    match t.as_u64() {
        Some(n) if n > 0 => Some(n),
        _ => {
            v.err(p, "must be a positive integer");
            None
        }
    }
}

/// Validates a `StartAt`/`States` block at pointer `p`; returns its graph index.
fn graph(v: &mut V, p: &str, obj: &Map<String, Value>, lang: Lang) -> usize {
    let index = v.graphs.len();
    v.graphs.push(Graph {
        pointer: p.to_string(),
        states: Vec::new(),
        start: 0,
    });
    let Some(states) = obj.get("States").and_then(Value::as_object) else {
        v.err(format!("{p}/States"), "States must be an object of states by name");
        return index;
    };
    if states.is_empty() {
        v.err(format!("{p}/States"), "States must have at least one state");
        return index;
    }
    let names: HashMap<&str, usize> = states.keys().enumerate().map(|(i, k)| (k.as_str(), i)).collect();
    let start = match obj.get("StartAt").and_then(Value::as_str) {
        Some(s) => match names.get(s) {
            Some(&i) => i,
            None => {
                v.err(
                    format!("{p}/StartAt"),
                    format!("StartAt names {s:?}, which is not a state of States"),
                );
                0
            }
        },
        None => {
            v.err(format!("{p}/StartAt"), "StartAt must be the name of a state");
            0
        }
    };
    let mut built = Vec::with_capacity(states.len());
    for (name, def) in states {
        let sp = format!("{p}/States/{}", esc(name));
        if name.is_empty() || name.chars().count() > 80 {
            v.err(&sp, "a state name must have 1 to 80 characters");
        }
        built.push(state(v, &sp, name, def, &names, lang));
    }
    let g = &mut v.graphs[index];
    g.states = built;
    g.start = start;
    index
}

const COMMON: &[&str] = &["Type", "Comment", "QueryLanguage"];

fn allowed(kind: &str, lang: Lang) -> Vec<&'static str> {
    let mut f: Vec<&str> = COMMON.to_vec();
    let jp = lang == Lang::JsonPath;
    let io: &[&str] = if jp { &["InputPath", "OutputPath"] } else { &["Output"] };
    let next: &[&str] = &["Next", "End"];
    match kind {
        "Pass" => {
            f.extend(io);
            f.extend(next);
            f.push("Assign");
            if jp {
                f.extend(["Parameters", "Result", "ResultPath"]);
            }
        }
        "Task" => {
            f.extend(io);
            f.extend(next);
            f.extend(["Resource", "Retry", "Catch", "Assign", "Credentials"]);
            if jp {
                f.extend([
                    "Parameters",
                    "ResultSelector",
                    "ResultPath",
                    "TimeoutSecondsPath",
                    "HeartbeatSecondsPath",
                    "TimeoutSeconds",
                    "HeartbeatSeconds",
                ]);
            } else {
                f.extend(["Arguments", "TimeoutSeconds", "HeartbeatSeconds"]);
            }
        }
        "Choice" => {
            f.extend(io);
            f.extend(["Choices", "Default", "Assign"]);
        }
        "Wait" => {
            f.extend(io);
            f.extend(next);
            f.extend(["Seconds", "Timestamp", "Assign"]);
            if jp {
                f.extend(["SecondsPath", "TimestampPath"]);
            }
        }
        "Succeed" => f.extend(io),
        "Fail" => {
            f.extend(["Error", "Cause"]);
            if jp {
                f.extend(["ErrorPath", "CausePath"]);
            }
        }
        "Parallel" => {
            f.extend(io);
            f.extend(next);
            f.extend(["Branches", "Retry", "Catch", "Assign"]);
            if jp {
                f.extend(["Parameters", "ResultSelector", "ResultPath"]);
            } else {
                f.push("Arguments");
            }
        }
        "Map" => {
            f.extend(io);
            f.extend(next);
            f.extend([
                "ItemProcessor",
                "Iterator",
                "ItemSelector",
                "MaxConcurrency",
                "ToleratedFailurePercentage",
                "ToleratedFailureCount",
                "Retry",
                "Catch",
                "Assign",
                "Label",
                "ItemReader",
                "ItemBatcher",
                "ResultWriter",
            ]);
            if jp {
                f.extend([
                    "Parameters",
                    "ResultSelector",
                    "ResultPath",
                    "ItemsPath",
                    "MaxConcurrencyPath",
                    "ToleratedFailurePercentagePath",
                    "ToleratedFailureCountPath",
                ]);
            } else {
                f.extend(["Items", "Arguments"]);
            }
        }
        _ => {}
    }
    f
}

fn state(v: &mut V, sp: &str, name: &str, def: &Value, names: &HashMap<&str, usize>, outer: Lang) -> State {
    let mut st = State {
        name: name.to_string(),
        pointer: sp.to_string(),
        lang: outer,
        kind: Kind::Succeed,
        input_path: None,
        output_path: None,
        parameters: None,
        result_selector: None,
        result_path: ResultPath::Replace,
        arguments: None,
        output: None,
        assign: None,
        next: None,
        retry: Vec::new(),
        catch: Vec::new(),
        uses_context: false,
    };
    let Some(o) = def.as_object() else {
        v.err(sp, "a state must be a JSON object");
        return st;
    };
    // The context object is built only for states that read it: `$$`, `$states.context`, and
    // JSONata's clock (`$now()`, `$millis()` give the state's entered time, so replays agree).
    let text = def.to_string();
    st.uses_context = ["$$", "$states.context", "$now", "$millis"]
        .iter()
        .any(|k| text.contains(k));
    if let Some(l) = o.get("QueryLanguage") {
        if let Some(l) = lang_of(v, &format!("{sp}/QueryLanguage"), l) {
            if outer == Lang::Jsonata && l == Lang::JsonPath {
                v.err(
                    format!("{sp}/QueryLanguage"),
                    "a state cannot use JSONPath when the state machine's QueryLanguage is JSONata",
                );
            }
            st.lang = l;
        }
    }
    let lang = st.lang;
    #[cfg(not(feature = "jsonata"))]
    if lang == Lang::Jsonata {
        v.err(sp, super::jsonata::MISSING);
    }
    let ty = match o.get("Type").and_then(Value::as_str) {
        Some(t @ ("Pass" | "Task" | "Choice" | "Wait" | "Succeed" | "Fail" | "Parallel" | "Map")) => t,
        Some(t) => {
            v.err(
                format!("{sp}/Type"),
                format!("{t:?} is not a state type (Pass, Task, Choice, Wait, Succeed, Fail, Parallel, Map)"),
            );
            return st;
        }
        None => {
            v.err(format!("{sp}/Type"), "a state must have a Type");
            return st;
        }
    };
    let ok = allowed(ty, lang);
    for key in o.keys() {
        if !ok.contains(&key.as_str()) {
            let why = match (lang, key.as_str()) {
                (
                    Lang::Jsonata,
                    "InputPath" | "OutputPath" | "Parameters" | "ResultSelector" | "ResultPath" | "ItemsPath"
                    | "SecondsPath" | "TimestampPath" | "ErrorPath" | "CausePath",
                ) => {
                    format!("{key} is a JSONPath field; a JSONata state uses Arguments, Output and {{% %}} expressions")
                }
                (Lang::JsonPath, "Arguments" | "Output" | "Items") => {
                    format!("{key} is a JSONata field; set \"QueryLanguage\": \"JSONata\" to use it")
                }
                _ => format!("{key:?} is not a field of a {ty} state"),
            };
            v.err(format!("{sp}/{}", esc(key)), why);
        }
    }
    for unsupported in ["ItemReader", "ItemBatcher", "ResultWriter"] {
        if ty == "Map" && o.contains_key(unsupported) {
            v.err(
                format!("{sp}/{unsupported}"),
                format!("{unsupported} (a Distributed Map reading or writing Amazon S3) is not supported; give the items in the input"),
            );
        }
    }
    // Transitions.
    let terminal = matches!(ty, "Choice" | "Succeed" | "Fail");
    if !terminal {
        let end = o.get("End");
        match (o.get("Next"), end) {
            (Some(n), None) => st.next = target(v, &format!("{sp}/Next"), n, names),
            (None, Some(Value::Bool(true))) => {}
            (None, Some(_)) => v.err(format!("{sp}/End"), "End must be true"),
            (Some(_), Some(_)) => v.err(sp, "a state has either Next or \"End\": true, not both"),
            (None, None) => v.err(sp, format!("a {ty} state must have Next or \"End\": true")),
        }
    }
    // Input and output.
    if lang == Lang::JsonPath {
        st.input_path = opt_path(v, sp, o, "InputPath");
        st.output_path = opt_path(v, sp, o, "OutputPath");
        if let Some(rp) = o.get("ResultPath") {
            st.result_path = result_path(v, &format!("{sp}/ResultPath"), rp);
        }
        st.parameters = o
            .get("Parameters")
            .or(if ty == "Map" { o.get("ItemSelector") } else { None })
            .and_then(|t| {
                let key = if o.contains_key("Parameters") {
                    "Parameters"
                } else {
                    "ItemSelector"
                };
                template(v, &format!("{sp}/{key}"), t)
            });
        if ty == "Map" && o.contains_key("Parameters") && o.contains_key("ItemSelector") {
            v.err(
                format!("{sp}/ItemSelector"),
                "a Map state has ItemSelector or Parameters, not both",
            );
        }
        st.result_selector = o
            .get("ResultSelector")
            .and_then(|t| template(v, &format!("{sp}/ResultSelector"), t));
    } else {
        st.arguments = o.get("Arguments").and_then(|a| query(v, &format!("{sp}/Arguments"), a));
        st.output = o.get("Output").and_then(|a| query(v, &format!("{sp}/Output"), a));
    }
    st.assign = o
        .get("Assign")
        .and_then(|a| assign(v, &format!("{sp}/Assign"), a, lang));
    if matches!(ty, "Task" | "Parallel" | "Map") {
        st.retry = retriers(v, sp, o.get("Retry"));
        st.catch = catchers(v, sp, o.get("Catch"), names, lang);
    }
    st.kind = match ty {
        "Pass" => Kind::Pass {
            result: o.get("Result").cloned(),
        },
        "Succeed" => Kind::Succeed,
        "Task" => {
            let resource = match o.get("Resource").and_then(Value::as_str) {
                Some(r) if !r.is_empty() => r.to_string(),
                _ => {
                    v.err(format!("{sp}/Resource"), "a Task state must have a Resource (a string)");
                    String::new()
                }
            };
            let timeout = number_field(
                v,
                sp,
                o,
                "TimeoutSeconds",
                lang,
                |x| x.as_u64().filter(|n| *n > 0),
                "a positive integer",
            );
            let heartbeat = number_field(
                v,
                sp,
                o,
                "HeartbeatSeconds",
                lang,
                |x| x.as_u64().filter(|n| *n > 0),
                "a positive integer",
            );
            if let (Some(Dyn::Lit(t)), Some(Dyn::Lit(h))) = (&timeout, &heartbeat) {
                if h >= t {
                    v.err(
                        format!("{sp}/HeartbeatSeconds"),
                        format!("HeartbeatSeconds ({h}) must be smaller than TimeoutSeconds ({t})"),
                    );
                }
            }
            Kind::Task {
                resource,
                timeout,
                heartbeat,
            }
        }
        "Choice" => choice_state(v, sp, o, names, lang),
        "Wait" => wait_state(v, sp, o, lang),
        "Fail" => Kind::Fail {
            error: fail_field(v, sp, o, "Error", lang),
            cause: fail_field(v, sp, o, "Cause", lang),
        },
        "Parallel" => {
            let mut branches = Vec::new();
            match o.get("Branches").and_then(Value::as_array) {
                Some(bs) if !bs.is_empty() => {
                    for (i, b) in bs.iter().enumerate() {
                        let bp = format!("{sp}/Branches/{i}");
                        match b.as_object() {
                            Some(bo) => branches.push(nested(v, &bp, bo, lang)),
                            None => v.err(bp, "a branch must be an object with StartAt and States"),
                        }
                    }
                }
                _ => v.err(
                    format!("{sp}/Branches"),
                    "a Parallel state must have Branches, a non-empty array",
                ),
            }
            Kind::Parallel { branches }
        }
        "Map" => map_state(v, sp, o, lang),
        _ => Kind::Succeed,
    };
    st
}

fn nested(v: &mut V, p: &str, o: &Map<String, Value>, lang: Lang) -> usize {
    for key in o.keys() {
        if !matches!(
            key.as_str(),
            "StartAt" | "States" | "Comment" | "ProcessorConfig" | "QueryLanguage"
        ) {
            v.err(
                format!("{p}/{}", esc(key)),
                format!("{key:?} is not a field here (StartAt, States, Comment)"),
            );
        }
    }
    let lang = match o.get("QueryLanguage") {
        Some(l) => lang_of(v, &format!("{p}/QueryLanguage"), l).unwrap_or(lang),
        None => lang,
    };
    if let Some(pc) = o.get("ProcessorConfig") {
        match pc.get("Mode").and_then(Value::as_str) {
            None | Some("INLINE") => {}
            Some("DISTRIBUTED") => {}
            Some(m) => v.err(
                format!("{p}/ProcessorConfig/Mode"),
                format!("{m:?} is not a Map mode (INLINE, DISTRIBUTED)"),
            ),
        }
    }
    graph(v, p, o, lang)
}

fn target(v: &mut V, p: &str, n: &Value, names: &HashMap<&str, usize>) -> Option<usize> {
    match n.as_str() {
        Some(s) => match names.get(s) {
            Some(&i) => Some(i),
            None => {
                v.err(p, format!("{s:?} is not a state of this States object"));
                None
            }
        },
        None => {
            v.err(p, "must be the name of a state");
            None
        }
    }
}

fn parse_path(v: &mut V, p: &str, s: &str) -> Option<Path> {
    match Path::parse(s) {
        Ok(path) => Some(path),
        Err(why) => {
            v.err(p, format!("{s:?} is not a valid path: {why}"));
            None
        }
    }
}

fn opt_path(v: &mut V, sp: &str, o: &Map<String, Value>, key: &str) -> Option<Option<Path>> {
    let p = format!("{sp}/{key}");
    match o.get(key)? {
        Value::Null => Some(None),
        Value::String(s) => Some(parse_path(v, &p, s)),
        _ => {
            v.err(p, "must be a path (a string starting with $) or null");
            None
        }
    }
}

fn result_path(v: &mut V, p: &str, rp: &Value) -> ResultPath {
    match rp {
        Value::Null => ResultPath::Discard,
        Value::String(s) => match parse_path(v, p, s) {
            Some(path) if !path.is_reference() || path.root() != &super::path::Root::Input => {
                v.err(
                    p,
                    format!("{s:?} must be a Reference Path into the input ($, then names and indices only)"),
                );
                ResultPath::Replace
            }
            Some(path) if s == "$" => {
                let _ = path;
                ResultPath::Replace
            }
            Some(path) => ResultPath::At(path),
            None => ResultPath::Replace,
        },
        _ => {
            v.err(p, "must be a Reference Path or null");
            ResultPath::Replace
        }
    }
}

fn template(v: &mut V, p: &str, t: &Value) -> Option<Template> {
    match Template::parse(t) {
        Ok(t) => Some(t),
        Err(errs) => {
            for (sub, msg) in errs {
                v.err(format!("{p}{sub}"), msg);
            }
            None
        }
    }
}

fn query(v: &mut V, p: &str, q: &Value) -> Option<Query> {
    match Query::parse(q) {
        Ok(q) => Some(q),
        Err(errs) => {
            for (sub, msg) in errs {
                v.err(format!("{p}{sub}"), msg);
            }
            None
        }
    }
}

fn assign(v: &mut V, p: &str, a: &Value, lang: Lang) -> Option<Assign> {
    let Some(o) = a.as_object() else {
        v.err(p, "Assign must be an object of variable names to values");
        return None;
    };
    for key in o.keys() {
        let name = key.strip_suffix(".$").unwrap_or(key);
        let good = !name.is_empty()
            && name.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_alphanumeric() || c == '_');
        if !good {
            v.err(
                format!("{p}/{}", esc(key)),
                format!("{name:?} is not a variable name (a letter or _, then letters, digits, _)"),
            );
        }
        if lang == Lang::Jsonata && key.ends_with(".$") {
            v.err(
                format!("{p}/{}", esc(key)),
                "a JSONata Assign uses {% %} expressions, not .$ keys",
            );
        }
    }
    match lang {
        Lang::JsonPath => template(v, p, a).map(Assign::Template),
        Lang::Jsonata => query(v, p, a).map(Assign::Query),
    }
}

fn errors_equals(v: &mut V, p: &str, o: &Map<String, Value>) -> Vec<String> {
    let p = format!("{p}/ErrorEquals");
    match o.get("ErrorEquals").and_then(Value::as_array) {
        Some(a) if !a.is_empty() => {
            let mut out = Vec::new();
            for (i, e) in a.iter().enumerate() {
                match e.as_str() {
                    Some(s) => out.push(s.to_string()),
                    None => v.err(format!("{p}/{i}"), "an error name must be a string"),
                }
            }
            if out.iter().any(|e| e == super::names::ALL) && out.len() > 1 {
                v.err(&p, "States.ALL must appear alone in ErrorEquals");
            }
            out
        }
        _ => {
            v.err(p, "ErrorEquals must be a non-empty array of error names");
            Vec::new()
        }
    }
}

fn retriers(v: &mut V, sp: &str, r: Option<&Value>) -> Vec<Retrier> {
    let Some(r) = r else { return Vec::new() };
    let Some(a) = r.as_array() else {
        v.err(format!("{sp}/Retry"), "Retry must be an array of retriers");
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, r) in a.iter().enumerate() {
        let p = format!("{sp}/Retry/{i}");
        let Some(o) = r.as_object() else {
            v.err(p, "a retrier must be an object");
            continue;
        };
        for key in o.keys() {
            if !matches!(
                key.as_str(),
                "ErrorEquals"
                    | "IntervalSeconds"
                    | "MaxAttempts"
                    | "BackoffRate"
                    | "MaxDelaySeconds"
                    | "JitterStrategy"
                    | "Comment"
            ) {
                v.err(
                    format!("{p}/{}", esc(key)),
                    format!("{key:?} is not a field of a retrier"),
                );
            }
        }
        let errors = errors_equals(v, &p, o);
        if errors.iter().any(|e| e == super::names::ALL) && i + 1 != a.len() {
            v.err(
                format!("{p}/ErrorEquals"),
                "a retrier with States.ALL must be the last one",
            );
        }
        let interval = match o.get("IntervalSeconds") {
            None => 1.0,
            Some(x) => match x.as_u64() {
                Some(n) if n >= 1 => n as f64,
                _ => {
                    v.err(format!("{p}/IntervalSeconds"), "must be a positive integer");
                    1.0
                }
            },
        };
        let max_attempts = match o.get("MaxAttempts") {
            None => 3,
            Some(x) => match x.as_u64() {
                Some(n) => n.min(99_999_999) as u32,
                None => {
                    v.err(format!("{p}/MaxAttempts"), "must be a non-negative integer");
                    3
                }
            },
        };
        let backoff = match o.get("BackoffRate") {
            None => 2.0,
            Some(x) => match x.as_f64() {
                Some(n) if n >= 1.0 => n,
                _ => {
                    v.err(format!("{p}/BackoffRate"), "must be a number not less than 1.0");
                    2.0
                }
            },
        };
        let max_delay = match o.get("MaxDelaySeconds") {
            None => None,
            Some(x) => match x.as_u64() {
                Some(n) if n >= 1 => Some(n as f64),
                _ => {
                    v.err(format!("{p}/MaxDelaySeconds"), "must be a positive integer");
                    None
                }
            },
        };
        let full_jitter = match o.get("JitterStrategy") {
            None => false,
            Some(x) => match x.as_str() {
                Some("FULL") => true,
                Some("NONE") => false,
                _ => {
                    v.err(format!("{p}/JitterStrategy"), "must be \"FULL\" or \"NONE\"");
                    false
                }
            },
        };
        out.push(Retrier {
            errors,
            interval,
            max_attempts,
            backoff,
            max_delay,
            full_jitter,
        });
    }
    out
}

fn catchers(v: &mut V, sp: &str, c: Option<&Value>, names: &HashMap<&str, usize>, lang: Lang) -> Vec<Catcher> {
    let Some(c) = c else { return Vec::new() };
    let Some(a) = c.as_array() else {
        v.err(format!("{sp}/Catch"), "Catch must be an array of catchers");
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, c) in a.iter().enumerate() {
        let p = format!("{sp}/Catch/{i}");
        let Some(o) = c.as_object() else {
            v.err(p, "a catcher must be an object");
            continue;
        };
        for key in o.keys() {
            let ok = match key.as_str() {
                "ErrorEquals" | "Next" | "Comment" | "Assign" => true,
                "ResultPath" => lang == Lang::JsonPath,
                "Output" => lang == Lang::Jsonata,
                _ => false,
            };
            if !ok {
                v.err(
                    format!("{p}/{}", esc(key)),
                    format!("{key:?} is not a field of a catcher here"),
                );
            }
        }
        let errors = errors_equals(v, &p, o);
        if errors.iter().any(|e| e == super::names::ALL) && i + 1 != a.len() {
            v.err(
                format!("{p}/ErrorEquals"),
                "a catcher with States.ALL must be the last one",
            );
        }
        let next = match o.get("Next") {
            Some(n) => target(v, &format!("{p}/Next"), n, names),
            None => {
                v.err(&p, "a catcher must have Next");
                None
            }
        };
        let result_path = match o.get("ResultPath") {
            Some(rp) => result_path(v, &format!("{p}/ResultPath"), rp),
            None => ResultPath::Replace,
        };
        let output = o.get("Output").and_then(|q| query(v, &format!("{p}/Output"), q));
        let assign = o.get("Assign").and_then(|a| assign(v, &format!("{p}/Assign"), a, lang));
        out.push(Catcher {
            errors,
            next: next.unwrap_or(0),
            result_path,
            output,
            assign,
        });
    }
    out
}

fn number_field<T>(
    v: &mut V,
    sp: &str,
    o: &Map<String, Value>,
    key: &str,
    lang: Lang,
    lit: impl Fn(&Value) -> Option<T>,
    what: &str,
) -> Option<Dyn<T>> {
    let path_key = format!("{key}Path");
    match (o.get(key), o.get(&path_key)) {
        (Some(_), Some(_)) => {
            v.err(sp, format!("a state has {key} or {path_key}, not both"));
            None
        }
        (Some(Value::String(s)), None) if lang == Lang::Jsonata && jsonata::is_expression(s) => {
            query(v, &format!("{sp}/{key}"), &Value::String(s.clone())).map(Dyn::Query)
        }
        (Some(x), None) => match lit(x) {
            Some(t) => Some(Dyn::Lit(t)),
            None => {
                v.err(format!("{sp}/{key}"), format!("must be {what}"));
                None
            }
        },
        (None, Some(Value::String(s))) => parse_path(v, &format!("{sp}/{path_key}"), s).map(Dyn::Path),
        (None, Some(_)) => {
            v.err(format!("{sp}/{path_key}"), "must be a path");
            None
        }
        (None, None) => None,
    }
}

fn fail_field(v: &mut V, sp: &str, o: &Map<String, Value>, key: &str, lang: Lang) -> Option<Dyn<String>> {
    let path_key = format!("{key}Path");
    match (o.get(key), o.get(&path_key)) {
        (Some(_), Some(_)) => {
            v.err(sp, format!("a Fail state has {key} or {path_key}, not both"));
            None
        }
        (Some(Value::String(s)), None) if lang == Lang::Jsonata && jsonata::is_expression(s) => {
            query(v, &format!("{sp}/{key}"), &Value::String(s.clone())).map(Dyn::Query)
        }
        (Some(Value::String(s)), None) => Some(Dyn::Lit(s.clone())),
        (Some(_), None) => {
            v.err(format!("{sp}/{key}"), "must be a string");
            None
        }
        (None, Some(Value::String(s))) => {
            let p = format!("{sp}/{path_key}");
            if super::intrinsics::is_intrinsic(s) {
                match super::intrinsics::Call::parse(s) {
                    Ok(c) => Some(Dyn::Call(c)),
                    Err(why) => {
                        v.err(&p, format!("{s:?} is not a valid intrinsic function call: {why}"));
                        None
                    }
                }
            } else {
                parse_path(v, &p, s).map(Dyn::Path)
            }
        }
        (None, Some(_)) => {
            v.err(format!("{sp}/{path_key}"), "must be a path");
            None
        }
        (None, None) => None,
    }
}

fn choice_state(v: &mut V, sp: &str, o: &Map<String, Value>, names: &HashMap<&str, usize>, lang: Lang) -> Kind {
    let mut choices = Vec::new();
    match o.get("Choices").and_then(Value::as_array) {
        Some(a) if !a.is_empty() => {
            for (i, c) in a.iter().enumerate() {
                let p = format!("{sp}/Choices/{i}");
                let Some(co) = c.as_object() else {
                    v.err(p, "a Choice rule must be an object");
                    continue;
                };
                let next = match co.get("Next") {
                    Some(n) => target(v, &format!("{p}/Next"), n, names),
                    None => {
                        v.err(&p, "a top-level Choice rule must have Next");
                        None
                    }
                };
                let assign = co
                    .get("Assign")
                    .and_then(|a| assign(v, &format!("{p}/Assign"), a, lang));
                let (test, output) = match lang {
                    Lang::JsonPath => {
                        let mut rule = co.clone();
                        rule.remove("Assign");
                        rule.remove("Comment");
                        if co.contains_key("Output") || co.contains_key("Condition") {
                            v.err(&p, "Output and Condition belong to JSONata Choice rules");
                        }
                        match Rule::parse(&Value::Object(rule), true) {
                            Ok(r) => (Some(Test::Rule(r)), None),
                            Err(errs) => {
                                for (sub, m) in errs {
                                    v.err(format!("{p}{sub}"), m);
                                }
                                (None, None)
                            }
                        }
                    }
                    Lang::Jsonata => {
                        for key in co.keys() {
                            if !matches!(key.as_str(), "Condition" | "Next" | "Assign" | "Output" | "Comment") {
                                v.err(
                                    format!("{p}/{}", esc(key)),
                                    format!("{key:?} is not a field of a JSONata Choice rule (Condition, Next, Assign, Output)"),
                                );
                            }
                        }
                        let test = match co.get("Condition") {
                            Some(c) => query(v, &format!("{p}/Condition"), c).map(Test::Condition),
                            None => {
                                v.err(&p, "a JSONata Choice rule must have a Condition");
                                None
                            }
                        };
                        (test, co.get("Output").and_then(|q| query(v, &format!("{p}/Output"), q)))
                    }
                };
                if let (Some(test), Some(next)) = (test, next) {
                    choices.push(Choice {
                        test,
                        next,
                        assign,
                        output,
                    });
                }
            }
        }
        _ => v.err(
            format!("{sp}/Choices"),
            "a Choice state must have Choices, a non-empty array of rules",
        ),
    }
    let default = o
        .get("Default")
        .and_then(|d| target(v, &format!("{sp}/Default"), d, names));
    Kind::Choice { choices, default }
}

fn wait_state(v: &mut V, sp: &str, o: &Map<String, Value>, lang: Lang) -> Kind {
    let given: Vec<&str> = ["Seconds", "SecondsPath", "Timestamp", "TimestampPath"]
        .into_iter()
        .filter(|k| o.contains_key(*k))
        .collect();
    if given.len() != 1 {
        v.err(
            sp,
            "a Wait state must have exactly one of Seconds, SecondsPath, Timestamp, TimestampPath",
        );
        return Kind::Wait {
            until: WaitFor::Seconds(Dyn::Lit(0)),
        };
    }
    let until = match given[0] {
        "Seconds" | "SecondsPath" => {
            let secs = number_field(v, sp, o, "Seconds", lang, Value::as_u64, "a non-negative integer");
            WaitFor::Seconds(secs.unwrap_or(Dyn::Lit(0)))
        }
        _ => {
            let ts = number_field(
                v,
                sp,
                o,
                "Timestamp",
                lang,
                |x| x.as_str().and_then(choice::parse_timestamp),
                "a timestamp such as 2016-03-14T01:59:00Z (RFC 3339, with T and a Z or offset)",
            );
            WaitFor::Timestamp(ts.unwrap_or(Dyn::Lit(0)))
        }
    };
    Kind::Wait { until }
}

fn map_state(v: &mut V, sp: &str, o: &Map<String, Value>, lang: Lang) -> Kind {
    let processor = match (o.get("ItemProcessor"), o.get("Iterator")) {
        (Some(_), Some(_)) => {
            v.err(sp, "a Map state has ItemProcessor or Iterator, not both");
            None
        }
        (Some(p), None) | (None, Some(p)) => {
            let key = if o.contains_key("ItemProcessor") {
                "ItemProcessor"
            } else {
                "Iterator"
            };
            match p.as_object() {
                Some(po) => Some(nested(v, &format!("{sp}/{key}"), po, lang)),
                None => {
                    v.err(format!("{sp}/{key}"), "must be an object with StartAt and States");
                    None
                }
            }
        }
        (None, None) => {
            v.err(sp, "a Map state must have an ItemProcessor (or the older Iterator)");
            None
        }
    };
    let items_path = match o.get("ItemsPath") {
        Some(Value::String(s)) => parse_path(v, &format!("{sp}/ItemsPath"), s),
        Some(_) => {
            v.err(format!("{sp}/ItemsPath"), "must be a path");
            None
        }
        None => None,
    };
    let items = if lang == Lang::Jsonata {
        o.get("Items").and_then(|q| query(v, &format!("{sp}/Items"), q))
    } else {
        None
    };
    let item_selector = if lang == Lang::Jsonata {
        o.get("ItemSelector")
            .and_then(|q| query(v, &format!("{sp}/ItemSelector"), q))
    } else {
        None
    };
    let max_concurrency = number_field(
        v,
        sp,
        o,
        "MaxConcurrency",
        lang,
        Value::as_u64,
        "a non-negative integer",
    );
    let tolerated_percentage = number_field(
        v,
        sp,
        o,
        "ToleratedFailurePercentage",
        lang,
        |x| x.as_f64().filter(|p| (0.0..=100.0).contains(p)),
        "a number from 0 to 100",
    );
    let tolerated_count = number_field(
        v,
        sp,
        o,
        "ToleratedFailureCount",
        lang,
        Value::as_u64,
        "a non-negative integer",
    );
    Kind::Map(Box::new(MapSpec {
        processor: processor.unwrap_or(0),
        items_path,
        items,
        item_selector,
        max_concurrency,
        tolerated_percentage,
        tolerated_count,
    }))
}
