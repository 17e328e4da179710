//! `sm4c batch`: batch operations of a server (`POST /batches`): posts one, follows its progress
//! (a progress bar on a terminal, plain lines otherwise) and prints the final report.

use crate::client::{call, print_json, Failure, Remote};
use clap::Subcommand;
use serde_json::{json, Map, Value};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `sm4c batch ...`.
#[derive(clap::Args)]
pub struct BatchArgs {
    #[command(subcommand)]
    command: BatchCommand,
}

/// Which instances, and how the command follows the batch: what every operation takes.
#[derive(clap::Args)]
struct Target {
    /// The instances to act on: KEY=VALUE pairs, comma-separated or repeated; keys: definition,
    /// version, status, state, startedAfter, startedBefore (RFC 3339). `--where all` is every
    /// instance.
    #[arg(long = "where", value_name = "KEY=VALUE,...", required = true)]
    filter: Vec<String>,
    /// Only the instances whose data this jq expression maps to true.
    #[arg(long, value_name = "EXPR")]
    jq: Option<String>,
    /// List what would be touched, and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// At most this many instances per second (the server's --batch-rate bounds it too).
    #[arg(long, value_name = "N")]
    rate: Option<u32>,
    /// Print the batch's id and return at once, without following it.
    #[arg(long)]
    no_wait: bool,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Subcommand)]
