//! Worker task lists: tasks of `worker` functions waiting for a worker, workers waiting for a task,
//! and the task tokens by which workers answer.
//!
//! A task token is the base64url (no padding) of `<instance id>\n<operation id>`
//! ([`sm4c_runtime::task_token`]): deterministic, so a task handed out again after a restart has
//! the same token, and opaque to workers. It is not a secret: whoever can reach the API can answer
//! any task, as they can cancel any instance.

use serde_json::{json, Value};
use sm4c_runtime::model::{FunctionKind, Machine, TaskTimeouts};
use sm4c_runtime::{ErrorInfo, ErrorKind};
use std::collections::{BTreeMap, HashMap, VecDeque};
use tokio::sync::oneshot;

/// CloudEvent type that completes a task (`data` is the result).
pub const EVENT_COMPLETED: &str = "sm4c.task.completed";
/// CloudEvent type that fails a task (`data` is `{error?, message?, details?}`).
pub const EVENT_FAILED: &str = "sm4c.task.failed";
/// CloudEvent type that records a heartbeat (`data`, if any, is the progress).
pub const EVENT_HEARTBEAT: &str = "sm4c.task.heartbeat";
/// CloudEvent type of a task on a Kafka task list topic (`data` is the task, as [`Task::to_json`]).
pub const EVENT_SCHEDULED: &str = "sm4c.task.scheduled";
/// The CloudEvent extension attribute that carries the task token.
pub const TOKEN_ATTRIBUTE: &str = "sm4ctasktoken";

/// The task of one `worker` call.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The calling instance.
    pub instance: String,
    /// The call's operation id.
    pub op: String,
    /// Function name.
    pub function: String,
    /// The task list (the function's `operation`).
    pub task_list: String,
    /// Resolved arguments.
    pub arguments: Value,
    /// The function's timeouts.
    pub timeouts: TaskTimeouts,
}

impl Task {
    /// The task an `InvokeFunction` effect of a `worker` function asks for.
    pub fn from_effect(instance: &str, effect: &sm4c_runtime::Effect, machine: &Machine) -> Option<Task> {
        let (call, _) = crate::functions::FunctionCall::from_effect(instance, effect)?;
        (call.function_type == "worker").then(|| Task::of_call(call, machine))
    }

    /// The task of a call of a `worker` function (its timeouts come from the function's definition).
    pub fn of_call(call: crate::functions::FunctionCall, machine: &Machine) -> Task {
        let timeouts = machine
            .functions
            .iter()
            .find(|f| f.name == call.function)
            .and_then(|f| match f.kind {
                FunctionKind::Worker(t) => Some(t),
                _ => None,
            })
            .unwrap_or_default();
        Task {
            instance: call.instance,
            op: call.op,
            function: call.function,
            task_list: call.operation,
            arguments: call.arguments,
            timeouts,
        }
    }

    /// The task as a function call, for hosts where the application's functions do the work
    /// (the in-memory host): the call is the task's start.
    pub fn call(&self) -> crate::functions::FunctionCall {
        crate::functions::FunctionCall {
            instance: self.instance.clone(),
            op: self.op.clone(),
            function: self.function.clone(),
            operation: self.task_list.clone(),
            function_type: "worker".into(),
            arguments: self.arguments.clone(),
            traceparent: None,
            delivery: Default::default(),
        }
    }

    /// The attempt this task belongs to (1 for the first; a retry is a new task).
    pub fn attempt(&self) -> u32 {
        self.op.rsplit_once('#').and_then(|(_, n)| n.parse().ok()).unwrap_or(1)
    }

    /// The task as a CloudEvent, as it goes on a Kafka task list topic: its id is the token (a
    /// redelivered task keeps it), `time` is when it was scheduled (ms since the epoch).
    pub fn to_event(&self, scheduled_at: i64) -> Value {
        let token = token(&self.instance, &self.op);
        let mut ev = json!({
            "specversion": "1.0",
            "id": token,
            "source": format!("sm4c/tasklists/{}", self.task_list),
            "type": EVENT_SCHEDULED,
            "subject": self.function,
            "datacontenttype": "application/json",
            "sm4cinstanceid": self.instance,
            TOKEN_ATTRIBUTE: token,
            "data": self.to_json(),
        });
        if scheduled_at > 0 {
            ev["time"] = json!(sm4c_runtime::engine::rfc3339(scheduled_at));
        }
        ev
    }

