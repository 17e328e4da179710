//! The JSON Schema in `schemas/` accepts every sample definition and agrees with the validator on
//! invalid definitions. (The reference definitions in `../shared` are checked by the `reference`
//! test of the `sm4c` crate; `sm4c schema` printing the file, by its `schema` test.)

use serde_json::{json, Value};
use sm4c_runtime::{load, no_files, LoadOptions};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn schema() -> Value {
    serde_json::from_str(&std::fs::read_to_string(root().join("schemas/sm4c.schema.json")).unwrap()).unwrap()
}

fn definitions() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root().join("samples")).unwrap().flatten() {
        let d = e.path();
        if d.join("definition.json").exists() {
            out.push(d.join("definition.json"));
        }
        if let Ok(subs) = std::fs::read_dir(d.join("subflows")) {
            out.extend(subs.flatten().map(|e| e.path()));
        }
    }
    out
}

#[test]
fn schema_accepts_every_sample_definition() {
    let validator = jsonschema::validator_for(&schema()).expect("schema compiles");
    let defs = definitions();
    assert!(defs.len() >= 9, "only {} sample definitions", defs.len());
    for p in defs {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        if sm4c_runtime::asl::model::is_asl(&doc) {
            // The schema is SM4C's; ASL samples are checked by the validator alone.
            assert!(
                load(&doc, &mut no_files, LoadOptions::default()).is_ok(),
                "{}",
                p.display()
            );
            continue;
        }
        let errors: Vec<String> = validator
            .iter_errors(&doc)
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", p.display());
        assert!(
            load(&doc, &mut no_files, LoadOptions::default()).is_ok(),
            "validator refuses {}",
            p.display()
        );
    }
}

#[test]
fn schema_and_validator_agree_on_invalid_definitions() {
    let validator = jsonschema::validator_for(&schema()).unwrap();
    let ok_state = json!({"name": "A", "start": true});
    let cases = vec![
        json!({"id": "x", "name": "x", "version": "1"}),
        json!({"id": "x", "name": "x", "version": "1", "states": []}),
        json!({"id": "x", "name": "x", "version": "1", "states": [{"name": "A", "start": true, "enterAction": {"type": "teleport"}}]}),
        json!({"id": "x", "name": "x", "version": "1", "states": [{"name": "A", "start": true, "enterAction": {"type": "delay", "timeout": "soon"}}]}),
        json!({"id": "x", "name": "x", "version": "1", "states": [{"name": "A", "start": true, "enterAction": {"type": "foreach", "input": ".a", "maxParallel": 0, "action": {"type": "injectData", "expression": "1"}}}]}),
        json!({"id": "x", "name": "x", "version": "1", "states": [{"name": "A", "start": true, "enterAction": {"type": "parallel", "completionType": "n_of_m", "actions": [{"type": "injectData", "expression": "1"}]}}]}),
        json!({"id": "x", "name": "x", "version": "1", "states": [{"name": "A", "start": true, "enterAction": {"type": "sequence", "actions": []}}]}),
        json!({"id": "x", "name": "x", "version": "1", "states": [{"name": "A"}]}),
        json!({"id": "x", "name": "x", "version": "1", "states": [ok_state.clone(), {"name": "B", "start": true}]}),
        json!({"id": "x", "version": "1", "states": [ok_state.clone()]}),
        json!({"id": "x", "name": "x", "version": "1", "states": [{"name": "A", "start": true, "enterAction": {"type": "injectData"}}]}),
        json!({"id": "x", "name": "x", "version": "1", "events": [{"name": "e"}], "states": [{"name": "A", "start": true, "enterAction": {"type": "sendEvent", "event": "e", "contextAttributes": {"id": "x"}}}]}),
        json!({"id": "x", "name": "x", "version": "1", "functions": [{"name": "w", "type": "worker", "operation": "no spaces"}], "states": [ok_state.clone()]}),
        json!({"id": "x", "name": "x", "version": "1", "functions": [{"name": "w", "type": "worker", "operation": "images", "heartbeatTimeout": "soon"}], "states": [ok_state.clone()]}),
        json!({"id": "x", "name": "x", "version": "1", "functions": [{"name": "r", "operation": "http://x#r", "startToCloseTimeout": "PT1M"}], "states": [ok_state.clone()]}),
    ];
    for doc in cases {
        assert!(!validator.is_valid(&doc), "schema accepts {doc}");
        assert!(
            load(&doc, &mut no_files, LoadOptions::default()).is_err(),
            "validator accepts {doc}"
        );
    }
}
