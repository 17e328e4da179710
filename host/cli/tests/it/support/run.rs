//! Running the real `sm4c` binary from tests, and the files it reads.
#![allow(dead_code)]

use serde_json::Value;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest any single command may take before the test calls it a hang.
const DEADLINE: Duration = Duration::from_secs(120);

/// Runs `sm4c ARGS`, returning (exit code, stdout, stderr); kills it and panics after [`DEADLINE`].
pub fn sm4c(args: &[&str]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sm4c"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sm4c starts");
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            r.read_to_string(&mut s).expect("utf-8 output");
            s
        })
    };
    let out = pipe(Box::new(child.stdout.take().expect("stdout")));
    let err = pipe(Box::new(child.stderr.take().expect("stderr")));
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if started.elapsed() > DEADLINE {
            child.kill().ok();
            child.wait().ok();
            panic!("sm4c {args:?} still running after {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (
        status.code().unwrap_or(-1),
        out.join().expect("stdout reader"),
        err.join().expect("stderr reader"),
    )
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write_raw(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write file");
    p.to_str().expect("utf-8 path").to_string()
}

/// Writes a JSON document to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, json: &Value) -> String {
    write_raw(dir, name, &serde_json::to_string_pretty(json).expect("json"))
}

/// Writes CloudEvents as NDJSON.
pub fn write_events(dir: &Path, name: &str, events: &[Value]) -> String {
    let lines: Vec<String> = events.iter().map(Value::to_string).collect();
    write_raw(dir, name, &(lines.join("\n") + "\n"))
}

/// The one JSON document on stdout.
pub fn parse(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{stdout}"))
}

/// A temporary folder, removed when dropped.
pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}