    /// The task as a worker receives it.
    pub fn to_json(&self) -> Value {
        let mut timeouts = serde_json::Map::new();
        let t = &self.timeouts;
        for (key, ms) in [
            ("scheduleToStartMs", t.schedule_to_start_ms),
            ("startToCloseMs", t.start_to_close_ms),
            ("heartbeatMs", t.heartbeat_ms),
            ("scheduleToCloseMs", t.schedule_to_close_ms),
        ] {
            if let Some(ms) = ms {
                timeouts.insert(key.into(), json!(ms));
            }
        }
        json!({
            "token": token(&self.instance, &self.op),
            "taskList": self.task_list,
            "function": self.function,
            "arguments": self.arguments,
            "instanceId": self.instance,
            "operation": self.op,
            "attempt": self.attempt(),
            "timeouts": timeouts,
        })
    }
}

/// What a worker says about a task.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Answer {
    /// Done, with this result.
    Complete(Value),
    /// Failed, with this error.
    Fail(ErrorInfo),
    /// Still working, with optional progress.
    Heartbeat(Option<Value>),
}

impl Answer {
    /// A failure as a worker reports it: `{"error"?: CODE, "message"?: TEXT, "details"?: ANY}`. The
    /// instance sees a `functionError` whose `details` keep the worker's `error` and `details`.
    pub fn failure(body: &Value) -> Result<Answer, String> {
        let obj = match body {
            Value::Null => &serde_json::Map::new(),
            Value::Object(o) => o,
            _ => return Err("a failure is a JSON object {\"error\"?, \"message\"?, \"details\"?}".into()),
        };
        if let Some(k) = obj
            .keys()
            .find(|k| !matches!(k.as_str(), "error" | "message" | "details"))
        {
            return Err(format!(
                "unknown field {k:?} in a failure: expected \"error\", \"message\" and \"details\""
            ));
        }
        let text = |key: &str| match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("\"{key}\" of a failure must be a string")),
        };
        let (code, message) = (text("error")?, text("message")?);
        let message = message.unwrap_or_else(|| match &code {
            Some(c) => format!("the worker failed the task: {c}"),
            None => "the worker failed the task".into(),
        });
        let mut details = serde_json::Map::new();
        if let Some(c) = code {
            details.insert("error".into(), json!(c));
        }
        if let Some(d) = obj.get("details").filter(|d| !d.is_null()) {
            details.insert("details".into(), d.clone());
        }
        let mut e = ErrorInfo::new(ErrorKind::FunctionError, message);
        if !details.is_empty() {
            e.details = Some(Value::Object(details));
        }
        Ok(Answer::Fail(e))
    }

    /// The answer a CloudEvent of type `sm4c.task.*` carries, with its token; `Ok(None)` for other
    /// events.
    pub fn from_event(event: &Value) -> Result<Option<(String, Answer)>, String> {
        let Some(kind) = event.get("type").and_then(Value::as_str) else {
            return Ok(None);
        };
        if !kind.starts_with("sm4c.task.") {
            return Ok(None);
        }
        let data = event.get("data").cloned().unwrap_or(Value::Null);
        let answer = match kind {
            EVENT_COMPLETED => Answer::Complete(data),
            EVENT_FAILED => Answer::failure(&data)?,
            EVENT_HEARTBEAT => Answer::Heartbeat((!data.is_null()).then_some(data)),
            other => {
                return Err(format!(
                    "unknown task event type {other:?}: use {EVENT_COMPLETED}, {EVENT_FAILED} or {EVENT_HEARTBEAT}"
                ))
            }
        };
        let token = sm4c_runtime::engine::event::attribute_text(event, TOKEN_ATTRIBUTE).ok_or_else(|| {
            format!("a {kind} event needs the task token in its {TOKEN_ATTRIBUTE} extension attribute")
        })?;
        Ok(Some((token, answer)))
    }
}

pub use sm4c_runtime::task_token::{decode_token, token};

/// A worker waiting for a task of one task list.
pub struct Poller {
    /// The name the worker gave, if any.
    pub worker: Option<String>,
    /// When it stops waiting.
    pub deadline: tokio::time::Instant,
    /// Where its task goes (dropping it tells the worker there is none).
    pub reply: oneshot::Sender<Value>,
}

impl Poller {
    fn gone(&self, now: tokio::time::Instant) -> bool {
        self.reply.is_closed() || self.deadline <= now
    }
}

/// Tasks waiting for workers and workers waiting for tasks, by task list. Owned by the durable
/// host's deciding task; tasks are added once the step that scheduled them is committed.
#[derive(Default)]
pub struct TaskLists {
    queued: HashMap<String, VecDeque<Task>>,
    pollers: HashMap<String, VecDeque<Poller>>,
}

