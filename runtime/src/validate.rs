//! Raw JSON to a validated [`Machine`], reporting every error with its JSON pointer.

use crate::expr::{is_expression, Expr, ExprFunction, Limits};
use crate::model::*;
use crate::timespan;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// One problem in a definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    /// JSON pointer of the offending element (`""` for the whole document).
    pub pointer: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for ValidationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = if self.pointer.is_empty() { "/" } else { &self.pointer };
        write!(f, "{p}: {}", self.message)
    }
}

/// Reads the JSON files that `events`, `functions` and `retries` may name by URI.
/// The runtime does no IO: the host supplies this.
pub type Resolver<'r> = &'r mut dyn FnMut(&str) -> Result<Value, String>;

/// Options for loading a definition.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Limits given to every expression of the definition.
    pub limits: Limits,
}

/// Loads a definition. `resolve` reads URI references; pass one that refuses when there are none.
pub fn load(doc: &Value, resolve: Resolver<'_>, options: LoadOptions) -> Result<Machine, Vec<ValidationError>> {
    let mut v = V {
        errors: Vec::new(),
        actions: Vec::new(),
        fns: Vec::new(),
        limits: options.limits,
        events: HashMap::new(),
        functions: HashMap::new(),
        workers: Default::default(),
        kinds: Default::default(),
        retries: HashMap::new(),
    };
    let Some(root) = doc.as_object() else {
        v.err("", "a definition must be a JSON object");
        return Err(v.errors);
    };
    if crate::asl::model::is_asl(doc) {
        return load_asl(doc);
    }
    let mut source = doc.clone();

    let id = v.req_str(root, "", "id");
    let name = v.req_str(root, "", "name");
    let version = v.req_version(root);
    let description = v.opt_str(root, "", "description");

    let events_doc = v.section(root, "events", resolve, &mut source);
    let functions_doc = v.section(root, "functions", resolve, &mut source);
    let retries_doc = v.section(root, "retries", resolve, &mut source);

    let events = v.events(&events_doc);
    let functions = v.functions(&functions_doc);
    let retries = v.retries(&retries_doc);

    let (state_names, states_doc) = match root.get("states") {
        Some(Value::Array(a)) if !a.is_empty() => {
            let mut names: HashMap<String, usize> = HashMap::new();
            for (i, s) in a.iter().enumerate() {
                if let Some(n) = s.get("name").and_then(Value::as_str) {
                    if names.insert(n.to_string(), i).is_some() {
                        v.err(&format!("/states/{i}/name"), &format!("duplicate state name {n:?}"));
                    }
                }
            }
            (names, a.clone())
        }
        Some(Value::Array(_)) => {
            v.err("/states", "a state machine needs at least one state");
            (HashMap::new(), Vec::new())
        }
        Some(_) => {
            v.err("/states", "must be an array of states");
            (HashMap::new(), Vec::new())
        }
        None => {
            v.err("", "missing required field `states`");
            (HashMap::new(), Vec::new())
        }
    };

    let mut states = Vec::new();
    for (i, s) in states_doc.iter().enumerate() {
        states.push(v.state(s, &format!("/states/{i}"), &state_names));
    }
    let starts: Vec<usize> = states_doc
        .iter()
        .enumerate()
        .filter(|(_, s)| s.get("start").and_then(Value::as_bool) == Some(true))
        .map(|(i, _)| i)
        .collect();
    let start = match starts.as_slice() {
        [one] => *one,
        [] => {
            if !states_doc.is_empty() {
                v.err("/states", "no start state: exactly one state must have \"start\": true");
            }
            0
        }
        many => {
            let names: Vec<String> = many
                .iter()
                .map(|i| {
                    states_doc[*i]
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_string()
                })
                .collect();
            v.err(
                &format!("/states/{}/start", many[1]),
                &format!(
                    "more than one start state ({}): exactly one state must have \"start\": true",
                    names.join(", ")
                ),
            );
            many[0]
        }
    };

    let timeout_key = if root.contains_key("timeout") {
        "timeout"
    } else {
        "execTimeout"
    };
    let timeout = root.get(timeout_key).and_then(|t| {
        let p = format!("/{timeout_key}");
        let Some(o) = t.as_object() else {
            v.err(&p, "must be an object with `duration` and optional `action`");
            return None;
        };
        let duration_ms = v.req_timespan(o, &p, "duration")?;
        let action = o.get("action").and_then(|a| v.action(a, &format!("{p}/action")));
        Some(ExecTimeout { duration_ms, action })
    });
    let start_event = root.get("startEvent").and_then(|s| {
        let o = s.as_object().or_else(|| {
            v.err("/startEvent", "must be an object with `type` and optional `source`");
            None
        })?;
        let event_type = v.req_str(o, "/startEvent", "type")?;
        Some(StartEvent {
            event_type,
            source: v.opt_str(o, "/startEvent", "source"),
        })
    });
    let max_redrives = root.get("maxRedrives").and_then(|n| {
        let cap = n.as_u64().and_then(|n| u32::try_from(n).ok());
        if cap.is_none() {
            v.err(
                "/maxRedrives",
                "must be a whole number from 0 to 4294967295 (0: never redriven)",
            );
        }
        cap
    });

    if !v.errors.is_empty() {
        return Err(v.errors);
    }
    Ok(Machine {
        id: id.unwrap_or_default(),
        name: name.unwrap_or_default(),
        version: version.unwrap_or_default(),
        description,
        timeout,
        events,
        functions,
        retries,
        states: states.into_iter().flatten().collect(),
        start,
        actions: v.actions,
        start_event,
        max_redrives,
        source,
        asl: None,
    })
}

