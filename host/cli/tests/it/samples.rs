//! Every folder in `samples/` runs with its input, mocks and events to its `expected.json`.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run_sample(dir: &Path) -> (i32, Value, String) {
    run_sample_with(dir, &[])
}

/// Runs a sample as its README says, with `extra` arguments.
fn run_sample_with(dir: &Path, extra: &[&str]) -> (i32, Value, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sm4c"));
    cmd.arg("run")
        .arg(dir.join("definition.json"))
        .arg("--virtual-time")
        .args(extra);
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

fn sm4c(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sm4c"))
        .args(args)
        .output()
        .expect("sm4c runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn sample_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("samples"))
        .expect("samples folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("definition.json").exists())
        .collect();
    dirs.sort();
    dirs
}

/// Records `sample`'s run with `--history` into `out` and returns the history's path.
fn record(sample: &str, out: &Path) -> String {
    let dir = root().join("samples").join(sample);
    let path = out.join(format!("{sample}.json"));
    let (code, _, err) = run_sample_with(&dir, &["--history", path.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{sample}: {err}");
    path.to_str().expect("utf-8").to_string()
}

#[test]
fn every_sample_replays_its_own_history_with_the_same_decisions() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dirs = sample_dirs();
    assert!(dirs.len() >= 5);
    for dir in &dirs {
        let name = dir.file_name().and_then(|n| n.to_str()).expect("name");
        let h = record(name, tmp.path());
        let history: Value = serde_json::from_str(&std::fs::read_to_string(&h).expect("history")).expect("JSON");
        assert_eq!(
            history["id"],
            serde_json::json!(format!("{}-run", def_id(dir))),
            "{name}"
        );
        let entries = history["entries"].as_array().expect("entries");
        assert!(entries.iter().any(|e| e["input"] == "start"), "{name}: {history}");
        assert!(entries.iter().all(|e| e["seq"].is_i64()), "{name}");
        let def = dir.join("definition.json");
        let (code, out, err) = sm4c(&["replay", &h, "--definition", def.to_str().expect("utf-8")]);
        assert_eq!(code, 0, "{name}: {out}{err}");
        assert!(out.starts_with("same decisions as recorded: "), "{name}: {out}");
        let (code, out, err) = sm4c(&["replay", &h, "--definition", def.to_str().expect("utf-8"), "--json"]);
        assert_eq!(code, 0, "{name}: {err}");
        let v: Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(v["outcome"], "same", "{name}: {v}");
        assert!(v["decisions"].as_u64().expect("decisions") >= 3, "{name}: {v}");
        assert_eq!(v["divergence"], Value::Null);
    }
}

fn def_id(dir: &Path) -> String {
    let def: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("definition.json")).expect("definition")).expect("JSON");
    match def.get("id").and_then(Value::as_str) {
        Some(id) => id.to_string(),
        // An ASL definition is named after its file.
        None => "definition".to_string(),
    }
}

/// The recorded travel saga against a copy whose hotel booking calls another function: exit 1 at the
/// call, in the state that makes it, field by field; as JSON too.
#[test]
fn a_changed_sm4c_definition_diverges_at_the_first_decision_it_changes() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let h = record("travel-saga", tmp.path());
    let original = std::fs::read_to_string(root().join("samples/travel-saga/definition.json")).expect("definition");
    assert!(original.contains("\"bookHotel\""));
    let changed = tmp.path().join("changed.json");
    std::fs::write(&changed, original.replace("\"bookHotel\"", "\"reserveHotel\"")).expect("write");
    let changed = changed.to_str().expect("utf-8");
    let (code, out, err) = sm4c(&["replay", &h, "--definition", changed]);
    assert_eq!(code, 1, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("diverges at entry ") && lines[0].ends_with("in state \"BookAutoAndHotel\""),
        "{out}"
    );
    assert!(
        lines[1].contains("recorded: the effect a call of function \"bookHotel\""),
        "{out}"
    );
    assert!(
        lines[2].contains("decided:  the effect a call of function \"reserveHotel\""),
        "{out}"
    );
    assert!(
        out.contains("  /function: \"bookHotel\" recorded, \"reserveHotel\" decided\n"),
        "{out}"
    );

    let (code, out, _) = sm4c(&["replay", &h, "--definition", changed, "--json"]);
    assert_eq!(code, 1);
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["outcome"], "diverged", "{v}");
    let d = &v["divergence"];
    assert_eq!(d["state"], "BookAutoAndHotel", "{v}");
    assert_eq!(d["recorded"]["function"], "bookHotel", "{v}");
    assert_eq!(d["decided"]["function"], "reserveHotel", "{v}");
    assert_eq!(
        d["differences"],
        serde_json::json!([{"pointer": "/function", "recorded": "bookHotel", "decided": "reserveHotel"}]),
        "{v}"
    );
    // The entry named is the recorded call's place in the history.
    let history: Value = serde_json::from_str(&std::fs::read_to_string(&h).expect("history")).expect("JSON");
    let at = history["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["seq"] == d["entry"])
        .expect("the entry named is in the history");
    assert_eq!(at["effect"], "invokeFunction", "{at}");
    assert_eq!(at["function"], "bookHotel", "{at}");
}

/// The recorded ASL order against a copy whose ChargeCard passes one more parameter.
#[test]
fn a_changed_asl_definition_diverges_naming_its_state_and_the_argument() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let h = record("asl-order", tmp.path());
    let original = std::fs::read_to_string(root().join("samples/asl-order/definition.json")).expect("definition");
    let needle = "\"amount.$\": \"$.total\",";
    assert!(original.contains(needle));
    let changed = tmp.path().join("definition.json");
    std::fs::write(
        &changed,
        original.replace(needle, &format!("{needle} \"currency\": \"EUR\",")),
    )
    .expect("write");
    let (code, out, err) = sm4c(&["replay", &h, "--definition", changed.to_str().expect("utf-8")]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.starts_with("diverges at entry "), "{out}");
    assert!(
        out.lines().next().expect("line").ends_with("in state \"ChargeCard\""),
        "{out}"
    );
    assert!(
        out.contains("  /arguments/currency: null recorded, \"EUR\" decided\n"),
        "{out}"
    );
}

