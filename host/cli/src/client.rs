//! The CLI client of `sm4c serve`: `define`, `start`, `list`, `show`, `history`, `send`, `cancel`, `tasks`.

use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;

/// Options every client command takes. Its `Debug` does not show the token.
#[derive(clap::Args, Clone)]
pub struct Remote {
    /// The server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// Print the server's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Bearer token for a server that requires one (visible to other local users in the process
    /// list: prefer --token-file or the SM4C_TOKEN environment variable).
    #[arg(long, value_name = "TOKEN", conflicts_with = "token_file")]
    pub token: Option<String>,
    /// File whose first line is the bearer token.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA certificates to trust for an https:// server, besides the webpki roots.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// PEM client certificate for a server that maps client certificates to roles (mutual TLS).
    #[arg(long, value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("server", &self.server)
            .field("json", &self.json)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_file", &self.token_file)
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish()
    }
}

impl Remote {
    /// The token: --token, else --token-file, else $SM4C_TOKEN.
    fn token(&self) -> Result<Option<String>, Failure> {
        if let Some(t) = &self.token {
            return Ok(Some(t.trim().to_string()));
        }
        if let Some(p) = &self.token_file {
            let text = std::fs::read_to_string(p)
                .map_err(|e| (2, format!("--token-file {}: cannot read: {e}", p.display())))?;
            let token = text.lines().next().unwrap_or("").trim();
            if token.is_empty() {
                return Err((2, format!("--token-file {}: the first line is empty", p.display())));
            }
            return Ok(Some(token.to_string()));
        }
        Ok(std::env::var("SM4C_TOKEN")
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty()))
    }

    fn client(&self) -> Result<reqwest::blocking::Client, Failure> {
        let mut b = reqwest::blocking::Client::builder();
        if let Some(p) = &self.ca {
            let pem = std::fs::read(p).map_err(|e| (2, format!("--ca {}: cannot read: {e}", p.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .ok()
                .filter(|c| !c.is_empty())
                .ok_or_else(|| (2, format!("--ca {}: not a PEM file of certificates", p.display())))?;
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            let read = |p: &PathBuf, flag: &str| {
                std::fs::read(p).map_err(|e| (2, format!("{flag} {}: cannot read: {e}", p.display())))
            };
            let mut pem = read(cert, "--cert")?;
            pem.push(b'\n');
            pem.extend(read(key, "--key")?);
            let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
                (
                    2,
                    format!(
                        "--cert {} --key {}: not a PEM certificate and key: {}",
                        cert.display(),
                        key.display(),
                        causes(&e)
                    ),
                )
            })?;
            b = b.identity(identity);
        }
        b.build()
            .map_err(|e| (2, format!("cannot make an HTTP client: {}", causes(&e))))
    }
}