/// The id an ASL definition gets when the host names it nothing else (ASL definitions carry no
/// id: hosts name them after their file, or as the API request says).
pub const ASL_DEFAULT_ID: &str = "state-machine";

/// Loads a definition written in the Amazon States Language.
fn load_asl(doc: &Value) -> Result<Machine, Vec<ValidationError>> {
    let asl = crate::asl::model::load(doc)?;
    let description = doc.get("Comment").and_then(Value::as_str).map(str::to_string);
    let id = doc
        .get(crate::asl::model::ID_KEY)
        .and_then(Value::as_str)
        .unwrap_or(ASL_DEFAULT_ID)
        .to_string();
    // ASL has no version field of its own: the version is a digest of the text, so registering a
    // changed definition under the same name adds a version.
    let text = doc.to_string();
    let digest = crate::kernel::hash::fnv1a64(text.as_bytes());
    Ok(Machine {
        id: id.clone(),
        name: id,
        version: format!("{digest:016x}"),
        description,
        timeout: None,
        events: Vec::new(),
        functions: Vec::new(),
        retries: Vec::new(),
        states: Vec::new(),
        start: 0,
        actions: Vec::new(),
        start_event: None,
        max_redrives: None,
        source: doc.clone(),
        asl: Some(std::sync::Arc::new(asl)),
    })
}

/// Action types, matched without regard to case.
/// The timeouts a `worker` function may set.
const TASK_TIMEOUTS: [&str; 4] = [
    "scheduleToStartTimeout",
    "startToCloseTimeout",
    "heartbeatTimeout",
    "scheduleToCloseTimeout",
];

