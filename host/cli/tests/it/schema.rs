//! `sm4c schema` prints the JSON Schema in `schemas/`.

use serde_json::Value;
use std::path::Path;

fn schema() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas/sm4c.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn sm4c_schema_prints_the_schema_file() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sm4c"))
        .arg("schema")
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed, schema());
}
