//! `sm4c debug ...`: the step debugger's client commands (breakpoints on a definition's states,
//! resuming and stepping paused instances), talking to `sm4c serve` like the other client commands.

use crate::client::{call, print_json, s, Failure, Remote};
use serde_json::{json, Value};

/// The step debugger.
#[derive(clap::Subcommand, Debug)]
pub enum DebugCommand {
    /// Add a breakpoint to a definition: on entering a state (`--state S`), before one of its
    /// actions (`--action enter|exit|tN`, N a transition's index from 0) or before its transitions
    /// fire (`--transition`, or `--transition N` for one). Instances pause there (status `paused`).
    Break {
        /// Definition id.
        definition: String,
        /// The state.
        #[arg(long)]
        state: String,
        #[command(flatten)]
        point: Point,
        #[command(flatten)]
        remote: Remote,
    },
    /// List the breakpoints, of one definition or of all.
    List {
        /// Definition id (default: every definition).
        definition: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Clear the breakpoints of a definition, or only the one that `--state` (with `--action` or
    /// `--transition`) names. Paused instances stay paused until resumed.
    Clear {
        /// Definition id.
        definition: String,
        /// The state of the one breakpoint to clear.
        #[arg(long)]
        state: Option<String>,
        #[command(flatten)]
        point: Point,
        #[command(flatten)]
        remote: Remote,
    },
    /// Resume a paused instance.
    Resume {
        /// Instance id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Step a paused instance: it goes on and pauses again at the next breakpoint-able point.
    Step {
        /// Instance id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
}

/// Where in a state a breakpoint is (neither flag: on entering it).
#[derive(clap::Args, Debug)]
pub struct Point {
    /// Before this action of the state: enter, exit, or tN (the action of transition N).
    #[arg(long, conflicts_with = "transition")]
    action: Option<String>,
    /// Before a transition of the state fires: any, or the one with this index (from 0).
    #[arg(long, num_args = 0..=1, default_missing_value = "any", value_name = "N")]
    transition: Option<String>,
}

impl Point {
    fn breakpoint(&self, state: &str) -> Result<Value, Failure> {
        Ok(match (&self.action, self.transition.as_deref()) {
            (Some(a), _) => json!({"on": "action", "state": state, "action": a}),
            (None, Some("any")) => json!({"on": "transition", "state": state}),
            (None, Some(n)) => {
                let n: u64 = n
                    .parse()
                    .map_err(|_| (2, format!("--transition {n}: not a transition index (0, 1, ...)")))?;
                json!({"on": "transition", "state": state, "transition": n})
            }
            (None, None) => json!({"on": "enter", "state": state}),
        })
    }
}

/// A breakpoint (or the point an instance paused at) in words.
pub fn describe(b: &Value) -> String {
    let state = s(&b["state"]);
    match b["on"].as_str() {
        Some("enter") => format!("entering {state}"),
        Some("action") => match b["action"].as_str().unwrap_or_default() {
            a @ ("enter" | "exit") => format!("before the {a} action of {state}"),
            t => format!(
                "before the action of transition {} of {state}",
                t.trim_start_matches('t')
            ),
        },
        Some("transition") => match b.get("transition") {
            Some(n) => format!("before transition {n} of {state}"),
            None => format!("before any transition of {state}"),
        },
        _ => b.to_string(),
    }
}

fn path(definition: &str) -> String {
    format!("/definitions/{}/breakpoints", sm4c_invoke::rest::encode(definition))
}

fn put(remote: &Remote, definition: &str, list: Vec<Value>) -> Result<Value, Failure> {
    let body = json!({"breakpoints": list}).to_string().into_bytes();
    call(remote, "PUT", &path(definition), Some(("application/json", body)))
}

fn print_set(remote: &Remote, v: &Value) {
    if remote.json {
        print_json(v);
        return;
    }
    let list = v["breakpoints"].as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        println!("{}: no breakpoints", s(&v["definition"]));
    }
    for b in &list {
        println!("{}: {}", s(&v["definition"]), describe(b));
    }
}

/// Runs a debugger command.
pub fn exec(cmd: DebugCommand) -> Result<(), Failure> {
    match cmd {
        DebugCommand::Break {
            definition,
            state,
            point,
            remote,
        } => {
            let b = point.breakpoint(&state)?;
            let now = call(&remote, "GET", &path(&definition), None)?;
            let mut list = now["breakpoints"].as_array().cloned().unwrap_or_default();
            if !list.contains(&b) {
                list.push(b);
            }
            print_set(&remote, &put(&remote, &definition, list)?);
        }
        DebugCommand::List { definition, remote } => match definition {
            Some(d) => print_set(&remote, &call(&remote, "GET", &path(&d), None)?),
            None => {
                let v = call(&remote, "GET", "/breakpoints", None)?;
                if remote.json {
                    print_json(&v);
                } else {
                    let all = v["definitions"].as_array().cloned().unwrap_or_default();
                    if all.is_empty() {
                        println!("no breakpoints");
                    }
                    for d in &all {
                        print_set(&remote, d);
                    }
                }
            }
        },
        DebugCommand::Clear {
            definition,
            state,
            point,
            remote,
        } => {
            let v = match state {
                None => call(&remote, "DELETE", &path(&definition), None)?,
                Some(state) => {
                    let b = point.breakpoint(&state)?;
                    let now = call(&remote, "GET", &path(&definition), None)?;
                    let mut list = now["breakpoints"].as_array().cloned().unwrap_or_default();
                    let before = list.len();
                    list.retain(|x| *x != b);
                    if list.len() == before {
                        return Err((1, format!("{definition} has no breakpoint {}", describe(&b))));
                    }
                    put(&remote, &definition, list)?
                }
            };
            print_set(&remote, &v);
        }
        DebugCommand::Resume { id, remote } => go(&remote, &id, "resume")?,
        DebugCommand::Step { id, remote } => go(&remote, &id, "step")?,
    }
    Ok(())
}

/// Resumes or steps an instance and says where it is now.
fn go(remote: &Remote, id: &str, how: &str) -> Result<(), Failure> {
    let v = call(
        remote,
        "POST",
        &format!("/instances/{}/{how}", sm4c_invoke::rest::encode(id)),
        None,
    )?;
    if remote.json {
        print_json(&v);
    } else {
        match v.get("pausedAt") {
            Some(at) => println!("{id} is paused {}", describe(at)),
            None => println!("{id} is {} (state {})", s(&v["status"]), s(&v["state"])),
        }
        println!(
            "data:\n{}",
            serde_json::to_string_pretty(&v["data"]).unwrap_or_default()
        );
    }
    Ok(())
}