/// A task list name works as a Kafka topic name and as one URL path segment.
pub fn is_task_list_name(name: &str) -> bool {
    (1..=249).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

const ACTION_TYPES: &[&str] = &[
    "delay",
    "foreach",
    "injectData",
    "invokeFunction",
    "invokeSubflow",
    "parallel",
    "sendEvent",
    "sequence",
];

struct V {
    errors: Vec<ValidationError>,
    actions: Vec<Action>,
    fns: Vec<ExprFunction>,
    limits: Limits,
    events: HashMap<String, usize>,
    functions: HashMap<String, usize>,
    /// Indices of `worker` functions (their calls must wait for completion).
    workers: std::collections::HashSet<usize>,
    /// The `type` of each function, by index (`delivery` applies to calls the host makes).
    kinds: HashMap<usize, &'static str>,
    retries: HashMap<String, usize>,
}

fn esc(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

impl V {
    fn err(&mut self, pointer: &str, message: &str) {
        self.errors.push(ValidationError {
            pointer: pointer.to_string(),
            message: message.to_string(),
        });
    }

    fn req_str(&mut self, o: &Map<String, Value>, p: &str, key: &str) -> Option<String> {
        match o.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
            Some(Value::String(_)) => {
                self.err(&format!("{p}/{key}"), "must not be empty");
                None
            }
            Some(_) => {
                self.err(&format!("{p}/{key}"), "must be a string");
                None
            }
            None => {
                self.err(p, &format!("missing required field `{key}`"));
                None
            }
        }
    }

    fn req_version(&mut self, o: &Map<String, Value>) -> Option<String> {
        match o.get("version") {
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => self.req_str(o, "", "version"),
        }
    }

    fn opt_str(&mut self, o: &Map<String, Value>, p: &str, key: &str) -> Option<String> {
        match o.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                self.err(&format!("{p}/{key}"), "must be a string");
                None
            }
        }
    }

    fn opt_bool(&mut self, o: &Map<String, Value>, p: &str, key: &str) -> Option<bool> {
        match o.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => {
                self.err(&format!("{p}/{key}"), "must be true or false");
                None
            }
        }
    }

    fn opt_timespan(&mut self, o: &Map<String, Value>, p: &str, key: &str) -> Option<u64> {
        match o.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => match timespan::parse(s) {
                Ok(ms) => Some(ms),
                Err(e) => {
                    self.err(&format!("{p}/{key}"), &e);
                    None
                }
            },
            Some(_) => {
                self.err(
                    &format!("{p}/{key}"),
                    "must be a timespan string such as \"PT15M\", \"00:15:00\" or \"15m\"",
                );
                None
            }
        }
    }

    fn req_timespan(&mut self, o: &Map<String, Value>, p: &str, key: &str) -> Option<u64> {
        if o.get(key).is_none() {
            self.err(p, &format!("missing required field `{key}`"));
            return None;
        }
        self.opt_timespan(o, p, key)
    }

    fn expr(&mut self, text: &str, p: &str) -> Option<Expr> {
        match Expr::compile(text, &self.fns, self.limits) {
            Ok(e) => Some(e),
            Err(msg) => {
                self.err(p, &format!("invalid jq expression {:?}: {msg}", text.trim()));
                None
            }
        }
    }

    fn opt_expr(&mut self, o: &Map<String, Value>, p: &str, key: &str) -> Option<Expr> {
        match o.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => self.expr(s, &format!("{p}/{key}")),
            Some(_) => {
                self.err(
                    &format!("{p}/{key}"),
                    "must be a jq expression string such as \"${ .a }\"",
                );
                None
            }
        }
    }

    /// The `condition` field of `o` (a transition, event group or error handler at `p`).
    fn condition(&mut self, o: &Map<String, Value>, p: &str) -> Option<Condition> {
        self.opt_expr(o, p, "condition").map(|expr| Condition {
            expr,
            pointer: format!("{p}/condition"),
        })
    }

    /// A string value that is an expression only when written `${ ... }`; any other JSON is literal.
    fn template(&mut self, value: &Value, p: &str) -> Template {
        match value {
            Value::String(s) if is_expression(s) => match self.expr(s, p) {
                Some(e) => Template::Expr(e),
                None => Template::Const(jaq_json::Val::Null),
            },
            Value::Array(items) => {
                let ts: Vec<Template> = items
                    .iter()
                    .enumerate()
                    .map(|(i, x)| self.template(x, &format!("{p}/{i}")))
                    .collect();
                if ts.iter().all(|t| matches!(t, Template::Const(_))) {
                    Template::constant(value)
                } else {
                    Template::Arr(ts)
                }
            }
            Value::Object(fields) => {
                let ts: Vec<(String, Template)> = fields
                    .iter()
                    .map(|(k, x)| (k.clone(), self.template(x, &format!("{p}/{}", esc(k)))))
                    .collect();
                if ts.iter().all(|(_, t)| matches!(t, Template::Const(_))) {
                    Template::constant(value)
                } else {
                    Template::Obj(ts)
                }
            }
            other => Template::constant(other),
        }
    }

    /// `expression` of injectData/sendEvent: a string is jq (with or without `${ }`), other JSON a template.
    fn data_template(&mut self, value: &Value, p: &str) -> Template {
        match value {
            Value::String(s) => match self.expr(s, p) {
                Some(e) => Template::Expr(e),
                None => Template::Const(jaq_json::Val::Null),
            },
            other => self.template(other, p),
        }
    }

    /// Reads `events`, `functions` or `retries`: an inline array, or a URI naming a JSON file.
    fn section(
        &mut self,
        root: &Map<String, Value>,
        key: &str,
        resolve: Resolver<'_>,
        source: &mut Value,
    ) -> Vec<(String, Value)> {
        let p = format!("/{key}");
        match root.get(key) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, x)| (format!("{p}/{i}"), x.clone()))
                .collect(),
            Some(Value::String(uri)) => match resolve(uri) {
                Ok(doc) => {
                    // Accept a bare array, or an object holding the array under the same key.
                    let arr = match &doc {
                        Value::Array(a) => Some(a.clone()),
                        Value::Object(o) => o.get(key).and_then(Value::as_array).cloned(),
                        _ => None,
                    };
                    match arr {
                        Some(a) => {
                            source[key] = Value::Array(a.clone());
                            a.into_iter()
                                .enumerate()
                                .map(|(i, x)| (format!("{p}/{i} (in {uri})"), x))
                                .collect()
                        }
                        None => {
                            self.err(
                                &p,
                                &format!("{uri} must hold a JSON array of {key}, or an object with a `{key}` array"),
                            );
                            Vec::new()
                        }
                    }
                }
                Err(why) => {
                    self.err(&p, &format!("cannot read {key} from {uri:?}: {why}"));
                    Vec::new()
                }
            },
            Some(_) => {
                self.err(
                    &p,
                    &format!("must be an array of {key} or a URI string naming a JSON file"),
                );
                Vec::new()
            }
        }
    }

    fn events(&mut self, items: &[(String, Value)]) -> Vec<EventDef> {
        let mut out = Vec::new();
        for (p, e) in items {
            let Some(o) = e.as_object() else {
                self.err(p, "an event definition must be an object");
                continue;
            };
            let Some(name) = self.req_str(o, p, "name") else {
                continue;
            };
            if self.events.insert(name.clone(), out.len()).is_some() {
                self.err(&format!("{p}/name"), &format!("duplicate event name {name:?}"));
            }
            let mut correlation = Vec::new();
            match o.get("correlation") {
                None | Some(Value::Null) => {}
                Some(Value::Array(rules)) => {
                    for (i, r) in rules.iter().enumerate() {
                        let rp = format!("{p}/correlation/{i}");
                        let Some(ro) = r.as_object() else {
                            self.err(&rp, "a correlation rule must be an object");
                            continue;
                        };
                        let Some(attr) = self.req_str(ro, &rp, "contextAttributeName") else {
                            continue;
                        };
                        let value = match ro.get("contextAttributeValue") {
                            None | Some(Value::Null) => None,
                            Some(Value::String(s)) => {
                                Some(self.template(&Value::String(s.clone()), &format!("{rp}/contextAttributeValue")))
                            }
                            Some(_) => {
                                self.err(&format!("{rp}/contextAttributeValue"), "must be a string");
                                None
                            }
                        };
                        correlation.push(Correlation { name: attr, value });
                    }
                }
                Some(_) => self.err(&format!("{p}/correlation"), "must be an array of correlation rules"),
            }
            out.push(EventDef {
                source: self.opt_str(o, p, "source"),
                event_type: self.opt_str(o, p, "type"),
                kind: self.opt_str(o, p, "kind"),
                topic: self.opt_str(o, p, "topic"),
                name,
                correlation,
            });
        }
        out
    }

    fn functions(&mut self, items: &[(String, Value)]) -> Vec<Function> {
        // Expression functions first, so every expression can call them as `fn:name`.
        for (_, f) in items {
            if let (Some(name), Some(op), Some(kind)) = (
                f.get("name").and_then(Value::as_str),
                f.get("operation").and_then(Value::as_str),
                f.get("type").and_then(Value::as_str),
            ) {
                if kind.eq_ignore_ascii_case("expression") {
                    self.fns.push(ExprFunction {
                        name: name.into(),
                        body: op.into(),
                    });
                }
            }
        }
        let mut out = Vec::new();
        for (p, f) in items {
            let Some(o) = f.as_object() else {
                self.err(p, "a function definition must be an object");
                continue;
            };
            let name = self.req_str(o, p, "name");
            let operation = self.req_str(o, p, "operation");
            let (Some(name), Some(operation)) = (name, operation) else {
                continue;
            };
            if self.functions.insert(name.clone(), out.len()).is_some() {
                self.err(&format!("{p}/name"), &format!("duplicate function name {name:?}"));
            }
            let kind = match o.get("type").map(|t| t.as_str().map(str::to_ascii_lowercase)) {
                None | Some(Some(_)) if o.get("type").is_none() => FunctionKind::Rest,
                Some(Some(t)) if t == "rest" => FunctionKind::Rest,
                Some(Some(t)) if t == "rpc" => FunctionKind::Rpc,
                Some(Some(t)) if t == "expression" => match self.expr(&operation, &format!("{p}/operation")) {
                    Some(e) => FunctionKind::Expression(e),
                    None => continue,
                },
                Some(Some(t)) if t == "worker" => {
                    if !is_task_list_name(&operation) {
                        self.err(
                            &format!("{p}/operation"),
                            &format!("{operation:?} is not a task list name: use 1 to 249 letters, digits, `.`, `_` or `-` (it names a Kafka topic and a URL segment)"),
                        );
                    }
                    self.workers.insert(out.len());
                    FunctionKind::Worker(TaskTimeouts {
                        schedule_to_start_ms: self.task_timeout(o, p, "scheduleToStartTimeout"),
                        start_to_close_ms: self.task_timeout(o, p, "startToCloseTimeout"),
                        heartbeat_ms: self.task_timeout(o, p, "heartbeatTimeout"),
                        schedule_to_close_ms: self.task_timeout(o, p, "scheduleToCloseTimeout"),
                    })
                }
                _ => {
                    self.err(
                        &format!("{p}/type"),
                        "must be \"rest\", \"expression\", \"rpc\" or \"worker\"",
                    );
                    continue;
                }
            };
            if !matches!(kind, FunctionKind::Worker(_)) {
                for key in TASK_TIMEOUTS {
                    if o.get(key).is_some_and(|v| !v.is_null()) {
                        self.err(
                            &format!("{p}/{key}"),
                            &format!(
                                "only functions of type \"worker\" have task timeouts; this one is {:?}",
                                kind.as_str()
                            ),
                        );
                    }
                }
            }
            let delivery = self.delivery(o, p, kind.as_str()).unwrap_or_default();
            self.kinds.insert(out.len(), kind.as_str());
            out.push(Function {
                name,
                operation,
                kind,
                delivery,
            });
        }
        out
    }

    /// `delivery` of a function or an `invokeFunction` action of a function of type `kind`:
    /// `atLeastOnce` or `atMostOnce`, the latter only for calls the host makes (`rest`, `rpc`).
    fn delivery(&mut self, o: &Map<String, Value>, p: &str, kind: &str) -> Option<Delivery> {
        let at = format!("{p}/delivery");
        let delivery = match o.get("delivery")? {
            Value::String(s) => match Delivery::parse(s) {
                Some(d) => d,
                None => {
                    self.err(
                        &at,
                        &format!("{s:?} is not a delivery: use \"atLeastOnce\" or \"atMostOnce\""),
                    );
                    return None;
                }
            },
            _ => {
                self.err(&at, "must be \"atLeastOnce\" or \"atMostOnce\"");
                return None;
            }
        };
        if delivery == Delivery::AtMostOnce && !matches!(kind, "rest" | "rpc") {
            let why = match kind {
                "worker" => "a worker task is taken once by a worker and bound by its own timeouts (startToCloseTimeout, heartbeatTimeout), not made again by the host",
                _ => "an expression function runs inside the engine and makes no call a crash could repeat",
            };
            self.err(
                &at,
                &format!("\"atMostOnce\" applies to \"rest\" and \"rpc\" functions; this one is {kind:?}: {why}"),
            );
            return None;
        }
        Some(delivery)
    }

    /// A task timeout of a worker function: a timespan longer than zero.
    fn task_timeout(&mut self, o: &Map<String, Value>, p: &str, key: &str) -> Option<u64> {
        match self.opt_timespan(o, p, key) {
            Some(0) => {
                self.err(&format!("{p}/{key}"), "must be longer than zero");
                None
            }
            ms => ms,
        }
    }

    fn retries(&mut self, items: &[(String, Value)]) -> Vec<RetryPolicy> {
        let mut out = Vec::new();
        for (p, r) in items {
            let Some(o) = r.as_object() else {
                self.err(p, "a retry policy must be an object");
                continue;
            };
            let Some(name) = self.req_str(o, p, "name") else {
                continue;
            };
            if self.retries.insert(name.clone(), out.len()).is_some() {
                self.err(&format!("{p}/name"), &format!("duplicate retry policy name {name:?}"));
            }
            let multiplier = match o.get("multiplier") {
                None | Some(Value::Null) => 1.0,
                Some(Value::Number(n)) if n.as_f64().is_some_and(|m| m > 0.0) => n.as_f64().unwrap_or(1.0),
                Some(_) => {
                    self.err(&format!("{p}/multiplier"), "must be a positive number");
                    1.0
                }
            };
            let max_attempts = match o.get("maxAttempts") {
                None | Some(Value::Null) => 3,
                Some(v) => match v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())) {
                    Some(n) if n <= u32::MAX as u64 => n as u32,
                    _ => {
                        self.err(&format!("{p}/maxAttempts"), "must be a non-negative integer");
                        0
                    }
                },
            };
            let jitter = match o.get("jitter") {
                None | Some(Value::Null) => Jitter::None,
                Some(Value::Number(n)) => match n.as_f64() {
                    Some(f) if (0.0..=1.0).contains(&f) => Jitter::Fraction(f),
                    _ => {
                        self.err(&format!("{p}/jitter"), "a fraction must be between 0.0 and 1.0");
                        Jitter::None
                    }
                },
                Some(Value::String(s)) => match s.parse::<f64>() {
                    Ok(f) if (0.0..=1.0).contains(&f) => Jitter::Fraction(f),
                    _ => match timespan::parse(s) {
                        Ok(ms) => Jitter::Span(ms),
                        Err(e) => {
                            self.err(&format!("{p}/jitter"), &e);
                            Jitter::None
                        }
                    },
                },
                Some(_) => {
                    self.err(&format!("{p}/jitter"), "must be a fraction (0.0 to 1.0) or a timespan");
                    Jitter::None
                }
            };
            out.push(RetryPolicy {
                delay_ms: self.opt_timespan(o, p, "delay").unwrap_or(1000),
                max_delay_ms: self.opt_timespan(o, p, "maxDelay"),
                increment_ms: self.opt_timespan(o, p, "increment").unwrap_or(0),
                multiplier,
                max_attempts,
                jitter,
                name,
            });
        }
        out
    }

    fn state(&mut self, s: &Value, p: &str, names: &HashMap<String, usize>) -> Option<State> {
        let Some(o) = s.as_object() else {
            self.err(p, "a state must be an object");
            return None;
        };
        let name = self.req_str(o, p, "name");
        if let Some(st) = o.get("start") {
            if !st.is_boolean() {
                self.err(&format!("{p}/start"), "must be true or false");
            }
        }
        let input_filter = self.opt_expr(o, p, "inputFilter");
        let enter = o
            .get("enterAction")
            .and_then(|a| self.action(a, &format!("{p}/enterAction")));
        let enter_handler = self.opt_expr(o, p, "enterResultHandler");
        let exit = o
            .get("exitAction")
            .and_then(|a| self.action(a, &format!("{p}/exitAction")));
        let exit_handler = self.opt_expr(o, p, "exitResultHandler");
        let mut transitions = Vec::new();
        match o.get("transitions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(ts)) => {
                for (i, t) in ts.iter().enumerate() {
                    if let Some(t) = self.transition(t, &format!("{p}/transitions/{i}"), names) {
                        transitions.push(t);
                    }
                }
                let count = |k: Trigger| transitions.iter().filter(|t| t.trigger == k).count();
                if count(Trigger::Timeout) > 1 {
                    self.err(
                        &format!("{p}/transitions"),
                        "more than one timeout transition: a state may have only one",
                    );
                }
                if count(Trigger::Implicit) > 1 {
                    self.err(
                        &format!("{p}/transitions"),
                        "more than one transition without condition, events or timeout: only the first could ever fire",
                    );
                }
            }
            Some(_) => self.err(&format!("{p}/transitions"), "must be an array of transitions"),
        }
        Some(State {
            name: name?,
            pointer: p.to_string(),
            input_filter,
            enter,
            enter_handler,
            exit,
            exit_handler,
            transitions,
        })
    }

    fn transition(&mut self, t: &Value, p: &str, names: &HashMap<String, usize>) -> Option<Transition> {
        let Some(o) = t.as_object() else {
            self.err(p, "a transition must be an object");
            return None;
        };
        let next = match o.get("nextState") {
            None | Some(Value::Null) => None,
            Some(Value::String(n)) => match names.get(n) {
                Some(i) => Some(*i),
                None => {
                    self.err(&format!("{p}/nextState"), &format!("unknown state {n:?}"));
                    None
                }
            },
            Some(_) => {
                self.err(&format!("{p}/nextState"), "must be a state name");
                None
            }
        };
        let condition = self.condition(o, p);
        let timeout_ms = self.opt_timespan(o, p, "timeout");
        let mut groups = Vec::new();
        match o.get("eventGroups") {
            None | Some(Value::Null) => {}
            Some(Value::Array(gs)) if !gs.is_empty() => {
                for (i, g) in gs.iter().enumerate() {
                    if let Some(g) = self.group(g, &format!("{p}/eventGroups/{i}")) {
                        groups.push(g);
                    }
                }
            }
            Some(_) => self.err(&format!("{p}/eventGroups"), "must be a non-empty array of event groups"),
        }
        let has_groups = o.get("eventGroups").is_some_and(|g| !g.is_null());
        let trigger = match (o.contains_key("condition"), has_groups, o.contains_key("timeout")) {
            (_, _, true) if o.contains_key("condition") || has_groups => {
                self.err(p, "a timeout transition cannot also have a condition or eventGroups");
                Trigger::Timeout
            }
            (_, _, true) => Trigger::Timeout,
            (_, true, _) => Trigger::Events,
            (true, false, _) => Trigger::Condition,
            _ => Trigger::Implicit,
        };
        let action = o.get("action").and_then(|a| self.action(a, &format!("{p}/action")));
        let handler = self.opt_expr(o, p, "resultHandler");
        Some(Transition {
            next,
            condition,
            groups,
            timeout_ms,
            action,
            handler,
            trigger,
        })
    }

    fn group(&mut self, g: &Value, p: &str) -> Option<EventGroup> {
        let Some(o) = g.as_object() else {
            self.err(p, "an event group must be an object");
            return None;
        };
        let mut events = Vec::new();
        match o.get("events") {
            Some(Value::Array(names)) if !names.is_empty() => {
                for (i, n) in names.iter().enumerate() {
                    match n.as_str().map(|n| (n, self.events.get(n))) {
                        Some((_, Some(idx))) => events.push(*idx),
                        Some((n, None)) => self.err(
                            &format!("{p}/events/{i}"),
                            &format!("unknown event {n:?}: declare it in `events`"),
                        ),
                        None => self.err(&format!("{p}/events/{i}"), "must be an event name"),
                    }
                }
            }
            None => self.err(p, "missing required field `events`"),
            Some(_) => self.err(&format!("{p}/events"), "must be a non-empty array of event names"),
        }
        Some(EventGroup {
            events,
            condition: self.condition(o, p),
            handler: self.opt_expr(o, p, "resultHandler"),
        })
    }

    fn action(&mut self, a: &Value, p: &str) -> Option<ActionId> {
        let Some(o) = a.as_object() else {
            self.err(p, "an action must be an object");
            return None;
        };
        let name = self.opt_str(o, p, "name");
        let raw_type = self.req_str(o, p, "type")?;
        let Some(ty) = ACTION_TYPES.iter().find(|t| t.eq_ignore_ascii_case(&raw_type)) else {
            self.err(
                &format!("{p}/type"),
                &format!(
                    "unknown action type {raw_type:?}: expected one of {}",
                    ACTION_TYPES.join(", ")
                ),
            );
            return None;
        };
        let mut handlers = Vec::new();
        match o.get("errorHandlers") {
            None | Some(Value::Null) => {}
            Some(Value::Array(hs)) => {
                for (i, h) in hs.iter().enumerate() {
                    let hp = format!("{p}/errorHandlers/{i}");
                    let Some(ho) = h.as_object() else {
                        self.err(&hp, "an error handler must be an object");
                        continue;
                    };
                    let retry = match ho.get("retryPolicy") {
                        None | Some(Value::Null) => None,
                        Some(Value::String(r)) => match self.retries.get(r) {
                            Some(i) => Some(*i),
                            None => {
                                self.err(
                                    &format!("{hp}/retryPolicy"),
                                    &format!("unknown retry policy {r:?}: declare it in `retries`"),
                                );
                                None
                            }
                        },
                        Some(_) => {
                            self.err(&format!("{hp}/retryPolicy"), "must be a retry policy name");
                            None
                        }
                    };
                    handlers.push(ErrorHandler {
                        condition: self.condition(ho, &hp),
                        handler: self.opt_expr(ho, &hp, "resultHandler"),
                        retry,
                    });
                }
            }
            Some(_) => self.err(&format!("{p}/errorHandlers"), "must be an array of error handlers"),
        }
        if *ty != "invokeFunction" && o.get("delivery").is_some_and(|d| !d.is_null()) {
            self.err(
                &format!("{p}/delivery"),
                &format!("only invokeFunction actions have a delivery; this one is {ty:?}"),
            );
        }
        let kind = match *ty {
            "delay" => ActionKind::Delay {
                ms: self.req_timespan(o, p, "timeout")?,
            },
            "foreach" => {
                let input = match o.get("input") {
                    Some(Value::String(s)) => self.expr(s, &format!("{p}/input")),
                    Some(_) => {
                        self.err(&format!("{p}/input"), "must be a jq expression yielding an array");
                        None
                    }
                    None => {
                        self.err(p, "missing required field `input`");
                        None
                    }
                };
                let action = match o.get("action") {
                    Some(child) => self.action(child, &format!("{p}/action")),
                    None => {
                        self.err(p, "missing required field `action`");
                        None
                    }
                };
                let max_parallel = match o.get("maxParallel") {
                    None | Some(Value::Null) => 1,
                    Some(v) => match v.as_u64() {
                        Some(n) if n >= 1 => n as usize,
                        _ => {
                            self.err(&format!("{p}/maxParallel"), "must be an integer of at least 1");
                            1
                        }
                    },
                };
                ActionKind::Foreach {
                    input: input?,
                    action: action?,
                    max_parallel,
                }
            }
            "injectData" => match o.get("expression") {
                Some(e) => ActionKind::InjectData {
                    value: self.data_template(e, &format!("{p}/expression")),
                },
                None => {
                    self.err(p, "missing required field `expression`");
                    return None;
                }
            },
            "invokeFunction" => {
                let f = self.req_str(o, p, "functionName");
                let function = f.as_ref().and_then(|f| match self.functions.get(f) {
                    Some(i) => Some(*i),
                    None => {
                        self.err(
                            &format!("{p}/functionName"),
                            &format!("unknown function {f:?}: declare it in `functions`"),
                        );
                        None
                    }
                });
                let args = self.arguments(o, p);
                let wait = self.opt_bool(o, p, "waitForCompletion").unwrap_or(false);
                if let (Some(i), Some(f), false) = (function, &f, wait) {
                    if self.workers.contains(&i) {
                        let at = if o.contains_key("waitForCompletion") {
                            format!("{p}/waitForCompletion")
                        } else {
                            p.to_string()
                        };
                        self.err(
                            &at,
                            &format!("function {f:?} is a worker function: its task stays open until a worker answers it, so the action must set \"waitForCompletion\": true (use sendEvent to hand work off without waiting)"),
                        );
                    }
                }
                let kind = function.and_then(|i| self.kinds.get(&i).copied());
                let delivery = match kind {
                    Some(kind) => self.delivery(o, p, kind),
                    None => None,
                };
                ActionKind::InvokeFunction {
                    function: function?,
                    args,
                    timeout_ms: self.opt_timespan(o, p, "timeout"),
                    wait,
                    delivery,
                }
            }
            "invokeSubflow" => {
                let subflow = self.req_str(o, p, "subflowName");
                let args = self.arguments(o, p);
                ActionKind::InvokeSubflow {
                    subflow: subflow?,
                    args,
                    timeout_ms: self.opt_timespan(o, p, "timeout"),
                    wait: self.opt_bool(o, p, "waitForCompletion").unwrap_or(false),
                }
            }
            "parallel" => {
                let actions = self.children(o, p)?;
                let completion = match o.get("completionType").map(|c| c.as_str().map(str::to_ascii_lowercase)) {
                    None => Completion::And,
                    Some(Some(c)) if c == "and" => Completion::And,
                    Some(Some(c)) if c == "xor" => Completion::Xor,
                    Some(Some(c)) if c == "n_of_m" || c == "nofm" => match o.get("n").and_then(Value::as_u64) {
                        Some(n) if n >= 1 && (n as usize) <= actions.len() => Completion::NOfM(n as usize),
                        Some(_) => {
                            self.err(
                                &format!("{p}/n"),
                                &format!("must be between 1 and the number of actions ({})", actions.len()),
                            );
                            Completion::And
                        }
                        None => {
                            self.err(p, "completionType n_of_m needs an integer `n`");
                            Completion::And
                        }
                    },
                    _ => {
                        self.err(&format!("{p}/completionType"), "must be \"and\", \"xor\" or \"n_of_m\"");
                        Completion::And
                    }
                };
                ActionKind::Parallel { actions, completion }
            }
            "sendEvent" => {
                let e = self.req_str(o, p, "event");
                let event = e.and_then(|e| match self.events.get(&e) {
                    Some(i) => Some(*i),
                    None => {
                        self.err(
                            &format!("{p}/event"),
                            &format!("unknown event {e:?}: declare it in `events`"),
                        );
                        None
                    }
                });
                let data = o
                    .get("expression")
                    .filter(|e| !e.is_null())
                    .map(|e| self.data_template(e, &format!("{p}/expression")));
                let mut attributes = Vec::new();
                match o.get("contextAttributes") {
                    None | Some(Value::Null) => {}
                    Some(Value::Object(m)) => {
                        for (k, val) in m {
                            let ap = format!("{p}/contextAttributes/{}", esc(k));
                            let lower = k.to_ascii_lowercase();
                            if crate::engine::event::CORE.contains(&lower.as_str()) || lower == "sm4cinstanceid" {
                                self.err(
                                    &ap,
                                    &format!("{k:?} is a CloudEvents attribute the runtime sets; choose another name"),
                                );
                                continue;
                            }
                            if lower.is_empty() || !lower.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                            {
                                self.err(
                                    &ap,
                                    &format!(
                                        "{k:?} is not a valid CloudEvents attribute name (letters and digits only)"
                                    ),
                                );
                                continue;
                            }
                            let t = self.template(val, &ap);
                            attributes.push((k.clone(), t));
                        }
                    }
                    Some(_) => self.err(
                        &format!("{p}/contextAttributes"),
                        "must be an object of attribute names to values",
                    ),
                }
                ActionKind::SendEvent {
                    event: event?,
                    data,
                    attributes,
                }
            }
            "sequence" => ActionKind::Sequence {
                actions: self.children(o, p)?,
            },
            _ => unreachable!("ACTION_TYPES covers every type"),
        };
        self.actions.push(Action {
            name,
            pointer: p.to_string(),
            kind,
            handlers,
        });
        Some(self.actions.len() - 1)
    }

    fn arguments(&mut self, o: &Map<String, Value>, p: &str) -> Template {
        match o.get("arguments") {
            None | Some(Value::Null) => Template::constant(&Value::Object(Map::new())),
            Some(v @ Value::Object(_)) => self.template(v, &format!("{p}/arguments")),
            Some(Value::String(s)) if is_expression(s) => {
                self.template(&Value::String(s.clone()), &format!("{p}/arguments"))
            }
            Some(_) => {
                self.err(
                    &format!("{p}/arguments"),
                    "must be an object of argument names to values",
                );
                Template::constant(&Value::Null)
            }
        }
    }

    fn children(&mut self, o: &Map<String, Value>, p: &str) -> Option<Vec<ActionId>> {
        match o.get("actions") {
            Some(Value::Array(list)) if !list.is_empty() => {
                // Outputs are keyed by name (else index): two children with one key would lose an output.
                let mut keys: Vec<String> = Vec::new();
                for (i, c) in list.iter().enumerate() {
                    let key = c
                        .get("name")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .unwrap_or_else(|| i.to_string());
                    if keys.contains(&key) {
                        self.err(
                            &format!("{p}/actions/{i}/name"),
                            &format!("another action here already has the output key {key:?}"),
                        );
                    }
                    keys.push(key);
                }
                let ids: Vec<Option<ActionId>> = list
                    .iter()
                    .enumerate()
                    .map(|(i, c)| self.action(c, &format!("{p}/actions/{i}")))
                    .collect();
                ids.into_iter().collect()
            }
            Some(_) => {
                self.err(&format!("{p}/actions"), "must be a non-empty array of actions");
                None
            }
            None => {
                self.err(p, "missing required field `actions`");
                None
            }
        }
    }
}