enum BatchCommand {
    /// Cancel every instance that matches.
    Cancel {
        #[command(flatten)]
        target: Target,
    },
    /// Redrive every failed or timed-out instance that matches, after an optional update of its data.
    Redrive {
        /// A jq expression over each instance's data, applied before it goes on.
        #[arg(long, value_name = "JQ")]
        update: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Move every instance that matches to another version of its definition.
    Migrate {
        /// The version to move to.
        #[arg(long = "to-version", value_name = "V")]
        to_version: String,
        /// An old state name and its name in the new version, where they differ (repeated).
        #[arg(long = "map-state", value_name = "OLD=NEW")]
        map_state: Vec<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Send every instance that matches a CloudEvent (addressed to it with sm4cinstanceid).
    Send {
        /// The CloudEvent, a JSON file with type, source and data (no id: each gets its own).
        #[arg(long, value_name = "FILE")]
        event: PathBuf,
        #[command(flatten)]
        target: Target,
    },
    /// Show a batch: matched, done, failed (with why) and whether it is running.
    Status {
        /// The batch's id.
        id: String,
        /// Follow it until it ends, with a progress bar.
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// List the server's batches, newest first.
    List {
        #[command(flatten)]
        remote: Remote,
    },
    /// Stop a running batch: instances it has not reached are left as they are.
    Stop {
        /// The batch's id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
}

/// The keys `--where` takes: those of a batch's `where`, but `jq` (given with `--jq`).
fn where_keys() -> impl Iterator<Item = &'static str> {
    sm4c_host::batch::WHERE_FIELDS.into_iter().filter(|k| *k != "jq")
}

/// Runs `sm4c batch`: exit 0 when every instance was done, 1 when one failed, the batch was
/// stopped, or the server refused the request, 2 for usage or connection errors.
pub fn run(args: BatchArgs) -> ExitCode {
    match exec(args.command) {
        Ok(code) => code,
        Err((code, msg)) => {
            eprintln!("sm4c: {msg}");
            ExitCode::from(code)
        }
    }
}

fn exec(cmd: BatchCommand) -> Result<ExitCode, Failure> {
    let path = |id: &str, verb: &str| format!("/batches/{}{verb}", sm4c_invoke::rest::encode(id));
    let (op, mut body, target) = match cmd {
        BatchCommand::Cancel { target } => ("cancel", Map::new(), target),
        BatchCommand::Redrive { update, target } => {
            let mut b = Map::new();
            if let Some(u) = update {
                b.insert("update".into(), json!(u));
            }
            ("redrive", b, target)
        }
        BatchCommand::Migrate {
            to_version,
            map_state,
            target,
        } => {
            let mut states = Map::new();
            for m in map_state {
                let (old, new) = m
                    .split_once('=')
                    .ok_or_else(|| (2, format!("--map-state {m:?}: expected OLD=NEW")))?;
                states.insert(old.to_string(), json!(new));
            }
            let mut b = Map::new();
            b.insert("version".into(), json!(to_version));
            if !states.is_empty() {
                b.insert("states".into(), Value::Object(states));
            }
            ("migrate", b, target)
        }
        BatchCommand::Send { event, target } => {
            let text =
                std::fs::read_to_string(&event).map_err(|e| (2, format!("{}: cannot read: {e}", event.display())))?;
            let v: Value =
                serde_json::from_str(&text).map_err(|e| (2, format!("{}: not valid JSON: {e}", event.display())))?;
            let mut b = Map::new();
            b.insert("event".into(), v);
            ("send", b, target)
        }
        BatchCommand::Status { id, follow, remote } => {
            return if follow {
                follow_batch(&remote, &id)
            } else {
                let v = call(&remote, "GET", &path(&id, ""), None)?;
                report(&remote, &v)
            }
        }
        BatchCommand::List { remote } => {
            let v = call(&remote, "GET", "/batches", None)?;
            if remote.json {
                print_json(&v);
            } else {
                for b in v["batches"].as_array().into_iter().flatten() {
                    println!(
                        "{}  {}  {}  matched {}  done {}  failed {}",
                        crate::client::s(&b["id"]),
                        crate::client::s(&b["operation"]),
                        crate::client::s(&b["phase"]),
                        b["matched"],
                        b["done"],
                        b["failedCount"]
                    );
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        BatchCommand::Stop { id, remote } => {
            let v = call(&remote, "POST", &path(&id, "/cancel"), None)?;
            return report(&remote, &v);
        }
    };
    body.insert("operation".into(), json!(op));
    body.insert(
        "where".into(),
        Value::Object(filter(&target.filter, target.jq.as_deref())?),
    );
    if target.dry_run {
        body.insert("dryRun".into(), json!(true));
    }
    if let Some(r) = target.rate {
        body.insert("rate".into(), json!(r));
    }
    let bytes = Value::Object(body).to_string().into_bytes();
    let v = call(&target.remote, "POST", "/batches", Some(("application/json", bytes)))?;
    if target.dry_run {
        if target.remote.json {
            print_json(&v);
        } else {
            for i in v["instances"].as_array().into_iter().flatten() {
                println!(
                    "{}  {} {}  {}  {}",
                    crate::client::s(&i["id"]),
                    crate::client::s(&i["definition"]),
                    crate::client::s(&i["version"]),
                    crate::client::s(&i["status"]),
                    crate::client::s(&i["state"])
                );
            }
            let more = if v["truncated"] == json!(true) {
                " (the first ones listed)"
            } else {
                ""
            };
            println!(
                "dry run: {op} would touch {} instances{more}; nothing was changed",
                v["matched"]
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let id = crate::client::s(&v["id"]);
    if target.no_wait {
        if target.remote.json {
            print_json(&v);
        } else {
            println!("{id}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !target.remote.json {
        eprintln!("batch {id}: {op}");
    }
    follow_batch(&target.remote, &id)
}

/// The `where` object of `--where` and `--jq`.
fn filter(pairs: &[String], jq: Option<&str>) -> Result<Map<String, Value>, Failure> {
    let mut w = Map::new();
    for pair in pairs
        .iter()
        .flat_map(|p| p.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty() && *p != "all")
    {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| (2, format!("--where {pair:?}: expected KEY=VALUE")))?;
        if k == "jq" {
            return Err((
                2,
                "--where: give the jq filter with --jq EXPR (it may hold commas)".into(),
            ));
        }
        if !where_keys().any(|key| key == k) {
            return Err((
                2,
                format!(
                    "--where: unknown key {k:?}; keys: {}",
                    where_keys().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        w.insert(k.to_string(), json!(v));
    }
    if let Some(jq) = jq {
        w.insert("jq".into(), json!(jq));
    }
    Ok(w)
}

/// Polls the batch until it ends, with a progress bar on a terminal and a line every few seconds
/// otherwise, then prints the report.
fn follow_batch(remote: &Remote, id: &str) -> Result<ExitCode, Failure> {
    let path = format!("/batches/{}", sm4c_invoke::rest::encode(id));
    let tty = std::io::stderr().is_terminal() && !remote.json;
    let bar = tty.then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} [{bar:40}] {pos}/{len} ({per_sec}, {eta})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b
    });
    let mut last_line = Instant::now();
    let v = loop {
        let v = call(remote, "GET", &path, None)?;
        let (matched, done, failed) = (
            v["matched"].as_u64().unwrap_or(0),
            v["done"].as_u64().unwrap_or(0),
            v["failedCount"].as_u64().unwrap_or(0),
        );
        let phase = crate::client::s(&v["phase"]);
        if let Some(b) = &bar {
            b.set_length(matched);
            b.set_position(done + failed);
            b.set_message(format!("{phase}: {failed} failed"));
        } else if !remote.json && (last_line.elapsed() >= Duration::from_secs(5) || v["running"] != json!(true)) {
            eprintln!("batch {id}: {phase}: matched {matched}, done {done}, failed {failed}");
            last_line = Instant::now();
        }
        if v["running"] != json!(true) {
            break v;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    report(remote, &v)
}

/// Prints a batch's report; exit 1 when an instance failed or the batch was stopped before it
/// ended.
fn report(remote: &Remote, v: &Value) -> Result<ExitCode, Failure> {
    if remote.json {
        print_json(v);
    } else {
        println!(
            "batch {}: {} {}: matched {}, done {}, failed {}{}",
            crate::client::s(&v["id"]),
            crate::client::s(&v["operation"]),
            crate::client::s(&v["phase"]),
            v["matched"],
            v["done"],
            v["failedCount"],
            match v["pending"].as_u64() {
                Some(n) if n > 0 => format!(", not reached {n}"),
                _ => String::new(),
            }
        );
        for f in v["failed"].as_array().into_iter().flatten() {
            println!(
                "  failed {}: {}",
                crate::client::s(&f["instance"]),
                crate::client::s(&f["reason"])
            );
        }
        let listed = v["failed"].as_array().map_or(0, Vec::len) as u64;
        if v["failedCount"].as_u64().unwrap_or(0) > listed {
            println!("  (the first {listed} failures listed)");
        }
        if let Some(h) = v["halted"].as_str() {
            println!("  halted: {h}; it resumes when the server starts again");
        }
    }
    let failed = v["failedCount"].as_u64().unwrap_or(0) > 0;
    let stopped = v["phase"] == json!("cancelled");
    Ok(if failed || stopped {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
