//! `sm4c schedule`: schedules evaluated without a server.

use crate::client::{call, print_json, Failure, Remote};
use clap::Subcommand;
use serde_json::{json, Value};
use sm4c_schedule::{parse_time, rfc3339, Spec};
use std::path::PathBuf;
use std::process::ExitCode;

/// `sm4c schedule ...`.
#[derive(clap::Args)]
pub struct ScheduleArgs {
    #[command(subcommand)]
    command: ScheduleCommand,
}

#[derive(Subcommand)]
enum ScheduleCommand {
    /// List the server's schedules, each with its next time.
    List {
        #[command(flatten)]
        remote: Remote,
    },
    /// Show a schedule: its specification, state, next ten times, recent runs and skipped counts.
    Show {
        /// The schedule's id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Register a schedule from a JSON file (see `docs/src/schedules.md`).
    Create {
        /// The schedule file.
        file: PathBuf,
        #[command(flatten)]
        remote: Remote,
    },
    /// Change a schedule's specification from a JSON file; what it did and owes is kept.
    Update {
        /// The schedule's id.
        id: String,
        /// The schedule file.
        file: PathBuf,
        #[command(flatten)]
        remote: Remote,
    },
    /// Pause a schedule: the times that come are skipped.
    Pause {
        /// The schedule's id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Resume a paused schedule (the times that came while it was paused are not run).
    Resume {
        /// The schedule's id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Start one run now, under the schedule's overlap policy.
    Trigger {
        /// The schedule's id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Start one run per nominal time in [FROM, TO), under the overlap policy.
    Backfill {
        /// The schedule's id.
        id: String,
        /// From this time (RFC 3339).
        #[arg(long)]
        from: String,
        /// Up to this time, not included (RFC 3339).
        #[arg(long)]
        to: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Delete a schedule (its running instances run on).
    Delete {
        /// The schedule's id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Print a schedule's next nominal times, without a server: SPEC is a cron expression
    /// (`"0 2 * * *"`, `@daily`), an ISO 8601 interval (`PT5M`), a schedule as JSON, or a file
    /// holding one (exit 2 if it is invalid, naming the field).
    Next {
        /// The schedule: a cron expression, an interval, JSON, or a JSON file.
        spec: String,
        /// How many times.
        #[arg(long, default_value_t = 10)]
        count: usize,
        /// The times after this one (RFC 3339); now by default.
        #[arg(long, value_name = "TIME")]
        after: Option<String>,
        /// The IANA time zone of a cron expression given alone (UTC by default).
        #[arg(long, value_name = "ZONE")]
        timezone: Option<String>,
        /// Print JSON: [{"nominal", "local", "instance"}].
        #[arg(long)]
        json: bool,
    },
}

/// Runs `sm4c schedule`.
pub fn run(args: ScheduleArgs) -> ExitCode {
    let remote = |r: Result<Value, Failure>| match r {
        Ok(v) => {
            if !v.is_null() {
                print_json(&v);
            }
            ExitCode::SUCCESS
        }
        Err((code, msg)) => {
            eprintln!("sm4c: {msg}");
            ExitCode::from(code)
        }
    };
    let path = |id: &str, verb: &str| format!("/schedules/{}{verb}", sm4c_invoke::rest::encode(id));
    match args.command {
        ScheduleCommand::List { remote: r } => remote(call(&r, "GET", "/schedules", None)),
        ScheduleCommand::Show { id, remote: r } => remote(call(&r, "GET", &path(&id, ""), None)),
        ScheduleCommand::Create { file, remote: r } => {
            remote(read(&file).and_then(|b| call(&r, "POST", "/schedules", Some(b))))
        }
        ScheduleCommand::Update { id, file, remote: r } => {
            remote(read(&file).and_then(|b| call(&r, "PUT", &path(&id, ""), Some(b))))
        }
        ScheduleCommand::Pause { id, remote: r } => remote(call(&r, "POST", &path(&id, "/pause"), None)),
        ScheduleCommand::Resume { id, remote: r } => remote(call(&r, "POST", &path(&id, "/resume"), None)),
        ScheduleCommand::Trigger { id, remote: r } => remote(call(&r, "POST", &path(&id, "/trigger"), None)),
        ScheduleCommand::Backfill {
            id,
            from,
            to,
            remote: r,
        } => {
            let body = json!({"from": from, "to": to}).to_string().into_bytes();
            remote(call(
                &r,
                "POST",
                &path(&id, "/backfill"),
                Some(("application/json", body)),
            ))
        }
        ScheduleCommand::Delete { id, remote: r } => remote(call(&r, "DELETE", &path(&id, ""), None)),
        ScheduleCommand::Next {
            spec,
            count,
            after,
            timezone,
            json,
        } => next(&spec, count, after.as_deref(), timezone.as_deref(), json),
    }
}

fn next(text: &str, count: usize, after: Option<&str>, timezone: Option<&str>, as_json: bool) -> ExitCode {
    let doc = match spec_json(text, timezone) {
        Ok(doc) => doc,
        Err(e) => {
            eprintln!("sm4c: {e}");
            return ExitCode::from(2);
        }
    };
    let spec = match Spec::from_json(&doc) {
        Ok(s) => s,
        Err(errs) => {
            for e in errs {
                eprintln!("{text}: {e}");
            }
            return ExitCode::from(2);
        }
    };
    let after = match after.map(parse_time) {
        None => sm4c_host::clock::wall_ms(),
        Some(Ok(t)) => t,
        Some(Err(e)) => {
            eprintln!("sm4c: --after: {e}");
            return ExitCode::from(2);
        }
    };
    let times = spec.times_after(after, count);
    let local = |t: i64| {
        chrono::DateTime::from_timestamp_millis(t)
            .map(|u| u.with_timezone(&spec.timezone).to_rfc3339())
            .unwrap_or_default()
    };
    if as_json {
        let out: Vec<Value> = times
            .iter()
            .map(|t| json!({"nominal": rfc3339(*t), "local": local(*t), "instance": spec.instance_id(*t)}))
            .collect();
        println!("{}", Value::Array(out));
    } else {
        for t in &times {
            println!("{}  {} ({})", rfc3339(*t), local(*t), spec.timezone.name());
        }
        if times.len() < count {
            println!("(no more times: the schedule ends)");
        }
    }
    ExitCode::SUCCESS
}

/// The schedule SPEC stands for, as JSON.
fn spec_json(text: &str, timezone: Option<&str>) -> Result<Value, String> {
    let path = std::path::Path::new(text);
    let trimmed = text.trim_start();
    let mut doc = if trimmed.starts_with('{') {
        serde_json::from_str(text).map_err(|e| format!("the schedule is not JSON: {e}"))?
    } else if path.is_file() {
        let body = std::fs::read_to_string(path).map_err(|e| format!("{text}: {e}"))?;
        serde_json::from_str(&body).map_err(|e| format!("{text}: not JSON: {e}"))?
    } else if sm4c_runtime::timespan::parse(text).is_ok() {
        json!({"every": text})
    } else {
        json!({"cron": text})
    };
    let Some(o) = doc.as_object_mut() else {
        return Err(format!("{text}: a schedule is a JSON object"));
    };
    // Only the times are asked for: a schedule written for a server has these, a bare expression not.
    o.entry("id").or_insert_with(|| json!("schedule"));
    o.entry("definition").or_insert_with(|| json!("-"));
    if let Some(tz) = timezone {
        o.insert("timezone".into(), json!(tz));
    }
    Ok(doc)
}

/// A schedule file's body, to send as JSON.
fn read(file: &std::path::Path) -> Result<(&'static str, Vec<u8>), Failure> {
    let bytes = std::fs::read(file).map_err(|e| (2, format!("{}: {e}", file.display())))?;
    serde_json::from_slice::<Value>(&bytes).map_err(|e| (2, format!("{}: not JSON: {e}", file.display())))?;
    Ok(("application/json", bytes))
}
