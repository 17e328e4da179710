//! Every folder in `samples/` runs with its input, mocks and events to its `expected.json`.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run_sample(dir: &Path) -> (i32, Value, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sm4c"));
    cmd.arg("run").arg(dir.join("definition.json")).arg("--virtual-time");
    for (flag, file) in [
        ("--input", "input.json"),
        ("--mock", "mocks.json"),
        ("--events", "events.ndjson"),
    ] {
        if dir.join(file).exists() {
            cmd.arg(flag).arg(dir.join(file));
        }
    }
    if dir.join("subflows").is_dir() {
        cmd.arg("--subflows").arg(dir.join("subflows"));
    }
    let out = cmd.output().expect("sm4c runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        value,
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn every_sample_reaches_its_expected_output() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("samples"))
        .expect("samples folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("definition.json").exists())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 5, "at least five samples, found {}", dirs.len());
    for dir in dirs {
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).expect("expected.json"))
                .expect("expected.json is JSON");
        let (code, got, stderr) = run_sample(&dir);
        assert_eq!(code, 0, "{}: exit {code}, stderr: {stderr}", dir.display());
        assert_eq!(got, expected, "{}", dir.display());
    }
}

#[test]
fn every_sample_has_tests_and_they_pass() {
    let samples = root().join("samples");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&samples)
        .expect("samples folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("definition.json").exists())
        .collect();
    dirs.sort();
    for dir in &dirs {
        let name = dir.file_name().and_then(|n| n.to_str()).expect("utf-8 name");
        assert!(
            dir.join(format!("{name}.test.json")).exists(),
            "{} has no {name}.test.json",
            dir.display()
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_sm4c"))
        .arg("test")
        .arg(&samples)
        .output()
        .expect("sm4c runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "sm4c test samples/:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let passed = stdout.lines().filter(|l| l.trim_start().starts_with('✓')).count();
    assert!(
        passed > dirs.len(),
        "{passed} tests passed for {} samples:\n{stdout}",
        dirs.len()
    );
}

#[test]
fn samples_cover_every_action_type() {
    let mut text = String::new();
    for entry in walk(&root().join("samples")) {
        // The definitions, not their tests (which name the same words in their expectations).
        let is_test = entry.to_str().is_some_and(|p| p.ends_with(".test.json"));
        if entry.extension().is_some_and(|e| e == "json") && !is_test {
            text += &std::fs::read_to_string(&entry).unwrap().to_ascii_lowercase();
        }
    }
    for ty in [
        "delay",
        "foreach",
        "injectdata",
        "invokefunction",
        "invokesubflow",
        "parallel",
        "sendevent",
        "sequence",
    ] {
        assert!(text.contains(&format!("\"type\": \"{ty}\"")), "no sample uses {ty}");
    }
    for feature in [
        "\"eventgroups\"",
        "\"timeout\"",
        "\"errorhandlers\"",
        "\"retrypolicy\"",
        "\"xor\"",
        "\"n_of_m\"",
    ] {
        assert!(text.contains(feature), "no sample uses {feature}");
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn an_asl_sample_shows_task_retry_catch_choice_map_and_wait() {
    let text = std::fs::read_to_string(root().join("samples/asl-order/definition.json")).expect("the ASL sample");
    let doc: Value = serde_json::from_str(&text).expect("JSON");
    assert!(doc.get("StartAt").is_some() && doc.get("States").is_some(), "it is ASL");
    for needle in [
        "\"Type\": \"Task\"",
        "\"Retry\"",
        "\"Catch\"",
        "\"Type\": \"Choice\"",
        "\"Type\": \"Map\"",
        "\"Type\": \"Wait\"",
    ] {
        assert!(text.contains(needle), "the ASL sample has no {needle}");
    }
}