/// Client commands.
#[derive(clap::Subcommand, Debug)]
pub enum ClientCommand {
    /// Register definitions (SM4C or Amazon States Language files) with the server. An ASL file is
    /// registered under its `sm4c:id`, else under its file name (`order.asl.json` is `order`).
    Define {
        /// Definition files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Start an instance of a registered definition.
    Start {
        /// Definition id.
        definition: String,
        /// JSON input file (default `{}`).
        #[arg(long)]
        input: Option<PathBuf>,
        /// Instance id (the same id again starts nothing new).
        #[arg(long)]
        id: Option<String>,
        /// Definition version (default: the newest).
        #[arg(long)]
        version: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// List instances.
    List {
        /// Only instances with this status.
        #[arg(long)]
        status: Option<String>,
        /// Only instances of this definition.
        #[arg(long)]
        definition: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show an instance.
    Show {
        /// Instance id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show an instance's history (its journal).
    History {
        /// Instance id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Send a CloudEvent (a JSON file in structured format).
    Send {
        /// The event file.
        file: PathBuf,
        #[command(flatten)]
        remote: Remote,
    },
    /// Explain where a CloudEvent (a JSON file in structured format) would go: the instances it
    /// would reach and, for near misses, the attribute or correlation rule that turned it away.
    /// Nothing is delivered.
    ExplainEvent {
        /// The event file.
        file: PathBuf,
        #[command(flatten)]
        remote: Remote,
    },
    /// What a new version of a definition (a file, not registered) would mean for the instances
    /// that have not ended: per version and state, how many could move to it as they are, how
    /// many need a state map, why the others cannot, and whose histories it decides otherwise.
    UpgradeCheck {
        /// The new version's definition file (SM4C or ASL).
        file: PathBuf,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show or set the version new starts of a definition take: with VERSION it becomes the
    /// default version (a newer one can then be registered without taking traffic), `--latest`
    /// clears it (new starts take the newest again), neither shows it.
    DefaultVersion {
        /// Definition id.
        definition: String,
        /// A registered version of it.
        #[arg(conflicts_with = "latest")]
        version: Option<String>,
        /// Clear the default version: new starts take the newest registered.
        #[arg(long)]
        latest: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Move a waiting instance to another version of its definition (`--dry-run`: say what
    /// that would do, change nothing).
    Migrate {
        /// Instance id.
        id: String,
        /// The version to move it to.
        #[arg(long)]
        version: String,
        /// A state whose name differs in that version: OLD=NEW (repeatable).
        #[arg(long = "state", value_name = "OLD=NEW")]
        states: Vec<String>,
        /// Say what the move would do; change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Send a failed or timed-out instance back to running from where it failed (`--update`:
    /// change its data first with a jq expression; `--dry-run`: show the data after it, change
    /// nothing).
    Redrive {
        /// Instance id.
        id: String,
        /// A jq expression over the instance's data, e.g. '.card = "4242"'; its result is the data
        /// the instance goes on with.
        #[arg(long, value_name = "JQ")]
        update: Option<String>,
        /// Say what the redrive would do; change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Cancel an instance.
    Cancel {
        /// Instance id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List the worker task lists, with their queued tasks and waiting workers.
    Tasks {
        #[command(flatten)]
        remote: Remote,
    },
    /// The step debugger: breakpoints on a definition's states; resume or step paused instances.
    #[command(subcommand)]
    Debug(crate::debug::DebugCommand),
}

fn read_json(p: &PathBuf) -> Result<Value, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: cannot read: {e}", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not valid JSON: {e}", p.display()))
}

/// Runs a client command; exit 0 on success, 1 when the server refuses, 2 for usage or connection errors.
pub fn run(cmd: ClientCommand) -> ExitCode {
    match exec(cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            eprintln!("sm4c: {msg}");
            ExitCode::from(code)
        }
    }
}

pub(crate) type Failure = (u8, String);

pub(crate) fn call(remote: &Remote, method: &str, path: &str, body: Option<(&str, Vec<u8>)>) -> Result<Value, Failure> {
    let client = remote.client()?;
    let token = remote.token()?;
    let url = format!("{}{}", remote.server.trim_end_matches('/'), path);
    let mut req = match method {
        "POST" => client.post(&url),
        "PUT" => client.put(&url),
        "DELETE" => client.delete(&url),
        _ => client.get(&url),
    };
    if let Some(t) = &token {
        req = req.bearer_auth(t);
    }
    if method != "GET" {
        // What a server without authentication asks of a body-less POST (a browser cannot send it
        // cross-site without asking first); harmless elsewhere.
        req = req.header(sm4c_api::door::REQUEST_HEADER, "1");
    }
    if let Some((ctype, bytes)) = body {
        req = req.header("content-type", ctype).body(bytes);
    }
    let resp = req
        .send()
        .map_err(|e| (2, format!("cannot reach {}: {}", remote.server, causes(&e))))?;
    let status = resp.status();
    let value: Value = resp.json().unwrap_or(Value::Null);
    if status.is_success() {
        Ok(value)
    } else {
        let msg = value["message"].as_str().unwrap_or("request failed").to_string();
        let code = value["error"].as_str().unwrap_or("error").to_string();
        let hint = if status == reqwest::StatusCode::UNAUTHORIZED && token.is_none() {
            " (give a token with --token-file, --token or SM4C_TOKEN)"
        } else {
            ""
        };
        Err((1, format!("{code} ({}): {msg}{hint}", status.as_u16())))
    }
}

/// An error and its causes, `: `-separated (reqwest says what failed, its causes say why).
fn causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out = format!("{out}: {text}");
        }
        source = s.source();
    }
    out
}

/// Every item of a paginated listing: follows the `next` cursor until the last page.
fn pages(remote: &Remote, path: &str, key: &str) -> Result<Vec<Value>, Failure> {
    let mut all = Vec::new();
    let mut after = String::new();
    loop {
        let page = call(
            remote,
            "GET",
            &format!("{path}&after={}", sm4c_invoke::rest::encode(&after)),
            None,
        )?;
        all.extend(page[key].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(n) => after = n.to_string(),
            None => return Ok(all),
        }
    }
}

pub(crate) fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn table(rows: &[Vec<String>]) {
    print!("{}", table_text(rows));
}

/// Rows in columns as wide as their widest cell, a line each.
fn table_text(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out += line.join("  ").trim_end();
        out += "\n";
    }
    out
}

pub(crate) fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn exec(cmd: ClientCommand) -> Result<(), Failure> {
    match cmd {
        ClientCommand::Debug(cmd) => crate::debug::exec(cmd)?,
        ClientCommand::Define { files, remote } => {
            use sm4c_runtime::asl::model::{is_asl, ID_KEY};
            let mut all = Vec::new();
            for f in &files {
                let doc = read_json(f).map_err(|e| (2, e))?;
                let mut path = "/definitions".to_string();
                if is_asl(&doc) && doc.get(ID_KEY).is_none() {
                    let name = crate::files::asl_name(f);
                    path += &format!("?name={}", sm4c_invoke::rest::encode(&name));
                }
                let body = Some(("application/json", doc.to_string().into_bytes()));
                let v = call(&remote, "POST", &path, body).map_err(|(c, m)| (c, format!("{}: {m}", f.display())))?;
                if remote.json {
                    all.push(v);
                } else {
                    println!("registered {} version {}", s(&v["id"]), s(&v["version"]));
                }
            }
            if remote.json {
                print_json(&Value::Array(all));
            }
        }
        ClientCommand::Start {
            definition,
            input,
            id,
            version,
            remote,
        } => {
            let input = match &input {
                Some(p) => read_json(p).map_err(|e| (2, e))?,
                None => json!({}),
            };
            let mut body = json!({"definition": definition, "input": input});
            if let Some(id) = id {
                body["id"] = json!(id);
            }
            if let Some(v) = version {
                body["version"] = json!(v);
            }
            let v = call(
                &remote,
                "POST",
                "/instances",
                Some(("application/json", body.to_string().into_bytes())),
            )?;
            if remote.json {
                print_json(&v);
            } else if v["created"] == json!(true) {
                println!("started {}", s(&v["id"]));
            } else {
                println!("{} already exists; nothing new was started", s(&v["id"]));
            }
        }
        ClientCommand::List {
            status,
            definition,
            remote,
        } => {
            let mut q = "/instances?limit=1000".to_string();
            if let Some(st) = &status {
                q += &format!("&status={}", sm4c_invoke::rest::encode(st));
            }
            if let Some(d) = &definition {
                q += &format!("&definition={}", sm4c_invoke::rest::encode(d));
            }
            let all = pages(&remote, &q, "instances")?;
            if remote.json {
                print_json(&Value::Array(all));
            } else {
                let mut rows = vec![vec![
                    "ID".into(),
                    "DEFINITION".into(),
                    "VERSION".into(),
                    "STATUS".into(),
                    "STATE".into(),
                    "STARTED".into(),
                ]];
                for i in &all {
                    rows.push(vec![
                        s(&i["id"]),
                        s(&i["definition"]),
                        s(&i["version"]),
                        s(&i["status"]),
                        s(&i["state"]),
                        s(&i["startedAt"]),
                    ]);
                }
                table(&rows);
            }
        }
        ClientCommand::Show { id, remote } => {
            let v = call(
                &remote,
                "GET",
                &format!("/instances/{}", sm4c_invoke::rest::encode(&id)),
                None,
            )?;
            if remote.json {
                print_json(&v);
            } else {
                let mut rows = vec![];
                for k in ["id", "definition", "version", "status", "state", "startedAt", "endedAt"] {
                    rows.push(vec![format!("{k}:"), s(&v[k])]);
                }
                if let Some(at) = v.get("pausedAt") {
                    rows.push(vec!["paused:".into(), crate::debug::describe(at)]);
                }
                if let Some(p) = v.get("parent") {
                    rows.push(vec![
                        "parent:".into(),
                        format!("{} (operation {})", s(&p["instance"]), s(&p["operation"])),
                    ]);
                }
                if let Some(e) = v.get("error") {
                    // An ASL error is its `Error` name (the type) and its `Cause` (the message), either may be absent.
                    let field = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                    let text = match (field("type"), field("message")) {
                        (t, m) if m.is_empty() => t,
                        (t, m) if t.is_empty() => m,
                        (t, m) => format!("{t}: {m}"),
                    };
                    rows.push(vec!["error:".into(), text]);
                }
                table(&rows);
                println!(
                    "data:\n{}",
                    serde_json::to_string_pretty(&v["data"]).unwrap_or_default()
                );
            }
        }
        ClientCommand::History { id, remote } => {
            let all = pages(
                &remote,
                &format!("/instances/{}/history?limit=1000", sm4c_invoke::rest::encode(&id)),
                "entries",
            )?;
            if remote.json {
                print_json(&Value::Array(all));
            } else {
                for e in &all {
                    println!("{:>5}  {}", s(&e["seq"]), describe(e));
                }
            }
        }
        ClientCommand::Send { file, remote } => {
            let event = read_json(&file).map_err(|e| (2, e))?;
            let v = call(
                &remote,
                "POST",
                "/events",
                Some(("application/cloudevents+json", event.to_string().into_bytes())),
            )?;
            if remote.json {
                print_json(&v);
            } else if v["queued"] == json!(true) {
                println!(
                    "queued on {} partition {} offset {}",
                    s(&v["topic"]),
                    s(&v["partition"]),
                    s(&v["offset"])
                );
            } else if v["parked"] == json!(true) {
                println!("reached no instance yet; kept for one that starts waiting for it");
            } else {
                let ids: Vec<String> = v["reached"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(s)
                    .collect();
                println!("reached {}", ids.join(", "));
            }
        }
        ClientCommand::UpgradeCheck { file, remote } => {
            let m = crate::files::load_definition(&file, sm4c_runtime::Limits::default()).map_err(|errs| {
                let text: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
                (2, text.join("\n"))
            })?;
            let mut doc = read_json(&file).map_err(|e| (2, e))?;
            if sm4c_runtime::asl::model::is_asl(&doc) {
                doc[sm4c_runtime::asl::model::ID_KEY] = Value::String(m.id.clone());
            }
            let v = call(
                &remote,
                "POST",
                &format!("/definitions/{}/upgrade-check", sm4c_invoke::rest::encode(&m.id)),
                Some(("application/json", doc.to_string().into_bytes())),
            )?;
            if remote.json {
                print_json(&v);
            } else {
                print!("{}", upgrade_text(&v));
            }
        }
        ClientCommand::ExplainEvent { file, remote } => {
            let event = read_json(&file).map_err(|e| (2, e))?;
            let v = call(
                &remote,
                "POST",
                "/events/explain",
                Some(("application/cloudevents+json", event.to_string().into_bytes())),
            )?;
            if remote.json {
                print_json(&v);
            } else {
                print!("{}", explain_text(&v));
            }
        }
        ClientCommand::DefaultVersion {
            definition,
            version,
            latest,
            remote,
        } => {
            let path = format!("/definitions/{}", sm4c_invoke::rest::encode(&definition));
            let v = match (version, latest) {
                (Some(v), _) => {
                    let body = serde_json::to_vec(&json!({"version": v})).unwrap_or_default();
                    call(
                        &remote,
                        "PUT",
                        &format!("{path}/default-version"),
                        Some(("application/json", body)),
                    )?
                }
                (None, true) => call(&remote, "DELETE", &format!("{path}/default-version"), None)?,
                (None, false) => call(&remote, "GET", &path, None)?,
            };
            if remote.json {
                let mut v = v;
                // The documents of the versions are what `GET /definitions/{id}` is for.
                if let Some(o) = v.as_object_mut() {
                    o.remove("definition");
                    o.remove("versions");
                }
                print_json(&v);
            } else {
                let how = match v["defaultVersion"].as_str() {
                    Some(_) => "its default version".to_string(),
                    None => "the newest; no default version is set".to_string(),
                };
                println!(
                    "new starts of {} take version {} ({how}); the newest is {}",
                    s(&v["id"]),
                    s(&v["startsTake"]),
                    s(&v["latest"])
                );
            }
        }
        ClientCommand::Migrate {
            id,
            version,
            states,
            dry_run,
            remote,
        } => {
            let mut map = serde_json::Map::new();
            for s in &states {
                let Some((old, new)) = s.split_once('=').filter(|(o, n)| !o.is_empty() && !n.is_empty()) else {
                    return Err((2, format!("--state {s:?}: expected OLD=NEW, two state names")));
                };
                map.insert(old.to_string(), Value::String(new.to_string()));
            }
            let body = json!({"version": version, "states": map, "dryRun": dry_run});
            let v = call(
                &remote,
                "POST",
                &format!("/instances/{}/migrate", sm4c_invoke::rest::encode(&id)),
                Some(("application/json", body.to_string().into_bytes())),
            )?;
            if remote.json {
                print_json(&v);
            } else {
                let plan = if dry_run { &v["plan"] } else { &v["migration"] };
                let verb = if dry_run { "would move" } else { "moved" };
                println!(
                    "{id} {verb} from version {} state {} to version {} state {}",
                    s(&plan["from"]),
                    s(&plan["state"]),
                    s(&plan["version"]),
                    s(&plan["to"])
                );
                for t in plan["timers"].as_array().into_iter().flatten() {
                    println!("  timer {}: {}", s(&t["timer"]), s(&t["change"]));
                }
                if !dry_run {
                    println!("now {} in state {}", s(&v["status"]), s(&v["state"]));
                }
            }
        }
        ClientCommand::Redrive {
            id,
            update,
            dry_run,
            remote,
        } => {
            let mut body = json!({"dryRun": dry_run});
            if let Some(u) = &update {
                body["update"] = json!(u);
            }
            let v = call(
                &remote,
                "POST",
                &format!("/instances/{}/redrive", sm4c_invoke::rest::encode(&id)),
                Some(("application/json", body.to_string().into_bytes())),
            )?;
            if remote.json {
                print_json(&v);
            } else {
                let r = &v["redrive"];
                let verb = if dry_run { "would go on" } else { "goes on" };
                println!("{id} {verb} from {} (redrive {})", s(&r["from"]), s(&r["redrives"]));
                for op in r["diff"].as_array().into_iter().flatten() {
                    println!("  {}", patch_line(op));
                }
                if dry_run {
                    println!("data after the update: {}", r["data"]);
                } else {
                    println!("now {} in state {}", s(&v["status"]), s(&v["state"]));
                }
            }
        }
        ClientCommand::Cancel { id, remote } => {
            let v = call(
                &remote,
                "POST",
                &format!("/instances/{}/cancel", sm4c_invoke::rest::encode(&id)),
                Some(("application/json", b"{}".to_vec())),
            )?;
            if remote.json {
                print_json(&v);
            } else {
                println!("{} {}", s(&v["id"]), s(&v["status"]));
            }
        }
        ClientCommand::Tasks { remote } => {
            let v = call(&remote, "GET", "/tasklists", None)?;
            if remote.json {
                print_json(&v);
            } else {
                let lists = v["taskLists"].as_array().cloned().unwrap_or_default();
                // A Kafka-mode server names each list's topic instead of a queue it keeps.
                let kafka = lists.iter().any(|l| l.get("topic").is_some());
                let mut rows = vec![if kafka {
                    vec!["TASK LIST".into(), "TOPIC".into(), "OPEN".into()]
                } else {
                    vec!["TASK LIST".into(), "QUEUED".into(), "POLLING".into()]
                }];
                for l in lists {
                    rows.push(if kafka {
                        vec![s(&l["name"]), s(&l["topic"]), s(&l["open"])]
                    } else {
                        vec![s(&l["name"]), s(&l["queued"]), s(&l["polling"])]
                    });
                }
                table(&rows);
            }
        }
    }
    Ok(())
}

/// An upgrade report as a person reads it.
fn upgrade_text(v: &Value) -> String {
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
    let reasons = |c: &Value| {
        let parts: Vec<String> = c
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k} {}", v.as_u64().unwrap_or(0)))
            .collect();
        if parts.is_empty() {
            "-".to_string()
        } else {
            parts.join(", ")
        }
    };
    let mut out = format!(
        "version {} of {}, against the {} instances that have not ended:\n  {} can move to it as they are, {} need a state map, {} cannot ({})\n  {} histories it decides the same, {} otherwise\n",
        s(&v["version"]),
        s(&v["definition"]),
        n(v, "instances"),
        n(v, "canMove"),
        n(v, "needMapping"),
        v["cannot"].as_object().map_or(0, |c| c.values().filter_map(Value::as_u64).sum::<u64>()),
        reasons(&v["cannot"]),
        n(v, "sameDecisions"),
        n(v, "diverged"),
    );
    let groups = v["groups"].as_array().cloned().unwrap_or_default();
    if groups.is_empty() {
        return out;
    }
    let mut rows = vec![[
        "VERSION",
        "STATE",
        "INSTANCES",
        "MOVE",
        "MAP",
        "CANNOT",
        "SAME",
        "DIVERGED",
    ]
    .map(str::to_string)
    .to_vec()];
    for g in &groups {
        rows.push(vec![
            s(&g["version"]),
            s(&g["state"]),
            n(g, "instances").to_string(),
            n(g, "canMove").to_string(),
            n(g, "needMapping").to_string(),
            reasons(&g["cannot"]),
            n(g, "sameDecisions").to_string(),
            n(g, "diverged").to_string(),
        ]);
    }
    out += &table_text(&rows);
    for g in &groups {
        for e in g["examples"].as_array().into_iter().flatten() {
            out += &format!("  {}: {}\n", s(&e["id"]), s(&e["why"]));
        }
    }
    out
}

/// An explanation as a person reads it.
fn explain_text(v: &Value) -> String {
    let mut out = String::new();
    let ev = &v["event"];
    out.push_str(&format!(
        "event {} (type {}, source {})\n",
        s(&ev["id"]),
        s(&ev["type"]),
        s(&ev["source"])
    ));
    // Kafka mode: which partitions it goes to.
    let route = &v["route"];
    match route["via"].as_str() {
        Some("instance") => out.push_str(&format!(
            "goes to partition {}, the partition of instance {}\n",
            s(&route["partition"]),
            s(&route["instance"])
        )),
        Some("key") => out.push_str(&format!(
            "goes to partition {}, the partition of its correlation key {}={}\n",
            s(&route["partition"]),
            s(&route["attribute"]),
            s(&route["value"])
        )),
        Some("every partition") => out.push_str(&format!(
            "goes to every partition ({}): not every definition that may take it routes it by one correlation attribute it carries\n",
            s(&route["partitions"])
        )),
        _ => {}
    }
    let list = |k: &str| v[k].as_array().cloned().unwrap_or_default();
    for d in list("starts") {
        out.push_str(&format!(
            "starts a new instance of {} {}\n",
            s(&d["definition"]),
            s(&d["version"])
        ));
    }
    let reached = list("reached");
    if reached.is_empty() {
        out.push_str("reaches no instance\n");
    }
    for r in reached {
        out.push_str(&format!(
            "reaches {} ({}, state {}) as event {}\n",
            s(&r["instance"]),
            s(&r["definition"]),
            s(&r["state"]),
            s(&r["event"])
        ));
    }
    for r in list("nearMisses") {
        out.push_str(&format!("turned away by {}: {}\n", s(&r["instance"]), s(&r["reason"])));
    }
    for d in list("definitions") {
        if d["matches"] != json!(true) {
            out.push_str(&format!(
                "definition {} {} does not declare it: {}\n",
                s(&d["id"]),
                s(&d["version"]),
                s(&d["reason"])
            ));
        }
    }
    out
}

/// One journal entry as a line.
/// One operation of an RFC 6902 JSON Patch as a line: `replace /card: "4242"`, `remove /x`.
fn patch_line(op: &Value) -> String {
    match op.get("value") {
        Some(v) => format!("{} {}: {v}", s(&op["op"]), s(&op["path"])),
        None => format!("{} {}", s(&op["op"]), s(&op["path"])),
    }
}

fn describe(e: &Value) -> String {
    match e["entry"].as_str() {
        Some("input") => {
            let what = s(&e["input"]);
            let extra = match what.as_str() {
                "completed" | "failed" => format!(" {}", s(&e["op"])),
                "timerFired" => format!(" {}", s(&e["timer"])),
                "taskStarted" => format!(" {} by {}", s(&e["op"]), s(&e["worker"])),
                "taskHeartbeat" => format!(" {}", s(&e["op"])),
                "event" => format!(" {} ({})", s(&e["event"]["type"]), s(&e["event"]["id"])),
                "redrive" => {
                    let mut text = match e["update"].as_str() {
                        Some(u) => format!(" with update {u}"),
                        None => " without update".to_string(),
                    };
                    for op in e["diff"].as_array().into_iter().flatten() {
                        text += &format!("\n      {}", patch_line(op));
                    }
                    text
                }
                "migrate" => {
                    let map: Vec<String> = e["states"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(o, n)| format!("{o}={}", s(n)))
                        .collect();
                    let map = if map.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", map.join(", "))
                    };
                    format!(" from version {} to {}{map}", s(&e["from"]), s(&e["version"]))
                }
                _ => String::new(),
            };
            format!("{}  input {what}{extra}", s(&e["time"]))
        }
        Some("effect") => {
            let what = s(&e["effect"]);
            let extra = match what.as_str() {
                "invokeFunction" => format!(" {} ({})", s(&e["function"]), s(&e["op"])),
                "startSubflow" => format!(" {} ({})", s(&e["definition"]), s(&e["op"])),
                "sendEvent" => format!(" {} ({})", s(&e["event"]["type"]), s(&e["event"]["id"])),
                "startTimer" => format!(
                    " {} due {}",
                    s(&e["timer"]),
                    e["due"].as_i64().map(sm4c_runtime::engine::rfc3339).unwrap_or_default()
                ),
                "cancelTimer" => format!(" {}", s(&e["timer"])),
                _ => format!(" {}", s(&e["op"])),
            };
            format!("                          effect {what}{extra}")
        }
        _ => {
            let pad = "                          ";
            match e["step"].as_str().unwrap_or_default() {
                "stateEntered" => format!("{pad}enter state {}", s(&e["state"])),
                "transitionFired" => format!(
                    "{pad}transition {} of {} ({}) -> {}",
                    s(&e["transition"]),
                    s(&e["state"]),
                    s(&e["trigger"]),
                    e["next"].as_str().unwrap_or("(stays)")
                ),
                "eventConsumed" => format!("{pad}event {} consumed ({})", s(&e["event"]), s(&e["id"])),
                "actionCompleted" => format!("{pad}{} {} completed", s(&e["action"]), s(&e["op"])),
                "conditionNotBoolean" => format!(
                    "{pad}condition {} {} yielded {}, not a boolean: it does not fire",
                    s(&e["pointer"]),
                    s(&e["condition"]),
                    s(&e["value"])
                ),
                "actionFailed" => format!("{pad}{} {} failed: {}", s(&e["action"]), s(&e["op"]), s(&e["message"])),
                "retrying" => format!(
                    "{pad}retry {}: attempt {} in {} ms",
                    s(&e["op"]),
                    s(&e["attempt"]),
                    s(&e["delay_ms"])
                ),
                "finished" => format!("{pad}instance {}", s(&e["status"])),
                "redriven" => format!("{pad}redriven from {} (redrive {})", s(&e["from"]), s(&e["redrives"])),
                "migrated" => format!(
                    "{pad}moved from state {} of version {} to state {} of version {}",
                    s(&e["state"]),
                    s(&e["from"]),
                    s(&e["to"]),
                    s(&e["version"])
                ),
                _ => format!("{pad}{e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Remote;

    #[test]
    fn the_debug_of_the_client_options_does_not_show_the_token() {
        let r = Remote {
            server: "https://sm4c.example.com".into(),
            json: false,
            token: Some("tok-0123456789-secret".into()),
            token_file: None,
            ca: None,
            cert: None,
            key: None,
        };
        let shown = format!("{r:?} {r:#?}");
        assert!(!shown.contains("tok-0123456789-secret"), "{shown}");
        assert!(
            shown.contains("<redacted>") && shown.contains("sm4c.example.com"),
            "{shown}"
        );
    }
}
