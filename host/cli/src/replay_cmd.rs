//! `sm4c replay HISTORY --definition FILE`: would this definition decide what the history
//! recorded? The history's inputs run through the definition (SM4C or ASL), and the first decision
//! it makes differently is shown field by field. A folder of histories is a regression suite: one
//! line per history.
//!
//! Exit 0: the same decisions everywhere; 1: a history diverges; 2: a history cannot be read, or
//! the definition is invalid.

use crate::files;
use serde_json::{json, Value};
use sm4c_runtime::engine::history::{self, Comparison, History, HistoryError};
use sm4c_runtime::{Limits, Machine};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// The arguments of `sm4c replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// A history, as `sm4c history ID --json` prints it or `GET /instances/{id}/history` answers
    /// it (all its pages), or a folder of them (`*.json`, one line each).
    history: PathBuf,
    /// The definition to replay it with (SM4C or ASL).
    #[arg(long, value_name = "FILE")]
    definition: PathBuf,
    /// The instance's id, for a history that does not name it (the ids of the events it sends
    /// derive from it).
    #[arg(long)]
    id: Option<String>,
    /// Print the outcome as JSON (an array of them for a folder).
    #[arg(long)]
    json: bool,
}

/// One history's outcome.
enum Outcome {
    Compared(Box<Comparison>),
    Unreadable(String),
}

/// Runs `sm4c replay`.
pub fn run(args: ReplayArgs) -> ExitCode {
    let machine = match files::load_definition(&args.definition, Limits::default()) {
        Ok(m) => Arc::new(m),
        Err(errs) => return crate::report(&errs),
    };
    if args.history.is_dir() {
        return folder(&args, machine);
    }
    let outcome = one(&args.history, args.id.as_deref(), &machine);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&outcome_json(&args.history, &outcome)).unwrap_or_default()
        );
    } else {
        match &outcome {
            Outcome::Compared(c) => print!("{}", text(c)),
            Outcome::Unreadable(e) => eprintln!("{e}"),
        }
    }
    code(&outcome)
}

/// Replays every `*.json` file of a folder, in name order.
fn folder(args: &ReplayArgs, machine: Arc<Machine>) -> ExitCode {
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(&args.history) {
        Ok(d) => d
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "json"))
            .collect(),
        Err(e) => {
            eprintln!("{}: cannot read the folder: {e}", args.history.display());
            return ExitCode::from(2);
        }
    };
    paths.sort();
    if paths.is_empty() {
        eprintln!("{}: no histories (*.json) in this folder", args.history.display());
        return ExitCode::from(2);
    }
    let outcomes: Vec<(PathBuf, Outcome)> = paths
        .into_iter()
        .map(|p| {
            let o = one(&p, args.id.as_deref(), &machine);
            (p, o)
        })
        .collect();
    if args.json {
        let all: Vec<Value> = outcomes.iter().map(|(p, o)| outcome_json(p, o)).collect();
        println!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
    } else {
        for (p, o) in &outcomes {
            let name = p.display();
            match o {
                Outcome::Compared(c) => match &c.divergence {
                    None => println!(
                        "same      {name}: {} inputs, {} decisions{}",
                        c.inputs,
                        c.decisions,
                        match c.notes.len() {
                            0 => String::new(),
                            n => format!(", {n} notes"),
                        }
                    ),
                    Some(d) => println!("diverges  {name}: {}", d.summary()),
                },
                Outcome::Unreadable(e) => println!("error     {e}"),
            }
        }
    }
    let codes: Vec<u8> = outcomes.iter().map(|(_, o)| code_of(o)).collect();
    ExitCode::from(codes.into_iter().max().unwrap_or(0))
}

/// Reads and replays one history.
fn one(path: &Path, id: Option<&str>, machine: &Arc<Machine>) -> Outcome {
    let v = match files::read_json(path) {
        Ok(v) => v,
        Err(e) => return Outcome::Unreadable(e.to_string()),
    };
    let h = match History::from_json(&v) {
        Ok(h) => h,
        Err(e) => return Outcome::Unreadable(unreadable(path, &e)),
    };
    if !history::has_start(&h) {
        return Outcome::Unreadable(format!(
            "{}: the history does not hold the instance's start (is it a page after the first? `sm4c history ID --json` prints every page)",
            path.display()
        ));
    }
    let (id, guessed) = match (id, &h.id, h.sent_by()) {
        (Some(id), _, _) => (id.to_string(), false),
        (None, Some(id), _) => (id.clone(), false),
        (None, None, Some(id)) => (id, false),
        (None, None, None) => ("replay".to_string(), true),
    };
    let mut c = history::compare(machine.clone(), &id, &h);
    if guessed {
        c.notes
            .push("the history does not name its instance: it was replayed as \"replay\" (--id names it)".into());
    }
    Outcome::Compared(Box::new(c))
}

fn unreadable(path: &Path, e: &HistoryError) -> String {
    files::ferr(path, e.pointer.clone(), e.message.clone()).to_string()
}

fn code(o: &Outcome) -> ExitCode {
    ExitCode::from(code_of(o))
}

fn code_of(o: &Outcome) -> u8 {
    match o {
        Outcome::Compared(c) if c.divergence.is_none() => 0,
        Outcome::Compared(_) => 1,
        Outcome::Unreadable(_) => 2,
    }
}

fn outcome_json(path: &Path, o: &Outcome) -> Value {
    let mut v = match o {
        Outcome::Compared(c) => history::comparison_json(c),
        Outcome::Unreadable(e) => json!({"outcome": "error", "error": e}),
    };
    v["history"] = json!(path.display().to_string());
    v
}

/// The outcome as a person reads it.
fn text(c: &Comparison) -> String {
    let mut out = String::new();
    match &c.divergence {
        None => {
            out += &format!(
                "same decisions as recorded: {} inputs, {} decisions\n",
                c.inputs, c.decisions
            )
        }
        Some(d) => {
            let state = d
                .state
                .as_deref()
                .map(|s| format!(" in state {s:?}"))
                .unwrap_or_default();
            out += &format!("diverges at entry {}{state}\n", d.entry);
            let side = |e: &Option<sm4c_runtime::Entry>| match e {
                Some(e) => history::describe(e),
                None => "nothing".into(),
            };
            out += &format!("  recorded: {}\n", side(&d.recorded));
            out += &format!("  decided:  {}\n", side(&d.decided));
            for f in &d.differences {
                out += &format!("  {}: {} recorded, {} decided\n", f.pointer, f.recorded, f.decided);
            }
            out += &format!(
                "({} inputs and {} decisions agreed before it)\n",
                c.inputs.saturating_sub(1),
                c.decisions
            );
        }
    }
    for n in &c.notes {
        out += &format!("note: {n}\n");
    }
    out
}
