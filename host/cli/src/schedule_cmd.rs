//! `sm4c schedule`: schedules evaluated without a server.

use clap::Subcommand;
use serde_json::{json, Value};
use sm4c_schedule::{parse_time, rfc3339, Spec};
use std::process::ExitCode;

/// `sm4c schedule ...`.
#[derive(clap::Args)]
pub struct ScheduleArgs {
    #[command(subcommand)]
    command: ScheduleCommand,
}

#[derive(Subcommand)]
enum ScheduleCommand {
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
    match args.command {
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