impl TaskLists {
    /// Adds a task at the back of its list (`front` for one a worker left); returns it with a
    /// waiting worker when one can take it at once.
    pub fn offer(&mut self, task: Task, front: bool) -> Option<(Task, Poller)> {
        if let Some(p) = self.waiting(&task.task_list) {
            return Some((task, p));
        }
        let list = self.queued.entry(task.task_list.clone()).or_default();
        if front {
            list.push_front(task);
        } else {
            list.push_back(task);
        }
        None
    }

    /// A worker asks for a task: returns the oldest with the worker, or keeps the worker waiting
    /// until its deadline.
    pub fn poll(&mut self, list: &str, poller: Poller, now: tokio::time::Instant) -> Option<(Task, Poller)> {
        match self.queued.get_mut(list).and_then(VecDeque::pop_front) {
            Some(task) => Some((task, poller)),
            None if poller.gone(now) => None,
            None => {
                self.pollers.entry(list.to_string()).or_default().push_back(poller);
                None
            }
        }
    }

    fn waiting(&mut self, list: &str) -> Option<Poller> {
        let now = tokio::time::Instant::now();
        let waiting = self.pollers.get_mut(list)?;
        while let Some(p) = waiting.pop_front() {
            if !p.gone(now) {
                return Some(p);
            }
        }
        None
    }

    /// Sends away the workers whose wait is over or who left.
    pub fn expire(&mut self, now: tokio::time::Instant) {
        for waiting in self.pollers.values_mut() {
            waiting.retain(|p| !p.gone(now));
        }
        self.pollers.retain(|_, w| !w.is_empty());
    }

    /// The earliest deadline of a waiting worker.
    pub fn next_deadline(&self) -> Option<tokio::time::Instant> {
        self.pollers.values().flatten().map(|p| p.deadline).min()
    }

    /// Takes a task off its list (answered, cancelled or timed out); `None` if it is not queued.
    pub fn remove(&mut self, instance: &str, op: &str) -> Option<Task> {
        for list in self.queued.values_mut() {
            if let Some(i) = list.iter().position(|t| t.instance == instance && t.op == op) {
                return list.remove(i);
            }
        }
        None
    }

    /// Sends every waiting worker away without a task (the server is stopping).
    pub fn release_pollers(&mut self) {
        self.pollers.clear();
    }

    /// Per task list: tasks queued and workers waiting. `known` lists are included even when empty.
    pub fn summary<'a>(&self, known: impl Iterator<Item = &'a str>) -> BTreeMap<String, (usize, usize)> {
        let mut out: BTreeMap<String, (usize, usize)> = known.map(|k| (k.to_string(), (0, 0))).collect();
        for (name, q) in &self.queued {
            out.entry(name.clone()).or_default().0 = q.len();
        }
        for (name, p) in &self.pollers {
            out.entry(name.clone()).or_default().1 = p.len();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_come_from_the_operation_id() {
        let mut t = Task {
            instance: "i".into(),
            op: "1.enter".into(),
            function: "f".into(),
            task_list: "l".into(),
            arguments: Value::Null,
            timeouts: TaskTimeouts::default(),
        };
        assert_eq!(t.attempt(), 1);
        t.op = "1.enter/0#3".into();
        assert_eq!(t.attempt(), 3);
        t.op = "1.enter#2/0".into();
        assert_eq!(t.attempt(), 1, "the retry of a parent is not this call's retry");
    }

    #[test]
    fn failures_and_task_events_are_read_strictly() {
        let Ok(Answer::Fail(e)) =
            Answer::failure(&json!({"error": "OutOfStock", "message": "none left", "details": {"sku": 1}}))
        else {
            panic!("a failure")
        };
        assert_eq!(e.kind, "functionError");
        assert_eq!(e.message, "none left");
        assert_eq!(e.details, Some(json!({"error": "OutOfStock", "details": {"sku": 1}})));
        assert!(Answer::failure(&json!({"reason": "x"}))
            .unwrap_err()
            .contains("\"reason\""));
        assert!(Answer::failure(&json!([1])).is_err());
        let ev = json!({"specversion": "1.0", "id": "1", "source": "w", "type": EVENT_COMPLETED, "sm4ctasktoken": "abc", "data": {"n": 1}});
        assert_eq!(
            Answer::from_event(&ev).unwrap(),
            Some(("abc".to_string(), Answer::Complete(json!({"n": 1}))))
        );
        let mut no_token = ev.clone();
        no_token.as_object_mut().unwrap().remove("sm4ctasktoken");
        assert!(Answer::from_event(&no_token).unwrap_err().contains(TOKEN_ATTRIBUTE));
        let mut other = ev.clone();
        other["type"] = json!("sm4c.task.done");
        assert!(Answer::from_event(&other).is_err());
        other["type"] = json!("com.example.done");
        assert_eq!(Answer::from_event(&other).unwrap(), None);
    }
}