/// A folder of histories is a suite: one line each, exit 1 when one diverges, 2 when one cannot be
/// read (named by file and JSON pointer).
#[test]
fn a_folder_of_histories_prints_a_line_each_and_the_worst_exit() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let suite = tmp.path().join("suite");
    std::fs::create_dir(&suite).expect("mkdir");
    let one = record("travel-saga", &suite);
    std::fs::copy(&one, suite.join("travel-saga-2.json")).expect("copy");
    let def = root().join("samples/travel-saga/definition.json");
    let def = def.to_str().expect("utf-8");
    let dir = suite.to_str().expect("utf-8");
    let (code, out, err) = sm4c(&["replay", dir, "--definition", def]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        out.lines().all(|l| l.starts_with("same ") && l.contains(" inputs, ")),
        "{out}"
    );

    // Another sample's history diverges from this definition at once.
    let other = record("hello-world", tmp.path());
    std::fs::copy(&other, suite.join("hello.json")).expect("copy");
    let (code, out, _) = sm4c(&["replay", dir, "--definition", def]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("diverges  ")).count(), 1, "{out}");

    // A broken entry: exit 2, the file and the entry's pointer named.
    let mut h: Value = serde_json::from_str(&std::fs::read_to_string(&one).expect("history")).expect("JSON");
    h["entries"][2]["entry"] = serde_json::json!("gossip");
    std::fs::write(suite.join("broken.json"), h.to_string()).expect("write");
    let (code, out, _) = sm4c(&["replay", dir, "--definition", def]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("error ") && l.contains("broken.json: /entries/2: not a journal entry")),
        "{out}"
    );
    let (code, out, _) = sm4c(&["replay", dir, "--definition", def, "--json"]);
    assert_eq!(code, 2);
    let v: Value = serde_json::from_str(&out).expect("JSON");
    let outcomes: Vec<&str> = v
        .as_array()
        .expect("array")
        .iter()
        .map(|o| o["outcome"].as_str().expect("outcome"))
        .collect();
    assert_eq!(outcomes, ["error", "diverged", "same", "same"], "{v}");
}

#[test]
fn replay_refuses_what_it_cannot_read_with_exit_2() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let def = root().join("samples/hello-world/definition.json");
    let def = def.to_str().expect("utf-8");
    let bad = tmp.path().join("bad.json");
    std::fs::write(&bad, "{\"entries\": 3}").expect("write");
    let (code, out, err) = sm4c(&["replay", bad.to_str().expect("utf-8"), "--definition", def]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(
        err.contains("bad.json: /: a history is an array of journal entries"),
        "{err}"
    );

    // A page after the first has no start.
    let h = record("hello-world", tmp.path());
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&h).expect("history")).expect("JSON");
    v["entries"]
        .as_array_mut()
        .expect("entries")
        .retain(|e| e["input"] != "start");
    std::fs::write(&bad, v.to_string()).expect("write");
    let (code, _, err) = sm4c(&["replay", bad.to_str().expect("utf-8"), "--definition", def]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("does not hold the instance's start"), "{err}");

    // An invalid definition: exit 2, as `validate` reports it.
    let broken = tmp.path().join("def.json");
    std::fs::write(&broken, "{\"id\": \"x\", \"states\": []}").expect("write");
    let (code, _, err) = sm4c(&["replay", &h, "--definition", broken.to_str().expect("utf-8")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("def.json: "), "{err}");
}

/// Every sample that enters two states or more, against a copy whose last state entered is
/// renamed: the replay diverges (exit 1) where the recorded instance went to that state, naming
/// the state it was in.
#[test]
fn every_sample_diverges_from_a_copy_with_its_last_state_renamed() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut checked = 0;
    for dir in sample_dirs() {
        let name = dir.file_name().and_then(|n| n.to_str()).expect("name").to_string();
        let h = record(&name, tmp.path());
        let history: Value = serde_json::from_str(&std::fs::read_to_string(&h).expect("history")).expect("JSON");
        let entered: Vec<String> = history["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| e["step"] == "stateEntered")
            .filter_map(|e| e["state"].as_str().map(str::to_string))
            .collect();
        let Some(last) = entered.last().filter(|l| entered.iter().any(|s| s != *l)) else {
            continue;
        };
        let text = std::fs::read_to_string(dir.join("definition.json")).expect("definition");
        let quoted = format!("\"{last}\"");
        assert!(text.contains(&quoted), "{name}: {last} is named in the definition");
        let changed = tmp.path().join(format!("{name}.changed.json"));
        std::fs::write(&changed, text.replace(&quoted, &format!("\"{last} renamed\""))).expect("write");
        let (code, out, err) = sm4c(&["replay", &h, "--definition", changed.to_str().expect("utf-8")]);
        assert_eq!(code, 1, "{name}: {out}{err}");
        let first = out.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("diverges at entry ") && first.contains(" in state \""),
            "{name}: {out}"
        );
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} samples enter two states or more");
}