/// A resolver for definitions without URI references: every reference is refused.
pub fn no_files(uri: &str) -> Result<Value, String> {
    Err(format!("cannot resolve {uri:?}: no file resolver was given"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errors(doc: Value) -> Vec<String> {
        match load(&doc, &mut no_files, LoadOptions::default()) {
            Ok(_) => Vec::new(),
            Err(e) => e.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn asl_versions_are_pinned() {
        // Taken from the build before the hash moved to the kernel: a stored ASL definition keeps
        // its version.
        let doc = json!({"StartAt": "A", "States": {"A": {"Type": "Pass", "End": true}}});
        let machine = load(&doc, &mut no_files, LoadOptions::default()).unwrap();
        assert_eq!(machine.version, "f3db07734f1365a4");
    }

    #[test]
    fn sibling_output_keys_must_differ() {
        let errs = errors(
            json!({"id": "x", "name": "x", "version": "1", "states": [{"name": "A", "start": true,
            "enterAction": {"type": "parallel", "actions": [
                {"name": "a", "type": "injectData", "expression": "1"},
                {"type": "injectData", "expression": "2"},
                {"name": "a", "type": "injectData", "expression": "3"}]}}]}),
        );
        assert_eq!(
            errs,
            vec!["/states/0/enterAction/actions/2/name: another action here already has the output key \"a\""]
        );
    }

    #[test]
    fn sent_events_cannot_overwrite_core_attributes() {
        let errs = errors(
            json!({"id": "x", "name": "x", "version": "1", "events": [{"name": "e"}],
            "states": [{"name": "A", "start": true, "enterAction": {"type": "sendEvent", "event": "e",
                "contextAttributes": {"Type": "x", "bad-name": "y", "customerId": "${ .id }"}}}]}),
        );
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs[0].contains("/contextAttributes/Type") || errs[1].contains("/contextAttributes/Type"),
            "{errs:?}"
        );
        assert!(
            errs.iter().any(|e| e.contains("bad-name") && e.contains("not a valid")),
            "{errs:?}"
        );
    }

    #[test]
    fn every_error_is_reported_with_its_pointer() {
        let errs = errors(
            json!({"id": "x", "name": "x", "version": "1", "functions": [{"name": "f", "operation": "o"}],
            "states": [
                {"name": "A", "start": true, "transitions": [{"nextState": "Nowhere"}],
                 "enterAction": {"type": "invokeFunction", "functionName": "g"}},
                {"name": "A", "enterAction": {"type": "delay", "timeout": "soon"}}]}),
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("/states/1/name: duplicate state name")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("/states/0/transitions/0/nextState: unknown state")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("/states/0/enterAction/functionName: unknown function")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("/states/1/enterAction/timeout: invalid timespan")),
            "{errs:?}"
        );
    }
}
